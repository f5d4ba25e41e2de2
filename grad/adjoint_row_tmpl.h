/*
 * adjoint_row_tmpl.h -- the CPU adjoint's vectorised form: grad/adjoint_tmpl.h for NBG_ALANES neighbouring
 * pixels of a row at once.  The once-per-pixel prologue and epilogue are the lane forms of the scalar twin's
 * (nbgi_lane_pixel_factors, nbgi_lane_pixel_factors_adjoint in grad/adjoint.h, built from the same functions); the
 * main pass evaluates each sample across the lanes in `omp simd` loops and sums the lanes'
 * contributions to the plan-level gradients (crystal vectors, wavelengths, detector vectors, N) as reductions.
 * The forward values are the scalar kernel's (same arithmetic per pixel); the gradients equal the scalar
 * adjoint's up to the order of the sums.  Instantiated for double by grad/adjoint_cpu.c.
 */
#ifndef NBG_TMPL_OPEN
#error "adjoint_row_tmpl.h is a template: instantiate it through tmpl_on.h / tmpl_off.h (see src/tmpl_on.h)"
#endif
#ifndef NBG_TMPL_HAS_ADJOINT
#error "adjoint_row_tmpl.h needs adjoint_tmpl.h instantiated for the same type first"
#endif
#define NBG_TMPL_HAS_ADJOINT_ROW 1
#define NBG_ALANES 8

#include <string.h>

/* The other shapes' lattice factor and its partials across the lanes, for nbgi_row_adjoint (the square shape's is
 * nbgi_square_lanes_grad): nbgi_shape_lanes_grad's lane loops (src/row_tmpl.h), the gauss shape's partials in a*, b*,
 * c* added into acc.  Out of line, as nbgi_shape_lanes: in the row adjoint the round shape's loop moved the square
 * shape's register allocation (tric1k's gradient 3-4 % slower in paired runs, at the edge of this machine's noise). */
static __attribute__((noinline)) void NBG_SFX(nbgi_shape_lanes_adjoint)(const nbgi_kparams *p, NBG_R hkl[3][NBG_ALANES],
                                                                      NBG_R rnd[3][NBG_ALANES], const int *valid,
                                                                      const NBG_R *d_I, NBG_R *L,
                                                                      NBG_R dLh[3][NBG_ALANES],
                                                                      NBG_R dLdN[3][NBG_ALANES], nbgi_adjacc *acc)
{
    enum { W = NBG_ALANES };
    NBG_R gv[4][W];
    NBG_SFX(nbgi_shape_lanes_grad)(p, hkl, rnd, L, dLh, dLdN, gv); /* src/row_tmpl.h */
    if (p->shape != NBG_GAUSS) {
        return;
    }
    /* the gauss shape's partials in a*, b*, c* (g dv_i v_x) into acc, with each lane's structure factor, taken
     * whether the lane counts or not (in the branch below GCC called the call unlikely and left the table's
     * interpolation weights out of line) */
    NBG_R Fg[W];
    for (int j = 0; j < W; ++j) {
        long unused = 0;
        Fg[j] = NBG_SFX(nbgi_fcell)(p, hkl[0][j], hkl[1][j], hkl[2][j], (int)rnd[0][j], (int)rnd[1][j], (int)rnd[2][j],
                                    &unused);
    }
    for (int j = 0; j < W; ++j) {
        if (valid[j] && d_I[j] != 0 && (L[j] != 0 || p->water)) {
            const NBG_R dFl = d_I[j] * 2 * Fg[j] * Fg[j] * L[j];
            for (int i = 0; i < 3; ++i) {
                const NBG_R dv = hkl[i][j] - rnd[i][j];
                for (int x = 0; x < 3; ++x) {
                    acc->astar[3 * i + x] += (double)(dFl * (gv[0][j] * dv * gv[1 + x][j]));
                }
            }
        }
    }
}

