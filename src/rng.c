/*
 * rng.c -- random numbers reproducing the reference program bit for bit.
 *
 * Bit parity depends on every intermediate having the reference's type: several values are float where one
 * might expect double, and the conversions between them round.  The golden reference was built with
 * -ffp-contract=off, so fused multiply-adds are switched off here as well: a fused a*b+c rounds once where the
 * reference rounds twice.
 */
#if defined(__clang__)
#pragma STDC FP_CONTRACT OFF
#elif defined(__GNUC__)
#pragma GCC optimize("fp-contract=off")
#endif

#include "rng.h"

#include <limits.h>
#include <math.h>
#include <stddef.h>

/* Park-Miller minimal standard generator, idum <- 16807 idum mod (2^31 - 1), evaluated with Schrage's
 * factorisation m = a q + r so that no intermediate overflows 32 bits. */
#define RNG_A 16807L
#define RNG_M 2147483647L
#define RNG_Q 127773L
#define RNG_R 2836L
#define RNG_NTAB 32
#define RNG_NDIV (1L + (RNG_M - 1L) / RNG_NTAB)
#define RNG_SCALE (1.0 / RNG_M)
#define RNG_MAXOUT (1.0 - 1.2e-7)

#ifndef M_PI
#define M_PI 3.14159265358979323846
#endif

void nbgi_rng_init(nbgi_rng *r, long seed)
{
    int j;

    /* The reference stores a command-line seed n as -n; a non-positive state means "initialise on first use". */
    r->idum = seed < 0 ? (seed == LONG_MIN ? -LONG_MAX : seed) : -seed;
    r->iy = 0;
    for (j = 0; j < RNG_NTAB; ++j) r->iv[j] = 0;
    r->have_gauss = 0;
    r->gauss_next = 0.0;
}

static long schrage_step(long idum)
{
    long k = idum / RNG_Q;
    idum = RNG_A * (idum - k * RNG_Q) - RNG_R * k;
    if (idum < 0) idum += RNG_M;
    return idum;
}

float nbgi_ran1(nbgi_rng *r)
{
    long j;
    float out;

    if (r->idum <= 0 || r->iy == 0) {
        /* Initialisation: the state becomes |idum| (at least 1), 8 warm-up steps are discarded and the next 32
         * fill the shuffle table from its top entry down. */
        r->idum = (-r->idum < 1) ? 1 : -r->idum;
        for (j = RNG_NTAB + 7; j >= 0; --j) {
            r->idum = schrage_step(r->idum);
            if (j < RNG_NTAB) r->iv[j] = r->idum;
        }
        r->iy = r->iv[0];
    }
    /* Bays-Durham shuffle: the previous output picks the table slot whose content is returned and replaced. */
    r->idum = schrage_step(r->idum);
    j = r->iy / RNG_NDIV;
    r->iy = r->iv[j];
    r->iv[j] = r->idum;
    /* The scaling is done in double and rounded to float; the cap keeps the result below 1. */
    out = (float)(RNG_SCALE * (double)r->iy);
    if ((double)out > RNG_MAXOUT) return (float)RNG_MAXOUT;
    return out;
}

double nbgi_gaussdev(nbgi_rng *r)
{
    float v1, v2, rsq, fac;

    if (r->have_gauss) {
        r->have_gauss = 0;
        return r->gauss_next;
    }
    /* Polar Box-Muller: a point uniform in the unit disc gives two independent normal deviates.  The point and
     * the factor are floats in the reference. */
    do {
        v1 = (float)(2.0 * (double)nbgi_ran1(r) - 1.0);
        v2 = (float)(2.0 * (double)nbgi_ran1(r) - 1.0);
        rsq = v1 * v1 + v2 * v2;
    } while (rsq >= 1.0f || rsq == 0.0f);
    fac = (float)sqrt(-2.0 * log((double)rsq) / (double)rsq);
    r->gauss_next = (double)(v1 * fac);
    r->have_gauss = 1;
    return (double)(v2 * fac);
}

