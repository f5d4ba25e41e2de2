/*
 * observed.c -- an observed image read for an experiment (nbg_observed_read): the file or frame, its shape checked
 * against the detector, the detector response chosen (given, else the file's, else nanoBragg's) and the pixels to
 * leave out (the experiment's mask, the file's, the overloads).  The policy of nbgrad's grad, refine and ensemble,
 * in the library so that every caller (the program, Python) takes images alike.  Library code: it never prints;
 * what a program tells its user it finds as text in the result.
 */
#include "build.h"
#include "formats.h"
#include "internal.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void nbgi_frame_name(const char *path, int frame, int n, char *out, size_t size)
{
    const char *hash = strchr(path, '#');
    if (n <= 1 && hash == NULL) { /* one frame: the name as given (a '#' template still takes the number, 1) */
        snprintf(out, size, "%s", path);
        return;
    }
    if (hash != NULL) {
        const size_t width = strspn(hash, "#");
        snprintf(out, size, "%.*s%0*d%s", (int)(hash - path), path, (int)width, frame + 1, hash + width);
        return;
    }
    const char *slash = strrchr(path, '/');
    const char *dot = strrchr(path, '.');
    if (dot == NULL || (slash != NULL && dot < slash) || dot == path || (slash != NULL && dot == slash + 1)) {
        dot = path + strlen(path);
    }
    snprintf(out, size, "%.*s_%05d%s", (int)(dot - path), path, frame + 1, dot);
}

int nbgi_image_shape_check(nbg_ctx *ctx, const nbg_experiment *e, const char *what, const char *path,
                           const nbg_geometry *fg)
{
    nbg_report r;
    if (fg == NULL || fg->fpixels <= 0 || fg->spixels <= 0 || nbg_describe(ctx, e, &r) != NBG_OK ||
        r.npanels > 1) {
        return NBG_OK; /* raw floats state no shape; a detector of panels is checked by its pixel count */
    }
    if (fg->fpixels != r.fpixels || fg->spixels != r.spixels) {
        return nbgi_error(ctx, NBG_EINVAL, "%s %s is %d x %d pixels (fast x slow, as the file states) but the detector "
                          "is %d x %d: the same number of pixels in another shape is another image", what, path,
                          fg->fpixels, fg->spixels, r.fpixels, r.spixels);
    }
    return NBG_OK;
}

void nbg_observed_options_default(nbg_observed_options *opt)
{
    if (opt != NULL) {
        opt->pedestal = opt->gain = opt->read_noise = opt->adc = NAN;
        opt->trusted[0] = opt->trusted[1] = NAN;
        opt->what = opt->mask_what = NULL;
        opt->panel_pedestal = opt->panel_gain = opt->panel_read_noise = NULL;
        opt->npanel_values = 0;
    }
}

void nbg_observed_free(nbg_observed *out)
{
    if (out != NULL) {
        free(out->image);
        free(out->use);
        free(out->panel_response);
        memset(out, 0, sizeof *out);
    }
}

/* The detector response: the options' values where given, else the experiment's where its model states them (a
 * DIALS list's, which describes its image set's counts: not for raw floats, which no list's image set is), else the
 * file's (g), else nanoBragg's. */
static void choose_response(const nbg_observed_options *o, const nbg_experiment *e, const nbg_geometry *g,
                            nbg_observed *out)
{
    nbg_detector_model *r = &out->response;
    const char *from;
    const int model = e->response_stated != 0 && g->fpixels > 0;
    if (!isnan(o->pedestal)) {
        r->pedestal = o->pedestal;
        out->pedestal_from = NBG_FROM_OPTION;
        from = "-pedestal";
    } else if (model) {
        r->pedestal = e->response.pedestal;
        out->pedestal_from = NBG_FROM_MODEL;
        from = "the experiment list's";
    } else if (isnan(g->pedestal)) { /* SMV without ADC_OFFSET: written by nanoBragg, whose offset is -adc's */
        r->pedestal = isnan(o->adc) ? 40 : o->adc;
        out->pedestal_from = NBG_FROM_DEFAULT;
        from = "an SMV file without ADC_OFFSET: nanoBragg's ADC offset (-adc)";
    } else {
        r->pedestal = g->pedestal;
        out->pedestal_from = g->fpixels > 0 ? NBG_FROM_FILE : NBG_FROM_DEFAULT;
        from = g->fpixels > 0 ? "the file's" : "raw floats carry none";
    }
    const int file_gain = isfinite(g->gain) && g->gain > 0;
    const int stated_gain = file_gain && g->fpixels > 0; /* raw floats state nothing */
    r->gain = !isnan(o->gain) ? o->gain : model ? e->response.gain : file_gain ? g->gain : 1;
    out->gain_from = !isnan(o->gain) ? NBG_FROM_OPTION : model ? NBG_FROM_MODEL : stated_gain ? NBG_FROM_FILE
                                                                                               : NBG_FROM_DEFAULT;
    r->read_noise = !isnan(o->read_noise) ? o->read_noise : 0;
    out->read_noise_from = !isnan(o->read_noise) ? NBG_FROM_OPTION : NBG_FROM_DEFAULT;
    snprintf(out->response_text, sizeof out->response_text,
             "observed image %s: pedestal %g counts (%s), gain %g counts/photon%s, read noise %g counts", out->file,
             r->pedestal, from, r->gain, out->gain_from == NBG_FROM_MODEL ? " (the experiment list's)" : "",
             r->read_noise);
}

