/*
 * test-jvp.c -- forward-mode tangents (sensitivity maps): the dot-product identity <v, J u> = <J^T v, u> against
 * the adjoint for every parameter, and the tangent images against finite differences of images.
 */
#include "testutil.h" /* first: it sets _GNU_SOURCE */
#include "nbgrad.h"
#include "internal.h" /* the test-only switches */

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static nbg_ctx *ctx;

static void base(nbg_experiment *e)
{
    nbg_experiment_default(e);
    e->has_cell = 1;
    const double cell[6] = {70, 80, 90, 75, 85, 95};
    memcpy(e->cell, cell, sizeof cell);
    e->default_F = 100;
    e->Na = e->Nb = e->Nc = 5;
    e->lambda = 1;
    e->distance = 100;
    e->fpixels = e->spixels = 40;
    e->oversample = 1;
    e->polarization = 0.6;
    e->misset[0] = 10;
    e->misset[1] = 5;
    e->misset[2] = 3;
}

/* <v, J u> = <J^T v, u> for u the unit vector of each parameter. */
static void dot_identity(const char *id, const nbg_experiment *e, int with_mosaic)
{
    nbg_param params[NBG_NPARAMS + 30];
    int n = 0;
    for (int p = 0; p < NBG_NPARAMS; ++p) {
        if ((p == NBG_P_MOSAIC && !with_mosaic) ||
            ((p == NBG_P_SPINDLE_TILT1 || p == NBG_P_SPINDLE_TILT2 || p == NBG_P_SPECTRUM_SCALE) &&
             nbg_param_free(ctx, e, (nbg_param)p, NULL, 0) != 1)) {
            continue; /* the spindle's tilts move nothing in a still, the spectrum's width nothing at one wavelength */
        }
        params[n++] = (nbg_param)p;
    }
    for (int m = 1; m < e->ndomain_rot && m <= 10; ++m) { /* the domains' own turns (domain 0's is the orientation) */
        for (int c = 0; c < 3; ++c) {
            params[n++] = NBG_P_DOMAIN(m, c);
        }
    }
    nbg_report r;
    nbg_describe(ctx, e, &r);
    const size_t npix = (size_t)r.fpixels * r.spixels;
    double *T = malloc(sizeof(double) * npix * (size_t)n);
    float *img = malloc(sizeof(float) * npix), *img2 = malloc(sizeof(float) * npix), *v = malloc(sizeof(float) * npix);
    int rc = nbg_simulate_jvp(ctx, e, params, n, T, img, npix);
    if (!nbgi_test_check(rc == NBG_OK, id, "nbg_simulate_jvp ran (%s)", rc == NBG_OK ? "ok" : nbg_errmsg(ctx))) {
        goto out;
    }
    nbg_simulate(ctx, e, img2, npix, NULL);
    nbgi_test_check(memcmp(img, img2, npix * sizeof(float)) == 0, id, "the JVP call's image is nbg_simulate's");
    for (size_t i = 0; i < npix; ++i) {
        v[i] = (float)(0.5 + 0.5 * cos(0.37 * (double)i));
    }
    double g[NBG_NPARAMS + 30] = {0};
    rc = nbg_simulate_grad(ctx, e, v, params, n, g, img2, npix, NULL);
    if (!nbgi_test_check(rc == NBG_OK, id, "nbg_simulate_grad ran")) {
        goto out;
    }
    for (int j = 0; j < n; ++j) {
        double vJu = 0;
        for (size_t i = 0; i < npix; ++i) {
            vJu += (double)v[i] * T[(size_t)j * npix + i];
        }
        char sub[96], lab[48];
        snprintf(sub, sizeof sub, "%s-%s", id, nbg_param_label(e, params[j], lab, sizeof lab));
        const double rel = fabs(vJu - g[j]) / fmax(fabs(g[j]), 1e-300);
        nbgi_test_check(rel <= 1e-10 && g[j] != 0, sub, "<v, J u> = %.15g  <J^T v, u> = %.15g  rel %.2g", vJu, g[j],
                       rel);
    }
out:
    free(T);
    free(img);
    free(img2);
    free(v);
}

