/*
 * sensitivity_map.c -- how each pixel responds to each parameter: the forward-mode tangent images dI/dtheta,
 * written as PGM pictures (grey = 0, white = positive, black = negative, scaled to the largest response).
 *
 *   build/examples/sensitivity_map [output-folder]      (default build/sensitivity)
 */
#include "nbgrad.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

int main(int argc, char **argv)
{
    const char *dir = argc > 1 ? argv[1] : "build/sensitivity";
    mkdir(dir, 0755);
    nbg_ctx *ctx;
    if (nbg_ctx_create(&ctx, NBG_BACKEND_AUTO, NBG_DOUBLE, 0) != NBG_OK) {
        fprintf(stderr, "cannot create an nbgrad context\n");
        return 1;
    }
    nbg_experiment e;
    nbg_experiment_default(&e);
    e.has_cell = 1;
    const double cell[6] = {70, 80, 90, 75, 85, 95};
    memcpy(e.cell, cell, sizeof cell);
    e.misset[0] = 10, e.misset[1] = 5, e.misset[2] = 3;
    e.default_F = 100;
    e.Na = e.Nb = e.Nc = 5;
    e.lambda = 1;
    e.distance = 100;
    e.fpixels = e.spixels = 256;
    e.oversample = 1;
    e.polarization = 0.95;
    const nbg_param params[] = {NBG_P_A, NBG_P_GAMMA, NBG_P_ROTX, NBG_P_NA, NBG_P_LAMBDA, NBG_P_DISTANCE,
                                NBG_P_BEAM_FAST, NBG_P_DET_ROTY};
    const int n = (int)(sizeof params / sizeof params[0]);
    const size_t npix = 256 * 256;
    double *T = malloc(sizeof(double) * npix * n);
    float *img = malloc(sizeof(float) * npix);
    unsigned char *pix = malloc(npix);
    if (nbg_simulate_jvp(ctx, &e, params, n, T, img, npix) != NBG_OK) {
        fprintf(stderr, "nbg_simulate_jvp failed: %s\n", nbg_errmsg(ctx));
        return 1;
    }
    for (int j = 0; j < n; ++j) {
        const double *t = T + (size_t)j * npix;
        double m = 0;
        for (size_t i = 0; i < npix; ++i) {
            m = fmax(m, fabs(t[i]));
        }
        /* a square-root stretch keeps the weak responses visible */
        for (size_t i = 0; i < npix; ++i) {
            const double v = m > 0 ? t[i] / m : 0;
            pix[i] = (unsigned char)lrint(127.5 + 127.5 * copysign(sqrt(fabs(v)), v));
        }
        char path[1024];
        snprintf(path, sizeof path, "%s/dI_d%s.pgm", dir, nbg_param_name(params[j]));
        FILE *f = fopen(path, "wb");
        if (f == NULL) {
            fprintf(stderr, "cannot write %s\n", path);
            return 1;
        }
        fprintf(f, "P5\n256 256\n# dI/d%s, max |response| %g photons per unit\n255\n", nbg_param_name(params[j]), m);
        fwrite(pix, 1, npix, f);
        fclose(f);
        printf("wrote %s (max |dI/d%s| = %.4g photons per unit)\n", path, nbg_param_name(params[j]), m);
    }
    free(T);
    free(img);
    free(pix);
    nbg_ctx_destroy(ctx);
    return 0;
}
