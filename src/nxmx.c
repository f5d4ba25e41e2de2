/*
 * nxmx.c -- NeXus/NXmx (HDF5) images: the writer (nbg_write_nxmx) and the reader behind nbg_read_image.
 *
 * The file is laid out as DIALS's dxtbx (FormatNXmx, dxtbx/nexus) reads it:
 *
 *   /entry                      NXentry, definition = "NXmx"
 *     data/data                 NXdata (signal = "data"): (nframes, spixels, fpixels) float32 or int32, one chunk
 *                               per frame (int32 deflated); hard-linked as instrument/detector/data
 *     instrument/beam           NXbeam: incident_wavelength (angstrom), incident_polarisation_stokes
 *     instrument/detector       NXdetector: sensor_material, sensor_thickness, saturation_value, count_time,
 *                               frame_time, pixel_mask (uint32, bit 0 = bad), depends_on -> transformations/translation
 *       transformations/translation   the panel origin: |origin| along origin/|origin|
 *       module                  NXdetector_module: data_origin, data_size, module_offset (0, on the translation),
 *                               fast_pixel_direction and slow_pixel_direction (pixel sizes, on module_offset)
 *       module_0, module_1, ...  with panels (nbg_write_nxmx_panels) instead of `module`: one per panel, each a slab
 *                               of the stacked data (data_origin = its first row, data_size its own), its
 *                               module_offset the panel's origin on a zero detector translation; narrower panels
 *                               padded with 0.  dxtbx makes it a hierarchical detector; the reader here gives the
 *                               modules' concatenation (nbgrad's image of panels) and every module's panel
 *     sample                    NXsample: depends_on -> transformations/omega
 *       transformations/omega   rotation, one angle per frame (start + i * width), omega_end, omega_increment_set
 *
 * Frames.  NeXus uses the McStas frame (beam along +z, y up); dxtbx turns every vector it reads into its own
 * (imgCIF) frame with diag(-1, 1, -1) (nexus/__init__.py, MCSTAS_TO_IMGCIF).  That matrix is its own inverse, so
 * the writer applies the same flip to g's vectors and dxtbx reads back exactly g's.  dxtbx's panel origin is the
 * translation part of the cumulative transformation of fast_pixel_direction's depends_on chain (the pixel
 * direction's own offset is not used), and its axes are the pixel directions turned by the rotations of that
 * chain; the reader here computes the same, so a real file gives the geometry dxtbx would give.
 *
 * What dxtbx 3.11 (the installed DIALS) does not read: the beam direction (it always makes a beam along -z, so the
 * writer refuses any other), the polarization (it always gives normal (0,1,0), fraction 0.999; written as Stokes
 * parameters anyway for readers that do), mu (computed from the material's table), the pedestal and gain (kept as
 * nbgrad_* attributes of the detector for this reader).
 */
#include "formats.h"
#include "plan.h"

#include <errno.h>
#include <limits.h>
#include <stdarg.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#ifdef NBG_HAVE_FORMATS

#include <hdf5.h>

/* Deflate levels of the image data (0: none), with the shuffle filter.  Measured on one 4096x4096 frame (simulated
 * background with spots; this machine, page cache): float32 uncompressed 0.10 s, 67 MB; deflate 1: 1.1 s, 34 MB
 * (and reading 0.04 -> 0.30 s); int32 counts uncompressed 0.27 s, 67 MB; deflate 1: 0.56 s, 11.7 MB.  Counts
 * compress 6x for twice the time; noise-free floats only 2x for ten times: so int32 is compressed, float32 not. */
#ifndef NBGI_NXMX_DEFLATE_INT
#define NBGI_NXMX_DEFLATE_INT 1
#endif
#ifndef NBGI_NXMX_DEFLATE_FLOAT
#define NBGI_NXMX_DEFLATE_FLOAT 0
#endif

#define DET "/entry/instrument/detector"
#define DET_T DET "/transformations/translation"
#define MODULE DET "/module"
#define OMEGA "/entry/sample/transformations/omega"

/* McStas (NeXus) <-> DIALS laboratory frame: x -> -x, z -> -z (self-inverse). */
static void flip(const double *v, double *out)
{
    out[0] = -v[0], out[1] = v[1], out[2] = -v[2];
}

/* ---------------------------------------------------------------------------------------------------------- */
/* Writing                                                                                                      */
/* ---------------------------------------------------------------------------------------------------------- */

/* The state of one write: the first failure is kept (rc) and every later call becomes a no-op, so the layout code
 * reads as a plain list of what the file holds and the error names the first dataset that could not be made. */
typedef struct {
    nbg_ctx *ctx;
    const char *path; /* the caller's name, for messages */
    hid_t file;
    int rc;
    hid_t gcpl, dcpl; /* creation properties without modification times: the same experiment, the same bytes */
} wr;

static int wfail(wr *w, const char *what)
{
    if (w->rc == NBG_OK)
        w->rc = nbgi_error(w->ctx, NBG_EIO, "cannot write %s: HDF5 failed to write %s", w->path, what);
    return w->rc;
}

static hid_t wgroup(wr *w, const char *name, const char *nxclass);
static void wattr_str(wr *w, hid_t obj, const char *objname, const char *name, const char *value);

/* Creates group `name` (absolute) with its NX_class; returns it open (caller closes) or -1. */
static hid_t wgroup(wr *w, const char *name, const char *nxclass)
{
    if (w->rc != NBG_OK)
        return -1;
    const hid_t g = H5Gcreate2(w->file, name, H5P_DEFAULT, w->gcpl, H5P_DEFAULT);
    if (g < 0) {
        wfail(w, name);
        return -1;
    }
    wattr_str(w, g, name, "NX_class", nxclass);
    return g;
}

/* A fixed-length string type of the value's length (h5py reads it as bytes, dxtbx's h5str decodes it). */
static hid_t str_type(const char *value)
{
    const hid_t t = H5Tcopy(H5T_C_S1);
    if (t < 0)
        return -1;
    const size_t n = strlen(value);
    if (H5Tset_size(t, n > 0 ? n : 1) < 0 || H5Tset_strpad(t, H5T_STR_NULLPAD) < 0 ||
        H5Tset_cset(t, H5T_CSET_UTF8) < 0) {
        H5Tclose(t);
        return -1;
    }
    return t;
}

static void wattr_str(wr *w, hid_t obj, const char *objname, const char *name, const char *value)
{
    if (w->rc != NBG_OK)
        return;
    int ok = 0;
    const hid_t t = str_type(value);
    const hid_t s = H5Screate(H5S_SCALAR);
    if (t >= 0 && s >= 0) {
        const hid_t a = H5Acreate2(obj, name, t, s, H5P_DEFAULT, H5P_DEFAULT);
        if (a >= 0) {
            /* an empty string still has one byte of storage: write a padded NUL */
            ok = H5Awrite(a, t, value[0] ? value : "") >= 0;
            H5Aclose(a);
        }
    }
    if (s >= 0)
        H5Sclose(s);
    if (t >= 0)
        H5Tclose(t);
    if (!ok) {
        char what[512];
        snprintf(what, sizeof what, "the attribute %s of %s", name, objname);
        wfail(w, what);
    }
}

/* n doubles as an attribute (n == 0: a scalar). */
static void wattr_dbl(wr *w, hid_t obj, const char *objname, const char *name, const double *v, int n)
{
    if (w->rc != NBG_OK)
        return;
    int ok = 0;
    const hsize_t dim = (hsize_t)n;
    const hid_t s = n > 0 ? H5Screate_simple(1, &dim, NULL) : H5Screate(H5S_SCALAR);
    if (s >= 0) {
        const hid_t a = H5Acreate2(obj, name, H5T_IEEE_F64LE, s, H5P_DEFAULT, H5P_DEFAULT);
        if (a >= 0) {
            ok = H5Awrite(a, H5T_NATIVE_DOUBLE, v) >= 0;
            H5Aclose(a);
        }
        H5Sclose(s);
    }
    if (!ok) {
        char what[512];
        snprintf(what, sizeof what, "the attribute %s of %s", name, objname);
        wfail(w, what);
    }
}

/* A dataset of n values (n == 0: a scalar) of file type ftype from memory type mtype; returned open, or -1. */
static hid_t wdata(wr *w, const char *name, hid_t ftype, hid_t mtype, const void *v, int n)
{
    if (w->rc != NBG_OK)
        return -1;
    const hsize_t dim = (hsize_t)n;
    const hid_t s = n > 0 ? H5Screate_simple(1, &dim, NULL) : H5Screate(H5S_SCALAR);
    hid_t d = -1;
    if (s >= 0) {
        d = H5Dcreate2(w->file, name, ftype, s, H5P_DEFAULT, w->dcpl, H5P_DEFAULT);
        if (d >= 0 && H5Dwrite(d, mtype, H5S_ALL, H5S_ALL, H5P_DEFAULT, v) < 0) {
            H5Dclose(d);
            d = -1;
        }
        H5Sclose(s);
    }
    if (d < 0)
        wfail(w, name);
    return d;
}

/* A double dataset with its units (NULL: none), closed. */
static void wdbl(wr *w, const char *name, const double *v, int n, const char *units)
{
    const hid_t d = wdata(w, name, H5T_IEEE_F64LE, H5T_NATIVE_DOUBLE, v, n);
    if (d >= 0) {
        if (units != NULL)
            wattr_str(w, d, name, "units", units);
        H5Dclose(d);
    }
}

/* Creates dataset name over space (with creation properties dcpl, H5P_DEFAULT for none) and writes buf of memory
 * type mtype into it, closed; 1 on success.  The caller owns space and dcpl and reports a failure. */
static int wcreate(wr *w, const char *name, hid_t ftype, hid_t space, hid_t dcpl, hid_t mtype, const void *buf)
{
    if (dcpl != H5P_DEFAULT && H5Pset_obj_track_times(dcpl, 0) < 0)
        return 0;
    const hid_t d = H5Dcreate2(w->file, name, ftype, space, H5P_DEFAULT, dcpl != H5P_DEFAULT ? dcpl : w->dcpl,
                               H5P_DEFAULT);
    if (d < 0)
        return 0;
    const int ok = H5Dwrite(d, mtype, H5S_ALL, H5S_ALL, H5P_DEFAULT, buf) >= 0;
    H5Dclose(d);
    return ok;
}

static void wstr(wr *w, const char *name, const char *value)
{
    if (w->rc != NBG_OK)
        return;
    int ok = 0;
    const hid_t t = str_type(value);
    const hid_t s = H5Screate(H5S_SCALAR);
    if (t >= 0 && s >= 0)
        ok = wcreate(w, name, t, s, H5P_DEFAULT, t, value);
    if (s >= 0)
        H5Sclose(s);
    if (t >= 0)
        H5Tclose(t);
    if (!ok)
        wfail(w, name);
}

/* One NXtransformations axis: values (n of them, or a scalar when n == 0), its type, units, vector (McStas),
 * zero offset, and what it depends on ("." for nothing). */
static void wtransform(wr *w, const char *name, const double *values, int n, const char *type, const char *units,
                       const double *vector, const char *depends_on)
{
    const hid_t d = wdata(w, name, H5T_IEEE_F64LE, H5T_NATIVE_DOUBLE, values, n);
    if (d < 0)
        return;
    static const double zero[3] = {0, 0, 0};
    wattr_str(w, d, name, "transformation_type", type);
    wattr_str(w, d, name, "units", units);
    wattr_dbl(w, d, name, "vector", vector, 3);
    wattr_dbl(w, d, name, "offset", zero, 3);
    wattr_str(w, d, name, "offset_units", "mm");
    wattr_str(w, d, name, "depends_on", depends_on);
    H5Dclose(d);
}

static void wclose(hid_t g)
{
    if (g >= 0)
        H5Gclose(g);
}

/* The sensor materials dxtbx knows (nexus/__init__.py KNOWN_SENSOR_MATERIALS): anything else it refuses. */
static int known_material(const char *m)
{
    return strcmp(m, "Si") == 0 || strcmp(m, "Silicon") == 0 || strcmp(m, "CdTe") == 0 || strcmp(m, "GaAs") == 0;
}

