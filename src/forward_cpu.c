/*
 * forward_cpu.c -- the CPU forward kernel: OpenMP over detector rows, the shared per-pixel loop nest inside.
 */
#include "forward.h"
#include "kernel.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* The row kernels as functions of their own: inlined into the OpenMP loop body (where the compiler put the double
 * one), they ran heavy512 about 30 % slower, the register pressure of the walk spilling into the sample loops. */
static __attribute__((noinline)) void row_f(const nbgi_kparams *p, int s, int f0, int n, float *out,
                                            nbgi_pixstat_f *st)
{
    nbgi_row_f(p, s, f0, n, out, st);
}

static __attribute__((noinline)) void row_d(const nbgi_kparams *p, int s, int f0, int n, float *out,
                                            nbgi_pixstat_d *st)
{
    nbgi_row_d(p, s, f0, n, out, st);
}

void nbgi_forward_cpu(const nbgi_kparams *p, int use_float, float *image, double *omega_sum, long *oor,
                     double *image_sum)
{
    double osum = 0, isum = 0;
    long nout = 0;
    const int W = use_float ? 16 : 8;
    const long nu = nbgi_nunits(p);
    if (p->list != NULL) {
        memset(image, 0, sizeof(float) * (size_t)p->npix); /* the pixels outside the list */
    }
#pragma omp parallel for schedule(dynamic, 1) reduction(+ : osum, nout, isum)
    for (long u = 0; u < nu; ++u) {
        /* a row of the single detector, or of a panel through its view; or a run of a pixel list within one */
        nbgi_kparams view;
        int s, fa, fb;
        long first, pos;
        const int r = nbgi_walk_unit(p, u, &fa, &fb, &pos);
        const nbgi_kparams *pr = nbgi_row_at(p, r, &view, &s, &first);
        for (int f0 = fa; f0 < fb; f0 += W) {
            const int n = fb - f0 < W ? fb - f0 : W;
            float *out = image + first + f0;
            if (use_float) {
                nbgi_pixstat_f st = {0, 0};
                row_f(pr, s, f0, n, out, &st);
                osum += st.omega_sum;
                nout += st.oor;
            } else {
                nbgi_pixstat_d st = {0, 0};
                row_d(pr, s, f0, n, out, &st);
                osum += st.omega_sum;
                nout += st.oor;
            }
            for (int j = 0; j < n; ++j) {
                isum += out[j]; /* while the row is in cache: the finiteness check costs nothing */
            }
        }
    }
    *image_sum = isum;
    *omega_sum = osum;
    *oor = nout;
}

double nbgi_forward_wsum_cpu(const nbgi_kparams *p, const float *w, const uint8_t *skip, uint64_t *sig)
{
    const int S = p->nrows;
    double *rows = calloc((size_t)S, sizeof(double));
    if (rows == NULL) {
        return NAN;
    }
#pragma omp parallel for schedule(dynamic, 1)
    for (int r = 0; r < S; ++r) {
        nbgi_kparams view;
        int s;
        long first;
        const nbgi_kparams *pr = nbgi_row_at(p, r, &view, &s, &first);
        const int F = pr->fpixels;
        double acc = 0;
        for (int f = 0; f < F; ++f) {
            const long i = first + f;
            if (!nbgi_pixel_active(pr, f, s)) {
                if (sig != NULL) {
                    sig[i] = 0;
                }
                continue;
            }
            const int skipped = skip != NULL && skip[i];
            if (skipped && sig == NULL) {
                continue;
            }
            nbgi_pixstat_d st = {0, 0};
            const double v = nbgi_pixel_d(pr, f, s, &st, sig != NULL ? &sig[i] : NULL);
            if (!skipped) {
                acc += (double)w[i] * v;
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
