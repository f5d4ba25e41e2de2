/*
 * test-shots.c -- shot lists and the ensemble through the library alone (nbg_shots_read, nbg_shots_make,
 * nbg_shot_experiment_make, nbg_ensemble), without the program and without MPI:
 *   - a list read (keys, N as one number, ids as integers, the line numbers) and its refusals named by file, line
 *     and key (an unknown key, a wrong type, a repeated id, no shots, not JSON), nothing printed;
 *   - nbg_shots_make: the same seed the same bytes, a jitter without its value refused;
 *   - a shot's experiment: the base experiment with the line's keys (misset, N, scale on the fluence, the seed);
 *   - nbg_ensemble on 6 noisy shots (F global by EM, orientations local; and a cell length and F by BFGS): the loss
 *     goes down, F moves towards the truth, and the answer is the same, bit for bit, spread over 2 and 3
 *     "processes" (threads joined by an nbg_comm of a barrier, as MPI's hooks join ranks) as on one;
 *   - a failure on one process (a missing observed image) is that process's message, naming the shot, and the
 *     others' "another process", with no process left waiting; option refusals.
 */
#include "testutil.h" /* first: it sets _GNU_SOURCE */
#include "nbgrad.h"

#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static char g_dir[4096];

#ifdef NBG_HAVE_FORMATS
static const char *const BASE[] = {"-cell", "100", "100", "100", "90", "90", "90", "-N", "5", "-lambda", "1",
                                   "-detpixels", "40", "-pixel", "0.1", "-distance", "100", "-oversample", "1"};
#define NBASE ((int)(sizeof BASE / sizeof BASE[0]))

static void path_of(char *out, size_t size, const char *name) { snprintf(out, size, "%s/%s", g_dir, name); }

static int put(const char *name, const char *text)
{
    char p[4200];
    path_of(p, sizeof p, name);
    FILE *f = fopen(p, "w");
    if (f == NULL) return 0;
    fputs(text, f);
    return fclose(f) == 0;
}

/* A builder of the base flags and -hkl table (NULL: -default_F 100); NULL on failure (printed). */
static nbg_builder *builder(nbg_ctx *ctx, const char *hkl)
{
    const char *argv[NBASE + 4];
    int n = 0;
    char p[4200];
    for (int i = 0; i < NBASE; ++i) argv[n++] = BASE[i];
    if (hkl != NULL) {
        path_of(p, sizeof p, hkl);
        argv[n++] = "-hkl", argv[n++] = p, argv[n++] = "-default_F", argv[n++] = "0";
    } else {
        argv[n++] = "-default_F", argv[n++] = "100";
    }
    nbg_builder *b = NULL;
    if (nbg_builder_create(&b) != NBG_OK || nbg_builder_parse(ctx, b, n, argv) != NBG_OK ||
        nbg_builder_load(ctx, b) != NBG_OK) {
        printf("builder: %s\n", nbg_errmsg(ctx));
        nbg_builder_destroy(b);
        return NULL;
    }
    return b;
}