/* The image data: one chunk per frame (rows of a frame when a frame exceeds 1 GiB: HDF5's chunks stop at 4 GiB). */
static void wimages(wr *w, nbg_dtype dtype, const void *frames, int nframes, int spixels, int fpixels)
{
    if (w->rc != NBG_OK)
        return;
    const char *name = "/entry/data/data";
    const size_t elem = 4;
    hsize_t dims[3] = {(hsize_t)nframes, (hsize_t)spixels, (hsize_t)fpixels};
    hsize_t chunk[3] = {1, (hsize_t)spixels, (hsize_t)fpixels};
    const hsize_t cap = (hsize_t)1 << 30;
    if (chunk[2] * elem > cap)
        chunk[2] = cap / elem;
    while (chunk[1] > 1 && chunk[1] * chunk[2] * elem > cap)
        chunk[1] = (chunk[1] + 1) / 2;
    const hid_t ftype = dtype == NBG_DATA_INT32 ? H5T_STD_I32LE : H5T_IEEE_F32LE;
    const hid_t mtype = dtype == NBG_DATA_INT32 ? H5T_NATIVE_INT32 : H5T_NATIVE_FLOAT;
    const int level = dtype == NBG_DATA_INT32 ? NBGI_NXMX_DEFLATE_INT : NBGI_NXMX_DEFLATE_FLOAT;
    int ok = 0;
    const hid_t s = H5Screate_simple(3, dims, NULL);
    const hid_t p = H5Pcreate(H5P_DATASET_CREATE);
    if (s >= 0 && p >= 0 && H5Pset_chunk(p, 3, chunk) >= 0 &&
        (level == 0 || (H5Pset_shuffle(p) >= 0 && H5Pset_deflate(p, (unsigned)level) >= 0)))
        ok = wcreate(w, name, ftype, s, p, mtype, frames);
    if (p >= 0)
        H5Pclose(p);
    if (s >= 0)
        H5Sclose(s);
    if (!ok)
        wfail(w, "the image data /entry/data/data");
}

/* The pixel mask: NXmx's 32-bit field, bit 0 ("gap") for every bad pixel; compressed (it is mostly zeros). */
static void wmask(wr *w, const uint8_t *mask, int spixels, int fpixels)
{
    if (w->rc != NBG_OK)
        return;
    const size_t n = (size_t)spixels * fpixels;
    uint32_t *m = malloc(n * sizeof *m);
    if (m == NULL) {
        w->rc = nbgi_error(w->ctx, NBG_ENOMEM, "cannot write %s: out of memory for the pixel mask", w->path);
        return;
    }
    for (size_t i = 0; i < n; ++i)
        m[i] = mask[i] != 0;
    const char *name = DET "/pixel_mask";
    hsize_t dims[2] = {(hsize_t)spixels, (hsize_t)fpixels};
    hsize_t chunk[2] = {(hsize_t)spixels, (hsize_t)fpixels};
    while (chunk[0] > 1 && chunk[0] * chunk[1] * 4 > ((hsize_t)1 << 30))
        chunk[0] = (chunk[0] + 1) / 2;
    if (chunk[1] * 4 > ((hsize_t)1 << 30))
        chunk[1] = ((hsize_t)1 << 30) / 4;
    int ok = 0;
    const hid_t s = H5Screate_simple(2, dims, NULL);
    const hid_t p = H5Pcreate(H5P_DATASET_CREATE);
    if (s >= 0 && p >= 0 && H5Pset_chunk(p, 2, chunk) >= 0 && H5Pset_deflate(p, 1) >= 0)
        ok = wcreate(w, name, H5T_STD_U32LE, s, p, H5T_NATIVE_UINT32, m);
    if (p >= 0)
        H5Pclose(p);
    if (s >= 0)
        H5Sclose(s);
    free(m);
    if (!ok)
        wfail(w, name);
}

/* One NXdetector_module: its slab of the data (rows from row0, spixels x fpixels), its offset (a translation of
 * |origin| along origin's direction, DIALS frame, on `on`) and its pixel directions on the offset. */
static void wmodule(wr *w, const char *module, int row0, int spixels, int fpixels, const double origin[3],
                    const double fast[3], const double slow[3], double pixel_f, double pixel_s, const char *on)
{
    char name[256], offset[256];
    wclose(wgroup(w, module, "NXdetector_module"));
    const int dorigin[2] = {row0, 0}, size[2] = {spixels, fpixels}, stride[2] = {1, 1};
    snprintf(name, sizeof name, "%s/data_origin", module);
    const hid_t d1 = wdata(w, name, H5T_STD_I32LE, H5T_NATIVE_INT, dorigin, 2);
    snprintf(name, sizeof name, "%s/data_size", module);
    const hid_t d2 = wdata(w, name, H5T_STD_I32LE, H5T_NATIVE_INT, size, 2);
    snprintf(name, sizeof name, "%s/data_stride", module);
    const hid_t d3 = wdata(w, name, H5T_STD_I32LE, H5T_NATIVE_INT, stride, 2);
    if (d1 >= 0)
        H5Dclose(d1);
    if (d2 >= 0)
        H5Dclose(d2);
    if (d3 >= 0)
        H5Dclose(d3);
    double om[3], ou[3] = {1, 0, 0};
    flip(origin, om);
    const double dist = nbgi_norm(om);
    if (dist > 0)
        ou[0] = om[0] / dist, ou[1] = om[1] / dist, ou[2] = om[2] / dist;
    snprintf(offset, sizeof offset, "%s/module_offset", module);
    wtransform(w, offset, &dist, 0, "translation", "mm", ou, on);
    double fm[3], sm[3];
    flip(fast, fm);
    flip(slow, sm);
    snprintf(name, sizeof name, "%s/fast_pixel_direction", module);
    wtransform(w, name, &pixel_f, 0, "translation", "mm", fm, offset);
    snprintf(name, sizeof name, "%s/slow_pixel_direction", module);
    wtransform(w, name, &pixel_s, 0, "translation", "mm", sm, offset);
}

/* Everything but the data: the groups, the beam, the detector and its chain (one module, or one per panel), the
 * sample's rotation. */
static void wlayout(wr *w, const nbg_geometry *g, const nbg_panel *panels, int npanels, const uint8_t *mask,
                    int rows, int cols)
{
    wattr_str(w, w->file, "/", "default", "entry");
    wclose(wgroup(w, "/entry", "NXentry"));
    wstr(w, "/entry/definition", "NXmx");
    const hid_t data = wgroup(w, "/entry/data", "NXdata");
    if (data >= 0)
        wattr_str(w, data, "/entry/data", "signal", "data");
    wclose(data);
    wclose(wgroup(w, "/entry/instrument", "NXinstrument"));
    wstr(w, "/entry/instrument/name", "nbgrad simulation");
    wclose(wgroup(w, "/entry/source", "NXsource"));
    wstr(w, "/entry/source/name", "nbgrad simulation");

    /* beam: the wavelength; the polarization as Stokes parameters (I, Q, U, V) in the McStas frame, the angle of
     * the electric vector's plane measured from McStas x towards y: that plane contains the beam and is normal
     * to g's polarization normal, and its degree of linear polarization is 2 * fraction - 1. */
    wclose(wgroup(w, "/entry/instrument/beam", "NXbeam"));
    wdbl(w, "/entry/instrument/beam/incident_wavelength", &g->wavelength, 0, "angstrom");
    {
        double e[3], em[3];
        nbgi_cross(g->polarization_normal, g->direction, e);
        flip(e, em);
        const double psi = atan2(em[1], em[0]), p = 2 * g->polarization_fraction - 1;
        const double stokes[4] = {1, p * cos(2 * psi), p * sin(2 * psi), 0};
        wdbl(w, "/entry/instrument/beam/incident_polarisation_stokes", stokes, 4, NULL);
    }

    /* detector */
    const hid_t det = wgroup(w, DET, "NXdetector");
    wstr(w, DET "/depends_on", DET_T);
    wstr(w, DET "/description", "nbgrad simulated pixel-array detector");
    wstr(w, DET "/type", "pixel");
    /* dxtbx needs a material it knows; an unknown one ("") is written as Si and flagged so that this reader gives
     * "" back */
    const int no_material = g->material[0] == '\0';
    wstr(w, DET "/sensor_material", no_material ? "Si" : g->material);
    /* dxtbx's parallax correction asserts a positive thickness: "no sensor" (0) is written as 1e-9 mm, a correction
     * of at most that, and flagged so that this reader gives 0 back */
    const double thickness = g->thickness > 0 ? g->thickness : 1e-9;
    wdbl(w, DET "/sensor_thickness", &thickness, 0, "mm");
    if (!isnan(g->saturation))
        wdbl(w, DET "/saturation_value", &g->saturation, 0, NULL);
    wdbl(w, DET "/count_time", &g->exposure, 0, "s");
    wdbl(w, DET "/frame_time", &g->exposure, 0, "s"); /* dxtbx takes the scan's exposure times from frame_time */
    const double px[2] = {g->pixel_f, g->pixel_s};
    wdbl(w, DET "/x_pixel_size", &px[0], 0, "mm");
    wdbl(w, DET "/y_pixel_size", &px[1], 0, "mm");
    if (det >= 0) {
        wattr_dbl(w, det, DET, "nbgrad_pedestal", &g->pedestal, 0);
        wattr_dbl(w, det, DET, "nbgrad_gain", &g->gain, 0);
        wattr_dbl(w, det, DET, "nbgrad_mu", &g->mu, 0);
        const double nm = no_material;
        wattr_dbl(w, det, DET, "nbgrad_material_unknown", &nm, 0);
        const double nt = !(g->thickness > 0);
        wattr_dbl(w, det, DET, "nbgrad_no_thickness", &nt, 0);
        if (g->sensor_model != 0 && g->sensor_layers > 0) {
            /* how nbgrad rendered the sensor (the model, nbg_sensor_model, and its layers), as an experiment list
             * carries it (nbgrad_sensor): read back, the same image */
            const double sm = g->sensor_model, sl = g->sensor_layers;
            wattr_dbl(w, det, DET, "nbgrad_sensor_model", &sm, 0);
            wattr_dbl(w, det, DET, "nbgrad_sensor_layers", &sl, 0);
        }
    }
    wclose(det);
    if (mask != NULL)
        wmask(w, mask, rows, cols);

    wclose(wgroup(w, DET "/transformations", "NXtransformations"));
    if (npanels == 0) {
        /* the panel's origin: one translation of |origin| along its direction (McStas), the module at 0 on it */
        double om[3], ou[3] = {0, 0, 1};
        flip(g->origin, om);
        const double dist = nbgi_norm(om);
        if (dist > 0)
            ou[0] = om[0] / dist, ou[1] = om[1] / dist, ou[2] = om[2] / dist;
        wtransform(w, DET_T, &dist, 0, "translation", "mm", ou, ".");
        static const double zero3[3] = {0, 0, 0};
        wmodule(w, MODULE, 0, g->spixels, g->fpixels, zero3, g->fast, g->slow, g->pixel_f, g->pixel_s, DET_T);
    } else {
        /* the detector at the sample (0 along McStas z), every panel's origin in its module's offset: DIALS
         * makes a group of the detector's translation and one of each module's offset, each panel in its own */
        static const double z[3] = {0, 0, 1};
        const double zero = 0;
        wtransform(w, DET_T, &zero, 0, "translation", "mm", z, ".");
        int digits = 1;
        for (int n = npanels - 1; n >= 10; n /= 10) ++digits;
        int row0 = 0;
        for (int k = 0; k < npanels && w->rc == NBG_OK; ++k) {
            /* zero-padded: readers list the modules in name order */
            char num[16], module[128];
            const int len = snprintf(num, sizeof num, "%d", k);
            snprintf(module, sizeof module, DET "/module_%.*s%s", digits > len ? digits - len : 0, "0000000000", num);
            const nbg_panel *p = &panels[k];
            wmodule(w, module, row0, p->spixels, p->fpixels, p->origin, p->fast, p->slow, p->pixel, p->pixel, DET_T);
            const hid_t m = H5Gopen2(w->file, module, H5P_DEFAULT);
            if (m >= 0) {
                char label[48];
                snprintf(label, sizeof label, "panel %d", k);
                wattr_str(w, m, module, "nbgrad_panel_name", p->name[0] != '\0' ? p->name : label);
                H5Gclose(m);
            }
            row0 += p->spixels;
        }
    }

    /* sample: one rotation axis, the angle of every frame's start; _end and _increment_set give the width even
     * for a single frame (dxtbx takes the scan's step from _end) */
    wclose(wgroup(w, "/entry/sample", "NXsample"));
    wstr(w, "/entry/sample/name", "nbgrad");
    if (g->goniometer.naxes <= 0)
        wstr(w, "/entry/sample/depends_on", OMEGA);
    wclose(wgroup(w, "/entry/sample/transformations", "NXtransformations"));
    if (w->rc != NBG_OK)
        return;
    double *ang = malloc(2 * (size_t)g->nframes * sizeof *ang);
    if (ang == NULL) {
        w->rc = nbgi_error(w->ctx, NBG_ENOMEM, "cannot write %s: out of memory for the scan angles", w->path);
        return;
    }
    for (int i = 0; i < g->nframes; ++i) {
        ang[i] = g->scan_start + i * g->scan_width;
        ang[g->nframes + i] = g->scan_start + (i + 1) * g->scan_width;
    }
    if (g->goniometer.naxes <= 0) {
        double am[3];
        flip(g->axis, am);
        wtransform(w, OMEGA, ang, g->nframes, "rotation", "deg", am, ".");
        wdbl(w, OMEGA "_end", ang + g->nframes, g->nframes, "deg");
        wdbl(w, OMEGA "_increment_set", &g->scan_width, 0, "deg");
        free(ang);
        return;
    }
    /* a multi-axis goniometer: the sample on its innermost axis, each axis on the next outer one, the outermost on
     * nothing; the scan axis with the frames' angles (as omega above), the others their angle at every frame */
    nbg_goniometer gn;
    nbgi_goniometer_written(g, &gn);
    char names[NBG_GONIO_MAX_AXES][32], path[NBG_GONIO_MAX_AXES][96];
    for (int i = 0; i < gn.naxes; ++i) {
        nbgi_goniometer_name(&gn, i, NULL, names[i]);
        snprintf(path[i], sizeof path[i], "/entry/sample/transformations/%s", names[i]);
    }
    double *fixed = malloc((size_t)g->nframes * sizeof *fixed);
    if (fixed == NULL) {
        free(ang);
        w->rc = nbgi_error(w->ctx, NBG_ENOMEM, "cannot write %s: out of memory for the goniometer's angles", w->path);
        return;
    }
    wstr(w, "/entry/sample/depends_on", path[0]);
    for (int i = 0; i < gn.naxes && w->rc == NBG_OK; ++i) {
        double v[3];
        flip(gn.axes[i], v);
        const char *dep = i + 1 < gn.naxes ? path[i + 1] : ".";
        if (i == gn.scan_axis) {
            char aux[160];
            wtransform(w, path[i], ang, g->nframes, "rotation", "deg", v, dep);
            snprintf(aux, sizeof aux, "%.96s_end", path[i]);
            wdbl(w, aux, ang + g->nframes, g->nframes, "deg");
            snprintf(aux, sizeof aux, "%.96s_increment_set", path[i]);
            wdbl(w, aux, &g->scan_width, 0, "deg");
        } else {
            for (int j = 0; j < g->nframes; ++j)
                fixed[j] = gn.angles[i];
            wtransform(w, path[i], fixed, g->nframes, "rotation", "deg", v, dep);
        }
    }
    free(fixed);
    free(ang);
}

