/*
 * spots.c -- spot regions: the pixel list of boxes around the Bragg spots (nbg_spot_pixels), for
 * nbg_experiment.pixels, so that refinement evaluates the spots' pixels and not the whole detector.
 */
#include "plan.h"
#include "geometry.h"

#include <limits.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* Marks every pixel within h of a marked one along a line of n pixels at stride st (in place, linear time):
 * a forward and a backward pass, each tracking the distance to the nearest mark behind it. */
static void dilate_line(uint8_t *m, long n, long st, int h, uint8_t *tmp)
{
    long last = -(long)h - 1;
    for (long x = 0; x < n; ++x) {
        if (m[x * st] & 1) {
            last = x;
        }
        tmp[x] = x - last <= h;
    }
    long next = n + h + 1;
    for (long x = n - 1; x >= 0; --x) {
        if (m[x * st] & 1) {
            next = x;
        }
        tmp[x] |= next - x <= h;
    }
    for (long x = 0; x < n; ++x) {
        m[x * st] = tmp[x];
    }
}

/* e with its pixel list set aside (the list made here replaces it) into *whole, and the plan of that whole
 * detector, whose pixels a list of 32-bit indices must be able to name; who names the caller in messages. */
static int whole_plan(nbg_ctx *ctx, const nbg_experiment *e, const char *who, nbg_experiment *whole, nbgi_plan *pl)
{
    *whole = *e;
    whole->pixels = NULL;
    whole->npixels_list = 0;
    const int rc = nbgi_plan_build(ctx, whole, pl);
    if (rc != NBG_OK) {
        return rc;
    }
    if (pl->k.npix > (long)UINT32_MAX) {
        const size_t n = (size_t)pl->k.npix;
        nbgi_plan_free(pl);
        return nbgi_error(ctx, NBG_EINVAL, "%s: the image of %zu pixels is too large for a pixel list", who, n);
    }
    return NBG_OK;
}

/* The marked pixels of m (n) that the model computes, as a sorted list (*pixels malloc'd, none: NULL, 0). */
static int mask_to_list(nbg_ctx *ctx, const nbgi_kparams *k, uint8_t *m, size_t n, uint32_t **pixels, long *npixels,
                        const char *who)
{
    long cnt = 0;
    for (size_t i = 0; i < n; ++i) {
        m[i] = m[i] && nbgi_model_active(k, i);
        cnt += m[i];
    }
    if (cnt == 0) {
        return NBG_OK;
    }
    *pixels = malloc(sizeof(uint32_t) * (size_t)cnt);
    if (*pixels == NULL) {
        return nbgi_error(ctx, NBG_ENOMEM, "%s: out of memory for %ld pixels", who, cnt);
    }
    long t = 0;
    for (size_t i = 0; i < n; ++i) {
        if (m[i]) {
            (*pixels)[t++] = (uint32_t)i;
        }
    }
    *npixels = cnt;
    return NBG_OK;
}

/* Panel q's first image index (off; NULL: not wanted) and its pixel counts along fast and slow (F, S): the panel's,
 * or the single flat detector's (offset 0) when there are no panels. */
static void panel_extent(const nbgi_kparams *k, int q, long *off, long *F, long *S)
{
    if (off != NULL) {
        *off = k->npanels > 0 ? k->panels[q].offset : 0;
    }
    *F = k->npanels > 0 ? k->panels[q].fpixels : k->fpixels;
    *S = k->npanels > 0 ? k->panels[q].spixels : k->spixels;
}

