/*
 * ensemble.c -- nbg_ensemble: refinement of many still shots together, on one process or spread over several (the
 * caller's nbg_comm hooks: the program's are MPI's).  Library code: it never prints; errors are the status with the
 * message in the context, progress goes through the options' callback.
 *
 * Global parameters (the structure factors of the builder's table, "F", and any of the experiment's parameters, e.g.
 * the cell) are shared by every shot; local ones (orientation, N, scale, background...) belong to each shot.  The
 * loss is the sum of the shots' losses.  Each cycle (alternating optimisation):
 *   1. local: every shot's local parameters by Levenberg-Marquardt (nbg_refine) with the globals fixed, each process
 *      its own shots;
 *   2. global: with the Poisson loss and F the only global, expectation-maximisation on F (em_step: the model is
 *      linear in F^2 with every shot's own parameters fixed, so EM converges to the maximum likelihood, in one or
 *      two steps where each pixel sees one reflection; two adjoint passes a shot per step); otherwise BFGS (GSL's
 *      vector_bfgs2) on the summed loss and its gradient, one adjoint pass per shot and evaluation, F in units of
 *      its starting value so that every variable is of order 1.  Either says how it ended (converged, or stopped
 *      at its iteration limit).
 * spots >= 0 fits each shot on its spot regions (its model's spot pixels boxed, drawn again after each cycle's local
 * fits), so that an evaluation walks the spots, not the detector; EM then fits a reflection on the regions only
 * where at least half its predicted photons fall in them.
 *
 * Reproducibility whatever the number of processes: shot i lives on process i mod K; a shot's loss and gradient
 * depend on the shot alone (the adjoint is bit-for-bit reproducible for a thread count); the processes exchange the
 * per-shot vectors (the comm's allgatherv) and every process adds them in shot order, so every process holds the
 * same sum, bit for bit, runs the same BFGS iterations, and the answer does not depend on K.  The price: every
 * process holds all shots' gradient vectors during the sum (nshots x (1 + globals + table) doubles); see
 * bench/scale.md.
 *
 * Standard errors of the globals, from the information at the optimum: for F, the diagonal of the Poisson Fisher
 * information under the approximation that each pixel sees one reflection (then dM_p/dF_j = 2 M_pj / F_j and
 * I_jj = 2 (dS/dF_j) / F_j with S = sum of the model over the shots' pixels: one adjoint pass of dL/dM = 1 gives
 * every entry), i.e. F_j / (2 sqrt(photons of reflection j)); for the other globals, Gauss-Newton information from
 * the tangent images summed over shots.  Both are conditional on the other parameters (their correlations are left
 * out): a lower bound on the marginal errors.
 */
#include "internal.h"
#include "param.h"
#include "plan.h"
#include "shots.h"

#include <math.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#ifndef NBG_NO_REFINE
#include <gsl/gsl_errno.h>
#include <gsl/gsl_multimin.h>
#endif

void nbg_ensemble_options_default(nbg_ensemble_options *o)
{
    if (o == NULL) {
        return;
    }
    memset(o, 0, sizeof *o);
    o->cycles = 4;
    o->loss = NBG_LOSS_POISSON;
    o->spots = -1;
    o->spot_frac = 0.05;
}

void nbg_ensemble_result_free(nbg_ensemble_result *r)
{
    if (r == NULL) {
        return;
    }
    free(r->globals), free(r->global_value), free(r->global_sigma);
    free(r->F), free(r->F_sigma);
    free(r->locals), free(r->local_value);
    memset(r, 0, sizeof *r);
}

int nbg_ensemble(nbg_ctx *ctx, nbg_builder *b, const nbg_shot_list *l, const nbg_ensemble_options *opt,
                 nbg_ensemble_result *res)
{
    if (res != NULL) {
        memset(res, 0, sizeof *res);
    }
    if (ctx == NULL) {
        return NBG_EINVAL;
    }
    nbgi_cli *c = nbgi_builder_cli(b);
    if (c == NULL) {
        return nbgi_error(ctx, NBG_EINVAL, "nbg_ensemble: %s", b == NULL ? "NULL builder"
                                                                        : "the builder has not loaded its files");
    }
    return nbgi_ensemble(ctx, c, l, opt, res);
}

#ifdef NBG_NO_REFINE
int nbgi_ensemble(nbg_ctx *ctx, nbgi_cli *c, const nbg_shot_list *l, const nbg_ensemble_options *opt,
                  nbg_ensemble_result *res)
{
    (void)c, (void)l, (void)opt;
    if (res != NULL) {
        memset(res, 0, sizeof *res);
    }
    return nbgi_error(ctx, NBG_EUNSUP, "this build has no refinement (built with GSL=0, without GSL and LAPACKE)");
}
#else

/* One process's share of the shots, and the exchange of per-shot vectors. */
typedef struct {
    nbg_ctx *ctx;
    nbgi_cli *c;
    const nbg_ensemble_options *o;
    const nbg_shot_list *shots;
    const nbg_comm *comm;   /* NULL: one process */
    int rank, size;
    int nmine;              /* this process's shots: indices rank, rank + size, ... */
    nbg_experiment *e;      /* nmine experiments */
    nbg_source **src;       /* nmine source arrays (NULL when none) */
    float **obs;            /* nmine observed images */
    uint8_t **mask;         /* nmine masks (-mask's, the file's and the overloads: nbg_observed.use) */
    uint32_t **list;        /* nmine spot regions (spots; NULL: every pixel) */
    size_t npix;            /* the largest detector's pixels (the buffers' size) */
    size_t *np;             /* nmine: each shot's pixels (a shot's own experiment list may bring its own detector) */
    nbg_panel **pan;        /* nmine: the panels of a shot's own multi-panel list (NULL: none) */
    double **turns;         /* nmine: the mosaic domains' own turns of a shot's own list (NULL: none) */
    float *img;
    nbg_param *gp, *lp;     /* the global and local parameters (F aside) */
    int ng, nl, want_F;
    size_t nF;              /* the table's entries */
    nbg_param *ids;         /* the gradient's parameters: gp, then NBG_P_F(0 .. nF - 1) with want_F */
    double *grad;           /* ng + nF: the gradient of one shot's loss */
    double *F0;             /* the table's starting values (the F variables' units) */
    uint8_t *fitted;        /* nF: EM's last step fitted the entry (with spots: at least half its photons in the
                               regions); NULL before EM ran */
    size_t nvec;            /* 1 + ng + (want_F ? nF : 0): a shot's loss and gradient */
    double *mine;           /* nmine * nvec */
    double *all;            /* nshots * nvec, in shot order */
    size_t maxlen;          /* the longest per-shot vector exchanged */
    double *recv;           /* nshots * maxlen: the exchange's receive buffer (process-major) */
    int *counts, *displs;   /* size each: the exchange's blocks */
    int failed;             /* this process failed (its message in ctx), or learnt that another did */
    int status;             /* this process's failure's status (NBG_OK: another process failed) */
    long evals;
} ens;

