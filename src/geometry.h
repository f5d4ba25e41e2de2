/*
 * geometry.h -- the pixel-level geometry of nbgrad, in one place, for every loop nest: forward, adjoint and
 * tangent, scalar and row (lane) forms, CPU and CUDA.  Each formula is one NBG_HD inline function with its
 * derivative beside it; the nests call these and write none of them again.
 *
 *   which pixels are rendered          nbgi_pixel_active
 *   where a subpixel is                nbgi_subpixel_at, nbgi_layer_at, nbgi_subpixel_coords, nbgi_flat_pos,
 *                                      nbgi_subpixel_pos (flat and curved detectors)
 *   the ray to it                      nbgi_ray, nbgi_ray_at (unit direction d = P / R)
 *   scattering vector, resolution cut  nbgi_scatter_q, nbgi_dmin_keeps
 *   their lane forms (CPU row kernels) nbgi_lane_rays, nbgi_lane_q
 *   solid angle                        nbgi_solid_angle, nbgi_solid_angle_dR, nbgi_solid_angle_dclose
 *   sensor capture fraction            nbgi_capture, nbgi_capture_da
 *
 * The per-sample physics (lattice and structure factors, polarization, their derivatives) is src/physics_tmpl.h;
 * the set-up maps (cell, detector rotations) are src/setup_tmpl.h.  Geometry is double in every precision: it
 * runs once per subpixel and source, and in float the low-angle d - i cancellation and the ~1e-8 m position
 * resolution moved golden images by up to 2e-4 of their maximum (see src/row_tmpl.h).
 */
#ifndef NBG_GEOMETRY_H
#define NBG_GEOMETRY_H

#include "physics.h"
#include "setup.h"

#include <math.h>
#include <stddef.h>

/* --- panels ---------------------------------------------------------------------------------------------------
 * A multi-panel detector is rendered panel by panel through views: the whole detector's parameters with one
 * panel's geometry in the detector fields.  Every formula below then reads a panel exactly as the single detector
 * (which is a view of itself).  The image rows are the panels' rows in panel order. */

/* The view of panel k: p with the panel's pixel counts, vectors, close distance and pixel size, the mask from the
 * panel's first pixel, the whole panel as its region. */
static inline NBG_HD void nbgi_panel_view(const nbgi_kparams *p, int k, nbgi_kparams *v)
{
    const nbgi_kpanel *q = p->panels + k;
    *v = *p;
    v->fpixels = q->fpixels;
    v->spixels = q->spixels;
    v->roi_xmin = 0;
    v->roi_xmax = q->fpixels;
    v->roi_ymin = 0;
    v->roi_ymax = q->spixels;
    v->mask = p->mask != 0 ? p->mask + q->offset : 0;
    for (int x = 0; x < 3; ++x) {
        v->pix0[x] = q->pix0[x];
        v->fdet[x] = q->fdet[x];
        v->sdet[x] = q->sdet[x];
        v->odet[x] = q->odet[x];
    }
    v->close_distance = q->close_distance;
    v->pixel = q->pixel;
    v->thick = q->thick;
    v->thickstep = q->thickstep;
    v->mu = q->mu;
    v->subpixel = q->pixel / p->oversample;
    v->npanels = 0;
    v->nrows = q->spixels;
    v->npix = (long)q->fpixels * q->spixels;
    v->panels = 0;
}

/* The panel holding row r of all panels' rows (a binary search over their first rows). */
static inline NBG_HD int nbgi_panel_of_row(const nbgi_kparams *p, int r)
{
    int lo = 0, hi = p->npanels - 1;
    while (lo < hi) {
        const int mid = (lo + hi + 1) / 2;
        if (p->panels[mid].row0 <= r) {
            lo = mid;
        } else {
            hi = mid - 1;
        }
    }
    return lo;
}

