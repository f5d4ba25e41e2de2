/*
 * param.c -- the parameter table (include/nbgrad_params.def) and everything generated from it: names and
 * aliases, the value's field, bounds, steps, groups, when a parameter is free, the public queries
 * (nbg_param_info_get, nbg_param_groups) and the parser of parameter lists (nbg_params_parse).
 */
#include "grad.h"
#include "param.h"

#include <ctype.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* --- the table ------------------------------------------------------------------------------------------- */

#define DOM(lo, hi, lo_open, hi_open, optional) lo, hi, lo_open, hi_open, optional
#define BND(lo, hi, lo_open, hi_open) lo, hi, lo_open, hi_open
#define STEP(fixed, rel, floor, imean) fixed, rel, floor, imean
#define SETUP(kind, index) kind, index
#define NBG_PARAM(ID, name, alias, unit, flag, desc, groups, field, dom, bnd, step, setup, free, help)             \
    [NBG_P_##ID] = {name, alias, unit, flag, desc, groups, offsetof(nbg_experiment, field), dom, bnd, step, setup,  \
                    free, help},
const nbgi_param_row nbgi_param_rows[NBG_NPARAMS] = {
#include "nbgrad_params.def"
};
#undef NBG_PARAM

/* Every row is in the table once: the rows counted equal the enum's count (a row the enum lacks cannot exist:
 * both come from the same file), and each is a double of nbg_experiment. */
#define NBG_PARAM(ID, name, alias, unit, flag, desc, groups, field, ...) +1
_Static_assert(0
#include "nbgrad_params.def"
                   == NBG_NPARAMS,
               "nbgrad_params.def: rows and ids disagree");
#undef NBG_PARAM
#define NBG_PARAM(ID, name, alias, unit, flag, desc, groups, field, ...)                                           \
    _Static_assert(sizeof(((nbg_experiment *)0)->field) == sizeof(double), "parameter " name " is not a double");
#include "nbgrad_params.def"
#undef NBG_PARAM

/* The groups -params knows, besides "all"; every row's groups are among them (test-params checks). */
static const char *const group_names =
    "all cell orientation misset crystal beam detector detector_frame model background goniometer spectrum";

static const char *const motion_names[6] = {"shift_x", "shift_y", "shift_z", "rot_x", "rot_y", "rot_z"};
/* a domain's turn's components: the motions' rotations */
static const char *const *const domain_names = motion_names + 3;

/* --- ids ------------------------------------------------------------------------------------------------- */

nbgi_kind nbgi_param_kind(nbg_param p, int *g, int *c, long *i)
{
    if (p >= 0 && p < NBG_NPARAMS) {
        return NBGI_K_SCALAR;
    }
    if (p == NBG_P_F_ALL) {
        return NBGI_K_F_ALL;
    }
    if (p >= NBG_P_F0) {
        if (i != NULL) {
            *i = (long)p - NBG_P_F0;
        }
        return NBGI_K_F;
    }
    int gg, cc;
    if (nbgi_param_motion(p, &gg, &cc)) {
        if (g != NULL) {
            *g = gg;
        }
        if (c != NULL) {
            *c = cc;
        }
        return NBGI_K_MOTION;
    }
    if (nbgi_param_domain(p, &gg, &cc)) {
        if (g != NULL) {
            *g = gg;
        }
        if (c != NULL) {
            *c = cc;
        }
        return NBGI_K_DOMAIN;
    }
    return NBGI_K_BAD;
}

int nbgi_param_image_level(nbg_param p)
{
    return p >= 0 && p < NBG_NPARAMS && nbgi_param_rows[p].setup == NBGI_S_MODEL;
}

int nbgi_param_is_offset(nbg_param p)
{
    return p >= 0 && p < NBG_NPARAMS && (nbgi_param_rows[p].setup == NBGI_S_BEAM || nbgi_param_rows[p].setup == NBGI_S_TILT ||
                                          nbgi_param_rows[p].setup == NBGI_S_ORIENT ||
                                          nbgi_param_rows[p].setup == NBGI_S_DET_TAU ||
                                          nbgi_param_rows[p].setup == NBGI_S_BEAM_DIR);
}

