/*
 * test-io.c -- checks of the file readers and writers in src/io.c: HKL text, Fdump, SMV, PGM, float images,
 * source files and matrix files.
 *
 * Prints one line per check ("PASS <id> <what>", "FAIL <id> <what> ...", or "SKIP <id> <what> ..." when the golden
 * folder is missing) and a final "N passed, M failed"; exits 0 only when nothing failed.  Temporary files live in
 * a fresh directory under $TMPDIR (or /tmp) that is removed at the end.  The golden folder is $NBG_GOLDEN, or
 * ../shared/golden relative to the repository root the tests run from.
 */
#include "internal.h"
#include "io.h"
#include "nbgrad.h"

#include <dirent.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

typedef struct {
    int passed, failed;
    char tmp[4096];    /* the temporary directory */
    char golden[4096]; /* the golden folder, "" when absent */
} env;

static void check(env *t, int ok, const char *id, const char *what, const char *fmt, ...)
{
    if (ok) {
        printf("PASS %s %s\n", id, what);
        ++t->passed;
        return;
    }
    printf("FAIL %s %s", id, what);
    if (fmt != NULL) {
        va_list ap;
        va_start(ap, fmt);
        printf(" (");
        vprintf(fmt, ap);
        printf(")");
        va_end(ap);
    }
    printf("\n");
    ++t->failed;
}

static void skip(const env *t, const char *id, const char *what)
{
    printf("SKIP %s %s (golden folder not found; set NBG_GOLDEN)\n", id, what);
    (void)t;
}

/* Builds the path of a file in the temporary directory. */
static const char *tmp_path(const env *t, const char *name, char *buf, size_t size)
{
    snprintf(buf, size, "%s/%s", t->tmp, name);
    return buf;
}

static const char *golden_path(const env *t, const char *name, char *buf, size_t size)
{
    snprintf(buf, size, "%s/%s", t->golden, name);
    return buf;
}

/* Writes text to a temporary file and returns its path (in buf). */
static const char *write_text(const env *t, const char *name, const char *text, char *buf, size_t size)
{
    tmp_path(t, name, buf, size);
    FILE *fp = fopen(buf, "w");
    if (fp != NULL) {
        fputs(text, fp);
        fclose(fp);
    }
    return buf;
}

/* Writes a hand-made SMV file: the 512-byte header hdr, then two uint16 pixels; returns the path. */
static const char *write_smv2(const env *t, const char *name, const char *hdr, const uint16_t px[2], char *buf,
                              size_t size)
{
    tmp_path(t, name, buf, size);
    FILE *fp = fopen(buf, "wb");
    if (fp != NULL) {
        fwrite(hdr, 1, 512, fp);
        fwrite(px, sizeof px[0], 2, fp);
        fclose(fp);
    }
    return buf;
}

static long file_size(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0 ? (long)st.st_size : -1;
}

/* Reads a whole file into a malloc'd buffer; NULL on failure. */
static unsigned char *read_all(const char *path, size_t *len)
{
    FILE *fp = fopen(path, "rb");
    if (fp == NULL)
        return NULL;
    long n = file_size(path);
    unsigned char *buf = n >= 0 ? malloc((size_t)n + 1) : NULL;
    if (buf != NULL && fread(buf, 1, (size_t)n, fp) != (size_t)n) {
        free(buf);
        buf = NULL;
    }
    fclose(fp);
    if (buf != NULL)
        *len = (size_t)n;
    return buf;
}

/* Copies the first n bytes of src to dst. */
static int copy_prefix(const char *src, const char *dst, size_t n)
{
    size_t len;
    unsigned char *buf = read_all(src, &len);
    if (buf == NULL)
        return -1;
    FILE *fp = fopen(dst, "wb");
    int ok = fp != NULL && fwrite(buf, 1, n < len ? n : len, fp) == (n < len ? n : len);
    if (fp != NULL)
        fclose(fp);
    free(buf);
    return ok ? 0 : -1;
}

static int same_table(const nbg_hkl *a, const nbg_hkl *b)
{
    if (a->F == NULL || b->F == NULL || a->h_min != b->h_min || a->h_max != b->h_max || a->k_min != b->k_min
        || a->k_max != b->k_max || a->l_min != b->l_min || a->l_max != b->l_max)
        return 0;
    size_t n = (size_t)(a->h_max - a->h_min + 1) * (size_t)(a->k_max - a->k_min + 1) * (size_t)(a->l_max - a->l_min + 1);
    return memcmp(a->F, b->F, n * sizeof *a->F) == 0;
}

static double hkl_at(const nbg_hkl *t, int h, int k, int l)
{
    int nk = t->k_max - t->k_min + 1, nl = t->l_max - t->l_min + 1;
    return t->F[((h - t->h_min) * nk + (k - t->k_min)) * nl + (l - t->l_min)];
}

static int close_to(double a, double b)
{
    return fabs(a - b) <= 1e-5 * fmax(1.0, fabs(b));
}

/* ---------------------------------------------------------------------------------------------------------- */

