/*
 * clirun.h -- running the nbgrad program from a test: one fresh working directory per case, fork/exec without a
 * shell, stdout and stderr captured in files beside (not inside) that directory, a 120 s limit, and checks of the
 * exit status, the message and the files left behind.  Shared by test-cli.c and test-harden.c.
 *
 * The test sets g_bin (the program's real path) and g_root (a temporary directory) before the first case.
 */
#ifndef NBG_TEST_CLIRUN_H
#define NBG_TEST_CLIRUN_H

#include "testutil.h"

#include <dirent.h>
#include <fcntl.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static char g_bin[PATH_MAX];
static double g_child_as_limit; /* bytes of address space for the program (0: unlimited), as ulimit -v */
static double g_child_fsize_limit; /* bytes a file the program writes may reach (0: unlimited), as ulimit -f: a write
                                      beyond it fails with EFBIG (SIGXFSZ ignored), a disk that fills up */
static char g_root[1024]; /* the temporary directory of this run */
static int g_case;

typedef struct {
    char dir[1100];  /* the case directory */
    char work[1200]; /* the working directory of the run (dir/work) */
    int status;          /* exit code, or 128 + signal, or -1 when it could not run */
    char *out, *err;     /* captured stdout and stderr ("" when empty) */
} run_result;

static inline void result_free(run_result *r)
{
    free(r->out);
    free(r->err);
    r->out = r->err = NULL;
}

/* Makes a new case directory with an empty work/ inside. */
static inline int new_case(run_result *r)
{
    memset(r, 0, sizeof *r);
    snprintf(r->dir, sizeof r->dir, "%s/case%03d", g_root, ++g_case);
    snprintf(r->work, sizeof r->work, "%s/work", r->dir);
    if (mkdir(r->dir, 0700) != 0 || mkdir(r->work, 0700) != 0) {
        perror(r->dir);
        return 0;
    }
    return 1;
}

/* Writes text to work/name. */
static inline int put_file(const run_result *r, const char *name, const char *text)
{
    char path[PATH_MAX + 256];
    snprintf(path, sizeof path, "%s/%s", r->work, name);
    FILE *f = fopen(path, "w");
    if (f == NULL) {
        return 0;
    }
    const int ok = fputs(text, f) >= 0;
    return fclose(f) == 0 && ok;
}

static inline int exists_in(const char *dir, const char *name)
{
    char path[PATH_MAX + 256];
    struct stat st;
    snprintf(path, sizeof path, "%s/%s", dir, name);
    return stat(path, &st) == 0;
}

/* Runs the program with argv (NULL-terminated, argv[0] excluded) in r->work (a result may be run again: its
 * previous output is freed). */
