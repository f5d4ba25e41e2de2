/*
 * test-formats-cli.c -- the program's detector files: series, NXmx, CBF, experiment lists, through build/nbgrad.
 *
 *   - A 3-frame series: per-image files get the frame number (with and without '#' in the name), one image keeps
 *     its name, frame i is the single image simulated from phi0 + i osc.
 *   - The truth written as an experiment list (-exptfile) and read back (-expt) renders the same image as the flags
 *     that wrote it, in two conventions: the geometry of the files is the experiment's.
 *   - The NXmx file holds the frames the per-image files hold (read back by the library); the CBF files the same.
 *   - -observed reads NXmx and CBF: grad on an NXmx observation equals grad on the SMV of the same counts.
 *   - SMV stays nanoBragg's byte for byte unless -smv_adc_offset; the dials.import line names the overrides.
 *   - Two panels: -nxsfile and -exptfile write every panel (read back by the library); -intfile is refused.
 *   - A list whose beam is 2 deg off -z: -exptfile keeps its frame, -nxsfile turns it as a whole (NXmx: the beam
 *     along -z), both render the same image.
 *   - Refusals: -cbffile with -data float (simulate and batch); -expt naming a list with two overlapping panels, a list with a missing field; a
 *     failed run leaves no file.
 */
#include "clirun.h"

#include "nbgrad.h"

static nbg_ctx *g_ctx;

/* Reads work/name with the library (any format); NULL on failure (message in g_ctx). */
static float *read_back(const run_result *r, const char *name, int frame, size_t npix, size_t *n, nbg_geometry *g)
{
    char path[PATH_MAX + 256];
    snprintf(path, sizeof path, "%s/%s", r->work, name);
    float *img = NULL;
    if (nbg_read_image(g_ctx, path, frame, npix, &img, n, g, NULL, NULL) != NBG_OK) {
        return NULL;
    }
    return img;
}

#define XTAL "-cell", "57", "68", "79", "85", "105", "95", "-misset", "12", "-25", "33", "-default_F", "100", "-N", \
             "6", "-lambda", "0.9795", "-detpixels", "64", "-pixel", "0.4", "-oversample", "1", "-phisteps", "2"

