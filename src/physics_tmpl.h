/*
 * physics_tmpl.h -- per-sample physics, instantiated by physics.h for NBG_R = double (suffix _d) and
 * NBG_R = float (suffix _f).  Do not include directly.
 */
#ifdef NBG_FLOAT_MODE
#define NBG_M(fn) fn##f
#else
#define NBG_M(fn) fn
#endif

typedef NBG_R NBG_SFX(nbg_real);

/* sin(pi x) with the argument reduced to [-1/2, 1/2] exactly (x - rint(x) is exact in binary floating point),
 * then an odd Taylor polynomial: truncation below 1e-20 in double (degree 23), below 1e-9 in float (degree 15). */
static inline NBG_HD NBG_R NBG_SFX(nbg_sinpi)(NBG_R x)
{
    const NBG_R n = NBG_M(rint)(x);
    const NBG_R d = x - n;
    const NBG_R y = (NBG_R)(M_PI * M_PI) * d * d;
    NBG_R s;
#ifdef NBG_FLOAT_MODE
    s = 1.0f - y * (1.0f / 210.0f);
    s = 1.0f - y * (1.0f / 156.0f) * s;
    s = 1.0f - y * (1.0f / 110.0f) * s;
    s = 1.0f - y * (1.0f / 72.0f) * s;
    s = 1.0f - y * (1.0f / 42.0f) * s;
    s = 1.0f - y * (1.0f / 20.0f) * s;
    s = 1.0f - y * (1.0f / 6.0f) * s;
#else
    /* nested form of sin(u)/u = sum (-1)^k u^2k / (2k+1)!, u = pi d: each level divides by (2k)(2k+1) */
    s = 1.0 - y * (1.0 / 506.0);
    s = 1.0 - y * (1.0 / 420.0) * s;
    s = 1.0 - y * (1.0 / 342.0) * s;
    s = 1.0 - y * (1.0 / 272.0) * s;
    s = 1.0 - y * (1.0 / 210.0) * s;
    s = 1.0 - y * (1.0 / 156.0) * s;
    s = 1.0 - y * (1.0 / 110.0) * s;
    s = 1.0 - y * (1.0 / 72.0) * s;
    s = 1.0 - y * (1.0 / 42.0) * s;
    s = 1.0 - y * (1.0 / 20.0) * s;
    s = 1.0 - y * (1.0 / 6.0) * s;
#endif
    s *= (NBG_R)M_PI * d;
    /* (-1)^n: n is an integer-valued float. */
    const NBG_R half = n * (NBG_R)0.5;
    return (half != NBG_M(floor)(half)) ? -s : s;
}

/* cos(pi x) = sin(pi (x + 1/2)), with the shift applied after reduction to keep it exact. */
static inline NBG_HD NBG_R NBG_SFX(nbg_cospi)(NBG_R x)
{
    const NBG_R n = NBG_M(rint)(x);
    return NBG_SFX(nbg_sinpi)((x - n) + (NBG_R)0.5) * ((n * (NBG_R)0.5 != NBG_M(floor)(n * (NBG_R)0.5)) ? -1 : 1);
}

/* Lattice factor of N cells along one axis: sin(N pi h) / sin(pi h), evaluated at d = h - rint(h) (see
 * physics.h); equal to N where sin(pi d) = 0. */
static inline NBG_HD NBG_R NBG_SFX(nbg_sincg)(NBG_R h, NBG_R N)
{
    const NBG_R d = h - NBG_M(rint)(h);
    const NBG_R s = NBG_SFX(nbg_sinpi)(d);
    if (s == 0) {
        return N;
    }
    return NBG_SFX(nbg_sinpi)(N * d) / s;
}

/* 3 (sin x / x - cos x) / x^2, the transform of a sphere; a series near 0 avoids the cancellation. */
static inline NBG_HD NBG_R NBG_SFX(nbg_sinc3)(NBG_R x)
{
    const NBG_R x2 = x * x;
    if (NBG_M(fabs)(x) < (NBG_R)0.05) {
        return 1 - x2 / 10 + x2 * x2 / 280 - x2 * x2 * x2 / 15120;
    }
    return 3 * (NBG_M(sin)(x) / x - NBG_M(cos)(x)) / x2;
}

