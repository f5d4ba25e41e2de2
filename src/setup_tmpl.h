/*
 * setup_tmpl.h -- the smooth part of the set-up (crystal vectors from the cell, misset and matrix; detector
 * vectors from distance, beam centre, rotations and two-theta), written once for a generic scalar type and
 * instantiated by setup.h for double (suffix _d, used by the plan) and for double complex (suffix _z, used by the
 * gradient code to differentiate the set-up by the complex step: f'(x) = Im f(x + i h) / h with h = 1e-30, which
 * has no subtractive cancellation and is exact to rounding).  Comparisons use the real part, so the branch taken
 * is the plan's branch.
 */

/* v rotated by R_xyz = Rz*Ry*Rx (x first); a zero angle is skipped exactly as nanoBragg does. */
static inline NBG_T_HD void NBG_T_SFX(rotate_xyz)(const NBG_T *v, NBG_T rx, NBG_T ry, NBG_T rz, NBG_T *out)
{
    NBG_T x = v[0], y = v[1], z = v[2];
    if (rx != 0) {
        const NBG_T c = NBG_T_COS(rx), s = NBG_T_SIN(rx);
        const NBG_T ny = y * c - z * s, nz = y * s + z * c;
        y = ny;
        z = nz;
    }
    if (ry != 0) {
        const NBG_T c = NBG_T_COS(ry), s = NBG_T_SIN(ry);
        const NBG_T nx = x * c + z * s, nz = -x * s + z * c;
        x = nx;
        z = nz;
    }
    if (rz != 0) {
        const NBG_T c = NBG_T_COS(rz), s = NBG_T_SIN(rz);
        const NBG_T nx = x * c - y * s, ny = x * s + y * c;
        x = nx;
        y = ny;
    }
    out[0] = x;
    out[1] = y;
    out[2] = z;
}

/* Rodrigues rotation about an axis used as given (not normalised, as in nanoBragg). */
static inline NBG_T_HD void NBG_T_SFX(rotate_axis)(const NBG_T *v, const NBG_T *ax, NBG_T phi, NBG_T *out)
{
    const NBG_T c = NBG_T_COS(phi), s = NBG_T_SIN(phi);
    const NBG_T dot = (ax[0] * v[0] + ax[1] * v[1] + ax[2] * v[2]) * (1 - c);
    const NBG_T x = v[0], y = v[1], z = v[2];
    out[0] = x * c + (ax[1] * z - ax[2] * y) * s + ax[0] * dot;
    out[1] = y * c + (ax[2] * x - ax[0] * z) * s + ax[1] * dot;
    out[2] = z * c + (ax[0] * y - ax[1] * x) * s + ax[2] * dot;
}

static inline NBG_T_HD void NBG_T_SFX(cross)(const NBG_T *a, const NBG_T *b, NBG_T *out)
{
    const NBG_T x = a[1] * b[2] - a[2] * b[1];
    const NBG_T y = a[2] * b[0] - a[0] * b[2];
    const NBG_T z = a[0] * b[1] - a[1] * b[0];
    out[0] = x;
    out[1] = y;
    out[2] = z;
}

static inline NBG_T_HD NBG_T NBG_T_SFX(dot)(const NBG_T *a, const NBG_T *b) { return a[0] * b[0] + a[1] * b[1] + a[2] * b[2]; }

/* Rescales v to length len (a vector of length 0 is left alone). */
static inline NBG_T_HD void NBG_T_SFX(rescale)(NBG_T *v, NBG_T len)
{
    const NBG_T m = NBG_T_SQRT(NBG_T_SFX(dot)(v, v));
    if (m != 0) {
        for (int i = 0; i < 3; ++i) {
            v[i] *= len / m;
        }
    }
}

/* What the crystal set-up depends on.  Angles in radians, lengths in A, lambda0 in m. */
typedef struct {
    int has_cell, has_mat;
    NBG_T cell[6];      /* a b c (A), alpha beta gamma (rad), defaults already applied */
    double mat[9];      /* MOSFLM A matrix, file order */
    NBG_T lambda0;      /* m; scales the matrix */
    NBG_T misset[3];    /* rad */
} NBG_T_SFX(nbg_xtal_in);

/* Real-space vectors a, b, c (A) of the oriented crystal and the reciprocal vectors a*, b*, c* (1/A) rebuilt
 * from them, by nanoBragg's construction (section 2.7 of the behaviour description).  Returns the reciprocal
 * volume V* (0 or non-finite for a degenerate cell). */