/* The options' panel lists (o->panel_*) checked against e's panels: NBG_OK with *any 1 when some list is given. */
static int check_panel_lists(nbg_ctx *ctx, const nbg_observed_options *o, const nbg_experiment *e, const char *what,
                             int *any)
{
    static const char *const names[3] = {"pedestal", "gain", "read noise"};
    const double *lists[3] = {o->panel_pedestal, o->panel_gain, o->panel_read_noise};
    *any = lists[0] != NULL || lists[1] != NULL || lists[2] != NULL;
    if (!*any) {
        return NBG_OK;
    }
    const int np = e->panels != NULL ? e->npanels : 0;
    if (np <= 0) {
        return nbgi_error(ctx, NBG_EINVAL, "%s: a pedestal, gain or read noise per panel is given, but the detector "
                          "is the single flat one (give the image's own instead)", what);
    }
    if (o->npanel_values != np) {
        return nbgi_error(ctx, NBG_EINVAL, "%s: %d values per panel of the detector response are given, the detector "
                          "has %d panels", what, o->npanel_values, np);
    }
    for (int k = 0; k < 3; ++k) {
        for (int q = 0; lists[k] != NULL && q < np; ++q) {
            const double v = lists[k][q];
            if (!(isfinite(v) && (k == 0 || (k == 1 ? v > 0 : v >= 0)))) {
                return nbgi_error(ctx, NBG_EINVAL, "%s: panel %d's %s %g is not valid (%s)", what, q, names[k], v,
                                  k == 0 ? "a finite number" : k == 1 ? "a gain > 0" : "a read noise >= 0");
            }
        }
    }
    return NBG_OK;
}

/* Whether some panel of e has its own response (a DIALS list's, or the options' of an earlier frame). */
static int any_own_response(const nbg_experiment *e)
{
    for (int q = 0; e->panels != NULL && q < e->npanels; ++q) {
        if (e->panels[q].own_response) {
            return 1;
        }
    }
    return 0;
}

/* Each panel's own response (the options' lists; where a list is not given, the panel's own (own: for an image
 * file, not raw floats) unless the option for the whole image is given, else the image's response) into
 * out->panel_response, with a line on it appended to out->response_text. */
static int panel_responses(nbg_ctx *ctx, const nbg_observed_options *o, const nbg_experiment *e, int own,
                           nbg_observed *out)
{
    const int np = e->npanels;
    if ((out->panel_response = malloc((size_t)np * sizeof *out->panel_response)) == NULL) {
        return nbgi_error(ctx, NBG_ENOMEM, "out of memory for the panels' detector response");
    }
    out->npanel_response = np;
    for (int q = 0; q < np; ++q) {
        nbg_detector_model *r = &out->panel_response[q];
        *r = out->response;
        const nbg_panel *pq = &e->panels[q];
        if (own && pq->own_response) {
            if (isnan(o->pedestal)) r->pedestal = pq->response.pedestal;
            if (isnan(o->gain)) r->gain = pq->response.gain;
            if (isnan(o->read_noise)) r->read_noise = pq->response.read_noise;
        }
        if (o->panel_pedestal != NULL) r->pedestal = o->panel_pedestal[q];
        if (o->panel_gain != NULL) r->gain = o->panel_gain[q];
        if (o->panel_read_noise != NULL) r->read_noise = o->panel_read_noise[q];
    }
    const size_t used = strlen(out->response_text);
    const int lists = o->panel_pedestal != NULL || o->panel_gain != NULL || o->panel_read_noise != NULL;
    snprintf(out->response_text + used, sizeof out->response_text - used,
             "; the panels' own detector response (%s%s%s%s): panel 0 pedestal %g, gain %g, read noise %g counts%s",
             o->panel_pedestal != NULL ? "pedestal " : "",
             o->panel_gain != NULL ? "gain " : "", o->panel_read_noise != NULL ? "read noise" : "",
             lists ? "" : "the experiment's panels",
             out->panel_response[0].pedestal, out->panel_response[0].gain, out->panel_response[0].read_noise,
             np > 1 ? ", ..." : "");
    return NBG_OK;
}

