/*
 * adjoint_tmpl.h -- the adjoint of src/row_tmpl.h for one pixel: the same loop nest over layers x subpixels x sources
 * x (phi, mosaic), the same per-sample physics (src/physics_tmpl.h), with adjoint variables d_<var>.  It
 * recomputes every sample instead of storing a tape, so memory stays O(pixels).
 *
 * The forward value of a pixel is S = scale * I * capture * polar * omega with I = I_bg + sum F_cell^2 F_latt^2,
 * where omega is taken at the first subpixel, polar at the first (subpixel, source) that survives the resolution
 * cut and capture at the last layer's first subpixel.  Those three factors are computed first (a short prologue
 * that records where), so that d_I = g scale capture polar omega is known before the main pass; the main pass then
 * accumulates I and every sample's gradient at once, and the epilogue back-propagates d_omega, d_polar and
 * d_capture, which need the final I, through the recorded geometry.  The -oversample_thick/_polar/_omega
 * running-sum modes are not differentiated (the API refuses them).
 *
 * Instantiated for NBG_R = double by grad/adjoint_cpu.c and cuda/backend.cu, and for float by cuda/backend.cu.
 * As in the forward kernel (src/row_tmpl.h), the geometry of each subpixel and source and its adjoint are
 * double in both (src/geometry.h); the per-sample work is NBG_R.  The prologue and epilogue (the once-per-pixel
 * factors and their adjoint) are nbgi_pixel_factors and nbgi_pixel_factors_adjoint (grad/adjoint.h), whose lane
 * forms the row adjoint runs, and which the tangent kernels share.
 */
#ifndef NBG_TMPL_OPEN
#error "adjoint_tmpl.h is a template: instantiate it through tmpl_on.h / tmpl_off.h (see src/tmpl_on.h)"
#endif
#ifndef NBG_KERNEL_H
#error "adjoint_tmpl.h needs kernel.h instantiated for the same type first"
#endif
#ifndef NBG_ADJOINT_H
#error "adjoint_tmpl.h needs adjoint.h instantiated for the same type first"
#endif
#define NBG_TMPL_HAS_ADJOINT 1

/* One sample's Miller indices, lattice factor and structure factor with their partial derivatives, for crystal
 * vectors v (one phi step and domain, in the kernel's type: nbgi_matrix) and scattering vector q.  Returns 0 where
 * the sample contributes nothing (zero lattice factor and no water), as the forward loop skips it. */
typedef struct {
    NBG_R h, k, l, h0, k0, l0;
    NBG_R L, dLh[3], dLN[3], dLast[9]; /* lattice factor; d/d(h,k,l), d/dN, d/da* (gauss) */
    NBG_R F, dFh[3];                   /* structure factor; d/d(h,k,l) */
} NBG_SFX(nbgi_sample);

static inline NBG_HD int NBG_SFX(nbgi_sample_eval)(const nbgi_kparams *p, const NBG_R *v, const NBG_R *q,
                                                 NBG_SFX(nbgi_sample) * sm)
{
    NBG_R hkl[3];
    NBG_SFX(nbgi_miller)(v, q, hkl);
    sm->h = hkl[0];
    sm->k = hkl[1];
    sm->l = hkl[2];
    sm->h0 = NBG_SFX(nbgi_round_index)(sm->h);
    sm->k0 = NBG_SFX(nbgi_round_index)(sm->k);
    sm->l0 = NBG_SFX(nbgi_round_index)(sm->l);
    for (int i = 0; i < 9; ++i) {
        sm->dLast[i] = 0;
    }
    sm->L = NBG_SFX(nbgi_lattice_grad)(p, sm->h, sm->k, sm->l, sm->h0, sm->k0, sm->l0, sm->dLh, sm->dLN, sm->dLast);
    if (sm->L == 0 && !p->water) {
        return 0;
    }
    double unused = 0;
    sm->F = NBG_SFX(nbgi_fcell_grad)(p, sm->h, sm->k, sm->l, (int)sm->h0, (int)sm->k0, (int)sm->l0, sm->dFh, 0, 0,
                                    &unused);
    return 1;
}

