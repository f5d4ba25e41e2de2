/*
 * bench-peak.c -- the forward kernel against what the machine's vector units allow (issue 28's estimate).
 *
 *   bench-peak
 *
 * 1. The machine: the rate of fused multiply-adds this core sustains on its own vector registers (the widest the
 *    build targets: 8 doubles with AVX-512, 4 with AVX2; independent chains, no memory traffic), on one thread and
 *    on $NBG_THREADS (all cores), in GFLOP/s (an FMA counted as 2 per lane).
 * 2. The kernel: heavy256 (bench/cases.h; the same per-sample work as heavy512, a quarter of the pixels), nbg_simulate
 *    on the same threads, in samples per second.
 * 3. Their ratio, with the kernel's arithmetic per sample counted once by bench/flops.sh (valgrind's per-instruction
 *    counts of an AVX2 build of this case, objdump's mnemonics): FLOPS_PER_SAMPLE below, and the vector operations
 *    per lane (an FMA one: what occupies the units, which do a multiply or an add in the time of an FMA).
 * Runs alternate (peak, kernel, peak, kernel, ...), so that a machine shared with other work slows both alike; each
 * figure is the best of its runs.
 */
#include "cases.h"
#include "nbgrad.h"

#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#ifdef _OPENMP
#include <omp.h>
#endif

/* Counted by bench/flops.sh on heavy256 (2026-11-28, GCC 12, the AVX2 build): double 95.2 flops a sample (55.2
 * vector operations per lane), float 77.2 (46.2), after stop 54's doubled cosine took the recurrence's 2c without an
 * add an axis (3 operations fewer).  Before it (2026-11-27): double 98.2 (58.2: 40 FMA, 12 multiplies, 6 adds and
 * subtracts), float 80.2 (49.2: 31, 12, 6), for stop 46's code and for stop 45's end alike; the earlier counts (156.2
 * and 111.2, 2026-11-26) were of stop 44's code.  Recount after any change to the forward's arithmetic. */
static const double FLOPS_PER_SAMPLE[2] = {95.2, 77.2};
static const double VOPS_PER_SAMPLE[2] = {55.2, 46.2};

/* The machine's own vector width (the kernel's 8 doubles are one register with AVX-512, two with AVX2), 12 chains
 * of it in registers (x86 has 16 of them without AVX-512, 32 with) */
#if defined(__AVX512F__)
#define VBYTES 64
#elif defined(__AVX__)
#define VBYTES 32
#else
#define VBYTES 16
#endif
typedef double vd __attribute__((vector_size(VBYTES)));
typedef float vf __attribute__((vector_size(VBYTES)));
enum { CHAINS = 12, ITERS = 20000000, LD = VBYTES / 8, LF = VBYTES / 4 };
/* x unknown to the compiler each time, in its register: the chains stay chains */
#if defined(__x86_64__) || defined(__i386__)
#define OPAQUE(x) __asm__ volatile("" : "+x"(x))
#else
#define OPAQUE(x) __asm__ volatile("" : : "r"(&(x)) : "memory")
#endif

static double now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* CHAINS independent chains a = a x + y of the lanes: FMAs with nothing between them */
static __attribute__((noinline)) double chains_d(long iters)
{
    vd a[CHAINS], x, y;
    for (int i = 0; i < LD; ++i) {
        x[i] = 1.0000001;
        y[i] = 1e-9;
    }
    for (int c = 0; c < CHAINS; ++c) {
        for (int i = 0; i < LD; ++i) {
            a[c][i] = c;
        }
    }
    for (long k = 0; k < iters; ++k) {
#pragma GCC unroll 12
        for (int c = 0; c < CHAINS; ++c) {
            a[c] = a[c] * x + y;
        }
        OPAQUE(x);
    }
    double s = 0;
    for (int c = 0; c < CHAINS; ++c) {
        for (int i = 0; i < LD; ++i) {
            s += a[c][i];
        }
    }
    return s;
}

