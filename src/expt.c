/*
 * expt.c -- DIALS experiment lists (.expt, JSON through jansson): the writer lays out one experiment exactly as
 * DIALS 3.12 (dxtbx's ExperimentList.to_dict) writes it, so that dials.* programs take it as their own; the reader
 * takes one experiment of one panel from a list that DIALS (or this writer) wrote.
 *
 * Frames: nbg_geometry is already in DIALS's laboratory frame, so every vector is copied as it is.  The only
 * composition is on reading: a goniometer with a setting rotation S and a fixed rotation F turns the crystal
 * by S R(axis, phi) F, which equals R(S axis, phi) S F; nbg_geometry has no S or F, so the reader stores the
 * rotation axis as S axis and the crystal's real-space vectors as S F a (exact, not an approximation).  A
 * multi-axis goniometer is the same thing: F and S are the products of the rotations of the axes inside and
 * outside the scan axis, as dxtbx computes them.
 */
#include "formats.h"
#include "panels.h"
#include "plan.h"

#include <errno.h>
#include <float.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifdef NBG_HAVE_FORMATS

#include <jansson.h>
#include <strings.h>
#include <sys/stat.h>
#include <unistd.h>

/* ---------------------------------------------------------------------------------------------------------- */
/* Writing                                                                                                    */
/* ---------------------------------------------------------------------------------------------------------- */

/* JSON has no NaN: an unknown saturation (NaN in nbg_geometry) is written as the largest double, which dxtbx
 * takes as "no overload" and which the reader maps back to NaN. */
#define EXPT_NO_SATURATION DBL_MAX

/* A JSON array of n reals (NULL when jansson runs out of memory: json_pack's "o" then fails, and the caller
 * reports it). */
static json_t *reals(const double *v, size_t n)
{
    json_t *a = json_array();
    for (size_t i = 0; a != NULL && i < n; ++i) {
        if (json_array_append_new(a, json_real(v[i])) != 0) {
            json_decref(a);
            return NULL;
        }
    }
    return a;
}

static json_t *ints2(json_int_t a, json_int_t b)
{
    return json_pack("[I, I]", a, b);
}

static json_t *identity9(void)
{
    static const double id[9] = {1, 0, 0, 0, 1, 0, 0, 0, 1};
    return reals(id, 9);
}

/* The panel as dxtbx's Panel.to_dict writes it (also used for the hierarchy's root group, with its fields). */
static json_t *panel_json(const char *name, const char *type, const double fast[3], const double slow[3],
                          const double origin[3], const int raw_offset[2], json_int_t fpix, json_int_t spix,
                          const double pixel[2],
                          const double trusted[2], double thickness, const char *material, double mu, double gain,
                          double pedestal, const char *strategy)
{
    return json_pack("{s:s, s:s, s:o, s:o, s:o, s:o, s:o, s:o, s:o, s:f, s:s, s:f, s:s, s:[], s:f, s:f, s:{s:s}}",
                     "name", name, "type", type, "fast_axis", reals(fast, 3), "slow_axis", reals(slow, 3), "origin",
                     reals(origin, 3), "raw_image_offset", ints2(raw_offset[0], raw_offset[1]), "image_size", ints2(fpix, spix), "pixel_size",
                     reals(pixel, 2), "trusted_range", reals(trusted, 2), "thickness", thickness, "material",
                     material, "mu", mu, "identifier", "", "mask", "gain", gain, "pedestal", pedestal,
                     "px_mm_strategy", "type", strategy);
}

/* A detector hierarchy of several levels from the panels' levels (nbg_panel.level_group, as a DIALS list or a built-in
 * layout gives them): its groups (a group of one panel, or of the same panels as its parent group, is no group of its
 * own here: it adds nothing), each with its parent and its children in the order their first panels come. */
typedef struct {
    int parent;      /* the parent node, -1: the root */
    int first;       /* its first panel (whose frame is the group's) */
    int level, id;   /* its level and number there (nbg_panel.level_group) */
    int nkids, *kid; /* children: node n as -(n + 1), panel k as k */
} hier_node;

typedef struct {
    hier_node *node;
    int n, depth;
    int *owner; /* each panel's parent node (-1: the root) */
    int nroot, *root; /* the root's children, as hier_node's kid */
} hier_tree;

static void hier_free(hier_tree *t)
{
    for (int i = 0; t->node != NULL && i < t->n; ++i) free(t->node[i].kid);
    free(t->node);
    free(t->owner);
    free(t->root);
    memset(t, 0, sizeof *t);
}

static int hier_add_kid(hier_tree *t, int parent, int kid, int npanels)
{
    if (parent < 0) {
        t->root[t->nroot++] = kid;
        return 1;
    }
    hier_node *q = &t->node[parent];
    if (q->kid == NULL && (q->kid = malloc(sizeof(int) * (size_t)(npanels + t->n + 1))) == NULL)
        return 0;
    q->kid[q->nkids++] = kid;
    return 1;
}

/* The tree of the panels' levels, when they describe one (every panel's level 0 is 0 and some level past the
 * deepest is -1: a layout's or a read list's, not panels with their levels left 0) nested consistently, two group
 * levels deep or more; 0 otherwise (the writer then writes the panels' groups, one level). */
static int hier_build(const nbg_panel *panels, int npanels, hier_tree *t)
{
    memset(t, 0, sizeof *t);
    int ends = 0, maxid = 0;
    for (int k = 0; k < npanels; ++k) {
        if (panels[k].level_group[0] != 0)
            return 0;
        for (int l = 1; l < NBG_PANEL_LEVELS; ++l) {
            ends |= panels[k].level_group[l] < 0;
            maxid = panels[k].level_group[l] > maxid ? panels[k].level_group[l] : maxid;
        }
    }
    if (!ends || npanels < 2 || maxid > 1000000)
        return 0;
    /* the panels in each group of each level */
    int *count = calloc((size_t)NBG_PANEL_LEVELS * (size_t)(maxid + 1), sizeof *count);
    int *made = malloc(sizeof(int) * (size_t)NBG_PANEL_LEVELS * (size_t)(maxid + 1));
    t->node = malloc(sizeof *t->node * (size_t)npanels * NBG_PANEL_LEVELS);
    t->owner = malloc(sizeof *t->owner * (size_t)npanels);
    t->root = malloc(sizeof *t->root * (size_t)npanels);
    int ok = count != NULL && made != NULL && t->node != NULL && t->owner != NULL && t->root != NULL;
    for (int k = 0; ok && k < npanels; ++k)
        for (int l = 1; l < NBG_PANEL_LEVELS && panels[k].level_group[l] >= 0; ++l)
            ++count[l * (maxid + 1) + panels[k].level_group[l]];
    for (int i = 0; ok && i < NBG_PANEL_LEVELS * (maxid + 1); ++i) made[i] = -1;
    for (int k = 0; ok && k < npanels; ++k) {
        int parent = -1, had = npanels; /* the chain's last node and its panels (the root: all of them) */
        for (int l = 1; ok && l < NBG_PANEL_LEVELS && panels[k].level_group[l] >= 0; ++l) {
            const int id = panels[k].level_group[l], c = count[l * (maxid + 1) + id];
            if (c < 2 || (c == had && parent >= 0))
                continue; /* a group of this panel alone, or its parent group again */
            int *m = &made[l * (maxid + 1) + id];
            if (*m < 0) {
                *m = t->n++;
                t->node[*m] = (hier_node){parent, k, l, id, 0, NULL};
                ok = hier_add_kid(t, parent, -(*m + 1), npanels);
            } else if (t->node[*m].parent != parent) {
                ok = 0; /* not nested: a group whose panels lie in different groups of the level above */
            }
            parent = *m, had = c;
        }
        t->owner[k] = parent;
        ok = ok && hier_add_kid(t, parent, k, npanels);
    }
    for (int i = 0; ok && i < t->n; ++i) {
        int d = 1;
        for (int q = t->node[i].parent; q >= 0; q = t->node[q].parent) ++d;
        t->depth = d > t->depth ? d : t->depth;
    }
    free(count);
    free(made);
    if (!ok || t->depth < 2) {
        hier_free(t);
        return 0;
    }
    return 1;
}

/* The unit frame (fast, slow, normal, origin) of panel p, as a group's whose first panel it is. */
static void panel_unit_frame(const nbg_panel *p, double G[12])
{
    const double nf = sqrt(p->fast[0] * p->fast[0] + p->fast[1] * p->fast[1] + p->fast[2] * p->fast[2]);
    const double ns = sqrt(p->slow[0] * p->slow[0] + p->slow[1] * p->slow[1] + p->slow[2] * p->slow[2]);
    for (int i = 0; i < 3; ++i) {
        G[i] = p->fast[i] / nf;
        G[3 + i] = p->slow[i] / ns;
        G[9 + i] = p->origin[i];
    }
    G[6] = G[1] * G[5] - G[2] * G[4];
    G[7] = G[2] * G[3] - G[0] * G[5];
    G[8] = G[0] * G[4] - G[1] * G[3];
}

/* The unit frame (fast, slow, normal, origin) of panel p's group at level l as the list gave it (nbg_panel.
 * level_frame, placed): 1, or 0 when it has none there. */
static int level_unit_frame(const nbg_panel *p, int l, double G[12])
{
    if (!p->has_level_frames || l < 0 || l >= NBG_PANEL_LEVELS)
        return 0;
    const double *F = p->level_frame[l];
    const double nf = sqrt(F[0] * F[0] + F[1] * F[1] + F[2] * F[2]);
    const double ns = sqrt(F[3] * F[3] + F[4] * F[4] + F[5] * F[5]);
    if (!(nf > 0 && ns > 0))
        return 0;
    for (int i = 0; i < 3; ++i) {
        G[i] = F[i] / nf;
        G[3 + i] = F[3 + i] / ns;
        G[9 + i] = F[6 + i];
    }
    G[6] = G[1] * G[5] - G[2] * G[4];
    G[7] = G[2] * G[3] - G[0] * G[5];
    G[8] = G[0] * G[4] - G[1] * G[3];
    return 1;
}

/* The frame of a group whose first panel is p, at level l: its own as the list gave it, else p's. */
static void group_unit_frame(const nbg_panel *p, int l, double G[12])
{
    if (!level_unit_frame(p, l, G))
        panel_unit_frame(p, G);
}

/* Vectors f, s and point o (laboratory) in the frame G (NULL: the root's, the laboratory). */
static void to_frame(const double *G, const double f[3], const double s[3], const double o[3], double fo[3],
                     double so[3], double oo[3])
{
    for (int i = 0; i < 3; ++i) {
        if (G == NULL) {
            fo[i] = f[i], so[i] = s[i], oo[i] = o[i];
            continue;
        }
        fo[i] = G[3 * i] * f[0] + G[3 * i + 1] * f[1] + G[3 * i + 2] * f[2];
        so[i] = G[3 * i] * s[0] + G[3 * i + 1] * s[1] + G[3 * i + 2] * s[2];
        oo[i] = G[3 * i] * (o[0] - G[9]) + G[3 * i + 1] * (o[1] - G[10]) + G[3 * i + 2] * (o[2] - G[11]);
    }
}

/* A group of the hierarchy (the root's too) as dxtbx writes one: its frame, no pixels, empty fields. */
static json_t *group_json(const char *name, const double f[3], const double s[3], const double o[3])
{
    static const double zero[3] = {0, 0, 0};
    static const int none[2] = {0, 0};
    return panel_json(name, "", f, s, o, none, 0, 0, zero, zero, 0, "", 0, 1, 0, "SimplePxMmStrategy");
}

/* Panel k of a multi-panel detector with its vectors in the frame G (NULL: the laboratory's), its own sensor where it
 * has one (nbg_panels_from_report gives such a panel its attenuation length), where its pixels start in an image
 * file that is one array (the Pilatus 12M's, a Timepix quad's). */
