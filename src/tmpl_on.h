/*
 * tmpl_on.h, tmpl_off.h -- the one template mechanism of nbgrad (after GSL's templates_on.h / templates_off.h).
 * A *_tmpl.h file is written once for a generic scalar and instantiated per type by
 *
 *     #define NBG_TMPL NBG_TMPL_DOUBLE          (or NBG_TMPL_FLOAT, NBG_TMPL_COMPLEX)
 *     #include "tmpl_on.h"
 *     #include "physics_tmpl.h"                  (and any templates that build on it, in order)
 *     #include "tmpl_off.h"
 *
 * Between the two, tmpl_on.h defines
 *     NBG_R           the scalar type: double, float, double _Complex
 *     NBG_SFX(name)   the name with the type's suffix: name_d, name_f, name_z (and name_dn, name_fn: double and
 *                     float again, for the CPU forward's rows at the width of narrower vector units,
 *                     NBG_TMPL_DOUBLE_NARROW, NBG_TMPL_FLOAT_NARROW)
 *     NBG_M(fn)       the type's math function: fn, fn##f, c##fn (sqrt, sqrtf, csqrt)
 *     NBG_RE(x)       the real part (x itself, creal(x) for complex)
 *     NBG_FLOAT_MODE  defined for float only
 *     NBG_TMPL_HD     NBG_HD (host and device), or nothing for complex (host only)
 * and tmpl_off.h removes them.  Every *_tmpl.h stops with #error when included outside such a bracket, and a
 * template that builds on another checks, through the NBG_TMPL_HAS_* marks that tmpl_off.h clears, that the other
 * was instantiated for the same type first.
 *
 * Who instantiates what:  physics.h (physics_tmpl.h: double, float), setup.h (setup_tmpl.h: double, and double
 * complex where NBG_SETUP_COMPLEX is defined), kernel.h (row_tmpl.h: double, float), src/forward_cpu.c
 * (physics_tmpl.h and row_tmpl.h again as double narrow and float narrow, where NBG_NARROW_VECTORS),
 * grad/adjoint_cpu.c (adjoint_tmpl.h, adjoint_row_tmpl.h, jvp_tmpl.h, jvp_row_tmpl.h: double), cuda/backend.cu
 * (adjoint_tmpl.h: double, float).
 */
#ifndef NBG_TMPL_DOUBLE
#define NBG_TMPL_DOUBLE 1
#define NBG_TMPL_FLOAT 2
#define NBG_TMPL_COMPLEX 3
#define NBG_TMPL_DOUBLE_NARROW 4
#define NBG_TMPL_FLOAT_NARROW 5
#endif

#ifndef NBG_TMPL
#error "define NBG_TMPL (NBG_TMPL_DOUBLE, NBG_TMPL_FLOAT or NBG_TMPL_COMPLEX) before including tmpl_on.h"
#endif
#ifdef NBG_TMPL_OPEN
#error "tmpl_on.h included again before tmpl_off.h closed the previous instantiation"
#endif
#define NBG_TMPL_OPEN 1

#include "hd.h"

#if NBG_TMPL == NBG_TMPL_DOUBLE
#define NBG_R double
#define NBG_SFX(name) name##_d
#define NBG_M(fn) fn
#define NBG_RE(x) (x)
#define NBG_TMPL_HD NBG_HD
#elif NBG_TMPL == NBG_TMPL_DOUBLE_NARROW
#define NBG_R double
#define NBG_SFX(name) name##_dn
#define NBG_M(fn) fn
#define NBG_RE(x) (x)
#define NBG_TMPL_HD NBG_HD
#elif NBG_TMPL == NBG_TMPL_FLOAT
#define NBG_R float
#define NBG_SFX(name) name##_f
#define NBG_M(fn) fn##f
#define NBG_RE(x) (x)
#define NBG_FLOAT_MODE 1
#define NBG_TMPL_HD NBG_HD
#elif NBG_TMPL == NBG_TMPL_FLOAT_NARROW
#define NBG_R float
#define NBG_SFX(name) name##_fn
#define NBG_M(fn) fn##f
#define NBG_RE(x) (x)
#define NBG_FLOAT_MODE 1
#define NBG_TMPL_HD NBG_HD
#elif NBG_TMPL == NBG_TMPL_COMPLEX
#include <complex.h>
#undef I
#define NBG_R double _Complex
#define NBG_SFX(name) name##_z
#define NBG_M(fn) c##fn
#define NBG_RE(x) creal(x)
#define NBG_TMPL_HD
#else
#error "NBG_TMPL must be one of NBG_TMPL_DOUBLE, _FLOAT, _COMPLEX, _DOUBLE_NARROW and _FLOAT_NARROW"
#endif
