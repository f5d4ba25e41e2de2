/*
 * cli.c -- the nbgrad command-line program: nanoBragg's flags in, the same images out.
 *
 *   nbgrad [simulate] <nanoBragg flags>       render images (float, SMV, PGM, noise)
 *
 * Differences from the reference program on purpose: an unknown flag or a missing value is an error that names
 * it; -h/--help prints usage; only the outputs asked for are written; noise needs -noisefile; a run without a seed
 * prints the seed it used; '#' lines in source files are comments; -misset_seed never applies a misset; the
 * phi step at phi = 0 uses the unrotated crystal.  Outputs are written to a temporary name and renamed, so a
 * failure never leaves a half-written file.
 */
#include "cli.h"
#include "io.h"

#include <errno.h>
#include <limits.h>
#include <sys/stat.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define RTD (180.0 / M_PI)

void nbg_cli_usage(FILE *out)
{
    fprintf(out,
            "nbgrad " NBG_VERSION " -- differentiable nanoBragg\n"
            "usage: nbgrad [simulate] <flags>        render an image, nanoBragg's flags\n"
            "       nbgrad -h | --help\n"
            "crystal:   -cell a b c al be ga | -mat A.mat   -misset rx ry rz | random  -misset_seed n\n"
            "           -N n | -Na -Nb -Nc   -samplesize mm   -square_xtal -round_xtal -gauss_xtal -tophat_spots\n"
            "           -fudge x   -mosaic deg -mosaic_dom n -mosaic_seed n   -phi -osc -phistep deg -phisteps n\n"
            "           -spindle_axis x y z\n"
            "F:         -hkl file   -default_F F   -interpolate | -nointerpolate   -dmin A   -nodump\n"
            "beam:      -lambda A | -energy eV   -dispersion %% -dispsteps n   -divergence mrad -divsteps n\n"
            "           -hdivrange -vdivrange -hdivstep -vdivstep mrad -hdivsteps -vdivsteps n -round_div -square_div\n"
            "           -sourcefile f   -polar K | -nopolar   -fluence | -flux -exposure -beamsize mm   -water um\n"
            "detector:  -pixel mm -detpixels n -detsize mm -distance mm -close_distance mm\n"
            "           -mosflm -denzo -adxv -xds -dials   -Xbeam -Ybeam -Xclose -Yclose mm -ORGX -ORGY px\n"
            "           -fdet_vector -sdet_vector -odet_vector -beam_vector -polar_vector -twotheta_axis x y z\n"
            "           -pivot beam|sample -detector_rotx -detector_roty -detector_rotz -twotheta deg\n"
            "           -curved_det -point_pixel -roi xmin xmax ymin ymax -mask f.img -img f.img\n"
            "           -detector_thick um -detector_abs um -thicksteps n -oversample n\n"
            "           -oversample_thick -oversample_polar -oversample_omega\n"
            "output:    -floatfile f -intfile f -scale x -adc x -pgmfile f -pgmscale x -noisefile f -seed n\n"
            "           -nopgm -nonoise   (only the files asked for are written)\n"
            "nbgrad:    -device cpu|cuda|auto   -precision double|float   -threads n (0: OpenMP default, <= 1024)\n"
            "           -max_memory GiB (4: the largest allocation an input may ask for)\n"
            "           -max_samples n (1e12: the most pixels x samples per pixel one run may evaluate)\n");
}

/* --- strict argument parsing ----------------------------------------------------------------------------- */

static int need(int argc, char **argv, int i, int n)
{
    if (i + n >= argc) {
        fprintf(stderr, "nbgrad: error: %s needs %d value%s\n", argv[i], n, n > 1 ? "s" : "");
        return 0;
    }
    return 1;
}

int nbg_cli_number(const char *flag, const char *s, double *out)
{
    char *end;
    errno = 0;
    const double v = strtod(s, &end);
    if (end == s || *end != '\0' || errno == ERANGE) {
        fprintf(stderr, "nbgrad: error: %s expects a number, got '%s'\n", flag, s);
        return 0;
    }
    if (!isfinite(v)) {
        fprintf(stderr, "nbgrad: error: %s must be finite, got '%s'\n", flag, s);
        return 0;
    }
    *out = v;
    return 1;
}

static int integer(const char *flag, const char *s, int *out)
{
    double v;
    if (!nbg_cli_number(flag, s, &v)) {
        return 0;
    }
    if (v != floor(v) || fabs(v) > 2e9) {
        fprintf(stderr, "nbgrad: error: %s expects an integer, got '%s'\n", flag, s);
        return 0;
    }
    *out = (int)v;
    return 1;
}

static int longint(const char *flag, const char *s, long *out)
{
    double v;
    if (!nbg_cli_number(flag, s, &v)) {
        return 0;
    }
    if (v != floor(v) || fabs(v) > 2147483647.0) {
        fprintf(stderr, "nbgrad: error: %s expects an integer, got '%s'\n", flag, s);
        return 0;
    }
    *out = (long)v;
    return 1;
}

/* Whether s is a number (so that a value such as -90 is not taken for a flag). */
static int looks_numeric(const char *s)
{
    char *end;
    strtod(s, &end);
    return end != s && *end == '\0';
}

static int vec3(int argc, char **argv, int *i, double v[3])
{
    if (!need(argc, argv, *i, 3)) {
        return 0;
    }
    for (int j = 0; j < 3; ++j) {
        if (!nbg_cli_number(argv[*i], argv[*i + 1 + j], &v[j])) {
            return 0;
        }
    }
    *i += 3;
    return 1;
}

