/*
 * test-labgeom.c -- the experiment in DIALS's laboratory frame (nbg_geometry): nbg_geometry_from_report and
 * nbg_experiment_from_geometry, checked by physics rather than by their own formulas.
 *
 *   - For each convention (with an off-centre beam, detector rotations and two-theta, a triclinic crystal at a
 *     non-zero spindle start, a polarized beam and a thick sensor), the geometry maps the beam to -z, keeps the
 *     vectors orthonormal and right-handed, and puts the origin at pix0.
 *   - The experiment rebuilt from the geometry (custom convention, nbgrad's frame = DIALS's) renders the same
 *     image as the original, pixel for pixel: the whole description (detector, beam, spindle, scan, crystal,
 *     polarization, sensor) survived the change of frame.
 *   - The known MOSFLM map: DIALS's (x, y, z) = nanoBragg's (z, y, -x) (shared/reference/dials-interop.md).
 *   - Refusals, each naming what is wrong: a detector plane through the sample, a beam parallel to the panel,
 *     rectangular pixels, axes that are not orthogonal, a singular cell, non-finite values.
 *   - nbg_read_image: one image written as SMV (with and without ADC_OFFSET), raw floats, NXmx and CBF reads back
 *     with the same pixels, each format recognised by its content whatever its name; the geometry comes back in
 *     full from NXmx and CBF, partly from SMV; overloads are masked; a raw file of the wrong size, a frame past
 *     the end and a directory are refused with their names.
 */
#include "testutil.h"

#include "nbgrad.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static double dot3(const double *a, const double *b) { return a[0] * b[0] + a[1] * b[1] + a[2] * b[2]; }

static void cross3(const double *a, const double *b, double *out)
{
    out[0] = a[1] * b[2] - a[2] * b[1];
    out[1] = a[2] * b[0] - a[0] * b[2];
    out[2] = a[0] * b[1] - a[1] * b[0];
}

static void base(nbg_experiment *e, nbg_convention conv)
{
    nbg_experiment_default(e);
    e->convention = conv;
    e->has_cell = 1;
    const double cell[6] = {57, 68, 79, 85, 105, 95};
    memcpy(e->cell, cell, sizeof cell);
    e->misset[0] = 12, e->misset[1] = -25, e->misset[2] = 33;
    e->default_F = 100;
    e->Na = e->Nb = e->Nc = 6;
    e->lambda = 0.9795;
    e->fpixels = 96, e->spixels = 80;
    e->pixel = 0.3;
    e->distance = 80;
    e->Xbeam = 11.3, e->Ybeam = 17.9;
    e->det_rot[0] = 2, e->det_rot[1] = -4, e->det_rot[2] = 1.5;
    e->twotheta = 7;
    e->phi0 = 21.5;
    e->osc = 0.5;
    e->phisteps = 3;
    e->polarization = 0.8;
    e->nopolar = 0;
    e->thick = 300;
    e->thick_abs = 150;
    e->thicksteps = 2;
    e->oversample = 2;
}

/* max |a - b| / max |a| */
static double image_diff(const float *a, const float *b, size_t n, double *amax)
{
    double m = 0, d = 0;
    for (size_t i = 0; i < n; ++i) {
        m = fmax(m, fabs(a[i]));
        d = fmax(d, fabs((double)a[i] - b[i]));
    }
    *amax = m;
    return m > 0 ? d / m : INFINITY;
}

static double sum_of(const float *a, size_t n)
{
    double s = 0;
    for (size_t i = 0; i < n; ++i) s += a[i];
    return s;
}

