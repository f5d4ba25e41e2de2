/*
 * pixel_tmpl.h -- the forward loop nest for one pixel, shared by the CPU and CUDA forward kernels; instantiated
 * by kernel.h for double (_d) and float (_f).  Do not include directly.
 *
 * For pixel (fpixel, spixel) it sums over sensor layers x subpixels x sources x phi steps x mosaic domains
 *     I = I_bg + sum F_cell^2 F_latt^2
 * and returns the photon count  r_e^2 fluence I / steps * capture * polar * omega,  where the last three factors
 * are nanoBragg's "once per pixel" values (taken at the first subpixel, the first source that survives the
 * resolution cut, and each layer's first subpixel) unless the -oversample_thick/_polar/_omega switches apply
 * them to the running sum after every term instead.  The adjoint twin, grad/adjoint_tmpl.h, keeps this loop
 * order and these names.
 *
 * Precision: the float kernel (_f) does the per-sample work (Miller indices, lattice and structure factors, the
 * sum) in float, and the geometry of each subpixel and source (position, direction, scattering vector, resolution
 * cut, solid angle, capture, polarization) in double, as the double kernel does.  That geometry runs once per
 * subpixel and source, not per sample, so it costs little; in float, d - i cancels at low angles and a pixel's
 * position is resolved to only ~1e-8 m, which moved the golden images by up to 2e-4 of their maximum and their
 * sums by 3e-5 (divergence_dispersion, dmin_cut); with double geometry the float images meet the golden criteria.
 * The geometry is src/geometry.h.
 */
#ifndef NBG_TMPL_OPEN
#error "pixel_tmpl.h is a template: instantiate it through tmpl_on.h / tmpl_off.h (see src/tmpl_on.h)"
#endif
#ifndef NBG_PHYSICS_H
#error "pixel_tmpl.h needs physics.h instantiated for the same type first"
#endif
#define NBG_TMPL_HAS_PIXEL 1

/* Statistics a pixel contributes: the sum of solid angles over subpixels and the count of interpolation
 * windows that left the table. */
typedef struct {
    double omega_sum;
    long oor;
} NBG_SFX(nbgi_pixstat);

/* sig, when not NULL, receives a signature of the discrete choices the pixel's samples make (rounded Miller
 * indices, interpolation windows, samples cut by dmin or zeroed by the tophat edge).  Where it differs between two
 * evaluations, the image is not differentiable between them; the gradient check leaves such pixels out.  The
 * kernels pass a constant NULL, which folds the signature away. */
static inline NBG_HD double NBG_SFX(nbgi_pixel)(const nbgi_kparams *p, int fpixel, int spixel,
                                              NBG_SFX(nbgi_pixstat) * st, uint64_t *sig)
{
    const int os = p->oversample;
    const int nmat = p->nphi * p->nmos;
    const double K = p->polarization;
    uint64_t hash = 1469598103934665603ULL; /* FNV-1a over the choices */
#define NBG_MIX(v) (hash = (hash ^ (uint64_t)(int64_t)(v)) * 1099511628211ULL)
    NBG_R I = (NBG_R)p->I_bg;
    double polar = p->nopolar ? 1 : 0;
    double omega = 0;
    double capture = 0;

    for (int t = 0; t < p->thicksteps; ++t) {
        capture = (p->thick == 0) ? 1 : 0;
        for (int subS = 0; subS < os; ++subS) {
            for (int subF = 0; subF < os; ++subF) {
                double P[3];
                nbgi_subpixel_pos(p, fpixel, spixel, subF, subS, t, P);
                const double R = sqrt(P[0] * P[0] + P[1] * P[1] + P[2] * P[2]);
                const double d[3] = {P[0] / R, P[1] / R, P[2] / R};

                /* the once-per-pixel factors: solid angle, then this layer's capture fraction */
                if (omega == 0 || p->os_omega) {
                    omega = nbgi_solid_angle(p, R);
                }
                st->omega_sum += omega;
                if (capture == 0 || p->os_thick) {
                    double a;
                    capture = nbgi_capture(p, t, d[0] * p->odet[0] + d[1] * p->odet[1] + d[2] * p->odet[2], &a);
                }

                for (int src = 0; src < p->nsources; ++src) {
                    const double *sr = p->src + NBG_SRC_STRIDE * src;
                    double qd[3];
                    if (!nbgi_scatter_q(p, d, src, qd)) {
                        if (sig != NULL) {
                            NBG_MIX(-7);
                        }
                        continue;
                    }
                    if (polar == 0 || p->os_polar) {
                        polar = nbgi_polar_d(K, sr, d, sr + 4, sr + 7);
                    }
                    const NBG_R q[3] = {(NBG_R)qd[0], (NBG_R)qd[1], (NBG_R)qd[2]};
                    for (int m = 0; m < nmat; ++m) {
                        const double *abc = p->abc + 9 * m;
                        NBG_R hkl[3];
                        NBG_SFX(nbgi_miller)(abc, q, hkl);
                        const NBG_R h = hkl[0], k = hkl[1], l = hkl[2];
                        const NBG_R h0 = NBG_SFX(nbgi_round_index)(h);
                        const NBG_R k0 = NBG_SFX(nbgi_round_index)(k);
                        const NBG_R l0 = NBG_SFX(nbgi_round_index)(l);
                        const NBG_R F_latt = NBG_SFX(nbgi_lattice)(p, h, k, l, h0, k0, l0);
                        if (sig != NULL) {
                            NBG_MIX(h0);
                            NBG_MIX(k0);
                            NBG_MIX(l0);
                            if (p->interpolate) {
                                NBG_MIX(NBG_M(floor)(h));
                                NBG_MIX(NBG_M(floor)(k));
                                NBG_MIX(NBG_M(floor)(l));
                            }
                            if (p->shape == NBG_TOPHAT) {
                                NBG_MIX(F_latt == 0);
                            }
                        }
                        if (F_latt == 0 && !p->water) {
                            continue;
                        }
                        const NBG_R F_cell =
                            NBG_SFX(nbgi_fcell)(p, h, k, l, (int)h0, (int)k0, (int)l0, &st->oor);
                        I += F_cell * F_cell * F_latt * F_latt;
                        if (p->os_thick) {
                            I *= (NBG_R)capture;
                        }
                        if (p->os_polar) {
                            I *= (NBG_R)polar;
                        }
                        if (p->os_omega) {
                            I *= (NBG_R)omega;
                        }
                    }
                }
            }
        }
    }
    double S = p->scale * (double)I;
    if (!p->os_thick) {
        S *= capture;
    }
    if (!p->os_polar) {
        S *= polar;
    }
    if (!p->os_omega) {
        S *= omega;
    }
    if (sig != NULL) {
        *sig = hash;
    }
#undef NBG_MIX
    return S;
}
