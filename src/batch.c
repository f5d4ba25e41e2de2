/*
 * batch.c -- many shots: `nbgrad shots` writes a shot list, `nbgrad batch` simulates every shot of one, on one
 * process or split over MPI ranks (`mpirun -n K nbgrad batch ...`).  Program code (it prints), not library code.
 *
 * A shot list is JSON lines: one object per line, each naming what differs from the base experiment that the
 * nanoBragg flags describe.  Keys (all optional but "id"):
 *
 *   id        string or integer: the shot's name, which replaces {id} in the output file names (required, unique)
 *   misset    [rx, ry, rz] deg: the orientation, as -misset (applied as Rz*Ry*Rx after the cell)
 *   A         [9 numbers]: a MOSFLM A matrix in file order, as -mat (replaces the cell and misset)
 *   orient    [ox, oy, oz] deg: small rotations about the lab's x, y, z composed onto the orientation (the
 *             parameters orient_x, orient_y, orient_z: a start away from an experiment list's crystal)
 *   cell      [a, b, c, alpha, beta, gamma] (A, deg), as -cell
 *   N         number or [Na, Nb, Nc]: unit cells along a, b, c
 *   mosaic    deg; mosaic_domains: integer
 *   lambda    A; phi: deg (the spindle start)
 *   fluence   photons/m^2; scale: a factor on the fluence (or flux)
 *   sourcefile  a nanoBragg source file (a spectrum) for this shot (a path as given: relative to the working folder)
 *   spectrum_shift  A: the shot's spectrum moved (added to every source's wavelength; the parameter of that name)
 *   spectrum_scale  a factor on the shot's spectrum's width about its mean wavelength (the parameter; > 0)
 *   expt      a DIALS experiment list (.expt, one experiment: a still's from dials.stills_process or dials.index)
 *             whose crystal, beam and detector (multi-panel included) the shot takes, as -expt does; a path
 *             relative to the shot list's folder, or absolute.  Applied first: the shot's other keys (misset, A,
 *             lambda, sourcefile ...) then change it as the flags after -expt would
 *   seed      integer: the noise seed (default: the base -seed + the shot's line index)
 *
 * Blank lines and lines starting with '#' are skipped.  A malformed line, an unknown key or a value of the wrong
 * type is an error naming the file, the line and the key.
 *
 * Outputs: the base run's output flags with {id} in their names (-floatfile out/{id}.bin -noisefile out/{id}.img
 * -nxsfile out/{id}.nxs ...): one file per shot and format, each written atomically (a temporary renamed when
 * complete).  A shot whose every output exists is skipped, so a rerun resumes an interrupted batch; -overwrite
 * redoes them all.  The folder of each output template holds nbgrad-batch.json, the record of the configuration
 * that made its files: the flags but the output names, -shots, -overwrite and -quiet (as text and a 64-bit FNV-1a
 * fingerprint), and each shot's fingerprint (the flags', its line's, its seed's).  A rerun into a folder made with
 * other flags, or whose finished shot was made from another line or seed, is refused, naming them, unless
 * -overwrite; a folder of finished shots without a record (an older nbgrad's) is adopted, and said.  The files the
 * flags name (-hkl, -sourcefile, ...) are recorded by name, not by content.
 *
 * MPI: when the program runs under mpirun (Open MPI's environment says so) and was built with MPI, shot i goes
 * to rank i mod K; each rank writes its own shots' files, with its OpenMP threads.  Every shot's image depends on
 * the shot alone, so the files are the same, bit for bit, whatever K.  Every few rounds (a round is every rank's
 * k-th shot; the ranks agree on a count that keeps about 0.05 s of work between agreements) the ranks agree on
 * whether one failed; if one did, every rank stops there, the failing rank names the shot, and the run exits 1 (the
 * files of finished shots are complete; nothing is half-written).
 */
#include "cli.h"
#include "formats.h" /* nbgi_helper_path */
#include "io.h"
#include "plan.h"

#include <dirent.h>
#include <errno.h>
#include <signal.h>
#ifdef NBG_HAVE_FORMATS
#include <jansson.h> /* shot lists are JSON lines: without jansson (FORMATS=0) there are none */
#endif
#include <limits.h>
#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#ifdef _OPENMP
#include <omp.h>
#endif
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#ifdef NBG_HAVE_MPI
#include <mpi.h>
#endif

#ifndef M_PI
#define M_PI 3.14159265358979323846
#endif

#include "shots.h"

/* the library's shot lists (include/nbgrad.h, src/shots.c) */
typedef nbg_shot shot;
typedef nbg_shot_list shot_list;

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

/* --- the batch ----------------------------------------------------------------------------------------------- */

typedef struct {
    const char *shots;
    int overwrite;
} batch_opts;

/* nbgrad shots's options */
typedef struct {
    long n, seed;
    double cell[6], N, cell_jitter, N_jitter, scale_jitter;
    int have_cell;
    const char *out;
} shots_opts;

static int set_count(void *opts, const char *flag, char **v, void *dst)
{
    double x;
    if (!nbgi_cli_number(flag, v[0], &x)) {
        return 0;
    }
    if (!(x >= 1 && x <= 1e8 && x == floor(x))) {
        fprintf(stderr, "nbgrad: error: %s expects a count, 1 to 1e8, got '%s'\n", flag, v[0]);
        return 0;
    }
    *(long *)dst = (long)x;
    return 1;
}

static int set_seed(void *opts, const char *flag, char **v, void *dst)
{
    double x;
    if (!nbgi_cli_number(flag, v[0], &x)) {
        return 0;
    }
    *(long *)dst = (long)x;
    return 1;
}

static int set_number(void *opts, const char *flag, char **v, void *dst)
{
    return nbgi_cli_number(flag, v[0], dst);
}

