/*
 * refine.c -- fitting parameters to an observed image, and their standard errors.
 *
 *   - Levenberg-Marquardt on the Gauss-Newton model: the Jacobian images J = dI/dtheta come from the
 *     forward-mode kernel in one pass; H = J^T C J with C = 2w (least squares) or 1/I (Poisson, Fisher scoring);
 *     each step solves (H + mu diag H) delta = -g with LAPACKE (Cholesky), mu adapted on success or failure.
 *   - BFGS (GSL's vector_bfgs2) on the loss and its adjoint gradient, in variables scaled by the Gauss-Newton
 *     curvature at the start so that every parameter moves on the same scale.
 *   - Standard errors and correlations from the information matrix at the optimum: (J^T W J)^-1 scaled by the
 *     reduced chi-square for least squares, the inverse Fisher information for Poisson.
 *   - Honest stopping: each stop has a reason (nbg_stop_reason).  The yardstick of convergence is the Gauss-Newton
 *     step left at the final point measured in standard errors, sqrt(d^T Cov^-1 d) with d = -H^-1 g: below stol
 *     the fit is done; a stop on ftol, gtol or "no step lowers the loss" counts as converged only when that step is
 *     within one standard error; a parameter ending at a bound of its range is never converged.
 *   - The image-level parameters (scale, background plane) enter the model linearly: when refined, they start
 *     from their least-squares values at the start (if that lowers the loss), and under the Poisson loss a trial
 *     point whose model has no photons where the data have some is refused (a plane crossing zero).
 *   - The loss is the image model's (M = scale I + B, src/model.c) against the observed counts through the
 *     detector response; pixels outside the ROI or the mask, and those of weight 0, are left out of everything
 *     (loss, information matrix, the count of observations).
 *
 * Parameter bounds that physics needs: cell lengths, N, wavelength, distance > 0 (N >= 1), cell angles in
 * (0, 180) deg, mosaic >= 0, polarization in [-1, 1].  A step that would leave them is shortened.
 */
#include "grad.h"

#include <gsl/gsl_blas.h>
#include <gsl/gsl_errno.h>
#include <gsl/gsl_multimin.h>
#include <lapacke.h>
#undef I /* lapacke.h brings complex.h */
#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#ifdef _OPENMP
#include <omp.h>
#endif

/* The most knots of a scan-varying orientation (nbg_refine_options.scan_varying_knots). */
#define NBGI_MAX_KNOTS 256

/* One image of the fit, with its own experiment (a frame of a rotation series differs from the others in its phi
 * range; its pixel list and mask are its own), sharing the parameters. */
typedef struct {
    nbg_experiment e;            /* working copy; parameters written into it */
    const float *obs, *w;
    const uint32_t *list;        /* the experiment's pixel list, or NULL: every pixel */
    size_t nw;                   /* the pixels walked: the list's, or npix */
    float *img;
    uint8_t *use;                /* use[t], t < nw: 1 when pixel at(t) is in the loss (active, weight > 0) */
    double *T;                   /* n * nw tangent images (compact over the list) */
} refine_frame;

typedef struct {
    nbg_ctx *ctx;
    refine_frame *fr;            /* the frames; the loss is the sum of theirs */
    int nf;
    nbg_loss loss;
    const nbg_param *params;
    int n;
    /* the parameters rendered: params, then the cell parameters tied to one of them by the space group (xof[k]: the
     * fitted parameter whose value k takes, its tangent and gradient folded into that one's) */
    const nbg_param *xparams;
    const int *xof;
    int nx;
    double *gx;                  /* scratch of nx: a frame's gradient over xparams */
    size_t npix;
    size_t nobs;                 /* pixels in the loss, all frames */
    double eps;                  /* the loss's rounding at the last Gauss-Newton point (float images) */
    double *dstep;               /* the Gauss-Newton step -H^-1 g from there (n) */
    double dpred;                /* the decrease the Gauss-Newton step predicts there, g^T H^-1 g / 2 */
    double *scale;               /* BFGS variable scaling (n) */
    double *xs, *gs, *gf;        /* scratch of n: BFGS's point, its summed gradient and a frame's */
    double *A, *d;               /* scratch of n x n and n: step_sigma's solve */
    nbg_panel_motion *motions;   /* the frames' panel motions (every frame's e.motions points here), or NULL */
    int evals;
    int status;                  /* first failure */
    int gn_fresh;                /* the frames' images are the last Gauss-Newton point's (no render since) */
    int gn_cached;               /* gn_L, gn_g, gn_H hold the last Gauss-Newton point's loss, gradient and matrix
                                    (LM leaves them at its final point, which information() then reuses) */
    double gn_L, *gn_g, *gn_H;   /* n and n x n */
    /* per-reflection scales (nbg_refine_options.F): the table, the entries among params (params[Fa[k]] is
     * NBG_P_F(Fidx[k]), k < nFx), the other rendered parameters (xq[q] = xparams[qx[q]], q < nq) and scratch */
    nbg_hkl *Ft;
    int nFx, nq;
    int *Fa, *qx;
    long *Fidx;
    nbg_param *Fids, *xq;
    double *Tq, *gF, *Fsave;
    float *c1, *c2, *c3, *dl;
    double *Fs0;                 /* nFx: the entries' intensities at the start */
    unsigned char *pinned;       /* n: an entry held at zero intensity (the data want less than none) */
    /* scan-varying orientation (nbg_refine_options.scan_varying_knots), else svo NULL, K 0 and n0 = n: the frames'
     * parameters are x's first n0 (the list fitted); orientation parameter a (svo[a] = s, its ordinal among them;
     * -1 another parameter) has K knots, knot 0 at x[a], knot k at x[n0 + s (K - 1) + k - 1] (sv_index), and frame
     * f's value is sum_k svw[f K + k] x[knot k]: the map from x onto frame f's parameters is linear, P_f (n0 x n),
     * the identity without knots.  gl, Hl: a frame's sums over its own parameters, P_f^T gl and P_f^T Hl P_f added
     * into the knots' (sv_scatter) */
    int K, n0;
    int *svo;
    double *svw, *gl, *Hl;
} refine_ws;

/* The index in x of orientation parameter a's knot k. */
static int sv_index(const refine_ws *ws, int a, int k)
{
    return k == 0 ? a : ws->n0 + ws->svo[a] * (ws->K - 1) + k - 1;
}

/* The column entries of row a of frame f's map P_f: their indices in x (j) and weights (wt); returns how many. */
static int sv_row(const refine_ws *ws, int f, int a, int *j, double *wt)
{
    if (ws->svo[a] < 0) {
        j[0] = a;
        wt[0] = 1;
        return 1;
    }
    int m = 0;
    for (int k = 0; k < ws->K; ++k) {
        const double w = ws->svw[(size_t)f * (size_t)ws->K + (size_t)k];
        if (w != 0) {
            j[m] = sv_index(ws, a, k);
            wt[m++] = w;
        }
    }
    return m;
}

/* Adds frame f's gradient gl (over its n0 parameters) into g (over x: P_f^T gl) and, with Hl (n0 x n0, its lower
 * triangle filled; made symmetric here), P_f^T Hl P_f into H's lower triangle (n x n).  A fixed order: the same
 * bits for any thread count. */
static void sv_scatter(const refine_ws *ws, int f, const double *gl, double *Hl, double *g, double *H)
{
    const int n0 = ws->n0, n = ws->n;
    int ja[NBGI_MAX_KNOTS], jb[NBGI_MAX_KNOTS];
    double wa[NBGI_MAX_KNOTS], wb[NBGI_MAX_KNOTS];
    for (int a = 0; a < n0; ++a) {
        const int ma = sv_row(ws, f, a, ja, wa);
        for (int p = 0; p < ma; ++p) {
            g[ja[p]] += wa[p] * gl[a];
        }
    }
    if (Hl == NULL) {
        return;
    }
    for (int a = 0; a < n0; ++a) {
        for (int b = a + 1; b < n0; ++b) {
            Hl[a * n0 + b] = Hl[b * n0 + a];
        }
    }
    for (int a = 0; a < n0; ++a) {
        const int ma = sv_row(ws, f, a, ja, wa);
        for (int b = 0; b < n0; ++b) {
            const double hab = Hl[a * n0 + b];
            if (hab == 0) {
                continue;
            }
            const int mb = sv_row(ws, f, b, jb, wb);
            for (int p = 0; p < ma; ++p) {
                for (int q = 0; q < mb; ++q) {
                    if (jb[q] <= ja[p]) {
                        H[(size_t)ja[p] * (size_t)n + (size_t)jb[q]] += wa[p] * hab * wb[q];
                    }
                }
            }
        }
    }
}

/* The image index of walked pixel t. */
static size_t at(const refine_frame *fr, size_t t)
{
    return fr->list != NULL ? (size_t)fr->list[t] : t;
}

/* A structure factor is refined as its intensity s = F^2 (the model is linear in it: the Gauss-Newton model is
 * exact in those directions, and s > 0 keeps the sign question away); its value x is s. */
static int is_Fp(nbg_param p)
{
    return p >= NBG_P_F0;
}

static int x_in_bounds(nbg_param p, double v)
{
    return is_Fp(p) ? v > 0 && isfinite(v) : nbg_param_in_bounds(p, v);
}

static int set_params(refine_ws *ws, const double *x)
{
    for (int j = 0; j < ws->n; ++j) {
        if (!x_in_bounds(ws->params[j], x[j])) {
            return 0;
        }
    }
    for (int k = 0; k < ws->nx; ++k) {
        if (ws->svo != NULL && ws->svo[ws->xof[k]] >= 0) {
            /* a scan-varying parameter: each frame its knots' interpolation */
            const int a = ws->xof[k];
            for (int f = 0; f < ws->nf; ++f) {
                double v = 0;
                for (int q = 0; q < ws->K; ++q) {
                    v += ws->svw[(size_t)f * (size_t)ws->K + (size_t)q] * x[sv_index(ws, a, q)];
                }
                nbg_param_set(&ws->fr[f].e, ws->xparams[k], v);
            }
            continue;
        }
        const double v = x[ws->xof[k]];
        for (int f = 0; f < ws->nf; ++f) {
            nbg_param_set(&ws->fr[f].e, ws->xparams[k], is_Fp(ws->xparams[k]) ? sqrt(v) : v);
        }
    }
    return 1;
}

/* Folds the tied parameters' entries (k >= n of nx, each stride apart) into the ones they follow. */
static void fold_tied(const refine_ws *ws, double *v, size_t len, size_t stride)
{
    for (int k = ws->n; k < ws->nx; ++k) {
        const double *src = v + (size_t)k * stride;
        double *dst = v + (size_t)ws->xof[k] * stride;
        for (size_t t = 0; t < len; ++t) {
            dst[t] += src[t];
        }
    }
}

/* Loss only (a forward pass of each frame). */
static int loss_only(refine_ws *ws, double *L)
{
    *L = 0;
    ws->gn_fresh = 0;
    for (int f = 0; f < ws->nf; ++f) {
        refine_frame *fr = &ws->fr[f];
        double Lf;
        const int rc = nbg_loss_grad(ws->ctx, &fr->e, ws->loss, fr->obs, fr->w, NULL, 0, &Lf, NULL, fr->img, ws->npix);
        if (rc != NBG_OK) {
            return rc;
        }
        *L += Lf;
    }
    return NBG_OK;
}

/* Under the Poisson loss, whether a frame's model (its image as last rendered) has no photons where the data have
 * some: impossible under Poisson (the floor at 1e-12 keeps the loss finite, not meaningful), a step too far, e.g. a
 * background plane crossing zero. */
static int photons_missing(const refine_ws *ws)
{
    for (int f = 0; f < ws->nf; ++f) {
        const refine_frame *fr = &ws->fr[f];
        nbgi_response_cursor rcur;
        nbgi_response_init(&rcur, &fr->e);
        for (size_t t = 0; t < fr->nw; ++t) {
            const size_t i = at(fr, t);
            const nbg_detector_model *r = nbgi_response_at(&rcur, i);
            const double sr = r->read_noise > 0 ? (r->read_noise / r->gain) * (r->read_noise / r->gain) : 0;
            if (fr->use[t] && fr->img[i] + sr <= 0 && (fr->obs[i] - r->pedestal) / r->gain + sr > 0) {
                return 1;
            }
        }
    }
    return 0;
}

/* The loss at a trial point.  A point that the plan refuses (NBG_EINVAL: a cell with no volume, a detector
 * behind the sample, a crystal that needs too many subpixels) is not a failure of the refinement but a step too
 * far: it gets an infinite loss, so the step is shortened.  Any other failure is returned. */
static int loss_trial(refine_ws *ws, double *L)
{
    const int rc = loss_only(ws, L);
    if (rc == NBG_EINVAL) {
        *L = INFINITY;
        return NBG_OK;
    }
    if (rc == NBG_OK && ws->loss == NBG_LOSS_POISSON && isfinite(*L) && photons_missing(ws)) {
        *L = INFINITY;
    }
    return rc;
}

/* The three renders that tell which pixels see one of n listed table entries alone (idx[k], k < n), without the
 * background: u (e's model, the crystal's part), then entry k times sqrt(k + 2) into mb and times k + 2 into mc.  save
 * (the table's size) receives the table, which is restored. */
static int coded_renders(nbg_ctx *ctx, const nbg_experiment *e, nbg_hkl *t, const long *idx, long n, double *save,
                         float *u, float *mb, float *mc, size_t npix)
{
    const size_t nF = (size_t)(t->h_max - t->h_min + 1) * (size_t)(t->k_max - t->k_min + 1) *
                      (size_t)(t->l_max - t->l_min + 1);
    nbg_experiment e0 = *e; /* no background, so that weak pixels keep their digits */
    e0.bg[0] = e0.bg[1] = e0.bg[2] = 0;
    memcpy(save, t->F, sizeof(double) * nF);
    int rc = nbg_simulate(ctx, &e0, u, npix, NULL);
    for (long k = 0; k < n; ++k) t->F[idx[k]] = save[idx[k]] * sqrt(k + 2.0);
    if (rc == NBG_OK) {
        rc = nbg_simulate(ctx, &e0, mb, npix, NULL);
    }
    for (long k = 0; k < n; ++k) t->F[idx[k]] = save[idx[k]] * (k + 2.0);
    if (rc == NBG_OK) {
        rc = nbg_simulate(ctx, &e0, mc, npix, NULL);
    }
    memcpy(t->F, save, sizeof(double) * nF);
    return rc;
}

