/*
 * main.c -- the nbgrad program: subcommand dispatch.
 *
 *   nbgrad [simulate] <nanoBragg flags>     render images
 */
#include "cli.h"
#include "formats.h"
#include "internal.h" /* nbgi_debug_break_adjoint */
#include "param.h"     /* nbgi_param_nF */
#include "plan.h"      /* nbgi_response_cursor */

#ifdef NBG_HAVE_FORMATS
#include <jansson.h>
#endif
#include <math.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <errno.h>
#include <time.h>
#include <sys/stat.h>

void usage_main(FILE *out);

/* The words -params takes, generated from the parameter table (nbg_param_info): a line per parameter (name, unit,
 * what it is, the flags that set it, its alias), the families, the groups with their members. */
static void params_help(FILE *out)
{
    fprintf(out, "parameters (-params LIST, comma-separated, in the order given; name, unit, what it is, its flags):\n");
    for (nbg_param p = 0; p < NBG_NPARAMS; ++p) {
        nbg_param_info in;
        if (nbg_param_info_get(p, &in) != NBG_OK) {
            continue;
        }
        fprintf(out, "  %-14s %-12s %s%s%s%s%s%s\n", in.name, in.unit[0] ? in.unit : "-", in.help,
                in.flag[0] ? " (" : "", in.flag, in.flag[0] ? ")" : "", in.alias[0] ? "; also " : "", in.alias);
    }
    fprintf(out, "  (the image model: M = scale * I + bg + bg_fast * x + bg_slow * y, x, y the pixel's fast, slow offset\n"
                 "  from the detector centre in thousands of pixels)\n"
                 "  F              -            the structure factors: every entry of the -hkl table (default_F without\n"
                 "                              one); gradcheck checks them along one direction\n"
                 "  F(h,k,l)       -            one entry of the -hkl table\n"
                 "  g<k>.shift_x g<k>.shift_y g<k>.shift_z (mm), g<k>.rot_x g<k>.rot_y g<k>.rot_z (deg): panel group k's\n"
                 "                              motion, shift along and rotation about its frame's x, y, z (-panel_groups)\n"
                 "  panels, panel_shift, panel_rot, panel_shift_x ... panel_rot_z: those components of every panel group\n"
                 "  d<m>.rot_x d<m>.rot_y d<m>.rot_z (deg): mosaic domain m's own turn about the lab's x, y, z at\n"
                 "                              phi 0 (the crystal's; -domain_rot; -mosaic_domains n)\n"
                 "  domain_rot     the turns of every domain but domain 0 (whose turn the orientation makes)\n"
                 "groups:\n"
                 "  all            the parameters free in the experiment (fluence only when named: scale is an overall\n"
                 "                 factor too); those left out are listed with the reason\n");
    /* the table's groups, each with its members */
    const char *g = nbg_param_groups();
    while (*g != '\0') {
        const size_t len = strcspn(g, " ");
        if (len > 0 && !(len == 3 && strncmp(g, "all", 3) == 0)) {
            fprintf(out, "  %-14.*s", (int)len, g);
            for (nbg_param p = 0; p < NBG_NPARAMS; ++p) {
                nbg_param_info in;
                if (nbg_param_info_get(p, &in) != NBG_OK) {
                    continue;
                }
                for (const char *w = in.groups; *w != '\0';) {
                    const size_t wl = strcspn(w, " ");
                    if (wl == len && strncmp(w, g, len) == 0) {
                        fprintf(out, " %s", in.name);
                        break;
                    }
                    w += wl;
                    w += strspn(w, " ");
                }
            }
            fprintf(out, "\n");
        }
        g += len;
        g += strspn(g, " ");
    }
    fprintf(out, "exit status: 0 done; 1 an error; refine: 2 not converged, 3 converged but the fitted model's floor\n"
                 "            does not match the observed image's (a pedestal or background left out), 4 converged\n"
                 "            but the model does not explain the data within their noise (goodness of fit)\n");
}

/* Options of the gradient subcommands. */
typedef struct {
    char *params;         /* -params, the lists given (joined with commas; malloc'd) */
    nbg_param *ids;       /* the parameters, parsed for the experiment (nbg_params_parse; malloc'd) */
    int nids;
    nbgi_response_opts resp;      /* -pedestal, -gain, -read_noise, -panel_*: the observed image's response */
    const char *motionsout;       /* refine -motionsfile: the fitted motions */
    const char *domainrotout;     /* refine -domain_rotfile: the fitted turns of the mosaic domains */
    const char *hklout;           /* refine -hklout: the fitted structure factors */
    int fit_F;                    /* refine: F listed (the -hkl table's entries fitted; ids holds the others) */
    nbg_optimizer method;
    int max_iter;
    const char *residual;
    double rtol, hscale;
    const char *observed, *json, *weights;
    nbg_loss loss;
    int break_param;
    int spots;                  /* -spots: the box half-width, pixels (-1: the whole image) */
    int spot_shoebox;           /* -spot_shoebox: the shoeboxes' spot pixels dilated by N (-1: not used) */
    double spot_frac;           /* -spot_frac: a spot pixel's model value above the floor, of the peak's (0.05) */
    const char *spotlist;       /* -spotlist: a text file of spot centres "fast slow" */
    const char *centroids;      /* refine -centroids: the model's spot centroids of -spotlist's reflections */
    int centroid_radius;        /* -centroid_radius: their squares' half-width (5) */
    double sv_width;            /* refine -scan_varying: a knot every sv_width deg (0: off) */
    int sv_cell;                /* refine -scan_vary crystal: the cell varies over the scan too */
    unsigned cmd; /* the subcommand: CMD_GRAD, CMD_GRADCHECK or CMD_REFINE */
} grad_opts;

enum { CMD_GRAD = NBGI_CMD_GRAD, CMD_GRADCHECK = NBGI_CMD_GRADCHECK, CMD_REFINE = NBGI_CMD_REFINE };

static void grad_opts_free(grad_opts *o)
{
    free(o->params);
    free(o->ids);
    o->params = NULL;
    o->ids = NULL;
    o->nids = 0;
}

/* Whether a -params word names the panel groups' motions: panels, panel_shift, panel_rot, panel_shift_x ...
 * panel_rot_z (every group's), or g<k>.<component> (*group receives k; -1 for the others). */
static int panel_word(const char *tok, int *group)
{
    static const char *const words[] = {"panels", "panel_shift", "panel_rot", "panel_shift_x", "panel_shift_y",
                                        "panel_shift_z", "panel_rot_x", "panel_rot_y", "panel_rot_z"};
    *group = -1;
    for (size_t k = 0; k < sizeof words / sizeof words[0]; ++k) {
        if (strcmp(tok, words[k]) == 0) {
            return 1;
        }
    }
    const int p = nbg_param_from_name(tok);
    if (p >= NBG_P_MOTION0 && p < NBG_P_DOMAIN0) {
        *group = (p - NBG_P_MOTION0) / 6;
        return 1;
    }
    return 0;
}

/* Whether a parameter is a structure factor (one table entry, or all of them along a direction). */
static int is_F(nbg_param p)
{
    return p >= NBG_P_F_ALL;
}

#ifndef NBG_NO_REFINE
/* A refined entry's label: the parameter's, with ".k<knot>" for a knot of a scan-varying orientation. */
static const char *res_label(const nbg_experiment *e, const nbg_refine_result *res, int j, char *buf, size_t n)
{
    nbg_param_label(e, res->params[j], buf, n);
    if (res->knot != NULL && res->knot[j] >= 0) {
        const size_t l = strlen(buf);
        snprintf(buf + l, n - l, ".k%d", res->knot[j]);
    }
    return buf;
}
#endif

/* Setters of the gradient subcommands' flags: v is the flag's value, dst the field it sets; print the error and
 * return 0 on a bad value. */
static int set_params(void *opts, const char *flag, char **vv, void *dst)
{
    grad_opts *o = opts;
    const char *v = vv[0];
    /* several -params add up: parsed together once the experiment is known */
    const size_t had = o->params != NULL ? strlen(o->params) : 0;
    char *p = realloc(o->params, had + strlen(v) + 2);
    if (p == NULL) {
        fprintf(stderr, "nbgrad: error: out of memory for -params\n");
        return 0;
    }
    snprintf(p + had, strlen(v) + 2, "%s%s", had ? "," : "", v);
    o->params = p;
    return 1;
}

static int set_maxiter(void *opts, const char *flag, char **vv, void *dst)
{
    grad_opts *o = opts;
    const char *v = vv[0];
    double m;
    if (!nbgi_cli_number(flag, v, &m) || m < 1 || m != floor(m)) {
        fprintf(stderr, "nbgrad: error: -maxiter expects a positive integer, got '%s'\n", v);
        return 0;
    }
    o->max_iter = (int)m;
    return 1;
}

static int set_method(void *opts, const char *flag, char **vv, void *dst)
{
    grad_opts *o = opts;
    const char *v = vv[0];
    if (strcmp(v, "lm") == 0) {
        o->method = NBG_OPT_LM;
    } else if (strcmp(v, "bfgs") == 0 || strcmp(v, "lbfgs") == 0) {
        o->method = NBG_OPT_BFGS;
    } else {
        fprintf(stderr, "nbgrad: error: -method expects lm or bfgs, got '%s'\n", v);
        return 0;
    }
    return 1;
}

static int set_scan_vary(void *opts, const char *flag, char **vv, void *dst)
{
    grad_opts *o = opts;
    const char *v = vv[0];
    if (strcmp(v, "orientation") == 0 || strcmp(v, "crystal") == 0) {
        o->sv_cell = strcmp(v, "crystal") == 0;
        return 1;
    }
    fprintf(stderr, "nbgrad: error: -scan_vary expects orientation or crystal, got '%s'\n", v);
    return 0;
}

static int set_loss(void *opts, const char *flag, char **vv, void *dst)
{
    grad_opts *o = opts;
    const char *v = vv[0];
    if (strcmp(v, "lsq") == 0) {
        o->loss = NBG_LOSS_LSQ;
    } else if (strcmp(v, "poisson") == 0) {
        o->loss = NBG_LOSS_POISSON;
    } else {
        fprintf(stderr, "nbgrad: error: -loss expects lsq or poisson, got '%s'\n", v);
        return 0;
    }
    return 1;
}

static int set_break(void *opts, const char *flag, char **vv, void *dst)
{
    grad_opts *o = opts;
    const char *v = vv[0];
    o->break_param = nbg_param_from_name(v);
    if (o->break_param < 0) {
        fprintf(stderr, "nbgrad: error: unknown parameter '%s'\n", v);
        return 0;
    }
    return 1;
}

/* The gradient subcommands' own flags (each takes one value), which subcommands take each, and their help: a flag
 * that only another subcommand takes is refused with a message rather than silently ignored.  Like the flag table
 * of src/cli.c, this table drives the parser (grad_flags), each subcommand's -h and docs/flags.md's "All flags"
 * section (see the comment above that table for how to regenerate it). */
