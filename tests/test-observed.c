/*
 * test-observed.c -- nbg_observed_read, the observed-image policy of the library: a missing file and an image of
 * the wrong size or shape are refused with their messages; non-finite pixels outside the file's mask are refused;
 * an SMV file without ADC_OFFSET carries nanoBragg's offset (the option adc, 40 by default), one with the key its
 * own pedestal, raw floats none; given values win over the file's; the file's overloads, its mask and the
 * experiment's mask are left out and counted; frames of a '#' template; a file that is one array cut into the
 * experiment's panels at their raw offsets (a DIALS list's raw_image_offset), and a TimePix_SU quad's SMV (whose
 * chips the file does not place) refused alone and read through such panels; nothing is printed.
 */
#include "testutil.h" /* first: it sets _GNU_SOURCE */
#include "nbgrad.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define FP 32
#define SP 24
#define NPIX ((size_t)FP * SP)

static void experiment(nbg_experiment *e)
{
    nbg_experiment_default(e);
    e->fpixels = FP;
    e->spixels = SP;
    e->distance = 100;
    e->lambda = 1;
    e->has_cell = 1;
    const double cell[6] = {70, 80, 90, 90, 90, 90};
    memcpy(e->cell, cell, sizeof cell);
    e->default_F = 100;
}

/* An SMV file of FP x SP (fp x sp when given) with values v(i) = 50 + i % 7; adc_offset NAN: no ADC_OFFSET key. */
static int write_smv(nbg_ctx *ctx, const nbg_experiment *e, const char *path, double adc_offset, uint16_t over)
{
    nbg_report r;
    if (nbg_describe(ctx, e, &r) != NBG_OK) {
        return 0;
    }
    nbg_smv_header h;
    nbg_smv_header_from_report(&r, &h);
    h.has_adc_offset = !isnan(adc_offset);
    h.adc_offset = isnan(adc_offset) ? 0 : adc_offset;
    const size_t n = (size_t)r.fpixels * (size_t)r.spixels;
    uint16_t *d = malloc(n * sizeof *d);
    for (size_t i = 0; i < n; ++i) d[i] = (uint16_t)(50 + i % 7);
    d[5] = over; /* 65535: an overload */
    const int ok = nbg_write_smv(ctx, path, &h, d) == NBG_OK;
    free(d);
    return ok;
}

static int write_raw(nbg_ctx *ctx, const char *path, size_t n, float bad)
{
    float *v = malloc(n * sizeof *v);
    for (size_t i = 0; i < n; ++i) v[i] = (float)(i % 11);
    v[7] = -2.5f;          /* dark-subtracted: a count below 0 is data */
    if (n > 100) v[100] = bad; /* NaN: refused where the file leaves it in */
    const int ok = nbg_write_float(ctx, path, v, n) == NBG_OK;
    free(v);
    return ok;
}

/* An SMV file of fp x sp with the distinct values 100 + i (beamline: its BEAMLINE, else nbgrad's "fake"). */
static int write_smv_named(nbg_ctx *ctx, const char *path, int fp, int sp, const char *beamline)
{
    nbg_experiment e;
    experiment(&e);
    e.fpixels = fp;
    e.spixels = sp;
    nbg_report r;
    if (nbg_describe(ctx, &e, &r) != NBG_OK)
        return 0;
    nbg_smv_header h;
    nbg_smv_header_from_report(&r, &h);
    const size_t n = (size_t)fp * (size_t)sp;
    uint16_t *d = malloc(n * sizeof *d);
    for (size_t i = 0; i < n; ++i) d[i] = (uint16_t)(100 + i % 60000);
    int ok = nbg_write_smv(ctx, path, &h, d) == NBG_OK;
    free(d);
    if (!ok || beamline == NULL)
        return ok;
    /* BEAMLINE=fake; renamed inside the 512-byte header (its padding of spaces takes the difference) */
    size_t len = 0;
    char *b = nbgi_test_read_file(path, &len);
    char *at = b != NULL && len > 512 ? memmem(b, 512, "BEAMLINE=fake;", 14) : NULL;
    const size_t extra = strlen(beamline) - 4, from = at != NULL ? (size_t)(at - b) : 0;
    ok = at != NULL && strlen(beamline) >= 4 && b[511 - extra] == ' ';
    if (ok) {
        memmove(at + 9 + strlen(beamline), at + 13, 512 - from - 13 - extra);
        memcpy(at + 9, beamline, strlen(beamline));
        FILE *f = fopen(path, "wb");
        ok = f != NULL && fwrite(b, 1, len, f) == len;
        if (f != NULL)
            ok &= fclose(f) == 0;
    }
    free(b);
    return ok;
}

