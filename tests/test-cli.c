/*
 * test-cli.c -- the nbgrad program from the outside: exit codes, messages, and which files it leaves.
 *
 * Runs $NBG_BIN (default build/nbgrad, relative to the repository root where the tests run) by fork/exec in a
 * fresh working directory per case, capturing stdout and stderr in files beside (not inside) that directory.
 *
 *   - -h / --help exit 0 and list the flags.
 *   - Every bad input (unknown flag, missing value, negative pixel count, zero-volume cell, unreadable or malformed
 *     files, NaN values, bad mask, bad mosaic domain count) exits non-zero, names the problem on stderr and leaves
 *     no file behind (the -floatfile/-intfile paths given are checked, and the working directory must hold only
 *     the inputs put there).
 *   - Source files: a '#' comment line changes nothing.  -misset_seed without -misset random changes nothing.
 *   - Fdump.bin: written by a run with -hkl, read back by a run without it (identical image), not written with
 *     -nodump.  With no output flag nothing is written and the program says so.
 *   - The printed statistics (max_I and where, mean, rms, rmsd) equal the written image's own, over regions of
 *     interest, a maximum on four pixels and a mask.
 */
#include "clirun.h"

#include "nbgrad.h"

#include <dirent.h>
#include <math.h>
#include <fcntl.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

/* The base experiment: small and fast. */
#define BASE "-cell", "100", "100", "100", "90", "90", "90", "-default_F", "100", "-N", "5", "-lambda", "1", \
             "-distance", "100", "-detpixels", "64", "-pixel", "0.1", "-oversample", "1"
#define OUTS "-floatfile", "out.float", "-intfile", "out.img"

/* --- help ---------------------------------------------------------------------------------------------------- */

static void test_help(void)
{
    static const char *flags[] = {"-hkl", "-mat", "-cell", "-pixel", "-detpixels", "-distance", "-lambda",
                                  "-floatfile", "-intfile", "-noisefile", "-pgmfile", "-roi", "-mosflm", "-xds",
                                  NULL};
    static const char *variants[][3] = {{"-h", NULL, NULL}, {"--help", NULL, NULL}, {"simulate", "-h", NULL}};
    for (int v = 0; v < 3; ++v) {
        run_result r;
        if (!new_case(&r)) {
            continue;
        }
        run_in(&r, variants[v]);
        char what[64];
        snprintf(what, sizeof what, "nbgrad %s%s%s", variants[v][0], variants[v][1] ? " " : "",
                 variants[v][1] ? variants[v][1] : "");
        nbgi_test_check(r.status == 0, "CLI-help", "%s exits 0 (got %d)", what, r.status);
        const char *missing = NULL;
        for (int i = 0; flags[i] != NULL; ++i) {
            if (strstr(r.out, flags[i]) == NULL) {
                missing = flags[i];
            }
        }
        nbgi_test_check(missing == NULL, "CLI-help", "%s lists the flags on stdout%s%s", what,
                       missing ? ", missing " : "", missing ? missing : "");
        char extra[1024];
        unexpected_files(r.work, NULL, extra, sizeof extra);
        nbgi_test_check(extra[0] == '\0', "CLI-help", "%s writes no file%s%s", what, extra[0] ? ": " : "", extra);
        result_free(&r);
    }
}

/* --- failures ------------------------------------------------------------------------------------------------- */

/* An npix x npix SMV mask written with the library into work/name: all ones, or with holes the pixels i with
 * i % 7 == 3 and the square of rows and columns 25 .. 35 masked (0); truncated to keep bytes when keep > 0. */
