/*
 * plan.c -- turns an nbg_experiment (user units) into the experiment's model in the laboratory frame and that into
 * kernel parameters (SI units), following the reference program's set-up order
 * (../shared/reference/nanobragg-behaviour.md §2).
 *
 * The file's map.  nbgi_plan_build (at the end) runs two halves.  The first, plan_lab, reads nanoBragg's flags into
 * the model (pl->lab, plan.h: the beam with its sources, the detector with its panels, the goniometer with its scan,
 * the crystal with its domains, in the laboratory frame) and the rendering options (nbgi_render); each of its steps
 * is a static function that reads the experiment and what earlier steps left in a plan_build (SI units), and fills
 * its own part of the model or of the scratch:
 *
 *   validate           every input quantity within its domain (one table)
 *   detector_size      pixel size, detector size and pixel counts; the image within the memory limit
 *   beam_and_sample    fluence (from flux, exposure and beam size), polarization, the crystal size clipped to the
 *                      beam
 *   detector_frame     the convention's beam, detector, polarization and spindle vectors, beam centre, near
 *                      point and pivot
 *   beam_turn          the beam tilts: the beam and polarization the sources see
 *   sampling           phi, divergence, dispersion, sensor layers and mosaic domains: ranges, steps, counts
 *   detector_geometry  rotations, two-theta and pivot: pix0, the rotated axes and the distances
 *   crystal            real and reciprocal vectors from the cell or matrix and the misset; structure factors
 *   crystal_size       the crystal size in cells and the oversampling
 *   source_count       the number of sources; their arrays within the memory limit
 *   check_work         pixels x samples per pixel within the work limit
 *   sources            each source's position and wavelength (the divergence grid x the spectrum)
 *   miller_range       Miller indices within what the kernels round to int
 *   orientations       the spindle's tilts, the scan's angles, the mosaic domains
 *   detector_panels    the panels placed about the detector, each with its sensor
 *
 * The second, nbgi_plan_kernels, builds what the kernels read from the model and the rendering options alone (it is
 * not given the experiment): each source's incident and polarization vectors, the crystal vectors of every phi step
 * and domain, the kernel parameters (geometry, sampling, structure factors, normalisation) and the pixel list's runs.
 * Last, report states what the set-up derived, in user units.
 *
 * The first step that fails ends the build with its message; nbgi_plan_build then frees what was allocated.
 *
 * Where nanoBragg has a bug nbgrad does not copy it: the phi step at phi = 0 uses the unrotated crystal (the
 * reference reuses a stale orientation), and an interpolation window leaving the table falls back to the nearest
 * entry for that sample only (the reference switches interpolation off for the rest of the run, in an order that
 * depends on thread scheduling).
 */
#include "panels.h"
#include "param.h"
#include "plan.h"
#include "rng.h"
#include "setup.h"

#include <float.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define RTD (180.0 / M_PI)
/* The most pixels along one detector side, and the most steps of one sampled quantity (phi, divergence,
 * wavelength, sensor layers, mosaic domains); their product is bounded by the work limit (nbg_limits). */
#define NBG_MAX_STEPS 100000000
/* The largest Miller index the kernels may meet (they round indices to int). */
#define NBG_MAX_MILLER 1e9

void nbgi_cross(const double a[3], const double b[3], double out[3]) { cross_d(a, b, out); }

double nbgi_dot(const double a[3], const double b[3]) { return dot_d(a, b); }

double nbgi_norm(const double a[3]) { return sqrt(dot_d(a, a)); }

int nbgi_inverse3(const double m[9], double out[9])
{
    const double det = m[0] * (m[4] * m[8] - m[5] * m[7]) - m[1] * (m[3] * m[8] - m[5] * m[6]) +
                       m[2] * (m[3] * m[7] - m[4] * m[6]);
    if (!(fabs(det) > 0) || !isfinite(1.0 / det)) {
        return 0;
    }
    double t[9];
    t[0] = (m[4] * m[8] - m[5] * m[7]) / det, t[1] = (m[2] * m[7] - m[1] * m[8]) / det;
    t[2] = (m[1] * m[5] - m[2] * m[4]) / det, t[3] = (m[5] * m[6] - m[3] * m[8]) / det;
    t[4] = (m[0] * m[8] - m[2] * m[6]) / det, t[5] = (m[2] * m[3] - m[0] * m[5]) / det;
    t[6] = (m[3] * m[7] - m[4] * m[6]) / det, t[7] = (m[1] * m[6] - m[0] * m[7]) / det;
    t[8] = (m[0] * m[4] - m[1] * m[3]) / det;
    for (int i = 0; i < 9; ++i) {
        if (!isfinite(t[i])) {
            return 0;
        }
    }
    memcpy(out, t, sizeof t);
    return 1;
}

/* Scales v to unit length in place and returns its former length (0 leaves it unchanged). */
static double unitize(double v[3])
{
    const double m = nbgi_norm(v);
    if (m != 0) {
        v[0] /= m;
        v[1] /= m;
        v[2] /= m;
    }
    return m;
}

/* R_xyz = Rz * Ry * Rx applied to a column vector (x first), each right-handed; a zero angle is skipped. */
void nbgi_rotate_xyz(const double v[3], double rx, double ry, double rz, double out[3])
{
    rotate_xyz_d(v, rx, ry, rz, out);
}

/* Rodrigues rotation about an axis that is used as given (nanoBragg does not normalise it). */
static void rotate_axis(const double v[3], const double ax[3], double phi, double out[3])
{
    rotate_axis_d(v, ax, phi, out);
}

void nbgi_rotate_axis(const double v[3], const double ax[3], double phi, double out[3])
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

/* nanoBragg's auto-selection of a sampled range (divergence, dispersion): count, range and step given or not.
 * The counts are doubles here, so that a range over a tiny step cannot overflow an int before it is checked. */
static void resolve_range(double *steps, double *range, double *step)
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
            *steps = ceil(*range / *step);
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
static void resolve_thickness(double *steps, double *thick, double *step)
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
            *steps = ceil(*thick / *step);
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

static void resolve_phi(double *steps, double *osc, double *step)
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
            *steps = ceil(*osc / *step);
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

/* nanoBragg's choice of the mosaic domains: the spread (rad, negative when unset) and the count (0 or less when
 * automatic) as given -> both resolved (no spread: one domain; a spread without a count: 10 domains). */
static void resolve_mosaic(double *spread, int *domains)
{
    if (*domains <= 0) {
        if (*spread < 0) {
            *domains = 1;
            *spread = 0;
        } else {
            *domains = *spread == 0 ? 1 : 10;
        }
    } else if (*spread < 0) {
        *spread = 0;
        *domains = 1;
    } else if (*spread == 0) {
        *domains = 1;
    }
}

#define CHECK_FINITE(x, name)                                                                                     \
    do {                                                                                                          \
        if (!isfinite(x)) {                                                                                       \
            return nbgi_error(ctx, NBG_EINVAL, "%s is not a finite number (%g)", name, (double)(x));             \
        }                                                                                                         \
    } while (0)

/* The domain of one input quantity: a finite value in [lo, hi] (an open end where lo_open / hi_open), or, for an
 * optional field, NAN (unset).  name is what the message calls it, with its flag. */
typedef struct {
    double v;
    const char *name;
    double lo, hi;
    int lo_open, hi_open;
    int optional;
    const char *unit;
} nbgi_domain;

/* Whether d's value is in its domain. */
static int in_domain(const nbgi_domain *d)
{
    if (d->optional && isnan(d->v)) {
        return 1;
    }
    const int below = d->lo_open ? !(d->v > d->lo) : !(d->v >= d->lo);
    const int above = d->hi_open ? !(d->v < d->hi) : !(d->v <= d->hi);
    return isfinite(d->v) && !below && !above;
}

static int check_domain(nbg_ctx *ctx, const nbgi_domain *d)
{
    if (in_domain(d)) {
        return NBG_OK;
    }
    if (!isfinite(d->v)) {
        return nbgi_error(ctx, NBG_EINVAL, "%s is not a finite number (%g)", d->name, d->v);
    }
    {
        char lo[32], hi[32];
        snprintf(lo, sizeof lo, "%g", d->lo);
        snprintf(hi, sizeof hi, "%g", d->hi);
        return nbgi_error(ctx, NBG_EINVAL, "%s must be in %s%s, %s%s%s%s (got %g%s%s)%s", d->name, d->lo_open ? "(" : "[",
                         isinf(d->lo) ? "-inf" : lo, isinf(d->hi) ? "inf" : hi, d->hi_open ? ")" : "]",
                         d->unit[0] ? " " : "", d->unit, d->v, d->unit[0] ? " " : "", d->unit,
                         d->optional ? " or unset" : "");
    }
    return NBG_OK;
}

/* A sampling count: -1 (automatic) or at least 1. */
static int check_count(nbg_ctx *ctx, int n, const char *name)
{
    if (n == -1 || n >= 1) {
        return NBG_OK;
    }
    return nbgi_error(ctx, NBG_EINVAL, "%s must be a positive count (got %d; leave it unset for the automatic choice)",
                     name, n);
}

/* The cell as given must describe a cell: a positive length a, positive lengths b and c or unset (NAN: a's
 * value), angles in (0, 180) deg or unset (NAN: 90), and a positive volume, i.e. a positive-definite metric: each
 * angle below the sum of the other two and the three below 360 deg.  nanoBragg renders an impossible cell as some
 * other, flat or folded one. */
static int check_cell(nbg_ctx *ctx, const double cell[6])
{
    static const char *len[3] = {"a", "b", "c"}, *ang[3] = {"alpha", "beta", "gamma"};
    double c[3];
    if (!(cell[0] > 0) || isinf(cell[0])) {
        return nbgi_error(ctx, NBG_EINVAL, "unit cell length a must be a positive number (got %g A)", cell[0]);
    }
    for (int i = 1; i < 3; ++i) {
        if (!isnan(cell[i]) && (!(cell[i] > 0) || isinf(cell[i]))) {
            return nbgi_error(ctx, NBG_EINVAL, "unit cell length %s must be a positive number (got %g A)", len[i],
                             cell[i]);
        }
    }
    for (int i = 0; i < 3; ++i) {
        const double g = cell[3 + i];
        if (!isnan(g) && !(g > 0 && g < 180)) {
            return nbgi_error(ctx, NBG_EINVAL, "unit cell angle %s must be in (0, 180) deg (got %g)", ang[i], g);
        }
        c[i] = cos((isnan(g) ? 90.0 : g) / RTD);
    }
    const double v2 = 1 - c[0] * c[0] - c[1] * c[1] - c[2] * c[2] + 2 * c[0] * c[1] * c[2];
    if (!(v2 > 1e-9)) {
        return nbgi_error(ctx, NBG_EINVAL, "the cell angles %g %g %g deg describe no cell (zero or negative volume): "
                         "each angle must be less than the sum of the other two, and all three less than 360 deg in sum",
                         cell[3], cell[4], cell[5]);
    }
    return NBG_OK;
}

/* R (row-major) a rotation: orthonormal to 1e-9, determinant +1. */
static int check_rotation(nbg_ctx *ctx, const double R[9], const char *what)
{
    double worst = 0;
    for (int i = 0; i < 3; ++i) {
        for (int j = 0; j < 3; ++j) {
            const double d = R[i] * R[j] + R[3 + i] * R[3 + j] + R[6 + i] * R[6 + j];
            worst = fmax(worst, fabs(d - (i == j)));
        }
    }
    const double det = R[0] * (R[4] * R[8] - R[5] * R[7]) - R[1] * (R[3] * R[8] - R[5] * R[6]) +
                       R[2] * (R[3] * R[7] - R[4] * R[6]);
    if (!(worst <= 1e-9) || !(det > 0)) {
        return nbgi_error(ctx, NBG_EINVAL, "%s is not a rotation (orthonormality off by %g, determinant %g)", what,
                         worst, det);
    }
    return NBG_OK;
}

