/*
 * test-cbf.c -- checks of the CBF (imgCIF) writer and reader in src/cbf.c: write-then-read round trips of the
 * geometry and the pixels (int32 with negative and large values), a frame past the first, the mask of negative
 * and overloaded pixels, the output set, and the refusals (invalid geometry, a frame outside the scan, a truncated
 * file, a file that is not CBF, a CBF without an image, a binary header that claims a huge image), and the binary
 * sections that nbgrad decodes itself (src/cbfbin.c), built by hand around a written file's text: byte_offset with
 * deltas of every width and uncompressed sections of several types decoded bit for bit (cbf-bin-byte-offset,
 * cbf-bin-none-*), and malformed ones refused with a message naming the file, never a crash (cbf-bin-*: sizes that
 * lie, counts that disagree with the dimensions or the data, streams cut inside an escape, dimensions that
 * overflow, a missing start marker, compressions and encodings nbgrad does not decode, a MIME boundary or a control
 * byte in the text CBFlib would take for binary data), and axis categories CBFlib's geometry constructors would
 * crash on, refused or read as a still (cbf-geom-*).  Real beamline images from ../shared/data/real (Pilatus and
 * Eiger, full CBF and miniCBF; decompressed with gzip or bzip2 into the temporary directory) must read bit for bit
 * as they did through CBFlib's decoder (cbf-real-*; skipped when the folder is missing); the LCLS CSPAD's multi-panel
 * CBF (x-CBF_PACKED arrays cut into 64 sections under an axis hierarchy) as dxtbx reads it, every panel's pixels and
 * frame against tests/data/cspad_dxtbx.json (cbf-real-cspad-*), and malformed or unsupported copies of it refused
 * naming the fault (cbf-cspad-*).
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
#include <jansson.h>
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
    nbgi_test_check(r.goniometer.naxes == 0, "cbf-single-axis", "one axis: no multi-axis goniometer (naxes %d)",
                    r.goniometer.naxes);
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

/* ---------------------------------------------------------------------------------------------------------- */
/* Binary sections built by hand: nbgrad decodes them itself (src/cbfbin.c), CBFlib only parses the text       */
/* ---------------------------------------------------------------------------------------------------------- */

/* A file nbgrad wrote, cut around its binary section: head up to and including the opening MIME boundary line,
 * tail from the end of the data (the closing boundary, the ';' line) to the end of the file. */
typedef struct {
    char *file;
    size_t size;
    size_t nhead, tail; /* head: file[0, nhead); tail: file[tail, size) */
} cbf_parts;

static int split_cbf(char *file, size_t size, cbf_parts *p)
{
    static const char boundary[] = "--CIF-BINARY-FORMAT-SECTION--\r\n";
    static const unsigned char marker[4] = {0x0C, 0x1A, 0x04, 0xD5};
    p->file = file, p->size = size;
    const char *b = strstr(file, boundary);
    const char *sz = strstr(file, "X-Binary-Size:");
    const unsigned char *m = memmem(file, size, marker, sizeof marker);
    if (b == NULL || sz == NULL || m == NULL)
        return 0;
    p->nhead = (size_t)(b - file) + strlen(boundary);
    const size_t data = (size_t)((const char *)m - file) + sizeof marker;
    p->tail = data + strtoul(sz + 14, NULL, 10);
    return p->tail <= size;
}

/* A MIME header (the lines, each ending CR LF; the empty line that ends it is added by write_cbf). */
static void mime(char *buf, size_t size, const char *conversions, const char *type, const char *order, size_t bytes,
                 size_t nel, const char *f, const char *s, const char *extra)
{
    snprintf(buf, size,
             "Content-Type: application/octet-stream;\r\n     conversions=\"%s\"\r\n"
             "Content-Transfer-Encoding: BINARY\r\nX-Binary-Size: %zu\r\nX-Binary-ID: 1\r\n"
             "X-Binary-Element-Type: \"%s\"\r\nX-Binary-Element-Byte-Order: %s\r\n"
             "X-Binary-Number-of-Elements: %zu\r\nX-Binary-Size-Fastest-Dimension: %s\r\n"
             "X-Binary-Size-Second-Dimension: %s\r\n%s",
             conversions, bytes, type, order, nel, f, s, extra);
}

/* Writes the head, the header lines, the empty line, the start marker, n data bytes and the tail (the first
 * tail_cut bytes of the tail left out). */
static void write_cbf(const char *path, const cbf_parts *p, const char *header, const void *data, size_t n,
                      size_t tail_cut)
{
    FILE *f = fopen(path, "wb");
    if (f == NULL)
        return;
    fwrite(p->file, 1, p->nhead, f);
    fputs(header, f);
    fputs("\r\n", f);
    fwrite("\x0c\x1a\x04\xd5", 1, 4, f);
    fwrite(data, 1, n, f);
    if (p->size - p->tail > tail_cut)
        fwrite(p->file + p->tail + tail_cut, 1, p->size - p->tail - tail_cut, f);
    fclose(f);
}

static size_t put_le(unsigned char *out, uint64_t v, int bytes)
{
    for (int i = 0; i < bytes; ++i)
        out[i] = (unsigned char)(v >> (8 * i));
    return (size_t)bytes;
}

/* The byte_offset stream of v[0..n) (the test's own encoder, from the format's description: each delta from the
 * previous value in 1 byte, else 0x80 and 2 bytes, else 0x8000 too and 4 bytes, else 0x80000000 too and 8 bytes,
 * all little-endian); out holds 15 n bytes.  The deltas are exact (no wrapping), in 64 bits. */
static size_t bo_encode(const int64_t *v, size_t n, unsigned char *out)
{
    size_t p = 0;
    int64_t prev = 0;
    for (size_t i = 0; i < n; ++i) {
        const int64_t d = v[i] - prev;
        prev = v[i];
        if (d >= -127 && d <= 127) {
            out[p++] = (unsigned char)(int8_t)d;
            continue;
        }
        out[p++] = 0x80;
        if (d >= -32767 && d <= 32767) {
            p += put_le(out + p, (uint64_t)d, 2);
            continue;
        }
        p += put_le(out + p, 0x8000, 2);
        if (d >= -2147483647 && d <= 2147483647) {
            p += put_le(out + p, (uint64_t)d, 4);
            continue;
        }
        p += put_le(out + p, 0x80000000u, 4);
        p += put_le(out + p, (uint64_t)d, 8);
    }
    return p;
}

