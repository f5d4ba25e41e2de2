/*
 * test-rng.c -- the reference's random numbers (ran1, gaussdev, poidev, random rotations, umat2misset) and the
 * integer and noise images.
 *
 * Expected sequences were produced by the reference program's own ran1, gaussdev, poidev, mosaic_rotation_umat
 * and umat2misset (compiled from nanoBragg.c with -O2 -fno-fast-math -ffp-contract=off, like the golden images),
 * each from a fresh process so that the reference's shared statics started clean.  Seeds are the command-line
 * values (the reference stores them negated).
 *
 * Golden files are looked up in $NBG_GOLDEN, default ../shared/golden (relative to the repository root, where
 * the test runs); when they are missing the golden checks print SKIP.
 */
#include "nbgrad.h"
#include "rng.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifndef M_PI
#define M_PI 3.14159265358979323846
#endif

typedef struct {
    int passed, failed;
} tally;

static void report(tally *t, int ok, const char *id, const char *what, const char *got, const char *expected)
{
    if (ok) {
        printf("PASS %s %s\n", id, what);
        ++t->passed;
    } else {
        printf("FAIL %s %s got=%s expected=%s\n", id, what, got, expected);
        ++t->failed;
    }
}

static void check_double(tally *t, const char *id, const char *what, double got, double expected, double tol)
{
    char g[64], e[64];
    snprintf(g, sizeof g, "%.17g", got);
    snprintf(e, sizeof e, "%.17g", expected);
    report(t, fabs(got - expected) <= tol, id, what, g, e);
}

/* Compares a drawn sequence with the expected one, exactly (tol 0) or within tol. */
static void check_seq(tally *t, const char *id, const char *what, const double *got, const double *expected, int n,
                      double tol)
{
    int i;
    for (i = 0; i < n; ++i) {
        if (!(fabs(got[i] - expected[i]) <= tol)) {
            char g[96], e[96];
            snprintf(g, sizeof g, "[%d]%.17g", i, got[i]);
            snprintf(e, sizeof e, "[%d]%.17g", i, expected[i]);
            report(t, 0, id, what, g, e);
            return;
        }
    }
    report(t, 1, id, what, "", "");
}

/* ---------------------------------------------------------------------------------------------------------- */

static void test_ran1(tally *t)
{
    /* First six ran1 values per seed, from the reference's ran1. */
    static const struct {
        long seed;
        float v[6];
    } cases[] = {
        {42, {0.471973002f, 0.539009392f, 0.737019002f, 0.18827413f, 0.993509591f, 0.530449033f}},
        {1, {0.415999353f, 0.091964893f, 0.75641048f, 0.52970022f, 0.930436492f, 0.383502066f}},
        {12345678, {0.765989304f, 0.023453664f, 0.589726627f, 0.535101593f, 0.982231438f, 0.693016112f}},
        {7, {0.1228365f, 0.428469986f, 0.643754244f, 0.467895657f, 0.688501418f, 0.0538873039f}},
        {0, {0.415999353f, 0.091964893f, 0.75641048f, 0.52970022f, 0.930436492f, 0.383502066f}},
        {2147483646, {0.933157742f, 0.616497934f, 0.582514048f, 0.313227296f, 0.298809409f, 0.0896791667f}},
    };
    size_t c;
    int i;

    for (c = 0; c < sizeof cases / sizeof cases[0]; ++c) {
        nbgi_rng r;
        double got[6], exp6[6];
        char id[64], what[96];
        nbgi_rng_init(&r, cases[c].seed);
        for (i = 0; i < 6; ++i) {
            got[i] = nbgi_ran1(&r);
            exp6[i] = cases[c].v[i];
        }
        snprintf(id, sizeof id, "ran1-seed%ld", cases[c].seed);
        snprintf(what, sizeof what, "first 6 ran1 values for seed %ld match the reference", cases[c].seed);
        check_seq(t, id, what, got, exp6, 6, 0.0);
    }

    /* A negative seed is treated like its absolute value. */
    {
        nbgi_rng a, b;
        int same = 1;
        nbgi_rng_init(&a, -42);
        nbgi_rng_init(&b, 42);
        for (i = 0; i < 100; ++i) same &= nbgi_ran1(&a) == nbgi_ran1(&b);
        report(t, same, "ran1-negseed", "seed -42 gives the same stream as 42", "differs", "same");
    }

    /* Range: (0, 1) over many draws. */
    {
        nbgi_rng r;
        float lo = 1.0f, hi = 0.0f;
        nbgi_rng_init(&r, 99);
        for (i = 0; i < 1000000; ++i) {
            float v = nbgi_ran1(&r);
            if (v < lo) lo = v;
            if (v > hi) hi = v;
        }
        {
            char g[64];
            snprintf(g, sizeof g, "[%.9g,%.9g]", lo, hi);
            report(t, lo > 0.0f && hi < 1.0f, "ran1-range", "1e6 draws lie in (0,1)", g, "(0,1)");
        }
    }
}

