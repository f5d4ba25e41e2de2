/*
 * main.c -- the nbgrad program: subcommand dispatch.
 *
 *   nbgrad [simulate] <nanoBragg flags>     render images
 */
#include "cli.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void usage_main(FILE *out);

static int cmd_simulate(int argc, char **argv, int first)
{
    nbg_cli c;
    nbg_cli_init(&c);
    nbg_ctx *ctx = NULL;
    int ok = 0;
    float *img = NULL;
    if (nbg_ctx_create(&ctx, NBG_BACKEND_CPU, NBG_DOUBLE, 0) != NBG_OK) {
        fprintf(stderr, "nbgrad: error: cannot create a context\n");
        return 1;
    }
    if (!nbg_cli_parse(ctx, &c, argc, argv, first)) {
        goto done;
    }
    if (c.help) {
        nbg_cli_usage(stdout);
        ok = 1;
        goto done;
    }
    nbg_ctx_destroy(ctx);
    ctx = NULL;
    const int rc = nbg_ctx_create(&ctx, c.backend, c.precision, c.threads);
    if (rc != NBG_OK) {
        fprintf(stderr, "nbgrad: error: cannot use the %s backend: %s\n",
                c.backend == NBG_BACKEND_CUDA ? "cuda" : "requested", nbg_strerror(rc));
        goto done;
    }
    if (c.backend == NBG_BACKEND_AUTO && nbg_ctx_backend(ctx) == NBG_BACKEND_CPU) {
        printf("no usable GPU: running on the CPU\n");
    }
    if (!nbg_cli_load(ctx, &c)) {
        goto done;
    }
    nbg_report r;
    if (nbg_describe(ctx, &c.e, &r) != NBG_OK) {
        fprintf(stderr, "nbgrad: error: %s\n", nbg_errmsg(ctx));
        goto done;
    }
    if (c.mask != NULL && (c.mask_f != r.fpixels || c.mask_s != r.spixels)) {
        fprintf(stderr, "nbgrad: error: the mask is %dx%d pixels but the detector is %dx%d\n", c.mask_f, c.mask_s,
                r.fpixels, r.spixels);
        goto done;
    }
    nbg_cli_print_setup(&c, &r);
    const size_t npix = (size_t)r.fpixels * (size_t)r.spixels;
    img = malloc(sizeof(float) * npix);
    if (img == NULL) {
        fprintf(stderr, "nbgrad: error: out of memory for a %dx%d image\n", r.fpixels, r.spixels);
        goto done;
    }
    if (nbg_simulate(ctx, &c.e, img, npix, &r) != NBG_OK) {
        fprintf(stderr, "nbgrad: error: %s\n", nbg_errmsg(ctx));
        goto done;
    }
    if (r.interp_fallbacks > 0) {
        printf("WARNING: %ld interpolation windows left the HKL table; nearest neighbours used there\n",
               r.interp_fallbacks);
    }
    printf("solid angle subtended by detector = %g steradian\n", r.solid_angle);
    ok = nbg_cli_write_outputs(ctx, &c, &r, img);
done:
    free(img);
    nbg_cli_free(&c);
    nbg_ctx_destroy(ctx);
    return ok ? 0 : 1;
}

void usage_main(FILE *out)
{
    fprintf(out, "nbgrad " NBG_VERSION " -- a differentiable nanoBragg\n"
                 "usage: nbgrad [simulate] <nanoBragg flags>   render images (nbgrad simulate -h for the flags)\n");
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        usage_main(stderr);
        return 1;
    }
    if (strcmp(argv[1], "-h") == 0 || strcmp(argv[1], "--help") == 0) {
        usage_main(stdout);
        printf("\n");
        nbg_cli_usage(stdout);
        return 0;
    }
    if (strcmp(argv[1], "simulate") == 0) {
        return cmd_simulate(argc, argv, 2);
    }
    return cmd_simulate(argc, argv, 1);
}
