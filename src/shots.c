/*
 * shots.c -- shot lists (JSON lines, include/nbgrad.h and docs/many-shots.md): reading one (nbg_shots_read), writing
 * one of random orientations (nbg_shots_make: what `nbgrad shots` writes), and a shot's experiment, the builder's
 * with the shot's keys applied (nbg_shot_experiment_make).  Library code: it never prints; errors are the status
 * with the message in the context.  nbgrad batch and nbgrad ensemble (the program) and the ensemble optimiser
 * (grad/ensemble.c) use the internal forms of src/shots.h.
 */
#include "shots.h"
#include "internal.h"
#include "io.h"

#ifdef NBG_HAVE_FORMATS
#include <jansson.h> /* shot lists are JSON lines: without jansson (FORMATS=0) there are none */
#endif
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifndef M_PI
#define M_PI 3.14159265358979323846
#endif

void nbg_shots_free(nbg_shot_list *l)
{
    if (l == NULL) {
        return;
    }
    for (int i = 0; i < l->n; ++i) {
        free(l->v[i].sourcefile);
        free(l->v[i].expt);
    }
    free(l->v);
    free(l->path);
    memset(l, 0, sizeof *l);
}

#ifdef NBG_HAVE_FORMATS
/* FNV-1a, 64 bits: the configuration's fingerprint (not a cryptographic hash: it tells runs apart, it does not
 * defend against forgery) */
#define FNV_START 14695981039346656037ULL
static unsigned long long fnv1a(unsigned long long h, const void *p, size_t n)
{
    const unsigned char *b = p;
    for (size_t i = 0; i < n; ++i) {
        h = (h ^ b[i]) * 1099511628211ULL;
    }
    return h;
}

/* Reads n numbers (or, with scalar_ok, one number meaning all n) from v; 0 on a wrong type. */
static int numbers(json_t *v, double *out, int n, int scalar_ok)
{
    if (scalar_ok && json_is_number(v)) {
        for (int i = 0; i < n; ++i) out[i] = json_number_value(v);
        return isfinite(out[0]);
    }
    if (!json_is_array(v) || (int)json_array_size(v) != n) {
        return 0;
    }
    for (int i = 0; i < n; ++i) {
        json_t *x = json_array_get(v, (size_t)i);
        if (!json_is_number(x) || !isfinite(json_number_value(x))) {
            return 0;
        }
        out[i] = json_number_value(x);
    }
    return 1;
}

static void shot_release(nbg_shot *s)
{
    free(s->sourcefile);
    s->sourcefile = NULL;
    free(s->expt);
    s->expt = NULL;
}