/* The panel holding image index i (a binary search over the panels' offsets). */
static inline NBG_HD int nbgi_panel_of_pixel(const nbgi_kparams *p, long i)
{
    int lo = 0, hi = p->npanels - 1;
    while (lo < hi) {
        const int mid = (lo + hi + 1) / 2;
        if (p->panels[mid].offset <= i) {
            lo = mid;
        } else {
            hi = mid - 1;
        }
    }
    return lo;
}

/* Row r of the image (0 <= r < p->nrows): the parameters to render it with (p itself for the single detector, else
 * its panel's view, written into *view), its row index s within them and the image index of its first pixel. */
static inline NBG_HD const nbgi_kparams *nbgi_row_at(const nbgi_kparams *p, int r, nbgi_kparams *view, int *s,
                                                   long *first)
{
    if (p->npanels == 0) {
        *s = r;
        *first = (long)r * p->fpixels;
        return p;
    }
    const int k = nbgi_panel_of_row(p, r);
    const nbgi_kpanel *q = p->panels + k;
    nbgi_panel_view(p, k, view);
    *s = r - q->row0;
    *first = q->offset + (long)*s * q->fpixels;
    return view;
}


/* --- pixel lists ----------------------------------------------------------------------------------------------
 * The CPU kernels walk units: every row whole (nbgi_nunits = nrows), or with a pixel list its runs of neighbouring
 * listed pixels.  Unit u: the row r among all panels' rows, its pixels [*fa, *fb) within the row, and the list
 * position of pixel *fa (or -1 without a list). */
static inline long nbgi_nunits(const nbgi_kparams *p)
{
    return p->list != 0 ? p->nruns : p->nrows;
}

static inline int nbgi_walk_unit(const nbgi_kparams *p, long u, int *fa, int *fb, long *pos)
{
    if (p->list == 0) {
        *fa = 0;
        *fb = p->npanels == 0 ? p->fpixels : p->panels[nbgi_panel_of_row(p, (int)u)].fpixels;
        *pos = -1;
        return (int)u;
    }
    const nbgi_run *q = p->runs + u;
    *fa = q->f0;
    *fb = q->f0 + q->n;
    *pos = q->pos;
    return q->r;
}

/* Sums over the image are cut into fixed chunks, at most NBGI_MAXCHUNKS, whatever thread runs each; the chunks'
 * sums are added in chunk order, so that a sum does not depend on the thread count.  Chunk c of nch over n items
 * is [*lo, *hi). */
#define NBGI_MAXCHUNKS 1024
static inline void nbgi_chunk(long c, long nch, long n, long *lo, long *hi)
{
    *lo = (long)((double)c * (double)n / nch);
    *hi = (long)((double)(c + 1) * (double)n / nch);
}

/* The pixels a loop over the image visits: the list's (image index nbgi_walk_at(p, t), t < nbgi_nwalk) or all. */
static inline long nbgi_nwalk(const nbgi_kparams *p)
{
    return p->list != 0 ? p->nlist : p->npix;
}

/* The samples a render of p computes (pixels walked x subpixels x thickness steps x sources x phi x mosaic).  Below
 * NBGI_PARALLEL_MIN the CPU kernels run on the calling thread: waking OpenMP's threads (and their spinning after
 * the loop) costs more than such an image's work, several ms against ~0.1 ms for an 8x8 image on a busy 2-core
 * machine.  No result depends on it (sums are added in chunk order, whatever thread runs a chunk). */
#define NBGI_PARALLEL_MIN 65536.0
static inline double nbgi_samples(const nbgi_kparams *p)
{
    const double os = p->oversample > 0 ? p->oversample : 1;
    return (double)nbgi_nwalk(p) * os * os * (p->thicksteps > 0 ? p->thicksteps : 1) *
           (p->nsources > 0 ? p->nsources : 1) * (p->nphi > 0 ? p->nphi : 1) * (p->nmos > 0 ? p->nmos : 1);
}

