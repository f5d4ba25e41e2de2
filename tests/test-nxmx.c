/*
 * test-nxmx.c -- checks of the NeXus/NXmx writer and reader (src/nxmx.c): write-then-read round trips of the
 * geometry and the pixels (float32 and int32, several frames, the mask), and the errors of malformed files and
 * invalid geometry (each with the right status, a message naming the file, and nothing left behind).
 *
 * Prints one line per check and a final "N passed, M failed"; exits 0 only when nothing failed.  Temporary files
 * live in a fresh directory under /tmp that is removed at the end.  Built without HDF5 (FORMATS=0), it checks that
 * the calls return NBG_EUNSUP.
 */
#include "testutil.h"

#include "formats.h"
#include "internal.h"
#include "nbgrad.h"

#include <dirent.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#ifdef NBG_HAVE_FORMATS
#include <hdf5.h>
#endif

#define CHECK(ok, id, ...) nbgi_test_check((ok), (id), __VA_ARGS__)

/* An off-centre detector turned 10 deg about y and 5 deg about x, a scan of 3 frames. */
static void make_geometry(nbg_geometry *g)
{
    nbgi_geometry_init(g);
    const double a = 10 * M_PI / 180, b = 5 * M_PI / 180;
    g->fpixels = 37;
    g->spixels = 23;
    g->pixel_f = g->pixel_s = 0.172;
    /* fast = Ry(a) x, slow = Rx(b) Ry(a) y-ish: orthonormal by construction */
    const double f[3] = {cos(a), 0, -sin(a)};
    const double s0[3] = {0, 1, 0};
    const double s[3] = {s0[0], s0[1] * cos(b) - s0[2] * sin(b), s0[1] * sin(b) + s0[2] * cos(b)};
    /* make slow orthogonal to fast (Gram-Schmidt) */
    const double d = f[0] * s[0] + f[1] * s[1] + f[2] * s[2];
    double sl[3] = {s[0] - d * f[0], s[1] - d * f[1], s[2] - d * f[2]};
    const double n = sqrt(sl[0] * sl[0] + sl[1] * sl[1] + sl[2] * sl[2]);
    for (int i = 0; i < 3; ++i) {
        g->fast[i] = f[i];
        g->slow[i] = sl[i] / n;
    }
    g->slow[0] = -g->slow[0]; /* not a plain axis-aligned panel */
    g->slow[2] = -g->slow[2];
    const double o[3] = {-40.125, 30.5, -180.25};
    memcpy(g->origin, o, sizeof o);
    g->thickness = 0.45;
    g->mu = 3.25;
    snprintf(g->material, sizeof g->material, "Si");
    g->saturation = 65535;
    g->pedestal = 40;
    g->gain = 2.5;
    g->wavelength = 0.98;
    g->polarization_normal[0] = 0, g->polarization_normal[1] = 1, g->polarization_normal[2] = 0;
    g->polarization_fraction = 0.99;
    g->axis[0] = 0.6, g->axis[1] = 0.8, g->axis[2] = 0;
    g->scan_start = 5.1;
    g->scan_width = 0.3;
    g->nframes = 3;
    g->exposure = 0.125;
}

#ifdef NBG_HAVE_FORMATS

