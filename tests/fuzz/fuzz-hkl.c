/*
 * fuzz-hkl.c -- libFuzzer harness for nbg_hkl_read (HKL text files).
 *
 * The input is the file's content.  A failure status is the expected outcome for most inputs; a table that is
 * returned must be consistent (bounds in order, every entry addressable) and is freed.
 */
#include "fuzz_util.h"
#include "nbgrad.h"

static nbgi_fuzz_file file;

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    nbgi_fuzz_file_open(&file, "nbg-fuzz-hkl");
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    nbgi_fuzz_file_set(&file, data, size);
    nbg_ctx *ctx = NULL;
    NBG_FUZZ_CHECK(nbg_ctx_create(&ctx, NBG_BACKEND_CPU, NBG_DOUBLE, 1) == NBG_OK, "no CPU context");
    nbg_hkl hkl;
    if (nbg_hkl_read(ctx, file.path, 0.5, &hkl) == NBG_OK) {
        NBG_FUZZ_CHECK(hkl.nrefl >= 1, "nbg_hkl_read succeeded with no reflection");
        NBG_FUZZ_CHECK_TABLE(hkl, "nbg_hkl_read");
    } else {
        NBG_FUZZ_CHECK(nbg_errmsg(ctx)[0] != '\0', "nbg_hkl_read failed without a message");
    }
    nbg_ctx_destroy(ctx);
    return 0;
}