/* Reads path and checks that every pixel is want[i] exactly. */
static void expect_pixels(nbg_ctx *ctx, const char *path, const float *want, size_t n, const char *id,
                          const char *what)
{
    float *img = NULL;
    size_t npix = 0;
    const int rc = nbgi_read_cbf(ctx, path, &img, &npix, NULL, NULL);
    size_t bad = 0;
    for (size_t i = 0; rc == NBG_OK && npix == n && i < n; ++i)
        bad += memcmp(&img[i], &want[i], sizeof(float)) != 0;
    nbgi_test_check(rc == NBG_OK && npix == n && bad == 0, id, "%s: %zu pixels, %zu differ (%s)", what, npix, bad,
                    rc != NBG_OK ? nbg_errmsg(ctx) : "ok");
    free(img);
}

/* One good section: the MIME header of conversion conv, element type and byte order over the nb bytes of buf (n
 * elements of sf x ss), written to a CBF named file around p, read back: every pixel must be want[i] exactly. */
static void good_section(nbg_ctx *ctx, const cbf_parts *p, size_t n, const char *sf, const char *ss, const char *conv,
                         const char *type, const char *order, const unsigned char *buf, size_t nb, const char *file,
                         const float *want, const char *id, const char *what)
{
    char path[4200], head[2048];
    mime(head, sizeof head, conv, type, order, nb, n, sf, ss, "");
    tmp_path(file, path, sizeof path);
    write_cbf(path, p, head, buf, nb, 0);
    expect_pixels(ctx, path, want, n, id, what);
}

/* Good sections of every kind nbgrad decodes, decoded bit for bit. */
static void test_binary_good(nbg_ctx *ctx, const cbf_parts *p, size_t n, const char *sf, const char *ss)
{
    char path[4200], head[2048];
    int64_t *v = calloc(n, sizeof *v);
    float *want = calloc(n, sizeof *want);
    unsigned char *buf = calloc(15, n);

    /* byte_offset with deltas of every width: 1, 2, 4 and 8 bytes (2e9 to -2e9 and back) */
    for (size_t i = 0; i < n; ++i)
        v[i] = (int64_t)(i % 7) * 30 - 90 + (i % 100 == 5 ? 40000 : 0) + (i % 100 == 50 ? 3000000 : 0);
    v[200] = 2000000000, v[201] = -2000000000, v[202] = 2147483647, v[203] = -2147483647 - 1, v[204] = 0;
    for (size_t i = 0; i < n; ++i)
        want[i] = (float)(double)v[i];
    size_t nb = bo_encode(v, n, buf);
    good_section(ctx, p, n, sf, ss, "x-CBF_BYTE_OFFSET", "signed 32-bit integer", "LITTLE_ENDIAN", buf, nb,
                 "bo_good.cbf", want, "cbf-bin-byte-offset", "byte_offset with 1-, 2-, 4- and 8-byte deltas");

    /* unsigned 16-bit byte_offset: the sum wraps in 16 bits, as CBFlib's writer relies on (65535 + 1 = 0) */
    for (size_t i = 0; i < n; ++i)
        v[i] = i % 2 == 0 ? 65535 : 65536; /* the stream's exact values; the element is v mod 2^16 */
    for (size_t i = 0; i < n; ++i)
        want[i] = (float)(v[i] % 65536);
    nb = bo_encode(v, n, buf);
    good_section(ctx, p, n, sf, ss, "x-CBF_BYTE_OFFSET", "unsigned 16-bit integer", "LITTLE_ENDIAN", buf, nb,
                 "bo_u16.cbf", want, "cbf-bin-byte-offset-wrap", "unsigned 16-bit byte_offset, modulo 2^16");

    /* uncompressed: signed 32-bit little-endian, unsigned 16-bit big-endian, IEEE reals of both widths */
    nb = 0;
    for (size_t i = 0; i < n; ++i) {
        const int32_t x = (int32_t)(i * 2654435761u);
        nb += put_le(buf + nb, (uint32_t)x, 4);
        want[i] = (float)(double)x;
    }
    good_section(ctx, p, n, sf, ss, "x-CBF_NONE", "signed 32-bit integer", "LITTLE_ENDIAN", buf, nb,
                 "none_s32.cbf", want, "cbf-bin-none-s32-le", "x-CBF_NONE signed 32-bit little-endian");

    nb = 0;
    for (size_t i = 0; i < n; ++i) {
        const uint16_t x = (uint16_t)(i * 40503u);
        buf[nb++] = (unsigned char)(x >> 8), buf[nb++] = (unsigned char)x;
        want[i] = (float)x;
    }
    good_section(ctx, p, n, sf, ss, "x-CBF_NONE", "unsigned 16-bit integer", "BIG_ENDIAN", buf, nb,
                 "none_u16be.cbf", want, "cbf-bin-none-u16-be", "x-CBF_NONE unsigned 16-bit big-endian");

    nb = 0;
    for (size_t i = 0; i < n; ++i) {
        const double x = ((double)i - 1000.0) / 7.0;
        uint64_t bits;
        memcpy(&bits, &x, sizeof bits);
        for (int k = 7; k >= 0; --k)
            buf[nb++] = (unsigned char)(bits >> (8 * k));
        want[i] = (float)x;
    }
    good_section(ctx, p, n, sf, ss, "x-CBF_NONE", "signed 64-bit real IEEE", "BIG_ENDIAN", buf, nb,
                 "none_f64be.cbf", want, "cbf-bin-none-f64-be", "x-CBF_NONE 64-bit IEEE reals, big-endian");

    nb = 0;
    for (size_t i = 0; i < n; ++i) {
        const float x = (float)(((double)i - 500.0) * 0.37);
        uint32_t bits;
        memcpy(&bits, &x, sizeof bits);
        nb += put_le(buf + nb, bits, 4);
        want[i] = x;
    }
    /* no conversions parameter at all: uncompressed */
    char plain[2048];
    mime(head, sizeof head, "x-CBF_NONE", "signed 32-bit real IEEE", "LITTLE_ENDIAN", nb, n, sf, ss, "");
    char *conv = strstr(head, ";\r\n     conversions=\"x-CBF_NONE\"");
    snprintf(plain, sizeof plain, "%.*s%s", (int)(conv - head), head, conv + strlen(";\r\n     conversions=\"x-CBF_NONE\""));
    tmp_path("none_f32.cbf", path, sizeof path);
    write_cbf(path, p, plain, buf, nb, 0);
    expect_pixels(ctx, path, want, n, "cbf-bin-none-f32", "32-bit IEEE reals, Content-Type without conversions");
    free(v);
    free(want);
    free(buf);
}