static void test_gaussdev(tally *t)
{
    /* From the reference's gaussdev, seed 9 (pairs: the second of each pair is the cached value). */
    static const double expected[8] = {-0.312969714, -1.31993592, -0.52765137,  0.915552139,
                                       -0.618791521, -1.24118972, -0.0945106819, 0.817465007};
    double got[8], e[8];
    nbgi_rng r;
    int i;
    nbgi_rng_init(&r, 9);
    for (i = 0; i < 8; ++i) {
        got[i] = nbgi_gaussdev(&r);
        e[i] = (float)expected[i];
    }
    check_seq(t, "gaussdev-seed9", "first 8 gaussdev values for seed 9 match the reference", got, e, 8, 0.0);
}

static void poidev_seq(tally *t, const char *id, const char *what, double mean, long seed, const double *expected)
{
    double got[12], e[12];
    nbgi_rng r;
    int i;
    nbgi_rng_init(&r, seed);
    for (i = 0; i < 12; ++i) {
        got[i] = nbgi_poidev(mean, &r);
        e[i] = (float)expected[i];
    }
    check_seq(t, id, what, got, e, 12, 0.0);
}

static void poidev_stats(tally *t, const char *id, double mean, long seed, int n)
{
    nbgi_rng r;
    double s = 0.0, s2 = 0.0, m, var, tol_m, tol_v;
    int i;
    char what[128], g[96], e[96];

    nbgi_rng_init(&r, seed);
    for (i = 0; i < n; ++i) {
        double x = nbgi_poidev(mean, &r);
        s += x;
        s2 += x * x;
    }
    m = s / n;
    var = (s2 - s * m) / (n - 1);
    /* Five standard errors: sd(mean) = sqrt(mean/n); sd(var)/var ~ sqrt(2/n + 1/(mean n)). */
    tol_m = 5.0 * sqrt(mean / n);
    tol_v = 5.0 * sqrt(2.0 / n + 1.0 / (mean * n));
    snprintf(what, sizeof what, "mean and variance of %d draws at mean %g are Poisson's", n, mean);
    snprintf(g, sizeof g, "mean=%.6g,var=%.6g", m, var);
    snprintf(e, sizeof e, "mean=%.6g+-%.3g,var=%.6g(rel+-%.3g)", mean, tol_m, mean, tol_v);
    report(t, fabs(m - mean) <= tol_m && fabs(var / mean - 1.0) <= tol_v, id, what, g, e);
}

