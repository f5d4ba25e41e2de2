/*
 * test-golden.c -- parity of the nbgrad program with the reference nanoBragg on the golden cases.
 *
 * For every case of <golden>/cases.tsv (id, outputs, arguments; "@data/NAME" stands for <golden>/data/NAME) this
 * runs the nbgrad program (fork/exec, no shell) in a fresh temporary directory with the case's arguments plus the
 * output flags the reference was given (-floatfile, -intfile always, -noisefile or -nonoise, -pgmfile or -nopgm,
 * -noprogress) and -nodump, its output going to nbgrad.log there, and compares each output the case lists with
 * <golden>/images/ID.* by the criteria of <golden>/README.md:
 *
 *   f  float image:  Pearson correlation >= 0.99999, max|out - ref| <= 1e-4 * max|ref|, sum within 1e-5 relative
 *   i  SMV image:    identical header keys and values (numbers compared with a relative tolerance of 1e-9, other
 *                    text exactly; comma-separated lists element by element), pixels within 1 count
 *   n  SMV noise:    identical header keys and values as above, identical pixels
 *   p  PGM:          identical header bytes, pixels within 1
 *
 * A blank reference (maximum 0) or a blank output proves nothing and fails.  One line per check:
 *
 *   PASS|FAIL golden-<id>-float corr=.. maxrel=.. sumratio=..
 *   PASS|FAIL golden-<id>-int   header=.. maxdiff=.. over=.. differ=..
 *   PASS|FAIL golden-<id>-noise header=.. maxdiff=.. differ=..
 *   PASS|FAIL golden-<id>-pgm   header=.. maxdiff=.. over=.. differ=..
 *
 * followed by indented details on failure (the differing header keys, the worst pixel, the tail of nbgrad's output
 * when it failed or left an output out), and the summary line "N passed, M failed".
 *
 * Environment:
 *   NBG_GOLDEN          the golden folder (default ../shared/golden, relative to the repository root where the
 *                       tests run); when it is absent the whole test is skipped (exit status 0)
 *   NBG_BIN             the program to test (default build/nbgrad)
 *   NBG_GOLDEN_CASES    comma-separated case ids: run only these (for debugging)
 *   NBG_GOLDEN_TIMEOUT  seconds one case may run before it is killed and failed (default 120)
 *   NBG_KEEP_TMP        when set (not empty), the temporary directory is kept and its path printed
 */
#include "testutil.h"

#include <fcntl.h>
#include <limits.h>
#include <signal.h>
#include <stdint.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>

#define PATHMAX 4096

/* ------------------------------------------------------------------------------------------------------------ */
/* small utilities                                                                                               */

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static char *xstrdup(const char *s)
{
    char *d = strdup(s);
    if (d == NULL) {
        fprintf(stderr, "test-golden: out of memory\n");
        exit(2);
    }
    return d;
}

/* A growable array of strings (an argument vector, kept NULL-terminated). */
typedef struct {
    char **v;
    int n, cap;
} strvec;

static void sv_push(strvec *a, const char *s)
{
    if (a->n + 2 > a->cap) {
        a->cap = a->cap ? 2 * a->cap : 32;
        char **v = realloc(a->v, sizeof(char *) * (size_t)a->cap);
        if (v == NULL) {
            fprintf(stderr, "test-golden: out of memory\n");
            exit(2);
        }
        a->v = v;
    }
    a->v[a->n++] = s != NULL ? xstrdup(s) : NULL;
    a->v[a->n] = NULL;
}

static void sv_free(strvec *a)
{
    for (int i = 0; i < a->n; ++i) {
        free(a->v[i]);
    }
    free(a->v);
    a->v = NULL;
    a->n = a->cap = 0;
}

/* Prints the last max_lines lines of a text file, each indented with "    | ". */
static void print_tail(const char *path, int max_lines)
{
    size_t n = 0;
    char *s = nbgi_test_read_file(path, &n);
    if (s == NULL) {
        printf("    | (no output: %s cannot be read)\n", path);
        return;
    }
    while (n > 0 && (s[n - 1] == '\n' || s[n - 1] == '\r')) {
        s[--n] = '\0';
    }
    size_t start = n;
    int lines = 0;
    while (start > 0) {
        if (s[start - 1] == '\n' && ++lines >= max_lines) {
            break;
        }
        --start;
    }
    if (start > 0) {
        printf("    | ...\n");
    }
    if (n == 0) {
        printf("    | (no output)\n");
    }
    for (char *line = s + start; line < s + n && *line != '\0';) {
        char *nl = strchr(line, '\n');
        if (nl != NULL) {
            *nl = '\0';
        }
        printf("    | %s\n", line);
        if (nl == NULL) {
            break;
        }
        line = nl + 1;
    }
    free(s);
}

/* snprintf for paths: a path that does not fit is a fatal error, not a silent truncation. */
__attribute__((format(printf, 3, 4))) static void mkpath(char *buf, size_t size, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    const int n = vsnprintf(buf, size, fmt, ap);
    va_end(ap);
    if (n < 0 || (size_t)n >= size) {
        fprintf(stderr, "test-golden: path too long: %s...\n", buf);
        exit(2);
    }
}

