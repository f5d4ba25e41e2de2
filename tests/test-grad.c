/*
 * test-grad.c -- gradients on the CPU: the adjoint against central finite differences (nbg_gradcheck) for every
 * parameter on the experiments a refinement meets, the checker failing on a deliberately broken adjoint, the
 * gradient call's image equal to the forward call's, reproducible gradients, the fused losses, and the same bits for
 * any thread count.
 */
#include "testutil.h" /* first: it sets _GNU_SOURCE */
#include "nbgrad.h"
#include "internal.h" /* the test-only switches */
#include "plan.h"      /* nbgi_rotate_axis */
#include "physics.h"   /* the lattice factor's polynomials (grad-0-poly) */

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static nbg_ctx *ctx;


/* The parameters named in list, in id order (the scalars, then the structure factors: "F" is NBG_P_F_ALL, the
 * directional check); returns how many. */
static int params_of(const char *list, nbg_param *ids)
{
    int n = 0;
    char buf[512];
    snprintf(buf, sizeof buf, "%s", list);
    for (char *t = strtok(buf, ","); t != NULL; t = strtok(NULL, ",")) {
        const int p = strcmp(t, "F") == 0 ? NBG_P_F_ALL : nbg_param_from_name(t);
        if (p < 0 || n >= 64) {
            fprintf(stderr, "test bug: unknown parameter %s\n", t);
            exit(2);
        }
        int k = n++;
        for (; k > 0 && ids[k - 1] > p; --k) {
            ids[k] = ids[k - 1];
        }
        ids[k] = p;
    }
    return n;
}

/* every parameter free on a still of one wavelength (spectrum_scale, the spectrum's width, needs several: it is
 * checked where there are, ALL_SPECTRUM) */
#define ALL_LIST                                                                                                  \
    "a,b,c,alpha,beta,gamma,rotx,roty,rotz,Na,Nb,Nc,lambda,fluence,polar,distance,"                               \
    "beam_fast,beam_slow,det_rotx,det_roty,det_rotz,twotheta,scale,bg,bg_fast,bg_slow,"                           \
    "orient_x,orient_y,orient_z,beam_tilt1,beam_tilt2,spectrum_shift,det_tau1,det_tau2,det_tau3"
static const char *const ALL = ALL_LIST;
static const char *const ALL_SPECTRUM = ALL_LIST ",spectrum_scale";

/* Runs the gradient check and prints one line per parameter; expect_pass = 0 for the broken adjoint. */
static void gradcheck(const char *id, const nbg_experiment *e, const char *params, int expect_pass)
{
    nbg_gradcheck_result res[64];
    nbg_param ids[64];
    const int n = params_of(params, ids);
    const int rc = nbg_gradcheck(ctx, e, ids, n, 1e-6, 1, res);
    if (!nbgi_test_check(rc == NBG_OK, id, "gradcheck ran (%s)", rc == NBG_OK ? "ok" : nbg_errmsg(ctx))) {
        return;
    }
    for (int i = 0; i < n; ++i) {
        char sub[96], lab[48];
        snprintf(sub, sizeof sub, "%s-%s", id,
                 res[i].param == NBG_P_F_ALL ? "F" : nbg_param_label(e, res[i].param, lab, sizeof lab));
        nbgi_test_check(res[i].pass == expect_pass, sub, "adjoint=%.12g numeric=%.12g relerr=%.2g order=%.2f%s%s",
                       res[i].adjoint, res[i].numeric, res[i].relerr, res[i].order, res[i].reason[0] ? " # " : "",
                       res[i].reason);
    }
}

/* grad-14: the same bits for any thread count.  nbg_simulate_grad and nbg_loss_grad (least squares against an
 * observed image) on contexts of 1, 2, 3 and 5 threads: images, losses and gradients compared with memcmp. */
static void thread_invariance(const char *id, const nbg_experiment *e, const nbg_param *ids, int n)
{
    nbg_report r;
    if (nbg_describe(ctx, e, &r) != NBG_OK) {
        nbgi_test_check(0, id, "describe: %s", nbg_errmsg(ctx));
        return;
    }
    const size_t npix = (size_t)r.npix;
    float *dl = malloc(npix * sizeof(float)), *obs = malloc(npix * sizeof(float));
    float *img[2] = {malloc(npix * sizeof(float)), malloc(npix * sizeof(float))};
    double *g[2] = {malloc((size_t)n * sizeof(double)), malloc((size_t)n * sizeof(double))};
    double *gl[2] = {malloc((size_t)n * sizeof(double)), malloc((size_t)n * sizeof(double))};
    double L[2] = {0, 0};
    if (dl == NULL || obs == NULL || img[0] == NULL || img[1] == NULL || g[0] == NULL || g[1] == NULL ||
        gl[0] == NULL || gl[1] == NULL) {
        nbgi_test_check(0, id, "out of memory");
        goto out;
    }
    for (size_t i = 0; i < npix; ++i) {
        dl[i] = (float)(1.0 + 0.5 * sin(0.37 * (double)i));
        obs[i] = (float)(10 + 5 * cos(0.11 * (double)i));
    }
    const int threads[4] = {1, 2, 3, 5};
    int same_img = 1, same_grad = 1, same_loss = 1, ok = 1;
    double nonzero = 0;
    for (int t = 0; t < 4 && ok; ++t) {
        nbg_ctx *c = NULL;
        const int slot = t == 0 ? 0 : 1;
        ok = nbg_ctx_create(&c, NBG_BACKEND_CPU, NBG_DOUBLE, threads[t]) == NBG_OK &&
             nbg_simulate_grad(c, e, dl, ids, n, g[slot], img[slot], npix, NULL) == NBG_OK &&
             nbg_loss_grad(c, e, NBG_LOSS_LSQ, obs, NULL, ids, n, &L[slot], gl[slot], img[slot], npix) == NBG_OK;
        if (!ok) {
            nbgi_test_check(0, id, "%d threads: %s", threads[t], c != NULL ? nbg_errmsg(c) : "no context");
        }
        nbg_ctx_destroy(c);
        if (ok && t > 0) {
            same_img &= memcmp(img[0], img[1], npix * sizeof(float)) == 0;
            same_grad &= memcmp(g[0], g[1], (size_t)n * sizeof(double)) == 0 &&
                         memcmp(gl[0], gl[1], (size_t)n * sizeof(double)) == 0;
            same_loss &= memcmp(&L[0], &L[1], sizeof(double)) == 0;
        }
    }
    for (int j = 0; ok && j < n; ++j) {
        nonzero += g[0][j] != 0 && gl[0][j] != 0;
    }
    if (ok) {
        nbgi_test_check(same_img && same_grad && same_loss && nonzero >= 0.5 * n, id,
                        "1, 2, 3, 5 threads: images %s, %d gradients %s (%g non-zero), loss %s", same_img ? "identical" : "DIFFER",
                        n, same_grad ? "identical" : "DIFFER", nonzero, same_loss ? "identical" : "DIFFERS");
    }
out:
    free(dl);
    free(obs);
    for (int k = 0; k < 2; ++k) {
        free(img[k]);
        free(g[k]);
        free(gl[k]);
    }
}

