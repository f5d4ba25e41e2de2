/*
 * build.h -- the library's experiment builder (src/build.c): nanoBragg's flags parsed into an nbg_experiment
 * (nbgi_build_parse) and the files they name read into it (nbgi_build_load: the .expt import, -setting, layouts,
 * panel groups, motions, -mat, HKL or Fdump, sources, -mask and -img headers).  Library code: it never prints; an
 * error is the status returned with its message in the context (nbg_errmsg), and what the program used to print
 * besides (notes, the files read, a drawn seed) is kept, in order, in the builder's message list.
 *
 * The public face is nbg_builder (include/nbgrad.h, its struct wraps an nbgi_cli); the program (src/cli.c and
 * its subcommands) uses nbgi_cli directly, adds its own flags through extra_handler, and prints the messages and
 * the errors (nbgi_cli_parse, nbgi_cli_load in cli.c).
 */
#ifndef NBG_BUILD_H
#define NBG_BUILD_H

#include "nbgrad.h"
#include "io.h"

#include <stddef.h>

/* One message of the builder: level NBG_MSG_* (nbgrad.h), text without a newline. */
typedef struct {
    int level;
    char *text;
} nbgi_msg;

/* What of the experiment an experiment list gives in a flag's place (the flag table's `list`): such a flag given with
 * -expt is ignored where the list has it, and a warning names it (nbgi_build_import_expt). */
enum { NBGI_LIST_NONE, NBGI_LIST_CRYSTAL, NBGI_LIST_BEAM, NBGI_LIST_DETECTOR, NBGI_LIST_SCAN, NBGI_LIST_GONIO,
       NBGI_LIST_COUNT };

typedef struct nbgi_cli nbgi_cli;

struct nbgi_cli {
    nbg_experiment e;
    nbg_hkl hkl;
    nbg_source *sources;
    int nsources;
    uint8_t *mask;
    int mask_f, mask_s;
    const char *hklfile, *matfile, *sourcefile, *dumpfile, *maskfile, *imgfile;
    const char *hklcolumn;  /* -hkl_column: the MTZ column of -hkl (NULL: the first F, else the first J) */
    const char *floatfile, *intfile, *pgmfile, *noisefile;
    const char *nxsfile, *cbffile, *exptfile; /* the formats with the whole geometry, and the experiment list */
    const char *exptin;     /* -expt: a DIALS experiment list read into the experiment */
    const char *settingin;  /* -setting: an experiment list whose crystal's basis -expt's crystal is re-expressed in */
    const char *layout;     /* -layout: a built-in multi-panel detector */
    nbg_panel *panels;      /* the panels of -layout (or of a multi-panel -expt) */
    int panel_groups;       /* -panel_groups: NBGI_GROUPS_* */
    const char *motionsfile; /* -motions: the panel groups' rigid motions */
    nbg_panel_motion *motions; /* one per panel group (zero unless -motions), or NULL without panels */
    int nmotions;           /* the panel groups */
    const char *domainrotfile; /* -domain_rot: the mosaic domains' own turns */
    double *domain_rot;     /* 3 per domain (nbg_experiment.domain_rot), or NULL */
    int ndomain_rot;
    int nframes;            /* -frames: images of the rotation series (1) */
    int filedata;           /* -data: what NXmx and CBF files hold (NBGI_DATA_*) */
    int smv_adc;            /* -smv_adc_offset: SMV headers get an ADC_OFFSET key */
    int batch;              /* a shot of nbgrad batch: no per-image advice (the dials.import line) */
    double polar_flag;      /* -polar's value, NAN when not given (it then wins over -expt's polarization) */
    double thick_flag;      /* -detector_thick's and -detector_abs's values, NAN when not given (each then wins */
    double thick_abs_flag;  /* over -expt's sensor, as -polar over its beam) */
    char list_flags[NBGI_LIST_COUNT][128]; /* the flags given that an experiment list gives in their place, by what
                                            * they set (NBGI_LIST_*): with -expt a warning names them */
    /* a series being written: the NXmx frames, the integer scale chosen on the first frame, its geometry */
    void *series;
    double series_scale;
    nbg_geometry geom;
    nbg_panel *geom_panels; /* the panels in geom's frame (DIALS's) for -nxsfile and -exptfile, or NULL */
    int expt_multi_panel;   /* -expt's image set option multi_panel (nbg_geometry.multi_panel): refine -exptfile
                               writes it back with the observed image */
    double expt_trusted[2]; /* -expt of one panel: its trusted_range (NAN NAN or 0 0: none; panels carry their own) */
    double *scan_crystal;   /* -expt's scan-varying crystal: its bases at the scan points (nbg_read_expt_scan_crystal,
                               re-expressed as -setting asks), or NULL; nbgi_build_frame_crystal gives each image its
                               own */
    int scan_points;
    double scan_lambda;     /* the list's wavelength (a crystal that is no cell becomes an A matrix at it) */
    double scale, adc, pgmscale;
    long seed;
    int have_seed, have_misset_seed;
    int nopgm, nonoise, nodump, help;
    int quiet;              /* -quiet: no progress on stderr (errors, warnings and results still printed) */
    int last_pivot;
    nbg_backend backend;
    nbg_precision precision;
    int threads;
    nbg_limits limits;      /* -max_memory, -max_samples */
    nbgi_outset outs;        /* the run's outputs, written to temporaries and renamed together by nbgi_cli_commit
                                (the loader puts the F cache of -hkl there) */
    /* a subcommand's own flags (the program's): returns the number of argv entries consumed (flag included), 0 when
     * the flag is not its own, -1 after printing an error (nbgi_build_parse then sets handler_failed) */
    int (*extra_handler)(nbgi_cli *c, int argc, char **argv, int i);
    void *extra;
    int handler_failed;     /* the last parse failed in extra_handler, which printed the error itself */
    nbgi_msg *msgs;         /* what the parser and the loader have to say besides errors, in order */
    int nmsgs, msgcap;
};

