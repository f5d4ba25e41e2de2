/*
 * kernel.h -- the forward per-pixel loop nest in both precisions, for the CPU and CUDA forward kernels.
 */
#ifndef NBG_KERNEL_H
#define NBG_KERNEL_H

#include "geometry.h"
#include "physics.h"

#define NBG_R double
#define NBG_SFX(name) name##_d
#include "pixel_tmpl.h"
#if !defined(__CUDACC__) && !defined(__cplusplus) /* the row kernels are C (restrict) */
#include "row_tmpl.h"
#endif
#undef NBG_R
#undef NBG_SFX

#define NBG_R float
#define NBG_SFX(name) name##_f
#define NBG_FLOAT_MODE 1
#include "pixel_tmpl.h"
#if !defined(__CUDACC__) && !defined(__cplusplus) /* the row kernels are C (restrict) */
#include "row_tmpl.h"
#endif
#undef NBG_FLOAT_MODE
#undef NBG_R
#undef NBG_SFX

#endif
