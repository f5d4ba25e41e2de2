/*
 * panels.c -- multi-panel detectors: the panels' kernel geometry from an experiment (checked: degenerate panels,
 * panels facing away from or cutting through the sample, overlapping panels), and the built-in layouts.
 *
 * A panel given in the detector plane's frame is a fixed linear map of the plane's vectors (its origin an offset
 * along them, its axes combinations of them), which the adjoint and tangent kernels use to carry the plane's
 * parameters (distance, beam centre, rotations) to every panel; a panel given in the lab frame is fixed.
 */
#include "panels.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static double dot3(const double a[3], const double b[3]) { return a[0] * b[0] + a[1] * b[1] + a[2] * b[2]; }

static void cross3(const double a[3], const double b[3], double out[3])
{
    out[0] = a[1] * b[2] - a[2] * b[1];
    out[1] = a[2] * b[0] - a[0] * b[2];
    out[2] = a[0] * b[1] - a[1] * b[0];
}

/* The name a message gives panel k: "panel 3 (name)" or "panel 3". */
static const char *panel_label(const nbg_experiment *e, int k, char buf[64])
{
    const nbg_panel *q = &e->panels[k];
    if (q->name[0] != '\0') {
        snprintf(buf, 64, "panel %d (%.31s)", k, q->name);
    } else {
        snprintf(buf, 64, "panel %d", k);
    }
    return buf;
}

/* A panel's rectangle in the lab (m) for the overlap test: corner, unit axes, side lengths, normal, centre and
 * half-diagonal. */
typedef struct {
    double P[3], u[3], v[3], n[3], Lu, Lv, C[3], rad;
} rect;

static void rect_of(const nbgi_kpanel *q, rect *r)
{
    for (int x = 0; x < 3; ++x) {
        r->P[x] = q->pix0[x];
        r->u[x] = q->fdet[x];
        r->v[x] = q->sdet[x];
        r->n[x] = q->odet[x];
    }
    r->Lu = q->fpixels * q->pixel;
    r->Lv = q->spixels * q->pixel;
    for (int x = 0; x < 3; ++x) {
        r->C[x] = r->P[x] + 0.5 * r->Lu * r->u[x] + 0.5 * r->Lv * r->v[x];
    }
    r->rad = 0.5 * sqrt(r->Lu * r->Lu + r->Lv * r->Lv);
}

/* Clips the interval [*t0, *t1] of the line X0 + t d by lo <= (X - P) . a <= hi. */
static void clip(const double X0[3], const double d[3], const double P[3], const double a[3], double lo, double hi,
                 double *t0, double *t1)
{
    double w[3];
    for (int x = 0; x < 3; ++x) {
        w[x] = X0[x] - P[x];
    }
    const double base = dot3(w, a), rate = dot3(d, a);
    if (fabs(rate) < 1e-12) {
        if (base < lo || base > hi) {
            *t1 = -INFINITY; /* the line runs outside the strip: empty */
        }
        return;
    }
    double ta = (lo - base) / rate, tb = (hi - base) / rate;
    if (ta > tb) {
        const double t = ta;
        ta = tb;
        tb = t;
    }
    *t0 = fmax(*t0, ta);
    *t1 = fmin(*t1, tb);
}

/* Whether two rectangles share more than a touch: each is shrunk by tol on every side first, so that panels
 * tiling a plane edge to edge (or meeting along an edge at an angle) do not count, whatever the rounding. */
