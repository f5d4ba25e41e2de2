/*
 * test-scanvary.c -- a scan-varying orientation in refine (nbg_refine_options.scan_varying_knots): a rotation scan
 * whose crystal wobbles through the scan (each frame rendered with its own orientation offsets), refined from the
 * static crystal with one orientation for every frame and with knots; the knots' gradient against finite
 * differences of the summed loss; the same bits for 1 and 2 threads; the refusals; the knot weights.
 */
#include "testutil.h" /* first: it sets _GNU_SOURCE */
#include "nbgrad.h"
#include "internal.h" /* the test-only nbgi_debug_refine_eval */

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { NF = 12, PIX = 128 };
#define OSC 1.0

static const nbg_param ORI[3] = {NBG_P_ORIENT_X, NBG_P_ORIENT_Y, NBG_P_ORIENT_Z};

static void base(nbg_experiment *e)
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
    e->fpixels = e->spixels = PIX;
    e->oversample = 1;
    e->osc = OSC;
}

/* The true wobble at scan fraction t (deg): a bend, a drift and a swing, as a crystal warming or slipping. */
static void wobble(double t, double *o)
{
    o[0] = 0.08 * sin(M_PI * t);
    o[1] = 0.06 * (2 * t - 1);
    o[2] = 0.05 * cos(M_PI * t);
}

/* The rotation angle (deg) between two experiments' crystals at phi 0 (their real-space bases). */
static double orient_error(nbg_ctx *ctx, const nbg_experiment *a, const nbg_experiment *b)
{
    nbg_report ra, rb;
    if (nbg_describe(ctx, a, &ra) != NBG_OK || nbg_describe(ctx, b, &rb) != NBG_OK) {
        return INFINITY;
    }
    /* R with R b_i = a_i (rows a, b, c of each basis): R = A^T (B^T)^-1 */
    const double *A = ra.real_vectors, *B = rb.real_vectors;
    double Bt[9], inv[9], R[9];
    for (int i = 0; i < 3; ++i)
        for (int j = 0; j < 3; ++j) Bt[3 * i + j] = B[3 * j + i];
    const double det = Bt[0] * (Bt[4] * Bt[8] - Bt[5] * Bt[7]) - Bt[1] * (Bt[3] * Bt[8] - Bt[5] * Bt[6]) +
                       Bt[2] * (Bt[3] * Bt[7] - Bt[4] * Bt[6]);
    inv[0] = (Bt[4] * Bt[8] - Bt[5] * Bt[7]) / det, inv[1] = (Bt[2] * Bt[7] - Bt[1] * Bt[8]) / det;
    inv[2] = (Bt[1] * Bt[5] - Bt[2] * Bt[4]) / det, inv[3] = (Bt[5] * Bt[6] - Bt[3] * Bt[8]) / det;
    inv[4] = (Bt[0] * Bt[8] - Bt[2] * Bt[6]) / det, inv[5] = (Bt[2] * Bt[3] - Bt[0] * Bt[5]) / det;
    inv[6] = (Bt[3] * Bt[7] - Bt[4] * Bt[6]) / det, inv[7] = (Bt[1] * Bt[6] - Bt[0] * Bt[7]) / det;
    inv[8] = (Bt[0] * Bt[4] - Bt[1] * Bt[3]) / det;
    for (int i = 0; i < 3; ++i)
        for (int j = 0; j < 3; ++j) {
            double s = 0;
            for (int k = 0; k < 3; ++k) s += A[3 * k + i] * inv[3 * k + j];
            R[3 * i + j] = s;
        }
    /* the antisymmetric part's size is sin(angle) */
    const double wx = R[7] - R[5], wy = R[2] - R[6], wz = R[3] - R[1];
    return asin(fmin(1, 0.5 * sqrt(wx * wx + wy * wy + wz * wz))) * 180 / M_PI;
}

/* The frames at the static start (orientation offsets 0). */
static void start_frames(nbg_experiment *fr)
{
    for (int f = 0; f < NF; ++f) {
        base(&fr[f]);
        fr[f].phi0 = f * OSC;
    }
}