/* The entry (k < n) pixel i sees alone, from coded_renders' images, or -1 (no light, several entries, or one not
 * listed): M_b / u - 1 = k + 1 and M_c / u - 1 = (k + 1)(k + 3) for entry k alone, which no mixture gives both. */
static long coded_owner(const float *u, const float *mb, const float *mc, size_t i, long n)
{
    const double un = u[i];
    if (!(un > 0)) {
        return -1;
    }
    const double r1 = mb[i] / un - 1, r2 = mc[i] / un - 1;
    const long k = lround(r1) - 1;
    const double a = (double)(k + 1), b = (double)(k + 1) * (double)(k + 3);
    return k >= 0 && k < n && fabs(r1 - a) <= 1e-3 && fabs(r2 - b) <= 1e-3 * b ? k : -1;
}

/* Frame fr's model image and tangent images T of the rendered parameters.  With per-reflection scales the
 * structure factors' rows come from the model's own structure: M = G sum_j s_j K_j + bg with s_j = F_j^2, so where
 * pixel p sees one reflection j, dM_p/ds_j = u_p / s_j with u_p = M_p - bg_p.  Which pixels see one fitted
 * reflection, and which, is read from three more renders without the background (so that weak pixels keep their
 * digits): u itself, fitted entry k times sqrt(k + 2) (M_b / u - 1 = k + 1 for a pixel of k alone) and times k + 2
 * (M_c / u - 1 = (k + 1)(k + 3) for k alone: a mixture of reflections never gives both).  Pixels that see several
 * reflections (or an entry not fitted) get no structure-factor row: these rows serve the Gauss-Newton matrix only;
 * the gradient's structure-factor entries are the adjoint's, exact (gauss_newton). */
static int frame_jacobian(refine_ws *ws, refine_frame *fr)
{
    if (ws->Ft == NULL) {
        return nbg_simulate_jvp(ws->ctx, &fr->e, ws->xparams, ws->nx, fr->T, fr->img, ws->npix);
    }
    const size_t nw = fr->nw;
    int rc = NBG_OK;
    if (ws->nq > 0) {
        rc = nbg_simulate_jvp(ws->ctx, &fr->e, ws->xq, ws->nq, ws->Tq, fr->img, ws->npix);
        for (int q = 0; rc == NBG_OK && q < ws->nq; ++q) {
            memcpy(fr->T + (size_t)ws->qx[q] * nw, ws->Tq + (size_t)q * nw, sizeof(double) * nw);
        }
    } else {
        rc = nbg_simulate(ws->ctx, &fr->e, fr->img, ws->npix, NULL);
    }
    if (rc == NBG_OK) {
        rc = coded_renders(ws->ctx, &fr->e, ws->Ft, ws->Fidx, ws->nFx, ws->Fsave, ws->c1, ws->c2, ws->c3, ws->npix);
    }
    if (rc != NBG_OK) {
        return rc;
    }
    for (int k = 0; k < ws->nFx; ++k) {
        memset(fr->T + (size_t)ws->Fa[k] * nw, 0, sizeof(double) * nw);
    }
    for (size_t u = 0; u < nw; ++u) {
        const size_t i = at(fr, u);
        const long k = fr->use[u] ? coded_owner(ws->c1, ws->c2, ws->c3, i, ws->nFx) : -1;
        const double F = k >= 0 ? ws->Fsave[ws->Fidx[k]] : 0;
        if (F != 0) {
            fr->T[(size_t)ws->Fa[k] * nw + u] = ws->c1[i] / (F * F); /* dM/ds, s = F^2 */
        }
    }
    return NBG_OK;
}

/* The dense Gauss-Newton sums of walked pixels [t0, t1) of frame fr (no structure-factor rows): out[0] the loss,
 * out[1] its rounding, out[2 + a] g_a, out[2 + n + a (a + 1) / 2 + b] H_ab (b <= a).  The pixels in the loss whose
 * tangents are not all zero are copied, a block at a time, into a compact buffer whose dot products vectorise. */
enum { GN_BLK = 256, GN_DENSE_MAX = 24, GN_CHUNK = 8192, GN_LANES = 8 };

static double lanes_sum(const double *acc)
{
    double s = 0;
    for (int l = 0; l < GN_LANES; ++l) {
        s += acc[l];
    }
    return s;
}

static void gn_dense_chunk(const refine_ws *ws, const refine_frame *fr, long t0, long t1, double *out)
{
    const int n = ws->n0; /* the frame's own parameters */
    double Tl[GN_DENSE_MAX][GN_BLK], dl[GN_BLK], cl[GN_BLK], ct[GN_BLK];
    double *const g = out + 2, *const H = out + 2 + n;
    double sum = 0, eps = 0;
    nbgi_response_cursor rcur;
    nbgi_response_init(&rcur, &fr->e);
    for (long tb = t0; tb < t1; tb += GN_BLK) {
        const long te = tb + GN_BLK < t1 ? tb + GN_BLK : t1;
        int m = 0;
        for (long t = tb; t < te; ++t) {
            if (!fr->use[t]) {
                continue;
            }
            const size_t i = at(fr, (size_t)t);
            const double wi = fr->w ? fr->w[i] : 1.0;
            double dLdI, c;
            sum += wi * nbgi_pixel_loss(ws->loss, nbgi_response_at(&rcur, i), fr->img[i], fr->obs[i], &dLdI, &c);
            dLdI *= wi;
            c *= wi; /* least squares 2 w; Poisson Fisher scoring w E[y] / m^2 = w / m */
            eps += fabs(dLdI * fr->img[i]) * 0x1p-24; /* the model image is float: M to half an ulp */
            int any = 0;
            for (int a = 0; a < n; ++a) {
                const double Ta = fr->T[(size_t)a * fr->nw + (size_t)t];
                Tl[a][m] = Ta;
                any |= Ta != 0;
            }
            if (any) {
                dl[m] = dLdI;
                cl[m] = c;
                ++m;
            }
        }
        /* the dot products in GN_LANES partial sums added in a fixed order at the end, so that the bits do not
         * depend on the vector width the compiler chose (the program's -march=native and the Python extension's
         * x86-64-v3 build give the same fits); the block is padded with zeros to a whole number of lanes */
        const int mp = (m + GN_LANES - 1) / GN_LANES * GN_LANES;
        for (int j = m; j < mp; ++j) {
            dl[j] = cl[j] = 0;
            for (int a = 0; a < n; ++a) {
                Tl[a][j] = 0;
            }
        }
        for (int a = 0; a < n; ++a) {
            const double *const Ta = Tl[a];
            double acc[GN_LANES] = {0};
            for (int j = 0; j < mp; j += GN_LANES) {
#pragma omp simd
                for (int l = 0; l < GN_LANES; ++l) {
                    acc[l] += dl[j + l] * Ta[j + l];
                    ct[j + l] = cl[j + l] * Ta[j + l];
                }
            }
            g[a] += lanes_sum(acc);
            double *const Ha = H + (size_t)a * (a + 1) / 2;
            for (int b = 0; b <= a; ++b) {
                const double *const Tb = Tl[b];
                double hacc[GN_LANES] = {0};
                for (int j = 0; j < mp; j += GN_LANES) {
#pragma omp simd
                    for (int l = 0; l < GN_LANES; ++l) {
                        hacc[l] += ct[j + l] * Tb[j + l];
                    }
                }
                Ha[b] += lanes_sum(hacc);
            }
        }
    }
    out[0] = sum;
    out[1] = eps;
}

/* Loss, gradient g = J^T dL/dI and Gauss-Newton matrix H = J^T C J at the current parameters. */
static int gauss_newton(refine_ws *ws, double *L, double *g, double *H)
{
    const int N = ws->n;
    double sum = 0, eps = 0;
    memset(g, 0, sizeof(double) * (size_t)N);
    memset(H, 0, sizeof(double) * (size_t)N * (size_t)N);
    /* the frames' sums over their own n0 parameters: into g and H themselves, or (scan-varying) into gl and Hl,
     * then mapped onto the knots */
    const int n = ws->n0;
    double *const gt = ws->svo != NULL ? ws->gl : g, *const Ht = ws->svo != NULL ? ws->Hl : H;
    for (int f = 0; f < ws->nf; ++f) {
        refine_frame *fr = &ws->fr[f];
        const int rc = frame_jacobian(ws, fr);
        if (rc != NBG_OK) {
            return rc;
        }
        fold_tied(ws, fr->T, fr->nw, fr->nw);
        if (ws->svo != NULL) {
            memset(gt, 0, sizeof(double) * (size_t)n);
            memset(Ht, 0, sizeof(double) * (size_t)n * (size_t)n);
        }
        if (ws->nFx == 0 && n <= GN_DENSE_MAX) {
            /* over fixed chunks of the pixels, in parallel, added in chunk order (the same bits for any thread
             * count); the matrix's lower triangle packed */
            const long nw = (long)fr->nw;
            const size_t stride = 2 + (size_t)n + (size_t)n * (n + 1) / 2;
            long nch = (nw + GN_CHUNK - 1) / GN_CHUNK;
            nch = nch < 1 ? 1 : nch > NBGI_MAXCHUNKS ? NBGI_MAXCHUNKS : nch;
            double *const part = calloc((size_t)nch * stride, sizeof(double));
            if (part == NULL) {
                return nbgi_error(ws->ctx, NBG_ENOMEM, "out of memory for the Gauss-Newton sums");
            }
            int nthreads = 1;
#ifdef _OPENMP
            nthreads = ws->ctx->nthreads > 0 ? ws->ctx->nthreads : omp_get_max_threads();
#endif
#pragma omp parallel for schedule(static) num_threads(nthreads) if (nw >= (long)NBGI_PARALLEL_MIN)
            for (long c = 0; c < nch; ++c) {
                long t0, t1;
                nbgi_chunk(c, nch, nw, &t0, &t1);
                gn_dense_chunk(ws, fr, t0, t1, part + (size_t)c * stride);
            }
            for (long c = 0; c < nch; ++c) {
                const double *const pc = part + (size_t)c * stride;
                sum += pc[0];
                eps += pc[1];
                for (int a = 0; a < n; ++a) {
                    gt[a] += pc[2 + a];
                    for (int b = 0; b <= a; ++b) {
                        Ht[a * n + b] += pc[2 + n + (size_t)a * (a + 1) / 2 + b];
                    }
                }
            }
            free(part);
            if (ws->svo != NULL) {
                sv_scatter(ws, f, gt, Ht, g, H);
            }
            continue;
        }
        if (ws->nFx > 0) {
            memset(ws->dl, 0, sizeof(float) * ws->npix);
        }
        nbgi_response_cursor rcur;
        nbgi_response_init(&rcur, &fr->e);
        for (size_t t = 0; t < fr->nw; ++t) {
            if (!fr->use[t]) {
                continue;
            }
            const size_t i = at(fr, t);
            const double wi = fr->w ? fr->w[i] : 1.0;
            double dLdI, c;
            sum += wi * nbgi_pixel_loss(ws->loss, nbgi_response_at(&rcur, i), fr->img[i], fr->obs[i], &dLdI, &c);
            dLdI *= wi;
            c *= wi; /* least squares 2 w; Poisson Fisher scoring w E[y] / m^2 = w / m */
            if (ws->nFx > 0) {
                ws->dl[i] = (float)dLdI; /* the adjoint's input below */
            }
            eps += fabs(dLdI * fr->img[i]) * 0x1p-24; /* the model image is float: M to half an ulp */
            for (int a = 0; a < n; ++a) {
                const double Ta = fr->T[(size_t)a * fr->nw + t];
                if (Ta == 0) {
                    continue;
                }
                gt[a] += dLdI * Ta;
                for (int b = 0; b <= a; ++b) {
                    Ht[a * n + b] += c * Ta * fr->T[(size_t)b * fr->nw + t];
                }
            }
        }
        if (ws->svo != NULL) {
            sv_scatter(ws, f, gt, Ht, g, H);
        }
        if (ws->nFx > 0) {
            /* the structure factors' gradient from the adjoint, exact (their rows above serve the matrix) */
            const int rc2 = nbg_simulate_grad(ws->ctx, &fr->e, ws->dl, ws->Fids, ws->nFx, ws->gF, (float *)ws->c1,
                                              ws->npix, NULL);
            if (rc2 != NBG_OK) {
                return rc2;
            }
            for (int k = 0; k < ws->nFx; ++k) {
                ws->gF[ws->nFx + k] = (f == 0 ? 0 : ws->gF[ws->nFx + k]) + ws->gF[k];
            }
        }
    }
    for (int a = 0; a < N; ++a) {
        for (int b = a + 1; b < N; ++b) {
            H[a * N + b] = H[b * N + a];
        }
    }
    for (int k = 0; k < ws->nFx; ++k) { /* dL/ds = dL/dF / (2 F), the frames' sum */
        const double F = ws->Ft->F[ws->Fidx[k]];
        g[ws->Fa[k]] = F != 0 ? ws->gF[ws->nFx + k] / (2 * F) : 0;
    }
    /* an entry driven to zero intensity whose gradient still points down sits on its bound (the reflection has
     * no photons above the rest of the model): it is held there, out of the step and of the stopping rules, until
     * the gradient turns (a Karush-Kuhn-Tucker point, not a failure to converge) */
    for (int k = 0; k < ws->nFx; ++k) {
        const int a = ws->Fa[k];
        const double F = ws->Ft->F[ws->Fidx[k]];
        ws->pinned[a] = F * F <= 1e-8 * ws->Fs0[k] && g[a] > 0;
        if (ws->pinned[a]) {
            g[a] = 0;
            for (int b = 0; b < N; ++b) H[a * N + b] = H[b * N + a] = 0;
            H[a * N + a] = 1;
        }
    }
    *L = sum;
    ws->eps = eps + 1e-15 * fabs(sum);
    ws->gn_fresh = 1;
    return NBG_OK;
}

static double norm2(const double *v, int n)
{
    double s = 0;
    for (int i = 0; i < n; ++i) {
        s += v[i] * v[i];
    }
    return sqrt(s);
}

/* The variance factor of the covariance: the reduced chi-square L / (nobs - n) for least squares, 1 for Poisson
 * (whose H is the Fisher information); cov = fac (H / 2)^-1 for least squares, H^-1 for Poisson. */
static double cov_factor(const refine_ws *ws, double L)
{
    if (ws->loss != NBG_LOSS_LSQ) {
        return 1;
    }
    return ws->nobs > (size_t)ws->n ? L / (double)(ws->nobs - (size_t)ws->n) : 1;
}

