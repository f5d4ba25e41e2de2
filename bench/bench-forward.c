/*
 * bench-forward.c -- forward-simulation benchmark of the nbgrad library, plus two helpers for bench/run.sh.
 *
 *   bench-forward [CASE...]                     time the library on the cases (default: all), double and float
 *   bench-forward exec DIR REPS -- PROGRAM ARGS  time a program run in DIR (a warm-up, then the best of REPS)
 *   bench-forward sum FILE                       the sum of a raw float32 image (a checksum)
 *
 * Cases (the same experiments as the command lines in bench/run.sh):
 *   cubic1k   -cell 100 100 100 90 90 90 -default_F 100 -lambda 6.2 -N 5 -distance 100 -detpixels 1024
 *   cubic4k   the same at -detpixels 4096
 *   tric1k    -cell 70 80 90 85 95 105 -misset 10 5 3 -N 8 -lambda 1.5 -default_F 100 -distance 100 -detpixels 1024
 *   heavy512  cubic + -oversample 2 -mosaic 0.5 -mosaic_dom 10 -phi 0.01 -osc 0.5 -phisteps 5 -hdivrange 0.1
 *             -vdivrange 0.1 -hdivsteps 3 -vdivsteps 3 -dispersion 0.1 -dispsteps 3 -detpixels 512
 *
 * Each (case, precision) runs in its own child process, so that its peak RSS (getrusage) is its own.  Timing: one
 * warm-up run, then the best of NBG_BENCH_REPS (default 3; the 4096 case 1) runs; when the warm-up alone takes
 * longer than NBG_BENCH_LONG seconds (default 5) it is the only measurement.  Threads: $NBG_THREADS, or all cores
 * (the OpenMP default).  The checksum is the sum of the image's pixels, so that a speed-up that changes the
 * physics shows.
 */
#define _GNU_SOURCE
#include "cases.h"
#include "nbgrad.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/time.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#ifdef _OPENMP
#include <omp.h>
#endif

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static double env_double(const char *name, double dflt)
{
    const char *s = getenv(name);
    if (s == NULL || s[0] == '\0') {
        return dflt;
    }
    char *end;
    const double v = strtod(s, &end);
    return (end != s && *end == '\0') ? v : dflt;
}

static int threads_wanted(void)
{
    const int t = (int)env_double("NBG_THREADS", 0);
    return t > 0 ? t : 0;
}

static int threads_used(void)
{
    const int t = threads_wanted();
#ifdef _OPENMP
    return t > 0 ? t : omp_get_max_threads();
#else
    return t > 0 ? t : 1;
#endif
}

/* --- cases --------------------------------------------------------------------------------------------------- */

typedef struct {
    const char *name;
    const char *what;
    int reps; /* timed repetitions after the warm-up (0: NBG_BENCH_REPS) */
} bench_case;

static const bench_case cases[] = {
    {"cubic1k", "cubic 100 A, N 5, lambda 6.2, 1024^2", 0},
    {"cubic4k", "cubic 100 A, N 5, lambda 6.2, 4096^2", 1},
    {"tric1k", "triclinic 70 80 90 85 95 105, misset, N 8, lambda 1.5, 1024^2", 0},
    {"heavy512", "cubic + oversample 2, 10 mosaic, 5 phi, 3x3 div, 3 disp, 512^2", 0},
};
#define NCASES ((int)(sizeof cases / sizeof cases[0]))

static int run_case(const bench_case *bc, nbg_precision prec)
{
    nbg_experiment e;
    nbgi_bench_case(bc->name, &e);
    nbg_ctx *ctx = NULL;
    int rc = nbg_ctx_create(&ctx, NBG_BACKEND_CPU, prec, threads_wanted());
    if (rc != NBG_OK) {
        fprintf(stderr, "bench-forward: %s: cannot create a context: %s\n", bc->name, nbg_strerror(rc));
        return 1;
    }
    nbg_report r;
    if ((rc = nbg_describe(ctx, &e, &r)) != NBG_OK) {
        fprintf(stderr, "bench-forward: %s: %s\n", bc->name, nbg_errmsg(ctx));
        nbg_ctx_destroy(ctx);
        return 1;
    }
    const size_t npix = (size_t)r.fpixels * (size_t)r.spixels;
    float *img = malloc(sizeof(float) * npix);
    if (img == NULL) {
        fprintf(stderr, "bench-forward: %s: out of memory\n", bc->name);
        nbg_ctx_destroy(ctx);
        return 1;
    }
    int reps = bc->reps > 0 ? bc->reps : (int)env_double("NBG_BENCH_REPS", 3);
    if (reps < 1) {
        reps = 1;
    }
    const double long_run = env_double("NBG_BENCH_LONG", 5);
    double best = 1e300;
    int done = 0;
    for (int i = 0; i <= reps; ++i) {
        const double t0 = now();
        rc = nbg_simulate(ctx, &e, img, npix, &r);
        const double t = now() - t0;
        if (rc != NBG_OK) {
            fprintf(stderr, "bench-forward: %s: %s\n", bc->name, nbg_errmsg(ctx));
            free(img);
            nbg_ctx_destroy(ctx);
            return 1;
        }
        if (i == 0) {
            if (t > long_run) { /* a long warm-up is the measurement */
                best = t;
                done = 1;
                break;
            }
            continue;
        }
        best = t < best ? t : best;
        ++done;
    }
    double sum = 0;
    for (size_t i = 0; i < npix; ++i) {
        sum += img[i];
    }
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    const double samples = (double)npix * (double)r.steps;
    printf("%-9s %-6s %5dx%-5d %6d %9.3e %4d %9.3f %10.2f %8.1f %18.10e\n", bc->name,
           prec == NBG_FLOAT ? "float" : "double", r.fpixels, r.spixels, r.steps, samples, done, best,
           samples / best / 1e6, (double)ru.ru_maxrss / 1024.0, sum);
    fflush(stdout);
    free(img);
    nbg_ctx_destroy(ctx);
    return 0;
}