static inline NBG_T NBG_T_SFX(nbg_crystal)(const NBG_T_SFX(nbg_xtal_in) * in, NBG_T *abc, NBG_T *astar)
{
    NBG_T as[3] = {0, 0, 0}, bs[3] = {0, 0, 0}, cs[3] = {0, 0, 0};
    NBG_T Vcell = 0;
    if (in->has_cell) {
        const NBG_T a = in->cell[0], b = in->cell[1], c = in->cell[2];
        const NBG_T al = in->cell[3], be = in->cell[4], ga = in->cell[5];
        const NBG_T s = (al + be + ga) / 2;
        NBG_T skew = NBG_T_SIN(s) * NBG_T_SIN(s - al) * NBG_T_SIN(s - be) * NBG_T_SIN(s - ga);
        if (NBG_T_RE(skew) < 0) {
            skew = -skew;
        }
        Vcell = 2.0 * a * b * c * NBG_T_SQRT(skew);
        if (NBG_T_RE(Vcell) <= 0) {
            Vcell = DBL_MIN;
        }
        const NBG_T Vs = 1.0 / Vcell;
        NBG_T ras = b * c * NBG_T_SIN(al) * Vs, rbs = c * a * NBG_T_SIN(be) * Vs, rcs = a * b * NBG_T_SIN(ga) * Vs;
        if (NBG_T_RE(ras) < 0) {
            ras = -ras;
        }
        if (NBG_T_RE(rbs) < 0) {
            rbs = -rbs;
        }
        if (NBG_T_RE(rcs) < 0) {
            rcs = -rcs;
        }
        if (NBG_T_RE(ras) <= 0) {
            ras = DBL_MIN;
        }
        if (NBG_T_RE(rbs) <= 0) {
            rbs = DBL_MIN;
        }
        if (NBG_T_RE(rcs) <= 0) {
            rcs = DBL_MIN;
        }
        NBG_T sin_gs = c * Vs / ras / rbs;
        NBG_T cos_as = (NBG_T_COS(be) * NBG_T_COS(ga) - NBG_T_COS(al)) / (NBG_T_SIN(be) * NBG_T_SIN(ga));
        NBG_T cos_bs = (NBG_T_COS(ga) * NBG_T_COS(al) - NBG_T_COS(be)) / (NBG_T_SIN(ga) * NBG_T_SIN(al));
        NBG_T cos_gs = (NBG_T_COS(al) * NBG_T_COS(be) - NBG_T_COS(ga)) / (NBG_T_SIN(al) * NBG_T_SIN(be));
        if (NBG_T_RE(sin_gs) > 1) {
            sin_gs = 1;
        }
        if (NBG_T_RE(sin_gs) < -1) {
            sin_gs = -1;
        }
        if (NBG_T_RE(cos_as * cos_as) > 1) {
            cos_as = 1;
        }
        if (NBG_T_RE(cos_bs * cos_bs) > 1) {
            cos_bs = 1;
        }
        if (NBG_T_RE(cos_gs * cos_gs) > 1) {
            cos_gs = 1;
        }
        as[0] = ras;
        bs[0] = rbs * cos_gs;
        bs[1] = rbs * sin_gs;
        cs[0] = rcs * cos_bs;
        cs[1] = rcs * (cos_as - cos_bs * cos_gs) / sin_gs;
        cs[2] = rcs * Vcell / (a * b * c * sin_gs);
    }
    if (in->has_mat) {
        /* the A matrix includes the wavelength: rows x, y, z; columns a*, b*, c* */
        const NBG_T sc = 1e-10 / in->lambda0;
        for (int i = 0; i < 3; ++i) {
            as[i] = in->mat[3 * i + 0] * sc;
            bs[i] = in->mat[3 * i + 1] * sc;
            cs[i] = in->mat[3 * i + 2] * sc;
        }
    }
    const NBG_T *mis = in->misset;
    NBG_T_SFX(rotate_xyz)(as, mis[0], mis[1], mis[2], as);
    NBG_T_SFX(rotate_xyz)(bs, mis[0], mis[1], mis[2], bs);
    NBG_T_SFX(rotate_xyz)(cs, mis[0], mis[1], mis[2], cs);

    NBG_T bxc[3], cxa[3], axb[3];
    NBG_T_SFX(cross)(as, bs, axb);
    NBG_T_SFX(cross)(bs, cs, bxc);
    NBG_T_SFX(cross)(cs, as, cxa);
    NBG_T Vstar = NBG_T_SFX(dot)(as, bxc);
    if (in->has_cell) {
        /* make the user's cell lengths exact: |b* x c*| = a / V, and so on */
        NBG_T_SFX(rescale)(bxc, in->cell[0] / Vcell);
        NBG_T_SFX(rescale)(cxa, in->cell[1] / Vcell);
        NBG_T_SFX(rescale)(axb, in->cell[2] / Vcell);
        Vstar = 1.0 / Vcell;
    }
    if (Vstar == 0) {
        return 0;
    }
    const NBG_T V = 1.0 / Vstar;
    for (int i = 0; i < 3; ++i) {
        abc[i] = bxc[i] * V;
        abc[3 + i] = cxa[i] * V;
        abc[6 + i] = axb[i] * V;
    }
    NBG_T t[3];
    for (int v = 0; v < 3; ++v) {
        NBG_T_SFX(cross)(abc + 3 * ((v + 1) % 3), abc + 3 * ((v + 2) % 3), t);
        for (int i = 0; i < 3; ++i) {
            astar[3 * v + i] = t[i] * Vstar;
        }
    }
    return Vstar;
}