static int set_cell(void *opts, const char *flag, char **v, void *dst)
{
    shots_opts *o = opts;
    for (int k = 0; k < 6; ++k) {
        if (!nbgi_cli_number(flag, v[k], &o->cell[k])) {
            return 0;
        }
    }
    o->have_cell = 1;
    return 1;
}

/* batch's and shots's own flags: their parsers, their -h, nbgrad -h and docs/flags.md's list (see src/cli.h) */
#define BO(field) offsetof(batch_opts, field)
#define SO(field) offsetof(shots_opts, field)
static const nbgi_sub_flag batch_flag_table[] = {
    {"-shots", NBGI_CMD_BATCH, nbgi_set_path, BO(shots), "FILE",
     "the shot list: JSON lines, keys id misset orient A cell N mosaic mosaic_domains lambda phi fluence scale "
     "seed sourcefile spectrum_shift spectrum_scale expt (a DIALS experiment list per shot) (nbgrad shots writes "
     "one)"},
    {"-overwrite", NBGI_CMD_BATCH, nbgi_set_switch, BO(overwrite), NULL,
     "redo every shot (without it a shot whose outputs all exist is skipped: a rerun resumes; a folder made with "
     "other flags or another line of a finished shot is refused, see nbgrad-batch.json)"},
    {"-n", NBGI_CMD_SHOTS, set_count, SO(n), "COUNT", "the shots, 1 to 1e8"},
    {"-o", NBGI_CMD_SHOTS, nbgi_set_path, SO(out), "FILE", "the shot list written (JSON lines)"},
    {"-seed", NBGI_CMD_SHOTS, set_seed, SO(seed), "S", "the seed of the draws (1): the same seed, the same list"},
    {"-cell", NBGI_CMD_SHOTS, set_cell, 0, "a b c alpha beta gamma",
     "every shot gets a cell (A, deg), drawn around this one with -cell_jitter"},
    {"-cell_jitter", NBGI_CMD_SHOTS, set_number, SO(cell_jitter), "PCT",
     "Gaussian spread of the cell lengths, percent rms (0)"},
    {"-N", NBGI_CMD_SHOTS, set_number, SO(N), "n", "every shot gets N (unit cells), drawn around this with -N_jitter"},
    {"-N_jitter", NBGI_CMD_SHOTS, set_number, SO(N_jitter), "PCT", "Gaussian spread of N, percent rms (0)"},
    {"-scale_jitter", NBGI_CMD_SHOTS, set_number, SO(scale_jitter), "PCT",
     "every shot gets a scale around 1, Gaussian, percent rms (0: none)"},
};
#undef BO
#undef SO
#define NBATCH_FLAGS ((int)(sizeof batch_flag_table / sizeof batch_flag_table[0]))

const nbgi_sub_flag *nbgi_batch_flags(int *n)
{
    *n = NBATCH_FLAGS;
    return batch_flag_table;
}

static int batch_flags(nbgi_cli *c, int argc, char **argv, int i)
{
    return nbgi_sub_flag_parse(batch_flag_table, NBATCH_FLAGS, NBGI_CMD_BATCH, c->extra, argc, argv, i, NULL);
}

typedef struct {
    const char **slot; /* the field of nbgi_cli that names the output */
    const char *tmpl;  /* the template the flag gave */
    char name[4096];   /* this shot's name */
} batch_out;

/* --- the record of a batch's configuration (nbgrad-batch.json beside its outputs) ------------------------------ */

/* The folder a template's files go to: what comes before the last '/' ahead of the first {id} ("." when none). */
static void template_dir(const char *tmpl, char *out, size_t size)
{
    const char *id = strstr(tmpl, "{id}");
    const size_t lim = id != NULL ? (size_t)(id - tmpl) : strlen(tmpl);
    size_t slash = 0;
    int found = 0;
    for (size_t i = 0; i < lim; ++i) {
        if (tmpl[i] == '/') {
            slash = i, found = 1;
        }
    }
    if (!found) {
        snprintf(out, size, ".");
    } else if (slash == 0) {
        snprintf(out, size, "/");
    } else {
        snprintf(out, size, "%.*s", (int)slash, tmpl);
    }
}

#ifdef NBG_HAVE_FORMATS
/* Whether every output of shot s exists (the test the batch's resume makes). */
static int shot_complete(const batch_out *outs, int nouts, const shot *s)
{
    for (int k = 0; k < nouts; ++k) {
        char name[4096];
        if (outs[k].tmpl != NULL &&
            (!nbgi_shot_name(outs[k].tmpl, s->id, name, sizeof name) || access(name, F_OK) != 0)) {
            return 0;
        }
    }
    return 1;
}

/* One folder's record: checks it against this run (flags text and fingerprint fh, each shot's fingerprint in
 * sh[]) and rewrites it.  A folder whose record names other flags, or whose finished shot was made from another
 * line or seed, is refused unless -overwrite; a folder of finished shots without a record (an older nbgrad's) is
 * said, and its shots kept and recorded as this run's.  Returns 0 after printing the error. */
