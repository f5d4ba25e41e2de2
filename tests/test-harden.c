/*
 * test-harden.c -- regression tests of the hardening work: every defect class found by trying nbgrad as a hostile
 * user would (sanitizers, fuzzing, hand-made bad input) has a case here, through the program and through the
 * library.  Each bad input must give a clear error naming it (never a crash, a hang, a runaway allocation or a
 * silently wrong image), leave no output behind, and leave every file the run did not create as it was.
 *
 *   - memory: a use after free in the plan's error path, -threads beyond reason, unchecked allocations under a
 *     memory limit, tiny files that ask for gigabytes (a two-line HKL file, an Fdump header);
 *   - files: a later output's failure must not destroy an earlier one's previous content, a symbolic link is
 *     written through atomically, a dangling one is refused, the same path twice or an output equal to an input is
 *     refused before any work;
 *   - overflow and runaway work: sampling counts from ranges over tiny steps, their product, the automatic
 *     oversampling of an absurd crystal, Miller indices beyond int;
 *   - silent nonsense: non-finite images, a detector behind the sample, negative water, impossible cells, counts
 *     of zero, a polarization factor of 5, gradcheck's ignored flags;
 *   - messages: header values of -img/-mask name the file and key, NaN in a header, a negative -cell value, a
 *     directory given as an image, a refinement against an image without signal;
 *   - inputs: a device (/dev/zero) for every input flag and a shot's sourcefile, a NUL byte in a shot list, long
 *     comment lines in -motions and -spotlist (read whole).
 */
#include "clirun.h"

#include "nbgrad.h"

#include <limits.h>
#include <math.h>

#define BASE "-cell", "100", "100", "100", "90", "90", "90", "-default_F", "100", "-N", "5", "-lambda", "1", \
             "-distance", "100", "-detpixels", "64", "-pixel", "0.1", "-oversample", "1"
#define OUTS "-floatfile", "out.float", "-intfile", "out.img"
#define ARGS(...) ((const char *const[]){__VA_ARGS__, NULL})

static const char *const none[] = {NULL};

/* A case that must fail, naming the problem with every one of words, leaving only the inputs in work/. */
static void fail_case(const char *id, const char *what, const char *const *args, const char *const *words,
                      const char *const *inputs)
{
    run_result r;
    if (new_case(&r)) {
        expect_failure(id, what, &r, args, words, inputs);
        result_free(&r);
    }
}

/* Like fail_case, with files put into work/ first: pairs of name and content, NULL-terminated. */
static void fail_case_files(const char *id, const char *what, const char *const *files, const char *const *args,
                            const char *const *words)
{
    run_result r;
    if (!new_case(&r)) {
        return;
    }
    const char *inputs[16];
    int n = 0;
    for (int i = 0; files[i] != NULL && n < 15; i += 2) {
        put_file(&r, files[i], files[i + 1]);
        inputs[n++] = files[i];
    }
    inputs[n] = NULL;
    expect_failure(id, what, &r, args, words, inputs);
    result_free(&r);
}

static char *work_path(const run_result *r, const char *name, char *buf, size_t size)
{
    snprintf(buf, size, "%s/%s", r->work, name);
    return buf;
}

/* --- bad values: each refused with a message that names it -------------------------------------------------- */

