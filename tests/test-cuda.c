/*
 * test-cuda.c -- the CUDA backend against the CPU backend.
 *
 * Built twice:
 *   test-cuda       with the real backend (nvcc): runs where a GPU is present; elsewhere it checks that asking
 *                   for CUDA is a clear NBG_ENODEV and that auto falls back to the CPU, and SKIPs the rest;
 *   test-cuda-emu   with the backend compiled for the CPU against tests/cudaemu/cuda_runtime.h (NBG_CUDA_EMU):
 *                   the same kernels, launches and reductions, run everywhere (CI has no GPU).
 *
 * Checks (prefix cuda- or cuda-emu-):
 *   nodevice-*        CUDA without a device is NBG_ENODEV; auto falls back to the CPU (emulator: NBG_CUDA_EMU_NODEV)
 *   golden-<id>-double  every golden case's experiment (parsed by the program's flag parser) through the CUDA
 *                     backend in double against the CPU backend: max |gpu - cpu| <= 1e-9 of the image maximum,
 *                     plus one float rounding of that maximum (both are stored as float)
 *   golden-<id>-float   the CUDA float image: correlation with the CPU double image >= 0.99999, and the reference
 *                     criteria of the golden README against <golden>/images/<id>.float.bin (correlation >=
 *                     0.99999, max |diff| <= 1e-4 of the maximum, sums within 1e-5)
 *   forward-*, grad-*, grad-float-*, image-*, repeat-*   five configurations (triclinic, mosaic with phi, sampling,
 *                     round shape, rotated detector): gradients against the CPU (relative 1e-8 in double, 1e-3 in
 *                     float), the gradient call's image against the forward image (1e-9 of the maximum in
 *                     double, 1e-6 in float), repeated calls bit-identical
 *   shapes            a context reused across image sizes (buffers grow and are reused) gives the CPU's images
 *   panels-*          a multi-panel detector (panels of different sizes, one turned): images and gradients as the CPU's
 *   list-*            a pixel list (nbg_experiment.pixels), on the single detector and on the panels: the listed
 *                     pixels as the CPU's (the others 0), gradients as the CPU's with the same list
 *   tangents-*        the tangent kernel (nbg_simulate_tangents) against the CPU's: every scalar parameter on the
 *                     five configurations and a float context, moved panels with the image model, and on a pixel
 *                     list; tangent images to 1e-9 of their maxima, the double image to 1e-12
 *   cpu-reverse-*     a gradient call the device's adjoint cannot hold (structure factors, 120 crystal matrices)
 *                     runs its reverse pass on the CPU: the CPU context's gradients and image bit for bit
 *   refine            nbg_refine on the CUDA backend (forward, adjoint and tangent kernels) against the same fit
 *                     on the CPU: both reach the truth of a noise-free image (1e-5), and each other's values (to
 *                     1e-9 emulated, 1e-5 on a GPU; not in a GSL=0 build, which has no refinement)
 *   gradcheck-*       the finite-difference gradient check run on the CUDA backend
 *   sanitizer-<tool>  (GPU only) this program rerun on a few cases under compute-sanitizer's memcheck, racecheck
 *                     and synccheck, when compute-sanitizer is on the PATH: no error reported
 *
 * The emulator runs a launch on one CPU thread, so test-cuda-emu uses smaller images for its own configurations
 * (the 65 golden cases take about 15 s).  NBG_GOLDEN_CASES (comma-separated ids) selects golden cases.
 */
#include "testutil.h" /* first: it sets _GNU_SOURCE */
#include "cli.h"
#include "nbgrad.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

#ifdef NBG_CUDA_EMU
#define PFX "cuda-emu"
#define NPIX 48
#else
#define PFX "cuda"
#define NPIX 128
#endif

/* Set in the child that compute-sanitizer runs: a few cases, no gradient check (the tools are slow). */
static int sanitized;

/* max |a - b| relative to max |a|; *mx receives max |a|. */
static double maxrel(const float *a, const float *b, size_t n, double *mx)
{
    double m = 0, d = 0;
    for (size_t i = 0; i < n; ++i) {
        m = fmax(m, fabs((double)a[i]));
        d = fmax(d, fabs((double)a[i] - (double)b[i]));
    }
    *mx = m;
    return m > 0 ? d / m : INFINITY;
}

static double sum(const float *a, size_t n)
{
    double s = 0;
    for (size_t i = 0; i < n; ++i) {
        s += a[i];
    }
    return s;
}

/* ------------------------------------------------------------------------------------------------------------ */
/* every golden case through both backends                                                                       */

static void golden_case(nbg_ctx *cpu, nbg_ctx *gpu, nbg_ctx *gpuf, const char *golden, const char *id, char *args)
{
    char *argv[256];
    char *store[256];
    int argc = 0, nstore = 0;
    argv[argc++] = (char *)"nbgrad";
    for (char *save = NULL, *tok = strtok_r(args, " \t", &save); tok != NULL && argc < 254;
         tok = strtok_r(NULL, " \t", &save)) {
        if (strncmp(tok, "@data/", 6) == 0) {
            const size_t len = strlen(golden) + strlen(tok) + 8;
            char *p = malloc(len);
            snprintf(p, len, "%s/data/%s", golden, tok + 6);
            argv[argc++] = store[nstore++] = p;
        } else {
            argv[argc++] = tok;
        }
    }
    argv[argc++] = (char *)"-nodump"; /* as test-golden: no structure-factor cache is written or read */
    argv[argc] = NULL;
    char cid[160];
    snprintf(cid, sizeof cid, PFX "-golden-%s", id);
    nbgi_cli c;
    nbgi_cli_init(&c);
    /* the parser and loader print their own errors; what they print here goes to the log with the FAIL line */
    if (!nbgi_cli_parse(cpu, &c, argc, argv, 1) || !nbgi_cli_load(cpu, &c)) {
        nbgi_test_check(0, cid, "the case's flags did not parse or load");
        nbgi_cli_free(&c);
        for (int i = 0; i < nstore; ++i) {
            free(store[i]);
        }
        return;
    }
    nbg_report r;
    nbg_describe(cpu, &c.e, &r);
    const size_t n = (size_t)r.fpixels * r.spixels;
    float *a = malloc(n * 4), *b = malloc(n * 4), *bf = malloc(n * 4), *ref = NULL;
    const int rca = nbg_simulate(cpu, &c.e, a, n, NULL);
    const int rcb = nbg_simulate(gpu, &c.e, b, n, NULL);
    const int rcf = nbg_simulate(gpuf, &c.e, bf, n, NULL);
    char name[200];
    snprintf(name, sizeof name, "%s-double", cid);
    if (rca != NBG_OK || rcb != NBG_OK || rcf != NBG_OK) {
        nbgi_test_check(0, name, "simulate failed: cpu %d, cuda %d (%s), cuda float %d (%s)", rca, rcb,
                       nbg_errmsg(gpu), rcf, nbg_errmsg(gpuf));
    } else {
        double mx;
        const double d = maxrel(a, b, n, &mx);
        /* 1e-9 of the maximum plus one float rounding of it: the device contracts multiply-adds, so values a
         * rounding apart may round to neighbouring floats */
        nbgi_test_check(mx > 0 && d <= 1e-9 + 1.2e-7, name, "max |gpu - cpu| = %.3g of max %.6g", d, mx);
        snprintf(name, sizeof name, "%s-float", cid);
        char path[4400];
        snprintf(path, sizeof path, "%s/images/%s.float.bin", golden, id);
        size_t bytes = 0;
        ref = (float *)nbgi_test_read_file(path, &bytes);
        const double cc = nbgi_test_corr(a, bf, n);
        if (ref == NULL || bytes != n * 4) {
            nbgi_test_check(0, name, "reference %s missing or of %zu bytes (want %zu)", path, bytes, n * 4);
        } else {
            double mref;
            const double cref = nbgi_test_corr(ref, bf, n), dref = maxrel(ref, bf, n, &mref);
            const double sref = sum(ref, n), sout = sum(bf, n);
            const double srel = fabs(sout - sref) / fmax(fabs(sref), 1e-300);
            nbgi_test_check(mref > 0 && cc >= 0.99999 && cref >= 0.99999 && dref <= 1e-4 && srel <= 1e-5, name,
                           "corr(cpu)=%.9f vs reference: corr=%.9f maxrel=%.3g sumrel=%.3g", cc, cref, dref, srel);
        }
    }
    free(a);
    free(b);
    free(bf);
    free(ref);
    nbgi_cli_free(&c);
    for (int i = 0; i < nstore; ++i) {
        free(store[i]);
    }
}