static int record_folder(const char *dir, const char *flags, unsigned long long fh, const shot_list *shots,
                         const unsigned long long *sh, const batch_out *outs, int nouts, int overwrite, int *created)
{
    char path[4200], tmp[4300], hex[20];
    snprintf(path, sizeof path, "%s/nbgrad-batch.json", dir);
    snprintf(hex, sizeof hex, "%016llx", fh);
    json_t *rec = NULL;
    const int legacy = access(path, F_OK) != 0; /* no record: a new folder, or one of an older nbgrad */
    *created = legacy;
    if (!legacy) {
        json_error_t err;
        rec = json_load_file(path, JSON_REJECT_DUPLICATES, &err);
        const json_t *rs = rec != NULL ? json_object_get(rec, "shots") : NULL;
        if (!overwrite && (rec == NULL || !json_is_string(json_object_get(rec, "flags_hash")) || !json_is_object(rs))) {
            fprintf(stderr, "nbgrad: error: %s is not a batch record nbgrad can read (%s): give -overwrite to redo "
                            "the folder's shots and rewrite it\n", path, rec == NULL ? err.text : "keys missing");
            json_decref(rec);
            return 0;
        }
        if (!overwrite && strcmp(json_string_value(json_object_get(rec, "flags_hash")), hex) != 0) {
            const char *then = json_string_value(json_object_get(rec, "flags"));
            fprintf(stderr, "nbgrad: error: %s holds shots made with other flags:\n  then: %s\n  now:  %s\ngive "
                            "-overwrite to redo them with these flags, or write into another folder\n", dir,
                    then != NULL ? then : "(not recorded)", flags);
            json_decref(rec);
            return 0;
        }
        int stale = 0;
        const shot *first = NULL;
        for (int i = 0; !overwrite && i < shots->n; ++i) {
            char want[20];
            snprintf(want, sizeof want, "%016llx", sh[i]);
            const char *had = json_string_value(json_object_get(rs, shots->v[i].id));
            if ((had == NULL || strcmp(had, want) != 0) && shot_complete(outs, nouts, &shots->v[i])) {
                first = first != NULL ? first : &shots->v[i];
                ++stale;
            }
        }
        if (stale > 0) {
            fprintf(stderr, "nbgrad: error: %s: %d finished shot%s made from another line of the shot list or "
                            "another seed than now (the first: %s, line %d): give -overwrite to redo %s\n", dir,
                    stale, stale > 1 ? "s were" : " was", first->id, first->line, stale > 1 ? "them" : "it");
            json_decref(rec);
            return 0;
        }
        const char *had = rec != NULL ? json_string_value(json_object_get(rec, "flags_hash")) : NULL;
        if (!json_is_object(rs) || had == NULL || strcmp(had, hex) != 0) {
            /* -overwrite over another configuration: its shots' entries describe files of other flags */
            json_decref(rec);
            rec = NULL;
        }
    } else if (!overwrite) {
        int kept = 0;
        for (int i = 0; i < shots->n; ++i) {
            kept += shot_complete(outs, nouts, &shots->v[i]);
        }
        if (kept > 0) {
            fprintf(stderr, "nbgrad: note: %s holds the files of %d shot%s but no record of the flags that made them "
                            "(an older nbgrad, or by hand): kept, and recorded as made with these flags (-overwrite "
                            "redoes them)\n", dir, kept, kept > 1 ? "s" : "");
        }
    }
    /* the new record: the shots already recorded and finished stay, every shot this run makes is this run's */
    json_t *out = json_object(), *os = json_object();
    int ok = out != NULL && os != NULL;
    const json_t *old = rec != NULL ? json_object_get(rec, "shots") : NULL;
    const char *key;
    json_t *v;
    if (ok && old != NULL) {
        json_object_foreach((json_t *)old, key, v) {
            ok = ok && json_object_set(os, key, v) == 0;
        }
    }
    for (int i = 0; ok && i < shots->n; ++i) {
        if (!overwrite && !legacy && shot_complete(outs, nouts, &shots->v[i])) {
            continue; /* kept, and recorded already (checked above) */
        }
        char want[20];
        snprintf(want, sizeof want, "%016llx", sh[i]);
        ok = json_object_set_new(os, shots->v[i].id, json_string(want)) == 0;
    }
    ok = ok && json_object_set_new(out, "nbgrad_batch", json_integer(1)) == 0 &&
         json_object_set_new(out, "version", json_string(nbg_version())) == 0 &&
         json_object_set_new(out, "flags", json_string(flags)) == 0 &&
         json_object_set_new(out, "flags_hash", json_string(hex)) == 0 && json_object_set(out, "shots", os) == 0;
    snprintf(tmp, sizeof tmp, "%s.tmp%ld", path, (long)getpid());
    if (ok && (json_dump_file(out, tmp, JSON_INDENT(1) | JSON_SORT_KEYS) != 0 || rename(tmp, path) != 0)) {
        fprintf(stderr, "nbgrad: error: cannot record the batch's configuration in %s: %s\n", path, strerror(errno));
        remove(tmp);
        ok = -1;
    } else if (!ok) {
        fprintf(stderr, "nbgrad: error: out of memory for the batch's record %s\n", path);
    }
    json_decref(os);
    json_decref(out);
    json_decref(rec);
    return ok == 1;
}
#endif

/* --- every shot's output names, against the run's inputs and each other ------------------------------------ */

typedef struct {
    unsigned long long h; /* FNV-1a of the canonical name */
    int shot, out;
} name_key;

static int name_key_cmp(const void *a, const void *b)
{
    const name_key *x = a, *y = b;
    if (x->h != y->h) {
        return x->h < y->h ? -1 : 1;
    }
    return x->shot != y->shot ? (x->shot < y->shot ? -1 : 1) : (x->out > y->out) - (x->out < y->out);
}

/* Shot s's output k, canonical (the template's folder resolved once when it holds no {id}: cdir). */
static int shot_canonical(const batch_out *o, const char *cdir, const shot *s, char *out, size_t size)
{
    char name[4096];
    if (!nbgi_shot_name(o->tmpl, s->id, name, sizeof name)) {
        return 0;
    }
    if (cdir != NULL) {
        const char *base = strrchr(name, '/');
        const int len = snprintf(out, size, "%s/%s", strcmp(cdir, "/") == 0 ? "" : cdir, base != NULL ? base + 1 : name);
        if (len < 0 || (size_t)len >= size) {
            return 0;
        }
    } else {
        nbgi_cli_canonical(name, out, size);
    }
    return 1;
}

