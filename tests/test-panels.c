/*
 * test-panels.c -- multi-panel detectors.
 *
 * Checks:
 *   tile-<conv>-<case>   4 x 3 panels that cut a 96 x 72 flat detector without gaps render the flat detector's
 *                        image pixel for pixel (rearranged into panel order), in MOSFLM's and XDS's conventions, plain,
 *                        rotated (three rotations and two-theta) with a thick sensor and oversampling; the panels'
 *                        positions are the plane's by another sum, so equal to rounding (<= 1e-9 of the maximum)
 *   tile-float           the same in float
 *   gaps                 3 x 2 panels with gaps: every panel pixel equals the flat detector's at the same place
 *   lab                  the tiling given in the lab frame (the report's vectors) renders the same image
 *   tilted               a panel turned about its own fast axis sees what a flat detector so placed sees
 *   layout-<name>        the built-in layouts' panel counts, pixel counts and plane sizes; the plan accepts them
 *   grad-tile            nbg_simulate_grad on the tiling equals the flat detector's for every parameter (crystal,
 *                        beam and detector: the panels' gradients carried to the plane), to 1e-7
 *   jvp-tile             nbg_simulate_jvp likewise (a, rotx, distance, det_rotx)
 *   gradcheck-<param>    the finite-difference check on a detector of panels with gaps, its plane turned by
 *                        det_tau (a, rotx, distance, det_rotx, beam_fast, det_tau1-3)
 *   expt-panels          a DIALS experiment list of two panels (halves of a flat detector) renders the flat image
 *   mpfiles-<what>       three panels of a rotated MOSFLM detector (different widths, one turned, one tilted) in
 *                        DIALS's frame: the experiment list read back to 1e-9 and rendered again to the same image,
 *                        the NXmx file read back (the image, every module as a panel to 1e-9); refusals: a mask
 *                        with panels of different widths (no temporary left), a panel with no pixel size (named),
 *                        a panel table of the wrong size
 *   mplist-<list>-<what> a multi-panel list through the program's builder (-expt; the three panels above, and 2 x 2
 *                        modules): its panels in the plane's frame render the list's image; distance, beam shifts
 *                        and det_tau move the whole detector rigidly; their gradient check; the modules moved and
 *                        turned as one, refined back from the list (DIALS's multi-panel detector parameterisation)
 *   refuse-<what>        zero-length and parallel axes, non-perpendicular axes, a panel behind the sample, two
 *                        overlapping panels (in one plane, and crossing), -roi with panels, a wrong buffer size,
 *                        an unknown layout, detector gradients of lab-frame panels: errors naming the panel; a
 *                        motion group out of range, a non-finite motion, motions without panels, motion gradients
 *                        without motions, a negative sensor thickness
 *   motion-apply-<frame> three motion groups (3, 2 and 1 panels, shifted and turned about their pivots) render the
 *                        panels moved by hand, in the plane and lab frames
 *   motion-gradcheck-*   the finite-difference check of all 18 motion components (and rotz), both frames
 *   motion-jvp           38 tangent images (36 motion components: more than one pass of the tangent kernel) against
 *                        the adjoint
 *   motion-refine        12 shifts and turns of 4 panels fitted from no motion on 5 noisy images: the errors in
 *                        standard errors look like noise (rms 0.6 to 1.5, none beyond 4)
 *   sensor-*             panels with sensors of their own render as flat detectors with those sensors; gradcheck
 *                        through them; an experiment list carries them
 */
#include "testutil.h" /* first: it sets _GNU_SOURCE */
#include "nbgrad.h"

#include <dirent.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void base(nbg_experiment *e)
{
    nbg_experiment_default(e);
    e->has_cell = 1;
    const double cell[6] = {40, 50, 60, 80, 85, 95};
    memcpy(e->cell, cell, sizeof cell);
    e->misset[0] = 10, e->misset[1] = 5, e->misset[2] = 3;
    e->default_F = 100;
    e->Na = e->Nb = e->Nc = 5;
    e->lambda = 1;
    e->distance = 60;
    e->pixel = 0.4;
    e->fpixels = 96;
    e->spixels = 72;
    e->polarization = 0.9;
}

/* nx x ny panels of pf x ps pixels in the plane, gf and gs pixels apart. */
static int tile(const nbg_experiment *flat, int nx, int ny, int pf, int ps, int gf, int gs, nbg_panel *pan)
{
    int n = 0;
    for (int j = 0; j < ny; ++j) {
        for (int i = 0; i < nx; ++i, ++n) {
            nbg_panel *q = &pan[n];
            memset(q, 0, sizeof *q);
            q->fpixels = pf;
            q->spixels = ps;
            q->fast[0] = 1;
            q->slow[1] = 1;
            q->origin[0] = flat->pixel * i * (pf + gf);
            q->origin[1] = flat->pixel * j * (ps + gs);
            snprintf(q->name, sizeof q->name, "t%d_%d", j, i);
        }
    }
    return n;
}

/* 2 x 2 panels of side x side pixels, 3 and 5 pixels apart, of base's crystal on a MOSFLM detector turned by
 * det_rotx 2, det_roty -3: e's panels are pan (4). */
static void rotated_tiles(nbg_experiment *e, int side, nbg_panel *pan)
{
    base(e);
    e->convention = NBG_CONV_MOSFLM;
    e->det_rot[0] = 2, e->det_rot[1] = -3;
    e->fpixels = 2 * side + 3, e->spixels = 2 * side + 5;
    e->npanels = tile(e, 2, 2, side, side, 3, 5, pan);
    e->panels = pan;
}

/* max |panel pixel - flat pixel at the same place| / max |flat| over the panels of a grid (tile's layout). */
static double grid_diff(const float *flat, int F, const float *img, int nx, int ny, int pf, int ps, int gf, int gs,
                        int *bitwise, double *mx)
{
    double d = 0, m = 0;
    long i = 0;
    *bitwise = 1;
    for (int j = 0; j < ny; ++j) {
        for (int k = 0; k < nx; ++k) {
            for (int s = 0; s < ps; ++s) {
                for (int f = 0; f < pf; ++f, ++i) {
                    const float a = flat[(long)(j * (ps + gs) + s) * F + k * (pf + gf) + f];
                    m = fmax(m, fabs(a));
                    d = fmax(d, fabs((double)a - img[i]));
                    *bitwise &= a == img[i];
                }
            }
        }
    }
    *mx = m;
    return m > 0 ? d / m : INFINITY;
}

static float *render(nbg_ctx *ctx, const nbg_experiment *e, size_t *n, int *rc)
{
    nbg_report r;
    *rc = nbg_describe(ctx, e, &r);
    if (*rc != NBG_OK) {
        return NULL;
    }
    *n = r.npix;
    float *img = malloc(r.npix * sizeof(float));
    *rc = nbg_simulate(ctx, e, img, r.npix, NULL);
    return img;
}

static void tiling(nbg_ctx *ctx, nbg_ctx *ctxf)
{
    const nbg_convention conv[2] = {NBG_CONV_MOSFLM, NBG_CONV_XDS};
    const char *cname[2] = {"mosflm", "xds"};
    nbg_panel pan[12];
    for (int c = 0; c < 2; ++c) {
        for (int v = 0; v < 2; ++v) {
            nbg_experiment e;
            base(&e);
            e.convention = conv[c];
            if (v == 1) {
                e.det_rot[0] = 4, e.det_rot[1] = -3, e.det_rot[2] = 7, e.twotheta = 12;
                e.thick = 300, e.thicksteps = 2, e.oversample = 2;
            }
            size_t nf, np;
            int rc1, rc2;
            float *flat = render(ctx, &e, &nf, &rc1);
            e.npanels = tile(&e, 4, 3, 24, 24, 0, 0, pan);
            e.panels = pan;
            float *img = render(ctx, &e, &np, &rc2);
            char id[64];
            snprintf(id, sizeof id, "tile-%s-%s", cname[c], v ? "rotated-thick" : "plain");
            int bit;
            double mx;
            const double d = rc1 == NBG_OK && rc2 == NBG_OK && np == nf
                                 ? grid_diff(flat, 96, img, 4, 3, 24, 24, 0, 0, &bit, &mx) : INFINITY;
            nbgi_test_check(d <= 1e-9, id, "12 panels vs the flat detector: max |diff| %.3g of max %.4g (%s; %s)", d,
                           mx, bit ? "bitwise" : "to rounding", rc2 == NBG_OK ? "ok" : nbg_errmsg(ctx));
            if (c == 1 && v == 1) {
                free(flat);
                free(img);
                nbg_experiment ef = e;
                ef.npanels = 0;
                ef.panels = NULL;
                flat = render(ctxf, &ef, &nf, &rc1);
                img = render(ctxf, &e, &np, &rc2);
                const double df = grid_diff(flat, 96, img, 4, 3, 24, 24, 0, 0, &bit, &mx);
                nbgi_test_check(rc2 == NBG_OK && df <= 1e-5, "tile-float", "float: max |diff| %.3g of max %.4g", df,
                               mx);
            }
            free(flat);
            free(img);
        }
    }
}

