/*
 * cbf.c -- CBF (imgCIF) images through CBFlib: the full-CBF writer (one frame of an nbg_geometry's scan, with the
 * axis categories that describe the whole experiment) and the reader behind nbg_read_image (full CBF with its
 * geometry, or a Pilatus-style miniCBF with what its text header carries).
 *
 * The reader never lets CBFlib near binary data: nbgrad finds, checks and decodes the binary sections itself
 * (src/cbfbin.c; CBFlib 0.9.7 overruns its buffers on a lying MIME header) and CBFlib parses a copy of the text in
 * which each section is a placeholder word.  Before CBFlib's geometry constructors run, the axes they would read
 * are checked (they crash on a goniometer with no readable axis and loop on cyclic dependencies), as is the count
 * of detector elements (CBFlib divides by it).
 *
 * How the geometry is written (DIALS's laboratory frame is imgCIF's: beam along -z, z towards the source):
 *
 *   GONIOMETER_PHI  rotation     goniometer  vector g->axis (the one scan axis)
 *                   or, for a multi-axis goniometer (g->goniometer), one rotation axis each, under its name, from the
 *                   outermost (depends on nothing) in, each depending on the next outer one; the scan axis with the
 *                   frame's angle and the scan's width, the others with their angle and increment 0
 *   SOURCE          general      source      vector g->direction (sample -> source; dxtbx reads it so)
 *   DETECTOR_Z      translation  detector    vector n = unit(fast x slow), turned so that the distance is >= 0
 *   DETECTOR_Y      translation  detector    vector slow, depends on DETECTOR_Z
 *   DETECTOR_X      translation  detector    vector fast, depends on DETECTOR_Y
 *   ELEMENT_X       translation  detector    vector fast, depends on DETECTOR_X   (the array's fast index)
 *   ELEMENT_Y       translation  detector    vector slow, depends on ELEMENT_X    (the array's slow index)
 *
 * The settings of DETECTOR_X/Y/Z (diffrn_scan_frame_axis) are the components of g->origin along fast, slow and n,
 * and the element axes start at displacement 0 with the pixel sizes as increments.  So CBFlib's
 * cbf_get_pixel_coordinates(0, 0) is g->origin exactly, which is what dxtbx (DetectorFactory.imgCIF_H) takes as
 * the panel's origin, the corner of pixel (0,0).  The imgCIF dictionary calls that point the centre of the first
 * pixel; we follow dxtbx, the reader that matters, and this reader does the same, so a round trip is exact and a
 * dxtbx read-back gives g->origin (not origin + half a pixel).
 *
 * Also following dxtbx rather than the dictionary: _diffrn_radiation.polarizn_source_ratio holds dxtbx's
 * polarization fraction (dxtbx reads it as such) and polarizn_source_norm the angle of the polarization normal
 * from +y towards +x (dxtbx builds the normal (sin a, cos a, 0); a normal with a z component loses it).
 *
 * Numbers are written with as many digits as make them read back to the same double (%.15g to %.17g).
 */
#include "formats.h"

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#ifndef NBG_HAVE_FORMATS

int nbgi_write_cbf_set(nbg_ctx *ctx, nbgi_outset *set, const char *path, const nbg_geometry *g, int frame,
                       const int32_t *data)
{
    (void)set, (void)g, (void)frame, (void)data;
    return nbgi_error(ctx, NBG_EUNSUP, "writing %s: CBF is not available: nbgrad was built without CBFlib (FORMATS=0)",
                      path != NULL ? path : "(null)");
}

int nbg_write_cbf(nbg_ctx *ctx, const char *path, const nbg_geometry *g, int frame, const int32_t *data)
{
    return nbgi_write_cbf_set(ctx, NULL, path, g, frame, data);
}

int nbg_read_cbf_panels(nbg_ctx *ctx, const char *path, nbg_geometry *g, nbg_panel **panels, int *npanels)
{
    (void)g;
    if (panels != NULL)
        *panels = NULL;
    if (npanels != NULL)
        *npanels = 0;
    return nbgi_error(ctx, NBG_EUNSUP, "reading %s: CBF is not available: nbgrad was built without CBFlib (FORMATS=0)",
                      path != NULL ? path : "(null)");
}

int nbgi_read_cbf_panels(nbg_ctx *ctx, const char *path, float **image, size_t *npix, nbg_geometry *g,
                         uint8_t **mask, nbg_panel **panels, int *npanels)
{
    if (panels != NULL)
        *panels = NULL;
    if (npanels != NULL)
        *npanels = 0;
    return nbgi_read_cbf(ctx, path, image, npix, g, mask);
}

int nbgi_read_cbf(nbg_ctx *ctx, const char *path, float **image, size_t *npix, nbg_geometry *g, uint8_t **mask)
{
    (void)g;
    if (image != NULL)
        *image = NULL;
    if (npix != NULL)
        *npix = 0;
    if (mask != NULL)
        *mask = NULL;
    return nbgi_error(ctx, NBG_EUNSUP, "reading %s: CBF is not available: nbgrad was built without CBFlib (FORMATS=0)",
                      path != NULL ? path : "(null)");
}

#else /* NBG_HAVE_FORMATS */

#include <cbf.h>
#include <cbf_simple.h>
#include <time.h>

#include "plan.h" /* nbgi_dot, nbgi_cross, nbgi_norm */

/* CBFlib's error codes are bit flags; the name of the lowest one set, for messages. */
static const char *cbf_code_name(int code)
{
    static const char *const names[] = {"CBF_FORMAT",   "CBF_ALLOC",    "CBF_ARGUMENT", "CBF_ASCII",
                                        "CBF_BINARY",   "CBF_BITCOUNT", "CBF_ENDOFDATA", "CBF_FILECLOSE",
                                        "CBF_FILEOPEN", "CBF_FILEREAD", "CBF_FILESEEK", "CBF_FILETELL",
                                        "CBF_FILEWRITE", "CBF_IDENTICAL", "CBF_NOTFOUND", "CBF_OVERFLOW",
                                        "CBF_UNDEFINED", "CBF_NOTIMPLEMENTED", "CBF_NOCOMPRESSION"};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; ++i) {
        if (code & (1 << i))
            return names[i];
    }
    return "CBFlib error";
}

/* The status a CBFlib error maps to: memory, I/O, or a malformed file. */
static int cbf_status(int code)
{
    if (code & CBF_ALLOC)
        return NBG_ENOMEM;
    if (code & (CBF_FILEOPEN | CBF_FILEREAD | CBF_FILESEEK | CBF_FILETELL | CBF_FILEWRITE | CBF_FILECLOSE))
        return NBG_EIO;
    return NBG_EFORMAT;
}

/* CBFlib's log (its messages about the file, e.g. the line of a syntax error): into memory, never to stderr, so
 * that a failure's message can quote it.  A NULL logfile would be simpler, but CBFlib 0.9.7's cbf_log then leaks
 * its message buffer. */
typedef struct {
    FILE *fp;
    char *buf;
    size_t len;
} cbflog;

static void log_open(cbflog *l, cbf_handle h)
{
    l->buf = NULL, l->len = 0;
    l->fp = open_memstream(&l->buf, &l->len);
    if (l->fp == NULL)
        l->fp = fopen("/dev/null", "w");
    cbf_set_cbf_logfile(h, l->fp);
}

/* The first line CBFlib logged, without its "CBFlib: " prefix, into out ("" when none). */
static void log_first(cbflog *l, char *out, size_t size)
{
    out[0] = '\0';
    if (l->fp == NULL || fflush(l->fp) != 0 || l->buf == NULL || l->len == 0)
        return;
    const char *p = l->buf;
    if (strncmp(p, "CBFlib: ", 8) == 0)
        p += 8;
    const size_t n = strcspn(p, "\r\n");
    snprintf(out, size, "; %.*s", (int)(n < size - 3 ? n : size - 3), p);
}

/* After cbf_free_handle: CBFlib may log until then. */
static void log_close(cbflog *l)
{
    if (l->fp != NULL)
        fclose(l->fp);
    free(l->buf);
    l->fp = NULL, l->buf = NULL;
}

/* ------------------------------------------------------------------------------------------------------------ */
/* Writing                                                                                                      */
/* ------------------------------------------------------------------------------------------------------------ */

#define W_MAXCOLS 12
#define W_NUMS 40

/* A category being written: its columns, and the first CBFlib error (later calls do nothing after one, so the
 * writer reads as a list of categories and checks once). */
typedef struct {
    cbf_handle h;
    int err;
    const char *where; /* the category where err happened */
    const char *cat;
    const char *cols[W_MAXCOLS];
    int ncols;
    char num[W_NUMS][40]; /* ring of formatted numbers: a row's values live until W_NUMS more are formatted */
    int inum;
} cbfw;

static void w_fail(cbfw *w, int code)
{
    if (code != 0 && w->err == 0) {
        w->err = code;
        w->where = w->cat;
    }
}

/* Starts category cat with the columns given (NULL-terminated). */
static void w_category(cbfw *w, const char *cat, ...)
{
    if (w->err != 0)
        return;
    w->cat = cat;
    w->ncols = 0;
    w_fail(w, cbf_new_category(w->h, cat));
    va_list ap;
    va_start(ap, cat);
    for (const char *c; w->err == 0 && (c = va_arg(ap, const char *)) != NULL;) {
        if (w->ncols == W_MAXCOLS) {
            w_fail(w, CBF_ARGUMENT);
            break;
        }
        w->cols[w->ncols++] = c;
        w_fail(w, cbf_new_column(w->h, c));
    }
    va_end(ap);
}

/* Sets the current cell: "." is CIF's null (not applicable), a value with blanks or quotes is double-quoted text. */
static void w_value(cbfw *w, const char *v)
{
    w_fail(w, cbf_set_value(w->h, v));
    if (w->err == 0 && strcmp(v, ".") == 0)
        w_fail(w, cbf_set_typeofvalue(w->h, "null"));
    else if (w->err == 0 && (v[0] == '\0' || strpbrk(v, " \t'\"#;[]") != NULL))
        w_fail(w, cbf_set_typeofvalue(w->h, "dblq"));
}

/* Adds a row: one string per column. */
static void w_row(cbfw *w, ...)
{
    if (w->err != 0)
        return;
    w_fail(w, cbf_new_row(w->h));
    va_list ap;
    va_start(ap, w);
    for (int i = 0; i < w->ncols && w->err == 0; ++i) {
        const char *v = va_arg(ap, const char *);
        w_fail(w, cbf_find_column(w->h, w->cols[i]));
        if (w->err == 0)
            w_value(w, v);
    }
    va_end(ap);
}

/* A double as the shortest of %.15g..%.17g that reads back to the same value (so 0.1 stays "0.1"). */
static const char *w_num(cbfw *w, double x)
{
    char *b = w->num[w->inum++ % W_NUMS];
    if (x == 0)
        x = 0; /* no "-0" */
    for (int p = 15; p <= 17; ++p) {
        snprintf(b, sizeof w->num[0], "%.*g", p, x);
        if (strtod(b, NULL) == x)
            break;
    }
    return b;
}

static const char *w_int(cbfw *w, long x)
{
    char *b = w->num[w->inum++ % W_NUMS];
    snprintf(b, sizeof w->num[0], "%ld", x);
    return b;
}

/* Solves o = a f + b s + c n for (a, b, c) by Cramer's rule (f, s, n need not be exactly orthogonal). */
static void decompose(const double o[3], const double f[3], const double s[3], const double n[3], double out[3])
{
    double sxn[3], oxn[3], sxo[3];
    nbgi_cross(s, n, sxn);
    nbgi_cross(o, n, oxn);
    nbgi_cross(s, o, sxo);
    const double det = nbgi_dot(f, sxn);
    out[0] = nbgi_dot(o, sxn) / det;
    out[1] = nbgi_dot(f, oxn) / det;
    out[2] = nbgi_dot(f, sxo) / det;
}

/* The date written into _diffrn_scan_frame.date (dxtbx requires one): $SOURCE_DATE_EPOCH when set, so that a
 * run can be made byte-reproducible, otherwise now. */