static void test_read(nbg_ctx *ctx)
{
    char p[4200];
    put("a.jsonl", "# shots\n{\"id\": \"s1\", \"misset\": [1, 2, 3], \"N\": 4, \"scale\": 2}\n\n{\"id\": 17, \"seed\": 9}\n");
    path_of(p, sizeof p, "a.jsonl");
    nbg_shot_list l = {0};
    int st = nbg_shots_read(ctx, p, &l);
    nbgi_test_check(st == NBG_OK && l.n == 2 && strcmp(l.v[0].id, "s1") == 0 && strcmp(l.v[1].id, "17") == 0 &&
                        l.v[0].line == 2 && l.v[1].line == 4 && l.v[0].N[2] == 4 && l.v[0].misset[1] == 2 &&
                        (l.v[0].has & NBG_SHOT_SCALE) && !(l.v[0].has & NBG_SHOT_SEED) && l.v[1].seed == 9 &&
                        l.path != NULL && strcmp(l.path, p) == 0,
                    "SHOTS-read", "two shots read with their keys and lines (status %d: %s)", st, nbg_errmsg(ctx));
    /* a shot's experiment: the base with the line's keys */
    nbg_builder *b = builder(ctx, NULL);
    nbg_shot_experiment se;
    st = b != NULL ? nbg_shot_experiment_make(ctx, b, &l, 0, 100, &se) : NBG_EINVAL;
    const nbg_experiment *base = b != NULL ? nbg_builder_experiment(b) : NULL;
    nbgi_test_check(st == NBG_OK && se.e.misset[0] == 1 && se.e.misset[2] == 3 && se.e.Na == 4 && se.e.Nc == 4 &&
                        se.e.fluence == 2 * base->fluence && se.seed == 100 && se.npix == 1600 &&
                        se.warning[0] == '\0',
                    "SHOTS-experiment", "shot s1: misset, N and scale applied, seed = base + index, 40^2 pixels "
                    "(status %d: %s)", st, nbg_errmsg(ctx));
    if (st == NBG_OK) nbg_shot_experiment_free(&se);
    st = b != NULL ? nbg_shot_experiment_make(ctx, b, &l, 1, 100, &se) : NBG_EINVAL;
    nbgi_test_check(st == NBG_OK && se.seed == 9, "SHOTS-seed", "a shot's own seed wins (%ld)", st == NBG_OK ? se.seed : -1);
    if (st == NBG_OK) nbg_shot_experiment_free(&se);
    st = b != NULL ? nbg_shot_experiment_make(ctx, b, &l, 2, 1, &se) : NBG_OK;
    nbgi_test_check(st == NBG_EINVAL, "SHOTS-index", "a shot past the list is refused (%s)", nbg_errmsg(ctx));
    nbg_builder_destroy(b);
    nbg_shots_free(&l);
    nbg_shots_free(&l); /* twice: a no-op */

    struct {
        const char *id, *text, *want1, *want2;
        int status;
    } bad[] = {
        {"SHOTS-unknown-key", "{\"id\": \"a\"}\n{\"id\": \"b\", \"colour\": 1}\n", "line 2", "unknown key \"colour\"", NBG_EINVAL},
        {"SHOTS-wrong-type", "{\"id\": \"a\", \"N\": \"five\"}\n", "line 1", "\"N\" must be a number or 3 numbers", NBG_EINVAL},
        {"SHOTS-twice", "{\"id\": \"a\"}\n{\"id\": \"a\"}\n", "lines 1 and 2", "two shots with the id \"a\"", NBG_EINVAL},
        {"SHOTS-no-id", "{\"misset\": [1, 2, 3]}\n", "line 1", "no \"id\"", NBG_EINVAL},
        {"SHOTS-empty", "# nothing\n", "b.jsonl", "holds no shots", NBG_EINVAL},
        {"SHOTS-not-json", "{\"id\": \"a\"\n", "line 1", "column", NBG_EFORMAT},
    };
    for (size_t k = 0; k < sizeof bad / sizeof bad[0]; ++k) {
        put("b.jsonl", bad[k].text);
        path_of(p, sizeof p, "b.jsonl");
        st = nbg_shots_read(ctx, p, &l);
        nbgi_test_check(st == bad[k].status && l.n == 0 && l.v == NULL && strstr(nbg_errmsg(ctx), p) &&
                            strstr(nbg_errmsg(ctx), bad[k].want1) && strstr(nbg_errmsg(ctx), bad[k].want2),
                        bad[k].id, "refused naming the file, the line and the key: %s", nbg_errmsg(ctx));
    }
    path_of(p, sizeof p, "missing.jsonl");
    st = nbg_shots_read(ctx, p, &l);
    nbgi_test_check(st == NBG_EIO && strstr(nbg_errmsg(ctx), "missing.jsonl"), "SHOTS-missing", "%s", nbg_errmsg(ctx));
}