static void gaps_and_frames(nbg_ctx *ctx)
{
    nbg_experiment e;
    base(&e);
    e.convention = NBG_CONV_XDS;
    e.det_rot[0] = 3, e.det_rot[1] = 5;
    e.fpixels = 68, e.spixels = 44;
    size_t nf, np;
    int rc1, rc2, bit;
    double mx;
    float *flat = render(ctx, &e, &nf, &rc1);
    nbg_panel pan[6];
    e.npanels = tile(&e, 3, 2, 20, 20, 4, 4, pan);
    e.panels = pan;
    float *img = render(ctx, &e, &np, &rc2);
    double d = rc2 == NBG_OK && np == 6 * 400 ? grid_diff(flat, 68, img, 3, 2, 20, 20, 4, 4, &bit, &mx) : INFINITY;
    nbgi_test_check(d <= 1e-9, "gaps", "6 panels with 4-pixel gaps: every panel pixel equals the flat one (max "
                   "|diff| %.3g of max %.4g, %s)", d, mx, rc2 == NBG_OK ? "ok" : nbg_errmsg(ctx));

    /* the same panels in the lab frame, from the plane's vectors in the report */
    nbg_panel lab[6];
    nbgi_test_panels_lab(ctx, &e, lab);
    nbg_experiment el = e;
    el.panels = lab;
    el.panel_frame = NBG_PANELS_LAB;
    el.det_rot[0] = 20; /* ignored: lab panels stay where they are */
    free(img);
    img = render(ctx, &el, &np, &rc2);
    d = rc2 == NBG_OK && np == 6 * 400 ? grid_diff(flat, 68, img, 3, 2, 20, 20, 4, 4, &bit, &mx) : INFINITY;
    nbgi_test_check(d <= 1e-9, "lab", "the panels in the lab frame: max |diff| %.3g of max %.4g (%s)", d, mx,
                   rc2 == NBG_OK ? "ok" : nbg_errmsg(ctx));

    /* detector gradients of lab panels: refused */
    double g = 0;
    const nbg_param pdist = NBG_P_DISTANCE, pa = NBG_P_A;
    float *w = malloc(np * sizeof(float));
    for (size_t i = 0; i < np; ++i) {
        w[i] = 1;
    }
    const int grc = nbg_simulate_grad(ctx, &el, w, &pdist, 1, &g, img, np, NULL);
    nbgi_test_check(grc == NBG_EUNSUP && strstr(nbg_errmsg(ctx), "lab") != NULL, "refuse-grad-lab-detector", "%s",
                   nbg_errmsg(ctx));
    g = 0;
    const int grc2 = nbg_simulate_grad(ctx, &el, w, &pa, 1, &g, img, np, NULL);
    nbgi_test_check(grc2 == NBG_OK && g != 0, "grad-lab-crystal", "the cell gradient on lab panels: %g", g);
    free(w);
    free(flat);
    free(img);

    /* one panel turned by 20 deg about its own fast axis through its centre row: the flat detector rotated about
     * the same axis (XDS: det_rotx turns about lab x = the fast axis, sample pivot through the near point) */
    nbg_experiment t;
    base(&t);
    t.convention = NBG_CONV_XDS;
    t.fpixels = t.spixels = 40;
    t.det_rot[0] = 20;
    nbg_report rt;
    nbg_describe(ctx, &t, &rt);
    flat = render(ctx, &t, &nf, &rc1);
    nbg_panel one;
    memset(&one, 0, sizeof one);
    one.fpixels = one.spixels = 40;
    for (int x = 0; x < 3; ++x) {
        one.fast[x] = rt.fdet[x];
        one.slow[x] = rt.sdet[x];
        one.origin[x] = 1000 * rt.pix0[x];
    }
    nbg_experiment tp;
    base(&tp);
    tp.convention = NBG_CONV_XDS; /* the lab frame is the convention's (the beam along +z) */
    tp.npanels = 1, tp.panels = &one, tp.panel_frame = NBG_PANELS_LAB;
    img = render(ctx, &tp, &np, &rc2);
    d = rc2 == NBG_OK && np == nf ? grid_diff(flat, 40, img, 1, 1, 40, 40, 0, 0, &bit, &mx) : INFINITY;
    nbgi_test_check(d <= 1e-9, "tilted", "a tilted lab panel equals the rotated flat detector: %.3g of max %.4g (%s)",
                   d, mx, rc2 == NBG_OK ? "ok" : nbg_errmsg(ctx));
    free(flat);
    free(img);
}

static void layouts(nbg_ctx *ctx)
{
    const struct {
        const char *name;
        int n;
        long npix;
        int F, S;
        double px;
    } want[4] = {{"pilatus6m", 60, 60L * 487 * 195, 2463, 2527, 0.172},
                 {"eiger2_16m", 32, 32L * 1028 * 512, 4148, 4362, 0.075},
                 {"jungfrau16m", 256, 256L * 256 * 256, 4150, 4371, 0.075},
                 {"cspad", 64, 64L * 194 * 185, 0, 0, 0.11}};
    for (int i = 0; i < 4; ++i) {
        int n = 0, F = 0, S = 0;
        double px = 0;
        int rc = nbg_layout(ctx, want[i].name, NULL, 0, &n, NULL, NULL, NULL);
        nbg_panel *pan = calloc((size_t)n + 1, sizeof *pan);
        rc = rc == NBG_OK ? nbg_layout(ctx, want[i].name, pan, n, &n, &px, &F, &S) : rc;
        nbg_experiment e;
        base(&e);
        e.pixel = px, e.fpixels = F, e.spixels = S, e.distance = 200;
        e.panels = pan, e.npanels = n;
        nbg_report r;
        memset(&r, 0, sizeof r);
        const int drc = rc == NBG_OK ? nbg_describe(ctx, &e, &r) : rc;
        char id[64];
        snprintf(id, sizeof id, "layout-%s", want[i].name);
        nbgi_test_check(rc == NBG_OK && drc == NBG_OK && n == want[i].n && (long)r.npix == want[i].npix &&
                           r.npanels == n && px == want[i].px && (want[i].F == 0 || (F == want[i].F && S == want[i].S)),
                       id, "%d panels, %zu pixels, plane %d x %d of %g mm (%s)", n, r.npix, F, S, px,
                       drc == NBG_OK ? "accepted" : nbg_errmsg(ctx));
        free(pan);
    }
    int n = 0;
    const int rc = nbg_layout(ctx, "pilatus3m", NULL, 0, &n, NULL, NULL, NULL);
    nbgi_test_check(rc == NBG_EINVAL && strstr(nbg_errmsg(ctx), "pilatus6m") != NULL, "refuse-layout", "%s",
                   nbg_errmsg(ctx));
}

static double grad_rel(double a, double b, double scale) { return fabs(a - b) / fmax(fmax(fabs(a), fabs(b)), scale); }

static void gradients(nbg_ctx *ctx)
{
    nbg_experiment e;
    base(&e);
    e.convention = NBG_CONV_MOSFLM;
    e.det_rot[0] = 2, e.det_rot[1] = 3, e.twotheta = 5;
    e.thick = 200, e.thicksteps = 2;
    e.fpixels = 48, e.spixels = 36;
    const size_t n = 48 * 36;
    float *w = malloc(n * 4), *wp = malloc(n * 4), *a = malloc(n * 4), *b = malloc(n * 4);
    for (size_t i = 0; i < n; ++i) {
        w[i] = (float)(0.5 + 0.5 * cos(0.37 * (double)i));
    }
    nbg_panel pan[12];
    nbg_experiment ep = e;
    ep.npanels = tile(&e, 4, 3, 12, 12, 0, 0, pan);
    ep.panels = pan;
    /* the weights in panel order */
    long i = 0;
    for (int j = 0; j < 3; ++j) {
        for (int k = 0; k < 4; ++k) {
            for (int s = 0; s < 12; ++s) {
                for (int f = 0; f < 12; ++f) {
                    wp[i++] = w[(j * 12 + s) * 48 + k * 12 + f];
                }
            }
        }
    }
    /* every scalar parameter but the mosaic spread */
    double gf[NBG_NPARAMS] = {0}, gp[NBG_NPARAMS] = {0};
    nbg_param m[NBG_NPARAMS];
    int nm = 0;
    for (int p = 0; p < NBG_NPARAMS; ++p) {
        if (p != NBG_P_MOSAIC) {
            m[nm++] = p;
        }
    }
    const int rc1 = nbg_simulate_grad(ctx, &e, w, m, nm, gf, a, n, NULL);
    const int rc2 = nbg_simulate_grad(ctx, &ep, wp, m, nm, gp, b, n, NULL);
    double gmax = 0, worst = 0;
    int wp_ = 0;
    for (int j = 0; j < nm; ++j) {
        gmax = fmax(gmax, fabs(gf[j]));
    }
    for (int j = 0; j < nm; ++j) {
        const double r = grad_rel(gp[j], gf[j], 1e-9 * gmax);
        if (r > worst) {
            worst = r, wp_ = j;
        }
    }
    nbgi_test_check(rc1 == NBG_OK && rc2 == NBG_OK && worst <= 1e-7, "grad-tile",
                   "every gradient of 12 tiling panels equals the flat detector's: worst %.3g (%s: %.9g vs %.9g; %s)",
                   worst, nbg_param_name(m[wp_]), gp[wp_], gf[wp_],
                   rc2 == NBG_OK ? "ok" : nbg_errmsg(ctx));

    const nbg_param jp[4] = {NBG_P_A, NBG_P_ROTX, NBG_P_DISTANCE, NBG_P_DET_ROTX};
    double *tf = malloc(4 * n * sizeof(double)), *tp = malloc(4 * n * sizeof(double));
    const int jr1 = nbg_simulate_jvp(ctx, &e, jp, 4, tf, a, n);
    const int jr2 = nbg_simulate_jvp(ctx, &ep, jp, 4, tp, b, n);
    double jworst = 0, jmax = 0;
    for (int q = 0; q < 4; ++q) {
        i = 0;
        for (int j = 0; j < 3; ++j) {
            for (int k = 0; k < 4; ++k) {
                for (int s = 0; s < 12; ++s) {
                    for (int f = 0; f < 12; ++f, ++i) {
                        const double x = tf[q * n + (size_t)((j * 12 + s) * 48 + k * 12 + f)], y = tp[q * n + i];
                        jmax = fmax(jmax, fabs(x));
                        jworst = fmax(jworst, fabs(x - y));
                    }
                }
            }
        }
    }
    nbgi_test_check(jr1 == NBG_OK && jr2 == NBG_OK && jmax > 0 && jworst <= 1e-7 * jmax, "jvp-tile",
                   "tangent images of a, rotx, distance, det_rotx: max |diff| %.3g of %.3g (%s)", jworst, jmax,
                   jr2 == NBG_OK ? "ok" : nbg_errmsg(ctx));
    free(tf);
    free(tp);

    /* gradcheck on panels with gaps */
    nbg_experiment eg = e;
    nbg_panel gp6[6];
    eg.npanels = tile(&e, 3, 2, 10, 10, 3, 5, gp6);
    eg.panels = gp6;
    /* the plane turned about its own frame (det_tau), which the panels follow */
    eg.det_tau[0] = 2, eg.det_tau[1] = -1.5, eg.det_tau[2] = 1;
    nbg_gradcheck_result res[8];
    const nbg_param cm[8] = {NBG_P_A, NBG_P_ROTX, NBG_P_DISTANCE, NBG_P_BEAM_FAST, NBG_P_DET_ROTX,
                             NBG_P_DET_TAU1, NBG_P_DET_TAU2, NBG_P_DET_TAU3};
    const int grc = nbg_gradcheck(ctx, &eg, cm, 8, 1e-6, 1, res);
    const int nres = grc == NBG_OK ? 8 : 0;
    nbgi_test_check(grc == NBG_OK && nres == 8, "gradcheck", "%d parameters checked (%s)", nres,
                   grc == NBG_OK ? "ok" : nbg_errmsg(ctx));
    for (int k = 0; k < nres; ++k) {
        char id[64];
        snprintf(id, sizeof id, "gradcheck-%s", nbg_param_name(res[k].param));
        nbgi_test_check(res[k].pass, id, "adjoint=%.10g numeric=%.10g relerr=%.2g %s", res[k].adjoint,
                       res[k].numeric, res[k].relerr, res[k].reason);
    }
    free(w);
    free(wp);
    free(a);
    free(b);
}