/* Malformed sections: each refused with a message that names the file (and, where given, says what). */
static void test_binary_bad(nbg_ctx *ctx, const cbf_parts *p, size_t n, const char *sf, const char *ss)
{
    char path[4200], head[2048], extra[256];
    int64_t *v = calloc(n + 1, sizeof *v);
    unsigned char *buf = calloc(15 * (n + 1) + 64, 1);
    for (size_t i = 0; i <= n; ++i)
        v[i] = (int64_t)(i % 13) * 11 + (i % 50 == 7 ? 1000 : 0);
    const size_t nb = bo_encode(v, n, buf);
    tmp_path("bad.cbf", path, sizeof path);
#define BAD(conv, type, order, bytes, nel, f, s, ex, data, ndata, cut, want, part, id, what)                   \
    do {                                                                                                   \
        mime(head, sizeof head, conv, type, order, bytes, nel, f, s, ex);                                  \
        write_cbf(path, p, head, data, ndata, cut);                                                        \
        expect_read_error(ctx, path, want, part, id, what);                                                \
    } while (0)
    const char *bo = "x-CBF_BYTE_OFFSET", *s32 = "signed 32-bit integer", *le = "LITTLE_ENDIAN";

    /* X-Binary-Size against the data and the file */
    BAD(bo, s32, le, nb + 100000, n, sf, ss, "", buf, nb, 0, NBG_EFORMAT, "X-Binary-Size says", "cbf-bin-size-past-file",
        "X-Binary-Size past the end of the file");
    BAD(bo, s32, le, nb + 6, n, sf, ss, "", buf, nb, 0, NBG_EFORMAT, "more than the", "cbf-bin-size-larger",
        "X-Binary-Size 6 bytes larger than the data (the closing boundary taken for data)");
    BAD(bo, s32, le, nb - 5, n, sf, ss, "", buf, nb, 0, NBG_EFORMAT, "end", "cbf-bin-size-smaller",
        "X-Binary-Size 5 bytes smaller than the data");
    /* the element count against the dimensions, and against the data */
    BAD(bo, s32, le, nb, n + 1, sf, ss, "", buf, nb, 0, NBG_EFORMAT, "do not match", "cbf-bin-nel-larger",
        "X-Binary-Number-of-Elements larger than fastest x second");
    char f1[32];
    snprintf(f1, sizeof f1, "%ld", strtol(sf, NULL, 10) + 1);
    const size_t ns = (size_t)strtol(ss, NULL, 10);
    BAD(bo, s32, le, nb, n + ns, f1, ss, "", buf, nb, 0, NBG_EFORMAT, "end before element", "cbf-bin-nel-past-data",
        "a header whose dimensions and count agree on more elements than the data hold");
    /* byte_offset streams cut inside an escape, or holding an element too many */
    size_t m = bo_encode(v, n - 1, buf);
    buf[m] = 0x80, buf[m + 1] = 0x34;
    BAD(bo, s32, le, m + 2, n, sf, ss, "", buf, m + 2, 0, NBG_EFORMAT, "inside the 2-byte delta", "cbf-bin-cut-2",
        "the data end inside a 2-byte delta");
    buf[m] = 0x80, buf[m + 1] = 0x00, buf[m + 2] = 0x80, buf[m + 3] = 0x12, buf[m + 4] = 0x34;
    BAD(bo, s32, le, m + 5, n, sf, ss, "", buf, m + 5, 0, NBG_EFORMAT, "inside the 4-byte delta", "cbf-bin-cut-4",
        "the data end inside a 4-byte delta");
    memcpy(buf + m, "\x80\x00\x80\x00\x00\x00\x80\x01\x02", 9);
    BAD(bo, s32, le, m + 9, n, sf, ss, "", buf, m + 9, 0, NBG_EFORMAT, "inside the 8-byte delta", "cbf-bin-cut-8",
        "the data end inside an 8-byte delta");
    m = bo_encode(v, n + 1, buf);
    BAD(bo, s32, le, m, n, sf, ss, "", buf, m, 0, NBG_EFORMAT, "more than the", "cbf-bin-extra-element",
        "data that encode one element more than declared");
    m = bo_encode(v, n, buf);
    /* dimensions */
    BAD(bo, s32, le, m, 8, "2147483647", "2147483647", "X-Binary-Size-Third-Dimension: 2147483647\r\n", buf, m, 0,
        NBG_EFORMAT, "do not match", "cbf-bin-dims-overflow", "dimensions whose product overflows 64 bits");
    BAD(bo, s32, le, m, n, "4294967296", "1", "", buf, m, 0, NBG_EFORMAT, "too large", "cbf-bin-dim-int32",
        "a dimension past int32");
    BAD(bo, s32, le, m, n, sf, ss, "X-Binary-Size-Third-Dimension: 2\r\n", buf, m, 0, NBG_EFORMAT, NULL,
        "cbf-bin-third-dim", "a third dimension that breaks the count");
    /* the start marker, the field's end */
    mime(head, sizeof head, bo, s32, le, m, n, sf, ss, "");
    write_cbf(path, p, head, buf, m, 0);
    size_t size = 0;
    char *file = nbgi_test_read_file(path, &size);
    char *mk = file != NULL ? memmem(file, size, "\x0c\x1a\x04\xd5", 4) : NULL;
    if (mk != NULL) {
        mk[3] = (char)0xd6;
        write_bytes(path, file, size);
    }
    expect_read_error(ctx, path, NBG_EFORMAT, "no start marker", "cbf-bin-no-marker", "a damaged start marker");
    if (mk != NULL) {
        mk[3] = (char)0xd5;
        mk[-2] = 'x'; /* the empty line that ends the header: no longer empty */
        write_bytes(path, file, size);
    }
    expect_read_error(ctx, path, NBG_EFORMAT, "without ':'", "cbf-bin-header-line",
                      "a MIME header line without ':' where the empty line should be");
    free(file);
    BAD(bo, s32, le, m, n, sf, ss, "", buf, m, p->size - p->tail, NBG_EFORMAT, "does not end", "cbf-bin-no-field-end",
        "a file that ends after the data, without the ';' line");
    /* what nbgrad does not decode */
    BAD("x-CBF_PACKED", s32, le, m, n, sf, ss, "", buf, m, 0, NBG_EFORMAT, "packed data say", "cbf-bin-packed",
        "byte-offset data labelled x-CBF_PACKED refused (their first word is no element count)");
    BAD("x-CBF_MYSTERY", s32, le, m, n, sf, ss, "", buf, m, 0, NBG_EUNSUP, "x-CBF_BYTE_OFFSET, x-CBF_PACKED",
        "cbf-bin-unknown-compression", "an unknown compression refused, saying what nbgrad decodes");
    BAD(bo, "signed 32-bit complex IEEE", le, m, n, sf, ss, "", buf, m, 0, NBG_EUNSUP, "complex",
        "cbf-bin-complex", "complex elements refused");
    BAD(bo, "signed 24-bit integer", le, m, n, sf, ss, "", buf, m, 0, NBG_EUNSUP, "24-bit", "cbf-bin-24-bit",
        "24-bit elements refused");
    BAD(bo, s32, "MIDDLE_ENDIAN", m, n, sf, ss, "", buf, m, 0, NBG_EFORMAT, "Byte-Order", "cbf-bin-byte-order",
        "an unknown byte order");
    mime(head, sizeof head, bo, s32, le, m, n, sf, ss, "");
    char *enc = strstr(head, "BINARY");
    if (enc != NULL)
        memcpy(enc, "BASE64", 6);
    write_cbf(path, p, head, buf, m, 0);
    expect_read_error(ctx, path, NBG_EUNSUP, "BASE64", "cbf-bin-base64", "a BASE64 transfer encoding");
    BAD("x-CBF_NONE", s32, le, 4 * n - 4, n, sf, ss, "", buf, 4 * n - 4, 0, NBG_EFORMAT, "uncompressed",
        "cbf-bin-none-short", "x-CBF_NONE data 4 bytes short of the elements");
    /* malformed header values */
    mime(head, sizeof head, bo, s32, le, m, n, sf, ss, "");
    char *sz = strstr(head, "X-Binary-Size: ");
    if (sz != NULL)
        memcpy(sz + 15, "1x", 2);
    write_cbf(path, p, head, buf, m, 0);
    expect_read_error(ctx, path, NBG_EFORMAT, "not a count", "cbf-bin-size-not-number", "X-Binary-Size not a number");
    snprintf(extra, sizeof extra, "Content-MD5: not-a-digest\r\n");
    BAD(bo, s32, le, m, n, sf, ss, extra, buf, m, 0, NBG_EFORMAT, "Content-MD5", "cbf-bin-md5-malformed",
        "a Content-MD5 that is no digest");
    snprintf(extra, sizeof extra, "Content-MD5: AAAAAAAAAAAAAAAAAAAAAA==\r\n");
    BAD(bo, s32, le, m, n, sf, ss, extra, buf, m, 0, NBG_EFORMAT, "Content-MD5", "cbf-bin-md5-mismatch",
        "data that do not match their Content-MD5");
    mime(head, sizeof head, bo, s32, le, m, n, sf, ss, "");
    sz = strstr(head, "X-Binary-Size: ");
    if (sz != NULL)
        memcpy(sz, "X-Binary-Sise", 13);
    write_cbf(path, p, head, buf, m, 0);
    expect_read_error(ctx, path, NBG_EFORMAT, "X-Binary-Size", "cbf-bin-no-size", "no X-Binary-Size");
#undef BAD
    free(v);
    free(buf);
}