static void test_hkl(env *t, nbg_ctx *ctx)
{
    char p4[4200], p5[4200], p6[4200], p[4200];
    const char *four = "0 0 0 100\n-1 2 -3 7.5\n2 -2 1 12\n";
    const char *five = "# h k l F sigma\n0 0 0 100 1\n\n-1 2 -3 7.5 0.5\n  # indented comment\n2 -2 1 12 3\n";
    const char *six = "0\t0\t0\t100\t1\t0\n-1 2 -3 7.5 0.5 90   # trailing comment\n2 -2 1 12.0 3 -90\n\n";
    write_text(t, "four.hkl", four, p4, sizeof p4);
    write_text(t, "five.hkl", five, p5, sizeof p5);
    write_text(t, "six.hkl", six, p6, sizeof p6);

    nbg_hkl a, b, c;
    int ra = nbg_hkl_read(ctx, p4, 0.0, &a);
    int rb = nbg_hkl_read(ctx, p5, 0.0, &b);
    int rc = nbg_hkl_read(ctx, p6, 0.0, &c);
    int ok = ra == NBG_OK && rb == NBG_OK && rc == NBG_OK && same_table(&a, &b) && same_table(&a, &c);
    check(t, ok, "hkl-columns", "4, 5 and 6 columns, comments and blank lines give the same table", "rc %d %d %d: %s",
          ra, rb, rc, nbg_errmsg(ctx));
    ok = ra == NBG_OK && a.h_min == -1 && a.h_max == 2 && a.k_min == -2 && a.k_max == 2 && a.l_min == -3
         && a.l_max == 1 && a.nrefl == 3 && hkl_at(&a, -1, 2, -3) == 7.5 && hkl_at(&a, 2, -2, 1) == 12.0
         && hkl_at(&a, 0, 0, 0) == 100.0;
    check(t, ok, "hkl-negative", "negative indices give the right bounds, count and values", NULL);
    nbg_hkl_free(&a);
    nbg_hkl_free(&b);
    nbg_hkl_free(&c);

    ra = nbg_hkl_read(ctx, p4, 3.25, &a);
    ok = ra == NBG_OK && hkl_at(&a, 1, 1, 1) == 3.25 && hkl_at(&a, -1, -2, -3) == 3.25 && hkl_at(&a, 0, 0, 0) == 100.0;
    check(t, ok, "hkl-default", "unlisted entries hold default_F", NULL);
    nbg_hkl_free(&a);

    write_text(t, "dup.hkl", "1 1 1 5\n1 1 1 9\n", p, sizeof p);
    ra = nbg_hkl_read(ctx, p, 0.0, &a);
    check(t, ra == NBG_OK && a.F[0] == 9.0 && a.nrefl == 2, "hkl-duplicate", "the last duplicate entry wins", NULL);
    nbg_hkl_free(&a);

    write_text(t, "bad.hkl", "0 0 0 1\n# comment\n1 x 0 2\n", p, sizeof p);
    ra = nbg_hkl_read(ctx, p, 0.0, &a);
    char want[4300];
    snprintf(want, sizeof want, "%s:3:", p);
    check(t, ra == NBG_EFORMAT && strstr(nbg_errmsg(ctx), want) != NULL && a.F == NULL, "hkl-malformed",
          "a malformed line is NBG_EFORMAT naming file and line", "rc %d: %s", ra, nbg_errmsg(ctx));

    write_text(t, "frac.hkl", "0 0 0 1\n1.5 0 0 2\n", p, sizeof p);
    ra = nbg_hkl_read(ctx, p, 0.0, &a);
    snprintf(want, sizeof want, "%s:2:", p);
    check(t, ra == NBG_EFORMAT && strstr(nbg_errmsg(ctx), want) != NULL, "hkl-nonint",
          "a non-integer index is NBG_EFORMAT naming file and line", "rc %d: %s", ra, nbg_errmsg(ctx));

    write_text(t, "short.hkl", "0 0 0\n", p, sizeof p);
    ra = nbg_hkl_read(ctx, p, 0.0, &a);
    check(t, ra == NBG_EFORMAT, "hkl-short", "a line with three fields is NBG_EFORMAT", "rc %d: %s", ra,
          nbg_errmsg(ctx));

    write_text(t, "nanF.hkl", "0 0 0 nan\n", p, sizeof p);
    ra = nbg_hkl_read(ctx, p, 0.0, &a);
    check(t, ra == NBG_EFORMAT, "hkl-nan", "a non-finite F is NBG_EFORMAT", "rc %d: %s", ra, nbg_errmsg(ctx));

    write_text(t, "empty.hkl", "# nothing here\n\n", p, sizeof p);
    ra = nbg_hkl_read(ctx, p, 0.0, &a);
    check(t, ra != NBG_OK && a.F == NULL, "hkl-empty", "an HKL file with no reflections is an error", "rc %d", ra);

    tmp_path(t, "does-not-exist.hkl", p, sizeof p);
    ra = nbg_hkl_read(ctx, p, 0.0, &a);
    check(t, ra == NBG_EIO && strstr(nbg_errmsg(ctx), p) != NULL, "hkl-missing",
          "a missing HKL file is NBG_EIO naming it", "rc %d: %s", ra, nbg_errmsg(ctx));
}

