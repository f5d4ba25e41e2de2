/*
 * imagefile.c -- the format registry: every image or experiment format nbgrad reads or writes, in one table (each
 * format's name, how it is recognised from its first bytes (sniff), its reader, its writer, what the writer carries,
 * whether a file holds several frames).  nbg_read_image sniffs a file and calls its row's reader; the program's
 * output flags (src/outputs.def) name a row whose writer they call (nbgi_image_write).  A new format is a row.  The
 * formats' own code lives in their files (nxmx.c, cbf.c through the formats plug-in's forwarding table, expt.c, io.c's
 * SMV, PGM and floats); the geometry model they fill is labgeom.c's, which calls none of them.
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

/* The readers' adapters to one signature (nbgi_image_reader): frame (checked against the format's frames), the
 * file's size (raw), the image, the geometry the file states (lg, always given) and its mask; *whole says whether lg
 * describes the whole detector of the image (several NXmx modules: lg is module 0's). */

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

/* The writers' adapters to one signature (nbgi_image_writer). */

static int write_raw_entry(nbg_ctx *ctx, nbgi_outset *set, const char *path, nbgi_image_out *o)
{
    const int rc = nbgi_write_float_set(ctx, set, path, o->photons, o->npix);
    snprintf(o->said, sizeof o->said, "as %zu 4-byte floats", o->npix);
    return rc;
}

static int write_smv_entry(nbg_ctx *ctx, nbgi_outset *set, const char *path, nbgi_image_out *o)
{
    if (o->smv == NULL || o->counts == NULL)
        return nbgi_error(ctx, NBG_EINVAL, "writing %s: an SMV file needs its header and 16-bit counts", path);
    const int rc = nbgi_write_smv_set(ctx, set, path, o->smv, o->counts);
    snprintf(o->said, sizeof o->said, "as 2-byte integers");
    return rc;
}

static int write_pgm_entry(nbg_ctx *ctx, nbgi_outset *set, const char *path, nbgi_image_out *o)
{
    const int rc = nbgi_write_pgm_set(ctx, set, path, o->photons, o->fpixels, o->spixels, o->pgm_scale);
    snprintf(o->said, sizeof o->said, "with pixels scaled by %g", o->pgm_scale);
    return rc;
}

static int write_cbf_entry(nbg_ctx *ctx, nbgi_outset *set, const char *path, nbgi_image_out *o)
{
    /* a CBF holds 4-byte integers: the 16-bit counts widened */
    const int32_t *data = o->counts32;
    int32_t *wide = NULL;
    if (data == NULL) {
        int rc = nbgi_check_bytes(ctx, (double)o->npix * sizeof(int32_t), "the CBF's integers");
        if (rc != NBG_OK)
            return rc;
        if ((wide = malloc(sizeof(int32_t) * (o->npix > 0 ? o->npix : 1))) == NULL)
            return nbgi_error(ctx, NBG_ENOMEM, "out of memory for the integer images (%zu pixels)", o->npix);
        for (size_t i = 0; i < o->npix; ++i) wide[i] = o->counts[i];
        data = wide;
    }
    const int rc = nbgi_write_cbf_set(ctx, set, path, o->g, o->frame, data);
    free(wide);
    snprintf(o->said, sizeof o->said, "as a CBF of 4-byte integers");
    return rc;
}