static inline size_t nbgi_walk_at(const nbgi_kparams *p, long t)
{
    return p->list != 0 ? (size_t)p->list[t] : (size_t)t;
}

static inline NBG_HD int nbgi_pixel_active(const nbgi_kparams *p, int f, int s);

/* Whether image pixel i of any detector is rendered (nbgi_pixel_active of its panel). */
static inline NBG_HD int nbgi_pixel_active_at(const nbgi_kparams *p, long i)
{
    if (p->npanels == 0) {
        return nbgi_pixel_active(p, (int)(i % p->fpixels), (int)(i / p->fpixels));
    }
    return p->mask == 0 || p->mask[i] != 0; /* a panel's region is the whole panel (no -roi with panels) */
}

/* Whether pixel (f, s) is rendered: inside the inclusive ROI and not masked. */
static inline NBG_HD int nbgi_pixel_active(const nbgi_kparams *p, int f, int s)
{
    if (f < 0 || f >= p->fpixels || f < p->roi_xmin || f > p->roi_xmax || s < p->roi_ymin || s > p->roi_ymax) {
        return 0;
    }
    return p->mask == 0 || p->mask[(long)s * p->fpixels + f] != 0;
}

/* Whether every one of pixels f0 .. f0+n-1 of row s is rendered, by the ROI alone (no mask): the test a row of
 * lanes takes once instead of each lane's nbgi_pixel_active. */
static inline NBG_HD int nbgi_all_active(const nbgi_kparams *p, int s, int f0, int n)
{
    return p->mask == 0 && f0 >= p->roi_xmin && f0 + n - 1 <= p->roi_xmax && s >= p->roi_ymin &&
           s <= p->roi_ymax && f0 + n <= p->fpixels;
}

/* Whether any of pixels f0 .. f0+n-1 of row s is rendered.  The CPU kernels skip a group of lanes with none: the row
 * kernels give such pixels 0 and add nothing to any sum (solid angle, table misses, gradients), so that skipping them
 * changes no bit, and a region of interest or a mask costs in proportion to what it leaves. */
static inline NBG_HD int nbgi_any_active(const nbgi_kparams *p, int s, int f0, int n)
{
    if (nbgi_all_active(p, s, f0, n)) {
        return 1;
    }
    for (int j = 0; j < n; ++j) {
        if (nbgi_pixel_active(p, f0 + j, s)) {
            return 1;
        }
    }
    return 0;
}

/* The centre of subpixel sub of pixel `pixel` along one detector axis (m), subpixels of size subpixel, os per
 * pixel.  Scalars rather than the kernel parameters, so that a lane loop keeps them in registers (reading them
 * through the parameters' pointer inside the loop stopped its vectorisation). */
static inline NBG_HD double nbgi_subpixel_center(double subpixel, int os, int pixel, int sub)
{
    return subpixel * (double)(pixel * os + sub) + subpixel / 2;
}

/* The same for the kernel parameters' detector. */
static inline NBG_HD double nbgi_subpixel_at(const nbgi_kparams *p, int pixel, int sub)
{
    return nbgi_subpixel_center(p->subpixel, p->oversample, pixel, sub);
}

/* The depth of sensor layer t along the normal (m). */
/* The depth (m) of sensor layer t along the normal: nanoBragg's t dz, or the physical model's middle of the layer's
 * share of the photons absorbed at normal incidence, -ln(1 - (t + 1/2) c / n) / mu, c = 1 - exp(-T mu)
 * (nbg_sensor_model).  A layer's depth is a constant of the plan: no parameter moves it. */
static inline NBG_HD double nbgi_layer_at(const nbgi_kparams *p, int t)
{
    if (p->sensor_phys && p->thick > 0 && p->mu > 0) {
        const double c = -expm1(-p->thick * p->mu);
        return -log1p(-((double)t + 0.5) * c / (double)p->thicksteps) / p->mu;
    }
    return (double)(t * p->thickstep);
}

