/*
 * refine_modules.c -- fit where the modules of a multi-panel detector are, together with the crystal's
 * orientation, on spot regions of one noisy still.
 *
 * Built-in default: a Jungfrau 16M (nbg_layout "jungfrau16m": 32 modules of 8 ASICs, 256 panels, 16.8 Mpx) at
 * 120 mm whose 32 modules are displaced in the detector plane by up to 0.1 mm (3/4 of a pixel; seed 3), a
 * triclinic crystal (70 80 90 85 95 105, misset 10 5 3, N 8) and Poisson noise (seed 5).  The fit starts from the
 * modules where the layout puts them and the orientation off by 0.02 deg, takes the pixels within 3 of the
 * starting model's spots (nbg_spot_pixels: about 2 % of the detector), and fits the 64 in-plane module shifts (the
 * panel motions' shift_x, shift_y of every module group) and the 3 misset angles with Levenberg-Marquardt on the
 * Poisson likelihood.  It prints how far each fitted shift lies from the truth in standard errors.
 *
 *   build/examples/refine_modules
 */
#include "nbgrad.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define NMOD 32

/* A reproducible uniform number in [-1, 1). */
static double uniform(unsigned long long *s)
{
    *s = *s * 6364136223846793005ULL + 1442695040888963407ULL;
    return (double)(*s >> 11) / 4503599627370496.0 - 1.0;
}