/* Text that would make CBFlib parse binary data: refused before CBFlib sees it. */
static void test_binary_text(nbg_ctx *ctx, const char *file, size_t size)
{
    char path[4200];
    tmp_path("text.cbf", path, sizeof path);
    const char *at = strstr(file, "_array_data.array_id");
    if (at == NULL) {
        nbgi_test_check(0, "cbf-bin-text", "the written file has _array_data");
        return;
    }
    const size_t k = (size_t)(at - file);
    char *edit = malloc(size + 256);
    /* a text field whose second line is a MIME boundary (CBFlib takes it for a binary section) */
    const char *field = "_diffrn.details\r\n;\r\nsome text\r\n--CIF-BINARY-FORMAT-SECTION--\r\nX-Binary-Size: 99999999\r\n"
                        "\r\n;\r\n";
    size_t m = (size_t)snprintf(edit, size + 256, "%.*s%s", (int)k, file, field);
    memcpy(edit + m, file + k, size - k);
    write_bytes(path, edit, m + size - k);
    expect_read_error(ctx, path, NBG_EFORMAT, "MIME boundary", "cbf-bin-boundary-in-text",
                      "a MIME boundary inside an ordinary text field");
    /* a control byte (0x1A, CBFlib's old-style binary marker) in a text value */
    m = (size_t)snprintf(edit, size + 256, "%.*s_diffrn.details 'a\x1a b'\r\n", (int)k, file);
    memcpy(edit + m, file + k, size - k);
    write_bytes(path, edit, m + size - k);
    expect_read_error(ctx, path, NBG_EFORMAT, "control byte 0x1a", "cbf-bin-control-byte",
                      "a control byte outside the binary section");
    free(edit);
}

/* Writes file with the first occurrence of from replaced by to, into path. */
static int write_edited(const char *path, const char *file, size_t size, const char *from, const char *to)
{
    const char *at = memmem(file, size, from, strlen(from));
    if (at == NULL)
        return 0;
    FILE *f = fopen(path, "wb");
    if (f == NULL)
        return 0;
    const size_t k = (size_t)(at - file);
    fwrite(file, 1, k, f);
    fputs(to, f);
    fwrite(at + strlen(from), 1, size - k - strlen(from), f);
    fclose(f);
    return 1;
}

/* Writes file into path with the three numbers after prefix (an axis row's vector) replaced by 0 0 0. */
static int write_zero_vector(const char *path, const char *file, size_t size, const char *prefix)
{
    const char *at = memmem(file, size, prefix, strlen(prefix));
    if (at == NULL)
        return 0;
    const char *p = at + strlen(prefix);
    for (int k = 0; k < 3; ++k) { /* past three numbers and the blanks after each */
        while (p < file + size && *p != ' ' && *p != '\r' && *p != '\n')
            ++p;
        while (k < 2 && p < file + size && *p == ' ')
            ++p;
    }
    char from[256], to[256];
    const size_t len = (size_t)(p - at);
    if (len >= sizeof from)
        return 0;
    memcpy(from, at, len);
    from[len] = 0;
    snprintf(to, sizeof to, "%s0 0 0", prefix);
    return write_edited(path, file, size, from, to);
}