#define GO(field) offsetof(grad_opts, field)
static const nbgi_sub_flag grad_flag_table[] = {
    {"-params", CMD_GRAD | CMD_GRADCHECK | CMD_REFINE, set_params, 0, "LIST",
     "parameters, comma-separated, in the order given: names (nbgrad -h lists them), or groups: all (those free in "
     "the experiment), cell, orientation, crystal, beam, detector, detector_frame (DIALS's six), model, background, "
     "goniometer, spectrum; F (every structure factor; gradcheck: one check along a direction), F(h,k,l) one; with "
     "panels their groups' motions "
     "(-panel_groups): panel_shift, panel_rot, panels (both), panel_shift_x ... panel_rot_z (that component of every "
     "group), g<k>.shift_x ... g<k>.rot_z (one group's); with -mosaic_domains n the domains' own turns: domain_rot "
     "(every domain's but domain 0's), d<m>.rot_x ... d<m>.rot_z (one domain's)"},
    {"-observed", CMD_GRAD | CMD_REFINE, nbgi_set_path, GO(observed), "FILE",
     "observed image (NXmx, CBF, SMV or raw 4-byte floats; grad without it: L = sum of pixels); its mask and "
     "overloads are left out"},
    {"-weights", CMD_GRAD | CMD_REFINE, nbgi_set_path, GO(weights), "FILE",
     "per-pixel weights of the loss, raw 4-byte floats or SMV"},
    {"-loss", CMD_GRAD | CMD_REFINE, set_loss, 0, "lsq|poisson",
     "least squares (the default) or the Poisson negative log-likelihood"},
    {"-json", CMD_GRAD | CMD_REFINE, nbgi_set_path, GO(json), "FILE",
     "the results as JSON, too (docs/json.md describes the fields)"},
    {"-debug_break_adjoint", CMD_GRAD | CMD_GRADCHECK, set_break, 0, "PARAM",
     "testing: corrupts that parameter's adjoint (the check must fail)"},
    {"-rtol", CMD_GRADCHECK, nbgi_set_positive, GO(rtol), "x", "relative tolerance of the check (1e-6)"},
    {"-hscale", CMD_GRADCHECK, nbgi_set_positive, GO(hscale), "x", "scale of the finite-difference steps (1)"},
    {"-method", CMD_REFINE, set_method, 0, "lm|bfgs",
     "Levenberg-Marquardt (the default) or BFGS (also lbfgs)"},
    {"-maxiter", CMD_REFINE, set_maxiter, 0, "n", "iteration limit (100)"},
    {"-motionsfile", CMD_REFINE, nbgi_set_path, GO(motionsout), "FILE",
     "the fitted panel motions, in -motions's format (every group)"},
    {"-domain_rotfile", CMD_REFINE, nbgi_set_path, GO(domainrotout), "FILE",
     "the mosaic domains' fitted turns, in -domain_rot's format (every domain)"},
    {"-centroids", CMD_REFINE, nbgi_set_path, GO(centroids), "FILE",
     "with -spotlist an indexed DIALS reflection table: the centroid of each indexed reflection's own model spot "
     "(its photons alone, no background, within -centroid_radius of the observed centroid) for the start and the "
     "fitted model, against the observed centroid and DIALS's prediction (xyzcal.px): rms printed, a line per "
     "reflection written"},
    {"-centroid_radius", CMD_REFINE, nbgi_set_half_box, GO(centroid_radius), "N",
     "with -centroids: the half-width of the square about each observed centroid, pixels (5)"},
    {"-hklout", CMD_REFINE, nbgi_set_path, GO(hklout), "FILE",
     "with F among -params: the fitted structure factors, \"h k l F\" lines of the entries fitted"},
    {"-scan_varying", CMD_REFINE, nbgi_set_positive, GO(sv_width), "W",
     "over a scan of several frames, a scan-varying orientation: the orientation offsets (orient_x, orient_y, "
     "orient_z among -params) fitted at knots spread evenly over the scan, about one every W deg (at least 2, at "
     "most one a frame), each frame's offsets their linear interpolation at its middle angle; the knots' values and "
     "standard errors are printed (orient_x.k0 ...), -exptfile writes the scan-varying crystal (A_at_scan_points, "
     "one A per image boundary)"},
    {"-scan_vary", CMD_REFINE, set_scan_vary, 0, "orientation|crystal",
     "with -scan_varying, what varies over the scan: the orientation (the default), or the crystal: the orientation "
     "and the unit cell (its parameters among -params, those free under the space group, at the same knots; the "
     "tied ones follow them), as dials.refine's scan-varying crystal"},
    {"-residual", CMD_REFINE, nbgi_set_path, GO(residual), "FILE",
     "the residual image, (observed - pedestal) / gain - model, photons, as raw 4-byte floats"},
    {"-spots", CMD_REFINE, nbgi_set_half_box, GO(spots), "N",
     "fit on spot regions only: the pixels within N pixels (a box) of a spot pixel of the starting model (above its "
     "floor by -spot_frac of its peak) or of a -spotlist centre; the cost scales with those pixels"},
    {"-spot_frac", CMD_REFINE, nbgi_set_positive, GO(spot_frac), "x",
     "with -spots: a spot pixel's starting model exceeds its floor by this fraction of the peak above it (0.05)"},
    {"-spotlist", CMD_REFINE, nbgi_set_path, GO(spotlist), "FILE",
     "spot regions instead of the model's spots: a DIALS reflection table (.refl, e.g. dials.find_spots' strong "
     "spots: each reflection's bounding box on its panel, or with -spots N a box of half-width N about its "
     "centroid), or a text file of \"fast slow\" or \"panel fast slow\" pixel positions a line ('#' comments), "
     "boxes of half-width -spots (3) about them"},
    {"-spot_shoebox", CMD_REFINE, nbgi_set_half_box, GO(spot_shoebox), "N",
     "with -spotlist FILE.refl whose reflections carry shoeboxes (dials.find_spots' strong.refl): the spot regions "
     "are the pixels of each shoebox that DIALS's mask marks as the spot (Foreground or Strong), each with those "
     "within N pixels (a box; 0: the marked pixels alone, at most 1000), instead of boxes"},
};
#undef GO
#define NGRAD_FLAGS (sizeof grad_flag_table / sizeof grad_flag_table[0])

/* A gradient subcommand's -h: its usage, the parameters, its own flags, then nanoBragg's. */
static void grad_usage(unsigned cmd, const char *usage)
{
    printf("%s\n", usage);
    params_help(stdout);
    nbgi_sub_usage(stdout, "", grad_flag_table, (int)NGRAD_FLAGS, cmd);
}

static int grad_flags(nbgi_cli *c, int argc, char **argv, int i)
{
    grad_opts *o = c->extra;
    const char *note = "; gradcheck checks L = sum w I with fixed pseudo-random weights";
    const int used = nbgi_sub_flag_parse(grad_flag_table, (int)NGRAD_FLAGS, o->cmd, o, argc, argv, i,
                                         o->cmd == CMD_GRADCHECK ? note : NULL);
    return used != 0 ? used : nbgi_response_flag_parse(&o->resp, o->cmd, argc, argv, i);
}

/* Common set-up of a subcommand (nbgi_cli_setup) with the gradient subcommands' files; o is NULL for simulate. */
static nbg_ctx *setup(nbgi_cli *c, int argc, char **argv, int first, const grad_opts *o)
{
    if (o == NULL) {
        return nbgi_cli_setup(c, argc, argv, first, NULL, 0);
    }
    const nbgi_cli_path_ref extra[] = {{"-observed", &o->observed, 0}, {"-weights", &o->weights, 0},
                                      {"-json", &o->json, 1}, {"-residual", &o->residual, 1},
                                      {"-spotlist", &o->spotlist, 0}};
    nbg_ctx *ctx = nbgi_cli_setup(c, argc, argv, first, extra, 5);
    if (ctx != NULL && nbgi_json_refused("-json", o->json)) {
        nbg_ctx_destroy(ctx);
        return NULL;
    }
    return ctx;
}

#ifdef NBG_HAVE_FORMATS
/* JSON outputs are written like every other output: to a temporary file in the run's output set, renamed with the
 * rest by nbgi_cli_commit. */
static int json_out(nbg_ctx *ctx, nbgi_cli *c, const char *path, struct json_t *doc)
{
    if (!nbgi_json_write(ctx, &c->outs, path, doc, 1)) {
        return 0;
    }
    printf("wrote %s\n", path);
    return 1;
}
#endif

/* Parses -params for the experiment (nbg_params_parse) into o->ids: gives the experiment its panel motions first
 * when a word names them; refine refuses the structure factors; "all" prints what it takes, and what it leaves
 * out with the reasons (the scalars neither free nor named; fluence beside scale).  Prints the error; 0 on one. */
static int resolve_params(nbg_ctx *ctx, nbgi_cli *c, grad_opts *o)
{
    int all = 0, panels = 0;
    char *words = strdup(o->params);
    if (words == NULL) {
        fprintf(stderr, "nbgrad: error: out of memory for -params\n");
        return 0;
    }
    for (char *save = NULL, *tok = strtok_r(words, ",", &save); tok != NULL; tok = strtok_r(NULL, ",", &save)) {
        int g;
        all |= strcmp(tok, "all") == 0;
        const int pd = nbg_param_from_name(tok);
        if ((strcmp(tok, "domain_rot") == 0 || (pd >= NBG_P_DOMAIN0 && pd < NBG_P_F_ALL)) &&
            nbgi_cli_domain_rot(ctx, c) != NBG_OK) {
            fprintf(stderr, "nbgrad: error: -params %s: %s\n", tok, nbg_errmsg(ctx));
            free(words);
            return 0;
        }
        if (!panel_word(tok, &g)) {
            continue;
        }
        panels = 1;
        if (c->nmotions == 0) {
            fprintf(stderr, "nbgrad: error: the panel parameters (panel_shift, g0.shift_x ...) move panels, and this "
                    "detector has none (use -layout or a multi-panel -expt)\n");
            free(words);
            return 0;
        }
        if (g >= c->nmotions) {
            fprintf(stderr, "nbgrad: error: -params %s: the detector has %d panel groups (g0 to g%d; see "
                    "-panel_groups)\n", tok, c->nmotions, c->nmotions - 1);
            free(words);
            return 0;
        }
    }
    free(words);
    if (panels) {
        c->e.motions = c->motions;
        c->e.nmotions = c->nmotions;
    }
    free(o->ids);
    o->ids = NULL;
    o->nids = 0;
    if (nbg_params_parse(ctx, &c->e, o->params, o->cmd == CMD_GRADCHECK ? NBG_PARSE_F_ALL : 0, &o->ids, &o->nids) !=
        NBG_OK) {
        fprintf(stderr, "nbgrad: error: -params: %s\n", nbg_errmsg(ctx));
        return 0;
    }
    /* refine fits the structure factors as per-reflection scales: the whole table (F), not single entries */
    int nF = 0;
    for (int j = 0; j < o->nids && o->cmd == CMD_REFINE; ++j) {
        nF += is_F(o->ids[j]);
    }
    if (nF > 0) {
        const nbg_hkl *t = c->e.hkl;
        const long size = t == NULL ? 0
                                    : (long)(t->h_max - t->h_min + 1) * (t->k_max - t->k_min + 1) *
                                          (t->l_max - t->l_min + 1);
        if (t == NULL || nF != size) {
            fprintf(stderr, "nbgrad: error: -params: refine fits the structure factors as a whole, the -hkl table's "
                    "entries (F), %s\n", t == NULL ? "and there is no -hkl table (default_F everywhere)"
                                                   : "not single entries F(h,k,l)");
            return 0;
        }
        int k = 0;
        for (int j = 0; j < o->nids; ++j) {
            const nbg_param p = o->ids[j];
            if (is_F(p)) {
                continue;
            }
            if (p == NBG_P_SCALE || p == NBG_P_FLUENCE) {
                printf("note: %s is held: it is an overall factor on every F^2, and the structure factors are "
                       "fitted\n", nbg_param_name(p));
                continue;
            }
            o->ids[k++] = p;
        }
        o->nids = k;
        o->fit_F = 1;
    }
    if (!all) {
        return 1;
    }
    char left[2048] = "", why[512];
    size_t len = 0;
    int nleft = 0;
    for (nbg_param p = 0; p < NBG_NPARAMS; ++p) {
        int listed = 0;
        for (int j = 0; j < o->nids && !listed; ++j) {
            listed = o->ids[j] == p;
        }
        if (listed) {
            continue;
        }
        int fr = nbg_param_free(ctx, &c->e, p, why, sizeof why);
        if (fr < 0) {
            fprintf(stderr, "nbgrad: error: %s\n", nbg_errmsg(ctx));
            return 0;
        }
        if (fr && p == NBG_P_FLUENCE) {
            snprintf(why, sizeof why, "fluence: an overall factor, as scale is (name one of the two)");
            fr = 0;
        } else if (fr && (p == NBG_P_ROTX || p == NBG_P_ROTY || p == NBG_P_ROTZ)) {
            snprintf(why, sizeof why, "%s: the misset angles turn the crystal as orient_x/y/z do (those, without gimbal "
                     "lock; name misset to fit these instead)", nbg_param_name(p));
            fr = 0;
        } else if (fr && (p == NBG_P_DET_TAU1 || p == NBG_P_DET_TAU2 || p == NBG_P_DET_TAU3)) {
            snprintf(why, sizeof why, "%s: the detector's turns about its own frame make, with its shifts, the motions "
                     "det_rotx/y/z make (name detector_frame to fit DIALS's six instead)", nbg_param_name(p));
            fr = 0;
        } else if (fr && (p == NBG_P_BEAM_TILT1 || p == NBG_P_BEAM_TILT2)) {
            snprintf(why, sizeof why, "%s: turning the beam is turning the detector and the crystal the other way (name "
                     "it, and leave out a detector rotation or the orientation, to fit it)", nbg_param_name(p));
            fr = 0;
        }
        if (!fr) {
            len += (size_t)snprintf(left + len, len < sizeof left ? sizeof left - len : 0, "\n  %s", why);
            ++nleft;
        }
    }
    if (o->cmd == CMD_REFINE && !o->fit_F) {
        len += (size_t)snprintf(left + len, len < sizeof left ? sizeof left - len : 0,
                                "\n  F: the structure factors are fitted only when named (F: per-reflection scales)");
        ++nleft;
    }
    int n = 0;
    for (int j = 0; j < o->nids; ++j) {
        n += !is_F(o->ids[j]);
    }
    printf("-params all: %d parameters", n);
    char lab[64];
    for (int j = 0, k = 0; j < o->nids; ++j) {
        if (!is_F(o->ids[j])) {
            printf("%s%s", k++ ? "," : " ", nbg_param_label(&c->e, o->ids[j], lab, sizeof lab));
        }
    }
    printf("\n");
    if (nleft > 0) {
        printf("left out (%d):%s\n", nleft, left);
    }
    return 1;
}

/* Reads frame `frame` of the observed image for c->e (nbg_observed_read, the policy of the library: the detector
 * response from -pedestal, -gain, -read_noise, else the file's, else nanoBragg's ADC offset -adc for SMV without the
 * key; the pixels to leave out: -mask's, the file's mask, its overloads) and prints what it decided and its errors.
 * Frame 0 sets c->e.response and c->e.mask (to *use, which the caller frees); a later frame keeps the first one's
 * response.  geom (NULL: not wanted) receives what the file says of the geometry (its scan_stated says whether it
 * states the image's start angle). */
