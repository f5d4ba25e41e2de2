/*
 * test-symmetry.c -- space groups to crystal systems and the cell parameters they leave free
 * (nbg_cell_constraints_get): Hermann-Mauguin symbols with and without spaces, Hall symbols as DIALS writes them,
 * numbers, settings; bad symbols refused by name.
 */
#include "testutil.h" /* first: it sets _GNU_SOURCE */
#include "nbgrad.h"

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
    nbg_ctx_destroy(ctx);
    return nbgi_test_summary();
}
