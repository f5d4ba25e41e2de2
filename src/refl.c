/*
 * refl.c -- DIALS reflection tables (.refl) read for spot regions (nbg_read_refl): the panel, observed centroid,
 * bounding box and experiment id of every reflection; and as structure factors (nbgi_refl_hkl, behind
 * nbg_hkl_read_column): the Miller indices and intensities of an indexed or integrated table.
 *
 * The file is one msgpack value, as DIALS writes a reflection table:
 *     ["dials::af::reflection_table", 1, {"identifiers": {...}, "nrows": N, "data": {name: [type, column], ...}}]
 * where each column of a fixed-size type is [N, bin] (N elements, the bin their little-endian bytes: "std::size_t"
 * 8 bytes, "int" 4, "double" 8, "vec3<double>" 24, "int6" 6 x 4, ...); "Shoebox<>" is [N, bin] too, its rows of
 * varying size one after the other (shoeboxes() below).  Parsed with libmsgpack-c, after a walk of
 * the bytes that checks every array's and map's count against what actually follows (msgpack-c allocates what a
 * container's header claims before reading its elements: a 5-byte file could ask for gigabytes).  Library code:
 * it never prints; every refusal is NBG_EFORMAT with a message naming the file and what is wrong.
 */
#include "formats.h"

#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

void nbg_reflections_free(nbg_reflections *r)
{
    if (r != NULL) {
        free(r->panel);
        free(r->xyz);
        free(r->bbox);
        free(r->id);
        free(r->hkl);
        free(r->flags);
        free(r->xyzcal);
        free(r->shoebox_panel);
        free(r->shoebox_bbox);
        free(r->shoebox_offset);
        free(r->shoebox_mask);
        memset(r, 0, sizeof *r);
    }
}

#ifdef NBG_HAVE_FORMATS
#include <msgpack.h>

/* msgpack-c's unpacker nests at most this deep (MSGPACK_EMBED_STACK_SIZE); the walk refuses deeper input. */
#define REFL_MAX_DEPTH 32

static uint64_t be(const unsigned char *p, int n)
{
    uint64_t v = 0;
    for (int i = 0; i < n; ++i) {
        v = v << 8 | p[i];
    }
    return v;
}

/* Walks one complete msgpack value from buf[0] (len bytes) without allocating: 1 with *used its bytes, 0 when it is
 * truncated, malformed or nested deeper than REFL_MAX_DEPTH.  Every container's elements must all be present, so
 * that msgpack-c's allocations stay within a few times the input's size. */
static int walk(const unsigned char *buf, size_t len, size_t *used)
{
    uint64_t left[REFL_MAX_DEPTH + 1]; /* the values still owed at each open level */
    int depth = 0;
    size_t at = 0;
    left[0] = 1;
    while (depth >= 0) {
        if (left[depth] == 0) {
            --depth;
            continue;
        }
        --left[depth];
        if (at >= len) {
            return 0;
        }
        const unsigned c = buf[at++];
        uint64_t skip = 0, count = 0;
        int container = 0;
        if (c <= 0x7f || c >= 0xe0 || c == 0xc0 || c == 0xc2 || c == 0xc3) {
            skip = 0;
        } else if (c >= 0xa0 && c <= 0xbf) {
            skip = c & 0x1f;
        } else if (c >= 0x90 && c <= 0x9f) {
            container = 1, count = c & 0x0f;
        } else if (c >= 0x80 && c <= 0x8f) {
            container = 1, count = 2 * (uint64_t)(c & 0x0f);
        } else {
            int lenbytes = 0, fixed = -1, ext = 0;
            switch (c) {
            case 0xc4: case 0xd9: lenbytes = 1; break;                 /* bin 8, str 8 */
            case 0xc5: case 0xda: lenbytes = 2; break;                 /* bin 16, str 16 */
            case 0xc6: case 0xdb: lenbytes = 4; break;                 /* bin 32, str 32 */
            case 0xc7: lenbytes = 1, ext = 1; break;                   /* ext 8 */
            case 0xc8: lenbytes = 2, ext = 1; break;                   /* ext 16 */
            case 0xc9: lenbytes = 4, ext = 1; break;                   /* ext 32 */
            case 0xca: case 0xce: case 0xd2: fixed = 4; break;         /* float 32, uint 32, int 32 */
            case 0xcb: case 0xcf: case 0xd3: fixed = 8; break;         /* float 64, uint 64, int 64 */
            case 0xcc: case 0xd0: fixed = 1; break;
            case 0xcd: case 0xd1: fixed = 2; break;
            case 0xd4: fixed = 2; break;                               /* fixext 1: type + 1 */
            case 0xd5: fixed = 3; break;
            case 0xd6: fixed = 5; break;
            case 0xd7: fixed = 9; break;
            case 0xd8: fixed = 17; break;
            case 0xdc: case 0xde: lenbytes = 2, container = 1; break;  /* array 16, map 16 */
            case 0xdd: case 0xdf: lenbytes = 4, container = 1; break;  /* array 32, map 32 */
            default: return 0;                                         /* 0xc1: never used */
            }
            if (fixed >= 0) {
                skip = (uint64_t)fixed;
            } else {
                if (len - at < (size_t)lenbytes) {
                    return 0;
                }
                const uint64_t v = be(buf + at, lenbytes);
                at += (size_t)lenbytes;
                if (container) {
                    count = c == 0xde || c == 0xdf ? 2 * v : v;
                } else {
                    skip = v + (uint64_t)ext; /* an ext's type byte */
                }
            }
        }
        if (container) {
            if (count > len - at) { /* every element takes a byte at least */
                return 0;
            }
            if (count > 0) {
                if (depth == REFL_MAX_DEPTH) {
                    return 0;
                }
                left[++depth] = count;
            }
        } else {
            if (skip > len - at) {
                return 0;
            }
            at += (size_t)skip;
        }
    }
    *used = at;
    return 1;
}