/* ln Gamma(x) by the Lanczos series (Numerical Recipes), evaluated in double and returned as a float, as the
 * reference does. */
static float gammln_f(float xx)
{
    static const double cof[6] = {76.18009172947146,     -86.50532032941677,    24.01409824083091,
                                  -1.231739572450155,    0.1208650973866179e-2, -0.5395239384953e-5};
    double x = (double)xx, y = x, tmp, ser;
    int j;

    tmp = x + 5.5;
    tmp -= (x + 0.5) * log(tmp);
    ser = 1.000000000190015;
    for (j = 0; j < 6; ++j) {
        y += 1.0;
        ser += cof[j] / y;
    }
    return (float)(-tmp + log(2.5066282746310005 * ser / x));
}

double nbgi_poidev(double xm_in, nbgi_rng *r)
{
    /* The reference takes and returns float, and keeps its working values in float. */
    const float xm = (float)xm_in;
    float em, t, y, g;

    if (xm > 1.0e6f) {
        /* Normal approximation, evaluated in double and rounded to float on return. */
        double gd = nbgi_gaussdev(r);
        return (double)(float)((double)xm + sqrt((double)xm) * gd);
    }

    if (xm < 12.0f) {
        /* Product of uniforms: the count of exponential waiting times (the logs of the uniforms) that fit in
         * xm, i.e. the number of draws whose running product stays above exp(-xm), minus one. */
        g = (float)exp(-(double)xm);
        em = -1.0f;
        t = 1.0f;
        do {
            em += 1.0f;
            t *= nbgi_ran1(r);
        } while (t > g);
        return (double)em;
    }

    /* Rejection from a Lorentzian comparison function of width sqrt(2 xm), centred at xm: the Poisson
     * probability over the (scaled) Lorentzian density, times 0.9 so that the ratio stays below 1. */
    {
        const float sq = (float)sqrt(2.0 * (double)xm);
        const float alxm = (float)log((double)xm);
        /* xm*alxm is a float product; xm + 1.0 is evaluated in double then rounded for gammln's float. */
        g = xm * alxm - gammln_f((float)((double)xm + 1.0));
        do {
            do {
                y = (float)tan(M_PI * (double)nbgi_ran1(r));
                em = sq * y + xm;
            } while (em < 0.0f);
            em = (float)floor((double)em);
            {
                float ylor = y * y;
                float ex = em * alxm - gammln_f((float)((double)em + 1.0));
                ex = ex - g;
                t = (float)(0.9 * (1.0 + (double)ylor) * exp((double)ex));
            }
        } while (nbgi_ran1(r) > t);
        return (double)em;
    }
}

void nbgi_mosaic_draw(nbgi_rng *r, double axis[3], float *capf)
{
    const double r1 = 2.0 * (double)nbgi_ran1(r) - 1.0;
    const double r2 = 2.0 * (double)nbgi_ran1(r) - 1.0;
    const double r3 = 2.0 * (double)nbgi_ran1(r) - 1.0;
    /* Axis uniform on the sphere: z = r2 uniform, azimuth pi*r1.  Angle density on the cap from (1-r3^2)^(1/3). */
    const double xyrad = sqrt(1.0 - r2 * r2);
    *capf = powf((float)(1.0 - r3 * r3), (float)(1.0 / 3.0));
    axis[0] = xyrad * sin(M_PI * r1);
    axis[1] = xyrad * cos(M_PI * r1);
    axis[2] = r2;
}

void nbgi_rodrigues_umat(const double v[3], double rot, double U[9])
{
    /* U = c I + s [v]x + (1-c) v v^T, with the reference's grouping of the products. */
    const double v1 = v[0], v2 = v[1], v3 = v[2];
    const double c = cos(rot), omc = 1.0 - c, s = sin(rot);
    U[0] = c + omc * (v1 * v1);
    U[1] = (omc * v1) * v2 - s * v3;
    U[2] = (omc * v1) * v3 + s * v2;
    U[3] = (omc * v1) * v2 + s * v3;
    U[4] = c + omc * (v2 * v2);
    U[5] = (omc * v2) * v3 - s * v1;
    U[6] = (omc * v1) * v3 - s * v2;
    U[7] = (omc * v2) * v3 + s * v1;
    U[8] = c + omc * (v3 * v3);
}

