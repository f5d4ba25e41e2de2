/*
 * test-registry.c -- the format registry (src/imagefile.c) and the program's output flags (src/outputs.def):
 *
 *   - the registry's rows: unique names, the raw-float row (no magic) last, each magic sniffed as its own row, a
 *     row without a reader or writer says why (its note);
 *   - the output flags against the registry and the flag table: every output names a format nbgrad writes and
 *     carries only what that format carries; every format with a writer has an output flag; every output flag of
 *     the flag table (src/build.c) is an output row, with the same names, and the other way round;
 *   - round trips: for every format with a writer and a reader, a non-blank image (photons as floats, or the
 *     integer counts nbg_int_image makes of it, clip(v scale + adc) rounded to nearest) written through the writer
 *     and read back by nbg_read_image, which is not told the format: the pixels equal (exactly), the format sniffed
 *     is the one written, the geometry where the format carries it; a format of several frames read at its second
 *     frame; a format nbgrad writes but cannot read back (PGM, the experiment list) is sniffed as itself and refused
 *     by nbg_read_image with a message naming it (and said so on its line);
 *   - refusals: an unknown format name, data a format does not carry, a missing geometry or image.
 */
#include "testutil.h" /* first: _GNU_SOURCE */

#include "build.h"
#include "formats.h"

#include <limits.h>
#include <stdint.h>

#define F 40
#define S 32
#define NPIX ((size_t)F * S)

static nbg_ctx *g_ctx;
static char g_dir[PATH_MAX];

/* The test image: a smooth background with a few sharp peaks (non-integer photons, 0.05 to a few thousand). */
static void make_image(float *img, int variant)
{
    for (int s = 0; s < S; ++s) {
        for (int f = 0; f < F; ++f) {
            double v = 0.05 + 0.8 * (1 + sin(0.3 * f + 0.2 * s + variant));
            for (int p = 0; p < 4; ++p) {
                const double pf = 5 + 9 * p + 2 * variant, ps = 4 + 7 * p;
                const double d2 = (f - pf) * (f - pf) + (s - ps) * (s - ps);
                v += (300.0 + 700.0 * p) * exp(-d2 / 2.5);
            }
            img[(size_t)s * F + f] = (float)v;
        }
    }
}

static int sniffed(const char *path, const char **name)
{
    unsigned char head[NBGI_SNIFF_BYTES];
    FILE *fp = fopen(path, "rb");
    if (fp == NULL) {
        return 0;
    }
    const size_t n = fread(head, 1, sizeof head, fp);
    fclose(fp);
    *name = nbgi_image_format_sniff(head, n)->name;
    return 1;
}

static double vdiff(const double a[3], const double b[3])
{
    double m = 0;
    for (int i = 0; i < 3; ++i) m = fmax(m, fabs(a[i] - b[i]));
    return m;
}

