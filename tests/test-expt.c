/*
 * test-expt.c -- DIALS experiment lists (src/expt.c): a write -> read round trip of every field (with and
 * without a crystal, NXmx and template image sets), the goniometer compositions the reader makes (setting and
 * fixed rotations, multi-axis), the older beam forms, and the refusals: each with the right status and a message
 * naming the file and the JSON path of the field.  Without jansson (FORMATS=0) the calls must say so.
 */
#include "testutil.h" /* first: it defines _GNU_SOURCE for nftw and mkdtemp */

#include "nbgrad.h"

#include <jansson.h>

#include <dirent.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The number of entries in dir (besides . and ..): a failed write must leave nothing, temporaries included. */
static int count_entries(const char *dir)
{
    DIR *d = opendir(dir);
    int n = 0;
    if (d == NULL)
        return -1;
    for (struct dirent *e; (e = readdir(d)) != NULL;)
        n += strcmp(e->d_name, ".") != 0 && strcmp(e->d_name, "..") != 0;
    closedir(d);
    return n;
}

/* A geometry with nothing at a default: every field distinguishable after a round trip. */
static void sample_geometry(nbg_geometry *g)
{
    memset(g, 0, sizeof *g);
    const double t = 10 * M_PI / 180;
    g->fpixels = 256, g->spixels = 300;
    g->pixel_f = 0.172, g->pixel_s = 0.172;
    g->fast[0] = cos(t), g->fast[2] = -sin(t);
    g->slow[1] = -1;
    g->origin[0] = -40.123456789, g->origin[1] = 30.5, g->origin[2] = -180.25;
    g->thickness = 0.45, g->mu = 3.9;
    strcpy(g->material, "Si");
    g->saturation = 65535, g->pedestal = 40, g->gain = 1.5;
    g->direction[0] = 0.01, g->direction[2] = 1;
    const double n = sqrt(1 + 1e-4);
    g->direction[0] /= n, g->direction[2] /= n;
    g->wavelength = 0.98;
    g->polarization_normal[0] = 0.6, g->polarization_normal[1] = 0.8;
    g->polarization_fraction = 0.97;
    g->axis[1] = sqrt(0.5), g->axis[0] = sqrt(0.5);
    g->scan_start = 5, g->scan_width = 0.5, g->nframes = 3, g->exposure = 0.1;
    g->has_crystal = 1;
    const double rs[9] = {51.2, 3.1, -2.4, 7.5, 62.3, 4.4, -6.1, 9.8, 83.7};
    memcpy(g->real_space, rs, sizeof rs);
    strcpy(g->space_group, " P 2yb");
}

#ifdef NBG_HAVE_FORMATS

static void write_text(const char *path, const char *text)
{
    FILE *f = fopen(path, "w");
    if (f != NULL) {
        fputs(text, f);
        fclose(f);
    }
}

static void check_vec(const double *got, const double *want, int n, const char *id, const char *what)
{
    for (int i = 0; i < n; ++i)
        nbgi_test_rel(got[i], want[i], 1e-12, id, "%s[%d]", what, i);
}

/* Every field of b against a. */
static void check_same(const nbg_geometry *a, const nbg_geometry *b, const char *id)
{
    nbgi_test_check(a->fpixels == b->fpixels && a->spixels == b->spixels, id, "image size %d x %d", b->fpixels,
                    b->spixels);
    nbgi_test_rel(b->pixel_f, a->pixel_f, 1e-12, id, "pixel_f");
    nbgi_test_rel(b->pixel_s, a->pixel_s, 1e-12, id, "pixel_s");
    check_vec(b->fast, a->fast, 3, id, "fast");
    check_vec(b->slow, a->slow, 3, id, "slow");
    check_vec(b->origin, a->origin, 3, id, "origin");
    nbgi_test_rel(b->thickness, a->thickness, 1e-12, id, "thickness");
    nbgi_test_rel(b->mu, a->mu, 1e-12, id, "mu");
    nbgi_test_check(strcmp(a->material, b->material) == 0, id, "material '%s'", b->material);
    nbgi_test_rel(b->saturation, a->saturation, 1e-12, id, "saturation");
    nbgi_test_rel(b->pedestal, a->pedestal, 1e-12, id, "pedestal");
    nbgi_test_rel(b->gain, a->gain, 1e-12, id, "gain");
    check_vec(b->direction, a->direction, 3, id, "direction");
    nbgi_test_rel(b->wavelength, a->wavelength, 1e-12, id, "wavelength");
    check_vec(b->polarization_normal, a->polarization_normal, 3, id, "polarization_normal");
    nbgi_test_rel(b->polarization_fraction, a->polarization_fraction, 1e-12, id, "polarization_fraction");
    check_vec(b->axis, a->axis, 3, id, "axis");
    nbgi_test_rel(b->scan_start, a->scan_start, 1e-12, id, "scan_start");
    nbgi_test_rel(b->scan_width, a->scan_width, 1e-12, id, "scan_width");
    nbgi_test_check(b->nframes == a->nframes, id, "nframes %d", b->nframes);
    nbgi_test_rel(b->exposure, a->exposure, 1e-12, id, "exposure");
    nbgi_test_check(b->has_crystal == a->has_crystal, id, "has_crystal %d", b->has_crystal);
    if (a->has_crystal) {
        check_vec(b->real_space, a->real_space, 9, id, "real_space");
        nbgi_test_check(strcmp(a->space_group, b->space_group) == 0, id, "space group '%s'", b->space_group);
    }
}

/* A small valid list with pieces replaced: the experiments, the beam reference, the panels and the goniometer. */
static void write_list(const char *path, const char *experiments, const char *panels, const char *goniometer,
                       const char *extra)
{
    char text[8192];
    snprintf(text, sizeof text,
             "{\n  \"__id__\": \"ExperimentList\",\n  \"experiment\": [%s],\n"
             "  \"beam\": [{\"direction\": [0, 0, 1], \"wavelength\": 1.0}],\n"
             "  \"detector\": [{\"panels\": [%s]}],\n"
             "  \"goniometer\": [%s],\n"
             "  \"scan\": [{\"image_range\": [1, 2], \"oscillation\": [0, 0.1], \"exposure_time\": [1, 1]}]%s\n}\n",
             experiments, panels, goniometer, extra);
    write_text(path, text);
}

#define EXPT(beam) "{\"__id__\": \"Experiment\", \"beam\": " beam ", \"detector\": 0, \"goniometer\": 0, \"scan\": 0}"
#define EXPT_C "{\"beam\": 0, \"detector\": 0, \"goniometer\": 0, \"scan\": 0, \"crystal\": 0}"
#define PANEL(fast) \
    "{" fast "\"slow_axis\": [0, -1, 0], \"origin\": [-10, 10, -100], \"pixel_size\": [0.1, 0.1], " \
    "\"image_size\": [100, 120]}"
#define FAST "\"fast_axis\": [1, 0, 0], "
#define GON "{\"rotation_axis\": [1, 0, 0]}"
#define CRYSTAL ",\n  \"crystal\": [{\"__id__\": \"crystal\", \"real_space_a\": [51.2, 3.1, -2.4], " \
    "\"real_space_b\": [7.5, 62.3, 4.4], \"real_space_c\": [-6.1, 9.8, 83.7], \"space_group_hall_symbol\": \" P 1\"}]"

/* Reads path and checks the status and that the message names the file and every one of the needles. */
static void expect_error(nbg_ctx *ctx, const char *path, int want, const char *id, const char *needle1,
                         const char *needle2)
{
    nbg_geometry g;
    g.fpixels = 77;
    const int rc = nbg_read_expt(ctx, path, &g);
    const char *msg = nbg_errmsg(ctx);
    const int named = strstr(msg, path) != NULL && (needle1 == NULL || strstr(msg, needle1) != NULL) &&
                      (needle2 == NULL || strstr(msg, needle2) != NULL);
    nbgi_test_check(rc == want && named && g.fpixels == 77, id, "status %d (want %d), message: %s", rc, want, msg);
}

static void test_round_trip(nbg_ctx *ctx, const char *dir)
{
    char path[512];
    nbg_geometry a, b;

    sample_geometry(&a);
    snprintf(path, sizeof path, "%s/rt.expt", dir);
    int rc = nbg_write_expt(ctx, path, &a, "img_#####.cbf");
    nbgi_test_check(rc == NBG_OK, "rt-write", "writing with a crystal: %s", rc ? nbg_errmsg(ctx) : "ok");
    rc = nbg_read_expt(ctx, path, &b);
    nbgi_test_check(rc == NBG_OK, "rt-read", "reading it back: %s", rc ? nbg_errmsg(ctx) : "ok");
    check_same(&a, &b, "rt-crystal");

    /* the DIALS layout: the keys DIALS 3.12 writes, and an absolute template */
    char *text = nbgi_test_read_file(path, NULL);
    nbgi_test_check(text != NULL && strstr(text, "\"__id__\": \"ExperimentList\"") != NULL &&
                        strstr(text, "\"__id__\": \"ImageSequence\"") != NULL &&
                        strstr(text, "img_#####.cbf\"") != NULL && strstr(text, "\"template\": \"/") != NULL &&
                        strstr(text, "\"ParallaxCorrectedPxMmStrategy\"") != NULL &&
                        strstr(text, "\"valid_image_ranges\": {}") != NULL &&
                        strstr(text, "\"hierarchy\"") != NULL && strstr(text, "\"scaling_model\": []") != NULL,
                    "rt-layout", "the file has DIALS's keys");
    free(text);

    /* no crystal, unknown saturation (NaN), no sensor, an NXmx image set */
    sample_geometry(&a);
    a.has_crystal = 0;
    a.saturation = NAN;
    a.thickness = 0, a.mu = 0, a.material[0] = '\0';
    a.nframes = 1, a.scan_width = 0;
    snprintf(path, sizeof path, "%s/rt2.expt", dir);
    rc = nbg_write_expt(ctx, path, &a, "data.nxs");
    nbgi_test_check(rc == NBG_OK, "rt2-write", "writing without a crystal: %s", rc ? nbg_errmsg(ctx) : "ok");
    rc = nbg_read_expt(ctx, path, &b);
    nbgi_test_check(rc == NBG_OK, "rt2-read", "reading it back: %s", rc ? nbg_errmsg(ctx) : "ok");
    check_same(&a, &b, "rt-nocrystal");
    text = nbgi_test_read_file(path, NULL);
    nbgi_test_check(text != NULL && strstr(text, "\"single_file_indices\"") != NULL &&
                        strstr(text, "\"SimplePxMmStrategy\"") != NULL && strstr(text, "\"crystal\": []") != NULL,
                    "rt2-layout", "NXmx image set with single_file_indices, no crystal");
    free(text);

    /* a still (issue 27 item 2): a list without scan and goniometer read, turned into an experiment, described
     * and written back stays a still: no scan, no goniometer, an ImageSet (it was written as a scan of width 0) */
    {
        sample_geometry(&a);
        a.axis[0] = 1, a.axis[1] = a.axis[2] = 0;
        a.nframes = 1, a.scan_width = 0, a.scan_start = 0, a.scan_stated = 0;
        snprintf(path, sizeof path, "%s/still.expt", dir);
        rc = nbg_write_expt(ctx, path, &a, "still.cbf");
        text = nbgi_test_read_file(path, NULL);
        const int layout = rc == NBG_OK && text != NULL && strstr(text, "\"__id__\": \"ImageSet\"") != NULL &&
                           strstr(text, "\"images\": [") != NULL && strstr(text, "\"scan\": []") != NULL &&
                           strstr(text, "\"goniometer\": []") != NULL && strstr(text, "\"scan\": 0") == NULL;
        free(text);
        nbg_geometry b2, g2;
        nbg_experiment e2;
        nbg_report r2;
        int still = 0, again = 0;
        nbg_experiment_default(&e2);
        if (layout && nbg_read_expt(ctx, path, &b2) == NBG_OK && nbg_experiment_from_geometry(ctx, &b2, &e2) == NBG_OK) {
            still = e2.still;
            e2.default_F = 1;
            if (nbg_describe(ctx, &e2, &r2) == NBG_OK && nbg_geometry_from_report(ctx, &e2, &r2, 1, &g2) == NBG_OK) {
                snprintf(path, sizeof path, "%s/still2.expt", dir);
                again = nbg_write_expt(ctx, path, &g2, "still.cbf") == NBG_OK;
                text = nbgi_test_read_file(path, NULL);
                again = again && text != NULL && strstr(text, "\"__id__\": \"ImageSet\"") != NULL &&
                        strstr(text, "\"scan\": []") != NULL;
                free(text);
                /* the same experiment turned by -osc is a rotation again */
                e2.osc = 0.1;
                if (nbg_describe(ctx, &e2, &r2) == NBG_OK && nbg_geometry_from_report(ctx, &e2, &r2, 1, &g2) == NBG_OK)
                    again += g2.scan_stated == 2;
            }
        }
        if (again < 2) printf("# rt-still: %s\n", nbg_errmsg(ctx));
        nbgi_test_check(layout && still == 1 && again == 2, "rt-still", "a still is written as DIALS writes one "
                        "(layout %d), read as a still (%d), written back as one and a turned copy as a scan (%d of 2)",
                        layout, still, again);
    }

    /* no image set at all */
    snprintf(path, sizeof path, "%s/rt3.expt", dir);
    rc = nbg_write_expt(ctx, path, &a, NULL);
    nbgi_test_check(rc == NBG_OK && nbg_read_expt(ctx, path, &b) == NBG_OK, "rt3", "no image set: %s",
                    rc ? nbg_errmsg(ctx) : "ok");
}

static void test_write_errors(nbg_ctx *ctx, const char *dir)
{
    char sub[512], path[600];
    snprintf(sub, sizeof sub, "%s/w", dir);
    mkdir(sub, 0700);
    snprintf(path, sizeof path, "%s/bad.expt", sub);
    nbg_geometry g;
    sample_geometry(&g);
    g.wavelength = NAN;
    int rc = nbg_write_expt(ctx, path, &g, "img_#####.cbf");
    nbgi_test_check(rc == NBG_EINVAL && strstr(nbg_errmsg(ctx), path) != NULL &&
                        strstr(nbg_errmsg(ctx), "wavelength") != NULL && count_entries(sub) == 0,
                    "write-invalid", "invalid geometry refused, nothing left: %s", nbg_errmsg(ctx));
    sample_geometry(&g);
    rc = nbg_write_expt(ctx, path, &g, "img_00001.cbf");
    nbgi_test_check(rc == NBG_EINVAL && count_entries(sub) == 0, "write-template",
                    "3 frames named by one file refused: %s", nbg_errmsg(ctx));
    rc = nbg_write_expt(ctx, sub, &g, "img_#####.cbf");
    nbgi_test_check(rc == NBG_EIO && count_entries(sub) == 0, "write-dir", "a directory as target: %s",
                    nbg_errmsg(ctx));
}