static json_t *sensor_json(const nbg_geometry *g, const nbg_panel *p, int k, const double *G, const double trusted[2])
{
    double f[3], sl[3], o[3];
    to_frame(G, p->fast, p->slow, p->origin, f, sl, o);
    char name[48];
    if (p->name[0] != '\0')
        snprintf(name, sizeof name, "%.31s", p->name);
    else
        snprintf(name, sizeof name, "panel %d", k);
    const double pk[2] = {p->pixel, p->pixel};
    const double th = p->thick > 0 ? p->thick / 1000.0 : g->thickness;
    const double mu = p->thick_abs > 0 ? 1000.0 / p->thick_abs : g->mu;
    /* a panel's own gain and pedestal (a DIALS list's, or the fit's per-panel response), else the detector's */
    const double gain = p->own_response ? p->response.gain : g->gain;
    const double pedestal = p->own_response ? p->response.pedestal : g->pedestal;
    return panel_json(name, "SENSOR_PAD", f, sl, o, p->raw_offset, p->fpixels, p->spixels, pk, trusted, th,
                      g->material, mu, gain, pedestal,
                      th > 0 && mu > 0 ? "ParallaxCorrectedPxMmStrategy" : "SimplePxMmStrategy");
}

/* The detector's JSON: its panels and the hierarchy's root (its frame R, as a list gave it, or NULL: the identity, and
 * the empty fields DIALS writes for it) over children; NULL when any is NULL or memory is short (every reference given
 * is taken). */
static json_t *detector_doc(json_t *list, json_t *children, const double *R)
{
    static const double ex[3] = {1, 0, 0}, ey[3] = {0, 1, 0}, zero[3] = {0, 0, 0};
    json_t *root = list != NULL && children != NULL
                       ? group_json("", R != NULL ? R : ex, R != NULL ? R + 3 : ey, R != NULL ? R + 9 : zero)
                       : NULL;
    if (root == NULL || json_object_set_new(root, "children", children) != 0) { /* it takes children, failing too */
        if (root == NULL)
            json_decref(children);
        json_decref(root);
        json_decref(list);
        return NULL;
    }
    return json_pack("{s:o, s:o}", "panels", list, "hierarchy", root);
}

/* Node i of t as a group of the hierarchy (its frame in its parent's, the root's R where it has none, NULL: the
 * laboratory; its children), or NULL when memory is short. */
static json_t *hier_json(const hier_tree *t, const nbg_panel *panels, int i, const double *R)
{
    const hier_node *q = &t->node[i];
    double G[12], P[12], f[3], s[3], o[3];
    group_unit_frame(&panels[q->first], q->level, G);
    if (q->parent >= 0)
        group_unit_frame(&panels[t->node[q->parent].first], t->node[q->parent].level, P);
    to_frame(q->parent >= 0 ? P : R, G, G + 3, G + 9, f, s, o);
    char name[48];
    snprintf(name, sizeof name, "level %d group %d", q->level, q->id);
    json_t *node = group_json(name, f, s, o);
    json_t *kids = json_array();
    for (int c = 0; node != NULL && kids != NULL && c < q->nkids; ++c) {
        const int k = q->kid[c];
        json_t *ch = k >= 0 ? json_pack("{s:i}", "panel", k) : hier_json(t, panels, -k - 1, R);
        if (ch == NULL || json_array_append_new(kids, ch) != 0) {
            json_decref(kids);
            kids = NULL;
        }
    }
    if (node == NULL || kids == NULL || json_object_set_new(node, "children", kids) != 0) {
        json_decref(node);
        return NULL;
    }
    return node;
}

/* The frame of the list's group (at some level below the root) that holds exactly the panels of panel k's motion
 * group, when the panels carry their groups' frames: 1 and G, or 0. */
static int same_panels_frame(const nbg_panel *panels, int npanels, int k, double G[12])
{
    for (int l = NBG_PANEL_LEVELS - 1; l >= 1; --l) {
        const int id = panels[k].level_group[l];
        if (id < 0 || !level_unit_frame(&panels[k], l, G))
            continue;
        int same = 1;
        for (int j = 0; same && j < npanels; ++j)
            same = (panels[j].level_group[l] == id) == (panels[j].group == panels[k].group);
        if (same)
            return 1;
    }
    return 0;
}

static json_t *detector_json_dxtbx(const nbg_geometry *g, const nbg_panel *panels, int npanels);

/* The detector as dxtbx writes it, with how nbgrad rendered its sensor (a model and its layers) under a key of
 * nbgrad's own, which dxtbx ignores (nbgrad reads it back: the same image). */
static json_t *detector_json(const nbg_geometry *g, const nbg_panel *panels, int npanels)
{
    json_t *d = detector_json_dxtbx(g, panels, npanels);
    /* the detector's sensor, or only the panels' own */
    const int sensor = g->thickness > 0 || nbgi_panels_own_sensor(panels, npanels);
    if (d == NULL || g->sensor_model == 0 || g->sensor_layers < 1 || !sensor)
        return d;
    json_t *s = json_pack("{s:s, s:i}", "model", g->sensor_model == NBG_SENSOR_NANOBRAGG ? "nanobragg" : "physical",
                          "layers", (json_int_t)g->sensor_layers);
    if (s == NULL || json_object_set_new(d, "nbgrad_sensor", s) != 0) {
        json_decref(d);
        return NULL;
    }
    return d;
}

static json_t *detector_json_dxtbx(const nbg_geometry *g, const nbg_panel *panels, int npanels)
{
    static const int no_offset[2] = {0, 0};
    /* DIALS's parallax correction needs both the thickness and mu; without either it uses the simple mapping. */
    const char *strategy =
        g->thickness > 0 && g->mu > 0 ? "ParallaxCorrectedPxMmStrategy" : "SimplePxMmStrategy";
    const double pixel[2] = {g->pixel_f, g->pixel_s};
    /* The lower end: dxtbx masks values at or below it; -1 is what it uses for counting detectors, and nbgrad's
     * images (pedestal included) never go below 0. */
    const double trusted[2] = {-1, isnan(g->saturation) ? EXPT_NO_SATURATION : g->saturation};
    /* the panels' groups (nbg_panel.group: a layout's modules) become groups of the hierarchy, as dxtbx writes a
     * detector of modules: each group in its first panel's frame (relative to the root's identity), its panels'
     * vectors in that frame.  Without a group of two or more panels, every panel is the root's child, in the lab
     * frame (the root's). */
    const int n = npanels > 0 ? npanels : 1;
    /* the root's frame as a list gave it (its level 0 group's), else the identity */
    double root[12];
    const double *R = npanels > 1 && level_unit_frame(&panels[0], 0, root) ? root : NULL;
    hier_tree tree;
    if (npanels > 1 && hier_build(panels, npanels, &tree)) {
        /* several levels (a list's hierarchy read, a layout's quadrants and modules): written as they are, each group
         * in its own frame as the list gave it (else its first panel's) relative to its parent group's, each panel
         * in its group's */
        json_t *list = json_array(), *kids = json_array();
        for (int k = 0; list != NULL && k < npanels; ++k) {
            double G[12];
            if (tree.owner[k] >= 0)
                group_unit_frame(&panels[tree.node[tree.owner[k]].first], tree.node[tree.owner[k]].level, G);
            json_t *panel = sensor_json(g, &panels[k], k, tree.owner[k] >= 0 ? G : R, trusted);
            if (panel == NULL || json_array_append_new(list, panel) != 0) {
                json_decref(list);
                list = NULL;
            }
        }
        for (int c = 0; kids != NULL && c < tree.nroot; ++c) {
            const int k = tree.root[c];
            json_t *ch = k >= 0 ? json_pack("{s:i}", "panel", k) : hier_json(&tree, panels, -k - 1, R);
            if (ch == NULL || json_array_append_new(kids, ch) != 0) {
                json_decref(kids);
                kids = NULL;
            }
        }
        hier_free(&tree);
        return detector_doc(list, kids, R);
    }
    int maxg = -1, grouped = 0;
    int *count = NULL;
    for (int k = 0; k < npanels; ++k) maxg = panels[k].group > maxg ? panels[k].group : maxg;
    if (npanels > 1 && maxg >= 1 && maxg < npanels && (count = calloc((size_t)maxg + 1, sizeof *count)) != NULL) {
        grouped = 1;
        for (int k = 0; k < npanels; ++k) {
            if (panels[k].group < 0) {
                grouped = 0;
            } else {
                ++count[panels[k].group];
            }
        }
        int big = 0;
        for (int q = 0; q <= maxg; ++q) big |= count[q] >= 2;
        grouped &= big;
    }
    /* each group's frame: unit fast, slow, their normal, origin (the list's group of the same panels, else the first
     * panel's) */
    double (*gf)[12] = grouped ? calloc((size_t)maxg + 1, sizeof *gf) : NULL;
    if (grouped && gf == NULL) {
        free(count);
        return NULL;
    }
    for (int q = 0; grouped && q <= maxg; ++q) {
        for (int k = 0; k < npanels; ++k) {
            if (panels[k].group == q) {
                if (!same_panels_frame(panels, npanels, k, gf[q]))
                    panel_unit_frame(&panels[k], gf[q]);
                break;
            }
        }
    }
    json_t *list = json_array(), *children = json_array();
    json_t **gch = grouped ? calloc((size_t)maxg + 1, sizeof *gch) : NULL;
    if (grouped && gch == NULL) { /* out of memory: no detector (the caller reports it) */
        json_decref(list);
        json_decref(children);
        list = children = NULL;
    }
    for (int q = 0; gch != NULL && q <= maxg; ++q) {
        gch[q] = count[q] > 0 ? json_array() : NULL;
    }
    for (int k = 0; list != NULL && children != NULL && k < n; ++k) {
        json_t *panel;
        if (npanels == 0) {
            panel = panel_json("Panel", "SENSOR_PAD", g->fast, g->slow, g->origin, no_offset, g->fpixels,
                               g->spixels, pixel, trusted, g->thickness, g->material, g->mu, g->gain, g->pedestal,
                               strategy);
        } else {
            panel = sensor_json(g, &panels[k], k, grouped ? gf[panels[k].group] : R, trusted);
        }
        json_t *parent = grouped ? gch[panels[k].group] : children;
        if (panel == NULL || json_array_append_new(list, panel) != 0 || parent == NULL ||
            json_array_append_new(parent, json_pack("{s:i}", "panel", k)) != 0) {
            json_decref(list);
            json_decref(children);
            list = children = NULL;
        }
    }
    /* the groups, each with its panels, under the root */
    for (int q = 0; grouped && q <= maxg; ++q) {
        if (gch == NULL || gch[q] == NULL) {
            continue;
        }
        char name[48];
        snprintf(name, sizeof name, "group %d", q);
        double f[3], s[3], o[3];
        to_frame(R, gf[q], gf[q] + 3, gf[q] + 9, f, s, o);
        json_t *node = children == NULL ? NULL : group_json(name, f, s, o);
        if (node == NULL) {
            json_decref(gch[q]); /* json_object_set_new takes it otherwise, failing or not */
        }
        if (node == NULL || json_object_set_new(node, "children", gch[q]) != 0 ||
            json_array_append_new(children, node) != 0) {
            json_decref(children);
            json_decref(list);
            list = children = NULL;
        }
        gch[q] = NULL;
    }
    for (int q = 0; gch != NULL && q <= maxg; ++q) json_decref(gch[q]);
    free(gch);
    free(gf);
    free(count);
    return detector_doc(list, children, R);
}

/* The beam as dxtbx writes it; nbgrad's sampling of the divergence and the spectrum (the fields set) under a key of
 * nbgrad's own, which dxtbx ignores. */
static json_t *beam_json(const nbg_geometry *g)
{
    json_t *b = json_pack("{s:o, s:f, s:f, s:f, s:o, s:f, s:f, s:f}", "direction", reals(g->direction, 3),
                          "wavelength", g->wavelength, "divergence", 0.0, "sigma_divergence", 0.0,
                          "polarization_normal", reals(g->polarization_normal, 3), "polarization_fraction",
                          g->polarization_fraction, "flux", 0.0, "transmission", 1.0);
    if (b == NULL || !g->has_beam_sampling)
        return b;
    json_t *s = json_object();
    const struct {
        const char *key;
        double v;
    } reals_set[] = {{"hdivrange", g->hdivrange}, {"vdivrange", g->vdivrange}, {"hdivstep", g->hdivstep},
                     {"vdivstep", g->vdivstep}, {"dispersion", g->dispersion}};
    const struct {
        const char *key;
        int v;
    } counts[] = {{"hdivsteps", g->hdivsteps}, {"vdivsteps", g->vdivsteps}, {"dispsteps", g->dispsteps},
                  {"round_div", g->round_div}};
    int bad = s == NULL;
    for (size_t k = 0; !bad && k < sizeof reals_set / sizeof reals_set[0]; ++k)
        if (!isnan(reals_set[k].v))
            bad |= json_object_set_new(s, reals_set[k].key, json_real(reals_set[k].v)) != 0;
    for (size_t k = 0; !bad && k < sizeof counts / sizeof counts[0]; ++k)
        if (counts[k].v != -1)
            bad |= json_object_set_new(s, counts[k].key, json_integer(counts[k].v)) != 0;
    if (bad || json_object_set_new(b, "nbgrad_sampling", s) != 0) {
        json_decref(b);
        return NULL;
    }
    return b;
}