/* Axis categories that CBFlib 0.9.7's geometry constructors would crash on (src/cbf.c checks them first). */
static void test_geometry_guard(nbg_ctx *ctx, const char *file, size_t size, size_t n)
{
    char path[4200];
    tmp_path("geom.cbf", path, sizeof path);
    /* the goniometer's axis renamed in axis only: CBFlib's goniometer would read no axis and crash; a still */
    float *img = NULL;
    size_t npix = 0;
    nbg_geometry r;
    int rc = write_edited(path, file, size, "GONIOMETER_PHI rotation", "GONIOMETER_PHX rotation")
                 ? nbgi_read_cbf(ctx, path, &img, &npix, &r, NULL)
                 : -1;
    nbgi_test_check(rc == NBG_OK && npix == n && r.scan_stated == 0 && r.scan_width == 0, "cbf-geom-goniometer-missing",
                    "a goniometer axis missing from axis: read as a still (%s, scan_stated %d)",
                    rc == NBG_OK ? "ok" : nbg_errmsg(ctx), rc == NBG_OK ? r.scan_stated : -1);
    free(img);
    /* the goniometer's axis of no length: CBFlib's goniometer crashed on it (fuzz-image); read as a still */
    img = NULL;
    npix = 0;
    const int edited = write_zero_vector(path, file, size, "GONIOMETER_PHI rotation goniometer . ");
    rc = edited ? nbgi_read_cbf(ctx, path, &img, &npix, &r, NULL) : -1;
    nbgi_test_check(edited && rc == NBG_OK && npix == n && r.scan_stated == 0, "cbf-geom-goniometer-zero-axis",
                    "a goniometer axis of no length: read as a still, no crash (%s)",
                    !edited ? "the written file has no such row" : rc == NBG_OK ? "ok" : nbg_errmsg(ctx));
    free(img);
    /* a detector translation of no length: refused, no crash */
    if (write_zero_vector(path, file, size, "DETECTOR_Z translation detector . "))
        expect_read_error(ctx, path, NBG_EFORMAT, "detector's axes", "cbf-geom-zero-translation",
                          "a detector axis of no length");
    else
        nbgi_test_check(0, "cbf-geom-zero-translation", "the written file has no DETECTOR_Z row to edit");
    int ok = write_edited(path, file, size, "_diffrn_detector_element.detector_id DETECTOR",
                          "_diffrn_detector_element.detector_id NOBODY");
    if (ok)
        expect_read_error(ctx, path, NBG_EFORMAT, "diffrn_detector_element", "cbf-geom-no-element",
                          "no detector element of the detector (CBFlib divides by their count)");
    ok = write_edited(path, file, size, "DETECTOR_Z translation detector .",
                      "DETECTOR_Z translation detector GONIOMETER_PHI");
    if (ok)
        expect_read_error(ctx, path, NBG_EFORMAT, "detector's axes", "cbf-geom-dependency-outside",
                          "a detector axis depending on an axis the detector does not list");
    ok = ok && write_edited(path, file, size, "DETECTOR_Z translation detector .",
                            "DETECTOR_Z translation detector ELEMENT_Y");
    if (ok)
        expect_read_error(ctx, path, NBG_EFORMAT, "detector's axes", "cbf-geom-dependency-cycle",
                          "detector axes that depend on each other in a cycle");
    ok = ok && write_edited(path, file, size, "DETECTOR_Z translation detector .",
                            "DETECTOR_Z translation detector NO_SUCH_AXIS");
    if (ok)
        expect_read_error(ctx, path, NBG_EFORMAT, "detector's axes", "cbf-geom-dependency-missing",
                          "a detector axis depending on an axis that does not exist");
    nbgi_test_check(ok, "cbf-geom-edits", "the written file has the rows these checks edit");
}

static void test_binary(nbg_ctx *ctx)
{
    nbg_geometry g;
    make_geometry(&g);
    const size_t n = (size_t)g.fpixels * g.spixels;
    int32_t *data = malloc(n * sizeof *data);
    for (size_t i = 0; i < n; ++i)
        data[i] = (int32_t)(i % 9) * 3 - 12;
    char path[4200];
    tmp_path("parts_0001.cbf", path, sizeof path);
    int rc = nbg_write_cbf(ctx, path, &g, 0, data);
    size_t size = 0;
    char *file = rc == NBG_OK ? nbgi_test_read_file(path, &size) : NULL;
    cbf_parts p;
    if (!nbgi_test_check(file != NULL && split_cbf(file, size, &p), "cbf-bin-split",
                         "a written file cut around its binary section")) {
        free(file);
        free(data);
        return;
    }
    char sf[16], ss[16];
    snprintf(sf, sizeof sf, "%d", g.fpixels);
    snprintf(ss, sizeof ss, "%d", g.spixels);
    test_binary_good(ctx, &p, n, sf, ss);
    test_binary_bad(ctx, &p, n, sf, ss);
    test_binary_text(ctx, file, size);
    test_geometry_guard(ctx, file, size, n);

    /* a written file with one data byte changed: its Content-MD5 no longer matches */
    char *mk = memmem(file, size, "\x0c\x1a\x04\xd5", 4);
    if (mk != NULL) {
        mk[10] ^= 0x01;
        tmp_path("damaged_0001.cbf", path, sizeof path);
        write_bytes(path, file, size);
    }
    expect_read_error(ctx, path, NBG_EFORMAT, "Content-MD5", "cbf-bin-md5-damaged",
                      "a written file with one data byte flipped");
    free(file);
    free(data);
}

/* ---------------------------------------------------------------------------------------------------------- */
/* Real beamline images                                                                                       */
/* ---------------------------------------------------------------------------------------------------------- */

/* FNV-1a (64 bits) of n bytes. */
static uint64_t fnv1a(const void *p, size_t n)
{
    const unsigned char *b = p;
    uint64_t h = 1469598103934665603ULL;
    for (size_t i = 0; i < n; ++i)
        h = (h ^ b[i]) * 1099511628211ULL;
    return h;
}

/* A real image and what nbg_read_image returned for it when CBFlib decoded its binary section (before nbgrad
 * decoded it itself): the hashes of the pixels' float bits and of the mask (overloads included), the size, and
 * some of the geometry, exactly. */
typedef struct {
    const char *file, *unpack; /* under the real-data folder; the command that decompresses it to stdout */
    size_t npix;
    int f, s;
    uint64_t img, mask;
    double wavelength, pixel, origin_z, saturation;
} real_case;

/* The real-data folder: $NBG_REALDATA, else data/real beside the golden folder (../shared/data/real). */
static const char *real_dir(char *buf, size_t size)
{
    const char *d = getenv("NBG_REALDATA");
    if (d != NULL && d[0] != '\0')
        return d;
    snprintf(buf, size, "%s/../data/real", nbgi_test_golden_dir());
    return buf;
}

/* Replaces the first occurrence of from in the n bytes of b by to (the same length); 0 when from is not there. */
static int patch(unsigned char *b, size_t n, const char *from, const char *to)
{
    const size_t k = strlen(from);
    unsigned char *p = memmem(b, n, from, k);
    if (p == NULL || strlen(to) != k)
        return 0;
    memcpy(p, to, k);
    return 1;
}

/* The CSPAD's multi-panel CBF (4 arrays of 388 x 185 x 8, x-CBF_PACKED, cut into 64 sections of 194 x 185 by
 * array_structure_list_section under a quadrant / sensor / ASIC axis hierarchy) against dxtbx's reading of it:
 * tests/data/cspad_dxtbx.json was written once by Debian's dials (dxtbx's FormatCBFCspad: get_raw_data and the
 * detector) with tests/data/cspad_dxtbx.py; it holds per panel its name, size, pixel size, the sum and sum of
 * squares of its pixels, its first and last pixel, its fast and slow axes and origin (DIALS's lab frame, mm).
 * Then copies of the file made malformed or unsupported in place (same length, so the binary sections stay where
 * they are): refused with a message naming the file and the fault, never a crash. */