/* Crystal-shape lattice factor at fractional Miller indices (h, k, l); (h0, k0, l0) are the nearest integers as
 * nanoBragg rounds them, ceil(x - 1/2). */
static inline NBG_HD NBG_R NBG_SFX(nbg_lattice)(const nbg_kparams *p, NBG_R h, NBG_R k, NBG_R l, NBG_R h0, NBG_R k0,
                                               NBG_R l0)
{
    const NBG_R Na = (NBG_R)p->Na, Nb = (NBG_R)p->Nb, Nc = (NBG_R)p->Nc;
    if (p->shape == NBG_SQUARE) {
        return NBG_SFX(nbg_sincg)(h, Na) * NBG_SFX(nbg_sincg)(k, Nb) * NBG_SFX(nbg_sincg)(l, Nc);
    }
    const NBG_R dh = h - h0, dk = k - k0, dl = l - l0;
    const NBG_R NNN = Na * Nb * Nc;
    if (p->shape == NBG_ROUND) {
        const NBG_R hrad2 = dh * dh * Na * Na + dk * dk * Nb * Nb + dl * dl * Nc * Nc;
        return NNN * (NBG_R)NBG_ROUND_SCALE *
               NBG_SFX(nbg_sinc3)((NBG_R)M_PI * NBG_M(sqrt)(hrad2 * (NBG_R)p->fudge));
    }
    /* gauss and tophat: distance from the nearest node in reciprocal space (1/A), times N^3 */
    const double *s = p->astar;
    const NBG_R x = dh * (NBG_R)s[0] + dk * (NBG_R)s[3] + dl * (NBG_R)s[6];
    const NBG_R y = dh * (NBG_R)s[1] + dk * (NBG_R)s[4] + dl * (NBG_R)s[7];
    const NBG_R z = dh * (NBG_R)s[2] + dk * (NBG_R)s[5] + dl * (NBG_R)s[8];
    const NBG_R r2 = (x * x + y * y + z * z) * NNN * NNN;
    if (p->shape == NBG_GAUSS) {
        return NNN * NBG_M(exp)(-(r2 / (NBG_R)0.63 * (NBG_R)p->fudge));
    }
    return (r2 * (NBG_R)p->fudge < (NBG_R)0.3969) ? NNN : 0;
}

/* Kahn polarization factor for incident direction i, diffracted direction d (unit vectors), with the source's
 * E_in and B_in (unit vectors spanning the plane normal to i; B_in = unit(p x i), E_in = unit(i x B_in)):
 *     P = (1 + cos^2 2theta - K cos(2 psi) sin^2 2theta) / 2,   psi = -atan2(d.B_in, d.E_in).
 * cos(2 psi) = (x^2 - y^2) / (x^2 + y^2) with x = d.E_in, y = d.B_in, and 1 where both vanish (d along i),
 * which is atan2(0, 0) = 0: no trigonometric call. */
static inline NBG_HD NBG_R NBG_SFX(nbg_polar)(NBG_R K, const NBG_R *i, const NBG_R *d, const NBG_R *E,
                                             const NBG_R *B)
{
    const NBG_R c2t = i[0] * d[0] + i[1] * d[1] + i[2] * d[2];
    const NBG_R s2t2 = 1 - c2t * c2t;
    NBG_R c2psi = 1;
    if (K != 0) {
        const NBG_R x = d[0] * E[0] + d[1] * E[1] + d[2] * E[2];
        const NBG_R y = d[0] * B[0] + d[1] * B[1] + d[2] * B[2];
        const NBG_R r2 = x * x + y * y;
        c2psi = (r2 > 0) ? (x * x - y * y) / r2 : 1;
    }
    return (NBG_R)0.5 * (1 + c2t * c2t - K * c2psi * s2t2);
}

/* Four-point Lagrange weights at t in [1, 2) for nodes 0, 1, 2, 3 (tricubic interpolation is their tensor
 * product, which equals nanoBragg's nested polint, a Lagrange, not spline, interpolation). */
