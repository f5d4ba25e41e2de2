/*
 * row_tmpl.h -- the forward loop nest, once: NBG_LANES neighbouring pixels of a row at once.  On the CPU the lanes
 * are 8 (double) or 16 (float) pixels, each sample's physics (the functions of physics_tmpl.h and geometry.h)
 * evaluated across them in `omp simd` loops; on the device (cuda/backend.cu defines NBG_ROW_LANES 1 before kernel.h)
 * a thread runs the same text for its one pixel.  nanoBragg's per-pixel conditions (resolution cut, first-subpixel
 * factors, skipped zero lattice factors) are per-lane selects.  Instantiated by kernel.h for double (_d, 8 lanes:
 * the adjoint and tangent row kernels of grad/ reuse its lane helpers at their width) and float (_f, 16 lanes), and,
 * where the vector registers are 256 bits wide (NBG_NARROW_VECTORS, src/hd.h), by src/forward_cpu.c for the forward
 * at one register of lanes, 4 in double (_dn) and 8 in float (_fn), for plans with many crystal matrices.  A pixel's
 * value does not depend on the lanes: the images are the same bits at any width.
 *
 * For each pixel it sums over sensor layers x subpixels x sources x phi steps x mosaic domains
 *     I = I_bg + sum F_cell^2 F_latt^2
 * and returns the photon count  r_e^2 fluence I / steps * capture * polar * omega,  where the last three factors
 * are nanoBragg's "once per pixel" values (taken at the first subpixel, the first source that survives the
 * resolution cut, and each layer's first subpixel) unless the -oversample_thick/_polar/_omega switches apply
 * them to the running sum after every term instead.  The adjoint twins (grad/adjoint_tmpl.h, adjoint_row_tmpl.h)
 * keep this loop order and these names.
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
#error "row_tmpl.h is a template: instantiate it through tmpl_on.h / tmpl_off.h (see src/tmpl_on.h)"
#endif
#ifndef NBG_PHYSICS_H
#error "row_tmpl.h needs physics.h instantiated for the same type first"
#endif
#define NBG_TMPL_HAS_ROW 1
#if defined(NBG_ROW_LANES)
#define NBG_LANES NBG_ROW_LANES
#elif defined(NBG_FLOAT_MODE)
#define NBG_LANES 16
#else
#define NBG_LANES 8
#endif

/* Statistics pixels contribute: the sum of solid angles over subpixels and the count of interpolation windows
 * that left the table. */
typedef struct {
    double omega_sum;
    long oor;
} NBG_SFX(nbgi_pixstat);

/* The lane count, for the callers: nbgi_row_lanes_d, nbgi_row_lanes_f. */
enum { NBG_SFX(nbgi_row_lanes) = NBG_LANES };

/* On the CPU (GCC or Clang), the lanes as one vector value, for loops whose state must stay in registers across
 * steps (the lattice factor's recurrence): element-wise the same arithmetic as the lane loops. */
#if defined(__GNUC__) && !defined(__CUDACC__) && NBG_LANES > 1
#define NBG_ROW_VEC 1
typedef NBG_R NBG_SFX(nbgi_rvec) __attribute__((vector_size(sizeof(NBG_R) * NBG_LANES)));
/* its lanes' integer images, of the same width: a vector comparison's mask, a bitwise select */
#ifdef NBG_FLOAT_MODE
typedef int32_t NBG_SFX(nbgi_rmask) __attribute__((vector_size(sizeof(NBG_R) * NBG_LANES)));
#else
typedef int64_t NBG_SFX(nbgi_rmask) __attribute__((vector_size(sizeof(NBG_R) * NBG_LANES)));
#endif
/* The same lanes as NBG_RPARTS vectors of the registers' width where those are narrower than the lanes (8 doubles
 * under AVX2: a vector wider than the registers GCC lowers piecewise through the stack, and the gradient's
 * recurrence ran from memory); one vector of all the lanes otherwise.  Element-wise the same arithmetic. */
#define NBG_RPART_BYTES (NBG_NARROW_VECTORS && sizeof(NBG_R) * NBG_LANES > 32 ? 32 : sizeof(NBG_R) * NBG_LANES)
typedef NBG_R NBG_SFX(nbgi_rpart) __attribute__((vector_size(NBG_RPART_BYTES)));
#define NBG_RPARTS ((int)(sizeof(NBG_R) * NBG_LANES / NBG_RPART_BYTES))
/* Lane arrays read and written as those vectors: the arrays aligned to the vectors (NBG_LANE_AL), the vectors
 * through types that may alias them.  (memcpy between the two was done in halves under znver1's tuning, and a
 * vector read whole after two half writes waits for them to retire: a failed store forwarding.) */
typedef NBG_R NBG_SFX(nbgi_rvec_m) __attribute__((vector_size(sizeof(NBG_R) * NBG_LANES), may_alias));
typedef NBG_R NBG_SFX(nbgi_rpart_m) __attribute__((vector_size(NBG_RPART_BYTES), may_alias));
#define NBG_LANE_AL __attribute__((aligned(sizeof(NBG_R) * NBG_LANES)))
#else
#define NBG_ROW_VEC 0
#define NBG_LANE_AL
#endif

/* The Miller indices h = a . q across the lanes (nbgi_miller's arithmetic) of crystal vectors v, already of the
 * kernel's type. */
static inline NBG_TMPL_HD void NBG_SFX(nbgi_lane_hkl_r)(const NBG_R *v, const NBG_R *q0, const NBG_R *q1,
                                                       const NBG_R *q2, NBG_R hkl[3][NBG_LANES])
{
    for (int x = 0; x < 3; ++x) {
        NBG_R *NBG_RESTRICT hx = hkl[x];
        const NBG_R vx0 = v[3 * x], vx1 = v[3 * x + 1], vx2 = v[3 * x + 2];
#pragma omp simd
        for (int j = 0; j < NBG_LANES; ++j) {
            hx[j] = NBG_M(fma)(vx2, q2[j], NBG_M(fma)(vx0, q0[j], vx1 * q1[j])); /* as nbgi_miller */
        }
    }
}

/* The Miller indices of crystal vectors v (of the kernel's type: nbgi_matrix) across the lanes, and, where
 * need_rnd (the table lookup, the non-square shapes and the signature use them), their rounding
 * (nbgi_round_index); rnd is not written otherwise (storing its zeros at every matrix cost heavy512's forward 8 % in
 * double, 4 % in float).  Shared by the forward, adjoint and tangent row kernels. */
