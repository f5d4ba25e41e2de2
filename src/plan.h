/*
 * plan.h -- the setup step: experiment (user units) -> kernel parameters (SI), once per call, on the host.
 */
#ifndef NBG_PLAN_H
#define NBG_PLAN_H

#include "internal.h"
#include "physics.h"
#include "setup.h"

/*
 * The experiment as DIALS describes it, in the laboratory frame (SI units: m, rad): the beam with its sources, the
 * detector with its panels, the goniometer with its scan, the crystal with its mosaic domains.  The set-up's first
 * half reads nanoBragg's flags into it (the convention, beam centre, pivot, rotations, misset and automatic
 * sampling resolved once); its second half builds the kernels' inputs from it and the rendering options alone
 * (nbgi_plan_kernels).  The gradient's chain rule reads it too.
 */
typedef struct {
    double b[3];            /* direction of propagation (unit), as the convention places it, before the tilts */
    double pol[3];          /* polarization axis (unit): the incident E vector's */
    double sb[3], spol[3];  /* b and pol turned by the beam tilts (nbg_experiment.beam_tilt): what the sources use */
    double tilt_axes[6];    /* the tilts' axes as they act: R(w2, t2) w1 and w2 (the gradient turns everything
                               else about them) */
    double lambda0;         /* the nominal wavelength (m; the crystal's, for a -mat) */
    double lambda_min;      /* the shortest source wavelength (m) */
    double polarization;    /* Kahn factor */
    int nopolar;            /* no polarization factor at all */
    double fluence, flux;   /* photons/m^2, photons/s */
    int nsrc;               /* sources: the divergence grid x the wavelength steps, or a source file's */
    double *pos;            /* nsrc x 4: position (m, the sample at the origin) and wavelength (m) */
    double *lamrel;         /* nsrc: d lambda_i / d lambda0 (0 for a wavelength given in a source file) */
    double *dscale;         /* nsrc: d lambda_i / d spectrum_scale (m): lambda_i0 - the mean (in lamrel's block) */
} nbgi_lab_beam;

typedef struct {
    double pixel;             /* m */
    int fpixels, spixels;     /* the flat detector's (the plane's, with panels) */
    nbgi_det_out_d g;         /* the flat detector placed: pix0, f, s, o, distances, beam spot and near point */
    nbgi_det_in_d in;         /* how the flags placed it (convention, pivot, rotations), for the chain rule */
    double thick, thickstep, mu; /* the sensor: m, m, 1/m */
    int thicksteps;
    double own_step;             /* with no sensor of the experiment's (thick 0): a panel's own sensor's layer step
                                    as a fraction of its thickness (the rule an experiment's sensor would follow) */
    int physical;                /* the sensor's physical model (NBG_SENSOR_PHYSICAL), else nanoBragg's */
    int npanels;              /* 0: the flat detector alone */
    nbgi_kpanel *panels;      /* npanels panels in the lab (their sensors resolved), NULL for the flat detector */
    double *motion_t;         /* with panel motions: the panels' tangents along their group's motion */
    long npix;                /* pixels of the image (all panels') */
    int nrows;                /* rows of all panels */
} nbgi_lab_detector;

typedef struct {
    double axis0[3];        /* the rotation axis (unit) as placed, before its tilts */
    double axis[3];         /* tilted by nbg_experiment.spindle_tilt */
    double tilt_axes[6];    /* the tilts' axes v1, v2 */
    int nphi;               /* the scan's phi steps */
    double *phi;            /* nphi angles (rad) */
} nbgi_lab_goniometer;