static void test_table(void)
{
    int n = 0, raw_last = 0, names_unique = 1, notes = 1, sniff_self = 1;
    char why[512] = "";
    for (; nbgi_image_format_at(n) != NULL; ++n) {
        const nbgi_image_format *f = nbgi_image_format_at(n);
        for (int j = 0; j < n; ++j) names_unique &= strcmp(nbgi_image_format_at(j)->name, f->name) != 0;
        if ((f->read == NULL || f->write == NULL) && f->note == NULL) {
            notes = 0;
            snprintf(why, sizeof why, "%s has no reader or writer and no note", f->name);
        }
        if (f->magic != NULL && nbgi_image_format_sniff((const unsigned char *)f->magic, f->nmagic) != f) {
            sniff_self = 0;
            snprintf(why, sizeof why, "%s's magic is sniffed as %s", f->name,
                     nbgi_image_format_sniff((const unsigned char *)f->magic, f->nmagic)->name);
        }
        raw_last = f->magic == NULL;
    }
    nbgi_test_check(n >= 4 && names_unique && raw_last, "REG-table-rows",
                    "%d formats, names unique, the one without a magic (raw floats) last", n);
    nbgi_test_check(sniff_self, "REG-table-sniff", "each format's first bytes are sniffed as that format %s", why);
    nbgi_test_check(notes, "REG-table-notes", "a format nbgrad cannot read or write says why %s", why);
    /* the table, as the report gives it */
    for (int i = 0; i < n; ++i) {
        const nbgi_image_format *f = nbgi_image_format_at(i);
        printf("  format %-5s sniff %-10s read %-3s write %-3s frames %-7s carries%s%s%s%s%s\n", f->name,
               f->magic == NULL ? "(any)" : f->magic[0] == '\x89' ? "\\x89HDF" : f->magic[0] == '{' && f->nmagic > 20
               ? "{\"__id__\"" : f->magic[0] == '{' ? "{HEADER" : f->magic[0] == 'P' ? "P5" : f->magic,
               f->read ? "yes" : "no", f->write ? "yes" : "no", f->frames == 1 ? "one" : "several",
               f->carries & NBGI_CARRY_PHOTONS ? " photons" : "", f->carries & NBGI_CARRY_COUNTS ? " counts" : "",
               f->carries & NBGI_CARRY_NOISE ? " noise" : "", f->carries & NBGI_CARRY_SCALED ? " 8-bit" : "",
               f->carries & NBGI_CARRY_GEOMETRY ? " geometry" : "");
    }
}

static void test_outputs_and_flags(void)
{
    /* every output row: a format with a writer, carrying what it says; its names flags of the table */
    int ok = 1, nout = 0, series = 0;
    char why[512] = "";
    for (int k = 0; nbgi_output_at(k) != NULL; ++k, ++nout) {
        const nbgi_output *o = nbgi_output_at(k);
        const nbgi_image_format *f = nbgi_image_format_named(NULL, o->format);
        const int data = NBGI_CARRY_PHOTONS | NBGI_CARRY_COUNTS | NBGI_CARRY_NOISE;
        if (f == NULL || f->write == NULL) {
            ok = 0;
            snprintf(why, sizeof why, "%s names format %s, which nbgrad %s", o->flags, o->format,
                     f == NULL ? "does not know" : "cannot write");
        } else if ((o->carries & ~NBGI_CARRY_DATA & ~f->carries) != 0 ||
                   ((o->carries & NBGI_CARRY_DATA) && (f->carries & data) == 0)) {
            ok = 0;
            snprintf(why, sizeof why, "%s carries what %s does not", o->flags, f->name);
        } else {
            series += f->frames == 0 && (o->carries & (data | NBGI_CARRY_DATA)) != 0;
        }
        int len = 0;
        for (int w = 0; nbgi_word(o->flags, w, &len) != NULL; ++w) {
            char name[64];
            snprintf(name, sizeof name, "%.*s", len, nbgi_word(o->flags, w, &len));
            if (!nbgi_cli_is_flag(name) || !nbgi_cli_names_output(name)) {
                ok = 0;
                snprintf(why, sizeof why, "%s is no output flag of the table", name);
            }
        }
    }
    nbgi_test_check(ok && nout >= 5, "REG-outputs-writers",
                    "%d output flags, each a format nbgrad writes, carrying only what it carries %s", nout, why);
    /* the program gathers the frames of one several-frame image output (nbgi_cli.series) */
    nbgi_test_check(series <= 1, "REG-outputs-series", "%d output of several frames with image data (at most 1)",
                    series);
    /* every format with a writer has an output flag */
    ok = 1;
    why[0] = '\0';
    for (int i = 0; nbgi_image_format_at(i) != NULL; ++i) {
        const nbgi_image_format *f = nbgi_image_format_at(i);
        int has = 0;
        for (int k = 0; nbgi_output_at(k) != NULL; ++k) has |= strcmp(nbgi_output_at(k)->format, f->name) == 0;
        if (f->write != NULL && !has) {
            ok = 0;
            snprintf(why, sizeof why, "%s has a writer and no output flag", f->name);
        }
    }
    nbgi_test_check(ok, "REG-writers-flags", "every format with a writer has its output flag %s", why);
    /* the flag table's output flags are the output rows, names and aliases alike */
    ok = 1;
    why[0] = '\0';
    int nflags = 0;
    const char *names, *arg, *help;
    int group;
    for (int i = 0; nbgi_flag_entry(i, &names, &arg, &help, &group); ++i) {
        int len = 0;
        const char *w = nbgi_word(names, 0, &len);
        char first[64];
        snprintf(first, sizeof first, "%.*s", len, w);
        if (!nbgi_cli_names_output(first)) {
            continue;
        }
        ++nflags;
        int found = 0;
        for (int k = 0; nbgi_output_at(k) != NULL; ++k) found |= strcmp(nbgi_output_at(k)->flags, names) == 0;
        if (!found) {
            ok = 0;
            snprintf(why, sizeof why, "the flag table's %s is no output row", names);
        }
    }
    nbgi_test_check(ok && nflags == nout, "REG-flags-outputs",
                    "the flag table's %d output flags are the %d output rows %s", nflags, nout, why);
}

