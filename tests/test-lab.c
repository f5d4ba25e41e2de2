/*
 * test-lab.c -- the experiment's model in the laboratory frame (nbgi_lab, src/plan.h) is what the kernels' inputs
 * are built from, and it means what plan.h says.
 *
 *   lab-hand-*     a model written by hand from DIALS's description of an experiment (a beam along +z, a detector
 *                  placed by its origin, fast and slow axes, a rotation axis, a crystal's real-space vectors), with
 *                  no flags at all, rendered by nbgi_plan_kernels: the image equals the one nanoBragg's flags give
 *                  for the same experiment (DIALS convention, ORGX/ORGY, distance), also with a scan of phi steps
 *   lab-list-*     an experiment of the flags described as a DIALS list describes it (nbg_geometry, DIALS's frame),
 *                  that description read into a model by hand: it renders the flags' image, as the list through
 *                  nbg_experiment_from_geometry does
 *   lab-swap-*     the model of one experiment replaced by that of another (detector moved and turned, crystal
 *                  turned, another wavelength, scan and beam tilt) and rendered again: the image equals the other
 *                  experiment's bit for bit, so nothing of the first survives outside the model
 *   lab-shift      the model's detector origin moved by one pixel along its fast axis: the image moves by one
 *                  column
 *   lab-refuse     a model without sources is refused by name
 */
#include "testutil.h" /* first: it sets _GNU_SOURCE */
#include "nbgrad.h"
#include "plan.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static nbg_ctx *ctx;

/* The image of a built plan, in double. */
static double *render(nbgi_plan *pl, const char *id)
{
    const size_t n = (size_t)pl->k.npix;
    float *img = malloc(n * sizeof *img);
    double *d = malloc(n * sizeof *d);
    if (img == NULL || d == NULL || nbgi_forward_plan_d(ctx, pl, img, d) != NBG_OK) {
        nbgi_test_check(0, id, "render: %s", nbg_errmsg(ctx));
        free(img);
        free(d);
        return NULL;
    }
    free(img);
    return d;
}

/* The largest |a - b| over the largest |b| (*peak, which tells a blank image). */
static double relmax(const double *a, const double *b, size_t n, double *peak)
{
    double dm = 0, bm = 0;
    for (size_t i = 0; i < n; ++i) {
        dm = fmax(dm, fabs(a[i] - b[i]));
        bm = fmax(bm, fabs(b[i]));
    }
    *peak = bm;
    return bm > 0 ? dm / bm : INFINITY;
}

/* DIALS's description of an experiment, in its own terms (mm, A, deg). */
typedef struct {
    double beam[3];                     /* the direction the beam travels (unit) */
    double origin[3], fast[3], slow[3]; /* the detector's pixel (0, 0) corner and axes */
    double pixel;                       /* mm */
    int fpixels, spixels;
    double wavelength;                  /* A */
    double pol_axis[3], kahn;           /* polarization */
    double axis[3];                     /* the rotation axis */
    double phi0, phistep;               /* deg */
    int nphi;
    double real_space[9];               /* a, b, c (A), at phi 0 */
    double cell[6];                     /* the cell whose nanoBragg construction they are (the flags' -cell) */
    double N, F;
} dials_like;

