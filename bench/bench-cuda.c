/*
 * bench-cuda.c -- the CUDA backend's benchmark (make bench runs it from bench/run.sh).  Where there is no GPU it
 * says so and exits 0.
 *
 *   bench-cuda            every section below
 *   bench-cuda one CASE float|double
 *                         one warm forward call of a case (for bench/run.sh to count the kernel's arithmetic
 *                         with Nsight Compute)
 *
 * 1. cubic4k (the case) in float and double: the kernels' device time (CUDA events, nbg_report), the
 *    copy back, the host set-up, and the whole call; medians of NBG_BENCH_GPU_REPS (10) warm calls.  Against the
 *    CPU backend on all cores (one call): the ratio of whole calls and the relative difference of the sums.
 * 2. heavy512 and heavy2048 (3000 samples per pixel): samples per second of device time; with the arithmetic per
 *    sample (NBG_FLOPS_PER_SAMPLE_FLOAT / _DOUBLE, which run.sh measures with ncu when it can), the fraction of
 *    the GPU's peak rate.  Against the CPU backend at 512.
 * 3. The gradient of every parameter (nbg_simulate_grad) over the forward call, device time and whole call, on
 *    cubic4k and heavy512; and the nine cell and orientation tangents (nbg_simulate_jvp, double on any context)
 *    over the double forward call, whole calls, against the CPU backend's (one call).
 * 4. The host set-up of a repeated call on a warm context (plan, parameter copies): median and maximum.
 * 5. The forward kernel's device time per sample against the samples a pixel takes (cubic2048 at oversample 1 to 8,
 *    1 to 64 samples), where the backend changes the kernel's occupancy (NBG_LIGHT_SAMPLES_DOUBLE and _FLOAT in
 *    cuda/backend.cu; built with both at 0, or both large, each build is timed on every row).
 *
 * NBG_BENCH_CUDA_SMALL=1 replaces the cases by cubic256 and heavy256, to check the benchmark itself quickly.
 */
#include "cases.h"
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

