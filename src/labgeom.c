/*
 * labgeom.c -- the experiment in DIALS's laboratory frame (nbg_geometry, nbgrad.h): from a report, into an
 * experiment, and its checks.  The model only: the format readers and writers (cbf.c, nxmx.c, expt.c, io.c) use it,
 * it calls none of them (the image reader that recognises a file by its content is imagefile.c).
 */
#include "formats.h"
#include "panels.h"
#include "param.h"
#include "plan.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>

static void set3(double *v, double x, double y, double z)
{
    v[0] = x, v[1] = y, v[2] = z;
}

void nbgi_geometry_init(nbg_geometry *g)
{
    memset(g, 0, sizeof *g);
    set3(g->direction, 0, 0, 1);
    g->wavelength = NAN;
    set3(g->polarization_normal, 0, 1, 0);
    g->polarization_fraction = 0.5;
    set3(g->axis, 1, 0, 0);
    g->nframes = 1;
    g->hdivrange = g->vdivrange = g->hdivstep = g->vdivstep = g->dispersion = NAN;
    g->hdivsteps = g->vdivsteps = g->dispsteps = -1;
    g->round_div = 1;
    g->exposure = 1;
    g->gain = 1;
    g->saturation = NAN;
    g->trusted[0] = g->trusted[1] = NAN;
    snprintf(g->space_group, sizeof g->space_group, " P 1");
}

void nbg_geometry_default(nbg_geometry *g)
{
    if (g != NULL) {
        nbgi_geometry_init(g);
    }
}

static int finite3(const double *v)
{
    return isfinite(v[0]) && isfinite(v[1]) && isfinite(v[2]);
}

/* ---------------------------------------------------------------------------------------------------------- */
/* The multi-axis goniometer (nbg_goniometer): one fold, shared by the list's reader and writer, so that what the
 * writer compares with (the laboratory axis and crystal) is computed as the reader computes it. */

/* The rotation about unit axis u by angle deg, right-handed (row-major). */
static void gon_rotation(const double u[3], double deg, double m[9])
{
    const double t = deg * (M_PI / 180), c = cos(t), s = sin(t), k = 1 - c;
    m[0] = c + u[0] * u[0] * k, m[1] = u[0] * u[1] * k - u[2] * s, m[2] = u[0] * u[2] * k + u[1] * s;
    m[3] = u[1] * u[0] * k + u[2] * s, m[4] = c + u[1] * u[1] * k, m[5] = u[1] * u[2] * k - u[0] * s;
    m[6] = u[2] * u[0] * k - u[1] * s, m[7] = u[2] * u[1] * k + u[0] * s, m[8] = c + u[2] * u[2] * k;
}

void nbgi_mat3_mul(const double a[9], const double b[9], double out[9])
{
    double t[9];
    for (int i = 0; i < 3; ++i)
        for (int j = 0; j < 3; ++j)
            t[3 * i + j] = a[3 * i] * b[j] + a[3 * i + 1] * b[3 + j] + a[3 * i + 2] * b[6 + j];
    memcpy(out, t, sizeof t);
}

void nbgi_mat3_vec(const double m[9], const double v[3], double out[3])
{
    double t[3];
    for (int i = 0; i < 3; ++i)
        t[i] = m[3 * i] * v[0] + m[3 * i + 1] * v[1] + m[3 * i + 2] * v[2];
    memcpy(out, t, sizeof t);
}

/* unit(v) (v's length is checked by nbg_goniometer_derive) */
static void gon_unit(const double v[3], double out[3])
{
    const double n = sqrt(v[0] * v[0] + v[1] * v[1] + v[2] * v[2]);
    for (int i = 0; i < 3; ++i)
        out[i] = v[i] / n;
}

int nbg_goniometer_derive(nbg_ctx *ctx, nbg_goniometer *gn, const char *what)
{
    static const double id[9] = {1, 0, 0, 0, 1, 0, 0, 0, 1};
    if (gn == NULL)
        return nbgi_error(ctx, NBG_EINVAL, "%s: no goniometer", what);
    if (gn->naxes < 0 || gn->naxes > NBG_GONIO_MAX_AXES)
        return nbgi_error(ctx, NBG_EINVAL, "%s: goniometer.naxes: %d axes (0, single-axis, or 1 to %d)", what,
                          gn->naxes, NBG_GONIO_MAX_AXES);
    if (gn->naxes == 0)
        return NBG_OK;
    if (gn->scan_axis < 0 || gn->scan_axis >= gn->naxes)
        return nbgi_error(ctx, NBG_EINVAL, "%s: goniometer.scan_axis: %d is not an axis index from 0 to %d", what,
                          gn->scan_axis, gn->naxes - 1);
    for (int i = 0; i < gn->naxes; ++i) {
        const double *v = gn->axes[i], n = sqrt(v[0] * v[0] + v[1] * v[1] + v[2] * v[2]);
        if (!finite3(v) || !(fabs(n - 1) <= 0.01))
            return nbgi_error(ctx, NBG_EINVAL, "%s: goniometer.axes[%d]: (%g, %g, %g) is not a unit vector (its length "
                              "%g is off 1 by more than 1 %%)", what, i, v[0], v[1], v[2], n);
        if (!(fabs(gn->angles[i]) <= 1e6))
            return nbgi_error(ctx, NBG_EINVAL, "%s: goniometer.angles[%d]: %g is not a usable angle", what, i,
                              gn->angles[i]);
        if (memchr(gn->names[i], '\0', sizeof gn->names[i]) == NULL)
            return nbgi_error(ctx, NBG_EINVAL, "%s: goniometer.names[%d]: not terminated within %zu characters",
                              what, i, sizeof gn->names[i]);
    }
    /* F = R(k-1) ... R(0), S = R(n-1) ... R(k+1): each rotation composed on the left, innermost first */
    double F[9], S[9];
    memcpy(F, id, sizeof id);
    memcpy(S, id, sizeof id);
    for (int i = 0; i < gn->naxes; ++i) {
        if (i == gn->scan_axis)
            continue;
        double u[3], m[9];
        gon_unit(gn->axes[i], u);
        gon_rotation(u, gn->angles[i], m);
        if (i < gn->scan_axis)
            nbgi_mat3_mul(m, F, F);
        else
            nbgi_mat3_mul(m, S, S);
    }
    memcpy(gn->fixed, F, sizeof F);
    memcpy(gn->setting, S, sizeof S);
    return NBG_OK;
}

void nbgi_goniometer_axis(const nbg_goniometer *gn, double axis[3])
{
    double u[3];
    gon_unit(gn->axes[gn->scan_axis], u);
    nbgi_mat3_vec(gn->setting, u, axis);
}

void nbgi_goniometer_fold(const nbg_goniometer *gn, const double in[9], double out[9])
{
    double sf[9];
    nbgi_mat3_mul(gn->setting, gn->fixed, sf);
    for (int i = 0; i < 3; ++i)
        nbgi_mat3_vec(sf, in + 3 * i, out + 3 * i);
}

