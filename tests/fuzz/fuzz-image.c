/*
 * fuzz-image.c -- libFuzzer harness for nbg_read_image over every format it reads: CBF (nbgrad decodes the binary
 * sections, src/cbfbin.c; CBFlib parses the text; a multi-panel CBF's panels through nbg_read_cbf_panels, too),
 * NXmx (HDF5), SMV, and raw floats.
 *
 * The input is the file's content, written to a scratch file with a real name (HDF5 opens the path itself and
 * cannot open an in-memory file's /proc/self/fd/N).  It is read as frame 0 with the geometry and the mask; raw
 * floats are expected when the input is a whole number of them, so that raw input is read and not only refused.
 * The context's memory limit is 256 MiB (below libFuzzer's -malloc_limit_mb=1024): a reader must check what the
 * file asks for against it before allocating.
 *
 * Invariants: a read that succeeds returns a non-empty image whose every pixel can be read, a mask of as many
 * pixels or none, and for a CBF or SMV file (or any file read with its whole geometry) fpixels x spixels = npix;
 * a read that fails says why and returns no image and no mask.
 *
 * HDF5 files (the 8-byte HDF5 signature first) are skipped unless NBG_FUZZ_HDF5 is set (to anything but empty):
 * Debian's libhdf5 (1.10) itself overflows heap buffers and leaks on damaged files (within seconds of fuzzing:
 * a heap-buffer-overflow in H5G__ent_to_link under H5Literate, called from src/nxmx.c's find_class_nth), which
 * nbgrad cannot check for before calling it; run with NBG_FUZZ_HDF5=1 to hunt there.
 *
 * CBFlib is built without frame pointers, so the harness asks ASan for full unwinding at each allocation: the
 * leak suppression of CBFlib's parser (fuzz_util.h, leak:cbf_parse) needs to see that frame.
 */
#include "fuzz_util.h"
#include "nbgrad.h"

static nbgi_fuzz_file file;
static int with_hdf5;

const char *__asan_default_options(void);
const char *__asan_default_options(void)
{
    return "fast_unwind_on_malloc=0";
}

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    const char *h = getenv("NBG_FUZZ_HDF5");
    with_hdf5 = h != NULL && h[0] != '\0';
    nbgi_fuzz_file_open_named(&file, "nbg-fuzz-image");
    return 0;
}

/* 1 when data starts with the signature nbg_read_image takes for a CBF file, 2 for an SMV file. */
static int one_detector(const uint8_t *data, size_t size)
{
    if (size >= 6 && memcmp(data, "###CBF", 6) == 0)
        return 1;
    return size >= 12 && memcmp(data, "{\nHEADER_BYT", 12) == 0 ? 2 : 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (!with_hdf5 && size >= 8 && memcmp(data, "\x89HDF\r\n\x1a\n", 8) == 0) {
        return 0;
    }
    nbgi_fuzz_file_set(&file, data, size);
    nbg_ctx *ctx = NULL;
    NBG_FUZZ_CHECK(nbg_ctx_create(&ctx, NBG_BACKEND_CPU, NBG_DOUBLE, 1) == NBG_OK, "no CPU context");
    nbg_limits lim;
    NBG_FUZZ_CHECK(nbg_ctx_limits(ctx, &lim) == NBG_OK, "no limits");
    lim.max_bytes = 256.0 * 1024 * 1024;
    NBG_FUZZ_CHECK(nbg_ctx_set_limits(ctx, &lim) == NBG_OK, "limits refused");

    const size_t expect = size > 0 && size % sizeof(float) == 0 ? size / sizeof(float) : 0;
    float *img = (float *)1;
    uint8_t *mask = (uint8_t *)1;
    size_t npix = 7;
    int whole = 0;
    nbg_geometry g;
    if (nbg_read_image(ctx, file.path, 0, expect, &img, &npix, &g, &whole, &mask) == NBG_OK) {
        NBG_FUZZ_CHECK(img != NULL && npix >= 1, "nbg_read_image succeeded without an image");
        nbgi_fuzz_touch(img, npix * sizeof *img);
        if (mask != NULL) {
            nbgi_fuzz_touch(mask, npix);
        }
        const int kind = one_detector(data, size);
        nbg_panel *pan = NULL;
        int np = 0;
        const int prc = kind == 1 ? nbg_read_cbf_panels(ctx, file.path, &g, &pan, &np) : NBG_OK;
        NBG_FUZZ_CHECK(prc == NBG_OK, "nbg_read_cbf_panels refused a CBF that nbg_read_image read");
        if (kind == 1 && np > 1) {
            /* a multi-panel CBF: the image is the panels' concatenation */
            size_t total = 0;
            for (int k = 0; k < np; ++k) {
                NBG_FUZZ_CHECK(pan[k].fpixels >= 1 && pan[k].spixels >= 1 && pan[k].pixel > 0,
                               "nbg_read_cbf_panels returned an empty panel");
                total += (size_t)pan[k].fpixels * (size_t)pan[k].spixels;
            }
            NBG_FUZZ_CHECK(total == npix, "nbg_read_cbf_panels's panels do not hold nbg_read_image's pixels");
        } else if (whole || kind != 0) {
            NBG_FUZZ_CHECK(g.fpixels >= 1 && g.spixels >= 1 && (size_t)g.fpixels * (size_t)g.spixels == npix,
                           "nbg_read_image returned a detector whose size is not the image's");
        }
        free(pan);
        free(img);
        free(mask);
    } else {
        NBG_FUZZ_CHECK(nbg_errmsg(ctx)[0] != '\0', "nbg_read_image failed without a message");
        NBG_FUZZ_CHECK(img == NULL && mask == NULL && npix == 0, "nbg_read_image failed yet returned an image");
    }
    nbg_ctx_destroy(ctx);
    return 0;
}