static void test_poidev(tally *t)
{
    /* Sequences from the reference's poidev. */
    static const double low[12] = {5, 2, 0, 3, 3, 2, 2, 5, 3, 3, 5, 2};
    static const double mid[12] = {131, 149, 154, 167, 136, 153, 145, 144, 123, 149, 149, 167};
    static const double high[12] = {2003515.88, 1997474,    1998887,    2000846.25, 2000018.38, 2000298.25,
                                    1998307.62, 1997880.25, 1998459.75, 1999852.25, 1999027.62, 2001091.62};
    static const double zero[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0};
    static const double below12[12] = {13, 7, 10, 16, 15, 8, 13, 11, 11, 20, 14, 7};
    static const double at12[12] = {10, 7, 12, 8, 15, 13, 12, 4, 15, 17, 17, 11};
    static const double below1e6[12] = {999529, 998727,  1000168, 1000677, 999514,  998998,
                                        1001083, 1000476, 1000058, 997959,  1000907, 1001595};

    poidev_seq(t, "poidev-3.5", "mean 3.5, seed 42 (product method) matches the reference", 3.5, 42, low);
    poidev_seq(t, "poidev-150", "mean 150, seed 42 (Lorentzian rejection) matches the reference", 150.0, 42, mid);
    poidev_seq(t, "poidev-2e6", "mean 2e6, seed 42 (Gaussian) matches the reference", 2e6, 42, high);
    poidev_seq(t, "poidev-0", "mean 0, seed 5 gives zeros", 0.0, 5, zero);
    poidev_seq(t, "poidev-11.9", "mean 11.9, seed 3 matches the reference", 11.9, 3, below12);
    poidev_seq(t, "poidev-12", "mean 12, seed 3 (rejection at the boundary) matches the reference", 12.0, 3, at12);
    poidev_seq(t, "poidev-999999", "mean 999999, seed 3 (rejection) matches the reference", 999999.0, 3, below1e6);

    /* A zero mean still draws once per call, like the reference. */
    {
        nbgi_rng a, b;
        nbgi_rng_init(&a, 11);
        nbgi_rng_init(&b, 11);
        (void)nbgi_poidev(0.0, &a);
        (void)nbgi_ran1(&b);
        report(t, nbgi_ran1(&a) == nbgi_ran1(&b), "poidev-0-draw", "mean 0 consumes exactly one draw", "differs",
               "one draw");
    }

    poidev_stats(t, "poidev-stats-3.5", 3.5, 1, 400000);
    poidev_stats(t, "poidev-stats-150", 150.0, 2, 400000);
    poidev_stats(t, "poidev-stats-2e6", 2e6, 3, 400000);
}

/* ---------------------------------------------------------------------------------------------------------- */

static void matmul3(const double A[9], const double B[9], double C[9])
{
    int i, j, k;
    for (i = 0; i < 3; ++i)
        for (j = 0; j < 3; ++j) {
            double s = 0.0;
            for (k = 0; k < 3; ++k) s += A[3 * i + k] * B[3 * k + j];
            C[3 * i + j] = s;
        }
}

static void rot_xyz(double ax, double ay, double az, double R[9])
{
    double Rx[9] = {1, 0, 0, 0, cos(ax), -sin(ax), 0, sin(ax), cos(ax)};
    double Ry[9] = {cos(ay), 0, sin(ay), 0, 1, 0, -sin(ay), 0, cos(ay)};
    double Rz[9] = {cos(az), -sin(az), 0, sin(az), cos(az), 0, 0, 0, 1};
    double T[9];
    matmul3(Ry, Rx, T);
    matmul3(Rz, T, R);
}

static double max_abs_diff9(const double A[9], const double B[9])
{
    double m = 0.0;
    int i;
    for (i = 0; i < 9; ++i)
        if (fabs(A[i] - B[i]) > m || isnan(A[i] - B[i])) m = isnan(A[i] - B[i]) ? INFINITY : fabs(A[i] - B[i]);
    return m;
}