void nbgi_goniometer_unfold(const nbg_goniometer *gn, const double in[9], double out[9])
{
    double sf[9], sft[9];
    nbgi_mat3_mul(gn->setting, gn->fixed, sf);
    for (int i = 0; i < 3; ++i)
        for (int j = 0; j < 3; ++j)
            sft[3 * i + j] = sf[3 * j + i];
    for (int i = 0; i < 3; ++i)
        nbgi_mat3_vec(sft, in + 3 * i, out + 3 * i);
}

void nbgi_goniometer_turn(nbg_goniometer *gn, const double R[9])
{
    if (gn->naxes <= 0 || gn->naxes > NBG_GONIO_MAX_AXES)
        return;
    for (int i = 0; i < gn->naxes; ++i)
        nbgi_mat3_vec(R, gn->axes[i], gn->axes[i]);
    for (int i = 0; i < 3; ++i)
        nbgi_mat3_vec(R, gn->crystal + 3 * i, gn->crystal + 3 * i);
    (void)nbg_goniometer_derive(NULL, gn, "turning the goniometer"); /* valid before, valid after (a rotation) */
}

void nbgi_goniometer_written(const nbg_geometry *g, nbg_goniometer *gn)
{
    *gn = g->goniometer;
    if (gn->naxes <= 0 || nbg_goniometer_derive(NULL, gn, "") != NBG_OK)
        return;
    double lab[3];
    nbgi_goniometer_axis(gn, lab);
    if (memcmp(lab, g->axis, sizeof lab) != 0) {
        /* the spindle the experiment has (tilted by a refinement) is S e: e = S^T axis, in unit length */
        double e[3];
        for (int i = 0; i < 3; ++i)
            e[i] = gn->setting[i] * g->axis[0] + gn->setting[3 + i] * g->axis[1] + gn->setting[6 + i] * g->axis[2];
        const double n = sqrt(e[0] * e[0] + e[1] * e[1] + e[2] * e[2]);
        for (int i = 0; i < 3; ++i)
            gn->axes[gn->scan_axis][i] = e[i] / n;
    }
}

void nbgi_goniometer_set_axis(nbg_goniometer *gn, int i, const double v[3], double angle, const char *name)
{
    const double len = sqrt(v[0] * v[0] + v[1] * v[1] + v[2] * v[2]);
    for (int j = 0; j < 3; ++j)
        gn->axes[i][j] = fabs(len - 1) <= 0.01 ? v[j] : v[j] / len;
    gn->angles[i] = angle;
    snprintf(gn->names[i], sizeof gn->names[i], "%.31s", name);
}

/* 1 when name is 1 to 31 letters, digits, '_' or '-'. */
static int gon_plain_name(const char *name)
{
    const size_t n = strnlen(name, 32);
    if (n == 0 || n > 31)
        return 0;
    for (size_t i = 0; i < n; ++i) {
        const char c = name[i];
        if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' || c == '-'))
            return 0;
    }
    return 1;
}

void nbgi_goniometer_name(const nbg_goniometer *gn, int i, const char *const *reserved, char out[32])
{
    const char *name = gn->names[i];
    int ok = gon_plain_name(name);
    for (int j = 0; ok && j < gn->naxes; ++j)
        ok = j == i || strncasecmp(gn->names[j], name, 32) != 0; /* (CBF's ids ignore case) */
    for (int j = 0; ok && reserved != NULL && reserved[j] != NULL; ++j)
        ok = strcasecmp(reserved[j], name) != 0;
    if (ok)
        snprintf(out, 32, "%s", name);
    else
        snprintf(out, 32, "GONIOMETER_AXIS_%d", i + 1);
}

/* A unit vector within 1e-6. */
static int unit3(const double *v)
{
    return finite3(v) && fabs(nbgi_norm(v) - 1) < 1e-6;
}

int nbgi_geometry_check(nbg_ctx *ctx, const nbg_geometry *g, const char *what)
{
    if (g == NULL)
        return nbgi_error(ctx, NBG_EINVAL, "%s: no geometry", what);
    if (g->fpixels < 1 || g->spixels < 1 || (double)g->fpixels * g->spixels > 1e10)
        return nbgi_error(ctx, NBG_EINVAL, "%s: the detector size %d x %d pixels is not valid", what, g->fpixels,
                          g->spixels);
    if (!(g->pixel_f > 0 && g->pixel_f < 1e3) || !(g->pixel_s > 0 && g->pixel_s < 1e3))
        return nbgi_error(ctx, NBG_EINVAL, "%s: the pixel size %g x %g mm is not valid", what, g->pixel_f,
                          g->pixel_s);
    const struct {
        const double *v;
        const char *name;
    } axes[] = {{g->fast, "detector fast axis"},
                {g->slow, "detector slow axis"},
                {g->direction, "beam direction"},
                {g->axis, "rotation axis"}};
    for (size_t i = 0; i < sizeof axes / sizeof axes[0]; ++i) {
        if (!unit3(axes[i].v))
            return nbgi_error(ctx, NBG_EINVAL, "%s: the %s (%g, %g, %g) is not a unit vector", what, axes[i].name,
                              axes[i].v[0], axes[i].v[1], axes[i].v[2]);
    }
    if (fabs(nbgi_dot(g->fast, g->slow)) > 1e-6)
        return nbgi_error(ctx, NBG_EINVAL, "%s: the detector fast and slow axes are not orthogonal (cos %g)", what,
                          nbgi_dot(g->fast, g->slow));
    if (!finite3(g->origin) || nbgi_norm(g->origin) > 1e6)
        return nbgi_error(ctx, NBG_EINVAL, "%s: the detector origin (%g, %g, %g) mm is not valid", what,
                          g->origin[0], g->origin[1], g->origin[2]);
    if (!(g->wavelength > 1e-4 && g->wavelength < 1e4))
        return nbgi_error(ctx, NBG_EINVAL, "%s: the wavelength %g A is not valid", what, g->wavelength);
    if (!unit3(g->polarization_normal) || !(g->polarization_fraction >= 0 && g->polarization_fraction <= 1))
        return nbgi_error(ctx, NBG_EINVAL, "%s: the polarization (normal (%g, %g, %g), fraction %g) is not valid",
                          what, g->polarization_normal[0], g->polarization_normal[1], g->polarization_normal[2],
                          g->polarization_fraction);
    if (!isfinite(g->scan_start) || !isfinite(g->scan_width) || fabs(g->scan_start) > 1e6 ||
        fabs(g->scan_width) > 360)
        return nbgi_error(ctx, NBG_EINVAL, "%s: the scan (start %g, width %g deg) is not valid", what, g->scan_start,
                          g->scan_width);
    if (g->nframes < 1 || g->nframes > 100000000)
        return nbgi_error(ctx, NBG_EINVAL, "%s: the scan's image count %d is not valid", what, g->nframes);
    if (!(g->exposure >= 0 && isfinite(g->exposure)))
        return nbgi_error(ctx, NBG_EINVAL, "%s: the exposure time %g s is not valid", what, g->exposure);
    if (!(g->thickness >= 0 && g->thickness < 1e3) || !(g->mu >= 0 && isfinite(g->mu)))
        return nbgi_error(ctx, NBG_EINVAL, "%s: the sensor (thickness %g mm, mu %g /mm) is not valid", what,
                          g->thickness, g->mu);
    if (!isfinite(g->pedestal) || !(g->gain > 0 && isfinite(g->gain)) || isinf(g->saturation))
        return nbgi_error(ctx, NBG_EINVAL, "%s: the detector's pedestal %g, gain %g or saturation %g is not valid",
                          what, g->pedestal, g->gain, g->saturation);
    nbg_goniometer gn = g->goniometer;
    const int grc = nbg_goniometer_derive(ctx, &gn, what);
    if (grc != NBG_OK)
        return grc;
    if (g->has_crystal) {
        for (int i = 0; i < 9; ++i) {
            if (!isfinite(g->real_space[i]))
                return nbgi_error(ctx, NBG_EINVAL, "%s: the crystal's real-space vectors are not finite", what);
        }
        double bxc[3];
        nbgi_cross(g->real_space + 3, g->real_space + 6, bxc);
        const double vol = nbgi_dot(g->real_space, bxc);
        if (!(fabs(vol) > 1e-3))
            return nbgi_error(ctx, NBG_EINVAL, "%s: the crystal's cell is singular (volume %g A^3)", what, vol);
    }
    return NBG_OK;
}