int nbg_observed_apply_response(nbg_ctx *ctx, const nbg_observed *ob, nbg_experiment *e, nbg_panel *panels,
                                int npanels)
{
    if (ob == NULL || e == NULL) {
        return nbgi_error(ctx, NBG_EINVAL, "nbg_observed_apply_response: NULL argument");
    }
    if (ob->panel_response != NULL &&
        (panels == NULL || panels != e->panels || npanels != e->npanels || npanels != ob->npanel_response)) {
        return nbgi_error(ctx, NBG_EINVAL, "nbg_observed_apply_response: the panels' own responses (%d) need the "
                          "experiment's panel array and its count (%d given, the experiment has %d)",
                          ob->npanel_response, npanels, e->npanels);
    }
    e->response = ob->response;
    for (int q = 0; ob->panel_response != NULL && q < npanels; ++q) {
        panels[q].own_response = 1;
        panels[q].response = ob->panel_response[q];
    }
    return NBG_OK;
}

/* Whether e's panels say where their pixels lie in a file that is one array (some panel's raw_offset is not 0). */
static int has_layout(const nbg_experiment *e)
{
    for (int q = 0; e->panels != NULL && q < e->npanels; ++q) {
        if (e->panels[q].raw_offset[0] != 0 || e->panels[q].raw_offset[1] != 0)
            return 1;
    }
    return 0;
}

/* The file's one array (n pixels, g's fpixels x spixels, fast-major) cut into e's panels at their raw offsets, as
 * dxtbx's get_raw_data cuts it: *img (and *mask, when not NULL) replaced by the panels' concatenation (npix). */
static int cut_panels(nbg_ctx *ctx, const nbg_experiment *e, const char *path,
                      const nbg_geometry *g, size_t n, size_t npix, float **img, uint8_t **mask)
{
    const long F = g->fpixels, S = g->spixels;
    if (!(F > 0 && S > 0) || (size_t)F * (size_t)S != n) {
        return nbgi_error(ctx, NBG_EINVAL, "%s is not one array of pixels (%zu pixels%s): the experiment's panels "
                          "say where they lie in one array (a DIALS list's raw_image_offset)", path, n,
                          F > 0 ? ", the file's first panel or module only described" : ", no shape stated");
    }
    size_t total = 0;
    for (int q = 0; q < e->npanels; ++q) {
        const nbg_panel *p = &e->panels[q];
        const long x0 = p->raw_offset[0], y0 = p->raw_offset[1];
        if (x0 < 0 || y0 < 0 || x0 + p->fpixels > F || y0 + p->spixels > S) {
            return nbgi_error(ctx, NBG_EINVAL, "%s is %ld x %ld pixels; panel %d (%s) would take %d x %d of them "
                              "from (%ld, %ld) (its raw_image_offset), past the image's edge", path, F, S, q,
                              p->name[0] != '\0' ? p->name : "unnamed", p->fpixels, p->spixels, x0, y0);
        }
        total += (size_t)p->fpixels * (size_t)p->spixels;
    }
    if (total != npix) {
        return nbgi_error(ctx, NBG_EINVAL, "%s: the panels hold %zu pixels, the detector %zu", path, total, npix);
    }
    float *out = malloc(npix * sizeof *out);
    uint8_t *mout = mask != NULL && *mask != NULL ? malloc(npix) : NULL;
    if (out == NULL || (mask != NULL && *mask != NULL && mout == NULL)) {
        free(out);
        free(mout);
        return nbgi_error(ctx, NBG_ENOMEM, "out of memory cutting %s into its panels", path);
    }
    size_t at = 0;
    for (int q = 0; q < e->npanels; ++q) {
        const nbg_panel *p = &e->panels[q];
        for (int j = 0; j < p->spixels; ++j) {
            const size_t from = ((size_t)p->raw_offset[1] + (size_t)j) * (size_t)F + (size_t)p->raw_offset[0];
            memcpy(out + at, *img + from, (size_t)p->fpixels * sizeof *out);
            if (mout != NULL)
                memcpy(mout + at, *mask + from, (size_t)p->fpixels);
            at += (size_t)p->fpixels;
        }
    }
    free(*img);
    *img = out;
    if (mout != NULL) {
        free(*mask);
        *mask = mout;
    }
    return NBG_OK;
}

