/*
 * test-hkl-mtz.c -- structure factors from data (nbg_hkl_read_column): CCP4 MTZ files and DIALS reflection tables.
 *
 *   mtz-default-*    tests/data/p43212.mtz (written by gemmi, tests/data/mtz-gen.cc: P 43 21 2, five rows) with no
 *                    column named: FP (the first type F) is used and said; every entry of the table against the
 *                    equivalents worked out by hand from the Laue group 4/mmm (the sign changes of h, k, l and the
 *                    swap of h and k: 16 for 1 2 3, 8 for 3 0 1, 2 for 0 0 4), the repeated row 1 2 3 averaged
 *                    (10 and 12: 11), the missing FP of 2 2 5 left at default_F, and nothing else set
 *   mtz-imean-*      -hkl_column IMEAN (type J): F = sqrt(max(I, 0)) (400: 20, -4: 0, 16: 4)
 *   mtz-anom-*       F(+) (type G) with its partner F(-): F(+) on the point group's images of h k l, F(-) on those
 *                    of -h -k -l
 *   mtz-label-*      an unknown label refused naming the file's columns, a standard deviation (type Q) refused
 *   mtz-trunc        every truncation of the fixture refused with a message (and nothing allocated)
 *   mtz-corrupt-*    a wrong magic, a header offset past the end, NCOL's reflections times 1000, a non-text byte
 *                    in the header, a batch count the file cannot hold: each refused, naming the file
 *   mtz-sniff        the fixture renamed to .hkl is still read as MTZ (by its first bytes)
 *   refl-hkl-*       a DIALS reflection table written here with libmsgpack-c: the profile-fitted intensity where the
 *                    row's integrated_prf flag is set, the summed one elsewhere, repeats of one index averaged, the
 *                    unindexed rows (0 0 0) left out; a table without miller_index refused with a clear message
 */
#include "testutil.h"
#include "nbgrad.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define FIXTURE "tests/data/p43212.mtz"
#define DEFAULT_F 0.5

#ifdef NBG_HAVE_FORMATS
#include <msgpack.h>

#include "msgpackutil.h"

static double at(const nbg_hkl *t, int h, int k, int l)
{
    if (h < t->h_min || h > t->h_max || k < t->k_min || k > t->k_max || l < t->l_min || l > t->l_max)
        return DEFAULT_F;
    const int nk = t->k_max - t->k_min + 1, nl = t->l_max - t->l_min + 1;
    return t->F[((size_t)(h - t->h_min) * nk + (size_t)(k - t->k_min)) * nl + (size_t)(l - t->l_min)];
}

/* The 16 images of (h, k, l) under 4/mmm, worked out by hand: every sign of h, k, l, with and without h <-> k. */
static int laue_images(int h, int k, int l, int out[16][3])
{
    int n = 0;
    for (int swap = 0; swap < 2; ++swap)
        for (int s = 0; s < 8; ++s) {
            const int a = (s & 1 ? -1 : 1) * (swap ? k : h), b = (s & 2 ? -1 : 1) * (swap ? h : k),
                      c = (s & 4 ? -1 : 1) * l;
            int dup = 0;
            for (int j = 0; j < n; ++j)
                dup |= out[j][0] == a && out[j][1] == b && out[j][2] == c;
            if (!dup) {
                out[n][0] = a, out[n][1] = b, out[n][2] = c;
                ++n;
            }
        }
    return n;
}

/* The 8 images of (h, k, l) under the point group 422, by hand: (h,k,l) (-h,-k,l) (-k,h,l) (k,-h,l) (-h,k,-l)
 * (h,-k,-l) (k,h,-l) (-k,-h,-l). */
static void pg_images(int h, int k, int l, int out[8][3])
{
    const int m[8][3] = {{h, k, l}, {-h, -k, l}, {-k, h, l}, {k, -h, l},
                         {-h, k, -l}, {h, -k, -l}, {k, h, -l}, {-k, -h, -l}};
    memcpy(out, m, sizeof m);
}