static void check_rotation(tally *t, const char *id, const double U[9], const double axis[3], double angle,
                           double spread)
{
    double UT[9], P[9], I[9] = {1, 0, 0, 0, 1, 0, 0, 0, 1}, Rr[9], det, an, c, s;
    char what[128], g[64];
    int i, j;

    for (i = 0; i < 3; ++i)
        for (j = 0; j < 3; ++j) UT[3 * i + j] = U[3 * j + i];
    matmul3(U, UT, P);
    snprintf(what, sizeof what, "U U^T = I");
    snprintf(g, sizeof g, "%.3g", max_abs_diff9(P, I));
    report(t, max_abs_diff9(P, I) < 1e-12, id, what, g, "<1e-12");

    det = U[0] * (U[4] * U[8] - U[5] * U[7]) - U[1] * (U[3] * U[8] - U[5] * U[6]) +
          U[2] * (U[3] * U[7] - U[4] * U[6]);
    check_double(t, id, "det U = 1", det, 1.0, 1e-12);

    an = sqrt(axis[0] * axis[0] + axis[1] * axis[1] + axis[2] * axis[2]);
    check_double(t, id, "axis has unit length", an, 1.0, 1e-12);

    snprintf(g, sizeof g, "%.17g", angle);
    snprintf(what, sizeof what, "angle in [0, spread %g]", spread);
    report(t, angle >= 0.0 && angle <= (float)spread, id, what, g, "in range");

    /* Rodrigues from the returned axis and angle rebuilds U. */
    c = cos(angle);
    s = sin(angle);
    for (i = 0; i < 3; ++i)
        for (j = 0; j < 3; ++j) Rr[3 * i + j] = (i == j ? c : 0.0) + (1.0 - c) * axis[i] * axis[j];
    Rr[1] -= s * axis[2];
    Rr[2] += s * axis[1];
    Rr[3] += s * axis[2];
    Rr[5] -= s * axis[0];
    Rr[6] -= s * axis[1];
    Rr[7] += s * axis[0];
    snprintf(g, sizeof g, "%.3g", max_abs_diff9(Rr, U));
    report(t, max_abs_diff9(Rr, U) < 1e-12, id, "U = Rodrigues(axis, angle)", g, "<1e-12");

    /* The angle also follows from the trace: tr U = 1 + 2 cos(angle). */
    check_double(t, id, "1 + 2 cos(angle) = trace", 1.0 + 2.0 * c, U[0] + U[4] + U[8], 1e-12);
}

static void test_mosaic(tally *t)
{
    /* From the reference's mosaic_rotation_umat: two successive matrices for spread 0.5 rad and seed 12345678,
     * and for spread 90 (the random misset) and seed 1234, with umat2misset of each. */
    static const double ref_small[2][9] = {
        {0.89103859195446655, 0.45129642953449239, -0.048803282033286738, -0.45348741189897984, 0.8802813891810245,
         -0.13947703434863595, -0.019984866698744181, 0.14641109435744454, 0.98902193936842919},
        {0.89020169854116971, -0.43842832401244231, 0.12378021093073518, 0.44171181627388806, 0.8971564146289237,
         0.0010193400794988143, -0.11149711780328367, 0.053767763518819095, 0.99230913546522637}};
    static const double ref_small_misset[2][3] = {{0.14696885398170506, 0.019986197246857084, -0.47077599256232416},
                                                  {0.054131554491064361, 0.11172943452619391, 0.46059734188085399}};
    static const double ref_big[2][9] = {
        {0.27144121856265235, -0.4968097370042735, -0.8243177482518298, 0.95612725672684662, 0.041143727758036569,
         0.29004803500483756, -0.11018318296916862, -0.86688365937068923, 0.48618143455593366},
        {-0.23679471706520647, -0.30943449139219625, -0.92096610008559032, -0.63194525133624513,
         0.76905541969534852, -0.095911212852206107, 0.73795220799424321, 0.55928888508003105,
         -0.37765391794916831}};
    static const double ref_big_misset[2][3] = {{-1.0596701712026519, 0.11040735325448157, 1.294178032262796},
                                                {2.1647104735480838, -0.83003087566223888, -1.9293106614332562}};
    /* libm's sin/cos/atan2 may differ by an ulp between systems: allow a few. */
    const double tol = 1e-14;
    nbgi_rng r;
    double U[9], axis[3], angle, ang[3];
    int k;

    nbgi_rng_init(&r, 12345678);
    for (k = 0; k < 2; ++k) {
        char id[64];
        snprintf(id, sizeof id, "mosaic-umat-0.5-%d", k);
        nbgi_mosaic_umat(0.5, &r, U, axis, &angle);
        check_seq(t, id, "matrix for spread 0.5 rad, seed 12345678 matches the reference", U, ref_small[k], 9, tol);
        check_rotation(t, id, U, axis, angle, 0.5);
        nbgi_umat2misset(U, ang);
        check_seq(t, id, "umat2misset matches the reference", ang, ref_small_misset[k], 3, tol);
    }
    nbgi_rng_init(&r, 1234);
    for (k = 0; k < 2; ++k) {
        char id[64];
        snprintf(id, sizeof id, "mosaic-umat-90-%d", k);
        nbgi_mosaic_umat(90.0, &r, U, axis, &angle);
        check_seq(t, id, "matrix for spread 90, seed 1234 matches the reference", U, ref_big[k], 9, tol);
        check_rotation(t, id, U, axis, angle, 90.0);
        nbgi_umat2misset(U, ang);
        check_seq(t, id, "umat2misset matches the reference", ang, ref_big_misset[k], 3, tol);
    }

    /* -misset random -misset_seed 12345: the golden run printed 105.720755 -34.951318 -97.823571 deg. */
    {
        static const double deg[3] = {105.720755, -34.951318, -97.823571};
        double got[3];
        nbgi_rng_init(&r, 12345);
        nbgi_mosaic_umat(90.0, &r, U, NULL, NULL);
        nbgi_umat2misset(U, ang);
        for (k = 0; k < 3; ++k) got[k] = ang[k] * 180.0 / M_PI;
        check_seq(t, "misset-random-12345", "random misset for seed 12345 is the golden run's (deg, %f)", got, deg,
                  3, 5e-7);
    }
}