static json_t *scan_json(const nbg_geometry *g)
{
    json_t *exposure = json_array(), *epochs = json_array();
    /* nbgrad knows no clock: the epochs are the images' start times had they been taken back to back from 0,
     * which keeps them increasing as DIALS expects of a sequence. */
    for (int i = 0; exposure != NULL && epochs != NULL && i < g->nframes; ++i) {
        if (json_array_append_new(exposure, json_real(g->exposure)) != 0 ||
            json_array_append_new(epochs, json_real(i * g->exposure)) != 0) {
            json_decref(exposure);
            json_decref(epochs);
            exposure = epochs = NULL;
        }
    }
    const double osc[2] = {g->scan_start, g->scan_width};
    return json_pack("{s:o, s:i, s:o, s:o, s:o, s:{}}", "image_range", ints2(1, g->nframes), "batch_offset", 0,
                     "oscillation", reals(osc, 2), "exposure_time", exposure, "epochs", epochs,
                     "valid_image_ranges");
}

/* The crystal as dxtbx's Crystal.to_dict writes it; nbgrad's mosaic domains (spread, count, seed and the frame their
 * axes were drawn in) under a key of nbgrad's own, which dxtbx ignores, so that nbgrad renders the list as it
 * rendered the experiment. */
static json_t *crystal_json(const nbg_geometry *g, const double rs[9])
{
    json_t *c = json_pack("{s:s, s:o, s:o, s:o, s:s}", "__id__", "crystal", "real_space_a", reals(rs, 3),
                          "real_space_b", reals(rs + 3, 3), "real_space_c", reals(rs + 6, 3),
                          "space_group_hall_symbol", g->space_group);
    if (c != NULL && g->scan_real_space != NULL && g->nframes >= 1) {
        /* a scan-varying crystal: A = (a b c)^-1 at each image boundary, as dials.refine writes it; under a
         * multi-axis goniometer in its frame, as the static crystal (goniometer_json), which the reader folds back */
        json_t *sv = json_array();
        nbg_goniometer gn = g->goniometer;
        int ok = sv != NULL && json_object_set_new(c, "A_at_scan_points", sv) == 0 &&
                 (gn.naxes <= 0 || nbg_goniometer_derive(NULL, &gn, "") == NBG_OK);
        for (int k = 0; ok && k <= g->nframes; ++k) {
            double A[9], v[9];
            const double *pt = g->scan_real_space + 9 * (size_t)k;
            if (gn.naxes > 0) {
                nbgi_goniometer_unfold(&gn, pt, v);
                pt = v;
            }
            ok = nbgi_inverse3(pt, A) && json_array_append_new(sv, reals(A, 9)) == 0;
        }
        if (!ok) {
            json_decref(c);
            return NULL;
        }
    }
    if (c != NULL && g->has_mosaic) {
        json_t *m = json_pack("{s:f, s:i, s:I, s:o}", "spread_deg", g->mosaic_spread, "domains", g->mosaic_domains,
                              "seed", (json_int_t)g->mosaic_seed, "frame", reals(g->mosaic_frame, 9));
        /* the domains' own turns, a rotation each */
        json_t *turns = g->ndomain_turns > 0 && m != NULL ? json_array() : NULL;
        for (int k = 0; turns != NULL && k < g->ndomain_turns; ++k) {
            if (json_array_append_new(turns, reals(g->domain_turn[k], 9)) != 0) {
                json_decref(turns);
                turns = NULL;
            }
        }
        if (m == NULL || (g->ndomain_turns > 0 && (turns == NULL || json_object_set_new(m, "turns", turns) != 0)) ||
            json_object_set_new(c, "nbgrad_mosaic", m) != 0) {
            json_decref(c);
            return NULL;
        }
    }
    return c;
}

/* The goniometer as dxtbx writes it, and the crystal's vectors in its frame (rs).  A single-axis goniometer: the
 * laboratory's axis with identity fixed and setting rotations (the reader folded them into the axis and the crystal),
 * the crystal as it is.  A multi-axis one (g->goniometer): its axes, angles, names and scan axis, the scan axis as
 * the list had it unless the laboratory's axis moved (a refined spindle: then S^T axis), the crystal as the list had
 * it unless it moved (then (S F)^T real_space); "as it had it" when the fold the reader makes gives g's axis and
 * crystal bit for bit, so that a list read and written back is the same list.  NULL when memory is short. */
static json_t *goniometer_json(const nbg_geometry *g, double rs[9])
{
    memcpy(rs, g->real_space, sizeof g->real_space);
    if (g->goniometer.naxes <= 0)
        return json_pack("{s:o, s:o, s:o}", "rotation_axis", reals(g->axis, 3), "fixed_rotation", identity9(),
                         "setting_rotation", identity9());
    nbg_goniometer gn;
    nbgi_goniometer_written(g, &gn); /* checked by nbgi_geometry_check before */
    const int k = gn.scan_axis;
    double lab[9];
    if (g->has_crystal) {
        nbgi_goniometer_fold(&gn, gn.crystal, lab);
        if (memcmp(lab, g->real_space, sizeof lab) == 0)
            memcpy(rs, gn.crystal, sizeof gn.crystal);
        else
            nbgi_goniometer_unfold(&gn, g->real_space, rs);
    }
    json_t *axes = json_array(), *angles = json_array(), *names = json_array();
    int ok = axes != NULL && angles != NULL && names != NULL;
    for (int i = 0; ok && i < gn.naxes; ++i)
        ok = json_array_append_new(axes, reals(gn.axes[i], 3)) == 0 &&
             json_array_append_new(angles, json_real(gn.angles[i])) == 0 &&
             json_array_append_new(names, json_string(gn.names[i])) == 0;
    if (!ok) {
        json_decref(axes);
        json_decref(angles);
        json_decref(names);
        return NULL;
    }
    return json_pack("{s:o, s:o, s:o, s:i}", "axes", axes, "angles", angles, "names", names, "scan_axis", k);
}

/* 1 when name ends in an HDF5 extension (NXmx: one file holds every frame). */
static int is_hdf5_name(const char *name)
{
    static const char *ext[] = {".nxs", ".h5", ".hdf5", ".nx5"};
    const size_t n = strlen(name);
    for (size_t i = 0; i < sizeof ext / sizeof ext[0]; ++i) {
        const size_t m = strlen(ext[i]);
        if (n > m && strcasecmp(name + n - m, ext[i]) == 0)
            return 1;
    }
    return 0;
}

/* The absolute form of path as Python's os.path.abspath makes it (the current directory joined, then ".", ".."
 * and repeated slashes removed textually; the file need not exist yet).  DIALS writes absolute image paths and
 * resolves a relative one against the .expt's directory, not the current one, so a relative name would point
 * elsewhere as soon as the .expt is not in the current directory.  malloc'd; NULL when out of memory or when
 * the current directory cannot be named. */
static char *abspath(const char *path)
{
    char *cwd = NULL;
    if (path[0] != '/') {
        cwd = getcwd(NULL, 0);
        if (cwd == NULL)
            return NULL;
    }
    const size_t len = (cwd != NULL ? strlen(cwd) + 1 : 0) + strlen(path) + 2;
    char *joined = malloc(len), *out = malloc(len);
    if (joined == NULL || out == NULL) {
        free(cwd);
        free(joined);
        free(out);
        return NULL;
    }
    snprintf(joined, len, "%s%s%s", cwd != NULL ? cwd : "", cwd != NULL ? "/" : "", path);
    free(cwd);
    size_t n = 0;
    for (char *p = joined; *p != '\0';) {
        while (*p == '/')
            ++p;
        char *e = p;
        while (*e != '/' && *e != '\0')
            ++e;
        const size_t m = (size_t)(e - p);
        if (m == 0 || (m == 1 && p[0] == '.')) {
            /* nothing */
        } else if (m == 2 && p[0] == '.' && p[1] == '.') {
            while (n > 0 && out[n - 1] != '/')
                --n;
            if (n > 0)
                --n; /* drop the slash too; at the root ".." stays at the root */
        } else {
            out[n++] = '/';
            memcpy(out + n, p, m);
            n += m;
        }
        p = e;
    }
    if (n == 0)
        out[n++] = '/';
    out[n] = '\0';
    free(joined);
    return out;
}

/* The image set as DIALS writes an ImageSequence: an NXmx file is one "template" with the 0-based indices of its
 * frames (single_file_indices); a file series is a template with '#' for the frame number. */
/* A still: a geometry whose source stated no scan, of one image of width 0 from 0, with the default axis (a
 * goniometer a caller set is kept) */
static int is_still(const nbg_geometry *g)
{
    return g->scan_stated == 0 && g->nframes == 1 && g->scan_width == 0 && g->scan_start == 0 && g->axis[0] == 1 &&
           g->axis[1] == 0 && g->axis[2] == 0;
}

static json_t *imageset_json(const nbg_geometry *g, const char *template_abs, int hdf5)
{
    /* a still: DIALS's ImageSet, the file named as it is (an NXmx file with its image's index) */
    json_t *set = is_still(g) ? json_pack("{s:s, s:[s]}", "__id__", "ImageSet", "images", template_abs)
                              : json_pack("{s:s, s:s}", "__id__", "ImageSequence", "template", template_abs);
    if (set == NULL)
        return NULL;
    if (hdf5) {
        json_t *idx = json_array();
        for (int i = 0; idx != NULL && i < g->nframes; ++i) {
            if (json_array_append_new(idx, json_integer(i)) != 0) {
                json_decref(idx);
                idx = NULL;
            }
        }
        if (idx == NULL || json_object_set_new(set, "single_file_indices", idx) != 0) {
            json_decref(set);
            return NULL;
        }
    }
    static const char *lookups[] = {"mask", "gain", "pedestal", "dx", "dy"};
    for (size_t i = 0; i < sizeof lookups / sizeof lookups[0]; ++i) {
        if (json_object_set_new(set, lookups[i], json_null()) != 0) {
            json_decref(set);
            return NULL;
        }
    }
    /* dxtbx's format option that makes the list's panels the image's modules (dials.import multi_panel=True) */
    json_t *params = g->multi_panel ? json_pack("{s:b}", "multi_panel", 1) : json_object();
    if (json_object_set_new(set, "params", params) != 0) {
        json_decref(set);
        return NULL;
    }
    return set;
}

/* The whole list, keys in the order dxtbx writes them.  NULL when out of memory. */
static json_t *experiment_list_json(const nbg_geometry *g, const nbg_panel *panels, int npanels,
                                    const char *template_abs, int hdf5)
{
    const int still = is_still(g);
    json_t *expt = still ? json_pack("{s:s, s:s, s:i, s:i}", "__id__", "Experiment", "identifier", "", "beam", 0,
                                     "detector", 0)
                         : json_pack("{s:s, s:s, s:i, s:i, s:i, s:i}", "__id__", "Experiment", "identifier", "",
                                     "beam", 0, "detector", 0, "goniometer", 0, "scan", 0);
    json_t *imagesets = json_array(), *crystals = json_array();
    json_t *root = NULL;
    double rs[9];
    json_t *gon = still ? NULL : goniometer_json(g, rs);
    if (still)
        memcpy(rs, g->real_space, sizeof rs);
    int ok = expt != NULL && imagesets != NULL && crystals != NULL && (still || gon != NULL);
    if (ok && g->has_crystal)
        ok = json_object_set_new(expt, "crystal", json_integer(0)) == 0 &&
             json_array_append_new(crystals, crystal_json(g, rs)) == 0;
    if (ok && template_abs != NULL)
        ok = json_object_set_new(expt, "imageset", json_integer(0)) == 0 &&
             json_array_append_new(imagesets, imageset_json(g, template_abs, hdf5)) == 0;
    if (ok && still) {
        root = json_pack("{s:s, s:[o], s:o, s:[o], s:[o], s:[], s:[], s:o, s:[], s:[]}", "__id__", "ExperimentList",
                         "experiment", expt, "imageset", imagesets, "beam", beam_json(g), "detector",
                         detector_json(g, panels, npanels), "goniometer", "scan", "crystal", crystals, "profile",
                         "scaling_model");
        return root;
    }
    if (ok) {
        root = json_pack("{s:s, s:[o], s:o, s:[o], s:[o], s:[o], s:[o], s:o, s:[], s:[]}", "__id__",
                         "ExperimentList", "experiment", expt, "imageset", imagesets, "beam", beam_json(g),
                         "detector", detector_json(g, panels, npanels), "goniometer", gon, "scan", scan_json(g),
                         "crystal", crystals, "profile", "scaling_model");
        return root; /* json_pack consumed every "o" reference, on failure too */
    }
    json_decref(expt);
    json_decref(imagesets);
    json_decref(crystals);
    json_decref(gon);
    return NULL;
}

