/*
 * jvp_tmpl.h -- forward-mode tangents (Jacobian-vector products) of one pixel: the same loop nest as
 * src/row_tmpl.h and grad/adjoint_tmpl.h, carrying, next to each forward quantity x, its tangents t_x along
 * nt parameter directions at once.  The directions enter as tangents of the plan-level quantities (detector
 * vectors, crystal vectors per phi step and domain, wavelengths, N, a*, K, scale, I_bg; see nbgi_plan_tangent).
 * Derivatives of the per-sample physics come from the same helpers the adjoint uses (src/physics_tmpl.h).
 *
 * Instantiated for NBG_R = double by grad/adjoint_cpu.c (the CPU's scalar twin of grad/jvp_row_tmpl.h) and by
 * cuda/backend.cu (the device's tangent kernel, a thread a pixel).
 */
#ifndef NBG_TMPL_OPEN
#error "jvp_tmpl.h is a template: instantiate it through tmpl_on.h / tmpl_off.h (see src/tmpl_on.h)"
#endif
#ifndef NBG_TMPL_HAS_ADJOINT
#error "jvp_tmpl.h needs adjoint_tmpl.h instantiated for the same type first"
#endif
#define NBG_TMPL_HAS_JVP 1

static inline NBG_HD void NBG_SFX(nbgi_ray_tangent)(const nbgi_ray * r, const nbgi_adjacc *t, NBG_R *dP,
                                                  NBG_R *dd, NBG_R *dR)
{
    /* P = Fdet f + Sdet s + Odet o + pix0;  R = |P|: dR = d . dP;  d = P / R: dd = (dP - d dR) / R */
    for (int x = 0; x < 3; ++x) {
        dP[x] = (NBG_R)(r->Fdet * t->f[x] + r->Sdet * t->s[x] + r->Odet * t->o[x] + t->pix0[x]);
    }
    *dR = r->d[0] * dP[0] + r->d[1] * dP[1] + r->d[2] * dP[2];
    for (int x = 0; x < 3; ++x) {
        dd[x] = (dP[x] - r->d[x] * *dR) / r->R;
    }
}

/* The once-per-pixel factors (solid angle, capture, polarization) of a pixel and their tangents along nt
 * directions; t_I receives the tangent of I_bg. */
static inline NBG_HD void NBG_SFX(nbgi_jvp_factors)(const nbgi_kparams *p, int fpixel, int spixel, const nbgi_adjacc *t,
                                                  int nt, NBG_R *omega_out, NBG_R *capture_out, NBG_R *polar_out,
                                                  NBG_R *t_om, NBG_R *t_cap, NBG_R *t_pol, NBG_R *t_I)
{
    NBG_R dP[3], dd[3], dR;
    nbgi_pixfactors pf; /* the factors and the rays they were taken on (grad/adjoint.h) */
    nbgi_pixel_factors(p, fpixel, spixel, &pf);
    const NBG_R omega = (NBG_R)pf.omega;
    /* the directions that move the detector: the others' ray tangents are zero, and so are their tangents of the
     * solid angle and the capture (a crystal's or a wavelength's: most of a refinement's) */
    int moves[NBG_JVP_MAX];
    for (int j = 0; j < nt; ++j) {
        moves[j] = nbgi_tangent_moves_detector(&t[j]);
        t_om[j] = 0;
        t_cap[j] = 0;
        t_pol[j] = 0;
        t_I[j] = (NBG_R)t[j].Ibg;
        if (!moves[j]) {
            continue;
        }
        /* omega(R, close): t_omega = d omega / dR * dR + omega / close * t_close (no close term for a point pixel) */
        NBG_SFX(nbgi_ray_tangent)(&pf.r_om, &t[j], dP, dd, &dR);
        t_om[j] = (NBG_R)nbgi_solid_angle_dR(p, pf.r_om.R, pf.omega) * dR +
                  (NBG_R)nbgi_solid_angle_dclose(p, pf.omega) * (NBG_R)t[j].close;
    }
    if (p->thick != 0) {
        const NBG_R a = (NBG_R)pf.cap_a, rho = (NBG_R)pf.rho;
        const NBG_R dcap_da = (NBG_R)nbgi_capture_da(p, p->thicksteps - 1, pf.cap_a);
        for (int j = 0; j < nt; ++j) {
            if (!moves[j]) {
                continue;
            }
            /* rho = d . o: t_rho = dd . o + d . t_o;  a (nbgi_capture's) = const / rho: t_a = -a t_rho / rho */
            NBG_SFX(nbgi_ray_tangent)(&pf.r_cap, &t[j], dP, dd, &dR);
            NBG_R trho = 0;
            for (int x = 0; x < 3; ++x) {
                trho += dd[x] * (NBG_R)p->odet[x] + pf.r_cap.d[x] * (NBG_R)t[j].o[x];
            }
            t_cap[j] = dcap_da * (-a * trho / rho);
        }
    }
    if (pf.pol_src >= 0) {
        const double *sr = p->src + NBG_SRC_STRIDE * pf.pol_src;
        double dP_dd[3], dP_dK;
        nbgi_polar_grad_d(p->polarization, sr, pf.r_pol.d, sr + 4, sr + 7, dP_dd, &dP_dK);
        for (int j = 0; j < nt; ++j) {
            if (!moves[j]) {
                t_pol[j] = (NBG_R)dP_dK * (NBG_R)t[j].K;
                continue;
            }
            NBG_SFX(nbgi_ray_tangent)(&pf.r_pol, &t[j], dP, dd, &dR);
            t_pol[j] = (NBG_R)dP_dd[0] * dd[0] + (NBG_R)dP_dd[1] * dd[1] + (NBG_R)dP_dd[2] * dd[2] +
                       (NBG_R)dP_dK * (NBG_R)t[j].K;
        }
    }
    *omega_out = omega;
    *capture_out = (NBG_R)pf.capture;
    *polar_out = (NBG_R)pf.polar;
}