static float *read_observed(nbg_ctx *ctx, nbgi_cli *c, const grad_opts *o, int frame, uint8_t **use,
                            nbg_geometry *geom)
{
    nbg_observed_options opt;
    double *values = NULL;
    *use = NULL;
    if (!nbgi_response_options(&o->resp, c->e.npanels, &opt, &values)) {
        return NULL;
    }
    opt.adc = c->adc;
    opt.what = "-observed";
    opt.mask_what = "-mask";
    opt.trusted[0] = c->expt_trusted[0];
    opt.trusted[1] = c->expt_trusted[1];
    nbg_observed ob;
    const int st = nbg_observed_read(ctx, &c->e, o->observed, frame, &opt, &ob);
    free(values);
    if (st != NBG_OK) {
        fprintf(stderr, "nbgrad: error: %s\n", nbg_errmsg(ctx));
        return NULL;
    }
    if (geom != NULL) {
        *geom = ob.geometry;
    }
    if (frame == 0) { /* the detector response is the first frame's */
        /* the panels are the builder's copy, which this run owns */
        if (nbg_observed_apply_response(ctx, &ob, &c->e, (nbg_panel *)c->e.panels, c->e.npanels) != NBG_OK) {
            fprintf(stderr, "nbgrad: error: %s\n", nbg_errmsg(ctx));
            nbg_observed_free(&ob);
            return NULL;
        }
        printf("%s\n", ob.response_text);
        if (ob.note[0] != '\0') {
            printf("note: %s\n", ob.note);
        }
        c->e.mask = ob.use;
    }
    if (ob.left_out[0] != '\0') {
        printf("%s\n", ob.left_out);
    }
    *use = ob.use;
    free(ob.panel_response); /* copied onto the panels */
    return ob.image;
}

/* Compares the observed image's floor with the model's (nbg_check_floor) and prints a warning naming the likely
 * cause.  Returns 1 when they disagree. */
static int floor_warning(nbg_ctx *ctx, const nbgi_cli *c, const float *obs, const float *wts, const float *model,
                         size_t npix, const char *when)
{
    nbg_floor_check fc;
    if (nbg_check_floor(ctx, &c->e, obs, wts, model, npix, &fc) != NBG_OK || !fc.mismatch) {
        return 0;
    }
    if (fc.floor > fc.model_floor) {
        double ped = fc.floor - fc.model_floor + c->e.response.pedestal;
        if (fabs(ped - round(ped)) < 0.1) {
            ped = round(ped); /* counts are integers; the model's floor carries a little of the spots' tails */
        }
        printf("WARNING%s: the observed image has a floor of %g counts (5th percentile of %ld pixels) but the model's "
               "is %g: give its pedestal with -pedestal %.4g (nanoBragg's ADC offset is 40; -pedestal now %g) or "
               "refine bg\n", when, fc.floor, fc.npix, fc.model_floor, ped, c->e.response.pedestal);
    } else {
        printf("WARNING%s: the observed image's floor of %g counts (5th percentile of %ld pixels) lies below the "
               "model's %g: the pedestal (-pedestal %g) or the background is too large\n", when, fc.floor, fc.npix,
               fc.model_floor, c->e.response.pedestal);
    }
    return 1;
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* gradcheck's progress, on stderr: a line per parameter once the run has taken more than 3 s (on a terminal, a bar
 * from the start). */
static void gradcheck_progress(void *user, const char *what, int done, int total)
{
    const double t = now_s() - *(const double *)user;
    nbgi_progress(t > 3, done, total, "gradcheck: %s checked (%d of %d), %.1f s", what, done, total, t);
}

static int cmd_gradcheck(int argc, char **argv, int first)
{
    nbgi_cli c;
    grad_opts o = {0};
    o.break_param = -1;
    nbgi_response_opts_init(&o.resp);
    o.cmd = CMD_GRADCHECK;
    nbgi_cli_init(&c);
    c.extra_handler = grad_flags;
    c.extra = &o;
    c.nodump = 1;
    int status = 1;
    nbg_gradcheck_result *res = NULL;
    nbg_ctx *ctx = setup(&c, argc, argv, first, &o);
    if (ctx == NULL) {
        if (c.help) {
            grad_usage(CMD_GRADCHECK, "usage: nbgrad gradcheck <nanoBragg flags> -params LIST [-rtol 1e-6] [-hscale 1]");
            status = 0;
        }
        grad_opts_free(&o);
        c.extra = NULL;
        nbgi_cli_free(&c);
        return status;
    }
    if (o.params == NULL || o.params[0] == '\0') {
        fprintf(stderr, "nbgrad: error: gradcheck needs -params (e.g. -params a,b,c,rotx,distance)\n");
        goto done;
    }
    if (!resolve_params(ctx, &c, &o)) {
        goto done;
    }
    nbgi_debug_break_adjoint(ctx, o.break_param);
    const int n = o.nids;
    res = calloc((size_t)n + 1, sizeof *res);
    if (res == NULL) {
        fprintf(stderr, "nbgrad: error: out of memory for %d checks\n", n);
        goto done;
    }
    const double t0 = now_s();
    nbg_ctx_set_progress(ctx, gradcheck_progress, (void *)&t0);
    printf("checking the adjoint against central differences of L = sum_p w_p M_p, fixed pseudo-random weights w_p "
           "in [0.5, 1.5), M = scale * I + background (the model image)\n");
    fflush(stdout);
    const int grc = nbg_gradcheck(ctx, &c.e, o.ids, o.nids, o.rtol > 0 ? o.rtol : 1e-6, o.hscale > 0 ? o.hscale : 1,
                                  res);
    nbgi_progress_end();
    if (grc != NBG_OK) {
        fprintf(stderr, "nbgrad: error: %s\n", nbg_errmsg(ctx));
        goto done;
    }
    if (n > 0) {
        printf("L = %.15g\n", res[0].loss);
    }
    int passed = 0, zero = 0;
    for (int i = 0; i < n; ++i) {
        char lab[64];
        printf("%s %s adjoint=%.12g numeric=%.12g relerr=%.3g order=%.2f step=%g%s%s\n",
               res[i].status == NBG_CHECK_PASS ? "PASS" : res[i].status == NBG_CHECK_ZERO ? "ZERO" : "FAIL",
               nbg_param_label(&c.e, res[i].param, lab, sizeof lab), res[i].adjoint, res[i].numeric, res[i].relerr,
               res[i].order, res[i].step, res[i].reason[0] ? " # " : "", res[i].reason);
        passed += res[i].status == NBG_CHECK_PASS;
        zero += res[i].status == NBG_CHECK_ZERO;
    }
    printf("%d passed, %d failed%s", passed, n - passed - zero, zero ? "" : "\n");
    if (zero) {
        printf(", %d zero (not failures: nothing on this experiment depends on them)\n", zero);
    }
    if (passed == 0) {
        printf("no parameter passed: a check of zero gradients proves nothing\n");
    }
    status = passed > 0 && passed + zero == n ? 0 : 1;
done:
    free(res);
    grad_opts_free(&o);
    c.extra = NULL;
    nbgi_cli_free(&c);
    nbg_ctx_destroy(ctx);
    return status;
}

/* Reads an image of npix pixels (the observed image, the weights) in any format nbg_read_image knows: NXmx, CBF,
 * SMV or raw floats; prints the error. */
static float *read_image(nbg_ctx *ctx, const nbg_experiment *e, const char *flag, const char *path, size_t npix)
{
    float *img = NULL;
    size_t n = 0;
    nbg_geometry g;
    if (nbg_read_image(ctx, path, 0, npix, &img, &n, &g, NULL, NULL) != NBG_OK) {
        fprintf(stderr, "nbgrad: error: %s: %s\n", flag, nbg_errmsg(ctx));
        return NULL;
    }
    if (n != npix || !nbgi_cli_image_shape_ok(ctx, e, flag, path, &g)) {
        if (n != npix) {
            fprintf(stderr, "nbgrad: error: %s %s has %zu pixels, the detector has %zu\n", flag, path, n, npix);
        }
        free(img);
        return NULL;
    }
    return img;
}

static int refine_nframes(const nbgi_cli *c, const char *observed, int *alone);
static int refine_alone_angle(const nbgi_cli *c, const nbg_report *r, const nbg_geometry *og, const char *observed,
                              double *phi0, double *osc, int *frame);

static int cmd_grad(int argc, char **argv, int first)
{
    nbgi_cli c;
    grad_opts o = {0};
    o.break_param = -1;
    nbgi_response_opts_init(&o.resp);
    o.cmd = CMD_GRAD;
    nbgi_cli_init(&c);
    c.extra_handler = grad_flags;
    c.extra = &o;
    int status = 1;
    float *img = NULL, *obs = NULL, *wts = NULL, *dl = NULL;
    uint8_t *use = NULL;
    double *dF = NULL, *grad = NULL;
    nbg_ctx *ctx = setup(&c, argc, argv, first, &o);
    if (ctx == NULL) {
        if (c.help) {
            grad_usage(CMD_GRAD, "usage: nbgrad grad <nanoBragg flags> -params LIST [-observed FILE -loss lsq|poisson "
                                 "-weights FILE] [-json FILE]\n"
                                 "without -observed the loss is L = sum I (the gradient of the total intensity)");
            status = 0;
        }
        grad_opts_free(&o);
        c.extra = NULL;
        nbgi_cli_free(&c);
        return status;
    }
    if (o.params == NULL || o.params[0] == '\0') {
        fprintf(stderr, "nbgrad: error: grad needs -params (e.g. -params a,b,c,rotx,distance)\n");
        goto done;
    }
    if (!resolve_params(ctx, &c, &o)) {
        goto done;
    }
    nbg_report r;
    if (nbg_describe(ctx, &c.e, &r) != NBG_OK) {
        fprintf(stderr, "nbgrad: error: %s\n", nbg_errmsg(ctx));
        goto done;
    }
    const size_t npix = r.npix;
    img = nbgi_cli_image_alloc(sizeof(float) * npix);
    if (img == NULL) {
        fprintf(stderr, "nbgrad: error: out of memory for a %dx%d image\n", r.fpixels, r.spixels);
        goto done;
    }
    grad = calloc((size_t)o.nids + 1, sizeof(double));
    if (grad == NULL) {
        fprintf(stderr, "nbgrad: error: out of memory for %d gradients\n", o.nids);
        goto done;
    }
    /* the structure factors: every entry of the table ("F") is dL/dF as a whole, in the table's order; entries
     * named one by one (F(h,k,l)) are printed as the other parameters are */
    const size_t nF = (size_t)nbgi_param_nF(&c.e);
    size_t nFid = 0;
    for (int j = 0; j < o.nids; ++j) {
        nFid += is_F(o.ids[j]);
    }
    const int whole_F = nFid == nF;
    if (whole_F) {
        dF = calloc(nF, sizeof(double));
        if (dF == NULL) {
            fprintf(stderr, "nbgrad: error: out of memory for %zu structure-factor gradients\n", nF);
            goto done;
        }
    }
    double L = 0;
    int rc;
    if (o.observed != NULL) {
        /* the frames as refine takes them: every frame of a scan's NXmx file or '#' template (loss and gradient
         * summed over them), or one image of a scan at the start angle its header states */
        int alone = 0;
        const int nf = refine_nframes(&c, o.observed, &alone);
        const uint8_t *climask = c.e.mask; /* -mask, before the first frame's file mask joins it */
        nbg_geometry og;
        obs = read_observed(ctx, &c, &o, 0, &use, &og);
        if (obs == NULL) goto done;
        if (o.weights != NULL && (wts = read_image(ctx, &c.e, "-weights", o.weights, npix)) == NULL) goto done;
        double phi0 = r.phi0, osc = r.osc;
        int alone_frame = 0;
        const int own_osc = alone && refine_alone_angle(&c, &r, &og, o.observed, &phi0, &osc, &alone_frame);
        floor_warning(ctx, &c, obs, wts, NULL, npix, "");
        if (nf > 1) {
            printf("%d frames of %g deg from phi %g deg: the loss and its gradient summed over them\n", nf, osc, phi0);
        }
        const nbg_experiment first_e = c.e;
        double *gf = calloc((size_t)o.nids + 1, sizeof(double));
        rc = gf == NULL ? nbgi_error(ctx, NBG_ENOMEM, "out of memory for %d gradients", o.nids) : NBG_OK;
        for (int f = 0; rc == NBG_OK && f < nf; ++f) {
            nbg_experiment ef = first_e;
            ef.phi0 = phi0 + f * osc;
            if (own_osc) {
                ef.osc = osc;
            }
            /* a scan-varying crystal: the image's own (an image fitted alone that is no frame of the scan: the
             * static crystal) */
            const int fi = alone ? alone_frame : f;
            if (fi >= 0 && (rc = nbgi_build_frame_crystal(ctx, &c, fi, &ef)) != NBG_OK) {
                break;
            }
            float *of = obs;
            uint8_t *uf = NULL;
            if (f > 0) {
                c.e.mask = climask;
                if ((of = read_observed(ctx, &c, &o, f, &uf, NULL)) == NULL) {
                    free(gf);
                    goto done;
                }
                ef.mask = uf;
            }
            double Lf = 0;
            rc = nbg_loss_grad(ctx, &ef, o.loss, of, wts, o.ids, o.nids, &Lf, gf, img, npix);
            L += Lf;
            for (int j = 0; rc == NBG_OK && j < o.nids; ++j) {
                grad[j] += gf[j];
            }
            if (f > 0) {
                free(of);
                free(uf);
            }
            if (nf > 1 && rc == NBG_OK) {
                nbgi_progress(1, f + 1, nf, "grad: frame %d of %d, loss %.10g", f + 1, nf, Lf);
            }
        }
        nbgi_progress_end();
        c.e = first_e;
        free(gf);
    } else {
        dl = malloc(sizeof(float) * npix);
        if (dl == NULL) {
            fprintf(stderr, "nbgrad: error: out of memory for a %dx%d image\n", r.fpixels, r.spixels);
            goto done;
        }
        for (size_t i = 0; i < npix; ++i) dl[i] = 1.0f;
        rc = nbg_simulate_grad(ctx, &c.e, dl, o.ids, o.nids, grad, img, npix, NULL);
        for (size_t i = 0; i < npix; ++i) L += img[i];
    }
    if (rc != NBG_OK) {
        fprintf(stderr, "nbgrad: error: %s\n", nbg_errmsg(ctx));
        goto done;
    }
    for (int j = 0; whole_F && j < o.nids; ++j) {
        if (is_F(o.ids[j])) {
            dF[o.ids[j] - NBG_P_F0] = grad[j];
        }
    }
    printf("loss = %.15g (%s)\n", L, o.observed ? (o.loss == NBG_LOSS_LSQ ? "least squares"
                                                  : c.e.response.read_noise > 0 ? "shifted-Poisson NLL (read noise)"
                                                                                 : "Poisson NLL")
                                                : "sum of pixels");
    char lab[64];
    for (int j = 0; j < o.nids; ++j) {
        if (whole_F && is_F(o.ids[j])) {
            continue;
        }
        double v = NAN;
        nbg_param_get(&c.e, o.ids[j], &v);
        printf("dL/d%-10s = %.15g   (value %g)\n", nbg_param_label(&c.e, o.ids[j], lab, sizeof lab), grad[j], v);
    }
    if (whole_F) {
        double norm = 0;
        for (size_t i = 0; i < nF; ++i) norm += dF[i] * dF[i];
        printf("dL/dF: %zu entries, norm %.6g\n", nF, sqrt(norm));
    }
#ifdef NBG_HAVE_FORMATS
    if (o.json != NULL) {
        /* docs/json.md describes the file */
        json_t *doc = json_object(), *gj = json_object();
        json_object_set_new(doc, "loss", nbgi_json_num(L));
        for (int q = 0; q < o.nids; ++q) {
            if (!(whole_F && is_F(o.ids[q]))) {
                json_object_set_new(gj, nbg_param_label(&c.e, o.ids[q], lab, sizeof lab), nbgi_json_num(grad[q]));
            }
        }
        json_object_set_new(doc, "gradient", gj);
        if (whole_F) {
            json_t *fj = json_array();
            for (size_t i = 0; i < nF; ++i) json_array_append_new(fj, nbgi_json_num(dF[i]));
            json_object_set_new(doc, "dF", fj);
        }
        if (!json_out(ctx, &c, o.json, doc)) {
            goto done;
        }
    }
#endif
    status = nbgi_cli_commit(ctx, &c) ? 0 : 1;
done:
    free(img);
    free(obs);
    free(wts);
    free(dl);
    free(dF);
    free(grad);
    free(use);
    grad_opts_free(&o);
    c.extra = NULL;
    nbgi_cli_free(&c);
    nbg_ctx_destroy(ctx);
    return status;
}