/* Tangent images against central differences of images (Richardson-extrapolated), on the bright pixels. */
static void fd_images(const char *id, const nbg_experiment *e, nbg_param p, double h)
{
    nbg_report r;
    nbg_describe(ctx, e, &r);
    const size_t npix = (size_t)r.fpixels * r.spixels;
    double *T = malloc(sizeof(double) * npix);
    float *img = malloc(sizeof(float) * npix), *im[4];
    for (int j = 0; j < 4; ++j) {
        im[j] = malloc(sizeof(float) * npix);
    }
    nbg_simulate_jvp(ctx, e, &p, 1, T, img, npix);
    double x0;
    nbg_param_get(e, p, &x0);
    const double off[4] = {h, -h, h / 2, -h / 2};
    for (int j = 0; j < 4; ++j) {
        nbg_experiment ep = *e;
        nbg_param_set(&ep, p, x0 + off[j]);
        nbg_simulate(ctx, &ep, im[j], npix, NULL);
    }
    nbg_experiment ep = *e; /* a family's value lives in the caller's array, which the copies share: restored */
    nbg_param_set(&ep, p, x0);
    double tmax = 0, worst = 0;
    for (size_t i = 0; i < npix; ++i) {
        tmax = fmax(tmax, fabs(T[i]));
    }
    for (size_t i = 0; i < npix; ++i) {
        const double D1 = ((double)im[0][i] - im[1][i]) / (2 * h), D2 = ((double)im[2][i] - im[3][i]) / h;
        const double fd = (4 * D2 - D1) / 3;
        worst = fmax(worst, fabs(fd - T[i]));
    }
    char sub[96], lab[48];
    snprintf(sub, sizeof sub, "%s-%s", id, nbg_param_label(e, p, lab, sizeof lab));
    nbgi_test_check(tmax > 0 && worst <= 2e-3 * tmax, sub,
                   "max |dI/dtheta - finite difference| = %.3g of max |dI/dtheta| = %.3g", worst / tmax, tmax);
    free(T);
    free(img);
    for (int j = 0; j < 4; ++j) {
        free(im[j]);
    }
}

