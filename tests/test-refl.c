/*
 * test-refl.c -- DIALS reflection tables (nbg_read_refl) and spot boxes on panels (nbg_spot_box_pixels), and
 * refine's -spotlist with either on a detector of two panels.
 *
 *   refl-read-*      tables written here with libmsgpack-c as DIALS writes them (panel std::size_t, xyzobs.px.value
 *                    vec3<double>, bbox int6, id int, a shoebox column and others): every value read back exactly;
 *                    a table without panel and bbox columns (panel 0, no boxes)
 *   refl-bad-*       hostile tables: every truncation, trailing bytes, another file type, version 2, a column of the
 *                    wrong type, counts and byte sizes that do not match the row count, a non-finite centroid, a
 *                    panel over INT_MAX, a reversed box, a container claiming 4 G elements in 5 bytes, nesting
 *                    deeper than msgpack-c's stack, 3000 random byte mutations: each refused with a message (or
 *                    read), never a crash (ASan in make test-asan)
 *   boxes-*          nbg_spot_box_pixels on two panels: pixels per box, clipping at a panel's edge, overlaps once,
 *                    sorted; a box on a panel the detector lacks, an empty box, a box outside its panel: named
 *   refl-read-shoebox the shoebox column as DIALS writes it (per row panel, box, a flag, then data, mask and
 *                    background): the masks read back value for value; refl-bad-shoebox-*: a cut column, a reversed
 *                    box, a flag of 2, trailing bytes, a box of 4e9 pixels, another Shoebox type: refused naming the
 *                    row and field
 *   refl-shoebox-*   nbg_reflection_shoebox_boxes: the Foreground/Strong pixels of any slice as one-pixel boxes (or
 *                    dilated), the pixel list across two panels; hostile rows refused naming the row
 *   refl-boxes-*     nbg_reflection_boxes on two panels: the rows' bounding boxes or boxes about their centroids,
 *                    other experiments' rows left out; a centroid off its panel, a panel the detector lacks named
 *   cli-*            nbgrad refine -expt (two panels) -spotlist: a .refl of the model's spots on both panels (their
 *                    bounding boxes, or -spots N about the centroids) and a "panel fast slow" text list give the
 *                    pixel counts nbg_spot_box_pixels gives; the fit of orient_z on those regions converges to the
 *                    truth; with -spot_shoebox 0 the shoeboxes' Foreground pixels (the count nbg_spot_box_pixels
 *                    gives), converging too; -spot_shoebox without a .refl refused; a .refl naming a panel the
 *                    detector lacks is refused
 */
#include "testutil.h" /* first: it sets _GNU_SOURCE */
#include "nbgrad.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

#ifdef NBG_HAVE_FORMATS
#include <msgpack.h>

#include "msgpackutil.h"

int nbgi_refl_parse(nbg_ctx *ctx, const char *path, const unsigned char *buf, size_t len, nbg_reflections *out);

/* What to break in a table. */
enum {
    T_OK = 0,
    T_NO_PANEL_BBOX,
    T_MAGIC,
    T_VERSION,
    T_XYZ_TYPE,
    T_XYZ_COUNT,
    T_XYZ_BYTES,
    T_XYZ_NAN,
    T_PANEL_HUGE,
    T_BBOX_REVERSED,
    T_OTHER_COUNT,
    T_NO_XYZ,
    T_NROWS_STR,
    T_SB_SHORT,
    T_SB_BOX,
    T_SB_FLAG,
    T_SB_TRAILING,
    T_SB_HUGE,
    T_SB_TYPE,
    T_NKINDS
};
static const char *kind_name[T_NKINDS] = {"ok", "no-panel-bbox", "magic", "version", "xyz-type", "xyz-count",
                                          "xyz-bytes", "xyz-nan", "panel-huge", "bbox-reversed", "other-count",
                                          "no-xyz", "nrows-string", "shoebox-short", "shoebox-box",
                                          "shoebox-flag", "shoebox-trailing", "shoebox-huge", "shoebox-type"};


#define NR 3
static const uint64_t g_panel[NR] = {0, 1, 1};
static const double g_xyz[3 * NR] = {10.5, 12.25, 0.5, 3.75, 20.5, 0.5, 30.125, 5.5, 1.5};
static const int32_t g_bbox[6 * NR] = {8, 13, 10, 15, 0, 1, 2, 6, 18, 23, 0, 1, 28, 33, 3, 8, 1, 2};
static const int32_t g_id[NR] = {0, 0, -1};
/* the shoeboxes' pixels: rows 0 and 2 carry theirs (5 x 5 x 1 each), row 1 none */
static const int g_sbdata[NR] = {1, 0, 1};

/* The mask DIALS would write at pixel i of row r's shoebox: a spread of MaskCode values, high bits too. */
static int32_t sb_mask(int r, int i)
{
    static const int32_t v[7] = {0, 1, 5, 13, 3, 1 | 16, 5 | 32};
    return v[(r * 3 + i * 5 + i / 4) % 7];
}

