/*
 * test-ensemble.c -- nbgrad ensemble through the program: recovery of perturbed structure factors and per-shot
 * orientations from 50 noisy still shots, and the same answer, byte for byte, for 1, 2 and 4 MPI ranks and for one
 * or three threads.
 *
 * The data: a 100 A cubic cell, an F table over h, k, l in -3..3 (343 entries, uniform in 50..150 from a fixed
 * seed), 50 shots in random orientations (nbgrad shots), Poisson noise with the ADC offset (nbgrad batch).  The
 * start: every F off by 15 % rms, every misset angle off by 0.2 deg rms.  Checks:
 *   - the loss goes down; F's error shrinks by half or more, and the errors over their standard errors have an rms
 *     in 0.6..1.5 with >= 95 % within 3 sigma (the standard errors are right, not only the values);
 *   - the orientations' error shrinks by a factor 3 or more;
 *   - mpirun -n 1, 2, 4 (one thread each) write the same JSON file as the run without MPI on three threads: the
 *     answer depends on neither the rank count nor the thread count (skipped, with the reason, where mpirun or the
 *     MPI build is missing);
 *   - with -spots 3 (each shot on its spot regions), F still recovered with right standard errors;
 *   - refusals: F as a local parameter, an unknown global, -global F without a table;
 *   - stills from per-shot experiment lists ("expt") with per-shot spectra: spectrum_shift and the orientation
 *     recovered (test_expt_spectrum).
 */
#include "clirun.h"

#ifdef NBG_HAVE_FORMATS
#include <jansson.h> /* the shot lists and the result, read as JSON */
#endif

#define BASE "-cell", "100", "100", "100", "90", "90", "90", "-N", "5", "-lambda", "1", "-detpixels", "64", \
             "-pixel", "0.1", "-distance", "100", "-oversample", "1"

#ifdef NBG_HAVE_FORMATS
/* A small deterministic generator for the test's data (the same on every machine). */
static double urand(unsigned long long *s)
{
    *s = *s * 6364136223846793005ULL + 1442695040888963407ULL;
    return (double)(*s >> 11) * (1.0 / 9007199254740992.0);
}

static double grand(unsigned long long *s)
{
    const double u = urand(s), v = urand(s);
    return sqrt(-2 * log(1 - u)) * cos(6.283185307179586 * v);
}

static int write_tables(const run_result *r, double *truth)
{
    char p1[PATH_MAX + 64], p2[PATH_MAX + 64];
    snprintf(p1, sizeof p1, "%s/truth.hkl", r->work);
    snprintf(p2, sizeof p2, "%s/start.hkl", r->work);
    FILE *t = fopen(p1, "w"), *s = fopen(p2, "w");
    if (t == NULL || s == NULL) {
        if (t) fclose(t);
        if (s) fclose(s);
        return 0;
    }
    unsigned long long st = 12345;
    int j = 0;
    for (int h = -3; h <= 3; ++h) {
        for (int k = -3; k <= 3; ++k) {
            for (int l = -3; l <= 3; ++l, ++j) {
                truth[j] = 50 + 100 * urand(&st);
                fprintf(t, "%d %d %d %.6f\n", h, k, l, truth[j]);
                fprintf(s, "%d %d %d %.6f\n", h, k, l, truth[j] * (1 + 0.15 * grand(&st)));
            }
        }
    }
    return fclose(t) == 0 && fclose(s) == 0;
}

/* Perturbs shots.jsonl's misset angles into start.jsonl (keeps the truth in truth[3 * shot]); both read and written
 * with jansson. */
static int perturb_shots(const run_result *r, double *truth, int n)
{
    char p1[PATH_MAX + 64], p2[PATH_MAX + 64];
    snprintf(p1, sizeof p1, "%s/shots.jsonl", r->work);
    snprintf(p2, sizeof p2, "%s/start.jsonl", r->work);
    FILE *in = fopen(p1, "r"), *out = fopen(p2, "w");
    if (in == NULL || out == NULL) {
        if (in) fclose(in);
        if (out) fclose(out);
        return 0;
    }
    unsigned long long st = 777;
    char line[1024];
    int i = 0;
    while (i < n && fgets(line, sizeof line, in) != NULL) {
        json_t *shot = json_loads(line, JSON_REJECT_DUPLICATES, NULL);
        const json_t *id = json_object_get(shot, "id"), *m = json_object_get(shot, "misset");
        if (!json_is_string(id) || json_array_size(m) != 3) {
            json_decref(shot);
            break;
        }
        double *t = truth + 3 * i;
        json_t *start = json_object(), *ms = json_array();
        for (int c = 0; c < 3; ++c) {
            t[c] = json_number_value(json_array_get(m, (size_t)c));
            json_array_append_new(ms, json_real(t[c] + 0.2 * grand(&st)));
        }
        json_object_set(start, "id", (json_t *)id);
        json_object_set_new(start, "misset", ms);
        char *text = json_dumps(start, JSON_COMPACT | JSON_REAL_PRECISION(17));
        fprintf(out, "%s\n", text != NULL ? text : "");
        free(text);
        json_decref(start);
        json_decref(shot);
        ++i;
    }
    fclose(in);
    return fclose(out) == 0 && i == n;
}