static void golden_cases(nbg_ctx *cpu, nbg_ctx *gpu, nbg_ctx *gpuf)
{
    char golden_abs[4096];
    const char *golden = nbgi_test_golden_dir();
    if (golden != NULL && realpath(golden, golden_abs) != NULL) {
        golden = golden_abs; /* the cases run in a temporary directory */
    }
    char path[4200];
    snprintf(path, sizeof path, "%s/cases.tsv", golden != NULL ? golden : "");
    size_t len = 0;
    char *text = golden != NULL ? nbgi_test_read_file(path, &len) : NULL;
    if (text == NULL) {
        nbgi_test_skip(PFX "-golden", "(golden folder not found; set NBG_GOLDEN)");
        return;
    }
    const char *only = getenv("NBG_GOLDEN_CASES");
    if (sanitized && (only == NULL || only[0] == '\0')) {
        only = "triclinic_misset,mosaic_domains,mask,hkl_interpolate_forced,roi";
    }
    /* run where the program would: in a fresh directory (nanoBragg reads a Fdump.bin it finds there) */
    char cwd[4096], tmpbuf[4096];
    char *tmp = nbgi_test_mkdtemp("nbg-test-cuda", tmpbuf, sizeof tmpbuf);
    if (tmp == NULL || getcwd(cwd, sizeof cwd) == NULL || chdir(tmp) != 0) {
        nbgi_test_check(0, PFX "-golden", "cannot make and enter a temporary directory");
        free(text);
        return;
    }
    int ran = 0;
    for (char *save = NULL, *line = strtok_r(text, "\n", &save); line != NULL; line = strtok_r(NULL, "\n", &save)) {
        char *t1 = strchr(line, '\t');
        char *t2 = t1 != NULL ? strchr(t1 + 1, '\t') : NULL;
        if (line[0] == '#' || t2 == NULL) {
            continue;
        }
        *t1 = '\0';
        if (!nbgi_test_selected(only, line)) {
            continue;
        }
        golden_case(cpu, gpu, gpuf, golden, line, t2 + 1);
        ++ran;
    }
    free(text);
    if (chdir(cwd) != 0) {
        nbgi_test_check(0, PFX "-golden", "cannot return to %s", cwd);
    }
    nbgi_test_rmtree(tmp);
    nbgi_test_check(ran > 0, PFX "-golden-selection", "%d golden cases run", ran);
}

/* ------------------------------------------------------------------------------------------------------------ */
/* gradients                                                                                                     */

static void base(nbg_experiment *e)
{
    nbg_experiment_default(e);
    e->has_cell = 1;
    const double cell[6] = {70, 80, 90, 75, 85, 95};
    memcpy(e->cell, cell, sizeof cell);
    e->misset[0] = 10, e->misset[1] = 5, e->misset[2] = 3;
    e->default_F = 100;
    e->Na = e->Nb = e->Nc = 5;
    e->lambda = 1;
    e->distance = 100;
    e->fpixels = e->spixels = NPIX;
    e->polarization = 0.9;
}

/* Every scalar parameter but skip (-1: none), in id order, into ids; returns how many. */
static int scalars_but(nbg_param skip, nbg_param *ids)
{
    int n = 0;
    for (int p = 0; p < NBG_NPARAMS; ++p) {
        if (p != skip) {
            ids[n++] = p;
        }
    }
    return n;
}

/* nbg_simulate_grad for the listed parameters, the gradients spread out by id: a scalar's into g[p] (NBG_NPARAMS
 * entries, 0 for those not listed), a panel motion's NBG_P_MOTION(k, c) into dmot[6 k + c]. */
static int grad_ids(nbg_ctx *c, const nbg_experiment *e, const float *w, const nbg_param *ids, int nids, double *g,
                    double *dmot, float *img, size_t n)
{
    double buf[NBG_NPARAMS + 64];
    memset(g, 0, sizeof(double) * NBG_NPARAMS);
    memset(buf, 0, sizeof buf);
    const int rc = nbg_simulate_grad(c, e, w, ids, nids, buf, img, n, NULL);
    for (int j = 0; j < nids; ++j) {
        if (ids[j] >= 0 && ids[j] < NBG_NPARAMS) {
            g[ids[j]] = buf[j];
        } else if (ids[j] >= NBG_P_MOTION0 && dmot != NULL) {
            dmot[ids[j] - NBG_P_MOTION0] = buf[j];
        }
    }
    return rc;
}

static double grad_diff(const double *got, const double *want)
{
    double worst = 0, gmax = 0;
    for (int p = 0; p < NBG_NPARAMS; ++p) {
        gmax = fmax(gmax, fabs(want[p]));
    }
    for (int p = 0; p < NBG_NPARAMS; ++p) {
        worst = fmax(worst, fabs(got[p] - want[p]) / fmax(fabs(want[p]), 1e-6 * gmax));
    }
    return gmax > 0 ? worst : INFINITY;
}

/* The five configurations the gradient and tangent checks run: triclinic, mosaic with phi, sampling (nanoBragg's
 * sensor among it), the round shape, a rotated detector with the physical sensor model. */
static const char *const config_names[5] = {"triclinic", "mosaic-phi", "sampling", "shapes-round", "detector"};