int nbgi_write_expt_panels_set(nbg_ctx *ctx, nbgi_outset *set, const char *path, const nbg_geometry *g,
                               const nbg_panel *panels, int npanels, const char *images)
{
    if (path == NULL || path[0] == '\0')
        return nbgi_error(ctx, NBG_EINVAL, "writing an experiment list: no file name");
    char what[1200];
    snprintf(what, sizeof what, "writing %s", path);
    int rc = nbgi_geometry_check(ctx, g, what);
    if (rc != NBG_OK)
        return rc;
    if ((rc = nbgi_panels_check(ctx, g, panels, npanels, what)) != NBG_OK)
        return rc;
    if ((rc = nbgi_check_bytes(ctx, 2048.0 * npanels, "the experiment list's panels")) != NBG_OK)
        return rc;
    /* The JSON's size grows with the frame count (exposure, epochs and indices per frame, about 80 bytes each
     * in jansson's tree and the text), so it goes through the memory limit like any input-sized allocation. */
    rc = nbgi_check_bytes(ctx, 200.0 * g->nframes + 65536.0, "the experiment list's per-image scan entries");
    if (rc != NBG_OK)
        return rc;

    char *template_abs = NULL;
    int hdf5 = 0;
    if (images != NULL && images[0] != '\0') {
        hdf5 = is_hdf5_name(images);
        /* A file series must name its frame digits; anything else would make DIALS look for one file. */
        if (!hdf5 && strchr(images, '#') == NULL && g->nframes > 1)
            return nbgi_error(ctx, NBG_EINVAL, "writing %s: the images %s of %d frames are neither an NXmx file "
                              "(.nxs, .h5) nor a template with '#' for the frame number", path, images, g->nframes);
        template_abs = abspath(images);
        if (template_abs == NULL)
            return nbgi_error(ctx, NBG_EIO, "writing %s: cannot make the image path %s absolute", path, images);
    }

    json_t *root = experiment_list_json(g, panels, npanels, template_abs, hdf5);
    free(template_abs);
    /* 17 significant digits: every double reads back to the same bits. */
    char *text = root != NULL ? json_dumps(root, JSON_INDENT(2) | JSON_REAL_PRECISION(17)) : NULL;
    json_decref(root);
    if (text == NULL)
        return nbgi_error(ctx, NBG_ENOMEM, "out of memory writing %s", path);

    nbgi_out o;
    rc = nbgi_out_open(ctx, path, &o);
    if (rc == NBG_OK)
        rc = nbgi_out_write(ctx, &o, text, strlen(text));
    if (rc == NBG_OK)
        rc = nbgi_out_write(ctx, &o, "\n", 1);
    if (rc == NBG_OK)
        rc = nbgi_out_finish(ctx, &o, set);
    free(text);
    return rc;
}

int nbgi_write_expt_set(nbg_ctx *ctx, nbgi_outset *set, const char *path, const nbg_geometry *g,
                        const char *images)
{
    return nbgi_write_expt_panels_set(ctx, set, path, g, NULL, 0, images);
}

int nbg_write_expt(nbg_ctx *ctx, const char *path, const nbg_geometry *g, const char *images)
{
    return nbgi_write_expt_set(ctx, NULL, path, g, images);
}

int nbg_write_expt_panels(nbg_ctx *ctx, const char *path, const nbg_geometry *g, const nbg_panel *panels,
                          int npanels, const char *images)
{
    return nbgi_write_expt_panels_set(ctx, NULL, path, g, panels, npanels, images);
}

/* ---------------------------------------------------------------------------------------------------------- */
/* Reading                                                                                                    */
/* ---------------------------------------------------------------------------------------------------------- */

/* Every failure names the file and the JSON path of the field, e.g. "x.expt: detector[0].panels[0].fast_axis:
 * expected 3 numbers". */
typedef struct {
    nbg_ctx *ctx;
    const char *file;
    nbg_panel **panels; /* nbg_read_expt_panels: every panel (malloc'd) and their count; NULL: one panel only */
    int *npanels;
    double **scan;      /* nbg_read_expt_scan_crystal: the scan-varying crystal's bases (malloc'd) and their count; */
    int *nscan;         /* NULL: not wanted */
} reader;