/* grad-0-poly: the lattice factor's cosine and sine polynomials (nbgi_cospi_reduced, nbgi_sinpi_poly:
 * src/physics_tmpl.h, fitted for the least largest error) against long double's cosl and sinl on |d| <= 1/2, as the
 * kernels evaluate them (y = (pi d)^2 in the kernel's precision); the bounds are two units in the last place at 1,
 * the fits' own errors being 1.3e-17 and 6.1e-19 (double) and 5.8e-9 (float); and exact at d = 0.  The forward's
 * 2 cos(pi d) (nbgi_cospi2_reduced) must be twice the gradient's cosine bit for bit: the image the gradient returns
 * is the forward's. */
static void test_polynomials(void)
{
    const long double pi = 3.141592653589793238462643383279502884L;
    double wc = 0, ws = 0, wcf = 0, wsf = 0;
    long twice = 0; /* d where 2 cos(pi d) (nbgi_cospi2_reduced, the forward's) is not 2 * nbgi_cospi_reduced's bits */
    for (int k = -100000; k <= 100000; ++k) {
        const double d = k / 200000.0;
        const float df = (float)d;
        for (int j = 0; j < 3; ++j) { /* the grid's points, and two off it */
            const double e = d + j * 1.2345678e-7;
            const float ef = df + (float)j * 1.2345678e-7f;
            twice += nbgi_cospi2_reduced_d(e) != 2 * nbgi_cospi_reduced_d(e);
            twice += nbgi_cospi2_reduced_f(ef) != 2 * nbgi_cospi_reduced_f(ef);
        }
        const long double x = pi * (long double)d, xf = pi * (long double)df;
        const long double c = cosl(x), cf = cosl(xf);
        const long double P = k == 0 ? 1.0L : sinl(x) / x, Pf = k == 0 ? 1.0L : sinl(xf) / xf;
        wc = fmax(wc, (double)fabsl((long double)nbgi_cospi_reduced_d(d) - c));
        ws = fmax(ws, (double)fabsl((long double)nbgi_sinpi_poly_d((double)(M_PI * M_PI) * d * d) - P));
        wcf = fmax(wcf, (double)fabsl((long double)nbgi_cospi_reduced_f(df) - cf));
        wsf = fmax(wsf, (double)fabsl((long double)nbgi_sinpi_poly_f((float)(M_PI * M_PI) * df * df) - Pf));
    }
    const double ud = 0x1p-52, uf = 0x1p-23; /* the ulp at 1 */
    nbgi_test_check(wc <= 2 * ud, "grad-0-poly-cos-double", "|cos(pi d) - cosl| <= %.3g on |d| <= 1/2: %.3g", 2 * ud,
                    wc);
    nbgi_test_check(ws <= 2 * ud, "grad-0-poly-sin-double", "|sin(pi d) / (pi d) - sinl / x| <= %.3g: %.3g", 2 * ud,
                    ws);
    nbgi_test_check(wcf <= 2 * uf, "grad-0-poly-cos-float", "|cos(pi d) - cosl| <= %.3g in float: %.3g", 2 * uf, wcf);
    nbgi_test_check(wsf <= 2 * uf, "grad-0-poly-sin-float", "|sin(pi d) / (pi d) - sinl / x| <= %.3g in float: %.3g",
                    2 * uf, wsf);
    nbgi_test_check(twice == 0, "grad-0-poly-cos2", "2 cos(pi d) with doubled coefficients equals 2 cos(pi d) bit for "
                    "bit, double and float, at 1.2 million points: %ld differ", twice);
    nbgi_test_check(nbgi_cospi_reduced_d(0) == 1 && nbgi_cospi_reduced_f(0) == 1 && nbgi_sinpi_poly_d(0) == 1 &&
                        nbgi_sinpi_poly_f(0) == 1,
                    "grad-0-poly-zero", "cos(0) and sin(u) / u at 0 are 1 exactly, in double and float");
}

/* Keeps the largest error and where it was. */
static void worst_at(double err, double x, double *worst, double *where)
{
    if (err > *worst) {
        *worst = err;
        *where = x;
    }
}

/* grad-0-exp: the kernels' exponential (nbgi_exp, the gauss shape's) against long double's expl, in units in the last
 * place of the result, over the whole range the shape uses (x <= 0, down to where the result is 0) and beyond 0;
 * its limits (0 below the least subnormal's logarithm, infinity above the largest finite value's, NaN for NaN, and
 * exp(0) = 1 exactly); and subnormal results rounded once (within one subnormal step). */
static void test_exp(void)
{
    double wd = 0, wf = 0, xd = 0, xf = 0;
    for (int k = -400000; k <= 100000; ++k) {
        const double x = k * (708.0 / 400000.0) + 1e-7 * (k % 7); /* not only the grid's multiples of ln 2 */
        const long double e = expl((long double)x);
        const double ud = fabs(nextafter((double)e, INFINITY) - (double)e);
        worst_at((double)(fabsl((long double)nbgi_exp_d(x) - e) / ud), x, &wd, &xd);
        if (x >= -87 && x <= 88) {
            const float y = (float)x;
            const long double ef = expl((long double)y);
            const float uf = fabsf(nextafterf((float)ef, INFINITY) - (float)ef);
            worst_at((double)(fabsl((long double)nbgi_exp_f(y) - ef) / uf), x, &wf, &xf);
        }
    }
    nbgi_test_check(wd <= 1.5, "grad-0-exp-double", "|exp(x) - expl(x)| <= 1.5 ulp on [-708, 177]: %.3g ulp (at %.6g)",
                    wd, xd);
    nbgi_test_check(wf <= 1.5, "grad-0-exp-float", "|exp(x) - expl(x)| <= 1.5 ulp in float on [-87, 88]: %.3g ulp (at "
                    "%.6g)", wf, xf);
    /* subnormal results: within one step of the subnormals (2^-1074, 2^-149) of expl's */
    double sd = 0, sf = 0;
    for (int k = 0; k <= 1000; ++k) {
        const double x = -708.5 - k * (36.6 / 1000.0);
        sd = fmax(sd, (double)(fabsl((long double)nbgi_exp_d(x) - expl((long double)x)) / 0x1p-1074L));
        const float y = (float)(-87.4 - k * (16.5 / 1000.0));
        sf = fmax(sf, (double)(fabsl((long double)nbgi_exp_f(y) - expl((long double)y)) / 0x1p-149L));
    }
    nbgi_test_check(sd <= 1 && sf <= 1, "grad-0-exp-subnormal", "subnormal results within one subnormal step: %.3g "
                    "(double), %.3g (float)", sd, sf);
    nbgi_test_check(nbgi_exp_d(0) == 1 && nbgi_exp_f(0) == 1 && nbgi_exp_d(-746) == 0 && nbgi_exp_f(-104.5f) == 0 &&
                        nbgi_exp_d(-1e300) == 0 && nbgi_exp_f(-INFINITY) == 0 && isinf(nbgi_exp_d(710)) &&
                        isinf(nbgi_exp_f(89)) && isinf(nbgi_exp_d(INFINITY)) && isnan(nbgi_exp_d(NAN)) &&
                        isnan(nbgi_exp_f(NAN)) && nbgi_exp_d(709.7) < INFINITY && nbgi_exp_f(88.7f) < INFINITY,
                    "grad-0-exp-limits", "exp(0) = 1; 0 below the least subnormal; infinite past the largest finite "
                    "value, finite below it; NaN for NaN (double and float)");
}