static void five_configs(nbg_experiment cfg[5])
{
    for (int c = 0; c < 5; ++c) {
        base(&cfg[c]);
    }
    cfg[1].mosaic = 0.5, cfg[1].mosaic_domains = 5, cfg[1].phi0 = 1, cfg[1].osc = 2, cfg[1].phisteps = 3;
    cfg[2].oversample = 2, cfg[2].thick = 100, cfg[2].thick_abs = 50, cfg[2].thicksteps = 3;
    cfg[2].hdivrange = cfg[2].vdivrange = 0.5, cfg[2].hdivsteps = cfg[2].vdivsteps = 3;
    cfg[2].dispersion = 1, cfg[2].dispsteps = 3;
    cfg[3].shape = NBG_SHAPE_ROUND;
    cfg[4].det_rot[0] = 5, cfg[4].det_rot[1] = 3, cfg[4].twotheta = 10, cfg[4].convention = NBG_CONV_XDS;
    cfg[4].thick = 100, cfg[4].thick_abs = 50, cfg[4].thicksteps = 3, cfg[4].sensor_model = NBG_SENSOR_PHYSICAL;
}

static void gradients(nbg_ctx *cpu, nbg_ctx *gpu, nbg_ctx *gpuf)
{
    nbg_experiment cfg[5];
    five_configs(cfg);
    for (int c = 0; c < (sanitized ? 2 : 5); ++c) {
        nbg_report r;
        nbg_describe(cpu, &cfg[c], &r);
        const size_t n = (size_t)r.fpixels * r.spixels;
        float *a = malloc(n * 4), *b = malloc(n * 4), *bf = malloc(n * 4), *w = malloc(n * 4), *b2 = malloc(n * 4);
        float *fa = malloc(n * 4), *ff = malloc(n * 4);
        for (size_t i = 0; i < n; ++i) {
            w[i] = (float)(0.5 + 0.5 * cos(0.1 * (double)i));
        }
        nbg_simulate(cpu, &cfg[c], a, n, NULL);
        nbg_simulate(gpu, &cfg[c], b, n, NULL);
        nbg_simulate(gpuf, &cfg[c], bf, n, NULL);
        double mx;
        const double d = maxrel(a, b, n, &mx);
        char id[96];
        snprintf(id, sizeof id, PFX "-forward-%s-double", config_names[c]);
        nbgi_test_check(mx > 0 && d <= 1e-9 + 1.2e-7, id, "max |gpu - cpu| = %.3g of max %.4g", d, mx);
        snprintf(id, sizeof id, PFX "-forward-%s-float", config_names[c]);
        const double cf = nbgi_test_corr(a, bf, n);
        nbgi_test_check(cf >= 0.99999, id, "correlation %.9f", cf);

        double gc[NBG_NPARAMS], gg[NBG_NPARAMS], gg2[NBG_NPARAMS], gf[NBG_NPARAMS];
        nbg_param m[NBG_NPARAMS];
        /* unset (NAN) or zero mosaic spread: no mosaic gradient */
        const int nm = scalars_but(cfg[c].mosaic > 0 ? -1 : NBG_P_MOSAIC, m);
        grad_ids(cpu, &cfg[c], w, m, nm, gc, NULL, a, n);
        const int grc = grad_ids(gpu, &cfg[c], w, m, nm, gg, NULL, b, n);
        grad_ids(gpu, &cfg[c], w, m, nm, gg2, NULL, b2, n);
        const int frc = grad_ids(gpuf, &cfg[c], w, m, nm, gf, NULL, fa, n);
        snprintf(id, sizeof id, PFX "-grad-%s", config_names[c]);
        const double worst = grad_diff(gg, gc);
        nbgi_test_check(grc == NBG_OK && worst <= 1e-8, id, "worst relative difference to the CPU %.3g (%s)", worst,
                       grc == NBG_OK ? "ok" : nbg_errmsg(gpu));
        /* the float adjoint: float arithmetic per sample, double accumulation */
        snprintf(id, sizeof id, PFX "-grad-float-%s", config_names[c]);
        const double fworst = grad_diff(gf, gc);
        nbgi_test_check(frc == NBG_OK && fworst <= 1e-3, id, "worst relative difference to the CPU double %.3g (%s)",
                       fworst, frc == NBG_OK ? "ok" : nbg_errmsg(gpuf));
        /* the gradient call's image is the forward image of the same precision (in float to 1e-6 of the maximum:
         * the adjoint evaluates the round and gauss lattice factors through their gradient forms, which round
         * differently in float) */
        nbg_simulate(gpuf, &cfg[c], ff, n, NULL);
        double m1, m2;
        const double d1 = maxrel(b, b2, n, &m1), d2 = maxrel(ff, fa, n, &m2);
        nbg_simulate(gpu, &cfg[c], b2, n, NULL);
        const double d0 = maxrel(b2, b, n, &m1);
        snprintf(id, sizeof id, PFX "-image-%s", config_names[c]);
        nbgi_test_check(d0 <= 1e-9 + 1.2e-7 && d2 <= 1e-6, id,
                       "gradient-call image vs forward: double %.3g, float %.3g of the maximum", d0, d2);
        snprintf(id, sizeof id, PFX "-repeat-%s", config_names[c]);
        nbgi_test_check(memcmp(gg, gg2, sizeof gg) == 0 && d1 == 0, id,
                       "two gradient calls give bit-identical gradients and images");
        free(a);
        free(b);
        free(bf);
        free(w);
        free(b2);
        free(fa);
        free(ff);
    }
}

/* A crystal of blocks (the mosaic domains turned by their own angles, under the spread's domains and phi steps): the
 * turns' gradients and tangents on the device against the CPU's (the turns reach the kernels through the crystal
 * vectors and their tangents, which the host builds for both). */