static int write_nxmx_entry(nbg_ctx *ctx, nbgi_outset *set, const char *path, nbgi_image_out *o)
{
    /* NXmx holds a beam along -z only (dxtbx's reader assumes it): an experiment whose beam is tilted (a DIALS list's
     * that dials.index refined) is written turned as a whole, the same experiment */
    nbg_geometry gx = *o->g;
    nbg_panel *px = NULL;
    if (o->npanels > 0) {
        if ((px = malloc((size_t)o->npanels * sizeof *px)) == NULL)
            return nbgi_error(ctx, NBG_ENOMEM, "out of memory for %d panels", o->npanels);
        memcpy(px, o->panels, (size_t)o->npanels * sizeof *px);
    }
    nbg_geometry_beam_to_minus_z(&gx, px, o->npanels);
    const int floats = o->carry == NBGI_CARRY_PHOTONS;
    const int rc = nbgi_write_nxmx_panels_set(ctx, set, path, &gx, px, o->npanels,
                                              floats ? NBG_DATA_FLOAT32 : NBG_DATA_INT32,
                                              floats ? (const void *)o->photons : (const void *)o->counts32,
                                              o->nframes, o->mask);
    free(px);
    snprintf(o->said, sizeof o->said, "as NeXus NXmx (%d frame%s of %s)", o->nframes, o->nframes > 1 ? "s" : "",
             floats ? "4-byte floats" : "4-byte integers");
    return rc;
}

static int write_expt_entry(nbg_ctx *ctx, nbgi_outset *set, const char *path, nbgi_image_out *o)
{
    const int rc = nbgi_write_expt_panels_set(ctx, set, path, o->g, o->panels, o->npanels, o->images);
    snprintf(o->said, sizeof o->said, ", the DIALS experiment list (truth: beam, detector, goniometer, scan, crystal)");
    return rc;
}

/* The registry: sniffed in order by their first bytes (magic; NULL: anything, the last row). */
static const nbgi_image_format image_formats[] = {
    {"nxmx", "an NXmx file", "\x89HDF\r\n\x1a\n", 8, 0, read_nxmx_entry, write_nxmx_entry,
     NBGI_CARRY_PHOTONS | NBGI_CARRY_COUNTS | NBGI_CARRY_NOISE | NBGI_CARRY_GEOMETRY, NULL},
    {"cbf", "a CBF file", "###CBF", 6, 1, read_cbf_entry, write_cbf_entry,
     NBGI_CARRY_COUNTS | NBGI_CARRY_NOISE | NBGI_CARRY_GEOMETRY, NULL},
    {"smv", "an SMV file", "{\nHEADER_BYT", 12, 1, read_smv_entry, write_smv_entry,
     NBGI_CARRY_COUNTS | NBGI_CARRY_NOISE, NULL},
    {"pgm", "a PGM picture", "P5\n", 3, 1, NULL, write_pgm_entry, NBGI_CARRY_SCALED,
     "an 8-bit picture for the eye (scaled and clipped): nbgrad writes it and reads no image from it"},
    {"expt", "a DIALS experiment list", "{\n  \"__id__\": \"ExperimentList\"", 30, 0, NULL, write_expt_entry,
     NBGI_CARRY_GEOMETRY,
     "the experiment, no pixels: read by -expt and nbg_read_expt (its images are the files it names)"},
    {"raw", "a raw float file", NULL, 0, 1, read_raw_entry, write_raw_entry, NBGI_CARRY_PHOTONS, NULL},
};
#define NFORMATS (sizeof image_formats / sizeof image_formats[0])

const nbgi_image_format *nbgi_image_format_at(int i)
{
    return i >= 0 && (size_t)i < NFORMATS ? &image_formats[i] : NULL;
}

const nbgi_image_format *nbgi_image_format_named(nbg_ctx *ctx, const char *name)
{
    for (size_t i = 0; name != NULL && i < NFORMATS; ++i)
        if (strcmp(image_formats[i].name, name) == 0)
            return &image_formats[i];
    if (ctx != NULL) {
        char known[256];
        size_t at = 0;
        for (size_t i = 0; i < NFORMATS && at < sizeof known; ++i)
            at += (size_t)snprintf(known + at, sizeof known - at, "%s%s", i ? ", " : "", image_formats[i].name);
        nbgi_error(ctx, NBG_EINVAL, "unknown image format '%s' (nbgrad knows %s)", name != NULL ? name : "(null)",
                   known);
    }
    return NULL;
}

