/*
 * cbfpanels.c -- for the DIALS tier (tests/dials/cbfpanels.py): what nbgrad reads of a CBF file, for comparison
 * with dxtbx.  Writes PREFIX.json (the beam, and every panel's name, size, pixel size, fast, slow and origin in
 * DIALS's laboratory frame, from nbg_read_cbf_panels) and PREFIX.f32 (nbg_read_image's image: the panels' pixels
 * concatenated, 4-byte floats).  Exit status 1 with nbgrad's message on stderr when the file is refused.
 *
 *   cbfpanels FILE PREFIX
 */
#include "nbgrad.h"

#include <stdio.h>
#include <stdlib.h>

int main(int argc, char **argv)
{
    if (argc != 3) {
        fprintf(stderr, "usage: cbfpanels FILE PREFIX\n");
        return 2;
    }
    nbg_ctx *ctx = NULL;
    if (nbg_ctx_create(&ctx, NBG_BACKEND_CPU, NBG_DOUBLE, 1) != NBG_OK)
        return 2;
    nbg_geometry g;
    nbg_panel *p = NULL;
    int np = 0, whole = 0;
    float *img = NULL;
    size_t npix = 0;
    if (nbg_read_cbf_panels(ctx, argv[1], &g, &p, &np) != NBG_OK ||
        nbg_read_image(ctx, argv[1], 0, 0, &img, &npix, NULL, &whole, NULL) != NBG_OK) {
        fprintf(stderr, "%s\n", nbg_errmsg(ctx));
        nbg_ctx_destroy(ctx);
        return 1;
    }
    char path[4200];
    snprintf(path, sizeof path, "%s.json", argv[2]);
    FILE *f = fopen(path, "w");
    if (f == NULL)
        return 2;
    fprintf(f, "{\"wavelength\": %.17g, \"direction\": [%.17g, %.17g, %.17g], \"npix\": %zu, \"panels\": [\n",
            g.wavelength, g.direction[0], g.direction[1], g.direction[2], npix);
    for (int k = 0; k < np; ++k) {
        const nbg_panel *q = &p[k];
        fprintf(f, "{\"name\": \"%s\", \"size\": [%d, %d], \"pixel\": %.17g, \"fast\": [%.17g, %.17g, %.17g], "
                "\"slow\": [%.17g, %.17g, %.17g], \"origin\": [%.17g, %.17g, %.17g]}%s\n", q->name, q->fpixels,
                q->spixels, q->pixel, q->fast[0], q->fast[1], q->fast[2], q->slow[0], q->slow[1], q->slow[2],
                q->origin[0], q->origin[1], q->origin[2], k + 1 < np ? "," : "");
    }
    fprintf(f, "]}\n");
    fclose(f);
    snprintf(path, sizeof path, "%s.f32", argv[2]);
    f = fopen(path, "wb");
    if (f == NULL || fwrite(img, sizeof *img, npix, f) != npix)
        return 2;
    fclose(f);
    free(img);
    free(p);
    nbg_ctx_destroy(ctx);
    return 0;
}