/* An experiment with two panels side by side (10 x 10 of 0.4 mm), then changed by the caller. */
static void two(nbg_experiment *e, nbg_panel *pan)
{
    base(e);
    memset(pan, 0, 2 * sizeof *pan);
    for (int k = 0; k < 2; ++k) {
        pan[k].fpixels = pan[k].spixels = 10;
        pan[k].fast[0] = 1;
        pan[k].slow[1] = 1;
        pan[k].origin[0] = 4.0 * k;
    }
    snprintf(pan[1].name, sizeof pan[1].name, "right");
    e->panels = pan;
    e->npanels = 2;
}

static void refuse(nbg_ctx *ctx, const char *id, const nbg_experiment *e, const char *needle)
{
    nbg_report r;
    const int rc = nbg_describe(ctx, e, &r);
    nbgi_test_check(rc == NBG_EINVAL && strstr(nbg_errmsg(ctx), needle) != NULL, id, "%s", nbg_errmsg(ctx));
}

static void refusals(nbg_ctx *ctx)
{
    nbg_experiment e;
    nbg_panel pan[2];
    two(&e, pan);
    nbg_report r;
    const int ok = nbg_describe(ctx, &e, &r);
    nbgi_test_check(ok == NBG_OK && r.npix == 200 && r.npanels == 2, "two-panels", "two panels side by side: %zu "
                   "pixels (%s)", r.npix, ok == NBG_OK ? "ok" : nbg_errmsg(ctx));
    two(&e, pan);
    pan[1].fast[0] = 0;
    refuse(ctx, "refuse-zero-axis", &e, "panel 1 (right): the fast axis has zero length");
    two(&e, pan);
    pan[1].slow[0] = 1, pan[1].slow[1] = 0;
    refuse(ctx, "refuse-parallel", &e, "panel 1 (right): the fast and slow axes are parallel");
    two(&e, pan);
    pan[1].slow[0] = 0.1;
    refuse(ctx, "refuse-perpendicular", &e, "not perpendicular");
    two(&e, pan);
    pan[0].origin[2] = -100; /* 100 mm towards the sample from a plane 60 mm away: behind it */
    refuse(ctx, "refuse-behind", &e, "panel 0: its plane passes through or lies behind the sample");
    two(&e, pan);
    pan[1].origin[0] = 3.6; /* one pixel over the first panel */
    refuse(ctx, "refuse-overlap", &e, "panel 0 and panel 1 (right) overlap");
    two(&e, pan);
    pan[1].origin[0] = 4.0 - 1e-9; /* edge to edge within rounding: accepted */
    const int trc = nbg_describe(ctx, &e, &r);
    nbgi_test_check(trc == NBG_OK, "touching", "panels meeting edge to edge are not an overlap (%s)",
                   trc == NBG_OK ? "accepted" : nbg_errmsg(ctx));
    /* a panel crossing the other's plane: turned about its slow axis, through the first panel's middle */
    two(&e, pan);
    pan[1].origin[0] = 2, pan[1].origin[2] = -2;
    pan[1].fast[0] = 0, pan[1].fast[2] = 1;
    refuse(ctx, "refuse-overlap-crossing", &e, "overlap");
    two(&e, pan);
    e.roi[0] = 2;
    refuse(ctx, "refuse-roi", &e, "-roi");
    two(&e, pan);
    float img[199];
    const int rc = nbg_simulate(ctx, &e, img, 199, NULL);
    nbgi_test_check(rc == NBG_EINVAL && strstr(nbg_errmsg(ctx), "2 panels have 200") != NULL, "refuse-buffer", "%s",
                   nbg_errmsg(ctx));
}

#ifdef NBG_HAVE_FORMATS
#include <jansson.h>

/* A DIALS experiment list of two panels that cut a flat detector into its left and right halves: the image read
 * through nbg_read_expt_panels equals the flat one's (through nbg_read_expt), rearranged; nbg_read_expt refuses
 * the two panels. */
static void expt_panels(nbg_ctx *ctx)
{
    char dir[256], one[300], two[300];
    if (nbgi_test_mkdtemp("nbg-panels", dir, sizeof dir) == NULL) {
        nbgi_test_check(0, "expt", "no temporary directory");
        return;
    }
    snprintf(one, sizeof one, "%s/one.expt", dir);
    snprintf(two, sizeof two, "%s/two.expt", dir);
    nbg_experiment e;
    base(&e);
    e.convention = NBG_CONV_DIALS;
    e.det_rot[0] = 3, e.det_rot[2] = 5;
    e.fpixels = 40, e.spixels = 30;
    nbg_report r;
    nbg_geometry g;
    int rc = nbg_describe(ctx, &e, &r);
    rc = rc == NBG_OK ? nbg_geometry_from_report(ctx, &e, &r, 1, &g) : rc;
    rc = rc == NBG_OK ? nbg_write_expt(ctx, one, &g, "x.nxs") : rc;
    json_error_t err;
    json_t *root = rc == NBG_OK ? json_load_file(one, 0, &err) : NULL;
    json_t *panels = json_object_get(json_array_get(json_object_get(root, "detector"), 0), "panels");
    json_t *p0 = json_array_get(panels, 0), *p1 = json_deep_copy(p0);
    if (p0 == NULL || p1 == NULL) {
        nbgi_test_check(0, "expt", "could not write or parse %s (%s)", one, nbg_errmsg(ctx));
        json_decref(root);
        nbgi_test_rmtree(dir);
        return;
    }
    json_object_set_new(p0, "image_size", json_pack("[i,i]", 20, 30));
    json_object_set_new(p1, "image_size", json_pack("[i,i]", 20, 30));
    json_object_set_new(p1, "name", json_string("right half"));
    double o[3];
    for (int x = 0; x < 3; ++x) {
        o[x] = g.origin[x] + 20 * g.pixel_f * g.fast[x];
    }
    json_object_set_new(p1, "origin", json_pack("[f,f,f]", o[0], o[1], o[2]));
    json_array_append_new(panels, p1);
    /* the hierarchy's root group holds both (a panel in no group is refused) */
    json_t *hier = json_object_get(json_array_get(json_object_get(root, "detector"), 0), "hierarchy");
    json_array_append_new(json_object_get(hier, "children"), json_pack("{s:i}", "panel", 1));
    json_dump_file(root, two, JSON_INDENT(1));
    json_decref(root);

    nbg_geometry g1, g2;
    nbg_panel *pan = NULL;
    int np = 0;
    nbg_experiment e1, e2;
    base(&e1);
    base(&e2);
    const int r1 = nbg_read_expt(ctx, one, &g1) == NBG_OK ? nbg_experiment_from_geometry(ctx, &g1, &e1) : -1;
    const int r2 = nbg_read_expt_panels(ctx, two, &g2, &pan, &np) == NBG_OK
                       ? nbg_experiment_from_geometry(ctx, &g2, &e2) : -1;
    e2.panels = pan, e2.npanels = np, e2.panel_frame = NBG_PANELS_LAB;
    size_t n1 = 0, n2 = 0;
    int rc1 = r1, rc2 = r2, bit = 0;
    float *a = r1 == NBG_OK ? render(ctx, &e1, &n1, &rc1) : NULL;
    float *b = r2 == NBG_OK ? render(ctx, &e2, &n2, &rc2) : NULL;
    double mx = 0;
    const double d = rc1 == NBG_OK && rc2 == NBG_OK && n1 == n2 && n1 == 1200
                         ? grid_diff(a, 40, b, 2, 1, 20, 30, 0, 0, &bit, &mx) : INFINITY;
    nbgi_test_check(np == 2 && strcmp(pan[1].name, "right half") == 0 && d <= 1e-9, "expt-panels",
                   "a two-panel experiment list renders the one-panel image: %d panels, max |diff| %.3g of %.4g (%s)",
                   np, d, mx, rc2 == NBG_OK ? "ok" : nbg_errmsg(ctx));
    const int rone = nbg_read_expt(ctx, two, &g1);
    nbgi_test_check(rone == NBG_EFORMAT && strstr(nbg_errmsg(ctx), "2 panels") != NULL, "refuse-expt-one", "%s",
                   nbg_errmsg(ctx));
    free(a);
    free(b);
    free(pan);
    nbgi_test_rmtree(dir);
}

/* Three panels in the plane of a rotated MOSFLM detector (beam along +x: the rotation to DIALS's frame is not
 * the identity): of different widths, one turned by 90 deg in the plane, one tilted about its fast axis. */
static void three(nbg_experiment *e, nbg_panel *pan)
{
    base(e);
    e->convention = NBG_CONV_MOSFLM;
    e->det_rot[0] = 3, e->det_rot[1] = -2, e->det_rot[2] = 5;
    memset(pan, 0, 3 * sizeof *pan);
    const double t = 15 * 3.14159265358979323846 / 180;
    pan[0].fpixels = 20, pan[0].spixels = 15;
    pan[0].fast[0] = 1, pan[0].slow[1] = 1;
    pan[0].origin[0] = 2, pan[0].origin[1] = 2;
    pan[1].fpixels = 12, pan[1].spixels = 10;
    pan[1].fast[1] = 1, pan[1].slow[0] = -1;
    pan[1].origin[0] = 30, pan[1].origin[1] = 2;
    pan[2].fpixels = 16, pan[2].spixels = 10;
    pan[2].fast[0] = 1, pan[2].slow[1] = cos(t), pan[2].slow[2] = sin(t);
    pan[2].origin[0] = 2, pan[2].origin[1] = 14;
    snprintf(pan[0].name, sizeof pan[0].name, "left");
    snprintf(pan[2].name, sizeof pan[2].name, "tilted");
    e->panels = pan;
    e->npanels = 3;
    e->panel_frame = NBG_PANELS_PLANE;
}