/* The run's inputs and every shot's expanded output names: an output that is an input (the shot list, -hkl, a
 * shot's sourcefile, ...) or two outputs with one name (shots "a1" and "1" with {id}.img and a{id}.img) would
 * overwrite a file, and are refused before any work, naming the shots and flags.  Names are compared canonical
 * (links in their folders resolved) through 64-bit fingerprints, sorted, and a shared fingerprint confirmed by the
 * names themselves.  With clean_temps, the temporaries of a killed run (an output's NAME.tmpPID.N whose process
 * is gone) are removed from the templates' folders.  Returns 0 after printing the error. */
static int batch_names_check(const nbgi_cli *c, const char *shotsfile, const shot_list *shots, const batch_out *outs,
                             int nouts, int clean_temps)
{
    const char *in[12] = {c->hklfile, c->matfile, c->sourcefile, c->maskfile, c->imgfile, c->exptin, c->settingin,
                          c->motionsfile, shotsfile, c->hklfile == NULL && !c->nodump ? c->dumpfile : NULL};
    static const char *const inflag[12] = {"-hkl", "-mat", "-sourcefile", "-mask", "-img", "-expt", "-setting",
                                           "-motions", "-shots", "-dump"};
    char cin[12][4200];
    int nin = 0;
    const char *inname[12];
    for (int i = 0; i < 10; ++i) {
        if (in[i] != NULL) {
            nbgi_cli_canonical(in[i], cin[nin], sizeof cin[0]);
            inname[nin++] = inflag[i];
        }
    }
    char cdir[8][4200];
    int has_cdir[8] = {0};
    for (int k = 0; k < nouts && k < 8; ++k) {
        if (outs[k].tmpl == NULL) {
            continue;
        }
        const char *id = strstr(outs[k].tmpl, "{id}"), *slash = strrchr(outs[k].tmpl, '/');
        if (id == NULL || slash == NULL || slash < id) { /* {id} in the file's name alone: one folder */
            char d[4096];
            template_dir(outs[k].tmpl, d, sizeof d);
            char *r = realpath(d, NULL);
            snprintf(cdir[k], sizeof cdir[k], "%s", r != NULL ? r : d);
            free(r);
            has_cdir[k] = 1;
        }
    }
    const size_t total = (size_t)shots->n * (size_t)nouts;
    name_key *keys = malloc(sizeof *keys * (total > 0 ? total : 1));
    if (keys == NULL) {
        fprintf(stderr, "nbgrad: error: out of memory checking the names of %d shots' outputs\n", shots->n);
        return 0;
    }
    size_t nk = 0;
    int ok = 1;
    char name[4200], other[4200];
    for (int i = 0; ok && i < shots->n; ++i) {
        const shot *s = &shots->v[i];
        char csrc[4200], cexpt[4200];
        if (s->sourcefile != NULL) {
            nbgi_cli_canonical(s->sourcefile, csrc, sizeof csrc);
        }
        if (s->expt != NULL) {
            nbgi_cli_canonical(s->expt, cexpt, sizeof cexpt);
        }
        for (int k = 0; ok && k < nouts; ++k) {
            if (outs[k].tmpl == NULL) {
                continue;
            }
            if (!shot_canonical(&outs[k], has_cdir[k] ? cdir[k] : NULL, s, name, sizeof name)) {
                fprintf(stderr, "nbgrad: error: shot %s: the output name is too long\n", s->id);
                ok = 0;
                break;
            }
            struct stat st;
            if (stat(name, &st) == 0 && !S_ISREG(st.st_mode) && !S_ISDIR(st.st_mode)) {
                continue; /* a device (/dev/null) may be written by every shot */
            }
            for (int j = 0; j < nin; ++j) {
                if (strcmp(name, cin[j]) == 0) {
                    fprintf(stderr, "nbgrad: error: shot %s would write its output %s over the input %s\n", s->id,
                            name, inname[j]);
                    ok = 0;
                }
            }
            if (ok && s->sourcefile != NULL && strcmp(name, csrc) == 0) {
                fprintf(stderr, "nbgrad: error: shot %s would write its output %s over its own sourcefile\n", s->id,
                        name);
                ok = 0;
            }
            if (ok && s->expt != NULL && strcmp(name, cexpt) == 0) {
                fprintf(stderr, "nbgrad: error: shot %s would write its output %s over its own experiment list (\"expt\")\n",
                        s->id, name);
                ok = 0;
            }
            keys[nk].h = fnv1a(FNV_START, name, strlen(name));
            keys[nk].shot = i;
            keys[nk].out = k;
            ++nk;
        }
    }
    if (ok && nk > 1) {
        qsort(keys, nk, sizeof *keys, name_key_cmp);
        for (size_t t = 1; ok && t < nk; ++t) {
            if (keys[t].h != keys[t - 1].h) {
                continue;
            }
            const name_key *a = &keys[t - 1], *b = &keys[t];
            shot_canonical(&outs[a->out], has_cdir[a->out] ? cdir[a->out] : NULL, &shots->v[a->shot], name,
                           sizeof name);
            shot_canonical(&outs[b->out], has_cdir[b->out] ? cdir[b->out] : NULL, &shots->v[b->shot], other,
                           sizeof other);
            if (strcmp(name, other) == 0) {
                fprintf(stderr, "nbgrad: error: shot %s's output %s and shot %s's output %s are the same file %s: one "
                                "would overwrite the other (choose templates that keep the ids apart)\n",
                        shots->v[a->shot].id, outs[a->out].tmpl, shots->v[b->shot].id, outs[b->out].tmpl, name);
                ok = 0;
            }
        }
    }
    if (ok && clean_temps) {
        /* the temporaries a killed run left beside this batch's outputs (NAME.tmpPID.N of nbgi_out_open, PID no
         * longer running on this host): removed, so that a resume leaves a clean folder */
        int removed = 0;
        for (int k = 0; k < nouts && k < 8; ++k) {
            int seen = 0;
            for (int q = 0; q < k; ++q) {
                seen |= has_cdir[q] && outs[q].tmpl != NULL && strcmp(cdir[q], cdir[k]) == 0;
            }
            if (outs[k].tmpl == NULL || !has_cdir[k] || seen) {
                continue;
            }
            DIR *d = opendir(cdir[k]);
            const struct dirent *de;
            while (d != NULL && (de = readdir(d)) != NULL) {
                const char *t = strstr(de->d_name, ".tmp");
                char *end = NULL;
                while (t != NULL && strstr(t + 4, ".tmp") != NULL) {
                    t = strstr(t + 4, ".tmp"); /* the last ".tmp" */
                }
                const long pid = t != NULL ? strtol(t + 4, &end, 10) : 0;
                if (t == NULL || pid <= 0 || end == t + 4 || *end != '.' || strspn(end + 1, "0123456789") == 0 ||
                    end[1 + strspn(end + 1, "0123456789")] != '\0' || (kill((pid_t)pid, 0) == 0 || errno != ESRCH)) {
                    continue;
                }
                const int n = snprintf(name, sizeof name, "%s/%.*s", strcmp(cdir[k], "/") == 0 ? "" : cdir[k],
                                       (int)(t - de->d_name), de->d_name);
                if (n < 0 || (size_t)n >= sizeof name) {
                    continue;
                }
                const name_key probe = {fnv1a(FNV_START, name, strlen(name)), -1, -1};
                size_t lo = 0, hi = nk; /* the first key of that fingerprint */
                while (lo < hi) {
                    const size_t mid = lo + (hi - lo) / 2;
                    if (name_key_cmp(&keys[mid], &probe) < 0) {
                        lo = mid + 1;
                    } else {
                        hi = mid;
                    }
                }
                int ours = 0;
                for (size_t t2 = lo; t2 < nk && keys[t2].h == probe.h && !ours; ++t2) {
                    ours = shot_canonical(&outs[keys[t2].out], has_cdir[keys[t2].out] ? cdir[keys[t2].out] : NULL,
                                          &shots->v[keys[t2].shot], other, sizeof other) &&
                           strcmp(other, name) == 0;
                }
                char victim[4400];
                if (ours && snprintf(victim, sizeof victim, "%s/%s", cdir[k], de->d_name) < (int)sizeof victim &&
                    unlink(victim) == 0) {
                    ++removed;
                }
            }
            if (d != NULL) {
                closedir(d);
            }
        }
        if (removed > 0) {
            fprintf(stderr, "nbgrad: note: removed %d temporar%s that an interrupted run left beside its outputs\n",
                    removed, removed > 1 ? "ies" : "y");
        }
    }
    free(keys);
    return ok;
}