static int file_exists(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0 && S_ISREG(st.st_mode);
}

/* ------------------------------------------------------------------------------------------------------------ */
/* running the program                                                                                           */

/*
 * Runs argv[0] with argv in directory dir, stdin from /dev/null, stdout and stderr to logpath.  Returns the exit
 * status (0..255), 128 + signal for a killed program, -1 when it ran past timeout_s (it is then killed), -2 when
 * it could not be started.
 */
static int run_program(char *const argv[], const char *dir, const char *logpath, double timeout_s, double *wall)
{
    fflush(stdout);
    fflush(stderr);
    const double t0 = now_s();
    const pid_t pid = fork();
    if (pid < 0) {
        printf("    | fork: %s\n", strerror(errno));
        return -2;
    }
    if (pid == 0) {
        setpgid(0, 0); /* its own process group, so that a timeout kills whatever it started too */
        const int log = open(logpath, O_WRONLY | O_CREAT | O_TRUNC, 0644);
        const int nul = open("/dev/null", O_RDONLY);
        if (log < 0 || nul < 0 || dup2(nul, 0) < 0 || dup2(log, 1) < 0 || dup2(log, 2) < 0) {
            _exit(126);
        }
        close(log);
        close(nul);
        if (chdir(dir) != 0) {
            fprintf(stderr, "test-golden: chdir %s: %s\n", dir, strerror(errno));
            _exit(126);
        }
        execv(argv[0], argv);
        fprintf(stderr, "test-golden: cannot run %s: %s\n", argv[0], strerror(errno));
        _exit(127);
    }
    setpgid(pid, pid); /* (both sides set it, whichever runs first) */
    int status = 0;
    for (;;) {
        const pid_t r = waitpid(pid, &status, WNOHANG);
        if (r == pid) {
            break;
        }
        if (r < 0 && errno != EINTR) {
            *wall = now_s() - t0;
            return -2;
        }
        if (now_s() - t0 > timeout_s) {
            kill(-pid, SIGKILL);
            kill(pid, SIGKILL);
            waitpid(pid, &status, 0);
            *wall = now_s() - t0;
            return -1;
        }
        const struct timespec ts = {0, 2000000}; /* 2 ms */
        nanosleep(&ts, NULL);
    }
    *wall = now_s() - t0;
    if (WIFEXITED(status)) {
        return WEXITSTATUS(status);
    }
    if (WIFSIGNALED(status)) {
        return 128 + WTERMSIG(status);
    }
    return -2;
}

/* ------------------------------------------------------------------------------------------------------------ */
/* float images                                                                                                  */

/* Describes flat index k as (fast, slow) when the image is square, else as an index. */
static void describe_index(char *buf, size_t size, size_t k, size_t npix)
{
    size_t side = (size_t)(sqrt((double)npix) + 0.5);
    if (side * side == npix && side > 0) {
        snprintf(buf, size, "(f=%zu,s=%zu)", k % side, k / side);
    } else {
        snprintf(buf, size, "index %zu", k);
    }
}

