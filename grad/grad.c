/*
 * grad.c -- nbg_simulate_grad and nbg_loss_grad: the adjoint kernel, then the host-side chain rule from the
 * kernel's quantities to the user's parameters.
 *
 * Chain rule, for each group of parameters:
 *   - crystal vectors: abc[phi, m] = U_m Rot(u, phi) a0, so d_a0 = sum Rot^T U_m^T d_abc and, with the domain
 *     angle theta_m = spread * c_m, d_spread = sum d_abc . (dU_m/dtheta c_m) Rot a0;
 *   - a0 and a* as functions of the cell, the misset angles and (with -mat) the wavelength, and the detector
 *     vectors as functions of distance, beam shift, rotations and two-theta: these set-up maps are differentiated
 *     by the complex step on the same code the plan runs (src/setup_tmpl.h instantiated for double complex):
 *     f'(x) = Im f(x + i h) / h, exact to rounding since nothing is subtracted;
 *   - wavelength: each source's lambda_i = lambda0 * c_i (c_i = 0 for a wavelength given in a source file);
 *   - fluence: scale = r_e^2 fluence / steps and I_bg are proportional to it;
 *   - N, polarization, structure factors: straight from the kernel.
 */
#define NBG_SETUP_COMPLEX
#include "adjoint.h"
#include "forward.h"
#include "plan.h"
#include "kernel.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#ifdef _OPENMP
#include <omp.h>
#endif

#define RTD (180.0 / M_PI)
#define CSTEP 1e-30 /* complex step */

static const char *const param_names[NBG_NPARAMS] = {
    "a", "b", "c", "alpha", "beta", "gamma", "rotx", "roty", "rotz", "Na", "Nb", "Nc",
    "mosaic", "lambda", "fluence", "polar", "distance", "beam_fast", "beam_slow",
    "det_rotx", "det_roty", "det_rotz", "twotheta"};

const char *nbg_param_name(nbg_param p)
{
    if (p == NBG_NPARAMS) {
        return "F";
    }
    return (p >= 0 && p < NBG_NPARAMS) ? param_names[p] : "?";
}

int nbg_param_from_name(const char *name)
{
    for (int i = 0; i < NBG_NPARAMS; ++i) {
        if (strcmp(name, param_names[i]) == 0) {
            return i;
        }
    }
    return -1;
}

static double *param_field(nbg_experiment *e, nbg_param p)
{
    switch (p) {
    case NBG_P_A: case NBG_P_B: case NBG_P_C: case NBG_P_ALPHA: case NBG_P_BETA: case NBG_P_GAMMA:
        return &e->cell[p - NBG_P_A];
    case NBG_P_ROTX: case NBG_P_ROTY: case NBG_P_ROTZ:
        return &e->misset[p - NBG_P_ROTX];
    case NBG_P_NA: return &e->Na;
    case NBG_P_NB: return &e->Nb;
    case NBG_P_NC: return &e->Nc;
    case NBG_P_MOSAIC: return &e->mosaic;
    case NBG_P_LAMBDA: return &e->lambda;
    case NBG_P_FLUENCE: return &e->fluence;
    case NBG_P_POLAR: return &e->polarization;
    case NBG_P_DISTANCE: return &e->distance;
    case NBG_P_BEAM_FAST: return &e->beam_shift[0];
    case NBG_P_BEAM_SLOW: return &e->beam_shift[1];
    case NBG_P_DET_ROTX: case NBG_P_DET_ROTY: case NBG_P_DET_ROTZ:
        return &e->det_rot[p - NBG_P_DET_ROTX];
    case NBG_P_TWOTHETA: return &e->twotheta;
    default: return NULL;
    }
}

int nbg_param_get(const nbg_experiment *e, nbg_param p, double *value)
{
    double *f = param_field((nbg_experiment *)e, p);
    if (f == NULL || value == NULL) {
        return NBG_EINVAL;
    }
    *value = *f;
    return NBG_OK;
}