int nbg_spot_pixels(nbg_ctx *ctx, const nbg_experiment *e, const float *image, size_t npix, double threshold,
                    const double *centres, long ncentres, int half_box, uint32_t **pixels, long *npixels)
{
    if (ctx == NULL || e == NULL || pixels == NULL || npixels == NULL || (centres == NULL && ncentres != 0)) {
        return nbgi_error(ctx, NBG_EINVAL, "nbg_spot_pixels: NULL argument");
    }
    *pixels = NULL;
    *npixels = 0;
    if (half_box < 0 || half_box > 100000 || isnan(threshold) || ncentres < 0) {
        return nbgi_error(ctx, NBG_EINVAL, "nbg_spot_pixels: the box half-width must be in [0, 100000] (got %d), the "
                         "threshold a number, the centres' count not negative", half_box);
    }
    nbg_experiment whole;
    nbgi_plan pl;
    int rc = whole_plan(ctx, e, "nbg_spot_pixels", &whole, &pl);
    if (rc != NBG_OK) {
        return rc;
    }
    const nbgi_kparams *k = &pl.k;
    const size_t n = (size_t)k->npix;
    if (image != NULL && npix != n) {
        nbgi_plan_free(&pl);
        return nbgi_error(ctx, NBG_EINVAL, "nbg_spot_pixels: the image holds %zu pixels, the detector has %zu", npix,
                         n);
    }
    if (ncentres > 0 && k->npanels > 0) {
        nbgi_plan_free(&pl);
        return nbgi_error(ctx, NBG_EINVAL, "nbg_spot_pixels: spot centres are for a single flat detector, not %d "
                         "panels", k->npanels);
    }
    for (long c = 0; c < ncentres; ++c) {
        const double f = centres[2 * c], s = centres[2 * c + 1];
        if (!(f > -0.5 && f < k->fpixels - 0.5 && s > -0.5 && s < k->spixels - 0.5)) {
            nbgi_plan_free(&pl);
            return nbgi_error(ctx, NBG_EINVAL, "spot centre %ld (fast %g, slow %g) is outside the detector of %d x %d "
                             "pixels", c, f, s, k->fpixels, k->spixels);
        }
    }
    uint8_t *m = calloc(n, 1);
    float *own = NULL;
    const long longest = k->fpixels > k->spixels ? k->fpixels : k->spixels;
    long maxdim = longest;
    for (int q = 0; q < k->npanels; ++q) {
        maxdim = k->panels[q].fpixels > maxdim ? k->panels[q].fpixels : maxdim;
        maxdim = k->panels[q].spixels > maxdim ? k->panels[q].spixels : maxdim;
    }
    uint8_t *tmp = malloc((size_t)maxdim);
    if (image == NULL && m != NULL) {
        own = malloc(sizeof(float) * n);
        rc = own == NULL ? NBG_ENOMEM : nbg_simulate(ctx, &whole, own, n, NULL);
        image = own;
    }
    if (m == NULL || tmp == NULL || rc == NBG_ENOMEM) {
        rc = nbgi_error(ctx, NBG_ENOMEM, "nbg_spot_pixels: out of memory for %zu pixels", n);
    }
    if (rc == NBG_OK) {
        for (size_t i = 0; i < n; ++i) {
            m[i] = image[i] > threshold;
        }
        for (long c = 0; c < ncentres; ++c) {
            const long f = lround(centres[2 * c]), s = lround(centres[2 * c + 1]);
            m[s * k->fpixels + f] = 1;
        }
        /* the box: dilation along fast, then along slow, within each panel (the single detector is one) */
        const int np = k->npanels > 0 ? k->npanels : 1;
        for (int q = 0; q < np; ++q) {
            long off, F, S;
            panel_extent(k, q, &off, &F, &S);
            for (long s = 0; s < S; ++s) {
                dilate_line(m + off + s * F, F, 1, half_box, tmp);
            }
            for (long f = 0; f < F; ++f) {
                dilate_line(m + off + f, S, F, half_box, tmp);
            }
        }
        rc = mask_to_list(ctx, k, m, n, pixels, npixels, "nbg_spot_pixels");
    }
    free(m);
    free(tmp);
    free(own);
    nbgi_plan_free(&pl);
    return rc;
}

int nbg_spot_threshold(const float *image, const uint8_t *use, size_t npix, double frac, double *threshold)
{
    double lo = INFINITY, hi = -INFINITY;
    for (size_t i = 0; image != NULL && i < npix; ++i) {
        if (use == NULL || use[i]) {
            lo = fmin(lo, image[i]);
            hi = fmax(hi, image[i]);
        }
    }
    if (threshold != NULL) {
        *threshold = hi > lo ? lo + frac * (hi - lo) : lo; /* flat: the floor, for the message */
    }
    return hi > lo;
}

