/*
 * bench-flops.c -- the run bench/flops.sh counts under valgrind: heavy256's forward (bench/cases.h) on the rows
 * 120-135 (a region of interest: every group of lanes in it computed, the rest skipped), one thread.
 *
 *   bench-flops d|f      prints the samples computed (pixels x steps)
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
    const int fl = argc > 1 && argv[1][0] == 'f';
    if (nbg_ctx_create(&ctx, NBG_BACKEND_CPU, fl ? NBG_FLOAT : NBG_DOUBLE, 1) != NBG_OK) {
        return 1;
    }
    float *img = malloc(sizeof(float) * 256 * 256);
    if (img == NULL || nbg_simulate(ctx, &e, img, 256 * 256, &r) != NBG_OK) {
        return 1;
    }
    printf("%.0f\n", 256.0 * 16 * r.steps);
    free(img);
    nbg_ctx_destroy(ctx);
    return 0;
}