static void test_fdump(env *t, nbg_ctx *ctx)
{
    char p[4200], d[4200];
    write_text(t, "fd.hkl", "-2 0 1 3.5\n1 3 -1 -7\n0 0 0 1e3\n", p, sizeof p);
    nbg_hkl a, b;
    int ra = nbg_hkl_read(ctx, p, 0.5, &a);
    tmp_path(t, "Fdump.bin", d, sizeof d);
    int rw = ra == NBG_OK ? nbg_hkl_write_fdump(ctx, d, &a) : ra;
    int rb = rw == NBG_OK ? nbg_hkl_read_fdump(ctx, d, &b) : rw;
    long nr = (long)(a.h_max - a.h_min + 1) * (a.k_max - a.k_min + 1) * (a.l_max - a.l_min + 1);
    check(t, rb == NBG_OK && same_table(&a, &b) && b.nrefl == nr, "fdump-roundtrip",
          "Fdump write then read gives the identical table", "rc %d %d %d: %s", ra, rw, rb, nbg_errmsg(ctx));
    if (rb == NBG_OK)
        nbg_hkl_free(&b);

    /* The layout: header text, form feed, one padding slot per axis (zero). */
    size_t len = 0;
    unsigned char *raw = read_all(d, &len);
    const char *head = "-2 1 0 3 -1 1\n\f";
    size_t hl = strlen(head);
    size_t nd = (size_t)(4 + 1) * (4 + 1) * (3 + 1);
    int ok = raw != NULL && len == hl + nd * 8 && memcmp(raw, head, hl) == 0;
    if (ok) {
        double first, pad;
        memcpy(&first, raw + hl, 8);                   /* F(-2,0,-1) = default 0.5 */
        memcpy(&pad, raw + hl + 3 * 8, 8);             /* the l padding slot of (h,k) = (0,0) */
        ok = first == 0.5 && pad == 0.0;
    }
    check(t, ok, "fdump-layout", "Fdump header, padding and size follow the reference layout", "size %zu", len);

    /* A truncated dump is malformed. */
    char tr[4200];
    tmp_path(t, "Fdump-trunc.bin", tr, sizeof tr);
    copy_prefix(d, tr, len > 20 ? len - 20 : 0);
    rb = nbg_hkl_read_fdump(ctx, tr, &b);
    check(t, rb == NBG_EFORMAT && b.F == NULL, "fdump-truncated", "a truncated Fdump is NBG_EFORMAT", "rc %d: %s", rb,
          nbg_errmsg(ctx));
    free(raw);
    nbg_hkl_free(&a);

    write_text(t, "notdump.bin", "hello world\n", p, sizeof p);
    rb = nbg_hkl_read_fdump(ctx, p, &b);
    check(t, rb == NBG_EFORMAT, "fdump-badheader", "a file without the Fdump header is NBG_EFORMAT", "rc %d: %s", rb,
          nbg_errmsg(ctx));

    if (t->golden[0] == '\0') {
        skip(t, "fdump-golden", "Fdump of P1.hkl has the reference size");
        return;
    }
    golden_path(t, "data/P1.hkl", p, sizeof p);
    ra = nbg_hkl_read(ctx, p, 0.0, &a);
    tmp_path(t, "Fdump-P1.bin", d, sizeof d);
    rw = ra == NBG_OK ? nbg_hkl_write_fdump(ctx, d, &a) : ra;
    ok = rw == NBG_OK;
    if (ok) {
        char hbuf[128];
        int hlen = snprintf(hbuf, sizeof hbuf, "%d %d %d %d %d %d\n\f", a.h_min, a.h_max, a.k_min, a.k_max, a.l_min,
                            a.l_max);
        long hr = a.h_max - a.h_min + 1, kr = a.k_max - a.k_min + 1, lr = a.l_max - a.l_min + 1;
        ok = a.nrefl == 15625 && hr == 25 && file_size(d) == hlen + (hr + 1) * (kr + 1) * (lr + 1) * 8;
        rb = nbg_hkl_read_fdump(ctx, d, &b);
        ok = ok && rb == NBG_OK && same_table(&a, &b) && b.nrefl == hr * kr * lr;
        if (rb == NBG_OK)
            nbg_hkl_free(&b);
    }
    check(t, ok, "fdump-golden", "Fdump of P1.hkl has header + (hr+1)(kr+1)(lr+1)*8 bytes and reads back",
          "rc %d %d: %s", ra, rw, nbg_errmsg(ctx));
    nbg_hkl_free(&a);
}