/* The rotation that takes the unit vector b to (0,0,-1): about b x (0,0,-1) by their angle; for b along +z, 180
 * degrees about x (any perpendicular axis would do; x keeps XDS's and DIALS's fast axis). */
static void rotation_to_minus_z(const double b[3], double R[9])
{
    const double t[3] = {0, 0, -1};
    double k[3];
    nbgi_cross(b, t, k);
    const double s = nbgi_norm(k), c = nbgi_dot(b, t);
    if (s < 1e-12) {
        const double sign = c > 0 ? 1 : -1;
        const double Rm[9] = {1, 0, 0, 0, sign, 0, 0, 0, sign};
        memcpy(R, Rm, sizeof Rm);
        return;
    }
    for (int i = 0; i < 3; ++i) k[i] /= s;
    /* Rodrigues: R = c I + s [k]x + (1 - c) k k^T */
    const double K[9] = {0, -k[2], k[1], k[2], 0, -k[0], -k[1], k[0], 0};
    for (int i = 0; i < 3; ++i) {
        for (int j = 0; j < 3; ++j) {
            R[3 * i + j] = (i == j ? c : 0) + s * K[3 * i + j] + (1 - c) * k[i] * k[j];
        }
    }
}

void nbgi_cell_of_vectors(const double v[9], double cell[6])
{
    const double *a = v, *b = v + 3, *c = v + 6;
    const double la = nbgi_norm(a), lb = nbgi_norm(b), lc = nbgi_norm(c);
    const double RTD = 180.0 / 3.14159265358979323846;
    cell[0] = la, cell[1] = lb, cell[2] = lc;
    cell[3] = acos(nbgi_dot(b, c) / lb / lc) * RTD;
    cell[4] = acos(nbgi_dot(a, c) / la / lc) * RTD;
    cell[5] = acos(nbgi_dot(a, b) / la / lb) * RTD;
}

/* The turn nbg_geometry_from_report and nbg_panels_from_report give the description's vectors: none where the
 * experiment's frame is already DIALS's (nbg_experiment.dials_frame: built by nbg_experiment_from_geometry from a list,
 * an NXmx or a CBF file, whose beam dials.index may have tilted off -z), so that a list read and written back keeps
 * its vectors; otherwise the rotation that puts the beam along -z (a nanoBragg convention's frame: MOSFLM's beam runs
 * along +x). */
static void frame_turn(const nbg_experiment *e, const nbg_report *r, double R[9])
{
    if (e->dials_frame && e->convention == NBG_CONV_CUSTOM) {
        static const double I3[9] = {1, 0, 0, 0, 1, 0, 0, 0, 1};
        memcpy(R, I3, sizeof I3);
    } else {
        rotation_to_minus_z(r->beam, R);
    }
}

int nbgi_convention_frame(nbg_ctx *ctx, const nbg_experiment *e, double R[9])
{
    if (e->dials_frame && e->convention == NBG_CONV_CUSTOM) {
        /* already DIALS's frame, which the writers keep (frame_turn): no turn */
        static const double I3[9] = {1, 0, 0, 0, 1, 0, 0, 0, 1};
        memcpy(R, I3, sizeof I3);
        return NBG_OK;
    }
    nbg_experiment probe;
    nbg_experiment_default(&probe);
    probe.convention = e->convention;
    memcpy(probe.beam, e->beam, sizeof probe.beam);
    probe.has_cell = 1;
    probe.cell[0] = 10;
    probe.default_F = 1;
    probe.fpixels = probe.spixels = 4;
    nbg_report r;
    const int rc = nbg_describe(ctx, &probe, &r);
    if (rc != NBG_OK) {
        return rc;
    }
    rotation_to_minus_z(r.beam, R);
    return NBG_OK;
}

static void apply(const double R[9], const double v[3], double out[3])
{
    double w[3];
    for (int i = 0; i < 3; ++i) w[i] = R[3 * i] * v[0] + R[3 * i + 1] * v[1] + R[3 * i + 2] * v[2];
    memcpy(out, w, sizeof w);
}

/* out = R D R^T: the rotation D as a frame turned by R sees it. */
static void turn_similar(const double R[9], const double D[9], double out[9])
{
    double RD[9];
    for (int i = 0; i < 3; ++i)
        for (int j = 0; j < 3; ++j)
            RD[3 * i + j] = R[3 * i] * D[j] + R[3 * i + 1] * D[3 + j] + R[3 * i + 2] * D[6 + j];
    for (int i = 0; i < 3; ++i)
        for (int j = 0; j < 3; ++j)
            out[3 * i + j] = RD[3 * i] * R[3 * j] + RD[3 * i + 1] * R[3 * j + 1] + RD[3 * i + 2] * R[3 * j + 2];
}