static void compare_float(const char *id, const char *out_path, const char *ref_path)
{
    char name[512];
    snprintf(name, sizeof name, "golden-%s-float", id);
    size_t nref = 0, nout = 0;
    float *ref = nbgi_test_read_file(ref_path, &nref);
    float *out = NULL;
    if (ref == NULL || nref == 0 || nref % sizeof(float) != 0) {
        nbgi_test_check(0, name, "unreadable reference %s (%zu bytes)", ref_path, nref);
        goto done;
    }
    out = nbgi_test_read_file(out_path, &nout);
    if (out == NULL) {
        nbgi_test_check(0, name, "no output file (-floatfile was not written)");
        goto done;
    }
    if (nout != nref) {
        nbgi_test_check(0, name, "size %zu bytes, reference %zu bytes (%zu vs %zu pixels)", nout, nref,
                       nout / sizeof(float), nref / sizeof(float));
        goto done;
    }
    const size_t n = nref / sizeof(float);
    double sr = 0, so = 0, maxref = 0, maxout = 0, maxdiff = -1;
    size_t worst = 0, nonfinite = 0, ref_nonfinite = 0;
    for (size_t k = 0; k < n; ++k) {
        const double r = ref[k], o = out[k];
        if (!isfinite(r)) {
            ++ref_nonfinite;
            continue;
        }
        if (!isfinite(o)) {
            if (nonfinite++ == 0) {
                worst = k;
            }
            continue;
        }
        sr += r;
        so += o;
        maxref = fmax(maxref, fabs(r));
        maxout = fmax(maxout, fabs(o));
        if (fabs(o - r) > maxdiff) {
            maxdiff = fabs(o - r);
            if (nonfinite == 0) {
                worst = k;
            }
        }
    }
    char where[64];
    describe_index(where, sizeof where, worst, n);
    if (ref_nonfinite > 0) {
        nbgi_test_check(0, name, "the reference has %zu non-finite pixels", ref_nonfinite);
        goto done;
    }
    if (maxref == 0) {
        nbgi_test_check(0, name, "blank reference (all %zu pixels 0): proves nothing", n);
        goto done;
    }
    if (nonfinite > 0) {
        nbgi_test_check(0, name, "%zu non-finite output pixels (first at %s: %g)", nonfinite, where, (double)out[worst]);
        goto done;
    }
    if (maxout == 0) {
        nbgi_test_check(0, name, "blank output (all %zu pixels 0; reference max %.6g)", n, maxref);
        goto done;
    }
    const double mr = sr / (double)n, mo = so / (double)n;
    double cov = 0, vr = 0, vo = 0;
    for (size_t k = 0; k < n; ++k) {
        const double dr = ref[k] - mr, dout = out[k] - mo;
        cov += dr * dout;
        vr += dr * dr;
        vo += dout * dout;
    }
    double corr;
    if (vr > 0 && vo > 0) {
        corr = cov / sqrt(vr * vo);
    } else {
        corr = (vr == 0 && vo == 0 && maxdiff == 0) ? 1 : 0; /* constant images: equal or not */
    }
    const double maxrel = maxdiff / maxref;
    const double sumratio = sr != 0 ? so / sr : (so == 0 ? 1 : INFINITY);
    const double sumrel = sr != 0 ? fabs(so - sr) / fabs(sr) : fabs(so - sr);
    const int ok = corr >= 0.99999 && maxrel <= 1e-4 && sumrel <= 1e-5;
    nbgi_test_check(ok, name, "corr=%.9f maxrel=%.3g sumratio=%.9f", corr, maxrel, sumratio);
    if (!ok) {
        printf("    worst pixel %s: got %.9g want %.9g; sum got %.9g want %.9g; max got %.9g want %.9g\n", where,
               (double)out[worst], (double)ref[worst], so, sr, maxout, maxref);
        printf("    need corr >= 0.99999 (%s), maxrel <= 1e-4 (%s), |sumratio-1| <= 1e-5 (%s)\n",
               corr >= 0.99999 ? "ok" : "FAILS", maxrel <= 1e-4 ? "ok" : "FAILS", sumrel <= 1e-5 ? "ok" : "FAILS");
    }
done:
    free(ref);
    free(out);
}

/* ------------------------------------------------------------------------------------------------------------ */
/* SMV images                                                                                                    */

#define SMV_MAXKEYS 128

typedef struct {
    unsigned char *data; /* the whole file */
    size_t size;
    size_t header_bytes;
    int nkeys;
    char key[SMV_MAXKEYS][64];
    char val[SMV_MAXKEYS][256];
    const char *error; /* why it could not be parsed, or NULL */
} smv_file;

static void trim(char *s)
{
    size_t n = strlen(s);
    while (n > 0 && (s[n - 1] == ' ' || s[n - 1] == '\t' || s[n - 1] == '\r' || s[n - 1] == '\n')) {
        s[--n] = '\0';
    }
    size_t i = 0;
    while (s[i] == ' ' || s[i] == '\t') {
        ++i;
    }
    memmove(s, s + i, n - i + 1);
}

static const char *smv_get(const smv_file *f, const char *key)
{
    for (int i = 0; i < f->nkeys; ++i) {
        if (strcmp(f->key[i], key) == 0) {
            return f->val[i];
        }
    }
    return NULL;
}

/* Reads and parses an SMV file: "{", then lines KEY=VALUE; (the ';' may be missing), then "}" and padding. */
static int smv_read(const char *path, smv_file *f)
{
    memset(f, 0, sizeof *f);
    f->data = nbgi_test_read_file(path, &f->size);
    if (f->data == NULL) {
        f->error = "cannot be read";
        return 0;
    }
    const char *text = (const char *)f->data;
    if (f->size < 2 || text[0] != '{') {
        f->error = "does not start with '{'";
        return 0;
    }
    /* the header text ends at '}' (or a NUL byte) */
    size_t end = 1;
    while (end < f->size && text[end] != '}' && text[end] != '\0') {
        ++end;
    }
    if (end >= f->size || text[end] != '}') {
        f->error = "header has no closing '}'";
        return 0;
    }
    size_t pos = 1;
    while (pos < end) {
        size_t eol = pos;
        while (eol < end && text[eol] != '\n') {
            ++eol;
        }
        char line[512];
        const size_t len = eol - pos < sizeof line - 1 ? eol - pos : sizeof line - 1;
        memcpy(line, text + pos, len);
        line[len] = '\0';
        pos = eol + 1;
        trim(line);
        if (line[0] == '\0') {
            continue;
        }
        char *eq = strchr(line, '=');
        if (eq == NULL) {
            f->error = "header line without '='";
            return 0;
        }
        *eq = '\0';
        char *v = eq + 1;
        trim(line);
        size_t vn = strlen(v);
        while (vn > 0 && (v[vn - 1] == ';' || v[vn - 1] == ' ' || v[vn - 1] == '\t')) {
            v[--vn] = '\0';
        }
        trim(v);
        if (f->nkeys >= SMV_MAXKEYS) {
            f->error = "too many header keys";
            return 0;
        }
        snprintf(f->key[f->nkeys], sizeof f->key[0], "%.63s", line);
        snprintf(f->val[f->nkeys], sizeof f->val[0], "%.255s", v);
        ++f->nkeys;
    }
    const char *hb = smv_get(f, "HEADER_BYTES");
    char *e = NULL;
    const long h = hb != NULL ? strtol(hb, &e, 10) : 0;
    if (hb == NULL || e == hb || *e != '\0' || h < (long)end + 1 || (size_t)h > f->size) {
        f->error = "missing or bad HEADER_BYTES";
        return 0;
    }
    f->header_bytes = (size_t)h;
    return 1;
}

