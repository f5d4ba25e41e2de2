/*
 * setup_tmpl.h -- the smooth part of the set-up (crystal vectors from the cell, misset and matrix; detector
 * vectors from distance, beam centre, rotations and two-theta), written once for a generic scalar type and
 * instantiated by setup.h for double (suffix _d, used by the plan) and for double complex (suffix _z, used by the
 * gradient code to differentiate the set-up by the complex step: f'(x) = Im f(x + i h) / h with h = 1e-30, which
 * has no subtractive cancellation and is exact to rounding).  Comparisons use the real part, so the branch taken
 * is the plan's branch.
 */
#ifndef NBG_TMPL_OPEN
#error "setup_tmpl.h is a template: instantiate it through tmpl_on.h / tmpl_off.h (see src/tmpl_on.h)"
#endif

/* v rotated by R_xyz = Rz*Ry*Rx (x first); a zero angle is skipped exactly as nanoBragg does. */
static inline NBG_TMPL_HD void NBG_SFX(rotate_xyz)(const NBG_R *v, NBG_R rx, NBG_R ry, NBG_R rz, NBG_R *out)
{
    NBG_R x = v[0], y = v[1], z = v[2];
    if (rx != 0) {
        const NBG_R c = NBG_M(cos)(rx), s = NBG_M(sin)(rx);
        const NBG_R ny = y * c - z * s, nz = y * s + z * c;
        y = ny;
        z = nz;
    }
    if (ry != 0) {
        const NBG_R c = NBG_M(cos)(ry), s = NBG_M(sin)(ry);
        const NBG_R nx = x * c + z * s, nz = -x * s + z * c;
        x = nx;
        z = nz;
    }
    if (rz != 0) {
        const NBG_R c = NBG_M(cos)(rz), s = NBG_M(sin)(rz);
        const NBG_R nx = x * c - y * s, ny = x * s + y * c;
        x = nx;
        y = ny;
    }
    out[0] = x;
    out[1] = y;
    out[2] = z;
}

/* Rodrigues rotation about an axis used as given (not normalised, as in nanoBragg). */
static inline NBG_TMPL_HD void NBG_SFX(rotate_axis)(const NBG_R *v, const NBG_R *ax, NBG_R phi, NBG_R *out)
{
    const NBG_R c = NBG_M(cos)(phi), s = NBG_M(sin)(phi);
    const NBG_R dot = (ax[0] * v[0] + ax[1] * v[1] + ax[2] * v[2]) * (1 - c);
    const NBG_R x = v[0], y = v[1], z = v[2];
    out[0] = x * c + (ax[1] * z - ax[2] * y) * s + ax[0] * dot;
    out[1] = y * c + (ax[2] * x - ax[0] * z) * s + ax[1] * dot;
    out[2] = z * c + (ax[0] * y - ax[1] * x) * s + ax[2] * dot;
}

/* The spindle u tilted by t[0] about v1, then by t[1] about v2 (radians; v1, v2 unit vectors perpendicular to u,
 * nbg_experiment.spindle_tilt): out = Rot(v2, t[1]) Rot(v1, t[0]) u. */
static inline NBG_TMPL_HD void NBG_SFX(nbgi_spindle_tilt)(const NBG_R *u, const NBG_R *v1, const NBG_R *v2,
                                                         const NBG_R *t, NBG_R *out)
{
    NBG_R w[3];
    NBG_SFX(rotate_axis)(u, v1, t[0], w);
    NBG_SFX(rotate_axis)(w, v2, t[1], out);
}

static inline NBG_TMPL_HD void NBG_SFX(cross)(const NBG_R *a, const NBG_R *b, NBG_R *out)
{
    const NBG_R x = a[1] * b[2] - a[2] * b[1];
    const NBG_R y = a[2] * b[0] - a[0] * b[2];
    const NBG_R z = a[0] * b[1] - a[1] * b[0];
    out[0] = x;
    out[1] = y;
    out[2] = z;
}

static inline NBG_TMPL_HD NBG_R NBG_SFX(dot)(const NBG_R *a, const NBG_R *b) { return a[0] * b[0] + a[1] * b[1] + a[2] * b[2]; }

/* Rescales v to length len (a vector of length 0 is left alone). */
static inline NBG_TMPL_HD void NBG_SFX(rescale)(NBG_R *v, NBG_R len)
{
    const NBG_R m = NBG_M(sqrt)(NBG_SFX(dot)(v, v));
    if (m != 0) {
        for (int i = 0; i < 3; ++i) {
            v[i] *= len / m;
        }
    }
}