static int cmd_simulate(int argc, char **argv, int first)
{
    nbgi_cli c;
    nbgi_cli_init(&c);
    int ok = 0;
    float *img = NULL;
    nbg_ctx *ctx = setup(&c, argc, argv, first, NULL);
    if (ctx == NULL) {
        if (c.help) {
            nbgi_cli_usage(stdout);
            ok = 1;
        }
        goto done;
    }
    nbg_report r;
    if (nbg_describe(ctx, &c.e, &r) != NBG_OK) {
        fprintf(stderr, "nbgrad: error: %s\n", nbg_errmsg(ctx));
        goto done;
    }
    nbgi_cli_print_setup(&c, &r);
    if (!nbgi_cli_data_fits(ctx, &c)) {
        goto done;
    }
    const size_t npix = r.npix;
    img = nbgi_cli_image_alloc(sizeof(float) * npix);
    if (img == NULL) {
        fprintf(stderr, "nbgrad: error: out of memory for a %dx%d image\n", r.fpixels, r.spixels);
        goto done;
    }
    /* a rotation series: frame i turns the crystal from phi0 + i osc through osc */
    const double phi0 = r.phi0, osc = r.osc;
    ok = 1;
    for (int frame = 0; frame < c.nframes && ok; ++frame) {
        nbg_experiment ef = c.e;
        ef.phi0 = phi0 + frame * osc;
        if (nbgi_build_frame_crystal(ctx, &c, frame, &ef) != NBG_OK ||
            nbg_simulate(ctx, &ef, img, npix, &r) != NBG_OK) {
            fprintf(stderr, "nbgrad: error: %s\n", nbg_errmsg(ctx));
            ok = 0;
            break;
        }
        if (r.interp_fallbacks > 0) {
            printf("WARNING: %ld interpolation windows left the HKL table; nearest neighbours used there\n",
                   r.interp_fallbacks);
        }
        if (frame == 0) {
            printf("solid angle subtended by detector = %g steradian\n", r.solid_angle);
        }
        ok = nbgi_cli_write_outputs(ctx, &c, &r, img, frame);
    }
    ok = ok && nbgi_cli_commit(ctx, &c);
done:
    free(img);
    nbgi_cli_free(&c);
    nbg_ctx_destroy(ctx);
    return ok ? 0 : 1;
}

void usage_main(FILE *out)
{
    fprintf(out, "nbgrad " NBG_VERSION " -- a differentiable nanoBragg\n"
                 "usage: nbgrad [simulate] <nanoBragg flags>   render images (nbgrad simulate -h for the flags)\n"
                 "       nbgrad grad <flags> -params LIST [-observed FILE -loss lsq|poisson] [-json FILE]\n"
                 "       nbgrad gradcheck <flags> -params LIST [-rtol 1e-6]\n"
                 "       nbgrad refine <flags> -observed FILE -params LIST [-loss lsq|poisson] [-method lm|bfgs]\n"
                 "                     [-pedestal counts -gain x -read_noise counts]\n"
                 "       nbgrad batch <flags> -shots LIST -floatfile out/{id}.bin ...   many shots (mpirun -n K)\n"
                 "       nbgrad shots -n COUNT -seed S -o LIST   a shot list in random orientations\n"
                 "       nbgrad ensemble <flags> -shots LIST -observed obs/{id}.img -global F -local rotx,roty,rotz\n"
                 "       nbgrad SUBCOMMAND -h   what a subcommand takes;   nbgrad --version\n"
                 "results go to stdout; progress and errors to stderr (-quiet: no progress)\n");
    params_help(out);
}

#ifndef NBG_NO_REFINE /* refine's spot regions (without refinement, none) */
/* -spotlist as boxes: a DIALS reflection table (.refl, msgpack; recognised by its first byte, a 3-array) or a text
 * file of "fast slow" or "panel fast slow" centres.  A reflection's box is its bounding box, or with -spots N given a
 * box of half-width N about its centroid's pixel (nbg_reflection_boxes, the path Python's spot_pixels takes); a text
 * centre's a box of half-width half about its pixel.  Returns the boxes (malloc'd) in *boxes and their count in *nb,
 * and what they are in what; 0 after printing the error. */
static int spotlist_boxes(nbg_ctx *ctx, const nbgi_cli *c, const grad_opts *o, int half, nbg_spot_box **boxes,
                          long *nb, char *what, size_t wsize)
{
    *boxes = NULL;
    *nb = 0;
    nbg_report rep;
    if (nbg_describe(ctx, &c->e, &rep) != NBG_OK) {
        fprintf(stderr, "nbgrad: error: -spotlist: %s\n", nbg_errmsg(ctx));
        return 0;
    }
    const int np = c->e.npanels > 0 ? c->e.npanels : 1;
    FILE *fp;
    if (nbgi_open_input(ctx, o->spotlist, "-spotlist", "rb", &fp) != NBG_OK) {
        fprintf(stderr, "nbgrad: error: %s\n", nbg_errmsg(ctx));
        return 0;
    }
    const int first = fgetc(fp);
    int ok = 1;
    long cap = 0, n = 0, skipped = 0;
    nbg_spot_box *b = NULL;
    if (first == 0x93) { /* msgpack's array of 3: DIALS's reflection table */
        fclose(fp);
        nbg_reflections r;
        if (nbg_read_refl(ctx, o->spotlist, &r) != NBG_OK) {
            fprintf(stderr, "nbgrad: error: -spotlist: %s\n", nbg_errmsg(ctx));
            return 0;
        }
        const int use_bbox = r.bbox != NULL && o->spots < 0;
        if (o->spot_shoebox >= 0) {
            if (nbg_reflection_shoebox_boxes(ctx, &c->e, &r, NBG_SHOEBOX_FOREGROUND | NBG_SHOEBOX_STRONG,
                                             o->spot_shoebox, &b, &n, &skipped) != NBG_OK) {
                fprintf(stderr, "nbgrad: error: -spotlist %s -spot_shoebox: %s\n", o->spotlist, nbg_errmsg(ctx));
                ok = 0;
            } else {
                snprintf(what, wsize, "the %ld reflections of %s (their shoeboxes' %ld foreground pixels, each with "
                         "those within %d pixels%s)", r.n - skipped, o->spotlist, n, o->spot_shoebox,
                         skipped > 0 ? "; those of other experiments left out" : "");
            }
        } else if (nbg_reflection_boxes(ctx, &c->e, &r, use_bbox ? -1 : half, &b, &n, &skipped) != NBG_OK) {
            fprintf(stderr, "nbgrad: error: -spotlist %s: %s\n", o->spotlist, nbg_errmsg(ctx));
            ok = 0;
        }
        if (ok && o->spot_shoebox < 0) {
            snprintf(what, wsize, "the %ld reflections of %s (%s%s)", n, o->spotlist,
                     use_bbox ? "their bounding boxes" : "boxes about their centroids",
                     skipped > 0 ? "; those of other experiments left out" : "");
        }
        nbg_reflections_free(&r);
    } else if (o->spot_shoebox >= 0) {
        fclose(fp);
        fprintf(stderr, "nbgrad: error: -spot_shoebox needs -spotlist with a DIALS reflection table (.refl); %s is a "
                "text file of spot centres\n", o->spotlist);
        return 0;
    } else {
        if (first != EOF) {
            ungetc(first, fp);
        }
        char *line = NULL;
        size_t lcap = 0;
        long ln = 0;
        int got;
        while (ok && (got = nbgi_read_line(ctx, fp, &line, &lcap, o->spotlist, ln + 1)) == 1) {
            ++ln; /* a line whole, whatever its length */
            char *p = line;
            while (*p == ' ' || *p == '\t') ++p;
            if (*p == '#' || *p == '\n' || *p == '\r' || *p == '\0') continue;
            double v[3];
            char extra;
            const int k = sscanf(p, "%lf %lf %lf %c", &v[0], &v[1], &v[2], &extra);
            int q = 0;
            double f = v[0], s = v[1];
            if (k == 3) {
                q = v[0] >= 0 && v[0] < np && v[0] == floor(v[0]) ? (int)v[0] : -1;
                f = v[1], s = v[2];
            }
            if ((k != 2 && k != 3) || !isfinite(f) || !isfinite(s) || q < 0) {
                fprintf(stderr, "nbgrad: error: -spotlist %s line %ld: expected \"fast slow\" or \"panel fast slow\" "
                        "(a panel index below %d)\n", o->spotlist, ln, np);
                ok = 0;
                break;
            }
            const int F = c->e.npanels > 0 ? c->e.panels[q].fpixels : rep.fpixels;
            const int S = c->e.npanels > 0 ? c->e.panels[q].spixels : rep.spixels;
            if (!(f > -0.5 && f < F - 0.5 && s > -0.5 && s < S - 0.5)) {
                fprintf(stderr, "nbgrad: error: -spotlist %s line %ld: the centre (fast %g, slow %g) is outside "
                        "panel %d of %d x %d pixels\n", o->spotlist, ln, f, s, q, F, S);
                ok = 0;
                break;
            }
            if (n == cap) {
                cap = cap ? 2 * cap : 256;
                nbg_spot_box *nw = (double)cap * sizeof *b < 4e9 ? realloc(b, sizeof *b * (size_t)cap) : NULL;
                if (nw == NULL) {
                    fprintf(stderr, "nbgrad: error: -spotlist: out of memory at line %ld\n", ln);
                    ok = 0;
                    break;
                }
                b = nw;
            }
            const int fi = (int)lround(f), si = (int)lround(s);
            b[n++] = (nbg_spot_box){q, fi - half, fi + half + 1, si - half, si + half + 1};
        }
        if (ok && got < 0) {
            fprintf(stderr, "nbgrad: error: -spotlist: %s\n", nbg_errmsg(ctx));
            ok = 0;
        }
        free(line);
        fclose(fp);
        if (ok) {
            snprintf(what, wsize, "%ld spot centres of %s (boxes of half-width %d)", n, o->spotlist, half);
        }
    }
    if (ok && n == 0) {
        fprintf(stderr, "nbgrad: error: -spotlist %s holds no %s\n", o->spotlist,
                first != 0x93 ? "spot centre" : skipped > 0 ? "reflection of experiment 0" : "reflection");
        ok = 0;
    }
    if (!ok) {
        free(b);
        return 0;
    }
    *boxes = b;
    *nb = n;
    return 1;
}