/* Writes img (or counts) through format fmt as carry, reads it back sniffed, compares. */
static void round_trip(const char *fmt, int carry, const nbg_geometry *g, const nbg_smv_header *h)
{
    const nbgi_image_format *f = nbgi_image_format_named(g_ctx, fmt);
    const char *what = carry == NBGI_CARRY_PHOTONS ? "photons" : "counts";
    char id[64];
    snprintf(id, sizeof id, "REG-rt-%s-%s", fmt, what);
    if (f == NULL) {
        nbgi_test_check(0, id, "no format %s: %s", fmt, nbg_errmsg(g_ctx));
        return;
    }
    float img[2][NPIX];
    uint16_t cnt[2][NPIX];
    int32_t cnt32[2][NPIX];
    const int nframes = f->frames == 0 ? 2 : 1;
    const double scale = 7.5, adc = 40;
    for (int k = 0; k < 2; ++k) {
        make_image(img[k], k);
        if (nbg_int_image(g_ctx, img[k], F, S, NULL, scale, adc, cnt[k]) != NBG_OK) {
            nbgi_test_check(0, id, "nbg_int_image: %s", nbg_errmsg(g_ctx));
            return;
        }
        for (size_t i = 0; i < NPIX; ++i) cnt32[k][i] = cnt[k][i];
    }
    /* the counts are the documented rounding of the photons: clip(v scale + adc, 0, 65535) to nearest */
    int rounding = 1, clipped = 0;
    for (size_t i = 0; i < NPIX; ++i) {
        const double want = fmin(65535, fmax(0, img[0][i] * scale + adc));
        rounding &= fabs(cnt[0][i] - want) <= 0.5;
        clipped += cnt[0][i] == 65535;
    }
    char path[PATH_MAX + 64];
    snprintf(path, sizeof path, "%s/rt-%s-%s.%s", g_dir, fmt, what, fmt);
    nbgi_image_out o;
    memset(&o, 0, sizeof o);
    o.carry = carry;
    o.npix = NPIX;
    o.fpixels = F;
    o.spixels = S;
    o.nframes = nframes;
    o.smv = h;
    o.g = g;
    if (carry == NBGI_CARRY_PHOTONS) {
        o.photons = &img[0][0];
    } else if (f->frames == 0) {
        o.counts32 = &cnt32[0][0];
    } else {
        o.counts = cnt[0];
    }
    int rc = nbgi_image_write(g_ctx, NULL, fmt, path, &o);
#ifndef NBG_HAVE_FORMATS
    if (rc == NBG_EUNSUP) {
        nbgi_test_skip(id, "%s: this nbgrad was built without it (FORMATS=0): %s", fmt, nbg_errmsg(g_ctx));
        return;
    }
#endif
    if (!nbgi_test_check(rc == NBG_OK, id, "%s written as %s (wrote it %s) %s", fmt, what, o.said,
                         rc == NBG_OK ? "" : nbg_errmsg(g_ctx))) {
        return;
    }
    const char *got = "?";
    sniffed(path, &got);
    char sub[96];
    snprintf(sub, sizeof sub, "%s-sniff", id);
    nbgi_test_check(strcmp(got, fmt) == 0, sub, "sniffed as %s (written as %s)", got, fmt);
    /* read back, the reader not told the format: the last frame written */
    const int frame = nframes - 1;
    float *back = NULL;
    size_t n = 0;
    nbg_geometry gb;
    int whole = 0;
    rc = nbg_read_image(g_ctx, path, frame, NPIX, &back, &n, &gb, &whole, NULL);
    snprintf(sub, sizeof sub, "%s-read", id);
    if (!nbgi_test_check(rc == NBG_OK && n == NPIX, sub, "read back by nbg_read_image (frame %d of %d): %zu pixels %s",
                         frame, nframes, n, rc == NBG_OK ? "" : nbg_errmsg(g_ctx))) {
        free(back);
        return;
    }
    size_t bad = 0, nonzero = 0;
    double maxd = 0;
    for (size_t i = 0; i < NPIX; ++i) {
        const double want = carry == NBGI_CARRY_PHOTONS ? img[frame][i] : cnt[frame][i];
        bad += back[i] != (float)want;
        maxd = fmax(maxd, fabs(back[i] - want));
        nonzero += back[i] != 0;
    }
    snprintf(sub, sizeof sub, "%s-pixels", id);
    nbgi_test_check(bad == 0 && nonzero > NPIX / 2, sub,
                    "pixels equal exactly (%zu of %zu differ, max |diff| %g; %zu non-zero)%s", bad, NPIX, maxd,
                    nonzero, carry == NBGI_CARRY_PHOTONS ? "" : rounding && clipped == 0
                    ? ", the counts the documented rounding of the photons" : ", THE COUNTS ARE NOT THE ROUNDING");
    if (carry != NBGI_CARRY_PHOTONS) {
        snprintf(sub, sizeof sub, "%s-rounding", id);
        nbgi_test_check(rounding, sub, "the integer counts are clip(v x %g + %g, 0, 65535) to nearest", scale, adc);
    }
    if (f->carries & NBGI_CARRY_GEOMETRY) {
        snprintf(sub, sizeof sub, "%s-geometry", id);
        const double d = fmax(fmax(vdiff(gb.origin, g->origin), vdiff(gb.fast, g->fast)), vdiff(gb.slow, g->slow));
        nbgi_test_check(whole && gb.fpixels == F && gb.spixels == S && fabs(gb.pixel_f - g->pixel_f) < 1e-12 &&
                            fabs(gb.wavelength - g->wavelength) < 1e-12 && d < 1e-9,
                        sub, "the geometry read back: %dx%d pixels of %g mm, wavelength %g A, origin and axes within "
                        "%.2g mm (whole %d)", gb.fpixels, gb.spixels, gb.pixel_f, gb.wavelength, d, whole);
    }
    free(back);
}