static void test_umat2misset(tally *t)
{
    static const double angles[][3] = {
        {0.3, -0.7, 1.2}, {-2.5, 1.1, 3.0}, {0.0, 0.0, 0.0}, {3.1, -1.5, -3.1}, {1e-9, 2e-9, -3e-9}};
    double R[9], got[3], back[9];
    size_t c;
    int i;
    char id[64], g[64];

    for (c = 0; c < sizeof angles / sizeof angles[0]; ++c) {
        rot_xyz(angles[c][0], angles[c][1], angles[c][2], R);
        nbgi_umat2misset(R, got);
        snprintf(id, sizeof id, "umat2misset-roundtrip-%zu", c);
        check_seq(t, id, "angles of Rz*Ry*Rx are recovered", got, angles[c], 3, 1e-12);
    }

    /* A matrix scaled by 3 is re-normalised first. */
    rot_xyz(0.4, 0.2, -0.9, R);
    for (i = 0; i < 9; ++i) R[i] *= 3.0;
    nbgi_umat2misset(R, got);
    {
        const double e[3] = {0.4, 0.2, -0.9};
        check_seq(t, "umat2misset-scaled", "rows are normalised before the angles are read", got, e, 3, 1e-12);
    }

    /* A zero row is replaced by the cross product of the other two. */
    {
        const double e[3] = {-0.6, 0.5, 2.0};
        for (i = 0; i < 3; ++i) {
            rot_xyz(e[0], e[1], e[2], R);
            R[3 * i] = R[3 * i + 1] = R[3 * i + 2] = 0.0;
            nbgi_umat2misset(R, got);
            snprintf(id, sizeof id, "umat2misset-zero-row-%d", i);
            check_seq(t, id, "a zero row is rebuilt from the other two", got, e, 3, 1e-12);
        }
    }

    /* The zero matrix becomes the identity. */
    {
        const double Z[9] = {0}, e[3] = {0, 0, 0};
        nbgi_umat2misset(Z, got);
        check_seq(t, "umat2misset-zero", "the zero matrix gives zero angles", got, e, 3, 0.0);
    }

    /* Gimbal lock (roty = +-90 deg): the reference's fixed rotx = pi, roty = pi/2, rotz = atan2(U_xy, -U_yy). */
    {
        double U[9] = {0, 0, 1, 0, 1, 0, -1, 0, 0}, e[3];
        nbgi_umat2misset(U, got);
        e[0] = M_PI;
        e[1] = M_PI / 2;
        e[2] = atan2(0.0, -1.0);
        check_seq(t, "umat2misset-gimbal", "degenerate case returns the reference's fixed angles", got, e, 3, 0.0);
        /* Those angles rebuild the matrix for this case. */
        rot_xyz(got[0], got[1], got[2], back);
        snprintf(g, sizeof g, "%.3g", max_abs_diff9(back, U));
        report(t, max_abs_diff9(back, U) < 1e-12, "umat2misset-gimbal-rebuild",
               "the degenerate angles rebuild Ry(90 deg)", g, "<1e-12");
    }
}