static void test_values(void)
{
    /* memory safety and runaway resources */
    fail_case("HARD-uaf", "-dispersion 300 -dispsteps 3 (was a use after free of a source)",
              ARGS(BASE, OUTS, "-dispersion", "300", "-dispsteps", "3"), ARGS("dispersion", "200"), none);
    fail_case("HARD-threads", "-threads 100000", ARGS(BASE, OUTS, "-threads", "100000"), ARGS("-threads", "1024"),
              none);
    fail_case("HARD-threads", "-threads -2", ARGS(BASE, OUTS, "-threads", "-2"), ARGS("-threads"), none);

    /* overflow and runaway work */
    fail_case("HARD-oversample-overflow", "-cell 50 60 7e22 90 90 90 (automatic oversampling beyond int)",
              ARGS(BASE, OUTS, "-oversample", "-1", "-cell", "50", "60", "7e22", "90", "90", "90"), ARGS("-oversample"),
              none);
    fail_case("HARD-oversample-overflow", "-cell 50 60 7e22 90 90 90 -oversample 1 (Miller indices beyond int)",
              ARGS(BASE, OUTS, "-cell", "50", "60", "7e22", "90", "90", "90"), ARGS("Miller indices", "7e+22"), none);
    fail_case("HARD-phisteps-overflow", "-osc 1e70 -phistep 2", ARGS(BASE, OUTS, "-osc", "1e70", "-phistep", "2"),
              ARGS("phi steps", "5e+69"), none);
    fail_case("HARD-work-limit", "-osc 5e6 -phistep 1 (5e6 phi steps x 4096 pixels) with -max_samples 1e9",
              ARGS(BASE, OUTS, "-osc", "5e6", "-phistep", "1", "-max_samples", "1e9"),
              ARGS("samples", "5000000 phi steps", "-max_samples"), none);
    fail_case("HARD-work-limit", "4096^2 pixels x 20^2 subpixels x 1000 mosaic domains (1.7e15 samples)",
              ARGS(BASE, OUTS, "-detpixels", "4096", "-oversample", "20", "-mosaic", "1", "-mosaic_dom", "1000"),
              ARGS("samples", "1000 mosaic domains", "limit"), none);
    fail_case("HARD-sources-product", "-divsteps 40000 -dispsteps 2 (was a negative source count)",
              ARGS(BASE, OUTS, "-divergence", "1", "-divsteps", "40000", "-dispersion", "1", "-dispsteps", "2"),
              ARGS("sources", "40000 x 40000", "GiB"), none);
    fail_case("HARD-sources-product", "-divsteps 100000 (was 1e10 loop iterations)",
              ARGS(BASE, OUTS, "-divergence", "1", "-divsteps", "100000"), ARGS("sources", "GiB"), none);

    /* silent nonsense */
    fail_case("HARD-nonfinite", "-lambda 1e-300 (an all-NaN image)", ARGS(BASE, OUTS, "-lambda", "1e-300"),
              ARGS("wavelength", "1e-300"), none);
    fail_case("HARD-nonfinite", "-default_F 1e30 (an all-inf image)", ARGS(BASE, OUTS, "-default_F", "1e30"),
              ARGS("non-finite", "overflow", "-default_F"), none);
    fail_case("HARD-nonfinite", "-fluence 1e300 (an all-inf image)", ARGS(BASE, OUTS, "-fluence", "1e300"),
              ARGS("non-finite", "overflow", "-fluence"), none);
    fail_case("HARD-nonfinite", "-fluence 1e300 in float precision",
              ARGS(BASE, OUTS, "-fluence", "1e300", "-precision", "float"), ARGS("non-finite"), none);
    fail_case("HARD-domain", "-close_distance -10", ARGS(BASE, OUTS, "-close_distance", "-10"),
              ARGS("close distance", "-10"), none);
    fail_case("HARD-domain", "-detector_roty 90 (the detector plane edge-on, through the sample)",
              ARGS(BASE, OUTS, "-detector_roty", "90"), ARGS("passes through", "close distance"), none);
    fail_case("HARD-domain", "-twotheta 90 -pivot beam with a custom convention (edge-on)",
              ARGS(BASE, OUTS, "-beam_vector", "1", "0", "0", "-twotheta", "90", "-pivot", "beam"),
              ARGS("passes through"), none);
    fail_case("HARD-domain", "-water -1 (negative intensities)", ARGS(BASE, OUTS, "-water", "-1"),
              ARGS("water", "-1"), none);
    fail_case("HARD-domain", "-polar 5", ARGS(BASE, OUTS, "-polar", "5"), ARGS("polarization", "5"), none);
    fail_case("HARD-domain", "-mosaic -3", ARGS(BASE, OUTS, "-mosaic", "-3"), ARGS("mosaic", "-3"), none);
    fail_case("HARD-domain", "-roi 10 5 0 63 (empty)", ARGS(BASE, OUTS, "-roi", "10", "5", "0", "63"),
              ARGS("-roi", "empty"), none);
    fail_case("HARD-cell", "-cell 100 100 100 120 120 120 (flat)",
              ARGS(BASE, OUTS, "-cell", "100", "100", "100", "120", "120", "120"), ARGS("no cell", "360"), none);
    fail_case("HARD-cell", "-cell 100 100 100 170 170 170",
              ARGS(BASE, OUTS, "-cell", "100", "100", "100", "170", "170", "170"), ARGS("no cell"), none);
    fail_case("HARD-cell", "-cell 100 100 100 90 90 200", ARGS(BASE, OUTS, "-cell", "100", "100", "100", "90", "90",
              "200"), ARGS("gamma", "200"), none);
    fail_case("HARD-cell", "-cell 50 60 70 -90 90 90 (a negative value was taken for an unknown flag)",
              ARGS(BASE, OUTS, "-cell", "50", "60", "70", "-90", "90", "90"), ARGS("alpha", "-90"), none);
    static const char *const Ns[] = {"0", "-1", "0.5"};
    for (int i = 0; i < 3; ++i) {
        char what[64];
        snprintf(what, sizeof what, "-N %s (was taken as 1)", Ns[i]);
        fail_case("HARD-clamp", what, ARGS(BASE, OUTS, "-N", Ns[i]), ARGS("Na", Ns[i]), none);
    }
    static const char *const counts[] = {"-detpixels", "-oversample", "-thicksteps", "-phisteps", "-dispsteps",
                                         "-divsteps", "-mosaic_dom"};
    for (int i = 0; i < 7; ++i) {
        for (int v = 0; v < 2; ++v) {
            char what[64];
            snprintf(what, sizeof what, "%s %s (was the automatic choice)", counts[i], v ? "-1" : "0");
            fail_case("HARD-clamp", what, ARGS(BASE, OUTS, counts[i], v ? "-1" : "0"),
                      ARGS(counts[i], "positive count"), none);
        }
    }
    fail_case("HARD-gradflags", "gradcheck -rtol 0", ARGS("gradcheck", BASE, "-params", "a", "-rtol", "0"),
              ARGS("-rtol", "positive"), none);
    fail_case("HARD-gradflags", "gradcheck -hscale -1", ARGS("gradcheck", BASE, "-params", "a", "-hscale", "-1"),
              ARGS("-hscale", "positive"), none);
    fail_case("HARD-gradflags", "gradcheck -observed (was ignored)",
              ARGS("gradcheck", BASE, "-params", "a", "-observed", "obs.bin"), ARGS("gradcheck", "-observed"), none);
    fail_case("HARD-gradflags", "gradcheck -weights (was ignored)",
              ARGS("gradcheck", BASE, "-params", "a", "-weights", "w.bin"), ARGS("gradcheck", "-weights"), none);
    fail_case("HARD-gradflags", "grad -rtol", ARGS("grad", BASE, "-params", "a", "-rtol", "1e-3"),
              ARGS("grad", "-rtol"), none);
    fail_case("HARD-limits", "-max_memory 0", ARGS(BASE, OUTS, "-max_memory", "0"), ARGS("-max_memory"), none);
}

/* --- tiny files that ask for gigabytes ---------------------------------------------------------------------- */

