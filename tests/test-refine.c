/*
 * test-refine.c -- refinement of cell and orientation: recovery from seeded random starts with both optimizers
 * on a noise-free image, standard errors that cover the truth under Poisson noise, and bad input.
 */
#include "testutil.h" /* first: it sets _GNU_SOURCE */
#include "nbgrad.h"

void nbgi_deviance_moments(double mu, double *E, double *V); /* grad/refine.c, internal */

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const nbg_param P9[9] = {NBG_P_A, NBG_P_B, NBG_P_C, NBG_P_ALPHA, NBG_P_BETA, NBG_P_GAMMA,
                                NBG_P_ROTX, NBG_P_ROTY, NBG_P_ROTZ};

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
    e->lambda = 1;
    e->distance = 100;
    e->fpixels = e->spixels = 128;
    e->oversample = 1;
}

/* A uniform deviate in [-1, 1) from a 64-bit LCG. */
static double uni(uint64_t *s)
{
    *s = *s * 6364136223846793005ULL + 1442695040888963407ULL;
    return (double)(*s >> 11) * (2.0 / 9007199254740992.0) - 1.0;
}

/* Perturbs the truth: +-frac of the cell lengths, +-ang deg of the angles and orientation. */
static void perturb(nbg_experiment *e, uint64_t *s, double frac, double ang)
{
    for (int i = 0; i < 3; ++i) {
        e->cell[i] *= 1 + frac * uni(s);
        e->cell[3 + i] += ang * uni(s);
        e->misset[i] += ang * uni(s);
    }
}

