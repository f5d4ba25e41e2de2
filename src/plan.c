/*
 * plan.c -- turns an nbg_experiment (user units) into kernel parameters (SI units), following the reference
 * program's set-up order: detector size, fluence, near point and beam centre, convention vectors, sampling
 * auto-selection, detector rotations and pivot, crystal orientation, crystal size, oversampling, sources, spindle
 * and mosaic rotations, structure factors, normalisation.  See ../shared/reference/nanobragg-behaviour.md §2.
 *
 * Where nanoBragg has a bug nbgrad does not copy it: the phi step at phi = 0 uses the unrotated crystal (the
 * reference reuses a stale orientation), and an interpolation window leaving the table falls back to the nearest
 * entry for that sample only (the reference switches interpolation off for the rest of the run, in an order that
 * depends on thread scheduling).
 */
#include "plan.h"
#include "rng.h"
#include "setup.h"

#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#define RTD (180.0 / M_PI)

void nbg_cross(const double a[3], const double b[3], double out[3]) { cross_d(a, b, out); }

double nbg_dot(const double a[3], const double b[3]) { return dot_d(a, b); }

double nbg_norm(const double a[3]) { return sqrt(dot_d(a, a)); }

/* Scales v to unit length in place and returns its former length (0 leaves it unchanged). */
static double unitize(double v[3])
{
    const double m = nbg_norm(v);
    if (m != 0) {
        v[0] /= m;
        v[1] /= m;
        v[2] /= m;
    }
    return m;
}

/* R_xyz = Rz * Ry * Rx applied to a column vector (x first), each right-handed; a zero angle is skipped. */
void nbg_rotate_xyz(const double v[3], double rx, double ry, double rz, double out[3])
{
    rotate_xyz_d(v, rx, ry, rz, out);
}

/* Rodrigues rotation about an axis that is used as given (nanoBragg does not normalise it). */
static void rotate_axis(const double v[3], const double ax[3], double phi, double out[3])
{
    rotate_axis_d(v, ax, phi, out);
}

static void matvec(const double U[9], const double v[3], double out[3])
{
    const double x = U[0] * v[0] + U[1] * v[1] + U[2] * v[2];
    const double y = U[3] * v[0] + U[4] * v[1] + U[5] * v[2];
    const double z = U[6] * v[0] + U[7] * v[1] + U[8] * v[2];
    out[0] = x;
    out[1] = y;
    out[2] = z;
}

static void set3(double v[3], double x, double y, double z)
{
    v[0] = x;
    v[1] = y;
    v[2] = z;
}

/* nanoBragg's auto-selection of a sampled range (divergence, dispersion): count, range and step given or not. */
static void resolve_range(int *steps, double *range, double *step)
{
    if (*steps <= 0) {
        if (*range < 0) {
            if (*step <= 0) {
                *steps = 1;
                *range = 0;
                *step = 0;
            } else {
                *range = *step;
                *steps = 2;
            }
        } else if (*step <= 0) {
            *step = *range;
            *steps = 2;
        } else {
            *steps = (int)ceil(*range / *step);
        }
    } else {
        if (*range < 0) {
            if (*step <= 0) {
                *range = 1.0;
                *step = *range / *steps;
            } else {
                *range = *step;
                *steps = 2;
            }
        } else if (*step <= 0) {
            if (*steps <= 1) {
                *steps = 2;
            }
            *step = *range / (*steps - 1);
        }
    }
    if (*range <= 0 || *step <= 0 || *steps <= 0) {
        *steps = 1;
        *range = 0;
        *step = 0;
    }
}

/* The same for the sensor thickness, whose range-only rule differs (two layers of half the thickness). */
static void resolve_thickness(int *steps, double *thick, double *step)
{
    if (*steps <= 0) {
        if (*thick < 0) {
            if (*step <= 0) {
                *steps = 1;
                *thick = 0;
                *step = 0;
            } else {
                *thick = *step;
                *steps = 2;
            }
        } else if (*step <= 0) {
            *steps = 2;
            *step = *thick / *steps;
        } else {
            *steps = (int)ceil(*thick / *step);
        }
    } else {
        if (*thick < 0) {
            if (*step <= 0) {
                *thick = 0.5e-6;
                *step = *thick / *steps;
            } else {
                *thick = *step;
                *steps = 2;
            }
        } else if (*step <= 0) {
            if (*steps <= 1) {
                *steps = 2;
            }
            *step = *thick / (*steps - 1);
        }
    }
    if (*thick <= 0 || *step <= 0 || *steps <= 0) {
        *steps = 1;
        *thick = 0;
        *step = 0;
    }
}

static void resolve_phi(int *steps, double *osc, double *step)
{
    if (*steps < 0) {
        if (*osc < 0) {
            if (*step <= 0) {
                *steps = 1;
                *osc = 0;
                *step = 0;
            } else {
                *osc = *step;
                *steps = 2;
            }
        } else if (*step <= 0) {
            *steps = 2;
            *step = *osc / 2.0;
        } else {
            *steps = (int)ceil(*osc / *step);
        }
    } else {
        if (*steps == 0) {
            *steps = 1;
        }
        if (*osc < 0) {
            if (*step <= 0) {
                *osc = 1.0 / RTD;
                *step = *osc / *steps;
            } else {
                *osc = *step;
                *steps = 2;
            }
        } else if (*step < 0) {
            *step = *osc / *steps;
        }
    }
}

