/*
 * adjoint.h -- reverse-mode (adjoint) kernels: per-pixel dL/dI in, gradients of the plan-level quantities out.
 */
#ifndef NBG_ADJOINT_H
#define NBG_ADJOINT_H

#include "physics.h"

#include <stddef.h>

/* Gradient accumulators of the quantities the kernel reads (one set per thread, summed in a fixed order). */
typedef struct {
    double pix0[3], f[3], s[3], o[3], close; /* detector vectors (m) and close distance (m) */
    double N[3], astar[9];                   /* crystal size; reciprocal vectors (1/A, gauss shape) */
    double K, scale, Ibg, defF;              /* Kahn factor; r_e^2 fluence / steps; water term; default_F */
    double *abc;                             /* nphi*nmos*9: real-space vectors per phi step and domain (m) */
    double *lam;                             /* nsources: wavelengths (m) */
    double *F;                               /* structure-factor table, or NULL when not wanted */
    double *lane_abc, *lane_lam;             /* scratch of the vectorised adjoint: nmat*9*8 and nsources*8 */
} nbg_adjacc;

/* Number of doubles in the fixed part of nbg_adjacc. */
#define NBG_ADJ_FIXED (offsetof(nbg_adjacc, abc) / sizeof(double))

/* One reverse pass over the image: image[p] receives the forward value (bit-identical to the forward kernel) and
 * tacc[thread] the gradients of L given dLdI.  The accumulators must be zeroed; F gradients are gathered only
 * when tacc->F != NULL.  The caller sums the nthreads sets in thread order, so the result is reproducible for a
 * given thread count.  vectorised selects the row form (adjoint_row_tmpl.h) over the scalar twin. */
void nbg_adjoint_cpu(const nbg_kparams *p, const float *dLdI, float *image, nbg_adjacc *tacc, int nthreads,
                     int vectorised);

/* Forward-mode tangents: for nt tangent directions t[j] of the plan-level quantities (see nbg_plan_tangent),
 * out[j * npix + pixel] = dI[pixel]/dtheta_j, and image the forward values. */
void nbg_jvp_cpu(const nbg_kparams *p, const nbg_adjacc *t, int nt, double *out, float *image, int vectorised);

#endif