static void test_read_errors(nbg_ctx *ctx, const char *dir)
{
    char path[512];
    snprintf(path, sizeof path, "%s/e.expt", dir);

    write_list(path, EXPT("0"), PANEL(FAST), GON, "");
    nbg_geometry g;
    int rc = nbg_read_expt(ctx, path, &g);
    nbgi_test_check(rc == NBG_OK && g.nframes == 2 && isnan(g.saturation) && g.fpixels == 100 && g.spixels == 120 &&
                        !g.has_crystal && g.polarization_fraction == 0.999,
                    "read-minimal", "a minimal list with the defaults: %s", rc ? nbg_errmsg(ctx) : "ok");

    write_list(path, EXPT("0") ", " EXPT("0"), PANEL(FAST), GON, "");
    expect_error(ctx, path, NBG_EFORMAT, "read-2expts", "2 experiments", "reads one");
    write_list(path, EXPT("0"), PANEL(FAST) ", " PANEL(FAST), GON, "");
    expect_error(ctx, path, NBG_EFORMAT, "read-2panels", "detector[0] has 2 panels", "multi-panel");
    write_list(path, EXPT("0"), PANEL(""), GON, "");
    expect_error(ctx, path, NBG_EFORMAT, "read-nofast", "detector[0].panels[0].fast_axis: missing", NULL);
    write_list(path, EXPT("0"), PANEL("\"fast_axis\": [1, 0], "), GON, "");
    expect_error(ctx, path, NBG_EFORMAT, "read-fast2", "detector[0].panels[0].fast_axis: expected 3 numbers", NULL);
    write_list(path, EXPT("0"), PANEL("\"fast_axis\": [1, \"0\", 0], "), GON, "");
    expect_error(ctx, path, NBG_EFORMAT, "read-string", "detector[0].panels[0].fast_axis: expected 3 numbers",
                 "not a number");
    write_list(path, EXPT("3"), PANEL(FAST), GON, "");
    expect_error(ctx, path, NBG_EFORMAT, "read-beamidx", "experiment[0].beam", "out of range");
    write_list(path, EXPT("\"x\""), PANEL(FAST), GON, "");
    expect_error(ctx, path, NBG_EFORMAT, "read-beamstr", "experiment[0].beam", "expected an index");
    write_list(path, EXPT("0"), PANEL(FAST), "{\"rotation_axis\": [1, 0, 0], \"setting_rotation\": [1, 0, 0, 0, 2, 0, "
               "0, 0, 1]}", "");
    expect_error(ctx, path, NBG_EFORMAT, "read-setting", "goniometer[0].setting_rotation", "not a rotation");
    write_list(path, EXPT("0"), PANEL(FAST), "{\"axes\": [[1, 0, 0], [0, 0, 1]], \"angles\": [0], \"scan_axis\": 0}",
               "");
    expect_error(ctx, path, NBG_EFORMAT, "read-angles", "goniometer[0].angles", "expected 2 numbers");
    write_list(path, EXPT("0"), PANEL(FAST), GON, CRYSTAL);
    {
        /* a crystal at index 0 that the experiment references by a wrong index */
        char text[4096];
        char *t = nbgi_test_read_file(path, NULL);
        snprintf(text, sizeof text, "%s", t != NULL ? t : "");
        free(t);
        char *e = strstr(text, "\"scan\": 0}");
        if (e != NULL) {
            memmove(e + strlen("\"scan\": 0, \"crystal\": 1}"), e + strlen("\"scan\": 0}"),
                    strlen(e + strlen("\"scan\": 0}")) + 1);
            memcpy(e, "\"scan\": 0, \"crystal\": 1}", strlen("\"scan\": 0, \"crystal\": 1}"));
        }
        write_text(path, text);
        expect_error(ctx, path, NBG_EFORMAT, "read-crystalidx", "experiment[0].crystal", "index 1 is out of range");
    }

    /* malformed JSON: a missing value on line 3 */
    write_text(path, "{\n  \"__id__\": \"ExperimentList\",\n  \"experiment\": [,]\n}\n");
    expect_error(ctx, path, NBG_EFORMAT, "read-json", "line 3", "column");
    write_text(path, "[1, 2]\n");
    expect_error(ctx, path, NBG_EFORMAT, "read-notobject", "expected a JSON object", NULL);
    write_text(path, "{\"__id__\": \"DataBlock\", \"experiment\": []}\n");
    expect_error(ctx, path, NBG_EFORMAT, "read-id", "__id__", "ExperimentList");

    /* not a file */
    expect_error(ctx, dir, NBG_EIO, "read-dir", "not a regular file", NULL);
    snprintf(path, sizeof path, "%s/missing.expt", dir);
    expect_error(ctx, path, NBG_EIO, "read-missing", "cannot read", NULL);

    /* a valid list whose geometry nbgrad cannot use (zero pixel size) */
    snprintf(path, sizeof path, "%s/e.expt", dir);
    write_list(path, EXPT("0"), "{" FAST "\"slow_axis\": [0, -1, 0], \"origin\": [-10, 10, -100], \"pixel_size\": "
               "[0, 0.1], \"image_size\": [100, 120]}", GON, "");
    expect_error(ctx, path, NBG_EFORMAT, "read-geometry", "pixel size", NULL);
}

/* What the reader composes: the numbers are dxtbx's own (Goniometer.get_rotation_axis() and S F a for its
 * get_setting_rotation() and get_fixed_rotation()), for the goniometers written here. */
static void test_compose(nbg_ctx *ctx, const char *dir)
{
    char path[512];
    nbg_geometry g;
    snprintf(path, sizeof path, "%s/c.expt", dir);

    /* S = 90 deg about z, F = 90 deg about x */
    write_list(path, EXPT_C, PANEL(FAST), "{\"rotation_axis\": [1, 0, 0], \"fixed_rotation\": [1, 0, 0, 0, 0, -1, 0, "
               "1, 0], \"setting_rotation\": [0, -1, 0, 1, 0, 0, 0, 0, 1]}", CRYSTAL);
    int rc = nbg_read_expt(ctx, path, &g);
    nbgi_test_check(rc == NBG_OK, "compose-sf", "setting and fixed rotations: %s", rc ? nbg_errmsg(ctx) : "ok");
    const double axis1[3] = {0, 1, 0};
    const double rs1[9] = {-2.4, 51.2, 3.1, 4.4, 7.5, 62.3, 83.7, -6.1, 9.8};
    check_vec(g.axis, axis1, 3, "compose-sf", "axis");
    check_vec(g.real_space, rs1, 9, "compose-sf", "real_space");

    /* a four-axis goniometer with non-zero angles, scan axis 2 (non-unit axes as dxtbx accepts them) */
    write_list(path, EXPT_C, PANEL(FAST), "{\"axes\": [[0.64, 0, 0.77], [0, 0.6, 0.8], [1, 0, 0], [0, 0, 1]], "
               "\"angles\": [12, 30, 7, -20], \"names\": [\"a\", \"b\", \"c\", \"d\"], \"scan_axis\": 2}", CRYSTAL);
    rc = nbg_read_expt(ctx, path, &g);
    nbgi_test_check(rc == NBG_OK, "compose-multi", "multi-axis goniometer: %s", rc ? nbg_errmsg(ctx) : "ok");
    const double axis2[3] = {0.9396926207859084, -0.3420201433256687, 0.0};
    const double rs2[9] = {46.38680654881815, 15.535747958507578, -15.611364884988392, -2.4101527524830315,
                           60.56580142303285, 16.818884079969493, 19.3855814119847, -6.586571883550854,
                           81.9741197216666};
    for (int i = 0; i < 3; ++i)
        nbgi_test_check(fabs(g.axis[i] - axis2[i]) < 1e-12, "compose-multi", "axis[%d] %.17g", i, g.axis[i]);
    check_vec(g.real_space, rs2, 9, "compose-multi", "real_space");

    /* older beams: s0 alone (along the travel, length 1/wavelength) and inline models */
    write_text(path, "{\"__id__\": \"ExperimentList\", \"experiment\": [{\"beam\": {\"s0\": [0, 0, -2]}, "
               "\"detector\": {\"panels\": [" PANEL(FAST) "]}}]}\n");
    rc = nbg_read_expt(ctx, path, &g);
    nbgi_test_check(rc == NBG_OK && g.wavelength == 0.5 && g.direction[2] == 1 && g.nframes == 1 &&
                        g.scan_width == 0,
                    "read-s0", "s0 beam, inline models, a still: %s", rc ? nbg_errmsg(ctx) : "ok");

    /* a scan-varying crystal (dials.refine's default for a scan): the static A is read, the per-image ones counted */
    write_list(path, EXPT_C, PANEL(FAST), GON,
               ",\n  \"crystal\": [{\"__id__\": \"crystal\", \"real_space_a\": [51.2, 3.1, -2.4], "
               "\"real_space_b\": [7.5, 62.3, 4.4], \"real_space_c\": [-6.1, 9.8, 83.7], \"A_at_scan_points\": "
               "[[1, 0, 0, 0, 1, 0, 0, 0, 1], [1, 0, 0, 0, 1, 0, 0, 0, 1], [1, 0, 0, 0, 1, 0, 0, 0, 1]]}]");
    rc = nbg_read_expt(ctx, path, &g);
    const double rs0[9] = {51.2, 3.1, -2.4, 7.5, 62.3, 4.4, -6.1, 9.8, 83.7};
    nbgi_test_check(rc == NBG_OK && g.crystal_scan_points == 3 && g.has_crystal, "read-scan-varying",
                    "the static A read, %d per-image A matrices counted: %s", g.crystal_scan_points,
                    rc ? nbg_errmsg(ctx) : "ok");
    check_vec(g.real_space, rs0, 9, "read-scan-varying", "real_space");
    write_list(path, EXPT_C, PANEL(FAST), GON, CRYSTAL);
    rc = nbg_read_expt(ctx, path, &g);
    nbgi_test_check(rc == NBG_OK && g.crystal_scan_points == 0, "read-static", "a static crystal: %d scan points",
                    g.crystal_scan_points);
}

/* out = M v (M row-major) */
static void mat_vec(const double M[9], const double v[3], double out[3])
{
    for (int i = 0; i < 3; ++i)
        out[i] = M[3 * i] * v[0] + M[3 * i + 1] * v[1] + M[3 * i + 2] * v[2];
}

/* The rotation matrix whose columns are f, s and f x s. */
static void frame_matrix(const double f[3], const double s[3], double M[9])
{
    const double n[3] = {f[1] * s[2] - f[2] * s[1], f[2] * s[0] - f[0] * s[2], f[0] * s[1] - f[1] * s[0]};
    for (int i = 0; i < 3; ++i) {
        M[3 * i] = f[i];
        M[3 * i + 1] = s[i];
        M[3 * i + 2] = n[i];
    }
}

/* A DIALS detector hierarchy (dxtbx writes each panel's and group's vectors in its parent's frame): a root group
 * turned by 30 deg about z and moved, a subgroup tilted by 10 deg holding panel 0, and panel 1 under the root.
 * Read as dxtbx places them (global = parent origin + parent axes x local), for both readers; and the lists a
 * hierarchy cannot be read from are refused by name. */
/* Panels that are pieces of one array in the image file (raw_image_offset, as dials.import writes for the Pilatus
 * 12M's rows and a Timepix quad's chips) and a detector whose panel 0 the beam does not reach (the 12M's first row
 * lies above the beam): each panel's raw offset as given, g's detector the first panel the beam meets inside, so
 * that the experiment can be set up; an offset that is not two integers >= 0 refused by name. */
static void test_raw_offsets(nbg_ctx *ctx, const char *dir)
{
    char path[600], panels[2048];
    snprintf(path, sizeof path, "%s/rawoff.expt", dir);
    /* panel 0 in the plane y = 10 (parallel to the beam), panel 1 at z = -100 beside the beam, panel 2 about it */
    snprintf(panels, sizeof panels,
             "{\"name\": \"r0\", \"fast_axis\": [1, 0, 0], \"slow_axis\": [0, 0, -1], \"origin\": [-5, 10, 0], "
             "\"pixel_size\": [0.1, 0.1], \"image_size\": [100, 120], \"raw_image_offset\": [0, 0]}, "
             "{\"name\": \"r1\", \"fast_axis\": [1, 0, 0], \"slow_axis\": [0, -1, 0], \"origin\": [50, 5, -100], "
             "\"pixel_size\": [0.1, 0.1], \"image_size\": [100, 120], \"raw_image_offset\": [0, 130]}, "
             "{\"name\": \"r2\", \"fast_axis\": [1, 0, 0], \"slow_axis\": [0, -1, 0], \"origin\": [-5, 5, -100], "
             "\"pixel_size\": [0.1, 0.1], \"image_size\": [100, 120], \"raw_image_offset\": [7, 260]}");
    write_list(path, EXPT("0"), panels, GON, "");
    nbg_geometry g;
    nbg_panel *pp = NULL;
    int np = 0;
    int rc = nbg_read_expt_panels(ctx, path, &g, &pp, &np);
    nbgi_test_check(rc == NBG_OK && np == 3 && pp[0].raw_offset[0] == 0 && pp[0].raw_offset[1] == 0 &&
                    pp[1].raw_offset[0] == 0 && pp[1].raw_offset[1] == 130 && pp[2].raw_offset[0] == 7 &&
                    pp[2].raw_offset[1] == 260, "raw-offsets", "each panel's raw_image_offset (%s)",
                    rc ? nbg_errmsg(ctx) : "ok");
    nbg_experiment e;
    nbg_experiment_default(&e);
    const int rce = rc == NBG_OK ? nbg_experiment_from_geometry(ctx, &g, &e) : rc;
    nbgi_test_check(rc == NBG_OK && g.origin[0] == -5 && g.origin[1] == 5 && g.origin[2] == -100 && rce == NBG_OK,
                    "raw-offsets-base", "g's detector: the panel the beam meets (r2, origin %g %g %g), not panel 0 "
                    "whose plane it never meets (%s)", g.origin[0], g.origin[1], g.origin[2],
                    rce != NBG_OK ? nbg_errmsg(ctx) : "ok");
    free(pp);
    snprintf(panels, sizeof panels, "{\"fast_axis\": [1, 0, 0], \"slow_axis\": [0, -1, 0], \"origin\": [-5, 5, -100], "
             "\"pixel_size\": [0.1, 0.1], \"image_size\": [100, 120], \"raw_image_offset\": [0, 0]}, "
             "{\"fast_axis\": [1, 0, 0], \"slow_axis\": [0, -1, 0], \"origin\": [50, 5, -100], "
             "\"pixel_size\": [0.1, 0.1], \"image_size\": [100, 120], \"raw_image_offset\": [-1, 3]}");
    write_list(path, EXPT("0"), panels, GON, "");
    pp = NULL;
    rc = nbg_read_expt_panels(ctx, path, &g, &pp, &np);
    nbgi_test_check(rc == NBG_EFORMAT && pp == NULL && strstr(nbg_errmsg(ctx), "raw_image_offset") != NULL &&
                    strstr(nbg_errmsg(ctx), "panels[1]") != NULL, "raw-offsets-bad", "a negative offset: %s",
                    nbg_errmsg(ctx));
    free(pp);
}

/* A list's panels' raw offsets survive nbgrad: read, turned into an experiment of LAB panels, described and written
 * back (nbg_panels_from_report, nbg_write_expt_panels), the list read again gives every panel its offset, so that
 * a list nbgrad writes of a Pilatus 12M still cuts the original image; a negative offset is refused on writing. */