/* Every input quantity's domain, in one place: the library calls and every subcommand go through here. */
static int validate(nbg_ctx *ctx, const nbg_experiment *e)
{
    const double inf = INFINITY;
    const nbgi_domain dom[] = {
        /* value, name, lo, hi, lo_open, hi_open, optional (NAN = unset), unit */
        {e->pixel, "pixel size (-pixel)", 0, inf, 1, 1, 0, "mm"},
        {e->detsize_f, "detector size, fast (-detsize_f)", 0, inf, 1, 1, 0, "mm"},
        {e->detsize_s, "detector size, slow (-detsize_s)", 0, inf, 1, 1, 0, "mm"},
        {e->flux, "flux (-flux)", 0, inf, 0, 1, 0, "photons/s"},
        {e->exposure, "exposure (-exposure)", 0, inf, 0, 1, 0, "s"},
        {e->beamsize, "beam size (-beamsize)", 0, inf, 0, 1, 0, "mm"},
        {e->sample_x, "crystal size x (-samplesize, -sample_x)", 0, inf, 0, 1, 0, "mm"},
        {e->sample_y, "crystal size y (-samplesize, -sample_y)", 0, inf, 0, 1, 0, "mm"},
        {e->sample_z, "crystal size z (-samplesize, -sample_z)", 0, inf, 0, 1, 0, "mm"},
        {e->fudge, "shape fudge factor (-fudge)", 0, inf, 1, 1, 0, ""},
        {e->phi0, "spindle start (-phi)", -inf, inf, 1, 1, 0, "deg"},
        {e->osc, "oscillation range (-osc)", 0, inf, 0, 1, 1, "deg"},
        {e->phistep, "phi step (-phistep)", 0, inf, 0, 1, 1, "deg"},
        {e->default_F, "default structure factor (-default_F)", -inf, inf, 1, 1, 0, ""},
        {e->dmin, "resolution limit (-dmin)", 0, inf, 0, 1, 0, "A"},
        {e->water, "water thickness (-water)", 0, inf, 0, 1, 0, "um"},
        {e->thick, "sensor thickness (-detector_thick)", 0, inf, 0, 1, 0, "um"},
        {e->dispersion, "spectral dispersion (-dispersion)", 0, 200, 0, 1, 0, "percent"},
        {e->hdivrange, "horizontal divergence (-hdivrange, -divergence)", 0, inf, 0, 1, 1, "mrad"},
        {e->vdivrange, "vertical divergence (-vdivrange, -divergence)", 0, inf, 0, 1, 1, "mrad"},
        {e->hdivstep, "horizontal divergence step (-hdivstep)", 0, inf, 0, 1, 1, "mrad"},
        {e->vdivstep, "vertical divergence step (-vdivstep)", 0, inf, 0, 1, 1, "mrad"},
        {e->response.pedestal, "detector pedestal (-pedestal)", -inf, inf, 1, 1, 0, "counts"},
        {e->response.gain, "detector gain (-gain)", 0, inf, 1, 1, 0, "counts per photon"},
        {e->response.read_noise, "read noise (-read_noise)", 0, inf, 0, 1, 0, "counts"},
    };
    for (size_t i = 0; i < sizeof dom / sizeof dom[0]; ++i) {
        const int rc = check_domain(ctx, &dom[i]);
        if (rc != NBG_OK) {
            return rc;
        }
    }
    /* the parameters' domains, from the table (the cell's when there is one: check_cell then its volume) */
    for (int p = 0; p < NBG_NPARAMS; ++p) {
        const nbgi_param_row *r = &nbgi_param_rows[p];
        if (r->setup == NBGI_S_CELL && !e->has_cell) {
            continue;
        }
        nbgi_domain d = {*(const double *)((const char *)e + r->field), NULL, r->lo, r->hi, r->lo_open, r->hi_open,
                         r->optional, r->unit};
        if (!in_domain(&d)) { /* the message's name only when there is a message (validate runs every render) */
            char name[128];
            snprintf(name, sizeof name, "%s (%s)", r->desc, r->flag[0] != '\0' ? r->flag : r->name);
            d.name = name;
            return check_domain(ctx, &d);
        }
    }
    if (!isnan(e->close_distance)) {
        const nbgi_domain cd = {e->close_distance, "close distance (-close_distance)", 0, inf, 1, 1, 0, "mm"};
        const int rc = check_domain(ctx, &cd);
        if (rc != NBG_OK) {
            return rc;
        }
    }
    /* optional positions: unset (NAN) or finite; the attenuation length: unset, 0 or inf (none), or positive */
    const double opt[] = {e->Xbeam, e->Ybeam, e->Xclose, e->Yclose, e->ORGX, e->ORGY};
    const char *optname[] = {"Xbeam (-Xbeam)", "Ybeam (-Ybeam)", "Xclose (-Xclose)", "Yclose (-Yclose)",
                             "ORGX (-ORGX)", "ORGY (-ORGY)"};
    for (int i = 0; i < 6; ++i) {
        if (isinf(opt[i])) {
            return nbgi_error(ctx, NBG_EINVAL, "%s is not a finite number (%g)", optname[i], opt[i]);
        }
    }
    if (e->thick_abs < 0) {
        return nbgi_error(ctx, NBG_EINVAL, "attenuation length (-detector_abs) must not be negative (got %g um)",
                         e->thick_abs);
    }
    if (e->sensor_model != NBG_SENSOR_AUTO && e->sensor_model != NBG_SENSOR_NANOBRAGG &&
        e->sensor_model != NBG_SENSOR_PHYSICAL) {
        return nbgi_error(ctx, NBG_EINVAL, "sensor model %d is not one (nbg_sensor_model)", e->sensor_model);
    }
    if (e->sensor_model == NBG_SENSOR_PHYSICAL && e->oversample_thick) {
        return nbgi_error(ctx, NBG_EINVAL, "-oversample_thick is nanoBragg's sensor (its running sum times each "
                          "layer's capture); the physical sensor model (-sensor physical) takes none");
    }
    /* pixel counts: given (>= 1) or unset (-1: derived from the detector size) */
    if (!(e->fpixels == -1 || e->fpixels >= 1) || !(e->spixels == -1 || e->spixels >= 1)) {
        return nbgi_error(ctx, NBG_EINVAL, "pixel counts (-detpixels_f x -detpixels_s) must be at least 1, or -1 to "
                         "derive them from the detector size (got %d x %d)", e->fpixels, e->spixels);
    }
    const struct {
        int n;
        const char *name;
    } counts[] = {{e->oversample, "oversampling (-oversample)"},   {e->thicksteps, "sensor layers (-thicksteps)"},
                  {e->dispsteps, "wavelength steps (-dispsteps)"},  {e->hdivsteps, "divergence steps (-hdivsteps)"},
                  {e->vdivsteps, "divergence steps (-vdivsteps)"},  {e->phisteps, "phi steps (-phisteps)"},
                  {e->mosaic_domains, "mosaic domains (-mosaic_dom)"}};
    for (size_t i = 0; i < sizeof counts / sizeof counts[0]; ++i) {
        const int rc = check_count(ctx, counts[i].n, counts[i].name);
        if (rc != NBG_OK) {
            return rc;
        }
    }
    if ((unsigned)e->convention > NBG_CONV_CUSTOM || (unsigned)e->pivot > NBG_PIVOT_SAMPLE ||
        (unsigned)e->shape > NBG_SHAPE_TOPHAT || e->interpolate < -1 || e->interpolate > 1) {
        return nbgi_error(ctx, NBG_EINVAL, "unknown convention (%d), pivot (%d), crystal shape (%d) or interpolation "
                         "mode (%d)", (int)e->convention, (int)e->pivot, (int)e->shape, e->interpolate);
    }
    for (int i = 0; i < 4; ++i) {
        if (e->roi[i] < -1) {
            return nbgi_error(ctx, NBG_EINVAL, "region of interest (-roi) bounds must be pixel indices (got %d)",
                             e->roi[i]);
        }
    }
    for (int i = 0; i < 4; i += 2) {
        if (e->roi[i] >= 0 && e->roi[i + 1] >= 0 && e->roi[i] > e->roi[i + 1]) {
            return nbgi_error(ctx, NBG_EINVAL, "region of interest (-roi) is empty: %s from %d to %d",
                             i == 0 ? "x" : "y", e->roi[i], e->roi[i + 1]);
        }
    }
    if (e->npanels < 0 || (e->npanels > 0 && e->panels == NULL) ||
        (unsigned)e->panel_frame > NBG_PANELS_LAB) {
        return nbgi_error(ctx, NBG_EINVAL, "the panel list is inconsistent (%d panels, frame %d)", e->npanels,
                         (int)e->panel_frame);
    }
    if (e->npanels > 0 && (e->roi[0] >= 0 || e->roi[1] >= 0 || e->roi[2] >= 0 || e->roi[3] >= 0)) {
        return nbgi_error(ctx, NBG_EINVAL, "a region of interest (-roi) is for a single flat detector, not %d "
                         "panels: mask the pixels instead", e->npanels);
    }
    if (e->nmotions < 0 || (e->nmotions > 0 && (e->motions == NULL || e->npanels == 0))) {
        return nbgi_error(ctx, NBG_EINVAL, "panel motions (%d) need panels and a motion list", e->nmotions);
    }
    if (e->npanels > 0 && e->curved) {
        return nbgi_error(ctx, NBG_EINVAL, "a curved detector (-curved_det) cannot have panels");
    }
    if (!e->has_cell && !e->has_mat) {
        return nbgi_error(ctx, NBG_EINVAL, "no crystal: give a unit cell or an orientation matrix");
    }
    if (e->has_cell) {
        const int rc = check_cell(ctx, e->cell);
        if (rc != NBG_OK) {
            return rc;
        }
    }
    if (e->has_mat) {
        for (int i = 0; i < 9; ++i) {
            CHECK_FINITE(e->mat[i], "orientation matrix element (-mat)");
        }
    }
    if (!isnan(e->mosaic_frame[0])) {
        const int rc = check_rotation(ctx, e->mosaic_frame, "the mosaic domains' frame (mosaic_frame)");
        if (rc != NBG_OK) {
            return rc;
        }
    }
    if (e->has_umat && e->has_cell && !e->has_mat) {
        const int rc = check_rotation(ctx, e->umat, "the crystal's orientation matrix U (umat)");
        if (rc != NBG_OK) {
            return rc;
        }
    }
    if (e->hkl == NULL && e->default_F == 0) {
        return nbgi_error(ctx, NBG_EINVAL,
                         "no structure factors: give an HKL table or a non-zero default_F (the image would be blank)");
    }
    if (e->nsources < 0 || (e->nsources > 0 && e->sources == NULL)) {
        return nbgi_error(ctx, NBG_EINVAL, "source list is inconsistent (%d sources)", e->nsources);
    }
    return NBG_OK;
}