int main(void)
{
    nbg_ctx *ctx;
    if (nbg_ctx_create(&ctx, NBG_BACKEND_CPU, NBG_DOUBLE, 0) != NBG_OK) {
        printf("FAIL refine-0 context\n");
        return 1;
    }
    nbg_experiment t;
    truth(&t);
    const size_t npix = 128 * 128;
    float *obs = malloc(npix * sizeof(float));
    nbg_simulate(ctx, &t, obs, npix, NULL);
    double tv[9];
    for (int j = 0; j < 9; ++j) {
        nbg_param_get(&t, P9[j], &tv[j]);
    }

    /* refine-1: recovery from 10 seeded starts, both optimizers */
    const char *names[2] = {"lm", "bfgs"};
    for (int m = 0; m < 2; ++m) {
        int recovered = 0, maxit = 0;
        for (int k = 0; k < 10; ++k) {
            uint64_t seed = 1000 + (uint64_t)k;
            nbg_experiment e = t;
            perturb(&e, &seed, 0.01, 0.5);
            nbg_refine_options o;
            nbg_refine_options_default(&o);
            o.method = m == 0 ? NBG_OPT_LM : NBG_OPT_BFGS;
            nbg_refine_result r = {0};
            const int rc = nbg_refine(ctx, &e, obs, NULL, npix, P9, 9, &o, &r);
            double dlen = 0, dang = 0, drot = 0;
            for (int j = 0; j < 3 && rc == NBG_OK; ++j) {
                dlen = fmax(dlen, fabs(r.value[j] - tv[j]) / tv[j]);
                dang = fmax(dang, fabs(r.value[3 + j] - tv[3 + j]));
                drot = fmax(drot, fabs(r.value[6 + j] - tv[6 + j]));
            }
            const int ok = rc == NBG_OK && dlen <= 5e-4 && dang <= 0.01 && drot <= 0.01 && r.iterations <= 100;
            char id[64];
            snprintf(id, sizeof id, "refine-1-%s-start%d", names[m], k);
            nbgi_test_check(ok, id, "%d iterations; worst errors: length %.2g%%, angle %.2g deg, orientation %.2g deg%s",
                           r.iterations, dlen * 100, dang, drot, rc == NBG_OK ? "" : nbg_errmsg(ctx));
            recovered += ok;
            maxit = r.iterations > maxit ? r.iterations : maxit;
            nbg_refine_result_free(&r);
        }
        char id[64];
        snprintf(id, sizeof id, "refine-1-%s", names[m]);
        nbgi_test_check(recovered == 10, id, "%d of 10 starts recovered, at most %d iterations", recovered, maxit);
    }

    /* refine-2: Poisson noise; the truth lies within 3 reported standard errors for at least 9 of 10 seeds */
    {
        nbg_experiment tb = t;
        tb.fluence *= 20;
        float *mean = malloc(npix * sizeof(float));
        uint16_t *counts = malloc(npix * sizeof(uint16_t));
        nbg_simulate(ctx, &tb, mean, npix, NULL);
        int covered = 0, fit_ok = 0;
        double worst_fit = 0;
        for (int k = 0; k < 10; ++k) {
            long photons, overloads;
            nbg_noise_image(ctx, mean, 128, 128, NULL, 0, 4242 + k, counts, &photons, &overloads);
            for (size_t i = 0; i < npix; ++i) {
                obs[i] = counts[i];
            }
            uint64_t seed = 77 + (uint64_t)k;
            nbg_experiment e = tb;
            perturb(&e, &seed, 0.003, 0.1);
            nbg_refine_options o;
            nbg_refine_options_default(&o);
            o.loss = NBG_LOSS_POISSON;
            nbg_refine_result r = {0};
            const int rc = nbg_refine(ctx, &e, obs, NULL, npix, P9, 9, &o, &r);
            double worst = 0;
            for (int j = 0; j < 9 && rc == NBG_OK; ++j) {
                worst = fmax(worst, fabs(r.value[j] - tv[j]) / r.sigma[j]);
            }
            char id[64];
            snprintf(id, sizeof id, "refine-2-noise-seed%d", k);
            nbgi_test_check(rc == NBG_OK && r.sigma[0] > 0, id,
                           "refined with Poisson loss in %d iterations; worst |value - truth| = %.2f sigma "
                           "(sigma a = %.2g A, rotx = %.2g deg)",
                           r.iterations, worst, NBGI_AT(r.sigma, 0), NBGI_AT(r.sigma, 6));
            covered += rc == NBG_OK && worst <= 3;
            fit_ok += rc == NBG_OK && !r.fit.mismatch && r.fit.n == (long)npix && r.fit.sigma_scale >= 1;
            if (rc == NBG_OK) {
                worst_fit = fmax(worst_fit, fabs(r.fit.ratio - 1) / r.fit.sd);
            }
            nbg_refine_result_free(&r);
        }
        nbgi_test_check(covered >= 9, "refine-2-coverage", "%d of 10 noise seeds within 3 standard errors", covered);
        nbgi_test_check(fit_ok == 10 && worst_fit <= 5, "refine-2-fit", "the right model explains the data within "
                       "their noise in %d of 10 seeds (the deviance ratio at most %.2f of its standard deviations from 1)",
                       fit_ok, worst_fit);
        /* refine-4: a wrong crystal size (N 4 against the data's 5) is flagged by the goodness of fit, the same data
         * with the right one is not */
        nbg_noise_image(ctx, mean, 128, 128, NULL, 0, 4242, counts, NULL, NULL);
        for (size_t i = 0; i < npix; ++i) {
            obs[i] = counts[i];
        }
        static const nbg_param P10[10] = {NBG_P_A, NBG_P_B, NBG_P_C, NBG_P_ALPHA, NBG_P_BETA, NBG_P_GAMMA,
                                          NBG_P_ROTX, NBG_P_ROTY, NBG_P_ROTZ, NBG_P_SCALE};
        for (int wrong = 0; wrong < 2; ++wrong) {
            nbg_experiment e = tb;
            if (wrong) {
                e.Na = e.Nb = e.Nc = 4;
            }
            nbg_refine_options o;
            nbg_refine_options_default(&o);
            o.loss = NBG_LOSS_POISSON;
            nbg_refine_result r = {0};
            const int rc = nbg_refine(ctx, &e, obs, NULL, npix, P10, 10, &o, &r);
            const int ok = rc == NBG_OK && r.fit.mismatch == wrong &&
                           (wrong ? r.fit.sigma_scale > 1 && strstr(r.fit.message, "does not explain") != NULL
                                  : r.fit.sigma_scale >= 1 && r.fit.sigma_scale < 1.05);
            nbgi_test_check(ok, wrong ? "refine-4-wrong-N" : "refine-4-right-N", "%s: %s (standard errors x %.3g)",
                           wrong ? "N 4 against 5" : "N 5", rc == NBG_OK ? r.fit.message : nbg_errmsg(ctx),
                           r.fit.sigma_scale);
            nbg_refine_result_free(&r);
        }
        /* refine-4-bright: the right model on brighter data (a spot peak of 40000 photons: the deviance's expectation
         * from its asymptotic form above 100 photons) is within the noise too */
        {
            float peak = 0;
            for (size_t i = 0; i < npix; ++i) {
                peak = fmaxf(peak, mean[i]);
            }
            const double f = 40000.0 / peak; /* the peak at 40000 photons, below the 16-bit counts' ceiling */
            nbg_experiment e = tb;
            e.fluence *= f;
            nbg_simulate(ctx, &e, mean, npix, NULL);
            peak = 0;
            for (size_t i = 0; i < npix; ++i) {
                peak = fmaxf(peak, mean[i]);
            }
            nbg_noise_image(ctx, mean, 128, 128, NULL, 0, 4343, counts, NULL, NULL);
            for (size_t i = 0; i < npix; ++i) {
                obs[i] = counts[i];
            }
            nbg_refine_options o;
            nbg_refine_options_default(&o);
            o.loss = NBG_LOSS_POISSON;
            nbg_refine_result r = {0};
            const int rc = nbg_refine(ctx, &e, obs, NULL, npix, P10, 10, &o, &r);
            nbgi_test_check(rc == NBG_OK && !r.fit.mismatch && peak > 1000, "refine-4-bright-right-N",
                           "peak %.0f photons: %s", peak, rc == NBG_OK ? r.fit.message : nbg_errmsg(ctx));
            nbg_refine_result_free(&r);
        }
        free(mean);
        free(counts);
    }

    /* refine-5: the deviance's mean and variance the goodness of fit uses, against sums over the Poisson
     * distribution in logarithms (no underflow at any mean) */
    {
        static const double mus[] = {1e-6, 0.01, 0.3, 1, 3, 10, 50, 99, 101, 300, 750, 900, 5000, 1e5};
        double worst = 0;
        char at[192] = "";
        for (size_t q = 0; q < sizeof mus / sizeof mus[0]; ++q) {
            const double mu = mus[q];
            double e = 0, e2 = 0;
            const double k0 = floor(mu), span = 14 * sqrt(mu) + 30;
            for (double k = fmax(0, k0 - span); k <= k0 + span; ++k) {
                const double p = exp(k * log(mu) - mu - lgamma(k + 1));
                const double d = 2 * ((k > 0 ? k * log(k / mu) : 0) - (k - mu));
                e += p * d;
                e2 += p * d * d;
            }
            double E, V;
            nbgi_deviance_moments(mu, &E, &V);
            const double err = fmax(fabs(E - e) / fmax(e, 1e-3), fabs(V - (e2 - e * e)) / fmax(e2 - e * e, 1e-3));
            if (err > worst) {
                worst = err;
                snprintf(at, sizeof at, "mu %g: E %.6g (sum %.6g), V %.6g (sum %.6g)", mu, E, e, V, e2 - e * e);
            }
        }
        nbgi_test_check(worst < 2e-3, "refine-5-deviance-moments", "the deviance's mean and variance from 1e-6 to 1e5 "
                       "photons within %.2g of the sums (worst at %s)", worst, at);
    }

    /* refine-3: bad input */
    {
        nbg_simulate(ctx, &t, obs, npix, NULL);
        nbg_refine_options o;
        nbg_refine_options_default(&o);
        nbg_refine_result r = {0};
        nbg_experiment e = t;
        nbgi_test_check(nbg_refine(ctx, &e, obs, NULL, npix - 5, P9, 9, &o, &r) == NBG_EINVAL, "refine-3-size",
                       "an observed image of the wrong size: %s", nbg_errmsg(ctx));
        /* a pixel below zero (dark-subtracted data) is data: least squares takes it as it is, Poisson clips it */
        {
            const float keep = obs[100];
            float *img = malloc(npix * sizeof(float));
            double L0 = NAN, L1 = NAN, P0 = NAN, P1 = NAN;
            int ok = img != NULL;
            for (int k = 0; ok && k < 2; ++k) {
                obs[100] = k ? -7.0f : 0.0f;
                ok = nbg_loss_grad(ctx, &e, NBG_LOSS_LSQ, obs, NULL, NULL, 0, k ? &L1 : &L0, NULL, img, npix) ==
                         NBG_OK &&
                     nbg_loss_grad(ctx, &e, NBG_LOSS_POISSON, obs, NULL, NULL, 0, k ? &P1 : &P0, NULL, img, npix) ==
                         NBG_OK;
            }
            /* model M at pixel 100 (pedestal 0, gain 1): (M + 7)^2 - M^2 = 14 M + 49; Poisson: the same (y -> 0) */
            const double M = img != NULL ? img[100] : NAN;
            nbgi_test_check(ok && fabs((L1 - L0) - (14 * M + 49)) <= 1e-9 * fmax(1, fabs(L1)) && P1 == P0,
                            "refine-3-negative", "a pixel of -7 counts is data: least squares adds (M + 7)^2 - M^2 = "
                            "%.6g (got %.6g), Poisson clips it at 0 (loss unchanged: %s)%s", 14 * M + 49, L1 - L0,
                            P1 == P0 ? "yes" : "no", ok ? "" : nbg_errmsg(ctx));
            obs[100] = -7.0f;
            nbg_refine_result rr = {0};
            nbg_experiment e2 = t;
            const int rc = nbg_refine(ctx, &e2, obs, NULL, npix, P9, 9, &o, &rr);
            nbgi_test_check(rc == NBG_OK, "refine-3-negative-refine", "refine on an image with a pixel below zero "
                            "runs (status %d%s%s)", rc, rc == NBG_OK ? "" : ": ", rc == NBG_OK ? "" : nbg_errmsg(ctx));
            nbg_refine_result_free(&rr);
            obs[100] = keep;
            free(img);
        }
        obs[100] = NAN;
        nbgi_test_check(nbg_refine(ctx, &e, obs, NULL, npix, P9, 9, &o, &r) == NBG_EINVAL, "refine-3-nan",
                       "a NaN observed pixel: %s", nbg_errmsg(ctx));
        obs[100] = 0;
        const nbg_param badp = (nbg_param)77;
        nbgi_test_check(nbg_refine(ctx, &e, obs, NULL, npix, &badp, 1, &o, &r) == NBG_EINVAL, "refine-3-param",
                       "an unknown parameter: %s", nbg_errmsg(ctx));
        nbgi_test_check(nbg_param_from_name("cell_a") == -1 && nbg_param_from_name("gamma") == NBG_P_GAMMA,
                       "refine-3-param-name", "parameter names resolve, unknown ones do not");
        e.cell[0] = -70;
        nbgi_test_check(nbg_refine(ctx, &e, obs, NULL, npix, P9, 9, &o, &r) == NBG_EINVAL &&
                           strstr(nbg_errmsg(ctx), "bounds") != NULL,
                       "refine-3-bounds", "a start outside the bounds: %s", nbg_errmsg(ctx));
        nbg_refine_result_free(&r);
    }
    /* refine-6: the cell under a tetragonal space group: a and c fitted (b = a), the angles held at 90, the full
     * cell reported with b's error a's; a start cell that is not tetragonal is refused; held parameters alone are
     * nothing to fit */
    {
        nbg_experiment tt;
        truth(&tt);
        const double cell[6] = {70, 70, 90, 90, 90, 90};
        memcpy(tt.cell, cell, sizeof cell);
        snprintf(tt.space_group, sizeof tt.space_group, "P 43 21 2");
        float *o5 = malloc(npix * sizeof(float));
        nbg_simulate(ctx, &tt, o5, npix, NULL);
        nbg_experiment e = tt;
        e.cell[0] = e.cell[1] = 70.4;
        e.cell[2] = 89.6;
        e.cell[5] = 90.3; /* within 1 deg: made 90 */
        nbg_refine_options o;
        nbg_refine_options_default(&o);
        nbg_refine_result r = {0};
        const int rc = nbg_refine(ctx, &e, o5, NULL, npix, P9, 9, &o, &r);
        const int want_tied[9] = {0, 0, 2, -1, -1, -1, 6, 7, 8};
        int tied_ok = rc == NBG_OK && r.tied != NULL && r.nparams == 9;
        for (int j = 0; tied_ok && j < 9; ++j) {
            tied_ok = r.tied[j] == want_tied[j];
        }
        nbgi_test_check(tied_ok && r.converged && fabs(r.value[0] - 70) < 1e-4 && r.value[1] == r.value[0] &&
                            fabs(r.value[2] - 90) < 1e-4 && r.value[3] == 90 && r.value[4] == 90 && r.value[5] == 90 &&
                            r.sigma[1] == r.sigma[0] && r.sigma[3] == 0 && e.cell[1] == e.cell[0] &&
                            strstr(r.constraint, "tetragonal") != NULL,
                        "refine-6-tetragonal", "P 43 21 2: a %.6f b %.6f c %.6f angles %g %g %g, converged %d (%s); %s",
                        rc == NBG_OK ? r.value[0] : NAN, rc == NBG_OK ? r.value[1] : NAN,
                        rc == NBG_OK ? r.value[2] : NAN, rc == NBG_OK ? r.value[3] : NAN,
                        rc == NBG_OK ? r.value[4] : NAN, rc == NBG_OK ? r.value[5] : NAN, r.converged,
                        rc == NBG_OK ? r.why : nbg_errmsg(ctx), r.constraint);
        e = tt;
        e.cell[1] = 72;
        nbgi_test_check(nbg_refine(ctx, &e, o5, NULL, npix, P9, 9, &o, &r) == NBG_EINVAL &&
                            strstr(nbg_errmsg(ctx), "not tetragonal") != NULL && e.cell[1] == 72,
                        "refine-6-not-tetragonal", "a start cell with b != a: %s", nbg_errmsg(ctx));
        e = tt;
        const nbg_param angles[3] = {NBG_P_ALPHA, NBG_P_BETA, NBG_P_GAMMA};
        nbgi_test_check(nbg_refine(ctx, &e, o5, NULL, npix, angles, 3, &o, &r) == NBG_EINVAL &&
                            strstr(nbg_errmsg(ctx), "held") != NULL,
                        "refine-6-held", "only the angles: %s", nbg_errmsg(ctx));
        nbg_refine_result_free(&r);
        free(o5);
    }
    /* refine-8: the detector as DIALS refines it (the group detector_frame: the distance along the normal, the
     * shifts along fast and slow, det_tau1-3 about the detector's own frame) on an experiment read from a list
     * (the sample pivot): a detector moved 0.16 mm and turned by 0.6, -0.4, 0.32 deg (its spots up to a pixel
     * away: the basin of a fit to the pixels) is found from where the list put it */
    {
        nbg_experiment te;
        truth(&te);
        te.distance = 60, te.pixel = 0.2, te.fpixels = te.spixels = 192;
        nbg_report rr;
        nbg_geometry g;
        nbg_experiment el = te;
        const int ok = nbg_describe(ctx, &te, &rr) == NBG_OK && nbg_geometry_from_report(ctx, &te, &rr, 1, &g) ==
                       NBG_OK && nbg_experiment_from_geometry(ctx, &g, &el) == NBG_OK;
        const size_t n8 = 192 * 192;
        float *o8 = malloc(n8 * sizeof(float));
        nbg_experiment tt = el;
        tt.close_distance += 0.16, tt.beam_shift[0] = 0.12, tt.beam_shift[1] = -0.08;
        tt.det_tau[0] = 0.6, tt.det_tau[1] = -0.4, tt.det_tau[2] = 0.32;
        const char *names6[6] = {"distance", "beam_fast", "beam_slow", "det_tau1", "det_tau2", "det_tau3"};
        nbg_param P6[6];
        double want[6];
        for (int j = 0; j < 6; ++j) {
            P6[j] = nbg_param_from_name(names6[j]);
            nbg_param_get(&tt, P6[j], &want[j]);
        }
        int rc = ok && o8 != NULL ? nbg_simulate(ctx, &tt, o8, n8, NULL) : NBG_EINVAL;
        nbg_refine_options o;
        nbg_refine_options_default(&o);
        nbg_refine_result r = {0};
        nbg_experiment e = el;
        if (rc == NBG_OK) {
            rc = nbg_refine(ctx, &e, o8, NULL, n8, P6, 6, &o, &r);
        }
        double dmm = 0, ddeg = 0;
        for (int j = 0; j < 3 && rc == NBG_OK; ++j) {
            dmm = fmax(dmm, fabs(r.value[j] - want[j]));
            ddeg = fmax(ddeg, fabs(r.value[3 + j] - want[3 + j]));
        }
        nbgi_test_check(rc == NBG_OK && r.converged && dmm < 1e-4 && ddeg < 1e-3, "refine-8-detector-frame",
                        "distance, beam_fast, beam_slow, det_tau1-3 from a list's placement: worst errors %.2g mm, "
                        "%.2g deg, %d iterations (%s)", dmm, ddeg, r.iterations,
                        rc == NBG_OK ? r.why : nbg_errmsg(ctx));
        /* nanoBragg's detector parameters (rotations about the lab axes through the sample) span the same motions
         * with the shifts free: from the same start they place the detector where the turns about its own frame
         * did */
        const int it_frame = r.iterations;
        nbg_refine_result_free(&r);
        const char *names_lab[6] = {"distance", "beam_fast", "beam_slow", "det_rotx", "det_roty", "det_rotz"};
        nbg_param PL[6];
        for (int j = 0; j < 6; ++j) {
            PL[j] = nbg_param_from_name(names_lab[j]);
        }
        nbg_experiment e2 = el;
        nbg_refine_result r2 = {0};
        int rc2 = rc == NBG_OK ? nbg_refine(ctx, &e2, o8, NULL, n8, PL, 6, &o, &r2) : rc;
        nbg_report ra, rb, r0;
        double dpos = INFINITY, daxis = INFINITY, moved = 0;
        if (rc2 == NBG_OK && nbg_describe(ctx, &e, &ra) == NBG_OK && nbg_describe(ctx, &e2, &rb) == NBG_OK &&
            nbg_describe(ctx, &el, &r0) == NBG_OK) {
            dpos = daxis = 0;
            for (int i = 0; i < 3; ++i) {
                dpos = fmax(dpos, fabs(ra.pix0[i] - rb.pix0[i]) * 1000);
                daxis = fmax(daxis, fmax(fabs(ra.fdet[i] - rb.fdet[i]), fabs(ra.sdet[i] - rb.sdet[i])));
                moved = fmax(moved, fabs(rb.pix0[i] - r0.pix0[i]) * 1000);
            }
        }
        nbgi_test_check(rc2 == NBG_OK && r2.converged && dpos < 1e-6 && daxis < 1e-9 && moved > 0.05,
                        "refine-8-same-span", "distance, beam_fast, beam_slow, det_rotx-z from the same start place "
                        "the detector where the six did: pixel (0, 0) %.2g mm apart, axes %.2g apart, %.3g mm from "
                        "the start (%d iterations against %d)", dpos, daxis, moved, r2.iterations, it_frame);
        nbg_refine_result_free(&r2);
        free(o8);
    }
    free(obs);
    /* refine-7: per-reflection scales (nbg_refine_options.F).  A noise-free still rendered with a table of varied
     * structure factors; the fit starts from a table 30 % off entry by entry, the orientation 0.05 deg and the cell
     * 0.2 % off.  With the table fitted the geometry comes back and the table with it; with the table held wrong the
     * geometry absorbs the intensity errors. */
    {
        nbg_experiment tr;
        truth(&tr);
        tr.Na = tr.Nb = tr.Nc = 10;
        nbg_hkl tab = {-12, 12, -12, 12, -12, 12, NULL, 0};
        const size_t nF = 25 * 25 * 25;
        double *Ft = malloc(sizeof(double) * nF), *Fs = malloc(sizeof(double) * nF);
        tab.F = malloc(sizeof(double) * nF);
        float *o7 = malloc(sizeof(float) * 128 * 128);
        uint64_t seed = 7;
        for (size_t j = 0; j < nF; ++j) {
            Ft[j] = 100 * (1 + 0.5 * uni(&seed));
            Fs[j] = Ft[j] * (1 + 0.3 * uni(&seed));
        }
        memcpy(tab.F, Ft, sizeof(double) * nF);
        tr.hkl = &tab;
        int rc = nbg_simulate(ctx, &tr, o7, 128 * 128, NULL);
        const nbg_param P7[7] = {NBG_P_ORIENT_X, NBG_P_ORIENT_Y, NBG_P_ORIENT_Z, NBG_P_A, NBG_P_B, NBG_P_C, NBG_P_BG};
        double err_orient[2] = {0, 0}, err_cell[2] = {0, 0}, err_F = 0;
        int conv[2] = {0, 0};
        long fitted = 0;
        for (int withF = 0; withF < 2 && rc == NBG_OK; ++withF) {
            nbg_experiment e = tr;
            memcpy(tab.F, Fs, sizeof(double) * nF);
            e.orient[0] = 0.05;
            e.orient[1] = -0.04;
            e.orient[2] = 0.03;
            e.cell[0] *= 1.002;
            nbg_refine_options o7o;
            nbg_refine_options_default(&o7o);
            o7o.max_iter = 50;
            o7o.F = withF ? &tab : NULL;
            nbg_refine_result r7 = {0};
            rc = nbg_refine(ctx, &e, o7, NULL, 128 * 128, P7, 7, &o7o, &r7);
            if (rc == NBG_OK) {
                conv[withF] = r7.converged;
                for (int i = 0; i < 3; ++i) {
                    err_orient[withF] = fmax(err_orient[withF], fabs(e.orient[i]));
                    err_cell[withF] = fmax(err_cell[withF], fabs(e.cell[i] / tr.cell[i] - 1));
                }
                if (withF) {
                    fitted = r7.F_fitted;
                    /* each fitted entry's relative error, where the data determine it (noise-free data: rounding) */
                    double big = 0, bigrel = 0;
                    long n = 0, nweak = 0;
                    for (int j = 0; j < r7.nparams; ++j) {
                        if (r7.params[j] < NBG_P_F0) {
                            continue;
                        }
                        const long idx = (long)r7.params[j] - NBG_P_F0;
                        const double d = fabs(tab.F[idx] - Ft[idx]);
                        ++n;
                        if (r7.sigma[j] > 1e-3 * Ft[idx]) {
                            ++nweak; /* barely measured: a reflection at the edge of its spot */
                            continue;
                        }
                        big = fmax(big, d / Ft[idx]);
                        bigrel = fmax(bigrel, r7.sigma[j] > 0 ? d / r7.sigma[j] : INFINITY);
                    }
                    err_F = n > nweak ? big : INFINITY;
                    printf("# refine-7: %ld entries fitted, %d iterations; of the %ld with a standard error below "
                           "1e-3 of F, the largest relative error %.2g (%.2g standard errors); %ld barely measured\n",
                           r7.F_fitted, r7.iterations, n - nweak, big, bigrel, nweak);
                }
            }
            nbg_refine_result_free(&r7);
        }
        printf("# refine-7: orientation error %.3g deg / cell %.3g with the table held 30 %% off, %.3g deg / %.3g "
               "fitted\n", err_orient[0], err_cell[0], err_orient[1], err_cell[1]);
        nbgi_test_check(rc == NBG_OK && conv[1] && err_orient[1] < 1e-4 && err_cell[1] < 1e-5 && fitted > 20,
                        "refine-7-F-recovers", "with F fitted: converged %d, orientation error %.2g deg, cell %.2g, "
                        "%ld entries fitted", conv[1], err_orient[1], err_cell[1], fitted);
        nbgi_test_check(rc == NBG_OK && err_F < 1e-5, "refine-7-F-values",
                        "the well-measured fitted entries' largest relative error %.2g (start 30 %% off)", err_F);
        nbgi_test_check(rc == NBG_OK && err_orient[0] > 10 * err_orient[1] && err_cell[0] > 10 * err_cell[1],
                        "refine-7-F-needed", "with the table held wrong the geometry absorbs it: orientation error "
                        "%.2g deg, cell %.2g (fitted: %.2g, %.2g)", err_orient[0], err_cell[0], err_orient[1],
                        err_cell[1]);
        /* bad input: scale with F (the same factor), a frame not pointing at the table, no other parameter */
        nbg_experiment e = tr;
        nbg_refine_options o7o;
        nbg_refine_options_default(&o7o);
        o7o.F = &tab;
        nbg_refine_result r7 = {0};
        const nbg_param ps[2] = {NBG_P_ORIENT_X, NBG_P_SCALE};
        int bad = nbg_refine(ctx, &e, o7, NULL, 128 * 128, ps, 2, &o7o, &r7) == NBG_EINVAL &&
                  strstr(nbg_errmsg(ctx), "scale") != NULL;
        e.hkl = NULL;
        bad += nbg_refine(ctx, &e, o7, NULL, 128 * 128, ps, 1, &o7o, &r7) == NBG_EINVAL &&
               strstr(nbg_errmsg(ctx), "does not point") != NULL;
        e.hkl = &tab;
        bad += nbg_refine(ctx, &e, o7, NULL, 128 * 128, ps, 0, &o7o, &r7) == NBG_EINVAL;
        nbgi_test_check(bad == 3, "refine-7-F-bad", "%d of 3 refused: scale with F, a frame without the table, F alone",
                        bad);
        nbg_refine_result_free(&r7);
        free(Ft), free(Fs), free(tab.F), free(o7);
    }
    nbg_ctx_destroy(ctx);
    return nbgi_test_summary();
}