/* Parses one shot object: NBG_OK, or the status with the message naming the file, line and key. */
static int parse_shot(nbg_ctx *ctx, const char *path, int line, json_t *o, nbg_shot *s)
{
    memset(s, 0, sizeof *s);
    s->line = line;
    if (!json_is_object(o)) {
        return nbgi_error(ctx, NBG_EINVAL, "%s line %d: a shot must be a JSON object", path, line);
    }
    const char *key;
    json_t *v;
    json_object_foreach(o, key, v) {
        int ok = 1;
        const char *want = "";
        if (strcmp(key, "id") == 0) {
            if (json_is_string(v) && json_string_length(v) > 0 && json_string_length(v) < sizeof s->id) {
                snprintf(s->id, sizeof s->id, "%s", json_string_value(v));
                /* the id goes into file names: letters, digits and -_. only */
                for (const char *c = s->id; *c != '\0'; ++c) {
                    if (!((*c >= 'a' && *c <= 'z') || (*c >= 'A' && *c <= 'Z') || (*c >= '0' && *c <= '9') ||
                          *c == '-' || *c == '_' || *c == '.')) {
                        ok = 0;
                    }
                }
                ok = ok && strcmp(s->id, ".") != 0 && strcmp(s->id, "..") != 0;
            } else if (json_is_integer(v) && json_integer_value(v) >= 0) {
                snprintf(s->id, sizeof s->id, "%lld", (long long)json_integer_value(v));
            } else {
                ok = 0;
            }
            want = "a name of letters, digits, '-', '_' or '.' (at most 63) or a non-negative integer";
        } else if (strcmp(key, "misset") == 0) {
            ok = numbers(v, s->misset, 3, 0), want = "3 numbers (deg)", s->has |= NBG_SHOT_MISSET;
        } else if (strcmp(key, "orient") == 0) {
            ok = numbers(v, s->orient, 3, 0), want = "3 numbers (deg)", s->has |= NBG_SHOT_ORIENT;
        } else if (strcmp(key, "A") == 0) {
            ok = numbers(v, s->A, 9, 0), want = "9 numbers", s->has |= NBG_SHOT_A;
        } else if (strcmp(key, "cell") == 0) {
            ok = numbers(v, s->cell, 6, 0), want = "6 numbers (A, deg)", s->has |= NBG_SHOT_CELL;
        } else if (strcmp(key, "N") == 0) {
            ok = numbers(v, s->N, 3, 1), want = "a number or 3 numbers", s->has |= NBG_SHOT_N;
        } else if (strcmp(key, "mosaic") == 0) {
            ok = numbers(v, &s->mosaic, 1, 1), want = "a number (deg)", s->has |= NBG_SHOT_MOSAIC;
        } else if (strcmp(key, "mosaic_domains") == 0) {
            ok = json_is_integer(v) && json_integer_value(v) >= 1 && json_integer_value(v) <= 100000000;
            s->mosaic_domains = ok ? (int)json_integer_value(v) : 0;
            want = "a positive integer", s->has |= NBG_SHOT_DOMAINS;
        } else if (strcmp(key, "lambda") == 0) {
            ok = numbers(v, &s->lambda, 1, 1), want = "a number (A)", s->has |= NBG_SHOT_LAMBDA;
        } else if (strcmp(key, "phi") == 0) {
            ok = numbers(v, &s->phi, 1, 1), want = "a number (deg)", s->has |= NBG_SHOT_PHI;
        } else if (strcmp(key, "fluence") == 0) {
            ok = numbers(v, &s->fluence, 1, 1), want = "a number (photons/m^2)", s->has |= NBG_SHOT_FLUENCE;
        } else if (strcmp(key, "scale") == 0) {
            ok = numbers(v, &s->scale, 1, 1) && s->scale >= 0, want = "a non-negative number", s->has |= NBG_SHOT_SCALE;
        } else if (strcmp(key, "seed") == 0) {
            ok = json_is_integer(v), want = "an integer", s->has |= NBG_SHOT_SEED;
            s->seed = ok ? (long)json_integer_value(v) : 0;
        } else if (strcmp(key, "sourcefile") == 0) {
            ok = json_is_string(v) && json_string_length(v) > 0, want = "a file name", s->has |= NBG_SHOT_SOURCE;
            if (ok && (s->sourcefile = strdup(json_string_value(v))) == NULL) {
                shot_release(s);
                return nbgi_error(ctx, NBG_ENOMEM, "out of memory reading %s", path);
            }
        } else if (strcmp(key, "expt") == 0) {
            ok = json_is_string(v) && json_string_length(v) > 0 && s->expt == NULL, want = "a file name (a DIALS "
                 "experiment list)", s->has |= NBG_SHOT_EXPT;
            if (ok) {
                /* relative to the list's folder */
                const char *name = json_string_value(v), *slash = strrchr(path, '/');
                const size_t dir = name[0] != '/' && slash != NULL ? (size_t)(slash - path) + 1 : 0;
                if ((s->expt = malloc(dir + strlen(name) + 1)) == NULL) {
                    shot_release(s);
                    return nbgi_error(ctx, NBG_ENOMEM, "out of memory reading %s", path);
                }
                memcpy(s->expt, path, dir);
                strcpy(s->expt + dir, name);
            }
        } else if (strcmp(key, "spectrum_shift") == 0) {
            ok = numbers(v, &s->spectrum_shift, 1, 1), want = "a number (A)", s->has |= NBG_SHOT_SPECTRUM_SHIFT;
        } else if (strcmp(key, "spectrum_scale") == 0) {
            ok = numbers(v, &s->spectrum_scale, 1, 1) && s->spectrum_scale > 0, want = "a positive number",
            s->has |= NBG_SHOT_SPECTRUM_SCALE;
        } else {
            shot_release(s);
            return nbgi_error(ctx, NBG_EINVAL, "%s line %d: unknown key \"%s\" (known: id misset A cell N mosaic "
                              "mosaic_domains lambda phi fluence scale seed sourcefile spectrum_shift spectrum_scale "
                              "orient expt)", path, line, key);
        }
        if (!ok) {
            shot_release(s);
            return nbgi_error(ctx, NBG_EINVAL, "%s line %d: \"%s\" must be %s", path, line, key, want);
        }
    }
    if (s->id[0] == '\0') {
        shot_release(s);
        return nbgi_error(ctx, NBG_EINVAL, "%s line %d: the shot has no \"id\"", path, line);
    }
    return NBG_OK;
}