static inline NBG_HD double NBG_SFX(nbgi_pixel_jvp)(const nbgi_kparams *p, int fpixel, int spixel,
                                                  const nbgi_adjacc *t, int nt, double *dS)
{
    const int os = p->oversample;
    const int nmat = p->nphi * p->nmos;
    const NBG_R scale = (NBG_R)p->scale;
    NBG_R dP[3], dR;
    NBG_R omega, capture, polar;
    NBG_R t_om[NBG_JVP_MAX], t_cap[NBG_JVP_MAX], t_pol[NBG_JVP_MAX], t_I[NBG_JVP_MAX];
    NBG_SFX(nbgi_jvp_factors)(p, fpixel, spixel, t, nt, &omega, &capture, &polar, t_om, t_cap, t_pol, t_I);

    /* --- main pass --------------------------------------------------------------------------------------- */
    NBG_R I = (NBG_R)p->I_bg;
    for (int tt = 0; tt < p->thicksteps; ++tt) {
        for (int subS = 0; subS < os; ++subS) {
            for (int subF = 0; subF < os; ++subF) {
                nbgi_ray ray;
                nbgi_ray_at(p, fpixel, spixel, subF, subS, tt, &ray);
                NBG_R t_d[NBG_JVP_MAX][3];
                for (int j = 0; j < nt; ++j) {
                    NBG_SFX(nbgi_ray_tangent)(&ray, &t[j], dP, t_d[j], &dR);
                }
                for (int src = 0; src < p->nsources; ++src) {
                    NBG_R q[3];
                    if (!nbgi_scatter_q(p, ray.d, src, q)) {
                        continue;
                    }
                    const NBG_R ilambda = 1 / (NBG_R)p->src[NBG_SRC_STRIDE * src + 3];
                    /* q = (d - i) / lambda: t_q = t_d / lambda - q t_lambda / lambda */
                    NBG_R t_q[NBG_JVP_MAX][3];
                    for (int j = 0; j < nt; ++j) {
                        for (int x = 0; x < 3; ++x) {
                            t_q[j][x] = t_d[j][x] * ilambda - q[x] * (NBG_R)t[j].lam[src] * ilambda;
                        }
                    }
                    for (int m = 0; m < nmat; ++m) {
                        const double *abc = p->abc + 9 * m;
                        NBG_R vtmp[9];
                        NBG_SFX(nbgi_sample) sm;
                        if (!NBG_SFX(nbgi_sample_eval)(p, NBG_SFX(nbgi_matrix)(p, m, vtmp), q, &sm)) {
                            continue;
                        }
                        I += sm.F * sm.F * sm.L * sm.L;
                        const NBG_R cF = 2 * sm.F * sm.L * sm.L, cL = 2 * sm.F * sm.F * sm.L;
                        for (int j = 0; j < nt; ++j) {
                            /* h = a . q: t_h = t_a . q + a . t_q */
                            const double *ta = t[j].abc + 9 * m;
                            NBG_R th[3];
                            for (int v = 0; v < 3; ++v) {
                                th[v] = (NBG_R)ta[3 * v] * q[0] + (NBG_R)ta[3 * v + 1] * q[1] +
                                        (NBG_R)ta[3 * v + 2] * q[2] + (NBG_R)abc[3 * v] * t_q[j][0] +
                                        (NBG_R)abc[3 * v + 1] * t_q[j][1] + (NBG_R)abc[3 * v + 2] * t_q[j][2];
                            }
                            NBG_R tL = sm.dLh[0] * th[0] + sm.dLh[1] * th[1] + sm.dLh[2] * th[2] +
                                       sm.dLN[0] * (NBG_R)t[j].N[0] + sm.dLN[1] * (NBG_R)t[j].N[1] +
                                       sm.dLN[2] * (NBG_R)t[j].N[2];
                            if (p->shape == NBG_GAUSS) {
                                for (int i = 0; i < 9; ++i) {
                                    tL += sm.dLast[i] * (NBG_R)t[j].astar[i];
                                }
                            }
                            const NBG_R tF = sm.dFh[0] * th[0] + sm.dFh[1] * th[1] + sm.dFh[2] * th[2];
                            t_I[j] += cF * tF + cL * tL;
                        }
                    }
                }
            }
        }
    }
    double S = p->scale * (double)I;
    S *= (double)capture;
    S *= (double)polar;
    S *= (double)omega;
    const NBG_R cpo = capture * polar * omega;
    for (int j = 0; j < nt; ++j) {
        /* S = scale I capture polar omega */
        dS[j] = (double)((NBG_R)t[j].scale * I * cpo +
                         scale * (t_I[j] * cpo + I * (t_cap[j] * polar * omega + capture * t_pol[j] * omega +
                                                      capture * polar * t_om[j])));
    }
    return S;
}

