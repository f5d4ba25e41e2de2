/*
 * imagefile.c -- the image formats nbgrad reads, in one table: each format's name, how it is recognised from its
 * first bytes (sniff), its reader, whether a file holds several frames.  nbg_read_image walks the table; a new
 * format is a row.  The formats' own code lives in their files (nxmx.c, cbf.c, io.c's SMV); the geometry model they
 * fill is labgeom.c's, which calls none of them.
 */
#include "formats.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>

static int read_smv_image(nbg_ctx *ctx, const char *path, float **image, size_t *npix, nbg_geometry *g)
{
    nbg_smv_header h;
    uint16_t *data = NULL;
    int rc = nbg_read_smv(ctx, path, &h, &data);
    if (rc != NBG_OK)
        return rc;
    const size_t n = (size_t)h.fpixels * (size_t)h.spixels;
    float *img = malloc(n * sizeof *img);
    if (img == NULL) {
        free(data);
        return nbgi_error(ctx, NBG_ENOMEM, "out of memory reading %s (%zu pixels)", path, n);
    }
    for (size_t i = 0; i < n; ++i) img[i] = data[i];
    free(data);
    if (g != NULL) {
        /* SMV says little of the geometry: sizes, wavelength, distance (in the origin along -z, for a flat
         * detector facing the beam) and the pedestal when nbgrad wrote one */
        g->fpixels = h.fpixels;
        g->spixels = h.spixels;
        g->pixel_f = g->pixel_s = h.pixel;
        g->wavelength = h.lambda;
        if (isfinite(h.distance))
            g->origin[2] = -h.distance;
        g->pedestal = h.has_adc_offset ? h.adc_offset : NAN;
        snprintf(g->detector, sizeof g->detector, "%s", h.beamline);
        g->saturation = 65535;
        if (isfinite(h.phi0)) {
            g->scan_start = h.phi0;
            g->scan_stated = 1;
            if (isfinite(h.osc)) {
                g->scan_width = h.osc;
                g->scan_stated = 2;
            }
        }
    }
    *image = img;
    *npix = n;
    return NBG_OK;
}

static int read_raw_image(nbg_ctx *ctx, const char *path, size_t expect_npix, off_t size, float **image, size_t *npix)
{
    if (expect_npix == 0)
        return nbgi_error(ctx, NBG_EFORMAT, "%s is not an NXmx, CBF or SMV file, and raw floats were not expected",
                          path);
    if ((unsigned long long)size != (unsigned long long)expect_npix * sizeof(float))
        return nbgi_error(ctx, NBG_EFORMAT, "%s has %lld bytes; a raw float image of this detector has %zu", path,
                          (long long)size, expect_npix * sizeof(float));
    int rc = nbgi_check_bytes(ctx, (double)expect_npix * sizeof(float), path);
    if (rc != NBG_OK)
        return rc;
    float *img = malloc(expect_npix * sizeof *img);
    if (img == NULL)
        return nbgi_error(ctx, NBG_ENOMEM, "out of memory reading %s (%zu pixels)", path, expect_npix);
    FILE *f = fopen(path, "rb");
    if (f == NULL) {
        const int err = errno;
        free(img);
        return nbgi_error(ctx, NBG_EIO, "cannot open %s: %s", path, strerror(err));
    }
    const size_t got = fread(img, sizeof *img, expect_npix, f);
    fclose(f);
    if (got != expect_npix) {
        free(img);
        return nbgi_error(ctx, NBG_EIO, "cannot read %s", path);
    }
    *image = img;
    *npix = expect_npix;
    return NBG_OK;
}

/* The formats' adapters to one signature: frame (checked against the format's frames), the file's size (raw),
 * the image, the geometry the file states (lg, always given) and its mask; *whole says whether lg describes the
 * whole detector of the image (several NXmx modules: lg is module 0's). */
typedef int (*image_reader)(nbg_ctx *ctx, const char *path, int frame, size_t expect_npix, off_t size,
                            float **image, size_t *npix, nbg_geometry *lg, uint8_t **mask, int *whole);

static int read_nxmx_entry(nbg_ctx *ctx, const char *path, int frame, size_t expect_npix, off_t size, float **image,
                           size_t *npix, nbg_geometry *lg, uint8_t **mask, int *whole)
{
    (void)expect_npix, (void)size;
    int nmod = 1;
    const int rc = nbgi_read_nxmx_modules(ctx, path, frame, image, npix, lg, mask, &nmod);
    *whole = nmod == 1; /* several modules: the image is their concatenation, lg module 0's detector */
    return rc;
}

static int read_cbf_entry(nbg_ctx *ctx, const char *path, int frame, size_t expect_npix, off_t size, float **image,
                          size_t *npix, nbg_geometry *lg, uint8_t **mask, int *whole)
{
    (void)frame, (void)expect_npix, (void)size;
    int np = 1;
    const int rc = nbgi_read_cbf_panels(ctx, path, image, npix, lg, mask, NULL, &np);
    /* a full CBF describes its axes (a miniCBF's header is read as dxtbx reads it: its fixed axes); several
     * panels: the image is their concatenation, lg panel 0's detector (nbg_read_cbf_panels gives them all) */
    *whole = np == 1 && lg->fast[0] * lg->fast[0] + lg->fast[1] * lg->fast[1] + lg->fast[2] * lg->fast[2] > 0 &&
             isfinite(lg->wavelength);
    return rc;
}

static int read_smv_entry(nbg_ctx *ctx, const char *path, int frame, size_t expect_npix, off_t size, float **image,
                          size_t *npix, nbg_geometry *lg, uint8_t **mask, int *whole)
{
    (void)frame, (void)expect_npix, (void)size, (void)mask;
    *whole = 0;
    return read_smv_image(ctx, path, image, npix, lg);
}