static inline NBG_TMPL_HD void NBG_SFX(nbgi_lane_hkl)(const NBG_R *v, const NBG_R *q0, const NBG_R *q1,
                                                     const NBG_R *q2, int need_rnd, NBG_R hkl[3][NBG_LANES],
                                                     NBG_R rnd[3][NBG_LANES])
{
    NBG_SFX(nbgi_lane_hkl_r)(v, q0, q1, q2, hkl);
    for (int x = 0; x < 3 && need_rnd; ++x) {
        NBG_R *NBG_RESTRICT hx = hkl[x], *NBG_RESTRICT rx = rnd[x];
#pragma omp simd
        for (int j = 0; j < NBG_LANES; ++j) {
            rx[j] = NBG_SFX(nbgi_round_index)(hx[j]);
        }
    }
}

#if NBG_ROW_VEC
/* Steps k0 .. k1-1 of one axis's Chebyshev recurrence u_{k+1} = c2 u_k - u_{k-1} on vectors of type T (inlined: the
 * state stays in its caller's registers), the body of nbgi_cheb_steps (vectors of the lanes) and
 * nbgi_cheb_steps_part (of a register's width).  Two steps at a time, the state's two names taking turns: no register
 * copies (the one-step form spent two moves a step). */
#define NBGI_CHEB_STEPS_BODY(T)                                                                                        \
    {                                                                                                                  \
        T v0 = *u0, v1 = *u1;                                                                                          \
        int k = k0;                                                                                                    \
        for (; k + 1 < k1; k += 2) {                                                                                   \
            v0 = c2 * v1 - v0;                                                                                         \
            v1 = c2 * v0 - v1;                                                                                         \
        }                                                                                                              \
        if (k < k1) {                                                                                                  \
            const T v2 = c2 * v1 - v0;                                                                                 \
            v0 = v1;                                                                                                   \
            v1 = v2;                                                                                                   \
        }                                                                                                              \
        *u0 = v0;                                                                                                      \
        *u1 = v1;                                                                                                      \
    }
static inline NBG_INLINE void NBG_SFX(nbgi_cheb_steps)(NBG_SFX(nbgi_rvec) c2, NBG_SFX(nbgi_rvec) * u0,
                                                       NBG_SFX(nbgi_rvec) * u1, int k0, int k1)
    NBGI_CHEB_STEPS_BODY(NBG_SFX(nbgi_rvec))

/* 2 cos(pi d), d = h - rint(h), of each axis's index across the lanes (the forward's square lattice factor) */
static inline NBG_INLINE void NBG_SFX(nbgi_cos2_lanes)(NBG_R hkl[3][NBG_LANES], NBG_R c2[3][NBG_LANES])
{
#pragma omp simd
    for (int j = 0; j < NBG_LANES; ++j) {
        for (int x = 0; x < 3; ++x) {
            const NBG_R d = hkl[x][j] - NBG_M(rint)(hkl[x][j]);
            c2[x][j] = NBG_SFX(nbgi_cospi2_reduced)(d);
        }
    }
}

/* The forward's square lattice factor with three integer N above 2, as one vector of the lanes, of one matrix's
 * indices (hkl; two 0) or of two matrices' at once (hkl and hkl2 into L and L2; two 1, a constant at every call),
 * for nbgi_square_lanes and for the row's sum that keeps it in registers (over the matrices in pairs).  Per lane the
 * arithmetic below, so the same bits either way. */
static inline NBG_INLINE void NBG_SFX(nbgi_square_vec)(const nbgi_kparams *p, NBG_R hkl[3][NBG_LANES],
                                                       NBG_R hkl2[3][NBG_LANES], NBG_SFX(nbgi_rvec) * L,
                                                       NBG_SFX(nbgi_rvec) * L2, const int two)
{
    enum { W = NBG_LANES };
    /* the three axes' cosines in one lane loop and their recurrences interleaved in registers (their chains are
     * independent; one axis at a time left the units waiting on each chain's latency), and with two matrices six
     * chains (heavy512's forward 7 % faster in double, 11 % in float, than one matrix at a time) */
    typedef NBG_SFX(nbgi_rvec) vR;
    /* the cosines read back as whole vectors (NBG_LANE_AL), and the axes' state in named vectors, not in arrays
     * indexed by the axis, which GCC kept in memory (heavy512's forward 26 % faster in double and float, tric1k's
     * 11-13 %) */
    typedef NBG_SFX(nbgi_rvec_m) vRa;
    NBG_R c2[3][W] NBG_LANE_AL, e2[3][W] NBG_LANE_AL;
    vR one;
    for (int j = 0; j < W; ++j) {
        one[j] = 1;
    }
    NBG_SFX(nbgi_cos2_lanes)(hkl, c2);
    const vR a2 = *(const vRa *)c2[0], b2 = *(const vRa *)c2[1], c2v = *(const vRa *)c2[2];
    vR d2 = one, e2v = one, f2 = one;
    if (two) {
        NBG_SFX(nbgi_cos2_lanes)(hkl2, e2);
        d2 = *(const vRa *)e2[0];
        e2v = *(const vRa *)e2[1];
        f2 = *(const vRa *)e2[2];
    }
    vR a0 = one, a1 = a2, b0 = one, b1 = b2, c0 = one, c1 = c2v;
    vR d0 = one, d1 = d2, e0 = one, e1 = e2v, f0 = one, f1 = f2;
    /* the steps all three axes take, together and without a test per axis and step, two at a time (as
     * nbgi_cheb_steps); then each axis's remaining ones */
    const int n0 = p->Ni[0], n1 = p->Ni[1], n2 = p->Ni[2];
    const int nmin = n0 < n1 ? (n0 < n2 ? n0 : n2) : (n1 < n2 ? n1 : n2);
    int k = 2;
    for (; k + 1 < nmin; k += 2) {
        a0 = a2 * a1 - a0;
        b0 = b2 * b1 - b0;
        c0 = c2v * c1 - c0;
        if (two) {
            d0 = d2 * d1 - d0;
            e0 = e2v * e1 - e0;
            f0 = f2 * f1 - f0;
        }
        a1 = a2 * a0 - a1;
        b1 = b2 * b0 - b1;
        c1 = c2v * c0 - c1;
        if (two) {
            d1 = d2 * d0 - d1;
            e1 = e2v * e0 - e1;
            f1 = f2 * f0 - f1;
        }
    }
    NBG_SFX(nbgi_cheb_steps)(a2, &a0, &a1, k, n0);
    NBG_SFX(nbgi_cheb_steps)(b2, &b0, &b1, k, n1);
    NBG_SFX(nbgi_cheb_steps)(c2v, &c0, &c1, k, n2);
    *L = a1 * b1 * c1; /* (1 L_a) L_b L_c, as nbgi_square_lanes */
    if (two) {
        NBG_SFX(nbgi_cheb_steps)(d2, &d0, &d1, k, n0);
        NBG_SFX(nbgi_cheb_steps)(e2v, &e0, &e1, k, n1);
        NBG_SFX(nbgi_cheb_steps)(f2, &f0, &f1, k, n2);
        *L2 = d1 * e1 * f1;
    }
}
#endif