/* Counts the table's entries that differ from default_F. */
static long set_entries(const nbg_hkl *t)
{
    const size_t n = (size_t)(t->h_max - t->h_min + 1) * (t->k_max - t->k_min + 1) * (t->l_max - t->l_min + 1);
    long c = 0;
    for (size_t i = 0; i < n; ++i)
        c += t->F[i] != DEFAULT_F;
    return c;
}

static void default_column(nbg_ctx *ctx)
{
    nbg_hkl t;
    char what[640];
    const int rc = nbg_hkl_read_column(ctx, FIXTURE, NULL, DEFAULT_F, &t, what, sizeof what);
    if (!nbgi_test_check(rc == NBG_OK, "mtz-default-read", "%s", rc == NBG_OK ? what : nbg_errmsg(ctx)))
        return;
    nbgi_test_check(strstr(what, "column FP (type F") != NULL && strstr(what, "P 43 21 2") != NULL,
                    "mtz-default-said", "the column and the space group are said: %s", what);
    const struct {
        int h, k, l;
        double F;
    } asu[] = {{1, 2, 3, 11.0}, {3, 0, 1, 5.5}, {0, 0, 4, 7.0}};
    long expected = 0, bad = 0;
    for (size_t r = 0; r < sizeof asu / sizeof asu[0]; ++r) {
        int img[16][3];
        const int n = laue_images(asu[r].h, asu[r].k, asu[r].l, img);
        expected += n;
        for (int j = 0; j < n; ++j) {
            const double F = at(&t, img[j][0], img[j][1], img[j][2]);
            if (F != asu[r].F) {
                if (bad++ < 5)
                    printf("  %d %d %d: %g, expected %g\n", img[j][0], img[j][1], img[j][2], F, asu[r].F);
            }
        }
    }
    nbgi_test_check(bad == 0, "mtz-default-equivalents", "every equivalent of 1 2 3 (16, the mean 11 of the repeated "
                    "row), 3 0 1 (8) and 0 0 4 (2) holds its F (%ld wrong)", bad);
    nbgi_test_check(set_entries(&t) == expected, "mtz-default-nothing-else", "%ld entries set, %ld expected (2 2 5's "
                    "FP is missing: default_F there, %g)", set_entries(&t), expected, at(&t, 2, 2, 5));
    nbgi_test_check(at(&t, 1, 3, 2) == DEFAULT_F && at(&t, 2, 2, 5) == DEFAULT_F && at(&t, -2, 2, -5) == DEFAULT_F,
                    "mtz-default-not-equivalent", "1 3 2 (not equivalent to 1 2 3) and 2 2 5 (missing) hold default_F");
    nbgi_test_check(t.nrefl == expected, "mtz-default-nrefl", "nrefl %ld (distinct entries, %ld)", t.nrefl, expected);
    nbg_hkl_free(&t);
}

static void imean(nbg_ctx *ctx)
{
    nbg_hkl t;
    char what[640];
    const int rc = nbg_hkl_read_column(ctx, FIXTURE, "IMEAN", DEFAULT_F, &t, what, sizeof what);
    if (!nbgi_test_check(rc == NBG_OK, "mtz-imean-read", "%s", rc == NBG_OK ? what : nbg_errmsg(ctx)))
        return;
    nbgi_test_check(strstr(what, "column IMEAN (type J") != NULL && strstr(what, "sqrt") != NULL, "mtz-imean-said",
                    "%s", what);
    nbgi_test_check(at(&t, 1, 2, 3) == 20.0 && at(&t, -2, 1, -3) == 20.0, "mtz-imean-sqrt", "I 400: F %g, %g (20)",
                    at(&t, 1, 2, 3), at(&t, -2, 1, -3));
    nbgi_test_check(at(&t, 3, 0, 1) == 0.0 && at(&t, 0, -3, -1) == 0.0, "mtz-imean-negative",
                    "I -4: F %g, %g (0)", at(&t, 3, 0, 1), at(&t, 0, -3, -1));
    nbgi_test_check(at(&t, 2, 2, 5) == 4.0 && at(&t, -2, 2, -5) == 4.0 && at(&t, 0, 0, -4) == 7.0,
                    "mtz-imean-others", "2 2 5: %g (4), 0 0 -4: %g (7)", at(&t, 2, 2, 5), at(&t, 0, 0, -4));
    nbg_hkl_free(&t);
}