int main(void)
{
    if (nbg_ctx_create(&ctx, NBG_BACKEND_CPU, NBG_DOUBLE, 0) != NBG_OK) {
        printf("FAIL grad-0 context\n");
        return 1;
    }
    nbg_experiment e;
    test_polynomials();
    test_exp();

    /* grad-1: a cubic crystal, every parameter */
    nbgi_test_still(&e);
    gradcheck("grad-1-cubic", &e, ALL, 1);

    /* grad-2: a triclinic crystal with misset */
    nbgi_test_still(&e);
    const double tri[6] = {70, 80, 90, 75, 85, 95};
    memcpy(e.cell, tri, sizeof tri);
    e.misset[0] = 10;
    e.misset[1] = 5;
    e.misset[2] = 3;
    gradcheck("grad-2-triclinic", &e, ALL, 1);
    /* the same cell as an experiment list's crystal: U B(cell), B the Busing-Levy matrix, U a rotation by 40 deg
     * about (1, 2, 3) / |(1, 2, 3)| (the misset after it) */
    {
        const double n = sqrt(14.0), u[3] = {1 / n, 2 / n, 3 / n}, th = 40 * M_PI / 180;
        const double c = cos(th), s = sin(th);
        for (int i = 0; i < 3; ++i) {
            for (int j = 0; j < 3; ++j) {
                const double x = j == (i + 1) % 3 ? -u[(i + 2) % 3] : j == (i + 2) % 3 ? u[(i + 1) % 3] : 0;
                e.umat[3 * i + j] = c * (i == j) + s * x + (1 - c) * u[i] * u[j];
            }
        }
        e.has_umat = 1;
        gradcheck("grad-2-triclinic-ub", &e, ALL, 1);
        e.has_umat = 0;
    }

    /* grad-3: mosaic domains with phi steps (and the mosaic spread) */
    e.mosaic = 0.5;
    e.mosaic_domains = 4;
    e.phi0 = 1;
    e.osc = 2;
    e.phisteps = 3;
    gradcheck("grad-3-mosaic-phi", &e, "a,b,c,alpha,beta,gamma,rotx,roty,rotz,Na,Nb,Nc,mosaic,lambda,distance,"
                                       "beam_fast,det_rotx,twotheta,orient_x,orient_y,orient_z", 1);

    /* grad-3b: a crystal of blocks, each mosaic domain turned by its own angles (NBG_P_DOMAIN), with the spread's
     * random domains under them and phi steps, then without a spread (the blocks turned by their turns alone) */
    {
        double turns[12] = {0, 0, 0, 0.3, -0.2, 0.1, -0.25, 0.15, 0.35, 0.1, 0.4, -0.3};
        e.domain_rot = turns;
        e.ndomain_rot = 4;
        gradcheck("grad-3b-domain-turns", &e, "d0.rot_y,d1.rot_x,d1.rot_y,d1.rot_z,d2.rot_x,d2.rot_y,d2.rot_z,d3.rot_z,"
                                             "mosaic,a,gamma,rotx,orient_y,lambda,distance,beam_fast,spindle_tilt1,"
                                             "spindle_tilt2", 1);
        e.mosaic = NAN;
        e.osc = NAN;
        e.phisteps = -1;
        gradcheck("grad-3b-domain-turns-nospread", &e, "d1.rot_x,d1.rot_y,d1.rot_z,d2.rot_x,d2.rot_y,d3.rot_z,a,"
                                                     "orient_x,Na", 1);
        /* turns of zero leave the spread's domains as they were, to the bit */
        memset(turns, 0, sizeof turns);
        e.mosaic = 0.5;
        nbg_report r;
        nbg_describe(ctx, &e, &r);
        const size_t npix = (size_t)r.npix;
        float *im0 = malloc(npix * sizeof(float)), *im1 = malloc(npix * sizeof(float));
        const int rc1 = nbg_simulate(ctx, &e, im1, npix, NULL);
        e.domain_rot = NULL;
        e.ndomain_rot = 0;
        const int rc0 = nbg_simulate(ctx, &e, im0, npix, NULL);
        double sum = 0;
        for (size_t i = 0; i < npix; ++i) {
            sum += im0[i];
        }
        nbgi_test_check(rc0 == NBG_OK && rc1 == NBG_OK && sum > 0 && memcmp(im0, im1, npix * sizeof(float)) == 0,
                        "grad-3b-zero-turns-same-bits", "four domains turned by 0 render the image without turns bit "
                        "for bit (sum %.6g)", sum);
        free(im0);
        free(im1);
        /* the experiment's turns checked: more turned domains than domains, a turn not finite */
        e.domain_rot = turns;
        e.ndomain_rot = 5;
        float px[1];
        e.fpixels = e.spixels = 1;
        int rc = nbg_simulate(ctx, &e, px, 1, NULL);
        nbgi_test_check(rc == NBG_EINVAL && strstr(nbg_errmsg(ctx), "5 mosaic domains with turns") != NULL,
                        "grad-3b-too-many-turns", "%s", nbg_errmsg(ctx));
        e.ndomain_rot = 4;
        turns[7] = NAN;
        rc = nbg_simulate(ctx, &e, px, 1, NULL);
        nbgi_test_check(rc == NBG_EINVAL && strstr(nbg_errmsg(ctx), "domain 2's turn about y") != NULL,
                        "grad-3b-turn-not-finite", "%s", nbg_errmsg(ctx));
        e.domain_rot = NULL;
        e.ndomain_rot = 0;
    }

    /* grad-4: divergence with dispersion */
    nbgi_test_still(&e);
    e.hdivrange = e.vdivrange = 0.5;
    e.hdivsteps = e.vdivsteps = 3;
    e.dispersion = 1;
    e.dispsteps = 3;
    gradcheck("grad-4-divergence-dispersion", &e, ALL_SPECTRUM, 1);

    /* grad-5: oversampling with sensor thickness and polarization */
    nbgi_test_still(&e);
    e.oversample = 2;
    e.thick = 100;
    e.thick_abs = 50;
    e.thicksteps = 3;
    e.polarization = 0.95;
    gradcheck("grad-5-oversample-thickness-polar", &e, ALL, 1);

    /* grad-6: a rotated detector with two-theta, both pivots */
    nbgi_test_still(&e);
    e.det_rot[0] = 5;
    e.det_rot[1] = 3;
    e.det_rot[2] = 2;
    e.twotheta = 10;
    gradcheck("grad-6-rotated-detector", &e, ALL, 1);
    e.convention = NBG_CONV_XDS;
    gradcheck("grad-6-rotated-detector-xds", &e, ALL, 1);
    /* and turned about its own frame (det_tau: DIALS's Tau1-3), where every detector parameter's tangent goes
     * through the turn */
    e.det_tau[0] = 3, e.det_tau[1] = -4, e.det_tau[2] = 2.5;
    gradcheck("grad-6-tau-xds", &e, "distance,beam_fast,beam_slow,det_rotx,det_roty,det_rotz,twotheta,det_tau1,"
              "det_tau2,det_tau3,rotx", 1);
    e.convention = NBG_CONV_MOSFLM;
    gradcheck("grad-6-tau-mosflm", &e, "distance,beam_fast,beam_slow,det_rotx,twotheta,det_tau1,det_tau2,det_tau3",
              1);

    /* grad-7: each crystal shape.  The tophat is flat inside its edge: the crystal orientation and cell have a
     * zero derivative there (taken branch), so only the parameters it does depend on are checked. */
    nbgi_test_still(&e);
    e.shape = NBG_SHAPE_ROUND;
    gradcheck("grad-7-round", &e, ALL, 1);
    nbgi_test_still(&e);
    e.shape = NBG_SHAPE_GAUSS;
    e.Na = e.Nb = e.Nc = 8;
    e.misset[0] = 30;
    e.misset[1] = 40;
    e.misset[2] = 50;
    gradcheck("grad-7-gauss", &e, ALL, 1);
    nbgi_test_still(&e);
    e.shape = NBG_SHAPE_TOPHAT;
    gradcheck("grad-7-tophat", &e, "Na,Nb,Nc,fluence,polar,distance,beam_fast,beam_slow", 1);
    nbgi_test_still(&e);
    e.fudge = 0.7;
    e.shape = NBG_SHAPE_ROUND;
    gradcheck("grad-7-round-fudge", &e, "a,rotx,Na,distance", 1);

    /* grad-8: an interpolated HKL table, with the structure factors */
    const char *gold = nbgi_test_golden_dir();
    if (gold == NULL) {
        nbgi_test_skip("grad-8-interpolated-hkl", "golden data folder not found (set NBG_GOLDEN)");
    } else {
        char path[1024];
        snprintf(path, sizeof path, "%s/data/grid.hkl", gold);
        nbg_hkl hkl;
        if (nbgi_test_check(nbg_hkl_read(ctx, path, 0, &hkl) == NBG_OK, "grad-8-read", "read %s", path)) {
            nbgi_test_still(&e);
            e.hkl = &hkl;
            e.default_F = 0;
            e.lambda = 2;
            e.Na = e.Nb = e.Nc = 2;
            e.fpixels = e.spixels = 64;
            e.interpolate = -1;
            gradcheck("grad-8-interpolated-hkl", &e, ALL, 1);
            gradcheck("grad-8-interpolated-hkl", &e, "F", 1);
            e.Na = e.Nb = e.Nc = 5;
            gradcheck("grad-8-nearest-hkl", &e, "a,rotx,Na,distance,lambda,F", 1);
            nbg_hkl_free(&hkl);
        }
    }

    /* grad-9: the checker can fail: a deliberately broken adjoint (1e-3 relative error) is reported */
    nbgi_test_still(&e);
    nbgi_debug_break_adjoint(ctx, NBG_P_B);
    gradcheck("grad-9-broken-adjoint", &e, "b", 0);
    nbgi_debug_break_adjoint(ctx, -1);

    /* grad-11: the rotation axis's tilts, on a rotation (phi 2 to 3 deg in 3 steps), at a tilted axis */
    nbgi_test_still(&e);
    e.phi0 = 2, e.osc = 1, e.phisteps = 3;
    e.spindle_tilt[0] = 0.3, e.spindle_tilt[1] = -0.2;
    gradcheck("grad-11-spindle-tilt", &e, "spindle_tilt1,spindle_tilt2,rotx,a", 1);
    e.mosaic = 0.3, e.mosaic_domains = 3;
    gradcheck("grad-11-spindle-tilt-mosaic", &e, "spindle_tilt1,spindle_tilt2", 1);

    /* grad-10: the gradient call's image is the forward call's; gradients are reproducible (on a rotation, so
     * that the spindle's tilts act too) */
    nbgi_test_still(&e);
    e.mosaic = 0.3;
    e.mosaic_domains = 3;
    e.phi0 = 1, e.osc = 1, e.phisteps = 2;
    e.dispersion = 0.5, e.dispsteps = 2; /* a spectrum with a width, for spectrum_scale */
    nbg_report r;
    nbg_describe(ctx, &e, &r);
    const size_t npix = (size_t)r.fpixels * r.spixels;
    float *img = malloc(npix * sizeof(float)), *img2 = malloc(npix * sizeof(float));
    float *dl = malloc(npix * sizeof(float));
    for (size_t i = 0; i < npix; ++i) {
        dl[i] = (float)(1.0 + 0.5 * sin((double)i));
    }
    nbg_simulate(ctx, &e, img, npix, NULL);
    double g1[NBG_NPARAMS] = {0}, g2[NBG_NPARAMS] = {0}, gl[NBG_NPARAMS] = {0};
    /* every scalar parameter: ALL_SPECTRUM with the mosaic spread and the spindle's tilts */
    char every[600];
    snprintf(every, sizeof every, "%s,mosaic,spindle_tilt1,spindle_tilt2", ALL_SPECTRUM);
    nbg_param all[64];
    const int nall = params_of(every, all);
    if (nall != NBG_NPARAMS) {
        fprintf(stderr, "test bug: %d parameters listed, the table has %d\n", nall, NBG_NPARAMS);
        exit(2);
    }
    nbg_simulate_grad(ctx, &e, dl, all, nall, g1, img2, npix, NULL);
    nbgi_test_check(memcmp(img, img2, npix * sizeof(float)) == 0, "grad-10-image",
                   "nbg_simulate_grad's image is bit-identical to nbg_simulate's");
    nbg_simulate_grad(ctx, &e, dl, all, nall, g2, img2, npix, NULL);
    nbgi_test_check(memcmp(g1, g2, sizeof g1) == 0, "grad-10-repeat", "two calls give bit-identical gradients");
    int nonzero = 0;
    for (int p = 0; p < NBG_NPARAMS; ++p) {
        nonzero += g1[p] != 0;
    }
    nbgi_test_check(nonzero == NBG_NPARAMS, "grad-10-nonzero", "%d of %d gradients non-zero", nonzero, NBG_NPARAMS);

    /* grad-11: the fused least-squares loss equals the VJP with dL/dI = 2 (I - obs) */
    float *obs = malloc(npix * sizeof(float));
    for (size_t i = 0; i < npix; ++i) {
        obs[i] = img[i] * 1.1f + 0.5f;
        dl[i] = 2.0f * (img[i] - obs[i]);
    }
    double L = 0, Lref = 0;
    nbg_loss_grad(ctx, &e, NBG_LOSS_LSQ, obs, NULL, all, nall, &L, gl, img2, npix);
    nbg_simulate_grad(ctx, &e, dl, all, nall, g1, img2, npix, NULL);
    for (size_t i = 0; i < npix; ++i) {
        Lref += ((double)img[i] - obs[i]) * ((double)img[i] - obs[i]);
    }
    nbgi_test_rel(L, Lref, 1e-12, "grad-11-lsq-loss", "least-squares loss");
    double worst = 0;
    for (int p = 0; p < NBG_NPARAMS; ++p) {
        worst = fmax(worst, fabs(gl[p] - g1[p]) / fmax(fabs(g1[p]), 1e-300));
    }
    nbgi_test_check(worst < 1e-12, "grad-11-lsq-grad", "fused gradient equals the VJP (worst rel %.2g)", worst);
    /* Poisson: dL/dI = 1 - obs / I */
    for (size_t i = 0; i < npix; ++i) {
        dl[i] = (float)(1.0 - obs[i] / fmax(img[i], 1e-12));
    }
    nbg_loss_grad(ctx, &e, NBG_LOSS_POISSON, obs, NULL, all, nall, &L, gl, img2, npix);
    nbg_simulate_grad(ctx, &e, dl, all, nall, g1, img2, npix, NULL);
    worst = 0;
    for (int p = 0; p < NBG_NPARAMS; ++p) {
        worst = fmax(worst, fabs(gl[p] - g1[p]) / fmax(fabs(g1[p]), 1e-300));
    }
    nbgi_test_check(worst < 1e-12, "grad-11-poisson-grad", "fused Poisson gradient equals the VJP (worst rel %.2g)",
                   worst);
    obs[7] = NAN;
    nbgi_test_check(nbg_loss_grad(ctx, &e, NBG_LOSS_LSQ, obs, NULL, all, nall, &L, gl, img2, npix) == NBG_EINVAL &&
                       strstr(nbg_errmsg(ctx), "pixel 7") != NULL,
                   "grad-11-nan-observed", "a NaN observed pixel is an error naming it: %s", nbg_errmsg(ctx));
    obs[7] = 1;
    nbgi_test_check(nbg_loss_grad(ctx, &e, NBG_LOSS_LSQ, obs, NULL, all, nall, &L, gl, img2, npix - 1) == NBG_EINVAL,
                   "grad-11-size", "an observed image of the wrong size is an error: %s", nbg_errmsg(ctx));

    /* grad-13: the vectorised adjoint equals its scalar twin (gradients to rounding, images bit for bit) */
    {
        nbg_experiment cfg[5];
        nbgi_test_still(&cfg[0]);
        cfg[0].mosaic = 0.4, cfg[0].mosaic_domains = 3, cfg[0].phi0 = 1, cfg[0].osc = 1, cfg[0].phisteps = 2;
        nbgi_test_still(&cfg[1]);
        cfg[1].oversample = 2, cfg[1].thick = 100, cfg[1].thick_abs = 50, cfg[1].thicksteps = 2;
        cfg[1].hdivrange = cfg[1].vdivrange = 0.4, cfg[1].hdivsteps = cfg[1].vdivsteps = 2, cfg[1].dmin = 30;
        cfg[1].det_rot[1] = 4, cfg[1].twotheta = 5, cfg[1].Na = 4.5;
        nbgi_test_still(&cfg[2]);
        cfg[2].shape = NBG_SHAPE_GAUSS, cfg[2].Na = cfg[2].Nb = cfg[2].Nc = 8, cfg[2].fpixels = 37;
        /* the lane form of the once-per-pixel factors (no resolution cut): with a thick sensor on a turned
         * detector, and with a point pixel and no polarization */
        nbgi_test_still(&cfg[3]);
        cfg[3].oversample = 2, cfg[3].thick = 100, cfg[3].thick_abs = 50, cfg[3].thicksteps = 3;
        cfg[3].det_rot[0] = 3, cfg[3].det_rot[1] = -4, cfg[3].twotheta = 5, cfg[3].fpixels = 45;
        nbgi_test_still(&cfg[4]);
        cfg[4].point_pixel = 1, cfg[4].nopolar = 1, cfg[4].fpixels = 43;
        for (int c = 0; c < 5; ++c) {
            double ga[64] = {0}, gb[64] = {0};
            nbg_describe(ctx, &cfg[c], &r);
            const size_t np = (size_t)r.fpixels * r.spixels;
            float *ia = malloc(np * sizeof(float)), *ib = malloc(np * sizeof(float)), *w = malloc(np * sizeof(float));
            for (size_t i = 0; i < np; ++i) {
                w[i] = (float)(1.0 + 0.5 * cos((double)i));
            }
            nbg_param m[64];
            const int nm = params_of(ALL, m);
            nbg_simulate_grad(ctx, &cfg[c], w, m, nm, ga, ia, np, NULL);
            nbgi_debug_scalar_adjoint(ctx, 1);
            nbg_simulate_grad(ctx, &cfg[c], w, m, nm, gb, ib, np, NULL);
            /* the tiled form (the CUDA backend's): the samples in another order where there are more matrices than
             * a tile (cfg 0: 6), so gradients and images to rounding */
            double gt[64] = {0};
            float *it = malloc(np * sizeof(float));
            nbgi_debug_scalar_adjoint(ctx, 2);
            nbg_simulate_grad(ctx, &cfg[c], w, m, nm, gt, it, np, NULL);
            nbgi_debug_scalar_adjoint(ctx, 0);
            /* relative per parameter; a gradient that is zero up to rounding (as d/da of the gauss shape here) is
             * compared against 1e-6 of the largest */
            double wr = 0, gmax = 0;
            for (int q = 0; q < nm; ++q) {
                gmax = fmax(gmax, fabs(gb[q]));
            }
            for (int q = 0; q < nm; ++q) {
                wr = fmax(wr, fabs(ga[q] - gb[q]) / fmax(fabs(gb[q]), 1e-6 * gmax));
            }
            char id[64];
            snprintf(id, sizeof id, "grad-13-vector-vs-scalar-%d", c);
            nbgi_test_check(wr < 1e-10 && memcmp(ia, ib, np * sizeof(float)) == 0, id,
                           "worst relative difference %.2g, images %s", wr,
                           memcmp(ia, ib, np * sizeof(float)) == 0 ? "identical" : "differ");
            double tr = 0, imax = 0, tdiff = 0;
            for (int q = 0; q < nm; ++q) {
                tr = fmax(tr, fabs(gt[q] - gb[q]) / fmax(fabs(gb[q]), 1e-6 * gmax));
            }
            for (size_t i = 0; i < np; ++i) {
                imax = fmax(imax, fabs(ib[i]));
                tdiff = fmax(tdiff, fabs(it[i] - ib[i]));
            }
            snprintf(id, sizeof id, "grad-13-tiled-vs-scalar-%d", c);
            nbgi_test_check(tr < 1e-10 && imax > 0 && tdiff <= 2.4e-7 * imax, id,
                           "worst relative difference %.2g, images %.2g of the maximum", tr, tdiff / imax);
            free(it);
            free(ia);
            free(ib);
            free(w);
        }
    }

    /* grad-14: the same bits for any thread count (rotation with mosaic domains and the image model; panels that
     * move with a pixel list; structure factors, a table small and one large enough that the adjoint takes fewer
     * chunks than threads) */
    {
        nbg_param tp[NBG_NPARAMS + 16];
        int tn = 0;
        for (int p = 0; p < NBG_NPARAMS; ++p) {
            tp[tn++] = p;
        }
        nbgi_test_still(&e);
        e.mosaic = 0.3;
        e.mosaic_domains = 3;
        e.phi0 = 1, e.osc = 1, e.phisteps = 2;
        e.scale = 1.3;
        e.bg[0] = 2, e.bg[1] = 0.5, e.bg[2] = -0.25;
        thread_invariance("grad-14-threads-rotation", &e, tp, tn);

        nbgi_test_still(&e);
        nbg_panel pan[4];
        nbg_panel_motion mot[4];
        memset(mot, 0, sizeof mot);
        for (int q = 0; q < 4; ++q) {
            memset(&pan[q], 0, sizeof pan[q]);
            pan[q].fpixels = 40;
            pan[q].spixels = 30;
            pan[q].fast[0] = 1;
            pan[q].slow[1] = 1;
            pan[q].origin[0] = e.pixel * (q % 2) * 44;
            pan[q].origin[1] = e.pixel * (q / 2) * 34;
            pan[q].group = q;
            snprintf(pan[q].name, sizeof pan[q].name, "p%d", q);
        }
        e.panels = pan;
        e.npanels = 4;
        e.motions = mot;
        e.nmotions = 4;
        uint32_t list[2400];
        long nl = 0;
        for (uint32_t i = 0; i < 4800; i += 2) {
            list[nl++] = i; /* every other pixel of the four panels: runs of one pixel */
        }
        int pn = 0;
        nbg_param pp[32];
        const char *pnames[] = {"a", "rotx", "rotz", "Na", "distance", "beam_fast", "det_rotz", "scale", "bg"};
        for (int j = 0; j < 9; ++j) {
            pp[pn++] = nbg_param_from_name(pnames[j]);
        }
        for (int q = 0; q < 4; ++q) {
            pp[pn++] = NBG_P_MOTION(q, 0);
            pp[pn++] = NBG_P_MOTION(q, 5);
        }
        thread_invariance("grad-14-threads-panels", &e, pp, pn);
        e.pixels = list;
        e.npixels_list = nl;
        thread_invariance("grad-14-threads-panels-list", &e, pp, pn);

        for (int big = 0; big < 2; ++big) {
            const int H = big ? 60 : 3;
            nbg_hkl hkl = {-H, H, -H, H, -H, H, NULL, 0};
            const size_t nF = (size_t)(2 * H + 1) * (2 * H + 1) * (2 * H + 1);
            hkl.F = malloc(nF * sizeof(double));
            if (hkl.F == NULL) {
                nbgi_test_check(0, "grad-14-threads-F", "out of memory");
                break;
            }
            for (size_t i = 0; i < nF; ++i) {
                hkl.F[i] = 50 + 40 * sin(1.7 * (double)i);
            }
            hkl.nrefl = (long)nF;
            nbgi_test_still(&e);
            e.hkl = &hkl;
            e.fpixels = e.spixels = 48;
            nbg_param fp[NBG_NPARAMS + 8];
            int fn = 0;
            for (int p = 0; p < NBG_NPARAMS; ++p) {
                if (p != NBG_P_MOSAIC && p != nbg_param_from_name("spindle_tilt1") &&
                    p != nbg_param_from_name("spindle_tilt2")) {
                    fp[fn++] = p; /* a still without mosaic domains: every other parameter */
                }
            }
            /* the F entries of the table's centre (h, k, l near 0), which the image's spots reach */
            const long mid = ((long)H * (2 * H + 1) + H) * (2 * H + 1) + H;
            for (int d = -3; d <= 3; ++d) {
                fp[fn++] = NBG_P_F(mid + d);
            }
            thread_invariance(big ? "grad-14-threads-F-large" : "grad-14-threads-F", &e, fp, fn);
            free(hkl.F);
        }
        nbgi_test_still(&e); /* e pointed at this block's table, panels and list */
    }

    /* grad-15: the orientation offsets where the misset angles lock (roty = 90 deg: rotx and rotz turn the crystal
     * about the same axis, one parameter lost); the offsets are three independent rotations there, and exact */
    {
        nbgi_test_still(&e);
        e.misset[0] = 10, e.misset[1] = 90, e.misset[2] = -20;
        e.orient[0] = 0.05, e.orient[1] = -0.03, e.orient[2] = 0.02;
        gradcheck("grad-15-orient-gimbal", &e, "orient_x,orient_y,orient_z", 1);
        const nbg_param tp[5] = {nbg_param_from_name("rotx"), nbg_param_from_name("rotz"),
                                 nbg_param_from_name("orient_x"), nbg_param_from_name("orient_y"),
                                 nbg_param_from_name("orient_z")};
        nbg_report rr;
        nbg_describe(ctx, &e, &rr);
        const size_t np = (size_t)rr.fpixels * rr.spixels;
        double *T = malloc(sizeof(double) * 5 * np);
        float *im = malloc(sizeof(float) * np);
        const int rc = T != NULL && im != NULL ? nbg_simulate_jvp(ctx, &e, tp, 5, T, im, np) : NBG_ENOMEM;
        double G[25] = {0}; /* the tangents' Gram matrix */
        for (int a = 0; rc == NBG_OK && a < 5; ++a) {
            for (int b = 0; b < 5; ++b) {
                for (size_t i = 0; i < np; ++i) {
                    G[5 * a + b] += T[a * np + i] * T[b * np + i];
                }
            }
        }
        const double cos_mis = fabs(G[1]) / sqrt(G[0] * G[6]);
        double cos_ori = 0; /* the largest |cos| between two offsets' tangents */
        for (int a = 2; a < 5; ++a) {
            for (int b = a + 1; b < 5; ++b) {
                cos_ori = fmax(cos_ori, fabs(G[5 * a + b]) / sqrt(G[6 * a] * G[6 * b]));
            }
        }
        nbgi_test_check(rc == NBG_OK && cos_mis > 0.999999 && cos_ori < 0.9 && G[12] > 0 && G[18] > 0 && G[24] > 0,
                       "grad-15-orient-independent", "at roty = 90 the tangents of rotx and rotz are parallel (|cos| "
                       "%.9f), the offsets' are not (largest |cos| %.3f)", cos_mis, cos_ori);
        free(T);
        free(im);
        nbgi_test_still(&e);
    }

    /* grad-16: the beam's direction away from zero (where the first tilt's axis is turned by the second), with
     * divergence, dispersion and a polarized beam; the report's beam turned by the tilts' angle */
    {
        nbgi_test_still(&e);
        e.hdivrange = e.vdivrange = 0.3;
        e.hdivsteps = e.vdivsteps = 2;
        e.dispersion = 0.5;
        e.dispsteps = 2;
        e.polarization = 0.9;
        nbg_report r0, r1;
        nbg_describe(ctx, &e, &r0);
        e.beam_tilt[0] = 0.4, e.beam_tilt[1] = -0.3;
        nbg_describe(ctx, &e, &r1);
        gradcheck("grad-16-beam-tilt", &e, "beam_tilt1,beam_tilt2,distance,rotx", 1);
        const double c = r0.beam[0] * r1.beam[0] + r0.beam[1] * r1.beam[1] + r0.beam[2] * r1.beam[2];
        const double ang = acos(fmin(1, c)) * 180 / M_PI, want = acos(cos(0.4 * M_PI / 180) * cos(0.3 * M_PI / 180)) *
                                                                  180 / M_PI;
        int same_det = 1;
        for (int i = 0; i < 3; ++i) {
            same_det &= r0.pix0[i] == r1.pix0[i] && r0.fdet[i] == r1.fdet[i] && r0.odet[i] == r1.odet[i];
        }
        nbgi_test_check(fabs(ang - want) < 1e-9 && same_det, "grad-16-beam-turned", "the report's beam turned by "
                        "%.9f deg (%.9f for tilts 0.4, -0.3 about perpendicular axes), the detector where it was: %s", ang,
                        want, same_det ? "yes" : "no");
        nbgi_test_still(&e);
    }

    /* grad-17: the spectrum's shift and width (spectrum_shift, spectrum_scale) on a source file's spectrum of five
     * wavelengths (a Gaussian's quantiles about 1 A), away from their defaults, with the crystal as a -mat matrix
     * (whose lambda dependence the spectrum must not touch) and as a cell; the shift moves every wavelength and not
     * the crystal: the image with shift d equals the image with every source's wavelength moved by d */
    {
        static const double dl_q[5] = {-0.0084, -0.0035, 0, 0.0035, 0.0084};
        nbg_source srcs[5];
        for (int i = 0; i < 5; ++i) {
            srcs[i].pos[0] = -10, srcs[i].pos[1] = 0.001 * i, srcs[i].pos[2] = 0;
            srcs[i].lambda = 1 + dl_q[i];
        }
        nbgi_test_still(&e);
        e.sources = srcs;
        e.nsources = 5;
        e.spectrum_shift = 0.002, e.spectrum_scale = 1.3;
        gradcheck("grad-17-spectrum-cell", &e, "spectrum_shift,spectrum_scale,orient_x,a", 1);
        /* the same crystal as a -mat matrix (a* b* c* times lambda, file order) */
        nbg_report rs;
        nbg_describe(ctx, &e, &rs);
        e.has_cell = 0, e.has_mat = 1;
        for (int i = 0; i < 3; ++i) {
            for (int j = 0; j < 3; ++j) e.mat[3 * i + j] = rs.recip_vectors[3 * j + i] * e.lambda;
        }
        e.misset[0] = e.misset[1] = e.misset[2] = 0;
        gradcheck("grad-17-spectrum-mat", &e, "spectrum_shift,spectrum_scale,lambda,orient_y", 1);
        /* the shift is the beam's alone: the image with shift 0.002 A is the image of the sources moved by it */
        float *i1 = malloc(sizeof(float) * npix), *i2 = malloc(sizeof(float) * npix);
        e.spectrum_scale = 1;
        const int ok1 = i1 != NULL && nbg_simulate(ctx, &e, i1, npix, NULL) == NBG_OK;
        for (int i = 0; i < 5; ++i) srcs[i].lambda += 0.002;
        e.spectrum_shift = 0;
        const int ok2 = i2 != NULL && nbg_simulate(ctx, &e, i2, npix, NULL) == NBG_OK;
        double md = 0, mx = 0;
        for (size_t p = 0; ok1 && ok2 && p < npix; ++p) {
            md = fmax(md, fabs(i1[p] - i2[p]));
            mx = fmax(mx, fabs(i2[p]));
        }
        nbgi_test_check(ok1 && ok2 && mx > 0 && md <= 1e-5 * mx, "grad-17-shift-is-the-beam",
                        "shift 0.002 A vs the sources moved by 0.002 A (-mat crystal): max |diff| %.3g of max %.3g",
                        md, mx);
        free(i1), free(i2);
        nbgi_test_still(&e);
    }

    /* grad-18: a region of interest and a mask cost what they leave (the CPU kernels skip groups of lanes with no
     * pixel rendered) and change nothing: the ROI and mask experiment's image equals the whole one's on its pixels
     * (0 elsewhere), its gradient equals the whole one's with the weights zero outside, and its tangents the
     * whole one's on its pixels -- bit for bit */
    {
        nbgi_test_still(&e);
        e.fpixels = e.spixels = 64;
        e.misset[0] = 10, e.misset[1] = 5;
        const size_t n = 64 * 64;
        uint8_t *mask = malloc(n);
        float *iw = malloc(sizeof(float) * n), *ir = malloc(sizeof(float) * n), *w = malloc(sizeof(float) * n),
              *wr = malloc(sizeof(float) * n);
        double *tw = malloc(sizeof(double) * 3 * n), *tr = malloc(sizeof(double) * 3 * n);
        int rc = mask && iw && ir && w && wr && tw && tr ? NBG_OK : NBG_ENOMEM;
        nbg_experiment er = e;
        er.roi[0] = 19, er.roi[1] = 50, er.roi[2] = 3, er.roi[3] = 60;
        for (size_t i = 0; rc == NBG_OK && i < n; ++i) {
            const int f = (int)(i % 64), s = (int)(i / 64);
            mask[i] = !(s % 20 < 6 || (f >= 30 && f < 38));
            w[i] = (float)(0.5 + 0.4 * sin(0.37 * (double)i));
            const int act = f >= 19 && f <= 50 && s >= 3 && s <= 60 && mask[i];
            wr[i] = act ? w[i] : 0;
        }
        er.mask = mask;
        const nbg_param tp[3] = {NBG_P_A, NBG_P_DISTANCE, NBG_P_ROTY};
        nbg_param fp[NBG_NPARAMS];
        int nfp = 0;
        for (int j = 0; j < nall; ++j) {
            if (all[j] != NBG_P_MOSAIC) { /* (no mosaic domains) */
                fp[nfp++] = all[j];
            }
        }
        double gw[NBG_NPARAMS], gr[NBG_NPARAMS];
        if (rc == NBG_OK) rc = nbg_simulate_grad(ctx, &e, wr, fp, nfp, gw, iw, n, NULL);
        if (rc == NBG_OK) rc = nbg_simulate_grad(ctx, &er, w, fp, nfp, gr, ir, n, NULL);
        int same_img = rc == NBG_OK, same_g = rc == NBG_OK, same_t = rc == NBG_OK;
        long nact = 0;
        for (size_t i = 0; rc == NBG_OK && i < n; ++i) {
            const int act = wr[i] != 0;
            nact += act;
            same_img &= act ? ir[i] == iw[i] : ir[i] == 0;
        }
        for (int j = 0; rc == NBG_OK && j < nfp; ++j) {
            same_g &= gr[j] == gw[j];
        }
        if (rc == NBG_OK) rc = nbg_simulate_jvp(ctx, &e, tp, 3, tw, iw, n);
        if (rc == NBG_OK) rc = nbg_simulate_jvp(ctx, &er, tp, 3, tr, ir, n);
        for (size_t i = 0; rc == NBG_OK && i < 3 * n; ++i) {
            same_t &= wr[i % n] != 0 ? tr[i] == tw[i] : tr[i] == 0;
        }
        nbgi_test_check(rc == NBG_OK && nact > 500 && nact < 1500 && same_img && same_g && same_t, "grad-18-roi-mask",
                        "an ROI and a mask (%ld of %zu pixels): image %s, %d gradients %s, 3 tangent images %s (%s)",
                        nact, n, same_img ? "the whole image's on them, 0 elsewhere" : "DIFFER", nfp,
                        same_g ? "the whole image's with weights 0 outside, bit for bit" : "DIFFER",
                        same_t ? "the whole one's on them" : "DIFFER", rc == NBG_OK ? "ok" : nbg_errmsg(ctx));
        free(mask), free(iw), free(ir), free(w), free(wr), free(tw), free(tr);
        nbgi_test_still(&e);
    }

    /* grad-19: the detector turned about its own frame (det_tau) as DIALS's Tau1-3 turn it: the placed plane's
     * point nearest the sample stays in the turned plane; tau1 alone turns fast and slow about the normal; tau2
     * alone turns slow and the normal about fast; tau3 alone turns fast and the normal about slow; all three
     * compose as R(s0, t3) R(f0, t2) R(n0, t1) with the axes as placed */
    {
        nbgi_test_still(&e);
        e.convention = NBG_CONV_XDS;
        e.det_rot[0] = 4, e.det_rot[1] = -2, e.Xbeam = 3, e.Ybeam = 2;
        nbg_report r0, r1;
        const double t[3] = {7, -5, 3};
        const int ok0 = nbg_describe(ctx, &e, &r0) == NBG_OK;
        const double *f0 = r0.fdet, *s0 = r0.sdet, *n0 = r0.odet;
        double P0[3], wmax = 0;
        for (int i = 0; i < 3; ++i) {
            P0[i] = r0.close_distance / 1000 * n0[i];
        }
        for (int k = 0; ok0 && k < 4; ++k) {
            nbg_experiment et = e;
            for (int j = 0; j < 3; ++j) {
                et.det_tau[j] = k == 3 || k == j ? t[j] : 0;
            }
            if (nbg_describe(ctx, &et, &r1) != NBG_OK) {
                wmax = INFINITY;
                break;
            }
            /* the expected frame: the placed vectors turned by the rotations in order */
            double v[4][3];
            for (int i = 0; i < 3; ++i) {
                v[0][i] = f0[i], v[1][i] = s0[i], v[2][i] = n0[i], v[3][i] = r0.pix0[i] - P0[i];
            }
            const double *ax[3] = {n0, f0, s0};
            for (int j = 0; j < 3; ++j) {
                for (int q = 0; q < 4; ++q) {
                    nbgi_rotate_axis(v[q], ax[j], et.det_tau[j] * M_PI / 180, v[q]);
                }
            }
            for (int i = 0; i < 3; ++i) {
                wmax = fmax(wmax, fabs(r1.fdet[i] - v[0][i]));
                wmax = fmax(wmax, fabs(r1.sdet[i] - v[1][i]));
                wmax = fmax(wmax, fabs(r1.odet[i] - v[2][i]));
                wmax = fmax(wmax, fabs(r1.pix0[i] - (P0[i] + v[3][i])) / (r0.close_distance / 1000));
            }
            /* the axis each single turn is about stays */
            if (k < 3) {
                const double *keep = k == 0 ? r1.odet : k == 1 ? r1.fdet : r1.sdet;
                const double *was = ax[k];
                for (int i = 0; i < 3; ++i) {
                    wmax = fmax(wmax, fabs(keep[i] - was[i]));
                }
            }
        }
        /* the point the plane turned about (the placed plane's nearest to the sample) lies in the turned plane */
        nbg_experiment et = e;
        memcpy(et.det_tau, t, sizeof t);
        const int ok1 = nbg_describe(ctx, &et, &r1) == NBG_OK;
        double dc = 0;
        for (int i = 0; i < 3; ++i) {
            dc += (P0[i] - r1.pix0[i]) * r1.odet[i] * 1000;
        }
        dc = ok1 ? fabs(dc) : INFINITY;
        nbgi_test_check(ok0 && ok1 && wmax < 1e-14 && dc < 1e-12, "grad-19-tau-frame", "det_tau turns the placed "
                        "frame about its own normal, fast and slow axes in order through its point nearest the "
                        "sample: max difference %.2g; that point %.2g mm off the turned plane", wmax, dc);
        nbgi_test_still(&e);
    }

    /* grad-12: unsupported modes say so */
    e.oversample_omega = 1;
    nbgi_test_check(nbg_simulate_grad(ctx, &e, dl, all, nall, g1, img2, npix, NULL) == NBG_EUNSUP,
                   "grad-12-unsupported", "-oversample_omega is refused: %s", nbg_errmsg(ctx));
    free(img);
    free(img2);
    free(dl);
    free(obs);
    nbg_ctx_destroy(ctx);
    return nbgi_test_summary();
}