#if NBG_ROW_VEC
/* nbgi_cheb_steps on one register-wide part of the lanes */
static inline NBG_INLINE void NBG_SFX(nbgi_cheb_steps_part)(NBG_SFX(nbgi_rpart) c2, NBG_SFX(nbgi_rpart) * u0,
                                                            NBG_SFX(nbgi_rpart) * u1, int k0, int k1)
    NBGI_CHEB_STEPS_BODY(NBG_SFX(nbgi_rpart))
#undef NBGI_CHEB_STEPS_BODY

/* Steps k0 .. k1-1 of one axis's recurrence with its derivative in c (nbgi_square_lanes's gradient steps), on one
 * register-wide part of the lanes, the state in its caller's registers */
static inline NBG_INLINE void NBG_SFX(nbgi_cheb_grad_steps)(NBG_SFX(nbgi_rpart) c2, NBG_SFX(nbgi_rpart) * u0,
                                                            NBG_SFX(nbgi_rpart) * u1, NBG_SFX(nbgi_rpart) * d0,
                                                            NBG_SFX(nbgi_rpart) * d1, int k0, int k1)
{
    NBG_SFX(nbgi_rpart) v0 = *u0, v1 = *u1, e0 = *d0, e1 = *d1;
    int k = k0;
    for (; k + 1 < k1; k += 2) {
        e0 = (2 * v1 - e0) + c2 * e1;
        v0 = c2 * v1 - v0;
        e1 = (2 * v0 - e1) + c2 * e0;
        v1 = c2 * v0 - v1;
    }
    if (k < k1) {
        const NBG_SFX(nbgi_rpart) v2 = c2 * v1 - v0, e2 = (2 * v1 - e0) + c2 * e1;
        v0 = v1;
        v1 = v2;
        e0 = e1;
        e1 = e2;
    }
    *u0 = v0;
    *u1 = v1;
    *d0 = e0;
    *d1 = e1;
}

/* nbgi_square_lanes where every axis has an integer N of 2 or more, from the axes' cosines (gc) and, with
 * want_grad (a constant at every call), its gradient from their sines (gs) and sine polynomials (gP): the three
 * axes' recurrences interleaved in registers, a register-wide part of the lanes at a time (one axis at a time,
 * their chains' latency left the units idle: heavy256's gradient spent 3/4 of its time here).  Per lane the
 * arithmetic of nbgi_square_lanes's loops, so the same bits. */
static inline NBG_INLINE void NBG_SFX(nbgi_square_parts)(const nbgi_kparams *p, NBG_R gc[3][NBG_LANES],
                                                         NBG_R gs[3][NBG_LANES], NBG_R gP[3][NBG_LANES], NBG_R *L,
                                                         NBG_R dLh[3][NBG_LANES], NBG_R dLdN[3][NBG_LANES],
                                                         const int want_grad)
{
    typedef NBG_SFX(nbgi_rpart) vR;
    typedef NBG_SFX(nbgi_rpart_m) vRa;
    enum { NP = NBG_RPARTS };
    const int n0 = p->Ni[0], n1 = p->Ni[1], n2 = p->Ni[2];
    const int nmin = n0 < n1 ? (n0 < n2 ? n0 : n2) : (n1 < n2 ? n1 : n2);
    const int want_dN = p->want_dN;
    const NBG_R mpi = -(NBG_R)M_PI;
    /* the recurrences' starts (U_0 = 1, U_1 = 2c; U_0' = 0, U_1' = 2) as constants, not derived from c (0 c is -0 or
     * NaN where c is) */
    const vR zero = {0}, one = zero + 1, two = zero + 2;
    for (int h = 0; h < NP; ++h) {
        const vR ca = ((const vRa *)gc[0])[h], cb = ((const vRa *)gc[1])[h], cc = ((const vRa *)gc[2])[h];
        const vR a2 = 2 * ca, b2 = 2 * cb, c2 = 2 * cc;
        vR a0 = one, a1 = a2, b0 = one, b1 = b2, c0 = one, c1 = c2;
        vR da0 = zero, da1 = two, db0 = zero, db1 = two, dc0 = zero, dc1 = two;
        int k = 2;
        for (; k + 1 < nmin; k += 2) {
            if (want_grad) {
                da0 = (2 * a1 - da0) + a2 * da1;
                db0 = (2 * b1 - db0) + b2 * db1;
                dc0 = (2 * c1 - dc0) + c2 * dc1;
            }
            a0 = a2 * a1 - a0;
            b0 = b2 * b1 - b0;
            c0 = c2 * c1 - c0;
            if (want_grad) {
                da1 = (2 * a0 - da1) + a2 * da0;
                db1 = (2 * b0 - db1) + b2 * db0;
                dc1 = (2 * c0 - dc1) + c2 * dc0;
            }
            a1 = a2 * a0 - a1;
            b1 = b2 * b0 - b1;
            c1 = c2 * c0 - c1;
        }
        if (!want_grad) {
            NBG_SFX(nbgi_cheb_steps_part)(a2, &a0, &a1, k, n0);
            NBG_SFX(nbgi_cheb_steps_part)(b2, &b0, &b1, k, n1);
            NBG_SFX(nbgi_cheb_steps_part)(c2, &c0, &c1, k, n2);
            ((vRa *)L)[h] = a1 * b1 * c1;
            continue;
        }
        NBG_SFX(nbgi_cheb_grad_steps)(a2, &a0, &a1, &da0, &da1, k, n0);
        NBG_SFX(nbgi_cheb_grad_steps)(b2, &b0, &b1, &db0, &db1, k, n1);
        NBG_SFX(nbgi_cheb_grad_steps)(c2, &c0, &c1, &dc0, &dc1, k, n2);
        const vR fha = da1 * (mpi * ((const vRa *)gs[0])[h]), fhb = db1 * (mpi * ((const vRa *)gs[1])[h]),
                 fhc = dc1 * (mpi * ((const vRa *)gs[2])[h]);
        ((vRa *)L)[h] = a1 * b1 * c1;
        ((vRa *)dLh[0])[h] = fha * b1 * c1;
        ((vRa *)dLh[1])[h] = a1 * fhb * c1;
        ((vRa *)dLh[2])[h] = a1 * b1 * fhc;
        if (want_dN) {
            /* d/dN = T_N(c) / P, T_N = c U_{N-1} - U_{N-2} */
            const vR fNa = (ca * a1 - a0) / ((const vRa *)gP[0])[h], fNb = (cb * b1 - b0) / ((const vRa *)gP[1])[h],
                     fNc = (cc * c1 - c0) / ((const vRa *)gP[2])[h];
            ((vRa *)dLdN[0])[h] = fNa * b1 * c1;
            ((vRa *)dLdN[1])[h] = a1 * fNb * c1;
            ((vRa *)dLdN[2])[h] = a1 * b1 * fNc;
        } else {
            ((vRa *)dLdN[0])[h] = ((vRa *)dLdN[1])[h] = ((vRa *)dLdN[2])[h] = zero;
        }
    }
}
#endif

