/*
 * physics_tmpl.h -- per-sample physics, instantiated by physics.h for NBG_R = double (suffix _d) and
 * NBG_R = float (suffix _f).  Do not include directly.
 */
#ifndef NBG_TMPL_OPEN
#error "physics_tmpl.h is a template: instantiate it through tmpl_on.h / tmpl_off.h (see src/tmpl_on.h)"
#endif
#define NBG_TMPL_HAS_PHYSICS 1

typedef NBG_R NBG_SFX(nbgi_real);

/* sin(pi x) with the argument reduced to [-1/2, 1/2] exactly (x - rint(x) is exact in binary floating point),
 * then an odd Taylor polynomial: truncation below 1e-20 in double (degree 23), below 1e-9 in float (degree 15). */
static inline NBG_HD NBG_R NBG_SFX(nbgi_sinpi_reduced)(NBG_R d);

/* (-1)^n for an integer-valued n: the sign of sin(pi x) and cos(pi x) after x is reduced by n */
static inline NBG_HD NBG_R NBG_SFX(nbgi_parity_sign)(NBG_R n)
{
    const NBG_R half = n * (NBG_R)0.5;
    return (half != NBG_M(floor)(half)) ? -1 : 1;
}

static inline NBG_HD NBG_R NBG_SFX(nbgi_sinpi)(NBG_R x)
{
    const NBG_R n = NBG_M(rint)(x);
    return NBG_SFX(nbgi_parity_sign)(n) * NBG_SFX(nbgi_sinpi_reduced)(x - n);
}

/* sin(pi d) for |d| <= 1/2 (an argument already reduced). */
static inline NBG_HD NBG_R NBG_SFX(nbgi_sinpi_reduced)(NBG_R d)
{
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
    return s * ((NBG_R)M_PI * d);
}

/* cos(pi x) = sin(pi (x + 1/2)), with the shift applied after reduction to keep it exact. */
static inline NBG_HD NBG_R NBG_SFX(nbgi_cospi)(NBG_R x)
{
    const NBG_R n = NBG_M(rint)(x);
    return NBG_SFX(nbgi_sinpi)((x - n) + (NBG_R)0.5) * NBG_SFX(nbgi_parity_sign)(n);
}

/* cos(pi d) for |d| <= 1/2: 1 - y / 2 + y^2 r(y) in y = (pi d)^2, Horner's form, one fused multiply-add a term;
 * exact at d = 0.  r is fitted for the least largest error on |d| <= 1/2 (src/fitpoly.py: Lawson's iteration in
 * 50 digits, then the coefficients rounded).  In double r of degree 6, largest error 1.3e-17 (an eighth of double's
 * ulp at 1); it replaced the Taylor polynomial of degree 24 (truncation 1e-19): four multiply-adds fewer in the
 * lattice factor's every axis and sample (heavy512's double forward 18 % faster, tric1k's 13 %).  In float r of
 * degree 3, largest error 5.8e-9 with float's coefficients, against 7.0e-9 for the Taylor polynomial of degree 14 it
 * replaced with float's (both under float's half-ulp at 1, 6e-8): two fewer (heavy512's float forward 10 % faster).
 * tests/test-grad.c (grad-0-poly) checks both against long double's cosl.  (Before the Taylor polynomials it was the
 * nested form 1 - y / ((2k-1) 2k) (...), a multiply and a multiply-add a term.) */
static inline NBG_INLINE NBG_HD NBG_R NBG_SFX(nbgi_cospi_scaled)(NBG_R d, const NBG_R t)
{
    /* t cos(pi d), t = 1 or 2 (a constant at every call): every coefficient times t, exact, so each multiply-add's
     * result is t times nbgi_cospi_reduced's and 2 cos(pi d) comes out the same bits as 2 * cos(pi d), one operation
     * fewer (the forward's recurrence takes 2c: an add an axis and sample, 5 % of heavy256's vector operations) */
    const NBG_R y = (NBG_R)(M_PI * M_PI) * d * d;
#ifdef NBG_FLOAT_MODE
    NBG_R c = t * -2.619380837e-07f;
    c = t * 2.476930422e-05f + y * c;
    c = t * -1.388856908e-03f + y * c;
    c = t * 4.166665673e-02f + y * c;
    c = t * -0.5f + y * c;
    return t + y * c;
#else
    NBG_R c = t * 4.6161346348811036e-14;
    c = t * -1.1463635397157698e-11 + y * c;
    c = t * 2.0876592590929173e-09 + y * c;
    c = t * -2.7557317068479356e-07 + y * c;
    c = t * 2.480158728578357e-05 + y * c;
    c = t * -0.0013888888888830048 + y * c;
    c = t * 0.04166666666666583 + y * c;
    c = t * -0.5 + y * c;
    return t + y * c;
#endif
}

/* cos(pi d), |d| <= 1/2 (the polynomial above) */
static inline NBG_INLINE NBG_HD NBG_R NBG_SFX(nbgi_cospi_reduced)(NBG_R d)
{
    return NBG_SFX(nbgi_cospi_scaled)(d, 1);
}

/* 2 cos(pi d), |d| <= 1/2: 2 * nbgi_cospi_reduced(d) bit for bit (tests/test-grad.c, grad-0-poly) */
static inline NBG_INLINE NBG_HD NBG_R NBG_SFX(nbgi_cospi2_reduced)(NBG_R d)
{
    return NBG_SFX(nbgi_cospi_scaled)(d, 2);
}

