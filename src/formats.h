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

#include <sys/types.h>

/* Sets g to the defaults: no detector (0 pixels), beam along -z (direction (0,0,1)), wavelength NAN, rotation
 * axis (1,0,0), one frame of 0 width at 0, exposure 1 s, gain 1, pedestal 0, saturation NAN, unpolarized, no
 * crystal, space group " P 1". */
void nbgi_geometry_init(nbg_geometry *g);

/* Checks what every writer and nbg_experiment_from_geometry need of g (finite values, unit axes, pixel counts);
 * NBG_EINVAL naming the field otherwise.  what names the caller for the message ("writing x.nxs"). */
int nbgi_geometry_check(nbg_ctx *ctx, const nbg_geometry *g, const char *what);
/* The crystal of real-space vectors a, b, c (rows, A) into e as nbg_experiment_from_geometry sets it: a cell and
 * misset angles, or (when nbgrad's cell construction cannot give the basis: a left-handed one) the A matrix at
 * wavelength. */
void nbgi_crystal_from_vectors(nbg_ctx *ctx, const double real_space[9], double wavelength, nbg_experiment *e);
/* A multi-axis goniometer's fold (gn derived by nbg_goniometer_derive), the one the list's reader and writer share:
 * its scan axis in the laboratory, S unit(axes[scan_axis]); real-space rows in into the laboratory, S F in; and
 * back, (S F)^T in; and the whole goniometer turned with the laboratory by the rotation R (its axes and crystal,
 * F and S derived again: R F R^T, R S R^T). */
/* 3x3 row-major products: out = a b, out = m v (out may alias an input). */
void nbgi_mat3_mul(const double a[9], const double b[9], double out[9]);
void nbgi_mat3_vec(const double m[9], const double v[3], double out[3]);
void nbgi_goniometer_axis(const nbg_goniometer *gn, double axis[3]);
void nbgi_goniometer_fold(const nbg_goniometer *gn, const double in[9], double out[9]);
void nbgi_goniometer_unfold(const nbg_goniometer *gn, const double in[9], double out[9]);
void nbgi_goniometer_turn(nbg_goniometer *gn, const double R[9]);
/* The goniometer a writer writes for g (g->goniometer, naxes > 0, checked by nbgi_geometry_check): derived, its scan
 * axis as g has it unless g's laboratory axis moved (a refined spindle: then S^T axis, in unit length), so that S
 * unit(axes[scan_axis]) is g->axis.  The experiment list's, NXmx's and CBF's writers share it. */
void nbgi_goniometer_written(const nbg_geometry *g, nbg_goniometer *gn);
/* Axis i of gn from a file: vector v as given when within 1 % of unit length (nbg_goniometer_derive's tolerance),
 * else normalised; its angle (deg) and name (cut to 31 characters).  The NXmx and CBF readers share it. */
void nbgi_goniometer_set_axis(nbg_goniometer *gn, int i, const double v[3], double angle, const char *name);
/* The name axis i of gn is written under in an NXmx group or a CBF axis category: its own when it is 1 to 31
 * letters, digits, '_' or '-', no other axis has it (ignoring case) and it is none of reserved (NULL-terminated,
 * ignoring case); else GONIOMETER_AXIS_<i+1>. */
void nbgi_goniometer_name(const nbg_goniometer *gn, int i, const char *const *reserved, char out[32]);
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

/* nbg_read_refl on the file's bytes (buf, len; path names it in messages): the fuzz harness's way in. */
int nbgi_refl_parse(nbg_ctx *ctx, const char *path, const unsigned char *buf, size_t len, nbg_reflections *out);

/* 1 when a file of format ("cbf", "smv") whose geometry g the reader filled (its detector name and size) is of a
 * detector whose modules nbgrad cannot place from the file (a Pilatus 12M miniCBF, a TimePix_SU quad's SMV: the
 * header describes one flat panel, dxtbx places the modules from tables of its own), with msg (size bytes, may be
 * NULL) the refusal naming path, the detector and what to do (import it with DIALS and pass the list with the
 * image); 0 otherwise. */
int nbgi_unplaced_detector(const char *format, const nbg_geometry *g, const char *path, char *msg, size_t size);

/* --- the format registry (src/imagefile.c) ------------------------------------------------------------------
 * One row per image or experiment format nbgrad reads or writes: its name, how a file of it is recognised from its
 * first bytes, its reader (behind nbg_read_image) and its writer (behind the program's output flags, src/outputs.def),
 * what the writer carries, and whether a file holds several frames.  A format nbgrad cannot read (PGM, experiment
 * lists as images) or write has NULL there and says why in note. */