void nbg_cli_init(nbg_cli *c)
{
    memset(c, 0, sizeof *c);
    nbg_experiment_default(&c->e);
    c->scale = 0;
    c->adc = 40;
    c->pgmscale = 0;
    c->last_pivot = NBG_PIVOT_AUTO;
    c->backend = NBG_BACKEND_CPU;
    c->precision = NBG_DOUBLE;
    c->dumpfile = "Fdump.bin";
    nbg_limits_default(&c->limits);
}

void nbg_cli_free(nbg_cli *c)
{
    if (c->outs.n > 0) {
        fprintf(stderr, "nbgrad: nothing was written: the %d output%s prepared %s discarded and existing files are "
                "unchanged\n", c->outs.n, c->outs.n > 1 ? "s" : "", c->outs.n > 1 ? "are" : "is");
    }
    nbg_outset_abort(&c->outs); /* whatever was not committed: the targets stay as they were */
    nbg_hkl_free(&c->hkl);
    free(c->sources);
    free(c->mask);
}

/* Reads the SMV header of -mask / -img into the experiment, as the reference pre-scans them. */
static int ingest_header(nbg_ctx *ctx, nbg_cli *c, const char *path, int is_mask)
{
    nbg_smv_header h;
    uint16_t *data = NULL;
    if (nbg_read_smv(ctx, path, &h, is_mask ? &data : NULL) != NBG_OK) {
        fprintf(stderr, "nbgrad: error: %s: %s\n", is_mask ? "-mask" : "-img", nbg_errmsg(ctx));
        return 0;
    }
    /* header values that cannot describe an experiment are the file's fault: name it and the key */
    const struct {
        double v;
        const char *key;
        int strict; /* 1: must be > 0, 0: must be >= 0 */
    } keys[] = {{h.pixel, "PIXEL_SIZE", 1}, {h.distance, "DISTANCE", 1}, {h.close_distance, "CLOSE_DISTANCE", 1},
                {h.lambda, "WAVELENGTH", 1}, {h.osc, "OSC_RANGE", 0}};
    for (size_t k = 0; k < sizeof keys / sizeof keys[0]; ++k) {
        if (!isnan(keys[k].v) && (keys[k].strict ? !(keys[k].v > 0) : !(keys[k].v >= 0))) {
            fprintf(stderr, "nbgrad: error: %s %s: header %s=%g must be %s\n", is_mask ? "-mask" : "-img", path,
                    keys[k].key, keys[k].v, keys[k].strict ? "positive" : "non-negative");
            free(data);
            return 0;
        }
    }
    if (is_mask) {
        c->maskfile = path;
    } else {
        c->imgfile = path;
    }
    nbg_experiment *e = &c->e;
    e->fpixels = h.fpixels;
    e->spixels = h.spixels;
    if (!isnan(h.pixel)) {
        e->pixel = h.pixel;
    }
    const double detsize_s = e->pixel * h.spixels;
    if (!isnan(h.distance)) {
        e->distance = h.distance;
    }
    if (!isnan(h.close_distance)) {
        e->close_distance = h.close_distance;
    }
    if (!isnan(h.lambda)) {
        e->lambda = h.lambda;
    }
    if (!isnan(h.Xbeam)) {
        e->Xbeam = h.Xbeam;
    }
    if (!isnan(h.Ybeam)) {
        e->Ybeam = is_mask ? detsize_s - h.Ybeam : h.Ybeam;
    }
    if (!isnan(h.ORGX)) {
        e->ORGX = h.ORGX;
    }
    if (!isnan(h.ORGY)) {
        e->ORGY = h.ORGY;
    }
    if (!isnan(h.phi0)) {
        e->phi0 = h.phi0;
    }
    if (!isnan(h.osc)) {
        e->osc = h.osc;
    }
    if (is_mask) {
        const size_t n = (size_t)h.fpixels * (size_t)h.spixels;
        free(c->mask);
        c->mask = malloc(n ? n : 1);
        if (c->mask == NULL) {
            free(data);
            fprintf(stderr, "nbgrad: error: out of memory reading mask %s\n", path);
            return 0;
        }
        for (size_t i = 0; i < n; ++i) {
            c->mask[i] = data[i] != 0;
        }
        c->mask_f = h.fpixels;
        c->mask_s = h.spixels;
        free(data);
    }
    return 1;
}