int nbg_geometry_from_report(nbg_ctx *ctx, const nbg_experiment *e, const nbg_report *r, int nframes,
                             nbg_geometry *g)
{
    if (e == NULL || r == NULL || g == NULL)
        return nbgi_error(ctx, NBG_EINVAL, "nbg_geometry_from_report: NULL argument");
    if (nframes < 1)
        return nbgi_error(ctx, NBG_EINVAL, "nbg_geometry_from_report: %d frames (at least 1)", nframes);
    nbgi_geometry_init(g);
    double R[9];
    frame_turn(e, r, R);
    g->fpixels = r->fpixels;
    g->spixels = r->spixels;
    g->pixel_f = g->pixel_s = r->pixel;
    apply(R, r->fdet, g->fast);
    apply(R, r->sdet, g->slow);
    apply(R, r->pix0, g->origin);
    for (int i = 0; i < 3; ++i) g->origin[i] *= 1000.0; /* m -> mm */
    double travel[3];
    apply(R, r->beam, travel);
    for (int i = 0; i < 3; ++i) g->direction[i] = -travel[i];
    g->wavelength = r->lambda;
    /* nanoBragg's Kahn factor K along the polarization axis p: the fraction of the intensity polarized along p is
     * (1 + K) / 2, and the polarization plane (beam, p) has the normal b x p. */
    double n[3];
    nbgi_cross(r->beam, r->polar_axis, n);
    const double nn = nbgi_norm(n);
    if (nn > 1e-12) {
        for (int i = 0; i < 3; ++i) n[i] /= nn;
        apply(R, n, g->polarization_normal);
    }
    g->polarization_fraction = e->nopolar ? 0.5 : 0.5 * (1 + e->polarization);
    apply(R, r->spindle, g->axis);
    /* the list's multi-axis goniometer, turned with the frame (the writer turns its scan axis to a refined spindle) */
    g->goniometer = e->goniometer;
    if (!(R[0] == 1 && R[4] == 1 && R[8] == 1))
        nbgi_goniometer_turn(&g->goniometer, R);
    g->scan_start = r->phi0;
    g->scan_width = r->osc;
    g->scan_stated = 2;
    if (e->still && r->osc == 0 && r->phi0 == 0 && nframes == 1) { /* no goniometer: the list's still stays one */
        g->scan_stated = 0;
        g->scan_start = 0;
        g->axis[0] = 1, g->axis[1] = g->axis[2] = 0;
    }
    g->nframes = nframes;
    g->exposure = e->exposure;
    if (e->response_stated) {
        /* the gain and pedestal the list it came from stated: written back, DIALS reads the counts with them */
        g->pedestal = e->response.pedestal;
        g->gain = e->response.gain;
        g->response_stated = 1;
    }
    /* how the sensor was rendered, where there is one: the experiment's, or only the panels' own (nbg_panel.thick) */
    if (e->thick > 0 || nbgi_panels_own_sensor(e->panels, e->npanels)) {
        g->sensor_model = r->sensor_model;
        g->sensor_layers = r->thicksteps;
    }
    if (e->thick > 0) {
        g->thickness = e->thick / 1000.0;
        const double att_um = isnan(e->thick_abs) ? e->thick : e->thick_abs;
        g->mu = (att_um > 0 && isfinite(att_um)) ? 1000.0 / att_um : 0;
        snprintf(g->material, sizeof g->material, "Si");
    }
    g->has_crystal = 1;
    /* the space group as the Hall symbol DIALS's lists carry: as read from a list, or that of the Hermann-Mauguin
     * symbol or number -space_group gave (the settings table, nbgi_space_group_hall); P 1 when unknown */
    char hall[sizeof g->space_group];
    if (e->space_group[0] != 0 && nbgi_space_group_hall(e->space_group, hall, sizeof hall, NULL)) {
        memcpy(g->space_group, hall, sizeof hall);
    }
    /* A still (no oscillation) whose spindle stands at phi0: its crystal is written as the image sees it, turned by
     * phi0, because DIALS predicts a still's spots from the crystal as its list gives it, with no rotation
     * (nbg_experiment_from_geometry reads a still so); the scan still states the angle. */
    const double turn = r->osc == 0 ? r->phi0 * M_PI / 180.0 : 0;
    for (int i = 0; i < 3; ++i) {
        double v[3];
        if (turn != 0)
            nbgi_rotate_axis(r->real_vectors + 3 * i, r->spindle, turn, v);
        else
            memcpy(v, r->real_vectors + 3 * i, sizeof v);
        apply(R, v, g->real_space + 3 * i);
    }
    /* the divergence and spectrum sampled (their axes follow the beam and the polarization, which the description
     * carries) */
    if (!isnan(e->hdivrange) || !isnan(e->vdivrange) || !isnan(e->hdivstep) || !isnan(e->vdivstep) ||
        e->hdivsteps != -1 || e->vdivsteps != -1 || (e->dispersion != 0 && !isnan(e->dispersion)) ||
        e->dispsteps != -1) {
        g->has_beam_sampling = 1;
        g->hdivrange = e->hdivrange, g->vdivrange = e->vdivrange;
        g->hdivstep = e->hdivstep, g->vdivstep = e->vdivstep;
        g->hdivsteps = e->hdivsteps, g->vdivsteps = e->vdivsteps;
        g->dispersion = e->dispersion, g->dispsteps = e->dispsteps;
        g->round_div = e->round_div;
    }
    if (e->ndomain_rot > NBG_MAX_DOMAIN_TURNS)
        return nbgi_error(ctx, NBG_EUNSUP, "describing the experiment: %d mosaic domains with turns of their own, and "
                          "a description carries at most %d", e->ndomain_rot, NBG_MAX_DOMAIN_TURNS);
    if (r->mosaic_domains > 1 || e->ndomain_rot > 0) {
        /* the domains, and the frame their axes were drawn in as seen from the description's: R F */
        g->has_mosaic = 1;
        g->mosaic_spread = isnan(e->mosaic) ? 0 : e->mosaic; /* unset: no spread (blocks turned by their turns) */
        g->mosaic_domains = r->mosaic_domains;
        g->mosaic_seed = e->mosaic_seed;
        static const double I3[9] = {1, 0, 0, 0, 1, 0, 0, 0, 1};
        const double *F = isnan(e->mosaic_frame[0]) ? I3 : e->mosaic_frame;
        for (int i = 0; i < 3; ++i)
            for (int j = 0; j < 3; ++j)
                g->mosaic_frame[3 * i + j] = R[3 * i] * F[j] + R[3 * i + 1] * F[3 + j] + R[3 * i + 2] * F[6 + j];
        /* each domain's own turn D (Rz Ry Rx of its angles, the crystal's at phi 0) as the description sees it:
         * R D R^T, and for a still written turned by phi0 (above) R S D S^T R^T, S that turn */
        double S[9];
        for (int j = 0; j < 3; ++j) {
            const double ej[3] = {j == 0, j == 1, j == 2};
            double col[3];
            if (turn != 0)
                nbgi_rotate_axis(ej, r->spindle, turn, col);
            else
                memcpy(col, ej, sizeof col);
            for (int i = 0; i < 3; ++i)
                S[3 * i + j] = col[i];
        }
        g->ndomain_turns = e->ndomain_rot;
        for (int m = 0; m < e->ndomain_rot; ++m) {
            double D[9], SD[9];
            nbgi_domain_turn_matrix(e->domain_rot + 3 * m, D);
            turn_similar(S, D, SD);
            turn_similar(R, SD, g->domain_turn[m]);
        }
    }
    return nbgi_geometry_check(ctx, g, "describing the experiment");
}

