/*
 * bench-panels.c -- the cost per pixel of a multi-panel detector against one flat panel, in one run.
 *
 *   bench-panels [REPS]
 *
 * The same crystal (the tric case of cases.h: -cell 70 80 90 85 95 105 -misset 10 5 3 -N 8 -lambda 1.5
 * -default_F 100) at 100 mm, rendered on the jungfrau16m layout (256 panels of 256 x 256, 16.8 Mpx, 0.075 mm) and
 * on one flat 4096 x 4096 panel of the same pixels (16.8 Mpx), each with 1 and 4 samples per pixel (-oversample 1,
 * 2), double and float: the best of REPS (3) runs after a warm-up, alternating the two detectors so that both see
 * the same machine state.  Prints the time per pixel of each and their ratio (panels / flat; 1 = no overhead).
 * Then the reverse pass (nbg_simulate_grad of a, rotx, distance, double, 1 sample per pixel) on the flat panel, on
 * the panels, and on the panels with the 6 motion gradients of each of the 32 modules as well (every component of
 * every group's motion: per-panel accumulators, one pass): the time per pixel and the ratios.
 * Threads: $NBG_THREADS or all cores.
 */
#include "cases.h"
#include "nbgrad.h"

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

/* Seconds of one reverse pass of e for the nparams parameters listed, the gradients into dm (negative on failure,
 * the message printed). */
static double time_grad(nbg_ctx *ctx, const nbg_experiment *e, const float *w, const nbg_param *params, int nparams,
                        double *dm, float *img, size_t n)
{
    const double t0 = now();
    if (nbg_simulate_grad(ctx, e, w, params, nparams, dm, img, n, NULL) != NBG_OK) {
        fprintf(stderr, "bench-panels: %s\n", nbg_errmsg(ctx));
        return -1;
    }
    return now() - t0;
}

/* Seconds of one nbg_simulate of e (NAN on failure, the message printed). */
static double time_one(nbg_ctx *ctx, const nbg_experiment *e, float *img, size_t n)
{
    const double t0 = now();
    if (nbg_simulate(ctx, e, img, n, NULL) != NBG_OK) {
        fprintf(stderr, "bench-panels: %s\n", nbg_errmsg(ctx));
        return -1;
    }
    return now() - t0;
}

int main(int argc, char **argv)
{
    const int reps = argc > 1 ? atoi(argv[1]) : 3;
    const char *t = getenv("NBG_THREADS");
    const int threads = t != NULL ? atoi(t) : 0;
    int n = 0, F = 0, S = 0;
    double px = 0;
    nbg_layout(NULL, "jungfrau16m", NULL, 0, &n, NULL, NULL, NULL);
    nbg_panel *pan = calloc((size_t)n, sizeof *pan);
    if (pan == NULL || nbg_layout(NULL, "jungfrau16m", pan, n, &n, &px, &F, &S) != NBG_OK) {
        fprintf(stderr, "bench-panels: no layout\n");
        return 1;
    }
    nbg_experiment flat, multi;
    nbgi_bench_case("tric4k", &flat); /* 4096 x 4096 */
    flat.pixel = px;
    multi = flat;
    multi.fpixels = F;
    multi.spixels = S;
    multi.panels = pan;
    multi.npanels = n;
    const size_t nflat = (size_t)4096 * 4096, nmulti = (size_t)n * 256 * 256;
    float *img = malloc(nflat > nmulti ? nflat * sizeof(float) : nmulti * sizeof(float));
    printf("%-7s %-3s %14s %14s %8s\n", "prec", "os", "flat ns/px", "panels ns/px", "ratio");
    for (int prec = 0; prec < 2; ++prec) {
        nbg_ctx *ctx = NULL;
        if (nbg_ctx_create(&ctx, NBG_BACKEND_CPU, prec ? NBG_FLOAT : NBG_DOUBLE, threads) != NBG_OK) {
            return 1;
        }
        for (int os = 1; os <= 2; ++os) {
            flat.oversample = multi.oversample = os;
            double bf = 1e30, bm = 1e30;
            time_one(ctx, &flat, img, nflat); /* warm-up */
            time_one(ctx, &multi, img, nmulti);
            for (int r = 0; r < reps; ++r) {
                const double a = time_one(ctx, &flat, img, nflat), b = time_one(ctx, &multi, img, nmulti);
                if (a < 0 || b < 0) {
                    return 1;
                }
                bf = a < bf ? a : bf;
                bm = b < bm ? b : bm;
            }
            const double pf = 1e9 * bf / (double)nflat, pm = 1e9 * bm / (double)nmulti;
            printf("%-7s %-3d %14.3f %14.3f %8.3f\n", prec ? "float" : "double", os, pf, pm, pm / pf);
            fflush(stdout);
        }
        nbg_ctx_destroy(ctx);
    }
    /* the reverse pass */
    nbg_ctx *ctx = NULL;
    if (nbg_ctx_create(&ctx, NBG_BACKEND_CPU, NBG_DOUBLE, threads) != NBG_OK) {
        return 1;
    }
    const size_t nmax = nflat > nmulti ? nflat : nmulti;
    float *w = malloc(nmax * sizeof(float));
    nbg_panel_motion mot[32];
    double dm[3 + 6 * 32];
    memset(mot, 0, sizeof mot);
    for (size_t i = 0; w != NULL && i < nmax; ++i) {
        w[i] = (float)(0.5 + (double)(i % 7) / 7.0);
    }
    flat.oversample = multi.oversample = 1;
    nbg_experiment moving = multi;
    moving.motions = mot;
    moving.nmotions = 32;
    /* a, rotx, distance; then every component of the 32 groups' motions too */
    nbg_param m[3 + 6 * 32] = {NBG_P_A, NBG_P_ROTX, NBG_P_DISTANCE};
    for (int j = 0; j < 6 * 32; ++j) {
        m[3 + j] = NBG_P_MOTION(j / 6, j % 6);
    }
    double bf = 1e30, bm = 1e30, bv = 1e30;
    time_grad(ctx, &moving, w, m, 3 + 6 * 32, dm, img, nmulti); /* warm-up */
    for (int r = 0; w != NULL && r < reps; ++r) {
        const double a = time_grad(ctx, &flat, w, m, 3, dm, img, nflat);
        const double b = time_grad(ctx, &multi, w, m, 3, dm, img, nmulti);
        const double c = time_grad(ctx, &moving, w, m, 3 + 6 * 32, dm, img, nmulti);
        if (a < 0 || b < 0 || c < 0) {
            return 1;
        }
        bf = a < bf ? a : bf;
        bm = b < bm ? b : bm;
        bv = c < bv ? c : bv;
    }
    printf("\nreverse pass (a, rotx, distance; double, 1 sample/px)\n%-34s %10s %8s\n", "detector", "ns/px", "ratio");
    printf("%-34s %10.3f %8.3f\n", "flat 4096 x 4096", 1e9 * bf / (double)nflat, 1.0);
    printf("%-34s %10.3f %8.3f\n", "jungfrau16m (256 panels)", 1e9 * bm / (double)nmulti,
           (bm / (double)nmulti) / (bf / (double)nflat));
    printf("%-34s %10.3f %8.3f   (against the panels without them: %.3f)\n", "jungfrau16m + 192 motion gradients",
           1e9 * bv / (double)nmulti, (bv / (double)nmulti) / (bf / (double)nflat), bv / bm);
    nbg_ctx_destroy(ctx);
    free(w);
    free(img);
    free(pan);
    return 0;
}