/* qsort's order of shots by id, then by line (so that equal ids sit in file order) */
static int shot_id_cmp(const void *a, const void *b)
{
    const nbg_shot *x = *(const nbg_shot *const *)a, *y = *(const nbg_shot *const *)b;
    const int c = strcmp(x->id, y->id);
    return c != 0 ? c : (x->line > y->line) - (x->line < y->line);
}

int nbg_shots_read(nbg_ctx *ctx, const char *path, nbg_shot_list *l)
{
    if (l == NULL) {
        return nbgi_error(ctx, NBG_EINVAL, "nbg_shots_read: NULL list");
    }
    memset(l, 0, sizeof *l);
    if (path == NULL) {
        return nbgi_error(ctx, NBG_EINVAL, "nbg_shots_read: NULL path");
    }
    FILE *f;
    int st = nbgi_open_input(ctx, path, "-shots", "r", &f);
    if (st != NBG_OK) {
        return st;
    }
    if ((l->path = strdup(path)) == NULL) {
        fclose(f);
        return nbgi_error(ctx, NBG_ENOMEM, "out of memory reading %s", path);
    }
    char *buf = NULL;
    size_t cap = 0;
    int line = 0, got;
    while (st == NBG_OK && (got = nbgi_read_line(ctx, f, &buf, &cap, path, line + 1)) == 1) {
        ++line;
        const char *p = buf + strspn(buf, " \t\r\n");
        if (*p == '\0' || *p == '#') {
            continue;
        }
        json_error_t err;
        json_t *o = json_loads(p, JSON_REJECT_DUPLICATES, &err);
        if (o == NULL) {
            st = nbgi_error(ctx, NBG_EFORMAT, "%s line %d, column %d: %s", path, line, err.column, err.text);
            break;
        }
        if (l->n == l->cap) {
            const int ncap = l->cap ? 2 * l->cap : 64;
            nbg_shot *v = ncap <= 100000000 ? realloc(l->v, (size_t)ncap * sizeof *v) : NULL;
            if (v == NULL) {
                st = nbgi_error(ctx, NBG_ENOMEM, "out of memory reading %s (%d shots)", path, l->n);
                json_decref(o);
                break;
            }
            l->v = v;
            l->cap = ncap;
        }
        st = parse_shot(ctx, path, line, o, &l->v[l->n]);
        if (st == NBG_OK) {
            char *canon = json_dumps(o, JSON_COMPACT | JSON_SORT_KEYS);
            if (canon != NULL) {
                l->v[l->n].hash = fnv1a(FNV_START, canon, strlen(canon));
                free(canon);
                ++l->n;
            } else {
                shot_release(&l->v[l->n]);
                st = nbgi_error(ctx, NBG_ENOMEM, "out of memory reading %s", path);
            }
        }
        json_decref(o);
    }
    free(buf);
    if (st == NBG_OK && got < 0) {
        char msg[sizeof ctx->errmsg];
        snprintf(msg, sizeof msg, "%s", ctx != NULL ? ctx->errmsg : "");
        st = nbgi_error(ctx, got, "-shots: %s", msg);
    }
    fclose(f);
    if (st == NBG_OK && l->n == 0) {
        st = nbgi_error(ctx, NBG_EINVAL, "%s holds no shots", path);
    }
    /* ids name files: two shots with one id would write the same files (sorted, so that a list of 10^6 shots is
     * checked in n log n) */
    if (st == NBG_OK && l->n > 1) {
        const nbg_shot **by_id = malloc(sizeof *by_id * (size_t)l->n);
        if (by_id == NULL) {
            st = nbgi_error(ctx, NBG_ENOMEM, "out of memory checking the ids of %s", path);
        } else {
            for (int i = 0; i < l->n; ++i) by_id[i] = &l->v[i];
            qsort(by_id, (size_t)l->n, sizeof *by_id, shot_id_cmp);
            for (int i = 1; st == NBG_OK && i < l->n; ++i) {
                if (strcmp(by_id[i - 1]->id, by_id[i]->id) == 0) {
                    st = nbgi_error(ctx, NBG_EINVAL, "%s lines %d and %d: two shots with the id \"%s\"", path,
                                    by_id[i - 1]->line, by_id[i]->line, by_id[i]->id);
                }
            }
            free(by_id);
        }
    }
    if (st != NBG_OK) {
        nbg_shots_free(l);
    }
    return st;
}
#else
int nbg_shots_read(nbg_ctx *ctx, const char *path, nbg_shot_list *l)
{
    if (l != NULL) {
        memset(l, 0, sizeof *l);
    }
    return nbgi_error(ctx, NBG_EUNSUP, "-shots %s: this nbgrad was built without jansson (FORMATS=0): no shot lists",
                      path != NULL ? path : "");
}
#endif

