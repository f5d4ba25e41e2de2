/*
 * adjoint_cpu.c -- the CPU adjoint kernel: OpenMP over detector rows (static schedule, so each row always goes
 * to the same thread for a given thread count), one accumulator set per thread, summed in thread order; and the
 * forward-mode (JVP) kernel, OpenMP over rows.
 */
#include "adjoint.h"
#include "kernel.h"

#include <stddef.h>
#include <string.h>

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

/* The row kernels as functions of their own (as the forward's, src/forward_cpu.c): inlined into the OpenMP loop
 * bodies they ran the reverse and tangent passes up to 2x slower. */
static __attribute__((noinline)) void row_adjoint(const nbgi_kparams *p, int s, int f0, int n, const float *g,
                                                  float *out, nbgi_adjacc *acc)
{
    nbgi_row_adjoint_d(p, s, f0, n, g, out, acc);
}

static __attribute__((noinline)) void row_jvp(const nbgi_kparams *p, int s, int f0, int n, const nbgi_adjacc *t,
                                              int nt, float *out, double *dS, size_t npix, size_t base)
{
    nbgi_row_jvp_d(p, s, f0, n, t, nt, out, dS, npix, base);
}

void nbgi_adjoint_cpu(const nbgi_kparams *p, const float *dLdI, float *image, nbgi_adjacc *tacc, int nthreads,
                     int vectorised)
{
    if (p->list != NULL) {
        memset(image, 0, sizeof(float) * (size_t)p->npix); /* the pixels outside the list */
    }
#pragma omp parallel num_threads(nthreads)
    {
#ifdef _OPENMP
        nbgi_adjacc *acc = &tacc[omp_get_thread_num()];
#else
        nbgi_adjacc *acc = &tacc[0];
#endif
        const long nu = nbgi_nunits(p);
#pragma omp for schedule(static)
        for (long u = 0; u < nu; ++u) {
            /* a row of the single detector, or of a panel through its view: the row's detector gradients then land
             * on the panel's vectors, and are carried to the plane's after the row; or a run of a pixel list */
            nbgi_kparams view;
            int s, fa, fb;
            long first, pos;
            const int r = nbgi_walk_unit(p, u, &fa, &fb, &pos);
            const nbgi_kparams *pr = nbgi_row_at(p, r, &view, &s, &first);
            double *det = (double *)acc, saved[NBG_ADJ_DET] = {0};
            if (p->npanels > 0) {
                for (int c = 0; c < NBG_ADJ_DET; ++c) {
                    saved[c] = det[c];
                    det[c] = 0;
                }
            }
            if (vectorised) {
                for (int f0 = fa; f0 < fb; f0 += 8) {
                    const long i = first + f0;
                    const int n = fb - f0 < 8 ? fb - f0 : 8;
                    float g[8] = {0, 0, 0, 0, 0, 0, 0, 0};
                    if (dLdI != NULL) {
                        for (int j = 0; j < n; ++j) {
                            g[j] = dLdI[i + j];
                        }
                    }
                    row_adjoint(pr, s, f0, n, g, image + i, acc);
                }
            } else {
                for (int f = fa; f < fb; ++f) {
                    const long i = first + f;
                    if (!nbgi_pixel_active(pr, f, s)) {
                        image[i] = 0.0f;
                        continue;
                    }
                    const double g = dLdI != NULL ? (double)dLdI[i] : 0.0;
                    image[i] = (float)nbgi_pixel_adjoint_d(pr, f, s, g, acc);
                }
            }
            if (p->npanels > 0) {
                double row[NBG_ADJ_DET];
                for (int c = 0; c < NBG_ADJ_DET; ++c) {
                    row[c] = det[c];
                    det[c] = saved[c];
                }
                const int k = nbgi_panel_of_row(p, r);
                nbgi_panel_fold(&p->panels[k], row, det);
                if (acc->panel != NULL) {
                    for (int c = 0; c < NBG_ADJ_DET; ++c) {
                        acc->panel[(size_t)k * NBG_ADJ_DET + c] += row[c];
                    }
                }
            }
        }
    }
}

void nbgi_jvp_cpu(const nbgi_kparams *p, const nbgi_adjacc *t, int nt, const double *ptan, double *out, float *image,
                  int vectorised)
{
    const size_t npix = (size_t)p->npix;
    /* with a pixel list the tangents are compact: list entry t of parameter j at out[j * nlist + t] */
    const size_t stride = p->list != NULL ? (size_t)p->nlist : npix;
    const long nu = nbgi_nunits(p);
    if (p->list != NULL) {
        memset(image, 0, sizeof(float) * npix); /* the pixels outside the list */
    }
#pragma omp parallel for schedule(dynamic, 1)
    for (long u = 0; u < nu; ++u) {
        /* a row of the single detector, or of a panel through its view with the tangents carried to its vectors;
         * or a run of a pixel list within one */
        nbgi_kparams view;
        int s, fa, fb;
        long first, pos;
        const int r = nbgi_walk_unit(p, u, &fa, &fb, &pos);
        const nbgi_kparams *pr = nbgi_row_at(p, r, &view, &s, &first);
        nbgi_adjacc tp[NBG_JVP_MAX];
        const nbgi_adjacc *tr = t;
        if (p->npanels > 0) {
            const int k = nbgi_panel_of_row(p, r);
            const nbgi_kpanel *q = &p->panels[k];
            for (int j = 0; j < nt; ++j) {
                tp[j] = t[j];
                nbgi_panel_tangent(q, (const double *)&t[j], (double *)&tp[j]);
                if (ptan != NULL) {
                    /* the panel's own motion, when tangent j is one of its group's components */
                    const double *d = ptan + ((size_t)j * p->npanels + k) * NBG_ADJ_DET;
                    double *o = (double *)&tp[j];
                    for (int c = 0; c < NBG_ADJ_DET; ++c) {
                        o[c] += d[c];
                    }
                }
            }
            tr = tp;
        }
        if (vectorised) {
            for (int f0 = fa; f0 < fb; f0 += 8) {
                const size_t i = (size_t)first + f0;
                const size_t o = pos >= 0 ? (size_t)(pos + (f0 - fa)) : i;
                row_jvp(pr, s, f0, fb - f0 < 8 ? fb - f0 : 8, tr, nt, image + i, out, stride, o);
            }
            continue;
        }
        for (int f = fa; f < fb; ++f) {
            const long i = first + f;
            const size_t o = pos >= 0 ? (size_t)(pos + (f - fa)) : (size_t)i;
            double dS[NBG_JVP_MAX];
            if (!nbgi_pixel_active(pr, f, s)) {
                image[i] = 0.0f;
                for (int j = 0; j < nt; ++j) {
                    out[(size_t)j * stride + o] = 0;
                }
                continue;
            }
            image[i] = (float)nbgi_pixel_jvp_d(pr, f, s, tr, nt, dS);
            for (int j = 0; j < nt; ++j) {
                out[(size_t)j * stride + o] = dS[j];
            }
        }
    }
}