/* The file's one array (fp wide, values 100 + i) cut as the panels say: every pixel where its raw offset puts it. */
static int cut_right(const nbg_observed *ob, const nbg_panel *p, int np, int fp)
{
    size_t at = 0;
    for (int q = 0; q < np; ++q) {
        for (int j = 0; j < p[q].spixels; ++j) {
            for (int i = 0; i < p[q].fpixels; ++i, ++at) {
                const size_t src = (size_t)(p[q].raw_offset[1] + j) * (size_t)fp + (size_t)(p[q].raw_offset[0] + i);
                if (at >= ob->npix || ob->image[at] != (float)(100 + src % 60000))
                    return 0;
            }
        }
    }
    return at == ob->npix;
}

/* Panels of fp x sp pixels at raw offsets (x, y), side by side in the detector plane. */
static void layout_panels(nbg_panel *p, int np, const int (*at)[4])
{
    memset(p, 0, (size_t)np * sizeof *p);
    for (int q = 0; q < np; ++q) {
        p[q].fpixels = at[q][2];
        p[q].spixels = at[q][3];
        p[q].pixel = 0.1;
        p[q].fast[0] = 1;
        p[q].slow[1] = 1;
        p[q].origin[0] = 30.0 * q;
        p[q].raw_offset[0] = at[q][0];
        p[q].raw_offset[1] = at[q][1];
        snprintf(p[q].name, sizeof p[q].name, "chip%d", q);
        p[q].level_group[0] = 0;
        for (int l = 1; l < NBG_PANEL_LEVELS; ++l) p[q].level_group[l] = -1;
    }
}