static int is_str(const msgpack_object *o, const char *s)
{
    return o->type == MSGPACK_OBJECT_STR && o->via.str.size == strlen(s) && memcmp(o->via.str.ptr, s, strlen(s)) == 0;
}

/* The value of key in map m (NULL when absent or m is no map). */
static const msgpack_object *map_get(const msgpack_object *m, const char *key)
{
    if (m->type != MSGPACK_OBJECT_MAP) {
        return NULL;
    }
    for (uint32_t i = 0; i < m->via.map.size; ++i) {
        if (is_str(&m->via.map.ptr[i].key, key)) {
            return &m->via.map.ptr[i].val;
        }
    }
    return NULL;
}

static int as_u64(const msgpack_object *o, uint64_t *v)
{
    if (o->type == MSGPACK_OBJECT_POSITIVE_INTEGER) {
        *v = o->via.u64;
        return 1;
    }
    return 0;
}

static uint64_t le(const unsigned char *p, int n)
{
    uint64_t v = 0;
    for (int i = n - 1; i >= 0; --i) {
        v = v << 8 | p[i];
    }
    return v;
}

static double le_double(const unsigned char *p)
{
    const uint64_t bits = le(p, 8);
    double d;
    memcpy(&d, &bits, sizeof d);
    return d;
}

/* Column name of the data map: its bytes of the given type and element size, checked against the row count.
 * *bytes NULL when the table has no such column (and required is 0). */
static int column(nbg_ctx *ctx, const char *path, const msgpack_object *data, const char *name, const char *type,
                  size_t elsize, uint64_t nrows, int required, const unsigned char **bytes)
{
    *bytes = NULL;
    const msgpack_object *c = map_get(data, name);
    if (c == NULL) {
        return required ? nbgi_error(ctx, NBG_EFORMAT, "reflection table %s has no \"%s\" column (the observed "
                                     "centroids nbgrad reads)", path, name)
                        : NBG_OK;
    }
    if (c->type != MSGPACK_OBJECT_ARRAY || c->via.array.size != 2 || c->via.array.ptr[0].type != MSGPACK_OBJECT_STR) {
        return nbgi_error(ctx, NBG_EFORMAT, "reflection table %s: column \"%s\" is not a [type, values] pair", path,
                          name);
    }
    const msgpack_object *t = &c->via.array.ptr[0];
    if (!is_str(t, type)) {
        return nbgi_error(ctx, NBG_EFORMAT, "reflection table %s: column \"%s\" is of type \"%.*s\", nbgrad reads "
                          "\"%s\"", path, name, (int)(t->via.str.size > 64 ? 64 : t->via.str.size), t->via.str.ptr,
                          type);
    }
    const msgpack_object *v = &c->via.array.ptr[1];
    uint64_t n;
    if (v->type != MSGPACK_OBJECT_ARRAY || v->via.array.size != 2 || !as_u64(&v->via.array.ptr[0], &n) ||
        v->via.array.ptr[1].type != MSGPACK_OBJECT_BIN) {
        return nbgi_error(ctx, NBG_EFORMAT, "reflection table %s: column \"%s\" is not [count, bytes]", path, name);
    }
    const uint64_t size = v->via.array.ptr[1].via.bin.size;
    if (n != nrows || size / elsize != n || size % elsize != 0) {
        return nbgi_error(ctx, NBG_EFORMAT, "reflection table %s: column \"%s\" holds %llu elements in %llu bytes "
                          "(%zu bytes each), the table has %llu rows", path, name, (unsigned long long)n,
                          (unsigned long long)size, elsize, (unsigned long long)nrows);
    }
    *bytes = (const unsigned char *)v->via.array.ptr[1].via.bin.ptr;
    return NBG_OK;
}