static int make_mask(const run_result *r, const char *name, int npix, long keep, int holes)
{
    nbg_ctx *ctx = NULL;
    if (nbg_ctx_create(&ctx, NBG_BACKEND_CPU, NBG_DOUBLE, 1) != NBG_OK) {
        return 0;
    }
    nbg_smv_header h;
    memset(&h, 0, sizeof h);
    h.fpixels = h.spixels = npix;
    h.pixel = 0.1;
    h.distance = h.close_distance = 100;
    h.lambda = 1;
    h.Xbeam = h.Ybeam = h.Fbeam = h.Sbeam = npix * 0.05;
    h.detsize_s = npix * 0.1;
    h.ORGX = h.ORGY = npix / 2.0 + 0.5;
    uint16_t *data = malloc(sizeof(uint16_t) * (size_t)npix * (size_t)npix);
    int ok = data != NULL;
    for (int i = 0; ok && i < npix * npix; ++i) {
        const int f = i % npix, sl = i / npix;
        data[i] = holes && (i % 7 == 3 || (f >= 25 && f <= 35 && sl >= 25 && sl <= 35)) ? 0 : 1;
    }
    char path[PATH_MAX + 256];
    snprintf(path, sizeof path, "%s/%s", r->work, name);
    ok = ok && nbg_write_smv(ctx, path, &h, data) == NBG_OK;
    if (!ok) {
        fprintf(stderr, "make_mask: %s\n", nbg_errmsg(ctx));
    }
    if (ok && keep > 0) {
        ok = truncate(path, keep) == 0;
    }
    free(data);
    nbg_ctx_destroy(ctx);
    return ok;
}