/* The 343 F of a table file in its line order (-3..3 nested h, k, l, as write_tables writes them). */
static int read_table(const run_result *r, const char *name, double *F)
{
    char p[PATH_MAX + 64];
    snprintf(p, sizeof p, "%s/%s", r->work, name);
    FILE *f = fopen(p, "r");
    int j = 0, h, k, l;
    while (f != NULL && j < 343 && fscanf(f, "%d %d %d %lf", &h, &k, &l, &F[j]) == 4) {
        ++j;
    }
    if (f != NULL) {
        fclose(f);
    }
    return j == 343;
}

/* Over the entries of a refined table (h k l F sigma lines): their count, the mean relative errors of the start
 * and of the refined values against the truth, the rms of (F - truth) / sigma and how many lie within 3 sigma. */
static void hkl_errors(const char *path, const double *Ftrue, const double *Fstart, int *n, double *e0, double *e1,
                       double *rmsz, int *within)
{
    FILE *f = fopen(path, "r");
    double z2 = 0, F, s;
    int h, k, l;
    *n = *within = 0;
    *e0 = *e1 = 0;
    while (f != NULL && fscanf(f, "%d %d %d %lf %lf", &h, &k, &l, &F, &s) == 5) {
        const int j = ((h + 3) * 7 + (k + 3)) * 7 + (l + 3);
        const double z = (F - Ftrue[j]) / s;
        z2 += z * z;
        *within += fabs(z) < 3;
        *e0 += fabs(Fstart[j] - Ftrue[j]) / Ftrue[j];
        *e1 += fabs(F - Ftrue[j]) / Ftrue[j];
        ++*n;
    }
    if (f != NULL) {
        fclose(f);
    }
    *rmsz = *n ? sqrt(z2 / *n) : NAN;
    if (*n) {
        *e0 /= *n, *e1 /= *n;
    }
}

static void run_ensemble(run_result *r, int ranks, const char *json)
{
    const char *args[64] = {"ensemble", BASE, "-hkl", "start.hkl", "-shots", "start.jsonl", "-observed",
                            "obs/{id}.img", "-global", "F", "-local", "rotx,roty,rotz", "-cycles", "2", "-json", json,
                            NULL};
    int n = 0;
    while (args[n] != NULL) {
        ++n;
    }
    if (ranks == 0) {
        /* only the run without MPI writes refined.hkl; it runs on three threads, run_mpi's ranks on one each */
        args[n++] = "-hklout", args[n++] = "refined.hkl", args[n] = NULL;
        setenv("OMP_NUM_THREADS", "3", 1);
        run_in(r, args);
        unsetenv("OMP_NUM_THREADS");
    } else {
        run_mpi(r, ranks, args);
    }
}