static void fill_header(nbg_smv_header *h)
{
    memset(h, 0, sizeof *h);
    h->fpixels = 7;
    h->spixels = 5;
    h->pixel = 0.172;
    h->distance = 150.5;
    h->close_distance = 149.25;
    h->lambda = 1.3;
    h->Xbeam = 10.3;
    h->Ybeam = 12.9;
    h->Fbeam = 0.6;
    h->Sbeam = 0.43;
    h->detsize_s = 0.86;
    h->dials_origin[0] = -0.6;
    h->dials_origin[1] = 0.43;
    h->dials_origin[2] = -150.5;
    h->ORGX = 3.5;
    h->ORGY = 2.5;
    h->phi0 = 2;
    h->osc = 0.5;
    h->twotheta = 8;
}

static void test_smv(env *t, nbg_ctx *ctx)
{
    char p[4200];
    nbg_smv_header h, r;
    fill_header(&h);
    uint16_t data[35];
    for (int i = 0; i < 35; ++i)
        data[i] = (uint16_t)(i * 1871 + 3);
    tmp_path(t, "rt.img", p, sizeof p);
    int rw = nbg_write_smv(ctx, p, &h, data);
    uint16_t *back = NULL;
    int rr = rw == NBG_OK ? nbg_read_smv(ctx, p, &r, &back) : rw;
    int ok = rr == NBG_OK && back != NULL && r.fpixels == 7 && r.spixels == 5 && close_to(r.pixel, h.pixel)
             && close_to(r.distance, h.distance) && close_to(r.close_distance, h.close_distance)
             && close_to(r.lambda, h.lambda) && close_to(r.Xbeam, h.Xbeam) && close_to(r.Ybeam, h.Ybeam)
             && close_to(r.ORGX, h.ORGX) && close_to(r.ORGY, h.ORGY) && close_to(r.phi0, h.phi0)
             && close_to(r.osc, h.osc) && close_to(r.twotheta, h.twotheta) && memcmp(back, data, sizeof data) == 0;
    check(t, ok, "smv-roundtrip", "SMV write then read keeps header values and pixels", "rc %d %d: %s", rw, rr,
          nbg_errmsg(ctx));
    /* CLOSE_DISTANCE follows DISTANCE in the header; DISTANCE must still read as DISTANCE. */
    check(t, rr == NBG_OK && r.distance == 150.5 && r.close_distance == 149.25, "smv-keymatch",
          "DISTANCE is not confused with a later CLOSE_DISTANCE", "distance %g close %g", r.distance, r.close_distance);
    free(back);
    back = NULL;

    size_t len = 0;
    unsigned char *raw = read_all(p, &len);
    ok = raw != NULL && len == 512 + sizeof data && memcmp(raw, "{\nHEADER_BYTES=512;\nDIM=2;\nBYTE_ORDER=", 38) == 0
         && raw[511] == ' ' && strstr((const char *)raw, "DIALS_ORIGIN=-0.6,0.43,-150.5\nXDS_ORGX=3.5;") != NULL
         && strstr((const char *)raw, "ADXV_CENTER_Y=0.43;\nMOSFLM_CENTER_X=0.344;\nMOSFLM_CENTER_Y=0.514;\n")
                != NULL
         && strstr((const char *)raw, "BEAMLINE=fake;\n}\f ") != NULL;
    check(t, ok, "smv-layout", "SMV header text, derived centres and 512-byte padding", "size %zu", len);
    free(raw);

    /* Another header with the opposite byte order: the data are swapped on reading. */
    {
        int little;
        uint16_t one = 1;
        unsigned char b0;
        memcpy(&b0, &one, 1);
        little = b0 == 1;
        char hdr[512];
        memset(hdr, ' ', sizeof hdr);
        int n = snprintf(hdr, sizeof hdr, "{\nHEADER_BYTES=512;\nDIM=2;\nBYTE_ORDER=%s;\nTYPE=unsigned_short;\n"
                         "SIZE1=2;\nSIZE2=1;\nDISTANCE=100;\nCLOSE_DISTANCE=90;\nDISTANCE=120;\nXDS_ORGX=4;\n}\f",
                         little ? "big_endian" : "little_endian");
        hdr[n] = ' ';
        uint16_t px[2] = {0x0102, 0xA0B0};
        write_smv2(t, "swap.img", hdr, px, p, sizeof p);
        rr = nbg_read_smv(ctx, p, &r, &back);
        ok = rr == NBG_OK && back != NULL && back[0] == 0x0201 && back[1] == 0xB0A0;
        check(t, ok, "smv-byteswap", "pixels are swapped when BYTE_ORDER differs from the host", "rc %d: %s", rr,
              nbg_errmsg(ctx));
        ok = rr == NBG_OK && r.distance == 120.0 && r.close_distance == 90.0 && r.ORGX == 4.0 && isnan(r.ORGY)
             && isnan(r.pixel) && isnan(r.lambda);
        check(t, ok, "smv-lastkey", "the last occurrence of a key wins, XDS_ORGX is ORGX, absent keys are NAN",
              "distance %g close %g ORGX %g", r.distance, r.close_distance, r.ORGX);
        free(back);
        back = NULL;
    }

    /* The start angle: PHI, else OSC_START; nbg_read_image says the file stated it (scan_stated) */
    {
        const char *const heads[3] = {"OSC_START=4.5;\nOSC_RANGE=0.25;\n", "PHI=3;\nOSC_START=4.5;\n", ""};
        const double want[3] = {4.5, 3, NAN};
        const int stated[3] = {2, 1, 0};
        for (int k = 0; k < 3; ++k) {
            char hdr[512];
            memset(hdr, ' ', sizeof hdr);
            const int n = snprintf(hdr, sizeof hdr, "{\nHEADER_BYTES=512;\nDIM=2;\nTYPE=unsigned_short;\nSIZE1=2;\n"
                                   "SIZE2=1;\n%s}\f", heads[k]);
            hdr[n] = ' ';
            const uint16_t px[2] = {1, 2};
            write_smv2(t, "angle.img", hdr, px, p, sizeof p);
            rr = nbg_read_smv(ctx, p, &r, NULL);
            float *im = NULL;
            size_t nim = 0;
            nbg_geometry gg;
            const int ri = nbg_read_image(ctx, p, 0, 0, &im, &nim, &gg, NULL, NULL);
            free(im);
            ok = rr == NBG_OK && (isnan(want[k]) ? isnan(r.phi0) : r.phi0 == want[k]) && ri == NBG_OK &&
                 gg.scan_stated == stated[k] && (stated[k] == 0 ? gg.scan_start == 0 : gg.scan_start == want[k]) &&
                 gg.scan_width == (stated[k] == 2 ? 0.25 : 0);
            check(t, ok, k == 0 ? "smv-osc-start" : k == 1 ? "smv-phi-first" : "smv-no-angle",
                  k == 0 ? "without PHI the start angle is OSC_START's; the image states start and width"
                  : k == 1 ? "PHI is the start angle where both are given; the image states the start only"
                           : "a header without an angle: phi0 NAN, the image states no scan",
                  "rc %d/%d phi0 %g, scan_stated %d start %g width %g: %s", rr, ri, r.phi0, gg.scan_stated,
                  gg.scan_start, gg.scan_width, nbg_errmsg(ctx));
        }
    }

    /* This file starts like an SMV header but is far shorter than the 512 bytes it declares. */
    write_text(t, "notsmv.img", "{\nHEADER_BYTES=512;\n", p, sizeof p);
    rr = nbg_read_smv(ctx, p, &r, &back);
    check(t, rr == NBG_EFORMAT && back == NULL, "smv-shortheader", "a file shorter than its header is NBG_EFORMAT",
          "rc %d: %s", rr, nbg_errmsg(ctx));
    write_text(t, "magic.img", "P5\n128 128\n255\n", p, sizeof p);
    rr = nbg_read_smv(ctx, p, &r, &back);
    check(t, rr == NBG_EFORMAT && back == NULL, "smv-magic",
          "a file not starting with \"{\\nHEADER_BYT\" is NBG_EFORMAT", "rc %d: %s", rr, nbg_errmsg(ctx));
    tmp_path(t, "absent.img", p, sizeof p);
    rr = nbg_read_smv(ctx, p, &r, &back);
    check(t, rr == NBG_EIO, "smv-missing", "a missing SMV file is NBG_EIO", "rc %d", rr);

    if (t->golden[0] == '\0') {
        skip(t, "smv-mask", "golden mask.img reads");
        skip(t, "smv-header", "golden header.img reads with its header values");
        skip(t, "smv-truncated", "a truncated SMV is NBG_EFORMAT");
        skip(t, "smv-golden-bytes", "writing a golden header reproduces the reference file");
        return;
    }

    char g[4200];
    golden_path(t, "data/mask.img", g, sizeof g);
    rr = nbg_read_smv(ctx, g, &r, &back);
    ok = rr == NBG_OK && back != NULL && r.fpixels == 128 && r.spixels == 128 && r.pixel == 0.1 && isnan(r.distance)
         && isnan(r.lambda) && isnan(r.Xbeam);
    if (ok) {
        long zeros = 0, ones = 0;
        for (int i = 0; i < 128 * 128; ++i) {
            zeros += back[i] == 0;
            ones += back[i] == 1;
        }
        ok = zeros > 0 && ones > 0 && zeros + ones == 128 * 128;
    }
    check(t, ok, "smv-mask", "golden mask.img reads as a 128x128 0/1 mask with PIXEL_SIZE 0.1", "rc %d: %s", rr,
          nbg_errmsg(ctx));
    free(back);
    back = NULL;

    golden_path(t, "data/header.img", g, sizeof g);
    rr = nbg_read_smv(ctx, g, &r, NULL);
    ok = rr == NBG_OK && r.fpixels == 128 && r.spixels == 128 && r.pixel == 0.172 && r.distance == 150.5
         && r.lambda == 1.3 && r.Xbeam == 10.3 && r.Ybeam == 12.9 && r.phi0 == 2.0 && r.osc == 0.5
         && isnan(r.close_distance) && isnan(r.ORGX) && isnan(r.ORGY) && isnan(r.twotheta);
    check(t, ok, "smv-header", "golden header.img gives its header values", "rc %d: %s", rr, nbg_errmsg(ctx));

    tmp_path(t, "trunc.img", p, sizeof p);
    copy_prefix(g, p, 600);
    rr = nbg_read_smv(ctx, p, &r, &back);
    ok = rr == NBG_EFORMAT && back == NULL && strstr(nbg_errmsg(ctx), p) != NULL
         && strstr(nbg_errmsg(ctx), "33280") != NULL && strstr(nbg_errmsg(ctx), "600") != NULL;
    check(t, ok, "smv-truncated", "a truncated SMV is NBG_EFORMAT naming expected and actual sizes", "rc %d: %s", rr,
          nbg_errmsg(ctx));

    /* The writer reproduces a reference file byte for byte, given the values the reference derived. */
    {
        nbg_smv_header w;
        memset(&w, 0, sizeof w);
        w.fpixels = w.spixels = 256;
        w.pixel = 0.1;
        w.distance = 99.0872;
        w.close_distance = 98.8911;
        w.lambda = 1;
        w.Xbeam = w.Ybeam = 12.85;
        w.Fbeam = 12.8639;
        w.Sbeam = 13.0307;
        w.detsize_s = 25.6;
        w.dials_origin[0] = -11.7105;
        w.dials_origin[1] = 13.9246;
        w.dials_origin[2] = -101.337;
        w.ORGX = 90.0003;
        w.ORGY = 272.66;
        w.twotheta = 10;
        golden_path(t, "images/detector_rotations.int.img", g, sizeof g);
        size_t glen = 0;
        unsigned char *gold = read_all(g, &glen);
        uint16_t one = 1;
        unsigned char b0;
        memcpy(&b0, &one, 1);
        if (gold == NULL || glen != 512 + 256 * 256 * 2 || b0 != 1) {
            printf("SKIP smv-golden-bytes writing a golden header reproduces the reference file (%s)\n",
                   gold == NULL ? "file missing" : "big-endian host");
        } else {
            uint16_t *px = malloc(256 * 256 * sizeof *px);
            memcpy(px, gold + 512, 256 * 256 * sizeof *px);
            tmp_path(t, "rot.img", p, sizeof p);
            rw = nbg_write_smv(ctx, p, &w, px);
            size_t mlen = 0;
            unsigned char *mine = rw == NBG_OK ? read_all(p, &mlen) : NULL;
            ok = mine != NULL && mlen == glen && memcmp(mine, gold, glen) == 0;
            check(t, ok, "smv-golden-bytes", "writing detector_rotations' values reproduces the reference file exactly",
                  "rc %d", rw);
            free(mine);
            free(px);
        }
        free(gold);
    }

    /* nbg_smv_header_from_report copies the report's geometry. */
    {
        nbg_report rep;
        memset(&rep, 0, sizeof rep);
        rep.fpixels = 3;
        rep.spixels = 4;
        rep.pixel = 0.1;
        rep.distance = 100;
        rep.close_distance = 99;
        rep.lambda = 1.5;
        rep.Xbeam = 1;
        rep.Ybeam = 2;
        rep.Fbeam = 3;
        rep.Sbeam = 4;
        rep.detsize_s = 0.4;
        rep.dials_origin[2] = -100;
        rep.ORGX = 5;
        rep.ORGY = 6;
        rep.phi0 = 7;
        rep.osc = 8;
        rep.twotheta = 9;
        nbg_smv_header w;
        nbg_smv_header_from_report(&rep, &w);
        ok = w.fpixels == 3 && w.spixels == 4 && w.pixel == 0.1 && w.distance == 100 && w.close_distance == 99
             && w.lambda == 1.5 && w.Xbeam == 1 && w.Ybeam == 2 && w.Fbeam == 3 && w.Sbeam == 4 && w.detsize_s == 0.4
             && w.dials_origin[2] == -100 && w.ORGX == 5 && w.ORGY == 6 && w.phi0 == 7 && w.osc == 8
             && w.twotheta == 9;
        check(t, ok, "smv-from-report", "nbg_smv_header_from_report copies the report's values", NULL);
    }
}