/* The Gauss-Newton step d = -H^-1 g from the current point, measured in standard errors: sqrt(d^T Cov^-1 d) =
 * sqrt(g^T H^-1 g / (2 fac)) for least squares, sqrt(g^T H^-1 g) for Poisson.  Infinite when H is singular. */
static double step_sigma(refine_ws *ws, const double *g, const double *H, double L)
{
    const int n = ws->n;
    double *A = ws->A, *d = ws->d;
    memcpy(A, H, sizeof(double) * (size_t)n * n);
    memcpy(d, g, sizeof(double) * (size_t)n);
    if (LAPACKE_dposv(LAPACK_ROW_MAJOR, 'L', n, 1, A, n, d, 1) != 0) {
        ws->dpred = INFINITY;
        return INFINITY;
    }
    double q = 0;
    for (int a = 0; a < n; ++a) {
        q += g[a] * d[a];
        ws->dstep[a] = -d[a];
    }
    ws->dpred = q / 2;
    if (ws->loss == NBG_LOSS_LSQ) {
        const double fac = cov_factor(ws, L);
        q = fac > 0 ? q / (2 * fac) : (q > 0 ? INFINITY : 0);
    }
    return sqrt(fmax(q, 0));
}

/* The image-level parameters being refined enter M linearly: start them at their least-squares values against
 * y = (obs - pedestal) / gain, the others held, when that lowers the loss (a background of 0 under data with a
 * floor is a poor start: the Poisson loss is steep where M vanishes). */
static int linear_start(refine_ws *ws, double *x)
{
    int idx[4], k = 0;
    for (int j = 0; j < ws->n; ++j) {
        if (nbgi_param_image_level(ws->params[j])) {
            idx[k++] = j;
        }
    }
    if (k == 0) {
        return NBG_OK;
    }
    /* over every frame: the simulated photons I (the model with scale 1 and no background) */
    double A[16] = {0}, b[4] = {0};
    for (int f = 0; f < ws->nf; ++f) {
        refine_frame *fr = &ws->fr[f];
        nbg_experiment e1 = fr->e;
        e1.scale = 1;
        e1.bg[0] = e1.bg[1] = e1.bg[2] = 0;
        int rc = nbg_simulate(ws->ctx, &e1, fr->img, ws->npix, NULL);
        if (rc != NBG_OK) {
            return rc;
        }
        const nbg_experiment *e = &fr->e;
        nbg_report rep;
        rc = nbg_describe(ws->ctx, &e1, &rep);
        if (rc != NBG_OK) {
            return rc;
        }
        nbgi_response_cursor rcur;
        nbgi_response_init(&rcur, e);
        for (size_t t = 0; t < fr->nw; ++t) {
            if (!fr->use[t]) {
                continue;
            }
            const size_t i = at(fr, t);
            const double xf = ((double)(i % (size_t)rep.fpixels) - 0.5 * (rep.fpixels - 1)) / NBG_BG_UNIT;
            const double ys = ((double)(i / (size_t)rep.fpixels) - 0.5 * (rep.spixels - 1)) / NBG_BG_UNIT;
            const double basis[4] = {fr->img[i], 1, xf, ys};
            /* the fixed part of M, and the data */
            double fixed = 0;
            const double vals[4] = {e->scale, e->bg[0], e->bg[1], e->bg[2]};
            for (int q = 0; q < 4; ++q) {
                int refined = 0;
                for (int a = 0; a < k; ++a) {
                    refined |= nbgi_param_rows[ws->params[idx[a]]].index == q;
                }
                if (!refined) {
                    fixed += vals[q] * basis[q];
                }
            }
            const double wi = fr->w ? fr->w[i] : 1.0;
            const nbg_detector_model *r = nbgi_response_at(&rcur, i);
            const double y = (fr->obs[i] - r->pedestal) / r->gain - fixed;
            for (int a = 0; a < k; ++a) {
                const double ba = basis[nbgi_param_rows[ws->params[idx[a]]].index];
                b[a] += wi * ba * y;
                for (int c = 0; c < k; ++c) {
                    A[a * k + c] += wi * ba * basis[nbgi_param_rows[ws->params[idx[c]]].index];
                }
            }
        }
    }
    if (LAPACKE_dposv(LAPACK_ROW_MAJOR, 'L', k, 1, A, k, b, 1) != 0) {
        return NBG_OK; /* degenerate (no signal): keep the caller's start */
    }
    double L0, L1, *xn = ws->xs;
    memcpy(xn, x, sizeof(double) * (size_t)ws->n);
    for (int a = 0; a < k; ++a) {
        xn[idx[a]] = b[a];
    }
    int rc = loss_trial(ws, &L0);
    if (rc != NBG_OK || !set_params(ws, xn)) {
        set_params(ws, x);
        return rc;
    }
    rc = loss_trial(ws, &L1);
    if (rc == NBG_OK && L1 < L0) {
        memcpy(x, xn, sizeof(double) * (size_t)ws->n);
    } else {
        set_params(ws, x);
    }
    return rc;
}

static int informed_at_start(refine_ws *ws, const double *H);

static int refine_lm(refine_ws *ws, double *x, const nbg_refine_options *opt, nbg_refine_result *res)
{
    const int n = ws->n;
    double *const buf = malloc(sizeof(double) * ((size_t)n * n * 3 + 4 * (size_t)n));
    if (buf == NULL) {
        return nbgi_error(ws->ctx, NBG_ENOMEM, "out of memory for %d parameters", n);
    }
    double *const g = buf, *const H = g + n, *const A = H + (size_t)n * n, *const d = A + (size_t)n * n;
    double *const xn = d + n, *const gn = xn + n, *const Hn = gn + n;
    /* A trial point's loss comes with its tangent images (the Gauss-Newton pass, whose render gives the model
     * image and the loss too) while trials are being accepted: an accepted trial then needs no second render of
     * the same point (was: a forward for the trial's loss, then the tangents' pass at the same point).  After a
     * refused trial the next ones take the loss alone until one is accepted at the first try.  Not with the
     * structure factors' rows (their Gauss-Newton pass adds three renders and an adjoint pass). */
    int speculate = ws->Ft == NULL;
    double L;
    int rc = gauss_newton(ws, &L, g, H);
    if (rc == NBG_OK) {
        rc = informed_at_start(ws, H);
    }
    if (rc != NBG_OK) {
        free(buf);
        return rc;
    }
    double mu = 1e-3;
    int it;
    res->reason = NBG_STOP_MAXITER;
    for (it = 1; it <= opt->max_iter; ++it) {
        int accepted = 0, fresh = 0;
        double Ln = L, step = 0;
        for (int tries = 0; tries < 30 && !accepted; ++tries) {
            memcpy(A, H, sizeof(double) * (size_t)n * n);
            for (int a = 0; a < n; ++a) {
                A[a * n + a] += mu * (H[a * n + a] > 0 ? H[a * n + a] : 1.0);
                d[a] = -g[a];
            }
            if (LAPACKE_dposv(LAPACK_ROW_MAJOR, 'L', n, 1, A, n, d, 1) != 0) {
                mu *= 10;
                continue;
            }
            /* a structure factor's intensity stays positive on its own: a step that would take it to zero or below
             * takes it to a tenth of its value (one such entry, barely measured, must not shorten every other
             * parameter's step); other parameters' steps that leave their bounds shorten the whole step */
            for (int a = 0; a < n; ++a) {
                if (is_Fp(ws->params[a]) && !(x[a] + d[a] > 0)) {
                    d[a] = -0.9 * x[a];
                }
            }
            double frac = 1;
            for (int k = 0; k < 40; ++k) {
                int ok = 1;
                for (int a = 0; a < n; ++a) {
                    xn[a] = x[a] + frac * d[a];
                    ok &= x_in_bounds(ws->params[a], xn[a]);
                }
                if (ok) {
                    break;
                }
                frac *= 0.5;
            }
            if (!set_params(ws, xn)) {
                mu *= 10;
                continue;
            }
            const int spec = speculate && tries == 0 && ws->Ft == NULL;
            if (spec) {
                rc = gauss_newton(ws, &Ln, gn, Hn);
                if (rc == NBG_EINVAL) { /* a point the plan refuses: a step too far (loss_trial) */
                    Ln = INFINITY;
                    rc = NBG_OK;
                } else if (rc == NBG_OK && ws->loss == NBG_LOSS_POISSON && isfinite(Ln) && photons_missing(ws)) {
                    Ln = INFINITY;
                }
            } else {
                rc = loss_trial(ws, &Ln);
            }
            if (rc != NBG_OK) {
                free(buf);
                return rc;
            }
            if (Ln < L) {
                accepted = 1;
                fresh = spec;
                step = frac * norm2(d, n);
                mu = fmax(mu / 3, 1e-12);
            } else {
                mu *= 4;
                set_params(ws, x);
                ws->gn_fresh = 0; /* the images are the refused point's */
            }
            if (tries == 0) {
                speculate = accepted;
            }
        }
        if (!accepted) {
            res->reason = NBG_STOP_NO_DECREASE; /* judged by the step left (nbg_refine) */
            break;
        }
        const double Lold = L;
        memcpy(x, xn, sizeof(double) * (size_t)n);
        if (fresh) {
            /* the trial's own Gauss-Newton pass (its images, eps, gn_fresh are this point's) */
            L = Ln;
            memcpy(g, gn, sizeof(double) * (size_t)n);
            memcpy(H, Hn, sizeof(double) * (size_t)n * n);
        } else {
            rc = gauss_newton(ws, &L, g, H);
        }
        if (rc != NBG_OK) {
            free(buf);
            return rc;
        }
        res->iterations = it;
        if (opt->progress) {
            opt->progress(opt->user, it, L, norm2(g, n), step);
        }
        const double ss = step_sigma(ws, g, H, L);
        if (ss <= opt->stol) {
            res->reason = NBG_STOP_STEP;
            break;
        }
        /* the loss no longer changes, and the step left is within a standard error or promises less than the loss's
         * own rounding (a direction the data barely determine amplifies the gradient's rounding into a step that
         * no trial can take: iterating on would only take steps of 1e-12 until the limit); verdict() judges both
         * alike */
        if (fabs(Lold - L) <= opt->ftol * fmax(fabs(L), 1e-300) && (ss <= 1 || ws->dpred <= ws->eps)) {
            res->reason = NBG_STOP_FTOL;
            break;
        }
        /* the last step's decrease and the one the Gauss-Newton step left promises are both within the loss's own
         * rounding: the fit is at the rounding floor (noise-free data, where the loss falls towards 0 and each
         * further step's relative decrease is rounding noise: iterating on took 10-25 more iterations there) */
        if (Lold - L <= ws->eps && ws->dpred <= ws->eps) {
            res->reason = NBG_STOP_FTOL;
            break;
        }
    }
    res->loss = L;
    if (ws->gn_fresh) {
        /* the final point's Gauss-Newton quantities, for information() */
        ws->gn_L = L;
        memcpy(ws->gn_g, g, sizeof(double) * (size_t)n);
        memcpy(ws->gn_H, H, sizeof(double) * (size_t)n * n);
        ws->gn_cached = 1;
    }
    free(buf);
    return NBG_OK;
}

/* GSL callbacks in scaled variables u_j = x_j / scale_j. */
static double bfgs_f(const gsl_vector *u, void *p)
{
    refine_ws *ws = p;
    double *x = ws->xs, L;
    for (int j = 0; j < ws->n; ++j) {
        x[j] = gsl_vector_get(u, (size_t)j) * ws->scale[j];
    }
    if (!set_params(ws, x)) {
        return GSL_POSINF;
    }
    const int rc = loss_trial(ws, &L);
    if (rc != NBG_OK) {
        ws->status = rc;
        return GSL_NAN;
    }
    ++ws->evals;
    return L;
}

/* The summed loss of the frames at the parameters set, and its gradient over x from the adjoint into ws->gs. */
static int adjoint_sums(refine_ws *ws, double *f)
{
    memset(ws->gs, 0, sizeof(double) * (size_t)ws->n);
    *f = 0;
    for (int k = 0; k < ws->nf; ++k) {
        refine_frame *fr = &ws->fr[k];
        double Lf;
        const int rc = nbg_loss_grad(ws->ctx, &fr->e, ws->loss, fr->obs, fr->w, ws->xparams, ws->nx, &Lf, ws->gx,
                                     fr->img, ws->npix);
        if (rc != NBG_OK) {
            return rc;
        }
        fold_tied(ws, ws->gx, 1, 1);
        if (ws->svo != NULL) {
            memset(ws->gf, 0, sizeof(double) * (size_t)ws->n);
            sv_scatter(ws, k, ws->gx, NULL, ws->gf, NULL);
        } else {
            memcpy(ws->gf, ws->gx, sizeof(double) * (size_t)ws->n);
        }
        *f += Lf;
        for (int j = 0; j < ws->n; ++j) {
            ws->gs[j] += ws->gf[j];
        }
    }
    return NBG_OK;
}

static void bfgs_fdf(const gsl_vector *u, void *p, double *f, gsl_vector *df)
{
    refine_ws *ws = p;
    double *x = ws->xs;
    for (int j = 0; j < ws->n; ++j) {
        x[j] = gsl_vector_get(u, (size_t)j) * ws->scale[j];
    }
    if (!set_params(ws, x)) {
        *f = GSL_POSINF;
        gsl_vector_set_zero(df);
        return;
    }
    const int rc = adjoint_sums(ws, f);
    if (rc == NBG_EINVAL) { /* outside the plan's domain: a step too far (loss_trial) */
        *f = GSL_POSINF;
        gsl_vector_set_zero(df);
        return;
    }
    if (rc != NBG_OK) {
        ws->status = rc;
        *f = GSL_NAN;
        return;
    }
    ++ws->evals;
    for (int j = 0; j < ws->n; ++j) {
        gsl_vector_set(df, (size_t)j, ws->gs[j] * ws->scale[j]);
    }
}

static void bfgs_df(const gsl_vector *u, void *p, gsl_vector *df)
{
    double f;
    bfgs_fdf(u, p, &f, df);
}