static void test_big_tables(void)
{
    fail_case_files("HARD-hkl-sparse", "a two-line HKL file spanning 0..1000 (was an 8 GB table)",
                    ARGS("two.hkl", "0 0 0 1\n1000 1000 1000 1\n"), ARGS(BASE, OUTS, "-hkl", "two.hkl", "-nodump"),
                    ARGS("two.hkl", "1000 1000 1000", "stray"));
    fail_case_files("HARD-sources", "a source file with a wavelength of 1e308 m (was read as inf)",
                    ARGS("src.txt", "0 0 -1 1 1e-10\n0 0 -1 1 1e308\n"), ARGS(BASE, OUTS, "-sourcefile", "src.txt"),
                    ARGS("src.txt:2", "wavelength"));
    fail_case_files("HARD-sources", "a source 1e308 m away (its direction overflows)",
                    ARGS("far.txt", "0 0 -1 1\n0 1e200 -1e200 1\n"), ARGS(BASE, OUTS, "-sourcefile", "far.txt"),
                    ARGS("source 2", "invalid position"));
    fail_case_files("HARD-hkl-limit", "an HKL table above -max_memory",
                    ARGS("dense.hkl", "0 0 0 1\n1 1 1 2\n2 2 2 3\n"),
                    ARGS(BASE, OUTS, "-hkl", "dense.hkl", "-nodump", "-max_memory", "1e-7"),
                    ARGS("dense.hkl", "GiB", "limit", "-max_memory"));

    /* an Fdump header claiming a 1000^3 table with almost no data: refused before allocating */
    run_result r;
    if (new_case(&r)) {
        char path[PATH_MAX + 300];
        FILE *f = fopen(work_path(&r, "big.fdump", path, sizeof path), "wb");
        if (f != NULL) {
            fputs("0 999 0 999 0 999\n\f", f);
            const double zero[16] = {0};
            fwrite(zero, sizeof zero[0], 16, f);
            fclose(f);
        }
        expect_failure("HARD-fdump-header", "an Fdump header claiming 1000^3 entries over 128 bytes", &r,
                       ARGS(BASE, OUTS, "-dump", "big.fdump"), ARGS("big.fdump"), ARGS("big.fdump"));
        result_free(&r);
    }
    if (new_case(&r)) {
        char path[PATH_MAX + 300];
        FILE *f = fopen(work_path(&r, "small.fdump", path, sizeof path), "wb");
        if (f != NULL) {
            fputs("0 9 0 9 0 9\n\f", f); /* 11^3 doubles expected, 2 given */
            const double two[2] = {1, 2};
            fwrite(two, sizeof two[0], 2, f);
            fclose(f);
        }
        expect_failure("HARD-fdump-header", "a truncated Fdump", &r, ARGS(BASE, OUTS, "-dump", "small.fdump"),
                       ARGS("small.fdump", "size"), ARGS("small.fdump"));
        result_free(&r);
    }
}

/* --- files: nothing lost, nothing clobbered ------------------------------------------------------------------- */

static int file_is(const run_result *r, const char *name, const char *content)
{
    size_t n = 0;
    char *d = read_in(r, name, &n);
    const int same = d != NULL && n == strlen(content) && memcmp(d, content, n) == 0;
    free(d);
    return same;
}

