/*
 * floor.c -- nbg_check_floor: the observed image's floor against the model's (nbgrad.h).  It renders the model
 * when the caller has no image, so it sits above the forward (simulate.c) and the model (model.c), which call
 * nothing here.
 */
#include "plan.h"
#include "geometry.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The k-th smallest (0-based) of v[0..n), n > k (v reordered): quickselect with a median-of-three pivot and a
 * three-way partition (images hold many equal values). */
double nbgi_kth(double *v, size_t n, size_t k)
{
    size_t lo = 0, hi = n; /* k is in [lo, hi) */
    while (hi - lo > 1) {
        const double a = v[lo], b = v[lo + (hi - lo) / 2], c = v[hi - 1];
        const double pivot = a < b ? (b < c ? b : (a < c ? c : a)) : (a < c ? a : (b < c ? c : b));
        size_t lt = lo, i = lo, gt = hi; /* [lo, lt) < pivot, [lt, i) == pivot, [gt, hi) > pivot */
        while (i < gt) {
            const double x = v[i];
            if (x < pivot) {
                v[i++] = v[lt];
                v[lt++] = x;
            } else if (x > pivot) {
                v[i] = v[--gt];
                v[gt] = x;
            } else {
                ++i;
            }
        }
        if (k < lt) {
            hi = lt;
        } else if (k >= gt) {
            lo = gt;
        } else {
            return pivot;
        }
    }
    return v[lo];
}

/* The q-quantile of v[0..n) (reordered), n > 0: the element a sort would put at floor(q (n - 1)) (was a qsort of
 * the whole array: two of them were 9 % of a 24-iteration fit at 1024x1024). */
static double quantile(double *v, size_t n, double q)
{
    return nbgi_kth(v, n, (size_t)floor(q * (double)(n - 1)));
}

int nbg_check_floor(nbg_ctx *ctx, const nbg_experiment *e, const float *observed, const float *weights,
                    const float *image, size_t npix, nbg_floor_check *out)
{
    if (ctx == NULL || e == NULL || observed == NULL || out == NULL) {
        return nbgi_error(ctx, NBG_EINVAL, "nbg_check_floor: NULL argument");
    }
    memset(out, 0, sizeof *out);
    nbgi_plan pl;
    int rc = nbgi_plan_build(ctx, e, &pl);
    if (rc != NBG_OK) {
        return rc;
    }
    if ((size_t)pl.k.npix != npix) {
        nbgi_plan_free(&pl);
        return nbgi_error(ctx, NBG_EINVAL, "nbg_check_floor: the image holds %zu pixels, the detector has %ld",
                         npix, pl.k.npix);
    }
    float *own = NULL;
    if (image == NULL) {
        own = malloc(sizeof(float) * npix);
        if (own == NULL) {
            nbgi_plan_free(&pl);
            return nbgi_error(ctx, NBG_ENOMEM, "out of memory for a model image");
        }
        rc = nbg_simulate(ctx, e, own, npix, NULL);
        image = own;
    }
    double *vo = rc == NBG_OK ? malloc(sizeof(double) * npix) : NULL;
    double *vm = rc == NBG_OK ? malloc(sizeof(double) * npix) : NULL;
    if (rc == NBG_OK && (vo == NULL || vm == NULL)) {
        rc = nbgi_error(ctx, NBG_ENOMEM, "out of memory for the floor check");
    }
    if (rc == NBG_OK) {
        const nbg_detector_model *r = &e->response;
        size_t n = 0;
        nbgi_response_cursor rcur;
        nbgi_response_init(&rcur, e);
        for (long t = 0; t < nbgi_nwalk(&pl.k); ++t) {
            const size_t i = nbgi_walk_at(&pl.k, t);
            if (nbgi_model_active(&pl.k, i) && (weights == NULL || weights[i] > 0)) {
                const nbg_detector_model *ri = nbgi_response_at(&rcur, i);
                vo[n] = observed[i];
                vm[n] = ri->gain * image[i] + ri->pedestal;
                ++n;
            }
        }
        out->npix = (long)n;
        if (n > 0) {
            out->floor = quantile(vo, n, 0.05);
            out->model_floor = quantile(vm, n, 0.05);
            const double photons = fmax((out->model_floor - r->pedestal) / r->gain, 0);
            const double s0 = sqrt(r->gain * r->gain * photons + r->read_noise * r->read_noise);
            out->sigma = fmax(s0, 1);
            const double d = out->floor - out->model_floor;
            /* a floor of under a photon: the observed 5th percentile is the pedestal (less the read noise), never a
             * count above the model's, so a floor a count or more above it is a pedestal given too low (or a
             * background the model lacks) however weak the image (was: silent below 5 counts) */
            const int weak_high = photons < 1 && d >= 1 && d > 5 * s0;
            out->mismatch = (fabs(d) > 5 && fabs(d) > 5 * out->sigma) || weak_high;
            if (out->mismatch && d > 0) {
                snprintf(out->message, sizeof out->message, "the observed image has a floor of %.4g counts (5th "
                         "percentile of %ld pixels) but the model's is %.4g (pedestal %g + gain x background): the "
                         "data carry a pedestal or background the model lacks", out->floor, out->npix,
                         out->model_floor, r->pedestal);
            } else if (out->mismatch) {
                snprintf(out->message, sizeof out->message, "the observed image's floor of %.4g counts (5th "
                         "percentile of %ld pixels) lies below the model's %.4g (pedestal %g + gain x background): "
                         "the model's pedestal or background is too large", out->floor, out->npix, out->model_floor,
                         r->pedestal);
            }
        }
    }
    free(vo);
    free(vm);
    free(own);
    nbgi_plan_free(&pl);
    return rc;
}