/* One sample's share of the adjoint: adds F_cell^2 F_latt^2 to *I and, where d_I != 0, its gradients on the crystal
 * size (dN), the reciprocal vectors (dastar, gauss shape) and the structure factors (dFtab, or dFdef for
 * default_F, through nbgi_fcell_grad), and gives d_hkl = dL/d(h, k, l) for the crystal vectors' and q's adjoint.
 * Returns 0 where the sample gives no gradient (it contributes nothing, or d_I = 0). */
static inline NBG_HD int NBG_SFX(nbgi_sample_adjoint)(const nbgi_kparams *p, const NBG_R *v, const NBG_R *q, NBG_R d_I,
                                                    NBG_R *I, double *dN, double *dastar, double *dFtab,
                                                    double *dFdef, NBG_R *d_hkl)
{
    NBG_SFX(nbgi_sample) sm;
    if (!NBG_SFX(nbgi_sample_eval)(p, v, q, &sm)) {
        return 0;
    }
    const NBG_R F_cell = sm.F, F_latt = sm.L;
    *I += F_cell * F_cell * F_latt * F_latt;
    if (d_I == 0) {
        return 0;
    }
    /* dT/dF_cell = 2 F_cell F_latt^2, dT/dF_latt = 2 F_cell^2 F_latt */
    const NBG_R d_Fc = d_I * 2 * F_cell * F_latt * F_latt;
    const NBG_R d_Fl = d_I * 2 * F_cell * F_cell * F_latt;
    if (dFtab != 0 || p->F == 0) {
        NBG_R tmp[3];
        NBG_SFX(nbgi_fcell_grad)(p, sm.h, sm.k, sm.l, (int)sm.h0, (int)sm.k0, (int)sm.l0, tmp, d_Fc, dFtab, dFdef);
    }
    for (int i = 0; i < 3; ++i) {
        dN[i] += (double)(d_Fl * sm.dLN[i]);
    }
    if (p->shape == NBG_GAUSS) {
        for (int i = 0; i < 9; ++i) {
            dastar[i] += (double)(d_Fl * sm.dLast[i]);
        }
    }
    d_hkl[0] = d_Fl * sm.dLh[0] + d_Fc * sm.dFh[0];
    d_hkl[1] = d_Fl * sm.dLh[1] + d_Fc * sm.dFh[1];
    d_hkl[2] = d_Fl * sm.dLh[2] + d_Fc * sm.dFh[2];
    return 1;
}

/* q = (d - i) / lambda:  d_d += d_q / lambda,  d_lambda -= d_q . q / lambda */
static inline NBG_HD void NBG_SFX(nbgi_q_adjoint)(const NBG_R *d_q, const double *qd, double lambda, double *d_d,
                                                double *d_lam)
{
    for (int x = 0; x < 3; ++x) {
        d_d[x] += (double)d_q[x] / lambda;
    }
    *d_lam -= ((double)d_q[0] * qd[0] + (double)d_q[1] * qd[1] + (double)d_q[2] * qd[2]) / lambda;
}

/* The pixel's value S = scale I capture polar omega and (g != 0) the epilogue: the once-per-pixel factors'
 * adjoint, which needs the final I. */
static inline NBG_HD double NBG_SFX(nbgi_pixel_adjoint_end)(const nbgi_kparams *p, const nbgi_pixfactors *pf, NBG_R g,
                                                          NBG_R I, NBG_R d_I, nbgi_adjacc *acc)
{
    double S = p->scale * (double)I;
    S *= pf->capture;
    S *= pf->polar;
    S *= pf->omega;
    if (g != 0) {
        nbgi_pixel_factors_adjoint(p, pf, (double)g, (double)I, (double)d_I, acc);
    }
    return S;
}

