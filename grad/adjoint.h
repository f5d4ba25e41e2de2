/*
 * adjoint.h -- reverse-mode (adjoint) kernels: per-pixel dL/dI in, gradients of the plan-level quantities out.
 */
#ifndef NBG_ADJOINT_H
#define NBG_ADJOINT_H

#include "geometry.h"
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
    double *panel;                           /* npanels * NBG_ADJ_DET: each panel's own detector gradients (its
                                                pix0, f, s, o, close before the fold), or NULL when not wanted */
} nbgi_adjacc;

/* Number of doubles in the fixed part of nbgi_adjacc (the CUDA backend and the thread reduction read it as a flat
 * array of doubles: every member before abc is a double). */
#define NBG_ADJ_FIXED (offsetof(nbgi_adjacc, abc) / sizeof(double))
#ifndef __cplusplus
_Static_assert(offsetof(nbgi_adjacc, abc) == 29 * sizeof(double), "nbgi_adjacc's fixed part must be 29 doubles");
#endif

/* The most tangent directions one pass of the tangent kernel carries. */
#define NBG_JVP_MAX 32

/* The detector part of nbgi_adjacc: pix0, f, s, o (3 each) and close, its first 13 doubles. */
#define NBG_ADJ_DET 13
#ifndef __cplusplus
_Static_assert(NBG_ADJ_DET == NBGI_PANEL_NT, "a panel's detector quantities are the accumulators' first 13");
#endif

/* A panel's detector quantities (pix0, f, s, o, close: 13 doubles) from the plane's, linearised: the panel's
 * vectors are pix0_p = pix0 + sum_j c_j e_j and (f, s, o)_p = A (f, s, o) with e = (f, s, o), its close distance
 * pix0_p . o_p.  Adjoint (nbgi_panel_fold): dL/d(plane) += J^T dL/d(panel), the gradients the panel's pixels
 * accumulated on its own vectors carried to the plane's.  Tangent (nbgi_panel_tangent): t(panel) = J t(plane).
 * A panel fixed in the lab (not in_plane) does not depend on the plane: nothing is carried. */
static inline NBG_HD void nbgi_panel_fold(const nbgi_kpanel *q, const double *d, double *out)
{
    if (!q->in_plane) {
        return;
    }
    double dp[3], dpo[3];
    for (int x = 0; x < 3; ++x) {
        /* close_p = pix0_p . o_p: d pix0_p += d_close o_p, d o_p += d_close pix0_p */
        dp[x] = d[x] + d[12] * q->odet[x];
        dpo[x] = d[9 + x] + d[12] * q->pix0[x];
    }
    for (int x = 0; x < 3; ++x) {
        out[x] += dp[x];
        for (int j = 0; j < 3; ++j) {
            /* e_j (j = f, s, o at out[3..5], [6..8], [9..11]) through pix0_p, f_p, s_p and o_p */
            out[3 + 3 * j + x] += q->c[j] * dp[x] + q->A[j] * d[3 + x] + q->A[3 + j] * d[6 + x] + q->A[6 + j] * dpo[x];
        }
    }
}

static inline NBG_HD void nbgi_panel_tangent(const nbgi_kpanel *q, const double *t, double *out)
{
    for (int i = 0; i < NBG_ADJ_DET; ++i) {
        out[i] = 0;
    }
    if (!q->in_plane) {
        return;
    }
    for (int x = 0; x < 3; ++x) {
        out[x] = t[x];
        for (int j = 0; j < 3; ++j) {
            const double tej = t[3 + 3 * j + x];
            out[x] += q->c[j] * tej;
            out[3 + x] += q->A[j] * tej;
            out[6 + x] += q->A[3 + j] * tej;
            out[9 + x] += q->A[6 + j] * tej;
        }
    }
    out[12] = 0;
    for (int x = 0; x < 3; ++x) {
        out[12] += out[x] * q->odet[x] + q->pix0[x] * out[9 + x];
    }
}

/* Back-propagates d_d (gradient on the unit direction) and d_R (on the distance) of a ray to the detector:
 * P = Fdet f + Sdet s + Odet o + pix0,  d = P / R:  d_P = (d_d - d (d . d_d)) / R + d_R d. */
static inline NBG_HD void nbgi_ray_adjoint(const nbgi_ray *r, const double *d_d, double d_R, nbgi_adjacc *acc)
{
    const double dd = r->d[0] * d_d[0] + r->d[1] * d_d[1] + r->d[2] * d_d[2];
    for (int x = 0; x < 3; ++x) {
        const double d_P = (d_d[x] - r->d[x] * dd) / r->R + d_R * r->d[x];
        acc->pix0[x] += d_P;
        acc->f[x] += d_P * r->Fdet;
        acc->s[x] += d_P * r->Sdet;
        acc->o[x] += d_P * r->Odet;
    }
}

/* A pixel's once-per-pixel factors, as the forward kernel takes them (without the -oversample_thick/_polar/_omega
 * running sums, which are not differentiated): the solid angle at the first subpixel, the capture fraction at
 * the last layer's first subpixel, the polarization at the first (subpixel, source) that survives the resolution
 * cut, with the rays they were taken on.  Shared by the adjoint (prologue and epilogue) and tangent kernels. */
typedef struct {
    nbgi_ray r_om, r_cap, r_pol;
    double omega, capture, cap_a, rho, polar;
    int pol_src; /* the source polar was taken on; -1 when none (-nopolar, or every sample cut) */
} nbgi_pixfactors;