const nbgi_image_format *nbgi_image_format_sniff(const unsigned char *head, size_t n)
{
    size_t fmt = 0;
    while (image_formats[fmt].magic != NULL &&
           !(n >= image_formats[fmt].nmagic && memcmp(head, image_formats[fmt].magic, image_formats[fmt].nmagic) == 0))
        ++fmt;
    return &image_formats[fmt];
}

int nbgi_image_write(nbg_ctx *ctx, nbgi_outset *set, const char *format, const char *path, nbgi_image_out *o)
{
    const nbgi_image_format *f = nbgi_image_format_named(ctx, format);
    if (f == NULL)
        return NBG_EINVAL;
    if (o == NULL || path == NULL || path[0] == '\0')
        return nbgi_error(ctx, NBG_EINVAL, "writing %s: no file name or nothing to write", f->what);
    o->said[0] = '\0';
    if (f->write == NULL)
        return nbgi_error(ctx, NBG_EINVAL, "writing %s: nbgrad cannot write %s (%s)", path, f->what,
                          f->note != NULL ? f->note : "no writer");
    /* the image data the write is given, and the geometry, must be what the format carries */
    const int data = f->carries & (NBGI_CARRY_PHOTONS | NBGI_CARRY_COUNTS | NBGI_CARRY_NOISE);
    if (data != 0 && (o->carry & data) == 0) {
        return nbgi_error(ctx, NBG_EINVAL, "writing %s: %s holds %s, not %s", path, f->what,
                          (data & NBGI_CARRY_PHOTONS) ? "photons as floats" : "integer counts",
                          o->carry == NBGI_CARRY_PHOTONS ? "photons as floats" : "integer counts");
    }
    int have = 1;
    if (f->carries & NBGI_CARRY_SCALED)
        have = o->photons != NULL;
    else if (data != 0 && o->carry == NBGI_CARRY_PHOTONS)
        have = o->photons != NULL;
    else if (data != 0)
        have = f->frames == 0 ? o->counts32 != NULL : o->counts != NULL || o->counts32 != NULL;
    if (!have)
        return nbgi_error(ctx, NBG_EINVAL, "writing %s: %s needs the image", path, f->what);
    if ((f->carries & NBGI_CARRY_GEOMETRY) && o->g == NULL)
        return nbgi_error(ctx, NBG_EINVAL, "writing %s: %s needs the geometry", path, f->what);
    if (f->frames == 0 && data != 0 && o->nframes < 1)
        return nbgi_error(ctx, NBG_EINVAL, "writing %s: %d frames", path, o->nframes);
    return f->write(ctx, set, path, o);
}

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
    unsigned char head[NBGI_SNIFF_BYTES] = {0};
    FILE *f = fopen(path, "rb");
    if (f == NULL)
        return nbgi_error(ctx, NBG_EIO, "cannot open %s: %s", path, strerror(errno));
    const size_t n = fread(head, 1, sizeof head, f);
    fclose(f);
    const nbgi_image_format *fmt = nbgi_image_format_sniff(head, n);
    if (fmt->read == NULL)
        return nbgi_error(ctx, NBG_EUNSUP, "%s is %s, which holds no image nbgrad reads (%s)", path, fmt->what,
                          fmt->note != NULL ? fmt->note : "no reader");
    if (fmt->frames == 1 && frame != 0) {
        return nbgi_error(ctx, NBG_EINVAL, "%s: %s holds one image; frame %d was asked for", path, fmt->what, frame);
    }
    /* the readers fill a local description: the overloads need its saturation even when the caller wants none */
    nbg_geometry lg;
    nbgi_geometry_init(&lg);
    uint8_t *m = NULL;
    int rc, whole = 0;
    rc = fmt->read(ctx, path, frame, expect_npix, st.st_size, image, npix, &lg, mask != NULL ? &m : NULL,
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
    if (nbgi_unplaced_detector(fmt->name, &lg, path, why, sizeof why)) {
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
