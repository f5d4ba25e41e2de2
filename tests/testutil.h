/*
 * testutil.h -- a tiny header-only test library for the nbgrad test programs.
 *
 * Every check prints one line:
 *
 *     PASS <id> <message>
 *     FAIL <id> <message>
 *     SKIP <id> <reason>
 *
 * and nbgi_test_summary() prints the last line of the program's output, exactly "N passed, M failed" (followed by
 * ", K skipped" when something was skipped), and returns the exit status: 0 iff no check failed.  tests/run-all.sh
 * reads that line.
 *
 * Helpers: the golden folder (nbgi_test_golden_dir), a fresh temporary directory that is removed recursively
 * afterwards (nbgi_test_mkdtemp, nbgi_test_rmtree), reading a whole file (nbgi_test_read_file), the correlation of
 * two images (nbgi_test_corr) and case selection from a comma-separated list (nbgi_test_selected).
 *
 * Everything is static (inline), so a test includes this header once and needs nothing else.
 */
#ifndef NBG_TESTUTIL_H
#define NBG_TESTUTIL_H

#ifndef _GNU_SOURCE
#define _GNU_SOURCE /* nftw, mkdtemp */
#endif

#include "nbgrad.h"

#include <errno.h>
#include <ftw.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

typedef struct {
    int passed, failed, skipped;
} nbgi_test_counts;

/* The counters of this program (one set per program). */
static inline nbgi_test_counts *nbgi_test_counts_(void)
{
    static nbgi_test_counts counts;
    return &counts;
}

/* Prints "<word> <id>[ <message>]" and a newline. */
static inline void nbgi_test_vline_(const char *word, const char *id, const char *fmt, va_list ap)
{
    printf("%s %s", word, id != NULL ? id : "?");
    if (fmt != NULL && fmt[0] != '\0') {
        printf(" ");
        vprintf(fmt, ap);
    }
    printf("\n");
    fflush(stdout);
}

/* Records a check: prints "PASS <id> <msg>" when ok, else "FAIL <id> <msg>".  Returns ok (0 or 1). */
static inline int nbgi_test_check(int ok, const char *id, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    nbgi_test_vline_(ok ? "PASS" : "FAIL", id, fmt, ap);
    va_end(ap);
    if (ok) {
        ++nbgi_test_counts_()->passed;
    } else {
        ++nbgi_test_counts_()->failed;
    }
    return ok != 0;
}

/*
 * Checks that got is within rtol of expected, relative to |expected| (|got - expected| <= rtol * |expected|; when
 * expected is 0, |got| <= rtol).  Non-finite values are their own case: an expected NaN passes only for a NaN, an
 * expected +-Inf only for the same infinity, and a non-finite got never matches a finite expected.  The message
 * is printed after the id; on failure the two values (%.17g) and the relative error follow it.
 */
static inline int nbgi_test_rel(double got, double expected, double rtol, const char *id, const char *fmt, ...)
{
    int ok;
    double rel = 0;
    if (isnan(expected) || isnan(got)) {
        ok = isnan(expected) && isnan(got);
        rel = NAN;
    } else if (isinf(expected) || isinf(got)) {
        ok = got == expected;
        rel = ok ? 0 : INFINITY;
    } else {
        const double diff = fabs(got - expected);
        rel = expected != 0 ? diff / fabs(expected) : diff;
        ok = rel <= rtol;
    }
    va_list ap;
    va_start(ap, fmt);
    printf("%s %s", ok ? "PASS" : "FAIL", id != NULL ? id : "?");
    if (fmt != NULL && fmt[0] != '\0') {
        printf(" ");
        vprintf(fmt, ap);
    }
    va_end(ap);
    if (!ok) {
        printf(" (got %.17g, expected %.17g, rel. error %.3g > %.3g)", got, expected, rel, rtol);
    }
    printf("\n");
    fflush(stdout);
    if (ok) {
        ++nbgi_test_counts_()->passed;
    } else {
        ++nbgi_test_counts_()->failed;
    }
    return ok;
}

/* Records a skipped check: prints "SKIP <id> <reason>". */
static inline void nbgi_test_skip(const char *id, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    nbgi_test_vline_("SKIP", id, fmt, ap);
    va_end(ap);
    ++nbgi_test_counts_()->skipped;
}

/* Entry j of an array a call may have left unallocated (a refinement result's value, sigma, ... after a failed
 * refinement): NAN when it is NULL, so that a failure's message can still print it. */
#define NBGI_AT(a, j) ((a) != NULL ? (double)(a)[j] : NAN)

