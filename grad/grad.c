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
#include "grad.h"
#include "forward.h"
#include "plan.h"
#include "kernel.h"
#ifdef NBG_HAVE_CUDA
#include "nbgi_cuda.h"
#endif

#include <math.h>
#include <stdio.h>
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
    "det_rotx", "det_roty", "det_rotz", "twotheta", "scale", "bg", "bg_fast", "bg_slow", "spindle_tilt1",
    "spindle_tilt2"};

static const char *const motion_names[6] = {"shift_x", "shift_y", "shift_z", "rot_x", "rot_y", "rot_z"};

const char *nbg_param_name(nbg_param p)
{
    int g, c;
    if (p == NBG_NPARAMS) {
        return "F";
    }
    if (nbgi_param_motion(p, &g, &c)) {
        return motion_names[c];
    }
    return (p >= 0 && p < NBG_NPARAMS) ? param_names[p] : "?";
}

const char *nbg_param_label(nbg_param p, char *buf, size_t size)
{
    int g, c;
    if (buf == NULL || size == 0) {
        return buf;
    }
    if (nbgi_param_motion(p, &g, &c)) {
        snprintf(buf, size, "g%d.%s", g, motion_names[c]);
    } else {
        snprintf(buf, size, "%s", nbg_param_name(p));
    }
    return buf;
}

int nbg_param_from_name(const char *name)
{
    if (name == NULL) {
        return -1;
    }
    for (int i = 0; i < NBG_NPARAMS; ++i) {
        if (strcmp(name, param_names[i]) == 0) {
            return i;
        }
    }
    /* g<group>.<component> */
    if (name[0] == 'g' && name[1] >= '0' && name[1] <= '9') {
        char *end;
        const long g = strtol(name + 1, &end, 10);
        if (*end == '.' && g >= 0 && g < NBGI_MAX_MOTIONS) {
            for (int c = 0; c < 6; ++c) {
                if (strcmp(end + 1, motion_names[c]) == 0) {
                    return (int)NBG_P_MOTION(g, c);
                }
            }
        }
    }
    return -1;
}