/* The detector-frame coordinates (m) of subpixel (subF, subS) of layer t: along fast, slow and the normal. */
static inline NBG_HD void nbgi_subpixel_coords(const nbgi_kparams *p, int fpixel, int spixel, int subF, int subS,
                                              int t, double *Fdet, double *Sdet, double *Odet)
{
    *Fdet = nbgi_subpixel_at(p, fpixel, subF);
    *Sdet = nbgi_subpixel_at(p, spixel, subS);
    *Odet = nbgi_layer_at(p, t);
}

/* One lab component of the point at detector coordinates (Fdet, Sdet, Odet) of a flat detector, relative to the
 * sample (m), from that component of the fast, slow and normal axes and of pix0.  (Per component, with scalars:
 * the lane loops vectorise it; the three-vector form through the parameters' pointer stopped that.) */
static inline NBG_HD double nbgi_flat_component(double Fdet, double Sdet, double Odet, double f, double s, double o,
                                                double pix0)
{
    return Fdet * f + Sdet * s + Odet * o + pix0;
}

/* The point at detector coordinates (Fdet, Sdet, Odet) of a flat detector, relative to the sample (m). */
static inline NBG_HD void nbgi_flat_pos(const nbgi_kparams *p, double Fdet, double Sdet, double Odet, double *P)
{
    for (int x = 0; x < 3; ++x) {
        P[x] = nbgi_flat_component(Fdet, Sdet, Odet, p->fdet[x], p->sdet[x], p->odet[x], p->pix0[x]);
    }
}

/* The position of subpixel (subF, subS) of layer t, relative to the sample (m). */
static inline NBG_HD void nbgi_subpixel_pos(const nbgi_kparams *p, int fpixel, int spixel, int subF, int subS, int t,
                                           double *P)
{
    double Fdet, Sdet, Odet;
    nbgi_subpixel_coords(p, fpixel, spixel, subF, subS, t, &Fdet, &Sdet, &Odet);
    nbgi_flat_pos(p, Fdet, Sdet, Odet, P);
    if (p->curved) {
        /* every pixel at `distance` from the sample: swing distance*beam about s by P_y/distance, then about f by
         * P_z/distance (nanoBragg uses the flat position's lab y and z components as the angles) */
        const double dist = p->distance;
        double v[3], w[3], f[3], s[3];
        for (int x = 0; x < 3; ++x) {
            v[x] = dist * p->beam[x];
            f[x] = p->fdet[x];
            s[x] = p->sdet[x];
        }
        const double ay = P[1] / dist, az = P[2] / dist;
        rotate_axis_d(v, s, ay, w);
        rotate_axis_d(w, f, az, P);
    }
}

/* The ray to a subpixel: position P, unit direction d = P / |P|, distance R and the detector coordinates. */
typedef struct {
    double P[3], d[3], R, Fdet, Sdet, Odet;
} nbgi_ray;

static inline NBG_HD void nbgi_ray_at(const nbgi_kparams *p, int fpixel, int spixel, int subF, int subS, int t,
                                     nbgi_ray *r)
{
    nbgi_subpixel_coords(p, fpixel, spixel, subF, subS, t, &r->Fdet, &r->Sdet, &r->Odet);
    nbgi_subpixel_pos(p, fpixel, spixel, subF, subS, t, r->P);
    r->R = sqrt(r->P[0] * r->P[0] + r->P[1] * r->P[1] + r->P[2] * r->P[2]);
    for (int x = 0; x < 3; ++x) {
        r->d[x] = r->P[x] / r->R;
    }
}

/* Whether scattering vector q (1/m) survives the resolution cut: dmin <= 1 / |q| (nanoBragg's 0.5 / stol). */
static inline NBG_HD int nbgi_dmin_keeps(double dmin, double q0, double q1, double q2)
{
    if (dmin > 0) {
        const double stol = 0.5 * sqrt(q0 * q0 + q1 * q1 + q2 * q2);
        return !(stol > 0 && dmin > 0.5 / stol);
    }
    return 1;
}