static void domain_turns(nbg_ctx *cpu, nbg_ctx *gpu)
{
    nbg_experiment cfg[5];
    five_configs(cfg);
    nbg_experiment *e = &cfg[1];
    double turns[15] = {0, 0, 0, 0.3, -0.2, 0.1, -0.25, 0.15, 0.35, 0.1, 0.4, -0.3, 0.2, 0.2, 0.2};
    e->domain_rot = turns;
    e->ndomain_rot = 5;
    const nbg_param ids[5] = {NBG_P_DOMAIN(1, 0), NBG_P_DOMAIN(2, 1), NBG_P_DOMAIN(4, 2), NBG_P_A, NBG_P_MOSAIC};
    nbg_report r;
    nbg_describe(cpu, e, &r);
    const size_t n = (size_t)r.fpixels * r.spixels;
    float *w = malloc(n * 4), *a = malloc(n * 4), *b = malloc(n * 4);
    double *ta = malloc(sizeof(double) * n * 5), *tb = malloc(sizeof(double) * n * 5);
    for (size_t i = 0; i < n; ++i) {
        w[i] = (float)(0.5 + 0.5 * cos(0.1 * (double)i));
    }
    double gc[5] = {0}, gg[5] = {0};
    const int rc1 = nbg_simulate_grad(cpu, e, w, ids, 5, gc, a, n, NULL);
    const int rc2 = nbg_simulate_grad(gpu, e, w, ids, 5, gg, b, n, NULL);
    double worst = 0;
    for (int j = 0; j < 5; ++j) {
        worst = fmax(worst, fabs(gg[j] - gc[j]) / fmax(fabs(gc[j]), 1e-300));
    }
    nbgi_test_check(rc1 == NBG_OK && rc2 == NBG_OK && worst <= 1e-8 && gc[0] != 0 && gc[2] != 0,
                    PFX "-grad-domain-turns", "d1.rot_x, d2.rot_y, d4.rot_z, a, mosaic: worst relative difference to "
                    "the CPU %.3g (%s)", worst, rc2 == NBG_OK ? "ok" : nbg_errmsg(gpu));
    const int rc3 = nbg_simulate_jvp(cpu, e, ids, 5, ta, a, n);
    const int rc4 = nbg_simulate_jvp(gpu, e, ids, 5, tb, b, n);
    double tmax = 0, tw = 0;
    for (size_t i = 0; i < 5 * n; ++i) {
        tmax = fmax(tmax, fabs(ta[i]));
        tw = fmax(tw, fabs(ta[i] - tb[i]));
    }
    nbgi_test_check(rc3 == NBG_OK && rc4 == NBG_OK && tmax > 0 && tw <= 1e-9 * tmax, PFX "-jvp-domain-turns",
                    "the turns' tangents on the device: max difference %.3g of max %.3g", tw, tmax);
    free(w);
    free(a);
    free(b);
    free(ta);
    free(tb);
}

/* One context across image sizes: its device buffers grow, and are reused when smaller. */
static void shapes(nbg_ctx *cpu, nbg_ctx *gpu)
{
    const int sizes[4] = {NPIX, NPIX / 2, NPIX + 17, NPIX / 3};
    double worst = 0;
    for (int k = 0; k < 4; ++k) {
        nbg_experiment e;
        base(&e);
        e.fpixels = sizes[k];
        e.spixels = sizes[(k + 1) % 4];
        const size_t n = (size_t)e.fpixels * e.spixels;
        float *a = malloc(n * 4), *b = malloc(n * 4);
        nbg_simulate(cpu, &e, a, n, NULL);
        const int rc = nbg_simulate(gpu, &e, b, n, NULL);
        double mx;
        const double d = rc == NBG_OK ? maxrel(a, b, n, &mx) : INFINITY;
        worst = fmax(worst, mx > 0 ? d : INFINITY);
        free(a);
        free(b);
    }
    nbgi_test_check(worst <= 1e-9 + 1.2e-7, PFX "-shapes", "4 image sizes on one context: worst %.3g of the maximum",
                   worst);
}

/* The worst relative difference of 3 groups' 18 motion gradients, dg against dc (each relative to the larger of the
 * two, floored at 1e-9 of *dmax, the largest |dc|). */
static double motion_diff(const double dc[18], const double dg[18], double *dmax)
{
    double worst = 0;
    *dmax = 0;
    for (int j = 0; j < 18; ++j) {
        *dmax = fmax(*dmax, fabs(dc[j]));
    }
    for (int j = 0; j < 18; ++j) {
        worst = fmax(worst, fabs(dg[j] - dc[j]) / fmax(fmax(fabs(dc[j]), fabs(dg[j])), 1e-9 * *dmax));
    }
    return worst;
}

/* A multi-panel detector (six panels with gaps in the plane, one of them turned by 90 deg): the CUDA image (each
 * thread finds its panel) equals the CPU's, double and float, and so do the gradients, detector ones included (the
 * panels' gradients carried to the plane's vectors per thread). */