static void test_raw_offsets_written(nbg_ctx *ctx, const char *dir)
{
    char path[600], path2[600], panels[2048];
    snprintf(path, sizeof path, "%s/rawoff-in.expt", dir);
    snprintf(path2, sizeof path2, "%s/rawoff-out.expt", dir);
    static const int want[3][2] = {{0, 0}, {0, 130}, {7, 260}};
    snprintf(panels, sizeof panels,
             "{\"name\": \"r0\", \"fast_axis\": [1, 0, 0], \"slow_axis\": [0, -1, 0], \"origin\": [-15, 5, -100], "
             "\"pixel_size\": [0.1, 0.1], \"image_size\": [100, 120], \"raw_image_offset\": [%d, %d]}, "
             "{\"name\": \"r1\", \"fast_axis\": [1, 0, 0], \"slow_axis\": [0, -1, 0], \"origin\": [-5, -8, -100], "
             "\"pixel_size\": [0.1, 0.1], \"image_size\": [100, 120], \"raw_image_offset\": [%d, %d]}, "
             "{\"name\": \"r2\", \"fast_axis\": [1, 0, 0], \"slow_axis\": [0, -0.9, -0.43588989435406735], "
             "\"origin\": [-5, -21, -101], \"pixel_size\": [0.1, 0.1], \"image_size\": [100, 120], "
             "\"raw_image_offset\": [%d, %d]}", want[0][0], want[0][1], want[1][0], want[1][1], want[2][0],
             want[2][1]);
    write_list(path, EXPT_C, panels, GON, CRYSTAL);
    nbg_geometry g, g2;
    nbg_panel *pp = NULL, *back = NULL;
    int np = 0, nb = 0, ok = 0, same = 0;
    nbg_experiment e;
    nbg_experiment_default(&e);
    nbg_report r;
    nbg_panel out[3];
    if (nbg_read_expt_panels(ctx, path, &g, &pp, &np) == NBG_OK && np == 3 &&
        nbg_experiment_from_geometry(ctx, &g, &e) == NBG_OK) {
        e.panels = pp;
        e.npanels = np;
        e.panel_frame = NBG_PANELS_LAB;
        e.default_F = 1;
        ok = nbg_describe(ctx, &e, &r) == NBG_OK && nbg_geometry_from_report(ctx, &e, &r, 2, &g2) == NBG_OK &&
             nbg_panels_from_report(ctx, &e, &r, out, 3) == NBG_OK &&
             nbg_write_expt_panels(ctx, path2, &g2, out, 3, "img_#####.cbf") == NBG_OK &&
             nbg_read_expt_panels(ctx, path2, &g2, &back, &nb) == NBG_OK && nb == 3;
        for (int k = 0; ok && k < 3; ++k) {
            same += back[k].raw_offset[0] == want[k][0] && back[k].raw_offset[1] == want[k][1];
        }
    }
    nbgi_test_check(ok && same == 3, "raw-offsets-written", "a list read, described and written back keeps every "
                    "panel's raw_image_offset (%d of 3; %s)", same, ok ? "ok" : nbg_errmsg(ctx));
    /* the text itself (dxtbx reads the key as it is) */
    char *text = nbgi_test_read_file(path2, NULL);
    nbgi_test_check(text != NULL && strstr(text, "\"raw_image_offset\": [\n") != NULL &&
                        strstr(text, "260\n") != NULL,
                    "raw-offsets-text", "the written list states the offsets under raw_image_offset");
    free(text);
    /* a negative offset cannot be written (the readers refuse it) */
    if (ok) {
        out[1].raw_offset[0] = -3;
        const int rc = nbg_write_expt_panels(ctx, path2, &g2, out, 3, NULL);
        nbgi_test_check(rc == NBG_EINVAL && strstr(nbg_errmsg(ctx), "raw offset") != NULL &&
                            strstr(nbg_errmsg(ctx), "panel 1") != NULL,
                        "raw-offsets-write-bad", "a negative offset refused on writing: %s", nbg_errmsg(ctx));
    }
    free(pp);
    free(back);

    /* the image set's multi_panel option (dials.import multi_panel=True: dxtbx cuts the image into the list's
     * modules only with it) read and written back; without it, none stated */
    for (int mp = 0; mp < 2; ++mp) {
        char extra[512];
        snprintf(extra, sizeof extra, ",\n  \"imageset\": [{\"__id__\": \"ImageSequence\", \"template\": "
                 "\"/x/img_#####.cbf\", \"params\": {\"dynamic_shadowing\": \"Auto\", \"multi_panel\": %s}}]",
                 mp ? "true" : "false");
        write_list(path, "{\"beam\": 0, \"detector\": 0, \"goniometer\": 0, \"scan\": 0, \"imageset\": 0}",
                   PANEL(FAST), GON, extra);
        nbg_geometry gm, gm2;
        ok = nbg_read_expt(ctx, path, &gm) == NBG_OK && gm.multi_panel == mp &&
             nbg_write_expt(ctx, path2, &gm, "img_#####.cbf") == NBG_OK && nbg_read_expt(ctx, path2, &gm2) == NBG_OK;
        text = nbgi_test_read_file(path2, NULL);
        const int stated = text != NULL && strstr(text, "\"multi_panel\": true") != NULL;
        free(text);
        nbgi_test_check(ok && gm2.multi_panel == mp && stated == mp, mp ? "multi-panel-kept" : "multi-panel-none",
                        "the image set's multi_panel %s read (%d), written (%d) and read back (%d)",
                        mp ? "true" : "false", ok ? gm.multi_panel : -1, stated, ok ? gm2.multi_panel : -1);
    }
}

/* The largest |a - b| over n values relative to the largest |a| (vectors compared in their own units). */
static double vec_rel(const double *a, const double *b, int n)
{
    double m = 0, d = 0;
    for (int i = 0; i < n; ++i) {
        m = fmax(m, fabs(a[i]));
        d = fmax(d, fabs(a[i] - b[i]));
    }
    return m > 0 ? d / m : d;
}

/* A list in DIALS's frame whose beam dials.index tilted 2 deg off -z (the thaumatin still's 1.99 deg): read, turned
 * into an experiment (nbgrad's frame DIALS's), described and written back, it keeps its beam, detector (a panel and
 * panels), rotation axis and crystal (A matrix) as they are, to 1e-12 -- not turned so that the beam runs along -z
 * -- and its mosaic domains render the same image.  An experiment of the MOSFLM convention is still written with
 * its beam along -z. */
static void test_tilted_frame(nbg_ctx *ctx, const char *dir)
{
    const double t = 2 * M_PI / 180;
    const double dir0[3] = {sin(t), 0.0, cos(t)}; /* sample to source */
    const double ax_n = sqrt(1 + 0.03 * 0.03);
    char path[600], path2[600], path3[600], text[8192];
    snprintf(path, sizeof path, "%s/tilted.expt", dir);
    snprintf(path2, sizeof path2, "%s/tilted-out.expt", dir);
    snprintf(path3, sizeof path3, "%s/tilted-out2.expt", dir);
    snprintf(text, sizeof text,
             "{\"__id__\": \"ExperimentList\", \"experiment\": [" EXPT_C "],\n"
             " \"beam\": [{\"direction\": [%.17g, 0, %.17g], \"wavelength\": 0.9795}],\n"
             " \"detector\": [{\"panels\": [{\"fast_axis\": [0.99862953475457383, 0, 0.052335956242943835], "
             "\"slow_axis\": [0, -1, 0], \"origin\": [-33.3, 31.7, -120.4], \"pixel_size\": [1, 1], "
             "\"image_size\": [64, 64]}]}],\n"
             " \"goniometer\": [{\"rotation_axis\": [%.17g, %.17g, 0]}],\n"
             " \"scan\": [{\"image_range\": [1, 1], \"oscillation\": [3, 0.5], \"exposure_time\": [1]}]" CRYSTAL "\n}\n",
             dir0[0], dir0[2], 1 / ax_n, 0.03 / ax_n);
    write_text(path, text);
    nbg_geometry a, b, c;
    nbg_experiment e, e2;
    nbg_report r;
    nbg_experiment_default(&e);
    int ok = nbg_read_expt(ctx, path, &a) == NBG_OK && nbg_experiment_from_geometry(ctx, &a, &e) == NBG_OK;
    if (ok) {
        e.default_F = 100;
        e.Na = e.Nb = e.Nc = 6;
        e.oversample = 1;
        e.phisteps = 2;
        e.mosaic = 0.5;
        e.mosaic_domains = 6;
    }
    ok = ok && e.dials_frame == 1 && nbg_describe(ctx, &e, &r) == NBG_OK &&
         nbg_geometry_from_report(ctx, &e, &r, 1, &b) == NBG_OK && nbg_write_expt(ctx, path2, &b, NULL) == NBG_OK &&
         nbg_read_expt(ctx, path2, &c) == NBG_OK;
    if (!nbgi_test_check(ok, "tilted-round-trip", "the list read, described and written back (%s)",
                         ok ? "ok" : nbg_errmsg(ctx)))
        return;
    const double dbeam = vec_rel(a.direction, c.direction, 3), dfast = vec_rel(a.fast, c.fast, 3);
    const double dslow = vec_rel(a.slow, c.slow, 3), dorg = vec_rel(a.origin, c.origin, 3);
    const double daxis = vec_rel(a.axis, c.axis, 3), dA = vec_rel(a.real_space, c.real_space, 9);
    printf("# tilted: largest differences after the round trip (relative to each vector's largest component): beam "
           "%.2g, fast %.2g, slow %.2g, origin %.2g, axis %.2g, real-space vectors %.2g\n", dbeam, dfast, dslow, dorg,
           daxis, dA);
    nbgi_test_check(dbeam <= 1e-12 && acos(c.direction[2]) * 180 / M_PI > 1.99, "tilted-beam",
                    "the beam 2 deg off -z kept: (%.15f, %.15f, %.15f), difference %.2g", c.direction[0],
                    c.direction[1], c.direction[2], dbeam);
    nbgi_test_check(dfast <= 1e-12 && dslow <= 1e-12 && dorg <= 1e-12, "tilted-detector",
                    "the detector's fast, slow and origin kept (differences %.2g, %.2g, %.2g)", dfast, dslow, dorg);
    nbgi_test_check(daxis <= 1e-12, "tilted-axis", "the rotation axis kept (difference %.2g)", daxis);
    nbgi_test_check(dA <= 1e-12, "tilted-crystal", "the crystal's real-space vectors (its A matrix) kept "
                    "(difference %.2g)", dA);
    nbgi_test_rel(c.scan_start, a.scan_start, 1e-15, "tilted-scan", "the scan's start");
    /* the mosaic domains: the list written carries them, and renders the same image as the experiment */
    nbg_experiment_default(&e2);
    const size_t npix = 64 * 64;
    float *f1 = malloc(npix * sizeof *f1), *f2 = malloc(npix * sizeof *f2);
    double d = INFINITY;
    if (f1 != NULL && f2 != NULL && c.has_mosaic && nbg_experiment_from_geometry(ctx, &c, &e2) == NBG_OK) {
        e2.default_F = 100;
        e2.Na = e2.Nb = e2.Nc = 6;
        e2.oversample = 1;
        e2.phisteps = 2;
        if (nbg_simulate(ctx, &e, f1, npix, NULL) == NBG_OK && nbg_simulate(ctx, &e2, f2, npix, NULL) == NBG_OK)
            d = nbgi_test_max_rel_diff(f1, f2, npix);
    }
    nbgi_test_check(d <= 1e-9, "tilted-mosaic", "the experiment and the list it wrote (6 mosaic domains) render the "
                    "same image: max |diff| / max %.3g", d);
    /* written again from the list's experiment: the domains' frame and the vectors as they were */
    nbg_geometry b2, c2;
    ok = nbg_describe(ctx, &e2, &r) == NBG_OK && nbg_geometry_from_report(ctx, &e2, &r, 1, &b2) == NBG_OK &&
         nbg_write_expt(ctx, path3, &b2, NULL) == NBG_OK && nbg_read_expt(ctx, path3, &c2) == NBG_OK;
    nbgi_test_check(ok && vec_rel(c.mosaic_frame, c2.mosaic_frame, 9) <= 1e-12 &&
                        vec_rel(c.real_space, c2.real_space, 9) <= 1e-12 && vec_rel(c.direction, c2.direction, 3) <= 1e-12,
                    "tilted-again", "written a second time: the same domains' frame, crystal and beam (%s)",
                    ok ? "ok" : nbg_errmsg(ctx));
    free(f1);
    free(f2);

    /* panels: the same list with two panels, every panel's vectors kept */
    snprintf(text, sizeof text,
             "{\"__id__\": \"ExperimentList\", \"experiment\": [" EXPT_C "],\n"
             " \"beam\": [{\"direction\": [%.17g, 0, %.17g], \"wavelength\": 0.9795}],\n"
             " \"detector\": [{\"panels\": [{\"name\": \"p0\", \"fast_axis\": [1, 0, 0], \"slow_axis\": [0, -1, 0], "
             "\"origin\": [-33.3, 31.7, -120.4], \"pixel_size\": [1, 1], \"image_size\": [64, 30]}, "
             "{\"name\": \"p1\", \"fast_axis\": [0.99862953475457383, 0, 0.052335956242943835], "
             "\"slow_axis\": [0, -1, 0], \"origin\": [-33.3, -0.3, -121.1], \"pixel_size\": [1, 1], "
             "\"image_size\": [64, 30]}]}],\n"
             " \"goniometer\": [{\"rotation_axis\": [1, 0, 0]}],\n"
             " \"scan\": [{\"image_range\": [1, 1], \"oscillation\": [3, 0.5], \"exposure_time\": [1]}]" CRYSTAL "\n}\n",
             dir0[0], dir0[2]);
    write_text(path, text);
    nbg_panel *pp = NULL, *back = NULL, out[2];
    int np = 0, nb = 0;
    double dp = INFINITY;
    nbg_experiment_default(&e);
    ok = nbg_read_expt_panels(ctx, path, &a, &pp, &np) == NBG_OK && np == 2 &&
         nbg_experiment_from_geometry(ctx, &a, &e) == NBG_OK;
    if (ok) {
        e.panels = pp;
        e.npanels = np;
        e.panel_frame = NBG_PANELS_LAB;
        e.default_F = 1;
        ok = nbg_describe(ctx, &e, &r) == NBG_OK && nbg_geometry_from_report(ctx, &e, &r, 1, &b) == NBG_OK &&
             nbg_panels_from_report(ctx, &e, &r, out, 2) == NBG_OK &&
             nbg_write_expt_panels(ctx, path2, &b, out, 2, NULL) == NBG_OK &&
             nbg_read_expt_panels(ctx, path2, &c, &back, &nb) == NBG_OK && nb == 2;
        for (int k = 0; ok && k < 2; ++k) {
            dp = k == 0 ? 0 : dp;
            dp = fmax(dp, fmax(vec_rel(pp[k].fast, back[k].fast, 3), vec_rel(pp[k].slow, back[k].slow, 3)));
            dp = fmax(dp, vec_rel(pp[k].origin, back[k].origin, 3));
        }
    }
    nbgi_test_check(ok && dp <= 1e-12 && vec_rel(a.direction, c.direction, 3) <= 1e-12, "tilted-panels",
                    "two panels and the tilted beam written back as they were (largest difference %.2g; %s)", dp,
                    ok ? "ok" : nbg_errmsg(ctx));
    free(pp);
    free(back);

    /* nanoBragg's conventions are still turned: MOSFLM's beam (along +x in its frame) is written along -z */
    nbg_experiment m;
    nbg_experiment_default(&m);
    m.has_cell = 1;
    m.cell[0] = 50;
    m.default_F = 1;
    m.fpixels = m.spixels = 16;
    ok = nbg_describe(ctx, &m, &r) == NBG_OK && nbg_geometry_from_report(ctx, &m, &r, 1, &b) == NBG_OK;
    nbgi_test_check(ok && m.dials_frame == 0 && b.direction[0] == 0 && b.direction[1] == 0 && b.direction[2] == 1,
                    "tilted-mosflm-turned", "a MOSFLM experiment's list has the beam along -z: direction (%g, %g, %g)",
                    b.direction[0], b.direction[1], b.direction[2]);
}