int nbg_cli_parse(nbg_ctx *ctx, nbg_cli *c, int argc, char **argv, int first)
{
    nbg_experiment *e = &c->e;
    int custom = 0;
    /* -mask then -img are read first, whatever their place, so that flags override their headers */
    /* the memory limit applies to the files read here too */
    for (int i = first; i + 1 < argc; ++i) {
        double v;
        char *end;
        if (strcmp(argv[i], "-max_memory") == 0 && (v = strtod(argv[i + 1], &end)) > 0 && *end == '\0' && isfinite(v)) {
            nbg_limits l;
            nbg_ctx_limits(ctx, &l);
            l.max_bytes = v * 1073741824.0;
            nbg_ctx_set_limits(ctx, &l);
        }
    }
    for (int pass = 0; pass < 2; ++pass) {
        const char *want = pass == 0 ? "-mask" : "-img";
        for (int i = first; i < argc; ++i) {
            if (strcmp(argv[i], want) == 0) {
                if (!need(argc, argv, i, 1) || !ingest_header(ctx, c, argv[i + 1], pass == 0)) {
                    return 0;
                }
            }
        }
    }
    for (int i = first; i < argc; ++i) {
        const char *a = argv[i];
        double v;
        int n;
#define IS(name) (strcmp(a, name) == 0)
#define NUM(dst)                                                                                                  \
    do {                                                                                                          \
        if (!need(argc, argv, i, 1) || !nbg_cli_number(a, argv[i + 1], &v)) {                                  \
            return 0;                                                                                             \
        }                                                                                                         \
        (dst) = v;                                                                                                \
        ++i;                                                                                                      \
    } while (0)
#define INT(dst)                                                                                                  \
    do {                                                                                                          \
        if (!need(argc, argv, i, 1) || !integer(a, argv[i + 1], &n)) {                                          \
            return 0;                                                                                             \
        }                                                                                                         \
        (dst) = n;                                                                                                \
        ++i;                                                                                                      \
    } while (0)
#define COUNT(dst)                                                                                                \
    do {                                                                                                          \
        INT(dst);                                                                                                 \
        if (n < 1) {                                                                                              \
            fprintf(stderr, "nbgrad: error: %s must be a positive count, got %d\n", a, n);                        \
            return 0;                                                                                             \
        }                                                                                                         \
    } while (0)
#define STR(dst)                                                                                                  \
    do {                                                                                                          \
        if (!need(argc, argv, i, 1)) {                                                                            \
            return 0;                                                                                             \
        }                                                                                                         \
        (dst) = argv[++i];                                                                                        \
    } while (0)
        if (IS("-h") || IS("--help") || IS("-help")) {
            c->help = 1;
            return 1;
        }
        /* detector */
        else if (IS("-pixel")) NUM(e->pixel);
        else if (IS("-detsize")) { NUM(e->detsize_f); e->detsize_s = e->detsize_f; }
        else if (IS("-detsize_f")) NUM(e->detsize_f);
        else if (IS("-detsize_s")) NUM(e->detsize_s);
        else if (IS("-detpixels")) { COUNT(e->fpixels); e->spixels = e->fpixels; }
        else if (IS("-detpixels_f") || IS("-detpixels_x")) COUNT(e->fpixels);
        else if (IS("-detpixels_s") || IS("-detpixels_y")) COUNT(e->spixels);
        else if (IS("-distance")) { NUM(e->distance); c->last_pivot = NBG_PIVOT_BEAM; }
        else if (IS("-close_distance")) { NUM(e->close_distance); c->last_pivot = NBG_PIVOT_SAMPLE; }
        else if (IS("-mosflm")) { e->convention = NBG_CONV_MOSFLM; custom = 0; }
        else if (IS("-denzo")) { e->convention = NBG_CONV_DENZO; custom = 0; }
        else if (IS("-adxv")) { e->convention = NBG_CONV_ADXV; custom = 0; }
        else if (IS("-xds")) { e->convention = NBG_CONV_XDS; custom = 0; }
        else if (IS("-dials")) { e->convention = NBG_CONV_DIALS; custom = 0; }
        else if (IS("-fdet_vector")) { if (!vec3(argc, argv, &i, e->fdet)) return 0; custom = 1; }
        else if (IS("-sdet_vector")) { if (!vec3(argc, argv, &i, e->sdet)) return 0; custom = 1; }
        else if (IS("-odet_vector")) { if (!vec3(argc, argv, &i, e->odet)) return 0; custom = 1; }
        else if (IS("-beam_vector")) { if (!vec3(argc, argv, &i, e->beam)) return 0; custom = 1; }
        else if (IS("-polar_vector")) { if (!vec3(argc, argv, &i, e->polar_axis)) return 0; custom = 1; }
        else if (IS("-spindle_axis")) { if (!vec3(argc, argv, &i, e->spindle)) return 0; custom = 1; }
        else if (IS("-twotheta_axis")) { if (!vec3(argc, argv, &i, e->twotheta_axis)) return 0; custom = 1; }
        else if (IS("-pix0_vector") || IS("-pix0_vector_mm")) {
            double ignored[3];
            if (!vec3(argc, argv, &i, ignored)) return 0;
            custom = 1;
            fprintf(stderr, "nbgrad: note: %s only selects the custom convention; pix0 is derived from the beam "
                            "centre and distance (as nanoBragg does)\n", a);
        }
        else if (IS("-pivot")) {
            const char *p;
            STR(p);
            if (strcmp(p, "beam") == 0) c->last_pivot = NBG_PIVOT_BEAM;
            else if (strcmp(p, "sample") == 0) c->last_pivot = NBG_PIVOT_SAMPLE;
            else { fprintf(stderr, "nbgrad: error: -pivot expects beam or sample, got '%s'\n", p); return 0; }
        }
        else if (IS("-Xbeam")) { NUM(e->Xbeam); c->last_pivot = NBG_PIVOT_BEAM; }
        else if (IS("-Ybeam")) { NUM(e->Ybeam); c->last_pivot = NBG_PIVOT_BEAM; }
        else if (IS("-Xclose")) { NUM(e->Xclose); c->last_pivot = NBG_PIVOT_SAMPLE; }
        else if (IS("-Yclose")) { NUM(e->Yclose); c->last_pivot = NBG_PIVOT_SAMPLE; }
        else if (IS("-ORGX")) { NUM(e->ORGX); c->last_pivot = NBG_PIVOT_SAMPLE; }
        else if (IS("-ORGY")) { NUM(e->ORGY); c->last_pivot = NBG_PIVOT_SAMPLE; }
        else if (IS("-detector_rotx")) NUM(e->det_rot[0]);
        else if (IS("-detector_roty")) NUM(e->det_rot[1]);
        else if (IS("-detector_rotz")) NUM(e->det_rot[2]);
        else if (IS("-twotheta")) { NUM(e->twotheta); c->last_pivot = NBG_PIVOT_SAMPLE; }
        else if (IS("-curved_det")) e->curved = 1;
        else if (IS("-point_pixel")) e->point_pixel = 1;
        else if (IS("-roi")) {
            if (!need(argc, argv, i, 4)) return 0;
            for (int j = 0; j < 4; ++j) {
                if (!integer(a, argv[i + 1 + j], &e->roi[j])) return 0;
            }
            i += 4;
        }
        else if (IS("-mask") || IS("-img")) ++i; /* read above */
        else if (IS("-detector_thick")) NUM(e->thick);
        else if (IS("-detector_abs") || IS("-detector_absorb")) {
            if (!need(argc, argv, i, 1)) return 0;
            if (strstr(argv[i + 1], "inf") != NULL) {
                e->thick_abs = INFINITY;
                ++i;
            } else {
                NUM(e->thick_abs);
            }
        }
        else if (IS("-detector_thicksteps") || IS("-thicksteps")) COUNT(e->thicksteps);
        else if (IS("-oversample")) COUNT(e->oversample);
        else if (IS("-oversample_thick")) e->oversample_thick = 1;
        else if (IS("-oversample_polar")) e->oversample_polar = 1;
        else if (IS("-oversample_omega")) e->oversample_omega = 1;
        /* beam */
        else if (IS("-lambda") || IS("-wave")) NUM(e->lambda);
        else if (IS("-energy")) { NUM(v); e->lambda = 12398.42 / v; }
        else if (IS("-dispersion")) NUM(e->dispersion);
        else if (IS("-dispsteps")) COUNT(e->dispsteps);
        else if (IS("-divergence")) { NUM(e->hdivrange); e->vdivrange = e->hdivrange; }
        else if (IS("-hdivrange")) NUM(e->hdivrange);
        else if (IS("-vdivrange")) NUM(e->vdivrange);
        else if (IS("-hdivstep")) NUM(e->hdivstep);
        else if (IS("-vdivstep")) NUM(e->vdivstep);
        else if (IS("-hdivsteps")) COUNT(e->hdivsteps);
        else if (IS("-vdivsteps")) COUNT(e->vdivsteps);
        else if (IS("-divsteps")) { COUNT(e->hdivsteps); e->vdivsteps = e->hdivsteps; }
        else if (IS("-round_div")) e->round_div = 1;
        else if (IS("-square_div")) e->round_div = 0;
        else if (IS("-sourcefile")) STR(c->sourcefile);
        else if (IS("-polar")) { NUM(e->polarization); e->nopolar = 0; }
        else if (IS("-nopolar")) e->nopolar = 1;
        else if (IS("-fluence")) NUM(e->fluence);
        else if (IS("-flux")) NUM(e->flux);
        else if (IS("-exposure")) NUM(e->exposure);
        else if (IS("-beamsize")) NUM(e->beamsize);
        else if (IS("-water")) NUM(e->water);
        /* crystal */
        else if (IS("-cell")) {
            int got = 0;
            /* a value may be negative ("-cell 50 60 70 -90 90 90" is then refused by the cell check, by name) */
            while (got < 6 && i + 1 < argc && (argv[i + 1][0] != '-' || looks_numeric(argv[i + 1]))) {
                if (!nbg_cli_number(a, argv[i + 1], &e->cell[got])) return 0;
                ++got;
                ++i;
            }
            if (got == 0) {
                fprintf(stderr, "nbgrad: error: -cell needs a b c alpha beta gamma\n");
                return 0;
            }
            e->has_cell = 1;
        }
        else if (IS("-mat") || IS("-matrix")) STR(c->matfile);
        else if (IS("-misset")) {
            if (!need(argc, argv, i, 1)) return 0;
            if (strcmp(argv[i + 1], "random") == 0) {
                e->misset_random = 1;
                ++i;
            } else {
                if (!vec3(argc, argv, &i, e->misset)) return 0;
                e->misset_random = 0;
            }
        }
        else if (IS("-misset_seed")) { if (!need(argc, argv, i, 1) || !longint(a, argv[i + 1], &e->misset_seed)) return 0; ++i; c->have_misset_seed = 1; }
        else if (IS("-N")) { NUM(e->Na); e->Nb = e->Nc = e->Na; }
        else if (IS("-Na")) NUM(e->Na);
        else if (IS("-Nb")) NUM(e->Nb);
        else if (IS("-Nc")) NUM(e->Nc);
        else if (IS("-samplesize") || IS("-sample_size") || IS("-xtalsize") || IS("-xtal_size")) {
            NUM(e->sample_x);
            e->sample_y = e->sample_z = e->sample_x;
        }
        else if (IS("-sample_thick") || IS("-sample_x") || IS("-xtal_thick") || IS("-xtal_x")) NUM(e->sample_x);
        else if (IS("-sample_width") || IS("-sample_y") || IS("-width") || IS("-xtal_width") || IS("-xtal_y")) NUM(e->sample_y);
        else if (IS("-sample_height") || IS("-sample_heigh") || IS("-sample_z") || IS("-height") || IS("-heigh") ||
                 IS("-xtal_height") || IS("-xtal_heigh") || IS("-xtal_z")) NUM(e->sample_z);
        else if (IS("-square_xtal")) e->shape = NBG_SHAPE_SQUARE;
        else if (IS("-round_xtal")) e->shape = NBG_SHAPE_ROUND;
        else if (IS("-gauss_xtal")) e->shape = NBG_SHAPE_GAUSS;
        else if (IS("-binary_spots") || IS("-tophat_spots")) e->shape = NBG_SHAPE_TOPHAT;
        else if (IS("-fudge")) NUM(e->fudge);
        else if (IS("-phi")) NUM(e->phi0);
        else if (IS("-osc")) NUM(e->osc);
        else if (IS("-phistep")) NUM(e->phistep);
        else if (IS("-phisteps")) COUNT(e->phisteps);
        else if (IS("-mosaic")) NUM(e->mosaic);
        else if (IS("-mosaic_dom") || IS("-mosaic_domains")) {
            COUNT(e->mosaic_domains);
        }
        else if (IS("-mosaic_seed")) { if (!need(argc, argv, i, 1) || !longint(a, argv[i + 1], &e->mosaic_seed)) return 0; ++i; }
        else if (IS("-density") || IS("-sample_den") || IS("-MW") || IS("-molec")) {
            NUM(v);
            fprintf(stderr, "nbgrad: note: %s is accepted and ignored, as by nanoBragg\n", a);
        }
        else if (IS("-coherent")) fprintf(stderr, "nbgrad: note: -coherent is accepted and ignored, as by nanoBragg\n");
        /* structure factors */
        else if (IS("-hkl")) STR(c->hklfile);
        else if (IS("-default_F")) NUM(e->default_F);
        else if (IS("-interpolate")) e->interpolate = 1;
        else if (IS("-nointerpolate")) e->interpolate = 0;
        else if (IS("-dmin")) NUM(e->dmin);
        else if (IS("-dump")) STR(c->dumpfile);
        else if (IS("-nodump")) c->nodump = 1;
        else if (IS("-stol") || IS("-4stol") || IS("-Q") || IS("-stolout")) {
            const char *ignored;
            STR(ignored);
            fprintf(stderr, "nbgrad: note: %s %s is ignored (nanoBragg reads it but never uses it)\n", a, ignored);
        }
        /* output */
        else if (IS("-floatfile") || IS("-floatimage")) STR(c->floatfile);
        else if (IS("-intfile") || IS("-intimage")) STR(c->intfile);
        else if (IS("-pgmfile") || IS("-pgmimage")) STR(c->pgmfile);
        else if (IS("-noisefile") || IS("-noiseimage")) STR(c->noisefile);
        else if (IS("-scale")) NUM(c->scale);
        else if (IS("-adc")) NUM(c->adc);
        else if (IS("-pgmscale")) NUM(c->pgmscale);
        else if (IS("-nopgm")) c->nopgm = 1;
        else if (IS("-nonoise")) c->nonoise = 1;
        else if (IS("-seed")) { if (!need(argc, argv, i, 1) || !longint(a, argv[i + 1], &c->seed)) return 0; ++i; c->have_seed = 1; }
        else if (IS("-progress") || IS("-noprogress")) { /* no progress meter */ }
        /* nbgrad's own */
        else if (IS("-device")) {
            const char *d;
            STR(d);
            if (strcmp(d, "cpu") == 0) c->backend = NBG_BACKEND_CPU;
            else if (strcmp(d, "cuda") == 0) c->backend = NBG_BACKEND_CUDA;
            else if (strcmp(d, "auto") == 0) c->backend = NBG_BACKEND_AUTO;
            else { fprintf(stderr, "nbgrad: error: -device expects cpu, cuda or auto, got '%s'\n", d); return 0; }
        }
        else if (IS("-precision")) {
            const char *d;
            STR(d);
            if (strcmp(d, "double") == 0) c->precision = NBG_DOUBLE;
            else if (strcmp(d, "float") == 0) c->precision = NBG_FLOAT;
            else { fprintf(stderr, "nbgrad: error: -precision expects double or float, got '%s'\n", d); return 0; }
        }
        else if (IS("-threads")) {
            INT(c->threads);
            if (n < 0 || n > NBG_MAX_THREADS) {
                fprintf(stderr, "nbgrad: error: -threads must be 0 (the OpenMP default) to %d, got %d\n", NBG_MAX_THREADS, n);
                return 0;
            }
        }
        else if (IS("-max_memory")) {
            NUM(v);
            if (!(v > 0)) {
                fprintf(stderr, "nbgrad: error: -max_memory must be a positive number of GiB, got %g\n", v);
                return 0;
            }
            c->limits.max_bytes = v * 1073741824.0;
        }
        else if (IS("-max_samples")) {
            NUM(v);
            if (!(v > 0)) {
                fprintf(stderr, "nbgrad: error: -max_samples must be positive, got %g\n", v);
                return 0;
            }
            c->limits.max_samples = v;
        }
        else if (c->extra_handler != NULL && (n = c->extra_handler(c, argc, argv, i)) != 0) {
            if (n < 0) return 0;
            i += n - 1;
        }
        else if (IS("-printout") || IS("-printout_pixel") || IS("-trace_pixel") || IS("-dump_pixel")) {
            fprintf(stderr, "nbgrad: error: %s (nanoBragg's debug printout) is not supported\n", a);
            return 0;
        }
        else {
            fprintf(stderr, "nbgrad: error: unknown flag '%s' (nbgrad -h lists the flags)\n", a);
            return 0;
        }
        continue;
#undef IS
#undef NUM
#undef INT
#undef STR
#undef COUNT
    }
    if (custom) {
        e->convention = NBG_CONV_CUSTOM;
        /* nanoBragg honours pivot-setting flags in the custom convention only, the last one winning */
        e->pivot = c->last_pivot;
    }
    return 1;
}