static void panels(nbg_ctx *cpu, nbg_ctx *gpu, nbg_ctx *gpuf)
{
    nbg_experiment e;
    base(&e);
    e.det_rot[0] = 3, e.det_rot[1] = -2, e.thick = 100, e.thicksteps = 2;
    nbg_panel pan[6];
    memset(pan, 0, sizeof pan);
    const int pf = NPIX / 4, ps = NPIX / 6;
    for (int k = 0; k < 6; ++k) {
        pan[k].fpixels = pf + k; /* panels of different sizes: the offsets are not a multiple of one size */
        pan[k].spixels = ps;
        pan[k].fast[0] = 1;
        pan[k].slow[1] = 1;
        pan[k].origin[0] = e.pixel * (k % 3) * (NPIX / 3 + 1);
        pan[k].origin[1] = e.pixel * (k / 3) * (ps + 3);
    }
    /* panel 5 turned by 90 deg in the plane: fast along the plane's slow, slow along -fast */
    pan[5].fast[0] = 0, pan[5].fast[1] = 1, pan[5].slow[0] = -1, pan[5].slow[1] = 0;
    pan[5].origin[0] += e.pixel * ps;
    e.panels = pan;
    e.npanels = 6;
    nbg_report r;
    const int drc = nbg_describe(cpu, &e, &r);
    const size_t n = r.npix;
    float *a = malloc(n * 4), *b = malloc(n * 4), *bf = malloc(n * 4), *w = malloc(n * 4);
    for (size_t i = 0; i < n; ++i) {
        w[i] = (float)(0.5 + 0.5 * cos(0.1 * (double)i));
    }
    nbg_simulate(cpu, &e, a, n, NULL);
    const int rc = nbg_simulate(gpu, &e, b, n, NULL);
    nbg_simulate(gpuf, &e, bf, n, NULL);
    double mx = 0;
    const double d = rc == NBG_OK ? maxrel(a, b, n, &mx) : INFINITY;
    nbgi_test_check(drc == NBG_OK && rc == NBG_OK && mx > 0 && d <= 1e-9 + 1.2e-7, PFX "-panels-forward-double",
                   "6 panels, %zu pixels: max |gpu - cpu| = %.3g of max %.4g (%s)", n, d, mx,
                   rc == NBG_OK ? "ok" : nbg_errmsg(gpu));
    const double cf = nbgi_test_corr(a, bf, n);
    nbgi_test_check(cf >= 0.99999, PFX "-panels-forward-float", "correlation %.9f", cf);
    double gc[NBG_NPARAMS], gg[NBG_NPARAMS];
    nbg_param m[NBG_NPARAMS];
    const int nm = scalars_but(NBG_P_MOSAIC, m);
    grad_ids(cpu, &e, w, m, nm, gc, NULL, a, n);
    const int grc = grad_ids(gpu, &e, w, m, nm, gg, NULL, b, n);
    const double worst = grad_diff(gg, gc);
    nbgi_test_check(grc == NBG_OK && worst <= 1e-8 && gc[NBG_P_DISTANCE] != 0, PFX "-panels-grad",
                   "worst relative difference to the CPU %.3g (%s)", worst, grc == NBG_OK ? "ok" : nbg_errmsg(gpu));

    /* panel motions (3 groups of 2 panels, moved): the image, and each group's 6 gradients from the panel-aligned
     * blocks, as the CPU's; on the whole detector and on a pixel list (every 3rd pixel) */
    nbg_panel_motion mot[3] = {{{0.2, -0.1, 0.3}, {0.3, -0.2, 1.0}},
                               {{-0.15, 0.05, 0}, {0, 0.4, -1.5}},
                               {{0.1, 0.1, -0.2}, {-0.5, 0, 2.0}}};
    for (int k = 0; k < 6; ++k) {
        pan[k].group = k / 2;
    }
    e.motions = mot;
    e.nmotions = 3;
    uint32_t *list = malloc(sizeof(uint32_t) * (n / 3 + 1));
    long nl = 0;
    for (size_t i = 0; i < n; i += 3) {
        list[nl++] = (uint32_t)i;
    }
    for (int v = 0; v < 2; ++v) {
        e.pixels = v ? list : NULL;
        e.npixels_list = v ? nl : 0;
        double dc[18], dg[18];
        /* a, distance and every component of every group's motion */
        nbg_param mm[20] = {NBG_P_A, NBG_P_DISTANCE};
        for (int j = 0; j < 18; ++j) {
            mm[2 + j] = NBG_P_MOTION(j / 6, j % 6);
        }
        const int crc = grad_ids(cpu, &e, w, mm, 20, gc, dc, a, n);
        const int mrc = grad_ids(gpu, &e, w, mm, 20, gg, dg, b, n);
        double dmax, imx = 0;
        const double mworst = fmax(grad_diff(gg, gc), motion_diff(dc, dg, &dmax));
        const double di = crc == NBG_OK && mrc == NBG_OK ? maxrel(a, b, n, &imx) : INFINITY;
        char id[64];
        snprintf(id, sizeof id, PFX "-panels-motion-grad%s", v ? "-list" : "");
        nbgi_test_check(crc == NBG_OK && mrc == NBG_OK && dmax > 0 && mworst <= 1e-8 && di <= 1e-9 + 1.2e-7, id,
                       "moved panels: image max |gpu - cpu| %.3g of %.4g; 18 motion gradients (and a, distance) "
                       "worst relative difference %.3g (%s)", di, imx, mworst,
                       mrc == NBG_OK ? "ok" : nbg_errmsg(gpu));
    }
    free(list);

    /* the same panels fixed in the lab frame, where the plane put them (then moved by the motions): the beam's
     * direction, whose tangent turns each lab-frame panel by its own, and the motions, as the CPU's */
    {
        nbg_panel lab[6];
        e.pixels = NULL;
        e.npixels_list = 0;
        const int lrc = nbgi_test_panels_lab(cpu, &e, lab);
        e.panels = lab;
        e.panel_frame = NBG_PANELS_LAB;
        e.motions = mot;
        e.nmotions = 3;
        e.beam_tilt[0] = 0.2, e.beam_tilt[1] = -0.3;
        double dc[18], dg[18];
        nbg_param mm[9] = {NBG_P_BEAM_TILT1, NBG_P_BEAM_TILT2, NBG_P_A, NBG_P_ORIENT_Y};
        for (int j = 0; j < 5; ++j) {
            mm[4 + j] = NBG_P_MOTION(j % 3, j);
        }
        memset(dc, 0, sizeof dc);
        memset(dg, 0, sizeof dg);
        const int crc = lrc == NBG_OK ? grad_ids(cpu, &e, w, mm, 9, gc, dc, a, n) : lrc;
        const int mrc = grad_ids(gpu, &e, w, mm, 9, gg, dg, b, n);
        double dmax, imx = 0;
        const double lworst = fmax(grad_diff(gg, gc), motion_diff(dc, dg, &dmax));
        const double di = crc == NBG_OK && mrc == NBG_OK ? maxrel(a, b, n, &imx) : INFINITY;
        nbgi_test_check(crc == NBG_OK && mrc == NBG_OK && gc[NBG_P_BEAM_TILT1] != 0 && gc[NBG_P_BEAM_TILT2] != 0 &&
                            dmax > 0 && lworst <= 1e-8 && di <= 1e-9 + 1.2e-7,
                        PFX "-panels-lab-beam-tilt", "lab-frame panels, beam turned: image max |gpu - cpu| %.3g of %.4g; "
                        "beam_tilt1/2, a, orient_y and 5 motion components, worst relative difference %.3g (%s)", di,
                        imx, lworst, mrc == NBG_OK ? "ok" : nbg_errmsg(gpu));
    }
    free(a);
    free(b);
    free(bf);
    free(w);
}

/* The tangent kernel (nbg_simulate_tangents: forward mode, in double on the device whatever the context's
 * precision) against the CPU's: every scalar parameter (more than one pass of NBG_JVP_MAX directions) on the five
 * configurations of gradients(), on a float context, and on moved panels with a pixel list; each tangent image to
 * 1e-9 of its maximum, the double image to 1e-12 of its maximum, the float image equal. */
static double tangent_diff(const double *tc, const double *tg, int nt, size_t nw, int *nonzero)
{
    double worst = 0;
    *nonzero = 0;
    for (int j = 0; j < nt; ++j) {
        double mx = 0, d = 0;
        for (size_t i = 0; i < nw; ++i) {
            mx = fmax(mx, fabs(tc[(size_t)j * nw + i]));
            d = fmax(d, fabs(tg[(size_t)j * nw + i] - tc[(size_t)j * nw + i]));
        }
        *nonzero += mx > 0;
        worst = fmax(worst, mx > 0 ? d / mx : d > 0 ? INFINITY : 0);
    }
    return worst;
}

static void tangents_case(nbg_ctx *cpu, nbg_ctx *gpu, const nbg_experiment *e, const nbg_param *m, int nm,
                          const char *name)
{
    nbg_report r;
    nbg_describe(cpu, e, &r);
    const size_t n = r.npix, nw = e->pixels != NULL ? (size_t)e->npixels_list : n;
    double *tc = malloc(sizeof(double) * nw * (size_t)nm), *tg = malloc(sizeof(double) * nw * (size_t)nm);
    double *dc = malloc(sizeof(double) * n), *dg = malloc(sizeof(double) * n);
    float *fc = malloc(sizeof(float) * n), *fg = malloc(sizeof(float) * n);
    for (size_t i = 0; i < n; ++i) {
        dg[i] = fg[i] = 9; /* every unlisted pixel must come back 0 */
    }
    const int crc = nbg_simulate_tangents(cpu, e, m, nm, tc, fc, dc, n);
    const int grc = nbg_simulate_tangents(gpu, e, m, nm, tg, fg, dg, n);
    int nonzero = 0;
    double worst = INFINITY, di = INFINITY, dmax = 0;
    long fdiff = 0;
    if (crc == NBG_OK && grc == NBG_OK) {
        worst = tangent_diff(tc, tg, nm, nw, &nonzero);
        di = 0;
        for (size_t i = 0; i < n; ++i) {
            dmax = fmax(dmax, fabs(dc[i]));
            di = fmax(di, fabs(dg[i] - dc[i]));
            fdiff += fg[i] != fc[i];
        }
        di = dmax > 0 ? di / dmax : INFINITY;
    }
    char id[96];
    snprintf(id, sizeof id, PFX "-tangents-%s", name);
    nbgi_test_check(crc == NBG_OK && grc == NBG_OK && nonzero >= 2 && worst <= 1e-9 && di <= 1e-12 && fdiff == 0,
                    id, "%d directions (%d not zero): worst |gpu - cpu| %.3g of each tangent image's maximum; double "
                    "image %.3g of its maximum, float image different at %ld pixels (%s)", nm, nonzero,
                    worst, di, fdiff, grc == NBG_OK ? "ok" : nbg_errmsg(gpu));
    free(tc);
    free(tg);
    free(dc);
    free(dg);
    free(fc);
    free(fg);
}

