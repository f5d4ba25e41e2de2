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
#include "formats.h"
#include "io.h"
#include "plan.h"

#include <errno.h>
#ifdef NBG_HAVE_FORMATS
#include <jansson.h>
#endif
#include <limits.h>
#include <stdarg.h>
#include <sys/stat.h>
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define RTD (180.0 / M_PI)

/* --- strict argument parsing ----------------------------------------------------------------------------- */

/* Whether a flag has the n values it needs among the nv that follow it. */
static int need(const char *flag, int nv, int n)
{
    if (nv < n) {
        fprintf(stderr, "nbgrad: error: %s needs %d value%s\n", flag, n, n > 1 ? "s" : "");
        return 0;
    }
    return 1;
}

int nbgi_cli_number(const char *flag, const char *s, double *out)
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
    if (!nbgi_cli_number(flag, s, &v)) {
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
    if (!nbgi_cli_number(flag, s, &v)) {
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

/* Reads n numbers into v. */
static int numbers(const char *flag, char **s, int n, double *v)
{
    for (int j = 0; j < n; ++j) {
        if (!nbgi_cli_number(flag, s[j], &v[j])) {
            return 0;
        }
    }
    return 1;
}

void nbgi_cli_init(nbgi_cli *c)
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
    c->filedata = NBGI_DATA_INT;
    c->polar_flag = NAN;
    nbg_limits_default(&c->limits);
}

void nbgi_cli_free(nbgi_cli *c)
{
    if (c->outs.n > 0) {
        fprintf(stderr, "nbgrad: nothing was written: the %d output%s prepared %s discarded and existing files are "
                "unchanged\n", c->outs.n, c->outs.n > 1 ? "s" : "", c->outs.n > 1 ? "are" : "is");
    }
    nbgi_outset_abort(&c->outs); /* whatever was not committed: the targets stay as they were */
    free(c->series);
    c->series = NULL;
    nbg_hkl_free(&c->hkl);
    free(c->sources);
    free(c->mask);
    free(c->panels);
    c->panels = NULL;
    free(c->geom_panels);
    c->geom_panels = NULL;
    free(c->motions);
    c->motions = NULL;
}

/* Reads -motions: "group shift_x shift_y shift_z rot_x rot_y rot_z" lines ('#' starts a comment) into c->motions;
 * prints the error naming the file and line. */
static int read_motions(nbg_ctx *ctx, nbgi_cli *c)
{
    FILE *f;
    if (nbgi_open_input(ctx, c->motionsfile, "-motions", "r", &f) != NBG_OK) {
        fprintf(stderr, "nbgrad: error: %s\n", nbg_errmsg(ctx));
        return 0;
    }
    char *line = NULL;
    size_t cap = 0;
    int ln = 0, ok = 1, got;
    while (ok && (got = nbgi_read_line(ctx, f, &line, &cap, c->motionsfile, ln + 1)) == 1) {
        ++ln; /* a line whole, whatever its length: a long comment stays a comment */
        char *hash = strchr(line, '#');
        if (hash != NULL) {
            *hash = '\0';
        }
        int g, used = 0;
        double v[6];
        char *p = line;
        while (*p == ' ' || *p == '\t') {
            ++p;
        }
        if (*p == '\n' || *p == '\r' || *p == '\0') {
            continue;
        }
        if (sscanf(p, "%d %lf %lf %lf %lf %lf %lf %n", &g, &v[0], &v[1], &v[2], &v[3], &v[4], &v[5], &used) != 7 ||
            p[used] != '\0') {
            fprintf(stderr, "nbgrad: error: -motions %s line %d: expected 'group shift_x shift_y shift_z rot_x rot_y "
                    "rot_z'\n", c->motionsfile, ln);
            ok = 0;
        } else if (g < 0 || g >= c->nmotions) {
            fprintf(stderr, "nbgrad: error: -motions %s line %d: group %d, and the detector has %d groups (0 to %d; "
                    "see -panel_groups)\n", c->motionsfile, ln, g, c->nmotions, c->nmotions - 1);
            ok = 0;
        } else {
            for (int k = 0; k < 6; ++k) {
                if (!isfinite(v[k])) {
                    fprintf(stderr, "nbgrad: error: -motions %s line %d: a value is not finite\n", c->motionsfile, ln);
                    ok = 0;
                }
            }
            memcpy(c->motions[g].shift, v, sizeof c->motions[g].shift);
            memcpy(c->motions[g].rot, v + 3, sizeof c->motions[g].rot);
        }
    }
    if (ok && got < 0) {
        fprintf(stderr, "nbgrad: error: -motions: %s\n", nbg_errmsg(ctx));
        ok = 0;
    }
    free(line);
    fclose(f);
    return ok;
}

int nbgi_cli_write_motions(nbg_ctx *ctx, nbgi_cli *c, const char *path)
{
    nbgi_out o;
    int rc = nbgi_out_open(ctx, path, &o);
    if (rc == NBG_OK) {
        fprintf(o.fp, "# group shift_x shift_y shift_z (mm) rot_x rot_y rot_z (deg): nbgrad -motions\n");
        for (int g = 0; g < c->nmotions; ++g) {
            const nbg_panel_motion *q = &c->motions[g];
            fprintf(o.fp, "%d %.12g %.12g %.12g %.12g %.12g %.12g\n", g, q->shift[0], q->shift[1], q->shift[2],
                    q->rot[0], q->rot[1], q->rot[2]);
        }
        rc = nbgi_out_finish(ctx, &o, &c->outs);
    }
    if (rc != NBG_OK) {
        fprintf(stderr, "nbgrad: error: %s\n", nbg_errmsg(ctx));
        return 0;
    }
    return 1;
}

/* Reads the SMV header of -mask / -img into the experiment, as the reference pre-scans them. */
static int ingest_header(nbg_ctx *ctx, nbgi_cli *c, const char *path, int is_mask)
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
    /* a header without SIZE1/SIZE2 (0: the file said nothing) leaves the counts unset: derived from -detsize */
    e->fpixels = h.fpixels > 0 ? h.fpixels : -1;
    e->spixels = h.spixels > 0 ? h.spixels : -1;
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

/* --- the flag table ---------------------------------------------------------------------------------------- */

/*
 * One table, flags[] below, drives the parser (nbgi_cli_parse), the help (nbgi_cli_usage) and the manual's list of
 * flags in docs/flags.md (nbgi_cli_flags_markdown, printed by the hidden option `nbgrad --flags-markdown` together
 * with the subcommands' own flags: the tables of src/main.c (grad, gradcheck, refine), src/ensemble.c and src/batch.c
 * (batch, shots), nbgi_sub_flag entries, which also drive each subcommand's -h).  After changing any of these tables,
 * regenerate the generated section of docs/flags.md (tests/test-flags.c fails until it matches):
 *
 *   make build/nbgrad && build/nbgrad --flags-markdown > build/flags.md &&
 *   awk 'FNR == NR { g = g $0 "\n"; next } /^<!-- BEGIN FLAGS/ { printf "%s", g; skip = 1 } !skip { print }
 *        /^<!-- END FLAGS/ { skip = 0 }' build/flags.md docs/flags.md > build/flags-doc.md &&
 *   cp build/flags-doc.md docs/flags.md
 *
 * An entry holds the flag's names (the main one first, then its aliases, space-separated), its kind (how many
 * values it takes and how they are converted), where it stores them (E(field) in the experiment, C(field) in
 * nbgi_cli; 0: nowhere, the values are read and dropped), its side effects, and its documentation: a help group,
 * the name of its values and a one-line help with the unit.
 */
typedef enum {
    K_SWITCH,  /* no value: stores .value (an int or enum field) */
    K_NUM,     /* .n numbers (1 when 0) into consecutive double fields */
    K_INT,     /* .n integers (1 when 0) into consecutive int fields */
    K_COUNT,   /* a positive integer into an int field */
    K_LONG,    /* an integer into a long field */
    K_STR,     /* a string (a file name) into a const char * field */
    K_CHOICE,  /* one of the words of .choices into an int or enum field: the corresponding entry of .values */
    K_FN,      /* .fn reads the values, after the parser has checked that at least .n of them follow */
    K_HELP,    /* stop parsing: the caller prints the usage */
    K_REFUSED, /* an error (nanoBragg's debug printouts), unless a subcommand's extra_handler takes the flag */
} flag_kind;

typedef enum { G_CRYSTAL, G_F, G_BEAM, G_DETECTOR, G_OUTPUT, G_NBGRAD, G_IGNORED, G_REFUSED, G_COUNT } flag_group;

static const char *const group_title[G_COUNT] = {
    "crystal", "structure factors", "beam", "detector", "output", "nbgrad's own",
    "accepted and ignored, as by nanoBragg", "refused",
};

/* Reads a flag's values: v holds the nv arguments that follow it.  Returns how many it used, or -1 after printing
 * an error. */
typedef int (*flag_fn)(nbgi_cli *c, const char *flag, int nv, char **v);

typedef struct {
    const char *names;
    flag_kind kind;
    size_t off;          /* where the values go, E() or C(); 0: nowhere */
    int n;               /* K_NUM, K_INT: how many values (at most 4); K_FN: how many at least */
    int value;           /* K_SWITCH: the value stored */
    const char *choices; /* K_CHOICE: the words accepted, space-separated */
    int values[3];       /* K_CHOICE: the value each word stores */
    flag_fn fn;          /* K_FN */
    /* side effects */
    size_t also[2];      /* the (first) value is stored in these fields too: -N sets Nb and Nc */
    size_t set;          /* an int field set to .setv: -polar sets nopolar = 0, -seed have_seed = 1 */
    int setv;
    nbg_pivot pivot;     /* the pivot the flag chooses (honoured in the custom convention only, the last wins) */
    int custom;          /* 1: selects the custom convention; -1: a named one */
    const char *note;    /* printed to stderr after the flag (and its value, for a string read and dropped) */
    /* documentation */
    flag_group group;
    const char *arg, *help;
} cli_flag;

/* Offsets into nbgi_cli, plus one so that 0 means "nowhere". */
#define E(field) (offsetof(nbgi_cli, e.field) + 1)
#define C(field) (offsetof(nbgi_cli, field) + 1)

static void *field_at(nbgi_cli *c, size_t off)
{
    return (char *)c + off - 1;
}

/* enumerations are stored as int */
_Static_assert(sizeof(nbg_convention) == sizeof(int) && sizeof(nbg_shape) == sizeof(int) &&
                   sizeof(nbg_backend) == sizeof(int) && sizeof(nbg_precision) == sizeof(int),
               "enumerations stored through int");

static int fn_cell(nbgi_cli *c, const char *flag, int nv, char **v)
{
    int got = 0;
    /* a value may be negative ("-cell 50 60 70 -90 90 90" is then refused by the cell check, by name) */
    while (got < 6 && got < nv && (v[got][0] != '-' || looks_numeric(v[got]))) {
        if (!nbgi_cli_number(flag, v[got], &c->e.cell[got])) {
            return -1;
        }
        ++got;
    }
    if (got == 0) {
        fprintf(stderr, "nbgrad: error: -cell needs a b c alpha beta gamma\n");
        return -1;
    }
    c->e.has_cell = 1;
    return got;
}

static int fn_misset(nbgi_cli *c, const char *flag, int nv, char **v)
{
    if (strcmp(v[0], "random") == 0) {
        c->e.misset_random = 1;
        return 1;
    }
    if (!need(flag, nv, 3) || !numbers(flag, v, 3, c->e.misset)) {
        return -1;
    }
    c->e.misset_random = 0;
    return 3;
}

static int fn_space_group(nbgi_cli *c, const char *flag, int nv, char **v)
{
    (void)nv;
    nbg_cell_constraints cc;
    if (strlen(v[0]) >= sizeof c->e.space_group || nbg_cell_constraints_get(NULL, v[0], &cc) != NBG_OK) {
        fprintf(stderr, "nbgrad: error: %s '%s': not a Hermann-Mauguin symbol (\"P 43 21 2\", \"P43212\", \"C 1 2/c "
                "1\", \"R 3 :R\"), a Hall symbol (\" P 4nw 2abw\", \"Hall: P 2y\") or a number 1-230\n", flag, v[0]);
        return -1;
    }
    snprintf(c->e.space_group, sizeof c->e.space_group, "%s", v[0]);
    return 1;
}

static int fn_detector_abs(nbgi_cli *c, const char *flag, int nv, char **v)
{
    if (strstr(v[0], "inf") != NULL) {
        c->e.thick_abs = INFINITY;
        return 1;
    }
    return nbgi_cli_number(flag, v[0], &c->e.thick_abs) ? 1 : -1;
}

static int fn_energy(nbgi_cli *c, const char *flag, int nv, char **v)
{
    double eV;
    if (!nbgi_cli_number(flag, v[0], &eV)) {
        return -1;
    }
    c->e.lambda = 12398.42 / eV;
    return 1;
}

static int fn_threads(nbgi_cli *c, const char *flag, int nv, char **v)
{
    int n;
    if (!integer(flag, v[0], &n)) {
        return -1;
    }
    if (n < 0 || n > NBG_MAX_THREADS) {
        fprintf(stderr, "nbgrad: error: -threads must be 0 (the OpenMP default) to %d, got %d\n", NBG_MAX_THREADS, n);
        return -1;
    }
    c->threads = n;
    return 1;
}

static int fn_max_memory(nbgi_cli *c, const char *flag, int nv, char **v)
{
    double x;
    if (!nbgi_cli_number(flag, v[0], &x)) {
        return -1;
    }
    if (!(x > 0)) {
        fprintf(stderr, "nbgrad: error: -max_memory must be a positive number of GiB, got %g\n", x);
        return -1;
    }
    c->limits.max_bytes = x * 1073741824.0;
    return 1;
}

static int fn_max_samples(nbgi_cli *c, const char *flag, int nv, char **v)
{
    double x;
    if (!nbgi_cli_number(flag, v[0], &x)) {
        return -1;
    }
    if (!(x > 0)) {
        fprintf(stderr, "nbgrad: error: -max_samples must be positive, got %g\n", x);
        return -1;
    }
    c->limits.max_samples = x;
    return 1;
}

#define CUSTOM_AXIS(name, fld, what, grp)                                                                         \
    {name, K_NUM, E(fld), .n = 3, .custom = 1, .group = grp, .arg = "x y z",                                    \
     .help = what " (selects the custom convention)"}
#define CONVENTION(name, conv, what)                                                                              \
    {name, K_SWITCH, E(convention), .value = conv, .custom = -1, .group = G_DETECTOR, .help = what}
#define IGNORED_NOTE " is accepted and ignored, as by nanoBragg"

static const cli_flag flags[] = {
    /* crystal */
    {"-cell", K_FN, .fn = fn_cell, .group = G_CRYSTAL, .arg = "a b c alpha beta gamma",
     .help = "unit cell: lengths in A, angles in deg"},
    {"-expt", K_STR, C(exptin), .group = G_DETECTOR, .arg = "file",
     .help = "a DIALS experiment list (one experiment, any number of panels): its detector, beam, goniometer, scan "
             "and crystal replace the flags'"},
    {"-setting", K_STR, C(settingin), .group = G_CRYSTAL, .arg = "file",
     .help = "re-express the crystal of -expt in the basis of the crystal of this experiment list (the same "
             "lattice, e.g. the data's true setting where DIALS chose another): N, the structure factors' indices "
             "and the refined cell then refer to that basis; the change of basis is printed"},
    {"-mat -matrix", K_STR, C(matfile), .group = G_CRYSTAL, .arg = "file",
     .help = "MOSFLM A matrix (at the wavelength): the orientation, and the cell without -cell"},
    {"-misset", K_FN, .n = 1, .fn = fn_misset, .group = G_CRYSTAL, .arg = "rx ry rz | random",
     .help = "misset rotations about x, y, z, deg; random: drawn from -misset_seed"},
    {"-misset_seed", K_LONG, E(misset_seed), .set = C(have_misset_seed), .setv = 1, .group = G_CRYSTAL,
     .arg = "n", .help = "seed of -misset random (a run without one prints the seed it drew)"},
    {"-space_group", K_FN, .n = 1, .fn = fn_space_group, .group = G_CRYSTAL, .arg = "symbol",
     .help = "the crystal's space group (Hermann-Mauguin \"P 43 21 2\" or P43212, a Hall symbol, or its number): a "
             "refinement of the cell fits only the parameters its lattice leaves free (tetragonal: a = b and c; "
             "wins over -expt's)"},
    {"-N", K_NUM, E(Na), .also = {E(Nb), E(Nc)}, .group = G_CRYSTAL, .arg = "n",
     .help = "crystal size in unit cells along a, b and c (need not be an integer)"},
    {"-Na", K_NUM, E(Na), .group = G_CRYSTAL, .arg = "n", .help = "unit cells along a"},
    {"-Nb", K_NUM, E(Nb), .group = G_CRYSTAL, .arg = "n", .help = "unit cells along b"},
    {"-Nc", K_NUM, E(Nc), .group = G_CRYSTAL, .arg = "n", .help = "unit cells along c"},
    {"-samplesize -sample_size -xtalsize -xtal_size", K_NUM, E(sample_x), .also = {E(sample_y), E(sample_z)},
     .group = G_CRYSTAL, .arg = "mm", .help = "crystal size along x, y and z, mm (sets N; 0: use -N)"},
    {"-sample_thick -sample_x -xtal_thick -xtal_x", K_NUM, E(sample_x), .group = G_CRYSTAL, .arg = "mm",
     .help = "crystal size along x, mm"},
    {"-sample_width -sample_y -width -xtal_width -xtal_y", K_NUM, E(sample_y), .group = G_CRYSTAL, .arg = "mm",
     .help = "crystal size along y, mm"},
    {"-sample_height -sample_heigh -sample_z -height -heigh -xtal_height -xtal_heigh -xtal_z", K_NUM, E(sample_z),
     .group = G_CRYSTAL, .arg = "mm", .help = "crystal size along z, mm"},
    {"-square_xtal", K_SWITCH, E(shape), .value = NBG_SHAPE_SQUARE, .group = G_CRYSTAL,
     .help = "parallelepiped crystal: the sinc lattice factor (the default)"},
    {"-round_xtal", K_SWITCH, E(shape), .value = NBG_SHAPE_ROUND, .group = G_CRYSTAL,
     .help = "spherical crystal"},
    {"-gauss_xtal", K_SWITCH, E(shape), .value = NBG_SHAPE_GAUSS, .group = G_CRYSTAL,
     .help = "Gaussian lattice factor"},
    {"-tophat_spots -binary_spots", K_SWITCH, E(shape), .value = NBG_SHAPE_TOPHAT, .group = G_CRYSTAL,
     .help = "tophat lattice factor: uniform spots"},
    {"-fudge", K_NUM, E(fudge), .group = G_CRYSTAL, .arg = "x", .help = "shape fudge factor (1)"},
    {"-mosaic", K_NUM, E(mosaic), .group = G_CRYSTAL, .arg = "deg", .help = "mosaic spread, deg"},
    {"-mosaic_dom -mosaic_domains", K_COUNT, E(mosaic_domains), .group = G_CRYSTAL, .arg = "n",
     .help = "mosaic domains"},
    {"-mosaic_seed", K_LONG, E(mosaic_seed), .group = G_CRYSTAL, .arg = "n",
     .help = "seed of the mosaic domains' orientations"},
    {"-phi", K_NUM, E(phi0), .group = G_CRYSTAL, .arg = "deg", .help = "spindle angle at the start, deg"},
    {"-spindle_tilt", K_NUM, E(spindle_tilt), .n = 2, .group = G_CRYSTAL, .arg = "t1 t2",
     .help = "turns the rotation axis by t1 deg about unit(axis x beam), then t2 deg about axis x that (refinable as "
             "spindle_tilt1, spindle_tilt2)"},
    {"-osc", K_NUM, E(osc), .group = G_CRYSTAL, .arg = "deg", .help = "rotation range, deg"},
    {"-phistep", K_NUM, E(phistep), .group = G_CRYSTAL, .arg = "deg", .help = "rotation step, deg"},
    {"-phisteps", K_COUNT, E(phisteps), .group = G_CRYSTAL, .arg = "n", .help = "rotation steps"},
    CUSTOM_AXIS("-spindle_axis", spindle, "rotation axis", G_CRYSTAL),

    /* structure factors */
    {"-hkl", K_STR, C(hklfile), .group = G_F, .arg = "file",
     .help = "structure factors: \"h k l F\" lines (a 5th and 6th column and # comments are allowed)"},
    {"-default_F", K_NUM, E(default_F), .group = G_F, .arg = "F",
     .help = "F of every reflection the -hkl table does not list (0)"},
    {"-interpolate", K_SWITCH, E(interpolate), .value = 1, .group = G_F,
     .help = "tricubic interpolation of F (default: on when an N is at most 2)"},
    {"-nointerpolate", K_SWITCH, E(interpolate), .value = 0, .group = G_F, .help = "no interpolation of F"},
    {"-dmin", K_NUM, E(dmin), .group = G_F, .arg = "A", .help = "resolution limit, A: no intensity beyond (0: none)"},
    {"-dump", K_STR, C(dumpfile), .group = G_F, .arg = "file",
     .help = "the F cache, written with -hkl and read without it (Fdump.bin)"},
    {"-nodump", K_SWITCH, C(nodump), .value = 1, .group = G_F, .help = "neither write nor read the F cache"},

    /* beam */
    {"-lambda -wave", K_NUM, E(lambda), .group = G_BEAM, .arg = "A", .help = "wavelength, A (1)"},
    {"-energy", K_FN, .n = 1, .fn = fn_energy, .group = G_BEAM, .arg = "eV",
     .help = "photon energy, eV: sets the wavelength to 12398.42 / eV A"},
    {"-dispersion", K_NUM, E(dispersion), .group = G_BEAM, .arg = "%", .help = "spectral width, percent"},
    {"-dispsteps", K_COUNT, E(dispsteps), .group = G_BEAM, .arg = "n", .help = "wavelengths across the width"},
    {"-divergence", K_NUM, E(hdivrange), .also = {E(vdivrange)}, .group = G_BEAM, .arg = "mrad",
     .help = "horizontal and vertical divergence range, mrad"},
    {"-hdivrange", K_NUM, E(hdivrange), .group = G_BEAM, .arg = "mrad", .help = "horizontal divergence range, mrad"},
    {"-vdivrange", K_NUM, E(vdivrange), .group = G_BEAM, .arg = "mrad", .help = "vertical divergence range, mrad"},
    {"-hdivstep", K_NUM, E(hdivstep), .group = G_BEAM, .arg = "mrad", .help = "horizontal divergence step, mrad"},
    {"-vdivstep", K_NUM, E(vdivstep), .group = G_BEAM, .arg = "mrad", .help = "vertical divergence step, mrad"},
    {"-divsteps", K_COUNT, E(hdivsteps), .also = {E(vdivsteps)}, .group = G_BEAM, .arg = "n",
     .help = "divergence steps, horizontal and vertical"},
    {"-hdivsteps", K_COUNT, E(hdivsteps), .group = G_BEAM, .arg = "n", .help = "horizontal divergence steps"},
    {"-vdivsteps", K_COUNT, E(vdivsteps), .group = G_BEAM, .arg = "n", .help = "vertical divergence steps"},
    {"-round_div", K_SWITCH, E(round_div), .value = 1, .group = G_BEAM,
     .help = "elliptical cut of the divergence grid (the default)"},
    {"-square_div", K_SWITCH, E(round_div), .value = 0, .group = G_BEAM, .help = "the whole divergence grid"},
    {"-sourcefile", K_STR, C(sourcefile), .group = G_BEAM, .arg = "file",
     .help = "sources: \"X Y Z weight lambda(m)\" lines (# comments are allowed)"},
    CUSTOM_AXIS("-beam_vector", beam, "beam direction", G_BEAM),
    {"-polar", K_NUM, E(polarization), .also = {C(polar_flag)}, .set = E(nopolar), .setv = 0, .group = G_BEAM,
     .arg = "K", .help = "Kahn polarization factor (0; given with -expt, it replaces the list's)"},
    {"-nopolar", K_SWITCH, E(nopolar), .value = 1, .group = G_BEAM, .help = "polarization factor fixed at 1"},
    CUSTOM_AXIS("-polar_vector", polar_axis, "polarization axis", G_BEAM),
    {"-fluence", K_NUM, E(fluence), .group = G_BEAM, .arg = "photons/m^2", .help = "photons per area"},
    {"-flux", K_NUM, E(flux), .group = G_BEAM, .arg = "photons/s",
     .help = "flux: with -exposure and -beamsize, sets the fluence (0: use -fluence)"},
    {"-exposure", K_NUM, E(exposure), .group = G_BEAM, .arg = "s", .help = "exposure time, s (1)"},
    {"-beamsize", K_NUM, E(beamsize), .group = G_BEAM, .arg = "mm", .help = "beam size, mm (0.1)"},
    {"-water", K_NUM, E(water), .group = G_BEAM, .arg = "um", .help = "water layer in the beam (background), um"},

    /* detector */
    {"-pixel", K_NUM, E(pixel), .group = G_DETECTOR, .arg = "mm", .help = "pixel size, mm (0.1)"},
    {"-detpixels", K_COUNT, E(fpixels), .also = {E(spixels)}, .group = G_DETECTOR, .arg = "n",
     .help = "pixels along both axes"},
    {"-detpixels_f -detpixels_x", K_COUNT, E(fpixels), .group = G_DETECTOR, .arg = "n",
     .help = "pixels along the fast axis"},
    {"-detpixels_s -detpixels_y", K_COUNT, E(spixels), .group = G_DETECTOR, .arg = "n",
     .help = "pixels along the slow axis"},
    {"-detsize", K_NUM, E(detsize_f), .also = {E(detsize_s)}, .group = G_DETECTOR, .arg = "mm",
     .help = "detector size along both axes, mm, when no pixel count is given (102.4)"},
    {"-detsize_f", K_NUM, E(detsize_f), .group = G_DETECTOR, .arg = "mm", .help = "detector size along the fast axis, mm"},
    {"-detsize_s", K_NUM, E(detsize_s), .group = G_DETECTOR, .arg = "mm", .help = "detector size along the slow axis, mm"},
    {"-distance", K_NUM, E(distance), .pivot = NBG_PIVOT_BEAM, .group = G_DETECTOR, .arg = "mm",
     .help = "sample to the direct-beam spot along the beam, mm (100)"},
    {"-close_distance", K_NUM, E(close_distance), .pivot = NBG_PIVOT_SAMPLE, .group = G_DETECTOR, .arg = "mm",
     .help = "sample to the detector plane along its normal, mm"},
    CONVENTION("-mosflm", NBG_CONV_MOSFLM, "MOSFLM convention (the default)"),
    CONVENTION("-denzo", NBG_CONV_DENZO, "DENZO convention"),
    CONVENTION("-adxv", NBG_CONV_ADXV, "ADXV convention"),
    CONVENTION("-xds", NBG_CONV_XDS, "XDS convention (pivot sample; beam centre from -ORGX -ORGY)"),
    CONVENTION("-dials", NBG_CONV_DIALS, "DIALS convention (pivot sample; beam centre from -ORGX -ORGY)"),
    {"-Xbeam", K_NUM, E(Xbeam), .pivot = NBG_PIVOT_BEAM, .group = G_DETECTOR, .arg = "mm",
     .help = "beam centre, mm, as the convention defines it"},
    {"-Ybeam", K_NUM, E(Ybeam), .pivot = NBG_PIVOT_BEAM, .group = G_DETECTOR, .arg = "mm",
     .help = "beam centre, mm, as the convention defines it"},
    {"-Xclose", K_NUM, E(Xclose), .pivot = NBG_PIVOT_SAMPLE, .group = G_DETECTOR, .arg = "mm",
     .help = "the detector point nearest the sample, mm"},
    {"-Yclose", K_NUM, E(Yclose), .pivot = NBG_PIVOT_SAMPLE, .group = G_DETECTOR, .arg = "mm",
     .help = "the detector point nearest the sample, mm"},
    {"-ORGX", K_NUM, E(ORGX), .pivot = NBG_PIVOT_SAMPLE, .group = G_DETECTOR, .arg = "px",
     .help = "XDS origin, fast pixel coordinate"},
    {"-ORGY", K_NUM, E(ORGY), .pivot = NBG_PIVOT_SAMPLE, .group = G_DETECTOR, .arg = "px",
     .help = "XDS origin, slow pixel coordinate"},
    CUSTOM_AXIS("-fdet_vector", fdet, "detector fast axis", G_DETECTOR),
    CUSTOM_AXIS("-sdet_vector", sdet, "detector slow axis", G_DETECTOR),
    CUSTOM_AXIS("-odet_vector", odet, "detector normal", G_DETECTOR),
    {"-pix0_vector -pix0_vector_mm", K_NUM, 0, .n = 3, .custom = 1,
     .note = " only selects the custom convention; pix0 is derived from the beam centre and distance (as nanoBragg "
             "does)",
     .group = G_DETECTOR, .arg = "x y z",
     .help = "only selects the custom convention: pix0 follows the beam centre and distance"},
    {"-pivot", K_CHOICE, C(last_pivot), .choices = "beam sample", .values = {NBG_PIVOT_BEAM, NBG_PIVOT_SAMPLE},
     .group = G_DETECTOR, .arg = "beam|sample", .help = "the detector's rotation pivot (custom convention only)"},
    {"-detector_rotx", K_NUM, E(det_rot[0]), .group = G_DETECTOR, .arg = "deg", .help = "detector rotation about x, deg"},
    {"-detector_roty", K_NUM, E(det_rot[1]), .group = G_DETECTOR, .arg = "deg", .help = "detector rotation about y, deg"},
    {"-detector_rotz", K_NUM, E(det_rot[2]), .group = G_DETECTOR, .arg = "deg", .help = "detector rotation about z, deg"},
    {"-twotheta", K_NUM, E(twotheta), .pivot = NBG_PIVOT_SAMPLE, .group = G_DETECTOR, .arg = "deg",
     .help = "detector swing about the two-theta axis, deg"},
    CUSTOM_AXIS("-twotheta_axis", twotheta_axis, "two-theta axis", G_DETECTOR),
    {"-curved_det", K_SWITCH, E(curved), .value = 1, .group = G_DETECTOR,
     .help = "every pixel at the same distance from the sample"},
    {"-point_pixel", K_SWITCH, E(point_pixel), .value = 1, .group = G_DETECTOR,
     .help = "solid angle 1/R^2, no obliquity factor"},
    {"-roi", K_INT, E(roi), .n = 4, .group = G_DETECTOR, .arg = "xmin xmax ymin ymax",
     .help = "the pixels rendered, inclusive"},
    {"-layout", K_STR, C(layout), .group = G_DETECTOR, .arg = "name",
     .help = "a built-in multi-panel detector (pilatus6m, eiger2_16m, jungfrau16m, cspad) in the plane that the "
             "detector flags place; sets -pixel and the plane's pixel counts; the image is the panels' concatenation"},
    {"-panel_groups", K_CHOICE, C(panel_groups), .choices = "modules panels detector",
     .values = {NBGI_GROUPS_MODULES, NBGI_GROUPS_PANELS, NBGI_GROUPS_DETECTOR}, .group = G_DETECTOR,
     .arg = "modules|panels|detector",
     .help = "which panels move together in -motions and the panel parameters (-params panel_shift, panel_rot, "
             "g<k>.shift_x ...): the layout's modules or a DIALS list's groups (each panel's parent group in its "
             "hierarchy; a panel under the root alone), every panel alone, or the whole detector (modules)"},
    {"-motions", K_STR, C(motionsfile), .group = G_DETECTOR, .arg = "file",
     .help = "rigid motions of the panel groups, a line each: group shift_x shift_y shift_z (mm) rot_x rot_y rot_z "
             "(deg), along and about the panels' frame axes (the detector plane's fast, slow, normal for a layout), "
             "turned about the group's centre; groups not listed stay (refine -motionsfile writes this format)"},
    {"-mask", K_STR, 0, .group = G_DETECTOR, .arg = "file",
     .help = "SMV mask, 0 skips a pixel; its header, read first, sets the detector"},
    {"-img", K_STR, 0, .group = G_DETECTOR, .arg = "file",
     .help = "SMV image whose header, read first, sets the detector"},
    {"-detector_thick", K_NUM, E(thick), .group = G_DETECTOR, .arg = "um", .help = "sensor thickness, um (0: none)"},
    {"-detector_abs -detector_absorb", K_FN, .n = 1, .fn = fn_detector_abs, .group = G_DETECTOR, .arg = "um|inf",
     .help = "sensor attenuation length, um (inf or 0: no absorption)"},
    {"-thicksteps -detector_thicksteps", K_COUNT, E(thicksteps), .group = G_DETECTOR, .arg = "n",
     .help = "sensor layers"},
    {"-oversample", K_COUNT, E(oversample), .group = G_DETECTOR, .arg = "n", .help = "subpixels per pixel axis"},
    {"-oversample_thick", K_SWITCH, E(oversample_thick), .value = 1, .group = G_DETECTOR,
     .help = "sensor capture at every subpixel (nanoBragg's running-sum semantics)"},
    {"-oversample_polar", K_SWITCH, E(oversample_polar), .value = 1, .group = G_DETECTOR,
     .help = "polarization at every subpixel (nanoBragg's running-sum semantics)"},
    {"-oversample_omega", K_SWITCH, E(oversample_omega), .value = 1, .group = G_DETECTOR,
     .help = "solid angle at every subpixel (nanoBragg's running-sum semantics)"},

    /* output */
    {"-floatfile -floatimage", K_STR, C(floatfile), .group = G_OUTPUT, .arg = "file",
     .help = "the image as 4-byte floats"},
    {"-intfile -intimage", K_STR, C(intfile), .group = G_OUTPUT, .arg = "file",
     .help = "the image as an SMV file of 2-byte integers"},
    {"-pgmfile -pgmimage", K_STR, C(pgmfile), .group = G_OUTPUT, .arg = "file", .help = "the image as an 8-bit PGM"},
    {"-noisefile -noiseimage", K_STR, C(noisefile), .group = G_OUTPUT, .arg = "file",
     .help = "the image with Poisson noise, as an SMV file"},
    {"-nxsfile -nexusfile", K_STR, C(nxsfile), .group = G_OUTPUT, .arg = "file",
     .help = "the image(s) with the whole geometry as NeXus NXmx (HDF5), every frame in one file (with panels: "
             "one module per panel)"},
    {"-cbffile", K_STR, C(cbffile), .group = G_OUTPUT, .arg = "file",
     .help = "the image as a full CBF (imgCIF with the axes; byte-offset 4-byte integers)"},
    {"-exptfile", K_STR, C(exptfile), .group = G_OUTPUT, .arg = "file",
     .help = "the experiment as a DIALS experiment list (the ground truth, crystal included; every panel)"},
    {"-data", K_CHOICE, C(filedata), .choices = "int float noise",
     .values = {NBGI_DATA_INT, NBGI_DATA_FLOAT, NBGI_DATA_NOISE}, .group = G_OUTPUT, .arg = "int|float|noise",
     .help = "what -nxsfile and -cbffile hold: -intfile's counts (the default), photons as floats (NXmx only), "
             "or -noisefile's counts"},
    {"-frames", K_COUNT, C(nframes), .group = G_OUTPUT, .arg = "n",
     .help = "a rotation series of n images, image i from phi0 + i osc; per-image files get the frame number"},
    {"-smv_adc_offset", K_SWITCH, C(smv_adc), .value = 1, .group = G_OUTPUT,
     .help = "SMV headers carry the pedestal as ADC_OFFSET (nanoBragg's have no such key)"},
    {"-scale", K_NUM, C(scale), .group = G_OUTPUT, .arg = "x",
     .help = "intensity scale of the integer images (0: 55000 / the maximum)"},
    {"-adc", K_NUM, C(adc), .group = G_OUTPUT, .arg = "x", .help = "offset added to the integer images (40)"},
    {"-pgmscale", K_NUM, C(pgmscale), .group = G_OUTPUT, .arg = "x",
     .help = "pixel scale of the PGM (0: 50 / the rms deviation)"},
    {"-nopgm", K_SWITCH, C(nopgm), .value = 1, .group = G_OUTPUT, .help = "no PGM after all"},
    {"-nonoise", K_SWITCH, C(nonoise), .value = 1, .group = G_OUTPUT, .help = "no noise image after all"},
    {"-seed", K_LONG, C(seed), .set = C(have_seed), .setv = 1, .group = G_OUTPUT, .arg = "n",
     .help = "noise seed (a run without one prints the seed it drew)"},

    /* nbgrad's own */
    {"-h --help -help", K_HELP, .group = G_NBGRAD, .help = "this help"},
    {"-device", K_CHOICE, C(backend), .choices = "cpu cuda auto",
     .values = {NBG_BACKEND_CPU, NBG_BACKEND_CUDA, NBG_BACKEND_AUTO}, .group = G_NBGRAD, .arg = "cpu|cuda|auto",
     .help = "where to run (cpu); auto: the GPU when there is one"},
    {"-precision", K_CHOICE, C(precision), .choices = "double float", .values = {NBG_DOUBLE, NBG_FLOAT},
     .group = G_NBGRAD, .arg = "double|float", .help = "arithmetic of the per-sample work (double)"},
    {"-threads", K_FN, .n = 1, .fn = fn_threads, .group = G_NBGRAD, .arg = "n",
     .help = "CPU threads, 0 (the OpenMP default) to 1024"},
    {"-max_memory", K_FN, .n = 1, .fn = fn_max_memory, .group = G_NBGRAD, .arg = "GiB",
     .help = "the largest allocation an input may ask for, GiB (4)"},
    {"-max_samples", K_FN, .n = 1, .fn = fn_max_samples, .group = G_NBGRAD, .arg = "n",
     .help = "the most pixels x samples per pixel one run may evaluate (1e12)"},
    {"-quiet -noprogress", K_SWITCH, C(quiet), .value = 1, .group = G_NBGRAD,
     .help = "no progress on stderr (ensemble cycles, batch shots, gradcheck parameters, refine iterations and "
             "frames); errors, warnings and results are still printed"},

    /* accepted and ignored */
    {"-density -sample_den -MW -molec", K_NUM, 0, .note = IGNORED_NOTE, .group = G_IGNORED, .arg = "x",
     .help = "read and ignored, with a note"},
    {"-coherent", K_SWITCH, 0, .note = IGNORED_NOTE, .group = G_IGNORED, .help = "ignored, with a note"},
    {"-stol -4stol -Q -stolout", K_STR, 0, .note = " is ignored (nanoBragg reads it but never uses it)",
     .group = G_IGNORED, .arg = "file", .help = "read and ignored, with a note"},
    {"-progress", K_SWITCH, 0, .group = G_IGNORED,
     .help = "ignored: long runs show their progress on stderr anyway (-quiet silences it)"},

    /* refused */
    {"-printout -printout_pixel -trace_pixel -dump_pixel", K_REFUSED, .group = G_REFUSED,
     .help = "nanoBragg's debug printouts: an error"},
};

#undef CUSTOM_AXIS
#undef CONVENTION
#undef IGNORED_NOTE

/* The i-th space-separated word of s and its length, or NULL. */
static const char *word(const char *s, int i, int *len)
{
    for (s += strspn(s, " "); *s != '\0'; s += strspn(s, " ")) {
        *len = (int)strcspn(s, " ");
        if (i-- == 0) {
            return s;
        }
        s += *len;
    }
    return NULL;
}

/* Which of the space-separated words a is, or -1. */
static int word_index(const char *words, const char *a)
{
    const size_t n = strlen(a);
    const char *w;
    int len;
    for (int i = 0; (w = word(words, i, &len)) != NULL; ++i) {
        if ((size_t)len == n && strncmp(w, a, n) == 0) {
            return i;
        }
    }
    return -1;
}

static const cli_flag *find_flag(const char *a)
{
    for (size_t k = 0; k < sizeof flags / sizeof flags[0]; ++k) {
        if (word_index(flags[k].names, a) >= 0) {
            return &flags[k];
        }
    }
    return NULL;
}

int nbgi_cli_image_shape_ok(nbg_ctx *ctx, const nbg_experiment *e, const char *what, const char *path,
                            const nbg_geometry *fg)
{
    nbg_report r;
    if (fg == NULL || fg->fpixels <= 0 || fg->spixels <= 0 || nbg_describe(ctx, e, &r) != NBG_OK ||
        r.npanels > 1) {
        return 1; /* raw floats state no shape; a detector of panels is checked by its pixel count */
    }
    if (fg->fpixels != r.fpixels || fg->spixels != r.spixels) {
        fprintf(stderr, "nbgrad: error: %s %s is %d x %d pixels (fast x slow, as the file states) but the detector is "
                        "%d x %d: the same number of pixels in another shape is another image\n", what, path,
                fg->fpixels, fg->spixels, r.fpixels, r.spixels);
        return 0;
    }
    return 1;
}

int nbgi_cli_names_output(const char *a)
{
    const cli_flag *f = find_flag(a);
    return f != NULL && f->kind == K_STR && f->group == G_OUTPUT;
}

/* "-pivot expects beam or sample, got 'x'": the words of a choice as a phrase. */
static void choice_error(const cli_flag *f, const char *a, const char *got)
{
    int n = 0, len = 0;
    while (word(f->choices, n, &len) != NULL) {
        ++n;
    }
    fprintf(stderr, "nbgrad: error: %s expects ", a);
    for (int i = 0; i < n; ++i) {
        const char *w = word(f->choices, i, &len);
        fprintf(stderr, "%s%.*s", i == 0 ? "" : i == n - 1 ? " or " : ", ", len, w);
    }
    fprintf(stderr, ", got '%s'\n", got);
}

/* Stores n converted values at off (nowhere when 0): doubles for K_NUM, ints for the integer kinds. */
static void store(nbgi_cli *c, size_t off, flag_kind kind, int n, const double *x, const int *k)
{
    if (off != 0 && kind == K_NUM) {
        memcpy(field_at(c, off), x, sizeof *x * (size_t)n);
    } else if (off != 0 && (kind == K_SWITCH || kind == K_INT || kind == K_COUNT || kind == K_CHOICE)) {
        memcpy(field_at(c, off), k, sizeof *k * (size_t)n);
    }
}

/* A flag's side effects, after its values are stored. */
static void side_effects(nbgi_cli *c, const cli_flag *f, const char *a, char **v, const double *x, const int *k,
                         int *custom)
{
    for (int j = 0; j < 2; ++j) {
        store(c, f->also[j], f->kind, 1, x, k);
    }
    if (f->set != 0) {
        *(int *)field_at(c, f->set) = f->setv;
    }
    if (f->pivot != NBG_PIVOT_AUTO) {
        c->last_pivot = f->pivot;
    }
    if (f->custom != 0) {
        *custom = f->custom > 0;
    }
    if (f->note != NULL) {
        const int echo = f->kind == K_STR && f->off == 0;
        fprintf(stderr, "nbgrad: note: %s%s%s%s\n", a, echo ? " " : "", echo ? v[0] : "", f->note);
    }
}

/* How many values follow a flag (for K_FN: at least how many). */
static int arity(const cli_flag *f)
{
    switch (f->kind) {
    case K_NUM:
    case K_INT:
        return f->n > 0 ? f->n : 1;
    case K_FN:
        return f->n;
    case K_SWITCH:
    case K_HELP:
    case K_REFUSED:
        return 0;
    default:
        return 1;
    }
}

/* Reads n integers into k; a K_COUNT must be positive. */
static int read_ints(const cli_flag *f, const char *a, char **v, int n, int *k)
{
    for (int j = 0; j < n; ++j) {
        if (!integer(a, v[j], &k[j])) {
            return 0;
        }
    }
    if (f->kind == K_COUNT && k[0] < 1) {
        fprintf(stderr, "nbgrad: error: %s must be a positive count, got %d\n", a, k[0]);
        return 0;
    }
    return 1;
}

/* Converts a flag's values: numbers into x, integers and switch or choice values into k; seeds and strings are
 * stored here, a K_FN reads (and stores) its own.  Returns how many values it used, or -1 after an error. */
static int read_values(nbgi_cli *c, const cli_flag *f, const char *a, int nv, char **v, double *x, int *k)
{
    const int n = arity(f);
    int w;
    switch (f->kind) {
    case K_SWITCH:
        k[0] = f->value;
        return 0;
    case K_NUM:
        return numbers(a, v, n, x) ? n : -1;
    case K_INT:
    case K_COUNT:
        return read_ints(f, a, v, n, k) ? n : -1;
    case K_LONG:
        return longint(a, v[0], field_at(c, f->off)) ? 1 : -1;
    case K_STR:
        if (f->off != 0) {
            *(const char **)field_at(c, f->off) = v[0];
        }
        return 1;
    case K_CHOICE:
        if ((w = word_index(f->choices, v[0])) < 0) {
            choice_error(f, a, v[0]);
            return -1;
        }
        k[0] = f->values[w];
        return 1;
    case K_FN:
        return f->fn(c, a, nv, v);
    default:
        return 0;
    }
}

/* Converts and stores the values of one flag (nv arguments follow it in v) and applies its side effects.  Returns
 * how many values it used, or -1 after printing an error. */
static int apply_flag(nbgi_cli *c, const cli_flag *f, const char *a, int nv, char **v, int *custom)
{
    if (!need(a, nv, arity(f))) {
        return -1;
    }
    double x[4] = {0};
    int k[4] = {0};
    const int used = read_values(c, f, a, nv, v, x, k);
    if (used < 0) {
        return -1;
    }
    store(c, f->off, f->kind, arity(f) > 0 ? arity(f) : 1, x, k);
    side_effects(c, f, a, v, x, k, custom);
    return used;
}

/* --- help, from the table ----------------------------------------------------------------------------------- */

void nbgi_cli_help_line(FILE *out, const char *names, const char *arg, const char *help, const char *scope,
                       int markdown)
{
    int len = 0, alen = 0;
    const char *name = word(names, 0, &len), *alias;
    const char *sp = arg != NULL ? " " : "", *val = arg != NULL ? arg : "";
    if (markdown) {
        fprintf(out, "- `%.*s%s%s`", len, name, sp, val);
        for (int i = 1; (alias = word(names, i, &alen)) != NULL; ++i) {
            fprintf(out, "%s`%.*s`", i == 1 ? " (also " : ", ", alen, alias);
        }
        fprintf(out, "%s: %s", word(names, 1, &alen) != NULL ? ")" : "", help);
    } else {
        char head[512];
        int at = snprintf(head, sizeof head, "%.*s", len, name);
        for (int i = 1; (alias = word(names, i, &alen)) != NULL && at < (int)sizeof head; ++i) {
            at += snprintf(head + at, sizeof head - (size_t)at, ", %.*s", alen, alias);
        }
        if (at < (int)sizeof head) {
            snprintf(head + at, sizeof head - (size_t)at, "%s%s", sp, val);
        }
        fprintf(out, strlen(head) > 30 ? "  %s\n%33s%s" : "  %-30s %s%s", head, "", help);
    }
    fprintf(out, "%s%s%s\n", scope != NULL ? " [" : "", scope != NULL ? scope : "", scope != NULL ? "]" : "");
}

/* Every flag of the table, grouped; markdown: as a list for docs/flags.md. */
static void flags_doc(FILE *out, int markdown)
{
    for (int g = 0; g < G_COUNT; ++g) {
        fprintf(out, markdown ? "**%s**\n\n" : "%s:\n", group_title[g]);
        for (size_t k = 0; k < sizeof flags / sizeof flags[0]; ++k) {
            if (flags[k].group == (flag_group)g) {
                nbgi_cli_help_line(out, flags[k].names, flags[k].arg, flags[k].help, NULL, markdown);
            }
        }
        if (markdown) {
            fprintf(out, "\n");
        }
    }
}

void nbgi_cli_usage(FILE *out)
{
    fprintf(out, "nbgrad " NBG_VERSION " -- differentiable nanoBragg\n"
                 "usage: nbgrad [simulate] <flags>        render an image, nanoBragg's flags\n"
                 "       nbgrad -h | --help\n"
                 "Only the output files asked for are written.  The flags:\n");
    flags_doc(out, 0);
}

void nbgi_cli_flags_help(FILE *out)
{
    flags_doc(out, 0);
}

void nbgi_cli_flags_markdown(FILE *out)
{
    flags_doc(out, 1);
}

void nbgi_cli_flags_list(FILE *out)
{
    const char *w;
    int len;
    for (size_t k = 0; k < sizeof flags / sizeof flags[0]; ++k) {
        for (int i = 0; (w = word(flags[k].names, i, &len)) != NULL; ++i) {
            fprintf(out, "%.*s\n", len, w);
        }
    }
}

int nbgi_cli_is_flag(const char *name)
{
    return find_flag(name) != NULL;
}

/* --- the subcommands' own flags ------------------------------------------------------------------------------ */

const char *nbgi_cmd_names(unsigned cmds, char *buf, size_t size)
{
    static const char *const names[NBGI_NCMDS] = {"grad", "gradcheck", "refine", "ensemble", "batch", "shots"};
    size_t at = 0;
    buf[0] = '\0';
    for (int k = 0; k < NBGI_NCMDS; ++k) {
        if (cmds & (1u << k) && at < size) {
            at += (size_t)snprintf(buf + at, size - at, "%s%s", at ? ", " : "", names[k]);
        }
    }
    return buf;
}

int nbgi_sub_flag_parse(const nbgi_sub_flag *t, int n, unsigned cmd, void *opts, int argc, char **argv, int i,
                        const char *note)
{
    const char *a = argv[i];
    const nbgi_sub_flag *f = NULL;
    unsigned others = 0; /* the subcommands that take a flag of this name */
    for (int k = 0; k < n; ++k) {
        if (strcmp(a, t[k].flag) == 0) {
            others |= t[k].cmds;
            if (f == NULL && (t[k].cmds & cmd) != 0) {
                f = &t[k];
            }
        }
    }
    if (others == 0) {
        return 0;
    }
    char buf[96], mine[32];
    if (f == NULL) {
        fprintf(stderr, "nbgrad: error: nbgrad %s does not take %s (a flag of nbgrad %s)%s\n",
                nbgi_cmd_names(cmd, mine, sizeof mine), a, nbgi_cmd_names(others, buf, sizeof buf),
                note != NULL ? note : "");
        return -1;
    }
    int nv = 0, len;
    while (f->arg != NULL && word(f->arg, nv, &len) != NULL) {
        ++nv;
    }
    if (i + nv >= argc) {
        fprintf(stderr, "nbgrad: error: %s needs %s\n", a, nv > 1 ? "its values" : "a value");
        return -1;
    }
    return f->set(opts, a, nv > 0 ? argv + i + 1 : NULL, (char *)opts + f->off) ? 1 + nv : -1;
}

void nbgi_sub_flags_doc(FILE *out, const nbgi_sub_flag *t, int n, unsigned cmd, int markdown)
{
    char scope[96];
    for (int k = 0; k < n; ++k) {
        if (cmd == 0 || (t[k].cmds & cmd)) {
            nbgi_cli_help_line(out, t[k].flag, t[k].arg, t[k].help,
                               cmd == 0 ? nbgi_cmd_names(t[k].cmds, scope, sizeof scope) : NULL, markdown);
        }
    }
}

void nbgi_sub_usage(FILE *out, const char *usage, const nbgi_sub_flag *t, int n, unsigned cmd)
{
    char name[32];
    fprintf(out, "%s%s%s's own flags:\n", usage, usage[0] != '\0' ? "\n" : "", nbgi_cmd_names(cmd, name, sizeof name));
    nbgi_sub_flags_doc(out, t, n, cmd, 0);
    fprintf(out, "nanoBragg's flags, as for nbgrad simulate:\n");
    flags_doc(out, 0);
}

int nbgi_set_path(void *opts, const char *flag, char **v, void *dst)
{
    *(const char **)dst = v[0];
    return 1;
}

int nbgi_set_half_box(void *opts, const char *flag, char **v, void *dst)
{
    double m;
    if (!nbgi_cli_number(flag, v[0], &m) || m < 0 || m > 100000 || m != floor(m)) {
        fprintf(stderr, "nbgrad: error: %s expects a box half-width in pixels, an integer in [0, 100000], got '%s'\n",
                flag, v[0]);
        return 0;
    }
    *(int *)dst = (int)m;
    return 1;
}

int nbgi_spot_threshold(const float *img, const uint8_t *use, size_t npix, double frac, double *thr)
{
    double lo = INFINITY, hi = -INFINITY;
    for (size_t i = 0; i < npix; ++i) {
        if (use == NULL || use[i]) {
            lo = fmin(lo, img[i]);
            hi = fmax(hi, img[i]);
        }
    }
    *thr = hi > lo ? lo + frac * (hi - lo) : lo; /* flat: the floor, for the message */
    return hi > lo;
}

int nbgi_set_positive(void *opts, const char *flag, char **v, void *dst)
{
    double x;
    if (!nbgi_cli_number(flag, v[0], &x)) {
        return 0;
    }
    if (!(x > 0)) {
        fprintf(stderr, "nbgrad: error: %s must be positive, got '%s'\n", flag, v[0]);
        return 0;
    }
    *(double *)dst = x;
    return 1;
}

int nbgi_set_switch(void *opts, const char *flag, char **v, void *dst)
{
    *(int *)dst = 1;
    return 1;
}

/* --- progress on stderr -------------------------------------------------------------------------------------- */

static struct {
    int quiet, tty;
    int open;  /* a bar line is drawn and not ended */
    int width; /* the length of the line drawn */
} g_progress;

void nbgi_progress_init(void)
{
    setvbuf(stdout, NULL, _IOLBF, 0);
    setvbuf(stderr, NULL, _IOLBF, 0);
    g_progress.tty = isatty(STDERR_FILENO);
    atexit(nbgi_progress_end); /* a bar left open by an error ends its line */
}

void nbgi_progress_quiet(int quiet)
{
    g_progress.quiet = quiet;
}

void nbgi_progress(int plain, int done, int total, const char *fmt, ...)
{
    if (g_progress.quiet || (!plain && !g_progress.tty)) {
        return;
    }
    char text[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(text, sizeof text, fmt, ap);
    va_end(ap);
    if (!g_progress.tty) {
        fprintf(stderr, "%s\n", text);
        return;
    }
    char bar[32] = "";
    if (total > 0) {
        const int w = 20, full = done >= total ? w : done <= 0 ? 0 : (int)((double)done * w / total);
        bar[0] = '[';
        for (int k = 0; k < w; ++k) bar[1 + k] = k < full ? '#' : '.';
        bar[1 + w] = ']';
        bar[2 + w] = ' ';
        bar[3 + w] = '\0';
    }
    char line[600];
    const int len = snprintf(line, sizeof line, "%s%s", bar, text);
    /* the line redrawn in place, the rest of a longer previous one blanked */
    fprintf(stderr, "\r%s%*s", line, g_progress.width > len ? g_progress.width - len : 0, "");
    g_progress.width = len;
    g_progress.open = 1;
    if (total > 0 && done >= total) {
        nbgi_progress_end();
    } else {
        fflush(stderr);
    }
}

void nbgi_progress_end(void)
{
    if (g_progress.open) {
        fputc('\n', stderr);
        g_progress.open = 0;
        g_progress.width = 0;
    }
}

/* --- JSON outputs ------------------------------------------------------------------------------------------------ */

#ifdef NBG_HAVE_FORMATS
int nbgi_json_write(nbg_ctx *ctx, nbgi_outset *set, const char *path, json_t *doc, int indent)
{
    const size_t how = (indent ? JSON_INDENT(2) : 0) | JSON_PRESERVE_ORDER | JSON_REAL_PRECISION(17);
    char *text = doc != NULL ? json_dumps(doc, how) : NULL;
    json_decref(doc);
    nbgi_out o;
    int rc = text == NULL ? nbgi_error(ctx, NBG_ENOMEM, "out of memory for the JSON of %s", path)
                          : nbgi_out_open(ctx, path, &o);
    if (rc == NBG_OK) {
        rc = nbgi_out_write(ctx, &o, text, strlen(text));
    }
    if (rc == NBG_OK) {
        rc = nbgi_out_write(ctx, &o, "\n", 1);
    }
    if (rc == NBG_OK) {
        rc = nbgi_out_finish(ctx, &o, set);
    }
    free(text);
    if (rc != NBG_OK) {
        fprintf(stderr, "nbgrad: error: %s\n", nbg_errmsg(ctx));
        return 0;
    }
    return 1;
}

json_t *nbgi_json_num(double v)
{
    return isfinite(v) ? json_real(v) : json_null();
}

int nbgi_json_refused(const char *flag, const char *path)
{
    return 0;
}
#else
int nbgi_json_write(nbg_ctx *ctx, nbgi_outset *set, const char *path, struct json_t *doc, int indent)
{
    fprintf(stderr, "nbgrad: error: %s: this nbgrad was built without jansson (FORMATS=0): no JSON outputs\n", path);
    return 0;
}

struct json_t *nbgi_json_num(double v)
{
    return NULL;
}

int nbgi_json_refused(const char *flag, const char *path)
{
    if (path == NULL) {
        return 0;
    }
    fprintf(stderr, "nbgrad: error: %s %s: this nbgrad was built without jansson (FORMATS=0): no JSON outputs\n",
            flag, path);
    return 1;
}
#endif

int nbgi_cli_parse(nbg_ctx *ctx, nbgi_cli *c, int argc, char **argv, int first)
{
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
                if (!need(want, argc - i - 1, 1) || !ingest_header(ctx, c, argv[i + 1], pass == 0)) {
                    return 0;
                }
            }
        }
    }
    int custom = 0;
    for (int i = first; i < argc; ++i) {
        const char *a = argv[i];
        const cli_flag *f = find_flag(a);
        int used;
        if (f != NULL && f->kind == K_HELP) {
            c->help = 1;
            return 1;
        }
        if (f != NULL && f->kind != K_REFUSED) {
            used = apply_flag(c, f, a, argc - i - 1, argv + i + 1, &custom);
        } else if (c->extra_handler != NULL && (used = c->extra_handler(c, argc, argv, i)) != 0) {
            used = used < 0 ? -1 : used - 1;
        } else if (f != NULL) {
            fprintf(stderr, "nbgrad: error: %s (nanoBragg's debug printout) is not supported\n", a);
            return 0;
        } else {
            fprintf(stderr, "nbgrad: error: unknown flag '%s' (nbgrad -h lists the flags)\n", a);
            return 0;
        }
        if (used < 0) {
            return 0;
        }
        i += used;
    }
    if (custom) {
        c->e.convention = NBG_CONV_CUSTOM;
        /* nanoBragg honours pivot-setting flags in the custom convention only, the last one winning */
        c->e.pivot = c->last_pivot;
    }
    return 1;
}

