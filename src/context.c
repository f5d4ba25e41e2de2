/*
 * context.c -- contexts, status codes and the error funnel.
 */
#include "internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

double nbgi_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

const char *nbg_strerror(int status)
{
    switch (status) {
    case NBG_OK: return "success";
    case NBG_EINVAL: return "invalid argument";
    case NBG_ENOMEM: return "out of memory";
    case NBG_EIO: return "input/output error";
    case NBG_EFORMAT: return "malformed file";
    case NBG_EUNSUP: return "not supported";
    case NBG_ENODEV: return "no CUDA device";
    case NBG_ECUDA: return "CUDA error";
    default: return "unknown status";
    }
}

int nbgi_error(nbg_ctx *ctx, int code, const char *fmt, ...)
{
    if (ctx != NULL) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(ctx->errmsg, sizeof ctx->errmsg, fmt, ap);
        va_end(ap);
    }
    return code;
}

const char *nbg_errmsg(const nbg_ctx *ctx)
{
    return ctx != NULL ? ctx->errmsg : "no context";
}

void nbg_ctx_set_progress(nbg_ctx *ctx, nbg_progress_fn fn, void *user)
{
    if (ctx != NULL) {
        ctx->progress = fn;
        ctx->progress_user = user;
    }
}

/* --- limits ------------------------------------------------------------------------------------------------ */

void nbg_limits_default(nbg_limits *l)
{
    if (l != NULL) {
        l->max_bytes = 4.0 * 1024 * 1024 * 1024;
        l->max_samples = 1e12;
    }
}

int nbg_ctx_set_limits(nbg_ctx *ctx, const nbg_limits *l)
{
    if (ctx == NULL || l == NULL) {
        return nbgi_error(ctx, NBG_EINVAL, "nbg_ctx_set_limits: NULL argument");
    }
    if (!(l->max_bytes > 0) || !(l->max_samples > 0)) {
        return nbgi_error(ctx, NBG_EINVAL, "limits must be positive (got max_bytes %g, max_samples %g)", l->max_bytes,
                         l->max_samples);
    }
    ctx->limits = *l;
    return NBG_OK;
}

int nbg_ctx_limits(const nbg_ctx *ctx, nbg_limits *l)
{
    if (ctx == NULL || l == NULL) {
        return NBG_EINVAL;
    }
    *l = ctx->limits;
    return NBG_OK;
}

void nbgi_limits_of(const nbg_ctx *ctx, nbg_limits *l)
{
    if (ctx != NULL) {
        *l = ctx->limits;
    } else {
        nbg_limits_default(l);
    }
}

int nbgi_check_bytes(nbg_ctx *ctx, double bytes, const char *what)
{
    nbg_limits l;
    nbgi_limits_of(ctx, &l);
    if (bytes <= l.max_bytes) {
        return NBG_OK;
    }
    return nbgi_error(ctx, NBG_ENOMEM, "%s would need %.3g GiB of memory, above the limit of %.3g GiB: check the "
                     "input, or raise the limit (-max_memory GiB on the command line, nbg_ctx_set_limits in the library)",
                     what, bytes / 1073741824.0, l.max_bytes / 1073741824.0);
}