long nbgi_param_nF(const nbg_experiment *e)
{
    if (e == NULL || e->hkl == NULL) {
        return 1;
    }
    const nbg_hkl *t = e->hkl;
    return (long)(t->h_max - t->h_min + 1) * (t->k_max - t->k_min + 1) * (t->l_max - t->l_min + 1);
}

double nbgi_param_step(nbg_param p, double x, double imean)
{
    const double ax = fabs(x);
    if (p < 0 || p >= NBG_NPARAMS) {
        return nbgi_param_kind(p, NULL, NULL, NULL) == NBGI_K_F ? 1e-3 * fmax(ax, 1.0) : 1e-3;
    }
    const nbgi_param_row *r = &nbgi_param_rows[p];
    if (r->step_fixed > 0) {
        return r->step_fixed;
    }
    const double floor = r->step_imean ? fmax(imean, r->step_floor) : r->step_floor;
    return r->step_rel * fmax(ax, floor);
}

/* --- names ----------------------------------------------------------------------------------------------- */

int nbg_param_info_get(nbg_param p, nbg_param_info *info)
{
    if (info == NULL) {
        return NBG_EINVAL;
    }
    memset(info, 0, sizeof *info);
    info->id = p;
    int g, c;
    switch (nbgi_param_kind(p, &g, &c, NULL)) {
    case NBGI_K_SCALAR: {
        const nbgi_param_row *r = &nbgi_param_rows[p];
        info->name = r->name;
        info->alias = r->alias;
        info->unit = r->unit;
        info->flag = r->flag;
        info->groups = r->groups;
        info->help = r->help;
        info->lo = r->lo;
        info->hi = r->hi;
        info->lo_open = r->lo_open;
        info->hi_open = r->hi_open;
        info->optional = r->optional;
        info->bound_lo = r->blo;
        info->bound_hi = r->bhi;
        info->bound_lo_open = r->blo_open;
        info->bound_hi_open = r->bhi_open;
        return NBG_OK;
    }
    case NBGI_K_MOTION:
        info->name = motion_names[c];
        info->alias = "";
        info->unit = c < 3 ? "mm" : "deg";
        info->flag = "-motions";
        info->groups = "panels";
        info->help = c < 3 ? "a panel group's shift along the panel frame's x, y, z (g<k>.shift_x ...)"
                           : "a panel group's rotation about the panel frame's x, y, z through its pivot (g<k>.rot_x ...)";
        break;
    case NBGI_K_DOMAIN:
        info->name = domain_names[c];
        info->alias = "";
        info->unit = "deg";
        info->flag = "-domain_rot";
        info->groups = "domain_rot";
        info->help = "a mosaic domain's own turn about the lab's x, y, z at phi 0 (d<m>.rot_x ...)";
        break;
    case NBGI_K_F:
    case NBGI_K_F_ALL:
        info->name = "F";
        info->alias = "";
        info->unit = "";
        info->flag = "-hkl, -default_F";
        info->groups = "";
        info->help = p == NBG_P_F_ALL ? "every structure factor, checked along one direction (gradcheck)"
                                      : "one structure-factor amplitude, F(h,k,l) (default_F without a table)";
        break;
    default:
        return NBG_EINVAL;
    }
    info->lo = info->bound_lo = -INFINITY;
    info->hi = info->bound_hi = INFINITY;
    info->lo_open = info->hi_open = info->bound_lo_open = info->bound_hi_open = 1;
    return NBG_OK;
}

const char *nbg_param_groups(void)
{
    return group_names;
}

const char *nbg_param_name(nbg_param p)
{
    nbg_param_info in;
    return nbg_param_info_get(p, &in) == NBG_OK ? in.name : "?";
}