/* Prints "N passed, M failed" (", K skipped" when any) as the last line; returns 0 iff nothing failed. */
static inline int nbgi_test_summary(void)
{
    const nbgi_test_counts *c = nbgi_test_counts_();
    printf("%d passed, %d failed", c->passed, c->failed);
    if (c->skipped > 0) {
        printf(", %d skipped", c->skipped);
    }
    printf("\n");
    fflush(stdout);
    return c->failed == 0 ? 0 : 1;
}

/* 1 when path names an existing directory. */
static inline int nbgi_test_is_dir(const char *path)
{
    struct stat st;
    return path != NULL && stat(path, &st) == 0 && S_ISDIR(st.st_mode);
}

/*
 * The folder of golden reference images: $NBG_GOLDEN when set and not empty, else ../shared/golden (relative to
 * the repository root, where the tests run).  NULL when that directory does not exist.
 */
static inline const char *nbgi_test_golden_dir(void)
{
    const char *d = getenv("NBG_GOLDEN");
    if (d == NULL || d[0] == '\0') {
        d = "../shared/golden";
    }
    return nbgi_test_is_dir(d) ? d : NULL;
}

/*
 * Makes a fresh directory $TMPDIR/<prefix>XXXXXX (or under /tmp) and writes its path to buf.  Returns buf, or
 * NULL (with a message on stderr) on failure.
 */
static inline char *nbgi_test_mkdtemp(const char *prefix, char *buf, size_t size)
{
    const char *base = getenv("TMPDIR");
    if (base == NULL || base[0] == '\0' || !nbgi_test_is_dir(base)) {
        base = "/tmp";
    }
    const int n = snprintf(buf, size, "%s/%sXXXXXX", base, prefix != NULL ? prefix : "nbg-test-");
    if (n < 0 || (size_t)n >= size) {
        fprintf(stderr, "nbgi_test_mkdtemp: path too long\n");
        return NULL;
    }
    if (mkdtemp(buf) == NULL) {
        fprintf(stderr, "nbgi_test_mkdtemp: %s: %s\n", buf, strerror(errno));
        return NULL;
    }
    return buf;
}

static inline int nbgi_test_rmtree_one_(const char *path, const struct stat *st, int flag, struct FTW *ftw)
{
    (void)st;
    (void)ftw;
    if ((flag == FTW_DP ? rmdir(path) : unlink(path)) != 0) {
        fprintf(stderr, "nbgi_test_rmtree: %s: %s\n", path, strerror(errno));
    }
    return 0; /* go on regardless */
}

/* Removes path and everything under it (symbolic links are removed, not followed).  Returns 0 on success. */
static inline int nbgi_test_rmtree(const char *path)
{
    if (path == NULL || path[0] == '\0' || strcmp(path, "/") == 0) {
        return -1;
    }
    struct stat st;
    if (lstat(path, &st) != 0) {
        return errno == ENOENT ? 0 : -1;
    }
    nftw(path, nbgi_test_rmtree_one_, 16, FTW_DEPTH | FTW_PHYS);
    return lstat(path, &st) == 0 ? -1 : 0;
}

/*
 * Reads a whole file.  Returns a malloc'ed buffer (with one extra NUL byte after the contents, so text can be
 * used as a string) and stores the size in *size; NULL when the file cannot be read.
 */
static inline void *nbgi_test_read_file(const char *path, size_t *size)
{
    FILE *f = fopen(path, "rb");
    if (f == NULL) {
        return NULL;
    }
    size_t cap = 1 << 16, n = 0;
    char *buf = (char *)malloc(cap + 1);
    while (buf != NULL) {
        n += fread(buf + n, 1, cap - n, f);
        if (n < cap) {
            break;
        }
        cap *= 2;
        char *b = (char *)realloc(buf, cap + 1);
        if (b == NULL) {
            free(buf);
        }
        buf = b;
    }
    const int err = ferror(f);
    fclose(f);
    if (buf == NULL || err) {
        free(buf);
        return NULL;
    }
    buf[n] = '\0';
    if (size != NULL) {
        *size = n;
    }
    return buf;
}

/* Pearson correlation of two float images of n pixels; 0 when either is constant. */
static inline double nbgi_test_corr(const float *a, const float *b, size_t n)
{
    double ma = 0, mb = 0, sab = 0, saa = 0, sbb = 0;
    for (size_t i = 0; i < n; ++i) {
        ma += a[i];
        mb += b[i];
    }
    ma /= (double)n;
    mb /= (double)n;
    for (size_t i = 0; i < n; ++i) {
        const double x = a[i] - ma, y = b[i] - mb;
        sab += x * y;
        saa += x * x;
        sbb += y * y;
    }
    return (saa > 0 && sbb > 0) ? sab / sqrt(saa * sbb) : 0;
}

