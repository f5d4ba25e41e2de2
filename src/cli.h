/*
 * cli.h -- the command-line program's shared pieces: the library's experiment builder (src/build.h: nanoBragg's
 * flags into an nbg_experiment, the files they name read) called with its messages and errors printed, the help,
 * statistics and output writing.  Used by every nbgrad subcommand; not library code (it prints).
 */
#ifndef NBG_CLI_H
#define NBG_CLI_H

#include "nbgrad.h"
#include "build.h"
#include "io.h"

#include <stdio.h>

/* Writes the motions of c's panel groups in -motions's format (every group, one line each); prints the error. */
int nbgi_cli_write_motions(nbg_ctx *ctx, nbgi_cli *c, const char *path);
/* Writes the mosaic domains' own turns in -domain_rot's format (every domain); prints the error, 0 on one. */
int nbgi_cli_write_domain_rot(nbg_ctx *ctx, nbgi_cli *c, const char *path);

typedef struct {
    double max, sum, mean, rms, rmsd;
    long imax, n;
} nbgi_stats;

/* A buffer for a whole image (or a series' frames) of bytes, freed with free(): where it spans 2 MiB or more,
 * aligned to 2 MiB and advised to the kernel as huge pages (Linux's MADV_HUGEPAGE), so that its first writes take
 * one fault each 2 MiB instead of each 4 KiB (on a virtual machine a 4 KiB fault took 3 us: tric1k's 4 MB image
 * 1024 of them, 3.3 ms of work in a 35 ms run; 0.8 ms with huge pages).  NULL when out of memory. */
void *nbgi_cli_image_alloc(size_t bytes);

/* Prints the usage and every flag, grouped, with its help (from the flag table in cli.c). */
void nbgi_cli_usage(FILE *out);
/* The flags alone, grouped, with their help. */
void nbgi_cli_flags_help(FILE *out);
/* The flag table as the markdown list of docs/flags.md's "All flags" section (nbgrad --flags-markdown). */
void nbgi_cli_flags_markdown(FILE *out);
/* Every name the parser accepts, aliases included, one a line (nbgrad --flags-list). */
void nbgi_cli_flags_list(FILE *out);
/* One flag's help line: names holds the main name then its aliases, space-separated; arg names its value (NULL:
 * none); scope, when not NULL, is appended in brackets.  markdown: as an item of docs/flags.md's list. */
void nbgi_cli_help_line(FILE *out, const char *names, const char *arg, const char *help, const char *scope,
                       int markdown);
/* Releases c (nbgi_build_release), first saying that the outputs prepared and not committed are discarded. */
void nbgi_cli_free(nbgi_cli *c);
/* nbgi_build_parse of argv[first..], its messages printed (nbgi_cli_say), then its error ("nbgrad: error: " and the
 * context's message on stderr); 1 on success, 0 after printing the error. */
int nbgi_cli_parse(nbg_ctx *ctx, nbgi_cli *c, int argc, char **argv, int first);
/* nbgi_build_load (the files the flags name read into the experiment), its messages and error printed likewise. */
int nbgi_cli_load(nbg_ctx *ctx, nbgi_cli *c);
/* Prints c's messages as the program always has (NBG_MSG_INFO on stdout, notes and warnings on stderr after
 * "nbgrad: note: " / "nbgrad: warning: ") and empties the list. */
void nbgi_cli_say(nbgi_cli *c);
/* Reads s as a finite number for flag (a subcommand's setter): 1, or 0 after printing the error. */
int nbgi_cli_number(const char *flag, const char *s, double *out);

/* 0, after printing the error, when an image file read for experiment e (what: the flag, path: the file) states
 * dimensions (fg: what nbg_read_image gave) other than the single detector's; 1 otherwise (raw floats, panels). */
int nbgi_cli_image_shape_ok(nbg_ctx *ctx, const nbg_experiment *e, const char *what, const char *path,
                            const nbg_geometry *fg);
/* -data float with an output whose format holds integers only (-cbffile): prints the error naming it and the
 * outputs that hold floats, returns 0; 1 otherwise. */
int nbgi_cli_data_fits(nbg_ctx *ctx, const nbgi_cli *c);

void nbgi_cli_print_setup(const nbgi_cli *c, const nbg_report *r);
void nbgi_cli_stats(const nbgi_cli *c, const nbg_report *r, const float *img, nbgi_stats *st);
/* Writes frame `frame` (0-based, of c->nframes) of the images asked for into the run's output set (nothing is
 * renamed over a target yet); with several frames, the per-image files get the frame number (1-based) in their
 * names, and the last frame also writes the NXmx file and the experiment list of the series. */