static inline void run_in(run_result *r, const char *const *args)
{
    result_free(r);
    char outp[PATH_MAX + 16], errp[PATH_MAX + 16];
    snprintf(outp, sizeof outp, "%s/stdout.txt", r->dir);
    snprintf(errp, sizeof errp, "%s/stderr.txt", r->dir);
    int n = 0;
    while (args[n] != NULL) {
        ++n;
    }
    char **argv = calloc((size_t)n + 2, sizeof *argv);
    if (argv == NULL) {
        r->status = -1;
        return;
    }
    argv[0] = g_bin;
    for (int i = 0; i < n; ++i) {
        argv[i + 1] = (char *)args[i];
    }
    fflush(stdout);
    fflush(stderr);
    const pid_t pid = fork();
    if (pid == 0) {
        const int fo = open(outp, O_WRONLY | O_CREAT | O_TRUNC, 0600);
        const int fe = open(errp, O_WRONLY | O_CREAT | O_TRUNC, 0600);
        if (fo < 0 || fe < 0 || chdir(r->work) != 0 || dup2(fo, 1) < 0 || dup2(fe, 2) < 0) {
            _exit(126);
        }
        close(fo);
        close(fe);
        setenv("OMP_NUM_THREADS", "2", 0);
        if (g_child_fsize_limit > 0) {
            const struct rlimit rl = {(rlim_t)g_child_fsize_limit, (rlim_t)g_child_fsize_limit};
            signal(SIGXFSZ, SIG_IGN);
            setrlimit(RLIMIT_FSIZE, &rl);
        }
        if (g_child_as_limit > 0) {
            const struct rlimit rl = {(rlim_t)g_child_as_limit, (rlim_t)g_child_as_limit};
            setrlimit(RLIMIT_AS, &rl);
        }
        execv(g_bin, argv);
        _exit(127);
    }
    free(argv);
    if (pid < 0) {
        r->status = -1;
        return;
    }
    /* wait, at most 120 s */
    int st = 0;
    const struct timespec tick = {0, 10 * 1000 * 1000};
    pid_t w = 0;
    for (int i = 0; i < 12000 && (w = waitpid(pid, &st, WNOHANG)) == 0; ++i) {
        nanosleep(&tick, NULL);
    }
    if (w == 0) {
        kill(pid, SIGKILL);
        waitpid(pid, &st, 0);
        fprintf(stderr, "test-cli: the program ran over 120 s and was killed\n");
    }
    r->status = WIFEXITED(st) ? WEXITSTATUS(st) : WIFSIGNALED(st) ? 128 + WTERMSIG(st) : -1;
    r->out = nbgi_test_read_file(outp, NULL);
    r->err = nbgi_test_read_file(errp, NULL);
    if (r->out == NULL) {
        r->out = calloc(1, 1);
    }
    if (r->err == NULL) {
        r->err = calloc(1, 1);
    }
}

/* The first line of s (for messages), at most 200 characters. */
static inline const char *first_line(const char *s)
{
    static char buf[201];
    size_t n = 0;
    while (s != NULL && s[n] != '\0' && s[n] != '\n' && n < sizeof buf - 1) {
        ++n;
    }
    memcpy(buf, s != NULL ? s : "", n);
    buf[n] = '\0';
    return buf;
}

/* The names in work/ that are not in the NULL-terminated list allowed (comma-separated, "" when none). */
static inline void unexpected_files(const char *dir, const char *const *allowed, char *out, size_t size)
{
    out[0] = '\0';
    DIR *d = opendir(dir);
    if (d == NULL) {
        snprintf(out, size, "(cannot list %.200s)", dir);
        return;
    }
    struct dirent *de;
    while ((de = readdir(d)) != NULL) {
        if (strcmp(de->d_name, ".") == 0 || strcmp(de->d_name, "..") == 0) {
            continue;
        }
        int ok = 0;
        for (int i = 0; allowed != NULL && allowed[i] != NULL; ++i) {
            ok |= strcmp(de->d_name, allowed[i]) == 0;
        }
        if (!ok) {
            const size_t len = strlen(out);
            snprintf(out + len, size - len, "%s%s", len ? ", " : "", de->d_name);
        }
    }
    closedir(d);
}

/*
 * Runs a case that must fail: non-zero exit, stderr containing every one of the NULL-terminated words, and no
 * file in work/ other than the inputs (NULL-terminated list).
 */
static inline void expect_failure(const char *id, const char *what, run_result *r, const char *const *args,
                           const char *const *words, const char *const *inputs)
{
    run_in(r, args);
    nbgi_test_check(r->status > 0 && r->status < 128, id, "%s: exits non-zero (got %d)", what, r->status);
    int all = r->err[0] != '\0';
    const char *missing = "";
    for (int i = 0; words[i] != NULL; ++i) {
        if (strstr(r->err, words[i]) == NULL) {
            all = 0;
            missing = words[i];
        }
    }
    nbgi_test_check(all, id, "%s: stderr names the problem%s%s%s (stderr: \"%s\")", what, missing[0] ? " (no \"" : "",
                   missing, missing[0] ? "\")" : "", first_line(r->err));
    char extra[1024];
    unexpected_files(r->work, inputs, extra, sizeof extra);
    nbgi_test_check(!exists_in(r->work, "out.float") && !exists_in(r->work, "out.img") && extra[0] == '\0', id,
                   "%s: no output file left behind%s%s%s", what, extra[0] ? " (found: " : "", extra,
                   extra[0] ? ")" : "");
}