static void test_failures(void)
{
    run_result r;
#define ARGS(...) ((const char *const[]){__VA_ARGS__, NULL})
#define FAILCASE(id, what, args, words, inputs)                                                                   \
    do {                                                                                                          \
        if (new_case(&r)) {                                                                                       \
            expect_failure(id, what, &r, args, words, inputs);                                                    \
            result_free(&r);                                                                                      \
        }                                                                                                         \
    } while (0)
    static const char *const none[] = {NULL};

    FAILCASE("CLI-unknown-flag", "an unknown flag", ARGS(BASE, OUTS, "-bogus_flag", "3"),
             ARGS("-bogus_flag"), none);
    FAILCASE("CLI-missing-value", "-distance without its value", ARGS(BASE, OUTS, "-distance"), ARGS("-distance"),
             none);
    FAILCASE("CLI-missing-value", "-cell without values", ARGS("-default_F", "100", OUTS, "-cell"), ARGS("-cell"),
             none);
    FAILCASE("CLI-negative-pixels", "-detpixels -5", ARGS(BASE, OUTS, "-detpixels", "-5"), ARGS("-detpixels"), none);
    FAILCASE("CLI-zero-volume", "-cell 100 100 100 90 90 180 (coplanar a, b)",
             ARGS(OUTS, "-default_F", "100", "-detpixels", "64", "-cell", "100", "100", "100", "90", "90", "180"),
             ARGS("cell", "gamma", "(0, 180)"), none);
    FAILCASE("CLI-zero-volume", "-cell 100 100 100 60 60 120 (alpha + beta = gamma: coplanar axes)",
             ARGS(OUTS, "-default_F", "100", "-detpixels", "64", "-cell", "100", "100", "100", "60", "60", "120"),
             ARGS("cell", "volume"), none);
    FAILCASE("CLI-mat", "an -mat file that does not exist", ARGS(BASE, OUTS, "-mat", "missing.mat"),
             ARGS("missing.mat"), none);
    FAILCASE("CLI-nan", "-distance nan", ARGS(BASE, OUTS, "-distance", "nan"), ARGS("-distance", "nan"), none);
    FAILCASE("CLI-nan", "-lambda nan", ARGS(BASE, OUTS, "-lambda", "nan"), ARGS("-lambda", "nan"), none);
    FAILCASE("CLI-nan", "-cell 100 nan 100 90 90 90",
             ARGS(OUTS, "-default_F", "100", "-detpixels", "64", "-cell", "100", "nan", "100", "90", "90", "90"),
             ARGS("-cell", "nan"), none);
    FAILCASE("CLI-mosaic-dom", "-mosaic_dom 0", ARGS(BASE, OUTS, "-mosaic", "0.5", "-mosaic_dom", "0"),
             ARGS("-mosaic_dom"), none);
    FAILCASE("CLI-mosaic-dom", "-mosaic_dom -3", ARGS(BASE, OUTS, "-mosaic", "0.5", "-mosaic_dom", "-3"),
             ARGS("-mosaic_dom"), none);
    FAILCASE("CLI-unreadable", "an -hkl file that does not exist", ARGS(BASE, OUTS, "-hkl", "missing.hkl"),
             ARGS("missing.hkl"), none);
    FAILCASE("CLI-unreadable", "a -sourcefile that does not exist", ARGS(BASE, OUTS, "-sourcefile", "missing.txt"),
             ARGS("missing.txt"), none);
    FAILCASE("CLI-unreadable", "a -mask file that does not exist", ARGS(BASE, OUTS, "-mask", "missing.img"),
             ARGS("missing.img"), none);

    /* malformed HKL: the message names the file and the line */
    if (new_case(&r)) {
        put_file(&r, "bad.hkl", "0 0 0 100\n1 0 0 50\n# a comment\n0 x 1 20\n0 0 1 30\n");
        expect_failure("CLI-hkl-malformed", "an HKL file with a bad line 4", &r, ARGS(BASE, OUTS, "-hkl", "bad.hkl"),
                       ARGS("bad.hkl:4"), ARGS("bad.hkl"));
        result_free(&r);
    }
    if (new_case(&r)) {
        put_file(&r, "short.hkl", "0 0 0 100\n1 0 0\n");
        expect_failure("CLI-hkl-malformed", "an HKL file with a 3-column line 2", &r,
                       ARGS(BASE, OUTS, "-hkl", "short.hkl"), ARGS("short.hkl:2"), ARGS("short.hkl"));
        result_free(&r);
    }
    if (new_case(&r)) {
        put_file(&r, "empty.hkl", "# no reflections here\n\n   \n# none\n");
        expect_failure("CLI-hkl-empty", "an HKL file with no reflections", &r, ARGS(BASE, OUTS, "-hkl", "empty.hkl"),
                       ARGS("empty.hkl", "no reflections"), ARGS("empty.hkl"));
        result_free(&r);
    }
    if (new_case(&r)) {
        put_file(&r, "bad.mat", "0.01 0 0\n0 0.01 0\n0 0\n");
        expect_failure("CLI-mat", "a matrix file with 8 numbers", &r, ARGS(BASE, OUTS, "-mat", "bad.mat"),
                       ARGS("bad.mat"), ARGS("bad.mat"));
        result_free(&r);
    }
    if (new_case(&r)) {
        put_file(&r, "src.txt", "-10 0 0 1 1e-10\n-10 0 zz 1 1e-10\n");
        expect_failure("CLI-sourcefile", "a source file with a bad number on line 2", &r,
                       ARGS(BASE, OUTS, "-sourcefile", "src.txt"), ARGS("src.txt:2"), ARGS("src.txt"));
        result_free(&r);
    }
    /* masks */
    if (new_case(&r)) {
        if (make_mask(&r, "trunc.img", 64, 512 + 1000, 0)) {
            expect_failure("CLI-mask-truncated", "a truncated SMV mask", &r, ARGS(BASE, OUTS, "-mask", "trunc.img"),
                           ARGS("trunc.img"), ARGS("trunc.img"));
        } else {
            nbgi_test_check(0, "CLI-mask-truncated", "cannot write the mask");
        }
        result_free(&r);
    }
    if (new_case(&r)) {
        if (make_mask(&r, "hdr.img", 64, 300, 0)) {
            expect_failure("CLI-mask-truncated", "an SMV mask cut inside its header", &r,
                           ARGS(BASE, OUTS, "-mask", "hdr.img"), ARGS("hdr.img"), ARGS("hdr.img"));
        } else {
            nbgi_test_check(0, "CLI-mask-truncated", "cannot write the mask");
        }
        result_free(&r);
    }
    if (new_case(&r)) {
        /* the mask header makes the detector 64 x 64; -detpixels 32 then disagrees with the mask's pixels */
        if (make_mask(&r, "mask64.img", 64, 0, 0)) {
            expect_failure("CLI-mask-size", "a 64x64 mask with -detpixels 32", &r,
                           ARGS(BASE, OUTS, "-mask", "mask64.img", "-detpixels", "32"), ARGS("mask", "64", "32"),
                           ARGS("mask64.img"));
        } else {
            nbgi_test_check(0, "CLI-mask-size", "cannot write the mask");
        }
        result_free(&r);
    }
    if (new_case(&r)) {
        /* the mask alone sets the size: this works */
        if (make_mask(&r, "mask64.img", 64, 0, 0)) {
            run_in(&r, ARGS(BASE, "-floatfile", "out.float", "-mask", "mask64.img"));
            size_t n = 0;
            void *img = read_in(&r, "out.float", &n);
            nbgi_test_check(r.status == 0 && img != NULL && n == 64 * 64 * sizeof(float), "CLI-mask-size",
                           "a 64x64 mask with -detpixels 64 works (exit %d, %zu bytes) %s", r.status, n,
                           first_line(r.err));
            free(img);
        }
        result_free(&r);
    }
    /* an output that cannot be written: the outputs written before it must not stay behind */
    if (new_case(&r)) {
        expect_failure("CLI-output-unwritable", "-intfile into a missing directory after -floatfile", &r,
                       ARGS(BASE, "-floatfile", "out.float", "-intfile", "no/such/dir/out.img"),
                       ARGS("no/such/dir/out.img"), none);
        result_free(&r);
    }
#undef FAILCASE
}