/* -spots, -spotlist: the pixel list of the spot regions into c->e (*list owns it).  The spot pixels are the boxes of
 * -spotlist (spotlist_boxes; with -spot_shoebox a box about each of its shoeboxes' foreground pixels), or else the
 * pixels within -spots of those of the starting model above its floor by -spot_frac of its peak (over the pixels in
 * the loss, use). */
static int spot_regions(nbg_ctx *ctx, nbgi_cli *c, const grad_opts *o, const uint8_t *use, size_t npix,
                        uint32_t **list)
{
    const int half = o->spots >= 0 ? o->spots : 3;
    double thr = INFINITY;
    float *img = NULL;
    nbg_spot_box *boxes = NULL;
    long nb = 0, n = 0;
    char what[4400];
    int ok = 1;
    if (o->spot_shoebox >= 0 && o->spotlist == NULL) {
        fprintf(stderr, "nbgrad: error: -spot_shoebox needs -spotlist FILE.refl (a DIALS reflection table with "
                "shoeboxes)\n");
        return 0;
    }
    if (o->spotlist != NULL) {
        ok = spotlist_boxes(ctx, c, o, half, &boxes, &nb, what, sizeof what);
        if (ok && nbg_spot_box_pixels(ctx, &c->e, boxes, nb, list, &n) != NBG_OK) {
            fprintf(stderr, "nbgrad: error: -spotlist: %s\n", nbg_errmsg(ctx));
            ok = 0;
        }
    } else {
        img = malloc(sizeof(float) * npix);
        if (img == NULL || nbg_simulate(ctx, &c->e, img, npix, NULL) != NBG_OK) {
            fprintf(stderr, "nbgrad: error: -spots: cannot render the starting model: %s\n",
                    img == NULL ? "out of memory" : nbg_errmsg(ctx));
            ok = 0;
        } else if (!nbg_spot_threshold(img, use, npix, o->spot_frac, &thr)) {
            fprintf(stderr, "nbgrad: error: -spots: the starting model is flat (%g): no spot to box\n", thr);
            ok = 0;
        }
        if (ok && nbg_spot_pixels(ctx, &c->e, img, npix, thr, NULL, 0, half, list, &n) != NBG_OK) {
            fprintf(stderr, "nbgrad: error: -spots: %s\n", nbg_errmsg(ctx));
            ok = 0;
        }
        snprintf(what, sizeof what, "within %d pixels of the starting model's spot pixels (above %.4g photons)", half,
                 thr);
    }
    if (ok && n == 0) {
        fprintf(stderr, "nbgrad: error: the spot regions hold no pixel of the loss (all masked)\n");
        ok = 0;
    }
    if (ok) {
        c->e.pixels = *list;
        c->e.npixels_list = n;
        printf("spot regions: %ld pixels (%.3g%% of %zu): %s\n", n, 100.0 * (double)n / npix, npix, what);
    }
    free(img);
    free(boxes);
    return ok;
}
#endif /* NBG_NO_REFINE */

/* refine's progress, on stderr: a line per iteration (user: the iteration limit). */
static void refine_progress(void *user, int iter, double loss, double gnorm, double step)
{
    nbgi_progress(1, iter, *(const int *)user, "iter %3d  loss %.10g  |grad| %.4g  step %.4g", iter, loss, gnorm,
                  step);
}

/* --- refine's steps ----------------------------------------------------------------------------------------- */
/* The frames refine fits: every frame of a scan of several (-frames, or the scan of -expt) when -observed is an
 * NXmx file or a '#' template, else 1, with *alone set where that one image belongs to a scan of several. */
static int refine_nframes(const nbgi_cli *c, const char *observed, int *alone)
{
    *alone = 0;
    if (c->nframes <= 1) {
        return 1;
    }
    FILE *hf = fopen(observed, "rb");
    unsigned char sig[8] = {0};
    const int hdf5 = hf != NULL && fread(sig, 1, 8, hf) == 8 && memcmp(sig, "\x89HDF\r\n\x1a\n", 8) == 0;
    if (hf != NULL) {
        fclose(hf);
    }
    if (hdf5 || strchr(observed, '#') != NULL) {
        return c->nframes;
    }
    *alone = 1;
    return 1;
}

/* One image of a scan fitted alone: *phi0 and *osc (the scan's first frame's on entry) become the start angle and
 * the width its header (og) states, where it states them; *frame (NULL: not wanted) the frame of the scan it is (0
 * when it states no angle, -1 when its angle is no frame's).  Prints which angle the fit uses; returns whether the
 * width is the file's own (not the scan's). */
static int refine_alone_angle(const nbgi_cli *c, const nbg_report *r, const nbg_geometry *og, const char *observed,
                               double *phi0, double *osc, int *frame)
{
    int unused;
    frame = frame != NULL ? frame : &unused;
    *frame = 0;
    if (!(og->scan_stated >= 1 && isfinite(og->scan_start))) {
        printf("note: -observed %s holds one image that states no start angle: fitting it alone at the scan's "
               "first, phi %g deg (an NXmx series or a '#' template gives all %d frames of the scan)\n",
               observed, *phi0, c->nframes);
        return 0;
    }
    *phi0 = og->scan_start;
    /* a header's angles may be rounded (SMV's are printed to 6 digits): a frame of the scan within that is that
     * frame, exactly */
    char which[96] = "";
    const double tol = fmin(1e-5 * fmax(1, fabs(*phi0)), 0.01 * fabs(r->osc));
    const double k = r->osc != 0 ? round((*phi0 - r->phi0) / r->osc) : 0;
    *frame = -1; /* not a frame of the scan */
    if (k >= 0 && k < c->nframes && fabs(r->phi0 + k * r->osc - *phi0) <= tol) {
        *phi0 = r->phi0 + k * r->osc;
        *frame = (int)k;
        snprintf(which, sizeof which, ", frame %d of the scan's %d", (int)k + 1, c->nframes);
    } else {
        snprintf(which, sizeof which, "; the scan's %d frames start at phi %g deg", c->nframes, r->phi0);
    }
    const int own_osc = og->scan_stated >= 2 && isfinite(og->scan_width) && og->scan_width >= 0 &&
                        fabs(og->scan_width - r->osc) > 1e-5 * fmax(1, fabs(r->osc));
    if (own_osc) {
        *osc = og->scan_width;
    }
    printf("note: -observed %s holds one image: fitting it alone at its own start angle, phi %g deg, %g deg wide "
           "(%s%s; an NXmx series or a '#' template gives all the frames)\n", observed, *phi0, *osc,
           own_osc ? "the file's width, not the scan's" : "the scan's width", which);
    return own_osc;
}

#ifndef NBG_NO_REFINE /* refine's output (without refinement, none) */
static const char *const refine_reasons[] = {"ftol", "gtol", "step", "iteration limit", "no decrease", "bound"};

/* Prints how the fit ended. */
static void refine_outcome(const nbg_refine_result *res)
{
    if (res->converged) {
        printf("converged after %d iterations (%s: %s): loss %.10g -> %.10g\n", res->iterations,
               refine_reasons[res->reason], res->why, res->start_loss, res->loss);
    } else {
        printf("NOT CONVERGED after %d iterations: %s (%s): loss %.10g -> %.10g\n", res->iterations,
               refine_reasons[res->reason], res->why, res->start_loss, res->loss);
    }
}

/* Prints the parameters (start, refined, standard error) and their correlations. */
static void refine_table(const nbg_experiment *e, const nbg_refine_result *res)
{
    printf("%-12s %16s %16s %14s\n", "parameter", "start", "refined", "std. error");
    char lab[64];
    for (int j = 0; j < res->nparams; ++j) {
        if (is_F(res->params[j])) {
            continue; /* the structure factors: -hklout */
        }
        const int t = res->tied != NULL ? res->tied[j] : j;
        char note[80] = "";
        if (t < 0) {
            snprintf(note, sizeof note, "   held by the space group");
        } else if (t != j) {
            char lt[64];
            snprintf(note, sizeof note, "   = %s (space group)", nbg_param_label(e, res->params[t], lt, sizeof lt));
        }
        printf("%-12s %16.8g %16.8g %14.4g%s\n", res_label(e, res, j, lab, sizeof lab), res->start[j],
               res->value[j], res->sigma[j], note);
    }
    printf("correlations:\n");
    for (int a = 0; a < res->nparams; ++a) {
        if (is_F(res->params[a])) {
            continue;
        }
        printf("  %-12s", res_label(e, res, a, lab, sizeof lab));
        for (int b = 0; b <= a; ++b) {
            if (!is_F(res->params[b])) {
                printf(" %6.3f", res->corr[a * res->nparams + b]);
            }
        }
        printf("\n");
    }
}

/* The parameters the fit moved to where they no longer change the image where the loss looks (res->undetermined):
 * named in a warning. */
static void refine_undetermined(const nbg_experiment *e, const nbg_refine_result *res)
{
    if (res->undetermined <= 0) {
        return;
    }
    char names[400] = "", lab[64];
    size_t k = 0;
    for (int j = 0; j < res->nparams && k < sizeof names - 70; ++j) {
        if (!is_F(res->params[j]) && (res->tied == NULL || res->tied[j] == j) && isnan(res->sigma[j])) {
            k += (size_t)snprintf(names + k, sizeof names - k, "%s%s", k > 0 ? ", " : "",
                                  res_label(e, res, j, lab, sizeof lab));
        }
    }
    printf("WARNING: the fit moved %s to where %s no longer change the image where the loss looks (no information at "
           "the fitted model): %s where the fit left %s, the standard error%s undefined (a mosaic domain turned away "
           "from every spot region: fit fewer domains, or hold it)\n", names, res->undetermined > 1 ? "they" : "it",
           res->undetermined > 1 ? "their values are" : "its value is", res->undetermined > 1 ? "them" : "it",
           res->undetermined > 1 ? "s" : "");
}

/* With cell parameters refined from -cell: nanoBragg's construction (kept for parity) builds a crystal whose angles
 * differ from the -cell values where two or more are not 90 deg; the crystal's own cell is printed when it differs
 * from the table's (a list's crystal, U B(cell), has its own cell as its parameters). */
static void refine_cell_note(nbg_ctx *ctx, const nbg_experiment *e, const nbg_refine_result *res)
{
    int cell = 0;
    for (int j = 0; j < res->nparams; ++j) {
        cell |= res->params[j] >= 0 && res->params[j] < NBG_NPARAMS &&
                nbgi_param_rows[res->params[j]].setup == NBGI_S_CELL;
    }
    nbg_report r;
    if (!cell || !e->has_cell || e->has_mat || e->has_umat || nbg_describe(ctx, e, &r) != NBG_OK) {
        return;
    }
    double d = 0;
    for (int i = 0; i < 6; ++i) {
        const double given = !isnan(e->cell[i]) ? e->cell[i] : i < 3 ? e->cell[0] : 90;
        d = fmax(d, fabs(r.cell[i] - given));
    }
    if (d > 1e-6) {
        printf("note: the crystal's own cell is %.6f %.6f %.6f %.6f %.6f %.6f: the cell parameters above are -cell's "
               "values, from which nanoBragg's construction (kept for parity with it) builds a crystal whose angles "
               "differ where two or more are not 90 deg (by up to %.3g here)\n", r.cell[0], r.cell[1], r.cell[2],
               r.cell[3], r.cell[4], r.cell[5], d);
    }
}

/* -residual: (observed - pedestal) / gain - model on the pixels used, 0 elsewhere.  0 on an error (printed). */
static int refine_write_residual(nbg_ctx *ctx, nbgi_cli *c, const char *path, const float *obs, const uint8_t *use,
                                 size_t npix)
{
    float *img = malloc(sizeof(float) * npix);
    if (img == NULL || nbg_simulate(ctx, &c->e, img, npix, NULL) != NBG_OK) {
        fprintf(stderr, "nbgrad: error: cannot render the residual image\n");
        free(img);
        return 0;
    }
    nbgi_response_cursor rcur;
    nbgi_response_init(&rcur, &c->e);
    for (size_t i = 0; i < npix; ++i) {
        const nbg_detector_model *r = nbgi_response_at(&rcur, i);
        img[i] = use[i] ? (float)((obs[i] - r->pedestal) / r->gain - img[i]) : 0.0f;
    }
    const int rc = nbgi_write_float_set(ctx, &c->outs, path, img, npix);
    free(img);
    if (rc != NBG_OK) {
        fprintf(stderr, "nbgrad: error: %s\n", nbg_errmsg(ctx));
        return 0;
    }
    printf("wrote the residual image ((observed - pedestal) / gain - model) to %s\n", path);
    return 1;
}

/* -scan_varying with -exptfile: the fitted crystal at each image boundary b <= nf (phi0 + b osc), each varying
 * parameter its knots' interpolation there (nbg_scan_knot_weights; a cell parameter the space group ties to a
 * varying one follows it), as the real-space bases of the list's frame ((nf + 1) x 9 into *out); *mid: the
 * experiment with the varying parameters at the scan's middle (the list's static crystal).  0 on an error
 * (printed). */
