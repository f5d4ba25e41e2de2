/*
 * test-symmetry.c -- space groups to crystal systems and the cell parameters they leave free
 * (nbg_cell_constraints_get): Hermann-Mauguin symbols with and without spaces, Hall symbols as DIALS writes them,
 * numbers, settings; bad symbols refused by name.  And the settings table generated from gemmi (nbgi_space_group_hall:
 * the Hall symbols the .expt writer gives DIALS): known symbols, and every setting's system as symmetry.c's own
 * reading of its Hall and Hermann-Mauguin symbols and of its number gives it.
 */
#include "testutil.h" /* first: it sets _GNU_SOURCE */
#include "nbgrad.h"
#include "internal.h"

#include <stdio.h>
#include <string.h>

typedef struct {
    const char *symbol;
    nbg_crystal_system system;
    int nfree;
    int unique;  /* monoclinic: the unique axis */
    int rhomb;
    const char *ties; /* the leaders of a b c alpha beta gamma, '-' fixed */
} sg_case;

int main(void)
{
    nbg_ctx *ctx;
    if (nbg_ctx_create(&ctx, NBG_BACKEND_CPU, NBG_DOUBLE, 0) != NBG_OK) {
        printf("FAIL symmetry-0 context\n");
        return 1;
    }
    const sg_case cases[] = {
        {"", NBG_SYSTEM_TRICLINIC, 6, -1, 0, "012345"},
        {"P 1", NBG_SYSTEM_TRICLINIC, 6, -1, 0, "012345"},
        {"P-1", NBG_SYSTEM_TRICLINIC, 6, -1, 0, "012345"},
        {"-P 1", NBG_SYSTEM_TRICLINIC, 6, -1, 0, "012345"},
        {"P21", NBG_SYSTEM_MONOCLINIC, 4, 1, 0, "012-4-"},
        {"C 1 2/c 1", NBG_SYSTEM_MONOCLINIC, 4, 1, 0, "012-4-"},
        {"P 1 1 21", NBG_SYSTEM_MONOCLINIC, 4, 2, 0, "012--5"},
        {" C 2y", NBG_SYSTEM_MONOCLINIC, 4, 1, 0, "012-4-"},
        {"-P 2ybc", NBG_SYSTEM_MONOCLINIC, 4, 1, 0, "012-4-"},
        {" P 2", NBG_SYSTEM_MONOCLINIC, 4, 2, 0, "012--5"},
        {"4", NBG_SYSTEM_MONOCLINIC, 4, 1, 0, "012-4-"},
        {"P212121", NBG_SYSTEM_ORTHORHOMBIC, 3, -1, 0, "012---"},
        {"P2_12_12_1", NBG_SYSTEM_ORTHORHOMBIC, 3, -1, 0, "012---"},
        {"C m c m", NBG_SYSTEM_ORTHORHOMBIC, 3, -1, 0, "012---"},
        {" P 2ac 2ab", NBG_SYSTEM_ORTHORHOMBIC, 3, -1, 0, "012---"},
        {"19", NBG_SYSTEM_ORTHORHOMBIC, 3, -1, 0, "012---"},
        {"P 43 21 2", NBG_SYSTEM_TETRAGONAL, 2, -1, 0, "002---"},
        {"P43212", NBG_SYSTEM_TETRAGONAL, 2, -1, 0, "002---"},
        {"P4/mmm", NBG_SYSTEM_TETRAGONAL, 2, -1, 0, "002---"},
        {"I41/amd", NBG_SYSTEM_TETRAGONAL, 2, -1, 0, "002---"},
        {" P 4nw 2abw", NBG_SYSTEM_TETRAGONAL, 2, -1, 0, "002---"},
        {"96", NBG_SYSTEM_TETRAGONAL, 2, -1, 0, "002---"},
        {"P3121", NBG_SYSTEM_TRIGONAL, 2, -1, 0, "002---"},
        {"P 31 1 2", NBG_SYSTEM_TRIGONAL, 2, -1, 0, "002---"},
        {"R3", NBG_SYSTEM_TRIGONAL, 2, -1, 0, "002---"},
        {"H 3 2", NBG_SYSTEM_TRIGONAL, 2, -1, 0, "002---"},
        {" R 3", NBG_SYSTEM_TRIGONAL, 2, -1, 0, "002---"},
        {"R 3 :R", NBG_SYSTEM_TRIGONAL, 2, -1, 1, "000333"},
        {"R32:R", NBG_SYSTEM_TRIGONAL, 2, -1, 1, "000333"},
        {" P 3*", NBG_SYSTEM_TRIGONAL, 2, -1, 1, "000333"},
        {"P6122", NBG_SYSTEM_HEXAGONAL, 2, -1, 0, "002---"},
        {"P 63/m m c", NBG_SYSTEM_HEXAGONAL, 2, -1, 0, "002---"},
        {" P 6c", NBG_SYSTEM_HEXAGONAL, 2, -1, 0, "002---"},
        {"Fm-3m", NBG_SYSTEM_CUBIC, 1, -1, 0, "000---"},
        {"I4132", NBG_SYSTEM_CUBIC, 1, -1, 0, "000---"},
        {"P4332", NBG_SYSTEM_CUBIC, 1, -1, 0, "000---"},
        {"Ia-3d", NBG_SYSTEM_CUBIC, 1, -1, 0, "000---"},
        {"P 2 3", NBG_SYSTEM_CUBIC, 1, -1, 0, "000---"},
        {" P 2 2 3", NBG_SYSTEM_CUBIC, 1, -1, 0, "000---"},
        {" F 4d 2 3 -1d", NBG_SYSTEM_CUBIC, 1, -1, 0, "000---"},
        {"230", NBG_SYSTEM_CUBIC, 1, -1, 0, "000---"},
    };
    const int n = (int)(sizeof cases / sizeof cases[0]);
    for (int i = 0; i < n; ++i) {
        const sg_case *k = &cases[i];
        nbg_cell_constraints c;
        const int rc = nbg_cell_constraints_get(ctx, k->symbol, &c);
        char ties[7];
        for (int j = 0; j < 6; ++j) {
            ties[j] = rc == NBG_OK ? (c.tie[j] < 0 ? '-' : (char)('0' + c.tie[j])) : '?';
        }
        ties[6] = 0;
        int fixed_ok = 1;
        for (int j = 3; rc == NBG_OK && j < 6; ++j) {
            if (c.tie[j] < 0) {
                const double want = c.system >= NBG_SYSTEM_TRIGONAL && c.system <= NBG_SYSTEM_HEXAGONAL && j == 5 ? 120 : 90;
                fixed_ok &= c.fixed[j] == want;
            }
        }
        char id[64];
        snprintf(id, sizeof id, "symmetry-1-%d", i);
        nbgi_test_check(rc == NBG_OK && c.system == k->system && c.nfree == k->nfree && strcmp(ties, k->ties) == 0 &&
                            (k->system != NBG_SYSTEM_MONOCLINIC || c.unique_axis == k->unique) &&
                            c.rhombohedral == k->rhomb && fixed_ok,
                        id, "'%s': %s, %d free, ties %s (want %s, %d free, ties %s)", k->symbol,
                        rc == NBG_OK ? c.description : nbg_errmsg(ctx), rc == NBG_OK ? c.nfree : -1, ties,
                        nbg_crystal_system_name(k->system), k->nfree, k->ties);
    }
    const char *bad[] = {"231", "0", "Q 2", "P 5", "P4x", "hello", "P 2 2 2 2 2 2 2 2 2", "-"};
    for (int i = 0; i < (int)(sizeof bad / sizeof bad[0]); ++i) {
        nbg_cell_constraints c;
        const int rc = nbg_cell_constraints_get(ctx, bad[i], &c);
        char id[64];
        snprintf(id, sizeof id, "symmetry-2-bad-%d", i);
        nbgi_test_check(rc == NBG_EINVAL && strstr(nbg_errmsg(ctx), bad[i]) != NULL, id, "'%s' refused: %s", bad[i],
                        nbg_errmsg(ctx));
    }
    /* the settings table (generated from gemmi at build time) */
    if (nbgi_space_group_table_size() == 0) {
        nbgi_test_skip("symmetry-3-table", "this build has no space-group table (gemmi's headers were missing)");
    } else {
        const struct {
            const char *in, *hall;
            int number;
        } known[] = {{"P43212", " P 4nw 2abw", 96}, {"P 43 21 2", " P 4nw 2abw", 96}, {"96", " P 4nw 2abw", 96},
                     {"P 21 21 21", " P 2ac 2ab", 19}, {"P21", " P 2yb", 4},           {"C2", " C 2y", 5},
                     {"C 1 2/c 1", " -C 2yc", 15},         {"R 3", " R 3", 146},          {"R 3 :R", " P 3*", 146},
                     {"H 3", " R 3", 146},                 {"I41/a", " I 4bw -1bw", 88},  {"p 6", " P 6", 168},
                     {"Fd-3m", " F 4d 2 3 -1d", 227},      {"1", " P 1", 1},              {"P -1", " -P 1", 2},
                     {" P 4nw 2abw", " P 4nw 2abw", 96},   {"Hall: P 2y", " P 2y", 3}};
        for (int i = 0; i < (int)(sizeof known / sizeof known[0]); ++i) {
            char hall[32] = "", id[64];
            int num = -1;
            const int ok = nbgi_space_group_hall(known[i].in, hall, sizeof hall, &num);
            snprintf(id, sizeof id, "symmetry-3-hall-%d", i);
            nbgi_test_check(ok && strcmp(hall, known[i].hall) == 0 && num == known[i].number, id,
                            "'%s' -> '%s' number %d (want '%s', %d)", known[i].in, hall, num, known[i].hall,
                            known[i].number);
        }
        /* the experiment's space group as the geometry (the .expt writer's model) carries it: a Hall symbol */
        const char *as_given[] = {"P 43 21 2", "96", "Hall: P 2y", " P 4nw 2abw"};
        const char *want_hall[] = {" P 4nw 2abw", " P 4nw 2abw", " P 2y", " P 4nw 2abw"};
        for (int i = 0; i < 4; ++i) {
            nbg_experiment e;
            nbg_experiment_default(&e);
            e.has_cell = 1;
            const double cell[6] = {60, 60, 90, 90, 90, 90};
            memcpy(e.cell, cell, sizeof cell);
            e.default_F = 100;
            e.fpixels = e.spixels = 16;
            snprintf(e.space_group, sizeof e.space_group, "%s", as_given[i]);
            nbg_report r;
            nbg_geometry g;
            const int rc = nbg_describe(ctx, &e, &r) == NBG_OK ? nbg_geometry_from_report(ctx, &e, &r, 1, &g) : -1;
            char id[64];
            snprintf(id, sizeof id, "symmetry-3-geometry-%d", i);
            nbgi_test_check(rc == NBG_OK && strcmp(g.space_group, want_hall[i]) == 0, id,
                            "-space_group '%s': the written list's Hall symbol '%s' (want '%s')", as_given[i],
                            rc == NBG_OK ? g.space_group : nbg_errmsg(ctx), want_hall[i]);
        }
        const char *none[] = {"P 4 4 4", "P 5", "Q 2", "231", ""};
        int refused = 0;
        for (int i = 0; i < (int)(sizeof none / sizeof none[0]); ++i) {
            char hall[32];
            refused += !nbgi_space_group_hall(none[i], hall, sizeof hall, NULL);
        }
        nbgi_test_check(refused == (int)(sizeof none / sizeof none[0]), "symmetry-3-unknown",
                        "%d of %d symbols no group has are not looked up to one", refused,
                        (int)(sizeof none / sizeof none[0]));
        /* every setting: symmetry.c's reading of its Hall symbol, its Hermann-Mauguin symbol and its number give one
         * crystal system, the one its number says (the R groups' rhombohedral settings: trigonal either way).  Two
         * of gemmi's extended symbols name a non-standard basis in a notation of their own ("P 21212(a)",
         * "C 2 2 21a)"): for those the Hall symbol and the number are compared */
        int nset = 0, agree = 0, numbers_seen[231] = {0};
        char first_bad[160] = "";
        int number;
        const char *xhm, *hall;
        for (int i = 0; nbgi_space_group_setting(i, &number, &xhm, &hall); ++i, ++nset) {
            nbg_cell_constraints ch, cx, cn;
            char num[8];
            snprintf(num, sizeof num, "%d", number);
            const int own_notation = strpbrk(xhm, "()") != NULL;
            const int ok = nbg_cell_constraints_get(ctx, hall, &ch) == NBG_OK &&
                           nbg_cell_constraints_get(ctx, own_notation ? hall : xhm, &cx) == NBG_OK &&
                           nbg_cell_constraints_get(ctx, num, &cn) == NBG_OK && ch.system == cn.system &&
                           cx.system == cn.system && ch.nfree == cx.nfree;
            agree += ok;
            if (number >= 1 && number <= 230) {
                numbers_seen[number] = 1;
            }
            if (!ok && first_bad[0] == 0) {
                snprintf(first_bad, sizeof first_bad, "; first disagreement: %d '%s' '%s' (%s / %s)", number, xhm,
                         hall, nbg_crystal_system_name(ch.system), nbg_crystal_system_name(cx.system));
            }
        }
        int all_numbers = 1;
        for (int k = 1; k <= 230; ++k) {
            all_numbers &= numbers_seen[k];
        }
        nbgi_test_check(nset == nbgi_space_group_table_size() && nset >= 530 && all_numbers && agree == nset,
                        "symmetry-3-table", "%d settings of all 230 groups: the system read from the Hall symbol, the "
                        "Hermann-Mauguin symbol and the number agree for %d%s", nset, agree, first_bad);
    }
    nbg_ctx_destroy(ctx);
    return nbgi_test_summary();
}