static void test_files(void)
{
    run_result r;
    char path[PATH_MAX + 300];

    /* a later output fails: the earlier output's previous content stays */
    if (new_case(&r)) {
        put_file(&r, "keep.bin", "keep");
        mkdir(work_path(&r, "adir", path, sizeof path), 0700);
        run_in(&r, ARGS(BASE, "-floatfile", "keep.bin", "-intfile", "adir"));
        char extra[1024];
        unexpected_files(r.work, ARGS("keep.bin", "adir"), extra, sizeof extra);
        nbgi_test_check(r.status == 1 && strstr(r.err, "adir") != NULL && file_is(&r, "keep.bin", "keep") &&
                           extra[0] == '\0',
                       "HARD-keep-previous", "-floatfile keep.bin -intfile <a directory>: fails naming it, keep.bin "
                       "keeps its content, no temporary left (exit %d%s%s)", r.status, extra[0] ? ", found " : "",
                       extra);
        result_free(&r);
    }
    /* a disk that fills up (a file size limit: writes fail with EFBIG) under every image format: an error naming the
     * file and the cause, exit 1 (NXmx was a SIGSEGV in libhdf5's close at exit), the previous file kept */
    static const struct {
        const char *flag, *name;
    } full[] = {{"-nxsfile", "old.nxs"}, {"-cbffile", "old.cbf"}, {"-floatfile", "old.bin"}, {"-intfile", "old.img"}};
    for (size_t k = 0; k < sizeof full / sizeof full[0]; ++k) {
        if (!new_case(&r)) {
            continue;
        }
        put_file(&r, full[k].name, "previous");
        g_child_fsize_limit = 8192;
        run_in(&r, ARGS("-cell", "100", "100", "100", "90", "90", "90", "-default_F", "100", "-N", "5", "-distance",
                        "100", "-detpixels", "256", "-oversample", "1", full[k].flag, full[k].name));
        g_child_fsize_limit = 0;
        char extra[1024], id[64];
        unexpected_files(r.work, ARGS(full[k].name), extra, sizeof extra);
        snprintf(id, sizeof id, "HARD-full-disk%s", full[k].flag);
        nbgi_test_check(r.status == 1 && strstr(r.err, full[k].name) != NULL && strstr(r.err, "too large") != NULL &&
                            file_is(&r, full[k].name, "previous") && extra[0] == '\0',
                        id, "%s onto a full disk: exit 1 naming the file and the cause, the previous content kept, no "
                        "temporary left (exit %d: %s%s%s)", full[k].flag, r.status, first_line(r.err),
                        extra[0] ? "; found " : "", extra);
        result_free(&r);
    }
    /* an output directory that does not exist: refused before any work */
    if (new_case(&r)) {
        put_file(&r, "keep.bin", "keep");
        run_in(&r, ARGS(BASE, "-floatfile", "keep.bin", "-intfile", "missing/x.img"));
        nbgi_test_check(r.status == 1 && strstr(r.err, "does not exist") != NULL && file_is(&r, "keep.bin", "keep") &&
                           strstr(r.out, "max_I") == NULL,
                       "HARD-keep-previous", "-intfile into a missing directory: refused before simulating, keep.bin "
                       "kept (exit %d: %s)", r.status, first_line(r.err));
        result_free(&r);
    }
    /* a symbolic link: written through, atomically; the link stays a link */
    if (new_case(&r)) {
        put_file(&r, "real.bin", "old");
        char target[PATH_MAX + 300];
        work_path(&r, "real.bin", target, sizeof target);
        const int linked = symlink("real.bin", work_path(&r, "link.bin", path, sizeof path)) == 0;
        run_in(&r, ARGS(BASE, "-floatfile", "link.bin"));
        struct stat ls, ts;
        const int is_link = lstat(path, &ls) == 0 && S_ISLNK(ls.st_mode);
        const int size_ok = stat(target, &ts) == 0 && ts.st_size == 64 * 64 * 4;
        char extra[1024];
        unexpected_files(r.work, ARGS("real.bin", "link.bin"), extra, sizeof extra);
        nbgi_test_check(linked && r.status == 0 && is_link && size_ok && extra[0] == '\0', "HARD-symlink",
                       "-floatfile <a link to a file>: the link stays, its target gets the image (exit %d, link %d, "
                       "size %d%s%s)", r.status, is_link, size_ok, extra[0] ? ", found " : "", extra);
        result_free(&r);
    }
    /* an existing output replaced (exchanged with the new file, the old one removed): the name gets the new image,
     * a hard link to the old file keeps the old contents as a rename over it would, no temporary left */
    if (new_case(&r)) {
        put_file(&r, "out.bin", "old");
        char old[PATH_MAX + 300];
        const int linked = link(work_path(&r, "out.bin", path, sizeof path), work_path(&r, "old.bin", old, sizeof old)) == 0;
        run_in(&r, ARGS(BASE, "-floatfile", "out.bin"));
        struct stat ns;
        const int size_ok = stat(path, &ns) == 0 && ns.st_size == 64 * 64 * 4 && S_ISREG(ns.st_mode) && ns.st_nlink == 1;
        char extra[1024];
        unexpected_files(r.work, ARGS("out.bin", "old.bin"), extra, sizeof extra);
        nbgi_test_check(linked && r.status == 0 && size_ok && file_is(&r, "old.bin", "old") && extra[0] == '\0',
                        "HARD-replace", "-floatfile <an existing file>: replaced by the image, a hard link to it keeps "
                        "the old contents, no temporary left (exit %d, size %d%s%s)", r.status, size_ok,
                        extra[0] ? ", found " : "", extra);
        result_free(&r);
    }
    if (new_case(&r)) {
        const int linked = symlink("nowhere/missing.bin", work_path(&r, "dangling.bin", path, sizeof path)) == 0;
        run_in(&r, ARGS(BASE, "-floatfile", "dangling.bin"));
        nbgi_test_check(linked && r.status == 1 && strstr(r.err, "dangling.bin") != NULL &&
                           strstr(r.err, "symbolic link") != NULL,
                       "HARD-symlink", "-floatfile <a dangling link>: refused by name (exit %d: %s)", r.status,
                       first_line(r.err));
        result_free(&r);
    }
    /* the same path twice, an output that is an input */
    fail_case("HARD-same-path", "-floatfile x -intfile x", ARGS(BASE, "-floatfile", "x", "-intfile", "x"),
              ARGS("-floatfile x", "-intfile x", "same file"), none);
    fail_case("HARD-same-path", "-floatfile x -noisefile ./x", ARGS(BASE, "-floatfile", "x", "-noisefile", "./x"),
              ARGS("same file"), none);
    fail_case_files("HARD-same-path", "-hkl my.hkl -dump my.hkl (was overwritten with binary data)",
                    ARGS("my.hkl", "1 1 1 10\n"), ARGS(BASE, "-hkl", "my.hkl", "-dump", "my.hkl"),
                    ARGS("-dump my.hkl", "-hkl my.hkl", "overwritten"));
    if (new_case(&r)) {
        put_file(&r, "my.hkl", "1 1 1 10\n");
        run_in(&r, ARGS(BASE, "-hkl", "my.hkl", "-dump", "my.hkl"));
        nbgi_test_check(file_is(&r, "my.hkl", "1 1 1 10\n"), "HARD-same-path", "and the HKL file is unchanged");
        result_free(&r);
    }
    fail_case_files("HARD-same-path", "refine -residual obs.bin -observed obs.bin", ARGS("obs.bin", "0"),
                    ARGS("refine", BASE, "-params", "a", "-observed", "obs.bin", "-residual", "obs.bin"),
                    ARGS("-residual obs.bin", "-observed obs.bin"));
    /* the same device twice is fine */
    if (new_case(&r)) {
        run_in(&r, ARGS(BASE, "-floatfile", "/dev/null", "-intfile", "/dev/null"));
        nbgi_test_check(r.status == 0, "HARD-same-path", "/dev/null named twice is allowed (exit %d)", r.status);
        result_free(&r);
    }
    /* -img whose SMV header has no SIZE1/SIZE2 (the reader's 0: the file says nothing) leaves the pixel counts
     * unset (-1), so that -detsize gives them, as before 0 stopped meaning unset */
    if (new_case(&r)) {
        char hdr[513];
        const int len = snprintf(hdr, sizeof hdr, "{\nHEADER_BYTES=512;\nPIXEL_SIZE=0.1;\nDISTANCE=100;\n}\n");
        memset(hdr + len, ' ', sizeof hdr - 1 - (size_t)len);
        hdr[sizeof hdr - 1] = '\0';
        put_file(&r, "nosize.img", hdr);
        run_in(&r, ARGS("-cell", "100", "100", "100", "90", "90", "90", "-default_F", "100", "-N", "5", "-lambda",
                        "1", "-oversample", "1", "-img", "nosize.img", "-detsize", "6.4", "-floatfile", "out.float"));
        size_t n = 0;
        void *img = read_in(&r, "out.float", &n);
        nbgi_test_check(r.status == 0 && n == 64 * 64 * sizeof(float), "HARD-img-pixels",
                       "-img with no SIZE1/SIZE2 and -detsize 6.4 renders 64 x 64 (exit %d, %zu bytes: %s)", r.status,
                       n, first_line(r.err));
        free(img);
        result_free(&r);
    }
}

/* --- messages that name the file ---------------------------------------------------------------------------- */