/* The detector between the source and the sample, which dxtbx moves behind it. */
static int upstream(const nbg_geometry *g)
{
    double n[3];
    nbgi_cross(g->fast, g->slow, n);
    return fabs(nbgi_dot(n, g->direction)) > 0.99 && nbgi_dot(g->origin, g->direction) > 0;
}

int nbgi_write_nxmx_panels_set(nbg_ctx *ctx, nbgi_outset *set, const char *path, const nbg_geometry *g,
                               const nbg_panel *panels, int npanels, nbg_dtype dtype, const void *frames,
                               int nframes, const uint8_t *mask)
{
    if (path == NULL || frames == NULL)
        return nbgi_error(ctx, NBG_EINVAL, "nbg_write_nxmx: no %s", path == NULL ? "file name" : "image data");
    char what[600];
    snprintf(what, sizeof what, "writing %s", path);
    int rc = nbgi_geometry_check(ctx, g, what);
    if (rc != NBG_OK)
        return rc;
    if ((rc = nbgi_panels_check(ctx, g, panels, npanels, what)) != NBG_OK)
        return rc;
    /* the stacked data: the panels' rows one after the other, as wide as the widest panel */
    long rows = npanels == 0 ? g->spixels : 0;
    int cols = npanels == 0 ? g->fpixels : 0, padded = 0;
    for (int k = 0; k < npanels; ++k) {
        rows += panels[k].spixels;
        if (cols != 0 && panels[k].fpixels != cols)
            padded = 1;
        if (panels[k].fpixels > cols)
            cols = panels[k].fpixels;
    }
    if (rows > INT_MAX)
        return nbgi_error(ctx, NBG_EINVAL, "writing %s: the panels have %ld rows in all, too many", path, rows);
    for (int k = 0; k < npanels; ++k) {
        nbg_geometry gk;
        nbgi_geometry_of_panel(g, &panels[k], &gk);
        if (upstream(&gk))
            return nbgi_error(ctx, NBG_EUNSUP, "writing %s: panel %d lies between the source and the sample, which "
                              "DIALS's NXmx reader would move behind the sample", path, k);
    }
    if (dtype != NBG_DATA_FLOAT32 && dtype != NBG_DATA_INT32)
        return nbgi_error(ctx, NBG_EINVAL, "writing %s: unknown data type %d (float32 or int32)", path, (int)dtype);
    if (nframes != g->nframes)
        return nbgi_error(ctx, NBG_EINVAL,
                          "writing %s: %d images given for a scan of %d (the file's angles describe every image)",
                          path, nframes, g->nframes);
    /* dxtbx's NXmx reader always makes a beam along -z (sample-to-source (0,0,1)) */
    if (fabs(g->direction[0]) > 1e-9 || fabs(g->direction[1]) > 1e-9 || g->direction[2] < 0)
        return nbgi_error(ctx, NBG_EUNSUP,
                          "writing %s: the beam direction (%g, %g, %g) is not supported in NXmx: DIALS's reader "
                          "assumes the sample-to-source direction (0, 0, 1) (the beam along -z)",
                          path, g->direction[0], g->direction[1], g->direction[2]);
    if (g->material[0] != '\0' && !known_material(g->material))
        return nbgi_error(ctx, NBG_EUNSUP,
                          "writing %s: DIALS's NXmx reader does not know the sensor material \"%s\" (Si, CdTe, GaAs)",
                          path, g->material);
    /* dxtbx moves a detector that faces the beam upstream of the sample to z -> -z, thinking the sign wrong */
    if (npanels == 0 && upstream(g))
        return nbgi_error(ctx, NBG_EUNSUP,
                          "writing %s: the detector lies between the source and the sample, which DIALS's NXmx "
                          "reader would move behind the sample",
                          path);

    /* dxtbx 3.11 slices the pixel mask in memory and hands flex the slice, which it refuses when the slice is
     * narrower than the mask: panels of different widths can have no mask there */
    if (padded && mask != NULL)
        return nbgi_error(ctx, NBG_EUNSUP, "writing %s: a pixel mask for panels of different widths (DIALS's NXmx "
                          "reader cannot cut it into the panels)", path);
    /* panels of different widths: the frames padded to the widest (the padding 0) */
    void *pframes = NULL;
    if (padded) {
        const size_t per = (size_t)rows * (size_t)cols;
        if ((rc = nbgi_check_bytes(ctx, 4.0 * (double)per * nframes, "the padded NXmx data")) != NBG_OK)
            return rc;
        pframes = calloc(per * (size_t)nframes, 4);
        if (pframes == NULL)
            return nbgi_error(ctx, NBG_ENOMEM, "out of memory for the padded NXmx data of %s", path);
        size_t npix = 0;
        for (int k = 0; k < npanels; ++k) npix += (size_t)panels[k].fpixels * (size_t)panels[k].spixels;
        for (int f = 0; f < nframes; ++f) {
            const unsigned char *in = (const unsigned char *)frames + 4 * (size_t)f * npix;
            unsigned char *out = (unsigned char *)pframes + 4 * (size_t)f * per;
            size_t s0 = 0, r0 = 0;
            for (int k = 0; k < npanels; ++k) {
                const size_t fp = (size_t)panels[k].fpixels;
                for (int j = 0; j < panels[k].spixels; ++j, ++r0, s0 += fp)
                    memcpy(out + 4 * r0 * cols, in + 4 * s0, 4 * fp);
            }
        }
    }

    H5Eset_auto2(H5E_DEFAULT, NULL, NULL); /* the library never prints: failures become messages */
    /* HDF5 builds the file in memory (the core driver, no backing store) and nbgrad writes its image: a full disk
     * or another write error is then nbgrad's to report (errno's message), and HDF5 is never left with a file it
     * could not close (libhdf5 1.10 then crashed at exit, in H5F__close_cb) */
    const double bytes = (double)rows * cols * 4.0 * nframes + (mask != NULL ? (double)rows * cols : 0) + 1e6;
    rc = nbgi_check_bytes(ctx, 2 * bytes, "the NXmx file's image in memory");
    if (rc != NBG_OK) {
        free(pframes);
        return rc;
    }
    wr w = {ctx, path, -1, NBG_OK, -1, -1};
    const hid_t fapl = H5Pcreate(H5P_FILE_ACCESS), fcpl = H5Pcreate(H5P_FILE_CREATE);
    w.gcpl = H5Pcreate(H5P_GROUP_CREATE);
    w.dcpl = H5Pcreate(H5P_DATASET_CREATE);
    /* no object carries the time it was written (HDF5 stamps each by default) */
    const int props = fapl >= 0 && fcpl >= 0 && w.gcpl >= 0 && w.dcpl >= 0 &&
                      H5Pset_fapl_core(fapl, (size_t)1 << 20, 0) >= 0 && H5Pset_obj_track_times(fcpl, 0) >= 0 &&
                      H5Pset_obj_track_times(w.gcpl, 0) >= 0 && H5Pset_obj_track_times(w.dcpl, 0) >= 0;
    if (props)
        w.file = H5Fcreate("nbgrad-nxmx-in-memory", H5F_ACC_TRUNC, fcpl, fapl);
    if (fapl >= 0)
        H5Pclose(fapl);
    if (fcpl >= 0)
        H5Pclose(fcpl);
    if (!props || w.file < 0) {
        if (w.gcpl >= 0)
            H5Pclose(w.gcpl);
        if (w.dcpl >= 0)
            H5Pclose(w.dcpl);
        free(pframes);
        return nbgi_error(ctx, NBG_EIO, "cannot write %s: HDF5 cannot create the file in memory", path);
    }
    wlayout(&w, g, panels, npanels, mask, (int)rows, cols);
    wimages(&w, dtype, padded ? pframes : frames, nframes, (int)rows, cols);
    free(pframes);
    if (w.rc == NBG_OK && H5Lcreate_hard(w.file, "/entry/data/data", w.file, DET "/data", H5P_DEFAULT,
                                         H5P_DEFAULT) < 0)
        wfail(&w, DET "/data (a link to /entry/data/data)");
    void *image = NULL;
    ssize_t isize = -1;
    if (w.rc == NBG_OK && H5Fflush(w.file, H5F_SCOPE_GLOBAL) < 0)
        wfail(&w, "the file (flushing it in memory)");
    if (w.rc == NBG_OK && (isize = H5Fget_file_image(w.file, NULL, 0)) > 0 && (image = malloc((size_t)isize)) != NULL &&
        H5Fget_file_image(w.file, image, (size_t)isize) != isize)
        isize = -1;
    if (H5Fclose(w.file) < 0)
        wfail(&w, "the file (closing it in memory)");
    H5Pclose(w.gcpl);
    H5Pclose(w.dcpl);
    if (w.rc == NBG_OK && (isize <= 0 || image == NULL))
        w.rc = nbgi_error(ctx, image == NULL && isize > 0 ? NBG_ENOMEM : NBG_EIO,
                          "cannot write %s: HDF5 gave no image of the file (%zd bytes)", path, isize);
    if (w.rc != NBG_OK) {
        free(image);
        return w.rc;
    }
    nbgi_out o;
    rc = nbgi_out_open(ctx, path, &o);
    if (rc == NBG_OK)
        rc = nbgi_out_write(ctx, &o, image, (size_t)isize);
    free(image);
    return rc == NBG_OK ? nbgi_out_finish(ctx, &o, set) : rc;
}

int nbgi_write_nxmx_set(nbg_ctx *ctx, nbgi_outset *set, const char *path, const nbg_geometry *g, nbg_dtype dtype,
                        const void *frames, int nframes, const uint8_t *mask)
{
    return nbgi_write_nxmx_panels_set(ctx, set, path, g, NULL, 0, dtype, frames, nframes, mask);
}

int nbg_write_nxmx(nbg_ctx *ctx, const char *path, const nbg_geometry *g, nbg_dtype dtype, const void *frames,
                   int nframes, const uint8_t *mask)
{
    return nbgi_write_nxmx_set(ctx, NULL, path, g, dtype, frames, nframes, mask);
}

int nbg_write_nxmx_panels(nbg_ctx *ctx, const char *path, const nbg_geometry *g, const nbg_panel *panels,
                          int npanels, nbg_dtype dtype, const void *frames, int nframes, const uint8_t *mask)
{
    return nbgi_write_nxmx_panels_set(ctx, NULL, path, g, panels, npanels, dtype, frames, nframes, mask);
}

/* ---------------------------------------------------------------------------------------------------------- */
/* Reading                                                                                                      */
/* ---------------------------------------------------------------------------------------------------------- */

/* out = a "/" b (a path under a group; too long a path is cut, and then fails to open with a message). */
__attribute__((noinline)) static void pjoin(char *out, size_t size, const char *a, const char *b)
{
    snprintf(out, size, "%s/%s", a, b);
}

/* out = a copy of s, cut to size. */
__attribute__((noinline)) static void scopy(char *out, size_t size, const char *s)
{
    snprintf(out, size, "%s", s);
}

typedef struct {
    nbg_ctx *ctx;
    const char *path;
    hid_t file;
} rd;

/* A malformed file: NBG_EFORMAT naming the file and the object. */
static int bad(rd *r, const char *obj, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 3, 4)))
#endif
    ;