static inline NBG_HD void nbgi_pixel_factors(const nbgi_kparams *p, int fpixel, int spixel, nbgi_pixfactors *pf)
{
    const int os = p->oversample;
    const int tl = p->thicksteps - 1;
    nbgi_ray_at(p, fpixel, spixel, 0, 0, 0, &pf->r_om);
    pf->omega = nbgi_solid_angle(p, pf->r_om.R);
    pf->capture = 1;
    pf->cap_a = 0;
    pf->rho = 1;
    if (p->thick != 0) {
        nbgi_ray_at(p, fpixel, spixel, 0, 0, tl, &pf->r_cap);
        pf->rho = pf->r_cap.d[0] * p->odet[0] + pf->r_cap.d[1] * p->odet[1] + pf->r_cap.d[2] * p->odet[2];
        pf->capture = nbgi_capture(p, tl, pf->rho, &pf->cap_a);
    }
    pf->polar = p->nopolar ? 1 : 0;
    pf->pol_src = -1;
    if (p->nopolar) {
        return;
    }
    for (int t = 0; t < p->thicksteps; ++t) {
        for (int subS = 0; subS < os; ++subS) {
            for (int subF = 0; subF < os; ++subF) {
                if (t == 0 && subS == 0 && subF == 0) {
                    pf->r_pol = pf->r_om; /* the first subpixel's ray, already computed */
                } else {
                    nbgi_ray_at(p, fpixel, spixel, subF, subS, t, &pf->r_pol);
                }
                for (int src = 0; src < p->nsources; ++src) {
                    double q[3];
                    if (nbgi_scatter_q(p, pf->r_pol.d, src, q)) {
                        const double *sr = p->src + NBG_SRC_STRIDE * src;
                        pf->polar = nbgi_polar_d(p->polarization, sr, pf->r_pol.d, sr + 4, sr + 7);
                        pf->pol_src = src;
                        return;
                    }
                }
            }
        }
    }
}

/* The epilogue of the adjoint: with the pixel's final sum I and its incoming gradient g (S = scale I capture polar
 * omega), back-propagates through the once-per-pixel factors into acc: the scale, the water term (d_I = g scale
 * capture polar omega), the solid angle (its ray and the close distance), the capture fraction (its ray and the
 * normal) and the polarization (its ray and K). */
static inline NBG_HD void nbgi_pixel_factors_adjoint(const nbgi_kparams *p, const nbgi_pixfactors *pf, double g,
                                                    double I, double d_I, nbgi_adjacc *acc)
{
    const double scale = p->scale;
    const double omega = pf->omega, capture = pf->capture, polar = pf->polar;
    acc->scale += g * I * capture * polar * omega;
    acc->Ibg += d_I;
    const double zero[3] = {0, 0, 0};
    {
        /* omega(R, close): d_R = d omega / dR, d_close = omega / close */
        const double d_om = g * scale * I * capture * polar;
        const double d_R = d_om * nbgi_solid_angle_dR(p, pf->r_om.R, omega);
        if (!p->point_pixel) {
            acc->close += d_om * omega / p->close_distance;
        }
        nbgi_ray_adjoint(&pf->r_om, zero, d_R, acc);
    }
    if (p->thick != 0) {
        /* capture(a), a = dz mu / rho, rho = d . o */
        const double d_cap = g * scale * I * polar * omega;
        const double d_rho = d_cap * nbgi_capture_da(p->thicksteps - 1, pf->cap_a) * (-pf->cap_a / pf->rho);
        double d_d[3];
        for (int x = 0; x < 3; ++x) {
            d_d[x] = d_rho * p->odet[x];
            acc->o[x] += d_rho * pf->r_cap.d[x];
        }
        nbgi_ray_adjoint(&pf->r_cap, d_d, 0, acc);
    }
    if (pf->pol_src >= 0) {
        const double d_pol = g * scale * I * capture * omega;
        const double *sr = p->src + NBG_SRC_STRIDE * pf->pol_src;
        double dP_dd[3], dP_dK;
        nbgi_polar_grad_d(p->polarization, sr, pf->r_pol.d, sr + 4, sr + 7, dP_dd, &dP_dK);
        double d_d[3];
        for (int x = 0; x < 3; ++x) {
            d_d[x] = d_pol * dP_dd[x];
        }
        acc->K += d_pol * dP_dK;
        nbgi_ray_adjoint(&pf->r_pol, d_d, 0, acc);
    }
}

/* One reverse pass over the image: image[p] receives the forward value (bit-identical to the forward kernel) and
 * tacc[thread] the gradients of L given dLdI.  The accumulators must be zeroed; F gradients are gathered only
 * when tacc->F != NULL, each panel's own detector gradients only when tacc->panel != NULL.  The caller sums the nthreads sets in thread order, so the result is reproducible for a
 * given thread count.  vectorised selects the row form (adjoint_row_tmpl.h) over the scalar twin. */
void nbgi_adjoint_cpu(const nbgi_kparams *p, const float *dLdI, float *image, nbgi_adjacc *tacc, int nthreads,
                     int vectorised);

/* Forward-mode tangents: for nt tangent directions t[j] of the plan-level quantities (see nbgi_plan_tangent),
 * out[j * npix + pixel] = dI[pixel]/dtheta_j, and image the forward values.  ptan (NULL: none): tangents of each
 * panel's own detector quantities, added to those the plane's carry, at [(j * npanels + k) * NBG_ADJ_DET] (panel
 * motions). */
void nbgi_jvp_cpu(const nbgi_kparams *p, const nbgi_adjacc *t, int nt, const double *ptan, double *out, float *image,
                  int vectorised);

#endif
