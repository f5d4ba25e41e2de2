/*
 * io.c -- file input and output: HKL text files, the nanoBragg Fdump cache, SMV images (write and read), PGM and
 * raw float images, nanoBragg source files and MOSFLM matrix files.
 *
 * Every writer goes through a temporary file in the target's directory that is renamed over the target only once
 * everything was written, so a failure never leaves a partial file behind.  Every reader validates what it reads
 * and reports the file (and line, where there are lines) of the first problem.
 */
#define _GNU_SOURCE /* renameat2 */
#include "io.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <unistd.h>

/* Miller indices beyond this magnitude are treated as a malformed file rather than a table to allocate. */
#define IO_MAX_INDEX 1000000L
/* An HKL table above IO_SPARSE_BYTES filled with fewer than one reflection per IO_SPARSE_RATIO entries is a file
 * with stray indices, not a structure: the sparsest asymmetric unit (cubic, 1/48 of a sphere in its cube) fills
 * about 1 %. */
#define IO_SPARSE_BYTES (256.0 * 1024 * 1024)
#define IO_SPARSE_RATIO 1000.0
/* The largest SMV header accepted, in bytes. */
#define IO_MAX_SMV_HEADER (1L << 20)
/* The largest SMV image side accepted, in pixels. */
#define IO_MAX_SMV_SIDE 1000000L

/* ---------------------------------------------------------------------------------------------------------- */
/* Small helpers                                                                                               */
/* ---------------------------------------------------------------------------------------------------------- */

static int host_is_little_endian(void)
{
    const uint16_t probe = 1;
    unsigned char first;
    memcpy(&first, &probe, 1);
    return first == 1;
}

/* Parses a whole token as a finite double.  Returns 0 on success, -1 when the token is not exactly one number. */
static int parse_double(const char *tok, double *out)
{
    char *end = NULL;
    errno = 0;
    double v = strtod(tok, &end);
    if (end == tok || *end != '\0' || !isfinite(v))
        return -1;
    *out = v;
    return 0;
}

/* Parses a whole token as an integer-valued number ("3", "-2", "3.0") of magnitude at most IO_MAX_INDEX. */
static int parse_index(const char *tok, int *out)
{
    double v;
    if (parse_double(tok, &v) != 0 || v != floor(v) || fabs(v) > (double)IO_MAX_INDEX)
        return -1;
    *out = (int)v;
    return 0;
}

int nbgi_open_input(nbg_ctx *ctx, const char *path, const char *what, const char *mode, FILE **fp)
{
    *fp = NULL;
    struct stat st;
    if (stat(path, &st) != 0)
        return nbgi_error(ctx, NBG_EIO, "cannot open %s %s: %s", what, path, strerror(errno));
    if (!S_ISREG(st.st_mode))
        return nbgi_error(ctx, NBG_EIO, "cannot read %s %s: not a regular file (%s)", what, path,
                          S_ISDIR(st.st_mode) ? "a directory" : S_ISCHR(st.st_mode) || S_ISBLK(st.st_mode) ? "a device"
                          : S_ISFIFO(st.st_mode) ? "a pipe" : "a special file");
    char label[300];
    snprintf(label, sizeof label, "%s %s (%lld bytes)", what, path, (long long)st.st_size);
    const int rc = nbgi_check_bytes(ctx, (double)st.st_size, label);
    if (rc != NBG_OK)
        return rc;
    *fp = fopen(path, mode);
    if (*fp == NULL)
        return nbgi_error(ctx, NBG_EIO, "cannot open %s %s: %s", what, path, strerror(errno));
    return NBG_OK;
}

int nbgi_read_whole(nbg_ctx *ctx, const char *path, const char *what, unsigned char **buf, size_t *len)
{
    *buf = NULL;
    *len = 0;
    FILE *fp;
    int rc = nbgi_open_input(ctx, path, what, "rb", &fp);
    if (rc != NBG_OK)
        return rc;
    struct stat st;
    if (fstat(fileno(fp), &st) != 0 || st.st_size < 0) {
        fclose(fp);
        return nbgi_error(ctx, NBG_EIO, "cannot read %s %s: %s", what, path, strerror(errno));
    }
    const size_t n = (size_t)st.st_size;
    unsigned char *b = malloc(n + 1);
    if (b == NULL) {
        fclose(fp);
        return nbgi_error(ctx, NBG_ENOMEM, "out of memory reading %s %s (%zu bytes)", what, path, n);
    }
    const size_t got = fread(b, 1, n, fp);
    const int err = ferror(fp) || fgetc(fp) != EOF;
    fclose(fp);
    if (got != n || err) {
        free(b);
        return nbgi_error(ctx, NBG_EIO, "cannot read %s %s: %s", what, path,
                          got != n ? "it ended early" : "it grew while being read");
    }
    *buf = b;
    *len = n;
    return NBG_OK;
}

int nbgi_read_line(nbg_ctx *ctx, FILE *fp, char **line, size_t *cap, const char *path, long lineno)
{
    const ssize_t len = getline(line, cap, fp);
    if (len < 0)
        return ferror(fp) ? nbgi_error(ctx, NBG_EIO, "error reading %s: %s", path, strerror(errno)) : 0;
    if (strlen(*line) != (size_t)len)
        return nbgi_error(ctx, NBG_EFORMAT, "%s:%ld: the line holds a NUL byte (a text file was expected)", path,
                          lineno);
    return 1;
}

/* Cuts a line at its first '#', so that everything from there on is a comment. */
static void strip_comment(char *line)
{
    char *hash = strchr(line, '#');
    if (hash != NULL)
        *hash = '\0';
}

/* Splits line in place at any of the delimiters; stores up to max token pointers and returns the number of tokens
 * found (which may exceed max; the extra ones are not stored). */
static int split_tokens(char *line, const char *delims, char **tok, int max)
{
    int n = 0;
    char *save = NULL;
    for (char *t = strtok_r(line, delims, &save); t != NULL; t = strtok_r(NULL, delims, &save)) {
        if (n < max)
            tok[n] = t;
        ++n;
    }
    return n;
}

/* ---------------------------------------------------------------------------------------------------------- */
/* Writing through a temporary file                                                                            */
/* ---------------------------------------------------------------------------------------------------------- */

/* Opens a temporary file next to the target.  The target is path itself, or, when path is a symbolic link, the
 * file the link resolves to (so that writing through a link is as atomic as writing a plain file; a dangling link
 * is refused).  When the target exists and is not a regular file (a device such as /dev/null, a FIFO) it is opened
 * directly, since renaming over it would not write through it. */