/* A format nbgrad writes and cannot read back: written, sniffed as itself, refused by nbg_read_image naming it. */
static void write_only(const char *fmt, const nbg_geometry *g)
{
    const nbgi_image_format *f = nbgi_image_format_named(g_ctx, fmt);
    char id[64];
    snprintf(id, sizeof id, "REG-wo-%s", fmt);
    if (f == NULL) {
        nbgi_test_check(0, id, "no format %s", fmt);
        return;
    }
    float img[NPIX];
    make_image(img, 0);
    char path[PATH_MAX + 64];
    snprintf(path, sizeof path, "%s/wo.%s", g_dir, fmt);
    nbgi_image_out o;
    memset(&o, 0, sizeof o);
    o.carry = NBGI_CARRY_PHOTONS;
    o.npix = NPIX;
    o.fpixels = F;
    o.spixels = S;
    o.photons = img;
    o.pgm_scale = 0.2;
    o.g = g;
    o.nframes = 1;
    int rc = nbgi_image_write(g_ctx, NULL, fmt, path, &o);
#ifndef NBG_HAVE_FORMATS
    if (rc == NBG_EUNSUP) {
        nbgi_test_skip(id, "%s: built without it (FORMATS=0)", fmt);
        return;
    }
#endif
    if (!nbgi_test_check(rc == NBG_OK, id, "%s written (%s) %s", fmt, o.said, rc == NBG_OK ? "" : nbg_errmsg(g_ctx))) {
        return;
    }
    const char *got = "?";
    sniffed(path, &got);
    float *back = NULL;
    size_t n = 0;
    rc = nbg_read_image(g_ctx, path, 0, NPIX, &back, &n, NULL, NULL, NULL);
    char word[64];
    snprintf(word, sizeof word, "%s", f->what);
    char sub[96];
    snprintf(sub, sizeof sub, "%s-refused", id);
    nbgi_test_check(strcmp(got, fmt) == 0 && rc != NBG_OK && back == NULL && strstr(nbg_errmsg(g_ctx), word) != NULL,
                    sub, "not read back by nbgrad (its registry row has no reader: %s): sniffed as %s, nbg_read_image "
                    "refuses it: %s", f->note, got, rc != NBG_OK ? nbg_errmsg(g_ctx) : "READ");
    free(back);
#ifdef NBG_HAVE_FORMATS
    if (strcmp(fmt, "expt") == 0) {
        /* its geometry is read by nbg_read_expt */
        nbg_geometry ge;
        rc = nbg_read_expt(g_ctx, path, &ge);
        nbgi_test_check(rc == NBG_OK && ge.fpixels == F && ge.spixels == S &&
                            fabs(ge.wavelength - g->wavelength) < 1e-12 && vdiff(ge.origin, g->origin) < 1e-9,
                        "REG-wo-expt-geometry", "its geometry read back by nbg_read_expt: %dx%d, wavelength %g %s", ge.fpixels, ge.spixels,
                        ge.wavelength, rc == NBG_OK ? "" : nbg_errmsg(g_ctx));
    }
#endif
}