static int refine_scan_points(nbg_ctx *ctx, const nbgi_cli *c, const nbg_refine_result *res, int nf, double phi0,
                              double osc, double **out, nbg_experiment *mid)
{
    const int K = res->nknots;
    double *const pts = malloc(sizeof(double) * (size_t)(nf + 1) * 9);
    double *const w = malloc(sizeof(double) * (size_t)K);
    int rc = pts == NULL || w == NULL ? nbgi_error(ctx, NBG_ENOMEM, "out of memory for %d scan points", nf + 1)
                                      : NBG_OK;
    const double k0 = K > 0 ? res->knot_phi[0] : 0, span = K > 0 ? res->knot_phi[K - 1] - k0 : 0;
    for (int b = 0; rc == NBG_OK && b <= nf + 1; ++b) {
        const double phi = b <= nf ? phi0 + b * osc : phi0 + 0.5 * nf * osc;
        nbg_scan_knot_weights(span > 0 ? (phi - k0) / span : 0, K, w);
        nbg_experiment e = c->e;
        for (int j = 0; j < res->nparams; ++j) {
            if (res->knot[j] != 0) {
                continue; /* each varying parameter once, at its knot 0 */
            }
            /* a tied parameter takes its leader's interpolation (its knots are the leader's) */
            const int lead = res->tied != NULL && res->tied[j] >= 0 ? res->tied[j] : j;
            double v = 0;
            for (int i = 0; i < res->nparams; ++i) {
                if (res->params[i] == res->params[lead] && res->knot[i] >= 0) {
                    v += w[res->knot[i]] * res->value[i];
                }
            }
            nbg_param_set(&e, res->params[j], v);
        }
        if (b == nf + 1) {
            *mid = e;
            break;
        }
        nbg_report rr;
        nbg_geometry g;
        rc = nbg_describe(ctx, &e, &rr);
        if (rc == NBG_OK) {
            rc = nbg_geometry_from_report(ctx, &e, &rr, nf, &g);
        }
        if (rc == NBG_OK) {
            memcpy(pts + (size_t)b * 9, g.real_space, sizeof g.real_space);
        }
    }
    free(w);
    if (rc != NBG_OK) {
        free(pts);
        fprintf(stderr, "nbgrad: error: -exptfile: the scan-varying crystal: %s\n", nbg_errmsg(ctx));
        return 0;
    }
    *out = pts;
    return 1;
}

/* -exptfile: the refined experiment as a DIALS experiment list (DIALS's tools, and nbgrad -expt, read it), the
 * scan of the nf frames fitted, every panel where the fit put it.  0 on an error (printed). */
static int refine_write_expt(nbg_ctx *ctx, nbgi_cli *c, int nf, const char *observed, const double *sv_points,
                             const nbg_experiment *sv_mid)
{
    nbg_report rr;
    nbg_geometry g;
    /* a scan-varying crystal (sv_points, refine_scan_points): the list's static crystal is the scan's middle
     * (sv_mid), each image boundary's crystal one of its A_at_scan_points */
    const nbg_experiment ec = sv_points != NULL ? *sv_mid : c->e;
    nbg_panel *gp = c->e.npanels > 0 ? calloc((size_t)c->e.npanels, sizeof *gp) : NULL;
    int erc = c->e.npanels > 0 && gp == NULL ? nbgi_error(ctx, NBG_ENOMEM, "out of memory for the panels") : NBG_OK;
    if (erc == NBG_OK) {
        erc = nbg_describe(ctx, &ec, &rr);
    }
    if (erc == NBG_OK) {
        erc = nbg_geometry_from_report(ctx, &ec, &rr, nf, &g);
    }
    g.scan_real_space = sv_points;
    if (erc == NBG_OK && gp != NULL) {
        erc = nbg_panels_from_report(ctx, &c->e, &rr, gp, c->e.npanels);
    }
    /* the list names the observed image, which -expt's list cut into modules as dxtbx does (its raw offsets, which
     * the panels carry, and its image set's multi_panel option) */
    g.multi_panel = c->expt_multi_panel;
    if (erc == NBG_OK) {
        erc = nbgi_write_expt_panels_set(ctx, &c->outs, c->exptfile, &g, gp, gp != NULL ? c->e.npanels : 0,
                                         observed);
    }
    free(gp);
    if (erc != NBG_OK) {
        fprintf(stderr, "nbgrad: error: -exptfile: %s\n", nbg_errmsg(ctx));
        return 0;
    }
    printf("wrote the refined experiment to %s\n", c->exptfile);
    return 1;
}

/* -json: the fit's outcome, its parameters (start, value, standard error) and their correlations (docs/json.md
 * describes the file).  0 on an error (printed). */
static int refine_write_json(nbg_ctx *ctx, nbgi_cli *c, const grad_opts *o, const nbg_refine_result *res,
                             int floor_bad)
{
#ifdef NBG_HAVE_FORMATS
    json_t *d = json_object(), *fit = json_object(), *pj = json_object(), *cj = json_array();
    json_object_set_new(d, "method", json_string(o->method == NBG_OPT_LM ? "lm" : "bfgs"));
    json_object_set_new(d, "loss", json_string(o->loss == NBG_LOSS_LSQ ? "lsq" : "poisson"));
    json_object_set_new(d, "converged", json_boolean(res->converged));
    json_object_set_new(d, "reason", json_string(refine_reasons[res->reason]));
    json_object_set_new(d, "why", json_string(res->why));
    json_object_set_new(d, "step_sigma", json_real(isfinite(res->step_sigma) ? res->step_sigma : -1.0));
    json_object_set_new(d, "iterations", json_integer(res->iterations));
    json_object_set_new(d, "pixels", json_integer(res->nobs));
    json_object_set_new(d, "pedestal", nbgi_json_num(c->e.response.pedestal));
    json_object_set_new(d, "gain", nbgi_json_num(c->e.response.gain));
    json_object_set_new(d, "read_noise", nbgi_json_num(c->e.response.read_noise));
    json_object_set_new(d, "floor_mismatch", json_boolean(floor_bad));
    json_object_set_new(fit, "deviance_ratio", nbgi_json_num(res->fit.ratio));
    json_object_set_new(fit, "deviance_ratio_spots", json_real(isfinite(res->fit.ratio_spots) ? res->fit.ratio_spots
                                                                                               : -1.0));
    json_object_set_new(fit, "deviance", nbgi_json_num(res->fit.deviance));
    json_object_set_new(fit, "pixels", json_integer(res->fit.n));
    json_object_set_new(fit, "spot_pixels", json_integer(res->fit.nspots));
    json_object_set_new(fit, "mismatch", json_boolean(res->fit.mismatch));
    json_object_set_new(fit, "sigma_scale", nbgi_json_num(res->fit.sigma_scale));
    json_object_set_new(d, "fit", fit);
    json_object_set_new(d, "constraint", json_string(res->constraint));
    if (o->fit_F) {
        json_object_set_new(d, "F_fitted", json_integer(res->F_fitted));
        json_object_set_new(d, "F_zero", json_integer(res->F_zero));
    }
    json_object_set_new(d, "undetermined", json_integer(res->undetermined));
    json_object_set_new(d, "start_loss", nbgi_json_num(res->start_loss));
    json_object_set_new(d, "final_loss", nbgi_json_num(res->loss));
    char lab[64];
    for (int k = 0; k < res->nparams; ++k) {
        json_t *p = json_object();
        json_object_set_new(p, "start", nbgi_json_num(res->start[k]));
        json_object_set_new(p, "value", nbgi_json_num(res->value[k]));
        json_object_set_new(p, "sigma", nbgi_json_num(res->sigma[k]));
        const int t = res->tied != NULL ? res->tied[k] : k;
        if (t != k) {
            char lt[64];
            json_object_set_new(p, "tied_to", t < 0 ? json_string("fixed")
                                                     : json_string(nbg_param_label(&c->e, res->params[t], lt, sizeof lt)));
        }
        json_object_set_new(pj, res_label(&c->e, res, k, lab, sizeof lab), p);
    }
    json_object_set_new(d, "parameters", pj);
    if (res->nknots > 0) {
        /* the scan-varying orientation's knots: their angles (the parameters orient_x.k0 ... hold their values) */
        json_t *kp = json_array();
        for (int k = 0; k < res->nknots; ++k) {
            json_array_append_new(kp, nbgi_json_num(res->knot_phi[k]));
        }
        json_object_set_new(d, "knot_phi", kp);
    }
    for (int a = 0; a < res->nparams; ++a) {
        json_t *row = json_array();
        for (int b = 0; b < res->nparams; ++b) {
            json_array_append_new(row, nbgi_json_num(res->corr[a * res->nparams + b]));
        }
        json_array_append_new(cj, row);
    }
    json_object_set_new(d, "correlation", cj);
    return json_out(ctx, c, o->json, d);
#else
    (void)floor_bad, (void)res;
    return nbgi_json_write(ctx, &c->outs, o->json, NULL, 1);
#endif
}

/* refine -centroids: the indexed reflections of -spotlist's table (experiment 0) and their model centroids */
typedef struct {
    nbg_reflections r;
    long n;                 /* rows kept */
    long *row;              /* their rows in r */
    int *hkl, *panel;
    double *x, *y;          /* observed centroids */
    double *sx, *sy, *fx, *fy, *ph; /* the start's and the fit's model centroids, the fit's photons */
} centroid_set;

static void centroid_set_free(centroid_set *s)
{
    nbg_reflections_free(&s->r);
    free(s->row), free(s->hkl), free(s->panel);
    free(s->x); /* x, y, sx, sy, fx, fy and ph are one allocation */
    memset(s, 0, sizeof *s);
}

static int centroids_start(nbg_ctx *ctx, nbgi_cli *c, const grad_opts *o, centroid_set *s)
{
    if (o->spotlist == NULL || nbg_read_refl(ctx, o->spotlist, &s->r) != NBG_OK) {
        fprintf(stderr, "nbgrad: error: -centroids needs -spotlist with DIALS's indexed reflection table%s%s\n",
                o->spotlist != NULL ? ": " : "", o->spotlist != NULL ? nbg_errmsg(ctx) : "");
        return 0;
    }
    if (s->r.hkl == NULL) {
        fprintf(stderr, "nbgrad: error: -centroids: %s has no miller_index column (index it: dials.index)\n",
                o->spotlist);
        return 0;
    }
    const size_t n = (size_t)s->r.n + 1;
    s->row = malloc(sizeof(long) * n);
    s->hkl = malloc(sizeof(int) * 3 * n);
    s->panel = malloc(sizeof(int) * n);
    double *d = malloc(sizeof(double) * 7 * n);
    if (s->row == NULL || s->hkl == NULL || s->panel == NULL || d == NULL) {
        free(d);
        fprintf(stderr, "nbgrad: error: -centroids: out of memory\n");
        return 0;
    }
    s->x = d, s->y = d + n, s->sx = d + 2 * n, s->sy = d + 3 * n, s->fx = d + 4 * n, s->fy = d + 5 * n;
    s->ph = d + 6 * n;
    for (long i = 0; i < s->r.n; ++i) {
        const int *h = s->r.hkl + 3 * i;
        if ((h[0] == 0 && h[1] == 0 && h[2] == 0) || (s->r.id != NULL && s->r.id[i] != 0)) {
            continue;
        }
        s->row[s->n] = i;
        memcpy(s->hkl + 3 * s->n, h, sizeof(int) * 3);
        s->panel[s->n] = s->r.panel[i];
        s->x[s->n] = s->r.xyz[3 * i];
        s->y[s->n] = s->r.xyz[3 * i + 1];
        ++s->n;
    }
    if (s->n == 0) {
        fprintf(stderr, "nbgrad: error: -centroids: %s holds no indexed reflection of experiment 0\n", o->spotlist);
        return 0;
    }
    if (nbg_reflection_centroids(ctx, &c->e, s->n, s->hkl, s->panel, s->x, s->y, o->centroid_radius, s->sx, s->sy,
                                 NULL) != NBG_OK) {
        fprintf(stderr, "nbgrad: error: -centroids: %s\n", nbg_errmsg(ctx));
        return 0;
    }
    return 1;
}

/* rms of (ax - x, ay - y) over the rows where sel (NULL: all) and the values are finite; *cnt the rows counted */
static void rms2(const centroid_set *s, const double *ax, const double *ay, int used_only, double *rx, double *ry,
                 long *cnt)
{
    double qx = 0, qy = 0;
    long k = 0;
    for (long i = 0; i < s->n; ++i) {
        const long r = s->row[i];
        if (used_only && !(s->r.flags != NULL && (s->r.flags[r] & NBG_REFL_USED_IN_REFINEMENT))) continue;
        if (!isfinite(ax[i]) || !isfinite(ay[i])) continue;
        qx += (ax[i] - s->x[i]) * (ax[i] - s->x[i]);
        qy += (ay[i] - s->y[i]) * (ay[i] - s->y[i]);
        ++k;
    }
    *rx = k ? sqrt(qx / k) : NAN;
    *ry = k ? sqrt(qy / k) : NAN;
    *cnt = k;
}