static void test_recovery(void)
{
    run_result r;
    if (!new_case(&r)) {
        return;
    }
    double Ftrue[343], mtrue[150];
    const char *gen[] = {"shots", "-n", "50", "-seed", "9", "-o", "shots.jsonl", NULL};
    run_in(&r, gen);
    char obs[PATH_MAX + 64];
    snprintf(obs, sizeof obs, "%s/obs", r.work);
    const int ready = r.status == 0 && write_tables(&r, Ftrue) && perturb_shots(&r, mtrue, 50) && mkdir(obs, 0700) == 0;
    const char *sim[] = {"batch", BASE, "-hkl", "truth.hkl", "-shots", "shots.jsonl", "-noisefile", "obs/{id}.img",
                         "-seed", "5", NULL};
    if (ready) {
        run_in(&r, sim);
    }
    if (!nbgi_test_check(ready && r.status == 0, "ENS-data", "50 noisy shots simulated (exit %d: %s)", r.status,
                         first_line(r.err))) {
        result_free(&r);
        return;
    }
    run_ensemble(&r, 0, "ens0.json");
    const char *loss = strstr(r.out, "ensemble: loss ");
    double L0 = NAN, L1 = NAN;
    if (loss != NULL) {
        sscanf(loss, "ensemble: loss %lf -> %lf", &L0, &L1);
    }
    nbgi_test_check(r.status == 0 && L1 < L0, "ENS-run", "the summed loss goes down: %.10g -> %.10g (exit %d: %s)", L0,
                    L1, r.status, first_line(r.err));
    /* F against the truth, in units of its standard errors */
    char path[PATH_MAX + 64];
    snprintf(path, sizeof path, "%s/refined.hkl", r.work);
    double Fstart[343], e0 = 0, e1 = 0, rmsz = NAN;
    int n = 0, within = 0;
    if (!read_table(&r, "start.hkl", Fstart)) {
        nbgi_test_check(0, "ENS-F-error", "cannot read start.hkl back");
    }
    hkl_errors(path, Ftrue, Fstart, &n, &e0, &e1, &rmsz, &within);
    nbgi_test_check(n > 250 && e1 < 0.5 * e0, "ENS-F-error",
                    "%d of 343 F measured; mean relative error %.3f at the start, %.3f refined", n, e0, e1);
    nbgi_test_check(rmsz > 0.6 && rmsz < 1.5 && within >= 0.95 * n, "ENS-F-sigma",
                    "errors / standard errors: rms %.3f, %d of %d within 3 sigma", rmsz, within, n);
    /* orientations: the JSON's locals against the truth; the file as docs/json.md describes it */
    size_t size = 0;
    char *json = read_in(&r, "ens0.json", &size);
    double d0 = 0, d1 = 0;
    int m = 0;
    json_error_t err;
    json_t *doc = json != NULL ? json_loads(json, JSON_REJECT_DUPLICATES, &err) : NULL;
    const json_t *locals = json_object_get(doc, "locals");
    for (int i = 0; i < 50; ++i) {
        char key[64];
        snprintf(key, sizeof key, "shot%06d", i + 1);
        const json_t *a = json_object_get(locals, key);
        if (json_array_size(a) != 3) {
            continue;
        }
        for (int c = 0; c < 3; ++c) d1 += fabs(json_number_value(json_array_get(a, (size_t)c)) - mtrue[3 * i + c]);
        ++m;
    }
    static const char *const keys[] = {"shots", "start_loss", "loss", "globals", "F", "locals"};
    int keys_ok = json_object_size(doc) == 6;
    const char *key;
    json_t *v;
    size_t at = 0;
    json_object_foreach(doc, key, v) keys_ok &= at < 6 && strcmp(key, keys[at++]) == 0;
    nbgi_test_check(doc != NULL && keys_ok && json_integer_value(json_object_get(doc, "shots")) == 50 &&
                        json_is_number(json_object_get(doc, "loss")) &&
                        json_array_size(json_object_get(doc, "F")) == 343 &&
                        json_object_size(json_object_get(doc, "globals")) == 0 && json_object_size(locals) == 50,
                    "ENS-json", "the JSON parses (%s) with the documented keys: shots 50, loss, no other global, F of "
                    "343 entries, 50 shots' locals", doc != NULL ? "jansson" : err.text);
    json_decref(doc);
    nbgi_test_check(strstr(r.err, "cycle 2: loss") != NULL && strstr(r.out, "cycle 2: loss") == NULL &&
                        strstr(r.out, "ensemble: loss ") != NULL,
                    "ENS-progress", "the cycles' progress on stderr, the result on stdout");
    /* the start's error, from start.jsonl */
    snprintf(path, sizeof path, "%s/start.jsonl", r.work);
    FILE *fj = fopen(path, "r");
    char line[1024];
    for (int i = 0; fj != NULL && i < 50 && fgets(line, sizeof line, fj) != NULL; ++i) {
        json_t *shot = json_loads(line, 0, NULL);
        const json_t *a = json_object_get(shot, "misset");
        for (int c = 0; c < 3 && json_array_size(a) == 3; ++c) {
            d0 += fabs(json_number_value(json_array_get(a, (size_t)c)) - mtrue[3 * i + c]);
        }
        json_decref(shot);
    }
    if (fj != NULL) {
        fclose(fj);
    }
    nbgi_test_check(m == 50 && d1 < d0 / 3, "ENS-orientation",
                    "mean misset error %.4f deg at the start, %.4f deg refined (%d shots)", d0 / 150, d1 / 150, m);

    /* the same file for any number of ranks */
    int have_mpi = access("/usr/bin/mpirun", X_OK) == 0;
    for (int ranks = 1; ranks <= 4; ranks *= 2) {
        char name[32], id[32];
        snprintf(name, sizeof name, "ens%d.json", ranks);
        snprintf(id, sizeof id, "ENS-mpi-%d", ranks);
        if (!have_mpi) {
            nbgi_test_skip(id, "mpirun is missing");
            continue;
        }
        run_ensemble(&r, ranks, name);
        size_t s2 = 0;
        char *other = read_in(&r, name, &s2);
        const int same = json != NULL && other != NULL && s2 == size && memcmp(json, other, size) == 0;
        if (r.status != 0 && strstr(r.err, "without MPI") != NULL) {
            nbgi_test_skip(id, "nbgrad was built without MPI");
            have_mpi = 0;
        } else {
            nbgi_test_check(r.status == 0 && same, id, "mpirun -n %d (a thread each): the same JSON, byte for byte, as the run without MPI on three threads (exit %d: %s)",
                            ranks, r.status, first_line(r.err));
        }
        free(other);
    }
    free(json);
    /* -spots 3: every shot fitted on its spot regions (a fifth of its pixels here): F as well determined on the
     * reflections fitted there, their standard errors right */
    const char *sp[] = {"ensemble", BASE, "-hkl", "start.hkl", "-shots", "start.jsonl", "-observed", "obs/{id}.img",
                        "-global", "F", "-local", "rotx,roty,rotz", "-cycles", "2", "-spots", "3", "-hklout",
                        "spots.hkl", NULL};
    run_in(&r, sp);
    char spath[PATH_MAX + 64];
    snprintf(spath, sizeof spath, "%s/spots.hkl", r.work);
    hkl_errors(spath, Ftrue, Fstart, &n, &e0, &e1, &rmsz, &within);
    nbgi_test_check(r.status == 0 && strstr(r.out, "spot regions: ") != NULL && strstr(r.err, "EM iterations, converged") &&
                        n > 200 && e1 < 0.5 * e0 && rmsz > 0.6 && rmsz < 1.5 && within >= 0.95 * n,
                    "ENS-spots", "-spots 3: %d F fitted on the regions, mean relative error %.3f at the start, %.3f "
                    "refined; errors / standard errors rms %.3f, %d within 3 sigma (exit %d: %s)", n, e0, e1, rmsz,
                    within, r.status, first_line(r.err));
    result_free(&r);
}

