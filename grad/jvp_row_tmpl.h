/*
 * jvp_row_tmpl.h -- the tangent kernel's vectorised form: grad/jvp_tmpl.h for NBG_JLANES neighbouring pixels of a
 * row.  The once-per-pixel factors and their tangents come per lane from the scalar twin (nbgi_jvp_factors); each
 * sample's tangents are propagated across the lanes in `omp simd` loops.  Same arithmetic per pixel as the
 * scalar twin up to the order of additions and the exact zeros it leaves out: a crystal's direction (cell,
 * orientation) under a constant F has no t_q, t_N or dF/dh terms; with several samples a matrix and pixel, a
 * crystal's directions are summed through the pixel's G (below), each sample's terms regrouped.  What the row needs to know of its directions
 * (nbgi_jvp_dirs) is found once per row by the caller; the last loop writes the tangent images direction by
 * direction across the lanes (it was a scalar loop over the lanes, with the direction flags recomputed for every 8
 * pixels: together half of cubic1k's nine tangents).  Instantiated for double by grad/adjoint_cpu.c.
 */
#ifndef NBG_TMPL_OPEN
#error "jvp_row_tmpl.h is a template: instantiate it through tmpl_on.h / tmpl_off.h (see src/tmpl_on.h)"
#endif
#ifndef NBG_TMPL_HAS_JVP
#error "jvp_row_tmpl.h needs jvp_tmpl.h instantiated for the same type first"
#endif
#ifndef NBG_TMPL_HAS_ADJOINT_ROW
#error "jvp_row_tmpl.h needs adjoint_row_tmpl.h instantiated for the same type first"
#endif
#define NBG_JLANES 8

/* The other shapes' lattice factor and its partials across the lanes, for nbgi_row_jvp (the square shape's is
 * nbgi_square_lanes_grad): nbgi_shape_lanes_grad's lane loops (src/row_tmpl.h); dast[j] the gauss shape's partials in
 * a*, b*, c* (read for it alone).  Out of line, as the adjoint's nbgi_shape_lanes_adjoint: inlined into the row, the
 * gauss shape's loop made the square shape's nine tangents 30 % slower (tric1k). */
static __attribute__((noinline)) void NBG_SFX(nbgi_shape_lanes_jvp)(const nbgi_kparams *p, NBG_R hkl[3][NBG_JLANES],
                                                                  NBG_R rnd[3][NBG_JLANES], NBG_R *L,
                                                                  NBG_R dLh[3][NBG_JLANES], NBG_R dLdN[3][NBG_JLANES],
                                                                  NBG_R dast[NBG_JLANES][9])
{
    enum { W = NBG_JLANES };
    NBG_R gv[4][W];
    NBG_SFX(nbgi_shape_lanes_grad)(p, hkl, rnd, L, dLh, dLdN, gv); /* src/row_tmpl.h */
    for (int j = 0; j < W && p->shape == NBG_GAUSS; ++j) {
        for (int i = 0; i < 3; ++i) {
            const NBG_R dv = hkl[i][j] - rnd[i][j];
            for (int x = 0; x < 3; ++x) {
                dast[j][3 * i + x] = gv[0][j] * dv * gv[1 + x][j];
            }
        }
    }
}