static int centroids_end(nbg_ctx *ctx, nbgi_cli *c, const grad_opts *o, centroid_set *s)
{
    if (nbg_reflection_centroids(ctx, &c->e, s->n, s->hkl, s->panel, s->x, s->y, o->centroid_radius, s->fx, s->fy,
                                 s->ph) != NBG_OK) {
        fprintf(stderr, "nbgrad: error: -centroids: %s\n", nbg_errmsg(ctx));
        return 0;
    }
    double *dx = NULL, *dy = NULL;
    if (s->r.xyzcal != NULL) {
        dx = malloc(sizeof(double) * (size_t)(2 * s->n));
        if (dx == NULL) {
            fprintf(stderr, "nbgrad: error: -centroids: out of memory\n");
            return 0;
        }
        dy = dx + s->n;
        for (long i = 0; i < s->n; ++i) {
            dx[i] = s->r.xyzcal[3 * s->row[i]];
            dy[i] = s->r.xyzcal[3 * s->row[i] + 1];
        }
    }
    printf("spot centroids (each indexed reflection's own model spot within %d pixels of its observed centroid, "
           "against the observed centroid; rms x, y in pixels):\n", o->centroid_radius);
    for (int used = 0; used <= (s->r.flags != NULL); ++used) {
        double rx, ry;
        long k;
        printf("  %s:", used ? "the reflections DIALS refined against (used_in_refinement)" : "every indexed reflection");
        rms2(s, s->sx, s->sy, used, &rx, &ry, &k);
        printf(" start model %.3f %.3f (%ld),", rx, ry, k);
        rms2(s, s->fx, s->fy, used, &rx, &ry, &k);
        printf(" fitted model %.3f %.3f (%ld)", rx, ry, k);
        if (dx != NULL) {
            rms2(s, dx, dy, used, &rx, &ry, &k);
            printf(", DIALS's prediction (xyzcal.px) %.3f %.3f (%ld)", rx, ry, k);
        }
        printf("\n");
    }
    nbgi_out out;
    int ok = nbgi_out_open(ctx, o->centroids, &out) == NBG_OK;
    char line[512];
    int len = snprintf(line, sizeof line, "# panel h k l x_obs y_obs x_dials y_dials x_start y_start x_fit y_fit "
                       "photons used_in_refinement (pixels; NaN: no model photons within %d pixels)\n",
                       o->centroid_radius);
    ok = ok && nbgi_out_write(ctx, &out, line, (size_t)len) == NBG_OK;
    for (long i = 0; ok && i < s->n; ++i) {
        const long r = s->row[i];
        len = snprintf(line, sizeof line, "%d %d %d %d %.4f %.4f %.4f %.4f %.4f %.4f %.4f %.4f %.6g %d\n", s->panel[i],
                       s->hkl[3 * i], s->hkl[3 * i + 1], s->hkl[3 * i + 2], s->x[i], s->y[i], dx ? dx[i] : NAN,
                       dy ? dy[i] : NAN, s->sx[i], s->sy[i], s->fx[i], s->fy[i], s->ph[i],
                       s->r.flags != NULL && (s->r.flags[r] & NBG_REFL_USED_IN_REFINEMENT) ? 1 : 0);
        ok = nbgi_out_write(ctx, &out, line, (size_t)len) == NBG_OK;
    }
    free(dx);
    if (!ok || nbgi_out_finish(ctx, &out, NULL) != NBG_OK) {
        fprintf(stderr, "nbgrad: error: -centroids: %s\n", nbg_errmsg(ctx));
        return 0;
    }
    printf("wrote %s: the %ld indexed reflections' observed, DIALS's and nbgrad's centroids\n", o->centroids, s->n);
    return 1;
}

/* refine -hklout: "h k l F" lines of the table's entries that the fit moved from F0 (its start). */
static int refine_write_hkl(nbg_ctx *ctx, nbgi_cli *c, const char *path, const double *F0)
{
    nbgi_out out;
    int ok = nbgi_out_open(ctx, path, &out) == NBG_OK;
    const nbg_hkl *t = &c->hkl;
    long n = 0;
    size_t j = 0;
    for (int h = t->h_min; ok && h <= t->h_max; ++h) {
        for (int k = t->k_min; ok && k <= t->k_max; ++k) {
            for (int l = t->l_min; ok && l <= t->l_max; ++l, ++j) {
                if (t->F[j] != F0[j]) {
                    char line[128];
                    const int len = snprintf(line, sizeof line, "%d %d %d %.10g\n", h, k, l, t->F[j]);
                    ok = nbgi_out_write(ctx, &out, line, (size_t)len) == NBG_OK;
                    ++n;
                }
            }
        }
    }
    if (!ok || nbgi_out_finish(ctx, &out, NULL) != NBG_OK) {
        fprintf(stderr, "nbgrad: error: -hklout: %s\n", nbg_errmsg(ctx));
        return 0;
    }
    printf("wrote %s: h k l F of the %ld fitted entries\n", path, n);
    return 1;
}
#endif /* NBG_NO_REFINE */

static int cmd_refine(int argc, char **argv, int first)
{
#ifdef NBG_NO_REFINE
    (void)argc, (void)argv, (void)first, (void)refine_progress;
    fprintf(stderr, "nbgrad: error: this build has no refinement (built with GSL=0, without GSL and LAPACKE)\n");
    return 1;
#else
    nbgi_cli c;
    grad_opts o = {0};
    o.break_param = -1;
    nbgi_response_opts_init(&o.resp);
    o.max_iter = 100;
    o.spots = -1;
    o.spot_shoebox = -1;
    o.spot_frac = 0.05;
    o.centroid_radius = 5;
    o.cmd = CMD_REFINE;
    nbgi_cli_init(&c);
    c.extra_handler = grad_flags;
    c.extra = &o;
    int status = 1;
    float *obs = NULL, *wts = NULL;
    uint8_t *use = NULL;
    int nf = 0;                 /* frames fitted */
    nbg_experiment *fe = NULL;  /* their experiments */
    float **fobs = NULL;        /* their counts (fobs[0] = obs) */
    uint8_t **fuse = NULL;      /* their masks (fuse[0] = use) */
    uint32_t **fspot = NULL;    /* their spot regions */
    nbg_refine_result res = {0};
    double *F0 = NULL; /* with F fitted: the table as it started (-hklout writes the entries that moved) */
    int sv_knots = 0;  /* -scan_varying: the knots */
    double *sv_points = NULL; /* -scan_varying with -exptfile: the crystal at each image boundary (nf + 1 bases) */
    centroid_set cen = {0};
    nbg_ctx *ctx = setup(&c, argc, argv, first, &o);
    if (ctx == NULL) {
        if (c.help) {
            grad_usage(CMD_REFINE,
                       "usage: nbgrad refine <nanoBragg flags> -observed FILE -params LIST [-loss lsq|poisson]\n"
                       "       [-pedestal counts] [-gain x] [-read_noise counts]\n"
                       "       [-method lm|bfgs] [-maxiter 100] [-weights FILE] [-json FILE] [-residual FILE]\n"
                       "       [-spots N [-spot_frac 0.05]] [-spotlist FILE [-spot_shoebox N]]\n"
                       "prints \"converged after N iterations (reason)\" or \"NOT CONVERGED ...\"; exit status "
                       "0 converged, 1 error,\n2 not converged, 3 converged but the model's floor does not "
                       "match the data's (pedestal or background missing),\n4 converged but the model does not "
                       "explain the data within their noise (goodness of fit)");
            status = 0;
        }
        grad_opts_free(&o);
        c.extra = NULL;
        nbgi_cli_free(&c);
        return status;
    }
    if (o.observed == NULL || o.params == NULL || o.params[0] == '\0') {
        fprintf(stderr, "nbgrad: error: refine needs -observed FILE and -params LIST\n");
        goto done;
    }
    if (!resolve_params(ctx, &c, &o)) {
        goto done;
    }
    if (o.nids == 0) {
        fprintf(stderr, "nbgrad: error: no parameter left to refine\n");
        goto done;
    }
    nbg_report r;
    if (nbg_describe(ctx, &c.e, &r) != NBG_OK) {
        fprintf(stderr, "nbgrad: error: %s\n", nbg_errmsg(ctx));
        goto done;
    }
    const size_t npix = r.npix;
    /* a rotation series (-frames, or the scan of -expt): every frame of an NXmx file or of a '#' template; one
     * image of another kind is fitted alone, at the start angle (and width) its header states */
    int alone = 0;
    nf = refine_nframes(&c, o.observed, &alone);
    const uint8_t *climask = c.e.mask; /* -mask, before the first frame's file mask joins it */
    nbg_geometry og;
    if ((obs = read_observed(ctx, &c, &o, 0, &use, &og)) == NULL) goto done;
    double phi0 = r.phi0, osc = r.osc; /* the first frame's start angle, every frame's width */
    const int own_osc = alone && refine_alone_angle(&c, &r, &og, o.observed, &phi0, &osc, NULL);
    if (o.weights != NULL && (wts = read_image(ctx, &c.e, "-weights", o.weights, npix)) == NULL) goto done;
    if (c.scan_crystal != NULL && o.sv_width > 0) {
        printf("note: refine starts from the static crystal of -expt %s, not from its %d scan points, and fits a "
               "scan-varying orientation (-scan_varying)\n", c.exptin, c.scan_points);
    } else if (c.scan_crystal != NULL) {
        /* refine's model is one crystal for every image: it starts from the list's static crystal (starting each
         * image from its scan point would carry the scan-varying fit's per-image errors, which one crystal cannot
         * remove: on the DIALS tier's series, 4 to 70 times larger orientation errors) */
        printf("note: refine fits one crystal for every image: it starts from the static crystal of -expt %s, not "
               "from its %d scan points (simulate and grad render each image with its own)\n", c.exptin,
               c.scan_points);
    }
    if (o.sv_cell && !(o.sv_width > 0)) {
        fprintf(stderr, "nbgrad: error: -scan_vary crystal needs -scan_varying W (the knots' spacing)\n");
        goto done;
    }
    if (o.sv_width > 0) {
        /* the scan-varying orientation: about a knot every W deg of the scan, at least 2, at most one a frame */
        int nor = 0;
        for (int j = 0; j < o.nids; ++j) {
            nor += o.ids[j] == NBG_P_ORIENT_X || o.ids[j] == NBG_P_ORIENT_Y || o.ids[j] == NBG_P_ORIENT_Z;
        }
        if (nf < 2) {
            fprintf(stderr, "nbgrad: error: -scan_varying needs a scan of several frames (-observed %s is one image; a "
                    "'#' template or an NXmx file of the scan)\n", o.observed);
            goto done;
        }
        if (nor == 0) {
            fprintf(stderr, "nbgrad: error: -scan_varying: no orientation parameter to vary (name orient_x, orient_y, "
                    "orient_z or the group orientation in -params)\n");
            goto done;
        }
        const double span = nf * fabs(osc);
        long K = isfinite(span) ? lround(span / o.sv_width) + 1 : 2;
        K = K < 2 ? 2 : K;
        if (K > nf) {
            printf("note: -scan_varying %g over %d frames of %g deg would put more than one knot a frame: %d knots\n",
                   o.sv_width, nf, osc, nf);
            K = nf;
        }
        sv_knots = (int)K;
        printf("scan-varying %s: %d knots over the %g deg of the scan (one every %g deg; -scan_varying %g), "
               "each frame's %s their interpolation\n", o.sv_cell ? "crystal" : "orientation", sv_knots, span,
               span / (K - 1), o.sv_width, o.sv_cell ? "orientation and cell" : "orientation");
    }
    int fits_bg = 0;
    for (int j = 0; j < o.nids; ++j) {
        fits_bg |= o.ids[j] == NBG_P_BG || o.ids[j] == NBG_P_BG_FAST || o.ids[j] == NBG_P_BG_SLOW;
    }
    if (!fits_bg) {
        floor_warning(ctx, &c, obs, wts, NULL, npix, " (before the fit)");
    }
    nbg_refine_options ro;
    nbg_refine_options_default(&ro);
    ro.method = o.method;
    ro.loss = o.loss;
    ro.max_iter = o.max_iter;
    ro.progress = refine_progress;
    ro.user = &o.max_iter;
    ro.scan_varying_knots = sv_knots;
    ro.scan_varying_cell = o.sv_cell;
    if (o.fit_F) {
        ro.F = &c.hkl;
        const size_t nF = (size_t)(c.hkl.h_max - c.hkl.h_min + 1) * (size_t)(c.hkl.k_max - c.hkl.k_min + 1) *
                          (size_t)(c.hkl.l_max - c.hkl.l_min + 1);
        if ((F0 = malloc(sizeof(double) * nF)) == NULL) {
            fprintf(stderr, "nbgrad: error: out of memory for %zu structure factors\n", nF);
            goto done;
        }
        memcpy(F0, c.hkl.F, sizeof(double) * nF);
    } else if (o.hklout != NULL) {
        fprintf(stderr, "nbgrad: error: -hklout: the structure factors are not fitted (name F in -params)\n");
        goto done;
    }
    fe = calloc((size_t)nf, sizeof *fe);
    fobs = calloc((size_t)nf, sizeof *fobs);
    fuse = calloc((size_t)nf, sizeof *fuse);
    fspot = calloc((size_t)nf, sizeof *fspot);
    const float **fw = calloc((size_t)nf, sizeof *fw);
    if (fe == NULL || fobs == NULL || fuse == NULL || fspot == NULL || fw == NULL) {
        free(fw);
        fprintf(stderr, "nbgrad: error: out of memory for %d frames\n", nf);
        goto done;
    }
    /* frame f: the crystal turned from phi0 + f osc through osc, its own counts, mask and spot regions */
    const nbg_experiment first_e = c.e;
    int fok = 1;
    for (int f = 0; f < nf && fok; ++f) {
        c.e = first_e;
        c.e.phi0 = phi0 + f * osc;
        if (own_osc) {
            c.e.osc = osc;
        }

        if (f == 0) {
            fobs[0] = obs, fuse[0] = use;
        } else {
            c.e.mask = climask;
            fok = (fobs[f] = read_observed(ctx, &c, &o, f, &fuse[f], NULL)) != NULL;
            c.e.mask = fuse[f];
        }
        fw[f] = wts;
        if (fok && (o.spots >= 0 || o.spotlist != NULL || o.spot_shoebox >= 0)) {
            fok = spot_regions(ctx, &c, &o, fuse[f], npix, &fspot[f]);
        }
        fe[f] = c.e;
        if (nf > 1 && fok) {
            nbgi_progress(0, f + 1, nf, "refine: frame %d of %d read", f + 1, nf);
        }
    }
    nbgi_progress_end();
    c.e = fe[0];
    if (!fok) {
        free(fw);
        goto done;
    }
    printf("refining %d parameters%s with %s on the %s loss%s\n", o.nids,
           o.fit_F ? " and the structure factors (per-reflection scales)" : "",
           o.method == NBG_OPT_LM ? "Levenberg-Marquardt" : "BFGS",
           o.loss == NBG_LOSS_LSQ ? "least-squares"
           : c.e.response.read_noise > 0 ? "shifted-Poisson (read noise)" : "Poisson",
           nf > 1 ? ", summed over the frames" : "");
    if (nf > 1) {
        printf("%d frames of %g deg from phi %g deg\n", nf, r.osc, r.phi0);
    }
    if (o.centroids != NULL && !centroids_start(ctx, &c, &o, &cen)) {
        free(fw);
        goto done;
    }
    const int frc = nbg_refine_frames(ctx, fe, nf, (const float *const *)fobs, wts != NULL ? fw : NULL, npix,
                                      o.ids, o.nids, &ro, &res);
    nbgi_progress_end();
    free(fw);
    c.e = fe[0];
    if (frc != NBG_OK) {
        fprintf(stderr, "nbgrad: error: %s\n", nbg_errmsg(ctx));
        goto done;
    }
    c.e.pixels = NULL; /* the residual and the experiment written are the whole detector's */
    c.e.npixels_list = 0;
    if (res.constraint[0] != 0) {
        printf("%s\n", res.constraint);
    }
    refine_outcome(&res);
    if (o.fit_F) {
        printf("structure factors: %ld entries fitted with the parameters as intensities F^2 (those with at least "
               "half their predicted photons in the fitted pixels, seen alone by two or more; the start's step moved "
               "one by up to %.3g of itself), %ld of them at zero intensity; the parameters' standard errors include "
               "them\n", res.F_fitted, res.F_moved, res.F_zero);
        if (o.hklout != NULL && !refine_write_hkl(ctx, &c, o.hklout, F0)) {
            goto done;
        }
    }
    const int floor_bad = res.floor.mismatch;
    if (floor_bad) {
        floor_warning(ctx, &c, obs, wts, NULL, npix, " (after the fit)");
    }
    refine_table(&c.e, &res);
    refine_undetermined(&c.e, &res);
    refine_cell_note(ctx, &c.e, &res);
    printf("goodness of fit: %s\n", res.fit.message);
    const int fit_bad = res.fit.mismatch;
    if (fit_bad) {
        printf("WARNING: the fitted model does not explain the data within their noise (deviance %.4g times its "
               "expectation over %ld pixels, %.4g over the spots): a part of the model is wrong or missing "
               "(polarization, mosaicity, crystal size or shape, background, detector response); %s\n", res.fit.ratio,
               res.fit.n, res.fit.ratio_spots, o.loss == NBG_LOSS_POISSON
                   ? "the standard errors above assume it does: multiplied by sqrt(ratio) they are"
                   : "the standard errors above carry the residuals' variance, not the misfit's structure");
        if (o.loss == NBG_LOSS_POISSON) {
            char lab[64];
            for (int j = 0; j < res.nparams; ++j) {
                if (is_F(res.params[j])) {
                    continue;
                }
                printf("  %-12s %14.4g\n", res_label(&c.e, &res, j, lab, sizeof lab),
                       res.sigma[j] * res.fit.sigma_scale);
            }
        }
    }
    if (o.residual != NULL && !refine_write_residual(ctx, &c, o.residual, obs, use, npix)) {
        goto done;
    }
    if (o.centroids != NULL && !centroids_end(ctx, &c, &o, &cen)) {
        goto done;
    }
    nbg_experiment sv_mid = c.e;
    if (c.exptfile != NULL && res.nknots > 0 &&
        !refine_scan_points(ctx, &c, &res, nf, phi0, osc, &sv_points, &sv_mid)) {
        goto done;
    }
    if (c.exptfile != NULL && !refine_write_expt(ctx, &c, nf, o.observed, sv_points, &sv_mid)) {
        goto done;
    }
    if (o.motionsout != NULL) {
        if (c.nmotions == 0) {
            fprintf(stderr, "nbgrad: error: -motionsfile: this detector has no panels to move\n");
            goto done;
        }
        if (!nbgi_cli_write_motions(ctx, &c, o.motionsout)) {
            goto done;
        }
        printf("wrote the panel motions to %s\n", o.motionsout);
    }
    if (o.domainrotout != NULL) {
        if (c.ndomain_rot == 0) {
            fprintf(stderr, "nbgrad: error: -domain_rotfile: the crystal's domains have no turns of their own (-params "
                    "domain_rot, -domain_rot)\n");
            goto done;
        }
        if (!nbgi_cli_write_domain_rot(ctx, &c, o.domainrotout)) {
            goto done;
        }
        printf("wrote the mosaic domains' turns to %s\n", o.domainrotout);
    }
    if (o.json != NULL && !refine_write_json(ctx, &c, &o, &res, floor_bad)) {
        goto done;
    }
    status = nbgi_cli_commit(ctx, &c) ? (!res.converged ? 2 : floor_bad ? 3 : fit_bad ? 4 : 0) : 1;
    if (status == 2) {
        printf("exit status 2: not converged\n");
    } else if (status == 3) {
        printf("exit status 3: the fit converged but the fitted model's floor does not match the data's\n");
    } else if (status == 4) {
        printf("exit status 4: the fit converged but the model does not explain the data within their noise\n");
    }
done:
    free(sv_points);
    free(obs);
    free(wts);
    free(use);
    for (int f = 1; f < nf; ++f) { /* frame 0's are obs and use */
        free(fobs != NULL ? fobs[f] : NULL);
        free(fuse != NULL ? fuse[f] : NULL);
    }
    for (int f = 0; fspot != NULL && f < nf; ++f) {
        free(fspot[f]);
    }
    free(fobs);
    free(fuse);
    free(fspot);
    free(fe);
    free(F0);
    centroid_set_free(&cen);
    nbg_refine_result_free(&res);
    grad_opts_free(&o);
    c.extra = NULL;
    nbgi_cli_free(&c);
    nbg_ctx_destroy(ctx);
    return status;
#endif
}