static void w_date(char *buf, size_t size)
{
    time_t t = time(NULL);
    const char *e = getenv("SOURCE_DATE_EPOCH");
    if (e != NULL && e[0] != '\0') {
        char *end;
        const long long v = strtoll(e, &end, 10);
        if (*end == '\0' && v >= 0)
            t = (time_t)v;
    }
    struct tm tm;
    if (gmtime_r(&t, &tm) == NULL || strftime(buf, size, "%Y-%m-%dT%H:%M:%S", &tm) == 0)
        snprintf(buf, size, "1970-01-01T00:00:00");
}

/* Builds the whole data block in w->h. */
static void w_build(cbfw *w, const nbg_geometry *g, int frame, const int32_t *data)
{
    const double angle = g->scan_start + frame * g->scan_width;
    double n[3], pos[3];
    nbgi_cross(g->fast, g->slow, n);
    const double nn = nbgi_norm(n);
    for (int i = 0; i < 3; ++i)
        n[i] /= nn;
    decompose(g->origin, g->fast, g->slow, n, pos);
    if (pos[2] < 0) { /* the detector normal pointing away from the sample: a positive distance reads better */
        for (int i = 0; i < 3; ++i)
            n[i] = -n[i];
        pos[2] = -pos[2];
    }
    /* dxtbx's normal is (sin a, cos a, 0): the angle from +y towards +x */
    const double pol_angle = atan2(g->polarization_normal[0], g->polarization_normal[1]) * (180 / M_PI);
    char date[40];
    w_date(date, sizeof date);
    /* a multi-axis goniometer: its axes from the innermost (the sample's) out, each depending on the next outer one;
     * else the one axis GONIOMETER_PHI */
    static const char *const reserved[] = {"SOURCE", "DETECTOR_X", "DETECTOR_Y", "DETECTOR_Z", "ELEMENT_X",
                                           "ELEMENT_Y", NULL};
    nbg_goniometer gn;
    char names[NBG_GONIO_MAX_AXES][32];
    nbgi_goniometer_written(g, &gn);
    if (g->goniometer.naxes <= 0) {
        gn.naxes = 1, gn.scan_axis = 0;
        memcpy(gn.axes[0], g->axis, sizeof g->axis);
        snprintf(names[0], sizeof names[0], "GONIOMETER_PHI");
    } else {
        for (int i = 0; i < gn.naxes; ++i)
            nbgi_goniometer_name(&gn, i, reserved, names[i]);
    }

    w_fail(w, cbf_new_datablock(w->h, "image_1"));

    w_category(w, "diffrn", "id", "crystal_id", NULL);
    w_row(w, "DS1", "DIFFRN_CRYSTAL");

    w_category(w, "diffrn_source", "diffrn_id", "source", "type", NULL);
    w_row(w, "DS1", "simulated", "nbgrad simulation");

    w_category(w, "diffrn_radiation", "diffrn_id", "wavelength_id", "probe", "polarizn_source_ratio",
               "polarizn_source_norm", "div_x_source", "div_y_source", NULL);
    w_row(w, "DS1", "WAVELENGTH1", "x-ray", w_num(w, g->polarization_fraction), w_num(w, pol_angle), "0", "0");

    w_category(w, "diffrn_radiation_wavelength", "id", "wavelength", "wt", NULL);
    w_row(w, "WAVELENGTH1", w_num(w, g->wavelength), "1");

    w_category(w, "diffrn_measurement", "diffrn_id", "id", "number_of_axes", "method", NULL);
    w_row(w, "DS1", "GONIOMETER", w_int(w, gn.naxes), "rotation");

    w_category(w, "diffrn_measurement_axis", "measurement_id", "axis_id", NULL);
    for (int i = gn.naxes - 1; i >= 0; --i)
        w_row(w, "GONIOMETER", names[i]);

    /* The sensor material and mu have no imgCIF item: they go into the details text, which this reader parses;
     * so does how nbgrad rendered the sensor (its model and layers, as an experiment list's nbgrad_sensor) */
    char details[160];
    const int n0 = snprintf(details, sizeof details, "sensor %s mu %s /mm",
                            g->material[0] != '\0' ? g->material : "unknown", w_num(w, g->mu));
    if (g->sensor_model != 0 && g->sensor_layers > 0 && n0 > 0 && (size_t)n0 < sizeof details)
        snprintf(details + n0, sizeof details - (size_t)n0, "; nbgrad model %s layers %d",
                 g->sensor_model == NBG_SENSOR_NANOBRAGG ? "nanobragg" : "physical", g->sensor_layers);
    w_category(w, "diffrn_detector", "diffrn_id", "id", "type", "details", "number_of_axes", "layer_thickness", NULL);
    w_row(w, "DS1", "DETECTOR", "nbgrad simulated detector", details, "3", w_num(w, g->thickness));

    w_category(w, "diffrn_detector_axis", "detector_id", "axis_id", NULL);
    w_row(w, "DETECTOR", "DETECTOR_X");
    w_row(w, "DETECTOR", "DETECTOR_Y");
    w_row(w, "DETECTOR", "DETECTOR_Z");

    w_category(w, "diffrn_detector_element", "id", "detector_id", NULL);
    w_row(w, "ELEMENT1", "DETECTOR");

    w_category(w, "diffrn_data_frame", "id", "detector_element_id", "array_id", "binary_id", NULL);
    w_row(w, "FRAME1", "ELEMENT1", "ARRAY1", "1");

    w_category(w, "diffrn_scan", "id", "frame_id_start", "frame_id_end", "frames", NULL);
    w_row(w, "SCAN1", "FRAME1", "FRAME1", "1");

    /* The scan of this file is its one frame: dxtbx takes angle_start as the goniometer's setting and CBFlib the
     * increment as the oscillation width. */
    w_category(w, "diffrn_scan_axis", "scan_id", "axis_id", "angle_start", "angle_range", "angle_increment",
               "displacement_start", "displacement_range", "displacement_increment", NULL);
    for (int i = gn.naxes - 1; i >= 0; --i) {
        if (i == gn.scan_axis)
            w_row(w, "SCAN1", names[i], w_num(w, angle), w_num(w, g->scan_width), w_num(w, g->scan_width), "0", "0",
                  "0");
        else
            w_row(w, "SCAN1", names[i], w_num(w, gn.angles[i]), "0", "0", "0", "0", "0");
    }
    w_row(w, "SCAN1", "DETECTOR_Z", "0", "0", "0", w_num(w, pos[2]), "0", "0");
    w_row(w, "SCAN1", "DETECTOR_Y", "0", "0", "0", w_num(w, pos[1]), "0", "0");
    w_row(w, "SCAN1", "DETECTOR_X", "0", "0", "0", w_num(w, pos[0]), "0", "0");

    w_category(w, "diffrn_scan_frame", "frame_id", "scan_id", "frame_number", "integration_time", "date", NULL);
    w_row(w, "FRAME1", "SCAN1", w_int(w, frame + 1L), w_num(w, g->exposure), date);

    w_category(w, "diffrn_scan_frame_axis", "frame_id", "axis_id", "angle", "displacement", NULL);
    for (int i = gn.naxes - 1; i >= 0; --i)
        w_row(w, "FRAME1", names[i], w_num(w, i == gn.scan_axis ? angle : gn.angles[i]), "0");
    w_row(w, "FRAME1", "DETECTOR_Z", "0", w_num(w, pos[2]));
    w_row(w, "FRAME1", "DETECTOR_Y", "0", w_num(w, pos[1]));
    w_row(w, "FRAME1", "DETECTOR_X", "0", w_num(w, pos[0]));

    w_category(w, "axis", "id", "type", "equipment", "depends_on", "vector[1]", "vector[2]", "vector[3]",
               "offset[1]", "offset[2]", "offset[3]", NULL);
    for (int i = gn.naxes - 1; i >= 0; --i)
        w_row(w, names[i], "rotation", "goniometer", i + 1 < gn.naxes ? names[i + 1] : ".", w_num(w, gn.axes[i][0]),
              w_num(w, gn.axes[i][1]), w_num(w, gn.axes[i][2]), "0", "0", "0");
    w_row(w, "SOURCE", "general", "source", ".", w_num(w, g->direction[0]), w_num(w, g->direction[1]),
          w_num(w, g->direction[2]), "0", "0", "0");
    w_row(w, "DETECTOR_Z", "translation", "detector", ".", w_num(w, n[0]), w_num(w, n[1]), w_num(w, n[2]), "0", "0",
          "0");
    w_row(w, "DETECTOR_Y", "translation", "detector", "DETECTOR_Z", w_num(w, g->slow[0]), w_num(w, g->slow[1]),
          w_num(w, g->slow[2]), "0", "0", "0");
    w_row(w, "DETECTOR_X", "translation", "detector", "DETECTOR_Y", w_num(w, g->fast[0]), w_num(w, g->fast[1]),
          w_num(w, g->fast[2]), "0", "0", "0");
    w_row(w, "ELEMENT_X", "translation", "detector", "DETECTOR_X", w_num(w, g->fast[0]), w_num(w, g->fast[1]),
          w_num(w, g->fast[2]), "0", "0", "0");
    w_row(w, "ELEMENT_Y", "translation", "detector", "ELEMENT_X", w_num(w, g->slow[0]), w_num(w, g->slow[1]),
          w_num(w, g->slow[2]), "0", "0", "0");

    w_category(w, "array_structure_list", "array_id", "index", "dimension", "precedence", "direction", "axis_set_id",
               NULL);
    w_row(w, "ARRAY1", "1", w_int(w, g->fpixels), "1", "increasing", "ELEMENT_X");
    w_row(w, "ARRAY1", "2", w_int(w, g->spixels), "2", "increasing", "ELEMENT_Y");

    w_category(w, "array_structure_list_axis", "axis_set_id", "axis_id", "displacement", "displacement_increment",
               NULL);
    w_row(w, "ELEMENT_X", "ELEMENT_X", "0", w_num(w, g->pixel_f));
    w_row(w, "ELEMENT_Y", "ELEMENT_Y", "0", w_num(w, g->pixel_s));

    /* array_element_size is in metres (imgCIF): the mm value with an exponent, so that it reads as written */
    char size_f[48], size_s[48];
    const char *mf = w_num(w, g->pixel_f), *ms = w_num(w, g->pixel_s);
    snprintf(size_f, sizeof size_f, "%s%s", strchr(mf, 'e') ? w_num(w, g->pixel_f * 1e-3) : mf,
             strchr(mf, 'e') ? "" : "e-3");
    snprintf(size_s, sizeof size_s, "%s%s", strchr(ms, 'e') ? w_num(w, g->pixel_s * 1e-3) : ms,
             strchr(ms, 'e') ? "" : "e-3");
    w_category(w, "array_element_size", "array_id", "index", "size", NULL);
    w_row(w, "ARRAY1", "1", size_f);
    w_row(w, "ARRAY1", "2", size_s);

    /* The pedestal is what the stored values carry on top of the signal: linearity 'offset' adds
     * _array_intensities.offset = -pedestal to each value.  undefined_value -1 marks gaps as on Pilatus (dxtbx's
     * trusted range is (undefined_value, overload)); an unknown saturation leaves the overload out. */
    const int has_overload = isfinite(g->saturation);
    if (has_overload) {
        w_category(w, "array_intensities", "array_id", "binary_id", "linearity", "offset", "gain", "gain_esd",
                   "overload", "undefined_value", "pixel_fast_bin_size", "pixel_slow_bin_size", NULL);
        w_row(w, "ARRAY1", "1", g->pedestal != 0 ? "offset" : "linear", w_num(w, -g->pedestal), w_num(w, g->gain),
              "0", w_num(w, g->saturation), "-1", "1", "1");
    } else {
        w_category(w, "array_intensities", "array_id", "binary_id", "linearity", "offset", "gain", "gain_esd",
                   "undefined_value", "pixel_fast_bin_size", "pixel_slow_bin_size", NULL);
        w_row(w, "ARRAY1", "1", g->pedestal != 0 ? "offset" : "linear", w_num(w, -g->pedestal), w_num(w, g->gain),
              "0", "-1", "1", "1");
    }

    w_category(w, "array_structure", "id", "encoding_type", "compression_type", "byte_order", NULL);
    w_row(w, "ARRAY1", "signed 32-bit integer", "byte_offsets", "little_endian");

    w_category(w, "array_data", "array_id", "binary_id", "data", NULL);
    w_row(w, "ARRAY1", "1", "?");
    if (w->err == 0)
        w_fail(w, cbf_find_column(w->h, "data"));
    if (w->err == 0) {
        /* CBFlib compresses from the caller's array without writing to it (its prototype is not const). */
        const size_t nel = (size_t)g->fpixels * (size_t)g->spixels;
        w_fail(w, cbf_set_integerarray_wdims_fs(w->h, CBF_BYTE_OFFSET, 1, (void *)(uintptr_t)data, sizeof(int32_t), 1,
                                                nel, "little_endian", (size_t)g->fpixels, (size_t)g->spixels, 0, 0));
    }
}