/* What the crystal set-up depends on.  Angles in radians, lengths in A, lambda0 in m. */
typedef struct {
    int has_cell, has_mat;
    NBG_R cell[6];      /* a b c (A), alpha beta gamma (rad), defaults already applied */
    double mat[9];      /* MOSFLM A matrix, file order */
    int has_umat;       /* with has_cell (no has_mat): the reciprocal basis is umat B(cell), exactly */
    double umat[9];     /* DIALS's U: a rotation, row-major */
    NBG_R lambda0;      /* m; scales the matrix */
    NBG_R misset[3];    /* rad */
    NBG_R orient[3];    /* rad: the small rotations about the lab's x, y, z composed after the misset */
} NBG_SFX(nbgi_xtal_in);

/* The reciprocal basis a*, b*, c* (1/A) of cell (A, rad) as U B, with B the Busing-Levy matrix (DIALS's and
 * cctbx's: a* along x, b* in the xy plane), exact for every cell: its real-space cell is the one given.  Returns the
 * cell's volume (A^3), 0 or NaN for a degenerate cell. */
static inline NBG_R NBG_SFX(nbgi_cell_ub)(const NBG_R *cell, const double *U, NBG_R *as, NBG_R *bs, NBG_R *cs)
{
    const NBG_R a = cell[0], b = cell[1], c = cell[2];
    const NBG_R ca = NBG_M(cos)(cell[3]), cb = NBG_M(cos)(cell[4]), cg = NBG_M(cos)(cell[5]);
    const NBG_R sa = NBG_M(sin)(cell[3]), sb = NBG_M(sin)(cell[4]), sg = NBG_M(sin)(cell[5]);
    const NBG_R V = a * b * c * NBG_M(sqrt)(1 - ca * ca - cb * cb - cg * cg + 2 * ca * cb * cg);
    const NBG_R ras = b * c * sa / V, rbs = c * a * sb / V, rcs = a * b * sg / V;
    const NBG_R cos_bs = (cg * ca - cb) / (sg * sa), cos_gs = (ca * cb - cg) / (sa * sb);
    const NBG_R sin_bs = NBG_M(sqrt)(1 - cos_bs * cos_bs), sin_gs = NBG_M(sqrt)(1 - cos_gs * cos_gs);
    /* B's columns */
    const NBG_R B[3][3] = {{ras, 0, 0}, {rbs * cos_gs, rbs * sin_gs, 0}, {rcs * cos_bs, -rcs * sin_bs * ca, 1 / c}};
    NBG_R *out[3] = {as, bs, cs};
    for (int v = 0; v < 3; ++v) {
        for (int i = 0; i < 3; ++i) {
            out[v][i] = U[3 * i] * B[v][0] + U[3 * i + 1] * B[v][1] + U[3 * i + 2] * B[v][2];
        }
    }
    return V;
}

/* Real-space vectors a, b, c (A) of the oriented crystal and the reciprocal vectors a*, b*, c* (1/A) rebuilt
 * from them: by nanoBragg's construction from -cell or -mat (section 2.7 of the behaviour description, whose
 * cell's angles differ from those given where two or more are not 90 deg: kept, for parity), or, with has_umat,
 * exactly as U B(cell) (a crystal read from an experiment list).  Returns the reciprocal volume V* (0 or non-finite
 * for a degenerate cell). */
