/*
 * panels.h -- multi-panel detectors in the plan (src/panels.c).
 */
#ifndef NBG_PANELS_H
#define NBG_PANELS_H

#include "internal.h"
#include "physics.h"

#include <limits.h>

/* The most pixels along one side of a detector or panel. */
#define NBG_MAX_SIDE 10000000

/* The kernels' table of e's panels, placed by the detector plane (pix0, m; unit f, s, o) for NBG_PANELS_PLANE
 * panels: *out (malloc'd, the caller frees it), the image's pixel count and the panels' row count.  Refused, naming
 * the panel: bad pixel counts or size, non-finite, zero-length, parallel or non-perpendicular axes, a plane through
 * or behind the sample, two panels that overlap. */
int nbgi_plan_panels(nbg_ctx *ctx, const nbg_experiment *e, const double pix0[3], const double f[3],
                     const double s[3], const double o[3], nbgi_kpanel **out, long *npix, int *nrows);

#endif