/* The model of d, written by hand: nothing of nanoBragg's flags is used. */
static int hand_model(const dials_like *d, double fluence, nbgi_plan *pl)
{
    memset(pl, 0, sizeof *pl);
    nbgi_lab *m = &pl->lab;
    const double *b = d->beam;
    memcpy(m->beam.b, b, sizeof m->beam.b);
    memcpy(m->beam.sb, b, sizeof m->beam.sb);
    memcpy(m->beam.pol, d->pol_axis, sizeof m->beam.pol);
    memcpy(m->beam.spol, d->pol_axis, sizeof m->beam.spol);
    m->beam.lambda0 = m->beam.lambda_min = d->wavelength * 1e-10;
    m->beam.polarization = d->kahn;
    m->beam.fluence = fluence;
    m->beam.nsrc = 1;
    m->beam.pos = malloc(4 * sizeof(double));
    m->beam.lamrel = malloc(2 * sizeof(double));
    m->gon.phi = malloc((size_t)d->nphi * sizeof(double));
    if (m->beam.pos == NULL || m->beam.lamrel == NULL || m->gon.phi == NULL) {
        return 0;
    }
    /* one source 10 m upstream (the sources are points the beam comes from) */
    for (int i = 0; i < 3; ++i) {
        m->beam.pos[i] = -10 * b[i];
    }
    m->beam.pos[3] = m->beam.lambda0;
    m->beam.lamrel[0] = 1;
    m->beam.lamrel[1] = 0;
    m->beam.dscale = m->beam.lamrel + 1;

    nbgi_lab_detector *dt = &m->det;
    dt->pixel = d->pixel / 1000;
    dt->fpixels = d->fpixels;
    dt->spixels = d->spixels;
    nbgi_cross(d->fast, d->slow, dt->g.o);
    if (nbgi_dot(d->origin, dt->g.o) < 0) { /* the normal points away from the sample */
        for (int i = 0; i < 3; ++i) {
            dt->g.o[i] = -dt->g.o[i];
        }
    }
    for (int i = 0; i < 3; ++i) {
        dt->g.pix0[i] = d->origin[i] / 1000;
        dt->g.f[i] = d->fast[i];
        dt->g.s[i] = d->slow[i];
    }
    dt->g.close_distance = nbgi_dot(dt->g.pix0, dt->g.o);
    dt->g.distance = dt->g.close_distance / nbgi_dot(b, dt->g.o);
    dt->thicksteps = 1;
    dt->npix = (long)d->fpixels * d->spixels;
    dt->nrows = d->spixels;

    memcpy(m->gon.axis0, d->axis, sizeof m->gon.axis0);
    memcpy(m->gon.axis, d->axis, sizeof m->gon.axis);
    m->gon.nphi = d->nphi;
    for (int i = 0; i < d->nphi; ++i) {
        m->gon.phi[i] = (d->phi0 + d->phistep * i) * M_PI / 180;
    }

    nbgi_lab_crystal *x = &m->xtal;
    double inv[9];
    if (!nbgi_inverse3(d->real_space, inv)) {
        return 0;
    }
    for (int i = 0; i < 9; ++i) {
        x->a0[i] = d->real_space[i] * 1e-10;
    }
    /* a*, b*, c* (1/A) are the columns of the inverse of the matrix whose rows are a, b, c */
    for (int v = 0; v < 3; ++v) {
        for (int j = 0; j < 3; ++j) {
            x->astar[3 * v + j] = inv[3 * j + v];
        }
    }
    x->N[0] = x->N[1] = x->N[2] = d->N;
    x->fudge = 1;
    x->shape = NBG_SHAPE_SQUARE;
    x->default_F = d->F;
    x->domains = 1;
    pl->render.oversample = 1;
    for (int i = 0; i < 4; ++i) {
        pl->render.roi[i] = -1;
    }
    return nbgi_plan_kernels(ctx, pl) == NBG_OK;
}

/* The same experiment through nanoBragg's flags: the DIALS convention (beam +z, fast +x, slow +y, polarization and
 * rotation axis +y), ORGX/ORGY and the distance that put the untilted detector's corner at d's origin. */
static void flags_of(const dials_like *d, nbg_experiment *e)
{
    nbg_experiment_default(e);
    e->convention = NBG_CONV_DIALS;
    e->has_cell = 1;
    memcpy(e->cell, d->cell, sizeof e->cell);
    e->default_F = d->F;
    e->Na = e->Nb = e->Nc = d->N;
    e->lambda = d->wavelength;
    e->pixel = d->pixel;
    e->fpixels = d->fpixels;
    e->spixels = d->spixels;
    e->ORGX = -d->origin[0] / d->pixel + 0.5;
    e->ORGY = -d->origin[1] / d->pixel + 0.5;
    e->distance = d->origin[2];
    e->oversample = 1;
    e->polarization = d->kahn;
    e->phi0 = d->phi0;
    e->phistep = d->phistep;
    e->phisteps = d->nphi;
    e->osc = d->phistep * d->nphi;
}

static void hand_case(const char *id, const dials_like *d)
{
    nbg_experiment e;
    flags_of(d, &e);
    nbgi_plan fp, hp;
    char sub[96];
    if (nbgi_plan_build(ctx, &e, &fp) != NBG_OK) {
        nbgi_test_check(0, id, "the flags' plan: %s", nbg_errmsg(ctx));
        return;
    }
    /* the flags' crystal at phi 0 is nanoBragg's construction of the cell: the vectors stated */
    double dv = 0;
    for (int i = 0; i < 9; ++i) {
        dv = fmax(dv, fabs(fp.lab.xtal.a0[i] * 1e10 - d->real_space[i]));
    }
    snprintf(sub, sizeof sub, "%s-crystal", id);
    nbgi_test_check(dv < 1e-12, sub, "the flags' cell gives the real-space vectors stated (within %.2g A)", dv);
    const int ok = hand_model(d, e.fluence, &hp);
    snprintf(sub, sizeof sub, "%s-build", id);
    if (!nbgi_test_check(ok, sub, "the hand-written model built the kernels' inputs (%s)",
                         ok ? "ok" : nbg_errmsg(ctx))) {
        nbgi_plan_free(&fp);
        nbgi_plan_free(&hp);
        return;
    }
    double *a = render(&fp, id), *b = render(&hp, id);
    if (a != NULL && b != NULL) {
        double peak;
        const double r = relmax(b, a, (size_t)fp.k.npix, &peak);
        size_t lit = 0;
        for (long i = 0; i < fp.k.npix; ++i) {
            lit += a[i] > 0.01 * peak;
        }
        nbgi_test_check(r < 1e-10 && lit > 10, id, "the hand-written model renders the flags' image: max |diff| "
                        "%.2g of the peak %.4g (%zu pixels above 1%% of it)", r, peak, lit);
    }
    free(a);
    free(b);
    nbgi_plan_free(&fp);
    nbgi_plan_free(&hp);
}