typedef struct {
    double a0[9];           /* real-space a, b, c (m) before the spindle and mosaic rotations */
    double astar[9];        /* a*, b*, c* (1/A), unrotated */
    double misset[3];       /* rad, the misset applied (drawn when random) */
    double N[3];            /* size in cells along a, b, c */
    double fudge;           /* the lattice factor's sharpness */
    int shape;              /* nbg_shape */
    const nbg_hkl *hkl;     /* structure factors, or NULL for default_F */
    double default_F;
    int interpolate;        /* tricubic interpolation of F, resolved */
    double dmin;            /* m, 0: no resolution cut */
    double water;           /* the water background's path (m), 0: none */
    double spread;          /* mosaic spread (rad) */
    int domains;
    double *umat;           /* domains x 9 rotations (row-major); domain 0 the identity */
    double *mos_axis;       /* domains x 3 axes */
    double *mos_angle;      /* domains angles (rad) */
    double *domrot;         /* ndomrot x 9: each domain's own turn D, about the lab's axes at phi 0 (the crystal's:
                               the spindle turns it), or NULL: abc = U Rot(phi) D a0 */
    int ndomrot;            /* the domains with a turn (nbg_experiment.ndomain_rot), 0 without */
} nbgi_lab_crystal;

typedef struct {
    nbgi_lab_beam beam;
    nbgi_lab_detector det;
    nbgi_lab_goniometer gon;
    nbgi_lab_crystal xtal;
} nbgi_lab;

/* How the model is rendered: what is no part of the experiment but of its simulation. */
typedef struct {
    int oversample;           /* subpixels a side, resolved */
    int roi[4];               /* xmin, xmax, ymin, ymax (-1: the edge) */
    const uint8_t *mask;      /* or NULL */
    int curved, point_pixel;
    int os_thick, os_polar, os_omega;
    const uint32_t *pixels;   /* a pixel list, or NULL */
    long npixels_list;
} nbgi_render;

typedef struct {
    nbgi_kparams k;       /* what the kernels read; its arrays point into the model's and the buffers below */
    nbg_report rep;       /* what the setup derived, in user units */
    nbgi_lab lab;         /* the experiment in the lab frame: what the kernels' inputs are built from */
    nbgi_render render;   /* and how it is rendered */
    double *src;          /* nsources * NBG_SRC_STRIDE */
    double *abc;          /* nphi * nmos * 9 */
    float *abc_f;         /* abc rounded to float, for the CPU's float forward (nbgi_kparams.abc_f) */
    nbgi_run *runs;       /* k.nruns runs of the pixel list (NULL without one) */
} nbgi_plan;

/* Builds the plan: the model from the experiment's flags (nbgi_plan_lab), then the kernels' inputs from the model
 * (nbgi_plan_kernels).  On failure the plan holds nothing to free and ctx carries the message. */
int nbgi_plan_build(nbg_ctx *ctx, const nbg_experiment *e, nbgi_plan *pl);
/* The second half alone: pl->k, pl->src, pl->abc and pl->runs (rebuilt) from pl->lab and pl->render (whose
 * arrays must outlive the plan) alone; the model is left as it is.  A caller that edits or fills the model renders
 * it so; on failure nbgi_plan_free still releases everything. */
int nbgi_plan_kernels(nbg_ctx *ctx, nbgi_plan *pl);
void nbgi_plan_free(nbgi_plan *pl);

/* Runs the forward kernel of the context's backend on a built plan (simulate.c); fails (nbgi_image_check) when
 * the image is not finite. */
int nbgi_forward_plan(nbg_ctx *ctx, nbgi_plan *pl, float *image);
/* The same with image_d (NULL: none) receiving the values unrounded: the CPU's double kernel, whatever the
 * context's backend and precision. */
int nbgi_forward_plan_d(nbg_ctx *ctx, nbgi_plan *pl, float *image, double *image_d);

/* NBG_OK when every pixel of the plan's image is finite; otherwise NBG_EINVAL with a message that counts the
 * non-finite pixels and names the likely cause (intensities beyond single precision: fluence, F, N; or a
 * non-finite intermediate).  sum is the image's sum in double when the caller has it, NAN to scan. */
int nbgi_image_check(nbg_ctx *ctx, const nbgi_plan *pl, const float *image, double sum);

/* The image model M = scale * I + B (src/model.c; see nbg_experiment).  The background plane's coordinates are in
 * units of NBG_BG_UNIT pixels from the detector centre.  The image-level parameters are the table's NBGI_S_MODEL
 * rows (param.h). */