static void smv_free(smv_file *f)
{
    free(f->data);
    f->data = NULL;
}

/* The pixels of an SMV file (unsigned_short, in its byte order), or NULL with *why set. */
static uint16_t *smv_pixels(const smv_file *f, size_t *npix, const char **why)
{
    const char *s1 = smv_get(f, "SIZE1"), *s2 = smv_get(f, "SIZE2"), *type = smv_get(f, "TYPE");
    const char *order = smv_get(f, "BYTE_ORDER");
    const long n1 = s1 != NULL ? atol(s1) : 0, n2 = s2 != NULL ? atol(s2) : 0;
    if (n1 <= 0 || n2 <= 0) {
        *why = "missing or bad SIZE1/SIZE2";
        return NULL;
    }
    if (type != NULL && strcmp(type, "unsigned_short") != 0) {
        *why = "TYPE is not unsigned_short";
        return NULL;
    }
    const size_t n = (size_t)n1 * (size_t)n2;
    if (f->size < f->header_bytes + 2 * n) {
        *why = "file shorter than HEADER_BYTES + 2*SIZE1*SIZE2";
        return NULL;
    }
    const int big = order != NULL && strcmp(order, "big_endian") == 0;
    uint16_t *p = malloc(sizeof(uint16_t) * n);
    if (p == NULL) {
        *why = "out of memory";
        return NULL;
    }
    const unsigned char *d = f->data + f->header_bytes;
    for (size_t k = 0; k < n; ++k) {
        p[k] = big ? (uint16_t)(d[2 * k] << 8 | d[2 * k + 1]) : (uint16_t)(d[2 * k] | d[2 * k + 1] << 8);
    }
    *npix = n;
    return p;
}

/* 1 when s is a whole number as strtod reads it. */
static int parse_number(const char *s, double *x)
{
    char *e = NULL;
    if (*s == '\0') {
        return 0;
    }
    *x = strtod(s, &e);
    return e != s && *e == '\0';
}

/* Header values are equal: comma-separated lists element by element, numbers to 1e-9 relative, text exactly. */
static int values_equal(const char *a, const char *b)
{
    if (strcmp(a, b) == 0) {
        return 1;
    }
    char ba[256], bb[256];
    snprintf(ba, sizeof ba, "%s", a);
    snprintf(bb, sizeof bb, "%s", b);
    char *sa = NULL, *sb = NULL;
    char *ta = strtok_r(ba, ",", &sa), *tb = strtok_r(bb, ",", &sb);
    while (ta != NULL && tb != NULL) {
        trim(ta);
        trim(tb);
        double x, y;
        if (parse_number(ta, &x) && parse_number(tb, &y)) {
            if (!(fabs(x - y) <= 1e-9 * fmax(fabs(x), fabs(y)))) {
                return 0;
            }
        } else if (strcmp(ta, tb) != 0) {
            return 0;
        }
        ta = strtok_r(NULL, ",", &sa);
        tb = strtok_r(NULL, ",", &sb);
    }
    return ta == NULL && tb == NULL;
}

/* Compares the header keys of out with ref; prints the differences (indented) into a buffer. */
static int smv_compare_headers(const smv_file *out, const smv_file *ref, char *detail, size_t size, int *ndiff)
{
    size_t used = 0;
    detail[0] = '\0';
    *ndiff = 0;
#define ADD(...)                                                                                                    \
    do {                                                                                                            \
        if (used < size) {                                                                                          \
            const int m_ = snprintf(detail + used, size - used, __VA_ARGS__);                                       \
            used += m_ > 0 ? (size_t)m_ : 0;                                                                        \
        }                                                                                                           \
    } while (0)
    for (int i = 0; i < ref->nkeys; ++i) {
        const char *v = smv_get(out, ref->key[i]);
        if (v == NULL) {
            ADD("    header key %s: missing (reference '%s')\n", ref->key[i], ref->val[i]);
            ++*ndiff;
        } else if (!values_equal(v, ref->val[i])) {
            ADD("    header key %s: got '%s' want '%s'\n", ref->key[i], v, ref->val[i]);
            ++*ndiff;
        }
    }
    for (int i = 0; i < out->nkeys; ++i) {
        if (smv_get(ref, out->key[i]) == NULL) {
            ADD("    header key %s: not in the reference (got '%s')\n", out->key[i], out->val[i]);
            ++*ndiff;
        }
    }
#undef ADD
    return *ndiff == 0;
}