static int bad(rd *r, const char *obj, const char *fmt, ...)
{
    char msg[700];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return nbgi_error(r->ctx, NBG_EFORMAT, "%s: %s: %s", r->path, obj, msg);
}

/* 1 when loc has a link `name` that resolves to an object (a dangling external link does not). */
static int exists(hid_t loc, const char *name)
{
    /* H5Lexists checks only the last component: check every prefix of a relative or absolute path */
    char buf[1024];
    if (strlen(name) >= sizeof buf)
        return 0;
    snprintf(buf, sizeof buf, "%s", name);
    for (char *p = buf + (buf[0] == '/'); *p; ++p) {
        if (*p == '/') {
            *p = '\0';
            const htri_t e = H5Lexists(loc, buf, H5P_DEFAULT);
            *p = '/';
            if (e <= 0)
                return 0;
        }
    }
    if (strcmp(buf, "/") == 0)
        return 1;
    return H5Lexists(loc, buf, H5P_DEFAULT) > 0 && H5Oexists_by_name(loc, buf, H5P_DEFAULT) > 0;
}

/* Reads a string (fixed or variable length, scalar or one element) from a dataset (attr NULL) or an attribute of
 * obj.  NBG_EFORMAT naming `what` when it is not a single string. */
static int read_str(rd *r, hid_t obj, const char *attr, const char *what, char *out, size_t size)
{
    const hid_t a = attr != NULL ? H5Aopen(obj, attr, H5P_DEFAULT) : obj;
    if (a < 0)
        return bad(r, what, "cannot be read");
    const hid_t t = attr != NULL ? H5Aget_type(a) : H5Dget_type(a);
    const hid_t s = attr != NULL ? H5Aget_space(a) : H5Dget_space(a);
    int rc = NBG_OK;
    if (t < 0 || s < 0 || H5Tget_class(t) != H5T_STRING) {
        rc = bad(r, what, "is not a string");
    } else if (H5Sget_simple_extent_npoints(s) != 1) {
        rc = bad(r, what, "is not a single string (%lld values)", (long long)H5Sget_simple_extent_npoints(s));
    } else if (H5Tis_variable_str(t) > 0) {
        char *p = NULL;
        const hid_t m = H5Tcopy(H5T_C_S1);
        H5Tset_size(m, H5T_VARIABLE);
        H5Tset_cset(m, H5Tget_cset(t));
        const herr_t e = attr != NULL ? H5Aread(a, m, &p) : H5Dread(a, m, H5S_ALL, H5S_ALL, H5P_DEFAULT, &p);
        if (e < 0 || p == NULL)
            rc = bad(r, what, "cannot be read");
        else
            snprintf(out, size, "%s", p);
        if (p != NULL)
            H5free_memory(p);
        H5Tclose(m);
    } else {
        const size_t n = H5Tget_size(t);
        char *buf = n < (1u << 20) ? calloc(n + 1, 1) : NULL;
        const hid_t m = H5Tcopy(t);
        if (buf == NULL) {
            rc = bad(r, what, "is a string of %zu bytes, too long", n);
        } else if ((attr != NULL ? H5Aread(a, m, buf) : H5Dread(a, m, H5S_ALL, H5S_ALL, H5P_DEFAULT, buf)) < 0) {
            rc = bad(r, what, "cannot be read");
        } else {
            snprintf(out, size, "%s", buf);
        }
        free(buf);
        H5Tclose(m);
    }
    if (s >= 0)
        H5Sclose(s);
    if (t >= 0)
        H5Tclose(t);
    if (attr != NULL)
        H5Aclose(a);
    /* trailing blanks: some writers pad */
    for (size_t n = strlen(out); rc == NBG_OK && n > 0 && out[n - 1] == ' '; --n)
        out[n - 1] = '\0';
    return rc;
}

/* A string dataset at loc/name. */
static int read_str_ds(rd *r, hid_t loc, const char *name, const char *what, char *out, size_t size)
{
    const hid_t d = H5Dopen2(loc, name, H5P_DEFAULT);
    if (d < 0)
        return bad(r, what, "cannot be opened");
    const int rc = read_str(r, d, NULL, what, out, size);
    H5Dclose(d);
    return rc;
}

/* A string attribute; "" when absent. */
static int read_str_attr(rd *r, hid_t obj, const char *attr, const char *what, char *out, size_t size)
{
    out[0] = '\0';
    if (H5Aexists(obj, attr) <= 0)
        return NBG_OK;
    return read_str(r, obj, attr, what, out, size);
}

/* Reads a numeric attribute of exactly n values (n == 1 also takes a scalar).  *found = 0 when absent (then out is
 * untouched); found NULL makes it required. */
static int read_attr_dbl(rd *r, hid_t obj, const char *attr, const char *what, double *out, int n, int *found)
{
    if (found != NULL)
        *found = 0;
    if (H5Aexists(obj, attr) <= 0)
        return found != NULL ? NBG_OK : bad(r, what, "has no attribute %s", attr);
    const hid_t a = H5Aopen(obj, attr, H5P_DEFAULT);
    if (a < 0)
        return bad(r, what, "the attribute %s cannot be read", attr);
    const hid_t t = H5Aget_type(a), s = H5Aget_space(a);
    int rc = NBG_OK;
    const H5T_class_t c = t >= 0 ? H5Tget_class(t) : H5T_NO_CLASS;
    if (c != H5T_INTEGER && c != H5T_FLOAT)
        rc = bad(r, what, "the attribute %s is not a number", attr);
    else if (H5Sget_simple_extent_npoints(s) != n)
        rc = bad(r, what, "the attribute %s has %lld values, not %d", attr,
                 (long long)H5Sget_simple_extent_npoints(s), n);
    else if (H5Aread(a, H5T_NATIVE_DOUBLE, out) < 0)
        rc = bad(r, what, "the attribute %s cannot be read", attr);
    for (int i = 0; rc == NBG_OK && i < n; ++i) {
        if (!isfinite(out[i]))
            rc = bad(r, what, "the attribute %s is not finite", attr);
    }
    if (rc == NBG_OK && found != NULL)
        *found = 1;
    H5Sclose(s);
    H5Tclose(t);
    H5Aclose(a);
    return rc;
}

/* Reads all values of a numeric dataset as doubles (malloc'd, *n of them, at least one). */
static int read_dbl_ds(rd *r, hid_t d, const char *what, double **out, size_t *n)
{
    *out = NULL;
    *n = 0;
    const hid_t t = H5Dget_type(d), s = H5Dget_space(d);
    int rc = NBG_OK;
    const H5T_class_t c = t >= 0 ? H5Tget_class(t) : H5T_NO_CLASS;
    const hssize_t np = s >= 0 ? H5Sget_simple_extent_npoints(s) : -1;
    if (c != H5T_INTEGER && c != H5T_FLOAT) {
        rc = bad(r, what, "is not numeric");
    } else if (np < 1) {
        rc = bad(r, what, "is empty");
    } else {
        char desc[600];
        snprintf(desc, sizeof desc, "%s of %s (%lld values)", what, r->path, (long long)np);
        rc = nbgi_check_bytes(r->ctx, (double)np * sizeof(double), desc);
        if (rc == NBG_OK) {
            *out = malloc((size_t)np * sizeof(double));
            if (*out == NULL)
                rc = nbgi_error(r->ctx, NBG_ENOMEM, "%s: out of memory reading %s", r->path, what);
            else if (H5Dread(d, H5T_NATIVE_DOUBLE, H5S_ALL, H5S_ALL, H5P_DEFAULT, *out) < 0)
                rc = bad(r, what, "cannot be read (truncated or corrupt file?)");
        }
    }
    for (hssize_t i = 0; rc == NBG_OK && i < np; ++i) {
        if (!isfinite((*out)[i]))
            rc = bad(r, what, "holds a value that is not finite");
    }
    if (rc != NBG_OK) {
        free(*out);
        *out = NULL;
    } else {
        *n = (size_t)np;
    }
    if (s >= 0)
        H5Sclose(s);
    if (t >= 0)
        H5Tclose(t);
    return rc;
}

/* Units: the factor to mm, degrees, Angstrom or seconds. */
enum { U_LENGTH, U_ANGLE, U_TIME };
static int unit_factor(const char *u, int kind, double *f)
{
    static const struct {
        const char *name;
        int kind;
        double f;
    } t[] = {
        {"mm", U_LENGTH, 1},         {"millimeter", U_LENGTH, 1}, {"millimetre", U_LENGTH, 1},
        {"m", U_LENGTH, 1e3},        {"meter", U_LENGTH, 1e3},    {"metre", U_LENGTH, 1e3},
        {"cm", U_LENGTH, 10},        {"um", U_LENGTH, 1e-3},      {"micron", U_LENGTH, 1e-3},
        {"microns", U_LENGTH, 1e-3}, {"micrometer", U_LENGTH, 1e-3}, {"nm", U_LENGTH, 1e-6},
        {"angstrom", U_LENGTH, 1e-7}, {"A", U_LENGTH, 1e-7},
        {"deg", U_ANGLE, 1},         {"degree", U_ANGLE, 1},      {"degrees", U_ANGLE, 1},
        {"rad", U_ANGLE, 180 / M_PI}, {"radian", U_ANGLE, 180 / M_PI}, {"radians", U_ANGLE, 180 / M_PI},
        {"s", U_TIME, 1},            {"sec", U_TIME, 1},          {"second", U_TIME, 1},
        {"seconds", U_TIME, 1},      {"ms", U_TIME, 1e-3},        {"us", U_TIME, 1e-6},
    };
    for (size_t i = 0; i < sizeof t / sizeof t[0]; ++i) {
        if (t[i].kind == kind && strcmp(u, t[i].name) == 0) {
            *f = t[i].f;
            return 1;
        }
    }
    return 0;
}

/* The factor of the units attribute of obj (dflt when it has none; NULL dflt makes units required). */
static int units_of(rd *r, hid_t obj, const char *what, int kind, const char *dflt, double *f)
{
    char u[64];
    int rc = read_str_attr(r, obj, "units", what, u, sizeof u);
    if (rc != NBG_OK)
        return rc;
    if (u[0] == '\0') {
        if (dflt == NULL)
            return bad(r, what, "has no units");
        snprintf(u, sizeof u, "%s", dflt);
    }
    if (!unit_factor(u, kind, f))
        return bad(r, what, "has units \"%s\", not %s", u,
                   kind == U_LENGTH ? "a length" : kind == U_ANGLE ? "an angle" : "a time");
    return NBG_OK;
}

/* One scalar (or the first value) of a numeric dataset loc/name in the given units.  *found = 0 when absent and
 * found is not NULL (else absence is an error). */
static int read_scalar(rd *r, hid_t loc, const char *name, const char *what, int kind, const char *dflt_units,
                       double *out, int *found)
{
    if (found != NULL)
        *found = 0;
    if (!exists(loc, name))
        return found != NULL ? NBG_OK : bad(r, what, "is missing");
    const hid_t d = H5Dopen2(loc, name, H5P_DEFAULT);
    if (d < 0)
        return bad(r, what, "cannot be opened");
    double *v = NULL, f = 1;
    size_t n = 0;
    int rc = read_dbl_ds(r, d, what, &v, &n);
    if (rc == NBG_OK && kind >= 0)
        rc = units_of(r, d, what, kind, dflt_units, &f);
    if (rc == NBG_OK) {
        *out = v[0] * f;
        if (found != NULL)
            *found = 1;
    }
    free(v);
    H5Dclose(d);
    return rc;
}

/* A rigid transformation x -> R x + t. */
typedef struct {
    double R[9], t[3];
} xform;

static void xf_identity(xform *x)
{
    memset(x, 0, sizeof *x);
    x->R[0] = x->R[4] = x->R[8] = 1;
}

/* a := a * b (b applied first). */
static void xf_mul(xform *a, const xform *b)
{
    xform c;
    for (int i = 0; i < 3; ++i) {
        for (int j = 0; j < 3; ++j)
            c.R[3 * i + j] = a->R[3 * i] * b->R[j] + a->R[3 * i + 1] * b->R[3 + j] + a->R[3 * i + 2] * b->R[6 + j];
        c.t[i] = a->R[3 * i] * b->t[0] + a->R[3 * i + 1] * b->t[1] + a->R[3 * i + 2] * b->t[2] + a->t[i];
    }
    *a = c;
}

static void mat_vec(const double *R, const double *v, double *out)
{
    for (int i = 0; i < 3; ++i)
        out[i] = R[3 * i] * v[0] + R[3 * i + 1] * v[1] + R[3 * i + 2] * v[2];
}

/* Right-handed rotation by deg degrees about the unit vector u (Rodrigues). */
static void rotation(const double *u, double deg, double *R)
{
    const double a = deg * M_PI / 180, c = cos(a), s = sin(a), k = 1 - c;
    const double x = u[0], y = u[1], z = u[2];
    const double m[9] = {c + x * x * k,     x * y * k - z * s, x * z * k + y * s, y * x * k + z * s, c + y * y * k,
                         y * z * k - x * s, z * x * k - y * s, z * y * k + x * s, c + z * z * k};
    memcpy(R, m, sizeof m);
}

