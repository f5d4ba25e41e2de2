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

/* Whether any of the n panels has a sensor of its own (nbg_panel.thick > 0); panels may be NULL. */
static inline int nbgi_panels_own_sensor(const nbg_panel *panels, int n)
{
    for (int k = 0; panels != NULL && k < n; ++k) {
        if (panels[k].thick > 0) {
            return 1;
        }
    }
    return 0;
}

/* The panels of e placed in their frame (motions applied): unit axes, origin (mm) and pixel size (mm) per panel,
 * and with motions the derivatives of the 12 numbers (origin, fast, slow, normal) along the 6 components of the
 * panel's group (dv[72 k + 12 c + i]: shift per mm, rotation per degree). */
typedef struct {
    double fa[3], sa[3], na[3], org[3], px;
} nbgi_placed_panel;
typedef struct {
    int n, nmotions;
    nbgi_placed_panel *v;
    double *dv;
    double *pivot, *R; /* with motions: each group's pivot (3, mm) and rotation (9, row-major), as applied; a group
                          without panels: zero */
} nbgi_placed;
/* NBG_EINVAL naming the panel or motion for a bad one (see nbgi_plan_panels); free with nbgi_panel_place_free. */
int nbgi_panel_place(nbg_ctx *ctx, const nbg_experiment *e, nbgi_placed *pp);
void nbgi_panel_place_free(nbgi_placed *pp);

/* e's panels, in the laboratory frame (NBG_PANELS_LAB, as an experiment list gives them), re-expressed in the frame
 * of the detector plane the experiment places (NBG_PANELS_PLANE: components along its fast, slow and normal axes,
 * origins in mm from its pix0; their groups' frames, nbg_panel.level_frame, too; panels is the writable table e
 * points to), so that they render where they were and move with the plane: the detector's distance, beam shifts,
 * turns (det_tau1-3, det_rotx/y/z) and two-theta then move the whole detector as one rigid body, whose frame is the
 * plane's (for a list, the panel the beam meets, as DIALS's multi-panel detector parameterisation takes it).
 * Nothing for PLANE panels.  NBG_EINVAL when the plane cannot be placed. */
int nbgi_panels_to_plane(nbg_ctx *ctx, nbg_experiment *e, nbg_panel *panels);

/* The kernels' table of e's panels, placed by the detector plane (pix0, m; unit f, s, o) for NBG_PANELS_PLANE
 * panels: *out (malloc'd, the caller frees it), the image's pixel count and the panels' row count.  Refused, naming
 * the panel: bad pixel counts or size, non-finite, zero-length, parallel or non-perpendicular axes, a plane through
 * or behind the sample, two panels that overlap, a motion group out of range, a non-finite motion.  With motions,
 * *motion_tangents (malloc'd, else NULL): for panel k and component c of its group's motion, the tangent of the
 * panel's 13 detector quantities (pix0, f, s, o, close distance; nbgi_adjacc's order) at
 * [(6 k + c) * NBGI_PANEL_NT]. */
int nbgi_plan_panels(nbg_ctx *ctx, const nbg_experiment *e, const double pix0[3], const double f[3],
                     const double s[3], const double o[3], nbgi_kpanel **out, double **motion_tangents, long *npix,
                     int *nrows);

#endif