/* An SMV comparison: kind "int" (pixels within 1) or "noise" (identical pixels). */
static void compare_smv(const char *id, const char *kind, int tol, const char *out_path, const char *ref_path)
{
    char name[512];
    snprintf(name, sizeof name, "golden-%s-%s", id, kind);
    smv_file ref, out;
    uint16_t *rp = NULL, *op = NULL;
    const char *why = NULL;
    char detail[4096];
    int ok_out = 0;
    const int ok_ref = smv_read(ref_path, &ref);
    if (ok_ref) {
        ok_out = smv_read(out_path, &out);
    } else {
        memset(&out, 0, sizeof out);
    }
    if (!ok_ref) {
        nbgi_test_check(0, name, "unreadable reference %s: %s", ref_path, ref.error);
        goto done;
    }
    if (!ok_out) {
        nbgi_test_check(0, name, "output %s", out.data == NULL ? "file not written" : out.error);
        goto done;
    }
    int ndiff = 0;
    const int hdr_ok = smv_compare_headers(&out, &ref, detail, sizeof detail, &ndiff);
    size_t nr = 0, no = 0;
    rp = smv_pixels(&ref, &nr, &why);
    if (rp == NULL) {
        nbgi_test_check(0, name, "reference pixels: %s", why);
        goto done;
    }
    op = smv_pixels(&out, &no, &why);
    if (op == NULL || no != nr) {
        nbgi_test_check(0, name, "header=%s%s output pixels: %s", hdr_ok ? "ok" : "DIFFERS",
                       hdr_ok ? "" : " (see below)", op == NULL ? why : "pixel count differs from the reference");
        fputs(detail, stdout);
        goto done;
    }
    int refmax = 0, outmax = 0, maxdiff = 0;
    size_t over = 0, differ = 0, worst = 0;
    for (size_t k = 0; k < nr; ++k) {
        refmax = rp[k] > refmax ? rp[k] : refmax;
        outmax = op[k] > outmax ? op[k] : outmax;
        const int d = abs((int)op[k] - (int)rp[k]);
        if (d > 0) {
            ++differ;
        }
        if (d > tol) {
            ++over;
        }
        if (d > maxdiff) {
            maxdiff = d;
            worst = k;
        }
    }
    if (refmax == 0) {
        nbgi_test_check(0, name, "blank reference (all %zu pixels 0): proves nothing", nr);
        goto done;
    }
    if (outmax == 0) {
        nbgi_test_check(0, name, "blank output (all %zu pixels 0; reference max %d)", nr, refmax);
        goto done;
    }
    const int ok = hdr_ok && over == 0;
    char hdr[64];
    if (hdr_ok) {
        snprintf(hdr, sizeof hdr, "ok(%d keys)", ref.nkeys);
    } else {
        snprintf(hdr, sizeof hdr, "%d-keys-differ", ndiff);
    }
    nbgi_test_check(ok, name, "header=%s maxdiff=%d over%d=%zu differ=%zu/%zu refmax=%d", hdr, maxdiff, tol, over,
                   differ, nr, refmax);
    if (!ok) {
        fputs(detail, stdout);
        if (over > 0) {
            const char *s1 = smv_get(&ref, "SIZE1");
            const long w = s1 != NULL ? atol(s1) : 0;
            printf("    worst pixel (f=%ld,s=%ld): got %d want %d\n", w > 0 ? (long)(worst % (size_t)w) : 0L,
                   w > 0 ? (long)(worst / (size_t)w) : (long)worst, op[worst], rp[worst]);
        }
    }
done:
    free(rp);
    free(op);
    smv_free(&ref);
    smv_free(&out);
}

/* ------------------------------------------------------------------------------------------------------------ */
/* PGM                                                                                                           */

/* Parses a binary PGM ("P5"): sets the header length (up to and including the whitespace byte after maxval). */
static int pgm_parse(const unsigned char *d, size_t n, size_t *hlen, long *w, long *h, long *maxval)
{
    if (n < 2 || d[0] != 'P' || d[1] != '5') {
        return 0;
    }
    size_t p = 2;
    long vals[3];
    for (int k = 0; k < 3; ++k) {
        for (;;) { /* skip whitespace and comments */
            while (p < n && (d[p] == ' ' || d[p] == '\t' || d[p] == '\n' || d[p] == '\r')) {
                ++p;
            }
            if (p < n && d[p] == '#') {
                while (p < n && d[p] != '\n') {
                    ++p;
                }
                continue;
            }
            break;
        }
        if (p >= n || d[p] < '0' || d[p] > '9') {
            return 0;
        }
        long v = 0;
        while (p < n && d[p] >= '0' && d[p] <= '9') {
            v = 10 * v + (d[p++] - '0');
            if (v > 1000000000L) {
                return 0;
            }
        }
        vals[k] = v;
    }
    if (p >= n) {
        return 0;
    }
    ++p; /* the single whitespace byte before the raster */
    *w = vals[0];
    *h = vals[1];
    *maxval = vals[2];
    *hlen = p;
    return *w > 0 && *h > 0 && *maxval > 0 && *maxval < 256;
}

