/*
 * test-response.c -- a detector response per panel (nbg_panel.own_response: pedestal, gain and read noise of each
 * module) on a detector of two panels whose responses differ.
 *
 *   resp-same-<loss>        every panel's own response equal to the experiment's: loss and gradient bit for bit
 *                           those without per-panel responses (the losses' path unchanged)
 *   resp-direct-lsq         the least-squares loss equals sum (M - (obs - ped_q) / gain_q)^2 over the pixels, each
 *                           through its panel's response, computed here
 *   resp-split-<loss>       the loss and gradient (least squares; Poisson with per-panel read noise) equal the sum of
 *                           two single-response evaluations, each with its panel's response and the other panel
 *                           weighted 0
 *   resp-fd-<param>         the loss's gradient against central differences of the loss (Poisson, per-panel
 *                           responses with read noise; to 2e-3: the model image is float)
 *   resp-refine             nbg_refine from a turned crystal on counts with per-panel pedestal and gain recovers the
 *                           truth to 1e-5 deg; with one response for the whole detector (wrong on panel 1) it does not
 *   resp-bad                a panel's own gain 0 is refused naming the panel
 *   resp-cli-*              nbgrad refine -panel_pedestal, -panel_gain on a two-panel list: the fit recovers the truth;
 *                           a list of the wrong length, per-panel values on the single flat detector: refused
 *   resp-lib-*              the library's way (nbg_observed_options' panel lists, nbg_observed.panel_response,
 *                           nbg_observed_apply_response): values, the count and a bad value refused, the wrong array
 *   resp-cli-ensemble*      nbgrad ensemble takes the same flags: one shot's orientation recovered through the
 *                           panels' responses (not through one response for both); a list of the wrong length refused
 *   resp-trusted-*          DIALS's trusted_range: read per panel from a list, pixels outside (lo, hi) left out by
 *                           nbg_observed_read (and by refine -expt); the options' range where a panel has none
 */
#include "testutil.h" /* first: it sets _GNU_SOURCE */
#include "nbgrad.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#define NP0 (40 * 32)
#define NPIX ((size_t)(40 * 32 + 24 * 32))

/* nbgi_test_two_panels (testutil.h) with a floor, so that Poisson sees photons everywhere. */
static void two_panels(nbg_experiment *e, nbg_panel pan[2])
{
    nbgi_test_two_panels(e, pan);
    e->bg[0] = 0.5;
}

static const nbg_detector_model R0 = {40, 2, 3}, R1 = {10, 0.5, 1};

/* Counts of the model image M through each panel's response, times a factor that varies (so that the loss is not
 * zero). */
static void counts(const float *M, float *obs)
{
    for (size_t i = 0; i < NPIX; ++i) {
        const nbg_detector_model *r = i < NP0 ? &R0 : &R1;
        const double f = 0.9 + 0.2 * (double)((i * 7919) % 101) / 100.0;
        obs[i] = (float)(r->gain * M[i] * f + r->pedestal);
    }
}

static const nbg_param PP[4] = {NBG_P_A, NBG_P_ROTX, NBG_P_DISTANCE, NBG_P_SCALE};

#ifndef NBG_NO_REFINE
static char g_out[65536];

static int run(const char *cmd)
{
    FILE *p = popen(cmd, "r");
    if (p == NULL) {
        return -1;
    }
    const size_t n = fread(g_out, 1, sizeof g_out - 1, p);
    g_out[n] = '\0';
    const int st = pclose(p);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}
#endif