static void tangents(nbg_ctx *cpu, nbg_ctx *gpu, nbg_ctx *gpuf)
{
    nbg_experiment cfg[5];
    five_configs(cfg);
    for (int c = 0; c < (sanitized ? 1 : 5); ++c) {
        nbg_param m[NBG_NPARAMS];
        const int nm = scalars_but(cfg[c].mosaic > 0 ? -1 : NBG_P_MOSAIC, m);
        tangents_case(cpu, gpu, &cfg[c], m, nm, config_names[c]);
        if (c == 0) {
            tangents_case(cpu, gpuf, &cfg[c], m, nm, "float-context");
        }
    }
    if (sanitized) {
        return;
    }
    /* moved panels (3 groups of 2, one panel turned) with the image model, on a pixel list: the panels' own motion
     * tangents, a, distance, the scale and the background */
    nbg_experiment e;
    base(&e);
    e.det_rot[0] = 3, e.det_rot[1] = -2;
    e.scale = 1.5, e.bg[0] = 2;
    nbg_panel pan[6];
    memset(pan, 0, sizeof pan);
    const int pf = NPIX / 4, ps = NPIX / 6;
    for (int k = 0; k < 6; ++k) {
        pan[k].fpixels = pf + k;
        pan[k].spixels = ps;
        pan[k].fast[0] = 1;
        pan[k].slow[1] = 1;
        pan[k].origin[0] = e.pixel * (k % 3) * (NPIX / 3 + 1);
        pan[k].origin[1] = e.pixel * (k / 3) * (ps + 3);
        pan[k].group = k / 2;
    }
    pan[5].fast[0] = 0, pan[5].fast[1] = 1, pan[5].slow[0] = -1, pan[5].slow[1] = 0;
    pan[5].origin[0] += e.pixel * ps;
    nbg_panel_motion mot[3] = {{{0.2, -0.1, 0.3}, {0.3, -0.2, 1.0}},
                               {{-0.15, 0.05, 0}, {0, 0.4, -1.5}},
                               {{0.1, 0.1, -0.2}, {-0.5, 0, 2.0}}};
    e.panels = pan;
    e.npanels = 6;
    e.motions = mot;
    e.nmotions = 3;
    nbg_param mm[22] = {NBG_P_A, NBG_P_DISTANCE, NBG_P_SCALE, NBG_P_BG};
    for (int j = 0; j < 18; ++j) {
        mm[4 + j] = NBG_P_MOTION(j / 6, j % 6);
    }
    tangents_case(cpu, gpu, &e, mm, 22, "panels-motion");
    nbg_report r;
    nbg_describe(cpu, &e, &r);
    uint32_t *list = malloc(sizeof(uint32_t) * ((size_t)r.npix / 3 + 1));
    long nl = 0;
    for (size_t i = 0; i < r.npix; i += 3) {
        list[nl++] = (uint32_t)i;
    }
    e.pixels = list;
    e.npixels_list = nl;
    tangents_case(cpu, gpu, &e, mm, 22, "panels-motion-list");
    free(list);
}

/* A pixel list (every 3rd pixel and a block of neighbours): the CUDA kernels' thread-per-listed-pixel launch against
 * the CPU's runs, in double and float, on the single detector (with the image model) and on panels. */
static void pixel_list(nbg_ctx *cpu, nbg_ctx *gpu, nbg_ctx *gpuf)
{
    nbg_panel pan[2];
    memset(pan, 0, sizeof pan);
    for (int k = 0; k < 2; ++k) {
        pan[k].fpixels = NPIX / 2 - 3 * k;
        pan[k].spixels = NPIX / 3;
        pan[k].fast[0] = 1;
        pan[k].slow[1] = 1;
        pan[k].origin[0] = 0.1 * k * (NPIX / 2 + 2);
    }
    for (int v = 0; v < 2; ++v) {
        nbg_experiment e;
        base(&e);
        if (v == 0) {
            e.scale = 1.5, e.bg[0] = 2, e.bg[1] = 0.5;
        } else {
            e.panels = pan;
            e.npanels = 2;
        }
        nbg_report r;
        nbg_describe(cpu, &e, &r);
        const size_t n = r.npix;
        uint32_t *l = malloc(n * sizeof(uint32_t));
        long nl = 0;
        for (size_t i = 0; i < n; ++i) {
            if (i % 3 == 0 || (i > n / 2 && i < n / 2 + 40)) {
                l[nl++] = (uint32_t)i;
            }
        }
        e.pixels = l;
        e.npixels_list = nl;
        float *a = malloc(n * 4), *b = malloc(n * 4), *bf = malloc(n * 4), *w = malloc(n * 4);
        for (size_t i = 0; i < n; ++i) {
            w[i] = (float)(0.5 + 0.5 * cos(0.1 * (double)i));
            b[i] = bf[i] = 9; /* every unlisted pixel must come back 0 */
        }
        const int rca = nbg_simulate(cpu, &e, a, n, NULL);
        const int rcb = nbg_simulate(gpu, &e, b, n, NULL);
        const int rcf = nbg_simulate(gpuf, &e, bf, n, NULL);
        double mx = 0;
        long zeros = 0;
        for (long t = 0, u = 0; t < (long)n; ++t) {
            if (u < nl && l[u] == (uint32_t)t) {
                ++u;
            } else {
                zeros += b[t] == 0 && bf[t] == 0;
            }
        }
        const double d = rca == NBG_OK && rcb == NBG_OK ? maxrel(a, b, n, &mx) : INFINITY;
        char id[96];
        snprintf(id, sizeof id, PFX "-list-%s-forward", v ? "panels" : "model");
        nbgi_test_check(d <= 1e-9 + 1.2e-7 && mx > 0 && rcf == NBG_OK && zeros == (long)n - nl &&
                            nbgi_test_corr(a, bf, n) >= 0.99999, id,
                       "%ld of %zu pixels: max |gpu - cpu| = %.3g of max %.4g; float correlation %.9f; %ld of %ld "
                       "unlisted pixels 0 (%s)", nl, n, d, mx, nbgi_test_corr(a, bf, n), zeros, (long)n - nl,
                       rcb == NBG_OK ? "ok" : nbg_errmsg(gpu));
        double gc[NBG_NPARAMS], gg[NBG_NPARAMS];
        nbg_param m[NBG_NPARAMS];
        const int nm = scalars_but(NBG_P_MOSAIC, m);
        grad_ids(cpu, &e, w, m, nm, gc, NULL, a, n);
        const int grc = grad_ids(gpu, &e, w, m, nm, gg, NULL, b, n);
        const double worst = grad_diff(gg, gc);
        const double di = grc == NBG_OK ? maxrel(a, b, n, &mx) : INFINITY;
        snprintf(id, sizeof id, PFX "-list-%s-grad", v ? "panels" : "model");
        nbgi_test_check(grc == NBG_OK && worst <= 1e-8 && di <= 1e-9 + 1.2e-7, id,
                       "worst relative difference to the CPU %.3g; image %.3g of the maximum (%s)", worst, di,
                       grc == NBG_OK ? "ok" : nbg_errmsg(gpu));
        free(a);
        free(b);
        free(bf);
        free(w);
        free(l);
    }
}

