/*
 * test-realdata.c -- refinement on real-looking data: integer images with nanoBragg's pedestal of 40 counts,
 * Poisson noise, a background plane and an overall scale; the floor check that catches a missing pedestal; the
 * image-level parameters' gradients (gradcheck) and Jacobian columns (finite differences); masks; honest
 * stopping; gradcheck's ZERO status.
 */
#include "testutil.h" /* first: it sets _GNU_SOURCE */
#include "nbgrad.h"
#include "internal.h" /* the test-only switches */

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define NPIX_SIDE 96
#define NP 13

static const nbg_param P13[NP] = {NBG_P_A,    NBG_P_B,    NBG_P_C,     NBG_P_ALPHA, NBG_P_BETA,
                                  NBG_P_GAMMA, NBG_P_ROTX, NBG_P_ROTY,  NBG_P_ROTZ,  NBG_P_SCALE,
                                  NBG_P_BG,   NBG_P_BG_FAST, NBG_P_BG_SLOW};

/* The truth: a triclinic crystal, scale 1.7 and a background plane, seen through a detector with pedestal 40. */
static void truth(nbg_experiment *e)
{
    nbg_experiment_default(e);
    e->has_cell = 1;
    const double cell[6] = {70, 80, 90, 75, 85, 95};
    memcpy(e->cell, cell, sizeof cell);
    e->misset[0] = 10;
    e->misset[1] = 5;
    e->misset[2] = 3;
    e->default_F = 100;
    e->Na = e->Nb = e->Nc = 5;
    e->fluence *= 20;
    e->fpixels = e->spixels = NPIX_SIDE;
    e->oversample = 1;
    e->scale = 1.7;
    e->bg[0] = 4;
    e->bg[1] = 30;  /* photons per 1000 pixels along fast: +-1.4 across the detector */
    e->bg[2] = -20;
    e->response.pedestal = 40;
}

static double uni(uint64_t *s)
{
    *s = *s * 6364136223846793005ULL + 1442695040888963407ULL;
    return (double)(*s >> 11) * (2.0 / 9007199254740992.0) - 1.0;
}

/* A start: cell lengths +-1 %, misset +-0.5 deg, the image model at its defaults (scale 1, no background). */
static void start_from(nbg_experiment *e, uint64_t *s)
{
    for (int i = 0; i < 3; ++i) {
        e->cell[i] *= 1 + 0.01 * uni(s);
        e->misset[i] += 0.5 * uni(s);
    }
    e->scale = 1;
    e->bg[0] = e->bg[1] = e->bg[2] = 0;
}

/* Observed counts: Poisson(M) + 40, as nanoBragg's -noisefile writes them. */
static void observe(nbg_ctx *ctx, const nbg_experiment *t, long seed, float *obs, size_t npix)
{
    float *mean = malloc(npix * sizeof(float));
    uint16_t *counts = malloc(npix * sizeof(uint16_t));
    nbg_simulate(ctx, t, mean, npix, NULL);
    long photons, over;
    nbg_noise_image(ctx, mean, NPIX_SIDE, NPIX_SIDE, NULL, 40, seed, counts, &photons, &over);
    for (size_t i = 0; i < npix; ++i) {
        obs[i] = counts[i];
    }
    free(mean);
    free(counts);
}