/* P(y) with sin(pi d) = pi d P(y), y = (pi d)^2, |d| <= 1/2, in Horner form, one fused multiply-add a term.  In
 * double 1 - y / 6 + y^2 s(y) (1/6 rounded to double) with s of degree 6 fitted as nbgi_cospi_reduced's r (largest
 * error 6.1e-19; it replaced the Taylor series to degree 20, truncation 2e-18: two multiply-adds fewer, heavy256's
 * gradient 9 % faster); in float the Taylor series to degree 14 (truncation 1e-11).  For the
 * derivatives (nbgi_sincg_grad_int and its lane form), which need the sine besides the forward's cosine; the
 * forward's nbgi_sinpi_reduced keeps its nested form (and its images their bits). */
static inline NBG_INLINE NBG_HD NBG_R NBG_SFX(nbgi_sinpi_poly)(NBG_R y)
{
#ifdef NBG_FLOAT_MODE
    NBG_R P = -1.0f / 1307674368000.0f;
    P = 1.0f / 6227020800.0f + y * P;
    P = -1.0f / 39916800.0f + y * P;
    P = 1.0f / 362880.0f + y * P;
    P = -1.0f / 5040.0f + y * P;
    P = 1.0f / 120.0f + y * P;
    P = -1.0f / 6.0f + y * P;
    return 1.0f + y * P;
#else
    NBG_R P = 2.72226050537172e-15;
    P = -7.643098133993465e-13 + y * P;
    P = 1.6058943952413938e-10 + y * P;
    P = -2.505210696051607e-08 + y * P;
    P = 2.7557319212134097e-06 + y * P;
    P = -0.00019841269841215287 + y * P;
    P = 0.008333333333333212 + y * P;
    P = -1.0 / 6.0 + y * P;
    return 1.0 + y * P;
#endif
}

/* Lattice factor of N cells along one axis: sin(N pi h) / sin(pi h), evaluated at d = h - rint(h) (see
 * physics.h); equal to N where sin(pi d) = 0.  For a small integer N (Ni = N, else 0) it is the Chebyshev
 * polynomial U_{N-1}(cos(pi d)), by the recurrence U_{k+1} = 2c U_k - U_{k-1}: one polynomial instead of two,
 * no division, and exact at d = 0. */
static inline NBG_HD NBG_R NBG_SFX(nbgi_sincg_int)(NBG_R h, int Ni)
{
    const NBG_R d = h - NBG_M(rint)(h);
    const NBG_R c2 = NBG_SFX(nbgi_cospi2_reduced)(d);
    NBG_R u0 = 1, u1 = c2;
    if (Ni == 1) {
        return 1;
    }
    for (int k = 2; k < Ni; ++k) {
        const NBG_R u2 = c2 * u1 - u0;
        u0 = u1;
        u1 = u2;
    }
    return u1;
}

static inline NBG_HD NBG_R NBG_SFX(nbgi_sincg)(NBG_R h, NBG_R N)
{
    const NBG_R d = h - NBG_M(rint)(h);
    const NBG_R s = NBG_SFX(nbgi_sinpi)(d);
    if (s == 0) {
        return N;
    }
    return NBG_SFX(nbgi_sinpi)(N * d) / s;
}

/* sin(pi r) and cos(pi r) for finite r: r = n + d with n = rint(r) and d exact, |d| <= 1/2, then the reduced
 * polynomials (nbgi_sinpi_poly, nbgi_cospi_reduced) and the sign (-1)^n.  No library call and no branch, so that a
 * lane loop of it vectorises (the round shape's lattice factor, nbgi_sinc3pi_grad). */
static inline NBG_INLINE NBG_HD void NBG_SFX(nbgi_sincospi)(NBG_R r, NBG_R *s, NBG_R *c)
{
    const NBG_R n = NBG_M(rint)(r);
    const NBG_R d = r - n;
    const NBG_R sg = NBG_SFX(nbgi_parity_sign)(n);
    *s = sg * (((NBG_R)M_PI * d) * NBG_SFX(nbgi_sinpi_poly)((NBG_R)(M_PI * M_PI) * d * d));
    *c = sg * NBG_SFX(nbgi_cospi_reduced)(d);
}

/* G = sinc3(x) = 3 (sin x / x - cos x) / x^2 at x = pi r, r >= 0 (the transform of a sphere: the round shape), and
 * dG/du in u = x^2 = (pi r)^2, dG/du = sinc3'(x) / (2 x), sinc3'(x) = 3 sin x / x^2 - 3 G / x; near 0, where the
 * closed forms cancel, their series.  The sine and cosine from nbgi_sincospi, and both forms computed and one taken
 * (a select, not a branch): a lane loop of it vectorises, where the library's sin and cos were two calls a lane and
 * sample (-round_xtal rendered 2.3x slower than the square shape, its gradient 4x). */
static inline NBG_INLINE NBG_HD NBG_R NBG_SFX(nbgi_sinc3pi_grad)(NBG_R r, NBG_R *dG)
{
    const NBG_R x = (NBG_R)M_PI * r, x2 = x * x;
    NBG_R s, c;
    NBG_SFX(nbgi_sincospi)(r, &s, &c);
    const int near = x < (NBG_R)0.05;
    const NBG_R G = near ? 1 - x2 / 10 + x2 * x2 / 280 - x2 * x2 * x2 / 15120 : 3 * (s / x - c) / x2;
    *dG = near ? -(NBG_R)1 / 10 + x2 / 140 - x2 * x2 / 5040 + x2 * x2 * x2 / 332640
               : (3 * s / x2 - 3 * G / x) / (2 * x);
    return G;
}