static void test_convention(nbg_ctx *ctx, nbg_convention conv, const char *name)
{
    char id[64];
    nbg_experiment e;
    base(&e, conv);
    nbg_report r;
    if (!nbgi_test_check(nbg_describe(ctx, &e, &r) == NBG_OK, "labgeom-describe", "%s: %s", name, nbg_errmsg(ctx))) {
        return;
    }
    nbg_geometry g;
    snprintf(id, sizeof id, "labgeom-%s-from-report", name);
    if (!nbgi_test_check(nbg_geometry_from_report(ctx, &e, &r, 5, &g) == NBG_OK, id, "%s", nbg_errmsg(ctx))) {
        return;
    }
    double n[3];
    cross3(g.fast, g.slow, n);
    snprintf(id, sizeof id, "labgeom-%s-frame", name);
    nbgi_test_check(fabs(g.direction[2] - 1) < 1e-12 && fabs(dot3(g.fast, g.slow)) < 1e-12 &&
                        fabs(dot3(g.fast, g.fast) - 1) < 1e-12 && fabs(dot3(n, n) - 1) < 1e-12,
                    id, "beam along -z, fast and slow orthonormal (direction %g %g %g)", g.direction[0],
                    g.direction[1], g.direction[2]);
    /* lengths are frame-invariant: |origin| = |pix0|, and the cell */
    snprintf(id, sizeof id, "labgeom-%s-invariants", name);
    const double o = sqrt(dot3(g.origin, g.origin)), p = 1000 * sqrt(dot3(r.pix0, r.pix0));
    double la = sqrt(dot3(g.real_space, g.real_space));
    nbgi_test_check(fabs(o - p) < 1e-9 * p && fabs(la - r.cell[0]) < 1e-9 * la && g.nframes == 5 &&
                        g.scan_start == r.phi0 && g.scan_width == r.osc && fabs(g.polarization_fraction - 0.9) < 1e-15,
                    id, "|origin| %.12g mm = |pix0| %.12g mm, |a| %.12g = %.12g A, scan, polarization fraction %g",
                    o, p, la, r.cell[0], g.polarization_fraction);

    /* the same experiment in DIALS's frame renders the same image */
    nbg_experiment e2;
    base(&e2, conv);
    snprintf(id, sizeof id, "labgeom-%s-to-experiment", name);
    if (!nbgi_test_check(nbg_experiment_from_geometry(ctx, &g, &e2) == NBG_OK, id, "%s", nbg_errmsg(ctx))) {
        return;
    }
    /* the crystal's own cell (the report's: nanoBragg's construction from -cell 57 68 79 85 105 95 gives other
     * angles, by 0.02 deg), not the -cell values: the list's cell parameters are the crystal's */
    double dc = 0, dn = 0;
    for (int i = 0; i < 6; ++i) {
        dc = fmax(dc, fabs(e2.cell[i] - r.cell[i]));
        dn = fmax(dn, fabs(r.cell[i] - e.cell[i]));
    }
    snprintf(id, sizeof id, "labgeom-%s-cell", name);
    nbgi_test_check(e2.has_cell && e2.has_umat && !e2.has_mat && dc < 1e-9 && dn > 1e-3, id,
                    "the crystal comes back as U and its own cell, refinable (max difference %.2g from the crystal's "
                    "cell, which differs from the -cell values by %.2g), misset %g %g %g", dc, dn, e2.misset[0],
                    e2.misset[1], e2.misset[2]);
    const size_t npix = (size_t)r.fpixels * r.spixels;
    float *a = malloc(npix * sizeof *a), *b = malloc(npix * sizeof *b);
    nbg_report r2;
    const int ok = a != NULL && b != NULL && nbg_simulate(ctx, &e, a, npix, NULL) == NBG_OK &&
                   nbg_simulate(ctx, &e2, b, npix, &r2) == NBG_OK;
    snprintf(id, sizeof id, "labgeom-%s-same-image", name);
    if (nbgi_test_check(ok, id, "both render (%s)", nbg_errmsg(ctx))) {
        double amax;
        const double d = image_diff(a, b, npix, &amax);
        snprintf(id, sizeof id, "labgeom-%s-pixels", name);
        nbgi_test_check(amax > 0 && d < 1e-8, id,
                        "the image rebuilt in DIALS's frame equals the original: max |diff| / max = %.3g "
                        "(max %.4g photons)", d, amax);
        if (getenv("NBG_TEST_VERBOSE") != NULL) {
            printf("  pix0 %g %g %g -> %g %g %g; f %g %g %g -> %g %g %g; o %g %g %g -> %g %g %g\n", r.pix0[0],
                   r.pix0[1], r.pix0[2], r2.pix0[0], r2.pix0[1], r2.pix0[2], r.fdet[0], r.fdet[1], r.fdet[2],
                   r2.fdet[0], r2.fdet[1], r2.fdet[2], r.odet[0], r.odet[1], r.odet[2], r2.odet[0], r2.odet[1],
                   r2.odet[2]);
            printf("  a %.9g %.9g %.9g -> %.9g %.9g %.9g; a* %g %g %g -> %g %g %g; sum %.9g %.9g\n",
                   r.real_vectors[0], r.real_vectors[1], r.real_vectors[2], r2.real_vectors[0], r2.real_vectors[1],
                   r2.real_vectors[2], r.recip_vectors[0], r.recip_vectors[1], r.recip_vectors[2],
                   r2.recip_vectors[0], r2.recip_vectors[1], r2.recip_vectors[2], sum_of(a, npix), sum_of(b, npix));
        }
        snprintf(id, sizeof id, "labgeom-%s-distance", name);
        nbgi_test_check(fabs(r2.close_distance - r.close_distance) < 1e-9, id,
                        "close distance %.12g mm = %.12g mm", r2.close_distance, r.close_distance);
    }
    free(a);
    free(b);
}

