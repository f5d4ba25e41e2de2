/*
 * fuzz-smv.c -- libFuzzer harness for nbg_read_smv (SMV images: a text header, then 16-bit pixels).
 *
 * The input is the file's content.  It is read twice: header only (data NULL) and with the pixels; the pixel
 * array returned must cover SIZE1 x SIZE2 and is freed.
 */
#include "fuzz_util.h"
#include "nbgrad.h"

static nbgi_fuzz_file file;

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    nbgi_fuzz_file_open(&file, "nbg-fuzz-smv");
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    nbgi_fuzz_file_set(&file, data, size);
    nbg_ctx *ctx = NULL;
    NBG_FUZZ_CHECK(nbg_ctx_create(&ctx, NBG_BACKEND_CPU, NBG_DOUBLE, 1) == NBG_OK, "no CPU context");
    nbg_smv_header h;
    if (nbg_read_smv(ctx, file.path, &h, NULL) != NBG_OK) {
        NBG_FUZZ_CHECK(nbg_errmsg(ctx)[0] != '\0', "nbg_read_smv failed without a message");
    }
    uint16_t *pix = NULL;
    if (nbg_read_smv(ctx, file.path, &h, &pix) == NBG_OK) {
        NBG_FUZZ_CHECK(pix != NULL, "nbg_read_smv succeeded without the pixels asked for");
        NBG_FUZZ_CHECK(h.fpixels >= 1 && h.spixels >= 1, "nbg_read_smv returned pixels with no image size");
        nbgi_fuzz_touch(pix, (size_t)h.fpixels * (size_t)h.spixels * sizeof *pix);
    } else {
        NBG_FUZZ_CHECK(pix == NULL, "nbg_read_smv failed yet returned pixels");
    }
    free(pix);
    nbg_ctx_destroy(ctx);
    return 0;
}
