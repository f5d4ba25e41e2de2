/*
 * forward_cpu.c -- the CPU forward kernel: OpenMP over detector rows, the shared per-pixel loop nest inside.
 */
#include "forward.h"
#include "kernel.h"

#include <math.h>
#include <stdlib.h>

void nbgi_forward_cpu(const nbgi_kparams *p, int use_float, float *image, double *omega_sum, long *oor,
                     double *image_sum)
{
    double osum = 0, isum = 0;
    long nout = 0;
    const int F = p->fpixels, S = p->spixels;
    const int W = use_float ? 16 : 8;
#pragma omp parallel for schedule(dynamic, 1) reduction(+ : osum, nout, isum)
    for (int s = 0; s < S; ++s) {
        for (int f0 = 0; f0 < F; f0 += W) {
            const int n = F - f0 < W ? F - f0 : W;
            float *out = image + (long)s * F + f0;
            if (use_float) {
                nbgi_pixstat_f st = {0, 0};
                nbgi_row_f(p, s, f0, n, out, &st);
                osum += st.omega_sum;
                nout += st.oor;
            } else {
                nbgi_pixstat_d st = {0, 0};
                nbgi_row_d(p, s, f0, n, out, &st);
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
    const int F = p->fpixels, S = p->spixels;
    double *rows = calloc((size_t)S, sizeof(double));
    if (rows == NULL) {
        return NAN;
    }
#pragma omp parallel for schedule(dynamic, 1)
    for (int s = 0; s < S; ++s) {
        double acc = 0;
        for (int f = 0; f < F; ++f) {
            const long i = (long)s * F + f;
            if (!nbgi_pixel_active(p, f, s)) {
                if (sig != NULL) {
                    sig[i] = 0;
                }
                continue;
            }
            if (sig != NULL) {
                sig[i] = nbgi_pixel_signature_d(p, f, s);
            }
            if (skip != NULL && skip[i]) {
                continue;
            }
            nbgi_pixstat_d st = {0, 0};
            acc += (double)w[i] * nbgi_pixel_d(p, f, s, &st);
        }
        rows[s] = acc;
    }
    double sum = 0;
    for (int s = 0; s < S; ++s) {
        sum += rows[s];
    }
    free(rows);
    return sum;
}