static void test_mosflm_map(nbg_ctx *ctx)
{
    nbg_experiment e;
    base(&e, NBG_CONV_MOSFLM);
    e.det_rot[0] = e.det_rot[1] = e.det_rot[2] = e.twotheta = 0;
    nbg_report r;
    nbg_geometry g;
    if (nbg_describe(ctx, &e, &r) != NBG_OK || nbg_geometry_from_report(ctx, &e, &r, 1, &g) != NBG_OK) {
        nbgi_test_check(0, "labgeom-mosflm-map", "%s", nbg_errmsg(ctx));
        return;
    }
    /* (x, y, z) -> (z, y, -x): nanoBragg prints DIALS_ORIGIN with this map */
    double err = 0;
    for (int i = 0; i < 3; ++i) err = fmax(err, fabs(g.origin[i] - r.dials_origin[i]));
    const double *av = r.real_vectors;
    err = fmax(err, fabs(g.real_space[0] - av[2]) + fabs(g.real_space[1] - av[1]) + fabs(g.real_space[2] + av[0]));
    nbgi_test_check(err < 1e-9 && fabs(g.fast[0] - 1) < 1e-15 && fabs(g.slow[1] + 1) < 1e-15 &&
                        fabs(g.axis[0] - 1) < 1e-15,
                    "labgeom-mosflm-map",
                    "MOSFLM: origin = nanoBragg's DIALS_ORIGIN, a = (a_z, a_y, -a_x), fast (1,0,0), slow (0,-1,0), "
                    "spindle (1,0,0) (max error %.2g)", err);
}

static void expect_refusal(nbg_ctx *ctx, const nbg_geometry *g, const char *id, const char *needle)
{
    nbg_experiment e;
    base(&e, NBG_CONV_MOSFLM);
    const int rc = nbg_experiment_from_geometry(ctx, g, &e);
    nbgi_test_check(rc == NBG_EINVAL && strstr(nbg_errmsg(ctx), needle) != NULL, id, "refused: %s",
                    nbg_errmsg(ctx));
}