/* What a writer carries (a bit each). */
enum {
    NBGI_CARRY_PHOTONS = 1,  /* the image in photons, as floats */
    NBGI_CARRY_COUNTS = 2,   /* integer counts: the photons scaled (-scale) plus the pedestal (-adc), rounded */
    NBGI_CARRY_NOISE = 4,    /* integer counts with Poisson noise */
    NBGI_CARRY_SCALED = 8,   /* an 8-bit picture (scaled for the eye, clipped) */
    NBGI_CARRY_GEOMETRY = 16, /* the experiment's geometry (beam, detector, goniometer, scan; a list the crystal) */
    NBGI_CARRY_DATA = 32     /* (an output's, src/outputs.def) what -data says: counts, photons or noise */
};

/* What one write is given: the fields its format carries are read, the rest ignored. */
typedef struct {
    int carry;                 /* NBGI_CARRY_PHOTONS, _COUNTS or _NOISE: what the image data are */
    size_t npix;               /* pixels of one frame */
    int fpixels, spixels;      /* a frame's shape (a panel concatenation: npix x 1) */
    const float *photons;      /* PHOTONS: nframes frames (formats of one image a file: one) */
    const uint16_t *counts;    /* COUNTS, NOISE: the same as 16-bit counts */
    const int32_t *counts32;   /* COUNTS, NOISE in a format of several frames: nframes frames of 32-bit counts */
    int frame, nframes;        /* this frame (0-based) of the series; the frames given (several-frame formats) */
    const nbg_smv_header *smv; /* SMV: the header */
    double pgm_scale;          /* PGM: the pixel scale */
    const nbg_geometry *g;     /* GEOMETRY */
    const nbg_panel *panels;   /* GEOMETRY: the panels (in g's frame) or NULL */
    int npanels;
    const uint8_t *mask;       /* NXmx: the mask written with the frames, or NULL */
    const char *images;        /* experiment lists: the images the list names ("" or NULL: none) */
    char said[160];            /* out: what was written, after the file's name ("as 2-byte integers") */
} nbgi_image_out;

typedef int (*nbgi_image_reader)(nbg_ctx *ctx, const char *path, int frame, size_t expect_npix, off_t size,
                                 float **image, size_t *npix, nbg_geometry *lg, uint8_t **mask, int *whole);
typedef int (*nbgi_image_writer)(nbg_ctx *ctx, nbgi_outset *set, const char *path, nbgi_image_out *o);

typedef struct {
    const char *name, *what;   /* "cbf", and a file of it in words ("a CBF file") */
    const char *magic;         /* its first bytes (NULL: anything, the last row: raw floats) */
    size_t nmagic;
    int frames;                /* 1: one image a file; 0: any number */
    nbgi_image_reader read;    /* NULL: nbgrad cannot read its images */
    nbgi_image_writer write;   /* NULL: nbgrad cannot write it */
    int carries;               /* what the writer can carry (NBGI_CARRY_*) */
    const char *note;          /* for a row without reader or writer: why, and what reads it */
} nbgi_image_format;

/* Row i of the registry (0-based), NULL past the last. */
const nbgi_image_format *nbgi_image_format_at(int i);
/* The row named name; NULL, with NBG_EINVAL naming it and the known formats in ctx (ctx may be NULL), for a name
 * nbgrad does not know. */
const nbgi_image_format *nbgi_image_format_named(nbg_ctx *ctx, const char *name);
/* The row a file's first bytes (head, n of them) make it: the first row whose magic they begin with. */
const nbgi_image_format *nbgi_image_format_sniff(const unsigned char *head, size_t n);
/* The first bytes read to sniff a file. */
#define NBGI_SNIFF_BYTES 64
/* Writes o to path (set: the run's output set, NULL: at once) through the writer of format name: NBG_EINVAL for a
 * name nbgrad does not know, a format it cannot write, or data it does not carry (o->carry), naming them; else the
 * writer's status, with o->said filled. */
int nbgi_image_write(nbg_ctx *ctx, nbgi_outset *set, const char *format, const char *path, nbgi_image_out *o);

/* nbg_read_image, except that an image of a detector it refuses because it cannot place its panels (see
 * nbg_read_image) is read as the file's one array, with unplaced (size bytes) receiving the refusal's message (an
 * empty string otherwise; may be NULL): for a caller that has the panels from elsewhere, as nbg_observed_read has
 * a DIALS list's (nbg_panel.raw_offset). */