/* One axis of a depends_on chain as read: its transformation (at the first value), its unit vector, its values
 * (deg or mm) and the next link. */
typedef struct {
    char name[512];       /* the path of the dataset */
    int rotation;         /* 1 rotation, 0 translation, -1 neither (a fixed direction) */
    double vector[3];     /* as in the file (McStas) */
    double *values;       /* in deg or mm */
    size_t nvalues;
    xform x;              /* at values[0] */
    char depends_on[512]; /* the next axis ("" at the end), resolved to an absolute path */
} axis_t;

/* Resolves a depends_on path relative to the group that holds `from` (an absolute dataset path). */
static void resolve(const char *from, const char *dep, char *out, size_t size)
{
    if (dep[0] == '/' || dep[0] == '\0') {
        snprintf(out, size, "%s", dep);
        return;
    }
    const char *slash = strrchr(from, '/');
    const int len = slash != NULL ? (int)(slash - from) : 0;
    char dir[1024];
    snprintf(dir, sizeof dir, "%.*s", len, from);
    pjoin(out, size, dir, dep);
}

/* Reads the axis at the absolute path `name`. */
static int read_axis(rd *r, const char *name, axis_t *ax)
{
    memset(ax, 0, sizeof *ax);
    scopy(ax->name, sizeof ax->name, name);
    xf_identity(&ax->x);
    if (!exists(r->file, name))
        return bad(r, name, "is missing (named by a depends_on)");
    const hid_t d = H5Dopen2(r->file, name, H5P_DEFAULT);
    if (d < 0)
        return bad(r, name, "cannot be opened");
    char type[64], dep[512];
    double offset[3] = {0, 0, 0}, of = 1, f = 1;
    int has_offset = 0;
    int rc = read_str_attr(r, d, "transformation_type", name, type, sizeof type);
    if (rc == NBG_OK)
        rc = read_attr_dbl(r, d, "vector", name, ax->vector, 3, NULL);
    if (rc == NBG_OK)
        rc = read_attr_dbl(r, d, "offset", name, offset, 3, &has_offset);
    if (rc == NBG_OK)
        rc = read_str_attr(r, d, "depends_on", name, dep, sizeof dep);
    if (rc == NBG_OK)
        rc = read_dbl_ds(r, d, name, &ax->values, &ax->nvalues);
    ax->rotation = strcmp(type, "rotation") == 0 ? 1 : strcmp(type, "translation") == 0 ? 0 : -1;
    if (rc == NBG_OK && ax->rotation >= 0)
        rc = units_of(r, d, name, ax->rotation ? U_ANGLE : U_LENGTH, NULL, &f);
    if (rc == NBG_OK && has_offset && (offset[0] != 0 || offset[1] != 0 || offset[2] != 0)) {
        char u[64];
        rc = read_str_attr(r, d, "offset_units", name, u, sizeof u);
        /* like dxtbx: offsets without offset_units take the axis's own units (DLS Eiger files) */
        if (rc == NBG_OK && u[0] == '\0')
            rc = units_of(r, d, name, U_LENGTH, NULL, &of);
        else if (rc == NBG_OK && !unit_factor(u, U_LENGTH, &of))
            rc = bad(r, name, "has offset_units \"%s\", not a length", u);
    }
    H5Dclose(d);
    if (rc != NBG_OK)
        return rc;
    for (size_t i = 0; i < ax->nvalues; ++i)
        ax->values[i] *= f;
    const double len = nbgi_norm(ax->vector);
    if (!(len > 0))
        return bad(r, name, "has a zero-length vector");
    if (ax->rotation == 1) {
        double u[3] = {ax->vector[0] / len, ax->vector[1] / len, ax->vector[2] / len};
        rotation(u, ax->values[0], ax->x.R);
    } else if (ax->rotation == 0) {
        /* NeXus: t = value * vector (dxtbx does not normalise it either) */
        for (int i = 0; i < 3; ++i)
            ax->x.t[i] = ax->values[0] * ax->vector[i];
    }
    for (int i = 0; i < 3; ++i)
        ax->x.t[i] += offset[i] * of;
    if (strcmp(dep, ".") == 0)
        dep[0] = '\0';
    resolve(name, dep, ax->depends_on, sizeof ax->depends_on);
    return NBG_OK;
}

/* The chain that starts at `start` (absolute path): up to 16 axes. */
#define MAX_CHAIN 16
static int read_chain(rd *r, const char *start, axis_t *ax, int *n)
{
    *n = 0;
    char next[512];
    snprintf(next, sizeof next, "%s", start);
    while (next[0] != '\0') {
        if (*n == MAX_CHAIN)
            return bad(r, start, "its depends_on chain is longer than %d axes (a loop?)", MAX_CHAIN);
        const int rc = read_axis(r, next, &ax[*n]);
        ++*n;
        if (rc != NBG_OK)
            return rc;
        snprintf(next, sizeof next, "%s", ax[*n - 1].depends_on);
    }
    return NBG_OK;
}

static void free_chain(axis_t *ax, int n)
{
    for (int i = 0; i < n; ++i)
        free(ax[i].values);
}

/* Finds the first child of loc (a group path) of NX_class nxclass; *count receives how many there are. */
typedef struct {
    const char *nxclass;
    char first[256];
    int count;
    int want;      /* also the want-th match (0-based; -1: none) */
    char nth[256];
} find_t;

static herr_t find_cb(hid_t loc, const char *name, const H5L_info_t *info, void *data)
{
    find_t *f = data;
    (void)info;
    if (H5Oexists_by_name(loc, name, H5P_DEFAULT) <= 0)
        return 0;
    const hid_t o = H5Oopen(loc, name, H5P_DEFAULT);
    if (o < 0)
        return 0;
    if (H5Iget_type(o) == H5I_GROUP && H5Aexists(o, "NX_class") > 0) {
        rd quiet = {NULL, "", -1};
        char c[64];
        if (read_str(&quiet, o, "NX_class", "NX_class", c, sizeof c) == NBG_OK && strcmp(c, f->nxclass) == 0) {
            if (f->count == f->want)
                snprintf(f->nth, sizeof f->nth, "%s", name);
            if (f->count++ == 0)
                snprintf(f->first, sizeof f->first, "%s", name);
        }
    }
    H5Oclose(o);
    return 0;
}

/* The want-th (0-based, in name order) child of group of NX_class nxclass, or the first (want < 0). */
static int find_class_nth(rd *r, const char *group, const char *nxclass, int want, char *out, size_t size,
                          int *count)
{
    find_t f = {nxclass, "", 0, want, ""};
    const hid_t g = H5Gopen2(r->file, group, H5P_DEFAULT);
    if (g < 0)
        return bad(r, group, "cannot be opened");
    hsize_t idx = 0;
    const herr_t e = H5Literate(g, H5_INDEX_NAME, H5_ITER_INC, &idx, find_cb, &f);
    H5Gclose(g);
    if (e < 0)
        return bad(r, group, "cannot be listed (truncated or corrupt file?)");
    *count = f.count;
    if (f.count > 0)
        snprintf(out, size, "%s%s%s", group, strcmp(group, "/") == 0 ? "" : "/", want >= 0 ? f.nth : f.first);
    return NBG_OK;
}

static int find_class(rd *r, const char *group, const char *nxclass, char *out, size_t size, int *count)
{
    return find_class_nth(r, group, nxclass, -1, out, size, count);
}

/* A filter the data need that this HDF5 cannot load, named in *out ("" when every filter is there). */
static void missing_filter(hid_t d, char *out, size_t size)
{
    out[0] = '\0';
    const hid_t p = H5Dget_create_plist(d);
    if (p < 0)
        return;
    const int n = H5Pget_nfilters(p);
    for (int i = 0; i < n; ++i) {
        unsigned flags, cd[8];
        size_t ncd = 8;
        char name[128] = "";
        const H5Z_filter_t id = H5Pget_filter2(p, (unsigned)i, &flags, &ncd, cd, sizeof name, name, NULL);
        if (id >= 0 && H5Zfilter_avail(id) <= 0) {
            snprintf(out, size, "HDF5 filter %d (%s)", (int)id,
                     id == 32008 ? "bitshuffle" : id == 32004 ? "LZ4" : name[0] ? name : "unknown");
            break;
        }
    }
    H5Pclose(p);
}

/* The image data: the dataset that holds frame `frame` (NXdata's signal, "data", or Eiger's data_NNNNNN series,
 * where the frames run on from one dataset to the next), opened, with the frame's index within it. */
static int open_frames(rd *r, const char *nxdata, int frame, hid_t *dset, char *dname, size_t dsize, int *local,
                       long long *total)
{
    char signal[256] = "data";
    *dset = -1;
    *total = 0;
    const hid_t g = H5Gopen2(r->file, nxdata, H5P_DEFAULT);
    if (g < 0)
        return bad(r, nxdata, "cannot be opened");
    char s[256];
    int rc = read_str_attr(r, g, "signal", nxdata, s, sizeof s);
    if (rc == NBG_OK && s[0] != '\0')
        snprintf(signal, sizeof signal, "%s", s);
    char names[64][64];
    int nnames = 0;
    if (rc == NBG_OK && strlen(signal) >= sizeof names[0]) {
        H5Gclose(g);
        return bad(r, nxdata, "names a signal longer than 63 characters");
    }
    if (rc == NBG_OK && exists(g, signal)) {
        memcpy(names[nnames++], signal, strlen(signal) + 1); /* fits: checked above */
    } else if (rc == NBG_OK) {
        /* Eiger: data_000001, data_000002, ... (external links), in name order */
        for (int i = 1; i <= 64 && nnames < 64; ++i) {
            char nm[64];
            snprintf(nm, sizeof nm, "data_%06d", i);
            if (!exists(g, nm))
                break;
            snprintf(names[nnames++], sizeof names[0], "%s", nm);
        }
        if (nnames == 0)
            rc = bad(r, nxdata, "has no image data (no dataset \"%s\" nor data_000001)", signal);
    }
    long long before = 0;
    for (int i = 0; rc == NBG_OK && i < nnames; ++i) {
        snprintf(dname, dsize, "%s/%s", nxdata, names[i]);
        const hid_t d = H5Dopen2(g, names[i], H5P_DEFAULT);
        if (d < 0) {
            rc = bad(r, dname, "cannot be opened (a missing external file?)");
            break;
        }
        const hid_t sp = H5Dget_space(d);
        const int rank = sp >= 0 ? H5Sget_simple_extent_ndims(sp) : -1;
        hsize_t dims[3] = {0, 0, 0};
        if (rank == 2 || rank == 3)
            H5Sget_simple_extent_dims(sp, dims, NULL);
        if (sp >= 0)
            H5Sclose(sp);
        if (rank != 2 && rank != 3) {
            H5Dclose(d);
            rc = bad(r, dname, "has rank %d, not 3 (frames, slow, fast) or 2 (slow, fast)", rank);
            break;
        }
        const long long nf = rank == 3 ? (long long)dims[0] : 1;
        if (*dset < 0 && frame >= before && frame < before + nf) {
            *dset = d;
            *local = (int)(frame - before);
        } else {
            H5Dclose(d);
        }
        before += nf;
    }
    H5Gclose(g);
    *total = before;
    if (rc == NBG_OK && *dset < 0)
        rc = nbgi_error(r->ctx, NBG_EINVAL, "%s: %s: frame %d is out of range (the file holds %lld)", r->path, dname,
                        frame, before);
    if (rc != NBG_OK && *dset >= 0) {
        H5Dclose(*dset);
        *dset = -1;
    }
    if (rc == NBG_OK && nnames > 1)
        snprintf(dname, dsize, "%s/%s", nxdata, names[0]);
    return rc;
}

/* A dataset's images must be in the file: no compressor HDF5 applies to images packs more than about 1000 to 1
 * (deflate's bound; LZ4's, bitshuffle's with it, is 255), so a dataset that declares more than NXMX_MAX_RATIO times
 * the bytes it stores holds chunks never written, or a damaged or hostile header (a 24 KB file declaring gigabytes of
 * images): refused before any memory is asked for.  A virtual dataset (its data in other files) or one stored in
 * external files is not judged by this file's storage.  Small datasets (1 MB) pass: a compact layout stores them in
 * their header. */
#define NXMX_MAX_RATIO 4000.0
static int stored_plausibly(rd *r, hid_t d, const char *dname, double declared)
{
    if (declared <= 1e6)
        return NBG_OK;
    const hid_t dcpl = H5Dget_create_plist(d);
    if (dcpl < 0)
        return NBG_OK;
    const H5D_layout_t layout = H5Pget_layout(dcpl);
    const int external = H5Pget_external_count(dcpl) > 0;
    H5Pclose(dcpl);
    if (layout == H5D_VIRTUAL || external)
        return NBG_OK;
    const double stored = (double)H5Dget_storage_size(d);
    if (stored * NXMX_MAX_RATIO < declared)
        return bad(r, dname, "declares %.4g bytes of images but stores %.4g (more than %.0f to 1, beyond what any "
                   "compressor packs): chunks never written, or a damaged file", declared, stored, NXMX_MAX_RATIO);
    return NBG_OK;
}