/* Records the configuration of the batch in the folder of every output template (nbgrad-batch.json): the flags but
 * the output names, -shots, -overwrite and -quiet, and each shot's line and seed; refuses a folder made with
 * another configuration unless -overwrite (record_folder).  Rank 0 reads and writes; every rank learns the
 * verdict.  Returns 0 after the error was printed. */
typedef struct {
    char path[8][4200]; /* the records this run created (removed again when it makes no shot) */
    int n;
} batch_records;

static int batch_record(int argc, char **argv, int first, const shot_list *shots, long base_seed,
                        const batch_out *outs, int nouts, int overwrite, int rank, int mpi, batch_records *made)
{
    made->n = 0;
    int ok = 1;
#ifdef NBG_HAVE_FORMATS
    if (rank == 0) {
        /* the flags' text (shown) and fingerprint (each token and a 0 byte) */
        size_t len = 1;
        for (int i = first; i < argc; ++i) {
            len += strlen(argv[i]) + 1;
        }
        char *flags = malloc(len);
        unsigned long long *sh = malloc(sizeof *sh * (size_t)(shots->n > 0 ? shots->n : 1));
        ok = flags != NULL && sh != NULL;
        unsigned long long fh = FNV_START;
        size_t k = 0;
        for (int i = first; ok && i < argc; ++i) {
            const char *a = argv[i];
            if (strcmp(a, "-overwrite") == 0 || strcmp(a, "-quiet") == 0 || strcmp(a, "-noprogress") == 0) {
                continue;
            }
            if ((strcmp(a, "-shots") == 0 || nbgi_cli_names_output(a)) && i + 1 < argc) {
                ++i; /* where the files go and which list: not what they hold */
                continue;
            }
            fh = fnv1a(fh, a, strlen(a) + 1);
            k += (size_t)snprintf(flags + k, len - k, "%s%s", k > 0 ? " " : "", a);
        }
        if (ok) {
            flags[k] = '\0';
            for (int i = 0; i < shots->n; ++i) {
                /* the shot's line and the seed it gets (the base seed + its index when the line has none) */
                const long seed = (shots->v[i].has & NBG_SHOT_SEED) ? shots->v[i].seed : base_seed + i;
                unsigned long long h = fnv1a(fh, &shots->v[i].hash, sizeof shots->v[i].hash);
                sh[i] = fnv1a(h, &seed, sizeof seed);
            }
        } else {
            fprintf(stderr, "nbgrad: error: out of memory for the batch's record\n");
        }
        /* each folder once */
        char dirs[8][4096];
        int nd = 0;
        for (int j = 0; ok && j < nouts; ++j) {
            if (outs[j].tmpl == NULL) {
                continue;
            }
            char d[4096];
            template_dir(outs[j].tmpl, d, sizeof d);
            int seen = 0;
            for (int q = 0; q < nd; ++q) {
                seen |= strcmp(dirs[q], d) == 0;
            }
            if (!seen && nd < 8) {
                memcpy(dirs[nd++], d, sizeof d);
                int created = 0;
                ok = record_folder(d, flags, fh, shots, sh, outs, nouts, overwrite, &created);
                if (ok && created) {
                    snprintf(made->path[made->n++], sizeof made->path[0], "%s/nbgrad-batch.json", d);
                }
            }
        }
        free(flags);
        free(sh);
    }
#else
    (void)argc, (void)argv, (void)first, (void)shots, (void)base_seed, (void)outs, (void)nouts, (void)overwrite,
        (void)rank;
#endif
#ifdef NBG_HAVE_MPI
    if (mpi) {
        MPI_Bcast(&ok, 1, MPI_INT, 0, MPI_COMM_WORLD);
    }
#else
    (void)mpi;
#endif
    return ok;
}