int nbgi_read_image_array(nbg_ctx *ctx, const char *path, int frame, size_t expect_npix, float **image,
                          size_t *npix, nbg_geometry *g, int *have_geometry, uint8_t **mask, char *unplaced,
                          size_t size);

/* The format readers behind nbg_read_image (same contract: one frame, *image malloc'd, g and mask optional).
 * Each checks sizes against the context's memory limit before allocating. */
int nbgi_read_nxmx(nbg_ctx *ctx, const char *path, int frame, float **image, size_t *npix, nbg_geometry *g,
                   uint8_t **mask);
/* The same, with the count of the file's detector modules (several: the image is their concatenation, g module
 * 0's detector). */
int nbgi_read_nxmx_modules(nbg_ctx *ctx, const char *path, int frame, float **image, size_t *npix,
                           nbg_geometry *g, uint8_t **mask, int *nmodules);
int nbgi_read_cbf(nbg_ctx *ctx, const char *path, float **image, size_t *npix, nbg_geometry *g, uint8_t **mask);
/* The same, with the panels of a multi-panel full CBF (several arrays, or arrays cut into sections: *panels
 * malloc'd, in DIALS's laboratory frame, the image their concatenation, g panel 0's detector); a one-panel file
 * gives *panels NULL and *npanels 1.  panels and npanels may be NULL. */
int nbgi_read_cbf_panels(nbg_ctx *ctx, const char *path, float **image, size_t *npix, nbg_geometry *g,
                         uint8_t **mask, nbg_panel **panels, int *npanels);

/* The binary sections of a CBF file, which nbgrad finds and decodes itself (src/cbfbin.c): CBFlib then parses a
 * copy of the file in which each section is a placeholder word, i.e. text only. */
typedef enum {
    NBGI_CBF_UNCOMPRESSED = 0,
    NBGI_CBF_BYTE_OFFSET,
    NBGI_CBF_PACKED, /* x-CBF_PACKED (CCP4 / J. P. Abrahams packing, 32-bit integers) */
    NBGI_CBF_OTHER
} nbgi_cbf_compression;

/* One binary section as its MIME header describes it (checked against the file: its data lie in it). */
typedef struct {
    size_t at;            /* the byte of the ';' that opens its text field */
    size_t end;           /* just past the ';' that closes its text field */
    size_t data;          /* its first data byte (after the start marker) */
    uint64_t size;        /* X-Binary-Size: the data bytes */
    int compression;      /* nbgi_cbf_compression */
    char conversion[48];  /* Content-Type's conversions as written ("" when none: uncompressed) */
    int packed_flat;      /* x-CBF_PACKED: Content-Type says "flat" (no averaging over neighbours) */
    int packed_uncorrelated; /* x-CBF_PACKED: "uncorrelated_sections" (no averaging over the prior section) */
    char encoding[24];    /* Content-Transfer-Encoding ("" when not stated) */
    char eltype[48];      /* X-Binary-Element-Type as written ("" when not stated: signed 32-bit integer) */
    int elbytes;          /* the element's bytes, 1, 2, 4 or 8; 0 for a type nbgrad does not read */
    int elsigned, elreal; /* a signed integer; an IEEE real */
    int bigendian;        /* X-Binary-Element-Byte-Order: 0 LITTLE_ENDIAN (the default), 1 BIG_ENDIAN, -1 other */
    int has_nel;          /* X-Binary-Number-of-Elements stated */
    uint64_t nel;
    uint64_t dim[3];      /* X-Binary-Size-Fastest/Second/Third-Dimension; 0 when not stated */
    char md5[25];         /* Content-MD5 ("" when none) */
} nbgi_cbf_section;

typedef struct {
    unsigned char *bytes; /* the whole file */
    size_t len;
    char *text;           /* the file with each binary section's text field replaced by a placeholder word */
    size_t textlen;
    nbgi_cbf_section *sec;
    int nsec;
} nbgi_cbf_file;

/* Reads the file open as fp (from its start) into f, finds and checks every binary section (its MIME header, the
 * start marker, X-Binary-Size bytes in the file, the ';' that ends its text field) and builds f->text.  Refused
 * (NBG_EFORMAT naming the file, the section and the byte): a malformed section, a MIME boundary anywhere else,
 * a control byte outside the binary sections (CBFlib would take it for binary data).  f is released on failure. */
