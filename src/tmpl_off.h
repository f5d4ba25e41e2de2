/*
 * tmpl_off.h -- closes a template instantiation opened by tmpl_on.h (see there).
 */
#ifndef NBG_TMPL_OPEN
#error "tmpl_off.h without tmpl_on.h"
#endif
#undef NBG_R
#undef NBG_SFX
#undef NBG_M
#undef NBG_RE
#undef NBG_FLOAT_MODE
#undef NBG_TMPL_HD
#undef NBG_TMPL
#undef NBG_TMPL_OPEN
/* the marks of the templates instantiated in this bracket */
#undef NBG_TMPL_HAS_PHYSICS
#undef NBG_TMPL_HAS_ROW
#undef NBG_TMPL_HAS_ADJOINT
#undef NBG_TMPL_HAS_ADJOINT_ROW
#undef NBG_TMPL_HAS_JVP