/* A multi-panel list read by the program's builder (-expt): its panels re-expressed in the frame of the plane (the
 * panel the beam meets), so that they render where the list puts them and the detector's own parameters move the
 * whole detector rigidly (DIALS's multi-panel parameterisation: Dist, Shift1, Shift2, Tau1-3 of that panel's frame).
 *   mplist-<tag>-plane     the builder's experiment holds the panels in the plane's frame and renders the list's
 *                          image
 *   mplist-<tag>-rigid     distance, beam shifts and det_tau move every panel by one rigid motion (distances
 *                          between origins, angles between axes kept) that is not nothing
 *   mplist-<tag>-gradcheck the gradient check of the detector's parameters on the list's panels (tag three)
 *   mplist-<tag>-refine    the whole detector moved and turned, refined back from the list's placement (refine,
 *                          tag modules: 2 x 2 modules 33 mm wide, whose turns are not lost in its shifts) */
static void list_whole_detector(nbg_ctx *ctx, const char *ex, const nbg_panel *back, int np, int refine)
{
    const char *tag = refine ? "modules" : "three";
    char id[64];
    nbg_builder *b = NULL;
    const char *argv[] = {"-expt", ex, "-default_F", "100", "-N", "6", "-oversample", "2", "-quiet"};
    int rc = nbg_builder_create(&b);
    rc = rc == NBG_OK ? nbg_builder_parse(ctx, b, 9, argv) : rc;
    rc = rc == NBG_OK ? nbg_builder_load(ctx, b) : rc;
    nbg_experiment e;
    if (rc == NBG_OK) {
        e = *nbg_builder_experiment(b);
    }
    /* the same experiment with the list's panels as read, in the lab frame */
    nbg_experiment el = e;
    el.panels = back;
    el.panel_frame = NBG_PANELS_LAB;
    size_t n = 0, n2 = 0;
    float *img = rc == NBG_OK ? render(ctx, &el, &n, &rc) : NULL;
    float *img2 = rc == NBG_OK ? render(ctx, &e, &n2, &rc) : NULL;
    /* relative to the peak; INFINITY on a blank image */
    const double d = rc == NBG_OK && n2 == n ? nbgi_test_max_rel_diff(img, img2, n) : INFINITY;
    free(img);
    free(img2);
    snprintf(id, sizeof id, "mplist-%s-plane", tag);
    if (!nbgi_test_check(rc == NBG_OK && e.npanels == np && e.panel_frame == NBG_PANELS_PLANE && d <= 1e-9,
                         id, "-expt with %d panels: in the plane's frame (%s), the image of the list's "
                         "panels in the lab frame to %.3g of its peak (%s)", np, rc == NBG_OK && e.panel_frame == NBG_PANELS_PLANE ? "yes" : "no", d,
                         rc == NBG_OK ? "ok" : nbg_errmsg(ctx))) {
        nbg_builder_destroy(b);
        return;
    }
    /* moved: every panel in the lab after the motion, against the list's */
    nbg_experiment m = e;
    const double dist = 0.2, shift[2] = {0.15, -0.1}, tau[3] = {0.5, -0.4, 0.3};
    const nbg_param fp[6] = {NBG_P_DISTANCE, NBG_P_BEAM_FAST, NBG_P_BEAM_SLOW, NBG_P_DET_TAU1, NBG_P_DET_TAU2,
                             NBG_P_DET_TAU3};
    double want[6] = {dist, shift[0], shift[1], tau[0], tau[1], tau[2]}, d0 = NAN;
    nbg_param_get(&e, NBG_P_DISTANCE, &d0);
    want[0] += d0;
    for (int j = 0; j < 6; ++j) {
        nbg_param_set(&m, fp[j], want[j]);
    }
    nbg_report r;
    nbg_panel moved[4];
    rc = nbg_describe(ctx, &m, &r);
    rc = rc == NBG_OK ? nbg_panels_from_report(ctx, &m, &r, moved, np) : rc;
    double worst = 0, least = INFINITY;
    for (int k = 0; rc == NBG_OK && k < np; ++k) {
        double u[3][3], v[3][3], du = 0;
        for (int x = 0; x < 3; ++x) {
            du += pow(moved[k].origin[x] - back[k].origin[x], 2);
        }
        least = fmin(least, sqrt(du));
        for (int q = 0; q < np; ++q) {
            const double *A[3] = {back[k].fast, back[k].slow, back[k].origin};
            const double *B[3] = {back[q].fast, back[q].slow, back[q].origin};
            const double *C[3] = {moved[k].fast, moved[k].slow, moved[k].origin};
            const double *D[3] = {moved[q].fast, moved[q].slow, moved[q].origin};
            for (int i = 0; i < 3; ++i) {
                for (int x = 0; x < 3; ++x) {
                    u[i][x] = i < 2 ? A[i][x] : A[i][x] - B[i][x];
                    v[i][x] = i < 2 ? C[i][x] : C[i][x] - D[i][x];
                }
            }
            /* the dot products of (fast_k, slow_k, origin_k - origin_q) with (fast_q, slow_q) and themselves */
            for (int i = 0; i < 3; ++i) {
                for (int j = 0; j < 3; ++j) {
                    const double *bj = j == 0 ? B[0] : j == 1 ? B[1] : u[j];
                    const double *dj = j == 0 ? D[0] : j == 1 ? D[1] : v[j];
                    double a0 = 0, a1 = 0;
                    for (int x = 0; x < 3; ++x) {
                        a0 += u[i][x] * bj[x];
                        a1 += v[i][x] * dj[x];
                    }
                    worst = fmax(worst, fabs(a1 - a0));
                }
            }
        }
    }
    snprintf(id, sizeof id, "mplist-%s-rigid", tag);
    nbgi_test_check(rc == NBG_OK && worst < 1e-9 && least > 0.2, id, "distance +%g mm, beam shifts %g %g "
                    "mm, det_tau %g %g %g deg: every panel moved at least %.3g mm, the panels' axes and the vectors "
                    "between their origins keep their dot products to %.2g (%s)", dist, shift[0], shift[1], tau[0],
                    tau[1], tau[2], least, worst, rc == NBG_OK ? "ok" : nbg_errmsg(ctx));
    const nbg_param ps[7] = {NBG_P_DISTANCE, NBG_P_BEAM_FAST, NBG_P_BEAM_SLOW, NBG_P_DET_TAU1, NBG_P_DET_TAU2,
                             NBG_P_DET_TAU3, NBG_P_DET_ROTX};
    nbg_gradcheck_result res[7];
    rc = nbg_gradcheck(ctx, &e, ps, 7, 1e-6, 1, res);
    int npass = 0;
    double wrel = 0;
    for (int j = 0; rc == NBG_OK && j < 7; ++j) {
        npass += res[j].pass;
        wrel = fmax(wrel, res[j].relerr);
    }
    if (!refine) {
        snprintf(id, sizeof id, "mplist-%s-gradcheck", tag);
        nbgi_test_check(rc == NBG_OK && npass == 7, id, "distance, beam_fast, beam_slow, "
                        "det_tau1-3, det_rotx on the list's panels: %d of 7 pass, worst relerr %.2g (%s)", npass, wrel,
                        rc == NBG_OK ? "ok" : nbg_errmsg(ctx));
        nbg_builder_destroy(b);
        return;
    }
    /* the whole detector moved and turned (noise-free), refined back from the list's placement */
    float *obs = render(ctx, &m, &n2, &rc);
    nbg_refine_result *fit = calloc(1, sizeof *fit);
    nbg_refine_options opt;
    nbg_refine_options_default(&opt);
    rc = rc == NBG_OK && fit != NULL ? nbg_refine(ctx, &e, obs, NULL, n2, fp, 6, &opt, fit) : rc;
    double err = INFINITY;
    if (rc == NBG_OK) {
        err = 0;
        for (int j = 0; j < 6; ++j) {
            err = fmax(err, fabs(fit->value[j] - want[j]));
        }
    }
    snprintf(id, sizeof id, "mplist-%s-refine", tag);
    nbgi_test_check(rc == NBG_OK && fit->converged && err < 1e-6, id, "the whole detector (%d panels) "
                    "moved and turned, refined back from the list's placement: worst error %.2g (mm or deg), %d "
                    "iterations (%s)", np, err, rc == NBG_OK ? fit->iterations : -1,
                    rc == NBG_OK ? (fit->converged ? "converged" : "not converged") : nbg_errmsg(ctx));
    if (fit != NULL) {
        nbg_refine_result_free(fit);
    }
    free(fit);
    free(obs);
    nbg_builder_destroy(b);
}

/* Multi-panel files: the panels in DIALS's frame (nbg_panels_from_report) written as an experiment list read back
 * by nbg_read_expt_panels to 1e-9 and rendered again (in the lab frame) to the same image, which checks the
 * mapping of the plane's panels; NXmx's stacked data read back (padded to the widest panel), its geometry refused
 * by nbgrad's one-module reader, a mask with panels of different widths refused; wrong panel tables refused. */