/* The round shape's lattice factor L = NNN C sinc3(pi r), r = sqrt(fudge hrad2), hrad2 = sum dv_i^2 N_i^2 (dv the
 * indices' offsets from the nearest node), and its partials in (h, k, l) and in (Na, Nb, Nc): nbgi_lattice's L bit for
 * bit.  Forced inline, the plan's values as arguments (a load through the plan in a lane loop that stores stops GCC
 * vectorising it) and each partial through a pointer of its own (into a lane array: a local array of three, private
 * to each lane, was a scatter store), so that the row adjoints' lane loops of it vectorise. */
static inline NBG_INLINE NBG_HD NBG_R NBG_SFX(nbgi_round_grad)(NBG_R Na, NBG_R Nb, NBG_R Nc, NBG_R fudge, NBG_R dh,
                                                              NBG_R dk, NBG_R dl, NBG_R *dLh, NBG_R *dLk, NBG_R *dLl,
                                                              NBG_R *dNa, NBG_R *dNb, NBG_R *dNc)
{
    const NBG_R NNN = Na * Nb * Nc;
    const NBG_R hrad2 = dh * dh * Na * Na + dk * dk * Nb * Nb + dl * dl * Nc * Nc;
    NBG_R dG;
    const NBG_R G = NBG_SFX(nbgi_sinc3pi_grad)(NBG_M(sqrt)(hrad2 * fudge), &dG);
    const NBG_R L = NNN * (NBG_R)NBG_ROUND_SCALE * G;
    /* dL/dhrad2 = NNN C dG/du du/dhrad2, u = pi^2 fudge hrad2 */
    const NBG_R dL_dhrad2 = NNN * (NBG_R)NBG_ROUND_SCALE * dG * ((NBG_R)(M_PI * M_PI) * fudge);
    *dLh = dL_dhrad2 * 2 * dh * Na * Na;
    *dLk = dL_dhrad2 * 2 * dk * Nb * Nb;
    *dLl = dL_dhrad2 * 2 * dl * Nc * Nc;
    *dNa = L / Na + dL_dhrad2 * 2 * dh * dh * Na;
    *dNb = L / Nb + dL_dhrad2 * 2 * dk * dk * Nb;
    *dNc = L / Nc + dL_dhrad2 * 2 * dl * dl * Nc;
    return L;
}

/* exp(x) in the kernel's type, for the gauss shape: x = k ln 2 + r (k = rint(x / ln 2), ln 2 in two parts, |r| <=
 * ln 2 / 2), e^r by its Taylor polynomial (degree 13 in double, truncation 4e-18; 7 in float, 5e-9: under half an ulp
 * at 1 either way), times 2^k built from its bits in two factors 2^k1 2^k2 (k1 = floor(k / 2)), so that results in the
 * subnormal range round once and those past the largest finite one are infinite; 0 below the least subnormal's
 * logarithm, NaN for NaN.  Within 0.87 ulp of the exact value in double, 0.85 in float (tests/test-grad.c:
 * grad-0-exp, against expl), and written in the kernels' arithmetic alone: the CPU's lane loops vectorise it (the
 * library's exp, called a lane at a time, made the gauss forward twice the square shape's), and the device and every
 * lane width give the same bits. */
static inline NBG_INLINE NBG_HD NBG_R NBG_SFX(nbgi_exp)(NBG_R x)
{
#ifdef NBG_FLOAT_MODE
    typedef uint32_t bits_t;
    const NBG_R lo = -104.0f, hi = 88.73f, log2e = 1.44269504f, ln2hi = 0.693145751953125f, ln2lo = 1.42860677e-06f;
    const NBG_R magic = 12582912.0f; /* 1.5 2^23: an integer below 2^22 added to it lies in its last bits */
    enum { BIAS = 127, SHIFT = 23 };
#else
    typedef uint64_t bits_t;
    const NBG_R lo = -745.2, hi = 709.8, log2e = 1.4426950408889634, ln2hi = 6.93147180369123816490e-01,
                ln2lo = 1.90821492927058770002e-10;
    const NBG_R magic = 6755399441055744.0; /* 1.5 2^52 */
    enum { BIAS = 1023, SHIFT = 52 };
#endif
    const NBG_R xc = x < lo ? lo : (x > hi ? hi : x); /* NaN stays NaN */
    const NBG_R k = NBG_M(rint)(xc * log2e);
    const NBG_R r = NBG_M(fma)(-k, ln2lo, NBG_M(fma)(-k, ln2hi, xc));
#ifdef NBG_FLOAT_MODE
    NBG_R e = 1.0f / 5040.0f;
    e = 1.0f / 720.0f + r * e;
    e = 1.0f / 120.0f + r * e;
    e = 1.0f / 24.0f + r * e;
#else
    NBG_R e = 1.0 / 6227020800.0;
    e = 1.0 / 479001600.0 + r * e;
    e = 1.0 / 39916800.0 + r * e;
    e = 1.0 / 3628800.0 + r * e;
    e = 1.0 / 362880.0 + r * e;
    e = 1.0 / 40320.0 + r * e;
    e = 1.0 / 5040.0 + r * e;
    e = 1.0 / 720.0 + r * e;
    e = 1.0 / 120.0 + r * e;
    e = 1.0 / 24.0 + r * e;
#endif
    e = (NBG_R)(1.0 / 6.0) + r * e;
    e = (NBG_R)0.5 + r * e;
    e = 1 + r * e;
    e = 1 + r * e;
    /* 2^k1 and 2^k2: each biased exponent (k / 2 + BIAS, within 52 .. 191 in float, 485 .. 1535 in double) in the
     * low bits of magic + it, shifted into the exponent's field */
    const NBG_R k1 = NBG_M(floor)(k * (NBG_R)0.5), k2 = k - k1;
    const NBG_R b1 = k1 + (NBG_R)BIAS + magic, b2 = k2 + (NBG_R)BIAS + magic;
    bits_t u1, u2;
    memcpy(&u1, &b1, sizeof u1);
    memcpy(&u2, &b2, sizeof u2);
    u1 <<= SHIFT;
    u2 <<= SHIFT;
    NBG_R s1, s2;
    memcpy(&s1, &u1, sizeof s1);
    memcpy(&s2, &u2, sizeof s2);
    const NBG_R v = e * s1 * s2;
    return x < lo ? 0 : v;
}

