/*
 * bench-grad.c -- the cost of gradients and of refinement, as ratios to the forward call in the same run.
 *
 *  1. One call of nbg_simulate_grad returning the image and every parameter's gradient, against one
 *     nbg_simulate, on the benchmark's cases (the heavy case at 256x256); the same for nbg_simulate_jvp with the
 *     nine cell and orientation tangents.  Peak memory of each, in its own process.
 *  2. Refinement of cell and orientation at 1024x1024: time per iteration (Levenberg-Marquardt and BFGS) from a
 *     perturbed start, and the iterations from the 10 seeded starts of tests/test-refine.c (128x128), with how many
 *     of the fits the verdict calls converged (BFGS on these noise-free images ends where its line search finds no
 *     lower point, short of the Gauss-Newton optimum: not converged).
 *
 * Threads: $NBG_THREADS or all cores.  Each timing is the best of NBG_BENCH_REPS (3) after a warm-up.
 */
#include "cases.h"
#include "nbgrad.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static double now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static int threads(void)
{
    const char *s = getenv("NBG_THREADS");
    return s != NULL ? atoi(s) : 0;
}

static int reps(void)
{
    const char *s = getenv("NBG_BENCH_REPS");
    const int r = s != NULL ? atoi(s) : 3;
    return r > 0 ? r : 3;
}

static const char *const names[3] = {"cubic1k", "tric1k", "heavy256"};

/* mode 0: forward, 1: gradient of every parameter, 2: JVP of the nine cell and orientation tangents */
static double time_call(int which, int mode, long *rss_kb)
{
    nbg_ctx *ctx;
    nbg_ctx_create(&ctx, NBG_BACKEND_CPU, NBG_DOUBLE, threads());
    nbg_experiment e;
    nbgi_bench_case(names[which], &e);
    nbg_report r;
    nbg_describe(ctx, &e, &r);
    const size_t npix = (size_t)r.fpixels * r.spixels;
    float *img = malloc(npix * sizeof(float)), *w = NULL;
    double *T = NULL;
    const nbg_param p9[9] = {NBG_P_A, NBG_P_B, NBG_P_C, NBG_P_ALPHA, NBG_P_BETA, NBG_P_GAMMA,
                             NBG_P_ROTX, NBG_P_ROTY, NBG_P_ROTZ};
    /* every scalar parameter (the mosaic spread with several domains) */
    nbg_param ids[NBG_NPARAMS];
    int nids = 0;
    for (int p = 0; p < NBG_NPARAMS; ++p) {
        if (p != NBG_P_MOSAIC || r.mosaic_domains > 1) {
            ids[nids++] = p;
        }
    }
    if (mode == 1) {
        w = malloc(npix * sizeof(float));
        for (size_t i = 0; i < npix; ++i) {
            w[i] = 1.0f;
        }
    }
    if (mode == 2) {
        T = malloc(npix * 9 * sizeof(double));
    }
    double best = 1e300;
    for (int k = 0; k <= reps(); ++k) {
        double g[NBG_NPARAMS];
        const double t0 = now();
        int rc;
        if (mode == 0) {
            rc = nbg_simulate(ctx, &e, img, npix, NULL);
        } else if (mode == 1) {
            rc = nbg_simulate_grad(ctx, &e, w, ids, nids, g, img, npix, NULL);
        } else {
            rc = nbg_simulate_jvp(ctx, &e, p9, 9, T, img, npix);
        }
        const double dt = now() - t0;
        if (rc != NBG_OK) {
            fprintf(stderr, "bench-grad: %s\n", nbg_errmsg(ctx));
            return -1;
        }
        if (k > 0 && dt < best) {
            best = dt;
        }
    }
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    *rss_kb = ru.ru_maxrss;
    free(img);
    free(w);
    free(T);
    nbg_ctx_destroy(ctx);
    return best;
}

/* Runs time_call in a child so each peak memory reading is its own. */
static double child(int which, int mode, long *rss_kb)
{
    int fd[2];
    if (pipe(fd) != 0) {
        return -1;
    }
    const pid_t pid = fork();
    if (pid == 0) {
        close(fd[0]);
        long rss = 0;
        double t = time_call(which, mode, &rss);
        if (write(fd[1], &t, sizeof t) != sizeof t || write(fd[1], &rss, sizeof rss) != sizeof rss) {
            _exit(1);
        }
        _exit(0);
    }
    close(fd[1]);
    double t = -1;
    if (read(fd[0], &t, sizeof t) != sizeof t || read(fd[0], rss_kb, sizeof *rss_kb) != sizeof *rss_kb) {
        t = -1;
    }
    close(fd[0]);
    waitpid(pid, NULL, 0);
    return t;
}