static void recovery(nbg_ctx *ctx, const nbg_experiment *t, float *obs, size_t npix)
{
    double tv[NP], worst_p[NP] = {0};
    for (int j = 0; j < NP; ++j) {
        nbg_param_get(t, P13[j], &tv[j]);
    }
    int good = 0;
    for (int k = 0; k < 10; ++k) {
        observe(ctx, t, 7 + k, obs, npix);
        uint64_t seed = 500 + (uint64_t)k;
        nbg_experiment e = *t;
        start_from(&e, &seed);
        nbg_refine_options o;
        nbg_refine_options_default(&o);
        o.loss = NBG_LOSS_POISSON;
        nbg_refine_result r = {0};
        const int rc = nbg_refine(ctx, &e, obs, NULL, npix, P13, NP, &o, &r);
        double worst = 0;
        int wj = 0;
        for (int j = 0; j < NP && rc == NBG_OK; ++j) {
            const double z = fabs(r.value[j] - tv[j]) / r.sigma[j];
            worst_p[j] = fmax(worst_p[j], z);
            if (z > worst) {
                worst = z, wj = j;
            }
        }
        char id[64];
        snprintf(id, sizeof id, "realdata-1-start%d", k);
        const int ok = rc == NBG_OK && r.converged && worst <= 3 && !r.floor.mismatch;
        nbgi_test_check(ok, id, "%s after %d iterations (%s); worst |value - truth| = %.2f sigma (%s); scale %.4f "
                       "+- %.2g, bg %.3f +- %.2g%s", r.converged ? "converged" : "NOT converged", r.iterations, r.why,
                       worst, nbg_param_name(P13[wj]), NBGI_AT(r.value, 9), NBGI_AT(r.sigma, 9), NBGI_AT(r.value, 10),
                       NBGI_AT(r.sigma, 10), rc == NBG_OK ? "" : nbg_errmsg(ctx));
        good += ok;
        nbg_refine_result_free(&r);
    }
    printf("# |value - truth| / sigma, worst over the 10 starts:");
    for (int j = 0; j < NP; ++j) {
        printf(" %s %.2f", nbg_param_name(P13[j]), worst_p[j]);
    }
    printf("\n");
    nbgi_test_check(good == 10, "realdata-1", "%d of 10 starts converged with every parameter within 3 sigma", good);
}