void nbg_geometry_beam_to_minus_z(nbg_geometry *g, nbg_panel *panels, int npanels)
{
    double b[3], R[9];
    for (int i = 0; i < 3; ++i) b[i] = -g->direction[i];
    rotation_to_minus_z(b, R);
    if (R[0] == 1 && R[4] == 1 && R[8] == 1) {
        return; /* the identity (rotation_to_minus_z gives it exactly for a beam along -z) */
    }
    apply(R, g->fast, g->fast);
    apply(R, g->slow, g->slow);
    apply(R, g->origin, g->origin);
    apply(R, g->direction, g->direction);
    apply(R, g->polarization_normal, g->polarization_normal);
    apply(R, g->axis, g->axis);
    for (int i = 0; i < 3; ++i) apply(R, g->real_space + 3 * i, g->real_space + 3 * i);
    nbgi_goniometer_turn(&g->goniometer, R);
    if (g->has_mosaic) {
        double F[9];
        memcpy(F, g->mosaic_frame, sizeof F);
        for (int i = 0; i < 3; ++i)
            for (int j = 0; j < 3; ++j)
                g->mosaic_frame[3 * i + j] = R[3 * i] * F[j] + R[3 * i + 1] * F[3 + j] + R[3 * i + 2] * F[6 + j];
        for (int m = 0; m < g->ndomain_turns; ++m) {
            double D[9];
            memcpy(D, g->domain_turn[m], sizeof D);
            turn_similar(R, D, g->domain_turn[m]);
        }
    }
    for (int k = 0; panels != NULL && k < npanels; ++k) {
        apply(R, panels[k].fast, panels[k].fast);
        apply(R, panels[k].slow, panels[k].slow);
        apply(R, panels[k].origin, panels[k].origin);
    }
}

/* Axes fa, sa and point org (mm) given along the plane's axes (and from its pix0, m) into the laboratory: f, s, o. */
static void plane_to_lab(const double *plane[3], const double pix0[3], const double fa[3], const double sa[3],
                         const double org[3], double f[3], double s[3], double o[3])
{
    for (int x = 0; x < 3; ++x) {
        f[x] = s[x] = 0;
        o[x] = pix0[x] * 1000.0;
        for (int j = 0; j < 3; ++j) {
            f[x] += fa[j] * plane[j][x];
            s[x] += sa[j] * plane[j][x];
            o[x] += org[j] * plane[j][x];
        }
    }
}

/* Which motion group each level's group lies inside: uni[l * (maxid + 1) + id] the motion group of all the panels of
 * group id at level l (nbg_panel.level_group), -1 when they lie in several (the motion then moves no frame of the
 * group); NULL when memory is short.  A reader numbers a level's groups below twice the panels; a larger number
 * (a caller's) is left out, its frame moved by no motion. */
static int *level_motions(const nbg_experiment *e, int *maxid)
{
    const int cap = 2 * e->npanels + 16;
    int m = 0;
    for (int k = 0; k < e->npanels; ++k) {
        for (int l = 0; l < NBG_PANEL_LEVELS; ++l) {
            const int id = e->panels[k].level_group[l];
            m = id > m && id <= cap ? id : m;
        }
    }
    int *uni = malloc(sizeof(int) * NBG_PANEL_LEVELS * ((size_t)m + 1));
    for (size_t i = 0; uni != NULL && i < NBG_PANEL_LEVELS * ((size_t)m + 1); ++i) uni[i] = -2;
    for (int k = 0; uni != NULL && k < e->npanels; ++k) {
        for (int l = 0; l < NBG_PANEL_LEVELS; ++l) {
            const int id = e->panels[k].level_group[l];
            if (id < 0 || id > m)
                continue;
            int *u = &uni[l * (m + 1) + id];
            *u = *u == -2 || *u == e->panels[k].group ? e->panels[k].group : -1;
        }
    }
    *maxid = m;
    return uni;
}

/* Panel k's group frame at level l (nbg_panel.level_frame, in the panels' frame) placed as its panels are: moved
 * with the motion of panel k's motion group where the level's group lies inside it, then into the laboratory (the
 * plane's axes and pix0 for PLANE panels), then turned by R (frame_turn); a level with no frame stays zero. */
static void place_level_frame(const nbg_experiment *e, const nbgi_placed *pp, const int *uni, int maxid, int k, int l,
                              const double *plane[3], const double pix0[3], const double R[9], double out[9])
{
    const double *F = e->panels[k].level_frame[l];
    if (F[0] * F[0] + F[1] * F[1] + F[2] * F[2] == 0) {
        memset(out, 0, 9 * sizeof *out);
        return;
    }
    double v[9];
    memcpy(v, F, sizeof v);
    const int id = e->panels[k].level_group[l];
    if (e->nmotions > 0 && id >= 0 && id <= maxid && uni[l * (maxid + 1) + id] == e->panels[k].group) {
        const int g = e->panels[k].group;
        const double *M = pp->R + 9 * g, *c = pp->pivot + 3 * g, *sh = e->motions[g].shift;
        double rel[3], w[9];
        for (int x = 0; x < 3; ++x) rel[x] = v[6 + x] - c[x];
        for (int x = 0; x < 3; ++x) {
            w[x] = M[3 * x] * v[0] + M[3 * x + 1] * v[1] + M[3 * x + 2] * v[2];
            w[3 + x] = M[3 * x] * v[3] + M[3 * x + 1] * v[4] + M[3 * x + 2] * v[5];
            w[6 + x] = c[x] + M[3 * x] * rel[0] + M[3 * x + 1] * rel[1] + M[3 * x + 2] * rel[2] + sh[x];
        }
        memcpy(v, w, sizeof v);
    }
    if (e->panel_frame == NBG_PANELS_PLANE) {
        double w[9];
        plane_to_lab(plane, pix0, v, v + 3, v + 6, w, w + 3, w + 6);
        memcpy(v, w, sizeof v);
    }
    apply(R, v, out);
    apply(R, v + 3, out + 3);
    apply(R, v + 6, out + 6);
}