/* Reads frame `local` of dataset d (rank 3, or rank 2 = one frame) as float. */
static int read_frame(rd *r, hid_t d, const char *dname, int local, int *spixels, int *fpixels, float **image)
{
    *image = NULL;
    const hid_t sp = H5Dget_space(d), t = H5Dget_type(d);
    const int rank = H5Sget_simple_extent_ndims(sp);
    hsize_t dims[3] = {1, 0, 0};
    H5Sget_simple_extent_dims(sp, rank == 3 ? dims : dims + 1, NULL);
    const H5T_class_t c = H5Tget_class(t);
    int rc = NBG_OK;
    if (c != H5T_INTEGER && c != H5T_FLOAT)
        rc = bad(r, dname, "holds neither integers nor floating-point numbers");
    else if (dims[1] < 1 || dims[2] < 1 || dims[1] > 1000000 || dims[2] > 1000000)
        rc = bad(r, dname, "has images of %llu x %llu pixels", (unsigned long long)dims[2],
                 (unsigned long long)dims[1]);
    if (rc == NBG_OK)
        rc = stored_plausibly(r, d, dname, (double)dims[0] * dims[1] * dims[2] * (double)H5Tget_size(t));
    if (rc == NBG_OK) {
        char desc[600];
        snprintf(desc, sizeof desc, "an image of %s (%llu x %llu pixels)", r->path, (unsigned long long)dims[2],
                 (unsigned long long)dims[1]);
        rc = nbgi_check_bytes(r->ctx, (double)dims[1] * dims[2] * sizeof(float), desc);
    }
    if (rc == NBG_OK) {
        *image = malloc((size_t)dims[1] * dims[2] * sizeof(float));
        if (*image == NULL)
            rc = nbgi_error(r->ctx, NBG_ENOMEM, "%s: out of memory for an image of %llu x %llu pixels", r->path,
                            (unsigned long long)dims[2], (unsigned long long)dims[1]);
    }
    if (rc == NBG_OK) {
        hsize_t start[3] = {(hsize_t)local, 0, 0}, count[3] = {1, dims[1], dims[2]};
        const hid_t mem = H5Screate_simple(2, count + 1, NULL);
        herr_t e = H5Sselect_hyperslab(sp, H5S_SELECT_SET, rank == 3 ? start : start + 1, NULL,
                                       rank == 3 ? count : count + 1, NULL);
        if (e >= 0)
            e = H5Dread(d, H5T_NATIVE_FLOAT, mem, sp, H5P_DEFAULT, *image);
        H5Sclose(mem);
        if (e < 0) {
            char f[200];
            missing_filter(d, f, sizeof f);
            if (f[0] != '\0')
                rc = nbgi_error(r->ctx, NBG_EUNSUP,
                                "%s: %s: the data are compressed with %s, which this HDF5 cannot load (install its "
                                "plugin, e.g. Debian's hdf5-filter-plugin, or set HDF5_PLUGIN_PATH)",
                                r->path, dname, f);
            else
                rc = bad(r, dname, "frame %d cannot be read (truncated or corrupt file?)", local);
        }
    }
    if (rc != NBG_OK) {
        free(*image);
        *image = NULL;
    } else {
        *spixels = (int)dims[1];
        *fpixels = (int)dims[2];
    }
    H5Tclose(t);
    H5Sclose(sp);
    return rc;
}

/* The module's data_origin and data_size must describe the whole image (one module). */
static int check_module(rd *r, const char *module, int spixels, int fpixels)
{
    const char *fields[2] = {"data_origin", "data_size"};
    for (int k = 0; k < 2; ++k) {
        char nm[600];
        pjoin(nm, sizeof nm, module, fields[k]);
        if (!exists(r->file, nm)) {
            if (k == 0)
                continue; /* data_origin defaults to 0, 0 */
            return bad(r, nm, "is missing");
        }
        const hid_t d = H5Dopen2(r->file, nm, H5P_DEFAULT);
        if (d < 0)
            return bad(r, nm, "cannot be opened");
        double *v = NULL;
        size_t n = 0;
        int rc = read_dbl_ds(r, d, nm, &v, &n);
        H5Dclose(d);
        if (rc == NBG_OK && n != 2)
            rc = bad(r, nm, "has %zu values, not 2 (slow, fast)", n);
        if (rc == NBG_OK && k == 0 && (v[0] != 0 || v[1] != 0))
            rc = bad(r, nm, "is (%g, %g): a module that is part of the image is not supported", v[0], v[1]);
        if (rc == NBG_OK && k == 1 && (v[0] != spixels || v[1] != fpixels))
            rc = bad(r, nm, "is (%g, %g) but the images are %d x %d (slow, fast)", v[0], v[1], spixels, fpixels);
        free(v);
        if (rc != NBG_OK)
            return rc;
    }
    return NBG_OK;
}

/* The panel from the module: dxtbx's flat-detector rule (nexus/__init__.py get_dxtbx_detector). */
static int read_panel(rd *r, const char *module, nbg_geometry *g)
{
    const char *dirs[2] = {"fast_pixel_direction", "slow_pixel_direction"};
    for (int k = 0; k < 2; ++k) {
        char nm[600];
        pjoin(nm, sizeof nm, module, dirs[k]);
        axis_t pd;
        int rc = read_axis(r, nm, &pd);
        if (rc == NBG_OK && pd.rotation != 0)
            rc = bad(r, nm, "is not a translation");
        if (rc == NBG_OK && !(pd.values[0] > 0 && pd.values[0] < 1e3))
            rc = bad(r, nm, "gives the pixel size %g mm", pd.values[0]);
        axis_t chain[MAX_CHAIN];
        int n = 0;
        if (rc == NBG_OK && pd.depends_on[0] != '\0')
            rc = read_chain(r, pd.depends_on, chain, &n);
        if (rc == NBG_OK) {
            /* cumulative T_n ... T_1 of the chain: its rotations turn the direction, its translation is the
             * origin (the pixel direction's own offset is not used, as in dxtbx) */
            xform all, rot;
            xf_identity(&all);
            xf_identity(&rot);
            for (int i = n - 1; i >= 0; --i) {
                xf_mul(&all, &chain[i].x);
                if (chain[i].rotation == 1) {
                    xform ro = chain[i].x;
                    memset(ro.t, 0, sizeof ro.t);
                    xf_mul(&rot, &ro);
                }
            }
            const double len = nbgi_norm(pd.vector);
            const double u[3] = {pd.vector[0] / len, pd.vector[1] / len, pd.vector[2] / len};
            double v[3];
            mat_vec(rot.R, u, v);
            flip(v, k == 0 ? g->fast : g->slow);
            if (k == 0) {
                g->pixel_f = pd.values[0];
                flip(all.t, g->origin);
            } else {
                g->pixel_s = pd.values[0];
            }
        }
        free_chain(chain, n);
        free(pd.values);
        if (rc != NBG_OK)
            return rc;
    }
    if (fabs(nbgi_dot(g->fast, g->slow)) > 1e-6)
        return bad(r, module, "the fast and slow pixel directions are not orthogonal (cos %g)",
                   nbgi_dot(g->fast, g->slow));
    return NBG_OK;
}

/* A detector of nmod modules on one stacked dataset of rows x cols (the frame in *image, the mask in *mask when
 * there is one): every module's slab (data_origin, data_size) gathered into the concatenation of the modules in
 * name order, as nbgrad's panels are, and each module's panel; g receives module 0's detector. */
static int read_modules(rd *r, const char *det, int nmod, int rows, int cols, float **image, size_t *npix,
                        uint8_t **mask, nbg_geometry *g, nbg_panel **panels)
{
    if (nmod > 1000000)
        return bad(r, det, "has %d modules, too many", nmod);
    nbg_panel *pp = calloc((size_t)nmod, sizeof *pp);
    int (*slab)[4] = calloc((size_t)nmod, sizeof *slab);
    if (pp == NULL || slab == NULL) {
        free(pp);
        free(slab);
        return nbgi_error(r->ctx, NBG_ENOMEM, "out of memory for the %d modules of %s", nmod, r->path);
    }
    int rc = NBG_OK;
    size_t total = 0;
    for (int k = 0; k < nmod && rc == NBG_OK; ++k) {
        char module[1200], nm[1300];
        int n = 0;
        rc = find_class_nth(r, det, "NXdetector_module", k, module, sizeof module, &n);
        for (int f = 0; f < 2 && rc == NBG_OK; ++f) {
            pjoin(nm, sizeof nm, module, f == 0 ? "data_origin" : "data_size");
            double *v = NULL;
            size_t nv = 0;
            if (!exists(r->file, nm)) {
                rc = bad(r, nm, "is missing (a detector of several modules needs each one's slab of the data)");
                break;
            }
            const hid_t d = H5Dopen2(r->file, nm, H5P_DEFAULT);
            rc = d < 0 ? bad(r, nm, "cannot be opened") : read_dbl_ds(r, d, nm, &v, &nv);
            if (d >= 0)
                H5Dclose(d);
            if (rc == NBG_OK && nv != 2)
                rc = bad(r, nm, "has %zu values, not 2 (slow, fast)", nv);
            if (rc == NBG_OK && (!(v[0] >= 0 && v[0] <= rows) || !(v[1] >= 0 && v[1] <= cols) || v[0] != floor(v[0]) ||
                                 v[1] != floor(v[1])))
                rc = bad(r, nm, "is (%g, %g), outside the %d x %d data (slow, fast)", v[0], v[1], rows, cols);
            if (rc == NBG_OK) {
                slab[k][2 * f] = (int)v[0];
                slab[k][2 * f + 1] = (int)v[1];
            }
            free(v);
        }
        if (rc == NBG_OK && (slab[k][2] < 1 || slab[k][3] < 1 || slab[k][0] + slab[k][2] > rows ||
                             slab[k][1] + slab[k][3] > cols))
            rc = bad(r, module, "'s slab (origin %d, %d, size %d, %d) does not fit the %d x %d data", slab[k][0],
                     slab[k][1], slab[k][2], slab[k][3], rows, cols);
        nbg_geometry gk = *g;
        if (rc == NBG_OK)
            rc = read_panel(r, module, &gk);
        if (rc == NBG_OK && panels != NULL && gk.pixel_f != gk.pixel_s)
            rc = nbgi_error(r->ctx, NBG_EUNSUP, "%s: %s: pixels of %g x %g mm (nbgrad's panels have square pixels)",
                            r->path, module, gk.pixel_f, gk.pixel_s);
        if (rc != NBG_OK)
            break;
        if (k == 0) {
            *g = gk;
            g->fpixels = slab[k][3];
            g->spixels = slab[k][2];
        }
        nbg_panel *q = &pp[k];
        q->fpixels = slab[k][3];
        q->spixels = slab[k][2];
        q->pixel = gk.pixel_f;
        memcpy(q->fast, gk.fast, sizeof q->fast);
        memcpy(q->slow, gk.slow, sizeof q->slow);
        memcpy(q->origin, gk.origin, sizeof q->origin);
        const hid_t m = H5Gopen2(r->file, module, H5P_DEFAULT);
        char name[64] = "";
        if (m >= 0 && H5Aexists(m, "nbgrad_panel_name") > 0)
            rc = read_str(r, m, "nbgrad_panel_name", module, name, sizeof name);
        if (m >= 0)
            H5Gclose(m);
        const char *base = strrchr(module, '/');
        snprintf(q->name, sizeof q->name, "%.31s", name[0] != '\0' ? name : base != NULL ? base + 1 : module);
        total += (size_t)q->fpixels * q->spixels;
    }
    float *img = NULL;
    uint8_t *mk = NULL;
    if (rc == NBG_OK) {
        char what[700];
        snprintf(what, sizeof what, "the %d modules of %s", nmod, r->path);
        rc = nbgi_check_bytes(r->ctx, 5.0 * (double)total, what);
    }
    if (rc == NBG_OK && ((img = malloc(total * sizeof *img)) == NULL ||
                         (mask != NULL && *mask != NULL && (mk = malloc(total)) == NULL)))
        rc = nbgi_error(r->ctx, NBG_ENOMEM, "out of memory for the %d modules of %s", nmod, r->path);
    if (rc == NBG_OK) {
        size_t o = 0;
        for (int k = 0; k < nmod; ++k) {
            for (int j = 0; j < slab[k][2]; ++j) {
                const size_t from = (size_t)(slab[k][0] + j) * (size_t)cols + (size_t)slab[k][1];
                memcpy(img + o, *image + from, (size_t)slab[k][3] * sizeof *img);
                if (mk != NULL)
                    memcpy(mk + o, *mask + from, (size_t)slab[k][3]);
                o += (size_t)slab[k][3];
            }
        }
        free(*image);
        *image = img;
        *npix = total;
        if (mk != NULL) {
            free(*mask);
            *mask = mk;
        }
        if (panels != NULL) {
            *panels = pp;
            pp = NULL;
        }
    } else {
        free(img);
        free(mk);
    }
    free(pp);
    free(slab);
    return rc;
}

