/*
 * bench-flops.c -- the run bench/flops.sh counts under valgrind: heavy256's forward (bench/cases.h) on the rows
 * 120-135 (a region of interest: every group of lanes in it computed, the rest skipped), one thread; or, with g,
 * its gradient in double, every scalar parameter at once (bench-grad's call: the mosaic spread with the rest).
 *
 *   bench-flops d|f|g    prints the samples computed (pixels x steps)
 */
#include "cases.h"
#include "nbgrad.h"

#include <stdio.h>
#include <stdlib.h>

int main(int argc, char **argv)
{
    nbg_experiment e;
    nbg_ctx *ctx;
    nbg_report r;
    nbgi_bench_case("heavy256", &e);
    e.roi[0] = 0, e.roi[1] = 255, e.roi[2] = 120, e.roi[3] = 135;
    const int fl = argc > 1 && argv[1][0] == 'f', grad = argc > 1 && argv[1][0] == 'g';
    if (nbg_ctx_create(&ctx, NBG_BACKEND_CPU, fl ? NBG_FLOAT : NBG_DOUBLE, 1) != NBG_OK) {
        return 1;
    }
    float *img = malloc(sizeof(float) * 256 * 256), *w = malloc(sizeof(float) * 256 * 256);
    if (img == NULL || w == NULL) {
        return 1;
    }
    nbg_param ids[NBG_NPARAMS];
    double g[NBG_NPARAMS];
    int nids = 0;
    for (int p = 0; p < NBG_NPARAMS; ++p) {
        ids[nids++] = p; /* heavy256 has 10 mosaic domains: the spread too */
    }
    for (int i = 0; i < 256 * 256; ++i) {
        w[i] = 1.0f;
    }
    const int rc = grad ? nbg_simulate_grad(ctx, &e, w, ids, nids, g, img, 256 * 256, &r)
                        : nbg_simulate(ctx, &e, img, 256 * 256, &r);
    if (rc != NBG_OK) {
        return 1;
    }
    printf("%.0f\n", 256.0 * 16 * r.steps);
    free(img);
    free(w);
    nbg_ctx_destroy(ctx);
    return 0;
}
