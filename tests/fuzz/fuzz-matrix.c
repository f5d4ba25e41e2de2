/*
 * fuzz-matrix.c -- libFuzzer harness for nbgi_read_matrix (MOSFLM A matrices, src/io.h).
 *
 * The input is the file's content.  A matrix that is returned must be finite.
 */
#include "fuzz_util.h"
#include "io.h"

#include <math.h>

static nbgi_fuzz_file file;

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    nbgi_fuzz_file_open(&file, "nbg-fuzz-matrix");
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    nbgi_fuzz_file_set(&file, data, size);
    nbg_ctx *ctx = NULL;
    NBG_FUZZ_CHECK(nbg_ctx_create(&ctx, NBG_BACKEND_CPU, NBG_DOUBLE, 1) == NBG_OK, "no CPU context");
    double mat[9] = {0};
    if (nbgi_read_matrix(ctx, file.path, mat) == NBG_OK) {
        for (int i = 0; i < 9; ++i) {
            NBG_FUZZ_CHECK(isfinite(mat[i]), "nbgi_read_matrix returned an element that is not finite");
        }
    } else {
        NBG_FUZZ_CHECK(nbg_errmsg(ctx)[0] != '\0', "nbgi_read_matrix failed without a message");
    }
    nbg_ctx_destroy(ctx);
    return 0;
}