/* The square shape's lattice factor L = prod_x sincg(pi h_x, N_x) across the lanes: per axis the Chebyshev form
 * U_{N-1}(cos pi d) of nbgi_lattice (src/physics_tmpl.h) for integer N <= 32, each recurrence step an `omp simd`
 * loop over the lanes, nbgi_sincg otherwise.  With want_grad, also its partials in (h, k, l) and (when p->want_dN)
 * in N; without, dLh and dLdN are not touched (the forward kernel passes want_grad 0 and the derivative code
 * folds away).  Shared by the forward and adjoint row kernels; forced inline (GCC left it out of line in the 4-lane
 * double forward, which renders plans of many matrices without nbgi_square_vec's sum: a P1 table with 50 mosaic
 * domains and phi steps at 1024^2 15 % slower). */
static inline NBG_INLINE NBG_TMPL_HD void NBG_SFX(nbgi_square_lanes)(const nbgi_kparams *p, NBG_R hkl[3][NBG_LANES],
                                                                    NBG_R *L, NBG_R dLh[3][NBG_LANES],
                                                                    NBG_R dLdN[3][NBG_LANES], const int want_grad)
{
    enum { W = NBG_LANES };
    NBG_R fl[3][W] NBG_LANE_AL, fh[3][W] NBG_LANE_AL, fN[3][W] NBG_LANE_AL;
    const int want_dN = p->want_dN; /* a local: see nbgi_solid_angle_of */
#if NBG_ROW_VEC
    /* the callers' lane arrays are NBG_LANE_AL: written whole, not in halves that their whole reads would wait on
     * (the gradient's row reads them as vectors) */
    L = __builtin_assume_aligned(L, sizeof(NBG_R) * NBG_LANES);
    dLh = __builtin_assume_aligned(dLh, sizeof(NBG_R) * NBG_LANES);
    dLdN = __builtin_assume_aligned(dLdN, sizeof(NBG_R) * NBG_LANES);
    /* the forward's interleaved axes where the lanes are one register; where they are more (8 doubles under AVX2:
     * nbgi_square_vec's vectors would go through the stack) nbgi_square_parts below, a register's part at a time */
    if (!want_grad && NBG_RPARTS == 1 && p->Ni[0] > 2 && p->Ni[1] > 2 && p->Ni[2] > 2) {
        NBG_SFX(nbgi_rvec) Lv;
        NBG_SFX(nbgi_square_vec)(p, hkl, hkl, &Lv, &Lv, 0);
        *(NBG_SFX(nbgi_rvec_m) *)L = Lv; /* L is NBG_LANE_AL here (the forward row's) */
        return;
    }
#endif
    for (int j = 0; j < W; ++j) {
        L[j] = 1; /* times each axis's factor: 1 L_a = L_a bit for bit */
    }
    /* with the partials, the three axes' cosines and sines first, in one lane loop (nbgi_sincg_grad_int's
     * arithmetic, src/physics_tmpl.h): their polynomials are independent chains, which one axis at a time left
     * waiting on each one's latency.  An axis of non-integer N does not use them. */
    NBG_R gc[3][W] NBG_LANE_AL, gs[3][W] NBG_LANE_AL, gP[3][W] NBG_LANE_AL;
    if (want_grad) {
#pragma omp simd
        for (int j = 0; j < W; ++j) {
            for (int x = 0; x < 3; ++x) {
                const NBG_R d = hkl[x][j] - NBG_M(rint)(hkl[x][j]);
                gc[x][j] = NBG_SFX(nbgi_cospi_reduced)(d);
                gP[x][j] = NBG_SFX(nbgi_sinpi_poly)((NBG_R)(M_PI * M_PI) * d * d);
                gs[x][j] = ((NBG_R)M_PI * d) * gP[x][j];
            }
        }
    }
#if NBG_ROW_VEC
    /* every axis's N an integer of 2 or more: the axes' recurrences interleaved (the loop below is for the rest: N
     * of 1, non-integer N) */
    if (p->Ni[0] > 1 && p->Ni[1] > 1 && p->Ni[2] > 1) {
        if (!want_grad) {
#pragma omp simd
            for (int j = 0; j < W; ++j) {
                for (int x = 0; x < 3; ++x) {
                    gc[x][j] = NBG_SFX(nbgi_cospi_reduced)(hkl[x][j] - NBG_M(rint)(hkl[x][j]));
                }
            }
        }
        NBG_SFX(nbgi_square_parts)(p, gc, gs, gP, L, dLh, dLdN, want_grad);
        return;
    }
#endif
    for (int x = 0; x < 3; ++x) {
        const int Ni = p->Ni[x];
        if (Ni == 1 && !want_grad) {
            continue; /* U_0 = 1 */
        }
        const NBG_R N = (NBG_R)(x == 0 ? p->Na : x == 1 ? p->Nb : p->Nc);
        NBG_R *NBG_RESTRICT flx = fl[x], *NBG_RESTRICT fhx = fh[x], *NBG_RESTRICT fNx = fN[x];
        if (Ni == 0) {
            for (int j = 0; j < W; ++j) {
                flx[j] = want_grad ? NBG_SFX(nbgi_sincg_grad)(hkl[x][j], N, &fhx[j], &fNx[j])
                                   : NBG_SFX(nbgi_sincg)(hkl[x][j], N);
                L[j] *= flx[j];
            }
            continue;
        }
        NBG_R c2[W] NBG_LANE_AL, u0[W] NBG_LANE_AL, u1[W] NBG_LANE_AL, du0[W] NBG_LANE_AL, du1[W] NBG_LANE_AL;
        NBG_R *NBG_RESTRICT c1 = gc[x], *NBG_RESTRICT s = gs[x], *NBG_RESTRICT P = gP[x];
        const NBG_R *NBG_RESTRICT hx = hkl[x];
#pragma omp simd
        for (int j = 0; j < W; ++j) {
            const NBG_R c = want_grad ? c1[j] : NBG_SFX(nbgi_cospi_reduced)(hx[j] - NBG_M(rint)(hx[j]));
            c2[j] = 2 * c; /* exact: 2 c u = c2 u bit for bit, one multiply less per step */
            u0[j] = 1;
            u1[j] = Ni == 1 ? 1 : c2[j];
            if (want_grad) {
                du0[j] = 0;
                du1[j] = Ni == 1 ? 0 : 2;
            }
        }
#if NBG_ROW_VEC
        if (Ni > 2) {
            /* the recurrence's state in vector registers across its steps: as arrays, GCC kept it in memory and
             * mixed vector widths, and each step waited on a store (heavy sampling's gradient 19 % faster, its
             * forward 16 %); in parts of the registers' width (NBG_RPARTS), independent chains; element-wise the
             * lane loop's arithmetic below */
            typedef NBG_SFX(nbgi_rpart) vR;
            typedef NBG_SFX(nbgi_rpart_m) vRa;
            enum { NP = NBG_RPARTS };
            vR vc2[NP], vu0[NP], vu1[NP], vd0[NP], vd1[NP];
            for (int h = 0; h < NP; ++h) {
                vc2[h] = ((const vRa *)c2)[h];
                vu0[h] = ((const vRa *)u0)[h];
                vu1[h] = ((const vRa *)u1)[h];
                if (want_grad) {
                    vd0[h] = ((const vRa *)du0)[h];
                    vd1[h] = ((const vRa *)du1)[h];
                }
            }
            int k = 2;
            /* two steps at a time, the state's two names taking turns (no register copies) */
            for (; k + 1 < Ni; k += 2) {
                for (int h = 0; h < NP; ++h) {
                    if (want_grad) {
                        /* summed as nbgi_sincg_grad_int: the chain from step to step is one multiply-add */
                        vd0[h] = (2 * vu1[h] - vd0[h]) + vc2[h] * vd1[h];
                    }
                    vu0[h] = vc2[h] * vu1[h] - vu0[h];
                    if (want_grad) {
                        vd1[h] = (2 * vu0[h] - vd1[h]) + vc2[h] * vd0[h];
                    }
                    vu1[h] = vc2[h] * vu0[h] - vu1[h];
                }
            }
            if (k < Ni) {
                for (int h = 0; h < NP; ++h) {
                    const vR u2 = vc2[h] * vu1[h] - vu0[h];
                    if (want_grad) {
                        const vR d2 = (2 * vu1[h] - vd0[h]) + vc2[h] * vd1[h];
                        vd0[h] = vd1[h];
                        vd1[h] = d2;
                    }
                    vu0[h] = vu1[h];
                    vu1[h] = u2;
                }
            }
            for (int h = 0; h < NP; ++h) {
                ((vRa *)u0)[h] = vu0[h];
                ((vRa *)u1)[h] = vu1[h];
                if (want_grad) {
                    ((vRa *)du0)[h] = vd0[h];
                    ((vRa *)du1)[h] = vd1[h];
                }
            }
        }
#else
        for (int k = 2; k < Ni; ++k) {
#pragma omp simd
            for (int j = 0; j < W; ++j) {
                const NBG_R u2 = c2[j] * u1[j] - u0[j];
                if (want_grad) {
                    const NBG_R du2 = (2 * u1[j] - du0[j]) + c2[j] * du1[j];
                    du0[j] = du1[j];
                    du1[j] = du2;
                }
                u0[j] = u1[j];
                u1[j] = u2;
            }
        }
#endif
#pragma omp simd
        for (int j = 0; j < W; ++j) {
            L[j] *= u1[j];
            if (want_grad) {
                flx[j] = u1[j];
                fhx[j] = du1[j] * (-(NBG_R)M_PI * s[j]);
                /* d/dN = T_N(c) / P, T_N = c U_{N-1} - U_{N-2} (T_1 = c) */
                fNx[j] = !want_dN ? 0 : (Ni == 1 ? c1[j] : c1[j] * u1[j] - u0[j]) / P[j];
            }
        }
    }
    if (!want_grad) {
        return;
    }
#pragma omp simd
    for (int j = 0; j < W; ++j) {
        dLh[0][j] = fh[0][j] * fl[1][j] * fl[2][j];
        dLh[1][j] = fl[0][j] * fh[1][j] * fl[2][j];
        dLh[2][j] = fl[0][j] * fl[1][j] * fh[2][j];
        dLdN[0][j] = fN[0][j] * fl[1][j] * fl[2][j];
        dLdN[1][j] = fl[0][j] * fN[1][j] * fl[2][j];
        dLdN[2][j] = fl[0][j] * fl[1][j] * fN[2][j];
    }
}