/* --- things that must work ---------------------------------------------------------------------------------- */

static void test_sourcefile_comments(void)
{
    run_result a, b;
    if (!new_case(&a) || !new_case(&b)) {
        return;
    }
    put_file(&a, "src.txt", "-10 0 0 1 1e-10\n-10 0.02 0.01 1 1.02e-10\n");
    put_file(&b, "src.txt", "# X Y Z weight lambda(m)\n-10 0 0 1 1e-10\n\n# the second source\n"
                            "-10 0.02 0.01 1 1.02e-10   # trailing comment\n#\n");
    run_in(&a, ARGS(BASE, "-sourcefile", "src.txt", "-floatfile", "out.float"));
    run_in(&b, ARGS(BASE, "-sourcefile", "src.txt", "-floatfile", "out.float"));
    nbgi_test_check(a.status == 0 && b.status == 0, "CLI-sourcefile-comment",
                   "runs with and without '#' lines succeed (exit %d, %d) %s", a.status, b.status, first_line(b.err));
    size_t n = 0;
    const int same = same_file(&a, "out.float", &b, "out.float", &n);
    nbgi_test_check(same && n == 64 * 64 * sizeof(float), "CLI-sourcefile-comment",
                   "'#' comment lines give the identical image (%zu bytes)", n);
    nbgi_test_check(strstr(b.out, " 2 sources") != NULL, "CLI-sourcefile-comment",
                   "and the program reports 2 sources (comment lines are not sources)");
    result_free(&a);
    result_free(&b);
}