int nbg_panels_from_report(nbg_ctx *ctx, const nbg_experiment *e, const nbg_report *r, nbg_panel *panels,
                           int npanels)
{
    if (e == NULL || r == NULL || panels == NULL)
        return nbgi_error(ctx, NBG_EINVAL, "nbg_panels_from_report: NULL argument");
    if (e->npanels < 1 || e->panels == NULL || npanels != e->npanels)
        return nbgi_error(ctx, NBG_EINVAL, "nbg_panels_from_report: room for %d panels, and the experiment has %d",
                          npanels, e->panels == NULL ? 0 : e->npanels);
    double R[9];
    frame_turn(e, r, R);
    const double *plane[3] = {r->fdet, r->sdet, r->odet};
    /* the panels as the renderer places them (their motions applied) */
    nbgi_placed pp;
    const int rc = nbgi_panel_place(ctx, e, &pp);
    if (rc != NBG_OK)
        return rc;
    int maxid = 0, frames = 0;
    for (int k = 0; k < npanels; ++k)
        frames |= e->panels[k].has_level_frames;
    int *uni = e->nmotions > 0 && frames ? level_motions(e, &maxid) : NULL;
    if (e->nmotions > 0 && frames && uni == NULL) {
        nbgi_panel_place_free(&pp);
        return nbgi_error(ctx, NBG_ENOMEM, "out of memory for the panels' groups");
    }
    for (int k = 0; k < npanels; ++k) {
        const nbg_panel *p = &e->panels[k];
        nbg_panel *q = &panels[k];
        const double *fa = pp.v[k].fa, *sa = pp.v[k].sa, *org = pp.v[k].org;
        double f[3], s[3], o[3];
        if (e->panel_frame == NBG_PANELS_PLANE) {
            /* components along the plane's axes, the origin an offset (mm) from the plane's pix0 (m), as the
             * renderer places them (panels.c) */
            plane_to_lab(plane, r->pix0, fa, sa, org, f, s, o);
        } else {
            memcpy(f, fa, sizeof f);
            memcpy(s, sa, sizeof s);
            memcpy(o, org, sizeof o);
        }
        *q = *p;
        if (p->thick > 0 && p->thick_abs == 0) {
            /* a sensor of its own: its attenuation length as the renderer takes it (src/plan.c) */
            q->thick_abs = isnan(e->thick_abs) ? p->thick : isinf(e->thick_abs) ? 0 : e->thick_abs;
        }
        apply(R, f, q->fast);
        apply(R, s, q->slow);
        apply(R, o, q->origin);
        q->pixel = pp.v[k].px;
        for (int l = 0; p->has_level_frames && l < NBG_PANEL_LEVELS; ++l) {
            place_level_frame(e, &pp, uni, maxid, k, l, plane, r->pix0, R, q->level_frame[l]);
        }
    }
    free(uni);
    nbgi_panel_place_free(&pp);
    return NBG_OK;
}

void nbgi_geometry_of_panel(const nbg_geometry *g, const nbg_panel *p, nbg_geometry *out)
{
    *out = *g;
    out->fpixels = p->fpixels;
    out->spixels = p->spixels;
    out->pixel_f = out->pixel_s = p->pixel;
    memcpy(out->fast, p->fast, sizeof out->fast);
    memcpy(out->slow, p->slow, sizeof out->slow);
    memcpy(out->origin, p->origin, sizeof out->origin);
}

int nbgi_panels_check(nbg_ctx *ctx, const nbg_geometry *g, const nbg_panel *panels, int npanels, const char *what)
{
    if (npanels < 0 || (npanels > 0 && panels == NULL) || npanels > 1000000)
        return nbgi_error(ctx, NBG_EINVAL, "%s: %d panels%s", what, npanels, panels == NULL ? " and no table" : "");
    for (int k = 0; k < npanels; ++k) {
        nbg_geometry gk;
        nbgi_geometry_of_panel(g, &panels[k], &gk);
        char wk[700];
        if (panels[k].name[0] != '\0')
            snprintf(wk, sizeof wk, "%s, panel %d (%.31s)", what, k, panels[k].name);
        else
            snprintf(wk, sizeof wk, "%s, panel %d", what, k);
        const int rc = nbgi_geometry_check(ctx, &gk, wk);
        if (rc != NBG_OK)
            return rc;
        if (panels[k].raw_offset[0] < 0 || panels[k].raw_offset[1] < 0)
            return nbgi_error(ctx, NBG_EINVAL, "%s: the raw offset (%d, %d) is negative (where its pixels start in "
                              "the image file)", wk, panels[k].raw_offset[0], panels[k].raw_offset[1]);
    }
    return NBG_OK;
}

/* The crystal of g in e as DIALS holds it: U and the cell, the crystal U B(cell) with B the Busing-Levy matrix
 * (nbgi_cell_ub_d), which gives g's vectors back to rounding, so that the cell parameters are the crystal's own
 * (refinable, and reported as what they are) and the orientation U; the misset starts at 0.  A basis that is not
 * right-handed has no rotation U: it is kept as the A matrix, which renders the same crystal but fixes its cell. */
static void crystal_from_vectors(nbg_ctx *ctx, const nbg_geometry *g, nbg_experiment *e)
{
    const double *a = g->real_space, *b = g->real_space + 3, *c = g->real_space + 6;
    const double DTR = 3.14159265358979323846 / 180.0;
    double cell[6], rad[6];
    nbgi_cell_of_vectors(g->real_space, cell);
    for (int i = 0; i < 6; ++i) {
        rad[i] = i < 3 ? cell[i] : cell[i] * DTR;
    }
    /* U = A* B^-1: A*'s columns g's reciprocal vectors, B's those of the cell in B's frame (U = 1) */
    static const double I3[9] = {1, 0, 0, 0, 1, 0, 0, 0, 1};
    double B[3][3], Bi[9], Bm[9], rec[3][3];
    const double Vc = nbgi_cell_ub_d(rad, I3, B[0], B[1], B[2]);
    nbgi_cross(b, c, rec[0]);
    nbgi_cross(c, a, rec[1]);
    nbgi_cross(a, b, rec[2]);
    const double Vg = nbgi_dot(a, rec[0]);
    for (int i = 0; i < 3; ++i) {
        for (int j = 0; j < 3; ++j) {
            Bm[3 * i + j] = B[j][i];
        }
    }
    int ok = isfinite(Vc) && Vc > 0 && Vg > 0 && nbgi_inverse3(Bm, Bi) == 1;
    double U[9] = {0};
    for (int i = 0; ok && i < 3; ++i) {
        for (int j = 0; j < 3; ++j) {
            for (int k = 0; k < 3; ++k) {
                U[3 * i + j] += rec[k][i] / Vg * Bi[3 * k + j];
            }
        }
    }
    nbg_experiment trial = *e;
    /* the structure factors do not enter the crystal's vectors; a run whose -hkl is read later (default_F 0 until
     * then) must not fail the check */
    trial.default_F = 1;
    trial.hkl = NULL;
    if (ok) {
        trial.has_cell = 1;
        trial.has_mat = 0;
        trial.has_umat = 1;
        memcpy(trial.umat, U, sizeof U);
        memcpy(trial.cell, cell, sizeof cell);
        trial.misset[0] = trial.misset[1] = trial.misset[2] = 0;
        trial.misset_random = 0;
        nbg_report r;
        ok = nbg_describe(ctx, &trial, &r) == NBG_OK;
        const double len = fmax(cell[0], fmax(cell[1], cell[2]));
        for (int i = 0; ok && i < 9; ++i) ok = fabs(r.real_vectors[i] - g->real_space[i]) <= 1e-9 * len;
    }
    if (ok) {
        e->has_cell = 1;
        e->has_mat = 0;
        e->has_umat = 1;
        memcpy(e->umat, U, sizeof U);
        memcpy(e->cell, cell, sizeof e->cell);
        e->misset[0] = e->misset[1] = e->misset[2] = 0;
        e->misset_random = 0;
        return;
    }
    /* the reciprocal vectors, times the wavelength: the MOSFLM A matrix (rows x, y, z; columns a*, b*, c*) */
    double bxc[3], cxa[3], axb[3];
    nbgi_cross(b, c, bxc);
    nbgi_cross(c, a, cxa);
    nbgi_cross(a, b, axb);
    const double V = nbgi_dot(a, bxc);
    for (int i = 0; i < 3; ++i) {
        e->mat[3 * i + 0] = bxc[i] / V * g->wavelength;
        e->mat[3 * i + 1] = cxa[i] / V * g->wavelength;
        e->mat[3 * i + 2] = axb[i] / V * g->wavelength;
    }
    e->has_mat = 1;
    e->has_cell = 0;
    e->has_umat = 0;
    e->misset[0] = e->misset[1] = e->misset[2] = 0;
    e->misset_random = 0;
}