/* The header text with newlines shown as \n, for messages. */
static void show_header(const unsigned char *d, size_t n, char *buf, size_t size)
{
    size_t j = 0;
    for (size_t i = 0; i < n && j + 5 < size; ++i) {
        if (d[i] == '\n') {
            buf[j++] = '\\';
            buf[j++] = 'n';
        } else if (d[i] < 32 || d[i] > 126) {
            buf[j++] = '?';
        } else {
            buf[j++] = (char)d[i];
        }
    }
    buf[j] = '\0';
}

static void compare_pgm(const char *id, const char *out_path, const char *ref_path)
{
    char name[512];
    snprintf(name, sizeof name, "golden-%s-pgm", id);
    size_t nr = 0, no = 0, hr = 0, ho = 0;
    long wr, hgt_r, mr, wo, hgt_o, mo;
    unsigned char *ref = nbgi_test_read_file(ref_path, &nr);
    unsigned char *out = NULL;
    if (ref == NULL || !pgm_parse(ref, nr, &hr, &wr, &hgt_r, &mr) || nr < hr + (size_t)(wr * hgt_r)) {
        nbgi_test_check(0, name, "unreadable reference %s", ref_path);
        goto done;
    }
    out = nbgi_test_read_file(out_path, &no);
    if (out == NULL) {
        nbgi_test_check(0, name, "no output file (-pgmfile was not written)");
        goto done;
    }
    if (!pgm_parse(out, no, &ho, &wo, &hgt_o, &mo) || no < ho + (size_t)(wo * hgt_o)) {
        nbgi_test_check(0, name, "output is not a whole binary PGM (%zu bytes)", no);
        goto done;
    }
    const int hdr_ok = ho == hr && memcmp(out, ref, hr) == 0;
    if (wo != wr || hgt_o != hgt_r) {
        nbgi_test_check(0, name, "output is %ldx%ld, reference %ldx%ld", wo, hgt_o, wr, hgt_r);
        goto done;
    }
    const size_t n = (size_t)(wr * hgt_r);
    const unsigned char *rp = ref + hr, *op = out + ho;
    int refmax = 0, outmax = 0, maxdiff = 0;
    size_t over = 0, differ = 0, worst = 0;
    for (size_t k = 0; k < n; ++k) {
        refmax = rp[k] > refmax ? rp[k] : refmax;
        outmax = op[k] > outmax ? op[k] : outmax;
        const int d = abs((int)op[k] - (int)rp[k]);
        differ += d > 0;
        over += d > 1;
        if (d > maxdiff) {
            maxdiff = d;
            worst = k;
        }
    }
    if (refmax == 0) {
        nbgi_test_check(0, name, "blank reference (all %zu pixels 0): proves nothing", n);
        goto done;
    }
    if (outmax == 0) {
        nbgi_test_check(0, name, "blank output (all %zu pixels 0; reference max %d)", n, refmax);
        goto done;
    }
    const int ok = hdr_ok && over == 0 && no - ho == nr - hr;
    nbgi_test_check(ok, name, "header=%s maxdiff=%d over1=%zu differ=%zu/%zu refmax=%d", hdr_ok ? "ok" : "DIFFERS",
                   maxdiff, over, differ, n, refmax);
    if (!ok) {
        char a[512], b[512];
        show_header(out, ho, a, sizeof a);
        show_header(ref, hr, b, sizeof b);
        if (!hdr_ok) {
            printf("    header: got '%s' want '%s'\n", a, b);
        }
        if (no - ho != nr - hr) {
            printf("    %zu bytes after the header, reference %zu\n", no - ho, nr - hr);
        }
        if (over > 0) {
            printf("    worst pixel (f=%zu,s=%zu): got %d want %d\n", worst % (size_t)wr, worst / (size_t)wr, op[worst],
                   rp[worst]);
        }
    }
done:
    free(ref);
    free(out);
}

/* ------------------------------------------------------------------------------------------------------------ */
/* the cases                                                                                                     */

typedef struct {
    char *id;
    char *outputs;
    char *args; /* the arguments, whitespace-separated */
} gcase;

/* Reads cases.tsv: "id<TAB>outputs<TAB>arguments" lines; '#' lines and blank lines are ignored. */
static int read_cases(const char *path, gcase **cases, int *ncases)
{
    size_t n = 0;
    char *text = nbgi_test_read_file(path, &n);
    if (text == NULL) {
        return 0;
    }
    int cap = 0;
    *cases = NULL;
    *ncases = 0;
    for (char *save = NULL, *line = strtok_r(text, "\n", &save); line != NULL; line = strtok_r(NULL, "\n", &save)) {
        size_t len = strlen(line);
        while (len > 0 && line[len - 1] == '\r') {
            line[--len] = '\0';
        }
        if (line[0] == '#' || strspn(line, " \t") == len) {
            continue;
        }
        char *t1 = strchr(line, '\t');
        char *t2 = t1 != NULL ? strchr(t1 + 1, '\t') : NULL;
        if (t2 == NULL) {
            printf("    bad line in %s: %s\n", path, line);
            free(text);
            return 0;
        }
        *t1 = *t2 = '\0';
        if (*ncases == cap) {
            cap = cap ? 2 * cap : 64;
            gcase *c = realloc(*cases, sizeof(gcase) * (size_t)cap);
            if (c == NULL) {
                free(text);
                return 0;
            }
            *cases = c;
        }
        gcase *c = &(*cases)[(*ncases)++];
        c->id = xstrdup(line);
        trim(c->id);
        c->outputs = xstrdup(t1 + 1);
        trim(c->outputs);
        c->args = xstrdup(t2 + 1);
    }
    free(text);
    return 1;
}