int nbg_spot_box_pixels(nbg_ctx *ctx, const nbg_experiment *e, const nbg_spot_box *boxes, long nboxes,
                        uint32_t **pixels, long *npixels)
{
    if (ctx == NULL || e == NULL || pixels == NULL || npixels == NULL || (boxes == NULL && nboxes != 0)) {
        return nbgi_error(ctx, NBG_EINVAL, "nbg_spot_box_pixels: NULL argument");
    }
    *pixels = NULL;
    *npixels = 0;
    if (nboxes < 0) {
        return nbgi_error(ctx, NBG_EINVAL, "nbg_spot_box_pixels: the boxes' count %ld is negative", nboxes);
    }
    nbg_experiment whole;
    nbgi_plan pl;
    int rc = whole_plan(ctx, e, "nbg_spot_box_pixels", &whole, &pl);
    if (rc != NBG_OK) {
        return rc;
    }
    const nbgi_kparams *k = &pl.k;
    const size_t n = (size_t)k->npix;
    const int np = k->npanels > 0 ? k->npanels : 1;
    for (long b = 0; b < nboxes; ++b) {
        const nbg_spot_box *x = &boxes[b];
        if (x->panel < 0 || x->panel >= np) {
            nbgi_plan_free(&pl);
            return nbgi_error(ctx, NBG_EINVAL, "spot box %ld is on panel %d, the detector has %d panel%s", b, x->panel,
                              np, np > 1 ? "s" : " (the single flat detector: panel 0)");
        }
        long F, S;
        panel_extent(k, x->panel, NULL, &F, &S);
        if (x->x1 <= x->x0 || x->y1 <= x->y0 || x->x1 <= 0 || x->y1 <= 0 || x->x0 >= F || x->y0 >= S) {
            nbgi_plan_free(&pl);
            return nbgi_error(ctx, NBG_EINVAL, "spot box %ld (fast [%d, %d), slow [%d, %d) on panel %d) is empty or "
                              "wholly outside its panel of %ld x %ld pixels", b, x->x0, x->x1, x->y0, x->y1,
                              x->panel, F, S);
        }
    }
    uint8_t *m = calloc(n, 1);
    if (m == NULL) {
        nbgi_plan_free(&pl);
        return nbgi_error(ctx, NBG_ENOMEM, "nbg_spot_box_pixels: out of memory for %zu pixels", n);
    }
    for (long b = 0; b < nboxes; ++b) {
        const nbg_spot_box *x = &boxes[b];
        long off, F, S;
        panel_extent(k, x->panel, &off, &F, &S);
        const long f0 = x->x0 > 0 ? x->x0 : 0, f1 = x->x1 < F ? x->x1 : F;
        const long s0 = x->y0 > 0 ? x->y0 : 0, s1 = x->y1 < S ? x->y1 : S;
        for (long s = s0; s < s1; ++s) {
            memset(m + off + s * F + f0, 1, (size_t)(f1 - f0));
        }
    }
    rc = mask_to_list(ctx, k, m, n, pixels, npixels, "nbg_spot_box_pixels");
    free(m);
    nbgi_plan_free(&pl);
    return rc;
}

int nbg_reflection_boxes(nbg_ctx *ctx, const nbg_experiment *e, const nbg_reflections *r, int half,
                         nbg_spot_box **boxes, long *nboxes, long *skipped)
{
    if (ctx == NULL || e == NULL || r == NULL || boxes == NULL || nboxes == NULL ||
        (r->n > 0 && (r->panel == NULL || r->xyz == NULL))) {
        return nbgi_error(ctx, NBG_EINVAL, "nbg_reflection_boxes: NULL argument");
    }
    *boxes = NULL;
    *nboxes = 0;
    if (skipped != NULL) *skipped = 0;
    if (r->n < 0 || half > 100000 || (half < 0 && r->bbox == NULL && r->n > 0)) {
        return nbgi_error(ctx, NBG_EINVAL, "nbg_reflection_boxes: %ld reflections, half-width %d (0 to 100000, or "
                          "negative for the table's bounding boxes%s)", r->n, half,
                          r->bbox == NULL ? ", and it has no bbox column" : "");
    }
    nbg_experiment whole;
    nbgi_plan pl;
    int rc = whole_plan(ctx, e, "nbg_reflection_boxes", &whole, &pl);
    if (rc != NBG_OK) {
        return rc;
    }
    const nbgi_kparams *k = &pl.k;
    const int np = k->npanels > 0 ? k->npanels : 1;
    nbg_spot_box *b = r->n > 0 ? malloc(sizeof *b * (size_t)r->n) : NULL;
    if (r->n > 0 && b == NULL) {
        nbgi_plan_free(&pl);
        return nbgi_error(ctx, NBG_ENOMEM, "nbg_reflection_boxes: out of memory for %ld boxes", r->n);
    }
    long n = 0, left = 0;
    for (long t = 0; t < r->n; ++t) {
        if (r->id != NULL && r->id[t] > 0) { /* another experiment's */
            ++left;
            continue;
        }
        const int q = r->panel[t];
        const double x = r->xyz[3 * t], y = r->xyz[3 * t + 1];
        long F, S;
        panel_extent(k, q >= 0 && q < np ? q : 0, NULL, &F, &S);
        if (q < 0 || q >= np || !(x >= 0 && x < F && y >= 0 && y < S)) {
            free(b);
            nbgi_plan_free(&pl);
            return nbgi_error(ctx, NBG_EINVAL, "reflection %ld (panel %d, x %g, y %g pixels) is not on the detector "
                              "(%d panel%s%s)", t, q, x, y, np, np > 1 ? "s" : "",
                              k->npanels > 0 ? "" : ", the single flat one");
        }
        nbg_spot_box *o = &b[n++];
        o->panel = q;
        if (half < 0) {
            o->x0 = r->bbox[6 * t], o->x1 = r->bbox[6 * t + 1];
            o->y0 = r->bbox[6 * t + 2], o->y1 = r->bbox[6 * t + 3];
        } else {
            const int f = (int)floor(x), s = (int)floor(y);
            o->x0 = f - half, o->x1 = f + half + 1, o->y0 = s - half, o->y1 = s + half + 1;
        }
    }
    nbgi_plan_free(&pl);
    if (n == 0) {
        free(b);
        b = NULL;
    }
    *boxes = b;
    *nboxes = n;
    if (skipped != NULL) *skipped = left;
    return NBG_OK;
}