int nbgi_cli_write_outputs(nbg_ctx *ctx, nbgi_cli *c, const nbg_report *r, const float *img, int frame);
/* Renames every output of the run over its target; prints the error and returns 0 on failure. */
int nbgi_cli_commit(nbg_ctx *ctx, nbgi_cli *c);

/* A file a run reads or writes, with the flag that names it. */
typedef struct {
    const char *flag, *path;
    int output;
} nbgi_cli_path;
/* Common set-up of a subcommand: parse argv[first..], check the run's files (extra: the subcommand's own, n of
 * them, each read through its field after parsing), create the context with the flags' backend, precision, threads and limits, load the files the flags name,
 * check the mask's size.  Returns the context, or NULL after printing the error (or after -h: c->help is set). */
typedef struct {
    const char *flag;
    const char *const *ref; /* the field the subcommand's flag sets: read after parsing */
    int output;
} nbgi_cli_path_ref;
nbg_ctx *nbgi_cli_setup(nbgi_cli *c, int argc, char **argv, int first, const nbgi_cli_path_ref *extra, int n);
/* The subcommands of src/batch.c: many shots (batch), and writing a shot list (shots). */
int nbgi_cmd_batch(int argc, char **argv, int first);
int nbgi_cmd_shots(int argc, char **argv, int first);
/* Whether the program runs under mpirun (Open MPI's or a PMI launcher's environment says so). */
int nbgi_under_mpirun(void);
/* A subcommand's MPI start (src/batch.c): under mpirun, MPI_Init and this process's rank and the rank count (returns
 * 1); not under mpirun, rank 0 of 1 (returns 0); under mpirun in a build without MPI, an error printed (returns -1:
 * every process would otherwise run the whole job).  nbgi_mpi_end(the value returned) finalises. */
int nbgi_mpi_begin(int *argc, char ***argv, int *rank, int *size);
void nbgi_mpi_end(int mpi);
/* Under mpirun, a program built without MPI next to its MPI twin (NBG_MPI_EXEC: make builds nbgrad-mpi, so that a
 * run without mpirun loads no MPI library) executes the twin in its place with the same arguments; returns when it
 * is not under mpirun, is the twin, or cannot find it (nbgi_mpi_begin then says so). */
void nbgi_mpi_reexec(char **argv);
/* src/ensemble.c: refinement of many shots together (global structure factors and parameters, local ones). */
int nbgi_cmd_ensemble(int argc, char **argv, int first);
/* --- the subcommands' own flags ------------------------------------------------------------------------------ */

/* The subcommands with flags of their own, a bit each: a flag's scope. */
enum {
    NBGI_CMD_GRAD = 1,
    NBGI_CMD_GRADCHECK = 2,
    NBGI_CMD_REFINE = 4,
    NBGI_CMD_ENSEMBLE = 8,
    NBGI_CMD_BATCH = 16,
    NBGI_CMD_SHOTS = 32,
};
#define NBGI_NCMDS 6

/* One entry of a subcommand's flag table (src/main.c for grad, gradcheck and refine; src/ensemble.c; src/batch.c for
 * batch and shots).  A table drives its subcommands' parser (nbgi_sub_flag_parse), their -h, nbgrad -h, docs/flags.md's
 * "All flags" section (nbgrad --flags-markdown) and nbgrad --flags-list. */
typedef struct {
    const char *flag;
    unsigned cmds; /* the subcommands that take it (NBGI_CMD_*) */
    /* reads the flag's values v (as many as arg has words; NULL for a switch) into dst, the field at off in the
     * subcommand's options opts; prints the error and returns 0 on a bad value */
    int (*set)(void *opts, const char *flag, char **v, void *dst);
    size_t off;
    const char *arg;  /* the values' names in the help, a word each ("a b c alpha beta gamma": 6); NULL: a switch */
    const char *help;
} nbgi_sub_flag;

/* The tables of src/ensemble.c and src/batch.c (n receives the entries). */
const nbgi_sub_flag *nbgi_ensemble_flags(int *n);
const nbgi_sub_flag *nbgi_batch_flags(int *n);
/* "grad, refine": the subcommands of a set of NBGI_CMD_* bits, into buf. */
const char *nbgi_cmd_names(unsigned cmds, char *buf, size_t size);
/* Parses argv[i] when it is a flag of table t (n entries) for the subcommand cmd: returns the argv entries it used
 * (the flag's included), 0 when it is none of the table's, -1 after printing an error (a bad value, a missing one, or
 * a flag of the table that another subcommand takes; note, when not NULL, is appended to that message). */