/* nbgi_square_lanes with its partials, for the adjoint and tangent row kernels: out of line on the CPU, where
 * inlined into their large row functions it cost triclinic's gradient 8 % (registers spilled around it). */
#if NBG_ROW_VEC
__attribute__((noinline, unused)) static
#else
static inline
#endif
NBG_TMPL_HD void NBG_SFX(nbgi_square_lanes_grad)(const nbgi_kparams *p, NBG_R hkl[3][NBG_LANES], NBG_R *L,
                                                         NBG_R dLh[3][NBG_LANES], NBG_R dLdN[3][NBG_LANES])
{
    NBG_SFX(nbgi_square_lanes)(p, hkl, L, dLh, dLdN, 1);
}

/* The other shapes' lattice factor across the lanes (the round, gauss and tophat shapes: the square one is
 * nbgi_square_lanes), nbgi_lattice's of each lane's indices (hkl) and their nearest integers (rnd), the same bits, in
 * lane loops that vectorise: the round shape's sine and cosine and the gauss shape's exponential without library calls
 * (src/physics_tmpl.h: -round_xtal's forward 3.3x faster; tric1k's gauss forward 1.7x, tophat 1.4x).  Out of line on
 * the CPU: in the forward's rows its code moved their register allocation (tric1k's square forward 3-5 % slower). */