/* The right-handed rotation about unit(u) by deg (row-major), written out here apart from the library's. */
static void axis_angle(const double u0[3], double deg, double m[9])
{
    const double n = sqrt(u0[0] * u0[0] + u0[1] * u0[1] + u0[2] * u0[2]);
    const double u[3] = {u0[0] / n, u0[1] / n, u0[2] / n}, t = deg * M_PI / 180;
    const double K[9] = {0, -u[2], u[1], u[2], 0, -u[0], -u[1], u[0], 0};
    for (int i = 0; i < 3; ++i)
        for (int j = 0; j < 3; ++j) {
            double k2 = 0;
            for (int l = 0; l < 3; ++l) k2 += K[3 * i + l] * K[3 * l + j];
            m[3 * i + j] = (i == j) + sin(t) * K[3 * i + j] + (1 - cos(t)) * k2;
        }
}

static void mat_mul(const double a[9], const double b[9], double out[9])
{
    double t[9] = {0};
    for (int i = 0; i < 3; ++i)
        for (int j = 0; j < 3; ++j)
            for (int l = 0; l < 3; ++l) t[3 * i + j] += a[3 * i + l] * b[3 * l + j];
    memcpy(out, t, sizeof t);
}

/* 1 when the goniometers' axes, angles, names and scan axis are the same bit for bit */
static int same_goniometer(const nbg_goniometer *a, const nbg_goniometer *b, int skip_scan_axis_vector)
{
    if (a->naxes != b->naxes || a->scan_axis != b->scan_axis)
        return 0;
    for (int i = 0; i < a->naxes; ++i) {
        if ((!(skip_scan_axis_vector && i == a->scan_axis) && memcmp(a->axes[i], b->axes[i], sizeof a->axes[i]) != 0) ||
            a->angles[i] != b->angles[i] || strcmp(a->names[i], b->names[i]) != 0)
            return 0;
    }
    return 1;
}

/* A kappa-like multi-axis goniometer (dxtbx's MultiAxisGoniometer: phi, kappa, omega, non-zero angles) read, kept
 * whole and written back as one: its axes, angles, names and scan axis the same, its fold (axis, F, S) as dxtbx
 * defines it, the crystal written in the goniometer's frame (the list's own vectors), an image from the written list
 * the same bit for bit; described and written (the program's path), a tilted spindle turning the scan axis alone;
 * malformed goniometers refused naming the field. */
static void test_multi_axis(nbg_ctx *ctx, const char *dir)
{
    static const double ax[3][3] = {{1, 0, 0}, {0.64278761, -0.76604444, 0}, {0.99999, 0.002, -0.001}};
    static const double ang[3] = {30, -40, 12.5};
    static const char *const nm[3] = {"PHI", "KAPPA", "OMEGA"};
    const double rs_list[9] = {51.2, 3.1, -2.4, 7.5, 62.3, 4.4, -6.1, 9.8, 83.7};
    char path[600], path2[600], path3[600];
    snprintf(path, sizeof path, "%s/multi.expt", dir);
    snprintf(path2, sizeof path2, "%s/multi-out.expt", dir);
    snprintf(path3, sizeof path3, "%s/multi-described.expt", dir);
    for (int k = 1; k <= 2; ++k) {
        char gon[600], id[64];
        snprintf(gon, sizeof gon, "{\"axes\": [[1, 0, 0], [0.64278761, -0.76604444, 0], [0.99999, 0.002, -0.001]], "
                 "\"angles\": [30, -40, 12.5], \"names\": [\"PHI\", \"KAPPA\", \"OMEGA\"], \"scan_axis\": %d}", k);
        write_list(path, EXPT_C, PANEL(FAST), gon, CRYSTAL);
        nbg_geometry a, b;
        int rc = nbg_read_expt(ctx, path, &a);
        snprintf(id, sizeof id, "multi-read-scan%d", k);
        if (!nbgi_test_check(rc == NBG_OK, id, "a 3-axis goniometer, scan axis %d: %s", k, rc ? nbg_errmsg(ctx) : "ok"))
            continue;
        const nbg_goniometer *gn = &a.goniometer;
        int kept = gn->naxes == 3 && gn->scan_axis == k;
        for (int i = 0; kept && i < 3; ++i)
            kept = memcmp(gn->axes[i], ax[i], sizeof ax[i]) == 0 && gn->angles[i] == ang[i] &&
                   strcmp(gn->names[i], nm[i]) == 0;
        snprintf(id, sizeof id, "multi-kept-scan%d", k);
        nbgi_test_check(kept, id, "axes, angles, names and scan axis kept as the list gives them (naxes %d, scan axis "
                        "%d)", gn->naxes, gn->scan_axis);
        /* dxtbx's fold: F = R(k-1) ... R(0), S = R(2) ... R(k+1), axis S unit(axes[k]), crystal S F a */
        double F[9] = {1, 0, 0, 0, 1, 0, 0, 0, 1}, S[9] = {1, 0, 0, 0, 1, 0, 0, 0, 1}, m[9], SF[9], axis[3], rs[9];
        for (int i = 0; i < 3; ++i) {
            if (i == k) continue;
            axis_angle(ax[i], ang[i], m);
            mat_mul(m, i < k ? F : S, i < k ? F : S);
        }
        const double na = sqrt(ax[k][0] * ax[k][0] + ax[k][1] * ax[k][1] + ax[k][2] * ax[k][2]);
        const double uk[3] = {ax[k][0] / na, ax[k][1] / na, ax[k][2] / na};
        mat_vec(S, uk, axis);
        mat_mul(S, F, SF);
        for (int i = 0; i < 3; ++i) mat_vec(SF, rs_list + 3 * i, rs + 3 * i);
        snprintf(id, sizeof id, "multi-fold-scan%d", k);
        check_vec(gn->fixed, F, 9, id, "fixed_rotation");
        check_vec(gn->setting, S, 9, id, "setting_rotation");
        check_vec(a.axis, axis, 3, id, "axis");
        check_vec(a.real_space, rs, 9, id, "real_space");
        double off = 0;
        for (int i = 0; i < 9; ++i) off = fmax(off, fabs((k == 1 ? S : F)[i] - (i % 4 == 0)));
        nbgi_test_check(off > 0.1 && fabs(F[0] - 1) + fabs(F[4] - 1) > 0.1, id, "F and, for scan axis 1, S are not the "
                        "identity (S or F - I up to %.3g)", off);

        /* written back as it was read */
        rc = nbg_write_expt(ctx, path2, &a, NULL);
        char *text = nbgi_test_read_file(path2, NULL);
        snprintf(id, sizeof id, "multi-write-scan%d", k);
        char want[64];
        snprintf(want, sizeof want, "\"scan_axis\": %d", k);
        nbgi_test_check(rc == NBG_OK && text != NULL && strstr(text, "\"axes\": [") != NULL &&
                            strstr(text, "\"KAPPA\"") != NULL && strstr(text, want) != NULL &&
                            strstr(text, "rotation_axis") == NULL,
                        id, "written as a MultiAxisGoniometer (axes, names, %s, no rotation_axis): %s", want,
                        rc ? nbg_errmsg(ctx) : "ok");
        free(text);
        rc = rc == NBG_OK ? nbg_read_expt(ctx, path2, &b) : rc;
        snprintf(id, sizeof id, "multi-reread-scan%d", k);
        int same = rc == NBG_OK && same_goniometer(&a.goniometer, &b.goniometer, 0) &&
                   memcmp(a.goniometer.crystal, b.goniometer.crystal, sizeof a.goniometer.crystal) == 0 &&
                   memcmp(a.goniometer.crystal, rs_list, sizeof rs_list) == 0 &&
                   memcmp(a.real_space, b.real_space, sizeof a.real_space) == 0 &&
                   memcmp(a.axis, b.axis, sizeof a.axis) == 0;
        nbgi_test_check(same, id, "read back: the same axes, angles, names, scan axis, the list's crystal vectors and "
                        "the laboratory's axis and crystal bit for bit (%s)", rc ? nbg_errmsg(ctx) : "ok");
        check_vec(b.goniometer.fixed, F, 9, id, "fixed_rotation");
        check_vec(b.goniometer.setting, S, 9, id, "setting_rotation");
        check_vec(b.axis, axis, 3, id, "axis");

        /* a scan-varying crystal written under the goniometer (refine -scan_varying -exptfile): its points in the
         * goniometer's frame as the static crystal, so that the reader's fold gives the laboratory's points back */
        {
            const int np = a.nframes + 1;
            double *pts = malloc(sizeof(double) * 9 * (size_t)np), *got = NULL;
            int ngot = 0;
            for (int q = 0; pts != NULL && q < np; ++q) {
                double r[9];
                axis_angle(a.axis, 0.05 * (q + 1), r); /* a small turn per point */
                for (int i = 0; i < 3; ++i) mat_vec(r, a.real_space + 3 * i, pts + 9 * q + 3 * i);
            }
            nbg_geometry c = a;
            c.scan_real_space = pts;
            rc = pts != NULL ? nbg_write_expt(ctx, path2, &c, NULL) : NBG_ENOMEM;
            rc = rc == NBG_OK ? nbg_read_expt_scan_crystal(ctx, path2, &got, &ngot) : rc;
            double worst = rc == NBG_OK && ngot == np ? 0 : INFINITY;
            for (int q = 0; q < 9 * np && isfinite(worst); ++q) worst = fmax(worst, fabs(got[q] - pts[q]));
            snprintf(id, sizeof id, "multi-scanpoints-scan%d", k);
            nbgi_test_check(worst < 1e-10, id, "%d scan points written under the goniometer read back to %.2g A (%s)",
                            np, worst, rc ? nbg_errmsg(ctx) : "ok");
            free(pts);
            free(got);
        }

        /* the image of each list: the same bit for bit (and not blank) */
        nbg_experiment e1, e2;
        nbg_experiment_default(&e1);
        nbg_experiment_default(&e2);
        const size_t npix = 100 * 120;
        float *f1 = malloc(npix * sizeof *f1), *f2 = malloc(npix * sizeof *f2);
        int ok = f1 != NULL && f2 != NULL && rc == NBG_OK && nbg_experiment_from_geometry(ctx, &a, &e1) == NBG_OK &&
                 nbg_experiment_from_geometry(ctx, &b, &e2) == NBG_OK;
        nbg_experiment *es[2] = {&e1, &e2};
        for (int j = 0; ok && j < 2; ++j) {
            es[j]->default_F = 100;
            es[j]->Na = es[j]->Nb = es[j]->Nc = 5;
            es[j]->oversample = 1;
            es[j]->phisteps = 2;
            es[j]->lambda = 0.3; /* many spots on the small detector */
        }
        ok = ok && nbg_simulate(ctx, &e1, f1, npix, NULL) == NBG_OK && nbg_simulate(ctx, &e2, f2, npix, NULL) == NBG_OK;
        double peak = 0;
        for (size_t p = 0; ok && p < npix; ++p) peak = fmax(peak, f1[p]);
        snprintf(id, sizeof id, "multi-image-scan%d", k);
        nbgi_test_check(ok && peak > 0 && memcmp(f1, f2, npix * sizeof *f1) == 0, id, "the image of the list written "
                        "back is the input's bit for bit (peak %.4g photons; %s)", peak, ok ? "ok" : nbg_errmsg(ctx));

        /* the program's path: the experiment described and written; then the spindle tilted as refine tilts it */
        nbg_report r;
        nbg_geometry c, d;
        ok = ok && nbg_describe(ctx, &e1, &r) == NBG_OK && nbg_geometry_from_report(ctx, &e1, &r, 2, &c) == NBG_OK &&
             nbg_write_expt(ctx, path3, &c, NULL) == NBG_OK && nbg_read_expt(ctx, path3, &d) == NBG_OK;
        snprintf(id, sizeof id, "multi-described-scan%d", k);
        nbgi_test_check(ok && same_goniometer(&a.goniometer, &d.goniometer, 0) &&
                            vec_rel(d.goniometer.crystal, rs_list, 9) <= 1e-12 &&
                            vec_rel(d.real_space, a.real_space, 9) <= 1e-12 && vec_rel(d.axis, a.axis, 3) <= 1e-12,
                        id, "described and written back: the same goniometer, its crystal in the goniometer's frame "
                        "(difference %.2g) (%s)", ok ? vec_rel(d.goniometer.crystal, rs_list, 9) : -1.0,
                        ok ? "ok" : nbg_errmsg(ctx));
        e1.spindle_tilt[0] = 0.7, e1.spindle_tilt[1] = -0.4;
        ok = ok && nbg_describe(ctx, &e1, &r) == NBG_OK && nbg_geometry_from_report(ctx, &e1, &r, 2, &c) == NBG_OK &&
             nbg_write_expt(ctx, path3, &c, NULL) == NBG_OK && nbg_read_expt(ctx, path3, &d) == NBG_OK;
        snprintf(id, sizeof id, "multi-tilted-scan%d", k);
        const double *ek = d.goniometer.axes[k];
        const double moved = ok ? vec_rel(d.axis, a.axis, 3) : 0;
        const double len = sqrt(ek[0] * ek[0] + ek[1] * ek[1] + ek[2] * ek[2]);
        nbgi_test_check(ok && same_goniometer(&a.goniometer, &d.goniometer, 1) &&
                            vec_rel(d.axis, r.spindle, 3) <= 1e-12 && moved > 1e-3 && fabs(len - 1) < 1e-15 &&
                            vec_rel(d.goniometer.fixed, F, 9) <= 1e-12 && vec_rel(d.goniometer.setting, S, 9) <= 1e-12 &&
                            vec_rel(d.real_space, c.real_space, 9) <= 1e-12,
                        id, "a tilted spindle (moved %.3g) written as the scan axis S^T axis (unit, length - 1 = %.2g): "
                        "the other axes, angles, names, F and S kept, the laboratory's axis and crystal read back (%s)",
                        moved, len - 1, ok ? "ok" : nbg_errmsg(ctx));
        free(f1);
        free(f2);
    }

    /* malformed goniometers in a list: refused naming the field */
    const struct {
        const char *id, *gon, *n1, *n2;
    } badl[] = {
        {"multi-bad-nonunit", "{\"axes\": [[1, 0, 0], [2, 0, 0]], \"angles\": [0, 1], \"scan_axis\": 0}",
         "goniometer[0].axes[1]", "not a unit vector"},
        {"multi-bad-zero", "{\"axes\": [[1, 0, 0], [0, 0, 0]], \"angles\": [0, 1], \"scan_axis\": 0}",
         "goniometer[0].axes[1]", "not a unit vector"},
        {"multi-bad-axis3", "{\"axes\": [[1, 0, 0], [0, 1]], \"angles\": [0, 1], \"scan_axis\": 0}",
         "goniometer[0].axes[1]", "expected 3 numbers"},
        {"multi-bad-names", "{\"axes\": [[1, 0, 0], [0, 1, 0]], \"angles\": [0, 1], \"names\": [\"a\"], "
         "\"scan_axis\": 0}", "goniometer[0].names", "expected 2 names"},
        {"multi-bad-name", "{\"axes\": [[1, 0, 0], [0, 1, 0]], \"angles\": [0, 1], \"names\": [\"a\", 7], "
         "\"scan_axis\": 0}", "goniometer[0].names[1]", "expected a string"},
        {"multi-bad-longname", "{\"axes\": [[1, 0, 0], [0, 1, 0]], \"angles\": [0, 1], \"names\": [\"a\", "
         "\"0123456789012345678901234567890123456789\"], \"scan_axis\": 0}", "goniometer[0].names[1]", "longer"},
        {"multi-bad-angles", "{\"axes\": [[1, 0, 0], [0, 1, 0]], \"angles\": [0, 1, 2], \"scan_axis\": 0}",
         "goniometer[0].angles", "expected 2 numbers"},
        {"multi-bad-angle", "{\"axes\": [[1, 0, 0], [0, 1, 0]], \"angles\": [0, 1e300], \"scan_axis\": 0}",
         "goniometer[0].angles[1]", "not a usable angle"},
        {"multi-bad-scanaxis", "{\"axes\": [[1, 0, 0], [0, 1, 0]], \"angles\": [0, 1], \"scan_axis\": 2}",
         "goniometer[0].scan_axis", "from 0 to 1"},
        {"multi-bad-many", "{\"axes\": [[1,0,0],[1,0,0],[1,0,0],[1,0,0],[1,0,0],[1,0,0],[1,0,0],[1,0,0],[1,0,0],"
         "[1,0,0],[1,0,0],[1,0,0],[1,0,0],[1,0,0],[1,0,0],[1,0,0],[1,0,0]], \"angles\": [0], \"scan_axis\": 0}",
         "goniometer[0].axes", "1 to 16 axes"},
    };
    for (size_t i = 0; i < sizeof badl / sizeof badl[0]; ++i) {
        write_list(path, EXPT_C, PANEL(FAST), badl[i].gon, CRYSTAL);
        expect_error(ctx, path, NBG_EFORMAT, badl[i].id, badl[i].n1, badl[i].n2);
    }
    /* and in a geometry given to the writer (NaN has no JSON form: only the API can hold it) */
    write_list(path, EXPT_C, PANEL(FAST), "{\"axes\": [[1, 0, 0], [0, 1, 0], [0, 0, 1]], \"angles\": [10, 20, 30], "
               "\"scan_axis\": 1}", CRYSTAL);
    nbg_geometry g;
    if (nbg_read_expt(ctx, path, &g) == NBG_OK) {
        const struct {
            const char *id, *needle;
            int what;
        } badw[] = {{"multi-write-nan-axis", "goniometer.axes[2]", 0},
                    {"multi-write-nan-angle", "goniometer.angles[0]", 1},
                    {"multi-write-short-axis", "goniometer.axes[2]", 2},
                    {"multi-write-naxes", "goniometer.naxes", 3},
                    {"multi-write-scanaxis", "goniometer.scan_axis", 4}};
        for (size_t i = 0; i < sizeof badw / sizeof badw[0]; ++i) {
            nbg_geometry h = g;
            switch (badw[i].what) {
            case 0: h.goniometer.axes[2][1] = NAN; break;
            case 1: h.goniometer.angles[0] = NAN; break;
            case 2: h.goniometer.axes[2][2] = 0.5; break;
            case 3: h.goniometer.naxes = NBG_GONIO_MAX_AXES + 1; break;
            default: h.goniometer.scan_axis = 3; break;
            }
            const int rc = nbg_write_expt(ctx, path2, &h, NULL);
            nbgi_test_check(rc == NBG_EINVAL && strstr(nbg_errmsg(ctx), badw[i].needle) != NULL &&
                                strstr(nbg_errmsg(ctx), path2) != NULL,
                            badw[i].id, "refused naming %s: %s", badw[i].needle, nbg_errmsg(ctx));
        }
    } else {
        nbgi_test_check(0, "multi-write-bad", "the list for the writer's refusals: %s", nbg_errmsg(ctx));
    }
}