/* Copies every model quantity of src into dst (the same counts of sources, phi steps, domains and panels). */
static void copy_model(const nbgi_lab *src, nbgi_lab *dst)
{
    nbgi_lab keep = *dst;
    *dst = *src;
    /* dst keeps its own arrays, filled with src's values */
    dst->beam.pos = keep.beam.pos;
    dst->beam.lamrel = keep.beam.lamrel;
    dst->beam.dscale = keep.beam.dscale;
    dst->gon.phi = keep.gon.phi;
    dst->xtal.umat = keep.xtal.umat;
    dst->xtal.mos_axis = keep.xtal.mos_axis;
    dst->xtal.mos_angle = keep.xtal.mos_angle;
    dst->det.panels = keep.det.panels;
    dst->det.motion_t = keep.det.motion_t;
    memcpy(dst->beam.pos, src->beam.pos, 4 * sizeof(double) * (size_t)src->beam.nsrc);
    memcpy(dst->beam.lamrel, src->beam.lamrel, 2 * sizeof(double) * (size_t)src->beam.nsrc);
    memcpy(dst->gon.phi, src->gon.phi, sizeof(double) * (size_t)src->gon.nphi);
    memcpy(dst->xtal.umat, src->xtal.umat, 9 * sizeof(double) * (size_t)src->xtal.domains);
    memcpy(dst->xtal.mos_axis, src->xtal.mos_axis, 3 * sizeof(double) * (size_t)src->xtal.domains);
    memcpy(dst->xtal.mos_angle, src->xtal.mos_angle, sizeof(double) * (size_t)src->xtal.domains);
    if (src->det.npanels > 0) {
        memcpy(dst->det.panels, src->det.panels, sizeof(nbgi_kpanel) * (size_t)src->det.npanels);
    }
}

static void swap_case(const char *id, const nbg_experiment *e1, const nbg_experiment *e2)
{
    nbgi_plan p1, p2;
    if (nbgi_plan_build(ctx, e1, &p1) != NBG_OK) {
        nbgi_test_check(0, id, "plan 1: %s", nbg_errmsg(ctx));
        return;
    }
    if (nbgi_plan_build(ctx, e2, &p2) != NBG_OK) {
        nbgi_test_check(0, id, "plan 2: %s", nbg_errmsg(ctx));
        nbgi_plan_free(&p1);
        return;
    }
    double *a = render(&p2, id), *before = render(&p1, id);
    copy_model(&p2.lab, &p1.lab);
    const int rc = nbgi_plan_kernels(ctx, &p1);
    double *b = rc == NBG_OK ? render(&p1, id) : NULL;
    if (a != NULL && b != NULL && before != NULL) {
        const size_t n = (size_t)p2.k.npix;
        double peak, peak0;
        const int same = memcmp(a, b, n * sizeof *a) == 0;
        const double moved = relmax(before, a, n, &peak0);
        relmax(b, a, n, &peak);
        nbgi_test_check(same && moved > 0.1 && peak > 0, id, "experiment 1 with experiment 2's model renders "
                        "experiment 2's image bit for bit (%s; the two experiments' images differ by %.2g of the "
                        "peak)", same ? "identical" : "different", moved);
    } else {
        nbgi_test_check(0, id, "render: %s", nbg_errmsg(ctx));
    }
    free(a);
    free(b);
    free(before);
    nbgi_plan_free(&p1);
    nbgi_plan_free(&p2);
}

/* An experiment of nanoBragg's flags (MOSFLM's convention, a turned and swung detector, a triclinic crystal turned,
 * a scan) described as a DIALS list does (nbg_geometry: DIALS's frame, the beam along -z), that description read
 * into a model by hand, and rendered: the image is the flags' one, and the one the list gives through
 * nbg_experiment_from_geometry (the custom convention with the sample pivot), to rounding. */