static void test_misset_seed(void)
{
    run_result a, b, c, d;
    if (!new_case(&a) || !new_case(&b) || !new_case(&c) || !new_case(&d)) {
        return;
    }
#define TRIC "-cell", "70", "80", "90", "75", "85", "95", "-default_F", "100", "-N", "5", "-lambda", "1", \
             "-distance", "100", "-detpixels", "64", "-oversample", "1"
    run_in(&a, ARGS(TRIC, "-floatfile", "out.float"));
    run_in(&b, ARGS(TRIC, "-misset_seed", "12345", "-floatfile", "out.float"));
    run_in(&c, ARGS(TRIC, "-misset", "random", "-misset_seed", "12345", "-floatfile", "out.float"));
    run_in(&d, ARGS(TRIC, "-misset_seed", "12345", "-misset", "random", "-floatfile", "out.float"));
#undef TRIC
    nbgi_test_check(a.status == 0 && b.status == 0 && c.status == 0 && d.status == 0, "CLI-misset-seed",
                   "runs succeed (exit %d %d %d %d)", a.status, b.status, c.status, d.status);
    size_t n = 0;
    const int same = same_file(&a, "out.float", &b, "out.float", &n);
    nbgi_test_check(same && n == 64 * 64 * sizeof(float), "CLI-misset-seed",
                   "-misset_seed without -misset random leaves the image identical (%zu bytes)", n);
    nbgi_test_check(!same_file(&a, "out.float", &c, "out.float", &n), "CLI-misset-seed",
                   "-misset random -misset_seed 12345 does change the image");
    nbgi_test_check(same_file(&c, "out.float", &d, "out.float", &n), "CLI-misset-seed",
                   "-misset random with the same seed, flags in either order, gives the identical image");
    result_free(&a);
    result_free(&b);
    result_free(&c);
    result_free(&d);
}

static void test_fdump(void)
{
    /* a small table: F = 50 + 3h + 2k + l over -6..6 */
    size_t cap = 13 * 13 * 13 * 32 + 1, len = 0;
    char *hkl = malloc(cap);
    if (hkl == NULL) {
        return;
    }
    for (int h = -6; h <= 6; ++h) {
        for (int k = -6; k <= 6; ++k) {
            for (int l = -6; l <= 6; ++l) {
                len += (size_t)snprintf(hkl + len, cap - len, "%d %d %d %d\n", h, k, l, 50 + 3 * h + 2 * k + l);
            }
        }
    }
#define XTAL "-cell", "100", "100", "100", "90", "90", "90", "-N", "5", "-lambda", "1", "-distance", "100", \
             "-detpixels", "64", "-oversample", "1"
    run_result a, c;
    if (new_case(&a)) {
        put_file(&a, "t.hkl", hkl);
        run_in(&a, ARGS(XTAL, "-hkl", "t.hkl", "-floatfile", "one.float"));
        nbgi_test_check(a.status == 0, "CLI-fdump", "a run with -hkl succeeds (exit %d) %s", a.status, first_line(a.err));
        nbgi_test_check(exists_in(a.work, "Fdump.bin"), "CLI-fdump", "and writes Fdump.bin in the working directory");
        result_free(&a);
        /* the same directory, no -hkl: the cache is read */
        run_in(&a, ARGS(XTAL, "-floatfile", "two.float"));
        nbgi_test_check(a.status == 0, "CLI-fdump", "a second run without -hkl succeeds (exit %d) %s", a.status,
                       first_line(a.err));
        nbgi_test_check(strstr(a.out, "Fdump.bin") != NULL, "CLI-fdump", "and says it reads Fdump.bin");
        size_t n = 0;
        const int same = same_file(&a, "one.float", &a, "two.float", &n);
        nbgi_test_check(same && n == 64 * 64 * sizeof(float), "CLI-fdump", "and gives the identical image (%zu bytes)",
                       n);
        result_free(&a);
        /* -nodump ignores the cache: with no -hkl and no -default_F there are no structure factors */
        run_in(&a, ARGS(XTAL, "-nodump", "-floatfile", "three.float"));
        nbgi_test_check(a.status != 0 && !exists_in(a.work, "three.float"), "CLI-fdump",
                       "-nodump without -hkl does not read Fdump.bin (exit %d: %s)", a.status, first_line(a.err));
        result_free(&a);
    }
    if (new_case(&c)) {
        put_file(&c, "t.hkl", hkl);
        run_in(&c, ARGS(XTAL, "-hkl", "t.hkl", "-nodump", "-floatfile", "one.float"));
        nbgi_test_check(c.status == 0 && exists_in(c.work, "one.float"), "CLI-nodump", "-hkl -nodump runs (exit %d)",
                       c.status);
        nbgi_test_check(!exists_in(c.work, "Fdump.bin"), "CLI-nodump", "-nodump writes no Fdump.bin");
        result_free(&c);
    }
#undef XTAL
    free(hkl);
}