/* The bytes of a table of NR rows (the host is little-endian, as DIALS's files are), broken as kind says. */
static msgpack_sbuffer table(int kind)
{
    msgpack_sbuffer sb;
    msgpack_sbuffer_init(&sb);
    msgpack_packer pk;
    msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
    msgpack_pack_array(&pk, 3);
    pack_str(&pk, kind == T_MAGIC ? "dials::af::experiment_list" : "dials::af::reflection_table");
    msgpack_pack_uint64(&pk, kind == T_VERSION ? 2 : 1);
    msgpack_pack_map(&pk, 3);
    pack_str(&pk, "identifiers");
    msgpack_pack_map(&pk, 1);
    msgpack_pack_uint64(&pk, 0);
    pack_str(&pk, "c0ffee");
    pack_str(&pk, "nrows");
    if (kind == T_NROWS_STR) {
        pack_str(&pk, "3");
    } else {
        msgpack_pack_uint64(&pk, NR);
    }
    pack_str(&pk, "data");
    const int base = kind == T_NO_PANEL_BBOX ? 2 : 4;
    msgpack_pack_map(&pk, (size_t)(base + 2 - (kind == T_NO_XYZ)));
    double xyz[3 * NR];
    memcpy(xyz, g_xyz, sizeof xyz);
    if (kind == T_XYZ_NAN) {
        xyz[4] = NAN;
    }
    uint64_t panel[NR];
    memcpy(panel, g_panel, sizeof panel);
    if (kind == T_PANEL_HUGE) {
        panel[2] = 1ULL << 40;
    }
    int32_t bbox[6 * NR];
    memcpy(bbox, g_bbox, sizeof bbox);
    if (kind == T_BBOX_REVERSED) {
        bbox[6 + 2] = 30;
    }
    const double isum[NR] = {100, 200, 300};
    pack_col(&pk, "intensity.sum.value", "double", kind == T_OTHER_COUNT ? 2 : NR, isum, sizeof isum);
    if (kind != T_NO_XYZ) {
        pack_col(&pk, "xyzobs.px.value", kind == T_XYZ_TYPE ? "vec2<double>" : "vec3<double>",
                 kind == T_XYZ_COUNT ? NR + 1 : NR, xyz, kind == T_XYZ_BYTES ? sizeof xyz - 8 : sizeof xyz);
    }
    if (kind != T_NO_PANEL_BBOX) {
        pack_col(&pk, "panel", "std::size_t", NR, panel, sizeof panel);
        pack_col(&pk, "bbox", "int6", NR, bbox, sizeof bbox);
    }
    pack_col(&pk, "id", "int", NR, g_id, sizeof g_id);
    /* a shoebox column as DIALS writes it: per row its panel (4 bytes), bbox (6 x 4), a byte 1 when the pixels follow,
     * then the box's data (floats), mask (ints) and background (floats) */
    unsigned char sbox[NR * 29 + 2 * 25 * 12 + 8];
    size_t at = 0;
    for (int r = 0; r < NR; ++r) {
        const uint32_t p = (uint32_t)g_panel[r];
        int32_t bb[6];
        memcpy(bb, g_bbox + 6 * r, sizeof bb);
        if (kind == T_SB_BOX && r == 2) {
            bb[5] = bb[4] - 1;
        }
        if (kind == T_SB_HUGE && r == 2) {
            bb[0] = -2000000000, bb[1] = 2000000000;
        }
        memcpy(sbox + at, &p, 4);
        memcpy(sbox + at + 4, bb, 24);
        sbox[at + 28] = (unsigned char)(kind == T_SB_FLAG && r == 1 ? 2 : g_sbdata[r]);
        at += 29;
        if (g_sbdata[r]) {
            for (int i = 0; i < 25; ++i) {
                const float d = (float)(100 * r + i), bg = 0.5f;
                const int32_t mk = sb_mask(r, i);
                memcpy(sbox + at + 4 * i, &d, 4);
                memcpy(sbox + at + 100 + 4 * i, &mk, 4);
                memcpy(sbox + at + 200 + 4 * i, &bg, 4);
            }
            at += 300;
        }
    }
    if (kind == T_SB_TRAILING) {
        memset(sbox + at, 0, 8), at += 8;
    }
    pack_col(&pk, "shoebox", kind == T_SB_TYPE ? "Shoebox<double>" : "Shoebox<>", NR, sbox,
             kind == T_SB_SHORT ? at - 7 : at);
    return sb;
}

static int write_bytes(const char *path, const void *b, size_t n)
{
    FILE *f = fopen(path, "wb");
    if (f == NULL) {
        return 0;
    }
    const int ok = fwrite(b, 1, n, f) == n;
    return fclose(f) == 0 && ok;
}