static __attribute__((noinline)) double chains_f(long iters)
{
    vf a[CHAINS], x, y;
    for (int i = 0; i < LF; ++i) {
        x[i] = 1.0000001f;
        y[i] = 1e-9f;
    }
    for (int c = 0; c < CHAINS; ++c) {
        for (int i = 0; i < LF; ++i) {
            a[c][i] = (float)c;
        }
    }
    for (long k = 0; k < iters; ++k) {
#pragma GCC unroll 12
        for (int c = 0; c < CHAINS; ++c) {
            a[c] = a[c] * x + y;
        }
        OPAQUE(x);
    }
    double s = 0;
    for (int c = 0; c < CHAINS; ++c) {
        for (int i = 0; i < LF; ++i) {
            s += a[c][i];
        }
    }
    return s;
}

/* GFLOP/s of the chains on nth threads */
static double peak(int prec, int nth, double *sink)
{
    const double t0 = now();
    double s = 0;
#pragma omp parallel num_threads(nth) reduction(+ : s)
    s += prec ? chains_f(ITERS) : chains_d(ITERS);
    const double t = now() - t0;
    *sink += s;
    return (double)ITERS * CHAINS * (prec ? LF : LD) * 2 * nth / t * 1e-9;
}

int main(void)
{
    int nth = 1;
    const char *env = getenv("NBG_THREADS");
#ifdef _OPENMP
    nth = env != NULL && atoi(env) > 0 ? atoi(env) : omp_get_max_threads();
#endif
    nbg_experiment e;
    nbgi_bench_case("heavy256", &e);
    printf("Against the vector units (heavy256's forward, its arithmetic per sample counted by bench/flops.sh)\n");
    printf("%-7s %-7s %14s %14s %14s %12s %12s\n", "prec", "threads", "peak_GFLOP/s", "Msamples/s", "GFLOP/s",
           "flop_ratio", "vop_ratio");
    double sink = 0;
    for (int prec = 0; prec < 2; ++prec) {
        const int counts[2] = {1, nth};
        for (int k = 0; k < (nth > 1 ? 2 : 1); ++k) {
            nbg_ctx *ctx;
            if (nbg_ctx_create(&ctx, NBG_BACKEND_CPU, prec ? NBG_FLOAT : NBG_DOUBLE, counts[k]) != NBG_OK) {
                printf("bench-peak: no context\n");
                return 1;
            }
            nbg_report r;
            nbg_describe(ctx, &e, &r);
            const size_t npix = (size_t)r.fpixels * r.spixels;
            float *img = malloc(sizeof(float) * npix);
            double best_peak = 0, best_t = 1e300;
            for (int round = 0; round < 3 && img != NULL; ++round) {
                const double p = peak(prec, counts[k], &sink);
                best_peak = p > best_peak ? p : best_peak;
                const double t0 = now();
                if (nbg_simulate(ctx, &e, img, npix, NULL) != NBG_OK) {
                    printf("bench-peak: %s\n", nbg_errmsg(ctx));
                    return 1;
                }
                const double t = now() - t0;
                best_t = t < best_t ? t : best_t;
            }
            const double sps = (double)npix * r.steps / best_t;
            const double gf = sps * FLOPS_PER_SAMPLE[prec] * 1e-9;
            const double vo = sps * VOPS_PER_SAMPLE[prec] * 1e-9; /* G lane-operations/s */
            printf("%-7s %-7d %14.1f %14.1f %14.1f %12.2f %12.2f\n", prec ? "float" : "double", counts[k], best_peak,
                   sps * 1e-6, gf, gf > 0 ? best_peak / gf : 0, vo > 0 ? best_peak / 2 / vo : 0);
            free(img);
            nbg_ctx_destroy(ctx);
        }
    }
    printf("(peak: independent FMA chains in the widest vector registers the build targets; flop_ratio = peak / the kernel's flops, "
           "vop_ratio = (peak / 2) / the kernel's vector operations)%s\n", sink == 42 ? " " : "");
    return 0;
}