static void test_images(env *t, nbg_ctx *ctx)
{
    char p[4200];
    const float img[6] = {-1.0f, 0.0f, 0.99f, 1.5f, 1000.0f, NAN};
    tmp_path(t, "small.pgm", p, sizeof p);
    int rw = nbg_write_pgm(ctx, p, img, 3, 2, 2.0);
    size_t len = 0;
    unsigned char *raw = rw == NBG_OK ? read_all(p, &len) : NULL;
    const char *head = "P5\n3 2\n# pixels scaled by 2\n255\n";
    size_t hl = strlen(head);
    const unsigned char want[6] = {0, 0, 1, 3, 255, 0};
    int ok = raw != NULL && len == hl + 6 && memcmp(raw, head, hl) == 0 && memcmp(raw + hl, want, 6) == 0;
    check(t, ok, "pgm-small", "PGM header and truncated, clipped pixels", "rc %d size %zu", rw, len);
    free(raw);

    const float f[4] = {1.5f, -2.0f, 3.25f, 1e30f};
    tmp_path(t, "f.bin", p, sizeof p);
    rw = nbg_write_float(ctx, p, f, 4);
    raw = rw == NBG_OK ? read_all(p, &len) : NULL;
    check(t, raw != NULL && len == sizeof f && memcmp(raw, f, sizeof f) == 0, "float-write",
          "the float image is written raw", "rc %d", rw);
    free(raw);

    /* A failed write leaves no file behind. */
    char bad[4300];
    snprintf(bad, sizeof bad, "%s/no-such-dir/f.bin", t->tmp);
    rw = nbg_write_float(ctx, bad, f, 4);
    check(t, rw == NBG_EIO && file_size(bad) < 0, "write-fail", "writing into a missing directory is NBG_EIO",
          "rc %d", rw);

    if (t->golden[0] == '\0') {
        skip(t, "pgm-golden", "PGM of the golden float image matches the reference PGM");
        return;
    }
    char g[4200];
    golden_path(t, "images/pgm.float.bin", g, sizeof g);
    size_t flen = 0;
    unsigned char *fraw = read_all(g, &flen);
    golden_path(t, "images/pgm.pgm", g, sizeof g);
    size_t glen = 0;
    unsigned char *gold = read_all(g, &glen);
    ok = 0;
    if (fraw != NULL && gold != NULL && flen == 128 * 128 * sizeof(float)) {
        float *fl = malloc(flen);
        memcpy(fl, fraw, flen);
        tmp_path(t, "golden.pgm", p, sizeof p);
        rw = nbg_write_pgm(ctx, p, fl, 128, 128, 4.72387);
        raw = rw == NBG_OK ? read_all(p, &len) : NULL;
        ok = raw != NULL && len == glen && glen > 128 * 128 && memcmp(raw, gold, glen - 128 * 128) == 0;
        for (size_t i = glen - 128 * 128; ok && i < glen; ++i)
            ok = abs((int)raw[i] - (int)gold[i]) <= 1;
        free(raw);
        free(fl);
    }
    check(t, ok, "pgm-golden", "PGM of the golden float image matches the reference PGM (header exact, pixels +-1)",
          NULL);
    free(fraw);
    free(gold);
}

