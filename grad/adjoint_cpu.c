/*
 * adjoint_cpu.c -- the CPU adjoint kernel: OpenMP over chunks of detector rows (or of a pixel list's runs), each
 * chunk summed into an accumulator of its own, the chunks then added in chunk order, so that the gradients are the
 * same bits for any thread count; and the forward-mode (JVP) kernel, OpenMP over rows.
 */
#include "adjoint.h"
#include "kernel.h"
#include "nbgrad.h"

#include <stddef.h>
#include <stdlib.h>
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
                                              int nt, const nbgi_jvp_dirs *dirs, float *out, double *outd, double *dS,
                                              size_t npix, size_t base, double *G)
{
    nbgi_row_jvp_d(p, s, f0, n, t, nt, dirs, out, outd, dS, npix, base, G);
}

/* One unit (a row, or a run of a pixel list) of the reverse pass into acc. */
static double adjoint_unit(const nbgi_kparams *p, long u, const float *dLdI, float *image, nbgi_adjacc *acc,
                           int form)
{
    /* a row of the single detector, or of a panel through its view: the row's detector gradients then land on the
     * panel's vectors, and are carried to the plane's after the row; or a run of a pixel list */
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
    if (form == NBGI_ADJ_ROWS) {
        for (int f0 = fa; f0 < fb; f0 += 8) {
            const long i = first + f0;
            const int n = fb - f0 < 8 ? fb - f0 : 8;
            if (!nbgi_any_active(pr, s, f0, n)) { /* 0 and no gradient, as the row kernel gives (geometry.h) */
                memset(image + i, 0, sizeof(float) * (size_t)n);
                continue;
            }
            float g[8] = {0, 0, 0, 0, 0, 0, 0, 0};
            if (dLdI != NULL && n == 8) {
                memcpy(g, dLdI + i, sizeof g); /* one vector move (the loop became `rep movs`: 3 % of cubic1k) */
            } else if (dLdI != NULL) {
                for (int j = 0; j < n; ++j) {
                    g[j] = dLdI[i + j];
                }
            }
            row_adjoint(pr, s, f0, n, g, image + i, acc);
        }
        nbgi_row_adjoint_flush_d(pr, acc); /* the row's lane sums, before a panel's fold */
    } else {
        for (int f = fa; f < fb; ++f) {
            const long i = first + f;
            if (!nbgi_pixel_active(pr, f, s)) {
                image[i] = 0.0f;
                continue;
            }
            const double g = dLdI != NULL ? (double)dLdI[i] : 0.0;
            image[i] = (float)(form == NBGI_ADJ_TILED ? nbgi_pixel_adjoint_tiled_d(pr, f, s, g, acc)
                                                      : nbgi_pixel_adjoint_d(pr, f, s, g, acc));
        }
    }
    double isum = 0; /* the unit's image values, while in cache (the finiteness check: its order is free) */
#pragma omp simd reduction(+ : isum)
    for (int f = fa; f < fb; ++f) {
        isum += image[first + f];
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
    return isum;
}

int nbgi_adjoint_chunks(long nunits, size_t nflat)
{
    long n = nunits < NBGI_MAXCHUNKS ? nunits : NBGI_MAXCHUNKS;
    const long fit = (long)(NBG_ADJ_CHUNK_DOUBLES / (nflat > 0 ? nflat : 1));
    n = n < fit ? n : fit;
    return n > 1 ? (int)n : 1;
}

int nbgi_adjoint_cpu(const nbgi_kparams *p, const float *dLdI, float *image, nbgi_adjacc *acc, int nthreads,
                     int form, double *image_sum)
{
    const size_t nabc = (size_t)p->nphi * p->nmos * 9, nsrc = (size_t)p->nsources;
    const size_t nF = acc->F != NULL ? (size_t)p->nh * p->nk * p->nl : 0;
    const size_t nP = acc->panel != NULL ? (size_t)p->npanels * NBG_ADJ_DET : 0;
    const size_t nflat = NBG_ADJ_FIXED + nabc + nsrc + nF + nP; /* a chunk's sums, flat */
    const size_t nlane = (nabc + nsrc + NBG_ADJ_FIXED) * 8;      /* a thread's lane accumulators (rows) */
    const long nu = nbgi_nunits(p);
    const int nchunks = nbgi_adjoint_chunks(nu, nflat);
    if (nthreads < 1 || nbgi_samples(p) < NBGI_PARALLEL_MIN) {
        nthreads = 1; /* a small image: its work on this thread (geometry.h) */
    }
    double isums[NBGI_MAXCHUNKS]; /* each chunk's image sum, added in chunk order */
    double *sums = calloc((size_t)nchunks * nflat, sizeof(double));
    /* the lane accumulators on cache lines of their own (nlane is a multiple of 8 doubles): from calloc, at 16
     * bytes past a line as often as not, each row's vector read-modify-writes crossed lines, and the gradient's
     * time moved from run to run by up to 15 % (tric1k, cubic1k) */
    const size_t lbytes = (size_t)nthreads * nlane * sizeof(double);
    double *lanes = aligned_alloc(64, lbytes); /* zero, and zeroed by each flush */
    if (lanes != NULL) {
        memset(lanes, 0, lbytes);
    }
    if (sums == NULL || lanes == NULL) {
        free(sums);
        free(lanes);
        return NBG_ENOMEM;
    }
    if (p->list != NULL) {
        memset(image, 0, sizeof(float) * (size_t)p->npix); /* the pixels outside the list */
    }
#pragma omp parallel for schedule(dynamic, 1) num_threads(nthreads)
    for (int c = 0; c < nchunks; ++c) {
#ifdef _OPENMP
        const int t = omp_get_thread_num();
#else
        const int t = 0;
#endif
        double *flat = sums + (size_t)c * nflat;
        nbgi_adjacc a;
        memset(&a, 0, sizeof a);
        a.abc = flat + NBG_ADJ_FIXED;
        a.lam = a.abc + nabc;
        a.F = nF ? a.lam + nsrc : NULL;
        a.panel = nP ? a.lam + nsrc + nF : NULL;
        a.lane_abc = lanes + (size_t)t * nlane;
        a.lane_lam = a.lane_abc + nabc * 8;
        a.lane_fix = a.lane_lam + nsrc * 8;
        /* chunk c: units [c nu / nchunks, (c + 1) nu / nchunks), in order */
        long u0, u1;
        nbgi_chunk(c, nchunks, nu, &u0, &u1);
        double is = 0;
        for (long u = u0; u < u1; ++u) {
            is += adjoint_unit(p, u, dLdI, image, &a, form);
        }
        isums[c] = is;
        memcpy(flat, &a, NBG_ADJ_FIXED * sizeof(double));
    }
    /* the chunks added in chunk order, component by component (components in parallel: the order of each sum is
     * the chunks', whatever the thread count) */
    const long nf = (long)nflat;
#pragma omp parallel for schedule(static) num_threads(nthreads)
    for (long i = 0; i < nf; ++i) {
        double v = sums[i];
        for (int c = 1; c < nchunks; ++c) {
            v += sums[(size_t)c * nflat + (size_t)i];
        }
        sums[i] = v;
    }
    double im = 0;
    for (int c = 0; c < nchunks; ++c) {
        im += isums[c];
    }
    *image_sum = im;
    memcpy(acc, sums, NBG_ADJ_FIXED * sizeof(double));
    memcpy(acc->abc, sums + NBG_ADJ_FIXED, nabc * sizeof(double));
    memcpy(acc->lam, sums + NBG_ADJ_FIXED + nabc, nsrc * sizeof(double));
    if (nF) {
        memcpy(acc->F, sums + NBG_ADJ_FIXED + nabc + nsrc, nF * sizeof(double));
    }
    if (nP) {
        memcpy(acc->panel, sums + NBG_ADJ_FIXED + nabc + nsrc + nF, nP * sizeof(double));
    }
    free(sums);
    free(lanes);
    return NBG_OK;
}

void nbgi_jvp_cpu(const nbgi_kparams *p, const nbgi_adjacc *t, int nt, const double *ptan, double *out, float *image,
                  double *image_d, int vectorised, int nthreads)
{
    const size_t npix = (size_t)p->npix;
    /* with a pixel list the tangents are compact: list entry t of parameter j at out[j * nlist + t] */
    const size_t stride = p->list != NULL ? (size_t)p->nlist : npix;
    const long nu = nbgi_nunits(p);
    if (p->list != NULL) {
        memset(image, 0, sizeof(float) * npix); /* the pixels outside the list */
        if (image_d != NULL) {
            memset(image_d, 0, sizeof(double) * npix);
        }
    }
#pragma omp parallel for schedule(dynamic, 1) num_threads(nthreads) if (nbgi_samples(p) >= NBGI_PARALLEL_MIN)
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
            nbgi_jvp_dirs dirs;
            nbgi_jvp_dirs_of(tr, nt, &dirs);
            /* the row kernel's scratch for the crystal's directions where a pixel has several samples a matrix
             * (grad/jvp_row_tmpl.h), on cache lines as the lane accumulators are; without it, those directions a
             * sample at a time */
            const int several = p->oversample * p->oversample * p->thicksteps * p->nsources > 1;
            double *G = several ? aligned_alloc(64, sizeof(double) * (size_t)p->nphi * p->nmos * 9 * 8) : NULL;
            for (int f0 = fa; f0 < fb; f0 += 8) {
                const size_t i = (size_t)first + f0;
                const size_t o = pos >= 0 ? (size_t)(pos + (f0 - fa)) : i;
                const int n = fb - f0 < 8 ? fb - f0 : 8;
                if (!nbgi_any_active(pr, s, f0, n)) { /* 0, tangents 0, as the row kernel gives (geometry.h) */
                    memset(image + i, 0, sizeof(float) * (size_t)n);
                    if (image_d != NULL) {
                        memset(image_d + i, 0, sizeof(double) * (size_t)n);
                    }
                    for (int j = 0; j < nt; ++j) {
                        memset(out + (size_t)j * stride + o, 0, sizeof(double) * (size_t)n);
                    }
                    continue;
                }
                row_jvp(pr, s, f0, n, tr, nt, &dirs, image + i,
                        image_d != NULL ? image_d + i : NULL, out, stride, o, G);
            }
            free(G);
            continue;
        }
        for (int f = fa; f < fb; ++f) {
            const long i = first + f;
            const size_t o = pos >= 0 ? (size_t)(pos + (f - fa)) : (size_t)i;
            double dS[NBG_JVP_MAX];
            if (!nbgi_pixel_active(pr, f, s)) {
                image[i] = 0.0f;
                if (image_d != NULL) {
                    image_d[i] = 0.0;
                }
                for (int j = 0; j < nt; ++j) {
                    out[(size_t)j * stride + o] = 0;
                }
                continue;
            }
            const double S = nbgi_pixel_jvp_d(pr, f, s, tr, nt, dS);
            image[i] = (float)S;
            if (image_d != NULL) {
                image_d[i] = S;
            }
            for (int j = 0; j < nt; ++j) {
                out[(size_t)j * stride + o] = dS[j];
            }
        }
    }
}
