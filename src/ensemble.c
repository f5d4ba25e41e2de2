/*
 * ensemble.c -- `nbgrad ensemble`: refinement of many still shots together, on one process or over MPI ranks.
 *
 *   nbgrad ensemble <base flags, -hkl start.hkl> -shots LIST -observed obs/{id}.img -global F[,a,b,c,...]
 *                   -local rotx,roty,rotz[,scale,...] [-cycles 4] [-loss poisson|lsq] [-hklout F.hkl] [-json F]
 *
 * Global parameters (the structure factors of the -hkl table, "F", and any of the experiment's parameters, e.g.
 * the cell) are shared by every shot; local ones (orientation, N, scale, background...) belong to each shot.  The
 * loss is the sum of the shots' losses.  Each cycle (alternating optimisation):
 *   1. local: every shot's local parameters by Levenberg-Marquardt (nbg_refine) with the globals fixed, each rank
 *      its own shots;
 *   2. global: with the Poisson loss and F the only global, expectation-maximisation on F (em_step: the model is
 *      linear in F^2 with every shot's own parameters fixed, so EM converges to the maximum likelihood, in one or
 *      two steps where each pixel sees one reflection; two adjoint passes a shot per step); otherwise BFGS (GSL's
 *      vector_bfgs2) on the summed loss and its gradient, one adjoint pass per shot and evaluation, F in units of
 *      its starting value so that every variable is of order 1.  Either says how it ended (converged, or stopped
 *      at its iteration limit).
 * -spots HALF fits each shot on its spot regions (its model's spot pixels boxed, drawn again after each cycle's
 * local fits), so that an evaluation walks the spots, not the detector; EM then fits a reflection on the regions
 * only where at least half its predicted photons fall in them.
 *
 * Reproducibility whatever the number of ranks: shot i lives on rank i mod K; a shot's loss and gradient depend on
 * the shot alone (the adjoint is bit-for-bit reproducible for a thread count); the ranks exchange the per-shot
 * vectors (MPI_Allgatherv) and every rank adds them in shot order, so every rank holds the same sum, bit for bit,
 * runs the same BFGS iterations, and the answer does not depend on K.  The price: every rank holds all shots'
 * gradient vectors during the sum (nshots x (1 + globals + table) doubles); see bench/scale.md for the plan beyond.
 *
 * Standard errors of the globals, from the information at the optimum: for F, the diagonal of the Poisson Fisher
 * information under the approximation that each pixel sees one reflection (then dM_p/dF_j = 2 M_pj / F_j and
 * I_jj = 2 (dS/dF_j) / F_j with S = sum of the model over the shots' pixels: one adjoint pass of dL/dM = 1 gives
 * every entry), i.e. F_j / (2 sqrt(photons of reflection j)); for the other globals, Gauss-Newton information from
 * the tangent images summed over shots.  Both are conditional on the other parameters (their correlations are left
 * out): a lower bound on the marginal errors, said so in the output.
 */
#include "cli.h"
#include "io.h"
#include "param.h"
#include "plan.h"
#include "shots.h"

#ifdef NBG_HAVE_FORMATS
#include <jansson.h>
#endif
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#ifdef NBG_HAVE_MPI
#include <mpi.h>
#endif
#ifndef NBG_NO_REFINE
#include <gsl/gsl_errno.h>
#include <gsl/gsl_multimin.h>
#endif

typedef struct {
    const char *shots, *observed, *hklout, *json;
    const char *global, *local;
    int cycles;
    nbg_loss loss;
    int spots;        /* -spots: each shot's spot regions' half-width in pixels; -1: every pixel */
    double spot_frac; /* -spot_frac: a spot pixel's model value above the floor, of the peak's (0.05) */
} ens_opts;

static int set_frac(void *opts, const char *flag, char **v, void *dst)
{
    double x;
    if (!nbgi_cli_number(flag, v[0], &x) || !(x > 0 && x < 1)) {
        fprintf(stderr, "nbgrad: error: -spot_frac expects a fraction in (0, 1), got '%s'\n", v[0]);
        return 0;
    }
    *(double *)dst = x;
    return 1;
}

static int set_cycles(void *opts, const char *flag, char **v, void *dst)
{
    double x;
    if (!nbgi_cli_number(flag, v[0], &x) || x < 1 || x > 1000 || x != floor(x)) {
        fprintf(stderr, "nbgrad: error: -cycles expects 1 to 1000, got '%s'\n", v[0]);
        return 0;
    }
    *(int *)dst = (int)x;
    return 1;
}

static int set_loss(void *opts, const char *flag, char **v, void *dst)
{
    if (strcmp(v[0], "poisson") != 0 && strcmp(v[0], "lsq") != 0) {
        fprintf(stderr, "nbgrad: error: -loss expects lsq or poisson, got '%s'\n", v[0]);
        return 0;
    }
    *(nbg_loss *)dst = v[0][0] == 'p' ? NBG_LOSS_POISSON : NBG_LOSS_LSQ;
    return 1;
}