static void test_sources(env *t, nbg_ctx *ctx)
{
    char p[4200];
    double beam[3] = {1, 0, 0};
    nbg_source *s = NULL;
    int n = 0;
    write_text(t, "src.txt",
               "# X Y Z weight lambda\n-10 0 0 1 1.0e-10\n\n-10,0.5;0.1:1!2e-10\n   # indented comment\n0 1\n", p,
               sizeof p);
    int rr = nbgi_read_sources(ctx, p, 1.25, beam, &s, &n);
    int ok = rr == NBG_OK && n == 3;
    for (int i = 0; ok && i < n; ++i)
        ok = !isnan(s[i].pos[0]) && !isnan(s[i].pos[1]) && !isnan(s[i].pos[2]) && !isnan(s[i].lambda);
    check(t, ok, "sources-comment", "a '#' line is a comment: right count and no NaN", "rc %d n %d: %s", rr, n,
          nbg_errmsg(ctx));
    ok = ok && close_to(s[0].lambda, 1.0) && close_to(s[1].lambda, 2.0) && s[1].pos[1] == 0.5 && s[1].pos[2] == 0.1
         && s[2].pos[0] == 0.0 && s[2].pos[1] == 1.0 && s[2].pos[2] == -0.0 && s[2].lambda == 1.25;
    check(t, ok, "sources-fields", "all delimiters work, lambda is converted to A, missing fields take defaults",
          NULL);
    free(s);
    s = NULL;

    write_text(t, "src-default.txt", "\n\n5e-3\n", p, sizeof p);
    rr = nbgi_read_sources(ctx, p, 1.0, beam, &s, &n);
    ok = rr == NBG_OK && n == 1 && s[0].pos[0] == 5e-3 && s[0].pos[1] == 0.0 && s[0].pos[2] == 0.0;
    check(t, ok, "sources-defaults", "a single field gives X and the default Y, Z from -10*beam", "rc %d", rr);
    free(s);
    s = NULL;
    beam[0] = 0;
    beam[2] = -1;
    write_text(t, "src-default2.txt", "\n", p, sizeof p);
    rr = nbgi_read_sources(ctx, p, 1.0, beam, &s, &n);
    check(t, rr != NBG_OK && s == NULL && n == 0, "sources-empty", "a source file with no sources is an error",
          "rc %d", rr);
    write_text(t, "src-bad.txt", "-10 0 0\n-10 abc 0\n", p, sizeof p);
    rr = nbgi_read_sources(ctx, p, 1.0, beam, &s, &n);
    char want[4300];
    snprintf(want, sizeof want, "%s:2:", p);
    check(t, rr == NBG_EFORMAT && strstr(nbg_errmsg(ctx), want) != NULL, "sources-malformed",
          "a malformed number is NBG_EFORMAT naming file and line", "rc %d: %s", rr, nbg_errmsg(ctx));

    if (t->golden[0] == '\0') {
        skip(t, "sources-golden", "golden sources.txt parses");
        return;
    }
    golden_path(t, "data/sources.txt", p, sizeof p);
    beam[0] = 1;
    beam[2] = 0;
    rr = nbgi_read_sources(ctx, p, 1.0, beam, &s, &n);
    ok = rr == NBG_OK && n == 2 && s[0].pos[0] == -10 && s[1].pos[1] == 0.002 && s[1].pos[2] == 0.001
         && close_to(s[0].lambda, 1.0) && close_to(s[1].lambda, 1.02);
    check(t, ok, "sources-golden", "golden sources.txt gives two sources with lambda 1 and 1.02 A", "rc %d n %d: %s",
          rr, n, nbg_errmsg(ctx));
    free(s);
}

