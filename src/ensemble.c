/*
 * ensemble.c -- `nbgrad ensemble`: refinement of many still shots together, on one process or over MPI ranks.
 *
 *   nbgrad ensemble <base flags, -hkl start.hkl> -shots LIST -observed obs/{id}.img -global F[,a,b,c,...]
 *                   -local rotx,roty,rotz[,scale,...] [-cycles 4] [-loss poisson|lsq] [-hklout F.hkl] [-json F]
 *
 * Program code: it parses the flags, reads the shot list (nbg_shots_read), calls the library's optimiser
 * (nbg_ensemble, grad/ensemble.c, through its internal form on the program's nbgi_cli) and prints its progress and
 * result, writing -hklout and -json.  The optimiser does not know MPI: under mpirun this file passes it the hooks
 * (nbg_comm) over MPI_Allreduce and MPI_Allgatherv, shot i on rank i mod K, and the answer is the same for any K.
 */
#include "cli.h"
#include "io.h"
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

typedef struct {
    const char *shots, *observed, *hklout, *json;
    const char *global, *local;
    int cycles;
    nbg_loss loss;
    int spots;        /* -spots: each shot's spot regions' half-width in pixels; -1: every pixel */
    double spot_frac; /* -spot_frac: a spot pixel's model value above the floor, of the peak's (0.05) */
    nbgi_response_opts resp; /* -pedestal, -gain, -read_noise, -panel_*: the observed images' detector response */
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
    ens_opts *o = c->extra;
    const int used = nbgi_sub_flag_parse(ens_flag_table, NENS_FLAGS, NBGI_CMD_ENSEMBLE, o, argc, argv, i, NULL);
    return used != 0 ? used : nbgi_response_flag_parse(&o->resp, NBGI_CMD_ENSEMBLE, argc, argv, i);
}
#endif


#ifndef NBG_NO_REFINE
/* A parameter's name, for output (a static buffer: one use per call of printf). */
static const char *label(const nbg_experiment *e, nbg_param p)
{
    static char buf[64];
    return nbg_param_label(e, p, buf, sizeof buf);
}

#ifdef NBG_HAVE_MPI
/* The library's exchange hooks over MPI_COMM_WORLD (nbg_comm). */
static int mpi_allreduce_long(void *user, long *values, int n, int op)
{
    (void)user;
    return MPI_Allreduce(MPI_IN_PLACE, values, n, MPI_LONG, op == 1 ? MPI_MAX : MPI_SUM, MPI_COMM_WORLD) !=
           MPI_SUCCESS;
}

static int mpi_allgatherv(void *user, const double *mine, int count, double *all, const int *counts,
                          const int *displs)
{
    (void)user;
    return MPI_Allgatherv(mine, count, MPI_DOUBLE, all, counts, displs, MPI_DOUBLE, MPI_COMM_WORLD) != MPI_SUCCESS;
}
#endif

/* The library's progress: the set-up's lines on stdout, warnings on stderr, the cycles through nbgi_progress (a
 * shot's local fit on a terminal only). */
static void ens_progress(void *user, nbg_ensemble_event what, int done, int total, const char *text)
{
    (void)user;
    switch (what) {
    case NBG_ENSEMBLE_INFO:
        printf("%s\n", text);
        break;
    case NBG_ENSEMBLE_WARNING:
        nbgi_progress_end();
        fprintf(stderr, "nbgrad: warning: %s\n", text);
        break;
    case NBG_ENSEMBLE_CYCLE:
        nbgi_progress(1, done, total, "%s", text);
        break;
    case NBG_ENSEMBLE_SHOT:
        nbgi_progress(0, done, total, "%s", text);
        break;
    }
}

#endif

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
    nbgi_response_opts_init(&o.resp);
    nbgi_cli_init(&c);
    c.extra_handler = ens_flags;
    c.extra = &o;
    c.nodump = 1;
    int status = 1;
    nbg_shot_list shots = {0};
    nbg_ensemble_result res = {0};
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
    if (nbg_shots_read(ctx, o.shots, &shots) != NBG_OK) {
        fprintf(stderr, "nbgrad: error: %s\n", nbg_errmsg(ctx));
        goto done;
    }
    nbg_ensemble_options eo;
    nbg_ensemble_options_default(&eo);
    eo.observed = o.observed;
    eo.global = o.global;
    eo.local = o.local;
    eo.cycles = o.cycles;
    eo.loss = o.loss;
    eo.spots = o.spots;
    eo.spot_frac = o.spot_frac;
    eo.progress = ens_progress;
    nbg_observed_options resp;
    double *resp_values = NULL;
    if (!nbgi_response_options(&o.resp, c.e.npanels, &resp, &resp_values)) {
        goto done;
    }
    eo.response = &resp;
#ifdef NBG_HAVE_MPI
    nbg_comm comm = {rank, size, NULL, mpi_allreduce_long, mpi_allgatherv};
    if (mpi) {
        eo.comm = &comm;
    }
