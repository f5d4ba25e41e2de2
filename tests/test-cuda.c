/*
 * test-cuda.c -- the CUDA backend against the CPU backend: every golden case's experiment rendered on both
 * (double: max difference <= 1e-9 of the image maximum; float: correlation >= 0.99999), gradients against the CPU
 * gradients (relative 1e-8 in double), repeated calls bit-identical, the gradient check on the GPU.  Where there
 * is no GPU (or no CUDA build) it says SKIP with the reason.
 */
#include "testutil.h" /* first: it sets _GNU_SOURCE */
#include "nbgrad.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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
    e->fpixels = e->spixels = 128;
    e->polarization = 0.9;
}

static double corr(const float *a, const float *b, size_t n)
{
    double ma = 0, mb = 0, sab = 0, saa = 0, sbb = 0;
    for (size_t i = 0; i < n; ++i) {
        ma += a[i];
        mb += b[i];
    }
    ma /= (double)n;
    mb /= (double)n;
    for (size_t i = 0; i < n; ++i) {
        sab += (a[i] - ma) * (b[i] - mb);
        saa += (a[i] - ma) * (a[i] - ma);
        sbb += (b[i] - mb) * (b[i] - mb);
    }
    return sab / sqrt(saa * sbb);
}

int main(void)
{
    nbg_ctx *gpu = NULL, *gpuf = NULL, *cpu = NULL;
    const int rc = nbg_ctx_create(&gpu, NBG_BACKEND_CUDA, NBG_DOUBLE, 0);
    if (rc != NBG_OK) {
        nbg_test_skip("cuda", "no GPU here (%s): the CUDA tests run where one is present", nbg_strerror(rc));
        return nbg_test_summary();
    }
    nbg_ctx_create(&gpuf, NBG_BACKEND_CUDA, NBG_FLOAT, 0);
    nbg_ctx_create(&cpu, NBG_BACKEND_CPU, NBG_DOUBLE, 0);
    nbg_experiment cfg[5];
    const char *names[5] = {"triclinic", "mosaic-phi", "sampling", "shapes-round", "detector"};
    for (int c = 0; c < 5; ++c) {
        base(&cfg[c]);
    }
    cfg[1].mosaic = 0.5, cfg[1].mosaic_domains = 5, cfg[1].phi0 = 1, cfg[1].osc = 2, cfg[1].phisteps = 3;
    cfg[2].oversample = 2, cfg[2].thick = 100, cfg[2].thick_abs = 50, cfg[2].thicksteps = 3;
    cfg[2].hdivrange = cfg[2].vdivrange = 0.5, cfg[2].hdivsteps = cfg[2].vdivsteps = 3;
    cfg[2].dispersion = 1, cfg[2].dispsteps = 3;
    cfg[3].shape = NBG_SHAPE_ROUND;
    cfg[4].det_rot[0] = 5, cfg[4].det_rot[1] = 3, cfg[4].twotheta = 10, cfg[4].convention = NBG_CONV_XDS;
    for (int c = 0; c < 5; ++c) {
        nbg_report r;
        nbg_describe(cpu, &cfg[c], &r);
        const size_t n = (size_t)r.fpixels * r.spixels;
        float *a = malloc(n * 4), *b = malloc(n * 4), *bf = malloc(n * 4), *w = malloc(n * 4), *b2 = malloc(n * 4);
        for (size_t i = 0; i < n; ++i) {
            w[i] = (float)(0.5 + 0.5 * cos(0.1 * (double)i));
        }
        nbg_simulate(cpu, &cfg[c], a, n, NULL);
        nbg_simulate(gpu, &cfg[c], b, n, NULL);
        nbg_simulate(gpuf, &cfg[c], bf, n, NULL);
        double mx = 0, md = 0;
        for (size_t i = 0; i < n; ++i) {
            mx = fmax(mx, a[i]);
            md = fmax(md, fabs((double)a[i] - b[i]));
        }
        char id[96];
        /* both images are stored as float: 1e-9 of the maximum, plus one float rounding of the brightest pixel
         * (the device contracts multiply-adds, so values a rounding apart may round to neighbouring floats) */
        snprintf(id, sizeof id, "cuda-forward-%s-double", names[c]);
        nbg_test_check(mx > 0 && md <= 1e-9 * mx + 1.2e-7 * mx, id, "max |gpu - cpu| = %.3g of max %.4g", md / mx, mx);
        snprintf(id, sizeof id, "cuda-forward-%s-float", names[c]);
        nbg_test_check(corr(a, bf, n) >= 0.99999, id, "correlation %.9f", corr(a, bf, n));
        nbg_grad gc, gg, gg2;
        memset(&gc, 0, sizeof gc);
        memset(&gg, 0, sizeof gg);
        memset(&gg2, 0, sizeof gg2);
        nbg_param_mask m = NBG_MASK_ALL;
        if (cfg[c].mosaic <= 0) {
            m &= ~NBG_MASK(NBG_P_MOSAIC);
        }
        nbg_simulate_grad(cpu, &cfg[c], w, m, &gc, a, n, NULL);
        int grc = nbg_simulate_grad(gpu, &cfg[c], w, m, &gg, b, n, NULL);
        nbg_simulate_grad(gpu, &cfg[c], w, m, &gg2, b2, n, NULL);
        double worst = 0, gmax = 0;
        for (int p = 0; p < NBG_NPARAMS; ++p) {
            gmax = fmax(gmax, fabs(gc.g[p]));
        }
        for (int p = 0; p < NBG_NPARAMS; ++p) {
            worst = fmax(worst, fabs(gg.g[p] - gc.g[p]) / fmax(fabs(gc.g[p]), 1e-6 * gmax));
        }
        snprintf(id, sizeof id, "cuda-grad-%s", names[c]);
        nbg_test_check(grc == NBG_OK && worst <= 1e-8, id, "worst relative difference to the CPU %.3g (%s)", worst,
                       grc == NBG_OK ? "ok" : nbg_errmsg(gpu));
        snprintf(id, sizeof id, "cuda-repeat-%s", names[c]);
        nbg_test_check(memcmp(gg.g, gg2.g, sizeof gg.g) == 0 && memcmp(b, b2, n * 4) == 0, id,
                       "two calls give bit-identical gradients and images");
        free(a);
        free(b);
        free(bf);
        free(w);
        free(b2);
    }
    nbg_gradcheck_result res[NBG_NPARAMS + 1];
    int nres = 0;
    base(&cfg[0]);
    cfg[0].fpixels = cfg[0].spixels = 64;
    nbg_gradcheck(gpu, &cfg[0], NBG_MASK_ALL & ~NBG_MASK(NBG_P_MOSAIC), 1e-6, 1, res, &nres);
    for (int i = 0; i < nres; ++i) {
        char id[96];
        snprintf(id, sizeof id, "cuda-gradcheck-%s", nbg_param_name(res[i].param));
        nbg_test_check(res[i].pass, id, "adjoint=%.10g numeric=%.10g relerr=%.2g %s", res[i].adjoint, res[i].numeric,
                       res[i].relerr, res[i].reason);
    }
    nbg_ctx_destroy(gpu);
    nbg_ctx_destroy(gpuf);
    nbg_ctx_destroy(cpu);
    return nbg_test_summary();
}
