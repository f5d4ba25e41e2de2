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
    double *lane_abc, *lane_lam, *lane_fix;  /* the vectorised adjoint's lane accumulators (a row's, zero between
                                                rows): nmat*9*8, nsources*8 and NBG_ADJ_FIXED*8 (NBGI_FIX_*) */
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

/* Whether a tangent direction moves the detector (any of its first NBG_ADJ_DET quantities nonzero): the tangent
 * kernel skips the rays' tangents of those that do not (a crystal's, a wavelength's), which are exactly zero. */
static inline NBG_HD int nbgi_tangent_moves_detector(const nbgi_adjacc *t)
{
    const double *v = (const double *)t;
    for (int i = 0; i < NBG_ADJ_DET; ++i) {
        if (v[i] != 0) {
            return 1;
        }
    }
    return 0;
}

/* What the tangent row kernel (grad/jvp_row_tmpl.h) needs to know of its directions, found once per row rather
 * than per group of pixels: which move the detector (their rays' tangents), whether any moves the detector or the
 * Kahn factor (the once-per-pixel factors' tangents), and which leave N alone. */
typedef struct {
    int factor_tangents;
    int moves[NBG_JVP_MAX];
    int tN_zero[NBG_JVP_MAX];
} nbgi_jvp_dirs;