/* A file that is one array, cut into the experiment's panels at their raw offsets; a TimePix_SU quad's SMV. */
static void test_layout(nbg_ctx *ctx, const char *dir)
{
    char path[1024], want[2048];
    nbg_experiment e;
    experiment(&e);
    nbg_observed ob;
    nbg_observed_options opt;
    nbg_observed_options_default(&opt);
    opt.what = "-observed";
    snprintf(path, sizeof path, "%s/array.img", dir);
    nbgi_test_check(write_smv_named(ctx, path, FP, SP, NULL), "layout-write", "an SMV file of %d x %d", FP, SP);
    /* two panels of the 32 x 24 array: 8 x 5 from (3, 2) and 10 x 4 from (20, 17), the second ending at its
     * corner (29, 20) */
    static const int two[2][4] = {{3, 2, 8, 5}, {20, 17, 10, 4}};
    nbg_panel p[4];
    layout_panels(p, 2, two);
    e.panels = p;
    e.npanels = 2;
    int rc = nbg_observed_read(ctx, &e, path, 0, &opt, &ob);
    nbgi_test_check(rc == NBG_OK && ob.npix == 8 * 5 + 10 * 4 && cut_right(&ob, p, 2, FP) && !ob.have_geometry,
                    "layout-cut", "the 32 x 24 file cut into the two panels at their raw offsets: %zu pixels, each "
                    "where its offset puts it (%s)", ob.npix, rc ? nbg_errmsg(ctx) : "ok");
    nbg_observed_free(&ob);
    p[1].raw_offset[0] = 23; /* 10 wide from 23: past the 32 columns */
    rc = nbg_observed_read(ctx, &e, path, 0, &opt, &ob);
    snprintf(want, sizeof want, "-observed: %s is 32 x 24 pixels; panel 1 (chip1) would take 10 x 4 of "
             "them from (23, 17) (its raw_image_offset), past the image's edge", path);
    nbgi_test_check(rc == NBG_EINVAL && strcmp(nbg_errmsg(ctx), want) == 0 && ob.image == NULL, "layout-past-edge",
                    "'%s'", nbg_errmsg(ctx));
    /* raw floats state no array: refused, not cut */
    snprintf(path, sizeof path, "%s/layout.bin", dir);
    p[1].raw_offset[0] = 20;
    nbgi_test_check(write_raw(ctx, path, 80, 1.0f), "layout-raw-write", "80 raw floats");
    rc = nbg_observed_read(ctx, &e, path, 0, &opt, &ob);
    nbgi_test_check(rc == NBG_EINVAL && strstr(nbg_errmsg(ctx), "is not one array of pixels") != NULL,
                    "layout-raw", "raw floats with panels that say where they lie in an array: '%s'", nbg_errmsg(ctx));

    /* a TimePix_SU quad's SMV of 512 x 512: refused alone, naming the detector and dials.import; read through the
     * four chips of dials.import's list (254 x 254 from (1, 1), (257, 1), (1, 257), (257, 257)) */
    snprintf(path, sizeof path, "%s/timepix_0001.img", dir);
    nbgi_test_check(write_smv_named(ctx, path, 512, 512, "TimePix_SU"), "timepix-write",
                    "an SMV file of 512 x 512 with BEAMLINE=TimePix_SU");
    float *img = NULL;
    size_t n = 0;
    nbg_geometry g;
    int whole = 1;
    rc = nbg_read_image(ctx, path, 0, 0, &img, &n, &g, &whole, NULL);
    nbgi_test_check(rc == NBG_EUNSUP && img == NULL && n == 0 && strstr(nbg_errmsg(ctx), "\"TimePix_SU\"") != NULL &&
                    strstr(nbg_errmsg(ctx), "dials.import") != NULL && strstr(nbg_errmsg(ctx), "-expt") != NULL,
                    "timepix-refused", "nbg_read_image: '%s'", nbg_errmsg(ctx));
    free(img);
    nbg_experiment e1;
    experiment(&e1);
    e1.fpixels = e1.spixels = 512;
    rc = nbg_observed_read(ctx, &e1, path, 0, &opt, &ob);
    nbgi_test_check(rc == NBG_EUNSUP && ob.image == NULL && strstr(nbg_errmsg(ctx), "TimePix_SU quad") != NULL,
                    "timepix-refused-observed", "as one flat detector of 512 x 512: '%s'", nbg_errmsg(ctx));
    static const int quad[4][4] = {{1, 1, 254, 254}, {257, 1, 254, 254}, {1, 257, 254, 254}, {257, 257, 254, 254}};
    layout_panels(p, 4, quad);
    e.panels = p;
    e.npanels = 4;
    rc = nbg_observed_read(ctx, &e, path, 0, &opt, &ob);
    nbgi_test_check(rc == NBG_OK && ob.npix == 4 * 254 * 254 && cut_right(&ob, p, 4, 512), "timepix-chips",
                    "read through the list's four chips: %zu pixels, each where its offset puts it (%s)", ob.npix,
                    rc ? nbg_errmsg(ctx) : "ok");
    nbg_observed_free(&ob);
    /* another size under that name is not the quad dxtbx cuts (its 516 x 516 form is one flat panel) */
    snprintf(path, sizeof path, "%s/timepix516.img", dir);
    nbgi_test_check(write_smv_named(ctx, path, 516, 516, "TimePix_SU"), "timepix516-write", "516 x 516");
    rc = nbg_read_image(ctx, path, 0, 0, &img, &n, &g, &whole, NULL);
    nbgi_test_check(rc == NBG_OK && n == 516 * 516 && strcmp(g.detector, "TimePix_SU") == 0, "timepix516-read",
                    "a TimePix_SU SMV of 516 x 516 is read as its one panel (%s)", rc ? nbg_errmsg(ctx) : "ok");
    free(img);
}

#ifdef NBG_HAVE_FORMATS
/* A DIALS list's gain and pedestal: what DIALS reads the counts with ((raw - pedestal) / gain), taken over the
 * observed file's unless the options give them; dxtbx's defaults (1, 0) state nothing; written back. */