static int rects_overlap(const rect *a, const rect *b, double tol)
{
    double dc[3];
    for (int x = 0; x < 3; ++x) {
        dc[x] = b->C[x] - a->C[x];
    }
    if (sqrt(dot3(dc, dc)) > a->rad + b->rad) {
        return 0;
    }
    double d[3];
    cross3(a->n, b->n, d);
    const double dd = dot3(d, d);
    if (dd < 1e-20) {
        double w[3];
        for (int x = 0; x < 3; ++x) {
            w[x] = b->P[x] - a->P[x];
        }
        if (fabs(dot3(w, a->n)) > tol) {
            return 0; /* parallel planes apart */
        }
        /* one plane: separating axes are the four edge directions (both rectangles are convex) */
        const double *axes[4] = {a->u, a->v, b->u, b->v};
        for (int i = 0; i < 4; ++i) {
            double lo[2] = {INFINITY, INFINITY}, hi[2] = {-INFINITY, -INFINITY};
            const rect *rr[2] = {a, b};
            for (int j = 0; j < 2; ++j) {
                for (int c = 0; c < 4; ++c) {
                    const double fu = (c & 1) ? rr[j]->Lu : 0, fv = (c & 2) ? rr[j]->Lv : 0;
                    double X[3];
                    for (int x = 0; x < 3; ++x) {
                        X[x] = rr[j]->P[x] + fu * rr[j]->u[x] + fv * rr[j]->v[x];
                    }
                    const double t = dot3(X, axes[i]);
                    lo[j] = fmin(lo[j], t);
                    hi[j] = fmax(hi[j], t);
                }
            }
            if (fmin(hi[0], hi[1]) - fmax(lo[0], lo[1]) <= 2 * tol) {
                return 0;
            }
        }
        return 1;
    }
    /* crossing planes: the line they share, X0 + t d (d unit), clipped by both shrunk rectangles */
    const double ha = dot3(a->n, a->P), hb = dot3(b->n, b->P);
    double t1v[3], t2v[3], X0[3];
    cross3(b->n, d, t1v);
    cross3(d, a->n, t2v);
    for (int x = 0; x < 3; ++x) {
        X0[x] = (ha * t1v[x] + hb * t2v[x]) / dd;
    }
    const double ld = sqrt(dd);
    for (int x = 0; x < 3; ++x) {
        d[x] /= ld;
    }
    double t0 = -INFINITY, t1 = INFINITY;
    clip(X0, d, a->P, a->u, tol, a->Lu - tol, &t0, &t1);
    clip(X0, d, a->P, a->v, tol, a->Lv - tol, &t0, &t1);
    clip(X0, d, b->P, b->u, tol, b->Lu - tol, &t0, &t1);
    clip(X0, d, b->P, b->v, tol, b->Lv - tol, &t0, &t1);
    return t1 - t0 > tol;
}

/* --- panel motions -------------------------------------------------------------------------------------------- */

static void mat3_mul(const double A[9], const double B[9], double C[9])
{
    for (int i = 0; i < 3; ++i) {
        for (int j = 0; j < 3; ++j) {
            C[3 * i + j] = A[3 * i] * B[j] + A[3 * i + 1] * B[3 + j] + A[3 * i + 2] * B[6 + j];
        }
    }
}

/* R = Rz(c) Ry(b) Rx(a) (row-major) and, when D is not NULL, its derivatives along a, b, c (per radian) in D[0..8],
 * D[9..17], D[18..26]. */
static void motion_rotation(const double rot_deg[3], double R[9], double *D)
{
    const double k = M_PI / 180.0;
    const double ca = cos(rot_deg[0] * k), sa = sin(rot_deg[0] * k);
    const double cb = cos(rot_deg[1] * k), sb = sin(rot_deg[1] * k);
    const double cc = cos(rot_deg[2] * k), sc = sin(rot_deg[2] * k);
    const double X[9] = {1, 0, 0, 0, ca, -sa, 0, sa, ca}, dX[9] = {0, 0, 0, 0, -sa, -ca, 0, ca, -sa};
    const double Y[9] = {cb, 0, sb, 0, 1, 0, -sb, 0, cb}, dY[9] = {-sb, 0, cb, 0, 0, 0, -cb, 0, -sb};
    const double Z[9] = {cc, -sc, 0, sc, cc, 0, 0, 0, 1}, dZ[9] = {-sc, -cc, 0, cc, -sc, 0, 0, 0, 0};
    double T[9];
    mat3_mul(Z, Y, T);
    mat3_mul(T, X, R);
    if (D != NULL) {
        double U[9];
        mat3_mul(T, dX, D);       /* Z Y dX */
        mat3_mul(Z, dY, U);
        mat3_mul(U, X, D + 9);    /* Z dY X */
        mat3_mul(dZ, Y, U);
        mat3_mul(U, X, D + 18);   /* dZ Y X */
    }
}

static void mat3_apply(const double M[9], const double v[3], double out[3])
{
    for (int i = 0; i < 3; ++i) {
        out[i] = M[3 * i] * v[0] + M[3 * i + 1] * v[1] + M[3 * i + 2] * v[2];
    }
}

