/*
 * bench-startup.c -- the program's start-up: the median wall time of N runs of a command (fork, exec, wait), its
 * output to /dev/null.  make bench runs it on `nbgrad --version` and on an 8x8 image (bench/run.sh).
 *
 *   bench-startup [-n N] LABEL PROGRAM [ARGS...]
 *
 * Prints "startup LABEL: median M ms, min m ms, max x ms (N runs)"; the first run (cold caches) is not counted.
 * Exit status 1 when a run fails.
 */
#define _GNU_SOURCE
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static double now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static int cmp(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static int run(char **argv, double *secs)
{
    double t0 = now();
    pid_t pid = fork();
    if (pid < 0)
        return -1;
    if (pid == 0) {
        int fd = open("/dev/null", O_WRONLY);
        if (fd >= 0) {
            dup2(fd, 1);
            dup2(fd, 2);
        }
        execv(argv[0], argv);
        _exit(127);
    }
    int status;
    if (waitpid(pid, &status, 0) < 0)
        return -1;
    *secs = now() - t0;
    return WIFEXITED(status) && WEXITSTATUS(status) == 0 ? 0 : -1;
}

int main(int argc, char **argv)
{
    int n = 200, a = 1;
    if (a + 1 < argc && strcmp(argv[a], "-n") == 0) {
        n = atoi(argv[a + 1]);
        a += 2;
    }
    if (argc - a < 2 || n < 1) {
        fprintf(stderr, "usage: bench-startup [-n N] LABEL PROGRAM [ARGS...]\n");
        return 2;
    }
    const char *label = argv[a];
    char **cmd = argv + a + 1;
    double *t = malloc((size_t)n * sizeof *t), first;
    if (t == NULL)
        return 2;
    if (run(cmd, &first) != 0) {
        fprintf(stderr, "bench-startup: %s failed\n", cmd[0]);
        free(t);
        return 1;
    }
    for (int i = 0; i < n; i++)
        if (run(cmd, &t[i]) != 0) {
            fprintf(stderr, "bench-startup: %s failed (run %d)\n", cmd[0], i + 1);
            free(t);
            return 1;
        }
    qsort(t, (size_t)n, sizeof *t, cmp);
    double med = n % 2 ? t[n / 2] : 0.5 * (t[n / 2 - 1] + t[n / 2]);
    printf("startup %-28s median %6.2f ms, min %6.2f ms, max %6.2f ms (%d runs)\n", label, 1e3 * med, 1e3 * t[0],
           1e3 * t[n - 1], n);
    free(t);
    return 0;
}