static void files_panels(nbg_ctx *ctx)
{
    char dir[256], ex[300], nx[300];
    if (nbgi_test_mkdtemp("nbg-mpfiles", dir, sizeof dir) == NULL) {
        nbgi_test_check(0, "mpfiles", "no temporary directory");
        return;
    }
    snprintf(ex, sizeof ex, "%s/mp.expt", dir);
    snprintf(nx, sizeof nx, "%s/mp.nxs", dir);
    nbg_experiment e;
    nbg_panel pan[3], lab[3];
    three(&e, pan);
    nbg_report r;
    nbg_geometry g;
    size_t n = 0;
    int rc = NBG_OK;
    float *img = render(ctx, &e, &n, &rc);
    rc = rc == NBG_OK ? nbgi_test_write_panel_list(ctx, &e, ex, nx, &r, &g, lab) : rc;
    nbgi_test_check(rc == NBG_OK && n == 300 + 120 + 160, "mpfiles-write-expt", "three panels (%zu pixels) as an "
                   "experiment list (%s)", n, rc == NBG_OK ? "ok" : nbg_errmsg(ctx));
    /* the list read back: every panel within 1e-9 */
    nbg_geometry g2;
    nbg_panel *back = NULL;
    int np = 0;
    const int rrc = rc == NBG_OK ? nbg_read_expt_panels(ctx, ex, &g2, &back, &np) : rc;
    double dv = 0;
    int same = rrc == NBG_OK && np == 3;
    for (int k = 0; same && k < 3; ++k) {
        same = back[k].fpixels == lab[k].fpixels && back[k].spixels == lab[k].spixels &&
               back[k].pixel == lab[k].pixel && back[k].pixel == e.pixel;
        for (int x = 0; x < 3; ++x) {
            dv = fmax(dv, fabs(back[k].fast[x] - lab[k].fast[x]));
            dv = fmax(dv, fabs(back[k].slow[x] - lab[k].slow[x]));
            dv = fmax(dv, fabs(back[k].origin[x] - lab[k].origin[x]));
        }
    }
    same = same && strcmp(back[0].name, "left") == 0 && strcmp(back[1].name, "panel 1") == 0 &&
           strcmp(back[2].name, "tilted") == 0;
    nbgi_test_check(same && dv <= 1e-9, "mpfiles-expt-roundtrip", "%d panels read back, vectors and origins off by "
                   "%.3g (%s)", np, dv, rrc == NBG_OK ? "ok" : nbg_errmsg(ctx));
    /* the beam along -z, the panels' normals facing away from the sample, as DIALS's frame has them */
    double ddir = fabs(g.direction[2] - 1), facing = INFINITY;
    for (int k = 0; k < 3; ++k) {
        double nk[3] = {lab[k].fast[1] * lab[k].slow[2] - lab[k].fast[2] * lab[k].slow[1],
                        lab[k].fast[2] * lab[k].slow[0] - lab[k].fast[0] * lab[k].slow[2],
                        lab[k].fast[0] * lab[k].slow[1] - lab[k].fast[1] * lab[k].slow[0]};
        facing = fmin(facing, nk[0] * lab[k].origin[0] + nk[1] * lab[k].origin[1] + nk[2] * lab[k].origin[2]);
    }
    nbgi_test_check(ddir < 1e-12 && facing > 50, "mpfiles-frame", "beam direction z off by %.3g, nearest panel "
                   "plane %.4g mm from the sample", ddir, facing);
    /* rendered again from the list, in the lab frame: the same image */
    nbg_experiment e2;
    base(&e2);
    int r2 = rrc == NBG_OK ? nbg_experiment_from_geometry(ctx, &g2, &e2) : rrc;
    e2.panels = back, e2.npanels = np, e2.panel_frame = NBG_PANELS_LAB;
    size_t n2 = 0;
    float *img2 = r2 == NBG_OK ? render(ctx, &e2, &n2, &r2) : NULL;
    /* relative to the peak; INFINITY on a blank image */
    const double d = r2 == NBG_OK && img != NULL && n2 == n ? nbgi_test_max_rel_diff(img, img2, n) : INFINITY;
    nbgi_test_check(d <= 1e-9, "mpfiles-expt-render", "the list's panels render the plane's image: max |diff| %.3g "
                   "of its peak (%s)", d, r2 == NBG_OK ? "ok" : nbg_errmsg(ctx));
    free(img2);
    if (rrc == NBG_OK && img != NULL) {
        list_whole_detector(ctx, ex, back, np, 0);
    }
    /* 2 x 2 modules of 40 x 40 pixels of 0.4 mm (33 mm wide, 3 and 5 pixels apart) of a rotated detector, as a list */
    {
        nbg_experiment t;
        nbg_panel tp[4], tl[4];
        rotated_tiles(&t, 40, tp);
        char ex4[300];
        snprintf(ex4, sizeof ex4, "%s/mp4.expt", dir);
        nbg_report tr;
        nbg_geometry tg;
        const int trc = nbgi_test_write_panel_list(ctx, &t, ex4, NULL, &tr, &tg, tl);
        if (nbgi_test_check(trc == NBG_OK, "mplist-modules", "2 x 2 modules written as a list (%s)",
                            trc == NBG_OK ? "ok" : nbg_errmsg(ctx))) {
            list_whole_detector(ctx, ex4, tl, 4, 1);
        }
        remove(ex4); /* the directory's entries are counted below */
    }
    free(back);

    /* NXmx: stacked data of 35 rows of 20 (the narrower panels padded); nbgrad's reader gives the concatenation
     * back, and every module as a panel */
    rc = img != NULL ? nbg_write_nxmx_panels(ctx, nx, &g, lab, 3, NBG_DATA_FLOAT32, img, 1, NULL) : NBG_EINVAL;
    float *st = NULL;
    size_t sn = 0;
    int whole = -1;
    nbg_geometry g3;
    const int src = rc == NBG_OK ? nbg_read_image(ctx, nx, 0, 0, &st, &sn, &g3, &whole, NULL) : rc;
    int match = src == NBG_OK && sn == n && whole == 0;
    for (size_t i = 0; match && i < n; ++i) match = st[i] == img[i];
    nbgi_test_check(match, "mpfiles-nxmx-data", "the NXmx file's three modules read back as the image (%zu values, "
                   "%s)", sn, src == NBG_OK ? "ok" : nbg_errmsg(ctx));
    free(st);
    nbg_panel *nb = NULL;
    np = 0;
    const int nrrc = rc == NBG_OK ? nbg_read_nxmx_panels(ctx, nx, &g3, &nb, &np) : rc;
    dv = 0;
    same = nrrc == NBG_OK && np == 3;
    for (int k = 0; same && k < 3; ++k) {
        same = nb[k].fpixels == lab[k].fpixels && nb[k].spixels == lab[k].spixels && nb[k].pixel == lab[k].pixel;
        for (int x = 0; x < 3; ++x) {
            dv = fmax(dv, fabs(nb[k].fast[x] - lab[k].fast[x]));
            dv = fmax(dv, fabs(nb[k].slow[x] - lab[k].slow[x]));
            dv = fmax(dv, fabs(nb[k].origin[x] - lab[k].origin[x]));
        }
    }
    same = same && strcmp(nb[0].name, "left") == 0 && strcmp(nb[1].name, "panel 1") == 0 &&
           fabs(g3.wavelength - g.wavelength) < 1e-12 && g3.fpixels == 20 && g3.spixels == 15;
    nbgi_test_check(same && dv <= 1e-9, "mpfiles-nxmx-roundtrip", "%d modules read back as panels, vectors and "
                   "origins off by %.3g (%s)", np, dv, nrrc == NBG_OK ? "ok" : nbg_errmsg(ctx));
    free(nb);
    uint8_t mask[580] = {0};
    const int mrc = nbg_write_nxmx_panels(ctx, nx, &g, lab, 3, NBG_DATA_FLOAT32, img, 1, mask);
    int entries = 0;
    DIR *dd = opendir(dir);
    for (struct dirent *de; dd != NULL && (de = readdir(dd)) != NULL;) entries += de->d_name[0] != '.';
    if (dd != NULL)
        closedir(dd);
    nbgi_test_check(mrc == NBG_EUNSUP && strstr(nbg_errmsg(ctx), "different widths") != NULL && entries == 2,
                   "refuse-nxmx-mask", "%s (%d files in the directory, no temporary left)", nbg_errmsg(ctx), entries);
    /* a panel the files cannot describe, named; a table of the wrong size */
    lab[2].pixel = 0;
    const int prc = nbg_write_expt_panels(ctx, ex, &g, lab, 3, NULL);
    nbgi_test_check(prc == NBG_EINVAL && strstr(nbg_errmsg(ctx), "panel 2 (tilted)") != NULL, "refuse-expt-panel",
                   "%s", nbg_errmsg(ctx));
    const int nrc = nbg_panels_from_report(ctx, &e, &r, lab, 2);
    nbgi_test_check(nrc == NBG_EINVAL && strstr(nbg_errmsg(ctx), "room for 2 panels") != NULL, "refuse-panel-count",
                   "%s", nbg_errmsg(ctx));
    free(img);
    nbgi_test_rmtree(dir);
}
#endif

/* --- panel motions ------------------------------------------------------------------------------------------ */

/* R = Rz(c) Ry(b) Rx(a), degrees, written out independently of the library. */
static void rot_zyx(const double r[3], double R[9])
{
    const double k = M_PI / 180;
    const double a = r[0] * k, b = r[1] * k, c = r[2] * k;
    const double ca = cos(a), sa = sin(a), cb = cos(b), sb = sin(b), cc = cos(c), sc = sin(c);
    const double M[9] = {cc * cb, cc * sb * sa - sc * ca, cc * sb * ca + sc * sa,
                         sc * cb, sc * sb * sa + cc * ca, sc * sb * ca - cc * sa,
                         -sb, cb * sa, cb * ca};
    memcpy(R, M, sizeof M);
}

/* The panels moved by hand: each group turned about the mean of its panels' centres, then shifted. */
static void move_by_hand(const nbg_panel *in, int n, const nbg_panel_motion *m, int nm, double px, nbg_panel *out)
{
    for (int g = 0; g < nm; ++g) {
        double c[3] = {0, 0, 0}, cnt = 0, R[9];
        for (int k = 0; k < n; ++k) {
            if (in[k].group != g) {
                continue;
            }
            const double lf = sqrt(in[k].fast[0] * in[k].fast[0] + in[k].fast[1] * in[k].fast[1] +
                                   in[k].fast[2] * in[k].fast[2]);
            const double ls = sqrt(in[k].slow[0] * in[k].slow[0] + in[k].slow[1] * in[k].slow[1] +
                                   in[k].slow[2] * in[k].slow[2]);
            for (int x = 0; x < 3; ++x) {
                c[x] += in[k].origin[x] + 0.5 * px * (in[k].fpixels * in[k].fast[x] / lf +
                                                      in[k].spixels * in[k].slow[x] / ls);
            }
            cnt += 1;
        }
        for (int x = 0; x < 3; ++x) {
            c[x] /= cnt;
        }
        rot_zyx(m[g].rot, R);
        for (int k = 0; k < n; ++k) {
            if (in[k].group != g) {
                continue;
            }
            out[k] = in[k];
            double r[3];
            for (int x = 0; x < 3; ++x) {
                r[x] = in[k].origin[x] - c[x];
            }
            for (int x = 0; x < 3; ++x) {
                out[k].origin[x] = c[x] + m[g].shift[x];
                out[k].fast[x] = out[k].slow[x] = 0;
                for (int j = 0; j < 3; ++j) {
                    out[k].origin[x] += R[3 * x + j] * r[j];
                    out[k].fast[x] += R[3 * x + j] * in[k].fast[j];
                    out[k].slow[x] += R[3 * x + j] * in[k].slow[j];
                }
            }
        }
    }
}