int nbgi_write_cbf_set(nbg_ctx *ctx, nbgi_outset *set, const char *path, const nbg_geometry *g, int frame,
                       const int32_t *data)
{
    if (path == NULL || path[0] == '\0')
        return nbgi_error(ctx, NBG_EINVAL, "writing a CBF file: no file name");
    char what[300];
    snprintf(what, sizeof what, "writing %s", path);
    int rc = nbgi_geometry_check(ctx, g, what);
    if (rc != NBG_OK)
        return rc;
    if (frame < 0 || frame >= g->nframes)
        return nbgi_error(ctx, NBG_EINVAL, "writing %s: frame %d is outside the scan of %d images (0 to %d)", path,
                          frame, g->nframes, g->nframes - 1);
    if (data == NULL)
        return nbgi_error(ctx, NBG_EINVAL, "writing %s: no image data", path);

    cbfw w;
    memset(&w, 0, sizeof w);
    int code = cbf_make_handle(&w.h);
    if (code != 0)
        return nbgi_error(ctx, cbf_status(code), "writing %s: CBFlib could not make a handle (%s)", path,
                          cbf_code_name(code));
    cbflog log;
    log_open(&log, w.h); /* the library never prints: failures come back as codes */
    w_build(&w, g, frame, data);
    if (w.err != 0) {
        cbf_free_handle(w.h);
        log_close(&log);
        return nbgi_error(ctx, cbf_status(w.err), "writing %s: CBFlib failed building category %s (%s)", path,
                          w.where != NULL ? w.where : "(data block)", cbf_code_name(w.err));
    }

    nbgi_out o;
    rc = nbgi_out_open(ctx, path, &o);
    if (rc != NBG_OK) {
        cbf_free_handle(w.h);
        log_close(&log);
        return rc;
    }
    /* isbuffer = 0: CBFlib neither reads the stream back nor closes it, so o.fp stays ours to finish or abort.
     * Binary sections as raw bytes (ENC_NONE) with MIME headers and an MD5 digest, as Pilatus and dxtbx expect. */
    errno = 0;
    code = cbf_write_widefile(w.h, o.fp, 0, CBF, MIME_HEADERS | MSG_DIGEST, ENC_NONE | ENC_CRTERM | ENC_LFTERM);
    const int werr = ferror(o.fp) ? errno : 0; /* a full disk: the stream's own error */
    cbf_free_handle(w.h);
    log_close(&log);
    if (code != 0) {
        nbgi_out_abort(&o);
        return nbgi_error(ctx, cbf_status(code), "writing %s: CBFlib could not write the file (%s%s%s)", path,
                          cbf_code_name(code), werr != 0 ? ": " : "", werr != 0 ? strerror(werr) : "");
    }
    return nbgi_out_finish(ctx, &o, set);
}

int nbg_write_cbf(nbg_ctx *ctx, const char *path, const nbg_geometry *g, int frame, const int32_t *data)
{
    return nbgi_write_cbf_set(ctx, NULL, path, g, frame, data);
}

/* ------------------------------------------------------------------------------------------------------------ */
/* Reading                                                                                                      */
/* ------------------------------------------------------------------------------------------------------------ */

/* The double in column col of the first row of category cat; 0 when found. */
static int r_double(cbf_handle h, const char *cat, const char *col, double *v)
{
    int code = cbf_find_category(h, cat);
    if (code == 0)
        code = cbf_find_column(h, col);
    if (code == 0)
        code = cbf_rewind_row(h);
    if (code == 0)
        code = cbf_get_doublevalue(h, v);
    return code;
}

static int r_string(cbf_handle h, const char *cat, const char *col, const char **v)
{
    int code = cbf_find_category(h, cat);
    if (code == 0)
        code = cbf_find_column(h, col);
    if (code == 0)
        code = cbf_rewind_row(h);
    if (code == 0)
        code = cbf_get_value(h, v);
    return code == 0 && *v == NULL ? CBF_NOTFOUND : code;
}

/* The vector of the first axis with the given equipment (e.g. "source"); 0 when found. */
static int r_equipment_vector(cbf_handle h, const char *equipment, double v[3])
{
    unsigned int rows = 0;
    /* CBFlib selects a row only with a current column: find one first */
    if (cbf_find_category(h, "axis") != 0 || cbf_count_rows(h, &rows) != 0 || cbf_find_column(h, "equipment") != 0)
        return CBF_NOTFOUND;
    for (unsigned int r = 0; r < rows; ++r) {
        const char *eq = NULL, *id = NULL;
        if (cbf_select_row(h, r) != 0 || cbf_find_column(h, "equipment") != 0 || cbf_get_value(h, &eq) != 0)
            return CBF_NOTFOUND;
        if (eq == NULL || strcasecmp(eq, equipment) != 0)
            continue;
        if (cbf_find_column(h, "id") != 0 || cbf_get_value(h, &id) != 0 || id == NULL)
            return CBF_NOTFOUND;
        return cbf_get_axis_vector(h, id, &v[0], &v[1], &v[2]);
    }
    return CBF_NOTFOUND;
}

/* A Pilatus header line "# <key> <value>..." of the miniCBF text: the text after the key, or NULL. */
static const char *mini_field(const char *text, const char *key)
{
    const size_t k = strlen(key);
    for (const char *p = text; p != NULL && *p != '\0'; p = strchr(p, '\n'), p = p != NULL ? p + 1 : NULL) {
        const char *q = p;
        while (*q == ' ' || *q == '\t')
            ++q;
        if (*q != '#')
            continue;
        ++q;
        while (*q == ' ' || *q == '\t')
            ++q;
        if (strncmp(q, key, k) == 0)
            return q + k;
    }
    return NULL;
}

/* The geometry a Pilatus miniCBF header gives (dxtbx's convention for these: fast +x, slow -y, the detector normal
 * to the beam along -z at Detector_distance, the beam at Beam_xy pixels, rotation axis +x).  Fields the header
 * lacks keep their defaults (NaN wavelength, no detector distance: origin 0). */
static void mini_geometry(const char *text, nbg_geometry *g)
{
    const char *f;
    double a, b;
    g->fast[0] = 1, g->fast[1] = 0, g->fast[2] = 0;
    g->slow[0] = 0, g->slow[1] = -1, g->slow[2] = 0;
    if ((f = mini_field(text, "Pixel_size")) != NULL && sscanf(f, " %lf m x %lf", &a, &b) == 2)
        g->pixel_f = a * 1e3, g->pixel_s = b * 1e3;
    if ((f = mini_field(text, "Wavelength")) != NULL && sscanf(f, " %lf", &a) == 1)
        g->wavelength = a;
    double dist = 0, bx = 0, by = 0;
    if ((f = mini_field(text, "Detector_distance")) != NULL && sscanf(f, " %lf", &a) == 1)
        dist = a * 1e3;
    if ((f = mini_field(text, "Beam_xy")) != NULL && sscanf(f, " (%lf , %lf", &a, &b) == 2)
        bx = a, by = b;
    g->origin[0] = -bx * g->pixel_f;
    g->origin[1] = by * g->pixel_s;
    g->origin[2] = -dist;
    if ((f = mini_field(text, "Count_cutoff")) != NULL && sscanf(f, " %lf", &a) == 1)
        g->saturation = a;
    if ((f = mini_field(text, "Exposure_time")) != NULL && sscanf(f, " %lf", &a) == 1)
        g->exposure = a;
    int start = 0, inc = 0;
    if ((f = mini_field(text, "Start_angle")) != NULL && sscanf(f, " %lf", &a) == 1)
        g->scan_start = a, start = 1;
    if ((f = mini_field(text, "Angle_increment")) != NULL && sscanf(f, " %lf", &a) == 1)
        g->scan_width = a, inc = 1;
    g->scan_stated = start ? 1 + inc : 0;
    /* "# Detector: PILATUS 12M, S/N 120-0100": the detector's name as written */
    if ((f = mini_field(text, "Detector:")) != NULL) {
        while (*f == ' ' || *f == '\t')
            ++f;
        size_t n = strcspn(f, "\r\n");
        while (n > 0 && (f[n - 1] == ' ' || f[n - 1] == '\t'))
            --n;
        snprintf(g->detector, sizeof g->detector, "%.*s", (int)n, f);
    }
    /* "# Silicon sensor, thickness 0.000320 m" */
    const char *p = strstr(text, "sensor, thickness");
    if (p != NULL) {
        char mat[16];
        while (p > text && p[-1] != '#' && p[-1] != '\n')
            --p;
        if (sscanf(p, " %15s sensor, thickness %lf", mat, &a) == 2) {
            g->thickness = a * 1e3;
            if (strcmp(mat, "unknown") != 0)
                snprintf(g->material, sizeof g->material, "%s", strcmp(mat, "Silicon") == 0 ? "Si" : mat);
        }
    }
}

/* ------------------------------------------------------------------------------------------------------------ */
/* Guarding CBFlib's geometry constructors                                                                      */
/* ------------------------------------------------------------------------------------------------------------ */

/* CBFlib 0.9.7 builds a goniometer or a detector (cbf_construct_goniometer, cbf_construct_detector) as a
 * "positioner": a list of axes read from the axis category, which it trusts.  It looks at its first axis without
 * checking that it read one (a goniometer whose axes are missing, misnamed or unreadable crashes it), and when an
 * axis depends on one the list lacks it reads that one and stops connecting the others.  So nbgrad first
 * collects, with CBFlib's table calls only, the axes each constructor would list (in the same way: the
 * measurement's or the detector's rows of diffrn_measurement_axis / diffrn_detector_axis, and the array's surface
 * axes), and calls it only when each of them is in the axis category once, reads as CBFlib reads it, and depends
 * (depends_on, rotation_axis) only on axes of the same list, without a cycle. */

#define POS_MAX 32

typedef struct {
    const char *id[POS_MAX];
    int setting[POS_MAX]; /* CBFlib's read_setting: 1 listed with a setting, 0 a surface axis */
    int n;
} axis_set;

static int set_find(const axis_set *s, const char *id)
{
    for (int i = 0; i < s->n; ++i) {
        if (strcasecmp(s->id[i], id) == 0)
            return i;
    }
    return -1;
}

static int set_add(axis_set *s, const char *id, int setting)
{
    if (id == NULL || s->n == POS_MAX)
        return -1;
    if (set_find(s, id) < 0)
        s->id[s->n] = id, s->setting[s->n++] = setting;
    return 0;
}

/* The axis id's dependency in column col (depends_on, rotation_axis): NULL when none ('.', '?', no column). */
static const char *axis_dep(cbf_handle h, const char *id, const char *col)
{
    const char *v = NULL, *type = NULL;
    if (cbf_find_category(h, "axis") != 0 || cbf_find_column(h, "id") != 0 || cbf_find_row(h, id) != 0 ||
        cbf_find_column(h, col) != 0 || cbf_get_value(h, &v) != 0 || v == NULL)
        return NULL;
    if (cbf_get_typeofvalue(h, &type) == 0 && type != NULL && strcmp(type, "null") == 0)
        return NULL;
    return strcmp(v, ".") == 0 || strcmp(v, "?") == 0 ? NULL : v;
}

