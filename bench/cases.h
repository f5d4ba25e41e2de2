/*
 * cases.h -- the benchmark experiments, shared by bench-forward, bench-grad and bench-cuda (and, as command lines,
 * by bench/run.sh: keep the two in step).
 *
 *   cubicN   -cell 100 100 100 90 90 90 -default_F 100 -lambda 6.2 -N 5 -distance 100 -detpixels N
 *   tricN    -cell 70 80 90 85 95 105 -misset 10 5 3 -N 8 -lambda 1.5 -default_F 100 -distance 100 -detpixels N
 *   heavyN   cubicN + -oversample 2 -mosaic 0.5 -mosaic_dom 10 -phi 0.01 -osc 0.5 -phisteps 5 -hdivrange 0.1
 *            -vdivrange 0.1 -hdivsteps 3 -vdivsteps 3 -dispersion 0.1 -dispsteps 3  (3000 samples per pixel)
 *
 * N is 256, 512, 1k (1024), 2048 or 4k (4096).
 */
#ifndef NBG_BENCH_CASES_H
#define NBG_BENCH_CASES_H

#include "nbgrad.h"

#include <string.h>

/* Fills e for the named case; 0 when the name is not one. */
static inline int nbgi_bench_case(const char *name, nbg_experiment *e)
{
    static const char *const sizes[] = {"256", "512", "1k", "2048", "4k"};
    static const int npix[] = {256, 512, 1024, 2048, 4096};
    int n = 0, kind = -1;
    static const char *const kinds[] = {"cubic", "tric", "heavy"};
    for (int k = 0; k < 3; ++k) {
        const size_t len = strlen(kinds[k]);
        if (strncmp(name, kinds[k], len) == 0) {
            for (int s = 0; s < 5; ++s) {
                if (strcmp(name + len, sizes[s]) == 0) {
                    kind = k;
                    n = npix[s];
                }
            }
        }
    }
    if (kind < 0) {
        return 0;
    }
    nbg_experiment_default(e);
    e->has_cell = 1;
    e->fpixels = e->spixels = n;
    e->default_F = 100;
    e->distance = 100;
    if (kind == 1) {
        const double c[6] = {70, 80, 90, 85, 95, 105};
        memcpy(e->cell, c, sizeof c);
        e->misset[0] = 10, e->misset[1] = 5, e->misset[2] = 3;
        e->Na = e->Nb = e->Nc = 8;
        e->lambda = 1.5;
        return 1;
    }
    const double c[6] = {100, 100, 100, 90, 90, 90};
    memcpy(e->cell, c, sizeof c);
    e->lambda = 6.2;
    e->Na = e->Nb = e->Nc = 5;
    if (kind == 2) {
        e->oversample = 2;
        e->mosaic = 0.5;
        e->mosaic_domains = 10;
        e->phi0 = 0.01;
        e->osc = 0.5;
        e->phisteps = 5;
        e->hdivrange = e->vdivrange = 0.1;
        e->hdivsteps = e->vdivsteps = 3;
        e->dispersion = 0.1;
        e->dispsteps = 3;
    }
    return 1;
}

#endif