int main(void)
{
    if (nbg_ctx_create(&ctx, NBG_BACKEND_CPU, NBG_DOUBLE, 0) != NBG_OK) {
        printf("FAIL jvp-0 context\n");
        return 1;
    }
    nbg_experiment e;
    base(&e);
    dot_identity("jvp-1-triclinic", &e, 0);
    e.mosaic = 0.4;
    e.mosaic_domains = 3;
    e.phi0 = 1;
    e.osc = 1;
    e.phisteps = 2;
    dot_identity("jvp-2-mosaic-phi", &e, 1);
    {
        /* and each domain turned by its own angles: the turns' tangents against the adjoint, and against
         * differences of images */
        double turns[9] = {0, 0, 0, 0.3, -0.2, 0.1, -0.25, 0.15, 0.35};
        e.domain_rot = turns;
        e.ndomain_rot = 3;
        dot_identity("jvp-2b-domain-turns", &e, 1);
        fd_images("jvp-2b-fd", &e, NBG_P_DOMAIN(1, 1), 0.01);
        fd_images("jvp-2b-fd", &e, NBG_P_DOMAIN(2, 2), 0.01);
        e.domain_rot = NULL;
        e.ndomain_rot = 0;
    }
    base(&e);
    e.oversample = 2;
    e.thick = 100;
    e.thick_abs = 50;
    e.thicksteps = 2;
    e.hdivrange = e.vdivrange = 0.4;
    e.hdivsteps = e.vdivsteps = 2;
    e.dispersion = 1;
    e.dispsteps = 2;
    e.det_rot[0] = 4;
    e.twotheta = 6;
    dot_identity("jvp-3-sampling-detector", &e, 0);
    /* the physical sensor model: layers at depths of their own, the capture a function of the sensor's depth */
    e.sensor_model = NBG_SENSOR_PHYSICAL;
    e.thicksteps = 3;
    dot_identity("jvp-3b-physical-sensor", &e, 0);
    fd_images("jvp-3b-fd", &e, NBG_P_DET_ROTY, 0.01);
    fd_images("jvp-3b-fd", &e, NBG_P_TWOTHETA, 0.01);
    e.sensor_model = NBG_SENSOR_AUTO;
    e.thicksteps = 2;
    e.shape = NBG_SHAPE_ROUND;
    dot_identity("jvp-4-round", &e, 0);

    base(&e);
    e.fpixels = e.spixels = 64;
    fd_images("jvp-5-fd", &e, NBG_P_A, 0.02);
    fd_images("jvp-5-fd", &e, NBG_P_ROTX, 0.01);
    fd_images("jvp-5-fd", &e, NBG_P_DISTANCE, 0.05);
    fd_images("jvp-5-fd", &e, NBG_P_BEAM_FAST, 0.005);
    fd_images("jvp-5-fd", &e, NBG_P_NA, 0.01);
    fd_images("jvp-5-fd", &e, NBG_P_LAMBDA, 1e-4);
    /* the spectrum's shift and width on a spectrum of three wavelengths, away from their defaults */
    e.dispersion = 0.8, e.dispsteps = 3;
    e.spectrum_shift = 0.001, e.spectrum_scale = 1.4;
    fd_images("jvp-5-fd", &e, NBG_P_SPECTRUM_SHIFT, 1e-4);
    fd_images("jvp-5-fd", &e, NBG_P_SPECTRUM_SCALE, 0.01);

    /* jvp-7: the vectorised tangent kernel equals its scalar twin; the third configuration has several samples a
     * matrix and pixel and the square shape, where the crystal's directions are summed through the pixel's G
     * (grad/jvp_row_tmpl.h), with a structure-factor table (dF/dh in G) */
    {
        nbg_experiment cfg[3];
        base(&cfg[0]);
        cfg[0].mosaic = 0.4, cfg[0].mosaic_domains = 3, cfg[0].phi0 = 1, cfg[0].osc = 1, cfg[0].phisteps = 2;
        cfg[0].fpixels = 37;
        base(&cfg[1]);
        cfg[1].shape = NBG_SHAPE_GAUSS, cfg[1].Na = cfg[1].Nb = cfg[1].Nc = 8, cfg[1].oversample = 2;
        cfg[1].dmin = 25, cfg[1].thick = 80, cfg[1].thicksteps = 2;
        base(&cfg[2]);
        cfg[2].mosaic = 0.4, cfg[2].mosaic_domains = 3, cfg[2].phi0 = 1, cfg[2].osc = 1, cfg[2].phisteps = 2;
        cfg[2].oversample = 2, cfg[2].dispersion = 1, cfg[2].dispsteps = 2, cfg[2].fpixels = 37;
        enum { H = 6 };
        nbg_hkl hkl = {-H, H, -H, H, -H, H, NULL, 0};
        const size_t nF = (size_t)(2 * H + 1) * (2 * H + 1) * (2 * H + 1);
        hkl.F = malloc(nF * sizeof(double));
        for (size_t i = 0; hkl.F != NULL && i < nF; ++i) {
            hkl.F[i] = 50 + 40 * sin(1.7 * (double)i);
        }
        hkl.nrefl = (long)nF;
        cfg[2].hkl = &hkl;
        cfg[2].interpolate = 1;
        nbg_param all[NBG_NPARAMS];
        for (int c = 0; c < 3; ++c) {
            if (c == 2 && hkl.F == NULL) {
                nbgi_test_check(0, "jvp-7-vector-vs-scalar-2", "out of memory");
                break;
            }
            int n = 0;
            for (int q = 0; q < NBG_NPARAMS; ++q) {
                if (q != NBG_P_MOSAIC || c != 1) {
                    all[n++] = (nbg_param)q;
                }
            }
            nbg_report r;
            nbg_describe(ctx, &cfg[c], &r);
            const size_t np = (size_t)r.fpixels * r.spixels;
            double *Ta = malloc(sizeof(double) * np * n), *Tb = malloc(sizeof(double) * np * n);
            float *ia = malloc(np * sizeof(float)), *ib = malloc(np * sizeof(float));
            int rc = nbg_simulate_jvp(ctx, &cfg[c], all, n, Ta, ia, np);
            nbgi_debug_scalar_adjoint(ctx, 1);
            if (rc == NBG_OK) {
                rc = nbg_simulate_jvp(ctx, &cfg[c], all, n, Tb, ib, np);
            }
            nbgi_debug_scalar_adjoint(ctx, 0);
            char id[64];
            snprintf(id, sizeof id, "jvp-7-vector-vs-scalar-%d", c);
            if (!nbgi_test_check(rc == NBG_OK, id, "both tangent passes ran (%s)",
                                 rc == NBG_OK ? "ok" : nbg_errmsg(ctx))) {
                free(Ta);
                free(Tb);
                free(ia);
                free(ib);
                continue;
            }
            /* each tangent image against its own maximum; one that is zero up to rounding (d/da of the gauss shape
             * with the beam along a) against 1e-6 of the largest */
            double worst = 0, gmax = 0, mx[NBG_NPARAMS], md[NBG_NPARAMS];
            for (int k = 0; k < n; ++k) {
                mx[k] = md[k] = 0;
                for (size_t i = 0; i < np; ++i) {
                    mx[k] = fmax(mx[k], fabs(Tb[(size_t)k * np + i]));
                    md[k] = fmax(md[k], fabs(Ta[(size_t)k * np + i] - Tb[(size_t)k * np + i]));
                }
                gmax = fmax(gmax, mx[k]);
            }
            for (int k = 0; k < n; ++k) {
                worst = fmax(worst, md[k] / fmax(mx[k], 1e-6 * gmax));
            }
            nbgi_test_check(worst < 1e-11 && memcmp(ia, ib, np * sizeof(float)) == 0, id,
                           "worst difference %.2g of each tangent image's maximum, images %s", worst,
                           memcmp(ia, ib, np * sizeof(float)) == 0 ? "identical" : "differ");
            free(Ta);
            free(Tb);
            free(ia);
            free(ib);
        }
        free(hkl.F);
    }

    const nbg_param bad = (nbg_param)99;
    double t1;
    float i1;
    nbgi_test_check(nbg_simulate_jvp(ctx, &e, &bad, 1, &t1, &i1, 1) == NBG_EINVAL, "jvp-6-bad-param",
                   "an unknown parameter is an error: %s", nbg_errmsg(ctx));
    /* jvp-9: nbg_simulate_tangents: the image in double rounds to nbg_simulate's float image (identity model), its
     * tangents are nbg_simulate_jvp's, no parameter is the double forward alone, the image model applies in
     * double, and a call without an image is refused */
    {
        nbg_experiment t;
        base(&t);
        t.fpixels = 37; /* a row that ends in a partial lane group */
        nbg_report r;
        nbg_describe(ctx, &t, &r);
        const size_t np = (size_t)r.fpixels * r.spixels;
        nbg_param pp[3] = {NBG_P_A, NBG_P_ROTX, NBG_P_SCALE};
        double *Ta = malloc(sizeof(double) * np * 3), *Tb = malloc(sizeof(double) * np * 3);
        double *d = malloc(sizeof(double) * np), *d0 = malloc(sizeof(double) * np);
        float *f = malloc(sizeof(float) * np), *ref = malloc(sizeof(float) * np), *fj = malloc(sizeof(float) * np);
        nbg_simulate(ctx, &t, ref, np, NULL);
        int rc = nbg_simulate_tangents(ctx, &t, pp, 3, Ta, f, d, np);
        nbg_simulate_jvp(ctx, &t, pp, 3, Tb, fj, np);
        int round = 1, same_f = 1, more = 0;
        for (size_t i = 0; i < np; ++i) {
            round &= (float)d[i] == ref[i];
            same_f &= f[i] == fj[i];
            more |= (double)ref[i] != d[i];
        }
        nbgi_test_check(rc == NBG_OK && round && same_f && more, "jvp-9-tangents-image",
                        "the double image rounds to nbg_simulate's and holds more bits; the float image is "
                        "nbg_simulate_jvp's (rc %d)", rc);
        nbgi_test_check(memcmp(Ta, Tb, sizeof(double) * np * 2) == 0 && memcmp(Ta + 2 * np, d, sizeof(double) * np) == 0,
                        "jvp-9-tangents", "the tangents equal nbg_simulate_jvp's, the scale's (the image) in double");
        rc = nbg_simulate_tangents(ctx, &t, NULL, 0, NULL, NULL, d0, np);
        nbgi_test_check(rc == NBG_OK && memcmp(d0, d, sizeof(double) * np) == 0, "jvp-9-forward-alone",
                        "no parameter: the double forward kernel's image equals the tangent kernel's (rc %d)", rc);
        t.scale = 1.5;
        t.bg[0] = 2;
        t.bg[1] = 0.5;
        rc = nbg_simulate_tangents(ctx, &t, NULL, 0, NULL, NULL, d0, np);
        double worst = 0;
        for (size_t i = 0; i < np; ++i) {
            worst = fmax(worst, fabs(d0[i] - (1.5 * d[i] + 2 + 0.5 * (double)((long)(i % (size_t)r.fpixels) -
                                                                                 (r.fpixels - 1) / 2.0) / 1000)));
        }
        nbgi_test_check(rc == NBG_OK && worst < 1e-12, "jvp-9-model", "scale and background in double (worst %g)",
                        worst);
        rc = nbg_simulate_tangents(ctx, &t, NULL, 0, NULL, NULL, NULL, np);
        nbgi_test_check(rc == NBG_EINVAL, "jvp-9-refused", "no image at all is refused (rc %d)", rc);
        free(Ta);
        free(Tb);
        free(d);
        free(d0);
        free(f);
        free(ref);
        free(fj);
    }
    nbg_ctx_destroy(ctx);
    return nbgi_test_summary();
}