int main(void)
{
    nbg_ctx *ctx;
    if (nbg_ctx_create(&ctx, NBG_BACKEND_CPU, NBG_DOUBLE, 0) != NBG_OK) {
        fprintf(stderr, "cannot create an nbgrad context\n");
        return 1;
    }
    int np = 0, F = 0, S = 0;
    double px = 0;
    nbg_layout(ctx, "jungfrau16m", NULL, 0, &np, NULL, NULL, NULL);
    nbg_panel *pan = calloc((size_t)np, sizeof *pan);
    if (pan == NULL || nbg_layout(ctx, "jungfrau16m", pan, np, &np, &px, &F, &S) != NBG_OK) {
        fprintf(stderr, "layout: %s\n", nbg_errmsg(ctx));
        return 1;
    }
    nbg_experiment truth;
    nbg_experiment_default(&truth);
    truth.has_cell = 1;
    const double cell[6] = {70, 80, 90, 85, 95, 105};
    memcpy(truth.cell, cell, sizeof cell);
    truth.misset[0] = 10, truth.misset[1] = 5, truth.misset[2] = 3;
    truth.default_F = 100;
    truth.Na = truth.Nb = truth.Nc = 8;
    truth.lambda = 1;
    truth.distance = 120;
    truth.pixel = px;
    truth.fpixels = F;
    truth.spixels = S;
    truth.panels = pan;
    truth.npanels = np;
    /* the modules where they really are (the layout groups each module's 8 ASICs) */
    nbg_panel_motion moved[NMOD], start[NMOD];
    memset(moved, 0, sizeof moved);
    memset(start, 0, sizeof start);
    unsigned long long seed = 3;
    for (int g = 0; g < NMOD; ++g) {
        moved[g].shift[0] = 0.1 * uniform(&seed);
        moved[g].shift[1] = 0.1 * uniform(&seed);
    }
    truth.motions = moved;
    truth.nmotions = NMOD;

    nbg_report rep;
    if (nbg_describe(ctx, &truth, &rep) != NBG_OK) {
        fprintf(stderr, "describe: %s\n", nbg_errmsg(ctx));
        return 1;
    }
    const size_t npix = rep.npix;
    float *mean = malloc(npix * sizeof(float)), *obs = malloc(npix * sizeof(float));
    uint16_t *counts = malloc(npix * sizeof(uint16_t));
    long photons = 0;
    if (mean == NULL || obs == NULL || counts == NULL || nbg_simulate(ctx, &truth, mean, npix, NULL) != NBG_OK ||
        nbg_noise_image(ctx, mean, (int)npix, 1, NULL, 0, 5, counts, &photons, NULL) != NBG_OK) {
        fprintf(stderr, "simulation: %s\n", nbg_errmsg(ctx));
        return 1;
    }
    for (size_t i = 0; i < npix; ++i) {
        obs[i] = counts[i];
    }
    printf("observed: %s, %d panels, %zu pixels, %ld photons (Poisson noise, seed 5); 32 modules displaced by up "
           "to 0.1 mm\n", "jungfrau16m", np, npix, photons);

    /* the start: the modules as the layout has them, the orientation off by 0.02 deg */
    nbg_experiment model = truth;
    model.motions = start;
    model.misset[0] += 0.02, model.misset[1] -= 0.02, model.misset[2] += 0.02;
    uint32_t *list = NULL;
    long nlist = 0;
    /* spot pixels: the starting model above 5 % of its peak, boxes of half-width 3 */
    float *m0 = malloc(npix * sizeof(float));
    float peak = 0;
    if (m0 == NULL || nbg_simulate(ctx, &model, m0, npix, NULL) != NBG_OK) {
        fprintf(stderr, "start: %s\n", nbg_errmsg(ctx));
        return 1;
    }
    for (size_t i = 0; i < npix; ++i) {
        peak = m0[i] > peak ? m0[i] : peak;
    }
    if (nbg_spot_pixels(ctx, &model, m0, npix, 0.05 * peak, NULL, 0, 3, &list, &nlist) != NBG_OK) {
        fprintf(stderr, "spots: %s\n", nbg_errmsg(ctx));
        return 1;
    }
    free(m0);
    model.pixels = list;
    model.npixels_list = nlist;
    printf("spot regions: %ld pixels (%.2f %% of the detector)\n", nlist, 100.0 * (double)nlist / (double)npix);

    nbg_param params[2 * NMOD + 3];
    int n = 0;
    params[n++] = NBG_P_ROTX, params[n++] = NBG_P_ROTY, params[n++] = NBG_P_ROTZ;
    for (int g = 0; g < NMOD; ++g) {
        params[n++] = NBG_P_MOTION(g, 0);
        params[n++] = NBG_P_MOTION(g, 1);
    }
    nbg_refine_options opt;
    nbg_refine_options_default(&opt);
    opt.loss = NBG_LOSS_POISSON;
    nbg_refine_result *r = calloc(1, sizeof *r);
    if (r == NULL || nbg_refine(ctx, &model, obs, NULL, npix, params, n, &opt, r) != NBG_OK) {
        fprintf(stderr, "refine: %s\n", nbg_errmsg(ctx));
        return 1;
    }
    printf("%s after %d iterations: %s\n", r->converged ? "converged" : "NOT CONVERGED", r->iterations, r->why);
    double sz2 = 0, zmax = 0, smin = INFINITY, smax = 0;
    int within = 0;
    for (int j = 3; j < n; ++j) {
        const int g = (j - 3) / 2, c = (j - 3) % 2;
        const double z = (r->value[j] - moved[g].shift[c]) / r->sigma[j];
        sz2 += z * z;
        zmax = fabs(z) > zmax ? fabs(z) : zmax;
        within += fabs(z) <= 3;
        smin = r->sigma[j] < smin ? r->sigma[j] : smin;
        smax = r->sigma[j] > smax ? r->sigma[j] : smax;
    }
    for (int j = 0; j < 3; ++j) {
        printf("  %-5s start %.4f  fitted %.5f +- %.5f deg  (truth %.4f)\n", nbg_param_name(params[j]),
               r->start[j], r->value[j], r->sigma[j], truth.misset[j]);
    }
    printf("module shifts: standard errors %.2g to %.2g mm; errors rms %.2f, largest %.2f standard errors\n", smin,
           smax, sqrt(sz2 / (n - 3)), zmax);
    printf("%d of %d module shifts within 3 standard errors of the truth\n", within, n - 3);
    nbg_refine_result_free(r);
    free(r);
    free(list);
    free(mean);
    free(obs);
    free(counts);
    free(pan);
    nbg_ctx_destroy(ctx);
    return 0;
}