static void test_list_response(nbg_ctx *ctx, const char *dir)
{
    nbg_experiment e;
    experiment(&e);
    char img[4096], list[4096];
    snprintf(img, sizeof img, "%s/lr.img", dir);
    snprintf(list, sizeof list, "%s/lr.expt", dir);
    nbgi_test_check(write_smv(ctx, &e, img, NAN, 60), "list-response-smv", "an SMV file without ADC_OFFSET");
    nbg_report r;
    nbg_geometry g;
    if (nbg_describe(ctx, &e, &r) != NBG_OK || nbg_geometry_from_report(ctx, &e, &r, 1, &g) != NBG_OK) {
        nbgi_test_check(0, "list-response-geometry", "%s", nbg_errmsg(ctx));
        return;
    }
    const double gains[2] = {1, 2}, peds[2] = {0, 10};
    for (int k = 0; k < 2; ++k) {
        g.gain = gains[k];
        g.pedestal = peds[k];
        nbg_geometry gr;
        nbg_experiment el;
        experiment(&el);
        int rc = nbg_write_expt(ctx, list, &g, img);
        if (rc == NBG_OK) rc = nbg_read_expt(ctx, list, &gr);
        if (rc == NBG_OK) rc = nbg_experiment_from_geometry(ctx, &gr, &el);
        nbgi_test_check(rc == NBG_OK && gr.response_stated == k && el.response_stated == k, k ? "list-stated" :
                        "list-defaults", "a list with gain %g and pedestal %g %s (read %d, experiment %d; %s)",
                        gains[k], peds[k], k ? "states them" : "states nothing (dxtbx's defaults)",
                        gr.response_stated, el.response_stated, rc ? nbg_errmsg(ctx) : "ok");
        nbg_observed ob;
        rc = rc == NBG_OK ? nbg_observed_read(ctx, &el, img, 0, NULL, &ob) : rc;
        if (k == 0) {
            nbgi_test_check(rc == NBG_OK && ob.response.pedestal == 40 && ob.pedestal_from == NBG_FROM_DEFAULT &&
                            ob.response.gain == 1 && ob.gain_from == NBG_FROM_FILE, "list-defaults-file",
                            "dxtbx's defaults leave the file's pedestal %g (40) and gain %g", ob.response.pedestal,
                            ob.response.gain);
        } else {
            nbgi_test_check(rc == NBG_OK && ob.response.pedestal == 10 && ob.pedestal_from == NBG_FROM_MODEL &&
                            ob.response.gain == 2 && ob.gain_from == NBG_FROM_MODEL &&
                            strstr(ob.response_text, "pedestal 10 counts (the experiment list's), gain 2 counts/photon "
                                   "(the experiment list's)") != NULL, "list-wins",
                            "the list's pedestal %g and gain %g over the file's 40 and 1: '%s'", ob.response.pedestal,
                            ob.response.gain, rc == NBG_OK ? ob.response_text : nbg_errmsg(ctx));
        }
        if (rc == NBG_OK) nbg_observed_free(&ob);
        if (k == 1) {
            nbg_observed_options opt;
            nbg_observed_options_default(&opt);
            opt.pedestal = 3;
            rc = nbg_observed_read(ctx, &el, img, 0, &opt, &ob);
            nbgi_test_check(rc == NBG_OK && ob.response.pedestal == 3 && ob.pedestal_from == NBG_FROM_OPTION &&
                            ob.response.gain == 2 && ob.gain_from == NBG_FROM_MODEL, "list-option-wins",
                            "-pedestal 3 over the list's 10, the list's gain %g kept", ob.response.gain);
            if (rc == NBG_OK) nbg_observed_free(&ob);
            /* written back: the experiment's list states them again */
            nbg_report rl;
            nbg_geometry gw;
            rc = nbg_describe(ctx, &el, &rl);
            if (rc == NBG_OK) rc = nbg_geometry_from_report(ctx, &el, &rl, 1, &gw);
            nbgi_test_check(rc == NBG_OK && gw.response_stated == 1 && gw.gain == 2 && gw.pedestal == 10,
                            "list-written-back", "the geometry of the list's experiment: gain %g, pedestal %g",
                            gw.gain, gw.pedestal);
            /* raw floats are no list's image set: the list says nothing of them */
            char raw[4096];
            snprintf(raw, sizeof raw, "%s/lr-raw.bin", dir);
            rc = write_raw(ctx, raw, NPIX, 1.0f) ? nbg_observed_read(ctx, &el, raw, 0, NULL, &ob) : NBG_EIO;
            nbgi_test_check(rc == NBG_OK && ob.response.pedestal == 0 && ob.pedestal_from == NBG_FROM_DEFAULT &&
                            ob.response.gain == 1 && ob.gain_from == NBG_FROM_DEFAULT, "list-raw-floats",
                            "raw floats keep their pedestal %g and gain %g (the list's 10 and 2 are its images')",
                            rc ? NAN : ob.response.pedestal, rc ? NAN : ob.response.gain);
            if (rc == NBG_OK) nbg_observed_free(&ob);
        }
    }

    /* panels: one states a gain of its own, so every panel's are the list's; -gain wins over all */
    nbg_panel pan[2];
    memset(pan, 0, sizeof pan);
    for (int q = 0; q < 2; ++q) {
        pan[q].fpixels = FP;
        pan[q].spixels = SP / 2;
        pan[q].pixel = 0.1;
        pan[q].fast[0] = 1;
        pan[q].slow[1] = 1;
        pan[q].origin[0] = -1.6;
        pan[q].origin[1] = -1.2 + 1.2 * q;
        pan[q].origin[2] = 100;
        pan[q].group = q;
    }
    pan[1].own_response = 1;
    pan[1].response.gain = 3;
    pan[1].response.pedestal = 0;
    g.direction[0] = g.direction[1] = 0;
    g.direction[2] = -1;
    g.gain = 1;
    g.pedestal = 0;
    nbg_geometry gr;
    nbg_panel *rp = NULL;
    int np = 0;
    snprintf(list, sizeof list, "%s/lr-panels.expt", dir);
    char raw[4096];
    snprintf(raw, sizeof raw, "%s/lr-panels.img", dir);
    int rc = nbg_write_expt_panels(ctx, list, &g, pan, 2, raw);
    if (rc == NBG_OK) rc = nbg_read_expt_panels(ctx, list, &gr, &rp, &np);
    nbgi_test_check(rc == NBG_OK && np == 2 && rp[0].own_response && rp[1].own_response && rp[0].response.gain == 1 &&
                    rp[1].response.gain == 3 && gr.response_stated, "list-panels-read",
                    "a panel's own gain read (%d panels; gains %g %g; %s)", np, np == 2 ? rp[0].response.gain : 0,
                    np == 2 ? rp[1].response.gain : 0, rc ? nbg_errmsg(ctx) : "ok");
    if (rc != NBG_OK || np != 2) {
        free(rp);
        return;
    }
    nbg_experiment ep;
    experiment(&ep);
    rc = nbg_experiment_from_geometry(ctx, &gr, &ep);
    ep.panels = rp;
    ep.npanels = np;
    ep.panel_frame = NBG_PANELS_LAB;
    nbgi_test_check(rc == NBG_OK && write_smv(ctx, &e, raw, NAN, 60), "list-panels-image",
                    "an SMV file of %zu pixels", NPIX);
    nbg_observed ob;
    rc = nbg_observed_read(ctx, &ep, raw, 0, NULL, &ob);
    nbgi_test_check(rc == NBG_OK && ob.panel_response != NULL && ob.npanel_response == 2 &&
                    ob.panel_response[0].gain == 1 && ob.panel_response[1].gain == 3 &&
                    strstr(ob.response_text, "(the experiment's panels)") != NULL, "list-panels-response",
                    "each panel's gain from the list: %g %g ('%s')", rc ? 0 : ob.panel_response[0].gain,
                    rc ? 0 : ob.panel_response[1].gain, rc ? nbg_errmsg(ctx) : ob.response_text);
    if (rc == NBG_OK) nbg_observed_free(&ob);
    nbg_observed_options opt;
    nbg_observed_options_default(&opt);
    opt.gain = 5;
    rc = nbg_observed_read(ctx, &ep, raw, 0, &opt, &ob);
    nbgi_test_check(rc == NBG_OK && ob.panel_response != NULL && ob.panel_response[0].gain == 5 &&
                    ob.panel_response[1].gain == 5, "list-panels-option", "-gain 5 over the panels' own: %g %g",
                    rc ? 0 : ob.panel_response[0].gain, rc ? 0 : ob.panel_response[1].gain);
    if (rc == NBG_OK) nbg_observed_free(&ob);
    free(rp);
}
#endif