/* Panel k as given, in its frame: unit fast, slow and normal axes and the origin (mm).  NBG_EINVAL naming the
 * panel for a bad size, non-finite, zero-length, parallel or non-perpendicular axes. */
static int panel_given(nbg_ctx *ctx, const nbg_experiment *e, int k, double fa[3], double sa[3], double na[3],
                       double org[3], double *px)
{
    const nbg_panel *p = &e->panels[k];
    char lab[64];
    panel_label(e, k, lab);
    if (p->fpixels < 1 || p->spixels < 1 || p->fpixels > NBG_MAX_SIDE || p->spixels > NBG_MAX_SIDE) {
        return nbgi_error(ctx, NBG_EINVAL, "%s: %d x %d pixels (each side must have 1 to %d)", lab, p->fpixels,
                         p->spixels, NBG_MAX_SIDE);
    }
    *px = p->pixel == 0 ? e->pixel : p->pixel;
    if (!(*px > 0) || !isfinite(*px)) {
        return nbgi_error(ctx, NBG_EINVAL, "%s: pixel size %g mm must be positive and finite", lab, *px);
    }
    if (!(p->thick >= 0 && isfinite(p->thick)) || !(p->thick_abs >= 0 && isfinite(p->thick_abs))) {
        return nbgi_error(ctx, NBG_EINVAL, "%s: sensor thickness %g um and attenuation length %g um must be finite "
                         "and not negative (0: the experiment's)", lab, p->thick, p->thick_abs);
    }
    if (p->own_response && (!isfinite(p->response.pedestal) || !(p->response.gain > 0 && isfinite(p->response.gain)) ||
                            !(p->response.read_noise >= 0 && isfinite(p->response.read_noise)))) {
        return nbgi_error(ctx, NBG_EINVAL, "%s: its detector response (pedestal %g counts, gain %g counts per photon, "
                          "read noise %g counts) must be finite, with a gain > 0 and a read noise >= 0", lab,
                          p->response.pedestal, p->response.gain, p->response.read_noise);
    }
    for (int x = 0; x < 3; ++x) {
        if (!isfinite(p->fast[x]) || !isfinite(p->slow[x]) || !isfinite(p->origin[x])) {
            return nbgi_error(ctx, NBG_EINVAL, "%s: a fast, slow or origin component is not finite", lab);
        }
        fa[x] = p->fast[x];
        sa[x] = p->slow[x];
        org[x] = p->origin[x];
    }
    const double lf = sqrt(dot3(fa, fa)), ls = sqrt(dot3(sa, sa));
    if (!(lf > 0) || !(ls > 0)) {
        return nbgi_error(ctx, NBG_EINVAL, "%s: the %s axis has zero length", lab, lf > 0 ? "slow" : "fast");
    }
    for (int x = 0; x < 3; ++x) {
        fa[x] /= lf;
        sa[x] /= ls;
    }
    cross3(fa, sa, na);
    const double ln = sqrt(dot3(na, na));
    if (ln < 1e-9) {
        return nbgi_error(ctx, NBG_EINVAL, "%s: the fast and slow axes are parallel", lab);
    }
    if (fabs(dot3(fa, sa)) > 1e-6) {
        return nbgi_error(ctx, NBG_EINVAL, "%s: the fast and slow axes are not perpendicular (cosine %g)", lab,
                         dot3(fa, sa));
    }
    for (int x = 0; x < 3; ++x) {
        na[x] /= ln;
    }
    return NBG_OK;
}

