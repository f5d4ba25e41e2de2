/*
 * bench-spots.c -- what spot regions buy: the work of one Levenberg-Marquardt iteration (nbg_simulate_jvp of the
 * refined parameters, then a trial loss, nbg_loss_grad with no gradient) on the whole detector and on the pixel
 * list of boxes around the spots (nbg_spot_pixels), in one run, and their ratio; then a whole nbg_refine call of one
 * iteration both ways.
 *
 *   bench-spots [DETPIXELS [HALF_BOX]]     (4096 and 3 by default; $NBG_THREADS threads, default all cores)
 *
 * The experiment: a 4096 x 4096 detector of 0.075 mm pixels at 250 mm, a 100 x 110 x 120 A cell of 20 unit cells a
 * side, 1 A; the spots are the local maxima of the model image above 10% of its peak, the boxes the pixels within
 * HALF_BOX of a pixel above that threshold.  Nine parameters (cell and orientation), the Poisson loss.
 */
#include "nbgrad.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static const nbg_param P9[9] = {NBG_P_A, NBG_P_B, NBG_P_C, NBG_P_ALPHA, NBG_P_BETA, NBG_P_GAMMA,
                                NBG_P_ROTX, NBG_P_ROTY, NBG_P_ROTZ};

/* One LM iteration's kernels: the tangents, then a trial loss. */
static int iteration(nbg_ctx *ctx, const nbg_experiment *e, const float *obs, double *T, float *img, size_t npix,
                     double *secs)
{
    const double t0 = now();
    int rc = nbg_simulate_jvp(ctx, e, P9, 9, T, img, npix);
    double L;
    if (rc == NBG_OK) {
        rc = nbg_loss_grad(ctx, e, NBG_LOSS_POISSON, obs, NULL, NULL, 0, &L, NULL, img, npix);
    }
    *secs = now() - t0;
    return rc;
}

int main(int argc, char **argv)
{
    const int D = argc > 1 ? atoi(argv[1]) : 4096;
    const int H = argc > 2 ? atoi(argv[2]) : 3;
    const char *th = getenv("NBG_THREADS");
    nbg_ctx *ctx = NULL;
    if (D < 64 || H < 0 || nbg_ctx_create(&ctx, NBG_BACKEND_CPU, NBG_DOUBLE, th ? atoi(th) : 0) != NBG_OK) {
        fprintf(stderr, "usage: bench-spots [DETPIXELS >= 64 [HALF_BOX >= 0]]\n");
        return 2;
    }
    nbg_experiment e;
    nbg_experiment_default(&e);
    e.has_cell = 1;
    const double cell[6] = {100, 110, 120, 90, 90, 90};
    memcpy(e.cell, cell, sizeof cell);
    e.misset[0] = 10;
    e.misset[1] = 5;
    e.misset[2] = 3;
    e.default_F = 100;
    e.Na = e.Nb = e.Nc = 20;
    e.lambda = 1;
    e.distance = 250 * D / 4096.0;
    e.pixel = 0.075;
    e.fpixels = e.spixels = D;
    e.oversample = 1;
    const size_t npix = (size_t)D * D;
    float *img = malloc(sizeof(float) * npix), *obs = malloc(sizeof(float) * npix);
    if (img == NULL || obs == NULL) {
        fprintf(stderr, "out of memory\n");
        return 1;
    }
    double t0 = now();
    if (nbg_simulate(ctx, &e, img, npix, NULL) != NBG_OK) {
        fprintf(stderr, "%s\n", nbg_errmsg(ctx));
        return 1;
    }
    const double tsim = now() - t0;
    double mx = 0;
    for (size_t i = 0; i < npix; ++i) {
        mx = fmax(mx, img[i]);
        obs[i] = floorf(img[i] + 0.5f);
    }
    const double thr = 0.1 * mx;
    long nspots = 0;
    for (int s = 1; s < D - 1; ++s) {
        for (int f = 1; f < D - 1; ++f) {
            const float v = img[(size_t)s * D + f];
            int peak = v > thr;
            for (int ds = -1; ds <= 1 && peak; ++ds) {
                for (int df = -1; df <= 1 && peak; ++df) {
                    const float u = img[(size_t)(s + ds) * D + f + df];
                    peak = (ds == 0 && df == 0) || u < v || (u == v && (ds > 0 || (ds == 0 && df > 0)));
                }
            }
            nspots += peak;
        }
    }
    uint32_t *list = NULL;
    long n = 0;
    t0 = now();
    if (nbg_spot_pixels(ctx, &e, img, npix, thr, NULL, 0, H, &list, &n) != NBG_OK) {
        fprintf(stderr, "%s\n", nbg_errmsg(ctx));
        return 1;
    }
    const double tlist = now() - t0;
    printf("detector %d x %d, %ld spots (local maxima above 10%% of the peak), boxes of half-width %d: %ld pixels "
           "(%.2f%% of the detector); forward %.2f s, building the list %.3f s\n", D, D, nspots, H, n,
           100.0 * (double)n / (double)npix, tsim, tlist);
    double *Tl = malloc(sizeof(double) * (size_t)n * 9), *Tw = malloc(sizeof(double) * npix * 9);
    if (Tl == NULL || Tw == NULL) {
        fprintf(stderr, "out of memory for the tangents\n");
        return 1;
    }
    nbg_experiment el = e;
    el.pixels = list;
    el.npixels_list = n;
    double ts = INFINITY, tw = INFINITY, t;
    for (int rep = 0; rep < 3; ++rep) {
        if (iteration(ctx, &el, obs, Tl, img, npix, &t) != NBG_OK) {
            fprintf(stderr, "%s\n", nbg_errmsg(ctx));
            return 1;
        }
        ts = fmin(ts, t);
    }
    if (iteration(ctx, &e, obs, Tw, img, npix, &tw) != NBG_OK) {
        fprintf(stderr, "%s\n", nbg_errmsg(ctx));
        return 1;
    }
    printf("one LM iteration's kernels (9 tangents + a trial loss): whole image %.3f s, spot list %.3f s (best of "
           "3): %.1fx faster; Jacobian %.0f MB against %.1f MB\n", tw, ts, tw / ts, 9.0 * 8 * (double)npix / 1e6,
           9.0 * 8 * (double)n / 1e6);
    free(Tl);
    free(Tw);
    /* a whole refinement call of one LM iteration: the start (loss, linear start), the iteration (tangents, trial
     * losses), the standard errors (tangents again) and the floor check, from a start 0.2% off in a */
    nbg_refine_options o;
    nbg_refine_options_default(&o);
    o.loss = NBG_LOSS_POISSON;
    o.max_iter = 1;
    double tr[2];
    for (int v = 0; v < 2; ++v) {
        nbg_experiment s = v ? el : e;
        s.cell[0] *= 1.002;
        nbg_refine_result res = {0};
        t0 = now();
        const int rc = nbg_refine(ctx, &s, obs, NULL, npix, P9, 9, &o, &res);
        tr[v] = now() - t0;
        nbg_refine_result_free(&res);
        if (rc != NBG_OK) {
            fprintf(stderr, "%s\n", nbg_errmsg(ctx));
            return 1;
        }
    }
    printf("nbg_refine with one LM iteration (start, iteration, standard errors, floor check): whole image %.3f s, "
           "spot list %.3f s: %.1fx faster\n", tr[0], tr[1], tr[0] / tr[1]);
    free(list);
    free(img);
    free(obs);
    nbg_ctx_destroy(ctx);
    return 0;
}