static double *param_field(nbg_experiment *e, nbg_param p)
{
    int g, c;
    if (nbgi_param_motion(p, &g, &c)) {
        if (e->motions == NULL || g >= e->nmotions) {
            return NULL;
        }
        return c < 3 ? &e->motions[g].shift[c] : &e->motions[g].rot[c - 3];
    }
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
    case NBG_P_DISTANCE: {
        /* the distance that places the detector: with the sample pivot and a close distance given, that one (the
         * beam-spot distance is then derived, and a parameter in it would change nothing) */
        const int sample = e->pivot == NBG_PIVOT_SAMPLE ||
                           (e->pivot == NBG_PIVOT_AUTO && (e->convention == NBG_CONV_XDS || e->convention == NBG_CONV_DIALS));
        return sample && !isnan(e->close_distance) ? &e->close_distance : &e->distance;
    }
    case NBG_P_BEAM_FAST: return &e->beam_shift[0];
    case NBG_P_BEAM_SLOW: return &e->beam_shift[1];
    case NBG_P_DET_ROTX: case NBG_P_DET_ROTY: case NBG_P_DET_ROTZ:
        return &e->det_rot[p - NBG_P_DET_ROTX];
    case NBG_P_TWOTHETA: return &e->twotheta;
    case NBG_P_SCALE: return &e->scale;
    case NBG_P_BG: case NBG_P_BG_FAST: case NBG_P_BG_SLOW:
        return &e->bg[p - NBG_P_BG];
    case NBG_P_SPINDLE_TILT1: case NBG_P_SPINDLE_TILT2:
        return &e->spindle_tilt[p - NBG_P_SPINDLE_TILT1];
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

void nbgi_debug_zero_adjoint(nbg_ctx *ctx, int param)
{
    if (ctx != NULL) {
        ctx->zero_param = param;
    }
}

void nbgi_debug_break_adjoint(nbg_ctx *ctx, int param)
{
    if (ctx != NULL) {
        ctx->break_param = param;
    }
}

/* --- the image model M = scale * I + B ---------------------------------------------------------------------- */

/* The image-level parameters' gradients from dL/dM and the simulated image I (before the model). */
static void model_grad(const nbgi_kparams *k, const float *dLdM, const float *I, nbg_param_mask mask, double *g)
{
    double sG = 0, s0 = 0, sx = 0, sy = 0;
    const long nw = nbgi_nwalk(k); /* all panels' pixels, or the list's */
    for (long t = 0; t < nw; ++t) {
        const size_t i = nbgi_walk_at(k, t);
        if (!nbgi_model_active(k, i) || dLdM[i] == 0) {
            continue;
        }
        double x, y;
        nbgi_model_xy(k, i, &x, &y);
        const double d = dLdM[i];
        sG += d * I[i]; /* dM/dG = I */
        s0 += d;        /* dM/dbg = 1 */
        sx += d * x;    /* dM/dbg_fast = x */
        sy += d * y;    /* dM/dbg_slow = y */
    }
    g[NBG_P_SCALE] = (mask & NBG_MASK(NBG_P_SCALE)) ? sG : 0;
    g[NBG_P_BG] = (mask & NBG_MASK(NBG_P_BG)) ? s0 : 0;
    g[NBG_P_BG_FAST] = (mask & NBG_MASK(NBG_P_BG_FAST)) ? sx : 0;
    g[NBG_P_BG_SLOW] = (mask & NBG_MASK(NBG_P_BG_SLOW)) ? sy : 0;
}

/* Which parameters have a free value in this experiment, and which modes the adjoint does not cover. */
int nbgi_grad_supported(nbg_ctx *ctx, const nbg_experiment *e, const nbgi_plan *pl, nbg_param_mask mask)
{
    if (e->oversample_thick || e->oversample_polar || e->oversample_omega) {
        return nbgi_error(ctx, NBG_EUNSUP, "gradients are not available with -oversample_thick/_polar/_omega "
                                          "(nanoBragg's running-sum modes)");
    }
    if (e->curved) {
        return nbgi_error(ctx, NBG_EUNSUP, "gradients are not available for the curved detector");
    }
    if (e->npanels > 0 && e->panel_frame == NBG_PANELS_LAB && (mask & (NBG_MASK(NBG_P_DISTANCE) | NBG_MASK(NBG_P_BEAM_FAST) | NBG_MASK(NBG_P_BEAM_SLOW) | NBG_MASK(NBG_P_DET_ROTX) |
                 NBG_MASK(NBG_P_DET_ROTY) | NBG_MASK(NBG_P_DET_ROTZ) | NBG_MASK(NBG_P_TWOTHETA)))) {
        return nbgi_error(ctx, NBG_EUNSUP, "panels fixed in the lab frame do not move with the detector parameters "
                         "(distance, beam centre, rotations, two-theta): no gradient in them");
    }
    if ((mask & NBG_MASK_MOTIONS) && !(e->npanels > 0 && e->nmotions > 0)) {
        return nbgi_error(ctx, NBG_EUNSUP, "panel-motion gradients need panels with motions (nmotions > 0)");
    }
    for (int p = 0; p < NBG_NPARAMS; ++p) {
        if (!(mask & NBG_MASK(p))) {
            continue;
        }
        if (p <= NBG_P_GAMMA && !e->has_cell) {
            return nbgi_error(ctx, NBG_EUNSUP, "the gradient in %s needs -cell (with -mat alone the cell is not "
                             "a free parameter)", param_names[p]);
        }
        if (p >= NBG_P_ROTX && p <= NBG_P_ROTZ && e->misset_random) {
            return nbgi_error(ctx, NBG_EUNSUP, "the gradient in %s needs explicit -misset angles (pass the random "
                             "ones printed by the simulation with -misset)", param_names[p]);
        }
        if (p >= NBG_P_NA && p <= NBG_P_NC && e->sample_x + e->sample_y + e->sample_z > 0) {
            return nbgi_error(ctx, NBG_EUNSUP, "the gradient in %s needs N given directly (not -samplesize)",
                             param_names[p]);
        }
        if (p == NBG_P_MOSAIC && !(pl->mosaic_spread > 0 && pl->k.nmos > 1)) {
            return nbgi_error(ctx, NBG_EUNSUP, "the gradient in mosaic needs a positive spread and several domains");
        }
        if (p == NBG_P_FLUENCE && e->flux != 0) {
            return nbgi_error(ctx, NBG_EUNSUP, "the gradient in fluence is not free when -flux sets the fluence");
        }
    }
    return NBG_OK;
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

/* The tangent of the plan-level quantities (the kernel's inputs) along parameter p, in units of "per CLI unit of
 * p": the forward-mode half of the chain rule.  t must be zeroed, with t->abc (nphi*nmos*9) and t->lam
 * (nsources) allocated.  The adjoint's chain rule is then dL/dp = <accumulators, t_p>, and the JVP kernel
 * propagates t_p through each sample. */
void nbgi_plan_tangent(const nbg_experiment *e, const nbgi_plan *pl, nbg_param p, nbgi_adjacc *t)
{
    const nbgi_kparams *k = &pl->k;
    const double _Complex ih = CSTEP * _Complex_I;
    if (p <= NBG_P_ROTZ || p == NBG_P_LAMBDA) {
        /* crystal set-up by the complex step: a0 (m) and a* (1/A) */
        double ta0[9] = {0};
        if (p != NBG_P_LAMBDA || e->has_mat) {
            nbgi_xtal_in_d din;
            nbgi_plan_xtal_in(e, pl->misset, pl->lambda0, &din);
            nbgi_xtal_in_z zin;
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
            double unit; /* set-up units per CLI unit */
            if (p <= NBG_P_C) {
                zin.cell[p] += ih;
                unit = 1;
            } else if (p <= NBG_P_GAMMA) {
                zin.cell[p] += ih;
                unit = 1 / RTD;
            } else if (p <= NBG_P_ROTZ) {
                zin.misset[p - NBG_P_ROTX] += ih;
                unit = 1 / RTD;
            } else {
                zin.lambda0 += ih;
                unit = 1e-10;
            }
            double _Complex abc[9], astar[9];
            nbgi_crystal_z(&zin, abc, astar);
            for (int i = 0; i < 9; ++i) {
                ta0[i] = cimag(abc[i]) / CSTEP * 1e-10 * unit;
                t->astar[i] = cimag(astar[i]) / CSTEP * unit;
            }
        }
        /* abc[phi, m] = U_m Rot(u, phi) a0 is linear in a0 */
        for (int ip = 0; ip < k->nphi; ++ip) {
            for (int m = 0; m < k->nmos; ++m) {
                double *dst = t->abc + 9 * ((size_t)ip * k->nmos + m);
                for (int v = 0; v < 3; ++v) {
                    double r[3];
                    if (pl->phi[ip] != 0) {
                        rotate_axis_d(ta0 + 3 * v, pl->spindle, pl->phi[ip], r);
                    } else {
                        memcpy(r, ta0 + 3 * v, sizeof r);
                    }
                    if (pl->mosaic_spread > 0) {
                        const double *U = pl->umat + 9 * m;
                        for (int i = 0; i < 3; ++i) {
                            dst[3 * v + i] = U[3 * i] * r[0] + U[3 * i + 1] * r[1] + U[3 * i + 2] * r[2];
                        }
                    } else {
                        memcpy(dst + 3 * v, r, sizeof r);
                    }
                }
            }
        }
        if (p == NBG_P_LAMBDA) {
            /* each source's lambda_i = lambda0 c_i */
            for (int i = 0; i < k->nsources; ++i) {
                t->lam[i] = pl->src_lamrel[i] * 1e-10;
            }
        }
        return;
    }
    if (p == NBG_P_SPINDLE_TILT1 || p == NBG_P_SPINDLE_TILT2) {
        /* abc[phi, m] = U_m Rot(u(t), phi) a0 with u(t) the tilted spindle: the complex step on the tilt and the
         * rotation (src/setup_tmpl.h), the same code the plan ran */
        double _Complex u0[3], v1[3], v2[3], t2[2], uz[3];
        for (int x = 0; x < 3; ++x) {
            u0[x] = pl->spindle0[x];
            v1[x] = pl->tilt_axes[x];
            v2[x] = pl->tilt_axes[3 + x];
        }
        t2[0] = e->spindle_tilt[0] / RTD;
        t2[1] = e->spindle_tilt[1] / RTD;
        t2[p - NBG_P_SPINDLE_TILT1] += ih / RTD;
        nbgi_spindle_tilt_z(u0, v1, v2, t2, uz);
        for (int ip = 0; ip < k->nphi; ++ip) {
            double r[9];
            for (int v = 0; v < 3; ++v) {
                double _Complex a[3], rz[3];
                for (int x = 0; x < 3; ++x) {
                    a[x] = pl->a0[3 * v + x];
                }
                rotate_axis_z(a, uz, pl->phi[ip], rz);
                for (int x = 0; x < 3; ++x) {
                    r[3 * v + x] = cimag(rz[x]) / CSTEP;
                }
            }
            for (int m = 0; m < k->nmos; ++m) {
                double *dst = t->abc + 9 * ((size_t)ip * k->nmos + m);
                for (int v = 0; v < 3; ++v) {
                    if (pl->mosaic_spread > 0) {
                        const double *U = pl->umat + 9 * m;
                        for (int i = 0; i < 3; ++i) {
                            dst[3 * v + i] = U[3 * i] * r[3 * v] + U[3 * i + 1] * r[3 * v + 1] +
                                             U[3 * i + 2] * r[3 * v + 2];
                        }
                    } else {
                        memcpy(dst + 3 * v, r + 3 * v, 3 * sizeof(double));
                    }
                }
            }
        }
        return;
    }
    if (p == NBG_P_MOSAIC) {
        /* theta_m = spread c_m: d abc / d spread = dU_m/dtheta c_m Rot a0 */
        for (int ip = 0; ip < k->nphi; ++ip) {
            double ap[9];
            for (int v = 0; v < 3; ++v) {
                if (pl->phi[ip] != 0) {
                    rotate_axis_d(pl->a0 + 3 * v, pl->spindle, pl->phi[ip], ap + 3 * v);
                } else {
                    memcpy(ap + 3 * v, pl->a0 + 3 * v, 3 * sizeof(double));
                }
            }
            for (int m = 0; m < k->nmos && pl->mosaic_spread > 0; ++m) {
                double D[9];
                rodrigues_dtheta(pl->mos_axis + 3 * m, pl->mos_angle[m], D);
                const double cm = pl->mos_angle[m] / pl->mosaic_spread / RTD;
                double *dst = t->abc + 9 * ((size_t)ip * k->nmos + m);
                for (int v = 0; v < 3; ++v) {
                    for (int i = 0; i < 3; ++i) {
                        dst[3 * v + i] = (D[3 * i] * ap[3 * v] + D[3 * i + 1] * ap[3 * v + 1] +
                                          D[3 * i + 2] * ap[3 * v + 2]) * cm;
                    }
                }
            }
        }
        return;
    }
    if (p >= NBG_P_DISTANCE) {
        /* detector set-up by the complex step */
        const nbgi_det_in_d *d = &pl->det_in;
        nbgi_det_in_z z;
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
        double unit = 1 / RTD;
        switch (p) {
        case NBG_P_DISTANCE:
            /* as param_field: the close distance when the sample pivot takes it */
            if (z.pivot_sample && z.have_close) {
                z.close_distance += ih;
            } else {
                z.distance += ih;
            }
            unit = 1e-3;
            break;
        case NBG_P_BEAM_FAST: z.Fbeam += ih; z.Fclose += ih; unit = 1e-3; break;
        case NBG_P_BEAM_SLOW: z.Sbeam += ih; z.Sclose += ih; unit = 1e-3; break;
        case NBG_P_DET_ROTX: z.rot[0] += ih; break;
        case NBG_P_DET_ROTY: z.rot[1] += ih; break;
        case NBG_P_DET_ROTZ: z.rot[2] += ih; break;
        default: z.twotheta += ih; break;
        }
        nbgi_det_out_z out;
        nbgi_detector_z(&z, &out);
        t->close = cimag(out.close_distance) / CSTEP * unit;
        for (int i = 0; i < 3; ++i) {
            t->pix0[i] = cimag(out.pix0[i]) / CSTEP * unit;
            t->f[i] = cimag(out.f[i]) / CSTEP * unit;
            t->s[i] = cimag(out.s[i]) / CSTEP * unit;
            t->o[i] = cimag(out.o[i]) / CSTEP * unit;
        }
        return;
    }
    switch (p) {
    case NBG_P_NA: case NBG_P_NB: case NBG_P_NC:
        t->N[p - NBG_P_NA] = 1;
        break;
    case NBG_P_POLAR:
        t->K = 1;
        break;
    case NBG_P_FLUENCE: {
        /* scale = r_e^2 fluence / steps and I_bg are proportional to the fluence */
        const double fl = pl->rep.fluence;
        t->scale = fl != 0 ? k->scale / fl : NBG_RE2 / pl->rep.steps;
        t->Ibg = fl != 0 ? k->I_bg / fl : 0;
        break;
    }
    default:
        break;
    }
}

/* <a, t> over the plan-level quantities (structure factors excluded). */
static double plan_dot(const nbgi_plan *pl, const nbgi_adjacc *a, const nbgi_adjacc *t)
{
    const double *x = (const double *)a, *y = (const double *)t;
    double s = 0;
    for (size_t i = 0; i < NBG_ADJ_FIXED; ++i) {
        s += x[i] * y[i];
    }
    const size_t nabc = (size_t)pl->k.nphi * pl->k.nmos * 9;
    for (size_t i = 0; i < nabc; ++i) {
        s += a->abc[i] * t->abc[i];
    }
    for (int i = 0; i < pl->k.nsources; ++i) {
        s += a->lam[i] * t->lam[i];
    }
    return s;
}

int nbgi_tangent_alloc(const nbgi_plan *pl, nbgi_adjacc *t)
{
    const size_t nabc = (size_t)pl->k.nphi * pl->k.nmos * 9;
    memset(t, 0, sizeof *t);
    t->abc = calloc(nabc + (size_t)pl->k.nsources, sizeof(double));
    if (t->abc == NULL) {
        return NBG_ENOMEM;
    }
    t->lam = t->abc + nabc;
    return NBG_OK;
}

/* The chain rule from the reduced accumulators to the user's parameters: dL/dp = <acc, t_p>. */
static int chain_rule(const nbg_experiment *e, const nbgi_plan *pl, const nbgi_adjacc *acc, nbg_param_mask mask,
                      double *g)
{
    for (int p = 0; p < NBG_NPARAMS; ++p) {
        if (!(mask & NBG_MASK(p)) || NBGI_IMAGE_LEVEL(p)) {
            continue;
        }
        nbgi_adjacc t;
        if (nbgi_tangent_alloc(pl, &t) != NBG_OK) {
            return NBG_ENOMEM;
        }
        nbgi_plan_tangent(e, pl, (nbg_param)p, &t);
        g[p] = plan_dot(pl, acc, &t);
        free(t.abc);
    }
    return NBG_OK;
}

/* Runs the adjoint over the plan with per-thread accumulators and reduces them into grad. */
static int run_adjoint(nbg_ctx *ctx, const nbg_experiment *e, nbgi_plan *pl, const float *dLdI,
                       nbg_param_mask mask, nbg_grad *grad, float *image)
{
    const nbgi_kparams *k = &pl->k;
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
            return nbgi_error(ctx, NBG_EINVAL, "structure-factor gradients need dF with %zu entries (got %zu)", need,
                             grad->ndF);
        }
    }
    const size_t nlane = (nabc + nsrc) * 8; /* the vectorised adjoint's per-lane scratch */
    const int wantM = (mask & NBG_MASK_MOTIONS) != 0;
    const size_t nP = wantM ? (size_t)k->npanels * NBG_ADJ_DET : 0;
    if (wantM && (grad->dmotion == NULL || grad->ndmotion != (size_t)e->nmotions * 6)) {
        return nbgi_error(ctx, NBG_EINVAL, "panel-motion gradients need dmotion with %d entries (got %zu)",
                         e->nmotions * 6, grad->ndmotion);
    }
    const size_t per = nabc + nsrc + nF + nlane + nP;
    nbgi_adjacc *tacc = calloc((size_t)nthreads, sizeof *tacc);
    double *buf = calloc((size_t)nthreads * (per ? per : 1), sizeof(double));
    if (tacc == NULL || buf == NULL) {
        free(tacc);
        free(buf);
        return nbgi_error(ctx, NBG_ENOMEM, "out of memory for %d gradient accumulators of %zu doubles", nthreads, per);
    }
    for (int t = 0; t < nthreads; ++t) {
        tacc[t].abc = buf + (size_t)t * per;
        tacc[t].lam = tacc[t].abc + nabc;
        tacc[t].F = nF ? tacc[t].lam + nsrc : NULL;
        tacc[t].lane_abc = tacc[t].lam + nsrc + nF;
        tacc[t].lane_lam = tacc[t].lane_abc + nabc * 8;
        tacc[t].panel = nP ? tacc[t].lane_lam + nsrc * 8 : NULL;
    }
#ifdef NBG_HAVE_CUDA
    if (ctx->backend == NBG_BACKEND_CUDA) {
        if (wantF) {
            free(buf);
            free(tacc);
            return nbgi_error(ctx, NBG_EUNSUP, "structure-factor gradients are not implemented on the CUDA backend "
                                              "(use the CPU backend for F)");
        }
        /* the device returns the fixed part, abc and lam, reduced in a fixed order */
        const int ncomp = (int)(NBG_ADJ_FIXED + nabc + nsrc);
        double *out = malloc(sizeof(double) * (size_t)ncomp);
        double t[3] = {0, 0, 0};
        int rc = out == NULL ? nbgi_error(ctx, NBG_ENOMEM, "out of memory")
                             : nbgi_cuda_adjoint(ctx, k, ctx->precision == NBG_FLOAT, dLdI, image, out, ncomp,
                                                 nP ? tacc[0].panel : NULL, t);
        pl->rep.time_setup += t[0];
        pl->rep.time_kernel = t[1];
        pl->rep.time_copy = t[2];
        if (rc == NBG_OK) {
            memcpy(&tacc[0], out, NBG_ADJ_FIXED * sizeof(double));
            memcpy(tacc[0].abc, out + NBG_ADJ_FIXED, (nabc + nsrc) * sizeof(double));
        }
        free(out);
        if (rc != NBG_OK) {
            free(buf);
            free(tacc);
            return rc;
        }
        nthreads = 1;
    } else
#endif
    {
        const double t0 = nbgi_now();
        nbgi_adjoint_cpu(k, dLdI, image, tacc, nthreads, ctx->scalar_adjoint == 0);
        pl->rep.time_kernel = nbgi_now() - t0;
        pl->rep.time_copy = 0;
    }
    /* reduce in thread order */
    nbgi_adjacc *acc = &tacc[0];
    for (int t = 1; t < nthreads; ++t) {
        double *dst = (double *)acc, *src = (double *)&tacc[t];
        for (size_t i = 0; i < NBG_ADJ_FIXED; ++i) {
            dst[i] += src[i];
        }
        for (size_t i = 0; i < nabc + nsrc + nF; ++i) {
            acc->abc[i] += tacc[t].abc[i];
        }
        for (size_t i = 0; i < nP; ++i) {
            acc->panel[i] += tacc[t].panel[i];
        }
    }
    if (wantM) {
        /* dL/d(motion g, component c) = sum over g's panels of <the panel's own gradients, its tangent> */
        memset(grad->dmotion, 0, sizeof(double) * grad->ndmotion);
        for (int q = 0; q < k->npanels; ++q) {
            const int g = e->panels[q].group;
            for (int c = 0; c < 6; ++c) {
                const double *tq = pl->motion_t + ((size_t)q * 6 + c) * NBG_ADJ_DET;
                double d = 0;
                for (int x = 0; x < NBG_ADJ_DET; ++x) {
                    d += acc->panel[(size_t)q * NBG_ADJ_DET + x] * tq[x];
                }
                grad->dmotion[6 * g + c] += d;
            }
        }
    }
    memset(grad->g, 0, sizeof grad->g);
    if (chain_rule(e, pl, acc, mask, grad->g) != NBG_OK) {
        free(buf);
        free(tacc);
        return nbgi_error(ctx, NBG_ENOMEM, "out of memory for the chain rule");
    }
    if (wantF) {
        if (k->F != NULL) {
            memcpy(grad->dF, acc->F, nF * sizeof(double));
        } else {
            grad->dF[0] = acc->defF;
        }
    }
    free(buf);
    free(tacc);
    return NBG_OK;
}