/* A 64 x 64 SMV file in work/name whose header has key=value replaced (the header keeps its length). */
static int smv_with(const run_result *r, const char *name, const char *key, const char *value)
{
    nbg_ctx *ctx = NULL;
    if (nbg_ctx_create(&ctx, NBG_BACKEND_CPU, NBG_DOUBLE, 1) != NBG_OK) {
        return 0;
    }
    nbg_smv_header h;
    memset(&h, 0, sizeof h);
    h.fpixels = h.spixels = 64;
    h.pixel = 0.1;
    h.distance = h.close_distance = 100;
    h.lambda = 1;
    h.Xbeam = h.Ybeam = h.Fbeam = h.Sbeam = 3.2;
    h.detsize_s = 6.4;
    h.ORGX = h.ORGY = 32.5;
    uint16_t data[64 * 64];
    for (int i = 0; i < 64 * 64; ++i) {
        data[i] = 1;
    }
    char path[PATH_MAX + 300];
    work_path(r, name, path, sizeof path);
    int ok = nbg_write_smv(ctx, path, &h, data) == NBG_OK;
    nbg_ctx_destroy(ctx);
    size_t n = 0;
    char *img = ok ? nbgi_test_read_file(path, &n) : NULL;
    char want[64];
    snprintf(want, sizeof want, "\n%s=", key);
    char *at = img != NULL ? strstr(img, want) : NULL;
    ok = at != NULL && at < img + 512;
    if (ok) {
        char *v = at + strlen(want), *end = strchr(v, ';');
        const size_t room = (size_t)(end - v);
        ok = end != NULL && strlen(value) <= room;
        if (ok) {
            memset(v, ' ', room);
            memcpy(v, value, strlen(value));
            FILE *f = fopen(path, "wb");
            ok = f != NULL && fwrite(img, 1, n, f) == n;
            ok = f != NULL && fclose(f) == 0 && ok;
        }
    }
    free(img);
    return ok;
}

static void test_messages(void)
{
    static const struct {
        const char *flag, *key, *value, *word;
    } bad[] = {{"-img", "PIXEL_SIZE", "-1", "PIXEL_SIZE"}, {"-mask", "DISTANCE", "nan", "DISTANCE"},
               {"-img", "WAVELENGTH", "0", "WAVELENGTH"},  {"-mask", "CLOSE_DISTANCE", "-5", "CLOSE_DISTANCE"},
               {"-img", "DISTANCE", "inf", "DISTANCE"}};
    for (int i = 0; i < 5; ++i) {
        run_result r;
        if (!new_case(&r)) {
            continue;
        }
        const int made = smv_with(&r, "hdr.img", bad[i].key, bad[i].value);
        char what[128];
        snprintf(what, sizeof what, "%s with %s=%s in its header", bad[i].flag, bad[i].key, bad[i].value);
        if (!made) {
            nbgi_test_check(0, "HARD-header", "%s: could not make the file", what);
        } else {
            expect_failure("HARD-header", what, &r, ARGS(BASE, OUTS, bad[i].flag, "hdr.img"),
                           ARGS("hdr.img", bad[i].word), ARGS("hdr.img"));
        }
        result_free(&r);
    }
    run_result r;
    if (new_case(&r)) {
        char path[PATH_MAX + 300];
        mkdir(work_path(&r, "obsdir", path, sizeof path), 0700);
        expect_failure("HARD-observed-dir", "refine -observed <a directory> (was 9223372036854775807 bytes)", &r,
                       ARGS("refine", BASE, "-params", "a", "-observed", "obsdir"), ARGS("obsdir", "directory"),
                       ARGS("obsdir"));
        result_free(&r);
    }
    /* refine against an all-zero image (was a run away to a 1.5e6 A cell) */
    if (new_case(&r)) {
        char path[PATH_MAX + 300];
        FILE *f = fopen(work_path(&r, "zero.bin", path, sizeof path), "wb");
        static const float zero[64 * 64];
        const int made = f != NULL && fwrite(zero, sizeof zero[0], 64 * 64, f) == 64 * 64;
        if (f != NULL) {
            fclose(f);
        }
        if (made) {
            expect_failure("HARD-refine-zero", "refine against an all-zero image", &r,
                           ARGS("refine", BASE, "-params", "a,b,c", "-observed", "zero.bin", "-loss", "poisson"),
                           ARGS("no signal"), ARGS("zero.bin"));
        }
        result_free(&r);
    }
}

/* refine against an image whose every pixel is an overload (was: "no pixel above the pedestal") */
static void test_all_overloads(void)
{
    run_result r;
    if (!new_case(&r)) {
        return;
    }
    char path[PATH_MAX + 300], hdr[512];
    memset(hdr, ' ', sizeof hdr);
    static const char text[] = "{\nHEADER_BYTES=512;\nDIM=2;\nBYTE_ORDER=little_endian;\nTYPE=unsigned_short;\n"
                               "SIZE1=64;\nSIZE2=64;\nPIXEL_SIZE=0.1;\n}\n";
    memcpy(hdr, text, sizeof text - 1);
    static uint16_t px[64 * 64];
    for (int i = 0; i < 64 * 64; ++i) {
        px[i] = 65535; /* little-endian on the machines nbgrad runs on; all bytes 0xff either way */
    }
    FILE *f = fopen(work_path(&r, "over.img", path, sizeof path), "wb");
    const int made = f != NULL && fwrite(hdr, 1, sizeof hdr, f) == sizeof hdr && fwrite(px, 2, 64 * 64, f) == 64 * 64;
    if (f != NULL) {
        fclose(f);
    }
    if (made) {
        expect_failure("HARD-refine-all-overloads", "refine against an image whose every pixel is an overload", &r,
                       ARGS("refine", BASE, "-params", "a", "-observed", "over.img"),
                       ARGS("every one is masked", "overloaded"), ARGS("over.img"));
    }
    result_free(&r);
}

/* --- inputs that never end, long lines, NUL bytes ------------------------------------------------------------- */

/* One comment line of size - 2 characters (and its newline) holding entry at offset at: a reader that reads the
 * line in pieces takes its tail for an entry. */
static void comment_line(char *text, size_t size, size_t at, const char *entry)
{
    memset(text, ' ', size);
    text[0] = '#';
    memcpy(text + at, entry, strlen(entry));
    text[size - 2] = '\n';
    text[size - 1] = '\0';
}