int nbg_param_set(nbg_experiment *e, nbg_param p, double value)
{
    double *f = param_field(e, p);
    if (f == NULL || !isfinite(value)) {
        return NBG_EINVAL;
    }
    *f = value;
    return NBG_OK;
}

void nbg_debug_break_adjoint(nbg_ctx *ctx, int param)
{
    if (ctx != NULL) {
        ctx->break_param = param;
    }
}

/* Which parameters have a free value in this experiment, and which modes the adjoint does not cover. */
static int check_supported(nbg_ctx *ctx, const nbg_experiment *e, const nbg_plan *pl, nbg_param_mask mask)
{
    if (e->oversample_thick || e->oversample_polar || e->oversample_omega) {
        return nbg_error(ctx, NBG_EUNSUP, "gradients are not available with -oversample_thick/_polar/_omega "
                                          "(nanoBragg's running-sum modes)");
    }
    if (e->curved) {
        return nbg_error(ctx, NBG_EUNSUP, "gradients are not available for the curved detector");
    }
    for (int p = 0; p < NBG_NPARAMS; ++p) {
        if (!(mask & NBG_MASK(p))) {
            continue;
        }
        if (p <= NBG_P_GAMMA && !e->has_cell) {
            return nbg_error(ctx, NBG_EUNSUP, "the gradient in %s needs -cell (with -mat alone the cell is not "
                             "a free parameter)", param_names[p]);
        }
        if (p >= NBG_P_ROTX && p <= NBG_P_ROTZ && e->misset_random) {
            return nbg_error(ctx, NBG_EUNSUP, "the gradient in %s needs explicit -misset angles (pass the random "
                             "ones printed by the simulation with -misset)", param_names[p]);
        }
        if (p >= NBG_P_NA && p <= NBG_P_NC && e->sample_x + e->sample_y + e->sample_z > 0) {
            return nbg_error(ctx, NBG_EUNSUP, "the gradient in %s needs N given directly (not -samplesize)",
                             param_names[p]);
        }
        if (p == NBG_P_MOSAIC && !(pl->mosaic_spread > 0 && pl->k.nmos > 1)) {
            return nbg_error(ctx, NBG_EUNSUP, "the gradient in mosaic needs a positive spread and several domains");
        }
        if (p == NBG_P_FLUENCE && e->flux != 0) {
            return nbg_error(ctx, NBG_EUNSUP, "the gradient in fluence is not free when -flux sets the fluence");
        }
    }
    return NBG_OK;
}

/* Rotation matrix (row-major) of rotate_axis_d about u by phi, built by rotating the basis. */
static void axis_matrix(const double u[3], double phi, double R[9])
{
    for (int j = 0; j < 3; ++j) {
        double e[3] = {0, 0, 0}, out[3];
        e[j] = 1;
        rotate_axis_d(e, u, phi, out);
        for (int i = 0; i < 3; ++i) {
            R[3 * i + j] = out[i];
        }
    }
}

/* d/dtheta of the Rodrigues matrix about unit axis v: -sin I + cos [v]x + sin v v^T. */
static void rodrigues_dtheta(const double v[3], double th, double D[9])
{
    const double c = cos(th), s = sin(th);
    D[0] = -s + s * v[0] * v[0];
    D[1] = s * v[0] * v[1] - c * v[2];
    D[2] = s * v[0] * v[2] + c * v[1];
    D[3] = s * v[0] * v[1] + c * v[2];
    D[4] = -s + s * v[1] * v[1];
    D[5] = s * v[1] * v[2] - c * v[0];
    D[6] = s * v[0] * v[2] - c * v[1];
    D[7] = s * v[1] * v[2] + c * v[0];
    D[8] = -s + s * v[2] * v[2];
}