#define CHECK_FINITE(x, name)                                                                                     \
    do {                                                                                                          \
        if (!isfinite(x)) {                                                                                       \
            return nbg_error(ctx, NBG_EINVAL, "%s is not a finite number (%g)", name, (double)(x));             \
        }                                                                                                         \
    } while (0)

static int validate(nbg_ctx *ctx, const nbg_experiment *e)
{
    CHECK_FINITE(e->pixel, "pixel size");
    CHECK_FINITE(e->distance, "distance");
    CHECK_FINITE(e->lambda, "wavelength");
    CHECK_FINITE(e->detsize_f, "detector size (fast)");
    CHECK_FINITE(e->detsize_s, "detector size (slow)");
    CHECK_FINITE(e->fluence, "fluence");
    CHECK_FINITE(e->flux, "flux");
    CHECK_FINITE(e->exposure, "exposure");
    CHECK_FINITE(e->beamsize, "beam size");
    CHECK_FINITE(e->polarization, "polarization factor");
    CHECK_FINITE(e->Na, "Na");
    CHECK_FINITE(e->Nb, "Nb");
    CHECK_FINITE(e->Nc, "Nc");
    CHECK_FINITE(e->fudge, "fudge");
    CHECK_FINITE(e->phi0, "phi");
    CHECK_FINITE(e->osc, "osc");
    CHECK_FINITE(e->phistep, "phistep");
    CHECK_FINITE(e->mosaic, "mosaic spread");
    CHECK_FINITE(e->default_F, "default_F");
    CHECK_FINITE(e->dmin, "dmin");
    CHECK_FINITE(e->water, "water");
    CHECK_FINITE(e->thick, "detector thickness");
    CHECK_FINITE(e->dispersion, "dispersion");
    CHECK_FINITE(e->hdivrange, "hdivrange");
    CHECK_FINITE(e->vdivrange, "vdivrange");
    CHECK_FINITE(e->hdivstep, "hdivstep");
    CHECK_FINITE(e->vdivstep, "vdivstep");
    CHECK_FINITE(e->twotheta, "twotheta");
    CHECK_FINITE(e->sample_x, "sample size x");
    CHECK_FINITE(e->sample_y, "sample size y");
    CHECK_FINITE(e->sample_z, "sample size z");
    CHECK_FINITE(e->beam_shift[0], "beam_fast shift");
    CHECK_FINITE(e->beam_shift[1], "beam_slow shift");
    for (int i = 0; i < 3; ++i) {
        CHECK_FINITE(e->det_rot[i], "detector rotation");
        CHECK_FINITE(e->misset[i], "misset angle");
    }
    if (!isnan(e->close_distance)) {
        CHECK_FINITE(e->close_distance, "close_distance");
    }
    const double *opt[] = {&e->Xbeam, &e->Ybeam, &e->Xclose, &e->Yclose, &e->ORGX, &e->ORGY, &e->thick_abs};
    const char *optname[] = {"Xbeam", "Ybeam", "Xclose", "Yclose", "ORGX", "ORGY", "detector_abs"};
    for (int i = 0; i < 7; ++i) {
        if (isinf(*opt[i]) && i != 6) {
            return nbg_error(ctx, NBG_EINVAL, "%s is not a finite number (%g)", optname[i], *opt[i]);
        }
    }
    if (e->pixel <= 0) {
        return nbg_error(ctx, NBG_EINVAL, "pixel size must be positive (got %g mm)", e->pixel);
    }
    if (e->fpixels < 0 || e->spixels < 0) {
        return nbg_error(ctx, NBG_EINVAL, "pixel counts must not be negative (got %d x %d)", e->fpixels,
                         e->spixels);
    }
    if (e->lambda <= 0) {
        return nbg_error(ctx, NBG_EINVAL, "wavelength must be positive (got %g A)", e->lambda);
    }
    if (e->distance <= 0 && isnan(e->close_distance)) {
        return nbg_error(ctx, NBG_EINVAL, "distance must be positive (got %g mm)", e->distance);
    }
    if (!e->has_cell && !e->has_mat) {
        return nbg_error(ctx, NBG_EINVAL, "no crystal: give a unit cell or an orientation matrix");
    }
    if (e->has_cell) {
        for (int i = 0; i < 6; ++i) {
            CHECK_FINITE(e->cell[i], "unit cell parameter");
        }
        if (e->cell[0] <= 0) {
            return nbg_error(ctx, NBG_EINVAL, "unit cell length a must be positive (got %g A)", e->cell[0]);
        }
    }
    if (e->has_mat) {
        for (int i = 0; i < 9; ++i) {
            CHECK_FINITE(e->mat[i], "orientation matrix element");
        }
    }
    if (e->hkl == NULL && e->default_F == 0) {
        return nbg_error(ctx, NBG_EINVAL,
                         "no structure factors: give an HKL table or a non-zero default_F (the image would be blank)");
    }
    if (e->mosaic_domains == 0 || e->mosaic_domains < -1) {
        return nbg_error(ctx, NBG_EINVAL, "mosaic domain count must be positive (got %d)", e->mosaic_domains);
    }
    if (e->nsources < 0 || (e->nsources > 0 && e->sources == NULL)) {
        return nbg_error(ctx, NBG_EINVAL, "source list is inconsistent (%d sources)", e->nsources);
    }
    if (e->oversample > 1000 || e->thicksteps > 100000 || e->phisteps > 1000000 || e->mosaic_domains > 1000000) {
        return nbg_error(ctx, NBG_EINVAL, "sampling counts are unreasonably large");
    }
    return NBG_OK;
}