/* 1 when axis id is in the axis category once and reads as CBFlib's positioner reads it. */
static int axis_readable(cbf_handle h, const char *id, int setting)
{
    unsigned int rows = 0, same = 0;
    if (cbf_find_category(h, "axis") != 0 || cbf_count_rows(h, &rows) != 0 || cbf_find_column(h, "id") != 0)
        return 0;
    for (unsigned int r = 0; r < rows; ++r) {
        const char *v = NULL;
        if (cbf_select_row(h, r) != 0 || cbf_find_column(h, "id") != 0 || cbf_get_value(h, &v) != 0 || v == NULL)
            return 0;
        same += strcasecmp(v, id) == 0;
    }
    const char *v = NULL;
    double a, b, c;
    cbf_axis_type type;
    if (same != 1 || cbf_find_column(h, "id") != 0 || cbf_find_row(h, id) != 0 ||
        cbf_find_column(h, "depends_on") != 0 || cbf_get_value(h, &v) != 0)
        return 0;
    if (cbf_find_column(h, "rotation_axis") == 0 && cbf_get_value(h, &v) != 0)
        return 0;
    if (cbf_find_column(h, "rotation") == 0 && cbf_get_doublevalue(h, &a) != 0)
        return 0;
    if (cbf_get_axis_type(h, id, &type) != 0 || cbf_get_axis_vector(h, id, &a, &b, &c) != 0)
        return 0;
    /* a rotation or translation along a vector of no length, or not finite: CBFlib's positioners crash on it (a
     * goniometer axis 0 0 0 read address 8 in cbf_construct_goniometer; found by fuzz-image) */
    if (type != CBF_GENERAL_AXIS && !(isfinite(a) && isfinite(b) && isfinite(c) && a * a + b * b + c * c > 0))
        return 0;
    if (cbf_get_axis_offset(h, id, &a, &b, &c) != 0 || !isfinite(a) || !isfinite(b) || !isfinite(c))
        return 0;
    return !setting || type == CBF_GENERAL_AXIS || cbf_get_axis_setting(h, 0, id, &a, &b) == 0;
}

/* 1 when there is no dependency cycle through axis i of s (colour: 0 unseen, 1 on the path, 2 done). */
static int acyclic_from(cbf_handle h, const axis_set *s, int i, int *colour)
{
    static const char *const cols[2] = {"depends_on", "rotation_axis"};
    if (colour[i] != 0)
        return colour[i] == 2;
    colour[i] = 1;
    for (int c = 0; c < 2; ++c) {
        const char *dep = axis_dep(h, s->id[i], cols[c]);
        const int j = dep != NULL ? set_find(s, dep) : -1;
        if (dep != NULL && (j < 0 || !acyclic_from(h, s, j, colour)))
            return 0; /* a dependency outside the list, or a cycle */
    }
    colour[i] = 2;
    return 1;
}

/* 1 when every axis of s is readable and depends only on axes of s, without a cycle. */
static int set_sound(cbf_handle h, const axis_set *s)
{
    int colour[POS_MAX] = {0};
    for (int i = 0; i < s->n; ++i) {
        if (!axis_readable(h, s->id[i], s->setting[i]) || !acyclic_from(h, s, i, colour))
            return 0;
    }
    return 1;
}

/* Adds the axis_id of each row of cat whose owner column (or its deprecated alias "id") is owner; -1 when the
 * list overflows or a row cannot be read. */
static int add_owned_axes(cbf_handle h, const char *cat, const char *owner_col, const char *owner, axis_set *s)
{
    unsigned int rows = 0;
    if (cbf_find_category(h, cat) != 0 || cbf_count_rows(h, &rows) != 0)
        return 0;
    const char *col = cbf_find_column(h, owner_col) == 0 ? owner_col : "id";
    for (unsigned int r = 0; r < rows; ++r) {
        const char *who = NULL, *axis = NULL;
        /* CBFlib selects a row only with a current column */
        if (cbf_find_column(h, col) != 0 || cbf_select_row(h, r) != 0 || cbf_get_value(h, &who) != 0 || who == NULL)
            return -1;
        if (strcasecmp(who, owner) != 0)
            continue;
        if (cbf_find_column(h, "axis_id") != 0 || cbf_get_value(h, &axis) != 0 || set_add(s, axis, 1) != 0)
            return -1;
    }
    return 0;
}

/* The id of the row of cat whose diffrn_id is the experiment's (as the constructors find it); NULL when none. */
static const char *owner_id(cbf_handle h, const char *cat)
{
    const char *diffrn = NULL, *id = NULL;
    if (cbf_get_diffrn_id(h, &diffrn) != 0 || diffrn == NULL || cbf_find_category(h, cat) != 0 ||
        cbf_find_column(h, "diffrn_id") != 0 || cbf_find_row(h, diffrn) != 0 || cbf_find_column(h, "id") != 0 ||
        cbf_get_value(h, &id) != 0)
        return NULL;
    return id;
}

/* 1 when cbf_construct_goniometer may be called: it fails cleanly before reading axes, or every axis it reads is
 * sound; 0 when it would crash (nbgrad then takes the file for a still, as it does when the constructor fails). */
static int goniometer_safe(cbf_handle h)
{
    const char *id = owner_id(h, "diffrn_measurement");
    if (id == NULL)
        return 1; /* the constructor stops before its positioner */
    axis_set s = {.n = 0};
    if (add_owned_axes(h, "diffrn_measurement_axis", "measurement_id", id, &s) != 0 || s.n == 0)
        return 0;
    return set_sound(h, &s);
}

/* A goniometer of more than one axis (a kappa, a SmarGon: called after goniometer_safe and CBFlib's goniometer
 * read it, g->axis CBFlib's rotation axis): kept whole in g->goniometer as dxtbx's MultiAxisGoniometer has it, when
 * the measurement's axes are rotations that form one depends_on chain.  Innermost first (the axis no other
 * depends on), each axis's angle its setting (cbf_get_axis_setting: the frame's), the scan axis the one with a
 * nonzero increment, else the one along CBFlib's rotation axis.  g->axis then becomes the laboratory's scan axis,
 * S unit(scan axis), as dxtbx's: CBFlib gives the scan axis's own vector, not turned by the axes outside it (the
 * same for a SmarGon scanning its outermost axis, not for a kappa scanning an inner one).  Anything else leaves
 * g->goniometer unset and g->axis CBFlib's, as before. */
static void multi_axis(cbf_handle h, nbg_geometry *g)
{
    const char *id = owner_id(h, "diffrn_measurement");
    axis_set s = {.n = 0};
    if (id == NULL || add_owned_axes(h, "diffrn_measurement_axis", "measurement_id", id, &s) != 0 || s.n < 2 ||
        s.n > NBG_GONIO_MAX_AXES)
        return;
    /* the innermost axis: the one no other depends on */
    int inner = -1;
    for (int i = 0; i < s.n; ++i) {
        int used = 0;
        for (int j = 0; j < s.n && !used; ++j) {
            const char *dep = axis_dep(h, s.id[j], "depends_on");
            used = dep != NULL && strcasecmp(dep, s.id[i]) == 0;
        }
        if (!used) {
            if (inner >= 0)
                return; /* two branches: not a chain */
            inner = i;
        }
    }
    nbg_goniometer gn;
    memset(&gn, 0, sizeof gn);
    double inc[NBG_GONIO_MAX_AXES];
    for (int i = inner; i >= 0;) {
        if (gn.naxes == s.n || axis_dep(h, s.id[i], "rotation_axis") != NULL)
            return;
        cbf_axis_type type;
        double v[3], start = 0, step = 0;
        if (cbf_get_axis_type(h, s.id[i], &type) != 0 || type != CBF_ROTATION_AXIS ||
            cbf_get_axis_vector(h, s.id[i], &v[0], &v[1], &v[2]) != 0 ||
            cbf_get_axis_setting(h, 0, s.id[i], &start, &step) != 0 || !(fabs(start) <= 1e6) || !isfinite(step))
            return;
        const int k = gn.naxes++;
        nbgi_goniometer_set_axis(&gn, k, v, start, s.id[i]);
        inc[k] = step;
        const char *dep = axis_dep(h, s.id[i], "depends_on");
        i = dep != NULL ? set_find(&s, dep) : -1;
        if (dep != NULL && i < 0)
            return;
    }
    if (gn.naxes != s.n)
        return;
    gn.scan_axis = -1;
    for (int k = 0; k < gn.naxes && gn.scan_axis < 0; ++k) {
        if (inc[k] != 0)
            gn.scan_axis = k;
    }
    for (int k = 0; k < gn.naxes && gn.scan_axis < 0; ++k) {
        const double *a = gn.axes[k], len = nbgi_norm(a);
        if (fabs(a[0] / len - g->axis[0]) + fabs(a[1] / len - g->axis[1]) + fabs(a[2] / len - g->axis[2]) < 1e-9)
            gn.scan_axis = k;
    }
    if (gn.scan_axis < 0 || nbg_goniometer_derive(NULL, &gn, "") != NBG_OK)
        return;
    g->goniometer = gn;
    nbgi_goniometer_axis(&gn, g->axis);
}

/* The axis_id of array_structure_list_axis row axis_set; NULL when none. */
static const char *surface_axis(cbf_handle h, const char *axis_set_id)
{
    const char *axis = NULL;
    if (cbf_find_category(h, "array_structure_list_axis") != 0 || cbf_find_column(h, "axis_set_id") != 0 ||
        cbf_find_row(h, axis_set_id) != 0 || cbf_find_column(h, "axis_id") != 0 || cbf_get_value(h, &axis) != 0)
        return NULL;
    return axis;
}

/* Adds the surface axes of detector element 0 (array_structure_list's axis sets of its array, precedence 1 and 2),
 * as cbf_construct_detector finds them; 1 when it would stop before its positioner (it then fails cleanly). */
static int add_surface_axes(cbf_handle h, axis_set *s)
{
    const char *array_id = NULL, *section = NULL, *col = "array_section_id";
    if (cbf_get_array_id(h, 0, &array_id) != 0 || cbf_get_array_section_id(h, 0, &section) != 0 || section == NULL ||
        cbf_find_category(h, "array_structure_list") != 0)
        return 1;
    if (cbf_find_column(h, col) != 0)
        col = cbf_find_column(h, "array_id") == 0 ? "array_id" : "array_section";
    if (cbf_find_column(h, col) != 0)
        return 1;
    unsigned int rows = 0;
    const char *sets[2] = {NULL, NULL};
    if (cbf_count_rows(h, &rows) != 0)
        return 1;
    for (unsigned int r = 0; r < rows; ++r) {
        const char *v = NULL, *set = NULL;
        int prec = 0;
        if (cbf_select_row(h, r) != 0 || cbf_find_column(h, col) != 0 || cbf_get_value(h, &v) != 0 || v == NULL ||
            strcmp(v, section) != 0)
            continue;
        if (cbf_find_column(h, "precedence") != 0 || cbf_get_integervalue(h, &prec) != 0 || prec < 1 || prec > 2 ||
            sets[prec - 1] != NULL || cbf_find_column(h, "axis_set_id") != 0 || cbf_get_value(h, &set) != 0 ||
            set == NULL)
            return 1;
        sets[prec - 1] = set;
    }
    for (int k = 0; k < 2; ++k) {
        const char *axis = sets[k] != NULL ? surface_axis(h, sets[k]) : NULL;
        if (sets[k] != NULL && (axis == NULL || set_add(s, axis, 0) != 0))
            return 1;
    }
    return sets[0] == NULL;
}

/* 1 when cbf_construct_detector (element 0) may be called: it fails cleanly before reading axes, or every axis
 * of its positioner is sound. */
static int detector_safe(cbf_handle h)
{
    const char *id = owner_id(h, "diffrn_detector");
    axis_set s = {.n = 0};
    if (id == NULL || add_surface_axes(h, &s))
        return 1;
    axis_set all = {.n = 0};
    if (add_owned_axes(h, "diffrn_detector_axis", "detector_id", id, &all) != 0)
        return 0;
    for (int i = 0; i < s.n; ++i) {
        if (set_add(&all, s.id[i], 0) != 0)
            return 0;
    }
    return set_sound(h, &all);
}