int nbg_observed_read(nbg_ctx *ctx, const nbg_experiment *e, const char *path, int frame,
                      const nbg_observed_options *opt, nbg_observed *out)
{
    if (out == NULL) {
        return nbgi_error(ctx, NBG_EINVAL, "nbg_observed_read: NULL argument");
    }
    memset(out, 0, sizeof *out);
    if (ctx == NULL || e == NULL || path == NULL) {
        return nbgi_error(ctx, NBG_EINVAL, "nbg_observed_read: NULL argument");
    }
    if (frame < 0) {
        return nbgi_error(ctx, NBG_EINVAL, "nbg_observed_read: frame %d is negative", frame);
    }
    nbg_observed_options o;
    nbg_observed_options_default(&o);
    if (opt != NULL) {
        o = *opt;
    }
    const char *what = o.what != NULL ? o.what : "observed image";
    const char *mask_what = o.mask_what != NULL ? o.mask_what : "the experiment's mask";
    if ((!isnan(o.pedestal) && !isfinite(o.pedestal)) || (!isnan(o.gain) && !(o.gain > 0 && isfinite(o.gain))) ||
        (!isnan(o.read_noise) && !(o.read_noise >= 0 && isfinite(o.read_noise))) ||
        (!isnan(o.adc) && !isfinite(o.adc))) {
        return nbgi_error(ctx, NBG_EINVAL, "%s: the pedestal %g, gain %g, read noise %g or ADC offset %g is not valid "
                          "(a finite pedestal and offset, a gain > 0, a read noise >= 0)", what, o.pedestal, o.gain,
                          o.read_noise, o.adc);
    }
    int any_panel_list;
    int rc = check_panel_lists(ctx, &o, e, what, &any_panel_list);
    if (rc != NBG_OK) {
        return rc;
    }
    nbg_report rep;
    if ((rc = nbg_describe(ctx, e, &rep)) != NBG_OK) {
        return rc;
    }
    const size_t npix = rep.npix;
    /* frame f of a series: the file the '#' template names, or frame f of the one file (NXmx) */
    const int templ = strchr(path, '#') != NULL;
    if (templ) {
        nbgi_frame_name(path, frame, 1, out->file, sizeof out->file);
    } else {
        snprintf(out->file, sizeof out->file, "%s", path);
    }
    float *img = NULL;
    uint8_t *fmask = NULL;
    size_t n = 0;
    nbg_geometry *g = &out->geometry;
    /* a file that is one array of a detector of panels (the Pilatus 12M's rows, a Timepix quad's chips): the
     * experiment's panels (a DIALS list's) say where each one's pixels lie; without them nbg_read_image's refusal */
    char unplaced[1024];
    const int layout = has_layout(e);
    if ((rc = nbgi_read_image_array(ctx, out->file, templ ? 0 : frame, npix, &img, &n, g, &out->have_geometry,
                                    &fmask, unplaced, sizeof unplaced)) == NBG_OK) {
        if (unplaced[0] != '\0' && !layout) {
            rc = nbgi_error(ctx, NBG_EUNSUP, "%s", unplaced);
        } else if (layout) {
            rc = cut_panels(ctx, e, out->file, g, n, npix, &img, &fmask);
            n = npix;
            out->have_geometry = 0;
        }
        if (rc != NBG_OK) {
            free(img);
            free(fmask);
        }
    }
    if (rc != NBG_OK) {
        char msg[1024];
        snprintf(msg, sizeof msg, "%s", nbg_errmsg(ctx));
        memset(out, 0, sizeof *out);
        return nbgi_error(ctx, rc, "%s%s: %s", what, frame > 0 ? " (a later frame)" : "", msg);
    }
    if (n != npix) {
        rc = nbgi_error(ctx, NBG_EINVAL, "%s %s has %zu pixels, the detector has %zu", what, out->file, n, npix);
    } else {
        rc = nbgi_image_shape_check(ctx, e, what, out->file, g);
    }
    if (rc == NBG_OK && (out->use = malloc(npix)) == NULL) {
        rc = nbgi_error(ctx, NBG_ENOMEM, "out of memory for the pixel mask");
    }
    if (rc != NBG_OK) {
        free(img);
        free(fmask);
        memset(out, 0, sizeof *out);
        return rc;
    }
    out->image = img;
    out->npix = npix;
    choose_response(&o, e, g, out);
    /* the panels' own (a list's) for an image file that a list's image set may be (not raw floats) */
    const int own = g->fpixels > 0;
    if ((any_panel_list || (own && any_own_response(e))) && (rc = panel_responses(ctx, &o, e, own, out)) != NBG_OK) {
        nbg_observed_free(out);
        return rc;
    }
    long nbad = 0;
    size_t firstbad = 0;
    float badval = 0;
    const double sat = isfinite(g->saturation) && g->saturation > 0 ? g->saturation : INFINITY;
    out->saturation = sat;
    /* the trusted range of each pixel: its panel's, else the options' (applied where lo < hi) */
    const double *trusted = o.trusted[0] < o.trusted[1] ? o.trusted : NULL;
    const double *tr = trusted;
    int q = -1;
    size_t qend = 0;
    for (size_t i = 0; i < npix; ++i) {
        uint8_t keep = 1;
        while (e->npanels > 0 && e->panels != NULL && i >= qend && q + 1 < e->npanels) {
            ++q;
            qend += (size_t)e->panels[q].fpixels * (size_t)e->panels[q].spixels;
            const nbg_panel *pq = &e->panels[q];
            tr = pq->has_trusted && pq->trusted[0] < pq->trusted[1] ? pq->trusted : trusted;
        }
        /* nbg_read_image's mask includes the overloads: count them as such */
        if (e->mask != NULL && e->mask[i] == 0) {
            keep = 0, ++out->nleft_mask;
        } else if (img[i] >= sat) {
            keep = 0, ++out->nleft_overload;
        } else if (fmask != NULL && fmask[i]) {
            keep = 0, ++out->nleft_file;
        } else if (tr != NULL && !(tr[0] < img[i] && img[i] < tr[1])) {
            keep = 0, ++out->nleft_trusted;
        } else if (!isfinite(img[i])) {
            if (nbad++ == 0) {
                firstbad = i, badval = img[i];
            }
            keep = 0;
        } else if (img[i] < 0) {
            ++out->nnegative; /* dark-subtracted data: a value below zero is data (a CBF's flags -1, -2 are masked) */
        }
        out->use[i] = keep;
        if (!keep && !(isfinite(img[i]) && img[i] >= 0)) {
            img[i] = 0; /* a flagged value (CBF's -1, -2) is not data */
        }
    }
    free(fmask);
    if (nbad > 0) {
        nbg_observed_free(out);
        return nbgi_error(ctx, NBG_EINVAL, "%s %s: pixel %zu is %g (must be finite), %ld such pixels outside the "
                          "file's mask", what, path, firstbad, (double)badval, nbad);
    }
    if (out->nnegative > 0) {
        snprintf(out->note, sizeof out->note, "%s %s: %ld pixels below 0 counts (dark-subtracted data?): least "
                 "squares takes them as they are, the Poisson losses clip (obs - pedestal) / gain (plus the read "
                 "noise's variance) at 0", what, path, out->nnegative);
    }
    const long nout = out->nleft_file + out->nleft_overload + out->nleft_mask + out->nleft_trusted;
    if (nout > 0) {
        char tt[96] = "";
        if (out->nleft_trusted > 0) {
            snprintf(tt, sizeof tt, ", %ld outside the trusted range", out->nleft_trusted);
        }
        snprintf(out->left_out, sizeof out->left_out, "left out %ld of %zu pixels%s: %ld in the file's mask, %ld "
                 "overloaded (>= %g counts), %ld in %s%s", nout, npix, frame > 0 ? " of a later frame" : "",
                 out->nleft_file, out->nleft_overload, sat, out->nleft_mask, mask_what, tt);
    }
    return NBG_OK;
}