static inline void nbgi_jvp_dirs_of(const nbgi_adjacc *t, int nt, nbgi_jvp_dirs *d)
{
    d->factor_tangents = 0;
    for (int k = 0; k < nt; ++k) {
        d->moves[k] = nbgi_tangent_moves_detector(&t[k]);
        d->factor_tangents |= d->moves[k] || t[k].K != 0;
        d->tN_zero[k] = t[k].N[0] == 0 && t[k].N[1] == 0 && t[k].N[2] == 0;
    }
}

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
 * P = Fdet f + Sdet s + Odet o + pix0,  d = P / R:  d_P = (d_d - d (d . d_d)) / R + d_R d (nbgi_ray_dP, in
 * scalars for the lane form's loops), then pix0 += d_P, f += d_P Fdet, s += d_P Sdet, o += d_P Odet. */
static inline NBG_HD void nbgi_ray_dP(double d0, double d1, double d2, double R, double dd0, double dd1, double dd2,
                                     double d_R, double *dP0, double *dP1, double *dP2)
{
    const double dot = d0 * dd0 + d1 * dd1 + d2 * dd2;
    const double rR = 1 / R; /* one division a ray, not three (12 % of cubic1k's gradient) */
    *dP0 = (dd0 - d0 * dot) * rR + d_R * d0;
    *dP1 = (dd1 - d1 * dot) * rR + d_R * d1;
    *dP2 = (dd2 - d2 * dot) * rR + d_R * d2;
}

static inline NBG_HD void nbgi_ray_adjoint(const nbgi_ray *r, const double *d_d, double d_R, nbgi_adjacc *acc)
{
    double d_P[3];
    nbgi_ray_dP(r->d[0], r->d[1], r->d[2], r->R, d_d[0], d_d[1], d_d[2], d_R, &d_P[0], &d_P[1], &d_P[2]);
    for (int x = 0; x < 3; ++x) {
        acc->pix0[x] += d_P[x];
        acc->f[x] += d_P[x] * r->Fdet;
        acc->s[x] += d_P[x] * r->Sdet;
        acc->o[x] += d_P[x] * r->Odet;
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

/* The cotangents of the once-per-pixel factors of S = scale I capture polar omega for an incoming gradient g: the
 * scale's (g I capture polar omega), the solid angle's, the capture fraction's and the polarization's. */
static inline NBG_HD void nbgi_factor_cotangents(double g, double scale, double I, double capture, double polar,
                                                 double omega, double *d_scale, double *d_om, double *d_cap,
                                                 double *d_pol)
{
    *d_scale = g * I * capture * polar * omega;
    *d_om = g * scale * I * capture * polar;
    *d_cap = g * scale * I * polar * omega;
    *d_pol = g * scale * I * capture * omega;
}

/* capture(a) of layer t (nbgi_capture: a = dz mu / rho, or T mu / rho for the physical sensor), rho = d . o: the
 * cotangent of rho from that of capture. */
static inline NBG_HD double nbgi_capture_rho_adjoint(const nbgi_kparams *p, int t, double a, double rho,
                                                     double d_cap)
{
    return d_cap * nbgi_capture_da(p, t, a) * (-a / rho);
}

/* The epilogue of the adjoint: with the pixel's final sum I and its incoming gradient g (S = scale I capture polar
 * omega), back-propagates through the once-per-pixel factors into acc: the scale, the water term (d_I = g scale
 * capture polar omega), the solid angle (its ray and the close distance), the capture fraction (its ray and the
 * normal) and the polarization (its ray and K). */
static inline NBG_HD void nbgi_pixel_factors_adjoint(const nbgi_kparams *p, const nbgi_pixfactors *pf, double g,
                                                    double I, double d_I, nbgi_adjacc *acc)
{
    const double omega = pf->omega, capture = pf->capture, polar = pf->polar;
    double d_scale, d_om, d_cap, d_pol;
    nbgi_factor_cotangents(g, p->scale, I, capture, polar, omega, &d_scale, &d_om, &d_cap, &d_pol);
    acc->scale += d_scale;
    acc->Ibg += d_I;
    const double zero[3] = {0, 0, 0};
    {
        /* omega(R, close) */
        const double d_R = d_om * nbgi_solid_angle_dR(p, pf->r_om.R, omega);
        acc->close += d_om * nbgi_solid_angle_dclose(p, omega);
        nbgi_ray_adjoint(&pf->r_om, zero, d_R, acc);
    }
    if (p->thick != 0) {
        /* capture(a) (nbgi_capture's a), rho = d . o */
        const double d_rho = nbgi_capture_rho_adjoint(p, p->thicksteps - 1, pf->cap_a, pf->rho, d_cap);
        double d_d[3];
        for (int x = 0; x < 3; ++x) {
            d_d[x] = d_rho * p->odet[x];
            acc->o[x] += d_rho * pf->r_cap.d[x];
        }
        nbgi_ray_adjoint(&pf->r_cap, d_d, 0, acc);
    }
    if (pf->pol_src >= 0) {
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

/* --- lane forms (the CPU row adjoint; C only, for restrict and omp simd) ------------------------------------- */
#if !defined(__CUDACC__) && !defined(__cplusplus)
#define NBG_PF_LANES 8

/* The once-per-pixel factors of NBG_PF_LANES neighbouring pixels of a row, in lanes.  Where every active lane
 * takes its polarization on its first subpixel's ray with the first source (no resolution cut removes that
 * sample: "uniform", the common case) the factors are computed, and back-propagated, across the lanes with the
 * scalar functions' arithmetic (the values are the same bit for bit); otherwise each lane's come from
 * nbgi_pixel_factors (pf).  omega, capture, polar and the first subpixel's ray (d, R, Fd) are filled either way. */
typedef struct {
    int uniform;
    double omega[NBG_PF_LANES], capture[NBG_PF_LANES], polar[NBG_PF_LANES];
    double d0[NBG_PF_LANES], d1[NBG_PF_LANES], d2[NBG_PF_LANES], R[NBG_PF_LANES], Fd[NBG_PF_LANES];
    /* uniform and a sensor thickness: the last layer's first-subpixel ray and the capture's a and rho */
    double c0[NBG_PF_LANES], c1[NBG_PF_LANES], c2[NBG_PF_LANES], Rc[NBG_PF_LANES], Fc[NBG_PF_LANES];
    double cap_a[NBG_PF_LANES], rho[NBG_PF_LANES];
    double Sdet, Oc, O0; /* the first subpixel's slow coordinate, the last layer's depth, the first layer's */
    nbgi_pixfactors pf[NBG_PF_LANES]; /* not uniform: each lane's factors */
} nbgi_lane_pixfactors;

/* Fills lf for pixels f0 .. f0 + NBG_PF_LANES - 1 of row spixel of a flat detector; active[j] says which lanes
 * count (the others are computed and contribute nothing). */
static inline void nbgi_lane_pixel_factors(const nbgi_kparams *p, int f0, int spixel, const int *active,
                                           nbgi_lane_pixfactors *lf)
{
    enum { W = NBG_PF_LANES };
    const int tl = p->thicksteps - 1;
    lf->Sdet = nbgi_subpixel_at(p, spixel, 0);
    lf->Oc = nbgi_layer_at(p, tl);
    lf->O0 = nbgi_layer_at(p, 0);
    nbgi_lane_rays(p, f0, 0, lf->Sdet, lf->O0, W, lf->d0, lf->d1, lf->d2, lf->R, lf->Fd);
    lf->uniform = !p->curved;
    if (lf->uniform && !p->nopolar && p->dmin > 0) {
        double q0[W], q1[W], q2[W];
        int valid[W];
        nbgi_lane_q(p, 0, W, lf->d0, lf->d1, lf->d2, q0, q1, q2, valid);
        for (int j = 0; j < W; ++j) {
            lf->uniform &= valid[j] || !active[j];
        }
    }
    if (!lf->uniform) {
        for (int j = 0; j < W; ++j) {
            /* inactive lanes compute on a valid pixel and contribute nothing */
            nbgi_pixfactors *pf = &lf->pf[j];
            nbgi_pixel_factors(p, active[j] ? f0 + j : f0, spixel, pf);
            lf->omega[j] = pf->omega;
            lf->capture[j] = pf->capture;
            lf->polar[j] = pf->polar;
            lf->d0[j] = pf->r_om.d[0];
            lf->d1[j] = pf->r_om.d[1];
            lf->d2[j] = pf->r_om.d[2];
            lf->R[j] = pf->r_om.R;
            lf->Fd[j] = pf->r_om.Fdet;
        }
        return;
    }
    const double *sr = p->src;
    const double inc[3] = {sr[0], sr[1], sr[2]}, E[3] = {sr[4], sr[5], sr[6]}, B[3] = {sr[7], sr[8], sr[9]};
    const double K = p->polarization;
    const int nopolar = p->nopolar, point = p->point_pixel;
    const double pix2 = p->pixel * p->pixel, close = p->close_distance; /* locals: see the adjoint below */
#pragma omp simd
    for (int j = 0; j < W; ++j) {
        lf->omega[j] = nbgi_solid_angle_of(point, pix2, close, lf->R[j]);
        lf->capture[j] = 1;
        lf->cap_a[j] = 0;
        lf->rho[j] = 1;
    }
    /* the polarization as the forward's row takes it (src/row_tmpl.h): its multiply-adds explicit, so that the
     * vectorised loop and the scalar calls round alike (test-jvp's jvp-9 compares the images in double) */
#pragma omp simd
    for (int j = 0; j < W; ++j) {
        lf->polar[j] = nopolar ? 1 : nbgi_polar3_d(K, inc, lf->d0[j], lf->d1[j], lf->d2[j], E, B);
    }
    if (p->thick != 0) {
        nbgi_lane_rays(p, f0, 0, lf->Sdet, lf->Oc, W, lf->c0, lf->c1, lf->c2, lf->Rc, lf->Fc);
        const double o0 = p->odet[0], o1 = p->odet[1], o2 = p->odet[2];
#pragma omp simd
        for (int j = 0; j < W; ++j) {
            lf->rho[j] = lf->c0[j] * o0 + lf->c1[j] * o1 + lf->c2[j] * o2;
            lf->capture[j] = nbgi_capture(p, tl, lf->rho[j], &lf->cap_a[j]);
        }
    }
}

/* The lane accumulators of the row adjoint: component c of the fixed part of nbgi_adjacc (NBGI_FIX_*, its offsets
 * in doubles) in lane j at fix[c * NBG_PF_LANES + j], summed over the lanes once a row (grad/adjoint_row_tmpl.h). */
enum {
    NBGI_FIX_PIX0 = offsetof(nbgi_adjacc, pix0) / sizeof(double),
    NBGI_FIX_F = offsetof(nbgi_adjacc, f) / sizeof(double),
    NBGI_FIX_S = offsetof(nbgi_adjacc, s) / sizeof(double),
    NBGI_FIX_O = offsetof(nbgi_adjacc, o) / sizeof(double),
    NBGI_FIX_CLOSE = offsetof(nbgi_adjacc, close) / sizeof(double),
    NBGI_FIX_N = offsetof(nbgi_adjacc, N) / sizeof(double),
    NBGI_FIX_K = offsetof(nbgi_adjacc, K) / sizeof(double),
    NBGI_FIX_SCALE = offsetof(nbgi_adjacc, scale) / sizeof(double),
    NBGI_FIX_IBG = offsetof(nbgi_adjacc, Ibg) / sizeof(double),
    NBGI_FIX_DEFF = offsetof(nbgi_adjacc, defF) / sizeof(double)
};

/* nbgi_pixel_factors_adjoint for the lanes of lf with incoming gradients g, final sums I and d_I (lanes with
 * g = 0 contribute nothing).  Uniform lanes add into the lane accumulators fix, and take with them fdd0..2, the
 * gradient the samples left on the direction of the first subpixel's ray (the ray the solid angle and the
 * polarization were taken on): that ray's adjoint runs once for both.  Other lanes go through the scalar function
 * into acc (fdd is then the caller's to carry: it passes zeros).  Out of line: inlined, its arrays and registers
 * cost the row's sample loop (tric1k's gradient 13 % slower). */
static __attribute__((noinline, unused)) void
nbgi_lane_pixel_factors_adjoint(const nbgi_kparams *p, const nbgi_lane_pixfactors *lf, const double *g, const double *I,
                                const double *d_I, const double *fdd0, const double *fdd1, const double *fdd2,
                                double *NBG_RESTRICT fix, nbgi_adjacc *acc)
{
    enum { W = NBG_PF_LANES };
    if (!lf->uniform) {
        for (int j = 0; j < W; ++j) {
            if (g[j] != 0) {
                nbgi_pixel_factors_adjoint(p, &lf->pf[j], g[j], I[j], d_I[j], acc);
            }
        }
        return;
    }
    /* the plan's values in locals: a load through p in these loops, which store through fix, stops GCC
     * vectorising them */
    const double *sr = p->src;
    const double inc[3] = {sr[0], sr[1], sr[2]}, E[3] = {sr[4], sr[5], sr[6]}, B[3] = {sr[7], sr[8], sr[9]};
    const double K = p->polarization, scale = p->scale, close = p->close_distance, Sdet = lf->Sdet, O0 = lf->O0;
    const int pol = !p->nopolar, point = p->point_pixel;
    /* the solid angle and the polarization, both on the first subpixel's ray (at the first layer's depth O0: 0 but
     * for the physical sensor, nbgi_layer_at), in three
     * lane loops through local arrays: as one loop GCC vectorised little of it (most of it ran a lane at a time,
     * a quarter of cubic1k's gradient) */
    double d_cap[W], d_scale[W], d_om[W], d_pol[W], dP0[W], dP1[W], dP2[W], dK[W];
#pragma omp simd
    for (int j = 0; j < W; ++j) {
        nbgi_factor_cotangents(g[j], scale, I[j], lf->capture[j], lf->polar[j], lf->omega[j], &d_scale[j], &d_om[j],
                               &d_cap[j], &d_pol[j]);
    }
#pragma omp simd
    for (int j = 0; j < W; ++j) {
        nbgi_polar_grad3_d(K, inc, lf->d0[j], lf->d1[j], lf->d2[j], E, B, &dP0[j], &dP1[j], &dP2[j], &dK[j]);
    }
#pragma omp simd
    for (int j = 0; j < W; ++j) {
        const int on = g[j] != 0;
        const double d_R = d_om[j] * nbgi_solid_angle_dR_of(point, lf->R[j], lf->omega[j]);
        const double wp = pol ? d_pol[j] : 0;
        double e0, e1, e2;
        nbgi_ray_dP(lf->d0[j], lf->d1[j], lf->d2[j], lf->R[j], wp * dP0[j] + fdd0[j], wp * dP1[j] + fdd1[j],
                    wp * dP2[j] + fdd2[j], d_R, &e0, &e1, &e2);
        e0 = on ? e0 : 0;
        e1 = on ? e1 : 0;
        e2 = on ? e2 : 0;
        fix[NBGI_FIX_SCALE * W + j] += on ? d_scale[j] : 0;
        fix[NBGI_FIX_IBG * W + j] += on ? d_I[j] : 0;
        fix[NBGI_FIX_CLOSE * W + j] += on ? d_om[j] * nbgi_solid_angle_dclose_of(point, close, lf->omega[j]) : 0;
        fix[NBGI_FIX_K * W + j] += on ? wp * dK[j] : 0;
        /* P = Fdet f + Sdet s + Odet o + pix0 */
        fix[(NBGI_FIX_PIX0 + 0) * W + j] += e0;
        fix[(NBGI_FIX_PIX0 + 1) * W + j] += e1;
        fix[(NBGI_FIX_PIX0 + 2) * W + j] += e2;
        fix[(NBGI_FIX_F + 0) * W + j] += e0 * lf->Fd[j];
        fix[(NBGI_FIX_F + 1) * W + j] += e1 * lf->Fd[j];
        fix[(NBGI_FIX_F + 2) * W + j] += e2 * lf->Fd[j];
        fix[(NBGI_FIX_S + 0) * W + j] += e0 * Sdet;
        fix[(NBGI_FIX_S + 1) * W + j] += e1 * Sdet;
        fix[(NBGI_FIX_S + 2) * W + j] += e2 * Sdet;
        fix[(NBGI_FIX_O + 0) * W + j] += e0 * O0;
        fix[(NBGI_FIX_O + 1) * W + j] += e1 * O0;
        fix[(NBGI_FIX_O + 2) * W + j] += e2 * O0;
    }
    if (p->thick != 0) {
        /* the capture fraction on the last layer's first-subpixel ray: capture(a) (nbgi_capture's a), rho = d . o */
        const double o0 = p->odet[0], o1 = p->odet[1], o2 = p->odet[2], Oc = lf->Oc;
        const int tl = p->thicksteps - 1;
        for (int j = 0; j < W; ++j) {
            if (g[j] == 0) {
                continue;
            }
            const double d_rho = nbgi_capture_rho_adjoint(p, tl, lf->cap_a[j], lf->rho[j], d_cap[j]);
            double w[3];
            nbgi_ray_dP(lf->c0[j], lf->c1[j], lf->c2[j], lf->Rc[j], d_rho * o0, d_rho * o1, d_rho * o2, 0, &w[0],
                        &w[1], &w[2]);
            const double c[3] = {lf->c0[j], lf->c1[j], lf->c2[j]};
            for (int x = 0; x < 3; ++x) {
                fix[(NBGI_FIX_PIX0 + x) * W + j] += w[x];
                fix[(NBGI_FIX_F + x) * W + j] += w[x] * lf->Fc[j];
                fix[(NBGI_FIX_S + x) * W + j] += w[x] * Sdet;
                fix[(NBGI_FIX_O + x) * W + j] += w[x] * Oc + d_rho * c[x];
            }
        }
    }
}
#endif

/* The forms of the CPU adjoint (nbgi_adjoint_cpu; ctx->scalar_adjoint picks one, nbgi_debug_scalar_adjoint). */
enum { NBGI_ADJ_ROWS = 0, NBGI_ADJ_SCALAR = 1, NBGI_ADJ_TILED = 2 };

/* One reverse pass over the image: image[p] receives the forward value (bit-identical to the forward kernel) and
 * acc the gradients of L given dLdI (acc's arrays sized as the plan's; F gradients are gathered only when
 * acc->F != NULL, each panel's own detector gradients only when acc->panel != NULL; acc's lane scratch is not
 * used).  The units (rows, or a pixel list's runs) are cut into nbgi_adjoint_chunks chunks, a number that depends
 * on the experiment alone; each chunk is summed into an accumulator of its own by the thread that runs it, and the
 * chunks are added in chunk order, so the gradients are the same bits for any nthreads.  form: NBGI_ADJ_ROWS the
 * row form (adjoint_row_tmpl.h), NBGI_ADJ_SCALAR its scalar twin (adjoint_tmpl.h), NBGI_ADJ_TILED the twin's
 * tiled form, which the CUDA backend runs (the tests compare the three).  image_sum receives the sum of the
 * image's pixels (summed in the chunks' order: nbgi_image_check's).  Returns NBG_OK, or NBG_ENOMEM. */
int nbgi_adjoint_cpu(const nbgi_kparams *p, const float *dLdI, float *image, nbgi_adjacc *acc, int nthreads,
                     int form, double *image_sum);

/* The number of chunks of the reverse pass over nunits units with nflat sums each: one a unit, at most
 * NBGI_MAXCHUNKS (geometry.h), and at most NBG_ADJ_CHUNK_DOUBLES sums in all (a large structure-factor table: fewer
 * chunks). */
#define NBG_ADJ_CHUNK_DOUBLES (1L << 23)
int nbgi_adjoint_chunks(long nunits, size_t nflat);

/* Forward-mode tangents: for nt >= 0 tangent directions t[j] of the plan-level quantities (see nbgi_plan_tangent),
 * out[j * npix + pixel] = dI[pixel]/dtheta_j, and image the forward values (image_d, when not NULL, the same values
 * in double, before their rounding to float).  ptan (NULL: none): tangents of each
 * panel's own detector quantities, added to those the plane's carry, at [(j * npanels + k) * NBG_ADJ_DET] (panel
 * motions).  Runs on nthreads threads (the context's; the calling thread alone below NBGI_PARALLEL_MIN samples:
 * it had taken every core whatever the context said). */
void nbgi_jvp_cpu(const nbgi_kparams *p, const nbgi_adjacc *t, int nt, const double *ptan, double *out, float *image,
                  double *image_d, int vectorised, int nthreads);

#endif
