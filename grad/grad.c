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

/* The image-level parameters' gradients from dL/dM and the simulated image I (before the model): sums[0..3] =
 * dL/dG, dL/dbg, dL/dbg_fast, dL/dbg_slow (the table's NBGI_S_MODEL indices), summed over fixed chunks of the
 * pixels added in chunk order (the same bits for any thread count). */
static void model_grad(const nbgi_kparams *k, const float *dLdM, const float *I, double sums[4], int nthreads)
{
    enum { MINCH = 4096 };
    double part[NBGI_MAXCHUNKS][4]; /* each chunk's sums, added in chunk order (nbgi_chunk) */
    const long nw = nbgi_nwalk(k); /* all panels' pixels, or the list's */
    long nch = (nw + MINCH - 1) / MINCH;
    nch = nch < 1 ? 1 : nch > NBGI_MAXCHUNKS ? NBGI_MAXCHUNKS : nch;
#pragma omp parallel for schedule(static) num_threads(nthreads) if (nw >= (long)NBGI_PARALLEL_MIN)
    for (long c = 0; c < nch; ++c) {
        double sG = 0, s0 = 0, sx = 0, sy = 0;
        long t0, t1;
        nbgi_chunk(c, nch, nw, &t0, &t1);
        if (k->npanels == 0 && k->list == NULL) {
            /* the single detector without a list: row by row, the ROI and mask as weights (vectorised) */
            const int F = k->fpixels;
            const double cf = 0.5 * (k->fpixels - 1), cs = 0.5 * (k->spixels - 1);
            for (long t = t0; t < t1;) {
                const int s = (int)(t / F), fa = (int)(t % F);
                const int fb = t1 - t < (long)(F - fa) ? fa + (int)(t1 - t) : F;
                t += fb - fa;
                if (s < k->roi_ymin || s > k->roi_ymax) {
                    continue;
                }
                const int lo = fa > k->roi_xmin ? fa : k->roi_xmin, hi = fb < k->roi_xmax + 1 ? fb : k->roi_xmax + 1;
                const float *dr = dLdM + (size_t)s * F, *Ir = I + (size_t)s * F;
                const uint8_t *mr = k->mask != NULL ? k->mask + (size_t)s * F : NULL;
                double aG = 0, a0 = 0, ax = 0;
#pragma omp simd reduction(+ : aG, a0, ax)
                for (int f = lo; f < hi; ++f) {
                    const double d = (mr == NULL || mr[f] != 0) ? (double)dr[f] : 0.0;
                    aG += d != 0 ? d * (double)Ir[f] : 0.0;
                    a0 += d;
                    ax += d * (f - cf);
                }
                sG += aG;                            /* dM/dG = I */
                s0 += a0;                            /* dM/dbg = 1 */
                sx += ax / NBG_BG_UNIT;              /* dM/dbg_fast = x (nbgi_model_xy's) */
                sy += a0 * ((s - cs) / NBG_BG_UNIT); /* dM/dbg_slow = y */
            }
        } else {
            for (long t = t0; t < t1; ++t) {
                const size_t i = nbgi_walk_at(k, t);
                if (dLdM[i] == 0 || !nbgi_model_active(k, i)) {
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
        }
        part[c][0] = sG;
        part[c][1] = s0;
        part[c][2] = sx;
        part[c][3] = sy;
    }
    for (int j = 0; j < 4; ++j) {
        double v = 0;
        for (long c = 0; c < nch; ++c) {
            v += part[c][j];
        }
        sums[j] = v;
    }
}

/* Which modes the adjoint does not cover, and whether each listed parameter is free in this experiment (the
 * table's predicates; a parameter fixed for a "hard" reason has no gradient to give). */
int nbgi_grad_supported(nbg_ctx *ctx, const nbg_experiment *e, const nbgi_plan *pl, const nbg_param *params,
                        int nparams)
{
    const char *mode = nbgi_grad_mode_unsupported(e);
    if (mode != NULL) {
        return nbgi_error(ctx, NBG_EUNSUP, "gradients are not available %s", mode);
    }
    for (int j = 0; j < nparams; ++j) {
        int hard;
        const char *why = nbgi_param_fixed(e, pl, params[j], &hard);
        if (why != NULL && hard) {
            char lab[48];
            return nbgi_error(ctx, NBG_EUNSUP, "the gradient in %s: %s", nbg_param_label(e, params[j], lab, sizeof lab),
                             why);
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

/* The three steps by which the plan turns a crystal vector at phi 0 (or its tangent) for phi step ip and domain m
 * (src/plan.c's rotate_crystal: U_m Rot(axis, phi) D_m v), each a copy where it does nothing. */
/* D_m v: domain m's own turn, where it has one. */
static void turn_domain(const nbgi_lab_crystal *x, int m, const double v[3], double out[3])
{
    if (m < x->ndomrot) {
        const double *D = x->domrot + 9 * m;
        for (int i = 0; i < 3; ++i) {
            out[i] = D[3 * i] * v[0] + D[3 * i + 1] * v[1] + D[3 * i + 2] * v[2];
        }
    } else {
        memcpy(out, v, 3 * sizeof(double));
    }
}

/* Rot(axis, phi_ip) v: the spindle. */
static void turn_spindle(const nbgi_plan *pl, int ip, const double v[3], double out[3])
{
    if (pl->lab.gon.phi[ip] != 0) {
        rotate_axis_d(v, pl->lab.gon.axis, pl->lab.gon.phi[ip], out);
    } else {
        memcpy(out, v, 3 * sizeof(double));
    }
}

/* U_m v: domain m's mosaic rotation, where there is a spread. */
static void turn_mosaic(const nbgi_lab_crystal *x, int m, const double v[3], double out[3])
{
    if (x->spread > 0) {
        const double *U = x->umat + 9 * m;
        for (int i = 0; i < 3; ++i) {
            out[i] = U[3 * i] * v[0] + U[3 * i + 1] * v[1] + U[3 * i + 2] * v[2];
        }
    } else {
        memcpy(out, v, 3 * sizeof(double));
    }
}

/* All three: U_m Rot(axis, phi_ip) D_m v. */
static void domain_chain(const nbgi_plan *pl, int ip, int m, const double v[3], double out[3])
{
    double a[3], r[3];
    turn_domain(&pl->lab.xtal, m, v, a);
    turn_spindle(pl, ip, a, r);
    turn_mosaic(&pl->lab.xtal, m, r, out);
}

/* The crystal set-up's tangent (cell[index], misset[index] or the wavelength) by the complex step: a0 (m) and
 * a* (1/A), then abc[phi, m] = U_m Rot(u, phi) a0, which is linear in a0. */
static void tangent_crystal(const nbg_experiment *e, const nbgi_plan *pl, nbgi_setup what, int index,
                            nbgi_adjacc *t)
{
    const nbgi_kparams *k = &pl->k;
    const double _Complex ih = CSTEP * _Complex_I;
    double ta0[9] = {0};
    if (what != NBGI_S_LAMBDA || e->has_mat) {
        nbgi_xtal_in_d din;
        nbgi_plan_xtal_in(e, pl->lab.xtal.misset, pl->lab.beam.lambda0, &din);
        nbgi_xtal_in_z zin;
        zin.has_cell = din.has_cell;
        zin.has_mat = din.has_mat;
        for (int i = 0; i < 6; ++i) {
            zin.cell[i] = din.cell[i];
        }
        memcpy(zin.mat, din.mat, sizeof zin.mat);
        zin.has_umat = din.has_umat;
        memcpy(zin.umat, din.umat, sizeof zin.umat);
        zin.lambda0 = din.lambda0;
        for (int i = 0; i < 3; ++i) {
            zin.misset[i] = din.misset[i];
            zin.orient[i] = din.orient[i];
        }
        double unit; /* set-up units per CLI unit */
        if (what == NBGI_S_CELL) {
            zin.cell[index] += ih;
            unit = index < 3 ? 1 : 1 / RTD;
        } else if (what == NBGI_S_MISSET) {
            zin.misset[index] += ih;
            unit = 1 / RTD;
        } else if (what == NBGI_S_ORIENT) {
            zin.orient[index] += ih;
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
    for (int ip = 0; ip < k->nphi; ++ip) {
        for (int m = 0; m < k->nmos; ++m) {
            double *dst = t->abc + 9 * ((size_t)ip * k->nmos + m);
            for (int v = 0; v < 3; ++v) {
                domain_chain(pl, ip, m, ta0 + 3 * v, dst + 3 * v);
            }
        }
    }
    if (what == NBGI_S_LAMBDA) {
        /* each source's lambda_i = lambda0 c_i */
        for (int i = 0; i < k->nsources; ++i) {
            t->lam[i] = pl->lab.beam.lamrel[i] * 1e-10;
        }
    }
}

/* abc[phi, m] = U_m Rot(u(t), phi) a0 with u(t) the tilted spindle: the complex step on tilt `index` and the
 * rotation (src/setup_tmpl.h), the same code the plan ran. */
static void tangent_tilt(const nbg_experiment *e, const nbgi_plan *pl, int index, nbgi_adjacc *t)
{
    const nbgi_kparams *k = &pl->k;
    const double _Complex ih = CSTEP * _Complex_I;
    double _Complex u0[3], v1[3], v2[3], t2[2], uz[3];
    for (int x = 0; x < 3; ++x) {
        u0[x] = pl->lab.gon.axis0[x];
        v1[x] = pl->lab.gon.tilt_axes[x];
        v2[x] = pl->lab.gon.tilt_axes[3 + x];
    }
    t2[0] = e->spindle_tilt[0] / RTD;
    t2[1] = e->spindle_tilt[1] / RTD;
    t2[index] += ih / RTD;
    nbgi_spindle_tilt_z(u0, v1, v2, t2, uz);
    const nbgi_lab_crystal *xt = &pl->lab.xtal;
    for (int ip = 0; ip < k->nphi; ++ip) {
        double r[9];
        for (int m = 0; m < k->nmos; ++m) {
            /* the spindle's tangent on a0, or on the domain's turned a0 (once more for the first domain without) */
            if (m == 0 || m <= xt->ndomrot) {
                for (int v = 0; v < 3; ++v) {
                    double d[3];
                    double _Complex a[3], rz[3];
                    turn_domain(xt, m, xt->a0 + 3 * v, d);
                    for (int x = 0; x < 3; ++x) {
                        a[x] = d[x];
                    }
                    rotate_axis_z(a, uz, pl->lab.gon.phi[ip], rz);
                    for (int x = 0; x < 3; ++x) {
                        r[3 * v + x] = cimag(rz[x]) / CSTEP;
                    }
                }
            }
            double *dst = t->abc + 9 * ((size_t)ip * k->nmos + m);
            for (int v = 0; v < 3; ++v) {
                turn_mosaic(xt, m, r + 3 * v, dst + 3 * v);
            }
        }
    }
}

/* theta_m = spread c_m: d abc / d spread = dU_m/dtheta c_m Rot D_m a0 (D_m the domain's own turn, or none). */
static void tangent_mosaic(const nbgi_plan *pl, nbgi_adjacc *t)
{
    const nbgi_kparams *k = &pl->k;
    const nbgi_lab_crystal *x = &pl->lab.xtal;
    for (int ip = 0; ip < k->nphi; ++ip) {
        double ap[9], at[9];
        for (int v = 0; v < 3; ++v) {
            turn_spindle(pl, ip, x->a0 + 3 * v, ap + 3 * v);
        }
        for (int m = 0; m < k->nmos && x->spread > 0; ++m) {
            double D[9];
            rodrigues_dtheta(x->mos_axis + 3 * m, x->mos_angle[m], D);
            const double *src = ap;
            if (m < x->ndomrot) { /* Rot D_m a0 in place of Rot a0: the domain's own turn first */
                for (int v = 0; v < 3; ++v) {
                    double d[3];
                    turn_domain(x, m, x->a0 + 3 * v, d);
                    turn_spindle(pl, ip, d, at + 3 * v);
                }
                src = at;
            }
            const double cm = x->mos_angle[m] / x->spread / RTD;
            double *dst = t->abc + 9 * ((size_t)ip * k->nmos + m);
            for (int v = 0; v < 3; ++v) {
                for (int i = 0; i < 3; ++i) {
                    dst[3 * v + i] =
                        (D[3 * i] * src[3 * v] + D[3 * i + 1] * src[3 * v + 1] + D[3 * i + 2] * src[3 * v + 2]) * cm;
                }
            }
        }
    }
}

/* Domain m's own turn about the lab's axis c (D = Rz Ry Rx of its angles r, at phi 0): d(D v)/d r_c = w_c x (D v)
 * for each of the crystal's vectors v = a0, with w_z = z, w_y = Rz y, w_x = Rz Ry x (per radian; per degree here),
 * then the spindle and the mosaic rotation as the plan turns them.  Exact; the other domains do not move. */
static void tangent_domain(const nbg_experiment *e, const nbgi_plan *pl, int m, int c, nbgi_adjacc *t)
{
    const nbgi_kparams *k = &pl->k;
    const nbgi_lab_crystal *x = &pl->lab.xtal;
    const double *r = e->domain_rot + 3 * m;
    const double ec[3] = {c == 0, c == 1, c == 2};
    double w[3], dv[9];
    nbgi_rotate_xyz(ec, 0, c == 0 ? r[1] / RTD : 0, c < 2 ? r[2] / RTD : 0, w);
    for (int v = 0; v < 3; ++v) {
        double a[3];
        turn_domain(x, m, x->a0 + 3 * v, a);
        nbgi_cross(w, a, dv + 3 * v);
        for (int i = 0; i < 3; ++i) {
            dv[3 * v + i] /= RTD;
        }
    }
    /* dv is already turned by D: the spindle and the mosaic rotation remain */
    for (int ip = 0; ip < k->nphi; ++ip) {
        double *dst = t->abc + 9 * ((size_t)ip * k->nmos + m);
        for (int v = 0; v < 3; ++v) {
            double q[3];
            turn_spindle(pl, ip, dv + 3 * v, q);
            turn_mosaic(x, m, q, dst + 3 * v);
        }
    }
}

/* The beam's direction, tilt `index`: turning the beam (with its polarization and divergence, every source) about
 * axis w is, for the image, turning everything else about w the other way -- the detector (pix0, f, s, o; the
 * plane's, which the panels that move with it follow; the close distance stays), the crystal's vectors at every phi
 * step and domain and its reciprocal vectors -- so the tangent is -w x v on each, per degree.  Exact (no step). */
static void tangent_beam_dir(const nbgi_plan *pl, int index, nbgi_adjacc *t)
{
    const nbgi_kparams *k = &pl->k;
    const double *w = pl->lab.beam.tilt_axes + 3 * index;
    const double unit = -1 / RTD;
    double *dst[4] = {t->pix0, t->f, t->s, t->o};
    const double *src[4] = {k->pix0, k->fdet, k->sdet, k->odet};
    for (int q = 0; q < 4; ++q) {
        double c[3];
        nbgi_cross(w, src[q], c);
        for (int i = 0; i < 3; ++i) {
            dst[q][i] = unit * c[i];
        }
    }
    for (int v = 0; v < 3; ++v) {
        double c[3];
        nbgi_cross(w, k->astar + 3 * v, c);
        for (int i = 0; i < 3; ++i) {
            t->astar[3 * v + i] = unit * c[i];
        }
    }
    const size_t nv = (size_t)k->nphi * k->nmos * 3;
    for (size_t v = 0; v < nv; ++v) {
        double c[3];
        nbgi_cross(w, pl->abc + 3 * v, c);
        for (int i = 0; i < 3; ++i) {
            t->abc[3 * v + i] = unit * c[i];
        }
    }
}

/* The detector set-up's tangent by the complex step on input `what` (index: the beam axis or rotation axis). */
static void tangent_detector(const nbgi_plan *pl, nbgi_setup what, int index, nbgi_adjacc *t)
{
    const double _Complex ih = CSTEP * _Complex_I;
    const nbgi_det_in_d *d = &pl->lab.det.in;
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
    for (int i = 0; i < 3; ++i) {
        z.tau[i] = d->tau[i];
    }
    double unit = 1 / RTD;
    if (what == NBGI_S_DISTANCE) {
        /* as param.c's field: the close distance when the sample pivot takes it */
        if (z.pivot_sample && z.have_close) {
            z.close_distance += ih;
        } else {
            z.distance += ih;
        }
        unit = 1e-3;
    } else if (what == NBGI_S_BEAM && index == 0) {
        z.Fbeam += ih;
        z.Fclose += ih;
        unit = 1e-3;
    } else if (what == NBGI_S_BEAM) {
        z.Sbeam += ih;
        z.Sclose += ih;
        unit = 1e-3;
    } else if (what == NBGI_S_DET_ROT) {
        z.rot[index] += ih;
    } else if (what == NBGI_S_DET_TAU) {
        z.tau[index] += ih;
    } else {
        z.twotheta += ih;
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
}

/* The tangent of the plan-level quantities (the kernel's inputs) along scalar parameter p, in units of "per CLI
 * unit of p": the forward-mode half of the chain rule, by the set-up input the table says p moves.  t must be
 * zeroed, with t->abc (nphi*nmos*9) and t->lam (nsources) allocated.  The adjoint's chain rule is then
 * dL/dp = <accumulators, t_p>, and the JVP kernel propagates t_p through each sample; a mosaic domain's own turn
 * (NBG_P_DOMAIN) moves that domain's vectors alone.  The other families (panel motions,
 * structure factors) and the image-level parameters have no plan-level tangent: t stays zero. */
void nbgi_plan_tangent(const nbg_experiment *e, const nbgi_plan *pl, nbg_param p, nbgi_adjacc *t)
{
    int dm, dc;
    if (nbgi_param_domain(p, &dm, &dc)) {
        if (dm < pl->lab.xtal.ndomrot) { /* at most the domains (the plan checks) */
            tangent_domain(e, pl, dm, dc, t);
        }
        return;
    }
    if (p < 0 || p >= NBG_NPARAMS) {
        return;
    }
    const nbgi_param_row *r = &nbgi_param_rows[p];
    switch (r->setup) {
    case NBGI_S_CELL:
    case NBGI_S_MISSET:
    case NBGI_S_ORIENT:
    case NBGI_S_LAMBDA:
        tangent_crystal(e, pl, r->setup, r->index, t);
        return;
    case NBGI_S_TILT:
        tangent_tilt(e, pl, r->index, t);
        return;
    case NBGI_S_MOSAIC:
        tangent_mosaic(pl, t);
        return;
    case NBGI_S_BEAM_DIR:
        tangent_beam_dir(pl, r->index, t);
        return;
    case NBGI_S_DISTANCE:
    case NBGI_S_BEAM:
    case NBGI_S_DET_ROT:
    case NBGI_S_TWOTHETA:
    case NBGI_S_DET_TAU:
        tangent_detector(pl, r->setup, r->index, t);
        return;
    case NBGI_S_N:
        t->N[r->index] = 1;
        return;
    case NBGI_S_POLAR:
        t->K = 1;
        return;
    case NBGI_S_FLUENCE: {
        /* scale = r_e^2 fluence / steps and I_bg are proportional to the fluence */
        const double fl = pl->rep.fluence;
        t->scale = fl != 0 ? pl->k.scale / fl : NBG_RE2 / pl->rep.steps;
        t->Ibg = fl != 0 ? pl->k.I_bg / fl : 0;
        return;
    }
    case NBGI_S_MODEL:
        return; /* image-level: no kernel input */
    case NBGI_S_SPECTRUM:
        /* the sources' wavelengths alone (plan.c's spectrum): d lambda_i / d shift = 1 A, d lambda_i / d scale =
         * lambda_i0 - their mean; the crystal does not move (not even -mat's, whose lambda is e->lambda) */
        for (int i = 0; i < pl->k.nsources; ++i) {
            t->lam[i] = r->index == 0 ? 1e-10 : pl->lab.beam.dscale[i];
        }
        return;
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

/* Whether parameter p moves panels by their own tangents (beyond what the detector plane's carry): a panel
 * motion's component (its group's panels), and the beam's direction on panels fixed in the lab frame, which its
 * tangent turns about the sample as it turns the crystal (the plane's tangent moves no such panel). */
static int moves_panels(const nbg_experiment *e, nbg_param p)
{
    if (nbgi_param_motion(p, NULL, NULL)) {
        return 1;
    }
    return p >= 0 && p < NBG_NPARAMS && nbgi_param_rows[p].setup == NBGI_S_BEAM_DIR && e->npanels > 0 &&
           e->panel_frame == NBG_PANELS_LAB;
}

/* The panels' own tangents along p (moves_panels), per CLI unit: out[k * NBG_ADJ_DET ...] for panel k (pix0, f, s,
 * o, close, nbgi_adjacc's order), zero for a panel p does not move.  A motion's: its group's panels' from the plan
 * (nbgi_plan_panels).  The beam's direction: each lab-frame panel turned with the detector the other way about the
 * tilt's axis w, -w x v per degree on pix0, f, s, o; its close distance pix0 . o does not change. */
static void panel_tangents(const nbg_experiment *e, const nbgi_plan *pl, nbg_param p, double *out)
{
    const int np = pl->k.npanels;
    memset(out, 0, sizeof(double) * (size_t)np * NBG_ADJ_DET);
    int g, c;
    if (nbgi_param_motion(p, &g, &c)) {
        for (int k = 0; k < np; ++k) {
            if (e->panels[k].group == g) {
                memcpy(out + (size_t)k * NBG_ADJ_DET, pl->lab.det.motion_t + ((size_t)k * 6 + c) * NBG_ADJ_DET,
                       sizeof(double) * NBG_ADJ_DET);
            }
        }
        return;
    }
    const double *w = pl->lab.beam.tilt_axes + 3 * nbgi_param_rows[p].index;
    for (int k = 0; k < np; ++k) {
        const nbgi_kpanel *q = &pl->lab.det.panels[k];
        const double *src[4] = {q->pix0, q->fdet, q->sdet, q->odet};
        for (int v = 0; v < 4; ++v) {
            double x[3];
            nbgi_cross(w, src[v], x);
            for (int i = 0; i < 3; ++i) {
                out[(size_t)k * NBG_ADJ_DET + 3 * v + i] = -x[i] / RTD;
            }
        }
    }
}

/* What a list of parameters asks of the reverse pass. */
typedef struct {
    int F;       /* a structure-factor entry: the kernel accumulates dL/dF */
    int panels;  /* a parameter that moves panels by their own (moves_panels): the kernel accumulates each panel's
                    detector gradients */
    int kernel;  /* anything but the image-level parameters: the adjoint kernel runs */
    int N;       /* a crystal size: the kernel differentiates the lattice factor in N */
} nbgi_want;

static nbgi_want want_of(const nbg_experiment *e, const nbg_param *params, int n)
{
    nbgi_want w = {0, 0, 0, 0};
    for (int j = 0; j < n; ++j) {
        const nbgi_kind k = nbgi_param_kind(params[j], NULL, NULL, NULL);
        w.F |= k == NBGI_K_F;
        w.panels |= moves_panels(e, params[j]);
        w.kernel |= !nbgi_param_image_level(params[j]);
        w.N |= k == NBGI_K_SCALAR && nbgi_param_rows[params[j]].setup == NBGI_S_N;
    }
    return w;
}

/* The chain rule from the reduced accumulators to the listed parameters: dL/dp = <acc, t_p> for the scalars,
 * plus, for a parameter that moves panels by their own (a motion's component: its group's panels; the beam's
 * direction: lab-frame panels), the sum over the panels of <the panel's own gradients, its tangent>; a structure
 * factor's straight from the kernel.  The image-level parameters are model_adjoint's. */
static int chain_rule(const nbg_experiment *e, const nbgi_plan *pl, const nbgi_adjacc *acc, const nbg_param *params,
                      int n, double *g)
{
    const nbgi_kparams *k = &pl->k;
    double *pt = NULL;
    for (int j = 0; j < n; ++j) {
        long fi;
        switch (nbgi_param_kind(params[j], NULL, NULL, &fi)) {
        case NBGI_K_SCALAR:
        case NBGI_K_DOMAIN:
        case NBGI_K_MOTION: {
            if (nbgi_param_image_level(params[j])) {
                break;
            }
            double d = 0;
            if (!nbgi_param_motion(params[j], NULL, NULL)) {
                nbgi_adjacc t;
                if (nbgi_tangent_alloc(pl, &t) != NBG_OK) {
                    free(pt);
                    return NBG_ENOMEM;
                }
                nbgi_plan_tangent(e, pl, params[j], &t);
                d = plan_dot(pl, acc, &t);
                free(t.abc);
            }
            if (moves_panels(e, params[j])) {
                if (pt == NULL && (pt = malloc(sizeof(double) * (size_t)k->npanels * NBG_ADJ_DET)) == NULL) {
                    return NBG_ENOMEM;
                }
                panel_tangents(e, pl, params[j], pt);
                for (int q = 0; q < k->npanels; ++q) {
                    double dq = 0;
                    for (int x = 0; x < NBG_ADJ_DET; ++x) {
                        dq += acc->panel[(size_t)q * NBG_ADJ_DET + x] * pt[(size_t)q * NBG_ADJ_DET + x];
                    }
                    d += dq;
                }
            }
            g[j] = d;
            break;
        }
        case NBGI_K_F:
            g[j] = k->F != NULL ? acc->F[fi] : acc->defF;
            break;
        case NBGI_K_F_ALL:
        case NBGI_K_BAD:
            break;
        }
    }
    free(pt);
    return NBG_OK;
}

/* Runs the adjoint over the plan (the same bits for any thread count: nbgi_adjoint_cpu, or the device's block
 * order) and applies the chain rule. */
static int run_adjoint(nbg_ctx *ctx, const nbg_experiment *e, nbgi_plan *pl, const float *dLdI,
                       const nbg_param *params, int nparams, double *grad, float *image)
{
    const nbgi_kparams *k = &pl->k;
    const nbgi_want want = want_of(e, params, nparams);
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
    const size_t nF = (want.F && k->F != NULL) ? (size_t)k->nh * k->nk * k->nl : 0;
    const size_t nP = want.panels ? (size_t)k->npanels * NBG_ADJ_DET : 0;
    const size_t per = nabc + nsrc + nF + nP;
    nbgi_adjacc acc;
    memset(&acc, 0, sizeof acc);
    double *buf = calloc(per ? per : 1, sizeof(double));
    if (buf == NULL) {
        return nbgi_error(ctx, NBG_ENOMEM, "out of memory for %zu gradient accumulators", per);
    }
    acc.abc = buf;
    acc.lam = acc.abc + nabc;
    acc.F = nF ? acc.lam + nsrc : NULL;
    acc.panel = nP ? acc.lam + nsrc + nF : NULL;
#ifdef NBG_HAVE_CUDA
    /* the device's reverse pass, unless the call asks for what a thread there does not hold: structure-factor
     * gradients (a table's worth) or more than NBGI_CUDA_MAXACC crystal-vector and wavelength gradients; such a
     * call runs its reverse pass on the CPU below (in double, whatever the context's precision) */
    if (ctx->backend == NBG_BACKEND_CUDA && !want.F && nabc + nsrc <= NBGI_CUDA_MAXACC) {
        /* the device returns the fixed part, abc and lam, reduced in a fixed order */
        const int ncomp = (int)(NBG_ADJ_FIXED + nabc + nsrc);
        double *out = malloc(sizeof(double) * (size_t)ncomp);
        double t[3] = {0, 0, 0};
        int rc = out == NULL ? nbgi_error(ctx, NBG_ENOMEM, "out of memory")
                             : nbgi_cuda_adjoint(ctx, k, ctx->precision == NBG_FLOAT, dLdI, image, out, ncomp,
                                                 acc.panel, t);
        pl->rep.time_setup += t[0];
        pl->rep.time_kernel = t[1];
        pl->rep.time_copy = t[2];
        if (rc == NBG_OK) {
            memcpy(&acc, out, NBG_ADJ_FIXED * sizeof(double));
            memcpy(acc.abc, out + NBG_ADJ_FIXED, (nabc + nsrc) * sizeof(double));
        }
        free(out);
        if (rc == NBG_OK) {
            rc = nbgi_image_check(ctx, pl, image, NAN);
        }
        if (rc != NBG_OK) {
            free(buf);
            return rc;
        }
    } else
#endif
    {
        const double t0 = nbgi_now();
        double image_sum = 0;
        if (nbgi_adjoint_cpu(k, dLdI, image, &acc, nthreads, ctx->scalar_adjoint, &image_sum) != NBG_OK) {
            free(buf);
            return nbgi_error(ctx, NBG_ENOMEM, "out of memory for the adjoint's chunk accumulators");
        }
        pl->rep.time_kernel = nbgi_now() - t0;
        pl->rep.time_copy = 0;
        /* the image's finiteness from the kernel's sum, as the forward's (no pass of its own) */
        const int rc = nbgi_image_check(ctx, pl, image, image_sum);
        if (rc != NBG_OK) {
            free(buf);
            return rc;
        }
    }
    const int rc = chain_rule(e, pl, &acc, params, nparams, grad);
    free(buf);
    return rc != NBG_OK ? nbgi_error(ctx, NBG_ENOMEM, "out of memory for the chain rule") : NBG_OK;
}

/* The gradient of a loss with dL/dM = dLdM: the adjoint kernel (with dL/dI = scale * dL/dM) for the simulation's
 * parameters, or the forward kernel alone when only image-level ones are asked for; then the image-level
 * gradients; image receives the model image M. */
static int model_adjoint(nbg_ctx *ctx, const nbg_experiment *e, nbgi_plan *pl, const float *dLdM,
                         const nbg_param *params, int nparams, double *grad, float *image)
{
    const size_t npix = (size_t)pl->k.npix;
    const nbgi_want want = want_of(e, params, nparams);
    int rc;
    for (int j = 0; j < nparams; ++j) {
        grad[j] = 0;
    }
    if (!want.kernel) {
        rc = nbgi_forward_plan(ctx, pl, image);
    } else if (e->scale == 1) {
        rc = run_adjoint(ctx, e, pl, dLdM, params, nparams, grad, image);
    } else {
        float *d = malloc(sizeof(float) * npix);
        if (d == NULL) {
            return nbgi_error(ctx, NBG_ENOMEM, "out of memory for dL/dI");
        }
        const long nw = nbgi_nwalk(&pl->k);
#pragma omp parallel for schedule(static)
        for (long t = 0; t < nw; ++t) { /* the kernels read the listed pixels only */
            const size_t i = nbgi_walk_at(&pl->k, t);
            d[i] = (float)(e->scale * dLdM[i]); /* dL/dI = dL/dM dM/dI */
        }
        rc = run_adjoint(ctx, e, pl, d, params, nparams, grad, image);
        free(d);
    }
    if (rc != NBG_OK) {
        return rc;
    }
    int image_level = 0;
    for (int j = 0; j < nparams; ++j) {
        image_level |= nbgi_param_image_level(params[j]);
    }
    if (image_level) {
        double sums[4];
        int nthreads = ctx->nthreads;
#ifdef _OPENMP
        nthreads = nthreads > 0 ? nthreads : omp_get_max_threads();
#else
        nthreads = 1;
#endif
        model_grad(&pl->k, dLdM, image, sums, nthreads);
        for (int j = 0; j < nparams; ++j) {
            if (nbgi_param_image_level(params[j])) {
                grad[j] = sums[nbgi_param_rows[params[j]].index];
            }
        }
    }
    nbgi_model_apply(e, &pl->k, image);
    for (int j = 0; j < nparams; ++j) {
        if (params[j] == ctx->break_param) {
            grad[j] *= 1.001; /* test-only: a deliberately wrong adjoint */
        }
        if (params[j] == ctx->zero_param) {
            grad[j] = 0; /* test-only: a lost adjoint */
        }
    }
    return NBG_OK;
}

/* A gradient that is not finite (an image that is, but a loss whose derivative overflows) is an error, not a
 * result. */
static int gradient_check(nbg_ctx *ctx, const nbg_experiment *e, const nbg_param *params, int nparams,
                          const double *grad)
{
    for (int j = 0; j < nparams; ++j) {
        if (!isfinite(grad[j])) {
            char lab[48];
            return nbgi_error(ctx, NBG_EINVAL, "the gradient in %s is not finite (%g)",
                             nbg_param_label(e, params[j], lab, sizeof lab), grad[j]);
        }
    }
    return NBG_OK;
}

/* Builds the plan of a gradient call and checks the list, the buffers' size and what the list asks for; on
 * failure the plan holds nothing. */
static int plan_for_grad(nbg_ctx *ctx, const nbg_experiment *e, size_t npix, const nbg_param *params, int nparams,
                         const char *what, nbgi_plan *pl)
{
    int rc = nbgi_params_check(ctx, e, params, nparams, 0, what);
    if (rc != NBG_OK) {
        return rc;
    }
    rc = nbgi_plan_build(ctx, e, pl);
    if (rc != NBG_OK) {
        return rc;
    }
    pl->k.want_dN = want_of(e, params, nparams).N;
    if ((size_t)pl->k.npix != npix && pl->k.npanels > 0) {
        rc = nbgi_error(ctx, NBG_EINVAL, "the image buffers hold %zu pixels, the detector's %d panels have %ld", npix,
                       pl->k.npanels, pl->k.npix);
    } else if ((size_t)pl->k.npix != npix) {
        rc = nbgi_error(ctx, NBG_EINVAL, "the image buffers hold %zu pixels, the detector has %d x %d = %zu", npix,
                       pl->k.fpixels, pl->k.spixels, (size_t)pl->k.fpixels * pl->k.spixels);
    } else {
        rc = nbgi_grad_supported(ctx, e, pl, params, nparams);
    }
    if (rc != NBG_OK) {
        nbgi_plan_free(pl);
    }
    return rc;
}

int nbg_simulate_grad(nbg_ctx *ctx, const nbg_experiment *e, const float *dLdI, const nbg_param *params,
                      int nparams, double *grad, float *image, size_t npix, nbg_report *report)
{
    if (ctx == NULL || e == NULL || dLdI == NULL || (nparams > 0 && grad == NULL) || image == NULL) {
        return nbgi_error(ctx, NBG_EINVAL, "nbg_simulate_grad: NULL argument");
    }
    const double t0 = nbgi_now();
    nbgi_plan pl;
    int rc = plan_for_grad(ctx, e, npix, params, nparams, "nbg_simulate_grad", &pl);
    if (rc != NBG_OK) {
        return rc;
    }
    pl.rep.time_setup = nbgi_now() - t0;
    rc = model_adjoint(ctx, e, &pl, dLdI, params, nparams, grad, image);
    if (rc == NBG_OK && !nbgi_model_is_identity(e)) {
        rc = nbgi_image_check(ctx, &pl, image, NAN); /* the kernels checked the image before the model */
    }
    if (rc == NBG_OK) {
        rc = gradient_check(ctx, e, params, nparams, grad);
    }
    if (rc == NBG_OK && report != NULL) {
        *report = pl.rep;
    }
    nbgi_plan_free(&pl);
    return rc;
}

int nbg_loss_grad(nbg_ctx *ctx, const nbg_experiment *e, nbg_loss loss, const float *observed,
                  const float *weights, const nbg_param *params, int nparams, double *L, double *grad, float *image,
                  size_t npix)
{
    if (ctx == NULL || e == NULL || observed == NULL || L == NULL || (nparams > 0 && grad == NULL) || image == NULL) {
        return nbgi_error(ctx, NBG_EINVAL, "nbg_loss_grad: NULL argument");
    }
    if (loss != NBG_LOSS_LSQ && loss != NBG_LOSS_POISSON) {
        return nbgi_error(ctx, NBG_EINVAL, "unknown loss %d", (int)loss);
    }
    nbgi_plan pl;
    int rc = plan_for_grad(ctx, e, npix, params, nparams, "nbg_loss_grad", &pl);
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
        if (!isfinite(observed[i])) {
            /* a value below zero is data (dark-subtracted images): least squares takes it as it is, the Poisson
             * losses clip it (nbgi_pixel_loss) */
            nbgi_plan_free(&pl);
            return nbgi_error(ctx, NBG_EINVAL, "observed image pixel %zu is %g (must be finite)", i,
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
        nbgi_response_cursor rcur;
        nbgi_response_init(&rcur, e);
        for (long t = 0; t < nw; ++t) {
            const size_t i = nbgi_walk_at(&pl.k, t);
            if (!nbgi_model_active(&pl.k, i)) {
                dLdI[i] = 0;
                continue;
            }
            const double w = weights != NULL ? weights[i] : 1.0;
            double d;
            sum += w * nbgi_pixel_loss(loss, nbgi_response_at(&rcur, i), image[i], observed[i], &d, NULL);
            dLdI[i] = (float)(w * d);
        }
        *L = sum;
        if (nparams > 0) { /* else the loss alone: no reverse pass */
            rc = model_adjoint(ctx, e, &pl, dLdI, params, nparams, grad, image);
            if (rc == NBG_OK) {
                rc = gradient_check(ctx, e, params, nparams, grad);
            }
        }
    }
    free(dLdI);
    nbgi_plan_free(&pl);
    return rc;
}

/* nbg_simulate_jvp and nbg_simulate_tangents: image (float, always given) and image_d (double, or NULL) */
static int simulate_jvp(nbg_ctx *ctx, const nbg_experiment *e, const nbg_param *params, int nparams,
                        double *tangents, float *image, double *image_d, size_t npix)
{
    for (int j = 0; j < nparams; ++j) {
        if (nbgi_param_kind(params[j], NULL, NULL, NULL) == NBGI_K_F) {
            char lab[48];
            return nbgi_error(ctx, NBG_EINVAL, "nbg_simulate_jvp: parameter %d (%s): structure factors have no "
                             "tangent images here (nbg_simulate_grad gives dL/dF)", j,
                             nbg_param_label(e, params[j], lab, sizeof lab));
        }
    }
    const int panels_move = want_of(e, params, nparams).panels;
    nbgi_plan pl;
    int rc = plan_for_grad(ctx, e, npix, params, nparams, "nbg_simulate_jvp", &pl);
    if (rc != NBG_OK) {
        return rc;
    }
    /* the simulation's parameters go through the tangent kernel, compacted to the front, NBG_JVP_MAX a pass; the
     * image-level ones are filled afterwards (dM/dG = I, dM/dbg = 1, x, y; the others' tangents times G) */
    const size_t nw = (size_t)nbgi_nwalk(&pl.k);
    int *slot = malloc(sizeof(int) * (size_t)(nparams > 0 ? nparams : 1));
    const size_t nptan = (size_t)NBG_JVP_MAX * (size_t)pl.k.npanels * NBG_ADJ_DET;
    double *ptan = panels_move ? malloc(sizeof(double) * nptan) : NULL;
    if (slot == NULL || (panels_move && ptan == NULL)) {
        free(slot);
        nbgi_plan_free(&pl);
        return nbgi_error(ctx, NBG_ENOMEM, "out of memory for the tangents");
    }
    int nt = 0;
    for (int j = 0; j < nparams; ++j) {
        if (!nbgi_param_image_level(params[j])) {
            slot[nt++] = j;
        }
    }
    for (int q0 = 0; rc == NBG_OK && q0 < nt; q0 += NBG_JVP_MAX) {
        const int m = nt - q0 < NBG_JVP_MAX ? nt - q0 : NBG_JVP_MAX;
        nbgi_adjacc t[NBG_JVP_MAX];
        int na = 0, own = 0; /* whether a direction of this pass moves panels by their own */
        if (ptan != NULL) {
            memset(ptan, 0, sizeof(double) * nptan);
        }
        for (; na < m; ++na) {
            const nbg_param p = params[slot[q0 + na]];
            if (nbgi_tangent_alloc(&pl, &t[na]) != NBG_OK) {
                rc = nbgi_error(ctx, NBG_ENOMEM, "out of memory for the tangents");
                break;
            }
            if (!nbgi_param_motion(p, NULL, NULL)) {
                nbgi_plan_tangent(e, &pl, p, &t[na]); /* a motion's is zero */
            }
            if (moves_panels(e, p)) {
                own = 1; /* the panels' own tangents, added to what the plane's carry */
                panel_tangents(e, &pl, p, ptan + (size_t)na * pl.k.npanels * NBG_ADJ_DET);
            }
        }
        if (rc == NBG_OK) {
            int nthreads = 1;
#ifdef _OPENMP
            nthreads = ctx->nthreads > 0 ? ctx->nthreads : omp_get_max_threads();
#endif
#ifdef NBG_HAVE_CUDA
            if (ctx->backend == NBG_BACKEND_CUDA) {
                double tm[3] = {0, 0, 0};
                rc = nbgi_cuda_jvp(ctx, &pl.k, t, m, own ? ptan : NULL, tangents + (size_t)q0 * nw, image, image_d,
                                   tm);
            } else
#endif
            {
                nbgi_jvp_cpu(&pl.k, t, m, own ? ptan : NULL, tangents + (size_t)q0 * nw, image, image_d,
                             ctx->scalar_adjoint == 0, nthreads);
            }
            if (rc == NBG_OK) {
                rc = nbgi_image_check(ctx, &pl, image, NAN);
            }
        }
        for (int j = 0; j < na; ++j) {
            free(t[j].abc);
        }
    }
    if (rc == NBG_OK && nt == 0 && image_d != NULL) {
        /* the image alone, in double: the forward kernel's double instantiation, unrounded */
        rc = nbgi_forward_plan_d(ctx, &pl, image, image_d);
    } else if (rc == NBG_OK && nt == 0) {
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
            if (!nbgi_param_image_level(params[j])) {
                continue;
            }
            double *dst = tangents + (size_t)j * nw;
            for (size_t u = 0; u < nw; ++u) {
                const size_t i = nbgi_walk_at(&pl.k, (long)u);
                double x, y;
                nbgi_model_xy(&pl.k, i, &x, &y);
                const double v[4] = {image_d != NULL ? image_d[i] : image[i], 1, x, y};
                dst[u] = nbgi_model_active(&pl.k, i) ? v[nbgi_param_rows[params[j]].index] : 0;
            }
        }
        nbgi_model_apply(e, &pl.k, image);
        if (image_d != NULL && !nbgi_model_is_identity(e)) {
            const long nwalk = nbgi_nwalk(&pl.k);
            for (long u = 0; u < nwalk; ++u) {
                const size_t i = nbgi_walk_at(&pl.k, u);
                if (nbgi_model_active(&pl.k, i)) {
                    image_d[i] = e->scale * image_d[i] + nbgi_model_bg(e, &pl.k, i);
                }
            }
        }
    }
    free(slot);
    free(ptan);
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
    return simulate_jvp(ctx, e, params, nparams, tangents, image, NULL, npix);
}

int nbg_simulate_tangents(nbg_ctx *ctx, const nbg_experiment *e, const nbg_param *params, int nparams,
                          double *tangents, float *image, double *image_d, size_t npix)
{
    if (ctx == NULL || e == NULL || nparams < 0 || (nparams > 0 && (params == NULL || tangents == NULL)) ||
        (image == NULL && image_d == NULL)) {
        return nbgi_error(ctx, NBG_EINVAL, "nbg_simulate_tangents: NULL argument or %d parameters", nparams);
    }
    float *own = NULL;
    if (image == NULL) {
        own = malloc(sizeof(float) * (npix > 0 ? npix : 1));
        if (own == NULL) {
            return nbgi_error(ctx, NBG_ENOMEM, "out of memory for the image");
        }
        image = own;
    }
    const int rc = simulate_jvp(ctx, e, params, nparams, tangents, image, image_d, npix);
    free(own);
    return rc;
}

void nbgi_debug_scalar_adjoint(nbg_ctx *ctx, int on)
{
    if (ctx != NULL) {
        ctx->scalar_adjoint = on == 2 ? NBGI_ADJ_TILED : on != 0 ? NBGI_ADJ_SCALAR : NBGI_ADJ_ROWS;
    }
}