static void test_matrix(env *t, nbg_ctx *ctx)
{
    char p[4200];
    double m[9];
    write_text(t, "five.mat", "1 2 3\n4 5\n", p, sizeof p);
    int rr = nbgi_read_matrix(ctx, p, m);
    check(t, rr == NBG_EFORMAT && strstr(nbg_errmsg(ctx), p) != NULL, "mat-short",
          "a matrix file with 5 numbers is NBG_EFORMAT naming it", "rc %d: %s", rr, nbg_errmsg(ctx));
    write_text(t, "word.mat", "1 2 3\n4 five 6\n7 8 9\n", p, sizeof p);
    rr = nbgi_read_matrix(ctx, p, m);
    check(t, rr == NBG_EFORMAT, "mat-word", "a non-number among the nine is NBG_EFORMAT", "rc %d: %s", rr,
          nbg_errmsg(ctx));
    write_text(t, "long.mat", "1 2 3\n4 5 6\n7 8 9\n0 0 0\n 1 0 0\n 0 1 0\n 0 0 1\n 50 60 70 90 90 90\n", p,
               sizeof p);
    rr = nbgi_read_matrix(ctx, p, m);
    check(t, rr == NBG_OK && m[0] == 1 && m[4] == 5 && m[8] == 9, "mat-mosflm",
          "a full MOSFLM matrix file reads its first nine numbers in file order", "rc %d: %s", rr, nbg_errmsg(ctx));

    if (t->golden[0] == '\0') {
        skip(t, "mat-golden", "golden A.mat parses");
        return;
    }
    golden_path(t, "data/A.mat", p, sizeof p);
    rr = nbgi_read_matrix(ctx, p, m);
    int ok = rr == NBG_OK && m[0] == 0.0125070311 && m[1] == -0.0065857094 && m[3] == 0.0081221610
             && m[8] == 0.0107268970;
    check(t, ok, "mat-golden", "golden A.mat gives its nine numbers in file order", "rc %d: %s", rr, nbg_errmsg(ctx));
}