static void test_hierarchy(nbg_ctx *ctx, const char *dir)
{
    const double c30 = cos(30 * M_PI / 180), s30 = sin(30 * M_PI / 180);
    const double c10 = cos(10 * M_PI / 180), s10 = sin(10 * M_PI / 180);
    const double rf[3] = {c30, s30, 0}, rs[3] = {-s30, c30, 0}, ro[3] = {5, -3, -200};
    const double gf[3] = {1, 0, 0}, gs[3] = {0, c10, s10}, go[3] = {20, 0, 1};
    const double p0f[3] = {0, 1, 0}, p0s[3] = {-1, 0, 0}, p0o[3] = {-3, 4, 0.5};
    const double p1f[3] = {1, 0, 0}, p1s[3] = {0, -1, 0}, p1o[3] = {-40, 10, 0};
    char panels[2048], hier[2048], path[600];
#define V3(v) (v)[0], (v)[1], (v)[2]
    snprintf(panels, sizeof panels,
             "{\"name\": \"p0\", \"fast_axis\": [%.17g, %.17g, %.17g], \"slow_axis\": [%.17g, %.17g, %.17g], "
             "\"origin\": [%.17g, %.17g, %.17g], \"pixel_size\": [0.1, 0.1], \"image_size\": [100, 120]}, "
             "{\"name\": \"p1\", \"fast_axis\": [%.17g, %.17g, %.17g], \"slow_axis\": [%.17g, %.17g, %.17g], "
             "\"origin\": [%.17g, %.17g, %.17g], \"pixel_size\": [0.1, 0.1], \"image_size\": [100, 120]}",
             V3(p0f), V3(p0s), V3(p0o), V3(p1f), V3(p1s), V3(p1o));
    snprintf(hier, sizeof hier,
             "{\"name\": \"root\", \"fast_axis\": [%.17g, %.17g, %.17g], \"slow_axis\": [%.17g, %.17g, %.17g], "
             "\"origin\": [%.17g, %.17g, %.17g], \"children\": [{\"name\": \"g\", \"fast_axis\": [%.17g, %.17g, %.17g], "
             "\"slow_axis\": [%.17g, %.17g, %.17g], \"origin\": [%.17g, %.17g, %.17g], \"children\": [{\"panel\": 0}]}, "
             "{\"panel\": 1}]}",
             V3(rf), V3(rs), V3(ro), V3(gf), V3(gs), V3(go));
#undef V3
    /* the expected laboratory vectors: R_root (R_g local + o_g) + o_root for panel 0, R_root local + o_root for 1 */
    double Rr[9], Rg[9], Rrg[9];
    frame_matrix(rf, rs, Rr);
    frame_matrix(gf, gs, Rg);
    for (int i = 0; i < 3; ++i)
        for (int j = 0; j < 3; ++j)
            Rrg[3 * i + j] = Rr[3 * i] * Rg[j] + Rr[3 * i + 1] * Rg[3 + j] + Rr[3 * i + 2] * Rg[6 + j];
    double want[2][3][3], t[3], u[3];
    mat_vec(Rrg, p0f, want[0][0]);
    mat_vec(Rrg, p0s, want[0][1]);
    mat_vec(Rrg, p0o, t);
    mat_vec(Rr, go, u);
    for (int i = 0; i < 3; ++i)
        want[0][2][i] = t[i] + u[i] + ro[i];
    mat_vec(Rr, p1f, want[1][0]);
    mat_vec(Rr, p1s, want[1][1]);
    mat_vec(Rr, p1o, t);
    for (int i = 0; i < 3; ++i)
        want[1][2][i] = t[i] + ro[i];

    snprintf(path, sizeof path, "%s/hier.expt", dir);
    {
        char text[8192];
        snprintf(text, sizeof text,
                 "{\"__id__\": \"ExperimentList\", \"experiment\": [" EXPT("0") "],\n"
                 "  \"beam\": [{\"direction\": [0, 0, 1], \"wavelength\": 1.0}],\n"
                 "  \"detector\": [{\"panels\": [%s], \"hierarchy\": %s}],\n"
                 "  \"goniometer\": [" GON "],\n"
                 "  \"scan\": [{\"image_range\": [1, 2], \"oscillation\": [0, 0.1], \"exposure_time\": [1, 1]}]}\n",
                 panels, hier);
        write_text(path, text);
    }
    nbg_geometry g;
    nbg_panel *pp = NULL;
    int np = 0;
    int rc = nbg_read_expt_panels(ctx, path, &g, &pp, &np);
    nbgi_test_check(rc == NBG_OK && np == 2, "hier-read", "two panels under a turned root and a tilted group: %s",
                    rc == NBG_OK ? "read" : nbg_errmsg(ctx));
    nbgi_test_check(rc == NBG_OK && pp[0].group == 0 && pp[1].group == 1, "hier-groups", "panel 0's group is its "
                    "group (0), panel 1 under the root is alone (1): %d %d", rc == NBG_OK ? pp[0].group : -1,
                    rc == NBG_OK ? pp[1].group : -1);
    {
        /* as dials.import writes an NXmx detector: the root, a group for the detector that holds only groups, a
         * group per module with its panel: the modules are groups 0 and 1 (the detector's group has no number) */
        char text[8192], p2[600];
        const char *id = "\"fast_axis\": [1, 0, 0], \"slow_axis\": [0, 1, 0], \"origin\": [0, 0, 0]";
        snprintf(text, sizeof text,
                 "{\"__id__\": \"ExperimentList\", \"experiment\": [" EXPT("0") "],\n"
                 "  \"beam\": [{\"direction\": [0, 0, 1], \"wavelength\": 1.0}],\n"
                 "  \"detector\": [{\"panels\": [%s], \"hierarchy\": {%s, \"children\": [{%s, \"children\": "
                 "[{%s, \"children\": [{\"panel\": 1}]}, {%s, \"children\": [{\"panel\": 0}]}]}]}}],\n"
                 "  \"goniometer\": [" GON "],\n"
                 "  \"scan\": [{\"image_range\": [1, 2], \"oscillation\": [0, 0.1], \"exposure_time\": [1, 1]}]}\n",
                 panels, id, id, id, id);
        snprintf(p2, sizeof p2, "%s/hier2.expt", dir);
        write_text(p2, text);
        nbg_geometry g2;
        nbg_panel *q = NULL;
        int nq = 0;
        const int r2 = nbg_read_expt_panels(ctx, p2, &g2, &q, &nq);
        nbgi_test_check(r2 == NBG_OK && nq == 2 && q[1].group == 0 && q[0].group == 1, "hier-groups-nested",
                        "modules under a detector group: groups %d %d (1 0 expected: numbered in the hierarchy's "
                        "order)%s", r2 == NBG_OK ? q[0].group : -1, r2 == NBG_OK ? q[1].group : -1,
                        r2 == NBG_OK ? "" : nbg_errmsg(ctx));
        free(q);
    }
    {
        /* three levels, as a CSPAD's list: the detector, 2 quadrants, 2 sensors each, 2 panels each; the groups at
         * each level as DIALS's hierarchy_level counts them, and -panel_groups levelL through the builder */
        char pl[8][400], all[4000] = "", text[12000], p3[600];
        const char *id = "\"fast_axis\": [1, 0, 0], \"slow_axis\": [0, 1, 0], \"origin\": [0, 0, 0]";
        for (int k = 0; k < 8; ++k) {
            snprintf(pl[k], sizeof pl[k], "%s{\"name\": \"a%d\", \"fast_axis\": [1, 0, 0], \"slow_axis\": [0, -1, 0], "
                     "\"origin\": [%d, 5, -100], \"pixel_size\": [0.1, 0.1], \"image_size\": [20, 10]}",
                     k ? ", " : "", k, -40 + 10 * k);
            strcat(all, pl[k]);
        }
        char quads[2][2000];
        for (int qd = 0; qd < 2; ++qd) {
            char s0[600], s1[600];
            snprintf(s0, sizeof s0, "{%s, \"children\": [{\"panel\": %d}, {\"panel\": %d}]}", id, 4 * qd, 4 * qd + 1);
            snprintf(s1, sizeof s1, "{%s, \"children\": [{\"panel\": %d}, {\"panel\": %d}]}", id, 4 * qd + 2,
                     4 * qd + 3);
            snprintf(quads[qd], sizeof quads[qd], "{%s, \"children\": [%s, %s]}", id, s0, s1);
        }
        snprintf(text, sizeof text,
                 "{\"__id__\": \"ExperimentList\", \"experiment\": [" EXPT("0") "],\n"
                 "  \"beam\": [{\"direction\": [0, 0, 1], \"wavelength\": 1.0}],\n"
                 "  \"detector\": [{\"panels\": [%s], \"hierarchy\": {%s, \"children\": [%s, %s]}}],\n"
                 "  \"goniometer\": [" GON "],\n"
                 "  \"scan\": [{\"image_range\": [1, 2], \"oscillation\": [0, 0.1], \"exposure_time\": [1, 1]}]}\n",
                 all, id, quads[0], quads[1]);
        snprintf(p3, sizeof p3, "%s/hier3.expt", dir);
        write_text(p3, text);
        nbg_geometry g3;
        nbg_panel *q = NULL;
        int nq = 0;
        const int r3 = nbg_read_expt_panels(ctx, p3, &g3, &q, &nq);
        char got[4][40];
        int ok = r3 == NBG_OK && nq == 8;
        for (int l = 0; l < 4; ++l) {
            got[l][0] = 0;
            for (int k = 0; ok && k < 8; ++k) {
                const size_t len = strlen(got[l]);
                snprintf(got[l] + len, sizeof got[l] - len, "%d%s", q[k].level_group[l], k < 7 ? "," : "");
            }
        }
        ok = ok && strcmp(got[0], "0,0,0,0,0,0,0,0") == 0 && strcmp(got[1], "0,0,0,0,1,1,1,1") == 0 &&
             strcmp(got[2], "0,0,1,1,2,2,3,3") == 0 && strcmp(got[3], "-1,-1,-1,-1,-1,-1,-1,-1") == 0 &&
             q[5].group == 2;
        nbgi_test_check(ok, "hier-levels", "the groups at levels 0-3: %s | %s | %s | %s%s", got[0], got[1], got[2],
                        got[3], r3 == NBG_OK ? "" : nbg_errmsg(ctx));
        /* written back: the three levels as they were (each group in its first panel's frame relative to its
         * parent's), every panel in place; then the CSPAD layout, its quadrants and sensors */
        for (int lay = 0; lay < 2 && ok; ++lay) {
            nbg_panel cs[64];
            int ncs = 0;
            if (lay == 1) {
                double px;
                int fp, sp;
                ok = nbg_layout(ctx, "cspad", cs, 64, &ncs, &px, &fp, &sp) == NBG_OK && ncs == 64;
                for (int k = 0; ok && k < ncs; ++k) { /* placed in a lab frame: its plane 100 mm from the sample */
                    cs[k].origin[2] = -100;
                    cs[k].slow[1] = -cs[k].slow[1], cs[k].origin[1] = -cs[k].origin[1];
                }
            }
            const nbg_panel *src = lay ? cs : q;
            const int ns = lay ? ncs : nq;
            char pw[600];
            snprintf(pw, sizeof pw, "%s/hier3w%d.expt", dir, lay);
            nbg_geometry gw;
            nbg_panel *w = NULL;
            int nw = 0;
            int rw = ok ? nbg_write_expt_panels(ctx, pw, &g3, src, ns, NULL) : -1;
            rw = rw == NBG_OK ? nbg_read_expt_panels(ctx, pw, &gw, &w, &nw) : rw;
            double worst = rw == NBG_OK && nw == ns ? 0 : INFINITY;
            int same = worst == 0;
            for (int k = 0; same && k < ns; ++k) {
                for (int i = 0; i < 3; ++i) {
                    worst = fmax(worst, fabs(w[k].fast[i] - src[k].fast[i]));
                    worst = fmax(worst, fabs(w[k].slow[i] - src[k].slow[i]));
                    worst = fmax(worst, fabs(w[k].origin[i] - src[k].origin[i]));
                }
                /* the groups of levels 1 and 2 (a layout's level 3 is each panel alone: not written as a group) */
                for (int l = 0; l < 3; ++l) same &= w[k].level_group[l] == src[k].level_group[l];
            }
            size_t size = 0;
            char *txt = nbgi_test_read_file(pw, &size);
            const int nested = txt != NULL && strstr(txt, "\"level 2 group 1\"") != NULL;
            free(txt);
            free(w);
            nbgi_test_check(same && worst < 1e-12 && nested, lay ? "hier-write-cspad" : "hier-write-levels",
                            "%s written as a hierarchy of two group levels, read back with the same groups at each "
                            "level (%s) and every panel in place to %.2g mm%s", lay ? "the CSPAD layout's 64 panels"
                            : "the three-level list's 8 panels", same ? "yes" : "no", worst,
                            rw == NBG_OK ? "" : nbg_errmsg(ctx));
        }
        free(q);
        const char *lvl[4] = {"detector", "level1", "level2", "modules"};
        const int want_groups[4] = {1, 2, 4, 4};
        for (int lt = 0; lt < 4; ++lt) {
            nbg_builder *b = NULL;
            const char *argv[] = {"-expt", p3, "-panel_groups", lvl[lt], "-default_F", "1", "-N", "2"};
            int rb = nbg_builder_create(&b);
            rb = rb == NBG_OK ? nbg_builder_parse(ctx, b, 8, argv) : rb;
            rb = rb == NBG_OK ? nbg_builder_load(ctx, b) : rb;
            nbg_panel_motion *mo = NULL;
            const int ng = rb == NBG_OK ? nbg_builder_motions(b, &mo) : -1;
            char tid[48];
            snprintf(tid, sizeof tid, "hier-panel-groups-%s", lvl[lt]);
            nbgi_test_check(ng == want_groups[lt], tid, "-panel_groups %s: %d motion groups (%d expected)%s%s", lvl[lt],
                            ng, want_groups[lt], rb == NBG_OK ? "" : ": ", rb == NBG_OK ? "" : nbg_errmsg(ctx));
            nbg_builder_destroy(b);
        }
        nbg_builder *b = NULL;
        const char *argv[] = {"-expt", p3, "-panel_groups", "level3"};
        int rb = nbg_builder_create(&b);
        rb = rb == NBG_OK ? nbg_builder_parse(ctx, b, 4, argv) : rb;
        rb = rb == NBG_OK ? nbg_builder_load(ctx, b) : rb;
        nbgi_test_check(rb == NBG_EINVAL && strstr(nbg_errmsg(ctx), "no level 3") != NULL, "hier-panel-groups-too-deep",
                        "-panel_groups level3 on a list two levels deep: %s", nbg_errmsg(ctx));
        nbg_builder_destroy(b);
    }
    for (int k = 0; rc == NBG_OK && k < 2; ++k) {
        double worst = 0;
        for (int i = 0; i < 3; ++i) {
            worst = fmax(worst, fabs(pp[k].fast[i] - want[k][0][i]));
            worst = fmax(worst, fabs(pp[k].slow[i] - want[k][1][i]));
            worst = fmax(worst, fabs(pp[k].origin[i] - want[k][2][i]) / 200);
        }
        char id[32];
        snprintf(id, sizeof id, "hier-panel%d", k);
        nbgi_test_check(worst <= 1e-14, id, "in the laboratory where dxtbx puts it: worst difference %.3g (origin "
                        "%.6f %.6f %.6f mm)", worst, pp[k].origin[0], pp[k].origin[1], pp[k].origin[2]);
    }
    /* panel 0 of the one-panel reader sits in the same place (its group's frame applies too) */
    if (rc == NBG_OK) {
        double worst = 0;
        for (int i = 0; i < 3; ++i) {
            worst = fmax(worst, fabs(g.fast[i] - want[0][0][i]));
            worst = fmax(worst, fabs(g.origin[i] - want[0][2][i]) / 200);
        }
        nbgi_test_check(worst <= 1e-14, "hier-geometry", "the geometry's panel (panel 0): worst difference %.3g",
                        worst);
    }
    free(pp);

    /* hierarchies that place no panel, or one twice, or a panel that is not there, are refused by name */
    static const struct {
        const char *id, *children, *needle;
    } badh[] = {
        {"hier-missing", "[{\"panel\": 0}]", "panel 1 is in no group"},
        {"hier-twice", "[{\"panel\": 0}, {\"panel\": 1}, {\"panel\": 0}]", "twice"},
        {"hier-index", "[{\"panel\": 0}, {\"panel\": 2}]", "hierarchy.children[1].panel"},
        {"hier-group", "[{\"panel\": 0}, {\"panel\": 1}, {\"fast_axis\": [0, 0, 0], \"slow_axis\": [0, 1, 0], "
                       "\"origin\": [0, 0, 0]}]", "hierarchy.children[2].fast_axis"},
    };
    for (size_t b = 0; b < sizeof badh / sizeof badh[0]; ++b) {
        char text[8192];
        snprintf(text, sizeof text,
                 "{\"__id__\": \"ExperimentList\", \"experiment\": [" EXPT("0") "],\n"
                 "  \"beam\": [{\"direction\": [0, 0, 1], \"wavelength\": 1.0}],\n"
                 "  \"detector\": [{\"panels\": [%s], \"hierarchy\": {\"fast_axis\": [1, 0, 0], \"slow_axis\": [0, 1, 0],"
                 " \"origin\": [0, 0, 0], \"children\": %s}}],\n"
                 "  \"goniometer\": [" GON "],\n"
                 "  \"scan\": [{\"image_range\": [1, 2], \"oscillation\": [0, 0.1], \"exposure_time\": [1, 1]}]}\n",
                 panels, badh[b].children);
        write_text(path, text);
        pp = NULL;
        rc = nbg_read_expt_panels(ctx, path, &g, &pp, &np);
        nbgi_test_check(rc == NBG_EFORMAT && strstr(nbg_errmsg(ctx), badh[b].needle) != NULL &&
                        strstr(nbg_errmsg(ctx), path) != NULL, badh[b].id, "status %d: %s", rc, nbg_errmsg(ctx));
        free(pp);
    }
}