static void test_series(void)
{
    run_result r;
    if (!new_case(&r)) {
        return;
    }
    const char *args[] = {"-dials", XTAL, "-close_distance", "80", "-ORGX", "20", "-ORGY", "40", "-detector_rotx", "3",
                          "-phi", "10", "-osc", "0.5", "-frames", "3", "-floatfile", "f.bin", "-intfile", "i_###.img",
                          "-nxsfile", "s.nxs", "-cbffile", "c.cbf", "-exptfile", "truth.expt", "-adc", "40",
                          "-scale", "1", NULL};
    run_in(&r, args);
    nbgi_test_check(r.status == 0, "FMT-series-run", "a 3-frame series with every output (exit %d: %s)", r.status,
                    first_line(r.err));
    const char *want[] = {"f_00001.bin", "f_00003.bin", "i_001.img", "i_003.img", "c_00002.cbf", "s.nxs",
                          "truth.expt"};
    int all = 1;
    for (size_t i = 0; i < sizeof want / sizeof want[0]; ++i) all &= exists_in(r.work, want[i]);
    nbgi_test_check(all && !exists_in(r.work, "f.bin") && !exists_in(r.work, "i_004.img"), "FMT-series-names",
                    "frame-numbered names: f_00001.bin .. f_00003.bin, i_001.img .. (from ###), c_00001.cbf ..");
    nbgi_test_check(strstr(r.out, "note: SMV cannot describe this detector") != NULL, "FMT-series-smv-note",
                    "a rotated detector: the program says SMV cannot describe it");

    /* frame 2 of the series is the single image from phi0 + 2 osc */
    run_result one;
    if (new_case(&one)) {
        const char *a1[] = {"-dials", XTAL, "-close_distance", "80", "-ORGX", "20", "-ORGY", "40", "-detector_rotx",
                            "3", "-phi", "11", "-osc", "0.5", "-floatfile", "f.bin", NULL};
        run_in(&one, a1);
        size_t size = 0;
        nbgi_test_check(one.status == 0 && same_file(&r, "f_00003.bin", &one, "f.bin", &size), "FMT-series-frame",
                        "frame 3 (phi 11) equals the single image at -phi 11, byte for byte (%zu bytes)", size);
        result_free(&one);
    }

    /* the NXmx file holds the integer frames, the CBF files the same counts as the SMV files */
    const size_t npix = 64 * 64;
    size_t n1 = 0, n2 = 0, n3 = 0;
    nbg_geometry g;
    float *nx = read_back(&r, "s.nxs", 2, npix, &n1, &g);
    float *smv = read_back(&r, "i_003.img", 0, npix, &n2, NULL);
    float *cbf = read_back(&r, "c_00003.cbf", 0, npix, &n3, NULL);
    const int ok = nx != NULL && smv != NULL && cbf != NULL && n1 == npix && n2 == npix && n3 == npix;
    if (nbgi_test_check(ok, "FMT-series-read", "frame 3 read back from NXmx, SMV and CBF (%s)", nbg_errmsg(g_ctx))) {
        nbgi_test_check(nbgi_test_max_rel_diff(smv, nx, npix) == 0 && nbgi_test_max_rel_diff(smv, cbf, npix) == 0, "FMT-series-same",
                        "NXmx frame 3 = CBF 3 = SMV 3, pixel for pixel");
        nbgi_test_check(g.nframes == 3 && fabs(g.scan_start - 10) < 1e-12 && fabs(g.scan_width - 0.5) < 1e-12 &&
                            g.pedestal == 40,
                        "FMT-series-scan", "NXmx scan: %d frames from %g by %g, pedestal %g", g.nframes, g.scan_start,
                        g.scan_width, g.pedestal);
    }
    free(nx);
    free(smv);
    free(cbf);

    /* the experiment list renders the same image as the flags that wrote it */
    run_result back;
    if (new_case(&back)) {
        char expt[PATH_MAX + 256];
        snprintf(expt, sizeof expt, "%s/truth.expt", r.work);
        const char *a2[] = {"-expt", expt, "-default_F", "100", "-N", "6", "-oversample", "1", "-phisteps", "2",
                            "-floatfile", "f.bin", NULL};
        run_in(&back, a2);
        nbgi_test_check(back.status == 0 && strstr(back.out, "3 images") != NULL, "FMT-expt-run",
                        "-expt truth.expt: the scan's 3 images (exit %d: %s)", back.status, first_line(back.err));
        size_t na = 0, nb = 0;
        float *a = read_back(&r, "f_00002.bin", 0, npix, &na, NULL);
        float *b = read_back(&back, "f_00002.bin", 0, npix, &nb, NULL);
        const double d = a != NULL && b != NULL ? nbgi_test_max_rel_diff(a, b, npix) : INFINITY;
        nbgi_test_check(d < 1e-6, "FMT-expt-image",
                        "frame 2 rendered from the experiment list equals the original: max |diff| / max = %.3g", d);
        free(a);
        free(b);
        result_free(&back);
    }
    result_free(&r);
}

/* nbgrad's sampling survives its experiment lists: mosaic domains, divergence and dispersion (on a rotated XDS
 * detector with two-theta) render the same image from the flags, from the list they wrote and from the list that
 * list wrote; without the sampling the list carried (the frame of the domains too) they would differ by 6-60 % */