#if NBG_ROW_VEC
__attribute__((noinline, unused)) static
#else
static inline
#endif
NBG_TMPL_HD void NBG_SFX(nbgi_shape_lanes)(const nbgi_kparams *p, NBG_R hkl[3][NBG_LANES], NBG_R rnd[3][NBG_LANES],
                                           NBG_R *L)
{
    if (p->shape == NBG_ROUND) {
        const NBG_R Na = (NBG_R)p->Na, Nb = (NBG_R)p->Nb, Nc = (NBG_R)p->Nc, fudge = (NBG_R)p->fudge;
#pragma omp simd
        for (int j = 0; j < NBG_LANES; ++j) {
            NBG_R u0, u1, u2, u3, u4, u5; /* the partials, not used: dropped */
            L[j] = NBG_SFX(nbgi_round_grad)(Na, Nb, Nc, fudge, hkl[0][j] - rnd[0][j], hkl[1][j] - rnd[1][j],
                                           hkl[2][j] - rnd[2][j], &u0, &u1, &u2, &u3, &u4, &u5);
        }
        return;
    }
    /* gauss and tophat: the plan's values in locals (see nbgi_solid_angle_of) */
    const NBG_R NNN = (NBG_R)p->Na * (NBG_R)p->Nb * (NBG_R)p->Nc, fudge = (NBG_R)p->fudge;
    NBG_R s[9];
    NBG_SFX(nbgi_astar)(p, s);
    /* a loop a shape, the shape a constant in each (one loop with it a variable computed the exponential for the
     * tophat too: tric1k's tophat 7 % slower in double) */
    if (p->shape == NBG_GAUSS) {
#pragma omp simd
        for (int j = 0; j < NBG_LANES; ++j) {
            L[j] = NBG_SFX(nbgi_gauss_tophat)(1, NNN, fudge, s, hkl[0][j] - rnd[0][j], hkl[1][j] - rnd[1][j],
                                             hkl[2][j] - rnd[2][j]);
        }
    } else {
#pragma omp simd
        for (int j = 0; j < NBG_LANES; ++j) {
            L[j] = NBG_SFX(nbgi_gauss_tophat)(0, NNN, fudge, s, hkl[0][j] - rnd[0][j], hkl[1][j] - rnd[1][j],
                                             hkl[2][j] - rnd[2][j]);
        }
    }
}

/* The round, gauss and tophat shapes' lattice factor with its partials across the lanes (nbgi_lattice_grad's, the
 * same bits), for the adjoint's and the tangents' shape helpers (grad/adjoint_row_tmpl.h, grad/jvp_row_tmpl.h); for
 * the gauss shape also gv[0][j] = g and gv[1..3][j] = v, whence its partials in a*, b*, c*: dL/d s[3 i + x] =
 * g dv_i v_x (nbgi_gauss_grad).  Its loops vectorise: the plan's values in locals, the shape a constant in each
 * loop.  Inlined into those helpers, which are out of line on the CPU (as nbgi_shape_lanes, for the square rows'
 * register allocation). */
static inline NBG_TMPL_HD void NBG_SFX(nbgi_shape_lanes_grad)(const nbgi_kparams *p, NBG_R hkl[3][NBG_LANES],
                                                             NBG_R rnd[3][NBG_LANES], NBG_R *L,
                                                             NBG_R dLh[3][NBG_LANES], NBG_R dLdN[3][NBG_LANES],
                                                             NBG_R gv[4][NBG_LANES])
{
    const NBG_R Na = (NBG_R)p->Na, Nb = (NBG_R)p->Nb, Nc = (NBG_R)p->Nc, fudge = (NBG_R)p->fudge;
    if (p->shape == NBG_ROUND) {
#pragma omp simd
        for (int j = 0; j < NBG_LANES; ++j) {
            L[j] = NBG_SFX(nbgi_round_grad)(Na, Nb, Nc, fudge, hkl[0][j] - rnd[0][j], hkl[1][j] - rnd[1][j],
                                           hkl[2][j] - rnd[2][j], &dLh[0][j], &dLh[1][j], &dLh[2][j], &dLdN[0][j],
                                           &dLdN[1][j], &dLdN[2][j]);
        }
        return;
    }
    NBG_R s[9];
    NBG_SFX(nbgi_astar)(p, s);
    if (p->shape == NBG_GAUSS) {
#pragma omp simd
        for (int j = 0; j < NBG_LANES; ++j) {
            L[j] = NBG_SFX(nbgi_gauss_grad)(Na, Nb, Nc, fudge, s, hkl[0][j] - rnd[0][j], hkl[1][j] - rnd[1][j],
                                           hkl[2][j] - rnd[2][j], &dLh[0][j], &dLh[1][j], &dLh[2][j], &dLdN[0][j],
                                           &dLdN[1][j], &dLdN[2][j], &gv[0][j], &gv[1][j], &gv[2][j], &gv[3][j]);
        }
        return;
    }
    /* the tophat: L, no partial in h, k, l, L / N_i in N_i */
    const NBG_R NNN = Na * Nb * Nc;
#pragma omp simd
    for (int j = 0; j < NBG_LANES; ++j) {
        L[j] = NBG_SFX(nbgi_gauss_tophat)(0, NNN, fudge, s, hkl[0][j] - rnd[0][j], hkl[1][j] - rnd[1][j],
                                         hkl[2][j] - rnd[2][j]);
        dLh[0][j] = dLh[1][j] = dLh[2][j] = 0;
        dLdN[0][j] = L[j] / Na;
        dLdN[1][j] = L[j] / Nb;
        dLdN[2][j] = L[j] / Nc;
    }
}

/* Renders pixels f0 .. f0+n-1 (n <= NBG_LANES) of row spixel into out[0..n); inactive pixels get 0.  outd (NULL:
 * not wanted) receives the same values unrounded.  sig (NULL: not wanted) receives, per pixel, a signature of the
 * discrete choices its samples make (rounded Miller indices, interpolation windows, samples cut by dmin or zeroed
 * by the tophat edge; 0 for an inactive pixel): where it differs between two evaluations the image is not
 * differentiable between them, and the gradient check leaves such pixels out.  The kernels pass constant NULLs,
 * which fold both away: the function is forced inline for that. */