/* The "shoebox" column c (a [type, value] pair of the table's data map) into out's shoebox_ fields, for nrows rows.
 * DIALS writes a Shoebox<> column as [nrows, bin]: the bin the rows one after the other, each the panel (4-byte
 * unsigned), the box x0 x1 y0 y1 z0 z1 (4-byte signed), a byte 1 when the pixels follow (0: none), then the box's
 * volume of 4-byte floats (data), 4-byte ints (the mask) and 4-byte floats (background), all little-endian, z
 * slowest and x fastest.  Every length is checked against the bytes left before it is used; the bin must end with
 * the last row. */
static int shoeboxes(nbg_ctx *ctx, const char *path, const msgpack_object *c, uint64_t nrows, nbg_reflections *out)
{
    if (c->type != MSGPACK_OBJECT_ARRAY || c->via.array.size != 2 || !is_str(&c->via.array.ptr[0], "Shoebox<>")) {
        return nbgi_error(ctx, NBG_EFORMAT, "reflection table %s: column \"shoebox\" is not a [\"Shoebox<>\", values] "
                          "pair", path);
    }
    const msgpack_object *v = &c->via.array.ptr[1];
    uint64_t cnt;
    if (v->type != MSGPACK_OBJECT_ARRAY || v->via.array.size != 2 || !as_u64(&v->via.array.ptr[0], &cnt) ||
        v->via.array.ptr[1].type != MSGPACK_OBJECT_BIN) {
        return nbgi_error(ctx, NBG_EFORMAT, "reflection table %s: column \"shoebox\" is not [count, bytes]", path);
    }
    if (cnt != nrows) {
        return nbgi_error(ctx, NBG_EFORMAT, "reflection table %s: column \"shoebox\" has %llu rows, the table %llu",
                          path, (unsigned long long)cnt, (unsigned long long)nrows);
    }
    const unsigned char *b = (const unsigned char *)v->via.array.ptr[1].via.bin.ptr;
    const size_t len = v->via.array.ptr[1].via.bin.size, n = (size_t)nrows;
    /* a row takes 29 bytes at least, so n is bounded by the file's size */
    if (n > len / 29) {
        return nbgi_error(ctx, NBG_EFORMAT, "reflection table %s: column \"shoebox\" holds %zu bytes, too few for %zu "
                          "rows (29 bytes each at least)", path, len, n);
    }
    int rc = nbgi_check_bytes(ctx, (double)n * (4 + 24 + 8) + (double)len / 3, "the reflection table's shoeboxes");
    if (rc != NBG_OK) {
        return rc;
    }
    out->shoebox_panel = malloc(sizeof(int) * (n ? n : 1));
    out->shoebox_bbox = malloc(sizeof(int) * 6 * (n ? n : 1));
    out->shoebox_offset = malloc(sizeof(long) * (n + 1));
    if (out->shoebox_panel == NULL || out->shoebox_bbox == NULL || out->shoebox_offset == NULL) {
        return nbgi_error(ctx, NBG_ENOMEM, "out of memory for the %zu shoeboxes of %s", n, path);
    }
    /* first pass: the rows' boxes and where each one's mask is; the masks are counted, then copied */
    size_t at = 0, total = 0;
    static const char *const field[6] = {"x0", "x1", "y0", "y1", "z0", "z1"};
    for (size_t r = 0; r < n; ++r) {
        if (len - at < 29) {
            return nbgi_error(ctx, NBG_EFORMAT, "reflection table %s: shoebox of row %zu: its panel, box and flag "
                              "(29 bytes) run past the column's %zu bytes", path, r, len);
        }
        const uint64_t p = le(b + at, 4);
        if (p > INT_MAX) {
            return nbgi_error(ctx, NBG_EFORMAT, "reflection table %s: shoebox of row %zu: panel %llu", path, r,
                              (unsigned long long)p);
        }
        out->shoebox_panel[r] = (int)p;
        int *bb = out->shoebox_bbox + 6 * r;
        for (int j = 0; j < 6; ++j) {
            bb[j] = (int32_t)(uint32_t)le(b + at + 4 + 4 * j, 4);
        }
        for (int j = 0; j < 6; j += 2) {
            if (bb[j + 1] < bb[j]) {
                return nbgi_error(ctx, NBG_EFORMAT, "reflection table %s: shoebox of row %zu: its box's %s (%d) is "
                                  "below %s (%d)", path, r, field[j + 1], bb[j + 1], field[j], bb[j]);
            }
        }
        const unsigned flag = b[at + 28];
        at += 29;
        out->shoebox_offset[r] = (long)total;
        if (flag > 1) {
            return nbgi_error(ctx, NBG_EFORMAT, "reflection table %s: shoebox of row %zu: its data flag is %u (0 or 1)",
                              path, r, flag);
        }
        if (flag == 1) {
            /* each side below 2^32, so the volume is below 2^96: checked a factor at a time against the bytes */
            const uint64_t dx = (uint64_t)((int64_t)bb[1] - bb[0]), dy = (uint64_t)((int64_t)bb[3] - bb[2]),
                           dz = (uint64_t)((int64_t)bb[5] - bb[4]);
            const uint64_t room = (uint64_t)(len - at) / 12; /* pixels the bytes left can hold */
            if ((dx != 0 && dy > room / dx) || (dx * dy != 0 && dz > room / (dx * dy))) {
                return nbgi_error(ctx, NBG_EFORMAT, "reflection table %s: shoebox of row %zu: its box (%d %d %d %d %d "
                                  "%d) needs more pixels than the %zu bytes left hold (12 bytes each: data, mask, "
                                  "background)", path, r, bb[0], bb[1], bb[2], bb[3], bb[4], bb[5], len - at);
            }
            const size_t vol = (size_t)(dx * dy * dz);
            at += 12 * vol;
            total += vol;
        }
    }
    out->shoebox_offset[n] = (long)total;
    if (at != len) {
        return nbgi_error(ctx, NBG_EFORMAT, "reflection table %s: column \"shoebox\": %zu bytes follow its %zu rows",
                          path, len - at, n);
    }
    if (total > (size_t)LONG_MAX / 8) {
        return nbgi_error(ctx, NBG_EFORMAT, "reflection table %s: %zu shoebox pixels", path, total);
    }
    if (total > 0) {
        out->shoebox_mask = malloc(sizeof(int) * total);
        if (out->shoebox_mask == NULL) {
            return nbgi_error(ctx, NBG_ENOMEM, "out of memory for the %zu shoebox pixels of %s", total, path);
        }
    }
    at = 0;
    for (size_t r = 0; r < n; ++r) {
        at += 29;
        const size_t vol = (size_t)(out->shoebox_offset[r + 1] - out->shoebox_offset[r]);
        const unsigned char *m = b + at + 4 * vol; /* after the data */
        for (size_t i = 0; i < vol; ++i) {
            out->shoebox_mask[(size_t)out->shoebox_offset[r] + i] = (int32_t)(uint32_t)le(m + 4 * i, 4);
        }
        at += 12 * vol;
    }
    return NBG_OK;
}

