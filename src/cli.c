/*
 * cli.c -- the nbgrad command-line program: nanoBragg's flags in, the same images out.
 *
 *   nbgrad [simulate] <nanoBragg flags>       render images (float, SMV, PGM, noise)
 *
 * The flags are parsed and the files they name read by the library's builder (src/build.c, which holds the flag
 * table and never prints); this file prints what the builder says and its errors, the help from its table, the
 * subcommands' own flags, and writes the outputs.  Differences from the reference program on purpose: an unknown
 * flag or a missing value is an error that names it (src/build.c lists the parser's); -h/--help prints usage; only
 * the outputs asked for are written; noise needs -noisefile; a run without a seed prints the seed it used.  Outputs
 * are written to a temporary name and renamed, so a failure never leaves a half-written file.
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
#include <sys/mman.h>
#include <sys/stat.h>
#include <math.h>
#ifdef _OPENMP
#include <omp.h>
#endif
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define RTD (180.0 / M_PI)

/* --- the builder, with its messages and errors printed ---------------------------------------------------------- */

void nbgi_cli_say(nbgi_cli *c)
{
    for (int i = 0; i < c->nmsgs; ++i) {
        if (c->msgs[i].level == NBG_MSG_INFO) {
            printf("%s\n", c->msgs[i].text);
        } else {
            fprintf(stderr, "nbgrad: %s: %s\n", c->msgs[i].level == NBG_MSG_NOTE ? "note" : "warning",
                    c->msgs[i].text);
        }
    }
    nbgi_build_clear_messages(c);
}

int nbgi_cli_parse(nbg_ctx *ctx, nbgi_cli *c, int argc, char **argv, int first)
{
    const int rc = nbgi_build_parse(ctx, c, argc, argv, first);
    nbgi_cli_say(c);
    if (rc != NBG_OK && !c->handler_failed) {
        fprintf(stderr, "nbgrad: error: %s\n", nbg_errmsg(ctx));
    }
    return rc == NBG_OK;
}

int nbgi_cli_load(nbg_ctx *ctx, nbgi_cli *c)
{
    const int rc = nbgi_build_load(ctx, c);
    nbgi_cli_say(c);
    if (rc != NBG_OK) {
        fprintf(stderr, "nbgrad: error: %s\n", nbg_errmsg(ctx));
    }
    return rc == NBG_OK;
}

int nbgi_cli_number(const char *flag, const char *s, double *out)
{
    char msg[512];
    if (!nbgi_number_msg(flag, s, out, msg, sizeof msg)) {
        fprintf(stderr, "nbgrad: error: %s\n", msg);
        return 0;
    }
    return 1;
}