static double img_diff(const float *a, const float *b, size_t n, double *mx)
{
    double d = 0, m = 0;
    for (size_t i = 0; i < n; ++i) {
        m = fmax(m, fabs(a[i]));
        d = fmax(d, fabs((double)a[i] - b[i]));
    }
    *mx = m;
    return m > 0 ? d / m : INFINITY;
}

static void motions(nbg_ctx *ctx)
{
    /* 3 x 2 panels of 16 x 16 with gaps on a rotated MOSFLM detector; groups: the top row's three panels
     * together (group 0), the bottom row's left two (group 1), the last alone (group 2) */
    nbg_experiment e;
    base(&e);
    e.convention = NBG_CONV_MOSFLM;
    e.det_rot[0] = 2, e.det_rot[1] = -3, e.twotheta = 4;
    e.fpixels = 3 * 16 + 2 * 4, e.spixels = 2 * 16 + 6;
    nbg_panel pan[6], moved[6];
    e.npanels = tile(&e, 3, 2, 16, 16, 4, 6, pan);
    e.panels = pan;
    const int grp[6] = {0, 0, 0, 1, 1, 2};
    for (int k = 0; k < 6; ++k) {
        pan[k].group = grp[k];
    }
    nbg_panel_motion mot[3] = {{{0.3, -0.2, 0.5}, {0.4, -0.3, 1.5}},
                               {{-0.25, 0.1, -0.4}, {-0.6, 0.2, -2.0}},
                               {{0.15, 0.35, 0.2}, {0.5, 0.7, 3.0}}};
    const char *frame_name[2] = {"plane", "lab"};
    for (int fr = 0; fr < 2; ++fr) {
        nbg_experiment em = e;
        nbg_panel base_p[6];
        memcpy(base_p, pan, sizeof pan);
        if (fr == 1) {
            /* the same panels given in the lab frame, from the report's vectors */
            nbgi_test_panels_lab(ctx, &e, base_p);
            em.panel_frame = NBG_PANELS_LAB;
        }
        em.panels = base_p;
        em.motions = mot;
        em.nmotions = 3;
        nbg_experiment eh = em;
        move_by_hand(base_p, 6, mot, 3, e.pixel, moved);
        eh.panels = moved;
        eh.motions = NULL;
        eh.nmotions = 0;
        size_t n1 = 0, n2 = 0, n0 = 0;
        int rc1, rc2, rc0;
        float *a = render(ctx, &em, &n1, &rc1);
        float *b = render(ctx, &eh, &n2, &rc2);
        nbg_experiment e0 = em;
        e0.nmotions = 0;
        e0.motions = NULL;
        float *c = render(ctx, &e0, &n0, &rc0);
        double mx = 0, mx0 = 0;
        const double d = rc1 == NBG_OK && rc2 == NBG_OK ? img_diff(b, a, n1, &mx) : INFINITY;
        const double d0 = rc0 == NBG_OK && rc1 == NBG_OK ? img_diff(c, a, n1, &mx0) : 0;
        char id[96];
        snprintf(id, sizeof id, "motion-apply-%s", frame_name[fr]);
        nbgi_test_check(d <= 1e-9 && d0 > 1e-2, id, "3 motion groups (turned about their pivots, shifted) render the "
                       "panels moved by hand: max |diff| %.3g of max %.4g; unmoved differ by %.3g (%s)", d, mx, d0,
                       rc1 == NBG_OK ? "ok" : nbg_errmsg(ctx));
        free(a);
        free(b);
        free(c);

        /* gradcheck of all 18 motion components, rotz and the beam's direction away from zero (on lab-frame
         * panels its tangent turns every panel about the sample: the panels' own tangents) */
        nbg_gradcheck_result res[21];
        nbg_param cp[21] = {NBG_P_ROTZ, NBG_P_BEAM_TILT1, NBG_P_BEAM_TILT2};
        for (int j = 0; j < 18; ++j) {
            cp[3 + j] = NBG_P_MOTION(j / 6, j % 6);
        }
        em.beam_tilt[0] = 0.3, em.beam_tilt[1] = -0.2;
        const int grc = nbg_gradcheck(ctx, &em, cp, 21, 1e-6, 1, res);
        em.beam_tilt[0] = em.beam_tilt[1] = 0;
        const int nres = grc == NBG_OK ? 21 : 0;
        snprintf(id, sizeof id, "motion-gradcheck-%s", frame_name[fr]);
        nbgi_test_check(grc == NBG_OK && nres == 21, id, "%d checks: 18 motion components, rotz, beam_tilt1/2 (%s)",
                       nres, grc == NBG_OK ? "ok" : nbg_errmsg(ctx));
        for (int k = 0; k < nres; ++k) {
            char lab[48];
            nbg_param_label(&em, res[k].param, lab, sizeof lab);
            snprintf(id, sizeof id, "motion-gradcheck-%s-%s", frame_name[fr], lab);
            nbgi_test_check(res[k].status == NBG_CHECK_PASS, id, "adjoint %.10g numeric %.10g relerr %.2g %s",
                           res[k].adjoint, res[k].numeric, res[k].relerr, res[k].reason);
        }
        /* the tangent images of the beam's direction (with a motion's and the crystal's) summed with weights equal
         * the adjoint's gradients: the tangent kernel's panel tangents are the chain rule's */
        {
            em.beam_tilt[0] = 0.3, em.beam_tilt[1] = -0.2;
            const nbg_param tp[5] = {NBG_P_BEAM_TILT1, NBG_P_BEAM_TILT2, NBG_P_MOTION(1, 4), NBG_P_ROTY, NBG_P_MOTION(0, 0)};
            const size_t nt = n1;
            double *T = malloc(sizeof(double) * 5 * nt), gt[5];
            float *wt = malloc(sizeof(float) * nt), *i1 = malloc(sizeof(float) * nt), *i2 = malloc(sizeof(float) * nt);
            int jr = NBG_ENOMEM, gr = NBG_ENOMEM;
            double worst = 0, gmin = INFINITY;
            if (T != NULL && wt != NULL && i1 != NULL && i2 != NULL) {
                for (size_t i = 0; i < nt; ++i) {
                    wt[i] = (float)(0.5 + 0.4 * cos(0.37 * (double)i));
                }
                jr = nbg_simulate_jvp(ctx, &em, tp, 5, T, i1, nt);
                gr = jr == NBG_OK ? nbg_simulate_grad(ctx, &em, wt, tp, 5, gt, i2, nt, NULL) : jr;
                for (int j = 0; gr == NBG_OK && j < 5; ++j) {
                    double sj = 0;
                    for (size_t i = 0; i < nt; ++i) {
                        sj += wt[i] * T[(size_t)j * nt + i];
                    }
                    gmin = fmin(gmin, fabs(gt[j]));
                    worst = fmax(worst, fabs(sj - gt[j]) / fmax(fmax(fabs(sj), fabs(gt[j])), 1e-12));
                }
            }
            snprintf(id, sizeof id, "beam-tilt-jvp-%s", frame_name[fr]);
            nbgi_test_check(jr == NBG_OK && gr == NBG_OK && gmin > 0 && worst <= 1e-9, id, "beam_tilt1/2, a motion's "
                           "shift_x and rot_y, roty: tangent images summed with weights against the adjoint, worst "
                           "relative difference %.3g, smallest |gradient| %.3g (%s)", worst, gmin,
                           jr == NBG_OK && gr == NBG_OK ? "ok" : nbg_errmsg(ctx));
            em.beam_tilt[0] = em.beam_tilt[1] = 0;
            free(T);
            free(wt);
            free(i1);
            free(i2);
        }
    }

    /* tangents of 36 motion components (6 groups of one panel: more than one pass of the tangent kernel) and of
     * two crystal parameters against the adjoint: sum_p w_p T_j[p] = dL/dtheta_j */
    nbg_experiment e6 = e;
    nbg_panel p6[6];
    memcpy(p6, pan, sizeof pan);
    nbg_panel_motion m6[6];
    memset(m6, 0, sizeof m6);
    for (int k = 0; k < 6; ++k) {
        p6[k].group = k;
        m6[k].shift[0] = 0.05 * k;
        m6[k].rot[2] = 0.3 * k - 0.7;
    }
    e6.panels = p6;
    e6.motions = m6;
    e6.nmotions = 6;
    const size_t n = 6 * 16 * 16;
    nbg_param jp[38];
    for (int j = 0; j < 36; ++j) {
        jp[j] = NBG_P_MOTION(j / 6, j % 6);
    }
    jp[36] = NBG_P_A;
    jp[37] = NBG_P_ROTY;
    double *T = malloc(sizeof(double) * 38 * n);
    float *w = malloc(sizeof(float) * n), *img = malloc(sizeof(float) * n), *img2 = malloc(sizeof(float) * n);
    for (size_t i = 0; i < n; ++i) {
        w[i] = (float)(0.6 + 0.4 * sin(0.71 * (double)i));
    }
    const int jr = nbg_simulate_jvp(ctx, &e6, jp, 38, T, img, n);
    double dm[38];
    const int gr = nbg_simulate_grad(ctx, &e6, w, jp, 38, dm, img2, n, NULL);
    double worst = 0, gmax = 0;
    int wj = 0;
    for (int j = 0; j < 38; ++j) {
        double s = 0;
        for (size_t i = 0; i < n; ++i) {
            s += w[i] * T[(size_t)j * n + i];
        }
        const double ad = dm[j];
        gmax = fmax(gmax, fabs(ad));
        const double r = fabs(s - ad) / fmax(fmax(fabs(s), fabs(ad)), 1e-12);
        if (r > worst) {
            worst = r, wj = j;
        }
    }
    char wl[48];
    nbg_param_label(&e6, jp[wj], wl, sizeof wl);
    nbgi_test_check(jr == NBG_OK && gr == NBG_OK && gmax > 0 && worst <= 1e-9, "motion-jvp",
                   "38 tangent images (36 motion components, a, roty) summed with the weights equal the adjoint's "
                   "gradients: worst relative difference %.3g (%s) (%s)", worst, wl,
                   jr == NBG_OK && gr == NBG_OK ? "ok" : nbg_errmsg(ctx));
    free(T);
    free(w);
    free(img);
    free(img2);

    /* refusals */
    nbg_experiment eb = e;
    nbg_panel pb[6];
    memcpy(pb, pan, sizeof pan);
    eb.panels = pb;
    eb.motions = mot;
    eb.nmotions = 2; /* panel 5 is in group 2 */
    refuse(ctx, "refuse-motion-group", &eb, "panel 5 (t1_2): motion group 2");
    eb.nmotions = 3;
    nbg_panel_motion bad[3];
    memcpy(bad, mot, sizeof bad);
    bad[1].rot[1] = NAN;
    eb.motions = bad;
    refuse(ctx, "refuse-motion-nan", &eb, "panel motion 1");
    nbg_experiment ef = e;
    ef.npanels = 0;
    ef.panels = NULL;
    ef.motions = mot;
    ef.nmotions = 3;
    refuse(ctx, "refuse-motion-flat", &ef, "need panels");
    /* group 0's components on an experiment with no motions */
    double gz[6];
    nbg_param zp[6];
    for (int c = 0; c < 6; ++c) {
        zp[c] = NBG_P_MOTION(0, c);
    }
    float *z = calloc(n, sizeof(float)), *zi = malloc(sizeof(float) * n);
    const int zr = nbg_simulate_grad(ctx, &e, z, zp, 6, gz, zi, n, NULL);
    nbgi_test_check(zr == NBG_EINVAL && strstr(nbg_errmsg(ctx), "motions") != NULL, "refuse-motion-grad",
                   "motion gradients without motions: %s", nbg_errmsg(ctx));
    free(z);
    free(zi);
}