/* ensemble's own flags: the parser, nbgrad ensemble -h, nbgrad -h and docs/flags.md's list (see src/cli.h) */
#define EO(field) offsetof(ens_opts, field)
static const nbgi_sub_flag ens_flag_table[] = {
    {"-shots", NBGI_CMD_ENSEMBLE, nbgi_set_path, EO(shots), "FILE",
     "the shot list (JSON lines, as nbgrad batch reads): each shot's starting orientation and other values"},
    {"-observed", NBGI_CMD_ENSEMBLE, nbgi_set_path, EO(observed), "TEMPLATE",
     "the shots' observed images, {id} replaced by each shot's id (e.g. obs/{id}.img)"},
    {"-global", NBGI_CMD_ENSEMBLE, nbgi_set_path, EO(global), "LIST",
     "parameters every shot shares, comma-separated: F (the -hkl table) and any of -params's (cell ...)"},
    {"-local", NBGI_CMD_ENSEMBLE, nbgi_set_path, EO(local), "LIST",
     "parameters of each shot, comma-separated (rotx,roty,rotz, scale, N ...)"},
    {"-cycles", NBGI_CMD_ENSEMBLE, set_cycles, EO(cycles), "n",
     "cycles of local fits then a global BFGS step (4)"},
    {"-loss", NBGI_CMD_ENSEMBLE, set_loss, EO(loss), "poisson|lsq", "the loss summed over the shots (poisson)"},
    {"-hklout", NBGI_CMD_ENSEMBLE, nbgi_set_path, EO(hklout), "FILE",
     "with -global F: the refined table, \"h k l F sigma(F)\" lines of the measured entries"},
    {"-json", NBGI_CMD_ENSEMBLE, nbgi_set_path, EO(json), "FILE",
     "the result as JSON: losses, globals, F, every shot's locals (docs/json.md)"},
    {"-spots", NBGI_CMD_ENSEMBLE, nbgi_set_half_box, EO(spots), "HALF",
     "fit each shot on its spot regions: the pixels within HALF of its starting model's spot pixels (above its floor "
     "by -spot_frac of its peak), not its whole detector; the cost scales with those pixels"},
    {"-spot_frac", NBGI_CMD_ENSEMBLE, set_frac, EO(spot_frac), "x",
     "with -spots: a spot pixel's model value above the floor, as a fraction of the peak's (0.05)"},
};
#undef EO
#define NENS_FLAGS ((int)(sizeof ens_flag_table / sizeof ens_flag_table[0]))

const nbgi_sub_flag *nbgi_ensemble_flags(int *n)
{
    *n = NENS_FLAGS;
    return ens_flag_table;
}

#ifndef NBG_NO_REFINE
static int ens_flags(nbgi_cli *c, int argc, char **argv, int i)
{
    return nbgi_sub_flag_parse(ens_flag_table, NENS_FLAGS, NBGI_CMD_ENSEMBLE, c->extra, argc, argv, i, NULL);
}
#endif

/* Parses a parameter list for the experiment e (nbg_params_parse) into *p (malloc'd, the caller frees it) and *n;
 * the word "F" (the whole structure-factor table) sets *want_F where allow_F, and is refused elsewhere; single
 * table entries are refused (the shots share the whole table).  Prints the error. */
static int param_list(nbg_ctx *ctx, const nbg_experiment *e, const char *flag, const char *list, int allow_F,
                      nbg_param **p, int *n, int *want_F)
{
    *p = NULL;
    *n = 0;
    *want_F = 0;
    char *buf = strdup(list != NULL ? list : ""), *rest = calloc(strlen(list != NULL ? list : "") + 1, 1);
    if (buf == NULL || rest == NULL) {
        free(buf), free(rest);
        fprintf(stderr, "nbgrad: error: out of memory for %s\n", flag);
        return 0;
    }
    /* the words but F, for nbg_params_parse */
    size_t len = 0;
    for (char *save = NULL, *t = strtok_r(buf, ",", &save); t != NULL; t = strtok_r(NULL, ",", &save)) {
        if (strcmp(t, "F") == 0) {
            if (!allow_F) {
                fprintf(stderr, "nbgrad: error: %s: unknown parameter 'F' (F is global: the shots share the structure "
                        "factors)\n", flag);
                free(buf), free(rest);
                return 0;
            }
            *want_F = 1;
            continue;
        }
        len += (size_t)sprintf(rest + len, "%s%s", len ? "," : "", t);
    }
    free(buf);
    if (len > 0 && nbg_params_parse(ctx, e, rest, 0, p, n) != NBG_OK) {
        fprintf(stderr, "nbgrad: error: %s: %s\n", flag, nbg_errmsg(ctx));
        free(rest);
        return 0;
    }
    free(rest);
    for (int j = 0; j < *n; ++j) {
        if ((*p)[j] >= NBG_P_F_ALL) {
            char lab[64];
            fprintf(stderr, "nbgrad: error: %s: %s: the shots share the whole structure-factor table (-global F)\n",
                    flag, nbg_param_label(e, (*p)[j], lab, sizeof lab));
            free(*p);
            *p = NULL;
            *n = 0;
            return 0;
        }
    }
    return 1;
}