static int bad(const reader *r, const char *where, const char *key, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

static int bad(const reader *r, const char *where, const char *key, const char *fmt, ...)
{
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    const char *dot = where[0] != '\0' && key[0] != '\0' ? "." : "";
    if (where[0] == '\0' && key[0] == '\0') /* the document itself */
        return nbgi_error(r->ctx, NBG_EFORMAT, "%s: %s", r->file, msg);
    return nbgi_error(r->ctx, NBG_EFORMAT, "%s: %s%s%s: %s", r->file, where, dot, key, msg);
}

/* The member key of obj; NULL (and NBG_OK) when it is absent or null and optional, NBG_EFORMAT when required. */
static int member(const reader *r, json_t *obj, const char *where, const char *key, int required, json_t **out)
{
    *out = json_object_get(obj, key);
    if (*out != NULL && json_is_null(*out))
        *out = NULL;
    if (*out == NULL && required)
        return bad(r, where, key, "missing");
    return NBG_OK;
}

/* A number (a JSON integer or real; jansson admits no NaN or infinity). */
static int number(const reader *r, json_t *obj, const char *where, const char *key, int required, double *out)
{
    json_t *v;
    int rc = member(r, obj, where, key, required, &v);
    if (rc != NBG_OK || v == NULL)
        return rc;
    if (!json_is_number(v))
        return bad(r, where, key, "expected a number");
    *out = json_number_value(v);
    return NBG_OK;
}

/* An array of exactly n numbers. */
static int numbers(const reader *r, json_t *obj, const char *where, const char *key, int required, size_t n,
                   double *out)
{
    json_t *v;
    int rc = member(r, obj, where, key, required, &v);
    if (rc != NBG_OK || v == NULL)
        return rc;
    if (!json_is_array(v) || json_array_size(v) != n)
        return bad(r, where, key, "expected %zu numbers", n);
    for (size_t i = 0; i < n; ++i) {
        json_t *x = json_array_get(v, i);
        if (!json_is_number(x))
            return bad(r, where, key, "expected %zu numbers (element %zu is not a number)", n, i);
    }
    for (size_t i = 0; i < n; ++i)
        out[i] = json_number_value(json_array_get(v, i));
    return NBG_OK;
}

/* An array of exactly n integers within [lo, hi]. */
static int integers(const reader *r, json_t *obj, const char *where, const char *key, size_t n, json_int_t lo,
                    json_int_t hi, json_int_t *out)
{
    json_t *v;
    int rc = member(r, obj, where, key, 1, &v);
    if (rc != NBG_OK)
        return rc;
    if (!json_is_array(v) || json_array_size(v) != n)
        return bad(r, where, key, "expected %zu integers", n);
    for (size_t i = 0; i < n; ++i) {
        json_t *x = json_array_get(v, i);
        if (!json_is_integer(x) || json_integer_value(x) < lo || json_integer_value(x) > hi)
            return bad(r, where, key, "expected %zu integers from %lld to %lld", n, (long long)lo, (long long)hi);
        out[i] = json_integer_value(x);
    }
    return NBG_OK;
}

/* A string that fits in size bytes (with its terminator). */
static int string(const reader *r, json_t *obj, const char *where, const char *key, int required, char *out,
                  size_t size)
{
    json_t *v;
    int rc = member(r, obj, where, key, required, &v);
    if (rc != NBG_OK || v == NULL)
        return rc;
    if (!json_is_string(v))
        return bad(r, where, key, "expected a string");
    if (json_string_length(v) >= size || strlen(json_string_value(v)) != json_string_length(v))
        return bad(r, where, key, "the string is longer than %zu characters", size - 1);
    memcpy(out, json_string_value(v), json_string_length(v) + 1);
    return NBG_OK;
}

/* Scales v to unit length (a zero vector is refused: it has no direction). */
static int unit(const reader *r, const char *where, const char *key, double v[3])
{
    const double n = sqrt(v[0] * v[0] + v[1] * v[1] + v[2] * v[2]);
    if (!(n > 0) || !isfinite(n))
        return bad(r, where, key, "the vector (%g, %g, %g) has no direction", v[0], v[1], v[2]);
    for (int i = 0; i < 3; ++i)
        v[i] /= n;
    return NBG_OK;
}

/* The model name of experiment[0] (an index into the top-level list name, or the model itself inline).  *out is
 * NULL when the experiment has none; *mwhere receives the model's JSON path for messages. */
static int model(const reader *r, json_t *root, json_t *expt, const char *name, int required, json_t **out,
                 char *mwhere, size_t wsize)
{
    json_t *ref;
    int rc = member(r, expt, "experiment[0]", name, required, &ref);
    *out = NULL;
    if (rc != NBG_OK || ref == NULL)
        return rc;
    if (json_is_object(ref)) {
        snprintf(mwhere, wsize, "experiment[0].%s", name);
        *out = ref;
        return NBG_OK;
    }
    if (!json_is_integer(ref))
        return bad(r, "experiment[0]", name, "expected an index into the list \"%s\"", name);
    json_t *list = json_object_get(root, name);
    const json_int_t i = json_integer_value(ref);
    const size_t n = json_is_array(list) ? json_array_size(list) : 0;
    if (i < 0 || (size_t)i >= n)
        return bad(r, "experiment[0]", name, "index %lld is out of range (the list \"%s\" has %zu)", (long long)i,
                   name, n);
    snprintf(mwhere, wsize, "%s[%lld]", name, (long long)i);
    *out = json_array_get(list, (size_t)i);
    if (!json_is_object(*out))
        return bad(r, mwhere, "", "expected an object");
    return NBG_OK;
}

static int read_beam(const reader *r, json_t *b, const char *where, nbg_geometry *g)
{
    int rc;
    json_t *v;
    if ((rc = member(r, b, where, "direction", 0, &v)) != NBG_OK)
        return rc;
    if (v != NULL) {
        if ((rc = numbers(r, b, where, "direction", 1, 3, g->direction)) != NBG_OK ||
            (rc = unit(r, where, "direction", g->direction)) != NBG_OK ||
            (rc = number(r, b, where, "wavelength", 1, &g->wavelength)) != NBG_OK)
            return rc;
    } else if ((rc = member(r, b, where, "unit_s0", 0, &v)) == NBG_OK && v != NULL) {
        /* older lists: the unit vector along the travel, and the wavelength */
        double s[3];
        if ((rc = numbers(r, b, where, "unit_s0", 1, 3, s)) != NBG_OK ||
            (rc = unit(r, where, "unit_s0", s)) != NBG_OK ||
            (rc = number(r, b, where, "wavelength", 1, &g->wavelength)) != NBG_OK)
            return rc;
        for (int i = 0; i < 3; ++i)
            g->direction[i] = -s[i];
    } else {
        /* the oldest: s0 alone, along the travel with length 1/wavelength */
        double s[3];
        if ((rc = numbers(r, b, where, "s0", 0, 3, s)) != NBG_OK)
            return rc;
        if (json_object_get(b, "s0") == NULL)
            return bad(r, where, "direction", "missing (and no s0 either)");
        const double len = sqrt(s[0] * s[0] + s[1] * s[1] + s[2] * s[2]);
        if ((rc = unit(r, where, "s0", s)) != NBG_OK)
            return rc;
        for (int i = 0; i < 3; ++i)
            g->direction[i] = -s[i];
        g->wavelength = 1 / len;
    }
    if (!(g->wavelength > 0))
        return bad(r, where, "wavelength", "%g is not a positive wavelength", g->wavelength);
    /* dxtbx's defaults when a list lacks them */
    g->polarization_normal[0] = 0, g->polarization_normal[1] = 1, g->polarization_normal[2] = 0;
    g->polarization_fraction = 0.999;
    if ((rc = numbers(r, b, where, "polarization_normal", 0, 3, g->polarization_normal)) != NBG_OK ||
        (rc = unit(r, where, "polarization_normal", g->polarization_normal)) != NBG_OK ||
        (rc = number(r, b, where, "polarization_fraction", 0, &g->polarization_fraction)) != NBG_OK)
        return rc;
    /* nbgrad's sampling of the divergence and the spectrum, where nbgrad wrote the list */
    json_t *smp = json_object_get(b, "nbgrad_sampling");
    if (smp != NULL && !json_is_null(smp)) {
        char sw[128];
        snprintf(sw, sizeof sw, "%s.nbgrad_sampling", where);
        if (!json_is_object(smp))
            return bad(r, where, "nbgrad_sampling", "expected an object");
        const struct {
            const char *key;
            double *v;
        } rs[] = {{"hdivrange", &g->hdivrange}, {"vdivrange", &g->vdivrange}, {"hdivstep", &g->hdivstep},
                  {"vdivstep", &g->vdivstep}, {"dispersion", &g->dispersion}};
        for (size_t k = 0; k < sizeof rs / sizeof rs[0]; ++k)
            if ((rc = number(r, smp, sw, rs[k].key, 0, rs[k].v)) != NBG_OK)
                return rc;
        const struct {
            const char *key;
            int *v;
            int lo;
        } cs[] = {{"hdivsteps", &g->hdivsteps, 1}, {"vdivsteps", &g->vdivsteps, 1}, {"dispsteps", &g->dispsteps, 1},
                  {"round_div", &g->round_div, 0}};
        for (size_t k = 0; k < sizeof cs / sizeof cs[0]; ++k) {
            json_t *x = json_object_get(smp, cs[k].key);
            if (x == NULL)
                continue;
            if (!json_is_integer(x) || json_integer_value(x) < cs[k].lo || json_integer_value(x) > 1000000)
                return bad(r, sw, cs[k].key, "expected an integer from %d to 1000000", cs[k].lo);
            *cs[k].v = (int)json_integer_value(x);
        }
        g->has_beam_sampling = 1;
    }
    return NBG_OK;
}

/* The frame of a group of dxtbx's detector hierarchy in the laboratory: its unit fast and slow axes, their normal,
 * its origin (mm).  A child's vectors in the list are in its parent's frame (dxtbx's local frame): its
 * laboratory fast axis is F fx + S fy + N fz, its origin O + F ox + S oy + N oz. */
typedef struct {
    double f[3], s[3], n[3], o[3];
} lab_frame;

static const lab_frame identity_frame = {{1, 0, 0}, {0, 1, 0}, {0, 0, 1}, {0, 0, 0}};

/* A local vector v in frame P (a direction; with origin, a point). */
static void in_frame(const lab_frame *P, const double v[3], int point, double out[3])
{
    for (int i = 0; i < 3; ++i)
        out[i] = (point ? P->o[i] : 0) + P->f[i] * v[0] + P->s[i] * v[1] + P->n[i] * v[2];
}

/* The deepest hierarchy nbgrad follows (dxtbx's go a few levels deep; a hostile file cannot recurse without end). */
#define EXPT_MAX_DEPTH 32

/* The hierarchy's levels as the walk meets them: lv[k * NBG_PANEL_LEVELS + l] is panel k's group at level l (-3: a
 * group of its own, numbered at the end); path[l] the group being walked at depth l (-2: not numbered until it holds
 * a panel), count[l] the groups numbered at level l; depth[k] the depth of panel k's parent group. */
typedef struct {
    int *lv, *depth;
    int path[NBG_PANEL_LEVELS], count[NBG_PANEL_LEVELS];
    lab_frame gf[NBG_PANEL_LEVELS]; /* the laboratory frame of the group being walked at depth l */
    lab_frame *lvf;                 /* lvf[k * NBG_PANEL_LEVELS + l]: panel k's group's at level l (zero: none) */
} hier_walk;

/* Walks a group of the hierarchy: its frame in its parent's P, then its children, giving each panel it names its
 * parent's laboratory frame in frames[k] and owner[k] (0: not yet seen; 1: the root's; else 2 + the number of the
 * group, the groups that hold panels numbered from 0 in the order met, *ng of them), and its groups at each level
 * (w). */
static int walk_group(const reader *r, json_t *node, const char *where, const lab_frame *P, size_t np,
                      lab_frame *frames, int *owner, int is_root, int *ng, int depth, hier_walk *w)
{
    if (depth < NBG_PANEL_LEVELS) {
        w->path[depth] = depth == 0 ? 0 : -2;
    }
    int gid = is_root ? -1 : -2; /* -2: not numbered until it holds a panel */
    if (!json_is_object(node))
        return bad(r, where, "", "expected a group (an object)");
    if (depth > EXPT_MAX_DEPTH)
        return bad(r, where, "", "the hierarchy is deeper than %d groups", EXPT_MAX_DEPTH);
    double f[3], sl[3], o[3];
    int rc;
    if ((rc = numbers(r, node, where, "fast_axis", 1, 3, f)) != NBG_OK || (rc = unit(r, where, "fast_axis", f)) != NBG_OK ||
        (rc = numbers(r, node, where, "slow_axis", 1, 3, sl)) != NBG_OK ||
        (rc = unit(r, where, "slow_axis", sl)) != NBG_OK || (rc = numbers(r, node, where, "origin", 1, 3, o)) != NBG_OK)
        return rc;
    if (fabs(f[0] * sl[0] + f[1] * sl[1] + f[2] * sl[2]) > 1e-6)
        return bad(r, where, "slow_axis", "is not perpendicular to fast_axis");
    lab_frame G;
    in_frame(P, f, 0, G.f);
    in_frame(P, sl, 0, G.s);
    in_frame(P, o, 1, G.o);
    G.n[0] = G.f[1] * G.s[2] - G.f[2] * G.s[1];
    G.n[1] = G.f[2] * G.s[0] - G.f[0] * G.s[2];
    G.n[2] = G.f[0] * G.s[1] - G.f[1] * G.s[0];
    if (depth < NBG_PANEL_LEVELS) {
        w->gf[depth] = G;
    }
    json_t *children;
    if ((rc = member(r, node, where, "children", 0, &children)) != NBG_OK)
        return rc;
    if (children == NULL)
        return NBG_OK;
    if (!json_is_array(children))
        return bad(r, where, "children", "expected a list");
    for (size_t c = 0; c < json_array_size(children); ++c) {
        json_t *ch = json_array_get(children, c);
        char cw[256];
        snprintf(cw, sizeof cw, "%s.children[%zu]", where, c);
        json_t *pi = json_is_object(ch) ? json_object_get(ch, "panel") : NULL;
        if (pi == NULL) {
            if ((rc = walk_group(r, ch, cw, &G, np, frames, owner, 0, ng, depth + 1, w)) != NBG_OK)
                return rc;
            continue;
        }
        if (!json_is_integer(pi) || json_integer_value(pi) < 0 || (size_t)json_integer_value(pi) >= np)
            return bad(r, cw, "panel", "expected the index of one of the %zu panels", np);
        const size_t k = (size_t)json_integer_value(pi);
        if (owner[k] != 0)
            return bad(r, cw, "panel", "panel %zu is in the hierarchy twice", k);
        if (gid == -2)
            gid = (*ng)++;
        owner[k] = gid + 2;
        frames[k] = G;
        w->depth[k] = depth;
        for (int l = 0; l < NBG_PANEL_LEVELS; ++l) {
            if (l <= depth) {
                if (w->path[l] == -2)
                    w->path[l] = w->count[l]++;
                w->lv[k * NBG_PANEL_LEVELS + l] = w->path[l];
                w->lvf[k * NBG_PANEL_LEVELS + l] = w->gf[l];
            } else {
                w->lv[k * NBG_PANEL_LEVELS + l] = -3;
            }
        }
    }
    return NBG_OK;
}

/* Each panel's parent frame in the laboratory from the detector's hierarchy (dxtbx writes a panel's vectors in its
 * group's frame, and each group's in its parent's); without a hierarchy every panel's vectors are the lab's.
 * group[k]: the panel's parent group, numbered from 0 in the order met; a panel under the root (or in a list without
 * a hierarchy) is a group of its own, numbered after those; a group that holds only groups has no number.
 * lv[k * NBG_PANEL_LEVELS + l]: its group at level l (nbg_panel.level_group), lvf[...] that group's laboratory frame
 * (zero: none, or no hierarchy); *has_hier: whether the list has a hierarchy. */
static int panel_frames(const reader *r, json_t *d, const char *where, size_t np, lab_frame *frames, int *group,
                        int *lv, lab_frame *lvf, int *has_hier)
{
    hier_walk w;
    memset(&w, 0, sizeof w);
    w.lv = lv;
    w.lvf = lvf;
    memset(lvf, 0, sizeof *lvf * np * NBG_PANEL_LEVELS);
    *has_hier = 0;
    w.depth = calloc(np, sizeof(int));
    if (w.depth == NULL)
        return nbgi_error(r->ctx, NBG_ENOMEM, "out of memory for the %zu panels of %s", np, r->file);
    for (size_t k = 0; k < np; ++k) {
        frames[k] = identity_frame;
        group[k] = 0;
        for (int l = 0; l < NBG_PANEL_LEVELS; ++l)
            lv[k * NBG_PANEL_LEVELS + l] = l == 0 ? 0 : -3;
    }
    json_t *h;
    int rc = member(r, d, where, "hierarchy", 0, &h);
    int ng = 0;
    if (rc == NBG_OK && h != NULL) {
        *has_hier = 1;
        char hw[128];
        snprintf(hw, sizeof hw, "%s.hierarchy", where);
        rc = walk_group(r, h, hw, &identity_frame, np, frames, group, 1, &ng, 0, &w);
        for (size_t k = 0; rc == NBG_OK && k < np; ++k)
            if (group[k] == 0)
                rc = bad(r, hw, "", "panel %zu is in no group of the hierarchy", k);
    }
    for (size_t k = 0; rc == NBG_OK && k < np; ++k)
        group[k] = group[k] >= 2 ? group[k] - 2 : ng++;
    /* the levels: a panel nearer the root than a level is a group of its own there, numbered after the level's
     * groups; past the deepest panel's level, none */
    int deepest = 0;
    for (size_t k = 0; k < np; ++k)
        deepest = w.depth[k] > deepest ? w.depth[k] : deepest;
    for (int l = 1; rc == NBG_OK && l < NBG_PANEL_LEVELS; ++l)
        for (size_t k = 0; k < np; ++k)
            if (lv[k * NBG_PANEL_LEVELS + l] == -3)
                lv[k * NBG_PANEL_LEVELS + l] = l > deepest ? -1 : w.count[l]++;
    free(w.depth);
    return rc;
}

/* A panel's vectors, read in its parent's frame, into the laboratory's. */
static void panel_to_lab(const lab_frame *P, double fast[3], double slow[3], double origin[3])
{
    double f[3], sl[3], o[3];
    in_frame(P, fast, 0, f);
    in_frame(P, slow, 0, sl);
    in_frame(P, origin, 1, o);
    memcpy(fast, f, sizeof f);
    memcpy(slow, sl, sizeof sl);
    memcpy(origin, o, sizeof o);
}

/* How nbgrad rendered the sensor, where nbgrad wrote the list (detector_json) */
static int read_sensor(const reader *r, json_t *d, const char *where, nbg_geometry *g)
{
    json_t *s = json_object_get(d, "nbgrad_sensor");
    if (s == NULL || json_is_null(s))
        return NBG_OK;
    char sw[128];
    snprintf(sw, sizeof sw, "%s.nbgrad_sensor", where);
    if (!json_is_object(s))
        return bad(r, where, "nbgrad_sensor", "expected an object");
    const char *m = json_string_value(json_object_get(s, "model"));
    json_t *n = json_object_get(s, "layers");
    if (m == NULL || (strcmp(m, "nanobragg") != 0 && strcmp(m, "physical") != 0))
        return bad(r, sw, "model", "expected \"nanobragg\" or \"physical\"");
    if (!json_is_integer(n) || json_integer_value(n) < 1 || json_integer_value(n) > 1000000)
        return bad(r, sw, "layers", "expected an integer from 1 to 1000000");
    g->sensor_model = strcmp(m, "nanobragg") == 0 ? NBG_SENSOR_NANOBRAGG : NBG_SENSOR_PHYSICAL;
    g->sensor_layers = (int)json_integer_value(n);
    return NBG_OK;
}

static int read_detector(const reader *r, json_t *d, const char *where, nbg_geometry *g)
{
    json_t *panels;
    int rc = member(r, d, where, "panels", 1, &panels);
    if (rc == NBG_OK)
        rc = read_sensor(r, d, where, g);
    if (rc != NBG_OK)
        return rc;
    if (!json_is_array(panels))
        return bad(r, where, "panels", "expected a list of panels");
    const size_t np = json_array_size(panels);
    if (np == 0 || (np > 1 && r->panels == NULL))
        return nbgi_error(r->ctx, NBG_EFORMAT, "%s: %s has %zu panels; %s", r->file, where, np,
                          np == 0 ? "nbgrad needs one" : "nbg_read_expt reads one (nbg_read_expt_panels reads a multi-panel "
                          "detector)");
    if (np > 100000)
        return nbgi_error(r->ctx, NBG_EFORMAT, "%s: %s has %zu panels, too many", r->file, where, np);
    /* each panel's parent frame: the vectors in the list are in it (dxtbx's hierarchy of groups) */
    lab_frame *frames = malloc((sizeof *frames * (1 + NBG_PANEL_LEVELS) + sizeof(int) * (1 + NBG_PANEL_LEVELS)) * np);
    if (frames == NULL)
        return nbgi_error(r->ctx, NBG_ENOMEM, "out of memory for the %zu panels of %s", np, r->file);
    lab_frame *lvf = frames + np;
    int *group = (int *)(lvf + np * NBG_PANEL_LEVELS), *lv = group + np;
    int has_hier = 0;
    if ((rc = panel_frames(r, d, where, np, frames, group, lv, lvf, &has_hier)) != NBG_OK) {
        free(frames);
        return rc;
    }
    if (r->panels != NULL) {
        /* every panel, in the lab frame of the list (DIALS's), after panel 0 read into g as for one panel */
        nbg_panel *out = calloc(np, sizeof *out);
        if (out == NULL) {
            free(frames);
            return nbgi_error(r->ctx, NBG_ENOMEM, "out of memory for the %zu panels of %s", np, r->file);
        }
        const reader one = {r->ctx, r->file, NULL, NULL, NULL, NULL};
        nbg_geometry g0 = *g;
        int stated = 0; /* some panel states a gain or pedestal of its own */
        for (size_t k = 0; k < np; ++k) {
            json_t *dk = json_pack("{s:[O]}", "panels", json_array_get(panels, k));
            nbg_geometry gk = g0;
            char wk[96];
            snprintf(wk, sizeof wk, "%s(panel %zu)", where, k);
            int rk = dk == NULL ? nbgi_error(r->ctx, NBG_ENOMEM, "out of memory") : read_detector(&one, dk, wk, &gk);
            json_decref(dk);
            /* a sensor below 1e-6 mm is none (dxtbx refuses 0, so writers put a placeholder) */
            const int has0 = g0.thickness >= 1e-6, hask = gk.thickness >= 1e-6;
            if (rk == NBG_OK && k > 0 && gk.pixel_f != gk.pixel_s)
                rk = nbgi_error(r->ctx, NBG_EFORMAT, "%s: %s.panels[%zu]: nbgrad needs square pixels (%g x %g mm)",
                                r->file, where, k, gk.pixel_f, gk.pixel_s);
            else if (rk == NBG_OK && k > 0 && has0 && !hask)
                rk = nbgi_error(r->ctx, NBG_EFORMAT, "%s: %s.panels[%zu]: a panel without a sensor beside panels "
                                "with one (nbgrad gives a panel its own sensor, not none)", r->file, where, k);
            if (rk != NBG_OK) {
                free(out);
                free(frames);
                return rk;
            }
            panel_to_lab(&frames[k], gk.fast, gk.slow, gk.origin);
            out[k].fpixels = gk.fpixels;
            out[k].spixels = gk.spixels;
            out[k].pixel = gk.pixel_f;
            memcpy(out[k].fast, gk.fast, sizeof gk.fast);
            memcpy(out[k].slow, gk.slow, sizeof gk.slow);
            memcpy(out[k].origin, gk.origin, sizeof gk.origin);
            if (k > 0 && hask && (gk.thickness != g0.thickness || gk.mu != g0.mu)) {
                /* its own sensor (the experiment's is panel 0's) */
                out[k].thick = gk.thickness * 1000.0;
                out[k].thick_abs = gk.mu > 0 ? 1000.0 / gk.mu : 0;
            }
            json_t *pk = json_array_get(panels, k);
            if (json_object_get(pk, "raw_image_offset") != NULL) {
                /* where its pixels start in the image file's one array (dxtbx's raw_image_offset) */
                json_int_t off[2];
                char pw[128];
                snprintf(pw, sizeof pw, "%s.panels[%zu]", where, k);
                if ((rk = integers(r, pk, pw, "raw_image_offset", 2, 0, 1000000000, off)) != NBG_OK) {
                    free(out);
                    free(frames);
                    return rk;
                }
                out[k].raw_offset[0] = (int)off[0];
                out[k].raw_offset[1] = (int)off[1];
            }
            out[k].has_trusted = !isnan(gk.trusted[1]);
            out[k].trusted[0] = gk.trusted[0];
            out[k].trusted[1] = gk.trusted[1];
            out[k].response.pedestal = gk.pedestal;
            out[k].response.gain = gk.gain;
            stated |= gk.response_stated;
            out[k].group = group[k];
            memcpy(out[k].level_group, lv + k * NBG_PANEL_LEVELS, sizeof out[k].level_group);
            /* its groups' frames, as the list has them (the writer gives them back) */
            out[k].has_level_frames = has_hier;
            for (int l = 0; has_hier && l < NBG_PANEL_LEVELS; ++l) {
                const lab_frame *F = &lvf[k * NBG_PANEL_LEVELS + l];
                memcpy(out[k].level_frame[l], F->f, sizeof F->f);
                memcpy(out[k].level_frame[l] + 3, F->s, sizeof F->s);
                memcpy(out[k].level_frame[l] + 6, F->o, sizeof F->o);
            }
            json_t *name = json_object_get(json_array_get(panels, k), "name");
            snprintf(out[k].name, sizeof out[k].name, "%s", json_is_string(name) ? json_string_value(name) : "");
            if (k == 0)
                g0 = gk;
        }
        /* where some panel states its gain or pedestal, every panel's are what DIALS reads its counts with */
        for (size_t k = 0; k < np; ++k) {
            out[k].own_response = stated;
            if (!stated)
                memset(&out[k].response, 0, sizeof out[k].response);
        }
        g0.response_stated = stated;
        *g = g0;
        *r->panels = out;
        *r->npanels = (int)np;
        free(frames);
        return NBG_OK;
    }
    const lab_frame P = frames[0];
    free(frames);
    char pw[96];
    snprintf(pw, sizeof pw, "%s.panels[0]", where);
    json_t *p = json_array_get(panels, 0);
    if (!json_is_object(p))
        return bad(r, pw, "", "expected an object");
    double pixel[2] = {0, 0}, trusted[2] = {-1, NAN};
    json_int_t size[2];
    if ((rc = numbers(r, p, pw, "fast_axis", 1, 3, g->fast)) != NBG_OK ||
        (rc = unit(r, pw, "fast_axis", g->fast)) != NBG_OK ||
        (rc = numbers(r, p, pw, "slow_axis", 1, 3, g->slow)) != NBG_OK ||
        (rc = unit(r, pw, "slow_axis", g->slow)) != NBG_OK ||
        (rc = numbers(r, p, pw, "origin", 1, 3, g->origin)) != NBG_OK ||
        (rc = numbers(r, p, pw, "pixel_size", 1, 2, pixel)) != NBG_OK ||
        (rc = integers(r, p, pw, "image_size", 2, 1, 1000000000, size)) != NBG_OK ||
        (rc = numbers(r, p, pw, "trusted_range", 0, 2, trusted)) != NBG_OK ||
        (rc = number(r, p, pw, "thickness", 0, &g->thickness)) != NBG_OK ||
        (rc = number(r, p, pw, "mu", 0, &g->mu)) != NBG_OK ||
        (rc = string(r, p, pw, "material", 0, g->material, sizeof g->material)) != NBG_OK ||
        (rc = number(r, p, pw, "gain", 0, &g->gain)) != NBG_OK ||
        (rc = number(r, p, pw, "pedestal", 0, &g->pedestal)) != NBG_OK)
        return rc;
    panel_to_lab(&P, g->fast, g->slow, g->origin);
    g->pixel_f = pixel[0];
    g->pixel_s = pixel[1];
    g->fpixels = (int)size[0];
    g->spixels = (int)size[1];
    g->saturation = trusted[1] >= EXPT_NO_SATURATION ? NAN : trusted[1];
    g->trusted[0] = isnan(trusted[1]) ? NAN : trusted[0]; /* as stated (the default lower end otherwise is not) */
    g->trusted[1] = trusted[1];
    /* dxtbx writes gain 1 and pedestal 0 when nobody set them: only other values say how DIALS reads the counts */
    g->response_stated = g->gain != 1 || g->pedestal != 0;
    return NBG_OK;
}

/* A proper rotation (orthonormal rows, determinant +1) within 1e-6: anything else is not a goniometer setting. */
static int is_rotation(const double m[9])
{
    for (int i = 0; i < 3; ++i)
        for (int j = 0; j < 3; ++j) {
            const double d = m[3 * i] * m[3 * j] + m[3 * i + 1] * m[3 * j + 1] + m[3 * i + 2] * m[3 * j + 2];
            if (!(fabs(d - (i == j)) < 1e-6))
                return 0;
        }
    const double det = m[0] * (m[4] * m[8] - m[5] * m[7]) - m[1] * (m[3] * m[8] - m[5] * m[6]) +
                       m[2] * (m[3] * m[7] - m[4] * m[6]);
    return fabs(det - 1) < 1e-6;
}

/* The goniometer: g->axis = S axis, and F, S into fixed/setting for the crystal (see the top of the file). */
static int read_goniometer(const reader *r, json_t *gon, const char *where, nbg_geometry *g, double fixed[9],
                           double setting[9])
{
    static const double id[9] = {1, 0, 0, 0, 1, 0, 0, 0, 1};
    memcpy(fixed, id, sizeof id);
    memcpy(setting, id, sizeof id);
    int rc;
    json_t *axes;
    if ((rc = member(r, gon, where, "axes", 0, &axes)) != NBG_OK)
        return rc;
    if (axes != NULL) {
        /* dxtbx's MultiAxisGoniometer: axes from the innermost out; F = R(k-1) ... R(0), S = R(n-1) ... R(k+1)
         * for scan axis k, and the scan axis's own angle plays no part (the scan gives it).  Kept whole in
         * g->goniometer (the writer writes it back); nbg_goniometer_derive makes F and S. */
        nbg_goniometer *gn = &g->goniometer;
        json_t *angles, *scan_axis, *names;
        if (!json_is_array(axes) || json_array_size(axes) == 0 || json_array_size(axes) > NBG_GONIO_MAX_AXES)
            return bad(r, where, "axes", "expected a list of 1 to %d axes", NBG_GONIO_MAX_AXES);
        const size_t n = json_array_size(axes);
        if ((rc = member(r, gon, where, "angles", 1, &angles)) != NBG_OK ||
            (rc = member(r, gon, where, "scan_axis", 1, &scan_axis)) != NBG_OK ||
            (rc = member(r, gon, where, "names", 0, &names)) != NBG_OK)
            return rc;
        if (!json_is_array(angles) || json_array_size(angles) != n)
            return bad(r, where, "angles", "expected %zu numbers (one per axis)", n);
        if (names != NULL && (!json_is_array(names) || json_array_size(names) != n))
            return bad(r, where, "names", "expected %zu names (one per axis)", n);
        if (!json_is_integer(scan_axis) || json_integer_value(scan_axis) < 0 ||
            (size_t)json_integer_value(scan_axis) >= n)
            return bad(r, where, "scan_axis", "expected an axis index from 0 to %zu", n - 1);
        memset(gn, 0, sizeof *gn);
        gn->naxes = (int)n;
        gn->scan_axis = (int)json_integer_value(scan_axis);
        for (size_t i = 0; i < n; ++i) {
            json_t *a = json_array_get(axes, i), *an = json_array_get(angles, i);
            if (!json_is_array(a) || json_array_size(a) != 3 || !json_is_number(json_array_get(a, 0)) ||
                !json_is_number(json_array_get(a, 1)) || !json_is_number(json_array_get(a, 2)))
                return nbgi_error(r->ctx, NBG_EFORMAT, "%s: %s.axes[%zu]: expected 3 numbers", r->file, where, i);
            for (int j = 0; j < 3; ++j)
                gn->axes[i][j] = json_number_value(json_array_get(a, (size_t)j));
            const double len = sqrt(gn->axes[i][0] * gn->axes[i][0] + gn->axes[i][1] * gn->axes[i][1] +
                                    gn->axes[i][2] * gn->axes[i][2]);
            if (!(fabs(len - 1) <= 0.01))
                return nbgi_error(r->ctx, NBG_EFORMAT, "%s: %s.axes[%zu]: (%g, %g, %g) is not a unit vector (length "
                                  "%g; nbgrad takes an axis within 1 %% of unit length)", r->file, where, i,
                                  gn->axes[i][0], gn->axes[i][1], gn->axes[i][2], len);
            if (!json_is_number(an))
                return nbgi_error(r->ctx, NBG_EFORMAT, "%s: %s.angles[%zu]: expected a number", r->file, where, i);
            gn->angles[i] = json_number_value(an);
            if (!(fabs(gn->angles[i]) <= 1e6))
                return nbgi_error(r->ctx, NBG_EFORMAT, "%s: %s.angles[%zu]: %g is not a usable angle", r->file,
                                  where, i, gn->angles[i]);
            json_t *nm = names != NULL ? json_array_get(names, i) : NULL;
            if (nm != NULL && !json_is_string(nm))
                return nbgi_error(r->ctx, NBG_EFORMAT, "%s: %s.names[%zu]: expected a string", r->file, where, i);
            if (nm != NULL && (json_string_length(nm) >= sizeof gn->names[i] ||
                               strlen(json_string_value(nm)) != json_string_length(nm)))
                return nbgi_error(r->ctx, NBG_EFORMAT, "%s: %s.names[%zu]: the name is longer than %zu characters",
                                  r->file, where, i, sizeof gn->names[i] - 1);
            if (nm != NULL)
                memcpy(gn->names[i], json_string_value(nm), json_string_length(nm) + 1);
        }
        if ((rc = nbg_goniometer_derive(r->ctx, gn, r->file)) != NBG_OK)
            return NBG_EFORMAT;
        memcpy(fixed, gn->fixed, sizeof gn->fixed);
        memcpy(setting, gn->setting, sizeof gn->setting);
        nbgi_goniometer_axis(gn, g->axis);
        return NBG_OK;
    } else {
        if ((rc = numbers(r, gon, where, "rotation_axis", 1, 3, g->axis)) != NBG_OK ||
            (rc = unit(r, where, "rotation_axis", g->axis)) != NBG_OK ||
            (rc = numbers(r, gon, where, "fixed_rotation", 0, 9, fixed)) != NBG_OK ||
            (rc = numbers(r, gon, where, "setting_rotation", 0, 9, setting)) != NBG_OK)
            return rc;
        if (!is_rotation(fixed))
            return bad(r, where, "fixed_rotation", "not a rotation matrix");
        if (!is_rotation(setting))
            return bad(r, where, "setting_rotation", "not a rotation matrix");
    }
    nbgi_mat3_vec(setting, g->axis, g->axis);
    return NBG_OK;
}

static int read_scan(const reader *r, json_t *s, const char *where, nbg_geometry *g)
{
    json_int_t range[2];
    double osc[2] = {0, 0};
    char pw[96];
    int rc;
    if ((rc = integers(r, s, where, "image_range", 2, 0, 2000000000, range)) != NBG_OK)
        return rc;
    if (range[1] < range[0] || range[1] - range[0] >= 100000000)
        return bad(r, where, "image_range", "[%lld, %lld] is not a range of 1 to 100000000 images",
                   (long long)range[0], (long long)range[1]);
    g->nframes = (int)(range[1] - range[0] + 1);
    /* dxtbx's oscillation is the start and width of the first image of image_range, which is nbgrad's first
     * frame whatever its number. */
    json_t *props = json_object_get(s, "properties"), *exp;
    if (json_object_get(s, "oscillation") == NULL && json_is_object(props)) {
        /* newer dxtbx: per-image columns, the oscillation as each image's start and the width beside it */
        snprintf(pw, sizeof pw, "%s.properties", where);
        json_t *o = json_object_get(props, "oscillation"), *w = json_object_get(props, "oscillation_width");
        if (!json_is_array(o) || json_array_size(o) < 1 || !json_is_number(json_array_get(o, 0)))
            return bad(r, pw, "oscillation", "expected a list of numbers");
        osc[0] = json_number_value(json_array_get(o, 0));
        if (json_is_array(w) && json_array_size(w) >= 1)
            w = json_array_get(w, 0);
        if (!json_is_number(w))
            return bad(r, pw, "oscillation_width", "expected a number");
        osc[1] = json_number_value(w);
        exp = json_object_get(props, "exposure_time");
        where = pw;
    } else {
        if ((rc = numbers(r, s, where, "oscillation", 1, 2, osc)) != NBG_OK)
            return rc;
        exp = json_object_get(s, "exposure_time");
    }
    g->scan_start = osc[0];
    g->scan_width = osc[1];
    g->scan_stated = 2;
    /* a list (one per image; the first is taken) or, in old lists, one number */
    if (json_is_array(exp) && json_array_size(exp) >= 1)
        exp = json_array_get(exp, 0);
    if (exp != NULL && !json_is_null(exp)) {
        if (!json_is_number(exp))
            return bad(r, where, "exposure_time", "expected a list of numbers");
        g->exposure = json_number_value(exp);
    }
    return NBG_OK;
}

static int read_crystal(const reader *r, json_t *c, const char *where, nbg_geometry *g, const double fixed[9],
                        const double setting[9])
{
    int rc;
    if ((rc = numbers(r, c, where, "real_space_a", 1, 3, g->real_space)) != NBG_OK ||
        (rc = numbers(r, c, where, "real_space_b", 1, 3, g->real_space + 3)) != NBG_OK ||
        (rc = numbers(r, c, where, "real_space_c", 1, 3, g->real_space + 6)) != NBG_OK ||
        (rc = string(r, c, where, "space_group_hall_symbol", 0, g->space_group, sizeof g->space_group)) != NBG_OK)
        return rc;
    double sf[9];
    nbgi_mat3_mul(setting, fixed, sf);
    if (g->goniometer.naxes > 0) {
        /* the list's vectors kept (in the goniometer's frame), the laboratory's by the fold the writer uses */
        memcpy(g->goniometer.crystal, g->real_space, sizeof g->goniometer.crystal);
        nbgi_goniometer_fold(&g->goniometer, g->goniometer.crystal, g->real_space);
    } else {
        for (int i = 0; i < 3; ++i)
            nbgi_mat3_vec(sf, g->real_space + 3 * i, g->real_space + 3 * i);
    }
    g->has_crystal = 1;
    /* nbgrad's mosaic domains, where nbgrad wrote the list */
    json_t *m = json_object_get(c, "nbgrad_mosaic");
    if (m != NULL && !json_is_null(m)) {
        char mw[128];
        snprintf(mw, sizeof mw, "%s.nbgrad_mosaic", where);
        if (!json_is_object(m))
            return bad(r, where, "nbgrad_mosaic", "expected an object");
        if ((rc = number(r, m, mw, "spread_deg", 1, &g->mosaic_spread)) != NBG_OK ||
            (rc = numbers(r, m, mw, "frame", 1, 9, g->mosaic_frame)) != NBG_OK)
            return rc;
        json_t *dom = json_object_get(m, "domains"), *seed = json_object_get(m, "seed");
        if (!json_is_integer(dom) || json_integer_value(dom) < 1 || json_integer_value(dom) > 100000000)
            return bad(r, mw, "domains", "expected a count of domains from 1 to 100000000");
        if (!json_is_integer(seed) || json_integer_value(seed) < LONG_MIN || json_integer_value(seed) > LONG_MAX)
            return bad(r, mw, "seed", "expected an integer seed");
        if (!(g->mosaic_spread >= 0 && g->mosaic_spread <= 180))
            return bad(r, mw, "spread_deg", "%g is not a mosaic spread in [0, 180] deg", g->mosaic_spread);
        g->mosaic_domains = (int)json_integer_value(dom);
        g->mosaic_seed = (long)json_integer_value(seed);
        g->has_mosaic = 1;
        /* the domains' own turns: at most one a domain, each a rotation */
        json_t *turns = json_object_get(m, "turns");
        if (turns != NULL && !json_is_null(turns)) {
            const size_t nt = json_is_array(turns) ? json_array_size(turns) : 0;
            if (!json_is_array(turns) || nt > NBG_MAX_DOMAIN_TURNS || (json_int_t)nt > json_integer_value(dom))
                return bad(r, mw, "turns", "expected a list of at most %d rotations, one a domain (%d domains)",
                           NBG_MAX_DOMAIN_TURNS, g->mosaic_domains);
            for (size_t k = 0; k < nt; ++k) {
                json_t *t = json_array_get(turns, k);
                double *D = g->domain_turn[k];
                if (!json_is_array(t) || json_array_size(t) != 9)
                    return bad(r, mw, "turns", "element %zu: expected 9 numbers (a rotation)", k);
                for (size_t i = 0; i < 9; ++i) {
                    json_t *x = json_array_get(t, i);
                    if (!json_is_number(x))
                        return bad(r, mw, "turns", "element %zu: expected 9 numbers (a rotation)", k);
                    D[i] = json_number_value(x);
                }
                /* a rotation: D D^T = I and det D = 1, to the digits a writer keeps */
                double worst = 0;
                for (int i = 0; i < 3; ++i)
                    for (int j = 0; j < 3; ++j)
                        worst = fmax(worst, fabs(D[3 * i] * D[3 * j] + D[3 * i + 1] * D[3 * j + 1] +
                                                 D[3 * i + 2] * D[3 * j + 2] - (i == j)));
                const double det = D[0] * (D[4] * D[8] - D[5] * D[7]) - D[1] * (D[3] * D[8] - D[5] * D[6]) +
                                   D[2] * (D[3] * D[7] - D[4] * D[6]);
                if (!(worst < 1e-6) || !(fabs(det - 1) < 1e-6))
                    return bad(r, mw, "turns", "element %zu is not a rotation (|D D^T - I| %g, det %g)", k, worst,
                               det);
            }
            g->ndomain_turns = (int)nt;
        }
    }
    /* a scan-varying crystal: its per-image A matrices are counted here (nbg_geometry holds one crystal) and read
     * as bases by nbg_read_expt_scan_crystal */
    json_t *sv = json_object_get(c, "A_at_scan_points");
    if (sv != NULL && !json_is_null(sv)) {
        if (!json_is_array(sv))
            return bad(r, where, "A_at_scan_points", "expected a list of matrices");
        if (json_array_size(sv) > 1000000)
            return bad(r, where, "A_at_scan_points", "%zu matrices: more than a scan of a million images has",
                       json_array_size(sv));
        g->crystal_scan_points = (int)json_array_size(sv);
    }
    if (r->scan != NULL && g->crystal_scan_points > 0) {
        const size_t n = (size_t)g->crystal_scan_points;
        char what[96];
        snprintf(what, sizeof what, "the %zu A matrices of a scan-varying crystal", n);
        int rk = nbgi_check_bytes(r->ctx, (double)n * 9 * sizeof(double), what);
        if (rk != NBG_OK)
            return rk;
        double *bases = malloc(n * 9 * sizeof *bases);
        if (bases == NULL)
            return nbgi_error(r->ctx, NBG_ENOMEM, "out of memory for the %zu A matrices of %s", n, r->file);
        for (size_t k = 0; k < n; ++k) {
            json_t *Ak = json_array_get(sv, k);
            double A[9];
            char aw[128];
            snprintf(aw, sizeof aw, "%s.A_at_scan_points[%zu]", where, k);
            int ok = json_is_array(Ak) && json_array_size(Ak) == 9;
            for (size_t i = 0; ok && i < 9; ++i) {
                json_t *v = json_array_get(Ak, i);
                ok = json_is_number(v) && isfinite(A[i] = json_number_value(v));
            }
            /* A = (a* b* c*) as columns: the real-space vectors a, b, c are the rows of its inverse */
            double *R = bases + 9 * k;
            if (!ok || !nbgi_inverse3(A, R)) {
                free(bases);
                return bad(r, aw, "", ok ? "a singular matrix" : "expected 9 finite numbers");
            }
            for (int i = 0; i < 3; ++i) /* into the lab frame, as the static crystal's vectors above */
                nbgi_mat3_vec(sf, R + 3 * i, R + 3 * i);
        }
        *r->scan = bases;
        *r->nscan = (int)n;
    }
    return NBG_OK;
}

/* Everything after parsing; root is the parsed document. */
static int read_list(const reader *r, json_t *root, nbg_geometry *g)
{
    if (!json_is_object(root))
        return bad(r, "", "", "expected a JSON object (an ExperimentList)");
    json_t *id = json_object_get(root, "__id__"), *list = json_object_get(root, "experiment");
    if (!json_is_string(id) || strcmp(json_string_value(id), "ExperimentList") != 0)
        return bad(r, "__id__", "", "expected \"ExperimentList\"");
    if (!json_is_array(list))
        return bad(r, "experiment", "", "expected a list of experiments");
    if (json_array_size(list) != 1)
        return nbgi_error(r->ctx, NBG_EFORMAT, "%s has %zu experiments; nbgrad reads one", r->file,
                          json_array_size(list));
    json_t *expt = json_array_get(list, 0), *b, *d, *gon, *s, *c;
    if (!json_is_object(expt))
        return bad(r, "experiment[0]", "", "expected an object");
    char bw[64], dw[64], gw[64], sw[64], cw[64];
    int rc;
    if ((rc = model(r, root, expt, "beam", 1, &b, bw, sizeof bw)) != NBG_OK ||
        (rc = model(r, root, expt, "detector", 1, &d, dw, sizeof dw)) != NBG_OK ||
        (rc = model(r, root, expt, "goniometer", 0, &gon, gw, sizeof gw)) != NBG_OK ||
        (rc = model(r, root, expt, "scan", 0, &s, sw, sizeof sw)) != NBG_OK ||
        (rc = model(r, root, expt, "crystal", 0, &c, cw, sizeof cw)) != NBG_OK)
        return rc;
    double fixed[9], setting[9];
    if ((rc = read_beam(r, b, bw, g)) != NBG_OK || (rc = read_detector(r, d, dw, g)) != NBG_OK)
        return rc;
    /* A still (no goniometer or scan) keeps the defaults: axis (1,0,0), one frame of width 0. */
    if (gon != NULL) {
        if ((rc = read_goniometer(r, gon, gw, g, fixed, setting)) != NBG_OK)
            return rc;
    } else {
        static const double ident[9] = {1, 0, 0, 0, 1, 0, 0, 0, 1};
        memcpy(fixed, ident, sizeof ident);
        memcpy(setting, ident, sizeof ident);
    }
    if (s != NULL && (rc = read_scan(r, s, sw, g)) != NBG_OK)
        return rc;
    if (c != NULL && (rc = read_crystal(r, c, cw, g, fixed, setting)) != NBG_OK)
        return rc;
    /* the image set's format option multi_panel (dials.import multi_panel=True), kept for writing the list back; an
     * image set nbgrad cannot follow says nothing of it */
    json_t *isx = json_object_get(expt, "imageset"), *sets = json_object_get(root, "imageset");
    if (json_is_integer(isx) && json_is_array(sets) && json_integer_value(isx) >= 0 &&
        (size_t)json_integer_value(isx) < json_array_size(sets)) {
        json_t *params = json_object_get(json_array_get(sets, (size_t)json_integer_value(isx)), "params");
        g->multi_panel = json_is_object(params) && json_is_true(json_object_get(params, "multi_panel"));
    }
    return NBG_OK;
}

static int read_expt(nbg_ctx *ctx, const char *path, nbg_geometry *g, nbg_panel **panels, int *npanels,
                     double **scan, int *nscan)
{
    if (path == NULL || path[0] == '\0')
        return nbgi_error(ctx, NBG_EINVAL, "reading an experiment list: no file name");
    if (g == NULL)
        return nbgi_error(ctx, NBG_EINVAL, "reading %s: no geometry to fill", path);
    struct stat st;
    if (stat(path, &st) != 0)
        return nbgi_error(ctx, NBG_EIO, "cannot read %s: %s", path, strerror(errno));
    if (!S_ISREG(st.st_mode))
        return nbgi_error(ctx, NBG_EIO, "cannot read %s: not a regular file", path);
    /* jansson's tree takes several times the text (an object per value); 16 bytes per byte of text is a bound
     * with room to spare. */
    char what[1200];
    snprintf(what, sizeof what, "the parsed experiment list %s", path);
    int rc = nbgi_check_bytes(ctx, 16.0 * (double)st.st_size, what);
    if (rc != NBG_OK)
        return rc;

    json_error_t err;
    json_t *root = json_load_file(path, 0, &err);
    if (root == NULL) {
        if (json_error_code(&err) == json_error_cannot_open_file)
            return nbgi_error(ctx, NBG_EIO, "cannot read %s: %s", path, err.text);
        if (json_error_code(&err) == json_error_out_of_memory)
            return nbgi_error(ctx, NBG_ENOMEM, "out of memory reading %s", path);
        return nbgi_error(ctx, NBG_EFORMAT, "%s: line %d, column %d: %s", path, err.line, err.column, err.text);
    }
    nbg_geometry tmp;
    nbgi_geometry_init(&tmp);
    nbg_panel *pp = NULL;
    int n = 1;
    double *sc = NULL;
    int nsc = 0;
    const reader r = {ctx, path, panels != NULL ? &pp : NULL, &n, scan != NULL ? &sc : NULL, &nsc};
    rc = read_list(&r, root, &tmp);
    json_decref(root);
    if (rc != NBG_OK) {
        free(pp);
        free(sc);
        return rc;
    }
    snprintf(what, sizeof what, "reading %s", path);
    /* A list DIALS would take but nbgrad cannot use (a zero pixel size, say) is a format error of the file. */
    rc = nbgi_geometry_check(ctx, &tmp, what);
    if (rc != NBG_OK) {
        free(pp);
        free(sc);
        return NBG_EFORMAT;
    }
    *g = tmp;
    if (panels != NULL) {
        *panels = pp;
        *npanels = n;
    }
    if (scan != NULL) {
        *scan = sc;
        *nscan = nsc;
    }
    return NBG_OK;
}

int nbg_read_expt(nbg_ctx *ctx, const char *path, nbg_geometry *g)
{
    return read_expt(ctx, path, g, NULL, NULL, NULL, NULL);
}

int nbg_read_expt_scan_crystal(nbg_ctx *ctx, const char *path, double **real_space, int *npoints)
{
    if (real_space == NULL || npoints == NULL)
        return nbgi_error(ctx, NBG_EINVAL, "nbg_read_expt_scan_crystal: NULL argument");
    *real_space = NULL;
    *npoints = 0;
    nbg_geometry g;
    nbg_panel *pp = NULL;
    int np = 0;
    const int rc = read_expt(ctx, path, &g, &pp, &np, real_space, npoints);
    free(pp);
    return rc;
}

int nbg_read_expt_panels(nbg_ctx *ctx, const char *path, nbg_geometry *g, nbg_panel **panels, int *npanels)
{
    if (panels == NULL || npanels == NULL)
        return nbgi_error(ctx, NBG_EINVAL, "reading %s: nowhere to put the panels", path != NULL ? path : "a list");
    *panels = NULL;
    *npanels = 0;
    const int rc = read_expt(ctx, path, g, panels, npanels, NULL, NULL);
    if (rc != NBG_OK || *npanels < 2)
        return rc;
    /* g's detector: panel 0's where the beam meets its plane in front of the sample, else the first panel's whose
     * plane it meets there, one it meets inside the panel first (the Pilatus 12M's first row faces the sample from
     * above the beam, along which its plane never lies): the plane nbg_experiment_from_geometry sets up, on
     * which the panels (in the lab frame) do not depend */
    int best = -1, inside = 0;
    const double beam[3] = {-g->direction[0], -g->direction[1], -g->direction[2]};
    for (int k = 0; k < *npanels && !inside; ++k) {
        const nbg_panel *p = &(*panels)[k];
        double n[3], hit[3];
        nbgi_cross(p->fast, p->slow, n); /* unit: the reader's axes are unit and perpendicular */
        const double no = nbgi_dot(n, p->origin), nb = nbgi_dot(n, beam);
        if (!(fabs(no) > 1e-6 && (no < 0 ? -nb : nb) > 1e-6))
            continue; /* its plane passes through the sample, or the beam does not reach it */
        if (k == 0)
            return NBG_OK;
        for (int i = 0; i < 3; ++i) hit[i] = beam[i] * (no / nb) - p->origin[i];
        const double u = nbgi_dot(hit, p->fast) / p->pixel, v = nbgi_dot(hit, p->slow) / p->pixel;
        inside = u >= 0 && u <= p->fpixels && v >= 0 && v <= p->spixels;
        if (best < 0 || inside)
            best = k;
    }
    if (best > 0) {
        nbg_geometry gk;
        nbgi_geometry_of_panel(g, &(*panels)[best], &gk);
        *g = gk;
    }
    return NBG_OK;
}

#else /* !NBG_HAVE_FORMATS */

int nbgi_write_expt_set(nbg_ctx *ctx, nbgi_outset *set, const char *path, const nbg_geometry *g,
                        const char *images)
{
    (void)set;
    (void)g;
    (void)images;
    return nbgi_error(ctx, NBG_EUNSUP, "writing %s: DIALS experiment lists need jansson, and nbgrad was built "
                      "without jansson (FORMATS=0)", path != NULL ? path : "an experiment list");
}

int nbg_write_expt(nbg_ctx *ctx, const char *path, const nbg_geometry *g, const char *images)
{
    return nbgi_write_expt_set(ctx, NULL, path, g, images);
}

int nbgi_write_expt_panels_set(nbg_ctx *ctx, nbgi_outset *set, const char *path, const nbg_geometry *g,
                               const nbg_panel *panels, int npanels, const char *images)
{
    (void)panels;
    (void)npanels;
    return nbgi_write_expt_set(ctx, set, path, g, images);
}

int nbg_write_expt_panels(nbg_ctx *ctx, const char *path, const nbg_geometry *g, const nbg_panel *panels,
                          int npanels, const char *images)
{
    return nbgi_write_expt_panels_set(ctx, NULL, path, g, panels, npanels, images);
}

int nbg_read_expt(nbg_ctx *ctx, const char *path, nbg_geometry *g)
{
    (void)g;
    return nbgi_error(ctx, NBG_EUNSUP, "reading %s: DIALS experiment lists need jansson, and nbgrad was built "
                      "without jansson (FORMATS=0)", path != NULL ? path : "an experiment list");
}

int nbg_read_expt_panels(nbg_ctx *ctx, const char *path, nbg_geometry *g, nbg_panel **panels, int *npanels)
{
    (void)panels;
    (void)npanels;
    return nbg_read_expt(ctx, path, g);
}

int nbg_read_expt_scan_crystal(nbg_ctx *ctx, const char *path, double **real_space, int *npoints)
{
    if (real_space != NULL)
        *real_space = NULL;
    if (npoints != NULL)
        *npoints = 0;
    return nbg_read_expt(ctx, path, NULL);
}

#endif