/* One row of a change of basis as DIALS writes one: "a+b", "-c", "2a-b+c". */
static void basis_row(const int *m, char *buf, size_t size)
{
    size_t n = 0;
    buf[0] = '\0';
    for (int j = 0; j < 3 && n < size; ++j) {
        if (m[j] == 0) {
            continue;
        }
        const char *sign = m[j] < 0 ? "-" : n > 0 ? "+" : "";
        if (abs(m[j]) == 1) {
            n += (size_t)snprintf(buf + n, size - n, "%s%c", sign, "abc"[j]);
        } else {
            n += (size_t)snprintf(buf + n, size - n, "%s%d%c", sign, abs(m[j]), "abc"[j]);
        }
    }
}

/* -setting: the crystal of -expt (in g) re-expressed in the basis of the crystal of another list, the change of
 * basis and both cells printed.  0 (message printed) on failure. */
static int reindex_crystal(nbg_ctx *ctx, nbgi_cli *c, nbg_geometry *g)
{
    if (!g->has_crystal) {
        fprintf(stderr, "nbgrad: error: -setting %s re-expresses the crystal of -expt, and %s has none\n",
                c->settingin, c->exptin);
        return 0;
    }
    nbg_geometry ref;
    nbg_panel *pan = NULL;
    int np = 0;
    if (nbg_read_expt_panels(ctx, c->settingin, &ref, &pan, &np) != NBG_OK) {
        fprintf(stderr, "nbgrad: error: -setting: %s\n", nbg_errmsg(ctx));
        return 0;
    }
    free(pan);
    if (!ref.has_crystal) {
        fprintf(stderr, "nbgrad: error: -setting %s: the list has no crystal to take the setting from\n",
                c->settingin);
        return 0;
    }
    int M[9];
    double misfit = 0, before[6], after[6], want[6];
    nbgi_cell_of_vectors(g->real_space, before);
    if (nbg_geometry_reindex(ctx, g, ref.real_space, M, &misfit) != NBG_OK) {
        fprintf(stderr, "nbgrad: error: -setting %s: the crystal of -expt %s: %s\n", c->settingin, c->exptin,
                nbg_errmsg(ctx));
        return 0;
    }
    nbgi_cell_of_vectors(g->real_space, after);
    nbgi_cell_of_vectors(ref.real_space, want);
    if (strcmp(ref.space_group, g->space_group) != 0) {
        memcpy(g->space_group, ref.space_group, sizeof g->space_group);
    }
    char row[3][48];
    for (int i = 0; i < 3; ++i) basis_row(M + 3 * i, row[i], sizeof row[i]);
    printf("-setting %s: the crystal of %s re-expressed in its basis: a, b, c = %s, %s, %s of %s's (largest "
           "deviation of the change of basis from integers %.2g); cell %.4f %.4f %.4f %.3f %.3f %.3f becomes %.4f "
           "%.4f %.4f %.3f %.3f %.3f (the reference's: %.4f %.4f %.4f %.3f %.3f %.3f)\n",
           c->settingin, c->exptin, row[0], row[1], row[2], c->exptin, misfit, before[0], before[1], before[2],
           before[3], before[4], before[5], after[0], after[1], after[2], after[3], after[4], after[5], want[0],
           want[1], want[2], want[3], want[4], want[5]);
    return 1;
}

