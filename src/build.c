/*
 * build.c -- the experiment builder: nanoBragg's flags parsed into an nbg_experiment and the files they name read
 * into it (src/build.h).  Library code, moved here from the program's src/cli.c: it never prints and never exits.
 * An error is the status returned with its message, naming the flag, file and line, in the context; what the program
 * printed besides (notes on flags, the files read, a drawn seed) is kept in the builder's message list, which the
 * program prints (cli.c: nbgi_cli_say) and nbg_builder_message hands to other callers.
 *
 * Differences from the reference program on purpose: an unknown flag or a missing value is an error that names
 * it (with the closest flag's name when one is close); -cell needs all six values; only the outputs asked for are
 * written; '#' lines in source files are comments; -misset_seed never applies a misset; the phi step at phi = 0
 * uses the unrotated crystal.
 */
#include "build.h"
#include "shots.h"
#include "formats.h"
#include "panels.h"
#include "internal.h"
#include "io.h"
#include "plan.h"

#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

/* --- errors and messages ---------------------------------------------------------------------------------- */

/* Fails with code, the context's message (what the call that failed said) after the prefix fmt makes ("-hkl: ..."). */
static int wrap(nbg_ctx *ctx, int code, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static int wrap(nbg_ctx *ctx, int code, const char *fmt, ...)
{
    char prefix[1024], said[sizeof ctx->errmsg];
    snprintf(said, sizeof said, "%s", nbg_errmsg(ctx));
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(prefix, sizeof prefix, fmt, ap);
    va_end(ap);
    return nbgi_error(ctx, code, "%s: %s", prefix, said);
}

void nbgi_build_say(nbgi_cli *c, int level, const char *fmt, ...)
{
    if (c->nmsgs == c->msgcap) {
        const int cap = c->msgcap > 0 ? 2 * c->msgcap : 8;
        nbgi_msg *m = realloc(c->msgs, (size_t)cap * sizeof *m);
        if (m == NULL) {
            return;
        }
        c->msgs = m;
        c->msgcap = cap;
    }
    va_list ap;
    va_start(ap, fmt);
    const int n = vsnprintf(NULL, 0, fmt, ap);
    va_end(ap);
    char *text = n >= 0 ? malloc((size_t)n + 1) : NULL;
    if (text == NULL) {
        return;
    }
    va_start(ap, fmt);
    vsnprintf(text, (size_t)n + 1, fmt, ap);
    va_end(ap);
    c->msgs[c->nmsgs].level = level;
    c->msgs[c->nmsgs].text = text;
    ++c->nmsgs;
}

void nbgi_build_clear_messages(nbgi_cli *c)
{
    for (int i = 0; i < c->nmsgs; ++i) {
        free(c->msgs[i].text);
    }
    c->nmsgs = 0;
}

/* --- strict argument parsing ----------------------------------------------------------------------------- */

/* Whether a flag has the n values it needs among the nv that follow it. */
static int need(nbg_ctx *ctx, const char *flag, int nv, int n)
{
    if (nv < n) {
        nbgi_error(ctx, NBG_EINVAL, "%s needs %d value%s", flag, n, n > 1 ? "s" : "");
        return 0;
    }
    return 1;
}

int nbgi_number_msg(const char *flag, const char *s, double *out, char *msg, size_t size)
{
    char *end;
    errno = 0;
    const double v = strtod(s, &end);
    if (end == s || *end != '\0' || errno == ERANGE) {
        snprintf(msg, size, "%s expects a number, got '%s'", flag, s);
        return 0;
    }
    if (!isfinite(v)) {
        snprintf(msg, size, "%s must be finite, got '%s'", flag, s);
        return 0;
    }
    *out = v;
    return 1;
}

static int number(nbg_ctx *ctx, const char *flag, const char *s, double *out)
{
    char msg[512];
    if (!nbgi_number_msg(flag, s, out, msg, sizeof msg)) {
        nbgi_error(ctx, NBG_EINVAL, "%s", msg);
        return 0;
    }
    return 1;
}

static int integer(nbg_ctx *ctx, const char *flag, const char *s, int *out)
{
    double v;
    if (!number(ctx, flag, s, &v)) {
        return 0;
    }
    if (v != floor(v) || fabs(v) > 2e9) {
        nbgi_error(ctx, NBG_EINVAL, "%s expects an integer, got '%s'", flag, s);
        return 0;
    }
    *out = (int)v;
    return 1;
}

static int longint(nbg_ctx *ctx, const char *flag, const char *s, long *out)
{
    double v;
    if (!number(ctx, flag, s, &v)) {
        return 0;
    }
    if (v != floor(v) || fabs(v) > 2147483647.0) {
        nbgi_error(ctx, NBG_EINVAL, "%s expects an integer, got '%s'", flag, s);
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
static int numbers(nbg_ctx *ctx, const char *flag, char **s, int n, double *v)
{
    for (int j = 0; j < n; ++j) {
        if (!number(ctx, flag, s[j], &v[j])) {
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
    c->thick_flag = NAN;
    c->thick_abs_flag = NAN;
    nbg_limits_default(&c->limits);
}

void nbgi_build_release(nbgi_cli *c)
{
    nbgi_outset_abort(&c->outs); /* whatever was not committed: the targets stay as they were */
    nbg_hkl_free(&c->hkl);
    free(c->sources);
    c->sources = NULL;
    free(c->mask);
    c->mask = NULL;
    free(c->panels);
    c->panels = NULL;
    free(c->motions);
    c->motions = NULL;
    free(c->domain_rot);
    c->domain_rot = NULL;
    c->ndomain_rot = 0;
    free(c->scan_crystal);
    c->scan_crystal = NULL;
    c->scan_points = 0;
    nbgi_build_clear_messages(c);
    free(c->msgs);
    c->msgs = NULL;
    c->msgcap = 0;
}

/* Reads a file of "index v_1 ... v_n" lines (flag's file at path; '#' starts a comment, blank lines are skipped):
 * each line's n values into out + n * index, 0 <= index < count (n <= 6).  The error names the flag, the file and the
 * line: form is the line's expected form, noun the index's name, has what holds count of them (both for the
 * messages). */
static int read_indexed_rows(nbg_ctx *ctx, const char *flag, const char *path, const char *form, const char *noun,
                             const char *has, int n, int count, double *out)
{
    FILE *f;
    int rc = nbgi_open_input(ctx, path, flag, "r", &f);
    if (rc != NBG_OK) {
        return rc;
    }
    char *line = NULL;
    size_t cap = 0;
    int ln = 0, got;
    while (rc == NBG_OK && (got = nbgi_read_line(ctx, f, &line, &cap, path, ln + 1)) == 1) {
        ++ln; /* a line whole, whatever its length: a long comment stays a comment */
        char *hash = strchr(line, '#');
        if (hash != NULL) {
            *hash = '\0';
        }
        char *p = line;
        while (*p == ' ' || *p == '\t') {
            ++p;
        }
        if (*p == '\n' || *p == '\r' || *p == '\0') {
            continue;
        }
        /* the index, then n numbers, then nothing */
        char *end;
        const long k = strtol(p, &end, 10);
        int ok = end != p && (*end == ' ' || *end == '\t'), finite = 1;
        double v[6];
        for (int j = 0; ok && j < n; ++j) {
            p = end;
            v[j] = strtod(p, &end);
            ok = end != p;
            finite &= isfinite(v[j]) != 0;
        }
        while (ok && (*end == ' ' || *end == '\t' || *end == '\n' || *end == '\r')) {
            ++end;
        }
        if (!ok || *end != '\0') {
            rc = nbgi_error(ctx, NBG_EFORMAT, "%s %s line %d: expected '%s'", flag, path, ln, form);
        } else if (k < 0 || k >= count) {
            rc = nbgi_error(ctx, NBG_EINVAL, "%s %s line %d: %s %ld, and %s", flag, path, ln, noun, k, has);
        } else if (!finite) {
            rc = nbgi_error(ctx, NBG_EFORMAT, "%s %s line %d: a value is not finite", flag, path, ln);
        } else {
            memcpy(out + (size_t)n * (size_t)k, v, sizeof(double) * (size_t)n);
        }
    }
    if (rc == NBG_OK && got < 0) {
        rc = wrap(ctx, got, "%s", flag);
    }
    free(line);
    fclose(f);
    return rc;
}

/* Reads -motions: "group shift_x shift_y shift_z rot_x rot_y rot_z" lines into c->motions. */
static int read_motions(nbg_ctx *ctx, nbgi_cli *c)
{
    double *v = calloc((size_t)c->nmotions * 6, sizeof *v);
    if (v == NULL) {
        return nbgi_error(ctx, NBG_ENOMEM, "out of memory reading -motions");
    }
    for (int g = 0; g < c->nmotions; ++g) {
        memcpy(v + 6 * g, c->motions[g].shift, 3 * sizeof(double));
        memcpy(v + 6 * g + 3, c->motions[g].rot, 3 * sizeof(double));
    }
    char has[128];
    snprintf(has, sizeof has, "the detector has %d groups (0 to %d; see -panel_groups)", c->nmotions,
             c->nmotions - 1);
    const int rc = read_indexed_rows(ctx, "-motions", c->motionsfile, "group shift_x shift_y shift_z rot_x rot_y rot_z",
                                     "group", has, 6, c->nmotions, v);
    for (int g = 0; rc == NBG_OK && g < c->nmotions; ++g) {
        memcpy(c->motions[g].shift, v + 6 * g, 3 * sizeof(double));
        memcpy(c->motions[g].rot, v + 6 * g + 3, 3 * sizeof(double));
    }
    free(v);
    return rc;
}

/* Reads -domain_rot: "domain rot_x rot_y rot_z" lines (deg) into c->domain_rot, which holds every domain's (zero
 * unless listed). */
static int read_domain_rot(nbg_ctx *ctx, nbgi_cli *c)
{
    char has[128];
    snprintf(has, sizeof has, "the crystal has %d mosaic domains (0 to %d; -mosaic_domains)", c->ndomain_rot,
             c->ndomain_rot - 1);
    return read_indexed_rows(ctx, "-domain_rot", c->domainrotfile, "domain rot_x rot_y rot_z", "domain", has, 3,
                             c->ndomain_rot, c->domain_rot);
}

int nbgi_cli_domain_rot(nbg_ctx *ctx, nbgi_cli *c)
{
    nbg_experiment *e = &c->e;
    if (c->domain_rot == NULL) {
        if (e->mosaic_domains <= 0) {
            return nbgi_error(ctx, NBG_EINVAL, "the mosaic domains' own turns need their count: give "
                              "-mosaic_domains n");
        }
        c->domain_rot = calloc((size_t)e->mosaic_domains * 3, sizeof *c->domain_rot);
        if (c->domain_rot == NULL) {
            return nbgi_error(ctx, NBG_ENOMEM, "out of memory for %d domains' turns", e->mosaic_domains);
        }
        c->ndomain_rot = e->mosaic_domains;
    }
    e->domain_rot = c->domain_rot;
    e->ndomain_rot = c->ndomain_rot;
    return NBG_OK;
}

/* Reads the SMV header of -mask / -img into the experiment, as the reference pre-scans them; a status. */
static int ingest_header(nbg_ctx *ctx, nbgi_cli *c, const char *path, int is_mask)
{
    nbg_smv_header h;
    uint16_t *data = NULL;
    const int rc = nbg_read_smv(ctx, path, &h, is_mask ? &data : NULL);
    if (rc != NBG_OK) {
        return wrap(ctx, rc, "%s", is_mask ? "-mask" : "-img");
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
            free(data);
            return nbgi_error(ctx, NBG_EFORMAT, "%s %s: header %s=%g must be %s", is_mask ? "-mask" : "-img", path,
                              keys[k].key, keys[k].v, keys[k].strict ? "positive" : "non-negative");
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
            return nbgi_error(ctx, NBG_ENOMEM, "out of memory reading mask %s", path);
        }
        for (size_t i = 0; i < n; ++i) {
            c->mask[i] = data[i] != 0;
        }
        c->mask_f = h.fpixels;
        c->mask_s = h.spixels;
        free(data);
    }
    return NBG_OK;
}

/* --- the flag table ---------------------------------------------------------------------------------------- */

/*
 * One table, flags[] below, drives the parser (nbgi_build_parse), nbg_flag_info, the program's help (nbgi_cli_usage
 * in src/cli.c, through nbgi_flag_entry) and the manual's list of flags in docs/flags.md (nbgi_cli_flags_markdown,
 * printed by the hidden option `nbgrad --flags-markdown` together with the subcommands' own flags: the tables of
 * src/main.c (grad, gradcheck, refine), src/ensemble.c and src/batch.c (batch, shots), nbgi_sub_flag entries, which
 * also drive each subcommand's -h).  After changing any of these tables,
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

/* Reads a flag's values: v holds the nv arguments that follow it.  Returns how many it used, or -1 with the error
 * in ctx. */
typedef int (*flag_fn)(nbg_ctx *ctx, nbgi_cli *c, const char *flag, int nv, char **v);

typedef struct {
    const char *names;
    flag_kind kind;
    size_t off;          /* where the values go, E() or C(); 0: nowhere */
    int n;               /* K_NUM, K_INT: how many values (at most 4); K_FN: how many at least */
    int value;           /* K_SWITCH: the value stored */
    const char *choices; /* K_CHOICE: the words accepted, space-separated */
    int values[8];       /* K_CHOICE: the value each word stores */
    flag_fn fn;          /* K_FN */
    /* side effects */
    size_t also[2];      /* the (first) value is stored in these fields too: -N sets Nb and Nc */
    size_t set;          /* an int field set to .setv: -polar sets nopolar = 0, -seed have_seed = 1 */
    int setv;
    nbg_pivot pivot;     /* the pivot the flag chooses (honoured in the custom convention only, the last wins) */
    int custom;          /* 1: selects the custom convention; -1: a named one */
    const char *note;    /* a note (NBG_MSG_NOTE) after the flag (and its value, for a string read and dropped) */
    int list;            /* what of the experiment an experiment list gives in the flag's place (NBGI_LIST_*): given
                          * with -expt, where the list has it, the flag is ignored, and a warning names it */
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

static int fn_cell(nbg_ctx *ctx, nbgi_cli *c, const char *flag, int nv, char **v)
{
    int got = 0;
    /* a value may be negative ("-cell 50 60 70 -90 90 90" is then refused by the cell check, by name) */
    while (got < 6 && got < nv && (v[got][0] != '-' || looks_numeric(v[got]))) {
        if (!number(ctx, flag, v[got], &c->e.cell[got])) {
            return -1;
        }
        ++got;
    }
    /* all six: a value left out is no default (nanoBragg would take a = b = c, or 90 deg, silently) */
    if (got < 6) {
        nbgi_error(ctx, NBG_EINVAL, "-cell needs a b c alpha beta gamma (6 values), got %d", got);
        return -1;
    }
    c->e.has_cell = 1;
    return got;
}

static int fn_misset(nbg_ctx *ctx, nbgi_cli *c, const char *flag, int nv, char **v)
{
    if (strcmp(v[0], "random") == 0) {
        c->e.misset_random = 1;
        return 1;
    }
    if (!need(ctx, flag, nv, 3) || !numbers(ctx, flag, v, 3, c->e.misset)) {
        return -1;
    }
    c->e.misset_random = 0;
    return 3;
}

static int fn_space_group(nbg_ctx *ctx, nbgi_cli *c, const char *flag, int nv, char **v)
{
    (void)nv;
    nbg_cell_constraints cc;
    if (strlen(v[0]) >= sizeof c->e.space_group || nbg_cell_constraints_get(NULL, v[0], &cc) != NBG_OK) {
        nbgi_error(ctx, NBG_EINVAL, "%s '%s': not a Hermann-Mauguin symbol (\"P 43 21 2\", \"P43212\", \"C 1 2/c 1\", "
                   "\"R 3 :R\"), a Hall symbol (\" P 4nw 2abw\", \"Hall: P 2y\") or a number 1-230", flag, v[0]);
        return -1;
    }
    char hall[sizeof c->e.space_group];
    const int is_hall = v[0][0] == ' ' || v[0][0] == '-' || strncmp(v[0], "Hall:", 5) == 0;
    if (!is_hall && nbgi_space_group_table_size() > 0 && !nbgi_space_group_hall(v[0], hall, sizeof hall, NULL)) {
        /* it reads as a lattice and rotations, but no setting of the 230 groups has that symbol */
        nbgi_error(ctx, NBG_EINVAL, "%s '%s': no space group has this Hermann-Mauguin symbol (e.g. \"P 43 21 2\", "
                   "\"P43212\", \"C 1 2/c 1\", \"R 3 :R\"; or give a Hall symbol or a number 1-230)", flag, v[0]);
        return -1;
    }
    snprintf(c->e.space_group, sizeof c->e.space_group, "%s", v[0]);
    return 1;
}

static int fn_detector_abs(nbg_ctx *ctx, nbgi_cli *c, const char *flag, int nv, char **v)
{
    if (strstr(v[0], "inf") != NULL) {
        c->e.thick_abs = c->thick_abs_flag = INFINITY;
        return 1;
    }
    if (!number(ctx, flag, v[0], &c->e.thick_abs)) {
        return -1;
    }
    c->thick_abs_flag = c->e.thick_abs;
    return 1;
}

static int fn_energy(nbg_ctx *ctx, nbgi_cli *c, const char *flag, int nv, char **v)
{
    double eV;
    if (!number(ctx, flag, v[0], &eV)) {
        return -1;
    }
    c->e.lambda = 12398.42 / eV;
    return 1;
}

static int fn_threads(nbg_ctx *ctx, nbgi_cli *c, const char *flag, int nv, char **v)
{
    int n;
    if (!integer(ctx, flag, v[0], &n)) {
        return -1;
    }
    if (n < 0 || n > NBG_MAX_THREADS) {
        nbgi_error(ctx, NBG_EINVAL, "-threads must be 0 (the OpenMP default) to %d, got %d", NBG_MAX_THREADS, n);
        return -1;
    }
    c->threads = n;
    return 1;
}

static int fn_max_memory(nbg_ctx *ctx, nbgi_cli *c, const char *flag, int nv, char **v)
{
    double x;
    if (!number(ctx, flag, v[0], &x)) {
        return -1;
    }
    if (!(x > 0)) {
        nbgi_error(ctx, NBG_EINVAL, "-max_memory must be a positive number of GiB, got %g", x);
        return -1;
    }
    c->limits.max_bytes = x * 1073741824.0;
    return 1;
}

static int fn_max_samples(nbg_ctx *ctx, nbgi_cli *c, const char *flag, int nv, char **v)
{
    double x;
    if (!number(ctx, flag, v[0], &x)) {
        return -1;
    }
    if (!(x > 0)) {
        nbgi_error(ctx, NBG_EINVAL, "-max_samples must be positive, got %g", x);
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

/* What an experiment list gives in a flag's place, by NBGI_LIST_* (the help and the warning name it). */
static const char *const list_what[NBGI_LIST_COUNT] = {"", "crystal", "beam", "detector", "scan", "goniometer"};

static const cli_flag flags[] = {
    /* crystal */
    {"-cell", K_FN, .fn = fn_cell, .list = NBGI_LIST_CRYSTAL, .group = G_CRYSTAL, .arg = "a b c alpha beta gamma",
     .help = "unit cell: lengths in A, angles in deg"},
    {"-expt", K_STR, C(exptin), .group = G_DETECTOR, .arg = "file",
     .help = "a DIALS experiment list (one experiment, any number of panels): its detector, beam, goniometer, scan "
             "and crystal replace the flags'"},
    {"-setting", K_STR, C(settingin), .group = G_CRYSTAL, .arg = "file",
     .help = "re-express the crystal of -expt in the basis of the crystal of this experiment list (the same "
             "lattice, e.g. the data's true setting where DIALS chose another): N, the structure factors' indices "
             "and the refined cell then refer to that basis; the change of basis is printed"},
    {"-mat -matrix", K_STR, C(matfile), .list = NBGI_LIST_CRYSTAL, .group = G_CRYSTAL, .arg = "file",
     .help = "MOSFLM A matrix (at the wavelength): the orientation, and the cell without -cell"},
    {"-misset", K_FN, .n = 1, .fn = fn_misset, .list = NBGI_LIST_CRYSTAL,
     .group = G_CRYSTAL, .arg = "rx ry rz | random",
     .help = "misset rotations about x, y, z, deg; random: drawn from -misset_seed"},
    {"-misset_seed", K_LONG, E(misset_seed), .set = C(have_misset_seed), .setv = 1, .list = NBGI_LIST_CRYSTAL,
     .group = G_CRYSTAL,
     .arg = "n", .help = "seed of -misset random (a run without one prints the seed it drew)"},
    {"-space_group", K_FN, .n = 1, .fn = fn_space_group, .group = G_CRYSTAL, .arg = "symbol",
     .help = "the crystal's space group (Hermann-Mauguin \"P 43 21 2\" or P43212, a Hall symbol, or its number): a "
             "refinement of the cell fits only the parameters its lattice leaves free (tetragonal: a = b and c; "
             "wins over -expt's); written lists carry its Hall symbol"},
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
    {"-phi", K_NUM, E(phi0), .list = NBGI_LIST_SCAN,
     .group = G_CRYSTAL, .arg = "deg", .help = "spindle angle at the start, deg"},
    {"-spindle_tilt", K_NUM, E(spindle_tilt), .n = 2, .list = NBGI_LIST_GONIO, .group = G_CRYSTAL, .arg = "t1 t2",
     .help = "turns the rotation axis by t1 deg about unit(axis x beam), then t2 deg about axis x that (refinable as "
             "spindle_tilt1, spindle_tilt2)"},
    {"-osc", K_NUM, E(osc), .list = NBGI_LIST_SCAN, .group = G_CRYSTAL, .arg = "deg", .help = "rotation range, deg"},
    {"-phistep", K_NUM, E(phistep), .group = G_CRYSTAL, .arg = "deg", .help = "rotation step, deg"},
    {"-phisteps", K_COUNT, E(phisteps), .group = G_CRYSTAL, .arg = "n", .help = "rotation steps"},
    CUSTOM_AXIS("-spindle_axis", spindle, "rotation axis", G_CRYSTAL),

    /* structure factors */
    {"-hkl", K_STR, C(hklfile), .group = G_F, .arg = "file",
     .help = "structure factors: \"h k l F\" lines (a 5th and 6th column and # comments are allowed), an MTZ file "
             "(expanded to every symmetry equivalent and Friedel mate) or a DIALS reflection table (.refl: "
             "F = sqrt(max(I, 0)) of its indexed reflections, repeats averaged); told apart by their first bytes"},
    {"-hkl_column", K_STR, C(hklcolumn), .group = G_F, .arg = "label",
     .help = "the MTZ column of -hkl: an amplitude (type F, G) or an intensity (type J, K: F = sqrt(max(I, 0))); "
             "default: the first F, else the first J"},
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
    {"-lambda -wave", K_NUM, E(lambda), .list = NBGI_LIST_BEAM,
     .group = G_BEAM, .arg = "A", .help = "wavelength, A (1)"},
    {"-energy", K_FN, .n = 1, .fn = fn_energy, .list = NBGI_LIST_BEAM, .group = G_BEAM, .arg = "eV",
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
    {"-pixel", K_NUM, E(pixel), .list = NBGI_LIST_DETECTOR,
     .group = G_DETECTOR, .arg = "mm", .help = "pixel size, mm (0.1)"},
    {"-detpixels", K_COUNT, E(fpixels), .also = {E(spixels)}, .list = NBGI_LIST_DETECTOR,
     .group = G_DETECTOR, .arg = "n",
     .help = "pixels along both axes"},
    {"-detpixels_f -detpixels_x", K_COUNT, E(fpixels), .list = NBGI_LIST_DETECTOR, .group = G_DETECTOR, .arg = "n",
     .help = "pixels along the fast axis"},
    {"-detpixels_s -detpixels_y", K_COUNT, E(spixels), .list = NBGI_LIST_DETECTOR, .group = G_DETECTOR, .arg = "n",
     .help = "pixels along the slow axis"},
    {"-detsize", K_NUM, E(detsize_f), .also = {E(detsize_s)}, .list = NBGI_LIST_DETECTOR,
     .group = G_DETECTOR, .arg = "mm",
     .help = "detector size along both axes, mm, when no pixel count is given (102.4)"},
    {"-detsize_f", K_NUM, E(detsize_f), .list = NBGI_LIST_DETECTOR,
     .group = G_DETECTOR, .arg = "mm", .help = "detector size along the fast axis, mm"},
    {"-detsize_s", K_NUM, E(detsize_s), .list = NBGI_LIST_DETECTOR,
     .group = G_DETECTOR, .arg = "mm", .help = "detector size along the slow axis, mm"},
    {"-distance", K_NUM, E(distance), .pivot = NBG_PIVOT_BEAM, .list = NBGI_LIST_DETECTOR,
     .group = G_DETECTOR, .arg = "mm",
     .help = "sample to the direct-beam spot along the beam, mm (100)"},
    {"-close_distance", K_NUM, E(close_distance), .pivot = NBG_PIVOT_SAMPLE, .list = NBGI_LIST_DETECTOR,
     .group = G_DETECTOR, .arg = "mm",
     .help = "sample to the detector plane along its normal, mm"},
    CONVENTION("-mosflm", NBG_CONV_MOSFLM, "MOSFLM convention (the default)"),
    CONVENTION("-denzo", NBG_CONV_DENZO, "DENZO convention"),
    CONVENTION("-adxv", NBG_CONV_ADXV, "ADXV convention"),
    CONVENTION("-xds", NBG_CONV_XDS, "XDS convention (pivot sample; beam centre from -ORGX -ORGY)"),
    CONVENTION("-dials", NBG_CONV_DIALS, "DIALS convention (pivot sample; beam centre from -ORGX -ORGY)"),
    {"-Xbeam", K_NUM, E(Xbeam), .pivot = NBG_PIVOT_BEAM, .list = NBGI_LIST_DETECTOR, .group = G_DETECTOR, .arg = "mm",
     .help = "beam centre, mm, as the convention defines it"},
    {"-Ybeam", K_NUM, E(Ybeam), .pivot = NBG_PIVOT_BEAM, .list = NBGI_LIST_DETECTOR, .group = G_DETECTOR, .arg = "mm",
     .help = "beam centre, mm, as the convention defines it"},
    {"-Xclose", K_NUM, E(Xclose), .pivot = NBG_PIVOT_SAMPLE, .list = NBGI_LIST_DETECTOR,
     .group = G_DETECTOR, .arg = "mm",
     .help = "the detector point nearest the sample, mm"},
    {"-Yclose", K_NUM, E(Yclose), .pivot = NBG_PIVOT_SAMPLE, .list = NBGI_LIST_DETECTOR,
     .group = G_DETECTOR, .arg = "mm",
     .help = "the detector point nearest the sample, mm"},
    {"-ORGX", K_NUM, E(ORGX), .pivot = NBG_PIVOT_SAMPLE, .list = NBGI_LIST_DETECTOR, .group = G_DETECTOR, .arg = "px",
     .help = "XDS origin, fast pixel coordinate"},
    {"-ORGY", K_NUM, E(ORGY), .pivot = NBG_PIVOT_SAMPLE, .list = NBGI_LIST_DETECTOR, .group = G_DETECTOR, .arg = "px",
     .help = "XDS origin, slow pixel coordinate"},
    CUSTOM_AXIS("-fdet_vector", fdet, "detector fast axis", G_DETECTOR),
    CUSTOM_AXIS("-sdet_vector", sdet, "detector slow axis", G_DETECTOR),
    CUSTOM_AXIS("-odet_vector", odet, "detector normal", G_DETECTOR),
    {"-pix0_vector -pix0_vector_mm", K_NUM, 0, .n = 3, .custom = 1,
     .note = " only selects the custom convention; pix0 is derived from the beam centre and distance (as nanoBragg "
             "does)",
     .list = NBGI_LIST_DETECTOR, .group = G_DETECTOR, .arg = "x y z",
     .help = "only selects the custom convention: pix0 follows the beam centre and distance"},
    {"-pivot", K_CHOICE, C(last_pivot), .choices = "beam sample", .values = {NBG_PIVOT_BEAM, NBG_PIVOT_SAMPLE},
     .list = NBGI_LIST_DETECTOR,
     .group = G_DETECTOR, .arg = "beam|sample", .help = "the detector's rotation pivot (custom convention only)"},
    {"-detector_rotx", K_NUM, E(det_rot[0]), .list = NBGI_LIST_DETECTOR,
     .group = G_DETECTOR, .arg = "deg", .help = "detector rotation about x, deg"},
    {"-detector_roty", K_NUM, E(det_rot[1]), .list = NBGI_LIST_DETECTOR,
     .group = G_DETECTOR, .arg = "deg", .help = "detector rotation about y, deg"},
    {"-detector_rotz", K_NUM, E(det_rot[2]), .list = NBGI_LIST_DETECTOR,
     .group = G_DETECTOR, .arg = "deg", .help = "detector rotation about z, deg"},
    {"-detector_tau", K_NUM, E(det_tau), .n = 3, .list = NBGI_LIST_DETECTOR, .group = G_DETECTOR, .arg = "t1 t2 t3",
     .help = "turns the placed detector about its own frame through its point nearest the sample, as DIALS's Tau1-3: "
             "t1 deg about its normal, then t2 about its fast axis, then t3 about its slow axis, the axes as placed "
             "(refinable as det_tau1, det_tau2, det_tau3)"},
    {"-twotheta", K_NUM, E(twotheta), .pivot = NBG_PIVOT_SAMPLE, .list = NBGI_LIST_DETECTOR,
     .group = G_DETECTOR, .arg = "deg",
     .help = "detector swing about the two-theta axis, deg"},
    CUSTOM_AXIS("-twotheta_axis", twotheta_axis, "two-theta axis", G_DETECTOR),
    {"-curved_det", K_SWITCH, E(curved), .value = 1, .group = G_DETECTOR,
     .help = "every pixel at the same distance from the sample"},
    {"-point_pixel", K_SWITCH, E(point_pixel), .value = 1, .group = G_DETECTOR,
     .help = "solid angle 1/R^2, no obliquity factor"},
    {"-roi", K_INT, E(roi), .n = 4, .group = G_DETECTOR, .arg = "xmin xmax ymin ymax",
     .help = "the pixels rendered, inclusive"},
    {"-layout", K_STR, C(layout), .list = NBGI_LIST_DETECTOR, .group = G_DETECTOR, .arg = "name",
     .help = "a built-in multi-panel detector (pilatus6m, eiger2_16m, jungfrau16m, cspad) in the plane that the "
             "detector flags place; sets -pixel and the plane's pixel counts; the image is the panels' concatenation"},
    {"-panel_groups", K_CHOICE, C(panel_groups), .choices = "modules panels detector level1 level2 level3 level4 level5",
     .values = {NBGI_GROUPS_MODULES, NBGI_GROUPS_PANELS, NBGI_GROUPS_DETECTOR, NBGI_GROUPS_LEVEL1,
                NBGI_GROUPS_LEVEL1 + 1, NBGI_GROUPS_LEVEL1 + 2, NBGI_GROUPS_LEVEL1 + 3, NBGI_GROUPS_LEVEL1 + 4},
     .group = G_DETECTOR, .arg = "modules|panels|detector|level<L>",
     .help = "which panels move together in -motions and the panel parameters (-params panel_shift, panel_rot, "
             "g<k>.shift_x ...): the layout's modules or a DIALS list's groups (each panel's parent group in its "
             "hierarchy; a panel under the root alone), every panel alone, the whole detector, or the groups at level L "
             "of the hierarchy as DIALS's detector.hierarchy_level=L counts them (level0 the detector; a layout's "
             "modules are level 1, the CSPAD's quadrants 1 and sensors 2) (modules)"},
    {"-motions", K_STR, C(motionsfile), .group = G_DETECTOR, .arg = "file",
     .help = "rigid motions of the panel groups, a line each: group shift_x shift_y shift_z (mm) rot_x rot_y rot_z "
             "(deg), along and about the panels' frame axes (the detector plane's fast, slow, normal for a layout), "
             "turned about the group's centre; groups not listed stay (refine -motionsfile writes this format)"},
    {"-domain_rot", K_STR, C(domainrotfile), .group = G_CRYSTAL, .arg = "file",
     .help = "a crystal of a few blocks: each mosaic domain's own turn, a line each: domain rot_x rot_y rot_z (deg, "
             "Rz Ry Rx about the lab's axes at phi 0, the crystal's: the spindle turns it, the domain's mosaic "
             "rotation comes after); needs -mosaic_domains n, which then stands without a spread; domains not listed "
             "stay (refine -domain_rotfile writes this format)"},
    {"-mask", K_STR, 0, .group = G_DETECTOR, .arg = "file",
     .help = "SMV mask, 0 skips a pixel; its header, read first, sets the detector"},
    {"-img", K_STR, 0, .group = G_DETECTOR, .arg = "file",
     .help = "SMV image whose header, read first, sets the detector"},
    {"-detector_thick", K_NUM, E(thick), .also = {C(thick_flag)}, .group = G_DETECTOR, .arg = "um",
     .help = "sensor thickness, um (0: none; given with -expt, it replaces the list's)"},
    {"-detector_abs -detector_absorb", K_FN, .n = 1, .fn = fn_detector_abs, .group = G_DETECTOR, .arg = "um|inf",
     .help = "sensor attenuation length, um (inf or 0: no absorption; given with -expt, it replaces the list's)"},
    {"-thicksteps -detector_thicksteps", K_COUNT, E(thicksteps), .group = G_DETECTOR, .arg = "n",
     .help = "sensor layers"},
    {"-sensor", K_CHOICE, E(sensor_model), .choices = "nanobragg physical",
     .values = {NBG_SENSOR_NANOBRAGG, NBG_SENSOR_PHYSICAL}, .group = G_DETECTOR, .arg = "nanobragg|physical",
     .help = "how the sensor's layers absorb: nanoBragg's (every layer weighted by the capture of a slab beyond the "
             "last, for parity with its images) or physical (the sensor's capture shared by layers of equal capture, "
             "each where its photons are absorbed: parallax as DIALS corrects it); default nanoBragg's for the sensor "
             "flags, physical for a sensor an experiment list or image file states"},
    {"-oversample", K_COUNT, E(oversample), .group = G_DETECTOR, .arg = "n", .help = "subpixels per pixel axis"},
    {"-oversample_thick", K_SWITCH, E(oversample_thick), .value = 1, .group = G_DETECTOR,
     .help = "sensor capture at every subpixel (nanoBragg's running-sum semantics)"},
    {"-oversample_polar", K_SWITCH, E(oversample_polar), .value = 1, .group = G_DETECTOR,
     .help = "polarization at every subpixel (nanoBragg's running-sum semantics)"},
    {"-oversample_omega", K_SWITCH, E(oversample_omega), .value = 1, .group = G_DETECTOR,
     .help = "solid angle at every subpixel (nanoBragg's running-sum semantics)"},

    /* output */
    /* the output files: src/outputs.def, each row a flag here */
#define NBGI_CANCEL(f) 0
#define NBGI_NO_CANCEL 0
#define NBGI_OUTPUT(names, field, cancel, format, carries, flat, help_)                                              \
    {names, K_STR, C(field), .group = G_OUTPUT, .arg = "file", .help = help_},
#include "outputs.def"
#undef NBGI_OUTPUT
#undef NBGI_CANCEL
#undef NBGI_NO_CANCEL
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

/* The program's output files (src/outputs.def), in order. */
static const nbgi_output outputs[] = {
#define NBGI_CANCEL(f) (offsetof(nbgi_cli, f) + 1)
#define NBGI_NO_CANCEL 0
#define NBGI_OUTPUT(names, field, cancel, format, carries, flat, help_)                                              \
    {names, offsetof(nbgi_cli, field), cancel, format, carries, flat, help_},
#include "outputs.def"
#undef NBGI_OUTPUT
#undef NBGI_CANCEL
#undef NBGI_NO_CANCEL
};

const nbgi_output *nbgi_output_at(int i)
{
    return i >= 0 && (size_t)i < sizeof outputs / sizeof outputs[0] ? &outputs[i] : NULL;
}

const char *nbgi_output_given(const nbgi_cli *c, const nbgi_output *o)
{
    return *(const char *const *)((const char *)c + o->field);
}

const char *nbgi_output_path(const nbgi_cli *c, const nbgi_output *o)
{
    if (o->cancel != 0 && *(const int *)((const char *)c + o->cancel - 1) != 0) {
        return NULL;
    }
    return nbgi_output_given(c, o);
}

int nbgi_output_carries(const nbgi_cli *c, const nbgi_output *o)
{
    int k = o->carries & ~NBGI_CARRY_DATA;
    if (o->carries & NBGI_CARRY_DATA) {
        k |= c->filedata == NBGI_DATA_FLOAT ? NBGI_CARRY_PHOTONS
             : c->filedata == NBGI_DATA_NOISE ? NBGI_CARRY_NOISE
                                              : NBGI_CARRY_COUNTS;
    }
    return k;
}

const char *nbgi_output_flag(const nbgi_output *o, char *buf, size_t size)
{
    int len = 0;
    const char *w = nbgi_word(o->flags, 0, &len);
    snprintf(buf, size, "%.*s", w != NULL ? len : 0, w != NULL ? w : "");
    return buf;
}
#undef IGNORED_NOTE

const char *nbgi_word(const char *s, int i, int *len)
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
    for (int i = 0; (w = nbgi_word(words, i, &len)) != NULL; ++i) {
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

int nbgi_flag_entry(int i, const char **names, const char **arg, const char **help, int *group)
{
    if (i < 0 || (size_t)i >= sizeof flags / sizeof flags[0]) {
        return 0;
    }
    *names = flags[i].names;
    *arg = flags[i].arg;
    *help = flags[i].help;
    *group = (int)flags[i].group;
    if (flags[i].list != NBGI_LIST_NONE && flags[i].help != NULL) {
        /* the help says what -expt does to the flag (a buffer of one entry: the callers print each as they go) */
        static char buf[1024];
        snprintf(buf, sizeof buf, "%s; with -expt, ignored where the list gives its %s (a warning names it)",
                 flags[i].help, list_what[flags[i].list]);
        *help = buf;
    }
    return 1;
}

const char *nbgi_flag_group_title(int g)
{
    return g >= 0 && g < G_COUNT ? group_title[g] : NULL;
}

/* The edit distance of a and b (insertions, deletions, substitutions, transpositions), capped at 9. */
static int distance(const char *a, size_t na, const char *b, size_t nb)
{
    if (na > 40 || nb > 40) {
        return 9;
    }
    int d[41][41];
    for (size_t i = 0; i <= na; ++i) {
        for (size_t j = 0; j <= nb; ++j) {
            if (i == 0 || j == 0) {
                d[i][j] = (int)(i + j);
                continue;
            }
            int v = d[i - 1][j - 1] + (a[i - 1] != b[j - 1]);
            v = d[i - 1][j] + 1 < v ? d[i - 1][j] + 1 : v;
            v = d[i][j - 1] + 1 < v ? d[i][j - 1] + 1 : v;
            if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1] && d[i - 2][j - 2] + 1 < v) {
                v = d[i - 2][j - 2] + 1;
            }
            d[i][j] = v;
        }
    }
    return d[na][nb] < 9 ? d[na][nb] : 9;
}

/* The flag name closest to a (its length in *len), when one is close: a flag (a leading '-') of 3 letters or more
 * at most 1 edit from a name of the table, 2 for 5 letters or more (the dashes not counted); else NULL. */
static const char *closest_flag(const char *a, int *len)
{
    const char *best = NULL;
    int bestd = 9;
    const char *s = a + strspn(a, "-");
    const size_t ns = strlen(s);
    if (a[0] != '-' || ns < 3) {
        return NULL;
    }
    for (size_t k = 0; k < sizeof flags / sizeof flags[0]; ++k) {
        const char *w;
        int n;
        for (int i = 0; (w = nbgi_word(flags[k].names, i, &n)) != NULL; ++i) {
            const size_t skip = strspn(w, "-");
            const int d = distance(s, ns, w + skip, (size_t)n - skip);
            if (d < bestd) {
                best = w;
                *len = n;
                bestd = d;
            }
        }
    }
    return best != NULL && bestd <= (ns > 4 ? 2 : 1) ? best : NULL;
}

int nbgi_cli_names_output(const char *a)
{
    const cli_flag *f = find_flag(a);
    return f != NULL && f->kind == K_STR && f->group == G_OUTPUT;
}

/* "-pivot expects beam or sample, got 'x'": the words of a choice as a phrase. */
static void choice_error(nbg_ctx *ctx, const cli_flag *f, const char *a, const char *got)
{
    int n = 0, len = 0;
    while (nbgi_word(f->choices, n, &len) != NULL) {
        ++n;
    }
    char words[256];
    size_t at = 0;
    for (int i = 0; i < n && at < sizeof words; ++i) {
        const char *w = nbgi_word(f->choices, i, &len);
        at += (size_t)snprintf(words + at, sizeof words - at, "%s%.*s", i == 0 ? "" : i == n - 1 ? " or " : ", ",
                               len, w);
    }
    nbgi_error(ctx, NBG_EINVAL, "%s expects %s, got '%s'", a, words, got);
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
        nbgi_build_say(c, NBG_MSG_NOTE, "%s%s%s%s", a, echo ? " " : "", echo ? v[0] : "", f->note);
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
static int read_ints(nbg_ctx *ctx, const cli_flag *f, const char *a, char **v, int n, int *k)
{
    for (int j = 0; j < n; ++j) {
        if (!integer(ctx, a, v[j], &k[j])) {
            return 0;
        }
    }
    if (f->kind == K_COUNT && k[0] < 1) {
        nbgi_error(ctx, NBG_EINVAL, "%s must be a positive count, got %d", a, k[0]);
        return 0;
    }
    return 1;
}

/* Converts a flag's values: numbers into x, integers and switch or choice values into k; seeds and strings are
 * stored here, a K_FN reads (and stores) its own.  Returns how many values it used, or -1 after an error. */
static int read_values(nbg_ctx *ctx, nbgi_cli *c, const cli_flag *f, const char *a, int nv, char **v, double *x, int *k)
{
    const int n = arity(f);
    int w;
    switch (f->kind) {
    case K_SWITCH:
        k[0] = f->value;
        return 0;
    case K_NUM:
        return numbers(ctx, a, v, n, x) ? n : -1;
    case K_INT:
    case K_COUNT:
        return read_ints(ctx, f, a, v, n, k) ? n : -1;
    case K_LONG:
        return longint(ctx, a, v[0], field_at(c, f->off)) ? 1 : -1;
    case K_STR:
        if (f->off != 0) {
            *(const char **)field_at(c, f->off) = v[0];
        }
        return 1;
    case K_CHOICE:
        if ((w = word_index(f->choices, v[0])) < 0) {
            choice_error(ctx, f, a, v[0]);
            return -1;
        }
        k[0] = f->values[w];
        return 1;
    case K_FN:
        return f->fn(ctx, c, a, nv, v);
    default:
        return 0;
    }
}

/* Converts and stores the values of one flag (nv arguments follow it in v) and applies its side effects.  Returns
 * how many values it used, or -1 with the error in ctx. */
static int apply_flag(nbg_ctx *ctx, nbgi_cli *c, const cli_flag *f, const char *a, int nv, char **v, int *custom)
{
    if (!need(ctx, a, nv, arity(f))) {
        return -1;
    }
    double x[4] = {0};
    int k[4] = {0};
    const int used = read_values(ctx, c, f, a, nv, v, x, k);
    if (used < 0) {
        return -1;
    }
    store(c, f->off, f->kind, arity(f) > 0 ? arity(f) : 1, x, k);
    side_effects(c, f, a, v, x, k, custom);
    return used;
}

int nbgi_cli_is_flag(const char *name)
{
    return find_flag(name) != NULL;
}

/* --- the parser ---------------------------------------------------------------------------------------------- */

/* Appends word to the comma-separated list in buf (size bytes) unless it is there already; a list that would not
 * fit ends in ", ...". */
static void add_word(char *buf, size_t size, const char *word)
{
    const size_t n = strlen(word);
    for (const char *p = buf; (p = strstr(p, word)) != NULL; p += n) {
        if ((p == buf || p[-1] == ' ') && (p[n] == ',' || p[n] == '\0')) {
            return;
        }
    }
    const size_t used = strlen(buf);
    if (strstr(buf, ", ...") != NULL) {
        return;
    }
    if (used + n + 2 + 6 >= size) {
        snprintf(buf + used, size - used, ", ...");
        return;
    }
    snprintf(buf + used, size - used, "%s%s", used > 0 ? ", " : "", word);
}

int nbgi_build_parse(nbg_ctx *ctx, nbgi_cli *c, int argc, char **argv, int first)
{
    c->handler_failed = 0;
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
                if (!need(ctx, want, argc - i - 1, 1)) {
                    return NBG_EINVAL;
                }
                const int rc = ingest_header(ctx, c, argv[i + 1], pass == 0);
                if (rc != NBG_OK) {
                    return rc;
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
            return NBG_OK;
        }
        if (f != NULL && f->kind != K_REFUSED) {
            used = apply_flag(ctx, c, f, a, argc - i - 1, argv + i + 1, &custom);
            if (used >= 0 && f->list != NBGI_LIST_NONE) {
                add_word(c->list_flags[f->list], sizeof c->list_flags[f->list], a);
            }
        } else if (c->extra_handler != NULL && (used = c->extra_handler(c, argc, argv, i)) != 0) {
            if (used < 0) {
                c->handler_failed = 1; /* it printed its error */
                return nbgi_error(ctx, NBG_EINVAL, "%s: refused by the subcommand's parser", a);
            }
            used = used - 1;
        } else if (f != NULL) {
            return nbgi_error(ctx, NBG_EINVAL, "%s (nanoBragg's debug printout) is not supported", a);
        } else {
            int len = 0;
            const char *near = closest_flag(a, &len);
            if (near != NULL) {
                return nbgi_error(ctx, NBG_EINVAL,
                                  "unknown flag '%s': did you mean '%.*s'? (nbgrad -h lists the flags)", a, len, near);
            }
            return nbgi_error(ctx, NBG_EINVAL, "unknown flag '%s' (nbgrad -h lists the flags)", a);
        }
        if (used < 0) {
            return NBG_EINVAL;
        }
        i += used;
    }
    if (custom) {
        c->e.convention = NBG_CONV_CUSTOM;
        /* nanoBragg honours pivot-setting flags in the custom convention only, the last one winning */
        c->e.pivot = c->last_pivot;
    }
    return NBG_OK;
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
 * basis and both cells said (NBG_MSG_INFO).  A status. */
static int reindex_crystal(nbg_ctx *ctx, nbgi_cli *c, nbg_geometry *g)
{
    if (!g->has_crystal) {
        return nbgi_error(ctx, NBG_EINVAL, "-setting %s re-expresses the crystal of -expt, and %s has none",
                          c->settingin, c->exptin);
    }
    nbg_geometry ref;
    nbg_panel *pan = NULL;
    int np = 0;
    int rc = nbg_read_expt_panels(ctx, c->settingin, &ref, &pan, &np);
    if (rc != NBG_OK) {
        return wrap(ctx, rc, "-setting");
    }
    free(pan);
    if (!ref.has_crystal) {
        return nbgi_error(ctx, NBG_EINVAL, "-setting %s: the list has no crystal to take the setting from",
                          c->settingin);
    }
    int M[9];
    double misfit = 0, before[6], after[6], want[6];
    nbgi_cell_of_vectors(g->real_space, before);
    rc = nbg_geometry_reindex(ctx, g, ref.real_space, M, &misfit);
    if (rc != NBG_OK) {
        return wrap(ctx, rc, "-setting %s: the crystal of -expt %s", c->settingin, c->exptin);
    }
    nbgi_cell_of_vectors(g->real_space, after);
    nbgi_cell_of_vectors(ref.real_space, want);
    if (strcmp(ref.space_group, g->space_group) != 0) {
        memcpy(g->space_group, ref.space_group, sizeof g->space_group);
    }
    char row[3][48];
    for (int i = 0; i < 3; ++i) basis_row(M + 3 * i, row[i], sizeof row[i]);
    nbgi_build_say(c, NBG_MSG_INFO,
                   "-setting %s: the crystal of %s re-expressed in its basis: a, b, c = %s, %s, %s of %s's (largest "
                   "deviation of the change of basis from integers %.2g); cell %.4f %.4f %.4f %.3f %.3f %.3f becomes "
                   "%.4f %.4f %.4f %.3f %.3f %.3f (the reference's: %.4f %.4f %.4f %.3f %.3f %.3f)",
                   c->settingin, c->exptin, row[0], row[1], row[2], c->exptin, misfit, before[0], before[1], before[2],
                   before[3], before[4], before[5], after[0], after[1], after[2], after[3], after[4], after[5], want[0],
                   want[1], want[2], want[3], want[4], want[5]);
    return NBG_OK;
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

/* The flags given that the program's list gives in their place (cli_flag.list): the crystal's, the scan's and the
 * goniometer's where the list has a crystal, the wavelength's and the detector's always.  They are ignored, and
 * said so by name in a warning (they had been ignored without a word; a script may repeat the list's own values). */
static void warn_list_flags(nbgi_cli *c, const char *path, const nbg_geometry *g)
{
    char given[512] = "", gives[128] = "";
    for (int k = 1; k < NBGI_LIST_COUNT; ++k) {
        const int has = k == NBGI_LIST_BEAM || k == NBGI_LIST_DETECTOR || g->has_crystal;
        if (has && c->list_flags[k][0] != '\0') {
            add_word(given, sizeof given, c->list_flags[k]);
            char its[32];
            snprintf(its, sizeof its, "its %s", list_what[k]);
            add_word(gives, sizeof gives, its);
        }
    }
    if (given[0] != '\0') {
        const int one = strchr(given, ',') == NULL;
        nbgi_build_say(c, NBG_MSG_WARNING, "%s ignored: -expt %s gives %s in %s place (give %s without -expt, or "
                       "change the list)", given, path, gives, one ? "its" : "their", one ? "it" : "them");
    }
}

/* An experiment list read into e, as -expt does (nbgi_build_load's -expt; nbgrad batch's and ensemble's per-shot
 * lists): its crystal, beam and detector (np > 1 panels into *pan, the caller frees them, e->panels pointing at them
 * in the list's lab frame; otherwise no panels), with before (e as the flags made it) giving the flags that win over
 * the list's: -space_group, the sampling flags (the mosaic domains, divergence and dispersion, where the list
 * carries nbgrad's), -polar (c->polar_flag), -detector_thick and -detector_abs.  base: the program's -expt
 * (-setting re-expresses its crystal, the notes are said, the flags the list gives in their place are named in a
 * warning, the domains' own turns go into c->domain_rot); else quiet (the turns into *turns).  g receives the list
 * as read. */
static int import_expt(nbg_ctx *ctx, nbgi_cli *c, const char *path, int base, const nbg_experiment *before,
                       nbg_experiment *e, nbg_geometry *g, nbg_panel **pan, int *np, double **turns)
{
    int rc;
    *pan = NULL;
    *np = 0;
    if ((rc = nbg_read_expt_panels(ctx, path, g, pan, np)) != NBG_OK) {
        free(*pan);
        *pan = NULL;
        return rc;
    }
    if (base) {
        warn_list_flags(c, path, g);
    }
    if (base && c->settingin != NULL && (rc = reindex_crystal(ctx, c, g)) != NBG_OK) {
        free(*pan);
        *pan = NULL;
        return rc;
    }
    if ((rc = nbg_experiment_from_geometry(ctx, g, e)) != NBG_OK) {
        free(*pan);
        *pan = NULL;
        return rc;
    }
    if (before->space_group[0] != 0) {
        memcpy(e->space_group, before->space_group, sizeof e->space_group); /* -space_group wins */
    }
    if (g->ndomain_turns > 0) {
        /* the domains' own turns (the list is nbgrad's): the program's list gives them to its experiment (kept in
         * c), a shot's list (batch, ensemble) to its shot's (kept by the caller) */
        double *t = calloc((size_t)g->ndomain_turns * 3, sizeof *t);
        if (t == NULL) {
            free(*pan);
            *pan = NULL;
            return nbgi_error(ctx, NBG_ENOMEM, "%s: out of memory for the domains' turns", path);
        }
        for (int m = 0; m < g->ndomain_turns; ++m) {
            nbgi_domain_turn_angles(g->domain_turn[m], t + 3 * m);
        }
        if (base) {
            free(c->domain_rot);
            c->domain_rot = t;
            c->ndomain_rot = g->ndomain_turns;
        } else if (turns != NULL) {
            *turns = t;
        } else {
            free(t);
            free(*pan);
            *pan = NULL;
            return nbgi_error(ctx, NBG_EINVAL, "%s: its mosaic domains' turns have no place to go", path);
        }
        e->domain_rot = t;
        e->ndomain_rot = g->ndomain_turns;
    }
    if (*np > 1) {
        /* every panel where the list puts it, in its frame (DIALS's, which the experiment now uses), then in the
         * frame of the detector plane (the panel the beam meets): the whole detector moves with it */
        e->panels = *pan;
        e->npanels = *np;
        e->panel_frame = NBG_PANELS_LAB;
        if ((rc = nbgi_panels_to_plane(ctx, e, *pan)) != NBG_OK) {
            free(*pan);
            *pan = NULL;
            e->panels = NULL;
            e->npanels = 0;
            return rc;
        }
    } else {
        free(*pan);
        *pan = NULL;
        *np = 0;
        e->panels = NULL;
        e->npanels = 0;
        e->panel_frame = NBG_PANELS_PLANE;
    }
    if (!isnan(c->polar_flag)) {
        /* -polar given: it wins over the list's beam (dxtbx's NXmx reader, for one, does not read the
         * polarization and writes its synchrotron default) */
        e->polarization = c->polar_flag;
        e->nopolar = 0;
        if (base) {
            nbgi_build_say(c, NBG_MSG_INFO, "note: -polar %g replaces the polarization of -expt %s", c->polar_flag,
                           path);
        }
    } else if (base && (g->polarization_fraction == 0.999 || g->polarization_fraction == 0.5)) {
        /* values dxtbx's readers put in whatever the file said: its NXmx reader ignores the file's Stokes
         * vector and writes 0.999, its CBF reader 0.5; the intensities depend on it (by up to +-15 %) */
        nbgi_build_say(c, NBG_MSG_INFO, "note: -expt %s has the polarization fraction %g, which dxtbx %s; if the "
                       "data were polarized otherwise, give -polar (Kahn factor 2 f - 1) or dials.import "
                       "polarization_fraction=...", path, g->polarization_fraction,
                       g->polarization_fraction == 0.999
                           ? "gives every NXmx file whatever the file states (it does not read its Stokes vector)"
                           : "gives every full CBF file (and nbgrad an unpolarized beam)");
    }
    if (!isnan(c->thick_flag) || !isnan(c->thick_abs_flag)) {
        /* -detector_thick, -detector_abs given: each wins over the list's sensor, as -polar over its beam (dxtbx
         * states a thickness of 0 where the file gives none, the CSPAD's CBF for one) */
        if (base) {
            nbgi_build_say(c, NBG_MSG_INFO, "note: %s%s%s replace%s the sensor of -expt %s (thickness %g mm, mu %g "
                           "/mm)", !isnan(c->thick_flag) ? "-detector_thick" : "",
                           !isnan(c->thick_flag) && !isnan(c->thick_abs_flag) ? " and " : "",
                           !isnan(c->thick_abs_flag) ? "-detector_abs" : "",
                           !isnan(c->thick_flag) && !isnan(c->thick_abs_flag) ? "" : "s", path, g->thickness, g->mu);
        }
        if (!isnan(c->thick_flag)) {
            e->thick = c->thick_flag;
        }
        if (!isnan(c->thick_abs_flag)) {
            e->thick_abs = c->thick_abs_flag;
        }
        e->sensor_model = before->sensor_model; /* the flags' sensor: nanoBragg's model unless -sensor says */
    }
    if (!g->has_mosaic) {
        /* a list without nbgrad's domains (DIALS's): the domains of the mosaic flags are drawn where a run of
         * the same flags draws them, in the frame of the flags' convention, and turned into the list's frame */
        if ((rc = nbgi_convention_frame(ctx, before, e->mosaic_frame)) != NBG_OK) {
            free(*pan);
            *pan = NULL;
            *np = 0;
            e->panels = NULL;
            e->npanels = 0;
            return wrap(ctx, rc, "%s: the frame of the flags' convention", path);
        }
    }
    if (g->has_mosaic || g->has_beam_sampling) {
        keep_sampling_flags(before, e);
    }
    return NBG_OK;
}

int nbgi_build_import_expt(nbg_ctx *ctx, nbgi_cli *c, const char *path, int base, const nbg_experiment *before,
                           nbg_experiment *e, nbg_geometry *g, nbg_panel **pan, int *np, double **turns)
{
    if (turns != NULL) {
        *turns = NULL;
    }
    const int rc = import_expt(ctx, c, path, base, before, e, g, pan, np, turns);
    if (rc != NBG_OK && turns != NULL) {
        free(*turns); /* a shot's turns, read before the step that failed */
        *turns = NULL;
    }
    return rc;
}

/* -expt's scan-varying crystal (g read from c->exptin, its crystal re-expressed by -setting already) into
 * c->scan_crystal: each scan point's basis, re-expressed in the static crystal's (the same lattice, turned a little:
 * the integer change of basis -setting chose, found again for each point). */
static int scan_crystal(nbg_ctx *ctx, nbgi_cli *c, const nbg_geometry *g)
{
    double *rs = NULL;
    int n = 0;
    int rc = nbg_read_expt_scan_crystal(ctx, c->exptin, &rs, &n);
    if (rc != NBG_OK) {
        return wrap(ctx, rc, "-expt");
    }
    for (int k = 0; k < n; ++k) {
        nbg_geometry gk = *g;
        memcpy(gk.real_space, rs + 9 * k, sizeof gk.real_space);
        int M[9];
        double misfit;
        if ((rc = nbg_geometry_reindex(ctx, &gk, g->real_space, M, &misfit)) != NBG_OK) {
            free(rs);
            return wrap(ctx, rc, "-expt %s: the crystal at scan point %d against the static crystal", c->exptin, k);
        }
        memcpy(rs + 9 * k, gk.real_space, sizeof gk.real_space);
    }
    free(c->scan_crystal);
    c->scan_crystal = rs;
    c->scan_points = n;
    c->scan_lambda = g->wavelength;
    nbgi_build_say(c, NBG_MSG_INFO, "read %s: a scan-varying crystal (%d A matrices, one per image boundary, as "
                   "dials.refine writes for a scan): each image gets its own, the mean of the A matrices at its start "
                   "and end (refine fits one crystal for every image, from the static one)", c->exptin, n);
    return NBG_OK;
}

int nbgi_build_frame_crystal(nbg_ctx *ctx, const nbgi_cli *c, int frame, nbg_experiment *e)
{
    if (c->scan_crystal == NULL) {
        return NBG_OK;
    }
    if (frame < 0 || frame + 1 >= c->scan_points) {
        return nbgi_error(ctx, NBG_EINVAL, "image %d: the scan-varying crystal of -expt %s has %d scan points (A at "
                          "the start and end of images 1 to %d)", frame + 1, c->exptin, c->scan_points,
                          c->scan_points - 1);
    }
    /* A = (a* b* c*) columns = the inverse of the basis (rows a, b, c): the image's mean A, then its basis */
    double A0[9], A1[9], Am[9], basis[9];
    if (!nbgi_inverse3(c->scan_crystal + 9 * frame, A0) || !nbgi_inverse3(c->scan_crystal + 9 * (frame + 1), A1)) {
        return nbgi_error(ctx, NBG_EINVAL, "image %d: a singular crystal basis", frame + 1);
    }
    for (int i = 0; i < 9; ++i) {
        Am[i] = 0.5 * (A0[i] + A1[i]);
    }
    if (!nbgi_inverse3(Am, basis)) {
        return nbgi_error(ctx, NBG_EINVAL, "image %d: the mean of its A matrices is singular", frame + 1);
    }
    nbgi_crystal_from_vectors(ctx, basis, c->scan_lambda, e);
    return NBG_OK;
}

int nbgi_build_load(nbg_ctx *ctx, nbgi_cli *c)
{
    nbg_experiment *e = &c->e;
    int rc;
    if (c->exptin != NULL) {
        nbg_geometry g;
        nbg_panel *pan = NULL;
        int np = 0;
        /* the sampling flags given (they win over the mosaic domains and beam sampling of a list nbgrad wrote) */
        const nbg_experiment before = *e;
        if ((rc = nbgi_build_import_expt(ctx, c, c->exptin, 1, &before, e, &g, &pan, &np, NULL)) != NBG_OK) {
            return c->settingin != NULL && strncmp(nbg_errmsg(ctx), "-setting", 8) == 0 ? rc : wrap(ctx, rc, "-expt");
        }
        if (np > 1) {
            free(c->panels);
            c->panels = pan;
            nbgi_build_say(c, NBG_MSG_INFO, "read %s: %d panels", c->exptin, np);
        }
        c->expt_multi_panel = g.multi_panel;
        c->expt_trusted[0] = np > 1 ? NAN : g.trusted[0]; /* the observed image's valid counts (refine, grad) */
        c->expt_trusted[1] = np > 1 ? NAN : g.trusted[1];
        if (g.has_mosaic || g.has_beam_sampling) {
            nbg_experiment list_e = *e; /* the given flags, as they won: tell whether any did */
            const int given = keep_sampling_flags(&before, &list_e);
            char div[96] = "";
            if (!isnan(e->hdivrange) || !isnan(e->vdivrange)) {
                snprintf(div, sizeof div, ", divergence %g x %g mrad", isnan(e->hdivrange) ? 0 : e->hdivrange,
                         isnan(e->vdivrange) ? 0 : e->vdivrange);
            }
            nbgi_build_say(c, NBG_MSG_INFO, "read %s: nbgrad's sampling of it: mosaic spread %g deg over %d domains "
                           "(seed %ld)%s, dispersion %g %%%s", c->exptin, e->mosaic, e->mosaic_domains, e->mosaic_seed,
                           div, isnan(e->dispersion) ? 0 : e->dispersion,
                           given ? " (with the sampling flags given)" : "");
        }
        if (g.crystal_scan_points > 0 && (rc = scan_crystal(ctx, c, &g)) != NBG_OK) {
            return rc;
        }
        if (g.has_crystal && c->matfile != NULL) {
            nbgi_build_say(c, NBG_MSG_INFO, "note: the crystal of -expt %s replaces -mat %s", c->exptin,
                           c->matfile);
            c->matfile = NULL;
        }
        if (c->nframes <= 0) {
            c->nframes = g.nframes;
        }
        nbgi_build_say(c, NBG_MSG_INFO,
                       "read %s: %dx%d pixels of %g mm, wavelength %g A, scan %d image%s from %g deg by %g deg%s",
                       c->exptin, g.fpixels, g.spixels, g.pixel_f, g.wavelength, g.nframes, g.nframes > 1 ? "s" : "",
                       g.scan_start, g.scan_width, g.has_crystal ? ", with a crystal" : "");
    }
    if (c->exptin == NULL && c->settingin != NULL) {
        return nbgi_error(ctx, NBG_EINVAL, "-setting re-expresses the crystal of -expt, and there is no -expt (the "
                          "crystal of -cell, -mat and -misset is in the basis given)");
    }
    if (c->layout != NULL && c->exptin == NULL) {
        /* with -expt the list's detector (its panels) is the detector: -layout is named in its warning */
        int n = 0, F = 0, S = 0;
        double px = 0;
        rc = nbg_layout(ctx, c->layout, NULL, 0, &n, NULL, NULL, NULL);
        if (rc == NBG_OK) {
            free(c->panels);
            c->panels = calloc((size_t)n, sizeof *c->panels);
            rc = c->panels == NULL ? nbgi_error(ctx, NBG_ENOMEM, "out of memory for %d panels", n)
                                   : nbg_layout(ctx, c->layout, c->panels, n, &n, &px, &F, &S);
        }
        if (rc != NBG_OK) {
            return wrap(ctx, rc, "-layout");
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
            } else if (c->panel_groups >= NBGI_GROUPS_LEVEL1) {
                const int l = c->panel_groups - NBGI_GROUPS_LEVEL1 + 1;
                g = c->panels[k].level_group[l];
                if (g < 0) {
                    return nbgi_error(ctx, NBG_EINVAL, "-panel_groups level%d: the detector's hierarchy has no level %d "
                                      "(panel %d is %s)", l, l, k, l == 1 ? "in no group below the detector"
                                                                           : "not that deep");
                }
            }
            c->panels[k].group = g;
            ng = g + 1 > ng ? g + 1 : ng;
        }
        free(c->motions);
        c->motions = calloc((size_t)ng, sizeof *c->motions);
        if (c->motions == NULL) {
            return nbgi_error(ctx, NBG_ENOMEM, "out of memory for %d panel motions", ng);
        }
        c->nmotions = ng;
        if (c->motionsfile != NULL) {
            if ((rc = read_motions(ctx, c)) != NBG_OK) {
                return rc;
            }
            e->motions = c->motions;
            e->nmotions = ng;
        }
    } else if (c->motionsfile != NULL) {
        return nbgi_error(ctx, NBG_EINVAL, "-motions moves panels, and this detector has none (use -layout or a "
                          "multi-panel -expt)");
    }
    if (c->domainrotfile != NULL) {
        if ((rc = nbgi_cli_domain_rot(ctx, c)) != NBG_OK || (rc = read_domain_rot(ctx, c)) != NBG_OK) {
            return rc;
        }
    }
    if (e->npanels > 0) {
        /* the files that describe one flat detector cannot hold several panels (NXmx and experiment lists can) */
        /* the outputs that describe one flat detector (src/outputs.def), then -mask, -img and -roi */
        char flag[64];
        for (int k = 0; nbgi_output_at(k) != NULL; ++k) {
            const nbgi_output *o = nbgi_output_at(k);
            if (o->flat && nbgi_output_given(c, o) != NULL) {
                return nbgi_error(ctx, NBG_EINVAL, "%s describes a single flat detector, and this one has %d panels "
                                  "(-floatfile writes the panels' concatenation; -nxsfile and -exptfile every panel)",
                                  nbgi_output_flag(o, flag, sizeof flag), e->npanels);
            }
        }
        const struct {
            const char *flag, *path;
        } one[] = {{"-mask", c->maskfile}, {"-img", c->imgfile}, {"-roi", e->roi[0] >= 0 ? "" : NULL}};
        for (size_t k = 0; k < sizeof one / sizeof one[0]; ++k) {
            if (one[k].path != NULL) {
                return nbgi_error(ctx, NBG_EINVAL, "%s describes a single flat detector, and this one has %d panels "
                                  "(-floatfile writes the panels' concatenation; -nxsfile and -exptfile every panel)",
                                  one[k].flag, e->npanels);
            }
        }
    }
    if (c->nframes <= 0) {
        c->nframes = 1;
    }
    if (c->matfile != NULL) {
        if ((rc = nbgi_read_matrix(ctx, c->matfile, e->mat)) != NBG_OK) {
            return wrap(ctx, rc, "-mat");
        }
        e->has_mat = 1;
    }
    if (c->hklfile != NULL) {
        char what[640];
        if ((rc = nbg_hkl_read_column(ctx, c->hklfile, c->hklcolumn, e->default_F, &c->hkl, what, sizeof what)) !=
            NBG_OK) {
            return wrap(ctx, rc, "-hkl");
        }
        nbgi_build_say(c, NBG_MSG_INFO, "-hkl %s: %s", c->hklfile, what);
        e->hkl = &c->hkl;
        if (!c->nodump && nbgi_hkl_write_fdump_set(ctx, &c->outs, c->dumpfile, &c->hkl) != NBG_OK) {
            nbgi_build_say(c, NBG_MSG_WARNING, "could not write the F cache: %s", nbg_errmsg(ctx));
        }
    } else if (c->hklcolumn != NULL) {
        return nbgi_error(ctx, NBG_EINVAL, "-hkl_column %s chooses a column of the -hkl file, and no -hkl is given",
                          c->hklcolumn);
    } else if (!c->nodump && access(c->dumpfile, R_OK) == 0) {
        if ((rc = nbg_hkl_read_fdump(ctx, c->dumpfile, &c->hkl)) != NBG_OK) {
            return wrap(ctx, rc, "%s", c->dumpfile);
        }
        nbgi_build_say(c, NBG_MSG_INFO,
                       "reading structure factors from the cache %s (no -hkl given; -nodump ignores it)", c->dumpfile);
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
        if ((rc = nbgi_read_sources(ctx, c->sourcefile, e->lambda, beam, &c->sources, &c->nsources)) != NBG_OK) {
            return wrap(ctx, rc, "-sourcefile");
        }
        e->sources = c->sources;
        e->nsources = c->nsources;
    }
    if (c->mask != NULL) {
        e->mask = c->mask;
    }
    if (e->misset_random && !c->have_misset_seed) {
        e->misset_seed = (long)time(NULL);
        nbgi_build_say(c, NBG_MSG_INFO, "random misset seed: %ld (repeat with -misset_seed %ld)", e->misset_seed,
                       e->misset_seed);
    }
    return NBG_OK;
}

/* --- the public builder (nbgrad.h) -------------------------------------------------------------------------- */

struct nbg_builder {
    nbgi_cli c;
    char **args; /* the builder's copy of the flags parsed: the file names of nbgi_cli point into it */
    int nargs;
    int state;   /* 0 new, 1 parsed, 2 loaded */
};

int nbg_builder_create(nbg_builder **out)
{
    if (out == NULL) {
        return NBG_EINVAL;
    }
    *out = calloc(1, sizeof **out);
    if (*out == NULL) {
        return NBG_ENOMEM;
    }
    nbgi_cli_init(&(*out)->c);
    return NBG_OK;
}

void nbg_builder_destroy(nbg_builder *b)
{
    if (b == NULL) {
        return;
    }
    nbgi_build_release(&b->c);
    for (int i = 0; i < b->nargs; ++i) {
        free(b->args[i]);
    }
    free(b->args);
    free(b);
}

int nbg_builder_parse(nbg_ctx *ctx, nbg_builder *b, int argc, const char *const *argv)
{
    if (ctx == NULL || b == NULL || argc < 0 || (argc > 0 && argv == NULL)) {
        return nbgi_error(ctx, NBG_EINVAL, "nbg_builder_parse: NULL argument");
    }
    if (b->state != 0) {
        return nbgi_error(ctx, NBG_EINVAL, "nbg_builder_parse: the builder has parsed its flags already (one call "
                          "takes them all)");
    }
    b->args = calloc((size_t)argc + 1, sizeof *b->args);
    if (b->args == NULL) {
        return nbgi_error(ctx, NBG_ENOMEM, "out of memory for %d flags", argc);
    }
    int dump = 0;
    for (int i = 0; i < argc; ++i) {
        if (argv[i] == NULL) {
            return nbgi_error(ctx, NBG_EINVAL, "nbg_builder_parse: argv[%d] is NULL", i);
        }
        b->args[i] = strdup(argv[i]);
        if (b->args[i] == NULL) {
            return nbgi_error(ctx, NBG_ENOMEM, "out of memory for the flags");
        }
        b->nargs = i + 1;
        dump |= strcmp(argv[i], "-dump") == 0;
    }
    b->state = 1;
    const int rc = nbgi_build_parse(ctx, &b->c, argc, b->args, 0);
    if (rc != NBG_OK) {
        return rc;
    }
    if (b->c.help) {
        return nbgi_error(ctx, NBG_EINVAL, "-h asks for the program's help, which is no experiment");
    }
    /* a library neither reads nor writes the F cache (Fdump.bin in the working directory) unless -dump names it */
    if (!dump) {
        b->c.nodump = 1;
    }
    return NBG_OK;
}

int nbg_builder_load(nbg_ctx *ctx, nbg_builder *b)
{
    if (ctx == NULL || b == NULL) {
        return nbgi_error(ctx, NBG_EINVAL, "nbg_builder_load: NULL argument");
    }
    if (b->state != 1) {
        return nbgi_error(ctx, NBG_EINVAL, "nbg_builder_load: %s",
                          b->state == 0 ? "no flags parsed yet (nbg_builder_parse)" : "the files are loaded already");
    }
    b->state = 2;
    int rc = nbgi_build_load(ctx, &b->c);
    if (rc == NBG_OK && b->c.outs.n > 0) {
        rc = nbgi_outset_commit(ctx, &b->c.outs); /* the F cache of -hkl, where -dump names it */
    }
    return rc;
}

/* A malloc'd copy of n bytes of p (NULL for NULL); *fail is set when memory is short. */
static void *dup_bytes(const void *p, size_t n, int *fail)
{
    if (p == NULL || n == 0) {
        return NULL;
    }
    void *q = malloc(n);
    if (q == NULL) {
        *fail = 1;
        return NULL;
    }
    return memcpy(q, p, n);
}

int nbg_builder_copy(const nbg_builder *b, nbg_builder **out)
{
    if (b == NULL || out == NULL) {
        return NBG_EINVAL;
    }
    nbg_builder *y = calloc(1, sizeof *y);
    if (y == NULL) {
        return NBG_ENOMEM;
    }
    const nbgi_cli *x = &b->c;
    int fail = 0;
    y->c = *x;
    y->c.extra_handler = NULL;
    y->c.extra = NULL;
    y->c.series = NULL;
    y->c.geom_panels = NULL;
    y->c.msgs = NULL;
    y->c.nmsgs = y->c.msgcap = 0;
    nbgi_outset_init(&y->c.outs);
    y->state = b->state;
    /* the flags (the file names point into them) */
    y->args = calloc((size_t)b->nargs + 1, sizeof *y->args);
    fail |= y->args == NULL;
    for (int i = 0; !fail && i < b->nargs; ++i) {
        y->args[i] = strdup(b->args[i]);
        fail |= y->args[i] == NULL;
        y->nargs = i + 1;
    }
    const char **names[] = {&y->c.hklfile, &y->c.hklcolumn, &y->c.matfile, &y->c.sourcefile, &y->c.dumpfile, &y->c.maskfile,
                            &y->c.imgfile, &y->c.floatfile, &y->c.intfile, &y->c.pgmfile, &y->c.noisefile,
                            &y->c.nxsfile, &y->c.cbffile, &y->c.exptfile, &y->c.exptin, &y->c.settingin,
                            &y->c.layout, &y->c.motionsfile, &y->c.domainrotfile};
    for (size_t k = 0; k < sizeof names / sizeof names[0]; ++k) {
        for (int i = 0; !fail && *names[k] != NULL && i < b->nargs; ++i) {
            if (*names[k] == b->args[i]) {
                *names[k] = y->args[i];
            }
        }
    }
    /* what the experiment points to, where it is the builder's */
    const nbg_hkl *h = &x->hkl;
    y->c.hkl.F = h->F == NULL ? NULL
                              : dup_bytes(h->F, (size_t)(h->h_max - h->h_min + 1) * (size_t)(h->k_max - h->k_min + 1) *
                                                    (size_t)(h->l_max - h->l_min + 1) * sizeof(double), &fail);
    y->c.sources = dup_bytes(x->sources, (size_t)x->nsources * sizeof(nbg_source), &fail);
    y->c.mask = dup_bytes(x->mask, (size_t)x->mask_f * (size_t)x->mask_s, &fail);
    y->c.panels = dup_bytes(x->panels, (size_t)(x->e.npanels > 0 ? x->e.npanels : 0) * sizeof(nbg_panel), &fail);
    y->c.motions = dup_bytes(x->motions, (size_t)(x->nmotions > 0 ? x->nmotions : 0) * sizeof(nbg_panel_motion), &fail);
    y->c.domain_rot = dup_bytes(x->domain_rot, (size_t)(x->ndomain_rot > 0 ? x->ndomain_rot : 0) * 3 * sizeof(double),
                                &fail);
    y->c.scan_crystal = dup_bytes(x->scan_crystal, (size_t)(x->scan_points > 0 ? x->scan_points : 0) * 9 * sizeof(double),
                                  &fail);
    nbg_experiment *e = &y->c.e;
    if (x->e.hkl == &x->hkl) {
        e->hkl = &y->c.hkl;
    }
    if (x->e.sources == x->sources) {
        e->sources = y->c.sources;
    }
    if (x->e.mask == x->mask) {
        e->mask = y->c.mask;
    }
    if (x->e.panels == x->panels) {
        e->panels = y->c.panels;
    }
    if (x->e.motions == x->motions) {
        e->motions = y->c.motions;
    }
    if (x->e.domain_rot == x->domain_rot) {
        e->domain_rot = y->c.domain_rot;
    }
    if (fail) {
        nbg_builder_destroy(y);
        return NBG_ENOMEM;
    }
    *out = y;
    return NBG_OK;
}

nbgi_cli *nbgi_builder_cli(nbg_builder *b)
{
    return b != NULL && b->state == 2 ? &b->c : NULL;
}

nbg_experiment *nbg_builder_experiment(nbg_builder *b)
{
    return b != NULL ? &b->c.e : NULL;
}

nbg_hkl *nbg_builder_hkl(nbg_builder *b)
{
    return b != NULL ? &b->c.hkl : NULL;
}

int nbg_builder_motions(nbg_builder *b, nbg_panel_motion **motions)
{
    if (motions != NULL) {
        *motions = b != NULL ? b->c.motions : NULL;
    }
    return b != NULL ? b->c.nmotions : 0;
}

const uint8_t *nbg_builder_mask(const nbg_builder *b, int *fpixels, int *spixels)
{
    const int have = b != NULL && b->c.mask != NULL;
    if (fpixels != NULL) {
        *fpixels = have ? b->c.mask_f : 0;
    }
    if (spixels != NULL) {
        *spixels = have ? b->c.mask_s : 0;
    }
    return have ? b->c.mask : NULL;
}

int nbg_builder_frames(const nbg_builder *b)
{
    return b != NULL && b->c.nframes > 0 ? b->c.nframes : 1;
}

int nbg_builder_frame(nbg_ctx *ctx, nbg_builder *b, int frame, nbg_experiment *out)
{
    if (b == NULL || out == NULL) {
        return nbgi_error(ctx, NBG_EINVAL, "nbg_builder_frame: NULL argument");
    }
    const int n = nbg_builder_frames(b);
    if (frame < 0 || frame >= n) {
        return nbgi_error(ctx, NBG_EINVAL, "nbg_builder_frame: image %d of a series of %d", frame, n);
    }
    nbg_report r;
    int rc = nbg_describe(ctx, &b->c.e, &r);
    if (rc != NBG_OK) {
        return rc;
    }
    nbg_experiment e = b->c.e;
    e.phi0 = r.phi0 + frame * r.osc;
    if ((rc = nbgi_build_frame_crystal(ctx, &b->c, frame, &e)) != NBG_OK) {
        return rc;
    }
    *out = e;
    return NBG_OK;
}

double nbg_builder_adc(const nbg_builder *b)
{
    return b != NULL ? b->c.adc : 40;
}

int nbg_builder_ctx_create(const nbg_builder *b, nbg_ctx **out)
{
    if (out == NULL) {
        return NBG_EINVAL;
    }
    *out = NULL;
    if (b == NULL) {
        return NBG_EINVAL;
    }
    int rc = nbg_ctx_create(out, b->c.backend, b->c.precision, b->c.threads);
    if (rc == NBG_OK) {
        rc = nbg_ctx_set_limits(*out, &b->c.limits);
    }
    if (rc != NBG_OK) {
        nbg_ctx_destroy(*out);
        *out = NULL;
    }
    return rc;
}

int nbg_builder_nmessages(const nbg_builder *b)
{
    return b != NULL ? b->c.nmsgs : 0;
}

const char *nbg_builder_message(const nbg_builder *b, int i, nbg_msg_level *level)
{
    if (b == NULL || i < 0 || i >= b->c.nmsgs) {
        return NULL;
    }
    if (level != NULL) {
        *level = (nbg_msg_level)b->c.msgs[i].level;
    }
    return b->c.msgs[i].text;
}

int nbg_flag_info(int i, const char **names, const char **arg, const char **help)
{
    const char *n, *a, *h;
    int g;
    if (!nbgi_flag_entry(i, &n, &a, &h, &g)) {
        return NBG_EINVAL;
    }
    if (names != NULL) {
        *names = n;
    }
    if (arg != NULL) {
        *arg = a;
    }
    if (help != NULL) {
        *help = h;
    }
    return NBG_OK;
}