static inline NBG_R NBG_SFX(nbgi_crystal)(const NBG_SFX(nbgi_xtal_in) * in, NBG_R *abc, NBG_R *astar)
{
    NBG_R as[3] = {0, 0, 0}, bs[3] = {0, 0, 0}, cs[3] = {0, 0, 0};
    NBG_R Vcell = 0;
    const int exact = in->has_cell && in->has_umat && !in->has_mat;
    if (exact) {
        Vcell = NBG_SFX(nbgi_cell_ub)(in->cell, in->umat, as, bs, cs);
    } else if (in->has_cell) {
        const NBG_R a = in->cell[0], b = in->cell[1], c = in->cell[2];
        const NBG_R al = in->cell[3], be = in->cell[4], ga = in->cell[5];
        const NBG_R s = (al + be + ga) / 2;
        NBG_R skew = NBG_M(sin)(s) * NBG_M(sin)(s - al) * NBG_M(sin)(s - be) * NBG_M(sin)(s - ga);
        if (NBG_RE(skew) < 0) {
            skew = -skew;
        }
        Vcell = 2.0 * a * b * c * NBG_M(sqrt)(skew);
        if (NBG_RE(Vcell) <= 0) {
            Vcell = DBL_MIN;
        }
        const NBG_R Vs = 1.0 / Vcell;
        NBG_R ras = b * c * NBG_M(sin)(al) * Vs, rbs = c * a * NBG_M(sin)(be) * Vs, rcs = a * b * NBG_M(sin)(ga) * Vs;
        if (NBG_RE(ras) < 0) {
            ras = -ras;
        }
        if (NBG_RE(rbs) < 0) {
            rbs = -rbs;
        }
        if (NBG_RE(rcs) < 0) {
            rcs = -rcs;
        }
        if (NBG_RE(ras) <= 0) {
            ras = DBL_MIN;
        }
        if (NBG_RE(rbs) <= 0) {
            rbs = DBL_MIN;
        }
        if (NBG_RE(rcs) <= 0) {
            rcs = DBL_MIN;
        }
        NBG_R sin_gs = c * Vs / ras / rbs;
        NBG_R cos_as = (NBG_M(cos)(be) * NBG_M(cos)(ga) - NBG_M(cos)(al)) / (NBG_M(sin)(be) * NBG_M(sin)(ga));
        NBG_R cos_bs = (NBG_M(cos)(ga) * NBG_M(cos)(al) - NBG_M(cos)(be)) / (NBG_M(sin)(ga) * NBG_M(sin)(al));
        NBG_R cos_gs = (NBG_M(cos)(al) * NBG_M(cos)(be) - NBG_M(cos)(ga)) / (NBG_M(sin)(al) * NBG_M(sin)(be));
        if (NBG_RE(sin_gs) > 1) {
            sin_gs = 1;
        }
        if (NBG_RE(sin_gs) < -1) {
            sin_gs = -1;
        }
        if (NBG_RE(cos_as * cos_as) > 1) {
            cos_as = 1;
        }
        if (NBG_RE(cos_bs * cos_bs) > 1) {
            cos_bs = 1;
        }
        if (NBG_RE(cos_gs * cos_gs) > 1) {
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
        const NBG_R sc = 1e-10 / in->lambda0;
        for (int i = 0; i < 3; ++i) {
            as[i] = in->mat[3 * i + 0] * sc;
            bs[i] = in->mat[3 * i + 1] * sc;
            cs[i] = in->mat[3 * i + 2] * sc;
        }
    }
    const NBG_R *mis = in->misset;
    NBG_SFX(rotate_xyz)(as, mis[0], mis[1], mis[2], as);
    NBG_SFX(rotate_xyz)(bs, mis[0], mis[1], mis[2], bs);
    NBG_SFX(rotate_xyz)(cs, mis[0], mis[1], mis[2], cs);
    /* the orientation offsets: Rz Ry Rx about the lab's axes, after the misset (exactly the identity at 0) */
    const NBG_R *ori = in->orient;
    NBG_SFX(rotate_xyz)(as, ori[0], ori[1], ori[2], as);
    NBG_SFX(rotate_xyz)(bs, ori[0], ori[1], ori[2], bs);
    NBG_SFX(rotate_xyz)(cs, ori[0], ori[1], ori[2], cs);

    NBG_R bxc[3], cxa[3], axb[3];
    NBG_SFX(cross)(as, bs, axb);
    NBG_SFX(cross)(bs, cs, bxc);
    NBG_SFX(cross)(cs, as, cxa);
    NBG_R Vstar = NBG_SFX(dot)(as, bxc);
    if (exact) {
        Vstar = 1.0 / Vcell;
    } else if (in->has_cell) {
        /* make the user's cell lengths exact: |b* x c*| = a / V, and so on */
        NBG_SFX(rescale)(bxc, in->cell[0] / Vcell);
        NBG_SFX(rescale)(cxa, in->cell[1] / Vcell);
        NBG_SFX(rescale)(axb, in->cell[2] / Vcell);
        Vstar = 1.0 / Vcell;
    }
    if (Vstar == 0) {
        return 0;
    }
    const NBG_R V = 1.0 / Vstar;
    for (int i = 0; i < 3; ++i) {
        abc[i] = bxc[i] * V;
        abc[3 + i] = cxa[i] * V;
        abc[6 + i] = axb[i] * V;
    }
    NBG_R t[3];
    for (int v = 0; v < 3; ++v) {
        NBG_SFX(cross)(abc + 3 * ((v + 1) % 3), abc + 3 * ((v + 2) % 3), t);
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
    NBG_R Fbeam, Sbeam;   /* beam centre on the fast and slow axes (BEAM pivot) */
    NBG_R Fclose, Sclose; /* near point (SAMPLE pivot) */
    NBG_R distance, close_distance;
    NBG_R rot[3], twotheta;
    NBG_R tau[3];         /* the placed plane turned about its near point: normal, fast, slow (DIALS's Tau1-3) */
} NBG_SFX(nbgi_det_in);

typedef struct {
    NBG_R pix0[3], f[3], s[3], o[3];
    NBG_R close_distance, distance, ratio;
    NBG_R Fbeam, Sbeam, Fclose, Sclose;
} NBG_SFX(nbgi_det_out);

/* nanoBragg's detector positioning (section 2.6): rotations then two-theta; BEAM pivot keeps the beam spot at
 * (Fbeam, Sbeam), SAMPLE pivot swings the near point; the ratio b.o ignores two-theta, as in the reference. */
static inline void NBG_SFX(nbgi_detector)(const NBG_SFX(nbgi_det_in) * in, NBG_SFX(nbgi_det_out) * out)
{
    NBG_R b[3], f[3], s[3], o[3], tta[3], tmp[3], pix0[3] = {0, 0, 0};
    for (int i = 0; i < 3; ++i) {
        b[i] = in->b[i];
        f[i] = in->f[i];
        s[i] = in->s[i];
        o[i] = in->o[i];
        tta[i] = in->tta[i];
    }
    const NBG_R rx = in->rot[0], ry = in->rot[1], rz = in->rot[2], tt = in->twotheta;
    NBG_SFX(rotate_xyz)(o, rx, ry, rz, tmp);
    NBG_R ratio = NBG_SFX(dot)(b, tmp);
    if (ratio == 0) {
        ratio = DBL_MIN;
    }
    NBG_R close_distance = in->close_distance;
    if (!in->have_close) {
        close_distance = ratio * in->distance;
        if (NBG_RE(close_distance) < 0) {
            close_distance = -close_distance;
        }
    }
    NBG_R distance = close_distance / ratio;
    if (in->pivot_sample) {
        for (int i = 0; i < 3; ++i) {
            pix0[i] = -in->Fclose * f[i] - in->Sclose * s[i] + close_distance * o[i];
        }
        NBG_SFX(rotate_xyz)(pix0, rx, ry, rz, pix0);
        NBG_SFX(rotate_axis)(pix0, tta, tt, pix0);
    }
    NBG_R *dv[3] = {f, s, o};
    for (int i = 0; i < 3; ++i) {
        NBG_SFX(rotate_xyz)(dv[i], rx, ry, rz, dv[i]);
        NBG_SFX(rotate_axis)(dv[i], tta, tt, dv[i]);
    }
    if (!in->pivot_sample) {
        for (int i = 0; i < 3; ++i) {
            pix0[i] = -in->Fbeam * f[i] - in->Sbeam * s[i] + distance * b[i];
        }
    }
    if (in->tau[0] != 0 || in->tau[1] != 0 || in->tau[2] != 0) {
        /* the placed plane turned as DIALS's detector parameterisation turns it: about the point P0 = (pix0 . o) o
         * nearest the sample, by tau[0] about its normal, then tau[1] about its fast axis, then tau[2] about its
         * slow axis, the axes as placed (not turned by the earlier tau) */
        NBG_R n0[3], f0[3], s0[3], P0[3], d[3];
        const NBG_R c0 = NBG_SFX(dot)(pix0, o);
        for (int i = 0; i < 3; ++i) {
            n0[i] = o[i];
            f0[i] = f[i];
            s0[i] = s[i];
            P0[i] = c0 * o[i];
            d[i] = pix0[i] - P0[i];
        }
        NBG_R *tv[4] = {d, f, s, o};
        for (int v = 0; v < 4; ++v) {
            NBG_SFX(rotate_axis)(tv[v], n0, in->tau[0], tv[v]);
            NBG_SFX(rotate_axis)(tv[v], f0, in->tau[1], tv[v]);
            NBG_SFX(rotate_axis)(tv[v], s0, in->tau[2], tv[v]);
        }
        for (int i = 0; i < 3; ++i) {
            pix0[i] = P0[i] + d[i];
        }
    }
    out->Fclose = -NBG_SFX(dot)(pix0, f);
    out->Sclose = -NBG_SFX(dot)(pix0, s);
    close_distance = NBG_SFX(dot)(pix0, o);
    for (int i = 0; i < 3; ++i) {
        tmp[i] = close_distance / ratio * b[i] - pix0[i];
    }
    out->Fbeam = NBG_SFX(dot)(f, tmp);
    out->Sbeam = NBG_SFX(dot)(s, tmp);
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