/* The scattering vector q = (d - i) / lambda (1/m) of unit direction d and source src; 0 when the resolution cut
 * removes it. */
static inline NBG_HD int nbgi_scatter_q(const nbgi_kparams *p, const double *d, int src, double *q)
{
    const double *sr = p->src + NBG_SRC_STRIDE * src;
    const double ilambda = 1 / sr[3];
    for (int x = 0; x < 3; ++x) {
        q[x] = (d[x] - sr[x]) * ilambda;
    }
    return nbgi_dmin_keeps(p->dmin, q[0], q[1], q[2]);
}

/* The solid angle of a pixel seen at distance R: pixel^2 / R^2 * cos(obliquity), cos(obliquity) = close / R;
 * 1 / R^2 for -point_pixel.  (The _of form takes the plan's values, for lane loops that must not read them through
 * p: a load through p in a loop that stores through another pointer stops GCC vectorising it.) */
static inline NBG_HD double nbgi_solid_angle_of(int point_pixel, double pixel2, double close, double R)
{
    /* one division, of the selected numerator by the selected power of R (the two-division form was two of them
     * a lane in the row kernels' loops, which compute both sides of the select) */
    const double R2 = R * R;
    return (point_pixel ? 1 : pixel2 * close) / (point_pixel ? R2 : R2 * R);
}

static inline NBG_HD double nbgi_solid_angle(const nbgi_kparams *p, double R)
{
    return nbgi_solid_angle_of(p->point_pixel, p->pixel * p->pixel, p->close_distance, R);
}

/* d omega / d R of nbgi_solid_angle, given omega (-3 omega / R; -2 omega / R for a point pixel). */
static inline NBG_HD double nbgi_solid_angle_dR_of(int point_pixel, double R, double omega)
{
    return (point_pixel ? -2 : -3) * omega / R;
}

static inline NBG_HD double nbgi_solid_angle_dR(const nbgi_kparams *p, double R, double omega)
{
    return nbgi_solid_angle_dR_of(p->point_pixel, R, omega);
}

/* d omega / d close_distance of nbgi_solid_angle, given omega: omega / close_distance (0 for a point pixel). */
static inline NBG_HD double nbgi_solid_angle_dclose_of(int point_pixel, double close, double omega)
{
    const double v = omega / close; /* unconditional: a lane loop without masked division (AVX2) vectorises it */
    return point_pixel ? 0 : v;
}

static inline NBG_HD double nbgi_solid_angle_dclose(const nbgi_kparams *p, double omega)
{
    return nbgi_solid_angle_dclose_of(p->point_pixel, p->close_distance, omega);
}

/* The weight of every sensor layer's sum (the kernels apply it once, at the last layer t) for a ray with rho = d . o
 * (the cosine of its angle to the normal), as a function of a (*a receives it; d a / d rho = -a / rho):
 *   nanoBragg's   exp(-t a) - exp(-(t+1) a), a = dz mu / rho: the capture of the slab below layer t;
 *   physical      (1 - exp(-a)) / n, a = T mu / rho: the sensor's capture, shared alike by its n layers. */
static inline NBG_HD double nbgi_capture(const nbgi_kparams *p, int t, double rho, double *a)
{
    if (p->sensor_phys) {
        *a = (p->thick * p->mu) / rho;
        return -expm1(-*a) / (double)p->thicksteps;
    }
    *a = (p->thickstep * p->mu) / rho;
    return exp(-(double)t * *a) - exp(-(double)(t + 1) * *a);
}

