/*
 * simulate.c -- the top-level calls: context creation, nbg_describe and nbg_simulate, backend dispatch.
 */
#include "forward.h"
#include "geometry.h"
#include "plan.h"

#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#ifdef _OPENMP
#include <omp.h>
#endif

#ifdef NBG_HAVE_CUDA
#include "nbgi_cuda.h"
#endif

int nbg_ctx_create(nbg_ctx **out, nbg_backend backend, nbg_precision precision, int nthreads)
{
    if (out == NULL) {
        return NBG_EINVAL;
    }
    *out = NULL;
    if (backend != NBG_BACKEND_CPU && backend != NBG_BACKEND_CUDA && backend != NBG_BACKEND_AUTO) {
        return NBG_EINVAL;
    }
    if (precision != NBG_DOUBLE && precision != NBG_FLOAT) {
        return NBG_EINVAL;
    }
    if (nthreads > NBG_MAX_THREADS) {
        return NBG_EINVAL;
    }
    nbg_ctx *ctx = calloc(1, sizeof *ctx);
    if (ctx == NULL) {
        return NBG_ENOMEM;
    }
    ctx->precision = precision;
    ctx->nthreads = nthreads;
    ctx->backend = NBG_BACKEND_CPU;
    ctx->break_param = -1;
    ctx->zero_param = -1;
    nbg_limits_default(&ctx->limits);
    if (backend != NBG_BACKEND_CPU) {
#ifdef NBG_HAVE_CUDA
        int rc = nbgi_cuda_init(ctx);
        if (rc == NBG_OK) {
            ctx->backend = NBG_BACKEND_CUDA;
        } else if (backend == NBG_BACKEND_CUDA) {
            free(ctx);
            return rc;
        }
#else
        if (backend == NBG_BACKEND_CUDA) {
            free(ctx);
            return NBG_ENODEV;
        }
#endif
    }
    *out = ctx;
    return NBG_OK;
}

void nbg_ctx_destroy(nbg_ctx *ctx)
{
    if (ctx == NULL) {
        return;
    }
#ifdef NBG_HAVE_CUDA
    nbgi_cuda_release(ctx);
#endif
    free(ctx);
}

nbg_backend nbg_ctx_backend(const nbg_ctx *ctx) { return ctx ? ctx->backend : NBG_BACKEND_CPU; }

int nbg_ctx_device(const nbg_ctx *ctx, nbg_device_info *info)
{
    if (ctx == NULL || info == NULL) {
        return NBG_EINVAL;
    }
    memset(info, 0, sizeof *info);
#ifdef NBG_HAVE_CUDA
    if (ctx->backend == NBG_BACKEND_CUDA) {
        return nbgi_cuda_describe(ctx, info);
    }
#endif
    snprintf(info->name, sizeof info->name, "CPU");
#ifdef _OPENMP
    info->units = ctx->nthreads > 0 ? ctx->nthreads : omp_get_max_threads();
#else
    info->units = 1;
#endif
    return NBG_OK;
}

int nbg_describe(nbg_ctx *ctx, const nbg_experiment *e, nbg_report *out)
{
    if (ctx == NULL || e == NULL || out == NULL) {
        return nbgi_error(ctx, NBG_EINVAL, "nbg_describe: NULL argument");
    }
    nbgi_plan pl;
    const int rc = nbgi_plan_build(ctx, e, &pl);
    if (rc != NBG_OK) {
        return rc;
    }
    *out = pl.rep;
    nbgi_plan_free(&pl);
    return NBG_OK;
}

