/*
 * adjoint_cpu.c -- the CPU adjoint kernel: OpenMP over detector rows (static schedule, so each row always goes
 * to the same thread for a given thread count), one accumulator set per thread, summed in thread order; and the
 * forward-mode (JVP) kernel, OpenMP over rows.
 */
#include "adjoint.h"
#include "kernel.h"

#include <stddef.h>

#define NBG_TMPL NBG_TMPL_DOUBLE
#include "tmpl_on.h"
#include "adjoint_tmpl.h"
#include "adjoint_row_tmpl.h"
#include "jvp_tmpl.h"
#include "jvp_row_tmpl.h"
#include "tmpl_off.h"

#ifdef _OPENMP
#include <omp.h>
#endif

void nbgi_adjoint_cpu(const nbgi_kparams *p, const float *dLdI, float *image, nbgi_adjacc *tacc, int nthreads,
                     int vectorised)
{
    const int F = p->fpixels, S = p->spixels;
#pragma omp parallel num_threads(nthreads)
    {
#ifdef _OPENMP
        nbgi_adjacc *acc = &tacc[omp_get_thread_num()];
#else
        nbgi_adjacc *acc = &tacc[0];
#endif
#pragma omp for schedule(static)
        for (int s = 0; s < S; ++s) {
            if (vectorised) {
                for (int f0 = 0; f0 < F; f0 += 8) {
                    const long i = (long)s * F + f0;
                    const int n = F - f0 < 8 ? F - f0 : 8;
                    float g[8] = {0, 0, 0, 0, 0, 0, 0, 0};
                    if (dLdI != NULL) {
                        for (int j = 0; j < n; ++j) {
                            g[j] = dLdI[i + j];
                        }
                    }
                    nbgi_row_adjoint_d(p, s, f0, n, g, image + i, acc);
                }
                continue;
            }
            for (int f = 0; f < F; ++f) {
                const long i = (long)s * F + f;
                if (!nbgi_pixel_active(p, f, s)) {
                    image[i] = 0.0f;
                    continue;
                }
                const double g = dLdI != NULL ? (double)dLdI[i] : 0.0;
                image[i] = (float)nbgi_pixel_adjoint_d(p, f, s, g, acc);
            }
        }
    }
}

void nbgi_jvp_cpu(const nbgi_kparams *p, const nbgi_adjacc *t, int nt, double *out, float *image, int vectorised)
{
    const int F = p->fpixels, S = p->spixels;
    const size_t npix = (size_t)F * S;
#pragma omp parallel for schedule(dynamic, 1)
    for (int s = 0; s < S; ++s) {
        if (vectorised) {
            for (int f0 = 0; f0 < F; f0 += 8) {
                const size_t i = (size_t)s * F + f0;
                nbgi_row_jvp_d(p, s, f0, F - f0 < 8 ? F - f0 : 8, t, nt, image + i, out, npix, i);
            }
            continue;
        }
        for (int f = 0; f < F; ++f) {
            const long i = (long)s * F + f;
            double dS[NBG_JVP_MAX];
            if (!nbgi_pixel_active(p, f, s)) {
                image[i] = 0.0f;
                for (int j = 0; j < nt; ++j) {
                    out[(size_t)j * npix + (size_t)i] = 0;
                }
                continue;
            }
            image[i] = (float)nbgi_pixel_jvp_d(p, f, s, t, nt, dS);
            for (int j = 0; j < nt; ++j) {
                out[(size_t)j * npix + (size_t)i] = dS[j];
            }
        }
    }
}