void nbgi_crystal_from_vectors(nbg_ctx *ctx, const double real_space[9], double wavelength, nbg_experiment *e)
{
    nbg_geometry g;
    nbgi_geometry_init(&g);
    memcpy(g.real_space, real_space, sizeof g.real_space);
    g.wavelength = wavelength;
    g.has_crystal = 1;
    crystal_from_vectors(ctx, &g, e);
}

int nbg_geometry_reindex(nbg_ctx *ctx, nbg_geometry *g, const double reference[9], int M[9], double *misfit)
{
    if (g == NULL || reference == NULL || M == NULL) {
        return nbgi_error(ctx, NBG_EINVAL, "nbg_geometry_reindex: NULL argument");
    }
    if (!g->has_crystal) {
        return nbgi_error(ctx, NBG_EINVAL, "there is no crystal to re-express in another setting");
    }
    for (int i = 0; i < 9; ++i) {
        if (!isfinite(reference[i]) || !isfinite(g->real_space[i])) {
            return nbgi_error(ctx, NBG_EINVAL, "a real-space vector is not finite");
        }
    }
    /* reference row i = sum_j F_ij (row j of g), so F_ij = reference_i . (reciprocal vector j of g) */
    const double *a = g->real_space, *b = g->real_space + 3, *c = g->real_space + 6;
    double rec[3][3];
    nbgi_cross(b, c, rec[0]);
    nbgi_cross(c, a, rec[1]);
    nbgi_cross(a, b, rec[2]);
    const double V = nbgi_dot(a, rec[0]);
    double rx[3];
    nbgi_cross(reference + 3, reference + 6, rx);
    const double Vref = nbgi_dot(reference, rx);
    if (!(fabs(V) > 0) || !(fabs(Vref) > 0)) {
        return nbgi_error(ctx, NBG_EINVAL, "a basis is singular (cell volume %g and %g A^3)", V, Vref);
    }
    double dev = 0;
    for (int i = 0; i < 3; ++i) {
        for (int j = 0; j < 3; ++j) {
            const double f = nbgi_dot(reference + 3 * i, rec[j]) / V;
            if (!(fabs(f) < 1000)) {
                return nbgi_error(ctx, NBG_EINVAL, "the reference's basis is not this lattice's (an element of the "
                                  "change of basis is %g)", f);
            }
            M[3 * i + j] = (int)lround(f);
            dev = fmax(dev, fabs(f - M[3 * i + j]));
        }
    }
    /* a unimodular integer matrix takes one basis of a lattice to another; the rounding's deviation measures how
     * far the two crystals are from one lattice (orientation and cell: 0.25 is several degrees) */
    const long det = (long)M[0] * (M[4] * M[8] - M[5] * M[7]) - (long)M[1] * (M[3] * M[8] - M[5] * M[6]) +
                     (long)M[2] * (M[3] * M[7] - M[4] * M[6]);
    if (dev > 0.25) {
        return nbgi_error(ctx, NBG_EINVAL, "the reference's basis vectors are not integer combinations of this "
                          "crystal's (largest deviation %.3f of a cell): not the same lattice, or oriented more than "
                          "a few degrees apart", dev);
    }
    if (det != 1) {
        return nbgi_error(ctx, NBG_EINVAL, "the change of basis to the reference's has determinant %ld, not 1 (%s)",
                          det, det == -1 ? "a basis of the opposite hand" : "a sub- or super-lattice");
    }
    double out[9];
    for (int i = 0; i < 3; ++i) {
        for (int k = 0; k < 3; ++k) {
            out[3 * i + k] = M[3 * i] * a[k] + M[3 * i + 1] * b[k] + M[3 * i + 2] * c[k];
        }
    }
    memcpy(g->real_space, out, sizeof out);
    if (misfit != NULL) {
        *misfit = dev;
    }
    return NBG_OK;
}

