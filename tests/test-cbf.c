/*
 * test-cbf.c -- checks of the CBF (imgCIF) writer and reader in src/cbf.c: write-then-read round trips of the
 * geometry and the pixels (int32 with negative and large values), a frame past the first, the mask of negative
 * and overloaded pixels, the output set, and the refusals (invalid geometry, a frame outside the scan, a truncated
 * file, a file that is not CBF, a CBF without an image, a binary header that claims a huge image).
 *
 * Prints one line per check and a final "N passed, M failed".  Temporary files live in a fresh directory under
 * $TMPDIR (or /tmp) that is removed at the end.  Built without CBFlib (FORMATS=0) the calls must say so
 * (NBG_EUNSUP), which is all that is checked then.
 */
#include "testutil.h" /* first: it defines _GNU_SOURCE for nftw and mkdtemp */

#include "formats.h"
#include "io.h"
#include "nbgrad.h"

#include <dirent.h>
#include <stdint.h>

static char tmpdir[4096];

static const char *tmp_path(const char *name, char *buf, size_t size)
{
    snprintf(buf, size, "%s/%s", tmpdir, name);
    return buf;
}

#ifdef NBG_HAVE_FORMATS
/* Entries in the temporary directory (a failed write must leave no temporary behind). */
static int count_entries(void)
{
    DIR *d = opendir(tmpdir);
    int n = 0;
    if (d == NULL)
        return -1;
    for (struct dirent *e; (e = readdir(d)) != NULL;)
        n += strcmp(e->d_name, ".") != 0 && strcmp(e->d_name, "..") != 0;
    closedir(d);
    return n;
}

static int contains(const char *msg, const char *part)
{
    return msg != NULL && part != NULL && strstr(msg, part) != NULL;
}

#endif

static int exists(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0;
}

/* An off-centre detector turned 10 degrees about y, a 3-image scan; every field CBF carries set. */
static void make_geometry(nbg_geometry *g)
{
    nbgi_geometry_init(g);
    const double d = 10 * M_PI / 180;
    g->fpixels = 64, g->spixels = 48;
    g->pixel_f = 0.172, g->pixel_s = 0.172;
    g->fast[0] = cos(d), g->fast[1] = 0, g->fast[2] = -sin(d);
    g->slow[0] = 0, g->slow[1] = -1, g->slow[2] = 0;
    g->origin[0] = -40.25, g->origin[1] = 30.125, g->origin[2] = -180.0625;
    g->thickness = 0.45, g->mu = 3.1416;
    snprintf(g->material, sizeof g->material, "Si");
    g->saturation = 65535, g->pedestal = 40, g->gain = 1.5;
    const double b = 0.3 * M_PI / 180; /* a beam slightly off z */
    g->direction[0] = sin(b), g->direction[1] = 0, g->direction[2] = cos(b);
    g->wavelength = 0.98;
    const double p = 25 * M_PI / 180; /* a polarization normal in the xy plane (what CBF can carry) */
    g->polarization_normal[0] = sin(p), g->polarization_normal[1] = cos(p), g->polarization_normal[2] = 0;
    g->polarization_fraction = 0.99;
    const double a = 5 * M_PI / 180;
    g->axis[0] = cos(a), g->axis[1] = sin(a), g->axis[2] = 0;
    g->scan_start = 5, g->scan_width = 0.5, g->nframes = 3;
    g->exposure = 0.25;
}

#ifdef NBG_HAVE_FORMATS
static void check_vec(const double *got, const double *want, double tol, const char *id, const char *what)
{
    const double e = fmax(fabs(got[0] - want[0]), fmax(fabs(got[1] - want[1]), fabs(got[2] - want[2])));
    nbgi_test_check(e <= tol, id, "%s: (%.17g, %.17g, %.17g) within %g of (%g, %g, %g) (max error %.3g)", what,
                    got[0], got[1], got[2], tol, want[0], want[1], want[2], e);
}

