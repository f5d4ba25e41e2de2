/*
 * shots.h -- the library's internal forms of the shot-list and ensemble calls (src/shots.c, grad/ensemble.c) on the
 * builder's nbgi_cli, which the program (nbgrad batch, nbgrad ensemble: src/batch.c, src/ensemble.c) holds directly;
 * the public forms on nbg_builder are in include/nbgrad.h.  Library code: nothing here prints.
 */
#ifndef NBG_SHOTS_H
#define NBG_SHOTS_H

#include "nbgrad.h"
#include "build.h"

/* The base experiment c->e with shot s of list (named list in messages) applied: its experiment list first (as
 * -expt: crystal, beam, detector; its panels into *pan, NULL for one; its mosaic domains' own turns into *turns,
 * NULL for none), then the other keys; a source file read into *src.  The caller frees *src, *pan and *turns.
 * NBG_OK, or the status with the message naming the list's line and the shot (*src, *pan and *turns then NULL).
 * warn (wsize bytes; may be NULL) receives a warning for the user, "" when none. */
int nbgi_shot_apply(nbg_ctx *ctx, nbgi_cli *c, const nbg_shot *s, const char *list, nbg_experiment *e,
                    nbg_source **src, int *nsrc, nbg_panel **pan, double **turns, char *warn, size_t wsize);
/* The name of a shot's file: tmpl with every {id} replaced; 0 when it does not fit in size. */
int nbgi_shot_name(const char *tmpl, const char *id, char *out, size_t size);
/* nbg_ensemble on the builder's nbgi_cli (the program's). */
int nbgi_ensemble(nbg_ctx *ctx, nbgi_cli *c, const nbg_shot_list *l, const nbg_ensemble_options *opt,
                  nbg_ensemble_result *res);
/* The builder's nbgi_cli once its files are loaded, else NULL (src/build.c). */
nbgi_cli *nbgi_builder_cli(nbg_builder *b);

#endif
