/*
 * fuzz-sources.c -- libFuzzer harness for nbgi_read_sources (nanoBragg source files, src/io.h).
 *
 * The input is the file's content.  The sources returned are checked (count, finite lambda) and freed.
 */
#include "fuzz_util.h"
#include "io.h"

#include <math.h>

static nbgi_fuzz_file file;

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    nbgi_fuzz_file_open(&file, "nbg-fuzz-sources");
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    nbgi_fuzz_file_set(&file, data, size);
    nbg_ctx *ctx = NULL;
    NBG_FUZZ_CHECK(nbg_ctx_create(&ctx, NBG_BACKEND_CPU, NBG_DOUBLE, 1) == NBG_OK, "no CPU context");
    double beam[3] = {1, 0, 0};
    nbg_source *src = NULL;
    int n = -1;
    if (nbgi_read_sources(ctx, file.path, 1.0, beam, &src, &n) == NBG_OK) {
        NBG_FUZZ_CHECK(src != NULL && n >= 1, "nbgi_read_sources succeeded without sources");
        for (int i = 0; i < n; ++i) {
            NBG_FUZZ_CHECK(isfinite(src[i].pos[0]) && isfinite(src[i].pos[1]) && isfinite(src[i].pos[2]),
                           "nbgi_read_sources returned a source position that is not finite");
            NBG_FUZZ_CHECK(!(src[i].pos[0] == 0 && src[i].pos[1] == 0 && src[i].pos[2] == 0),
                           "nbgi_read_sources returned a source at the origin");
            NBG_FUZZ_CHECK(isfinite(src[i].lambda), "nbgi_read_sources returned a wavelength that is not finite");
        }
    } else {
        NBG_FUZZ_CHECK(src == NULL && n == 0, "nbgi_read_sources failed without clearing *out and *n");
        NBG_FUZZ_CHECK(nbg_errmsg(ctx)[0] != '\0', "nbgi_read_sources failed without a message");
    }
    free(src);
    nbg_ctx_destroy(ctx);
    return 0;
}
