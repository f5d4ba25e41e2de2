/*
 * fuzz-refl.c -- libFuzzer harness for nbg_read_refl (DIALS reflection tables, msgpack through libmsgpack-c), and
 * for the same file read as structure factors (nbg_hkl_read_column: miller_index and the intensities).
 *
 * The input is the file's content.  A table that is read must hold finite centroids, panels >= 0 and boxes that
 * do not end before they start; structure factors read from it must be finite and >= 0 (a
 * non-msgpack input is read as HKL text: finite); a refusal must say why.
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
    nbg_hkl hkl;
    if (nbg_hkl_read_column(ctx, file.path, NULL, 0.5, &hkl, NULL, 0) == NBG_OK) {
        NBG_FUZZ_CHECK(hkl.nrefl >= 1 && hkl.F != NULL, "structure factors read without an entry");
        const size_t n = (size_t)(hkl.h_max - hkl.h_min + 1) * (size_t)(hkl.k_max - hkl.k_min + 1) *
                         (size_t)(hkl.l_max - hkl.l_min + 1);
        for (size_t i = 0; i < n; ++i) {
            /* (an input that is not msgpack is read as HKL text, where F may be negative) */
            NBG_FUZZ_CHECK(isfinite(hkl.F[i]) && (hkl.F[i] >= 0 || size == 0 || data[0] != 0x93),
                           "a table entry that is not a finite F >= 0");
        }
        NBG_FUZZ_CHECK_TABLE(hkl, "nbg_hkl_read_column");
    } else {
        NBG_FUZZ_CHECK(nbg_errmsg(ctx)[0] != '\0', "nbg_hkl_read_column failed without a message");
    }
    nbg_ctx_destroy(ctx);
    return 0;
}