void nbg_experiment_default(nbg_experiment *e)
{
    memset(e, 0, sizeof *e);
    e->convention = NBG_CONV_MOSFLM;
    e->pivot = NBG_PIVOT_AUTO;
    e->pixel = 0.1;
    e->fpixels = e->spixels = -1; /* derived from the detector size */
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
    e->hdivrange = e->vdivrange = e->hdivstep = e->vdivstep = NAN;
    e->hdivsteps = e->vdivsteps = -1;
    e->round_div = 1;
    e->fluence = NBG_DEFAULT_FLUENCE;
    e->exposure = 1;
    e->beamsize = 0.1;
    for (int i = 0; i < 6; ++i) {
        e->cell[i] = NAN; /* has_cell = 0; a cell given with fewer values keeps the others unset */
    }
    e->Na = e->Nb = e->Nc = 1;
    e->shape = NBG_SHAPE_SQUARE;
    e->fudge = 1;
    e->osc = e->phistep = NAN;
    e->phisteps = -1;
    e->mosaic = NAN;
    e->mosaic_domains = -1;
    e->mosaic_seed = 12345678;
    e->mosaic_frame[0] = NAN; /* the identity */
    e->interpolate = -1;
    e->scale = 1;
    e->spectrum_scale = 1;
    e->response.gain = 1;
}

/* The crystal inputs of the smooth set-up map (angles in radians, defaults applied). */
void nbgi_plan_xtal_in(const nbg_experiment *e, const double misset_rad[3], double lambda0, nbgi_xtal_in_d *in)
{
    memset(in, 0, sizeof *in);
    in->has_cell = e->has_cell;
    in->has_mat = e->has_mat;
    if (e->has_cell) {
        for (int i = 0; i < 6; ++i) {
            in->cell[i] = e->cell[i];
        }
        /* unset (NAN) lengths b, c take a's value, unset angles 90 deg */
        if (isnan(in->cell[1])) {
            in->cell[1] = in->cell[0];
        }
        if (isnan(in->cell[2])) {
            in->cell[2] = in->cell[0];
        }
        for (int i = 3; i < 6; ++i) {
            in->cell[i] = isnan(in->cell[i]) ? M_PI / 2 : in->cell[i] / RTD;
        }
    }
    memcpy(in->mat, e->mat, sizeof in->mat);
    in->has_umat = e->has_umat;
    memcpy(in->umat, e->umat, sizeof in->umat);
    in->lambda0 = lambda0;
    for (int i = 0; i < 3; ++i) {
        in->misset[i] = misset_rad[i];
        in->orient[i] = e->orient[i] / RTD;
    }
}

/* nanoBragg's elliptical cut of the divergence grid: 1 when grid point (hi, vi) is left out.  A zero range gives
 * NaN, which is never cut. */
static int divergence_cut(int round_div, int hi, int vi, int hsteps, int vsteps, double hrange, double vrange,
                          double hstep, double vstep)
{
    const double hdiv = hstep * hi - hrange / 2.0;
    const double vdiv = vstep * vi - vrange / 2.0;
    double test = (hdiv * hdiv - hstep * hstep / 4.0 * (1 - hsteps % 2)) / hrange / hrange;
    test += (vdiv * vdiv - vstep * vstep / 4.0 * (1 - vsteps % 2)) / vrange / vrange;
    return round_div && test * 4.0 > 1.1;
}

/* ---- the steps of nbgi_plan_build -------------------------------------------------------------------------------- */

/* What the steps hand on to each other, in SI units (m, rad) unless named otherwise.  Each part is written by the
 * step named beside it and only read after; the model they fill is pl->lab (plan.h). */
typedef struct {
    double size_f, size_s;  /* detector size (m) */
} pb_detector;

typedef struct {
    double sample[3];       /* crystal size x, y, z (m; 0: from N), clipped to the beam */
} pb_beam;

typedef struct {
    double b[3], f[3], s[3], o[3]; /* beam and detector unit vectors of the convention, before the rotations */
    double tta[3];                 /* two-theta axis (as given) */
    double pol[3], u[3];           /* polarization and spindle unit vectors */
    double vert[3];                /* b x pol, normalised: the axis of the horizontal divergence */
    double svert[3];               /* vert turned by the beam tilts (beam_tilt) */
    double Xbeam, Ybeam;           /* the header's beam centre */
    double Fbeam, Sbeam;           /* the beam spot along the fast and slow axes (BEAM pivot) */
    double Fclose, Sclose;         /* the near point (SAMPLE pivot) */
    int pivot;                     /* NBG_PIVOT_BEAM or NBG_PIVOT_SAMPLE */
} pb_frame;

typedef struct {
    double phi0, osc, phistep;           /* spindle */
    double hrange, vrange, hstep, vstep; /* divergence */
    double disp, dispstep;               /* relative spectral width and step */
    double thick, thickstep, mu;         /* sensor (m, m, 1/m) */
    double own_step;                     /* panels' own sensors without the experiment's: step / thickness */
    double spread;                       /* mosaic spread */
    int phisteps, hsteps, vsteps, dispsteps, thicksteps, domains;
} pb_sampling;

typedef struct {
    double xtal_max;        /* the crystal's largest extent */
    int rec_os;             /* the recommended oversampling */
} pb_crystal;

/* The flags' reading: what its steps hand on to each other beside the model (pl->lab) and the rendering options. */
typedef struct {
    pb_detector det;        /* detector_size */
    pb_beam beam;           /* beam_and_sample */
    pb_frame frame;         /* detector_frame */
    pb_sampling samp;       /* sampling */
    pb_crystal xtal;        /* crystal_size */
    int beam_turned;        /* beam_turn: the beam tilts are not zero */
    double beam_w[6], beam_t[2]; /* beam_turn: the tilts' axes w1, w2 and angles (rad) */
} plan_build;

/* A sampling count resolved from ranges and steps: at least 1 and small enough for an int (the product of all
 * counts is checked against the work limit later).  A range over a tiny step gives a huge count here rather than
 * an integer overflow. */
static int step_count(nbg_ctx *ctx, double n, const char *what, int *out)
{
    if (!(n >= 1)) {
        return nbgi_error(ctx, NBG_EINVAL, "%s: the range and step give no step (%g)", what, n);
    }
    if (!(n <= NBG_MAX_STEPS)) {
        return nbgi_error(ctx, NBG_EINVAL, "%s: the range and step give %.3g steps, beyond the limit of %g", what, n,
                         (double)NBG_MAX_STEPS);
    }
    *out = (int)n;
    return NBG_OK;
}

/* Part of crystal: e's cell or matrix and misset (drawn when random) with lambda0 -> the model's misset, a0 (m),
 * astar and the report's cell, vectors and random misset; a cell with a volume and three axes. */
static int build_crystal(nbg_ctx *ctx, const nbg_experiment *e, nbgi_plan *pl, double lambda0)
{
    nbg_report *r = &pl->rep;
    double mis[3] = {e->misset[0] / RTD, e->misset[1] / RTD, e->misset[2] / RTD};
    if (e->misset_random) {
        nbgi_rng rng;
        double U[9], axis[3], angle;
        nbgi_rng_init(&rng, e->misset_seed);
        nbgi_mosaic_umat(90.0, &rng, U, axis, &angle); /* 90 "radians", as nanoBragg: uniform orientations */
        nbgi_umat2misset(U, mis);
        for (int i = 0; i < 3; ++i) {
            r->misset_random_deg[i] = mis[i] * RTD;
        }
    }
    nbgi_lab_crystal *x = &pl->lab.xtal;
    memcpy(x->misset, mis, sizeof mis);
    nbgi_xtal_in_d in;
    nbgi_plan_xtal_in(e, mis, lambda0, &in);
    double abc[9];
    const double Vstar = nbgi_crystal_d(&in, abc, x->astar);
    const double *a = abc, *b = abc + 3, *c = abc + 6;
    const double la = nbgi_norm(a), lb = nbgi_norm(b), lc = nbgi_norm(c);
    if (!isfinite(Vstar) || Vstar == 0 || !(la > 0 && lb > 0 && lc > 0) || !isfinite(la * lb * lc) ||
        !(1.0 / fabs(Vstar) > 1e-6)) {
        return nbgi_error(ctx, NBG_EINVAL, "the unit cell has zero volume or a zero-length axis (check -cell or -mat)");
    }
    r->cell[0] = la;
    r->cell[1] = lb;
    r->cell[2] = lc;
    r->cell[3] = acos(fmax(-1, fmin(1, nbgi_dot(b, c) / lb / lc))) * RTD;
    r->cell[4] = acos(fmax(-1, fmin(1, nbgi_dot(a, c) / la / lc))) * RTD;
    r->cell[5] = acos(fmax(-1, fmin(1, nbgi_dot(a, b) / la / lb))) * RTD;
    for (int i = 0; i < 9; ++i) {
        r->real_vectors[i] = abc[i];
        r->recip_vectors[i] = x->astar[i];
        x->a0[i] = abc[i] * 1e-10;
    }
    return NBG_OK;
}

/* detector_size: e's pixel size, detector size and pixel counts -> pb->det, the model's pixel and pixel counts; each
 * side 1 to NBG_MAX_SIDE pixels, the image within the memory limit. */
static int detector_size(nbg_ctx *ctx, const nbg_experiment *e, plan_build *pb, nbgi_lab *m)
{
    const double px = e->pixel / 1000.0;
    double detsize_f = e->detsize_f / 1000.0, detsize_s = e->detsize_s / 1000.0;
    if (e->fpixels != -1) { /* given (validate: >= 1); -1: derived from the detector size */
        detsize_f = px * e->fpixels;
    }
    if (e->spixels != -1) {
        detsize_s = px * e->spixels;
    }
    const double nf = ceil(detsize_f / px - 0.5), ns = ceil(detsize_s / px - 0.5);
    if (!(nf >= 1 && ns >= 1 && nf <= NBG_MAX_SIDE && ns <= NBG_MAX_SIDE)) {
        return nbgi_error(ctx, NBG_EINVAL, "a detector of %g x %g pixels is impossible (size %g x %g mm, pixel %g mm; "
                         "each side must have 1 to %g pixels)", nf, ns, detsize_f * 1000, detsize_s * 1000, e->pixel,
                         (double)NBG_MAX_SIDE);
    }
    char what[96];
    snprintf(what, sizeof what, "an image of %g x %g pixels", nf, ns);
    const int rc = nbgi_check_bytes(ctx, nf * ns * sizeof(float), what);
    if (rc != NBG_OK) {
        return rc;
    }
    m->det.pixel = px;
    pb->det.size_f = detsize_f;
    pb->det.size_s = detsize_s;
    m->det.fpixels = (int)nf;
    m->det.spixels = (int)ns;
    return NBG_OK;
}

/* beam_and_sample: e's fluence, flux, exposure, beam size and crystal size -> the model's fluence and flux (the
 * fluence from the flux where one is given), pb->beam (the crystal clipped to the beam: r->warn_clipped_sample); the
 * fluence finite, not negative. */
static int beam_and_sample(nbg_ctx *ctx, const nbg_experiment *e, plan_build *pb, nbgi_lab *m, nbg_report *r)
{
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
        return nbgi_error(ctx, NBG_EINVAL, "fluence is not a finite non-negative number (%g; check -flux, "
                         "-exposure, -beamsize)", fluence);
    }
    m->beam.fluence = fluence;
    m->beam.flux = flux;
    m->beam.polarization = e->polarization;
    m->beam.nopolar = e->nopolar != 0;
    set3(pb->beam.sample, sample_x, sample_y, sample_z);
    return NBG_OK;
}

/* The convention's table (part of detector_frame): e's convention and custom vectors, with pb->det, the near point
 * already in pb->frame and Xclose, Yclose -> pb->frame's vectors (as given, not yet normalised), header beam centre,
 * beam spot and pivot (a custom convention also takes the near point from the beam centre). */
