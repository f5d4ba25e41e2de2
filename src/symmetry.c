/*
 * symmetry.c -- what a space group says about the unit cell: its crystal system (from a Hall symbol, a
 * Hermann-Mauguin symbol or the number), and the cell parameters that system leaves free.  A refinement of the cell
 * fits those alone (nbg_refine): triclinic 6, monoclinic 4, orthorhombic 3, tetragonal, trigonal and hexagonal 2,
 * cubic 1; the others are tied to them (b = a) or fixed (alpha = 90).  These are the free elements of the metric
 * tensor G = B^T B that DIALS's constrained cell parameterisation refines, written as the cell parameters
 * themselves: the same constrained set, in the units a crystallographer reads.
 *
 * Only the lattice's symmetry matters here, so a symbol is read for the orders of its rotations and their places:
 * a 6 anywhere is hexagonal; a 3 after the first place is cubic (P 2 3, F m -3 m, Hall's P 2 2 3), first is
 * trigonal (on rhombohedral axes for an R symbol with ":R", or Hall's 3*); a 4 tetragonal; two or more 2-folds or
 * mirrors orthorhombic, one monoclinic (its axis: the place in a full symbol P 1 21 1, Hall's x/y/z, b for a short
 * symbol); none triclinic.
 */
#include "internal.h"

#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *const system_names[] = {"triclinic",  "monoclinic", "orthorhombic", "tetragonal",
                                           "trigonal",   "hexagonal",  "cubic"};

const char *nbg_crystal_system_name(nbg_crystal_system s)
{
    return s >= NBG_SYSTEM_TRICLINIC && s <= NBG_SYSTEM_CUBIC ? system_names[s] : "unknown";
}

/* The components of a symbol after its lattice letter: their rotation orders (1, 2, 3, 4, 6; a mirror or glide
 * counts as 2), the axis letter of each (Hall: x, y, z or 0) and whether one is Hall's body diagonal (3*).
 * Returns the count, or -1 when the text is not a symbol. */
enum { MAXCOMP = 8 };
typedef struct {
    int order[MAXCOMP];
    char axis[MAXCOMP];
    int star;
    int n;
} components;

static int comp_add(components *cp, int order, char axis)
{
    if (cp->n >= MAXCOMP) {
        return 0;
    }
    cp->order[cp->n] = order;
    cp->axis[cp->n] = axis;
    cp->n++;
    return 1;
}

/* The order of a rotation written as the digit ch (1, 2, 3, 4, 6), else 0. */
static int rotation_order(char ch)
{
    return ch == '1' || ch == '2' || ch == '3' || ch == '4' || ch == '6' ? ch - '0' : 0;
}

static int is_glide(char ch)
{
    return ch != 0 && strchr("mabcnde", ch) != NULL;
}

/* One token of a symbol written with spaces ("41", "2/m", "-3", "m"; Hall's "4nw", "2abw", "3*", "2x"). */
static int token(const char *t, int hall, components *cp)
{
    if (*t == '-') {
        ++t;
    }
    if (isdigit((unsigned char)*t)) {
        const int d = rotation_order(*t);
        if (d == 0) {
            return 0;
        }
        char axis = 0;
        for (const char *q = t + 1; *q; ++q) {
            if (hall) {
                if (*q == 'x' || *q == 'y' || *q == 'z') {
                    axis = *q;
                } else if (*q == '*') {
                    cp->star = 1;
                } else if (strchr("abcnuvwd'\"123456", *q) == NULL) {
                    return 0;
                }
            } else if (!(isdigit((unsigned char)*q) || *q == '/' || *q == '_' || is_glide(*q))) {
                return 0;
            }
        }
        return comp_add(cp, d, axis);
    }
    if (!hall && is_glide(*t) && t[1] == 0) {
        return comp_add(cp, 2, 0);
    }
    return 0;
}

/* A Hermann-Mauguin symbol written without spaces ("P43212", "P2_12_12_1", "Fm-3m", "P21/c"): a digit followed by a
 * smaller one is a screw axis (41, 21), "/x" belongs to the axis before it. */