/* After an experiment list set e's sampling (the mosaic domains, the divergence and spectrum nbgrad wrote into it):
 * the sampling flags given (those that differ from the defaults in given_e, e before the list) win.  Returns whether
 * any was given. */
static int keep_sampling_flags(const nbg_experiment *given_e, nbg_experiment *e)
{
    nbg_experiment d;
    nbg_experiment_default(&d);
    int given = 0;
#define KEEP(f)                                                                                                   \
    do {                                                                                                          \
        const int set = isnan((double)d.f) ? !isnan((double)given_e->f) : given_e->f != d.f;                      \
        if (set) {                                                                                                \
            e->f = given_e->f;                                                                                    \
            given = 1;                                                                                            \
        }                                                                                                         \
    } while (0)
    KEEP(mosaic);
    KEEP(mosaic_domains);
    KEEP(mosaic_seed);
    KEEP(hdivrange);
    KEEP(vdivrange);
    KEEP(hdivstep);
    KEEP(vdivstep);
    KEEP(hdivsteps);
    KEEP(vdivsteps);
    KEEP(dispersion);
    KEEP(dispsteps);
    KEEP(round_div);
#undef KEEP
    return given;
}

int nbgi_cli_load(nbg_ctx *ctx, nbgi_cli *c)
{
    nbg_experiment *e = &c->e;
    if (c->exptin != NULL) {
        nbg_geometry g;
        nbg_panel *pan = NULL;
        int np = 0;
        /* the sampling flags given (they win over the mosaic domains and beam sampling of a list nbgrad wrote) */
        const nbg_experiment before = *e;
        if (nbg_read_expt_panels(ctx, c->exptin, &g, &pan, &np) != NBG_OK) {
            free(pan);
            fprintf(stderr, "nbgrad: error: -expt: %s\n", nbg_errmsg(ctx));
            return 0;
        }
        if (c->settingin != NULL && !reindex_crystal(ctx, c, &g)) {
            free(pan);
            return 0;
        }
        if (nbg_experiment_from_geometry(ctx, &g, e) != NBG_OK) {
            free(pan);
            fprintf(stderr, "nbgrad: error: -expt: %s\n", nbg_errmsg(ctx));
            return 0;
        }
        if (before.space_group[0] != 0) {
            memcpy(e->space_group, before.space_group, sizeof e->space_group); /* -space_group wins */
        }
        if (np > 1) {
            /* every panel where the list puts it, in its frame (DIALS's, which the experiment now uses) */
            free(c->panels);
            c->panels = pan;
            e->panels = pan;
            e->npanels = np;
            e->panel_frame = NBG_PANELS_LAB;
            printf("read %s: %d panels\n", c->exptin, np);
        } else {
            free(pan);
        }
        if (!isnan(c->polar_flag)) {
            /* -polar given: it wins over the list's beam (dxtbx's NXmx reader, for one, does not read the
             * polarization and writes its synchrotron default) */
            e->polarization = c->polar_flag;
            e->nopolar = 0;
            printf("note: -polar %g replaces the polarization of -expt %s\n", c->polar_flag, c->exptin);
        } else if (g.polarization_fraction == 0.999 || g.polarization_fraction == 0.5) {
            /* values dxtbx's readers put in whatever the file said: its NXmx reader ignores the file's Stokes
             * vector and writes 0.999, its CBF reader 0.5; the intensities depend on it (by up to +-15 %) */
            printf("note: -expt %s has the polarization fraction %g, which dxtbx %s; if the data were polarized "
                   "otherwise, give -polar (Kahn factor 2 f - 1) or dials.import polarization_fraction=...\n",
                   c->exptin, g.polarization_fraction, g.polarization_fraction == 0.999
                       ? "gives every NXmx file whatever the file states (it does not read its Stokes vector)"
                       : "gives every full CBF file (and nbgrad an unpolarized beam)");
        }
        if (!g.has_mosaic) {
            /* a list without nbgrad's domains (DIALS's): the domains of the mosaic flags are drawn where a run of
             * the same flags draws them, in the frame of the flags' convention, and turned into the list's frame */
            if (nbgi_convention_frame(ctx, &before, e->mosaic_frame) != NBG_OK) {
                fprintf(stderr, "nbgrad: error: -expt: the frame of the flags' convention: %s\n", nbg_errmsg(ctx));
                return 0;
            }
        }
        if (g.has_mosaic || g.has_beam_sampling) {
            const int given = keep_sampling_flags(&before, e);
            char div[96] = "";
            if (!isnan(e->hdivrange) || !isnan(e->vdivrange)) {
                snprintf(div, sizeof div, ", divergence %g x %g mrad", isnan(e->hdivrange) ? 0 : e->hdivrange,
                         isnan(e->vdivrange) ? 0 : e->vdivrange);
            }
            printf("read %s: nbgrad's sampling of it: mosaic spread %g deg over %d domains (seed %ld)%s, dispersion "
                   "%g %%%s\n", c->exptin, e->mosaic, e->mosaic_domains, e->mosaic_seed, div,
                   isnan(e->dispersion) ? 0 : e->dispersion, given ? " (with the sampling flags given)" : "");
        }
        if (g.crystal_scan_points > 0) {
            printf("WARNING: the crystal of -expt %s is scan-varying (%d A matrices, one per image boundary, as "
                   "dials.refine writes for a scan by default): nbgrad uses its static A for every image; refine "
                   "from dials.refine scan_varying=False for a model nbgrad renders as DIALS does\n", c->exptin,
                   g.crystal_scan_points);
        }
        if (g.has_crystal && c->matfile != NULL) {
            printf("note: the crystal of -expt %s replaces -mat %s\n", c->exptin, c->matfile);
            c->matfile = NULL;
        }
        if (c->nframes <= 0) {
            c->nframes = g.nframes;
        }
        printf("read %s: %dx%d pixels of %g mm, wavelength %g A, scan %d image%s from %g deg by %g deg%s\n",
               c->exptin, g.fpixels, g.spixels, g.pixel_f, g.wavelength, g.nframes, g.nframes > 1 ? "s" : "",
               g.scan_start, g.scan_width, g.has_crystal ? ", with a crystal" : "");
    }
    if (c->exptin == NULL && c->settingin != NULL) {
        fprintf(stderr, "nbgrad: error: -setting re-expresses the crystal of -expt, and there is no -expt (the crystal "
                "of -cell, -mat and -misset is in the basis given)\n");
        return 0;
    }
    if (c->layout != NULL) {
        int n = 0, F = 0, S = 0;
        double px = 0;
        int rc = nbg_layout(ctx, c->layout, NULL, 0, &n, NULL, NULL, NULL);
        if (rc == NBG_OK) {
            free(c->panels);
            c->panels = calloc((size_t)n, sizeof *c->panels);
            rc = c->panels == NULL ? nbgi_error(ctx, NBG_ENOMEM, "out of memory for %d panels", n)
                                   : nbg_layout(ctx, c->layout, c->panels, n, &n, &px, &F, &S);
        }
        if (rc != NBG_OK) {
            fprintf(stderr, "nbgrad: error: -layout: %s\n", nbg_errmsg(ctx));
            return 0;
        }
        e->panels = c->panels;
        e->npanels = n;
        e->panel_frame = NBG_PANELS_PLANE;
        e->pixel = px;
        e->fpixels = F;
        e->spixels = S;
    }
    if (e->npanels > 0) {
        /* the motion groups: a layout's modules or a list's groups (its panels' groups, as the layout and the
         * list's reader set them), or as -panel_groups says; their motions zero unless -motions gives them */
        int ng = 0;
        for (int k = 0; k < e->npanels; ++k) {
            int g = c->panels[k].group;
            if (c->panel_groups == NBGI_GROUPS_PANELS) {
                g = k;
            } else if (c->panel_groups == NBGI_GROUPS_DETECTOR) {
                g = 0;
            }
            c->panels[k].group = g;
            ng = g + 1 > ng ? g + 1 : ng;
        }
        free(c->motions);
        c->motions = calloc((size_t)ng, sizeof *c->motions);
        if (c->motions == NULL) {
            fprintf(stderr, "nbgrad: error: out of memory for %d panel motions\n", ng);
            return 0;
        }
        c->nmotions = ng;
        if (c->motionsfile != NULL) {
            if (!read_motions(ctx, c)) {
                return 0;
            }
            e->motions = c->motions;
            e->nmotions = ng;
        }
    } else if (c->motionsfile != NULL) {
        fprintf(stderr, "nbgrad: error: -motions moves panels, and this detector has none (use -layout or a "
                "multi-panel -expt)\n");
        return 0;
    }
    if (e->npanels > 0) {
        /* the files that describe one flat detector cannot hold several panels (NXmx and experiment lists can) */
        const struct {
            const char *flag, *path;
        } one[] = {{"-intfile", c->intfile}, {"-pgmfile", c->pgmfile}, {"-noisefile", c->noisefile},
                   {"-cbffile", c->cbffile}, {"-mask", c->maskfile},   {"-img", c->imgfile},
                   {"-roi", e->roi[0] >= 0 ? "" : NULL}};
        for (size_t k = 0; k < sizeof one / sizeof one[0]; ++k) {
            if (one[k].path != NULL) {
                fprintf(stderr, "nbgrad: error: %s describes a single flat detector, and this one has %d panels "
                        "(-floatfile writes the panels' concatenation; -nxsfile and -exptfile every panel)\n",
                        one[k].flag, e->npanels);
                return 0;
            }
        }
    }
    if (c->nframes <= 0) {
        c->nframes = 1;
    }
    if (c->matfile != NULL) {
        if (nbgi_read_matrix(ctx, c->matfile, e->mat) != NBG_OK) {
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
        if (!c->nodump && nbgi_hkl_write_fdump_set(ctx, &c->outs, c->dumpfile, &c->hkl) != NBG_OK) {
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
        if (nbgi_read_sources(ctx, c->sourcefile, e->lambda, beam, &c->sources, &c->nsources) != NBG_OK) {
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

void nbgi_cli_stats(const nbgi_cli *c, const nbg_report *r, const float *img, nbgi_stats *st)
{
    const nbg_experiment *e = &c->e;
    /* panels: every pixel of the concatenation, as one row (they have no region of interest) */
    const int F = r->npanels > 1 ? (int)r->npix : r->fpixels, S = r->npanels > 1 ? 1 : r->spixels;
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

void nbgi_cli_frame_name(const char *path, int frame, int n, char *out, size_t size)
{
    const char *hash = strchr(path, '#');
    if (n <= 1 && hash == NULL) { /* one frame: the name as given (a '#' template still takes the number, 1) */
        snprintf(out, size, "%s", path);
        return;
    }
    if (hash != NULL) {
        const size_t width = strspn(hash, "#");
        snprintf(out, size, "%.*s%0*d%s", (int)(hash - path), path, (int)width, frame + 1, hash + width);
        return;
    }
    const char *slash = strrchr(path, '/');
    const char *dot = strrchr(path, '.');
    if (dot == NULL || (slash != NULL && dot < slash) || dot == path || (slash != NULL && dot == slash + 1)) {
        dot = path + strlen(path);
    }
    snprintf(out, size, "%.*s_%05d%s", (int)(dot - path), path, frame + 1, dot);
}

/* The template of a file series for an experiment list: the name with the frame number as '#'s. */
static void series_template(const char *path, int n, char *out, size_t size)
{
    if (n <= 1 || strchr(path, '#') != NULL) {
        snprintf(out, size, "%s", path);
        return;
    }
    const char *slash = strrchr(path, '/');
    const char *dot = strrchr(path, '.');
    if (dot == NULL || (slash != NULL && dot < slash) || dot == path || (slash != NULL && dot == slash + 1)) {
        dot = path + strlen(path);
    }
    snprintf(out, size, "%.*s_#####%s", (int)(dot - path), path, dot);
}

/* Prints an error and returns 0. */
static int out_error(nbg_ctx *ctx)
{
    fprintf(stderr, "nbgrad: error: %s\n", nbg_errmsg(ctx));
    return 0;
}

/* The dials.import line that makes dxtbx read nbgrad's SMV files right: its SMV reader takes the beam centre from
 * BEAM_CENTER_X/Y in a fixed convention, the spindle along the fast axis and a pedestal of 1; a rotated detector
 * it cannot describe at all. */
static void print_dials_import(const nbgi_cli *c, const char *smv)
{
    const nbg_geometry *g = &c->geom;
    double n[3];
    nbgi_cross(g->fast, g->slow, n);
    const double dn = -nbgi_dot(g->direction, n), on = nbgi_dot(g->origin, n);
    const int flat = fabs(fabs(n[2]) - 1) < 1e-9 && fabs(g->fast[0] - 1) < 1e-9;
    if (!flat) {
        printf("note: SMV cannot describe this detector (rotated, or not facing the beam): DIALS will read its "
               "geometry wrong; write -nxsfile or -cbffile for DIALS\n");
        return;
    }
    if (fabs(dn) < 1e-12) {
        return;
    }
    /* where the beam meets the detector plane, in the panel's fast/slow pixels */
    double p[3];
    for (int i = 0; i < 3; ++i) p[i] = -g->direction[i] * on / dn - g->origin[i];
    char tmpl[PATH_MAX];
    series_template(smv, c->nframes, tmpl, sizeof tmpl);
    printf("to import %s in DIALS: dials.import %s%s fast_slow_beam_centre=%.4f,%.4f goniometer.axes=%g,%g,%g "
           "geometry.detector.panel.pedestal=%g\n", c->nframes > 1 ? "the SMV series" : "the SMV file",
           c->nframes > 1 ? "template=" : "", tmpl,
           nbgi_dot(p, g->fast) / g->pixel_f, nbgi_dot(p, g->slow) / g->pixel_s, g->axis[0], g->axis[1], g->axis[2],
           c->adc);
}

/* What DIALS makes of nbgrad's full CBF files, measured with dxtbx 3.12: FormatCBFFull reads any full CBF's sensor
 * as unknown (not a pixel-array detector), so dials.find_spots asks for spots of 6 pixels instead of 3; and
 * dials.import cannot template a name without a frame number ("Could not determine filename template"). */
static void cbf_notes(const char *name)
{
    const char *base = strrchr(name, '/');
    base = base != NULL ? base + 1 : name;
    const char *dot = strrchr(base, '.');
    const size_t len = dot != NULL ? (size_t)(dot - base) : strlen(base);
    if (len == 0 || base[len - 1] < '0' || base[len - 1] > '9') {
        printf("note: dials.import needs a frame number in a CBF file's name to import it (e.g. %.*s_00001%s; "
               "-cbffile %.*s_#####%s writes that)\n", (int)len, base, dot != NULL ? dot : "", (int)len, base,
               dot != NULL ? dot : "");
    }
    printf("note: DIALS reads a full CBF's sensor as unknown (not a pixel-array detector) and then finds spots of at "
           "least 6 pixels: give dials.find_spots min_spot_size=3, or write -nxsfile\n");
}

int nbgi_cli_write_outputs(nbg_ctx *ctx, nbgi_cli *c, const nbg_report *r, const float *img, int frame)
{
    const int F = r->fpixels, S = r->spixels;
    const size_t npix = r->npix;
    const int nframes = c->nframes > 0 ? c->nframes : 1;
    char name[PATH_MAX];
    nbgi_stats st;
    nbgi_cli_stats(c, r, img, &st);
    if (nframes > 1) {
        printf("frame %d of %d: phi %g to %g deg\n", frame + 1, nframes, r->phi0, r->phi0 + r->osc);
    }
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
    if (frame == 0 && (c->nxsfile != NULL || c->cbffile != NULL || c->exptfile != NULL || c->intfile != NULL ||
                       (c->noisefile != NULL && !c->nonoise))) {
        if (nbg_geometry_from_report(ctx, &c->e, r, nframes, &c->geom) != NBG_OK) {
            return out_error(ctx);
        }
        const int integer = c->filedata != NBGI_DATA_FLOAT;
        c->geom.pedestal = integer ? c->adc : 0;
        c->geom.saturation = integer ? 65535 : 1e10;
        free(c->geom_panels);
        c->geom_panels = NULL;
        if (c->e.npanels > 0) {
            /* every panel in the description's frame, for the files that hold several */
            c->geom_panels = calloc((size_t)c->e.npanels, sizeof *c->geom_panels);
            if (c->geom_panels == NULL) {
                fprintf(stderr, "nbgrad: error: out of memory for %d panels\n", c->e.npanels);
                return 0;
            }
            if (nbg_panels_from_report(ctx, &c->e, r, c->geom_panels, c->e.npanels) != NBG_OK) {
                return out_error(ctx);
            }
        }
    }
    /* the integer and noise images of panels: the concatenation as one row (panels have no region of interest) */
    const int IF = c->e.npanels > 0 ? (int)npix : F, IS = c->e.npanels > 0 ? 1 : S;
    if (c->floatfile != NULL) {
        nbgi_cli_frame_name(c->floatfile, frame, nframes, name, sizeof name);
        if (nbgi_write_float_set(ctx, &c->outs, name, img, npix) != NBG_OK) {
            return out_error(ctx);
        }
        printf("wrote %s as %zu 4-byte floats\n", name, npix);
    }
    /* the integer scale: -scale, else 55000 / the maximum, of the first frame for a whole series */
    double scale = c->scale;
    if (scale <= 0) {
        scale = frame > 0 ? c->series_scale : st.max > 0 ? 55000.0 / st.max : 1.0;
        c->series_scale = scale;
    }
    nbg_smv_header h;
    nbg_smv_header_from_report(r, &h);
    h.has_adc_offset = c->smv_adc;
    h.adc_offset = c->adc;
    const int want_int = c->intfile != NULL || ((c->nxsfile != NULL || c->cbffile != NULL) &&
                                                c->filedata == NBGI_DATA_INT);
    const int want_noise = (c->noisefile != NULL && !c->nonoise) ||
                           ((c->nxsfile != NULL || c->cbffile != NULL) && c->filedata == NBGI_DATA_NOISE);
    uint16_t *ibuf = NULL, *nbuf = NULL;
    int32_t *cbuf = NULL;
    int ok = 0;
    if ((want_int && (ibuf = malloc(sizeof(uint16_t) * npix)) == NULL) ||
        (want_noise && (nbuf = malloc(sizeof(uint16_t) * npix)) == NULL) ||
        (c->cbffile != NULL && (cbuf = malloc(sizeof(int32_t) * npix)) == NULL)) {
        fprintf(stderr, "nbgrad: error: out of memory for the integer images (%zu pixels)\n", npix);
        goto done;
    }
    if (want_int) {
        if (nbg_int_image(ctx, img, IF, IS, c->e.roi, scale, c->adc, ibuf) != NBG_OK) {
            out_error(ctx);
            goto done;
        }
        printf("intfile_scale = %g\n", scale);
    }
    if (c->intfile != NULL) {
        nbgi_cli_frame_name(c->intfile, frame, nframes, name, sizeof name);
        if (nbgi_write_smv_set(ctx, &c->outs, name, &h, ibuf) != NBG_OK) {
            out_error(ctx);
            goto done;
        }
        printf("wrote %s as 2-byte integers\n", name);
    }
    if (c->pgmfile != NULL && !c->nopgm) {
        double ps = c->pgmscale;
        if (ps <= 0) {
            ps = st.rmsd > 0 ? 250.0 / (5.0 * st.rmsd) : scale;
        }
        nbgi_cli_frame_name(c->pgmfile, frame, nframes, name, sizeof name);
        if (nbgi_write_pgm_set(ctx, &c->outs, name, img, F, S, ps) != NBG_OK) {
            out_error(ctx);
            goto done;
        }
        printf("wrote %s with pixels scaled by %g\n", name, ps);
    }
    if (want_noise) {
        long seed = c->seed;
        if (!c->have_seed) {
            seed = (long)time(NULL);
            c->seed = seed;
            c->have_seed = 1;
            printf("noise seed: %ld (repeat with -seed %ld)\n", seed, seed);
        }
        long photons = 0, overloads = 0;
        /* frame i of a series draws from seed + i: the first frame is the single image's */
        if (nbg_noise_image(ctx, img, IF, IS, c->e.roi, c->adc, seed + frame, nbuf, &photons, &overloads) !=
            NBG_OK) {
            out_error(ctx);
            goto done;
        }
        printf("%ld photons on noise image (%ld overloads)\n", photons, overloads);
    }
    if (c->noisefile != NULL && !c->nonoise) {
        nbgi_cli_frame_name(c->noisefile, frame, nframes, name, sizeof name);
        if (nbgi_write_smv_set(ctx, &c->outs, name, &h, nbuf) != NBG_OK) {
            out_error(ctx);
            goto done;
        }
        printf("wrote %s as 2-byte integers\n", name);
    }
    const uint16_t *counts = c->filedata == NBGI_DATA_NOISE ? nbuf : ibuf;
    if (c->cbffile != NULL) {
        for (size_t i = 0; i < npix; ++i) cbuf[i] = counts[i];
        nbgi_cli_frame_name(c->cbffile, frame, nframes, name, sizeof name);
        if (nbgi_write_cbf_set(ctx, &c->outs, name, &c->geom, frame, cbuf) != NBG_OK) {
            out_error(ctx);
            goto done;
        }
        printf("wrote %s as a CBF of 4-byte integers\n", name);
        if (frame == nframes - 1 && !c->batch) {
            cbf_notes(name);
        }
    }
    if (c->nxsfile != NULL) {
        /* NXmx holds the whole series in one file: gather the frames, write after the last */
        const size_t elem = c->filedata == NBGI_DATA_FLOAT ? sizeof(float) : sizeof(int32_t);
        if (frame == 0) {
            if (nbgi_check_bytes(ctx, (double)elem * npix * nframes, "the frames of the NXmx file") != NBG_OK) {
                out_error(ctx);
                goto done;
            }
            free(c->series);
            c->series = malloc(elem * npix * nframes);
            if (c->series == NULL) {
                fprintf(stderr, "nbgrad: error: out of memory for %d frames of %zu pixels\n", nframes, npix);
                goto done;
            }
        }
        if (c->filedata == NBGI_DATA_FLOAT) {
            memcpy((float *)c->series + (size_t)frame * npix, img, npix * sizeof(float));
        } else {
            int32_t *dst = (int32_t *)c->series + (size_t)frame * npix;
            for (size_t i = 0; i < npix; ++i) dst[i] = counts[i];
        }
        if (frame == nframes - 1) {
            if (nbgi_write_nxmx_panels_set(ctx, &c->outs, c->nxsfile, &c->geom, c->geom_panels, c->e.npanels,
                                           c->filedata == NBGI_DATA_FLOAT ? NBG_DATA_FLOAT32 : NBG_DATA_INT32,
                                           c->series, nframes, c->e.mask) != NBG_OK) {
                out_error(ctx);
                goto done;
            }
            printf("wrote %s as NeXus NXmx (%d frame%s of %s)\n", c->nxsfile, nframes, nframes > 1 ? "s" : "",
                   c->filedata == NBGI_DATA_FLOAT ? "4-byte floats" : "4-byte integers");
        }
    }
    if (c->exptfile != NULL && frame == nframes - 1) {
        /* the images the list names: the NXmx file, else the CBF, SMV or noise series */
        const char *img_path = c->nxsfile != NULL    ? c->nxsfile
                               : c->cbffile != NULL  ? c->cbffile
                               : c->intfile != NULL  ? c->intfile
                               : c->noisefile != NULL ? c->noisefile
                                                      : "";
        char tmpl[PATH_MAX];
        if (c->nxsfile != NULL) {
            snprintf(tmpl, sizeof tmpl, "%s", img_path);
        } else {
            series_template(img_path, nframes, tmpl, sizeof tmpl);
        }
        if (nbgi_write_expt_panels_set(ctx, &c->outs, c->exptfile, &c->geom, c->geom_panels, c->e.npanels, tmpl) !=
            NBG_OK) {
            out_error(ctx);
            goto done;
        }
        printf("wrote %s, the DIALS experiment list (truth: beam, detector, goniometer, scan, crystal)\n",
               c->exptfile);
    }
    if (frame == nframes - 1 && !c->batch && (c->intfile != NULL || (c->noisefile != NULL && !c->nonoise))) {
        print_dials_import(c, c->intfile != NULL ? c->intfile : c->noisefile);
    }
    if (c->floatfile == NULL && c->intfile == NULL && (c->pgmfile == NULL || c->nopgm) &&
        (c->noisefile == NULL || c->nonoise) && c->nxsfile == NULL && c->cbffile == NULL && c->exptfile == NULL) {
        printf("no output file asked for (-floatfile, -intfile, -pgmfile, -noisefile, -nxsfile, -cbffile, "
               "-exptfile)\n");
    }
    ok = 1;
done:
    free(ibuf);
    free(nbuf);
    free(cbuf);
    return ok;
}

void nbgi_cli_print_setup(const nbgi_cli *c, const nbg_report *r)
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

/* Common set-up of a subcommand: parse, check the run's files (extra: the subcommand's own, n of them), create the
 * context, load files, check the mask's size.  Returns the context, or NULL (after printing the error, or after
 * -h, with c->help set). */
nbg_ctx *nbgi_cli_setup(nbgi_cli *c, int argc, char **argv, int first, const nbgi_cli_path_ref *extra, int n)
{
    nbg_ctx *ctx = NULL;
    if (nbg_ctx_create(&ctx, NBG_BACKEND_CPU, NBG_DOUBLE, 0) != NBG_OK) {
        fprintf(stderr, "nbgrad: error: cannot create a context\n");
        return NULL;
    }
    if (!nbgi_cli_parse(ctx, c, argc, argv, first)) {
        nbg_ctx_destroy(ctx);
        return NULL;
    }
    if (c->help) {
        nbg_ctx_destroy(ctx);
        return NULL;
    }
    nbgi_progress_quiet(c->quiet);
    nbg_ctx_destroy(ctx);
    ctx = NULL;
    /* the same file named twice, or an output that is an input: refused before any work */
    nbgi_cli_path paths[16];
    const int np = n < 16 ? n : 16;
    for (int i = 0; i < np; ++i) {
        paths[i].flag = extra[i].flag;
        paths[i].path = *extra[i].ref;
        paths[i].output = extra[i].output;
    }
    if (!nbgi_cli_check_paths(c, paths, np)) {
        return NULL;
    }
    const int rc = nbg_ctx_create(&ctx, c->backend, c->precision, c->threads);
    if (rc != NBG_OK) {
        fprintf(stderr, "nbgrad: error: cannot use the %s backend: %s\n",
                c->backend == NBG_BACKEND_CUDA ? "cuda" : "requested", nbg_strerror(rc));
        return NULL;
    }
    nbg_ctx_set_limits(ctx, &c->limits);
    if (c->backend == NBG_BACKEND_AUTO && nbg_ctx_backend(ctx) == NBG_BACKEND_CPU) {
        printf("no usable GPU: running on the CPU\n");
    }
    if (nbg_ctx_backend(ctx) == NBG_BACKEND_CUDA) {
        nbg_device_info dev;
        if (nbg_ctx_device(ctx, &dev) == NBG_OK) {
            printf("running on the GPU: %s, %d multiprocessors\n", dev.name, dev.units);
        }
    }
    if (!nbgi_cli_load(ctx, c)) {
        nbg_ctx_destroy(ctx);
        return NULL;
    }
    /* a -mask must cover the detector the other flags describe (the kernels index it per pixel) */
    nbg_report r;
    if (nbg_describe(ctx, &c->e, &r) != NBG_OK) {
        fprintf(stderr, "nbgrad: error: %s\n", nbg_errmsg(ctx));
        nbg_ctx_destroy(ctx);
        return NULL;
    }
    if (c->mask != NULL && (c->mask_f != r.fpixels || c->mask_s != r.spixels)) {
        fprintf(stderr, "nbgrad: error: the mask is %dx%d pixels but the detector is %dx%d\n", c->mask_f, c->mask_s,
                r.fpixels, r.spixels);
        nbg_ctx_destroy(ctx);
        return NULL;
    }
    return ctx;
}

int nbgi_cli_commit(nbg_ctx *ctx, nbgi_cli *c)
{
    if (nbgi_outset_commit(ctx, &c->outs) != NBG_OK) {
        fprintf(stderr, "nbgrad: error: %s\n", nbg_errmsg(ctx));
        return 0;
    }
    return 1;
}

/* --- the run's files ------------------------------------------------------------------------------------------ */

/* The canonical name of a file that may not exist yet: its real path, or its directory's real path and its name. */
void nbgi_cli_canonical(const char *path, char *out, size_t size)
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

int nbgi_cli_check_paths(const nbgi_cli *c, const nbgi_cli_path *extra, int n)
{
    nbgi_cli_path p[32];
    int np = 0;
    const int fdump_out = c->hklfile != NULL && !c->nodump;
    const int fdump_in = c->hklfile == NULL && !c->nodump && access(c->dumpfile, R_OK) == 0;
    const nbgi_cli_path own[] = {
        {"-hkl", c->hklfile, 0},         {"-mat", c->matfile, 0},          {"-sourcefile", c->sourcefile, 0},
        {"-mask", c->maskfile, 0},       {"-img", c->imgfile, 0},          {"-dump", fdump_in ? c->dumpfile : NULL, 0},
        {"-dump", fdump_out ? c->dumpfile : NULL, 1},                      {"-floatfile", c->floatfile, 1},
        {"-intfile", c->intfile, 1},     {"-pgmfile", c->nopgm ? NULL : c->pgmfile, 1},
        {"-noisefile", c->nonoise ? NULL : c->noisefile, 1},
        {"-nxsfile", c->nxsfile, 1},     {"-cbffile", c->cbffile, 1},      {"-exptfile", c->exptfile, 1},
        {"-expt", c->exptin, 0},
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
            nbgi_cli_canonical(p[i].path, ca, sizeof ca);
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
        nbgi_cli_canonical(p[i].path, ca, sizeof ca);
        for (int j = 0; j < i; ++j) {
            if (!p[i].output && !p[j].output) {
                continue;
            }
            nbgi_cli_canonical(p[j].path, cb, sizeof cb);
            if (strcmp(ca, cb) != 0) {
                continue;
            }
            if (p[i].output && p[j].output) {
                fprintf(stderr, "nbgrad: error: %s %s and %s %s name the same file: one output would overwrite the "
                        "other\n", p[j].flag, p[j].path, p[i].flag, p[i].path);
            } else {
                const nbgi_cli_path *out = p[i].output ? &p[i] : &p[j], *in = p[i].output ? &p[j] : &p[i];
                fprintf(stderr, "nbgrad: error: the output %s %s is the input %s %s: it would be overwritten\n",
                        out->flag, out->path, in->flag, in->path);
            }
            return 0;
        }
    }
    return 1;
}