/* What the device's adjoint does not hold runs its reverse pass on the CPU (grad/grad.c): structure-factor
 * gradients, and more crystal-vector and wavelength gradients than NBGI_CUDA_MAXACC (here 12 phi steps x 10 domains
 * x 9 + 1 source): the gradients of a CUDA double context equal the CPU context's bit for bit. */
static void cpu_reverse(nbg_ctx *cpu, nbg_ctx *gpu)
{
    const int H = 4;
    nbg_hkl hkl = {-H, H, -H, H, -H, H, NULL, 0};
    const size_t nF = (size_t)(2 * H + 1) * (2 * H + 1) * (2 * H + 1);
    hkl.F = malloc(nF * sizeof(double));
    for (size_t i = 0; i < nF; ++i) {
        hkl.F[i] = 50 + 40 * sin(1.7 * (double)i);
    }
    hkl.nrefl = (long)nF;
    for (int v = 0; v < 2; ++v) {
        nbg_experiment e;
        base(&e);
        e.fpixels = e.spixels = NPIX / 2;
        nbg_param m[NBG_NPARAMS + 8];
        int nm = 0;
        m[nm++] = NBG_P_A;
        m[nm++] = NBG_P_DISTANCE;
        if (v == 0) {
            e.hkl = &hkl;
            const long mid = ((long)H * (2 * H + 1) + H) * (2 * H + 1) + H;
            for (int d = -3; d <= 3; ++d) {
                m[nm++] = NBG_P_F(mid + d);
            }
        } else {
            e.mosaic = 0.3, e.mosaic_domains = 10, e.phi0 = 0, e.osc = 1, e.phisteps = 12;
            m[nm++] = NBG_P_MOSAIC;
        }
        const size_t n = (size_t)e.fpixels * e.spixels;
        float *w = malloc(n * 4), *a = malloc(n * 4), *b = malloc(n * 4);
        for (size_t i = 0; i < n; ++i) {
            w[i] = (float)(0.5 + 0.5 * cos(0.1 * (double)i));
        }
        double gc[NBG_NPARAMS + 8], gg[NBG_NPARAMS + 8];
        const int crc = nbg_simulate_grad(cpu, &e, w, m, nm, gc, a, n, NULL);
        const int grc = nbg_simulate_grad(gpu, &e, w, m, nm, gg, b, n, NULL);
        int nonzero = 0; /* a, distance and (v = 0) the F entries the image's spots reach */
        for (int j = 0; j < nm; ++j) {
            nonzero += gc[j] != 0;
        }
        const int same = crc == NBG_OK && grc == NBG_OK && memcmp(gc, gg, sizeof(double) * (size_t)nm) == 0 &&
                         memcmp(a, b, n * sizeof(float)) == 0;
        nbgi_test_check(same && gc[0] != 0 && gc[1] != 0 && nonzero >= 3, v ? PFX "-cpu-reverse-many-matrices" : PFX "-cpu-reverse-F",
                        "%s: %d gradients (%d not zero) and the image as the CPU context's bit for bit: %s (%s)",
                        v ? "120 crystal matrices" : "7 structure factors, a and distance", nm, nonzero,
                        same ? "yes" : "no", grc == NBG_OK ? "ok" : nbg_errmsg(gpu));
        free(w);
        free(a);
        free(b);
    }
    free(hkl.F);
}

#ifndef NBG_NO_REFINE
/* A refinement on the device: nbg_refine's losses (the forward kernel), gradients (the adjoint) and Gauss-Newton
 * passes (the tangent kernel) on the CUDA backend, against the same fit on the CPU from the same start (cell and
 * orientation moved off a noise-free image): both reach the truth, and each other's values. */
static void refine_on_device(nbg_ctx *cpu, nbg_ctx *gpu)
{
    static const nbg_param p9[9] = {NBG_P_A,    NBG_P_B,    NBG_P_C,    NBG_P_ALPHA, NBG_P_BETA,
                                    NBG_P_GAMMA, NBG_P_ROTX, NBG_P_ROTY, NBG_P_ROTZ};
    nbg_experiment t;
    base(&t);
    const size_t n = (size_t)t.fpixels * t.spixels;
    float *obs = malloc(n * sizeof(float));
    nbg_simulate(cpu, &t, obs, n, NULL);
    double truth[9], v[2][9];
    int iters[2] = {0, 0}, rc[2];
    for (int j = 0; j < 9; ++j) {
        nbg_param_get(&t, p9[j], &truth[j]);
    }
    for (int b = 0; b < 2; ++b) {
        nbg_experiment e = t;
        e.cell[0] *= 1.002, e.cell[2] *= 0.998, e.cell[4] += 0.1, e.misset[1] += 0.1, e.misset[2] -= 0.05;
        nbg_refine_options o;
        nbg_refine_options_default(&o);
        nbg_refine_result r = {0};
        nbg_ctx *c = b ? gpu : cpu;
        rc[b] = nbg_refine(c, &e, obs, NULL, n, p9, 9, &o, &r);
        if (rc[b] != NBG_OK) {
            printf("    %s: %s\n", b ? "device" : "CPU", nbg_errmsg(c));
        }
        for (int j = 0; j < 9; ++j) {
            v[b][j] = rc[b] == NBG_OK ? r.value[j] : NAN;
        }
        iters[b] = r.iterations;
        nbg_refine_result_free(&r);
    }
    double dtruth = 0, dcpu = 0;
    for (int j = 0; j < 9; ++j) {
        dtruth = fmax(dtruth, fabs(v[1][j] - truth[j]) / fmax(fabs(truth[j]), 1));
        dcpu = fmax(dcpu, fabs(v[1][j] - v[0][j]) / fmax(fabs(v[0][j]), 1));
    }
    /* a GPU's arithmetic differs from the CPU's by rounding (contracted multiply-adds), which may move the
     * iteration the stopping rule stops at: there the two fits agree to the truth's tolerance; the emulated
     * device's to 1e-9 */
#ifdef NBG_CUDA_EMU
    const double tol = 1e-9;
#else
    const double tol = 1e-5;
#endif
    nbgi_test_check(rc[0] == NBG_OK && rc[1] == NBG_OK && dtruth <= 1e-5 && dcpu <= tol, PFX "-refine",
                    "cell and orientation from a moved start, %d iterations on the device (%d on the CPU): worst "
                    "relative error %.2g to the truth, %.2g to the CPU's fit", iters[1], iters[0], dtruth, dcpu);
    free(obs);
}
#endif