static void test_inputs(void)
{
    /* a device (/dev/zero never ends) is refused by every input flag, by name, at once (was: unbounded growth past
     * -max_memory, or a loop for ever) */
    static const struct {
        const char *id, *flag;
    } dev[] = {{"HARD-device-sourcefile", "-sourcefile"}, {"HARD-device-hkl", "-hkl"}, {"HARD-device-mat", "-mat"},
               {"HARD-device-mask", "-mask"}, {"HARD-device-img", "-img"}};
    for (size_t i = 0; i < sizeof dev / sizeof dev[0]; ++i) {
        char what[96];
        snprintf(what, sizeof what, "%s /dev/zero", dev[i].flag);
        fail_case(dev[i].id, what, ARGS(BASE, OUTS, dev[i].flag, "/dev/zero"), ARGS("/dev/zero", "not a regular file"),
                  none);
    }
    fail_case("HARD-device-motions", "-motions /dev/zero", ARGS("-layout", "pilatus6m", BASE, OUTS, "-motions",
              "/dev/zero"), ARGS("/dev/zero", "not a regular file"), none);
    fail_case("HARD-device-shots", "batch -shots /dev/zero", ARGS("batch", BASE, "-shots", "/dev/zero", "-floatfile",
              "{id}.bin"), ARGS("/dev/zero", "not a regular file"), none);
    fail_case_files("HARD-device-shot-sourcefile", "a shot's sourcefile /dev/zero",
                    ARGS("s.jsonl", "{\"id\": \"a\", \"sourcefile\": \"/dev/zero\"}\n"),
                    ARGS("batch", BASE, "-shots", "s.jsonl", "-floatfile", "{id}.bin"),
                    ARGS("/dev/zero", "not a regular file"));
    run_result r;
    if (new_case(&r)) {
        /* -spotlist: an observed image first, then the device */
        run_in(&r, ARGS(BASE, "-floatfile", "obs.bin"));
        expect_failure("HARD-device-spotlist", "refine -spotlist /dev/zero", &r,
                       ARGS("refine", BASE, "-params", "a", "-observed", "obs.bin", "-spotlist", "/dev/zero"),
                       ARGS("/dev/zero", "not a regular file"), ARGS("obs.bin"));
        result_free(&r);
    }
    /* a NUL byte in a shot-list line is an error naming the line (was: the rest of the line dropped) */
    if (new_case(&r)) {
        char path[PATH_MAX + 300];
        FILE *f = fopen(work_path(&r, "s.jsonl", path, sizeof path), "wb");
        static const char text[] = "{\"id\": \"a\"}\n{\"id\": \"b\"}\0, \"N\": 9}\n";
        const int made = f != NULL && fwrite(text, 1, sizeof text - 1, f) == sizeof text - 1;
        if (f != NULL) {
            fclose(f);
        }
        if (made) {
            expect_failure("HARD-shots-nul", "a NUL byte in line 2 of a shot list", &r,
                           ARGS("batch", BASE, "-shots", "s.jsonl", "-floatfile", "{id}.bin"),
                           ARGS("s.jsonl:2", "NUL byte"), ARGS("s.jsonl"));
        }
        result_free(&r);
    }
    /* a long '#' comment in -motions stays a comment (was: read in 1024-byte pieces, its tail an entry that moved
     * group 0 by 0.5 mm); so in -spotlist (512-byte pieces) */
    if (new_case(&r)) {
        char text[3000];
        comment_line(text, sizeof text, 1030, "0 0.5 0 0 0 0 0");
        put_file(&r, "m.txt", text);
        run_in(&r, ARGS("-layout", "pilatus6m", BASE, "-motions", "m.txt", "-floatfile", "moved.bin"));
        const int rc1 = r.status;
        run_in(&r, ARGS("-layout", "pilatus6m", BASE, "-floatfile", "still.bin"));
        size_t n1 = 0, n2 = 0;
        char *a = read_in(&r, "moved.bin", &n1), *b = read_in(&r, "still.bin", &n2);
        nbgi_test_check(rc1 == 0 && r.status == 0 && a != NULL && b != NULL && n1 == n2 && n1 > 0 &&
                            memcmp(a, b, n1) == 0,
                        "HARD-motions-long-comment", "a 3000-byte comment line in -motions moves nothing (exit %d)",
                        rc1);
        free(a);
        free(b);
        result_free(&r);
    }
    if (new_case(&r)) {
        char text[1200];
        comment_line(text, sizeof text, 600, "10 12");
        put_file(&r, "spots.txt", text);
        run_in(&r, ARGS(BASE, "-floatfile", "obs.bin"));
        expect_failure("HARD-spotlist-long-comment", "a -spotlist of one long comment line", &r,
                       ARGS("refine", BASE, "-params", "a", "-observed", "obs.bin", "-spotlist", "spots.txt"),
                       ARGS("spots.txt", "no spot centre"), ARGS("obs.bin", "spots.txt"));
        result_free(&r);
    }
}

/* --- allocations under a memory limit ------------------------------------------------------------------------- */

static void test_memory_limit(void)
{
#if defined(__SANITIZE_ADDRESS__)
    nbgi_test_skip("HARD-ulimit", "address-space limits and AddressSanitizer do not mix");
#else
    /* ulimit -v 3000000 (KiB): the 31000^2 images (3.8 GB each) cannot be allocated */
    g_child_as_limit = 3e9;
    fail_case("HARD-ulimit", "grad -detpixels 31000 under ulimit -v 3000000 (was SIGSEGV)",
              ARGS("grad", BASE, "-detpixels", "31000", "-params", "a"), ARGS("out of memory", "31000"), none);
    fail_case("HARD-ulimit", "simulate -detpixels 31000 under ulimit -v 3000000",
              ARGS(BASE, OUTS, "-detpixels", "31000"), ARGS("out of memory"), none);
    g_child_as_limit = 0;
#endif
}

/* --- the library: limits, non-finite images, status codes ---------------------------------------------------- */

static void base_experiment(nbg_experiment *e)
{
    nbg_experiment_default(e);
    e->has_cell = 1;
    e->cell[0] = e->cell[1] = e->cell[2] = 100;
    e->cell[3] = e->cell[4] = e->cell[5] = 90;
    e->default_F = 100;
    e->Na = e->Nb = e->Nc = 5;
    e->fpixels = e->spixels = 32;
    e->oversample = 1;
}

/* nbg_experiment.fpixels, spixels: -1 (nbg_experiment_default's) derives them from the detector size, as 0 did
 * before; 0 and counts below -1 are refused with a message that names the pixel counts. */
