/*
 * test-spots.c -- spot regions (nbg_experiment.pixels, nbg_spot_pixels): the listed pixels of every call equal
 * the whole image's, bit for bit, and the others are 0; gradients, losses and tangents over a list equal the
 * whole image's with the loss restricted to the list; refinement on spot regions agrees with whole-image
 * refinement within the standard errors on a noisy image; bad lists are refused naming the entry.
 */
#include "testutil.h" /* first: it sets _GNU_SOURCE */
#include "nbgrad.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define FP 128
#define SP 112
#define NPIX ((size_t)FP * SP)

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
    e->fpixels = FP;
    e->spixels = SP;
    e->oversample = 2;
}

static double uni(uint64_t *s)
{
    *s = *s * 6364136223846793005ULL + 1442695040888963407ULL;
    return (double)(*s >> 11) * (1.0 / 9007199254740992.0);
}

/* The listed pixels of img equal ref's bit for bit and the others are 0. */
static int list_matches(const float *img, const float *ref, const uint32_t *list, long n, long *bad)
{
    long b = 0, t = 0;
    for (size_t i = 0; i < NPIX; ++i) {
        if (t < n && list[t] == i) {
            b += memcmp(&img[i], &ref[i], sizeof(float)) != 0;
            ++t;
        } else {
            b += img[i] != 0;
        }
    }
    *bad = b;
    return b == 0;
}