static void test_roundtrip(nbg_ctx *ctx)
{
    nbg_geometry g, r;
    make_geometry(&g);
    const size_t n = (size_t)g.fpixels * g.spixels;
    int32_t *data = malloc(n * sizeof *data);
    for (size_t i = 0; i < n; ++i)
        data[i] = 40 + (int32_t)(i % 11);
    data[3] = -1, data[4] = -2, data[5] = 70000;               /* gap, dead, overload */
    data[100] = 2000000000, data[101] = -2000000000;          /* the byte-offset codec's 32-bit escapes */
    data[102] = 16777216, data[n - 1] = 65534;                 /* largest exact float; just under the overload */
    char path[4200];
    tmp_path("round_0003.cbf", path, sizeof path);
    int rc = nbg_write_cbf(ctx, path, &g, 2, data);
    nbgi_test_check(rc == NBG_OK, "cbf-write", "nbg_write_cbf frame 2 (%s)", rc ? nbg_errmsg(ctx) : "ok");

    float *img = NULL;
    uint8_t *mask = NULL;
    size_t npix = 0;
    rc = nbgi_read_cbf(ctx, path, &img, &npix, &r, &mask);
    nbgi_test_check(rc == NBG_OK && img != NULL, "cbf-read", "nbgi_read_cbf reads it back (%s)",
                    rc ? nbg_errmsg(ctx) : "ok");
    if (rc != NBG_OK) {
        free(data);
        return;
    }
    nbgi_test_check(npix == n && r.fpixels == g.fpixels && r.spixels == g.spixels, "cbf-size",
                    "image size %d x %d (%zu pixels)", r.fpixels, r.spixels, npix);
    size_t bad = 0;
    for (size_t i = 0; i < n && npix == n; ++i)
        bad += img[i] != (float)data[i];
    nbgi_test_check(bad == 0, "cbf-pixels", "every pixel as written, negatives and 32-bit values included (%zu differ)",
                    bad);
    nbgi_test_rel(r.pixel_f, g.pixel_f, 1e-15, "cbf-pixel-f", "pixel size along fast");
    nbgi_test_rel(r.pixel_s, g.pixel_s, 1e-15, "cbf-pixel-s", "pixel size along slow");
    /* CBFlib derives the axes from positions 180 mm out, differences of 0.17 mm: 1e-13 is what survives */
    check_vec(r.fast, g.fast, 1e-12, "cbf-fast", "fast axis");
    check_vec(r.slow, g.slow, 1e-12, "cbf-slow", "slow axis");
    check_vec(r.origin, g.origin, 1e-9, "cbf-origin", "origin (corner of pixel (0,0)), mm");
    check_vec(r.direction, g.direction, 1e-12, "cbf-beam", "beam direction");
    check_vec(r.axis, g.axis, 1e-12, "cbf-axis", "rotation axis");
    check_vec(r.polarization_normal, g.polarization_normal, 1e-12, "cbf-pol-normal", "polarization normal");
    nbgi_test_rel(r.polarization_fraction, g.polarization_fraction, 1e-15, "cbf-pol-fraction",
                  "polarization fraction");
    nbgi_test_rel(r.wavelength, g.wavelength, 1e-15, "cbf-wavelength", "wavelength");
    nbgi_test_rel(r.scan_start, g.scan_start + 2 * g.scan_width, 1e-15, "cbf-scan-start",
                  "scan start of frame 2 = start + 2 * width");
    nbgi_test_rel(r.scan_width, g.scan_width, 1e-15, "cbf-scan-width", "oscillation width");
    nbgi_test_check(r.nframes == 1, "cbf-nframes", "one frame per file (%d)", r.nframes);
    nbgi_test_check(r.scan_stated == 2, "cbf-scan-stated", "the file states its start angle and width (%d)",
                    r.scan_stated);
    nbgi_test_rel(r.exposure, g.exposure, 1e-15, "cbf-exposure", "exposure");
    nbgi_test_rel(r.saturation, g.saturation, 1e-15, "cbf-saturation", "saturation (overload)");
    nbgi_test_rel(r.pedestal, g.pedestal, 1e-15, "cbf-pedestal", "pedestal (array_intensities.offset)");
    nbgi_test_rel(r.gain, g.gain, 1e-15, "cbf-gain", "gain");
    nbgi_test_rel(r.thickness, g.thickness, 1e-15, "cbf-thickness", "sensor thickness (layer_thickness)");
    nbgi_test_rel(r.mu, g.mu, 1e-15, "cbf-mu", "sensor mu");
    nbgi_test_check(strcmp(r.material, g.material) == 0, "cbf-material", "sensor material \"%s\"", r.material);

    size_t mbad = 0, nmask = 0;
    for (size_t i = 0; i < n && mask != NULL; ++i) {
        const int want = data[i] < 0 || data[i] >= 65535;
        mbad += mask[i] != want;
        nmask += mask[i] != 0;
    }
    nbgi_test_check(mask != NULL && mbad == 0 && nmask == 6, "cbf-mask",
                    "mask = negative or >= overload (%zu masked, %zu wrong)", nmask, mbad);
    free(img);
    free(mask);

    /* g and mask are optional */
    img = NULL;
    rc = nbgi_read_cbf(ctx, path, &img, &npix, NULL, NULL);
    nbgi_test_check(rc == NBG_OK && img != NULL && npix == n, "cbf-read-image-only", "image without g or mask");
    free(img);

    /* nothing to mask: NULL */
    for (size_t i = 0; i < n; ++i)
        data[i] = (int32_t)(i % 100);
    tmp_path("clean_0001.cbf", path, sizeof path);
    rc = nbg_write_cbf(ctx, path, &g, 0, data);
    img = NULL;
    mask = (uint8_t *)1;
    rc = rc ? rc : nbgi_read_cbf(ctx, path, &img, &npix, &r, &mask);
    nbgi_test_check(rc == NBG_OK && mask == NULL, "cbf-mask-none", "no mask when no pixel is bad");
    nbgi_test_rel(r.scan_start, g.scan_start, 1e-15, "cbf-scan-start-0", "scan start of frame 0");
    free(img);

    /* the output set: nothing at the target until the commit */
    nbgi_outset set;
    nbgi_outset_init(&set);
    tmp_path("set_0001.cbf", path, sizeof path);
    rc = nbgi_write_cbf_set(ctx, &set, path, &g, 1, data);
    const int before = exists(path);
    rc = rc ? rc : nbgi_outset_commit(ctx, &set);
    nbgi_test_check(rc == NBG_OK && !before && exists(path), "cbf-outset", "staged in a set, renamed at commit");
    free(data);
}