void nbgi_cli_free(nbgi_cli *c)
{
    if (c->outs.n > 0) {
        fprintf(stderr, "nbgrad: nothing was written: the %d output%s prepared %s discarded and existing files are "
                "unchanged\n", c->outs.n, c->outs.n > 1 ? "s" : "", c->outs.n > 1 ? "are" : "is");
    }
    free(c->series);
    c->series = NULL;
    free(c->geom_panels);
    c->geom_panels = NULL;
    nbgi_build_release(c); /* the outputs not committed are dropped: the targets stay as they were */
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

int nbgi_cli_write_domain_rot(nbg_ctx *ctx, nbgi_cli *c, const char *path)
{
    nbgi_out o;
    int rc = nbgi_out_open(ctx, path, &o);
    if (rc == NBG_OK) {
        fprintf(o.fp, "# domain rot_x rot_y rot_z (deg): nbgrad -domain_rot\n");
        for (int m = 0; m < c->ndomain_rot; ++m) {
            const double *r = c->domain_rot + 3 * m;
            fprintf(o.fp, "%d %.12g %.12g %.12g\n", m, r[0], r[1], r[2]);
        }
        rc = nbgi_out_finish(ctx, &o, &c->outs);
    }
    if (rc != NBG_OK) {
        fprintf(stderr, "nbgrad: error: %s\n", nbg_errmsg(ctx));
        return 0;
    }
    return 1;
}

int nbgi_cli_image_shape_ok(nbg_ctx *ctx, const nbg_experiment *e, const char *what, const char *path,
                            const nbg_geometry *fg)
{
    if (nbgi_image_shape_check(ctx, e, what, path, fg) != NBG_OK) {
        fprintf(stderr, "nbgrad: error: %s\n", nbg_errmsg(ctx));
        return 0;
    }
    return 1;
}


void nbgi_cli_help_line(FILE *out, const char *names, const char *arg, const char *help, const char *scope,
                       int markdown)
{
    int len = 0, alen = 0;
    const char *name = nbgi_word(names, 0, &len), *alias;
    const char *sp = arg != NULL ? " " : "", *val = arg != NULL ? arg : "";
    if (markdown) {
        fprintf(out, "- `%.*s%s%s`", len, name, sp, val);
        for (int i = 1; (alias = nbgi_word(names, i, &alen)) != NULL; ++i) {
            fprintf(out, "%s`%.*s`", i == 1 ? " (also " : ", ", alen, alias);
        }
        fprintf(out, "%s: %s", nbgi_word(names, 1, &alen) != NULL ? ")" : "", help);
    } else {
        char head[512];
        int at = snprintf(head, sizeof head, "%.*s", len, name);
        for (int i = 1; (alias = nbgi_word(names, i, &alen)) != NULL && at < (int)sizeof head; ++i) {
            at += snprintf(head + at, sizeof head - (size_t)at, ", %.*s", alen, alias);
        }
        if (at < (int)sizeof head) {
            snprintf(head + at, sizeof head - (size_t)at, "%s%s", sp, val);
        }
        fprintf(out, strlen(head) > 30 ? "  %s\n%33s%s" : "  %-30s %s%s", head, "", help);
    }
    fprintf(out, "%s%s%s\n", scope != NULL ? " [" : "", scope != NULL ? scope : "", scope != NULL ? "]" : "");
}

/* Every flag of the builder's table, grouped; markdown: as a list for docs/flags.md. */
static void flags_doc(FILE *out, int markdown)
{
    const char *title, *names, *arg, *help;
    int group;
    for (int g = 0; (title = nbgi_flag_group_title(g)) != NULL; ++g) {
        fprintf(out, markdown ? "**%s**\n\n" : "%s:\n", title);
        for (int k = 0; nbgi_flag_entry(k, &names, &arg, &help, &group); ++k) {
            if (group == g) {
                nbgi_cli_help_line(out, names, arg, help, NULL, markdown);
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
    const char *w, *names, *arg, *help;
    int len, group;
    for (int k = 0; nbgi_flag_entry(k, &names, &arg, &help, &group); ++k) {
        for (int i = 0; (w = nbgi_word(names, i, &len)) != NULL; ++i) {
            fprintf(out, "%.*s\n", len, w);
        }
    }
}

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
    while (f->arg != NULL && nbgi_word(f->arg, nv, &len) != NULL) {
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
    int nr;
    const nbgi_sub_flag *r = nbgi_response_flags(&nr);
    nbgi_sub_flags_doc(out, r, nr, cmd, 0); /* the observed image's detector response, where cmd takes it */
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

/* --- the observed image's detector response (grad, refine, ensemble) ---------------------------------------- */

static int set_finite(void *opts, const char *flag, char **vv, void *dst)
{
    const char *v = vv[0];
    double x;
    if (!nbgi_cli_number(flag, v, &x)) return 0;
    if (!isfinite(x)) {
        fprintf(stderr, "nbgrad: error: %s must be a finite number, got '%s'\n", flag, v);
        return 0;
    }
    *(double *)dst = x;
    return 1;
}

/* Parses a comma list of numbers (-panel_pedestal, -panel_gain, -panel_read_noise: kind 0 finite, 1 > 0, 2 >= 0)
 * into vals (room for cap; NULL: check only); the count, or -1 after printing what is wrong. */
static int value_list(const char *flag, const char *v, int kind, double *vals, int cap)
{
    int n = 0;
    const char *p = v;
    for (;;) {
        char *end;
        errno = 0;
        const double x = strtod(p, &end);
        const int ok = end != p && errno == 0 && isfinite(x) && (kind == 0 || (kind == 1 ? x > 0 : x >= 0)) &&
                       (*end == ',' || *end == '\0');
        if (!ok) {
            fprintf(stderr, "nbgrad: error: %s: '%s' is not a comma-separated list of %s numbers, one per panel\n",
                    flag, v, kind == 0 ? "finite" : kind == 1 ? "positive" : "non-negative");
            return -1;
        }
        if (vals != NULL && n < cap) {
            vals[n] = x;
        }
        ++n;
        if (*end == '\0') {
            return n;
        }
        p = end + 1;
    }
}

static int set_panel_list(void *opts, const char *flag, char **vv, void *dst)
{
    const int kind = strcmp(flag, "-panel_pedestal") == 0 ? 0 : strcmp(flag, "-panel_gain") == 0 ? 1 : 2;
    if (value_list(flag, vv[0], kind, NULL, 0) < 0) {
        return 0;
    }
    *(const char **)dst = vv[0];
    return 1;
}

static int set_nonneg(void *opts, const char *flag, char **vv, void *dst)
{
    const char *v = vv[0];
    double x;
    if (!nbgi_cli_number(flag, v, &x)) return 0;
    if (!(x >= 0) || !isfinite(x)) {
        fprintf(stderr, "nbgrad: error: %s must be a non-negative number, got '%s'\n", flag, v);
        return 0;
    }
    *(double *)dst = x;
    return 1;
}

#define RO(f) offsetof(nbgi_response_opts, f)
#define RESP_CMDS (NBGI_CMD_GRAD | NBGI_CMD_REFINE | NBGI_CMD_ENSEMBLE)
static const nbgi_sub_flag response_flag_table[] = {
    {"-pedestal", RESP_CMDS, set_finite, RO(pedestal), "counts",
     "the observed image's pedestal (default: a DIALS list's where it states one, else the file's; SMV without "
     "ADC_OFFSET: -adc, 40; raw floats: 0)"},
    {"-gain", RESP_CMDS, nbgi_set_positive, RO(gain), "x",
     "counts per photon of the observed image (default: a DIALS list's where it states one, else the file's, else 1)"},
    {"-read_noise", RESP_CMDS, set_nonneg, RO(read_noise), "counts",
     "Gaussian read noise, rms (0); with -loss poisson the shifted-Poisson likelihood"},
    {"-panel_pedestal", RESP_CMDS, set_panel_list, RO(panel[0]), "LIST",
     "the observed image's pedestal per panel, counts: one number per panel, comma-separated, in panel order (a "
     "multi-panel detector; the panels' pedestals instead of -pedestal's)"},
    {"-panel_gain", RESP_CMDS, set_panel_list, RO(panel[1]), "LIST",
     "counts per photon per panel, as -panel_pedestal (each > 0; instead of -gain's)"},
    {"-panel_read_noise", RESP_CMDS, set_panel_list, RO(panel[2]), "LIST",
     "read noise per panel, counts rms, as -panel_pedestal (each >= 0; instead of -read_noise's)"},
};
#undef RO
#undef RESP_CMDS
#define NRESPONSE_FLAGS ((int)(sizeof response_flag_table / sizeof response_flag_table[0]))

void nbgi_response_opts_init(nbgi_response_opts *r)
{
    r->pedestal = r->gain = r->read_noise = NAN;
    r->panel[0] = r->panel[1] = r->panel[2] = NULL;
}

const nbgi_sub_flag *nbgi_response_flags(int *n)
{
    *n = NRESPONSE_FLAGS;
    return response_flag_table;
}

int nbgi_response_flag_parse(nbgi_response_opts *r, unsigned cmd, int argc, char **argv, int i)
{
    return nbgi_sub_flag_parse(response_flag_table, NRESPONSE_FLAGS, cmd, r, argc, argv, i, NULL);
}

int nbgi_response_options(const nbgi_response_opts *r, int npanels, nbg_observed_options *opt, double **values)
{
    static const char *const names[3] = {"-panel_pedestal", "-panel_gain", "-panel_read_noise"};
    nbg_observed_options_default(opt);
    opt->pedestal = r->pedestal;
    opt->gain = r->gain;
    opt->read_noise = r->read_noise;
    *values = NULL;
    if (r->panel[0] == NULL && r->panel[1] == NULL && r->panel[2] == NULL) {
        return 1;
    }
    const int np = npanels > 0 ? npanels : 0;
    double *v = np > 0 ? malloc(sizeof(double) * 3 * (size_t)np) : NULL;
    for (int k = 0; k < 3; ++k) {
        if (r->panel[k] == NULL) {
            continue;
        }
        const int n = value_list(names[k], r->panel[k], k, v != NULL ? v + (size_t)k * np : NULL, np);
        if (np == 0 || n != np || v == NULL) {
            if (n >= 0) {
                fprintf(stderr, "nbgrad: error: %s gives %d value%s, the detector has %d panel%s%s\n", names[k], n,
                        n == 1 ? "" : "s", np, np == 1 ? "" : "s", np == 0 ? " (the single flat detector: use "
                        "-pedestal, -gain, -read_noise)" : "");
            }
            free(v);
            return 0;
        }
    }
    opt->panel_pedestal = r->panel[0] != NULL ? v : NULL;
    opt->panel_gain = r->panel[1] != NULL ? v + np : NULL;
    opt->panel_read_noise = r->panel[2] != NULL ? v + 2 * (size_t)np : NULL;
    opt->npanel_values = np;
    *values = v;
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


void *nbgi_cli_image_alloc(size_t bytes)
{
    enum { HUGE = 2 << 20 };
#ifdef MADV_HUGEPAGE
    if (bytes >= HUGE) {
        const size_t whole = (bytes + HUGE - 1) / HUGE * HUGE;
        void *m = NULL;
        if (whole >= bytes && posix_memalign(&m, HUGE, whole) == 0) {
            (void)madvise(m, whole, MADV_HUGEPAGE); /* advice: where refused, the pages are the usual ones */
            return m;
        }
        return NULL;
    }
#endif
    return malloc(bytes);
}

/* Statistics' lanes: each pixel of a row goes to lane (f - x0) mod NBGI_SL, the lanes' partial sums are added in lane
 * order at the end.  The order is fixed (one thread), so the result is too; the two passes vectorise (one running
 * sum was a chain of dependent additions: 1.8 ms of tric1k's 4 MB image, serial after the simulation). */
enum { NBGI_SL = 8 };

/* One row's pixels f = x0 .. x1 (inclusive) of image row `row` (F wide, mask m or NULL) into the lanes: sums,
 * squares, counts, and each lane's largest value above 0 with its first index. */
static void stats_row(const float *row, const uint8_t *m, long base, int x0, int x1, double *sum, double *sq,
                      long *n, double *mx, long *ix)
{
    int f = x0;
    for (; f + NBGI_SL - 1 <= x1; f += NBGI_SL) {
#pragma omp simd
        for (int j = 0; j < NBGI_SL; ++j) {
            const int on = m == NULL || m[f + j] != 0;
            const double v = on ? (double)row[f + j] : 0.0;
            sum[j] += v;
            sq[j] += v * v;
            n[j] += on;
            const int up = v > mx[j];
            mx[j] = up ? v : mx[j];
            ix[j] = up ? base + f + j : ix[j];
        }
    }
    for (int j = 0; f <= x1; ++f, ++j) {
        if (m == NULL || m[f] != 0) {
            const double v = row[f];
            sum[j] += v;
            sq[j] += v * v;
            n[j] += 1;
            if (v > mx[j]) {
                mx[j] = v;
                ix[j] = base + f;
            }
        }
    }
}

/* One row's squared deviations from mean into the lanes (every pixel, masked or not, as nanoBragg's rmsd) */
static void stats_dev_row(const float *row, int x0, int x1, double mean, double *dev)
{
    int f = x0;
    for (; f + NBGI_SL - 1 <= x1; f += NBGI_SL) {
#pragma omp simd
        for (int j = 0; j < NBGI_SL; ++j) {
            const double d = (double)row[f + j] - mean;
            dev[j] += d * d;
        }
    }
    for (int j = 0; f <= x1; ++f, ++j) {
        const double d = (double)row[f] - mean;
        dev[j] += d * d;
    }
}

void nbgi_cli_stats(const nbgi_cli *c, const nbg_report *r, const float *img, nbgi_stats *st)
{
    const nbg_experiment *e = &c->e;
    /* panels: every pixel of the concatenation, as one row (they have no region of interest) */
    const int F = r->npanels > 1 ? (int)r->npix : r->fpixels, S = r->npanels > 1 ? 1 : r->spixels;
    int x0 = e->roi[0] < 0 ? 0 : e->roi[0], x1 = e->roi[1] < 0 ? F : e->roi[1];
    int y0 = e->roi[2] < 0 ? 0 : e->roi[2], y1 = e->roi[3] < 0 ? S : e->roi[3];
    x1 = x1 < F - 1 ? x1 : F - 1; /* the inclusive bounds as the pixels have them */
    y1 = y1 < S - 1 ? y1 : S - 1;
    double sum[NBGI_SL] = {0}, sq[NBGI_SL] = {0}, mx[NBGI_SL] = {0}, dev[NBGI_SL] = {0};
    long n[NBGI_SL] = {0}, ix[NBGI_SL];
    for (int j = 0; j < NBGI_SL; ++j) {
        ix[j] = -1;
    }
    for (int s = y0; s <= y1 && x0 <= x1; ++s) {
        const long base = (long)s * F;
        stats_row(img + base, e->mask != NULL ? e->mask + base : NULL, base, x0, x1, sum, sq, n, mx, ix);
    }
    /* the lanes in order; the largest value's first pixel (the smallest index among the lanes' equal maxima) */
    double tsum = 0, tsq = 0, max = 0;
    long cnt = 0, imax = -1;
    for (int j = 0; j < NBGI_SL; ++j) {
        tsum += sum[j];
        tsq += sq[j];
        cnt += n[j];
        if (mx[j] > max || (mx[j] == max && ix[j] >= 0 && (imax < 0 || ix[j] < imax))) {
            max = mx[j];
            imax = ix[j];
        }
    }
    const double nn = cnt > 0 ? (double)cnt : 1;
    const double mean = tsum / nn;
    long nall = 0;
    for (int s = y0; s <= y1 && x0 <= x1; ++s) {
        stats_dev_row(img + (long)s * F, x0, x1, mean, dev);
        nall += x1 - x0 + 1;
    }
    double tdev = 0;
    for (int j = 0; j < NBGI_SL; ++j) {
        tdev += dev[j];
    }
    st->max = max;
    st->imax = imax;
    st->sum = tsum;
    st->n = cnt;
    st->mean = mean;
    st->rms = sqrt(tsq / (cnt > 1 ? cnt - 1 : 1));
    st->rmsd = sqrt(tdev / (nall > 1 ? nall - 1 : 1));
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

/* -data float asks for photons: refused for an output whose format holds integers only (src/outputs.def's rows
 * that carry what -data says, and the registry's formats); prints the error. */
int nbgi_cli_data_fits(nbg_ctx *ctx, const nbgi_cli *c)
{
    if (c->filedata != NBGI_DATA_FLOAT) {
        return 1;
    }
    char floats[256], flag[64];
    size_t at = 0;
    floats[0] = '\0';
    for (int k = 0; nbgi_output_at(k) != NULL && at < sizeof floats; ++k) {
        const nbgi_output *o = nbgi_output_at(k);
        const nbgi_image_format *f = nbgi_image_format_named(ctx, o->format);
        if ((o->carries & NBGI_CARRY_DATA) && f != NULL && (f->carries & NBGI_CARRY_PHOTONS)) {
            at += (size_t)snprintf(floats + at, sizeof floats - at, "%s%s", at ? ", " : "",
                                   nbgi_output_flag(o, flag, sizeof flag));
        }
    }
    for (int k = 0; nbgi_output_at(k) != NULL; ++k) {
        const nbgi_output *o = nbgi_output_at(k);
        const nbgi_image_format *f = nbgi_image_format_named(ctx, o->format);
        if ((o->carries & NBGI_CARRY_DATA) && f != NULL && !(f->carries & NBGI_CARRY_PHOTONS) &&
            nbgi_output_path(c, o) != NULL) {
            fprintf(stderr, "nbgrad: error: %s holds integers: -data float is for %s (use -data int or noise)\n",
                    nbgi_output_flag(o, flag, sizeof flag), floats);
            return 0;
        }
    }
    return 1;
}

/* An output's description of frame `frame` (one image) of img: its size, photons, the geometry and the mask; the
 * caller adds what it carries (carry, counts, SMV header, PGM scale). */
static void image_out_init(nbgi_image_out *o, const nbgi_cli *c, const nbg_report *r, const float *img, int frame)
{
    memset(o, 0, sizeof *o);
    o->npix = r->npix;
    o->fpixels = r->fpixels;
    o->spixels = r->spixels;
    o->photons = img;
    o->frame = frame;
    o->nframes = 1;
    o->g = &c->geom;
    o->panels = c->geom_panels;
    o->npanels = c->e.npanels;
    o->mask = c->e.mask;
}

/* The leading outputs written while the statistics are computed (nbgi_cli_write_outputs): the first n of
 * src/outputs.def, each photons alone in a file of one image (-floatfile's raw floats), which need nothing of the
 * statistics or the drawn counts.  Writes them in order, stopping at the first that fails (its error in the
 * context); returns how many were written, their descriptions in o. */
static int early_write(nbg_ctx *ctx, nbgi_cli *c, const nbg_report *r, const float *img, int frame, int n,
                       nbgi_image_out *o)
{
    const int nframes = c->nframes > 0 ? c->nframes : 1;
    for (int k = 0; k < n; ++k) {
        const nbgi_output *out = nbgi_output_at(k);
        char name[PATH_MAX];
        image_out_init(&o[k], c, r, img, frame);
        o[k].carry = NBGI_CARRY_PHOTONS;
        nbgi_frame_name(nbgi_output_path(c, out), frame, nframes, name, sizeof name);
        if (nbgi_image_write(ctx, &c->outs, out->format, name, &o[k]) != NBG_OK) {
            return k;
        }
    }
    return n;
}

int nbgi_cli_write_outputs(nbg_ctx *ctx, nbgi_cli *c, const nbg_report *r, const float *img, int frame)
{
    const int F = r->fpixels, S = r->spixels;
    const size_t npix = r->npix;
    const int nframes = c->nframes > 0 ? c->nframes : 1;
    char name[PATH_MAX];
    /* The leading outputs that need nothing of the statistics (early_write) are written on a second thread while
     * this one computes them: on tric1k (4 MB, two threads) the statistics' two serial passes take 1.8 ms and the
     * raw file's write 1.0 ms.  The second thread is the kernel's OpenMP worker, which is still spinning on its
     * core after the simulation (a new thread of our own found no free core until that worker slept: it started
     * 2-8 ms late on the 2-core machine, and the statistics were done before it).  The
     * write goes to whichever thread claims it first: on a busy machine the worker may not have run by the time
     * the statistics are done, and this thread then writes the files itself.  Their "wrote" lines are printed in
     * their places below. */
    enum { NBGI_EARLY_MAX = 4 };
    int early = 0;
    for (; early < NBGI_EARLY_MAX && nbgi_output_at(early) != NULL; ++early) {
        const nbgi_output *out = nbgi_output_at(early);
        const nbgi_image_format *fmt = nbgi_image_format_named(ctx, out->format);
        if (fmt == NULL || fmt->frames != 1 || (fmt->carries & (NBGI_CARRY_SCALED | NBGI_CARRY_GEOMETRY)) ||
            nbgi_output_carries(c, out) != NBGI_CARRY_PHOTONS || nbgi_output_path(c, out) == NULL) {
            break;
        }
    }
    nbgi_stats st;
    nbgi_image_out early_o[NBGI_EARLY_MAX];
    int early_done = 0, claimed = 0;
    /* a second thread for a large image only (the statistics of 512^2 pixels take ~0.5 ms), with a core for it,
     * and not for batch's shots (they run on their own threads) */
    int two = early > 0 && c->threads != 1 && !c->batch && npix >= ((size_t)1 << 18);
#ifdef _OPENMP
    two = two && omp_get_num_procs() > 1 && !omp_in_parallel();
#endif
#pragma omp parallel num_threads(2) if (two)
    {
        int mine;
#ifdef _OPENMP
        if (omp_get_thread_num() == 0)
#endif
        {
            nbgi_cli_stats(c, r, img, &st);
        }
#pragma omp atomic capture
        mine = claimed++;
        if (mine == 0 && early > 0) {
            early_done = early_write(ctx, c, r, img, frame, early, early_o);
        }
    }
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
    /* what the asked outputs carry, all together */
    int asked = 0;
    for (int k = 0; nbgi_output_at(k) != NULL; ++k) {
        if (nbgi_output_path(c, nbgi_output_at(k)) != NULL) {
            asked |= nbgi_output_carries(c, nbgi_output_at(k));
        }
    }
    if (frame == 0 && (asked & (NBGI_CARRY_GEOMETRY | NBGI_CARRY_COUNTS | NBGI_CARRY_NOISE))) {
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
    uint16_t *ibuf = NULL, *nbuf = NULL;
    int ok = 0;
    /* the outputs, in src/outputs.def's order, each through its format's writer (src/imagefile.c) */
    for (int k = 0; nbgi_output_at(k) != NULL; ++k) {
        const nbgi_output *out = nbgi_output_at(k);
        if (k < early) {
            /* written above */
            if (k >= early_done) {
                out_error(ctx);
                goto done;
            }
            nbgi_frame_name(nbgi_output_path(c, out), frame, nframes, name, sizeof name);
            printf("wrote %s%s%s\n", name, early_o[k].said[0] == ',' ? "" : " ", early_o[k].said);
            continue;
        }
        const nbgi_image_format *fmt = nbgi_image_format_named(ctx, out->format);
        if (fmt == NULL) {
            out_error(ctx);
            goto done;
        }
        const int carry = nbgi_output_carries(c, out);
        /* the counts are drawn at their own output's place (-intfile's, -noisefile's) whenever an output asked for
         * carries them, written or not there: the integer image before the PGM, the noise after it */
        const int draw = carry & (asked & (NBGI_CARRY_COUNTS | NBGI_CARRY_NOISE));
        if ((draw & NBGI_CARRY_COUNTS) && ibuf == NULL) {
            if ((ibuf = nbgi_cli_image_alloc(sizeof(uint16_t) * npix)) == NULL) {
                fprintf(stderr, "nbgrad: error: out of memory for the integer images (%zu pixels)\n", npix);
                goto done;
            }
            if (nbg_int_image(ctx, img, IF, IS, c->e.roi, scale, c->adc, ibuf) != NBG_OK) {
                out_error(ctx);
                goto done;
            }
            printf("intfile_scale = %g\n", scale);
        }
        if ((draw & NBGI_CARRY_NOISE) && nbuf == NULL) {
            if ((nbuf = nbgi_cli_image_alloc(sizeof(uint16_t) * npix)) == NULL) {
                fprintf(stderr, "nbgrad: error: out of memory for the integer images (%zu pixels)\n", npix);
                goto done;
            }
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
        const char *path = nbgi_output_path(c, out);
        if (path == NULL) {
            continue;
        }
        if ((carry & NBGI_CARRY_COUNTS && ibuf == NULL) || (carry & NBGI_CARRY_NOISE && nbuf == NULL)) {
            fprintf(stderr, "nbgrad: error: %s's counts were not drawn (src/outputs.def: its carry has no drawing "
                    "output before it)\n", out->flags);
            goto done;
        }
        nbgi_image_out o;
        image_out_init(&o, c, r, img, frame);
        o.carry = carry & (NBGI_CARRY_PHOTONS | NBGI_CARRY_COUNTS | NBGI_CARRY_NOISE);
        o.counts = carry & NBGI_CARRY_NOISE ? nbuf : ibuf;
        o.smv = &h;
        if (fmt->carries & NBGI_CARRY_SCALED) {
            double ps = c->pgmscale;
            if (ps <= 0) {
                ps = st.rmsd > 0 ? 250.0 / (5.0 * st.rmsd) : scale;
            }
            o.pgm_scale = ps;
        }
        if (fmt->frames == 1) {
            /* one image a file: each frame its own, named by its number */
            nbgi_frame_name(path, frame, nframes, name, sizeof name);
        } else {
            /* the whole series in one file: the frames gathered, written after the last */
            snprintf(name, sizeof name, "%s", path);
            if (o.carry != 0) {
                const size_t elem = o.carry == NBGI_CARRY_PHOTONS ? sizeof(float) : sizeof(int32_t);
                if (frame == 0) {
                    char what[128];
                    snprintf(what, sizeof what, "the frames of %s", fmt->what);
                    if (nbgi_check_bytes(ctx, (double)elem * npix * nframes, what) != NBG_OK) {
                        out_error(ctx);
                        goto done;
                    }
                    free(c->series);
                    c->series = nbgi_cli_image_alloc(elem * npix * nframes);
                    if (c->series == NULL) {
                        fprintf(stderr, "nbgrad: error: out of memory for %d frames of %zu pixels\n", nframes, npix);
                        goto done;
                    }
                }
                if (o.carry == NBGI_CARRY_PHOTONS) {
                    memcpy((float *)c->series + (size_t)frame * npix, img, npix * sizeof(float));
                } else {
                    int32_t *dst = (int32_t *)c->series + (size_t)frame * npix;
                    for (size_t i = 0; i < npix; ++i) dst[i] = o.counts[i];
                }
                o.photons = c->series;
                o.counts = NULL;
                o.counts32 = c->series;
                o.nframes = nframes;
            }
            if (frame != nframes - 1) {
                continue;
            }
        }
        char images[PATH_MAX];
        if (fmt->carries & NBGI_CARRY_GEOMETRY && o.carry == 0) {
            /* an experiment list: it names the images of the run (the NXmx file, else the CBF, SMV or noise series),
             * which are nbgrad's (an NXmx file of modules, each its own slab): the panels' raw offsets in the file
             * the experiment came from (a Pilatus 12M's one array) do not describe them */
            const char *img_path = c->nxsfile != NULL    ? c->nxsfile
                                   : c->cbffile != NULL  ? c->cbffile
                                   : c->intfile != NULL  ? c->intfile
                                   : c->noisefile != NULL ? c->noisefile
                                                          : "";
            if (c->nxsfile != NULL) {
                snprintf(images, sizeof images, "%s", img_path);
            } else {
                series_template(img_path, nframes, images, sizeof images);
            }
            if (img_path[0] != '\0') {
                for (int p = 0; p < c->e.npanels; ++p) {
                    c->geom_panels[p].raw_offset[0] = c->geom_panels[p].raw_offset[1] = 0;
                }
            }
            o.images = images;
        }
        if (nbgi_image_write(ctx, &c->outs, fmt->name, name, &o) != NBG_OK) {
            out_error(ctx);
            goto done;
        }
        printf("wrote %s%s%s\n", name, o.said[0] == ',' ? "" : " ", o.said);
        if (strcmp(fmt->name, "cbf") == 0 && frame == nframes - 1 && !c->batch) {
            cbf_notes(name);
        }
    }
    if (frame == nframes - 1 && !c->batch && (c->intfile != NULL || (c->noisefile != NULL && !c->nonoise))) {
        print_dials_import(c, c->intfile != NULL ? c->intfile : c->noisefile);
    }
    if (asked == 0) {
        char list[512], flag[64];
        size_t at = 0;
        for (int k = 0; nbgi_output_at(k) != NULL && at < sizeof list; ++k) {
            at += (size_t)snprintf(list + at, sizeof list - at, "%s%s", k ? ", " : "",
                                   nbgi_output_flag(nbgi_output_at(k), flag, sizeof flag));
        }
        printf("no output file asked for (%s)\n", list);
    }
    ok = 1;
done:
    free(ibuf);
    free(nbuf);
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
    printf("  %d sources, %d mosaic domains, %d phi steps from %g to %g deg, %dx%d oversample, %d layers%s\n",
           r->nsources, r->mosaic_domains, r->phisteps, r->phi0, r->phi0 + r->osc, r->oversample, r->oversample,
           r->thicksteps, r->sensor_model == NBG_SENSOR_PHYSICAL ? " (physical sensor)" : "");
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
        {"-dump", fdump_out ? c->dumpfile : NULL, 1},
    };
    for (size_t i = 0; i < sizeof own / sizeof own[0]; ++i) {
        if (own[i].path != NULL) {
            p[np++] = own[i];
        }
    }
    /* the output files (src/outputs.def) */
    char oflag[16][64];
    for (int k = 0; nbgi_output_at(k) != NULL && k < 16; ++k) {
        const nbgi_output *o = nbgi_output_at(k);
        if (nbgi_output_path(c, o) != NULL) {
            p[np].flag = nbgi_output_flag(o, oflag[k], sizeof oflag[k]);
            p[np].path = nbgi_output_path(c, o);
            p[np].output = 1;
            ++np;
        }
    }
    if (c->exptin != NULL) {
        p[np].flag = "-expt";
        p[np].path = c->exptin;
        p[np].output = 0;
        ++np;
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