static void reader(nbg_ctx *ctx, const char *dir)
{
    char path[512];
    snprintf(path, sizeof path, "%s/t.refl", dir);
    msgpack_sbuffer sb = table(T_OK);
    nbg_reflections r;
    int rc = write_bytes(path, sb.data, sb.size) ? nbg_read_refl(ctx, path, &r) : NBG_EIO;
    int same = rc == NBG_OK && r.n == NR && r.bbox != NULL && r.id != NULL && r.has_shoebox && r.ncolumns == 6;
    for (int k = 0; same && k < NR; ++k) {
        same = r.panel[k] == (int)g_panel[k] && r.id[k] == g_id[k];
        for (int j = 0; j < 3; ++j) same = same && r.xyz[3 * k + j] == g_xyz[3 * k + j];
        for (int j = 0; j < 6; ++j) same = same && r.bbox[6 * k + j] == g_bbox[6 * k + j];
    }
    nbgi_test_check(same, "refl-read-all", "%ld rows, %d columns, panel, centroid, box and id read back exactly (%s)",
                    r.n, r.ncolumns, rc == NBG_OK ? "ok" : nbg_errmsg(ctx));
    /* the shoeboxes: panel, box, and the masks of the rows that carry pixels, value for value */
    same = rc == NBG_OK && r.shoebox_panel != NULL && r.shoebox_bbox != NULL && r.shoebox_offset != NULL &&
           r.shoebox_mask != NULL && r.shoebox_offset[NR] == 50;
    long nmask = 0;
    for (int k = 0; same && k < NR; ++k) {
        same = r.shoebox_panel[k] == (int)g_panel[k] && r.shoebox_offset[k + 1] - r.shoebox_offset[k] ==
               (g_sbdata[k] ? 25 : 0);
        for (int j = 0; j < 6; ++j) same = same && r.shoebox_bbox[6 * k + j] == g_bbox[6 * k + j];
        for (long i = 0; same && i < r.shoebox_offset[k + 1] - r.shoebox_offset[k]; ++i, ++nmask) {
            same = r.shoebox_mask[r.shoebox_offset[k] + i] == sb_mask(k, (int)i);
        }
    }
    nbgi_test_check(same && nmask == 50, "refl-read-shoebox", "%ld mask values of 2 shoeboxes (the third without "
                    "pixels), panels and boxes read back exactly (%s)", nmask, rc == NBG_OK ? "ok" : nbg_errmsg(ctx));
    nbg_reflections_free(&r);
    const size_t full = sb.size;
    unsigned char *ok_bytes = malloc(full);
    memcpy(ok_bytes, sb.data, full);
    msgpack_sbuffer_destroy(&sb);

    sb = table(T_NO_PANEL_BBOX);
    rc = nbgi_refl_parse(ctx, "np.refl", (const unsigned char *)sb.data, sb.size, &r);
    nbgi_test_check(rc == NBG_OK && r.n == NR && r.bbox == NULL && r.panel[1] == 0 && r.panel[2] == 0 &&
                        r.xyz[3] == g_xyz[3],
                    "refl-read-no-panel", "without panel and bbox columns: panel 0, no boxes (%s)",
                    rc == NBG_OK ? "ok" : nbg_errmsg(ctx));
    nbg_reflections_free(&r);
    msgpack_sbuffer_destroy(&sb);

    /* hostile tables, each refused with a message naming what is wrong */
    static const char *want[T_NKINDS] = {NULL, NULL, "not a DIALS reflection table", "version", "vec2<double>",
                                         "has 4 rows", "the table has 3 rows", "not finite", "panel is",
                                         "ends before it starts", "has 2 rows", "no \"xyzobs.px.value\"",
                                         "no row count", "shoebox of row 2: its box (28 33 3 8 1 2) needs more",
                                         "shoebox of row 2: its box's z1 (0) is below z0 (1)",
                                         "shoebox of row 1: its data flag is 2", "\"shoebox\": 8 bytes follow",
                                         "shoebox of row 2: its box (-2000000000 2000000000",
                                         "not a [\"Shoebox<>\", values]"};
    for (int k = T_MAGIC; k < T_NKINDS; ++k) {
        sb = table(k);
        rc = nbgi_refl_parse(ctx, "bad.refl", (const unsigned char *)sb.data, sb.size, &r);
        char id[64];
        snprintf(id, sizeof id, "refl-bad-%s", kind_name[k]);
        nbgi_test_check(rc == NBG_EFORMAT && strstr(nbg_errmsg(ctx), want[k]) != NULL && r.panel == NULL &&
                            r.xyz == NULL && r.n == 0,
                        id, "%s", nbg_errmsg(ctx));
        nbg_reflections_free(&r);
        msgpack_sbuffer_destroy(&sb);
    }
    /* every truncation, and trailing bytes */
    long accepted = 0, silent = 0;
    for (size_t len = 0; len < full; ++len) {
        rc = nbgi_refl_parse(ctx, "cut.refl", ok_bytes, len, &r);
        accepted += rc == NBG_OK;
        silent += rc != NBG_OK && (rc != NBG_EFORMAT || nbg_errmsg(ctx)[0] == '\0');
        nbg_reflections_free(&r);
    }
    nbgi_test_check(accepted == 0 && silent == 0, "refl-bad-truncated",
                    "all %zu truncations refused with a message (%ld read, %ld without a message)", full, accepted,
                    silent);
    unsigned char *longer = malloc(full + 1);
    memcpy(longer, ok_bytes, full);
    longer[full] = 0xc0;
    rc = nbgi_refl_parse(ctx, "long.refl", longer, full + 1, &r);
    nbgi_test_check(rc == NBG_EFORMAT && strstr(nbg_errmsg(ctx), "1 bytes follow") != NULL, "refl-bad-trailing", "%s",
                    nbg_errmsg(ctx));
    free(longer);
    /* a container claiming 4 G elements in 5 bytes; nesting deeper than msgpack-c's stack */
    const unsigned char huge[] = {0xdd, 0xff, 0xff, 0xff, 0xff};
    rc = nbgi_refl_parse(ctx, "huge.refl", huge, sizeof huge, &r);
    nbgi_test_check(rc == NBG_EFORMAT, "refl-bad-huge-array", "%s", nbg_errmsg(ctx));
    unsigned char deep[64];
    memset(deep, 0x91, sizeof deep);
    deep[63] = 0xc0;
    rc = nbgi_refl_parse(ctx, "deep.refl", deep, sizeof deep, &r);
    nbgi_test_check(rc == NBG_EFORMAT && strstr(nbg_errmsg(ctx), "deeper") != NULL, "refl-bad-deep", "%s",
                    nbg_errmsg(ctx));
    /* random mutations: read or refused with a message, never a crash */
    uint64_t s = 12345;
    unsigned char *m = malloc(full);
    long read_ok = 0, refused = 0, bad = 0;
    for (int t = 0; t < 3000; ++t) {
        memcpy(m, ok_bytes, full);
        const int nflip = 1 + t % 4;
        for (int f = 0; f < nflip; ++f) {
            s = s * 6364136223846793005ULL + 1442695040888963407ULL;
            m[(s >> 33) % full] = (unsigned char)(s >> 13);
        }
        rc = nbgi_refl_parse(ctx, "mut.refl", m, full, &r);
        if (rc == NBG_OK) {
            ++read_ok;
            for (long k = 0; k < r.n; ++k) bad += !isfinite(r.xyz[3 * k]) || r.panel[k] < 0;
        } else {
            ++refused;
            bad += nbg_errmsg(ctx)[0] == '\0';
        }
        nbg_reflections_free(&r);
    }
    nbgi_test_check(bad == 0, "refl-bad-mutations", "3000 mutated tables: %ld read (finite centroids, panels >= 0), "
                    "%ld refused with a message, %ld violations", read_ok, refused, bad);
    free(m);
    free(ok_bytes);
    /* files: missing, empty */
    snprintf(path, sizeof path, "%s/none.refl", dir);
    rc = nbg_read_refl(ctx, path, &r);
    nbgi_test_check(rc == NBG_EIO, "refl-bad-missing", "%s", nbg_errmsg(ctx));
    snprintf(path, sizeof path, "%s/empty.refl", dir);
    rc = write_bytes(path, "", 0) ? nbg_read_refl(ctx, path, &r) : NBG_EIO;
    nbgi_test_check(rc == NBG_EFORMAT, "refl-bad-empty", "%s", nbg_errmsg(ctx));
}
#endif