void nbg_experiment_default(nbg_experiment *e)
{
    memset(e, 0, sizeof *e);
    e->convention = NBG_CONV_MOSFLM;
    e->pivot = NBG_PIVOT_AUTO;
    e->pixel = 0.1;
    e->detsize_f = e->detsize_s = 102.4;
    e->distance = 100;
    e->close_distance = NAN;
    e->Xbeam = e->Ybeam = e->Xclose = e->Yclose = e->ORGX = e->ORGY = NAN;
    double *vecs[] = {e->fdet, e->sdet, e->odet, e->beam, e->polar_axis, e->spindle, e->twotheta_axis};
    for (int i = 0; i < 7; ++i) {
        set3(vecs[i], NAN, NAN, NAN);
    }
    e->roi[0] = e->roi[1] = e->roi[2] = e->roi[3] = -1;
    e->thick_abs = NAN;
    e->thicksteps = -1;
    e->oversample = -1;
    e->lambda = 1;
    e->dispsteps = -1;
    e->hdivrange = e->vdivrange = e->hdivstep = e->vdivstep = -1;
    e->hdivsteps = e->vdivsteps = -1;
    e->round_div = 1;
    e->fluence = NBG_DEFAULT_FLUENCE;
    e->exposure = 1;
    e->beamsize = 0.1;
    e->Na = e->Nb = e->Nc = 1;
    e->shape = NBG_SHAPE_SQUARE;
    e->fudge = 1;
    e->osc = e->phistep = -1;
    e->phisteps = -1;
    e->mosaic = -1;
    e->mosaic_domains = -1;
    e->mosaic_seed = 12345678;
    e->interpolate = -1;
}

/* The crystal inputs of the smooth set-up map (angles in radians, defaults applied). */
void nbg_plan_xtal_in(const nbg_experiment *e, const double misset_rad[3], double lambda0, nbg_xtal_in_d *in)
{
    memset(in, 0, sizeof *in);
    in->has_cell = e->has_cell;
    in->has_mat = e->has_mat;
    if (e->has_cell) {
        for (int i = 0; i < 6; ++i) {
            in->cell[i] = e->cell[i];
        }
        if (in->cell[1] <= 0) {
            in->cell[1] = in->cell[0];
        }
        if (in->cell[2] <= 0) {
            in->cell[2] = in->cell[0];
        }
        for (int i = 3; i < 6; ++i) {
            in->cell[i] = in->cell[i] <= 0 ? M_PI / 2 : in->cell[i] / RTD;
        }
    }
    memcpy(in->mat, e->mat, sizeof in->mat);
    in->lambda0 = lambda0;
    for (int i = 0; i < 3; ++i) {
        in->misset[i] = misset_rad[i];
    }
}

static int build_crystal(nbg_ctx *ctx, const nbg_experiment *e, nbg_plan *pl, double lambda0)
{
    nbg_report *r = &pl->rep;
    double mis[3] = {e->misset[0] / RTD, e->misset[1] / RTD, e->misset[2] / RTD};
    if (e->misset_random) {
        nbg_rng rng;
        double U[9], axis[3], angle;
        nbg_rng_init(&rng, e->misset_seed);
        nbg_mosaic_umat(90.0, &rng, U, axis, &angle); /* 90 "radians", as nanoBragg: uniform orientations */
        nbg_umat2misset(U, mis);
        for (int i = 0; i < 3; ++i) {
            r->misset_random_deg[i] = mis[i] * RTD;
        }
    }
    memcpy(pl->misset, mis, sizeof mis);
    nbg_xtal_in_d in;
    nbg_plan_xtal_in(e, mis, lambda0, &in);
    double abc[9];
    const double Vstar = nbg_crystal_d(&in, abc, pl->k.astar);
    const double *a = abc, *b = abc + 3, *c = abc + 6;
    const double la = nbg_norm(a), lb = nbg_norm(b), lc = nbg_norm(c);
    if (!isfinite(Vstar) || Vstar == 0 || !(la > 0 && lb > 0 && lc > 0) || !isfinite(la * lb * lc) ||
        !(1.0 / fabs(Vstar) > 1e-6)) {
        return nbg_error(ctx, NBG_EINVAL, "the unit cell has zero volume or a zero-length axis (check -cell or -mat)");
    }
    r->cell[0] = la;
    r->cell[1] = lb;
    r->cell[2] = lc;
    r->cell[3] = acos(fmax(-1, fmin(1, nbg_dot(b, c) / lb / lc))) * RTD;
    r->cell[4] = acos(fmax(-1, fmin(1, nbg_dot(a, c) / la / lc))) * RTD;
    r->cell[5] = acos(fmax(-1, fmin(1, nbg_dot(a, b) / la / lb))) * RTD;
    for (int i = 0; i < 9; ++i) {
        r->real_vectors[i] = abc[i];
        r->recip_vectors[i] = pl->k.astar[i];
        pl->a0[i] = abc[i] * 1e-10;
    }
    return NBG_OK;
}

