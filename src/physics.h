/*
 * physics.h -- the per-sample physics of nbgrad, in one place, for every kernel.
 *
 * Everything here is a `static inline` function marked NBG_HD, so the CPU forward kernel, the CPU adjoint, and
 * the CUDA kernels all call the same code: they cannot drift apart.  The functions come in two precisions
 * generated from physics_tmpl.h: suffix _d (double) and _f (float).
 *
 * Units inside kernels are SI: metres, 1/metres, radians.  Miller indices are dimensionless.
 *
 * The lattice factor of a parallelepiped crystal of N cells along an axis is sincg(pi h, N) = sin(N pi h) /
 * sin(pi h).  nbgrad evaluates it relative to the nearest integer, d = h - rint(h):
 *     sin(N pi h) / sin(pi h) = (-1)^((N-1) rint(h)) sin(N pi d) / sin(pi d)
 * which is exact for integer N (the sign disappears when squared), accurate in float near Bragg peaks, and
 * smooth in N for the gradient with respect to a continuous crystal size (nanoBragg's form has poles there).
 */
#ifndef NBG_PHYSICS_H
#define NBG_PHYSICS_H

#include <math.h>
#include <stdint.h>
#include <string.h> /* memcpy: nbgi_exp's bits */

#include "hd.h"

/* Physical constants, with their source. */
#define NBG_RE2 7.94079248018965e-30       /* classical electron radius squared, m^2 (nanoBragg's value) */
#define NBG_AVOGADRO 6.02214179e23          /* 1/mol (CODATA 2006, nanoBragg's value) */
#define NBG_DEFAULT_FLUENCE 1.25932015286227086e29 /* photons/m^2: r_e^2 * fluence = 1 */
#define NBG_ROUND_SCALE 0.723601254558268   /* sqrt of the cube-to-sphere volume ratio for round crystals */

enum { NBG_SQUARE = 0, NBG_ROUND = 1, NBG_GAUSS = 2, NBG_TOPHAT = 3 };

/*
 * One panel of a multi-panel detector as the kernels see it: where its pixels lie in the image and in the lab, and
 * (for the adjoint and tangent kernels) how its vectors derive from the detector plane's.  A kernel renders a panel
 * through its view (nbgi_panel_view, src/geometry.h): the whole detector's parameters with the panel's geometry in
 * the detector fields, so that every per-pixel formula reads a panel exactly as it reads the single detector.
 */
typedef struct {
    long offset;                    /* the image index of the panel's pixel (0,0) */
    int row0;                       /* the panel's first row among all panels' rows (rows in panel order) */
    int fpixels, spixels;
    double pix0[3], fdet[3], sdet[3], odet[3]; /* m; unit vectors */
    double close_distance;          /* pix0 . odet, m */
    double pixel;                   /* m */
    double thick, thickstep, mu;    /* its sensor: m, m, 1/m (the experiment's unless it has its own) */
    /* the panel's vectors from the plane's (f, s, o): pix0_p = pix0 + sum_j c[j] e_j, and fdet_p, sdet_p, odet_p =
     * sum_j A[3 i + j] e_j for i = 0, 1, 2 (zero for panels fixed in the lab, which the plane does not move) */
    double c[3], A[9];
    int in_plane;                   /* the panel moves with the plane (NBG_PANELS_PLANE) */
} nbgi_kpanel;

/* A panel's detector quantities as the gradient kernels accumulate them: pix0, f, s, o (3 each) and the close
 * distance (grad/adjoint.h's NBG_ADJ_DET). */
#define NBGI_PANEL_NT 13

/* A run of a pixel list: pixels f0 .. f0+n-1 of row r (among all panels' rows), list entries pos .. pos+n-1. */
typedef struct {
    int r, f0, n;
    long pos;
} nbgi_run;

/*
 * The plan's kernel parameters: everything a kernel needs, as plain data and plain arrays.  The plan builds it
 * once per call on the host; for CUDA, the array pointers point to device memory.
 */
typedef struct {
    /* detector */
    int fpixels, spixels, oversample, thicksteps;
    int roi_xmin, roi_xmax, roi_ymin, roi_ymax;
    const uint8_t *mask;            /* fpixels*spixels or NULL */
    double pix0[3], fdet[3], sdet[3], odet[3], beam[3];
    double pixel, subpixel;         /* m */
    double close_distance, distance;/* m */
    int curved, point_pixel;
    int os_thick, os_polar, os_omega;
    double thick, thickstep, mu;    /* m, m, 1/m */
    int sensor_phys;                /* the sensor's physical model (src/geometry.h: nbgi_layer_at, nbgi_capture) */
    /* sources */
    int nsources;
    const double *src;              /* per source: incident unit vector (3), lambda (m), E_in (3), B_in (3): 10 */
    double polarization;            /* Kahn factor */
    int nopolar;
    /* crystal: real-space vectors a, b, c (m) per phi step and mosaic domain, 9 doubles each */
    int nphi, nmos;
    const double *abc;
    const float *abc_f;             /* abc rounded to float, once a plan (or NULL): the float kernels read them
                                       (nbgi_matrix; they had rounded them at every sample), and the CPU float
                                       forward's sum in vector registers needs them (without, its general loop) */
    double Na, Nb, Nc, fudge;
    int Ni[3];                      /* N as a small integer (<= 32) for the Chebyshev lattice factor, else 0 */
    int want_dN;                    /* adjoint: the gradient in N is wanted (the vectorised adjoint skips it
                                       otherwise; the scalar twin always computes it) */
    int shape;
    double astar[9];                /* a*, b*, c* (1/A), unrotated, for the gauss and tophat shapes */
    /* structure factors */
    const double *F;                /* dense table or NULL */
    int h_min, k_min, l_min, nh, nk, nl;
    double default_F;
    int interpolate;
    double dmin;                    /* m, 0 = none */
    /* scaling */
    double I_bg;
    int water;                      /* water background present */
    double scale;                   /* r_e^2 * fluence / steps */
    /* panels: 0 for the single flat detector (the detector fields above); else the panels, whose views the kernels
     * render (the detector fields then hold the plane's geometry, which no kernel reads) */
    int npanels, nrows;             /* nrows: rows of all panels (spixels for the single detector) */
    long npix;                      /* pixels of the image */
    const nbgi_kpanel *panels;
    /* a pixel list (nbg_experiment.pixels): the kernels walk only its pixels, as runs of neighbours within a row
     * (nbgi_walk_unit); the CUDA kernels a thread per entry, with the image and dL/dI compact on the device. */
    const uint32_t *list;           /* nlist sorted image indices, or NULL */
    long nlist;
    const nbgi_run *runs;           /* nruns runs of the list */
    long nruns;
} nbgi_kparams;

/* Per-source record layout in nbgi_kparams.src. */
#define NBG_SRC_STRIDE 10

#define NBG_TMPL NBG_TMPL_DOUBLE
#include "tmpl_on.h"
#include "physics_tmpl.h"
#include "tmpl_off.h"

#define NBG_TMPL NBG_TMPL_FLOAT
#include "tmpl_on.h"
#include "physics_tmpl.h"
#include "tmpl_off.h"

#endif
