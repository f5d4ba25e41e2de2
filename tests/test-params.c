/*
 * test-params.c -- the parameter table (include/nbgrad_params.def) walked row by row through the public API.
 *
 * Checks (prefix params-):
 *   rows                 the .def's rows, counted by this program's own expansion of it, are NBG_NPARAMS, and
 *                        every row's name is nbg_param_name of its id (a row the library's tables lack is caught)
 *   <name>-info          nbg_param_info_get: its id, a non-empty name unique in the table, nbg_param_name the same,
 *                        a help line, a unit (empty only for scale and polar), groups (non-empty, each a word of
 *                        nbg_param_groups), an alias (if any) no other parameter's name or alias
 *   <name>-lookup        nbg_param_from_name of the name and of the alias is the id; nbg_params_parse of the name
 *                        is the id alone
 *   <name>-nan           NAN written into the row's field of a valid experiment: nbg_describe refuses it with
 *                        NBG_EINVAL and a message naming it ("<desc> (<flag>)", or the name without a flag), or
 *                        accepts it when the row is optional; nbg_param_set refuses NAN
 *   <name>-below/-above  a value just outside the domain's finite ends: NBG_EINVAL naming the parameter
 *   <name>-bounds        nbg_param_in_bounds of the valid experiment's value; of a value outside a finite bound not
 *   <name>-gradcheck     the first of three small experiments (a still; a rotation with tilted spindle; a mosaic
 *                        rotation) where nbg_param_free says it is free: nbg_gradcheck of it alone passes; free in
 *                        none is a failure
 *   family-*             a panel motion's component, a mosaic domain's turn (its value, its list words) and a
 *                        structure factor have info; an id of no family is
 *                        NBG_EINVAL; the structure factor without a table (default_F) passes gradcheck
 */
#include "testutil.h" /* first: it sets _GNU_SOURCE */
#include "nbgrad.h"

#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The table as the .def declares it: this program's own expansion (the library's columns after field unused). */
typedef struct {
    int id;
    const char *name, *alias, *flag, *desc;
    size_t field;
} row;