int nbg_experiment_from_geometry(nbg_ctx *ctx, const nbg_geometry *g, nbg_experiment *e)
{
    if (g == NULL || e == NULL)
        return nbgi_error(ctx, NBG_EINVAL, "nbg_experiment_from_geometry: NULL argument");
    int rc = nbgi_geometry_check(ctx, g, "using the geometry");
    if (rc != NBG_OK)
        return rc;
    if (fabs(g->pixel_f - g->pixel_s) > 1e-9 * g->pixel_f)
        return nbgi_error(ctx, NBG_EINVAL, "the pixels are %g x %g mm: nbgrad's detector has square pixels",
                          g->pixel_f, g->pixel_s);
    double b[3], o[3];
    for (int i = 0; i < 3; ++i) b[i] = -g->direction[i];
    nbgi_cross(g->fast, g->slow, o);
    double close = nbgi_dot(g->origin, o);
    if (close < 0) {
        /* the normal must point away from the sample: nanoBragg's sensor layers and close distance go along it */
        for (int i = 0; i < 3; ++i) o[i] = -o[i];
        close = -close;
    }
    if (!(close > 1e-6))
        return nbgi_error(ctx, NBG_EINVAL, "the detector plane passes through the sample (distance %g mm)", close);
    if (!(nbgi_dot(b, o) > 1e-6))
        return nbgi_error(ctx, NBG_EINVAL, "the beam does not reach the detector plane (it is parallel to it or "
                          "points away from it)");
    e->convention = NBG_CONV_CUSTOM;
    e->dials_frame = 1; /* its vectors are g's, in DIALS's frame: written back as they are */
    e->pivot = NBG_PIVOT_SAMPLE;
    e->pixel = g->pixel_f;
    e->fpixels = g->fpixels;
    e->spixels = g->spixels;
    e->detsize_f = g->fpixels * g->pixel_f;
    e->detsize_s = g->spixels * g->pixel_s;
    /* the sample pivot puts pix0 at -Fclose f - Sclose s + close o, which is g's origin exactly */
    e->Xbeam = -nbgi_dot(g->origin, g->fast);
    e->Ybeam = -nbgi_dot(g->origin, g->slow);
    e->close_distance = close;
    e->distance = close / nbgi_dot(b, o);
    e->Xclose = e->Yclose = e->ORGX = e->ORGY = NAN;
    memcpy(e->fdet, g->fast, sizeof e->fdet);
    memcpy(e->sdet, g->slow, sizeof e->sdet);
    memcpy(e->odet, o, sizeof e->odet);
    memcpy(e->beam, b, sizeof e->beam);
    memcpy(e->spindle, g->axis, sizeof e->spindle);
    e->goniometer = g->goniometer; /* handed back to the writers by nbg_geometry_from_report */
    /* the polarization axis p lies in the polarization plane: p = n x b */
    nbgi_cross(g->polarization_normal, b, e->polar_axis);
    e->polarization = 2 * g->polarization_fraction - 1;
    for (int i = 0; i < 3; ++i) e->det_rot[i] = 0;
    e->twotheta = 0;
    e->twotheta_axis[0] = NAN;
    /* the offsets from a model (the beam shift, the spindle tilts: the table's) start from the file's */
    for (int p = 0; p < NBG_NPARAMS; ++p) {
        if (nbgi_param_is_offset(p)) {
            nbg_param_set(e, p, 0);
        }
    }
    e->lambda = g->wavelength;
    /* a still (a scan of width 0): DIALS predicts its spots from the crystal as the list gives it, with no rotation;
     * the start angle the scan states is where the goniometer stood (89.9997 deg in a list of dials.import), not a
     * turn of the crystal */
    e->phi0 = g->scan_width == 0 ? 0 : g->scan_start;
    e->osc = g->scan_width;
    if (g->scan_width == 0 && e->phisteps < 0 && isnan(e->phistep)) {
        /* one orientation: nanoBragg's rule for an oscillation given as 0 (-osc 0) takes two steps of 0 deg,
         * which rendered a still twice over (the same image, at twice the cost) */
        e->phisteps = 1;
    }
    e->still = g->scan_stated == 0 && g->nframes == 1 && g->scan_width == 0;
    e->exposure = g->exposure;
    /* the gain and pedestal a DIALS list states (not dxtbx's defaults): how DIALS reads the counts, which
     * nbg_observed_read takes over the observed file's */
    e->response_stated = g->response_stated != 0;
    if (g->response_stated) {
        e->response.pedestal = g->pedestal;
        e->response.gain = g->gain;
    }
    if (g->thickness >= 1e-6) {
        e->thick = g->thickness * 1000.0;
        e->thick_abs = g->mu > 0 ? 1000.0 / g->mu : INFINITY;
        if (e->sensor_model == NBG_SENSOR_AUTO) {
            /* a real sensor: its photons absorbed where they are, unless nbgrad wrote the list with its own */
            e->sensor_model = g->sensor_model == NBG_SENSOR_NANOBRAGG ? NBG_SENSOR_NANOBRAGG : NBG_SENSOR_PHYSICAL;
        }
    } else {
        /* no sensor model: a thickness below a nanometre is a placeholder (nbgrad's NXmx writes 1e-9 mm for "none",
         * because dxtbx refuses 0, and DIALS copies it into its experiment lists) */
        e->thick = 0;
    }
    /* how nbgrad rendered the sensor, where it wrote the list: also when only panels after the first have one (their
     * own, which the caller gives e with the panels) */
    if (g->sensor_model != NBG_SENSOR_AUTO && e->sensor_model == NBG_SENSOR_AUTO) {
        e->sensor_model = g->sensor_model;
    }
    if (g->sensor_layers > 0 && e->thicksteps < 0) {
        e->thicksteps = g->sensor_layers;
    }
    if (g->has_crystal) {
        crystal_from_vectors(ctx, g, e);
        /* the list's space group (a Hall symbol, DIALS's form): it constrains a refinement of the cell; P 1 is none */
        const char *sg = g->space_group;
        while (*sg == ' ') {
            ++sg;
        }
        if (strcmp(sg, "P 1") == 0 || *sg == 0) {
            e->space_group[0] = 0;
        } else {
            /* a Hall symbol is read as one when it begins with a space or '-' (nbg_cell_constraints_get) */
            const int hall = g->space_group[0] == ' ' || g->space_group[0] == '-';
            snprintf(e->space_group, sizeof e->space_group, "%s%.30s", hall ? "" : " ", g->space_group);
        }
    }
    /* the mosaic domains a list nbgrad wrote carries: the same spread, count and seed, drawn in the frame the list
     * says (so that they sit on the crystal where they sat); without them the frame is this one */
    if (g->has_beam_sampling) {
        e->hdivrange = g->hdivrange, e->vdivrange = g->vdivrange;
        e->hdivstep = g->hdivstep, e->vdivstep = g->vdivstep;
        e->hdivsteps = g->hdivsteps, e->vdivsteps = g->vdivsteps;
        e->dispersion = g->dispersion, e->dispsteps = g->dispsteps;
        e->round_div = g->round_div;
    }
    e->mosaic_frame[0] = NAN;
    if (g->has_mosaic) {
        e->mosaic = g->mosaic_spread;
        e->mosaic_domains = g->mosaic_domains;
        e->mosaic_seed = g->mosaic_seed;
        memcpy(e->mosaic_frame, g->mosaic_frame, sizeof e->mosaic_frame);
    }
    return NBG_OK;
}

/* Detectors whose files describe one flat panel where the detector is several: dxtbx places their modules from
 * tables of its own (the instrument's drawings, per serial number or beamline), which the files do not carry, so
 * nbgrad cannot place them from the file.  Each row: the format, what its detector name (nbg_geometry.detector)
 * contains (two words, case-insensitive; the second may be NULL), the image size it has (0: any), and the detector
 * in words. */
static const struct {
    const char *format, *word1, *word2;
    int fpixels, spixels;
    const char *what;
} unplaced_detectors[] = {
    {"cbf", "PILATUS", "12M", 0, 0,
     "a Pilatus 12M (Diamond I23's: 24 rows of modules on a cylinder about the sample)"},
    {"smv", "TimePix_SU", NULL, 512, 512,
     "a TimePix_SU quad (4 Timepix chips, their edge pixels 3 times as wide as the others)"},
};

static int contains_word(const char *s, const char *w)
{
    const size_t n = strlen(w);
    for (; *s != '\0'; ++s) {
        if (strncasecmp(s, w, n) == 0)
            return 1;
    }
    return 0;
}

int nbgi_unplaced_detector(const char *format, const nbg_geometry *g, const char *path, char *msg, size_t size)
{
    for (size_t i = 0; i < sizeof unplaced_detectors / sizeof unplaced_detectors[0]; ++i) {
        const __typeof__(unplaced_detectors[0]) *u = &unplaced_detectors[i];
        if (strcmp(u->format, format) != 0 || !contains_word(g->detector, u->word1) ||
            (u->word2 != NULL && !contains_word(g->detector, u->word2)) ||
            (u->fpixels != 0 && (g->fpixels != u->fpixels || g->spixels != u->spixels)))
            continue;
        if (msg != NULL && size > 0)
            snprintf(msg, size, "%s: its detector is \"%s\", %s.  The header describes one flat panel of %d x %d "
                     "pixels, which this detector is not, and the file does not say where its modules lie (dxtbx "
                     "places them from a table of its own): nbgrad will not guess.  Import the file with DIALS "
                     "(dials.import %s) and pass the list with the image: -expt imported.expt -observed %s", path,
                     g->detector, u->what, g->fpixels, g->spixels, path, path);
        return 1;
    }
    return 0;
}