/* d capture / d a of nbgi_capture; d a / d rho = -a / rho. */
static inline NBG_HD double nbgi_capture_da(const nbgi_kparams *p, int t, double a)
{
    if (p->sensor_phys) {
        return exp(-a) / (double)p->thicksteps;
    }
    return -(double)t * exp(-(double)t * a) + (double)(t + 1) * exp(-(double)(t + 1) * a);
}

/* --- lane forms (the row kernels: w lanes in `omp simd` loops on the CPU, one lane on the device) ------------- */
/* The unit directions d = P / R, distances R and fast coordinates Fdet of subpixel (subF, Sdet, Odet) of the w
 * lanes starting at fpixel f0 on a flat detector: nbgi_subpixel_pos's arithmetic, across the lanes; with rcp (a
 * constant at every call) d = P (1 / R), one division a ray instead of three (d moves by an ulp of double), for the
 * single-precision forward, whose per-sample work rounds to float after it.  Shared by the forward, adjoint and
 * tangent row kernels (nbgi_lane_rays: rcp 0). */
static inline NBG_HD void nbgi_lane_rays_as(const nbgi_kparams *p, int f0, int subF, double Sdet, double Odet, int w,
                                           double *NBG_RESTRICT d0, double *NBG_RESTRICT d1,
                                           double *NBG_RESTRICT d2, double *NBG_RESTRICT Rl,
                                           double *NBG_RESTRICT Fd, const int rcp)
{
    const int os = p->oversample;
    const double sub = p->subpixel;
#pragma omp simd
    for (int j = 0; j < w; ++j) {
        const double Fdet = nbgi_subpixel_center(sub, os, f0 + j, subF);
        double P[3];
        for (int x = 0; x < 3; ++x) {
            P[x] = nbgi_flat_component(Fdet, Sdet, Odet, p->fdet[x], p->sdet[x], p->odet[x], p->pix0[x]);
        }
        const double R = sqrt(P[0] * P[0] + P[1] * P[1] + P[2] * P[2]);
        if (rcp) {
            const double r = 1 / R;
            d0[j] = P[0] * r;
            d1[j] = P[1] * r;
            d2[j] = P[2] * r;
        } else {
            d0[j] = P[0] / R;
            d1[j] = P[1] / R;
            d2[j] = P[2] / R;
        }
        Rl[j] = R;
        Fd[j] = Fdet;
    }
}

static inline NBG_HD void nbgi_lane_rays(const nbgi_kparams *p, int f0, int subF, double Sdet, double Odet, int w,
                                        double *NBG_RESTRICT d0, double *NBG_RESTRICT d1, double *NBG_RESTRICT d2,
                                        double *NBG_RESTRICT Rl, double *NBG_RESTRICT Fd)
{
    nbgi_lane_rays_as(p, f0, subF, Sdet, Odet, w, d0, d1, d2, Rl, Fd, 0);
}

/* The scattering vectors q = (d - i) / lambda of source src across the w lanes, and whether each survives the
 * resolution cut (valid): nbgi_scatter_q's arithmetic, across the lanes.  Shared by the row kernels. */
static inline NBG_HD void nbgi_lane_q(const nbgi_kparams *p, int src, int w, const double *d0, const double *d1,
                                     const double *d2, double *NBG_RESTRICT q0, double *NBG_RESTRICT q1,
                                     double *NBG_RESTRICT q2, int *NBG_RESTRICT valid)
{
    const double *sr = p->src + NBG_SRC_STRIDE * src;
    const double inc[3] = {sr[0], sr[1], sr[2]};
    const double ilambda = 1 / sr[3];
    const double dmin = p->dmin;
#pragma omp simd
    for (int j = 0; j < w; ++j) {
        q0[j] = (d0[j] - inc[0]) * ilambda;
        q1[j] = (d1[j] - inc[1]) * ilambda;
        q2[j] = (d2[j] - inc[2]) * ilambda;
        valid[j] = nbgi_dmin_keeps(dmin, q0[j], q1[j], q2[j]);
    }
}

#endif