#define NBG_PARAM(ID, name, alias, unit, flag, desc, groups, field, ...)                                           \
    {NBG_P_##ID, name, alias, flag, desc, offsetof(nbg_experiment, field)},
static const row rows[] = {
#include "nbgrad_params.def"
};
#undef NBG_PARAM

/* the rows counted: a row added to the .def without its id, or the other way round, fails here */
#define NBG_PARAM(ID, ...) +1
static const int NROWS = 0
#include "nbgrad_params.def"
    ;
#undef NBG_PARAM

static nbg_ctx *ctx;


/* The gradient-check experiments, in the order tried: a still; a rotation about a tilted spindle; a triclinic
 * mosaic crystal (4 domains) on a rotation. */
#define NCASES 4
static const char *const case_names[NCASES] = {"still", "rotation-tilted", "mosaic-rotation", "still-spectrum"};
static void gradcase(int k, nbg_experiment *e)
{
    nbgi_test_still(e);
    if (k == 1) {
        e->phi0 = 2, e->osc = 1, e->phisteps = 3;
        e->spindle_tilt[0] = 0.3, e->spindle_tilt[1] = -0.2;
    } else if (k == 2) {
        const double tri[6] = {70, 80, 90, 75, 85, 95};
        memcpy(e->cell, tri, sizeof tri);
        e->misset[0] = 10, e->misset[1] = 5, e->misset[2] = 3;
        e->mosaic = 0.5, e->mosaic_domains = 4;
        e->phi0 = 1, e->osc = 2, e->phisteps = 3;
    } else if (k == 3) {
        e->dispersion = 0.6, e->dispsteps = 3; /* a spectrum with a width: spectrum_scale is free */
    }
}

static double *field_of(nbg_experiment *e, const row *r)
{
    return (double *)((char *)e + r->field);
}

/* Whether the space-separated list words holds word. */
static int has_word(const char *words, const char *word, size_t len)
{
    for (const char *s = words; *s != '\0';) {
        while (*s == ' ') {
            ++s;
        }
        const size_t n = strcspn(s, " ");
        if (n == len && n > 0 && strncmp(s, word, n) == 0) {
            return 1;
        }
        s += n;
    }
    return 0;
}

/* The message validation gives the parameter: "<desc> (<flag>)", the name where it has no flag. */
static void expected_name(const row *r, char *buf, size_t size)
{
    snprintf(buf, size, "%s (%s)", r->desc, r->flag[0] != '\0' ? r->flag : r->name);
}

/* nbg_describe of e must fail with NBG_EINVAL naming row r. */
static void expect_refused(const char *id, const nbg_experiment *e, const row *r, double v)
{
    char want[160];
    expected_name(r, want, sizeof want);
    nbg_report rep;
    const int rc = nbg_describe(ctx, e, &rep);
    const char *msg = rc != NBG_OK ? nbg_errmsg(ctx) : "";
    nbgi_test_check(rc == NBG_EINVAL && strstr(msg, want) != NULL, id, "%s = %g: %s (rc %d; the message should name "
                   "\"%s\")", r->name, v, rc == NBG_OK ? "accepted" : msg, rc, want);
}

static void table_rows(void)
{
    int names_ok = 1;
    char bad[256] = "";
    for (int p = 0; p < NROWS; ++p) {
        if (rows[p].id != p || p >= (int)NBG_NPARAMS || strcmp(rows[p].name, nbg_param_name(p)) != 0) {
            names_ok = 0;
            snprintf(bad, sizeof bad, "; row %d (%s): id %d, library's name %s", p, rows[p].name, rows[p].id,
                     p < NBG_NPARAMS ? nbg_param_name(p) : "(no id)");
        }
    }
    nbgi_test_check(NROWS == (int)NBG_NPARAMS && names_ok, "params-rows",
                   "%d rows in nbgrad_params.def, NBG_NPARAMS %d; every row's name is the library's%s", NROWS,
                   (int)NBG_NPARAMS, bad);
}

static void info_and_lookup(int p, const nbg_experiment *valid)
{
    const row *r = &rows[p];
    char id[96];
    nbg_param_info in;
    const int rc = nbg_param_info_get(p, &in);
    snprintf(id, sizeof id, "params-%s-info", r->name);
    if (rc != NBG_OK) {
        nbgi_test_check(0, id, "nbg_param_info_get(%d) failed (rc %d)", p, rc);
        return;
    }
    int unique = 1, alias_unique = 1;
    for (int q = 0; q < NBG_NPARAMS; ++q) {
        nbg_param_info o;
        if (q == p || nbg_param_info_get(q, &o) != NBG_OK) {
            continue;
        }
        unique &= strcmp(o.name, in.name) != 0 && (o.alias == NULL || strcmp(o.alias, in.name) != 0);
        if (in.alias != NULL && in.alias[0] != '\0') {
            alias_unique &= strcmp(o.name, in.alias) != 0 && (o.alias == NULL || strcmp(o.alias, in.alias) != 0);
        }
    }
    /* every group word is one of nbg_param_groups() */
    const char *groups = nbg_param_groups();
    int groups_ok = in.groups != NULL && in.groups[0] != '\0' && groups != NULL;
    char badgroup[64] = "";
    for (const char *s = in.groups; groups_ok && *s != '\0';) {
        while (*s == ' ') {
            ++s;
        }
        const size_t n = strcspn(s, " ");
        if (n > 0 && !has_word(groups, s, n)) {
            groups_ok = 0;
            snprintf(badgroup, sizeof badgroup, " (\"%.*s\" is not a group)", (int)n, s);
        }
        s += n;
    }
    const int ok = in.id == p && in.name != NULL && in.name[0] != '\0' && strcmp(in.name, r->name) == 0 && unique &&
                   strcmp(nbg_param_name(p), in.name) == 0 && in.help != NULL && in.help[0] != '\0' &&
                   in.unit != NULL && (in.unit[0] != '\0' || p == NBG_P_SCALE || p == NBG_P_POLAR || p == NBG_P_SPECTRUM_SCALE) &&
                   in.alias != NULL && in.flag != NULL && groups_ok && alias_unique;
    nbgi_test_check(ok, id, "id %d name \"%s\"%s alias \"%s\"%s unit \"%s\" flag \"%s\" groups \"%s\"%s help \"%s\"",
                   in.id, in.name ? in.name : "(null)", unique ? "" : " (not unique)", in.alias ? in.alias : "(null)",
                   alias_unique ? "" : " (not unique)", in.unit ? in.unit : "(null)", in.flag ? in.flag : "(null)",
                   in.groups ? in.groups : "(null)", badgroup, in.help ? in.help : "(null)");

    snprintf(id, sizeof id, "params-%s-lookup", r->name);
    const int by_alias = in.alias != NULL && in.alias[0] != '\0' ? nbg_param_from_name(in.alias) : p;
    nbg_param *ids = NULL;
    int nids = -1;
    const int prc = nbg_params_parse(ctx, valid, r->name, 0, &ids, &nids);
    nbgi_test_check(nbg_param_from_name(r->name) == p && by_alias == p && prc == NBG_OK && nids == 1 && ids != NULL &&
                       ids[0] == p, id, "nbg_param_from_name(\"%s\") %d, of the alias \"%s\" %d, nbg_params_parse %s "
                   "(%d ids, the first %d)", r->name, nbg_param_from_name(r->name), in.alias ? in.alias : "", by_alias,
                   prc == NBG_OK ? "ok" : nbg_errmsg(ctx), nids, ids != NULL && nids > 0 ? ids[0] : -1);
    free(ids);
}

static void validation(int p, const nbg_experiment *valid)
{
    const row *r = &rows[p];
    char id[96];
    nbg_param_info in;
    if (nbg_param_info_get(p, &in) != NBG_OK) {
        return; /* reported by info */
    }
    nbg_experiment e = *valid;
    nbg_report rep;

    /* NAN: refused, or accepted where the row is optional; nbg_param_set refuses it either way */
    snprintf(id, sizeof id, "params-%s-nan", r->name);
    *field_of(&e, r) = NAN;
    if (in.optional) {
        const int rc = nbg_describe(ctx, &e, &rep);
        nbgi_test_check(rc == NBG_OK, id, "%s is optional: NAN (unset) is accepted (%s)", r->name,
                       rc == NBG_OK ? "ok" : nbg_errmsg(ctx));
    } else {
        expect_refused(id, &e, r, NAN);
    }
    e = *valid;
    snprintf(id, sizeof id, "params-%s-set-nan", r->name);
    double v0 = NAN;
    const int grc = nbg_param_get(&e, p, &v0);
    const int src = nbg_param_set(&e, p, NAN);
    double v1 = NAN;
    nbg_param_get(&e, p, &v1);
    nbgi_test_check(grc == NBG_OK && src == NBG_EINVAL && (v1 == v0 || (isnan(v0) && isnan(v1))), id,
                   "nbg_param_get %d; nbg_param_set(NAN) rc %d, the value left %g (was %g)", grc, src, v1, v0);

    /* just outside the domain's finite ends */
    if (isfinite(in.lo)) {
        e = *valid;
        const double v = in.lo_open ? in.lo : in.lo - 1;
        *field_of(&e, r) = v;
        snprintf(id, sizeof id, "params-%s-below", r->name);
        expect_refused(id, &e, r, v);
    }
    if (isfinite(in.hi)) {
        e = *valid;
        const double v = in.hi_open ? in.hi : in.hi + 1;
        *field_of(&e, r) = v;
        snprintf(id, sizeof id, "params-%s-above", r->name);
        expect_refused(id, &e, r, v);
    }

    /* bounds: the valid experiment's value is inside, a value beyond a finite bound is not */
    snprintf(id, sizeof id, "params-%s-bounds", r->name);
    int out_ok = 1;
    double lo_v = NAN, hi_v = NAN;
    if (isfinite(in.bound_lo)) {
        lo_v = in.bound_lo_open ? in.bound_lo : in.bound_lo - 1;
        out_ok &= !nbg_param_in_bounds(p, lo_v);
    }
    if (isfinite(in.bound_hi)) {
        hi_v = in.bound_hi_open ? in.bound_hi : in.bound_hi + 1;
        out_ok &= !nbg_param_in_bounds(p, hi_v);
    }
    /* an optional parameter left unset (NAN) is not a value: never in bounds */
    const int in_ok = grc == NBG_OK && (isfinite(v0) ? nbg_param_in_bounds(p, v0)
                                                     : in.optional && !nbg_param_in_bounds(p, v0));
    nbgi_test_check(in_ok && out_ok, id, "the valid value %g is %s; %g and %g (outside the bounds [%g, %g]) are %s",
                   v0, in_ok ? (isfinite(v0) ? "in bounds" : "unset, not in bounds") : "wrong", lo_v, hi_v,
                   in.bound_lo, in.bound_hi,
                   out_ok ? "not" : "(one of them) in bounds");
}

static void gradcheck_one(int p, const nbg_experiment *cases)
{
    const row *r = &rows[p];
    char id[96];
    snprintf(id, sizeof id, "params-%s-gradcheck", r->name);
    for (int k = 0; k < NCASES; ++k) {
        if (nbg_param_free(ctx, &cases[k], p, NULL, 0) != 1) {
            continue;
        }
        const nbg_param ids[1] = {p};
        nbg_gradcheck_result res;
        memset(&res, 0, sizeof res);
        const int rc = nbg_gradcheck(ctx, &cases[k], ids, 1, 1e-6, 1, &res);
        nbgi_test_check(rc == NBG_OK && res.param == p && res.status == NBG_CHECK_PASS, id,
                       "on the %s experiment: %s adjoint=%.12g numeric=%.12g relerr=%.2g order=%.2f%s%s",
                       case_names[k], rc != NBG_OK ? nbg_errmsg(ctx) : res.status == NBG_CHECK_PASS ? "PASS"
                       : res.status == NBG_CHECK_ZERO ? "ZERO" : "FAIL", res.adjoint, res.numeric, res.relerr,
                       res.order, res.reason[0] ? " # " : "", res.reason);
        return;
    }
    char why[256] = "";
    nbg_param_free(ctx, &cases[0], p, why, sizeof why);
    nbgi_test_check(0, id, "no gradcheck case: free in none of the %d experiments (%s)", NCASES, why);
}

static void families(const nbg_experiment *valid)
{
    nbg_param_info in;
    int rc = nbg_param_info_get(NBG_P_MOTION(0, 3), &in);
    char lab[64];
    nbg_param_label(NULL, NBG_P_MOTION(2, 3), lab, sizeof lab);
    nbgi_test_check(rc == NBG_OK && in.name != NULL && strcmp(in.name, "rot_x") == 0 &&
                       strcmp(nbg_param_name(NBG_P_MOTION(0, 3)), "rot_x") == 0 && strcmp(lab, "g2.rot_x") == 0 &&
                       nbg_param_from_name("g2.rot_x") == NBG_P_MOTION(2, 3),
                   "params-family-motion", "NBG_P_MOTION(0, 3): rc %d, name %s; NBG_P_MOTION(2, 3) labelled %s, "
                   "g2.rot_x is %d", rc, rc == NBG_OK && in.name ? in.name : "?", lab, nbg_param_from_name("g2.rot_x"));
    /* a mosaic domain's own turn: its info, label and name, its value in the experiment's array, the list words */
    rc = nbg_param_info_get(NBG_P_DOMAIN(0, 1), &in);
    nbg_param_label(NULL, NBG_P_DOMAIN(3, 2), lab, sizeof lab);
    nbgi_test_check(rc == NBG_OK && in.name != NULL && strcmp(in.name, "rot_y") == 0 && strcmp(in.unit, "deg") == 0 &&
                        strcmp(lab, "d3.rot_z") == 0 && nbg_param_from_name("d3.rot_z") == NBG_P_DOMAIN(3, 2) &&
                        nbg_param_from_name("d3.shift_x") == -1,
                    "params-family-domain", "NBG_P_DOMAIN(0, 1): rc %d, name %s; NBG_P_DOMAIN(3, 2) labelled %s, "
                    "d3.rot_z is %d", rc, rc == NBG_OK && in.name ? in.name : "?", lab,
                    nbg_param_from_name("d3.rot_z"));
    {
        nbg_experiment e = *valid;
        double turns[9] = {0, 0, 0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6}, v = 0;
        nbg_param *ids = NULL;
        int nids = 0;
        const int before = nbg_params_parse(ctx, &e, "d1.rot_x", 0, &ids, &nids); /* no turns yet */
        char msg[256];
        snprintf(msg, sizeof msg, "%s", nbg_errmsg(ctx));
        free(ids);
        ids = NULL;
        e.mosaic_domains = 3;
        e.domain_rot = turns;
        e.ndomain_rot = 3;
        const int got = nbg_param_get(&e, NBG_P_DOMAIN(2, 1), &v);
        const int set = nbg_param_set(&e, NBG_P_DOMAIN(1, 2), 0.35);
        const int prc = nbg_params_parse(ctx, &e, "domain_rot,d0.rot_x", 0, &ids, &nids);
        int order = prc == NBG_OK && nids == 7 && ids[6] == NBG_P_DOMAIN(0, 0);
        for (int k = 0; order && k < 6; ++k) {
            order = ids[k] == NBG_P_DOMAIN(1 + k / 3, k % 3);
        }
        free(ids);
        ids = NULL;
        const int far = nbg_params_parse(ctx, &e, "d3.rot_x", 0, &ids, &nids);
        free(ids);
        nbgi_test_check(before == NBG_EINVAL && strstr(msg, "d1.rot_x") != NULL && got == NBG_OK && v == 0.5 &&
                            set == NBG_OK && turns[5] == 0.35 && order && far == NBG_EINVAL &&
                            strstr(nbg_errmsg(ctx), "domain 3") != NULL,
                        "params-family-domain-list", "without turns: %s; d2.rot_y %g; domain_rot,d0.rot_x parsed in "
                        "order %d; d3.rot_x of three: %s", msg, v, order, nbg_errmsg(ctx));
    }
    rc = nbg_param_info_get(NBG_P_F(0), &in);
    nbg_param_label(valid, NBG_P_F(0), lab, sizeof lab);
    double f = 0;
    const int grc = nbg_param_get(valid, NBG_P_F(0), &f);
    nbgi_test_check(rc == NBG_OK && in.name != NULL && strcmp(in.name, "F") == 0 && strcmp(lab, "F") == 0 &&
                       grc == NBG_OK && f == valid->default_F,
                   "params-family-F", "NBG_P_F(0): rc %d, name %s, labelled %s without a table, value %g (default_F "
                   "%g)", rc, rc == NBG_OK && in.name ? in.name : "?", lab, f, valid->default_F);
    const nbg_param huge[3] = {NBG_NPARAMS, NBG_P_MOTION0 - 1, -1};
    int refused = 0;
    for (int k = 0; k < 3; ++k) {
        refused += nbg_param_info_get(huge[k], &in) == NBG_EINVAL;
    }
    nbgi_test_check(refused == 3 && strcmp(nbg_param_name(NBG_NPARAMS), "?") == 0 &&
                       nbg_param_from_name("no_such_parameter") == -1,
                   "params-family-none", "ids NBG_NPARAMS, NBG_P_MOTION0 - 1, -1: %d of 3 NBG_EINVAL; name of "
                   "NBG_NPARAMS \"%s\"", refused, nbg_param_name(NBG_NPARAMS));
    /* default_F (the structure factor without a table) through the gradient check */
    const nbg_param fp[1] = {NBG_P_F(0)};
    nbg_gradcheck_result res;
    memset(&res, 0, sizeof res);
    rc = nbg_gradcheck(ctx, valid, fp, 1, 1e-6, 1, &res);
    nbgi_test_check(rc == NBG_OK && res.param == NBG_P_F(0) && res.status == NBG_CHECK_PASS,
                   "params-family-F-gradcheck", "%s adjoint=%.12g numeric=%.12g relerr=%.2g%s%s",
                   rc != NBG_OK                         ? nbg_errmsg(ctx)
                   : res.status == NBG_CHECK_PASS ? "PASS"
                   : res.status == NBG_CHECK_ZERO ? "ZERO"
                                                  : "FAIL",
                   res.adjoint, res.numeric, res.relerr, res.reason[0] ? " # " : "", res.reason);
}

int main(void)
{
    if (nbg_ctx_create(&ctx, NBG_BACKEND_CPU, NBG_DOUBLE, 0) != NBG_OK) {
        printf("FAIL params-0 context\n");
        return 1;
    }
    table_rows();
    nbg_experiment valid;
    nbgi_test_still(&valid);
    nbg_report rep;
    const int vrc = nbg_describe(ctx, &valid, &rep);
    if (!nbgi_test_check(vrc == NBG_OK, "params-valid", "the starting experiment is valid (%s)",
                         vrc == NBG_OK ? "ok" : nbg_errmsg(ctx))) {
        nbg_ctx_destroy(ctx);
        return nbgi_test_summary();
    }
    nbg_experiment cases[NCASES];
    for (int k = 0; k < NCASES; ++k) {
        gradcase(k, &cases[k]);
    }
    const int n = NROWS < (int)NBG_NPARAMS ? NROWS : (int)NBG_NPARAMS;
    for (int p = 0; p < n; ++p) {
        info_and_lookup(p, &valid);
        validation(p, &valid);
        gradcheck_one(p, cases);
    }
    families(&valid);
    nbg_ctx_destroy(ctx);
    return nbgi_test_summary();
}
