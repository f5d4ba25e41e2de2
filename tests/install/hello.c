/*
 * hello.c -- a user's program against the installed library (tests/install/run.sh builds it with
 * `pkg-config --cflags --libs nbgrad`, and statically with --static): the version, a context, a small image.
 * Prints a PASS or FAIL line per check; exit status 1 on a failure.
 */
#include <nbgrad.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int failed;

static void check(int ok, const char *what)
{
    printf("%s %s\n", ok ? "PASS" : "FAIL", what);
    failed += !ok;
}

int main(void)
{
    char v[64];
    snprintf(v, sizeof v, "%d.%d.%d", NBG_VERSION_MAJOR, NBG_VERSION_MINOR, NBG_VERSION_PATCH);
    printf("nbg_version() = %s (%d), header %s\n", nbg_version(), nbg_version_number(), NBG_VERSION);
    check(strcmp(nbg_version(), NBG_VERSION) == 0, "hello nbg_version() is the header's NBG_VERSION");
    check(strcmp(v, NBG_VERSION) == 0, "hello NBG_VERSION is NBG_VERSION_MAJOR.MINOR.PATCH");
    check(nbg_version_number() == NBG_VERSION_NUMBER, "hello nbg_version_number() is NBG_VERSION_NUMBER");

    /* the installed library has no CUDA backend */
    nbg_ctx *ctx = NULL;
    check(nbg_ctx_create(&ctx, NBG_BACKEND_CUDA, NBG_FLOAT, 1) == NBG_ENODEV && ctx == NULL,
          "hello a CUDA context is NBG_ENODEV (a CPU-only library)");
    if (nbg_ctx_create(&ctx, NBG_BACKEND_AUTO, NBG_FLOAT, 2) != NBG_OK) {
        check(0, "hello nbg_ctx_create");
        return 1;
    }
    check(nbg_ctx_backend(ctx) == NBG_BACKEND_CPU, "hello AUTO picks the CPU");

    nbg_experiment e;
    nbg_experiment_default(&e);
    const double cell[6] = {50, 60, 70, 90, 90, 90};
    e.has_cell = 1;
    memcpy(e.cell, cell, sizeof cell);
    e.misset[0] = 10, e.misset[1] = 20, e.misset[2] = 30;
    e.default_F = 100;
    e.Na = e.Nb = e.Nc = 5;
    e.lambda = 1;
    e.distance = 30;
    e.fpixels = e.spixels = 64;
    e.oversample = 1;
    const size_t npix = 64 * 64;
    float *img = calloc(npix, sizeof *img);
    nbg_report r;
    const int st = nbg_simulate(ctx, &e, img, npix, &r);
    if (st != NBG_OK) {
        printf("nbg_simulate: %s: %s\n", nbg_strerror(st), nbg_errmsg(ctx));
    }
    check(st == NBG_OK && r.npix == npix, "hello nbg_simulate renders a 64 x 64 image");
    /* Bragg spots on a weak background: the image has a peak, and most pixels are far below it */
    double max = 0;
    for (size_t i = 0; i < npix; ++i) {
        max = img[i] > max ? img[i] : max;
    }
    size_t bright = 0;
    for (size_t i = 0; i < npix; ++i) {
        bright += img[i] > 0.1 * max;
    }
    printf("max %g photons, %zu of %zu pixels above a tenth of it\n", max, bright, npix);
    check(max > 0 && bright > 0 && bright < npix / 2, "hello the image is not blank: it has spots");
    free(img);
    nbg_ctx_destroy(ctx);
    return failed != 0;
}