int nbgi_sub_flag_parse(const nbgi_sub_flag *t, int n, unsigned cmd, void *opts, int argc, char **argv, int i,
                        const char *note);
/* The flags of table t for cmd, as help lines (every one with its subcommands in brackets when cmd is 0); markdown:
 * as items of docs/flags.md's list. */
void nbgi_sub_flags_doc(FILE *out, const nbgi_sub_flag *t, int n, unsigned cmd, int markdown);
/* A subcommand's -h: usage (several lines), its own flags from t, then the common flags. */
void nbgi_sub_usage(FILE *out, const char *usage, const nbgi_sub_flag *t, int n, unsigned cmd);
/* Common setters of the subcommand tables: a file name (const char *), a positive number (double), a switch (int 1). */
int nbgi_set_path(void *opts, const char *flag, char **v, void *dst);
int nbgi_set_positive(void *opts, const char *flag, char **v, void *dst);
/* -spots HALF: a box half-width in pixels, an integer in [0, 100000], into the int at dst. */
int nbgi_set_half_box(void *opts, const char *flag, char **v, void *dst);
int nbgi_set_switch(void *opts, const char *flag, char **v, void *dst);

/* The observed image's detector response as grad, refine and ensemble take it, one table for the three (src/cli.c):
 * -pedestal, -gain, -read_noise, and each panel's own -panel_pedestal, -panel_gain, -panel_read_noise. */
typedef struct {
    double pedestal, gain, read_noise; /* NAN: not given */
    const char *panel[3];              /* the per-panel comma lists as given (NULL: not given) */
} nbgi_response_opts;
void nbgi_response_opts_init(nbgi_response_opts *r);
const nbgi_sub_flag *nbgi_response_flags(int *n);
/* nbgi_sub_flag_parse of the response table into r. */
int nbgi_response_flag_parse(nbgi_response_opts *r, unsigned cmd, int argc, char **argv, int i);
/* r as nbg_observed_read's options (every other field unset): the panel lists parsed into *values (malloc'd, to free
 * after the read; NULL when none), each checked to give npanels values (the experiment's panels).  0 after printing
 * the error (naming the flag), 1 otherwise. */
int nbgi_response_options(const nbgi_response_opts *r, int npanels, nbg_observed_options *opt, double **values);

/* --- progress and JSON ----------------------------------------------------------------------------------------- */

/* Progress of long runs goes to stderr (line-buffered, as stdout is): a bar redrawn in place (\r) when stderr is a
 * terminal, plain lines otherwise; nothing under -quiet.  Errors, warnings and results are never silenced. */
void nbgi_progress_init(void);
void nbgi_progress_quiet(int quiet);
/* One step, done of total (total <= 0: unknown), described by fmt: on a terminal, the line redrawn with a bar (and
 * ended when done reaches total); otherwise a line of its own, when plain (a step whose plain lines would flood a
 * log, such as each shot of a local fit, passes 0 and shows on a terminal only). */
void nbgi_progress(int plain, int done, int total, const char *fmt, ...) __attribute__((format(printf, 4, 5)));
/* Ends a bar left open on the terminal (before other output). */
void nbgi_progress_end(void);

/* JSON outputs (jansson; a build without it, FORMATS=0, has none): nbgi_json_write serialises doc (its reference is
 * taken: the caller must not decref it) into path, atomically, through the run's output set (set NULL: renamed at
 * once), with two-space indentation or (indent 0) on one line, keys in insertion order, reals to 17 significant
 * digits (they round-trip).  Prints the error and returns 0 on one.  nbgi_json_num: a number, or null when not
 * finite.  nbgi_json_refused: prints why -json is refused in a build without jansson and returns 1 there. */
struct json_t;
int nbgi_json_write(nbg_ctx *ctx, nbgi_outset *set, const char *path, struct json_t *doc, int indent);
struct json_t *nbgi_json_num(double v);
int nbgi_json_refused(const char *flag, const char *path);

/* Checks the run's files before any work: the same output named twice, or an output that is one of the inputs, is
 * an error (printed).  extra lists a subcommand's own files (n entries). */
int nbgi_cli_check_paths(const nbgi_cli *c, const nbgi_cli_path *extra, int n);
/* The absolute name of path with its directory's links resolved (the file itself need not exist); path itself when
 * its directory cannot be resolved. */
void nbgi_cli_canonical(const char *path, char *out, size_t size);

#endif