int main(void)
{
    nbg_ctx *ctx = NULL;
    if (nbg_ctx_create(&ctx, NBG_BACKEND_CPU, NBG_DOUBLE, 0) != NBG_OK) {
        printf("FAIL resp-ctx cannot create a context\n0 passed, 1 failed\n");
        return 1;
    }
    nbg_experiment e;
    nbg_panel pan[2];
    two_panels(&e, pan);
    float *M = malloc(sizeof(float) * NPIX), *obs = malloc(sizeof(float) * NPIX), *img = malloc(sizeof(float) * NPIX);
    float *w0 = malloc(sizeof(float) * NPIX), *w1 = malloc(sizeof(float) * NPIX);
    int rc = nbg_simulate(ctx, &e, M, NPIX, NULL);
    counts(M, obs);
    for (size_t i = 0; i < NPIX; ++i) {
        w0[i] = i < NP0, w1[i] = i >= NP0;
    }

    /* resp-same: own responses equal to the experiment's change nothing */
    for (int loss = 0; loss < 2; ++loss) {
        nbg_experiment a = e;
        a.response = R0;
        double La, Lb, ga[4], gb[4];
        int r1 = nbg_loss_grad(ctx, &a, (nbg_loss)loss, obs, NULL, PP, 4, &La, ga, img, NPIX);
        nbg_panel p2[2] = {pan[0], pan[1]};
        p2[0].own_response = p2[1].own_response = 1;
        p2[0].response = p2[1].response = R0;
        a.panels = p2;
        int r2 = nbg_loss_grad(ctx, &a, (nbg_loss)loss, obs, NULL, PP, 4, &Lb, gb, img, NPIX);
        char id[64];
        snprintf(id, sizeof id, "resp-same-%s", loss ? "poisson" : "lsq");
        nbgi_test_check(rc == NBG_OK && r1 == NBG_OK && r2 == NBG_OK && La == Lb && memcmp(ga, gb, sizeof ga) == 0, id,
                        "loss %.17g and %.17g, gradients %s", La, Lb, memcmp(ga, gb, sizeof ga) == 0 ? "equal" : "differ");
    }

    nbg_experiment p = e;
    nbg_panel pr[2] = {pan[0], pan[1]};
    pr[0].own_response = pr[1].own_response = 1;
    pr[0].response = R0;
    pr[1].response = R1;
    p.panels = pr;
    p.response = (nbg_detector_model){1000, 7, 0}; /* the experiment's: used by no pixel */

    /* resp-direct-lsq */
    {
        double L = NAN, direct = 0;
        rc = nbg_loss_grad(ctx, &p, NBG_LOSS_LSQ, obs, NULL, NULL, 0, &L, NULL, img, NPIX);
        for (size_t i = 0; i < NPIX; ++i) {
            const nbg_detector_model *r = i < NP0 ? &R0 : &R1;
            const double d = img[i] - (obs[i] - r->pedestal) / r->gain;
            direct += d * d;
        }
        nbgi_test_rel(rc == NBG_OK ? L : NAN, direct, 1e-12, "resp-direct-lsq",
                      "least squares through each pixel's panel's response: %.12g, computed here %.12g", L, direct);
    }

    /* resp-split: the sum of two single-response evaluations, the other panel weighted 0 */
    for (int loss = 0; loss < 2; ++loss) {
        nbg_experiment q = p;
        nbg_panel pq[2] = {pr[0], pr[1]};
        if (loss == 1) {
            pq[0].response.read_noise = 3, pq[1].response.read_noise = 1;
        }
        q.panels = pq;
        double L = NAN, g[4], L0, g0[4], L1, g1[4];
        int r0 = nbg_loss_grad(ctx, &q, (nbg_loss)loss, obs, NULL, PP, 4, &L, g, img, NPIX);
        nbg_experiment s = e;
        s.response = pq[0].response;
        int ra = nbg_loss_grad(ctx, &s, (nbg_loss)loss, obs, w0, PP, 4, &L0, g0, img, NPIX);
        s.response = pq[1].response;
        int rb = nbg_loss_grad(ctx, &s, (nbg_loss)loss, obs, w1, PP, 4, &L1, g1, img, NPIX);
        double worst = fabs(L - (L0 + L1)) / fabs(L);
        for (int j = 0; j < 4; ++j) {
            worst = fmax(worst, fabs(g[j] - (g0[j] + g1[j])) / fmax(fabs(g[j]), 1e-300));
        }
        char id[64];
        snprintf(id, sizeof id, "resp-split-%s", loss ? "poisson-readnoise" : "lsq");
        nbgi_test_check(r0 == NBG_OK && ra == NBG_OK && rb == NBG_OK && worst < 1e-9, id,
                        "loss %.10g = %.10g + %.10g; loss and gradients (a, rotx, distance, scale) agree to %.2g", L,
                        L0, L1, worst);
    }

    /* resp-fd: the gradient against central differences of the loss, per-panel responses (Poisson, read noise) */
    {
        nbg_experiment q = p;
        nbg_panel pq[2] = {pr[0], pr[1]};
        pq[0].response.read_noise = 3, pq[1].response.read_noise = 1;
        q.panels = pq;
        double L, g[4];
        nbg_loss_grad(ctx, &q, NBG_LOSS_POISSON, obs, NULL, PP, 4, &L, g, img, NPIX);
        const double h[4] = {1e-3, 1e-3, 1e-3, 1e-3};
        for (int j = 0; j < 4; ++j) {
            double v, Lp, Lm;
            nbg_experiment x = q;
            nbg_param_get(&x, PP[j], &v);
            nbg_param_set(&x, PP[j], v + h[j]);
            nbg_loss_grad(ctx, &x, NBG_LOSS_POISSON, obs, NULL, NULL, 0, &Lp, NULL, img, NPIX);
            nbg_param_set(&x, PP[j], v - h[j]);
            nbg_loss_grad(ctx, &x, NBG_LOSS_POISSON, obs, NULL, NULL, 0, &Lm, NULL, img, NPIX);
            const double fd = (Lp - Lm) / (2 * h[j]);
            char id[64];
            snprintf(id, sizeof id, "resp-fd-%s", nbg_param_name(PP[j]));
            nbgi_test_check(fabs(fd - g[j]) <= 2e-3 * fabs(g[j]), id,
                            "adjoint %.8g, central difference %.8g", g[j], fd);
        }
    }

#ifndef NBG_NO_REFINE
    /* resp-refine: counts through per-panel responses of the crystal turned by 0.1 deg about z */
    {
        nbg_experiment t = p;
        t.orient[2] = 0.1;
        float *tc = malloc(sizeof(float) * NPIX);
        nbg_simulate(ctx, &t, img, NPIX, NULL);
        for (size_t i = 0; i < NPIX; ++i) {
            const nbg_detector_model *r = i < NP0 ? &R0 : &R1;
            tc[i] = (float)(r->gain * img[i] + r->pedestal);
        }
        const nbg_param oz = NBG_P_ORIENT_Z;
        double got[2];
        int conv[2];
        for (int k = 0; k < 2; ++k) {
            nbg_experiment s = k == 0 ? p : e;
            if (k == 1) {
                s.response = R0; /* one response: panel 0's, wrong on panel 1 */
            }
            nbg_refine_options o;
            nbg_refine_options_default(&o);
            nbg_refine_result r = {0};
            rc = nbg_refine(ctx, &s, tc, NULL, NPIX, &oz, 1, &o, &r);
            got[k] = rc == NBG_OK ? r.value[0] : NAN;
            conv[k] = rc == NBG_OK && r.converged;
            nbg_refine_result_free(&r);
        }
        nbgi_test_check(conv[0] && fabs(got[0] - 0.1) < 1e-5 && !(fabs(got[1] - 0.1) < 1e-5), "resp-refine",
                        "orient_z from 0: %.7f deg through the panels' responses (truth 0.1, converged %d); %.7f "
                        "through one response for both", got[0], conv[0], got[1]);
        free(tc);
    }
#endif

    /* resp-bad */
    {
        nbg_experiment q = p;
        nbg_panel pq[2] = {pr[0], pr[1]};
        pq[1].response.gain = 0;
        q.panels = pq;
        double L;
        rc = nbg_loss_grad(ctx, &q, NBG_LOSS_LSQ, obs, NULL, NULL, 0, &L, NULL, img, NPIX);
        nbgi_test_check(rc == NBG_EINVAL && strstr(nbg_errmsg(ctx), "panel 1") != NULL &&
                            strstr(nbg_errmsg(ctx), "gain") != NULL,
                        "resp-bad", "%s", nbg_errmsg(ctx));
    }

#if defined(NBG_HAVE_FORMATS) && !defined(NBG_NO_REFINE)
    /* resp-cli: the same fit through the program, from a two-panel experiment list */
    char dir[256];
    if (nbgi_test_mkdtemp("nbg-resp", dir, sizeof dir) != NULL) {
        const char *bin = getenv("NBG_BIN") != NULL ? getenv("NBG_BIN") : "build/nbgrad";
        char ex[512], ob[512], cmd[4096];
        snprintf(ex, sizeof ex, "%s/two.expt", dir);
        snprintf(ob, sizeof ob, "%s/obs.bin", dir);
        nbg_report rep;
        nbg_geometry g;
        nbg_panel lab[2];
        rc = nbgi_test_write_panel_list(ctx, &e, ex, NULL, &rep, &g, lab);
        nbg_geometry g2;
        nbg_panel *back = NULL;
        int np = 0;
        nbg_experiment t;
        nbg_experiment_default(&t);
        rc = rc == NBG_OK ? nbg_read_expt_panels(ctx, ex, &g2, &back, &np) : rc;
        rc = rc == NBG_OK ? nbg_experiment_from_geometry(ctx, &g2, &t) : rc;
        if (rc == NBG_OK) {
            t.panels = back, t.npanels = np, t.panel_frame = NBG_PANELS_LAB;
            t.default_F = 100, t.Na = t.Nb = t.Nc = 5, t.oversample = 1, t.bg[0] = 0;
            t.orient[2] = 0.1;
            rc = nbg_simulate(ctx, &t, img, NPIX, NULL);
        }
        for (size_t i = 0; i < NPIX; ++i) {
            const nbg_detector_model *r = i < NP0 ? &R0 : &R1;
            obs[i] = (float)(r->gain * img[i] + r->pedestal);
        }
        FILE *f = fopen(ob, "wb");
        int wrote = f != NULL && fwrite(obs, sizeof(float), NPIX, f) == NPIX;
        if (f != NULL) wrote = fclose(f) == 0 && wrote;
        snprintf(cmd, sizeof cmd, "%s refine -expt %s -default_F 100 -N 5 -oversample 1 -observed %s "
                 "-params orient_z -panel_pedestal 40,10 -panel_gain 2,0.5 2>&1", bin, ex, ob);
        const int st = rc == NBG_OK && wrote ? run(cmd) : -1;
        const char *oz = strstr(g_out, "\norient_z");
        double start = NAN, fit = NAN;
        if (oz == NULL || sscanf(oz + 9, "%lf %lf", &start, &fit) != 2) fit = NAN;
        nbgi_test_check(st == 0 && strstr(g_out, "the panels' own detector response") != NULL &&
                            strstr(g_out, "converged") != NULL && fabs(fit - 0.1) < 1e-5,
                        "resp-cli-refine", "refine -panel_pedestal 40,10 -panel_gain 2,0.5: orient_z %.7f (truth 0.1; "
                        "exit %d)", fit, st);
        if (!(st == 0 && fabs(fit - 0.1) < 1e-5)) fputs(g_out, stdout);
        snprintf(cmd, sizeof cmd, "%s refine -expt %s -default_F 100 -N 5 -oversample 1 -observed %s "
                 "-params orient_z -panel_gain 2,0.5,1 2>&1", bin, ex, ob);
        int s2 = run(cmd);
        nbgi_test_check(s2 != 0 && strstr(g_out, "-panel_gain gives 3 values, the detector has 2 panels") != NULL,
                        "resp-cli-count", "a list of 3 for 2 panels is refused (exit %d)", s2);
        snprintf(cmd, sizeof cmd, "%s refine -expt %s -default_F 100 -N 5 -observed %s -params orient_z "
                 "-panel_gain 2,x 2>&1", bin, ex, ob);
        s2 = run(cmd);
        nbgi_test_check(s2 != 0 && strstr(g_out, "not a comma-separated list of positive numbers") != NULL,
                        "resp-cli-syntax", "a malformed list is refused (exit %d)", s2);
        snprintf(cmd, sizeof cmd, "%s refine -cell 70 80 90 75 85 95 -default_F 100 -N 5 -detpixels_f 64 -detpixels_s 32 -observed %s "
                 "-params a -panel_pedestal 40 2>&1", bin, ob);
        s2 = run(cmd);
        nbgi_test_check(s2 != 0 && strstr(g_out, "the single flat detector") != NULL, "resp-cli-flat",
                        "per-panel values on the single flat detector are refused (exit %d)", s2);

        /* resp-lib-*: the per-panel lists through nbg_observed_read's options and nbg_observed_apply_response */
        nbg_experiment te2 = t;
        nbg_panel mine[2];
        memcpy(mine, back, sizeof mine);
        te2.panels = mine;
        const double ped[2] = {40, 10}, gain[2] = {2, 0.5}, rn[2] = {1, 3};
        nbg_observed_options oo2;
        nbg_observed_options_default(&oo2);
        oo2.gain = 7; /* the image's own: what a panel takes where no list is given (read noise here) */
        oo2.panel_pedestal = ped, oo2.panel_gain = gain, oo2.npanel_values = 2;
        nbg_observed ob2;
        rc = nbg_observed_read(ctx, &te2, ob, 0, &oo2, &ob2);
        const int lib_ok = rc == NBG_OK && ob2.panel_response != NULL && ob2.npanel_response == 2 &&
                           ob2.panel_response[0].pedestal == 40 && ob2.panel_response[1].pedestal == 10 &&
                           ob2.panel_response[0].gain == 2 && ob2.panel_response[1].gain == 0.5 &&
                           ob2.panel_response[1].read_noise == 0 && ob2.response.gain == 7;
        nbgi_test_check(lib_ok, "resp-lib-read", "the options' lists give each panel its own response: panel 1 "
                        "pedestal %g, gain %g (%s)", lib_ok ? ob2.panel_response[1].pedestal : NAN,
                        lib_ok ? ob2.panel_response[1].gain : NAN, rc == NBG_OK ? "ok" : nbg_errmsg(ctx));
        rc = rc == NBG_OK ? nbg_observed_apply_response(ctx, &ob2, &te2, mine, 2) : rc;
        nbgi_test_check(rc == NBG_OK && mine[0].own_response && mine[1].own_response &&
                            mine[1].response.gain == 0.5 && mine[0].response.pedestal == 40 && te2.response.gain == 7,
                        "resp-lib-apply", "nbg_observed_apply_response marks both panels with their own (%s)",
                        rc == NBG_OK ? "ok" : nbg_errmsg(ctx));
        nbg_panel other[2];
        memcpy(other, back, sizeof other);
        rc = nbg_observed_apply_response(ctx, &ob2, &te2, other, 2);
        nbgi_test_check(rc == NBG_EINVAL && !other[0].own_response, "resp-lib-apply-wrong-array",
                        "panels other than the experiment's are refused: %s", nbg_errmsg(ctx));
        nbg_observed_free(&ob2);
        oo2.npanel_values = 3;
        rc = nbg_observed_read(ctx, &te2, ob, 0, &oo2, &ob2);
        nbgi_test_check(rc == NBG_EINVAL && strstr(nbg_errmsg(ctx), "the detector has 2 panels") != NULL,
                        "resp-lib-count", "3 values for 2 panels refused: %s", nbg_errmsg(ctx));
        oo2.npanel_values = 2, oo2.panel_read_noise = rn, oo2.panel_gain = ped; /* fine */
        const double badgain[2] = {1, -1};
        oo2.panel_gain = badgain;
        rc = nbg_observed_read(ctx, &te2, ob, 0, &oo2, &ob2);
        nbgi_test_check(rc == NBG_EINVAL && strstr(nbg_errmsg(ctx), "panel 1's gain -1") != NULL, "resp-lib-bad",
                        "a negative gain refused naming the panel: %s", nbg_errmsg(ctx));

        /* resp-cli-ensemble: nbgrad ensemble takes the same flags (one table): one shot, its orientation fitted */
        char shots[512], obs_t[512], odir[512];
        snprintf(shots, sizeof shots, "%s/s.jsonl", dir);
        snprintf(odir, sizeof odir, "%s/o", dir);
        snprintf(obs_t, sizeof obs_t, "%s/o/a.bin", dir);
        FILE *sf = fopen(shots, "w");
        int made = sf != NULL && fputs("{\"id\": \"a\"}\n", sf) >= 0;
        if (sf != NULL) made = fclose(sf) == 0 && made;
        made = made && mkdir(odir, 0755) == 0 && link(ob, obs_t) == 0;
        const char *ens = "%s ensemble -expt %s -default_F 100 -N 5 -oversample 1 -shots %s -observed %s/o/{id}.bin "
                          "-global Na -local orient_z -loss lsq -cycles 2 %s 2>&1";
        double fits[2] = {NAN, NAN};
        int sts[2] = {-1, -1};
        const char *resp[2] = {"-panel_pedestal 40,10 -panel_gain 2,0.5", "-pedestal 40 -gain 2"};
        for (int k = 0; k < 2 && made; ++k) {
            snprintf(cmd, sizeof cmd, ens, bin, ex, shots, dir, resp[k]);
            sts[k] = run(cmd);
            const char *lz = strstr(g_out, "shot a: orient_z=");
            if (lz == NULL || sscanf(lz + 17, "%lf", &fits[k]) != 1) fits[k] = NAN;
            if (k == 0 && !(sts[k] == 0 && fabs(fits[0] - 0.1) < 1e-4)) fputs(g_out, stdout);
        }
        nbgi_test_check(sts[0] == 0 && fabs(fits[0] - 0.1) < 1e-4 && !(fabs(fits[1] - 0.1) < 1e-4),
                        "resp-cli-ensemble", "ensemble -panel_pedestal 40,10 -panel_gain 2,0.5: orient_z %.6f "
                        "(truth 0.1; exit %d); with one response for both panels %.6f (exit %d)", fits[0], sts[0],
                        fits[1], sts[1]);
        snprintf(cmd, sizeof cmd, ens, bin, ex, shots, dir, "-panel_gain 2,0.5,1");
        s2 = made ? run(cmd) : -1;
        nbgi_test_check(s2 != 0 && strstr(g_out, "-panel_gain gives 3 values, the detector has 2 panels") != NULL,
                        "resp-cli-ensemble-count", "ensemble: a list of 3 for 2 panels is refused (exit %d)", s2);
        free(back);

        /* resp-trusted: the list's trusted_range per panel (nbg_read_expt_panels), applied by nbg_observed_read;
         * the options' range for the single detector */
        g.saturation = 500;
        rc = nbg_write_expt_panels(ctx, ex, &g, lab, 2, NULL);
        back = NULL;
        rc = rc == NBG_OK ? nbg_read_expt_panels(ctx, ex, &g2, &back, &np) : rc;
        nbgi_test_check(rc == NBG_OK && np == 2 && back[0].has_trusted && back[1].has_trusted &&
                            back[0].trusted[0] == -1 && back[1].trusted[1] == 500 && g2.trusted[1] == 500,
                        "resp-trusted-read", "the list's trusted_range on each panel: (%g, %g) (%s)",
                        rc == NBG_OK ? back[1].trusted[0] : NAN, rc == NBG_OK ? back[1].trusted[1] : NAN,
                        rc == NBG_OK ? "ok" : nbg_errmsg(ctx));
        for (size_t i = 0; i < NPIX; ++i) {
            obs[i] = 20;
        }
        obs[3] = -1, obs[5] = -7, obs[NP0 + 2] = 500, obs[NP0 + 9] = 499.5f, obs[NP0 + 11] = -0.5f;
        f = fopen(ob, "wb");
        wrote = f != NULL && fwrite(obs, sizeof(float), NPIX, f) == NPIX;
        if (f != NULL) wrote = fclose(f) == 0 && wrote;
        nbg_observed ov;
        nbg_experiment te = e;
        nbg_panel tp[2] = {pan[0], pan[1]}; /* the plane's panels with the trusted ranges read */
        for (int k = 0; k < 2 && rc == NBG_OK; ++k) {
            tp[k].has_trusted = back[k].has_trusted;
            memcpy(tp[k].trusted, back[k].trusted, sizeof tp[k].trusted);
        }
        te.panels = tp;
        nbg_observed_options oo;
        nbg_observed_options_default(&oo);
        int orc = wrote && rc == NBG_OK ? nbg_observed_read(ctx, &te, ob, 0, &oo, &ov) : NBG_EIO;
        nbgi_test_check(orc == NBG_OK && ov.nleft_trusted == 3 && !ov.use[3] && !ov.use[5] && !ov.use[NP0 + 2] &&
                            ov.use[NP0 + 9] && ov.use[NP0 + 11] && strstr(ov.left_out, "3 outside the trusted range"),
                        "resp-trusted-panels", "%ld pixels outside (-1, 500) left out (3 expected): %s",
                        orc == NBG_OK ? ov.nleft_trusted : -1L, orc == NBG_OK ? ov.left_out : nbg_errmsg(ctx));
        nbg_observed_free(&ov);
        /* the options' range on panels without their own, and with 0 0 none */
        te.panels = pan;
        oo.trusted[0] = 0, oo.trusted[1] = 100;
        orc = nbg_observed_read(ctx, &te, ob, 0, &oo, &ov);
        const long n1 = orc == NBG_OK ? ov.nleft_trusted : -1;
        nbg_observed_free(&ov);
        oo.trusted[0] = oo.trusted[1] = 0;
        orc = nbg_observed_read(ctx, &te, ob, 0, &oo, &ov);
        const long n2 = orc == NBG_OK ? ov.nleft_trusted : -1;
        nbg_observed_free(&ov);
        nbgi_test_check(n1 == 5 && n2 == 0, "resp-trusted-options", "the options' (0, 100): %ld left out (5 "
                        "expected); 0 0: %ld (none)", n1, n2);
        /* through the program: refine -expt with the list's trusted range */
        snprintf(cmd, sizeof cmd, "%s refine -expt %s -default_F 100 -N 5 -oversample 1 -observed %s "
                 "-params orient_z -maxiter 1 2>&1", bin, ex, ob);
        s2 = run(cmd);
        nbgi_test_check(strstr(g_out, "3 outside the trusted range") != NULL, "resp-trusted-cli",
                        "refine -expt: the list's trusted range leaves out 3 pixels (exit %d)", s2);
        free(back);
        nbgi_test_rmtree(dir);
    }
#endif
    free(M), free(obs), free(img), free(w0), free(w1);
    nbg_ctx_destroy(ctx);
    return nbgi_test_summary();
}