static int bench_library(int argc, char **argv)
{
    int want[NCASES];
    for (int c = 0; c < NCASES; ++c) {
        want[c] = argc <= 1;
    }
    for (int i = 1; i < argc; ++i) {
        int found = 0;
        for (int c = 0; c < NCASES; ++c) {
            if (strcmp(argv[i], cases[c].name) == 0) {
                want[c] = found = 1;
            }
        }
        if (!found) {
            fprintf(stderr, "bench-forward: unknown case '%s' (cases:", argv[i]);
            for (int c = 0; c < NCASES; ++c) {
                fprintf(stderr, " %s", cases[c].name);
            }
            fprintf(stderr, ")\n");
            return 2;
        }
    }
    printf("library forward benchmark (nbg_simulate, CPU), %d threads; wall time = best of the timed runs after a "
           "warm-up\n", threads_used());
    printf("%-9s %-6s %11s %6s %9s %4s %9s %10s %8s %18s\n", "case", "prec", "pixels", "steps", "samples", "runs",
           "best_s", "Msamples/s", "peak_MB", "checksum(sum)");
    int failed = 0;
    for (int c = 0; c < NCASES; ++c) {
        if (!want[c]) {
            continue;
        }
        for (int p = 0; p < 2; ++p) {
            fflush(stdout);
            const pid_t pid = fork();
            if (pid == 0) {
                _exit(run_case(&cases[c], p == 0 ? NBG_DOUBLE : NBG_FLOAT));
            }
            int st = 0;
            if (pid < 0 || waitpid(pid, &st, 0) < 0 || !WIFEXITED(st) || WEXITSTATUS(st) != 0) {
                printf("%-9s %-6s FAILED\n", cases[c].name, p == 0 ? "double" : "float");
                failed = 1;
            }
        }
    }
    return failed;
}

/* --- helpers for run.sh --------------------------------------------------------------------------------------- */

/* Runs argv in dir with stdout/stderr to /dev/null; returns its wall time (s), or -1; *rss_kb gets its peak RSS. */
static double exec_once(const char *dir, char **argv, long *rss_kb)
{
    const double t0 = now();
    const pid_t pid = fork();
    if (pid == 0) {
        const int fd = open("/dev/null", O_WRONLY);
        if (fd < 0 || chdir(dir) != 0 || dup2(fd, 1) < 0 || dup2(fd, 2) < 0) {
            _exit(126);
        }
        execvp(argv[0], argv);
        _exit(127);
    }
    if (pid < 0) {
        return -1;
    }
    int st = 0;
    struct rusage ru;
    if (wait4(pid, &st, 0, &ru) < 0) {
        return -1;
    }
    const double t = now() - t0;
    if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) {
        fprintf(stderr, "bench-forward exec: %s exited with status %d\n", argv[0],
                WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st));
        return -1;
    }
    *rss_kb = ru.ru_maxrss;
    return t;
}

/* exec DIR REPS -- PROGRAM ARGS: prints "best_seconds runs peak_rss_kb". */
static int bench_exec(int argc, char **argv)
{
    if (argc < 5 || strcmp(argv[3], "--") != 0) {
        fprintf(stderr, "usage: bench-forward exec DIR REPS -- PROGRAM ARGS...\n");
        return 2;
    }
    const char *dir = argv[1];
    int reps = atoi(argv[2]);
    if (reps < 1) {
        reps = 1;
    }
    char **cmd = argv + 4;
    const double long_run = env_double("NBG_BENCH_LONG", 5);
    long rss = 0, peak = 0;
    double best = exec_once(dir, cmd, &rss);
    if (best < 0) {
        return 1;
    }
    peak = rss;
    int runs = 1;
    if (best <= long_run) { /* the first run was the warm-up */
        best = 1e300;
        runs = 0;
        for (int i = 0; i < reps; ++i) {
            const double t = exec_once(dir, cmd, &rss);
            if (t < 0) {
                return 1;
            }
            best = t < best ? t : best;
            peak = rss > peak ? rss : peak;
            ++runs;
        }
    }
    printf("%.6f %d %ld\n", best, runs, peak);
    return 0;
}

static int bench_sum(int argc, char **argv)
{
    if (argc != 2) {
        fprintf(stderr, "usage: bench-forward sum FILE\n");
        return 2;
    }
    FILE *f = fopen(argv[1], "rb");
    if (f == NULL) {
        fprintf(stderr, "bench-forward sum: %s: %s\n", argv[1], strerror(errno));
        return 1;
    }
    float buf[4096];
    size_t n;
    double sum = 0;
    while ((n = fread(buf, sizeof(float), 4096, f)) > 0) {
        for (size_t i = 0; i < n; ++i) {
            sum += buf[i];
        }
    }
    fclose(f);
    printf("%.10e\n", sum);
    return 0;
}

int main(int argc, char **argv)
{
    if (argc > 1 && strcmp(argv[1], "exec") == 0) {
        return bench_exec(argc - 1, argv + 1);
    }
    if (argc > 1 && strcmp(argv[1], "sum") == 0) {
        return bench_sum(argc - 1, argv + 1);
    }
    if (argc > 1 && (strcmp(argv[1], "-h") == 0 || strcmp(argv[1], "--help") == 0)) {
        printf("usage: bench-forward [CASE...]   (cases: cubic1k cubic4k tric1k heavy512)\n"
               "       bench-forward exec DIR REPS -- PROGRAM ARGS...\n"
               "       bench-forward sum FILE\n");
        return 0;
    }
    return bench_library(argc, argv);
}