int nbgi_panel_place(nbg_ctx *ctx, const nbg_experiment *e, nbgi_placed *pp)
{
    const int n = e->npanels;
    const int nm = e->nmotions;
    pp->n = n;
    pp->nmotions = nm;
    if (nm < 0 || (nm > 0 && e->motions == NULL)) {
        return nbgi_error(ctx, NBG_EINVAL, "the panel motions are inconsistent (%d motions)", nm);
    }
    const double bytes = (double)n * sizeof(*pp->v) + (double)nm * 3 * sizeof(double) +
                         (nm > 0 ? (double)n * 6 * 12 * sizeof(double) : 0);
    int rc = nbgi_check_bytes(ctx, bytes, "the panel table");
    if (rc != NBG_OK) {
        return rc;
    }
    pp->v = calloc((size_t)n, sizeof *pp->v);
    pp->dv = nm > 0 ? calloc((size_t)n * 6 * 12, sizeof(double)) : NULL;
    pp->pivot = nm > 0 ? calloc((size_t)nm * 12, sizeof(double)) : NULL;
    pp->R = pp->pivot != NULL ? pp->pivot + 3 * nm : NULL;
    double *pivot = calloc((size_t)(nm > 0 ? nm : 1) * 4, sizeof(double)); /* sum x, y, z and count */
    if (pp->v == NULL || (nm > 0 && (pp->dv == NULL || pp->pivot == NULL)) || pivot == NULL) {
        free(pivot);
        nbgi_panel_place_free(pp);
        return nbgi_error(ctx, NBG_ENOMEM, "out of memory for %d panels", n);
    }
    for (int g = 0; g < nm; ++g) {
        for (int c = 0; c < 3; ++c) {
            if (!isfinite(e->motions[g].shift[c]) || !isfinite(e->motions[g].rot[c])) {
                free(pivot);
                nbgi_panel_place_free(pp);
                return nbgi_error(ctx, NBG_EINVAL, "panel motion %d: a shift or rotation is not finite", g);
            }
        }
    }
    for (int k = 0; k < n; ++k) {
        nbgi_placed_panel *v = &pp->v[k];
        rc = panel_given(ctx, e, k, v->fa, v->sa, v->na, v->org, &v->px);
        if (rc == NBG_OK && nm > 0 && (e->panels[k].group < 0 || e->panels[k].group >= nm)) {
            char lab[64];
            rc = nbgi_error(ctx, NBG_EINVAL, "%s: motion group %d (there are %d motions)", panel_label(e, k, lab),
                           e->panels[k].group, nm);
        }
        if (rc != NBG_OK) {
            free(pivot);
            nbgi_panel_place_free(pp);
            return rc;
        }
        if (nm > 0) {
            double *pv = pivot + 4 * e->panels[k].group;
            for (int x = 0; x < 3; ++x) {
                pv[x] += v->org[x] + 0.5 * v->px * (e->panels[k].fpixels * v->fa[x] + e->panels[k].spixels * v->sa[x]);
            }
            pv[3] += 1;
        }
    }
    /* every panel moved by its group's motion: origin' = pivot + R (origin - pivot) + shift, axes R (fast, slow,
     * normal); the derivatives of the 12 along the group's 6 components (shift: per mm, rotation: per degree) */
    for (int k = 0; k < n && nm > 0; ++k) {
        nbgi_placed_panel *v = &pp->v[k];
        const int g = e->panels[k].group;
        const nbg_panel_motion *m = &e->motions[g];
        double R[9], D[27], rel[3], c[3];
        motion_rotation(m->rot, R, D);
        for (int x = 0; x < 3; ++x) {
            c[x] = pivot[4 * g + x] / pivot[4 * g + 3];
            rel[x] = v->org[x] - c[x];
        }
        double *dv = pp->dv + (size_t)k * 72;
        for (int j = 0; j < 3; ++j) {
            dv[12 * j + j] = 1; /* shift j moves the origin along axis j */
            double *d = dv + 12 * (3 + j);
            const double *Dj = D + 9 * j;
            mat3_apply(Dj, rel, d);
            mat3_apply(Dj, v->fa, d + 3);
            mat3_apply(Dj, v->sa, d + 6);
            mat3_apply(Dj, v->na, d + 9);
            for (int x = 0; x < 12; ++x) {
                d[x] *= M_PI / 180.0;
            }
        }
        if (pp->pivot != NULL) {
            memcpy(pp->pivot + 3 * g, c, sizeof c);
            memcpy(pp->R + 9 * g, R, sizeof R);
        }
        double t[3];
        mat3_apply(R, rel, t);
        for (int x = 0; x < 3; ++x) {
            v->org[x] = c[x] + t[x] + m->shift[x];
        }
        mat3_apply(R, v->fa, t);
        memcpy(v->fa, t, sizeof t);
        mat3_apply(R, v->sa, t);
        memcpy(v->sa, t, sizeof t);
        mat3_apply(R, v->na, t);
        memcpy(v->na, t, sizeof t);
    }
    free(pivot);
    return NBG_OK;
}

