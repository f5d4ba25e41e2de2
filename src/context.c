/*
 * context.c -- contexts, status codes and the error funnel.
 */
#include "internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

double nbg_now(void)
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

int nbg_error(nbg_ctx *ctx, int code, const char *fmt, ...)
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