static void test_make(nbg_ctx *ctx)
{
    char p1[4200], p2[4200];
    path_of(p1, sizeof p1, "m1.jsonl");
    path_of(p2, sizeof p2, "m2.jsonl");
    nbg_shots_make_options o;
    nbg_shots_make_options_default(&o);
    o.n = 20, o.seed = 5, o.have_cell = 1, o.cell_jitter = 1, o.N = 5, o.N_jitter = 10, o.scale_jitter = 5;
    const double cell[6] = {70, 80, 90, 90, 90, 90};
    memcpy(o.cell, cell, sizeof cell);
    int st1 = nbg_shots_make(ctx, &o, p1), st2 = nbg_shots_make(ctx, &o, p2);
    size_t n1 = 0, n2 = 0;
    char *t1 = nbgi_test_read_file(p1, &n1), *t2 = nbgi_test_read_file(p2, &n2);
    nbg_shot_list l = {0};
    const int st = nbg_shots_read(ctx, p1, &l);
    nbgi_test_check(st1 == NBG_OK && st2 == NBG_OK && t1 && t2 && n1 == n2 && memcmp(t1, t2, n1) == 0 &&
                        st == NBG_OK && l.n == 20 && strcmp(l.v[19].id, "shot000020") == 0 &&
                        (l.v[0].has & (NBG_SHOT_MISSET | NBG_SHOT_CELL | NBG_SHOT_N | NBG_SHOT_SCALE)) ==
                            (NBG_SHOT_MISSET | NBG_SHOT_CELL | NBG_SHOT_N | NBG_SHOT_SCALE),
                    "SHOTS-make", "20 shots written twice from one seed: the same %zu bytes, read back", n1);
    free(t1), free(t2);
    nbg_shots_free(&l);
    o.have_cell = 0;
    nbgi_test_check(nbg_shots_make(ctx, &o, p1) == NBG_EINVAL && strstr(nbg_errmsg(ctx), "-cell_jitter"),
                    "SHOTS-make-refused", "a cell jitter without a cell: %s", nbg_errmsg(ctx));
}

#ifndef NBG_NO_REFINE
/* --- the ensemble ------------------------------------------------------------------------------------------- */

/* The data: truth.hkl, start.hkl (15 % off), shots.jsonl (6 shots), obs/<id>.bin (Poisson counts as raw floats). */
static int make_data(nbg_ctx *ctx)
{
    char p[4200];
    FILE *t, *s;
    path_of(p, sizeof p, "truth.hkl");
    t = fopen(p, "w");
    path_of(p, sizeof p, "start.hkl");
    s = fopen(p, "w");
    if (t == NULL || s == NULL) return 0;
    unsigned long long st = 99;
    for (int h = -2; h <= 2; ++h) {
        for (int k = -2; k <= 2; ++k) {
            for (int l = -2; l <= 2; ++l) {
                st = st * 6364136223846793005ULL + 1442695040888963407ULL;
                const double u = (double)(st >> 11) / 9007199254740992.0, F = 60 + 90 * u;
                fprintf(t, "%d %d %d %.6f\n", h, k, l, F);
                fprintf(s, "%d %d %d %.6f\n", h, k, l, F * (u < 0.5 ? 0.85 : 1.15));
            }
        }
    }
    fclose(t), fclose(s);
    path_of(p, sizeof p, "shots.jsonl");
    nbg_shots_make_options o;
    nbg_shots_make_options_default(&o);
    o.n = 6, o.seed = 11;
    if (nbg_shots_make(ctx, &o, p) != NBG_OK) return 0;
    nbg_shot_list l = {0};
    nbg_builder *b = builder(ctx, "truth.hkl");
    if (b == NULL || nbg_shots_read(ctx, p, &l) != NBG_OK) {
        nbg_builder_destroy(b);
        return 0;
    }
    path_of(p, sizeof p, "obs");
    mkdir(p, 0700);
    int ok = 1;
    for (int i = 0; i < l.n && ok; ++i) {
        nbg_shot_experiment se;
        float img[1600];
        uint16_t noise[1600];
        ok = nbg_shot_experiment_make(ctx, b, &l, i, 1, &se) == NBG_OK && se.npix == 1600 &&
             nbg_simulate(ctx, &se.e, img, se.npix, NULL) == NBG_OK &&
             nbg_noise_image(ctx, img, 40, 40, NULL, 0, se.seed, noise, NULL, NULL) == NBG_OK;
        for (int q = 0; q < 1600; ++q) img[q] = noise[q];
        char name[4200];
        snprintf(name, sizeof name, "%s/obs/%s.bin", g_dir, l.v[i].id);
        ok = ok && nbg_write_float(ctx, name, img, 1600) == NBG_OK;
        nbg_shot_experiment_free(&se);
    }
    nbg_shots_free(&l);
    nbg_builder_destroy(b);
    return ok;
}

/* Processes as threads: the hooks join them at a barrier, as MPI's join ranks. */
typedef struct {
    pthread_barrier_t bar;
    int size;
    long lv[8][16];
    double *stage;
} world;

typedef struct {
    world *w;
    int rank;
    const char *global, *local, *observed;
    nbg_loss loss;
    int spots;
    int status;
    char msg[1024];
    nbg_ensemble_result res;
    long calls;
} proc;

