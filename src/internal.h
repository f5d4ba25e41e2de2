/*
 * internal.h -- private declarations shared by the library's translation units: the context, the error funnel
 * and small helpers.  Nothing here is part of the public API.
 */
#ifndef NBG_INTERNAL_H
#define NBG_INTERNAL_H

#include "nbgrad.h"

#include <stdarg.h>
#include <stdio.h>

#ifdef __cplusplus
extern "C" {
#endif

struct nbg_ctx {
    nbg_backend backend;
    nbg_precision precision;
    int nthreads;
    char errmsg[1024];
    void *cuda; /* CUDA backend state (device buffers), NULL on the CPU */
    int break_param; /* nbgi_debug_break_adjoint: parameter whose gradient is corrupted, -1 none */
    int zero_param;  /* nbgi_debug_zero_adjoint: parameter whose gradient is set to 0, -1 none */
    int scalar_adjoint; /* nbgi_debug_scalar_adjoint: the CPU adjoint's form (NBGI_ADJ_ROWS, _SCALAR, _TILED) */
    nbg_limits limits;  /* what an input may ask for (nbg_ctx_set_limits) */
    nbg_progress_fn progress; /* nbg_ctx_set_progress: long calls report how far they are */
    void *progress_user;
};

/* Test-only switches (not API).  nbgi_debug_break_adjoint: the adjoint deliberately corrupts the gradient of the
 * given parameter, so that tests can show the checker fails (-1 turns it off).  nbgi_debug_scalar_adjoint: the CPU
 * adjoint runs its scalar twin instead of the vectorised form (on = 1), or the twin's tiled form, the CUDA
 * backend's (on = 2); they must agree.  The tangent pass runs its scalar twin for either. */
void nbgi_debug_break_adjoint(nbg_ctx *ctx, int param);
/* Test-only: the adjoint returns 0 for that parameter's gradient (-1 turns it off): a zero adjoint against a
 * non-zero difference must fail the check, not pass as ZERO. */
void nbgi_debug_zero_adjoint(nbg_ctx *ctx, int param);
void nbgi_debug_scalar_adjoint(nbg_ctx *ctx, int on);
/* Test-only: nbg_refine_frames' loss and gradient at a point x over the parameters fitted (with a scan-varying
 * orientation, the list's then the knots: nbg_refine_result's order, no weights, no space-group ties), nothing
 * fitted.  out (2 + 2 n): the Gauss-Newton pass's loss and gradient (n), then the adjoint's loss and gradient. */
int nbgi_debug_refine_eval(nbg_ctx *ctx, nbg_experiment *frames, int nframes, const float *const *observed,
                           size_t npix, const nbg_param *params, int nparams, const nbg_refine_options *opt,
                           const double *x, double *out);

/* The context's limits, or the defaults when ctx is NULL. */
void nbgi_limits_of(const nbg_ctx *ctx, nbg_limits *l);

/* The one check of every allocation whose size derives from input, made before allocating: NBG_OK when bytes is
 * within the memory limit, otherwise NBG_ENOMEM with a message naming what (e.g. "the structure-factor table of
 * x.hkl (1001 x 1001 x 1001 entries)"), its size and how to proceed. */
int nbgi_check_bytes(nbg_ctx *ctx, double bytes, const char *what);

/* Opens an input file for reading (mode "r" or "rb"), what naming it in messages ("HKL file", "-motions"): it must
 * be a regular file (a device such as /dev/zero, a FIFO or a directory is refused: it may never end) of at most
 * the context's memory limit.  Returns NBG_OK with *fp open, else the error (NBG_EIO, NBG_ENOMEM) with *fp NULL. */
int nbgi_open_input(nbg_ctx *ctx, const char *path, const char *what, const char *mode, FILE **fp);

/* Reads the next line (number lineno, for messages) of a text input whole (getline), NUL-terminated with its
 * newline kept: 1, 0 at the end of the file, or the error (NBG_EFORMAT for a NUL byte in the line, NBG_EIO). */
int nbgi_read_line(nbg_ctx *ctx, FILE *fp, char **line, size_t *cap, const char *path, long lineno);

/* Seconds on a monotonic clock. */
double nbgi_now(void);

/* The Hall symbol (" P 4nw 2abw", as DIALS writes it) of a space group given as nbg_experiment.space_group allows
 * (a Hall symbol, kept as given when the table lacks it; a Hermann-Mauguin symbol, full or short, with or without
 * spaces and a setting suffix; a number 1-230: its reference setting), and its number (0 for a Hall symbol not in
 * the table).  0 when the symbol is not in the table or the build has no table (nbgi_space_group_table_size() = 0:
 * gemmi's headers were missing when it was built; symmetry.c, sgtable-gen.cc). */
int nbgi_space_group_hall(const char *sg, char *hall, size_t n, int *number);
int nbgi_space_group_table_size(void);
/* Setting i (0 .. size - 1) of the table: its number, extended Hermann-Mauguin and Hall symbols; 0 past the end. */
int nbgi_space_group_setting(int i, int *number, const char **xhm, const char **hall);

/* The one place every library failure goes through: records the message on ctx (which may be NULL) and returns
 * code, so callers write `return nbgi_error(ctx, NBG_EINVAL, "...", ...);`. */
int nbgi_error(nbg_ctx *ctx, int code, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 3, 4)))
#endif
    ;

#ifdef __cplusplus
}
#endif
#endif