static void test_refusals(nbg_ctx *ctx)
{
    nbg_experiment e;
    base(&e, NBG_CONV_DIALS);
    nbg_report r;
    nbg_geometry g0, g;
    if (nbg_describe(ctx, &e, &r) != NBG_OK || nbg_geometry_from_report(ctx, &e, &r, 1, &g0) != NBG_OK) {
        nbgi_test_check(0, "labgeom-refusals", "%s", nbg_errmsg(ctx));
        return;
    }
    g = g0;
    /* the panel's plane through the sample: move the origin into the plane through the origin */
    double n[3];
    cross3(g.fast, g.slow, n);
    const double d = dot3(g.origin, n);
    for (int i = 0; i < 3; ++i) g.origin[i] -= d * n[i];
    expect_refusal(ctx, &g, "labgeom-refuse-plane", "passes through the sample");
    g = g0;
    /* a beam parallel to the panel */
    memcpy(g.direction, g.fast, sizeof g.direction);
    expect_refusal(ctx, &g, "labgeom-refuse-parallel-beam", "beam does not reach");
    g = g0;
    g.pixel_s = g.pixel_f * 1.5;
    expect_refusal(ctx, &g, "labgeom-refuse-rect-pixels", "square pixels");
    g = g0;
    memcpy(g.slow, g.fast, sizeof g.slow);
    expect_refusal(ctx, &g, "labgeom-refuse-axes", "not orthogonal");
    g = g0;
    g.fast[0] *= 2;
    expect_refusal(ctx, &g, "labgeom-refuse-unit", "fast axis");
    g = g0;
    memcpy(g.real_space + 3, g.real_space, 3 * sizeof(double));
    expect_refusal(ctx, &g, "labgeom-refuse-cell", "singular");
    g = g0;
    g.wavelength = NAN;
    expect_refusal(ctx, &g, "labgeom-refuse-wavelength", "wavelength");
    g = g0;
    g.origin[1] = INFINITY;
    expect_refusal(ctx, &g, "labgeom-refuse-origin", "origin");
    nbgi_test_check(nbg_geometry_from_report(ctx, &e, &r, 0, &g) == NBG_EINVAL, "labgeom-refuse-frames",
                    "zero frames: %s", nbg_errmsg(ctx));
}

