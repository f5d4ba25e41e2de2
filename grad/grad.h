/*
 * grad.h -- private declarations of the gradient code shared by its translation units.
 */
#ifndef NBG_GRAD_H
#define NBG_GRAD_H

#include "adjoint.h"
#include "plan.h"

/* Allocates the arrays of a zeroed tangent/accumulator set for this plan (free t->abc to release). */
int nbg_tangent_alloc(const nbg_plan *pl, nbg_adjacc *t);
/* The tangent of the plan-level quantities along parameter p (per CLI unit); t from nbg_tangent_alloc. */
void nbg_plan_tangent(const nbg_experiment *e, const nbg_plan *pl, nbg_param p, nbg_adjacc *t);
/* NBG_OK, or NBG_EUNSUP/NBG_EINVAL with the message, when the mask asks for what the gradient code cannot give. */
int nbg_grad_supported(nbg_ctx *ctx, const nbg_experiment *e, const nbg_plan *pl, nbg_param_mask mask);

#endif