/* One rank's share of the shots, and the exchange of per-shot vectors. */
typedef struct {
    nbg_ctx *ctx;
    nbgi_cli *c;
    const ens_opts *o;
    const shot_list *shots;
    int rank, size, mpi;
    int nmine;              /* this rank's shots: indices rank, rank + size, ... */
    nbg_experiment *e;      /* nmine experiments */
    nbg_source **src;       /* nmine source arrays (NULL when none) */
    float **obs;            /* nmine observed images */
    uint8_t **mask;         /* nmine masks (-mask's, the file's and the overloads: nbg_observed.use) */
    uint32_t **list;        /* nmine spot regions (-spots; NULL: every pixel) */
    size_t npix;            /* the largest detector's pixels (the buffers' size) */
    size_t *np;             /* nmine: each shot's pixels (a shot's own experiment list may bring its own detector) */
    nbg_panel **pan;        /* nmine: the panels of a shot's own multi-panel list (NULL: none) */
    float *img;
    nbg_param *gp, *lp;     /* the global and local parameters (F aside) */
    int ng, nl, want_F;
    size_t nF;              /* the table's entries */
    nbg_param *ids;         /* the gradient's parameters: gp, then NBG_P_F(0 .. nF - 1) with want_F */
    double *grad;           /* ng + nF: the gradient of one shot's loss */
    double *F0;             /* the table's starting values (the F variables' units) */
    uint8_t *fitted;        /* nF: EM's last step fitted the entry (with -spots: at least half its photons in the
                               regions); NULL before EM ran */
    size_t nvec;            /* 1 + ng + (want_F ? nF : 0): a shot's loss and gradient */
    double *mine;           /* nmine * nvec */
    double *all;            /* nshots * nvec, in shot order */
    int failed;
    long evals;
} ens;

/* A parameter's name, for messages and output (a static buffer: one use per call of printf). */
static const char *label(const nbg_experiment *e, nbg_param p)
{
    static char buf[64];
    return nbg_param_label(e, p, buf, sizeof buf);
}

static int shot_of(const ens *w, int k) { return k * w->size + w->rank; }

/* Every rank's per-shot vectors (len doubles a shot; this rank's in mine, its k-th shot being shot k K + rank)
 * into all, in shot order, on every rank.  Returns 0 when any rank failed (then all stop together). */