static void list_case(const char *id)
{
    nbg_experiment e, el;
    nbgi_test_still(&e);
    e.convention = NBG_CONV_MOSFLM;
    e.fpixels = 64, e.spixels = 56;
    const double cell[6] = {40, 50, 60, 80, 95, 105};
    memcpy(e.cell, cell, sizeof cell);
    e.misset[0] = 17, e.misset[1] = -8, e.misset[2] = 31;
    e.det_rot[0] = 2, e.det_rot[1] = -3, e.det_rot[2] = 1;
    e.twotheta = 4;
    e.phi0 = 5, e.osc = 0.6, e.phisteps = 3;
    nbg_report r;
    nbg_geometry g;
    if (nbg_describe(ctx, &e, &r) != NBG_OK || nbg_geometry_from_report(ctx, &e, &r, 1, &g) != NBG_OK) {
        nbgi_test_check(0, id, "the list's description: %s", nbg_errmsg(ctx));
        return;
    }
    dials_like d;
    memset(&d, 0, sizeof d);
    for (int i = 0; i < 3; ++i) {
        d.beam[i] = -g.direction[i];
        d.origin[i] = g.origin[i];
        d.fast[i] = g.fast[i];
        d.slow[i] = g.slow[i];
        d.axis[i] = g.axis[i];
    }
    nbgi_cross(g.polarization_normal, d.beam, d.pol_axis);
    d.kahn = 2 * g.polarization_fraction - 1;
    d.pixel = g.pixel_f;
    d.fpixels = g.fpixels, d.spixels = g.spixels;
    d.wavelength = g.wavelength;
    d.phi0 = g.scan_start;
    d.phistep = g.scan_width / e.phisteps;
    d.nphi = e.phisteps;
    memcpy(d.real_space, g.real_space, sizeof d.real_space);
    d.N = e.Na, d.F = e.default_F;
    el = e; /* the crystal's size, F, sampling and the like; the list replaces the geometry and the crystal */
    nbgi_plan fp, lp, hp;
    int ok = nbg_experiment_from_geometry(ctx, &g, &el) == NBG_OK;
    ok = ok && nbgi_plan_build(ctx, &e, &fp) == NBG_OK;
    ok = ok && nbgi_plan_build(ctx, &el, &lp) == NBG_OK;
    ok = ok && hand_model(&d, e.fluence, &hp);
    if (!nbgi_test_check(ok, id, "the three plans built (%s)", ok ? "ok" : nbg_errmsg(ctx))) {
        return;
    }
    double *a = render(&fp, id), *b = render(&lp, id), *c = render(&hp, id);
    if (a != NULL && b != NULL && c != NULL) {
        const size_t n = (size_t)fp.k.npix;
        double peak, peak2;
        const double rh = relmax(c, a, n, &peak), rl = relmax(b, a, n, &peak2);
        size_t lit = 0;
        for (size_t i = 0; i < n; ++i) {
            lit += a[i] > 0.01 * peak;
        }
        char sub[96];
        snprintf(sub, sizeof sub, "%s-hand", id);
        nbgi_test_check(rh < 1e-9 && lit > 10, sub, "the list's description read into a model by hand renders the "
                        "flags' image: max |diff| %.2g of the peak %.4g (%zu pixels above 1%% of it)", rh, peak, lit);
        snprintf(sub, sizeof sub, "%s-experiment", id);
        nbgi_test_check(rl < 1e-9, sub, "and so does the list through nbg_experiment_from_geometry: max |diff| %.2g "
                        "of the peak", rl);
    }
    free(a);
    free(b);
    free(c);
    nbgi_plan_free(&fp);
    nbgi_plan_free(&lp);
    nbgi_plan_free(&hp);
}

