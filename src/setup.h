/*
 * setup.h -- the smooth set-up maps (crystal and detector), instantiated from setup_tmpl.h in double (_d) and,
 * where NBG_SETUP_COMPLEX is defined before inclusion, in double complex (_z) for complex-step derivatives.
 */
#ifndef NBG_SETUP_H
#define NBG_SETUP_H

#include <float.h>
#include <math.h>

#ifndef NBG_HD
#ifdef __CUDACC__
#define NBG_HD __host__ __device__
#else
#define NBG_HD
#endif
#endif

#define NBG_T double
#define NBG_T_SFX(name) name##_d
#define NBG_T_HD NBG_HD /* the double vector helpers also serve the kernels (src/geometry.h) */
#define NBG_T_COS cos
#define NBG_T_SIN sin
#define NBG_T_SQRT sqrt
#define NBG_T_RE(x) (x)
#include "setup_tmpl.h"
#undef NBG_T
#undef NBG_T_SFX
#undef NBG_T_COS
#undef NBG_T_SIN
#undef NBG_T_SQRT
#undef NBG_T_RE
#undef NBG_T_HD

#endif

#if defined(NBG_SETUP_COMPLEX) && !defined(NBG_SETUP_COMPLEX_DONE)
#define NBG_SETUP_COMPLEX_DONE
#include <complex.h>
#undef I
#define NBG_T double _Complex
#define NBG_T_SFX(name) name##_z
#define NBG_T_HD
#define NBG_T_COS ccos
#define NBG_T_SIN csin
#define NBG_T_SQRT csqrt
#define NBG_T_RE(x) creal(x)
#include "setup_tmpl.h"
#undef NBG_T
#undef NBG_T_SFX
#undef NBG_T_COS
#undef NBG_T_SIN
#undef NBG_T_SQRT
#undef NBG_T_RE
#undef NBG_T_HD
#endif
