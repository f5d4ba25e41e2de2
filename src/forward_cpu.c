/*
 * forward_cpu.c -- the CPU forward kernel: OpenMP over detector rows, the shared per-pixel loop nest inside.  The
 * double rows are here, the float rows in forward_cpu_f.c.
 */
#include "forward.h"
#include "kernel.h"

/* The forward at the width of 256-bit vector registers (src/hd.h), 4 lanes in double and 8 in float: instantiations
 * of their own, since the adjoint and tangent rows keep kernel.h's 8 lanes (their lane sums are the gradients' order
 * of summation).  They render where there are many crystal matrices (mosaic domains, phi steps), whose sum over
 * matrices keeps six lattice-factor chains in registers (src/row_tmpl.h, nbgi_square_vec: at two registers each they
 * spilled, heavy512 3x slower in double).  With one matrix kernel.h's lanes render (8 double, 16 float), two
 * registers' worth of independent work a step: that row's time is the latency of one ray's chain (position,
 * direction, indices, lattice factor), which one register of lanes left the units waiting on (in double cubic1k 40 %
 * and tric1k 28 % faster at 8 on a Zen 3 machine; in float, once the lattice factor's axes ran interleaved in
 * register parts, tric1k 8-16 % at 16).  A pixel's value does not depend on the lanes.
 *
 * The float rows are a translation unit of their own (forward_cpu_f.c): GCC's inliner has a budget per unit
 * (--param inline-unit-growth), and with the four row instantiations in one unit it ran out and left the lattice
 * factor's helpers (nbgi_square_vec, nbgi_cos2_lanes) and the structure factor's lookup out of line in the double
 * rows: heavy256's double forward 30 % slower. */
#if NBG_NARROW_VECTORS
#define NBG_ROW_LANES 4
#define NBG_TMPL NBG_TMPL_DOUBLE_NARROW
#include "tmpl_on.h"
#include "physics_tmpl.h"
#include "row_tmpl.h"
#include "tmpl_off.h"
#undef NBG_ROW_LANES
#define ROW_D nbgi_row_dn
#define ROW_LANES_D nbgi_row_lanes_dn
typedef nbgi_pixstat_dn pixstat_d;
#else
#define ROW_D nbgi_row_d
#define ROW_LANES_D nbgi_row_lanes_d
typedef nbgi_pixstat_d pixstat_d;
#endif

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* The row kernels as functions of their own: inlined into the OpenMP loop body (where the compiler put the double
 * one), they ran heavy512 about 30 % slower, the register pressure of the walk spilling into the sample loops. */
static __attribute__((noinline)) void row_d(const nbgi_kparams *p, int s, int f0, int n, float *out,
                                            pixstat_d *st)
{
    ROW_D(p, s, f0, n, out, st, NULL, NULL);
}

/* The forward's double row at kernel.h's 8 lanes, and whether a plan renders with it (and the float row with 16): one
 * crystal matrix, where row_d has 4 (without narrow vectors row_d is this row) */
static __attribute__((noinline)) void row_d8(const nbgi_kparams *p, int s, int f0, int n, float *out,
                                             nbgi_pixstat_d *st)
{
    nbgi_row_d(p, s, f0, n, out, st, NULL, NULL);
}

static int wide_rows(const nbgi_kparams *p) { return NBG_NARROW_VECTORS && p->nphi * p->nmos <= 1; }

/* The double image's (nbg_simulate_tangents): the unrounded values too. */
static __attribute__((noinline)) void row_dd(const nbgi_kparams *p, int s, int f0, int n, float *out,
                                             pixstat_d *st, double *outd)
{
    ROW_D(p, s, f0, n, out, st, outd, NULL);
}

/* The gradient check's: the unrounded values and the signatures too. */
static __attribute__((noinline)) void row_sig_d(const nbgi_kparams *p, int s, int f0, int n, float *out,
                                                pixstat_d *st, double *outd, uint64_t *sig)
{
    ROW_D(p, s, f0, n, out, st, outd, sig);
}