static inline void NBG_SFX(nbgi_row_adjoint)(const nbgi_kparams *p, int spixel, int f0, int n, const float *gin,
                                           float *out, nbgi_adjacc *acc)
{
    enum { W = NBG_ALANES };
    const int os = p->oversample;
    const int nmat = p->nphi * p->nmos;
    const NBG_R scale = (NBG_R)p->scale;
    /* the plan's switches in locals: a load through p in the lane loops, which store through the accumulators,
     * stops GCC vectorising them ("no vectype") */
    const int water = p->water != 0, table = p->F != 0;
    int active[W];
    const int all = nbgi_all_active(p, spixel, f0, n); /* every lane inside the ROI, no mask: no test a lane */
    NBG_R g[W], d_I[W], dI2[W], I[W];
    nbgi_lane_pixfactors lf;
    _Static_assert(NBG_PF_LANES == NBG_ALANES, "the lane factors must have the row adjoint's width");

    /* --- prologue: the once-per-pixel factors and where they were taken (grad/adjoint.h) ------------------ */
    int any = 0;
    for (int j = 0; j < W; ++j) {
        active[j] = j < n && (all || nbgi_pixel_active(p, f0 + j, spixel));
        g[j] = active[j] ? (NBG_R)gin[j] : 0;
        any |= g[j] != 0;
    }
    nbgi_lane_pixel_factors(p, f0, spixel, active, &lf);
    for (int j = 0; j < W; ++j) {
        d_I[j] = g[j] * scale * (NBG_R)lf.capture[j] * (NBG_R)lf.polar[j] * (NBG_R)lf.omega[j];
        dI2[j] = 2 * d_I[j];
        I[j] = (NBG_R)p->I_bg;
    }

    /* --- main pass across the lanes ----------------------------------------------------------------------- */
    /* per-lane accumulators, summed over the lanes once a row (nbgi_row_adjoint_flush): a horizontal sum per
     * sample, or per 8 pixels, would cost more than the sample */
    double *NBG_RESTRICT lab = acc->lane_abc; /* nmat * 9 * W */
    double *NBG_RESTRICT llam = acc->lane_lam; /* nsources * W */
    double *NBG_RESTRICT fix = acc->lane_fix; /* NBG_ADJ_FIXED * W */
    /* with uniform factors the first subpixel's ray is the one the solid angle and the polarization were taken on:
     * the gradient the samples leave on its direction (fdd) joins theirs in the epilogue, one ray adjoint for both */
    const int merge = lf.uniform;
    NBG_R fdd0[W], fdd1[W], fdd2[W];
    NBG_R d0[W], d1[W], d2[W], Rl[W], Fd[W], q0[W], q1[W], q2[W], dd0[W], dd1[W], dd2[W], dq0[W], dq1[W], dq2[W];
    int valid[W];
    for (int j = 0; j < W; ++j) {
        fdd0[j] = fdd1[j] = fdd2[j] = 0;
    }
    for (int t = 0; t < p->thicksteps; ++t) {
        const NBG_R Odet = nbgi_layer_at(p, t);
        for (int subS = 0; subS < os; ++subS) {
            const NBG_R Sdet = nbgi_subpixel_at(p, spixel, subS);
            for (int subF = 0; subF < os; ++subF) {
                const int first = t == 0 && subS == 0 && subF == 0 && !p->curved;
                if (first) {
                    /* the prologue's first ray */
                    for (int j = 0; j < W; ++j) {
                        d0[j] = lf.d0[j];
                        d1[j] = lf.d1[j];
                        d2[j] = lf.d2[j];
                        Rl[j] = lf.R[j];
                        Fd[j] = lf.Fd[j];
                        dd0[j] = dd1[j] = dd2[j] = 0;
                    }
                } else {
                    nbgi_lane_rays(p, f0, subF, Sdet, Odet, W, d0, d1, d2, Rl, Fd);
                    for (int j = 0; j < W; ++j) {
                        dd0[j] = dd1[j] = dd2[j] = 0;
                    }
                }
                for (int src = 0; src < p->nsources; ++src) {
                    const double *sr = p->src + NBG_SRC_STRIDE * src;
                    const NBG_R ilambda = 1 / (NBG_R)sr[3];
                    nbgi_lane_q(p, src, W, d0, d1, d2, q0, q1, q2, valid);
                    for (int j = 0; j < W; ++j) {
                        valid[j] &= active[j]; /* both 0 or 1: bitwise, so that the loop vectorises */
                        dq0[j] = dq1[j] = dq2[j] = 0;
                    }
                    for (int m = 0; m < nmat; ++m) {
                        const double *abc = p->abc + 9 * m;
                        NBG_R v[9];
                        for (int x = 0; x < 9; ++x) {
                            v[x] = (NBG_R)abc[x];
                        }
                        /* the lattice factor's outputs aligned as it assumes (src/row_tmpl.h, NBG_LANE_AL) */
                        NBG_R hkl[3][W], rnd[3][W], L[W] __attribute__((aligned(64))), Fc[W], dFh[3][W];
                        /* the rounded indices serve the table lookup and the non-square shapes only */
                        NBG_SFX(nbgi_lane_hkl)(v, q0, q1, q2, p->F != 0 || p->shape != NBG_SQUARE, hkl, rnd);
                        /* lattice factor and its partials: the square shape across the lanes */
                        NBG_R dLdN[3][W] __attribute__((aligned(64))), dLh[3][W] __attribute__((aligned(64)));
                        if (p->shape == NBG_SQUARE) {
                            NBG_SFX(nbgi_square_lanes_grad)(p, hkl, L, dLh, dLdN); /* src/row_tmpl.h */
                        } else {
                            NBG_SFX(nbgi_shape_lanes_adjoint)(p, hkl, rnd, valid, d_I, L, dLh, dLdN, acc);
                        }
                        /* structure factor and its partials */
                        if (!table) {
                            const NBG_R F0 = (NBG_R)p->default_F;
                            for (int j = 0; j < W; ++j) {
                                Fc[j] = F0;
                            }
                        } else {
                            for (int j = 0; j < W; ++j) {
                                double unused = 0;
                                NBG_R d3[3];
                                Fc[j] = NBG_SFX(nbgi_fcell_grad)(p, hkl[0][j], hkl[1][j], hkl[2][j], (int)rnd[0][j],
                                                                (int)rnd[1][j], (int)rnd[2][j], d3, 0, 0, &unused);
                                dFh[0][j] = d3[0];
                                dFh[1][j] = d3[1];
                                dFh[2][j] = d3[2];
                            }
                        }
                        /* accumulate I and the sample's gradients per lane: with T = Fc^2 L^2 (the forward's
                         * product, in its order), dT/dFc = 2 Fc L^2 and dT/dL = 2 Fc^2 L; h = a . q: d_a += d_h q,
                         * d_q += d_h a.  Without a table dF/dh is 0: the loop without those terms */
                        double *NBG_RESTRICT la = lab + (size_t)m * 9 * W;
                        if (!table) {
#pragma omp simd
                            for (int j = 0; j < W; ++j) {
                                const int use = valid[j] & ((L[j] != 0) | water); /* no branch: AVX2 too */
                                const NBG_R FFL = Fc[j] * Fc[j] * L[j];
                                const NBG_R T = FFL * L[j];
                                I[j] += use ? T : 0;
                                const NBG_R dFc = use ? dI2[j] * Fc[j] * L[j] * L[j] : 0;
                                const NBG_R dFl = use ? dI2[j] * FFL : 0;
                                fix[NBGI_FIX_DEFF * W + j] += (double)dFc;
                                fix[(NBGI_FIX_N + 0) * W + j] += (double)(dFl * dLdN[0][j]);
                                fix[(NBGI_FIX_N + 1) * W + j] += (double)(dFl * dLdN[1][j]);
                                fix[(NBGI_FIX_N + 2) * W + j] += (double)(dFl * dLdN[2][j]);
                                const NBG_R dh = dFl * dLh[0][j], dk = dFl * dLh[1][j], dl = dFl * dLh[2][j];
                                la[0 * W + j] += (double)(dh * q0[j]);
                                la[1 * W + j] += (double)(dh * q1[j]);
                                la[2 * W + j] += (double)(dh * q2[j]);
                                la[3 * W + j] += (double)(dk * q0[j]);
                                la[4 * W + j] += (double)(dk * q1[j]);
                                la[5 * W + j] += (double)(dk * q2[j]);
                                la[6 * W + j] += (double)(dl * q0[j]);
                                la[7 * W + j] += (double)(dl * q1[j]);
                                la[8 * W + j] += (double)(dl * q2[j]);
                                dq0[j] += dh * v[0] + dk * v[3] + dl * v[6];
                                dq1[j] += dh * v[1] + dk * v[4] + dl * v[7];
                                dq2[j] += dh * v[2] + dk * v[5] + dl * v[8];
                            }
                        } else {
#pragma omp simd
                            for (int j = 0; j < W; ++j) {
                                const int use = valid[j] & ((L[j] != 0) | water); /* no branch: AVX2 too */
                                const NBG_R FFL = Fc[j] * Fc[j] * L[j];
                                const NBG_R T = FFL * L[j];
                                I[j] += use ? T : 0;
                                const NBG_R dFc = use ? dI2[j] * Fc[j] * L[j] * L[j] : 0;
                                const NBG_R dFl = use ? dI2[j] * FFL : 0;
                                fix[(NBGI_FIX_N + 0) * W + j] += (double)(dFl * dLdN[0][j]);
                                fix[(NBGI_FIX_N + 1) * W + j] += (double)(dFl * dLdN[1][j]);
                                fix[(NBGI_FIX_N + 2) * W + j] += (double)(dFl * dLdN[2][j]);
                                const NBG_R dh = dFl * dLh[0][j] + dFc * dFh[0][j];
                                const NBG_R dk = dFl * dLh[1][j] + dFc * dFh[1][j];
                                const NBG_R dl = dFl * dLh[2][j] + dFc * dFh[2][j];
                                la[0 * W + j] += (double)(dh * q0[j]);
                                la[1 * W + j] += (double)(dh * q1[j]);
                                la[2 * W + j] += (double)(dh * q2[j]);
                                la[3 * W + j] += (double)(dk * q0[j]);
                                la[4 * W + j] += (double)(dk * q1[j]);
                                la[5 * W + j] += (double)(dk * q2[j]);
                                la[6 * W + j] += (double)(dl * q0[j]);
                                la[7 * W + j] += (double)(dl * q1[j]);
                                la[8 * W + j] += (double)(dl * q2[j]);
                                dq0[j] += dh * v[0] + dk * v[3] + dl * v[6];
                                dq1[j] += dh * v[1] + dk * v[4] + dl * v[7];
                                dq2[j] += dh * v[2] + dk * v[5] + dl * v[8];
                            }
                            /* the table entries the samples read (or default_F outside it), when wanted */
                            for (int j = 0; j < W && acc->F != 0; ++j) {
                                if (valid[j] && (L[j] != 0 || p->water) && d_I[j] != 0) {
                                    NBG_R tmp[3];
                                    const NBG_R dFc = dI2[j] * Fc[j] * L[j] * L[j];
                                    NBG_SFX(nbgi_fcell_grad)(p, hkl[0][j], hkl[1][j], hkl[2][j], (int)rnd[0][j],
                                                            (int)rnd[1][j], (int)rnd[2][j], tmp, dFc, acc->F,
                                                            &acc->defF);
                                }
                            }
                        }
                    }
                    /* q = (d - i) / lambda: d_d += d_q / lambda, d_lambda -= d_q . q / lambda */
                    double *NBG_RESTRICT ll = llam + (size_t)src * W;
#pragma omp simd
                    for (int j = 0; j < W; ++j) {
                        dd0[j] += dq0[j] * ilambda;
                        dd1[j] += dq1[j] * ilambda;
                        dd2[j] += dq2[j] * ilambda;
                        ll[j] -= (double)((dq0[j] * q0[j] + dq1[j] * q1[j] + dq2[j] * q2[j]) * ilambda);
                    }
                }
                if (first && merge) {
                    for (int j = 0; j < W; ++j) {
                        fdd0[j] = dd0[j];
                        fdd1[j] = dd1[j];
                        fdd2[j] = dd2[j];
                    }
                    continue;
                }
                /* the ray: d_P = (d_d - d (d . d_d)) / R into pix0, f (times Fdet), s and o (times Sdet, Odet) */
#pragma omp simd
                for (int j = 0; j < W; ++j) {
                    const NBG_R dot = d0[j] * dd0[j] + d1[j] * dd1[j] + d2[j] * dd2[j];
                    const NBG_R iR = 1 / Rl[j];
                    const NBG_R e0 = (dd0[j] - d0[j] * dot) * iR;
                    const NBG_R e1 = (dd1[j] - d1[j] * dot) * iR;
                    const NBG_R e2 = (dd2[j] - d2[j] * dot) * iR;
                    fix[(NBGI_FIX_PIX0 + 0) * W + j] += (double)e0;
                    fix[(NBGI_FIX_PIX0 + 1) * W + j] += (double)e1;
                    fix[(NBGI_FIX_PIX0 + 2) * W + j] += (double)e2;
                    fix[(NBGI_FIX_F + 0) * W + j] += (double)(e0 * Fd[j]);
                    fix[(NBGI_FIX_F + 1) * W + j] += (double)(e1 * Fd[j]);
                    fix[(NBGI_FIX_F + 2) * W + j] += (double)(e2 * Fd[j]);
                    fix[(NBGI_FIX_S + 0) * W + j] += (double)(e0 * Sdet);
                    fix[(NBGI_FIX_S + 1) * W + j] += (double)(e1 * Sdet);
                    fix[(NBGI_FIX_S + 2) * W + j] += (double)(e2 * Sdet);
                    fix[(NBGI_FIX_O + 0) * W + j] += (double)(e0 * Odet);
                    fix[(NBGI_FIX_O + 1) * W + j] += (double)(e1 * Odet);
                    fix[(NBGI_FIX_O + 2) * W + j] += (double)(e2 * Odet);
                }
            }
        }
    }

    /* --- values and the epilogue (grad/adjoint.h) --------------------------------------------------------- */
    for (int j = 0; j < n; ++j) {
        double S = p->scale * (double)I[j];
        S *= lf.capture[j];
        S *= lf.polar[j];
        S *= lf.omega[j];
        out[j] = active[j] ? (float)S : 0.0f;
    }
    if (any) {
        nbgi_lane_pixel_factors_adjoint(p, &lf, g, I, d_I, fdd0, fdd1, fdd2, fix, acc);
    }
}

