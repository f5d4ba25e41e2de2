/*
 * ci_gradcheck.c -- a gradient check to put in your CI: it checks nbgrad's adjoint against central finite
 * differences on your own experiment and fails (exit 1) if any parameter disagrees.  Copy it, put your
 * experiment in setup(), and run it after each build.  (The same check from the shell:
 * nbgrad gradcheck <your flags> -params all.)
 */
#include "nbgrad.h"

#include <stdio.h>
#include <string.h>

static void setup(nbg_experiment *e)
{
    nbg_experiment_default(e);
    e->has_cell = 1;
    const double cell[6] = {78.9, 78.9, 38.1, 90, 90, 90}; /* a lysozyme-like tetragonal cell */
    memcpy(e->cell, cell, sizeof cell);
    e->misset[0] = 12, e->misset[1] = -7, e->misset[2] = 31;
    e->default_F = 50;
    e->Na = e->Nb = 6;
    e->Nc = 9;
    e->lambda = 0.98;
    e->distance = 120;
    e->fpixels = e->spixels = 64;
    e->pixel = 0.172;
    e->oversample = 1;
    e->polarization = 0.99;
    e->mosaic = 0.2;
    e->mosaic_domains = 3;
}

int main(void)
{
    nbg_ctx *ctx;
    if (nbg_ctx_create(&ctx, NBG_BACKEND_CPU, NBG_DOUBLE, 0) != NBG_OK) {
        return 1;
    }
    nbg_experiment e;
    setup(&e);
    /* every scalar parameter (a list of names works too: nbg_params_parse(ctx, &e, "cell,orientation", ...)) */
    nbg_param params[NBG_NPARAMS];
    nbg_gradcheck_result res[NBG_NPARAMS];
    const int n = NBG_NPARAMS;
    for (int p = 0; p < n; ++p) {
        params[p] = p;
    }
    if (nbg_gradcheck(ctx, &e, params, n, 1e-6, 1, res) != NBG_OK) {
        printf("FAIL gradcheck could not run: %s\n", nbg_errmsg(ctx));
        return 1;
    }
    /* ZERO (nothing in this experiment depends on the parameter) is neither a pass nor a failure */
    int passed = 0, zero = 0;
    for (int i = 0; i < n; ++i) {
        printf("%s %s adjoint=%.10g numeric=%.10g relerr=%.2g%s%s\n",
               res[i].status == NBG_CHECK_PASS ? "PASS" : res[i].status == NBG_CHECK_ZERO ? "ZERO" : "FAIL",
               nbg_param_name(res[i].param), res[i].adjoint, res[i].numeric, res[i].relerr,
               res[i].reason[0] ? " # " : "", res[i].reason);
        passed += res[i].status == NBG_CHECK_PASS;
        zero += res[i].status == NBG_CHECK_ZERO;
    }
    printf("%d passed, %d failed, %d zero\n", passed, n - passed - zero, zero);
    nbg_ctx_destroy(ctx);
    return passed > 0 && passed + zero == n ? 0 : 1;
}