static int fake_allreduce(void *user, long *v, int n, int op)
{
    proc *p = user;
    world *w = p->w;
    ++p->calls;
    memcpy(w->lv[p->rank], v, sizeof(long) * (size_t)n);
    pthread_barrier_wait(&w->bar);
    long out[16];
    for (int j = 0; j < n; ++j) {
        out[j] = w->lv[0][j];
        for (int r = 1; r < w->size; ++r) out[j] = op == 1 ? (w->lv[r][j] > out[j] ? w->lv[r][j] : out[j]) : out[j] + w->lv[r][j];
    }
    pthread_barrier_wait(&w->bar);
    memcpy(v, out, sizeof(long) * (size_t)n);
    return 0;
}

static int fake_allgatherv(void *user, const double *mine, int count, double *all, const int *counts, const int *displs)
{
    proc *p = user;
    world *w = p->w;
    ++p->calls;
    if (count > 0) memcpy(w->stage + displs[p->rank], mine, sizeof(double) * (size_t)count);
    pthread_barrier_wait(&w->bar);
    const int total = displs[w->size - 1] + counts[w->size - 1];
    memcpy(all, w->stage, sizeof(double) * (size_t)total);
    pthread_barrier_wait(&w->bar);
    return 0;
}

static void *run_proc(void *arg)
{
    proc *p = arg;
    nbg_ctx *ctx = NULL;
    nbg_builder *b = NULL;
    nbg_shot_list l = {0};
    char sp[4200], obs[4200];
    path_of(sp, sizeof sp, "shots.jsonl");
    path_of(obs, sizeof obs, p->observed);
    p->status = nbg_ctx_create(&ctx, NBG_BACKEND_CPU, NBG_DOUBLE, 1);
    if (p->status == NBG_OK && (b = builder(ctx, "start.hkl")) == NULL) p->status = NBG_EINVAL;
    if (p->status == NBG_OK) p->status = nbg_shots_read(ctx, sp, &l);
    if (p->status == NBG_OK) {
        nbg_ensemble_options o;
        nbg_ensemble_options_default(&o);
        o.observed = obs, o.global = p->global, o.local = p->local, o.cycles = 2, o.loss = p->loss, o.spots = p->spots;
        nbg_comm comm = {p->rank, p->w != NULL ? p->w->size : 1, p, fake_allreduce, fake_allgatherv};
        o.comm = p->w != NULL ? &comm : NULL;
        p->status = nbg_ensemble(ctx, b, &l, &o, &p->res);
    }
    snprintf(p->msg, sizeof p->msg, "%s", ctx != NULL ? nbg_errmsg(ctx) : "");
    nbg_shots_free(&l);
    nbg_builder_destroy(b);
    nbg_ctx_destroy(ctx);
    return NULL;
}

/* Runs the ensemble over size processes (0: without a comm) into procs[0 .. size). */
static void run_world(int size, proc *procs, const char *global, const char *local, nbg_loss loss, int spots,
                      const char *observed)
{
    world w;
    memset(&w, 0, sizeof w);
    w.size = size > 0 ? size : 1;
    w.stage = calloc(1 << 20, sizeof(double));
    pthread_barrier_init(&w.bar, NULL, (unsigned)w.size);
    pthread_t th[8];
    for (int r = 0; r < w.size; ++r) {
        memset(&procs[r], 0, sizeof procs[r]);
        procs[r].w = size > 0 ? &w : NULL;
        procs[r].rank = r, procs[r].global = global, procs[r].local = local, procs[r].loss = loss;
        procs[r].spots = spots, procs[r].observed = observed;
        pthread_create(&th[r], NULL, run_proc, &procs[r]);
    }
    for (int r = 0; r < w.size; ++r) pthread_join(th[r], NULL);
    pthread_barrier_destroy(&w.bar);
    free(w.stage);
}

static int same_result(const nbg_ensemble_result *a, const nbg_ensemble_result *b)
{
    if (a->nshots != b->nshots || a->nF != b->nF || a->nglobals != b->nglobals || a->nlocals != b->nlocals ||
        memcmp(&a->loss, &b->loss, sizeof a->loss) != 0 || memcmp(&a->start_loss, &b->start_loss, sizeof a->loss) ||
        a->F_measured != b->F_measured) {
        return 0;
    }
    return memcmp(a->F, b->F, sizeof(double) * a->nF) == 0 &&
           memcmp(a->F_sigma, b->F_sigma, sizeof(double) * a->nF) == 0 &&
           memcmp(a->global_value, b->global_value, sizeof(double) * (size_t)a->nglobals) == 0 &&
           memcmp(a->global_sigma, b->global_sigma, sizeof(double) * (size_t)a->nglobals) == 0 &&
           memcmp(a->local_value, b->local_value, sizeof(double) * (size_t)a->nshots * a->nlocals) == 0;
}