/* The reciprocal axes a*, b*, c* (the plan's astar) in the kernel's type, into s[9]: the gauss and tophat shapes'
 * (nbgi_gauss_tophat, nbgi_gauss_grad), in a local array, whose lane loops read it as constants. */
static inline NBG_HD void NBG_SFX(nbgi_astar)(const nbgi_kparams *p, NBG_R s[9])
{
    for (int i = 0; i < 9; ++i) {
        s[i] = (NBG_R)p->astar[i];
    }
}

/* r2 = |v|^2 NNN^2, v = dh a* + dk b* + dl c* (s: a*, b*, c*), the gauss and tophat shapes' squared distance, with v
 * into (*vx, *vy, *vz).  Every sum of products an explicit multiply-add, so that the scalar calls and the CPU's lane
 * loops round alike; scalars, not an array (a local array in an `omp simd` loop is not vectorised). */
static inline NBG_INLINE NBG_HD NBG_R NBG_SFX(nbgi_gauss_r2)(NBG_R NNN, const NBG_R *s, NBG_R dh, NBG_R dk, NBG_R dl,
                                                            NBG_R *vx, NBG_R *vy, NBG_R *vz)
{
    const NBG_R x = NBG_M(fma)(dl, s[6], NBG_M(fma)(dk, s[3], dh * s[0]));
    const NBG_R y = NBG_M(fma)(dl, s[7], NBG_M(fma)(dk, s[4], dh * s[1]));
    const NBG_R z = NBG_M(fma)(dl, s[8], NBG_M(fma)(dk, s[5], dh * s[2]));
    *vx = x;
    *vy = y;
    *vz = z;
    return NBG_M(fma)(z, z, NBG_M(fma)(y, y, x * x)) * NNN * NNN;
}

/* The gauss shape's L = NNN exp(-r2 fudge / 0.63) (as nbgi_gauss_tophat: the same bits) with its partials in h, k, l
 * (dLh ..) and in Na, Nb, Nc (dNa ..); *g = 2 NNN^2 dL/dr2 and v (*v0 ..) give the partials in a*, b*, c*:
 * dL/d s[3 i + x] = g dv_i v_x.  Values only and each output through its own pointer, for the lane loops of the
 * adjoint and tangent rows as for nbgi_lattice_grad. */
static inline NBG_INLINE NBG_HD NBG_R NBG_SFX(nbgi_gauss_grad)(NBG_R Na, NBG_R Nb, NBG_R Nc, NBG_R fudge, const NBG_R *s,
                                                              NBG_R dh, NBG_R dk, NBG_R dl, NBG_R *dLh, NBG_R *dLk,
                                                              NBG_R *dLl, NBG_R *dNa, NBG_R *dNb, NBG_R *dNc, NBG_R *g,
                                                              NBG_R *v0, NBG_R *v1, NBG_R *v2)
{
    const NBG_R NNN = Na * Nb * Nc;
    NBG_R x, y, z;
    const NBG_R r2 = NBG_SFX(nbgi_gauss_r2)(NNN, s, dh, dk, dl, &x, &y, &z);
    const NBG_R L = NNN * NBG_SFX(nbgi_exp)(-(r2 / (NBG_R)0.63 * fudge));
    const NBG_R dL_dr2 = L * (-fudge / (NBG_R)0.63);
    const NBG_R gg = dL_dr2 * 2 * NNN * NNN;
    /* dL/dh_i = g (v . s_i), s_i the i-th reciprocal axis */
    *dLh = gg * NBG_M(fma)(z, s[2], NBG_M(fma)(y, s[1], x * s[0]));
    *dLk = gg * NBG_M(fma)(z, s[5], NBG_M(fma)(y, s[4], x * s[3]));
    *dLl = gg * NBG_M(fma)(z, s[8], NBG_M(fma)(y, s[7], x * s[6]));
    /* dL/dN_i = L / N_i + dL/dr2 2 r2 / N_i (r2 grows as NNN^2) */
    const NBG_R t = dL_dr2 * 2 * r2;
    *dNa = L / Na + t / Na;
    *dNb = L / Nb + t / Nb;
    *dNc = L / Nc + t / Nc;
    *g = gg;
    *v0 = x;
    *v1 = y;
    *v2 = z;
    return L;
}

/* The gauss and tophat shapes' lattice factor (nanoBragg's: the distance from the nearest node in reciprocal space,
 * 1/A, times N^3) from the offsets (dh, dk, dl) from the nearest node, the reciprocal axes s (a*, b*, c*, in the
 * kernel's type), NNN = Na Nb Nc and fudge; values only and every sum of products an explicit multiply-add, so that
 * nbgi_lattice and the CPU's lane loop (nbgi_shape_lanes, which passes the plan's values in locals) round alike. */