static void test_cspad(nbg_ctx *ctx, const char *src)
{
    json_error_t jerr;
    json_t *ref = json_load_file("tests/data/cspad_dxtbx.json", 0, &jerr);
    json_t *rp = ref != NULL ? json_object_get(ref, "panels") : NULL;
    if (rp == NULL || !json_is_array(rp)) {
        nbgi_test_check(0, "cbf-real-cspad-ref", "tests/data/cspad_dxtbx.json: %s", jerr.text);
        json_decref(ref);
        return;
    }
    nbg_geometry g;
    nbg_panel *pan = NULL;
    int np = 0;
    int rc = nbg_read_cbf_panels(ctx, src, &g, &pan, &np);
    float *img = NULL;
    uint8_t *mask = NULL;
    size_t npix = 0;
    int whole = 1;
    nbg_geometry gi;
    const int rci = nbg_read_image(ctx, src, 0, 0, &img, &npix, &gi, &whole, &mask);
    const size_t nref = json_array_size(rp);
    nbgi_test_check(rc == NBG_OK && rci == NBG_OK && (size_t)np == nref && np == 64 && npix == 64u * 194 * 185 &&
                    !whole, "cbf-real-cspad-read", "the CSPAD CBF reads as %d panels (dxtbx: %zu), %zu pixels, not "
                    "one flat detector (%s)", np, nref, npix, rc != NBG_OK || rci != NBG_OK ? nbg_errmsg(ctx) : "ok");
    if (rc == NBG_OK && rci == NBG_OK && (size_t)np == nref) {
        int bad_px = 0, bad_frame = 0, bad_size = 0;
        double worst = 0;
        size_t at = 0;
        for (int k = 0; k < np; ++k) {
            json_t *r = json_array_get(rp, (size_t)k);
            const nbg_panel *p = &pan[k];
            const size_t m = (size_t)p->fpixels * (size_t)p->spixels;
            if (strcmp(p->name, json_string_value(json_array_get(r, 0))) != 0 ||
                p->fpixels != json_integer_value(json_array_get(r, 1)) ||
                p->spixels != json_integer_value(json_array_get(r, 2)) ||
                fabs(p->pixel - json_number_value(json_array_get(r, 3))) > 1e-12 || at + m > npix) {
                ++bad_size;
                break;
            }
            double sum = 0, sq = 0;
            for (size_t i = 0; i < m; ++i) sum += img[at + i], sq += (double)img[at + i] * img[at + i];
            bad_px += sum != json_number_value(json_array_get(r, 4)) || sq != json_number_value(json_array_get(r, 5)) ||
                      img[at] != json_number_value(json_array_get(r, 6)) ||
                      img[at + m - 1] != json_number_value(json_array_get(r, 7));
            for (int i = 0; i < 3; ++i) {
                const double d[3] = {p->fast[i] - json_number_value(json_array_get(r, 8 + (size_t)i)),
                                     p->slow[i] - json_number_value(json_array_get(r, 11 + (size_t)i)),
                                     p->origin[i] - json_number_value(json_array_get(r, 14 + (size_t)i))};
                for (int j = 0; j < 3; ++j) worst = fmax(worst, fabs(d[j]));
            }
            at += m;
        }
        bad_frame = !(worst < 1e-9);
        nbgi_test_check(bad_size == 0, "cbf-real-cspad-panels", "every panel's name, size (194 x 185) and pixel "
                        "(0.10992 mm) as dxtbx's, in dxtbx's order");
        nbgi_test_check(bad_size == 0 && bad_px == 0, "cbf-real-cspad-pixels", "every panel's pixels as dxtbx's "
                        "get_raw_data (sum, sum of squares, first and last pixel exact; %d panels differ)", bad_px);
        nbgi_test_check(bad_size == 0 && !bad_frame, "cbf-real-cspad-frames", "every panel's fast, slow and origin "
                        "as dxtbx's (largest difference %.3g mm, to 1e-9)", worst);
        json_t *dir = json_object_get(ref, "direction");
        nbgi_test_check(g.wavelength == json_number_value(json_object_get(ref, "wavelength")) &&
                        g.direction[2] == json_number_value(json_array_get(dir, 2)) && g.scan_width == 0 &&
                        gi.fpixels == 194 && gi.spixels == 185, "cbf-real-cspad-beam",
                        "the beam as dxtbx's (wavelength %.7g A, direction %g %g %g), a still", g.wavelength,
                        g.direction[0], g.direction[1], g.direction[2]);
        /* the hierarchy: 4 quadrants at level 1, 32 sensors at level 2 (the motion groups), each panel at 3 */
        int nq = 0, ns = 0, lvl_ok = 1;
        for (int k = 0; k < np; ++k) {
            nq = pan[k].level_group[1] + 1 > nq ? pan[k].level_group[1] + 1 : nq;
            ns = pan[k].level_group[2] + 1 > ns ? pan[k].level_group[2] + 1 : ns;
            lvl_ok &= pan[k].level_group[0] == 0 && pan[k].level_group[1] == k / 16 &&
                      pan[k].level_group[2] == k / 2 && pan[k].level_group[3] == k && pan[k].group == k / 2;
        }
        nbgi_test_check(lvl_ok && nq == 4 && ns == 32, "cbf-real-cspad-levels", "the hierarchy's levels: %d quadrants, "
                        "%d sensors of two ASICs (the motion groups)", nq, ns);
        size_t nmask = 0;
        for (size_t i = 0; mask != NULL && i < npix; ++i) nmask += mask[i] != 0;
        nbgi_test_check(nmask < npix / 2, "cbf-real-cspad-mask", "the mask (pixels at or below undefined_value -400, "
                        "or at or above the overload 90000): %zu of %zu", nmask, npix);
    }
    free(pan);
    free(img);
    free(mask);
    json_decref(ref);

    /* malformed and unsupported copies */
    size_t len = 0;
    unsigned char *bytes = (unsigned char *)nbgi_test_read_file(src, &len);
    if (bytes == NULL) {
        nbgi_test_check(0, "cbf-real-cspad-bad", "cannot read %s", src);
        return;
    }
    static const struct {
        const char *id, *from, *to, *part, *what;
        int want;
    } bad[] = {
        {"cbf-cspad-past-array", "ARRAY_D0Q0 ARRAY_D0Q0S0A1 1 195 388", "ARRAY_D0Q0 ARRAY_D0Q0S0A1 1 295 488",
         "reaches past its array", "a section past its array", NBG_EFORMAT},
        {"cbf-cspad-cycle", "AXIS_D0_Y translation detector AXIS_D0_Z", "AXIS_D0_Y translation detector AXIS_D0_X",
         "cycle", "axes that depend on each other in a cycle", NBG_EFORMAT},
        {"cbf-cspad-rotation", "AXIS_D0Q0S0A0_F translation", "AXIS_D0Q0S0A0_F rotation   ", "is a rotation",
         "a surface axis that is a rotation", NBG_EUNSUP},
        {"cbf-cspad-planes", "ARRAY_D0Q0 ARRAY_D0Q0S0A0 3 1 1", "ARRAY_D0Q0 ARRAY_D0Q0S0A0 3 1 2", "planes",
         "a section spanning two planes", NBG_EUNSUP},
        {"cbf-cspad-size", "ARRAY_D0Q0 ARRAY_D0Q0S0A0 1 194 1", "ARRAY_D0Q0 ARRAY_D0Q0S0A0 1 195 1",
         "dimension 1", "array_structure_list's size disagreeing with the section", NBG_EFORMAT},
        {"cbf-cspad-nosection", "ARRAY_D0Q0 ARRAY_D0Q0S0A0 2 1 185", "ARRAY_D0Q0 ARRAY_D0Q0S0A0 9 1 185",
         "index 1, 2", "a section without its slow extent", NBG_EFORMAT},
        {"cbf-cspad-v2", "conversions=\"x-CBF_PACKED\"", "conversions=\"x-CBF_PACKEV\"", "not supported",
         "a compression nbgrad does not decode", NBG_EUNSUP},
    };
    char path[4200];
    for (size_t c = 0; c < sizeof bad / sizeof bad[0]; ++c) {
        unsigned char *b = malloc(len);
        memcpy(b, bytes, len);
        if (!patch(b, len, bad[c].from, bad[c].to)) {
            nbgi_test_check(0, bad[c].id, "the CSPAD file has no \"%s\" to change", bad[c].from);
            free(b);
            continue;
        }
        tmp_path("cspad-bad.cbf", path, sizeof path);
        FILE *f = fopen(path, "wb");
        if (f != NULL) {
            fwrite(b, 1, len, f);
            fclose(f);
        }
        free(b);
        expect_read_error(ctx, path, bad[c].want, bad[c].part, bad[c].id, bad[c].what);
        remove(path);
    }
    /* packed data damaged (their Content-MD5 renamed away): any result but a crash, an error naming the file */
    {
        unsigned char *b = malloc(len);
        memcpy(b, bytes, len);
        int ok = 1;
        for (int i = 0; i < 4; ++i) ok &= patch(b, len, "Content-MD5:", "Content-XD5:");
        unsigned char *d = memmem(b, len, "\x0c\x1a\x04\xd5", 4);
        if (d != NULL && (size_t)(d - b) + 5000 < len) {
            for (int i = 40; i < 4000; i += 7) d[i] ^= (unsigned char)(0x5a + i);
            memset(d + 100, 0xff, 200); /* chunks of 128 elements of 65 bits */
        }
        tmp_path("cspad-damaged.cbf", path, sizeof path);
        FILE *f = fopen(path, "wb");
        if (f != NULL) {
            fwrite(b, 1, len, f);
            fclose(f);
        }
        free(b);
        float *im = NULL;
        size_t n = 0;
        nbg_geometry gg;
        rc = nbgi_read_cbf(ctx, path, &im, &n, &gg, NULL);
        nbgi_test_check(ok && d != NULL && (rc == NBG_OK || contains(nbg_errmsg(ctx), path)), "cbf-cspad-damaged",
                        "packed data damaged: read or refused naming the file, no crash (status %d, \"%s\")", rc,
                        rc == NBG_OK ? "" : nbg_errmsg(ctx));
        free(im);
        remove(path);
    }
    /* cut short */
    tmp_path("cspad-cut.cbf", path, sizeof path);
    FILE *f = fopen(path, "wb");
    if (f != NULL) {
        fwrite(bytes, 1, len / 2, f);
        fclose(f);
    }
    expect_read_error(ctx, path, 0, NULL, "cbf-cspad-truncated", "the CSPAD file cut in half");
    remove(path);
    free(bytes);
}