static void test_sampling_lists(void)
{
    static const char *const cases[][12] = {
        {"-mosaic", "0.5", "-mosaic_dom", "6", NULL},
        {"-divergence", "2", "-divsteps", "3", NULL},
        {"-dispersion", "2", "-dispsteps", "3", NULL},
        {"-mosaic", "0.5", "-mosaic_dom", "6", "-hdivrange", "1", "-vdivrange", "2", "-hdivsteps", "3", "-dispersion",
         "1"},
    };
    static const char *const names[] = {"FMT-sampling-mosaic", "FMT-sampling-divergence", "FMT-sampling-dispersion",
                                        "FMT-sampling-all"};
    const size_t npix = 64 * 64;
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; ++k) {
        run_result r, b1, b2;
        if (!new_case(&r)) {
            return;
        }
        const char *args[64] = {"-xds", XTAL, "-twotheta", "5", "-detector_rotx", "3", "-phi", "10", "-osc", "0.5"};
        int na = 0;
        while (args[na] != NULL) {
            ++na;
        }
        for (int j = 0; j < 12 && cases[k][j] != NULL; ++j) {
            args[na++] = cases[k][j];
        }
        if (k == 3) {
            args[na++] = "-dispsteps";
            args[na++] = "3";
        }
        args[na++] = "-floatfile", args[na++] = "f.bin", args[na++] = "-exptfile", args[na++] = "l1.expt";
        args[na] = NULL;
        run_in(&r, args);
        double d1 = INFINITY, d2 = INFINITY;
        if (r.status == 0 && new_case(&b1)) {
            char l1[PATH_MAX + 64];
            snprintf(l1, sizeof l1, "%s/l1.expt", r.work);
            const char *a1[] = {"-expt", l1, "-default_F", "100", "-N", "6", "-oversample", "1", "-phisteps", "2",
                                "-floatfile", "f.bin", "-exptfile", "l2.expt", NULL};
            run_in(&b1, a1);
            if (b1.status == 0 && new_case(&b2)) {
                char l2[PATH_MAX + 64];
                snprintf(l2, sizeof l2, "%s/l2.expt", b1.work);
                const char *a2[] = {"-expt", l2, "-default_F", "100", "-N", "6", "-oversample", "1", "-phisteps",
                                    "2", "-floatfile", "f.bin", NULL};
                run_in(&b2, a2);
                size_t n0 = 0, n1 = 0, n2 = 0;
                float *f0 = read_back(&r, "f.bin", 0, npix, &n0, NULL), *f1 = read_back(&b1, "f.bin", 0, npix, &n1, NULL);
                float *f2 = read_back(&b2, "f.bin", 0, npix, &n2, NULL);
                if (f0 != NULL && f1 != NULL && f2 != NULL) {
                    d1 = nbgi_test_max_rel_diff(f0, f1, npix);
                    d2 = nbgi_test_max_rel_diff(f0, f2, npix);
                }
                free(f0);
                free(f1);
                free(f2);
                result_free(&b2);
            }
            result_free(&b1);
        }
        nbgi_test_check(d1 <= 1e-9 && d2 <= 1e-9, names[k], "the flags, their list and its list render the same "
                        "image: max |diff| / max %.3g and %.3g (exit %d)", d1, d2, r.status);
        if (k == 0 && r.status == 0) {
            /* a list without nbgrad's sampling (as DIALS writes it) and the flags again: the domains are drawn
             * where the flags' run drew them, in the frame of their convention (-xds), and the image is the same;
             * with another convention's flags they are drawn elsewhere */
            char l1[PATH_MAX + 64], plain[PATH_MAX + 64];
            snprintf(l1, sizeof l1, "%s/l1.expt", r.work);
            snprintf(plain, sizeof plain, "%s/plain.expt", r.work);
            nbg_geometry g;
            int ok = nbg_read_expt(g_ctx, l1, &g) == NBG_OK && g.has_mosaic;
            g.has_mosaic = 0;
            ok = ok && nbg_write_expt(g_ctx, plain, &g, NULL) == NBG_OK;
            double d[2] = {INFINITY, INFINITY};
            for (int conv = 0; ok && conv < 2; ++conv) {
                run_result p;
                if (!new_case(&p)) {
                    break;
                }
                const char *a[] = {"-expt", plain, conv == 0 ? "-xds" : "-mosflm", "-mosaic", "0.5", "-mosaic_dom",
                                   "6", "-default_F", "100", "-N", "6", "-oversample", "1", "-phisteps", "2",
                                   "-floatfile", "f.bin", NULL};
                run_in(&p, a);
                size_t n0 = 0, n1 = 0;
                float *f0 = read_back(&r, "f.bin", 0, npix, &n0, NULL), *f1 = read_back(&p, "f.bin", 0, npix, &n1, NULL);
                if (p.status == 0 && f0 != NULL && f1 != NULL) {
                    d[conv] = nbgi_test_max_rel_diff(f0, f1, npix);
                }
                free(f0);
                free(f1);
                result_free(&p);
            }
            nbgi_test_check(ok && d[0] <= 1e-9 && d[1] > 1e-3, "FMT-sampling-mosaic-plain-list",
                            "a list without nbgrad's domains and the flags' -mosaic_seed: the flags' image with their "
                            "convention (max |diff| / max %.3g); drawn in another convention's frame, another image "
                            "(%.3g)", d[0], d[1]);
        }
        result_free(&r);
    }
}