static void test_refusals(const nbg_geometry *g, const nbg_smv_header *h)
{
    const nbgi_image_format *f = nbgi_image_format_named(g_ctx, "tiff");
    nbgi_test_check(f == NULL && strstr(nbg_errmsg(g_ctx), "tiff") != NULL && strstr(nbg_errmsg(g_ctx), "nxmx") != NULL,
                    "REG-refuse-unknown", "an unknown format name is refused naming it and the known ones: %s",
                    nbg_errmsg(g_ctx));
    float img[NPIX];
    uint16_t cnt[NPIX];
    make_image(img, 0);
    for (size_t i = 0; i < NPIX; ++i) cnt[i] = (uint16_t)(img[i] + 40);
    char path[PATH_MAX + 64];
    snprintf(path, sizeof path, "%s/refused.out", g_dir);
    nbgi_image_out o;
    memset(&o, 0, sizeof o);
    o.npix = NPIX;
    o.fpixels = F;
    o.spixels = S;
    o.nframes = 1;
    o.smv = h;
    o.carry = NBGI_CARRY_COUNTS;
    o.counts = cnt;
    int rc = nbgi_image_write(g_ctx, NULL, "tiff", path, &o);
    nbgi_test_check(rc == NBG_EINVAL && access(path, F_OK) != 0, "REG-refuse-unknown-write",
                    "writing an unknown format: refused, nothing written: %s", nbg_errmsg(g_ctx));
    o.carry = NBGI_CARRY_PHOTONS;
    o.photons = img;
    rc = nbgi_image_write(g_ctx, NULL, "smv", path, &o);
    nbgi_test_check(rc == NBG_EINVAL && strstr(nbg_errmsg(g_ctx), "integer") != NULL && access(path, F_OK) != 0,
                    "REG-refuse-carry", "photons as floats into SMV: refused: %s", nbg_errmsg(g_ctx));
    rc = nbgi_image_write(g_ctx, NULL, "cbf", path, &o);
    nbgi_test_check(rc == NBG_EINVAL && access(path, F_OK) != 0, "REG-refuse-carry-cbf",
                    "photons as floats into CBF: refused: %s", nbg_errmsg(g_ctx));
    o.carry = NBGI_CARRY_COUNTS;
    o.g = NULL;
    rc = nbgi_image_write(g_ctx, NULL, "cbf", path, &o);
    nbgi_test_check(rc == NBG_EINVAL && strstr(nbg_errmsg(g_ctx), "geometry") != NULL && access(path, F_OK) != 0,
                    "REG-refuse-geometry", "a CBF without its geometry: refused: %s", nbg_errmsg(g_ctx));
    o.g = g;
    o.counts = NULL;
    rc = nbgi_image_write(g_ctx, NULL, "smv", path, &o);
    nbgi_test_check(rc == NBG_EINVAL && access(path, F_OK) != 0, "REG-refuse-image",
                    "an SMV file without its counts: refused: %s", nbg_errmsg(g_ctx));
    /* a one-image format asked for its second frame */
    o.counts = cnt;
    snprintf(path, sizeof path, "%s/one.img", g_dir);
    rc = nbgi_image_write(g_ctx, NULL, "smv", path, &o);
    float *back = NULL;
    size_t n = 0;
    const int rr = nbg_read_image(g_ctx, path, 1, NPIX, &back, &n, NULL, NULL, NULL);
    nbgi_test_check(rc == NBG_OK && rr == NBG_EINVAL && back == NULL && strstr(nbg_errmsg(g_ctx), "SMV") != NULL,
                    "REG-refuse-frame", "frame 1 of an SMV file (one image a file): %s", nbg_errmsg(g_ctx));
}