/* The chain rule from the reduced accumulators to the user's parameters. */
static void chain_rule(const nbg_experiment *e, const nbg_plan *pl, const nbg_adjacc *acc, nbg_param_mask mask,
                       double *g)
{
    const nbg_kparams *k = &pl->k;
    /* --- crystal: back through the spindle and mosaic rotations to a0 and the spread ---------------------- */
    double d_a0[9] = {0};
    double d_spread = 0;
    for (int ip = 0; ip < k->nphi; ++ip) {
        double R[9];
        axis_matrix(pl->spindle, pl->phi[ip], R);
        double ap[9];
        for (int v = 0; v < 3; ++v) {
            if (pl->phi[ip] != 0) {
                rotate_axis_d(pl->a0 + 3 * v, pl->spindle, pl->phi[ip], ap + 3 * v);
            } else {
                memcpy(ap + 3 * v, pl->a0 + 3 * v, 3 * sizeof(double));
            }
        }
        for (int m = 0; m < k->nmos; ++m) {
            const double *dabc = acc->abc + 9 * ((size_t)ip * k->nmos + m);
            const double *U = pl->umat + 9 * m;
            double D[9];
            const int mosaic = pl->mosaic_spread > 0;
            if (mosaic) {
                rodrigues_dtheta(pl->mos_axis + 3 * m, pl->mos_angle[m], D);
            }
            for (int v = 0; v < 3; ++v) {
                const double *dv = dabc + 3 * v;
                double t[3];
                /* t = U^T dv (U = I without mosaic) */
                for (int j = 0; j < 3; ++j) {
                    t[j] = mosaic ? U[j] * dv[0] + U[3 + j] * dv[1] + U[6 + j] * dv[2] : dv[j];
                }
                /* d_a0 += R^T t (R = I at phi = 0) */
                for (int j = 0; j < 3; ++j) {
                    d_a0[3 * v + j] += pl->phi[ip] != 0 ? R[j] * t[0] + R[3 + j] * t[1] + R[6 + j] * t[2] : t[j];
                }
                if (mosaic) {
                    /* theta_m = spread * c_m: d_spread += dv . (dU/dtheta ap) c_m */
                    const double cm = pl->mos_angle[m] / pl->mosaic_spread;
                    for (int i = 0; i < 3; ++i) {
                        const double Dap = D[3 * i] * ap[3 * v] + D[3 * i + 1] * ap[3 * v + 1] +
                                           D[3 * i + 2] * ap[3 * v + 2];
                        d_spread += dv[i] * Dap * cm;
                    }
                }
            }
        }
    }
    if (mask & NBG_MASK(NBG_P_MOSAIC)) {
        g[NBG_P_MOSAIC] = d_spread / RTD;
    }

    /* --- crystal set-up: complex step on the cell, misset and (with -mat) the wavelength ------------------ */
    const nbg_param_mask xmask = NBG_MASK(NBG_P_A) | NBG_MASK(NBG_P_B) | NBG_MASK(NBG_P_C) |
                                 NBG_MASK(NBG_P_ALPHA) | NBG_MASK(NBG_P_BETA) | NBG_MASK(NBG_P_GAMMA) |
                                 NBG_MASK(NBG_P_ROTX) | NBG_MASK(NBG_P_ROTY) | NBG_MASK(NBG_P_ROTZ) |
                                 NBG_MASK(NBG_P_LAMBDA);
    if (mask & xmask) {
        nbg_xtal_in_d din;
        nbg_plan_xtal_in(e, pl->misset, pl->lambda0, &din);
        for (int p = NBG_P_A; p <= NBG_P_LAMBDA; ++p) {
            if (!(mask & NBG_MASK(p)) || (p > NBG_P_ROTZ && p != NBG_P_LAMBDA)) {
                continue;
            }
            if (p == NBG_P_LAMBDA && !e->has_mat) {
                continue; /* the cell does not depend on the wavelength */
            }
            nbg_xtal_in_z zin;
            zin.has_cell = din.has_cell;
            zin.has_mat = din.has_mat;
            for (int i = 0; i < 6; ++i) {
                zin.cell[i] = din.cell[i];
            }
            memcpy(zin.mat, din.mat, sizeof zin.mat);
            zin.lambda0 = din.lambda0;
            for (int i = 0; i < 3; ++i) {
                zin.misset[i] = din.misset[i];
            }
            double unit; /* parameter unit per set-up unit */
            if (p <= NBG_P_C) {
                zin.cell[p] += CSTEP * _Complex_I;
                unit = 1;
            } else if (p <= NBG_P_GAMMA) {
                zin.cell[p] += CSTEP * _Complex_I;
                unit = 1 / RTD;
            } else if (p <= NBG_P_ROTZ) {
                zin.misset[p - NBG_P_ROTX] += CSTEP * _Complex_I;
                unit = 1 / RTD;
            } else {
                zin.lambda0 += CSTEP * _Complex_I;
                unit = 1e-10;
            }
            double _Complex abc[9], astar[9];
            nbg_crystal_z(&zin, abc, astar);
            double s = 0;
            for (int i = 0; i < 9; ++i) {
                s += d_a0[i] * 1e-10 * cimag(abc[i]) / CSTEP;
                s += acc->astar[i] * cimag(astar[i]) / CSTEP;
            }
            g[p] += s * unit;
        }
    }
    if (mask & NBG_MASK(NBG_P_LAMBDA)) {
        double s = 0;
        for (int i = 0; i < k->nsources; ++i) {
            s += acc->lam[i] * pl->src_lamrel[i];
        }
        g[NBG_P_LAMBDA] += s * 1e-10;
    }

    /* --- detector set-up: complex step ---------------------------------------------------------------------- */
    for (int p = NBG_P_DISTANCE; p <= NBG_P_TWOTHETA; ++p) {
        if (!(mask & NBG_MASK(p))) {
            continue;
        }
        const nbg_det_in_d *d = &pl->det_in;
        nbg_det_in_z z;
        memcpy(z.b, d->b, sizeof z.b);
        memcpy(z.f, d->f, sizeof z.f);
        memcpy(z.s, d->s, sizeof z.s);
        memcpy(z.o, d->o, sizeof z.o);
        memcpy(z.tta, d->tta, sizeof z.tta);
        z.pivot_sample = d->pivot_sample;
        z.have_close = d->have_close;
        z.Fbeam = d->Fbeam;
        z.Sbeam = d->Sbeam;
        z.Fclose = d->Fclose;
        z.Sclose = d->Sclose;
        z.distance = d->distance;
        z.close_distance = d->close_distance;
        for (int i = 0; i < 3; ++i) {
            z.rot[i] = d->rot[i];
        }
        z.twotheta = d->twotheta;
        const double _Complex ih = CSTEP * _Complex_I;
        double unit = 1 / RTD;
        switch (p) {
        case NBG_P_DISTANCE: z.distance += ih; unit = 1e-3; break;
        case NBG_P_BEAM_FAST: z.Fbeam += ih; z.Fclose += ih; unit = 1e-3; break;
        case NBG_P_BEAM_SLOW: z.Sbeam += ih; z.Sclose += ih; unit = 1e-3; break;
        case NBG_P_DET_ROTX: z.rot[0] += ih; break;
        case NBG_P_DET_ROTY: z.rot[1] += ih; break;
        case NBG_P_DET_ROTZ: z.rot[2] += ih; break;
        default: z.twotheta += ih; break;
        }
        nbg_det_out_z out;
        nbg_detector_z(&z, &out);
        double s = acc->close * cimag(out.close_distance) / CSTEP;
        for (int i = 0; i < 3; ++i) {
            s += acc->pix0[i] * cimag(out.pix0[i]) / CSTEP;
            s += acc->f[i] * cimag(out.f[i]) / CSTEP;
            s += acc->s[i] * cimag(out.s[i]) / CSTEP;
            s += acc->o[i] * cimag(out.o[i]) / CSTEP;
        }
        g[p] = s * unit;
    }

    /* --- the rest ------------------------------------------------------------------------------------------ */
    if (mask & NBG_MASK(NBG_P_FLUENCE)) {
        const double fl = pl->rep.fluence;
        g[NBG_P_FLUENCE] = fl != 0 ? (acc->scale * k->scale + acc->Ibg * k->I_bg) / fl : acc->scale * NBG_RE2 / pl->rep.steps;
    }
    if (mask & NBG_MASK(NBG_P_POLAR)) {
        g[NBG_P_POLAR] = acc->K;
    }
    for (int i = 0; i < 3; ++i) {
        if (mask & NBG_MASK(NBG_P_NA + i)) {
            g[NBG_P_NA + i] = acc->N[i];
        }
    }
}