/* Refines the orientation over the scan with K knots (0: one for all); the per-image errors' rms and largest. */
static int fit(nbg_ctx *ctx, const nbg_experiment *truth, const float *const *obs, int K, nbg_refine_result *res,
               nbg_experiment *fr, double *rms, double *worst)
{
    start_frames(fr);
    nbg_refine_options o;
    nbg_refine_options_default(&o);
    o.scan_varying_knots = K;
    const int rc = nbg_refine_frames(ctx, fr, NF, obs, NULL, (size_t)PIX * PIX, ORI, 3, &o, res);
    double s = 0, w = 0;
    for (int f = 0; rc == NBG_OK && f < NF; ++f) {
        const double d = orient_error(ctx, &fr[f], &truth[f]);
        s += d * d;
        w = fmax(w, d);
    }
    *rms = rc == NBG_OK ? sqrt(s / NF) : INFINITY;
    *worst = rc == NBG_OK ? w : INFINITY;
    return rc;
}

int main(void)
{
    nbg_ctx *ctx = NULL, *ctx2 = NULL;
    if (nbg_ctx_create(&ctx, NBG_BACKEND_CPU, NBG_DOUBLE, 1) != NBG_OK ||
        nbg_ctx_create(&ctx2, NBG_BACKEND_CPU, NBG_DOUBLE, 2) != NBG_OK) {
        nbgi_test_check(0, "sv-ctx", "cannot create the contexts");
        return nbgi_test_summary();
    }
    const size_t npix = (size_t)PIX * PIX;

    /* the knot weights: linear between neighbours, summing to 1, exact at the knots, clamped outside */
    {
        double w[5], sum, bad = 0;
        for (int i = 0; i <= 40; ++i) {
            const double t = i / 40.0;
            nbg_scan_knot_weights(t, 5, w);
            sum = 0;
            double pos = 0;
            for (int k = 0; k < 5; ++k) {
                sum += w[k];
                pos += w[k] * k / 4.0;
                bad = fmax(bad, w[k] < 0 ? 1 : 0);
            }
            bad = fmax(bad, fmax(fabs(sum - 1), fabs(pos - t)));
        }
        nbg_scan_knot_weights(2.5, 5, w);
        const int clamped = w[4] == 1 && w[3] == 0;
        nbg_scan_knot_weights(0.5, 5, w);
        const int at_knot = w[2] == 1 && w[1] == 0 && w[3] == 0;
        nbgi_test_check(bad < 1e-15 && clamped && at_knot, "sv-weights", "knot weights sum to 1 and interpolate the "
                        "position to %.2g; clamped past the end; exact at a knot", bad);
    }

    /* the truth: frame f's crystal turned by the wobble at its middle */
    nbg_experiment truth[NF];
    float *obsbuf = malloc(sizeof(float) * npix * NF);
    const float *obs[NF];
    int rc = obsbuf == NULL ? NBG_ENOMEM : NBG_OK;
    double photons = 0;
    for (int f = 0; rc == NBG_OK && f < NF; ++f) {
        base(&truth[f]);
        truth[f].phi0 = f * OSC;
        wobble((f + 0.5) / NF, truth[f].orient);
        rc = nbg_simulate(ctx, &truth[f], obsbuf + (size_t)f * npix, npix, NULL);
        obs[f] = obsbuf + (size_t)f * npix;
        for (size_t i = 0; rc == NBG_OK && i < npix; ++i) photons += obs[f][i];
    }
    nbgi_test_check(rc == NBG_OK && photons > 0, "sv-data", "%d frames of %g deg rendered, each with its own "
                    "orientation (%.4g photons)", NF, OSC, photons);
    if (rc != NBG_OK) {
        free(obsbuf);
        nbg_ctx_destroy(ctx);
        nbg_ctx_destroy(ctx2);
        return nbgi_test_summary();
    }

    /* static against scan-varying, from the static start */
    nbg_experiment fs[NF], fv[NF];
    nbg_refine_result rs = {0}, rv = {0};
    double rms_s, worst_s, rms_v, worst_v, rms_0 = 0;
    start_frames(fs);
    for (int f = 0; f < NF; ++f) {
        const double d = orient_error(ctx, &fs[f], &truth[f]);
        rms_0 += d * d;
    }
    rms_0 = sqrt(rms_0 / NF);
    const int K = 5;
    const int rcs = fit(ctx, truth, obs, 0, &rs, fs, &rms_s, &worst_s);
    const int rcv = fit(ctx, truth, obs, K, &rv, fv, &rms_v, &worst_v);
    printf("per-image orientation error (deg, rms / largest): start %.4g; static fit %.4g / %.4g; scan-varying "
           "(%d knots) %.4g / %.4g\n", rms_0, rms_s, worst_s, K, rms_v, worst_v);
    nbgi_test_check(rcs == NBG_OK && rcv == NBG_OK && rv.converged && rms_v * 5 < rms_s && worst_v * 5 < worst_s,
                    "sv-refine", "the per-image orientation error: static fit %.4g deg rms (largest %.4g), "
                    "scan-varying with %d knots %.4g rms (largest %.4g): %.1f times smaller (start %.4g; %s)",
                    rms_s, worst_s, K, rms_v, worst_v, rms_v > 0 ? rms_s / rms_v : INFINITY, rms_0,
                    rcv == NBG_OK ? rv.why : nbg_errmsg(ctx));

    /* the result: the three parameters (knot 0), then knots 1..K-1 of each; each frame holds its knots'
     * interpolation at its middle angle */
    int layout = rcv == NBG_OK && rv.nparams == 3 * K && rv.nknots == K && rv.knot != NULL && rv.knot_phi != NULL;
    for (int j = 0; layout && j < rv.nparams; ++j) {
        const int want_knot = j < 3 ? 0 : 1 + (j - 3) % (K - 1), want_p = j < 3 ? j : (j - 3) / (K - 1);
        layout = rv.knot[j] == want_knot && rv.params[j] == ORI[want_p] && isfinite(rv.sigma[j]) && rv.sigma[j] > 0;
    }
    double interp = 0;
    for (int f = 0; layout && f < NF; ++f) {
        double w[5];
        nbg_scan_knot_weights((f + 0.5) / NF, K, w);
        for (int p = 0; p < 3; ++p) {
            double v = 0;
            for (int k = 0; k < K; ++k) v += w[k] * rv.value[k == 0 ? p : 3 + p * (K - 1) + k - 1];
            interp = fmax(interp, fabs(v - fv[f].orient[p]));
        }
    }
    nbgi_test_check(layout && interp < 1e-12 && fabs(rv.knot_phi[0]) < 1e-12 &&
                        fabs(rv.knot_phi[K - 1] - NF * OSC) < 1e-12,
                    "sv-result", "%d entries with their knots and standard errors, knots from phi %g to %g deg; each "
                    "frame's orientation is its knots' interpolation to %.2g deg", rv.nparams,
                    layout ? rv.knot_phi[0] : NAN, layout ? rv.knot_phi[K - 1] : NAN, interp);
    if (layout) {
        for (int p = 0; p < 3; ++p) {
            printf("  %s knots:", nbg_param_name(ORI[p]));
            for (int k = 0; k < K; ++k) {
                const int j = k == 0 ? p : 3 + p * (K - 1) + k - 1;
                double tw[3];
                wobble(rv.knot_phi[k] / (NF * OSC), tw);
                printf(" %.4f+-%.1g (true %.4f)", rv.value[j], rv.sigma[j], tw[p]);
            }
            printf("\n");
        }
    }

    /* a scan-varying cell (scan_varying_cell): the truth's cell grows through the scan (a by 0.5 %, c by 0.4 %, beta
     * by 0.1 deg, as a crystal warming) besides its wobble; the cell (6 parameters, P 1) and the orientation fitted
     * with one cell for the scan and with the cell's knots too: each frame's cell error 5x smaller with them, and
     * the tied parameters of a constrained cell follow their leader frame by frame */
    {
        nbg_experiment tc[NF], f1[NF], f2[NF];
        float *ob2 = malloc(sizeof(float) * npix * NF);
        const float *o2[NF];
        int rc2 = ob2 == NULL ? NBG_ENOMEM : NBG_OK;
        for (int f = 0; rc2 == NBG_OK && f < NF; ++f) {
            const double t = (f + 0.5) / NF;
            base(&tc[f]);
            tc[f].phi0 = f * OSC;
            wobble(t, tc[f].orient);
            tc[f].cell[0] = 70 * (1 + 0.005 * t);
            tc[f].cell[2] = 90 * (1 + 0.004 * t);
            tc[f].cell[4] = 85 + 0.1 * t;
            rc2 = nbg_simulate(ctx, &tc[f], ob2 + (size_t)f * npix, npix, NULL);
            o2[f] = ob2 + (size_t)f * npix;
        }
        const nbg_param cp[9] = {NBG_P_ORIENT_X, NBG_P_ORIENT_Y, NBG_P_ORIENT_Z, NBG_P_A,    NBG_P_B,
                                 NBG_P_C,        NBG_P_ALPHA,    NBG_P_BETA,     NBG_P_GAMMA};
        double err[2] = {INFINITY, INFINITY}, oerr[2] = {INFINITY, INFINITY};
        int nent[2] = {0, 0}, conv = 1;
        for (int v = 0; v < 2 && rc2 == NBG_OK; ++v) {
            nbg_experiment *fr = v ? f2 : f1;
            nbg_refine_result r = {0};
            nbg_refine_options o;
            nbg_refine_options_default(&o);
            o.scan_varying_knots = K;
            o.scan_varying_cell = v;
            start_frames(fr);
            rc2 = nbg_refine_frames(ctx, fr, NF, o2, NULL, npix, cp, 9, &o, &r);
            double e = 0, oe = 0;
            for (int f = 0; rc2 == NBG_OK && f < NF; ++f) {
                for (int i = 0; i < 6; ++i) {
                    e = fmax(e, fabs(fr[f].cell[i] - tc[f].cell[i]) / (i < 3 ? tc[f].cell[i] : 1));
                }
                oe = fmax(oe, orient_error(ctx, &fr[f], &tc[f]));
            }
            err[v] = e, oerr[v] = oe, nent[v] = r.nparams;
            conv &= rc2 == NBG_OK && r.converged;
            nbg_refine_result_free(&r);
        }
        printf("scan-varying cell: largest per-image cell error (relative for lengths, deg for angles) one cell %.3g, "
               "varying %.3g; orientation %.3g / %.3g deg\n", err[0], err[1], oerr[0], oerr[1]);
        nbgi_test_check(rc2 == NBG_OK && conv && nent[0] == 9 + 3 * (K - 1) && nent[1] == 9 * K &&
                            err[1] * 5 < err[0] && oerr[1] < 0.01,
                        "sv-cell", "a cell growing through the scan: per-image cell error %.3g with one cell, %.3g "
                        "with its knots (%d and %d entries); orientation %.3g deg (%s)", err[0], err[1], nent[0],
                        nent[1], oerr[1], rc2 == NBG_OK ? "ok" : nbg_errmsg(ctx));
        /* a tetragonal cell (P 4): a and c fitted with knots, b follows a in every frame, the angles held */
        for (int f = 0; f < NF; ++f) {
            f2[f] = tc[f];
            f2[f].cell[1] = f2[f].cell[0] = 70;
            f2[f].cell[3] = f2[f].cell[4] = f2[f].cell[5] = 90;
            f2[f].cell[2] = 90;
            snprintf(f2[f].space_group, sizeof f2[f].space_group, "P 4");
        }
        int tied_ok = 0;
        nbg_refine_result r = {0};
        if (rc2 == NBG_OK) {
            for (int f = 0; f < NF; ++f) { /* the truth: a tetragonal cell growing */
                f1[f] = f2[f];
                f1[f].cell[0] = f1[f].cell[1] = 70 * (1 + 0.005 * (f + 0.5) / NF);
                f1[f].cell[2] = 90 * (1 + 0.004 * (f + 0.5) / NF);
                rc2 = nbg_simulate(ctx, &f1[f], ob2 + (size_t)f * npix, npix, NULL);
            }
            nbg_refine_options o;
            nbg_refine_options_default(&o);
            o.scan_varying_knots = K;
            o.scan_varying_cell = 1;
            if (rc2 == NBG_OK) rc2 = nbg_refine_frames(ctx, f2, NF, o2, NULL, npix, cp, 9, &o, &r);
            double e = 0;
            tied_ok = rc2 == NBG_OK;
            for (int f = 0; rc2 == NBG_OK && f < NF; ++f) {
                tied_ok &= f2[f].cell[1] == f2[f].cell[0] && f2[f].cell[3] == 90 && f2[f].cell[5] == 90;
                e = fmax(e, fmax(fabs(f2[f].cell[0] / f1[f].cell[0] - 1), fabs(f2[f].cell[2] / f1[f].cell[2] - 1)));
            }
            tied_ok &= e < 2e-4 && f2[0].cell[0] != f2[NF - 1].cell[0];
            nbgi_test_check(tied_ok, "sv-cell-tied", "P 4, a growing: b = a in every frame, angles held, largest "
                            "per-image length error %.2g (%s)", e, rc2 == NBG_OK ? r.constraint : nbg_errmsg(ctx));
        }
        nbg_refine_result_free(&r);
        free(ob2);
    }

    /* a mixed list: a cell length between the orientation parameters (knots after the list, in its order), orient_y
     * held: the cell comes back, and the two varying offsets with it */
    {
        nbg_experiment fm[NF];
        nbg_refine_result rm = {0};
        start_frames(fm);
        for (int f = 0; f < NF; ++f) {
            fm[f].cell[0] = 70.2;
            fm[f].orient[1] = truth[f].orient[1]; /* held at the truth */
        }
        const nbg_param mixed[3] = {NBG_P_ORIENT_Z, NBG_P_A, NBG_P_ORIENT_X};
        nbg_refine_options o;
        nbg_refine_options_default(&o);
        o.scan_varying_knots = K;
        const int rcm = nbg_refine_frames(ctx, fm, NF, obs, NULL, npix, mixed, 3, &o, &rm);
        int lay = rcm == NBG_OK && rm.nparams == 3 + 2 * (K - 1) && rm.knot[0] == 0 && rm.knot[1] == -1 &&
                  rm.knot[2] == 0;
        for (int j = 3; lay && j < rm.nparams; ++j) {
            lay = rm.params[j] == (j < 3 + K - 1 ? NBG_P_ORIENT_Z : NBG_P_ORIENT_X) && rm.knot[j] == 1 + (j - 3) % (K - 1);
        }
        double worst = 0;
        for (int f = 0; lay && f < NF; ++f) worst = fmax(worst, orient_error(ctx, &fm[f], &truth[f]));
        nbgi_test_check(lay && fabs(rm.value[1] - 70) < 1e-3 && worst < 0.01, "sv-mixed",
                        "orient_z, a, orient_x with knots: %d entries in order, a = %.5f (truth 70, start 70.2), "
                        "largest per-image orientation error %.2g deg (%s)", rm.nparams, rcm == NBG_OK ? rm.value[1]
                        : NAN, worst, rcm == NBG_OK ? rm.why : nbg_errmsg(ctx));
        nbg_refine_result_free(&rm);
    }

    /* the same bits for 2 threads */
    {
        nbg_experiment f2[NF];
        nbg_refine_result r2 = {0};
        start_frames(f2);
        nbg_refine_options o;
        nbg_refine_options_default(&o);
        o.scan_varying_knots = K;
        const int rc2 = nbg_refine_frames(ctx2, f2, NF, obs, NULL, npix, ORI, 3, &o, &r2);
        int same = rc2 == NBG_OK && rcv == NBG_OK && r2.nparams == rv.nparams && r2.iterations == rv.iterations &&
                   memcmp(&r2.loss, &rv.loss, sizeof(double)) == 0;
        for (int j = 0; same && j < rv.nparams; ++j) {
            same = memcmp(&r2.value[j], &rv.value[j], sizeof(double)) == 0 &&
                   memcmp(&r2.sigma[j], &rv.sigma[j], sizeof(double)) == 0;
        }
        for (int f = 0; same && f < NF; ++f) same = memcmp(f2[f].orient, fv[f].orient, sizeof fv[f].orient) == 0;
        nbgi_test_check(same, "sv-threads", "1 and 2 threads: the same fit bit for bit (%d iterations, loss %.17g)",
                        r2.iterations, r2.loss);
        nbg_refine_result_free(&r2);
    }

    /* BFGS finds the same knots */
    {
        nbg_experiment fb[NF];
        nbg_refine_result rb = {0};
        start_frames(fb);
        nbg_refine_options o;
        nbg_refine_options_default(&o);
        o.scan_varying_knots = K;
        o.method = NBG_OPT_BFGS;
        const int rcb = nbg_refine_frames(ctx, fb, NF, obs, NULL, npix, ORI, 3, &o, &rb);
        double d = rcb == NBG_OK && rcv == NBG_OK && rb.nparams == rv.nparams ? 0 : INFINITY;
        for (int j = 0; d < INFINITY && j < rb.nparams; ++j) d = fmax(d, fabs(rb.value[j] - rv.value[j]));
        nbgi_test_check(d < 2e-3, "sv-bfgs", "BFGS's knots agree with Levenberg-Marquardt's to %.2g deg (%s)", d,
                        rcb == NBG_OK ? rb.why : nbg_errmsg(ctx));
        nbg_refine_result_free(&rb);
    }

    /* the knots' gradient (the Gauss-Newton pass's and the adjoint's) against central differences of the summed
     * loss, Richardson-extrapolated from steps h and h/2; at a point off the optimum */
    {
        const int n = 3 * K;
        double x[3 * 5], out[2 + 2 * 3 * 5], xp[3 * 5], o1[2 + 2 * 3 * 5];
        for (int j = 0; j < n; ++j) x[j] = 0.03 * sin(1.7 * j + 0.4);
        nbg_refine_options o;
        nbg_refine_options_default(&o);
        o.scan_varying_knots = K;
        nbg_experiment fe[NF];
        start_frames(fe);
        int ok = nbgi_debug_refine_eval(ctx, fe, NF, obs, npix, ORI, 3, &o, x, out) == NBG_OK;
        double worst_gn = 0, worst_adj = 0, gmax = 0;
        const double h = getenv("SVH") ? atof(getenv("SVH")) : 4e-2;
        for (int j = 0; ok && j < n; ++j) {
            double L[4];
            const double steps[4] = {h, -h, h / 2, -h / 2};
            for (int s = 0; ok && s < 4; ++s) {
                memcpy(xp, x, sizeof(double) * (size_t)n);
                xp[j] += steps[s];
                start_frames(fe);
                ok = nbgi_debug_refine_eval(ctx, fe, NF, obs, npix, ORI, 3, &o, xp, o1) == NBG_OK;
                L[s] = o1[0];
            }
            const double d1 = (L[0] - L[1]) / (2 * h), d2 = (L[2] - L[3]) / h, num = (4 * d2 - d1) / 3;
            const double gn = out[1 + j], adj = out[2 + n + j];
            gmax = fmax(gmax, fabs(num));
            worst_gn = fmax(worst_gn, fabs(gn - num) / fmax(fabs(num), 1e-300));
            worst_adj = fmax(worst_adj, fabs(adj - num) / fmax(fabs(num), 1e-300));
            if (j % (K - 1) == 0 || j < 3) {
                printf("  d L / d x[%d] (%s knot %d): numeric %.10g, Gauss-Newton %.10g, adjoint %.10g\n", j,
                       nbg_param_name(ORI[j < 3 ? j : (j - 3) / (K - 1)]), j < 3 ? 0 : 1 + (j - 3) % (K - 1), num, gn,
                       adj);
            }
        }
        /* the model images are floats: the summed loss carries their rounding (about 1e-3 of 5e4 here), which
         * steps of 0.04 deg keep below 1e-6 of the gradients (at 0.005 deg the differences' error is 1e-5) */
        nbgi_test_check(ok && gmax > 0 && worst_gn < 3e-6 && worst_adj < 3e-6 && fabs(out[0] - out[1 + n]) <=
                        1e-12 * fabs(out[0]), "sv-gradcheck", "%d knot gradients against central differences of the "
                        "summed loss (steps %g and %g deg, Richardson): largest relative error %.2g (Gauss-Newton "
                        "pass), %.2g (adjoint); the two passes' losses %.17g and %.17g", n, h, h / 2, worst_gn,
                        worst_adj, out[0], out[1 + n]);
        /* the chain rule exactly: knot k's gradient is sum_f w[f][k] dL_f/d(orientation) of each frame rendered
         * alone at its knots' interpolation (nbg_loss_grad) */
        double G[3 * 5] = {0}, Lsum = 0;
        float *img = malloc(sizeof(float) * npix);
        ok = ok && img != NULL;
        for (int f = 0; ok && f < NF; ++f) {
            double w[5], gf[3], Lf;
            nbg_scan_knot_weights((f + 0.5) / NF, K, w);
            nbg_experiment e;
            base(&e);
            e.phi0 = f * OSC;
            for (int p = 0; p < 3; ++p) {
                e.orient[p] = 0;
                for (int k = 0; k < K; ++k) e.orient[p] += w[k] * x[k == 0 ? p : 3 + p * (K - 1) + k - 1];
            }
            ok = nbg_loss_grad(ctx, &e, NBG_LOSS_LSQ, obs[f], NULL, ORI, 3, &Lf, gf, img, npix) == NBG_OK;
            Lsum += Lf;
            for (int p = 0; ok && p < 3; ++p)
                for (int k = 0; k < K; ++k) G[k == 0 ? p : 3 + p * (K - 1) + k - 1] += w[k] * gf[p];
        }
        free(img);
        double eg = 0, ea = 0;
        for (int j = 0; ok && j < n; ++j) {
            eg = fmax(eg, fabs(out[1 + j] - G[j]) / fabs(G[j]));
            ea = fmax(ea, fabs(out[2 + n + j] - G[j]) / fabs(G[j]));
        }
        nbgi_test_check(ok && eg < 1e-9 && ea < 1e-12 && fabs(Lsum - out[0]) <= 1e-12 * fabs(Lsum), "sv-chain",
                        "the knots' gradient is the frames' orientation gradients weighted by the knot weights: "
                        "relative difference %.2g (Gauss-Newton pass), %.2g (adjoint)", eg, ea);
    }

    /* refused: one frame, no orientation parameter, one knot, more knots than frames, frames all at one angle */
    {
        nbg_experiment fe[NF];
        nbg_refine_result r = {0};
        nbg_refine_options o;
        nbg_refine_options_default(&o);
        struct {
            const char *id, *needle;
            int nf, K, nparams, same_angle;
            const nbg_param *p;
        } cases[] = {{"sv-refuse-one-frame", "several frames", 1, 2, 3, 0, ORI},
                     {"sv-refuse-no-orientation", "orientation parameter", NF, 3, 0, 0, NULL},
                     {"sv-refuse-one-knot", "2 to", NF, 1, 3, 0, ORI},
                     {"sv-refuse-too-many-knots", "at most one knot a frame", NF, NF + 1, 3, 0, ORI},
                     {"sv-refuse-stills", "rotation range", NF, 3, 3, 1, ORI}};
        const nbg_param cellp[1] = {NBG_P_A};
        for (size_t c = 0; c < sizeof cases / sizeof cases[0]; ++c) {
            start_frames(fe);
            for (int f = 0; cases[c].same_angle && f < NF; ++f) {
                fe[f].phi0 = 0;
                fe[f].osc = 0;
            }
            o.scan_varying_knots = cases[c].K;
            const nbg_param *p = cases[c].p != NULL ? cases[c].p : cellp;
            const int nprm = cases[c].p != NULL ? cases[c].nparams : 1;
            const double before = fe[0].orient[0];
            rc = nbg_refine_frames(ctx, fe, cases[c].nf, obs, NULL, npix, p, nprm, &o, &r);
            nbgi_test_check(rc == NBG_EINVAL && strstr(nbg_errmsg(ctx), cases[c].needle) != NULL &&
                                fe[0].orient[0] == before,
                            cases[c].id, "%s", nbg_errmsg(ctx));
        }
        nbg_refine_result_free(&r);
    }

    nbg_refine_result_free(&rs);
    nbg_refine_result_free(&rv);
    free(obsbuf);
    nbg_ctx_destroy(ctx);
    nbg_ctx_destroy(ctx2);
    return nbgi_test_summary();
}