int nbg_plan_build(nbg_ctx *ctx, const nbg_experiment *e, nbg_plan *pl)
{
    memset(pl, 0, sizeof *pl);
    int rc = validate(ctx, e);
    if (rc != NBG_OK) {
        return rc;
    }
    nbg_kparams *k = &pl->k;
    nbg_report *r = &pl->rep;

    /* --- detector size ------------------------------------------------------------------------------------ */
    const double px = e->pixel / 1000.0;
    double detsize_f = e->detsize_f / 1000.0, detsize_s = e->detsize_s / 1000.0;
    if (e->fpixels > 0) {
        detsize_f = px * e->fpixels;
    }
    if (e->spixels > 0) {
        detsize_s = px * e->spixels;
    }
    const double nf = ceil(detsize_f / px - 0.5), ns = ceil(detsize_s / px - 0.5);
    if (!(nf >= 1 && ns >= 1 && nf * ns <= 1e9)) {
        return nbg_error(ctx, NBG_EINVAL, "detector of %g x %g pixels is impossible (size %g x %g mm, pixel %g mm)",
                         nf, ns, detsize_f * 1000, detsize_s * 1000, e->pixel);
    }
    const int fpixels = (int)nf, spixels = (int)ns;

    /* --- beam fluence and sample clipping ------------------------------------------------------------------- */
    double fluence = e->fluence, flux = e->flux;
    const double beamsize = e->beamsize / 1000.0;
    double sample_x = e->sample_x / 1000.0, sample_y = e->sample_y / 1000.0, sample_z = e->sample_z / 1000.0;
    if (flux != 0 && e->exposure > 0 && beamsize >= 0) {
        fluence = flux * e->exposure / beamsize / beamsize;
    }
    if (beamsize >= 0) {
        if (beamsize < sample_y) {
            sample_y = beamsize;
            r->warn_clipped_sample = 1;
        }
        if (beamsize < sample_z) {
            sample_z = beamsize;
            r->warn_clipped_sample = 1;
        }
    }
    if (e->exposure > 0) {
        flux = fluence / e->exposure * beamsize * beamsize;
    }
    if (!isfinite(fluence) || fluence < 0) {
        return nbg_error(ctx, NBG_EINVAL, "fluence is not a finite non-negative number (%g; check -flux, "
                         "-exposure, -beamsize)", fluence);
    }

    /* --- near point and beam centre ------------------------------------------------------------------------- */
    double Fclose = isnan(e->ORGX) ? detsize_f / 2.0 : (e->ORGX - 0.5) * px;
    double Sclose = isnan(e->ORGY) ? detsize_s / 2.0 : (e->ORGY - 0.5) * px;
    const double Xclose = isnan(e->Xclose) ? Fclose : e->Xclose / 1000.0;
    const double Yclose = isnan(e->Yclose) ? Sclose : e->Yclose / 1000.0;
    double Xbeam = isnan(e->Xbeam) ? NAN : e->Xbeam / 1000.0;
    double Ybeam = isnan(e->Ybeam) ? NAN : e->Ybeam / 1000.0;
    double Fbeam = Fclose, Sbeam = Sclose;

    double b[3], f[3], s[3], o[3], tta[3], pol[3], u[3];
    int pivot = NBG_PIVOT_BEAM;
    switch (e->convention) {
    case NBG_CONV_ADXV:
        if (isnan(Xbeam)) {
            Xbeam = (detsize_f + px) / 2.0;
        }
        if (isnan(Ybeam)) {
            Ybeam = (detsize_s - px) / 2.0;
        }
        set3(b, 0, 0, 1), set3(f, 1, 0, 0), set3(s, 0, -1, 0), set3(o, 0, 0, 1);
        set3(tta, -1, 0, 0), set3(pol, 1, 0, 0), set3(u, 1, 0, 0);
        Fbeam = Xbeam;
        Sbeam = detsize_s - Ybeam;
        break;
    case NBG_CONV_MOSFLM:
    case NBG_CONV_DENZO: {
        if (isnan(Xbeam)) {
            Xbeam = (detsize_s + px) / 2.0;
        }
        if (isnan(Ybeam)) {
            Ybeam = (detsize_f + px) / 2.0;
        }
        set3(b, 1, 0, 0), set3(o, 1, 0, 0), set3(f, 0, 0, 1), set3(s, 0, -1, 0);
        set3(tta, 0, 0, -1), set3(pol, 0, 0, 1), set3(u, 0, 0, 1);
        const double half = e->convention == NBG_CONV_MOSFLM ? 0.5 * px : 0.0;
        Fbeam = Ybeam + half;
        Sbeam = Xbeam + half;
        break;
    }
    case NBG_CONV_XDS:
    case NBG_CONV_DIALS:
        if (isnan(Xbeam)) {
            Xbeam = Xclose;
        }
        if (isnan(Ybeam)) {
            Ybeam = Yclose;
        }
        set3(b, 0, 0, 1), set3(f, 1, 0, 0), set3(s, 0, 1, 0), set3(o, 0, 0, 1);
        if (e->convention == NBG_CONV_XDS) {
            set3(tta, 1, 0, 0), set3(pol, 1, 0, 0), set3(u, 1, 0, 0);
        } else {
            set3(tta, 0, 1, 0), set3(pol, 0, 1, 0), set3(u, 0, 1, 0);
        }
        Fbeam = Xbeam;
        Sbeam = Ybeam;
        pivot = NBG_PIVOT_SAMPLE;
        break;
    case NBG_CONV_CUSTOM: {
        if (isnan(Xbeam)) {
            Xbeam = Xclose;
        }
        if (isnan(Ybeam)) {
            Ybeam = Yclose;
        }
        const double *src[7] = {e->beam, e->fdet, e->sdet, e->odet, e->twotheta_axis, e->polar_axis, e->spindle};
        double *dst[7] = {b, f, s, o, tta, pol, u};
        const double def[7][3] = {{1, 0, 0}, {0, 0, 1}, {0, -1, 0}, {1, 0, 0}, {0, 1, 0}, {0, 0, 1}, {0, 0, 1}};
        for (int i = 0; i < 7; ++i) {
            if (isnan(src[i][0])) {
                set3(dst[i], def[i][0], def[i][1], def[i][2]);
            } else {
                for (int j = 0; j < 3; ++j) {
                    CHECK_FINITE(src[i][j], "custom detector/beam vector component");
                }
                set3(dst[i], src[i][0], src[i][1], src[i][2]);
            }
        }
        Fbeam = Xbeam;
        Sbeam = Ybeam;
        Fclose = Xbeam;
        Sclose = Ybeam;
        break;
    }
    default:
        return nbg_error(ctx, NBG_EINVAL, "unknown detector convention %d", (int)e->convention);
    }
    if (e->pivot == NBG_PIVOT_BEAM || e->pivot == NBG_PIVOT_SAMPLE) {
        pivot = e->pivot;
    }
    if (unitize(b) == 0 || unitize(f) == 0 || unitize(s) == 0 || unitize(pol) == 0 || unitize(u) == 0) {
        return nbg_error(ctx, NBG_EINVAL, "a beam, detector, polarization or spindle vector has zero length");
    }
    if (unitize(o) != 1.0) {
        nbg_cross(f, s, o);
        if (unitize(o) == 0) {
            return nbg_error(ctx, NBG_EINVAL, "detector fast and slow axes are parallel");
        }
    }
    double vert[3];
    nbg_cross(b, pol, vert);
    unitize(vert);

    /* --- sampling ----------------------------------------------------------------------------------------- */
    double phi0 = e->phi0 / RTD, osc = e->osc < 0 ? e->osc : e->osc / RTD;
    double phistep = e->phistep < 0 ? e->phistep : e->phistep / RTD;
    int phisteps = e->phisteps;
    resolve_phi(&phisteps, &osc, &phistep);
    double hrange = e->hdivrange < 0 ? e->hdivrange : e->hdivrange / 1000.0;
    double vrange = e->vdivrange < 0 ? e->vdivrange : e->vdivrange / 1000.0;
    double hstep = e->hdivstep < 0 ? e->hdivstep : e->hdivstep / 1000.0;
    double vstep = e->vdivstep < 0 ? e->vdivstep : e->vdivstep / 1000.0;
    int hsteps = e->hdivsteps, vsteps = e->vdivsteps;
    resolve_range(&hsteps, &hrange, &hstep);
    resolve_range(&vsteps, &vrange, &vstep);
    double disp = e->dispersion / 100.0, dispstep = -1;
    int dispsteps = e->dispsteps;
    resolve_range(&dispsteps, &disp, &dispstep);
    double thick = e->thick / 1e6, thickstep = -1, mu = -1;
    int thicksteps = e->thicksteps;
    if (!isnan(e->thick_abs)) {
        if (e->thick_abs == 0 || isinf(e->thick_abs)) {
            mu = 0; /* no attenuation; nanoBragg then also drops the thickness */
            thick = 0;
        } else {
            mu = 1.0 / (e->thick_abs * 1e-6);
        }
    }
    resolve_thickness(&thicksteps, &thick, &thickstep);
    if (thick > 0 && mu < 0) {
        mu = 1.0 / thick;
    }
    double spread = e->mosaic < 0 ? e->mosaic : e->mosaic / RTD;
    int domains = e->mosaic_domains;
    if (domains <= 0) {
        if (spread < 0) {
            domains = 1;
            spread = 0;
        } else {
            domains = spread == 0 ? 1 : 10;
        }
    } else if (spread < 0) {
        spread = 0;
        domains = 1;
    } else if (spread == 0) {
        domains = 1;
    }

    /* --- detector geometry -------------------------------------------------------------------------------- */
    const double rx = e->det_rot[0] / RTD, ry = e->det_rot[1] / RTD, rz = e->det_rot[2] / RTD;
    const double tt = e->twotheta / RTD;
    nbg_det_in_d din;
    memset(&din, 0, sizeof din);
    memcpy(din.b, b, sizeof b);
    memcpy(din.f, f, sizeof f);
    memcpy(din.s, s, sizeof s);
    memcpy(din.o, o, sizeof o);
    memcpy(din.tta, tta, sizeof tta);
    din.pivot_sample = pivot == NBG_PIVOT_SAMPLE;
    din.have_close = !isnan(e->close_distance);
    /* the refinement shift moves the detector in its plane: the beam spot (BEAM pivot) or the near point
     * (SAMPLE pivot) moves along the detector's own axes */
    din.Fbeam = Fbeam + e->beam_shift[0] / 1000.0;
    din.Sbeam = Sbeam + e->beam_shift[1] / 1000.0;
    din.Fclose = Fclose + e->beam_shift[0] / 1000.0;
    din.Sclose = Sclose + e->beam_shift[1] / 1000.0;
    din.distance = e->distance / 1000.0;
    din.close_distance = din.have_close ? e->close_distance / 1000.0 : 0;
    din.rot[0] = rx;
    din.rot[1] = ry;
    din.rot[2] = rz;
    din.twotheta = tt;
    pl->det_in = din;
    nbg_det_out_d dout;
    nbg_detector_d(&din, &dout);
    double pix0[3];
    memcpy(pix0, dout.pix0, sizeof pix0);
    memcpy(f, dout.f, sizeof f);
    memcpy(s, dout.s, sizeof s);
    memcpy(o, dout.o, sizeof o);
    const double close_distance = dout.close_distance, distance = dout.distance;
    Fbeam = dout.Fbeam;
    Sbeam = dout.Sbeam;
    Fclose = dout.Fclose;
    Sclose = dout.Sclose;
    if (!(fabs(close_distance) > 0) || !isfinite(distance)) {
        return nbg_error(ctx, NBG_EINVAL, "impossible detector geometry: the detector plane passes through the "
                         "sample (close distance %g mm)", close_distance * 1000);
    }

    /* --- crystal ------------------------------------------------------------------------------------------ */
    const double lambda0 = e->lambda * 1e-10;
    int interpolate = e->interpolate;
    if (interpolate < 0) {
        interpolate = (e->Na <= 2 || e->Nb <= 2 || e->Nc <= 2);
    }
    if (e->hkl == NULL) {
        interpolate = 0;
    }
    rc = build_crystal(ctx, e, pl, lambda0);
    if (rc != NBG_OK) {
        return rc;
    }
    double N[3] = {e->Na, e->Nb, e->Nc};
    const double samp[3] = {sample_x, sample_y, sample_z};
    double xtal_max = 0;
    for (int i = 0; i < 3; ++i) {
        const double len = nbg_norm(pl->a0 + 3 * i);
        if (samp[i] > 0) {
            N[i] = ceil(samp[i] / len);
        }
        if (N[i] < 1) {
            N[i] = 1;
        }
        xtal_max = fmax(xtal_max, len * N[i]);
    }
    int rec_os = (int)ceil(3.0 * xtal_max / (lambda0 * distance / px));
    if (rec_os < 1) {
        rec_os = 1;
    }
    if (e->oversample <= 0 && rec_os > 64) {
        /* nanoBragg would silently run rec_os^2 subpixels per pixel, which for a large crystal takes hours */
        return nbg_error(ctx, NBG_EINVAL, "automatic oversampling would use %d x %d subpixels per pixel (the crystal "
                         "is %g mm across); give -oversample explicitly", rec_os, rec_os, xtal_max * 1000);
    }
    int os = e->oversample <= 0 ? rec_os : e->oversample;
    r->warn_oversample = os < rec_os;

    /* --- sources ------------------------------------------------------------------------------------------ */
    int nsrc;
    double *pos;
    double *lamrel = NULL; /* d lambda_i / d lambda0 */
    if (e->nsources > 0) {
        nsrc = e->nsources;
        pos = malloc(sizeof(double) * 4 * (size_t)nsrc);
        lamrel = malloc(sizeof(double) * (size_t)nsrc);
        if (pos == NULL || lamrel == NULL) {
            free(pos);
            free(lamrel);
            return nbg_error(ctx, NBG_ENOMEM, "out of memory for %d sources", nsrc);
        }
        for (int i = 0; i < nsrc; ++i) {
            const nbg_source *sr = &e->sources[i];
            for (int j = 0; j < 3; ++j) {
                pos[4 * i + j] = sr->pos[j];
            }
            pos[4 * i + 3] = (sr->lambda > 0) ? sr->lambda * 1e-10 : lambda0;
            lamrel[i] = (sr->lambda > 0) ? 0.0 : 1.0;
            if (!isfinite(pos[4 * i]) || !isfinite(pos[4 * i + 1]) || !isfinite(pos[4 * i + 2]) ||
                !isfinite(pos[4 * i + 3]) || nbg_norm(pos + 4 * i) == 0) {
                free(pos);
                free(lamrel);
                return nbg_error(ctx, NBG_EINVAL, "source %d has an invalid position or wavelength", i + 1);
            }
        }
    } else {
        int ndiv = 0;
        for (int pass = 0; pass < 2; ++pass) {
            pos = NULL;
            if (pass == 1) {
                pos = malloc(sizeof(double) * 4 * (size_t)(ndiv * dispsteps));
                lamrel = malloc(sizeof(double) * (size_t)(ndiv * dispsteps));
                if (pos == NULL || lamrel == NULL) {
                    free(pos);
                    free(lamrel);
                    return nbg_error(ctx, NBG_ENOMEM, "out of memory for %d sources", ndiv * dispsteps);
                }
            }
            int n = 0;
            for (int hi = 0; hi < hsteps; ++hi) {
                for (int vi = 0; vi < vsteps; ++vi) {
                    const double hdiv = hstep * hi - hrange / 2.0;
                    const double vdiv = vstep * vi - vrange / 2.0;
                    /* elliptical cut; a zero range gives NaN, which is never cut */
                    double test = (hdiv * hdiv - hstep * hstep / 4.0 * (1 - hsteps % 2)) / hrange / hrange;
                    test += (vdiv * vdiv - vstep * vstep / 4.0 * (1 - vsteps % 2)) / vrange / vrange;
                    if (e->round_div && test * 4.0 > 1.1) {
                        continue;
                    }
                    if (pass == 0) {
                        ++ndiv;
                        continue;
                    }
                    double v0[3] = {-10.0 * b[0], -10.0 * b[1], -10.0 * b[2]}, v1[3];
                    rotate_axis(v0, pol, vdiv, v1);
                    rotate_axis(v1, vert, hdiv, v0);
                    for (int di = 0; di < dispsteps; ++di) {
                        pos[4 * n + 0] = v0[0];
                        pos[4 * n + 1] = v0[1];
                        pos[4 * n + 2] = v0[2];
                        pos[4 * n + 3] = lambda0 * (1.0 + dispstep * di - disp / 2.0);
                        lamrel[n] = 1.0 + dispstep * di - disp / 2.0;
                        ++n;
                    }
                }
            }
        }
        nsrc = ndiv * dispsteps;
    }
    if (nsrc <= 0) {
        free(pos);
        free(lamrel);
        return nbg_error(ctx, NBG_EINVAL, "no X-ray sources remain after the divergence cut");
    }
    pl->src = malloc(sizeof(double) * NBG_SRC_STRIDE * (size_t)nsrc);
    pl->src_lamrel = lamrel;
    if (pl->src == NULL) {
        free(pos);
        return nbg_error(ctx, NBG_ENOMEM, "out of memory for %d sources", nsrc);
    }
    for (int i = 0; i < nsrc; ++i) {
        double *sr = pl->src + NBG_SRC_STRIDE * i;
        double inc[3] = {-pos[4 * i], -pos[4 * i + 1], -pos[4 * i + 2]};
        unitize(inc);
        double Bv[3], Ev[3];
        nbg_cross(pol, inc, Bv);
        unitize(Bv);
        nbg_cross(inc, Bv, Ev);
        unitize(Ev);
        memcpy(sr, inc, sizeof inc);
        sr[3] = pos[4 * i + 3];
        if (!(sr[3] > 0)) {
            free(pos);
            nbg_plan_free(pl);
            return nbg_error(ctx, NBG_EINVAL, "source %d has a non-positive wavelength (%g A; check -dispersion)",
                             i + 1, sr[3] * 1e10);
        }
        memcpy(sr + 4, Ev, sizeof Ev);
        memcpy(sr + 7, Bv, sizeof Bv);
    }
    free(pos);

    /* --- spindle and mosaic rotations --------------------------------------------------------------------- */
    memcpy(pl->spindle, u, sizeof u);
    pl->phi = malloc(sizeof(double) * (size_t)phisteps);
    pl->umat = malloc(sizeof(double) * 9 * (size_t)domains);
    pl->mos_axis = malloc(sizeof(double) * 3 * (size_t)domains);
    pl->mos_angle = malloc(sizeof(double) * (size_t)domains);
    pl->abc = malloc(sizeof(double) * 9 * (size_t)phisteps * (size_t)domains);
    if (!pl->phi || !pl->umat || !pl->mos_axis || !pl->mos_angle || !pl->abc) {
        nbg_plan_free(pl);
        return nbg_error(ctx, NBG_ENOMEM, "out of memory for %d phi steps x %d mosaic domains", phisteps, domains);
    }
    {
        nbg_rng rng;
        nbg_rng_init(&rng, e->mosaic_seed);
        /* The reference forms each domain's angle in single precision from a float spread; nbgrad keeps the
         * single-precision cap factor (the same domains) but multiplies by the spread in double, so the angle is
         * exactly proportional to the spread, as the mosaic gradient and its finite-difference check need. */
        for (int m = 0; m < domains; ++m) {
            float capf;
            nbg_mosaic_draw(&rng, pl->mos_axis + 3 * m, &capf);
            pl->mos_angle[m] = spread * (double)capf;
            nbg_rodrigues_umat(pl->mos_axis + 3 * m, pl->mos_angle[m], pl->umat + 9 * m);
        }
        /* domain 0 is the unrotated crystal */
        static const double I3[9] = {1, 0, 0, 0, 1, 0, 0, 0, 1};
        memcpy(pl->umat, I3, sizeof I3);
        set3(pl->mos_axis, 0, 0, 1);
        pl->mos_angle[0] = 0;
    }
    for (int ip = 0; ip < phisteps; ++ip) {
        const double phi = phi0 + phistep * ip;
        pl->phi[ip] = phi;
        double ap[9];
        for (int v = 0; v < 3; ++v) {
            if (phi != 0) {
                rotate_axis(pl->a0 + 3 * v, u, phi, ap + 3 * v);
            } else {
                memcpy(ap + 3 * v, pl->a0 + 3 * v, 3 * sizeof(double));
            }
        }
        for (int m = 0; m < domains; ++m) {
            double *dst = pl->abc + 9 * ((size_t)ip * domains + m);
            for (int v = 0; v < 3; ++v) {
                if (spread > 0) {
                    matvec(pl->umat + 9 * m, ap + 3 * v, dst + 3 * v);
                } else {
                    memcpy(dst + 3 * v, ap + 3 * v, 3 * sizeof(double));
                }
            }
        }
    }

    /* --- kernel parameters -------------------------------------------------------------------------------- */
    k->fpixels = fpixels;
    k->spixels = spixels;
    k->oversample = os;
    k->thicksteps = thicksteps;
    k->roi_xmin = e->roi[0] < 0 ? 0 : e->roi[0];
    k->roi_xmax = e->roi[1] < 0 ? fpixels : e->roi[1];
    k->roi_ymin = e->roi[2] < 0 ? 0 : e->roi[2];
    k->roi_ymax = e->roi[3] < 0 ? spixels : e->roi[3];
    k->mask = e->mask;
    memcpy(k->pix0, pix0, sizeof pix0);
    memcpy(k->fdet, f, sizeof f);
    memcpy(k->sdet, s, sizeof s);
    memcpy(k->odet, o, sizeof o);
    memcpy(k->beam, b, sizeof b);
    k->pixel = px;
    k->subpixel = px / os;
    k->close_distance = close_distance;
    k->distance = distance;
    k->curved = e->curved != 0;
    k->point_pixel = e->point_pixel != 0;
    k->os_thick = e->oversample_thick != 0;
    k->os_polar = e->oversample_polar != 0;
    k->os_omega = e->oversample_omega != 0;
    k->thick = thick;
    k->thickstep = thickstep;
    k->mu = mu;
    k->nsources = nsrc;
    k->src = pl->src;
    k->polarization = e->polarization;
    k->nopolar = e->nopolar != 0;
    k->nphi = phisteps;
    k->nmos = domains;
    k->abc = pl->abc;
    k->Na = N[0];
    k->Nb = N[1];
    k->Nc = N[2];
    k->fudge = e->fudge;
    for (int i = 0; i < 3; ++i) {
        k->Ni[i] = (N[i] == floor(N[i]) && N[i] >= 1 && N[i] <= 32) ? (int)N[i] : 0;
    }
    k->shape = (int)e->shape;
    if (e->hkl != NULL) {
        const nbg_hkl *t = e->hkl;
        if (t->F == NULL || t->h_max < t->h_min || t->k_max < t->k_min || t->l_max < t->l_min) {
            nbg_plan_free(pl);
            return nbg_error(ctx, NBG_EINVAL, "the structure-factor table is empty or has negative ranges");
        }
        k->F = t->F;
        k->h_min = t->h_min;
        k->k_min = t->k_min;
        k->l_min = t->l_min;
        k->nh = t->h_max - t->h_min + 1;
        k->nk = t->k_max - t->k_min + 1;
        k->nl = t->l_max - t->l_min + 1;
    }
    k->default_F = e->default_F;
    k->interpolate = interpolate;
    k->dmin = e->dmin * 1e-10;
    const double w = e->water / 1e6;
    k->water = w != 0;
    k->I_bg = 2.57 * 2.57 * NBG_RE2 * fluence * w * w * w * 1e6 * NBG_AVOGADRO / 18.0;
    const int steps = nsrc * domains * phisteps * os * os;
    k->scale = NBG_RE2 * fluence / steps;

    pl->lambda0 = lambda0;
    pl->mosaic_spread = spread;

    /* --- report ------------------------------------------------------------------------------------------- */
    r->fpixels = fpixels;
    r->spixels = spixels;
    r->pixel = e->pixel;
    r->detsize_f = detsize_f * 1000;
    r->detsize_s = detsize_s * 1000;
    r->distance = distance * 1000;
    r->close_distance = close_distance * 1000;
    r->Xbeam = Xbeam * 1000;
    r->Ybeam = Ybeam * 1000;
    r->Fbeam = Fbeam * 1000;
    r->Sbeam = Sbeam * 1000;
    r->Fclose = Fclose * 1000;
    r->Sclose = Sclose * 1000;
    r->ORGX = Fclose / px + 0.5;
    r->ORGY = Sclose / px + 0.5;
    r->dials_origin[0] = 1000.0 * pix0[2];
    r->dials_origin[1] = 1000.0 * pix0[1];
    r->dials_origin[2] = -1000.0 * pix0[0];
    memcpy(r->pix0, pix0, sizeof pix0);
    memcpy(r->fdet, f, sizeof f);
    memcpy(r->sdet, s, sizeof s);
    memcpy(r->odet, o, sizeof o);
    memcpy(r->beam, b, sizeof b);
    memcpy(r->polar_axis, pol, sizeof pol);
    memcpy(r->spindle, u, sizeof u);
    r->lambda = e->lambda;
    r->phi0 = phi0 * RTD;
    r->osc = osc * RTD;
    r->twotheta = e->twotheta;
    r->pivot = pivot;
    r->oversample = os;
    r->recommended_oversample = rec_os;
    r->thicksteps = thicksteps;
    r->nsources = nsrc;
    r->phisteps = phisteps;
    r->mosaic_domains = domains;
    r->steps = steps;
    r->Na = N[0];
    r->Nb = N[1];
    r->Nc = N[2];
    r->interpolate = interpolate;
    r->fluence = fluence;
    r->flux = flux;
    r->xtal_size_max = xtal_max * 1000;
    r->I_bg = k->I_bg;
    return NBG_OK;
}

void nbg_plan_free(nbg_plan *pl)
{
    if (pl == NULL) {
        return;
    }
    free(pl->src);
    free(pl->abc);
    free(pl->umat);
    free(pl->mos_axis);
    free(pl->mos_angle);
    free(pl->phi);
    free(pl->src_lamrel);
    pl->src_lamrel = NULL;
    pl->src = pl->abc = pl->umat = pl->mos_axis = pl->mos_angle = pl->phi = NULL;
}