const char *nbg_param_label(const nbg_experiment *e, nbg_param p, char *buf, size_t size)
{
    int g, c;
    long i;
    if (buf == NULL || size == 0) {
        return buf;
    }
    const nbgi_kind k = nbgi_param_kind(p, &g, &c, &i);
    if (k == NBGI_K_MOTION) {
        snprintf(buf, size, "g%d.%s", g, motion_names[c]);
    } else if (k == NBGI_K_DOMAIN) {
        snprintf(buf, size, "d%d.%s", g, domain_names[c]);
    } else if (k == NBGI_K_F && e != NULL && e->hkl != NULL && i < nbgi_param_nF(e)) {
        const nbg_hkl *t = e->hkl;
        const long nk = t->k_max - t->k_min + 1, nl = t->l_max - t->l_min + 1;
        snprintf(buf, size, "F(%ld,%ld,%ld)", i / (nk * nl) + t->h_min, (i / nl) % nk + t->k_min, i % nl + t->l_min);
    } else if (k == NBGI_K_F && (e == NULL || e->hkl != NULL || i != 0)) {
        snprintf(buf, size, "F[%ld]", i);
    } else {
        snprintf(buf, size, "%s", nbg_param_name(p));
    }
    return buf;
}

int nbg_param_from_name(const char *name)
{
    if (name == NULL || name[0] == '\0') {
        return -1;
    }
    for (int p = 0; p < NBG_NPARAMS; ++p) {
        const nbgi_param_row *r = &nbgi_param_rows[p];
        if (strcmp(name, r->name) == 0 || (r->alias[0] != '\0' && strcmp(name, r->alias) == 0)) {
            return p;
        }
    }
    /* g<group>.<component> */
    if (name[0] == 'g' && name[1] >= '0' && name[1] <= '9') {
        char *end;
        const long g = strtol(name + 1, &end, 10);
        if (*end == '.' && g >= 0 && g < NBGI_MAX_MOTIONS) {
            for (int c = 0; c < 6; ++c) {
                if (strcmp(end + 1, motion_names[c]) == 0) {
                    return (int)NBG_P_MOTION(g, c);
                }
            }
        }
    }
    /* d<domain>.<component> */
    if (name[0] == 'd' && name[1] >= '0' && name[1] <= '9') {
        char *end;
        const long m = strtol(name + 1, &end, 10);
        if (*end == '.' && m >= 0 && m < NBGI_MAX_DOMAINS) {
            for (int c = 0; c < 3; ++c) {
                if (strcmp(end + 1, domain_names[c]) == 0) {
                    return (int)NBG_P_DOMAIN(m, c);
                }
            }
        }
    }
    return -1;
}

/* --- values ---------------------------------------------------------------------------------------------- */

/* The double that holds p's value in e, or NULL (a motion or F entry e does not have). */
static double *param_field(nbg_experiment *e, nbg_param p)
{
    int g, c;
    long i;
    switch (nbgi_param_kind(p, &g, &c, &i)) {
    case NBGI_K_SCALAR: {
        const nbgi_param_row *r = &nbgi_param_rows[p];
        if (r->setup == NBGI_S_DISTANCE) {
            /* the distance that places the detector: with the sample pivot and a close distance given, that one
             * (the beam-spot distance is then derived, and a parameter in it would change nothing) */
            const int sample = e->pivot == NBG_PIVOT_SAMPLE ||
                               (e->pivot == NBG_PIVOT_AUTO &&
                                (e->convention == NBG_CONV_XDS || e->convention == NBG_CONV_DIALS));
            if (sample && !isnan(e->close_distance)) {
                return &e->close_distance;
            }
        }
        return (double *)((char *)e + r->field);
    }
    case NBGI_K_MOTION:
        if (e->motions == NULL || g >= e->nmotions) {
            return NULL;
        }
        return c < 3 ? &e->motions[g].shift[c] : &e->motions[g].rot[c - 3];
    case NBGI_K_DOMAIN:
        return e->domain_rot != NULL && g < e->ndomain_rot ? &e->domain_rot[3 * g + c] : NULL;
    case NBGI_K_F:
        if (i < 0 || i >= nbgi_param_nF(e)) {
            return NULL;
        }
        return e->hkl != NULL ? &e->hkl->F[i] : &e->default_F;
    default:
        return NULL;
    }
}

int nbg_param_get(const nbg_experiment *e, nbg_param p, double *value)
{
    double *f = e != NULL ? param_field((nbg_experiment *)e, p) : NULL;
    if (f == NULL || value == NULL) {
        return NBG_EINVAL;
    }
    *value = *f;
    return NBG_OK;
}