static inline NBG_HD void NBG_SFX(nbg_lagrange4)(NBG_R t, NBG_R *w)
{
    const NBG_R t0 = t, t1 = t - 1, t2 = t - 2, t3 = t - 3;
    w[0] = -t1 * t2 * t3 / 6;
    w[1] = t0 * t2 * t3 / 2;
    w[2] = -t0 * t1 * t3 / 2;
    w[3] = t0 * t1 * t2 / 6;
}

/* Structure factor at fractional (h, k, l) with nearest integers (h0, k0, l0).  Tricubic interpolation when it is
 * on and the 4x4x4 window lies inside the table; otherwise the nearest entry, or default_F outside the table.
 * *oor is incremented when an interpolation window left the table (nanoBragg then falls back in the same way,
 * but also switches interpolation off for the rest of the run, which depends on thread scheduling). */
static inline NBG_HD NBG_R NBG_SFX(nbg_fcell)(const nbg_kparams *p, NBG_R h, NBG_R k, NBG_R l, int h0, int k0,
                                             int l0, long *oor)
{
    if (p->F == 0) {
        return (NBG_R)p->default_F;
    }
    if (p->interpolate) {
        /* nanoBragg's window test on the fractional indices */
        if (h - p->h_min + 3 > p->nh || h - 2 < p->h_min || k - p->k_min + 3 > p->nk || k - 2 < p->k_min ||
            l - p->l_min + 3 > p->nl || l - 2 < p->l_min) {
            ++*oor;
        } else {
            const int hf = (int)NBG_M(floor)(h), kf = (int)NBG_M(floor)(k), lf = (int)NBG_M(floor)(l);
            NBG_R wh[4], wk[4], wl[4];
            NBG_SFX(nbg_lagrange4)(h - (NBG_R)(hf - 1), wh);
            NBG_SFX(nbg_lagrange4)(k - (NBG_R)(kf - 1), wk);
            NBG_SFX(nbg_lagrange4)(l - (NBG_R)(lf - 1), wl);
            NBG_R F = 0;
            for (int a = 0; a < 4; ++a) {
                NBG_R Fk = 0;
                for (int b = 0; b < 4; ++b) {
                    const double *row =
                        p->F + ((long)(hf - 1 + a - p->h_min) * p->nk + (kf - 1 + b - p->k_min)) * p->nl +
                        (lf - 1 - p->l_min);
                    const NBG_R Fl = wl[0] * (NBG_R)row[0] + wl[1] * (NBG_R)row[1] + wl[2] * (NBG_R)row[2] +
                                     wl[3] * (NBG_R)row[3];
                    Fk += wk[b] * Fl;
                }
                F += wh[a] * Fk;
            }
            return F;
        }
    }
    const int ih = h0 - p->h_min, ik = k0 - p->k_min, il = l0 - p->l_min;
    if (ih >= 0 && ih < p->nh && ik >= 0 && ik < p->nk && il >= 0 && il < p->nl) {
        return (NBG_R)p->F[((long)ih * p->nk + ik) * p->nl + il];
    }
    return (NBG_R)p->default_F;
}

/* Rodrigues rotation of v about a unit axis by angle phi (radians). */
static inline NBG_HD void NBG_SFX(nbg_rotate_axis)(const NBG_R *v, const NBG_R *ax, NBG_R phi, NBG_R *out)
{
    const NBG_R c = NBG_M(cos)(phi), s = NBG_M(sin)(phi);
    const NBG_R dot = (ax[0] * v[0] + ax[1] * v[1] + ax[2] * v[2]) * (1 - c);
    const NBG_R x = v[0], y = v[1], z = v[2];
    out[0] = x * c + (ax[1] * z - ax[2] * y) * s + ax[0] * dot;
    out[1] = y * c + (ax[2] * x - ax[0] * z) * s + ax[1] * dot;
    out[2] = z * c + (ax[0] * y - ax[1] * x) * s + ax[2] * dot;
}

#undef NBG_M