static int rest_geometry(cbf_handle h, nbg_geometry *g, const char **where);

/* Reads the full CBF geometry into g; 0, or the CBFlib code with *where naming what failed. */
static int full_geometry(cbf_handle h, nbg_geometry *g, const char **where)
{
    cbf_detector det = NULL;
    int code;
    *where = "the detector's axes (diffrn_detector_axis, array_structure_list_axis, axis: one missing, unreadable, "
             "or depending on an axis the detector does not list)";
    if (!detector_safe(h))
        return CBF_FORMAT;
    *where = "the detector (diffrn_detector, array_structure_list, axis)";
    if ((code = cbf_construct_detector(h, &det, 0)) != 0)
        return code;
    double o[3], f[3], s[3], pf = 0, ps = 0;
    code = cbf_get_pixel_coordinates_fs(det, 0, 0, &o[0], &o[1], &o[2]);
    if (code == 0)
        code = cbf_get_detector_axis_fast(det, &f[0], &f[1], &f[2]);
    if (code == 0)
        code = cbf_get_detector_axis_slow(det, &s[0], &s[1], &s[2]);
    if (code == 0)
        code = cbf_get_inferred_pixel_size_fs(det, 1, &pf);
    if (code == 0)
        code = cbf_get_inferred_pixel_size_fs(det, 2, &ps);
    cbf_free_detector(det);
    if (code != 0)
        return code;
    for (int i = 0; i < 3; ++i)
        g->origin[i] = o[i], g->fast[i] = f[i], g->slow[i] = s[i];
    g->pixel_f = pf, g->pixel_s = ps;
    return rest_geometry(h, g, where);
}

/* The beam, goniometer and detector response of a full CBF into g (all but the detector's frame); 0, or the CBFlib
 * code with *where naming what failed. */
static int rest_geometry(cbf_handle h, nbg_geometry *g, const char **where)
{
    int code;
    *where = "the wavelength (diffrn_radiation_wavelength)";
    if ((code = cbf_get_wavelength(h, &g->wavelength)) != 0)
        return code;

    double v[3];
    if (r_equipment_vector(h, "source", v) == 0 && nbgi_norm(v) > 0) {
        const double len = nbgi_norm(v);
        for (int i = 0; i < 3; ++i)
            g->direction[i] = v[i] / len;
    }
    double ratio, norm;
    if (cbf_get_polarization(h, &ratio, &norm) == 0) {
        g->polarization_fraction = ratio;
        g->polarization_normal[0] = sin(norm * (M_PI / 180));
        g->polarization_normal[1] = cos(norm * (M_PI / 180));
        g->polarization_normal[2] = 0;
    }

    /* A file without a goniometer is a still: the default axis and a scan of width 0 (also one whose goniometer
     * CBFlib cannot build, or could not without crashing). */
    cbf_goniometer gon = NULL;
    if (goniometer_safe(h) && cbf_construct_goniometer(h, &gon) == 0) {
        double start = 0, inc = 0, a[3];
        *where = "the goniometer (diffrn_measurement_axis, diffrn_scan_axis, diffrn_scan_frame_axis)";
        code = cbf_get_rotation_axis(gon, 0, &a[0], &a[1], &a[2]);
        if (code == 0)
            code = cbf_get_rotation_range(gon, 0, &start, &inc);
        cbf_free_goniometer(gon);
        if (code != 0 && code != CBF_NOTFOUND)
            return code;
        if (code == 0) {
            const double len = nbgi_norm(a);
            for (int i = 0; i < 3 && len > 0; ++i)
                g->axis[i] = a[i] / len;
            g->scan_start = start, g->scan_width = inc;
            g->scan_stated = 2;
            multi_axis(h, g);
        }
    }
    g->nframes = 1;

    double x, gain_esd;
    if (cbf_get_integration_time(h, 0, &x) == 0)
        g->exposure = x;
    if (cbf_get_overload(h, 0, &x) == 0)
        g->saturation = x;
    if (cbf_get_gain(h, 0, &x, &gain_esd) == 0 && x > 0)
        g->gain = x;
    const char *lin;
    if (r_string(h, "array_intensities", "linearity", &lin) == 0 &&
        (strcasecmp(lin, "offset") == 0 || strcasecmp(lin, "scaling_offset") == 0) &&
        r_double(h, "array_intensities", "offset", &x) == 0)
        g->pedestal = -x;
    if (r_double(h, "diffrn_detector", "layer_thickness", &x) == 0 && x >= 0)
        g->thickness = x;
    const char *details;
    if (r_string(h, "diffrn_detector", "details", &details) == 0) {
        char mat[16];
        double mu;
        if (sscanf(details, "sensor %15s mu %lf", mat, &mu) == 2) {
            if (strcmp(mat, "unknown") != 0)
                snprintf(g->material, sizeof g->material, "%s", mat);
            g->mu = mu;
        }
        const char *m = strstr(details, "; nbgrad model ");
        char model[16];
        int layers;
        if (m != NULL && sscanf(m, "; nbgrad model %15s layers %d", model, &layers) == 2 && layers >= 1 &&
            layers <= 1000000 && (strcmp(model, "nanobragg") == 0 || strcmp(model, "physical") == 0)) {
            g->sensor_model = strcmp(model, "nanobragg") == 0 ? NBG_SENSOR_NANOBRAGG : NBG_SENSOR_PHYSICAL;
            g->sensor_layers = layers;
        }
    }
    return 0;
}

/* The state of one read, freed in one place. */
typedef struct {
    nbgi_cbf_file file; /* the file's bytes, its binary sections and the text CBFlib parses */
    cbf_handle h;
    cbflog log;
    float *img;
    uint8_t *mask;
} cbfr;

static void r_free(cbfr *r)
{
    if (r->h != NULL)
        cbf_free_handle(r->h); /* also closes the in-memory stream of r->file.text */
    log_close(&r->log);
    nbgi_cbf_release(&r->file);
    free(r->img);
    free(r->mask);
}