static inline NBG_INLINE NBG_HD NBG_R NBG_SFX(nbgi_gauss_tophat)(int gauss, NBG_R NNN, NBG_R fudge, const NBG_R *s,
                                                                NBG_R dh, NBG_R dk, NBG_R dl)
{
    NBG_R x, y, z; /* not used */
    const NBG_R r2 = NBG_SFX(nbgi_gauss_r2)(NNN, s, dh, dk, dl, &x, &y, &z);
    if (gauss) {
        return NNN * NBG_SFX(nbgi_exp)(-(r2 / (NBG_R)0.63 * fudge));
    }
    return (r2 * fudge < (NBG_R)0.3969) ? NNN : 0;
}

/* Crystal-shape lattice factor at fractional Miller indices (h, k, l); (h0, k0, l0) are the nearest integers as
 * nanoBragg rounds them, ceil(x - 1/2). */
static inline NBG_HD NBG_R NBG_SFX(nbgi_lattice)(const nbgi_kparams *p, NBG_R h, NBG_R k, NBG_R l, NBG_R h0, NBG_R k0,
                                               NBG_R l0)
{
    const NBG_R Na = (NBG_R)p->Na, Nb = (NBG_R)p->Nb, Nc = (NBG_R)p->Nc;
    if (p->shape == NBG_SQUARE) {
        const NBG_R fa = p->Ni[0] ? NBG_SFX(nbgi_sincg_int)(h, p->Ni[0]) : NBG_SFX(nbgi_sincg)(h, Na);
        const NBG_R fb = p->Ni[1] ? NBG_SFX(nbgi_sincg_int)(k, p->Ni[1]) : NBG_SFX(nbgi_sincg)(k, Nb);
        const NBG_R fc = p->Ni[2] ? NBG_SFX(nbgi_sincg_int)(l, p->Ni[2]) : NBG_SFX(nbgi_sincg)(l, Nc);
        return fa * fb * fc;
    }
    const NBG_R dh = h - h0, dk = k - k0, dl = l - l0;
    const NBG_R NNN = Na * Nb * Nc;
    if (p->shape == NBG_ROUND) {
        NBG_R u0, u1, u2, u3, u4, u5; /* the partials: not used, and dropped by the compiler */
        return NBG_SFX(nbgi_round_grad)(Na, Nb, Nc, (NBG_R)p->fudge, dh, dk, dl, &u0, &u1, &u2, &u3, &u4, &u5);
    }
    /* gauss and tophat */
    NBG_R s[9];
    NBG_SFX(nbgi_astar)(p, s);
    return NBG_SFX(nbgi_gauss_tophat)(p->shape == NBG_GAUSS, NNN, (NBG_R)p->fudge, s, dh, dk, dl);
}

/* Kahn polarization factor for incident direction i, diffracted direction d (unit vectors), with the source's
 * E_in and B_in (unit vectors spanning the plane normal to i; B_in = unit(p x i), E_in = unit(i x B_in)):
 *     P = (1 + cos^2 2theta - K cos(2 psi) sin^2 2theta) / 2,   psi = -atan2(d.B_in, d.E_in).
 * cos(2 psi) = (x^2 - y^2) / (x^2 + y^2) with x = d.E_in, y = d.B_in, and 1 where both vanish (d along i),
 * which is atan2(0, 0) = 0: no trigonometric call. */
static inline NBG_HD NBG_R NBG_SFX(nbgi_polar3)(NBG_R K, const NBG_R *i, NBG_R d0, NBG_R d1, NBG_R d2,
                                              const NBG_R *E, const NBG_R *B)
{
    /* every sum of products an explicit multiply-add: the compiler has none left to fuse, so a lane loop of it
     * (vectorised) and the scalar calls round alike (the forward's row and the adjoint's prologue) */
    const NBG_R c2t = NBG_M(fma)(i[2], d2, NBG_M(fma)(i[0], d0, i[1] * d1));
    const NBG_R s2t2 = NBG_M(fma)(-c2t, c2t, (NBG_R)1);
    NBG_R c2psi = 1;
    if (K != 0) {
        const NBG_R x = NBG_M(fma)(d2, E[2], NBG_M(fma)(d0, E[0], d1 * E[1]));
        const NBG_R y = NBG_M(fma)(d2, B[2], NBG_M(fma)(d0, B[0], d1 * B[1]));
        const NBG_R yy = y * y;
        const NBG_R r2 = NBG_M(fma)(x, x, yy);
        c2psi = (r2 > 0) ? NBG_M(fma)(x, x, -yy) / r2 : 1;
    }
    return (NBG_R)0.5 * NBG_M(fma)(-K * c2psi, s2t2, NBG_M(fma)(c2t, c2t, (NBG_R)1));
}

/* The same with d as an array.  (The lane loops call the scalar form: a local array inside an `omp simd` loop
 * becomes a per-lane array GCC 12 does not vectorise.) */
static inline NBG_HD NBG_R NBG_SFX(nbgi_polar)(NBG_R K, const NBG_R *i, const NBG_R *d, const NBG_R *E,
                                             const NBG_R *B)
{
    return NBG_SFX(nbgi_polar3)(K, i, d[0], d[1], d[2], E, B);
}

/* Four-point Lagrange weights at t in [1, 2) for nodes 0, 1, 2, 3 (tricubic interpolation is their tensor
 * product, which equals nanoBragg's nested polint, a Lagrange, not spline, interpolation). */