/* -observed takes NXmx and CBF: the loss and gradient equal those on the SMV of the same counts */
static void test_observed(void)
{
    run_result r;
    if (!new_case(&r)) {
        return;
    }
    const char *sim[] = {"-mosflm", XTAL, "-distance", "90", "-noisefile", "n.img", "-nxsfile", "n.nxs", "-cbffile",
                         "n.cbf", "-data", "noise", "-seed", "3", NULL};
    run_in(&r, sim);
    if (!nbgi_test_check(r.status == 0, "FMT-observed-sim", "noise image as SMV, NXmx, CBF (exit %d: %s)", r.status,
                         first_line(r.err))) {
        result_free(&r);
        return;
    }
    char line[3][256] = {"", "", ""};
    const char *files[3] = {"n.img", "n.nxs", "n.cbf"};
    for (int k = 0; k < 3; ++k) {
        const char *g[] = {"grad", "-mosflm", XTAL, "-distance", "90", "-observed", files[k], "-loss", "poisson",
                           "-params", "a,rotx", NULL};
        run_in(&r, g);
        const char *l = strstr(r.out, "loss");
        snprintf(line[k], sizeof line[k], "%s", l != NULL ? first_line(l) : "");
        if (r.status != 0) {
            snprintf(line[k], sizeof line[k], "exit %d: %s", r.status, first_line(r.err));
        }
    }
    nbgi_test_check(line[0][0] != '\0' && strcmp(line[0], line[1]) == 0 && strcmp(line[0], line[2]) == 0,
                    "FMT-observed", "grad -observed SMV / NXmx / CBF give the same loss: \"%s\" / \"%s\" / \"%s\"",
                    line[0], line[1], line[2]);
    result_free(&r);
}

static void test_smv_key(void)
{
    run_result a, b;
    if (!new_case(&a) || !new_case(&b)) {
        return;
    }
    const char *a1[] = {"-mosflm", XTAL, "-distance", "90", "-intfile", "i.img", NULL};
    const char *b1[] = {"-mosflm", XTAL, "-distance", "90", "-intfile", "i.img", "-smv_adc_offset", NULL};
    run_in(&a, a1);
    run_in(&b, b1);
    size_t sa = 0, sb = 0;
    char *ha = read_in(&a, "i.img", &sa), *hb = read_in(&b, "i.img", &sb);
    nbgi_test_check(ha != NULL && hb != NULL && strstr(ha, "ADC_OFFSET") == NULL && strstr(hb, "ADC_OFFSET=40;") != NULL,
                    "FMT-smv-adc", "ADC_OFFSET only with -smv_adc_offset (nanoBragg's header otherwise)");
    nbgi_test_check(strstr(a.out, "dials.import i.img fast_slow_beam_centre=") != NULL &&
                        strstr(a.out, "geometry.detector.panel.pedestal=40") != NULL,
                    "FMT-dials-import-line", "the dials.import line: %s",
                    strstr(a.out, "dials.import") ? first_line(strstr(a.out, "dials.import")) : "(none)");
    free(ha);
    free(hb);
    result_free(&a);
    result_free(&b);
}