static void progress_count(void *user, int iter, double loss, double gnorm, double step)
{
    (void)loss, (void)gnorm, (void)step;
    *(int *)user = iter;
}

static void refine_bench(void)
{
    nbg_ctx *ctx;
    nbg_ctx_create(&ctx, NBG_BACKEND_CPU, NBG_DOUBLE, threads());
    const nbg_param p9[9] = {NBG_P_A, NBG_P_B, NBG_P_C, NBG_P_ALPHA, NBG_P_BETA, NBG_P_GAMMA,
                             NBG_P_ROTX, NBG_P_ROTY, NBG_P_ROTZ};
    for (int size = 0; size < 2; ++size) {
        const int n = size == 0 ? 1024 : 128;
        nbg_experiment t;
        nbg_experiment_default(&t);
        t.has_cell = 1;
        const double c[6] = {70, 80, 90, 75, 85, 95};
        memcpy(t.cell, c, sizeof c);
        t.misset[0] = 10, t.misset[1] = 5, t.misset[2] = 3;
        t.default_F = 100;
        t.Na = t.Nb = t.Nc = 5;
        t.lambda = 1;
        t.distance = 100;
        t.fpixels = t.spixels = n;
        t.oversample = 1;
        const size_t npix = (size_t)n * n;
        float *obs = malloc(npix * sizeof(float));
        nbg_simulate(ctx, &t, obs, npix, NULL);
        for (int m = 0; m < 2; ++m) {
            const int nstarts = size == 0 ? 1 : 10;
            int total = 0, worst = 0, conv = 0;
            double secs = 0;
            for (int k = 0; k < nstarts; ++k) {
                /* the starts of tests/test-refine.c: +-1% lengths, +-0.5 deg angles and orientation */
                uint64_t s = 1000 + (uint64_t)k;
                nbg_experiment e = t;
                for (int i = 0; i < 3; ++i) {
                    s = s * 6364136223846793005ULL + 1442695040888963407ULL;
                    e.cell[i] *= 1 + 0.01 * ((double)(s >> 11) * (2.0 / 9007199254740992.0) - 1.0);
                    s = s * 6364136223846793005ULL + 1442695040888963407ULL;
                    e.cell[3 + i] += 0.5 * ((double)(s >> 11) * (2.0 / 9007199254740992.0) - 1.0);
                    s = s * 6364136223846793005ULL + 1442695040888963407ULL;
                    e.misset[i] += 0.5 * ((double)(s >> 11) * (2.0 / 9007199254740992.0) - 1.0);
                }
                nbg_refine_options o;
                nbg_refine_options_default(&o);
                o.method = m == 0 ? NBG_OPT_LM : NBG_OPT_BFGS;
                int iters = 0;
                o.progress = progress_count;
                o.user = &iters;
                nbg_refine_result r = {0};
                const double t0 = now();
                if (nbg_refine(ctx, &e, obs, NULL, npix, p9, 9, &o, &r) != NBG_OK) {
                    printf("refine %s failed: %s\n", m == 0 ? "lm" : "bfgs", nbg_errmsg(ctx));
                    nbg_refine_result_free(&r);
                    continue;
                }
                secs += now() - t0;
                total += r.iterations;
                conv += r.converged;
                worst = r.iterations > worst ? r.iterations : worst;
                nbg_refine_result_free(&r);
            }
            printf("refine   %-4s %4dx%-4d  %2d start%s  iterations mean %5.1f max %3d   %.3f s per iteration   "
                   "converged %d of %d\n", m == 0 ? "lm" : "bfgs", n, n, nstarts, nstarts > 1 ? "s" : " ",
                   (double)total / nstarts, worst, secs / (total > 0 ? total : 1), conv, nstarts);
        }
        free(obs);
    }
    nbg_ctx_destroy(ctx);
}

int main(void)
{
    printf("gradient cost (double, %d threads; best of %d):\n", threads(), reps());
    printf("%-9s %10s %10s %8s %10s %8s %9s %9s %9s\n", "case", "forward s", "grad s", "ratio", "jvp9 s", "ratio",
           "fwd MB", "grad MB", "jvp9 MB");
    for (int c = 0; c < 3; ++c) {
        long r0 = 0, r1 = 0, r2 = 0;
        const double f = child(c, 0, &r0), g = child(c, 1, &r1), j = child(c, 2, &r2);
        printf("%-9s %10.4f %10.4f %8.2f %10.4f %8.2f %9.1f %9.1f %9.1f\n", names[c], f, g, g / f, j, j / f,
               r0 / 1024.0, r1 / 1024.0, r2 / 1024.0);
    }
    printf("\n");
    refine_bench();
    return 0;
}
