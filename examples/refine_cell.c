/*
 * refine_cell.c -- fit a crystal's unit cell and orientation to a detector image.
 *
 * Built-in default: a triclinic crystal (70 80 90 75 85 95, misset 10 5 3) renders a 128x128 image with
 * Poisson noise (seed 1); the refinement starts from a perturbed model (about 0.7% on the lengths and 0.4 deg on
 * the angles) and fits the nine parameters with Levenberg-Marquardt on the Poisson likelihood.  It prints where it
 * started, where it ended, the truth, and the standard errors.
 *
 *   build/examples/refine_cell            (or: make demo)
 */
#include "nbgrad.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void progress(void *user, int iter, double loss, double gnorm, double step)
{
    (void)user;
    printf("  iter %2d  -log L %.8g  |grad| %.3g  step %.3g\n", iter, loss, gnorm, step);
}

int main(void)
{
    nbg_ctx *ctx;
    if (nbg_ctx_create(&ctx, NBG_BACKEND_AUTO, NBG_DOUBLE, 0) != NBG_OK) {
        fprintf(stderr, "cannot create an nbgrad context\n");
        return 1;
    }
    /* the truth */
    nbg_experiment truth;
    nbg_experiment_default(&truth);
    truth.has_cell = 1;
    const double cell[6] = {70, 80, 90, 75, 85, 95};
    memcpy(truth.cell, cell, sizeof cell);
    truth.misset[0] = 10, truth.misset[1] = 5, truth.misset[2] = 3;
    truth.default_F = 100;
    truth.Na = truth.Nb = truth.Nc = 5;
    truth.lambda = 1;
    truth.distance = 100;
    truth.fpixels = truth.spixels = 128;
    truth.oversample = 1;
    truth.fluence *= 20; /* a few hundred photons in the brightest pixels */

    const size_t npix = 128 * 128;
    float *mean = malloc(npix * sizeof(float)), *obs = malloc(npix * sizeof(float));
    uint16_t *counts = malloc(npix * sizeof(uint16_t));
    if (nbg_simulate(ctx, &truth, mean, npix, NULL) != NBG_OK) {
        fprintf(stderr, "simulation failed: %s\n", nbg_errmsg(ctx));
        return 1;
    }
    long photons, overloads;
    if (nbg_noise_image(ctx, mean, 128, 128, NULL, 0, 1, counts, &photons, &overloads) != NBG_OK) {
        fprintf(stderr, "noise: %s\n", nbg_errmsg(ctx));
        return 1;
    }
    for (size_t i = 0; i < npix; ++i) {
        obs[i] = counts[i];
    }
    printf("observed image: 128x128 pixels, %ld photons (Poisson noise, seed 1)\n", photons);

    /* a perturbed start */
    nbg_experiment model = truth;
    const double dcell[6] = {0.5, -0.55, 0.6, 0.4, -0.35, 0.3}, dmis[3] = {0.4, -0.3, 0.35};
    for (int i = 0; i < 6; ++i) {
        model.cell[i] += dcell[i];
    }
    for (int i = 0; i < 3; ++i) {
        model.misset[i] += dmis[i];
    }
    const nbg_param params[9] = {NBG_P_A, NBG_P_B, NBG_P_C, NBG_P_ALPHA, NBG_P_BETA, NBG_P_GAMMA,
                                 NBG_P_ROTX, NBG_P_ROTY, NBG_P_ROTZ};
    nbg_refine_options opt;
    nbg_refine_options_default(&opt);
    opt.loss = NBG_LOSS_POISSON;
    opt.progress = progress;
    nbg_refine_result r = {0}; /* zeroed before its first use; nbg_refine_result_free releases its arrays */
    printf("refining the cell and orientation (Levenberg-Marquardt, Poisson likelihood)\n");
    if (nbg_refine(ctx, &model, obs, NULL, npix, params, 9, &opt, &r) != NBG_OK) {
        fprintf(stderr, "refinement failed: %s\n", nbg_errmsg(ctx));
        return 1;
    }
    printf("%s after %d iterations\n\n", r.converged ? "converged" : "stopped", r.iterations);
    printf("%-8s %12s %12s %12s %10s %8s\n", "param", "start", "refined", "truth", "std.err", "|err|/se");
    int within = 0;
    for (int j = 0; j < 9; ++j) {
        double tv;
        nbg_param_get(&truth, params[j], &tv);
        const double z = fabs(r.value[j] - tv) / r.sigma[j];
        within += z <= 3;
        printf("%-8s %12.5f %12.5f %12.5f %10.2g %8.2f\n", nbg_param_name(params[j]), r.start[j], r.value[j], tv,
               r.sigma[j], z);
    }
    printf("\n%d of 9 parameters within 3 standard errors of the truth\n", within);
    const int converged = r.converged;
    nbg_refine_result_free(&r);
    free(mean);
    free(obs);
    free(counts);
    nbg_ctx_destroy(ctx);
    return converged ? 0 : 1;
}