int nbg_param_set(nbg_experiment *e, nbg_param p, double value)
{
    double *f = e != NULL ? param_field(e, p) : NULL;
    if (f == NULL || !isfinite(value)) {
        return NBG_EINVAL;
    }
    *f = value;
    return NBG_OK;
}

int nbg_param_in_bounds(nbg_param p, double v)
{
    nbg_param_info in;
    if (nbg_param_info_get(p, &in) != NBG_OK || !isfinite(v)) {
        return 0;
    }
    const int above = in.bound_lo_open ? v > in.bound_lo : v >= in.bound_lo;
    const int below = in.bound_hi_open ? v < in.bound_hi : v <= in.bound_hi;
    return above && below;
}

/* --- when a parameter is free ---------------------------------------------------------------------------- */

const char *nbgi_grad_mode_unsupported(const nbg_experiment *e)
{
    if (e->oversample_thick || e->oversample_polar || e->oversample_omega) {
        return "with -oversample_thick/_polar/_omega (nanoBragg's running-sum modes)";
    }
    return e->curved ? "for the curved detector" : NULL;
}

const char *nbgi_param_fixed(const nbg_experiment *e, const nbgi_plan *pl, nbg_param p, int *hard)
{
    int g, c;
    long i;
    *hard = 1;
    switch (nbgi_param_kind(p, &g, &c, &i)) {
    case NBGI_K_MOTION:
        return e->npanels > 0 && g < e->nmotions ? NULL : "needs panels with that many motion groups (nmotions)";
    case NBGI_K_DOMAIN:
        return e->domain_rot != NULL && g < e->ndomain_rot ? NULL
                                                            : "needs that many mosaic domains with their own turns "
                                                              "(-domain_rot, ndomain_rot)";
    case NBGI_K_F:
        return i >= 0 && i < nbgi_param_nF(e) ? NULL : "is not an entry of the structure-factor table";
    case NBGI_K_F_ALL:
        return NULL;
    case NBGI_K_BAD:
        return "is not a parameter";
    case NBGI_K_SCALAR:
        break;
    }
    switch (nbgi_param_rows[p].free) {
    case NBGI_FREE_ALWAYS:
        return NULL;
    case NBGI_FREE_CELL:
        return e->has_cell ? NULL : "needs -cell (with -mat alone the cell is not a free parameter)";
    case NBGI_FREE_MISSET:
        return !e->misset_random ? NULL : "needs explicit -misset angles (pass the random ones printed by the "
                                          "simulation with -misset)";
    case NBGI_FREE_N:
        return !(e->sample_x + e->sample_y + e->sample_z > 0) ? NULL : "needs N given directly (not -samplesize)";
    case NBGI_FREE_MOSAIC:
        return pl->lab.xtal.spread > 0 && pl->k.nmos > 1 ? NULL : "needs a positive mosaic spread and several domains";
    case NBGI_FREE_FLUENCE:
        return e->flux == 0 ? NULL : "is not free when -flux sets the fluence";
    case NBGI_FREE_PLANE:
        return !(e->npanels > 0 && e->panel_frame == NBG_PANELS_LAB)
                   ? NULL
                   : "does not move panels fixed in the lab frame (the detector plane's distance, beam centre, "
                     "rotations and two-theta do not place them)";
    case NBGI_FREE_POLAR:
        *hard = 0;
        return !e->nopolar ? NULL : "-nopolar fixes the polarization factor at 1";
    case NBGI_FREE_TURNED:
        *hard = 0;
        for (int ip = 0; ip < pl->k.nphi; ++ip) {
            if (pl->lab.gon.phi[ip] != 0) {
                return NULL;
            }
        }
        return "the crystal is not turned about the spindle (a still)";
    case NBGI_FREE_BEAMDIR:
        return e->curved ? "is not differentiated on the curved detector" : NULL;
    case NBGI_FREE_SPECTRUM:
        *hard = 0;
        for (int j = 1; j < pl->k.nsources; ++j) {
            if (pl->lab.beam.dscale[j] != pl->lab.beam.dscale[0]) {
                return NULL;
            }
        }
        return "the beam has one wavelength (a source file of several, or -dispersion, gives the spectrum a width)";
    }
    return NULL;
}

