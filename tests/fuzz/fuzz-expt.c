/*
 * fuzz-expt.c -- libFuzzer harness for nbg_read_expt (DIALS experiment lists, JSON through jansson) and
 * nbg_read_expt_scan_crystal (a scan-varying crystal's A matrices).
 *
 * The input is the file's content.  A list that is read must give a geometry that nbg_experiment_from_geometry
 * either takes or refuses with a message; one that is refused must say why; the scan points of one that is read
 * are as many as it counted, each basis finite.  A list with a multi-axis goniometer is checked and written back: its
 * goniometer within the limits the reader states (1 to 16 axes within 1 % of unit length, finite angles, the scan
 * axis one of them), and the list written from it read back with the same axes, angles, names, scan axis and the
 * same laboratory axis and crystal bit for bit.
 */
#include "fuzz_util.h"
#include "nbgrad.h"

#include <math.h>
#include <stdlib.h>

static nbgi_fuzz_file file;
static char out_path[4200]; /* the list written back (the writer renames a temporary into place: a real name) */

static void remove_out(void)
{
    unlink(out_path);
}

/* A multi-axis goniometer as the reader promises it, and the list written from g read back the same. */
static void check_multi_axis(nbg_ctx *ctx, const nbg_geometry *g)
{
    const nbg_goniometer *gn = &g->goniometer;
    NBG_FUZZ_CHECK(gn->naxes >= 1 && gn->naxes <= NBG_GONIO_MAX_AXES && gn->scan_axis >= 0 &&
                       gn->scan_axis < gn->naxes,
                   "a goniometer's axis count or scan axis out of range");
    for (int i = 0; i < gn->naxes; ++i) {
        const double *v = gn->axes[i], n = sqrt(v[0] * v[0] + v[1] * v[1] + v[2] * v[2]);
        NBG_FUZZ_CHECK(fabs(n - 1) <= 0.01 && isfinite(gn->angles[i]),
                       "a goniometer axis off unit length or an angle not finite");
        NBG_FUZZ_CHECK(memchr(gn->names[i], '\0', sizeof gn->names[i]) != NULL, "an axis name not terminated");
    }
    if (nbg_write_expt(ctx, out_path, g, NULL) != NBG_OK) {
        NBG_FUZZ_CHECK(nbg_errmsg(ctx)[0] != '\0', "nbg_write_expt failed without a message");
        return;
    }
    nbg_geometry b;
    NBG_FUZZ_CHECK(nbg_read_expt(ctx, out_path, &b) == NBG_OK, "a list nbgrad wrote is not read back");
    /* a still (no scan, the axis x) is written as DIALS writes one: no goniometer, the crystal as the image sees it */
    const int still = g->scan_stated == 0 && g->nframes == 1 && g->scan_width == 0 && g->scan_start == 0 &&
                      g->axis[0] == 1 && g->axis[1] == 0 && g->axis[2] == 0;
    NBG_FUZZ_CHECK(!still || b.goniometer.naxes == 0, "a still written with its goniometer");
    NBG_FUZZ_CHECK(still || (b.goniometer.naxes == gn->naxes && b.goniometer.scan_axis == gn->scan_axis &&
                       memcmp(b.goniometer.axes, gn->axes, sizeof gn->axes[0] * (size_t)gn->naxes) == 0 &&
                       memcmp(b.goniometer.angles, gn->angles, sizeof gn->angles[0] * (size_t)gn->naxes) == 0 &&
                       memcmp(b.axis, g->axis, sizeof g->axis) == 0),
                   "the goniometer written back differs");
    for (int i = 0; !still && i < gn->naxes; ++i)
        NBG_FUZZ_CHECK(strcmp(b.goniometer.names[i], gn->names[i]) == 0, "an axis name written back differs");
    NBG_FUZZ_CHECK(b.has_crystal == g->has_crystal &&
                       (!g->has_crystal || memcmp(b.real_space, g->real_space, sizeof g->real_space) == 0),
                   "the crystal written back differs");
}

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    nbgi_fuzz_file_open(&file, "nbg-fuzz-expt");
    const char *base = getenv("TMPDIR");
    snprintf(out_path, sizeof out_path, "%s/nbg-fuzz-expt-out-%ld.expt",
             base != NULL && base[0] != '\0' ? base : "/tmp", (long)getpid());
    atexit(remove_out);
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    nbgi_fuzz_file_set(&file, data, size);
    nbg_ctx *ctx = NULL;
    NBG_FUZZ_CHECK(nbg_ctx_create(&ctx, NBG_BACKEND_CPU, NBG_DOUBLE, 1) == NBG_OK, "no CPU context");
    nbg_geometry g;
    if (nbg_read_expt(ctx, file.path, &g) == NBG_OK) {
        if (g.goniometer.naxes != 0)
            check_multi_axis(ctx, &g);
        nbg_experiment e;
        nbg_experiment_default(&e);
        if (nbg_experiment_from_geometry(ctx, &g, &e) != NBG_OK) {
            NBG_FUZZ_CHECK(nbg_errmsg(ctx)[0] != '\0', "nbg_experiment_from_geometry failed without a message");
        }
        double *rs = NULL;
        int n = -1;
        if (nbg_read_expt_scan_crystal(ctx, file.path, &rs, &n) == NBG_OK) {
            NBG_FUZZ_CHECK(n == g.crystal_scan_points && (n == 0) == (rs == NULL), "scan points miscounted");
            for (int i = 0; i < 9 * n; ++i) NBG_FUZZ_CHECK(isfinite(rs[i]), "a scan point's basis is not finite");
        } else {
            NBG_FUZZ_CHECK(nbg_errmsg(ctx)[0] != '\0', "nbg_read_expt_scan_crystal failed without a message");
        }
        free(rs);
    } else {
        NBG_FUZZ_CHECK(nbg_errmsg(ctx)[0] != '\0', "nbg_read_expt failed without a message");
    }
    nbg_ctx_destroy(ctx);
    return 0;
}