int main(void)
{
    nbg_ctx *ctx = NULL;
    if (nbg_ctx_create(&ctx, NBG_BACKEND_CPU, NBG_DOUBLE, 1) != NBG_OK) {
        printf("FAIL ctx could not create a context\n0 passed, 1 failed\n");
        return 1;
    }
    char dir[512], path[1024], p2[1024];
    if (nbgi_test_mkdtemp("nbg-observed-", dir, sizeof dir) == NULL) {
        printf("FAIL tmpdir\n0 passed, 1 failed\n");
        return 1;
    }
    /* stdout is ours: a call that printed would show as a line that is neither PASS nor FAIL (run-all.sh) */
    nbg_experiment e;
    experiment(&e);
    nbg_observed ob;
    nbg_observed_options opt;
    nbg_observed_options_default(&opt);
    nbgi_test_check(isnan(opt.pedestal) && isnan(opt.gain) && isnan(opt.read_noise) && isnan(opt.adc) &&
                    opt.what == NULL && opt.mask_what == NULL, "defaults", "the options' defaults are unset");

    /* a missing file */
    snprintf(path, sizeof path, "%s/missing.img", dir);
    opt.what = "-observed";
    int rc = nbg_observed_read(ctx, &e, path, 0, &opt, &ob);
    nbgi_test_check(rc == NBG_EIO && strncmp(nbg_errmsg(ctx), "-observed: ", 11) == 0 && ob.image == NULL &&
                    ob.use == NULL, "missing", "a missing file: %d, '%s'", rc, nbg_errmsg(ctx));
    rc = nbg_observed_read(ctx, &e, path, 2, &opt, &ob);
    nbgi_test_check(rc == NBG_EIO && strncmp(nbg_errmsg(ctx), "-observed (a later frame): ", 27) == 0,
                    "missing-later", "a later frame's message says so: '%s'", nbg_errmsg(ctx));

    /* the SMV ADC default: nanoBragg's 40, or the option adc; the overload left out; gain 1, read noise 0 */
    snprintf(path, sizeof path, "%s/nb.img", dir);
    nbgi_test_check(write_smv(ctx, &e, path, NAN, 65535), "smv-write", "an SMV file without ADC_OFFSET");
    rc = nbg_observed_read(ctx, &e, path, 0, NULL, &ob);
    nbgi_test_check(rc == NBG_OK && ob.npix == NPIX && ob.response.pedestal == 40 &&
                    ob.pedestal_from == NBG_FROM_DEFAULT && ob.response.gain == 1 && ob.gain_from == NBG_FROM_FILE &&
                    ob.response.read_noise == 0 && ob.read_noise_from == NBG_FROM_DEFAULT, "smv-adc-default",
                    "pedestal %g (40), gain %g, read noise %g (%s)", ob.response.pedestal, ob.response.gain,
                    ob.response.read_noise, rc ? nbg_errmsg(ctx) : "ok");
    char want[2048];
    snprintf(want, sizeof want, "observed image %s: pedestal 40 counts (an SMV file without ADC_OFFSET: nanoBragg's "
             "ADC offset (-adc)), gain 1 counts/photon, read noise 0 counts", path);
    nbgi_test_check(rc == NBG_OK && strcmp(ob.response_text, want) == 0, "smv-adc-text", "'%s'", ob.response_text);
    nbgi_test_check(rc == NBG_OK && ob.use[5] == 0 && ob.nleft_overload == 1 && ob.nleft_file == 0 &&
                    ob.nleft_mask == 0 && ob.use[4] == 1 && ob.image[4] == 54 && ob.saturation == 65535,
                    "overload", "the overloaded pixel is left out (%ld) at saturation %g", ob.nleft_overload,
                    ob.saturation);
    nbgi_test_check(rc == NBG_OK && strcmp(ob.left_out, "left out 1 of 768 pixels: 0 in the file's mask, 1 "
                    "overloaded (>= 65535 counts), 0 in the experiment's mask") == 0 && ob.note[0] == '\0',
                    "overload-text", "'%s'", ob.left_out);
    nbgi_test_check(rc == NBG_OK && ob.geometry.fpixels == FP && ob.geometry.spixels == SP, "geometry",
                    "the file's geometry: %d x %d", ob.geometry.fpixels, ob.geometry.spixels);
    nbg_observed_free(&ob);
    nbgi_test_check(ob.image == NULL && ob.use == NULL, "free", "nbg_observed_free empties the result");
    nbg_observed_free(NULL);
    opt.adc = 10;
    rc = nbg_observed_read(ctx, &e, path, 0, &opt, &ob);
    nbgi_test_check(rc == NBG_OK && ob.response.pedestal == 10, "smv-adc-option", "adc 10: pedestal %g",
                    ob.response.pedestal);
    nbg_observed_free(&ob);

    /* a file's own pedestal (ADC_OFFSET); the given values win over it; the experiment's mask is counted */
    snprintf(path, sizeof path, "%s/own.img", dir);
    nbgi_test_check(write_smv(ctx, &e, path, 7, 60), "smv-own-write", "an SMV file with ADC_OFFSET=7");
    rc = nbg_observed_read(ctx, &e, path, 0, &opt, &ob);
    nbgi_test_check(rc == NBG_OK && ob.response.pedestal == 7 && ob.pedestal_from == NBG_FROM_FILE &&
                    strstr(ob.response_text, "pedestal 7 counts (the file's)") != NULL && ob.left_out[0] == '\0',
                    "file-pedestal", "'%s'", ob.response_text);
    nbg_observed_free(&ob);
    opt.pedestal = 3;
    opt.gain = 2.5;
    opt.read_noise = 1.5;
    uint8_t mask[NPIX];
    memset(mask, 1, sizeof mask);
    mask[0] = mask[1] = 0;
    e.mask = mask;
    opt.mask_what = "-mask";
    rc = nbg_observed_read(ctx, &e, path, 0, &opt, &ob);
    nbgi_test_check(rc == NBG_OK && ob.response.pedestal == 3 && ob.response.gain == 2.5 &&
                    ob.response.read_noise == 1.5 && ob.pedestal_from == NBG_FROM_OPTION &&
                    ob.gain_from == NBG_FROM_OPTION && ob.read_noise_from == NBG_FROM_OPTION &&
                    strstr(ob.response_text, "pedestal 3 counts (-pedestal), gain 2.5 counts/photon, read noise 1.5 "
                           "counts") != NULL, "flags-win", "'%s'", ob.response_text);
    nbgi_test_check(rc == NBG_OK && ob.use[0] == 0 && ob.use[1] == 0 && ob.use[2] == 1 && ob.nleft_mask == 2 &&
                    strstr(ob.left_out, "2 in -mask") != NULL, "experiment-mask", "'%s'", ob.left_out);
    nbg_observed_free(&ob);
    e.mask = NULL;
    nbg_observed_options_default(&opt);
    opt.what = "-observed";
    opt.gain = -1;
    rc = nbg_observed_read(ctx, &e, path, 0, &opt, &ob);
    nbgi_test_check(rc == NBG_EINVAL && ob.image == NULL, "bad-gain", "a gain of -1 is refused: '%s'",
                    nbg_errmsg(ctx));
    opt.gain = NAN;

    /* raw floats: no pedestal; a value below 0 is data (noted); a NaN is refused naming the first */
    snprintf(path, sizeof path, "%s/raw.bin", dir);
    nbgi_test_check(write_raw(ctx, path, NPIX, 1.0f), "raw-write", "raw floats");
    rc = nbg_observed_read(ctx, &e, path, 0, &opt, &ob);
    nbgi_test_check(rc == NBG_OK && ob.response.pedestal == 0 && ob.pedestal_from == NBG_FROM_DEFAULT &&
                    ob.gain_from == NBG_FROM_DEFAULT && strstr(ob.response_text, "(raw floats carry none)") != NULL && ob.nnegative == 1 &&
                    ob.use[7] == 1 && ob.image[7] == -2.5f, "raw", "'%s'", ob.response_text);
    snprintf(want, sizeof want, "-observed %s: 1 pixels below 0 counts (dark-subtracted data?)", path);
    nbgi_test_check(strncmp(ob.note, want, strlen(want)) == 0, "negative-note", "'%s'", ob.note);
    nbg_observed_free(&ob);
    nbgi_test_check(write_raw(ctx, path, NPIX, NAN), "nan-write", "raw floats with a NaN");
    rc = nbg_observed_read(ctx, &e, path, 0, &opt, &ob);
    snprintf(want, sizeof want, "-observed %s: pixel 100 is nan (must be finite), 1 such pixels outside the file's "
             "mask", path);
    nbgi_test_check(rc == NBG_EINVAL && strcmp(nbg_errmsg(ctx), want) == 0 && ob.image == NULL && ob.use == NULL,
                    "nan", "a NaN pixel is refused: '%s'", nbg_errmsg(ctx));
    mask[100] = 0;
    e.mask = mask;
    rc = nbg_observed_read(ctx, &e, path, 0, &opt, &ob);
    nbgi_test_check(rc == NBG_OK && ob.use[100] == 0 && ob.image[100] == 0, "nan-masked",
                    "a NaN pixel the mask leaves out is 0 and not refused (%s)", rc ? nbg_errmsg(ctx) : "ok");
    nbg_observed_free(&ob);
    e.mask = NULL;
    mask[100] = 1;

    /* the wrong size, the wrong shape */
    snprintf(path, sizeof path, "%s/small.bin", dir);
    nbgi_test_check(write_raw(ctx, path, NPIX - 1, 0), "small-write", "raw floats, one pixel short");
    rc = nbg_observed_read(ctx, &e, path, 0, &opt, &ob);
    nbgi_test_check(rc != NBG_OK && ob.image == NULL && strstr(nbg_errmsg(ctx), "-observed: ") == nbg_errmsg(ctx),
                    "wrong-size-raw", "raw floats of another size: '%s'", nbg_errmsg(ctx));
    nbg_experiment e2 = e;
    e2.fpixels = SP;
    e2.spixels = FP;
    snprintf(path, sizeof path, "%s/turned.img", dir);
    nbgi_test_check(write_smv(ctx, &e2, path, NAN, 60), "turned-write", "an SMV file of 24 x 32");
    rc = nbg_observed_read(ctx, &e, path, 0, &opt, &ob);
    snprintf(want, sizeof want, "-observed %s is 24 x 32 pixels (fast x slow, as the file states) but the detector "
             "is 32 x 24: the same number of pixels in another shape is another image", path);
    nbgi_test_check(rc == NBG_EINVAL && strcmp(nbg_errmsg(ctx), want) == 0, "wrong-shape", "'%s'", nbg_errmsg(ctx));
    e2.fpixels = 16;
    snprintf(path, sizeof path, "%s/half.img", dir);
    nbgi_test_check(write_smv(ctx, &e2, path, NAN, 60), "half-write", "an SMV file of 16 x 32");
    rc = nbg_observed_read(ctx, &e, path, 0, &opt, &ob);
    snprintf(want, sizeof want, "-observed %s has 512 pixels, the detector has 768", path);
    nbgi_test_check(rc == NBG_EINVAL && strcmp(nbg_errmsg(ctx), want) == 0, "wrong-size", "'%s'", nbg_errmsg(ctx));

    /* a '#' template: frame 1 is the file numbered 2 */
    snprintf(path, sizeof path, "%s/series_02.img", dir);
    nbgi_test_check(write_smv(ctx, &e, path, 9, 60), "series-write", "frame 2 of a series");
    snprintf(p2, sizeof p2, "%s/series_##.img", dir);
    rc = nbg_observed_read(ctx, &e, p2, 1, &opt, &ob);
    nbgi_test_check(rc == NBG_OK && strcmp(ob.file, path) == 0 && ob.response.pedestal == 9 &&
                    ob.left_out[0] == '\0', "template", "frame 1 of %s is %s (%s)", p2, ob.file,
                    rc ? nbg_errmsg(ctx) : "ok");
    nbg_observed_free(&ob);
    e.mask = mask;
    rc = nbg_observed_read(ctx, &e, p2, 1, &opt, &ob);
    nbgi_test_check(rc == NBG_OK && strstr(ob.left_out, "of a later frame") != NULL, "later-frame-text", "'%s'",
                    ob.left_out);
    nbg_observed_free(&ob);
    e.mask = NULL;

    test_layout(ctx, dir);
#ifdef NBG_HAVE_FORMATS
    test_list_response(ctx, dir);
#endif

#ifdef NBG_HAVE_FORMATS
    /* a CBF's flagged pixels (-1, -2) are its mask: left out and set to 0; its own gain and pedestal */
    nbg_report r;
    nbg_geometry g;
    if (nbg_describe(ctx, &e, &r) == NBG_OK && nbg_geometry_from_report(ctx, &e, &r, 1, &g) == NBG_OK) {
        g.gain = 2;
        g.pedestal = 5;
        int32_t d[NPIX];
        for (size_t i = 0; i < NPIX; ++i) d[i] = 20;
        d[3] = -1;
        d[4] = -2;
        snprintf(path, sizeof path, "%s/flagged.cbf", dir);
        rc = nbg_write_cbf(ctx, path, &g, 0, d);
        nbgi_test_check(rc == NBG_OK, "cbf-write", "a CBF with flagged pixels (%s)", rc ? nbg_errmsg(ctx) : "ok");
        rc = nbg_observed_read(ctx, &e, path, 0, &opt, &ob);
        nbgi_test_check(rc == NBG_OK && ob.use[3] == 0 && ob.use[4] == 0 && ob.image[3] == 0 && ob.image[4] == 0 &&
                        ob.nleft_file == 2 && ob.nnegative == 0 && ob.have_geometry, "cbf-mask",
                        "the flagged pixels are the file's mask: %ld (%s)", ob.nleft_file,
                        rc ? nbg_errmsg(ctx) : "ok");
        nbgi_test_check(rc == NBG_OK && ob.response.gain == 2 && ob.gain_from == NBG_FROM_FILE &&
                        ob.response.pedestal == 5 && ob.pedestal_from == NBG_FROM_FILE, "cbf-response",
                        "the file's gain %g and pedestal %g", ob.response.gain, ob.response.pedestal);
        nbg_observed_free(&ob);
    } else {
        nbgi_test_check(0, "cbf-geometry", "%s", nbg_errmsg(ctx));
    }
#endif
    nbgi_test_rmtree(dir);
    nbg_ctx_destroy(ctx);
    return nbgi_test_summary();
}