/* Records a failure of this process: the message (formatted first, so that it may quote nbg_errmsg) in the
 * context; every process learns of it at the next exchange. */
static void failf(ens *w, int st, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void failf(ens *w, int st, const char *fmt, ...)
{
    char msg[sizeof w->ctx->errmsg];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    if (!w->failed || w->status == NBG_OK) {
        nbgi_error(w->ctx, st != NBG_OK ? st : NBG_EINVAL, "%s", msg);
        w->status = st != NBG_OK ? st : NBG_EINVAL;
    }
    w->failed = 1;
}

/* Tells the caller's callback (INFO, CYCLE and SHOT on process 0 only). */
static void say(ens *w, nbg_ensemble_event what, int done, int total, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));
static void say(ens *w, nbg_ensemble_event what, int done, int total, const char *fmt, ...)
{
    if (w->o->progress == NULL || (what != NBG_ENSEMBLE_WARNING && w->rank != 0)) {
        return;
    }
    char text[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(text, sizeof text, fmt, ap);
    va_end(ap);
    w->o->progress(w->o->user, what, done, total, text);
}

/* values (n longs) reduced over the processes in place (op 0 sum, 1 max); 0 when the hook failed */
static int reduce(ens *w, long *values, int n, int op)
{
    if (w->comm == NULL) {
        return 1;
    }
    if (w->comm->allreduce_long(w->comm->user, values, n, op) != 0) {
        failf(w, NBG_EIO, "the exchange between the processes (allreduce) failed");
        return 0;
    }
    return 1;
}

/* Parses a parameter list for the experiment e (nbg_params_parse) into *p (malloc'd, the caller frees it) and *n;
 * the word "F" (the whole structure-factor table) sets *want_F where allow_F, and is refused elsewhere; single
 * table entries are refused (the shots share the whole table).  NBG_OK or the status with the message. */
static int param_list(nbg_ctx *ctx, const nbg_experiment *e, const char *flag, const char *list, int allow_F,
                      nbg_param **p, int *n, int *want_F)
{
    *p = NULL;
    *n = 0;
    *want_F = 0;
    char *buf = strdup(list != NULL ? list : ""), *rest = calloc(strlen(list != NULL ? list : "") + 1, 1);
    if (buf == NULL || rest == NULL) {
        free(buf), free(rest);
        return nbgi_error(ctx, NBG_ENOMEM, "out of memory for %s", flag);
    }
    /* the words but F, for nbg_params_parse */
    size_t len = 0;
    for (char *save = NULL, *t = strtok_r(buf, ",", &save); t != NULL; t = strtok_r(NULL, ",", &save)) {
        if (strcmp(t, "F") == 0) {
            if (!allow_F) {
                free(buf), free(rest);
                return nbgi_error(ctx, NBG_EINVAL, "%s: unknown parameter 'F' (F is global: the shots share the "
                                  "structure factors)", flag);
            }
            *want_F = 1;
            continue;
        }
        len += (size_t)sprintf(rest + len, "%s%s", len ? "," : "", t);
    }
    free(buf);
    if (len > 0) {
        const int st = nbg_params_parse(ctx, e, rest, 0, p, n);
        if (st != NBG_OK) {
            char msg[sizeof ctx->errmsg];
            snprintf(msg, sizeof msg, "%s", nbg_errmsg(ctx));
            free(rest);
            return nbgi_error(ctx, st, "%s: %s", flag, msg);
        }
    }
    free(rest);
    for (int j = 0; j < *n; ++j) {
        if ((*p)[j] >= NBG_P_F_ALL) {
            char lab[64];
            nbg_param_label(e, (*p)[j], lab, sizeof lab);
            free(*p);
            *p = NULL;
            *n = 0;
            return nbgi_error(ctx, NBG_EINVAL, "%s: %s: the shots share the whole structure-factor table (-global F)",
                              flag, lab);
        }
    }
    return NBG_OK;
}

static int shot_of(const ens *w, int k) { return k * w->size + w->rank; }

/* Every process's per-shot vectors (len doubles a shot, at most maxlen; this process's in mine, its k-th shot being
 * shot k K + rank) into all, in shot order, on every process.  Returns 0 when any process failed (then all stop
 * together). */
static int gather_all(ens *w, size_t len, const double *mine, double *all)
{
    const int nshots = w->shots->n;
    if (w->comm != NULL) {
        long failed = w->failed;
        if (!reduce(w, &failed, 1, 1)) {
            return 0;
        }
        if (failed) {
            w->failed = 1;
            return 0;
        }
        int off = 0;
        for (int r = 0; r < w->size; ++r) {
            const int nr = nshots > r ? (nshots - r + w->size - 1) / w->size : 0;
            w->counts[r] = nr * (int)len;
            w->displs[r] = off;
            off += w->counts[r];
        }
        if (w->comm->allgatherv(w->comm->user, mine, w->nmine * (int)len, w->recv, w->counts, w->displs) != 0) {
            failf(w, NBG_EIO, "the exchange between the processes (allgatherv) failed");
            return 0;
        }
        for (int r = 0; r < w->size; ++r) {
            for (int k = 0; k * w->size + r < nshots; ++k) {
                memcpy(all + (size_t)(k * w->size + r) * len, w->recv + w->displs[r] + (size_t)k * len,
                       len * sizeof(double));
            }
        }
        return 1;
    }
    if (w->failed) {
        return 0;
    }
    memcpy(all, mine, sizeof(double) * (size_t)nshots * len);
    return 1;
}

/* Gathers the per-shot vectors of len doubles (this process's in mine) into all and sums them in shot order into
 * out. */
static int gather_sum(ens *w, size_t len, const double *mine, double *all, double *out)
{
    if (!gather_all(w, len, mine, all)) {
        return 0;
    }
    for (size_t j = 0; j < len; ++j) out[j] = 0;
    for (int i = 0; i < w->shots->n; ++i) {
        const double *v = all + (size_t)i * len;
        for (size_t j = 0; j < len; ++j) out[j] += v[j];
    }
    return 1;
}

/* The loss and gradient vectors (w->mine, nvec doubles a shot) summed in shot order into out. */
static int exchange_sum(ens *w, double *out)
{
    return gather_sum(w, w->nvec, w->mine, w->all, out);
}

/* dL/dF of this process's shot k (experiment e, dL/dM = dl) into out (nF), the image into w->img. */
static int shot_dF(ens *w, int k, const nbg_experiment *e, const float *dl, double *out)
{
    const int st = nbg_simulate_grad(w->ctx, e, dl, w->ids + w->ng, (int)w->nF, out, w->img, w->np[k], NULL);
    if (st != NBG_OK) {
        failf(w, st, "shot %s: %s", w->shots->v[shot_of(w, k)].id, nbg_errmsg(w->ctx));
        return 0;
    }
    return 1;
}

/* Writes the global variables x (ng parameters, then F / F0) into every shot of this process. */
static void set_globals(ens *w, const double *x)
{
    for (int k = 0; k < w->nmine; ++k) {
        for (int j = 0; j < w->ng; ++j) nbg_param_set(&w->e[k], w->gp[j], x[j]);
    }
    if (w->want_F) {
        double *F = w->c->hkl.F;
        for (size_t j = 0; j < w->nF; ++j) F[j] = x[w->ng + j] * w->F0[j];
    }
}

/* The summed loss and its gradient with respect to x; every process calls it together.  Returns 0 on a failure. */
static int evaluate(ens *w, const double *x, double *L, double *g)
{
    set_globals(w, x);
    const int nids = w->ng + (int)w->nF; /* nF is 0 without want_F */
    for (int k = 0; k < w->nmine && !w->failed; ++k) {
        double *v = w->mine + (size_t)k * w->nvec;
        double Lk = 0;
        const int st = nbg_loss_grad(w->ctx, &w->e[k], w->o->loss, w->obs[k], NULL, w->ids, nids, &Lk, w->grad,
                                     w->img, w->np[k]);
        if (st != NBG_OK) {
            failf(w, st, "shot %s: %s", w->shots->v[shot_of(w, k)].id, nbg_errmsg(w->ctx));
            break;
        }
        v[0] = Lk;
        for (int j = 0; j < w->ng; ++j) v[1 + j] = w->grad[j];
        for (size_t j = 0; w->want_F && j < w->nF; ++j) {
            v[1 + w->ng + j] = w->grad[w->ng + j] * w->F0[j]; /* d/d(F/F0) */
        }
    }
    ++w->evals;
    double *sum = malloc(sizeof(double) * w->nvec);
    if (sum == NULL) {
        failf(w, NBG_ENOMEM, "out of memory for the summed gradient");
    }
    const int ok = exchange_sum(w, sum != NULL ? sum : w->all);
    if (ok && sum != NULL) {
        *L = sum[0];
        memcpy(g, sum + 1, sizeof(double) * (w->nvec - 1));
    }
    free(sum);
    return ok && sum != NULL;
}

static double gsl_f(const gsl_vector *x, void *p)
{
    ens *w = p;
    double L = NAN;
    double *g = malloc(sizeof(double) * (w->nvec - 1));
    if (g == NULL || !evaluate(w, x->data, &L, g)) {
        L = NAN;
    }
    free(g);
    return isfinite(L) ? L : GSL_POSINF;
}

static void gsl_df(const gsl_vector *x, void *p, gsl_vector *g)
{
    ens *w = p;
    double L;
    if (!evaluate(w, x->data, &L, g->data)) {
        gsl_vector_set_all(g, 0);
    }
}

static void gsl_fdf(const gsl_vector *x, void *p, double *f, gsl_vector *g)
{
    ens *w = p;
    if (!evaluate(w, x->data, f, g->data) || !isfinite(*f)) {
        *f = GSL_POSINF;
        gsl_vector_set_all(g, 0);
    }
}

/* The structure factors by expectation-maximisation (the Poisson loss, F the only global): with every shot's own
 * parameters fixed the model of pixel p is linear in u_j = F_j^2, M_p = sum_j u_j a_pj + (what F does not scale),
 * and one EM step u_j <- u_j B_j / A_j, A_j = sum_p a_pj, B_j = sum_p a_pj y_p / M_p (summed over the shots), raises
 * the likelihood and converges to its maximum in u (a convex problem): in one step where each pixel sees one
 * reflection.  A_j and B_j come from two adjoint passes a shot (dL/dM = 1, then y/M; their factor 2 F_j cancels),
 * added in shot order.  Iterates until no F moves by more than 1e-7 of itself, at most max_iter times; *why says
 * which.  Returns the iterations, or -1 on a failure. */
static int em_step(ens *w, double *x, int max_iter, const char **why)
{
    const size_t nF = w->nF, len = 2 * nF;
    double *mine = calloc(((size_t)w->nmine + 1) * len, sizeof(double));
    double *all = calloc((size_t)w->shots->n * len + 1, sizeof(double));
    double *sum = calloc(len + 1, sizeof(double));
    float *wt = malloc(sizeof(float) * w->npix);
    if (mine == NULL || all == NULL || sum == NULL || wt == NULL) {
        free(mine), free(all), free(sum), free(wt);
        failf(w, NBG_ENOMEM, "out of memory for the structure factors' EM step");
        gather_all(w, len, NULL, NULL); /* the other processes learn it at their first exchange */
        return -1;
    }
    *why = "NOT converged: stopped at the iteration limit";
    /* u = 0 is a fixed point of EM: a reflection that an earlier cycle found without a photon starts again from
     * 1e-3 of its starting value, since the orientations have moved since (and returns to 0 if it is still dark) */
    for (size_t j = 0; j < nF; ++j) {
        if (x[w->ng + j] == 0) {
            x[w->ng + j] = 1e-3;
        }
    }
    /* with spot regions: each reflection's predicted photons over the whole detectors, so that only a reflection
     * whose spots lie mostly in the regions (at least half its photons) is fitted on them; one seen there through
     * the tails of others' spots alone is left as it is */
    double *whole = NULL;
    if (w->o->spots >= 0) {
        whole = calloc(nF + 1, sizeof(double));
        set_globals(w, x);
        for (size_t p = 0; p < w->npix; ++p) wt[p] = 1;
        for (int k = 0; k < w->nmine && whole != NULL && !w->failed; ++k) { /* wt: 1 over the largest detector */
            nbg_experiment e = w->e[k];
            e.pixels = NULL;
            e.npixels_list = 0;
            shot_dF(w, k, &e, wt, mine + (size_t)k * len);
        }
        ++w->evals;
        if (whole == NULL) {
            failf(w, NBG_ENOMEM, "out of memory for the structure factors' EM step"); /* said to every process by
                                                                                         the exchange */
        }
        /* the B half of each shot's vector is unused here */
        if (!gather_sum(w, len, mine, all, sum) || whole == NULL) {
            free(mine), free(all), free(sum), free(wt), free(whole);
            return -1;
        }
        memcpy(whole, sum, sizeof(double) * nF);
    }
    int it = 0;
    for (it = 1; it <= max_iter; ++it) {
        set_globals(w, x);
        for (int k = 0; k < w->nmine && !w->failed; ++k) {
            nbg_experiment *e = &w->e[k];
            double *A = mine + (size_t)k * len, *B = A + nF;
            for (size_t p = 0; p < w->np[k]; ++p) wt[p] = 1;
            if (!shot_dF(w, k, e, wt, A)) {
                break;
            }
            /* y / M as the loss defines them (photons, the read noise's shift): 1 - dL/dM */
            nbgi_response_cursor rcur;
            nbgi_response_init(&rcur, e);
            for (size_t p = 0; p < w->np[k]; ++p) {
                double d = 0;
                nbgi_pixel_loss(NBG_LOSS_POISSON, nbgi_response_at(&rcur, p), w->img[p], w->obs[k][p], &d, NULL);
                wt[p] = (float)(1 - d);
            }
            if (!shot_dF(w, k, e, wt, B)) {
                break;
            }
        }
        w->evals += 2;
        if (!gather_sum(w, len, mine, all, sum)) {
            it = -1;
            break;
        }
        double moved = 0;
        if (w->fitted == NULL) {
            w->fitted = calloc(nF + 1, 1);
        }
        for (size_t j = 0; j < nF; ++j) {
            if (w->fitted != NULL) {
                w->fitted[j] = 0;
            }
            const double A = sum[j], B = sum[nF + j], F = x[w->ng + j] * w->F0[j];
            if (!(A > 0) || F == 0 || (whole != NULL && !(A >= 0.5 * whole[j]))) {
                continue; /* no shot measures it (in the regions) */
            }
            const double Fn = fabs(F) * sqrt(fmax(B, 0) / A); /* 0 for a reflection none of whose pixels has a photon */
            if (w->fitted != NULL) {
                w->fitted[j] = 1;
            }
            moved = fmax(moved, fabs(Fn - fabs(F)) / fabs(F));
            x[w->ng + j] = Fn / w->F0[j];
        }
        if (moved <= 1e-7) {
            *why = "converged: no F moves by more than 1e-7 of itself";
            break;
        }
    }
    if (it > max_iter) {
        it = max_iter;
    }
    free(mine), free(all), free(sum), free(wt), free(whole);
    return w->failed ? -1 : it;
}

/* BFGS on the globals from x; x is updated.  Returns the iterations, or -1 on a failure; *why says how it ended
 * (the gradient small, the loss unchanged, the line search stuck, or the iteration limit: said, not hidden). */
static int global_step(ens *w, double *x, int max_iter, double *Lout, const char **why)
{
    *why = "the line search found no lower point";
    const size_t n = w->nvec - 1;
    gsl_multimin_function_fdf fn = {gsl_f, gsl_df, gsl_fdf, n, w};
    gsl_vector *v = gsl_vector_alloc(n);
    gsl_multimin_fdfminimizer *m = gsl_multimin_fdfminimizer_alloc(gsl_multimin_fdfminimizer_vector_bfgs2, n);
    if (v == NULL || m == NULL) {
        gsl_vector_free(v);
        gsl_multimin_fdfminimizer_free(m);
        failf(w, NBG_ENOMEM, "out of memory for BFGS on %zu variables", n);
        return -1;
    }
    memcpy(v->data, x, n * sizeof(double));
    gsl_set_error_handler_off();
    int it = 0;
    if (gsl_multimin_fdfminimizer_set(m, &fn, v, 0.01, 0.1) == GSL_SUCCESS) {
        double last = m->f;
        for (it = 1; it <= max_iter; ++it) {
            if (gsl_multimin_fdfminimizer_iterate(m) != GSL_SUCCESS || w->failed) {
                break;
            }
            const int small = gsl_multimin_test_gradient(m->gradient, 1e-6 * fmax(1, fabs(m->f) / (double)n)) ==
                              GSL_SUCCESS;
            if (small || fabs(last - m->f) <= 1e-12 * fabs(m->f)) {
                *why = small ? "converged: the gradient is small" : "converged: the loss no longer changes";
                break;
            }
            last = m->f;
        }
        if (it > max_iter) {
            it = max_iter;
            *why = "NOT converged: stopped at the iteration limit";
        }
    }
    memcpy(x, m->x->data, n * sizeof(double));
    *Lout = m->f;
    gsl_vector_free(v);
    gsl_multimin_fdfminimizer_free(m);
    return w->failed ? -1 : it;
}

/* Reads shot k's observed image through the library's policy (nbg_observed_read: the pedestal the file's, else
 * -adc's for SMV without the key; the shot's mask joined by the file's and the overloads) into its experiment. */
static int load_observed(ens *w, int k)
{
    const nbg_shot *s = &w->shots->v[shot_of(w, k)];
    char path[4096], what[256];
    if (!nbgi_shot_name(w->o->observed, s->id, path, sizeof path)) {
        failf(w, NBG_EINVAL, "shot %s: the -observed name is too long", s->id);
        return 0;
    }
    snprintf(what, sizeof what, "shot %s", s->id);
    nbg_observed_options opt;
    nbg_observed_options_default(&opt);
    if (w->o->response != NULL) { /* the detector response given: pedestal, gain, read noise, the panels' own */
        opt = *w->o->response;
        opt.trusted[0] = opt.trusted[1] = NAN; /* the rest is the ensemble's own (below) */
    }
    opt.adc = w->c->adc;
    opt.what = what;
    opt.mask_what = "-mask";
    nbg_observed ob;
    const int st = nbg_observed_read(w->ctx, &w->e[k], path, 0, &opt, &ob);
    if (st != NBG_OK) {
        failf(w, st, "%s", nbg_errmsg(w->ctx));
        return 0;
    }
    nbg_experiment *e = &w->e[k];
    if (ob.panel_response != NULL && w->pan[k] == NULL) {
        /* the panels' own responses go on a copy of the builder's panels, this shot's */
        if ((w->pan[k] = malloc((size_t)e->npanels * sizeof *w->pan[k])) == NULL) {
            nbg_observed_free(&ob);
            failf(w, NBG_ENOMEM, "%s: out of memory for the panels' detector response", what);
            return 0;
        }
        memcpy(w->pan[k], e->panels, (size_t)e->npanels * sizeof *w->pan[k]);
        e->panels = w->pan[k];
    }
    const int st2 = nbg_observed_apply_response(w->ctx, &ob, e, ob.panel_response != NULL ? w->pan[k] : NULL,
                                                e->npanels);
    if (st2 != NBG_OK) {
        nbg_observed_free(&ob);
        failf(w, st2, "%s: %s", what, nbg_errmsg(w->ctx));
        return 0;
    }
    free(ob.panel_response); /* copied onto the panels */
    w->obs[k] = ob.image;
    w->mask[k] = ob.use;
    e->mask = ob.use;
    return 1;
}

/* Shot k's spot regions (spots): its model rendered whole, the pixels above its floor by spot_frac of its peak
 * boxed by nbg_spot_pixels, as the shot's pixel list; a shot whose model is flat keeps every pixel (counted in
 * *nwhole).  The regions come from the model alone (regions chosen by the data's bright pixels would bias the fit
 * towards them), and are drawn again after every cycle's local fits, where the orientations stand then. */
static int spot_list(ens *w, int k, long *nlisted, long *nwhole)
{
    nbg_experiment *e = &w->e[k];
    const char *id = w->shots->v[shot_of(w, k)].id;
    e->pixels = NULL; /* the whole model, then its regions */
    e->npixels_list = 0;
    free(w->list[k]);
    w->list[k] = NULL;
    int st = nbg_simulate(w->ctx, e, w->img, w->np[k], NULL);
    if (st != NBG_OK) {
        failf(w, st, "shot %s: -spots: %s", id, nbg_errmsg(w->ctx));
        return 0;
    }
    double thr;
    if (!nbg_spot_threshold(w->img, e->mask, w->np[k], w->o->spot_frac, &thr)) {
        ++*nwhole;
        return 1;
    }
    long n = 0;
    st = nbg_spot_pixels(w->ctx, e, w->img, w->np[k], thr, NULL, 0, w->o->spots, &w->list[k], &n);
    if (st != NBG_OK) {
        failf(w, st, "shot %s: -spots: %s", id, nbg_errmsg(w->ctx));
        return 0;
    }
    if (n == 0) {
        free(w->list[k]);
        w->list[k] = NULL;
        ++*nwhole;
        return 1;
    }
    e->pixels = w->list[k];
    e->npixels_list = n;
    *nlisted += n;
    return 1;
}

/* The options checked: NBG_OK or NBG_EINVAL naming the option. */
static int check_options(nbg_ctx *ctx, const nbg_shot_list *l, const nbg_ensemble_options *o)
{
    if (l == NULL || l->n < 1 || l->v == NULL) {
        return nbgi_error(ctx, NBG_EINVAL, "nbg_ensemble: %s", l == NULL ? "NULL shot list" : "no shots");
    }
    if (o == NULL || o->observed == NULL || o->global == NULL) {
        return nbgi_error(ctx, NBG_EINVAL, "ensemble needs the observed images' name (-observed TEMPLATE with {id}) "
                          "and the global parameters (-global LIST)");
    }
    if (o->cycles < 1 || o->cycles > 1000) {
        return nbgi_error(ctx, NBG_EINVAL, "-cycles expects 1 to 1000, got %d", o->cycles);
    }
    if (o->loss != NBG_LOSS_POISSON && o->loss != NBG_LOSS_LSQ) {
        return nbgi_error(ctx, NBG_EINVAL, "-loss expects lsq or poisson (nbg_loss %d)", (int)o->loss);
    }
    if (o->spots < -1 || o->spots > 100000) {
        return nbgi_error(ctx, NBG_EINVAL, "-spots expects a half-width of 0 to 100000 pixels (or -1: none), got %d",
                          o->spots);
    }
    if (!(o->spot_frac > 0 && o->spot_frac < 1)) {
        return nbgi_error(ctx, NBG_EINVAL, "-spot_frac expects a fraction in (0, 1), got %g", o->spot_frac);
    }
    const nbg_comm *m = o->comm;
    if (m != NULL && (m->size < 1 || m->rank < 0 || m->rank >= m->size || m->allreduce_long == NULL ||
                      m->allgatherv == NULL)) {
        return nbgi_error(ctx, NBG_EINVAL, "nbg_ensemble: the comm's rank %d of %d or its hooks are invalid", m->rank,
                          m->size);
    }
    return NBG_OK;
}

static const char *label(const nbg_experiment *e, nbg_param p, char *buf, size_t size)
{
    return nbg_param_label(e, p, buf, size);
}

int nbgi_ensemble(nbg_ctx *ctx, nbgi_cli *c, const nbg_shot_list *l, const nbg_ensemble_options *opt,
                  nbg_ensemble_result *res)
{
    if (res == NULL) {
        return nbgi_error(ctx, NBG_EINVAL, "nbg_ensemble: NULL result");
    }
    memset(res, 0, sizeof *res);
    int st = check_options(ctx, l, opt);
    if (st != NBG_OK) {
        return st;
    }
    const nbg_ensemble_options *o = opt;
    ens w;
    memset(&w, 0, sizeof w);
    w.ctx = ctx, w.c = c, w.o = o, w.shots = l, w.comm = o->comm;
    w.rank = o->comm != NULL ? o->comm->rank : 0;
    w.size = o->comm != NULL ? o->comm->size : 1;
    const int rank = w.rank, size = w.size;
    double *x = NULL, *g = NULL, *Finfo = NULL, *lmine = NULL, *lall = NULL;
    int dummy;
    char lab[96];
    if ((st = param_list(ctx, &c->e, "-global", o->global, 1, &w.gp, &w.ng, &w.want_F)) != NBG_OK ||
        (st = param_list(ctx, &c->e, "-local", o->local, 0, &w.lp, &w.nl, &dummy)) != NBG_OK) {
        goto done;
    }
    for (int i = 0; i < w.ng; ++i) {
        for (int j = 0; j < w.nl; ++j) {
            if (w.gp[i] == w.lp[j]) {
                st = nbgi_error(ctx, NBG_EINVAL, "%s is both global and local", label(&c->e, w.gp[i], lab, sizeof lab));
                goto done;
            }
        }
    }
    if (w.want_F && c->e.hkl == NULL) {
        st = nbgi_error(ctx, NBG_EINVAL, "-global F refines a structure-factor table: give the starting one with -hkl");
        goto done;
    }
    nbg_report r;
    if ((st = nbg_describe(ctx, &c->e, &r)) != NBG_OK) {
        goto done;
    }
    const int nshots = l->n;
    w.npix = r.npix;
    w.nmine = nshots > rank ? (nshots - rank + size - 1) / size : 0;
    if (w.want_F) {
        w.nF = (size_t)nbgi_param_nF(&c->e); /* want_F needs a table (checked above) */
    }
    w.nvec = 1 + (size_t)w.ng + w.nF;
    const size_t nlv = (size_t)(w.nl > 0 ? w.nl : 1);
    w.maxlen = w.nvec > 2 * w.nF ? w.nvec : 2 * w.nF;
    w.maxlen = w.maxlen > nlv ? w.maxlen : nlv;
    w.ids = malloc(sizeof(nbg_param) * (w.nvec - 1 + 1));
    w.grad = calloc(w.nvec, sizeof(double));
    for (int j = 0; w.ids != NULL && j < w.ng; ++j) w.ids[j] = w.gp[j];
    for (size_t j = 0; w.ids != NULL && j < w.nF; ++j) w.ids[(size_t)w.ng + j] = NBG_P_F(j);
    w.e = calloc((size_t)w.nmine + 1, sizeof *w.e);
    w.src = calloc((size_t)w.nmine + 1, sizeof *w.src);
    w.np = calloc((size_t)w.nmine + 1, sizeof *w.np);
    w.pan = calloc((size_t)w.nmine + 1, sizeof *w.pan);
    w.turns = calloc((size_t)w.nmine + 1, sizeof *w.turns);
    w.obs = calloc((size_t)w.nmine + 1, sizeof *w.obs);
    w.mask = calloc((size_t)w.nmine + 1, sizeof *w.mask);
    w.list = calloc((size_t)w.nmine + 1, sizeof *w.list);
    w.img = malloc(sizeof(float) * w.npix);
    w.mine = calloc(((size_t)w.nmine + 1) * w.nvec, sizeof(double));
    w.all = calloc((size_t)nshots * w.nvec, sizeof(double));
    w.F0 = calloc(w.nF + 1, sizeof(double));
    if (w.comm != NULL) {
        w.recv = malloc(sizeof(double) * ((size_t)nshots * w.maxlen + 1));
        w.counts = malloc(sizeof(int) * (size_t)size);
        w.displs = malloc(sizeof(int) * (size_t)size);
    }
    x = calloc(w.nvec, sizeof(double));
    g = calloc(w.nvec, sizeof(double));
    if (!w.e || !w.src || !w.np || !w.pan || !w.turns || !w.obs || !w.mask || !w.list || !w.img || !w.mine || !w.all ||
        !w.ids || !w.grad || !w.F0 || !x || !g || (w.comm != NULL && (!w.recv || !w.counts || !w.displs))) {
        /* the other processes must learn it: said at the first exchange */
        failf(&w, NBG_ENOMEM, "out of memory for %d shots of %zu pixels and %zu structure factors", nshots, w.npix,
              w.nF);
        if (w.comm != NULL) {
            /* the collectives the others make before their first exchange, then the exchange's failure check */
            long tot[3] = {0, 0, 0};
            if (o->spots >= 0) {
                reduce(&w, tot, 3, 0);
            }
            gather_all(&w, 1, NULL, NULL);
        }
        goto done;
    }
    for (size_t j = 0; j < w.nF; ++j) {
        /* F's variables are F / F0; an entry that starts at 0 keeps unit scale */
        w.F0[j] = c->hkl.F[j] != 0 ? fabs(c->hkl.F[j]) : 1;
        x[w.ng + j] = c->hkl.F[j] / w.F0[j];
    }
    for (int j = 0; j < w.ng; ++j) nbg_param_get(&c->e, w.gp[j], &x[j]);
    int ok = 1;
    long npix_all = 0; /* this process's shots' pixels */
    for (int k = 0; k < w.nmine && ok; ++k) {
        int nsrc = 0;
        const nbg_shot *s = &l->v[shot_of(&w, k)];
        const char *lname = l->path != NULL ? l->path : "shot list";
        char warn[512];
        st = nbgi_shot_apply(ctx, c, s, lname, &w.e[k], &w.src[k], &nsrc, &w.pan[k], &w.turns[k], warn, sizeof warn);
        if (st != NBG_OK) {
            failf(&w, st, "%s", nbg_errmsg(ctx));
            ok = 0;
        } else if (warn[0] != '\0') {
            say(&w, NBG_ENSEMBLE_WARNING, k, w.nmine, "%s", warn);
        }
        w.np[k] = w.npix;
        if (ok && (s->has & NBG_SHOT_EXPT)) {
            /* the shot's own detector (its experiment list's) */
            nbg_report rs;
            if ((st = nbg_describe(ctx, &w.e[k], &rs)) != NBG_OK) {
                failf(&w, st, "shot %s (%s line %d): %s", s->id, lname, s->line, nbg_errmsg(ctx));
                ok = 0;
            } else if ((w.np[k] = rs.npix) > w.npix) {
                float *grown = realloc(w.img, sizeof(float) * w.np[k]);
                if (grown == NULL) {
                    failf(&w, NBG_ENOMEM, "out of memory for shot %s's %zu pixels", s->id, w.np[k]);
                    ok = 0;
                } else {
                    w.img = grown;
                    w.npix = w.np[k];
                }
            }
        }
        npix_all += (long)w.np[k];
        ok = ok && load_observed(&w, k);
    }
    /* spots: each shot fitted on its starting model's spot regions (as refine -spots), its own pixel list */
    long nlisted = 0, nwhole = 0;
    for (int k = 0; k < w.nmine && ok && o->spots >= 0; ++k) {
        ok = spot_list(&w, k, &nlisted, &nwhole);
    }
    if (o->spots >= 0) {
        long tot[3] = {nlisted, nwhole, npix_all};
        reduce(&w, tot, 3, 0);
        res->spot_pixels = tot[0], res->spot_whole = tot[1], res->spot_total = tot[2];
        say(&w, NBG_ENSEMBLE_INFO, 0, o->cycles, "spot regions: %ld pixels over the shots (%.3g%% of their %ld), "
            "within %d pixels of each shot's starting model's spots%s", tot[0], 100.0 * (double)tot[0] / (double)tot[2],
            tot[2], o->spots, tot[1] > 0 ? "; shots without a spot keep every pixel" : "");
        if (tot[1] > 0) {
            say(&w, NBG_ENSEMBLE_INFO, 0, o->cycles, "note: %ld shot%s had no spot in the starting model: fitted on "
                "every pixel", tot[1], tot[1] > 1 ? "s" : "");
        }
    }
    say(&w, NBG_ENSEMBLE_INFO, 0, o->cycles, "ensemble: %d shots over %d rank%s, %d global parameter%s%s, %d local per "
        "shot, %d cycles", nshots, size, size > 1 ? "s" : "", w.ng, w.ng == 1 ? "" : "s",
        w.want_F ? " and the structure factors" : "", w.nl, o->cycles);
    double L = NAN;
    double t_mark = nbgi_now();
    if (!evaluate(&w, x, &L, g)) {
        goto done;
    }
    res->seconds_first_pass = nbgi_now() - t_mark;
    const double L0 = L;
    say(&w, NBG_ENSEMBLE_CYCLE, 0, o->cycles, "cycle 0: loss %.12g", L);
    nbg_refine_options ro;
    nbg_refine_options_default(&ro);
    ro.loss = o->loss;
    ro.max_iter = 30;
    long local_nc = 0;
    for (int cyc = 1; cyc <= o->cycles; ++cyc) {
        /* 1. the local parameters, shot by shot, with the globals as they are */
        t_mark = nbgi_now();
        set_globals(&w, x);
        int nc = 0;
        for (int k = 0; k < w.nmine && w.nl > 0 && !w.failed; ++k) {
            nbg_refine_result rr = {0};
            st = nbg_refine(ctx, &w.e[k], w.obs[k], NULL, w.np[k], w.lp, w.nl, &ro, &rr);
            if (st != NBG_OK) {
                failf(&w, st, "shot %s: %s", l->v[shot_of(&w, k)].id, nbg_errmsg(ctx));
            }
            nc += !rr.converged;
            nbg_refine_result_free(&rr);
            say(&w, NBG_ENSEMBLE_SHOT, cyc - 1, o->cycles, "cycle %d: local fits, shot %d of %d%s", cyc, k + 1,
                w.nmine, size > 1 ? " (this rank's)" : "");
        }
        local_nc = nc;
        /* the spot regions where the shots' models stand now */
        long nlist2 = 0, nwhole2 = 0;
        for (int k = 0; k < w.nmine && o->spots >= 0 && !w.failed; ++k) {
            spot_list(&w, k, &nlist2, &nwhole2);
        }
        res->seconds_local += nbgi_now() - t_mark;
        t_mark = nbgi_now();
        /* 2. the globals, all shots together */
        const char *why = "";
        const int em = w.want_F && w.ng == 0 && o->loss == NBG_LOSS_POISSON;
        const int it = em ? em_step(&w, x, 50, &why) : global_step(&w, x, 40, &L, &why);
        if (it < 0 || (em && !evaluate(&w, x, &L, g))) {
            w.failed = 1;
            goto done;
        }
        res->seconds_global += nbgi_now() - t_mark;
        say(&w, NBG_ENSEMBLE_CYCLE, cyc, o->cycles, "cycle %d: loss %.12g (%d %s iterations, %s; %ld evaluations so "
            "far)", cyc, L, it, em ? "EM" : "BFGS", why, w.evals);
    }
    if (!reduce(&w, &local_nc, 1, 0)) {
        goto done;
    }
    /* standard errors: F from one adjoint pass of dL/dM = 1 per shot, the other globals from tangent images */
    set_globals(&w, x);
    Finfo = calloc(w.nvec, sizeof(double));
    float *one = malloc(sizeof(float) * w.npix);
    double *tang = w.ng > 0 ? malloc(sizeof(double) * w.npix * (size_t)w.ng) : NULL;
    if (Finfo == NULL || one == NULL || (w.ng > 0 && tang == NULL)) {
        failf(&w, NBG_ENOMEM, "out of memory for the standard errors");
    }
    for (size_t p = 0; one != NULL && p < w.npix; ++p) one[p] = 1;
    for (int k = 0; k < w.nmine && !w.failed; ++k) {
        double *v = w.mine + (size_t)k * w.nvec;
        memset(v, 0, sizeof(double) * w.nvec);
        if (w.want_F) {
            double *dF = w.grad + w.ng;
            st = nbg_simulate_grad(ctx, &w.e[k], one, w.ids + w.ng, (int)w.nF, dF, w.img, w.np[k], NULL);
            if (st != NBG_OK) {
                failf(&w, st, "shot %s: %s", l->v[shot_of(&w, k)].id, nbg_errmsg(ctx));
                break;
            }
            for (size_t j = 0; j < w.nF; ++j) {
                const double F = x[w.ng + j] * w.F0[j];
                /* the Poisson information of F_j; none for an entry EM left as it was (spots: not in the regions) */
                const int left = w.fitted != NULL && !w.fitted[j];
                v[1 + w.ng + j] = F != 0 && !left ? 2 * dF[j] / F : 0;
            }
        }
        if (w.ng > 0 && nbg_simulate_jvp(ctx, &w.e[k], w.gp, w.ng, tang, w.img, w.np[k]) == NBG_OK) {
            /* the tangents are compact over a pixel list (spots): entry t of parameter j at tang[j * nw + t] */
            const size_t nw = w.e[k].pixels != NULL ? (size_t)w.e[k].npixels_list : w.np[k];
            for (int j = 0; j < w.ng; ++j) {
                double s = 0;
                for (size_t t = 0; t < nw; ++t) {
                    const size_t p = w.e[k].pixels != NULL ? w.e[k].pixels[t] : t;
                    const double tg = tang[(size_t)j * nw + t], m = w.img[p];
                    if (w.e[k].mask == NULL || w.e[k].mask[p]) {
                        s += o->loss == NBG_LOSS_POISSON ? (m > 0 ? tg * tg / m : 0) : 2 * tg * tg;
                    }
                }
                v[1 + j] = s;
            }
        }
    }
    free(tang);
    free(one);
    if (!exchange_sum(&w, Finfo != NULL ? Finfo : w.all)) {
        goto done;
    }
    /* the per-shot local values, gathered in shot order (through the same exchange) */
    lmine = calloc(((size_t)w.nmine + 1) * nlv, sizeof(double));
    lall = calloc((size_t)nshots * nlv, sizeof(double));
    if (lmine == NULL || lall == NULL) {
        failf(&w, NBG_ENOMEM, "out of memory for the shots' local values");
    }
    for (int k = 0; lmine != NULL && k < w.nmine; ++k) {
        for (int j = 0; j < w.nl; ++j) nbg_param_get(&w.e[k], w.lp[j], &lmine[(size_t)k * nlv + (size_t)j]);
    }
    if (!gather_all(&w, nlv, lmine, lall)) {
        goto done;
    }
    /* the result */
    res->nshots = nshots;
    res->nranks = size;
    res->start_loss = L0;
    res->loss = L;
    res->nglobals = w.ng;
    res->has_F = w.want_F;
    res->nF = w.nF;
    res->nlocals = w.nl;
    res->local_not_converged = (int)local_nc;
    res->evaluations = w.evals;
    res->globals = malloc(sizeof(nbg_param) * ((size_t)w.ng + 1));
    res->global_value = malloc(sizeof(double) * ((size_t)w.ng + 1));
    res->global_sigma = malloc(sizeof(double) * ((size_t)w.ng + 1));
    res->F = malloc(sizeof(double) * (w.nF + 1));
    res->F_sigma = malloc(sizeof(double) * (w.nF + 1));
    res->locals = malloc(sizeof(nbg_param) * ((size_t)w.nl + 1));
    res->local_value = malloc(sizeof(double) * ((size_t)nshots * (size_t)w.nl + 1));
    if (!res->globals || !res->global_value || !res->global_sigma || !res->F || !res->F_sigma || !res->locals ||
        !res->local_value) {
        nbg_ensemble_result_free(res);
        st = nbgi_error(ctx, NBG_ENOMEM, "out of memory for the ensemble's result");
        goto done;
    }
    for (int j = 0; j < w.ng; ++j) {
        res->globals[j] = w.gp[j];
        res->global_value[j] = x[j];
        res->global_sigma[j] = Finfo[1 + j] > 0 ? 1 / sqrt(Finfo[1 + j]) : NAN;
    }
    for (size_t j = 0; j < w.nF; ++j) {
        const double info = Finfo[1 + w.ng + j];
        res->F[j] = x[w.ng + j] * w.F0[j];
        res->F_sigma[j] = info > 0 ? 1 / sqrt(info) : NAN;
        res->F_measured += info > 0;
    }
    for (int j = 0; j < w.nl; ++j) res->locals[j] = w.lp[j];
    for (int i = 0; i < nshots; ++i) {
        for (int j = 0; j < w.nl; ++j) {
            res->local_value[(size_t)i * w.nl + j] = lall[(size_t)i * nlv + (size_t)j];
        }
    }
    st = NBG_OK;
done:
    if (w.failed) {
        st = w.status != NBG_OK ? w.status
                                : nbgi_error(ctx, NBG_EINVAL, "another process of the ensemble failed (its error is "
                                             "its own)");
        nbg_ensemble_result_free(res);
    } else if (st != NBG_OK) {
        nbg_ensemble_result_free(res);
    }
    for (int k = 0; k < w.nmine && w.e != NULL; ++k) {
        free(w.src[k]);
        free(w.pan != NULL ? w.pan[k] : NULL);
        free(w.turns != NULL ? w.turns[k] : NULL);
        free(w.obs[k]);
        free(w.mask[k]);
        free(w.list != NULL ? w.list[k] : NULL);
    }
    free(w.e), free(w.src), free(w.np), free(w.pan), free(w.turns), free(w.obs), free(w.mask), free(w.list);
    free(w.img);
    free(w.mine), free(w.all), free(w.recv), free(w.counts), free(w.displs);
    free(w.gp), free(w.lp), free(w.ids), free(w.grad);
    free(w.F0), free(w.fitted), free(x), free(g), free(Finfo), free(lmine), free(lall);
    return st;
}
#endif