/* ---------------------------------------------------------------------------------------------------------- */

static void *read_file(const char *path, size_t *size)
{
    FILE *f = fopen(path, "rb");
    char *buf = NULL;
    long n;
    if (f == NULL) return NULL;
    if (fseek(f, 0, SEEK_END) == 0 && (n = ftell(f)) >= 0 && fseek(f, 0, SEEK_SET) == 0) {
        buf = malloc((size_t)n + 1);
        if (buf != NULL && fread(buf, 1, (size_t)n, f) != (size_t)n) {
            free(buf);
            buf = NULL;
        }
        if (buf != NULL) {
            buf[n] = '\0';
            *size = (size_t)n;
        }
    }
    fclose(f);
    return buf;
}

static const char *golden_dir(void)
{
    const char *g = getenv("NBG_GOLDEN");
    return (g != NULL && g[0] != '\0') ? g : "../shared/golden";
}

/* Loads a golden float image and, when smv_ext is not NULL, the matching SMV image (512-byte header). */
static int load_golden(const char *name, int npix, const char *smv_ext, float **img, uint16_t **smv, char *why,
                       size_t whylen)
{
    char path[1024];
    size_t n = 0;
    void *raw;

    snprintf(path, sizeof path, "%s/images/%s.float.bin", golden_dir(), name);
    *img = read_file(path, &n);
    if (*img == NULL || n != (size_t)npix * sizeof(float)) {
        snprintf(why, whylen, "cannot read %s as %d floats", path, npix);
        free(*img);
        *img = NULL;
        return 0;
    }
    if (smv_ext == NULL) return 1;
    snprintf(path, sizeof path, "%s/images/%s.%s", golden_dir(), name, smv_ext);
    raw = read_file(path, &n);
    if (raw == NULL || n != 512 + (size_t)npix * sizeof(uint16_t) || strstr((char *)raw, "HEADER_BYTES=512;") == NULL) {
        snprintf(why, whylen, "cannot read %s as a 512-byte header and %d pixels", path, npix);
        free(raw);
        free(*img);
        *img = NULL;
        return 0;
    }
    *smv = malloc((size_t)npix * sizeof(uint16_t));
    memcpy(*smv, (char *)raw + 512, (size_t)npix * sizeof(uint16_t));
    free(raw);
    return 1;
}

/* Photons and overloads the reference printed for a case, or 0 when its stdout has no such line. */
static int golden_photons(const char *name, long *photons, long *overloads)
{
    char path[1024];
    size_t n = 0;
    char *txt, *line;
    int ok = 0;

    snprintf(path, sizeof path, "%s/images/%s.stdout.txt", golden_dir(), name);
    txt = read_file(path, &n);
    if (txt == NULL) return 0;
    for (line = txt; line != NULL && *line != '\0';) {
        char *next = strchr(line, '\n');
        if (next != NULL) *next++ = '\0';
        if (sscanf(line, "%ld photons on noise image (%ld overloads)", photons, overloads) == 2) ok = 1;
        line = next;
    }
    free(txt);
    return ok;
}