/* The largest |a - b| over n pixels relative to a's largest |value|; INFINITY when a is blank (no check on a blank
 * image). */
static inline double nbgi_test_max_rel_diff(const float *a, const float *b, size_t n)
{
    double m = 0, d = 0;
    for (size_t i = 0; i < n; ++i) {
        m = fmax(m, fabs(a[i]));
        d = fmax(d, fabs((double)a[i] - b[i]));
    }
    return m > 0 ? d / m : INFINITY;
}

/* 1 when id is in the comma-separated list (spaces around entries ignored), or the list is NULL or empty. */
static inline int nbgi_test_selected(const char *list, const char *id)
{
    if (list == NULL || list[0] == '\0') {
        return 1;
    }
    const size_t n = strlen(id);
    for (const char *p = list; *p != '\0';) {
        while (*p == ',' || *p == ' ') {
            ++p;
        }
        const char *e = p;
        while (*e != '\0' && *e != ',') {
            ++e;
        }
        const char *q = e;
        while (q > p && q[-1] == ' ') {
            --q;
        }
        if ((size_t)(q - p) == n && strncmp(p, id, n) == 0) {
            return 1;
        }
        p = e;
    }
    return 0;
}

/* A small still the gradient tests start from: a cubic 100 A cell turned by the misset 3 4 5 deg, N = 5,
 * default_F 100, 48 x 48 pixels at 100 mm, one subpixel, polarization 0.5. */
static inline void nbgi_test_still(nbg_experiment *e)
{
    nbg_experiment_default(e);
    e->has_cell = 1;
    const double cell[6] = {100, 100, 100, 90, 90, 90};
    memcpy(e->cell, cell, sizeof cell);
    e->default_F = 100;
    e->Na = e->Nb = e->Nc = 5;
    e->lambda = 1;
    e->distance = 100;
    e->fpixels = e->spixels = 48;
    e->oversample = 1;
    e->polarization = 0.5;
    e->misset[0] = 3;
    e->misset[1] = 4;
    e->misset[2] = 5;
}

/* Two panels side by side in the plane (NBG_PANELS_PLANE, groups 0 and 1): 40 x 32 and 24 x 32 pixels of 0.4 mm,
 * 4 pixels apart, 60 mm from a triclinic crystal (N = 5, default_F 100), one subpixel.  pan is the caller's. */
static inline void nbgi_test_two_panels(nbg_experiment *e, nbg_panel pan[2])
{
    nbg_experiment_default(e);
    e->has_cell = 1;
    const double cell[6] = {70, 80, 90, 75, 85, 95};
    memcpy(e->cell, cell, sizeof cell);
    e->misset[0] = 10, e->misset[1] = 5, e->misset[2] = 3;
    e->default_F = 100;
    e->Na = e->Nb = e->Nc = 5;
    e->lambda = 1;
    e->distance = 60;
    e->pixel = 0.4;
    e->fpixels = 68;
    e->spixels = 32;
    e->oversample = 1;
    memset(pan, 0, 2 * sizeof *pan);
    pan[0].fpixels = 40, pan[0].spixels = 32;
    pan[1].fpixels = 24, pan[1].spixels = 32;
    for (int k = 0; k < 2; ++k) {
        pan[k].fast[0] = 1, pan[k].slow[1] = 1;
        pan[k].group = k;
    }
    pan[1].origin[0] = 44 * e->pixel;
    e->panels = pan;
    e->npanels = 2;
    e->panel_frame = NBG_PANELS_PLANE;
}

/* The npanels panels of e (their vectors in e's detector plane's frame, NBG_PANELS_PLANE) as panels fixed in the lab
 * frame where the plane puts them (e's motions not applied): each axis and origin the combination of the report's
 * fdet, sdet, odet and pix0.  out (npanels) receives copies of e's panels with those vectors; nbg_describe's status. */
static inline int nbgi_test_panels_lab(nbg_ctx *ctx, const nbg_experiment *e, nbg_panel *out)
{
    nbg_experiment ep = *e;
    ep.motions = NULL;
    ep.nmotions = 0;
    nbg_report r;
    const int rc = nbg_describe(ctx, &ep, &r);
    for (int k = 0; rc == NBG_OK && k < e->npanels; ++k) {
        const nbg_panel *p = &e->panels[k];
        out[k] = *p;
        for (int x = 0; x < 3; ++x) {
            out[k].fast[x] = p->fast[0] * r.fdet[x] + p->fast[1] * r.sdet[x] + p->fast[2] * r.odet[x];
            out[k].slow[x] = p->slow[0] * r.fdet[x] + p->slow[1] * r.sdet[x] + p->slow[2] * r.odet[x];
            out[k].origin[x] = 1000 * r.pix0[x] + p->origin[0] * r.fdet[x] + p->origin[1] * r.sdet[x] +
                               p->origin[2] * r.odet[x];
        }
    }
    return rc;
}