int main(void)
{
    if (nbg_ctx_create(&ctx, NBG_BACKEND_CPU, NBG_DOUBLE, 0) != NBG_OK) {
        printf("FAIL lab-0 context\n");
        return 1;
    }
    /* a triclinic crystal in nanoBragg's construction of its cell, a detector 80 mm downstream whose pixel (0, 0)
     * corner is off the beam */
    dials_like d;
    memset(&d, 0, sizeof d);
    d.beam[2] = 1;
    d.origin[0] = -3.05, d.origin[1] = -2.15, d.origin[2] = 80;
    d.fast[0] = 1, d.slow[1] = 1;
    d.pixel = 0.1;
    d.fpixels = 64, d.spixels = 48;
    d.wavelength = 1.0;
    d.pol_axis[1] = 1, d.kahn = 0.5;
    d.axis[1] = 1;
    d.nphi = 1;
    d.N = 5, d.F = 100;
    {
        nbg_experiment e;
        nbg_experiment_default(&e);
        e.has_cell = 1;
        const double cell[6] = {40, 50, 60, 80, 95, 105};
        memcpy(e.cell, cell, sizeof cell);
        memcpy(d.cell, cell, sizeof cell);
        e.default_F = 1;
        e.fpixels = e.spixels = 4;
        nbg_report r;
        if (nbg_describe(ctx, &e, &r) != NBG_OK) {
            printf("FAIL lab-0 describe: %s\n", nbg_errmsg(ctx));
            return 1;
        }
        memcpy(d.real_space, r.real_vectors, sizeof d.real_space);
    }
    hand_case("lab-hand-still", &d);
    d.phi0 = 10, d.phistep = 0.25, d.nphi = 4;
    hand_case("lab-hand-scan", &d);

    list_case("lab-list");

    /* one experiment's model swapped for another's: MOSFLM's convention, its beam pivot and rotated detector */
    nbg_experiment e1, e2;
    nbgi_test_still(&e1);
    e1.convention = NBG_CONV_MOSFLM;
    e1.fpixels = e1.spixels = 64;
    e1.phisteps = 2, e1.osc = 0.5;
    e1.mosaic = 0.2, e1.mosaic_domains = 3;
    e1.hdivrange = 0.2, e1.hdivsteps = 2;
    e2 = e1;
    e2.distance = 90;
    e2.det_rot[0] = 2, e2.det_rot[1] = -3, e2.det_rot[2] = 4;
    e2.twotheta = 5;
    e2.misset[0] = 20, e2.misset[2] = -7;
    e2.lambda = 1.1;
    e2.phi0 = 30;
    e2.beam_tilt[0] = 0.3;
    e2.spindle_tilt[1] = 1;
    e2.mosaic = 0.4;
    e2.Na = 7;
    swap_case("lab-swap-detector-crystal-beam", &e1, &e2);
    /* panels in the detector's plane, one of them moved by its group's motion in the second experiment */
    nbg_panel pan1[2], pan2[2];
    nbgi_test_two_panels(&e1, pan1);
    nbgi_test_two_panels(&e2, pan2);
    e2.distance += 7;
    e2.det_rot[1] = 2;
    e2.misset[1] = 9;
    pan2[1].origin[0] += 0.8;
    swap_case("lab-swap-panels", &e1, &e2);

    /* the detector's origin one pixel along its fast axis */
    {
        nbg_experiment e;
        nbgi_test_still(&e);
        e.fpixels = 64, e.spixels = 48;
        nbgi_plan pl;
        if (nbgi_plan_build(ctx, &e, &pl) == NBG_OK) {
            double *a = render(&pl, "lab-shift");
            for (int i = 0; i < 3; ++i) {
                pl.lab.det.g.pix0[i] += pl.lab.det.pixel * pl.lab.det.g.f[i];
            }
            double *b = nbgi_plan_kernels(ctx, &pl) == NBG_OK ? render(&pl, "lab-shift") : NULL;
            if (a != NULL && b != NULL) {
                double dm = 0, peak = 0;
                for (int s = 0; s < 48; ++s) {
                    for (int f = 0; f + 1 < 64; ++f) {
                        dm = fmax(dm, fabs(b[64 * s + f] - a[64 * s + f + 1]));
                        peak = fmax(peak, a[64 * s + f + 1]);
                    }
                }
                nbgi_test_check(peak > 0 && dm < 1e-9 * peak, "lab-shift", "the model's detector moved one pixel "
                                "along fast: pixel (f, s) shows what (f + 1, s) showed (max |diff| %.2g of the peak "
                                "%.4g)", dm / peak, peak);
            } else {
                nbgi_test_check(0, "lab-shift", "render: %s", nbg_errmsg(ctx));
            }
            free(a);
            free(b);
            /* a model without sources */
            const int nsrc = pl.lab.beam.nsrc;
            pl.lab.beam.nsrc = 0;
            const int rc = nbgi_plan_kernels(ctx, &pl);
            nbgi_test_check(rc == NBG_EINVAL && strstr(nbg_errmsg(ctx), "0 sources") != NULL, "lab-refuse",
                            "a model without sources: %s", nbg_errmsg(ctx));
            pl.lab.beam.nsrc = nsrc;
            nbgi_plan_free(&pl);
        } else {
            nbgi_test_check(0, "lab-shift", "plan: %s", nbg_errmsg(ctx));
        }
    }
    nbg_ctx_destroy(ctx);
    return nbgi_test_summary();
}