/* --- a shot's experiment ---------------------------------------------------------------------------------------- */

static int shot_apply(nbg_ctx *ctx, nbgi_cli *c, const nbg_shot *s, const char *list, nbg_experiment *e,
                      nbg_source **src, int *nsrc, nbg_panel **pan, double **turns, char *warn, size_t wsize)
{
    *e = c->e;
    *src = NULL;
    *nsrc = 0;
    *pan = NULL;
    if (warn != NULL && wsize > 0) {
        warn[0] = '\0';
    }
    char msg[sizeof ctx->errmsg];
    if (s->has & NBG_SHOT_EXPT) {
        /* the shot's experiment list, as -expt (the builder's import: nothing duplicated here), over the base flags'
         * experiment; panels of the base (-layout, the base -expt's) and their motions do not carry over */
        nbg_geometry g;
        int np = 0;
        e->panels = NULL;
        e->npanels = 0;
        e->motions = NULL;
        e->nmotions = 0;
        const int st = nbgi_build_import_expt(ctx, c, s->expt, 0, &c->e, e, &g, pan, &np, turns);
        if (st != NBG_OK) {
            snprintf(msg, sizeof msg, "%s", nbg_errmsg(ctx));
            return nbgi_error(ctx, st, "%s line %d: shot %s: \"expt\" %s: %s", list, s->line, s->id, s->expt, msg);
        }
        if (!g.has_crystal) {
            free(*pan);
            *pan = NULL;
            return nbgi_error(ctx, NBG_EINVAL, "%s line %d: shot %s: \"expt\" %s has no crystal (index the still "
                              "first)", list, s->line, s->id, s->expt);
        }
        if (g.crystal_scan_points > 0 && warn != NULL) {
            snprintf(warn, wsize, "%s line %d: shot %s: \"expt\" %s has a scan-varying crystal: its static A is used",
                     list, s->line, s->id, s->expt);
        }
        nbg_report r;
        if (c->mask != NULL && (nbg_describe(ctx, e, &r) != NBG_OK || r.fpixels != c->mask_f ||
                                r.spixels != c->mask_s || e->npanels > 0)) {
            free(*pan);
            *pan = NULL;
            return nbgi_error(ctx, NBG_EINVAL, "%s line %d: shot %s: the -mask is %dx%d pixels and the detector of "
                              "\"expt\" %s is not", list, s->line, s->id, c->mask_f, c->mask_s, s->expt);
        }
    }
    if (s->has & NBG_SHOT_CELL) {
        e->has_cell = 1;
        memcpy(e->cell, s->cell, sizeof e->cell);
    }
    if (s->has & NBG_SHOT_A) {
        e->has_mat = 1;
        e->has_cell = 0;
        e->has_umat = 0;
        memcpy(e->mat, s->A, sizeof e->mat);
        e->misset[0] = e->misset[1] = e->misset[2] = 0;
        e->misset_random = 0;
    }
    if (s->has & NBG_SHOT_MISSET) {
        memcpy(e->misset, s->misset, sizeof e->misset);
        e->misset_random = 0;
    }
    if (s->has & NBG_SHOT_ORIENT) {
        memcpy(e->orient, s->orient, sizeof e->orient);
    }
    if (s->has & NBG_SHOT_N) {
        e->Na = s->N[0], e->Nb = s->N[1], e->Nc = s->N[2];
    }
    if (s->has & NBG_SHOT_MOSAIC) {
        e->mosaic = s->mosaic;
    }
    if (s->has & NBG_SHOT_DOMAINS) {
        e->mosaic_domains = s->mosaic_domains;
    }
    if (s->has & NBG_SHOT_LAMBDA) {
        e->lambda = s->lambda;
    }
    if (s->has & NBG_SHOT_PHI) {
        e->phi0 = s->phi;
    }
    if (s->has & NBG_SHOT_FLUENCE) {
        e->fluence = s->fluence;
        e->flux = 0;
    }
    if (s->has & NBG_SHOT_SCALE) {
        e->fluence *= s->scale;
        e->flux *= s->scale;
    }
    if (s->has & NBG_SHOT_SPECTRUM_SHIFT) {
        e->spectrum_shift = s->spectrum_shift;
    }
    if (s->has & NBG_SHOT_SPECTRUM_SCALE) {
        e->spectrum_scale = s->spectrum_scale;
    }
    if (s->has & NBG_SHOT_SOURCE) {
        nbg_report r;
        double beam[3] = {1, 0, 0};
        if (nbg_describe(ctx, e, &r) == NBG_OK) {
            memcpy(beam, r.beam, sizeof beam);
        }
        const int st = nbgi_read_sources(ctx, s->sourcefile, e->lambda, beam, src, nsrc);
        if (st != NBG_OK) {
            snprintf(msg, sizeof msg, "%s", nbg_errmsg(ctx));
            free(*pan);
            *pan = NULL;
            return nbgi_error(ctx, st, "shot %s: %s", s->id, msg);
        }
        e->sources = *src;
        e->nsources = *nsrc;
    }
    return NBG_OK;
}