/* Runs under mpirun?  Open MPI (and PMIx launchers) set these; without them the batch runs as one process and
 * MPI is not initialised at all. */
int nbgi_under_mpirun(void)
{
    return getenv("OMPI_COMM_WORLD_SIZE") != NULL || getenv("PMIX_RANK") != NULL || getenv("PMI_RANK") != NULL;
}

int nbgi_mpi_begin(int *argc, char ***argv, int *rank, int *size)
{
    *rank = 0;
    *size = 1;
    if (!nbgi_under_mpirun()) {
        return 0;
    }
#ifdef NBG_HAVE_MPI
    MPI_Init(argc, argv);
    MPI_Comm_rank(MPI_COMM_WORLD, rank);
    MPI_Comm_size(MPI_COMM_WORLD, size);
#ifdef _OPENMP
    /* ranks x threads within the node's processors: each rank takes its share, unless the user set the thread count
     * (mpirun -x OMP_NUM_THREADS=k).  The results do not depend on it (every reduction has a fixed order). */
    const char *local = getenv("OMPI_COMM_WORLD_LOCAL_SIZE");
    if (getenv("OMP_NUM_THREADS") == NULL && local != NULL && atoi(local) > 0) {
        const int share = omp_get_num_procs() / atoi(local);
        omp_set_num_threads(share > 0 ? share : 1);
    }
#endif
    return 1;
#else
    (void)argc, (void)argv;
#ifdef NBG_MPI_EXEC
    char path[PATH_MAX], tried[2048];
    if (!nbgi_helper_path("nbgrad-mpi", path, sizeof path, tried, sizeof tried)) {
        fprintf(stderr, "nbgrad: error: under mpirun nbgrad runs its MPI program nbgrad-mpi, which is missing (looked "
                        "for %s)\n", tried);
        return -1;
    }
#endif
    fprintf(stderr, "nbgrad: error: this nbgrad was built without MPI: each of the mpirun processes would run the "
                    "whole job (rebuild where mpicc is found, or run without mpirun)\n");
    return -1;
#endif
}

void nbgi_mpi_reexec(char **argv)
{
#if !defined(NBG_HAVE_MPI) && defined(NBG_MPI_EXEC)
    char path[PATH_MAX], tried[2048];
    if (nbgi_under_mpirun() && nbgi_helper_path("nbgrad-mpi", path, sizeof path, tried, sizeof tried)) {
        execv(path, argv);
        fprintf(stderr, "nbgrad: error: under mpirun nbgrad runs %s, which did not start: %s\n", path,
                strerror(errno));
        exit(1);
    }
#else
    (void)argv;
#endif
}

void nbgi_mpi_end(int mpi)
{
#ifdef NBG_HAVE_MPI
    if (mpi) {
        MPI_Finalize();
    }
#else
    (void)mpi;
#endif
}