static int convention_frame(nbg_ctx *ctx, const nbg_experiment *e, double Xclose, double Yclose, plan_build *pb,
                            double px)
{
    const double detsize_f = pb->det.size_f, detsize_s = pb->det.size_s;
    pb_frame *fr = &pb->frame;
    double *b = fr->b, *f = fr->f, *s = fr->s, *o = fr->o, *tta = fr->tta, *pol = fr->pol, *u = fr->u;
    fr->pivot = NBG_PIVOT_BEAM;
    switch (e->convention) {
    case NBG_CONV_ADXV:
        if (isnan(fr->Xbeam)) {
            fr->Xbeam = (detsize_f + px) / 2.0;
        }
        if (isnan(fr->Ybeam)) {
            fr->Ybeam = (detsize_s - px) / 2.0;
        }
        set3(b, 0, 0, 1), set3(f, 1, 0, 0), set3(s, 0, -1, 0), set3(o, 0, 0, 1);
        set3(tta, -1, 0, 0), set3(pol, 1, 0, 0), set3(u, 1, 0, 0);
        fr->Fbeam = fr->Xbeam;
        fr->Sbeam = detsize_s - fr->Ybeam;
        break;
    case NBG_CONV_MOSFLM:
    case NBG_CONV_DENZO: {
        if (isnan(fr->Xbeam)) {
            fr->Xbeam = (detsize_s + px) / 2.0;
        }
        if (isnan(fr->Ybeam)) {
            fr->Ybeam = (detsize_f + px) / 2.0;
        }
        set3(b, 1, 0, 0), set3(o, 1, 0, 0), set3(f, 0, 0, 1), set3(s, 0, -1, 0);
        set3(tta, 0, 0, -1), set3(pol, 0, 0, 1), set3(u, 0, 0, 1);
        const double half = e->convention == NBG_CONV_MOSFLM ? 0.5 * px : 0.0;
        fr->Fbeam = fr->Ybeam + half;
        fr->Sbeam = fr->Xbeam + half;
        break;
    }
    case NBG_CONV_XDS:
    case NBG_CONV_DIALS:
        if (isnan(fr->Xbeam)) {
            fr->Xbeam = Xclose;
        }
        if (isnan(fr->Ybeam)) {
            fr->Ybeam = Yclose;
        }
        set3(b, 0, 0, 1), set3(f, 1, 0, 0), set3(s, 0, 1, 0), set3(o, 0, 0, 1);
        if (e->convention == NBG_CONV_XDS) {
            set3(tta, 1, 0, 0), set3(pol, 1, 0, 0), set3(u, 1, 0, 0);
        } else {
            set3(tta, 0, 1, 0), set3(pol, 0, 1, 0), set3(u, 0, 1, 0);
        }
        fr->Fbeam = fr->Xbeam;
        fr->Sbeam = fr->Ybeam;
        fr->pivot = NBG_PIVOT_SAMPLE;
        break;
    case NBG_CONV_CUSTOM: {
        if (isnan(fr->Xbeam)) {
            fr->Xbeam = Xclose;
        }
        if (isnan(fr->Ybeam)) {
            fr->Ybeam = Yclose;
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
        fr->Fbeam = fr->Xbeam;
        fr->Sbeam = fr->Ybeam;
        fr->Fclose = fr->Xbeam;
        fr->Sclose = fr->Ybeam;
        break;
    }
    default:
        return nbgi_error(ctx, NBG_EINVAL, "unknown detector convention %d", (int)e->convention);
    }
    return NBG_OK;
}

/* detector_frame: e's convention, custom vectors, beam centre (Xbeam/Ybeam, Xclose/Yclose, ORGX/ORGY) and pivot,
 * with pb->det -> pb->frame: unit vectors (o = f x s when the one given is not a unit vector), the header beam
 * centre, beam spot, near point and pivot; the model's beam and polarization directions and rotation axis; no vector
 * of zero length, f and s not parallel. */
static int detector_frame(nbg_ctx *ctx, const nbg_experiment *e, plan_build *pb, nbgi_lab *m)
{
    const double px = m->det.pixel;
    pb_frame *fr = &pb->frame;
    fr->Fclose = isnan(e->ORGX) ? pb->det.size_f / 2.0 : (e->ORGX - 0.5) * px;
    fr->Sclose = isnan(e->ORGY) ? pb->det.size_s / 2.0 : (e->ORGY - 0.5) * px;
    const double Xclose = isnan(e->Xclose) ? fr->Fclose : e->Xclose / 1000.0;
    const double Yclose = isnan(e->Yclose) ? fr->Sclose : e->Yclose / 1000.0;
    fr->Xbeam = isnan(e->Xbeam) ? NAN : e->Xbeam / 1000.0;
    fr->Ybeam = isnan(e->Ybeam) ? NAN : e->Ybeam / 1000.0;
    const int rc = convention_frame(ctx, e, Xclose, Yclose, pb, px);
    if (rc != NBG_OK) {
        return rc;
    }
    if (e->pivot == NBG_PIVOT_BEAM || e->pivot == NBG_PIVOT_SAMPLE) {
        fr->pivot = e->pivot;
    }
    if (unitize(fr->b) == 0 || unitize(fr->f) == 0 || unitize(fr->s) == 0 || unitize(fr->pol) == 0 ||
        unitize(fr->u) == 0) {
        return nbgi_error(ctx, NBG_EINVAL, "a beam, detector, polarization or spindle vector has zero length");
    }
    /* nanoBragg rebuilds o = f x s unless the o given is a unit vector; "unit" within rounding (1e-12) here, so
     * that a normal computed elsewhere (nbg_experiment_from_geometry: it may point along -(f x s), as ADXV's
     * does) is kept rather than flipped by a last-bit difference */
    if (fabs(unitize(fr->o) - 1.0) > 1e-12) {
        nbgi_cross(fr->f, fr->s, fr->o);
        if (unitize(fr->o) == 0) {
            return nbgi_error(ctx, NBG_EINVAL, "detector fast and slow axes are parallel");
        }
    }
    nbgi_cross(fr->b, fr->pol, fr->vert);
    unitize(fr->vert);
    memcpy(m->beam.b, fr->b, sizeof fr->b);
    memcpy(m->beam.pol, fr->pol, sizeof fr->pol);
    memcpy(m->gon.axis0, fr->u, sizeof fr->u);
    return NBG_OK;
}

/* sampling: e's spindle, divergence, dispersion, sensor and mosaic settings -> pb->samp: nanoBragg's automatic
 * ranges, steps and counts (every count in 1 to NBG_MAX_STEPS), the sensor's attenuation; the model's sensor, phi
 * steps, mosaic spread and domains. */
static int sampling(nbg_ctx *ctx, const nbg_experiment *e, plan_build *pb, nbgi_lab *m)
{
    pb_sampling *sp = &pb->samp;
    sp->phi0 = e->phi0 / RTD;
    sp->osc = isnan(e->osc) ? -1 : e->osc / RTD; /* the resolve_* rules take -1 for unset */
    sp->phistep = isnan(e->phistep) ? -1 : e->phistep / RTD;
    double phisteps_d = e->phisteps;
    resolve_phi(&phisteps_d, &sp->osc, &sp->phistep);
    sp->hrange = isnan(e->hdivrange) ? -1 : e->hdivrange / 1000.0;
    sp->vrange = isnan(e->vdivrange) ? -1 : e->vdivrange / 1000.0;
    sp->hstep = isnan(e->hdivstep) ? -1 : e->hdivstep / 1000.0;
    sp->vstep = isnan(e->vdivstep) ? -1 : e->vdivstep / 1000.0;
    double hsteps_d = e->hdivsteps, vsteps_d = e->vdivsteps;
    resolve_range(&hsteps_d, &sp->hrange, &sp->hstep);
    resolve_range(&vsteps_d, &sp->vrange, &sp->vstep);
    sp->disp = e->dispersion / 100.0;
    sp->dispstep = -1;
    double dispsteps_d = e->dispsteps;
    resolve_range(&dispsteps_d, &sp->disp, &sp->dispstep);
    sp->thick = e->thick / 1e6;
    sp->thickstep = -1;
    sp->mu = -1;
    double thicksteps_d = e->thicksteps;
    if (!isnan(e->thick_abs)) {
        if (e->thick_abs == 0 || isinf(e->thick_abs)) {
            sp->mu = 0; /* no attenuation; nanoBragg then also drops the thickness */
            sp->thick = 0;
        } else {
            sp->mu = 1.0 / (e->thick_abs * 1e-6);
        }
    }
    resolve_thickness(&thicksteps_d, &sp->thick, &sp->thickstep);
    sp->own_step = 0;
    if (!(sp->thick > 0) && nbgi_panels_own_sensor(e->panels, e->npanels)) {
        /* only panels have sensors, their own: their layers follow the rule of an experiment's sensor (the count
         * given, or nanoBragg's default; the step a fraction of the thickness whatever the thickness), not one
         * layer */
        double t1 = 1, st1 = -1;
        thicksteps_d = e->thicksteps;
        resolve_thickness(&thicksteps_d, &t1, &st1);
        sp->own_step = st1 / t1;
    }
    int rc;
    if ((rc = step_count(ctx, phisteps_d, "phi steps (-osc / -phistep, -phisteps)", &sp->phisteps)) != NBG_OK ||
        (rc = step_count(ctx, hsteps_d, "horizontal divergence steps (-hdivrange / -hdivstep, -divsteps)",
                         &sp->hsteps)) != NBG_OK ||
        (rc = step_count(ctx, vsteps_d, "vertical divergence steps (-vdivrange / -vdivstep, -divsteps)",
                         &sp->vsteps)) != NBG_OK ||
        (rc = step_count(ctx, dispsteps_d, "wavelength steps (-dispersion, -dispsteps)", &sp->dispsteps)) != NBG_OK ||
        (rc = step_count(ctx, thicksteps_d, "sensor layers (-detector_thick / -thicksteps)", &sp->thicksteps)) !=
            NBG_OK) {
        return rc;
    }
    if (sp->thick > 0 && sp->mu < 0) {
        sp->mu = 1.0 / sp->thick;
    }
    sp->spread = isnan(e->mosaic) ? -1 : e->mosaic / RTD;
    sp->domains = e->mosaic_domains;
    resolve_mosaic(&sp->spread, &sp->domains);
    if (e->ndomain_rot > 0 && e->mosaic_domains > 0) {
        /* domains with turns of their own: the count given stands without a spread (blocks turned by their turns
         * alone) */
        sp->domains = e->mosaic_domains;
    }
    m->det.thick = sp->thick;
    m->det.thickstep = sp->thickstep;
    m->det.mu = sp->mu;
    m->det.thicksteps = sp->thicksteps;
    m->det.own_step = sp->own_step;
    m->det.physical = e->sensor_model == NBG_SENSOR_PHYSICAL;
    m->gon.nphi = sp->phisteps;
    m->xtal.spread = sp->spread;
    m->xtal.domains = sp->domains;
    return NBG_OK;
}

/* detector_geometry: pb->frame with e's distance, close distance, rotations, two-theta and beam shift -> the
 * model's det.in (the set-up's inputs, for the gradient's chain rule) and det.g (the positioned detector); the
 * plane must face the sample, not pass through it. */
static int detector_geometry(nbg_ctx *ctx, const nbg_experiment *e, const plan_build *pb, nbgi_lab *m)
{
    const pb_frame *fr = &pb->frame;
    const double rx = e->det_rot[0] / RTD, ry = e->det_rot[1] / RTD, rz = e->det_rot[2] / RTD;
    const double tt = e->twotheta / RTD;
    nbgi_det_in_d din;
    memset(&din, 0, sizeof din);
    memcpy(din.b, fr->b, sizeof fr->b);
    memcpy(din.f, fr->f, sizeof fr->f);
    memcpy(din.s, fr->s, sizeof fr->s);
    memcpy(din.o, fr->o, sizeof fr->o);
    memcpy(din.tta, fr->tta, sizeof fr->tta);
    din.pivot_sample = fr->pivot == NBG_PIVOT_SAMPLE;
    din.have_close = !isnan(e->close_distance);
    /* the refinement shift moves the detector in its plane: the beam spot (BEAM pivot) or the near point
     * (SAMPLE pivot) moves along the detector's own axes */
    din.Fbeam = fr->Fbeam + e->beam_shift[0] / 1000.0;
    din.Sbeam = fr->Sbeam + e->beam_shift[1] / 1000.0;
    din.Fclose = fr->Fclose + e->beam_shift[0] / 1000.0;
    din.Sclose = fr->Sclose + e->beam_shift[1] / 1000.0;
    din.distance = e->distance / 1000.0;
    din.close_distance = din.have_close ? e->close_distance / 1000.0 : 0;
    din.rot[0] = rx;
    din.rot[1] = ry;
    din.rot[2] = rz;
    din.twotheta = tt;
    for (int i = 0; i < 3; ++i) {
        din.tau[i] = e->det_tau[i] / RTD;
    }
    m->det.in = din;
    nbgi_detector_d(&din, &m->det.g);
    const double close_distance = m->det.g.close_distance, distance = m->det.g.distance;
    /* the plane must face the sample and not pass through it (an edge-on detector comes out 1e-15 mm off) */
    if (!(close_distance > 1e-9) || !isfinite(distance)) {
        return nbgi_error(ctx, NBG_EINVAL, "impossible detector geometry: the detector plane passes through or lies "
                         "behind the sample (close distance %g mm along the detector normal; check -distance, "
                         "-close_distance and the detector rotations)", close_distance * 1000);
    }
    return NBG_OK;
}

/* crystal: e's cell or matrix, misset, wavelength, N, interpolation mode and structure factors -> the model's
 * lambda0, the crystal's a0, misset, astar (build_crystal), structure factors, interpolation, shape and resolution
 * cut, and the report's cell; a cell with a volume. */
static int crystal(nbg_ctx *ctx, const nbg_experiment *e, nbgi_plan *pl)
{
    nbgi_lab_crystal *x = &pl->lab.xtal;
    pl->lab.beam.lambda0 = e->lambda * 1e-10;
    int interpolate = e->interpolate;
    if (interpolate < 0) {
        interpolate = (e->Na <= 2 || e->Nb <= 2 || e->Nc <= 2);
    }
    if (e->hkl == NULL) {
        interpolate = 0;
    }
    x->interpolate = interpolate;
    x->hkl = e->hkl;
    x->default_F = e->default_F;
    x->fudge = e->fudge;
    x->shape = (int)e->shape;
    x->dmin = e->dmin * 1e-10;
    x->water = e->water / 1e6;
    return build_crystal(ctx, e, pl, pl->lab.beam.lambda0);
}

/* crystal_size: e's N and oversampling, pb->beam.sample, the model's a0, distance, pixel and lambda0 -> the model's
 * N, pb->xtal.xtal_max, .rec_os, the rendering's oversampling (r->warn_oversample); the automatic oversampling at
 * most 64. */
static int crystal_size(nbg_ctx *ctx, const nbg_experiment *e, plan_build *pb, nbgi_render *rd, nbgi_plan *pl)
{
    pb_crystal *x = &pb->xtal;
    const nbgi_lab *m = &pl->lab;
    const double *samp = pb->beam.sample;
    double N[3] = {e->Na, e->Nb, e->Nc};
    double xtal_max = 0;
    for (int i = 0; i < 3; ++i) {
        const double len = nbgi_norm(m->xtal.a0 + 3 * i);
        if (samp[i] > 0) {
            N[i] = ceil(samp[i] / len);
        }
        if (N[i] < 1) {
            N[i] = 1;
        }
        xtal_max = fmax(xtal_max, len * N[i]);
    }
    /* in double first: an absurd crystal size must not overflow the int */
    const double rec_os_d = fmax(1.0, ceil(3.0 * xtal_max / (m->beam.lambda0 * m->det.g.distance / m->det.pixel)));
    if (e->oversample <= 0 && !(rec_os_d <= 64)) {
        /* nanoBragg would silently run rec_os^2 subpixels per pixel, which for a large crystal takes hours */
        return nbgi_error(ctx, NBG_EINVAL, "automatic oversampling would use %.3g x %.3g subpixels per pixel (the "
                         "crystal is %g mm across); give -oversample explicitly", rec_os_d, rec_os_d, xtal_max * 1000);
    }
    memcpy(pl->lab.xtal.N, N, sizeof N);
    x->xtal_max = xtal_max;
    x->rec_os = rec_os_d < INT_MAX ? (int)rec_os_d : INT_MAX;
    rd->oversample = e->oversample <= 0 ? x->rec_os : e->oversample;
    pl->rep.warn_oversample = rd->oversample < x->rec_os;
    return NBG_OK;
}

/* source_count: e's sources, or pb->samp's divergence grid (less its elliptical cut) x wavelength steps -> the
 * model's nsrc; the source arrays within the memory limit, checked before any loop over the grid; at least one. */
static int source_count(nbg_ctx *ctx, const nbg_experiment *e, const plan_build *pb, nbgi_lab *m)
{
    const pb_sampling *sp = &pb->samp;
    int rc;
    if (e->nsources > 0) {
        rc = nbgi_check_bytes(ctx, (double)e->nsources * (5 + NBG_SRC_STRIDE) * sizeof(double), "the X-ray sources");
        m->beam.nsrc = e->nsources;
        return rc;
    }
    char what[160];
    snprintf(what, sizeof what, "the X-ray sources (%d x %d divergence x %d wavelength steps)", sp->hsteps,
             sp->vsteps, sp->dispsteps);
    rc = nbgi_check_bytes(ctx, (double)sp->hsteps * sp->vsteps * sp->dispsteps * (5 + NBG_SRC_STRIDE) * sizeof(double),
                         what);
    if (rc != NBG_OK) {
        return rc;
    }
    int ndiv = 0;
    for (int hi = 0; hi < sp->hsteps; ++hi) {
        for (int vi = 0; vi < sp->vsteps; ++vi) {
            ndiv += !divergence_cut(e->round_div, hi, vi, sp->hsteps, sp->vsteps, sp->hrange, sp->vrange, sp->hstep,
                                    sp->vstep);
        }
    }
    m->beam.nsrc = ndiv * sp->dispsteps;
    if (m->beam.nsrc <= 0) {
        return nbgi_error(ctx, NBG_EINVAL, "no X-ray sources remain after the divergence cut");
    }
    return NBG_OK;
}

/* check_work: the pixels of e's region of interest x the samples per pixel of the model and rendering
 * (oversampling, sensor layers, sources, phi steps, domains) within the work limit; run before the arrays of the
 * sources and orientations. */
static int check_work(nbg_ctx *ctx, const nbg_experiment *e, const nbgi_lab *m, const nbgi_render *rd)
{
    const int fpixels = m->det.fpixels, spixels = m->det.spixels, os = rd->oversample;
    const int thicksteps = m->det.thicksteps, nsrc = m->beam.nsrc, phisteps = m->gon.nphi;
    const int domains = m->xtal.domains;
    const double per = (double)os * os * thicksteps * nsrc * phisteps * domains;
    const int x0 = e->roi[0] < 0 ? 0 : e->roi[0], y0 = e->roi[2] < 0 ? 0 : e->roi[2];
    const int x1 = e->roi[1] < 0 || e->roi[1] >= fpixels ? fpixels - 1 : e->roi[1];
    const int y1 = e->roi[3] < 0 || e->roi[3] >= spixels ? spixels - 1 : e->roi[3];
    double pixels = fmax(0.0, (double)x1 - x0 + 1) * fmax(0.0, (double)y1 - y0 + 1);
    if (e->npanels > 0) {
        pixels = 0;
        for (int k = 0; k < e->npanels; ++k) {
            pixels += (double)e->panels[k].fpixels * e->panels[k].spixels;
        }
    }
    nbg_limits lim;
    nbgi_limits_of(ctx, &lim);
    if (per > INT_MAX || pixels * per > lim.max_samples) {
        return nbgi_error(ctx, NBG_EINVAL, "this run would evaluate %.3g samples: %.0f pixels x %.3g per pixel (%d x %d "
                         "subpixels x %d sensor layers x %d sources x %d phi steps x %d mosaic domains), above the "
                         "limit of %.3g%s: reduce the sampling, or raise the limit (-max_samples on the command line, "
                         "nbg_ctx_set_limits in the library)", pixels * per, pixels, per, os, os, thicksteps, nsrc,
                         phisteps, domains, per > INT_MAX ? (double)INT_MAX : lim.max_samples,
                         per > INT_MAX ? " per pixel" : "");
    }
    return NBG_OK;
}

/* v turned as the beam is by its tilts: about w1 by tilt1, then about w2 by tilt2. */
static void turn_beam(const plan_build *pb, const double v[3], double out[3])
{
    double t[3];
    rotate_axis(v, pb->beam_w, pb->beam_t[0], t);
    rotate_axis(t, pb->beam_w + 3, pb->beam_t[1], out);
}

/* beam_turn: e's beam tilts and pb->frame's b, pol, vert, u -> the model's sb, spol (the beam and polarization the
 * sources use), pb->frame.svert (the divergence axis they use), pb->beam_*, the model's beam.tilt_axes.  The axes:
 * w1 = unit(u x b) (any perpendicular to b when the spindle lies along it), w2 = b x w1; the detector, the spindle
 * and its tilts' axes keep the untilted beam.  The gradient turns everything else the other way about the axes as
 * they act (beam.tilt_axes). */
static int beam_turn(const nbg_experiment *e, plan_build *pb, nbgi_lab *m)
{
    pb_frame *fr = &pb->frame;
    const double *u = fr->u, *b = fr->b;
    double w1[3];
    nbgi_cross(u, b, w1);
    double l1 = nbgi_norm(w1);
    if (l1 < 1e-9) {
        const double x[3] = {fabs(b[0]) < 0.9 ? 1 : 0, fabs(b[0]) < 0.9 ? 0 : 1, 0};
        nbgi_cross(x, b, w1);
        l1 = nbgi_norm(w1);
    }
    for (int i = 0; i < 3; ++i) {
        pb->beam_w[i] = w1[i] / l1;
    }
    nbgi_cross(b, pb->beam_w, pb->beam_w + 3);
    const double l2 = nbgi_norm(pb->beam_w + 3);
    for (int i = 3; i < 6; ++i) {
        pb->beam_w[i] /= l2;
    }
    pb->beam_t[0] = e->beam_tilt[0] / RTD;
    pb->beam_t[1] = e->beam_tilt[1] / RTD;
    pb->beam_turned = pb->beam_t[0] != 0 || pb->beam_t[1] != 0;
    memcpy(m->beam.sb, fr->b, sizeof fr->b);
    memcpy(m->beam.spol, fr->pol, sizeof fr->pol);
    memcpy(fr->svert, fr->vert, sizeof fr->vert);
    if (pb->beam_turned) {
        turn_beam(pb, fr->b, m->beam.sb);
        turn_beam(pb, fr->pol, m->beam.spol);
        turn_beam(pb, fr->vert, fr->svert);
    }
    rotate_axis(pb->beam_w, pb->beam_w + 3, pb->beam_t[1], m->beam.tilt_axes);
    memcpy(m->beam.tilt_axes + 3, pb->beam_w + 3, 3 * sizeof(double));
    return NBG_OK;
}

/* Part of sources: e's sources, or the divergence grid about the model's turned beam (-10 m along it, rotated
 * about pol and vert) x the wavelength steps about its lambda0 -> pos (x, y, z, lambda per source) and lamrel
 * (d lambda_i / d lambda0); a given source finite and off the origin. */
static int source_positions(nbg_ctx *ctx, const nbg_experiment *e, const plan_build *pb, const nbgi_lab *m,
                            double *pos, double *lamrel)
{
    const double lambda0 = m->beam.lambda0;
    if (e->nsources > 0) {
        for (int i = 0; i < m->beam.nsrc; ++i) {
            const nbg_source *sr = &e->sources[i];
            for (int j = 0; j < 3; ++j) {
                pos[4 * i + j] = sr->pos[j];
            }
            if (pb->beam_turned) {
                double t[3];
                turn_beam(pb, pos + 4 * i, t);
                memcpy(pos + 4 * i, t, sizeof t);
            }
            pos[4 * i + 3] = (sr->lambda > 0) ? sr->lambda * 1e-10 : lambda0;
            lamrel[i] = (sr->lambda > 0) ? 0.0 : 1.0;
            if (!isfinite(pos[4 * i]) || !isfinite(pos[4 * i + 1]) || !isfinite(pos[4 * i + 2]) ||
                !isfinite(pos[4 * i + 3]) || !(nbgi_norm(pos + 4 * i) > 0 && isfinite(nbgi_norm(pos + 4 * i)))) {
                return nbgi_error(ctx, NBG_EINVAL, "source %d has an invalid position or wavelength", i + 1);
            }
        }
        return NBG_OK;
    }
    const pb_sampling *sp = &pb->samp;
    const double *b = m->beam.sb, *pol = m->beam.spol, *vert = pb->frame.svert;
    const int hsteps = sp->hsteps, vsteps = sp->vsteps, dispsteps = sp->dispsteps;
    const double hrange = sp->hrange, vrange = sp->vrange, hstep = sp->hstep, vstep = sp->vstep;
    const double disp = sp->disp, dispstep = sp->dispstep;
    int n = 0;
    for (int hi = 0; hi < hsteps; ++hi) {
        for (int vi = 0; vi < vsteps; ++vi) {
            if (divergence_cut(e->round_div, hi, vi, hsteps, vsteps, hrange, vrange, hstep, vstep)) {
                continue;
            }
            const double hdiv = hstep * hi - hrange / 2.0;
            const double vdiv = vstep * vi - vrange / 2.0;
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
    return NBG_OK;
}

/* The kernels' sources: the model's positions and polarization axis -> src rows of NBG_SRC_STRIDE (incident unit
 * vector, lambda, E and B polarization unit vectors). */
static void source_frames(const nbgi_lab_beam *bm, double *src)
{
    const double *pol = bm->spol, *pos = bm->pos;
    for (int i = 0; i < bm->nsrc; ++i) {
        double *sr = src + NBG_SRC_STRIDE * i;
        double inc[3] = {-pos[4 * i], -pos[4 * i + 1], -pos[4 * i + 2]};
        unitize(inc);
        double Bv[3], Ev[3];
        nbgi_cross(pol, inc, Bv);
        unitize(Bv);
        nbgi_cross(inc, Bv, Ev);
        unitize(Ev);
        memcpy(sr, inc, sizeof inc);
        sr[3] = pos[4 * i + 3];
        memcpy(sr + 4, Ev, sizeof Ev);
        memcpy(sr + 7, Bv, sizeof Bv);
    }
}

/* Part of sources: the spectrum's shift and width (spectrum_shift, spectrum_scale) on the nominal wavelengths of
 * pos: lambda_i = lambda_i0 + shift + (scale - 1) (lambda_i0 - m), m the sources' plain mean (nanoBragg's sources
 * carry no weight: a spectrum is the density of its sources), so that the defaults leave every wavelength as it
 * was, bit for bit.  The beam only: the crystal (a -mat's, read at e->lambda) does not move.  dscale_i =
 * lambda_i0 - m, d lambda_i / d scale; lamrel_i (d lambda_i / d lambda0) becomes (1 - scale) mean(lamrel) +
 * scale lamrel_i, the wavelength's own derivative through the mean. */
static void spectrum(const nbg_experiment *e, int nsrc, double *pos, double *lamrel, double *dscale)
{
    double m = 0, mrel = 0;
    for (int i = 0; i < nsrc; ++i) {
        m += pos[4 * i + 3];
        mrel += lamrel[i];
    }
    m /= nsrc > 0 ? nsrc : 1;
    mrel /= nsrc > 0 ? nsrc : 1;
    const double shift = e->spectrum_shift * 1e-10, s = e->spectrum_scale;
    for (int i = 0; i < nsrc; ++i) {
        const double l0 = pos[4 * i + 3];
        dscale[i] = l0 - m;
        if (shift != 0 || s != 1) {
            pos[4 * i + 3] = l0 + shift + (s - 1) * (l0 - m);
            lamrel[i] = (1 - s) * mrel + s * lamrel[i];
        }
    }
}

/* sources: the model's nsrc sources (source_positions, spectrum) -> its pos, lamrel, dscale and lambda_min; every
 * wavelength positive. */
static int sources(nbg_ctx *ctx, const nbg_experiment *e, const plan_build *pb, nbgi_lab *m)
{
    nbgi_lab_beam *bm = &m->beam;
    const int nsrc = bm->nsrc;
    bm->pos = malloc(sizeof(double) * 4 * (size_t)nsrc);
    bm->lamrel = malloc(sizeof(double) * 2 * (size_t)nsrc);
    bm->dscale = bm->lamrel != NULL ? bm->lamrel + nsrc : NULL;
    if (bm->pos == NULL || bm->lamrel == NULL) {
        return nbgi_error(ctx, NBG_ENOMEM, "out of memory for %d sources", nsrc);
    }
    const int rc = source_positions(ctx, e, pb, m, bm->pos, bm->lamrel);
    if (rc != NBG_OK) {
        return rc;
    }
    spectrum(e, nsrc, bm->pos, bm->lamrel, bm->dscale);
    double lambda_min = INFINITY;
    for (int i = 0; i < nsrc; ++i) {
        const double lambda = bm->pos[4 * i + 3];
        if (!(lambda > 0)) {
            return nbgi_error(ctx, NBG_EINVAL, "source %d has a non-positive wavelength (%g A; check -dispersion)",
                             i + 1, lambda * 1e10);
        }
        lambda_min = fmin(lambda_min, lambda);
    }
    bm->lambda_min = lambda_min;
    return NBG_OK;
}

/* miller_range: the model's a0 and lambda_min -> nothing; the largest Miller index, 2 |a|max / lambda_min, well
 * inside the int the kernels round indices to (NBG_MAX_MILLER). */
static int miller_range(nbg_ctx *ctx, const nbgi_lab *m)
{
    double amax = 0;
    for (int i = 0; i < 3; ++i) {
        amax = fmax(amax, nbgi_norm(m->xtal.a0 + 3 * i));
    }
    const double lambda_min = m->beam.lambda_min;
    const double hmax = 2.0 * amax / lambda_min;
    if (!(hmax < NBG_MAX_MILLER)) {
        return nbgi_error(ctx, NBG_EINVAL, "Miller indices would reach %.3g (longest cell axis %g A, shortest "
                         "wavelength %g A), beyond the %g the kernels handle: check the cell and the wavelength",
                         hmax, amax * 1e10, lambda_min * 1e10, NBG_MAX_MILLER);
    }
    return NBG_OK;
}

void nbgi_domain_turn_matrix(const double r[3], double D[9])
{
    for (int j = 0; j < 3; ++j) {
        const double ej[3] = {j == 0, j == 1, j == 2};
        double col[3];
        rotate_xyz_d(ej, r[0] / RTD, r[1] / RTD, r[2] / RTD, col);
        for (int i = 0; i < 3; ++i) {
            D[3 * i + j] = col[i];
        }
    }
}

void nbgi_domain_turn_angles(const double D[9], double r[3])
{
    /* D = Rz(c) Ry(b) Rx(a): D[6] = -sin b, D[7] = cos b sin a, D[8] = cos b cos a, D[3] = sin c cos b,
     * D[0] = cos c cos b */
    r[0] = atan2(D[7], D[8]) * RTD;
    r[1] = atan2(-D[6], hypot(D[7], D[8])) * RTD;
    r[2] = atan2(D[3], D[0]) * RTD;
}

/* Part of orientations: e's mosaic seed and the model's spread -> its umat, mos_axis, mos_angle of its domains,
 * domain 0 the unrotated crystal. */
static void mosaic_domains(const nbg_experiment *e, nbgi_lab_crystal *x)
{
    const double spread = x->spread;
    nbgi_rng rng;
    nbgi_rng_init(&rng, e->mosaic_seed);
    /* The reference forms each domain's angle in single precision from a float spread; nbgrad keeps the
     * single-precision cap factor (the same domains) but multiplies by the spread in double, so the angle is
     * exactly proportional to the spread, as the mosaic gradient and its finite-difference check need. */
    for (int m = 0; m < x->domains; ++m) {
        float capf;
        nbgi_mosaic_draw(&rng, x->mos_axis + 3 * m, &capf);
        if (!isnan(e->mosaic_frame[0])) { /* the same domains, drawn in another frame */
            matvec(e->mosaic_frame, x->mos_axis + 3 * m, x->mos_axis + 3 * m);
        }
        x->mos_angle[m] = spread * (double)capf;
        nbgi_rodrigues_umat(x->mos_axis + 3 * m, x->mos_angle[m], x->umat + 9 * m);
    }
    /* domain 0 is the unrotated crystal */
    static const double I3[9] = {1, 0, 0, 0, 1, 0, 0, 0, 1};
    memcpy(x->umat, I3, sizeof I3);
    set3(x->mos_axis, 0, 0, 1);
    x->mos_angle[0] = 0;
    /* each domain's own turn D = Rz Ry Rx about the lab's axes at phi 0 (the crystal's: the spindle turns it) */
    x->ndomrot = x->domrot != NULL ? e->ndomain_rot : 0;
    for (int m = 0; m < x->ndomrot; ++m) {
        nbgi_domain_turn_matrix(e->domain_rot + 3 * m, x->domrot + 9 * m);
    }
}

/* orientations: the model's rotation axis and beam, e's spindle tilts, pb->samp's phi steps, the mosaic spread
 * and domains -> the model's tilted axis and the tilts' axes, the scan's angles, the mosaic domains; the
 * orientations (phi steps x domains) within the memory limit, checked first. */
static int orientations(nbg_ctx *ctx, const nbg_experiment *e, const plan_build *pb, nbgi_lab *m)
{
    nbgi_lab_goniometer *gn = &m->gon;
    nbgi_lab_crystal *x = &m->xtal;
    const int phisteps = gn->nphi, domains = x->domains;
    memcpy(gn->axis, gn->axis0, sizeof gn->axis0);
    /* the tilt's axes: v1 = unit(u x beam) (any perpendicular when the spindle lies along the beam), v2 = u x v1 */
    const double *u = gn->axis0, *b = m->beam.b;
    double v1[3] = {u[1] * b[2] - u[2] * b[1], u[2] * b[0] - u[0] * b[2], u[0] * b[1] - u[1] * b[0]};
    double l1 = sqrt(v1[0] * v1[0] + v1[1] * v1[1] + v1[2] * v1[2]);
    if (l1 < 1e-9) {
        const double xx[3] = {fabs(u[0]) < 0.9 ? 1 : 0, fabs(u[0]) < 0.9 ? 0 : 1, 0};
        v1[0] = u[1] * xx[2] - u[2] * xx[1], v1[1] = u[2] * xx[0] - u[0] * xx[2], v1[2] = u[0] * xx[1] - u[1] * xx[0];
        l1 = sqrt(v1[0] * v1[0] + v1[1] * v1[1] + v1[2] * v1[2]);
    }
    double *ta = gn->tilt_axes;
    for (int i = 0; i < 3; ++i) {
        ta[i] = v1[i] / l1;
    }
    ta[3] = u[1] * ta[2] - u[2] * ta[1];
    ta[4] = u[2] * ta[0] - u[0] * ta[2];
    ta[5] = u[0] * ta[1] - u[1] * ta[0];
    if (e->spindle_tilt[0] != 0 || e->spindle_tilt[1] != 0) {
        const double t[2] = {e->spindle_tilt[0] / RTD, e->spindle_tilt[1] / RTD};
        nbgi_spindle_tilt_d(gn->axis0, ta, ta + 3, t, gn->axis);
    }
    char what[128];
    snprintf(what, sizeof what, "the crystal orientations (%d phi steps x %d mosaic domains)", phisteps, domains);
    const int rc = nbgi_check_bytes(ctx, (double)phisteps * domains * 9 * sizeof(double), what);
    if (rc != NBG_OK) {
        return rc;
    }
    if (e->ndomain_rot < 0 || e->ndomain_rot > domains || (e->ndomain_rot > 0 && e->domain_rot == NULL)) {
        return nbgi_error(ctx, NBG_EINVAL, "%d mosaic domains with turns of their own (-domain_rot), and the crystal "
                          "has %d domains (-mosaic_domains)%s", e->ndomain_rot, domains,
                          e->ndomain_rot > 0 && e->domain_rot == NULL ? ", without their array" : "");
    }
    for (int i = 0; i < 3 * e->ndomain_rot; ++i) {
        if (!isfinite(e->domain_rot[i])) {
            return nbgi_error(ctx, NBG_EINVAL, "mosaic domain %d's turn about %c (-domain_rot) is %g", i / 3,
                              "xyz"[i % 3], e->domain_rot[i]);
        }
    }
    gn->phi = malloc(sizeof(double) * (size_t)phisteps);
    x->umat = malloc(sizeof(double) * 9 * (size_t)domains);
    x->mos_axis = malloc(sizeof(double) * 3 * (size_t)domains);
    x->mos_angle = malloc(sizeof(double) * (size_t)domains);
    x->domrot = e->ndomain_rot > 0 ? malloc(sizeof(double) * 9 * (size_t)e->ndomain_rot) : NULL;
    if (!gn->phi || !x->umat || !x->mos_axis || !x->mos_angle || (e->ndomain_rot > 0 && !x->domrot)) {
        return nbgi_error(ctx, NBG_ENOMEM, "out of memory for %d phi steps x %d mosaic domains", phisteps, domains);
    }
    for (int ip = 0; ip < phisteps; ++ip) {
        gn->phi[ip] = pb->samp.phi0 + pb->samp.phistep * ip;
    }
    mosaic_domains(e, x);
    return NBG_OK;
}

/* detector_panels: e's panels, placed about the model's flat detector (nbgi_plan_panels), each with its sensor (the
 * experiment's, or its own thickness with the experiment's layer count (without a sensor of the experiment's, the
 * count an experiment's sensor would have: sampling's own_step), its layers scaled as the thickness, and its
 * own attenuation length, else the experiment's -detector_abs, else its thickness, as nanoBragg's default) -> the
 * model's panels, motion tangents, pixel and row counts. */
static int detector_panels(nbg_ctx *ctx, const nbg_experiment *e, nbgi_lab_detector *d)
{
    d->npanels = 0;
    d->nrows = d->spixels;
    d->npix = (long)d->fpixels * d->spixels;
    if (e->npanels <= 0) {
        return NBG_OK;
    }
    long npix = 0;
    int nrows = 0;
    const int rc = nbgi_plan_panels(ctx, e, d->g.pix0, d->g.f, d->g.s, d->g.o, &d->panels, &d->motion_t, &npix,
                                    &nrows);
    if (rc != NBG_OK) {
        return rc;
    }
    d->npanels = e->npanels;
    d->nrows = nrows;
    d->npix = npix;
    for (int q = 0; q < e->npanels; ++q) {
        const nbg_panel *pp = &e->panels[q];
        nbgi_kpanel *kq = &d->panels[q];
        kq->thick = d->thick;
        kq->thickstep = d->thickstep;
        kq->mu = d->mu;
        if (pp->thick > 0) {
            const double T = pp->thick * 1e-6;
            kq->thickstep = d->thick > 0 ? d->thickstep * T / d->thick : T * d->own_step;
            kq->thick = T;
            kq->mu = pp->thick_abs > 0 ? 1e6 / pp->thick_abs : !isnan(e->thick_abs) ? d->mu : 1.0 / T;
        } else if (pp->thick_abs > 0 && d->thick > 0) {
            kq->mu = 1e6 / pp->thick_abs;
        }
        if (!(kq->mu > 0)) {
            kq->thick = kq->thickstep = 0; /* no attenuation: no sensor depth (as for the experiment's) */
        }
    }
    return NBG_OK;
}

/* render_options: e's ROI, mask, switches and pixel list -> rd (the oversampling: crystal_size). */
static void render_options(const nbg_experiment *e, nbgi_render *rd)
{
    memcpy(rd->roi, e->roi, sizeof rd->roi);
    rd->mask = e->mask;
    rd->curved = e->curved != 0;
    rd->point_pixel = e->point_pixel != 0;
    rd->os_thick = e->oversample_thick != 0;
    rd->os_polar = e->oversample_polar != 0;
    rd->os_omega = e->oversample_omega != 0;
    rd->pixels = e->pixels;
    rd->npixels_list = e->npixels_list;
}

/* ---- the kernels' inputs from the model (nbgi_plan_kernels): nothing of the flags is read past this line ------ */

/* The crystal vectors of every phi step and domain: abc[ip, m] = U_m Rot(axis, phi_ip) D_m a0 (9 doubles at
 * 9 (ip domains + m); D_m the domain's own turn, where it has one); phi = 0, a zero spread and no turns rotate
 * nothing. */
static void rotate_crystal(const nbgi_lab *lab, double *abc)
{
    const nbgi_lab_crystal *x = &lab->xtal;
    const double spread = x->spread;
    const int domains = x->domains;
    for (int ip = 0; ip < lab->gon.nphi; ++ip) {
        const double phi = lab->gon.phi[ip];
        double ap[9];
        for (int v = 0; v < 3; ++v) {
            if (phi != 0) {
                rotate_axis(x->a0 + 3 * v, lab->gon.axis, phi, ap + 3 * v);
            } else {
                memcpy(ap + 3 * v, x->a0 + 3 * v, 3 * sizeof(double));
            }
        }
        for (int m = 0; m < domains; ++m) {
            double *dst = abc + 9 * ((size_t)ip * domains + m);
            double at[9];
            const double *src = ap;
            if (m < x->ndomrot) { /* the domain's own turn, then the spindle */
                for (int v = 0; v < 3; ++v) {
                    double t[3];
                    matvec(x->domrot + 9 * m, x->a0 + 3 * v, t);
                    if (phi != 0) {
                        rotate_axis(t, lab->gon.axis, phi, at + 3 * v);
                    } else {
                        memcpy(at + 3 * v, t, sizeof t);
                    }
                }
                src = at;
            }
            for (int v = 0; v < 3; ++v) {
                if (spread > 0) {
                    matvec(x->umat + 9 * m, src + 3 * v, dst + 3 * v);
                } else {
                    memcpy(dst + 3 * v, src + 3 * v, 3 * sizeof(double));
                }
            }
        }
    }
}

/* The samples a pixel sums (the normalisation): sources x domains x phi steps x subpixels; within an int (check_work
 * bounds the product with the sensor layers). */
static int samples_per_pixel(const nbgi_lab *m, int os)
{
    return m->beam.nsrc * m->xtal.domains * m->gon.nphi * os * os;
}

/* kernel_params: the model, its sources (pl->src) and orientations (pl->abc), the rendering options -> pl->k; the
 * HKL table non-empty. */
static int kernel_params(nbg_ctx *ctx, const nbgi_render *rd, nbgi_plan *pl)
{
    nbgi_kparams *k = &pl->k;
    const nbgi_lab *m = &pl->lab;
    const nbgi_det_out_d *g = &m->det.g;
    const nbgi_lab_crystal *x = &m->xtal;
    const double *N = x->N;
    const int fpixels = m->det.fpixels, spixels = m->det.spixels, os = rd->oversample;
    k->fpixels = fpixels;
    k->spixels = spixels;
    k->oversample = os;
    k->thicksteps = m->det.thicksteps;
    k->roi_xmin = rd->roi[0] < 0 ? 0 : rd->roi[0];
    k->roi_xmax = rd->roi[1] < 0 ? fpixels : rd->roi[1];
    k->roi_ymin = rd->roi[2] < 0 ? 0 : rd->roi[2];
    k->roi_ymax = rd->roi[3] < 0 ? spixels : rd->roi[3];
    k->mask = rd->mask;
    memcpy(k->pix0, g->pix0, sizeof g->pix0);
    memcpy(k->fdet, g->f, sizeof g->f);
    memcpy(k->sdet, g->s, sizeof g->s);
    memcpy(k->odet, g->o, sizeof g->o);
    memcpy(k->beam, m->beam.b, sizeof m->beam.b);
    k->pixel = m->det.pixel;
    k->subpixel = m->det.pixel / os;
    k->close_distance = g->close_distance;
    k->distance = g->distance;
    k->curved = rd->curved;
    k->point_pixel = rd->point_pixel;
    k->os_thick = rd->os_thick;
    k->os_polar = rd->os_polar;
    k->os_omega = rd->os_omega;
    k->thick = m->det.thick;
    k->thickstep = m->det.thickstep;
    k->mu = m->det.mu;
    k->sensor_phys = m->det.physical;
    k->nsources = m->beam.nsrc;
    k->src = pl->src;
    k->polarization = m->beam.polarization;
    k->nopolar = m->beam.nopolar;
    k->nphi = m->gon.nphi;
    k->nmos = x->domains;
    k->abc = pl->abc;
    k->abc_f = pl->abc_f;
    k->Na = N[0];
    k->Nb = N[1];
    k->Nc = N[2];
    k->fudge = x->fudge;
    for (int i = 0; i < 3; ++i) {
        k->Ni[i] = (N[i] == floor(N[i]) && N[i] >= 1 && N[i] <= 32) ? (int)N[i] : 0;
    }
    k->shape = x->shape;
    memcpy(k->astar, x->astar, sizeof x->astar);
    if (x->hkl != NULL) {
        const nbg_hkl *t = x->hkl;
        if (t->F == NULL || t->h_max < t->h_min || t->k_max < t->k_min || t->l_max < t->l_min) {
            return nbgi_error(ctx, NBG_EINVAL, "the structure-factor table is empty or has negative ranges");
        }
        k->F = t->F;
        k->h_min = t->h_min;
        k->k_min = t->k_min;
        k->l_min = t->l_min;
        k->nh = t->h_max - t->h_min + 1;
        k->nk = t->k_max - t->k_min + 1;
        k->nl = t->l_max - t->l_min + 1;
    }
    k->default_F = x->default_F;
    k->interpolate = x->interpolate;
    k->dmin = x->dmin;
    const double w = x->water;
    k->water = w != 0;
    /* +0 without water (-water -0 made it -0: the row's sum of squares relies on a start that is not -0) */
    k->I_bg = k->water ? 2.57 * 2.57 * NBG_RE2 * m->beam.fluence * w * w * w * 1e6 * NBG_AVOGADRO / 18.0 : 0.0;
    k->scale = NBG_RE2 * m->beam.fluence / samples_per_pixel(m, os);
    k->npanels = m->det.npanels;
    k->nrows = m->det.nrows;
    k->npix = m->det.npix;
    k->panels = m->det.panels;
    return NBG_OK;
}

/* pixel_list: the rendering's pixel list (checked: sorted, distinct, inside the image) -> its runs of neighbours within a row
 * (pl->runs, k.runs), so that the kernels walk only the listed pixels. */
static int pixel_list(nbg_ctx *ctx, const nbgi_render *rd, nbgi_plan *pl)
{
    nbgi_kparams *k = &pl->k;
    k->list = NULL;
    k->nlist = k->nruns = 0;
    k->runs = NULL;
    if (rd->pixels == NULL && rd->npixels_list == 0) {
        return NBG_OK;
    }
    if (rd->pixels == NULL || rd->npixels_list < 1) {
        return nbgi_error(ctx, NBG_EINVAL, "the pixel list is inconsistent (%ld pixels, list %s)", rd->npixels_list,
                         rd->pixels == NULL ? "NULL" : "given");
    }
    const long n = rd->npixels_list;
    long nruns = 0;
    for (long t = 0; t < n; ++t) {
        const uint32_t i = rd->pixels[t];
        if ((long)i >= k->npix) {
            return nbgi_error(ctx, NBG_EINVAL, "pixel list entry %ld is pixel %lu, outside the image of %ld pixels", t,
                             (unsigned long)i, k->npix);
        }
        if (t > 0 && i <= rd->pixels[t - 1]) {
            return nbgi_error(ctx, NBG_EINVAL, "pixel list entry %ld (pixel %lu) does not follow entry %ld (pixel "
                             "%lu): the list must be sorted and without repeats", t, (unsigned long)i, t - 1,
                             (unsigned long)rd->pixels[t - 1]);
        }
    }
    nbg_limits lim;
    nbgi_limits_of(ctx, &lim);
    if ((double)n * sizeof(nbgi_run) > lim.max_bytes) {
        return nbgi_error(ctx, NBG_ENOMEM, "the pixel list's %ld runs would need %.3g bytes, over the limit of %.3g "
                         "(-max_memory)", n, (double)n * sizeof(nbgi_run), lim.max_bytes);
    }
    nbgi_run *runs = malloc(sizeof(nbgi_run) * (size_t)n);
    if (runs == NULL) {
        return nbgi_error(ctx, NBG_ENOMEM, "out of memory for the runs of a pixel list of %ld pixels", n);
    }
    int prow = -1, pf = -2, pan = 0;
    for (long t = 0; t < n; ++t) {
        const long i = (long)rd->pixels[t];
        int r, f;
        if (k->npanels == 0) {
            r = (int)(i / k->fpixels);
            f = (int)(i % k->fpixels);
        } else {
            while (pan + 1 < k->npanels && k->panels[pan + 1].offset <= i) {
                ++pan; /* the list is sorted: the panel only moves forward */
            }
            const nbgi_kpanel *q = k->panels + pan;
            r = q->row0 + (int)((i - q->offset) / q->fpixels);
            f = (int)((i - q->offset) % q->fpixels);
        }
        if (r == prow && f == pf + 1) {
            runs[nruns - 1].n++;
        } else {
            runs[nruns].r = r;
            runs[nruns].f0 = f;
            runs[nruns].n = 1;
            runs[nruns].pos = t;
            ++nruns;
        }
        prow = r;
        pf = f;
    }
    pl->runs = runs;
    k->list = rd->pixels;
    k->nlist = n;
    k->runs = runs;
    k->nruns = nruns;
    return NBG_OK;
}

/* report: pb, the model, e's header values and pl->k.I_bg -> pl->rep, in user units (mm, deg), beside what the
 * earlier steps put there (cell, vectors, random misset, warnings). */
static void report(const nbg_experiment *e, const plan_build *pb, nbgi_plan *pl)
{
    nbg_report *r = &pl->rep;
    const nbgi_lab *m = &pl->lab;
    const nbgi_det_out_d *g = &m->det.g;
    const pb_frame *fr = &pb->frame;
    const double px = m->det.pixel;
    r->fpixels = m->det.fpixels;
    r->spixels = m->det.spixels;
    r->pixel = e->pixel;
    r->detsize_f = pb->det.size_f * 1000;
    r->detsize_s = pb->det.size_s * 1000;
    r->distance = g->distance * 1000;
    r->close_distance = g->close_distance * 1000;
    r->Xbeam = fr->Xbeam * 1000;
    r->Ybeam = fr->Ybeam * 1000;
    r->Fbeam = g->Fbeam * 1000;
    r->Sbeam = g->Sbeam * 1000;
    r->Fclose = g->Fclose * 1000;
    r->Sclose = g->Sclose * 1000;
    r->ORGX = g->Fclose / px + 0.5;
    r->ORGY = g->Sclose / px + 0.5;
    r->dials_origin[0] = 1000.0 * g->pix0[2];
    r->dials_origin[1] = 1000.0 * g->pix0[1];
    r->dials_origin[2] = -1000.0 * g->pix0[0];
    memcpy(r->pix0, g->pix0, sizeof g->pix0);
    memcpy(r->fdet, g->f, sizeof g->f);
    memcpy(r->sdet, g->s, sizeof g->s);
    memcpy(r->odet, g->o, sizeof g->o);
    memcpy(r->beam, m->beam.sb, sizeof m->beam.sb); /* turned by the beam tilts */
    memcpy(r->polar_axis, m->beam.spol, sizeof m->beam.spol);
    memcpy(r->spindle, m->gon.axis, sizeof m->gon.axis); /* tilted */
    r->lambda = e->lambda;
    r->phi0 = pb->samp.phi0 * RTD;
    r->osc = pb->samp.osc * RTD;
    r->twotheta = e->twotheta;
    r->pivot = fr->pivot;
    r->oversample = pl->k.oversample;
    r->recommended_oversample = pb->xtal.rec_os;
    r->thicksteps = m->det.thicksteps;
    r->sensor_model = m->det.physical ? NBG_SENSOR_PHYSICAL : NBG_SENSOR_NANOBRAGG;
    r->nsources = m->beam.nsrc;
    r->phisteps = m->gon.nphi;
    r->mosaic_domains = m->xtal.domains;
    r->steps = samples_per_pixel(m, pl->k.oversample);
    r->Na = m->xtal.N[0];
    r->Nb = m->xtal.N[1];
    r->Nc = m->xtal.N[2];
    r->interpolate = m->xtal.interpolate;
    r->fluence = m->beam.fluence;
    r->flux = m->beam.flux;
    r->xtal_size_max = pb->xtal.xtal_max * 1000;
    r->I_bg = pl->k.I_bg;
    r->npanels = pl->k.npanels > 0 ? pl->k.npanels : 1;
    r->npix = (size_t)pl->k.npix;
}

/* The first half: the model (pl->lab) and the rendering options (rd: pl->render) from nanoBragg's flags. */
static int plan_lab(nbg_ctx *ctx, const nbg_experiment *e, plan_build *pb, nbgi_render *rd, nbgi_plan *pl)
{
    nbgi_lab *m = &pl->lab;
    int rc;
    render_options(e, rd);
    if ((rc = validate(ctx, e)) != NBG_OK ||
        (rc = detector_size(ctx, e, pb, m)) != NBG_OK ||
        (rc = beam_and_sample(ctx, e, pb, m, &pl->rep)) != NBG_OK ||
        (rc = detector_frame(ctx, e, pb, m)) != NBG_OK ||
        (rc = beam_turn(e, pb, m)) != NBG_OK ||
        (rc = sampling(ctx, e, pb, m)) != NBG_OK ||
        (rc = detector_geometry(ctx, e, pb, m)) != NBG_OK ||
        (rc = crystal(ctx, e, pl)) != NBG_OK ||
        (rc = crystal_size(ctx, e, pb, rd, pl)) != NBG_OK ||
        (rc = source_count(ctx, e, pb, m)) != NBG_OK ||
        (rc = check_work(ctx, e, m, rd)) != NBG_OK ||
        (rc = sources(ctx, e, pb, m)) != NBG_OK ||
        (rc = miller_range(ctx, m)) != NBG_OK ||
        (rc = orientations(ctx, e, pb, m)) != NBG_OK ||
        (rc = detector_panels(ctx, e, &m->det)) != NBG_OK) {
        return rc;
    }
    return NBG_OK;
}

int nbgi_plan_kernels(nbg_ctx *ctx, nbgi_plan *pl)
{
    const nbgi_lab *m = &pl->lab;
    const nbgi_render *rd = &pl->render;
    if (m->beam.nsrc < 1 || m->gon.nphi < 1 || m->xtal.domains < 1 || m->beam.pos == NULL || m->gon.phi == NULL ||
        (m->xtal.spread > 0 && m->xtal.umat == NULL)) {
        return nbgi_error(ctx, NBG_EINVAL, "the model has %d sources, %d phi steps and %d mosaic domains (each at "
                          "least 1, with their arrays)", m->beam.nsrc, m->gon.nphi, m->xtal.domains);
    }
    const size_t norient = (size_t)m->gon.nphi * (size_t)m->xtal.domains;
    free(pl->src);
    free(pl->abc);
    free(pl->abc_f);
    free(pl->runs);
    pl->runs = NULL;
    pl->src = malloc(sizeof(double) * NBG_SRC_STRIDE * (size_t)m->beam.nsrc);
    pl->abc = malloc(sizeof(double) * 9 * norient);
    pl->abc_f = malloc(sizeof(float) * 9 * norient);
    if (pl->src == NULL || pl->abc == NULL || pl->abc_f == NULL) {
        return nbgi_error(ctx, NBG_ENOMEM, "out of memory for %d sources and %zu crystal orientations", m->beam.nsrc,
                          norient);
    }
    source_frames(&m->beam, pl->src);
    rotate_crystal(m, pl->abc);
    for (size_t i = 0; i < 9 * norient; ++i) {
        pl->abc_f[i] = (float)pl->abc[i];
    }
    int rc;
    if ((rc = kernel_params(ctx, rd, pl)) != NBG_OK || (rc = pixel_list(ctx, rd, pl)) != NBG_OK) {
        return rc;
    }
    return NBG_OK;
}

int nbgi_plan_build(nbg_ctx *ctx, const nbg_experiment *e, nbgi_plan *pl)
{
    memset(pl, 0, sizeof *pl);
    plan_build pb;
    memset(&pb, 0, sizeof pb);
    int rc;
    if ((rc = plan_lab(ctx, e, &pb, &pl->render, pl)) != NBG_OK || (rc = nbgi_plan_kernels(ctx, pl)) != NBG_OK) {
        nbgi_plan_free(pl); /* what the failing step or those before it allocated; the rest is NULL */
        return rc;
    }
    report(e, &pb, pl);
    return NBG_OK;
}

void nbgi_plan_free(nbgi_plan *pl)
{
    if (pl == NULL) {
        return;
    }
    nbgi_lab *m = &pl->lab;
    free(m->beam.pos);
    free(m->beam.lamrel); /* dscale is in its block */
    free(m->det.panels);
    free(m->det.motion_t);
    free(m->gon.phi);
    free(m->xtal.umat);
    free(m->xtal.mos_axis);
    free(m->xtal.mos_angle);
    free(m->xtal.domrot);
    m->beam.pos = m->beam.lamrel = m->beam.dscale = NULL;
    m->det.panels = NULL;
    m->det.motion_t = NULL;
    m->gon.phi = m->xtal.umat = m->xtal.mos_axis = m->xtal.mos_angle = m->xtal.domrot = NULL;
    free(pl->src);
    free(pl->abc);
    free(pl->abc_f);
    free(pl->runs);
    pl->src = pl->abc = NULL;
    pl->abc_f = NULL;
    pl->runs = NULL;
    pl->k.runs = NULL;
    pl->k.panels = NULL;
    pl->k.src = pl->k.abc = NULL;
    pl->k.abc_f = NULL;
}
