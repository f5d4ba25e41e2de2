/*
 * nbgrad.h -- the public contract of nbgrad, a differentiable X-ray diffraction image simulator.
 *
 * nbgrad renders the same images as James Holton's nanoBragg for the same experiment and returns exact
 * gradients through hand-derived adjoint kernels.  This header is the whole API: everything else is private.
 *
 * Conventions used throughout:
 *   - Units are the command line's: lengths of the crystal cell and wavelengths in Angstrom, detector lengths in
 *     mm, angles in degrees, sensor thickness and water size in micrometres, fluence in photons/m^2.
 *   - Images are float32, fast index varying fastest: index = slow * fpixels + fast.  Values are photons per pixel.
 *   - Every call returns an nbg_status (NBG_OK = 0, negative on failure).  After a failure nbg_errmsg(ctx) says
 *     what went wrong, naming the input (file and line, flag, value).  The library never prints and never exits.
 *   - The caller owns every buffer passed in; the library keeps no pointer after a call returns.
 *   - A context may be used by one thread at a time; distinct contexts are independent.
 */
#ifndef NBGRAD_H
#define NBGRAD_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* The version, MAJOR.MINOR.PATCH, of this header; nbg_version() says the library's, which a program linked against
 * the shared library may find newer than the header it was built with.
 *
 * ABI rules.  The shared library is libnbgrad.so.MAJOR.MINOR.PATCH with the soname libnbgrad.so.MAJOR (libnbgrad.so.0
 * throughout 0.x); libnbgrad.a, nbgrad.pc and this header are installed with it (make install).
 *   - A patch version (0.1.0 -> 0.1.1) changes no declaration here and no documented behaviour: fixes only.
 *   - From 1.0, a minor version (1.2 -> 1.3) only adds: new functions; new values of an enum after its existing
 *     ones (the status codes, further negative numbers); new scalar parameters at the end of nbgrad_params.def
 *     (NBG_NPARAMS grows; the families' ids, NBG_P_MOTION0, NBG_P_DOMAIN0 and NBG_P_F0, are fixed); new flags in a
 *     flags argument.
 *     It never removes or renames a function, changes a signature, renumbers an enum, or changes the size or layout
 *     of a struct the caller allocates (nbg_experiment, nbg_report, nbg_limits, nbg_refine_options, nbg_geometry,
 *     ...): each of those takes the next major version and so a new soname, which installs beside the old one.  A
 *     program built against 1.m runs against every 1.n with n >= m.
 *   - Before 1.0 (0.y.z) the interface is still settling: a minor version (0.1 -> 0.2) may change any of the above,
 *     the layout of nbg_experiment included, under the same soname libnbgrad.so.0.  A program built against 0.y is
 *     rebuilt for another 0.y; it can check at run time that nbg_version_number() / 100 == NBG_VERSION_NUMBER / 100.
 *   - The library exports exactly the functions declared here, all named nbg_* (the shared library hides its
 *     internal nbgi_* functions); make checksymbols checks both. */
#define NBG_VERSION_MAJOR 0
#define NBG_VERSION_MINOR 1
#define NBG_VERSION_PATCH 0
#define NBG_VERSION "0.1.0"
#define NBG_VERSION_NUMBER (NBG_VERSION_MAJOR * 10000 + NBG_VERSION_MINOR * 100 + NBG_VERSION_PATCH)

/* The library's version: its NBG_VERSION string ("0.1.0") and its NBG_VERSION_NUMBER (100 for 0.1.0). */
const char *nbg_version(void);
int nbg_version_number(void);

/* ---------------------------------------------------------------------------------------------------------- */
/* Status codes                                                                                               */
/* ---------------------------------------------------------------------------------------------------------- */

typedef enum {
    NBG_OK = 0,
    NBG_EINVAL = -1,  /* an invalid argument or experiment (NaN, impossible geometry, bad size)              */
    NBG_ENOMEM = -2,  /* an allocation failed                                                              */
    NBG_EIO = -3,     /* a file could not be opened, read or written                                        */
    NBG_EFORMAT = -4, /* a file was read but its content is malformed                                       */
    NBG_EUNSUP = -5,  /* a feature is not supported by this backend or build                                */
    NBG_ENODEV = -6,  /* the CUDA backend was asked for and no GPU (or no CUDA build) is available           */
    NBG_ECUDA = -7    /* a CUDA runtime call failed                                                         */
} nbg_status;

/* A static English description of a status code. */
const char *nbg_strerror(int status);

/* ---------------------------------------------------------------------------------------------------------- */
/* Context                                                                                                    */
/* ---------------------------------------------------------------------------------------------------------- */

typedef enum { NBG_BACKEND_CPU = 0, NBG_BACKEND_CUDA = 1, NBG_BACKEND_AUTO = 2 } nbg_backend;
typedef enum { NBG_DOUBLE = 0, NBG_FLOAT = 1 } nbg_precision;

typedef struct nbg_ctx nbg_ctx;

/* The most threads a context may ask for. */
#define NBG_MAX_THREADS 1024

/* Creates a context.  backend AUTO picks CUDA when a GPU is usable and the CPU otherwise; CUDA without a GPU
 * fails with NBG_ENODEV.  nthreads <= 0 means the OpenMP default; above NBG_MAX_THREADS is NBG_EINVAL.  On
 * failure *out is NULL. */
int nbg_ctx_create(nbg_ctx **out, nbg_backend backend, nbg_precision precision, int nthreads);
void nbg_ctx_destroy(nbg_ctx *ctx); /* NULL is a no-op */
/* The backend actually in use (AUTO resolved). */
nbg_backend nbg_ctx_backend(const nbg_ctx *ctx);
/* What a context runs on. */
typedef struct {
    char name[256];        /* the GPU's name, or "CPU" */
    int units;             /* multiprocessors (CUDA) or threads (CPU) */
    double clock_ghz;      /* the GPU's peak clock; 0 on the CPU */
    double peak_gflops[2]; /* the GPU's peak arithmetic rate, a fused multiply-add counted as 2, indexed by
                              nbg_precision ([NBG_DOUBLE], [NBG_FLOAT]); 0 where unknown (the CPU) */
    double memory_gib;     /* the GPU's memory; 0 on the CPU */
} nbg_device_info;
int nbg_ctx_device(const nbg_ctx *ctx, nbg_device_info *info);
/* The message of the last failure on this context ("" when none). */
const char *nbg_errmsg(const nbg_ctx *ctx);
/* A callback that long calls (nbg_gradcheck) make as they go: what they are doing, and done of total steps.
 * NULL turns it off.  The library never prints; the callback may. */
typedef void (*nbg_progress_fn)(void *user, const char *what, int done, int total);
void nbg_ctx_set_progress(nbg_ctx *ctx, nbg_progress_fn fn, void *user);

/* What an input may ask of the machine.  Every allocation whose size derives from input (a structure-factor
 * table, an image read from a file, the plan's sources and crystal orientations, gradient accumulators) and the
 * total work of a call are checked against these before anything is allocated or run; going over is an error
 * (NBG_ENOMEM for memory, NBG_EINVAL for work) whose message states the size and names the limit, so that a
 * two-line HKL file or a mistyped step count cannot allocate gigabytes or run for days.  A caller who does mean
 * it raises the limit. */
typedef struct {
    double max_bytes;   /* the largest single allocation derived from input, bytes (4 GiB)                     */
    double max_samples; /* the largest work of one call: pixels x samples per pixel (subpixels x layers x
                           sources x phi steps x mosaic domains), (1e12: about an hour on a few CPU cores)       */
} nbg_limits;
void nbg_limits_default(nbg_limits *l);
/* Sets the context's limits (both must be positive; NBG_EINVAL otherwise).  nbg_ctx_create sets the defaults. */
int nbg_ctx_set_limits(nbg_ctx *ctx, const nbg_limits *l);
int nbg_ctx_limits(const nbg_ctx *ctx, nbg_limits *l);

/* ---------------------------------------------------------------------------------------------------------- */
/* Structure factors                                                                                          */
/* ---------------------------------------------------------------------------------------------------------- */

/* A dense table of structure-factor amplitudes over h_min..h_max, k_min..k_max, l_min..l_max (inclusive).
 * F[((h - h_min) * nk + (k - k_min)) * nl + (l - l_min)], with nk = k_max - k_min + 1, nl = l_max - l_min + 1.
 * Entries not given in a file hold the default F the table was read with. */
typedef struct {
    int h_min, h_max, k_min, k_max, l_min, l_max;
    double *F;
    long nrefl; /* reflections read from the file (the table's size for an Fdump) */
} nbg_hkl;

/* Reads an HKL text file: whitespace-separated "h k l F" lines, optionally with a 5th and 6th column (which are
 * ignored), '#' comment lines and blank lines.  Entries the file does not list are filled with default_F.
 * A malformed line is NBG_EFORMAT naming the file and line. */
int nbg_hkl_read(nbg_ctx *ctx, const char *path, double default_F, nbg_hkl *out);
/* Reads structure factors from any of the files nbgrad takes, told apart by their first bytes:
 *   - an HKL text file (as nbg_hkl_read);
 *   - a CCP4 MTZ file (starts with "MTZ "; through gemmi): column names the column (NULL or "": the first amplitude
 *     column, type F, else the first intensity column, type J); an intensity I gives F = sqrt(max(I, 0)).  The file
 *     holds the asymmetric unit and the table is looked up without symmetry, so every reflection is expanded to all
 *     its equivalents under the file's space group and to its Friedel mates (an anomalous column, type G or K, fills
 *     its own half, its "(+)"/"(-)" partner the other when the file has one).  Missing values (NaN) are left out
 *     (default_F there); a reflection the file lists twice gets the mean.  An unknown column is NBG_EINVAL naming
 *     the file's columns;
 *   - a DIALS reflection table (.refl, msgpack): miller_index with intensity.prf.value where the table has it, else
 *     intensity.sum.value, F = sqrt(max(I, 0)); a reflection observed several times gets the mean F (summed in the
 *     table's order); unindexed rows (0 0 0) are left out; no symmetry is applied (the table holds no space group).
 * what (nwhat bytes; may be NULL) gets one line on what was read: the column, the space group, the entries.
 * MTZ and .refl files need the formats (NBG_EUNSUP in a build without them). */
int nbg_hkl_read_column(nbg_ctx *ctx, const char *path, const char *column, double default_F, nbg_hkl *out,
                        char *what, size_t nwhat);
/* Writes / reads the nanoBragg Fdump.bin binary cache (same layout as the reference program). */
int nbg_hkl_write_fdump(nbg_ctx *ctx, const char *path, const nbg_hkl *hkl);
int nbg_hkl_read_fdump(nbg_ctx *ctx, const char *path, nbg_hkl *out);
/* Frees F (the struct itself is the caller's); NULL-safe. */
void nbg_hkl_free(nbg_hkl *hkl);

/* ---------------------------------------------------------------------------------------------------------- */
/* Experiment                                                                                                 */
/* ---------------------------------------------------------------------------------------------------------- */

typedef enum {
    NBG_CONV_MOSFLM = 0,
    NBG_CONV_DENZO,
    NBG_CONV_ADXV,
    NBG_CONV_XDS,
    NBG_CONV_DIALS,
    NBG_CONV_CUSTOM
} nbg_convention;

/* The pivot used when the detector is rotated.  AUTO follows the convention (BEAM for MOSFLM, DENZO, ADXV and
 * CUSTOM; SAMPLE for XDS and DIALS), which is what nanoBragg does; BEAM and SAMPLE force it. */
typedef enum { NBG_PIVOT_AUTO = 0, NBG_PIVOT_BEAM, NBG_PIVOT_SAMPLE } nbg_pivot;

/* How a sensor of some thickness T (attenuation 1 / mu) absorbs: nbg_experiment.sensor_model.  rho is the cosine of
 * a ray's angle to the sensor's normal, n the layers (thicksteps).
 *   NBG_SENSOR_NANOBRAGG  nanoBragg's model, for parity with its images: layers at depths 0, T / (n - 1), ..., T,
 *                         every layer's sum weighted alike by the capture of a slab beyond the last one,
 *                         exp(-T mu / rho) - exp(-n T mu / ((n - 1) rho)).  Not physical (the reference's
 *                         behaviour notes, gotcha 9): a 450 um sensor of 261 um attenuation in 2 layers renders
 *                         29 % of the incident photons where it absorbs 82 %, half of them at its back face.
 *   NBG_SENSOR_PHYSICAL   the sensor's capture 1 - exp(-T mu / rho), shared alike by n layers of equal capture at
 *                         normal incidence, each at the middle of its share of the absorbed photons (depth
 *                         -ln(1 - (t + 1/2) c / n) / mu, c = 1 - exp(-T mu)): the photons absorbed where they are,
 *                         as DIALS's parallax correction takes them.  The depths are normal incidence's; the
 *                         capture is the ray's.
 *   NBG_SENSOR_AUTO       nanoBragg's for an experiment set up from flags, the physical model for a sensor read
 *                         from a file (nbg_experiment_from_geometry). */
typedef enum { NBG_SENSOR_AUTO = 0, NBG_SENSOR_NANOBRAGG, NBG_SENSOR_PHYSICAL } nbg_sensor_model;

typedef enum { NBG_SHAPE_SQUARE = 0, NBG_SHAPE_ROUND, NBG_SHAPE_GAUSS, NBG_SHAPE_TOPHAT } nbg_shape;

/* One X-ray source: a position (any length; only its direction matters: the beam travels from it to the sample)
 * and a wavelength in Angstrom (<= 0 or NaN: the experiment's lambda). */
typedef struct {
    double pos[3];
    double lambda;
} nbg_source;

/* How the detector turns photons into the counts of an image file: counts = gain * photons + pedestal, plus
 * Gaussian read noise of read_noise counts rms.  The losses (nbg_loss_grad, nbg_refine) compare the model image
 * with y_p = (observed_p - pedestal) / gain.  nanoBragg's integer and noise images carry a pedestal of 40 counts
 * (its -adc offset) and gain 1.  A panel of a multi-panel detector may have its own (nbg_panel.own_response): the
 * losses then read each pixel through its panel's. */
typedef struct {
    double pedestal;   /* counts every pixel carries with no photon (0) */
    double gain;       /* counts per photon, > 0 (1) */
    double read_noise; /* Gaussian read noise, counts rms, >= 0 (0) */
} nbg_detector_model;

/* The levels of a detector hierarchy nbg_panel records (0: the detector, 1: its children, ...). */
#define NBG_PANEL_LEVELS 6

/* One flat detector panel (a module, a tile or an ASIC) of a multi-panel detector.  Its pixel (i, j) (fast index i,
 * slow index j) covers origin + [i, i+1) pixel fast + [j, j+1) pixel slow; the sensor's depth runs along the normal
 * fast x slow, which must point away from the sample.  The frame of the vectors is nbg_experiment.panel_frame's.
 * The sensor is the experiment's (thickness, attenuation, layers) unless the panel gives its own thickness and
 * attenuation length; the number of layers is the experiment's for every panel (a thicker panel has thicker
 * layers; with no sensor of the experiment's, -thicksteps or nanoBragg's default as if it had one). */
typedef struct {
    int fpixels, spixels;           /* pixel counts along fast and slow (>= 1) */
    double pixel;                   /* pixel size, mm (0: the experiment's -pixel) */
    double fast[3], slow[3];        /* the panel's axes: perpendicular, any length (normalised) */
    double origin[3];               /* the corner of pixel (0,0) (not its centre), mm */
    char name[32];                  /* for messages and files ("" : "panel <index>") */
    int group;                      /* the motion group it belongs to (nbg_experiment.motions; 0 when none) */
    double thick;                   /* its sensor's thickness, um (0: the experiment's -detector_thick) */
    double thick_abs;               /* its sensor's attenuation length, um (0: the experiment's -detector_abs, or
                                       with a thickness of its own and no -detector_abs, that thickness) */
    int level_group[NBG_PANEL_LEVELS]; /* its group at each level of a DIALS hierarchy (DIALS's hierarchy_level):
                                       level 0 the whole detector (0); level L the group at depth L below the root
                                       that holds it, numbered from 0 in the hierarchy's order (a panel nearer the
                                       root than L: a group of its own, numbered after those); -1 past the depth of
                                       the hierarchy (nbg_read_expt_panels fills it; a layout's modules are level 1) */
    int has_level_frames;           /* 1: level_frame holds the frames of its groups (a list's hierarchy as read) */
    double level_frame[NBG_PANEL_LEVELS][9]; /* the frame of its group at each level (level_group; [0] the
                                       detector's root), in the panels' frame: unit fast axis, unit slow axis and
                                       origin (mm), each level's the same for every panel of the group, all zero
                                       where the panel has no group of its own at that level.  Groups move with
                                       their panels (motions, and the plane for PLANE panels), and the writers write
                                       a group's frame as it is here (dxtbx's frames, as a list gave them); without
                                       it, as its first panel's.  nbg_read_expt_panels fills it */
    int own_response;               /* 1: the losses read this panel's pixels through response below (a gain and
                                       pedestal per module); 0 (the default): through nbg_experiment.response.
                                       nbg_read_expt_panels sets it on every panel of a list where some panel states
                                       a gain or pedestal other than dxtbx's defaults (1, 0), with the list's */
    nbg_detector_model response;    /* its pedestal, gain (> 0) and read noise (>= 0), when own_response */
    int has_trusted;                /* 1: trusted below is the range of its valid counts (DIALS's trusted_range) */
    double trusted[2];              /* when has_trusted and lo < hi: nbg_observed_read leaves out its pixels whose
                                       count v is not lo < v < hi (dxtbx's rule; nbg_read_expt_panels fills it) */
    int raw_offset[2];              /* where its pixels start (fast, slow) in an image file that is one array cut
                                       into panels (a DIALS list's raw_image_offset: the Pilatus 12M's rows of
                                       modules, a Timepix quad's chips); nbg_read_expt_panels fills it, and
                                       nbg_observed_read cuts such a file into the panels at these corners when
                                       any panel's is not (0, 0).  (0, 0) otherwise */
} nbg_panel;

/* A rigid motion of a group of panels (panels whose nbg_panel.group is its index), in the frame of the panels'
 * vectors: each panel of the group is turned by R = Rz(rot[2]) Ry(rot[1]) Rx(rot[0]) about the group's pivot (the
 * mean of its panels' centres as given) and then moved by shift, so that its origin becomes
 * pivot + R (origin - pivot) + shift and its axes R fast, R slow.  The zero motion leaves the panels as given.
 * Refinable: parameter NBG_P_MOTION(g, c) is component c of group g's motion (see nbg_param). */
typedef struct {
    double shift[3];                /* mm, along the frame's x, y, z (PLANE: the plane's fast, slow, normal) */
    double rot[3];                  /* deg, about the frame's x, y, z through the pivot */
} nbg_panel_motion;

/* The frame of nbg_panel's vectors.  PLANE: components along the detector plane's fast, slow and normal axes
 * (the plane that the detector flags place, as for a single detector), origin in mm from the plane's pix0 (the
 * corner of its pixel (0,0)): the panels move with the plane, so distance, beam centre, detector rotations and
 * two-theta move them all (and have gradients).  LAB: nbgrad's laboratory frame of the convention (that of
 * nbg_report's pix0, fdet, sdet, odet), origin in mm from the sample: the panels stay where they are and the
 * detector flags do not move them. */
typedef enum { NBG_PANELS_PLANE = 0, NBG_PANELS_LAB = 1 } nbg_panel_frame;

/* A DIALS multi-axis goniometer (dxtbx's MultiAxisGoniometer: a kappa, a SmarGon) as an experiment list gives it.
 * The crystal turns by S R(axes[scan_axis], phi) F with F = R(axes[scan_axis-1]) ... R(axes[0]) (the axes inside the
 * scan axis, at their angles) and S = R(axes[naxes-1]) ... R(axes[scan_axis+1]) (those outside), R(u, t) the
 * right-handed rotation about unit(u) by t; nbg_geometry holds the result in the laboratory (its axis is
 * S unit(axes[scan_axis]), its crystal S F times the list's), and this the structure, so that a list written back
 * is the goniometer the beamline has.  naxes 0: a single-axis goniometer (nbg_geometry.axis alone). */
#define NBG_GONIO_MAX_AXES 16
typedef struct {
    int naxes;                          /* 0 (single-axis), or 1 to NBG_GONIO_MAX_AXES */
    double axes[NBG_GONIO_MAX_AXES][3]; /* each axis at every angle 0, innermost (next to the sample) first, as the
                                           list gives it: within 1 % of unit length (dxtbx normalises it; the
                                           rotations use unit(axes[i])) */
    double angles[NBG_GONIO_MAX_AXES];  /* each axis's angle, deg (|angle| <= 1e6); the scan axis's plays no part
                                           (the scan gives it) and is written back as given */
    char names[NBG_GONIO_MAX_AXES][32]; /* each axis's name ("" when the list names none) */
    int scan_axis;                      /* the axis the scan turns, 0 to naxes - 1 */
    double fixed[9], setting[9];        /* F and S (row-major) of the axes and angles above: derived, set by the
                                           readers and nbg_goniometer_derive; the writers recompute them */
    double crystal[9];                  /* the crystal's real-space vectors a, b, c (rows, A) as the list gave them
                                           (in the goniometer's frame: nbg_geometry.real_space = S F crystal), so
                                           that a list written back from an unchanged crystal repeats them bit for
                                           bit; the writer uses them only when S F crystal gives real_space exactly,
                                           (S F)^T real_space otherwise.  Unused without a crystal */
} nbg_goniometer;

/* F and S of gn's axes and angles into gn->fixed and gn->setting (nothing for naxes 0).  NBG_EINVAL naming the field
 * (with what, e.g. "writing x.expt") for a count, scan axis, axis (zero, not finite, off unit length by more than
 * 1 %) or angle (not finite, beyond 1e6 deg) that is not valid. */
int nbg_goniometer_derive(nbg_ctx *ctx, nbg_goniometer *gn, const char *what);

/* "Unset" is NAN for every double field documented as optional (the default then applies, as nanoBragg's), and
 * -1 for every count documented as automatic and for the pixel counts (derived from the detector size); such a
 * count is otherwise at least 1: 0 is an error, not "unset".  nbg_experiment_default sets every field to its
 * default or unset value. */
typedef struct {
    /* --- detector --------------------------------------------------------------------------------------- */
    nbg_convention convention;
    nbg_pivot pivot;
    double pixel;                   /* pixel size, mm (0.1) */
    int fpixels, spixels;           /* pixel counts, each >= 1, or -1 (unset): derived from detsize (1024) */
    double detsize_f, detsize_s;    /* detector size, mm (102.4); ignored when pixel counts are given */
    double distance;                /* sample to beam spot along the beam, mm (100) */
    double close_distance;          /* sample to detector plane along its normal, mm (NAN: derived) */
    double Xbeam, Ybeam;            /* beam centre, mm, convention-dependent meaning (NAN: default) */
    double Xclose, Yclose;          /* near point, mm (NAN) */
    double ORGX, ORGY;              /* XDS origin, pixels (NAN) */
    double fdet[3], sdet[3], odet[3], beam[3], polar_axis[3], spindle[3], twotheta_axis[3];
                                    /* CUSTOM convention vectors; a vector whose x is NAN takes the default */
    double det_rot[3];              /* detector rotations about x, y, z, deg, applied as Rz*Ry*Rx */
    double det_tau[3];              /* the placed detector turned about its own frame, deg (DIALS's Tau1-3): about its
                                       normal by det_tau[0], then its fast axis by [1], then its slow axis by [2],
                                       the axes as placed, through the plane's point nearest the sample (0 0 0) */
    double twotheta;                /* two-theta swing about the two-theta axis, deg */
    int curved;                     /* every pixel at the same distance from the sample */
    int point_pixel;                /* solid angle 1/R^2, no obliquity */
    int roi[4];                     /* xmin xmax ymin ymax inclusive pixel indices; -1 = the whole detector */
    const uint8_t *mask;            /* fpixels*spixels, 0 = skip the pixel; NULL = none (caller-owned) */
    double thick;                   /* sensor thickness, um (0 = none) */
    double thick_abs;               /* attenuation length, um (NAN: = thickness; 0 or inf: no attenuation) */
    int thicksteps;                 /* sensor layers (-1 auto) */
    int sensor_model;               /* nbg_sensor_model: how the layers absorb (NBG_SENSOR_AUTO: nanoBragg's for an
                                       experiment set up from flags, the physical model for a sensor read from a
                                       file, which nbg_experiment_from_geometry sets) */
    int oversample;                 /* subpixels per axis (-1 auto) */
    int oversample_thick, oversample_polar, oversample_omega; /* per-subpixel factors (nanoBragg semantics) */

    /* --- beam ------------------------------------------------------------------------------------------- */
    double lambda;                  /* wavelength, A (1) */
    double dispersion;              /* spectral width, percent (0) */
    int dispsteps;                  /* wavelengths (-1 auto) */
    double hdivrange, vdivrange;    /* divergence ranges, mrad (NAN unset) */
    double hdivstep, vdivstep;      /* divergence steps, mrad (NAN unset) */
    int hdivsteps, vdivsteps;       /* divergence counts (-1 auto) */
    int round_div;                  /* elliptical cut of the divergence grid (1) */
    const nbg_source *sources;      /* explicit sources (caller-owned), or NULL to generate them */
    int nsources;
    double polarization;            /* Kahn factor K (0) */
    int nopolar;                    /* polarization factor fixed at 1 */
    double fluence;                 /* photons/m^2 (1.25932015286227086e29) */
    double flux;                    /* photons/s (0 = use fluence) */
    double exposure;                /* s (1) */
    double beamsize;                /* mm (0.1) */

    /* --- crystal ---------------------------------------------------------------------------------------- */
    int has_cell;
    double cell[6];                 /* a b c (A) alpha beta gamma (deg); b, c NAN: a's value; angles NAN: 90 */
    int has_mat;
    double mat[9];                  /* MOSFLM A matrix in file order (rows x,y,z; columns a*,b*,c*), at lambda */
    int has_umat;                   /* with has_cell (and no has_mat): the crystal is DIALS's U B, B the Busing-Levy
                                       matrix of cell, exactly (a crystal read from an experiment list); without it
                                       -cell builds the crystal as nanoBragg does (its angles come out slightly
                                       other than those given where two or more are not 90 deg) */
    double umat[9];                 /* U: a rotation (row-major), applied before the misset */
    double misset[3];               /* deg, applied as Rz*Ry*Rx to the reciprocal vectors */
    int misset_random;              /* draw the misset from misset_seed (overrides misset) */
    long misset_seed;
    double Na, Nb, Nc;              /* unit cells along a, b, c (1); continuous for gradients */
    double sample_x, sample_y, sample_z; /* crystal size, mm (0 = use N) */
    nbg_shape shape;
    double fudge;                   /* shape fudge factor (1) */
    double phi0, osc, phistep;      /* spindle start, range, step, deg (0, NAN, NAN) */
    double spindle_tilt[2];         /* the rotation axis turned by these angles (deg) about two axes perpendicular to
                                       it: v1 = unit(axis x beam), then v2 = axis x v1 (0 0; refinable) */
    int phisteps;                   /* (-1 auto) */
    double mosaic;                  /* mosaic spread, deg (NAN unset) */
    int mosaic_domains;             /* (-1 auto) */
    long mosaic_seed;               /* (12345678) */
    double mosaic_frame[9];         /* the rotation (row-major) from the frame the mosaic domains' random axes are
                                       drawn in to this experiment's frame: axis' = R axis, so that the same domains
                                       sit on the same crystal after a change of frame (an experiment list nbgrad
                                       wrote carries it: nbg_geometry.mosaic_frame).  [0] NAN: the identity */
    /* Each domain's own turn (a crystal of a few blocks): ndomain_rot = 0 (the default) none; else domain m <
     * ndomain_rot is turned by D = Rz(r[2]) Ry(r[1]) Rx(r[0]) about the laboratory's axes at phi 0, r = domain_rot +
     * 3 m (deg): the turn is the crystal's, the spindle turns it with the crystal, and the domain's mosaic rotation
     * (with a spread) comes after both, as always (domain m's vectors U_m Rot(phi) D a0).  So blocks of the crystal
     * may sit at their own orientations; the domains are of equal weight.  With turns the domain count given
     * (mosaic_domains) stands without a spread.  ndomain_rot must not exceed the domains.  Caller-owned; nbg_param_set
     * and nbg_refine write fitted values into it (NBG_P_DOMAIN). */
    double *domain_rot;
    int ndomain_rot;

    /* --- structure factors ------------------------------------------------------------------------------- */
    const nbg_hkl *hkl;             /* table (caller-owned) or NULL: default_F everywhere */
    double default_F;               /* F outside the table (0) */
    int interpolate;                /* tricubic interpolation: 1 on, 0 off, -1 auto (on when any N <= 2) */
    double dmin;                    /* resolution cut-off, A (0 = none) */

    /* --- background ------------------------------------------------------------------------------------- */
    double water;                   /* water layer thickness, um (0) */

    /* --- refinement offsets ----------------------------------------------------------------------------- */
    double beam_shift[2];           /* direct-beam position shift along the detector's fast and slow axes, mm
                                       (0): moves the detector within its own plane, whatever the convention */
    double orient[3];               /* small rotations of the crystal about the lab's fixed x, y, z axes, deg (0 0 0),
                                       composed onto the orientation the cell or matrix and the misset give, as
                                       Rz Ry Rx: the refinable orientation (the derivatives at 0 are rotations
                                       about three fixed axes, with no gimbal lock wherever the crystal stands) */
    double beam_tilt[2];            /* the beam (with its polarization and divergence) turned, deg (0 0): by tilt1
                                       about w1 = unit(spindle x beam) (towards the spindle), then by tilt2 about
                                       w2 = beam x w1 (out of the beam-spindle plane); the detector stays */
    double spectrum_shift;          /* the spectrum moved: added to every source's wavelength, A (0) */
    double spectrum_scale;          /* the spectrum's width about its mean wavelength m (the sources' plain mean):
                                       lambda_i = lambda_i0 + spectrum_shift + (spectrum_scale - 1) (lambda_i0 - m),
                                       a factor on the bandwidth (1); neither moves the crystal of -mat, whose
                                       matrix is read at lambda */
    char space_group[32];           /* the crystal's space group: a Hall symbol (as DIALS writes it, " P 4nw 2abw"),
                                       a Hermann-Mauguin symbol ("P 43 21 2", "P43212") or a number 1-230; ""
                                       unknown (P 1).  Its lattice constrains the cell a refinement fits
                                       (nbg_cell_constraints) */

    /* --- the image model ----------------------------------------------------------------------------------- */
    /* Every image the library returns (nbg_simulate, the gradient calls) is the model image
     *     M_p = scale * I_p + B_p  (photons),   B_p = bg[0] + bg[1] x_p + bg[2] y_p,
     * with I_p the simulated photons and x_p = (f - (fpixels - 1) / 2) / 1000, y_p = (s - (spixels - 1) / 2) / 1000
     * the pixel's (fast f, slow s) offset from the detector centre in thousands of pixels (so that the three
     * coefficients are photons per pixel on comparable scales).  Pixels outside the ROI or the mask stay 0.  With
     * the defaults (scale 1, bg 0) M is I exactly. */
    double scale;                   /* overall scale G (1) */
    double bg[3];                   /* background plane, photons per pixel (0 0 0) */
    nbg_detector_model response;    /* counts = gain * M + pedestal (pedestal 0, gain 1, read noise 0) */
    int response_stated;            /* 1: response's pedestal and gain (and the panels' own, nbg_panel.own_response)
                                       are what the model the experiment came from states: a DIALS list whose gain or
                                       pedestal are not dxtbx's defaults 1 and 0, with which DIALS reads the counts
                                       ((raw - pedestal) / gain); nbg_experiment_from_geometry sets it from
                                       nbg_geometry.response_stated.  nbg_observed_read then takes them over the
                                       observed file's (its options still win), but not for raw floats, which no
                                       list's image set is.  0 (the default): the file's */

    /* --- multi-panel detector ------------------------------------------------------------------------------ */
    /* npanels = 0 (the default): one flat detector of fpixels x spixels, as above (nanoBragg's).  npanels > 0:
     * the image is the concatenation of the panels in order, panel p's pixels (fast-major within the panel) from
     * the sum of the earlier panels' sizes on; nbg_report.npix is the total.  The detector flags (convention,
     * pixel counts and size, distance, beam centre, rotations, two-theta) still place the detector plane that
     * NBG_PANELS_PLANE panels sit in.  The mask, when given, covers the whole concatenated image.  Refused with
     * panels: a region of interest (-roi; use the mask), the curved detector.  nbg_layout fills the panels of
     * the built-in layouts.  Panels must not overlap, must not be degenerate and must face the sample. */
    const nbg_panel *panels;        /* npanels panels (caller-owned), or NULL */
    int npanels;
    nbg_panel_frame panel_frame;    /* the frame of the panels' vectors (NBG_PANELS_PLANE) */
    /* nmotions = 0 (the default): the panels stay as given.  Else every panel's group must be below nmotions and
     * panel p moves by motions[panels[p].group] (a group without panels is allowed: nothing depends on it).
     * Caller-owned; nbg_param_set and nbg_refine write the fitted values into it. */
    nbg_panel_motion *motions;
    int nmotions;

    /* --- a pixel list (spot regions) ------------------------------------------------------------------------- */
    /* NULL (the default): every pixel.  Else npixels_list image indices, strictly increasing, each < npix (NBG_EINVAL
     * naming the entry otherwise): every call then evaluates only these pixels, and its cost scales with them, not
     * with the detector.  nbg_simulate and the gradient calls fill the listed pixels of the image (those outside the
     * ROI or mask with 0 as always) and set every other pixel to 0; the gradients and losses read dLdI, observed and
     * weights at the listed pixels only (the sums run over them); nbg_simulate_jvp writes its tangents compactly,
     * tangents[j * npixels_list + t] for list entry t; nbg_refine fits on the listed pixels (a Jacobian of nparams x
     * npixels_list); nbg_report's solid_angle sums the listed pixels.  The listed pixels' values are bit for bit
     * those of the whole image on the CPU (the CUDA kernels launch a thread per listed pixel).
     * nbg_gradcheck refuses a list.  nbg_spot_pixels builds one around the Bragg spots. */
    const uint32_t *pixels;         /* caller-owned */
    long npixels_list;
    /* A still as its source described it (a DIALS list without scan and goniometer, a file that states no angle):
     * set by nbg_experiment_from_geometry; an experiment of one image with osc 0 that keeps it is written back as a
     * still (nbg_geometry_from_report: scan_stated 0), not as a scan of width 0. */
    int still;
    /* The custom convention's vectors are in DIALS's laboratory frame (set by nbg_experiment_from_geometry: the
     * experiment of a DIALS list, an NXmx or a CBF file): nbg_geometry_from_report and nbg_panels_from_report then
     * give every vector as it is, so that a list read and written back keeps its beam, detector, axis and crystal
     * (a beam dials.index tilted off -z included).  0 (the default, and with any nanoBragg convention): they turn
     * the description's frame so that the beam runs along -z. */
    int dials_frame;
    /* The multi-axis goniometer of the list the experiment came from (nbg_experiment_from_geometry copies
     * nbg_geometry.goniometer; naxes 0, the default: none): not used by the simulation (spindle is the rotation axis
     * in the laboratory, the crystal is in the laboratory), handed back by nbg_geometry_from_report, so that the list
     * written back keeps the beamline's goniometer. */
    nbg_goniometer goniometer;
} nbg_experiment;

/* Fills e with nanoBragg's defaults. */
void nbg_experiment_default(nbg_experiment *e);

/* What the setup derived from an experiment: the geometry nanoBragg reports and writes into SMV headers, the
 * sampling it chose, and the detector size to allocate images for.  Lengths in mm, angles in degrees. */
typedef struct {
    int fpixels, spixels;
    double pixel, detsize_f, detsize_s;
    double distance, close_distance;
    double Xbeam, Ybeam;            /* header beam centre (input or default; not recomputed) */
    double Fbeam, Sbeam, Fclose, Sclose;
    double ORGX, ORGY;
    double dials_origin[3];
    double pix0[3], fdet[3], sdet[3], odet[3], beam[3], polar_axis[3], spindle[3]; /* pix0 in m */
    double lambda;                  /* A */
    double phi0, osc, twotheta;
    int pivot;                      /* NBG_PIVOT_BEAM or NBG_PIVOT_SAMPLE */
    int oversample, recommended_oversample;
    int thicksteps, nsources, phisteps, mosaic_domains, steps;
    int sensor_model;               /* the sensor's model rendered: NBG_SENSOR_PHYSICAL or NBG_SENSOR_NANOBRAGG */
    double Na, Nb, Nc;
    int interpolate;
    double misset_random_deg[3];    /* the angles drawn for a random misset */
    double fluence, flux;
    double cell[6];                 /* real-space cell (A, deg) after orientation set-up */
    double xtal_size_max;           /* mm */
    double real_vectors[9];         /* a, b, c (A) at phi 0 */
    double recip_vectors[9];        /* a*, b*, c* (1/A) */
    double I_bg;                    /* water background before scaling */
    int warn_oversample;            /* the oversample given is below the recommended one */
    int warn_clipped_sample;        /* sample size clipped to the beam size */
    long interp_fallbacks;          /* tricubic windows that left the table (nearest neighbour used) */
    double solid_angle;             /* sum of subpixel solid angles / steps, sr (nanoBragg's printed value) */
    int npanels;                    /* panels of the detector (1 for the single flat detector) */
    size_t npix;                    /* pixels of the image: fpixels * spixels, or the panels' total */
    /* Where the call's time went, in seconds (nbg_simulate, nbg_simulate_grad): the host set-up (the plan, and
     * on CUDA the copies of the parameters to the device), the kernels (on CUDA the device time between events
     * around them), and on CUDA copying the image and sums back. */
    double time_setup, time_kernel, time_copy;
} nbg_report;

/* Derives the geometry and sampling without rendering. */
int nbg_describe(nbg_ctx *ctx, const nbg_experiment *e, nbg_report *out);

/* The panels of a built-in detector layout, in the detector plane's frame (NBG_PANELS_PLANE), their origins from
 * the corner of the layout's bounding box, so that a plane of *fpixels x *spixels pixels of *pixel mm (the
 * bounding box, rounded up) holds them all and its default beam centre is the layout's centre.  capacity: the
 * room in panels (NULL with 0 asks for the count only: *npanels).  Names (nbg_layout_names lists them):
 *   pilatus6m    Dectris Pilatus 6M: 5 x 12 modules of 487 x 195 pixels of 0.172 mm, gaps of 7 pixels between
 *                columns and 17 between rows (2463 x 2527 pixels overall, 60 panels)
 *   eiger2_16m   Dectris Eiger2 16M: 4 x 8 modules of 1028 x 512 pixels of 0.075 mm, gaps of 12 pixels between
 *                columns and 38 between rows (4148 x 4362 overall, 32 panels)
 *   jungfrau16m  PSI Jungfrau 16M: 4 x 8 modules of 1024 x 512 pixels of 0.075 mm, each as its 2 x 4 ASICs of
 *                256 x 256 (256 panels; the double-size pixels between ASICs are left out as 2-pixel gaps), module
 *                gaps as the Eiger2's (approximate: the real modules are tilted in a pinwheel)
 *   cspad        SLAC CSPAD, approximately: 4 quadrants of 8 two-by-one sensors, each 2 ASICs of 194 x 185 pixels
 *                of 0.11 mm (64 panels), the sensors of a quadrant in four pairs turned alternately by 90 deg, the
 *                quadrants turned by 90 deg about the centre around a central hole
 * Each panel's group (for nbg_experiment.motions) is its module: a Jungfrau ASIC's its module's, a CSPAD ASIC's
 * its two-by-one sensor's (32 groups), otherwise the panel's own.
 * An unknown name is NBG_EINVAL listing the names; too small a capacity NBG_EINVAL. */
int nbg_layout(nbg_ctx *ctx, const char *name, nbg_panel *panels, int capacity, int *npanels, double *pixel,
               int *fpixels, int *spixels);
/* The built-in layouts' names, separated by spaces. */
const char *nbg_layout_names(void);

/* ---------------------------------------------------------------------------------------------------------- */
/* Experiments from nanoBragg's flags                                                                         */
/* ---------------------------------------------------------------------------------------------------------- */

/* The command line's way of describing an experiment, as library calls (SUNDIALS's CVodeSetOptions is the model): a
 * builder parses nanoBragg's flags, nbgrad's own and the flags of the files (the same table as `nbgrad -h` and
 * docs/flags.md) into an nbg_experiment, then reads the files they name: -expt (and -setting), -layout with
 * -panel_groups, -motions, -mat, -hkl (or the F cache -dump), -sourcefile, and the headers of -mask and -img (read
 * while parsing, as nanoBragg does, so that the flags override them).  This is what nbgrad and its subcommands do
 * before they render.
 *
 * The builder never prints.  A failure returns its status with the message in nbg_errmsg(ctx), naming the flag (an
 * unknown one with the closest flag, when one is close: "unknown flag '-distanse': did you mean '-distance'?"),
 * the value, the file and the line; the program prints that message after "nbgrad: error: ".  What the program
 * prints besides (notes on flags accepted and ignored, the files read, a misset seed drawn) the builder keeps as
 * messages (nbg_builder_message), in order.  Flags the program acts on (output files, -seed, -scale, -frames,
 * -quiet ...) are checked and kept, with no effect here; -device, -precision, -threads, -max_memory and -max_samples
 * are the context's (nbg_builder_ctx_create).  The F cache (Fdump.bin) is neither read nor written unless -dump
 * names it.  A value left out is an error: -cell takes all six values. */
typedef struct nbg_builder nbg_builder;

/* What a message of the builder is: information (the program prints it on stdout), a note on the input, or a
 * warning (the program prints these two on stderr, after "nbgrad: note: " and "nbgrad: warning: "). */
typedef enum { NBG_MSG_INFO = 0, NBG_MSG_NOTE = 1, NBG_MSG_WARNING = 2 } nbg_msg_level;

/* A builder with the flags' defaults (nbg_experiment_default); NBG_ENOMEM, *out NULL, when memory is short. */
int nbg_builder_create(nbg_builder **out);
/* Frees the builder and everything its experiment points to that it made (F table, sources, panels, motions,
 * mask); NULL is a no-op. */
void nbg_builder_destroy(nbg_builder *b);
/* Parses the argc flags of argv (no program name: argv[0] is a flag), once per builder; the builder keeps its own
 * copy.  NBG_EINVAL names a bad flag or value (unknown, a value missing, malformed, out of range, -h); a -mask or
 * -img file that cannot be read gives its reader's status. */
int nbg_builder_parse(nbg_ctx *ctx, nbg_builder *b, int argc, const char *const *argv);
/* Reads the files the parsed flags name into the experiment, once, after nbg_builder_parse.  The status of the
 * step that failed (NBG_EIO, NBG_EFORMAT, NBG_EINVAL: e.g. -motions without panels, a single-detector file with
 * panels) with the message naming the flag and the file. */
int nbg_builder_load(nbg_ctx *ctx, nbg_builder *b);
/* A deep copy of b (its own flags, F table, sources, panels, motions and mask; no messages). */
int nbg_builder_copy(const nbg_builder *b, nbg_builder **out);
/* The experiment built: the caller may read and change it (nbg_param_set ...) and pass it to every call; it
 * points into the builder, which must outlive its use.  NULL for NULL. */
nbg_experiment *nbg_builder_experiment(nbg_builder *b);
/* The builder's structure-factor table (F NULL when none was read).  The experiment points to it when -hkl or the
 * F cache gave one; a caller may replace its contents (nbg_hkl_free first, F malloc'd), the builder frees them. */
nbg_hkl *nbg_builder_hkl(nbg_builder *b);
/* The panel groups' rigid motions: returns the number of groups (0 without panels) and sets *motions (may be
 * NULL) to the builder's array of them, zero unless -motions gave them.  The experiment points to it only when
 * -motions was given (e->motions NULL otherwise: the panels as placed). */
int nbg_builder_motions(nbg_builder *b, nbg_panel_motion **motions);
/* The -mask read (1 = a pixel used, 0 = skipped; the experiment's mask) and its size, or NULL (sizes 0). */
const uint8_t *nbg_builder_mask(const nbg_builder *b, int *fpixels, int *spixels);
/* The images of the rotation series the flags ask for (-frames, or the scan of -expt): 1 or more. */
int nbg_builder_frames(const nbg_builder *b);
/* Image `frame` (0-based, below nbg_builder_frames) of the series as the program renders it, into *out: the
 * builder's experiment with the crystal turned from phi0 + frame osc through osc (nbg_describe's phi0 and osc) and,
 * when -expt's crystal is scan-varying (nbg_read_expt_scan_crystal), that image's own crystal: the mean of the A
 * matrices at its start and end (DIALS interpolates A linearly between them), as a cell and misset angles.  *out
 * points into the builder as nbg_builder_experiment's does.  NBG_EINVAL for a frame out of range or without scan
 * points. */
int nbg_builder_frame(nbg_ctx *ctx, nbg_builder *b, int frame, nbg_experiment *out);
/* The ADC offset of the integer images (-adc; 40, nanoBragg's): what an SMV file without ADC_OFFSET carries
 * (nbg_observed_options.adc). */
double nbg_builder_adc(const nbg_builder *b);
/* A context as the flags ask for it: -device, -precision, -threads, and the limits -max_memory and -max_samples
 * (nbg_ctx_create's statuses; *out NULL on failure). */
int nbg_builder_ctx_create(const nbg_builder *b, nbg_ctx **out);
/* The builder's messages so far: how many, and message i (0-based; NULL out of range) with its level (may be
 * NULL); the text has no newline and stays valid while the builder lives. */
int nbg_builder_nmessages(const nbg_builder *b);
const char *nbg_builder_message(const nbg_builder *b, int i, nbg_msg_level *level);
/* The builder's flag table, entry i (0-based): *names the flag's names, the main one first, then its aliases,
 * space-separated ("-lambda -wave"); *arg the names of its values, a word each ("a b c alpha beta gamma"; NULL: a
 * switch); *help one line with the unit.  Any of them may be NULL.  NBG_EINVAL past the last entry. */
int nbg_flag_info(int i, const char **names, const char **arg, const char **help);

/* Renders the image.  image holds npix = fpixels*spixels floats, or the panels' total (nbg_report.npix, which
 * nbg_describe gives); it is overwritten.  report may be NULL. */
int nbg_simulate(nbg_ctx *ctx, const nbg_experiment *e, float *image, size_t npix, nbg_report *report);


/* ---------------------------------------------------------------------------------------------------------- */
/* Gradients                                                                                                  */
/* ---------------------------------------------------------------------------------------------------------- */

/* Differentiable parameters, in the command line's units.  A parameter is named by an id (nbg_param):
 *   - a scalar parameter NBG_P_<NAME>, 0 <= id < NBG_NPARAMS, declared once in nbgrad_params.def (its name,
 *     unit, domain, groups and help: nbg_param_info).  Orientation rotx/roty/rotz are the misset angles (applied
 *     after -cell or -mat exactly as -misset); beam_fast/beam_slow are nbg_experiment.beam_shift; scale, bg,
 *     bg_fast, bg_slow are the image model's G and background plane (nbg_experiment.scale, bg[0..2]): their
 *     derivatives are image-level (dM/dG = I, dM/dbg = 1, x_p, y_p), computed from the same pass;
 *   - component c of panel group g's motion, NBG_P_MOTION(g, c) (c = 0, 1, 2 the shift along the frame's x, y, z in
 *     mm, 3, 4, 5 the rotation about them in deg), named "g<g>.shift_x" ... "g<g>.rot_z"; it exists while
 *     g < e->nmotions;
 *   - component c of mosaic domain m's own turn, NBG_P_DOMAIN(m, c) (c = 0, 1, 2 the rotation about the lab's x,
 *     y, z in deg: nbg_experiment.domain_rot), named "d<m>.rot_x" ... "d<m>.rot_z"; it exists while m <
 *     e->ndomain_rot;
 *   - one structure-factor entry, NBG_P_F(i): entry i of the HKL table in its storage order (nbg_hkl), named
 *     "F(h,k,l)"; without a table NBG_P_F(0), named "F", is default_F;
 *   - NBG_P_F_ALL, "every structure factor": for nbg_gradcheck alone (a directional check over the table).
 * Every call that takes parameters takes a list of ids, and its results are arrays aligned to that list: the
 * caller asks for exactly the parameters it wants.  A list must not name a parameter twice. */
typedef int nbg_param;
enum {
#define NBG_PARAM(ID, ...) NBG_P_##ID,
#include "nbgrad_params.def"
#undef NBG_PARAM
    NBG_NPARAMS /* the number of scalar parameters */
};
#define NBG_P_MOTION0 4096
#define NBG_P_MOTION(g, c) ((nbg_param)(NBG_P_MOTION0 + 6 * (g) + (c)))
#define NBG_P_DOMAIN0 (1 << 21)
/* The most domains' own turns a geometry (an experiment list) carries. */
#define NBG_MAX_DOMAIN_TURNS 64
#define NBG_P_DOMAIN(m, c) ((nbg_param)(NBG_P_DOMAIN0 + 3 * (m) + (c)))
#define NBG_P_F0 (1 << 24)
#define NBG_P_F(i) ((nbg_param)(NBG_P_F0 + (i)))
#define NBG_P_F_ALL ((nbg_param)(NBG_P_F0 - 1))

/* What the table says of a parameter (every pointer a static string, "" when there is none). */
typedef struct {
    nbg_param id;
    const char *name;      /* the -params / Python name ("g3.shift_x", "F" and "F(h,k,l)" are nbg_param_label's) */
    const char *alias;     /* another accepted name, e.g. "wavelength" for lambda */
    const char *unit;      /* the CLI unit */
    const char *flag;      /* the command-line flag(s) that set its value ("" none) */
    const char *groups;    /* the -params groups it belongs to, space-separated (e.g. "cell crystal") */
    const char *help;      /* one line */
    double lo, hi;         /* the values an experiment may hold ... */
    int lo_open, hi_open;  /* ... an open end where set */
    int optional;          /* NAN is accepted too (unset: the default applies) */
    double bound_lo, bound_hi; /* the values a refinement may move it to (nbg_param_in_bounds) */
    int bound_lo_open, bound_hi_open;
} nbg_param_info;

/* The table's entry of a scalar parameter (0 <= p < NBG_NPARAMS) or of a family's member (a panel motion's
 * component, a structure factor: their name is the family's, "shift_x" ... or "F"); NBG_EINVAL otherwise. */
int nbg_param_info_get(nbg_param p, nbg_param_info *info);
/* The -params groups, space-separated: "all" (the parameters free in the experiment) and the table's groups. */
const char *nbg_param_groups(void);

/* The short name of a parameter (nbg_param_info's); "?" for an unknown id. */
const char *nbg_param_name(nbg_param p);
/* The full name of any parameter into buf (size bytes): "a", "g3.shift_x", "F(1,2,3)" (e gives the table's
 * Miller indices; NULL: "F[<index>]").  Returns buf. */
const char *nbg_param_label(const nbg_experiment *e, nbg_param p, char *buf, size_t size);
/* The scalar or motion parameter called name (its name or alias, or "g3.shift_x"), or -1.  Structure factors and
 * groups need the experiment: nbg_params_parse. */
int nbg_param_from_name(const char *name);

/* Parses a comma-separated list of parameter names for experiment e into *ids (malloc'd, the caller frees it) and
 * *nids, in the order given, without repeats.  Words: a parameter's name or alias; a group (nbg_param_groups:
 * "all" is every scalar parameter free in e, nbg_param_free, but fluence, an overall factor as scale is; a group's
 * members in the table's order); "g<k>.shift_x" ... one panel group's motion
 * component; "panels", "panel_shift", "panel_rot", "panel_shift_x" ... "panel_rot_z" those components of every
 * panel group; "F" every structure factor (every table entry, or default_F without a table; NBG_P_F_ALL instead
 * when flags has NBG_PARSE_F_ALL), "F(h,k,l)" one table entry.  An unknown word, a motion of a group e does not
 * have, a Miller index outside the table is NBG_EINVAL naming it. */
#define NBG_PARSE_F_ALL 1
int nbg_params_parse(nbg_ctx *ctx, const nbg_experiment *e, const char *list, int flags, nbg_param **ids,
                     int *nids);

/* Reads / writes a parameter's value in an experiment (beam_fast/slow: the shift; fluence: the fluence field; a
 * structure factor is the entry of e->hkl's table, or default_F without one: nbg_param_set writes the caller's
 * table). */
int nbg_param_get(const nbg_experiment *e, nbg_param p, double *value);
int nbg_param_set(nbg_experiment *e, nbg_param p, double value);
/* Whether parameter p is free in experiment e (it has a value the gradient calls differentiate and that changes
 * the image): 1, or 0 with the reason in why (size bytes; may be NULL), e.g. "mosaic: no mosaic spread" or
 * "polar: -nopolar fixes the polarization factor".  Negative on an invalid experiment (message in ctx). */
int nbg_param_free(nbg_ctx *ctx, const nbg_experiment *e, nbg_param p, char *why, size_t size);
/* Whether value is inside the bounds physics needs for parameter p (the table's BND: cell lengths, N, wavelength,
 * distance, scale > 0, N >= 1, cell angles in (0, 180), mosaic in [0, 180], polarization in [-1, 1]). */
int nbg_param_in_bounds(nbg_param p, double value);

/* Vector-Jacobian product: renders the image (nbg_simulate's model image M; see precision below) and returns
 * grad[j] = dL/dparams[j] = sum_p dLdI[p] * dM[p]/dparams[j] for the nparams parameters listed (nparams >= 0;
 * grad holds nparams doubles), in one reverse pass (dLdI is dL/dM: the adjoint kernel receives scale * dLdI; the
 * image-level parameters' gradients are sums over the pixels).  Where a derivative does not exist
 * (nearest-neighbour F between reflections, the tophat edge, a Miller index crossing a rounding boundary, the
 * resolution cut), the taken branch's derivative is returned.  Not supported (NBG_EUNSUP): the
 * -oversample_thick/_polar/_omega running-sum modes and the curved detector; a parameter nbg_param_free calls not
 * free for a reason the gradient cannot stand (N with -samplesize, fluence with -flux, the cell with -mat but no
 * -cell, the orientation with -misset random, the mosaic spread without a positive spread and several domains, the
 * detector plane's parameters with panels in the lab frame); structure factors on the CUDA backend.  The gradients
 * are accumulated in double and are bit-for-bit reproducible for a given backend and thread count.
 * Precision: the CPU adjoint always computes in double (on an NBG_FLOAT context its image is the double one); the
 * CUDA adjoint follows the context (on NBG_FLOAT, float per-sample arithmetic: gradients to ~1e-4 relative, the
 * image nbg_simulate's float image to ~1e-6 of its maximum). */
int nbg_simulate_grad(nbg_ctx *ctx, const nbg_experiment *e, const float *dLdI, const nbg_param *params,
                      int nparams, double *grad, float *image, size_t npix, nbg_report *report);

/* Forward-mode tangents (sensitivity maps): for each of the nparams parameters listed (scalars and panel
 * motions; not structure factors), the image dI/dtheta in tangents[j * npix .. (j+1) * npix) (double), computed in one pass over the detector together with the image.
 * Units: photons per pixel per CLI unit of the parameter.  The same restrictions as nbg_simulate_grad apply.  The
 * tangents are the model image's: scale * dI/dtheta, and for the image-level parameters I (scale), 1 (bg), x, y
 * (bg_fast, bg_slow) on the active pixels. */
int nbg_simulate_jvp(nbg_ctx *ctx, const nbg_experiment *e, const nbg_param *params, int nparams, double *tangents,
                     float *image, size_t npix);
/* nbg_simulate_jvp with the model image in double too, and nparams >= 0 (0: the image alone; params and tangents
 * may then be NULL): image_d (npix doubles, or NULL) receives the model image M before its rounding to float, image
 * (npix floats, or NULL) nbg_simulate_jvp's image, which is image_d's values rounded when the image model is the
 * identity (scale 1, no background).  At least one of the two is given.  Both come from the tangent kernel, which
 * computes in double whatever the context's precision, on the context's backend (the CPU's or the GPU's, which
 * agree to rounding; an NBG_FLOAT context's nbg_simulate may differ from them in the last float bits); for a
 * double image, or a differentiable op that wants the image and its tangents from one render (the PyTorch
 * adapter's forward). */
int nbg_simulate_tangents(nbg_ctx *ctx, const nbg_experiment *e, const nbg_param *params, int nparams,
                          double *tangents, float *image, double *image_d, size_t npix);

/* The losses compare the model image M_p (photons, see nbg_experiment's image model) with the observed counts
 * converted to photons, y_p = (obs_p - pedestal) / gain (e->response):
 *   least squares:  L = sum w_p (M_p - y_p)^2 (w = 1 when weights is NULL);
 *   Poisson:        L = sum w_p (M_p - y_p log M_p), y_p clipped below at 0 (a count under the pedestal is read
 *                   noise around zero photons), M_p floored at 1e-12;
 *   Poisson with read noise (response.read_noise = sigma_r > 0): the shifted-Poisson approximation, the photons
 *                   plus s = (sigma_r / gain)^2 treated as Poisson with mean M_p + s (mean and variance of
 *                   Poisson plus Gaussian noise both match):
 *                   L = sum w_p ((M_p + s) - y'_p log(M_p + s)),  y'_p = max(y_p + s, 0).
 * Constants of the data are dropped. */
typedef enum {
    NBG_LOSS_LSQ = 0,    /* least squares */
    NBG_LOSS_POISSON = 1 /* the Poisson negative log-likelihood (shifted Poisson with read noise) */
} nbg_loss;

/* Fused loss and gradient against an observed image (npix floats, counts as the file holds them, pedestal
 * included; pixels outside the ROI or masked are left out): *L, and grad[j] = dL/dparams[j] for the nparams
 * parameters listed (nparams = 0: the loss alone, at the cost of one forward pass; grad may then be NULL).  The
 * observed image must be finite (a value below the pedestal, or below zero in dark-subtracted data, is data: least
 * squares takes y = (obs - pedestal) / gain as it is, the Poisson losses clip y, or y + s with read noise, at 0);
 * the weights finite and non-negative. */
int nbg_loss_grad(nbg_ctx *ctx, const nbg_experiment *e, nbg_loss loss, const float *observed,
                  const float *weights, const nbg_param *params, int nparams, double *L, double *grad, float *image,
                  size_t npix);

/* Whether the observed image's floor agrees with the model's: a model without the data's pedestal or background
 * fits the wrong thing (a Poisson fit then moves the cell to spread intensity over the floor) with small standard
 * errors.  floor is the 5th percentile of the observed counts over the pixels the loss uses (active, weight > 0);
 * model_floor the 5th percentile of the model's counts gain * M_p + pedestal there; sigma the noise of a count at
 * the model's floor, sqrt(gain^2 M + read_noise^2) (at least 1).  mismatch is 1 when the two differ by more than 5
 * counts and more than 5 sigma, or when the model's floor is under a photon and the observed floor lies a count or
 * more (and 5 unfloored sigma) above it (a pedestal given too low on a weak image); message then says so in words.  image, when not NULL, is the model image M of e
 * (npix floats, as nbg_simulate renders it); NULL renders it. */
typedef struct {
    double floor, model_floor, sigma;
    long npix;          /* pixels compared */
    int mismatch;
    char message[256];
} nbg_floor_check;
int nbg_check_floor(nbg_ctx *ctx, const nbg_experiment *e, const float *observed, const float *weights,
                    const float *image, size_t npix, nbg_floor_check *out);

/* ---------------------------------------------------------------------------------------------------------- */
/* Space groups: the cell parameters a lattice leaves free                                                    */
/* ---------------------------------------------------------------------------------------------------------- */

typedef enum {
    NBG_SYSTEM_TRICLINIC = 0,
    NBG_SYSTEM_MONOCLINIC,
    NBG_SYSTEM_ORTHORHOMBIC,
    NBG_SYSTEM_TETRAGONAL,
    NBG_SYSTEM_TRIGONAL,
    NBG_SYSTEM_HEXAGONAL,
    NBG_SYSTEM_CUBIC
} nbg_crystal_system;

/* The crystal system's constraints on the cell (a b c alpha beta gamma, the indices 0-5 of nbg_experiment.cell):
 * tie[i] = i for a free parameter, the free one it equals (b = a: tie[1] = 0), or -1 for one fixed at fixed[i]
 * (deg).  Triclinic 6 free, monoclinic 4 (the unique axis's angle), orthorhombic 3, tetragonal 2, trigonal and
 * hexagonal 2 (a, c; gamma = 120; on rhombohedral axes a and alpha), cubic 1: the free elements of the metric
 * tensor, as the cell parameters. */
typedef struct {
    nbg_crystal_system system;
    int unique_axis;        /* monoclinic: 0 a, 1 b, 2 c; else -1 */
    int rhombohedral;       /* trigonal on rhombohedral axes */
    int tie[6];
    double fixed[6];
    int nfree;
    char description[160];  /* "tetragonal (P 43 21 2): a (= b), c free; alpha = beta = gamma = 90" */
} nbg_cell_constraints;

/* The constraints of space_group (nbg_experiment.space_group's forms: a Hall symbol when it begins with a space, '-'
 * or "Hall:", else a Hermann-Mauguin symbol with or without spaces, or a number 1-230; NULL or "" triclinic).
 * NBG_EINVAL, naming it, for text that is none of these. */
int nbg_cell_constraints_get(nbg_ctx *ctx, const char *space_group, nbg_cell_constraints *c);
/* The system's name ("tetragonal"). */
const char *nbg_crystal_system_name(nbg_crystal_system s);

/* ---------------------------------------------------------------------------------------------------------- */
/* Refinement                                                                                                 */
/* ---------------------------------------------------------------------------------------------------------- */

typedef enum {
    NBG_OPT_LM = 0,  /* Levenberg-Marquardt on the Gauss-Newton model (Jacobian images, LAPACKE solves)      */
    NBG_OPT_BFGS = 1 /* quasi-Newton BFGS (GSL multimin vector_bfgs2) on the adjoint gradient, scaled variables */
} nbg_optimizer;

typedef struct {
    nbg_optimizer method;
    nbg_loss loss;
    int max_iter;         /* (100) */
    double ftol;          /* converged when the loss changes by less than ftol * loss (1e-12) ... */
    double gtol;          /* BFGS: ... or the scaled gradient norm is below gtol (1e-9) ... */
    double stol;          /* ... or the Gauss-Newton step left is below stol standard errors (1e-3) */
    /* called after each iteration: loss, gradient norm and step length */
    void (*progress)(void *user, int iter, double loss, double gnorm, double step);
    void *user;
    /* Per-reflection scales: non-NULL, the structure-factor table every frame's experiment points at (e->hkl),
     * whose entries measured in the loss's pixels (at least half an entry's predicted photons on the whole detector
     * fall in them: spot regions) are fitted together with the parameters listed, in one Levenberg-Marquardt fit.
     * They are first brought to their optimum with the parameters held (F^2 enters the model linearly).  The
     * structure factors' gradient is the adjoint's (exact); their rows of the Gauss-Newton matrix come from the
     * pixels that see one reflection (dM/dF_j = 2 (M - bg) / F_j there; which reflection, from three more renders).
     * The result lists the parameters, then the entries fitted (NBG_P_F(i)); the table is updated in place (|F|).
     * scale and fluence are an overall factor on every F^2 and cannot be fitted with them.  LM only.  Where most
     * pixels see several reflections (broad spots on large pixels) the matrix has few structure-factor rows and the
     * fit slows (measured: spots of 5 cells on pixels of 0.5 mm stop at 100 iterations, not converged). */
    nbg_hkl *F;
    /* Scan-varying orientation (0: off, the default; K >= 2: on): over the frames of a rotation scan the listed
     * orientation parameters (orient_x, orient_y, orient_z) become K knots each, spread evenly over the scan's
     * rotation range (from the first frame's start to the last frame's end, frames placed at their middle angles
     * phi0 + osc / 2), and frame f's orientation offset is the knots' linear interpolation at its middle angle,
     * sum_k w[f][k] x[k] with the weights of nbg_scan_knot_weights: the crystal turning smoothly through the scan,
     * as dials.refine's scan-varying crystal.  The other parameters are the same for every frame.  The gradient and
     * tangents of knot k are w[f][k] times the frame's (exact).  The result lists the caller's parameters, an
     * orientation parameter's entry being its knot 0, then knots 1..K-1 of each orientation parameter in the
     * list's order (nbg_refine_result.knot says which).  Needs at least 2 frames, K <= the number of frames, the
     * frames at different angles and an orientation parameter listed; not with F.  Each frame receives its own
     * interpolated orientation on success. */
    int scan_varying_knots;
    /* With scan_varying_knots: 1, the unit cell varies over the scan too, as dials.refine's scan-varying crystal
     * varies U and B: each cell parameter listed (a free one of the space group's constraints, nbg_cell_constraints)
     * has the same K knots as the orientation's, those it ties follow it frame by frame; 0 (the default): the cell
     * is one for the scan.  The result lists the cell's knots after the orientation's, in the list's order. */
    int scan_varying_cell;
} nbg_refine_options;

/* The weights of K knots spread evenly over [0, 1] at position t (clamped to [0, 1]): linear interpolation
 * between the two neighbouring knots, w[k] for k < K (the others 0; they sum to 1).  The scan-varying orientation's
 * frame weights (nbg_refine_options.scan_varying_knots), t the fraction of the scan's rotation range. */
void nbg_scan_knot_weights(double t, int nknots, double *w);

/* Why a refinement stopped.  Converged: FTOL, GTOL, STEP, and NO_DECREASE when the Gauss-Newton step left is
 * within one standard error (the loss cannot resolve a better point); not converged: MAXITER, NO_DECREASE with a
 * larger step left, BOUND. */
typedef enum {
    NBG_STOP_FTOL = 0,     /* the loss changed by less than ftol * loss                                      */
    NBG_STOP_GTOL,         /* BFGS: the scaled gradient fell below gtol                                      */
    NBG_STOP_STEP,         /* the Gauss-Newton step left is below stol standard errors                        */
    NBG_STOP_MAXITER,      /* the iteration limit                                                            */
    NBG_STOP_NO_DECREASE,  /* no step lowers the loss (LM at its largest damping, BFGS's line search)           */
    NBG_STOP_BOUND         /* a parameter ended at a bound of its physical range (nbg_param_in_bounds)         */
} nbg_stop_reason;

/* How well a fitted model explains the data within the detector's noise (photons Poisson, plus the read noise s =
 * (read_noise / gain)^2 as in the losses), whatever the loss fitted.  The statistic is the Poisson deviance
 * D = 2 sum (y'_p log(y'_p / m_p) - (y'_p - m_p)), y' = max(y + s, 0), m = M + s, over the pixels in the loss, against
 * its exact expectation under the fitted model (sum E[D_p], computed from each pixel's Poisson distribution, less
 * the number of parameters fitted): ratio = D / expectation is near 1 for a right model at any count level (the
 * plain deviance per degree of freedom is not: it falls below 1 where counts are low), over all the pixels and over
 * the brightest 5 % of the model's (the spots: the residuals' structure where the crystal's model matters), with
 * standard deviations from the pixels' variances of D.  mismatch is 1 when either ratio exceeds 1 by more than 0.05
 * and by more than 5 of its standard deviations: the model cannot explain the data within their noise, and its
 * standard errors (which assume it can) are too small.  sigma_scale = sqrt(max(1, ratio)) is the quasi-likelihood
 * factor that widens them for the Poisson loss (1 for least squares, whose standard errors already carry the
 * residuals' variance). */
typedef struct {
    double ratio, ratio_spots;
    double sd, sd_spots;
    double deviance, expected;
    long n, nspots;         /* the pixels summed */
    int mismatch;
    double sigma_scale;
    char message[320];
} nbg_fit_quality;

/* A refinement's outcome.  The arrays are allocated by the refinement (nparams entries each, corr nparams x
 * nparams) and released by nbg_refine_result_free; a result passed in again is freed first, so one result may be
 * reused for any number of fits (zero it before its first use). */
typedef struct {
    int nparams;
    nbg_param *params;                         /* the parameters fitted, as listed */
    double *start, *value;                     /* their values before and after */
    double *sigma;                             /* standard errors at the optimum */
    double *corr;                              /* correlation matrix, row-major nparams x nparams */
    double start_loss, loss;
    int iterations;                            /* iterations taken (one progress call each) */
    int converged;                             /* 1 when the stop reason is a convergence (see nbg_stop_reason) */
    nbg_stop_reason reason;
    char why[200];                             /* the reason in words, with the numbers */
    double step_sigma;                         /* the Gauss-Newton step left at the end, in standard errors */
    long nobs;                                 /* pixels in the loss */
    nbg_floor_check floor;                     /* the observed floor against the fitted model's (nbg_check_floor) */
    nbg_fit_quality fit;                       /* goodness of fit at the optimum */
    /* The cell under the experiment's space group (nbg_cell_constraints): with cell parameters listed, only the
     * free ones are fitted, the tied ones moving with them and the fixed ones held (a start cell within 1 % and
     * 1 deg of the symmetry is made symmetric first).  tied[j] is j for a parameter fitted, the index in params of
     * the one it equals (value, sigma and correlations its), or -1 for one held fixed (sigma 0).  constraint says
     * what was done, "" when nothing was constrained. */
    int *tied;
    char constraint[320];
    /* With nbg_refine_options.F: the table's entries fitted, and the largest relative change of one in the
     * start's step (the parameters held). */
    long F_fitted;
    double F_moved;
    long F_zero;      /* entries the fit put at zero intensity (held at that bound; standard error NaN) */
    /* Parameters (not structure factors) that had information at the start but none at the fitted model: the fit
     * moved them to where they no longer change the image where the loss looks (a mosaic domain turned away from
     * every spot region); their standard errors NaN, the rest as for the others.  (A parameter without information
     * at the start is refused before the first step.) */
    long undetermined;
    /* With a scan-varying orientation (nbg_refine_options.scan_varying_knots): the knots K, knot[j] the knot of
     * entry j (0..K-1 for a varying parameter's entries: the orientation's, and with scan_varying_cell the cell's,
     * a tied one's its leader's; -1 for the others; nparams entries) and knot_phi[k] knot k's rotation angle (deg);
     * 0 and NULL without. */
    int nknots;
    int *knot;
    double *knot_phi;
} nbg_refine_result;

void nbg_refine_options_default(nbg_refine_options *o);
/* Releases a result's arrays (the struct is the caller's) and zeroes them; NULL-safe. */
void nbg_refine_result_free(nbg_refine_result *res);
/* Fits the listed parameters of e to the observed image (npix floats, counts with e->response's pedestal and gain;
 * weights NULL = 1; pixels outside the ROI or e->mask are left out).  e is updated with the fitted values on
 * success, also when the fit did not converge (res->converged, res->reason say so).  The standard errors come from
 * the information matrix at the optimum: s^2 (J^T W J)^-1 with s^2 the reduced chi-square for least squares, the
 * inverse Fisher information for the Poisson loss. */
int nbg_refine(nbg_ctx *ctx, nbg_experiment *e, const float *observed, const float *weights, size_t npix,
               const nbg_param *params, int nparams, const nbg_refine_options *opt, nbg_refine_result *res);

/* The same fit over several images that share the parameters: the frames of a rotation series (their experiments
 * differ in phi0: frame f turns the crystal from phi0 + f osc through osc, as the program renders a series), or
 * stills of one crystal on one detector.  frames[f] is frame f's experiment (its scan, pixel list, mask and
 * response its own; npix pixels each), observed[f] its counts, weights[f] its weights (weights NULL, or an entry
 * NULL: 1).  The loss, its gradient and the information matrix are the sums of the frames'; the parameters are set
 * in every frame, and on success every frame receives the fitted values (each frame's motion list, when it has
 * its own, too).  Frames must have the same number of panel motions (the motions are shared).  With
 * opt->scan_varying_knots the orientation offsets vary over the frames (each frame receives its own).  nbg_refine is
 * the case of one frame. */
int nbg_refine_frames(nbg_ctx *ctx, nbg_experiment *frames, int nframes, const float *const *observed,
                      const float *const *weights, size_t npix, const nbg_param *params, int nparams,
                      const nbg_refine_options *opt, nbg_refine_result *res);

/* Finite-difference check of the adjoint for each parameter listed, on L = sum_p w_p I_p with fixed
 * pseudo-random weights w_p in [0.5, 1.5).  Central differences in double at steps h and h/2 (h per parameter,
 * scaled by h_scale, 1 = default), Richardson-extrapolated; passes when |adjoint - numeric| <= atol +
 * rtol max(|adjoint|, |numeric|), atol = 1e-13 |L| / h (the differences' rounding floor), and the error of the
 * plain difference shrinks like h^2.  M is the model image (nbg_experiment's image model), so the image-level
 * parameters are checked too.  A blank image is refused; a parameter whose adjoint and difference are both below
 * atol gets NBG_CHECK_ZERO (not a pass: no proof); a zero adjoint against a non-zero difference fails.  Pixels
 * whose rounded Miller index changes between the evaluations are left out of both sides (counted in excluded).
 * The context's progress callback (nbg_ctx_set_progress), when set, is called after each parameter. */
typedef enum {
    NBG_CHECK_FAIL = 0,
    NBG_CHECK_PASS = 1,
    NBG_CHECK_ZERO = 2  /* adjoint and difference both at the rounding floor: nothing on this experiment depends on
                           the parameter (e.g. a cell length no visible reflection moves with); not a failure, but
                           no proof either: a check with no PASS proves nothing */
} nbg_check_status;

typedef struct {
    nbg_param param;    /* the parameter checked (NBG_P_F_ALL: the structure factors along one direction) */
    double adjoint, numeric, relerr, step;
    double order;       /* observed convergence order of the finite difference (about 2) */
    long excluded;      /* pixels left out */
    int pass;           /* status == NBG_CHECK_PASS */
    nbg_check_status status;
    double loss;        /* the loss checked, L = sum w_p M_p at the experiment's values */
    char reason[160];   /* why it failed, or a note */
} nbg_gradcheck_result;

/* Checks exactly the nparams parameters listed (any id, NBG_P_F_ALL included), results[j] for params[j] (nparams
 * entries).  rtol in (0, 1) (1e-6 is a good choice) and h_scale > 0 (1 is the default step), NBG_EINVAL
 * otherwise. */
int nbg_gradcheck(nbg_ctx *ctx, const nbg_experiment *e, const nbg_param *params, int nparams, double rtol,
                  double h_scale, nbg_gradcheck_result *results);

/* The pixels within half_box pixels (along fast and slow, a (2 half_box + 1)^2 box, clipped at the edges of the
 * image or panel) of every spot pixel, as a pixel list for nbg_experiment.pixels: *pixels (malloc'd, the caller
 * frees it; NULL when none) and *npixels.  The spot pixels are those of image (npix floats; NULL: e's model image,
 * rendered with e's pixel list ignored) above threshold (INFINITY: none), and the centres given in centres
 * (ncentres pairs fast, slow in pixels; NULL with 0: none), rounded to the nearest pixel; centres are for the single
 * flat detector (NBG_EINVAL with panels: nbg_spot_box_pixels takes boxes on panels), one outside it is NBG_EINVAL
 * naming the entry.  Pixels outside the ROI or
 * mask are left out.  half_box in [0, 100000]. */
int nbg_spot_pixels(nbg_ctx *ctx, const nbg_experiment *e, const float *image, size_t npix, double threshold,
                    const double *centres, long ncentres, int half_box, uint32_t **pixels, long *npixels);
/* A rectangle of pixels on one panel: fast x0 <= f < x1, slow y0 <= s < y1 (panel 0 is the single flat detector). */
typedef struct {
    int panel;
    int x0, x1, y0, y1;
} nbg_spot_box;

/* The pixels of boxes (nboxes of them; NULL with 0: none), clipped at their panel's edges, as a pixel list for
 * nbg_experiment.pixels: *pixels (malloc'd, the caller frees it; NULL when none) and *npixels, in increasing order,
 * each pixel once.  A box on a panel the detector does not have (panel >= npanels, or >= 1 for the single flat
 * detector), with x1 <= x0 or y1 <= y0, or wholly outside its panel is NBG_EINVAL naming the entry.  Pixels outside
 * the ROI or mask are left out.  Works with panels: the spot regions of a multi-panel detector (nbg_spot_pixels'
 * centres are for the single flat one). */
int nbg_spot_box_pixels(nbg_ctx *ctx, const nbg_experiment *e, const nbg_spot_box *boxes, long nboxes,
                        uint32_t **pixels, long *npixels);

/* The reflections of a DIALS reflection table (a .refl file, msgpack: what dials.find_spots and dials.index write),
 * the columns spot regions need.  Coordinates are DIALS's: pixel (i, j) covers [i, i+1) x [j, j+1), so nbgrad's
 * pixel index (fast, slow) of a centroid (x, y) is (floor(x), floor(y)); z is the image (frame) coordinate. */
typedef struct {
    long n;             /* rows */
    int *panel;         /* n panel indices (the "panel" column; all 0 when the table has none) */
    double *xyz;        /* 3n: "xyzobs.px.value": x (fast), y (slow) in pixels, z in images */
    int *bbox;          /* 6n: "bbox": x0, x1, y0, y1, z0, z1 (pixels [x0, x1) x [y0, y1), images [z0, z1)), or NULL
                           when the table has none */
    int *id;            /* n experiment ids (the "id" column; -1 unassigned), or NULL when the table has none */
    int has_shoebox;    /* the table carries shoeboxes (a "shoebox" column, read into the shoebox_ fields below) */
    int ncolumns;       /* the table's columns, all of them */
    int *hkl;           /* 3n: "miller_index" (0 0 0 unindexed), or NULL when the table has none */
    uint64_t *flags;    /* n: DIALS's flags (NBG_REFL_USED_IN_REFINEMENT ...), or NULL when the table has none */
    double *xyzcal;     /* 3n: "xyzcal.px", DIALS's predicted centroid, or NULL when the table has none */
    /* The "shoebox" column (what dials.find_spots writes), all NULL when the table has none: each row's shoebox is
     * on its own panel with its own box (usually the row's panel and bbox), and where the row carries the shoebox's
     * pixels its mask, DIALS's MaskCode bits per pixel (NBG_SHOEBOX_VALID ...), z0..z1 slices of y0..y1 rows of
     * x0..x1 pixels, x fastest.  The pixels' data and background are not kept. */
    int *shoebox_panel; /* n */
    int *shoebox_bbox;  /* 6n: x0, x1, y0, y1, z0, z1 as "bbox" (x0 may be negative: a box over the panel's edge) */
    long *shoebox_offset; /* n + 1: row r's mask is shoebox_mask[shoebox_offset[r] .. shoebox_offset[r + 1]),
                             empty where the row's shoebox carries no pixels */
    int *shoebox_mask;  /* shoebox_offset[n] mask values (NULL when there are none) */
} nbg_reflections;

/* DIALS's shoebox mask bits (nbg_reflections.shoebox_mask) */
#define NBG_SHOEBOX_VALID 1
#define NBG_SHOEBOX_BACKGROUND 2
#define NBG_SHOEBOX_FOREGROUND 4
#define NBG_SHOEBOX_STRONG 8

/* DIALS's reflection flags (nbg_reflections.flags) that nbgrad reads */
#define NBG_REFL_INDEXED (1u << 2)
#define NBG_REFL_USED_IN_REFINEMENT (1u << 3)

/* Reads a DIALS reflection table into *out (its arrays malloc'd; nbg_reflections_free releases them).  The file
 * must be DIALS's msgpack reflection table, version 1, with an "xyzobs.px.value" column (vec3<double>); "panel"
 * (std::size_t), "bbox" (int6), "id" (int) and "shoebox" (Shoebox<>: each row's panel, box and mask) are read when
 * present.  Refused with a message (NBG_EFORMAT): truncated or malformed msgpack, another kind of file, a column of
 * the wrong type, a column whose length is not the table's row count, non-finite centroids, panel indices over
 * INT_MAX, bounding boxes with x1 < x0, a shoebox column whose rows do not fill its bytes exactly (named by row and
 * field); NBG_ENOMEM past the context's memory limit; NBG_EUNSUP in a build without the file formats (FORMATS=0:
 * libmsgpack-c). */
int nbg_read_refl(nbg_ctx *ctx, const char *path, nbg_reflections *out);
void nbg_reflections_free(nbg_reflections *r);

/* The spot boxes of a reflection table's rows, as nbgrad refine -spotlist FILE.refl takes them: one box per row
 * of experiment 0 (rows whose id is above 0 are another experiment's, left out and counted in *skipped; NULL
 * allowed), on its panel: with half < 0 its bounding box (r->bbox; NBG_EINVAL when the table has none), else the
 * box of half-width half (at most 100000) about its centroid's pixel (floor(x), floor(y)).  A row whose panel the
 * detector lacks or whose centroid (x, y) is off its panel is NBG_EINVAL naming the row.  *boxes (malloc'd, the
 * caller frees it; NULL when none) and *nboxes, for nbg_spot_box_pixels. */
int nbg_reflection_boxes(nbg_ctx *ctx, const nbg_experiment *e, const nbg_reflections *r, int half,
                         nbg_spot_box **boxes, long *nboxes, long *skipped);

/* The spot pixels of a reflection table's shoeboxes (r->shoebox_..., what dials.find_spots writes), as nbgrad refine
 * -spotlist FILE.refl -spot_shoebox N takes them: for each row of experiment 0 (another experiment's rows are left
 * out and counted in *skipped; NULL allowed), the pixels of its shoebox whose mask has any of the bits code
 * (NBG_SHOEBOX_FOREGROUND | NBG_SHOEBOX_STRONG: DIALS's spot), over all its z slices, on the shoebox's panel; each
 * as a box of half-width dilate (0 to 1000: 0 the pixel alone) about it.  *boxes (malloc'd, the caller frees it;
 * NULL when none) and *nboxes, one box a pixel, for nbg_spot_box_pixels (which clips them at the panel's edges and
 * leaves each pixel once).  NBG_EINVAL naming the row: a table without shoeboxes, a row whose shoebox carries no
 * pixels or none with those bits, whose mask does not fill its box, is on a panel the detector lacks, or marks a
 * pixel off its panel. */
int nbg_reflection_shoebox_boxes(nbg_ctx *ctx, const nbg_experiment *e, const nbg_reflections *r, int code,
                                 int dilate, nbg_spot_box **boxes, long *nboxes, long *skipped);

/* The model's own spot of each of n reflections: for reflection i (Miller index hkl[3i..3i+2], on panel[i], about the
 * position x[i], y[i] in DIALS's pixel coordinates: pixel (f, s) covers [f, f+1) x [s, s+1)), the centroid cx[i],
 * cy[i] of that reflection's model photons alone (scale applied, no background, the mask ignored) over the square of
 * half-width radius pixels about (x[i], y[i]) on its panel, and photons[i] their sum (0, and cx, cy NaN, when the
 * model puts none there).  The reflection's photons alone: each reflection is rendered on its square with a
 * structure-factor table that holds only its entry (e's table value, or default_F); exact for nanoBragg's
 * nearest-index lookup (NBG_EUNSUP with tricubic interpolation, which mixes neighbours).  photons may be NULL.
 * Deterministic.  Cost: a render of (2 radius + 1)^2 pixels per reflection. */
int nbg_reflection_centroids(nbg_ctx *ctx, const nbg_experiment *e, long n, const int *hkl, const int *panel,
                             const double *x, const double *y, int radius, double *cx, double *cy,
                             double *photons);

/* The spot pixels' threshold of a model image for nbg_spot_pixels, as nbgrad refine -spots and ensemble -spots take
 * it: the image's floor plus frac (-spot_frac, 0.05) of its range, over the npix pixels use keeps (NULL: all; 0 =
 * left out), in *threshold.  Returns 1, or 0 when the image is flat there (no spot to box; *threshold is then the
 * floor, +INFINITY when no pixel is kept). */
int nbg_spot_threshold(const float *image, const uint8_t *use, size_t npix, double frac, double *threshold);

/* ---------------------------------------------------------------------------------------------------------- */
/* Detector files and noise                                                                                    */
/* ---------------------------------------------------------------------------------------------------------- */

/* Values that go into an SMV header, as nanoBragg writes it. */
typedef struct {
    int fpixels, spixels;
    double pixel, distance, close_distance, lambda;
    double Xbeam, Ybeam, Fbeam, Sbeam, detsize_s;
    double dials_origin[3];
    double ORGX, ORGY, phi0, osc, twotheta;
    int has_adc_offset; /* 1: the header has (reading) or gets (writing) an ADC_OFFSET key; nanoBragg writes none,
                           so nbg_smv_header_from_report and a zeroed header leave it out (byte-identical files) */
    double adc_offset;  /* the pedestal the data carry, counts */
    char beamline[32];  /* reading: the header's BEAMLINE ("" when none); the writer writes its own */
} nbg_smv_header;

/* Fills an SMV header from a report. */
void nbg_smv_header_from_report(const nbg_report *r, nbg_smv_header *h);

/* Writes an SMV file (512-byte header, native-endian uint16 data).  The file is written to a temporary name and
 * renamed, so a failure leaves no partial file. */
int nbg_write_smv(nbg_ctx *ctx, const char *path, const nbg_smv_header *h, const uint16_t *data);
/* Reads an SMV file: header keys into *h (keys absent are NAN / 0; phi0 from PHI, else OSC_START) and, when data is
 * not NULL, the pixels into a malloc'd array the caller frees.  Checks that the data size matches the header. */
int nbg_read_smv(nbg_ctx *ctx, const char *path, nbg_smv_header *h, uint16_t **data);
/* Writes a P5 PGM: pixel = min(255, v * scale), truncated. */
int nbg_write_pgm(nbg_ctx *ctx, const char *path, const float *image, int fpixels, int spixels, double scale);
/* Writes the raw float image. */
int nbg_write_float(nbg_ctx *ctx, const char *path, const float *image, size_t npix);

/* Integer image as nanoBragg makes it: inside the ROI (NULL: the whole image), clip(v*scale + adc, 0, 65535)
 * rounded to nearest; outside, 0.  NBG_EINVAL for a NULL image or output, a non-positive size, a non-finite scale
 * or adc. */
int nbg_int_image(nbg_ctx *ctx, const float *image, int fpixels, int spixels, const int roi[4], double scale,
                  double adc, uint16_t *out);

/* Poisson noise image, bit-for-bit as nanoBragg makes it for the same seed: within the ROI, in row-major
 * order, n = Poisson(v) + adc, truncated, clipped at 65535 (counted in *overloads); outside, 0.
 * *photons receives the sum of n (photons and overloads may be NULL).  NBG_EINVAL as for nbg_int_image, and for
 * a negative or non-finite pixel. */
int nbg_noise_image(nbg_ctx *ctx, const float *image, int fpixels, int spixels, const int roi[4], double adc,
                    long seed, uint16_t *out, long *photons, long *overloads);


/* ---------------------------------------------------------------------------------------------------------- */
/* The experiment as the field's files describe it: DIALS's models, NeXus/NXmx, CBF, experiment lists       */
/* ---------------------------------------------------------------------------------------------------------- */

/* One experiment (single panel, rotation scan) in DIALS's laboratory frame, the frame of dxtbx's models, of
 * NXmx (McStas) and of imgCIF: the beam travels along -z (or near it, as dials.index and dials.refine leave it).
 * nbgrad's own frame depends on the convention (the beam travels along +x in MOSFLM's, +z in XDS's);
 * nbg_geometry_from_report applies the one rotation that takes the beam to -z (about the axis beam x -z; for a
 * beam along +z, 180 deg about x), to every vector alike, so that the description is physically the same
 * experiment.  An experiment whose frame is already DIALS's (nbg_experiment.dials_frame: built from a list or a
 * file by nbg_experiment_from_geometry) is not turned: its vectors are given as they are, a beam off -z too.  Lengths in mm, wavelength in Angstrom, angles in degrees.
 * Every vector is a unit vector unless said otherwise. */
typedef struct {
    /* --- detector (one flat panel) --- */
    int fpixels, spixels;
    double pixel_f, pixel_s;          /* pixel size along fast and slow, mm */
    double fast[3], slow[3];          /* the panel's axes */
    double origin[3];                 /* the corner of pixel (0,0) (not its centre), mm from the sample */
    double thickness;                 /* sensor thickness, mm (0: none) */
    double mu;                        /* sensor linear attenuation coefficient, 1/mm (0: unknown) */
    char material[16];                /* sensor material, e.g. "Si" ("" unknown) */
    int sensor_model;                 /* how nbgrad renders the sensor (nbg_sensor_model), where nbgrad wrote the
                                         list: nbg_geometry_from_report sets it, a list keeps it under a key of
                                         nbgrad's own; 0 (the other sources): the physical model */
    int sensor_layers;                /* the sensor's layers as nbgrad rendered them (0: not stated) */
    double saturation;                /* the first value that is an overload, counts (the trusted range's top) */
    double trusted[2];                /* a DIALS list's trusted_range (lo, hi) as stated, counts (NAN NAN: none
                                         stated; the other readers leave it so) */
    double pedestal;                  /* the ADC offset the data carry, counts (nanoBragg's is 40) */
    double gain;                      /* counts per photon (1) */
    int response_stated;              /* 1: a DIALS list states pedestal and gain, for panel 0 or (with panels)
                                         some panel, other than dxtbx's defaults 0 and 1 (what DIALS reads the
                                         counts with); the image readers leave 0.  nbg_experiment_from_geometry
                                         copies it with them (nbg_experiment.response_stated), and
                                         nbg_geometry_from_report sets it, with them, for such an experiment */
    /* --- beam --- */
    double direction[3];              /* from the sample towards the source (dxtbx's beam direction: -travel) */
    double wavelength;                /* Angstrom */
    double polarization_normal[3];    /* normal to the polarization plane (dxtbx) */
    double polarization_fraction;     /* fraction in the polarization plane; 0.5 = unpolarized */
    /* --- goniometer and scan --- */
    double axis[3];                   /* the rotation axis: the crystal turns right-handed about it */
    double scan_start, scan_width;    /* the first image's start angle and every image's oscillation, deg */
    int nframes;                      /* images in the scan (>= 1) */
    int scan_stated;                  /* what the source stated of the scan: 0 nothing (scan_start and scan_width
                                         are then the defaults, 0), 1 the start angle, 2 the start angle and the
                                         width.  Set by the readers and by nbg_geometry_from_report (2, or 0 for
                                         an experiment's still).  The experiment-list writer writes a geometry
                                         with 0, one image of width 0 from 0 and the default axis (1,0,0) as a
                                         still: no scan, no goniometer, an ImageSet */
    double exposure;                  /* seconds per image */
    /* --- crystal (optional) --- */
    int has_crystal;
    double real_space[9];             /* a, b, c (rows), Angstrom, at scan angle 0 (dxtbx's A = (a b c)^-1) */
    char space_group[32];             /* Hall symbol, " P 1" unless known */
    /* --- mosaic domains (nbgrad's own: the lists nbgrad writes carry them, so that they render the same) --- */
    int has_mosaic;                   /* the fields below are set */
    double mosaic_spread;             /* deg */
    int mosaic_domains;
    long mosaic_seed;
    double mosaic_frame[9];           /* from the frame the domains' axes were drawn in to this description's */
    int ndomain_turns;                /* the domains' own turns (nbg_experiment.domain_rot), 0: none */
    double domain_turn[NBG_MAX_DOMAIN_TURNS][9]; /* each domain's turn, a rotation in this description's frame
                                                    (row-major; the crystal's at scan angle 0, as
                                                    real_space) */
    /* --- the beam's divergence and spectrum as nbgrad samples them (nbg_experiment's fields of the same names;
     * NAN or -1 where unset; written into and read from the lists nbgrad writes) --- */
    int has_beam_sampling;
    double hdivrange, vdivrange, hdivstep, vdivstep, dispersion;
    int hdivsteps, vdivsteps, dispsteps, round_div;
    int crystal_scan_points;          /* a DIALS list's scan-varying crystal (A_at_scan_points, what dials.refine
                                         writes for a scan by default): how many A matrices it held (0: none).  The
                                         readers take the static A (real_space) and say so here, so that a caller
                                         can tell the user that the per-image orientations were not used */
    char detector[64];                /* the detector as the file names it (a miniCBF's "# Detector:" line, an SMV
                                         header's BEAMLINE); "" when it names none */
    int multi_panel;                  /* a DIALS list's image set option multi_panel (dials.import multi_panel=True:
                                         dxtbx cuts a Pilatus's one array into its modules): 1 when the list states
                                         it true.  The experiment-list writer states it when 1, so that dxtbx cuts
                                         the image the list names into the list's panels */
    nbg_goniometer goniometer;        /* a multi-axis goniometer (naxes 0: none, the single-axis goniometer of
                                         axis): a DIALS list's, an NXmx sample's chain of rotations or a full
                                         CBF's chain of goniometer axes (more than one); SMV and miniCBF leave it
                                         so.  The experiment-list writer writes one with naxes > 0 as a
                                         MultiAxisGoniometer of these axes, angles, names and scan axis, its scan
                                         axis turned where axis is no longer S unit(axes[scan_axis]) (a refined
                                         spindle: S^T axis, unit), and the crystal in its frame, (S F)^T
                                         real_space (see nbg_goniometer); the NXmx and CBF writers write the same
                                         axes as a depends_on chain (docs/formats.md) */
    /* The experiment-list writer only: a scan-varying crystal to write with the static one (real_space), as
     * A_at_scan_points, one A per image boundary (nframes + 1 of them): each point's real-space a, b, c (rows, 9
     * numbers, in real_space's frame), the caller's array; NULL (as the readers and nbg_geometry_default leave it):
     * the static crystal alone.  nbgrad refine -scan_varying -exptfile writes it. */
    const double *scan_real_space;
} nbg_geometry;

/* Sets g to the defaults the readers start from (no crystal, one frame at 0 deg, unit gain, an unpolarized beam
 * along -z; the wavelength, the saturation and the beam sampling unset: NAN or -1): a geometry to fill in by hand
 * before nbg_experiment_from_geometry. */
void nbg_geometry_default(nbg_geometry *g);

/* nbg_geometry of the experiment an nbg_describe/nbg_simulate report derived (e supplies the sensor, exposure and
 * polarization, which the report does not carry).  scan: nframes frames from the report's phi0, each osc wide. */
int nbg_geometry_from_report(nbg_ctx *ctx, const nbg_experiment *e, const nbg_report *r, int nframes,
                             nbg_geometry *g);

/* The panels of a multi-panel experiment (e->npanels of them: npanels must equal it) as nbg_geometry describes
 * the experiment: in DIALS's laboratory frame by the same rotation as nbg_geometry_from_report's (none for an
 * experiment in DIALS's frame), each with its unit fast and slow axes, the corner of its pixel (0,0) in mm from
 * the sample, its pixel size (never 0), its name and its raw_offset as given.  r is nbg_describe's report of e.  These go with the nbg_geometry of the same report to
 * nbg_write_nxmx_panels and nbg_write_expt_panels. */
int nbg_panels_from_report(nbg_ctx *ctx, const nbg_experiment *e, const nbg_report *r, nbg_panel *panels,
                           int npanels);

/* Sets e's detector, beam, spindle, scan start and width and (when g has one) crystal to describe g: the custom
 * convention with g's vectors (nbgrad's frame is then DIALS's: e->dials_frame = 1, so that nbg_geometry_from_report
 * gives the vectors back unturned), the sample pivot, pix0 = g's origin exactly, the
 * crystal as a cell and misset angles (so that both are refinable; the A matrix where that cannot reproduce g's
 * real-space vectors to 1e-9, e.g. a left-handed basis).  The other fields of e are left as they are.  Refused (NBG_EINVAL, named):
 * non-orthogonal or zero axes, a detector plane through the sample, a beam parallel to the panel, pixels of
 * different sizes along fast and slow, a crystal with a singular cell. */
int nbg_experiment_from_geometry(nbg_ctx *ctx, const nbg_geometry *g, nbg_experiment *e);

/* Turns g (and its npanels panels, NULL allowed) as a whole so that its beam travels along -z: the one rotation
 * about the axis beam x -z (for a beam along +z, 180 deg about x) applied to every vector alike (detector, beam,
 * polarization, axis, crystal, the mosaic domains' frame), so that it describes the same experiment.  NXmx holds
 * only such a beam (nbg_write_nxmx refuses another): the program's -nxsfile, and Python's write_nxmx, turn a
 * geometry from a DIALS list whose refined beam is off -z this way first.  Nothing changes for a beam along -z. */
void nbg_geometry_beam_to_minus_z(nbg_geometry *g, nbg_panel *panels, int npanels);

/* Re-expresses g's crystal in the setting (basis) of a reference crystal of the same lattice: the reference's
 * real-space vectors (rows a, b, c in g's frame, Angstrom, as nbg_geometry.real_space) are integer combinations of
 * g's, M (row-major, integers) is that change of basis (reference row i = sum_j M_ij g row j, determinant 1), and
 * g's real-space vectors become M times them: the same lattice, with the reference's a, b, c (the crystal size
 * Na, Nb, Nc and the structure factors' indices then refer to the reference's basis).  *misfit (may be NULL)
 * receives the largest distance of the exact change of basis from M (0 for the same crystal; it grows with the
 * angle between the two crystals and their cells' difference).  NBG_EINVAL, named, when g has no crystal, a basis
 * is singular or not finite, the change of basis is not integral within 0.25 (another lattice, or orientations
 * several degrees apart) or its determinant is not 1 (a basis of the other hand, a sub- or super-lattice); g is
 * then unchanged. */
int nbg_geometry_reindex(nbg_ctx *ctx, nbg_geometry *g, const double reference[9], int M[9], double *misfit);

/* Data types of image files. */
typedef enum { NBG_DATA_FLOAT32 = 0, NBG_DATA_INT32 = 1 } nbg_dtype;

/* NeXus NXmx (HDF5): writes nframes images (frame-major, fpixels*spixels each, float32 or int32 as dtype says),
 * the pixel mask (NULL: all good; else fpixels*spixels, nonzero = bad, written as NXmx's pixel_mask bit 0) and
 * the whole geometry of g as DIALS's FormatNXmx reads it.  Written to a temporary and renamed (nothing
 * half-written is left). */
int nbg_write_nxmx(nbg_ctx *ctx, const char *path, const nbg_geometry *g, nbg_dtype dtype, const void *frames,
                   int nframes, const uint8_t *mask);

/* The same for a multi-panel detector (npanels >= 1 panels in DIALS's frame, as nbg_panels_from_report gives
 * them; g's own panel is not written, its sensor, beam, scan and crystal are): one NXdetector_module per panel
 * (module_NN, in order), its own fast and slow pixel directions and module_offset (the panel's origin), all on
 * one stacked dataset of (nframes, rows, columns): panel p's pixels at rows from the sum of the earlier panels'
 * slow sizes (its data_origin), as many columns as its fast size (its data_size); columns beyond a narrower
 * panel's are padding (0).  frames: nframes images of the panels' concatenation (nbg_simulate's), mask (NULL:
 * all good) the same; a mask with panels of different widths is NBG_EUNSUP (DIALS 3.11's reader cannot cut it).
 * DIALS reads the file as a hierarchical detector of npanels panels.  npanels = 0 (panels NULL):
 * nbg_write_nxmx. */
int nbg_write_nxmx_panels(nbg_ctx *ctx, const char *path, const nbg_geometry *g, const nbg_panel *panels,
                          int npanels, nbg_dtype dtype, const void *frames, int nframes, const uint8_t *mask);

/* Full CBF (imgCIF with the axis categories, byte-offset compressed int32), one image: frame index `frame` of g's
 * scan (its start angle is scan_start + frame * scan_width). */
int nbg_write_cbf(nbg_ctx *ctx, const char *path, const nbg_geometry *g, int frame, const int32_t *data);

/* DIALS experiment list (.expt, JSON): g's beam, detector, goniometer, scan and crystal (when it has one); the
 * image set names images: one path (an NXmx file, or a template with # for the frame number of a file series). */
int nbg_write_expt(nbg_ctx *ctx, const char *path, const nbg_geometry *g, const char *images);

/* The same with every panel (npanels >= 1, in DIALS's frame, as nbg_panels_from_report gives them) as a detector
 * hierarchy, as dxtbx writes one: when a group (nbg_panel.group, >= 0) holds two panels or more, each group is a
 * child of the identity root with its first panel's frame, and its panels' vectors are written in that frame
 * (dials.refine can then refine the groups); otherwise every panel is the root's child, in the lab frame.  Each
 * panel's raw_image_offset is its raw_offset (where its pixels start in an image file that is one array: a list of
 * the Pilatus 12M written back still cuts the original image).  g supplies the sensor (the same for every panel)
 * and the rest of the experiment.  npanels = 0 (panels NULL):
 * nbg_write_expt. */
int nbg_write_expt_panels(nbg_ctx *ctx, const char *path, const nbg_geometry *g, const nbg_panel *panels,
                          int npanels, const char *images);

/* Reads a DIALS experiment list of one experiment with one panel into *g (fields the list lacks take their
 * defaults: no crystal, one frame).  Refused with a message naming the file and the field: several experiments or
 * panels, a missing or malformed field, a model nbgrad cannot represent (e.g. a multi-axis goniometer with
 * non-zero angles). */
int nbg_read_expt(nbg_ctx *ctx, const char *path, nbg_geometry *g);
/* The same for a detector of any number of panels: *g as nbg_read_expt fills it from panel 0, and *panels (malloc'd,
 * the caller frees it) every panel in the list's frame (DIALS's laboratory frame, mm), with its name.  A detector
 * hierarchy (dxtbx writes each panel's and group's vectors in its parent group's frame) is followed, so that every
 * panel is where dxtbx places it, also after dials.refine moved a group; a hierarchy that leaves a panel out or
 * names one twice is refused.  Each panel's group is its parent group in the hierarchy (numbered from 0 in the
 * order the hierarchy lists them; a panel under the root is a group of its own, numbered after those).  After
 * nbg_experiment_from_geometry(g) (whose frame is DIALS's), e->panels = *panels, e->npanels = *npanels and
 * e->panel_frame = NBG_PANELS_LAB render the whole detector.  A panel whose sensor differs from panel 0's (the
 * experiment's) gets its own (thick, thick_abs).  Refused besides: rectangular pixels, a panel without a sensor
 * beside panels with one.  Each panel's raw_image_offset is its raw_offset (where nbg_observed_read finds its pixels
 * in an image file that is one array).  With several panels, g's detector is panel 0's unless the beam does not
 * meet panel 0's plane in front of the sample (the Pilatus 12M's first row): then the first panel's whose plane it
 * meets inside the panel (else the first whose plane it meets), so that nbg_experiment_from_geometry can set it up;
 * the panels, in the lab frame, do not depend on it. */
int nbg_read_expt_panels(nbg_ctx *ctx, const char *path, nbg_geometry *g, nbg_panel **panels, int *npanels);
/* The scan-varying crystal of a DIALS list (its A_at_scan_points, what dials.refine writes for a scan by default:
 * one A matrix per image boundary, npoints = images + 1): *real_space (malloc'd, npoints x 9) receives each scan
 * point's real-space vectors a, b, c (rows, Angstrom) in the frame of nbg_geometry.real_space (the list's lab frame,
 * the goniometer's fixed and setting rotations applied, at scan angle 0), so that point k is the crystal of
 * nbg_geometry at the start of image k.  A static crystal gives *real_space NULL and *npoints 0.  Refused
 * (NBG_EFORMAT, naming the matrix): a matrix of other than 9 finite numbers, a singular one. */
int nbg_read_expt_scan_crystal(nbg_ctx *ctx, const char *path, double **real_space, int *npoints);

/* The geometry of an NXmx file with every module (NXdetector_module, in name order, as DIALS orders them) as a
 * panel in DIALS's frame (mm; its name nbgrad's where nbgrad wrote the file, else the module's group name): *g as
 * for one module from module 0, *panels malloc'd (the caller frees it), *npanels (1 for a one-module file).
 * Like nbg_read_expt_panels, for nbg_experiment_from_geometry and NBG_PANELS_LAB.  Refused: rectangular pixels,
 * a module whose slab (data_origin, data_size) leaves the data, what nbg_read_image refuses. */
int nbg_read_nxmx_panels(nbg_ctx *ctx, const char *path, nbg_geometry *g, nbg_panel **panels, int *npanels);
/* The panels of a full CBF file (*panels malloc'd, *npanels of them) in DIALS's laboratory frame (NBG_PANELS_LAB),
 * as dxtbx reads them: a multi-panel file (several arrays, or arrays cut into sections by
 * array_structure_list_section, as LCLS's CSPAD files) gives one panel per section (or array), in the order
 * array_structure_list names them, each framed by its surface axes and the axes they depend on, its levels
 * (level_group) the runs of axes of one equipment_component; nbg_read_image's image of it is the panels'
 * concatenation.  A one-panel file gives that panel.  g: the beam and the rest (its detector panel 0's).
 * Refused, naming what: sections spanning several planes or with a stride, a decreasing direction, surface axes
 * that are rotations or not fast-depends-on-slow, rectangular pixels, a 3-D array without sections, packed data of
 * other than 32-bit integers, anything unreadable or inconsistent (dimensions, a section past its array, an axis
 * chain with a cycle), a miniCBF of a detector whose modules the file does not place (NBG_EUNSUP, as
 * nbg_read_image refuses it: the Pilatus 12M). */
int nbg_read_cbf_panels(nbg_ctx *ctx, const char *path, nbg_geometry *g, nbg_panel **panels, int *npanels);

/* Reads one frame (0-based) of an image file, of any format nbgrad knows by its content: NXmx/HDF5, CBF, SMV, or
 * else raw float32 (which then must hold expect_npix pixels; 0 = refuse raw).  *image is malloc'd (float, the
 * pedestal left in), the caller frees it; *npix receives its size.  g, when not NULL, receives what the file says
 * of the geometry, with *have_geometry (may be NULL) set when that is the whole geometry (NXmx of one module,
 * CBF; an NXmx file of several modules gives their concatenation, in module order, and its module 0 in g).  From SMV:
 * pixel counts and size, wavelength, distance (as an origin along -z), scan (PHI, else OSC_START, and OSC_RANGE),
 * saturation 65535 and the pedestal of an ADC_OFFSET key (NAN when the header has none: nanoBragg's carry 40 without
 * saying so); from raw floats nothing.  g->scan_stated says whether the file stated the scan: a CBF's (or SMV
 * file's) scan_start is that one image's own start angle.  mask, when not NULL, receives a malloc'd
 * fpixels*spixels mask (1 = bad: the file's pixel mask, CBF's negative pixels, and every pixel at or above the
 * saturation) or NULL when no pixel is bad.  Refused (NBG_EUNSUP, naming the detector and what to do): a file of a
 * detector whose header describes one flat panel where the detector is several, placed by tables the file does not
 * carry (dxtbx's format classes for them): a Pilatus 12M miniCBF (Diamond I23's cylinder of module rows) and a
 * TimePix_SU SMV of 512 x 512 pixels (a quad of chips with wide edge pixels).  Such an image is read through
 * the DIALS experiment list of its import (nbg_observed_read with the list's panels, which say where each one's
 * pixels lie in the file: nbg_panel.raw_offset). */
int nbg_read_image(nbg_ctx *ctx, const char *path, int frame, size_t expect_npix, float **image, size_t *npix,
                   nbg_geometry *g, int *have_geometry, uint8_t **mask);

/* ---------------------------------------------------------------------------------------------------------- */
/* Observed images                                                                                             */
/* ---------------------------------------------------------------------------------------------------------- */

/* How nbg_observed_read takes an observed image (nbg_observed_options_default: every field unset). */
typedef struct {
    double pedestal;       /* counts (NAN: not given: the file's; an SMV file without ADC_OFFSET: adc; raw floats: 0) */
    double gain;           /* counts per photon, > 0 (NAN: not given: the file's when it states one > 0, else 1) */
    double read_noise;     /* counts rms, >= 0 (NAN: not given: 0) */
    double adc;            /* nanoBragg's ADC offset, what an SMV file without the ADC_OFFSET key carries (NAN: 40;
                            * the program's -adc, nbg_builder_adc) */
    const char *what;      /* the name the messages give the image by (NULL: "observed image"; the program's
                            * "-observed") */
    const char *mask_what; /* the name the messages give e->mask by (NULL: "the experiment's mask"; the program's
                            * "-mask") */
    double trusted[2];     /* the range of valid counts (lo, hi) of every pixel of a panel without its own
                            * (nbg_panel.has_trusted) and of the single detector: a count v that is not lo < v < hi
                            * is left out (DIALS's trusted_range, e.g. of the list the experiment came from); applied
                            * only when lo < hi (NAN NAN, the default, or 0 0: none) */
    /* Each panel's own detector response (nbg_panel.own_response: a module's pedestal, gain and read noise), for a
     * detector of panels: each list NULL (not given) or npanel_values values, panel by panel, and npanel_values must
     * then be the experiment's npanels (NBG_EINVAL naming the list otherwise; each value as pedestal, gain and
     * read_noise above).  A value no list gives is the panel's own where it has one (nbg_panel.own_response: a DIALS
     * list's, unless pedestal, gain or read_noise above is given), else the image's response chosen above.
     * nbg_observed.panel_response receives the result; nbg_observed_apply_response puts it on the panels. */
    const double *panel_pedestal, *panel_gain, *panel_read_noise;
    int npanel_values;
} nbg_observed_options;

/* Where a value of the detector response came from. */
typedef enum {
    NBG_FROM_DEFAULT = 0,
    NBG_FROM_OPTION = 1,
    NBG_FROM_FILE = 2,
    NBG_FROM_MODEL = 3 /* the experiment's model: a DIALS list's (nbg_experiment.response_stated) */
} nbg_value_source;

/* An observed image read for an experiment (nbg_observed_read); nbg_observed_free releases it. */
typedef struct {
    float *image;                /* npix counts as read (the pedestal in; malloc'd); a pixel left out whose value is
                                  * not a finite count >= 0 (a CBF's flags -1, -2) is 0 */
    size_t npix;                 /* the experiment's pixels (nbg_report.npix) */
    uint8_t *use;                /* npix (malloc'd): 1 = a pixel used, 0 = left out (e->mask's, the file's mask, an
                                  * overload); what nbg_experiment.mask takes */
    char file[4096];             /* the file read (frame f's of a '#' template) */
    nbg_detector_model response; /* the detector response chosen, for nbg_experiment.response */
    nbg_value_source pedestal_from, gain_from, read_noise_from; /* NBG_FROM_FILE: what the file's geometry says (SMV's
                                  * gain is its reader's 1); NBG_FROM_MODEL: the experiment's (a DIALS list's
                                  * gain and pedestal, nbg_experiment.response_stated); NBG_FROM_DEFAULT: nanoBragg's
                                  * ADC offset for SMV without ADC_OFFSET, raw floats' pedestal 0 and gain 1, read
                                  * noise 0 */
    nbg_geometry geometry;       /* what the file says of the geometry (nbg_read_image's g); geometry.scan_stated
                                  * whether it states the image's scan */
    int have_geometry;           /* the file's geometry is the whole geometry (nbg_read_image's *have_geometry) */
    double saturation;           /* the first overloaded value, counts (INFINITY: the file states none) */
    long nleft_mask, nleft_file, nleft_overload; /* the pixels left out: by e->mask, the file's mask, overloaded */
    long nleft_trusted;          /* ... and outside the trusted range (nbg_panel.trusted, opt->trusted) */
    long nnegative;              /* pixels used whose count is below 0 (dark-subtracted data) */
    /* What a program tells its user, one line each without a newline ("" when nothing to say): the response and
     * where each value came from; a note on counts below 0; the pixels left out. */
    char response_text[4352], note[4608], left_out[320];
    /* Each panel's own response when the options or the experiment's panels gave one (npanel_response = the
     * experiment's npanels, malloc'd); NULL and 0 otherwise.  response_text then also says what panel 0's is. */
    nbg_detector_model *panel_response;
    int npanel_response;
} nbg_observed;

/* The options unset: pedestal, gain, read_noise, adc and trusted NAN, what and mask_what NULL, no panel lists. */
void nbg_observed_options_default(nbg_observed_options *opt);

/* Puts the detector response nbg_observed_read chose on the experiment: e->response = ob->response and, when ob
 * has the panels' own (ob->panel_response), each of panels[0 .. npanels) marked own_response with its own.  panels is
 * the caller's writable array that e->panels points to (npanels = e->npanels; NBG_EINVAL otherwise); it may be NULL
 * when ob has no panel responses.  The mask (ob->use) is the caller's to set. */
int nbg_observed_apply_response(nbg_ctx *ctx, const nbg_observed *ob, nbg_experiment *e, nbg_panel *panels,
                                int npanels);

/* Reads the observed image for experiment e: frame `frame` (0-based) of path (a run of '#' in the name: the file of
 * that frame's 1-based number, e.g. img_####.cbf, read at its frame 0; otherwise frame `frame` of the one file, an
 * NXmx series), any format nbg_read_image knows, raw floats of e's pixel count included.  The policy nbgrad's grad
 * and refine apply: the image must have e's pixels (and a file that states its dimensions the single detector's);
 * the response is opt's pedestal, gain and read noise where given, else the experiment's where its model states
 * them (nbg_experiment.response_stated, a DIALS list's, and a panel's own where the list gives one; not for raw
 * floats, which no list's image set is), else the file's, else nanoBragg's (an SMV file without ADC_OFFSET carries
 * opt->adc, 40), gain 1 and read noise 0; the pixels left out are e->mask's (0), the file's mask and those at or
 * above the file's saturation; a pixel used must hold a finite value (NBG_EINVAL naming the first and counting
 * them).  opt may be NULL (nbg_observed_options_default).  The caller applies the result:
 * e->response = out->response, e->mask = out->use (a later frame of a series usually keeps the first frame's
 * response, and takes the first frame's use as e->mask).  Never prints: on failure the status (NBG_EIO, NBG_EINVAL,
 * NBG_ENOMEM) with the message in nbg_errmsg(ctx), and *out empty (nothing to free); on success *out is to be freed
 * with nbg_observed_free. */
int nbg_observed_read(nbg_ctx *ctx, const nbg_experiment *e, const char *path, int frame,
                      const nbg_observed_options *opt, nbg_observed *out);
/* Frees what out holds (image, use) and empties it; NULL is fine. */
void nbg_observed_free(nbg_observed *out);

/* ---------------------------------------------------------------------------------------------------------- */
/* Shot lists: many still shots of one base experiment                                                        */
/* ---------------------------------------------------------------------------------------------------------- */

/* A shot list is JSON lines (docs/many-shots.md): one object a line naming what differs from the base experiment
 * (an nbg_builder's), keys id (required, unique: letters, digits, '-', '_', '.' or a non-negative integer), misset,
 * orient, A, cell, N, mosaic, mosaic_domains, lambda, phi, fluence, scale, seed, sourcefile, spectrum_shift,
 * spectrum_scale, expt.  Blank lines and '#' lines are skipped.  Lists need jansson (a FORMATS=0 build: NBG_EUNSUP). */
enum {
    NBG_SHOT_MISSET = 1 << 0, NBG_SHOT_A = 1 << 1, NBG_SHOT_CELL = 1 << 2, NBG_SHOT_N = 1 << 3,
    NBG_SHOT_MOSAIC = 1 << 4, NBG_SHOT_DOMAINS = 1 << 5, NBG_SHOT_LAMBDA = 1 << 6, NBG_SHOT_PHI = 1 << 7,
    NBG_SHOT_FLUENCE = 1 << 8, NBG_SHOT_SCALE = 1 << 9, NBG_SHOT_SEED = 1 << 10, NBG_SHOT_SOURCE = 1 << 11,
    NBG_SHOT_EXPT = 1 << 12, NBG_SHOT_SPECTRUM_SHIFT = 1 << 13, NBG_SHOT_SPECTRUM_SCALE = 1 << 14,
    NBG_SHOT_ORIENT = 1 << 15
};

/* One line of a shot list: the keys it gave (has, NBG_SHOT_* bits) and their values (N: the three counts, a
 * single number given for all three). */
typedef struct {
    char id[64];
    unsigned has;
    double misset[3], orient[3], A[9], cell[6], N[3], mosaic, lambda, phi, fluence, scale, spectrum_shift,
        spectrum_scale;
    int mosaic_domains;
    long seed;
    char *sourcefile;        /* a nanoBragg source file, as given (relative to the working folder) */
    char *expt;              /* a DIALS experiment list, its path resolved against the list's folder */
    int line;                /* the line of the list */
    unsigned long long hash; /* 64-bit FNV-1a of the line's object, keys sorted, text compact */
} nbg_shot;

/* A shot list read (nbg_shots_read); nbg_shots_free releases it. */
typedef struct {
    nbg_shot *v;
    int n, cap;
    char *path; /* the file it was read from (malloc'd): messages name it */
} nbg_shot_list;

/* Reads a shot list into *out (zero it first or pass one freed).  NBG_EIO (the file), NBG_EFORMAT (a line that is
 * not JSON), NBG_EINVAL (an unknown key, a value of the wrong type, a missing or repeated id, no shots) naming the
 * file, the line and the key; *out empty on failure. */
int nbg_shots_read(nbg_ctx *ctx, const char *path, nbg_shot_list *out);
void nbg_shots_free(nbg_shot_list *l); /* NULL-safe; leaves *l empty */

/* What nbg_shots_make draws (nbg_shots_make_options_default: 1 shot, seed 1, nothing but the orientation). */
typedef struct {
    long n;             /* shots, 1 to 1e8 */
    long seed;          /* the same seed, the same list (1) */
    int have_cell;      /* every shot gets a cell drawn around cell[] (Gaussian lengths, cell_jitter % rms) */
    double cell[6];
    double cell_jitter; /* percent rms (0) */
    double N;           /* > 0: every shot gets N drawn around it (N_jitter % rms) (0: none) */
    double N_jitter;
    double scale_jitter; /* > 0: every shot gets a scale around 1, Gaussian, percent rms (0: none) */
} nbg_shots_make_options;
void nbg_shots_make_options_default(nbg_shots_make_options *o);
/* Writes a shot list of o->n shots in uniformly random orientations (ids shot000001 ..., misset angles) to path,
 * atomically: what `nbgrad shots` writes, byte for byte.  NBG_EINVAL for options out of range (a jitter without
 * its value), NBG_EIO; NBG_EUNSUP without jansson. */
int nbg_shots_make(nbg_ctx *ctx, const nbg_shots_make_options *o, const char *path);

/* The experiment of one shot: the builder's experiment with the shot's keys applied (its experiment list first, as
 * -expt: crystal, beam and detector, multi-panel included, and its mosaic domains' own turns; then the other keys;
 * a source file read), with what it points to that the builder does not own. */
typedef struct {
    nbg_experiment e;        /* points into the builder (table, mask, ...) and at sources and panels below */
    nbg_source *sources;     /* the shot's source file's (malloc'd), or NULL */
    int nsources;
    nbg_panel *panels;       /* the panels of the shot's own experiment list (malloc'd), or NULL */
    double *domain_rot;      /* its mosaic domains' own turns (malloc'd; e.domain_rot), or NULL */
    size_t npix;             /* the shot's image size (nbg_report.npix of e) */
    long seed;               /* the shot's noise seed: its "seed", else base_seed + its index */
    char warning[512];       /* "" or a warning for the user (an experiment list's scan-varying crystal) */
} nbg_shot_experiment;
/* Makes shot i (0-based) of list l over builder b's experiment (b parsed and loaded; base_seed the seed of shots
 * without one, the program's -seed or 1).  NBG_EINVAL / NBG_EIO naming the list, the line and the shot (a file
 * that cannot be read, an experiment list without a crystal, a -mask the shot's detector does not fit); on
 * success free *out with nbg_shot_experiment_free; it must not outlive b. */
int nbg_shot_experiment_make(nbg_ctx *ctx, nbg_builder *b, const nbg_shot_list *l, int i, long base_seed,
                             nbg_shot_experiment *out);
void nbg_shot_experiment_free(nbg_shot_experiment *x); /* NULL-safe */

/* ---------------------------------------------------------------------------------------------------------- */
/* Ensemble refinement: many shots together                                                                    */
/* ---------------------------------------------------------------------------------------------------------- */

/* How the shots of an ensemble are spread over processes (MPI ranks, or anything else): process rank of size
 * holds shots rank, rank + size, ...  Every process calls nbg_ensemble with the same builder flags, list and
 * options; the library calls the hooks collectively (every process the same calls in the same order), and every
 * process gets the same result, bit for bit, whatever size (the per-shot vectors are gathered and added in shot
 * order).  A hook returns 0 on success, non-zero on a failure (nbg_ensemble then fails with NBG_EIO).  NULL
 * (nbg_ensemble_options.comm): one process holds every shot.  The library itself does not depend on MPI: the
 * program passes hooks over MPI_Allreduce and MPI_Allgatherv. */
typedef struct {
    int rank, size;
    void *user;
    /* values (n longs, the same n on every process) reduced in place over the processes: op 0 the sum, 1 the max */
    int (*allreduce_long)(void *user, long *values, int n, int op);
    /* every process's block of doubles (mine: count doubles; process r's: counts[r] doubles) into all, process r's
     * at all + displs[r], on every process (MPI_Allgatherv's contract) */
    int (*allgatherv)(void *user, const double *mine, int count, double *all, const int *counts, const int *displs);
} nbg_comm;

/* What an ensemble reports as it goes (nbg_ensemble_options.progress): a line for the user (INFO: the set-up and
 * the spot regions; the program prints it on stdout), a warning (a shot's experiment list), a cycle's loss
 * (CYCLE: done cycles of total, cycle 0 the start), one shot's local fit (SHOT: many; the program shows them on a
 * terminal only).  INFO, CYCLE and SHOT come on process 0 only, a WARNING on the process that holds the shot. */
typedef enum { NBG_ENSEMBLE_INFO = 0, NBG_ENSEMBLE_WARNING, NBG_ENSEMBLE_CYCLE, NBG_ENSEMBLE_SHOT } nbg_ensemble_event;

typedef struct {
    const char *observed;   /* the shots' observed images: a file name with {id} (each shot's id) in it */
    const char *global;     /* parameters every shot shares, comma-separated: "F" (the whole table of the builder's
                               -hkl) and any of nbg_params_parse's words (cell ...) */
    const char *local;      /* parameters of each shot (NULL or "": none), e.g. "rotx,roty,rotz,scale" */
    int cycles;             /* cycles of local fits then a global step, 1 to 1000 (4) */
    nbg_loss loss;          /* the loss summed over the shots (NBG_LOSS_POISSON) */
    int spots;              /* >= 0: fit each shot on its spot regions, the pixels within spots of its model's spot
                               pixels (nbg_spot_pixels), drawn again after every cycle's local fits; -1 every pixel */
    double spot_frac;       /* a spot pixel's model value above the floor, of the peak's, in (0, 1) (0.05) */
    const nbg_observed_options *response; /* the observed images' detector response, as nbg_observed_read takes it
                               (pedestal, gain, read noise, each panel's own; its adc, what, mask_what and trusted
                               are the ensemble's own): NULL, the default, the files' or nanoBragg's */
    const nbg_comm *comm;   /* NULL: one process */
    void (*progress)(void *user, nbg_ensemble_event what, int done, int total, const char *text);
    void *user;
} nbg_ensemble_options;

/* An ensemble's outcome (every process the same); nbg_ensemble_result_free releases it. */
typedef struct {
    int nshots, nranks;
    double start_loss, loss;        /* the summed loss before and after */
    int nglobals;                   /* the global parameters but F */
    nbg_param *globals;
    double *global_value, *global_sigma; /* sigma NAN where the information is 0 */
    int has_F;                      /* "F" was global: */
    size_t nF;                      /* the table's entries (nbg_hkl's storage order) */
    double *F, *F_sigma;            /* the refined table and its standard errors (NAN: measured by no shot) */
    long F_measured;                /* entries with a standard error */
    int nlocals;
    nbg_param *locals;
    double *local_value;            /* nshots x nlocals, in shot order */
    int local_not_converged;        /* shots whose last local fit did not converge */
    long spot_pixels, spot_total, spot_whole; /* -spots: the regions' pixels over the shots, the shots' pixels,
                                                 the shots without a spot (fitted on every pixel) */
    long evaluations;               /* loss and gradient passes over this process's shots */
    /* where this process's time went (wall-clock seconds; not part of the result proper: it differs from run to
     * run): the first pass (the starting loss and gradient over its shots: one adjoint pass, the unit the others
     * are measured in), the local fits, and the global steps (their evaluations - 1 passes and the exchanges) */
    double seconds_first_pass, seconds_local, seconds_global;
} nbg_ensemble_result;

void nbg_ensemble_options_default(nbg_ensemble_options *o);
void nbg_ensemble_result_free(nbg_ensemble_result *r); /* NULL-safe; zeroes it */

/* Refines the shots of list l (shot i the builder's experiment with line i applied, nbg_shot_experiment_make, its
 * observed image read by nbg_observed_read with the builder's -mask and -adc) together, by alternating cycles: 1.
 * each shot's local parameters by Levenberg-Marquardt (nbg_refine, 30 iterations at most) with the globals fixed;
 * 2. the globals over all shots: with the Poisson loss and F the only global, expectation-maximisation on F (50
 * steps at most), otherwise BFGS on the summed loss (40 iterations at most).  Standard errors of the globals are
 * conditional on the other parameters (F's from the Poisson information, each pixel seeing one reflection).  On
 * success the builder's F table holds the refined F.  Requires GSL (NBG_EUNSUP in a GSL=0 build).  A failure:
 * its status with the message naming the shot (on the process that failed; the others: "another process
 * failed"), *res empty. */
int nbg_ensemble(nbg_ctx *ctx, nbg_builder *b, const nbg_shot_list *l, const nbg_ensemble_options *opt,
                 nbg_ensemble_result *res);

#ifdef __cplusplus
}
#endif
#endif /* NBGRAD_H */