/* Runs the adjoint over the plan with per-thread accumulators and reduces them into grad. */
static int run_adjoint(nbg_ctx *ctx, const nbg_experiment *e, nbg_plan *pl, const float *dLdI,
                       nbg_param_mask mask, nbg_grad *grad, float *image)
{
    const nbg_kparams *k = &pl->k;
    int nthreads = ctx->nthreads;
#ifdef _OPENMP
    if (nthreads <= 0) {
        nthreads = omp_get_max_threads();
    }
#else
    nthreads = 1;
#endif
    const size_t nabc = (size_t)k->nphi * k->nmos * 9;
    const size_t nsrc = (size_t)k->nsources;
    const int wantF = (mask & NBG_MASK_F) != 0;
    const size_t nF = (wantF && k->F != NULL) ? (size_t)k->nh * k->nk * k->nl : 0;
    if (wantF) {
        const size_t need = k->F != NULL ? nF : 1;
        if (grad->dF == NULL || grad->ndF != need) {
            return nbg_error(ctx, NBG_EINVAL, "structure-factor gradients need dF with %zu entries (got %zu)", need,
                             grad->ndF);
        }
    }
    const size_t per = nabc + nsrc + nF;
    nbg_adjacc *tacc = calloc((size_t)nthreads, sizeof *tacc);
    double *buf = calloc((size_t)nthreads * (per ? per : 1), sizeof(double));
    if (tacc == NULL || buf == NULL) {
        free(tacc);
        free(buf);
        return nbg_error(ctx, NBG_ENOMEM, "out of memory for %d gradient accumulators of %zu doubles", nthreads, per);
    }
    for (int t = 0; t < nthreads; ++t) {
        tacc[t].abc = buf + (size_t)t * per;
        tacc[t].lam = tacc[t].abc + nabc;
        tacc[t].F = nF ? tacc[t].lam + nsrc : NULL;
    }
    nbg_adjoint_cpu(k, dLdI, image, tacc, nthreads);
    /* reduce in thread order */
    nbg_adjacc *acc = &tacc[0];
    for (int t = 1; t < nthreads; ++t) {
        double *dst = (double *)acc, *src = (double *)&tacc[t];
        for (size_t i = 0; i < NBG_ADJ_FIXED; ++i) {
            dst[i] += src[i];
        }
        for (size_t i = 0; i < per; ++i) {
            acc->abc[i] += tacc[t].abc[i];
        }
    }
    memset(grad->g, 0, sizeof grad->g);
    chain_rule(e, pl, acc, mask, grad->g);
    if (wantF) {
        if (k->F != NULL) {
            memcpy(grad->dF, acc->F, nF * sizeof(double));
        } else {
            grad->dF[0] = acc->defF;
        }
    }
    if (ctx->break_param >= 0 && ctx->break_param < NBG_NPARAMS) {
        grad->g[ctx->break_param] *= 1.001; /* test-only: a deliberately wrong adjoint */
    }
    free(buf);
    free(tacc);
    return NBG_OK;
}