static int gather_all(ens *w, size_t len, const double *mine, double *all)
{
    const int nshots = w->shots->n;
    int failed = w->failed;
#ifdef NBG_HAVE_MPI
    if (w->mpi) {
        MPI_Allreduce(&w->failed, &failed, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
        if (failed) {
            return 0;
        }
        int *counts = malloc(sizeof(int) * (size_t)w->size), *displs = malloc(sizeof(int) * (size_t)w->size);
        double *tmp = malloc(sizeof(double) * ((size_t)nshots * len + 1));
        if (counts == NULL || displs == NULL || tmp == NULL) {
            free(counts), free(displs), free(tmp);
            fprintf(stderr, "nbgrad: error: out of memory exchanging the shots' vectors\n");
            MPI_Abort(MPI_COMM_WORLD, 1);
            return 0;
        }
        int off = 0;
        for (int r = 0; r < w->size; ++r) {
            const int nr = nshots > r ? (nshots - r + w->size - 1) / w->size : 0;
            counts[r] = nr * (int)len;
            displs[r] = off;
            off += counts[r];
        }
        MPI_Allgatherv(mine, w->nmine * (int)len, MPI_DOUBLE, tmp, counts, displs, MPI_DOUBLE, MPI_COMM_WORLD);
        for (int r = 0; r < w->size; ++r) {
            for (int k = 0; k * w->size + r < nshots; ++k) {
                memcpy(all + (size_t)(k * w->size + r) * len, tmp + displs[r] + (size_t)k * len, len * sizeof(double));
            }
        }
        free(counts), free(displs), free(tmp);
        return 1;
    }
#endif
    if (failed) {
        return 0;
    }
    memcpy(all, mine, sizeof(double) * (size_t)nshots * len);
    return 1;
}

/* Gathers the per-shot vectors of len doubles (this rank's in mine) into all and sums them in shot order into out. */
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

/* dL/dF of this rank's shot k (experiment e, dL/dM = dl) into out (nF), the image into w->img; prints the error. */
static int shot_dF(ens *w, int k, const nbg_experiment *e, const float *dl, double *out)
{
    if (nbg_simulate_grad(w->ctx, e, dl, w->ids + w->ng, (int)w->nF, out, w->img, w->np[k], NULL) != NBG_OK) {
        fprintf(stderr, "nbgrad: error: shot %s: %s\n", w->shots->v[shot_of(w, k)].id, nbg_errmsg(w->ctx));
        w->failed = 1;
        return 0;
    }
    return 1;
}

/* Writes the global variables x (ng parameters, then F / F0) into every shot of this rank. */
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

/* The summed loss and its gradient with respect to x; every rank calls it together.  Returns 0 on a failure. */
static int evaluate(ens *w, const double *x, double *L, double *g)
{
    set_globals(w, x);
    const int nids = w->ng + (int)w->nF; /* nF is 0 without want_F */
    for (int k = 0; k < w->nmine && !w->failed; ++k) {
        double *v = w->mine + (size_t)k * w->nvec;
        double Lk = 0;
        if (nbg_loss_grad(w->ctx, &w->e[k], w->o->loss, w->obs[k], NULL, w->ids, nids, &Lk, w->grad, w->img,
                          w->np[k]) != NBG_OK) {
            fprintf(stderr, "nbgrad: error: shot %s: %s\n", w->shots->v[shot_of(w, k)].id, nbg_errmsg(w->ctx));
            w->failed = 1;
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
        w->failed = 1;
    }
    const int ok = exchange_sum(w, sum != NULL ? sum : w->all);
    if (ok && sum != NULL) {
        *L = sum[0];
        memcpy(g, sum + 1, sizeof(double) * (w->nvec - 1));
    }
    free(sum);
    return ok && sum != NULL;
}

#ifndef NBG_NO_REFINE
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
        fprintf(stderr, "nbgrad: error: out of memory for the structure factors' EM step\n");
        w->failed = 1;
        gather_all(w, len, NULL, NULL); /* the other ranks learn it at their first exchange */
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
            w->failed = 1; /* said to every rank by the exchange, so that none waits for this one */
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
#endif

/* Reads shot k's observed image through the library's policy (nbg_observed_read: the pedestal the file's, else
 * -adc's for SMV without the key; the shot's mask joined by the file's and the overloads) into its experiment;
 * prints the error. */
static int load_observed(ens *w, int k)
{
    const shot *s = &w->shots->v[shot_of(w, k)];
    char path[4096], what[256];
    if (!nbgi_shot_name(w->o->observed, s->id, path, sizeof path)) {
        fprintf(stderr, "nbgrad: error: shot %s: the -observed name is too long\n", s->id);
        return 0;
    }
    snprintf(what, sizeof what, "shot %s", s->id);
    nbg_observed_options opt;
    nbg_observed_options_default(&opt);
    opt.adc = w->c->adc;
    opt.what = what;
    opt.mask_what = "-mask";
    nbg_observed ob;
    if (nbg_observed_read(w->ctx, &w->e[k], path, 0, &opt, &ob) != NBG_OK) {
        fprintf(stderr, "nbgrad: error: %s\n", nbg_errmsg(w->ctx));
        return 0;
    }
    w->obs[k] = ob.image;
    w->mask[k] = ob.use;
    w->e[k].response = ob.response;
    w->e[k].mask = ob.use;
    return 1;
}

/* Shot k's spot regions (-spots): its model rendered whole, the pixels above its floor by -spot_frac of its peak
 * boxed by nbg_spot_pixels, as the shot's pixel list; a shot whose model is flat keeps every pixel (counted in
 * *nwhole).  The regions come from the model alone (regions chosen by the data's bright pixels would bias the fit
 * towards them), and are drawn again after every cycle's local fits, where the orientations stand then.  Prints
 * the error. */
static int spot_list(ens *w, int k, long *nlisted, long *nwhole)
{
    nbg_experiment *e = &w->e[k];
    const char *id = w->shots->v[shot_of(w, k)].id;
    e->pixels = NULL; /* the whole model, then its regions */
    e->npixels_list = 0;
    free(w->list[k]);
    w->list[k] = NULL;
    if (nbg_simulate(w->ctx, e, w->img, w->np[k], NULL) != NBG_OK) {
        fprintf(stderr, "nbgrad: error: shot %s: -spots: %s\n", id, nbg_errmsg(w->ctx));
        return 0;
    }
    double thr;
    if (!nbg_spot_threshold(w->img, e->mask, w->np[k], w->o->spot_frac, &thr)) {
        ++*nwhole;
        return 1;
    }
    long n = 0;
    if (nbg_spot_pixels(w->ctx, e, w->img, w->np[k], thr, NULL, 0, w->o->spots, &w->list[k], &n) != NBG_OK) {
        fprintf(stderr, "nbgrad: error: shot %s: -spots: %s\n", id, nbg_errmsg(w->ctx));
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

int nbgi_cmd_ensemble(int argc, char **argv, int first)
{
#ifdef NBG_NO_REFINE
    (void)argc, (void)argv, (void)first;
    fprintf(stderr, "nbgrad: error: this build has no refinement (built with GSL=0, without GSL and LAPACKE)\n");
    return 1;
#else
    int rank = 0, size = 1;
    const int mpi = nbgi_mpi_begin(&argc, &argv, &rank, &size);
    if (mpi < 0) {
        return 1;
    }
    nbgi_cli c;
    ens_opts o = {0};
    o.cycles = 4;
    o.loss = NBG_LOSS_POISSON;
    o.spots = -1;
    o.spot_frac = 0.05;
    nbgi_cli_init(&c);
    c.extra_handler = ens_flags;
    c.extra = &o;
    c.nodump = 1;
    int status = 1;
    shot_list shots = {0};
    ens w;
    memset(&w, 0, sizeof w);
    double *x = NULL, *g = NULL;
    const nbgi_cli_path_ref extra[] = {{"-shots", &o.shots, 0}, {"-hklout", &o.hklout, 1}, {"-json", &o.json, 1}};
    nbg_ctx *ctx = nbgi_cli_setup(&c, argc, argv, first, extra, 3);
    if (ctx == NULL) {
        if (c.help) {
            nbgi_sub_usage(stdout,
                           "usage: nbgrad ensemble <nanoBragg flags, -hkl start.hkl> -shots LIST -observed "
                           "obs/{id}.img -global F[,a,b,c,...] -local rotx,roty,rotz[,...] [-cycles 4] [-loss poisson|lsq] "
                           "[-hklout F.hkl] [-json FILE]\n"
                           "       mpirun -n K nbgrad ensemble ...   (shot i on rank i mod K; the same answer for any "
                           "K)\nthe cycles' progress goes to stderr (-quiet: none), the results to stdout",
                           ens_flag_table, NENS_FLAGS, NBGI_CMD_ENSEMBLE);
            status = 0;
        }
        goto done;
    }
    if (nbgi_json_refused("-json", o.json)) {
        goto done;
    }
    if (o.shots == NULL || o.observed == NULL || o.global == NULL) {
        fprintf(stderr, "nbgrad: error: ensemble needs -shots LIST, -observed TEMPLATE (with {id}) and -global LIST\n");
        goto done;
    }
    int dummy;
    if (!param_list(ctx, &c.e, "-global", o.global, 1, &w.gp, &w.ng, &w.want_F) ||
        !param_list(ctx, &c.e, "-local", o.local, 0, &w.lp, &w.nl, &dummy)) {
        goto done;
    }
    for (int i = 0; i < w.ng; ++i) {
        for (int j = 0; j < w.nl; ++j) {
            if (w.gp[i] == w.lp[j]) {
                fprintf(stderr, "nbgrad: error: %s is both global and local\n", label(&c.e, w.gp[i]));
                goto done;
            }
        }
    }
    if (w.want_F && c.e.hkl == NULL) {
        fprintf(stderr, "nbgrad: error: -global F refines a structure-factor table: give the starting one with -hkl\n");
        goto done;
    }
    if (!nbgi_shots_read(ctx, o.shots, &shots)) {
        goto done;
    }
    nbg_report r;
    if (nbg_describe(ctx, &c.e, &r) != NBG_OK) {
        fprintf(stderr, "nbgrad: error: %s\n", nbg_errmsg(ctx));
        goto done;
    }
    w.ctx = ctx, w.c = &c, w.o = &o, w.shots = &shots, w.rank = rank, w.size = size, w.mpi = mpi;
    w.npix = r.npix;
    w.nmine = shots.n > rank ? (shots.n - rank + size - 1) / size : 0;
    if (w.want_F) {
        w.nF = (size_t)nbgi_param_nF(&c.e); /* want_F needs a table (checked above) */
    }
    w.nvec = 1 + (size_t)w.ng + w.nF;
    w.ids = malloc(sizeof(nbg_param) * (w.nvec - 1 + 1));
    w.grad = calloc(w.nvec, sizeof(double));
    for (int j = 0; w.ids != NULL && j < w.ng; ++j) w.ids[j] = w.gp[j];
    for (size_t j = 0; w.ids != NULL && j < w.nF; ++j) w.ids[(size_t)w.ng + j] = NBG_P_F(j);
    w.e = calloc((size_t)w.nmine + 1, sizeof *w.e);
    w.src = calloc((size_t)w.nmine + 1, sizeof *w.src);
    w.np = calloc((size_t)w.nmine + 1, sizeof *w.np);
    w.pan = calloc((size_t)w.nmine + 1, sizeof *w.pan);
    w.obs = calloc((size_t)w.nmine + 1, sizeof *w.obs);
    w.mask = calloc((size_t)w.nmine + 1, sizeof *w.mask);
    w.list = calloc((size_t)w.nmine + 1, sizeof *w.list);
    w.img = malloc(sizeof(float) * w.npix);
    w.mine = calloc(((size_t)w.nmine + 1) * w.nvec, sizeof(double));
    w.all = calloc((size_t)shots.n * w.nvec, sizeof(double));
    w.F0 = calloc(w.nF + 1, sizeof(double));
    x = calloc(w.nvec, sizeof(double));
    g = calloc(w.nvec, sizeof(double));
    if (!w.e || !w.src || !w.np || !w.pan || !w.obs || !w.mask || !w.list || !w.img || !w.mine || !w.all || !w.ids || !w.grad || !w.F0 ||
        !x || !g) {
        fprintf(stderr, "nbgrad: error: out of memory for %d shots of %zu pixels and %zu structure factors\n",
                shots.n, w.npix, w.nF);
        goto done;
    }
    for (size_t j = 0; j < w.nF; ++j) {
        /* F's variables are F / F0; an entry that starts at 0 keeps unit scale */
        w.F0[j] = c.hkl.F[j] != 0 ? fabs(c.hkl.F[j]) : 1;
        x[w.ng + j] = c.hkl.F[j] / w.F0[j];
    }
    for (int j = 0; j < w.ng; ++j) nbg_param_get(&c.e, w.gp[j], &x[j]);
    int ok = 1;
    long npix_all = 0; /* this rank's shots' pixels */
    for (int k = 0; k < w.nmine && ok; ++k) {
        int nsrc = 0;
        const shot *s = &shots.v[shot_of(&w, k)];
        ok = nbgi_shot_apply(ctx, &c, s, o.shots, &w.e[k], &w.src[k], &nsrc, &w.pan[k]);
        w.np[k] = w.npix;
        if (ok && (s->has & S_EXPT)) {
            /* the shot's own detector (its experiment list's) */
            nbg_report rs;
            if (nbg_describe(ctx, &w.e[k], &rs) != NBG_OK) {
                fprintf(stderr, "nbgrad: error: shot %s (%s line %d): %s\n", s->id, o.shots, s->line, nbg_errmsg(ctx));
                ok = 0;
            } else if ((w.np[k] = rs.npix) > w.npix) {
                float *grown = realloc(w.img, sizeof(float) * w.np[k]);
                if (grown == NULL) {
                    fprintf(stderr, "nbgrad: error: out of memory for shot %s's %zu pixels\n", s->id, w.np[k]);
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
    /* -spots: each shot fitted on its starting model's spot regions (as refine -spots), its own pixel list */
    long nlisted = 0, nwhole = 0;
    for (int k = 0; k < w.nmine && ok && o.spots >= 0; ++k) {
        ok = spot_list(&w, k, &nlisted, &nwhole);
    }
    w.failed = !ok;
    if (o.spots >= 0) {
        long tot[3] = {nlisted, nwhole, npix_all};
#ifdef NBG_HAVE_MPI
        if (mpi) {
            MPI_Allreduce(MPI_IN_PLACE, tot, 3, MPI_LONG, MPI_SUM, MPI_COMM_WORLD);
        }
#endif
        if (rank == 0) {
            printf("spot regions: %ld pixels over the shots (%.3g%% of their %ld), within %d pixels of each "
                   "shot's starting model's spots%s\n", tot[0], 100.0 * (double)tot[0] / (double)tot[2],
                   tot[2], o.spots, tot[1] > 0 ? "; shots without a spot keep every pixel" : "");
            if (tot[1] > 0) {
                printf("note: %ld shot%s had no spot in the starting model: fitted on every pixel\n", tot[1],
                       tot[1] > 1 ? "s" : "");
            }
        }
    }
    if (rank == 0) {
        printf("ensemble: %d shots over %d rank%s, %d global parameter%s%s, %d local per shot, %d cycles\n", shots.n,
               size, size > 1 ? "s" : "", w.ng, w.ng == 1 ? "" : "s", w.want_F ? " and the structure factors" : "",
               w.nl, o.cycles);
    }
    double L = NAN;
    if (!evaluate(&w, x, &L, g)) {
        goto done;
    }
    const double L0 = L;
    if (rank == 0) {
        nbgi_progress(1, 0, o.cycles, "cycle 0: loss %.12g", L);
    }
    nbg_refine_options ro;
    nbg_refine_options_default(&ro);
    ro.loss = o.loss;
    ro.max_iter = 30;
    int local_nc = 0;
    for (int cyc = 1; cyc <= o.cycles; ++cyc) {
        /* 1. the local parameters, shot by shot, with the globals as they are */
        set_globals(&w, x);
        int nc = 0;
        for (int k = 0; k < w.nmine && w.nl > 0 && !w.failed; ++k) {
            nbg_refine_result res = {0};
            if (nbg_refine(ctx, &w.e[k], w.obs[k], NULL, w.np[k], w.lp, w.nl, &ro, &res) != NBG_OK) {
                fprintf(stderr, "nbgrad: error: shot %s: %s\n", shots.v[shot_of(&w, k)].id, nbg_errmsg(ctx));
                w.failed = 1;
            }
            nc += !res.converged;
            nbg_refine_result_free(&res);
            if (rank == 0) {
                /* on a terminal only: a line a shot would flood a log */
                nbgi_progress(0, cyc - 1, o.cycles, "cycle %d: local fits, shot %d of %d%s", cyc, k + 1, w.nmine,
                              size > 1 ? " (this rank's)" : "");
            }
        }
        local_nc = nc;
        /* the spot regions where the shots' models stand now */
        long nlist2 = 0, nwhole2 = 0;
        for (int k = 0; k < w.nmine && o.spots >= 0 && !w.failed; ++k) {
            w.failed = !spot_list(&w, k, &nlist2, &nwhole2);
        }
        /* 2. the globals, all shots together */
        const char *why = "";
        const int em = w.want_F && w.ng == 0 && o.loss == NBG_LOSS_POISSON;
        const int it = em ? em_step(&w, x, 50, &why) : global_step(&w, x, 40, &L, &why);
        if (it < 0 || (em && !evaluate(&w, x, &L, g))) {
            goto done;
        }
        if (rank == 0) {
            nbgi_progress(1, cyc, o.cycles, "cycle %d: loss %.12g (%d %s iterations, %s; %ld evaluations so far)",
                          cyc, L, it, em ? "EM" : "BFGS", why, w.evals);
        }
    }
    nbgi_progress_end();
#ifdef NBG_HAVE_MPI
    if (mpi) {
        MPI_Allreduce(MPI_IN_PLACE, &local_nc, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
    }
#endif
    /* standard errors: F from one adjoint pass of dL/dM = 1 per shot, the other globals from tangent images */
    set_globals(&w, x);
    double *Finfo = calloc(w.nvec, sizeof(double));
    float *one = NULL;
    if (Finfo == NULL || (one = malloc(sizeof(float) * w.npix)) == NULL) {
        free(Finfo);
        fprintf(stderr, "nbgrad: error: out of memory for the standard errors\n");
        goto done;
    }
    for (size_t p = 0; p < w.npix; ++p) one[p] = 1;
    double *tang = w.ng > 0 ? malloc(sizeof(double) * w.npix * (size_t)w.ng) : NULL;
    for (int k = 0; k < w.nmine && !w.failed; ++k) {
        double *v = w.mine + (size_t)k * w.nvec;
        memset(v, 0, sizeof(double) * w.nvec);
        if (w.want_F) {
            double *dF = w.grad + w.ng;
            if (nbg_simulate_grad(ctx, &w.e[k], one, w.ids + w.ng, (int)w.nF, dF, w.img, w.np[k], NULL) != NBG_OK) {
                w.failed = 1;
                break;
            }
            for (size_t j = 0; j < w.nF; ++j) {
                const double F = x[w.ng + j] * w.F0[j];
                /* the Poisson information of F_j; none for an entry EM left as it was (-spots: not in the regions) */
                const int left = w.fitted != NULL && !w.fitted[j];
                v[1 + w.ng + j] = F != 0 && !left ? 2 * dF[j] / F : 0;
            }
        }
        if (w.ng > 0 && tang != NULL &&
            nbg_simulate_jvp(ctx, &w.e[k], w.gp, w.ng, tang, w.img, w.np[k]) == NBG_OK) {
            /* the tangents are compact over a pixel list (-spots): entry t of parameter j at tang[j * nw + t] */
            const size_t nw = w.e[k].pixels != NULL ? (size_t)w.e[k].npixels_list : w.np[k];
            for (int j = 0; j < w.ng; ++j) {
                double s = 0;
                for (size_t t = 0; t < nw; ++t) {
                    const size_t p = w.e[k].pixels != NULL ? w.e[k].pixels[t] : t;
                    const double tg = tang[(size_t)j * nw + t], m = w.img[p];
                    if (w.e[k].mask == NULL || w.e[k].mask[p]) {
                        s += o.loss == NBG_LOSS_POISSON ? (m > 0 ? tg * tg / m : 0) : 2 * tg * tg;
                    }
                }
                v[1 + j] = s;
            }
        }
    }
    free(tang);
    free(one);
    const int have_info = exchange_sum(&w, Finfo);
    /* the final per-shot local values, gathered to rank 0 in shot order (through the same exchange) */
    if (rank == 0) {
        printf("ensemble: loss %.12g -> %.12g; %d of %d shots' last local fits did not converge\n", L0, L, local_nc,
               shots.n);
        printf("global parameters (standard errors conditional on the other parameters):\n");
        for (int j = 0; j < w.ng; ++j) {
            printf("  %-10s %.8g +- %.3g\n", label(&c.e, w.gp[j]), x[j],
                   have_info && Finfo[1 + j] > 0 ? 1 / sqrt(Finfo[1 + j]) : NAN);
        }
    }
    if (w.want_F && rank == 0) {
        long measured = 0;
        double rel = 0;
        for (size_t j = 0; j < w.nF; ++j) {
            if (have_info && Finfo[1 + w.ng + j] > 0) {
                ++measured;
                rel += 1 / sqrt(Finfo[1 + w.ng + j]) / fmax(1e-300, fabs(x[w.ng + j] * w.F0[j]));
            }
        }
        printf("  F: %zu entries, %ld measured (mean relative standard error %.3g)\n", w.nF, measured,
               measured ? rel / measured : NAN);
        if (o.hklout != NULL) {
            nbgi_out out;
            int wok = nbgi_out_open(ctx, o.hklout, &out) == NBG_OK;
            const nbg_hkl *h = c.e.hkl;
            const int nk = h->k_max - h->k_min + 1, nl = h->l_max - h->l_min + 1;
            for (size_t j = 0; wok && j < w.nF; ++j) {
                const double info = have_info ? Finfo[1 + w.ng + j] : 0;
                if (!(info > 0)) {
                    continue; /* not measured by any shot */
                }
                char line[160];
                const int hh = h->h_min + (int)(j / ((size_t)nk * nl)), kk = h->k_min + (int)((j / nl) % nk),
                          ll = h->l_min + (int)(j % nl);
                const int len = snprintf(line, sizeof line, "%d %d %d %.10g %.4g\n", hh, kk, ll, x[w.ng + j] * w.F0[j],
                                         1 / sqrt(info));
                wok = nbgi_out_write(ctx, &out, line, (size_t)len) == NBG_OK;
            }
            if (!wok || nbgi_out_finish(ctx, &out, NULL) != NBG_OK) {
                fprintf(stderr, "nbgrad: error: -hklout: %s\n", nbg_errmsg(ctx));
                free(Finfo);
                goto done;
            }
            printf("wrote %s: h k l F sigma(F) of the %ld measured entries\n", o.hklout, measured);
        }
    }
    /* the per-shot local values, gathered in shot order (rank 0 prints them and writes them to the JSON) */
    const size_t nlv = (size_t)(w.nl > 0 ? w.nl : 1);
    double *lmine = calloc(((size_t)w.nmine + 1) * nlv, sizeof(double));
    double *lall = calloc((size_t)shots.n * nlv, sizeof(double));
    for (int k = 0; lmine != NULL && k < w.nmine; ++k) {
        for (int j = 0; j < w.nl; ++j) nbg_param_get(&w.e[k], w.lp[j], &lmine[(size_t)k * nlv + (size_t)j]);
    }
    const int have_locals = lmine != NULL && lall != NULL && gather_all(&w, nlv, lmine, lall);
    for (int i = 0; rank == 0 && have_locals && w.nl > 0 && i < shots.n; ++i) {
        printf("shot %s:", shots.v[i].id);
        for (int j = 0; j < w.nl; ++j) printf(" %s=%.8g", label(&c.e, w.lp[j]), lall[(size_t)i * nlv + (size_t)j]);
        printf("\n");
    }
#ifdef NBG_HAVE_FORMATS
    if (o.json != NULL && rank == 0) {
        /* docs/json.md describes the file; no rank count in it: it is the same, byte for byte, whatever the number of
         * ranks */
        json_t *doc = json_object(), *gj = json_object(), *fj = json_array(), *lj = json_object();
        json_object_set_new(doc, "shots", json_integer(shots.n));
        json_object_set_new(doc, "start_loss", nbgi_json_num(L0));
        json_object_set_new(doc, "loss", nbgi_json_num(L));
        for (int j = 0; j < w.ng; ++j) {
            json_object_set_new(gj, label(&c.e, w.gp[j]), nbgi_json_num(x[j]));
        }
        json_object_set_new(doc, "globals", gj);
        for (size_t j = 0; w.want_F && j < w.nF; ++j) {
            json_array_append_new(fj, nbgi_json_num(x[w.ng + j] * w.F0[j]));
        }
        json_object_set_new(doc, "F", fj);
        for (int i = 0; have_locals && i < shots.n; ++i) {
            json_t *v = json_array();
            for (int j = 0; j < w.nl; ++j) json_array_append_new(v, nbgi_json_num(lall[(size_t)i * nlv + j]));
            json_object_set_new(lj, shots.v[i].id, v);
        }
        json_object_set_new(doc, "locals", lj);
        if (nbgi_json_write(ctx, NULL, o.json, doc, 0)) {
            printf("wrote %s\n", o.json);
        } else {
            w.failed = 1;
        }
    }
#endif
    free(Finfo);
    free(lmine);
    free(lall);
    status = w.failed ? 1 : 0;
done:
    for (int k = 0; k < w.nmine && w.e != NULL; ++k) {
        free(w.src[k]);
        free(w.pan != NULL ? w.pan[k] : NULL);
        free(w.obs[k]);
        free(w.mask[k]);
        free(w.list != NULL ? w.list[k] : NULL);
    }
    free(w.e), free(w.src), free(w.np), free(w.pan), free(w.obs), free(w.mask), free(w.list), free(w.img), free(w.mine), free(w.all);
    free(w.gp), free(w.lp), free(w.ids), free(w.grad);
    free(w.F0), free(w.fitted), free(x), free(g);
    nbgi_shots_free(&shots);
    c.extra = NULL;
    nbgi_cli_free(&c);
    nbg_ctx_destroy(ctx);
    nbgi_mpi_end(mpi);
    return status;
#endif
}