int nbgi_cmd_batch(int argc, char **argv, int first)
{
    int rank = 0, size = 1;
    const int mpi = nbgi_mpi_begin(&argc, &argv, &rank, &size);
    if (mpi < 0) {
        return 1;
    }
    nbgi_cli c;
    batch_opts o = {0};
    nbgi_cli_init(&c);
    c.extra_handler = batch_flags;
    c.extra = &o;
    c.nodump = 1; /* every rank would write the same cache */
    c.batch = 1;
    int status = 1;
    float *img = NULL;
    shot_list shots = {0};
    const nbgi_cli_path_ref extra[] = {{"-shots", &o.shots, 0}};
    nbg_ctx *ctx = nbgi_cli_setup(&c, argc, argv, first, extra, 1);
    if (ctx == NULL) {
        if (c.help) {
            nbgi_sub_usage(stdout,
                           "usage: nbgrad batch <nanoBragg flags> -shots LIST [-overwrite] with {id} in the output "
                           "names, e.g.\n       nbgrad batch -cell 70 80 90 90 90 90 -N 5 -default_F 100 -shots "
                           "shots.jsonl -floatfile out/{id}.bin -noisefile out/{id}.img -seed 1\n"
                           "       mpirun -n K nbgrad batch ...   (shot i on rank i mod K)\n"
                           "each shot's progress goes to stderr (-quiet: none), the totals to stdout",
                           batch_flag_table, NBATCH_FLAGS, NBGI_CMD_BATCH);
            status = 0;
        }
        goto done;
    }
    if (o.shots == NULL) {
        fprintf(stderr, "nbgrad: error: batch needs -shots FILE (a shot list; nbgrad shots writes one)\n");
        goto done;
    }
    if (c.nframes > 1) {
        fprintf(stderr, "nbgrad: error: batch simulates still shots: -frames is not for it\n");
        goto done;
    }
    if (!nbgi_cli_data_fits(ctx, &c)) {
        goto done;
    }
    if (nbg_shots_read(ctx, o.shots, &shots) != NBG_OK) {
        fprintf(stderr, "nbgrad: error: %s\n", nbg_errmsg(ctx));
        goto done;
    }
    /* the outputs (src/outputs.def), each named per shot */
    batch_out outs[8];
    int nouts = 0;
    for (int k = 0; nbgi_output_at(k) != NULL && nouts < 8; ++k) {
        const nbgi_output *ot = nbgi_output_at(k);
        outs[nouts].slot = (const char **)((char *)&c + ot->field);
        outs[nouts].tmpl = nbgi_output_path(&c, ot);
        outs[nouts].name[0] = '\0';
        ++nouts;
    }
    int any = 0;
    for (int k = 0; k < nouts; ++k) {
        if (outs[k].tmpl == NULL) {
            continue;
        }
        any = 1;
        if (strstr(outs[k].tmpl, "{id}") == NULL && shots.n > 1) {
            fprintf(stderr, "nbgrad: error: every shot would write %s: put {id} in the name (e.g. out/{id}.img)\n",
                    outs[k].tmpl);
            goto done;
        }
    }
    if (!any) {
        char list[512], flag[64];
        size_t at = 0;
        for (int k = 0; nbgi_output_at(k) != NULL && at < sizeof list; ++k) {
            at += (size_t)snprintf(list + at, sizeof list - at, "%s%s", k ? ", " : "",
                                   nbgi_output_flag(nbgi_output_at(k), flag, sizeof flag));
        }
        fprintf(stderr, "nbgrad: error: batch writes nothing: give an output with {id} in its name (%s)\n", list);
        goto done;
    }
    nbg_report r;
    if (nbg_describe(ctx, &c.e, &r) != NBG_OK) {
        fprintf(stderr, "nbgrad: error: %s\n", nbg_errmsg(ctx));
        goto done;
    }
    const size_t npix = r.npix;
    size_t img_cap = npix;
    img = nbgi_cli_image_alloc(sizeof(float) * npix);
    if (img == NULL) {
        fprintf(stderr, "nbgrad: error: out of memory for a %dx%d image\n", r.fpixels, r.spixels);
        goto done;
    }
    const long base_seed = c.have_seed ? c.seed : 1;
    if (!batch_names_check(&c, o.shots, &shots, outs, nouts, rank == 0)) {
        goto done;
    }
    batch_records made;
    if (!batch_record(argc, argv, first, &shots, base_seed, outs, nouts, o.overwrite, rank, mpi, &made)) {
        goto done;
    }
    const int rounds = (shots.n + size - 1) / size;
    int done_here = 0, skipped = 0, failed = 0;
    const double t0 = nbgi_now();
#ifdef NBG_HAVE_MPI
    int since_check = 0, check_every = 1; /* rounds since the ranks last agreed, and between agreements */
    double t_check = t0;
#endif
    if (rank == 0) {
        printf("batch: %d shots from %s over %d rank%s\n", shots.n, o.shots, size, size > 1 ? "s" : "");
    }
    for (int round = 0; round < rounds; ++round) {
        const int i = round * size + rank;
        if (!failed && i < shots.n) {
            const shot *s = &shots.v[i];
            int complete = !o.overwrite;
            for (int k = 0; k < nouts; ++k) {
                if (outs[k].tmpl != NULL) {
                    if (!nbgi_shot_name(outs[k].tmpl, s->id, outs[k].name, sizeof outs[k].name)) {
                        fprintf(stderr, "nbgrad: error: shot %s: the output name is too long\n", s->id);
                        failed = 1;
                    }
                    *outs[k].slot = outs[k].name;
                    complete = complete && access(outs[k].name, F_OK) == 0;
                }
            }
            if (!failed && complete) {
                ++skipped;
            } else if (!failed) {
                nbg_experiment e;
                nbg_source *src = NULL;
                nbg_panel *pan = NULL;
                double *turns = NULL; /* the shot's list's mosaic domains' own turns */
                int nsrc = 0;
                nbg_report rs;
                c.seed = (s->has & NBG_SHOT_SEED) ? s->seed : base_seed + i;
                c.have_seed = 1;
                char warn[512];
                failed = nbgi_shot_apply(ctx, &c, s, o.shots, &e, &src, &nsrc, &pan, &turns, warn, sizeof warn) !=
                         NBG_OK;
                if (failed) {
                    fprintf(stderr, "nbgrad: error: %s\n", nbg_errmsg(ctx));
                } else if (warn[0] != '\0') {
                    fprintf(stderr, "nbgrad: warning: %s\n", warn);
                }
                size_t np = npix;
                if (!failed && (s->has & NBG_SHOT_EXPT)) {
                    /* the shot's own detector */
                    if (nbg_describe(ctx, &e, &rs) != NBG_OK) {
                        fprintf(stderr, "nbgrad: error: shot %s (%s line %d): %s\n", s->id, o.shots, s->line,
                                nbg_errmsg(ctx));
                        failed = 1;
                    } else if ((np = rs.npix) > img_cap) {
                        float *grown = realloc(img, sizeof(float) * np);
                        failed = grown == NULL;
                        img = grown != NULL ? grown : img;
                        img_cap = grown != NULL ? np : img_cap;
                        if (failed) {
                            fprintf(stderr, "nbgrad: error: out of memory for shot %s's %zu pixels\n", s->id, np);
                        }
                    }
                }
                if (!failed && nbg_simulate(ctx, &e, img, np, &rs) != NBG_OK) {
                    fprintf(stderr, "nbgrad: error: shot %s (%s line %d): %s\n", s->id, o.shots, s->line,
                            nbg_errmsg(ctx));
                    failed = 1;
                }
                if (!failed) {
                    nbgi_progress(1, i + 1, shots.n, "shot %s (%d of %d, rank %d)", s->id, i + 1, shots.n, rank);
                    const nbg_experiment keep = c.e;
                    c.e = e; /* the outputs describe the shot's experiment */
                    failed = !nbgi_cli_write_outputs(ctx, &c, &rs, img, 0) || !nbgi_cli_commit(ctx, &c);
                    c.e = keep;
                    if (failed) {
                        fprintf(stderr, "nbgrad: error: shot %s: its outputs could not be written\n", s->id);
                    }
                }
                free(src);
                free(pan);
                free(turns);
                done_here += !failed;
            }
        }
        int agreed = !mpi;
#ifdef NBG_HAVE_MPI
        if (mpi && (++since_check >= check_every || round == rounds - 1)) {
            agreed = 1;
            /* every rank learns of a failure at a check, and stops: nothing else is started.  The ranks check
             * every check_every rounds, a count they all derive from the same reduced numbers (so they meet at the
             * same rounds) and that keeps about CHECK_SECONDS of work between checks: a rank does not wait for the
             * others after every small shot (lockstep rounds of tiny shots spend their time in the collective). */
            const double CHECK_SECONDS = 0.05;
            double mine[2] = {(double)failed, nbgi_now() - t_check}, all[2];
            MPI_Allreduce(mine, all, 2, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
            const int any_failed = all[0] > 0;
            if (any_failed && !failed) {
                printf("rank %d: stopping: another rank failed\n", rank);
            }
            failed = failed || any_failed;
            const double per_round = all[1] / since_check;
            const double want = per_round > 0 ? CHECK_SECONDS / per_round : 1024.0;
            check_every = want >= 1024.0 ? 1024 : want < 1.0 ? 1 : (int)want;
            since_check = 0;
            t_check = nbgi_now();
        }
#endif
        if (failed && agreed) {
            break; /* under MPI only where the ranks have just agreed: every rank leaves at the same round */
        }
    }
    nbgi_progress_end();
    /* the totals, over the ranks */
    int counts[3] = {done_here, skipped, failed}, total[3] = {done_here, skipped, failed};
#ifdef NBG_HAVE_MPI
    if (mpi) {
        MPI_Reduce(counts, total, 3, MPI_INT, MPI_SUM, 0, MPI_COMM_WORLD);
    }
#endif
    (void)counts;
    const double secs = nbgi_now() - t0;
    if (rank == 0) {
        printf("batch: %d shots simulated, %d skipped (their outputs exist), %s in %.2f s (%.3g shots/s over %d "
               "rank%s)\n", total[0], total[1], total[2] ? "STOPPED by a failure" : "all done", secs,
               secs > 0 ? total[0] / secs : 0.0, size, size > 1 ? "s" : "");
    }
    status = total[2] != 0 || failed;
    if (rank == 0 && status != 0 && total[0] == 0) {
        for (int k = 0; k < made.n; ++k) {
            remove(made.path[k]); /* a run that made nothing leaves no record behind */
        }
    }
done:
    free(img);
    nbg_shots_free(&shots);
    c.extra = NULL;
    nbgi_cli_free(&c);
    nbg_ctx_destroy(ctx);
    nbgi_mpi_end(mpi);
    return status;
}

/* --- the shot list generator (the library's nbg_shots_make) ------------------------------------------------- */

int nbgi_cmd_shots(int argc, char **argv, int first)
{
#ifndef NBG_HAVE_FORMATS
    (void)argc, (void)argv, (void)first;
    fprintf(stderr, "nbgrad: error: nbgrad shots writes JSON lines: this nbgrad was built without jansson "
                    "(FORMATS=0)\n");
    return 1;
#else
    shots_opts so = {.n = -1, .seed = 1};
    for (int i = first; i < argc; ++i) {
        const char *a = argv[i];
        if (strcmp(a, "-h") == 0 || strcmp(a, "--help") == 0) {
            printf("usage: nbgrad shots -n COUNT [-seed S] [-cell a b c alpha beta gamma -cell_jitter PCT] "
                   "[-N n -N_jitter PCT] [-scale_jitter PCT] -o FILE\n"
                   "writes a shot list (JSON lines) of COUNT shots in uniformly random orientations (as misset "
                   "angles), with the cell, N and scale drawn around the values given (Gaussian, PCT percent "
                   "rms) when a jitter is given; the same seed gives the same list\nits flags:\n");
            nbgi_sub_flags_doc(stdout, batch_flag_table, NBATCH_FLAGS, NBGI_CMD_SHOTS, 0);
            return 0;
        }
        const int used = nbgi_sub_flag_parse(batch_flag_table, NBATCH_FLAGS, NBGI_CMD_SHOTS, &so, argc, argv, i,
                                             NULL);
        if (used < 0) {
            return 1;
        }
        if (used == 0) {
            fprintf(stderr, "nbgrad: error: nbgrad shots: unknown flag '%s' (nbgrad shots -h)\n", a);
            return 1;
        }
        i += used - 1;
    }
    if (so.n < 1 || so.out == NULL) {
        fprintf(stderr, "nbgrad: error: nbgrad shots needs -n COUNT (1 to 1e8) and -o FILE\n");
        return 1;
    }
    nbg_shots_make_options mo;
    nbg_shots_make_options_default(&mo);
    mo.n = so.n;
    mo.seed = so.seed;
    mo.have_cell = so.have_cell;
    memcpy(mo.cell, so.cell, sizeof mo.cell);
    mo.cell_jitter = so.cell_jitter;
    mo.N = so.N;
    mo.N_jitter = so.N_jitter;
    mo.scale_jitter = so.scale_jitter;
    nbg_ctx *ctx = NULL;
    if (nbg_ctx_create(&ctx, NBG_BACKEND_CPU, NBG_DOUBLE, 1) != NBG_OK) {
        fprintf(stderr, "nbgrad: error: out of memory\n");
        return 1;
    }
    const int st = nbg_shots_make(ctx, &mo, so.out);
    if (st != NBG_OK) {
        fprintf(stderr, "nbgrad: error: %s\n", nbg_errmsg(ctx));
        nbg_ctx_destroy(ctx);
        return 1;
    }
    nbg_ctx_destroy(ctx);
    printf("wrote %s: %ld shots in uniformly random orientations (seed %ld)\n", so.out, so.n, so.seed);
    return 0;
#endif
}