static int compact(const char *t, components *cp)
{
    while (*t) {
        if (*t == '_') {
            ++t;
            continue;
        }
        if (*t == '-') {
            ++t;
        }
        if (isdigit((unsigned char)*t)) {
            const int d = rotation_order(*t);
            if (d == 0) {
                return 0;
            }
            ++t;
            if (*t == '_') {
                ++t;
            }
            if (isdigit((unsigned char)*t) && *t - '0' >= 1 && *t - '0' < d) {
                ++t; /* the screw's subscript */
            }
            if (*t == '/') {
                if (!is_glide(t[1])) {
                    return 0;
                }
                t += 2;
            }
            if (!comp_add(cp, d, 0)) {
                return 0;
            }
        } else if (is_glide(*t)) {
            ++t;
            if (!comp_add(cp, 2, 0)) {
                return 0;
            }
        } else {
            return 0;
        }
    }
    return 1;
}

static int from_number(long n, nbg_cell_constraints *c)
{
    c->unique_axis = -1;
    if (n <= 2) {
        c->system = NBG_SYSTEM_TRICLINIC;
    } else if (n <= 15) {
        c->system = NBG_SYSTEM_MONOCLINIC;
        c->unique_axis = 1; /* the standard setting's */
    } else if (n <= 74) {
        c->system = NBG_SYSTEM_ORTHORHOMBIC;
    } else if (n <= 142) {
        c->system = NBG_SYSTEM_TETRAGONAL;
    } else if (n <= 167) {
        c->system = NBG_SYSTEM_TRIGONAL; /* the R groups on hexagonal axes, the standard setting */
    } else if (n <= 194) {
        c->system = NBG_SYSTEM_HEXAGONAL;
    } else {
        c->system = NBG_SYSTEM_CUBIC;
    }
    return 1;
}

static int classify(const char *sg, nbg_cell_constraints *c)
{
    char buf[64];
    /* a Hall symbol: DIALS's begin with a space (or with '-', centric), or "Hall:" says so */
    int hall = sg[0] == ' ' || sg[0] == '-';
    while (isspace((unsigned char)*sg)) {
        ++sg;
    }
    if (strncmp(sg, "Hall:", 5) == 0) {
        hall = 1;
        sg += 5;
    }
    if (strlen(sg) >= sizeof buf) {
        return 0;
    }
    strcpy(buf, sg);
    size_t len = strlen(buf);
    while (len > 0 && isspace((unsigned char)buf[len - 1])) {
        buf[--len] = 0;
    }
    if (len == 0) {
        c->system = NBG_SYSTEM_TRICLINIC;
        c->unique_axis = -1;
        return 1;
    }
    char *end;
    const long num = strtol(buf, &end, 10);
    if (*end == 0 && isdigit((unsigned char)buf[0])) {
        return num >= 1 && num <= 230 && from_number(num, c);
    }
    /* a setting suffix (":R" rhombohedral axes, ":H", an origin choice ":1"), a change of basis "(...)" */
    int rhomb_axes = 0;
    char *colon = strchr(buf, ':');
    if (colon != NULL) {
        rhomb_axes = colon[1] == 'R' || colon[1] == 'r';
        *colon = 0;
    }
    char *paren = strchr(buf, '(');
    if (paren != NULL) {
        *paren = 0;
    }
    char *t = buf;
    while (isspace((unsigned char)*t)) {
        ++t;
    }
    if (*t == '-' && hall) {
        ++t;
    }
    if (*t == 0 || strchr("PABCIFRH", toupper((unsigned char)*t)) == NULL) {
        return 0;
    }
    const char lattice = (char)toupper((unsigned char)*t);
    ++t;
    components cp;
    memset(&cp, 0, sizeof cp);
    const int spaced = isspace((unsigned char)*t) != 0;
    if (spaced || hall) {
        for (char *tok = strtok(t, " \t"); tok != NULL; tok = strtok(NULL, " \t")) {
            if (!token(tok, hall, &cp)) {
                return 0;
            }
        }
    } else if (!compact(t, &cp)) {
        return 0;
    }
    if (cp.n == 0) {
        return 0;
    }
    int has6 = 0, has4 = 0, first3 = -1, n2 = 0, at2 = -1;
    for (int i = 0; i < cp.n; ++i) {
        has6 |= cp.order[i] == 6;
        has4 |= cp.order[i] == 4;
        if (cp.order[i] == 3 && first3 < 0) {
            first3 = i;
        }
        if (cp.order[i] == 2) {
            n2++;
            at2 = i;
        }
    }
    c->unique_axis = -1;
    if (has6) {
        c->system = NBG_SYSTEM_HEXAGONAL;
    } else if (first3 > 0) {
        c->system = NBG_SYSTEM_CUBIC;
    } else if (first3 == 0) {
        c->system = NBG_SYSTEM_TRIGONAL;
        c->rhombohedral = hall ? cp.star : (lattice == 'R' && rhomb_axes);
    } else if (has4) {
        c->system = NBG_SYSTEM_TETRAGONAL;
    } else if (n2 >= 2) {
        c->system = NBG_SYSTEM_ORTHORHOMBIC;
    } else if (n2 == 1) {
        c->system = NBG_SYSTEM_MONOCLINIC;
        if (hall) {
            const char ax = cp.axis[at2];
            c->unique_axis = ax == 'x' ? 0 : ax == 'y' ? 1 : 2; /* Hall's first rotation is about c by default */
        } else {
            c->unique_axis = cp.n == 3 ? at2 : 1; /* P 1 21 1: its place; P 21: b */
        }
    } else {
        c->system = NBG_SYSTEM_TRICLINIC;
    }
    return 1;
}

