/*
 * rng.h -- the reference program's random numbers, reproduced bit for bit: the Numerical Recipes ran1 uniform
 * generator, Gaussian and Poisson deviates, random rotations for mosaic domains and random missets, and the
 * conversion of a rotation matrix to misset angles.  Private to the library.
 */
#ifndef NBG_RNG_H
#define NBG_RNG_H

/* One random stream.  The reference keeps the shuffle table in statics shared by every stream; here each stream
 * owns its table.  Since every reference seed is stored negated, each stream re-initialises the shared table on
 * its first draw, so the sequences are the same. */
typedef struct {
    long idum;         /* Park-Miller state (<= 0 before the first draw) */
    long iy;           /* last shuffled output; 0 forces initialisation */
    long iv[32];       /* Bays-Durham shuffle table */
    int have_gauss;    /* gauss_next holds the second value of the last Box-Muller pair */
    double gauss_next;
} nbgi_rng;

/* Starts a stream as the reference does for a command-line seed n (stored as -n): the first draw initialises
 * the shuffle table from max(1, |seed|). */
void nbgi_rng_init(nbgi_rng *r, long seed);

/* Uniform deviate in (0, 1), as a float, exactly as the reference's ran1. */
float nbgi_ran1(nbgi_rng *r);

/* Unit normal deviate (polar Box-Muller, second value cached), rounded to float as in the reference. */
double nbgi_gaussdev(nbgi_rng *r);

/* Poisson deviate of mean xm (taken as a float), exactly as the reference's poidev.  Above a mean of 1e6 the
 * result is a Gaussian approximation and need not be an integer. */
double nbgi_poidev(double xm, nbgi_rng *r);

/* Random rotation within a spherical cap, as the reference's mosaic_rotation_umat: three draws give a unit axis
 * and an angle spread*(1-r3^2)^(1/3) (computed in single precision).  U is row-major and equals
 * Rodrigues(axis, *angle), i.e. cos(a) I + sin(a) [axis]x + (1 - cos(a)) axis axis^T. */
void nbgi_mosaic_umat(double spread_rad, nbgi_rng *r, double U[9], double axis[3], double *angle);

/* The three draws of one random rotation: a unit axis and the cap factor (1-r3^2)^(1/3) in single precision. */
void nbgi_mosaic_draw(nbgi_rng *r, double axis[3], float *capf);

/* Rodrigues rotation matrix (row-major) about unit axis v by angle rot, with the reference's grouping. */
void nbgi_rodrigues_umat(const double v[3], double rot, double U[9]);

/* Misset angles (rotx, roty, rotz) in radians with U = Rz*Ry*Rx, as the reference's umat2misset, including its
 * re-orthonormalisation and its treatment of the gimbal-lock case. */
void nbgi_umat2misset(const double U[9], double angles_rad[3]);

#endif