/* The gradient of a loss with dL/dM = dLdM: the adjoint kernel (with dL/dI = scale * dL/dM) for the simulation's
 * parameters, or the forward kernel alone when only image-level ones are asked for; then the image-level
 * gradients; image receives the model image M. */
static int model_adjoint(nbg_ctx *ctx, const nbg_experiment *e, nbgi_plan *pl, const float *dLdM,
                         nbg_param_mask mask, nbg_grad *grad, float *image)
{
    const size_t npix = (size_t)pl->k.npix;
    int rc;
    if ((mask & ~(NBGI_IMAGE_MASK)) == 0) {
        memset(grad->g, 0, sizeof grad->g);
        rc = nbgi_forward_plan(ctx, pl, image);
    } else if (e->scale == 1) {
        rc = run_adjoint(ctx, e, pl, dLdM, mask, grad, image);
    } else {
        float *d = malloc(sizeof(float) * npix);
        if (d == NULL) {
            return nbgi_error(ctx, NBG_ENOMEM, "out of memory for dL/dI");
        }
        for (long t = 0; t < nbgi_nwalk(&pl->k); ++t) { /* the kernels read the listed pixels only */
            const size_t i = nbgi_walk_at(&pl->k, t);
            d[i] = (float)(e->scale * dLdM[i]); /* dL/dI = dL/dM dM/dI */
        }
        rc = run_adjoint(ctx, e, pl, d, mask, grad, image);
        free(d);
    }
    if (rc != NBG_OK) {
        return rc;
    }
    if (mask & NBGI_IMAGE_MASK) {
        double gi[NBG_NPARAMS];
        model_grad(&pl->k, dLdM, image, mask, gi);
        for (int p = NBG_P_SCALE; p <= NBG_P_BG_SLOW; ++p) {
            grad->g[p] = gi[p];
        }
    }
    nbgi_model_apply(e, &pl->k, image);
    if (ctx->break_param >= 0 && ctx->break_param < NBG_NPARAMS) {
        grad->g[ctx->break_param] *= 1.001; /* test-only: a deliberately wrong adjoint */
    }
    if (ctx->zero_param >= 0 && ctx->zero_param < NBG_NPARAMS) {
        grad->g[ctx->zero_param] = 0; /* test-only: a lost adjoint */
    }
    return NBG_OK;
}

