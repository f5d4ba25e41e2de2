/*
 * kernel.h -- the forward per-pixel loop nest in both precisions, for the CPU and CUDA forward kernels.
 */
#ifndef NBG_KERNEL_H
#define NBG_KERNEL_H

#include "geometry.h"
#include "physics.h"

#define NBG_TMPL NBG_TMPL_DOUBLE
#include "tmpl_on.h"
#include "pixel_tmpl.h"
#if !defined(__CUDACC__) && !defined(__cplusplus) /* the row kernels are C (restrict) */
#include "row_tmpl.h"
#endif
#include "tmpl_off.h"

#define NBG_TMPL NBG_TMPL_FLOAT
#include "tmpl_on.h"
#include "pixel_tmpl.h"
#if !defined(__CUDACC__) && !defined(__cplusplus) /* the row kernels are C (restrict) */
#include "row_tmpl.h"
#endif
#include "tmpl_off.h"

#endif