/* The sum of a lane accumulator's 8 lanes, zeroing them, in one fixed order (a loop's sum would be reordered by
 * the vectoriser in one of its versions and not in another). */
static inline double NBG_SFX(nbgi_lane_take)(double *v)
{
    _Static_assert(NBG_ALANES == 8, "nbgi_lane_take sums 8 lanes");
    const double s = ((v[0] + v[1]) + (v[2] + v[3])) + ((v[4] + v[5]) + (v[6] + v[7]));
    for (int j = 0; j < 8; ++j) {
        v[j] = 0;
    }
    return s;
}

/* Adds the lane accumulators of a row (or a run of a pixel list) into acc and zeroes them: once a row, after its
 * nbgi_row_adjoint calls (grad/adjoint_cpu.c). */
static inline void NBG_SFX(nbgi_row_adjoint_flush)(const nbgi_kparams *p, nbgi_adjacc *acc)
{
    enum { W = NBG_ALANES };
    double *fixed = (double *)acc;
    const size_t nabc = (size_t)p->nphi * p->nmos * 9;
    for (size_t c = 0; c < NBG_ADJ_FIXED; ++c) {
        fixed[c] += NBG_SFX(nbgi_lane_take)(acc->lane_fix + c * W);
    }
    for (size_t i = 0; i < nabc; ++i) {
        acc->abc[i] += NBG_SFX(nbgi_lane_take)(acc->lane_abc + i * W);
    }
    for (int src = 0; src < p->nsources; ++src) {
        acc->lam[src] += NBG_SFX(nbgi_lane_take)(acc->lane_lam + (size_t)src * W);
    }
}

#undef NBG_ALANES