int nbg_cli_load(nbg_ctx *ctx, nbg_cli *c)
{
    nbg_experiment *e = &c->e;
    if (c->matfile != NULL) {
        if (nbg_read_matrix(ctx, c->matfile, e->mat) != NBG_OK) {
            fprintf(stderr, "nbgrad: error: -mat: %s\n", nbg_errmsg(ctx));
            return 0;
        }
        e->has_mat = 1;
    }
    if (c->hklfile != NULL) {
        if (nbg_hkl_read(ctx, c->hklfile, e->default_F, &c->hkl) != NBG_OK) {
            fprintf(stderr, "nbgrad: error: -hkl: %s\n", nbg_errmsg(ctx));
            return 0;
        }
        e->hkl = &c->hkl;
        if (!c->nodump && nbg_hkl_write_fdump_set(ctx, &c->outs, c->dumpfile, &c->hkl) != NBG_OK) {
            fprintf(stderr, "nbgrad: warning: could not write the F cache: %s\n", nbg_errmsg(ctx));
        }
    } else if (!c->nodump && access(c->dumpfile, R_OK) == 0) {
        if (nbg_hkl_read_fdump(ctx, c->dumpfile, &c->hkl) != NBG_OK) {
            fprintf(stderr, "nbgrad: error: %s: %s\n", c->dumpfile, nbg_errmsg(ctx));
            return 0;
        }
        printf("reading structure factors from the cache %s (no -hkl given; -nodump ignores it)\n", c->dumpfile);
        e->hkl = &c->hkl;
    }
    if (c->sourcefile != NULL) {
        nbg_report r;
        double beam[3] = {1, 0, 0};
        /* the default source position is -10 m along the beam of the convention in use */
        nbg_experiment probe = *e;
        if (probe.hkl == NULL && probe.default_F == 0) {
            probe.default_F = 1;
        }
        if (nbg_describe(ctx, &probe, &r) == NBG_OK) {
            memcpy(beam, r.beam, sizeof beam);
        }
        if (nbg_read_sources(ctx, c->sourcefile, e->lambda, beam, &c->sources, &c->nsources) != NBG_OK) {
            fprintf(stderr, "nbgrad: error: -sourcefile: %s\n", nbg_errmsg(ctx));
            return 0;
        }
        e->sources = c->sources;
        e->nsources = c->nsources;
    }
    if (c->mask != NULL) {
        e->mask = c->mask;
    }
    if (e->misset_random && !c->have_misset_seed) {
        e->misset_seed = (long)time(NULL);
        printf("random misset seed: %ld (repeat with -misset_seed %ld)\n", e->misset_seed, e->misset_seed);
    }
    return 1;
}