int nbg_reflection_shoebox_boxes(nbg_ctx *ctx, const nbg_experiment *e, const nbg_reflections *r, int code,
                                 int dilate, nbg_spot_box **boxes, long *nboxes, long *skipped)
{
    const char *who = "nbg_reflection_shoebox_boxes";
    if (ctx == NULL || e == NULL || r == NULL || boxes == NULL || nboxes == NULL) {
        return nbgi_error(ctx, NBG_EINVAL, "%s: NULL argument", who);
    }
    *boxes = NULL;
    *nboxes = 0;
    if (skipped != NULL) *skipped = 0;
    if (r->n < 0 || dilate < 0 || dilate > 1000 || code <= 0) {
        return nbgi_error(ctx, NBG_EINVAL, "%s: %ld reflections, dilation %d (0 to 1000 pixels), mask bits %d (some "
                          "of NBG_SHOEBOX_FOREGROUND ...)", who, r->n, dilate, code);
    }
    if (r->n > 0 && (r->shoebox_offset == NULL || r->shoebox_panel == NULL || r->shoebox_bbox == NULL)) {
        return nbgi_error(ctx, NBG_EINVAL, "the reflection table has no shoeboxes (a \"shoebox\" column, as "
                          "dials.find_spots writes; dials.index leaves it out)");
    }
    nbg_experiment whole;
    nbgi_plan pl;
    int rc = whole_plan(ctx, e, who, &whole, &pl);
    if (rc != NBG_OK) {
        return rc;
    }
    const nbgi_kparams *k = &pl.k;
    const int np = k->npanels > 0 ? k->npanels : 1;
    /* at most one box per mask pixel */
    const long cap = r->n > 0 ? r->shoebox_offset[r->n] : 0;
    if ((rc = nbgi_check_bytes(ctx, (double)cap * sizeof(nbg_spot_box), "the shoeboxes' spot pixels")) != NBG_OK) {
        nbgi_plan_free(&pl);
        return rc;
    }
    nbg_spot_box *b = cap > 0 ? malloc(sizeof *b * (size_t)cap) : NULL;
    if (cap > 0 && b == NULL) {
        nbgi_plan_free(&pl);
        return nbgi_error(ctx, NBG_ENOMEM, "%s: out of memory for %ld pixels", who, cap);
    }
    long n = 0, left = 0;
    for (long t = 0; t < r->n && rc == NBG_OK; ++t) {
        if (r->id != NULL && r->id[t] > 0) { /* another experiment's */
            ++left;
            continue;
        }
        const int q = r->shoebox_panel[t];
        const int *bb = r->shoebox_bbox + 6 * t;
        const long off = r->shoebox_offset[t], vol = r->shoebox_offset[t + 1] - off;
        if (q < 0 || q >= np) {
            rc = nbgi_error(ctx, NBG_EINVAL, "reflection %ld's shoebox is on panel %d, the detector has %d", t, q, np);
            break;
        }
        if (vol == 0) {
            rc = nbgi_error(ctx, NBG_EINVAL, "reflection %ld's shoebox carries no pixels (no mask to take the spot "
                            "from)", t);
            break;
        }
        long F, S;
        panel_extent(k, q, NULL, &F, &S);
        const long nx = (long)bb[1] - bb[0], ny = (long)bb[3] - bb[2], nz = (long)bb[5] - bb[4];
        if (nx <= 0 || ny <= 0 || nz <= 0 || vol < 0 || r->shoebox_mask == NULL || vol / nx / ny != nz ||
            vol % (nx * ny) != 0) {
            rc = nbgi_error(ctx, NBG_EINVAL, "reflection %ld's shoebox mask (%ld values) does not fill its box (%d %d "
                            "%d %d %d %d)", t, vol, bb[0], bb[1], bb[2], bb[3], bb[4], bb[5]);
            break;
        }
        const long before = n;
        for (long y = 0; y < ny && rc == NBG_OK; ++y) {
            for (long x = 0; x < nx; ++x) {
                int hit = 0;
                for (long z = 0; z < nz && !hit; ++z) {
                    hit = (r->shoebox_mask[off + (z * ny + y) * nx + x] & code) != 0;
                }
                if (!hit) {
                    continue;
                }
                const long f = bb[0] + x, s = bb[2] + y;
                if (f < 0 || f >= F || s < 0 || s >= S) {
                    rc = nbgi_error(ctx, NBG_EINVAL, "reflection %ld's shoebox marks pixel (%ld, %ld) of panel %d, "
                                    "which is off the panel (%ld x %ld pixels)", t, f, s, q, F, S);
                    break;
                }
                nbg_spot_box *o = &b[n++];
                o->panel = q;
                o->x0 = (int)(f - dilate), o->x1 = (int)(f + dilate + 1);
                o->y0 = (int)(s - dilate), o->y1 = (int)(s + dilate + 1);
            }
        }
        if (rc == NBG_OK && n == before) {
            rc = nbgi_error(ctx, NBG_EINVAL, "reflection %ld's shoebox has no pixel with the mask bits %d", t, code);
        }
    }
    nbgi_plan_free(&pl);
    if (rc != NBG_OK || n == 0) {
        free(b);
        b = NULL;
        n = 0;
    }
    if (rc != NBG_OK) {
        return rc;
    }
    *boxes = b;
    *nboxes = n;
    if (skipped != NULL) *skipped = left;
    return NBG_OK;
}