/* ENS-expt-spectrum: stills from per-shot experiment lists with per-shot spectra (issue 30 item 3).  8 shots of a 50 A
 * cubic cell (N 8) in random orientations on a 128^2 detector at 40 mm; nbgrad batch writes each shot's .expt (the
 * truth's crystal, beam, detector), then simulates noisy images from those lists ("expt") with a five-line Gaussian
 * spectrum (sigma 0.25 %, "sourcefile") moved per shot by a known shift (0.1 to 0.3 %, "spectrum_shift").  The
 * ensemble starts from the lists (in a sub-folder: the paths are relative to the list's folder) with the nominal
 * spectrum and every orientation off by 0.1 deg rms ("orient"), and refines F with orientation, spectrum_shift and
 * scale per shot on spot regions.  Measured (this machine): the shifts to 1e-5 A rms (truth 2.3e-3 A rms,
 * correlation 0.99999), the orientation offsets to 0.0006 deg mean (start 0.073 deg).  Checks, with margin (a shift
 * not refined, or refined wrongly, has an error of the truth's size): shift error < 15 % of the truth's rms and
 * correlation > 0.98; orientation error < 1/5 of the start's. */
static void test_expt_spectrum(void)
{
    run_result r;
    if (!new_case(&r)) {
        return;
    }
    enum { NS = 8 };
#define XBASE "-cell", "50", "50", "50", "90", "90", "90", "-N", "8", "-oversample", "1"
    /* the truth's table, h k l in -8..8, F uniform in 50..150 */
    char path[PATH_MAX + 64];
    snprintf(path, sizeof path, "%s/truth.hkl", r.work);
    FILE *t = fopen(path, "w");
    unsigned long long st = 4321;
    for (int h = -8; t != NULL && h <= 8; ++h) {
        for (int k = -8; k <= 8; ++k) {
            for (int l = -8; l <= 8; ++l) fprintf(t, "%d %d %d %.4f\n", h, k, l, 50 + 100 * urand(&st));
        }
    }
    int ready = t != NULL && fclose(t) == 0;
    /* the spectrum: five lines at a Gaussian's quantiles, sigma 0.25 % about 1 A, from up-beam of DIALS's frame
     * (the lists' beam travels along -z) */
    static const double zq[5] = {-1.28, -0.52, 0, 0.52, 1.28};
    char spec[512] = "";
    for (int i = 0; i < 5; ++i) {
        snprintf(spec + strlen(spec), sizeof spec - strlen(spec), "0 0 10 1 %.8e\n", 1e-10 * (1 + 0.0025 * zq[i]));
    }
    static const char *const dirs[3] = {"sub", "ex", "obs"};
    ready = ready && put_file(&r, "spec.txt", spec);
    for (int i = 0; i < 3; ++i) {
        snprintf(path, sizeof path, "%s/%s", r.work, dirs[i]);
        ready = ready && mkdir(path, 0700) == 0;
    }
    const char *gen[] = {"shots", "-n", "8", "-seed", "4", "-o", "shots.jsonl", NULL};
    const char *lists[] = {"batch", XBASE, "-detpixels", "128", "-pixel", "0.1", "-distance", "40", "-lambda", "1",
                           "-hkl", "truth.hkl", "-shots", "shots.jsonl", "-exptfile", "ex/{id}.expt", NULL};
    if (ready) {
        run_in(&r, gen);
        ready = r.status == 0;
    }
    if (ready) {
        run_in(&r, lists);
        ready = r.status == 0;
    }
    /* the truth's list (the experiment lists, the spectrum, each shot's shift) and the start's (in sub/) */
    double shift[NS], ori0[NS][3];
    snprintf(path, sizeof path, "%s/shots.jsonl", r.work);
    FILE *in = ready ? fopen(path, "r") : NULL;
    char tp[PATH_MAX + 64], sp[PATH_MAX + 64];
    snprintf(tp, sizeof tp, "%s/truth.jsonl", r.work);
    snprintf(sp, sizeof sp, "%s/sub/start.jsonl", r.work);
    FILE *tf = ready ? fopen(tp, "w") : NULL, *sf = ready ? fopen(sp, "w") : NULL;
    char line[1024];
    int ns = 0;
    unsigned long long s2 = 99;
    while (in != NULL && tf != NULL && sf != NULL && ns < NS && fgets(line, sizeof line, in) != NULL) {
        json_t *o = json_loads(line, 0, NULL);
        const char *id = json_string_value(json_object_get(o, "id"));
        if (id == NULL) {
            json_decref(o);
            break;
        }
        shift[ns] = (urand(&s2) < 0.5 ? -1 : 1) * (0.001 + 0.002 * urand(&s2));
        for (int c = 0; c < 3; ++c) ori0[ns][c] = 0.1 * grand(&s2);
        fprintf(tf, "{\"id\": \"%s\", \"expt\": \"ex/%s.expt\", \"sourcefile\": \"spec.txt\", \"spectrum_shift\": %.10g}\n",
                id, id, shift[ns]);
        fprintf(sf, "{\"id\": \"%s\", \"expt\": \"../ex/%s.expt\", \"sourcefile\": \"spec.txt\", \"orient\": [%.10g, "
                "%.10g, %.10g]}\n", id, id, ori0[ns][0], ori0[ns][1], ori0[ns][2]);
        json_decref(o);
        ++ns;
    }
    if (in != NULL) fclose(in);
    ready = ready && ns == NS && tf != NULL && sf != NULL;
    if (tf != NULL) ready = fclose(tf) == 0 && ready;
    if (sf != NULL) ready = fclose(sf) == 0 && ready;
    const char *sim[] = {"batch", XBASE, "-hkl", "truth.hkl", "-shots", "truth.jsonl", "-noisefile", "obs/{id}.img",
                         "-seed", "3", NULL};
    if (ready) {
        run_in(&r, sim);
        ready = r.status == 0;
    }
    if (!nbgi_test_check(ready, "ENS-expt-data", "%d stills simulated from their experiment lists with shifted spectra "
                         "(exit %d: %s)", ns, r.status, first_line(r.err))) {
        result_free(&r);
        return;
    }
    const char *ens[] = {"ensemble", XBASE, "-hkl", "truth.hkl", "-shots", "sub/start.jsonl", "-observed",
                         "obs/{id}.img", "-global", "F", "-local", "orientation,spectrum_shift,scale", "-cycles", "2",
                         "-spots", "3", "-json", "ens.json", NULL};
#undef XBASE
    run_in(&r, ens);
    size_t size = 0;
    char *text = read_in(&r, "ens.json", &size);
    json_t *doc = text != NULL ? json_loads(text, 0, NULL) : NULL;
    const json_t *locals = json_object_get(doc, "locals");
    double e2 = 0, t2 = 0, d0 = 0, d1 = 0, sxy = 0, sxx = 0, syy = 0;
    int m = 0;
    for (int i = 0; i < NS; ++i) {
        char key[32];
        snprintf(key, sizeof key, "shot%06d", i + 1);
        const json_t *a = json_object_get(locals, key);
        if (json_array_size(a) != 5) {
            continue;
        }
        const double got = json_number_value(json_array_get(a, 3));
        e2 += (got - shift[i]) * (got - shift[i]);
        t2 += shift[i] * shift[i];
        sxy += got * shift[i], sxx += got * got, syy += shift[i] * shift[i];
        for (int c = 0; c < 3; ++c) {
            d0 += fabs(ori0[i][c]);
            d1 += fabs(json_number_value(json_array_get(a, (size_t)c)));
        }
        ++m;
    }
    const double rms_e = m ? sqrt(e2 / m) : NAN, rms_t = m ? sqrt(t2 / m) : NAN;
    const double corr = sxx > 0 && syy > 0 ? sxy / sqrt(sxx * syy) : 0;
    nbgi_test_check(r.status == 0 && m == NS && rms_e < 0.15 * rms_t && corr > 0.98, "ENS-expt-spectrum-shift",
                    "%d stills from their .expt with their spectra: spectrum_shift recovered to %.2g A rms (the truth's "
                    "shifts %.2g A rms; correlation %.5f) (exit %d: %s)", m, rms_e, rms_t, corr, r.status,
                    first_line(r.err));
    nbgi_test_check(m == NS && d1 < d0 / 5, "ENS-expt-orientation",
                    "orientation offsets (truth 0): mean |error| %.4f deg at the start, %.4f deg refined", d0 / (3.0 * NS),
                    d1 / (3.0 * NS));
    json_decref(doc);
    free(text);
    result_free(&r);
}