/* --- statistics and outputs -------------------------------------------------------------------------------- */

void nbg_cli_stats(const nbg_cli *c, const nbg_report *r, const float *img, nbg_stats *st)
{
    const nbg_experiment *e = &c->e;
    const int F = r->fpixels, S = r->spixels;
    int x0 = e->roi[0] < 0 ? 0 : e->roi[0], x1 = e->roi[1] < 0 ? F : e->roi[1];
    int y0 = e->roi[2] < 0 ? 0 : e->roi[2], y1 = e->roi[3] < 0 ? S : e->roi[3];
    double sum = 0, sumsq = 0, max = 0;
    long n = 0, imax = -1;
    for (int s = y0; s <= y1 && s < S; ++s) {
        for (int f = x0; f <= x1 && f < F; ++f) {
            const long i = (long)s * F + f;
            if (e->mask != NULL && e->mask[i] == 0) {
                continue;
            }
            const double v = img[i];
            if (v > max) {
                max = v;
                imax = i;
            }
            sum += v;
            sumsq += v * v;
            ++n;
        }
    }
    const double nn = n > 0 ? (double)n : 1;
    const double mean = sum / nn;
    double dev = 0;
    long nall = 0;
    for (int s = y0; s <= y1 && s < S; ++s) {
        for (int f = x0; f <= x1 && f < F; ++f) {
            const double d = img[(long)s * F + f] - mean;
            dev += d * d;
            ++nall;
        }
    }
    st->max = max;
    st->imax = imax;
    st->sum = sum;
    st->n = n;
    st->mean = mean;
    st->rms = sqrt(sumsq / (n > 1 ? n - 1 : 1));
    st->rmsd = sqrt(dev / (nall > 1 ? nall - 1 : 1));
}

