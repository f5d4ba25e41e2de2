/*
 * fuzz-expt.c -- libFuzzer harness for nbg_read_expt (DIALS experiment lists, JSON through jansson) and
 * nbg_read_expt_scan_crystal (a scan-varying crystal's A matrices).
 *
 * The input is the file's content.  A list that is read must give a geometry that nbg_experiment_from_geometry
 * either takes or refuses with a message; one that is refused must say why; the scan points of one that is read
 * are as many as it counted, each basis finite.
 */
#include "fuzz_util.h"
#include "nbgrad.h"

#include <math.h>
#include <stdlib.h>

static nbgi_fuzz_file file;

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    nbgi_fuzz_file_open(&file, "nbg-fuzz-expt");
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    nbgi_fuzz_file_set(&file, data, size);
    nbg_ctx *ctx = NULL;
    NBG_FUZZ_CHECK(nbg_ctx_create(&ctx, NBG_BACKEND_CPU, NBG_DOUBLE, 1) == NBG_OK, "no CPU context");
    nbg_geometry g;
    if (nbg_read_expt(ctx, file.path, &g) == NBG_OK) {
        nbg_experiment e;
        nbg_experiment_default(&e);
        if (nbg_experiment_from_geometry(ctx, &g, &e) != NBG_OK) {
            NBG_FUZZ_CHECK(nbg_errmsg(ctx)[0] != '\0', "nbg_experiment_from_geometry failed without a message");
        }
        double *rs = NULL;
        int n = -1;
        if (nbg_read_expt_scan_crystal(ctx, file.path, &rs, &n) == NBG_OK) {
            NBG_FUZZ_CHECK(n == g.crystal_scan_points && (n == 0) == (rs == NULL), "scan points miscounted");
            for (int i = 0; i < 9 * n; ++i) NBG_FUZZ_CHECK(isfinite(rs[i]), "a scan point's basis is not finite");
        } else {
            NBG_FUZZ_CHECK(nbg_errmsg(ctx)[0] != '\0', "nbg_read_expt_scan_crystal failed without a message");
        }
        free(rs);
    } else {
        NBG_FUZZ_CHECK(nbg_errmsg(ctx)[0] != '\0', "nbg_read_expt failed without a message");
    }
    nbg_ctx_destroy(ctx);
    return 0;
}