void nbgi_forward_cpu(const nbgi_kparams *p, int use_float, float *image, double *image_d, double *omega_sum,
                      long *oor, double *image_sum)
{
    use_float = use_float && image_d == NULL;
    double osum[NBGI_MAXCHUNKS], isum[NBGI_MAXCHUNKS]; /* each chunk's sums, added in chunk order (nbgi_chunk) */
    long nout = 0;
    const int wide = image_d == NULL && wide_rows(p);
    const int W = use_float ? nbgi_forward_lanes_f(wide) : wide ? nbgi_row_lanes_d : ROW_LANES_D;
    const long nu = nbgi_nunits(p);
    const int nch = nu < NBGI_MAXCHUNKS ? (nu > 0 ? (int)nu : 1) : NBGI_MAXCHUNKS;
    if (p->list != NULL) {
        memset(image, 0, sizeof(float) * (size_t)p->npix); /* the pixels outside the list */
        if (image_d != NULL) {
            memset(image_d, 0, sizeof(double) * (size_t)p->npix);
        }
    }
#pragma omp parallel for schedule(dynamic, 1) reduction(+ : nout) if (nbgi_samples(p) >= NBGI_PARALLEL_MIN)
    for (int c = 0; c < nch; ++c) {
        double os = 0, is = 0;
        long u0, u1;
        nbgi_chunk(c, nch, nu, &u0, &u1);
        for (long u = u0; u < u1; ++u) {
            /* a row of the single detector, or of a panel through its view; or a run of a pixel list within one */
            nbgi_kparams view;
            int s, fa, fb;
            long first, pos;
            const int r = nbgi_walk_unit(p, u, &fa, &fb, &pos);
            const nbgi_kparams *pr = nbgi_row_at(p, r, &view, &s, &first);
            for (int f0 = fa; f0 < fb; f0 += W) {
                const int n = fb - f0 < W ? fb - f0 : W;
                float *out = image + first + f0;
                if (!nbgi_any_active(pr, s, f0, n)) { /* outside the ROI or masked: 0, as the row kernel gives */
                    memset(out, 0, sizeof(float) * (size_t)n);
                    if (image_d != NULL) {
                        memset(image_d + first + f0, 0, sizeof(double) * (size_t)n);
                    }
                    continue;
                }
                if (use_float && wide) {
                    nbgi_forward_row_f16(pr, s, f0, n, out, &os, &nout);
                } else if (use_float) {
                    nbgi_forward_row_fn(pr, s, f0, n, out, &os, &nout);
                } else if (image_d != NULL) {
                    pixstat_d st = {0, 0};
                    row_dd(pr, s, f0, n, out, &st, image_d + first + f0);
                    os += st.omega_sum;
                    nout += st.oor;
                } else if (wide) {
                    nbgi_pixstat_d st = {0, 0};
                    row_d8(pr, s, f0, n, out, &st);
                    os += st.omega_sum;
                    nout += st.oor;
                } else {
                    pixstat_d st = {0, 0};
                    row_d(pr, s, f0, n, out, &st);
                    os += st.omega_sum;
                    nout += st.oor;
                }
                /* while the row is in cache (the finiteness check: its order is free, as the adjoint's); in lanes,
                 * not one chain of additions (that chain was 3.6 % of tric1k's float run) */
                double g = 0;
#pragma omp simd reduction(+ : g)
                for (int j = 0; j < n; ++j) {
                    g += out[j];
                }
                is += g;
            }
        }
        osum[c] = os;
        isum[c] = is;
    }
    double o = 0, im = 0;
    for (int c = 0; c < nch; ++c) {
        o += osum[c];
        im += isum[c];
    }
    *image_sum = im;
    *omega_sum = o;
    *oor = nout;
}

double nbgi_forward_wsum_cpu(const nbgi_kparams *p, const float *w, const uint8_t *skip, uint64_t *sig)
{
    enum { W = ROW_LANES_D };
    const int S = p->nrows;
    double *rows = calloc((size_t)S, sizeof(double));
    if (rows == NULL) {
        return NAN;
    }
#pragma omp parallel for schedule(dynamic, 1) if (nbgi_samples(p) >= NBGI_PARALLEL_MIN)
    for (int r = 0; r < S; ++r) {
        nbgi_kparams view;
        int s;
        long first;
        const nbgi_kparams *pr = nbgi_row_at(p, r, &view, &s, &first);
        const int F = pr->fpixels;
        double acc = 0;
        for (int f0 = 0; f0 < F; f0 += W) {
            const int n = F - f0 < W ? F - f0 : W;
            float out[W];
            double v[W];
            uint64_t h[W];
            pixstat_d st = {0, 0};
            row_sig_d(pr, s, f0, n, out, &st, v, h);
            for (int j = 0; j < n; ++j) {
                const long i = first + f0 + j;
                if (sig != NULL) {
                    sig[i] = h[j]; /* 0 for an inactive pixel */
                }
                if (nbgi_pixel_active(pr, f0 + j, s) && !(skip != NULL && skip[i])) {
                    acc += (double)w[i] * v[j];
                }
            }
        }
        rows[r] = acc;
    }
    double sum = 0;
    for (int s = 0; s < S; ++s) {
        sum += rows[s];
    }
    free(rows);
    return sum;
}
