/*
 * setup.h -- the smooth set-up maps (crystal and detector), instantiated from setup_tmpl.h in double (_d) and,
 * where NBG_SETUP_COMPLEX is defined before inclusion, in double complex (_z) for complex-step derivatives.
 */
#ifndef NBG_SETUP_H
#define NBG_SETUP_H

#include <float.h>
#include <math.h>

#include "hd.h"

#define NBG_TMPL NBG_TMPL_DOUBLE /* NBG_TMPL_HD: the double vector helpers also serve the kernels (geometry.h) */
#include "tmpl_on.h"
#include "setup_tmpl.h"
#include "tmpl_off.h"

#endif

#if defined(NBG_SETUP_COMPLEX) && !defined(NBG_SETUP_COMPLEX_DONE)
#define NBG_SETUP_COMPLEX_DONE
#define NBG_TMPL NBG_TMPL_COMPLEX
#include "tmpl_on.h"
#include "setup_tmpl.h"
#include "tmpl_off.h"
#endif