int nbg_simulate_grad(nbg_ctx *ctx, const nbg_experiment *e, const float *dLdI, nbg_param_mask mask,
                      nbg_grad *grad, float *image, size_t npix, nbg_report *report)
{
    if (ctx == NULL || e == NULL || dLdI == NULL || grad == NULL || image == NULL) {
        return nbg_error(ctx, NBG_EINVAL, "nbg_simulate_grad: NULL argument");
    }
    nbg_plan pl;
    int rc = nbg_plan_build(ctx, e, &pl);
    if (rc != NBG_OK) {
        return rc;
    }
    if ((size_t)pl.k.fpixels * pl.k.spixels != npix) {
        nbg_plan_free(&pl);
        return nbg_error(ctx, NBG_EINVAL, "image buffers hold %zu pixels, the detector has %d x %d", npix,
                         pl.k.fpixels, pl.k.spixels);
    }
    rc = check_supported(ctx, e, &pl, mask);
    if (rc == NBG_OK) {
        rc = run_adjoint(ctx, e, &pl, dLdI, mask, grad, image);
    }
    if (rc == NBG_OK && report != NULL) {
        *report = pl.rep;
    }
    nbg_plan_free(&pl);
    return rc;
}

int nbg_loss_grad(nbg_ctx *ctx, const nbg_experiment *e, nbg_loss loss, const float *observed,
                  const float *weights, nbg_param_mask mask, double *L, nbg_grad *grad, float *image, size_t npix)
{
    if (ctx == NULL || e == NULL || observed == NULL || L == NULL || grad == NULL || image == NULL) {
        return nbg_error(ctx, NBG_EINVAL, "nbg_loss_grad: NULL argument");
    }
    if (loss != NBG_LOSS_LSQ && loss != NBG_LOSS_POISSON) {
        return nbg_error(ctx, NBG_EINVAL, "unknown loss %d", (int)loss);
    }
    for (size_t i = 0; i < npix; ++i) {
        if (!isfinite(observed[i]) || observed[i] < 0) {
            return nbg_error(ctx, NBG_EINVAL, "observed image pixel %zu is %g (must be finite and non-negative)", i,
                             (double)observed[i]);
        }
        if (weights != NULL && (!isfinite(weights[i]) || weights[i] < 0)) {
            return nbg_error(ctx, NBG_EINVAL, "weight of pixel %zu is %g (must be finite and non-negative)", i,
                             (double)weights[i]);
        }
    }
    nbg_plan pl;
    int rc = nbg_plan_build(ctx, e, &pl);
    if (rc != NBG_OK) {
        return rc;
    }
    if ((size_t)pl.k.fpixels * pl.k.spixels != npix) {
        nbg_plan_free(&pl);
        return nbg_error(ctx, NBG_EINVAL, "the observed image has %zu pixels, the detector %d x %d = %zu", npix,
                         pl.k.fpixels, pl.k.spixels, (size_t)pl.k.fpixels * pl.k.spixels);
    }
    rc = check_supported(ctx, e, &pl, mask);
    float *dLdI = NULL;
    if (rc == NBG_OK) {
        rc = nbg_forward_plan(ctx, &pl, image);
    }
    if (rc == NBG_OK) {
        dLdI = malloc(sizeof(float) * npix);
        if (dLdI == NULL) {
            rc = nbg_error(ctx, NBG_ENOMEM, "out of memory for dL/dI");
        }
    }
    if (rc == NBG_OK) {
        double sum = 0;
        for (size_t i = 0; i < npix; ++i) {
            const int f = (int)(i % (size_t)pl.k.fpixels), s = (int)(i / (size_t)pl.k.fpixels);
            if (!nbg_pixel_active(&pl.k, f, s)) {
                dLdI[i] = 0;
                continue;
            }
            const double w = weights != NULL ? weights[i] : 1.0;
            const double I = image[i], y = observed[i];
            if (loss == NBG_LOSS_LSQ) {
                sum += w * (I - y) * (I - y);
                dLdI[i] = (float)(2 * w * (I - y));
            } else {
                /* Poisson NLL; the model is floored at 1e-12 photons where it vanishes */
                const double Ie = I > 1e-12 ? I : 1e-12;
                sum += w * (Ie - y * log(Ie));
                dLdI[i] = (float)(w * (1 - y / Ie));
            }
        }
        *L = sum;
        rc = run_adjoint(ctx, e, &pl, dLdI, mask, grad, image);
    }
    free(dLdI);
    nbg_plan_free(&pl);
    return rc;
}