/* nbg_reflection_shoebox_boxes (refine -spotlist FILE.refl -spot_shoebox N) on the two panels of e: a row whose
 * 3 x 2 x 2 shoebox marks one pixel Foreground in its first slice and another Strong in its second, a row on panel 1
 * with two Foreground pixels, a row of experiment 2 (left out); then dilated by 1, and the pixel list; then hostile
 * rows, each refused naming the row. */
static void shoebox_boxes(nbg_ctx *ctx, const nbg_experiment *e)
{
    int sp[3] = {0, 1, 0}, sbb[18] = {8, 11, 10, 12, 0, 2, 22, 24, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1}, rid[3] = {0, -1, 2};
    long off[4] = {0, 12, 14, 15};
    int mask[15] = {5, 0, 0, 0, 1, 0, /* z 1: */ 0, 0, 8, 0, 2, 0, /* row 1 */ 4, 5, /* row 2 */ 4};
    int rp[3] = {0, 1, 0};
    double rx[9] = {9, 10.5, 0.5, 22.5, 0.5, 0.5, 0.5, 0.5, 0.5};
    nbg_reflections r = {3, rp, rx, NULL, rid, 1, 5, NULL, NULL, NULL, sp, sbb, off, mask};
    nbg_spot_box *ob = NULL;
    long nb = 0, skipped = 0;
    const int code = NBG_SHOEBOX_FOREGROUND | NBG_SHOEBOX_STRONG;
    int rc = nbg_reflection_shoebox_boxes(ctx, e, &r, code, 0, &ob, &nb, &skipped);
    const nbg_spot_box w0[4] = {{0, 8, 9, 10, 11}, {0, 10, 11, 10, 11}, {1, 22, 23, 0, 1}, {1, 23, 24, 0, 1}};
    nbgi_test_check(rc == NBG_OK && nb == 4 && skipped == 1 && memcmp(ob, w0, sizeof w0) == 0, "refl-shoebox-boxes",
                    "%ld one-pixel boxes, %ld row of another experiment left out: the Foreground or Strong pixels of "
                    "any slice, on their panels (%s)", nb, skipped, rc == NBG_OK ? "ok" : nbg_errmsg(ctx));
    uint32_t *l = NULL;
    long n = 0;
    rc = rc == NBG_OK ? nbg_spot_box_pixels(ctx, e, ob, nb, &l, &n) : rc;
    const uint32_t wl[4] = {10 * 40 + 8, 10 * 40 + 10, 40 * 32 + 22, 40 * 32 + 23};
    nbgi_test_check(rc == NBG_OK && n == 4 && memcmp(l, wl, sizeof wl) == 0, "refl-shoebox-pixels",
                    "%ld pixels, image indices with panel 1 after panel 0's 40 x 32 (%s)", n,
                    rc == NBG_OK ? "ok" : nbg_errmsg(ctx));
    free(l);
    free(ob);
    rc = nbg_reflection_shoebox_boxes(ctx, e, &r, code, 1, &ob, &nb, NULL);
    const nbg_spot_box w1[4] = {{0, 7, 10, 9, 12}, {0, 9, 12, 9, 12}, {1, 21, 24, -1, 2}, {1, 22, 25, -1, 2}};
    n = 0;
    if (rc == NBG_OK) {
        rc = nbg_spot_box_pixels(ctx, e, ob, nb, &l, &n);
        free(l);
    }
    /* panel 0: two 3 x 3 boxes sharing a column, 15; panel 1: rows 0-1 of columns 21-23, 6 */
    nbgi_test_check(rc == NBG_OK && nb == 4 && memcmp(ob, w1, sizeof w1) == 0 && n == 15 + 6, "refl-shoebox-dilate",
                    "dilated by 1: 3 x 3 boxes, %ld pixels after clipping and overlaps (%s)", n,
                    rc == NBG_OK ? "ok" : nbg_errmsg(ctx));
    free(ob);
    int bad = 0;
    sp[1] = 5;
    bad += nbg_reflection_shoebox_boxes(ctx, e, &r, code, 0, &ob, &nb, NULL) == NBG_EINVAL && ob == NULL &&
           strstr(nbg_errmsg(ctx), "reflection 1's shoebox is on panel 5") != NULL;
    sp[1] = 1, sbb[6] = 23, sbb[7] = 25, mask[12] = 0, mask[13] = 4; /* x 24 is off panel 1 (24 wide) */
    bad += nbg_reflection_shoebox_boxes(ctx, e, &r, code, 0, &ob, &nb, NULL) == NBG_EINVAL && ob == NULL &&
           strstr(nbg_errmsg(ctx), "reflection 1's shoebox marks pixel (24, 0) of panel 1") != NULL;
    sbb[6] = 22, sbb[7] = 24, mask[12] = mask[13] = 1;
    bad += nbg_reflection_shoebox_boxes(ctx, e, &r, code, 0, &ob, &nb, NULL) == NBG_EINVAL && ob == NULL &&
           strstr(nbg_errmsg(ctx), "reflection 1's shoebox has no pixel with the mask bits 12") != NULL;
    mask[12] = 4, off[1] = 0; /* row 0 carries no pixels */
    bad += nbg_reflection_shoebox_boxes(ctx, e, &r, code, 0, &ob, &nb, NULL) == NBG_EINVAL && ob == NULL &&
           strstr(nbg_errmsg(ctx), "reflection 0's shoebox carries no pixels") != NULL;
    off[1] = 11; /* row 0's 3 x 2 x 2 box with 11 mask values */
    bad += nbg_reflection_shoebox_boxes(ctx, e, &r, code, 0, &ob, &nb, NULL) == NBG_EINVAL && ob == NULL &&
           strstr(nbg_errmsg(ctx), "reflection 0's shoebox mask (11 values) does not fill its box") != NULL;
    off[1] = 12;
    bad += nbg_reflection_shoebox_boxes(ctx, e, &r, code, 1001, &ob, &nb, NULL) == NBG_EINVAL && ob == NULL;
    r.shoebox_offset = NULL;
    bad += nbg_reflection_shoebox_boxes(ctx, e, &r, code, 0, &ob, &nb, NULL) == NBG_EINVAL && ob == NULL &&
           strstr(nbg_errmsg(ctx), "no shoeboxes") != NULL;
    nbgi_test_check(bad == 7, "refl-shoebox-bad", "%d of 7 refused naming the row: a panel the detector lacks, a "
                    "marked pixel off its panel, no marked pixel, a shoebox without pixels, a mask short of its box, "
                    "dilation 1001, a table without shoeboxes", bad);
}