/* The table in the unpacked value o into *out (zeroed by the caller). */
static int table(nbg_ctx *ctx, const char *path, const msgpack_object *o, nbg_reflections *out)
{
    uint64_t version;
    if (o->type != MSGPACK_OBJECT_ARRAY || o->via.array.size != 3 ||
        !is_str(&o->via.array.ptr[0], "dials::af::reflection_table")) {
        return nbgi_error(ctx, NBG_EFORMAT, "%s is not a DIALS reflection table (msgpack [\"dials::af::reflection_"
                          "table\", version, table])", path);
    }
    if (!as_u64(&o->via.array.ptr[1], &version) || version != 1) {
        return nbgi_error(ctx, NBG_EFORMAT, "reflection table %s: version is not 1 (the one nbgrad reads)", path);
    }
    const msgpack_object *t = &o->via.array.ptr[2];
    const msgpack_object *nr = map_get(t, "nrows"), *data = map_get(t, "data");
    uint64_t nrows;
    if (nr == NULL || data == NULL || !as_u64(nr, &nrows) || data->type != MSGPACK_OBJECT_MAP) {
        return nbgi_error(ctx, NBG_EFORMAT, "reflection table %s: no row count (\"nrows\", a non-negative integer) "
                          "or no columns (\"data\", a map)", path);
    }
    if (nrows > (uint64_t)LONG_MAX / 64) {
        return nbgi_error(ctx, NBG_EFORMAT, "reflection table %s: %llu rows", path, (unsigned long long)nrows);
    }
    /* every column of the common form [type, [count, ...]] has the row count */
    for (uint32_t i = 0; i < data->via.map.size; ++i) {
        const msgpack_object *k = &data->via.map.ptr[i].key, *c = &data->via.map.ptr[i].val;
        uint64_t n;
        if (k->type != MSGPACK_OBJECT_STR) {
            return nbgi_error(ctx, NBG_EFORMAT, "reflection table %s: column %u's name is not a string", path, i);
        }
        if (c->type == MSGPACK_OBJECT_ARRAY && c->via.array.size == 2 &&
            c->via.array.ptr[1].type == MSGPACK_OBJECT_ARRAY && c->via.array.ptr[1].via.array.size == 2 &&
            as_u64(&c->via.array.ptr[1].via.array.ptr[0], &n) && n != nrows) {
            return nbgi_error(ctx, NBG_EFORMAT, "reflection table %s: column \"%.*s\" has %llu rows, the table %llu",
                              path, (int)(k->via.str.size > 64 ? 64 : k->via.str.size), k->via.str.ptr,
                              (unsigned long long)n, (unsigned long long)nrows);
        }
        if (is_str(k, "shoebox")) {
            out->has_shoebox = 1;
        }
    }
    out->ncolumns = (int)data->via.map.size;
    const unsigned char *xyz, *panel, *bbox, *id, *mi, *fl, *cal;
    int rc;
    if ((rc = column(ctx, path, data, "xyzobs.px.value", "vec3<double>", 24, nrows, 1, &xyz)) != NBG_OK ||
        (rc = column(ctx, path, data, "panel", "std::size_t", 8, nrows, 0, &panel)) != NBG_OK ||
        (rc = column(ctx, path, data, "bbox", "int6", 24, nrows, 0, &bbox)) != NBG_OK ||
        (rc = column(ctx, path, data, "id", "int", 4, nrows, 0, &id)) != NBG_OK ||
        (rc = column(ctx, path, data, "miller_index", "cctbx::miller::index<>", 12, nrows, 0, &mi)) != NBG_OK ||
        (rc = column(ctx, path, data, "flags", "std::size_t", 8, nrows, 0, &fl)) != NBG_OK ||
        (rc = column(ctx, path, data, "xyzcal.px", "vec3<double>", 24, nrows, 0, &cal)) != NBG_OK) {
        return rc;
    }
    const size_t n = (size_t)nrows;
    if ((rc = nbgi_check_bytes(ctx, (double)n * (4 + 24 + 24 + 4 + 12 + 8 + 24), "the reflection table's columns")) !=
        NBG_OK) {
        return rc;
    }
    out->hkl = mi != NULL ? malloc(sizeof(int) * 3 * (n ? n : 1)) : NULL;
    out->flags = fl != NULL ? malloc(sizeof(uint64_t) * (n ? n : 1)) : NULL;
    out->xyzcal = cal != NULL ? malloc(sizeof(double) * 3 * (n ? n : 1)) : NULL;
    if ((mi != NULL && out->hkl == NULL) || (fl != NULL && out->flags == NULL) || (cal != NULL && out->xyzcal == NULL)) {
        return nbgi_error(ctx, NBG_ENOMEM, "out of memory for the %zu reflections of %s", n, path);
    }
    for (size_t r = 0; r < n; ++r) {
        for (int j = 0; j < 3 && mi != NULL; ++j) {
            out->hkl[3 * r + j] = (int32_t)(uint32_t)le(mi + 12 * r + 4 * j, 4);
        }
        if (fl != NULL) {
            out->flags[r] = le(fl + 8 * r, 8);
        }
        for (int j = 0; j < 3 && cal != NULL; ++j) {
            out->xyzcal[3 * r + j] = le_double(cal + 24 * r + 8 * j); /* NaN or any value: only reported */
        }
    }
    out->n = (long)n;
    out->panel = malloc(sizeof(int) * (n ? n : 1));
    out->xyz = malloc(sizeof(double) * 3 * (n ? n : 1));
    out->bbox = bbox != NULL ? malloc(sizeof(int) * 6 * (n ? n : 1)) : NULL;
    out->id = id != NULL ? malloc(sizeof(int) * (n ? n : 1)) : NULL;
    if (out->panel == NULL || out->xyz == NULL || (bbox != NULL && out->bbox == NULL) ||
        (id != NULL && out->id == NULL)) {
        return nbgi_error(ctx, NBG_ENOMEM, "out of memory for the %zu reflections of %s", n, path);
    }
    for (size_t r = 0; r < n; ++r) {
        for (int j = 0; j < 3; ++j) {
            const double v = le_double(xyz + 24 * r + 8 * j);
            if (!isfinite(v)) {
                return nbgi_error(ctx, NBG_EFORMAT, "reflection table %s: row %zu's observed centroid (xyzobs.px."
                                  "value) is not finite", path, r);
            }
            out->xyz[3 * r + j] = v;
        }
        const uint64_t p = panel != NULL ? le(panel + 8 * r, 8) : 0;
        if (p > INT_MAX) {
            return nbgi_error(ctx, NBG_EFORMAT, "reflection table %s: row %zu's panel is %llu", path, r,
                              (unsigned long long)p);
        }
        out->panel[r] = (int)p;
        if (bbox != NULL) {
            for (int j = 0; j < 6; ++j) {
                out->bbox[6 * r + j] = (int32_t)(uint32_t)le(bbox + 24 * r + 4 * j, 4);
            }
            const int *b = out->bbox + 6 * r;
            if (b[1] < b[0] || b[3] < b[2] || b[5] < b[4]) {
                return nbgi_error(ctx, NBG_EFORMAT, "reflection table %s: row %zu's bounding box (%d %d %d %d %d %d) "
                                  "ends before it starts", path, r, b[0], b[1], b[2], b[3], b[4], b[5]);
            }
        }
        if (id != NULL) {
            out->id[r] = (int32_t)(uint32_t)le(id + 4 * r, 4);
        }
    }
    const msgpack_object *sb = map_get(data, "shoebox");
    return sb != NULL ? shoeboxes(ctx, path, sb, nrows, out) : NBG_OK;
}