#endif /* NBG_HAVE_FORMATS */

/* Groups written as dxtbx writes a detector of modules (each group under the root in its first panel's frame, its
 * panels in that frame), read back to the same panels and groups; without a group of two panels, a flat list */
static void test_write_groups(nbg_ctx *ctx, const char *dir)
{
    nbg_geometry g;
    sample_geometry(&g);
    nbg_panel p[4];
    memset(p, 0, sizeof p);
    const double t = 12 * M_PI / 180;
    for (int k = 0; k < 4; ++k) {
        p[k].fpixels = 50 + k;
        p[k].spixels = 40;
        p[k].pixel = g.pixel_f;
        /* panels 2 and 3 tilted about the slow axis; every panel somewhere else on the plane z = -100..-110 */
        const double c = k >= 2 ? cos(t) : 1, sn = k >= 2 ? sin(t) : 0;
        const double f[3] = {c, 0, sn}, sl[3] = {0, -1, 0}, o[3] = {-30.0 + 12 * k, 20.0 - 3 * k, -100.0 - 3 * k};
        memcpy(p[k].fast, f, sizeof f);
        memcpy(p[k].slow, sl, sizeof sl);
        memcpy(p[k].origin, o, sizeof o);
        snprintf(p[k].name, sizeof p[k].name, "m%d", k);
    }
    for (int grouped = 1; grouped >= 0; --grouped) {
        for (int k = 0; k < 4; ++k) p[k].group = grouped ? k / 2 : k;
        char path[600];
        snprintf(path, sizeof path, "%s/groups%d.expt", dir, grouped);
        nbg_panel *back = NULL;
        int nb = 0;
        nbg_geometry gb;
        int ok = nbg_write_expt_panels(ctx, path, &g, p, 4, NULL) == NBG_OK &&
                 nbg_read_expt_panels(ctx, path, &gb, &back, &nb) == NBG_OK && nb == 4;
        double worst = 0;
        int groups_ok = 1;
        for (int k = 0; ok && k < 4; ++k) {
            for (int i = 0; i < 3; ++i) {
                worst = fmax(worst, fabs(back[k].fast[i] - p[k].fast[i]));
                worst = fmax(worst, fabs(back[k].slow[i] - p[k].slow[i]));
                worst = fmax(worst, fabs(back[k].origin[i] - p[k].origin[i]));
            }
            groups_ok &= back[k].group == p[k].group;
        }
        free(back);
        size_t size = 0;
        char *text = nbgi_test_read_file(path, &size);
        const int has_groups = text != NULL && strstr(text, "\"group 1\"") != NULL;
        free(text);
        nbgi_test_check(ok && worst < 1e-12 && groups_ok && has_groups == grouped,
                        grouped ? "expt-write-groups" : "expt-write-flat",
                        "%s: read back, every panel in place (largest difference %.2g) with its group (%s)%s",
                        grouped ? "two groups of two panels written as groups of the hierarchy"
                                : "four panels alone written under the root",
                        worst, groups_ok ? "yes" : "no", ok ? "" : nbg_errmsg(ctx));
    }
}

/* The real-space basis (rows a, b, c) of A = (a* b* c*) as columns, and back: each the other's inverse. */
static void inverse3(const double m[9], double out[9])
{
    const double det = m[0] * (m[4] * m[8] - m[5] * m[7]) - m[1] * (m[3] * m[8] - m[5] * m[6]) +
                       m[2] * (m[3] * m[7] - m[4] * m[6]);
    out[0] = (m[4] * m[8] - m[5] * m[7]) / det, out[1] = (m[2] * m[7] - m[1] * m[8]) / det;
    out[2] = (m[1] * m[5] - m[2] * m[4]) / det, out[3] = (m[5] * m[6] - m[3] * m[8]) / det;
    out[4] = (m[0] * m[8] - m[2] * m[6]) / det, out[5] = (m[2] * m[3] - m[0] * m[5]) / det;
    out[6] = (m[3] * m[7] - m[4] * m[6]) / det, out[7] = (m[1] * m[6] - m[0] * m[7]) / det;
    out[8] = (m[0] * m[4] - m[1] * m[3]) / det;
}

/* A scan-varying crystal (dials.refine's A_at_scan_points): the bases read at every scan point, each image's own
 * crystal through the builder (the mean of the A matrices at its start and end), the program's frames rendered with
 * it, refine's note, the refusals.  The crystal turns by 0.1 deg a scan point about y; the goniometer has a setting
 * rotation (90 deg about z), which the bases must carry as the static crystal's do. */
static void test_scan_varying(nbg_ctx *ctx, const char *dir)
{
    char path[512], text[8192], sv[4096] = "";
    snprintf(path, sizeof path, "%s/sv.expt", dir);
    const double R0[9] = {51.2, 3.1, -2.4, 7.5, 62.3, 4.4, -6.1, 9.8, 83.7};
    const double S[9] = {0, -1, 0, 1, 0, 0, 0, 0, 1};
    double want[5][9]; /* the lab bases: S applied to each row of point k's */
    for (int k = 0; k < 5; ++k) {
        const double t = k * 0.1 * M_PI / 180, Ry[9] = {cos(t), 0, sin(t), 0, 1, 0, -sin(t), 0, cos(t)};
        double Rk[9], A[9];
        for (int i = 0; i < 3; ++i) {
            mat_vec(Ry, R0 + 3 * i, Rk + 3 * i);
            mat_vec(S, Rk + 3 * i, want[k] + 3 * i);
        }
        inverse3(Rk, A);
        size_t at = strlen(sv);
        snprintf(sv + at, sizeof sv - at, "%s[", k ? ", " : "");
        for (int i = 0; i < 9; ++i) {
            at = strlen(sv);
            snprintf(sv + at, sizeof sv - at, "%.17g%s", A[i], i < 8 ? ", " : "]");
        }
    }
    const char *head = "{\n  \"__id__\": \"ExperimentList\",\n  \"experiment\": [" EXPT_C "],\n"
                       "  \"beam\": [{\"direction\": [0, 0, 1], \"wavelength\": 1.0}],\n"
                       "  \"detector\": [{\"panels\": [{\"fast_axis\": [1, 0, 0], \"slow_axis\": [0, -1, 0], "
                       "\"origin\": [-6.4, 6.4, -80], \"pixel_size\": [0.1, 0.1], \"image_size\": [128, 128]}]}],\n"
                       "  \"goniometer\": [{\"rotation_axis\": [1, 0, 0], \"setting_rotation\": [0, -1, 0, 1, 0, 0, "
                       "0, 0, 1]}],\n"
                       "  \"scan\": [{\"image_range\": [1, 4], \"oscillation\": [0, 0.5], "
                       "\"exposure_time\": [1, 1, 1, 1]}],\n"
                       "  \"crystal\": [{\"__id__\": \"crystal\", \"real_space_a\": [51.2, 3.1, -2.4], "
                       "\"real_space_b\": [7.5, 62.3, 4.4], \"real_space_c\": [-6.1, 9.8, 83.7], "
                       "\"space_group_hall_symbol\": \" P 1\", \"A_at_scan_points\": [";
    snprintf(text, sizeof text, "%s%s]}]\n}\n", head, sv);
    write_text(path, text);
    double *rs = NULL;
    int n = 0;
    int rc = nbg_read_expt_scan_crystal(ctx, path, &rs, &n);
    double worst = rc == NBG_OK && n == 5 ? 0 : INFINITY;
    for (int k = 0; k < 5 && worst < INFINITY; ++k)
        for (int i = 0; i < 9; ++i) worst = fmax(worst, fabs(rs[9 * k + i] - want[k][i]));
    nbgi_test_check(worst < 1e-9, "sv-read", "5 scan points read as bases in the lab frame (setting rotation "
                    "applied): largest difference %.3g A (%s)", worst, rc == NBG_OK ? "ok" : nbg_errmsg(ctx));
    free(rs);

    /* image 3 through the builder: the crystal of the mean of A at points 2 and 3, turned from phi 1 deg */
    nbg_builder *b = NULL;
    const char *argv[] = {"-expt", path, "-default_F", "100", "-N", "3", "-oversample", "1"};
    rc = nbg_builder_create(&b);
    rc = rc == NBG_OK ? nbg_builder_parse(ctx, b, 8, argv) : rc;
    rc = rc == NBG_OK ? nbg_builder_load(ctx, b) : rc;
    nbg_experiment e2;
    nbg_report r2;
    rc = rc == NBG_OK ? nbg_builder_frame(ctx, b, 2, &e2) : rc;
    rc = rc == NBG_OK ? nbg_describe(ctx, &e2, &r2) : rc;
    double A2[9], A3[9], Am[9], mean[9];
    inverse3(want[2], A2);
    inverse3(want[3], A3);
    for (int i = 0; i < 9; ++i) Am[i] = 0.5 * (A2[i] + A3[i]);
    inverse3(Am, mean);
    worst = rc == NBG_OK ? 0 : INFINITY;
    for (int i = 0; i < 9 && rc == NBG_OK; ++i) worst = fmax(worst, fabs(r2.real_vectors[i] - mean[i]));
    nbgi_test_check(worst < 1e-8 && rc == NBG_OK && fabs(r2.phi0 - 1.0) < 1e-12, "sv-frame",
                    "image 3's crystal is the mean of its A matrices to %.3g A, from phi %g deg (%s)", worst,
                    rc == NBG_OK ? r2.phi0 : NAN, rc == NBG_OK ? "ok" : nbg_errmsg(ctx));
    nbg_experiment e4;
    rc = b != NULL ? nbg_builder_frame(ctx, b, 4, &e4) : -1;
    nbgi_test_check(rc == NBG_EINVAL && strstr(nbg_errmsg(ctx), "image 4 of a series of 4") != NULL, "sv-frame-range",
                    "an image past the scan refused: %s", nbg_errmsg(ctx));

    /* the program renders image 3 with it: bit for bit the builder's image, and not the static crystal's */
    const char *bin = getenv("NBG_BIN") != NULL ? getenv("NBG_BIN") : "build/nbgrad";
    char cmd[2048], out[512], frame3[600];
    snprintf(out, sizeof out, "%s/sv.bin", dir);
    snprintf(frame3, sizeof frame3, "%s/sv_00003.bin", dir);
    snprintf(cmd, sizeof cmd, "%s -expt %s -default_F 100 -N 3 -oversample 1 -floatfile %s > %s/sv.log 2>&1", bin,
             path, out, dir);
    const int st = system(cmd);
    float img[128 * 128], prog[128 * 128], stat[128 * 128];
    FILE *f = fopen(frame3, "rb");
    int got = f != NULL && fread(prog, sizeof(float), 128 * 128, f) == 128 * 128;
    if (f != NULL) fclose(f);
    rc = e2.fpixels == 128 ? nbg_simulate(ctx, &e2, img, 128 * 128, NULL) : -1;
    nbg_experiment es = *nbg_builder_experiment(b); /* the static crystal, image 3's angles */
    es.phi0 = 1.0;
    rc = rc == NBG_OK ? nbg_simulate(ctx, &es, stat, 128 * 128, NULL) : rc;
    double sum = 0, moved = 0;
    int same = got && rc == NBG_OK;
    for (int i = 0; same && i < 128 * 128; ++i) {
        same = memcmp(&img[i], &prog[i], sizeof(float)) == 0;
        sum += img[i];
        moved += fabs(img[i] - stat[i]);
    }
    nbgi_test_check(st == 0 && same && sum > 0 && moved > 1e-3 * sum, "sv-cli", "the program's image 3 is the "
                    "builder's bit for bit (photons %.4g; %.2g of them move against the static crystal; exit %d)",
                    sum, moved, st);
    nbg_builder_destroy(b);

    /* refine: one crystal for every image, from the static one (said); too few scan points for an image, refused */
    snprintf(cmd, sizeof cmd, "%s refine -expt %s -default_F 100 -N 3 -oversample 1 -observed %s -params rotx > "
             "%s/sv2.log 2>&1", bin, path, frame3, dir);
    const int st2 = system(cmd);
    char log[600], buf[4096] = "";
    snprintf(log, sizeof log, "%s/sv2.log", dir);
    f = fopen(log, "r");
    size_t nr = f != NULL ? fread(buf, 1, sizeof buf - 1, f) : 0;
    buf[nr] = 0;
    if (f != NULL) fclose(f);
    nbgi_test_check(strstr(buf, "refine fits one crystal for every image: it starts from the static") != NULL &&
                        strstr(buf, "rotx") != NULL,
                    "sv-refine-static", "refine says it fits one crystal from the static one (exit %d)", st2);
    char *cut = strstr(text, sv);
    const char *three = strstr(sv, "], [") ? strstr(strstr(strstr(sv, "], [") + 1, "], [") + 1, "], [") : NULL;
    if (cut != NULL && three != NULL) {
        snprintf(cut, sizeof text - (size_t)(cut - text), "%.*s]]}]\n}\n", (int)(three - sv), sv); /* 3 points */
        write_text(path, text);
    }
    b = NULL;
    rc = nbg_builder_create(&b);
    rc = rc == NBG_OK ? nbg_builder_parse(ctx, b, 8, argv) : rc;
    rc = rc == NBG_OK ? nbg_builder_load(ctx, b) : rc;
    rc = rc == NBG_OK ? nbg_builder_frame(ctx, b, 3, &e4) : rc;
    nbgi_test_check(cut != NULL && three != NULL && rc == NBG_EINVAL &&
                        strstr(nbg_errmsg(ctx), "3 scan points") != NULL,
                    "sv-too-few", "image 4 of a list with 3 scan points refused: %s", nbg_errmsg(ctx));
    nbg_builder_destroy(b);
    /* a matrix of 8 numbers, a singular one: refused naming it */
    const char *bad[2] = {"[1, 0, 0, 0, 1, 0, 0, 0, 1], [1, 0, 0, 0, 1, 0, 0, 0]",
                          "[1, 0, 0, 0, 1, 0, 0, 0, 1], [1, 0, 0, 0, 1, 0, 0, 0, 0]"};
    const char *needle[2] = {"expected 9 finite numbers", "singular"};
    for (int k = 0; k < 2; ++k) {
        snprintf(text, sizeof text, "%s%s]}]\n}\n", head, bad[k]);
        write_text(path, text);
        rs = NULL;
        rc = nbg_read_expt_scan_crystal(ctx, path, &rs, &n);
        nbgi_test_check(rc == NBG_EFORMAT && rs == NULL && strstr(nbg_errmsg(ctx), "A_at_scan_points[1]") != NULL &&
                            strstr(nbg_errmsg(ctx), needle[k]) != NULL,
                        k ? "sv-singular" : "sv-malformed", "%s", nbg_errmsg(ctx));
        free(rs);
    }
    /* a static crystal: no scan points */
    write_list(path, EXPT_C, PANEL(FAST), GON, CRYSTAL);
    rs = (double *)1;
    rc = nbg_read_expt_scan_crystal(ctx, path, &rs, &n);
    nbgi_test_check(rc == NBG_OK && rs == NULL && n == 0, "sv-static", "a static crystal: %d points", n);
}