#ifdef NBG_HAVE_FORMATS
static void test_read_image(nbg_ctx *ctx)
{
    char dirbuf[512];
    char *dir = nbgi_test_mkdtemp("nbg-labgeom", dirbuf, sizeof dirbuf);
    if (!nbgi_test_check(dir != NULL, "readimg-tmp", "a temporary directory")) {
        return;
    }
    nbg_experiment e;
    base(&e, NBG_CONV_XDS);
    e.fpixels = 40, e.spixels = 30;
    nbg_report r;
    nbg_geometry g;
    const size_t npix = 40 * 30;
    float *img = malloc(npix * sizeof *img);
    uint16_t *u16 = malloc(npix * sizeof *u16);
    int32_t *i32 = malloc(npix * sizeof *i32);
    if (img == NULL || u16 == NULL || i32 == NULL || nbg_simulate(ctx, &e, img, npix, &r) != NBG_OK ||
        nbg_geometry_from_report(ctx, &e, &r, 1, &g) != NBG_OK ||
        nbg_int_image(ctx, img, 40, 30, NULL, 30000.0 / 600, 40, u16) != NBG_OK) {
        nbgi_test_check(0, "readimg-setup", "%s", nbg_errmsg(ctx));
        goto done;
    }
    u16[7] = 65535; /* an overload */
    for (size_t i = 0; i < npix; ++i) i32[i] = u16[i];
    g.pedestal = 40;
    g.saturation = 65535;
    nbg_smv_header h;
    nbg_smv_header_from_report(&r, &h);
    char path[5][600];
    /* names that say nothing of the format: the content decides */
    for (int k = 0; k < 5; ++k) snprintf(path[k], sizeof path[k], "%s/image%d.dat", dir, k);
    int ok = nbg_write_smv(ctx, path[0], &h, u16) == NBG_OK;
    h.has_adc_offset = 1;
    h.adc_offset = 40;
    ok = ok && nbg_write_smv(ctx, path[1], &h, u16) == NBG_OK && nbg_write_float(ctx, path[2], img, npix) == NBG_OK &&
         nbg_write_nxmx(ctx, path[3], &g, NBG_DATA_INT32, i32, 1, NULL) == NBG_OK &&
         nbg_write_cbf(ctx, path[4], &g, 0, i32) == NBG_OK;
    if (!nbgi_test_check(ok, "readimg-write", "SMV, SMV with ADC_OFFSET, raw, NXmx, CBF written (%s)",
                         nbg_errmsg(ctx))) {
        goto done;
    }
    static const char *names[5] = {"smv", "smv-adc", "raw", "nxmx", "cbf"};
    for (int k = 0; k < 5; ++k) {
        float *back = NULL;
        size_t n = 0;
        uint8_t *mask = NULL;
        nbg_geometry rg;
        int whole = -1;
        char id[64];
        snprintf(id, sizeof id, "readimg-%s", names[k]);
        if (!nbgi_test_check(nbg_read_image(ctx, path[k], 0, npix, &back, &n, &rg, &whole, &mask) == NBG_OK, id,
                             "read back (%s)", nbg_errmsg(ctx))) {
            continue;
        }
        size_t bad = 0, masked = 0;
        for (size_t i = 0; i < npix && n == npix; ++i) {
            bad += back[i] != (k == 2 ? img[i] : (float)u16[i]);
            masked += mask != NULL && mask[i];
        }
        snprintf(id, sizeof id, "readimg-%s-pixels", names[k]);
        nbgi_test_check(n == npix && bad == 0, id, "%zu pixels, %zu differ", n, bad);
        snprintf(id, sizeof id, "readimg-%s-geometry", names[k]);
        if (k >= 3) {
            double d = 0;
            for (int i = 0; i < 3; ++i) {
                d = fmax(d, fabs(rg.origin[i] - g.origin[i]) + fabs(rg.fast[i] - g.fast[i]) +
                                fabs(rg.slow[i] - g.slow[i]) + fabs(rg.axis[i] - g.axis[i]));
            }
            nbgi_test_check(whole == 1 && d < 1e-9 && rg.fpixels == 40 && rg.spixels == 30 &&
                                fabs(rg.wavelength - g.wavelength) < 1e-12 && rg.pedestal == 40,
                            id, "the whole geometry (max vector difference %.2g, pedestal %g)", d, rg.pedestal);
            /* how the sensor was rendered (nanoBragg's model: the flags' sensor, 2 layers) comes back with it, and
             * the experiment made from the file renders the same image (until stop 58 NXmx and CBF did not carry
             * it, and a file's sensor was rendered with the physical model) */
            nbg_geometry rc_g = rg; /* the crystal is not the image file's: g's */
            rc_g.has_crystal = g.has_crystal;
            memcpy(rc_g.real_space, g.real_space, sizeof g.real_space);
            nbg_experiment e2, e3;
            base(&e2, NBG_CONV_XDS);
            base(&e3, NBG_CONV_XDS);
            snprintf(id, sizeof id, "readimg-%s-sensor", names[k]);
            float *again = malloc(npix * sizeof *again), *ref = malloc(npix * sizeof *ref);
            int rr = again != NULL && ref != NULL && nbg_experiment_from_geometry(ctx, &rc_g, &e2) == NBG_OK &&
                     nbg_experiment_from_geometry(ctx, &g, &e3) == NBG_OK &&
                     nbg_simulate(ctx, &e2, again, npix, NULL) == NBG_OK &&
                     nbg_simulate(ctx, &e3, ref, npix, NULL) == NBG_OK;
            double amax = 0, dd = INFINITY, dphys = 0;
            if (rr) {
                dd = image_diff(ref, again, npix, &amax);
                e2.sensor_model = NBG_SENSOR_PHYSICAL; /* what a file's sensor renders without the model */
                rr = nbg_simulate(ctx, &e2, again, npix, NULL) == NBG_OK;
                dphys = rr ? image_diff(ref, again, npix, &amax) : 0;
            }
            nbgi_test_check(rr && rg.sensor_model == NBG_SENSOR_NANOBRAGG && rg.sensor_layers == 2 && amax > 0 &&
                                dd < 1e-8 && dphys > 0.1,
                            id, "the sensor's model %d and layers %d come back (nanoBragg's, 2): the file renders as "
                            "the geometry it was written from, max |diff| / max %.3g (the physical model: %.3g) (%s)",
                            rg.sensor_model, rg.sensor_layers, dd, dphys, rr ? "ok" : nbg_errmsg(ctx));
            free(again);
            free(ref);
        } else if (k < 2) {
            nbgi_test_check(whole == 0 && rg.fpixels == 40 && rg.spixels == 30 && rg.pixel_f == e.pixel &&
                                (k == 0 ? isnan(rg.pedestal) : rg.pedestal == 40),
                            id, "SMV: sizes, and the pedestal only from ADC_OFFSET (%g)", rg.pedestal);
        } else {
            nbgi_test_check(whole == 0 && rg.fpixels == 0, id, "raw floats say nothing of the geometry");
        }
        snprintf(id, sizeof id, "readimg-%s-overload", names[k]);
        if (k == 2) {
            nbgi_test_check(mask == NULL, id, "raw floats have no saturation: no mask");
        } else {
            nbgi_test_check(mask != NULL && mask[7] == 1 && masked == 1, id, "the pixel at 65535 is masked, and only "
                            "it (%zu masked)", masked);
        }
        free(back);
        free(mask);
    }
    float *back = NULL;
    size_t n = 0;
    int rc = nbg_read_image(ctx, path[2], 0, npix + 1, &back, &n, NULL, NULL, NULL);
    nbgi_test_check(rc == NBG_EFORMAT && strstr(nbg_errmsg(ctx), "image2.dat") != NULL && back == NULL,
                    "readimg-raw-size", "a raw file of the wrong size: %s", nbg_errmsg(ctx));
    rc = nbg_read_image(ctx, path[2], 0, 0, &back, &n, NULL, NULL, NULL);
    nbgi_test_check(rc == NBG_EFORMAT && back == NULL, "readimg-raw-unexpected",
                    "raw floats when none are expected: %s", nbg_errmsg(ctx));
    rc = nbg_read_image(ctx, path[3], 1, npix, &back, &n, NULL, NULL, NULL);
    nbgi_test_check(rc != NBG_OK && strstr(nbg_errmsg(ctx), "image3.dat") != NULL && back == NULL,
                    "readimg-frame", "frame 1 of a 1-frame NXmx: %s", nbg_errmsg(ctx));
    rc = nbg_read_image(ctx, path[0], 1, npix, &back, &n, NULL, NULL, NULL);
    nbgi_test_check(rc == NBG_EINVAL && back == NULL, "readimg-frame-smv", "frame 1 of an SMV: %s",
                    nbg_errmsg(ctx));
    rc = nbg_read_image(ctx, dir, 0, npix, &back, &n, NULL, NULL, NULL);
    nbgi_test_check(rc == NBG_EIO && strstr(nbg_errmsg(ctx), "directory") != NULL, "readimg-dir",
                    "a directory: %s", nbg_errmsg(ctx));
done:
    free(img);
    free(u16);
    free(i32);
    nbgi_test_rmtree(dir);
}
#endif