static int cmp_double(const void *a, const void *b)
{
    const double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double median(double *v, int n)
{
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

static int reps(void)
{
    const char *s = getenv("NBG_BENCH_GPU_REPS");
    const int r = s != NULL ? atoi(s) : 10;
    return r > 0 ? r : 10;
}

static double sum(const float *a, size_t n)
{
    double s = 0;
    for (size_t i = 0; i < n; ++i) {
        s += a[i];
    }
    return s;
}

/* Medians over r warm calls (after one warm-up): whole call, kernels, copy back, set-up (seconds); with grad 1,
 * nbg_simulate_grad of every parameter instead of nbg_simulate; with grad 2, nbg_simulate_jvp of the nine cell and
 * orientation tangents (bench-grad's jvp9; it reports no times: the whole call only).  Returns 0 on failure. */
typedef struct {
    double wall, kernel, copy, setup, setup_max, checksum;
} timing;

static int measure(nbg_ctx *ctx, const nbg_experiment *e, int grad, int r, timing *t)
{
    nbg_report rep;
    if (nbg_describe(ctx, e, &rep) != NBG_OK) {
        return 0;
    }
    const size_t n = (size_t)rep.fpixels * rep.spixels;
    static const nbg_param p9[9] = {NBG_P_A,    NBG_P_B,    NBG_P_C,    NBG_P_ALPHA, NBG_P_BETA,
                                    NBG_P_GAMMA, NBG_P_ROTX, NBG_P_ROTY, NBG_P_ROTZ};
    float *img = malloc(n * sizeof(float)), *g = grad ? malloc(n * sizeof(float)) : NULL;
    double *w = malloc(4 * (size_t)(r + 1) * sizeof(double));
    double *tan = grad == 2 ? malloc(9 * n * sizeof(double)) : NULL;
    if (img == NULL || w == NULL || (grad && g == NULL) || (grad == 2 && tan == NULL)) {
        free(img);
        free(g);
        free(w);
        free(tan);
        return 0;
    }
    for (size_t i = 0; grad && i < n; ++i) {
        g[i] = (float)(1.0 + 0.5 * sin(0.01 * (double)i));
    }
    /* every scalar parameter (the mosaic spread where it is free) */
    nbg_param ids[NBG_NPARAMS];
    int nids = 0;
    for (int p = 0; p < NBG_NPARAMS; ++p) {
        if (p != NBG_P_MOSAIC || (e->mosaic > 0 && e->mosaic_domains > 1)) {
            ids[nids++] = p;
        }
    }
    int ok = 1;
    for (int k = 0; k <= r && ok; ++k) {
        double gr[NBG_NPARAMS];
        const double t0 = now();
        memset(&rep, 0, sizeof rep);
        ok = (grad == 2   ? nbg_simulate_jvp(ctx, e, p9, 9, tan, img, n)
              : grad == 1 ? nbg_simulate_grad(ctx, e, g, ids, nids, gr, img, n, &rep)
                          : nbg_simulate(ctx, e, img, n, &rep)) == NBG_OK;
        const double t1 = now();
        if (grad == 2) {
            rep.time_kernel = t1 - t0;
        }
        if (k > 0) { /* k == 0 is the warm-up */
            w[k - 1] = t1 - t0;
            w[r + k - 1] = rep.time_kernel;
            w[2 * r + k - 1] = rep.time_copy;
            w[3 * r + k - 1] = rep.time_setup;
        }
    }
    if (ok) {
        t->wall = median(w, r);
        t->kernel = median(w + r, r);
        t->copy = median(w + 2 * r, r);
        t->setup_max = 0;
        for (int k = 0; k < r; ++k) {
            t->setup_max = fmax(t->setup_max, w[3 * r + k]);
        }
        t->setup = median(w + 3 * r, r);
        t->checksum = sum(img, n);
    } else {
        fprintf(stderr, "bench-cuda: %s\n", nbg_errmsg(ctx));
    }
    free(img);
    free(g);
    free(w);
    free(tan);
    return ok;
}

static int one(int argc, char **argv)
{
    nbg_experiment e;
    if (argc < 4 || !nbgi_bench_case(argv[2], &e)) {
        fprintf(stderr, "usage: bench-cuda one CASE float|double\n");
        return 2;
    }
    nbg_ctx *ctx = NULL;
    if (nbg_ctx_create(&ctx, NBG_BACKEND_CUDA, strcmp(argv[3], "float") == 0 ? NBG_FLOAT : NBG_DOUBLE, 0) != NBG_OK) {
        fprintf(stderr, "bench-cuda: no GPU\n");
        return 1;
    }
    timing t;
    const int ok = measure(ctx, &e, 0, 1, &t);
    nbg_ctx_destroy(ctx);
    return ok ? 0 : 1;
}

int main(int argc, char **argv)
{
    if (argc > 1 && strcmp(argv[1], "one") == 0) {
        return one(argc, argv);
    }
    nbg_ctx *gpu[2] = {NULL, NULL}, *cpu = NULL;
    const int rc = nbg_ctx_create(&gpu[NBG_DOUBLE], NBG_BACKEND_CUDA, NBG_DOUBLE, 0);
    if (rc != NBG_OK) {
        printf("bench-cuda: no GPU here (%s): nothing to time\n", nbg_strerror(rc));
        return 0;
    }
    if (nbg_ctx_create(&gpu[NBG_FLOAT], NBG_BACKEND_CUDA, NBG_FLOAT, 0) != NBG_OK ||
        nbg_ctx_create(&cpu, NBG_BACKEND_CPU, NBG_DOUBLE, 0) != NBG_OK) {
        printf("bench-cuda: cannot create the contexts\n");
        return 1;
    }
    nbg_device_info dev, host;
    nbg_ctx_device(gpu[NBG_DOUBLE], &dev);
    nbg_ctx_device(cpu, &host);
    printf("GPU: %s, %d multiprocessors at %.2f GHz, %.1f GiB; peak %.0f GFLOP/s double, %.0f float\n", dev.name,
           dev.units, dev.clock_ghz, dev.memory_gib, dev.peak_gflops[NBG_DOUBLE], dev.peak_gflops[NBG_FLOAT]);
    printf("CPU backend: %d threads\n\n", host.units);
    const int r = reps();
    const int small = getenv("NBG_BENCH_CUDA_SMALL") != NULL && getenv("NBG_BENCH_CUDA_SMALL")[0] == '1';
    const char *cubic = small ? "cubic256" : "cubic4k";
    const char *heavy[2] = {small ? "heavy256" : "heavy512", small ? "heavy256" : "heavy2048"};
    const char *pn[2] = {"double", "float"};
    int status = 0;

    /* 1. cubic4k */
    nbg_experiment e;
    nbgi_bench_case(cubic, &e);
    timing tc;
    if (!measure(cpu, &e, 0, 1, &tc)) {
        status = 1;
    }
    printf("1. %s (%d warm calls, medians; CPU backend: one call)\n", cubic, r);
    printf("%-7s %10s %10s %10s %10s %12s %10s\n", "prec", "kernel_ms", "copy_ms", "setup_ms", "call_ms",
           "cpu_call_ms", "cpu/gpu");
    timing tf[2];
    for (int p = 0; p < 2; ++p) {
        if (!measure(gpu[p], &e, 0, r, &tf[p])) {
            status = 1;
            continue;
        }
        printf("%-7s %10.3f %10.3f %10.3f %10.3f %12.1f %9.1fx   sum rel. to CPU double %.2e\n", pn[p],
               1e3 * tf[p].kernel, 1e3 * tf[p].copy, 1e3 * tf[p].setup, 1e3 * tf[p].wall, 1e3 * tc.wall,
               tc.wall / tf[p].wall, fabs(tf[p].checksum - tc.checksum) / fabs(tc.checksum));
    }

    /* 2. heavy sampling */
    printf("\n2. heavy sampling (3000 samples per pixel): device time, samples per second\n");
    printf("%-10s %-7s %10s %14s %14s %12s %10s\n", "case", "prec", "kernel_s", "samples/s", "flops/sample",
           "of_peak", "cpu/gpu");
    timing th[2][2];
    for (int c = 0; c < 2; ++c) {
        nbgi_bench_case(heavy[c], &e);
        nbg_report rep;
        nbg_describe(cpu, &e, &rep);
        const double samples = (double)rep.fpixels * rep.spixels * rep.steps;
        timing hc = {0, 0, 0, 0, 0, 0};
        if (c == 0 && !measure(cpu, &e, 0, 1, &hc)) {
            status = 1;
        }
        for (int p = 0; p < 2; ++p) {
            if (!measure(gpu[p], &e, 0, c == 0 ? 3 : 1, &th[c][p])) {
                status = 1;
                continue;
            }
            const double sps = samples / th[c][p].kernel;
            const char *fs = getenv(p == NBG_FLOAT ? "NBG_FLOPS_PER_SAMPLE_FLOAT" : "NBG_FLOPS_PER_SAMPLE_DOUBLE");
            const double fl = fs != NULL ? atof(fs) : 0;
            char frac[32] = "-", ratio[32] = "-", fls[32] = "-";
            if (fl > 0 && dev.peak_gflops[p] > 0) {
                snprintf(frac, sizeof frac, "%.1f%%", 100 * sps * fl / (1e9 * dev.peak_gflops[p]));
                snprintf(fls, sizeof fls, "%.0f", fl);
            }
            if (c == 0) {
                snprintf(ratio, sizeof ratio, "%.1fx", hc.wall / th[c][p].wall);
            }
            printf("%-10s %-7s %10.4f %14.3e %14s %12s %10s\n", heavy[c], pn[p], th[c][p].kernel, sps, fls, frac,
                   ratio);
        }
    }

    /* 3. gradients */
    printf("\n3. gradient of every parameter over the forward call (%d warm calls, medians)\n", r);
    printf("%-10s %-7s %12s %12s %12s %12s\n", "case", "prec", "grad_kern_ms", "kernel_x", "grad_call_ms", "call_x");
    const char *gcases[2] = {cubic, heavy[0]};
    for (int c = 0; c < 2; ++c) {
        nbgi_bench_case(gcases[c], &e);
        for (int p = 0; p < 2; ++p) {
            const timing *f = c == 0 ? &tf[p] : &th[0][p];
            timing tg;
            if (!measure(gpu[p], &e, 1, c == 0 ? r : 3, &tg)) {
                status = 1;
                continue;
            }
            printf("%-10s %-7s %12.3f %11.2fx %12.3f %11.2fx\n", gcases[c], pn[p], 1e3 * tg.kernel,
                   tg.kernel / f->kernel, 1e3 * tg.wall, tg.wall / f->wall);
        }
    }

    printf("%-10s %-7s %12s %12s %12s %12s\n", "case", "tangents", "cpu_call_ms", "gpu_call_ms", "cpu/gpu",
           "over_fwd");
    for (int c = 0; c < 2; ++c) {
        nbgi_bench_case(gcases[c], &e);
        const timing *f = c == 0 ? &tf[NBG_DOUBLE] : &th[0][NBG_DOUBLE];
        timing tj, tjc;
        if (!measure(gpu[NBG_DOUBLE], &e, 2, c == 0 ? r : 3, &tj) || !measure(cpu, &e, 2, 1, &tjc)) {
            status = 1;
            continue;
        }
        printf("%-10s %-7s %12.1f %12.3f %11.1fx %11.2fx\n", gcases[c], "nine", 1e3 * tjc.wall, 1e3 * tj.wall,
               tjc.wall / tj.wall, tj.wall / f->wall);
    }

    /* 4. set-up of a repeated call */
    printf("\n4. host set-up of a repeated call on a warm context (plan, parameter copies), %d calls\n", 2 * r);
    const char *scases[2] = {cubic, heavy[0]};
    for (int c = 0; c < 2; ++c) {
        nbgi_bench_case(scases[c], &e);
        timing ts;
        if (measure(gpu[NBG_FLOAT], &e, 0, 2 * r, &ts)) {
            printf("%-10s median %.3f ms, max %.3f ms\n", scases[c], 1e3 * ts.setup, 1e3 * ts.setup_max);
        } else {
            status = 1;
        }
    }
    /* 5. samples a pixel */
    printf("\n5. forward kernel against the samples a pixel takes (%s, oversample 1 to 8; %d warm calls, medians)\n",
           small ? "cubic256" : "cubic2048", r);
    printf("%-10s %-7s %10s %12s\n", "samples", "prec", "kernel_ms", "ps/sample");
    static const int oversample[] = {1, 2, 3, 4, 5, 6, 8};
    for (size_t o = 0; o < sizeof oversample / sizeof *oversample; ++o) {
        nbgi_bench_case(small ? "cubic256" : "cubic2048", &e);
        e.oversample = oversample[o];
        const double samples = (double)e.fpixels * e.spixels * e.oversample * e.oversample;
        for (int p = 0; p < 2; ++p) {
            timing t;
            if (!measure(gpu[p], &e, 0, r, &t)) {
                status = 1;
                continue;
            }
            printf("%-10d %-7s %10.3f %12.2f\n", e.oversample * e.oversample, pn[p], 1e3 * t.kernel,
                   1e12 * t.kernel / samples);
        }
    }
    nbg_ctx_destroy(gpu[0]);
    nbg_ctx_destroy(gpu[1]);
    nbg_ctx_destroy(cpu);
    return status;
}