int nbg_param_free(nbg_ctx *ctx, const nbg_experiment *e, nbg_param p, char *why, size_t size)
{
    if (ctx == NULL || e == NULL || nbgi_param_kind(p, NULL, NULL, NULL) == NBGI_K_BAD) {
        return nbgi_error(ctx, NBG_EINVAL, "nbg_param_free: NULL argument or unknown parameter %d", (int)p);
    }
    if (why != NULL && size > 0) {
        why[0] = '\0';
    }
    nbgi_plan pl;
    int rc = nbgi_plan_build(ctx, e, &pl);
    if (rc != NBG_OK) {
        return rc;
    }
    int hard;
    const char *mode = nbgi_grad_mode_unsupported(e), *reason = NULL;
    char modewhy[160];
    if (mode != NULL) {
        snprintf(modewhy, sizeof modewhy, "no gradients %s", mode);
        reason = modewhy;
    } else {
        reason = nbgi_param_fixed(e, &pl, p, &hard);
    }
    if (reason != NULL && why != NULL && size > 0) {
        char lab[48];
        snprintf(why, size, "%s: %s", nbg_param_label(e, p, lab, sizeof lab), reason);
    }
    nbgi_plan_free(&pl);
    return reason == NULL;
}

/* --- lists ----------------------------------------------------------------------------------------------- */

static int cmp_id(const void *a, const void *b)
{
    const nbg_param x = *(const nbg_param *)a, y = *(const nbg_param *)b;
    return (x > y) - (x < y);
}

int nbgi_params_check(nbg_ctx *ctx, const nbg_experiment *e, const nbg_param *params, int n, int allow_F_all,
                      const char *what)
{
    if (n < 0 || (n > 0 && params == NULL)) {
        return nbgi_error(ctx, NBG_EINVAL, "%s: a list of %d parameters%s", what, n, n > 0 ? " without its array" : "");
    }
    const long nF = nbgi_param_nF(e);
    for (int j = 0; j < n; ++j) {
        int g, c;
        long i;
        char lab[48];
        const nbgi_kind k = nbgi_param_kind(params[j], &g, &c, &i);
        const char *bad = NULL;
        if (k == NBGI_K_BAD) {
            bad = "is not a parameter id";
        } else if (k == NBGI_K_MOTION && g >= e->nmotions) {
            bad = e->nmotions > 0 ? "names a panel group the experiment does not have" : "moves panels, and the "
                                                                                          "experiment has no motions";
        } else if (k == NBGI_K_DOMAIN && g >= e->ndomain_rot) {
            bad = "turns a mosaic domain that has no turn of its own in the experiment (ndomain_rot)";
        } else if (k == NBGI_K_F && !(i >= 0 && i < nF)) {
            bad = "is not an entry of the structure-factor table";
        } else if (k == NBGI_K_F_ALL && !allow_F_all) {
            bad = "(every structure factor at once) is for nbg_gradcheck; list the entries (NBG_P_F(i))";
        }
        if (bad != NULL) {
            return nbgi_error(ctx, NBG_EINVAL, "%s: parameter %d (%s) %s", what, j,
                             k == NBGI_K_BAD ? "?" : nbg_param_label(NULL, params[j], lab, sizeof lab), bad);
        }
    }
    if (n > 1) {
        nbg_param *s = malloc(sizeof *s * (size_t)n);
        if (s == NULL) {
            return nbgi_error(ctx, NBG_ENOMEM, "%s: out of memory for %d parameters", what, n);
        }
        memcpy(s, params, sizeof *s * (size_t)n);
        qsort(s, (size_t)n, sizeof *s, cmp_id);
        for (int j = 1; j < n; ++j) {
            if (s[j] == s[j - 1]) {
                char lab[48];
                nbg_param_label(e, s[j], lab, sizeof lab);
                free(s);
                return nbgi_error(ctx, NBG_EINVAL, "%s: parameter %s is listed twice", what, lab);
            }
        }
        free(s);
    }
    return NBG_OK;
}

/* A growing list of ids. */
typedef struct {
    nbg_param *v;
    int n, cap;
} idlist;