#define NBG_BG_UNIT 1000.0
/* 1 when the model is the identity (scale 1, no background): images are then the simulation's bit for bit. */
int nbgi_model_is_identity(const nbg_experiment *e);
/* Pixel i's background coordinates x (fast), y (slow). */
void nbgi_model_xy(const nbgi_kparams *k, size_t i, double *x, double *y);
/* Whether pixel i is rendered (ROI and mask). */
int nbgi_model_active(const nbgi_kparams *k, size_t i);
/* B_i. */
double nbgi_model_bg(const nbg_experiment *e, const nbgi_kparams *k, size_t i);
/* image = scale * image + B over the active pixels (nothing when the model is the identity). */
void nbgi_model_apply(const nbg_experiment *e, const nbgi_kparams *k, float *image);
/* The k-th smallest (0-based) of v[0..n), n > k, v reordered (src/floor.c): quickselect. */
double nbgi_kth(double *v, size_t n, size_t k);

/* One pixel's loss term (weight 1) for model value M (photons) against the observed count obs, with the detector
 * response r (see nbg_loss): returns the term, *dLdM its derivative in M and, when c is not NULL, *c the
 * Gauss-Newton curvature (2 for least squares, the Fisher information 1 / (M + s) for Poisson). */
double nbgi_pixel_loss(nbg_loss loss, const nbg_detector_model *r, double M, double obs, double *dLdM, double *c);

/* The detector response of each pixel: the experiment's, or its panel's own (nbg_panel.own_response).  A cursor
 * over the image's pixels, cheapest when they come in increasing order (as every loop over the image or a pixel
 * list visits them): nbgi_response_init, then nbgi_response_at(&c, i) for pixel i. */
typedef struct {
    const nbg_experiment *e;
    int any;          /* some panel has its own response */
    int q;            /* the current panel (-1 before the first) */
    long start, end;  /* its pixels [start, end) */
} nbgi_response_cursor;

static inline void nbgi_response_init(nbgi_response_cursor *c, const nbg_experiment *e)
{
    c->e = e;
    c->any = 0;
    for (int q = 0; e->panels != NULL && q < e->npanels; ++q) {
        c->any |= e->panels[q].own_response != 0;
    }
    c->q = -1;
    c->start = c->end = 0;
}

static inline const nbg_detector_model *nbgi_response_at(nbgi_response_cursor *c, size_t i)
{
    if (!c->any) {
        return &c->e->response;
    }
    if ((long)i < c->start) {
        c->q = -1;
        c->start = c->end = 0;
    }
    while ((long)i >= c->end && c->q + 1 < c->e->npanels) {
        ++c->q;
        c->start = c->end;
        c->end += (long)c->e->panels[c->q].fpixels * c->e->panels[c->q].spixels;
    }
    const nbg_panel *p = &c->e->panels[c->q];
    return p->own_response ? &p->response : &c->e->response;
}

/* Fills the crystal set-up's inputs from an experiment (cell defaults applied, angles in radians). */
void nbgi_plan_xtal_in(const nbg_experiment *e, const double misset_rad[3], double lambda0, nbgi_xtal_in_d *in);

/* Small vector helpers shared by the setup and the host-side chain rules. */
void nbgi_rotate_xyz(const double v[3], double rx, double ry, double rz, double out[3]);
/* A mosaic domain's own turn (nbg_experiment.domain_rot: r deg about x, y, z) as the rotation D = Rz Ry Rx
 * (row-major); and back, the angles of such a rotation (ry within +-90 deg). */
void nbgi_domain_turn_matrix(const double r[3], double D[9]);
void nbgi_domain_turn_angles(const double D[9], double r[3]);
/* v rotated by phi (radians) about ax (as given), as the spindle turns the crystal. */
void nbgi_rotate_axis(const double v[3], const double ax[3], double phi, double out[3]);
void nbgi_cross(const double a[3], const double b[3], double out[3]);
double nbgi_dot(const double a[3], const double b[3]);
double nbgi_norm(const double a[3]);
/* The inverse of the 3x3 matrix m (row-major) into out; 0 (out untouched) when m is singular or its inverse is not
 * finite. */
int nbgi_inverse3(const double m[9], double out[9]);

#endif