/* What the detector set-up depends on (metres, radians); the unit vectors are the convention's. */
typedef struct {
    double b[3], f[3], s[3], o[3], tta[3];
    int pivot_sample;
    int have_close;       /* close_distance given */
    NBG_T Fbeam, Sbeam;   /* beam centre on the fast and slow axes (BEAM pivot) */
    NBG_T Fclose, Sclose; /* near point (SAMPLE pivot) */
    NBG_T distance, close_distance;
    NBG_T rot[3], twotheta;
} NBG_T_SFX(nbg_det_in);

typedef struct {
    NBG_T pix0[3], f[3], s[3], o[3];
    NBG_T close_distance, distance, ratio;
    NBG_T Fbeam, Sbeam, Fclose, Sclose;
} NBG_T_SFX(nbg_det_out);

/* nanoBragg's detector positioning (section 2.6): rotations then two-theta; BEAM pivot keeps the beam spot at
 * (Fbeam, Sbeam), SAMPLE pivot swings the near point; the ratio b.o ignores two-theta, as in the reference. */
static inline void NBG_T_SFX(nbg_detector)(const NBG_T_SFX(nbg_det_in) * in, NBG_T_SFX(nbg_det_out) * out)
{
    NBG_T b[3], f[3], s[3], o[3], tta[3], tmp[3], pix0[3] = {0, 0, 0};
    for (int i = 0; i < 3; ++i) {
        b[i] = in->b[i];
        f[i] = in->f[i];
        s[i] = in->s[i];
        o[i] = in->o[i];
        tta[i] = in->tta[i];
    }
    const NBG_T rx = in->rot[0], ry = in->rot[1], rz = in->rot[2], tt = in->twotheta;
    NBG_T_SFX(rotate_xyz)(o, rx, ry, rz, tmp);
    NBG_T ratio = NBG_T_SFX(dot)(b, tmp);
    if (ratio == 0) {
        ratio = DBL_MIN;
    }
    NBG_T close_distance = in->close_distance;
    if (!in->have_close) {
        close_distance = ratio * in->distance;
        if (NBG_T_RE(close_distance) < 0) {
            close_distance = -close_distance;
        }
    }
    NBG_T distance = close_distance / ratio;
    if (in->pivot_sample) {
        for (int i = 0; i < 3; ++i) {
            pix0[i] = -in->Fclose * f[i] - in->Sclose * s[i] + close_distance * o[i];
        }
        NBG_T_SFX(rotate_xyz)(pix0, rx, ry, rz, pix0);
        NBG_T_SFX(rotate_axis)(pix0, tta, tt, pix0);
    }
    NBG_T *dv[3] = {f, s, o};
    for (int i = 0; i < 3; ++i) {
        NBG_T_SFX(rotate_xyz)(dv[i], rx, ry, rz, dv[i]);
        NBG_T_SFX(rotate_axis)(dv[i], tta, tt, dv[i]);
    }
    if (!in->pivot_sample) {
        for (int i = 0; i < 3; ++i) {
            pix0[i] = -in->Fbeam * f[i] - in->Sbeam * s[i] + distance * b[i];
        }
    }
    out->Fclose = -NBG_T_SFX(dot)(pix0, f);
    out->Sclose = -NBG_T_SFX(dot)(pix0, s);
    close_distance = NBG_T_SFX(dot)(pix0, o);
    for (int i = 0; i < 3; ++i) {
        tmp[i] = close_distance / ratio * b[i] - pix0[i];
    }
    out->Fbeam = NBG_T_SFX(dot)(f, tmp);
    out->Sbeam = NBG_T_SFX(dot)(s, tmp);
    out->distance = close_distance / ratio;
    out->close_distance = close_distance;
    out->ratio = ratio;
    for (int i = 0; i < 3; ++i) {
        out->pix0[i] = pix0[i];
        out->f[i] = f[i];
        out->s[i] = s[i];
        out->o[i] = o[i];
    }
    (void)distance;
}