int nbg_cli_write_outputs(nbg_ctx *ctx, nbg_cli *c, const nbg_report *r, const float *img)
{
    const int F = r->fpixels, S = r->spixels;
    const size_t npix = (size_t)F * (size_t)S;
    nbg_stats st;
    nbg_cli_stats(c, r, img, &st);
    if (st.imax >= 0) {
        /* nanoBragg reports the position of the last subpixel of the brightest pixel */
        const int os = r->oversample;
        const double sub = r->pixel / 1000.0 / os;
        const long f = st.imax % F, s = st.imax / F;
        printf("max_I = %g  at %g %g\n", st.max, sub * ((double)f * os + os - 1) + sub / 2,
               sub * ((double)s * os + os - 1) + sub / 2);
    } else {
        printf("max_I = %g\n", st.max);
    }
    printf("mean= %g rms= %g rmsd= %g\n", st.mean, st.rms, st.rmsd);
    if (c->floatfile != NULL) {
        if (nbg_write_float_set(ctx, &c->outs, c->floatfile, img, npix) != NBG_OK) {
            fprintf(stderr, "nbgrad: error: %s\n", nbg_errmsg(ctx));
            return 0;
        }
        printf("wrote %s as %zu 4-byte floats\n", c->floatfile, npix);
    }
    double scale = c->scale;
    if (scale <= 0) {
        scale = st.max > 0 ? 55000.0 / st.max : 1.0;
    }
    nbg_smv_header h;
    nbg_smv_header_from_report(r, &h);
    uint16_t *buf = NULL;
    if (c->intfile != NULL || (c->noisefile != NULL && !c->nonoise)) {
        buf = malloc(sizeof(uint16_t) * (npix ? npix : 1));
        if (buf == NULL) {
            fprintf(stderr, "nbgrad: error: out of memory for the integer image\n");
            return 0;
        }
    }
    if (c->intfile != NULL) {
        if (nbg_int_image(ctx, img, F, S, c->e.roi, scale, c->adc, buf) != NBG_OK) {
            fprintf(stderr, "nbgrad: error: %s\n", nbg_errmsg(ctx));
            free(buf);
            return 0;
        }
        printf("intfile_scale = %g\n", scale);
        if (nbg_write_smv_set(ctx, &c->outs, c->intfile, &h, buf) != NBG_OK) {
            fprintf(stderr, "nbgrad: error: %s\n", nbg_errmsg(ctx));
            free(buf);
            return 0;
        }
        printf("wrote %s as 2-byte integers\n", c->intfile);
    }
    if (c->pgmfile != NULL && !c->nopgm) {
        double ps = c->pgmscale;
        if (ps <= 0) {
            ps = st.rmsd > 0 ? 250.0 / (5.0 * st.rmsd) : scale;
        }
        if (nbg_write_pgm_set(ctx, &c->outs, c->pgmfile, img, F, S, ps) != NBG_OK) {
            fprintf(stderr, "nbgrad: error: %s\n", nbg_errmsg(ctx));
            free(buf);
            return 0;
        }
        printf("wrote %s with pixels scaled by %g\n", c->pgmfile, ps);
    }
    if (c->noisefile != NULL && !c->nonoise) {
        long seed = c->seed;
        if (!c->have_seed) {
            seed = (long)time(NULL);
            printf("noise seed: %ld (repeat with -seed %ld)\n", seed, seed);
        }
        long photons = 0, overloads = 0;
        if (nbg_noise_image(ctx, img, F, S, c->e.roi, c->adc, seed, buf, &photons, &overloads) != NBG_OK) {
            fprintf(stderr, "nbgrad: error: %s\n", nbg_errmsg(ctx));
            free(buf);
            return 0;
        }
        printf("%ld photons on noise image (%ld overloads)\n", photons, overloads);
        if (nbg_write_smv_set(ctx, &c->outs, c->noisefile, &h, buf) != NBG_OK) {
            fprintf(stderr, "nbgrad: error: %s\n", nbg_errmsg(ctx));
            free(buf);
            return 0;
        }
        printf("wrote %s as 2-byte integers\n", c->noisefile);
    }
    free(buf);
    if (c->floatfile == NULL && c->intfile == NULL && (c->pgmfile == NULL || c->nopgm) &&
        (c->noisefile == NULL || c->nonoise)) {
        printf("no output file asked for (-floatfile, -intfile, -pgmfile, -noisefile)\n");
    }
    return 1;
}