static int refine_bfgs(refine_ws *ws, double *x, const nbg_refine_options *opt, nbg_refine_result *res)
{
    const int n = ws->n;
    double *const g = malloc(sizeof(double) * ((size_t)n * n + (size_t)n)), *const H = g != NULL ? g + n : NULL, L;
    if (g == NULL) {
        return nbgi_error(ws->ctx, NBG_ENOMEM, "out of memory for %d parameters", n);
    }
    int rc = gauss_newton(ws, &L, g, H);
    if (rc == NBG_OK) {
        rc = informed_at_start(ws, H);
    }
    if (rc != NBG_OK) {
        free(g);
        return rc;
    }
    for (int j = 0; j < n; ++j) {
        ws->scale[j] = H[j * n + j] > 0 ? 1 / sqrt(H[j * n + j]) : 1;
    }
    free(g);
    gsl_set_error_handler_off();
    gsl_multimin_function_fdf fn = {bfgs_f, bfgs_df, bfgs_fdf, (size_t)n, ws};
    gsl_vector *u = gsl_vector_alloc((size_t)n);
    gsl_multimin_fdfminimizer *m = gsl_multimin_fdfminimizer_alloc(gsl_multimin_fdfminimizer_vector_bfgs2, (size_t)n);
    if (u == NULL || m == NULL) {
        gsl_vector_free(u);
        gsl_multimin_fdfminimizer_free(m);
        return nbgi_error(ws->ctx, NBG_ENOMEM, "out of memory for the BFGS minimizer");
    }
    for (int j = 0; j < n; ++j) {
        gsl_vector_set(u, (size_t)j, x[j] / ws->scale[j]);
    }
    gsl_multimin_fdfminimizer_set(m, &fn, u, 0.1, 0.1);
    int it;
    double Lold = m->f;
    res->reason = NBG_STOP_MAXITER;
    for (it = 1; it <= opt->max_iter; ++it) {
        const int st = gsl_multimin_fdfminimizer_iterate(m);
        if (ws->status != NBG_OK) {
            rc = ws->status;
            break;
        }
        const double gn = gsl_blas_dnrm2(m->gradient);
        res->iterations = it;
        if (opt->progress) {
            opt->progress(opt->user, it, m->f, gn, gsl_blas_dnrm2(m->dx));
        }
        if (st != GSL_SUCCESS) {
            res->reason = NBG_STOP_NO_DECREASE; /* the line search found no lower point (judged in nbg_refine) */
            break;
        }
        if (gsl_multimin_test_gradient(m->gradient, opt->gtol) == GSL_SUCCESS) {
            res->reason = NBG_STOP_GTOL;
            break;
        }
        if (fabs(Lold - m->f) <= opt->ftol * fmax(fabs(m->f), 1e-300)) {
            res->reason = NBG_STOP_FTOL;
            break;
        }
        Lold = m->f;
    }
    for (int j = 0; j < n; ++j) {
        x[j] = gsl_vector_get(m->x, (size_t)j) * ws->scale[j];
    }
    res->loss = m->f;
    gsl_multimin_fdfminimizer_free(m);
    gsl_vector_free(u);
    set_params(ws, x);
    return rc;
}

/* The one rule for a refinement that does not determine its parameters (every parameter set, both losses): a
 * parameter whose information is zero (it does not change the image where the loss looks), or an information
 * matrix whose correlation form (unit diagonal, so that the rule does not depend on the parameters' units) has a
 * smallest eigenvalue below NBG_RCOND_MIN of its largest: some combination of the parameters, named from that
 * eigenvector, moves the image by less than rounding.  (Cholesky alone passed matrices singular to rounding, and
 * the fit then "converged" with standard errors of 1e7 and more.)  Returns NBG_OK, or NBG_EINVAL naming them. */
#define NBG_RCOND_MIN 1e-10

/* Fitted entry a's label: its parameter's, with ".k<knot>" for a knot of a scan-varying orientation. */
static const char *x_label(const refine_ws *ws, const nbg_experiment *e, int a, char *buf, size_t n)
{
    nbg_param_label(e, ws->params[a], buf, n);
    if (ws->svo != NULL && (a >= ws->n0 || ws->svo[a] >= 0)) {
        const size_t l = strlen(buf);
        snprintf(buf + l, n - l, ".k%d", a < ws->n0 ? 0 : (a - ws->n0) % (ws->K - 1) + 1);
    }
    return buf;
}

/* A parameter (not a structure factor: refine_lm and information treat those) whose information is zero at the
 * starting model: it does not change the image where the loss looks, and no step of the fit would move it.  Refused
 * before the first step (until stop 58 only after the whole fit, which then wrote nothing), naming it. */
static int informed_at_start(refine_ws *ws, const double *H)
{
    const int n = ws->n;
    char lab[48];
    for (int a = 0; a < n; ++a) {
        if (!is_Fp(ws->params[a]) && !(H[a * n + a] > 0 && isfinite(H[a * n + a]))) {
            return nbgi_error(ws->ctx, NBG_EINVAL, "the refinement does not determine %s: it does not change the "
                              "image where the loss looks (its information at the starting model is %g)",
                              x_label(ws, &ws->fr[0].e, a, lab, sizeof lab), H[a * n + a]);
        }
    }
    return NBG_OK;
}

static int determined(refine_ws *ws, const double *H)
{
    const int n = ws->n;
    const nbg_experiment *e = &ws->fr[0].e;
    char lab[48];
    for (int a = 0; a < n; ++a) {
        if (!(H[a * n + a] > 0) || !isfinite(H[a * n + a])) {
            return nbgi_error(ws->ctx, NBG_EINVAL, "the refinement does not determine %s: it does not change the image "
                             "where the loss looks (its information is %g)",
                             x_label(ws, e, a, lab, sizeof lab), H[a * n + a]);
        }
    }
    if (n < 2) {
        return NBG_OK;
    }
    double *C = malloc(sizeof(double) * ((size_t)n * n + (size_t)n)), *w = C != NULL ? C + (size_t)n * n : NULL;
    if (C == NULL) {
        return nbgi_error(ws->ctx, NBG_ENOMEM, "out of memory for %d parameters", n);
    }
    for (int a = 0; a < n; ++a) {
        for (int b = 0; b < n; ++b) {
            C[a * n + b] = H[a * n + b] / sqrt(H[a * n + a] * H[b * n + b]);
        }
    }
    /* eigenvalues ascending; the eigenvectors in C's columns */
    if (LAPACKE_dsyev(LAPACK_ROW_MAJOR, 'V', 'L', n, C, n, w) != 0) {
        free(C);
        return nbgi_error(ws->ctx, NBG_EINVAL, "the information matrix could not be decomposed (not finite?)");
    }
    int rc = NBG_OK;
    if (!(w[0] > NBG_RCOND_MIN * w[n - 1])) {
        char names[400];
        size_t k = 0;
        names[0] = '\0';
        for (int a = 0; a < n && k < sizeof names - 60; ++a) {
            const double v = C[a * n + 0];
            if (fabs(v) >= 0.2) {
                k += (size_t)snprintf(names + k, sizeof names - k, "%s%+.2f %s", k > 0 ? " " : "", v,
                                      x_label(ws, e, a, lab, sizeof lab));
            }
        }
        rc = nbgi_error(ws->ctx, NBG_EINVAL, "the refinement does not determine its parameters: the combination %s "
                        "(in units of each one's own standard error) does not change the image (the information "
                        "matrix's condition number is %.2g, above %.0e): fix one of them, or fit more data", names,
                        w[0] > 0 ? w[n - 1] / w[0] : INFINITY, 1 / NBG_RCOND_MIN);
    }
    free(C);
    return rc;
}

/* Standard errors and correlations from the information matrix at x. */
static int information(refine_ws *ws, nbg_refine_result *res)
{
    const int n = ws->n;
    double *const g = malloc(sizeof(double) * ((size_t)n * n + (size_t)n)), *const H = g != NULL ? g + n : NULL, L;
    if (g == NULL) {
        return nbgi_error(ws->ctx, NBG_ENOMEM, "out of memory for %d parameters", n);
    }
    int rc = NBG_OK;
    if (ws->gn_cached && ws->gn_fresh) {
        /* LM ended on a Gauss-Newton point and nothing was rendered since: the same loss, gradient and matrix */
        L = ws->gn_L;
        memcpy(g, ws->gn_g, sizeof(double) * (size_t)n);
        memcpy(H, ws->gn_H, sizeof(double) * (size_t)n * n);
    } else {
        rc = gauss_newton(ws, &L, g, H);
    }
    /* a structure factor the fit put at zero carries no information in F (dM/dF = 2 F K): its standard error is
     * left undefined (NaN), its row and column out of the inversion.  So is a parameter that the fit moved to where
     * it no longer changes the image where the loss looks (it had information at the start, informed_at_start: a
     * mosaic domain's turn that took it away from every spot region): res->undetermined counts them */
    unsigned char *zeroF = calloc((size_t)n, 1);
    if (zeroF == NULL) {
        free(g);
        return nbgi_error(ws->ctx, NBG_ENOMEM, "out of memory for %d parameters", n);
    }
    for (int a = 0; rc == NBG_OK && a < n; ++a) {
        if (!(H[a * n + a] > 0 && isfinite(H[a * n + a]))) {
            int f = !is_Fp(ws->params[a]);
            for (int k = 0; !f && k < ws->nFx; ++k) {
                f = ws->Fa[k] == a;
            }
            if (!f) {
                continue; /* a structure factor not among the fitted entries: determined() names it */
            }
            zeroF[a] = 1;
            res->undetermined += !is_Fp(ws->params[a]);
            for (int b = 0; b < n; ++b) H[a * n + b] = H[b * n + a] = 0;
            H[a * n + a] = 1;
        }
    }
    if (rc == NBG_OK) {
        rc = determined(ws, H);
    }
    if (rc != NBG_OK) {
        free(zeroF);
        free(g);
        return rc;
    }
    /* H = 2 J^T W J (least squares) or the Fisher information (Poisson); the covariance is its inverse, times
     * the reduced chi-square for least squares: cov = s^2 (J^T W J)^-1, s^2 = L / (n_obs - n) */
    res->step_sigma = step_sigma(ws, g, H, L);
    res->nobs = (long)ws->nobs;
    const double fac = cov_factor(ws, L);
    if (ws->loss == NBG_LOSS_LSQ) {
        for (int a = 0; a < n * n; ++a) {
            H[a] /= 2;
        }
    }
    if (LAPACKE_dpotrf(LAPACK_ROW_MAJOR, 'L', n, H, n) != 0 || LAPACKE_dpotri(LAPACK_ROW_MAJOR, 'L', n, H, n) != 0) {
        free(g);
        free(zeroF);
        return nbgi_error(ws->ctx, NBG_EINVAL, "the information matrix is singular: a refined parameter does not "
                         "change the image, or two parameters are degenerate");
    }
    for (int a = 0; a < n; ++a) {
        for (int b = a + 1; b < n; ++b) {
            H[a * n + b] = H[b * n + a];
        }
    }
    for (int a = 0; a < n; ++a) {
        res->sigma[a] = zeroF[a] || (ws->pinned != NULL && ws->pinned[a]) ? NAN : sqrt(fmax(H[a * n + a] * fac, 0));
        res->F_zero += ws->pinned != NULL && ws->pinned[a];
    }
    free(zeroF);
    for (int a = 0; a < n; ++a) {
        for (int b = 0; b < n; ++b) {
            const double den = sqrt(H[a * n + a] * H[b * n + b]);
            res->corr[a * n + b] = den > 0 ? H[a * n + b] / den : 0;
        }
    }
    free(g);
    return NBG_OK;
}

/* The Poisson deviance of one count k at mean mu, 2 (k log(k / mu) - (k - mu)). */
static double deviance1(double k, double mu)
{
    return 2 * ((k > 0 ? k * log(k / mu) : 0) - (k - mu));
}

/* The mean and variance of deviance1(k, mu) for k ~ Poisson(mu), tabulated on a logarithmic grid of mu (below
 * DEV_MU_MAX by summing over k from P(0) = exp(-mu), which stays a normal double there; above it the asymptotic
 * 1 + 1/(6 mu) (off by 2e-5 at 100) and 2 + c / mu, c matched at the end). */
#define DEV_GRID 480
#define DEV_MU_MIN 1e-9
#define DEV_MU_MAX 100.0
typedef struct {
    double E[DEV_GRID], V[DEV_GRID], cV;
} dev_table;

static void dev_table_fill(dev_table *t)
{
    for (int g = 0; g < DEV_GRID; ++g) {
        const double mu = DEV_MU_MIN * pow(DEV_MU_MAX / DEV_MU_MIN, (double)g / (DEV_GRID - 1));
        const double kmax = mu + 14 * sqrt(mu) + 30;
        double p = exp(-mu), e = 0, e2 = 0;
        for (double k = 0; k <= kmax; ++k) {
            const double d = deviance1(k, mu);
            e += p * d;
            e2 += p * d * d;
            p *= mu / (k + 1);
        }
        t->E[g] = e;
        t->V[g] = fmax(e2 - e * e, 0);
    }
    t->cV = (t->V[DEV_GRID - 1] - 2) * DEV_MU_MAX;
}

static void dev_moments(const dev_table *t, double mu, double *E, double *V)
{
    if (mu >= DEV_MU_MAX) {
        *E = 1 + 1 / (6 * mu);
        *V = 2 + t->cV / mu;
        return;
    }
    if (mu <= DEV_MU_MIN) {
        *E = *V = 0;
        return;
    }
    const double x = log(mu / DEV_MU_MIN) / log(DEV_MU_MAX / DEV_MU_MIN) * (DEV_GRID - 1);
    int g = (int)x;
    g = g < 0 ? 0 : g > DEV_GRID - 2 ? DEV_GRID - 2 : g;
    const double f = x - g;
    *E = t->E[g] + f * (t->E[g + 1] - t->E[g]);
    *V = t->V[g] + f * (t->V[g + 1] - t->V[g]);
}

void nbgi_deviance_moments(double mu, double *E, double *V)
{
    dev_table *t = malloc(sizeof *t);
    if (t == NULL) {
        *E = *V = NAN;
        return;
    }
    dev_table_fill(t);
    dev_moments(t, mu, E, V);
    free(t);
}