static void test_pixel_counts(nbg_ctx *ctx)
{
    nbg_experiment d, e;
    nbg_report rep;
    nbg_experiment_default(&d);
    nbgi_test_check(d.fpixels == -1 && d.spixels == -1, "HARD-lib-pixels", "nbg_experiment_default leaves the "
                   "pixel counts unset, -1 (got %d x %d)", d.fpixels, d.spixels);

    /* (1) unset: the default 102.4 mm detector of 0.1 mm pixels, 1024 x 1024, the same image as 1024 given */
    base_experiment(&e);
    e.fpixels = e.spixels = -1;
    int rc = nbg_describe(ctx, &e, &rep);
    nbgi_test_check(rc == NBG_OK && rep.fpixels == 1024 && rep.spixels == 1024, "HARD-lib-pixels",
                   "unset (-1) counts give 1024 x 1024 (rc %d, got %d x %d: %s)", rc, rep.fpixels, rep.spixels,
                   rc == NBG_OK ? "ok" : nbg_errmsg(ctx));
    const size_t n = (size_t)1024 * 1024;
    float *a = malloc(n * sizeof *a), *b = malloc(n * sizeof *b);
    if (a != NULL && b != NULL) {
        rc = nbg_simulate(ctx, &e, a, n, &rep);
        nbg_experiment given = e;
        given.fpixels = given.spixels = 1024;
        const int rc2 = rc == NBG_OK ? nbg_simulate(ctx, &given, b, n, NULL) : rc;
        nbgi_test_check(rc == NBG_OK && rc2 == NBG_OK && memcmp(a, b, n * sizeof *a) == 0, "HARD-lib-pixels",
                       "the unset-count image equals the 1024 x 1024 one bit for bit (rc %d, %d: %s)", rc, rc2,
                       rc == NBG_OK && rc2 == NBG_OK ? "ok" : nbg_errmsg(ctx));
    } else {
        nbgi_test_check(0, "HARD-lib-pixels", "out of memory for two 1024 x 1024 images");
    }
    free(a);
    free(b);

    /* -detsize still applies when the counts are unset */
    base_experiment(&e);
    e.fpixels = e.spixels = -1;
    e.detsize_f = 6.4;
    e.detsize_s = 4.8;
    rc = nbg_describe(ctx, &e, &rep);
    nbgi_test_check(rc == NBG_OK && rep.fpixels == 64 && rep.spixels == 48, "HARD-lib-pixels",
                   "unset counts with a 6.4 x 4.8 mm detector give 64 x 48 (rc %d, got %d x %d)", rc, rep.fpixels,
                   rep.spixels);

    /* (2) 0 is no longer "unset": refused, naming the pixel counts and the values */
    const int badf[] = {0, 32, -2, INT_MIN};
    const int bads[] = {1024, 0, 32, -1};
    for (size_t k = 0; k < sizeof badf / sizeof badf[0]; ++k) {
        base_experiment(&e);
        e.fpixels = badf[k];
        e.spixels = bads[k];
        char want[64];
        snprintf(want, sizeof want, "(got %d x %d)", badf[k], bads[k]);
        rc = nbg_describe(ctx, &e, &rep);
        nbgi_test_check(rc == NBG_EINVAL && strstr(nbg_errmsg(ctx), "pixel counts") != NULL &&
                           strstr(nbg_errmsg(ctx), "-1") != NULL && strstr(nbg_errmsg(ctx), want) != NULL,
                       "HARD-lib-pixels", "fpixels %d, spixels %d is NBG_EINVAL naming the pixel counts (rc %d: %s)",
                       badf[k], bads[k], rc, nbg_errmsg(ctx));
    }

    /* (3) one count unset, the other given: the unset one from its detector size */
    base_experiment(&e);
    e.fpixels = -1;
    e.spixels = 40;
    rc = nbg_describe(ctx, &e, &rep);
    nbgi_test_check(rc == NBG_OK && rep.fpixels == 1024 && rep.spixels == 40, "HARD-lib-pixels",
                   "fpixels -1, spixels 40 give 1024 x 40 (rc %d, got %d x %d)", rc, rep.fpixels, rep.spixels);
    base_experiment(&e);
    e.fpixels = 24;
    e.spixels = -1;
    e.detsize_s = 3.6;
    float img[24 * 36];
    rc = nbg_simulate(ctx, &e, img, 24 * 36, &rep);
    nbgi_test_check(rc == NBG_OK && rep.fpixels == 24 && rep.spixels == 36, "HARD-lib-pixels",
                   "fpixels 24, spixels -1 with a 3.6 mm slow side renders 24 x 36 (rc %d, got %d x %d: %s)", rc,
                   rep.fpixels, rep.spixels, rc == NBG_OK ? "ok" : nbg_errmsg(ctx));
}