int main(void)
{
    nbg_ctx *ctx;
    if (nbg_ctx_create(&ctx, NBG_BACKEND_CPU, NBG_DOUBLE, 0) != NBG_OK) {
        printf("FAIL realdata-0 context\n");
        return 1;
    }
    nbg_experiment t;
    truth(&t);
    const size_t npix = (size_t)NPIX_SIDE * NPIX_SIDE;
    float *obs = malloc(npix * sizeof(float));

    /* realdata-1: 13 parameters (cell, orientation, scale, background plane) from 10 seeded starts, each on its
     * own noise image */
    recovery(ctx, &t, obs, npix);

    /* realdata-2: the same data with the pedestal left out of the model: the floor check says so, before the fit
     * and in the refinement's result; with the pedestal given it does not (no false alarm) */
    {
        observe(ctx, &t, 7, obs, npix);
        nbg_experiment e = t;
        e.response.pedestal = 0;
        e.bg[0] = e.bg[1] = e.bg[2] = 0;
        nbg_floor_check fc;
        int rc = nbg_check_floor(ctx, &e, obs, NULL, NULL, npix, &fc);
        nbgi_test_check(rc == NBG_OK && fc.mismatch && fabs(fc.floor - 40) <= 3, "realdata-2-floor",
                       "no pedestal in the model: floor %.4g counts against the model's %.4g (sigma %.3g): %s",
                       fc.floor, fc.model_floor, fc.sigma, fc.message);
        nbg_refine_options o;
        nbg_refine_options_default(&o);
        o.loss = NBG_LOSS_POISSON;
        nbg_refine_result r = {0};
        rc = nbg_refine(ctx, &e, obs, NULL, npix, P13, 10, &o, &r); /* cell, orientation, scale: no background */
        nbgi_test_check(rc == NBG_OK && r.floor.mismatch, "realdata-2-refine",
                       "the refinement's result carries the mismatch after the fit (%s after %d iterations): %s",
                       r.converged ? "converged" : "not converged", r.iterations, r.floor.message);
        nbg_refine_result_free(&r);
        e = t;
        rc = nbg_check_floor(ctx, &e, obs, NULL, NULL, npix, &fc);
        nbgi_test_check(rc == NBG_OK && !fc.mismatch, "realdata-2-no-false-alarm",
                       "with the pedestal: floor %.4g against the model's %.4g", fc.floor, fc.model_floor);
    }

    /* realdata-3: gradients of the image-level parameters (and of two crystal ones with scale 1.7 and a
     * background) pass the gradient check; the Jacobian columns equal finite differences of the image */
    {
        nbg_experiment e = t;
        e.fpixels = e.spixels = 48;
        nbg_gradcheck_result res[6];
        const nbg_param m[6] = {NBG_P_A, NBG_P_ROTX, NBG_P_SCALE, NBG_P_BG, NBG_P_BG_FAST, NBG_P_BG_SLOW};
        const int rc = nbg_gradcheck(ctx, &e, m, 6, 1e-6, 1, res);
        const int n = rc == NBG_OK ? 6 : 0;
        nbgi_test_check(rc == NBG_OK && n == 6, "realdata-3-gradcheck-ran", "%d parameters checked (%s)", n,
                       rc == NBG_OK ? "ok" : nbg_errmsg(ctx));
        for (int i = 0; i < n; ++i) {
            char id[64];
            snprintf(id, sizeof id, "realdata-3-gradcheck-%s", nbg_param_name(res[i].param));
            nbgi_test_check(res[i].status == NBG_CHECK_PASS, id, "adjoint=%.12g numeric=%.12g relerr=%.2g # %s",
                           res[i].adjoint, res[i].numeric, res[i].relerr, res[i].reason);
        }
        /* Jacobian columns against central differences of nbg_simulate */
        const size_t np = 48 * 48;
        const nbg_param jp[5] = {NBG_P_SCALE, NBG_P_BG, NBG_P_BG_FAST, NBG_P_BG_SLOW, NBG_P_ROTX};
        const double h[5] = {1e-2, 0.5, 20, 20, 1e-3};
        double *T = malloc(5 * np * sizeof(double));
        float *img = malloc(np * sizeof(float)), *ip = malloc(np * sizeof(float)), *im = malloc(np * sizeof(float));
        const int jrc = nbg_simulate_jvp(ctx, &e, jp, 5, T, img, np);
        for (int j = 0; j < 5; ++j) {
            nbg_experiment a = e, b = e;
            double v;
            nbg_param_get(&e, jp[j], &v);
            nbg_param_set(&a, jp[j], v + h[j]);
            nbg_param_set(&b, jp[j], v - h[j]);
            nbg_simulate(ctx, &a, ip, np, NULL);
            nbg_simulate(ctx, &b, im, np, NULL);
            double worst = 0, tmax = 0;
            for (size_t i = 0; i < np; ++i) {
                tmax = fmax(tmax, fabs(T[j * np + i]));
            }
            for (size_t i = 0; i < np; ++i) {
                const double fd = ((double)ip[i] - im[i]) / (2 * h[j]);
                worst = fmax(worst, fabs(fd - T[j * np + i]));
            }
            /* the images are float: the differences carry ~1e-7 of the image over 2h */
            char id[64];
            snprintf(id, sizeof id, "realdata-3-jacobian-%s", nbg_param_name(jp[j]));
            nbgi_test_check(jrc == NBG_OK && tmax > 0 && worst <= 2e-3 * tmax, id,
                           "max |J - finite difference| = %.3g of max |J| %.4g", worst, tmax);
        }
        free(T);
        free(img);
        free(ip);
        free(im);
    }

    /* realdata-4: a hot pixel (60000 counts) on the background: masked, it does not enter the fit (the values
     * are those of the fit to the clean image with the same mask, bit for bit); unmasked, it moves the background */
    {
        observe(ctx, &t, 7, obs, npix);
        const size_t hot = (size_t)5 * NPIX_SIDE + 7; /* near a corner, on the background */
        uint8_t *mask = malloc(npix);
        memset(mask, 1, npix);
        mask[hot] = 0;
        nbg_refine_options o;
        nbg_refine_options_default(&o);
        o.loss = NBG_LOSS_POISSON;
        nbg_refine_result rc_clean = {0}, rc_hot = {0}, rc_open = {0};
        nbg_experiment e = t;
        e.mask = mask;
        int rc1 = nbg_refine(ctx, &e, obs, NULL, npix, P13, NP, &o, &rc_clean);
        const float saved = obs[hot];
        obs[hot] = 60000;
        e = t;
        e.mask = mask;
        int rc2 = nbg_refine(ctx, &e, obs, NULL, npix, P13, NP, &o, &rc_hot);
        e = t;
        int rc3 = nbg_refine(ctx, &e, obs, NULL, npix, P13, NP, &o, &rc_open);
        obs[hot] = saved;
        nbgi_test_check(rc1 == NBG_OK && rc2 == NBG_OK && rc_clean.value != NULL && rc_hot.value != NULL &&
                           memcmp(rc_clean.value, rc_hot.value, sizeof(double) * NP) == 0 &&
                           rc_hot.nobs == (long)npix - 1,
                       "realdata-4-masked", "masked: the fit is the clean image's bit for bit (bg %.4f), %ld pixels",
                       NBGI_AT(rc_hot.value, 10), rc_hot.nobs);
        const double moved =
            fabs(NBGI_AT(rc_open.value, 10) - NBGI_AT(rc_clean.value, 10)) / NBGI_AT(rc_clean.sigma, 10);
        nbgi_test_check(rc3 == NBG_OK && moved > 3, "realdata-4-unmasked",
                       "unmasked: the hot pixel moves bg by %.1f sigma (%.4f -> %.4f)", moved,
                       NBGI_AT(rc_clean.value, 10), NBGI_AT(rc_open.value, 10));
        nbg_refine_result_free(&rc_clean);
        nbg_refine_result_free(&rc_hot);
        nbg_refine_result_free(&rc_open);
        free(mask);
    }

    /* realdata-5: stopping honestly: one iteration from a perturbed start is not convergence */
    {
        observe(ctx, &t, 7, obs, npix);
        uint64_t seed = 501;
        nbg_experiment e = t;
        start_from(&e, &seed);
        nbg_refine_options o;
        nbg_refine_options_default(&o);
        o.loss = NBG_LOSS_POISSON;
        o.max_iter = 1;
        nbg_refine_result r = {0};
        const int rc = nbg_refine(ctx, &e, obs, NULL, npix, P13, NP, &o, &r);
        nbgi_test_check(rc == NBG_OK && !r.converged && r.reason == NBG_STOP_MAXITER && r.iterations == 1,
                       "realdata-5-maxiter", "max_iter 1: converged %d, reason %d, %d iterations: %s", r.converged,
                       (int)r.reason, r.iterations, r.why);
        /* a parameter driven to its bound: the scale of an image that holds only the pedestal */
        for (size_t i = 0; i < npix; ++i) {
            obs[i] = 40;
        }
        obs[0] = 41; /* one photon, so that there is something to fit */
        e = t;
        const nbg_param ps[1] = {NBG_P_SCALE};
        o.max_iter = 200;
        const int rc2 = nbg_refine(ctx, &e, obs, NULL, npix, ps, 1, &o, &r);
        nbgi_test_check(rc2 != NBG_OK || (!r.converged && r.reason == NBG_STOP_BOUND), "realdata-5-bound",
                       "scale fitted to a blank image: %s", rc2 == NBG_OK ? r.why : nbg_errmsg(ctx));
        nbg_refine_result_free(&r);
    }

    /* realdata-6: gradcheck's ZERO status.  The tophat crystal is flat inside its edge: nothing depends on the
     * cell length a there, so a is ZERO (not a failure) while distance passes; a broken adjoint still fails, and
     * so does an adjoint of 0 against a non-zero difference */
    {
        nbg_experiment e;
        nbg_experiment_default(&e);
        e.has_cell = 1;
        e.cell[0] = e.cell[1] = e.cell[2] = 100;
        e.cell[3] = e.cell[4] = e.cell[5] = 90;
        e.default_F = 100;
        e.Na = e.Nb = e.Nc = 5;
        e.fpixels = e.spixels = 32;
        e.shape = NBG_SHAPE_TOPHAT;
        nbg_gradcheck_result res[2];
        const nbg_param m[2] = {NBG_P_A, NBG_P_DISTANCE};
        int rc = nbg_gradcheck(ctx, &e, m, 2, 1e-6, 1, res);
        int n = rc == NBG_OK ? 2 : 0;
        nbgi_test_check(rc == NBG_OK && n == 2 && res[0].status == NBG_CHECK_ZERO && res[1].status == NBG_CHECK_PASS,
                       "realdata-6-zero", "a: %s (%s); distance: %s", n > 0 && res[0].status == NBG_CHECK_ZERO ? "ZERO"
                       : "not ZERO", n > 0 ? res[0].reason : "", n > 1 && res[1].pass ? "PASS" : "not PASS");
        nbgi_debug_break_adjoint(ctx, NBG_P_DISTANCE);
        rc = nbg_gradcheck(ctx, &e, m, 2, 1e-6, 1, res);
        n = rc == NBG_OK ? 2 : 0;
        nbgi_test_check(rc == NBG_OK && n == 2 && res[1].status == NBG_CHECK_FAIL, "realdata-6-broken",
                       "a broken distance adjoint fails: %s", n > 1 ? res[1].reason : "");
        nbgi_debug_break_adjoint(ctx, -1);
        nbgi_debug_zero_adjoint(ctx, NBG_P_DISTANCE);
        rc = nbg_gradcheck(ctx, &e, m, 2, 1e-6, 1, res);
        n = rc == NBG_OK ? 2 : 0;
        nbgi_test_check(rc == NBG_OK && n == 2 && res[1].status == NBG_CHECK_FAIL, "realdata-6-lost",
                       "an adjoint of 0 against a difference of %.6g fails, not ZERO: %s", n > 1 ? res[1].numeric : 0.0,
                       n > 1 ? res[1].reason : "");
        nbgi_debug_zero_adjoint(ctx, -1);
        char why[256];
        const int fr = nbg_param_free(ctx, &e, NBG_P_MOSAIC, why, sizeof why);
        nbgi_test_check(fr == 0 && strstr(why, "mosaic") != NULL, "realdata-6-param-free",
                       "mosaic is not free without a spread: %s", why);
    }

    /* realdata-7: the losses through the detector response: Poisson on (obs - pedestal) / gain, clipped at 0, and
     * the shifted Poisson with read noise, against the formulas of nbgrad.h */
    {
        nbg_experiment e = t;
        e.fpixels = e.spixels = 32;
        e.response.gain = 2;
        e.response.read_noise = 3;
        const size_t np = 32 * 32;
        float *img = malloc(np * sizeof(float)), *o2 = malloc(np * sizeof(float));
        nbg_simulate(ctx, &e, img, np, NULL);
        uint64_t s = 99;
        for (size_t i = 0; i < np; ++i) {
            o2[i] = (float)fmax(0, 40 + 2 * img[i] + 6 * uni(&s)); /* some below the pedestal */
        }
        double L = 0, Lref = 0;
        nbg_loss_grad(ctx, &e, NBG_LOSS_POISSON, o2, NULL, NULL, 0, &L, NULL, img, np);
        const double sr = (3.0 / 2) * (3.0 / 2);
        for (size_t i = 0; i < np; ++i) {
            const double y = fmax((o2[i] - 40.0) / 2 + sr, 0), m = img[i] + sr;
            Lref += m - (y > 0 ? y * log(m) : 0);
        }
        nbgi_test_rel(L, Lref, 1e-12, "realdata-7-shifted-poisson", "L = sum (M + s) - max(y + s, 0) log(M + s)");
        e.response.read_noise = 0;
        nbg_loss_grad(ctx, &e, NBG_LOSS_POISSON, o2, NULL, NULL, 0, &L, NULL, img, np);
        Lref = 0;
        for (size_t i = 0; i < np; ++i) {
            const double y = fmax((o2[i] - 40.0) / 2, 0), m = fmax(img[i], 1e-12);
            Lref += m - (y > 0 ? y * log(m) : 0);
        }
        nbgi_test_rel(L, Lref, 1e-12, "realdata-7-poisson", "L = sum M - max(y, 0) log M, y = (obs - 40) / 2");
        free(img);
        free(o2);
    }
    free(obs);
    nbg_ctx_destroy(ctx);
    return nbgi_test_summary();
}