/* Goodness of fit at the optimum (nbg_fit_quality), from each frame's model image (the last rendered, at x). */
static int fit_quality(refine_ws *ws, nbg_fit_quality *q)
{
    memset(q, 0, sizeof *q);
    q->sigma_scale = 1;
    double *m = malloc(sizeof(double) * (ws->nobs ? ws->nobs : 1));
    dev_table *tab = malloc(sizeof *tab);
    if (m == NULL || tab == NULL) {
        free(m);
        free(tab);
        return nbgi_error(ws->ctx, NBG_ENOMEM, "out of memory for the goodness of fit of %zu pixels", ws->nobs);
    }
    dev_table_fill(tab);
    /* the spots: the brightest 5 % of the model's pixels */
    size_t n = 0;
    for (int f = 0; f < ws->nf; ++f) {
        const refine_frame *fr = &ws->fr[f];
        for (size_t t = 0; t < fr->nw; ++t) {
            if (fr->use[t]) {
                m[n++] = fr->img[at(fr, t)];
            }
        }
    }
    const double bright = n > 0 ? nbgi_kth(m, n, n - 1 - n / 20) : INFINITY;
    free(m);
    double D = 0, E = 0, V = 0, Ds = 0, Es = 0, Vs = 0;
    long ns = 0;
    for (int f = 0; f < ws->nf; ++f) {
        const refine_frame *fr = &ws->fr[f];
        nbgi_response_cursor rcur;
        nbgi_response_init(&rcur, &fr->e);
        for (size_t t = 0; t < fr->nw; ++t) {
            if (!fr->use[t]) {
                continue;
            }
            const size_t i = at(fr, t);
            const nbg_detector_model *r = nbgi_response_at(&rcur, i);
            const double s = r->read_noise > 0 ? (r->read_noise / r->gain) * (r->read_noise / r->gain) : 0;
            const double M = fr->img[i], y = (fr->obs[i] - r->pedestal) / r->gain;
            const double mu = fmax(M + s, 1e-12), d = deviance1(fmax(y + s, 0), mu);
            double e, v;
            dev_moments(tab, mu, &e, &v);
            D += d;
            E += e;
            V += v;
            if (M >= bright) {
                Ds += d;
                Es += e;
                Vs += v;
                ++ns;
            }
        }
    }
    free(tab);
    /* fitting k parameters lowers the deviance's expectation by about k (of the spots' share, about k too: the
     * parameters are the crystal's, which the spots carry; at most half of it) */
    const double k = ws->n, Ek = fmax(E - k, 1), Esk = fmax(Es - fmin(k, Es / 2), 1e-300);
    q->n = (long)n;
    q->nspots = ns;
    q->deviance = D;
    q->expected = Ek;
    q->ratio = D / Ek;
    q->sd = sqrt(V) / Ek;
    q->ratio_spots = ns > 0 ? Ds / Esk : NAN;
    q->sd_spots = ns > 0 ? sqrt(Vs) / Esk : NAN;
    const int bad_all = q->ratio > 1.05 && q->ratio - 1 > 5 * q->sd;
    const int bad_spots = ns > 0 && q->ratio_spots > 1.05 && q->ratio_spots - 1 > 5 * q->sd_spots;
    q->mismatch = bad_all || bad_spots;
    q->sigma_scale = ws->loss == NBG_LOSS_POISSON ? sqrt(fmax(1, q->ratio)) : 1;
    snprintf(q->message, sizeof q->message, "%sdeviance / expected %.4g (+- %.2g) over %ld pixels, %.4g (+- %.2g) "
             "over the brightest %ld (the spots)%s", q->mismatch ? "the model does not explain the data within their "
             "noise: " : "", q->ratio, q->sd, q->n, q->ratio_spots, q->sd_spots, ns,
             !q->mismatch ? ": within the noise"
             : ws->loss == NBG_LOSS_POISSON ? "; the standard errors assume it does (scale them by sqrt(ratio))"
                                           : "; the standard errors assume it does");
    return NBG_OK;
}

void nbg_refine_result_free(nbg_refine_result *res)
{
    if (res == NULL) {
        return;
    }
    free(res->params);
    free(res->start); /* start, value, sigma and corr are one allocation */
    free(res->tied);
    free(res->knot);
    free(res->knot_phi);
    res->knot = NULL;
    res->knot_phi = NULL;
    res->nknots = 0;
    res->tied = NULL;
    res->params = NULL;
    res->start = res->value = res->sigma = res->corr = NULL;
    res->nparams = 0;
}

void nbg_scan_knot_weights(double t, int nknots, double *w)
{
    if (w == NULL || nknots < 1) {
        return;
    }
    for (int k = 0; k < nknots; ++k) {
        w[k] = 0;
    }
    if (nknots == 1) {
        w[0] = 1;
        return;
    }
    t = !(t > 0) ? 0 : t > 1 ? 1 : t;
    const double u = t * (nknots - 1);
    int k = (int)floor(u);
    k = k > nknots - 2 ? nknots - 2 : k;
    const double fr = u - k;
    w[k] = 1 - fr;
    w[k + 1] = fr;
}

static int is_orient(nbg_param p)
{
    return p >= 0 && p < NBG_NPARAMS && nbgi_param_rows[p].setup == NBGI_S_ORIENT;
}

/* Whether p varies over the scan (nbg_refine_options.scan_varying_knots): an orientation offset, and with
 * scan_varying_cell a cell parameter. */
static int is_scan_varying(nbg_param p, int cell)
{
    return is_orient(p) || (cell && p >= 0 && p < NBG_NPARAMS && nbgi_param_rows[p].setup == NBGI_S_CELL);
}

void nbg_refine_options_default(nbg_refine_options *o)
{
    memset(o, 0, sizeof *o);
    o->method = NBG_OPT_LM;
    o->loss = NBG_LOSS_LSQ;
    o->max_iter = 100;
    o->ftol = 1e-12;
    o->gtol = 1e-9;
    o->stol = 1e-3;
}


/* The final verdict: the optimizer's reason judged by the Gauss-Newton step left (res->step_sigma) and the
 * bounds; fills converged and why. */
static void verdict(const refine_ws *ws, const double *x, const nbg_refine_options *opt, nbg_refine_result *res)
{
    const double ss = res->step_sigma;
    for (int j = 0; j < ws->n && ss > opt->stol; ++j) {
        /* the Gauss-Newton step from the final point leaves the parameter's range: the optimum lies beyond the
         * bound the fit ended against */
        if (isfinite(ws->dstep[j]) && !x_in_bounds(ws->params[j], x[j] + ws->dstep[j]) &&
            !(ws->pinned != NULL && ws->pinned[j])) {
            res->reason = NBG_STOP_BOUND;
            res->converged = 0;
            snprintf(res->why, sizeof res->why, "%s ended at %g against a bound of its range (the Gauss-Newton step "
                     "leads to %g): the optimum lies beyond it; the standard errors do not apply",
                     nbg_param_name(ws->params[j]), x[j], x[j] + ws->dstep[j]);
            return;
        }
    }
    switch (res->reason) {
    case NBG_STOP_STEP:
        res->converged = 1;
        snprintf(res->why, sizeof res->why, "the Gauss-Newton step left is %.2g standard errors (below %g)", ss,
                 opt->stol);
        break;
    case NBG_STOP_FTOL: case NBG_STOP_GTOL: case NBG_STOP_NO_DECREASE:
    {
        /* at the optimum when the step left is within a standard error, or when the decrease it predicts is below
         * the loss's own rounding (noise-free data: the standard errors are then rounding-sized themselves) */
        const int within = ss <= 1, rounding = ws->dpred <= ws->eps;
        res->converged = within || rounding;
        char tail[80];
        if (within) {
            snprintf(tail, sizeof tail, "%s", "");
        } else if (rounding) {
            snprintf(tail, sizeof tail, ", its predicted decrease %.2g below the loss's rounding %.2g", ws->dpred,
                     ws->eps);
        } else {
            snprintf(tail, sizeof tail, " (more than 1: not at the optimum)");
        }
        snprintf(res->why, sizeof res->why, "%s; the Gauss-Newton step left is %.2g standard errors%s",
                 res->reason == NBG_STOP_FTOL ? "the loss changed by less than ftol or its rounding"
                 : res->reason == NBG_STOP_GTOL ? "the scaled gradient fell below gtol"
                 : opt->method == NBG_OPT_LM ? "no step lowers the loss (largest damping)"
                                             : "the line search found no lower point",
                 ss, tail);
        break;
    }
    default:
        res->converged = 0;
        snprintf(res->why, sizeof res->why, "the iteration limit (%d) was reached; the Gauss-Newton step left is "
                 "%.2g standard errors", opt->max_iter, ss);
        break;
    }
}

/* The scan-varying orientation's checks, knots and frame weights: K knots over the frames' rotation range; svw[f K +
 * k] frame f's weights, kphi[k] knot k's angle (deg). */
static int sv_setup(nbg_ctx *ctx, const nbg_experiment *frames, int nframes, const nbg_param *params, int nparams,
                    int K, int cell, const nbg_hkl *Ft, int *nor, double **svw, double **kphi)
{
    *nor = 0;
    int any_orient = 0;
    for (int j = 0; j < nparams; ++j) {
        *nor += is_scan_varying(params[j], cell);
        any_orient |= is_orient(params[j]);
    }
    if (K < 2 || K > NBGI_MAX_KNOTS) {
        return nbgi_error(ctx, NBG_EINVAL, "nbg_refine: a scan-varying orientation of %d knots (2 to %d; 0 is off)", K,
                          NBGI_MAX_KNOTS);
    }
    if (nframes < 2) {
        return nbgi_error(ctx, NBG_EINVAL, "nbg_refine: a scan-varying orientation needs a scan of several frames "
                          "(got %d)", nframes);
    }
    if (K > nframes) {
        return nbgi_error(ctx, NBG_EINVAL, "nbg_refine: a scan-varying orientation of %d knots over %d frames: at most "
                          "one knot a frame (the knots would not be determined)", K, nframes);
    }
    if (!any_orient) {
        return nbgi_error(ctx, NBG_EINVAL, "nbg_refine: a scan-varying orientation needs an orientation parameter "
                          "(orient_x, orient_y, orient_z) among those fitted");
    }
    if (Ft != NULL) {
        return nbgi_error(ctx, NBG_EINVAL, "nbg_refine: a scan-varying orientation is not fitted with the structure "
                          "factors (options.F)");
    }
    double s0 = INFINITY, s1 = -INFINITY;
    for (int f = 0; f < nframes; ++f) {
        const double osc = isfinite(frames[f].osc) ? frames[f].osc : 0, a = frames[f].phi0, b = a + osc;
        if (!isfinite(a)) {
            return nbgi_error(ctx, NBG_EINVAL, "nbg_refine: frame %d's start angle is not finite", f);
        }
        s0 = fmin(s0, fmin(a, b));
        s1 = fmax(s1, fmax(a, b));
    }
    if (!(s1 > s0)) {
        return nbgi_error(ctx, NBG_EINVAL, "nbg_refine: a scan-varying orientation needs frames over a rotation range "
                          "(every frame is at phi %g deg)", s0);
    }
    *svw = malloc(sizeof(double) * (size_t)nframes * (size_t)K);
    *kphi = malloc(sizeof(double) * (size_t)K);
    if (*svw == NULL || *kphi == NULL) {
        free(*svw);
        free(*kphi);
        *svw = *kphi = NULL;
        return nbgi_error(ctx, NBG_ENOMEM, "out of memory for %d knots over %d frames", K, nframes);
    }
    for (int f = 0; f < nframes; ++f) {
        const double osc = isfinite(frames[f].osc) ? frames[f].osc : 0, mid = frames[f].phi0 + osc / 2;
        nbg_scan_knot_weights((mid - s0) / (s1 - s0), K, *svw + (size_t)f * (size_t)K);
    }
    for (int k = 0; k < K; ++k) {
        (*kphi)[k] = s0 + (s1 - s0) * k / (K - 1);
    }
    return NBG_OK;
}

/* The fit.  ex, when not NULL, is a test's point (x over the fitted list and its knots): nothing is fitted; eout
 * receives the Gauss-Newton pass's loss and gradient there, then the adjoint's (nbgi_debug_refine_eval). */
/* refine_core's set-up scratch (the workspace's buffer, the scan-varying map and weights, the knots' angles until
 * the result takes them), freed on every way out. */
static void core_scratch_free(double *wbuf, int *svo, double *svl, double *svw, double *kphi)
{
    free(wbuf);
    free(svo);
    free(svl);
    free(svw);
    free(kphi);
}