/* DIALS's reflection flags (dials/array_family/flex_ext: integrated_sum, integrated_prf) */
#define REFL_INTEGRATED_SUM (1u << 8)
#define REFL_INTEGRATED_PRF (1u << 9)

/* The structure-factor entries of the table in o (nbgi_refl_hkl): miller_index with the profile-fitted intensity
 * where the row has one (the table has intensity.prf.value and, when it has flags, the row's integrated_prf flag),
 * else the summed one; F = sqrt(max(I, 0)).  Unindexed rows (0 0 0, or a negative experiment id) and rows without a
 * finite intensity are left out.  *ent malloc'd. */
static int table_hkl(nbg_ctx *ctx, const char *path, const msgpack_object *o, nbgi_hkl_entry **ent, size_t *nent,
                     long *nrow, long *nprf, long *nsum, long *nskip)
{
    *ent = NULL;
    *nent = 0;
    if (o->type != MSGPACK_OBJECT_ARRAY || o->via.array.size != 3 ||
        !is_str(&o->via.array.ptr[0], "dials::af::reflection_table")) {
        return nbgi_error(ctx, NBG_EFORMAT, "%s is not a DIALS reflection table (msgpack [\"dials::af::reflection_"
                          "table\", version, table])", path);
    }
    uint64_t version, nrows;
    if (!as_u64(&o->via.array.ptr[1], &version) || version != 1) {
        return nbgi_error(ctx, NBG_EFORMAT, "reflection table %s: version is not 1 (the one nbgrad reads)", path);
    }
    const msgpack_object *t = &o->via.array.ptr[2];
    const msgpack_object *nr = map_get(t, "nrows"), *data = map_get(t, "data");
    if (nr == NULL || data == NULL || !as_u64(nr, &nrows) || data->type != MSGPACK_OBJECT_MAP) {
        return nbgi_error(ctx, NBG_EFORMAT, "reflection table %s: no row count (\"nrows\", a non-negative integer) "
                          "or no columns (\"data\", a map)", path);
    }
    if (nrows > (uint64_t)LONG_MAX / 64) {
        return nbgi_error(ctx, NBG_EFORMAT, "reflection table %s: %llu rows", path, (unsigned long long)nrows);
    }
    if (map_get(data, "miller_index") == NULL) {
        return nbgi_error(ctx, NBG_EFORMAT, "reflection table %s has no miller_index column: it is not indexed (a "
                          "table from dials.index or dials.integrate holds the Miller indices nbgrad needs for "
                          "structure factors)", path);
    }
    const unsigned char *mi, *prf, *sum, *flags, *id;
    int rc;
    if ((rc = column(ctx, path, data, "miller_index", "cctbx::miller::index<>", 12, nrows, 1, &mi)) != NBG_OK ||
        (rc = column(ctx, path, data, "intensity.prf.value", "double", 8, nrows, 0, &prf)) != NBG_OK ||
        (rc = column(ctx, path, data, "intensity.sum.value", "double", 8, nrows, 0, &sum)) != NBG_OK ||
        (rc = column(ctx, path, data, "flags", "std::size_t", 8, nrows, 0, &flags)) != NBG_OK ||
        (rc = column(ctx, path, data, "id", "int", 4, nrows, 0, &id)) != NBG_OK) {
        return rc;
    }
    if (prf == NULL && sum == NULL) {
        return nbgi_error(ctx, NBG_EFORMAT, "reflection table %s has Miller indices but no intensities (neither "
                          "intensity.prf.value nor intensity.sum.value)", path);
    }
    const size_t n = (size_t)nrows;
    if ((rc = nbgi_check_bytes(ctx, (double)n * sizeof(nbgi_hkl_entry), "the reflection table's intensities")) !=
        NBG_OK) {
        return rc;
    }
    nbgi_hkl_entry *e = malloc(sizeof *e * (n ? n : 1));
    if (e == NULL) {
        return nbgi_error(ctx, NBG_ENOMEM, "out of memory for the %zu reflections of %s", n, path);
    }
    size_t k = 0;
    int id0 = -1;
    *nrow = (long)n;
    *nprf = *nsum = *nskip = 0;
    for (size_t r = 0; r < n; ++r) {
        const int32_t h = (int32_t)(uint32_t)le(mi + 12 * r, 4), kk = (int32_t)(uint32_t)le(mi + 12 * r + 4, 4),
                      l = (int32_t)(uint32_t)le(mi + 12 * r + 8, 4);
        const int rid = id != NULL ? (int32_t)(uint32_t)le(id + 4 * r, 4) : 0;
        if ((h == 0 && kk == 0 && l == 0) || rid < 0) {
            ++*nskip;
            continue;
        }
        if (id0 < 0) {
            id0 = rid;
        } else if (rid != id0) {
            free(e);
            return nbgi_error(ctx, NBG_EFORMAT, "reflection table %s holds the reflections of more than one "
                              "experiment (ids %d and %d, row %zu): one crystal's indices are needed (dials."
                              "split_experiments splits it)", path, id0, rid, r);
        }
        if (h < -1000000 || h > 1000000 || kk < -1000000 || kk > 1000000 || l < -1000000 || l > 1000000) {
            free(e);
            return nbgi_error(ctx, NBG_EFORMAT, "reflection table %s: row %zu's Miller index (%d %d %d) is beyond "
                              "+-1000000", path, r, (int)h, (int)kk, (int)l);
        }
        const uint64_t f = flags != NULL ? le(flags + 8 * r, 8) : REFL_INTEGRATED_PRF;
        double I = NAN;
        if (prf != NULL && (f & REFL_INTEGRATED_PRF) != 0 && isfinite(le_double(prf + 8 * r))) {
            I = le_double(prf + 8 * r);
            ++*nprf;
        } else if (sum != NULL && isfinite(le_double(sum + 8 * r))) {
            I = le_double(sum + 8 * r);
            ++*nsum;
        } else {
            ++*nskip;
            continue;
        }
        e[k].h = h;
        e[k].k = kk;
        e[k].l = l;
        e[k].F = sqrt(I > 0 ? I : 0.0);
        ++k;
    }
    *ent = e;
    *nent = k;
    return NBG_OK;
}