static int r_fail(nbg_ctx *ctx, cbfr *r, int status, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

static int r_fail(nbg_ctx *ctx, cbfr *r, int status, const char *fmt, ...)
{
    char msg[700], cbfmsg[200];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    log_first(&r->log, cbfmsg, sizeof cbfmsg);
    r_free(r);
    return nbgi_error(ctx, status, "%s%s", msg, cbfmsg);
}

/* 1 when the file starts like a CBF or CIF file (CBFlib would otherwise parse any text as an empty CIF). */
static int looks_like_cbf(FILE *fp)
{
    char head[4097];
    const size_t n = fread(head, 1, sizeof head - 1, fp);
    head[n] = '\0';
    rewind(fp);
    if (n >= 6 && memcmp(head, "###CBF", 6) == 0)
        return 1;
    if (n >= 6 && memcmp(head, "#\\#CIF", 6) == 0)
        return 1;
    /* a plain CIF: a data_ block header at the start of a line */
    for (const char *p = head; p < head + n; ++p) {
        if ((p == head || p[-1] == '\n') && strncmp(p, "data_", 5) == 0)
            return 1;
    }
    return 0;
}

/* 1 when the first thing in text after blanks and comments is a data block header (data_): CIF puts every item in
 * a data block, and CBFlib 0.9.7 leaks the token it stops at when something else comes first. */
static int starts_with_data_block(const char *text)
{
    const char *p = text;
    for (;;) {
        p += strspn(p, " \t\r\n\f\v");
        if (*p != '#')
            break;
        p += strcspn(p, "\r\n");
    }
    return strncasecmp(p, "data_", 5) == 0;
}

/* Reads the file into r->file (nbgrad finds and checks the binary sections: src/cbfbin.c), then has CBFlib parse
 * its text, in which each binary section is a placeholder word: CBFlib never reads binary data. */
static int r_open(nbg_ctx *ctx, const char *path, cbfr *r)
{
    FILE *fp = fopen(path, "rb");
    if (fp == NULL)
        return nbgi_error(ctx, NBG_EIO, "reading %s: cannot open it: %s", path, strerror(errno));
    if (!looks_like_cbf(fp)) {
        fclose(fp);
        return nbgi_error(ctx, NBG_EFORMAT, "reading %s: not a CBF file (no ###CBF signature or CIF data block)",
                          path);
    }
    int rc = nbgi_cbf_load(ctx, path, fp, &r->file);
    fclose(fp);
    if (rc != NBG_OK)
        return rc;
    if (!starts_with_data_block(r->file.text)) {
        nbgi_cbf_release(&r->file);
        return nbgi_error(ctx, NBG_EFORMAT, "reading %s: not a CBF file: something other than a comment comes "
                          "before its first data block (data_)", path);
    }
    int code = cbf_make_handle(&r->h);
    if (code != 0) {
        r->h = NULL;
        return r_fail(ctx, r, cbf_status(code), "reading %s: CBFlib could not make a handle (%s)", path,
                      cbf_code_name(code));
    }
    log_open(&r->log, r->h);
    FILE *text = fmemopen(r->file.text, r->file.textlen, "rb");
    if (text == NULL)
        return r_fail(ctx, r, NBG_ENOMEM, "reading %s: cannot open a stream on its text: %s", path, strerror(errno));
    /* The handle owns the stream from here, on success and failure alike (it closes it with the handle). */
    code = cbf_read_widefile(r->h, text, MSG_NODIGEST);
    if (code != 0)
        return r_fail(ctx, r, cbf_status(code), "reading %s: CBFlib could not parse it (%s): truncated or not CBF",
                      path, cbf_code_name(code));
    /* CBFlib 0.9.7 numbers detector elements modulo their count: a diffrn_detector_element category that lists
     * none of the detector's divides by zero in every call that looks an element up (cbf_get_array_id, the
     * detector, the gain and overload). */
    unsigned int elements = 0;
    if (cbf_count_elements(r->h, &elements) == 0 && elements == 0)
        return r_fail(ctx, r, NBG_EFORMAT, "reading %s: diffrn_detector_element lists no element of the detector",
                      path);
    return NBG_OK;
}

/* The binary section that the first row of _array_data.data names (its placeholder), into *k. */
static int r_image_section(nbg_ctx *ctx, const char *path, cbfr *r, int *k)
{
    if (cbf_find_category(r->h, "array_data") != 0 || cbf_find_column(r->h, "data") != 0 ||
        cbf_rewind_row(r->h) != 0)
        return r_fail(ctx, r, NBG_EFORMAT, "reading %s: no image: the file has no _array_data.data", path);
    const char *value = NULL;
    if (cbf_get_value(r->h, &value) != 0 || (*k = nbgi_cbf_section_of(&r->file, value)) < 0)
        return r_fail(ctx, r, NBG_EFORMAT, "reading %s: no image: _array_data.data is not a binary section", path);
    return NBG_OK;
}

/* The image's size: the binary header's dimensions (fastest first), else array_structure_list's, checked against
 * each other and the element count. */
static int r_dimensions(nbg_ctx *ctx, const char *path, cbfr *r, const nbgi_cbf_section *s, size_t *dimf,
                        size_t *dimm)
{
    if (!s->has_nel)
        return r_fail(ctx, r, NBG_EFORMAT, "reading %s: _array_data.data: the binary section gives no "
                      "X-Binary-Number-of-Elements", path);
    for (int d = 0; d < 3; ++d) {
        if (s->dim[d] > INT32_MAX)
            return r_fail(ctx, r, NBG_EFORMAT, "reading %s: _array_data.data: the binary section's dimension %d "
                          "(%llu) is too large", path, d + 1, (unsigned long long)s->dim[d]);
    }
    uint64_t df = s->dim[0], dm = s->dim[1], ds = s->dim[2];
    if (df == 0) {
        size_t sf = 0, ss = 0;
        if (cbf_get_image_size_fs(r->h, 0, 0, &sf, &ss) == 0)
            df = sf, dm = ss, ds = 1;
    }
    if (ds == 0)
        ds = 1;
    if (dm == 0)
        dm = 1;
    uint64_t n;
    if (df == 0 || __builtin_mul_overflow(df, dm, &n) || __builtin_mul_overflow(n, ds, &n) || n != s->nel)
        return r_fail(ctx, r, NBG_EFORMAT, "reading %s: _array_data.data: the dimensions %llu x %llu x %llu do not "
                      "match the %llu elements", path, (unsigned long long)df, (unsigned long long)dm,
                      (unsigned long long)ds, (unsigned long long)s->nel);
    if (ds != 1)
        return r_fail(ctx, r, NBG_EFORMAT, "reading %s: _array_data.data: a 3-D array (%llu x %llu x %llu) is not "
                      "one image", path, (unsigned long long)df, (unsigned long long)dm, (unsigned long long)ds);
    if (df > INT32_MAX || dm > INT32_MAX || n > SIZE_MAX / sizeof(float))
        return r_fail(ctx, r, NBG_EFORMAT, "reading %s: _array_data.data: the image size %llu x %llu is too large",
                      path, (unsigned long long)df, (unsigned long long)dm);
    *dimf = (size_t)df, *dimm = (size_t)dm;
    return NBG_OK;
}

/* Decodes binary section k (nel elements) into r->img, after checking it and the memory it needs. */
static int r_pixels(nbg_ctx *ctx, const char *path, cbfr *r, int k, size_t dimf, size_t dimm, int want_mask)
{
    const size_t nel = dimf * dimm;
    int rc = nbgi_cbf_check(ctx, path, &r->file, k, nel);
    if (rc != NBG_OK) {
        r_free(r);
        return rc;
    }
    char what[400];
    snprintf(what, sizeof what, "the image of %s (%zu x %zu pixels)", path, dimf, dimm);
    const double held = (double)r->file.len + (double)r->file.textlen;
    rc = nbgi_check_bytes(ctx, held + (double)nel * (sizeof(float) + (want_mask ? 1 : 0)), what);
    if (rc != NBG_OK) {
        r_free(r);
        return rc;
    }
    r->img = malloc(nel * sizeof(float));
    if (r->img == NULL)
        return r_fail(ctx, r, NBG_ENOMEM, "reading %s: out of memory for %s", path, what);
    rc = nbgi_cbf_decode(ctx, path, &r->file, k, nel, r->img);
    if (rc != NBG_OK)
        r_free(r);
    return rc;
}

/* The geometry: a full CBF's axis categories, else a miniCBF's Pilatus header. */
static int r_geometry(nbg_ctx *ctx, const char *path, cbfr *r, size_t dimf, size_t dimm, nbg_geometry *gg)
{
    nbgi_geometry_init(gg);
    gg->fpixels = (int)dimf, gg->spixels = (int)dimm;
    const int full = cbf_find_category(r->h, "axis") == 0;
    if (full) {
        const char *where = "";
        const int code = full_geometry(r->h, gg, &where);
        if (code != 0)
            return r_fail(ctx, r, cbf_status(code), "reading %s: CBFlib cannot read %s (%s)", path, where,
                          cbf_code_name(code));
        size_t sf = 0, ss = 0;
        if (cbf_get_image_size_fs(r->h, 0, 0, &sf, &ss) == 0 && (sf != dimf || ss != dimm))
            return r_fail(ctx, r, NBG_EFORMAT, "reading %s: array_structure_list gives %zu x %zu pixels but the "
                          "binary section holds %zu x %zu", path, sf, ss, dimf, dimm);
    } else {
        const char *text = NULL;
        if (r_string(r->h, "array_data", "header_contents", &text) == 0)
            mini_geometry(text, gg);
    }
    return NBG_OK;
}

/* ------------------------------------------------------------------------------------------------------------ */
/* Multi-panel full CBF: several arrays, or arrays cut into sections (array_structure_list_section), each one a    */
/* panel whose frame the axis hierarchy gives                                                                     */
/* ------------------------------------------------------------------------------------------------------------ */

/* dxtbx (FormatCBFMultiTileHierarchy) reads such a file as one panel per array section (or per array when there
 * are no sections), in the order array_structure_list first names them, each panel's pixels the section's slab
 * of its array.  Its frame comes from its surface axes (array_structure_list's axis sets of precedence 1 and 2:
 * fast and slow) and the axes they depend on, each axis a change of basis (a rotation by its setting about its
 * vector, then its offset; or a translation by offset + setting x unit vector; the setting is CBFlib's
 * cbf_get_axis_setting, start plus increment).  The axes that share the surface axes' equipment_component place
 * the panel in its group (its origin is their product applied to 0, and its fast and slow axes are the surface
 * axes' vectors, unturned); each run of axes with one equipment_component above them is a group of the
 * hierarchy, turning and moving everything below it.  nbgrad composes the same numbers with CBFlib's table calls
 * (cbf_get_axis_type, _vector, _offset, _setting, _depends_on, _equipment_component), which read the axis
 * categories and never build a positioner, so nothing here can make CBFlib crash; dependency chains are bounded
 * (a cycle is refused), and every lookup that fails is an error naming the axis. */

#define MP_MAX_CHAIN 64

typedef struct {
    const char *name;    /* the section's (or array's) id */
    const char *array;   /* its array's id */
    int k;               /* the binary section of its array */
    size_t start[3], n[3]; /* its slab (0-based start, extent) along the array's dimensions, fastest first */
    const char *axis[2]; /* its fast and slow surface axes */
    double pixel[2];
} mp_panel;

static int mp_fail(nbg_ctx *ctx, const char *path, int status, const char *fmt, ...) __attribute__((format(printf, 4, 5)));
static int mp_fail(nbg_ctx *ctx, const char *path, int status, const char *fmt, ...)
{
    char msg[600];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return nbgi_error(ctx, status, "reading %s (a multi-panel CBF): %s", path, msg);
}

/* A value of the current row and column col: NULL when the column is missing, the value null ('.', '?'). */
static const char *row_value(cbf_handle h, const char *col)
{
    const char *v = NULL, *type = NULL;
    if (cbf_find_column(h, col) != 0 || cbf_get_value(h, &v) != 0 || v == NULL)
        return NULL;
    if (cbf_get_typeofvalue(h, &type) == 0 && type != NULL && strcmp(type, "null") == 0)
        return NULL;
    return strcmp(v, ".") == 0 || strcmp(v, "?") == 0 ? NULL : v;
}

/* The 4 x 4 change of basis of one axis (row-major, affine), as dxtbx builds it. */
static int axis_cob(cbf_handle h, const char *id, double M[16], int *rotation)
{
    cbf_axis_type type;
    double v[3], o[3], start = 0, inc = 0;
    if (cbf_get_axis_type(h, id, &type) != 0 || cbf_get_axis_vector(h, id, &v[0], &v[1], &v[2]) != 0 ||
        cbf_get_axis_offset(h, id, &o[0], &o[1], &o[2]) != 0 || cbf_get_axis_setting(h, 0, id, &start, &inc) != 0)
        return -1;
    const double len = nbgi_norm(v), a = start + inc;
    if (!(len > 0) || !isfinite(a) || !isfinite(o[0] + o[1] + o[2]))
        return -1;
    for (int i = 0; i < 3; ++i) v[i] /= len;
    memset(M, 0, 16 * sizeof *M);
    M[15] = 1;
    if (type == CBF_ROTATION_AXIS) {
        const double t = a * (M_PI / 180), c = cos(t), s = sin(t), C = 1 - c;
        const double x = v[0], y = v[1], z = v[2];
        const double R[9] = {c + x * x * C, x * y * C - z * s, x * z * C + y * s,
                             y * x * C + z * s, c + y * y * C, y * z * C - x * s,
                             z * x * C - y * s, z * y * C + x * s, c + z * z * C};
        for (int i = 0; i < 3; ++i) {
            for (int j = 0; j < 3; ++j) M[4 * i + j] = R[3 * i + j];
            M[4 * i + 3] = o[i];
        }
        *rotation = 1;
    } else if (type == CBF_TRANSLATION_AXIS) {
        for (int i = 0; i < 3; ++i) M[5 * i] = 1, M[4 * i + 3] = o[i] + v[i] * a;
        *rotation = 0;
    } else {
        return -2;
    }
    return 0;
}

static void mat4_mul(const double A[16], const double B[16], double C[16])
{
    double T[16];
    for (int i = 0; i < 4; ++i) {
        for (int j = 0; j < 4; ++j) {
            double s = 0;
            for (int l = 0; l < 4; ++l) s += A[4 * i + l] * B[4 * l + j];
            T[4 * i + j] = s;
        }
    }
    memcpy(C, T, sizeof T);
}

/* Panel p's frame in DIALS's laboratory frame, and the ids of the groups above it (groups[0] the root's first
 * axis; *ngroups of them). */
static int mp_frame(nbg_ctx *ctx, const char *path, cbf_handle h, const mp_panel *p, nbg_panel *out,
                    const char **groups, int *ngroups)
{
    const char *dep = NULL;
    if (cbf_get_axis_depends_on(h, p->axis[0], &dep) != 0 || dep == NULL || strcasecmp(dep, p->axis[1]) != 0)
        return mp_fail(ctx, path, NBG_EUNSUP, "panel %s: its fast axis %s does not depend on its slow axis %s (the "
                       "layout dxtbx reads)", p->name, p->axis[0], p->axis[1]);
    const char *chain[MP_MAX_CHAIN];
    int n = 0;
    for (const char *a = p->axis[0]; a != NULL;) {
        if (n == MP_MAX_CHAIN)
            return mp_fail(ctx, path, NBG_EFORMAT, "panel %s: the axes below %s depend on each other in a cycle or a "
                           "chain longer than %d", p->name, p->axis[0], MP_MAX_CHAIN);
        chain[n++] = a;
        const char *d = NULL;
        if (cbf_get_axis_depends_on(h, a, &d) != 0)
            return mp_fail(ctx, path, NBG_EFORMAT, "axis %s (of panel %s) is not in the axis category", a, p->name);
        a = d != NULL && strcmp(d, ".") != 0 && strcmp(d, "?") != 0 && d[0] != '\0' ? d : NULL;
    }
    /* the product from the root down, and the rotation of the groups above the panel's own run of axes */
    const char *comp0 = NULL;
    if (cbf_get_axis_equipment_component(h, chain[0], &comp0) != 0)
        comp0 = NULL;
    int own = 1; /* axes 0 .. own-1: the panel's run */
    while (own < n) {
        const char *c = NULL;
        if (cbf_get_axis_equipment_component(h, chain[own], &c) != 0)
            c = NULL;
        if (comp0 == NULL || c == NULL || strcmp(c, comp0) != 0)
            break;
        ++own;
    }
    double M[16] = {1, 0, 0, 0, 0, 1, 0, 0, 0, 0, 1, 0, 0, 0, 0, 1}, G[16];
    *ngroups = 0;
    const char *prev = NULL;
    for (int i = n - 1; i >= 0; --i) {
        double A[16];
        int rot = 0;
        const int rc = axis_cob(h, chain[i], A, &rot);
        if (rc == -2)
            return mp_fail(ctx, path, NBG_EUNSUP, "axis %s (of panel %s) is neither a rotation nor a translation",
                           chain[i], p->name);
        if (rc != 0)
            return mp_fail(ctx, path, NBG_EFORMAT, "axis %s (of panel %s): its type, vector, offset or setting "
                           "(diffrn_scan_axis, diffrn_scan_frame_axis) cannot be read, or is zero or not finite",
                           chain[i], p->name);
        if (i < own && (i == 0 || i == 1) && rot)
            return mp_fail(ctx, path, NBG_EUNSUP, "panel %s: its surface axis %s is a rotation", p->name, chain[i]);
        /* a new group starts where the equipment component changes (above the panel's run) */
        if (i >= own) {
            const char *c = NULL;
            if (cbf_get_axis_equipment_component(h, chain[i], &c) != 0)
                c = NULL;
            if ((i == n - 1 || prev == NULL || c == NULL || strcmp(c, prev) != 0) && *ngroups < NBG_PANEL_LEVELS - 1)
                groups[(*ngroups)++] = chain[i];
            prev = c;
        }
        mat4_mul(M, A, M);
        if (i == own)
            memcpy(G, M, sizeof G);
    }
    if (own >= n)
        memcpy(G, (double[16]){1, 0, 0, 0, 0, 1, 0, 0, 0, 0, 1, 0, 0, 0, 0, 1}, sizeof G);
    double f[3], s[3];
    if (cbf_get_axis_vector(h, p->axis[0], &f[0], &f[1], &f[2]) != 0 ||
        cbf_get_axis_vector(h, p->axis[1], &s[0], &s[1], &s[2]) != 0)
        return mp_fail(ctx, path, NBG_EFORMAT, "panel %s: its surface axes' vectors cannot be read", p->name);
    const double lf = nbgi_norm(f), ls = nbgi_norm(s);
    if (!(lf > 0) || !(ls > 0))
        return mp_fail(ctx, path, NBG_EFORMAT, "panel %s: a surface axis has a zero vector", p->name);
    for (int i = 0; i < 3; ++i) {
        out->fast[i] = (G[4 * i] * f[0] + G[4 * i + 1] * f[1] + G[4 * i + 2] * f[2]) / lf;
        out->slow[i] = (G[4 * i] * s[0] + G[4 * i + 1] * s[1] + G[4 * i + 2] * s[2]) / ls;
        out->origin[i] = M[4 * i + 3];
    }
    return NBG_OK;
}

/* 1 when the file is a multi-panel CBF: several arrays, or sections of arrays. */
static int is_multi(cbf_handle h)
{
    unsigned int rows = 0;
    if (cbf_find_category(h, "array_structure_list_section") == 0)
        return 1;
    return cbf_find_category(h, "array_data") == 0 && cbf_count_rows(h, &rows) == 0 && rows > 1;
}

/* The binary section of array id's row in array_data; -1 when none. */
static int array_section_of(cbfr *r, const char *id)
{
    unsigned int rows = 0;
    if (cbf_find_category(r->h, "array_data") != 0 || cbf_count_rows(r->h, &rows) != 0)
        return -1;
    for (unsigned int i = 0; i < rows; ++i) {
        if (cbf_find_column(r->h, "array_id") != 0 || cbf_select_row(r->h, i) != 0)
            return -1;
        const char *a = row_value(r->h, "array_id");
        if (a == NULL || strcmp(a, id) != 0)
            continue;
        const char *v = NULL;
        if (cbf_find_column(r->h, "data") != 0 || cbf_get_value(r->h, &v) != 0)
            return -1;
        return nbgi_cbf_section_of(&r->file, v);
    }
    return -1;
}

/* The surface axis (precedence prec) of section or array name: its axis id and pixel size (the axis set's
 * displacement_increment), and the dimension array_structure_list gives it. */
static int surface_of(cbf_handle h, const char *col, const char *name, int prec, const char **axis, double *pixel,
                      long *dim)
{
    unsigned int rows = 0;
    const char *set = NULL;
    if (cbf_find_category(h, "array_structure_list") != 0 || cbf_count_rows(h, &rows) != 0)
        return -1;
    for (unsigned int i = 0; i < rows && set == NULL; ++i) {
        int pr = 0;
        if (cbf_find_column(h, col) != 0 || cbf_select_row(h, i) != 0)
            return -1;
        const char *v = row_value(h, col);
        if (v == NULL || strcmp(v, name) != 0 || cbf_find_column(h, "precedence") != 0 ||
            cbf_get_integervalue(h, &pr) != 0 || pr != prec)
            continue;
        const char *dir = row_value(h, "direction");
        if (dir != NULL && strcasecmp(dir, "increasing") != 0)
            return -2;
        if (cbf_find_column(h, "dimension") != 0 || cbf_get_longvalue(h, dim) != 0)
            return -1;
        set = row_value(h, "axis_set_id");
        if (set == NULL)
            return -1;
    }
    if (set == NULL || cbf_find_category(h, "array_structure_list_axis") != 0 ||
        cbf_find_column(h, "axis_set_id") != 0 || cbf_find_row(h, set) != 0)
        return -1;
    *axis = row_value(h, "axis_id");
    if (*axis == NULL || cbf_find_column(h, "displacement_increment") != 0 || cbf_get_doublevalue(h, pixel) != 0)
        return -1;
    *pixel = fabs(*pixel);
    return isfinite(*pixel) && *pixel > 0 ? 0 : -1;
}

/* Section name's slab of its array (array_structure_list_section: index 1, 2, 3, 1-based start and end). */
static int section_slab(cbf_handle h, const char *name, mp_panel *p)
{
    unsigned int rows = 0;
    int seen[3] = {0, 0, 0};
    if (cbf_find_category(h, "array_structure_list_section") != 0 || cbf_count_rows(h, &rows) != 0)
        return -1;
    for (unsigned int i = 0; i < rows; ++i) {
        if (cbf_find_column(h, "id") != 0 || cbf_select_row(h, i) != 0)
            return -1;
        const char *v = row_value(h, "id");
        if (v == NULL || strcmp(v, name) != 0)
            continue;
        const char *a = row_value(h, "array_id");
        long idx = 0, st = 0, en = 0;
        if (a == NULL || (p->array != NULL && strcmp(a, p->array) != 0) || cbf_find_column(h, "index") != 0 ||
            cbf_get_longvalue(h, &idx) != 0 || idx < 1 || idx > 3 || seen[idx - 1] ||
            cbf_find_column(h, "start") != 0 || cbf_get_longvalue(h, &st) != 0 || cbf_find_column(h, "end") != 0 ||
            cbf_get_longvalue(h, &en) != 0 || st < 1 || en < st || en > INT32_MAX)
            return -1;
        const char *stride = row_value(h, "stride");
        if (stride != NULL && strcmp(stride, "1") != 0)
            return -2;
        p->array = a;
        seen[idx - 1] = 1;
        p->start[idx - 1] = (size_t)st - 1;
        p->n[idx - 1] = (size_t)(en - st + 1);
    }
    if (!seen[0] || !seen[1])
        return -1;
    if (!seen[2])
        p->start[2] = 0, p->n[2] = 1;
    return 0;
}

/* Reads a multi-panel full CBF (r open): the panels (*panels malloc'd), their pixels concatenated in r->img, the
 * beam and the rest of the geometry in g (its detector panel 0's). */
static int read_multi(nbg_ctx *ctx, const char *path, cbfr *r, nbg_geometry *g, nbg_panel **panels, int *npanels,
                      size_t *npix)
{
    cbf_handle h = r->h;
    const int sections = cbf_find_category(h, "array_structure_list_section") == 0;
    const char *col = "array_id";
    if (cbf_find_category(h, "array_structure_list") != 0)
        return mp_fail(ctx, path, NBG_EFORMAT, "no array_structure_list");
    if (sections) {
        col = cbf_find_column(h, "array_section_id") == 0 ? "array_section_id" : NULL;
        if (col == NULL)
            return mp_fail(ctx, path, NBG_EUNSUP, "array_structure_list_section without "
                           "_array_structure_list.array_section_id");
    }
    /* the panels, in the order array_structure_list names them */
    unsigned int rows = 0;
    if (cbf_count_rows(h, &rows) != 0 || rows == 0)
        return mp_fail(ctx, path, NBG_EFORMAT, "array_structure_list is empty");
    mp_panel *mp = calloc(rows, sizeof *mp);
    nbg_panel *pan = calloc(rows, sizeof *pan);
    const char **gid = calloc((size_t)rows * NBG_PANEL_LEVELS, sizeof *gid);
    int *ng = calloc(rows, sizeof *ng);
    float **arr = calloc(r->file.nsec > 0 ? (size_t)r->file.nsec : 1, sizeof *arr);
    int np = 0, rc = NBG_OK;
    if (mp == NULL || pan == NULL || gid == NULL || ng == NULL || arr == NULL) {
        rc = mp_fail(ctx, path, NBG_ENOMEM, "out of memory");
        goto done;
    }
    for (unsigned int i = 0; i < rows; ++i) {
        if (cbf_find_category(h, "array_structure_list") != 0 || cbf_find_column(h, col) != 0 ||
            cbf_select_row(h, i) != 0) {
            rc = mp_fail(ctx, path, NBG_EFORMAT, "array_structure_list row %u cannot be read", i + 1);
            goto done;
        }
        const char *v = row_value(h, col);
        int dup = 0;
        for (int j = 0; j < np && v != NULL; ++j) dup |= strcmp(mp[j].name, v) == 0;
        if (v == NULL || dup)
            continue;
        if (np == 4096) {
            rc = mp_fail(ctx, path, NBG_EUNSUP, "more than 4096 panels");
            goto done;
        }
        mp[np].name = v;
        if (sections && (mp[np].array = row_value(h, "array_id")) == NULL) {
            rc = mp_fail(ctx, path, NBG_EFORMAT, "array_structure_list row %u names section %s without its array",
                         i + 1, v);
            goto done;
        }
        ++np;
    }
    if (np == 0) {
        rc = mp_fail(ctx, path, NBG_EFORMAT, "array_structure_list names no %s", sections ? "section" : "array");
        goto done;
    }
    size_t total = 0;
    for (int q = 0; q < np; ++q) {
        mp_panel *p = &mp[q];
        if (sections) {
            const int s = section_slab(h, p->name, p);
            if (s != 0) {
                rc = mp_fail(ctx, path, s == -2 ? NBG_EUNSUP : NBG_EFORMAT, s == -2 ? "section %s has a stride "
                             "other than 1 (not supported)" : "section %s: array_structure_list_section does not give "
                             "its array and its start and end along the array's first two dimensions (index 1, 2), "
                             "once each", p->name);
                goto done;
            }
        } else {
            p->array = p->name;
        }
        if ((p->k = array_section_of(r, p->array)) < 0) {
            rc = mp_fail(ctx, path, NBG_EFORMAT, "panel %s: array %s has no binary section in array_data", p->name,
                         p->array);
            goto done;
        }
        const nbgi_cbf_section *s = &r->file.sec[p->k];
        uint64_t d[3] = {s->dim[0], s->dim[1], s->dim[2] == 0 ? 1 : s->dim[2]}, nel;
        if (!s->has_nel || d[0] == 0 || d[1] == 0 || d[0] > INT32_MAX || d[1] > INT32_MAX || d[2] > INT32_MAX ||
            __builtin_mul_overflow(d[0], d[1], &nel) || __builtin_mul_overflow(nel, d[2], &nel) || nel != s->nel) {
            rc = mp_fail(ctx, path, NBG_EFORMAT, "array %s: its binary section does not state dimensions that match "
                         "its element count (X-Binary-Size-Fastest/Second/Third-Dimension, "
                         "X-Binary-Number-of-Elements)", p->array);
            goto done;
        }
        if (!sections) {
            if (d[2] != 1) {
                rc = mp_fail(ctx, path, NBG_EUNSUP, "array %s is 3-D (%llu x %llu x %llu) without sections that cut "
                             "it into panels", p->array, (unsigned long long)d[0], (unsigned long long)d[1],
                             (unsigned long long)d[2]);
                goto done;
            }
            p->n[0] = (size_t)d[0], p->n[1] = (size_t)d[1], p->n[2] = 1;
        }
        for (int a = 0; a < 3; ++a) {
            if (p->start[a] >= d[a] || p->n[a] > d[a] - p->start[a]) {
                rc = mp_fail(ctx, path, NBG_EFORMAT, "section %s reaches past its array %s (dimension %d: %zu from "
                             "%zu, the array has %llu)", p->name, p->array, a + 1, p->n[a], p->start[a] + 1,
                             (unsigned long long)d[a]);
                goto done;
            }
        }
        if (p->n[2] != 1) {
            rc = mp_fail(ctx, path, NBG_EUNSUP, "section %s spans %zu planes of its 3-D array (a panel is one plane)",
                         p->name, p->n[2]);
            goto done;
        }
        for (int a = 0; a < 2; ++a) {
            long dim = 0;
            const int sr = surface_of(h, sections ? col : "array_id", p->name, a + 1, &p->axis[a], &p->pixel[a], &dim);
            if (sr == -2) {
                rc = mp_fail(ctx, path, NBG_EUNSUP, "panel %s: a direction other than increasing in "
                             "array_structure_list", p->name);
                goto done;
            }
            if (sr != 0) {
                rc = mp_fail(ctx, path, NBG_EFORMAT, "panel %s: array_structure_list / array_structure_list_axis do "
                             "not give its %s axis (precedence %d: dimension, axis_set_id, axis_id, "
                             "displacement_increment > 0)", p->name, a == 0 ? "fast" : "slow", a + 1);
                goto done;
            }
            if (dim < 0 || (size_t)dim != p->n[a]) {
                rc = mp_fail(ctx, path, NBG_EFORMAT, "panel %s: array_structure_list gives dimension %d as %ld, its "
                             "data hold %zu", p->name, a + 1, dim, p->n[a]);
                goto done;
            }
        }
        if (fabs(p->pixel[0] - p->pixel[1]) > 1e-12 * p->pixel[0]) {
            rc = mp_fail(ctx, path, NBG_EUNSUP, "panel %s: rectangular pixels (%g x %g mm)", p->name, p->pixel[0],
                         p->pixel[1]);
            goto done;
        }
        nbg_panel *o = &pan[q];
        o->fpixels = (int)p->n[0], o->spixels = (int)p->n[1];
        o->pixel = p->pixel[0];
        snprintf(o->name, sizeof o->name, "%s", p->name);
        if ((rc = mp_frame(ctx, path, h, p, o, gid + (size_t)q * NBG_PANEL_LEVELS, &ng[q])) != NBG_OK)
            goto done;
        total += p->n[0] * p->n[1];
    }
    /* the pixels: each array decoded once */
    char what[300];
    snprintf(what, sizeof what, "the %d panels of %s (%zu pixels)", np, path, total);
    double need = (double)r->file.len + (double)r->file.textlen + (double)total * (sizeof(float) + 1);
    for (int q = 0; q < np; ++q) {
        int first = 1;
        for (int j = 0; j < q; ++j) first &= mp[j].k != mp[q].k;
        if (first) /* the decoded array (an unpacked one held twice while it is unpacked) */
            need += (double)r->file.sec[mp[q].k].nel * sizeof(float) *
                    (r->file.sec[mp[q].k].compression == NBGI_CBF_PACKED ? 2 : 1);
    }
    if ((rc = nbgi_check_bytes(ctx, need, what)) != NBG_OK)
        goto done;
    r->img = malloc(total * sizeof(float));
    if (r->img == NULL) {
        rc = mp_fail(ctx, path, NBG_ENOMEM, "out of memory for %s", what);
        goto done;
    }
    size_t at = 0;
    for (int q = 0; q < np; ++q) {
        const mp_panel *p = &mp[q];
        const nbgi_cbf_section *s = &r->file.sec[p->k];
        if (arr[p->k] == NULL) {
            if ((arr[p->k] = malloc((size_t)s->nel * sizeof(float))) == NULL) {
                rc = mp_fail(ctx, path, NBG_ENOMEM, "out of memory for array %s", p->array);
                goto done;
            }
            if ((rc = nbgi_cbf_decode(ctx, path, &r->file, p->k, s->nel, arr[p->k])) != NBG_OK)
                goto done;
        }
        const size_t df = (size_t)s->dim[0], plane = df * (size_t)s->dim[1];
        for (size_t j = 0; j < p->n[1]; ++j) {
            const float *src = arr[p->k] + p->start[2] * plane + (p->start[1] + j) * df + p->start[0];
            memcpy(r->img + at, src, p->n[0] * sizeof(float));
            at += p->n[0];
        }
    }
    /* the hierarchy: level 0 the detector, then at each level its groups numbered in order of appearance */
    for (int q = 0; q < np; ++q) {
        int *lv = pan[q].level_group;
        for (int l = 0; l < NBG_PANEL_LEVELS; ++l) lv[l] = -1;
        lv[0] = 0;
        for (int l = 1; l < ng[q]; ++l) {
            const char *id = gid[(size_t)q * NBG_PANEL_LEVELS + l];
            int num = 0, found = -1;
            for (int j = 0; j < q && found < 0; ++j) {
                if (ng[j] <= l)
                    continue;
                const char *idj = gid[(size_t)j * NBG_PANEL_LEVELS + l];
                int seen = 0;
                for (int i = 0; i < j && !seen; ++i)
                    seen = ng[i] > l && strcasecmp(gid[(size_t)i * NBG_PANEL_LEVELS + l], idj) == 0;
                if (seen)
                    continue;
                if (strcasecmp(idj, id) == 0)
                    found = num;
                ++num;
            }
            lv[l] = found >= 0 ? found : num;
        }
        if (ng[q] < NBG_PANEL_LEVELS)
            lv[ng[q]] = q; /* the panel itself */
        pan[q].group = ng[q] > 1 ? lv[ng[q] - 1] : 0;
    }
    /* the beam and the rest: as for one panel, g's detector panel 0's */
    const char *where = "";
    const int code = rest_geometry(h, g, &where);
    if (code != 0) {
        rc = mp_fail(ctx, path, cbf_status(code), "CBFlib cannot read %s (%s)", where, cbf_code_name(code));
        goto done;
    }
    g->fpixels = pan[0].fpixels, g->spixels = pan[0].spixels;
    g->pixel_f = g->pixel_s = pan[0].pixel;
    for (int i = 0; i < 3; ++i) g->fast[i] = pan[0].fast[i], g->slow[i] = pan[0].slow[i], g->origin[i] = pan[0].origin[i];
    *npix = total;
    *npanels = np;
    *panels = pan;
    pan = NULL;
done:
    for (int i = 0; i < r->file.nsec && arr != NULL; ++i) free(arr[i]);
    free(arr);
    free(mp);
    free(pan);
    free(gid);
    free(ng);
    return rc;
}

/* r->mask: the negative and overloaded pixels (NULL when there are none). */
static int r_mask(nbg_ctx *ctx, const char *path, cbfr *r, size_t nel, double saturation)
{
    const double over = isfinite(saturation) ? saturation : INFINITY;
    size_t nbad = 0;
    for (size_t i = 0; i < nel; ++i)
        nbad += r->img[i] < 0 || r->img[i] >= over;
    if (nbad == 0)
        return NBG_OK;
    r->mask = malloc(nel);
    if (r->mask == NULL)
        return r_fail(ctx, r, NBG_ENOMEM, "reading %s: out of memory for the mask", path);
    for (size_t i = 0; i < nel; ++i)
        r->mask[i] = r->img[i] < 0 || r->img[i] >= over;
    return NBG_OK;
}

/* The mask of a multi-panel image: the pixels at or below an array's undefined_value (when one is given) and
 * those at or above the overload (NULL when there are none). */
static int r_mask_multi(nbg_ctx *ctx, const char *path, cbfr *r, size_t nel, double saturation)
{
    double under = -INFINITY, x;
    if (r_double(r->h, "array_intensities", "undefined_value", &x) == 0 && isfinite(x))
        under = x;
    const double over = isfinite(saturation) ? saturation : INFINITY;
    size_t nbad = 0;
    for (size_t i = 0; i < nel; ++i)
        nbad += r->img[i] <= under || r->img[i] >= over;
    if (nbad == 0)
        return NBG_OK;
    r->mask = malloc(nel);
    if (r->mask == NULL)
        return r_fail(ctx, r, NBG_ENOMEM, "reading %s: out of memory for the mask", path);
    for (size_t i = 0; i < nel; ++i)
        r->mask[i] = r->img[i] <= under || r->img[i] >= over;
    return NBG_OK;
}

int nbgi_read_cbf_panels(nbg_ctx *ctx, const char *path, float **image, size_t *npix, nbg_geometry *g,
                         uint8_t **mask, nbg_panel **panels, int *npanels)
{
    if (image != NULL)
        *image = NULL;
    if (npix != NULL)
        *npix = 0;
    if (mask != NULL)
        *mask = NULL;
    if (panels != NULL)
        *panels = NULL;
    if (npanels != NULL)
        *npanels = 0;
    if (path == NULL || image == NULL || npix == NULL)
        return nbgi_error(ctx, NBG_EINVAL, "reading a CBF file: no file name or output");
    cbfr r;
    memset(&r, 0, sizeof r);
    int k = -1, rc;
    size_t dimf = 0, dimm = 0;
    if ((rc = r_open(ctx, path, &r)) != NBG_OK)
        return rc;
    if (cbf_find_category(r.h, "axis") == 0 && is_multi(r.h)) {
        nbg_geometry gg;
        nbgi_geometry_init(&gg);
        nbg_panel *pan = NULL;
        int np = 0;
        size_t n = 0;
        if ((rc = read_multi(ctx, path, &r, &gg, &pan, &np, &n)) != NBG_OK) {
            r_free(&r);
            return rc;
        }
        if (mask != NULL && (rc = r_mask_multi(ctx, path, &r, n, gg.saturation)) != NBG_OK) {
            free(pan);
            return rc;
        }
        if (mask != NULL)
            *mask = r.mask, r.mask = NULL;
        if (g != NULL)
            *g = gg;
        if (panels != NULL)
            *panels = pan;
        else
            free(pan);
        if (npanels != NULL)
            *npanels = np;
        *image = r.img;
        *npix = n;
        r.img = NULL;
        r_free(&r);
        return NBG_OK;
    }
    if ((rc = r_image_section(ctx, path, &r, &k)) != NBG_OK ||
        (rc = r_dimensions(ctx, path, &r, &r.file.sec[k], &dimf, &dimm)) != NBG_OK ||
        (rc = r_pixels(ctx, path, &r, k, dimf, dimm, mask != NULL)) != NBG_OK)
        return rc;
    nbg_geometry gg;
    if ((rc = r_geometry(ctx, path, &r, dimf, dimm, &gg)) != NBG_OK)
        return rc;
    if (mask != NULL) {
        if ((rc = r_mask(ctx, path, &r, dimf * dimm, gg.saturation)) != NBG_OK)
            return rc;
        *mask = r.mask;
        r.mask = NULL;
    }
    if (g != NULL)
        *g = gg;
    if (npanels != NULL)
        *npanels = 1;
    *image = r.img;
    *npix = dimf * dimm;
    r.img = NULL;
    r_free(&r);
    return NBG_OK;
}

int nbgi_read_cbf(nbg_ctx *ctx, const char *path, float **image, size_t *npix, nbg_geometry *g, uint8_t **mask)
{
    return nbgi_read_cbf_panels(ctx, path, image, npix, g, mask, NULL, NULL);
}

int nbg_read_cbf_panels(nbg_ctx *ctx, const char *path, nbg_geometry *g, nbg_panel **panels, int *npanels)
{
    if (g == NULL || panels == NULL || npanels == NULL)
        return nbgi_error(ctx, NBG_EINVAL, "nbg_read_cbf_panels: NULL argument");
    float *img = NULL;
    size_t n = 0;
    const int rc = nbgi_read_cbf_panels(ctx, path, &img, &n, g, NULL, panels, npanels);
    free(img);
    char why[1024];
    if (rc == NBG_OK && *panels == NULL && nbgi_unplaced_detector("cbf", g, path, why, sizeof why)) {
        *npanels = 0; /* a miniCBF's one flat panel that is not the detector (the Pilatus 12M) */
        return nbgi_error(ctx, NBG_EUNSUP, "%s", why);
    }
    if (rc == NBG_OK && *panels == NULL) {
        /* one panel: the detector of g */
        nbg_panel *p = calloc(1, sizeof *p);
        if (p == NULL)
            return nbgi_error(ctx, NBG_ENOMEM, "out of memory reading %s", path);
        p->fpixels = g->fpixels, p->spixels = g->spixels;
        p->pixel = g->pixel_f;
        for (int i = 0; i < 3; ++i) p->fast[i] = g->fast[i], p->slow[i] = g->slow[i], p->origin[i] = g->origin[i];
        p->level_group[0] = 0;
        for (int l = 1; l < NBG_PANEL_LEVELS; ++l) p->level_group[l] = -1;
        *panels = p;
        *npanels = 1;
    }
    return rc;
}

#endif /* NBG_HAVE_FORMATS */