void nbg_cli_print_setup(const nbg_cli *c, const nbg_report *r)
{
    static const char *conv[] = {"mosflm", "denzo", "adxv", "xds", "dials", "custom"};
    printf("nbgrad %s: %s convention, pivoting detector around %s\n", NBG_VERSION, conv[c->e.convention],
           r->pivot == NBG_PIVOT_SAMPLE ? "sample" : "direct beam spot");
    if (c->e.misset_random) {
        printf("random orientation misset angles: %f %f %f deg\n", r->misset_random_deg[0], r->misset_random_deg[1],
               r->misset_random_deg[2]);
    }
    printf("  unit cell: %g %g %g %g %g %g\n", r->cell[0], r->cell[1], r->cell[2], r->cell[3], r->cell[4],
           r->cell[5]);
    printf("  crystal: %g x %g x %g cells, %g mm largest\n", r->Na, r->Nb, r->Nc, r->xtal_size_max);
    if (r->interpolate) {
        printf("  tricubic interpolation of structure factors\n");
    }
    printf("  wavelength %g A, fluence %g photons/m^2\n", r->lambda, r->fluence);
    printf("  distance=%g mm close_distance=%g mm detector %dx%d pixels of %g mm\n", r->distance,
           r->close_distance, r->fpixels, r->spixels, r->pixel);
    printf("  Xbeam=%g Ybeam=%g Fbeam=%g Sbeam=%g Fclose=%g Sclose=%g mm ORGX=%g ORGY=%g\n", r->Xbeam, r->Ybeam,
           r->Fbeam, r->Sbeam, r->Fclose, r->Sclose, r->ORGX, r->ORGY);
    printf("  pix0 = %g %g %g m\n", r->pix0[0], r->pix0[1], r->pix0[2]);
    printf("  %d sources, %d mosaic domains, %d phi steps from %g to %g deg, %dx%d oversample, %d layers\n",
           r->nsources, r->mosaic_domains, r->phisteps, r->phi0, r->phi0 + r->osc, r->oversample, r->oversample,
           r->thicksteps);
    if (r->warn_oversample) {
        printf("WARNING: oversample %d is below the recommended %d\n", r->oversample, r->recommended_oversample);
    }
    if (r->warn_clipped_sample) {
        printf("WARNING: sample size clipped to the beam size\n");
    }
}