static void anomalous(nbg_ctx *ctx)
{
    nbg_hkl t;
    char what[640];
    const int rc = nbg_hkl_read_column(ctx, FIXTURE, "F(+)", DEFAULT_F, &t, what, sizeof what);
    if (!nbgi_test_check(rc == NBG_OK, "mtz-anom-read", "%s", rc == NBG_OK ? what : nbg_errmsg(ctx)))
        return;
    int img[8][3];
    pg_images(1, 2, 3, img);
    long bad = 0;
    for (int j = 0; j < 8; ++j) {
        bad += at(&t, img[j][0], img[j][1], img[j][2]) != 11.0;
        bad += at(&t, -img[j][0], -img[j][1], -img[j][2]) != 9.0;
    }
    nbgi_test_check(bad == 0 && strstr(what, "partner F(-)") != NULL, "mtz-anom-halves",
                    "F(+) 11 on the 8 images of 1 2 3, F(-) 9 on those of -1 -2 -3 (%ld wrong): %s", bad, what);
    nbgi_test_check(at(&t, 2, 1, 3) == 9.0 && at(&t, 2, 1, -3) == 11.0, "mtz-anom-bijvoet",
                    "2 1 3 (a Bijvoet mate of 1 2 3): %g (9), 2 1 -3: %g (11)", at(&t, 2, 1, 3), at(&t, 2, 1, -3));
    nbg_hkl_free(&t);
}

static void labels(nbg_ctx *ctx)
{
    nbg_hkl t;
    int rc = nbg_hkl_read_column(ctx, FIXTURE, "FOBS", DEFAULT_F, &t, NULL, 0);
    const char *m = nbg_errmsg(ctx);
    nbgi_test_check(rc == NBG_EINVAL && strstr(m, "FOBS") && strstr(m, "FP (F)") && strstr(m, "IMEAN (J)") &&
                    strstr(m, FIXTURE) && t.F == NULL, "mtz-label-unknown", "%s", m);
    rc = nbg_hkl_read_column(ctx, FIXTURE, "SIGFP", DEFAULT_F, &t, NULL, 0);
    m = nbg_errmsg(ctx);
    nbgi_test_check(rc == NBG_EINVAL && strstr(m, "type Q") && t.F == NULL, "mtz-label-type", "%s", m);
    rc = nbg_hkl_read_column(ctx, FIXTURE, "H", DEFAULT_F, &t, NULL, 0);
    nbgi_test_check(rc == NBG_EINVAL && t.F == NULL, "mtz-label-index", "%s", nbg_errmsg(ctx));
}

static int write_bytes(const char *path, const void *b, size_t n)
{
    FILE *f = fopen(path, "wb");
    if (f == NULL)
        return -1;
    const int ok = fwrite(b, 1, n, f) == n;
    return fclose(f) == 0 && ok ? 0 : -1;
}