/* A kappa goniometer (nbgi_test_kappa) written as frame 2 and read back: its axes, angles (the scan axis's the
 * frame's), names and scan axis, and the laboratory's rotation axis (CBFlib's) to 1e-12. */
static void test_kappa(nbg_ctx *ctx)
{
    nbg_geometry g, r;
    make_geometry(&g);
    nbgi_test_check(nbgi_test_kappa(&g) == NBG_OK, "cbf-kappa-setup", "a kappa goniometer");
    const size_t n = (size_t)g.fpixels * g.spixels;
    int32_t *data = calloc(n, sizeof *data);
    char path[4200];
    tmp_path("kappa_0003.cbf", path, sizeof path);
    int rc = data != NULL ? nbg_write_cbf(ctx, path, &g, 2, data) : NBG_ENOMEM;
    nbgi_test_check(rc == NBG_OK, "cbf-kappa-write", "frame 2 with a kappa goniometer (%s)",
                    rc ? nbg_errmsg(ctx) : "ok");
    float *img = NULL;
    size_t npix = 0;
    memset(&r, 0, sizeof r);
    rc = rc ? rc : nbgi_read_cbf(ctx, path, &img, &npix, &r, NULL);
    free(img);
    free(data);
    if (!nbgi_test_check(rc == NBG_OK, "cbf-kappa-read", "read it back (%s)", rc ? nbg_errmsg(ctx) : "ok"))
        return;
    nbg_goniometer want = g.goniometer;
    want.angles[want.scan_axis] = g.scan_start + 2 * g.scan_width;
    nbgi_test_same_goniometer(&r.goniometer, &want, 1e-12, "cbf-kappa");
    check_vec(r.axis, g.axis, 1e-12, "cbf-kappa-axis", "the laboratory's rotation axis");
    nbgi_test_rel(r.scan_start, g.scan_start + 2 * g.scan_width, 1e-15, "cbf-kappa-scan-start",
                  "scan start of frame 2");
    nbgi_test_rel(r.scan_width, g.scan_width, 1e-15, "cbf-kappa-scan-width", "oscillation width");
}

/* The SmarGon of Diamond I03's full CBF as dials.import has it: GON_PHI on GON_CHI on GON_OMEGA, (1,0,0), (0,0,-1),
 * (1,0,0), each at 45 deg, scanning GON_OMEGA; the laboratory's axis S unit(GON_OMEGA). */
static void check_smargon(const nbg_geometry *g)
{
    nbg_goniometer want;
    memset(&want, 0, sizeof want);
    static const double axes[3][3] = {{1, 0, 0}, {0, 0, -1}, {1, 0, 0}};
    static const char *const names[3] = {"GON_PHI", "GON_CHI", "GON_OMEGA"};
    want.naxes = 3, want.scan_axis = 2;
    for (int i = 0; i < 3; ++i) {
        memcpy(want.axes[i], axes[i], sizeof axes[i]);
        want.angles[i] = 45;
        snprintf(want.names[i], sizeof want.names[i], "%s", names[i]);
    }
    nbgi_test_same_goniometer(&g->goniometer, &want, 1e-12, "cbf-real-smargon-gonio");
    double lab[3] = {NAN, NAN, NAN};
    nbg_goniometer gn = g->goniometer;
    if (gn.naxes == 3 && nbg_goniometer_derive(NULL, &gn, "") == NBG_OK)
        nbgi_goniometer_axis(&gn, lab);
    check_vec(lab, g->axis, 1e-12, "cbf-real-smargon-axis", "S unit(scan axis) as CBFlib's rotation axis");
}