/* Stills: a scan of width 0 turns no crystal.  A still that nbgrad renders at phi 30 is written with its crystal
 * turned by 30 deg (the scan still stating 30), and read back as the same image with phi0 0; a list such as
 * dials.import writes for a still (width 0, start 89.9997) renders the crystal as the list gives it. */
static void test_stills(nbg_ctx *ctx)
{
    nbg_experiment e, e2, e3;
    base(&e, NBG_CONV_DIALS);
    e.phi0 = 30, e.osc = 0, e.phisteps = 1;
    nbg_report r;
    nbg_geometry g;
    if (nbg_describe(ctx, &e, &r) != NBG_OK || nbg_geometry_from_report(ctx, &e, &r, 1, &g) != NBG_OK) {
        nbgi_test_check(0, "labgeom-still", "%s", nbg_errmsg(ctx));
        return;
    }
    base(&e2, NBG_CONV_DIALS);
    const int ok2 = nbg_experiment_from_geometry(ctx, &g, &e2) == NBG_OK;
    const size_t npix = (size_t)r.fpixels * r.spixels;
    float *a = malloc(npix * sizeof *a), *b = malloc(npix * sizeof *b), *c = malloc(npix * sizeof *c);
    double amax = 0, d = INFINITY, d2 = INFINITY;
    if (ok2 && a != NULL && b != NULL && c != NULL && nbg_simulate(ctx, &e, a, npix, NULL) == NBG_OK &&
        nbg_simulate(ctx, &e2, b, npix, NULL) == NBG_OK) {
        d = image_diff(a, b, npix, &amax);
    }
    nbgi_test_check(ok2 && fabs(g.scan_start - 30) < 1e-12 && g.scan_width == 0 && e2.phi0 == 0 && amax > 0 && d < 1e-8,
                    "labgeom-still-turned", "a still at phi 30: the list states 30, its crystal is turned, read back "
                    "with phi0 %g: the same image (max |diff| / max %.3g; scan %g %g, max %g)", e2.phi0, d, g.scan_start, g.scan_width, amax);
    /* dials.import's still: the crystal at the image, a scan start of 89.9997 */
    nbg_geometry gd = g;
    gd.scan_start = 89.9997;
    base(&e3, NBG_CONV_DIALS);
    const int ok3 = nbg_experiment_from_geometry(ctx, &gd, &e3) == NBG_OK;
    if (ok3 && c != NULL && nbg_simulate(ctx, &e3, c, npix, NULL) == NBG_OK) {
        d2 = image_diff(a, c, npix, &amax);
    }
    nbgi_test_check(ok3 && e3.phi0 == 0 && d2 < 1e-8, "labgeom-still-dials-start",
                    "a still whose scan starts at 89.9997 deg (dials.import's) is not turned: phi0 %g, the same image "
                    "(max |diff| / max %.3g)", e3.phi0, d2);
    free(a);
    free(b);
    free(c);
}

int main(void)
{
    nbg_ctx *ctx = NULL;
    if (nbg_ctx_create(&ctx, NBG_BACKEND_CPU, NBG_DOUBLE, 0) != NBG_OK) {
        nbgi_test_check(0, "labgeom-ctx", "cannot create a context");
        return nbgi_test_summary();
    }
    const struct {
        nbg_convention conv;
        const char *name;
    } convs[] = {{NBG_CONV_MOSFLM, "mosflm"}, {NBG_CONV_DENZO, "denzo"}, {NBG_CONV_ADXV, "adxv"},
                 {NBG_CONV_XDS, "xds"},       {NBG_CONV_DIALS, "dials"}};
    for (size_t i = 0; i < sizeof convs / sizeof convs[0]; ++i) {
        test_convention(ctx, convs[i].conv, convs[i].name);
    }
    test_mosflm_map(ctx);
    test_stills(ctx);
    test_refusals(ctx);
#ifdef NBG_HAVE_FORMATS
    test_read_image(ctx);
#endif
    nbg_ctx_destroy(ctx);
    return nbgi_test_summary();
}