/* A chain of more than one axis, every one a rotation (a kappa, a SmarGon): kept whole in g->goniometer as dxtbx's
 * MultiAxisGoniometer has it (innermost first, each axis's name the last part of its path, its angle the first
 * frame's; the vectors in DIALS's frame).  A chain with a translation or an axis nbgrad cannot hold is left folded
 * into g->axis alone, as before. */
static void multi_axis(const axis_t *chain, int n, int scan, nbg_geometry *g)
{
    if (n < 2 || n > NBG_GONIO_MAX_AXES)
        return;
    nbg_goniometer gn;
    memset(&gn, 0, sizeof gn);
    gn.naxes = n;
    gn.scan_axis = scan;
    for (int i = 0; i < n; ++i) {
        const axis_t *a = &chain[i];
        if (a->rotation != 1 || a->nvalues < 1 || !(fabs(a->values[0]) <= 1e6))
            return;
        double v[3];
        flip(a->vector, v);
        const char *slash = strrchr(a->name, '/');
        nbgi_goniometer_set_axis(&gn, i, v, a->values[0], slash != NULL ? slash + 1 : a->name);
    }
    if (nbg_goniometer_derive(NULL, &gn, "") == NBG_OK)
        g->goniometer = gn;
}

/* The goniometer: the scan axis is the first rotation of the sample's chain whose angle varies (else the first
 * rotation); the axes below it in the chain (towards the base) turn it into the laboratory at their first angle. */
static int read_goniometer(rd *r, const char *sample, nbg_geometry *g)
{
    char nm[600], dep[512], start[512];
    pjoin(nm, sizeof nm, sample, "depends_on");
    if (!exists(r->file, nm))
        return NBG_OK; /* stills: no goniometer */
    int rc = read_str_ds(r, r->file, nm, nm, dep, sizeof dep);
    if (rc != NBG_OK)
        return rc;
    if (dep[0] == '\0' || strcmp(dep, ".") == 0)
        return NBG_OK;
    resolve(nm, dep, start, sizeof start);
    axis_t chain[MAX_CHAIN];
    int n = 0, scan = -1;
    rc = read_chain(r, start, chain, &n);
    for (int i = 0; rc == NBG_OK && i < n && scan < 0; ++i) {
        if (chain[i].rotation == 1 && chain[i].nvalues > 1) {
            for (size_t j = 1; j < chain[i].nvalues; ++j) {
                if (chain[i].values[j] != chain[i].values[0])
                    scan = i;
            }
        }
    }
    for (int i = 0; rc == NBG_OK && i < n && scan < 0; ++i) {
        /* one frame: the rotation whose width the file gives (a nonzero _increment_set, as the writer gives the
         * scan axis) */
        char aux[600];
        double w = 0;
        int found = 0;
        snprintf(aux, sizeof aux, "%.511s_increment_set", chain[i].name);
        if (chain[i].rotation == 1 && exists(r->file, aux) &&
            read_scalar(r, r->file, aux, aux, U_ANGLE, "deg", &w, &found) == NBG_OK && found && w != 0)
            scan = i; /* (one that cannot be read is passed over, as before) */
    }
    for (int i = 0; rc == NBG_OK && i < n && scan < 0; ++i) {
        if (chain[i].rotation == 1)
            scan = i;
    }
    if (rc == NBG_OK && scan >= 0) {
        axis_t *a = &chain[scan];
        xform base;
        xf_identity(&base);
        for (int i = n - 1; i > scan; --i) {
            if (chain[i].rotation == 1)
                xf_mul(&base, &chain[i].x);
        }
        const double len = nbgi_norm(a->vector);
        const double u[3] = {a->vector[0] / len, a->vector[1] / len, a->vector[2] / len};
        double v[3];
        mat_vec(base.R, u, v);
        flip(v, g->axis);
        g->scan_start = a->values[0];
        /* the width: _increment_set, else _end - start, else the step between the first two frames */
        char aux[600];
        double w = NAN, e = NAN;
        int found = 0;
        snprintf(aux, sizeof aux, "%s_increment_set", a->name);
        rc = read_scalar(r, r->file, aux, aux, U_ANGLE, "deg", &w, &found);
        if (rc == NBG_OK && !found) {
            snprintf(aux, sizeof aux, "%s_end", a->name);
            rc = read_scalar(r, r->file, aux, aux, U_ANGLE, "deg", &e, &found);
            if (found)
                w = e - a->values[0];
            else if (a->nvalues > 1)
                w = a->values[1] - a->values[0];
            else
                w = 0;
        }
        g->scan_width = w;
        g->scan_stated = 2;
        if (rc == NBG_OK)
            multi_axis(chain, n, scan, g);
    }
    free_chain(chain, n);
    return rc;
}

/* Stokes parameters back to dxtbx's polarization normal and fraction (see the writer); the normal's sign, which
 * the parameters do not carry, is chosen with a positive y (else x) component. */
static int read_polarization(rd *r, const char *beam, nbg_geometry *g)
{
    char nm[600];
    pjoin(nm, sizeof nm, beam, "incident_polarisation_stokes");
    if (!exists(r->file, nm))
        return NBG_OK;
    const hid_t d = H5Dopen2(r->file, nm, H5P_DEFAULT);
    if (d < 0)
        return bad(r, nm, "cannot be opened");
    double *v = NULL;
    size_t n = 0;
    int rc = read_dbl_ds(r, d, nm, &v, &n);
    H5Dclose(d);
    if (rc == NBG_OK && (n < 4 || n % 4 != 0))
        rc = bad(r, nm, "has %zu values, not 4 (I, Q, U, V) per frame", n);
    if (rc == NBG_OK && !(v[0] > 0))
        rc = bad(r, nm, "has the intensity %g", v[0]);
    if (rc == NBG_OK) {
        const double p = sqrt(v[1] * v[1] + v[2] * v[2]) / v[0], psi = 0.5 * atan2(v[2], v[1]);
        if (p > 1 + 1e-9) {
            rc = bad(r, nm, "has a degree of polarization %g > 1", p);
        } else {
            const double em[3] = {cos(psi), sin(psi), 0};
            double e[3], nrm[3];
            flip(em, e);
            nbgi_cross(g->direction, e, nrm);
            if (nrm[1] < -1e-12 || (fabs(nrm[1]) <= 1e-12 && nrm[0] < 0))
                nrm[0] = -nrm[0], nrm[1] = -nrm[1], nrm[2] = -nrm[2];
            memcpy(g->polarization_normal, nrm, sizeof nrm);
            g->polarization_fraction = 0.5 * (1 + fmin(p, 1));
        }
    }
    free(v);
    return rc;
}

/* The detector's scalars: sensor, saturation, exposure, nbgrad's own values. */
static int read_detector(rd *r, const char *det, nbg_geometry *g)
{
    char nm[600];
    int found = 0, rc;
    pjoin(nm, sizeof nm, det, "sensor_material");
    if (exists(r->file, nm)) {
        rc = read_str_ds(r, r->file, nm, nm, g->material, sizeof g->material);
        if (rc != NBG_OK)
            return rc;
    }
    pjoin(nm, sizeof nm, det, "sensor_thickness");
    if ((rc = read_scalar(r, r->file, nm, nm, U_LENGTH, NULL, &g->thickness, &found)) != NBG_OK)
        return rc;
    if (found && !(g->thickness >= 0 && g->thickness < 1e3))
        return bad(r, nm, "is %g mm", g->thickness);
    pjoin(nm, sizeof nm, det, "saturation_value");
    if ((rc = read_scalar(r, r->file, nm, nm, -1, NULL, &g->saturation, &found)) != NBG_OK)
        return rc;
    pjoin(nm, sizeof nm, det, "count_time");
    if ((rc = read_scalar(r, r->file, nm, nm, U_TIME, "s", &g->exposure, &found)) != NBG_OK)
        return rc;
    if (!found) {
        pjoin(nm, sizeof nm, det, "frame_time");
        if ((rc = read_scalar(r, r->file, nm, nm, U_TIME, "s", &g->exposure, &found)) != NBG_OK)
            return rc;
    }
    if (!(g->exposure >= 0))
        return bad(r, nm, "is %g s", g->exposure);
    const hid_t d = H5Gopen2(r->file, det, H5P_DEFAULT);
    if (d < 0)
        return bad(r, det, "cannot be opened");
    double unknown = 0;
    rc = read_attr_dbl(r, d, "nbgrad_pedestal", det, &g->pedestal, 1, &found);
    if (rc == NBG_OK)
        rc = read_attr_dbl(r, d, "nbgrad_gain", det, &g->gain, 1, &found);
    if (rc == NBG_OK && !(g->gain > 0))
        rc = bad(r, det, "the attribute nbgrad_gain is %g", g->gain);
    if (rc == NBG_OK)
        rc = read_attr_dbl(r, d, "nbgrad_mu", det, &g->mu, 1, &found);
    if (rc == NBG_OK && !(g->mu >= 0))
        rc = bad(r, det, "the attribute nbgrad_mu is %g", g->mu);
    if (rc == NBG_OK)
        rc = read_attr_dbl(r, d, "nbgrad_material_unknown", det, &unknown, 1, &found);
    if (rc == NBG_OK && found && unknown != 0)
        g->material[0] = '\0';
    if (rc == NBG_OK)
        rc = read_attr_dbl(r, d, "nbgrad_no_thickness", det, &unknown, 1, &found);
    if (rc == NBG_OK && found && unknown != 0)
        g->thickness = 0;
    double sm = 0, sl = 0;
    int fm = 0, fl = 0;
    if (rc == NBG_OK)
        rc = read_attr_dbl(r, d, "nbgrad_sensor_model", det, &sm, 1, &fm);
    if (rc == NBG_OK)
        rc = read_attr_dbl(r, d, "nbgrad_sensor_layers", det, &sl, 1, &fl);
    if (rc == NBG_OK && fm && !(sm == NBG_SENSOR_NANOBRAGG || sm == NBG_SENSOR_PHYSICAL))
        rc = bad(r, det, "the attribute nbgrad_sensor_model is %g (%d nanoBragg's, %d physical)", sm,
                 NBG_SENSOR_NANOBRAGG, NBG_SENSOR_PHYSICAL);
    if (rc == NBG_OK && fl && !(sl >= 1 && sl <= 1000000 && sl == floor(sl)))
        rc = bad(r, det, "the attribute nbgrad_sensor_layers is %g (an integer from 1 to 1000000)", sl);
    if (rc == NBG_OK && fm)
        g->sensor_model = (int)sm;
    if (rc == NBG_OK && fl)
        g->sensor_layers = (int)sl;
    H5Gclose(d);
    return rc;
}

/* The pixel mask (2-D, or one per frame): nonzero = bad. */
static int read_mask(rd *r, const char *det, int frame, int spixels, int fpixels, uint8_t **mask)
{
    char nm[600];
    *mask = NULL;
    pjoin(nm, sizeof nm, det, "pixel_mask");
    if (!exists(r->file, nm))
        return NBG_OK;
    const hid_t d = H5Dopen2(r->file, nm, H5P_DEFAULT);
    if (d < 0)
        return bad(r, nm, "cannot be opened");
    const hid_t sp = H5Dget_space(d), t = H5Dget_type(d);
    const int rank = H5Sget_simple_extent_ndims(sp);
    hsize_t dims[3] = {1, 0, 0};
    if (rank == 2 || rank == 3)
        H5Sget_simple_extent_dims(sp, rank == 3 ? dims : dims + 1, NULL);
    int rc = NBG_OK;
    uint32_t *m = NULL;
    if (H5Tget_class(t) != H5T_INTEGER)
        rc = bad(r, nm, "is not an integer field");
    else if (rank != 2 && rank != 3)
        rc = bad(r, nm, "has rank %d, not 2", rank);
    else if (dims[1] != (hsize_t)spixels || dims[2] != (hsize_t)fpixels)
        rc = bad(r, nm, "is %llu x %llu but the images are %d x %d", (unsigned long long)dims[2],
                 (unsigned long long)dims[1], fpixels, spixels);
    else if (rank == 3 && (hsize_t)frame >= dims[0])
        rc = bad(r, nm, "has %llu frames, not frame %d", (unsigned long long)dims[0], frame);
    const size_t n = (size_t)spixels * fpixels;
    if (rc == NBG_OK) {
        char desc[600];
        snprintf(desc, sizeof desc, "the pixel mask of %s", r->path);
        rc = nbgi_check_bytes(r->ctx, (double)n * 5, desc);
    }
    if (rc == NBG_OK) {
        m = malloc(n * sizeof *m);
        *mask = malloc(n);
        if (m == NULL || *mask == NULL)
            rc = nbgi_error(r->ctx, NBG_ENOMEM, "%s: out of memory for the pixel mask", r->path);
    }
    if (rc == NBG_OK) {
        hsize_t start[3] = {(hsize_t)(rank == 3 ? frame : 0), 0, 0}, count[3] = {1, dims[1], dims[2]};
        const hid_t mem = H5Screate_simple(2, count + 1, NULL);
        herr_t e = H5Sselect_hyperslab(sp, H5S_SELECT_SET, rank == 3 ? start : start + 1, NULL,
                                       rank == 3 ? count : count + 1, NULL);
        if (e >= 0)
            e = H5Dread(d, H5T_NATIVE_UINT32, mem, sp, H5P_DEFAULT, m);
        H5Sclose(mem);
        if (e < 0)
            rc = bad(r, nm, "cannot be read (truncated or corrupt file?)");
    }
    if (rc == NBG_OK) {
        for (size_t i = 0; i < n; ++i)
            (*mask)[i] = m[i] != 0;
    } else {
        free(*mask);
        *mask = NULL;
    }
    free(m);
    H5Tclose(t);
    H5Sclose(sp);
    H5Dclose(d);
    return rc;
}

