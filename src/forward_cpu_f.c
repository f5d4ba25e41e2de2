/*
 * forward_cpu_f.c -- the CPU forward's float rows (forward_cpu.c renders through them), a translation unit of their
 * own so that GCC's inlining budget per unit is theirs alone (forward_cpu.c says why).
 */
#include "forward.h"
#include "kernel.h"

/* kernel.h's float row has 16 lanes; where the vector registers are 256 bits wide, plans with many crystal matrices
 * render at one register, 8 (forward_cpu.c says why) */
#if NBG_NARROW_VECTORS
#define NBG_ROW_LANES 8
#define NBG_TMPL NBG_TMPL_FLOAT_NARROW
#include "tmpl_on.h"
#include "physics_tmpl.h"
#include "row_tmpl.h"
#include "tmpl_off.h"
#undef NBG_ROW_LANES
#define ROW_F nbgi_row_fn
#define ROW_LANES_F nbgi_row_lanes_fn
typedef nbgi_pixstat_fn pixstat_f;
#else
#define ROW_F nbgi_row_f
#define ROW_LANES_F nbgi_row_lanes_f
typedef nbgi_pixstat_f pixstat_f;
#endif

/* The rows, each a function of its own, as forward_cpu.c's: the 16 lanes where wide, else ROW_F's */
void nbgi_forward_row_f16(const nbgi_kparams *p, int s, int f0, int n, float *out, double *omega_sum, long *oor)
{
    nbgi_pixstat_f st = {0, 0};
    nbgi_row_f(p, s, f0, n, out, &st, NULL, NULL);
    *omega_sum += st.omega_sum;
    *oor += st.oor;
}

void nbgi_forward_row_fn(const nbgi_kparams *p, int s, int f0, int n, float *out, double *omega_sum, long *oor)
{
    pixstat_f st = {0, 0};
    ROW_F(p, s, f0, n, out, &st, NULL, NULL);
    *omega_sum += st.omega_sum;
    *oor += st.oor;
}

int nbgi_forward_lanes_f(int wide) { return wide ? nbgi_row_lanes_f : ROW_LANES_F; }