/* A gradient that is not finite (an image that is, but a loss whose derivative overflows) is an error, not a
 * result. */
static int gradient_check(nbg_ctx *ctx, nbg_param_mask mask, const nbg_grad *grad)
{
    for (int p = 0; p < NBG_NPARAMS; ++p) {
        if ((mask & NBG_MASK(p)) && !isfinite(grad->g[p])) {
            return nbgi_error(ctx, NBG_EINVAL, "the gradient in %s is not finite (%g)", nbg_param_name((nbg_param)p),
                             grad->g[p]);
        }
    }
    if ((mask & NBG_MASK_MOTIONS) && grad->dmotion != NULL) {
        for (size_t i = 0; i < grad->ndmotion; ++i) {
            if (!isfinite(grad->dmotion[i])) {
                return nbgi_error(ctx, NBG_EINVAL, "the gradient in g%zu.%s is not finite (%g)", i / 6,
                                 motion_names[i % 6], grad->dmotion[i]);
            }
        }
    }
    if ((mask & NBG_MASK_F) && grad->dF != NULL) {
        for (size_t i = 0; i < grad->ndF; ++i) {
            if (!isfinite(grad->dF[i])) {
                return nbgi_error(ctx, NBG_EINVAL, "the gradient in structure factor %zu is not finite (%g)", i,
                                 grad->dF[i]);
            }
        }
    }
    return NBG_OK;
}