static int read_raw_entry(nbg_ctx *ctx, const char *path, int frame, size_t expect_npix, off_t size, float **image,
                          size_t *npix, nbg_geometry *lg, uint8_t **mask, int *whole)
{
    (void)frame, (void)lg, (void)mask;
    *whole = 0;
    return read_raw_image(ctx, path, expect_npix, size, image, npix);
}

/* The table: recognised in order by their first bytes (magic, NULL: anything, the last row). */
static const struct {
    const char *name, *what;  /* the format, and a file of it in words ("a CBF file") */
    const char *magic;        /* its first bytes */
    size_t nmagic;
    int frames;               /* 1: one image a file; 0: any number */
    image_reader read;
} image_formats[] = {
    {"nxmx", "an NXmx file", "\x89HDF\r\n\x1a\n", 8, 0, read_nxmx_entry},
    {"cbf", "a CBF file", "###CBF", 6, 1, read_cbf_entry},
    {"smv", "an SMV file", "{\nHEADER_BYT", 12, 1, read_smv_entry},
    {"raw", "a raw float file", NULL, 0, 1, read_raw_entry},
};

int nbg_read_image(nbg_ctx *ctx, const char *path, int frame, size_t expect_npix, float **image, size_t *npix,
                   nbg_geometry *g, int *have_geometry, uint8_t **mask)
{
    char unplaced[1024];
    const int rc = nbgi_read_image_array(ctx, path, frame, expect_npix, image, npix, g, have_geometry, mask,
                                         unplaced, sizeof unplaced);
    if (rc != NBG_OK || unplaced[0] == '\0')
        return rc;
    free(*image);
    *image = NULL;
    *npix = 0;
    if (mask != NULL) {
        free(*mask);
        *mask = NULL;
    }
    if (have_geometry != NULL)
        *have_geometry = 0;
    return nbgi_error(ctx, NBG_EUNSUP, "%s", unplaced);
}

int nbgi_read_image_array(nbg_ctx *ctx, const char *path, int frame, size_t expect_npix, float **image,
                          size_t *npix, nbg_geometry *g, int *have_geometry, uint8_t **mask, char *unplaced,
                          size_t size)
{
    if (unplaced != NULL && size > 0)
        unplaced[0] = '\0';
    if (image == NULL || npix == NULL)
        return nbgi_error(ctx, NBG_EINVAL, "nbg_read_image: NULL argument");
    *image = NULL;
    *npix = 0;
    if (mask != NULL)
        *mask = NULL;
    if (have_geometry != NULL)
        *have_geometry = 0;
    if (path == NULL || path[0] == '\0')
        return nbgi_error(ctx, NBG_EINVAL, "nbg_read_image: empty file name");
    if (frame < 0)
        return nbgi_error(ctx, NBG_EINVAL, "%s: frame %d (frames count from 0)", path, frame);
    struct stat st;
    if (stat(path, &st) != 0)
        return nbgi_error(ctx, NBG_EIO, "cannot read %s: %s", path, strerror(errno));
    if (!S_ISREG(st.st_mode))
        return nbgi_error(ctx, NBG_EIO, "cannot read %s: not a regular file%s", path,
                          S_ISDIR(st.st_mode) ? " (it is a directory)" : "");
    unsigned char head[16] = {0};
    FILE *f = fopen(path, "rb");
    if (f == NULL)
        return nbgi_error(ctx, NBG_EIO, "cannot open %s: %s", path, strerror(errno));
    const size_t n = fread(head, 1, sizeof head, f);
    fclose(f);
    /* the readers fill a local description: the overloads need its saturation even when the caller wants none */
    nbg_geometry lg;
    nbgi_geometry_init(&lg);
    uint8_t *m = NULL;
    int rc, whole = 0;
    int fmt = 0;
    while (image_formats[fmt].magic != NULL &&
           !(n >= image_formats[fmt].nmagic && memcmp(head, image_formats[fmt].magic, image_formats[fmt].nmagic) == 0)) {
        ++fmt;
    }
    if (image_formats[fmt].frames == 1 && frame != 0) {
        return nbgi_error(ctx, NBG_EINVAL, "%s: %s holds one image; frame %d was asked for", path,
                          image_formats[fmt].what, frame);
    }
    rc = image_formats[fmt].read(ctx, path, frame, expect_npix, st.st_size, image, npix, &lg, mask != NULL ? &m : NULL,
                                 &whole);
    if (rc != NBG_OK) {
        free(m);
        return rc;
    }
    if (mask != NULL && isfinite(lg.saturation) && lg.saturation > 0) {
        /* overloads: counts at or above the saturation are not measurements */
        const float sat = (float)lg.saturation;
        for (size_t i = 0; i < *npix; ++i) {
            if ((*image)[i] >= sat) {
                if (m == NULL && (m = calloc(*npix, 1)) == NULL) {
                    free(*image);
                    *image = NULL;
                    *npix = 0;
                    return nbgi_error(ctx, NBG_ENOMEM, "out of memory for the mask of %s", path);
                }
                m[i] = 1;
            }
        }
    }
    /* the file's flat panel is not this detector: say so (the caller that has the panels reads the array) */
    char why[1024];
    if (nbgi_unplaced_detector(image_formats[fmt].name, &lg, path, why, sizeof why)) {
        whole = 0;
        if (unplaced != NULL && size > 0)
            snprintf(unplaced, size, "%s", why);
    }
    if (mask != NULL)
        *mask = m;
    if (g != NULL)
        *g = lg;
    if (have_geometry != NULL)
        *have_geometry = whole;
    return NBG_OK;
}
