/*
 * grad.h -- private declarations of the gradient code shared by its translation units.
 */
#ifndef NBG_GRAD_H
#define NBG_GRAD_H

#include "adjoint.h"
#include "plan.h"
#include "param.h"

/* The most panel motions a parameter name can address. */
#define NBGI_MAX_MOTIONS 100000

/* Whether p is a panel motion's parameter, NBG_P_MOTION(*g, *c) (g, c may be NULL). */
static inline int nbgi_param_motion(nbg_param p, int *g, int *c)
{
    const long v = (long)p - NBG_P_MOTION0;
    if (v < 0 || v >= 6L * NBGI_MAX_MOTIONS) {
        return 0;
    }
    if (g != NULL) {
        *g = (int)(v / 6);
    }
    if (c != NULL) {
        *c = (int)(v % 6);
    }
    return 1;
}

/* The most mosaic domains a parameter name can address. */
#define NBGI_MAX_DOMAINS 100000

/* Whether p is a mosaic domain's own turn, NBG_P_DOMAIN(*m, *c) (m, c may be NULL). */
static inline int nbgi_param_domain(nbg_param p, int *m, int *c)
{
    const long v = (long)p - NBG_P_DOMAIN0;
    if (v < 0 || v >= 3L * NBGI_MAX_DOMAINS) {
        return 0;
    }
    if (m != NULL) {
        *m = (int)(v / 3);
    }
    if (c != NULL) {
        *c = (int)(v % 3);
    }
    return 1;
}

/* Allocates the arrays of a zeroed tangent/accumulator set for this plan (free t->abc to release). */
int nbgi_tangent_alloc(const nbgi_plan *pl, nbgi_adjacc *t);
/* The tangent of the plan-level quantities along parameter p (per CLI unit); t from nbgi_tangent_alloc. */
void nbgi_plan_tangent(const nbg_experiment *e, const nbgi_plan *pl, nbg_param p, nbgi_adjacc *t);
/* NBG_OK, or NBG_EUNSUP/NBG_EINVAL with the message, when the list asks for what the gradient code cannot give. */
int nbgi_grad_supported(nbg_ctx *ctx, const nbg_experiment *e, const nbgi_plan *pl, const nbg_param *params,
                        int nparams);
/* The modes the gradient code does not cover (nanoBragg's running-sum oversampling, the curved detector): the
 * reason's words ("with -oversample_thick/...", "for the curved detector"), or NULL. */
const char *nbgi_grad_mode_unsupported(const nbg_experiment *e);
/* Why parameter p is not free in e (pl its plan), or NULL when it is; *hard: the gradient calls refuse it (else
 * its gradient is simply zero). */
const char *nbgi_param_fixed(const nbg_experiment *e, const nbgi_plan *pl, nbg_param p, int *hard);

/* The mean and variance of the Poisson deviance of one count at mean mu, as the goodness of fit takes them (tests). */
void nbgi_deviance_moments(double mu, double *E, double *V);

#endif