static int refine_core(nbg_ctx *ctx, nbg_experiment *frames, int nframes, const float *const *observed,
                       const float *const *weights, size_t npix, const nbg_param *params, int nparams,
                       const nbg_param *xparams, const int *xof, int nx, nbg_hkl *Ft, const nbg_refine_options *opt,
                       nbg_refine_result *res, const double *ex, double *eout)
{
    if (ctx == NULL || frames == NULL || observed == NULL || params == NULL || opt == NULL || res == NULL) {
        return nbgi_error(ctx, NBG_EINVAL, "nbg_refine: NULL argument");
    }
    if (nframes < 1 || nframes > 100000) {
        return nbgi_error(ctx, NBG_EINVAL, "nbg_refine_frames: %d frames (1 to 100000)", nframes);
    }
    for (int f = 0; f < nframes; ++f) {
        if (observed[f] == NULL) {
            return nbgi_error(ctx, NBG_EINVAL, "nbg_refine_frames: no observed image for frame %d", f);
        }
        if (frames[f].nmotions != frames[0].nmotions) {
            return nbgi_error(ctx, NBG_EINVAL, "nbg_refine_frames: frame %d has %d panel motions, frame 0 %d", f,
                             frames[f].nmotions, frames[0].nmotions);
        }
    }
    if (nparams < 1) {
        return nbgi_error(ctx, NBG_EINVAL, "nbg_refine: %d parameters (at least 1)", nparams);
    }
    if (opt->method != NBG_OPT_LM && opt->method != NBG_OPT_BFGS) {
        return nbgi_error(ctx, NBG_EINVAL, "nbg_refine: unknown method %d", (int)opt->method);
    }
    nbg_experiment *const e = &frames[0];
    int rc = nbgi_params_check(ctx, e, params, nparams, 0, "nbg_refine");
    if (rc != NBG_OK) {
        return rc;
    }
    for (int j = 0; j < nparams && Ft == NULL; ++j) {
        if (nbgi_param_kind(params[j], NULL, NULL, NULL) == NBGI_K_F) {
            char label[48];
            return nbgi_error(ctx, NBG_EINVAL, "nbg_refine: parameter %s: structure factors are fitted through "
                             "nbg_refine_options.F (per-reflection scales), not listed",
                             nbg_param_label(e, params[j], label, sizeof label));
        }
    }
    nbg_refine_result_free(res);
    memset(res, 0, sizeof *res);
    /* a scan-varying orientation: K knots of each orientation parameter (nor of them), x longer by nor (K - 1) */
    const int K = opt->scan_varying_knots;
    int nor = 0;
    double *svw = NULL, *kphi = NULL;
    if (K != 0 && (rc = sv_setup(ctx, frames, nframes, params, nparams, K, opt->scan_varying_cell, Ft, &nor, &svw,
                                 &kphi)) != NBG_OK) {
        return rc;
    }
    const int n0 = nparams, nall = nparams + (K > 0 ? nor * (K - 1) : 0);
    /* the result's arrays, and the workspace's scratch: n x n twice (correlations; step_sigma's solve), n 8 times */
    const size_t n = (size_t)nall;
    res->params = malloc(sizeof(nbg_param) * n);
    double *const rbuf = malloc(sizeof(double) * (n * n + 3 * n));
    double *const wbuf = calloc(2 * n * n + 8 * n, sizeof(double));
    int *const svo = K > 0 ? malloc(sizeof(int) * (size_t)n0 + sizeof(int) * n) : NULL;
    double *const svl = K > 0 ? malloc(sizeof(double) * ((size_t)n0 + (size_t)n0 * (size_t)n0)) : NULL;
    if (res->params == NULL || rbuf == NULL || wbuf == NULL || (K > 0 && (svo == NULL || svl == NULL))) {
        free(res->params);
        res->params = NULL;
        free(rbuf);
        core_scratch_free(wbuf, svo, svl, svw, kphi);
        return nbgi_error(ctx, NBG_ENOMEM, "out of memory for %d parameters", nall);
    }
    res->start = rbuf;
    res->value = rbuf + n;
    res->sigma = rbuf + 2 * n;
    res->corr = rbuf + 3 * n;
    memset(rbuf, 0, sizeof(double) * (n * n + 3 * n));
    double *const x = wbuf + n * n + 6 * n;
    for (int j = 0; j < nparams; ++j) {
        char label[48];
        nbg_param_label(e, params[j], label, sizeof label);
        nbg_param_get(e, params[j], &x[j]);
        if (is_Fp(params[j])) {
            x[j] *= x[j];
        }
        if (!x_in_bounds(params[j], x[j])) {
            const double v = x[j];
            core_scratch_free(wbuf, svo, svl, svw, kphi);
            return nbgi_error(ctx, NBG_EINVAL, "the start value %g of %s is outside its bounds", v, label);
        }
        res->params[j] = params[j];
        res->start[j] = x[j];
    }
    if (K > 0) {
        /* orientation parameter j's knots 1..K-1 after the list, each starting where the parameter does */
        int *const knot = svo + n0;
        int s = 0;
        for (int j = 0; j < nparams; ++j) {
            svo[j] = is_scan_varying(params[j], opt->scan_varying_cell) ? s++ : -1;
            knot[j] = svo[j] >= 0 ? 0 : -1;
        }
        for (int j = 0; j < nparams; ++j) {
            for (int k = 1; svo[j] >= 0 && k < K; ++k) {
                const int i = n0 + svo[j] * (K - 1) + k - 1;
                res->params[i] = params[j];
                res->start[i] = x[i] = x[j];
                knot[i] = k;
            }
        }
        res->nknots = K;
        res->knot = malloc(sizeof(int) * n);
        res->knot_phi = kphi;
        kphi = NULL;
        if (res->knot != NULL) {
            memcpy(res->knot, knot, sizeof(int) * n);
        } else {
            core_scratch_free(wbuf, svo, svl, svw, kphi);
            return nbgi_error(ctx, NBG_ENOMEM, "out of memory for %d parameters", nall);
        }
    }
    res->nparams = nall;
    if (!(opt->stol > 0) || !(opt->ftol >= 0) || !(opt->gtol >= 0) || opt->max_iter < 1) {
        core_scratch_free(wbuf, svo, svl, svw, kphi);
        return nbgi_error(ctx, NBG_EINVAL, "nbg_refine: max_iter must be positive, stol positive, ftol and gtol not "
                         "negative (got %d, %g, %g, %g)", opt->max_iter, opt->stol, opt->ftol, opt->gtol);
    }
    refine_ws ws;
    memset(&ws, 0, sizeof ws);
    ws.A = wbuf;
    ws.d = wbuf + n * n;
    ws.dstep = ws.d + n;
    ws.scale = ws.dstep + n;
    ws.xs = ws.scale + n;
    ws.gs = ws.xs + n;
    ws.gf = ws.gs + n;
    ws.gn_g = wbuf + n * n + 7 * n;
    ws.gn_H = ws.gn_g + n;
    ws.ctx = ctx;
    ws.loss = opt->loss;
    ws.params = K > 0 ? res->params : params;
    ws.n = nall;
    ws.n0 = n0;
    ws.K = K > 0 ? K : 0;
    ws.svo = svo;
    ws.svw = svw;
    ws.gl = svl;
    ws.Hl = svl != NULL ? svl + n0 : NULL;
    ws.xparams = xparams;
    ws.xof = xof;
    ws.nx = nx;
    ws.gx = malloc(sizeof(double) * (size_t)nx);
    ws.npix = npix;
    ws.Ft = Ft;
    ws.nf = nframes;
    ws.fr = calloc((size_t)nframes, sizeof *ws.fr);
    rc = ws.fr == NULL || ws.gx == NULL ? nbgi_error(ctx, NBG_ENOMEM, "out of memory for %d frames", nframes) : NBG_OK;
    if (rc == NBG_OK && Ft != NULL) {
        /* the structure factors among the parameters, and the other rendered ones */
        const size_t nF = (size_t)(Ft->h_max - Ft->h_min + 1) * (size_t)(Ft->k_max - Ft->k_min + 1) *
                          (size_t)(Ft->l_max - Ft->l_min + 1);
        ws.Fa = malloc(sizeof(int) * (size_t)(nx + 1) * 2);
        ws.qx = ws.Fa != NULL ? ws.Fa + nx + 1 : NULL;
        ws.Fidx = malloc(sizeof(long) * (size_t)(nx + 1));
        ws.Fids = malloc(sizeof(nbg_param) * (size_t)(nx + 1) * 2);
        ws.xq = ws.Fids != NULL ? ws.Fids + nx + 1 : NULL;
        ws.gF = malloc(sizeof(double) * (size_t)(nx + 1) * 2); /* one frame's, then the sum */
        ws.Fsave = malloc(sizeof(double) * nF);
        ws.c1 = malloc(sizeof(float) * (npix ? npix : 1) * 4);
        ws.Fs0 = malloc(sizeof(double) * (size_t)(nx + 1));
        ws.pinned = calloc((size_t)nparams + 1, 1);
        if (ws.Fs0 == NULL || ws.pinned == NULL) {
            rc = nbgi_error(ctx, NBG_ENOMEM, "out of memory for the structure factors' Jacobian");
        } else if (ws.Fa == NULL || ws.Fidx == NULL || ws.Fids == NULL || ws.gF == NULL || ws.Fsave == NULL || ws.c1 == NULL) {
            rc = nbgi_error(ctx, NBG_ENOMEM, "out of memory for the structure factors' Jacobian");
        } else {
            ws.c2 = ws.c1 + npix;
            ws.c3 = ws.c2 + npix;
            ws.dl = ws.c3 + npix;
            for (int k = 0; k < nx; ++k) {
                long idx;
                if (nbgi_param_kind(xparams[k], NULL, NULL, NULL) == NBGI_K_F && k < nparams) {
                    idx = (long)xparams[k] - NBG_P_F0;
                    ws.Fa[ws.nFx] = k;
                    ws.Fs0[ws.nFx] = Ft->F[idx] * Ft->F[idx];
                    ws.Fidx[ws.nFx] = idx;
                    ws.Fids[ws.nFx++] = xparams[k];
                } else {
                    ws.qx[ws.nq] = k;
                    ws.xq[ws.nq++] = xparams[k];
                }
            }
        }
    }
    if (rc == NBG_OK && e->nmotions > 0) {
        /* the motions are parameters shared by the frames: trial steps go to one copy, which every frame's
         * experiment reads; the callers' lists get the fitted values at the end */
        ws.motions = malloc(sizeof(nbg_panel_motion) * (size_t)e->nmotions);
        if (ws.motions == NULL) {
            rc = nbgi_error(ctx, NBG_ENOMEM, "out of memory for %d panel motions", e->nmotions);
        } else {
            memcpy(ws.motions, e->motions, sizeof(nbg_panel_motion) * (size_t)e->nmotions);
        }
    }
    /* per frame: the pixels in the loss (active: ROI and mask; of positive weight) and the buffers */
    size_t lit = 0;
    for (int f = 0; rc == NBG_OK && f < nframes; ++f) {
        refine_frame *fr = &ws.fr[f];
        fr->e = frames[f];
        fr->e.motions = ws.motions;
        fr->obs = observed[f];
        fr->w = weights != NULL ? weights[f] : NULL;
        fr->list = frames[f].pixels;
        nbgi_plan pl;
        rc = nbgi_plan_build(ctx, &fr->e, &pl);
        if (rc != NBG_OK) {
            break;
        }
        if ((size_t)pl.k.npix != npix) {
            nbgi_plan_free(&pl);
            rc = nbgi_error(ctx, NBG_EINVAL, "the observed image%s holds %zu pixels, the detector has %ld",
                            nframes > 1 ? " of each frame" : "", npix, pl.k.npix);
            break;
        }
        fr->nw = (size_t)nbgi_nwalk(&pl.k);
        fr->use = malloc(fr->nw ? fr->nw : 1);
        fr->img = malloc(sizeof(float) * npix);
        fr->T = malloc(sizeof(double) * (fr->nw ? fr->nw : 1) * (size_t)nx);
        if (fr->use == NULL || fr->img == NULL || fr->T == NULL) {
            nbgi_plan_free(&pl);
            rc = nbgi_error(ctx, NBG_ENOMEM, "out of memory for %d Jacobian images of %zu pixels", nparams, fr->nw);
            break;
        }
        nbgi_response_cursor rcur;
        nbgi_response_init(&rcur, &fr->e);
        for (size_t t = 0; t < fr->nw; ++t) {
            const size_t i = nbgi_walk_at(&pl.k, (long)t);
            fr->use[t] = nbgi_model_active(&pl.k, i) && (fr->w == NULL || fr->w[i] > 0);
            ws.nobs += fr->use[t];
            lit += fr->use[t] && fr->obs[i] > nbgi_response_at(&rcur, i)->pedestal;
        }
        nbgi_plan_free(&pl);
    }
    if (rc == NBG_OK && Ft != NULL && ws.nq > 0) {
        size_t maxnw = 1;
        for (int f = 0; f < nframes; ++f) maxnw = ws.fr[f].nw > maxnw ? ws.fr[f].nw : maxnw;
        if ((ws.Tq = malloc(sizeof(double) * maxnw * (size_t)ws.nq)) == NULL) {
            rc = nbgi_error(ctx, NBG_ENOMEM, "out of memory for %d Jacobian images of %zu pixels", ws.nq, maxnw);
        }
    }
    /* an image without signal has nothing to fit: the Poisson loss would drive the model to zero intensity (an
     * ever larger cell, say) and least squares to no particular place */
    if (rc == NBG_OK && ws.nobs == 0) {
        rc = nbgi_error(ctx, NBG_EINVAL, "no pixel of the observed image%s is in the loss: every one is masked (the "
                        "file's mask and overloaded pixels, -mask, -roi, the spot regions%s): there is nothing to fit",
                        nframes > 1 ? "s" : "", weights != NULL ? ", zero weights" : "");
    } else if (rc == NBG_OK && lit == 0) {
        rc = nbgi_error(ctx, NBG_EINVAL, "the observed image%s no signal (no pixel above the pedestal %g%s): "
                        "there is nothing to fit", nframes > 1 ? "s have" : " has", e->response.pedestal,
                        weights != NULL ? " with a positive weight" : "");
    }
    /* validates sizes, the observed images and the parameters' support */
    double L0;
    if (rc == NBG_OK) {
        rc = loss_only(&ws, &L0);
    }
    if (rc == NBG_OK && ex != NULL) {
        /* a test's point: the Gauss-Newton pass's loss and gradient, then the adjoint's */
        double *const Hb = malloc(sizeof(double) * n * n);
        rc = Hb == NULL ? nbgi_error(ctx, NBG_ENOMEM, "out of memory") : !set_params(&ws, ex)
             ? nbgi_error(ctx, NBG_EINVAL, "the point is outside the parameters' bounds") : NBG_OK;
        if (rc == NBG_OK) {
            rc = gauss_newton(&ws, &eout[0], eout + 1, Hb);
        }
        if (rc == NBG_OK) {
            rc = adjoint_sums(&ws, &eout[1 + n]);
            memcpy(eout + 2 + n, ws.gs, sizeof(double) * n);
        }
        free(Hb);
        ex = NULL;
        goto cleanup;
    }
    if (rc == NBG_OK) {
        res->start_loss = L0;
        rc = linear_start(&ws, x);
    }
    if (rc == NBG_OK) {
        rc = opt->method == NBG_OPT_LM ? refine_lm(&ws, x, opt, res) : refine_bfgs(&ws, x, opt, res);
    }
    if (rc == NBG_OK) {
        set_params(&ws, x);
        for (int j = 0; j < nall; ++j) {
            res->value[j] = x[j];
        }
        rc = information(&ws, res);
        if (rc == NBG_OK) {
            rc = fit_quality(&ws, &res->fit);
        }
        if (rc == NBG_OK) {
            verdict(&ws, x, opt, res);
            /* the floor of each frame against its model: the first that does not match, else frame 0's */
            for (int f = 0; rc == NBG_OK && f < nframes; ++f) {
                nbg_floor_check fc;
                rc = nbg_check_floor(ctx, &ws.fr[f].e, ws.fr[f].obs, ws.fr[f].w, ws.fr[f].img, npix, &fc);
                if (rc == NBG_OK && (f == 0 || (fc.mismatch && !res->floor.mismatch))) {
                    res->floor = fc;
                }
            }
        }
        if (rc == NBG_OK) {
            for (int f = 0; f < nframes; ++f) {
                nbg_panel_motion *const caller = frames[f].motions;
                frames[f] = ws.fr[f].e;
                frames[f].motions = caller;
                if (caller != NULL && ws.motions != NULL) {
                    memcpy(caller, ws.motions, sizeof(nbg_panel_motion) * (size_t)e->nmotions);
                }
            }
        }
    }
cleanup:
    for (int f = 0; ws.fr != NULL && f < nframes; ++f) {
        free(ws.fr[f].img);
        free(ws.fr[f].T);
        free(ws.fr[f].use);
    }
    free(ws.fr);
    free(ws.motions);
    free(ws.gx);
    free(ws.Fa);
    free(ws.Fidx);
    free(ws.Fids);
    free(ws.gF);
    free(ws.Fsave);
    free(ws.c1);
    free(ws.Tq);
    free(ws.Fs0);
    free(ws.pinned);
    core_scratch_free(wbuf, svo, svl, svw, kphi);
    return rc;
}