/* Builds the plan of a gradient call and checks the buffers' size and what the mask asks for; on failure the
 * plan holds nothing. */
static int plan_for_grad(nbg_ctx *ctx, const nbg_experiment *e, size_t npix, nbg_param_mask mask, nbgi_plan *pl)
{
    int rc = nbgi_plan_build(ctx, e, pl);
    if (rc != NBG_OK) {
        return rc;
    }
    pl->k.want_dN = (mask & (NBG_MASK(NBG_P_NA) | NBG_MASK(NBG_P_NB) | NBG_MASK(NBG_P_NC))) != 0;
    if ((size_t)pl->k.npix != npix && pl->k.npanels > 0) {
        rc = nbgi_error(ctx, NBG_EINVAL, "the image buffers hold %zu pixels, the detector's %d panels have %ld", npix,
                       pl->k.npanels, pl->k.npix);
    } else if ((size_t)pl->k.npix != npix) {
        rc = nbgi_error(ctx, NBG_EINVAL, "the image buffers hold %zu pixels, the detector has %d x %d = %zu", npix,
                       pl->k.fpixels, pl->k.spixels, (size_t)pl->k.fpixels * pl->k.spixels);
    } else {
        rc = nbgi_grad_supported(ctx, e, pl, mask);
    }
    if (rc != NBG_OK) {
        nbgi_plan_free(pl);
    }
    return rc;
}