/* The printed statistics (max_I and its position, mean, rms, rmsd) against the float image the same run wrote, computed
 * here one pixel at a time: over regions of interest whose widths are no multiple of the program's lanes, with the
 * brightest value on four pixels (the symmetric cubic pattern about the beam at the corner of four pixels), where the
 * first of them in reading order is the one reported, and with a mask (masked pixels count in rmsd alone, as
 * nanoBragg's), whose holes cover the brightest pixels. */
static void test_stats(void)
{
    static const char *const rois[][4] = {{"0", "59", "0", "59"}, {"3", "52", "7", "49"}, {"30", "30", "11", "40"},
                                          {"0", "59", "0", "59"}};
    enum { NP = 60 };
    for (int k = 0; k < 4; ++k) {
        run_result r;
        if (!new_case(&r)) {
            return;
        }
        const char *const *q = rois[k];
        const int masked = k == 3;
        if (masked && !make_mask(&r, "holes.img", NP, 0, 1)) {
            nbgi_test_check(0, "CLI-stats-mask", "cannot write the mask");
            result_free(&r);
            continue;
        }
#define STATS_RUN(...)                                                                                                 \
    ARGS("-cell", "100", "100", "100", "90", "90", "90", "-default_F", "100", "-N", "5", "-lambda", "1", "-distance",    \
         "100", "-detpixels", "60", "-pixel", "0.1", "-oversample", "1", "-roi", q[0], q[1], q[2], q[3],               \
         "-floatfile", "out.float", __VA_ARGS__)
        if (masked) {
            run_in(&r, STATS_RUN("-mask", "holes.img"));
        } else {
            run_in(&r, STATS_RUN("-nopgm"));
        }
#undef STATS_RUN
        char id[32];
        snprintf(id, sizeof id, "CLI-stats-%d", k);
        size_t n = 0;
        float *img = read_in(&r, "out.float", &n);
        const char *pm = strstr(r.out, "max_I = "), *ps = strstr(r.out, "mean= ");
        double pmax = 0, px = 0, py = 0, pmean = 0, prms = 0, prmsd = 0;
        const int parsed = pm != NULL && ps != NULL && sscanf(pm, "max_I = %lf at %lf %lf", &pmax, &px, &py) == 3 &&
                           sscanf(ps, "mean= %lf rms= %lf rmsd= %lf", &pmean, &prms, &prmsd) == 3;
        nbgi_test_check(r.status == 0 && img != NULL && n == NP * NP * sizeof(float) && parsed, id,
                       "a run with -roi %s %s %s %s%s prints its statistics (exit %d) %s", q[0], q[1], q[2], q[3],
                       masked ? " and a mask" : "", r.status, first_line(r.err));
        if (img != NULL && n == NP * NP * sizeof(float) && parsed) {
            const int x0 = atoi(q[0]), x1 = atoi(q[1]), y0 = atoi(q[2]), y1 = atoi(q[3]);
            double sum = 0, sq = 0, max = 0, dev = 0;
            long cnt = 0, all = 0, imax = -1, ties = 0;
            for (int y = y0; y <= y1; ++y) {
                for (int x = x0; x <= x1; ++x) {
                    const int i = y * NP + x;
                    const double v = img[i];
                    ++all;
                    if (masked && (i % 7 == 3 || (x >= 25 && x <= 35 && y >= 25 && y <= 35))) {
                        continue;
                    }
                    if (v > max) {
                        max = v;
                        imax = i;
                        ties = 0;
                    } else if (v == max && v > 0) {
                        ++ties;
                    }
                    sum += v;
                    sq += v * v;
                    ++cnt;
                }
            }
            const double mean = sum / (double)cnt;
            for (int y = y0; y <= y1; ++y) {
                for (int x = x0; x <= x1; ++x) {
                    dev += (img[y * NP + x] - mean) * (img[y * NP + x] - mean);
                }
            }
            const double rms = sqrt(sq / (double)(cnt - 1)), rmsd = sqrt(dev / (double)(all - 1));
            /* nanoBragg's position: the last subpixel's centre of the brightest pixel, in m (1 subpixel here) */
            const double ex = 1e-4 * (double)(imax % NP) + 5e-5, ey = 1e-4 * (double)(imax / NP) + 5e-5;
            const int ok = max > 0 && fabs(pmax - max) <= 1e-5 * max && fabs(px - ex) <= 1e-9 && fabs(py - ey) <= 1e-9 &&
                           fabs(pmean - mean) <= 1e-5 * fabs(mean) && fabs(prms - rms) <= 1e-5 * rms &&
                           fabs(prmsd - rmsd) <= 1e-5 * rmsd;
            nbgi_test_check(ok, id, "max_I %g at %g %g, mean %g, rms %g, rmsd %g as the image's own (%g at %g %g, %g, "
                           "%g, %g; %ld more pixels at the maximum)", pmax, px, py, pmean, prms, prmsd, max, ex, ey,
                           mean, rms, rmsd, ties);
            if (k == 0) {
                nbgi_test_check(ties > 0, id, "the symmetric pattern puts its maximum on more than one pixel (%ld more)",
                               ties);
            }
            if (masked) {
                /* the mean over the unmasked pixels, not over all: the two differ by far more than the tolerance */
                const double mall = sum / (double)all;
                nbgi_test_check(cnt < all && fabs(mean - mall) > 0.05 * mean, id, "the mask's holes leave out %ld of %ld "
                               "pixels (the mean over all would be %g)", all - cnt, all, mall);
            }
        }
        free(img);
        result_free(&r);
    }
}