static void test_refusals(void)
{
    run_result r;
    if (new_case(&r)) {
        const char *args[] = {XTAL, "-cbffile", "out.cbf", "-data", "float", NULL};
        const char *words[] = {"-cbffile", "integers", NULL};
        const char *inputs[] = {NULL};
        expect_failure("FMT-cbf-float", "-cbffile with -data float", &r, args, words, inputs);
        result_free(&r);
    }
    if (new_case(&r)) {
        /* the same in batch (it used to crash on the first shot) */
        const char *shots = "{\"id\":\"s1\",\"N\":5}\n{\"id\":\"s2\",\"N\":6}\n";
        const char *args[] = {"batch", XTAL, "-shots", "shots.jsonl", "-cbffile", "{id}.cbf", "-data", "float", NULL};
        const char *words[] = {"-cbffile", "integers", "-nxsfile", NULL};
        const char *inputs[] = {"shots.jsonl", NULL};
        if (put_file(&r, "shots.jsonl", shots)) {
            expect_failure("FMT-cbf-float-batch", "batch -cbffile with -data float", &r, args, words, inputs);
        }
        result_free(&r);
    }
    if (new_case(&r)) {
        /* a list with two panels at the same place (the first panel's JSON object twice): they overlap */
        const char *two =
            "{\"__id__\": \"ExperimentList\", \"experiment\": [{\"__id__\": \"Experiment\", \"beam\": 0, "
            "\"detector\": 0}], \"beam\": [{\"direction\": [0, 0, 1], \"wavelength\": 1}], \"detector\": "
            "[{\"panels\": [{\"fast_axis\": [1, 0, 0], \"slow_axis\": [0, -1, 0], \"origin\": [-10, 10, -100], "
            "\"pixel_size\": [0.1, 0.1], \"image_size\": [64, 64]}, {\"fast_axis\": [1, 0, 0], \"slow_axis\": "
            "[0, -1, 0], \"origin\": [-10, 10, -100], \"pixel_size\": [0.1, 0.1], \"image_size\": [64, 64]}]}]}\n";
        put_file(&r, "two.expt", two);
        const char *args[] = {"-expt", "two.expt", "-cell", "50", "50", "50", "90", "90", "90", "-default_F", "100",
                              "-floatfile", "out.float", NULL};
        const char *words[] = {"panel 0 and panel 1 overlap", NULL};
        const char *inputs[] = {"two.expt", NULL};
        expect_failure("FMT-expt-two-panels", "-expt with two panels at the same place", &r, args, words, inputs);
        result_free(&r);
    }
    if (new_case(&r)) {
        const char *bad = "{\"__id__\": \"ExperimentList\", \"experiment\": [{\"__id__\": \"Experiment\", \"beam\": 0, "
                          "\"detector\": 0}], \"beam\": [{\"direction\": [0, 0, 1], \"wavelength\": 1}], "
                          "\"detector\": [{\"panels\": [{\"slow_axis\": [0, -1, 0], \"origin\": [-10, 10, -100], "
                          "\"pixel_size\": [0.1, 0.1], \"image_size\": [64, 64]}]}]}\n";
        put_file(&r, "bad.expt", bad);
        const char *args[] = {"-expt", "bad.expt", "-default_F", "100", "-floatfile", "out.float", NULL};
        const char *words[] = {"bad.expt", "fast_axis", NULL};
        const char *inputs[] = {"bad.expt", NULL};
        expect_failure("FMT-expt-missing", "-expt without a fast axis", &r, args, words, inputs);
        result_free(&r);
    }
}

/* Two panels (a list with two panels side by side, one turned by 90 deg, one farther) written as NXmx and as an
 * experiment list with every panel: the NXmx frames are the float series', its modules and the list's panels
 * are the input's; -intfile stays refused with panels, naming the flag. */
