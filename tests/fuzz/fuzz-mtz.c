/*
 * fuzz-mtz.c -- libFuzzer harness for nbg_hkl_read_column on CCP4 MTZ files (src/mtz.c, src/mtzread.cc: gemmi
 * behind a walk that checks the header's counts against the file's bytes and the memory limit).
 *
 * The input is the file's content, read with the default column and, when its length is odd, the column F(+)
 * (an anomalous pair's half).  The context's memory limit is 256 MiB, so that an allocation sized from the header
 * unchecked is a finding (-malloc_limit_mb).  A table that is read must be consistent and hold finite values; a
 * refusal must say why.
 */
#include "fuzz_util.h"
#include "nbgrad.h"

#include <math.h>
#include <string.h>

static nbgi_fuzz_file file;

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    nbgi_fuzz_file_open(&file, "nbg-fuzz-mtz");
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    nbgi_fuzz_file_set(&file, data, size);
    nbg_ctx *ctx = NULL;
    NBG_FUZZ_CHECK(nbg_ctx_create(&ctx, NBG_BACKEND_CPU, NBG_DOUBLE, 1) == NBG_OK, "no CPU context");
    nbg_limits lim;
    nbg_limits_default(&lim);
    lim.max_bytes = 256.0 * 1024 * 1024;
    NBG_FUZZ_CHECK(nbg_ctx_set_limits(ctx, &lim) == NBG_OK, "cannot set the limits");
    nbg_hkl hkl;
    char what[640];
    if (nbg_hkl_read_column(ctx, file.path, size % 2 ? "F(+)" : NULL, 0.5, &hkl, what, sizeof what) == NBG_OK) {
        NBG_FUZZ_CHECK(hkl.nrefl >= 1, "nbg_hkl_read_column succeeded with no reflection");
        NBG_FUZZ_CHECK(what[0] != '\0', "nbg_hkl_read_column succeeded without saying what it read");
        NBG_FUZZ_CHECK(hkl.F != NULL, "nbg_hkl_read_column succeeded without a table");
        const size_t n = (size_t)(hkl.h_max - hkl.h_min + 1) * (size_t)(hkl.k_max - hkl.k_min + 1) *
                         (size_t)(hkl.l_max - hkl.l_min + 1);
        for (size_t i = 0; i < n; ++i) {
            /* (an input that is not MTZ is read as HKL text or a .refl; text's F may be negative) */
            NBG_FUZZ_CHECK(isfinite(hkl.F[i]) && (hkl.F[i] >= 0 || size < 4 || memcmp(data, "MTZ ", 4) != 0),
                           "a table entry that is not a finite F >= 0");
        }
        NBG_FUZZ_CHECK_TABLE(hkl, "nbg_hkl_read_column");
    } else {
        NBG_FUZZ_CHECK(nbg_errmsg(ctx)[0] != '\0', "nbg_hkl_read_column failed without a message");
        NBG_FUZZ_CHECK(hkl.F == NULL, "a refused file left a table");
    }
    nbg_ctx_destroy(ctx);
    return 0;
}