static inline NBG_HD double NBG_SFX(nbgi_pixel_adjoint)(const nbgi_kparams *p, int fpixel, int spixel, NBG_R g,
                                                      nbgi_adjacc *acc)
{
    const int os = p->oversample;
    const int nmat = p->nphi * p->nmos;
    /* --- prologue: the once-per-pixel factors and where they were taken ------------------------------------ */
    nbgi_pixfactors pf;
    nbgi_pixel_factors(p, fpixel, spixel, &pf);
    const double capture = pf.capture, polar = pf.polar, omega = pf.omega, scale = p->scale;

    /* --- main pass: I and every sample's gradient, with d_I known ------------------------------------------ */
    const NBG_R d_I = (NBG_R)(g * scale * capture * polar * omega);
    NBG_R I = (NBG_R)p->I_bg;
    for (int t = 0; t < p->thicksteps; ++t) {
        for (int subS = 0; subS < os; ++subS) {
            for (int subF = 0; subF < os; ++subF) {
                nbgi_ray ray;
                nbgi_ray_at(p, fpixel, spixel, subF, subS, t, &ray);
                double d_d[3] = {0, 0, 0};
                for (int src = 0; src < p->nsources; ++src) {
                    double qd[3];
                    if (!nbgi_scatter_q(p, ray.d, src, qd)) {
                        continue;
                    }
                    const NBG_R q[3] = {(NBG_R)qd[0], (NBG_R)qd[1], (NBG_R)qd[2]};
                    const double lambda = p->src[NBG_SRC_STRIDE * src + 3];
                    NBG_R d_q[3] = {0, 0, 0};
                    for (int m = 0; m < nmat; ++m) {
                        NBG_R vtmp[9], d_hkl[3];
                        const NBG_R *v = NBG_SFX(nbgi_matrix)(p, m, vtmp);
                        if (!NBG_SFX(nbgi_sample_adjoint)(p, v, q, d_I, &I, acc->N, acc->astar, acc->F, &acc->defF,
                                                         d_hkl)) {
                            continue;
                        }
                        /* h = a . q:  d_a += d_h q,  d_q += d_h a */
                        double *d_abc = acc->abc + 9 * m;
                        for (int x = 0; x < 3; ++x) {
                            d_abc[x] += (double)(d_hkl[0] * q[x]);
                            d_abc[3 + x] += (double)(d_hkl[1] * q[x]);
                            d_abc[6 + x] += (double)(d_hkl[2] * q[x]);
                            d_q[x] += d_hkl[0] * v[x] + d_hkl[1] * v[3 + x] + d_hkl[2] * v[6 + x];
                        }
                    }
                    NBG_SFX(nbgi_q_adjoint)(d_q, qd, lambda, d_d, &acc->lam[src]);
                }
                if (d_I != 0) {
                    nbgi_ray_adjoint(&ray, d_d, 0, acc);
                }
            }
        }
    }
    return NBG_SFX(nbgi_pixel_adjoint_end)(p, &pf, g, I, d_I, acc);
}

/* nbgi_pixel_adjoint with the crystal vectors' gradients in registers, for the CUDA backend (there acc->abc is in
 * the thread's local memory, which the per-sample form reads and writes 9 times a sample): the (phi, mosaic)
 * matrices go in tiles of NBG_ADJ_TILE, each tile looping over the sources of a subpixel, so that a tile's
 * 9 NBG_ADJ_TILE accumulators reach acc->abc once a subpixel (and the crystal size's and default_F's once a
 * pixel).  With more matrices than a tile the samples are summed in another order (subpixel, tile, source,
 * matrix): I and the gradients then differ from nbgi_pixel_adjoint's (and I from the forward's) by rounding. */
