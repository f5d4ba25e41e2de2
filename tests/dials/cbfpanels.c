/*
 * cbfpanels.c -- for the DIALS tier (tests/dials/cbfpanels.py): what nbgrad reads of an image file or of a DIALS
 * experiment list, for comparison with dxtbx.  Writes PREFIX.json (the beam, and every panel's name, size, pixel
 * size, fast, slow and origin in DIALS's laboratory frame) and PREFIX.f32 (the panels' pixels concatenated, 4-byte
 * floats).  Exit status 1 with nbgrad's message on stderr when the file is refused.
 *
 *   cbfpanels FILE PREFIX                the pixels of nbg_read_image, the panels of nbg_read_cbf_panels
 *   cbfpanels -expt LIST PREFIX [IMAGE]  the panels of nbg_read_expt_panels; with IMAGE, nbg_observed_read's image
 *                                        of it for the list's experiment (the file cut into the list's panels
 *                                        where they say where they lie) and PREFIX.use, its pixels kept (1 byte
 *                                        each)
 *   cbfpanels -geometry FILE LIST OUT    the geometry nbg_read_image reads of FILE (goniometer included) with the
 *                                        crystal of the experiment list LIST, written as the list OUT
 *                                        (nbg_write_expt), for nbgrad -expt to render what it read of the file
 */
#include "nbgrad.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int write_json(const char *prefix, const nbg_geometry *g, const nbg_panel *p, int np, size_t npix)
{
    char path[4200];
    snprintf(path, sizeof path, "%s.json", prefix);
    FILE *f = fopen(path, "w");
    if (f == NULL)
        return 0;
    fprintf(f, "{\"wavelength\": %.17g, \"direction\": [%.17g, %.17g, %.17g], \"npix\": %zu, \"panels\": [\n",
            g->wavelength, g->direction[0], g->direction[1], g->direction[2], npix);
    for (int k = 0; k < np; ++k) {
        const nbg_panel *q = &p[k];
        fprintf(f, "{\"name\": \"%s\", \"size\": [%d, %d], \"pixel\": %.17g, \"fast\": [%.17g, %.17g, %.17g], "
                "\"slow\": [%.17g, %.17g, %.17g], \"origin\": [%.17g, %.17g, %.17g], \"raw_offset\": [%d, %d]}%s\n",
                q->name, q->fpixels, q->spixels, q->pixel, q->fast[0], q->fast[1], q->fast[2], q->slow[0], q->slow[1],
                q->slow[2], q->origin[0], q->origin[1], q->origin[2], q->raw_offset[0], q->raw_offset[1],
                k + 1 < np ? "," : "");
    }
    fprintf(f, "]}\n");
    return fclose(f) == 0;
}

static int write_bytes(const char *prefix, const char *ext, const void *data, size_t n)
{
    char path[4200];
    snprintf(path, sizeof path, "%s.%s", prefix, ext);
    FILE *f = fopen(path, "wb");
    if (f == NULL)
        return 0;
    const int ok = fwrite(data, 1, n, f) == n;
    return fclose(f) == 0 && ok;
}

/* The list's experiment (its panels in the lab frame) and image's pixels for it through nbg_observed_read. */
static int from_list(nbg_ctx *ctx, const char *list, const char *prefix, const char *image)
{
    nbg_geometry g;
    nbg_panel *p = NULL;
    int np = 0;
    if (nbg_read_expt_panels(ctx, list, &g, &p, &np) != NBG_OK) {
        fprintf(stderr, "%s\n", nbg_errmsg(ctx));
        return 1;
    }
    int rc = 0;
    nbg_observed ob;
    memset(&ob, 0, sizeof ob);
    if (image != NULL) {
        nbg_experiment e;
        nbg_experiment_default(&e);
        if (nbg_experiment_from_geometry(ctx, &g, &e) != NBG_OK) {
            fprintf(stderr, "%s\n", nbg_errmsg(ctx));
            free(p);
            return 1;
        }
        if (!e.has_cell && !e.has_mat) {
            const double cell[6] = {50, 60, 70, 90, 90, 90};
            memcpy(e.cell, cell, sizeof cell);
            e.has_cell = 1;
        }
        e.default_F = 1;
        if (np > 1) {
            e.panels = p;
            e.npanels = np;
            e.panel_frame = NBG_PANELS_LAB;
        }
        if (nbg_observed_read(ctx, &e, image, 0, NULL, &ob) != NBG_OK) {
            fprintf(stderr, "%s\n", nbg_errmsg(ctx));
            free(p);
            return 1;
        }
    }
    if (!write_json(prefix, &g, p, np, ob.npix) ||
        (image != NULL && (!write_bytes(prefix, "f32", ob.image, ob.npix * sizeof *ob.image) ||
                           !write_bytes(prefix, "use", ob.use, ob.npix))))
        rc = 2;
    nbg_observed_free(&ob);
    free(p);
    return rc;
}