#else
static void test_recovery(void)
{
}
static void test_expt_spectrum(void)
{
}
#endif

static void test_refusals(void)
{
    run_result r;
    const char *inputs[] = {"s.jsonl", "t.hkl", NULL};
    struct {
        const char *id, *what, *global, *local, *word;
        int hkl;
    } cases[] = {
        {"ENS-F-local", "F as a local parameter", "a", "F", "F is global", 1},
        {"ENS-unknown", "an unknown global", "a,bogus", "rotx", "bogus", 1},
        {"ENS-no-table", "-global F without a table", "F", "rotx", "-hkl", 0},
    };
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; ++k) {
        if (!new_case(&r)) {
            return;
        }
        put_file(&r, "s.jsonl", "{\"id\": \"a\"}\n");
        put_file(&r, "t.hkl", "0 0 1 100\n1 0 0 100\n");
        const char *with[] = {"ensemble", BASE, "-hkl", "t.hkl", "-shots", "s.jsonl", "-observed", "o/{id}.img",
                              "-global", cases[k].global, "-local", cases[k].local, "-default_F", "0", NULL};
        const char *without[] = {"ensemble", BASE, "-default_F", "100", "-shots", "s.jsonl", "-observed",
                                 "o/{id}.img", "-global", cases[k].global, "-local", cases[k].local, NULL};
        const char *words[] = {cases[k].word, NULL};
        expect_failure(cases[k].id, cases[k].what, &r, cases[k].hkl ? with : without, words, inputs);
        result_free(&r);
    }
}

int main(void)
{
    if (!clirun_setup("nbg-test-ensemble-")) {
        return nbgi_test_summary();
    }
    if (!clirun_has_shot_lists()) {
        nbgi_test_rmtree(g_root);
        return nbgi_test_summary();
    }
    test_recovery();
    test_expt_spectrum();
    test_refusals();
    nbgi_test_rmtree(g_root);
    return nbgi_test_summary();
}
