/*
 * fuzz-fdump.c -- libFuzzer harness for nbg_hkl_read_fdump (the nanoBragg Fdump.bin cache).
 *
 * The input is the file's content: a line of six index bounds, a form feed, native doubles.  A table that is
 * returned must be consistent (bounds in order, every entry addressable) and is freed.
 */
#include "fuzz_util.h"
#include "nbgrad.h"

static nbgi_fuzz_file file;

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    nbgi_fuzz_file_open(&file, "nbg-fuzz-fdump");
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    nbgi_fuzz_file_set(&file, data, size);
    nbg_ctx *ctx = NULL;
    NBG_FUZZ_CHECK(nbg_ctx_create(&ctx, NBG_BACKEND_CPU, NBG_DOUBLE, 1) == NBG_OK, "no CPU context");
    nbg_hkl hkl;
    if (nbg_hkl_read_fdump(ctx, file.path, &hkl) == NBG_OK) {
        NBG_FUZZ_CHECK_TABLE(hkl, "nbg_hkl_read_fdump");
    } else {
        NBG_FUZZ_CHECK(nbg_errmsg(ctx)[0] != '\0', "nbg_hkl_read_fdump failed without a message");
    }
    nbg_ctx_destroy(ctx);
    return 0;
}