int nbgi_shot_apply(nbg_ctx *ctx, nbgi_cli *c, const nbg_shot *s, const char *list, nbg_experiment *e,
                    nbg_source **src, int *nsrc, nbg_panel **pan, double **turns, char *warn, size_t wsize)
{
    *turns = NULL;
    const int st = shot_apply(ctx, c, s, list, e, src, nsrc, pan, turns, warn, wsize);
    if (st != NBG_OK) {
        free(*turns); /* the list's turns, read before a later step failed */
        *turns = NULL;
    }
    return st;
}

int nbgi_shot_name(const char *tmpl, const char *id, char *out, size_t size)
{
    size_t k = 0;
    for (const char *p = tmpl; *p != '\0';) {
        if (strncmp(p, "{id}", 4) == 0) {
            const size_t n = strlen(id);
            if (k + n >= size) {
                return 0;
            }
            memcpy(out + k, id, n);
            k += n;
            p += 4;
        } else {
            if (k + 1 >= size) {
                return 0;
            }
            out[k++] = *p++;
        }
    }
    out[k] = '\0';
    return 1;
}

int nbg_shot_experiment_make(nbg_ctx *ctx, nbg_builder *b, const nbg_shot_list *l, int i, long base_seed,
                             nbg_shot_experiment *out)
{
    if (ctx == NULL || out == NULL) {
        return nbgi_error(ctx, NBG_EINVAL, "nbg_shot_experiment_make: NULL %s", ctx == NULL ? "context" : "result");
    }
    memset(out, 0, sizeof *out);
    if (b == NULL || l == NULL || i < 0 || i >= l->n) {
        return nbgi_error(ctx, NBG_EINVAL, "nbg_shot_experiment_make: %s", b == NULL || l == NULL ? "NULL argument"
                                                                                                    : "no such shot");
    }
    nbgi_cli *c = nbgi_builder_cli(b);
    if (c == NULL) {
        return nbgi_error(ctx, NBG_EINVAL, "nbg_shot_experiment_make: the builder has not loaded its files");
    }
    const nbg_shot *s = &l->v[i];
    int st = nbgi_shot_apply(ctx, c, s, l->path != NULL ? l->path : "shot list", &out->e, &out->sources,
                             &out->nsources, &out->panels, &out->domain_rot, out->warning, sizeof out->warning);
    if (st != NBG_OK) {
        memset(out, 0, sizeof *out);
        return st;
    }
    nbg_report r;
    if ((st = nbg_describe(ctx, &out->e, &r)) != NBG_OK) {
        char msg[sizeof ctx->errmsg];
        snprintf(msg, sizeof msg, "%s", nbg_errmsg(ctx));
        nbg_shot_experiment_free(out);
        return nbgi_error(ctx, st, "shot %s (%s line %d): %s", s->id, l->path != NULL ? l->path : "shot list",
                          s->line, msg);
    }
    out->npix = r.npix;
    out->seed = (s->has & NBG_SHOT_SEED) ? s->seed : base_seed + i;
    return NBG_OK;
}