int nbg_cell_constraints_get(nbg_ctx *ctx, const char *space_group, nbg_cell_constraints *c)
{
    if (c == NULL) {
        return nbgi_error(ctx, NBG_EINVAL, "nbg_cell_constraints_get: NULL argument");
    }
    memset(c, 0, sizeof *c);
    const char *sg = space_group != NULL ? space_group : "";
    if (!classify(sg, c)) {
        return nbgi_error(ctx, NBG_EINVAL, "space group '%s': not a Hall symbol (as DIALS writes it, \" P 4nw 2abw\"), "
                          "a Hermann-Mauguin symbol (\"P 43 21 2\", \"P43212\", \"C 1 2/c 1\", \"R 3 :R\") or a number "
                          "1-230", sg);
    }
    /* the ties: each parameter's leader (itself when free), -1 and its value when fixed */
    int *tie = c->tie;
    double *fx = c->fixed;
    for (int i = 0; i < 6; ++i) {
        tie[i] = i;
        fx[i] = 0;
    }
    const char *rule = "a, b, c, alpha, beta, gamma free";
    switch (c->system) {
    case NBG_SYSTEM_TRICLINIC:
        break;
    case NBG_SYSTEM_MONOCLINIC: {
        static const char *const mono[3] = {"a, b, c, alpha free; beta = gamma = 90", "a, b, c, beta free; alpha = "
                                            "gamma = 90", "a, b, c, gamma free; alpha = beta = 90"};
        for (int i = 3; i < 6; ++i) {
            if (i - 3 != c->unique_axis) {
                tie[i] = -1, fx[i] = 90;
            }
        }
        rule = mono[c->unique_axis];
        break;
    }
    case NBG_SYSTEM_ORTHORHOMBIC:
        tie[3] = tie[4] = tie[5] = -1, fx[3] = fx[4] = fx[5] = 90;
        rule = "a, b, c free; alpha = beta = gamma = 90";
        break;
    case NBG_SYSTEM_TETRAGONAL:
        tie[1] = 0;
        tie[3] = tie[4] = tie[5] = -1, fx[3] = fx[4] = fx[5] = 90;
        rule = "a (= b), c free; alpha = beta = gamma = 90";
        break;
    case NBG_SYSTEM_TRIGONAL:
    case NBG_SYSTEM_HEXAGONAL:
        if (c->rhombohedral) {
            tie[1] = tie[2] = 0;
            tie[4] = tie[5] = 3;
            rule = "a (= b = c), alpha (= beta = gamma) free (rhombohedral axes)";
        } else {
            tie[1] = 0;
            tie[3] = tie[4] = tie[5] = -1, fx[3] = fx[4] = 90, fx[5] = 120;
            rule = "a (= b), c free; alpha = beta = 90, gamma = 120";
        }
        break;
    case NBG_SYSTEM_CUBIC:
        tie[1] = tie[2] = 0;
        tie[3] = tie[4] = tie[5] = -1, fx[3] = fx[4] = fx[5] = 90;
        rule = "a (= b = c) free; alpha = beta = gamma = 90";
        break;
    }
    c->nfree = 0;
    for (int i = 0; i < 6; ++i) {
        c->nfree += tie[i] == i;
    }
    char shown[40];
    snprintf(shown, sizeof shown, "%s", sg);
    char *s = shown;
    while (isspace((unsigned char)*s)) {
        ++s;
    }
    snprintf(c->description, sizeof c->description, "%s (%s): %s", nbg_crystal_system_name(c->system),
             *s ? s : "no space group given", rule);
    return NBG_OK;
}