/* -geometry: FILE's geometry and LIST's crystal into the list OUT; 0 when written. */
static int geometry_with_crystal(nbg_ctx *ctx, const char *file, const char *list, const char *out)
{
    nbg_geometry g, c;
    float *img = NULL;
    size_t npix = 0;
    int whole = 0, rc = nbg_read_image(ctx, file, 0, 0, &img, &npix, &g, &whole, NULL);
    free(img);
    if (rc == NBG_OK && !whole)
        rc = NBG_EFORMAT;
    if (rc == NBG_OK)
        rc = nbg_read_expt(ctx, list, &c);
    if (rc == NBG_OK && !c.has_crystal)
        rc = NBG_EINVAL;
    if (rc == NBG_OK) {
        g.has_crystal = 1;
        memcpy(g.real_space, c.real_space, sizeof g.real_space);
        memcpy(g.space_group, c.space_group, sizeof g.space_group);
        rc = nbg_write_expt(ctx, out, &g, file);
    }
    if (rc != NBG_OK)
        fprintf(stderr, "%s (status %d)\n", nbg_errmsg(ctx), rc);
    return rc == NBG_OK ? 0 : 1;
}

int main(int argc, char **argv)
{
    if (argc == 5 && strcmp(argv[1], "-geometry") == 0) {
        nbg_ctx *ctx = NULL;
        if (nbg_ctx_create(&ctx, NBG_BACKEND_CPU, NBG_DOUBLE, 1) != NBG_OK)
            return 2;
        const int rc = geometry_with_crystal(ctx, argv[2], argv[3], argv[4]);
        nbg_ctx_destroy(ctx);
        return rc;
    }
    const int list = argc >= 2 && strcmp(argv[1], "-expt") == 0;
    if (list ? argc != 4 && argc != 5 : argc != 3) {
        fprintf(stderr, "usage: cbfpanels FILE PREFIX | cbfpanels -expt LIST PREFIX [IMAGE] | cbfpanels -geometry FILE "
                        "LIST OUT\n");
        return 2;
    }
    nbg_ctx *ctx = NULL;
    if (nbg_ctx_create(&ctx, NBG_BACKEND_CPU, NBG_DOUBLE, 1) != NBG_OK)
        return 2;
    if (list) {
        const int rc = from_list(ctx, argv[2], argv[3], argc == 5 ? argv[4] : NULL);
        nbg_ctx_destroy(ctx);
        return rc;
    }
    nbg_geometry g;
    nbg_panel *p = NULL;
    int np = 0, whole = 0;
    float *img = NULL;
    size_t npix = 0;
    if (nbg_read_image(ctx, argv[1], 0, 0, &img, &npix, NULL, &whole, NULL) != NBG_OK ||
        nbg_read_cbf_panels(ctx, argv[1], &g, &p, &np) != NBG_OK) {
        fprintf(stderr, "%s\n", nbg_errmsg(ctx));
        free(p);
        nbg_ctx_destroy(ctx);
        return 1;
    }
    const int ok = write_json(argv[2], &g, p, np, npix) && write_bytes(argv[2], "f32", img, npix * sizeof *img);
    free(img);
    free(p);
    nbg_ctx_destroy(ctx);
    return ok ? 0 : 2;
}