/* Replaces every "@data/" in token by "<golden>/data/". */
static void expand_token(const char *tok, const char *golden, char *buf, size_t size)
{
    size_t j = 0;
    buf[0] = '\0';
    for (const char *p = tok; *p != '\0' && j + 1 < size;) {
        if (strncmp(p, "@data/", 6) == 0) {
            const int m = snprintf(buf + j, size - j, "%s/data/", golden);
            j += m > 0 ? (size_t)m : 0;
            p += 6;
        } else {
            buf[j++] = *p++;
            buf[j] = '\0';
        }
    }
    if (j >= size) {
        buf[size - 1] = '\0';
    }
}

static void run_case(const gcase *c, const char *bin, const char *golden, const char *tmproot, double timeout_s)
{
    char dir[PATHMAX], log[PATHMAX], buf[PATHMAX];
    mkpath(dir, sizeof dir, "%s/%s", tmproot, c->id);
    mkpath(log, sizeof log, "%s/nbgrad.log", dir);
    const int want_f = strchr(c->outputs, 'f') != NULL, want_i = strchr(c->outputs, 'i') != NULL;
    const int want_n = strchr(c->outputs, 'n') != NULL, want_p = strchr(c->outputs, 'p') != NULL;
    char fpath[PATHMAX], ipath[PATHMAX], npath[PATHMAX], ppath[PATHMAX];
    mkpath(fpath, sizeof fpath, "%s/%s.float.bin", dir, c->id);
    mkpath(ipath, sizeof ipath, "%s/%s.int.img", dir, c->id);
    mkpath(npath, sizeof npath, "%s/%s.noise.img", dir, c->id);
    mkpath(ppath, sizeof ppath, "%s/%s.pgm", dir, c->id);

    const char *kinds[4];
    int nk = 0;
    if (want_f) kinds[nk++] = "float";
    if (want_i) kinds[nk++] = "int";
    if (want_n) kinds[nk++] = "noise";
    if (want_p) kinds[nk++] = "pgm";
    if (nk == 0 || strspn(c->outputs, "finp") != strlen(c->outputs)) {
        char name[512];
        snprintf(name, sizeof name, "golden-%s", c->id);
        nbgi_test_check(0, name, "bad outputs field '%s' in cases.tsv", c->outputs);
        return;
    }
    if (mkdir(dir, 0755) != 0) {
        for (int k = 0; k < nk; ++k) {
            char name[512];
            snprintf(name, sizeof name, "golden-%s-%s", c->id, kinds[k]);
            nbgi_test_check(0, name, "cannot make %s: %s", dir, strerror(errno));
        }
        return;
    }

    strvec av = {0};
    sv_push(&av, bin);
    char *args = xstrdup(c->args);
    for (char *save = NULL, *t = strtok_r(args, " \t", &save); t != NULL; t = strtok_r(NULL, " \t", &save)) {
        expand_token(t, golden, buf, sizeof buf);
        sv_push(&av, buf);
    }
    free(args);
    if (want_f) {
        sv_push(&av, "-floatfile");
        sv_push(&av, fpath);
    }
    sv_push(&av, "-intfile"); /* the reference always wrote one */
    sv_push(&av, ipath);
    if (want_n) {
        sv_push(&av, "-noisefile");
        sv_push(&av, npath);
    } else {
        sv_push(&av, "-nonoise");
    }
    if (want_p) {
        sv_push(&av, "-pgmfile");
        sv_push(&av, ppath);
    } else {
        sv_push(&av, "-nopgm");
    }
    sv_push(&av, "-noprogress");
    sv_push(&av, "-nodump");

    double wall = 0;
    const int rc = run_program(av.v, dir, log, timeout_s, &wall);
    if (rc != 0) {
        char why[128];
        if (rc == -1) {
            snprintf(why, sizeof why, "nbgrad ran past %.0f s and was killed", timeout_s);
        } else if (rc == -2) {
            snprintf(why, sizeof why, "nbgrad could not be run");
        } else if (rc > 128) {
            snprintf(why, sizeof why, "nbgrad died of signal %d (%s)", rc - 128, strsignal(rc - 128));
        } else {
            snprintf(why, sizeof why, "nbgrad exited with status %d", rc);
        }
        for (int k = 0; k < nk; ++k) {
            char name[512];
            snprintf(name, sizeof name, "golden-%s-%s", c->id, kinds[k]);
            nbgi_test_check(0, name, "%s (%.2f s)", why, wall);
        }
        printf("    command:");
        for (int i = 0; i < av.n; ++i) {
            printf(" %s", av.v[i]);
        }
        printf("\n");
        print_tail(log, 15);
        sv_free(&av);
        return;
    }
    sv_free(&av);

    char ref[PATHMAX];
    if (want_f) {
        mkpath(ref, sizeof ref, "%s/images/%s.float.bin", golden, c->id);
        compare_float(c->id, fpath, ref);
    }
    if (want_i) {
        mkpath(ref, sizeof ref, "%s/images/%s.int.img", golden, c->id);
        compare_smv(c->id, "int", 1, ipath, ref);
    }
    if (want_n) {
        mkpath(ref, sizeof ref, "%s/images/%s.noise.img", golden, c->id);
        compare_smv(c->id, "noise", 0, npath, ref);
    }
    if (want_p) {
        mkpath(ref, sizeof ref, "%s/images/%s.pgm", golden, c->id);
        compare_pgm(c->id, ppath, ref);
    }
    if ((want_f && !file_exists(fpath)) || (want_i && !file_exists(ipath)) || (want_n && !file_exists(npath)) ||
        (want_p && !file_exists(ppath))) {
        printf("    nbgrad left an output out; its output:\n");
        print_tail(log, 15);
    }
    if (wall > 10) {
        printf("    (%s: nbgrad took %.1f s)\n", c->id, wall);
    }
}