int nbgi_image_check(nbg_ctx *ctx, const nbgi_plan *pl, const float *image, double sum)
{
    const nbgi_kparams *k = &pl->k;
    const long n = k->npix;
    if (isnan(sum)) {
        sum = 0;
        /* on the context's threads (the tangent path calls this outside nbgi_forward_plan's setting): with the
         * OpenMP default a 1-thread context had a second thread spinning after the sum, 13 % of cubic1k's nine
         * tangents' CPU time */
        int nth = 1;
#ifdef _OPENMP
        nth = ctx->nthreads > 0 ? ctx->nthreads : omp_get_max_threads();
#endif
#pragma omp parallel for reduction(+ : sum) num_threads(nth) if (n >= (long)NBGI_PARALLEL_MIN)
        for (long i = 0; i < n; ++i) {
            sum += image[i];
        }
    }
    if (isfinite(sum)) {
        return NBG_OK;
    }
    long bad = 0, first = -1;
    for (long i = 0; i < n; ++i) {
        if (!isfinite(image[i])) {
            first = first < 0 ? i : first;
            ++bad;
        }
    }
    /* an order-of-magnitude estimate of the brightest Bragg spot */
    double Fmax = fabs(k->default_F);
    if (k->F != NULL) {
        const size_t nF = (size_t)k->nh * k->nk * k->nl;
        for (size_t i = 0; i < nF; ++i) {
            Fmax = fmax(Fmax, fabs(k->F[i]));
        }
    }
    const double re2flu = NBG_RE2 * pl->rep.fluence, cells = k->Na * k->Nb * k->Nc;
    const double omega = (k->pixel / k->close_distance) * (k->pixel / k->close_distance);
    const double peak = re2flu * Fmax * Fmax * cells * cells * omega + k->I_bg * omega;
    /* the first bad pixel within its panel (the single detector is panel 0) */
    const int pan = (first >= 0 && k->npanels > 0) ? nbgi_panel_of_pixel(k, first) : 0;
    const long pf = k->npanels > 0 ? k->panels[pan].fpixels : k->fpixels;
    const long local = first >= 0 && k->npanels > 0 ? first - k->panels[pan].offset : first;
    const long f = first >= 0 ? local % pf : -1, s = first >= 0 ? local / pf : -1;
    char where[48] = "";
    if (k->npanels > 0) {
        snprintf(where, sizeof where, "panel %d, ", pan);
    }
    if (!(peak < FLT_MAX / 16)) {
        return nbgi_error(ctx, NBG_EINVAL, "the image has %ld non-finite pixels (the first at %sfast %ld, slow %ld): "
                         "the intensities overflow single precision; the brightest spot would be about %.2g photons (r_e^2 "
                         "x fluence %.3g photons/m^2 x F^2 %.3g x (Na Nb Nc)^2 %.3g x pixel solid angle %.3g sr%s): "
                         "lower the fluence (-fluence, -flux) or the structure factors (-default_F, -hkl)", bad, where, f, s,
                         peak, pl->rep.fluence, Fmax * Fmax, cells * cells, omega,
                         k->I_bg > 0 ? ", plus the water background" : "");
    }
    return nbgi_error(ctx, NBG_EINVAL, "the image has %ld non-finite pixels (the first at %sfast %ld, slow %ld): a "
                     "non-finite intermediate; check the wavelength (%g A), the cell, the sources and the detector "
                     "geometry", bad, where, f, s, pl->rep.lambda);
}

/* Runs the forward kernel of the context's backend on a built plan. */
int nbgi_forward_plan(nbg_ctx *ctx, nbgi_plan *pl, float *image)
{
    return nbgi_forward_plan_d(ctx, pl, image, NULL);
}

int nbgi_forward_plan_d(nbg_ctx *ctx, nbgi_plan *pl, float *image, double *image_d)
{
    double omega_sum = 0;
    long oor = 0;
#ifdef NBG_HAVE_CUDA
    if (ctx->backend == NBG_BACKEND_CUDA && image_d == NULL) {
        double t[3] = {0, 0, 0};
        const int rc = nbgi_cuda_forward(ctx, &pl->k, ctx->precision == NBG_FLOAT, image, &omega_sum, &oor, t);
        if (rc != NBG_OK) {
            return rc;
        }
        pl->rep.interp_fallbacks = oor;
        pl->rep.solid_angle = omega_sum / pl->rep.steps;
        pl->rep.time_setup += t[0];
        pl->rep.time_kernel = t[1];
        pl->rep.time_copy = t[2];
        return nbgi_image_check(ctx, pl, image, NAN);
    }
#endif
    const double t0 = nbgi_now();
#ifdef _OPENMP
    const int saved = omp_get_max_threads();
    if (ctx->nthreads > 0) {
        omp_set_num_threads(ctx->nthreads);
    }
#endif
    double image_sum = 0;
    nbgi_forward_cpu(&pl->k, ctx->precision == NBG_FLOAT, image, image_d, &omega_sum, &oor, &image_sum);
#ifdef _OPENMP
    if (ctx->nthreads > 0) {
        omp_set_num_threads(saved);
    }
#endif
    pl->rep.time_kernel = nbgi_now() - t0;
    pl->rep.time_copy = 0;
    pl->rep.interp_fallbacks = oor;
    pl->rep.solid_angle = omega_sum / pl->rep.steps;
    return nbgi_image_check(ctx, pl, image, image_sum);
}

int nbg_simulate(nbg_ctx *ctx, const nbg_experiment *e, float *image, size_t npix, nbg_report *report)
{
    if (ctx == NULL || e == NULL || image == NULL) {
        return nbgi_error(ctx, NBG_EINVAL, "nbg_simulate: NULL argument");
    }
    const double t0 = nbgi_now();
    nbgi_plan pl;
    int rc = nbgi_plan_build(ctx, e, &pl);
    if (rc != NBG_OK) {
        return rc;
    }
    pl.rep.time_setup = nbgi_now() - t0;
    const size_t need = (size_t)pl.k.npix;
    if (npix != need) {
        nbgi_plan_free(&pl);
        if (pl.k.npanels > 0) {
            return nbgi_error(ctx, NBG_EINVAL, "image buffer holds %zu pixels, the detector's %d panels have %zu",
                             npix, pl.rep.npanels, need);
        }
        return nbgi_error(ctx, NBG_EINVAL, "image buffer holds %zu pixels, the detector has %d x %d = %zu", npix,
                         pl.k.fpixels, pl.k.spixels, need);
    }
    rc = nbgi_forward_plan(ctx, &pl, image);
    if (rc == NBG_OK) {
        nbgi_model_apply(e, &pl.k, image);
    }
    if (rc == NBG_OK && report != NULL) {
        *report = pl.rep;
    }
    nbgi_plan_free(&pl);
    return rc;
}