int nbg_cli_commit(nbg_ctx *ctx, nbg_cli *c)
{
    if (nbg_outset_commit(ctx, &c->outs) != NBG_OK) {
        fprintf(stderr, "nbgrad: error: %s\n", nbg_errmsg(ctx));
        return 0;
    }
    return 1;
}

/* --- the run's files ------------------------------------------------------------------------------------------ */

/* The canonical name of a file that may not exist yet: its real path, or its directory's real path and its name. */
static void canonical(const char *path, char *out, size_t size)
{
    char *r = realpath(path, NULL);
    if (r != NULL) {
        snprintf(out, size, "%s", r);
        free(r);
        return;
    }
    char dir[PATH_MAX];
    snprintf(dir, sizeof dir, "%s", path);
    char *slash = strrchr(dir, '/');
    const char *base = path;
    if (slash != NULL) {
        *slash = '\0';
        base = slash + 1;
    }
    r = realpath(slash == NULL ? "." : (dir[0] != '\0' ? dir : "/"), NULL);
    if (r != NULL) {
        snprintf(out, size, "%s/%s", strcmp(r, "/") == 0 ? "" : r, base);
        free(r);
    } else {
        snprintf(out, size, "%s", path);
    }
}

int nbg_cli_check_paths(const nbg_cli *c, const nbg_cli_path *extra, int n)
{
    nbg_cli_path p[32];
    int np = 0;
    const int fdump_out = c->hklfile != NULL && !c->nodump;
    const int fdump_in = c->hklfile == NULL && !c->nodump && access(c->dumpfile, R_OK) == 0;
    const nbg_cli_path own[] = {
        {"-hkl", c->hklfile, 0},         {"-mat", c->matfile, 0},          {"-sourcefile", c->sourcefile, 0},
        {"-mask", c->maskfile, 0},       {"-img", c->imgfile, 0},          {"-dump", fdump_in ? c->dumpfile : NULL, 0},
        {"-dump", fdump_out ? c->dumpfile : NULL, 1},                      {"-floatfile", c->floatfile, 1},
        {"-intfile", c->intfile, 1},     {"-pgmfile", c->nopgm ? NULL : c->pgmfile, 1},
        {"-noisefile", c->nonoise ? NULL : c->noisefile, 1},
    };
    for (size_t i = 0; i < sizeof own / sizeof own[0]; ++i) {
        if (own[i].path != NULL) {
            p[np++] = own[i];
        }
    }
    for (int i = 0; i < n && np < 32; ++i) {
        if (extra[i].path != NULL) {
            p[np++] = extra[i];
        }
    }
    char ca[PATH_MAX + 256], cb[PATH_MAX + 256];
    for (int i = 0; i < np; ++i) {
        /* an output whose directory is missing or not writable fails now rather than after the work */
        if (p[i].output && access(p[i].path, F_OK) != 0) {
            canonical(p[i].path, ca, sizeof ca);
            char *slash = strrchr(ca, '/');
            if (slash != NULL) {
                *slash = '\0';
            }
            if (slash != NULL && access(ca[0] != '\0' ? ca : "/", W_OK | X_OK) != 0) {
                fprintf(stderr, "nbgrad: error: cannot write %s %s: its directory %s %s\n", p[i].flag, p[i].path,
                        ca[0] != '\0' ? ca : "/", errno == ENOENT ? "does not exist" : "is not writable");
                return 0;
            }
        }
    }
    for (int i = 0; i < np; ++i) {
        struct stat st;
        /* a device or a FIFO (/dev/null, /dev/stdout) may be named as often as one likes */
        if (stat(p[i].path, &st) == 0 && !S_ISREG(st.st_mode) && !S_ISDIR(st.st_mode)) {
            continue;
        }
        canonical(p[i].path, ca, sizeof ca);
        for (int j = 0; j < i; ++j) {
            if (!p[i].output && !p[j].output) {
                continue;
            }
            canonical(p[j].path, cb, sizeof cb);
            if (strcmp(ca, cb) != 0) {
                continue;
            }
            if (p[i].output && p[j].output) {
                fprintf(stderr, "nbgrad: error: %s %s and %s %s name the same file: one output would overwrite the "
                        "other\n", p[j].flag, p[j].path, p[i].flag, p[i].path);
            } else {
                const nbg_cli_path *out = p[i].output ? &p[i] : &p[j], *in = p[i].output ? &p[j] : &p[i];
                fprintf(stderr, "nbgrad: error: the output %s %s is the input %s %s: it would be overwritten\n",
                        out->flag, out->path, in->flag, in->path);
            }
            return 0;
        }
    }
    return 1;
}
