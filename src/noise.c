/*
 * noise.c -- the integer and Poisson-noise images, as the reference program makes them.
 */
#if defined(__clang__)
#pragma STDC FP_CONTRACT OFF
#elif defined(__GNUC__)
#pragma GCC optimize("fp-contract=off")
#endif

#include "internal.h"
#include "rng.h"

#include <math.h>

/* Inclusive ROI bounds xmin xmax ymin ymax.  As in the reference, each negative entry is replaced on its own:
 * minima by 0, maxima by the pixel count (one past the last pixel, which is harmless). */
static void roi_bounds(const int roi[4], int fpixels, int spixels, int b[4])
{
    b[0] = (roi != NULL && roi[0] >= 0) ? roi[0] : 0;
    b[1] = (roi != NULL && roi[1] >= 0) ? roi[1] : fpixels;
    b[2] = (roi != NULL && roi[2] >= 0) ? roi[2] : 0;
    b[3] = (roi != NULL && roi[3] >= 0) ? roi[3] : spixels;
}

static int inside(const int b[4], int f, int s)
{
    return !(f < b[0] || f > b[1] || s < b[2] || s > b[3]);
}

/* The arguments both image makers share. */
static int check_args(nbg_ctx *ctx, const char *fn, const float *image, int fpixels, int spixels, double adc,
                      const uint16_t *out)
{
    if (image == NULL || out == NULL) {
        return nbgi_error(ctx, NBG_EINVAL, "%s: NULL argument", fn);
    }
    if (fpixels <= 0 || spixels <= 0) {
        return nbgi_error(ctx, NBG_EINVAL, "%s: image size %d x %d is not positive", fn, fpixels, spixels);
    }
    if (!isfinite(adc)) {
        return nbgi_error(ctx, NBG_EINVAL, "%s: the ADC offset %g is not finite", fn, adc);
    }
    return NBG_OK;
}

int nbg_int_image(nbg_ctx *ctx, const float *image, int fpixels, int spixels, const int roi[4], double scale,
                  double adc, uint16_t *out)
{
    int b[4], f, s;
    int rc = check_args(ctx, "nbg_int_image", image, fpixels, spixels, adc, out);
    if (rc != NBG_OK) return rc;
    if (!isfinite(scale)) return nbgi_error(ctx, NBG_EINVAL, "nbg_int_image: the scale %g is not finite", scale);
    roi_bounds(roi, fpixels, spixels, b);
    for (s = 0; s < spixels; ++s) {
        for (f = 0; f < fpixels; ++f) {
            size_t i = (size_t)s * (size_t)fpixels + (size_t)f;
            double v;
            float rounded;

            if (!inside(b, f, s)) {
                out[i] = 0;
                continue;
            }
            v = (double)image[i] * scale + adc;
            if (v > 65535.0) v = 65535.0;
            if (v < 0.0) v = 0.0;
            /* The reference rounds with floorf, so v + 0.5 is first rounded to float. */
            rounded = floorf((float)(v + 0.5));
            /* NaN fails both clamps; the reference's conversion then yields 0 on x86. */
            out[i] = (rounded >= 0.0f && rounded <= 65535.0f) ? (uint16_t)rounded : 0;
        }
    }
    return NBG_OK;
}

int nbg_noise_image(nbg_ctx *ctx, const float *image, int fpixels, int spixels, const int roi[4], double adc,
                    long seed, uint16_t *out, long *photons, long *overloads)
{
    int b[4], f, s;
    double sum = 0.0;
    long nover = 0;
    nbgi_rng rng;

    if (photons != NULL) *photons = 0;
    if (overloads != NULL) *overloads = 0;
    int rc = check_args(ctx, "nbg_noise_image", image, fpixels, spixels, adc, out);
    if (rc != NBG_OK) return rc;
    roi_bounds(roi, fpixels, spixels, b);
    for (s = b[2]; s <= b[3] && s < spixels; ++s) {
        for (f = b[0]; f <= b[1] && f < fpixels; ++f) {
            const float v = image[(size_t)s * (size_t)fpixels + (size_t)f];
            if (!(v >= 0) || isinf(v)) {
                return nbgi_error(ctx, NBG_EINVAL, "nbg_noise_image: pixel (%d, %d) is %g; a Poisson mean must be "
                                 "finite and non-negative", f, s, (double)v);
            }
        }
    }
    nbgi_rng_init(&rng, seed);

    /* One stream visits the ROI in row-major order; pixels outside draw nothing and stay 0. */
    for (s = 0; s < spixels; ++s) {
        for (f = 0; f < fpixels; ++f) {
            size_t i = (size_t)s * (size_t)fpixels + (size_t)f;
            double n, v;

            if (!inside(b, f, s)) {
                out[i] = 0;
                continue;
            }
            n = nbgi_poidev((double)image[i], &rng);
            /* Above a mean of 1e6 n is a rounded Gaussian and may be fractional; the total keeps the fraction. */
            if (isfinite(n)) sum += n;
            v = n + adc;
            if (v > 65535.0) {
                v = 65535.0;
                ++nover;
            }
            /* Truncation toward zero.  Below 0 (only with a negative adc) the reference's conversion on x86 goes
             * through a 32-bit integer and keeps its low 16 bits; NaN and out-of-range values give 0 there. */
            if (v >= 0.0) out[i] = (uint16_t)v;
            else if (v > -2147483648.0) out[i] = (uint16_t)(long)v;
            else out[i] = 0;
        }
    }
    /* The reference prints the total with "%.0f": round half to even. */
    if (photons != NULL) *photons = lrint(sum);
    if (overloads != NULL) *overloads = nover;
    return NBG_OK;
}