/* The cell under the space group: which of the listed cell parameters are fitted (the first listed of each tied
 * group), which follow one of them and which are held; the start cell made symmetric in every frame (within 1 %
 * and 1 deg, else an error).  red/nred: the parameters fitted, in the caller's order; rof[j]: the index in red of
 * caller parameter j's, -1 held; xp/xof/nx: red, then every other member of a fitted cell group. */
static int cell_constraints(nbg_ctx *ctx, nbg_experiment *frames, int nframes, const nbg_param *params, int nparams,
                            nbg_param *red, int *nred, int *rof, nbg_param *xp, int *xof, int *nx, char *text,
                            size_t tsize)
{
    nbg_experiment *const e = &frames[0];
    int ncell = 0;
    for (int j = 0; j < nparams; ++j) {
        ncell += params[j] >= 0 && params[j] < NBG_NPARAMS && nbgi_param_rows[params[j]].setup == NBGI_S_CELL;
    }
    /* the space group is read only where a cell parameter is refined (every local fit of an ensemble comes here) */
    nbg_cell_constraints cc = {.system = NBG_SYSTEM_TRICLINIC};
    if (ncell > 0 && e->has_cell) {
        const int rc = nbg_cell_constraints_get(ctx, e->space_group, &cc);
        if (rc != NBG_OK) {
            return rc;
        }
    }
    text[0] = 0;
    const int constrained = cc.system != NBG_SYSTEM_TRICLINIC;
    if (constrained) {
        /* the start cell (unset b, c: a's; unset angles: 90) and how far it is from the symmetry */
        double cell[6], sym[6];
        for (int i = 0; i < 6; ++i) {
            cell[i] = e->cell[i];
        }
        for (int i = 1; i < 3; ++i) {
            cell[i] = isnan(cell[i]) ? cell[0] : cell[i];
        }
        for (int i = 3; i < 6; ++i) {
            cell[i] = isnan(cell[i]) ? 90 : cell[i];
        }
        double worst_len = 0, worst_ang = 0;
        for (int i = 0; i < 6; ++i) {
            if (cc.tie[i] < 0) {
                sym[i] = cc.fixed[i];
            } else {
                double sum = 0;
                int cnt = 0;
                for (int k = 0; k < 6; ++k) {
                    if (cc.tie[k] == cc.tie[i]) {
                        sum += cell[k], cnt++;
                    }
                }
                sym[i] = sum / cnt;
            }
            if (i < 3) {
                worst_len = fmax(worst_len, fabs(cell[i] - sym[i]) / sym[i]);
            } else {
                worst_ang = fmax(worst_ang, fabs(cell[i] - sym[i]));
            }
        }
        if (!(worst_len <= 0.01 && worst_ang <= 1)) {
            return nbgi_error(ctx, NBG_EINVAL, "the start cell %g %g %g %g %g %g is not %s (%s%.3g %s from it): give "
                              "the space group it has (-space_group P 1 fits all six parameters)", cell[0], cell[1],
                              cell[2], cell[3], cell[4], cell[5], cc.description, "off by ",
                              worst_len > 0.01 ? 100 * worst_len : worst_ang, worst_len > 0.01 ? "%" : "deg");
        }
        for (int f = 0; f < nframes; ++f) {
            for (int i = 0; i < 6; ++i) {
                frames[f].cell[i] = sym[i];
            }
        }
        snprintf(text, tsize, "cell constrained by the space group: %s", cc.description);
        if (worst_len > 0 || worst_ang > 0) {
            const size_t l = strlen(text);
            snprintf(text + l, tsize - l, "; the start cell made symmetric (by up to %.2g %% and %.2g deg)",
                     100 * worst_len, worst_ang);
        }
    }
    /* each listed parameter: fitted, following a listed one, or held */
    int group_rep[6]; /* a cell group's fitted parameter: its index in red, or -1 */
    for (int i = 0; i < 6; ++i) {
        group_rep[i] = -1;
    }
    *nred = 0;
    int held = 0;
    for (int j = 0; j < nparams; ++j) {
        const int is_cell = constrained && params[j] >= 0 && params[j] < NBG_NPARAMS &&
                            nbgi_param_rows[params[j]].setup == NBGI_S_CELL;
        if (!is_cell) {
            rof[j] = *nred;
            red[(*nred)++] = params[j];
            continue;
        }
        const int i = nbgi_param_rows[params[j]].index, L = cc.tie[i];
        if (L < 0) {
            rof[j] = -1;
            held++;
        } else if (group_rep[L] >= 0) {
            rof[j] = group_rep[L];
        } else {
            group_rep[L] = *nred;
            rof[j] = *nred;
            red[(*nred)++] = params[j];
        }
    }
    /* the rendered list: the fitted ones, then every other member of a fitted cell group */
    *nx = 0;
    for (int r = 0; r < *nred; ++r) {
        xp[*nx] = red[r];
        xof[(*nx)++] = r;
    }
    for (int L = 0; constrained && L < 6; ++L) {
        if (group_rep[L] < 0) {
            continue;
        }
        const int lead = nbgi_param_rows[red[group_rep[L]]].index;
        for (int i = 0; i < 6; ++i) {
            if (cc.tie[i] == L && i != lead) {
                for (int p = 0; p < NBG_NPARAMS; ++p) {
                    if (nbgi_param_rows[p].setup == NBGI_S_CELL && nbgi_param_rows[p].index == i) {
                        xp[*nx] = (nbg_param)p;
                        xof[(*nx)++] = group_rep[L];
                    }
                }
            }
        }
    }
    if (constrained) {
        const size_t l = strlen(text);
        snprintf(text + l, tsize - l, "; %d cell parameter%s fitted, %d listed tied to them, %d held", *nred - (nparams - ncell),
                 *nred - (nparams - ncell) == 1 ? "" : "s", ncell - (*nred - (nparams - ncell)) - held, held);
    }
    return NBG_OK;
}

static int refine_params(nbg_ctx *ctx, nbg_experiment *frames, int nframes, const float *const *observed,
                         const float *const *weights, size_t npix, const nbg_param *params, int nparams,
                         nbg_hkl *Ft, const nbg_refine_options *opt, nbg_refine_result *res, const double *ex,
                         double *eout)
{
    if (ctx == NULL || frames == NULL || params == NULL || res == NULL || nframes < 1) {
        return refine_core(ctx, frames, nframes, observed, weights, npix, params, nparams, params, NULL, 0, NULL, opt,
                           res, NULL, NULL);
    }
    if (nparams < 1 || nparams > 100000) {
        return nbgi_error(ctx, NBG_EINVAL, "nbg_refine: %d parameters (1 to 100000)", nparams);
    }
    const size_t N = (size_t)nparams;
    nbg_param *const red = malloc(sizeof(nbg_param) * 3 * N);
    int *const ibuf = malloc(sizeof(int) * 3 * N);
    double *const start0 = malloc(sizeof(double) * N);
    if (red == NULL || ibuf == NULL || start0 == NULL) {
        free(red);
        free(ibuf);
        free(start0);
        return nbgi_error(ctx, NBG_ENOMEM, "out of memory for %d parameters", nparams);
    }
    nbg_param *const xp = red + N;
    int *const rof = ibuf, *const xof = ibuf + N;
    /* a copy of the start cell: the caller's frames are left as they were on failure */
    double cell0[6];
    memcpy(cell0, frames[0].cell, sizeof cell0);
    for (int j = 0; j < nparams; ++j) {
        start0[j] = NAN;
        nbg_param_get(&frames[0], params[j], &start0[j]);
    }
    int nred = 0, nx = 0;
    char text[320];
    int rc = cell_constraints(ctx, frames, nframes, params, nparams, red, &nred, rof, xp, xof, &nx, text,
                              sizeof text);
    if (rc == NBG_OK && nred == 0) {
        rc = nbgi_error(ctx, NBG_EINVAL, "nothing to fit: every parameter listed is held by the space group (%s)",
                        text);
    }
    if (rc == NBG_OK) {
        rc = refine_core(ctx, frames, nframes, observed, weights, npix, red, nred, xp, xof, nx, Ft, opt, res, ex, eout);
    }
    if (rc != NBG_OK || ex != NULL) {
        for (int f = 0; f < nframes; ++f) {
            memcpy(frames[f].cell, cell0, sizeof cell0);
        }
        free(red);
        free(ibuf);
        free(start0);
        return rc;
    }
    /* the result over the caller's list: a tied parameter takes its leader's value, error and correlations; a held
     * one its fixed value, error 0; then the knots of a scan-varying orientation beyond the list (core entries nred
     * on) */
    const int extra = res->nparams - nred;
    const size_t NT = N + (size_t)extra;
    nbg_param *const rp = malloc(sizeof(nbg_param) * NT);
    double *const rbuf = malloc(sizeof(double) * (NT * NT + 3 * NT));
    int *const tied = malloc(sizeof(int) * NT);
    int *const knot = res->knot != NULL ? malloc(sizeof(int) * NT) : NULL;
    if (rp == NULL || rbuf == NULL || tied == NULL || (res->knot != NULL && knot == NULL)) {
        free(rp);
        free(rbuf);
        free(tied);
        free(knot);
        free(red);
        free(ibuf);
        free(start0);
        return nbgi_error(ctx, NBG_ENOMEM, "out of memory for %d parameters", nparams);
    }
    double *const st = rbuf, *const va = rbuf + NT, *const sg = rbuf + 2 * NT, *const co = rbuf + 3 * NT;
    for (int j = 0; j < (int)NT; ++j) {
        const int r = j < nparams ? rof[j] : nred + (j - nparams);
        rp[j] = j < nparams ? params[j] : res->params[r];
        st[j] = j < nparams ? start0[j] : res->start[r];
        if (knot != NULL) {
            knot[j] = r >= 0 ? res->knot[r] : -1;
        }
        if (knot != NULL && knot[j] >= 0) {
            va[j] = res->value[r]; /* a knot (each frame holds its own interpolation) */
        } else {
            nbg_param_get(&frames[0], params[j], &va[j]);
        }
        sg[j] = r >= 0 ? res->sigma[r] : 0;
        tied[j] = j;
        if (r < 0) {
            tied[j] = -1;
        } else {
            for (int k = 0; k < j && k < nparams; ++k) { /* (a knot beyond the list is its own) */
                if (rof[k] == r) {
                    tied[j] = k;
                    break;
                }
            }
        }
        for (int k = 0; k < (int)NT; ++k) {
            const int q = k < nparams ? rof[k] : nred + (k - nparams);
            co[(size_t)j * NT + (size_t)k] = r >= 0 && q >= 0 ? res->corr[r * res->nparams + q] : (j == k ? 1 : 0);
        }
    }
    free(res->params);
    free(res->start);
    free(res->tied);
    free(res->knot);
    res->params = rp;
    res->start = st;
    res->value = va;
    res->sigma = sg;
    res->corr = co;
    res->tied = tied;
    res->knot = knot;
    res->nparams = (int)NT;
    snprintf(res->constraint, sizeof res->constraint, "%s", text);
    free(red);
    free(ibuf);
    free(start0);
    return NBG_OK;
}

/* ---- per-reflection scales: the structure factors fitted with the parameters (nbg_refine_options.F) ---- */

/* The structure-factor step's sums over the frames' loss pixels.  The model is M = G sum_j F_j^2 K_j + bg, so with
 * u_p = M_p - bg_p (the crystal's part) and, where pixel p sees one reflection j, dM_p/dF_j = 2 u_p / F_j, the loss's
 * quadratic (Gauss-Newton; Fisher scoring for Poisson) model in s_j = F_j^2 is minimised at
 * s_j' / s_j = sum_p c_p u_p (u_p - d_p / c_p) / sum_p c_p u_p^2, with d_p = dL/dM_p and c_p its curvature at M_p.
 * Both sums are adjoint passes over the table: A_j = sum_p (dM_p/dF_j) c_p u_p and B_j = sum_p (dM_p/dF_j)
 * (c_p u_p - d_p) (weights included), so that F_j' = F_j sqrt(B_j / A_j).  For Poisson without a background this
 * is expectation-maximisation's step.  Frames are added in order (the sums are the same for any thread count). */
typedef struct {
    nbg_ctx *ctx;
    nbg_experiment *frames;
    int nf;
    const float *const *obs, *const *w;
    size_t npix, nF;
    nbg_loss loss;
    nbg_param *ids;         /* NBG_P_F(0 .. nF - 1) */
    double *A, *B, *part;   /* nF each: the sums, and one frame's pass */
    float *img, *dl, *dl2;  /* npix each */
} fstep_ws;

/* Adds frame f's adjoint pass of dl (over e's pixels) into acc. */
static int fstep_pass(fstep_ws *fs, const nbg_experiment *e, const float *dl, double *acc)
{
    const int rc = nbg_simulate_grad(fs->ctx, e, dl, fs->ids, (int)fs->nF, fs->part, fs->img, fs->npix, NULL);
    if (rc != NBG_OK) {
        return rc;
    }
    for (size_t j = 0; j < fs->nF; ++j) {
        acc[j] += fs->part[j];
    }
    return NBG_OK;
}

/* mode 0: the sums A and B at the current table over the loss's pixels (*L the loss there, L may be NULL);
 * mode 1: A = each entry's predicted photons (times 2 / F) over every active pixel of the whole detectors (dl = 1);
 * mode 2: B = the same over the loss's pixels.  Modes 1 and 2 say which entries the loss's pixels measure. */