/* How -panel_groups groups the panels for their motions. */
enum { NBGI_GROUPS_MODULES = 0, NBGI_GROUPS_PANELS = 1, NBGI_GROUPS_DETECTOR = 2, NBGI_GROUPS_LEVEL1 = 3 };
/* (NBGI_GROUPS_LEVEL1 + l - 1: level l of the hierarchy, DIALS's hierarchy_level, l = 1 .. 5) */

/* What -data puts in NXmx and CBF files. */
enum { NBGI_DATA_INT = 0, NBGI_DATA_FLOAT = 1, NBGI_DATA_NOISE = 2 };


/* The program's output files, a row of src/outputs.def each (the flag table takes its output flags from them; the
 * program writes them through the format registry, src/imagefile.c). */
typedef struct {
    const char *flags;   /* the flag, then its aliases, space-separated ("-intfile -intimage") */
    size_t field;        /* offsetof(nbgi_cli, the field holding the file's name) */
    size_t cancel;       /* offsetof(nbgi_cli, the int switch that cancels it (-nopgm)) + 1, or 0: none */
    const char *format;  /* the registry's row that writes it */
    int carries;         /* NBGI_CARRY_* (formats.h); NBGI_CARRY_DATA: what -data says */
    int flat;            /* 1: it describes a single flat detector (refused with panels) */
    const char *help;
} nbgi_output;
/* Row i (0-based), NULL past the last. */
const nbgi_output *nbgi_output_at(int i);
/* The name c's flags give o, cancelled or not (NULL: not given). */
const char *nbgi_output_given(const nbgi_cli *c, const nbgi_output *o);
/* The file c asks o to write: its name, or NULL when not given or cancelled (-nopgm, -nonoise). */
const char *nbgi_output_path(const nbgi_cli *c, const nbgi_output *o);
/* What o carries in c's run: NBGI_CARRY_DATA replaced by -data's (photons, counts or noise). */
int nbgi_output_carries(const nbgi_cli *c, const nbgi_output *o);
/* o's flag (the first of its names) into buf (size bytes); returns buf. */
const char *nbgi_output_flag(const nbgi_output *o, char *buf, size_t size);

/* Sets c to the flags' defaults (nbg_experiment_default, Fdump.bin as the F cache, the CPU in double). */
void nbgi_cli_init(nbgi_cli *c);
/* Gives c's experiment its mosaic domains' own turns (nbg_experiment.domain_rot): c's, or zeros for each of
 * -mosaic_domains' domains (NBG_EINVAL without a count).  A status. */
int nbgi_cli_domain_rot(nbg_ctx *ctx, nbgi_cli *c);
/* Releases what the builder allocated (the F table, sources, mask, panels, motions, messages) and drops the outputs
 * not committed; c can be initialised again.  The program's nbgi_cli_free also releases its outputs' state. */