int nbgi_cbf_load(nbg_ctx *ctx, const char *path, FILE *fp, nbgi_cbf_file *f);
void nbgi_cbf_release(nbgi_cbf_file *f);
/* The section whose placeholder value is (0-based), or -1 when value is no placeholder. */
int nbgi_cbf_section_of(const nbgi_cbf_file *f, const char *value);
/* Checks that section k can be decoded into nel elements (encoding, compression, element type and byte order,
 * X-Binary-Size against nel) before anything is allocated: NBG_EUNSUP or NBG_EFORMAT naming the file otherwise. */
int nbgi_cbf_check(nbg_ctx *ctx, const char *path, const nbgi_cbf_file *f, int k, uint64_t nel);
/* Verifies section k's Content-MD5 when it has one, then decodes its nel elements into out as float (through
 * double, as (float)(double)value); a stream that ends early or holds more than nel elements is NBG_EFORMAT
 * naming the file and the element. */
int nbgi_cbf_decode(nbg_ctx *ctx, const char *path, const nbgi_cbf_file *f, int k, uint64_t nel, float *out);

/* The formats plug-in.  HDF5 and CBFlib (which pull in some 40 shared libraries: curl, krb5, gnutls, ...) cost the
 * program most of its start-up, so by default (FORMATS_DL=1) the NXmx and CBF code (nxmx.c, cbf.c, cbfbin.c) is
 * built into NBGI_FORMATS_PLUGIN (with the MTZ reader, src/mtz.c and mtzread.cc: gemmi and the C++ runtime), which
 * src/plugin.c opens on the first NXmx, CBF or MTZ call and reaches through this
 * table; a plug-in that cannot be loaded makes those calls NBG_EUNSUP naming it.  The installed libraries and the
 * Python package link the formats in (FORMATS_DL=0). */
#define NBGI_FORMATS_PLUGIN "nbgrad-formats.so"
#define NBGI_FORMATS_SYMBOL "nbgi_formats_plugin"
typedef struct {
    size_t size;          /* sizeof(nbgi_formats_api) */
    const char *version;  /* NBG_VERSION */
    size_t abi[4];        /* sizeof nbg_ctx, nbg_geometry, nbg_panel, nbgi_outset: the layouts both sides share */
    int (*read_nxmx_modules)(nbg_ctx *ctx, const char *path, int frame, float **image, size_t *npix,
                             nbg_geometry *g, uint8_t **mask, int *nmodules);
    int (*read_nxmx_panels)(nbg_ctx *ctx, const char *path, nbg_geometry *g, nbg_panel **panels, int *npanels);
    int (*write_nxmx_panels_set)(nbg_ctx *ctx, nbgi_outset *set, const char *path, const nbg_geometry *g,
                                 const nbg_panel *panels, int npanels, nbg_dtype dtype, const void *frames,
                                 int nframes, const uint8_t *mask);
    int (*write_nxmx_set)(nbg_ctx *ctx, nbgi_outset *set, const char *path, const nbg_geometry *g, nbg_dtype dtype,
                          const void *frames, int nframes, const uint8_t *mask);
    int (*read_cbf_panels)(nbg_ctx *ctx, const char *path, float **image, size_t *npix, nbg_geometry *g,
                           uint8_t **mask, nbg_panel **panels, int *npanels);
    int (*read_cbf_panel_list)(nbg_ctx *ctx, const char *path, nbg_geometry *g, nbg_panel **panels, int *npanels);
    int (*write_cbf_set)(nbg_ctx *ctx, nbgi_outset *set, const char *path, const nbg_geometry *g, int frame,
                         const int32_t *data);
    int (*read_mtz)(nbg_ctx *ctx, const char *path, const char *column, double default_F, nbg_hkl *out, char *what,
                    size_t nwhat);
} nbgi_formats_api;
#define NBGI_FORMATS_ABI {sizeof(struct nbg_ctx), sizeof(nbg_geometry), sizeof(nbg_panel), sizeof(nbgi_outset)}
/* The plug-in's one exported function (src/fmtplugin.c). */
const nbgi_formats_api *nbgi_formats_plugin(void);

/* Finds a file that comes with this build (the formats plug-in, the MPI program nbgrad-mpi): next to the program or
 * shared object that holds this code, in its parent folder (the build tree's tests/, bench/, examples/), in
 * ../lib/nbgrad (an installed program) or in NBG_HELPER_DIR (the install's $(LIBDIR)/nbgrad).  Returns 1 with its
 * path in out, or 0 with the places looked at in tried ("a, b, c"). */
int nbgi_helper_path(const char *name, char *out, size_t nout, char *tried, size_t ntried);

#endif
