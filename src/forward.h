/*
 * forward.h -- the forward kernels' entry points (private).
 */
#ifndef NBG_FORWARD_H
#define NBG_FORWARD_H

#include "physics.h"

/* Renders every pixel of the image (zero outside the ROI and where masked).  use_float selects the single
 * precision instantiation; image_d (NULL: none) receives the double instantiation's values unrounded (use_float is
 * then ignored).  *omega_sum receives the sum of subpixel solid angles, *oor the count of tricubic
 * windows that left the table, *image_sum the sum of the image in double (finite exactly when every pixel is); the
 * sums are added over fixed chunks of rows in chunk order, the same bits for any thread count. */
void nbgi_forward_cpu(const nbgi_kparams *p, int use_float, float *image, double *image_d, double *omega_sum,
                      long *oor, double *image_sum);

/* sum_p w[p] * I[p] over the active pixels not flagged in skip, with every pixel value in double (the gradient
 * check's loss; images themselves are stored as float).  When sig is not NULL it receives each pixel's signature
 * of discrete choices (rounded Miller indices and the like; nbgi_row's sig).  Rows are summed in order,
 * so the result does not depend on the thread count.  NaN when out of memory. */
double nbgi_forward_wsum_cpu(const nbgi_kparams *p, const float *w, const uint8_t *skip, uint64_t *sig);

/* The CPU forward's float rows (src/forward_cpu_f.c; src/forward_cpu.c renders through them): their lane count, wide
 * (one crystal matrix, where the vector registers are 256 bits wide: kernel.h's 16 lanes) or not, and pixels
 * f0 .. f0+n-1 of row s rendered into out, their solid angles added to *omega_sum and their table misses to *oor, at
 * 16 lanes or at nbgi_forward_lanes_f(0). */
int nbgi_forward_lanes_f(int wide);
void nbgi_forward_row_f16(const nbgi_kparams *p, int s, int f0, int n, float *out, double *omega_sum, long *oor);
void nbgi_forward_row_fn(const nbgi_kparams *p, int s, int f0, int n, float *out, double *omega_sum, long *oor);

#endif