static void boxes(nbg_ctx *ctx)
{
    nbg_experiment e;
    nbg_panel pan[2];
    nbgi_test_two_panels(&e, pan);
    /* a 3 x 3 box on panel 0, a 5 x 5 box clipped to 2 x 5 at panel 1's right edge, overlapping boxes counted once */
    const nbg_spot_box b[4] = {{0, 10, 13, 4, 7}, {1, 22, 27, 0, 5}, {0, 11, 14, 5, 8}, {1, 0, 1, 31, 32}};
    uint32_t *l = NULL;
    long n = 0;
    int rc = nbg_spot_box_pixels(ctx, &e, b, 4, &l, &n);
    int sorted = 1;
    for (long t = 1; t < n; ++t) sorted &= l[t] > l[t - 1];
    const long want = (9 + 9 - 4) + 2 * 5 + 1;
    const int edge = n > 0 && l[n - 1] == 40 * 32 + 31 * 24 + 0; /* panel 1's pixel (0, 31): its last row's first */
    nbgi_test_check(rc == NBG_OK && n == want && sorted && edge, "boxes-two-panels",
                    "%ld pixels (%ld expected), sorted %d, the last on panel 1 (%s)", n, want, sorted,
                    rc == NBG_OK ? "ok" : nbg_errmsg(ctx));
    free(l);
    const nbg_spot_box bad[3] = {{2, 0, 3, 0, 3}, {0, 5, 5, 0, 3}, {1, 30, 40, 0, 3}};
    const char *what[3] = {"panel 2", "empty", "outside"};
    for (int k = 0; k < 3; ++k) {
        nbg_spot_box two[2] = {b[0], bad[k]};
        rc = nbg_spot_box_pixels(ctx, &e, two, 2, &l, &n);
        char id[64];
        snprintf(id, sizeof id, "boxes-bad-%d", k);
        nbgi_test_check(rc == NBG_EINVAL && l == NULL && strstr(nbg_errmsg(ctx), "spot box 1") != NULL &&
                            strstr(nbg_errmsg(ctx), what[k]) != NULL,
                        id, "%s", nbg_errmsg(ctx));
    }
    /* nbg_reflection_boxes (refine -spotlist FILE.refl, Python's spot_pixels(reflections=)): a row on each panel
     * and one of experiment 2; their bounding boxes, or boxes of half-width 2 about their centroids' pixels */
    int rp[3] = {0, 1, 1}, rb[18] = {8, 13, 10, 15, 0, 1, 2, 6, 18, 23, 0, 1, 19, 22, 4, 7, 0, 1}, rid[3] = {0, -1, 2};
    double rx[9] = {10.5, 12.25, 0.5, 3.75, 20.5, 0.5, 20.1, 5.9, 0.5};
    nbg_reflections r = {3, rp, rx, rb, rid, 0, 4, NULL, NULL, NULL, NULL, NULL, NULL, NULL};
    nbg_spot_box *ob = NULL;
    long nb = 0, skipped = 0;
    rc = nbg_reflection_boxes(ctx, &e, &r, -1, &ob, &nb, &skipped);
    int same = rc == NBG_OK && nb == 2 && skipped == 1;
    for (long t = 0; same && t < 2; ++t) {
        same = ob[t].panel == rp[t] && ob[t].x0 == rb[6 * t] && ob[t].x1 == rb[6 * t + 1] &&
               ob[t].y0 == rb[6 * t + 2] && ob[t].y1 == rb[6 * t + 3];
    }
    nbgi_test_check(same, "refl-boxes-bbox", "%ld boxes, %ld of another experiment left out: the rows' bounding boxes "
                    "on their panels (%s)", nb, skipped, rc == NBG_OK ? "ok" : nbg_errmsg(ctx));
    free(ob);
    rc = nbg_reflection_boxes(ctx, &e, &r, 2, &ob, &nb, NULL);
    const nbg_spot_box w2[2] = {{0, 8, 13, 10, 15}, {1, 1, 6, 18, 23}};
    same = rc == NBG_OK && nb == 2 && memcmp(ob, w2, sizeof w2) == 0;
    nbgi_test_check(same, "refl-boxes-half", "half-width 2 about (floor x, floor y) of each row (%s)",
                    rc == NBG_OK ? "ok" : nbg_errmsg(ctx));
    free(ob);
    r.bbox = NULL;
    int rbad = nbg_reflection_boxes(ctx, &e, &r, -1, &ob, &nb, NULL) == NBG_EINVAL && ob == NULL &&
              strstr(nbg_errmsg(ctx), "no bbox") != NULL;
    rx[3] = 30; /* off panel 1 (24 pixels wide) */
    rbad += nbg_reflection_boxes(ctx, &e, &r, 2, &ob, &nb, NULL) == NBG_EINVAL && ob == NULL &&
           strstr(nbg_errmsg(ctx), "reflection 1 (panel 1, x 30") != NULL;
    rx[3] = 3.75, rp[1] = 2;
    rbad += nbg_reflection_boxes(ctx, &e, &r, 2, &ob, &nb, NULL) == NBG_EINVAL && ob == NULL &&
           strstr(nbg_errmsg(ctx), "reflection 1 (panel 2") != NULL;
    rp[1] = 1, rid[0] = rid[1] = 1;
    rbad += nbg_reflection_boxes(ctx, &e, &r, 2, &ob, &nb, &skipped) == NBG_OK && ob == NULL && nb == 0 &&
           skipped == 3;
    nbgi_test_check(rbad == 4, "refl-boxes-bad", "%d of 4: bounding boxes asked of a table without them, a "
                    "centroid off its panel and a panel the detector lacks refused naming the row; no row of "
                    "experiment 0: none", rbad);
    shoebox_boxes(ctx, &e);
    /* the single flat detector is panel 0 */
    e.panels = NULL, e.npanels = 0;
    rc = nbg_spot_box_pixels(ctx, &e, b, 1, &l, &n);
    nbgi_test_check(rc == NBG_OK && n == 9 && l[0] == 4 * 68 + 10, "boxes-flat", "%ld pixels on the flat detector", n);
    free(l);
}