/* The table's bytes (buf, len; path names them) unpacked into *u (msgpack_unpacked_init'd by the caller, who
 * destroys it): one complete msgpack value of bounded depth and nothing after it, its tree within the memory limit. */
static int unpack_table(nbg_ctx *ctx, const char *path, const unsigned char *buf, size_t len, msgpack_unpacked *u)
{
    size_t used = 0;
    if (!walk(buf, len, &used)) {
        return nbgi_error(ctx, NBG_EFORMAT, "%s is not a DIALS reflection table: not one complete msgpack value "
                          "(truncated, malformed or nested deeper than %d)", path, REFL_MAX_DEPTH);
    }
    if (used != len) {
        return nbgi_error(ctx, NBG_EFORMAT, "%s is not a DIALS reflection table: %zu bytes follow its msgpack value",
                          path, len - used);
    }
    const int rc = nbgi_check_bytes(ctx, 32.0 * (double)len + 65536, "the reflection table's msgpack tree");
    if (rc != NBG_OK) {
        return rc;
    }
    size_t off = 0;
    const msgpack_unpack_return ur = msgpack_unpack_next(u, (const char *)buf, len, &off);
    if (ur == MSGPACK_UNPACK_NOMEM_ERROR) {
        return nbgi_error(ctx, NBG_ENOMEM, "out of memory unpacking the reflection table %s", path);
    }
    if (ur != MSGPACK_UNPACK_SUCCESS) {
        return nbgi_error(ctx, NBG_EFORMAT, "%s is not a DIALS reflection table: msgpack-c cannot unpack it (%d)", path,
                          (int)ur);
    }
    return NBG_OK;
}