void nbg_shot_experiment_free(nbg_shot_experiment *x)
{
    if (x == NULL) {
        return;
    }
    free(x->sources);
    free(x->panels);
    free(x->domain_rot);
    memset(x, 0, sizeof *x);
}

/* --- the shot list generator ------------------------------------------------------------------------------- */

/* splitmix64: a small, well-mixed generator whose stream depends on the seed alone (the shot list must be the
 * same on every machine) */
static uint64_t next64(uint64_t *s)
{
    uint64_t z = (*s += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

static double uniform01(uint64_t *s)
{
    return (double)(next64(s) >> 11) * (1.0 / 9007199254740992.0);
}

static double gauss(uint64_t *s)
{
    const double u = uniform01(s), v = uniform01(s);
    return sqrt(-2.0 * log(1.0 - u)) * cos(2 * M_PI * v);
}

/* A rotation drawn uniformly (Shoemake's unit quaternion), as the misset angles (deg) of R = Rz Ry Rx. */
static void random_misset(uint64_t *s, double out[3])
{
    const double u1 = uniform01(s), u2 = uniform01(s), u3 = uniform01(s);
    const double a = sqrt(1 - u1), b = sqrt(u1);
    const double q[4] = {a * sin(2 * M_PI * u2), a * cos(2 * M_PI * u2), b * sin(2 * M_PI * u3),
                         b * cos(2 * M_PI * u3)}; /* x y z w */
    const double x = q[0], y = q[1], z = q[2], w = q[3];
    const double R00 = 1 - 2 * (y * y + z * z), R10 = 2 * (x * y + z * w), R20 = 2 * (x * z - y * w);
    const double R21 = 2 * (y * z + x * w), R22 = 1 - 2 * (x * x + y * y);
    /* R = Rz(g) Ry(b) Rx(a): R20 = -sin b, R21 = cos b sin a, R22 = cos b cos a, R10 = sin g cos b, R00 = cos g cos b */
    const double rb = asin(fmax(-1, fmin(1, -R20)));
    out[0] = atan2(R21, R22) * 180 / M_PI;
    out[1] = rb * 180 / M_PI;
    out[2] = atan2(R10, R00) * 180 / M_PI;
}

void nbg_shots_make_options_default(nbg_shots_make_options *o)
{
    if (o != NULL) {
        memset(o, 0, sizeof *o);
        o->n = 1;
        o->seed = 1;
    }
}

int nbg_shots_make(nbg_ctx *ctx, const nbg_shots_make_options *so, const char *out)
{
#ifndef NBG_HAVE_FORMATS
    (void)so, (void)out, (void)random_misset, (void)gauss;
    return nbgi_error(ctx, NBG_EUNSUP, "shot lists are JSON lines: this nbgrad was built without jansson (FORMATS=0)");
#else
    if (so == NULL || out == NULL) {
        return nbgi_error(ctx, NBG_EINVAL, "nbg_shots_make: NULL argument");
    }
    const long n = so->n, seed = so->seed;
    const double *cell = so->cell, N = so->N, cell_jitter = so->cell_jitter, N_jitter = so->N_jitter,
                 scale_jitter = so->scale_jitter;
    const int have_cell = so->have_cell;
    if (!(n >= 1 && n <= 100000000)) {
        return nbgi_error(ctx, NBG_EINVAL, "a shot list holds 1 to 1e8 shots, not %ld", n);
    }
    for (int k = 0; have_cell && k < 6; ++k) {
        if (!isfinite(cell[k])) {
            return nbgi_error(ctx, NBG_EINVAL, "the cell's value %d is not a finite number", k + 1);
        }
    }
    if (!(cell_jitter >= 0) || !(N_jitter >= 0) || !(scale_jitter >= 0) || !isfinite(N) ||
        !isfinite(cell_jitter + N_jitter + scale_jitter) || (cell_jitter > 0 && !have_cell) ||
        (N_jitter > 0 && !(N > 0))) {
        return nbgi_error(ctx, NBG_EINVAL, "a jitter must be >= 0 and needs its value (-cell for -cell_jitter, -N "
                          "for -N_jitter)");
    }
    nbgi_out o;
    if (nbgi_out_open(NULL, out, &o) != NBG_OK) {
        return nbgi_error(ctx, NBG_EIO, "cannot write %s", out);
    }
    uint64_t st = (uint64_t)seed * 0x2545F4914F6CDD1DULL + 1;
    int ok = 1;
    for (long i = 0; i < n && ok; ++i) {
        json_t *s = json_object();
        char id[32];
        snprintf(id, sizeof id, "shot%06ld", i + 1);
        double m[3];
        random_misset(&st, m);
        json_object_set_new(s, "id", json_string(id));
        json_object_set_new(s, "misset", json_pack("[fff]", m[0], m[1], m[2]));
        if (have_cell) {
            double c6[6];
            for (int k = 0; k < 6; ++k) c6[k] = cell[k] * (1 + (k < 3 ? cell_jitter / 100 * gauss(&st) : 0));
            json_object_set_new(s, "cell", json_pack("[ffffff]", c6[0], c6[1], c6[2], c6[3], c6[4], c6[5]));
        }
        if (N > 0) {
            json_object_set_new(s, "N", json_real(fmax(1, N * (1 + N_jitter / 100 * gauss(&st)))));
        }
        if (scale_jitter > 0) {
            json_object_set_new(s, "scale", json_real(fmax(0, 1 + scale_jitter / 100 * gauss(&st))));
        }
        char *text = json_dumps(s, JSON_COMPACT | JSON_PRESERVE_ORDER | JSON_REAL_PRECISION(17));
        json_decref(s);
        ok = text != NULL && nbgi_out_write(NULL, &o, text, strlen(text)) == NBG_OK &&
             nbgi_out_write(NULL, &o, "\n", 1) == NBG_OK;
        free(text);
    }
    if (!ok) {
        nbgi_out_abort(&o);
        return nbgi_error(ctx, NBG_EIO, "cannot write %s (out of memory or a write error)", out);
    }
    if (nbgi_out_finish(NULL, &o, NULL) != NBG_OK) {
        return nbgi_error(ctx, NBG_EIO, "cannot write %s", out);
    }
    return NBG_OK;
#endif
}