/* Writes bytes to a file in the temporary directory. */
static void write_bytes(const char *path, const void *buf, size_t n)
{
    FILE *f = fopen(path, "wb");
    if (f != NULL) {
        fwrite(buf, 1, n, f);
        fclose(f);
    }
}

/* Reads path and checks that it is refused with status want (0: any failure) and a message naming the file. */
static void expect_read_error(nbg_ctx *ctx, const char *path, int want, const char *part, const char *id,
                              const char *what)
{
    float *img = (float *)1;
    uint8_t *mask = (uint8_t *)1;
    size_t npix = 7;
    nbg_geometry g;
    const int rc = nbgi_read_cbf(ctx, path, &img, &npix, &g, &mask);
    const char *msg = nbg_errmsg(ctx);
    const int ok = rc != NBG_OK && (want == 0 || rc == want) && contains(msg, path) &&
                   (part == NULL || contains(msg, part)) && img == NULL && mask == NULL && npix == 0;
    nbgi_test_check(ok, id, "%s: status %d, \"%s\"", what, rc, msg);
    if (rc == NBG_OK) {
        free(img);
        free(mask);
    }
}

static void test_errors(nbg_ctx *ctx)
{
    nbg_geometry g;
    make_geometry(&g);
    const size_t n = (size_t)g.fpixels * g.spixels;
    int32_t *data = calloc(n, sizeof *data);
    char path[4200], bad[4200];

    /* invalid geometry and frames: refused, nothing left behind */
    const int entries = count_entries();
    tmp_path("bad_0001.cbf", path, sizeof path);
    nbg_geometry b = g;
    b.axis[0] = 2;
    int rc = nbg_write_cbf(ctx, path, &b, 0, data);
    nbgi_test_check(rc == NBG_EINVAL && contains(nbg_errmsg(ctx), path) && contains(nbg_errmsg(ctx), "rotation axis") &&
                        !exists(path) && count_entries() == entries,
                    "cbf-write-bad-axis", "non-unit axis refused, no file (%s)", nbg_errmsg(ctx));
    rc = nbg_write_cbf(ctx, path, &g, 3, data);
    nbgi_test_check(rc == NBG_EINVAL && contains(nbg_errmsg(ctx), path) && !exists(path) && count_entries() == entries,
                    "cbf-write-frame-range", "frame 3 of 3 refused (%s)", nbg_errmsg(ctx));
    rc = nbg_write_cbf(ctx, path, &g, -1, data);
    nbgi_test_check(rc == NBG_EINVAL && !exists(path), "cbf-write-frame-neg", "frame -1 refused");
    tmp_path("no/such/dir/x_0001.cbf", bad, sizeof bad);
    rc = nbg_write_cbf(ctx, bad, &g, 0, data);
    nbgi_test_check(rc == NBG_EIO && contains(nbg_errmsg(ctx), bad), "cbf-write-nodir",
                    "a directory that does not exist: NBG_EIO (%s)", nbg_errmsg(ctx));

    /* a valid file, truncated to half */
    tmp_path("good_0001.cbf", path, sizeof path);
    for (size_t i = 0; i < n; ++i)
        data[i] = (int32_t)(i * 7919 % 100000);
    rc = nbg_write_cbf(ctx, path, &g, 0, data);
    size_t size = 0;
    char *file = nbgi_test_read_file(path, &size);
    nbgi_test_check(rc == NBG_OK && file != NULL, "cbf-write-good", "a file to damage");
    if (file == NULL) {
        free(data);
        return;
    }
    tmp_path("half_0001.cbf", bad, sizeof bad);
    write_bytes(bad, file, size / 2);
    expect_read_error(ctx, bad, 0, NULL, "cbf-truncated", "a file cut in half");
    /* cut inside the binary section only */
    write_bytes(bad, file, size - 64);
    expect_read_error(ctx, bad, 0, NULL, "cbf-truncated-binary", "a file missing its last 64 bytes");

    /* not CBF at all */
    tmp_path("text.cbf", bad, sizeof bad);
    write_bytes(bad, "hello, world\n1 2 3\n", 19);
    expect_read_error(ctx, bad, NBG_EFORMAT, "not a CBF", "cbf-not-cbf", "a text file");
    tmp_path("empty.cbf", bad, sizeof bad);
    write_bytes(bad, "", 0);
    expect_read_error(ctx, bad, NBG_EFORMAT, NULL, "cbf-empty", "an empty file");
    tmp_path("missing.cbf", bad, sizeof bad);
    expect_read_error(ctx, bad, NBG_EIO, NULL, "cbf-missing", "a file that does not exist");

    /* CBF text without a binary section */
    const char *nobin = "###CBF: VERSION 1.5\n\ndata_test\n\n_diffrn.id DS1\n_diffrn_radiation_wavelength.id W1\n"
                        "_diffrn_radiation_wavelength.wavelength 1.0\n";
    tmp_path("nobin.cbf", bad, sizeof bad);
    write_bytes(bad, nobin, strlen(nobin));
    expect_read_error(ctx, bad, NBG_EFORMAT, "array_data", "cbf-no-binary", "a CBF with no image");
    const char *textdata = "###CBF: VERSION 1.5\ndata_test\n_array_data.array_id A\n_array_data.data 12\n";
    write_bytes(bad, textdata, strlen(textdata));
    expect_read_error(ctx, bad, NBG_EFORMAT, "binary", "cbf-text-data", "_array_data.data as text");

    /* the binary header claims other sizes: a mismatch, then a huge image */
    const char *key = "X-Binary-Number-of-Elements:";
    char *at = strstr(file, key);
    char *fast = strstr(file, "X-Binary-Size-Fastest-Dimension:");
    char *slow = strstr(file, "X-Binary-Size-Second-Dimension:");
    if (at != NULL && fast != NULL && slow != NULL && at < fast && fast < slow) {
        char *eol_s = strchr(slow, '\n');
        const size_t tail = size - (size_t)(eol_s - file);
        char *edit = malloc(size + 256);
        /* dimensions that do not multiply to the element count */
        int m = snprintf(edit, size + 256, "%.*s%s %zu\r\nX-Binary-Size-Fastest-Dimension: %d\r\n"
                         "X-Binary-Size-Second-Dimension: %d\r", (int)(at - file), file, key, n, g.fpixels + 1,
                         g.spixels);
        memcpy(edit + m, eol_s, tail);
        tmp_path("dims.cbf", bad, sizeof bad);
        write_bytes(bad, edit, (size_t)m + tail);
        expect_read_error(ctx, bad, NBG_EFORMAT, NULL, "cbf-wrong-dims", "dimensions that do not match");
        /* 1e12 elements, as the dimensions say */
        m = snprintf(edit, size + 256, "%.*s%s 1000000000000\r\nX-Binary-Size-Fastest-Dimension: 1000000\r\n"
                     "X-Binary-Size-Second-Dimension: 1000000\r", (int)(at - file), file, key);
        memcpy(edit + m, eol_s, tail);
        tmp_path("huge.cbf", bad, sizeof bad);
        write_bytes(bad, edit, (size_t)m + tail);
        expect_read_error(ctx, bad, 0, NULL, "cbf-huge", "a header claiming 10^12 pixels");
        free(edit);
    } else {
        nbgi_test_check(0, "cbf-mime-header", "the written file has the MIME size fields");
    }
    free(file);
    free(data);
}