/* e's panels written as a DIALS experiment list at path (and their image file nx, or NULL, as the list's image set):
 * *r e's report, *g its geometry (one frame) and lab (e->npanels) its panels in DIALS's frame, as the list holds
 * them.  The first failing call's status. */
static inline int nbgi_test_write_panel_list(nbg_ctx *ctx, const nbg_experiment *e, const char *path, const char *nx,
                                             nbg_report *r, nbg_geometry *g, nbg_panel *lab)
{
    int rc = nbg_describe(ctx, e, r);
    rc = rc == NBG_OK ? nbg_geometry_from_report(ctx, e, r, 1, g) : rc;
    rc = rc == NBG_OK ? nbg_panels_from_report(ctx, e, r, lab, e->npanels) : rc;
    return rc == NBG_OK ? nbg_write_expt_panels(ctx, path, g, lab, e->npanels, nx) : rc;
}

/* A kappa goniometer on g (PHI inside KAPPA inside OMEGA at 30, -40 and 12.5 deg, scanning KAPPA: its fixed and
 * setting rotations both turn), and g->axis the laboratory's scan axis, S unit(KAPPA).  nbg_goniometer_derive's
 * status. */
static inline int nbgi_test_kappa(nbg_geometry *g)
{
    nbg_goniometer *gn = &g->goniometer;
    static const double axes[3][3] = {{1, 0, 0}, {0.64278761, -0.76604444, 0}, {1, 0, 0}};
    static const double angles[3] = {30, -40, 12.5};
    static const char *const names[3] = {"PHI", "KAPPA", "OMEGA"};
    memset(gn, 0, sizeof *gn);
    gn->naxes = 3;
    gn->scan_axis = 1;
    for (int i = 0; i < 3; ++i) {
        memcpy(gn->axes[i], axes[i], sizeof axes[i]);
        gn->angles[i] = angles[i];
        snprintf(gn->names[i], sizeof gn->names[i], "%s", names[i]);
    }
    const int rc = nbg_goniometer_derive(NULL, gn, "kappa");
    const double *e = gn->axes[1], n = sqrt(e[0] * e[0] + e[1] * e[1] + e[2] * e[2]);
    for (int i = 0; i < 3; ++i)
        g->axis[i] = (gn->setting[3 * i] * e[0] + gn->setting[3 * i + 1] * e[1] + gn->setting[3 * i + 2] * e[2]) / n;
    return rc;
}

/* One check each (id-naxes, -names, -axes, -angles, -scan-axis) that got's multi-axis goniometer is want's: the
 * count, names and scan axis exactly, the axes and angles (scan axis's included) to tol. */
static inline void nbgi_test_same_goniometer(const nbg_goniometer *got, const nbg_goniometer *want, double tol,
                                             const char *id)
{
    char tag[160];
    const int n = got->naxes == want->naxes && want->naxes > 0 && want->naxes <= NBG_GONIO_MAX_AXES ? want->naxes : 0;
    snprintf(tag, sizeof tag, "%s-naxes", id);
    nbgi_test_check(n > 0, tag, "%d axes (want %d)", got->naxes, want->naxes);
    int names = n > 0;
    double da = 0, dang = 0;
    for (int i = 0; i < n; ++i) {
        names = names && strcmp(got->names[i], want->names[i]) == 0;
        for (int j = 0; j < 3; ++j)
            da = fmax(da, fabs(got->axes[i][j] - want->axes[i][j]));
        dang = fmax(dang, fabs(got->angles[i] - want->angles[i]));
    }
    snprintf(tag, sizeof tag, "%s-names", id);
    nbgi_test_check(names, tag, "the names, innermost first: %s, %s, ...", n > 0 ? got->names[0] : "-",
                    n > 1 ? got->names[1] : "-");
    snprintf(tag, sizeof tag, "%s-axes", id);
    nbgi_test_check(n > 0 && da <= tol, tag, "the axes within %g (max difference %.3g)", tol, da);
    snprintf(tag, sizeof tag, "%s-angles", id);
    nbgi_test_check(n > 0 && dang <= tol, tag, "the angles within %g deg (max difference %.3g)", tol, dang);
    snprintf(tag, sizeof tag, "%s-scan-axis", id);
    nbgi_test_check(n > 0 && got->scan_axis == want->scan_axis, tag, "scan axis %d (want %d)", got->scan_axis,
                    want->scan_axis);
}

#endif /* NBG_TESTUTIL_H */