int nbgi_refl_hkl(nbg_ctx *ctx, const char *path, double default_F, nbg_hkl *out, char *what, size_t nwhat)
{
    memset(out, 0, sizeof *out);
    unsigned char *buf;
    size_t len;
    int rc = nbgi_read_whole(ctx, path, "reflection table", &buf, &len);
    if (rc != NBG_OK) {
        return rc;
    }
    msgpack_unpacked u;
    msgpack_unpacked_init(&u);
    nbgi_hkl_entry *ent = NULL;
    size_t nent = 0;
    long nrow = 0, nprf = 0, nsum = 0, nskip = 0;
    rc = unpack_table(ctx, path, buf, len, &u);
    if (rc == NBG_OK) {
        rc = table_hkl(ctx, path, &u.data, &ent, &nent, &nrow, &nprf, &nsum, &nskip);
    }
    msgpack_unpacked_destroy(&u);
    free(buf);
    if (rc == NBG_OK && nent == 0) {
        rc = nbgi_error(ctx, NBG_EFORMAT, "reflection table %s: none of its %ld rows is an indexed reflection with an "
                        "intensity", path, nrow);
    }
    if (rc == NBG_OK) {
        rc = nbgi_hkl_from_entries(ctx, path, ent, nent, default_F, 1, out);
    }
    free(ent);
    if (rc == NBG_OK && what != NULL && nwhat > 0) {
        snprintf(what, nwhat, "%ld rows: %ld intensity.prf.value, %ld intensity.sum.value, %ld left out (unindexed or "
                 "without an intensity); F = sqrt(max(I, 0)), %ld distinct indices (repeats averaged), no symmetry "
                 "applied", nrow, nprf, nsum, nskip, out->nrefl);
    }
    return rc;
}