/* Axes f, s and point o (mm) of the laboratory, in place, as components along the plane's axes e3 (unit) and, for
 * the point, its offset from pix0 (m). */
static void lab_to_plane(const double *e3[3], const double pix0[3], double f[3], double s[3], double o[3])
{
    double fp[3], sp[3], op[3];
    for (int j = 0; j < 3; ++j) {
        fp[j] = dot3(f, e3[j]);
        sp[j] = dot3(s, e3[j]);
        op[j] = 0;
        for (int x = 0; x < 3; ++x) {
            op[j] += (o[x] - 1000.0 * pix0[x]) * e3[j][x];
        }
    }
    memcpy(f, fp, sizeof fp);
    memcpy(s, sp, sizeof sp);
    memcpy(o, op, sizeof op);
}

int nbgi_panels_to_plane(nbg_ctx *ctx, nbg_experiment *e, nbg_panel *panels)
{
    if (e->npanels < 1 || e->panel_frame != NBG_PANELS_LAB) {
        return NBG_OK;
    }
    if (panels != e->panels) {
        return nbgi_error(ctx, NBG_EINVAL, "nbgi_panels_to_plane: the table is not the experiment's");
    }
    /* the plane as the plan places it (the structure factors and the crystal do not place it: a list without a
     * crystal, whose cell a later flag gives, must not fail here) */
    nbg_experiment p = *e;
    p.npanels = 0;
    p.panels = NULL;
    p.nmotions = 0;
    p.motions = NULL;
    p.pixels = NULL;
    p.npixels_list = 0;
    p.hkl = NULL;
    p.default_F = 1;
    if (!p.has_cell && !p.has_mat) {
        p.has_cell = 1;
        p.cell[0] = 10;
    }
    nbg_report r;
    const int rc = nbg_describe(ctx, &p, &r);
    if (rc != NBG_OK) {
        return rc;
    }
    const double *e3[3] = {r.fdet, r.sdet, r.odet};
    for (int k = 0; k < e->npanels; ++k) {
        nbg_panel *q = &panels[k];
        lab_to_plane(e3, r.pix0, q->fast, q->slow, q->origin);
        /* its groups' frames the same way (a level with none stays zero) */
        for (int l = 0; q->has_level_frames && l < NBG_PANEL_LEVELS; ++l) {
            double *F = q->level_frame[l];
            if (dot3(F, F) != 0) {
                lab_to_plane(e3, r.pix0, F, F + 3, F + 6);
            }
        }
    }
    e->panel_frame = NBG_PANELS_PLANE;
    return NBG_OK;
}

void nbgi_panel_place_free(nbgi_placed *pp)
{
    free(pp->v);
    free(pp->dv);
    free(pp->pivot);
    pp->v = NULL;
    pp->dv = NULL;
    pp->pivot = NULL;
    pp->R = NULL;
}