int main(void)
{
    setvbuf(stdout, NULL, _IOLBF, 0);
    const char *g = nbgi_test_golden_dir();
    if (g == NULL) {
        const char *env = getenv("NBG_GOLDEN");
        nbgi_test_skip("golden", "(golden folder %s not found; set NBG_GOLDEN)",
                      env != NULL && env[0] != '\0' ? env : "../shared/golden");
        return nbgi_test_summary();
    }
    char golden[PATHMAX], cases_path[PATHMAX], bin[PATHMAX];
    if (realpath(g, golden) == NULL) {
        nbgi_test_check(0, "golden", "cannot resolve %s: %s", g, strerror(errno));
        return nbgi_test_summary();
    }
    const char *b = getenv("NBG_BIN");
    if (b == NULL || b[0] == '\0') {
        b = "build/nbgrad";
    }
    if (realpath(b, bin) == NULL || access(bin, X_OK) != 0) {
        nbgi_test_check(0, "golden-bin", "no runnable program %s (build it, or set NBG_BIN)", b);
        return nbgi_test_summary();
    }
    mkpath(cases_path, sizeof cases_path, "%s/cases.tsv", golden);
    gcase *cases = NULL;
    int ncases = 0;
    if (!read_cases(cases_path, &cases, &ncases) || ncases == 0) {
        nbgi_test_check(0, "golden-cases", "cannot read the cases from %s", cases_path);
        return nbgi_test_summary();
    }
    double timeout_s = 120;
    const char *to = getenv("NBG_GOLDEN_TIMEOUT");
    if (to != NULL && to[0] != '\0' && atof(to) > 0) {
        timeout_s = atof(to);
    }
    const char *only = getenv("NBG_GOLDEN_CASES");
    char tmproot[PATHMAX];
    if (nbgi_test_mkdtemp("nbg-golden-", tmproot, sizeof tmproot) == NULL) {
        nbgi_test_check(0, "golden-tmp", "cannot make a temporary directory");
        return nbgi_test_summary();
    }
    printf("golden parity: %s against %s (%d cases%s%s)\n", bin, golden, ncases, only != NULL && only[0] ? ", only " : "",
           only != NULL && only[0] ? only : "");
    const double t0 = now_s();
    for (int i = 0; i < ncases; ++i) {
        if (nbgi_test_selected(only, cases[i].id)) {
            run_case(&cases[i], bin, golden, tmproot, timeout_s);
        }
    }
    /* ids asked for that no case has */
    if (only != NULL && only[0] != '\0') {
        char *list = xstrdup(only);
        for (char *save = NULL, *t = strtok_r(list, ", ", &save); t != NULL; t = strtok_r(NULL, ", ", &save)) {
            int found = 0;
            for (int i = 0; i < ncases && !found; ++i) {
                found = strcmp(cases[i].id, t) == 0;
            }
            if (!found) {
                char name[512];
                snprintf(name, sizeof name, "golden-%s", t);
                nbgi_test_check(0, name, "no such case in %s (NBG_GOLDEN_CASES)", cases_path);
            }
        }
        free(list);
    }
    printf("golden parity: %.1f s\n", now_s() - t0);
    const char *keep = getenv("NBG_KEEP_TMP");
    if (keep != NULL && keep[0] != '\0') {
        printf("kept the outputs in %s\n", tmproot);
    } else {
        nbgi_test_rmtree(tmproot);
    }
    for (int i = 0; i < ncases; ++i) {
        free(cases[i].id);
        free(cases[i].outputs);
        free(cases[i].args);
    }
    free(cases);
    return nbgi_test_summary();
}