int main(void)
{
    if (nbg_ctx_create(&g_ctx, NBG_BACKEND_CPU, NBG_DOUBLE, 1) != NBG_OK) {
        printf("FAIL REG-ctx cannot create a context\n0 passed, 1 failed\n");
        return 1;
    }
    if (nbgi_test_mkdtemp("nbg-registry", g_dir, sizeof g_dir) == NULL) {
        printf("FAIL REG-tmp cannot make a temporary folder\n0 passed, 1 failed\n");
        return 1;
    }
    test_table();
    test_outputs_and_flags();

    /* a detector of F x S pixels, its geometry as the program gives it to the writers */
    nbg_experiment e;
    nbg_experiment_default(&e);
    e.fpixels = F;
    e.spixels = S;
    e.pixel = 0.172;
    e.distance = 120;
    e.lambda = 0.9795;
    const double cell[6] = {57, 68, 79, 85, 105, 95};
    memcpy(e.cell, cell, sizeof cell);
    e.has_cell = 1;
    e.default_F = 100;
    nbg_report r;
    nbg_geometry g;
    nbg_smv_header h;
    if (nbg_describe(g_ctx, &e, &r) != NBG_OK || nbg_geometry_from_report(g_ctx, &e, &r, 2, &g) != NBG_OK) {
        nbgi_test_check(0, "REG-geometry", "the test's geometry: %s", nbg_errmsg(g_ctx));
    } else {
        g.pedestal = 40;
        g.saturation = 65535;
        nbg_smv_header_from_report(&r, &h);
        /* every format with a writer and a reader, each kind of image data it carries */
        int ntrip = 0;
        for (int i = 0; nbgi_image_format_at(i) != NULL; ++i) {
            const nbgi_image_format *f = nbgi_image_format_at(i);
            if (f->write == NULL) {
                continue;
            }
            if (f->read == NULL) {
                write_only(f->name, &g);
                continue;
            }
            if (f->carries & NBGI_CARRY_PHOTONS) {
                round_trip(f->name, NBGI_CARRY_PHOTONS, &g, &h);
                ++ntrip;
            }
            if (f->carries & (NBGI_CARRY_COUNTS | NBGI_CARRY_NOISE)) {
                round_trip(f->name, NBGI_CARRY_COUNTS, &g, &h);
                ++ntrip;
            }
        }
        nbgi_test_check(ntrip >= 5, "REG-rt-count", "%d round trips (nxmx photons and counts, cbf, smv, raw)", ntrip);
        test_refusals(&g, &h);
    }
    nbgi_test_rmtree(g_dir);
    nbg_ctx_destroy(g_ctx);
    return nbgi_test_summary();
}