/* The rotation angle (deg) between two experiments' crystals (their real-space bases at phi 0). */
static double crystal_angle(nbg_ctx *ctx, const nbg_experiment *a, const nbg_experiment *b)
{
    nbg_report ra, rb;
    if (nbg_describe(ctx, a, &ra) != NBG_OK || nbg_describe(ctx, b, &rb) != NBG_OK) return INFINITY;
    double Bi[9], R[9];
    inverse3(rb.real_vectors, Bi); /* rows a, b, c: R = A^T B^-T, i.e. R^T = B^-1 A */
    for (int i = 0; i < 3; ++i)
        for (int j = 0; j < 3; ++j) {
            double t = 0;
            for (int k = 0; k < 3; ++k) t += Bi[3 * j + k] * ra.real_vectors[3 * k + i];
            R[3 * i + j] = t;
        }
    const double wx = R[7] - R[5], wy = R[2] - R[6], wz = R[3] - R[1];
    return asin(fmin(1, 0.5 * sqrt(wx * wx + wy * wy + wz * wz))) * 180 / M_PI;
}

/* refine -scan_varying: a 12-image scan whose crystal wobbles (a scan-varying list, each image rendered with its
 * own crystal by the program), refined from the list's static crystal with one orientation and with knots; the
 * per-image crystals of the -exptfile lists (read back through the builder, A_at_scan_points and all) against the
 * truth's; the refusals (one image, no orientation parameter). */
static void test_scan_varying_refine(nbg_ctx *ctx, const char *dir)
{
    enum { NI = 12 };
    char path[512], text[16384], sv[12288] = "";
    snprintf(path, sizeof path, "%s/svw.expt", dir);
    const double R0[9] = {51.2, 3.1, -2.4, 7.5, 62.3, 4.4, -6.1, 9.8, 83.7};
    for (int k = 0; k <= NI; ++k) {
        /* the wobble at boundary k: 0.06 deg sin about y, a 0.05 deg drift about z */
        const double ty = 0.06 * sin(M_PI * k / NI) * M_PI / 180, tz = 0.05 * (2.0 * k / NI - 1) * M_PI / 180;
        const double Ry[9] = {cos(ty), 0, sin(ty), 0, 1, 0, -sin(ty), 0, cos(ty)};
        const double Rz[9] = {cos(tz), -sin(tz), 0, sin(tz), cos(tz), 0, 0, 0, 1};
        double Rk[9], A[9], tmp[3];
        for (int i = 0; i < 3; ++i) {
            mat_vec(Ry, R0 + 3 * i, tmp);
            mat_vec(Rz, tmp, Rk + 3 * i);
        }
        inverse3(Rk, A);
        size_t at = strlen(sv);
        snprintf(sv + at, sizeof sv - at, "%s[", k ? ", " : "");
        for (int i = 0; i < 9; ++i) {
            at = strlen(sv);
            snprintf(sv + at, sizeof sv - at, "%.17g%s", A[i], i < 8 ? ", " : "]");
        }
    }
    snprintf(text, sizeof text,
             "{\n  \"__id__\": \"ExperimentList\",\n  \"experiment\": [" EXPT_C "],\n"
             "  \"beam\": [{\"direction\": [0, 0, 1], \"wavelength\": 1.0}],\n"
             "  \"detector\": [{\"panels\": [{\"fast_axis\": [1, 0, 0], \"slow_axis\": [0, -1, 0], "
             "\"origin\": [-6.4, 6.4, -80], \"pixel_size\": [0.1, 0.1], \"image_size\": [128, 128]}]}],\n"
             "  \"goniometer\": [{\"rotation_axis\": [1, 0, 0]}],\n"
             "  \"scan\": [{\"image_range\": [1, %d], \"oscillation\": [0, 0.5]}],\n"
             "  \"crystal\": [{\"__id__\": \"crystal\", \"real_space_a\": [51.2, 3.1, -2.4], "
             "\"real_space_b\": [7.5, 62.3, 4.4], \"real_space_c\": [-6.1, 9.8, 83.7], "
             "\"space_group_hall_symbol\": \" P 1\", \"A_at_scan_points\": [%s]}]\n}\n", NI, sv);
    write_text(path, text);
    const char *bin = getenv("NBG_BIN") != NULL ? getenv("NBG_BIN") : "build/nbgrad";
    const char *model = "-default_F 100 -N 3 -oversample 1 -fluence 1.26e30";
    char cmd[4096];
    snprintf(cmd, sizeof cmd, "%s -expt %s %s -cbffile %s/svw_#####.cbf -scale 1 -nopgm > %s/svw.log 2>&1", bin, path, model,
             dir, dir);
    int st = system(cmd);
    nbgi_test_check(st == 0, "sv-refine-data", "rendered %d images of a wobbling crystal (exit %d)", NI, st);
    /* the truth: each image's crystal from the list (the builder) */
    nbg_experiment truth[NI];
    nbg_builder *b = NULL;
    const char *argv[] = {"-expt", path, "-default_F", "100", "-N", "3", "-oversample", "1", "-fluence", "1.26e30"};
    int rc = nbg_builder_create(&b);
    rc = rc == NBG_OK ? nbg_builder_parse(ctx, b, 10, argv) : rc;
    rc = rc == NBG_OK ? nbg_builder_load(ctx, b) : rc;
    for (int f = 0; rc == NBG_OK && f < NI; ++f) rc = nbg_builder_frame(ctx, b, f, &truth[f]);
    nbg_builder_destroy(b);
    double err[2] = {INFINITY, INFINITY};
    int exitc[2] = {-1, -1};
    char log[2][600];
    for (int m = 0; rc == NBG_OK && m < 2; ++m) {
        char out[600];
        snprintf(out, sizeof out, "%s/svw_fit%d.expt", dir, m);
        snprintf(log[m], sizeof log[m], "%s/svw_fit%d.log", dir, m);
        snprintf(cmd, sizeof cmd, "%s refine -expt %s %s -observed %s/svw_#####.cbf -params orientation %s "
                 "-exptfile %s > %s 2>&1", bin, path, model, dir, m ? "-scan_varying 1.5" : "", out, log[m]);
        exitc[m] = system(cmd);
        /* the fitted list's images through the builder */
        const char *av[] = {"-expt", out, "-default_F", "100", "-N", "3", "-oversample", "1", "-fluence", "1.26e30"};
        nbg_builder *bo = NULL;
        int r2 = nbg_builder_create(&bo);
        r2 = r2 == NBG_OK ? nbg_builder_parse(ctx, bo, 10, av) : r2;
        r2 = r2 == NBG_OK ? nbg_builder_load(ctx, bo) : r2;
        double s = 0;
        for (int f = 0; r2 == NBG_OK && f < NI; ++f) {
            nbg_experiment e;
            r2 = nbg_builder_frame(ctx, bo, f, &e);
            const double d = r2 == NBG_OK ? crystal_angle(ctx, &e, &truth[f]) : INFINITY;
            s += d * d;
        }
        nbg_builder_destroy(bo);
        err[m] = r2 == NBG_OK ? sqrt(s / NI) : INFINITY;
    }
    char buf[8192] = "";
    FILE *f = fopen(log[1], "r");
    size_t nr = f != NULL ? fread(buf, 1, sizeof buf - 1, f) : 0;
    buf[nr] = 0;
    if (f != NULL) fclose(f);
    double *rs = NULL;
    int n = 0;
    char out1[600];
    snprintf(out1, sizeof out1, "%s/svw_fit1.expt", dir);
    const int rr = nbg_read_expt_scan_crystal(ctx, out1, &rs, &n);
    free(rs);
    printf("refine -scan_varying: per-image orientation error of the written lists (deg rms): static %.4g, "
           "scan-varying %.4g\n", err[0], err[1]);
    nbgi_test_check(rc == NBG_OK && exitc[0] == 0 && exitc[1] == 0 && err[1] * 4 < err[0] && rr == NBG_OK &&
                        n == NI + 1 && strstr(buf, "scan-varying orientation: 5 knots") != NULL &&
                        strstr(buf, "orient_x.k4") != NULL,
                    "sv-refine-cli", "refine -scan_varying 1.5 (5 knots over 6 deg): the written list's %d scan "
                    "points give each image's crystal to %.4g deg rms, one crystal for all to %.4g (exits %d, %d)",
                    n, err[1], err[0], exitc[0], exitc[1]);
    /* the crystal varying (-scan_vary crystal): the cell's knots too, written as the list's scan points */
    {
        char out[600], lg[600];
        snprintf(out, sizeof out, "%s/svw_fit2.expt", dir);
        snprintf(lg, sizeof lg, "%s/svw_fit2.log", dir);
        snprintf(cmd, sizeof cmd, "%s refine -expt %s %s -observed %s/svw_#####.cbf -params orientation,a,b,c "
                 "-scan_varying 1.5 -scan_vary crystal -exptfile %s > %s 2>&1", bin, path, model, dir, out, lg);
        const int ex = system(cmd);
        f = fopen(lg, "r");
        nr = f != NULL ? fread(buf, 1, sizeof buf - 1, f) : 0;
        buf[nr] = 0;
        if (f != NULL) fclose(f);
        const char *av[] = {"-expt", out, "-default_F", "100", "-N", "3", "-oversample", "1", "-fluence", "1.26e30"};
        nbg_builder *bo = NULL;
        int r2 = nbg_builder_create(&bo);
        r2 = r2 == NBG_OK ? nbg_builder_parse(ctx, bo, 10, av) : r2;
        r2 = r2 == NBG_OK ? nbg_builder_load(ctx, bo) : r2;
        double s = 0, dlen = 0;
        for (int k = 0; r2 == NBG_OK && k < NI; ++k) {
            nbg_experiment e;
            nbg_report ra, rb;
            r2 = nbg_builder_frame(ctx, bo, k, &e);
            const double d = r2 == NBG_OK ? crystal_angle(ctx, &e, &truth[k]) : INFINITY;
            s += d * d;
            if (r2 == NBG_OK && nbg_describe(ctx, &e, &ra) == NBG_OK && nbg_describe(ctx, &truth[k], &rb) == NBG_OK) {
                for (int i = 0; i < 3; ++i) dlen = fmax(dlen, fabs(ra.cell[i] / rb.cell[i] - 1));
            } else {
                dlen = INFINITY;
            }
        }
        nbg_builder_destroy(bo);
        const double e2 = r2 == NBG_OK ? sqrt(s / NI) : INFINITY;
        nbgi_test_check(ex == 0 && e2 * 4 < err[0] && dlen < 1e-3 && strstr(buf, "scan-varying crystal: 5 knots") &&
                            strstr(buf, "a.k4") != NULL && strstr(buf, "c.k4") != NULL,
                        "sv-refine-cli-crystal", "refine -scan_varying 1.5 -scan_vary crystal (orientation, a, b, c): "
                        "each image's crystal from the written list to %.4g deg rms, its cell lengths to %.2g "
                        "(exit %d)", e2, dlen, ex);
    }
    /* refused: one image; no orientation parameter */
    const char *why[2] = {"needs a scan of several frames", "no orientation parameter"};
    for (int k = 0; k < 2; ++k) {
        snprintf(cmd, sizeof cmd, "%s refine -expt %s %s -observed %s/svw_%s.cbf -params %s -scan_varying 1 > "
                 "%s/svw_bad.log 2>&1", bin, path, model, dir, k ? "#####" : "00003", k ? "a" : "orientation", dir);
        st = system(cmd);
        snprintf(out1, sizeof out1, "%s/svw_bad.log", dir);
        f = fopen(out1, "r");
        nr = f != NULL ? fread(buf, 1, sizeof buf - 1, f) : 0;
        buf[nr] = 0;
        if (f != NULL) fclose(f);
        const char *e = strstr(buf, "error:");
        nbgi_test_check(st != 0 && strstr(buf, why[k]) != NULL, k ? "sv-refine-cli-no-orientation"
                        : "sv-refine-cli-one-image", "refused (exit %d): %.200s", st, e != NULL ? e : buf);
    }
}