static void truncations(nbg_ctx *ctx, const char *dir)
{
    size_t n = 0;
    unsigned char *b = nbgi_test_read_file(FIXTURE, &n);
    if (!nbgi_test_check(b != NULL && n > 80, "mtz-fixture", "%s: %zu bytes", FIXTURE, n)) {
        free(b);
        return;
    }
    char path[600];
    snprintf(path, sizeof path, "%s/cut.mtz", dir);
    long bad = 0;
    for (size_t len = 0; len < n; ++len) {
        nbg_hkl t;
        if (write_bytes(path, b, len) != 0) {
            ++bad;
            continue;
        }
        const int rc = nbg_hkl_read_column(ctx, path, NULL, DEFAULT_F, &t, NULL, 0);
        if (rc == NBG_OK || nbg_errmsg(ctx)[0] == '\0' || t.F != NULL) {
            if (bad++ < 5)
                printf("  %zu bytes: %s\n", len, rc == NBG_OK ? "read" : nbg_errmsg(ctx));
        }
        nbg_hkl_free(&t);
    }
    nbgi_test_check(bad == 0, "mtz-trunc", "every truncation (0..%zu bytes) of the %zu-byte fixture refused with a "
                    "message (%ld not)", n - 1, n, bad);

    /* corruptions */
    const char *ncol = memmem(b, n, "NCOL", 4);
    struct {
        const char *id;
        size_t at;
        const char *bytes;
        const char *says;
    } c[] = {{"magic", 0, "MTX ", NULL},
             {"offset", 4, "\xff\xff\xff\x0f", "header offset"},
             {"ncol", 0, NULL, "declares"},
             {"nontext", 0, NULL, "not text"},
             {"batches", 0, NULL, "batches"}};
    for (size_t i = 0; i < sizeof c / sizeof c[0]; ++i) {
        unsigned char *x = malloc(n);
        memcpy(x, b, n);
        if (c[i].bytes != NULL) {
            memcpy(x + c[i].at, c[i].bytes, strlen(c[i].bytes));
        } else if (ncol != NULL) {
            char *p = (char *)x + ((const unsigned char *)ncol - b);
            int nc = 0, nr = 0, nb = 0;
            sscanf(p + 4, "%d %d %d", &nc, &nr, &nb);
            char rec[81];
            if (strcmp(c[i].id, "ncol") == 0)
                snprintf(rec, sizeof rec, "NCOL %8d %12d %8d", nc, nr * 1000, nb);
            else if (strcmp(c[i].id, "batches") == 0)
                snprintf(rec, sizeof rec, "NCOL %8d %12d %8d", nc, nr, 1000000);
            else
                snprintf(rec, sizeof rec, "NCOL %8d %12d %8d \xc3\xa9", nc, nr, nb);
            memset(p, ' ', 80);
            memcpy(p, rec, strlen(rec));
        }
        snprintf(path, sizeof path, "%s/corrupt-%s.mtz", dir, c[i].id);
        nbg_hkl t;
        int rc = write_bytes(path, x, n) == 0 ? nbg_hkl_read_column(ctx, path, NULL, DEFAULT_F, &t, NULL, 0) : 1;
        const char *m = nbg_errmsg(ctx);
        char id[64];
        snprintf(id, sizeof id, "mtz-corrupt-%s", c[i].id);
        nbgi_test_check(rc != NBG_OK && rc != 1 && strstr(m, path) != NULL && (c[i].says == NULL || strstr(m, c[i].says)),
                        id, "%s", rc == NBG_OK ? "read" : m);
        if (rc == NBG_OK)
            nbg_hkl_free(&t);
        free(x);
    }
    /* read by its first bytes whatever its name */
    snprintf(path, sizeof path, "%s/renamed.hkl", dir);
    nbg_hkl t;
    const int rc = write_bytes(path, b, n) == 0 ? nbg_hkl_read(ctx, path, DEFAULT_F, &t) : 1;
    nbgi_test_check(rc == NBG_OK && at(&t, 2, 1, -3) == 11.0, "mtz-sniff", "an MTZ file named .hkl: %s",
                    rc == NBG_OK ? "read as MTZ" : nbg_errmsg(ctx));
    if (rc == NBG_OK)
        nbg_hkl_free(&t);
    free(b);
}


/* A table of 6 rows as dials.integrate writes one (the host is little-endian, as DIALS's files are). */
#define NROW 6
static int write_refl(const char *path, int with_miller)
{
    const int32_t mi[3 * NROW] = {1, 2, 3, 1, 2, 3, 0, 0, 0, -4, 5, 6, 7, 0, -1, 2, 2, 2};
    const double prf[NROW] = {100, 64, 1e6, 0, 0, 0};
    const double sum[NROW] = {81, 49, 1e6, 25, -9, NAN};
    const uint64_t flags[NROW] = {(1u << 9) | (1u << 8), 1u << 8, 1u << 8, 1u << 8, 1u << 8, 1u << 8};
    const int32_t id[NROW] = {0, 0, -1, 0, 0, 0};
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
    msgpack_pack_uint64(&pk, NROW);
    pack_str(&pk, "data");
    msgpack_pack_map(&pk, with_miller ? 5 : 4);
    if (with_miller)
        pack_col(&pk, "miller_index", "cctbx::miller::index<>", NROW, mi, sizeof mi);
    pack_col(&pk, "intensity.prf.value", "double", NROW, prf, sizeof prf);
    pack_col(&pk, "intensity.sum.value", "double", NROW, sum, sizeof sum);
    pack_col(&pk, "flags", "std::size_t", NROW, flags, sizeof flags);
    pack_col(&pk, "id", "int", NROW, id, sizeof id);
    const int rc = write_bytes(path, sb.data, sb.size);
    msgpack_sbuffer_destroy(&sb);
    return rc;
}

