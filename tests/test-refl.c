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
 *   refl-boxes-*     nbg_reflection_boxes on two panels: the rows' bounding boxes or boxes about their centroids,
 *                    other experiments' rows left out; a centroid off its panel, a panel the detector lacks named
 *   cli-*            nbgrad refine -expt (two panels) -spotlist: a .refl of the model's spots on both panels (their
 *                    bounding boxes, or -spots N about the centroids) and a "panel fast slow" text list give the
 *                    pixel counts nbg_spot_box_pixels gives; the fit of orient_z on those regions converges to the
 *                    truth; a .refl naming a panel the detector lacks is refused
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
    T_NKINDS
};
static const char *kind_name[T_NKINDS] = {"ok", "no-panel-bbox", "magic", "version", "xyz-type", "xyz-count",
                                          "xyz-bytes", "xyz-nan", "panel-huge", "bbox-reversed", "other-count",
                                          "no-xyz", "nrows-string"};


#define NR 3
static const uint64_t g_panel[NR] = {0, 1, 1};
static const double g_xyz[3 * NR] = {10.5, 12.25, 0.5, 3.75, 20.5, 0.5, 30.125, 5.5, 1.5};
static const int32_t g_bbox[6 * NR] = {8, 13, 10, 15, 0, 1, 2, 6, 18, 23, 0, 1, 28, 33, 3, 8, 1, 2};
static const int32_t g_id[NR] = {0, 0, -1};

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
    /* a shoebox column: per row its panel, bbox and no data (as find_spots writes without pixels) */
    unsigned char sbox[NR * 29];
    for (int r = 0; r < NR; ++r) {
        const uint32_t p = (uint32_t)g_panel[r];
        memcpy(sbox + 29 * r, &p, 4);
        memcpy(sbox + 29 * r + 4, g_bbox + 6 * r, 24);
        sbox[29 * r + 28] = 0;
    }
    pack_col(&pk, "shoebox", "Shoebox<>", NR, sbox, sizeof sbox);
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
                                         "no row count"};
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
    nbg_reflections r = {3, rp, rx, rb, rid, 0, 4, NULL, NULL, NULL};
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
    int rc = nbg_describe(ctx, &e, &r);
    rc = rc == NBG_OK ? nbg_geometry_from_report(ctx, &e, &r, 1, &g) : rc;
    rc = rc == NBG_OK ? nbg_panels_from_report(ctx, &e, &r, lab, 2) : rc;
    rc = rc == NBG_OK ? nbg_write_expt_panels(ctx, ex, &g, lab, 2, NULL) : rc;
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
    nbg_spot_box bx[64], cb[64];
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
    msgpack_pack_map(&pk, 4);
    pack_col(&pk, "panel", "std::size_t", (uint64_t)ns, panel, sizeof(uint64_t) * (size_t)ns);
    pack_col(&pk, "xyzobs.px.value", "vec3<double>", (uint64_t)ns, xyz, 24 * (size_t)ns);
    pack_col(&pk, "bbox", "int6", (uint64_t)ns, bbox, 24 * (size_t)ns);
    pack_col(&pk, "id", "int", (uint64_t)ns, idc, 4 * (size_t)ns);
    const int wrote = write_bytes(rf, sb.data, sb.size);
    msgpack_sbuffer_destroy(&sb);
    uint32_t *l = NULL;
    long nbb = 0, ncb = 0;
    nbg_spot_box_pixels(ctx, &t, bx, ns, &l, &nbb);
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