static void test_golden_noise(tally *t, const char *name, int size, long seed)
{
    const int npix = size * size;
    float *img = NULL;
    uint16_t *ref = NULL, *out;
    char why[1200], id[96], what[160], g[96], e[96];
    long photons = -1, overloads = -1, ref_photons, ref_overloads;
    int roi[4] = {-1, -1, -1, -1}, i, ndiff = 0, first = -1;

    snprintf(id, sizeof id, "golden-noise-%s", name);
    if (!load_golden(name, npix, "noise.img", &img, &ref, why, sizeof why)) {
        printf("SKIP %s (%s)\n", id, why);
        return;
    }
    out = malloc((size_t)npix * sizeof(uint16_t));
    nbg_noise_image(NULL, img, size, size, roi, 40.0, seed, out, &photons, &overloads);
    for (i = 0; i < npix; ++i)
        if (out[i] != ref[i]) {
            if (first < 0) first = i;
            ++ndiff;
        }
    snprintf(what, sizeof what, "noise image, seed %ld, adc 40, %dx%d: identical pixels", seed, size, size);
    snprintf(g, sizeof g, "%d differ, first [%d]=%d", ndiff, first, first >= 0 ? out[first] : 0);
    if (first >= 0)
        snprintf(e, sizeof e, "0 differ, [%d]=%d", first, ref[first]);
    else
        snprintf(e, sizeof e, "0 differ");
    report(t, ndiff == 0, id, what, g, e);

    snprintf(id, sizeof id, "golden-photons-%s", name);
    if (golden_photons(name, &ref_photons, &ref_overloads)) {
        snprintf(g, sizeof g, "%ld photons, %ld overloads", photons, overloads);
        snprintf(e, sizeof e, "%ld photons, %ld overloads", ref_photons, ref_overloads);
        report(t, photons == ref_photons && overloads == ref_overloads, id,
               "photon and overload counts are those the reference printed", g, e);
    } else {
        printf("SKIP %s (no photon count in %s/images/%s.stdout.txt)\n", id, golden_dir(), name);
    }

    /* ROI: outside pixels are 0 and draw nothing, so the inside follows one stream in row-major order. */
    {
        int r2[4] = {5, 30, 10, 20}, f, s, ok = 1;
        nbgi_rng rng;
        long ph = 0, ov = 0;
        nbg_noise_image(NULL, img, size, size, r2, 40.0, seed, out, &ph, &ov);
        nbgi_rng_init(&rng, seed);
        for (s = 0; s < size; ++s)
            for (f = 0; f < size; ++f) {
                int in = f >= r2[0] && f <= r2[1] && s >= r2[2] && s <= r2[3];
                double v = in ? nbgi_poidev(img[s * size + f], &rng) + 40.0 : 0.0;
                if (v > 65535.0) v = 65535.0;
                if (out[s * size + f] != (uint16_t)v) ok = 0;
            }
        snprintf(id, sizeof id, "noise-roi-%s", name);
        report(t, ok, id, "ROI noise: zeros outside, one row-major stream inside", "mismatch", "match");
    }
    free(out);
    free(ref);
    free(img);
}

static void test_golden_int(tally *t)
{
    const int size = 128, npix = size * size;
    float *img = NULL;
    uint16_t *ref = NULL, *out;
    char why[1200], g[96], e[96];
    int roi[4] = {-1, -1, -1, -1}, i, worst = 0, at = -1;

    if (!load_golden("int_scale_adc", npix, "int.img", &img, &ref, why, sizeof why)) {
        printf("SKIP golden-int-scale-adc (%s)\n", why);
        return;
    }
    out = malloc((size_t)npix * sizeof(uint16_t));
    nbg_int_image(NULL, img, size, size, roi, 2000.0, 10.0, out);
    for (i = 0; i < npix; ++i) {
        int d = abs((int)out[i] - (int)ref[i]);
        if (d > worst) {
            worst = d;
            at = i;
        }
    }
    snprintf(g, sizeof g, "max diff %d at %d", worst, at);
    snprintf(e, sizeof e, "<=1");
    report(t, worst <= 1, "golden-int-scale-adc", "int image, scale 2000, adc 10: pixels within 1 count", g, e);

    /* The same image converted by hand: identical. */
    {
        int same = 1;
        for (i = 0; i < npix; ++i) {
            double v = (double)img[i] * 2000.0 + 10.0;
            v = v > 65535.0 ? 65535.0 : (v < 0.0 ? 0.0 : v);
            same &= out[i] == (uint16_t)floorf((float)(v + 0.5));
        }
        report(t, same, "int-image-formula", "int = floorf(clip(v*scale + adc) + 0.5)", "differs", "same");
    }
    free(out);
    free(ref);
    free(img);
}