static void test_real_data(nbg_ctx *ctx)
{
    static const real_case cases[] = {
        {"image_examples/DLS_I03_smargon_0001.cbf.gz", "gzip -dc", 6224001, 2463, 2527, 0xe8560b4ebc84f643ULL,
         0x829d01ad749db9f9ULL, 0x1.f3d70a3d70a3dp-1, 0x1.604189374bc6ap-3, -0x1.237851eb851ecp+8, 0x1.6693p+16},
        {"image_examples/dlsnxs2cbf_therm_0001.cbf.gz", "gzip -dc", 18093576, 4148, 4362, 0x89ea30f53e7d9572ULL,
         0x5330483383db8c7fULL, 0x1.f5e5f30e7ff58p-1, 0x1.3333333333333p-4, -0x1.abeb851eb851fp+7, 0x1.fffep+15},
        {"thaumatin_grid/thau_3_2_0001.cbf.bz2", "bzip2 -dc", 6224001, 2463, 2527, 0x1081677a6de228adULL,
         0xb347fcb997d54991ULL, 0x1.efeb074a771c9p-1, 0x1.604189374bc6bp-3, -0x1.5fp+8, 0x1.c4b9p+16},
    };
    char dirbuf[4200], src[4400], path[4200], cmd[9000], id[96];
    const char *dir = real_dir(dirbuf, sizeof dirbuf);
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; ++c) {
        const real_case *k = &cases[c];
        const char *name = strrchr(k->file, '/') + 1;
        snprintf(id, sizeof id, "cbf-real-%.*s", (int)strcspn(name, "."), name);
        snprintf(src, sizeof src, "%s/%s", dir, k->file);
        if (!exists(src)) {
            nbgi_test_skip(id, "%s not found (set NBG_REALDATA to the real-data folder)", src);
            continue;
        }
        tmp_path("real.cbf", path, sizeof path);
        snprintf(cmd, sizeof cmd, "%s '%s' > '%s'", k->unpack, src, path);
        if (system(cmd) != 0) {
            nbgi_test_skip(id, "cannot decompress %s (%s)", src, k->unpack);
            continue;
        }
        float *img = NULL;
        uint8_t *mask = NULL;
        size_t npix = 0;
        nbg_geometry g;
        int whole = 0;
        const int rc = nbg_read_image(ctx, path, 0, 0, &img, &npix, &g, &whole, &mask);
        const int ok = rc == NBG_OK && npix == k->npix && g.fpixels == k->f && g.spixels == k->s &&
                       fnv1a(img, npix * sizeof *img) == k->img && mask != NULL && fnv1a(mask, npix) == k->mask &&
                       g.wavelength == k->wavelength && g.pixel_f == k->pixel && g.origin[2] == k->origin_z &&
                       g.saturation == k->saturation && whole;
        nbgi_test_check(ok, id, "%s: %zu pixels (%d x %d), pixels and mask as CBFlib decoded them, geometry exact (%s)",
                        name, npix, g.fpixels, g.spixels, rc == NBG_OK ? "ok" : nbg_errmsg(ctx));
        if (rc == NBG_OK && strstr(name, "smargon") != NULL)
            check_smargon(&g);
        free(img);
        free(mask);
        remove(path);
    }
    /* the Pilatus 12M miniCBF (Diamond I23: 24 rows of modules on a cylinder; dxtbx places them from its own
     * table): refused, naming the detector and how to read it, by nbg_read_image and nbg_read_cbf_panels, never a
     * flat panel of 2463 x 5071 */
    snprintf(src, sizeof src, "%s/image_examples/DLS_I23_P12M_thau_00001.cbf.gz", dir);
    tmp_path("DLS_I23_P12M_thau_00001.cbf", path, sizeof path);
    snprintf(cmd, sizeof cmd, "gzip -dc '%s' > '%s'", src, path);
    if (!exists(src) || system(cmd) != 0) {
        nbgi_test_skip("cbf-real-p12m", "%s not found or not decompressed", src);
    } else {
        float *img = NULL;
        size_t npix = 0;
        nbg_geometry g;
        int whole = 1;
        int rc = nbg_read_image(ctx, path, 0, 0, &img, &npix, &g, &whole, NULL);
        const char *m = nbg_errmsg(ctx);
        nbgi_test_check(rc == NBG_EUNSUP && img == NULL && npix == 0 && contains(m, path) &&
                        contains(m, "\"PILATUS 12M, S/N 120-0100\"") && contains(m, "dials.import") &&
                        contains(m, "-expt"), "cbf-real-p12m", "the Pilatus 12M miniCBF is refused, naming the "
                        "detector and dials.import: '%s'", m);
        nbg_panel *pan = NULL;
        int np = 1;
        rc = nbg_read_cbf_panels(ctx, path, &g, &pan, &np);
        nbgi_test_check(rc == NBG_EUNSUP && pan == NULL && np == 0 && contains(nbg_errmsg(ctx), "Pilatus 12M"),
                        "cbf-real-p12m-panels", "nbg_read_cbf_panels refuses it too (status %d)", rc);
        free(pan);
        remove(path);
    }
    /* the TimePix_SU quad's SMV (4 chips with wide edge pixels, placed by dxtbx's own table): refused the same way */
    snprintf(src, sizeof src, "%s/image_examples/TIMEPIX_SU_512-stdgoni_0001.img", dir);
    if (!exists(src)) {
        nbgi_test_skip("real-timepix", "%s not found", src);
    } else {
        float *img = NULL;
        size_t npix = 0;
        int rc = nbg_read_image(ctx, src, 0, 0, &img, &npix, NULL, NULL, NULL);
        nbgi_test_check(rc == NBG_EUNSUP && img == NULL && contains(nbg_errmsg(ctx), "\"TimePix_SU\"") &&
                        contains(nbg_errmsg(ctx), "dials.import"), "real-timepix", "the TimePix_SU SMV is refused, "
                        "naming the detector and dials.import: '%s'", nbg_errmsg(ctx));
        free(img);
    }
    snprintf(src, sizeof src, "%s/thermolysin_cspad/idx-20130301060858401.cbf", dir);
    if (!exists(src)) {
        nbgi_test_skip("cbf-real-cspad", "%s not found", src);
        return;
    }
    test_cspad(ctx, src);
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
    test_kappa(ctx);
    test_errors(ctx);
    test_binary(ctx);
    test_real_data(ctx);
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