static int push(idlist *l, nbg_param p)
{
    if (l->n == l->cap) {
        const int cap = l->cap ? 2 * l->cap : 32;
        nbg_param *v = realloc(l->v, sizeof *v * (size_t)cap);
        if (v == NULL) {
            return 0;
        }
        l->v = v;
        l->cap = cap;
    }
    l->v[l->n++] = p;
    return 1;
}

/* Whether word is one of the space-separated words of list. */
static int has_word(const char *list, const char *word)
{
    const size_t n = strlen(word);
    for (const char *s = list; *s != '\0';) {
        while (*s == ' ') {
            ++s;
        }
        const char *t = s;
        while (*t != '\0' && *t != ' ') {
            ++t;
        }
        if ((size_t)(t - s) == n && n > 0 && strncmp(s, word, n) == 0) {
            return 1;
        }
        s = t;
    }
    return 0;
}

/* The components of every panel group's motion a word names (bit c for component c), 0 for another word. */
static unsigned panel_word(const char *w)
{
    if (strcmp(w, "panels") == 0) {
        return 63;
    }
    if (strcmp(w, "panel_shift") == 0) {
        return 7;
    }
    if (strcmp(w, "panel_rot") == 0) {
        return 56;
    }
    for (int c = 0; c < 6; ++c) {
        if (strncmp(w, "panel_", 6) == 0 && strcmp(w + 6, motion_names[c]) == 0) {
            return 1u << c;
        }
    }
    return 0;
}

/* "F(h,k,l)": the entry's index in e's table, or an error. */
static int parse_F_entry(nbg_ctx *ctx, const nbg_experiment *e, const char *w, nbg_param *out)
{
    int h, k, l, len = 0;
    if (sscanf(w, "F(%d,%d,%d)%n", &h, &k, &l, &len) != 3 || w[len] != '\0') {
        return nbgi_error(ctx, NBG_EINVAL, "parameter '%s': a structure factor is F(h,k,l), e.g. F(1,2,3)", w);
    }
    if (e->hkl == NULL) {
        return nbgi_error(ctx, NBG_EINVAL, "parameter '%s': there is no HKL table (without one, F is default_F)", w);
    }
    const nbg_hkl *t = e->hkl;
    if (h < t->h_min || h > t->h_max || k < t->k_min || k > t->k_max || l < t->l_min || l > t->l_max) {
        return nbgi_error(ctx, NBG_EINVAL, "parameter '%s': outside the HKL table (h %d..%d, k %d..%d, l %d..%d)", w,
                         t->h_min, t->h_max, t->k_min, t->k_max, t->l_min, t->l_max);
    }
    const long nk = t->k_max - t->k_min + 1, nl = t->l_max - t->l_min + 1;
    *out = NBG_P_F(((long)(h - t->h_min) * nk + (k - t->k_min)) * nl + (l - t->l_min));
    return NBG_OK;
}

