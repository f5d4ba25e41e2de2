/*
 * plan.h -- the setup step: experiment (user units) -> kernel parameters (SI), once per call, on the host.
 */
#ifndef NBG_PLAN_H
#define NBG_PLAN_H

#include "internal.h"
#include "physics.h"
#include "setup.h"

typedef struct {
    nbgi_kparams k;       /* what the kernels read; its arrays point into the buffers below */
    nbg_report rep;      /* what the setup derived, in user units */
    double *src;         /* nsources * NBG_SRC_STRIDE */
    double *src_lamrel;  /* nsources: d lambda_i / d lambda0 (0 for a wavelength given in a source file) */
    double *src_dscale;  /* nsources: d lambda_i / d spectrum_scale (m): lambda_i0 - the mean (in src_lamrel's block) */
    double *abc;         /* nphi * nmos * 9 */
    double *umat;        /* nmos * 9 mosaic rotation matrices (row-major) */
    double *mos_axis;    /* nmos * 3 mosaic rotation axes */
    double *mos_angle;   /* nmos mosaic rotation angles (rad); domain 0 is the identity */
    double *phi;         /* nphi spindle angles (rad) */
    double a0[9];        /* real-space a, b, c (m) before the spindle and mosaic rotations */
    double spindle[3];   /* the rotation axis, tilted by e->spindle_tilt */
    double spindle0[3];  /* the rotation axis before the tilt */
    double tilt_axes[6]; /* the tilt's axes v1, v2 (nbg_experiment.spindle_tilt) */
    double beam_axes[6]; /* the beam tilts' axes as they act at the current tilts: R(w2, t2) w1 and w2 (the gradient
                            turns everything else about them: nbg_experiment.beam_tilt) */
    double lambda0;      /* m */
    double mosaic_spread;/* rad */
    double misset[3];    /* rad, the misset applied (drawn when random) */
    nbgi_det_in_d det_in; /* the detector set-up's inputs, for the gradient's chain rule */
    nbgi_kpanel *panels; /* k.npanels panels (NULL for the single detector) */
    double *motion_t;    /* with panel motions: the panels' tangents along their group's motion (nbgi_plan_panels) */
    nbgi_run *runs;      /* k.nruns runs of the pixel list (NULL without one) */
} nbgi_plan;

/* Builds the plan.  On failure the plan holds nothing to free and ctx carries the message. */
int nbgi_plan_build(nbg_ctx *ctx, const nbg_experiment *e, nbgi_plan *pl);
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
/* v rotated by phi (radians) about ax (as given), as the spindle turns the crystal. */
void nbgi_rotate_axis(const double v[3], const double ax[3], double phi, double out[3]);
void nbgi_cross(const double a[3], const double b[3], double out[3]);
double nbgi_dot(const double a[3], const double b[3]);
double nbgi_norm(const double a[3]);
/* The inverse of the 3x3 matrix m (row-major) into out; 0 (out untouched) when m is singular or its inverse is not
 * finite. */
int nbgi_inverse3(const double m[9], double out[9]);

#endif