int main(void)
{
    nbg_ctx *ctx = NULL, *ctxf = NULL;
    if (nbg_ctx_create(&ctx, NBG_BACKEND_CPU, NBG_DOUBLE, 0) != NBG_OK ||
        nbg_ctx_create(&ctxf, NBG_BACKEND_CPU, NBG_FLOAT, 0) != NBG_OK) {
        printf("FAIL spots-ctx cannot create contexts\n0 passed, 1 failed\n");
        return 1;
    }
    nbg_experiment t;
    truth(&t);
    float *full = malloc(NPIX * sizeof(float)), *img = malloc(NPIX * sizeof(float));
    float *obs = malloc(NPIX * sizeof(float)), *dL = malloc(NPIX * sizeof(float));
    float *dLz = malloc(NPIX * sizeof(float)), *wz = malloc(NPIX * sizeof(float));
    nbg_simulate(ctx, &t, full, NPIX, NULL);
    double mx = 0;
    for (size_t i = 0; i < NPIX; ++i) {
        mx = fmax(mx, full[i]);
    }

    /* spots-1: the spot list of the model image: every pixel above the threshold, with its box */
    uint32_t *spots = NULL;
    long ns = 0;
    const int H = 2;
    int rc = nbg_spot_pixels(ctx, &t, NULL, 0, 0.1 * mx, NULL, 0, H, &spots, &ns);
    long missing = 0;
    for (size_t i = 0; i < NPIX; ++i) {
        if (!(full[i] > 0.1 * mx)) {
            continue;
        }
        int found = 0; /* i and its box's corners are listed */
        const long f = (long)(i % FP), s = (long)(i / FP);
        for (long ds = -H; ds <= H; ds += 2 * H) {
            for (long df = -H; df <= H; df += 2 * H) {
                const long ff = f + df, ss = s + ds;
                if (ff < 0 || ff >= FP || ss < 0 || ss >= SP) {
                    ++found;
                    continue;
                }
                for (long u = 0; u < ns; ++u) {
                    found += spots[u] == (uint32_t)(ss * FP + ff);
                }
            }
        }
        missing += found != 4;
    }
    int sorted = 1;
    for (long u = 1; u < ns; ++u) {
        sorted &= spots[u] > spots[u - 1];
    }
    nbgi_test_check(rc == NBG_OK && ns > 0 && ns < (long)NPIX / 2 && missing == 0 && sorted, "spots-1-list",
                   "%ld of %zu pixels in the spot boxes, sorted, %ld spot pixels without their box", ns, NPIX, missing);
    /* centres: one box of 5 x 5 clipped at the corner to 3 x 3, one whole */
    {
        const double c[4] = {0.2, 0.4, 40, 50};
        uint32_t *l = NULL;
        long n = 0;
        rc = nbg_spot_pixels(ctx, &t, full, NPIX, INFINITY, c, 2, 2, &l, &n);
        int ok = rc == NBG_OK && n == 9 + 25 && l[0] == 0 && l[9 + 24] == 52 * FP + 42;
        nbgi_test_check(ok, "spots-1-centres", "%ld pixels (9 + 25 expected)", n);
        free(l);
        const double cbad[4] = {3, 3, 200, 5};
        rc = nbg_spot_pixels(ctx, &t, full, NPIX, INFINITY, cbad, 2, 2, &l, &n);
        nbgi_test_check(rc == NBG_EINVAL && strstr(nbg_errmsg(ctx), "centre 1") != NULL, "spots-1-centre-outside",
                       "%s", nbg_errmsg(ctx));
    }

    /* a second list of scattered pixels and short runs, with a mask and a scale and background */
    uint32_t *sc = malloc(NPIX * sizeof(uint32_t));
    long nsc = 0;
    uint64_t seed = 99;
    for (size_t i = 0; i < NPIX; ++i) {
        if (uni(&seed) < 0.15) {
            sc[nsc++] = (uint32_t)i;
        }
    }

    /* spots-2: nbg_simulate over a list: the listed pixels bit for bit, the others 0, both precisions */
    for (int pr = 0; pr < 2; ++pr) {
        nbg_ctx *c = pr ? ctxf : ctx;
        nbg_experiment e = t;
        nbg_simulate(c, &e, full, NPIX, NULL);
        for (int which = 0; which < 2; ++which) {
            e.pixels = which ? sc : spots;
            e.npixels_list = which ? nsc : ns;
            for (size_t i = 0; i < NPIX; ++i) {
                img[i] = 7;
            }
            rc = nbg_simulate(c, &e, img, NPIX, NULL);
            long bad = 0;
            char id[64];
            snprintf(id, sizeof id, "spots-2-forward-%s-%s", pr ? "float" : "double", which ? "scattered" : "spots");
            const int ok = rc == NBG_OK && list_matches(img, full, e.pixels, e.npixels_list, &bad);
            nbgi_test_check(ok, id,
                           "%ld pixels listed, %ld differ", e.npixels_list, bad);
        }
    }
    /* with the image model, an ROI and a mask */
    {
        nbg_experiment e = t;
        e.scale = 1.7;
        e.bg[0] = 3;
        e.bg[1] = 0.5;
        e.bg[2] = -0.25;
        uint8_t *mask = malloc(NPIX);
        for (size_t i = 0; i < NPIX; ++i) {
            mask[i] = (i % 11) != 0;
        }
        e.mask = mask;
        e.roi[0] = 5;
        e.roi[1] = 120;
        e.roi[2] = 3;
        e.roi[3] = 100;
        nbg_simulate(ctx, &e, full, NPIX, NULL);
        e.pixels = sc;
        e.npixels_list = nsc;
        rc = nbg_simulate(ctx, &e, img, NPIX, NULL);
        long bad = 0;
        const int ok = rc == NBG_OK && list_matches(img, full, sc, nsc, &bad);
        nbgi_test_check(ok, "spots-2-forward-model-roi-mask",
                       "%ld differ", bad);
        free(mask);
    }

    /* spots-3: gradients, losses and tangents over a list against the whole image's restricted to the list */
    {
        nbg_experiment e = t;
        e.scale = 1.3;
        e.bg[0] = 2;
        e.bg[2] = 0.5;
        nbg_param P[13];
        memcpy(P, P9, sizeof P9);
        P[9] = NBG_P_DISTANCE;
        P[10] = NBG_P_BEAM_FAST;
        P[11] = NBG_P_SCALE;
        P[12] = NBG_P_BG_SLOW;
        nbg_simulate(ctx, &e, full, NPIX, NULL);
        for (size_t i = 0; i < NPIX; ++i) {
            dL[i] = (float)(uni(&seed) - 0.5);
            dLz[i] = 0;
            wz[i] = 0;
            obs[i] = (float)floor(full[i] * (0.8 + 0.4 * uni(&seed)));
        }
        for (long u = 0; u < ns; ++u) {
            dLz[spots[u]] = dL[spots[u]];
            wz[spots[u]] = 1;
        }
        double gf[13] = {0}, gl[13] = {0};
        int rc1 = nbg_simulate_grad(ctx, &e, dLz, P, 13, gf, full, NPIX, NULL);
        nbg_experiment el = e;
        el.pixels = spots;
        el.npixels_list = ns;
        int rc2 = nbg_simulate_grad(ctx, &el, dL, P, 13, gl, img, NPIX, NULL);
        double worst = 0;
        for (int j = 0; j < 13; ++j) {
            worst = fmax(worst, fabs(gl[j] - gf[j]) / fmax(fabs(gf[j]), 1e-300));
        }
        long bad = 0;
        const int okg = rc1 == NBG_OK && rc2 == NBG_OK && worst < 1e-10 && list_matches(img, full, spots, ns, &bad);
        nbgi_test_check(okg,
                       "spots-3-grad", "13 gradients, worst relative difference %.2g; image: %ld pixels differ",
                       worst, bad);
        for (int loss = 0; loss < 2; ++loss) {
            double Lf = 0, Ll = 0;
            rc1 = nbg_loss_grad(ctx, &e, (nbg_loss)loss, obs, wz, P, 13, &Lf, gf, full, NPIX);
            rc2 = nbg_loss_grad(ctx, &el, (nbg_loss)loss, obs, NULL, P, 13, &Ll, gl, img, NPIX);
            worst = fabs(Ll - Lf) / fabs(Lf);
            for (int j = 0; j < 13; ++j) {
                worst = fmax(worst, fabs(gl[j] - gf[j]) / fmax(fabs(gf[j]), 1e-300));
            }
            char id[64];
            snprintf(id, sizeof id, "spots-3-loss-%s", loss ? "poisson" : "lsq");
            nbgi_test_check(rc1 == NBG_OK && rc2 == NBG_OK && worst < 1e-10, id,
                           "loss %.6g and 13 gradients, worst relative difference %.2g", Ll, worst);
        }
        double *Tf = malloc(sizeof(double) * NPIX * 13), *Tl = malloc(sizeof(double) * (size_t)ns * 13);
        rc1 = nbg_simulate_jvp(ctx, &e, P, 13, Tf, full, NPIX);
        rc2 = nbg_simulate_jvp(ctx, &el, P, 13, Tl, img, NPIX);
        long differ = 0;
        for (int j = 0; j < 13; ++j) {
            for (long u = 0; u < ns; ++u) {
                differ += Tl[(size_t)j * ns + u] != Tf[(size_t)j * NPIX + spots[u]];
            }
        }
        const int okj = rc1 == NBG_OK && rc2 == NBG_OK && differ == 0 && list_matches(img, full, spots, ns, &bad);
        nbgi_test_check(okj,
                       "spots-3-jvp", "compact tangents of 13 parameters over %ld pixels: %ld differ from the whole "
                       "image's; image: %ld pixels differ", ns, differ, bad);
        free(Tf);
        free(Tl);
    }

    /* spots-4: refinement on the spot regions against the whole image, Poisson noise */
    {
        nbg_experiment tb = t;
        tb.fluence *= 20;
        tb.bg[0] = 0.5;
        float *mean = malloc(NPIX * sizeof(float));
        uint16_t *counts = malloc(NPIX * sizeof(uint16_t));
        nbg_simulate(ctx, &tb, mean, NPIX, NULL);
        long photons, overloads;
        nbg_noise_image(ctx, mean, FP, SP, NULL, 0, 4242, counts, &photons, &overloads);
        for (size_t i = 0; i < NPIX; ++i) {
            obs[i] = counts[i];
        }
        nbg_experiment start = tb;
        start.cell[0] += 0.2;
        start.cell[4] -= 0.1;
        start.misset[1] += 0.05;
        /* the boxes around the starting model's spots */
        float *m0 = malloc(NPIX * sizeof(float));
        nbg_simulate(ctx, &start, m0, NPIX, NULL);
        double m0max = 0;
        for (size_t i = 0; i < NPIX; ++i) {
            m0max = fmax(m0max, m0[i]);
        }
        uint32_t *l = NULL;
        long n = 0;
        rc = nbg_spot_pixels(ctx, &start, m0, NPIX, 0.5 + 0.05 * (m0max - 0.5), NULL, 0, 3, &l, &n);
        nbg_refine_options o;
        nbg_refine_options_default(&o);
        o.loss = NBG_LOSS_POISSON;
        nbg_experiment ew = start, es = start;
        es.pixels = l;
        es.npixels_list = n;
        nbg_refine_result rw = {0}, rs = {0};
        const int rcw = nbg_refine(ctx, &ew, obs, NULL, NPIX, P9, 9, &o, &rw);
        const int rcs = nbg_refine(ctx, &es, obs, NULL, NPIX, P9, 9, &o, &rs);
        double worst = 0, truthw = 0, truths = 0, ratio = 0;
        double tv[9];
        for (int j = 0; j < 9 && rw.value != NULL && rs.value != NULL; ++j) {
            nbg_param_get(&tb, P9[j], &tv[j]);
            /* the spots' data are a subset of the whole image's: the difference of the two estimates has the
             * variance sigma_spots^2 - sigma_whole^2 */
            const double sd = sqrt(fmax(rs.sigma[j] * rs.sigma[j] - rw.sigma[j] * rw.sigma[j], 0));
            worst = fmax(worst, fabs(rs.value[j] - rw.value[j]) / sd);
            ratio = fmax(ratio, rs.sigma[j] / rw.sigma[j]);
            truthw = fmax(truthw, fabs(rw.value[j] - tv[j]) / rw.sigma[j]);
            truths = fmax(truths, fabs(rs.value[j] - tv[j]) / rs.sigma[j]);
        }
        nbgi_test_check(rc == NBG_OK && rcw == NBG_OK && rcs == NBG_OK && rw.converged && rs.converged &&
                           worst < 3 && ratio < 2 && truths < 4 && rs.nobs == n, "spots-4-refine",
                       "%ld of %zu pixels; spots vs whole: at most %.2f standard errors of their difference apart, "
                       "sigma at most %.2f x the whole image's; from the truth: whole %.2f sigma (%d iterations), "
                       "spots %.2f sigma (%d iterations)", n, NPIX, worst, ratio, truthw, rw.iterations, truths,
                       rs.iterations);
        nbg_refine_result_free(&rw);
        nbg_refine_result_free(&rs);
        free(l);
        free(m0);
        free(mean);
        free(counts);
    }

    /* spots-6: a detector of 2 x 2 panels: the list's runs cross panels; forward and gradients as above */
    {
        nbg_experiment e = t;
        nbg_panel pan[4];
        for (int q = 0; q < 4; ++q) {
            memset(&pan[q], 0, sizeof pan[q]);
            pan[q].fpixels = 60;
            pan[q].spixels = 50;
            pan[q].fast[0] = 1;
            pan[q].slow[1] = 1;
            pan[q].origin[0] = e.pixel * (q % 2) * 64;
            pan[q].origin[1] = e.pixel * (q / 2) * 56;
        }
        e.panels = pan;
        e.npanels = 4;
        e.bg[0] = 1;
        e.bg[1] = 0.3;
        const size_t np = 4 * 60 * 50;
        float *pf = malloc(sizeof(float) * np), *pl = malloc(sizeof(float) * np), *d = malloc(sizeof(float) * np);
        float *dz = calloc(np, sizeof(float));
        uint32_t *l = malloc(sizeof(uint32_t) * np);
        long n = 0;
        for (size_t i = 0; i < np; ++i) {
            d[i] = (float)(uni(&seed) - 0.5);
            if (uni(&seed) < 0.3) {
                l[n++] = (uint32_t)i;
                dz[i] = d[i];
            }
        }
        const nbg_param m[5] = {NBG_P_A, NBG_P_ROTY, NBG_P_DISTANCE, NBG_P_DET_ROTZ, NBG_P_BG_FAST};
        double gf[5] = {0}, gl[5] = {0};
        const int rc1 = nbg_simulate_grad(ctx, &e, dz, m, 5, gf, pf, np, NULL);
        nbg_experiment el = e;
        el.pixels = l;
        el.npixels_list = n;
        const int rc2 = nbg_simulate_grad(ctx, &el, d, m, 5, gl, pl, np, NULL);
        double worst = 0;
        for (int j = 0; j < 5; ++j) {
            worst = fmax(worst, fabs(gl[j] - gf[j]) / fmax(fabs(gf[j]), 1e-300));
        }
        long bad = 0, t2 = 0;
        for (size_t i = 0; i < np; ++i) {
            if (t2 < n && l[t2] == i) {
                bad += memcmp(&pl[i], &pf[i], sizeof(float)) != 0;
                ++t2;
            } else {
                bad += pl[i] != 0;
            }
        }
        float *fw = malloc(sizeof(float) * np);
        nbg_simulate(ctx, &el, fw, np, NULL);
        long badf = 0;
        for (size_t i = 0; i < np; ++i) {
            badf += memcmp(&fw[i], &pl[i], sizeof(float)) != 0;
        }
        nbgi_test_check(rc1 == NBG_OK && rc2 == NBG_OK && worst < 1e-10 && bad == 0 && badf == 0, "spots-6-panels",
                       "4 panels, %ld listed pixels: 5 gradients, worst relative difference %.2g; image: %ld pixels "
                       "differ from the whole image's, %ld between nbg_simulate and the gradient call", n, worst, bad,
                       badf);
        free(fw);
        free(pf);
        free(pl);
        free(d);
        free(dz);
        free(l);
    }

    /* spots-5: bad lists */
    {
        nbg_experiment e = t;
        uint32_t bad1[4] = {5, 9, 20, 20};
        e.pixels = bad1;
        e.npixels_list = 4;
        rc = nbg_simulate(ctx, &e, img, NPIX, NULL);
        nbgi_test_check(rc == NBG_EINVAL && strstr(nbg_errmsg(ctx), "entry 3") != NULL, "spots-5-repeat", "%s",
                       nbg_errmsg(ctx));
        uint32_t bad2[3] = {5, 4, 20};
        e.pixels = bad2;
        e.npixels_list = 3;
        rc = nbg_simulate(ctx, &e, img, NPIX, NULL);
        nbgi_test_check(rc == NBG_EINVAL && strstr(nbg_errmsg(ctx), "entry 1") != NULL, "spots-5-unsorted", "%s",
                       nbg_errmsg(ctx));
        uint32_t bad3[3] = {5, 6, (uint32_t)NPIX};
        e.pixels = bad3;
        rc = nbg_simulate(ctx, &e, img, NPIX, NULL);
        nbgi_test_check(rc == NBG_EINVAL && strstr(nbg_errmsg(ctx), "entry 2") != NULL, "spots-5-outside", "%s",
                       nbg_errmsg(ctx));
        e.npixels_list = 0;
        rc = nbg_simulate(ctx, &e, img, NPIX, NULL);
        nbgi_test_check(rc == NBG_EINVAL, "spots-5-empty", "%s", nbg_errmsg(ctx));
        e.pixels = spots;
        e.npixels_list = ns;
        nbg_gradcheck_result res[1];
        const nbg_param pa = NBG_P_A;
        rc = nbg_gradcheck(ctx, &e, &pa, 1, 1e-6, 1, res);
        nbgi_test_check(rc == NBG_EUNSUP, "spots-5-gradcheck", "%s", nbg_errmsg(ctx));
    }

    free(sc);
    free(spots);
    free(full);
    free(img);
    free(obs);
    free(dL);
    free(dLz);
    free(wz);
    /* spots-centroids: nbg_reflection_centroids against each reflection rendered alone.  A table of 9^3 entries of
     * varied F; every entry is rendered with the others at 0 on the whole detector, and those with light give the
     * reference: their photons' centroid over the square of half-width 6 about their brightest pixel (moved by a
     * fraction of a pixel, as an observed centroid would be).  The call's answer must be each reflection's own, to
     * rounding (the light of the others, whose tails reach every square, left out). */
    {
        nbg_experiment e;
        truth(&e);
        e.Na = e.Nb = e.Nc = 10;
        nbg_hkl tab = {-4, 4, -4, 4, -4, 4, malloc(sizeof(double) * 729), 0};
        nbg_hkl one = {-4, 4, -4, 4, -4, 4, calloc(729, sizeof(double)), 0};
        float *im = malloc(sizeof(float) * NPIX);
        uint64_t sd = 99;
        for (int j = 0; j < 729; ++j) tab.F[j] = 50 + 100 * uni(&sd);
        int hk[729 * 3], pan[729];
        double x[729], y[729], rx[729], ry[729], rp[729], cx[729], cy[729], ph[729];
        long n = 0;
        int rc7 = NBG_OK;
        const int R = 6;
        for (int j = 0; j < 729 && rc7 == NBG_OK; ++j) {
            one.F[j] = tab.F[j];
            e.hkl = &one;
            e.default_F = 0;
            rc7 = nbg_simulate(ctx, &e, im, NPIX, NULL);
            one.F[j] = 0;
            size_t best = 0;
            for (size_t q = 1; q < NPIX; ++q) best = im[q] > im[best] ? q : best;
            if (rc7 != NBG_OK || !(im[best] > 1e-3)) continue;
            const long bf = (long)(best % FP), bs = (long)(best / FP);
            x[n] = bf + 0.5 + 0.37, y[n] = bs + 0.5 - 0.21;
            double sw = 0, sx = 0, sy = 0;
            for (long s2 = bs - R; s2 <= bs + R; ++s2) {
                for (long f2 = bf - R; f2 <= bf + R; ++f2) {
                    if (f2 < 0 || s2 < 0 || f2 >= FP || s2 >= SP) continue;
                    const double v = im[s2 * FP + f2];
                    sw += v, sx += v * (f2 + 0.5), sy += v * (s2 + 0.5);
                }
            }
            rx[n] = sx / sw, ry[n] = sy / sw, rp[n] = sw;
            hk[3 * n] = j / 81 - 4, hk[3 * n + 1] = (j / 9) % 9 - 4, hk[3 * n + 2] = j % 9 - 4;
            pan[n] = 0;
            ++n;
        }
        e.hkl = &tab;
        if (rc7 == NBG_OK) rc7 = nbg_reflection_centroids(ctx, &e, n, hk, pan, x, y, R, cx, cy, ph);
        double worst = 0, worstp = 0;
        for (long i = 0; rc7 == NBG_OK && i < n; ++i) {
            worst = fmax(worst, fmax(fabs(cx[i] - rx[i]), fabs(cy[i] - ry[i])));
            worstp = fmax(worstp, fabs(ph[i] / rp[i] - 1));
        }
        nbgi_test_check(rc7 == NBG_OK && n >= 10 && worst < 1e-4 && worstp < 1e-5, "spots-centroids",
                        "%ld reflections with light: each one's centroid as rendered alone to %.2g px, its photons to "
                        "%.2g", n, worst, worstp);
        /* bad input: a square of no size, a panel the detector lacks, interpolation (mixes neighbours) */
        int bad = nbg_reflection_centroids(ctx, &e, n, hk, pan, x, y, 0, cx, cy, ph) == NBG_EINVAL;
        pan[0] = 1;
        bad += nbg_reflection_centroids(ctx, &e, n, hk, pan, x, y, R, cx, cy, ph) == NBG_EINVAL &&
               strstr(nbg_errmsg(ctx), "panel") != NULL;
        pan[0] = 0;
        e.interpolate = 1;
        bad += nbg_reflection_centroids(ctx, &e, n, hk, pan, x, y, R, cx, cy, ph) == NBG_EUNSUP;
        nbgi_test_check(bad == 3, "spots-centroids-bad", "%d of 3 refused: radius 0, panel 1 of 1, interpolation", bad);
        free(tab.F), free(one.F), free(im);
    }
    nbg_ctx_destroy(ctx);
    nbg_ctx_destroy(ctxf);
    return nbgi_test_summary();
}