static void test_panels(void)
{
    const char *two =
        "{\"__id__\": \"ExperimentList\", \"experiment\": [{\"__id__\": \"Experiment\", \"beam\": 0, "
        "\"detector\": 0}], \"beam\": [{\"direction\": [0, 0, 1], \"wavelength\": 1}], \"detector\": "
        "[{\"panels\": [{\"name\": \"a\", \"fast_axis\": [1, 0, 0], \"slow_axis\": [0, -1, 0], \"origin\": "
        "[-10, 10, -100], \"pixel_size\": [0.1, 0.1], \"image_size\": [32, 24]}, {\"name\": \"b\", "
        "\"fast_axis\": [0, -1, 0], \"slow_axis\": [-1, 0, 0], \"origin\": [10, 10, -110], \"pixel_size\": "
        "[0.2, 0.2], \"image_size\": [32, 16]}]}]}\n";
    run_result r;
    if (!new_case(&r)) {
        return;
    }
    put_file(&r, "two.expt", two);
    const char *args[] = {"-expt", "two.expt", "-cell", "50", "60", "70", "90", "90", "90", "-default_F", "100",
                          "-N", "5", "-water", "1", "-frames", "2", "-osc", "0.5", "-data", "float", "-floatfile",
                          "f.bin", "-nxsfile", "p.nxs", "-exptfile", "p.expt", NULL};
    run_in(&r, args);
    nbgi_test_check(r.status == 0, "FMT-panels-run", "two panels with -nxsfile and -exptfile (exit %d: %s)", r.status,
                    first_line(r.err));
    const size_t npix = 32 * 24 + 32 * 16;
    int same = r.status == 0;
    for (int f = 0; same && f < 2; ++f) {
        size_t n1 = 0, n2 = 0;
        float *a = read_back(&r, f == 0 ? "f_00001.bin" : "f_00002.bin", 0, npix, &n1, NULL);
        float *b = read_back(&r, "p.nxs", f, 0, &n2, NULL);
        same = a != NULL && b != NULL && n1 == npix && n2 == npix && memcmp(a, b, npix * sizeof *a) == 0;
        free(a);
        free(b);
    }
    nbgi_test_check(same, "FMT-panels-nxmx-frames", "the NXmx file's two frames are the float series' (%s)",
                    same ? "equal" : nbg_errmsg(g_ctx));
    static const double want[2][9] = {{1, 0, 0, 0, -1, 0, -10, 10, -100}, {0, -1, 0, -1, 0, 0, 10, 10, -110}};
    const int wf[2] = {32, 32}, ws[2] = {24, 16};
    const double wp[2] = {0.1, 0.2};
    for (int which = 0; which < 2 && r.status == 0; ++which) {
        char path[PATH_MAX + 256];
        snprintf(path, sizeof path, "%s/%s", r.work, which == 0 ? "p.nxs" : "p.expt");
        nbg_geometry g;
        nbg_panel *pan = NULL;
        int np = 0;
        const int rc = which == 0 ? nbg_read_nxmx_panels(g_ctx, path, &g, &pan, &np)
                                  : nbg_read_expt_panels(g_ctx, path, &g, &pan, &np);
        double d = rc == NBG_OK && np == 2 ? 0 : INFINITY;
        int ok = rc == NBG_OK && np == 2;
        for (int k = 0; ok && k < 2; ++k) {
            ok = pan[k].fpixels == wf[k] && pan[k].spixels == ws[k] && pan[k].pixel == wp[k] &&
                 strcmp(pan[k].name, k == 0 ? "a" : "b") == 0;
            for (int x = 0; x < 3; ++x) {
                d = fmax(d, fabs(pan[k].fast[x] - want[k][x]));
                d = fmax(d, fabs(pan[k].slow[x] - want[k][3 + x]));
                d = fmax(d, fabs(pan[k].origin[x] - want[k][6 + x]));
            }
        }
        nbgi_test_check(ok && d <= 1e-9, which == 0 ? "FMT-panels-nxmx" : "FMT-panels-expt",
                        "%s: %d panels read back, off by %.3g (%s)", which == 0 ? "NXmx" : "experiment list", np, d,
                        rc == NBG_OK ? "ok" : nbg_errmsg(g_ctx));
        free(pan);
    }
    result_free(&r);
    if (new_case(&r)) {
        put_file(&r, "two.expt", two);
        const char *iargs[] = {"-expt", "two.expt", "-cell", "50", "60", "70", "90", "90", "90", "-default_F", "100",
                               "-intfile", "x.img", NULL};
        const char *words[] = {"-intfile", "single flat detector", "2 panels", NULL};
        const char *inputs[] = {"two.expt", NULL};
        expect_failure("FMT-panels-intfile", "-intfile with panels", &r, iargs, words, inputs);
        result_free(&r);
    }
}

/* A DIALS list whose beam dials.index tilted 2 deg off -z, through the program: -exptfile writes it back in its own
 * frame (the beam as it was), -nxsfile (which holds a beam along -z only) the same experiment turned as a whole (the
 * angles and lengths between beam and detector the list's), the NXmx pixels the float image's, and the list written
 * renders the image of the list read.  Two panels the same. */