/* ---- the model's own spot of each reflection (nbg_reflection_centroids) ---- */

/* The structure factor e gives Miller index h (its table's entry, or default_F outside it). */
static double entry_F(const nbg_experiment *e, const int *h)
{
    const nbg_hkl *t = e->hkl;
    if (t == NULL || h[0] < t->h_min || h[0] > t->h_max || h[1] < t->k_min || h[1] > t->k_max || h[2] < t->l_min ||
        h[2] > t->l_max) {
        return e->default_F;
    }
    const long nk = t->k_max - t->k_min + 1, nl = t->l_max - t->l_min + 1;
    return t->F[((long)(h[0] - t->h_min) * nk + (h[1] - t->k_min)) * nl + (h[2] - t->l_min)];
}

int nbg_reflection_centroids(nbg_ctx *ctx, const nbg_experiment *e, long n, const int *hkl, const int *panel,
                             const double *x, const double *y, int radius, double *cx, double *cy, double *photons)
{
    if (ctx == NULL || e == NULL || (n > 0 && (hkl == NULL || panel == NULL || x == NULL || y == NULL || cx == NULL ||
                                               cy == NULL))) {
        return nbgi_error(ctx, NBG_EINVAL, "nbg_reflection_centroids: NULL argument");
    }
    if (n < 0 || n > 10000000 || radius < 1 || radius > 1000) {
        return nbgi_error(ctx, NBG_EINVAL, "nbg_reflection_centroids: %ld reflections (0 to 1e7), a square of "
                          "half-width %d pixels (1 to 1000)", n, radius);
    }
    if (e->interpolate == 1 || (e->interpolate < 0 && (e->Na <= 2 || e->Nb <= 2 || e->Nc <= 2))) {
        return nbgi_error(ctx, NBG_EUNSUP, "nbg_reflection_centroids: with tricubic interpolation of the structure "
                          "factors (-interpolate, or N <= 2) a pixel's light mixes neighbouring reflections: no "
                          "reflection's own spot can be told apart");
    }
    nbg_experiment whole;
    nbgi_plan pl;
    int rc = whole_plan(ctx, e, "nbg_reflection_centroids", &whole, &pl);
    if (rc != NBG_OK) {
        return rc;
    }
    const nbgi_kparams *k = &pl.k;
    const size_t npix = (size_t)k->npix;
    const int np = k->npanels > 0 ? k->npanels : 1;
    int lo[3] = {INT_MAX, INT_MAX, INT_MAX}, hi[3] = {INT_MIN, INT_MIN, INT_MIN};
    for (long i = 0; i < n; ++i) {
        if (panel[i] < 0 || panel[i] >= np || !isfinite(x[i]) || !isfinite(y[i])) {
            nbgi_plan_free(&pl);
            return nbgi_error(ctx, NBG_EINVAL, "nbg_reflection_centroids: reflection %ld is on panel %d at (%g, %g); "
                              "the detector has %d panel%s", i, panel[i], x[i], y[i], np, np > 1 ? "s" : "");
        }
        for (int a = 0; a < 3; ++a) {
            lo[a] = hkl[3 * i + a] < lo[a] ? hkl[3 * i + a] : lo[a];
            hi[a] = hkl[3 * i + a] > hi[a] ? hkl[3 * i + a] : hi[a];
        }
        cx[i] = cy[i] = NAN;
        if (photons != NULL) photons[i] = 0;
    }
    if (n == 0) {
        nbgi_plan_free(&pl);
        return NBG_OK;
    }
    /* one table over the reflections' indices, every entry 0 but the one rendered */
    const double size = ((double)hi[0] - lo[0] + 1) * ((double)hi[1] - lo[1] + 1) * ((double)hi[2] - lo[2] + 1);
    if ((rc = nbgi_check_bytes(ctx, size * sizeof(double), "the reflections' structure-factor table")) != NBG_OK) {
        nbgi_plan_free(&pl);
        return rc;
    }
    const long side = 2L * radius + 1;
    nbg_hkl t = {lo[0], hi[0], lo[1], hi[1], lo[2], hi[2], calloc((size_t)size, sizeof(double)), 0};
    uint32_t *list = malloc(sizeof(uint32_t) * (size_t)(side * side));
    float *img = malloc(sizeof(float) * (npix ? npix : 1));
    if (t.F == NULL || list == NULL || img == NULL) {
        free(t.F), free(list), free(img);
        nbgi_plan_free(&pl);
        return nbgi_error(ctx, NBG_ENOMEM, "nbg_reflection_centroids: out of memory");
    }
    const long nk = hi[1] - lo[1] + 1, nl = hi[2] - lo[2] + 1;
    nbg_experiment ec = whole;
    ec.hkl = &t;
    ec.default_F = 0;
    ec.bg[0] = ec.bg[1] = ec.bg[2] = 0;
    ec.mask = NULL;
    ec.roi[0] = ec.roi[1] = ec.roi[2] = ec.roi[3] = -1;
    ec.pixels = list;
    /* each reflection alone on its square (its light only: another's tails reach any square) */
    for (long i = 0; rc == NBG_OK && i < n; ++i) {
        const int *h = hkl + 3 * i;
        const long j = ((long)(h[0] - lo[0]) * nk + (h[1] - lo[1])) * nl + (h[2] - lo[2]);
        const int p = panel[i];
        long off, F, S;
        panel_extent(k, p, &off, &F, &S);
        const double fl = floor(x[i]), sl = floor(y[i]);
        const long f0 = (long)fmax(0, fl - radius), f1 = (long)fmin((double)F - 1, fl + radius);
        const long s0 = (long)fmax(0, sl - radius), s1 = (long)fmin((double)S - 1, sl + radius);
        long cnt = 0;
        for (long s2 = s0; s2 <= s1; ++s2) {
            for (long f2 = f0; f2 <= f1; ++f2) list[cnt++] = (uint32_t)(off + s2 * F + f2);
        }
        t.F[j] = entry_F(e, h);
        if (cnt == 0 || t.F[j] == 0) {
            t.F[j] = 0;
            continue;
        }
        ec.npixels_list = cnt;
        rc = nbg_simulate(ctx, &ec, img, npix, NULL);
        t.F[j] = 0;
        double sw = 0, sx = 0, sy = 0;
        for (long q = 0; rc == NBG_OK && q < cnt; ++q) {
            const long r = (long)list[q] - off;
            const double v = img[list[q]];
            sw += v, sx += v * ((double)(r % F) + 0.5), sy += v * ((double)(r / F) + 0.5);
        }
        if (sw > 0) {
            cx[i] = sx / sw;
            cy[i] = sy / sw;
        }
        if (photons != NULL) photons[i] = sw;
    }
    free(t.F), free(list), free(img);
    nbgi_plan_free(&pl);
    return rc;
}
