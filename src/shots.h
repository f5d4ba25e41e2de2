/*
 * shots.h -- shot lists (JSON lines; the format is described at the top of src/batch.c), shared by nbgrad batch
 * and nbgrad ensemble.  Program code: the functions print their errors.
 */
#ifndef NBG_SHOTS_H
#define NBG_SHOTS_H

#include "cli.h"

enum {
    S_MISSET = 1 << 0, S_A = 1 << 1, S_CELL = 1 << 2, S_N = 1 << 3, S_MOSAIC = 1 << 4, S_DOMAINS = 1 << 5,
    S_LAMBDA = 1 << 6, S_PHI = 1 << 7, S_FLUENCE = 1 << 8, S_SCALE = 1 << 9, S_SEED = 1 << 10, S_SOURCE = 1 << 11,
    S_EXPT = 1 << 12, S_SPEC_SHIFT = 1 << 13, S_SPEC_SCALE = 1 << 14, S_ORIENT = 1 << 15
};

typedef struct {
    char id[64];
    unsigned has; /* S_* bits: the keys the line gave */
    double misset[3], orient[3], A[9], cell[6], N[3], mosaic, lambda, phi, fluence, scale, spectrum_shift, spectrum_scale;
    int mosaic_domains;
    long seed;
    char *sourcefile;
    char *expt; /* the shot's DIALS experiment list, its path resolved against the list's folder */
    int line;
    unsigned long long hash; /* FNV-1a of the line's object, its keys sorted and its text compact */
} shot;

typedef struct {
    shot *v;
    int n, cap;
} shot_list;

/* Reads a shot list (ids unique and usable in file names); prints the error and returns 0 when it cannot. */
int nbgi_shots_read(nbg_ctx *ctx, const char *path, shot_list *l);
void nbgi_shots_free(shot_list *l);
/* The base experiment c->e with the shot's keys applied: its experiment list first (as -expt: crystal, beam,
 * detector; its panels into *pan, NULL for one), then the other keys; a source file is read into *src.  The caller
 * frees *src and *pan.  Prints the error (naming the shot and the list's line) and returns 0 when a file cannot be
 * read or does not fit the base flags. */
int nbgi_shot_apply(nbg_ctx *ctx, nbgi_cli *c, const shot *s, const char *list, nbg_experiment *e, nbg_source **src,
                    int *nsrc, nbg_panel **pan);
/* The name of a shot's file: tmpl with every {id} replaced; 0 when it does not fit in size. */
int nbgi_shot_name(const char *tmpl, const char *id, char *out, size_t size);
/* Whether the program runs under mpirun (Open MPI's or a PMI launcher's environment says so). */
int nbgi_under_mpirun(void);
/* A subcommand's MPI start: under mpirun, MPI_Init and this process's rank and the rank count (returns 1); not
 * under mpirun, rank 0 of 1 (returns 0); under mpirun in a build without MPI, an error printed (returns -1: every
 * process would otherwise run the whole job).  nbgi_mpi_end(the value returned) finalises. */
int nbgi_mpi_begin(int *argc, char ***argv, int *rank, int *size);
void nbgi_mpi_end(int mpi);
/* Under mpirun, a program built without MPI next to its MPI twin (NBG_MPI_EXEC: make builds nbgrad-mpi, so that a
 * run without mpirun loads no MPI library) executes the twin in its place with the same arguments; returns when it
 * is not under mpirun, is the twin, or cannot find it (nbgi_mpi_begin then says so). */
void nbgi_mpi_reexec(char **argv);

#endif