/* Reads work/name into a malloc'd buffer; *size receives its length. */
static inline void *read_in(const run_result *r, const char *name, size_t *size)
{
    char path[PATH_MAX + 256];
    snprintf(path, sizeof path, "%s/%s", r->work, name);
    *size = 0;
    return nbgi_test_read_file(path, size);
}

/* 1 when two files (in two case directories) exist, are non-empty and are byte for byte identical. */
static inline int same_file(const run_result *a, const char *na, const run_result *b, const char *nb, size_t *size)
{
    size_t sa, sb;
    void *da = read_in(a, na, &sa), *db = read_in(b, nb, &sb);
    const int same = da != NULL && db != NULL && sa == sb && sa > 0 && memcmp(da, db, sa) == 0;
    *size = sa;
    free(da);
    free(db);
    return same;
}

/* Sets g_bin from $NBG_BIN (default build/nbgrad) and makes g_root; 0 (after a FAIL line) when either fails. */
static inline int clirun_setup(const char *prefix)
{
    const char *bin = getenv("NBG_BIN");
    if (bin == NULL || bin[0] == '\0') {
        bin = "build/nbgrad";
    }
    if (realpath(bin, g_bin) == NULL || access(g_bin, X_OK) != 0) {
        nbgi_test_check(0, "CLI-setup", "the program %s is not there (set NBG_BIN)", bin);
        return 0;
    }
    if (nbgi_test_mkdtemp(prefix, g_root, sizeof g_root) == NULL) {
        nbgi_test_check(0, "CLI-setup", "cannot make a temporary directory");
        return 0;
    }
    return 1;
}

/* Runs the program under mpirun -n k (--oversubscribe, as root with Open MPI's consent variables, one OpenMP thread
 * a rank) with args (NULL-terminated, argv[0] excluded), in r->work. */
static inline void run_mpi(run_result *r, int k, const char *const *args)
{
    static char nbuf[16];
    snprintf(nbuf, sizeof nbuf, "%d", k);
    char keep[PATH_MAX];
    snprintf(keep, sizeof keep, "%s", g_bin);
    const char *mpi[64] = {"-n", nbuf, "--oversubscribe", "--bind-to", "none", keep};
    int n = 6;
    for (int i = 0; args[i] != NULL && n < 62; ++i) mpi[n++] = args[i];
    mpi[n] = NULL;
    snprintf(g_bin, sizeof g_bin, "%s", "/usr/bin/mpirun");
    setenv("OMPI_ALLOW_RUN_AS_ROOT", "1", 1);
    setenv("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1", 1);
    setenv("OMP_NUM_THREADS", "1", 1);
    /* under the sanitizer tier: Open MPI's own allocations outlive MPI_Finalize, which LeakSanitizer would report
     * as the program's; leak detection is off for the MPI runs only (the address checks stay on, and the runs
     * without mpirun keep it) */
    const char *asan = getenv("ASAN_OPTIONS");
    char *saved = asan != NULL ? strdup(asan) : NULL;
    if (saved != NULL) {
        char buf[1024];
        snprintf(buf, sizeof buf, "%s:detect_leaks=0", saved);
        setenv("ASAN_OPTIONS", buf, 1);
    }
    run_in(r, mpi);
    if (saved != NULL) {
        setenv("ASAN_OPTIONS", saved, 1);
        free(saved);
    }
    unsetenv("OMP_NUM_THREADS");
    snprintf(g_bin, sizeof g_bin, "%s", keep);
}

/* Whether the program reads shot lists (they need jansson: a FORMATS=0 build has none); prints the SKIP line when
 * it does not. */
static inline int clirun_has_shot_lists(void)
{
    run_result p;
    if (!new_case(&p)) {
        return 1;
    }
    const char *args[] = {"shots", "-n", "1", "-o", "s.jsonl", NULL};
    run_in(&p, args);
    const int none = strstr(p.err, "FORMATS=0") != NULL;
    result_free(&p);
    if (none) {
        nbgi_test_skip("shots", "this nbgrad was built without jansson (FORMATS=0): no shot lists");
    }
    return !none;
}

#endif
