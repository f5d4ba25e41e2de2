/*
 * fuzz-refl.c -- libFuzzer harness for nbg_read_refl (DIALS reflection tables, msgpack through libmsgpack-c).
 *
 * The input is the file's content.  A table that is read must hold finite centroids, panels >= 0 and boxes that
 * do not end before they start; one that is refused must say why.
 */
#include "fuzz_util.h"
#include "nbgrad.h"

#include <math.h>

static nbgi_fuzz_file file;

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    nbgi_fuzz_file_open(&file, "nbg-fuzz-refl");
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    nbgi_fuzz_file_set(&file, data, size);
    nbg_ctx *ctx = NULL;
    NBG_FUZZ_CHECK(nbg_ctx_create(&ctx, NBG_BACKEND_CPU, NBG_DOUBLE, 1) == NBG_OK, "no CPU context");
    nbg_reflections r;
    if (nbg_read_refl(ctx, file.path, &r) == NBG_OK) {
        NBG_FUZZ_CHECK(r.n >= 0 && (r.n == 0 || (r.panel != NULL && r.xyz != NULL)), "a table without its columns");
        for (long k = 0; k < r.n; ++k) {
            NBG_FUZZ_CHECK(r.panel[k] >= 0, "a negative panel");
            NBG_FUZZ_CHECK(isfinite(r.xyz[3 * k]) && isfinite(r.xyz[3 * k + 1]) && isfinite(r.xyz[3 * k + 2]),
                           "a non-finite centroid");
            NBG_FUZZ_CHECK(r.bbox == NULL || (r.bbox[6 * k + 1] >= r.bbox[6 * k] &&
                                              r.bbox[6 * k + 3] >= r.bbox[6 * k + 2]),
                           "a reversed box");
        }
    } else {
        NBG_FUZZ_CHECK(nbg_errmsg(ctx)[0] != '\0', "nbg_read_refl failed without a message");
        NBG_FUZZ_CHECK(r.n == 0 && r.panel == NULL && r.xyz == NULL, "a refused table left columns");
    }
    nbg_reflections_free(&r);
    nbg_ctx_destroy(ctx);
    return 0;
}