static int fstep_sums(fstep_ws *fs, int mode, double *L)
{
    memset(fs->A, 0, sizeof(double) * fs->nF);
    memset(fs->B, 0, sizeof(double) * fs->nF);
    double sum = 0;
    for (int f = 0; f < fs->nf; ++f) {
        nbg_experiment e = fs->frames[f];
        if (mode == 1) { /* the whole detectors: each entry's predicted photons */
            e.pixels = NULL;
            e.npixels_list = 0;
        }
        nbgi_plan pl;
        int rc = nbgi_plan_build(fs->ctx, &e, &pl);
        if (rc != NBG_OK) {
            return rc;
        }
        const long nw = nbgi_nwalk(&pl.k);
        const float *const w = fs->w != NULL ? fs->w[f] : NULL;
        memset(fs->dl, 0, sizeof(float) * fs->npix);
        if (mode == 0) {
            memset(fs->dl2, 0, sizeof(float) * fs->npix);
            rc = nbg_simulate(fs->ctx, &e, fs->img, fs->npix, NULL);
        }
        nbgi_response_cursor rcur;
        nbgi_response_init(&rcur, &e);
        for (long t = 0; rc == NBG_OK && t < nw; ++t) {
            const size_t i = nbgi_walk_at(&pl.k, t);
            const double wi = w != NULL ? w[i] : 1.0;
            if (!nbgi_model_active(&pl.k, i) || !(wi > 0)) {
                continue;
            }
            if (mode != 0) {
                fs->dl[i] = 1;
                continue;
            }
            double d, c;
            sum += wi * nbgi_pixel_loss(fs->loss, nbgi_response_at(&rcur, i), fs->img[i], fs->obs[f][i], &d, &c);
            const double u = fs->img[i] - nbgi_model_bg(&e, &pl.k, i);
            fs->dl[i] = (float)(wi * c * u);
            fs->dl2[i] = (float)(wi * (c * u - d));
        }
        if (rc == NBG_OK) {
            rc = fstep_pass(fs, &e, fs->dl, mode == 2 ? fs->B : fs->A);
        }
        if (rc == NBG_OK && mode == 0) {
            rc = fstep_pass(fs, &e, fs->dl2, fs->B);
        }
        nbgi_plan_free(&pl);
        if (rc != NBG_OK) {
            return rc;
        }
    }
    if (L != NULL) {
        *L = sum;
    }
    return NBG_OK;
}

/* The entries the loss's pixels measure: cand[j] when at least half entry j's predicted photons on the whole
 * detectors fall in them (a whole-detector adjoint pass, then one over the loss's pixels).  The fraction is F_j's
 * photons over F_j's photons: it does not depend on the table's values. */
static int fstep_candidates(fstep_ws *fs, unsigned char *cand)
{
    double *const whole = fs->part + fs->nF; /* scratch after part */
    int rc = fstep_sums(fs, 1, NULL);
    if (rc != NBG_OK) {
        return rc;
    }
    memcpy(whole, fs->A, sizeof(double) * fs->nF);
    rc = fstep_sums(fs, 2, NULL);
    if (rc != NBG_OK) {
        return rc;
    }
    for (size_t j = 0; j < fs->nF; ++j) {
        cand[j] = fs->B[j] > 0 && fs->B[j] >= 0.5 * whole[j];
    }
    return NBG_OK;
}

/* The candidates (fstep_candidates) that at least two of the loss's pixels see alone, at the table's values: fit[j],
 * *nfit of them (an entry seen only through pixels it shares with others would have no row in the Gauss-Newton
 * matrix: frame_jacobian's test). */
static int fstep_select(fstep_ws *fs, const unsigned char *isc, unsigned char *fit, long *nfit)
{
    int rc = NBG_OK;
    long ncand = 0;
    for (size_t j = 0; j < fs->nF; ++j) {
        ncand += isc[j] != 0;
    }
    long *const cand = malloc(sizeof(long) * (size_t)(ncand + 1));
    long *const owned = calloc((size_t)(ncand + 1), sizeof(long));
    float *const m3 = malloc(sizeof(float) * (fs->npix ? fs->npix : 1) * 3);
    double *const Fs = fs->part; /* coded_renders' scratch of nF */
    nbg_hkl *const t = (nbg_hkl *)fs->frames[0].hkl;
    if (cand == NULL || owned == NULL || m3 == NULL) {
        free(cand), free(owned), free(m3);
        return nbgi_error(fs->ctx, NBG_ENOMEM, "out of memory for %ld structure factors", ncand);
    }
    long k = 0;
    for (size_t j = 0; j < fs->nF; ++j) {
        fit[j] = 0;
        if (isc[j]) cand[k++] = (long)j;
    }
    for (int f = 0; rc == NBG_OK && f < fs->nf; ++f) {
        const nbg_experiment *e = &fs->frames[f];
        float *const ma = m3, *const mb = m3 + fs->npix, *const mc = m3 + 2 * fs->npix;
        rc = coded_renders(fs->ctx, e, t, cand, ncand, Fs, ma, mb, mc, fs->npix);
        nbgi_plan pl;
        if (rc == NBG_OK && (rc = nbgi_plan_build(fs->ctx, e, &pl)) == NBG_OK) {
            const long nw = nbgi_nwalk(&pl.k);
            const float *const w = fs->w != NULL ? fs->w[f] : NULL;
            for (long u = 0; u < nw; ++u) {
                const size_t i = nbgi_walk_at(&pl.k, u);
                if (!nbgi_model_active(&pl.k, i) || (w != NULL && !(w[i] > 0))) {
                    continue;
                }
                const long q = coded_owner(ma, mb, mc, i, ncand);
                if (q >= 0) {
                    owned[q]++;
                }
            }
            nbgi_plan_free(&pl);
        }
    }
    *nfit = 0;
    for (long q = 0; q < ncand; ++q) {
        fit[cand[q]] = owned[q] >= 2;
        *nfit += fit[cand[q]];
    }
    free(cand), free(owned), free(m3);
    return rc;
}

/* One cycle's structure-factor step over the entries fit selects: iterations of
 * F_j' = F_j sqrt(B_j / A_j) until no entry moves by 1e-6 of itself (at most 50).  *first: the first iteration's
 * largest relative move; *L the loss before the step. */
static int fstep(fstep_ws *fs, nbg_hkl *t, const double *F0, const unsigned char *fit, double *first, double *L)
{
    int rc = NBG_OK;
    *first = 0;
    for (int it = 0; it < 50; ++it) {
        double Lit;
        rc = fstep_sums(fs, 0, &Lit);
        if (rc != NBG_OK) {
            return rc;
        }
        if (it == 0) {
            *L = Lit;
        }
        double moved = 0;
        for (size_t j = 0; j < fs->nF; ++j) {
            const double F = t->F[j];
            if (!fit[j] || !(fs->A[j] > 0) || F == 0) {
                continue;
            }
            /* a reflection the data put at no photons goes to 1e-6 of its start, not to 0: F = 0 is a fixed point
             * of the step, and the next cycle's orientation may show it after all */
            const double Fn = fmax(fabs(F) * sqrt(fmax(fs->B[j], 0) / fs->A[j]), 1e-6 * fabs(F0[j]));
            moved = fmax(moved, fabs(Fn - fabs(F)) / fabs(F));
            t->F[j] = Fn;
        }
        if (it == 0) {
            *first = moved;
        }
        if (moved <= 1e-6) {
            break;
        }
    }
    return NBG_OK;
}

static int refine_with_F(nbg_ctx *ctx, nbg_experiment *frames, int nframes, const float *const *observed,
                         const float *const *weights, size_t npix, const nbg_param *params, int nparams,
                         const nbg_refine_options *opt, nbg_refine_result *res)
{
    nbg_hkl *const t = opt->F;
    if (t->F == NULL || t->h_max < t->h_min || t->k_max < t->k_min || t->l_max < t->l_min) {
        return nbgi_error(ctx, NBG_EINVAL, "nbg_refine: the structure factors to fit (options.F) hold no table");
    }
    if (opt->method != NBG_OPT_LM) {
        return nbgi_error(ctx, NBG_EINVAL, "nbg_refine: the structure factors are fitted by Levenberg-Marquardt only");
    }
    if (nparams < 1) {
        return nbgi_error(ctx, NBG_EINVAL, "nbg_refine: the structure factors are fitted together with the "
                          "parameters: list at least one (e.g. bg)");
    }
    for (int f = 0; f < nframes; ++f) {
        if (frames[f].hkl != t) {
            return nbgi_error(ctx, NBG_EINVAL, "nbg_refine: frame %d's experiment does not point at the structure "
                              "factors to fit (options.F)", f);
        }
    }
    for (int j = 0; j < nparams; ++j) {
        if (params[j] == NBG_P_SCALE || params[j] == NBG_P_FLUENCE) {
            return nbgi_error(ctx, NBG_EINVAL, "nbg_refine: %s is an overall factor on every F^2: it cannot be "
                              "fitted with the structure factors (hold it)", nbg_param_name(params[j]));
        }
    }
    const size_t nF = (size_t)(t->h_max - t->h_min + 1) * (size_t)(t->k_max - t->k_min + 1) *
                      (size_t)(t->l_max - t->l_min + 1);
    if (nF > (size_t)(NBG_P_F0 - 1) || nF > (size_t)INT_MAX) {
        return nbgi_error(ctx, NBG_EINVAL, "nbg_refine: a table of %zu structure factors is too large to fit", nF);
    }
    fstep_ws fs = {ctx, frames, nframes, observed, weights, npix, nF, opt->loss, NULL, NULL, NULL, NULL, NULL,
                   NULL, NULL};
    fs.ids = malloc(sizeof(nbg_param) * nF);
    double *const dbuf = malloc(sizeof(double) * nF * 5);
    unsigned char *const fit = malloc(nF * 2), *const isc = fit != NULL ? fit + nF : NULL;
    fs.img = malloc(sizeof(float) * (npix ? npix : 1));
    fs.dl = malloc(sizeof(float) * (npix ? npix : 1) * 2);
    fs.dl2 = fs.dl != NULL ? fs.dl + (npix ? npix : 1) : NULL;
    int rc = NBG_OK;
    if (fs.ids == NULL || dbuf == NULL || fit == NULL || fs.img == NULL || fs.dl == NULL) {
        rc = nbgi_error(ctx, NBG_ENOMEM, "out of memory for %zu structure factors", nF);
    }
    double *const F0 = dbuf + 4 * nF;
    if (rc == NBG_OK) {
        fs.A = dbuf;
        fs.B = dbuf + nF;
        fs.part = dbuf + 2 * nF; /* and whole after it */
        for (size_t j = 0; j < nF; ++j) {
            fs.ids[j] = NBG_P_F((long)j);
        }
        memcpy(F0, t->F, sizeof(double) * nF);
    }
    /* the entries the loss's pixels measure, brought to their optimum at the start (the parameters held), then one
     * Levenberg-Marquardt fit of the parameters and those entries together */
    long nfit = 0;
    double moved = 0, Lc = NAN;
    nbg_param *ext = NULL;
    if (rc == NBG_OK) {
        rc = fstep_candidates(&fs, isc);
    }
    if (rc == NBG_OK) {
        rc = fstep_select(&fs, isc, fit, &nfit);
    }
    if (rc == NBG_OK) {
        rc = fstep(&fs, t, F0, fit, &moved, &Lc);
    }
    if (rc == NBG_OK) { /* again at the step's values: an entry the data put at no photons has no information in F */
        rc = fstep_select(&fs, isc, fit, &nfit);
    }
    if (rc == NBG_OK && (ext = malloc(sizeof(nbg_param) * ((size_t)nparams + (size_t)nfit))) == NULL) {
        rc = nbgi_error(ctx, NBG_ENOMEM, "out of memory for %ld structure factors", nfit);
    }
    if (rc == NBG_OK) {
        memcpy(ext, params, sizeof(nbg_param) * (size_t)nparams);
        int m = nparams;
        for (size_t j = 0; j < nF; ++j) {
            if (fit[j]) {
                ext[m++] = NBG_P_F((long)j);
            }
        }
        rc = refine_params(ctx, frames, nframes, observed, weights, npix, ext, m, t, opt, res, NULL, NULL);
    }
    if (rc == NBG_OK) {
        /* the entries were fitted as s = F^2: their standard errors in F, sigma_s / (2 F) */
        for (int j = 0; j < res->nparams; ++j) {
            if (res->params[j] >= NBG_P_F0) {
                res->sigma[j] = res->value[j] > 0 ? res->sigma[j] / (2 * res->value[j]) : NAN;
            }
        }
        res->F_fitted = nfit;
        res->F_moved = moved;
    }
    if (rc != NBG_OK && dbuf != NULL && fs.A != NULL) {
        memcpy(t->F, F0, sizeof(double) * nF); /* the caller's table as it was */
    }
    free(ext);
    free(fs.ids);
    free(dbuf);
    free(fit);
    free(fs.img);
    free(fs.dl);
    return rc;
}

int nbg_refine_frames(nbg_ctx *ctx, nbg_experiment *frames, int nframes, const float *const *observed,
                      const float *const *weights, size_t npix, const nbg_param *params, int nparams,
                      const nbg_refine_options *opt, nbg_refine_result *res)
{
    if (opt != NULL && opt->F != NULL && opt->scan_varying_knots != 0) {
        return nbgi_error(ctx, NBG_EINVAL, "nbg_refine: a scan-varying orientation is not fitted with the structure "
                          "factors (options.F)");
    }
    if (opt != NULL && opt->F != NULL && ctx != NULL && frames != NULL && observed != NULL && params != NULL &&
        res != NULL && nframes >= 1 && nframes <= 100000) {
        for (int f = 0; f < nframes; ++f) {
            if (observed[f] == NULL) {
                return nbgi_error(ctx, NBG_EINVAL, "nbg_refine_frames: no observed image for frame %d", f);
            }
        }
        return refine_with_F(ctx, frames, nframes, observed, weights, npix, params, nparams, opt, res);
    }
    return refine_params(ctx, frames, nframes, observed, weights, npix, params, nparams, NULL, opt, res, NULL, NULL);
}

int nbgi_debug_refine_eval(nbg_ctx *ctx, nbg_experiment *frames, int nframes, const float *const *observed,
                           size_t npix, const nbg_param *params, int nparams, const nbg_refine_options *opt,
                           const double *x, double *out)
{
    if (x == NULL || out == NULL || opt == NULL || opt->F != NULL) {
        return nbgi_error(ctx, NBG_EINVAL, "nbgi_debug_refine_eval: NULL argument or F");
    }
    nbg_refine_result res;
    memset(&res, 0, sizeof res);
    const int rc = refine_params(ctx, frames, nframes, observed, NULL, npix, params, nparams, NULL, opt, &res, x,
                                 out);
    nbg_refine_result_free(&res);
    return rc;
}

int nbg_refine(nbg_ctx *ctx, nbg_experiment *e, const float *observed, const float *weights, size_t npix,
               const nbg_param *params, int nparams, const nbg_refine_options *opt, nbg_refine_result *res)
{
    if (e == NULL || observed == NULL) {
        return nbgi_error(ctx, NBG_EINVAL, "nbg_refine: NULL argument");
    }
    const float *const obs[1] = {observed}, *const w[1] = {weights};
    return nbg_refine_frames(ctx, e, 1, obs, weights != NULL ? w : NULL, npix, params, nparams, opt, res);
}
