/*
 * labgeom.c -- the experiment in DIALS's laboratory frame (nbg_geometry, nbgrad.h): from a report, into an
 * experiment, its checks, and the image reader that recognises every format by its content.
 */
#include "formats.h"
#include "plan.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
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
    g->exposure = 1;
    g->gain = 1;
    g->saturation = NAN;
    snprintf(g->space_group, sizeof g->space_group, " P 1");
}

static int finite3(const double *v)
{
    return isfinite(v[0]) && isfinite(v[1]) && isfinite(v[2]);
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