static inline void NBG_SFX(nbgi_row_jvp)(const nbgi_kparams *p, int spixel, int f0, int n, const nbgi_adjacc *t, int nt,
                                       const nbgi_jvp_dirs *dirs, float *out, double *outd, double *dS, size_t npix,
                                       size_t base, double *G)
{
    enum { W = NBG_JLANES };
    const int os = p->oversample;
    const int nmat = p->nphi * p->nmos;
    const NBG_R scale = (NBG_R)p->scale;
    /* the plan's switches in locals (a load through p in a lane loop that stores elsewhere stops GCC vectorising
     * it) */
    const int water = p->water != 0, table = p->F != 0;
    const NBG_R F0 = (NBG_R)p->default_F;
    int active[W];
    const int all = nbgi_all_active(p, spixel, f0, n); /* every lane inside the ROI, no mask: no test a lane */
    NBG_R omega[W], capture[W], polar[W], I[W];
    NBG_R t_om[NBG_JVP_MAX][W], t_cap[NBG_JVP_MAX][W], t_pol[NBG_JVP_MAX][W], t_I[NBG_JVP_MAX][W];
    /* the factors' tangents are needed only for directions that move the detector or the Kahn factor (a crystal's
     * or a wavelength's have none): without such a direction the factors come from the lane form, as the adjoint
     * takes them (the same values bit for bit, grad/adjoint.h), and their tangents are zero */
    const int factor_tangents = dirs->factor_tangents;
    const int *const moves = dirs->moves, *const tN_zero = dirs->tN_zero;
    if (!factor_tangents) {
        _Static_assert(NBG_PF_LANES == NBG_JLANES, "the lane factors must have the tangent row's width");
        nbgi_lane_pixfactors lf;
        for (int j = 0; j < W; ++j) {
            active[j] = j < n && (all || nbgi_pixel_active(p, f0 + j, spixel));
        }
        nbgi_lane_pixel_factors(p, f0, spixel, active, &lf);
        for (int j = 0; j < W; ++j) {
            omega[j] = (NBG_R)lf.omega[j];
            capture[j] = (NBG_R)lf.capture[j];
            polar[j] = (NBG_R)lf.polar[j];
            I[j] = (NBG_R)p->I_bg;
        }
        for (int k = 0; k < nt; ++k) {
            const NBG_R ib = (NBG_R)t[k].Ibg;
#pragma omp simd
            for (int j = 0; j < W; ++j) {
                t_om[k][j] = 0;
                t_cap[k][j] = 0;
                t_pol[k][j] = 0;
                t_I[k][j] = ib;
            }
        }
    }
    for (int j = 0; factor_tangents && j < W; ++j) {
        active[j] = j < n && (all || nbgi_pixel_active(p, f0 + j, spixel));
        const int fe = active[j] ? f0 + j : f0;
        NBG_R a[NBG_JVP_MAX], b[NBG_JVP_MAX], c[NBG_JVP_MAX], d[NBG_JVP_MAX];
        NBG_SFX(nbgi_jvp_factors)(p, fe, spixel, t, nt, &omega[j], &capture[j], &polar[j], a, b, c, d);
        for (int k = 0; k < nt; ++k) {
            t_om[k][j] = a[k];
            t_cap[k][j] = b[k];
            t_pol[k][j] = c[k];
            t_I[k][j] = d[k];
        }
        I[j] = (NBG_R)p->I_bg;
    }
    const NBG_R sub = (NBG_R)p->subpixel;
    NBG_R d0[W], d1[W], d2[W], Rl[W], Fd[W], q0[W], q1[W], q2[W];
    NBG_R td[NBG_JVP_MAX][3][W], tq[NBG_JVP_MAX][3][W];
    int valid[W], crystal[NBG_JVP_MAX];
    /* The crystal's directions with the square shape (t_q = 0 at every source, t_N = 0): t_h = t_a . q is linear in
     * the direction's t_a, so t_I = sum over matrices m of sum_xi t_a[m][xi] G[m][xi], where G[m][xi] = sum over
     * the pixel's samples of dI/dh_x q_i (dI/dh = dI/dL dL/dh + dI/dF dF/dh): G is summed once a sample, whatever the
     * number of such directions, and each direction costs 9 multiply-adds a matrix and pixel instead of 13 a
     * sample (heavy256's nine tangents 27 % faster, tric1k's 5 %).  With one sample a matrix and pixel (cubic1k)
     * that is no saving, and zeroing and reading G cost 13 %: there, and where G (the caller's scratch, nmat * 9 *
     * W) is NULL, every direction a sample at a time. */
    const int gsum = G != NULL && os * os * p->thicksteps * p->nsources > 1;
    int gdir[NBG_JVP_MAX], ng = 0;
    for (int k = 0; k < nt; ++k) {
        gdir[k] = gsum && p->shape == NBG_SQUARE && !moves[k] && tN_zero[k];
        for (int src = 0; src < p->nsources && gdir[k]; ++src) {
            gdir[k] = t[k].lam[src] == 0;
        }
        ng += gdir[k];
    }
    if (ng > 0) {
        memset(G, 0, sizeof(double) * (size_t)nmat * 9 * W);
    }
    for (int k = 0; k < nt; ++k) {
        /* a direction that does not move the detector leaves the rays alone: t_d = 0 throughout the row */
        if (!moves[k]) {
            for (int x = 0; x < 3; ++x) {
                for (int j = 0; j < W; ++j) {
                    td[k][x][j] = 0;
                }
            }
        }
    }
    for (int tt = 0; tt < p->thicksteps; ++tt) {
        const NBG_R Odet = (NBG_R)nbgi_layer_at(p, tt);
        for (int subS = 0; subS < os; ++subS) {
            const NBG_R Sdet = sub * (NBG_R)(spixel * os + subS) + sub / 2;
            for (int subF = 0; subF < os; ++subF) {
                nbgi_lane_rays(p, f0, subF, Sdet, Odet, W, d0, d1, d2, Rl, Fd);
                /* P = Fdet f + Sdet s + Odet o + pix0: t_P; d = P / R: t_d = (t_P - d (d . t_P)) / R */
                for (int k = 0; k < nt; ++k) {
                    if (!moves[k]) {
                        continue;
                    }
                    const nbgi_adjacc *tk = &t[k];
                    NBG_R *restrict a0 = td[k][0], *restrict a1 = td[k][1], *restrict a2 = td[k][2];
#pragma omp simd
                    for (int j = 0; j < W; ++j) {
                        const NBG_R P0 = (NBG_R)(Fd[j] * tk->f[0] + Sdet * tk->s[0] + Odet * tk->o[0] + tk->pix0[0]);
                        const NBG_R P1 = (NBG_R)(Fd[j] * tk->f[1] + Sdet * tk->s[1] + Odet * tk->o[1] + tk->pix0[1]);
                        const NBG_R P2 = (NBG_R)(Fd[j] * tk->f[2] + Sdet * tk->s[2] + Odet * tk->o[2] + tk->pix0[2]);
                        const NBG_R dR = d0[j] * P0 + d1[j] * P1 + d2[j] * P2;
                        a0[j] = (P0 - d0[j] * dR) / Rl[j];
                        a1[j] = (P1 - d1[j] * dR) / Rl[j];
                        a2[j] = (P2 - d2[j] * dR) / Rl[j];
                    }
                }
                for (int src = 0; src < p->nsources; ++src) {
                    const double *sr = p->src + NBG_SRC_STRIDE * src;
                    const NBG_R ilambda = 1 / (NBG_R)sr[3];
                    nbgi_lane_q(p, src, W, d0, d1, d2, q0, q1, q2, valid);
                    for (int j = 0; j < W; ++j) {
                        valid[j] &= active[j]; /* both 0 or 1: bitwise, so that the loop vectorises */
                    }
                    /* q = (d - i) / lambda: t_q = t_d / lambda - q t_lambda / lambda; zero for a direction that
                     * moves neither the detector nor this source's wavelength */
                    for (int k = 0; k < nt; ++k) {
                        const NBG_R tl = (NBG_R)t[k].lam[src];
                        /* the crystal's directions under a constant F take the short form below, without t_q */
                        crystal[k] = !moves[k] && tl == 0 && tN_zero[k] && p->F == 0;
                        if (crystal[k] || gdir[k]) {
                            continue;
                        }
#pragma omp simd
                        for (int j = 0; j < W; ++j) {
                            tq[k][0][j] = td[k][0][j] * ilambda - q0[j] * tl * ilambda;
                            tq[k][1][j] = td[k][1][j] * ilambda - q1[j] * tl * ilambda;
                            tq[k][2][j] = td[k][2][j] * ilambda - q2[j] * tl * ilambda;
                        }
                    }
                    for (int m = 0; m < nmat; ++m) {
                        const double *abc = p->abc + 9 * m;
                        NBG_R v[9];
                        for (int x = 0; x < 9; ++x) {
                            v[x] = (NBG_R)abc[x];
                        }
                        /* the lattice factor's outputs aligned as it assumes (src/row_tmpl.h, NBG_LANE_AL) */
                        NBG_R hkl[3][W], rnd[3][W], Fc[W], dFh[3][W];
                        NBG_R L[W] __attribute__((aligned(64))), dLh[3][W] __attribute__((aligned(64))),
                            dLdN[3][W] __attribute__((aligned(64)));
                        NBG_SFX(nbgi_lane_hkl)(v, q0, q1, q2, p->F != 0 || p->shape != NBG_SQUARE, hkl, rnd);
                        NBG_R dast[W][9]; /* the Gaussian shape's partials in a*, b*, c* (read for it alone) */
                        if (p->shape == NBG_SQUARE) {
                            NBG_SFX(nbgi_square_lanes_grad)(p, hkl, L, dLh, dLdN); /* src/row_tmpl.h */
                        } else {
                            NBG_SFX(nbgi_shape_lanes_jvp)(p, hkl, rnd, L, dLh, dLdN, dast);
                        }
                        /* the structure factor and its partials (without a table the tests outside the lane loop:
                         * it was scalar, with p read in it) */
                        if (!table) {
                            for (int j = 0; j < W; ++j) {
                                Fc[j] = F0;
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
                        NBG_R cF[W], cL[W];
#pragma omp simd
                        for (int j = 0; j < W; ++j) {
                            const int use = valid[j] && (L[j] != 0 || water);
                            I[j] += use ? Fc[j] * Fc[j] * L[j] * L[j] : 0;
                            cF[j] = use ? 2 * Fc[j] * L[j] * L[j] : 0;
                            cL[j] = use ? 2 * Fc[j] * Fc[j] * L[j] : 0;
                        }
                        if (ng > 0) {
                            double *NBG_RESTRICT Gm = G + (size_t)m * 9 * W;
#pragma omp simd
                            for (int j = 0; j < W; ++j) {
                                const NBG_R gh = cL[j] * dLh[0][j] + cF[j] * dFh[0][j];
                                const NBG_R gk = cL[j] * dLh[1][j] + cF[j] * dFh[1][j];
                                const NBG_R gl = cL[j] * dLh[2][j] + cF[j] * dFh[2][j];
                                Gm[0 * W + j] += gh * q0[j];
                                Gm[1 * W + j] += gh * q1[j];
                                Gm[2 * W + j] += gh * q2[j];
                                Gm[3 * W + j] += gk * q0[j];
                                Gm[4 * W + j] += gk * q1[j];
                                Gm[5 * W + j] += gk * q2[j];
                                Gm[6 * W + j] += gl * q0[j];
                                Gm[7 * W + j] += gl * q1[j];
                                Gm[8 * W + j] += gl * q2[j];
                            }
                        }
                        for (int k = 0; k < nt; ++k) {
                            if (gdir[k]) {
                                continue;
                            }
                            const double *ta = t[k].abc + 9 * m;
                            NBG_R tv[9];
                            for (int x = 0; x < 9; ++x) {
                                tv[x] = (NBG_R)ta[x];
                            }
                            const NBG_R tN0 = (NBG_R)t[k].N[0], tN1 = (NBG_R)t[k].N[1], tN2 = (NBG_R)t[k].N[2];
                            NBG_R *restrict tIk = t_I[k];
                            const NBG_R *restrict tq0 = tq[k][0], *restrict tq1 = tq[k][1], *restrict tq2 = tq[k][2];
                            if (crystal[k]) {
                                /* a crystal's direction under a constant F: t_q = 0, t_N = 0 and dF/dh = 0, so
                                 * t_h = t_a . q and t_I gains dI/dL t_L alone (the terms left out are exact zeros) */
#pragma omp simd
                                for (int j = 0; j < W; ++j) {
                                    const NBG_R th = tv[0] * q0[j] + tv[1] * q1[j] + tv[2] * q2[j];
                                    const NBG_R tk = tv[3] * q0[j] + tv[4] * q1[j] + tv[5] * q2[j];
                                    const NBG_R tl = tv[6] * q0[j] + tv[7] * q1[j] + tv[8] * q2[j];
                                    const NBG_R tL = dLh[0][j] * th + dLh[1][j] * tk + dLh[2][j] * tl;
                                    tIk[j] += cL[j] * tL;
                                }
                            } else {
#pragma omp simd
                                for (int j = 0; j < W; ++j) {
                                    /* h = a . q: t_h = t_a . q + a . t_q */
                                    const NBG_R th = tv[0] * q0[j] + tv[1] * q1[j] + tv[2] * q2[j] + v[0] * tq0[j] +
                                                     v[1] * tq1[j] + v[2] * tq2[j];
                                    const NBG_R tk = tv[3] * q0[j] + tv[4] * q1[j] + tv[5] * q2[j] + v[3] * tq0[j] +
                                                     v[4] * tq1[j] + v[5] * tq2[j];
                                    const NBG_R tl = tv[6] * q0[j] + tv[7] * q1[j] + tv[8] * q2[j] + v[6] * tq0[j] +
                                                     v[7] * tq1[j] + v[8] * tq2[j];
                                    const NBG_R tL = dLh[0][j] * th + dLh[1][j] * tk + dLh[2][j] * tl +
                                                     dLdN[0][j] * tN0 + dLdN[1][j] * tN1 + dLdN[2][j] * tN2;
                                    const NBG_R tF = dFh[0][j] * th + dFh[1][j] * tk + dFh[2][j] * tl;
                                    tIk[j] += cF[j] * tF + cL[j] * tL;
                                }
                            }
                            if (p->shape == NBG_GAUSS) {
                                for (int j = 0; j < W; ++j) {
                                    for (int i = 0; i < 9; ++i) {
                                        tIk[j] += cL[j] * dast[j][i] * (NBG_R)t[k].astar[i];
                                    }
                                }
                            }
                        }
                    }
                }
            }
        }
    }
    /* the G directions' t_I, matrix by matrix */
    for (int k = 0; k < nt && ng > 0; ++k) {
        if (!gdir[k]) {
            continue;
        }
        NBG_R *NBG_RESTRICT tIk = t_I[k];
        for (int m = 0; m < nmat; ++m) {
            const double *ta = t[k].abc + 9 * m;
            const double *NBG_RESTRICT Gm = G + (size_t)m * 9 * W;
            NBG_R tv[9];
            for (int x = 0; x < 9; ++x) {
                tv[x] = (NBG_R)ta[x];
            }
#pragma omp simd
            for (int j = 0; j < W; ++j) {
                tIk[j] += tv[0] * Gm[0 * W + j] + tv[1] * Gm[1 * W + j] + tv[2] * Gm[2 * W + j] +
                          tv[3] * Gm[3 * W + j] + tv[4] * Gm[4 * W + j] + tv[5] * Gm[5 * W + j] +
                          tv[6] * Gm[6 * W + j] + tv[7] * Gm[7 * W + j] + tv[8] * Gm[8 * W + j];
            }
        }
    }
    NBG_R cpo[W];
    for (int j = 0; j < n; ++j) {
        double S = p->scale * (double)I[j];
        S *= (double)capture[j];
        S *= (double)polar[j];
        S *= (double)omega[j];
        out[j] = active[j] ? (float)S : 0.0f;
        if (outd != NULL) {
            outd[j] = active[j] ? S : 0.0; /* the value before its rounding (nbg_simulate_tangents) */
        }
    }
#pragma omp simd
    for (int j = 0; j < W; ++j) {
        cpo[j] = capture[j] * polar[j] * omega[j];
    }
    for (int k = 0; k < nt; ++k) {
        /* S = scale I capture polar omega */
        const NBG_R ts = (NBG_R)t[k].scale;
        const NBG_R *restrict tIk = t_I[k], *restrict tck = t_cap[k], *restrict tpk = t_pol[k], *restrict tok = t_om[k];
        double *restrict dk = dS + (size_t)k * npix + base;
#pragma omp simd
        for (int j = 0; j < n; ++j) {
            const double v = (double)(ts * I[j] * cpo[j] +
                                      scale * (tIk[j] * cpo[j] +
                                               I[j] * (tck[j] * polar[j] * omega[j] + capture[j] * tpk[j] * omega[j] +
                                                       capture[j] * polar[j] * tok[j])));
            dk[j] = active[j] ? v : 0;
        }
    }
}

#undef NBG_JLANES