#endif
    const int st = nbgi_ensemble(ctx, &c, &shots, &eo, &res);
    free(resp_values);
    nbgi_progress_end();
    if (st != NBG_OK) {
        fprintf(stderr, "nbgrad: error: %s\n", nbg_errmsg(ctx));
        goto done;
    }
    /* every rank holds the same result: rank 0 prints it and writes the files */
    if (rank == 0 && !c.quiet) {
        /* where the time went, in units of one adjoint pass over the shots (rank 0's: its share of them) */
        const long passes = res.evaluations > 1 ? res.evaluations - 1 : 0;
        const double unit = res.seconds_first_pass > 0 ? res.seconds_first_pass : NAN;
        fprintf(stderr, "ensemble time (rank 0): one adjoint pass over its shots %.3g s; local fits %.3g s (%.1f "
                "passes' worth); global steps %.3g s over %ld passes (%.2f of the first pass each); whole %.1f "
                "passes' worth\n", res.seconds_first_pass, res.seconds_local, res.seconds_local / unit,
                res.seconds_global, passes, passes > 0 ? res.seconds_global / (double)passes / unit : NAN,
                (res.seconds_first_pass + res.seconds_local + res.seconds_global) / unit);
    }
    if (rank == 0) {
        printf("ensemble: loss %.12g -> %.12g; %d of %d shots' last local fits did not converge\n", res.start_loss,
               res.loss, res.local_not_converged, res.nshots);
        printf("global parameters (standard errors conditional on the other parameters):\n");
        for (int j = 0; j < res.nglobals; ++j) {
            printf("  %-10s %.8g +- %.3g\n", label(&c.e, res.globals[j]), res.global_value[j], res.global_sigma[j]);
        }
    }
    if (res.has_F && rank == 0) {
        double rel = 0;
        for (size_t j = 0; j < res.nF; ++j) {
            if (!isnan(res.F_sigma[j])) {
                rel += res.F_sigma[j] / fmax(1e-300, fabs(res.F[j]));
            }
        }
        printf("  F: %zu entries, %ld measured (mean relative standard error %.3g)\n", res.nF, res.F_measured,
               res.F_measured ? rel / res.F_measured : NAN);
        if (o.hklout != NULL) {
            nbgi_out out;
            int wok = nbgi_out_open(ctx, o.hklout, &out) == NBG_OK;
            const nbg_hkl *h = c.e.hkl;
            const int nk = h->k_max - h->k_min + 1, nl = h->l_max - h->l_min + 1;
            for (size_t j = 0; wok && j < res.nF; ++j) {
                if (isnan(res.F_sigma[j])) {
                    continue; /* not measured by any shot */
                }
                char line[160];
                const int hh = h->h_min + (int)(j / ((size_t)nk * nl)), kk = h->k_min + (int)((j / nl) % nk),
                          ll = h->l_min + (int)(j % nl);
                const int len = snprintf(line, sizeof line, "%d %d %d %.10g %.4g\n", hh, kk, ll, res.F[j],
                                         res.F_sigma[j]);
                wok = nbgi_out_write(ctx, &out, line, (size_t)len) == NBG_OK;
            }
            if (!wok || nbgi_out_finish(ctx, &out, NULL) != NBG_OK) {
                fprintf(stderr, "nbgrad: error: -hklout: %s\n", nbg_errmsg(ctx));
                goto done;
            }
            printf("wrote %s: h k l F sigma(F) of the %ld measured entries\n", o.hklout, res.F_measured);
        }
    }
    const int nl = res.nlocals;
    for (int i = 0; rank == 0 && nl > 0 && i < shots.n; ++i) {
        printf("shot %s:", shots.v[i].id);
        for (int j = 0; j < nl; ++j) printf(" %s=%.8g", label(&c.e, res.locals[j]), res.local_value[(size_t)i * nl + j]);
        printf("\n");
    }
    status = 0;
#ifdef NBG_HAVE_FORMATS
    if (o.json != NULL && rank == 0) {
        /* docs/json.md describes the file; no rank count in it: it is the same, byte for byte, whatever the number of
         * ranks */
        json_t *doc = json_object(), *gj = json_object(), *fj = json_array(), *lj = json_object();
        json_object_set_new(doc, "shots", json_integer(res.nshots));
        json_object_set_new(doc, "start_loss", nbgi_json_num(res.start_loss));
        json_object_set_new(doc, "loss", nbgi_json_num(res.loss));
        for (int j = 0; j < res.nglobals; ++j) {
            json_object_set_new(gj, label(&c.e, res.globals[j]), nbgi_json_num(res.global_value[j]));
        }
        json_object_set_new(doc, "globals", gj);
        for (size_t j = 0; res.has_F && j < res.nF; ++j) {
            json_array_append_new(fj, nbgi_json_num(res.F[j]));
        }
        json_object_set_new(doc, "F", fj);
        for (int i = 0; i < shots.n; ++i) {
            json_t *v = json_array();
            for (int j = 0; j < nl; ++j) json_array_append_new(v, nbgi_json_num(res.local_value[(size_t)i * nl + j]));
            json_object_set_new(lj, shots.v[i].id, v);
        }
        json_object_set_new(doc, "locals", lj);
        if (nbgi_json_write(ctx, NULL, o.json, doc, 0)) {
            printf("wrote %s\n", o.json);
        } else {
            status = 1;
        }
    }
#endif
done:
    nbg_ensemble_result_free(&res);
    nbg_shots_free(&shots);
    c.extra = NULL;
    nbgi_cli_free(&c);
    nbg_ctx_destroy(ctx);
    nbgi_mpi_end(mpi);
    return status;
#endif
}