/* Compares two hierarchies' groups in order (fast_axis, slow_axis, origin of each): the largest difference, or
 * INFINITY when their shapes differ; *ngroups the groups compared. */
static double hier_diff(json_t *a, json_t *b, int *ngroups)
{
    if (!json_is_object(a) || !json_is_object(b)) {
        return INFINITY;
    }
    json_t *pa = json_object_get(a, "panel"), *pb = json_object_get(b, "panel");
    if (pa != NULL || pb != NULL) {
        return pa != NULL && pb != NULL && json_integer_value(pa) == json_integer_value(pb) ? 0 : INFINITY;
    }
    double d = 0;
    static const char *keys[3] = {"fast_axis", "slow_axis", "origin"};
    for (int k = 0; k < 3; ++k) {
        json_t *va = json_object_get(a, keys[k]), *vb = json_object_get(b, keys[k]);
        if (json_array_size(va) != 3 || json_array_size(vb) != 3) {
            return INFINITY;
        }
        for (size_t i = 0; i < 3; ++i) {
            d = fmax(d, fabs(json_number_value(json_array_get(va, i)) - json_number_value(json_array_get(vb, i))));
        }
    }
    ++*ngroups;
    json_t *ca = json_object_get(a, "children"), *cb = json_object_get(b, "children");
    if (json_array_size(ca) != json_array_size(cb)) {
        return INFINITY;
    }
    for (size_t c = 0; c < json_array_size(ca); ++c) {
        d = fmax(d, hier_diff(json_array_get(ca, c), json_array_get(cb, c), ngroups));
    }
    return d;
}

/* Panel k's origin and axes (placed, nbg_panel) in its group's frame at level l (nbg_panel.level_frame). */
static void in_level_frame(const nbg_panel *p, int l, double out[9])
{
    const double *F = p->level_frame[l];
    const double n[3] = {F[1] * F[5] - F[2] * F[4], F[2] * F[3] - F[0] * F[5], F[0] * F[4] - F[1] * F[3]};
    const double *ax[3] = {F, F + 3, n};
    for (int j = 0; j < 3; ++j) {
        out[j] = out[3 + j] = out[6 + j] = 0;
        for (int i = 0; i < 3; ++i) {
            out[j] += p->fast[i] * ax[j][i];
            out[3 + j] += p->slow[i] * ax[j][i];
            out[6 + j] += (p->origin[i] - F[6 + i]) * ax[j][i];
        }
    }
}

/* A hierarchy whose groups have frames of their own (the root offset, two quadrants turned by 3 and 93 deg about the
 * beam, two sensors each lifted and shifted, two panels each), as dxtbx writes one:
 *   hier-frames-read     every panel's groups' frames read into nbg_panel.level_frame (the root's, a quadrant's)
 *   hier-frames-write    written back, every group's frame and every panel's vectors in it as the list had them
 *   hier-frames-motion   through the builder (-panel_groups level1), quadrant 0 moved and turned by its motion: its
 *                        frame moves with its panels (their coordinates in it kept), quadrant 1's and the root's stay,
 *                        and the list written then holds the moved quadrant's frame and its panels in place */
static void test_hier_frames(nbg_ctx *ctx, const char *dir)
{
    char all[4000] = "", quads[2][2400], text[12000], path[600], wpath[600];
    for (int k = 0; k < 8; ++k) {
        const size_t len = strlen(all);
        snprintf(all + len, sizeof all - len, "%s{\"name\": \"p%d\", \"fast_axis\": [1, 0, 0], \"slow_axis\": [0, -1, "
                 "0], \"origin\": [%d, 2, 0], \"pixel_size\": [0.1, 0.1], \"image_size\": [20, 10]}", k ? ", " : "",
                 k, k % 2 == 0 ? -3 : 1);
    }
    for (int qd = 0; qd < 2; ++qd) {
        const double t = (3 + 90 * qd) * M_PI / 180;
        char s[2][600];
        for (int sn = 0; sn < 2; ++sn) {
            snprintf(s[sn], sizeof s[sn], "{\"name\": \"s%d%d\", \"fast_axis\": [1, 0, 0], \"slow_axis\": [0, 1, 0], "
                     "\"origin\": [0.25, %g, %g], \"children\": [{\"panel\": %d}, {\"panel\": %d}]}", qd, sn,
                     6.0 * sn - 3, 0.5 * sn, 4 * qd + 2 * sn, 4 * qd + 2 * sn + 1);
        }
        snprintf(quads[qd], sizeof quads[qd], "{\"name\": \"q%d\", \"fast_axis\": [%.17g, %.17g, 0], \"slow_axis\": "
                 "[%.17g, %.17g, 0], \"origin\": [%g, 4, -100], \"children\": [%s, %s]}", qd, cos(t), sin(t), -sin(t),
                 cos(t), qd ? 20.0 : -20.0, s[0], s[1]);
    }
    snprintf(text, sizeof text,
             "{\"__id__\": \"ExperimentList\", \"experiment\": [" EXPT_C "],\n"
             "  \"beam\": [{\"direction\": [0, 0, 1], \"wavelength\": 1.0}],\n"
             "  \"detector\": [{\"panels\": [%s], \"hierarchy\": {\"name\": \"\", \"fast_axis\": [1, 0, 0], "
             "\"slow_axis\": [0, 1, 0], \"origin\": [1.5, -2, 0], \"children\": [%s, %s]}}],\n"
             "  \"goniometer\": [" GON "],\n"
             "  \"scan\": [{\"image_range\": [1, 1], \"oscillation\": [0, 0.1], \"exposure_time\": [1]}]" CRYSTAL "}\n",
             all, quads[0], quads[1]);
    snprintf(path, sizeof path, "%s/frames.expt", dir);
    snprintf(wpath, sizeof wpath, "%s/frames_w.expt", dir);
    write_text(path, text);
    nbg_geometry g;
    nbg_panel *q = NULL;
    int nq = 0;
    int rc = nbg_read_expt_panels(ctx, path, &g, &q, &nq);
    const double c3 = cos(3 * M_PI / 180), s3 = sin(3 * M_PI / 180);
    int ok = rc == NBG_OK && nq == 8;
    double dr = 0;
    for (int k = 0; ok && k < 8; ++k) {
        const double *R = q[k].level_frame[0], *Q = q[k].level_frame[1];
        const double wr[9] = {1, 0, 0, 0, 1, 0, 1.5, -2, 0};
        const double wq[9] = {c3, s3, 0, -s3, c3, 0, -18.5, 2, -100};
        ok = q[k].has_level_frames;
        for (int i = 0; i < 9; ++i) {
            dr = fmax(dr, fabs(R[i] - wr[i]));
            if (k < 4) {
                dr = fmax(dr, fabs(Q[i] - wq[i]));
            }
        }
    }
    nbgi_test_check(ok && dr < 1e-12, "hier-frames-read", "the root's and quadrant 0's frames in every panel's "
                    "level_frame, to %.2g%s", dr, rc == NBG_OK ? "" : nbg_errmsg(ctx));
    json_error_t err;
    rc = rc == NBG_OK ? nbg_write_expt_panels(ctx, wpath, &g, q, nq, NULL) : rc;
    json_t *a = json_load_file(path, 0, &err), *b = rc == NBG_OK ? json_load_file(wpath, 0, &err) : NULL;
    int ng = 0;
    double d = INFINITY, dp = INFINITY;
    if (a != NULL && b != NULL) {
        json_t *da = json_array_get(json_object_get(a, "detector"), 0), *db = json_array_get(json_object_get(b,
                                                                                               "detector"), 0);
        d = hier_diff(json_object_get(da, "hierarchy"), json_object_get(db, "hierarchy"), &ng);
        dp = 0;
        json_t *pa = json_object_get(da, "panels"), *pb = json_object_get(db, "panels");
        for (size_t k = 0; k < 8; ++k) {
            static const char *keys[3] = {"fast_axis", "slow_axis", "origin"};
            for (int v = 0; v < 3; ++v) {
                json_t *va = json_object_get(json_array_get(pa, k), keys[v]);
                json_t *vb = json_object_get(json_array_get(pb, k), keys[v]);
                for (size_t i = 0; i < 3; ++i) {
                    const double x = json_number_value(json_array_get(va, i)), y = json_number_value(json_array_get(vb, i));
                    dp = fmax(dp, json_array_size(va) == 3 && json_array_size(vb) == 3 ? fabs(x - y) : INFINITY);
                }
            }
        }
    }
    json_decref(a);
    json_decref(b);
    nbgi_test_check(rc == NBG_OK && ng == 7 && d < 1e-12 && dp < 1e-12, "hier-frames-write", "written back: %d groups' "
                    "frames as the list had them to %.2g, every panel's vectors in its group's frame to %.2g%s", ng,
                    d, dp, rc == NBG_OK ? "" : nbg_errmsg(ctx));
    /* the quadrants as motion groups, through the builder (which puts the panels in the plane's frame) */
    nbg_builder *bld = NULL;
    const char *argv[] = {"-expt", path, "-panel_groups", "level1", "-default_F", "100", "-N", "3"};
    int rb = nbg_builder_create(&bld);
    rb = rb == NBG_OK ? nbg_builder_parse(ctx, bld, 8, argv) : rb;
    rb = rb == NBG_OK ? nbg_builder_load(ctx, bld) : rb;
    nbg_panel_motion *mo = NULL;
    const int nm = rb == NBG_OK ? nbg_builder_motions(bld, &mo) : -1;
    nbg_experiment *e = rb == NBG_OK ? nbg_builder_experiment(bld) : NULL;
    nbg_panel before[8], after[8];
    nbg_report r;
    rb = rb == NBG_OK && nm == 2 ? nbg_describe(ctx, e, &r) : NBG_EINVAL;
    rb = rb == NBG_OK ? nbg_panels_from_report(ctx, e, &r, before, 8) : rb;
    double moved = 0, kept = 0, others = 0;
    if (rb == NBG_OK) {
        const nbg_panel_motion m0 = {{0.2, -0.1, 0.05}, {0.3, -0.2, 0.5}};
        mo[0] = m0;
        e->motions = mo;
        e->nmotions = nm;
        rb = nbg_describe(ctx, e, &r);
        rb = rb == NBG_OK ? nbg_panels_from_report(ctx, e, &r, after, 8) : rb;
    }
    for (int k = 0; rb == NBG_OK && k < 8; ++k) {
        double x0[9], x1[9];
        in_level_frame(&before[k], 1, x0);
        in_level_frame(&after[k], 1, x1);
        for (int i = 0; i < 9; ++i) {
            kept = fmax(kept, fabs(x1[i] - x0[i]));
        }
        for (int i = 0; i < 9; ++i) {
            const double dq = fabs(after[k].level_frame[1][i] - before[k].level_frame[1][i]);
            if (k < 4) {
                moved = fmax(moved, dq);
            } else {
                others = fmax(others, dq);
            }
            others = fmax(others, fabs(after[k].level_frame[0][i] - before[k].level_frame[0][i]));
        }
    }
    /* written: the moved quadrant's frame, and every panel where it was placed */
    nbg_geometry gw;
    nbg_panel *w = NULL;
    int nw = 0;
    rb = rb == NBG_OK ? nbg_geometry_from_report(ctx, e, &r, 1, &gw) : rb;
    rb = rb == NBG_OK ? nbg_write_expt_panels(ctx, wpath, &gw, after, 8, NULL) : rb;
    rb = rb == NBG_OK ? nbg_read_expt_panels(ctx, wpath, &gw, &w, &nw) : rb;
    double back = rb == NBG_OK && nw == 8 ? 0 : INFINITY;
    for (int k = 0; rb == NBG_OK && nw == 8 && k < 8; ++k) {
        for (int i = 0; i < 9; ++i) {
            back = fmax(back, fabs(w[k].level_frame[1][i] - after[k].level_frame[1][i]));
        }
        for (int i = 0; i < 3; ++i) {
            back = fmax(back, fabs(w[k].origin[i] - after[k].origin[i]));
        }
    }
    nbgi_test_check(rb == NBG_OK && moved > 0.1 && kept < 1e-12 && others < 1e-12 && back < 1e-12,
                    "hier-frames-motion", "quadrant 0 moved (0.2 -0.1 0.05 mm, 0.3 -0.2 0.5 deg): its frame by up to "
                    "%.3g, its panels in it kept to %.2g; quadrant 1's and the root's frames kept to %.2g; written and "
                    "read back to %.2g%s", moved, kept, others, back, rb == NBG_OK ? "" : nbg_errmsg(ctx));
    free(w);
    nbg_builder_destroy(bld);
    free(q);
}

int main(void)
{
    nbg_ctx *ctx = NULL;
    if (nbg_ctx_create(&ctx, NBG_BACKEND_CPU, NBG_DOUBLE, 1) != NBG_OK) {
        nbgi_test_check(0, "ctx", "cannot create a context");
        return nbgi_test_summary();
    }
    char dir[256];
    if (nbgi_test_mkdtemp("nbg-expt-", dir, sizeof dir) == NULL) {
        nbgi_test_check(0, "tmpdir", "cannot make a temporary directory");
        nbg_ctx_destroy(ctx);
        return nbgi_test_summary();
    }
#ifdef NBG_HAVE_FORMATS
    test_round_trip(ctx, dir);
    test_write_errors(ctx, dir);
    test_read_errors(ctx, dir);
    test_compose(ctx, dir);
    test_hierarchy(ctx, dir);
    test_raw_offsets(ctx, dir);
    test_raw_offsets_written(ctx, dir);
    test_tilted_frame(ctx, dir);
    test_write_groups(ctx, dir);
    test_hier_frames(ctx, dir);
    test_scan_varying(ctx, dir);
    test_multi_axis(ctx, dir);
    test_scan_varying_refine(ctx, dir);
#else
    char path[600];
    nbg_geometry g;
    sample_geometry(&g);
    snprintf(path, sizeof path, "%s/x.expt", dir);
    int rc = nbg_write_expt(ctx, path, &g, "img_#####.cbf");
    nbgi_test_check(rc == NBG_EUNSUP && strstr(nbg_errmsg(ctx), "FORMATS=0") != NULL && count_entries(dir) == 0,
                    "unsup-write", "%s", nbg_errmsg(ctx));
    rc = nbg_read_expt(ctx, path, &g);
    nbgi_test_check(rc == NBG_EUNSUP && strstr(nbg_errmsg(ctx), "FORMATS=0") != NULL, "unsup-read", "%s",
                    nbg_errmsg(ctx));
#endif
    nbgi_test_rmtree(dir);
    nbg_ctx_destroy(ctx);
    return nbgi_test_summary();
}