/* Everything once the file is open. */
static int read_file(rd *r, int frame, float **image, size_t *npix, nbg_geometry *g, uint8_t **mask,
                     nbg_panel **panels, int *npanels)
{
    char entry[300], data[600], inst[600], det[900], module[1200], beam[900], sample[600], dname[700];
    int n = 0, rc;
    /* the NXentry: the first whose definition is NXmx, else the first */
    if ((rc = find_class(r, "/", "NXentry", entry, sizeof entry, &n)) != NBG_OK)
        return rc;
    if (n == 0) {
        if (!exists(r->file, "/entry"))
            return bad(r, "/", "has no NXentry group (not a NeXus file?)");
        snprintf(entry, sizeof entry, "/entry");
    }
    if ((rc = find_class(r, entry, "NXdata", data, sizeof data, &n)) != NBG_OK)
        return rc;
    if (n == 0)
        pjoin(data, sizeof data, entry, "data");
    if (!exists(r->file, data))
        return bad(r, data, "is missing (no NXdata group)");
    hid_t d = -1;
    int local = 0, spixels = 0, fpixels = 0;
    long long total = 0;
    if ((rc = open_frames(r, data, frame, &d, dname, sizeof dname, &local, &total)) != NBG_OK)
        return rc;
    rc = read_frame(r, d, dname, local, &spixels, &fpixels, image);
    H5Dclose(d);
    if (rc != NBG_OK)
        return rc;
    *npix = (size_t)spixels * fpixels;
    if (g == NULL && mask == NULL && npanels == NULL)
        return NBG_OK;
    nbg_geometry lg;
    if (g == NULL)
        g = &lg; /* a detector of several modules needs its geometry to gather the image */

    /* the instrument, its detector and the detector's one module */
    det[0] = '\0';
    rc = find_class(r, entry, "NXinstrument", inst, sizeof inst, &n);
    if (rc == NBG_OK && n == 0)
        rc = bad(r, entry, "has no NXinstrument group");
    if (rc == NBG_OK)
        rc = find_class(r, inst, "NXdetector", det, sizeof det, &n);
    if (rc == NBG_OK && n == 0)
        rc = bad(r, inst, "has no NXdetector group");
    if (rc == NBG_OK && n > 1)
        rc = nbgi_error(r->ctx, NBG_EUNSUP, "%s: %s: %d detectors (NXdetector): only one is supported", r->path,
                        inst, n);
    if (rc == NBG_OK && mask != NULL)
        rc = read_mask(r, det, frame, spixels, fpixels, mask);
    if (rc != NBG_OK)
        goto done;

    nbgi_geometry_init(g);
    g->fpixels = fpixels;
    g->spixels = spixels;
    g->nframes = total > 100000000 ? 100000000 : (int)total;
    rc = find_class(r, det, "NXdetector_module", module, sizeof module, &n);
    if (rc == NBG_OK && n == 0)
        rc = bad(r, det, "has no NXdetector_module group");
    if (rc == NBG_OK && n > 1) {
        /* several modules: the image is their concatenation, g module 0's detector */
        rc = read_modules(r, det, n, spixels, fpixels, image, npix, mask, g, panels);
    } else {
        if (rc == NBG_OK)
            rc = check_module(r, module, spixels, fpixels);
        if (rc == NBG_OK)
            rc = read_panel(r, module, g);
        if (rc == NBG_OK && panels != NULL) {
            if (g->pixel_f != g->pixel_s)
                rc = nbgi_error(r->ctx, NBG_EUNSUP, "%s: pixels of %g x %g mm (nbgrad's panels have square pixels)",
                                r->path, g->pixel_f, g->pixel_s);
            else if ((*panels = calloc(1, sizeof **panels)) == NULL)
                rc = nbgi_error(r->ctx, NBG_ENOMEM, "out of memory");
            if (rc == NBG_OK) {
                nbg_panel *q = *panels;
                q->fpixels = fpixels;
                q->spixels = spixels;
                q->pixel = g->pixel_f;
                memcpy(q->fast, g->fast, sizeof q->fast);
                memcpy(q->slow, g->slow, sizeof q->slow);
                memcpy(q->origin, g->origin, sizeof q->origin);
                snprintf(q->name, sizeof q->name, "module");
            }
        }
    }
    if (npanels != NULL)
        *npanels = n;
    if (rc == NBG_OK)
        rc = read_detector(r, det, g);
    if (rc == NBG_OK)
        rc = find_class(r, inst, "NXbeam", beam, sizeof beam, &n);
    if (rc == NBG_OK && n == 0)
        rc = bad(r, inst, "has no NXbeam group");
    if (rc == NBG_OK) {
        char nm[1000];
        pjoin(nm, sizeof nm, beam, "incident_wavelength");
        rc = read_scalar(r, r->file, nm, nm, U_LENGTH, NULL, &g->wavelength, NULL);
        g->wavelength *= 1e7; /* mm -> Angstrom */
        if (rc == NBG_OK && !(g->wavelength > 1e-4 && g->wavelength < 1e4))
            rc = bad(r, nm, "gives the wavelength %g A", g->wavelength);
    }
    if (rc == NBG_OK)
        rc = read_polarization(r, beam, g);
    if (rc == NBG_OK)
        rc = find_class(r, entry, "NXsample", sample, sizeof sample, &n);
    if (rc == NBG_OK && n > 0)
        rc = read_goniometer(r, sample, g);
done:
    if (rc != NBG_OK) {
        free(*image);
        *image = NULL;
        *npix = 0;
        if (mask != NULL) {
            free(*mask);
            *mask = NULL;
        }
        if (panels != NULL) {
            free(*panels);
            *panels = NULL;
        }
    }
    return rc;
}

static int read_nxmx(nbg_ctx *ctx, const char *path, int frame, float **image, size_t *npix, nbg_geometry *g,
                     uint8_t **mask, nbg_panel **panels, int *npanels)
{
    if (image == NULL || npix == NULL || path == NULL)
        return nbgi_error(ctx, NBG_EINVAL, "nbgi_read_nxmx: no %s", path == NULL ? "file name" : "output");
    *image = NULL;
    *npix = 0;
    if (mask != NULL)
        *mask = NULL;
    if (frame < 0)
        return nbgi_error(ctx, NBG_EINVAL, "%s: frame %d is out of range", path, frame);
    H5Eset_auto2(H5E_DEFAULT, NULL, NULL);
    struct stat st;
    if (stat(path, &st) != 0)
        return nbgi_error(ctx, NBG_EIO, "cannot open %s: %s", path, strerror(errno));
    if (!S_ISREG(st.st_mode)) /* HDF5 would search a device such as /dev/zero for its signature */
        return nbgi_error(ctx, NBG_EIO, "cannot read %s: not a regular file", path);
    const htri_t is = H5Fis_hdf5(path);
    if (is <= 0)
        return nbgi_error(ctx, NBG_EFORMAT, "%s is not an HDF5 file", path);
    rd r = {ctx, path, -1};
    r.file = H5Fopen(path, H5F_ACC_RDONLY, H5P_DEFAULT);
    if (r.file < 0)
        return nbgi_error(ctx, NBG_EFORMAT, "%s: HDF5 cannot open it (a truncated or corrupt file?)", path);
    const int rc = read_file(&r, frame, image, npix, g, mask, panels, npanels);
    H5Fclose(r.file);
    return rc;
}

int nbgi_read_nxmx_modules(nbg_ctx *ctx, const char *path, int frame, float **image, size_t *npix,
                           nbg_geometry *g, uint8_t **mask, int *nmodules)
{
    return read_nxmx(ctx, path, frame, image, npix, g, mask, NULL, nmodules);
}

int nbgi_read_nxmx(nbg_ctx *ctx, const char *path, int frame, float **image, size_t *npix, nbg_geometry *g,
                   uint8_t **mask)
{
    return read_nxmx(ctx, path, frame, image, npix, g, mask, NULL, NULL);
}

int nbg_read_nxmx_panels(nbg_ctx *ctx, const char *path, nbg_geometry *g, nbg_panel **panels, int *npanels)
{
    if (g == NULL || panels == NULL || npanels == NULL)
        return nbgi_error(ctx, NBG_EINVAL, "nbg_read_nxmx_panels: NULL argument");
    *panels = NULL;
    *npanels = 0;
    float *img = NULL;
    size_t n = 0;
    nbg_geometry lg;
    nbgi_geometry_init(&lg);
    int np = 0;
    const int rc = read_nxmx(ctx, path, 0, &img, &n, &lg, NULL, panels, &np);
    free(img);
    if (rc == NBG_OK) {
        *g = lg;
        *npanels = np;
        /* the levels: the detector, its modules (the panels' groups), the panels */
        for (int k = 0; k < np; ++k) {
            int *lv = (*panels)[k].level_group;
            lv[0] = 0;
            lv[1] = (*panels)[k].group;
            lv[2] = k;
            for (int l = 3; l < NBG_PANEL_LEVELS; ++l)
                lv[l] = -1;
        }
    }
    return rc;
}

#else /* !NBG_HAVE_FORMATS */

int nbgi_write_nxmx_set(nbg_ctx *ctx, nbgi_outset *set, const char *path, const nbg_geometry *g, nbg_dtype dtype,
                        const void *frames, int nframes, const uint8_t *mask)
{
    return nbgi_error(ctx, NBG_EUNSUP, "cannot write %s: NeXus/NXmx needs HDF5, and nbgrad was built without HDF5 "
                      "(FORMATS=0)", path != NULL ? path : "(null)");
}

int nbg_write_nxmx(nbg_ctx *ctx, const char *path, const nbg_geometry *g, nbg_dtype dtype, const void *frames,
                   int nframes, const uint8_t *mask)
{
    return nbgi_write_nxmx_set(ctx, NULL, path, g, dtype, frames, nframes, mask);
}

int nbgi_write_nxmx_panels_set(nbg_ctx *ctx, nbgi_outset *set, const char *path, const nbg_geometry *g,
                               const nbg_panel *panels, int npanels, nbg_dtype dtype, const void *frames,
                               int nframes, const uint8_t *mask)
{
    (void)set, (void)g, (void)panels, (void)npanels, (void)dtype, (void)frames, (void)nframes, (void)mask;
    return nbgi_error(ctx, NBG_EUNSUP, "cannot write %s: NeXus/NXmx needs HDF5, and nbgrad was built without HDF5 "
                      "(FORMATS=0)", path != NULL ? path : "(null)");
}

int nbg_write_nxmx_panels(nbg_ctx *ctx, const char *path, const nbg_geometry *g, const nbg_panel *panels,
                          int npanels, nbg_dtype dtype, const void *frames, int nframes, const uint8_t *mask)
{
    return nbgi_write_nxmx_panels_set(ctx, NULL, path, g, panels, npanels, dtype, frames, nframes, mask);
}

int nbg_read_nxmx_panels(nbg_ctx *ctx, const char *path, nbg_geometry *g, nbg_panel **panels, int *npanels)
{
    (void)g, (void)panels, (void)npanels;
    return nbgi_error(ctx, NBG_EUNSUP, "cannot read %s: NeXus/NXmx needs HDF5, and nbgrad was built without HDF5 "
                      "(FORMATS=0)", path != NULL ? path : "(null)");
}

int nbgi_read_nxmx_modules(nbg_ctx *ctx, const char *path, int frame, float **image, size_t *npix,
                           nbg_geometry *g, uint8_t **mask, int *nmodules)
{
    (void)nmodules;
    return nbgi_read_nxmx(ctx, path, frame, image, npix, g, mask);
}

int nbgi_read_nxmx(nbg_ctx *ctx, const char *path, int frame, float **image, size_t *npix, nbg_geometry *g,
                   uint8_t **mask)
{
    if (image != NULL)
        *image = NULL;
    if (npix != NULL)
        *npix = 0;
    if (mask != NULL)
        *mask = NULL;
    return nbgi_error(ctx, NBG_EUNSUP, "cannot read %s: NeXus/NXmx needs HDF5, and nbgrad was built without HDF5 "
                      "(FORMATS=0)", path != NULL ? path : "(null)");
}

#endif