/* The subcommands' flag tables: main.c's (grad, gradcheck, refine), ensemble.c's, batch.c's (batch, shots). */
static const nbgi_sub_flag *sub_table(int k, int *n)
{
    switch (k) {
    case 0:
        *n = (int)NGRAD_FLAGS;
        return grad_flag_table;
    case 1:
        return nbgi_ensemble_flags(n);
    case 2:
        return nbgi_batch_flags(n);
    case 3:
        return nbgi_response_flags(n);
    default:
        *n = 0;
        return NULL;
    }
}

/* Every subcommand's own flags, with their subcommands; markdown: as docs/flags.md's list. */
static void sub_flags_doc(FILE *out, int markdown)
{
    int n;
    const nbgi_sub_flag *t;
    for (int k = 0; (t = sub_table(k, &n)) != NULL; ++k) {
        nbgi_sub_flags_doc(out, t, n, 0, markdown);
    }
}

/* nbgrad --flags-list: every flag name the program accepts, one a line; a subcommand's own (not a common flag too)
 * followed by the subcommands that take it. */
static void flags_list(FILE *out)
{
    nbgi_cli_flags_list(out);
    int n, m;
    const nbgi_sub_flag *t, *u;
    for (int k = 0; (t = sub_table(k, &n)) != NULL; ++k) {
        for (int i = 0; i < n; ++i) {
            if (nbgi_cli_is_flag(t[i].flag)) {
                continue; /* shots' -seed, -cell, -N: listed as the common flags they also are */
            }
            int seen = 0;
            unsigned cmds = 0;
            for (int k2 = 0; (u = sub_table(k2, &m)) != NULL; ++k2) {
                for (int j = 0; j < m; ++j) {
                    if (strcmp(u[j].flag, t[i].flag) == 0) {
                        seen |= k2 < k || (k2 == k && j < i);
                        cmds |= u[j].cmds;
                    }
                }
            }
            char scope[96];
            if (!seen) {
                fprintf(out, "%s %s\n", t[i].flag, nbgi_cmd_names(cmds, scope, sizeof scope));
            }
        }
    }
}

int main(int argc, char **argv)
{
    nbgi_mpi_reexec(argv); /* under mpirun: nbgrad-mpi, the program with MPI */
    nbgi_progress_init();
    if (argc < 2) {
        usage_main(stderr);
        return 1;
    }
    if (strcmp(argv[1], "--version") == 0 || strcmp(argv[1], "-version") == 0) {
        printf("nbgrad %s\n", nbg_version()); /* the library's (a shared one may be newer than the header) */
        return 0;
    }
    if (strcmp(argv[1], "-h") == 0 || strcmp(argv[1], "--help") == 0) {
        usage_main(stdout);
        printf("\n");
        nbgi_cli_usage(stdout);
        printf("the subcommands' own flags (nbgrad SUBCOMMAND -h lists what each takes):\n");
        sub_flags_doc(stdout, 0);
        return 0;
    }
    /* hidden: the flag tables as the generated section of docs/flags.md (the command that rewrites it is above the
     * flag table in src/cli.c), and every flag name the program accepts */
    if (strcmp(argv[1], "--flags-markdown") == 0) {
        printf("<!-- BEGIN FLAGS: generated by `nbgrad --flags-markdown` from the flag tables (src/cli.c, src/main.c, "
               "src/ensemble.c, src/batch.c); do not edit by hand -->\n");
        nbgi_cli_flags_markdown(stdout);
        printf("**the subcommands' own flags** (each only where its subcommands use it; `nbgrad SUBCOMMAND -h` lists "
               "what each takes)\n\n");
        sub_flags_doc(stdout, 1);
        printf("<!-- END FLAGS -->\n");
        return 0;
    }
    /* hidden: the parameter table as the list of -params in docs/parameters.md (tests/test-flags.c checks it); after
     * changing include/nbgrad_params.def, regenerate that list:
     *
     *   make build/nbgrad && build/nbgrad --params-markdown > build/params.md &&
     *   awk 'FNR == NR { g = g $0 "\n"; next } /^<!-- BEGIN PARAMS/ { printf "%s", g; skip = 1 } !skip { print }
     *        /^<!-- END PARAMS/ { skip = 0 }' build/params.md docs/parameters.md > build/parameters-doc.md &&
     *   cp build/parameters-doc.md docs/parameters.md */
    if (strcmp(argv[1], "--params-markdown") == 0) {
        printf("<!-- BEGIN PARAMS: generated by `nbgrad --params-markdown` from include/nbgrad_params.def; do not edit "
               "by hand -->\n");
        printf("| name | unit | groups | what it is | set by |\n|---|---|---|---|---|\n");
        for (nbg_param p = 0; p < NBG_NPARAMS; ++p) {
            nbg_param_info in;
            if (nbg_param_info_get(p, &in) == NBG_OK) {
                printf("| `%s`%s%s%s | %s | %s | %s | %s |\n", in.name, in.alias[0] ? " (`" : "", in.alias,
                       in.alias[0] ? "`)" : "", in.unit, in.groups, in.help, in.flag[0] ? in.flag : "-");
            }
        }
        printf("<!-- END PARAMS -->\n");
        return 0;
    }
    if (strcmp(argv[1], "--flags-list") == 0) {
        flags_list(stdout);
        return 0;
    }
    if (strcmp(argv[1], "gradcheck") == 0) {
        return cmd_gradcheck(argc, argv, 2);
    }
    if (strcmp(argv[1], "batch") == 0) {
        return nbgi_cmd_batch(argc, argv, 2);
    }
    if (strcmp(argv[1], "shots") == 0) {
        return nbgi_cmd_shots(argc, argv, 2);
    }
    if (strcmp(argv[1], "ensemble") == 0) {
        return nbgi_cmd_ensemble(argc, argv, 2);
    }
    if (strcmp(argv[1], "refine") == 0) {
        return cmd_refine(argc, argv, 2);
    }
    if (strcmp(argv[1], "grad") == 0) {
        return cmd_grad(argc, argv, 2);
    }
    if (strcmp(argv[1], "simulate") == 0) {
        return cmd_simulate(argc, argv, 2);
    }
    return cmd_simulate(argc, argv, 1);
}
