/*
 * formats.h -- private pieces of the file formats that carry the whole geometry (NeXus/NXmx through HDF5, CBF
 * through CBFlib, DIALS experiment lists through jansson).  The public calls are in nbgrad.h; these are the
 * format-specific readers that nbg_read_image dispatches to, and the writers with an output set (io.h) so that
 * the command-line program renames every file of a run together.
 */
#ifndef NBG_FORMATS_H
#define NBG_FORMATS_H

#include "internal.h"
#include "io.h"

/* Sets g to the defaults: no detector (0 pixels), beam along -z (direction (0,0,1)), wavelength NAN, rotation
 * axis (1,0,0), one frame of 0 width at 0, exposure 1 s, gain 1, pedestal 0, saturation NAN, unpolarized, no
 * crystal, space group " P 1". */
void nbgi_geometry_init(nbg_geometry *g);

/* Checks what every writer and nbg_experiment_from_geometry need of g (finite values, unit axes, pixel counts);
 * NBG_EINVAL naming the field otherwise.  what names the caller for the message ("writing x.nxs"). */
int nbgi_geometry_check(nbg_ctx *ctx, const nbg_geometry *g, const char *what);
/* The cell (lengths in A, angles in deg) of real-space vectors a, b, c (rows of v). */
void nbgi_cell_of_vectors(const double v[9], double cell[6]);
/* The rotation from nbgrad's frame under e's convention (and custom beam vector) to DIALS's laboratory frame, as
 * nbg_geometry_from_report applies it: where mosaic domains drawn by a run of e's flags sit, seen from a list. */
int nbgi_convention_frame(nbg_ctx *ctx, const nbg_experiment *e, double R[9]);

/* The writers of nbgrad.h with an output set (NULL: write at once). */
int nbgi_write_nxmx_set(nbg_ctx *ctx, nbgi_outset *set, const char *path, const nbg_geometry *g, nbg_dtype dtype,
                        const void *frames, int nframes, const uint8_t *mask);
int nbgi_write_nxmx_panels_set(nbg_ctx *ctx, nbgi_outset *set, const char *path, const nbg_geometry *g,
                               const nbg_panel *panels, int npanels, nbg_dtype dtype, const void *frames,
                               int nframes, const uint8_t *mask);
int nbgi_write_expt_panels_set(nbg_ctx *ctx, nbgi_outset *set, const char *path, const nbg_geometry *g,
                               const nbg_panel *panels, int npanels, const char *images);
/* Checks the panels a writer is given (npanels >= 0; each one's axes, origin, size and pixel through
 * nbgi_geometry_check on g with that panel's detector), naming the panel. */
int nbgi_panels_check(nbg_ctx *ctx, const nbg_geometry *g, const nbg_panel *panels, int npanels, const char *what);
/* g with panel p's detector (its sizes, axes, origin and pixel). */
void nbgi_geometry_of_panel(const nbg_geometry *g, const nbg_panel *p, nbg_geometry *out);
int nbgi_write_cbf_set(nbg_ctx *ctx, nbgi_outset *set, const char *path, const nbg_geometry *g, int frame,
                       const int32_t *data);
int nbgi_write_expt_set(nbg_ctx *ctx, nbgi_outset *set, const char *path, const nbg_geometry *g,
                        const char *images);

/* The format readers behind nbg_read_image (same contract: one frame, *image malloc'd, g and mask optional).
 * Each checks sizes against the context's memory limit before allocating. */
int nbgi_read_nxmx(nbg_ctx *ctx, const char *path, int frame, float **image, size_t *npix, nbg_geometry *g,
                   uint8_t **mask);
/* The same, with the count of the file's detector modules (several: the image is their concatenation, g module
 * 0's detector). */
int nbgi_read_nxmx_modules(nbg_ctx *ctx, const char *path, int frame, float **image, size_t *npix,
                           nbg_geometry *g, uint8_t **mask, int *nmodules);
int nbgi_read_cbf(nbg_ctx *ctx, const char *path, float **image, size_t *npix, nbg_geometry *g, uint8_t **mask);

#endif