void nbgi_build_release(nbgi_cli *c);
/* Parses argv[first..] into c: NBG_OK, or the status with the message naming the flag in ctx (NBG_EINVAL for a bad
 * flag or value; a -mask or -img file read here gives its reader's status).  -h sets c->help and stops. */
int nbgi_build_parse(nbg_ctx *ctx, nbgi_cli *c, int argc, char **argv, int first);
/* Reads the files the parsed flags name into the experiment: NBG_OK, or the failing step's status with the message
 * (naming the flag and file) in ctx.  The F cache of -hkl (unless -nodump) goes into c->outs, for the caller to
 * commit. */
int nbgi_build_load(nbg_ctx *ctx, nbgi_cli *c);
/* An experiment list read into e as -expt reads it (its crystal, beam, detector; np > 1 panels into *pan, which the
 * caller frees and e->panels points at), the flags in before (e as the flags made it: -space_group, the sampling
 * flags) and c->polar_flag winning as over -expt.  base: the program's own -expt (-setting applies, notes said;
 * the mosaic domains' own turns, where the list has them, into c->domain_rot); otherwise (a shot's list) nothing is
 * said, and the turns go into *turns (3 angles a domain; NULL when the list has none), which the caller frees and
 * e->domain_rot points at.  g receives the list as read. */
int nbgi_build_import_expt(nbg_ctx *ctx, nbgi_cli *c, const char *path, int base, const nbg_experiment *before,
                           nbg_experiment *e, nbg_geometry *g, nbg_panel **pan, int *np, double **turns);
/* Image `frame` (0-based) of the series' crystal into e (e otherwise as the caller made it, its phi0 included): with a
 * scan-varying crystal from -expt (c->scan_crystal), the crystal of that image, the mean of the A matrices at its
 * start and end (scan points frame and frame + 1; DIALS interpolates A linearly in the angle between them), as a
 * cell and misset angles (or an A matrix, as -expt reads a crystal).  Without one, e is left as it is.  NBG_EINVAL
 * naming the image when the list has no scan point for it. */
int nbgi_build_frame_crystal(nbg_ctx *ctx, const nbgi_cli *c, int frame, nbg_experiment *e);
/* Appends a message at level NBG_MSG_* to c's list (dropped when memory is short). */
void nbgi_build_say(nbgi_cli *c, int level, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
/* Empties c's message list. */
void nbgi_build_clear_messages(nbgi_cli *c);

/* Reads s as a finite number for flag into *out: 1, or 0 with the message ("-distance expects a number, got 'x'")
 * in msg (size bytes). */
int nbgi_number_msg(const char *flag, const char *s, double *out, char *msg, size_t size);

/* The i-th entry of the flag table (0-based; 0 past the last): its names (the main one first, then its aliases,
 * space-separated), the names of its values (NULL: a switch), its help, and its help group (0 to *ngroups - 1,
 * titled *title). */
int nbgi_flag_entry(int i, const char **names, const char **arg, const char **help, int *group);
/* The title of help group g, or NULL past the last. */
const char *nbgi_flag_group_title(int g);
/* The i-th space-separated word of s and its length, or NULL. */
const char *nbgi_word(const char *s, int i, int *len);
/* 1 when a is a flag of the table that names an output file (-floatfile, -noisefile, ...; one value). */
int nbgi_cli_names_output(const char *a);
/* Whether name is one of the common (nanoBragg and nbgrad) flags of the table. */
int nbgi_cli_is_flag(const char *name);

/* src/observed.c.  The name of frame `frame` (0-based) of a series of n images written to or read from path: a run
 * of '#' in the name replaced by the 1-based frame number (zero-padded to the run's width; a single image too, as
 * still_00001.cbf, the name DIALS can import); else path itself when n is 1, or "_00001" inserted before the
 * extension.  out holds size bytes. */
void nbgi_frame_name(const char *path, int frame, int n, char *out, size_t size);
/* NBG_EINVAL, with the message naming what (the flag) and path, when an image file read for experiment e states
 * dimensions (fg: what nbg_read_image gave) other than the single detector's; NBG_OK otherwise (raw floats,
 * panels). */
int nbgi_image_shape_check(nbg_ctx *ctx, const nbg_experiment *e, const char *what, const char *path,
                           const nbg_geometry *fg);

#endif