static inline NBG_INLINE NBG_TMPL_HD void NBG_SFX(nbgi_row)(const nbgi_kparams *p, int spixel, int f0, int n,
                                                          float *out, NBG_SFX(nbgi_pixstat) * st, double *outd,
                                                          uint64_t *sig)
{
    enum { W = NBG_LANES };
    uint64_t hash[W]; /* FNV-1a over each lane's choices */
#define NBG_MIX(j, v) (hash[j] = (hash[j] ^ (uint64_t)(int64_t)(v)) * 1099511628211ULL)
    const int os = p->oversample;
    const int nmat = p->nphi * p->nmos;
    const double K = p->polarization;
    /* the plan's values the lane loops read, in locals (a load through p in a loop that stores elsewhere stops GCC
     * vectorising it) */
    const int os_omega = p->os_omega, os_polar = p->os_polar, point_pixel = p->point_pixel;
    const int os_any = p->os_thick || os_polar || os_omega, water = p->water != 0;
    const double pixel2 = p->pixel * p->pixel, close = p->close_distance;
#if NBG_ROW_VEC
    /* the sum over two or more matrices in vector registers (below; with one, its set-up cost tric1k 6-13 %) */
#ifdef NBG_FLOAT_MODE
    const float *mats = p->abc_f; /* the matrices in float (NULL: not made; the general loop below) */
#else
    const double *mats = p->abc;
#endif
    const int vsum = p->shape == NBG_SQUARE && p->Ni[0] > 2 && p->Ni[1] > 2 && p->Ni[2] > 2 && p->F == 0 && !os_any &&
                     sig == NULL && nmat > 1 && mats != NULL;
    NBG_SFX(nbgi_rvec) vFc, vzero; /* its constants: F and 0 */
    for (int j = 0; j < W; ++j) {
        vFc[j] = (NBG_R)p->default_F;
        vzero[j] = 0;
    }
#endif
    NBG_R I[W] NBG_LANE_AL, qf0[W], qf1[W], qf2[W];
    double polar[W], omega[W], capture[W], d0[W], d1[W], d2[W], q0[W], q1[W], q2[W];
    int valid[W], active[W];
    double osum = 0, osl[W]; /* the solid angles' sum: each lane's over its subpixels, then the lanes in order */
    long oor = 0;
    int any = 0; /* whether any lane's pixel is active */
    const int all = nbgi_all_active(p, spixel, f0, n);
    for (int j = 0; j < W; ++j) {
        active[j] = j < n && (all || nbgi_pixel_active(p, f0 + j, spixel));
        any |= active[j];
    }
    /* the constant starts in a loop of their own, which vectorises (with the test above in it, it ran a lane at a
     * time: 7 % of tric1k's float row) */
    const NBG_R I_bg = (NBG_R)p->I_bg;
    const double polar0 = p->nopolar ? 1 : 0;
#pragma omp simd
    for (int j = 0; j < W; ++j) {
        I[j] = I_bg;
        hash[j] = 1469598103934665603ULL;
        polar[j] = polar0;
        omega[j] = 0;
        osl[j] = 0;
        capture[j] = 0;
    }
    /* one lane (a device thread) on an inactive pixel does nothing; with many, skipping rows of inactive pixels
     * cost more than it saved (its test slowed heavy512 in float 15 %) */
    const int nlayers = (W > 1 || any) ? p->thicksteps : 0;
    for (int t = 0; t < nlayers; ++t) {
        const double Odet = nbgi_layer_at(p, t);
        for (int j = 0; j < W; ++j) {
            capture[j] = (p->thick == 0) ? 1 : 0;
        }
        for (int subS = 0; subS < os; ++subS) {
            const double Sdet = nbgi_subpixel_at(p, spixel, subS);
            for (int subF = 0; subF < os; ++subF) {
                if (p->curved) {
                    for (int j = 0; j < W; ++j) {
                        double P[3];
                        nbgi_subpixel_pos(p, f0 + j, spixel, subF, subS, t, P);
                        const double R = sqrt(P[0] * P[0] + P[1] * P[1] + P[2] * P[2]);
                        d0[j] = P[0] / R;
                        d1[j] = P[1] / R;
                        d2[j] = P[2] / R;
                        q0[j] = R;
                    }
                } else {
                    double Fd[W];
                    nbgi_lane_rays_as(p, f0, subF, Sdet, Odet, W, d0, d1, d2, q0, Fd, sizeof(NBG_R) == sizeof(float));
                }
                /* once-per-pixel factors: solid angle, then this layer's capture fraction (the plan's values in
                 * locals, so that the loop vectorises: see nbgi_solid_angle_of).  The solid angle only while a lane
                 * lacks it (the lanes reach their first subpixel together): the select alone divided twice a ray at
                 * every subpixel, one at a time under AVX2, which has no masked division */
                int want_omega = os_omega;
#pragma omp simd reduction(| : want_omega)
                for (int j = 0; j < W; ++j) {
                    want_omega |= omega[j] == 0;
                }
                if (want_omega) {
#pragma omp simd
                    for (int j = 0; j < W; ++j) {
                        omega[j] = (omega[j] == 0 || os_omega)
                                       ? nbgi_solid_angle_of(point_pixel, pixel2, close, q0[j])
                                       : omega[j];
                    }
                }
#pragma omp simd
                for (int j = 0; j < W; ++j) {
                    osl[j] += active[j] ? omega[j] : 0.0;
                }
                /* without a sensor thickness capture stays 1 (unless -oversample_thick recomputes it to 0) */
                if (p->thick != 0 || p->os_thick) {
                    for (int j = 0; j < W; ++j) {
                        if (capture[j] == 0 || p->os_thick) {
                            double a;
                            capture[j] = nbgi_capture(p, t, d0[j] * p->odet[0] + d1[j] * p->odet[1] + d2[j] * p->odet[2],
                                                      &a);
                        }
                    }
                }
                for (int src = 0; src < p->nsources; ++src) {
                    const double *sr = p->src + NBG_SRC_STRIDE * src;
                    const double inc[3] = {sr[0], sr[1], sr[2]};
                    const double E[3] = {sr[4], sr[5], sr[6]};
                    const double B[3] = {sr[7], sr[8], sr[9]};
                    nbgi_lane_q(p, src, W, d0, d1, d2, q0, q1, q2, valid);
                    int used = 0; /* whether any lane's samples count */
                    NBG_R live[W]; /* 1 where they do, 0 where not: a mask of the samples' width for the sum */
                    /* valid and active are 0 or 1: bitwise, so that the loop vectorises (with && and a reduction
                     * it ran a lane at a time, as did want_polar's below) */
#pragma omp simd reduction(| : used)
                    for (int j = 0; j < W; ++j) {
                        live[j] = (NBG_R)(valid[j] & active[j]);
                        used |= valid[j] & active[j];
                    }
                    for (int j = 0; j < W && sig != NULL; ++j) {
                        if (!valid[j]) {
                            NBG_MIX(j, -7);
                        }
                    }
                    if (W == 1 && !used) {
                        continue; /* one lane (a device thread): its pixel's sample is cut.  With many lanes the
                                   * test cost more than it saved (heavy512 in float: 19 %) */
                    }
                    /* the polarization once a pixel (at its first surviving sample), across the lanes (its
                     * multiply-adds explicit: the adjoint's prologue rounds as this does, grad/adjoint.h); once
                     * every lane has it, the conversions alone */
                    int want_polar = 0;
#pragma omp simd reduction(| : want_polar)
                    for (int j = 0; j < W; ++j) {
                        want_polar |= valid[j] & ((polar[j] == 0) | (os_polar != 0));
                    }
                    if (want_polar) {
#pragma omp simd
                        for (int j = 0; j < W; ++j) {
                            const double pj = nbgi_polar3_d(K, inc, d0[j], d1[j], d2[j], E, B);
                            polar[j] = (valid[j] && (polar[j] == 0 || os_polar)) ? pj : polar[j];
                            qf0[j] = (NBG_R)q0[j];
                            qf1[j] = (NBG_R)q1[j];
                            qf2[j] = (NBG_R)q2[j];
                        }
                    } else {
#pragma omp simd
                        for (int j = 0; j < W; ++j) {
                            qf0[j] = (NBG_R)q0[j];
                            qf1[j] = (NBG_R)q1[j];
                            qf2[j] = (NBG_R)q2[j];
                        }
                    }
#if NBG_ROW_VEC
                    if (vsum) {
                        /* the square shape with three integer N above 2, a constant F and the factors once a
                         * pixel: each matrix's lattice factor and the running sum stay in vector registers (through
                         * the lane arrays, each step waited on a store); per lane the arithmetic below, so the same
                         * bits.  The select is bitwise, on the lanes' integer images, and of live lanes only: the
                         * loop below skips L = 0 as well (nanoBragg's test, there also for the table's lookup), but
                         * with a constant F a lane of L = +-0 adds F^2 L L = +0 to a sum that is never -0 (it starts
                         * at I_bg, +0 without water, and adds squares): the same bits without the test's three
                         * operations a matrix (heavy256's forward 7 % faster). */
                        typedef NBG_SFX(nbgi_rvec) vR;
                        typedef NBG_SFX(nbgi_rmask) vM;
                        vR vI;
                        vM keep;
                        vI = *(const NBG_SFX(nbgi_rvec_m) *)I;
                        for (int j = 0; j < W; ++j) {
                            keep[j] = live[j] != 0 ? -1 : 0;
                        }
                        /* the matrices in pairs (nbgi_square_vec's two), summed in their order */
                        for (int m = 0; m < nmat; m += 2) {
                            NBG_R hkl[3][W], hkl2[3][W];
                            vR vL, vL2 = vzero;
                            NBG_SFX(nbgi_lane_hkl_r)(mats + 9 * m, qf0, qf1, qf2, hkl);
                            if (m + 1 < nmat) {
                                NBG_SFX(nbgi_lane_hkl_r)(mats + 9 * (m + 1), qf0, qf1, qf2, hkl2);
                                NBG_SFX(nbgi_square_vec)(p, hkl, hkl2, &vL, &vL2, 1);
                            } else {
                                NBG_SFX(nbgi_square_vec)(p, hkl, hkl, &vL, &vL, 0);
                            }
                            for (int i = 0; i < 2 && m + i < nmat; ++i) {
                                const vR l = i == 0 ? vL : vL2;
                                const vR acc = vI + vFc * vFc * l * l;
                                vI = (vR)(((vM)acc & keep) | ((vM)vI & ~keep));
                            }
                        }
                        *(NBG_SFX(nbgi_rvec_m) *)I = vI;
                        continue;
                    }
#endif
                    for (int m = 0; m < nmat; ++m) {
                        NBG_R vtmp[9];
                        const NBG_R *v = NBG_SFX(nbgi_matrix)(p, m, vtmp);
                        /* phase 1: Miller indices */
                        NBG_R hkl[3][W], rnd[3][W], L[W] NBG_LANE_AL, Fc[W];
                        /* the rounded indices serve the table lookup, the non-square shapes and the signature */
                        NBG_SFX(nbgi_lane_hkl)(v, qf0, qf1, qf2, p->F != 0 || p->shape != NBG_SQUARE || sig != NULL,
                                               hkl, rnd);
                        /* phase 2: lattice factor; the square shape's Chebyshev recurrence runs across the lanes */
                        if (p->shape == NBG_SQUARE) {
                            NBG_SFX(nbgi_square_lanes)(p, hkl, L, 0, 0, 0);
                        } else {
                            NBG_SFX(nbgi_shape_lanes)(p, hkl, rnd, L);
                        }
                        for (int j = 0; j < W && sig != NULL; ++j) {
                            if (valid[j]) {
                                for (int x = 0; x < 3; ++x) {
                                    NBG_MIX(j, rnd[x][j]);
                                }
                                for (int x = 0; x < 3 && p->interpolate; ++x) {
                                    NBG_MIX(j, NBG_M(floor)(hkl[x][j]));
                                }
                                if (p->shape == NBG_TOPHAT) {
                                    NBG_MIX(j, L[j] == 0);
                                }
                            }
                        }
                        /* phase 3: structure factor */
                        if (p->F == 0) {
                            for (int j = 0; j < W; ++j) {
                                Fc[j] = (NBG_R)p->default_F;
                            }
                        } else {
                            for (int j = 0; j < W; ++j) {
                                long o = 0;
                                Fc[j] = (valid[j] && active[j] && (L[j] != 0 || p->water))
                                            ? NBG_SFX(nbgi_fcell)(p, hkl[0][j], hkl[1][j], hkl[2][j], (int)rnd[0][j],
                                                                 (int)rnd[1][j], (int)rnd[2][j], &o)
                                            : 0;
                                oor += o;
                            }
                        }
                        /* phase 4: accumulate (without the per-subpixel factors a select, so that it vectorises) */
                        if (!os_any) {
#pragma omp simd
                            for (int j = 0; j < W; ++j) {
                                const NBG_R acc = I[j] + Fc[j] * Fc[j] * L[j] * L[j];
                                I[j] = (live[j] != 0 && (L[j] != 0 || water)) ? acc : I[j];
                            }
                            continue;
                        }
#pragma omp simd
                        for (int j = 0; j < W; ++j) {
                            if (valid[j] && active[j] && (L[j] != 0 || water)) {
                                I[j] += Fc[j] * Fc[j] * L[j] * L[j];
                                if (p->os_thick) {
                                    I[j] *= (NBG_R)capture[j];
                                }
                                if (p->os_polar) {
                                    I[j] *= (NBG_R)polar[j];
                                }
                                if (p->os_omega) {
                                    I[j] *= (NBG_R)omega[j];
                                }
                            }
                        }
                    }
                }
            }
        }
    }
    for (int j = 0; j < n; ++j) {
        double S = p->scale * (double)I[j];
        if (!p->os_thick) {
            S *= capture[j];
        }
        if (!p->os_polar) {
            S *= polar[j];
        }
        if (!p->os_omega) {
            S *= omega[j];
        }
        out[j] = active[j] ? (float)S : 0.0f;
        if (outd != NULL) {
            outd[j] = active[j] ? S : 0.0;
        }
        if (sig != NULL) {
            sig[j] = active[j] ? hash[j] : 0;
        }
    }
    for (int j = 0; j < W; ++j) {
        osum += osl[j];
    }
    st->omega_sum += osum;
    st->oor += oor;
#undef NBG_MIX
}

#undef NBG_LANES
#undef NBG_ROW_VEC
#undef NBG_RPART_BYTES
#undef NBG_RPARTS
#undef NBG_LANE_AL