int nbgi_plan_panels(nbg_ctx *ctx, const nbg_experiment *e, const double pix0[3], const double f[3],
                     const double s[3], const double o[3], nbgi_kpanel **out, double **motion_tangents, long *npix,
                     int *nrows)
{
    *out = NULL;
    *motion_tangents = NULL;
    const int n = e->npanels;
    char lab[64], lab2[64];
    nbgi_placed pp;
    int rc = nbgi_panel_place(ctx, e, &pp);
    if (rc != NBG_OK) {
        return rc;
    }
    nbgi_kpanel *kp = calloc((size_t)n, sizeof *kp);
    double *mt = pp.dv != NULL ? malloc(sizeof(double) * (size_t)n * 6 * NBGI_PANEL_NT) : NULL;
    if (kp == NULL || (pp.dv != NULL && mt == NULL)) {
        free(kp);
        nbgi_panel_place_free(&pp);
        return nbgi_error(ctx, NBG_ENOMEM, "out of memory for %d panels", n);
    }
    const double *e3[3] = {f, s, o};
    const double unit[3][3] = {{1, 0, 0}, {0, 1, 0}, {0, 0, 1}};
    const int plane = e->panel_frame == NBG_PANELS_PLANE;
    long off = 0;
    long rows = 0;
    for (int k = 0; k < n; ++k) {
        const nbg_panel *p = &e->panels[k];
        nbgi_kpanel *q = &kp[k];
        panel_label(e, k, lab);
        const double *fa = pp.v[k].fa, *sa = pp.v[k].sa, *na = pp.v[k].na, *org = pp.v[k].org;
        const double px = pp.v[k].px;
        if (plane) {
            /* components along the plane's (f, s, o): the lab vectors are these combinations, and so are their
             * derivatives (q->A, q->c) */
            q->in_plane = 1;
            for (int j = 0; j < 3; ++j) {
                q->A[j] = fa[j];
                q->A[3 + j] = sa[j];
                q->A[6 + j] = na[j];
                q->c[j] = org[j] / 1000.0;
            }
            for (int x = 0; x < 3; ++x) {
                q->fdet[x] = q->sdet[x] = q->odet[x] = 0;
                q->pix0[x] = pix0[x];
                for (int j = 0; j < 3; ++j) {
                    q->fdet[x] += fa[j] * e3[j][x];
                    q->sdet[x] += sa[j] * e3[j][x];
                    q->odet[x] += na[j] * e3[j][x];
                    q->pix0[x] += q->c[j] * e3[j][x];
                }
            }
        } else {
            for (int x = 0; x < 3; ++x) {
                q->fdet[x] = fa[x];
                q->sdet[x] = sa[x];
                q->odet[x] = na[x];
                q->pix0[x] = org[x] / 1000.0;
            }
        }
        q->close_distance = dot3(q->pix0, q->odet);
        if (mt != NULL) {
            /* the lab tangents of the panel's pix0, f, s, o and close distance along its group's 6 components */
            for (int c = 0; c < 6; ++c) {
                const double *d = pp.dv + (size_t)k * 72 + 12 * c;
                double *t = mt + ((size_t)k * 6 + c) * NBGI_PANEL_NT;
                for (int x = 0; x < 3; ++x) {
                    for (int v = 0; v < 4; ++v) {
                        t[3 * v + x] = 0;
                        for (int j = 0; j < 3; ++j) {
                            const double ej = plane ? e3[j][x] : unit[j][x];
                            t[3 * v + x] += (v == 0 ? d[j] / 1000.0 : d[3 * v + j]) * ej;
                        }
                    }
                }
                t[12] = dot3(t, q->odet) + dot3(q->pix0, t + 9);
            }
        }
        if (!(q->close_distance > 1e-9)) {
            const double mm = q->close_distance * 1000; /* read before the table is freed */
            free(kp);
            free(mt);
            nbgi_panel_place_free(&pp);
            return nbgi_error(ctx, NBG_EINVAL, "%s: its plane passes through or lies behind the sample (%g mm along "
                             "its normal fast x slow, which must point away from the sample)", lab, mm);
        }
        q->pixel = px / 1000.0;
        q->fpixels = p->fpixels;
        q->spixels = p->spixels;
        q->offset = off;
        q->row0 = (int)rows;
        off += (long)p->fpixels * p->spixels;
        rows += p->spixels;
        if (rows > INT_MAX / 2) {
            free(kp);
            free(mt);
            nbgi_panel_place_free(&pp);
            return nbgi_error(ctx, NBG_EINVAL, "the panels have %ld rows in all, too many", rows);
        }
    }
    nbgi_panel_place_free(&pp);
    char what[96];
    snprintf(what, sizeof what, "an image of %ld pixels (%d panels)", off, n);
    if ((rc = nbgi_check_bytes(ctx, (double)off * sizeof(float), what)) != NBG_OK) {
        free(kp);
        free(mt);
        return rc;
    }
    /* no two panels may overlap: every pair, after a bounding-sphere test (a few thousand panels take
     * milliseconds) */
    rect *rr = malloc((size_t)n * sizeof *rr);
    if (rr == NULL) {
        free(kp);
        free(mt);
        return nbgi_error(ctx, NBG_ENOMEM, "out of memory for the panel overlap check");
    }
    for (int k = 0; k < n; ++k) {
        rect_of(&kp[k], &rr[k]);
    }
    for (int a = 0; a < n; ++a) {
        for (int b = a + 1; b < n; ++b) {
            const double tol = 1e-3 * fmin(kp[a].pixel, kp[b].pixel);
            if (rects_overlap(&rr[a], &rr[b], tol)) {
                free(rr);
                free(kp);
                free(mt);
                return nbgi_error(ctx, NBG_EINVAL, "%s and %s overlap", panel_label(e, a, lab),
                                 panel_label(e, b, lab2));
            }
        }
    }
    free(rr);
    *out = kp;
    *motion_tangents = mt;
    *npix = off;
    *nrows = (int)rows;
    return NBG_OK;
}

