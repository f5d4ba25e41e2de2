/*
 * cli.h -- the command-line program's shared pieces: nanoBragg flag parsing into an nbg_experiment, loading of
 * the files the flags name, statistics and output writing.  Used by every nbgrad subcommand; not library code
 * (it prints).
 */
#ifndef NBG_CLI_H
#define NBG_CLI_H

#include "nbgrad.h"
#include "io.h"

#include <stdio.h>

typedef struct nbgi_cli nbgi_cli;

struct nbgi_cli {
    nbg_experiment e;
    nbg_hkl hkl;
    nbg_source *sources;
    int nsources;
    uint8_t *mask;
    int mask_f, mask_s;
    const char *hklfile, *matfile, *sourcefile, *dumpfile, *maskfile, *imgfile;
    const char *floatfile, *intfile, *pgmfile, *noisefile;
    const char *nxsfile, *cbffile, *exptfile; /* the formats with the whole geometry, and the experiment list */
    const char *exptin;     /* -expt: a DIALS experiment list read into the experiment */
    const char *layout;     /* -layout: a built-in multi-panel detector */
    nbg_panel *panels;      /* the panels of -layout (or of a multi-panel -expt) */
    int panel_groups;       /* -panel_groups: NBGI_GROUPS_* */
    const char *motionsfile; /* -motions: the panel groups' rigid motions */
    nbg_panel_motion *motions; /* one per panel group (zero unless -motions), or NULL without panels */
    int nmotions;           /* the panel groups */
    int nframes;            /* -frames: images of the rotation series (1) */
    int filedata;           /* -data: what NXmx and CBF files hold (NBGI_DATA_*) */
    int smv_adc;            /* -smv_adc_offset: SMV headers get an ADC_OFFSET key */
    int batch;              /* a shot of nbgrad batch: no per-image advice (the dials.import line) */
    double polar_flag;      /* -polar's value, NAN when not given (it then wins over -expt's polarization) */
    /* a series being written: the NXmx frames, the integer scale chosen on the first frame, its geometry */
    void *series;
    double series_scale;
    nbg_geometry geom;
    nbg_panel *geom_panels; /* the panels in geom's frame (DIALS's) for -nxsfile and -exptfile, or NULL */
    double scale, adc, pgmscale;
    long seed;
    int have_seed, have_misset_seed;
    int nopgm, nonoise, nodump, help;
    int last_pivot;
    nbg_backend backend;
    nbg_precision precision;
    int threads;
    nbg_limits limits;      /* -max_memory, -max_samples */
    nbgi_outset outs;        /* the run's outputs, written to temporaries and renamed together by nbgi_cli_commit */
    /* a subcommand's own flags: returns the number of argv entries consumed (flag included), 0 when the flag is
     * not its own, -1 after printing an error */
    int (*extra_handler)(nbgi_cli *c, int argc, char **argv, int i);
    void *extra;
};

/* How -panel_groups groups the panels for their motions. */
enum { NBGI_GROUPS_MODULES = 0, NBGI_GROUPS_PANELS = 1, NBGI_GROUPS_DETECTOR = 2 };

/* Writes the motions of c's panel groups in -motions's format (every group, one line each); prints the error. */
int nbgi_cli_write_motions(nbg_ctx *ctx, nbgi_cli *c, const char *path);

/* What -data puts in NXmx and CBF files. */
enum { NBGI_DATA_INT = 0, NBGI_DATA_FLOAT = 1, NBGI_DATA_NOISE = 2 };

typedef struct {
    double max, sum, mean, rms, rmsd;
    long imax, n;
} nbgi_stats;

void nbgi_cli_init(nbgi_cli *c);
/* Prints the usage and every flag, grouped, with its help (from the flag table in cli.c). */
void nbgi_cli_usage(FILE *out);
/* The flags alone, grouped, with their help. */
void nbgi_cli_flags_help(FILE *out);
/* The flag table as the markdown list of the README's "All flags" section (nbgrad --flags-markdown). */
void nbgi_cli_flags_markdown(FILE *out);
/* Every name the parser accepts, aliases included, one a line (nbgrad --flags-list). */
void nbgi_cli_flags_list(FILE *out);
/* One flag's help line: names holds the main name then its aliases, space-separated; arg names its value (NULL:
 * none); scope, when not NULL, is appended in brackets.  markdown: as an item of the README's list. */
void nbgi_cli_help_line(FILE *out, const char *names, const char *arg, const char *help, const char *scope,
                       int markdown);
void nbgi_cli_free(nbgi_cli *c);
/* Parses argv[first..]; prints the error and returns 0 on a bad flag. */
int nbgi_cli_parse(nbg_ctx *ctx, nbgi_cli *c, int argc, char **argv, int first);
/* Reads the files the flags name (matrix, HKL or Fdump, sources) into the experiment. */
int nbgi_cli_load(nbg_ctx *ctx, nbgi_cli *c);
int nbgi_cli_number(const char *flag, const char *s, double *out);
void nbgi_cli_print_setup(const nbgi_cli *c, const nbg_report *r);
void nbgi_cli_stats(const nbgi_cli *c, const nbg_report *r, const float *img, nbgi_stats *st);
/* Writes frame `frame` (0-based, of c->nframes) of the images asked for into the run's output set (nothing is
 * renamed over a target yet); with several frames, the per-image files get the frame number (1-based) in their
 * names, and the last frame also writes the NXmx file and the experiment list of the series. */
int nbgi_cli_write_outputs(nbg_ctx *ctx, nbgi_cli *c, const nbg_report *r, const float *img, int frame);
/* The name of frame `frame` (0-based) of a series of n images written to path: a run of '#' in the name replaced by
 * the 1-based frame number (zero-padded to the run's width; a single image too, as still_00001.cbf, the name DIALS
 * can import); else path itself when n is 1, or "_00001" inserted before the extension.  out holds size bytes. */
void nbgi_cli_frame_name(const char *path, int frame, int n, char *out, size_t size);
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
/* src/ensemble.c: refinement of many shots together (global structure factors and parameters, local ones). */
int nbgi_cmd_ensemble(int argc, char **argv, int first);
/* Checks the run's files before any work: the same output named twice, or an output that is one of the inputs, is
 * an error (printed).  extra lists a subcommand's own files (n entries). */
int nbgi_cli_check_paths(const nbgi_cli *c, const nbgi_cli_path *extra, int n);

#endif
