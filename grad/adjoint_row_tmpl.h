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

static inline void NBG_SFX(nbgi_row_adjoint)(const nbgi_kparams *p, int spixel, int f0, int n, const float *gin,
                                           float *out, nbgi_adjacc *acc)
{
    enum { W = NBG_ALANES };
    const int os = p->oversample;
    const int nmat = p->nphi * p->nmos;
    const NBG_R scale = (NBG_R)p->scale;
    const int water = p->water != 0;
    int active[W];
    NBG_R g[W], d_I[W], I[W];
    nbgi_lane_pixfactors lf;
    _Static_assert(NBG_PF_LANES == NBG_ALANES, "the lane factors must have the row adjoint's width");

    /* --- prologue: the once-per-pixel factors and where they were taken (grad/adjoint.h) ------------------ */
    int any = 0;
    for (int j = 0; j < W; ++j) {
        active[j] = j < n && nbgi_pixel_active(p, f0 + j, spixel);
        g[j] = active[j] ? (NBG_R)gin[j] : 0;
        any |= g[j] != 0;
    }
    nbgi_lane_pixel_factors(p, f0, spixel, active, &lf);
    for (int j = 0; j < W; ++j) {
        d_I[j] = g[j] * scale * (NBG_R)lf.capture[j] * (NBG_R)lf.polar[j] * (NBG_R)lf.omega[j];
        I[j] = (NBG_R)p->I_bg;
    }

    /* --- main pass across the lanes ----------------------------------------------------------------------- */
    /* per-lane accumulators, summed over the lanes once at the end of the chunk (a horizontal sum per sample
     * would cost more than the sample) */
    double *lab = acc->lane_abc; /* nmat * 9 * W */
    double *llam = acc->lane_lam; /* nsources * W */
    memset(lab, 0, sizeof(double) * (size_t)nmat * 9 * W);
    memset(llam, 0, sizeof(double) * (size_t)p->nsources * W);
    double lN[3][W], ldef[W], lray[12][W];
    memset(lN, 0, sizeof lN);
    memset(ldef, 0, sizeof ldef);
    memset(lray, 0, sizeof lray);
    NBG_R d0[W], d1[W], d2[W], Rl[W], Fd[W], q0[W], q1[W], q2[W], dd0[W], dd1[W], dd2[W], dq0[W], dq1[W], dq2[W];
    int valid[W];
    for (int t = 0; t < p->thicksteps; ++t) {
        const NBG_R Odet = nbgi_layer_at(p, t);
        for (int subS = 0; subS < os; ++subS) {
            const NBG_R Sdet = nbgi_subpixel_at(p, spixel, subS);
            for (int subF = 0; subF < os; ++subF) {
                if (t == 0 && subS == 0 && subF == 0 && !p->curved) {
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
                    const NBG_R lambda = (NBG_R)sr[3];
                    nbgi_lane_q(p, src, W, d0, d1, d2, q0, q1, q2, valid);
                    for (int j = 0; j < W; ++j) {
                        valid[j] = valid[j] && active[j];
                        dq0[j] = dq1[j] = dq2[j] = 0;
                    }
                    for (int m = 0; m < nmat; ++m) {
                        const double *abc = p->abc + 9 * m;
                        NBG_R v[9];
                        for (int x = 0; x < 9; ++x) {
                            v[x] = (NBG_R)abc[x];
                        }
                        NBG_R hkl[3][W], rnd[3][W], L[W], Fc[W], dFh[3][W];
                        /* the rounded indices serve the table lookup and the non-square shapes only */
                        NBG_SFX(nbgi_lane_hkl)(abc, q0, q1, q2, p->F != 0 || p->shape != NBG_SQUARE, hkl, rnd);
                        /* lattice factor and its partials: the square shape across the lanes */
                        NBG_R dLdN[3][W], dLh[3][W];
                        if (p->shape == NBG_SQUARE) {
                            NBG_SFX(nbgi_square_lanes)(p, hkl, L, dLh, dLdN, 1); /* src/row_tmpl.h */
                        } else {
                            for (int j = 0; j < W; ++j) {
                                NBG_R dh3[3], dN3[3], dast[9] = {0, 0, 0, 0, 0, 0, 0, 0, 0};
                                L[j] = NBG_SFX(nbgi_lattice_grad)(p, hkl[0][j], hkl[1][j], hkl[2][j], rnd[0][j],
                                                                 rnd[1][j], rnd[2][j], dh3, dN3, dast);
                                for (int x = 0; x < 3; ++x) {
                                    dLh[x][j] = dh3[x];
                                    dLdN[x][j] = dN3[x];
                                }
                                if (p->shape == NBG_GAUSS && valid[j] && d_I[j] != 0) {
                                    /* d_Fl is needed here: form it from this sample's values */
                                    long unused = 0;
                                    const NBG_R Fcv = NBG_SFX(nbgi_fcell)(p, hkl[0][j], hkl[1][j], hkl[2][j],
                                                                         (int)rnd[0][j], (int)rnd[1][j],
                                                                         (int)rnd[2][j], &unused);
                                    const NBG_R dFl = d_I[j] * 2 * Fcv * Fcv * L[j];
                                    if (L[j] != 0 || p->water) {
                                        for (int i = 0; i < 9; ++i) {
                                            acc->astar[i] += (double)(dFl * dast[i]);
                                        }
                                    }
                                }
                            }
                        }
                        /* structure factor and its partials */
                        if (p->F == 0) {
                            for (int j = 0; j < W; ++j) {
                                Fc[j] = (NBG_R)p->default_F;
                                dFh[0][j] = dFh[1][j] = dFh[2][j] = 0;
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
                        /* accumulate I and the sample's gradients per lane */
                        double *la = lab + (size_t)m * 9 * W;
#pragma omp simd
                        for (int j = 0; j < W; ++j) {
                            const int use = valid[j] && (L[j] != 0 || water);
                            const NBG_R T = Fc[j] * Fc[j] * L[j] * L[j];
                            I[j] += use ? T : 0;
                            const NBG_R dFc = use ? d_I[j] * 2 * Fc[j] * L[j] * L[j] : 0;
                            const NBG_R dFl = use ? d_I[j] * 2 * Fc[j] * Fc[j] * L[j] : 0;
                            ldef[j] += (double)dFc;
                            lN[0][j] += (double)(dFl * dLdN[0][j]);
                            lN[1][j] += (double)(dFl * dLdN[1][j]);
                            lN[2][j] += (double)(dFl * dLdN[2][j]);
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
                        if (p->F != 0 && acc->F != 0) {
                            for (int j = 0; j < W; ++j) {
                                if (valid[j] && (L[j] != 0 || p->water) && d_I[j] != 0) {
                                    NBG_R tmp[3];
                                    const NBG_R dFc = d_I[j] * 2 * Fc[j] * L[j] * L[j];
                                    NBG_SFX(nbgi_fcell_grad)(p, hkl[0][j], hkl[1][j], hkl[2][j], (int)rnd[0][j],
                                                            (int)rnd[1][j], (int)rnd[2][j], tmp, dFc, acc->F,
                                                            &acc->defF);
                                }
                            }
                        }
                    }
                    /* q = (d - i) / lambda: d_d += d_q / lambda, d_lambda -= d_q . q / lambda */
                    double *ll = llam + (size_t)src * W;
#pragma omp simd
                    for (int j = 0; j < W; ++j) {
                        dd0[j] += dq0[j] / lambda;
                        dd1[j] += dq1[j] / lambda;
                        dd2[j] += dq2[j] / lambda;
                        ll[j] -= (double)((dq0[j] * q0[j] + dq1[j] * q1[j] + dq2[j] * q2[j]) / lambda);
                    }
                }
                /* the ray: d_P = (d_d - d (d . d_d)) / R into pix0, f (times Fdet), s and o (times Sdet, Odet) */
#pragma omp simd
                for (int j = 0; j < W; ++j) {
                    const NBG_R dot = d0[j] * dd0[j] + d1[j] * dd1[j] + d2[j] * dd2[j];
                    const NBG_R iR = 1 / Rl[j];
                    const NBG_R e0 = (dd0[j] - d0[j] * dot) * iR;
                    const NBG_R e1 = (dd1[j] - d1[j] * dot) * iR;
                    const NBG_R e2 = (dd2[j] - d2[j] * dot) * iR;
                    lray[0][j] += (double)e0;
                    lray[1][j] += (double)e1;
                    lray[2][j] += (double)e2;
                    lray[3][j] += (double)(e0 * Fd[j]);
                    lray[4][j] += (double)(e1 * Fd[j]);
                    lray[5][j] += (double)(e2 * Fd[j]);
                    lray[6][j] += (double)(e0 * Sdet);
                    lray[7][j] += (double)(e1 * Sdet);
                    lray[8][j] += (double)(e2 * Sdet);
                    lray[9][j] += (double)(e0 * Odet);
                    lray[10][j] += (double)(e1 * Odet);
                    lray[11][j] += (double)(e2 * Odet);
                }
            }
        }
    }
    /* sum the lanes */
    for (int j = 0; j < W; ++j) {
        for (int x = 0; x < 3; ++x) {
            acc->pix0[x] += lray[x][j];
            acc->f[x] += lray[3 + x][j];
            acc->s[x] += lray[6 + x][j];
            acc->o[x] += lray[9 + x][j];
            acc->N[x] += lN[x][j];
        }
        if (p->F == 0) {
            acc->defF += ldef[j];
        }
    }
    for (int m = 0; m < nmat; ++m) {
        for (int x = 0; x < 9; ++x) {
            double sum = 0;
            for (int j = 0; j < W; ++j) {
                sum += lab[((size_t)m * 9 + x) * W + j];
            }
            acc->abc[9 * m + x] += sum;
        }
    }
    for (int src = 0; src < p->nsources; ++src) {
        double sum = 0;
        for (int j = 0; j < W; ++j) {
            sum += llam[(size_t)src * W + j];
        }
        acc->lam[src] += sum;
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
        nbgi_lane_pixel_factors_adjoint(p, &lf, g, I, d_I, acc);
    }
}

#undef NBG_ALANES