#endif

int main(void)
{
    nbg_ctx *ctx = NULL;
    if (nbg_ctx_create(&ctx, NBG_BACKEND_CPU, NBG_DOUBLE, 1) != NBG_OK) {
        printf("FAIL ctx could not create a context\n0 passed, 1 failed\n");
        return 1;
    }
    if (nbgi_test_mkdtemp("nbg-test-cbf-", tmpdir, sizeof tmpdir) == NULL) {
        nbgi_test_check(0, "tmpdir", "a temporary directory");
        nbg_ctx_destroy(ctx);
        return nbgi_test_summary();
    }
#ifdef NBG_HAVE_FORMATS
    test_roundtrip(ctx);
    test_errors(ctx);
#else
    nbg_geometry g;
    make_geometry(&g);
    int32_t px[64 * 48] = {0};
    char path[4200];
    tmp_path("x_0001.cbf", path, sizeof path);
    int rc = nbg_write_cbf(ctx, path, &g, 0, px);
    nbgi_test_check(rc == NBG_EUNSUP && !exists(path), "cbf-unsupported-write", "FORMATS=0: writing is NBG_EUNSUP");
    float *img = NULL;
    size_t npix = 0;
    rc = nbgi_read_cbf(ctx, path, &img, &npix, NULL, NULL);
    nbgi_test_check(rc == NBG_EUNSUP && img == NULL, "cbf-unsupported-read", "FORMATS=0: reading is NBG_EUNSUP");
#endif
    nbgi_test_rmtree(tmpdir);
    nbg_ctx_destroy(ctx);
    return nbgi_test_summary();
}