/* ---- Hall symbols of Hermann-Mauguin symbols and numbers (the .expt writer's space_group_hall_symbol) ---- */

typedef struct {
    int number;
    const char *xhm, *short_name, *hall; /* "P 43 21 2", "P43212", " P 4nw 2abw" */
} nbgi_sg_setting;

#include "sgtable.h" /* nbgi_sg_table[NBGI_SG_TABLE_N], generated at build time from gemmi (src/sgtable-gen.cc) */

/* a and b equal ignoring spaces and letter case, b up to its end or (stop_colon) its ':' */
static int same_symbol(const char *a, const char *b, int stop_colon)
{
    for (;;) {
        while (*a == ' ') {
            ++a;
        }
        while (*b == ' ') {
            ++b;
        }
        const int bend = *b == 0 || (stop_colon && *b == ':');
        if (*a == 0 || bend) {
            return *a == 0 && bend;
        }
        if (tolower((unsigned char)*a) != tolower((unsigned char)*b)) {
            return 0;
        }
        ++a, ++b;
    }
}

int nbgi_space_group_table_size(void)
{
    return NBGI_SG_TABLE_N;
}

int nbgi_space_group_setting(int i, int *number, const char **xhm, const char **hall)
{
    if (i < 0 || i >= NBGI_SG_TABLE_N) {
        return 0;
    }
    *number = nbgi_sg_table[i].number;
    *xhm = nbgi_sg_table[i].xhm;
    *hall = nbgi_sg_table[i].hall;
    return 1;
}

int nbgi_space_group_hall(const char *sg, char *hall, size_t n, int *number)
{
    if (sg == NULL || n == 0) {
        return 0;
    }
    const int is_hall = sg[0] == ' ' || sg[0] == '-' || strncmp(sg, "Hall:", 5) == 0;
    const nbgi_sg_setting *hit = NULL;
    if (is_hall) {
        const char *h = strncmp(sg, "Hall:", 5) == 0 ? sg + 5 : sg;
        for (int i = 0; i < NBGI_SG_TABLE_N && hit == NULL; ++i) {
            hit = same_symbol(h, nbgi_sg_table[i].hall, 0) ? &nbgi_sg_table[i] : NULL;
        }
        if (hit == NULL) {
            /* a Hall symbol the table lacks (another origin or basis): kept as given, its number unknown */
            while (*h == ' ') {
                ++h;
            }
            if (*h == 0 || (size_t)snprintf(hall, n, " %s", h) >= n) {
                return 0;
            }
            if (number != NULL) {
                *number = 0;
            }
            return 1;
        }
    } else {
        char *end;
        const long num = strtol(sg, &end, 10);
        const int numeric = isdigit((unsigned char)sg[0]) && *end == 0;
        /* a number: its first setting (the reference one: R on hexagonal axes, origin choice 1); a symbol: its full
         * extended symbol, then without the setting suffix (the first setting again), then its short form */
        for (int pass = 0; pass < 3 && hit == NULL; ++pass) {
            for (int i = 0; i < NBGI_SG_TABLE_N && hit == NULL; ++i) {
                const nbgi_sg_setting *s = &nbgi_sg_table[i];
                const int match = numeric ? pass == 0 && s->number == num
                                          : same_symbol(sg, pass == 2 ? s->short_name : s->xhm, pass == 1);
                hit = match ? s : NULL;
            }
        }
    }
    if (hit == NULL || (size_t)snprintf(hall, n, "%s", hit->hall) >= n) {
        return 0;
    }
    if (number != NULL) {
        *number = hit->number;
    }
    return 1;
}