#ifndef NBG_ADJ_TILE
#define NBG_ADJ_TILE 2
#endif
#if NBG_ADJ_TILE > 0
#ifndef NBG_UNROLL
#ifdef __CUDA_ARCH__
#define NBG_UNROLL _Pragma("unroll")
#else
#define NBG_UNROLL
#endif
#endif
static inline NBG_HD double NBG_SFX(nbgi_pixel_adjoint_tiled)(const nbgi_kparams *p, int fpixel, int spixel, NBG_R g,
                                                            nbgi_adjacc *acc)
{
    const int os = p->oversample;
    const int nmat = p->nphi * p->nmos;
    nbgi_pixfactors pf;
    nbgi_pixel_factors(p, fpixel, spixel, &pf);
    const NBG_R d_I = (NBG_R)(g * p->scale * pf.capture * pf.polar * pf.omega);
    NBG_R I = (NBG_R)p->I_bg;
    double dN[3] = {0, 0, 0}, dFdef = 0;
    for (int t = 0; t < p->thicksteps; ++t) {
        for (int subS = 0; subS < os; ++subS) {
            for (int subF = 0; subF < os; ++subF) {
                nbgi_ray ray;
                nbgi_ray_at(p, fpixel, spixel, subF, subS, t, &ray);
                double d_d[3] = {0, 0, 0};
                for (int m0 = 0; m0 < nmat; m0 += NBG_ADJ_TILE) {
                    double d_abc[9 * NBG_ADJ_TILE];
                    NBG_UNROLL
                    for (int c = 0; c < 9 * NBG_ADJ_TILE; ++c) {
                        d_abc[c] = 0;
                    }
                    for (int src = 0; src < p->nsources; ++src) {
                        /* nbgi_scatter_q's q, and 1 / lambda for q's adjoint (once a tile and source: multiplied,
                         * not divided as in nbgi_q_adjoint) */
                        const double *sr = p->src + NBG_SRC_STRIDE * src;
                        const double ilambda = 1 / sr[3];
                        double qd[3];
                        if (!nbgi_scatter_q(p, ray.d, src, qd)) {
                            continue;
                        }
                        const NBG_R q[3] = {(NBG_R)qd[0], (NBG_R)qd[1], (NBG_R)qd[2]};
                        NBG_R d_q[3] = {0, 0, 0};
                        NBG_UNROLL
                        for (int j = 0; j < NBG_ADJ_TILE; ++j) {
                            NBG_R vtmp[9], d_hkl[3];
                            if (m0 + j >= nmat) {
                                break;
                            }
                            const NBG_R *v = NBG_SFX(nbgi_matrix)(p, m0 + j, vtmp);
                            if (!NBG_SFX(nbgi_sample_adjoint)(p, v, q, d_I, &I, dN, acc->astar, acc->F, &dFdef,
                                                             d_hkl)) {
                                continue;
                            }
                            for (int x = 0; x < 3; ++x) {
                                d_abc[9 * j + x] += (double)(d_hkl[0] * q[x]);
                                d_abc[9 * j + 3 + x] += (double)(d_hkl[1] * q[x]);
                                d_abc[9 * j + 6 + x] += (double)(d_hkl[2] * q[x]);
                                d_q[x] += d_hkl[0] * v[x] + d_hkl[1] * v[3 + x] + d_hkl[2] * v[6 + x];
                            }
                        }
                        for (int x = 0; x < 3; ++x) {
                            d_d[x] += (double)d_q[x] * ilambda;
                        }
                        acc->lam[src] -= ((double)d_q[0] * qd[0] + (double)d_q[1] * qd[1] + (double)d_q[2] * qd[2]) *
                                         ilambda;
                    }
                    NBG_UNROLL
                    for (int j = 0; j < NBG_ADJ_TILE; ++j) {
                        if (m0 + j < nmat) {
                            for (int c = 0; c < 9; ++c) {
                                acc->abc[9 * (m0 + j) + c] += d_abc[9 * j + c];
                            }
                        }
                    }
                }
                if (d_I != 0) {
                    nbgi_ray_adjoint(&ray, d_d, 0, acc);
                }
            }
        }
    }
    for (int i = 0; i < 3; ++i) {
        acc->N[i] += dN[i];
    }
    acc->defF += dFdef;
    return NBG_SFX(nbgi_pixel_adjoint_end)(p, &pf, g, I, d_I, acc);
}
#else
static inline NBG_HD double NBG_SFX(nbgi_pixel_adjoint_tiled)(const nbgi_kparams *p, int fpixel, int spixel, NBG_R g,
                                                            nbgi_adjacc *acc)
{
    return NBG_SFX(nbgi_pixel_adjoint)(p, fpixel, spixel, g, acc);
}
#endif /* NBG_ADJ_TILE > 0 */