static void test_int_image_small(tally *t)
{
    const float img[12] = {0.0f, 1.0f, -5.0f, 1e9f, 0.25f, 0.2499f, NAN, 3.0f, 2.0f, 2.0f, 2.0f, 2.0f};
    const int roi[4] = {1, 2, 0, 1};
    uint16_t out[12];
    const uint16_t expected[12] = {0, 11, 5, 0, 0, 10, 0, 0, 0, 0, 0, 0};
    const uint16_t full[12] = {10, 11, 5, 65535, 10, 10, 0, 13, 12, 12, 12, 12};
    char g[128];
    int i, ok = 1;

    nbg_int_image(NULL, img, 4, 3, roi, 1.0, 10.0, out);
    for (i = 0; i < 12; ++i) ok &= out[i] == expected[i];
    snprintf(g, sizeof g, "%u %u %u %u / %u %u %u %u", out[0], out[1], out[2], out[3], out[4], out[5], out[6],
             out[7]);
    report(t, ok, "int-image-roi", "ROI x 1..2, y 0..1 (inclusive); outside 0", g, "0 11 5 0 / 0 10 0 0");

    nbg_int_image(NULL, img, 4, 3, NULL, 1.0, 10.0, out);
    ok = 1;
    for (i = 0; i < 12; ++i) ok &= out[i] == full[i];
    snprintf(g, sizeof g, "%u %u %u %u / %u %u %u %u", out[0], out[1], out[2], out[3], out[4], out[5], out[6],
             out[7]);
    report(t, ok, "int-image-clip", "NULL roi is the whole detector; clipping, rounding and NaN", g,
           "10 11 5 65535 / 10 10 0 13");
}

static void test_noise_small(tally *t)
{
    /* Overloads: n + adc above 65535 is clamped and counted. */
    const float img[4] = {70000.0f, 10.0f, 0.0f, 65500.0f};
    uint16_t out[4], out2[4];
    long ph = 0, ov = 0, ph2 = 0, ov2 = 0;
    char g[96];
    nbg_noise_image(NULL, img, 2, 2, NULL, 100.0, 3, out, &ph, &ov);
    snprintf(g, sizeof g, "out0=%u out2=%u ov=%ld", out[0], out[2], ov);
    report(t, out[0] == 65535 && out[2] == 100 && ov >= 1, "noise-overload", "overloads clamp at 65535 and count",
           g, "out0=65535 out2=100 ov>=1");
    nbg_noise_image(NULL, img, 2, 2, NULL, 100.0, 3, out2, &ph2, &ov2);
    report(t, memcmp(out, out2, sizeof out) == 0 && ph == ph2 && ov == ov2, "noise-repeat",
           "the same seed gives the same image", "differs", "same");
    nbg_noise_image(NULL, img, 2, 2, NULL, 100.0, 4, out2, &ph2, &ov2);
    report(t, ph != ph2, "noise-seed", "seeds 3 and 4 give different photon totals", "same", "different");
}

int main(void)
{
    tally t = {0, 0};

    test_ran1(&t);
    test_gaussdev(&t);
    test_poidev(&t);
    test_mosaic(&t);
    test_umat2misset(&t);
    test_int_image_small(&t);
    test_noise_small(&t);
    test_golden_noise(&t, "noise_seeded", 128, 42);
    test_golden_noise(&t, "noise_high_counts", 64, 7);
    test_golden_int(&t);

    printf("%d passed, %d failed\n", t.passed, t.failed);
    return t.failed == 0 ? 0 : 1;
}
