/*
 * kernel.h -- the forward loop nest (row_tmpl.h) in both precisions, for the CPU and CUDA forward kernels: 8 or 16
 * lanes on the CPU, one on the device (NBG_ROW_LANES, defined by cuda/backend.cu).
 */
#ifndef NBG_KERNEL_H
#define NBG_KERNEL_H

#include "geometry.h"
#include "physics.h"

#define NBG_TMPL NBG_TMPL_DOUBLE
#include "tmpl_on.h"
#include "row_tmpl.h"
#include "tmpl_off.h"

#define NBG_TMPL NBG_TMPL_FLOAT
#include "tmpl_on.h"
#include "row_tmpl.h"
#include "tmpl_off.h"

#endif