void nbgi_mosaic_umat(double spread_rad, nbgi_rng *r, double U[9], double axis[3], double *angle)
{
    /* The reference passes the spread as a float and forms the angle in single precision. */
    const float spread = (float)spread_rad;
    double v[3];
    float capf;
    nbgi_mosaic_draw(r, v, &capf);
    const double rot = (double)(spread * capf);
    nbgi_rodrigues_umat(v, rot, U);
    if (axis != NULL) {
        axis[0] = v[0];
        axis[1] = v[1];
        axis[2] = v[2];
    }
    if (angle != NULL) {
        *angle = rot;
    }
}

static double norm3(const double v[3])
{
    return sqrt(v[0] * v[0] + v[1] * v[1] + v[2] * v[2]);
}

/* Divides v by its length when that is positive. */
static void unit_if_nonzero(double v[3], double m)
{
    if (m > 0) {
        v[0] /= m;
        v[1] /= m;
        v[2] /= m;
    }
}

static void cross_unit(const double a[3], const double b[3], double out[3])
{
    out[0] = a[1] * b[2] - a[2] * b[1];
    out[1] = a[2] * b[0] - a[0] * b[2];
    out[2] = a[0] * b[1] - a[1] * b[0];
    unit_if_nonzero(out, norm3(out));
}

void nbgi_umat2misset(const double U[9], double angles_rad[3])
{
    double row[3][3], m[3], xcy[3], ycz[3], zcx[3];
    int i, j, pass;

    for (i = 0; i < 3; ++i) {
        for (j = 0; j < 3; ++j) row[i][j] = U[3 * i + j];
        m[i] = norm3(row[i]);
        unit_if_nonzero(row[i], m[i]);
    }

    /* When two rows vanish they are replaced by the matching identity rows (all three: the identity). */
    for (i = 0; i < 3; ++i) {
        int a = (i + 1) % 3, b = (i + 2) % 3;
        if (m[i] >= 0 && m[a] <= 0 && m[b] <= 0) {
            for (j = 0; j < 3; ++j) {
                row[a][j] = (j == a);
                row[b][j] = (j == b);
            }
        }
    }

    /* A vanished row becomes the unit cross product of the other two; done twice, as the reference does, so
     * that the second pass uses the rows substituted in the first. */
    for (pass = 0; pass < 2; ++pass) {
        cross_unit(row[0], row[1], xcy);
        cross_unit(row[1], row[2], ycz);
        cross_unit(row[2], row[0], zcx);
        if (m[0] <= 0) for (j = 0; j < 3; ++j) row[0][j] = ycz[j];
        if (m[1] <= 0) for (j = 0; j < 3; ++j) row[1][j] = zcx[j];
        if (m[2] <= 0) for (j = 0; j < 3; ++j) row[2][j] = xcy[j];
    }

    for (i = 0; i < 3; ++i) unit_if_nonzero(row[i], norm3(row[i]));

    /* U = Rz Ry Rx: U_zx = -sin(roty), U_zy / U_zz = tan(rotx), U_yx / U_xx = tan(rotz).  At roty = +-90 deg
     * (gimbal lock) the reference returns fixed rotx = pi, roty = pi/2 (whatever the sign). */
    if (row[2][0] * row[2][0] < 1.0) {
        angles_rad[0] = atan2(row[2][1], row[2][2]);
        angles_rad[1] = atan2(-row[2][0], sqrt(row[2][1] * row[2][1] + row[2][2] * row[2][2]));
        angles_rad[2] = atan2(row[1][0], row[0][0]);
    } else {
        angles_rad[0] = atan2(1.0, 1.0) * 4.0;
        angles_rad[1] = atan2(1.0, 1.0) * 2.0;
        angles_rad[2] = atan2(row[0][1], -row[1][1]);
    }
}