static void test_ensemble(nbg_ctx *ctx)
{
    if (!nbgi_test_check(make_data(ctx), "ENSLIB-data", "6 noisy shots made through the library (%s)", nbg_errmsg(ctx))) {
        return;
    }
    /* the truth, for the F error */
    char p[4200];
    path_of(p, sizeof p, "truth.hkl");
    nbg_hkl truth = {0}, start = {0};
    nbg_hkl_read(ctx, p, 0, &truth);
    path_of(p, sizeof p, "start.hkl");
    nbg_hkl_read(ctx, p, 0, &start);
    struct {
        const char *id, *global, *local;
        nbg_loss loss;
        int spots;
    } cases[] = {
        {"ENSLIB-em", "F", "rotx,roty,rotz", NBG_LOSS_POISSON, -1},
        {"ENSLIB-em-spots", "F", "rotx,roty,rotz", NBG_LOSS_POISSON, 2},
        {"ENSLIB-bfgs", "a,F", "rotx,roty,rotz,scale", NBG_LOSS_LSQ, -1},
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; ++c) {
        proc one[1], two[2], three[3];
        run_world(0, one, cases[c].global, cases[c].local, cases[c].loss, cases[c].spots, "obs/{id}.bin");
        const nbg_ensemble_result *r = &one[0].res;
        double e0 = 0, e1 = 0;
        long n = 0;
        for (size_t j = 0; one[0].status == NBG_OK && j < r->nF && r->nF == (size_t)125; ++j) {
            if (!isnan(r->F_sigma[j])) {
                e0 += fabs(start.F[j] - truth.F[j]) / truth.F[j];
                e1 += fabs(r->F[j] - truth.F[j]) / truth.F[j];
                ++n;
            }
        }
        char id[64];
        nbgi_test_check(one[0].status == NBG_OK && r->loss < r->start_loss && r->nshots == 6 && r->has_F && n > 20 &&
                            e1 < e0 && r->nlocals == (cases[c].loss == NBG_LOSS_LSQ ? 4 : 3) &&
                            (cases[c].spots < 0 || r->spot_pixels > 0),
                        cases[c].id, "loss %.10g -> %.10g, F's mean error %.3f -> %.3f over %ld measured (%s)",
                        r->start_loss, r->loss, n ? e0 / n : NAN, n ? e1 / n : NAN, n, one[0].msg);
        run_world(2, two, cases[c].global, cases[c].local, cases[c].loss, cases[c].spots, "obs/{id}.bin");
        run_world(3, three, cases[c].global, cases[c].local, cases[c].loss, cases[c].spots, "obs/{id}.bin");
        int same = one[0].status == NBG_OK;
        for (int q = 0; q < 2; ++q) same = same && two[q].status == NBG_OK && same_result(r, &two[q].res);
        for (int q = 0; q < 3; ++q) same = same && three[q].status == NBG_OK && same_result(r, &three[q].res);
        snprintf(id, sizeof id, "%s-processes", cases[c].id);
        nbgi_test_check(same && two[0].calls > 0 && three[2].calls > 0, id, "2 and 3 processes (threads joined by an "
                        "nbg_comm) give one process's result, bit for bit, on every process (%s %s)", two[0].msg,
                        three[0].msg);
        nbg_ensemble_result_free(&one[0].res);
        for (int q = 0; q < 2; ++q) nbg_ensemble_result_free(&two[q].res);
        for (int q = 0; q < 3; ++q) nbg_ensemble_result_free(&three[q].res);
    }
    nbg_hkl_free(&truth);
    nbg_hkl_free(&start);

    /* one process fails (shot 2's image is missing: it lives on process 1 of 2); nobody is left waiting */
    char obs2[4200];
    path_of(p, sizeof p, "obs2");
    mkdir(p, 0700);
    nbg_shot_list l = {0};
    path_of(p, sizeof p, "shots.jsonl");
    nbg_shots_read(ctx, p, &l);
    for (int i = 0; i < l.n; ++i) {
        char from[4200], to[4200];
        snprintf(from, sizeof from, "%s/obs/%s.bin", g_dir, l.v[i].id);
        snprintf(to, sizeof to, "%s/obs2/%s.bin", g_dir, l.v[i].id);
        if (i != 1) link(from, to);
    }
    snprintf(obs2, sizeof obs2, "shot %s", l.v[1].id);
    proc two[2];
    run_world(2, two, "F", "rotx", NBG_LOSS_POISSON, -1, "obs2/{id}.bin");
    nbgi_test_check(two[0].status != NBG_OK && two[1].status == NBG_EIO && strstr(two[1].msg, obs2) &&
                        strstr(two[0].msg, "another process") && two[0].res.F == NULL && two[1].res.F == NULL,
                    "ENSLIB-failure", "the failing process names the shot (%s), the other says so (%s)", two[1].msg,
                    two[0].msg);
    nbg_shots_free(&l);

    /* refusals, before any work */
    struct {
        const char *id, *global, *local, *want;
    } bad[] = {
        {"ENSLIB-unknown", "a,bogus", "rotx", "-global: unknown parameter 'bogus'"},
        {"ENSLIB-F-local", "a", "F", "F is global"},
        {"ENSLIB-both", "a", "a", "a is both global and local"},
        {"ENSLIB-F-entry", "F(1,0,0)", "rotx", "the whole structure-factor table"},
    };
    for (size_t k = 0; k < sizeof bad / sizeof bad[0]; ++k) {
        proc q[1];
        run_world(0, q, bad[k].global, bad[k].local, NBG_LOSS_POISSON, -1, "obs/{id}.bin");
        nbgi_test_check(q[0].status == NBG_EINVAL && strstr(q[0].msg, bad[k].want), bad[k].id, "%s", q[0].msg);
    }
    nbg_builder *b = builder(ctx, NULL);
    path_of(p, sizeof p, "shots.jsonl");
    nbg_shots_read(ctx, p, &l);
    nbg_ensemble_options o;
    nbg_ensemble_options_default(&o);
    nbg_ensemble_result res;
    o.observed = "x/{id}.bin", o.global = "F";
    int st = nbg_ensemble(ctx, b, &l, &o, &res);
    nbgi_test_check(st == NBG_EINVAL && strstr(nbg_errmsg(ctx), "-hkl"), "ENSLIB-no-table", "%s", nbg_errmsg(ctx));
    o.cycles = 0;
    st = nbg_ensemble(ctx, b, &l, &o, &res);
    nbgi_test_check(st == NBG_EINVAL && strstr(nbg_errmsg(ctx), "-cycles"), "ENSLIB-cycles", "%s", nbg_errmsg(ctx));
    o.cycles = 1, o.spot_frac = 1;
    st = nbg_ensemble(ctx, b, &l, &o, &res);
    nbgi_test_check(st == NBG_EINVAL && strstr(nbg_errmsg(ctx), "-spot_frac"), "ENSLIB-spot-frac", "%s", nbg_errmsg(ctx));
    nbg_builder *fresh = NULL;
    nbg_builder_create(&fresh);
    o.spot_frac = 0.05;
    st = nbg_ensemble(ctx, fresh, &l, &o, &res);
    nbgi_test_check(st == NBG_EINVAL && strstr(nbg_errmsg(ctx), "loaded"), "ENSLIB-unloaded", "%s", nbg_errmsg(ctx));
    nbg_builder_destroy(fresh);
    nbg_builder_destroy(b);
    nbg_shots_free(&l);
}

#endif /* NBG_NO_REFINE */
#endif /* NBG_HAVE_FORMATS */

int main(void)
{
    nbg_ctx *ctx = NULL;
    if (nbg_ctx_create(&ctx, NBG_BACKEND_CPU, NBG_DOUBLE, 1) != NBG_OK ||
        nbgi_test_mkdtemp("nbg-test-shots-", g_dir, sizeof g_dir) == NULL) {
        nbgi_test_check(0, "SHOTS-setup", "no context or temporary directory");
        return nbgi_test_summary();
    }
#ifndef NBG_HAVE_FORMATS
    nbgi_test_skip("SHOTS", "built without jansson (FORMATS=0): no shot lists");
#else
    test_read(ctx);
    test_make(ctx);
#ifdef NBG_NO_REFINE
    nbgi_test_skip("ENSLIB", "built without GSL (GSL=0): no ensemble");
#else
    test_ensemble(ctx);
#endif
#endif
    nbgi_test_rmtree(g_dir);
    nbg_ctx_destroy(ctx);
    return nbgi_test_summary();
}