/* --- built-in layouts ------------------------------------------------------------------------------------------ */

/* A grid of nx x ny modules (row by row from the top-left) of mf x ms pixels with gaps of gf and gs pixels; each
 * module cut into af x as ASICs of mf/af x ms/as pixels with gaps of ag pixels between ASICs (af = as = 1: the
 * module whole).  Positions in pixels.  Returns the panel count; fills panels up to cap. */
static int grid_layout(nbg_panel *panels, int cap, const char *prefix, int nx, int ny, int mf, int ms, int gf, int gs,
                       int af, int as, int ag, double px)
{
    int n = 0;
    const int wf = mf / af, ws = ms / as;
    const int modf = af * wf + (af - 1) * ag, mods = as * ws + (as - 1) * ag;
    for (int j = 0; j < ny; ++j) {
        for (int i = 0; i < nx; ++i) {
            for (int b = 0; b < as; ++b) {
                for (int a = 0; a < af; ++a, ++n) {
                    if (n >= cap || panels == NULL) {
                        continue;
                    }
                    nbg_panel *q = &panels[n];
                    memset(q, 0, sizeof *q);
                    q->fpixels = wf;
                    q->spixels = ws;
                    q->pixel = px;
                    q->fast[0] = 1;
                    q->slow[1] = 1;
                    q->origin[0] = px * (i * (modf + gf) + a * (wf + ag));
                    q->origin[1] = px * (j * (mods + gs) + b * (ws + ag));
                    q->group = j * nx + i; /* the module */
                    if (af * as > 1) {
                        snprintf(q->name, sizeof q->name, "%s%02d_%02d_asic%d", prefix, j, i, b * af + a);
                    } else {
                        snprintf(q->name, sizeof q->name, "%s%02d_%02d", prefix, j, i);
                    }
                }
            }
        }
    }
    return n;
}

/* The CSPAD, approximately: a quadrant holds four square sections (391 x 391 pixels, 10 apart) of two two-by-one
 * sensors each (two ASICs of 194 x 185 side by side 3 pixels apart, the two sensors 21 pixels apart), the
 * sections on one diagonal along x, the others turned by 90 deg; quadrant q is quadrant 0 turned by q x 90 deg
 * about the centre, quadrant 0 starting 10 pixels from it on both axes (a 20-pixel central hole). */
static int cspad_layout(nbg_panel *panels, int cap, double px)
{
    enum { AF = 194, AS = 185, AGAP = 3, SGAP = 21, SEC = 2 * AF + AGAP, QGAP = 10, HOLE = 10 };
    int n = 0;
    for (int quad = 0; quad < 4; ++quad) {
        for (int sec = 0; sec < 4; ++sec) {
            const int sx = sec & 1, sy = sec >> 1;
            const int turned = sx != sy;
            const double X0 = HOLE + sx * (SEC + QGAP), Y0 = HOLE + sy * (SEC + QGAP);
            for (int sensor = 0; sensor < 2; ++sensor) {
                for (int asic = 0; asic < 2; ++asic, ++n) {
                    if (n >= cap || panels == NULL) {
                        continue;
                    }
                    /* in the section's frame: the sensor's ASICs along u, the sensors stacked along v */
                    double ox, oy, fx, fy, sxv, syv;
                    const double along = asic * (AF + AGAP), across = sensor * (AS + SGAP);
                    if (!turned) {
                        ox = X0 + along, oy = Y0 + across;
                        fx = 1, fy = 0, sxv = 0, syv = 1;
                    } else {
                        /* fast along +y, slow along -x (the normal stays +z): the corner is on the +x side */
                        ox = X0 + SEC - across, oy = Y0 + along;
                        fx = 0, fy = 1, sxv = -1, syv = 0;
                    }
                    /* quadrant turn by quad x 90 deg: (x, y) -> (-y, x) per turn */
                    for (int t = 0; t < quad; ++t) {
                        double v = ox;
                        ox = -oy, oy = v;
                        v = fx;
                        fx = -fy, fy = v;
                        v = sxv;
                        sxv = -syv, syv = v;
                    }
                    nbg_panel *q = &panels[n];
                    memset(q, 0, sizeof *q);
                    q->fpixels = AF;
                    q->spixels = AS;
                    q->pixel = px;
                    q->fast[0] = fx, q->fast[1] = fy;
                    q->slow[0] = sxv, q->slow[1] = syv;
                    q->origin[0] = ox * px;
                    q->origin[1] = oy * px;
                    snprintf(q->name, sizeof q->name, "q%d_s%d_asic%d", quad, 2 * sec + sensor, asic);
                    q->group = 8 * quad + 2 * sec + sensor; /* the two-by-one sensor */
                }
            }
        }
    }
    return n;
}