#if defined(NBG_HAVE_FORMATS) && !defined(NBG_NO_REFINE)
static char g_out[65536];

/* Runs cmd (a shell command line), its stdout and stderr into g_out; the exit status. */
static int run(const char *cmd)
{
    FILE *p = popen(cmd, "r");
    if (p == NULL) {
        return -1;
    }
    const size_t n = fread(g_out, 1, sizeof g_out - 1, p);
    g_out[n] = '\0';
    const int st = pclose(p);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

static void cli(nbg_ctx *ctx, const char *dir)
{
    const char *bin = getenv("NBG_BIN") != NULL ? getenv("NBG_BIN") : "build/nbgrad";
    nbg_experiment e;
    nbg_panel pan[2], lab[2];
    nbgi_test_two_panels(&e, pan);
    char ex[512], obs[512], rf[512], txt[512], cmd[4096];
    snprintf(ex, sizeof ex, "%s/two.expt", dir);
    snprintf(obs, sizeof obs, "%s/obs.bin", dir);
    snprintf(rf, sizeof rf, "%s/spots.refl", dir);
    snprintf(txt, sizeof txt, "%s/spots.txt", dir);
    nbg_report r;
    nbg_geometry g;
    int rc = nbgi_test_write_panel_list(ctx, &e, ex, NULL, &r, &g, lab);
    /* the truth: the list's experiment with the crystal turned by 0.1 deg about z */
    nbg_geometry g2;
    nbg_panel *back = NULL;
    int np = 0;
    nbg_experiment t;
    nbg_experiment_default(&t);
    rc = rc == NBG_OK ? nbg_read_expt_panels(ctx, ex, &g2, &back, &np) : rc;
    rc = rc == NBG_OK ? nbg_experiment_from_geometry(ctx, &g2, &t) : rc;
    const size_t npix = 40 * 32 + 24 * 32;
    float *img = malloc(sizeof(float) * npix);
    if (rc == NBG_OK) {
        t.panels = back, t.npanels = np, t.panel_frame = NBG_PANELS_LAB;
        t.default_F = 100, t.Na = t.Nb = t.Nc = 5, t.oversample = 1;
        t.orient[2] = 0.1;
        rc = nbg_simulate(ctx, &t, img, npix, NULL);
    }
    if (!nbgi_test_check(rc == NBG_OK && write_bytes(obs, img, sizeof(float) * npix), "cli-setup",
                         "a two-panel list and its image (%s)", rc == NBG_OK ? "ok" : nbg_errmsg(ctx))) {
        free(img);
        free(back);
        return;
    }
    /* the spots: local maxima above a tenth of the peak, on each panel */
    double mx = 0;
    for (size_t i = 0; i < npix; ++i) mx = fmax(mx, img[i]);
    uint64_t panel[64];
    double xyz[3 * 64];
    int32_t bbox[6 * 64], idc[64];
    nbg_spot_box bx[64], cb[64], xb[5 * 64];
    /* each spot's shoebox: its 5 x 3 bbox, the centre and its four neighbours Valid | Foreground, the rest Valid */
    static unsigned char sbk[64 * (29 + 15 * 12)];
    size_t sbn = 0;
    int nx = 0;
    int ns = 0;
    FILE *tf = fopen(txt, "w");
    for (int q = 0; q < 2 && tf != NULL; ++q) {
        const int F = pan[q].fpixels, S = pan[q].spixels;
        const size_t off = q == 0 ? 0 : 40 * 32;
        for (int s = 1; s < S - 1; ++s) {
            for (int f = 1; f < F - 1 && ns < 64; ++f) {
                const float v = img[off + (size_t)s * F + f];
                int peak = v > 0.1 * mx;
                for (int ds = -1; ds <= 1; ++ds)
                    for (int df = -1; df <= 1; ++df)
                        peak = peak && (ds == 0 && df == 0 ? 1 : img[off + (size_t)(s + ds) * F + f + df] < v);
                if (!peak) continue;
                panel[ns] = (uint64_t)q;
                xyz[3 * ns] = f + 0.5, xyz[3 * ns + 1] = s + 0.5, xyz[3 * ns + 2] = 0.5;
                const int32_t b6[6] = {f - 2, f + 3, s - 1, s + 2, 0, 1};
                memcpy(bbox + 6 * ns, b6, sizeof b6);
                idc[ns] = 0;
                bx[ns] = (nbg_spot_box){q, f - 2, f + 3, s - 1, s + 2};
                const uint32_t pq = (uint32_t)q;
                memcpy(sbk + sbn, &pq, 4);
                memcpy(sbk + sbn + 4, b6, 24);
                sbk[sbn + 28] = 1;
                sbn += 29;
                for (int i = 0; i < 15; ++i) {
                    const int x = i % 5 - 2, y = i / 5 - 1, fg = abs(x) + abs(y) <= 1;
                    const float d = img[off + (size_t)(s + y) * F + f + x], bg = 0;
                    const int32_t mk = fg ? NBG_SHOEBOX_VALID | NBG_SHOEBOX_FOREGROUND : NBG_SHOEBOX_VALID;
                    memcpy(sbk + sbn + 4 * i, &d, 4);
                    memcpy(sbk + sbn + 60 + 4 * i, &mk, 4);
                    memcpy(sbk + sbn + 120 + 4 * i, &bg, 4);
                    if (fg) xb[nx++] = (nbg_spot_box){q, f + x, f + x + 1, s + y, s + y + 1};
                }
                sbn += 180;
                cb[ns] = (nbg_spot_box){q, f - 1, f + 2, s - 1, s + 2};
                fprintf(tf, "%d %d %d\n", q, f, s);
                ++ns;
            }
        }
    }
    if (tf != NULL) fclose(tf);
    int on1 = 0;
    for (int k = 0; k < ns; ++k) on1 += panel[k] == 1;
    msgpack_sbuffer sb;
    msgpack_sbuffer_init(&sb);
    msgpack_packer pk;
    msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
    msgpack_pack_array(&pk, 3);
    pack_str(&pk, "dials::af::reflection_table");
    msgpack_pack_uint64(&pk, 1);
    msgpack_pack_map(&pk, 3);
    pack_str(&pk, "identifiers");
    msgpack_pack_map(&pk, 0);
    pack_str(&pk, "nrows");
    msgpack_pack_uint64(&pk, (uint64_t)ns);
    pack_str(&pk, "data");
    msgpack_pack_map(&pk, 5);
    pack_col(&pk, "panel", "std::size_t", (uint64_t)ns, panel, sizeof(uint64_t) * (size_t)ns);
    pack_col(&pk, "shoebox", "Shoebox<>", (uint64_t)ns, sbk, sbn);
    pack_col(&pk, "xyzobs.px.value", "vec3<double>", (uint64_t)ns, xyz, 24 * (size_t)ns);
    pack_col(&pk, "bbox", "int6", (uint64_t)ns, bbox, 24 * (size_t)ns);
    pack_col(&pk, "id", "int", (uint64_t)ns, idc, 4 * (size_t)ns);
    const int wrote = write_bytes(rf, sb.data, sb.size);
    msgpack_sbuffer_destroy(&sb);
    uint32_t *l = NULL;
    long nbb = 0, ncb = 0, nxb = 0;
    nbg_spot_box_pixels(ctx, &t, bx, ns, &l, &nbb);
    free(l);
    nbg_spot_box_pixels(ctx, &t, xb, nx, &l, &nxb);
    free(l);
    nbg_spot_box_pixels(ctx, &t, cb, ns, &l, &ncb);
    free(l);
    nbgi_test_check(wrote && ns >= 4 && on1 >= 2 && on1 < ns, "cli-spots", "%d spots, %d on panel 1; %ld pixels in "
                    "their boxes, %ld in 3 x 3 boxes about them", ns, on1, nbb, ncb);
#define START "%s refine -expt %s -default_F 100 -N 5 -oversample 1 -observed %s -params orient_z "
    char want[128];
    snprintf(cmd, sizeof cmd, START "-spotlist %s 2>&1", bin, ex, obs, rf);
    rc = run(cmd);
    if (getenv("NBG_TEST_VERBOSE") != NULL) fputs(g_out, stdout);
    snprintf(want, sizeof want, "spot regions: %ld pixels", nbb);
    const char *oz = strstr(g_out, "\norient_z");
    double start = NAN, fit = NAN; /* the table's line: name, start, refined, standard error */
    if (oz != NULL && sscanf(oz + 9, "%lf %lf", &start, &fit) != 2) fit = NAN;
    nbgi_test_check(rc == 0 && strstr(g_out, want) != NULL && strstr(g_out, "bounding boxes") != NULL &&
                        strstr(g_out, "converged") != NULL && fabs(fit - 0.1) < 1e-4,
                    "cli-refl-bbox", "refine on the .refl's bounding boxes (%ld pixels): orient_z %.6f (truth 0.1; "
                    "exit %d)", nbb, fit, rc);
    snprintf(cmd, sizeof cmd, START "-spotlist %s -spots 1 2>&1", bin, ex, obs, rf);
    rc = run(cmd);
    snprintf(want, sizeof want, "spot regions: %ld pixels", ncb);
    nbgi_test_check(rc == 0 && strstr(g_out, want) != NULL && strstr(g_out, "about their centroids") != NULL,
                    "cli-refl-centroids", "-spots 1: boxes of 3 x 3 about the centroids (%ld pixels; exit %d)", ncb,
                    rc);
    snprintf(cmd, sizeof cmd, START "-spotlist %s -spot_shoebox 0 2>&1", bin, ex, obs, rf);
    rc = run(cmd);
    snprintf(want, sizeof want, "spot regions: %ld pixels", nxb);
    oz = strstr(g_out, "\norient_z");
    fit = NAN;
    if (oz != NULL && sscanf(oz + 9, "%lf %lf", &start, &fit) != 2) fit = NAN;
    nbgi_test_check(rc == 0 && strstr(g_out, want) != NULL && strstr(g_out, "shoeboxes' ") != NULL &&
                        strstr(g_out, "converged") != NULL && fabs(fit - 0.1) < 1e-4,
                    "cli-refl-shoebox", "-spot_shoebox 0: the shoeboxes' Foreground pixels (%ld, 5 a spot): orient_z "
                    "%.6f (truth 0.1; exit %d)", nxb, fit, rc);
    snprintf(cmd, sizeof cmd, START "-spot_shoebox 0 2>&1", bin, ex, obs);
    rc = run(cmd);
    int sbad = rc != 0 && strstr(g_out, "-spot_shoebox needs -spotlist") != NULL;
    snprintf(cmd, sizeof cmd, START "-spotlist %s -spot_shoebox 0 2>&1", bin, ex, obs, txt);
    rc = run(cmd);
    sbad += rc != 0 && strstr(g_out, "-spot_shoebox needs -spotlist with a DIALS reflection table") != NULL;
    nbgi_test_check(sbad == 2, "cli-shoebox-bad", "%d of 2: -spot_shoebox without -spotlist, and with a text list, "
                    "refused", sbad);
    snprintf(want, sizeof want, "spot regions: %ld pixels", ncb);
    snprintf(cmd, sizeof cmd, START "-spotlist %s -spots 1 2>&1", bin, ex, obs, txt);
    rc = run(cmd);
    nbgi_test_check(rc == 0 && strstr(g_out, want) != NULL, "cli-text-panels",
                    "a \"panel fast slow\" list: the same %ld pixels (exit %d)", ncb, rc);
    /* one reflection on panel 2 */
    FILE *tb = fopen(txt, "w");
    if (tb != NULL) {
        fprintf(tb, "0 3 3\n2 3 3\n");
        fclose(tb);
    }
    rc = run(cmd);
    nbgi_test_check(rc != 0 && strstr(g_out, "line 2") != NULL, "cli-text-bad-panel", "a panel the detector lacks is "
                    "refused naming the line (exit %d)", rc);
    panel[0] = 5;
    msgpack_sbuffer_init(&sb);
    msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
    msgpack_pack_array(&pk, 3);
    pack_str(&pk, "dials::af::reflection_table");
    msgpack_pack_uint64(&pk, 1);
    msgpack_pack_map(&pk, 2);
    pack_str(&pk, "nrows");
    msgpack_pack_uint64(&pk, (uint64_t)ns);
    pack_str(&pk, "data");
    msgpack_pack_map(&pk, 2);
    pack_col(&pk, "panel", "std::size_t", (uint64_t)ns, panel, sizeof(uint64_t) * (size_t)ns);
    pack_col(&pk, "xyzobs.px.value", "vec3<double>", (uint64_t)ns, xyz, 24 * (size_t)ns);
    write_bytes(rf, sb.data, sb.size);
    msgpack_sbuffer_destroy(&sb);
    snprintf(cmd, sizeof cmd, START "-spotlist %s 2>&1", bin, ex, obs, rf);
    rc = run(cmd);
    nbgi_test_check(rc != 0 && strstr(g_out, "reflection 0 (panel 5") != NULL, "cli-refl-bad-panel",
                    "a reflection on a panel the detector lacks is refused (exit %d)", rc);
    /* a damaged table: the reader's message */
    write_bytes(rf, "\x93\xbb", 2);
    rc = run(cmd);
    nbgi_test_check(rc != 0 && strstr(g_out, "not a DIALS reflection table") != NULL, "cli-refl-damaged",
                    "a truncated table is refused (exit %d)", rc);
    free(img);
    free(back);
}
#endif

int main(void)
{
    nbg_ctx *ctx = NULL;
    if (nbg_ctx_create(&ctx, NBG_BACKEND_CPU, NBG_DOUBLE, 0) != NBG_OK) {
        printf("FAIL refl-ctx cannot create a context\n0 passed, 1 failed\n");
        return 1;
    }
    char dir[256];
    if (nbgi_test_mkdtemp("nbg-refl", dir, sizeof dir) == NULL) {
        printf("FAIL refl-tmp no temporary directory\n0 passed, 1 failed\n");
        return 1;
    }
#ifdef NBG_HAVE_FORMATS
    reader(ctx, dir);
#else
    nbg_reflections r;
    nbgi_test_check(nbg_read_refl(ctx, "x.refl", &r) == NBG_EUNSUP, "refl-unsupported", "%s", nbg_errmsg(ctx));
#endif
    boxes(ctx);
#if defined(NBG_HAVE_FORMATS) && !defined(NBG_NO_REFINE)
    cli(ctx, dir);
#endif
    nbgi_test_rmtree(dir);
    nbg_ctx_destroy(ctx);
    return nbgi_test_summary();
}