int nbg_simulate_grad(nbg_ctx *ctx, const nbg_experiment *e, const float *dLdI, nbg_param_mask mask,
                      nbg_grad *grad, float *image, size_t npix, nbg_report *report)
{
    if (ctx == NULL || e == NULL || dLdI == NULL || grad == NULL || image == NULL) {
        return nbgi_error(ctx, NBG_EINVAL, "nbg_simulate_grad: NULL argument");
    }
    const double t0 = nbgi_now();
    nbgi_plan pl;
    int rc = plan_for_grad(ctx, e, npix, mask, &pl);
    if (rc != NBG_OK) {
        return rc;
    }
    pl.rep.time_setup = nbgi_now() - t0;
    rc = model_adjoint(ctx, e, &pl, dLdI, mask, grad, image);
    if (rc == NBG_OK) {
        rc = nbgi_image_check(ctx, &pl, image, NAN);
    }
    if (rc == NBG_OK) {
        rc = gradient_check(ctx, mask, grad);
    }
    if (rc == NBG_OK && report != NULL) {
        *report = pl.rep;
    }
    nbgi_plan_free(&pl);
    return rc;
}

int nbg_loss_grad(nbg_ctx *ctx, const nbg_experiment *e, nbg_loss loss, const float *observed,
                  const float *weights, nbg_param_mask mask, double *L, nbg_grad *grad, float *image, size_t npix)
{
    if (ctx == NULL || e == NULL || observed == NULL || L == NULL || grad == NULL || image == NULL) {
        return nbgi_error(ctx, NBG_EINVAL, "nbg_loss_grad: NULL argument");
    }
    if (loss != NBG_LOSS_LSQ && loss != NBG_LOSS_POISSON) {
        return nbgi_error(ctx, NBG_EINVAL, "unknown loss %d", (int)loss);
    }
    nbgi_plan pl;
    int rc = plan_for_grad(ctx, e, npix, mask, &pl);
    if (rc != NBG_OK) {
        return rc;
    }
    /* the pixels in the loss must hold data (a masked pixel may hold a file's flag value) */
    const long nw = nbgi_nwalk(&pl.k);
    for (long t = 0; t < nw; ++t) {
        const size_t i = nbgi_walk_at(&pl.k, t);
        if (!nbgi_model_active(&pl.k, i)) {
            continue;
        }
        if (!isfinite(observed[i]) || observed[i] < 0) {
            nbgi_plan_free(&pl);
            return nbgi_error(ctx, NBG_EINVAL, "observed image pixel %zu is %g (must be finite and non-negative)", i,
                             (double)observed[i]);
        }
        if (weights != NULL && (!isfinite(weights[i]) || weights[i] < 0)) {
            nbgi_plan_free(&pl);
            return nbgi_error(ctx, NBG_EINVAL, "weight of pixel %zu is %g (must be finite and non-negative)", i,
                             (double)weights[i]);
        }
    }
    float *dLdI = NULL;
    rc = nbgi_forward_plan(ctx, &pl, image);
    if (rc == NBG_OK) {
        dLdI = malloc(sizeof(float) * npix);
        if (dLdI == NULL) {
            rc = nbgi_error(ctx, NBG_ENOMEM, "out of memory for dL/dI");
        }
    }
    if (rc == NBG_OK) {
        nbgi_model_apply(e, &pl.k, image);
        double sum = 0;
        for (long t = 0; t < nw; ++t) {
            const size_t i = nbgi_walk_at(&pl.k, t);
            if (!nbgi_model_active(&pl.k, i)) {
                dLdI[i] = 0;
                continue;
            }
            const double w = weights != NULL ? weights[i] : 1.0;
            double d;
            sum += w * nbgi_pixel_loss(loss, &e->response, image[i], observed[i], &d, NULL);
            dLdI[i] = (float)(w * d);
        }
        *L = sum;
        if (mask == 0) {
            memset(grad->g, 0, sizeof grad->g); /* the loss alone: no reverse pass */
        } else {
            rc = model_adjoint(ctx, e, &pl, dLdI, mask, grad, image);
            if (rc == NBG_OK) {
                rc = gradient_check(ctx, mask, grad);
            }
        }
    }
    free(dLdI);
    nbgi_plan_free(&pl);
    return rc;
}

