/*
 * fuzz-refl.c -- libFuzzer harness for nbg_read_refl (DIALS reflection tables, msgpack through libmsgpack-c), and
 * for the same file read as structure factors (nbg_hkl_read_column: miller_index and the intensities).
 *
 * The input is the file's content.  A table that is read must hold finite centroids, panels >= 0, boxes that do not
 * end before they start and shoebox masks that fill their boxes (whose spot pixels, nbg_reflection_shoebox_boxes on a
 * detector of two 32 x 32 panels, stay on their panels, increasing); structure factors read from it must be finite
 * and >= 0 (a non-msgpack input is read as HKL text: finite); a refusal must say why.
 */
#include "fuzz_util.h"
#include "nbgrad.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

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
        if (r.shoebox_offset != NULL) { /* the shoeboxes: each row's mask fills its box, the offsets add up */
            NBG_FUZZ_CHECK(r.has_shoebox && r.shoebox_offset[0] == 0 && r.shoebox_panel != NULL &&
                           r.shoebox_bbox != NULL, "shoeboxes without their columns");
            for (long k = 0; k < r.n; ++k) {
                const int *b = r.shoebox_bbox + 6 * k;
                const long vol = r.shoebox_offset[k + 1] - r.shoebox_offset[k];
                NBG_FUZZ_CHECK(b[1] >= b[0] && b[3] >= b[2] && b[5] >= b[4] && r.shoebox_panel[k] >= 0,
                               "a reversed shoebox");
                NBG_FUZZ_CHECK(vol == 0 || vol == ((long)b[1] - b[0]) * ((long)b[3] - b[2]) * ((long)b[5] - b[4]),
                               "a shoebox mask that does not fill its box");
            }
            NBG_FUZZ_CHECK(r.shoebox_offset[r.n] == 0 || r.shoebox_mask != NULL, "shoebox masks missing");
            /* the spot pixels of the masks on a 64 x 64 detector of two panels: every pixel within its panel */
            nbg_experiment e;
            nbg_panel pan[2];
            nbg_experiment_default(&e);
            e.fpixels = e.spixels = 64;
            for (int q = 0; q < 2; ++q) {
                memset(&pan[q], 0, sizeof pan[q]);
                pan[q].fpixels = pan[q].spixels = 32;
                pan[q].pixel = 0.1;
                pan[q].origin[0] = -1.6 + 3.2 * q, pan[q].origin[1] = -1.6, pan[q].origin[2] = -100;
                pan[q].fast[0] = 1, pan[q].slow[1] = 1;
            }
            e.panels = pan, e.npanels = 2, e.panel_frame = NBG_PANELS_LAB;
            nbg_spot_box *b = NULL;
            long nb = 0;
            if (nbg_reflection_shoebox_boxes(ctx, &e, &r, NBG_SHOEBOX_FOREGROUND | NBG_SHOEBOX_STRONG, 1, &b, &nb,
                                             NULL) == NBG_OK) {
                for (long t = 0; t < nb; ++t) {
                    NBG_FUZZ_CHECK(b[t].panel >= 0 && b[t].panel < 2 && b[t].x0 >= -1 && b[t].x1 <= 33 &&
                                   b[t].y0 >= -1 && b[t].y1 <= 33 && b[t].x1 == b[t].x0 + 3 && b[t].y1 == b[t].y0 + 3,
                                   "a shoebox spot box off its panel");
                }
                uint32_t *l = NULL;
                long n = 0;
                if (nbg_spot_box_pixels(ctx, &e, b, nb, &l, &n) == NBG_OK) {
                    for (long t = 1; t < n; ++t) NBG_FUZZ_CHECK(l[t] > l[t - 1], "spot pixels not increasing");
                    NBG_FUZZ_CHECK(n == 0 || l[n - 1] < 2 * 32 * 32, "a spot pixel past the panels");
                } else {
                    NBG_FUZZ_CHECK(nbg_errmsg(ctx)[0] != '\0', "nbg_spot_box_pixels failed without a message");
                }
                free(l);
            } else {
                NBG_FUZZ_CHECK(nbg_errmsg(ctx)[0] != '\0', "nbg_reflection_shoebox_boxes failed without a message");
            }
            free(b);
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
