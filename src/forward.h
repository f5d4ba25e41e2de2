/*
 * forward.h -- the forward kernels' entry points (private).
 */
#ifndef NBG_FORWARD_H
#define NBG_FORWARD_H

#include "physics.h"

/* Renders every pixel of the image (zero outside the ROI and where masked).  use_float selects the single
 * precision instantiation.  *omega_sum receives the sum of subpixel solid angles, *oor the count of tricubic
 * windows that left the table. */
void nbg_forward_cpu(const nbg_kparams *p, int use_float, float *image, double *omega_sum, long *oor);

#endif