/* Appends the ids one word names. */
static int parse_word(nbg_ctx *ctx, const nbg_experiment *e, const char *w, int flags, const nbgi_plan *pl,
                      idlist *l)
{
    const int p = nbg_param_from_name(w);
    if (p >= 0) {
        int g, c;
        if (nbgi_param_kind(p, &g, &c, NULL) == NBGI_K_MOTION && g >= e->nmotions) {
            return e->nmotions == 0
                       ? nbgi_error(ctx, NBG_EINVAL, "parameter '%s' moves a panel group, and the experiment has no "
                                    "panel motions (panels with motion groups: -layout or a multi-panel -expt)", w)
                       : nbgi_error(ctx, NBG_EINVAL, "parameter '%s': the experiment has %d panel groups (g0 to g%d)",
                                    w, e->nmotions, e->nmotions - 1);
        }
        if (nbgi_param_kind(p, &g, &c, NULL) == NBGI_K_DOMAIN && g >= e->ndomain_rot) {
            return nbgi_error(ctx, NBG_EINVAL, "parameter '%s' turns mosaic domain %d, and the experiment's domains "
                              "with turns of their own are %d (-domain_rot, or -mosaic_domains with -params "
                              "domain_rot)", w, g, e->ndomain_rot);
        }
        return push(l, p) ? NBG_OK : NBG_ENOMEM;
    }
    if (strcmp(w, "all") == 0) {
        /* every scalar free in e, but one of each set of parameters that make the same change: fluence beside scale
         * (both overall factors), the misset angles beside the orientation offsets (both turn the crystal), the beam's
         * tilts beside the detector and the crystal (turning the beam is turning them the other way), the detector's
         * turns about its own frame beside its rotations about the lab's (with the shifts, the same motions) */
        for (int q = 0; q < NBG_NPARAMS; ++q) {
            int hard;
            const int scale_free = nbgi_param_fixed(e, pl, NBG_P_SCALE, &hard) == NULL;
            if (nbgi_param_fixed(e, pl, q, &hard) != NULL || (q == NBG_P_FLUENCE && scale_free) ||
                nbgi_param_rows[q].setup == NBGI_S_MISSET || nbgi_param_rows[q].setup == NBGI_S_BEAM_DIR ||
                nbgi_param_rows[q].setup == NBGI_S_DET_TAU) {
                continue;
            }
            if (!push(l, q)) {
                return NBG_ENOMEM;
            }
        }
        return NBG_OK;
    }
    if (has_word(group_names, w)) {
        for (int q = 0; q < NBG_NPARAMS; ++q) {
            if (has_word(nbgi_param_rows[q].groups, w) && !push(l, q)) {
                return NBG_ENOMEM;
            }
        }
        return NBG_OK;
    }
    const unsigned comps = panel_word(w);
    if (comps != 0) {
        if (e->nmotions == 0) {
            return nbgi_error(ctx, NBG_EINVAL, "parameter '%s' moves panel groups, and the experiment has no panel "
                             "motions (panels with motion groups: -layout or a multi-panel -expt)", w);
        }
        for (int g = 0; g < e->nmotions; ++g) {
            for (int c = 0; c < 6; ++c) {
                if ((comps & (1u << c)) && !push(l, NBG_P_MOTION(g, c))) {
                    return NBG_ENOMEM;
                }
            }
        }
        return NBG_OK;
    }
    if (strcmp(w, "domain_rot") == 0) {
        /* every domain's turn but domain 0's, which the orientation offsets already make */
        if (e->ndomain_rot < 2) {
            return nbgi_error(ctx, NBG_EINVAL, "parameter 'domain_rot' turns the mosaic domains 1 and up, and the "
                              "experiment has %d domain(s) with turns of their own", e->ndomain_rot);
        }
        for (int m = 1; m < e->ndomain_rot; ++m) {
            for (int c = 0; c < 3; ++c) {
                if (!push(l, NBG_P_DOMAIN(m, c))) {
                    return NBG_ENOMEM;
                }
            }
        }
        return NBG_OK;
    }
    if (strcmp(w, "F") == 0) {
        if (flags & NBG_PARSE_F_ALL) {
            return push(l, NBG_P_F_ALL) ? NBG_OK : NBG_ENOMEM;
        }
        const long nF = nbgi_param_nF(e);
        if (nF > NBG_P_F0 - 1 || nF > 2147483647L - NBG_P_F0) {
            return nbgi_error(ctx, NBG_EINVAL, "parameter 'F': the table's %ld entries are too many to list", nF);
        }
        for (long i = 0; i < nF; ++i) {
            if (!push(l, NBG_P_F(i))) {
                return NBG_ENOMEM;
            }
        }
        return NBG_OK;
    }
    if (strncmp(w, "F(", 2) == 0) {
        nbg_param q = 0;
        const int rc = parse_F_entry(ctx, e, w, &q);
        if (rc != NBG_OK) {
            return rc;
        }
        return push(l, q) ? NBG_OK : NBG_ENOMEM;
    }
    char known[1024];
    size_t len = 0;
    for (int q = 0; q < NBG_NPARAMS && len < sizeof known; ++q) {
        len += (size_t)snprintf(known + len, sizeof known - len, "%s%s", q ? " " : "", nbgi_param_rows[q].name);
    }
    return nbgi_error(ctx, NBG_EINVAL, "unknown parameter '%s' (known: %s; F, F(h,k,l); the groups %s; the panel "
                     "groups' motions panels panel_shift panel_rot panel_shift_x ... panel_rot_z g<k>.shift_x ...; "
                     "the mosaic domains' turns domain_rot d<m>.rot_x ...)",
                     w, known, group_names);
}