static void test_no_output(void)
{
    run_result r;
    if (!new_case(&r)) {
        return;
    }
    run_in(&r, ARGS(BASE));
    nbgi_test_check(r.status == 0, "CLI-no-output", "a run without output flags exits 0 (got %d) %s", r.status,
                   first_line(r.err));
    char extra[1024];
    unexpected_files(r.work, NULL, extra, sizeof extra);
    nbgi_test_check(extra[0] == '\0', "CLI-no-output", "and writes no file%s%s", extra[0] ? ": " : "", extra);
    nbgi_test_check(strstr(r.out, "no output file") != NULL || strstr(r.err, "no output file") != NULL,
                   "CLI-no-output", "and says that no output file was asked for");
    result_free(&r);

    /* the positive control: with -floatfile and -intfile both files are written, nothing else */
    if (new_case(&r)) {
        run_in(&r, ARGS(BASE, OUTS));
        unexpected_files(r.work, ARGS("out.float", "out.img"), extra, sizeof extra);
        nbgi_test_check(r.status == 0 && exists_in(r.work, "out.float") && exists_in(r.work, "out.img") &&
                           extra[0] == '\0',
                       "CLI-outputs", "-floatfile and -intfile write exactly those two files (exit %d%s%s)", r.status,
                       extra[0] ? ", also " : "", extra);
        size_t n = 0;
        void *img = read_in(&r, "out.img", &n);
        nbgi_test_check(img != NULL && n == 512 + 64 * 64 * 2, "CLI-outputs", "the SMV file is 512 + 64*64*2 bytes "
                       "(got %zu)", n);
        free(img);
        result_free(&r);
    }
}

int main(void)
{
    if (!clirun_setup("nbg-test-cli-")) {
        return nbgi_test_summary();
    }
    test_help();
    test_failures();
    test_sourcefile_comments();
    test_misset_seed();
    test_fdump();
    test_no_output();
    test_stats();
    nbgi_test_rmtree(g_root);
    return nbgi_test_summary();
}