static double dot3(const double *a, const double *b) { return a[0] * b[0] + a[1] * b[1] + a[2] * b[2]; }

static void test_tilted_list(void)
{
    const double t = 2 * M_PI / 180;
    for (int panels = 0; panels < 2; ++panels) {
        char list[4096];
        snprintf(list, sizeof list,
                 "{\"__id__\": \"ExperimentList\", \"experiment\": [{\"__id__\": \"Experiment\", \"beam\": 0, "
                 "\"detector\": 0, \"goniometer\": 0, \"scan\": 0, \"crystal\": 0}], \"beam\": [{\"direction\": "
                 "[%.17g, 0, %.17g], \"wavelength\": 0.9795}], \"detector\": [{\"panels\": [{\"name\": \"a\", "
                 "\"fast_axis\": [1, 0, 0], \"slow_axis\": [0, -1, 0], \"origin\": [-33.3, 31.7, -120.4], "
                 "\"pixel_size\": [1, 1], \"image_size\": [64, %d]}%s]}], \"goniometer\": [{\"rotation_axis\": "
                 "[1, 0, 0]}], \"scan\": [{\"image_range\": [1, 1], \"oscillation\": [3, 0.5], \"exposure_time\": "
                 "[1]}], \"crystal\": [{\"__id__\": \"crystal\", \"real_space_a\": [51.2, 3.1, -2.4], "
                 "\"real_space_b\": [7.5, 62.3, 4.4], \"real_space_c\": [-6.1, 9.8, 83.7], "
                 "\"space_group_hall_symbol\": \" P 1\"}]}\n",
                 sin(t), cos(t), panels ? 30 : 64,
                 panels ? ", {\"name\": \"b\", \"fast_axis\": [0.99862953475457383, 0, 0.052335956242943835], "
                          "\"slow_axis\": [0, -1, 0], \"origin\": [-33.3, -0.3, -121.1], \"pixel_size\": [1, 1], "
                          "\"image_size\": [64, 30]}"
                        : "");
        run_result r, b;
        if (!new_case(&r)) {
            return;
        }
        put_file(&r, "tilted.expt", list);
        const char *args[] = {"-expt", "tilted.expt", "-default_F", "100", "-N", "6", "-oversample", "1",
                              "-phisteps", "2", "-data", "float", "-floatfile", "f.bin", "-nxsfile", "s.nxs",
                              "-exptfile", "out.expt", NULL};
        run_in(&r, args);
        const char *tag = panels ? "FMT-tilted-panels" : "FMT-tilted";
        char id[64];
        snprintf(id, sizeof id, "%s-run", tag);
        if (!nbgi_test_check(r.status == 0, id, "a list with the beam 2 deg off -z, -nxsfile and -exptfile (exit %d: "
                             "%s)", r.status, first_line(r.err))) {
            result_free(&r);
            continue;
        }
        char path[PATH_MAX + 256];
        nbg_geometry gl, go, gn;
        nbg_panel *pl = NULL, *po = NULL, *pn = NULL;
        int nl = 0, no = 0, nn = 0;
        snprintf(path, sizeof path, "%s/tilted.expt", r.work);
        int ok = nbg_read_expt_panels(g_ctx, path, &gl, &pl, &nl) == NBG_OK;
        snprintf(path, sizeof path, "%s/out.expt", r.work);
        ok = ok && nbg_read_expt_panels(g_ctx, path, &go, &po, &no) == NBG_OK;
        snprintf(path, sizeof path, "%s/s.nxs", r.work);
        ok = ok && nbg_read_nxmx_panels(g_ctx, path, &gn, &pn, &nn) == NBG_OK && nl == no && nl == nn;
        /* the list written: every vector as read; the NXmx file: the beam along -z, the beam's angles to the
         * panels' axes and the panels' corners along and across the beam the list's */
        double dl = ok ? 0 : INFINITY, dn = ok ? 0 : INFINITY;
        for (int k = 0; ok && k < nl; ++k) {
            for (int i = 0; i < 3; ++i) {
                dl = fmax(dl, fmax(fabs(po[k].fast[i] - pl[k].fast[i]), fabs(po[k].slow[i] - pl[k].slow[i])));
                dl = fmax(dl, fabs(po[k].origin[i] - pl[k].origin[i]) / 100);
                dl = fmax(dl, fabs(go.direction[i] - gl.direction[i]));
            }
            const double inv_l[4] = {dot3(pl[k].fast, gl.direction), dot3(pl[k].slow, gl.direction),
                                     dot3(pl[k].origin, gl.direction), dot3(pl[k].origin, pl[k].origin)};
            const double inv_n[4] = {dot3(pn[k].fast, gn.direction), dot3(pn[k].slow, gn.direction),
                                     dot3(pn[k].origin, gn.direction), dot3(pn[k].origin, pn[k].origin)};
            for (int i = 0; i < 4; ++i) dn = fmax(dn, fabs(inv_n[i] - inv_l[i]) / (i < 2 ? 1 : i == 2 ? 100 : 1e4));
        }
        snprintf(id, sizeof id, "%s-expt", tag);
        nbgi_test_check(ok && dl <= 1e-12, id, "-exptfile keeps the list's beam (%.6f, %.6f, %.6f) and %d panel(s) as "
                        "they were (largest difference %.2g; %s)", go.direction[0], go.direction[1], go.direction[2],
                        no, dl, ok ? "ok" : nbg_errmsg(g_ctx));
        snprintf(id, sizeof id, "%s-nxmx", tag);
        nbgi_test_check(ok && fabs(gn.direction[0]) < 1e-12 && fabs(gn.direction[1]) < 1e-12 && dn <= 1e-12, id,
                        "-nxsfile: the beam along -z (%.3g, %.3g, %.6f), the detector turned with it (beam-detector "
                        "invariants differ by %.2g relative)", gn.direction[0], gn.direction[1], gn.direction[2], dn);
        free(pl);
        free(po);
        free(pn);
        /* the NXmx pixels are the float image's, and the list written renders it again */
        const size_t npix = panels ? 2 * 64 * 30 : 64 * 64;
        size_t n1 = 0, n2 = 0, n3 = 0;
        float *f = read_back(&r, "f.bin", 0, npix, &n1, NULL), *x = read_back(&r, "s.nxs", 0, 0, &n2, NULL), *f2 = NULL;
        if (new_case(&b)) {
            snprintf(path, sizeof path, "%s/out.expt", r.work);
            const char *a2[] = {"-expt", path, "-default_F", "100", "-N", "6", "-oversample", "1", "-phisteps", "2",
                                "-floatfile", "f.bin", NULL};
            run_in(&b, a2);
            f2 = b.status == 0 ? read_back(&b, "f.bin", 0, npix, &n3, NULL) : NULL;
            result_free(&b);
        }
        const double d1 = f != NULL && x != NULL && n1 == npix && n2 == npix ? nbgi_test_max_rel_diff(f, x, npix)
                                                                             : INFINITY;
        const double d2 = f != NULL && f2 != NULL && n3 == npix ? nbgi_test_max_rel_diff(f, f2, npix) : INFINITY;
        snprintf(id, sizeof id, "%s-image", tag);
        nbgi_test_check(d1 == 0 && d2 <= 1e-9, id, "the NXmx pixels are the float image's (max |diff| / max %.3g) and "
                        "-expt out.expt renders the same image (%.3g)", d1, d2);
        free(f);
        free(x);
        free(f2);
        result_free(&r);
    }
}

int main(void)
{
    if (!clirun_setup("nbg-test-formats-") || nbg_ctx_create(&g_ctx, NBG_BACKEND_CPU, NBG_DOUBLE, 1) != NBG_OK) {
        return nbgi_test_summary();
    }
#ifdef NBG_HAVE_FORMATS
    test_series();
    test_sampling_lists();
    test_observed();
    test_smv_key();
    test_refusals();
    test_panels();
    test_tilted_list();
#else
    nbgi_test_skip("FMT", "built without the formats (FORMATS=0)");
#endif
    nbg_ctx_destroy(g_ctx);
    nbgi_test_rmtree(g_root);
    return nbgi_test_summary();
}