/* An observed still of e (n pixels): its image scaled to a peak of 2000 photons over a background of 2, with Poisson
 * noise of the seed, into obs; e's image model then says the same (scale, bg[0]).  NBG_ENOMEM or the call's error. */
static int noisy_still(nbg_ctx *ctx, nbg_experiment *e, size_t n, long seed, float *obs)
{
    float *img = malloc(sizeof(float) * n);
    uint16_t *cnt = malloc(sizeof(uint16_t) * n);
    int rc = img == NULL || cnt == NULL ? NBG_ENOMEM : nbg_simulate(ctx, e, img, n, NULL);
    double mx = 0;
    for (size_t i = 0; i < n && rc == NBG_OK; ++i) {
        mx = fmax(mx, img[i]);
    }
    for (size_t i = 0; i < n && rc == NBG_OK; ++i) {
        img[i] = (float)(img[i] * 2000 / mx + 2.0);
    }
    if (rc == NBG_OK) {
        rc = nbg_noise_image(ctx, img, (int)n, 1, NULL, 0, seed, cnt, NULL, NULL);
    }
    for (size_t i = 0; rc == NBG_OK && i < n; ++i) {
        obs[i] = cnt[i];
    }
    if (rc == NBG_OK) {
        e->scale = 2000 / mx;
        e->bg[0] = 2.0;
    }
    free(img);
    free(cnt);
    return rc;
}

/* Refinement of panel motions: 4 panels of a rotated detector, each its own group, displaced (shift x, y up to
 * 0.3 mm, turns of up to 1 deg in the plane); Poisson noise (5 seeds); each fit starts from no motion and refines
 * the 12 shifts and turns with the Poisson loss.  Over the 60 fitted values the errors in standard errors must
 * look like noise (rms 0.6 to 1.5, none beyond 4), from a start many standard errors away. */
static int motion_fit(nbg_ctx *ctx, long seed, const nbg_panel_motion truth[4], nbg_refine_result *res)
{
    nbg_experiment e;
    nbg_panel pan[4];
    rotated_tiles(&e, 24, pan);
    for (int k = 0; k < 4; ++k) {
        pan[k].group = k;
    }
    nbg_panel_motion mot[4];
    memcpy(mot, truth, sizeof mot);
    e.motions = mot;
    e.nmotions = 4;
    const size_t n = 4 * 24 * 24;
    float *obs = malloc(sizeof(float) * n);
    int rc = obs == NULL ? NBG_ENOMEM : noisy_still(ctx, &e, n, seed, obs);
    memset(mot, 0, sizeof mot);
    nbg_param params[12];
    for (int g = 0; g < 4; ++g) {
        params[3 * g] = NBG_P_MOTION(g, 0);
        params[3 * g + 1] = NBG_P_MOTION(g, 1);
        params[3 * g + 2] = NBG_P_MOTION(g, 5);
    }
    nbg_refine_options opt;
    nbg_refine_options_default(&opt);
    opt.loss = NBG_LOSS_POISSON;
    if (rc == NBG_OK) {
        rc = nbg_refine(ctx, &e, obs, NULL, n, params, 12, &opt, res);
    }
    if (rc == NBG_OK) {
        /* the motions were written back into the caller's list */
        for (int j = 0; j < 12; ++j) {
            const double v = j % 3 == 2 ? mot[j / 3].rot[2] : mot[j / 3].shift[j % 3];
            if (v != res->value[j]) {
                rc = -100;
            }
        }
    }
    free(obs);
    return rc;
}

static void motion_refine(nbg_ctx *ctx)
{
    const nbg_panel_motion truth[4] = {{{0.25, -0.15, 0}, {0, 0, 0.8}},
                                       {{-0.2, 0.1, 0}, {0, 0, -0.6}},
                                       {{0.1, 0.3, 0}, {0, 0, 1.0}},
                                       {{-0.3, -0.25, 0}, {0, 0, -0.9}}};
    nbg_refine_result *res = calloc(1, sizeof *res);
    double worst = 0, least_start = INFINITY, sz2 = 0;
    int nz = 0, nconv = 0, rc = NBG_OK, iters = 0;
    char wl[48] = "";
    double zs[12];
    for (long seed = 1; seed <= 5 && rc == NBG_OK; ++seed) {
        rc = motion_fit(ctx, seed, truth, res);
        nconv += rc == NBG_OK && res->converged;
        iters = rc == NBG_OK && res->iterations > iters ? res->iterations : iters;
        for (int j = 0; j < 12 && rc == NBG_OK; ++j) {
            const double t = j % 3 == 2 ? truth[j / 3].rot[2] : truth[j / 3].shift[j % 3];
            const double z = (res->value[j] - t) / res->sigma[j];
            zs[j] = z;
            sz2 += z * z;
            ++nz;
            least_start = fmin(least_start, fabs(t) / res->sigma[j]);
            if (!(fabs(z) <= worst)) {
                worst = isfinite(z) ? fabs(z) : INFINITY;
                nbg_param_label(NULL, res->params[j], wl, sizeof wl);
            }
        }
        if (seed == 1 && rc == NBG_OK) {
            for (int j = 0; j < 12; ++j) {
                char lab[48];
                nbg_param_label(NULL, res->params[j], lab, sizeof lab);
                printf("    seed 1: %-10s refined %9.5f sigma %.5f error %+.2f sigma\n", lab, res->value[j],
                       res->sigma[j], zs[j]);
            }
        }
    }
    const double rms = nz > 0 ? sqrt(sz2 / nz) : NAN;
    nbgi_test_check(rc == NBG_OK && nconv == 5 && rms >= 0.6 && rms <= 1.5 && worst <= 4 && least_start > 10,
                   "motion-refine", "12 panel shifts and turns from no motion, 5 noise seeds: %d converged (at most %d "
                   "iterations), rms error %.2f sigma, worst %.2f sigma (%s), every start at least %.0f sigma away; "
                   "fitted values written back (%s)", nconv, iters, rms, worst, wl, least_start,
                   rc == NBG_OK ? "ok" : rc == -100 ? "not written back" : nbg_errmsg(ctx));
    nbg_refine_result_free(res);
    free(res);
}

/* The beam's direction refined on panels fixed in the lab frame (a DIALS list's detector, which the plane's
 * distance, beam centre and rotations do not move): the 2 x 2 panels of motion_fit, given in the lab frame where the
 * rotated detector put them; the beam turned by (0.15, -0.1) deg; Poisson noise; the two tilts and the crystal's
 * three orientation offsets fitted from zero with the Poisson loss.  The tilts must end within 4 standard errors of
 * the truth, from a start at least 10 away. */
static void beam_refine(nbg_ctx *ctx)
{
    nbg_experiment e;
    nbg_panel pan[4], lab[4];
    rotated_tiles(&e, 24, pan);
    int rc = nbgi_test_panels_lab(ctx, &e, lab);
    e.panels = lab;
    e.panel_frame = NBG_PANELS_LAB;
    const double truth[2] = {0.15, -0.1};
    e.beam_tilt[0] = truth[0], e.beam_tilt[1] = truth[1];
    const size_t n = 4 * 24 * 24;
    float *obs = malloc(sizeof(float) * n);
    nbg_refine_result *res = calloc(1, sizeof *res);
    if (obs == NULL || res == NULL) {
        rc = NBG_ENOMEM;
    }
    if (rc == NBG_OK) {
        rc = noisy_still(ctx, &e, n, 3, obs);
    }
    e.beam_tilt[0] = e.beam_tilt[1] = 0;
    const nbg_param params[5] = {NBG_P_BEAM_TILT1, NBG_P_BEAM_TILT2, NBG_P_ORIENT_X, NBG_P_ORIENT_Y, NBG_P_ORIENT_Z};
    nbg_refine_options opt;
    nbg_refine_options_default(&opt);
    opt.loss = NBG_LOSS_POISSON;
    if (rc == NBG_OK) {
        rc = nbg_refine(ctx, &e, obs, NULL, n, params, 5, &opt, res);
    }
    double z[2] = {NAN, NAN}, start = INFINITY;
    for (int j = 0; rc == NBG_OK && j < 2; ++j) {
        z[j] = (res->value[j] - truth[j]) / res->sigma[j];
        start = fmin(start, fabs(truth[j]) / res->sigma[j]);
    }
    nbgi_test_check(rc == NBG_OK && res->converged && fabs(z[0]) <= 4 && fabs(z[1]) <= 4 && start >= 10,
                    "beam-tilt-refine-lab", "beam_tilt1/2 on lab-frame panels, with the orientation, from 0: %.5f "
                    "%.5f deg (truth 0.15 -0.1), errors %+.2f %+.2f sigma (sigma %.2g %.2g), start %.0f sigma away, "
                    "%d iterations (%s)", rc == NBG_OK ? res->value[0] : NAN, rc == NBG_OK ? res->value[1] : NAN, z[0],
                    z[1], rc == NBG_OK ? res->sigma[0] : NAN, rc == NBG_OK ? res->sigma[1] : NAN, start,
                    rc == NBG_OK ? res->iterations : -1, rc == NBG_OK ? (res->converged ? "converged" : "not converged")
                                                                     : nbg_errmsg(ctx));
    if (res != NULL) {
        nbg_refine_result_free(res);
    }
    free(res);
    free(obs);
}