static inline NBG_HD void NBG_SFX(nbgi_lagrange4)(NBG_R t, NBG_R *w)
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
static inline NBG_HD NBG_R NBG_SFX(nbgi_fcell)(const nbgi_kparams *p, NBG_R h, NBG_R k, NBG_R l, int h0, int k0,
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
            NBG_SFX(nbgi_lagrange4)(h - (NBG_R)(hf - 1), wh);
            NBG_SFX(nbgi_lagrange4)(k - (NBG_R)(kf - 1), wk);
            NBG_SFX(nbgi_lagrange4)(l - (NBG_R)(lf - 1), wl);
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

/* The crystal vectors of orientation m (a phi step and mosaic domain; a, b, c in m) in the kernel's type: in double
 * the plan's abc; in float tmp, filled from the plan's copy rounded once (abc_f) where there is one, else rounded
 * here.  (On a GPU a conversion between double and float issues at the rate of double arithmetic: rounding the 9
 * at every sample cost the float adjoint a fifth of its time on heavy sampling.) */
static inline NBG_HD const NBG_R *NBG_SFX(nbgi_matrix)(const nbgi_kparams *p, int m, NBG_R tmp[9])
{
#ifdef NBG_FLOAT_MODE
    if (p->abc_f != 0) {
        for (int x = 0; x < 9; ++x) {
            tmp[x] = p->abc_f[9 * m + x];
        }
    } else {
        for (int x = 0; x < 9; ++x) {
            tmp[x] = (NBG_R)p->abc[9 * m + x];
        }
    }
    return tmp;
#else
    (void)tmp;
    return p->abc + 9 * m;
#endif
}

/* The Miller indices of a sample, h = a . q, k = b . q, l = c . q, for crystal vectors v (a, b, c; m, in the
 * kernel's type: nbgi_matrix) and scattering vector q (1/m).  The multiply-adds are written out, as GCC formed
 * them from the plain sum (the images keep their bits): left to the compiler, a host compiler of the CUDA code
 * (tests/cudaemu) formed them one way in the forward and another in the adjoint once the vectors came from
 * memory.  The row kernels' lane form is nbgi_lane_hkl (src/row_tmpl.h). */
static inline NBG_HD void NBG_SFX(nbgi_miller)(const NBG_R *v, const NBG_R *q, NBG_R *hkl)
{
    for (int x = 0; x < 3; ++x) {
        hkl[x] = NBG_M(fma)(v[3 * x + 2], q[2], NBG_M(fma)(v[3 * x], q[0], v[3 * x + 1] * q[1]));
    }
}

/* The nearest integer to a Miller index, halves rounded up (nanoBragg's ceil(h - 0.5)): the reflection a sample
 * belongs to.  Every nest rounds through here. */
static inline NBG_HD NBG_R NBG_SFX(nbgi_round_index)(NBG_R h)
{
    return NBG_M(ceil)(h - (NBG_R)0.5);
}

/* ---- derivatives for the adjoint kernels ------------------------------------------------------------------ */

/* sincg and its partial derivatives in h and N.  With x = pi d:
 *   d/dh = pi [N cos(N x) sin(x) - sin(N x) cos(x)] / sin(x)^2,   d/dN = x cos(N x) / sin(x).
 * Where N|x| is small the first form cancels; the series N [-(N^2-1) x/3 + (3N^4 - 10N^2 + 7) x^3/90] is used
 * instead.  At x = 0 the limits are d/dh = 0 and d/dN = 1. */
static inline NBG_HD NBG_R NBG_SFX(nbgi_sincg_grad)(NBG_R h, NBG_R N, NBG_R *dh, NBG_R *dN)
{
    const NBG_R d = h - NBG_M(rint)(h);
    const NBG_R s = NBG_SFX(nbgi_sinpi)(d);
    if (s == 0) {
        *dh = 0;
        *dN = 1;
        return N;
    }
    const NBG_R x = (NBG_R)M_PI * d;
    const NBG_R sN = NBG_SFX(nbgi_sinpi)(N * d), cN = NBG_SFX(nbgi_cospi)(N * d);
    const NBG_R val = sN / s;
    if (NBG_M(fabs)(N * x) < (NBG_R)1e-3) {
        const NBG_R N2 = N * N;
        *dh = (NBG_R)M_PI * N * (-(N2 - 1) * x / 3 + (3 * N2 * N2 - 10 * N2 + 7) * x * x * x / 90);
    } else {
        *dh = (NBG_R)M_PI * (N * cN - val * NBG_SFX(nbgi_cospi)(d)) / s;
    }
    *dN = x * cN / s;
    return val;
}

/* The same for a small integer N, from one reduced cosine c = cos(pi d) and the sine s = pi d P (nbgi_sinpi_poly):
 *   sincg = U_{N-1}(c),  d/dh = U'_{N-1}(c) (-pi s),  d/dN = pi d cos(N pi d) / sin(pi d) = T_N(c) / P,
 * the Chebyshev recurrences U_{k+1} = 2c U_k - U_{k-1}, U'_{k+1} = (2 U_k - U'_{k-1}) + 2c U'_k (summed so: the
 * chain from step to step is one multiply-add), and
 * T_N = c U_{N-1} - U_{N-2} (T_N(cos x) = cos(N x); T_1 = c). */
static inline NBG_HD NBG_R NBG_SFX(nbgi_sincg_grad_int)(NBG_R h, int Ni, NBG_R *dh, NBG_R *dN)
{
    const NBG_R d = h - NBG_M(rint)(h);
    const NBG_R P = NBG_SFX(nbgi_sinpi_poly)((NBG_R)(M_PI * M_PI) * d * d);
    const NBG_R c = NBG_SFX(nbgi_cospi_reduced)(d), s = ((NBG_R)M_PI * d) * P;
    NBG_R u0 = 1, u1 = 2 * c, du0 = 0, du1 = 2;
    if (Ni == 1) {
        u1 = 1;
        du1 = 0;
    }
    for (int k = 2; k < Ni; ++k) {
        const NBG_R u2 = 2 * c * u1 - u0, du2 = (2 * u1 - du0) + 2 * c * du1;
        u0 = u1;
        u1 = u2;
        du0 = du1;
        du1 = du2;
    }
    const NBG_R T = Ni == 1 ? c : c * u1 - u0;
    *dh = du1 * (-(NBG_R)M_PI * s);
    *dN = T / P;
    return u1;
}

/* The lattice factor and its partial derivatives in (h, k, l), in (Na, Nb, Nc) and, for the gauss shape, in the
 * reciprocal vectors astar[9].  The tophat edge and the rounding (h0, k0, l0) contribute nothing (taken branch). */
static inline NBG_HD NBG_R NBG_SFX(nbgi_lattice_grad)(const nbgi_kparams *p, NBG_R h, NBG_R k, NBG_R l, NBG_R h0,
                                                    NBG_R k0, NBG_R l0, NBG_R *dhkl, NBG_R *dN, NBG_R *dastar)
{
    const NBG_R Na = (NBG_R)p->Na, Nb = (NBG_R)p->Nb, Nc = (NBG_R)p->Nc;
    const NBG_R N[3] = {Na, Nb, Nc};
    if (p->shape == NBG_SQUARE) {
        NBG_R f[3], fh[3], fN[3];
        const NBG_R hv[3] = {h, k, l};
        for (int x = 0; x < 3; ++x) {
            f[x] = p->Ni[x] ? NBG_SFX(nbgi_sincg_grad_int)(hv[x], p->Ni[x], &fh[x], &fN[x])
                            : NBG_SFX(nbgi_sincg_grad)(hv[x], N[x], &fh[x], &fN[x]);
        }
        /* L = f_a f_b f_c: dL/dh = f_a' f_b f_c, ... */
        dhkl[0] = fh[0] * f[1] * f[2];
        dhkl[1] = f[0] * fh[1] * f[2];
        dhkl[2] = f[0] * f[1] * fh[2];
        dN[0] = fN[0] * f[1] * f[2];
        dN[1] = f[0] * fN[1] * f[2];
        dN[2] = f[0] * f[1] * fN[2];
        return f[0] * f[1] * f[2];
    }
    const NBG_R dv[3] = {h - h0, k - k0, l - l0};
    const NBG_R NNN = Na * Nb * Nc;
    if (p->shape == NBG_ROUND) {
        return NBG_SFX(nbgi_round_grad)(Na, Nb, Nc, (NBG_R)p->fudge, dv[0], dv[1], dv[2], &dhkl[0], &dhkl[1], &dhkl[2],
                                        &dN[0], &dN[1], &dN[2]);
    }
    NBG_R s[9];
    NBG_SFX(nbgi_astar)(p, s);
    if (p->shape == NBG_GAUSS) {
        NBG_R g, v[3];
        const NBG_R L = NBG_SFX(nbgi_gauss_grad)(Na, Nb, Nc, (NBG_R)p->fudge, s, dv[0], dv[1], dv[2], &dhkl[0], &dhkl[1],
                                                &dhkl[2], &dN[0], &dN[1], &dN[2], &g, &v[0], &v[1], &v[2]);
        for (int i = 0; i < 3; ++i) {
            for (int x = 0; x < 3; ++x) {
                dastar[3 * i + x] = g * dv[i] * v[x];
            }
        }
        return L;
    }
    const NBG_R L = NBG_SFX(nbgi_gauss_tophat)(0, NNN, (NBG_R)p->fudge, s, dv[0], dv[1], dv[2]); /* the tophat */
    for (int i = 0; i < 3; ++i) {
        dhkl[i] = 0;
        dN[i] = L / N[i];
    }
    return L;
}

/* Kahn factor with its derivatives in d (the diffracted unit vector: d0, d1, d2; dd receives the three) and in K. */
static inline NBG_HD NBG_R NBG_SFX(nbgi_polar_grad3)(NBG_R K, const NBG_R *i, NBG_R d0, NBG_R d1, NBG_R d2,
                                                   const NBG_R *E, const NBG_R *B, NBG_R *dd0, NBG_R *dd1,
                                                   NBG_R *dd2, NBG_R *dK)
{
    const NBG_R c2t = i[0] * d0 + i[1] * d1 + i[2] * d2;
    const NBG_R s2t2 = 1 - c2t * c2t;
    NBG_R c2psi = 1, dcx = 0, dcy = 0;
    {
        /* psi is computed even at K = 0, where the forward skips it (P does not depend on it there), since
         * dP/dK needs it */
        const NBG_R x = d0 * E[0] + d1 * E[1] + d2 * E[2];
        const NBG_R y = d0 * B[0] + d1 * B[1] + d2 * B[2];
        const NBG_R r2 = x * x + y * y;
        /* d cos(2psi)/dx = 4 x y^2 / r^4, d/dy = -4 x^2 y / r^4; 0 on the beam axis (atan2(0,0) limit).  Without
         * a branch (the divisions always done, by 1 on the axis, the results selected): the CPU's lane loops
         * vectorise it, with AVX2 too (which has no masked division) */
        const int off = r2 > 0;
        const NBG_R r2s = off ? r2 : 1;
        const NBG_R ir = 1 / r2s, ir2 = ir * ir; /* one division, not three */
        const NBG_R q = (x * x - y * y) * ir, qx = 4 * x * y * y * ir2, qy = -4 * x * x * y * ir2;
        c2psi = off ? q : 1;
        dcx = off ? qx : 0;
        dcy = off ? qy : 0;
    }
    /* P = (1 + c^2 - K c2psi (1 - c^2)) / 2 */
    const NBG_R dP_dc = c2t * (1 + K * c2psi);
    const NBG_R dP_dc2psi = -(NBG_R)0.5 * K * s2t2;
    *dd0 = dP_dc * i[0] + dP_dc2psi * (dcx * E[0] + dcy * B[0]);
    *dd1 = dP_dc * i[1] + dP_dc2psi * (dcx * E[1] + dcy * B[1]);
    *dd2 = dP_dc * i[2] + dP_dc2psi * (dcx * E[2] + dcy * B[2]);
    *dK = -(NBG_R)0.5 * c2psi * s2t2;
    return (NBG_R)0.5 * (1 + c2t * c2t - K * c2psi * s2t2);
}

static inline NBG_HD NBG_R NBG_SFX(nbgi_polar_grad)(NBG_R K, const NBG_R *i, const NBG_R *d, const NBG_R *E,
                                                  const NBG_R *B, NBG_R *dd, NBG_R *dK)
{
    return NBG_SFX(nbgi_polar_grad3)(K, i, d[0], d[1], d[2], E, B, &dd[0], &dd[1], &dd[2], dK);
}

/* d/dt of the four Lagrange weights at t. */
static inline NBG_HD void NBG_SFX(nbgi_lagrange4_grad)(NBG_R t, NBG_R *dw)
{
    const NBG_R t0 = t, t1 = t - 1, t2 = t - 2, t3 = t - 3;
    dw[0] = -(t2 * t3 + t1 * t3 + t1 * t2) / 6;
    dw[1] = (t2 * t3 + t0 * t3 + t0 * t2) / 2;
    dw[2] = -(t1 * t3 + t0 * t3 + t0 * t1) / 2;
    dw[3] = (t1 * t2 + t0 * t2 + t0 * t1) / 6;
}

/* Structure factor with its derivatives in (h, k, l) (0 for nearest-neighbour, the taken branch), and, when
 * dFtab is not NULL, scatters dL/dF_cell = gF into the table entries it used (or into *dFdef for default_F). */
static inline NBG_HD NBG_R NBG_SFX(nbgi_fcell_grad)(const nbgi_kparams *p, NBG_R h, NBG_R k, NBG_R l, int h0, int k0,
                                                  int l0, NBG_R *dhkl, NBG_R gF, double *dFtab, double *dFdef)
{
    dhkl[0] = dhkl[1] = dhkl[2] = 0;
    if (p->F == 0) {
        *dFdef += (double)gF;
        return (NBG_R)p->default_F;
    }
    if (p->interpolate && !(h - p->h_min + 3 > p->nh || h - 2 < p->h_min || k - p->k_min + 3 > p->nk ||
                            k - 2 < p->k_min || l - p->l_min + 3 > p->nl || l - 2 < p->l_min)) {
        const int hf = (int)NBG_M(floor)(h), kf = (int)NBG_M(floor)(k), lf = (int)NBG_M(floor)(l);
        NBG_R wh[4], wk[4], wl[4], dwh[4], dwk[4], dwl[4];
        NBG_SFX(nbgi_lagrange4)(h - (NBG_R)(hf - 1), wh);
        NBG_SFX(nbgi_lagrange4)(k - (NBG_R)(kf - 1), wk);
        NBG_SFX(nbgi_lagrange4)(l - (NBG_R)(lf - 1), wl);
        NBG_SFX(nbgi_lagrange4_grad)(h - (NBG_R)(hf - 1), dwh);
        NBG_SFX(nbgi_lagrange4_grad)(k - (NBG_R)(kf - 1), dwk);
        NBG_SFX(nbgi_lagrange4_grad)(l - (NBG_R)(lf - 1), dwl);
        NBG_R F = 0;
        for (int a = 0; a < 4; ++a) {
            for (int b = 0; b < 4; ++b) {
                const long base = ((long)(hf - 1 + a - p->h_min) * p->nk + (kf - 1 + b - p->k_min)) * p->nl +
                                  (lf - 1 - p->l_min);
                const double *row = p->F + base;
                NBG_R Fl = 0, dFl = 0;
                for (int c = 0; c < 4; ++c) {
                    Fl += wl[c] * (NBG_R)row[c];
                    dFl += dwl[c] * (NBG_R)row[c];
                    if (dFtab != 0) {
                        dFtab[base + c] += (double)(gF * wh[a] * wk[b] * wl[c]);
                    }
                }
                F += wh[a] * wk[b] * Fl;
                dhkl[0] += dwh[a] * wk[b] * Fl;
                dhkl[1] += wh[a] * dwk[b] * Fl;
                dhkl[2] += wh[a] * wk[b] * dFl;
            }
        }
        return F;
    }
    const int ih = h0 - p->h_min, ik = k0 - p->k_min, il = l0 - p->l_min;
    if (ih >= 0 && ih < p->nh && ik >= 0 && ik < p->nk && il >= 0 && il < p->nl) {
        const long idx = ((long)ih * p->nk + ik) * p->nl + il;
        if (dFtab != 0) {
            dFtab[idx] += (double)gF;
        }
        return (NBG_R)p->F[idx];
    }
    *dFdef += (double)gF;
    return (NBG_R)p->default_F;
}