#ifndef NBG_CUDA_EMU
/* Reruns this program under compute-sanitizer's tools on a few cases (NBG_CUDA_SANITIZED=1 in the child). */
static void sanitizer(void)
{
    if (system("command -v compute-sanitizer >/dev/null 2>&1") != 0) {
        nbgi_test_skip(PFX "-sanitizer", "compute-sanitizer is not on the PATH");
        return;
    }
    char self[4096];
    const ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
    if (n <= 0) {
        nbgi_test_check(0, PFX "-sanitizer", "cannot find this program's path");
        return;
    }
    self[n] = '\0';
    const char *tools[3] = {"memcheck", "racecheck", "synccheck"};
    for (int t = 0; t < 3; ++t) {
        char cmd[8400], log[64], id[64];
        snprintf(log, sizeof log, "/tmp/nbg-sanitizer-%d-%s.log", (int)getpid(), tools[t]);
        snprintf(cmd, sizeof cmd,
                 "NBG_CUDA_SANITIZED=1 compute-sanitizer --tool %s --error-exitcode 99 '%s' > %s 2>&1", tools[t],
                 self, log);
        const int st = system(cmd);
        const int code = (st != -1 && WIFEXITED(st)) ? WEXITSTATUS(st) : -1;
        snprintf(id, sizeof id, PFX "-sanitizer-%s", tools[t]);
        if (!nbgi_test_check(code == 0, id, "compute-sanitizer --tool %s on a few cases: exit status %d%s", tools[t],
                            code, code == 99 ? " (errors reported)" : code == 1 ? " (checks failed)" : "")) {
            snprintf(cmd, sizeof cmd, "tail -n 40 %s", log);
            if (system(cmd) != 0) {
                printf("    (no log)\n");
            }
        }
        remove(log);
    }
}
#endif

int main(void)
{
    sanitized = getenv("NBG_CUDA_SANITIZED") != NULL;
    nbg_ctx *gpu = NULL, *gpuf = NULL, *cpu = NULL, *aut = NULL;
#ifdef NBG_CUDA_EMU
    setenv("NBG_CUDA_EMU_NODEV", "1", 1);
#endif
    int rc = nbg_ctx_create(&gpu, NBG_BACKEND_CUDA, NBG_DOUBLE, 0);
    if (rc != NBG_OK) {
        nbgi_test_check(rc == NBG_ENODEV && gpu == NULL, PFX "-nodevice-cuda",
                       "asking for CUDA without a device: %s (%d)", nbg_strerror(rc), rc);
        const int arc = nbg_ctx_create(&aut, NBG_BACKEND_AUTO, NBG_DOUBLE, 0);
        nbgi_test_check(arc == NBG_OK && nbg_ctx_backend(aut) == NBG_BACKEND_CPU, PFX "-nodevice-auto",
                       "auto without a device runs on the CPU");
        nbg_ctx_destroy(aut);
        aut = NULL;
#ifndef NBG_CUDA_EMU
        nbgi_test_skip(PFX, "no GPU here (%s): the CUDA tests run where one is present; test-cuda-emu runs the "
                           "same kernels on the CPU", nbg_strerror(rc));
        return nbgi_test_summary();
#endif
    } else {
#ifdef NBG_CUDA_EMU
        nbgi_test_check(0, PFX "-nodevice-cuda", "the emulator's no-device switch was ignored");
#endif
        nbg_ctx_destroy(gpu);
        gpu = NULL;
    }
#ifdef NBG_CUDA_EMU
    unsetenv("NBG_CUDA_EMU_NODEV");
#endif
    rc = nbg_ctx_create(&gpu, NBG_BACKEND_CUDA, NBG_DOUBLE, 0);
    nbg_ctx_create(&aut, NBG_BACKEND_AUTO, NBG_DOUBLE, 0);
    nbgi_test_check(rc == NBG_OK && nbg_ctx_backend(gpu) == NBG_BACKEND_CUDA && nbg_ctx_backend(aut) ==
                   NBG_BACKEND_CUDA, PFX "-device", "a CUDA context, and auto picks CUDA");
    nbg_ctx_destroy(aut);
    if (rc != NBG_OK) {
        return nbgi_test_summary();
    }
    nbg_ctx_create(&gpuf, NBG_BACKEND_CUDA, NBG_FLOAT, 0);
    nbg_ctx_create(&cpu, NBG_BACKEND_CPU, NBG_DOUBLE, 0);

    golden_cases(cpu, gpu, gpuf);
    gradients(cpu, gpu, gpuf);
    domain_turns(cpu, gpu);
    shapes(cpu, gpu);
    panels(cpu, gpu, gpuf);
    pixel_list(cpu, gpu, gpuf);
    tangents(cpu, gpu, gpuf);
    if (!sanitized) {
        cpu_reverse(cpu, gpu);
    }
#ifndef NBG_NO_REFINE
    if (!sanitized) {
        refine_on_device(cpu, gpu);
    }
#endif
    if (sanitized) {
        nbg_ctx_destroy(gpu);
        nbg_ctx_destroy(gpuf);
        nbg_ctx_destroy(cpu);
        return nbgi_test_summary();
    }

    nbg_gradcheck_result res[NBG_NPARAMS];
    nbg_param ids[NBG_NPARAMS];
    const int nids = scalars_but(NBG_P_MOSAIC, ids);
    int nres = 0;
    nbg_experiment e;
    base(&e);
    e.fpixels = e.spixels = NPIX / 2;
    e.phi0 = 1, e.osc = 0.5, e.phisteps = 2; /* a rotation, so that the spindle's tilts act */
    e.spindle_tilt[0] = 0.2;
    e.dispersion = 0.5, e.dispsteps = 2; /* a spectrum with a width, so that spectrum_scale acts */
    e.spectrum_shift = 0.001;
    if (nbg_gradcheck(gpu, &e, ids, nids, 1e-6, 1, res) == NBG_OK) {
        nres = nids;
    }
    nbgi_test_check(nres > 0, PFX "-gradcheck", "%d parameters checked", nres);
    for (int i = 0; i < nres; ++i) {
        char id[96];
        snprintf(id, sizeof id, PFX "-gradcheck-%s", nbg_param_name(res[i].param));
        nbgi_test_check(res[i].pass, id, "adjoint=%.10g numeric=%.10g relerr=%.2g %s", res[i].adjoint, res[i].numeric,
                       res[i].relerr, res[i].reason);
    }
    nbg_ctx_destroy(gpu);
    nbg_ctx_destroy(gpuf);
    nbg_ctx_destroy(cpu);
#ifndef NBG_CUDA_EMU
    sanitizer();
#endif
    return nbgi_test_summary();
}