/* Panels with sensors of their own: a rotated MOSFLM detector of 300 um silicon-like sensors (2 layers) cut into 2 x
 * 1 panels, the right one 600 um thick (its layers scaled), then also with its own attenuation length; each
 * panel's pixels equal the flat detector's with that sensor.  The gradients of a panel's own sensor pass the
 * finite-difference check; a negative thickness is refused naming the panel; an experiment list carries the
 * panels' sensors back (formats build). */
static void sensors(nbg_ctx *ctx)
{
    nbg_experiment e;
    base(&e);
    e.convention = NBG_CONV_MOSFLM;
    e.det_rot[0] = 3, e.det_rot[1] = -2, e.twotheta = 6;
    e.thick = 300, e.thicksteps = 2;
    e.fpixels = 48, e.spixels = 36;
    nbg_panel pan[2];
    e.npanels = tile(&e, 2, 1, 24, 36, 0, 0, pan);
    e.panels = pan;
    /* v 0: panel 1 600 um; v 1: with its own attenuation length too; v 2: no sensor of the experiment's, each panel
     * its own (300 and 600 um) in 3 layers, as flat detectors with those sensors in 3 layers (until stop 58 such
     * panels were rendered in one layer, -thicksteps not taken) */
    for (int v = 0; v < 3; ++v) {
        nbg_panel own[2];
        memcpy(own, pan, sizeof own);
        own[1].thick = 600;
        own[1].thick_abs = v == 1 ? 150 : 0;
        nbg_experiment ev = e;
        ev.panels = own;
        if (v == 2) {
            own[0].thick = 300, own[0].thick_abs = 0;
            ev.thick = 0, ev.thicksteps = 3;
        }
        nbg_experiment f = e, f2 = e;
        f.npanels = 0, f.panels = NULL;
        f2.npanels = 0, f2.panels = NULL;
        f.thicksteps = f2.thicksteps = ev.thicksteps;
        f2.thick = 600;
        f2.thick_abs = v == 1 ? 150 : NAN;
        size_t n, nf, nf2;
        int rc, rcf, rcf2;
        float *img = render(ctx, &ev, &n, &rc);
        float *flat = render(ctx, &f, &nf, &rcf);
        float *flat2 = render(ctx, &f2, &nf2, &rcf2);
        double d0 = INFINITY, d1 = INFINITY, mx = 0, dx = 0;
        if (rc == NBG_OK && rcf == NBG_OK && rcf2 == NBG_OK) {
            d0 = d1 = 0;
            long i = 0;
            for (int k = 0; k < 2; ++k) {
                for (int sl = 0; sl < 36; ++sl) {
                    for (int fa = 0; fa < 24; ++fa, ++i) {
                        const long j = (long)sl * 48 + k * 24 + fa;
                        const float ref = k == 0 ? flat[j] : flat2[j];
                        mx = fmax(mx, fabs(ref));
                        *(k == 0 ? &d0 : &d1) = fmax(k == 0 ? d0 : d1, fabs((double)img[i] - ref));
                        dx = fmax(dx, fabs((double)flat[j] - flat2[j]));
                    }
                }
            }
        }
        static const char *const ids[3] = {"sensor-own", "sensor-own-abs", "sensor-own-only"};
        static const char *const what[3] = {"the experiment's 300 um; panel 1 600 um",
                                            "the experiment's 300 um; panel 1 600 um, 150 um attenuation",
                                            "no experiment sensor: its own 300 um; panel 1 600 um; 3 layers"};
        nbgi_test_check(mx > 0 && d0 <= 1e-9 * mx && d1 <= 1e-9 * mx && dx > 1e-3 * mx, ids[v],
                       "panels 0 and 1 (%s) equal the flat detectors so made: max |diff| %.3g and %.3g of %.4g; "
                       "the two sensors differ by %.3g (%s)", what[v], d0, d1, mx, dx,
                       rc == NBG_OK ? "ok" : nbg_errmsg(ctx));
        free(img);
        free(flat);
        free(flat2);
    }
    pan[1].thick = 600;
    pan[1].thick_abs = 150;
    /* gradients through a panel's own sensor: the capture fraction's derivative along the ray */
    nbg_panel_motion mot[1];
    memset(mot, 0, sizeof mot);
    nbg_experiment eg = e;
    eg.motions = mot;
    eg.nmotions = 1;
    /* distance, det_roty and every component of the one group's motion */
    nbg_gradcheck_result res[8];
    nbg_param cp[8] = {NBG_P_DISTANCE, NBG_P_DET_ROTY};
    for (int c = 0; c < 6; ++c) {
        cp[2 + c] = NBG_P_MOTION(0, c);
    }
    const int grc = nbg_gradcheck(ctx, &eg, cp, 8, 1e-6, 1, res);
    const int nres = grc == NBG_OK ? 8 : 0;
    int npass = 0;
    char bad[48] = "";
    for (int k = 0; k < nres; ++k) {
        npass += res[k].status == NBG_CHECK_PASS;
        if (res[k].status != NBG_CHECK_PASS) {
            nbg_param_label(&eg, res[k].param, bad, sizeof bad);
        }
    }
    nbgi_test_check(grc == NBG_OK && nres == 8 && npass == 8, "sensor-gradcheck", "distance, det_roty and the six "
                   "motion components of a detector with a panel of its own sensor: %d of %d pass%s%s (%s)", npass,
                   nres, bad[0] ? "; not " : "", bad, grc == NBG_OK ? "ok" : nbg_errmsg(ctx));
    pan[1].thick = -5;
    refuse(ctx, "refuse-sensor", &e, "panel 1 (t0_1): sensor thickness -5 um");
    pan[1].thick = 600;
    pan[1].thick_abs = 0; /* its attenuation length then its thickness, written out as such */
    e.oversample = 3;
#ifdef NBG_HAVE_FORMATS
    char dir[256], ex[300];
    if (nbgi_test_mkdtemp("nbg-sensors", dir, sizeof dir) == NULL) {
        nbgi_test_check(0, "sensor-expt", "no temporary directory");
        return;
    }
    /* v 0: the experiment's sensor (300 um, 2 layers) and panel 1's own; v 1: no sensor of the experiment's, each
     * panel its own (300 and 600 um) in 3 layers, and the physical model.  The list carries the layers and the model
     * (nbgrad's detector key), so the read-back renders the same image without being told them. */
    for (int v = 0; v < 2; ++v) {
        nbg_experiment ev = e;
        if (v == 1) {
            ev.thick = 0;
            ev.thicksteps = 3;
            ev.sensor_model = NBG_SENSOR_PHYSICAL;
            pan[0].thick = 300;
            pan[0].thick_abs = 0;
        }
        snprintf(ex, sizeof ex, "%s/s%d.expt", dir, v);
        nbg_report r;
        nbg_geometry g, g2;
        nbg_panel lab[2], *back = NULL;
        int np = 0;
        size_t n = 0, n2 = 0;
        int rc = NBG_OK, r2 = NBG_OK;
        float *img = render(ctx, &ev, &n, &rc);
        rc = rc == NBG_OK ? nbgi_test_write_panel_list(ctx, &ev, ex, v ? "s1.nxs" : "s.nxs", &r, &g, lab) : rc;
        rc = rc == NBG_OK ? nbg_read_expt_panels(ctx, ex, &g2, &back, &np) : rc;
        nbg_experiment e2;
        base(&e2);
        r2 = rc == NBG_OK ? nbg_experiment_from_geometry(ctx, &g2, &e2) : rc;
        e2.panels = back, e2.npanels = np, e2.panel_frame = NBG_PANELS_LAB;
        /* the subpixels are nbgrad's choice, not the list's (the list's distance is the sample pivot's; its scan
         * has one still image) */
        e2.oversample = ev.oversample;
        float *img2 = r2 == NBG_OK ? render(ctx, &e2, &n2, &r2) : NULL;
        /* relative to the peak; INFINITY on a blank image */
        const double d = r2 == NBG_OK && img != NULL && n2 == n ? nbgi_test_max_rel_diff(img, img2, n) : INFINITY;
        const int kept = np == 2 && back != NULL && back[0].thick == 0 && fabs(back[1].thick - 600) < 1e-9 &&
                         fabs(back[1].thick_abs - 600) < 1e-9 && fabs(e2.thick - 300) < 1e-9 &&
                         e2.thicksteps == (v ? 3 : 2) &&
                         e2.sensor_model == (v ? NBG_SENSOR_PHYSICAL : NBG_SENSOR_NANOBRAGG);
        nbgi_test_check(rc == NBG_OK && r2 == NBG_OK && kept && d <= 1e-9,
                       v ? "sensor-expt-panels-only" : "sensor-expt",
                       "an experiment list carries the panels' sensors (%s; panel 1 %g um, attenuation %g um; read "
                       "back %d layers, model %d) and renders the same image: max |diff| %.3g of its peak (%s)",
                       v ? "no experiment sensor, panel 0 its own 300 um, 3 layers, physical" : "300 um, 2 layers",
                       back ? back[1].thick : NAN, back ? back[1].thick_abs : NAN, e2.thicksteps, e2.sensor_model, d,
                       r2 == NBG_OK ? "ok" : nbg_errmsg(ctx));
        free(img);
        free(img2);
        free(back);
    }
    nbgi_test_rmtree(dir);
#endif
}

int main(void)
{
    nbg_ctx *ctx = NULL, *ctxf = NULL;
    if (nbg_ctx_create(&ctx, NBG_BACKEND_CPU, NBG_DOUBLE, 0) != NBG_OK ||
        nbg_ctx_create(&ctxf, NBG_BACKEND_CPU, NBG_FLOAT, 0) != NBG_OK) {
        nbgi_test_check(0, "context", "no CPU context");
        return nbgi_test_summary();
    }
    tiling(ctx, ctxf);
    gaps_and_frames(ctx);
    layouts(ctx);
    gradients(ctx);
    refusals(ctx);
    motions(ctx);
    motion_refine(ctx);
    beam_refine(ctx);
    sensors(ctx);
#ifdef NBG_HAVE_FORMATS
    expt_panels(ctx);
    files_panels(ctx);
#endif
    nbg_ctx_destroy(ctx);
    nbg_ctx_destroy(ctxf);
    return nbgi_test_summary();
}