int nbg_simulate_jvp(nbg_ctx *ctx, const nbg_experiment *e, const nbg_param *params, int nparams, double *tangents,
                     float *image, size_t npix)
{
    if (ctx == NULL || e == NULL || params == NULL || tangents == NULL || image == NULL) {
        return nbgi_error(ctx, NBG_EINVAL, "nbg_simulate_jvp: NULL argument");
    }
    if (nparams < 1) {
        return nbgi_error(ctx, NBG_EINVAL, "nbg_simulate_jvp: %d parameters (at least 1)", nparams);
    }
    nbg_param_mask mask = 0;
    for (int j = 0; j < nparams; ++j) {
        int g, c;
        if (nbgi_param_motion(params[j], &g, &c)) {
            if (g >= e->nmotions) {
                return nbgi_error(ctx, NBG_EINVAL, "nbg_simulate_jvp: panel motion %d of %d", g, e->nmotions);
            }
            mask |= NBG_MASK_MOTIONS;
            continue;
        }
        if (params[j] < 0 || params[j] >= NBG_NPARAMS) {
            return nbgi_error(ctx, NBG_EINVAL, "nbg_simulate_jvp: unknown parameter %d", (int)params[j]);
        }
        mask |= NBG_MASK(params[j]);
    }
    nbgi_plan pl;
    int rc = plan_for_grad(ctx, e, npix, mask, &pl);
    if (rc != NBG_OK) {
        return rc;
    }
    /* the simulation's parameters go through the tangent kernel, compacted to the front, NBG_JVP_MAX a pass; the
     * image-level ones are filled afterwards (dM/dG = I, dM/dbg = 1, x, y; the others' tangents times G) */
    const size_t nw = (size_t)nbgi_nwalk(&pl.k);
    int *slot = malloc(sizeof(int) * (size_t)nparams);
    const size_t nptan = (size_t)NBG_JVP_MAX * (size_t)pl.k.npanels * NBG_ADJ_DET;
    double *ptan = (mask & NBG_MASK_MOTIONS) ? malloc(sizeof(double) * nptan) : NULL;
    if (slot == NULL || ((mask & NBG_MASK_MOTIONS) && ptan == NULL)) {
        free(slot);
        nbgi_plan_free(&pl);
        return nbgi_error(ctx, NBG_ENOMEM, "out of memory for the tangents");
    }
    int nt = 0;
    for (int j = 0; j < nparams; ++j) {
        if (!NBGI_IMAGE_LEVEL(params[j])) {
            slot[nt++] = j;
        }
    }
    for (int q0 = 0; rc == NBG_OK && q0 < nt; q0 += NBG_JVP_MAX) {
        const int m = nt - q0 < NBG_JVP_MAX ? nt - q0 : NBG_JVP_MAX;
        nbgi_adjacc t[NBG_JVP_MAX];
        int na = 0, motion = 0;
        if (ptan != NULL) {
            memset(ptan, 0, sizeof(double) * nptan);
        }
        for (; na < m; ++na) {
            const nbg_param p = params[slot[q0 + na]];
            int g, c;
            if (nbgi_tangent_alloc(&pl, &t[na]) != NBG_OK) {
                rc = nbgi_error(ctx, NBG_ENOMEM, "out of memory for the tangents");
                break;
            }
            if (!nbgi_param_motion(p, &g, &c)) {
                nbgi_plan_tangent(e, &pl, p, &t[na]);
                continue;
            }
            motion = 1; /* the plan-level tangent is zero; the group's panels move by their own */
            for (int k = 0; k < pl.k.npanels; ++k) {
                if (e->panels[k].group == g) {
                    memcpy(ptan + ((size_t)na * pl.k.npanels + k) * NBG_ADJ_DET,
                           pl.motion_t + ((size_t)k * 6 + c) * NBG_ADJ_DET, sizeof(double) * NBG_ADJ_DET);
                }
            }
        }
        if (rc == NBG_OK) {
            nbgi_jvp_cpu(&pl.k, t, m, motion ? ptan : NULL, tangents + (size_t)q0 * nw, image,
                         ctx->scalar_adjoint == 0);
            rc = nbgi_image_check(ctx, &pl, image, NAN);
        }
        for (int j = 0; j < na; ++j) {
            free(t[j].abc);
        }
    }
    if (rc == NBG_OK && nt == 0) {
        rc = nbgi_forward_plan(ctx, &pl, image);
    }
    if (rc == NBG_OK) {
        /* a tangent image per parameter: npix pixels, or compact over the pixel list */
        for (int q = nt - 1; q >= 0; --q) { /* slot[q] >= q: move from the back */
            double *dst = tangents + (size_t)slot[q] * nw;
            if (slot[q] != q) {
                memmove(dst, tangents + (size_t)q * nw, sizeof(double) * nw);
            }
            if (e->scale != 1) {
                for (size_t i = 0; i < nw; ++i) {
                    dst[i] *= e->scale;
                }
            }
        }
        for (int j = 0; j < nparams; ++j) {
            if (!NBGI_IMAGE_LEVEL(params[j])) {
                continue;
            }
            double *dst = tangents + (size_t)j * nw;
            for (size_t u = 0; u < nw; ++u) {
                const size_t i = nbgi_walk_at(&pl.k, (long)u);
                double x, y;
                nbgi_model_xy(&pl.k, i, &x, &y);
                const double v[4] = {image[i], 1, x, y};
                dst[u] = nbgi_model_active(&pl.k, i) ? v[params[j] - NBG_P_SCALE] : 0;
            }
        }
        nbgi_model_apply(e, &pl.k, image);
    }
    free(slot);
    free(ptan);
    nbgi_plan_free(&pl);
    return rc;
}