int nbgi_out_open(nbg_ctx *ctx, const char *path, nbgi_out *o)
{
    o->fp = NULL;
    o->tmp = NULL;
    o->target = NULL;
    o->path = path;
    if (path == NULL || path[0] == '\0')
        return nbgi_error(ctx, NBG_EINVAL, "output file name is empty");

    struct stat st;
    if (lstat(path, &st) == 0 && S_ISLNK(st.st_mode)) {
        o->target = realpath(path, NULL);
        if (o->target == NULL)
            return nbgi_error(ctx, NBG_EIO, "cannot write %s: it is a symbolic link to a missing file or directory "
                             "(%s)", path, strerror(errno));
    } else {
        o->target = strdup(path);
        if (o->target == NULL)
            return nbgi_error(ctx, NBG_ENOMEM, "out of memory writing %s", path);
    }
    if (stat(o->target, &st) == 0 && !S_ISREG(st.st_mode)) {
        if (S_ISDIR(st.st_mode)) {
            free(o->target);
            o->target = NULL;
            return nbgi_error(ctx, NBG_EIO, "cannot write %s: it is a directory", path);
        }
        o->fp = fopen(o->target, "wb");
        if (o->fp == NULL) {
            const int err = errno;
            free(o->target);
            o->target = NULL;
            return nbgi_error(ctx, NBG_EIO, "cannot open %s for writing: %s", path, strerror(err));
        }
        return NBG_OK;
    }

    size_t len = strlen(o->target) + 48;
    o->tmp = malloc(len);
    if (o->tmp == NULL) {
        free(o->target);
        o->target = NULL;
        return nbgi_error(ctx, NBG_ENOMEM, "out of memory writing %s", path);
    }
    int fd = -1;
    for (int attempt = 0; attempt < 1000 && fd < 0; ++attempt) {
        snprintf(o->tmp, len, "%s.tmp%ld.%d", o->target, (long)getpid(), attempt);
        fd = open(o->tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
        if (fd < 0 && errno != EEXIST)
            break;
    }
    if (fd < 0) {
        int err = errno;
        free(o->tmp);
        free(o->target);
        o->tmp = o->target = NULL;
        return nbgi_error(ctx, NBG_EIO, "cannot create a temporary file to write %s: %s", path, strerror(err));
    }
    o->fp = fdopen(fd, "wb");
    if (o->fp == NULL) {
        int err = errno;
        close(fd);
        unlink(o->tmp);
        free(o->tmp);
        free(o->target);
        o->tmp = o->target = NULL;
        return nbgi_error(ctx, NBG_EIO, "cannot write %s: %s", path, strerror(err));
    }
    return NBG_OK;
}

void nbgi_out_abort(nbgi_out *o)
{
    if (o->fp != NULL)
        fclose(o->fp);
    if (o->tmp != NULL) {
        unlink(o->tmp);
        free(o->tmp);
    }
    free(o->target);
    o->fp = NULL;
    o->tmp = o->target = NULL;
}

int nbgi_out_write(nbg_ctx *ctx, nbgi_out *o, const void *buf, size_t n)
{
    if (n > 0 && fwrite(buf, 1, n, o->fp) != n) {
        int err = errno;
        nbgi_out_abort(o);
        return nbgi_error(ctx, NBG_EIO, "cannot write %s: %s", o->path, strerror(err));
    }
    return NBG_OK;
}

int nbgi_out_open_path(nbg_ctx *ctx, const char *path, nbgi_out *o, const char **write_to)
{
    const int rc = nbgi_out_open(ctx, path, o);
    if (rc != NBG_OK)
        return rc;
    if (o->tmp == NULL) {
        /* not a regular file (/dev/null): the library writes the target itself */
        fclose(o->fp);
        o->fp = NULL;
        *write_to = o->target;
        return NBG_OK;
    }
    if (fclose(o->fp) != 0) {
        o->fp = NULL;
        const int err = errno;
        nbgi_out_abort(o);
        return nbgi_error(ctx, NBG_EIO, "cannot write %s: %s", path, strerror(err));
    }
    o->fp = NULL;
    *write_to = o->tmp;
    return NBG_OK;
}

/* Adds a finished temporary to a set (which then owns the names). */
static int outset_add(nbg_ctx *ctx, nbgi_outset *set, nbgi_out *o)
{
    if (set->n == set->cap) {
        const int cap = set->cap ? 2 * set->cap : 16;
        char **tmp = realloc(set->tmp, cap * sizeof *tmp);
        if (tmp != NULL)
            set->tmp = tmp;
        char **target = realloc(set->target, cap * sizeof *target);
        if (target != NULL)
            set->target = target;
        char **pth = realloc(set->path, cap * sizeof *pth);
        if (pth != NULL)
            set->path = pth;
        if (tmp == NULL || target == NULL || pth == NULL) {
            nbgi_out_abort(o);
            return nbgi_error(ctx, NBG_ENOMEM, "out of memory listing the outputs of a run");
        }
        set->cap = cap;
    }
    char *name = strdup(o->path);
    if (name == NULL) {
        nbgi_out_abort(o);
        return nbgi_error(ctx, NBG_ENOMEM, "out of memory listing the outputs of a run");
    }
    set->tmp[set->n] = o->tmp;
    set->target[set->n] = o->target;
    set->path[set->n] = name;
    ++set->n;
    o->tmp = o->target = NULL;
    return NBG_OK;
}

/* Puts the finished temporary file tmp in place of target, atomically (a reader of target sees the old file or the
 * new one, never a part).  Over an existing regular file: the two exchanged (renameat2's RENAME_EXCHANGE), then the
 * old one, now under tmp's name, removed.  A plain rename over it costs 3 to 13 ms for a 4 MB image on ext4, which
 * writes the new file's delayed blocks out within a rename that replaces a file (auto_da_alloc) and frees the old
 * one's pages there; the exchange and the removal cost under 1 ms.  What neither gives without an fsync (nbgrad
 * calls none, as the reference program) is the new contents on disk at a power failure.  No target, another kind
 * of file, or a file system without the exchange: rename.  0, or -1 with errno. */
static int replace_file(const char *tmp, const char *target)
{
#if defined(__linux__) && defined(RENAME_EXCHANGE)
    struct stat st;
    if (lstat(target, &st) == 0 && S_ISREG(st.st_mode) &&
        renameat2(AT_FDCWD, tmp, AT_FDCWD, target, RENAME_EXCHANGE) == 0) {
        if (unlink(tmp) == 0) {
            return 0;
        }
        /* what was exchanged is no longer a file we may remove (replaced in between): put it back */
        const int err = errno;
        if (renameat2(AT_FDCWD, tmp, AT_FDCWD, target, RENAME_EXCHANGE) != 0) {
            return -1;
        }
        errno = err;
        return -1;
    }
#endif
    return rename(tmp, target);
}

int nbgi_out_finish(nbg_ctx *ctx, nbgi_out *o, nbgi_outset *set)
{
    int bad = 0, err = 0;
    if (o->fp != NULL) {
        bad = fflush(o->fp) != 0 || ferror(o->fp);
        err = errno;
        if (fclose(o->fp) != 0 && !bad) {
            bad = 1;
            err = errno;
        }
        o->fp = NULL;
    }
    if (!bad && o->tmp != NULL && set != NULL)
        return outset_add(ctx, set, o);
    if (!bad && o->tmp != NULL && replace_file(o->tmp, o->target) != 0) {
        bad = 1;
        err = errno;
    }
    if (bad) {
        nbgi_out_abort(o);
        return nbgi_error(ctx, NBG_EIO, "cannot write %s: %s", o->path, strerror(err));
    }
    free(o->tmp);
    free(o->target);
    o->tmp = o->target = NULL;
    return NBG_OK;
}

void nbgi_outset_init(nbgi_outset *set) { memset(set, 0, sizeof *set); }

static void outset_release(nbgi_outset *set)
{
    free(set->tmp);
    free(set->target);
    free(set->path);
    memset(set, 0, sizeof *set);
}

void nbgi_outset_abort(nbgi_outset *set)
{
    for (int i = 0; i < set->n; ++i) {
        unlink(set->tmp[i]);
        free(set->tmp[i]);
        free(set->target[i]);
        free(set->path[i]);
    }
    outset_release(set);
}

int nbgi_outset_commit(nbg_ctx *ctx, nbgi_outset *set)
{
    int rc = NBG_OK;
    for (int i = 0; i < set->n; ++i) {
        if (rc == NBG_OK && replace_file(set->tmp[i], set->target[i]) != 0) {
            rc = nbgi_error(ctx, NBG_EIO, "cannot write %s: %s", set->path[i], strerror(errno));
        }
        if (rc != NBG_OK) {
            unlink(set->tmp[i]);
        }
        free(set->tmp[i]);
        free(set->target[i]);
        free(set->path[i]);
    }
    outset_release(set);
    return rc;
}

/* The writers below use these short names. */
typedef nbgi_out out_file;
#define out_open nbgi_out_open
#define out_write nbgi_out_write
#define out_abort nbgi_out_abort

/* ---------------------------------------------------------------------------------------------------------- */
/* Structure factors                                                                                           */
/* ---------------------------------------------------------------------------------------------------------- */

/* Checks that index bounds describe a table within the memory limit (nbg_limits; the Fdump's padded table is the
 * larger); stores its entry count.  A two-line HKL file with indices 0 and 1000 would otherwise allocate and fill
 * a 1001^3 table (8 GB). */
static int table_size(nbg_ctx *ctx, const char *path, const int lo[3], const int hi[3], size_t *count)
{
    double n = 1, padded = 1;
    for (int i = 0; i < 3; ++i) {
        const double r = (double)hi[i] - lo[i] + 1;
        if (r < 1 || lo[i] < -IO_MAX_INDEX || hi[i] > IO_MAX_INDEX)
            return nbgi_error(ctx, NBG_EFORMAT, "%s: invalid index range %d..%d", path, lo[i], hi[i]);
        n *= r;
        padded *= r + 1;
    }
    char what[PATH_MAX + 160];
    snprintf(what, sizeof what, "the structure-factor table of %s (h %d..%d, k %d..%d, l %d..%d: %.0f entries)", path,
             lo[0], hi[0], lo[1], hi[1], lo[2], hi[2], n);
    const int rc = nbgi_check_bytes(ctx, padded * sizeof(double), what);
    if (rc != NBG_OK)
        return rc;
    *count = (size_t)n;
    return NBG_OK;
}

/* Compares entries by index, then by their place in the input: equal indices in input order. */
static int entry_cmp(const void *a, const void *b)
{
    const nbgi_hkl_entry *x = *(const nbgi_hkl_entry *const *)a, *y = *(const nbgi_hkl_entry *const *)b;
    if (x->h != y->h)
        return x->h < y->h ? -1 : 1;
    if (x->k != y->k)
        return x->k < y->k ? -1 : 1;
    if (x->l != y->l)
        return x->l < y->l ? -1 : 1;
    return x < y ? -1 : x > y;
}

int nbgi_hkl_from_entries(nbg_ctx *ctx, const char *path, const nbgi_hkl_entry *ent, size_t nent, double default_F,
                          int average, nbg_hkl *out)
{
    memset(out, 0, sizeof *out);
    if (nent == 0)
        return nbgi_error(ctx, NBG_EFORMAT, "%s: no reflections found", path);
    int rc;
    int lo[3] = {ent[0].h, ent[0].k, ent[0].l}, hi[3] = {ent[0].h, ent[0].k, ent[0].l};
    for (size_t i = 1; i < nent; ++i) {
        const int v[3] = {ent[i].h, ent[i].k, ent[i].l};
        for (int a = 0; a < 3; ++a) {
            if (v[a] < lo[a])
                lo[a] = v[a];
            if (v[a] > hi[a])
                hi[a] = v[a];
        }
    }
    /* a dense table that a few stray reflections blow up: even an asymmetric unit fills a few percent of it */
    const double entries = ((double)hi[0] - lo[0] + 1) * ((double)hi[1] - lo[1] + 1) * ((double)hi[2] - lo[2] + 1);
    if (entries * sizeof(double) > IO_SPARSE_BYTES && (double)nent * IO_SPARSE_RATIO < entries) {
        size_t far = 0;
        for (size_t i = 1; i < nent; ++i) {
            if (labs((long)ent[i].h) + labs((long)ent[i].k) + labs((long)ent[i].l) >
                labs((long)ent[far].h) + labs((long)ent[far].k) + labs((long)ent[far].l))
                far = i;
        }
        return nbgi_error(ctx, NBG_EFORMAT, "%s: %zu reflections span h %d..%d, k %d..%d, l %d..%d, a table of %.3g "
                          "entries that would be almost all default_F (%.2g GB); the farthest reflection is %d %d %d, "
                          "reflection %zu of the file: check for a stray index", path, nent, lo[0], hi[0], lo[1],
                          hi[1], lo[2], hi[2], entries, entries * sizeof(double) / 1e9, ent[far].h, ent[far].k,
                          ent[far].l, far + 1);
    }
    size_t count = 0;
    rc = table_size(ctx, path, lo, hi, &count);
    if (rc != NBG_OK)
        return rc;
    double *F = malloc(count * sizeof *F);
    if (F == NULL)
        return nbgi_error(ctx, NBG_ENOMEM, "out of memory for the %zu-entry table of %s", count, path);
    for (size_t i = 0; i < count; ++i)
        F[i] = default_F;
    const size_t nk = (size_t)(hi[1] - lo[1] + 1), nl = (size_t)(hi[2] - lo[2] + 1);
#define HKL_AT(e) (((size_t)((e)->h - lo[0]) * nk + (size_t)((e)->k - lo[1])) * nl + (size_t)((e)->l - lo[2]))
    long distinct = (long)nent;
    if (!average) {
        /* Later entries overwrite earlier ones, so the last of duplicate reflections wins. */
        for (size_t i = 0; i < nent; ++i)
            F[HKL_AT(&ent[i])] = ent[i].F;
    } else {
        /* duplicates averaged, summed in the order they come in (sorted by index, ties in input order) */
        if ((rc = nbgi_check_bytes(ctx, (double)nent * sizeof(void *), "the reflections' order")) != NBG_OK) {
            free(F);
            return rc;
        }
        const nbgi_hkl_entry **order = malloc(nent * sizeof *order);
        if (order == NULL) {
            free(F);
            return nbgi_error(ctx, NBG_ENOMEM, "out of memory ordering the %zu reflections of %s", nent, path);
        }
        for (size_t i = 0; i < nent; ++i)
            order[i] = &ent[i];
        qsort(order, nent, sizeof *order, entry_cmp);
        distinct = 0;
        for (size_t i = 0; i < nent;) {
            size_t j = i;
            double sum = 0;
            while (j < nent && order[j]->h == order[i]->h && order[j]->k == order[i]->k && order[j]->l == order[i]->l)
                sum += order[j++]->F;
            F[HKL_AT(order[i])] = sum / (double)(j - i);
            ++distinct;
            i = j;
        }
        free(order);
    }
#undef HKL_AT
    out->h_min = lo[0];
    out->h_max = hi[0];
    out->k_min = lo[1];
    out->k_max = hi[1];
    out->l_min = lo[2];
    out->l_max = hi[2];
    out->F = F;
    out->nrefl = distinct;
    return NBG_OK;
}

static int hkl_read_text(nbg_ctx *ctx, const char *path, double default_F, nbg_hkl *out)
{

    FILE *fp;
    int rc = nbgi_open_input(ctx, path, "HKL file", "r", &fp);
    if (rc != NBG_OK)
        return rc;

    nbgi_hkl_entry *ent = NULL;
    size_t nent = 0, cap = 0;
    char *line = NULL;
    size_t linecap = 0;
    long lineno = 0;
    int got;

    while ((got = nbgi_read_line(ctx, fp, &line, &linecap, path, lineno + 1)) == 1) {
        ++lineno;
        strip_comment(line);
        char *tok[6];
        int nt = split_tokens(line, " \t\r\n\v\f", tok, 6);
        if (nt == 0)
            continue;
        if (nt < 4 || nt > 6) {
            rc = nbgi_error(ctx, NBG_EFORMAT, "%s:%ld: expected \"h k l F\" with at most two extra columns, found %d "
                           "field%s", path, lineno, nt, nt == 1 ? "" : "s");
            goto done;
        }
        nbgi_hkl_entry e;
        int *idx[3] = {&e.h, &e.k, &e.l};
        static const char axis[3] = {'h', 'k', 'l'};
        for (int i = 0; i < 3; ++i) {
            if (parse_index(tok[i], idx[i]) != 0) {
                rc = nbgi_error(ctx, NBG_EFORMAT, "%s:%ld: %c index \"%s\" is not an integer (or is beyond +-%ld)",
                               path, lineno, axis[i], tok[i], IO_MAX_INDEX);
                goto done;
            }
        }
        if (parse_double(tok[3], &e.F) != 0) {
            rc = nbgi_error(ctx, NBG_EFORMAT, "%s:%ld: F \"%s\" is not a finite number", path, lineno, tok[3]);
            goto done;
        }
        if (nent == cap) {
            size_t ncap = cap ? 2 * cap : 1024;
            nbgi_hkl_entry *grown = realloc(ent, ncap * sizeof *grown);
            if (grown == NULL) {
                rc = nbgi_error(ctx, NBG_ENOMEM, "out of memory reading %s", path);
                goto done;
            }
            ent = grown;
            cap = ncap;
        }
        ent[nent++] = e;
    }
    if (got < 0) {
        rc = got;
        goto done;
    }
    if (nent == 0) {
        rc = nbgi_error(ctx, NBG_EFORMAT, "%s: no reflections found", path);
        goto done;
    }

    rc = nbgi_hkl_from_entries(ctx, path, ent, nent, default_F, 0, out);

done:
    free(line);
    free(ent);
    fclose(fp);
    return rc;
}

/* The format of a structure-factor file by its first bytes: 'M' an MTZ file ("MTZ "), 'R' a DIALS reflection table
 * (msgpack ["dials::af::reflection_table", ...]), 'T' text (HKL lines). */
static int hkl_format(nbg_ctx *ctx, const char *path, char *fmt)
{
    FILE *fp;
    int rc = nbgi_open_input(ctx, path, "HKL file", "rb", &fp);
    if (rc != NBG_OK)
        return rc;
    unsigned char head[32];
    const size_t got = fread(head, 1, sizeof head, fp);
    fclose(fp);
    static const char dials[] = "dials::af::reflection_table";
    if (got >= 4 && memcmp(head, "MTZ ", 4) == 0)
        *fmt = 'M';
    else if (got >= 2 + sizeof dials - 1 && head[0] == 0x93 && memcmp(head + 2, dials, sizeof dials - 1) == 0)
        *fmt = 'R';
    else
        *fmt = 'T';
    return NBG_OK;
}

int nbg_hkl_read_column(nbg_ctx *ctx, const char *path, const char *column, double default_F, nbg_hkl *out,
                        char *what, size_t nwhat)
{
    if (what != NULL && nwhat > 0)
        what[0] = '\0';
    if (out == NULL || path == NULL)
        return nbgi_error(ctx, NBG_EINVAL, "nbg_hkl_read: NULL argument");
    memset(out, 0, sizeof *out);
    if (!isfinite(default_F))
        return nbgi_error(ctx, NBG_EINVAL, "reading %s: default_F is not finite", path);
    char fmt = 'T';
    int rc = hkl_format(ctx, path, &fmt);
    if (rc != NBG_OK)
        return rc;
    if (fmt == 'M')
        return nbgi_read_mtz(ctx, path, column, default_F, out, what, nwhat);
    if (column != NULL && column[0] != '\0')
        return nbgi_error(ctx, NBG_EINVAL, "%s is %s, which has no columns to choose (-hkl_column \"%.64s\" is for MTZ "
                          "files)", path, fmt == 'R' ? "a DIALS reflection table" : "an HKL text file", column);
    if (fmt == 'R')
        return nbgi_refl_hkl(ctx, path, default_F, out, what, nwhat);
    rc = hkl_read_text(ctx, path, default_F, out);
    if (rc == NBG_OK && what != NULL && nwhat > 0)
        snprintf(what, nwhat, "%ld reflections (h k l F lines)", out->nrefl);
    return rc;
}

int nbg_hkl_read(nbg_ctx *ctx, const char *path, double default_F, nbg_hkl *out)
{
    return nbg_hkl_read_column(ctx, path, NULL, default_F, out, NULL, 0);
}

void nbg_hkl_free(nbg_hkl *hkl)
{
    if (hkl == NULL)
        return;
    free(hkl->F);
    hkl->F = NULL;
}

/* The Fdump layout (shared with the reference): a text line "h_min h_max k_min k_max l_min l_max\n", a form feed,
 * then native doubles over (nh+1) x (nk+1) x (nl+1) with l fastest.  The extra slot on each axis is padding that
 * the reference allocates and writes; it holds 0 here. */
int nbg_hkl_write_fdump(nbg_ctx *ctx, const char *path, const nbg_hkl *hkl)
{
    return nbgi_hkl_write_fdump_set(ctx, NULL, path, hkl);
}

int nbgi_hkl_write_fdump_set(nbg_ctx *ctx, nbgi_outset *set, const char *path, const nbg_hkl *hkl)
{
    if (hkl == NULL || hkl->F == NULL || path == NULL)
        return nbgi_error(ctx, NBG_EINVAL, "nbg_hkl_write_fdump: NULL argument");
    const int lo[3] = {hkl->h_min, hkl->k_min, hkl->l_min}, hi[3] = {hkl->h_max, hkl->k_max, hkl->l_max};
    size_t count = 0;
    int rc = table_size(ctx, path, lo, hi, &count);
    if (rc != NBG_OK)
        return nbgi_error(ctx, NBG_EINVAL, "cannot write %s: the table's index ranges are invalid", path);
    const size_t nh = (size_t)(hi[0] - lo[0] + 1), nk = (size_t)(hi[1] - lo[1] + 1), nl = (size_t)(hi[2] - lo[2] + 1);

    double *row = malloc((nl + 1) * sizeof *row);
    if (row == NULL)
        return nbgi_error(ctx, NBG_ENOMEM, "out of memory writing %s", path);
    out_file o;
    rc = out_open(ctx, path, &o);
    if (rc != NBG_OK) {
        free(row);
        return rc;
    }
    char head[128];
    int hl = snprintf(head, sizeof head, "%d %d %d %d %d %d\n\f", lo[0], hi[0], lo[1], hi[1], lo[2], hi[2]);
    rc = out_write(ctx, &o, head, (size_t)hl);
    for (size_t h = 0; h <= nh && rc == NBG_OK; ++h) {
        for (size_t k = 0; k <= nk && rc == NBG_OK; ++k) {
            if (h < nh && k < nk)
                memcpy(row, hkl->F + (h * nk + k) * nl, nl * sizeof *row);
            else
                memset(row, 0, nl * sizeof *row);
            row[nl] = 0.0;
            rc = out_write(ctx, &o, row, (nl + 1) * sizeof *row);
        }
    }
    free(row);
    if (rc != NBG_OK)
        return rc; /* out_write already abandoned the file. */
    return nbgi_out_finish(ctx, &o, set);
}

int nbg_hkl_read_fdump(nbg_ctx *ctx, const char *path, nbg_hkl *out)
{
    if (out == NULL || path == NULL)
        return nbgi_error(ctx, NBG_EINVAL, "nbg_hkl_read_fdump: NULL argument");
    memset(out, 0, sizeof *out);

    FILE *fp;
    const int orc = nbgi_open_input(ctx, path, "Fdump file", "rb", &fp);
    if (orc != NBG_OK)
        return orc;

    /* The header line, then exactly one form feed. */
    char head[256];
    size_t hl = 0;
    int c;
    while ((c = fgetc(fp)) != EOF && c != '\n' && hl + 1 < sizeof head)
        head[hl++] = (char)c;
    head[hl] = '\0';
    int lo[3], hi[3];
    char extra;
    if (c != '\n' || sscanf(head, "%d %d %d %d %d %d %c", &lo[0], &hi[0], &lo[1], &hi[1], &lo[2], &hi[2], &extra) != 6
        || fgetc(fp) != '\f') {
        fclose(fp);
        return nbgi_error(ctx, NBG_EFORMAT, "%s: not an Fdump file (expected a line of six index bounds followed by "
                         "a form feed)", path);
    }
    size_t count = 0;
    int rc = table_size(ctx, path, lo, hi, &count);
    if (rc != NBG_OK) {
        fclose(fp);
        return rc;
    }
    const size_t nh = (size_t)(hi[0] - lo[0] + 1), nk = (size_t)(hi[1] - lo[1] + 1), nl = (size_t)(hi[2] - lo[2] + 1);
    const size_t expected = (nh + 1) * (nk + 1) * (nl + 1) * sizeof(double);
    /* the file's size must match its header before the header's table is allocated */
    struct stat st;
    const long here = ftell(fp);
    if (fstat(fileno(fp), &st) == 0 && S_ISREG(st.st_mode) && here >= 0 &&
        (unsigned long long)st.st_size != (unsigned long long)here + expected) {
        fclose(fp);
        return nbgi_error(ctx, NBG_EFORMAT, "%s: wrong Fdump size: its header (h %d..%d, k %d..%d, l %d..%d) needs %zu "
                         "bytes of data, the file has %lld", path, lo[0], hi[0], lo[1], hi[1], lo[2], hi[2], expected,
                         (long long)st.st_size - here);
    }

    double *F = malloc(count * sizeof *F);
    double *row = malloc((nl + 1) * sizeof *row);
    if (F == NULL || row == NULL) {
        free(F);
        free(row);
        fclose(fp);
        return nbgi_error(ctx, NBG_ENOMEM, "out of memory for the %zu-entry table of %s", count, path);
    }
    size_t got = 0;
    for (size_t h = 0; h <= nh && rc == NBG_OK; ++h) {
        for (size_t k = 0; k <= nk && rc == NBG_OK; ++k) {
            size_t n = fread(row, sizeof *row, nl + 1, fp);
            got += n * sizeof *row;
            if (n != nl + 1) {
                if (ferror(fp))
                    rc = nbgi_error(ctx, NBG_EIO, "error reading %s: %s", path, strerror(errno));
                else
                    rc = nbgi_error(ctx, NBG_EFORMAT, "%s: truncated Fdump: expected %zu bytes of data after the "
                                   "header, found %zu", path, expected, got);
            } else if (h < nh && k < nk) {
                memcpy(F + (h * nk + k) * nl, row, nl * sizeof *row);
            }
        }
    }
    if (rc == NBG_OK && fgetc(fp) != EOF)
        rc = nbgi_error(ctx, NBG_EFORMAT, "%s: Fdump has data beyond the expected %zu bytes after the header", path,
                       expected);
    free(row);
    fclose(fp);
    if (rc != NBG_OK) {
        free(F);
        return rc;
    }
    out->h_min = lo[0];
    out->h_max = hi[0];
    out->k_min = lo[1];
    out->k_max = hi[1];
    out->l_min = lo[2];
    out->l_max = hi[2];
    out->F = F;
    out->nrefl = (long)count; /* The reference sets h_range * k_range * l_range after reading a dump. */
    return NBG_OK;
}

/* ---------------------------------------------------------------------------------------------------------- */
/* SMV                                                                                                        */
/* ---------------------------------------------------------------------------------------------------------- */

void nbg_smv_header_from_report(const nbg_report *r, nbg_smv_header *h)
{
    if (r == NULL || h == NULL)
        return;
    h->fpixels = r->fpixels;
    h->spixels = r->spixels;
    h->pixel = r->pixel;
    h->distance = r->distance;
    h->close_distance = r->close_distance;
    h->lambda = r->lambda;
    h->Xbeam = r->Xbeam;
    h->Ybeam = r->Ybeam;
    h->Fbeam = r->Fbeam;
    h->Sbeam = r->Sbeam;
    h->detsize_s = r->detsize_s;
    for (int i = 0; i < 3; ++i)
        h->dials_origin[i] = r->dials_origin[i];
    h->ORGX = r->ORGX;
    h->ORGY = r->ORGY;
    h->phi0 = r->phi0;
    h->osc = r->osc;
    h->twotheta = r->twotheta;
    h->has_adc_offset = 0;
    h->adc_offset = 0;
}

/* Checks image dimensions and returns the pixel count through *npix. */
static int image_size(nbg_ctx *ctx, const char *path, int fpixels, int spixels, size_t elem, size_t *npix)
{
    if (fpixels <= 0 || spixels <= 0)
        return nbgi_error(ctx, NBG_EINVAL, "cannot write %s: image size %d x %d is not positive", path, fpixels,
                         spixels);
    if ((size_t)fpixels > SIZE_MAX / elem / (size_t)spixels)
        return nbgi_error(ctx, NBG_EINVAL, "cannot write %s: image size %d x %d is too large", path, fpixels, spixels);
    *npix = (size_t)fpixels * (size_t)spixels;
    return NBG_OK;
}

int nbg_write_smv(nbg_ctx *ctx, const char *path, const nbg_smv_header *h, const uint16_t *data)
{
    return nbgi_write_smv_set(ctx, NULL, path, h, data);
}

int nbgi_write_smv_set(nbg_ctx *ctx, nbgi_outset *set, const char *path, const nbg_smv_header *h, const uint16_t *data)
{
    if (path == NULL || h == NULL || data == NULL)
        return nbgi_error(ctx, NBG_EINVAL, "nbg_write_smv: NULL argument");
    size_t npix = 0;
    int rc = image_size(ctx, path, h->fpixels, h->spixels, sizeof *data, &npix);
    if (rc != NBG_OK)
        return rc;

    /* The header text, in the reference's order and %g formatting.  DIALS_ORIGIN has no ';' there either.  The
     * pedestal key is nbgrad's addition, written only when asked for. */
    char adc[64] = "";
    if (h->has_adc_offset && !isfinite(h->adc_offset))
        return nbgi_error(ctx, NBG_EINVAL, "cannot write %s: the ADC offset %g is not finite", path, h->adc_offset);
    if (h->has_adc_offset)
        snprintf(adc, sizeof adc, "ADC_OFFSET=%g;\n", h->adc_offset);
    char text[2048];
    /* 512 bytes as nanoBragg's; a header that the ADC_OFFSET key makes longer takes 1024 */
    int hbytes = 512, len = 0;
again:
    len = snprintf(text, sizeof text,
        "{\nHEADER_BYTES=%d;\nDIM=2;\nBYTE_ORDER=%s;\nTYPE=unsigned_short;\n"
        "SIZE1=%d;\nSIZE2=%d;\nPIXEL_SIZE=%g;\nDISTANCE=%g;\n"
        "WAVELENGTH=%g;\n"
        "BEAM_CENTER_X=%g;\nBEAM_CENTER_Y=%g;\n"
        "ADXV_CENTER_X=%g;\nADXV_CENTER_Y=%g;\n"
        "MOSFLM_CENTER_X=%g;\nMOSFLM_CENTER_Y=%g;\n"
        "DENZO_X_BEAM=%g;\nDENZO_Y_BEAM=%g;\n"
        "DIALS_ORIGIN=%g,%g,%g\n"
        "XDS_ORGX=%g;\nXDS_ORGY=%g;\n"
        "CLOSE_DISTANCE=%g;\n"
        "PHI=%g;\nOSC_START=%g;\nOSC_RANGE=%g;\n"
        "TWOTHETA=%g;\n"
        "%s"
        "DETECTOR_SN=000;\nBEAMLINE=fake;\n}\f",
        hbytes, host_is_little_endian() ? "little_endian" : "big_endian",
        h->fpixels, h->spixels, h->pixel, h->distance,
        h->lambda,
        h->Xbeam, h->Ybeam,
        h->Fbeam, h->detsize_s - h->Sbeam,
        h->Sbeam - 0.5 * h->pixel, h->Fbeam - 0.5 * h->pixel,
        h->Sbeam, h->Fbeam,
        h->dials_origin[0], h->dials_origin[1], h->dials_origin[2],
        h->ORGX, h->ORGY,
        h->close_distance,
        h->phi0, h->phi0, h->osc,
        h->twotheta, adc);
    if (len > 512 && hbytes == 512 && h->has_adc_offset) {
        hbytes = 1024;
        goto again;
    }
    if (len < 0 || len > hbytes)
        return nbgi_error(ctx, NBG_EINVAL, "cannot write %s: the SMV header text (%d bytes) does not fit in %d bytes",
                         path, len, hbytes);
    char header[1024];
    memcpy(header, text, (size_t)len);
    memset(header + len, ' ', (size_t)hbytes - (size_t)len);

    out_file o;
    rc = out_open(ctx, path, &o);
    if (rc != NBG_OK)
        return rc;
    rc = out_write(ctx, &o, header, (size_t)hbytes);
    if (rc == NBG_OK)
        rc = out_write(ctx, &o, data, npix * sizeof *data);
    if (rc != NBG_OK)
        return rc;
    return nbgi_out_finish(ctx, &o, set);
}

/* Finds the value of the last statement "KEY=value" in an SMV header whose key is exactly one of names.  A key
 * starts the header, a line or a ';'-separated statement (after optional blanks); scanning stops at '}'.
 *
 * Deliberate fix: the reference searches for the last occurrence of the key as a substring, so DISTANCE picks up
 * CLOSE_DISTANCE when that comes later (and ORGX matches XDS_ORGX); here keys must match whole. */
static const char *smv_find(const char *hdr, const char *const *names, int nnames)
{
    const char *found = NULL;
    const char *p = hdr;
    while (*p != '\0' && *p != '}') {
        while (*p == ' ' || *p == '\t' || *p == '\r')
            ++p;
        const char *key = p;
        while (*p != '\0' && *p != '}' && *p != '=' && *p != ';' && *p != '\n' && *p != '{' && *p != ' ' && *p != '\t')
            ++p;
        size_t klen = (size_t)(p - key);
        while (*p == ' ' || *p == '\t')
            ++p;
        if (*p == '=' && klen > 0) {
            for (int i = 0; i < nnames; ++i) {
                if (strlen(names[i]) == klen && memcmp(key, names[i], klen) == 0)
                    found = p + 1;
            }
        }
        /* Skip to the next statement. */
        while (*p != '\0' && *p != '}' && *p != ';' && *p != '\n' && *p != '{')
            ++p;
        if (*p == ';' || *p == '\n' || *p == '{')
            ++p;
    }
    return found;
}

/* Reads a numeric header value: NAN when the key is absent, NBG_EFORMAT when its value is not a number. */
static int smv_number(nbg_ctx *ctx, const char *path, const char *hdr, const char *const *names, int nnames,
                      double *out)
{
    const char *v = smv_find(hdr, names, nnames);
    *out = NAN;
    if (v == NULL)
        return NBG_OK;
    char *end = NULL;
    double x = strtod(v, &end);
    if (end == v || !isfinite(x)) {
        int n = 0;
        while (n < 20 && v[n] != '\0' && v[n] != ';' && v[n] != '\n')
            ++n;
        return nbgi_error(ctx, NBG_EFORMAT, "%s: SMV header key %s has a value that is not a finite number \"%.*s\"",
                         path, names[0], n, v);
    }
    *out = x;
    return NBG_OK;
}

/* Reads a word-valued header key (BYTE_ORDER, TYPE) into buf; an empty string when absent. */
static void smv_word(const char *hdr, const char *name, char *buf, size_t size)
{
    const char *const names[1] = {name};
    const char *v = smv_find(hdr, names, 1);
    size_t n = 0;
    if (v != NULL) {
        while (*v == ' ' || *v == '\t')
            ++v;
        while (v[n] != '\0' && v[n] != ';' && v[n] != '\n' && v[n] != '}' && v[n] != ' ' && v[n] != '\t'
               && v[n] != '\r' && n + 1 < size)
            ++n;
        memcpy(buf, v, n);
    }
    buf[n] = '\0';
}

/* Reads an image side (SIZE1, SIZE2, DETECTOR_DIMENSIONS): 0 when absent, NBG_EFORMAT when not a plausible
 * positive integer. */
static int smv_side(nbg_ctx *ctx, const char *path, const char *hdr, const char *name, int *out)
{
    const char *const names[1] = {name};
    double v;
    int rc = smv_number(ctx, path, hdr, names, 1, &v);
    *out = 0;
    if (rc != NBG_OK)
        return rc;
    if (isnan(v))
        return NBG_OK;
    if (!(v >= 1.0 && v <= (double)IO_MAX_SMV_SIDE) || v != floor(v))
        return nbgi_error(ctx, NBG_EFORMAT, "%s: SMV header %s=%g is not a valid image size", path, name, v);
    *out = (int)v;
    return NBG_OK;
}

static void smv_header_unset(nbg_smv_header *h)
{
    h->fpixels = h->spixels = 0;
    h->pixel = h->distance = h->close_distance = h->lambda = NAN;
    h->Xbeam = h->Ybeam = h->Fbeam = h->Sbeam = h->detsize_s = NAN;
    h->dials_origin[0] = h->dials_origin[1] = h->dials_origin[2] = NAN;
    h->ORGX = h->ORGY = h->phi0 = h->osc = h->twotheta = NAN;
    h->has_adc_offset = 0;
    h->adc_offset = NAN;
    h->beamline[0] = '\0';
}

/* Parses the header keys into h and checks byte order and pixel type; *swap says whether the data need swapping. */
static int smv_parse(nbg_ctx *ctx, const char *path, const char *hdr, nbg_smv_header *h, int *swap)
{
    int rc = smv_side(ctx, path, hdr, "SIZE1", &h->fpixels);
    if (rc == NBG_OK)
        rc = smv_side(ctx, path, hdr, "SIZE2", &h->spixels);
    if (rc == NBG_OK && h->fpixels == 0) {
        /* Some SMV writers give only a square DETECTOR_DIMENSIONS, which the reference also accepts. */
        rc = smv_side(ctx, path, hdr, "DETECTOR_DIMENSIONS", &h->fpixels);
        h->spixels = h->fpixels;
    }
    if (rc != NBG_OK)
        return rc;

    static const char *const k_pixel[] = {"PIXEL_SIZE"}, *const k_dist[] = {"DISTANCE"},
                             *const k_close[] = {"CLOSE_DISTANCE"}, *const k_lambda[] = {"WAVELENGTH"},
                             *const k_bx[] = {"BEAM_CENTER_X"}, *const k_by[] = {"BEAM_CENTER_Y"},
                             *const k_orgx[] = {"ORGX", "XDS_ORGX"}, *const k_orgy[] = {"ORGY", "XDS_ORGY"},
                             *const k_phi[] = {"PHI"}, *const k_osc[] = {"OSC_RANGE"}, *const k_tt[] = {"TWOTHETA"},
                             *const k_adc[] = {"ADC_OFFSET"};
    struct {
        const char *const *names;
        int n;
        double *dst;
    } keys[] = {
        {k_pixel, 1, &h->pixel},   {k_dist, 1, &h->distance}, {k_close, 1, &h->close_distance},
        {k_lambda, 1, &h->lambda}, {k_bx, 1, &h->Xbeam},      {k_by, 1, &h->Ybeam},
        {k_orgx, 2, &h->ORGX},     {k_orgy, 2, &h->ORGY},     {k_phi, 1, &h->phi0},
        {k_osc, 1, &h->osc},       {k_tt, 1, &h->twotheta},   {k_adc, 1, &h->adc_offset},
    };
    for (size_t i = 0; i < sizeof keys / sizeof keys[0]; ++i) {
        rc = smv_number(ctx, path, hdr, keys[i].names, keys[i].n, keys[i].dst);
        if (rc != NBG_OK)
            return rc;
    }

    if (isnan(h->phi0)) { /* the start angle: PHI, else OSC_START (nanoBragg writes both, the same) */
        static const char *const k_start[] = {"OSC_START"};
        if ((rc = smv_number(ctx, path, hdr, k_start, 1, &h->phi0)) != NBG_OK)
            return rc;
    }
    h->has_adc_offset = !isnan(h->adc_offset);
    smv_word(hdr, "BEAMLINE", h->beamline, sizeof h->beamline);
    char word[64];
    smv_word(hdr, "TYPE", word, sizeof word);
    if (word[0] != '\0' && strcmp(word, "unsigned_short") != 0)
        return nbgi_error(ctx, NBG_EUNSUP, "%s: SMV pixel type %s is not supported (only unsigned_short)", path, word);
    smv_word(hdr, "BYTE_ORDER", word, sizeof word);
    int little = host_is_little_endian();
    if (word[0] == '\0')
        *swap = 0;
    else if (strcmp(word, "little_endian") == 0)
        *swap = !little;
    else if (strcmp(word, "big_endian") == 0)
        *swap = little;
    else
        return nbgi_error(ctx, NBG_EFORMAT, "%s: unknown SMV BYTE_ORDER \"%s\"", path, word);
    return NBG_OK;
}

int nbg_read_smv(nbg_ctx *ctx, const char *path, nbg_smv_header *h, uint16_t **data)
{
    if (data != NULL)
        *data = NULL;
    if (path == NULL || h == NULL)
        return nbgi_error(ctx, NBG_EINVAL, "nbg_read_smv: NULL argument");
    smv_header_unset(h);

    FILE *fp;
    int rc = nbgi_open_input(ctx, path, "SMV file", "rb", &fp);
    if (rc != NBG_OK)
        return rc;
    uint16_t *pix = NULL;
    char *hdr = malloc(513);
    if (hdr == NULL) {
        rc = nbgi_error(ctx, NBG_ENOMEM, "out of memory reading %s", path);
        goto done;
    }
    size_t got = fread(hdr, 1, 512, fp);
    hdr[got] = '\0';
    if (got < 12 || memcmp(hdr, "{\nHEADER_BYT", 12) != 0) {
        rc = nbgi_error(ctx, NBG_EFORMAT, "%s: not an SMV file (it does not start with \"{\\nHEADER_BYTES\")", path);
        goto done;
    }
    static const char *const k_bytes[] = {"HEADER_BYTES"};
    double hb;
    rc = smv_number(ctx, path, hdr, k_bytes, 1, &hb);
    if (rc != NBG_OK)
        goto done;
    if (!(hb >= 16.0 && hb <= (double)IO_MAX_SMV_HEADER) || hb != floor(hb)) {
        rc = nbgi_error(ctx, NBG_EFORMAT, "%s: SMV HEADER_BYTES=%g is not a valid header size", path, hb);
        goto done;
    }
    const size_t header_bytes = (size_t)hb;
    if (header_bytes > got) {
        char *bigger = realloc(hdr, header_bytes + 1);
        if (bigger == NULL) {
            rc = nbgi_error(ctx, NBG_ENOMEM, "out of memory reading %s", path);
            goto done;
        }
        hdr = bigger;
        got += fread(hdr + got, 1, header_bytes - got, fp);
        if (got < header_bytes) {
            rc = nbgi_error(ctx, NBG_EFORMAT, "%s: truncated SMV file: the header is %zu bytes, the file has only %zu",
                           path, header_bytes, got);
            goto done;
        }
    }
    /* Only the declared header is header text; what follows it is pixel data. */
    hdr[header_bytes] = '\0';

    int swap = 0;
    rc = smv_parse(ctx, path, hdr, h, &swap);
    if (rc != NBG_OK)
        goto done;
    if (h->fpixels == 0 || h->spixels == 0) {
        if (data != NULL)
            rc = nbgi_error(ctx, NBG_EFORMAT, "%s: SMV header has no SIZE1/SIZE2, so the image size is unknown", path);
        goto done;
    }

    const size_t npix = (size_t)h->fpixels * (size_t)h->spixels;
    const long long expected = (long long)header_bytes + 2LL * (long long)npix;
    struct stat st;
    if (fstat(fileno(fp), &st) == 0 && S_ISREG(st.st_mode) && (long long)st.st_size != expected) {
        rc = nbgi_error(ctx, NBG_EFORMAT, "%s: wrong SMV file size: expected %lld bytes (%zu-byte header + %d x %d "
                       "16-bit pixels), found %lld", path, expected, header_bytes, h->fpixels, h->spixels,
                       (long long)st.st_size);
        goto done;
    }
    if (data == NULL)
        goto done;
    {
        char what[PATH_MAX + 64];
        snprintf(what, sizeof what, "the %d x %d image of %s", h->fpixels, h->spixels, path);
        rc = nbgi_check_bytes(ctx, (double)npix * sizeof *pix, what);
        if (rc != NBG_OK)
            goto done;
    }
    pix = malloc(npix * sizeof *pix);
    if (pix == NULL) {
        rc = nbgi_error(ctx, NBG_ENOMEM, "out of memory for the %d x %d image of %s", h->fpixels, h->spixels, path);
        goto done;
    }
    if (fseek(fp, (long)header_bytes, SEEK_SET) != 0) {
        rc = nbgi_error(ctx, NBG_EIO, "cannot seek in %s: %s", path, strerror(errno));
        goto done;
    }
    size_t n = fread(pix, sizeof *pix, npix, fp);
    if (n != npix) {
        if (ferror(fp))
            rc = nbgi_error(ctx, NBG_EIO, "error reading %s: %s", path, strerror(errno));
        else
            rc = nbgi_error(ctx, NBG_EFORMAT, "%s: truncated SMV file: expected %lld bytes, found %lld", path, expected,
                           (long long)header_bytes + 2LL * (long long)n);
        goto done;
    }
    if (swap) {
        for (size_t i = 0; i < npix; ++i)
            pix[i] = (uint16_t)((pix[i] >> 8) | (pix[i] << 8));
    }
    *data = pix;
    pix = NULL;

done:
    free(pix);
    free(hdr);
    fclose(fp);
    if (rc != NBG_OK)
        smv_header_unset(h);
    return rc;
}

/* ---------------------------------------------------------------------------------------------------------- */
/* PGM and float images                                                                                        */
/* ---------------------------------------------------------------------------------------------------------- */

int nbg_write_pgm(nbg_ctx *ctx, const char *path, const float *image, int fpixels, int spixels, double scale)
{
    return nbgi_write_pgm_set(ctx, NULL, path, image, fpixels, spixels, scale);
}

int nbgi_write_pgm_set(nbg_ctx *ctx, nbgi_outset *set, const char *path, const float *image, int fpixels, int spixels,
                      double scale)
{
    if (path == NULL || image == NULL)
        return nbgi_error(ctx, NBG_EINVAL, "nbg_write_pgm: NULL argument");
    size_t npix = 0;
    int rc = image_size(ctx, path, fpixels, spixels, 1, &npix);
    if (rc != NBG_OK)
        return rc;
    unsigned char *bytes = malloc(npix);
    if (bytes == NULL)
        return nbgi_error(ctx, NBG_ENOMEM, "out of memory writing %s", path);
    for (size_t i = 0; i < npix; ++i) {
        double v = (double)image[i] * scale;
        /* Truncation as in the reference; negative and NaN values become 0, which the reference leaves undefined. */
        bytes[i] = v > 255.0 ? 255 : (v > 0.0 ? (unsigned char)v : 0);
    }
    char head[128];
    int hl = snprintf(head, sizeof head, "P5\n%d %d\n# pixels scaled by %g\n255\n", fpixels, spixels, scale);
    out_file o;
    rc = out_open(ctx, path, &o);
    if (rc == NBG_OK)
        rc = out_write(ctx, &o, head, (size_t)hl);
    if (rc == NBG_OK)
        rc = out_write(ctx, &o, bytes, npix);
    if (rc == NBG_OK)
        rc = nbgi_out_finish(ctx, &o, set);
    free(bytes);
    return rc;
}

int nbg_write_float(nbg_ctx *ctx, const char *path, const float *image, size_t npix)
{
    return nbgi_write_float_set(ctx, NULL, path, image, npix);
}

int nbgi_write_float_set(nbg_ctx *ctx, nbgi_outset *set, const char *path, const float *image, size_t npix)
{
    if (path == NULL || (image == NULL && npix > 0))
        return nbgi_error(ctx, NBG_EINVAL, "nbg_write_float: NULL argument");
    if (npix > SIZE_MAX / sizeof *image)
        return nbgi_error(ctx, NBG_EINVAL, "cannot write %s: %zu pixels is too many", path, npix);
    out_file o;
    int rc = out_open(ctx, path, &o);
    if (rc == NBG_OK)
        rc = out_write(ctx, &o, image, npix * sizeof *image);
    if (rc == NBG_OK)
        rc = nbgi_out_finish(ctx, &o, set);
    return rc;
}

/* ---------------------------------------------------------------------------------------------------------- */
/* Source and matrix files                                                                                     */
/* ---------------------------------------------------------------------------------------------------------- */

int nbgi_read_sources(nbg_ctx *ctx, const char *path, double lambda0_A, double beam[3], nbg_source **out, int *n)
{
    if (out != NULL)
        *out = NULL;
    if (n != NULL)
        *n = 0;
    if (path == NULL || beam == NULL || out == NULL || n == NULL)
        return nbgi_error(ctx, NBG_EINVAL, "nbgi_read_sources: NULL argument");

    FILE *fp;
    int rc = nbgi_open_input(ctx, path, "source file", "r", &fp);
    if (rc != NBG_OK)
        return rc;

    static const char *const field[5] = {"X", "Y", "Z", "weight", "lambda"};
    /* The reference places a default source 10 m up-beam of the sample. */
    const double source_distance = 10.0;
    nbg_source *src = NULL;
    size_t nsrc = 0, cap = 0;
    char *line = NULL;
    size_t linecap = 0;
    long lineno = 0;
    int got;

    while ((got = nbgi_read_line(ctx, fp, &line, &linecap, path, lineno + 1)) == 1) {
        ++lineno;
        strip_comment(line);
        char *tok[5];
        int nt = split_tokens(line, " \t,;:!\r\n\v\f", tok, 5);
        if (nt == 0)
            continue;
        if (nt > 5)
            nt = 5; /* Extra fields are ignored, as the reference does. */
        double v[5];
        for (int i = 0; i < 5; ++i) {
            v[i] = NAN;
            if (i < nt && parse_double(tok[i], &v[i]) != 0) {
                rc = nbgi_error(ctx, NBG_EFORMAT, "%s:%ld: source %s \"%s\" is not a finite number", path, lineno,
                               field[i], tok[i]);
                goto done;
            }
        }
        nbg_source s;
        for (int i = 0; i < 3; ++i)
            s.pos[i] = isnan(v[i]) ? -source_distance * beam[i] : v[i];
        s.lambda = isnan(v[4]) ? lambda0_A : v[4] * 1e10;
        if (!isnan(v[4]) && !(s.lambda >= 1e-4 && s.lambda <= 1e4)) {
            rc = nbgi_error(ctx, NBG_EFORMAT, "%s:%ld: wavelength %g m is outside 1e-14 to 1e-6 m (1e-4 to 1e4 A)",
                            path, lineno, v[4]);
            goto done;
        }
        if (s.pos[0] == 0.0 && s.pos[1] == 0.0 && s.pos[2] == 0.0) {
            rc = nbgi_error(ctx, NBG_EFORMAT, "%s:%ld: source position is (0,0,0), which gives no direction", path,
                           lineno);
            goto done;
        }
        if (nsrc == (size_t)INT_MAX) {
            rc = nbgi_error(ctx, NBG_EFORMAT, "%s:%ld: too many sources", path, lineno);
            goto done;
        }
        if (nsrc == cap) {
            size_t ncap = cap ? 2 * cap : 16;
            nbg_source *grown = realloc(src, ncap * sizeof *grown);
            if (grown == NULL) {
                rc = nbgi_error(ctx, NBG_ENOMEM, "out of memory reading %s", path);
                goto done;
            }
            src = grown;
            cap = ncap;
        }
        src[nsrc++] = s;
    }
    if (got < 0) {
        rc = got;
        goto done;
    }
    if (nsrc == 0) {
        rc = nbgi_error(ctx, NBG_EFORMAT, "%s: no sources found", path);
        goto done;
    }
    *out = src;
    *n = (int)nsrc;
    src = NULL;

done:
    free(src);
    free(line);
    fclose(fp);
    return rc;
}

int nbgi_read_matrix(nbg_ctx *ctx, const char *path, double mat[9])
{
    if (path == NULL || mat == NULL)
        return nbgi_error(ctx, NBG_EINVAL, "nbgi_read_matrix: NULL argument");
    FILE *fp;
    int rc = nbgi_open_input(ctx, path, "matrix file", "r", &fp);
    if (rc != NBG_OK)
        return rc;
    double m[9];
    char tok[128];
    for (int i = 0; i < 9 && rc == NBG_OK; ++i) {
        if (fscanf(fp, "%127s", tok) != 1) {
            if (ferror(fp))
                rc = nbgi_error(ctx, NBG_EIO, "error reading %s: %s", path, strerror(errno));
            else
                rc = nbgi_error(ctx, NBG_EFORMAT, "%s: expected 9 numbers (a MOSFLM A matrix), found %d", path, i);
        } else if (parse_double(tok, &m[i]) != 0) {
            rc = nbgi_error(ctx, NBG_EFORMAT, "%s: matrix element %d (\"%s\") is not a finite number", path, i + 1,
                           tok);
        }
    }
    fclose(fp);
    if (rc == NBG_OK)
        memcpy(mat, m, sizeof m);
    return rc;
}