static void refl(nbg_ctx *ctx, const char *dir)
{
    char path[600], what[640];
    snprintf(path, sizeof path, "%s/integrated.refl", dir);
    nbg_hkl t;
    int rc = write_refl(path, 1) == 0 ? nbg_hkl_read_column(ctx, path, NULL, DEFAULT_F, &t, what, sizeof what) : 1;
    if (!nbgi_test_check(rc == NBG_OK, "refl-hkl-read", "%s", rc == NBG_OK ? what : nbg_errmsg(ctx)))
        return;
    /* row 1: prf (flag set) 100 -> 10; row 2: sum 49 -> 7 (no prf flag); their mean 8.5 */
    nbgi_test_check(at(&t, 1, 2, 3) == 8.5, "refl-hkl-average", "1 2 3: %g (prf 100 and sum 49: (10 + 7) / 2 = 8.5)",
                    at(&t, 1, 2, 3));
    nbgi_test_check(at(&t, -4, 5, 6) == 5.0 && at(&t, 7, 0, -1) == 0.0, "refl-hkl-sum",
                    "-4 5 6: %g (sum 25: 5), 7 0 -1: %g (sum -9: 0)", at(&t, -4, 5, 6), at(&t, 7, 0, -1));
    nbgi_test_check(at(&t, 2, 2, 2) == DEFAULT_F && at(&t, 0, 0, 0) == DEFAULT_F && at(&t, -1, -2, -3) == DEFAULT_F &&
                    t.nrefl == 3, "refl-hkl-left-out", "no intensity (2 2 2), unindexed (0 0 0) and no symmetry "
                    "(-1 -2 -3) at default_F; %ld distinct indices (3)", t.nrefl);
    nbgi_test_check(strstr(what, "1 intensity.prf.value") != NULL && strstr(what, "3 intensity.sum.value") != NULL,
                    "refl-hkl-said", "%s", what);
    nbg_hkl_free(&t);
    rc = nbg_hkl_read_column(ctx, path, "I", DEFAULT_F, &t, NULL, 0);
    nbgi_test_check(rc == NBG_EINVAL && strstr(nbg_errmsg(ctx), "MTZ"), "refl-hkl-column", "%s", nbg_errmsg(ctx));
    snprintf(path, sizeof path, "%s/strong.refl", dir);
    rc = write_refl(path, 0) == 0 ? nbg_hkl_read_column(ctx, path, NULL, DEFAULT_F, &t, NULL, 0) : 1;
    nbgi_test_check(rc == NBG_EFORMAT && strstr(nbg_errmsg(ctx), "no miller_index") && t.F == NULL,
                    "refl-hkl-no-miller", "%s", nbg_errmsg(ctx));
}
#endif

int main(void)
{
    nbg_ctx *ctx = NULL;
    if (nbg_ctx_create(&ctx, NBG_BACKEND_CPU, NBG_DOUBLE, 1) != NBG_OK) {
        printf("FAIL ctx cannot create a context\n");
        return 1;
    }
    char dir[256];
    if (nbgi_test_mkdtemp("nbg-hkl-mtz", dir, sizeof dir) == NULL) {
        printf("FAIL tmpdir\n");
        return 1;
    }
#ifdef NBG_HAVE_FORMATS
    default_column(ctx);
    imean(ctx);
    anomalous(ctx);
    labels(ctx);
    truncations(ctx, dir);
    refl(ctx, dir);
#else
    nbg_hkl t;
    nbgi_test_check(nbg_hkl_read_column(ctx, FIXTURE, NULL, DEFAULT_F, &t, NULL, 0) == NBG_EUNSUP, "mtz-noformats",
                    "%s", nbg_errmsg(ctx));
#endif
    nbgi_test_rmtree(dir);
    nbg_ctx_destroy(ctx);
    return nbgi_test_summary();
}