/* |got - want| <= 1e-9 * max(1, |want|) for every field nbg_geometry carries in NXmx. */
static void compare_geometry(const nbg_geometry *got, const nbg_geometry *want, const char *id)
{
    char tag[128];
#define REL(field)                                                                                                 \
    do {                                                                                                           \
        snprintf(tag, sizeof tag, "%s-%s", id, #field);                                                            \
        nbgi_test_rel(got->field, want->field, 1e-9, tag, "%s", #field);                                          \
    } while (0)
#define VEC(field)                                                                                                 \
    do {                                                                                                           \
        double err = 0, scale = 0;                                                                                 \
        for (int i = 0; i < 3; ++i) {                                                                              \
            err = fmax(err, fabs(got->field[i] - want->field[i]));                                                 \
            scale = fmax(scale, fabs(want->field[i]));                                                             \
        }                                                                                                          \
        snprintf(tag, sizeof tag, "%s-%s", id, #field);                                                            \
        CHECK(err <= 1e-9 * fmax(1, scale), tag, "%s (%g, %g, %g) vs (%g, %g, %g), error %.3g", #field,            \
              got->field[0], got->field[1], got->field[2], want->field[0], want->field[1], want->field[2], err);   \
    } while (0)
    snprintf(tag, sizeof tag, "%s-size", id);
    CHECK(got->fpixels == want->fpixels && got->spixels == want->spixels && got->nframes == want->nframes, tag,
          "size %d x %d, %d frames", got->fpixels, got->spixels, got->nframes);
    REL(pixel_f);
    REL(pixel_s);
    VEC(fast);
    VEC(slow);
    VEC(origin);
    REL(thickness);
    REL(mu);
    snprintf(tag, sizeof tag, "%s-material", id);
    CHECK(strcmp(got->material, want->material) == 0, tag, "material \"%s\"", got->material);
    REL(saturation);
    REL(pedestal);
    REL(gain);
    VEC(direction);
    REL(wavelength);
    VEC(polarization_normal);
    REL(polarization_fraction);
    VEC(axis);
    REL(scan_start);
    REL(scan_width);
    REL(exposure);
#undef REL
#undef VEC
}

/* 1 when the directory holds exactly the n names given (no temporaries). */
static int dir_holds(const char *dir, const char **names, int n)
{
    DIR *d = opendir(dir);
    if (d == NULL)
        return 0;
    int count = 0, ok = 1;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0)
            continue;
        ++count;
        int known = 0;
        for (int i = 0; i < n; ++i)
            known |= strcmp(e->d_name, names[i]) == 0;
        if (!known) {
            printf("# unexpected file %s/%s\n", dir, e->d_name);
            ok = 0;
        }
    }
    closedir(d);
    return ok && count == n;
}

#endif

/* The call failed with status want and a message naming the file. */
static void expect_error(nbg_ctx *ctx, int rc, int want, const char *file, const char *id, const char *what)
{
    const char *msg = nbg_errmsg(ctx);
    const char *base = strrchr(file, '/');
    base = base != NULL ? base + 1 : file;
    CHECK(rc == want && msg != NULL && strstr(msg, base) != NULL, id, "%s: status %d (want %d): %s", what, rc, want,
          msg != NULL ? msg : "(none)");
}

#ifdef NBG_HAVE_FORMATS

/* A file with /entry (NXentry, definition NXmx) and /entry/data (NXdata), plus data of the given rank (0: none). */
static int make_bad_file(const char *path, int rank)
{
    const hid_t f = H5Fcreate(path, H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
    if (f < 0)
        return -1;
    const char *groups[2][2] = {{"/entry", "NXentry"}, {"/entry/data", "NXdata"}};
    for (int i = 0; i < 2; ++i) {
        const hid_t g = H5Gcreate2(f, groups[i][0], H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
        const hid_t t = H5Tcopy(H5T_C_S1);
        H5Tset_size(t, strlen(groups[i][1]));
        const hid_t s = H5Screate(H5S_SCALAR);
        const hid_t a = H5Acreate2(g, "NX_class", t, s, H5P_DEFAULT, H5P_DEFAULT);
        H5Awrite(a, t, groups[i][1]);
        H5Aclose(a);
        H5Sclose(s);
        H5Tclose(t);
        H5Gclose(g);
    }
    if (rank > 0) {
        hsize_t dims[4] = {10, 2, 2, 2};
        float v[80] = {0};
        const hid_t s = H5Screate_simple(rank, dims, NULL);
        const hid_t d = H5Dcreate2(f, "/entry/data/data", H5T_IEEE_F32LE, s, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
        H5Dwrite(d, H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, v);
        H5Dclose(d);
        H5Sclose(s);
    }
    H5Fclose(f);
    return 0;
}

/* Replaces the data set of the NXmx file at path (nbgrad's: /entry/data/data, linked as the detector's data) by one
 * of file type ftype over dims with creation properties dcpl, holding data (memory type mtype; NULL: nothing
 * written, its chunks never allocated).  Returns 1 on success. */
static int replace_data(const char *path, hid_t ftype, const hsize_t dims[3], hid_t dcpl, hid_t mtype,
                        const void *data)
{
    const hid_t f = H5Fopen(path, H5F_ACC_RDWR, H5P_DEFAULT);
    int ok = f >= 0 && H5Ldelete(f, "/entry/instrument/detector/data", H5P_DEFAULT) >= 0 &&
             H5Ldelete(f, "/entry/data/data", H5P_DEFAULT) >= 0;
    const hid_t space = H5Screate_simple(3, dims, NULL);
    const hid_t d = ok ? H5Dcreate2(f, "/entry/data/data", ftype, space, H5P_DEFAULT, dcpl, H5P_DEFAULT) : -1;
    ok = ok && d >= 0 && (data == NULL || H5Dwrite(d, mtype, H5S_ALL, H5S_ALL, H5P_DEFAULT, data) >= 0) &&
         H5Lcreate_hard(f, "/entry/data/data", f, "/entry/instrument/detector/data", H5P_DEFAULT, H5P_DEFAULT) >= 0;
    if (d >= 0)
        H5Dclose(d);
    H5Sclose(space);
    if (f >= 0)
        H5Fclose(f);
    return ok;
}

/* Eiger-style compression: the file's data set rewritten with the bitshuffle/LZ4 filter (HDF5 filter 32008, the
 * Debian package bitshuffle's plugin), then read by nbg_read_image through HDF5's plugin loading.  Skipped, with
 * the reason, where the plugin is not installed. */
static void eiger_compressed(nbg_ctx *ctx, const char *dir, const nbg_geometry *g)
{
    const H5Z_filter_t bshuf = 32008;
    if (H5Zfilter_avail(bshuf) <= 0) {
        nbgi_test_skip("read-bitshuffle", "the bitshuffle HDF5 plugin (Debian package bitshuffle) is not installed");
        return;
    }
    const size_t npix = (size_t)g->fpixels * g->spixels;
    int32_t *ints = malloc(3 * npix * sizeof *ints);
    char path[4096];
    snprintf(path, sizeof path, "%s/eiger.nxs", dir);
    for (size_t k = 0; k < 3 * npix; ++k) ints[k] = (int32_t)((k * 7919) % 5000) - (k % 97 == 0 ? 1 : 0);
    int ok = nbg_write_nxmx(ctx, path, g, NBG_DATA_INT32, ints, 3, NULL) == NBG_OK;
    const hsize_t dims[3] = {3, (hsize_t)g->spixels, (hsize_t)g->fpixels}, chunk[3] = {1, dims[1], dims[2]};
    const unsigned cd[2] = {0, 2}; /* block size automatic, LZ4 */
    const hid_t dcpl = H5Pcreate(H5P_DATASET_CREATE);
    ok = ok && H5Pset_chunk(dcpl, 3, chunk) >= 0 && H5Pset_filter(dcpl, bshuf, H5Z_FLAG_MANDATORY, 2, cd) >= 0 &&
         replace_data(path, H5T_STD_I32LE, dims, dcpl, H5T_NATIVE_INT32, ints);
    H5Pclose(dcpl);
    if (!CHECK(ok, "read-bitshuffle-setup", "the data rewritten with bitshuffle/LZ4")) {
        free(ints);
        return;
    }
    float *img = NULL;
    size_t n = 0;
    const int rc = nbg_read_image(ctx, path, 2, npix, &img, &n, NULL, NULL, NULL);
    size_t bad = 0;
    for (size_t i = 0; rc == NBG_OK && i < npix; ++i) bad += img[i] != (float)ints[2 * npix + i];
    CHECK(rc == NBG_OK && n == npix && bad == 0, "read-bitshuffle",
          "frame 2 of bitshuffle/LZ4-compressed data read through the plugin (%zu pixels differ; %s)", bad,
          rc == NBG_OK ? "ok" : nbg_errmsg(ctx));
    free(img);
    free(ints);
}

/* A file that declares more images than it stores (its data set replaced by one whose chunks were never written,
 * as a damaged or hostile file may): refused, naming it, before the memory for them is asked for. */
static void unwritten_chunks(nbg_ctx *ctx, const char *dir, const nbg_geometry *g0)
{
    nbg_geometry g = *g0;
    g.fpixels = g.spixels = 1024;
    const size_t npix = (size_t)g.fpixels * g.spixels;
    float *frames = calloc(3 * npix, sizeof *frames);
    char path[4096];
    snprintf(path, sizeof path, "%s/unwritten.nxs", dir);
    int ok = frames != NULL && nbg_write_nxmx(ctx, path, &g, NBG_DATA_FLOAT32, frames, 3, NULL) == NBG_OK;
    const hsize_t dims[3] = {3, 1024, 1024}, chunk[3] = {1, 1024, 1024};
    const hid_t dcpl = H5Pcreate(H5P_DATASET_CREATE);
    ok = ok && H5Pset_chunk(dcpl, 3, chunk) >= 0 &&
         replace_data(path, H5T_IEEE_F32LE, dims, dcpl, H5T_NATIVE_FLOAT, NULL); /* nothing written */
    H5Pclose(dcpl);
    free(frames);
    if (!CHECK(ok, "read-unwritten-setup", "the data set replaced by 3 frames of 1024^2 never written")) {
        return;
    }
    float *img = NULL;
    size_t n = 0;
    const int rc = nbg_read_image(ctx, path, 0, npix, &img, &n, NULL, NULL, NULL);
    CHECK(rc == NBG_EFORMAT && img == NULL && strstr(nbg_errmsg(ctx), "stores") != NULL &&
              strstr(nbg_errmsg(ctx), "unwritten.nxs") != NULL,
          "read-unwritten", "12.6 MB of images declared, none stored: refused (%s)", nbg_errmsg(ctx));
    free(img);
}

/* A kappa goniometer (nbgi_test_kappa) written and read back, over nframes frames: its axes, angles (the scan
 * axis's the scan's start), names and scan axis, and the laboratory's rotation axis to 1e-12. */
static void kappa(nbg_ctx *ctx, const char *dir, const nbg_geometry *g0, const float *frames, int nframes)
{
    nbg_geometry g = *g0, r;
    char path[4096], id[64];
    g.nframes = nframes;
    snprintf(id, sizeof id, "kappa%d-setup", nframes);
    CHECK(nbgi_test_kappa(&g) == NBG_OK, id, "a kappa goniometer");
    snprintf(path, sizeof path, "%s/kappa%d.nxs", dir, nframes);
    int rc = nbg_write_nxmx(ctx, path, &g, NBG_DATA_FLOAT32, frames, nframes, NULL);
    snprintf(id, sizeof id, "kappa%d-write", nframes);
    CHECK(rc == NBG_OK, id, "write a %d-frame file with a kappa goniometer: %s", nframes, rc ? nbg_errmsg(ctx) : "ok");
    float *img = NULL;
    size_t n = 0;
    memset(&r, 0, sizeof r);
    rc = nbgi_read_nxmx(ctx, path, 0, &img, &n, &r, NULL);
    free(img);
    snprintf(id, sizeof id, "kappa%d-read", nframes);
    if (!CHECK(rc == NBG_OK, id, "read it back: %s", rc ? nbg_errmsg(ctx) : "ok"))
        return;
    nbg_goniometer want = g.goniometer;
    want.angles[want.scan_axis] = g.scan_start;
    snprintf(id, sizeof id, "kappa%d", nframes);
    nbgi_test_same_goniometer(&r.goniometer, &want, 1e-12, id);
    double da = 0;
    for (int i = 0; i < 3; ++i)
        da = fmax(da, fabs(r.axis[i] - g.axis[i]));
    snprintf(id, sizeof id, "kappa%d-axis", nframes);
    CHECK(da <= 1e-12, id, "the laboratory's rotation axis (%.15g, %.15g, %.15g), max difference %.3g", r.axis[0],
          r.axis[1], r.axis[2], da);
    snprintf(id, sizeof id, "kappa%d-scan", nframes);
    CHECK(r.scan_start == g.scan_start && r.scan_width == g.scan_width && r.nframes == nframes, id,
          "the scan: start %g, width %g, %d frames", r.scan_start, r.scan_width, r.nframes);
}

static void run(nbg_ctx *ctx, const char *dir)
{
    nbg_geometry g, r;
    make_geometry(&g);
    const size_t npix = (size_t)g.fpixels * g.spixels;
    char path[4096], path2[4096], path3[4096];

    /* --- float32, three distinct frames, with a mask --- */
    float *frames = malloc(3 * npix * sizeof *frames);
    uint8_t *mask = calloc(npix, 1);
    for (size_t k = 0; k < 3 * npix; ++k)
        frames[k] = (float)(0.25 * (double)k + 1000.0 * (double)(k / npix)) - 7.5f;
    mask[0] = mask[5] = mask[npix - 1] = 1;
    snprintf(path, sizeof path, "%s/float.nxs", dir);
    int rc = nbg_write_nxmx(ctx, path, &g, NBG_DATA_FLOAT32, frames, 3, mask);
    CHECK(rc == NBG_OK, "write-float", "write a 3-frame float32 file: %s", rc ? nbg_errmsg(ctx) : "ok");
    float *img = NULL;
    uint8_t *m = NULL;
    size_t n = 0;
    rc = nbgi_read_nxmx(ctx, path, 2, &img, &n, &r, &m);
    CHECK(rc == NBG_OK && n == npix, "read-float", "read frame 2 back: %s", rc ? nbg_errmsg(ctx) : "ok");
    if (rc == NBG_OK) {
        compare_geometry(&r, &g, "geom");
        CHECK(r.goniometer.naxes == 0, "geom-single-axis", "one axis: no multi-axis goniometer (naxes %d)",
              r.goniometer.naxes);
        CHECK(memcmp(img, frames + 2 * npix, npix * sizeof *img) == 0, "float-pixels", "frame 2's pixels exact");
        CHECK(m != NULL && memcmp(m, mask, npix) == 0, "mask", "the mask read back");
    }
    free(img);
    free(m);
    img = NULL;
    rc = nbgi_read_nxmx(ctx, path, 0, &img, &n, NULL, NULL);
    CHECK(rc == NBG_OK && img != NULL && memcmp(img, frames, npix * sizeof *img) == 0, "float-frame0",
          "frame 0's pixels exact (no geometry asked)");
    free(img);

    /* --- int32, one frame, no mask, no material --- */
    nbg_geometry g1 = g;
    g1.nframes = 1;
    g1.material[0] = '\0';
    g1.thickness = 0;
    g1.saturation = NAN;
    g1.scan_width = 0.05;
    int32_t *ints = malloc(npix * sizeof *ints);
    for (size_t k = 0; k < npix; ++k)
        ints[k] = (int32_t)(k * 7919 % 100003) - 50 + (k == 3 ? 2000000000 : 0);
    snprintf(path2, sizeof path2, "%s/int.nxs", dir);
    rc = nbg_write_nxmx(ctx, path2, &g1, NBG_DATA_INT32, ints, 1, NULL);
    CHECK(rc == NBG_OK, "write-int", "write a 1-frame int32 file: %s", rc ? nbg_errmsg(ctx) : "ok");
    m = (uint8_t *)1;
    img = NULL;
    rc = nbgi_read_nxmx(ctx, path2, 0, &img, &n, &r, &m);
    CHECK(rc == NBG_OK && n == npix, "read-int", "read it back: %s", rc ? nbg_errmsg(ctx) : "ok");
    if (rc == NBG_OK) {
        compare_geometry(&r, &g1, "geom1");
        CHECK(r.goniometer.naxes == 0, "geom1-single-axis", "one axis: no multi-axis goniometer (naxes %d)",
              r.goniometer.naxes);
        int same = 1;
        for (size_t k = 0; k < npix; ++k)
            same &= img[k] == (float)ints[k];
        CHECK(same, "int-pixels", "the int32 pixels as float");
        CHECK(m == NULL, "no-mask", "no pixel mask gives NULL");
    }
    free(img);

    /* --- errors of reading --- */
    img = NULL;
    rc = nbgi_read_nxmx(ctx, path, 3, &img, &n, NULL, NULL);
    expect_error(ctx, rc, NBG_EINVAL, path, "frame-range", "frame 3 of 3");
    CHECK(img == NULL, "frame-range-null", "no image on failure");
    rc = nbgi_read_nxmx(ctx, path, -1, &img, &n, NULL, NULL);
    expect_error(ctx, rc, NBG_EINVAL, path, "frame-negative", "frame -1");

    snprintf(path3, sizeof path3, "%s/trunc.nxs", dir);
    rc = nbg_write_nxmx(ctx, path3, &g, NBG_DATA_FLOAT32, frames, 3, mask);
    struct stat st;
    rc = rc == NBG_OK && stat(path3, &st) == 0 ? truncate(path3, st.st_size / 2) : -1;
    CHECK(rc == 0, "truncate", "made a truncated file");
    rc = nbgi_read_nxmx(ctx, path3, 0, &img, &n, &r, &m);
    expect_error(ctx, rc, NBG_EFORMAT, path3, "truncated", "a file cut to half");
    unlink(path3);

    snprintf(path3, sizeof path3, "%s/text.nxs", dir);
    FILE *fp = fopen(path3, "w");
    fputs("this is not an HDF5 file\n", fp);
    fclose(fp);
    rc = nbgi_read_nxmx(ctx, path3, 0, &img, &n, &r, NULL);
    expect_error(ctx, rc, NBG_EFORMAT, path3, "not-hdf5", "a text file");
    unlink(path3);

    snprintf(path3, sizeof path3, "%s/missing.nxs", dir);
    rc = nbgi_read_nxmx(ctx, path3, 0, &img, &n, &r, NULL);
    expect_error(ctx, rc, NBG_EIO, path3, "no-file", "a file that does not exist");

    snprintf(path3, sizeof path3, "%s/rank1.nxs", dir);
    make_bad_file(path3, 1);
    rc = nbgi_read_nxmx(ctx, path3, 0, &img, &n, &r, NULL);
    expect_error(ctx, rc, NBG_EFORMAT, path3, "rank1", "data of rank 1");
    unlink(path3);
    snprintf(path3, sizeof path3, "%s/rank4.nxs", dir);
    make_bad_file(path3, 4);
    rc = nbgi_read_nxmx(ctx, path3, 0, &img, &n, &r, NULL);
    expect_error(ctx, rc, NBG_EFORMAT, path3, "rank4", "data of rank 4");
    unlink(path3);
    snprintf(path3, sizeof path3, "%s/nodata.nxs", dir);
    make_bad_file(path3, 0);
    rc = nbgi_read_nxmx(ctx, path3, 0, &img, &n, &r, NULL);
    expect_error(ctx, rc, NBG_EFORMAT, path3, "no-data", "no /entry/data/data");
    CHECK(strstr(nbg_errmsg(ctx), "/entry/data") != NULL, "no-data-named", "the message names /entry/data");
    unlink(path3);

    /* --- errors of writing: nothing left behind --- */
    nbg_geometry bad = g;
    bad.axis[0] = 1, bad.axis[1] = 1, bad.axis[2] = 0;
    snprintf(path3, sizeof path3, "%s/bad.nxs", dir);
    rc = nbg_write_nxmx(ctx, path3, &bad, NBG_DATA_FLOAT32, frames, 3, NULL);
    expect_error(ctx, rc, NBG_EINVAL, path3, "write-axis", "a rotation axis that is not a unit vector");
    rc = nbg_write_nxmx(ctx, path3, &g, NBG_DATA_FLOAT32, frames, 2, NULL);
    expect_error(ctx, rc, NBG_EINVAL, path3, "write-nframes", "2 frames for a scan of 3");
    bad = g;
    bad.direction[0] = 1, bad.direction[2] = 0;
    bad.fast[0] = 0, bad.fast[1] = 0, bad.fast[2] = 1; /* keep the panel valid: fast along z, slow along y */
    bad.slow[0] = 0, bad.slow[1] = 1, bad.slow[2] = 0;
    rc = nbg_write_nxmx(ctx, path3, &bad, NBG_DATA_FLOAT32, frames, 3, NULL);
    expect_error(ctx, rc, NBG_EUNSUP, path3, "write-beam", "a beam not along -z");
    bad = g;
    snprintf(bad.material, sizeof bad.material, "Ge");
    rc = nbg_write_nxmx(ctx, path3, &bad, NBG_DATA_FLOAT32, frames, 3, NULL);
    expect_error(ctx, rc, NBG_EUNSUP, path3, "write-material", "a material DIALS does not know");
    snprintf(path3, sizeof path3, "%s/no-such-dir/x.nxs", dir);
    rc = nbg_write_nxmx(ctx, path3, &g, NBG_DATA_FLOAT32, frames, 3, NULL);
    expect_error(ctx, rc, NBG_EIO, path3, "write-nodir", "a directory that does not exist");
    const char *names[2] = {"float.nxs", "int.nxs"};
    CHECK(dir_holds(dir, names, 2), "no-temporary", "failed writes left nothing behind");
    eiger_compressed(ctx, dir, &g);
    unwritten_chunks(ctx, dir, &g);
    kappa(ctx, dir, &g, frames, 3);
    kappa(ctx, dir, &g, frames, 1);

    free(frames);
    free(mask);
    free(ints);
}

#else

static void run(nbg_ctx *ctx, const char *dir)
{
    nbg_geometry g;
    make_geometry(&g);
    char path[4096];
    snprintf(path, sizeof path, "%s/x.nxs", dir);
    float data[37 * 23 * 3] = {0};
    int rc = nbg_write_nxmx(ctx, path, &g, NBG_DATA_FLOAT32, data, 3, NULL);
    expect_error(ctx, rc, NBG_EUNSUP, path, "unsup-write", "writing without HDF5");
    float *img = NULL;
    size_t n = 0;
    rc = nbgi_read_nxmx(ctx, path, 0, &img, &n, NULL, NULL);
    expect_error(ctx, rc, NBG_EUNSUP, path, "unsup-read", "reading without HDF5");
}

#endif

int main(void)
{
    nbg_ctx *ctx = NULL;
    if (nbg_ctx_create(&ctx, NBG_BACKEND_CPU, NBG_DOUBLE, 1) != NBG_OK) {
        CHECK(0, "ctx", "create a context");
        return nbgi_test_summary();
    }
    char dir[1024];
    if (nbgi_test_mkdtemp("nbg-nxmx-", dir, sizeof dir) == NULL) {
        CHECK(0, "tmpdir", "make a temporary directory");
    } else {
        run(ctx, dir);
        nbgi_test_rmtree(dir);
    }
    nbg_ctx_destroy(ctx);
    return nbgi_test_summary();
}