/* An id and where it came in the list, for removing repeats in order. */
typedef struct {
    nbg_param id;
    int pos;
} idpos;

static int cmp_idpos(const void *a, const void *b)
{
    const idpos *x = a, *y = b;
    if (x->id != y->id) {
        return (x->id > y->id) - (x->id < y->id);
    }
    return (x->pos > y->pos) - (x->pos < y->pos);
}

/* Removes repeated ids, keeping each one's first place. */
static int dedupe(idlist *l)
{
    if (l->n < 2) {
        return 1;
    }
    idpos *s = malloc(sizeof *s * (size_t)l->n);
    unsigned char *drop = calloc((size_t)l->n, 1);
    if (s == NULL || drop == NULL) {
        free(s);
        free(drop);
        return 0;
    }
    for (int j = 0; j < l->n; ++j) {
        s[j].id = l->v[j];
        s[j].pos = j;
    }
    qsort(s, (size_t)l->n, sizeof *s, cmp_idpos);
    for (int j = 1; j < l->n; ++j) {
        if (s[j].id == s[j - 1].id) {
            drop[s[j].pos] = 1;
        }
    }
    int m = 0;
    for (int j = 0; j < l->n; ++j) {
        if (!drop[j]) {
            l->v[m++] = l->v[j];
        }
    }
    l->n = m;
    free(s);
    free(drop);
    return 1;
}

int nbg_params_parse(nbg_ctx *ctx, const nbg_experiment *e, const char *list, int flags, nbg_param **ids, int *nids)
{
    if (ids != NULL) {
        *ids = NULL;
    }
    if (nids != NULL) {
        *nids = 0;
    }
    if (ctx == NULL || e == NULL || list == NULL || ids == NULL || nids == NULL) {
        return nbgi_error(ctx, NBG_EINVAL, "nbg_params_parse: NULL argument");
    }
    nbgi_plan pl;
    int have_plan = 0, rc = NBG_OK;
    idlist l = {NULL, 0, 0};
    char word[256];
    for (const char *s = list;;) {
        while (*s == ' ' || *s == '\t') {
            ++s;
        }
        const char *t = s;
        int depth = 0; /* commas inside F(h,k,l) do not split */
        while (*t != '\0' && !(*t == ',' && depth == 0)) {
            depth += *t == '(' ? 1 : *t == ')' ? -1 : 0;
            ++t;
        }
        size_t n = (size_t)(t - s);
        while (n > 0 && (s[n - 1] == ' ' || s[n - 1] == '\t')) {
            --n;
        }
        if (n == 0 || n >= sizeof word) {
            rc = nbgi_error(ctx, NBG_EINVAL, n == 0 ? "an empty parameter name in the list '%.200s'"
                                                    : "a parameter name too long in the list '%.200s'", list);
            break;
        }
        memcpy(word, s, n);
        word[n] = '\0';
        if (strcmp(word, "all") == 0 && !have_plan) {
            if ((rc = nbgi_plan_build(ctx, e, &pl)) != NBG_OK) {
                break;
            }
            have_plan = 1;
        }
        if ((rc = parse_word(ctx, e, word, flags, have_plan ? &pl : NULL, &l)) != NBG_OK) {
            if (rc == NBG_ENOMEM) {
                rc = nbgi_error(ctx, NBG_ENOMEM, "out of memory for the parameter list");
            }
            break;
        }
        if (*t == '\0') {
            break;
        }
        s = t + 1;
    }
    if (have_plan) {
        nbgi_plan_free(&pl);
    }
    if (rc == NBG_OK && !dedupe(&l)) {
        rc = nbgi_error(ctx, NBG_ENOMEM, "out of memory for the parameter list");
    }
    if (rc != NBG_OK) {
        free(l.v);
        return rc;
    }
    *ids = l.v;
    *nids = l.n;
    return NBG_OK;
}