const char *nbg_layout_names(void) { return "pilatus6m eiger2_16m jungfrau16m cspad"; }

int nbg_layout(nbg_ctx *ctx, const char *name, nbg_panel *panels, int capacity, int *npanels, double *pixel,
               int *fpixels, int *spixels)
{
    if (name == NULL || npanels == NULL) {
        return nbgi_error(ctx, NBG_EINVAL, "nbg_layout: no layout name or no count to return");
    }
    double px = 0;
    int n;
    nbg_panel *out = capacity > 0 ? panels : NULL;
    if (strcmp(name, "pilatus6m") == 0) {
        px = 0.172;
        n = grid_layout(out, capacity, "m", 5, 12, 487, 195, 7, 17, 1, 1, 0, px);
    } else if (strcmp(name, "eiger2_16m") == 0) {
        px = 0.075;
        n = grid_layout(out, capacity, "m", 4, 8, 1028, 512, 12, 38, 1, 1, 0, px);
    } else if (strcmp(name, "jungfrau16m") == 0) {
        px = 0.075;
        n = grid_layout(out, capacity, "m", 4, 8, 1024, 512, 10, 37, 4, 2, 2, px);
    } else if (strcmp(name, "cspad") == 0) {
        px = 0.11;
        n = cspad_layout(out, capacity, px);
    } else {
        return nbgi_error(ctx, NBG_EINVAL, "unknown detector layout '%s' (known: %s)", name, nbg_layout_names());
    }
    *npanels = n;
    if (panels == NULL && capacity == 0) {
        return NBG_OK;
    }
    if (capacity < n || panels == NULL) {
        return nbgi_error(ctx, NBG_EINVAL, "layout %s has %d panels, room for %d given", name, n, capacity);
    }
    /* the hierarchy's levels: the detector, then (the CSPAD's quadrants,) the modules, then the panels */
    const int cspad = strcmp(name, "cspad") == 0;
    for (int k = 0; k < n; ++k) {
        int *lv = panels[k].level_group, l = 0;
        lv[l++] = 0;
        if (cspad) {
            lv[l++] = panels[k].group / 8; /* the quadrant of the sensor */
        }
        lv[l++] = panels[k].group;
        lv[l++] = k;
        while (l < NBG_PANEL_LEVELS) {
            lv[l++] = -1;
        }
    }
    /* the bounding box's corner becomes the plane's pixel (0,0) corner */
    double lo[2] = {INFINITY, INFINITY}, hi[2] = {-INFINITY, -INFINITY};
    for (int k = 0; k < n; ++k) {
        const nbg_panel *q = &panels[k];
        for (int c = 0; c < 4; ++c) {
            const double a = (c & 1) ? q->fpixels * px : 0, b = (c & 2) ? q->spixels * px : 0;
            for (int x = 0; x < 2; ++x) {
                const double v = q->origin[x] + a * q->fast[x] + b * q->slow[x];
                lo[x] = fmin(lo[x], v);
                hi[x] = fmax(hi[x], v);
            }
        }
    }
    for (int k = 0; k < n; ++k) {
        /* whole pixels from the corner (rounded): the positions stay exact multiples of the pixel */
        for (int x = 0; x < 2; ++x) {
            panels[k].origin[x] = px * rint((panels[k].origin[x] - lo[x]) / px);
        }
    }
    if (pixel != NULL) {
        *pixel = px;
    }
    if (fpixels != NULL) {
        *fpixels = (int)rint((hi[0] - lo[0]) / px);
    }
    if (spixels != NULL) {
        *spixels = (int)rint((hi[1] - lo[1]) / px);
    }
    return NBG_OK;
}