int nbgi_refl_parse(nbg_ctx *ctx, const char *path, const unsigned char *buf, size_t len, nbg_reflections *out)
{
    memset(out, 0, sizeof *out);
    msgpack_unpacked u;
    msgpack_unpacked_init(&u);
    int rc = unpack_table(ctx, path, buf, len, &u);
    if (rc == NBG_OK) {
        rc = table(ctx, path, &u.data, out);
    }
    msgpack_unpacked_destroy(&u);
    if (rc != NBG_OK) {
        nbg_reflections_free(out);
    }
    return rc;
}

int nbg_read_refl(nbg_ctx *ctx, const char *path, nbg_reflections *out)
{
    if (out == NULL) {
        return nbgi_error(ctx, NBG_EINVAL, "nbg_read_refl: NULL argument");
    }
    memset(out, 0, sizeof *out);
    if (path == NULL) {
        return nbgi_error(ctx, NBG_EINVAL, "nbg_read_refl: NULL argument");
    }
    FILE *fp;
    int rc = nbgi_open_input(ctx, path, "reflection table", "rb", &fp);
    if (rc != NBG_OK) {
        return rc;
    }
    size_t cap = 1 << 16, len = 0;
    unsigned char *buf = malloc(cap);
    while (buf != NULL) {
        if (len == cap) {
            unsigned char *nb = realloc(buf, 2 * cap);
            if (nb == NULL) {
                break;
            }
            buf = nb, cap *= 2;
        }
        const size_t got = fread(buf + len, 1, cap - len, fp);
        len += got;
        if (got == 0) {
            break;
        }
    }
    const int err = ferror(fp);
    fclose(fp);
    if (buf == NULL || (len == cap && !err)) {
        free(buf);
        return nbgi_error(ctx, NBG_ENOMEM, "out of memory reading the reflection table %s", path);
    }
    if (err) {
        free(buf);
        return nbgi_error(ctx, NBG_EIO, "cannot read the reflection table %s", path);
    }
    rc = nbgi_refl_parse(ctx, path, buf, len, out);
    free(buf);
    return rc;
}

#else /* !NBG_HAVE_FORMATS */

int nbgi_refl_hkl(nbg_ctx *ctx, const char *path, double default_F, nbg_hkl *out, char *what, size_t nwhat)
{
    (void)default_F, (void)what, (void)nwhat;
    memset(out, 0, sizeof *out);
    return nbgi_error(ctx, NBG_EUNSUP, "reading %s: DIALS reflection tables need libmsgpack-c, and nbgrad was built "
                      "without the file formats (FORMATS=0)", path);
}

int nbgi_refl_parse(nbg_ctx *ctx, const char *path, const unsigned char *buf, size_t len, nbg_reflections *out)
{
    (void)buf;
    (void)len;
    memset(out, 0, sizeof *out);
    return nbgi_error(ctx, NBG_EUNSUP, "reading %s: DIALS reflection tables need libmsgpack-c, and nbgrad was built "
                      "without the file formats (FORMATS=0)", path);
}

int nbg_read_refl(nbg_ctx *ctx, const char *path, nbg_reflections *out)
{
    if (out == NULL || path == NULL) {
        return nbgi_error(ctx, NBG_EINVAL, "nbg_read_refl: NULL argument");
    }
    return nbgi_refl_parse(ctx, path, NULL, 0, out);
}

#endif
