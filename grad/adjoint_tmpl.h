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
                        NBG_R vtmp[9];
                        const NBG_R *v = NBG_SFX(nbgi_matrix)(p, m, vtmp);
                        NBG_SFX(nbgi_sample) sm;
                        if (!NBG_SFX(nbgi_sample_eval)(p, v, q, &sm)) {
                            continue;
                        }
                        const NBG_R F_cell = sm.F, F_latt = sm.L;
                        I += F_cell * F_cell * F_latt * F_latt;
                        if (d_I == 0) {
                            continue;
                        }
                        /* dT/dF_cell = 2 F_cell F_latt^2, dT/dF_latt = 2 F_cell^2 F_latt */
                        const NBG_R d_Fc = d_I * 2 * F_cell * F_latt * F_latt;
                        const NBG_R d_Fl = d_I * 2 * F_cell * F_cell * F_latt;
                        if (acc->F != 0 || p->F == 0) {
                            NBG_R tmp[3];
                            NBG_SFX(nbgi_fcell_grad)(p, sm.h, sm.k, sm.l, (int)sm.h0, (int)sm.k0, (int)sm.l0, tmp, d_Fc,
                                                    acc->F, &acc->defF);
                        }
                        for (int i = 0; i < 3; ++i) {
                            acc->N[i] += (double)(d_Fl * sm.dLN[i]);
                        }
                        if (p->shape == NBG_GAUSS) {
                            for (int i = 0; i < 9; ++i) {
                                acc->astar[i] += (double)(d_Fl * sm.dLast[i]);
                            }
                        }
                        /* h = a . q:  d_a += d_h q,  d_q += d_h a */
                        const NBG_R d_h = d_Fl * sm.dLh[0] + d_Fc * sm.dFh[0];
                        const NBG_R d_k = d_Fl * sm.dLh[1] + d_Fc * sm.dFh[1];
                        const NBG_R d_l = d_Fl * sm.dLh[2] + d_Fc * sm.dFh[2];
                        double *d_abc = acc->abc + 9 * m;
                        for (int x = 0; x < 3; ++x) {
                            d_abc[x] += (double)(d_h * q[x]);
                            d_abc[3 + x] += (double)(d_k * q[x]);
                            d_abc[6 + x] += (double)(d_l * q[x]);
                            d_q[x] += d_h * v[x] + d_k * v[3 + x] + d_l * v[6 + x];
                        }
                    }
                    /* q = (d - i) / lambda:  d_d += d_q / lambda,  d_lambda -= d_q . q / lambda */
                    for (int x = 0; x < 3; ++x) {
                        d_d[x] += (double)d_q[x] / lambda;
                    }
                    acc->lam[src] -= ((double)d_q[0] * qd[0] + (double)d_q[1] * qd[1] + (double)d_q[2] * qd[2]) / lambda;
                }
                if (d_I != 0) {
                    nbgi_ray_adjoint(&ray, d_d, 0, acc);
                }
            }
        }
    }
    double S = p->scale * (double)I;
    S *= capture;
    S *= polar;
    S *= omega;
    if (g == 0) {
        return S;
    }

    /* --- epilogue: the once-per-pixel factors -------------------------------------------------------------- */
    nbgi_pixel_factors_adjoint(p, &pf, (double)g, (double)I, (double)d_I, acc);
    return S;
}