void nbgi_debug_scalar_adjoint(nbg_ctx *ctx, int on)
{
    if (ctx != NULL) {
        ctx->scalar_adjoint = on != 0;
    }
}

int nbg_param_free(nbg_ctx *ctx, const nbg_experiment *e, nbg_param p, char *why, size_t size)
{
    if (ctx == NULL || e == NULL || p < 0 || p >= NBG_NPARAMS) {
        return nbgi_error(ctx, NBG_EINVAL, "nbg_param_free: NULL argument or unknown parameter %d", (int)p);
    }
    if (why != NULL && size > 0) {
        why[0] = '\0';
    }
    nbgi_plan pl;
    int rc = nbgi_plan_build(ctx, e, &pl);
    if (rc != NBG_OK) {
        return rc;
    }
    char saved[sizeof ctx->errmsg];
    memcpy(saved, ctx->errmsg, sizeof saved);
    const char *reason = NULL;
    if (nbgi_grad_supported(ctx, e, &pl, NBG_MASK(p)) != NBG_OK) {
        reason = ctx->errmsg;
    } else if (p == NBG_P_MOSAIC && !(pl.mosaic_spread > 0 && pl.k.nmos > 1)) {
        reason = "no mosaic spread";
    } else if (p == NBG_P_POLAR && e->nopolar) {
        reason = "-nopolar fixes the polarization factor at 1";
    } else if (p == NBG_P_SPINDLE_TILT1 || p == NBG_P_SPINDLE_TILT2) {
        int turned = 0;
        for (int ip = 0; ip < pl.k.nphi; ++ip) {
            turned |= pl.phi[ip] != 0;
        }
        if (!turned) {
            reason = "the crystal is not turned about the spindle (a still)";
        }
    }
    if (reason != NULL && why != NULL && size > 0) {
        snprintf(why, size, "%s: %s", param_names[p], reason);
    }
    memcpy(ctx->errmsg, saved, sizeof saved);
    nbgi_plan_free(&pl);
    return reason == NULL;
}