/* Removes the (flat) temporary directory. */
static void cleanup(const env *t)
{
    DIR *d = opendir(t->tmp);
    if (d != NULL) {
        struct dirent *e;
        char p[8400];
        while ((e = readdir(d)) != NULL) {
            if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0)
                continue;
            snprintf(p, sizeof p, "%s/%s", t->tmp, e->d_name);
            unlink(p);
        }
        closedir(d);
    }
    rmdir(t->tmp);
}

int main(void)
{
    static env t;
    const char *tmpdir = getenv("TMPDIR");
    snprintf(t.tmp, sizeof t.tmp, "%s/nbg-test-io-XXXXXX", tmpdir != NULL && tmpdir[0] != '\0' ? tmpdir : "/tmp");
    if (mkdtemp(t.tmp) == NULL) {
        perror("mkdtemp");
        printf("0 passed, 1 failed\n");
        return 1;
    }
    const char *golden = getenv("NBG_GOLDEN");
    if (golden == NULL || golden[0] == '\0')
        golden = "../shared/golden";
    struct stat st;
    char probe[4200];
    snprintf(probe, sizeof probe, "%s/data", golden);
    if (stat(probe, &st) == 0 && S_ISDIR(st.st_mode))
        snprintf(t.golden, sizeof t.golden, "%s", golden);

    nbg_ctx *ctx = NULL;
    if (nbg_ctx_create(&ctx, NBG_BACKEND_CPU, NBG_DOUBLE, 1) != NBG_OK) {
        printf("FAIL io-context cannot create a context\n0 passed, 1 failed\n");
        return 1;
    }
    test_hkl(&t, ctx);
    test_fdump(&t, ctx);
    test_smv(&t, ctx);
    test_images(&t, ctx);
    test_sources(&t, ctx);
    test_matrix(&t, ctx);
    nbg_ctx_destroy(ctx);

    cleanup(&t);
    printf("%d passed, %d failed\n", t.passed, t.failed);
    return t.failed == 0 ? 0 : 1;
}
