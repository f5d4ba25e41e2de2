/*
 * io.h -- private file readers used by the command-line program: the nanoBragg source file and the MOSFLM
 * orientation matrix.  The public readers and writers (HKL, Fdump, SMV, PGM, float) are declared in nbgrad.h.
 */
#ifndef NBG_IO_H
#define NBG_IO_H

#include "internal.h"

/* Reads a nanoBragg source file.  Each non-blank line holds up to five fields "X Y Z weight lambda", separated by
 * any of " \t,;:!"; X Y Z is the source position (any length unit, only its direction matters), the weight is
 * read but unused (as in the reference) and lambda is in metres.  Missing trailing fields default to the position
 * -10 * beam (beam being the unit beam direction) and to lambda0_A; lambda is returned in Angstrom.
 *
 * Deliberate fix: the reference turns a '#' line into a source at the origin with lambda 0, which gives a NaN
 * image; here '#' starts a comment that runs to the end of the line.
 *
 * On success *out is a malloc'd array of *n >= 1 sources that the caller frees with free().  A field that is not
 * a finite number, or a source at the origin, is NBG_EFORMAT naming the file and line; a file with no sources is
 * NBG_EFORMAT; a file that cannot be opened or read is NBG_EIO.  On failure *out is NULL and *n is 0. */
int nbg_read_sources(nbg_ctx *ctx, const char *path, double lambda0_A, double beam[3], nbg_source **out, int *n);

/* Reads a MOSFLM orientation (A) matrix: the first nine whitespace-separated numbers of the file, in file order
 * (rows x, y, z; columns a*, b*, c*).  Anything after the ninth number (MOSFLM also writes a U matrix and the
 * cell) is ignored.  Fewer than nine numbers, or a token among the first nine that is not a finite number, is
 * NBG_EFORMAT naming the file. */
int nbg_read_matrix(nbg_ctx *ctx, const char *path, double mat[9]);

#endif