static void test_library(void)
{
    nbg_ctx *ctx = NULL;
    nbgi_test_check(nbg_ctx_create(&ctx, NBG_BACKEND_CPU, NBG_DOUBLE, NBG_MAX_THREADS + 1) == NBG_EINVAL &&
                       ctx == NULL,
                   "HARD-lib-threads", "nbg_ctx_create with NBG_MAX_THREADS + 1 threads is NBG_EINVAL");
    if (nbg_ctx_create(&ctx, NBG_BACKEND_CPU, NBG_DOUBLE, 2) != NBG_OK) {
        nbgi_test_check(0, "HARD-lib", "cannot create a context");
        return;
    }
    nbg_limits lim, bad;
    nbg_ctx_limits(ctx, &lim);
    nbgi_test_check(lim.max_bytes == 4.0 * 1024 * 1024 * 1024 && lim.max_samples == 1e12, "HARD-lib-limits",
                   "default limits 4 GiB and 1e12 samples (got %g, %g)", lim.max_bytes, lim.max_samples);
    bad = lim;
    bad.max_bytes = 0;
    nbgi_test_check(nbg_ctx_set_limits(ctx, &bad) == NBG_EINVAL, "HARD-lib-limits", "a zero memory limit is refused");
    bad = lim;
    bad.max_samples = NAN;
    nbgi_test_check(nbg_ctx_set_limits(ctx, &bad) == NBG_EINVAL, "HARD-lib-limits", "a NaN work limit is refused");

    nbg_experiment e;
    nbg_report rep;
    float img[32 * 32];

    /* the work limit counts pixels x samples, as a product */
    base_experiment(&e);
    e.hdivrange = e.vdivrange = 1;
    e.hdivsteps = e.vdivsteps = 10;
    e.phisteps = 10;
    e.osc = 1;
    nbgi_test_check(nbg_describe(ctx, &e, &rep) == NBG_OK, "HARD-lib-work", "a 32x32 run with 100 x 10 samples "
                   "describes (%s)", nbg_errmsg(ctx));
    nbg_limits small = lim;
    small.max_samples = 1e5;
    nbg_ctx_set_limits(ctx, &small);
    int rc = nbg_simulate(ctx, &e, img, 32 * 32, NULL);
    nbgi_test_check(rc == NBG_EINVAL && strstr(nbg_errmsg(ctx), "samples") != NULL, "HARD-lib-work",
                   "with max_samples 1e5 the same run is refused before any work (rc %d: %s)", rc, nbg_errmsg(ctx));
    small = lim;
    small.max_bytes = 1000;
    nbg_ctx_set_limits(ctx, &small);
    rc = nbg_describe(ctx, &e, &rep);
    nbgi_test_check(rc == NBG_ENOMEM && strstr(nbg_errmsg(ctx), "GiB") != NULL, "HARD-lib-memory",
                   "with max_bytes 1000 the 32x32 image is refused by the memory limit (rc %d: %s)", rc,
                   nbg_errmsg(ctx));
    nbg_ctx_set_limits(ctx, &lim);

    /* non-finite images are errors, in every call that makes one */
    base_experiment(&e);
    e.default_F = 1e30;
    rc = nbg_simulate(ctx, &e, img, 32 * 32, NULL);
    nbgi_test_check(rc == NBG_EINVAL && strstr(nbg_errmsg(ctx), "non-finite") != NULL, "HARD-lib-nonfinite",
                   "nbg_simulate with default_F 1e30 fails (rc %d: %s)", rc, nbg_errmsg(ctx));
    float dl[32 * 32];
    for (int i = 0; i < 32 * 32; ++i) {
        dl[i] = 1;
    }
    double g = 0;
    const nbg_param pa = NBG_P_A;
    rc = nbg_simulate_grad(ctx, &e, dl, &pa, 1, &g, img, 32 * 32, NULL);
    nbgi_test_check(rc == NBG_EINVAL && strstr(nbg_errmsg(ctx), "non-finite") != NULL, "HARD-lib-nonfinite",
                   "nbg_simulate_grad with default_F 1e30 fails (rc %d: %s)", rc, nbg_errmsg(ctx));
    double L = 0;
    rc = nbg_loss_grad(ctx, &e, NBG_LOSS_LSQ, dl, NULL, &pa, 1, &L, &g, img, 32 * 32);
    nbgi_test_check(rc == NBG_EINVAL && strstr(nbg_errmsg(ctx), "non-finite") != NULL, "HARD-lib-nonfinite",
                   "nbg_loss_grad with default_F 1e30 fails (rc %d: %s)", rc, nbg_errmsg(ctx));
    double tan[32 * 32];
    rc = nbg_simulate_jvp(ctx, &e, &pa, 1, tan, img, 32 * 32);
    nbgi_test_check(rc == NBG_EINVAL && strstr(nbg_errmsg(ctx), "non-finite") != NULL, "HARD-lib-nonfinite",
                   "nbg_simulate_jvp with default_F 1e30 fails (rc %d: %s)", rc, nbg_errmsg(ctx));

    /* every documented domain: a few spot checks through the library (the program's cases cover the rest) */
    base_experiment(&e);
    e.polarization = 1.5;
    nbgi_test_check(nbg_describe(ctx, &e, &rep) == NBG_EINVAL, "HARD-lib-domain", "polarization 1.5 is refused");
    base_experiment(&e);
    e.phisteps = 0;
    nbgi_test_check(nbg_describe(ctx, &e, &rep) == NBG_EINVAL, "HARD-lib-domain", "phisteps 0 is refused");
    base_experiment(&e);
    e.cell[3] = e.cell[4] = e.cell[5] = 120;
    nbgi_test_check(nbg_describe(ctx, &e, &rep) == NBG_EINVAL, "HARD-lib-domain", "a flat cell is refused");

    /* pixel counts: unset is -1 (derived from the detector size), as every count; 0 or below -1 is refused */
    test_pixel_counts(ctx);

    /* gradcheck's tolerances */
    nbg_gradcheck_result res[1];
    base_experiment(&e);
    rc = nbg_gradcheck(ctx, &e, &pa, 1, 0, 1, res);
    nbgi_test_check(rc == NBG_EINVAL, "HARD-lib-gradcheck", "nbg_gradcheck with rtol 0 is NBG_EINVAL (was the "
                   "default)");
    rc = nbg_gradcheck(ctx, &e, &pa, 1, 1e-6, -1, res);
    nbgi_test_check(rc == NBG_EINVAL, "HARD-lib-gradcheck", "nbg_gradcheck with h_scale -1 is NBG_EINVAL");

#ifndef NBG_NO_REFINE
    /* refinement against an image without signal */
    static float zero[32 * 32];
    nbg_refine_options ro;
    nbg_refine_options_default(&ro);
    nbg_refine_result rr = {0};
    rc = nbg_refine(ctx, &e, zero, NULL, 32 * 32, &pa, 1, &ro, &rr);
    nbgi_test_check(rc == NBG_EINVAL && strstr(nbg_errmsg(ctx), "no signal") != NULL, "HARD-lib-refine",
                   "nbg_refine against an all-zero image is refused (rc %d: %s)", rc, nbg_errmsg(ctx));
    nbg_refine_result_free(&rr);
#endif
    nbg_ctx_destroy(ctx);
}

int main(void)
{
    if (!clirun_setup("nbg-test-harden-")) {
        return nbgi_test_summary();
    }
    test_values();
    test_big_tables();
    test_files();
    test_messages();
    test_inputs();
    test_all_overloads();
    test_memory_limit();
    test_library();
    nbgi_test_rmtree(g_root);
    return nbgi_test_summary();
}
