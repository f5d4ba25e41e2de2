/*
 * param.h -- the library's view of the parameter table (include/nbgrad_params.def): one row per scalar parameter,
 * and the helpers every other file uses instead of knowing a parameter by its position.
 */
#ifndef NBG_PARAM_H
#define NBG_PARAM_H

#include "nbgrad.h"
#include <stddef.h>

/* The set-up input a parameter's tangent moves (nbgi_plan_tangent switches on these, without a default). */
typedef enum {
    NBGI_S_CELL,     /* cell[index]: a0 and a* by the complex step on the crystal set-up */
    NBGI_S_MISSET,   /* misset[index]: the same */
    NBGI_S_ORIENT,   /* orient[index]: the same */
    NBGI_S_LAMBDA,   /* the wavelength: the crystal set-up (with -mat) and every source's lambda */
    NBGI_S_TILT,     /* spindle_tilt[index]: the spindle and the rotation it makes */
    NBGI_S_MOSAIC,   /* the mosaic spread: the domains' rotations */
    NBGI_S_DISTANCE, /* the detector set-up's distance (or close distance) */
    NBGI_S_BEAM,     /* the detector set-up's beam position along fast (0) or slow (1) */
    NBGI_S_BEAM_DIR, /* the beam's direction: beam_tilt[index] (the sources turned; by the global rotation) */
    NBGI_S_DET_ROT,  /* the detector set-up's rotation about x, y, z */
    NBGI_S_TWOTHETA, /* the detector set-up's two-theta */
    NBGI_S_DET_TAU,  /* the detector set-up's turn of the placed plane about its own normal, fast, slow axes */
    NBGI_S_N,        /* the kernel's N[index] */
    NBGI_S_POLAR,    /* the kernel's Kahn factor */
    NBGI_S_FLUENCE,  /* the kernel's scale and I_bg */
    NBGI_S_MODEL,    /* the image model: scale (0), bg (1), bg_fast (2), bg_slow (3); no kernel input */
    NBGI_S_SPECTRUM  /* the sources' wavelengths: spectrum_shift (0), spectrum_scale (1); not the crystal */
} nbgi_setup;

/* When a parameter is free (param.c's predicates). */
typedef enum {
    NBGI_FREE_ALWAYS,
    NBGI_FREE_CELL,    /* needs -cell */
    NBGI_FREE_MISSET,  /* not with -misset random */
    NBGI_FREE_N,       /* not with -samplesize */
    NBGI_FREE_MOSAIC,  /* a positive spread over several domains */
    NBGI_FREE_FLUENCE, /* not with -flux */
    NBGI_FREE_POLAR,   /* not with -nopolar */
    NBGI_FREE_PLANE,   /* the detector plane moves the pixels: not with panels in the lab frame */
    NBGI_FREE_TURNED,  /* the crystal turns about the spindle */
    NBGI_FREE_BEAMDIR, /* the beam's direction: not with panels in the lab frame or the curved detector */
    NBGI_FREE_SPECTRUM /* the spectrum's width: needs several wavelengths (soft: a zero gradient otherwise) */
} nbgi_free;

typedef struct {
    const char *name, *alias, *unit, *flag, *desc, *groups;
    size_t field; /* offset of its double in nbg_experiment */
    double lo, hi;
    int lo_open, hi_open, optional;
    double blo, bhi;
    int blo_open, bhi_open;
    double step_fixed, step_rel, step_floor;
    int step_imean;
    nbgi_setup setup;
    int index;
    nbgi_free free;
    const char *help;
} nbgi_param_row;

extern const nbgi_param_row nbgi_param_rows[NBG_NPARAMS];

/* The kinds of parameter id. */
typedef enum { NBGI_K_BAD = 0, NBGI_K_SCALAR, NBGI_K_MOTION, NBGI_K_F, NBGI_K_F_ALL, NBGI_K_DOMAIN } nbgi_kind;
/* The kind of id p (structure factors: *i the entry; motions: *g, *c; domain turns: *g the domain, *c), without
 * looking at an experiment. */
nbgi_kind nbgi_param_kind(nbg_param p, int *g, int *c, long *i);
/* Whether p is an image-level parameter (the image model's: scale, bg, bg_fast, bg_slow). */
int nbgi_param_image_level(nbg_param p);
/* Whether p is an offset from a model read from a file (the beam shift, the spindle tilts: an import resets them). */
int nbgi_param_is_offset(nbg_param p);
/* The structure-factor entries of e: the table's size, or 1 (default_F) without one. */
long nbgi_param_nF(const nbg_experiment *e);
/* The gradient check's default step for p at value x (imean: the image's mean). */
double nbgi_param_step(nbg_param p, double x, double imean);
/* NBG_OK when the list names parameters e has, each once (F_ALL only where allow_F_all); else NBG_EINVAL naming
 * the entry (what: the call's name). */
int nbgi_params_check(nbg_ctx *ctx, const nbg_experiment *e, const nbg_param *params, int n, int allow_F_all,
                      const char *what);

#endif
