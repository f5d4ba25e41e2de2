/*
 * io.h -- private file readers used by the command-line program: the nanoBragg source file and the MOSFLM
 * orientation matrix.  The public readers and writers (HKL, Fdump, SMV, PGM, float) are declared in nbgrad.h.
 */
#ifndef NBG_IO_H
#define NBG_IO_H

#include "internal.h"
#include "mtz.h"

#include <stdio.h>

/* Reads a nanoBragg source file.  Each non-blank line holds up to five fields "X Y Z weight lambda", separated by
 * any of " \t,;:!"; X Y Z is the source position (any length unit, only its direction matters), the weight is
 * read but unused (as in the reference) and lambda is in metres.  Missing trailing fields default to the position
 * -10 * beam (beam being the unit beam direction) and to lambda0_A; lambda is returned in Angstrom.  A wavelength
 * given outside 1e-14 to 1e-6 m (zero and negative included) is NBG_EFORMAT naming the line.
 *
 * Deliberate fix: the reference turns a '#' line into a source at the origin with lambda 0, which gives a NaN
 * image; here '#' starts a comment that runs to the end of the line.
 *
 * On success *out is a malloc'd array of *n >= 1 sources that the caller frees with free().  A field that is not
 * a finite number, or a source at the origin, is NBG_EFORMAT naming the file and line; a file with no sources is
 * NBG_EFORMAT; a file that cannot be opened or read is NBG_EIO.  On failure *out is NULL and *n is 0. */
int nbgi_read_sources(nbg_ctx *ctx, const char *path, double lambda0_A, double beam[3], nbg_source **out, int *n);

/* Reads a MOSFLM orientation (A) matrix: the first nine whitespace-separated numbers of the file, in file order
 * (rows x, y, z; columns a*, b*, c*).  Anything after the ninth number (MOSFLM also writes a U matrix and the
 * cell) is ignored.  Fewer than nine numbers, or a token among the first nine that is not a finite number, is
 * NBG_EFORMAT naming the file. */
int nbgi_read_matrix(nbg_ctx *ctx, const char *path, double mat[9]);

/* Writing an output file atomically: to a temporary file beside its target, renamed over the target when
 * complete.  The target is the path, or the file a symbolic link at the path resolves to (a dangling link is
 * refused); an existing target that is not a regular file (/dev/null, a FIFO) is written directly. */
typedef struct {
    FILE *fp;
    char *tmp;        /* the temporary name, or NULL when writing straight to the target */
    char *target;     /* the file that is replaced (the path, or what its link resolves to) */
    const char *path; /* the name the caller gave, for messages */
} nbgi_out;

/* Outputs written together (the files of one run): nothing is renamed over a target until every one of them has
 * been written, so a failure leaves every earlier file as it was.  The set grows as needed and owns its names;
 * nbgi_outset_commit or nbgi_outset_abort releases it. */
typedef struct {
    int n, cap;
    char **tmp, **target, **path;
} nbgi_outset;

int nbgi_out_open(nbg_ctx *ctx, const char *path, nbgi_out *o);
/* For a library that writes by file name (HDF5): opens like nbgi_out_open, then closes the temporary and gives
 * the name to write in *write_to (the temporary, or the target itself when that is not a regular file).  Finish
 * with nbgi_out_finish (which then only renames) or nbgi_out_abort. */
int nbgi_out_open_path(nbg_ctx *ctx, const char *path, nbgi_out *o, const char **write_to);
/* Writes n bytes; on failure abandons the file (nbgi_out_abort) and reports the error. */
int nbgi_out_write(nbg_ctx *ctx, nbgi_out *o, const void *buf, size_t n);
/* Flushes and closes the file (no fsync: a full disk or a write error is caught, a power cut is not); with set NULL renames it over its target now, otherwise adds it to set. */
int nbgi_out_finish(nbg_ctx *ctx, nbgi_out *o, nbgi_outset *set);
/* Abandons a file: closes and removes the temporary. */
void nbgi_out_abort(nbgi_out *o);

void nbgi_outset_init(nbgi_outset *set);
/* Renames every staged file over its target, in order (each rename is atomic). */
int nbgi_outset_commit(nbg_ctx *ctx, nbgi_outset *set);
/* Removes every staged temporary: the targets stay as they were. */
void nbgi_outset_abort(nbgi_outset *set);

/* The public writers (nbgrad.h) with an output set: set NULL writes at once. */
int nbgi_write_smv_set(nbg_ctx *ctx, nbgi_outset *set, const char *path, const nbg_smv_header *h, const uint16_t *data);
int nbgi_write_pgm_set(nbg_ctx *ctx, nbgi_outset *set, const char *path, const float *image, int fpixels, int spixels,
                      double scale);
int nbgi_write_float_set(nbg_ctx *ctx, nbgi_outset *set, const char *path, const float *image, size_t npix);
int nbgi_hkl_write_fdump_set(nbg_ctx *ctx, nbgi_outset *set, const char *path, const nbg_hkl *hkl);

/* The dense table of entries ent (path names the input in messages): every index's F, default_F elsewhere; with
 * average, an index listed several times gets the mean of its values (summed in input order), else the last one.
 * The table's bounds are checked (index range, memory limit, a few stray indices that would make it all default_F)
 * before anything is allocated.  out->nrefl is the count of distinct indices (with average) or of entries. */
int nbgi_hkl_from_entries(nbg_ctx *ctx, const char *path, const nbgi_hkl_entry *ent, size_t nent, double default_F,
                          int average, nbg_hkl *out);
/* nbg_hkl_read_column's MTZ reader (src/mtz.c; through the formats plug-in where it is one) and its reader of DIALS
 * reflection tables (src/refl.c).  what (nwhat bytes, may be NULL) gets a line on what was read. */
int nbgi_read_mtz(nbg_ctx *ctx, const char *path, const char *column, double default_F, nbg_hkl *out, char *what,
                  size_t nwhat);
int nbgi_refl_hkl(nbg_ctx *ctx, const char *path, double default_F, nbg_hkl *out, char *what, size_t nwhat);
/* The same on a file's bytes (buf, len; path names it in messages). */
int nbgi_mtz_parse(nbg_ctx *ctx, const char *path, const unsigned char *buf, size_t len, const char *column,
                   double default_F, nbg_hkl *out, char *what, size_t nwhat);
/* Reads a whole input file (nbgi_open_input's checks; what names it) into *buf (malloc'd, *len bytes). */
int nbgi_read_whole(nbg_ctx *ctx, const char *path, const char *what, unsigned char **buf, size_t *len);

#endif
