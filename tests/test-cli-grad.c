/*
 * test-cli-grad.c -- the gradient subcommands of the program: nbgrad gradcheck (its output format, exit code and
 * failure on a broken adjoint), nbgrad grad (text and JSON), nbgrad refine (a fit from a perturbed start, JSON and
 * residual image, and the bad inputs: an observed image of the wrong size, a NaN pixel (a pixel below zero is
 * data), an unknown parameter, a start outside the bounds), one frame of a rotation series (CBF, SMV) fitted alone
 * at its own start angle, and -params as a list: exactly the parameters named (a panel group's one component), groups, the order given, F.
 */
#include "testutil.h" /* first: it sets _GNU_SOURCE */

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static char out[1 << 16];

/* Runs the shell command, capturing stdout and stderr; returns the exit status. */
static int run(const char *cmd)
{
    FILE *p = popen(cmd, "r");
    if (p == NULL) {
        return -1;
    }
    const size_t len = fread(out, 1, sizeof out - 1, p);
    out[len] = '\0';
    const int st = pclose(p);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

/* Writes the formatted text to path (a test's input file); 0 when it cannot. */
static int write_text(const char *path, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int write_text(const char *path, const char *fmt, ...)
{
    FILE *f = fopen(path, "w");
    if (f == NULL) {
        return 0;
    }
    va_list ap;
    va_start(ap, fmt);
    const int ok = vfprintf(f, fmt, ap) >= 0;
    va_end(ap);
    return fclose(f) == 0 && ok;
}

#ifdef NBG_HAVE_FORMATS
#include <jansson.h>

/* The refined value of a parameter in refine's JSON (parameters.name.value); NAN when absent. */
static double json_value(const char *json, const char *name)
{
    json_t *doc = json != NULL ? json_loads(json, 0, NULL) : NULL;
    const json_t *v = json_object_get(json_object_get(json_object_get(doc, "parameters"), name), "value");
    const double x = json_is_number(v) ? json_number_value(v) : NAN;
    json_decref(doc);
    return x;
}

/* Whether the JSON object o has exactly the keys of the space-separated list (docs/json.md), in that order; the
 * first difference into why. */
static int has_keys(const json_t *o, const char *keys, char *why, size_t size)
{
    if (!json_is_object(o)) {
        snprintf(why, size, "not an object");
        return 0;
    }
    const char *k = keys, *key;
    json_t *v;
    json_object_foreach((json_t *)o, key, v) {
        k += strspn(k, " ");
        const size_t len = strcspn(k, " ");
        if (len != strlen(key) || strncmp(k, key, len) != 0) {
            snprintf(why, size, "key \"%s\" where \"%.*s\" is documented", key, (int)len, k);
            return 0;
        }
        k += len;
    }
    k += strspn(k, " ");
    if (*k != '\0') {
        snprintf(why, size, "missing \"%s\"", k);
        return 0;
    }
    return 1;
}

/* Parses a JSON file with jansson (NULL after a FAIL line naming the error). */
static json_t *load_json(const char *path, const char *id)
{
    json_error_t err;
    json_t *doc = json_load_file(path, JSON_REJECT_DUPLICATES, &err);
    if (doc == NULL) {
        nbgi_test_check(0, id, "%s parses as JSON: line %d: %s", path, err.line, err.text);
    }
    return doc;
}

/* grad's JSON (docs/json.md): loss, the gradient of each parameter named (in order), dF with F. */
static void check_grad_json(const char *path, const char *params, int nF, const char *id)
{
    json_t *doc = load_json(path, id);
    if (doc == NULL) {
        return;
    }
    char why[256] = "", wg[256] = "";
    const int top = has_keys(doc, nF > 0 ? "loss gradient dF" : "loss gradient", why, sizeof why);
    const int grad = has_keys(json_object_get(doc, "gradient"), params, wg, sizeof wg);
    int numbers = json_is_number(json_object_get(doc, "loss"));
    const char *key;
    json_t *v;
    json_object_foreach(json_object_get(doc, "gradient"), key, v) numbers &= json_is_number(v);
    const json_t *dF = json_object_get(doc, "dF");
    for (size_t i = 0; i < json_array_size(dF); ++i) numbers &= json_is_number(json_array_get(dF, i));
    nbgi_test_check(top && grad && numbers && (nF == 0 || (int)json_array_size(dF) == nF), id,
                    "grad's JSON parses with the documented keys%s%s%s%s, numbers throughout, dF of %d entries",
                    why[0] || wg[0] ? " (" : "", why, wg, why[0] || wg[0] ? ")" : "", nF);
    json_decref(doc);
}

/* refine's JSON (docs/json.md): the top keys, fit's, each parameter's start, value, sigma, an n x n correlation. */
static void check_refine_json(const char *path, int nparams, const char *id)
{
    json_t *doc = load_json(path, id);
    if (doc == NULL) {
        return;
    }
    char why[256] = "", wf[256] = "", wp[256] = "";
    const int top = has_keys(doc, "method loss converged reason why step_sigma iterations pixels pedestal gain "
                                  "read_noise floor_mismatch fit constraint undetermined start_loss final_loss "
                                  "parameters correlation",
                             why, sizeof why);
    const int fit = has_keys(json_object_get(doc, "fit"), "deviance_ratio deviance_ratio_spots deviance pixels "
                                                          "spot_pixels mismatch sigma_scale", wf, sizeof wf);
    const json_t *par = json_object_get(doc, "parameters"), *corr = json_object_get(doc, "correlation");
    int params = (int)json_object_size(par) == nparams;
    const char *key;
    json_t *v;
    json_object_foreach((json_t *)par, key, v) params &= has_keys(v, "start value sigma", wp, sizeof wp) &&
                                                         json_is_number(json_object_get(v, "value"));
    int square = (int)json_array_size(corr) == nparams;
    for (size_t i = 0; i < json_array_size(corr); ++i) {
        square &= (int)json_array_size(json_array_get(corr, i)) == nparams;
    }
    const int types = json_is_string(json_object_get(doc, "method")) &&
                      json_is_boolean(json_object_get(doc, "converged")) &&
                      json_is_integer(json_object_get(doc, "iterations")) &&
                      json_is_integer(json_object_get(doc, "pixels")) &&
                      json_is_number(json_object_get(doc, "final_loss"));
    nbgi_test_check(top && fit && params && square && types, id,
                    "refine's JSON parses with the documented keys and types, %d parameters, a %d x %d correlation"
                    "%s%s%s%s%s", nparams, nparams, nparams, why[0] ? ": " : "", why, wf[0] ? "; fit: " : "", wf,
                    wp[0] ? "; a parameter: " : "", wp);
    json_decref(doc);
}
#else
static double json_value(const char *json, const char *name)
{
    (void)json, (void)name;
    return NAN;
}
#endif

#define XTAL "-cell 70 80 90 75 85 95 -misset 10 5 3 -default_F 100 -N 5 -lambda 1 -distance 100 -detpixels 64 -oversample 1"

#ifdef NBG_HAVE_FORMATS
/* nbgi_test_max_rel_diff of two float files of n floats (INFINITY: unreadable, or of another size). */
static double float_diff(const char *pa, const char *pb, size_t n)
{
    size_t sa = 0, sb = 0;
    float *a = nbgi_test_read_file(pa, &sa), *b = nbgi_test_read_file(pb, &sb);
    const double d = a != NULL && b != NULL && sa == n * sizeof(float) && sb == n * sizeof(float)
                         ? nbgi_test_max_rel_diff(a, b, n)
                         : INFINITY;
    free(a);
    free(b);
    return d;
}

/* cligrad-34: -setting.  A hexagonal crystal (78 78 37, 6 x 9 x 12 cells along a, b, c) written with its list; the
 * same crystal in the basis (c, a+b, b), as DIALS may choose for it, renders another crystal shape (N counts cells
 * along the basis), and refined on the truth's noise-free image it moves away from the truth.  Re-expressed in the
 * truth's setting by -setting it renders the truth's image and its fit is the truth's fit. */
static void test_setting(const char *bin, const char *dir)
{
#define HEX "-default_F 100 -Na 6 -Nb 9 -Nc 12 -oversample 1"
    char cmd[8192], truth[1024], shear[1024], img[1024], other[1024], rj[1024];
    snprintf(truth, sizeof truth, "%s/hex_truth.expt", dir);
    snprintf(shear, sizeof shear, "%s/hex_dials.expt", dir);
    snprintf(other, sizeof other, "%s/hex_other.expt", dir);
    snprintf(img, sizeof img, "%s/hex_truth.bin", dir);
    snprintf(rj, sizeof rj, "%s/hex.json", dir);
    snprintf(cmd, sizeof cmd, "%s -cell 78 78 37 90 90 120 -misset 10 20 30 " HEX " -distance 100 -detpixels 128 "
                              "-pixel 0.4 -lambda 1 -floatfile %s -exptfile %s -nopgm -nonoise 2>&1", bin, img, truth);
    int rc = run(cmd);
    snprintf(cmd, sizeof cmd, "%s -cell 70 80 90 90 90 90 -default_F 100 -N 5 -distance 100 -detpixels 16 -exptfile %s "
                              "-nopgm -nonoise 2>&1", bin, other);
    rc |= run(cmd);
    nbg_ctx *ctx = NULL;
    nbg_geometry g;
    int ok = rc == 0 && nbg_ctx_create(&ctx, NBG_BACKEND_CPU, NBG_DOUBLE, 1) == NBG_OK &&
             nbg_read_expt(ctx, truth, &g) == NBG_OK;
    if (ok) {
        double r[9];
        memcpy(r, g.real_space, sizeof r);
        for (int k = 0; k < 3; ++k) {
            g.real_space[k] = r[6 + k];             /* a' = c */
            g.real_space[3 + k] = r[k] + r[3 + k];  /* b' = a + b */
            g.real_space[6 + k] = r[3 + k];         /* c' = b */
        }
        ok = nbg_write_expt(ctx, shear, &g, NULL) == NBG_OK;
    }
    nbg_ctx_destroy(ctx);
    nbgi_test_check(ok, "cligrad-34-setting-lists", "the truth's list, and its crystal in the basis (c, a+b, b)");
    if (!ok) {
        return;
    }
    /* the image: another shape in the other basis, the truth's in the truth's setting */
    double diff[2];
    for (int k = 0; k < 2; ++k) {
        char f[1100];
        snprintf(f, sizeof f, "%s/hex_%d.bin", dir, k);
        snprintf(cmd, sizeof cmd, "%s -expt %s %s%s " HEX " -floatfile %s -nopgm -nonoise 2>&1", bin, shear,
                 k ? "-setting " : "", k ? truth : "", f);
        rc = run(cmd);
        diff[k] = rc == 0 ? float_diff(img, f, 128 * 128) : INFINITY;
        if (k == 1) {
            ok = rc == 0 && strstr(out, "a, b, c = b-c, c, a of") != NULL &&
                 strstr(out, "becomes 78.0000 78.0000 37.0000 90.000 90.000 120.000") != NULL;
        }
    }
    nbgi_test_check(ok && diff[1] <= 1e-6 && diff[0] > 0.1, "cligrad-34-setting-image",
                    "the crystal in DIALS's basis renders another shape (largest difference %.3g of the maximum); "
                    "re-expressed in the truth's setting (change of basis printed: %s) the truth's image (%.3g)",
                    diff[0], ok ? "yes" : "no", diff[1]);
    /* the fit on the truth's noise-free image, started at the truth */
    static const char *const names[13] = {"a", "b", "c", "alpha", "beta", "gamma", "rotx", "roty", "rotz",
                                          "Na", "Nb", "Nc", "scale"};
    double v[3][13];
    int rcs[3];
    for (int k = 0; k < 3; ++k) {
        remove(rj);
        snprintf(cmd, sizeof cmd, "%s refine -expt %s %s%s " HEX " -observed %s -params cell,orientation,Na,Nb,Nc,"
                                  "scale -loss poisson -json %s 2>&1", bin, k == 0 ? truth : shear,
                 k == 1 ? "-setting " : "", k == 1 ? truth : "", img, rj);
        rcs[k] = run(cmd);
        char *json = nbgi_test_read_file(rj, &(size_t){0});
        for (int i = 0; i < 13; ++i) v[k][i] = json_value(json, names[i]);
        free(json);
    }
    double same = 0, moved = 0;
    for (int i = 0; i < 13; ++i) {
        same = fmax(same, fabs(v[1][i] - v[0][i]) / fmax(1, fabs(v[0][i])));
    }
    /* in the other basis: how far its cell (lengths c, |a+b|, b in the truth's) and sizes moved from their start */
    const double start[6] = {37, 78, 78, 60, 90, 90}, nstart[3] = {6, 9, 12};
    for (int i = 0; i < 6; ++i) moved = fmax(moved, fabs(v[2][i] - start[i]) / start[i]);
    double nmoved = 0;
    for (int i = 0; i < 3; ++i) nmoved = fmax(nmoved, fabs(v[2][9 + i] - nstart[i]));
    nbgi_test_check(rcs[0] == 0 && rcs[1] == 0 && same <= 1e-7 && fabs(v[0][0] - 78) < 1e-5 &&
                        fabs(v[0][2] - 37) < 1e-5 && fabs(v[0][9] - 6) < 1e-4 && moved > 1e-4,
                    "cligrad-34-setting-refine", "refined from the truth's list and from DIALS's basis re-expressed "
                    "by -setting: the same answer (largest difference %.2g), at the truth (a %.6f, c %.6f, Na %.5f; "
                    "exit %d, %d); from DIALS's basis without -setting the fit moves away (cell by %.3g %%, N by "
                    "%.3g cells; exit %d)", same, v[0][0], v[0][2], v[0][9], rcs[0], rcs[1], 100 * moved, nmoved,
                    rcs[2]);
    /* refused: another lattice; no -expt */
    snprintf(cmd, sizeof cmd, "%s -expt %s -setting %s " HEX " -nopgm -nonoise 2>&1", bin, shear, other);
    rc = run(cmd);
    nbgi_test_check(rc != 0 && strstr(out, "-setting") != NULL && strstr(out, "not integer combinations") != NULL,
                    "cligrad-34-setting-other-lattice", "a reference of another lattice is refused by name (exit %d: "
                    "%.200s)", rc, out);
    snprintf(cmd, sizeof cmd, "%s -cell 78 78 37 90 90 120 -setting %s " HEX " -nopgm -nonoise 2>&1", bin, truth);
    rc = run(cmd);
    nbgi_test_check(rc != 0 && strstr(out, "there is no -expt") != NULL, "cligrad-34-setting-no-expt",
                    "-setting without -expt is refused (exit %d: %.200s)", rc, out);
#undef HEX
}
#endif

/* cligrad-51: the physical sensor model (-sensor physical; nbg_sensor_model).  A 450 um sensor of 261 um attenuation
 * in 4 layers renders, within 1 % of its maximum, as the thin detector placed at each layer's depth (the middle of
 * its quarter of the absorbed photons, -ln(1 - (t + 1/2) c / 4) mu^-1, c = 1 - exp(-T mu), derived here from the
 * model's definition), averaged and times the sensor's capture 1 - exp(-T mu) (normal incidence: the pixels' rays
 * lie within 6 deg of the normal, where the capture moves by 0.2 %); nanoBragg's model (equal weights at the capture
 * of a slab beyond the sensor, half its photons at the back face) is far from it, which the comparison must see.
 * The adjoint of the detector's parameters agrees with differences on a tilted, oversampled detector.  A sensor
 * read from a list as DIALS writes one renders the physical model; the sensor flags, and a list nbgrad wrote from
 * them, nanoBragg's. */
static void test_sensor(const char *bin, const char *dir)
{
#define SENS_XTAL "-cell 100 100 100 90 90 90 -default_F 100 -lambda 1 -N 5 -detpixels 128 -pixel 0.1 -oversample 2"
#define SENS_THICK "-detector_thick 450 -detector_abs 261 -thicksteps 4"
    char cmd[8192], phys[1024], nb[1024], lay[1024], lst[1024], img[1024];
    snprintf(phys, sizeof phys, "%s/sensor-physical.bin", dir);
    snprintf(nb, sizeof nb, "%s/sensor-nanobragg.bin", dir);
    snprintf(lst, sizeof lst, "%s/sensor-list.expt", dir);
    snprintf(img, sizeof img, "%s/sensor-list.bin", dir);
    snprintf(cmd, sizeof cmd, "%s " SENS_XTAL " -distance 100 " SENS_THICK " -sensor physical -floatfile %s 2>&1", bin,
             phys);
    int rc = run(cmd);
    const int said = strstr(out, "4 layers (physical sensor)") != NULL;
    snprintf(cmd, sizeof cmd, "%s " SENS_XTAL " -distance 100 " SENS_THICK " -floatfile %s -exptfile %s 2>&1", bin, nb,
             lst);
    rc |= run(cmd);
    const double T = 450e-3, mu = 1 / 261e-3, c = -expm1(-T * mu); /* mm, 1/mm */
    const size_t n = 128 * 128;
    double *sum = calloc(n, sizeof *sum);
    for (int t = 0; t < 4 && sum != NULL; ++t) {
        const double z = -log1p(-(t + 0.5) * c / 4) / mu;
        snprintf(lay, sizeof lay, "%s/sensor-layer%d.bin", dir, t);
        snprintf(cmd, sizeof cmd, "%s " SENS_XTAL " -distance %.17g -floatfile %s 2>&1", bin, 100 + z, lay);
        rc |= run(cmd);
        size_t sz = 0;
        float *a = nbgi_test_read_file(lay, &sz);
        for (size_t i = 0; i < n && a != NULL && sz == n * sizeof(float); ++i) {
            sum[i] += a[i] * c / 4;
        }
        free(a);
    }
    size_t sp = 0, sn = 0;
    float *P = nbgi_test_read_file(phys, &sp), *NB = nbgi_test_read_file(nb, &sn);
    double dp = INFINITY, dn = INFINITY, top = 0;
    if (P != NULL && NB != NULL && sum != NULL && sp == n * sizeof(float) && sn == sp) {
        dp = dn = 0;
        for (size_t i = 0; i < n; ++i) {
            top = fmax(top, P[i]);
            dp = fmax(dp, fabs(P[i] - sum[i]));
            dn = fmax(dn, fabs(NB[i] - sum[i]));
        }
        dp /= top;
        dn /= top;
    }
    nbgi_test_check(rc == 0 && said && dp < 0.01 && dn > 0.2, "cligrad-51-sensor-physical", "a 450 um sensor in 4 "
                    "layers: the physical model within %.2g of its maximum of the thin detector at the layers' depths "
                    "times the capture %.4f (want < 0.01), nanoBragg's %.2g from it (want > 0.2); said %s (exit %d)",
                    dp, c, dn, said ? "so" : "nothing", rc);
    free(sum);
    free(P);
    free(NB);
    /* the list the flags wrote keeps their sensor (nanoBragg's, 4 layers: nbgrad's key in it); the same list as
     * DIALS writes one (the key dropped) renders the physical model, which -sensor nanobragg turns back */
    snprintf(cmd, sizeof cmd, "%s -expt %s -default_F 100 -N 5 -oversample 2 -floatfile %s 2>&1", bin, lst, img);
    const int rc0 = run(cmd);
    const double d0 = float_diff(nb, img, n);
    char dls[1024];
    snprintf(dls, sizeof dls, "%s/sensor-dials.expt", dir);
    json_t *doc = load_json(lst, "cligrad-51-sensor-list-default");
    json_t *det = json_array_get(json_object_get(doc, "detector"), 0);
    const int had = json_object_del(det, "nbgrad_sensor") == 0;
    const int wrote = doc != NULL && json_dump_file(doc, dls, JSON_INDENT(1)) == 0;
    json_decref(doc);
    snprintf(cmd, sizeof cmd, "%s -expt %s -default_F 100 -N 5 -oversample 2 -thicksteps 4 -floatfile %s 2>&1", bin, dls,
             img);
    const int rc1 = run(cmd);
    const int phys_said = strstr(out, "4 layers (physical sensor)") != NULL;
    const double d1 = float_diff(phys, img, n);
    snprintf(cmd, sizeof cmd, "%s -expt %s -default_F 100 -N 5 -oversample 2 -thicksteps 4 -sensor nanobragg "
                              "-floatfile %s 2>&1", bin, dls, img);
    const int rc2 = run(cmd);
    const double d2 = float_diff(nb, img, n);
    nbgi_test_check(rc0 == 0 && rc1 == 0 && rc2 == 0 && had && wrote && d0 < 1e-6 && phys_said && d1 < 1e-6 &&
                        d2 < 1e-6, "cligrad-51-sensor-list-default",
                    "nbgrad's list renders the flags' sensor (within %.2g of their image); as DIALS writes it (%s), the "
                    "physical model (%s; within %.2g of the flags' -sensor physical), nanoBragg's with -sensor "
                    "nanobragg (within %.2g; exits %d, %d, %d)", d0, had ? "nbgrad's key dropped" : "no key to drop",
                    phys_said ? "said" : "not said", d1, d2, rc0, rc1, rc2);
    /* the adjoint on a tilted, oversampled detector with the physical sensor */
    snprintf(cmd, sizeof cmd, "%s gradcheck -cell 70 80 90 75 85 95 -misset 10 5 3 -default_F 100 -N 5 -lambda 1 "
                              "-distance 100 -detpixels 64 -pixel 0.4 -oversample 2 " SENS_THICK " -sensor physical "
                              "-detector_rotx 5 -detector_roty 3 -twotheta 10 -params detector,orientation 2>&1",
             bin);
    rc = run(cmd);
    nbgi_test_check(rc == 0 && strstr(out, "\n10 passed, 0 failed\n") != NULL, "cligrad-51-sensor-gradcheck",
                    "gradcheck of the detector's 7 parameters and the orientation with the physical sensor on a "
                    "tilted detector: %s (exit %d)", strstr(out, "\n10 passed, 0 failed\n") ? "10 passed" : "failed",
                    rc);
#undef SENS_XTAL
#undef SENS_THICK
}

int main(void)
{
    const char *bin = getenv("NBG_BIN") ? getenv("NBG_BIN") : "build/nbgrad";
    char dir[512], cmd[4096], path[1024];
    if (nbgi_test_mkdtemp("nbgrad-cligrad", dir, sizeof dir) == NULL) {
        nbgi_test_check(0, "cligrad-0", "could not make a temporary folder");
        return nbgi_test_summary();
    }

    snprintf(cmd, sizeof cmd, "%s gradcheck " XTAL " -params a,rotx,distance,Na 2>&1", bin);
    int rc = run(cmd);
    nbgi_test_check(rc == 0 && strstr(out, "PASS a adjoint=") != NULL && strstr(out, "PASS rotx adjoint=") != NULL &&
                       strstr(out, "\n4 passed, 0 failed\n") != NULL,
                   "cligrad-1-gradcheck", "gradcheck passes and prints one line per parameter (exit %d)", rc);

    snprintf(cmd, sizeof cmd, "%s gradcheck " XTAL " -params a,distance -debug_break_adjoint distance 2>&1", bin);
    rc = run(cmd);
    nbgi_test_check(rc == 1 && strstr(out, "FAIL distance adjoint=") != NULL && strstr(out, "1 passed, 1 failed") != NULL,
                   "cligrad-2-broken", "a broken adjoint makes gradcheck fail (exit %d)", rc);

    snprintf(cmd, sizeof cmd, "%s gradcheck -cell 100 100 100 90 90 90 -default_F 100 -N 5 -detpixels 32 "
                              "-tophat_spots -params a 2>&1", bin);
    rc = run(cmd);
    nbgi_test_check(rc == 1 && strstr(out, "proves nothing") != NULL, "cligrad-3-zero",
                   "a zero gradient is refused as proof (exit %d)", rc);

    snprintf(path, sizeof path, "%s/g.json", dir);
    snprintf(cmd, sizeof cmd, "%s grad " XTAL " -params cell,distance -json %s 2>&1", bin, path);
    rc = run(cmd);
    size_t size = 0;
    char *json = nbgi_test_read_file(path, &size);
    nbgi_test_check(rc == 0 && strstr(out, "dL/dgamma") != NULL && json != NULL && strstr(json, "\"distance\":") != NULL &&
                       strstr(json, "\"loss\":") != NULL,
                   "cligrad-4-grad-json", "grad prints the gradient and writes it as JSON (exit %d)", rc);
    free(json);
#ifdef NBG_HAVE_FORMATS
    check_grad_json(path, "a b c alpha beta gamma distance", 0, "cligrad-4-grad-json-keys");
    snprintf(cmd, sizeof cmd, "%s grad " XTAL " -params rotz,F -json %s 2>&1", bin, path);
    rc = run(cmd);
    check_grad_json(path, "rotz", 1, "cligrad-4-grad-json-dF");
#endif
    /* --version */
    snprintf(cmd, sizeof cmd, "%s --version", bin);
    rc = run(cmd);
    char want_version[64];
    snprintf(want_version, sizeof want_version, "nbgrad %s\n", nbg_version());
    nbgi_test_check(rc == 0 && strcmp(out, want_version) == 0, "cligrad-4-version",
                    "nbgrad --version prints \"nbgrad %s\" and exits 0 (exit %d: %.*s)", nbg_version(), rc,
                    (int)strcspn(out, "\n"), out);

    /* refine: the observed image is the truth; the start is perturbed */
    char obs[1024], res[1024], rjson[1024];
    snprintf(obs, sizeof obs, "%s/obs.bin", dir);
    snprintf(res, sizeof res, "%s/res.bin", dir);
    snprintf(rjson, sizeof rjson, "%s/r.json", dir);
    snprintf(cmd, sizeof cmd, "%s " XTAL " -floatfile %s 2>&1", bin, obs);
    rc = run(cmd);
    nbgi_test_check(rc == 0, "cligrad-5-truth", "rendered the observed image (exit %d)", rc);
    snprintf(cmd, sizeof cmd,
             "%s refine -cell 70.4 79.7 90.3 75.2 84.8 95.2 -misset 10.2 4.8 3.1 -default_F 100 -N 5 -lambda 1 "
             "-distance 100 -detpixels 64 -oversample 1 -observed %s -params cell,orientation -json %s -residual %s 2>&1",
             bin, obs, rjson, res);
    rc = run(cmd);
    json = nbgi_test_read_file(rjson, &size);
    size_t rsize = 0;
    char *resid = nbgi_test_read_file(res, &rsize);
    nbgi_test_check(rc == 0 && strstr(out, "converged") != NULL && strstr(out, "iter   1") != NULL && json != NULL &&
                       strstr(json, "\"sigma\"") != NULL && resid != NULL && rsize == 64 * 64 * 4,
                   "cligrad-6-refine", "refine converges, prints progress, writes JSON and the residual (exit %d)", rc);
    free(json);
#ifdef NBG_HAVE_FORMATS
    check_refine_json(rjson, 9, "cligrad-6-refine-json-keys");
#endif
    /* cligrad-35: the same bits for any thread count: grad (every parameter, Poisson loss) and refine (LM, and BFGS
     * on the adjoint's gradient) write the same JSON files with 1, 2 and 3 threads */
    {
        static const char *const what[3] = {"grad", "refine-lm", "refine-bfgs"};
        for (int w = 0; w < 3; ++w) {
            char *ref = NULL;
            size_t rlen = 0;
            int same = 1, ok = 1;
            for (int t = 1; t <= 3 && ok; ++t) {
                char jp[1100];
                snprintf(jp, sizeof jp, "%s/threads-%d-%d.json", dir, w, t);
                if (w == 0) {
                    snprintf(cmd, sizeof cmd,
                             "OMP_NUM_THREADS=%d %s grad -cell 70.4 79.7 90.3 75.2 84.8 95.2 -misset 10.2 4.8 3.1 "
                             "-default_F 100 -N 5 -lambda 1 -distance 100 -detpixels 64 -oversample 1 -mosaic 0.2 "
                             "-mosaic_dom 3 -observed %s -loss poisson -params all -json %s 2>&1", t, bin, obs, jp);
                } else {
                    snprintf(cmd, sizeof cmd,
                             "OMP_NUM_THREADS=%d %s refine -cell 70.4 79.7 90.3 75.2 84.8 95.2 -misset 10.2 4.8 3.1 "
                             "-default_F 100 -N 5 -lambda 1 -distance 100 -detpixels 64 -oversample 1 -observed %s "
                             "-params cell,orientation,Na,scale -loss poisson -method %s -json %s 2>&1", t, bin, obs,
                             w == 1 ? "lm" : "bfgs", jp);
                }
                rc = run(cmd);
                size_t len = 0;
                char *j = nbgi_test_read_file(jp, &len);
                ok = rc == 0 && j != NULL && len > 0;
                if (ok && ref == NULL) {
                    ref = j, rlen = len;
                } else {
                    same &= ok && len == rlen && memcmp(j, ref, len) == 0;
                    free(j);
                }
            }
            char id[64];
            snprintf(id, sizeof id, "cligrad-35-threads-%s", what[w]);
            nbgi_test_check(ok && same, id, "%s with 1, 2, 3 threads: %s (exit %d)", what[w],
                            !ok ? "a run failed" : same ? "the same JSON, byte for byte" : "the JSON files DIFFER", rc);
            free(ref);
        }
    }
    /* cligrad-36: an image file whose stated shape is not the detector's is refused even when the pixel count is
     * the same (a 64 x 64 SMV, CBF and NXmx fitted as a 128 x 32 detector); raw floats state no shape */
    {
        static const char *const fmt[3][2] = {{"-intfile", "shape.img"}, {"-cbffile", "shape.cbf"},
                                              {"-nxsfile", "shape.nxs"}};
        for (int k = 0; k < 3; ++k) {
#ifndef NBG_HAVE_FORMATS
            if (k > 0) {
                nbgi_test_skip("cligrad-36-shape", "built without the formats");
                break;
            }
#endif
            char ip[1100], id[64];
            snprintf(ip, sizeof ip, "%s/%s", dir, fmt[k][1]);
            snprintf(cmd, sizeof cmd, "%s " XTAL " %s %s 2>&1", bin, fmt[k][0], ip);
            rc = run(cmd);
            const int made = rc == 0;
            for (int sub = 0; sub < 2; ++sub) {
                snprintf(cmd, sizeof cmd,
                         "%s %s -cell 70.4 79.7 90.3 75.2 84.8 95.2 -misset 10.2 4.8 3.1 -default_F 100 -N 5 -lambda 1 "
                         "-distance 100 -detpixels_f 128 -detpixels_s 32 -oversample 1 -observed %s -params a 2>&1",
                         bin, sub == 0 ? "refine" : "grad", ip);
                rc = run(cmd);
                snprintf(id, sizeof id, "cligrad-36-shape-%s-%s", fmt[k][1] + 6, sub == 0 ? "refine" : "grad");
                nbgi_test_check(made && rc != 0 && strstr(out, "is 64 x 64 pixels (fast x slow, as the file states) but "
                                                               "the detector is 128 x 32") != NULL,
                                id, "a 64 x 64 image fitted as a 128 x 32 detector is refused (exit %d: %.*s)", rc,
                                (int)strcspn(out, "\n"), out);
            }
        }
        /* raw floats: the count alone (the 64 x 64 truth as 128 x 32 pixels is taken as such) */
        snprintf(cmd, sizeof cmd,
                 "%s grad -cell 70.4 79.7 90.3 75.2 84.8 95.2 -misset 10.2 4.8 3.1 -default_F 100 -N 5 -lambda 1 "
                 "-distance 100 -detpixels_f 128 -detpixels_s 32 -oversample 1 -observed %s -params a 2>&1", bin, obs);
        rc = run(cmd);
        nbgi_test_check(rc == 0, "cligrad-36-shape-raw", "raw floats state no shape: the pixel count decides (exit %d)",
                        rc);
    }
    /* cligrad-37: one rule for a refinement that does not determine its parameters (was: "converged" with standard
     * errors of 1e7): det_rotz and twotheta (the same rotation in the MOSFLM convention), two parameters on one
     * pixel; a well-posed fit with correlated parameters still converges */
    {
        static const struct {
            const char *id, *params, *extra, *want[3];
        } sg[] = {{"cligrad-37-singular-detector", "det_rotz,twotheta", "", {"does not determine", "det_rotz",
                                                                             "twotheta"}},
                  {"cligrad-37-singular-one-pixel", "a,rotx", "-roi 30 30 30 30", {"does not determine", " a ",
                                                                                   "rotx"}}};
        for (int k = 0; k < 2; ++k) {
            snprintf(cmd, sizeof cmd,
                     "%s refine -cell 70.4 79.7 90.3 75.2 84.8 95.2 -misset 10.2 4.8 3.1 -default_F 100 -N 5 -lambda 1 "
                     "-distance 100 -detpixels 64 -oversample 1 -observed %s -params %s %s 2>&1", bin, obs,
                     sg[k].params, sg[k].extra);
            rc = run(cmd);
            const char *msg = strstr(out, "nbgrad: error:");
            nbgi_test_check(rc == 1 && msg != NULL && strstr(msg, sg[k].want[0]) != NULL &&
                                strstr(msg, sg[k].want[1]) != NULL && strstr(msg, sg[k].want[2]) != NULL,
                            sg[k].id, "-params %s %s is refused, naming the combination (exit %d: %.*s)", sg[k].params,
                            sg[k].extra, rc, msg != NULL ? (int)strcspn(msg, "\n") : 0, msg != NULL ? msg : "");
        }
        snprintf(cmd, sizeof cmd,
                 "%s refine -cell 70.4 79.7 90.3 75.2 84.8 95.2 -misset 10.2 4.8 3.1 -default_F 100 -N 5 -lambda 1 "
                 "-distance 100 -detpixels 64 -oversample 1 -observed %s -params a,distance,lambda 2>&1", bin, obs);
        rc = run(cmd);
        nbgi_test_check(rc == 0 && strstr(out, "converged") != NULL, "cligrad-37-correlated",
                        "a, distance and lambda (correlated, determined) still converge (exit %d)", rc);
        /* a parameter without information at the start (the spindle's tilt of a still: no rotation to tilt) is
         * refused before the first step (until stop 58 after the whole fit) */
        snprintf(cmd, sizeof cmd,
                 "%s refine -cell 70.4 79.7 90.3 75.2 84.8 95.2 -misset 10.2 4.8 3.1 -default_F 100 -N 5 -lambda 1 "
                 "-distance 100 -detpixels 64 -oversample 1 -observed %s -params a,spindle_tilt1 2>&1", bin, obs);
        rc = run(cmd);
        const char *msg = strstr(out, "nbgrad: error:");
        const int stepped = strncmp(out, "iter ", 5) == 0 || strstr(out, "\niter ") != NULL;
        nbgi_test_check(rc == 1 && msg != NULL && strstr(msg, "does not determine spindle_tilt1") != NULL &&
                            strstr(msg, "at the starting model") != NULL && !stepped,
                        "cligrad-37-zero-at-start", "-params a,spindle_tilt1 on a still is refused before the first "
                        "step (exit %d, %s: %.*s)", rc, stepped ? "after steps" : "no step",
                        msg != NULL ? (int)strcspn(msg, "\n") : 0, msg != NULL ? msg : "");
    }
    /* cligrad-38: refine -params ...,F fits the -hkl table's measured entries (per-reflection scales): a still whose
     * structure factors vary, started from a table 30 % off entry by entry and a turned crystal; the refusals */
    {
        char thkl[1024], shkl[1024], fobs[1024], fout[1024], fjson[1024];
        snprintf(thkl, sizeof thkl, "%s/truth.hkl", dir);
        snprintf(shkl, sizeof shkl, "%s/start.hkl", dir);
        snprintf(fobs, sizeof fobs, "%s/fobs.bin", dir);
        snprintf(fout, sizeof fout, "%s/fitted.hkl", dir);
        snprintf(fjson, sizeof fjson, "%s/f.json", dir);
        FILE *ft = fopen(thkl, "w"), *fs = fopen(shkl, "w");
        uint64_t sd = 38;
        for (int h = -10; h <= 10 && ft != NULL && fs != NULL; ++h) {
            for (int k = -10; k <= 10; ++k) {
                for (int l = -10; l <= 10; ++l) {
                    sd = sd * 6364136223846793005ULL + 1442695040888963407ULL;
                    const double u1 = (double)(sd >> 11) / 9007199254740992.0;
                    sd = sd * 6364136223846793005ULL + 1442695040888963407ULL;
                    const double u2 = (double)(sd >> 11) / 9007199254740992.0;
                    fprintf(ft, "%d %d %d %.10g\n", h, k, l, 50 + 100 * u1);
                    fprintf(fs, "%d %d %d %.10g\n", h, k, l, (50 + 100 * u1) * (0.7 + 0.6 * u2));
                }
            }
        }
        if (ft != NULL) fclose(ft);
        if (fs != NULL) fclose(fs);
#define FXTAL "-cell 70 80 90 75 85 95 -misset 10 5 3 -N 10 -lambda 1 -distance 100 -detpixels 128 -oversample 1 -nodump"
        snprintf(cmd, sizeof cmd, "%s " FXTAL " -hkl %s -floatfile %s 2>&1", bin, thkl, fobs);
        rc = run(cmd);
        char fcmd[8192];
        snprintf(fcmd, sizeof fcmd, "%s refine -cell 70.1 80 90 75 85 95 -misset 10.03 4.98 3.02 -N 10 -lambda 1 "
                 "-distance 100 -detpixels 128 -oversample 1 -nodump -hkl %s -observed %s "
                 "-params orientation,a,F -hklout %s -json %s 2>&1", bin, shkl, fobs, fout, fjson);
        rc = run(fcmd);
        double a = NAN, a0 = NAN;
        const char *row = strstr(out, "\na ");
        if (row == NULL || sscanf(row + 2, "%lf %lf", &a0, &a) != 2) {
            a = NAN;
        }
        size_t hs = 0;
        char *fitted = nbgi_test_read_file(fout, &hs);
        long nlines = 0;
        for (size_t q = 0; fitted != NULL && q < hs; ++q) nlines += fitted[q] == '\n';
        char *fj = nbgi_test_read_file(fjson, &hs);
        nbgi_test_check(rc == 0 && strstr(out, "converged after") != NULL && strstr(out, "structure factors: ") != NULL &&
                            fabs(a - 70) < 1e-5 && nlines > 10 && fj != NULL && strstr(fj, "\"F_fitted\"") != NULL,
                        "cligrad-38-refine-F", "refine -params orientation,a,F from a table 30 %% off: a = %.8g (truth "
                        "70), %ld entries in -hklout, JSON F_fitted (exit %d)", a, nlines, rc);
        free(fitted);
        free(fj);
        /* the same bits with 1 and 3 threads: the JSON and the fitted table */
        {
            int same = 1;
            char *ref[2] = {NULL, NULL};
            size_t rl[2] = {0, 0};
            for (int t = 1; t <= 3; t += 2) {
                char jp[1100], hp[1100];
                snprintf(jp, sizeof jp, "%s/fthr%d.json", dir, t);
                snprintf(hp, sizeof hp, "%s/fthr%d.hkl", dir, t);
                snprintf(fcmd, sizeof fcmd, "OMP_NUM_THREADS=%d %s refine -cell 70.1 80 90 75 85 95 -misset 10.03 "
                         "4.98 3.02 -N 10 -lambda 1 -distance 100 -detpixels 128 -oversample 1 -nodump -hkl %s "
                         "-observed %s -params orientation,a,F -hklout %s -json %s 2>&1", t, bin, shkl, fobs, hp, jp);
                rc = run(fcmd);
                size_t l1 = 0, l2 = 0;
                char *a1 = nbgi_test_read_file(jp, &l1), *a2 = nbgi_test_read_file(hp, &l2);
                if (t == 1) {
                    ref[0] = a1, ref[1] = a2, rl[0] = l1, rl[1] = l2;
                    same = rc == 0 && a1 != NULL && a2 != NULL;
                } else {
                    same &= rc == 0 && a1 != NULL && a2 != NULL && l1 == rl[0] && l2 == rl[1] &&
                            memcmp(a1, ref[0], l1) == 0 && memcmp(a2, ref[1], l2) == 0;
                    free(a1), free(a2);
                }
            }
            free(ref[0]), free(ref[1]);
            nbgi_test_check(same, "cligrad-38-threads", "refine -params ...,F with 1 and 3 threads: %s",
                            same ? "the same JSON and fitted table, byte for byte" : "they DIFFER (or a run failed)");
        }
        static const struct {
            const char *id, *args, *want;
        } bad[] = {{"cligrad-38-F-no-table", "-default_F 100 -params a,F", "no -hkl table"},
                   {"cligrad-38-F-one-entry", "-hkl START -params 'a,F(1,2,3)'", "not single entries"},
                   {"cligrad-38-hklout-no-F", "-hkl START -params a -hklout x.hkl", "not fitted"},
                   {"cligrad-38-F-bfgs", "-hkl START -params a,F -method bfgs", "Levenberg-Marquardt only"}};
        for (size_t q = 0; q < sizeof bad / sizeof bad[0]; ++q) {
            char args[2400];
            const char *st = strstr(bad[q].args, "START");
            if (st != NULL) {
                snprintf(args, sizeof args, "%.*s%s%s", (int)(st - bad[q].args), bad[q].args, shkl, st + 5);
            } else {
                snprintf(args, sizeof args, "%s", bad[q].args);
            }
            char bcmd[8192];
            snprintf(bcmd, sizeof bcmd, "%s refine " FXTAL " -observed %s %s 2>&1", bin, fobs, args);
            rc = run(bcmd);
            const char *msg = strstr(out, "error");
            nbgi_test_check(rc == 1 && strstr(out, bad[q].want) != NULL, bad[q].id, "%s refused: %.*s", bad[q].args,
                            msg != NULL ? (int)strcspn(msg, "\n") : 0, msg != NULL ? msg : "");
        }
#undef FXTAL
    }
    /* progress on stderr, results on stdout; -quiet: no progress */
    snprintf(cmd, sizeof cmd,
             "%s refine -cell 70.4 79.7 90.3 75.2 84.8 95.2 -misset 10.2 4.8 3.1 -default_F 100 -N 5 -lambda 1 "
             "-distance 100 -detpixels 64 -oversample 1 -observed %s -params a,rotx -maxiter 3 2>/dev/null", bin, obs);
    rc = run(cmd);
    const int out_has_iter = strstr(out, "iter ") != NULL, out_has_result = strstr(out, "parameter ") != NULL;
    snprintf(cmd, sizeof cmd,
             "%s refine -cell 70.4 79.7 90.3 75.2 84.8 95.2 -misset 10.2 4.8 3.1 -default_F 100 -N 5 -lambda 1 "
             "-distance 100 -detpixels 64 -oversample 1 -observed %s -params a,rotx -maxiter 3 2>&1 >/dev/null", bin,
             obs);
    rc = run(cmd);
    const int err_has_iter = strstr(out, "iter   1") != NULL;
    snprintf(cmd, sizeof cmd,
             "%s refine -cell 70.4 79.7 90.3 75.2 84.8 95.2 -misset 10.2 4.8 3.1 -default_F 100 -N 5 -lambda 1 "
             "-distance 100 -detpixels 64 -oversample 1 -observed %s -params a,rotx -maxiter 3 -quiet 2>&1", bin, obs);
    rc = run(cmd);
    nbgi_test_check(!out_has_iter && out_has_result && err_has_iter && strstr(out, "iter ") == NULL &&
                        strstr(out, "parameter ") != NULL,
                    "cligrad-6-refine-progress", "the iterations on stderr (%s), the table on stdout (%s), none of "
                    "them on stdout (%s); -quiet: no iteration line, the table still (exit %d)",
                    err_has_iter ? "yes" : "no", out_has_result ? "yes" : "no", out_has_iter ? "some" : "none", rc);
    free(resid);
    /* the same fit on spot regions: from the model's spots, and around listed centres; a malformed list */
    snprintf(cmd, sizeof cmd,
             "%s refine -cell 70.4 79.7 90.3 75.2 84.8 95.2 -misset 10.2 4.8 3.1 -default_F 100 -N 5 -lambda 1 "
             "-distance 100 -detpixels 64 -oversample 1 -observed %s -params cell,orientation -spots 3 -residual %s "
             "2>&1", bin, obs, res);
    rc = run(cmd);
    resid = nbgi_test_read_file(res, &rsize);
    nbgi_test_check(rc == 0 && strstr(out, "spot regions: ") != NULL && strstr(out, "converged") != NULL &&
                       resid != NULL && rsize == 64 * 64 * 4,
                   "cligrad-6-refine-spots", "refine -spots 3 converges on the spot regions (exit %d)", rc);
    free(resid);
    /* -cell builds (nanoBragg's construction) a crystal with other angles than -cell's: refine prints the refined
     * crystal's own cell beside the table's -cell values; from a crystal as a list, the cell parameters are the
     * crystal's own (-cell 70.4 79.7 90.3 75.2 84.8 95.2 builds alpha 75.24) and no note */
    {
        double own[6] = {0}, ref = NAN, tab = NAN, built[6] = {0};
        const char *n = strstr(out, "note: the crystal's own cell is "), *t = strstr(out, "\nalpha ");
        const int got = n != NULL && sscanf(n + 32, "%lf %lf %lf %lf %lf %lf", own, own + 1, own + 2, own + 3,
                                            own + 4, own + 5) == 6;
        double start;
        if (t != NULL && sscanf(t + 7, "%lf %lf", &start, &ref) != 2) {
            ref = NAN;
        }
        char ex[1024];
        snprintf(ex, sizeof ex, "%s/tri.expt", dir);
        snprintf(cmd, sizeof cmd,
                 "%s -cell 70.4 79.7 90.3 75.2 84.8 95.2 -misset 10.2 4.8 3.1 -default_F 100 -N 5 -lambda 1 "
                 "-distance 100 -detpixels 64 -oversample 1 -exptfile %s -floatfile /dev/null 2>&1 && "
                 "%s refine -expt %s -default_F 100 -N 5 -oversample 1 -observed %s -params cell -maxiter 1 2>&1",
                 bin, ex, bin, ex, obs);
        rc = run(cmd);
        const char *u = strstr(out, "unit cell: ");
        const int gotb = u != NULL && sscanf(u + 11, "%lf %lf %lf %lf %lf %lf", built, built + 1, built + 2,
                                             built + 3, built + 4, built + 5) == 6;
        t = strstr(out, "\nalpha ");
        if (t == NULL || sscanf(t + 7, "%lf", &tab) != 1) {
            tab = NAN;
        }
        nbgi_test_check(got && fabs(own[3] - ref) > 1e-3 && gotb && fabs(built[3] - 75.2) > 1e-3 &&
                            fabs(tab - built[3]) < 1e-4 && strstr(out, "note: the crystal's own cell") == NULL,
                        "cligrad-6-refine-own-cell", "from -cell: the refined crystal's own alpha %.6f printed beside "
                        "the table's %.6f; from a list of the crystal -cell ... 75.2 ... builds (alpha %.6f), the "
                        "table's alpha starts at %.6f, no note (exit %d)", own[3], ref, built[3], tab, rc);
    }
    char spl[1024];
    snprintf(spl, sizeof spl, "%s/spots.txt", dir);
    write_text(spl, "# fast slow\n10 12\n40.4 50.6\n");
    snprintf(cmd, sizeof cmd, "%s refine " XTAL " -observed %s -params a -spotlist %s -spots 2 2>&1", bin, obs, spl);
    rc = run(cmd);
    nbgi_test_check(strstr(out, "spot regions: 50 pixels") != NULL && strstr(out, "2 spot centres") != NULL,
                   "cligrad-6-refine-spotlist", "two boxes of 5 x 5 around the listed centres (exit %d)", rc);
    write_text(spl, "10 12\n3 x\n");
    rc = run(cmd);
    nbgi_test_check(rc != 0 && strstr(out, "line 2") != NULL, "cligrad-6-refine-spotlist-bad",
                   "a malformed spot list is refused naming the line (exit %d)", rc);

    snprintf(cmd, sizeof cmd, "%s refine " XTAL " -detpixels 32 -observed %s -params a 2>&1", bin, obs);
    rc = run(cmd);
    nbgi_test_check(rc != 0 && strstr(out, "bytes") != NULL, "cligrad-7-size", "an observed image of the wrong size: %s",
                   rc != 0 ? "refused" : "accepted");
    snprintf(cmd, sizeof cmd, "%s refine " XTAL " -observed %s -params a,cellsize 2>&1", bin, obs);
    rc = run(cmd);
    nbgi_test_check(rc != 0 && strstr(out, "'cellsize'") != NULL, "cligrad-8-param", "an unknown parameter is named");
    /* a negative pixel in the observed image */
    FILE *f = fopen(obs, "r+b");
    const float neg = -5.0f;
    if (f != NULL) {
        fseek(f, 4 * 100, SEEK_SET);
        fwrite(&neg, 4, 1, f);
        fclose(f);
    }
    snprintf(cmd, sizeof cmd, "%s refine " XTAL " -observed %s -params a 2>&1", bin, obs);
    rc = run(cmd);
    nbgi_test_check(rc == 0 && strstr(out, "1 pixels below 0 counts (dark-subtracted data?)") != NULL,
                    "cligrad-9-negative", "a pixel below zero is data (dark-subtracted images), and said (exit %d)", rc);
    {
        /* a NaN pixel is not: refused, named */
        const float nanv = NAN;
        FILE *fn = fopen(obs, "r+b");
        if (fn != NULL) {
            fseek(fn, 4 * 100, SEEK_SET);
            fwrite(&nanv, 4, 1, fn);
            fclose(fn);
        }
        rc = run(cmd);
        nbgi_test_check(rc != 0 && strstr(out, "pixel 100 is nan (must be finite)") != NULL, "cligrad-9-nan",
                        "a NaN observed pixel is named (exit %d)", rc);
        fn = fopen(obs, "r+b"); /* the pixel below zero again, for the cases below */
        if (fn != NULL) {
            fseek(fn, 4 * 100, SEEK_SET);
            fwrite(&neg, 4, 1, fn);
            fclose(fn);
        }
    }
    snprintf(cmd, sizeof cmd, "%s refine -cell 70 80 90 75 85 195 -default_F 100 -N 5 -detpixels 64 -observed %s "
                              "-params gamma 2>&1", bin, obs);
    rc = run(cmd);
    nbgi_test_check(rc != 0 && (strstr(out, "bounds") != NULL || strstr(out, "cell") != NULL), "cligrad-10-bounds",
                   "a start outside the bounds is refused");

    /* real-looking data: nanoBragg's noise image (SMV, pedestal 40 and no ADC_OFFSET key), a perturbed start */
    char smv[1024];
    snprintf(smv, sizeof smv, "%s/obs.img", dir);
#define XT "-default_F 100 -N 5 -lambda 1 -distance 100 -detpixels 64 -oversample 1 -fluence 5e30"
    snprintf(cmd, sizeof cmd, "%s -cell 70 80 90 75 85 95 -misset 10 5 3 " XT " -noisefile %s -seed 7 -nopgm 2>&1",
             bin, smv);
    rc = run(cmd);
    nbgi_test_check(rc == 0, "cligrad-11-noise", "rendered the noise image (exit %d)", rc);
#define START "-cell 70.7 80.8 90.9 75 85 95 -misset 10.5 5.5 3.5 " XT
    snprintf(cmd, sizeof cmd, "%s refine " START " -observed %s -loss poisson -params cell,orientation 2>&1", bin, smv);
    rc = run(cmd);
    nbgi_test_check(rc == 0 && strstr(out, "pedestal 40 counts (an SMV file without ADC_OFFSET") != NULL &&
                       strstr(out, "converged after") != NULL && strstr(out, "WARNING") == NULL,
                   "cligrad-12-pedestal", "the SMV file's pedestal is nanoBragg's 40: converged, no warning (exit %d)",
                   rc);
    /* a pedestal 2 counts too low on this weak floor (was silent: the rule wanted 5 counts), and none at all: the
     * warning gives 40 and the exit status says it */
    static const struct {
        const char *pedestal, *id, *what;
    } low[2] = {{"38", "cligrad-13-low-pedestal", "-pedestal 38 for 40 on a weak floor: the warning gives 40"},
                {"0", "cligrad-13-no-pedestal", "without the pedestal: the warning names it"}};
    for (int k = 0; k < 2; ++k) {
        snprintf(cmd, sizeof cmd,
                 "%s refine " START " -observed %s -loss poisson -params cell,orientation -pedestal %s 2>&1", bin, smv,
                 low[k].pedestal);
        rc = run(cmd);
        nbgi_test_check(rc != 0 && rc != 1 &&
                            strstr(out, "WARNING (before the fit): the observed image has a floor of 40") != NULL &&
                            strstr(out, "-pedestal 40 (nanoBragg's ADC offset") != NULL,
                        low[k].id, "%s, and the exit status is %d (not 0)", low[k].what, rc);
    }
    /* the iteration limit: NOT CONVERGED, exit status 2, one iteration line for one iteration */
    snprintf(cmd, sizeof cmd, "%s refine " START " -observed %s -loss poisson -params cell,orientation -maxiter 1 "
                              "-json %s 2>&1", bin, smv, rjson);
    rc = run(cmd);
    json = nbgi_test_read_file(rjson, &size);
    nbgi_test_check(rc == 2 && strstr(out, "NOT CONVERGED after 1 iterations: iteration limit") != NULL &&
                       strstr(out, "iter   1") != NULL && strstr(out, "iter   2") == NULL && json != NULL &&
                       strstr(json, "\"converged\": false") != NULL &&
                       strstr(json, "\"reason\": \"iteration limit\"") != NULL,
                   "cligrad-14-maxiter",
                   "-maxiter 1: NOT CONVERGED, exit 2, one iteration line, JSON says so (exit %d)", rc);
    free(json);
    /* an overloaded pixel (65535, the SMV saturation) is left out, and said so */
    f = fopen(smv, "r+b");
    const unsigned short over = 65535;
    if (f != NULL) {
        fseek(f, 512 + 2 * 200, SEEK_SET);
        fwrite(&over, 2, 1, f);
        fclose(f);
    }
    snprintf(cmd, sizeof cmd, "%s refine " START " -observed %s -loss poisson -params cell,orientation 2>&1", bin, smv);
    rc = run(cmd);
    nbgi_test_check(rc == 0 && strstr(out, "left out 1 of 4096 pixels: 0 in the file's mask, 1 overloaded") != NULL,
                   "cligrad-15-overload", "an overload is left out and counted (exit %d)", rc);
    /* -params all: what it leaves out, with the reasons */
    snprintf(cmd, sizeof cmd, "%s refine " START " -observed %s -loss poisson -params all -maxiter 2 2>&1", bin, smv);
    rc = run(cmd);
    nbgi_test_check(strstr(out, "-params all: ") != NULL && strstr(out, "\n  mosaic: ") != NULL &&
                       strstr(out, "\n  fluence: ") != NULL && strstr(out, "\n  F: ") != NULL,
                   "cligrad-16-all", "-params all names what it leaves out (exit %d)", rc);
    /* gradcheck: ZERO does not fail the run when something passes; the loss is printed */
    snprintf(cmd, sizeof cmd, "%s gradcheck -cell 100 100 100 90 90 90 -default_F 100 -N 5 -detpixels 32 "
                              "-tophat_spots -params a,distance 2>&1", bin);
    rc = run(cmd);
    nbgi_test_check(rc == 0 && strstr(out, "ZERO a adjoint=") != NULL && strstr(out, "PASS distance") != NULL &&
                       strstr(out, "1 passed, 0 failed, 1 zero") != NULL && strstr(out, "L = sum_p w_p M_p") != NULL &&
                       strstr(out, "\nL = ") != NULL,
                   "cligrad-17-zero", "a zero gradient is ZERO, not a failure, beside a pass (exit %d)", rc);
    snprintf(cmd, sizeof cmd, "%s gradcheck -cell 100 100 100 90 90 90 -default_F 100 -N 5 -detpixels 32 "
                              "-tophat_spots -params a,distance -debug_break_adjoint distance 2>&1", bin);
    rc = run(cmd);
    nbgi_test_check(rc == 1 && strstr(out, "FAIL distance") != NULL && strstr(out, "ZERO a") != NULL,
                   "cligrad-18-zero-broken", "a broken adjoint still fails beside a ZERO (exit %d)", rc);
    /* panel motions through the program: a Pilatus 6M with two modules moved, then refined back from no motion on
     * spot regions; the fitted motions written with -motionsfile */
#define PIL "-layout pilatus6m -cell 70 80 90 90 90 90 -misset 10 20 30 -default_F 100 -N 10 -lambda 1 -distance 250"
    char mot[1024], fit[1024], truth[1024];
    snprintf(mot, sizeof mot, "%s/m.txt", dir);
    snprintf(fit, sizeof fit, "%s/fit.txt", dir);
    snprintf(truth, sizeof truth, "%s/truth.bin", dir);
    write_text(mot, "# group sx sy sz rx ry rz\n7 0.12 -0.08 0 0 0 0.3\n22 -0.1 0.15 0.2 0.1 0 -0.4\n");
    snprintf(cmd, sizeof cmd, "%s simulate " PIL " -motions %s -floatfile %s 2>&1", bin, mot, truth);
    rc = run(cmd);
    nbgi_test_check(rc == 0, "cligrad-19-motions-sim", "a Pilatus 6M with two modules moved (exit %d)", rc);
    snprintf(cmd, sizeof cmd, "%s refine " PIL " -observed %s -spots 3 -params g7.shift_x,g7.shift_y,g7.rot_z "
                              "-motions %s -motionsfile %s 2>&1", bin, truth, mot, fit);
    /* the start: group 7 at rest, group 22 where it is */
    write_text(mot, "22 -0.1 0.15 0.2 0.1 0 -0.4\n");
    rc = run(cmd);
    double m7[6] = {NAN, NAN, NAN, NAN, NAN, NAN};
    int g7 = -1;
    FILE *ff = fopen(fit, "r");
    if (ff != NULL) {
        char line[512];
        while (fgets(line, sizeof line, ff) != NULL) {
            int g;
            double v[6];
            if (sscanf(line, "%d %lf %lf %lf %lf %lf %lf", &g, &v[0], &v[1], &v[2], &v[3], &v[4], &v[5]) == 7 && g == 7) {
                g7 = g;
                memcpy(m7, v, sizeof v);
            }
        }
        fclose(ff);
    }
    nbgi_test_check(rc == 0 && strstr(out, "converged after") != NULL && strstr(out, "g7.shift_x") != NULL &&
                       g7 == 7 && fabs(m7[0] - 0.12) < 1e-6 && fabs(m7[1] + 0.08) < 1e-6 && fabs(m7[5] - 0.3) < 1e-5,
                   "cligrad-20-motions-refine", "module 7's shift and turn refined back from rest on the noise-free "
                   "image: %.7f %.7f mm, %.6f deg (truth 0.12 -0.08, 0.3; exit %d)", m7[0], m7[1], m7[5], rc);
    snprintf(cmd, sizeof cmd, "%s grad " PIL " -params g22.shift_z,panel_rot_z -panel_groups detector 2>&1", bin);
    rc = run(cmd);
    nbgi_test_check(rc == 1 && strstr(out, "-params g22.shift_z: the detector has 1 panel groups") != NULL,
                   "cligrad-21-motions-group", "a group beyond -panel_groups' count is refused by name (exit %d)",
                   rc);
    snprintf(cmd, sizeof cmd, "%s grad " XTAL " -params panel_shift 2>&1", bin);
    rc = run(cmd);
    nbgi_test_check(rc == 1 && strstr(out, "this detector has none") != NULL, "cligrad-22-motions-flat",
                   "panel parameters on a flat detector are refused (exit %d)", rc);
    write_text(mot, "3 0.1 0.2 0.3\n");
    snprintf(cmd, sizeof cmd, "%s simulate " PIL " -motions %s 2>&1", bin, mot);
    rc = run(cmd);
    nbgi_test_check(rc == 1 && strstr(out, "line 1: expected 'group shift_x") != NULL, "cligrad-23-motions-bad",
                   "a short -motions line is refused with its number (exit %d)", rc);
#undef PIL
    /* a crystal of three blocks (mosaic domains turned by their own angles, no spread): simulated, then the two
     * blocks' turns refined back from another start on the noise-free image; the fit written with -domain_rotfile */
#define BLK "-cell 70 80 90 75 85 95 -misset 10 5 3 -default_F 100 -N 8 -lambda 1 -distance 100 -detpixels 96 " \
            "-oversample 1 -mosaic_domains 3"
    snprintf(truth, sizeof truth, "%s/blocks.bin", dir);
    write_text(mot, "# domain rx ry rz\n1 0.3 -0.2 0.25\n2 -0.25 0.4 -0.1\n");
    snprintf(cmd, sizeof cmd, "%s simulate " BLK " -domain_rot %s -floatfile %s 2>&1", bin, mot, truth);
    rc = run(cmd);
    nbgi_test_check(rc == 0, "cligrad-39-blocks-sim", "three blocks turned by -domain_rot (exit %d)", rc);
    write_text(mot, "1 0.25 -0.15 0.2\n2 -0.2 0.35 -0.05\n");
    snprintf(cmd, sizeof cmd, "%s refine " BLK " -observed %s -params domain_rot -domain_rot %s -domain_rotfile %s "
                              "2>&1", bin, truth, mot, fit);
    rc = run(cmd);
    double d[3][3] = {{NAN, NAN, NAN}, {NAN, NAN, NAN}, {NAN, NAN, NAN}};
    ff = fopen(fit, "r");
    if (ff != NULL) {
        char line[512];
        while (fgets(line, sizeof line, ff) != NULL) {
            int m;
            double v[3];
            if (sscanf(line, "%d %lf %lf %lf", &m, &v[0], &v[1], &v[2]) == 4 && m >= 0 && m < 3) {
                memcpy(d[m], v, sizeof v);
            }
        }
        fclose(ff);
    }
    const double wturn[3][3] = {{0, 0, 0}, {0.3, -0.2, 0.25}, {-0.25, 0.4, -0.1}};
    double worst = 0;
    for (int m = 0; m < 3; ++m) {
        for (int k = 0; k < 3; ++k) {
            worst = fmax(worst, isnan(d[m][k]) ? INFINITY : fabs(d[m][k] - wturn[m][k]));
        }
    }
    nbgi_test_check(rc == 0 && strstr(out, "converged after") != NULL && strstr(out, "d2.rot_y") != NULL &&
                        worst < 1e-5,
                    "cligrad-40-blocks-refine", "the blocks' turns refined back to within %.2g deg (d1 %.6f %.6f "
                    "%.6f, d2 %.6f %.6f %.6f; exit %d)", worst, d[1][0], d[1][1], d[1][2], d[2][0], d[2][1], d[2][2],
                    rc);
    snprintf(cmd, sizeof cmd, "%s simulate " XTAL " -domain_rot %s 2>&1", bin, mot);
    rc = run(cmd);
    nbgi_test_check(rc == 1 && strstr(out, "give -mosaic_domains n") != NULL, "cligrad-41-blocks-count",
                    "-domain_rot without -mosaic_domains is refused (exit %d)", rc);
    snprintf(cmd, sizeof cmd, "%s grad " XTAL " -params d1.rot_x 2>&1", bin);
    rc = run(cmd);
    nbgi_test_check(rc == 1 && strstr(out, "-params d1.rot_x") != NULL && strstr(out, "-mosaic_domains") != NULL,
                    "cligrad-42-blocks-params", "-params d1.rot_x without domains is refused by name (exit %d)", rc);
    write_text(mot, "1 0.1 0.2\n");
    snprintf(cmd, sizeof cmd, "%s simulate " BLK " -domain_rot %s 2>&1", bin, mot);
    rc = run(cmd);
    nbgi_test_check(rc == 1 && strstr(out, "line 1: expected 'domain rot_x rot_y rot_z'") != NULL,
                    "cligrad-43-blocks-bad-line", "a short -domain_rot line is refused with its number (exit %d)", rc);
    write_text(mot, "# three domains: 0 to 2\n3 0.1 0.2 0.3\n");
    rc = run(cmd);
    nbgi_test_check(rc == 1 && strstr(out, "line 2: domain 3, and the crystal has 3 mosaic domains") != NULL,
                    "cligrad-44-blocks-domain", "a domain beyond -mosaic_domains is refused with its line (exit %d)",
                    rc);
    /* the blocks through an experiment list: written with their turns (nbgrad_mosaic.turns), read back by -expt
     * alone, the same image; and for a still at phi 30 deg, which the list holds turned (the crystal's turns with
     * it) */
    for (int still = 0; still < 2; ++still) {
        char ex[1024], img2[1024];
        snprintf(ex, sizeof ex, "%s/blocks.expt", dir);
        snprintf(img2, sizeof img2, "%s/blocks2.bin", dir);
        write_text(mot, "1 0.3 -0.2 0.25\n2 -0.25 0.4 -0.1\n");
        snprintf(cmd, sizeof cmd, "%s simulate " BLK " -domain_rot %s%s -floatfile %s -exptfile %s 2>&1", bin, mot,
                 still ? " -phi 30" : "", truth, ex);
        const int rc1 = run(cmd);
        snprintf(cmd, sizeof cmd, "%s simulate -expt %s -default_F 100 -N 8 -oversample 1 -floatfile %s 2>&1", bin, ex,
                 img2);
        const int rc2 = run(cmd);
        const double dmax = float_diff(truth, img2, 96 * 96);
        nbgi_test_check(rc1 == 0 && rc2 == 0 && dmax == 0, still ? "cligrad-45-blocks-expt-still-phi" :
                        "cligrad-45-blocks-expt", "the list's turns render the same image from -expt alone: largest "
                        "difference %.3g of the maximum (exits %d, %d)", dmax, rc1, rc2);
    }
    /* the same list as a shot's (batch, ensemble): its turns go with it.  batch renders the image -expt renders;
     * ensemble starts at the truth, where the shot's orientation stays, and explains the image better than the
     * fit of the same list without turns (until this change a shot's list with turns was refused by name) */
    {
        char ex[1024], flat[1024], sl[1024], fl[1024], bimg[1024], img2[1024], j1[1024], j0[1024];
        snprintf(ex, sizeof ex, "%s/blocks.expt", dir);
        snprintf(flat, sizeof flat, "%s/flat.expt", dir);
        snprintf(sl, sizeof sl, "%s/blocks.jsonl", dir);
        snprintf(fl, sizeof fl, "%s/flat.jsonl", dir);
        snprintf(bimg, sizeof bimg, "%s/shot-{id}.bin", dir);
        snprintf(img2, sizeof img2, "%s/blocks2.bin", dir);
        snprintf(j1, sizeof j1, "%s/ens-blocks.json", dir);
        snprintf(j0, sizeof j0, "%s/ens-flat.json", dir);
        write_text(sl, "{\"id\": \"b1\", \"expt\": \"%s\"}\n", ex);
        write_text(fl, "{\"id\": \"b1\", \"expt\": \"%s\"}\n", flat);
#define SHOTBASE "-cell 70 80 90 75 85 95 -default_F 100 -N 8 -oversample 1"
        snprintf(cmd, sizeof cmd, "%s simulate " BLK " -phi 30 -exptfile %s 2>&1", bin, flat);
        const int rc0 = run(cmd);
        snprintf(cmd, sizeof cmd, "%s batch " SHOTBASE " -shots %s -floatfile %s 2>&1", bin, sl, bimg);
        const int rc1 = run(cmd);
        snprintf(bimg, sizeof bimg, "%s/shot-b1.bin", dir);
        const double dmax = float_diff(bimg, img2, 96 * 96);
        nbgi_test_check(rc0 == 0 && rc1 == 0 && dmax == 0, "cligrad-46-blocks-batch", "batch renders a shot's list "
                        "with turns as -expt does: largest difference %.3g of the maximum (exits %d, %d)", dmax, rc0,
                        rc1);
        snprintf(bimg, sizeof bimg, "%s/shot-{id}.bin", dir);
        snprintf(cmd, sizeof cmd, "%s ensemble " SHOTBASE " -shots %s -observed %s -global Na -local orientation "
                                  "-cycles 1 -json %s 2>&1", bin, sl, bimg, j1);
        const int rc2 = run(cmd);
        snprintf(cmd, sizeof cmd, "%s ensemble " SHOTBASE " -shots %s -observed %s -global Na -local orientation "
                                  "-cycles 1 -json %s 2>&1", bin, fl, bimg, j0);
        const int rc3 = run(cmd);
#undef SHOTBASE
        json_t *d1 = rc2 == 0 ? load_json(j1, "cligrad-47-blocks-ensemble") : NULL;
        json_t *d0 = rc3 == 0 ? load_json(j0, "cligrad-47-blocks-ensemble") : NULL;
        const json_t *o1 = json_object_get(json_object_get(d1, "locals"), "b1");
        double moved = json_array_size(o1) == 3 ? 0 : INFINITY;
        for (size_t k = 0; k < json_array_size(o1); ++k) {
            moved = fmax(moved, fabs(json_number_value(json_array_get(o1, k))));
        }
        const double s1 = json_number_value(json_object_get(d1, "start_loss"));
        const double l0 = json_number_value(json_object_get(d0, "loss"));
        nbgi_test_check(rc2 == 0 && rc3 == 0 && moved < 1e-6 && s1 < l0 - 100, "cligrad-47-blocks-ensemble",
                        "ensemble on a shot's list with turns: its orientation stays at the truth (largest offset "
                        "%.2g deg), its start loss %.6g below the fitted loss %.6g of the list without turns (exits "
                        "%d, %d)", moved, s1, l0, rc2, rc3);
        json_decref(d1);
        json_decref(d0);
    }
#undef BLK
    /* the sensor flags win over an experiment list's sensor (DIALS's lists state a thickness of 0 where the file
     * gives none): -expt with -detector_thick and -detector_abs renders as the flags that wrote the list do with
     * them, bit for bit, and says so; until this stop the list's thickness of 0 silently won */
    {
        char sx[1024], a[1024], b[1024], c2[1024];
        snprintf(sx, sizeof sx, "%s/sensor.expt", dir);
        snprintf(a, sizeof a, "%s/sensor-none.bin", dir);
        snprintf(b, sizeof b, "%s/sensor-flags.bin", dir);
        snprintf(c2, sizeof c2, "%s/sensor-expt.bin", dir);
#define SENSOR "-detector_thick 500 -detector_abs 118 -thicksteps 4"
        snprintf(cmd, sizeof cmd, "%s simulate " XTAL " -floatfile %s -exptfile %s 2>&1", bin, a, sx);
        const int rc0 = run(cmd);
        snprintf(cmd, sizeof cmd, "%s simulate " XTAL " " SENSOR " -floatfile %s 2>&1", bin, b);
        const int rc1 = run(cmd);
        snprintf(cmd, sizeof cmd, "%s simulate -expt %s -default_F 100 -N 5 -oversample 1 " SENSOR " -floatfile %s "
                                  "2>&1", bin, sx, c2);
        const int rc2 = run(cmd);
#undef SENSOR
        const int said = strstr(out, "note: -detector_thick and -detector_abs replace the sensor of -expt") != NULL;
        const double dsame = float_diff(b, c2, 64 * 64), dsensor = float_diff(a, b, 64 * 64);
        nbgi_test_check(rc0 == 0 && rc1 == 0 && rc2 == 0 && said && dsame == 0 && dsensor > 0.1,
                        "cligrad-48-sensor-flags", "-expt with the sensor flags renders as the flags do (largest "
                        "difference %.3g; the sensor itself changes the image by %.3g of its maximum), the note %s "
                        "(exits %d, %d, %d)", dsame, dsensor, said ? "said" : "missing", rc0, rc1, rc2);
        /* cligrad-50: a still's list (its scan of width 0) renders one orientation, as the flags that wrote it do;
         * it had taken nanoBragg's two steps of 0 deg for an oscillation given as 0 (the same image, twice the
         * work) */
        snprintf(cmd, sizeof cmd, "%s simulate -expt %s -default_F 100 -N 5 -oversample 1 -floatfile %s 2>&1", bin, sx,
                 c2);
        const int rc3 = run(cmd);
        const int one = strstr(out, " 1 phi steps from 0 to 0 deg") != NULL;
        const double dstill = float_diff(a, c2, 64 * 64);
        nbgi_test_check(rc3 == 0 && one && dstill == 0, "cligrad-50-still-one-step", "a still's list renders %s, "
                        "the image of the flags that wrote it bit for bit (largest difference %.3g; exit %d)",
                        one ? "one orientation" : "more than one phi step", dstill, rc3);
        /* cligrad-49: every flag the table says an experiment list gives in its place (its help: "with -expt,
         * ignored where the list gives ...", read from the generated manual), given with this list (a still with a
         * crystal): the image is the list's, bit for bit, and a warning names the flag (it had been ignored without
         * a word); a flag without a value here fails, so the walk cannot go stale */
        static const char *const vals[][2] = {
            {"-cell", "60 60 60 90 90 90"}, {"-mat", "MAT"}, {"-misset", "1 2 3"}, {"-misset_seed", "5"},
            {"-lambda", "1.5"}, {"-energy", "9000"}, {"-pixel", "0.2"}, {"-detpixels", "32"}, {"-detpixels_f", "32"},
            {"-detpixels_s", "32"}, {"-detsize", "5"}, {"-detsize_f", "5"}, {"-detsize_s", "5"},
            {"-distance", "120"}, {"-close_distance", "120"}, {"-Xbeam", "2"}, {"-Ybeam", "2"}, {"-Xclose", "2"},
            {"-Yclose", "2"}, {"-ORGX", "20"}, {"-ORGY", "20"}, {"-pix0_vector", "0.1 0.01 0.01"},
            {"-pivot", "sample"}, {"-detector_rotx", "2"}, {"-detector_roty", "2"}, {"-detector_rotz", "2"},
            {"-detector_tau", "1 1 1"}, {"-twotheta", "5"}, {"-phi", "10"}, {"-osc", "1"},
            {"-spindle_tilt", "1 1"}, {"-layout", "cspad"}};
        char mat[1024], img[1024];
        snprintf(mat, sizeof mat, "%s/A.mat", dir);
        snprintf(img, sizeof img, "%s/listed.bin", dir);
        write_text(mat, "0.0125070311 -0.0065857094 -0.0013826022\n0.0081221610 0.0118987992 -0.0053137258\n"
                        "0.0075985147 0.0037240506 0.0107268970\n");
        snprintf(cmd, sizeof cmd, "%s --flags-markdown 2>&1", bin);
        run(cmd);
        char *manual = strdup(out);
        int walked = 0, good = 0;
        char bad[512] = "";
        for (const char *q = manual; q != NULL && (q = strstr(q, "\n- `-")) != NULL; ++q) {
            const char *eol = strchr(q + 1, '\n');
            const char *hit = strstr(q, "with -expt, ignored where the list gives");
            if (hit == NULL || (eol != NULL && hit > eol)) {
                continue;
            }
            char name[64];
            if (sscanf(q + 4, "%63[^ `]", name) != 1) {
                continue;
            }
            ++walked;
            const char *v = NULL;
            for (size_t k = 0; k < sizeof vals / sizeof vals[0]; ++k) {
                if (strcmp(vals[k][0], name) == 0) {
                    v = strcmp(vals[k][1], "MAT") == 0 ? mat : vals[k][1];
                }
            }
            int ok = 0;
            if (v != NULL) {
                remove(img);
                snprintf(cmd, sizeof cmd, "%s simulate -expt %s -default_F 100 -N 5 -oversample 1 %s %s -floatfile %s "
                                          "2>&1", bin, sx, name, v, img);
                char want[96];
                snprintf(want, sizeof want, "warning: %s ignored: -expt", name);
                ok = run(cmd) == 0 && strstr(out, want) != NULL && float_diff(a, img, 64 * 64) == 0;
            }
            good += ok;
            if (!ok && strlen(bad) + strlen(name) + 3 < sizeof bad) {
                strcat(strcat(bad, " "), name);
            }
        }
        free(manual);
        nbgi_test_check(walked == (int)(sizeof vals / sizeof vals[0]) && good == walked, "cligrad-49-list-flags",
                        "%d flags an experiment list gives in their place (%d with a value here): %d ignored with a "
                        "warning naming them, the list's image bit for bit%s%s", walked,
                        (int)(sizeof vals / sizeof vals[0]), good, bad[0] ? "; not:" : "", bad);
    }
    /* gradcheck checks exactly the parameters listed: one group's one motion component and distance are two
     * checks, on a CSPAD with group 3 moved */
    write_text(mot, "3 0.05 -0.03 0.02 0.1 -0.05 0.2\n");
    snprintf(cmd, sizeof cmd, "%s gradcheck -layout cspad -cell 70 80 90 90 90 90 -misset 10 20 30 -default_F 100 "
                              "-N 5 -lambda 1.3 -distance 100 -oversample 1 -motions %s -params g3.shift_x,distance "
                              "2>&1", bin, mot);
    rc = run(cmd);
    int nchecks = 0;
    for (const char *p = out; (p = strstr(p, "\n")) != NULL; ++p) {
        nchecks += strncmp(p + 1, "PASS ", 5) == 0 || strncmp(p + 1, "FAIL ", 5) == 0 || strncmp(p + 1, "ZERO ", 5) == 0;
    }
    nbgi_test_check(rc == 0 && nchecks == 2 && strstr(out, "PASS g3.shift_x adjoint=") != NULL &&
                        strstr(out, "PASS distance adjoint=") != NULL && strstr(out, "\n2 passed, 0 failed\n") != NULL,
                    "cligrad-27-motions-gradcheck", "gradcheck -params g3.shift_x,distance on a CSPAD: exactly the two "
                    "checks listed (%d; exit %d)", nchecks, rc);
    /* a group of the table as -params */
    snprintf(cmd, sizeof cmd, "%s grad " XTAL " -params background 2>&1", bin);
    rc = run(cmd);
    nbgi_test_check(rc == 0 && strstr(out, "dL/dbg ") != NULL && strstr(out, "dL/dbg_fast ") != NULL &&
                        strstr(out, "dL/dbg_slow ") != NULL && strstr(out, "dL/da ") == NULL,
                    "cligrad-28-group", "grad -params background gives dL/dbg, dL/dbg_fast, dL/dbg_slow (exit %d)",
                    rc);
    /* in the order given */
    snprintf(cmd, sizeof cmd, "%s grad " XTAL " -params distance,a 2>&1", bin);
    rc = run(cmd);
    const char *pd = strstr(out, "dL/ddistance "), *pa = strstr(out, "dL/da ");
    nbgi_test_check(rc == 0 && pd != NULL && pa != NULL && pd < pa, "cligrad-29-order",
                    "grad prints the parameters in the order given (exit %d)", rc);
    /* one directional check of every structure factor, and dL/dF as a whole from grad */
    snprintf(cmd, sizeof cmd, "%s gradcheck " XTAL " -params F 2>&1", bin);
    rc = run(cmd);
    nbgi_test_check(rc == 0 && strstr(out, "PASS F adjoint=") != NULL && strstr(out, "\n1 passed, 0 failed\n") != NULL,
                    "cligrad-30-F", "gradcheck -params F is one check (exit %d)", rc);
    snprintf(cmd, sizeof cmd, "%s grad " XTAL " -params F,a 2>&1", bin);
    rc = run(cmd);
    nbgi_test_check(rc == 0 && strstr(out, "dL/dF: 1 entries, norm ") != NULL && strstr(out, "dL/da ") != NULL,
                    "cligrad-31-grad-F", "grad -params F,a prints dL/da and dL/dF as a whole (exit %d)", rc);
    /* cligrad-32: the goodness of fit.  Data with polarization 0.9 over a water background, fitted with the right
     * polarization (exit 0, within the noise) and with none (exit 4, flagged, the standard errors widened) */
#define GOF "-cell 70 80 90 90 90 90 -misset 10 5 3 -default_F 1000 -N 8 -distance 100 -detpixels 128 -pixel 0.8 " \
            "-water 300 -fluence 1e24"
    snprintf(cmd, sizeof cmd, "%s " GOF " -polar 0.9 -noisefile %s/gof.img -seed 3 -nopgm 2>&1", bin, dir);
    rc = run(cmd);
    for (int wrong = 0; rc == 0 && wrong < 2; ++wrong) {
        char cmd2[2048];
        snprintf(cmd2, sizeof cmd2, "%s refine " GOF " -polar %s -observed %s/gof.img -pedestal 40 -params "
                                    "a,b,c,rotx,roty,rotz,scale,bg -loss poisson 2>&1", bin, wrong ? "0" : "0.9", dir);
        const int rf = run(cmd2);
        const int ok = wrong ? rf == 4 && strstr(out, "WARNING: the fitted model does not explain the data") != NULL &&
                                   strstr(out, "exit status 4") != NULL
                             : rf == 0 && strstr(out, "within the noise") != NULL;
        const char *g = strstr(out, "goodness of fit:");
        nbgi_test_check(ok, wrong ? "cligrad-32-gof-wrong" : "cligrad-32-gof-right", "%s polarization: exit %d; %.200s",
                        wrong ? "the wrong" : "the right", rf, g != NULL ? g : out);
    }
    nbgi_test_check(rc == 0, "cligrad-32-gof-data", "rendered the data (exit %d)", rc);
    /* one frame of a rotation series fitted alone: frame 3 of 4 frames of 1 deg from phi 0, as a CBF and as an SMV
     * file, each stating its own start angle (2 deg).  Fitted at the scan's first angle (0) instead, the
     * orientation takes up the 2 deg turn (rotz ends near 5 deg); at the file's own angle it comes back to the
     * truth from a start 0.2 deg off */
#define SCAN "-default_F 100 -N 5 -lambda 1 -distance 100 -detpixels 64 -oversample 1 -fluence 5e30 -phi 0 -osc 1 " \
             "-frames 4"
    snprintf(cmd, sizeof cmd, "%s -cell 70 80 90 75 85 95 -misset 10 5 3 " SCAN " -cbffile %s/fr_#.cbf -intfile "
                              "%s/fr_#.img -floatfile %s/fr_#.bin -scale 1 -nopgm 2>&1", bin, dir, dir, dir);
    rc = run(cmd);
    nbgi_test_check(rc == 0 && strstr(out, "frame 4 of 4: phi 3 to 4 deg") != NULL, "cligrad-24-scan",
                    "rendered a series of 4 frames as CBF, SMV and float files (exit %d)", rc);
    static const char *const kinds[2] = {"cbf", "img"};
    static const char *const names[2] = {"cligrad-25-one-frame-cbf", "cligrad-25-one-frame-smv"};
    for (int k = 0; k < 2; ++k) {
        remove(rjson);
        snprintf(cmd, sizeof cmd, "%s refine -cell 70.4 79.7 90.3 75.2 84.8 95.2 -misset 10.2 4.8 3.1 " SCAN
                                  " -observed %s/fr_3.%s -params cell,orientation -json %s 2>&1",
                 bin, dir, kinds[k], rjson);
        rc = run(cmd);
        json = nbgi_test_read_file(rjson, &size);
        static const char *const rot[3] = {"rotx", "roty", "rotz"}, *const cell[6] = {"a", "b", "c", "alpha",
                                                                                       "beta", "gamma"};
        const double rtrue[3] = {10, 5, 3}, ctrue[6] = {70, 80, 90, 75, 85, 95};
        double drot = 0, dcell = 0;
        for (int i = 0; i < 3; ++i) drot = fmax(drot, fabs(json_value(json, rot[i]) - rtrue[i]));
        for (int i = 0; i < 6; ++i) dcell = fmax(dcell, fabs(json_value(json, cell[i]) - ctrue[i]));
        free(json);
        const int said = strstr(out, "fitting it alone at its own start angle, phi 2 deg") != NULL;
        nbgi_test_check(rc == 0 && said && drot < 0.02 && dcell < 0.05, names[k],
                        "frame 3 alone, at the start angle its header states (%s): largest orientation error %.4g "
                        "deg (start 0.2), cell error %.4g (start 0.4; exit %d)",
                        said ? "said" : "not said", drot, dcell, rc);
    }
    /* raw floats state no angle: the scan's first, and the note says so */
    snprintf(cmd, sizeof cmd, "%s refine -cell 70.4 79.7 90.3 75.2 84.8 95.2 -misset 10.2 4.8 3.1 " SCAN
                              " -observed %s/fr_3.bin -params cell,orientation -maxiter 2 2>&1", bin, dir);
    rc = run(cmd);
    nbgi_test_check(strstr(out, "states no start angle: fitting it alone at the scan's first, phi 0 deg") != NULL,
                    "cligrad-26-one-frame-raw", "a raw float frame: fitted at the scan's first angle, said so "
                    "(exit %d)", rc);
    /* cligrad-33: grad takes the frames as refine does: each CBF frame alone at its own start angle, and the '#'
     * template as the whole scan, whose loss and gradient are the frames' sums */
    {
        double Lsum = 0, gsum = 0, Lt = NAN, gt = NAN;
        int ok = 1;
        for (int fr = 0; fr <= 4; ++fr) {
            char obsname[600];
            if (fr < 4) {
                snprintf(obsname, sizeof obsname, "%s/fr_%d.cbf", dir, fr + 1);
            } else {
                snprintf(obsname, sizeof obsname, "%s/fr_#.cbf", dir);
            }
            snprintf(cmd, sizeof cmd, "%s grad -cell 70.4 79.7 90.3 75.2 84.8 95.2 -misset 10.2 4.8 3.1 " SCAN
                                      " -observed '%s' -params rotz 2>&1", bin, obsname);
            rc = run(cmd);
            char want[64];
            snprintf(want, sizeof want, "own start angle, phi %d deg", fr);
            const char *l = strstr(out, "loss = "), *g = strstr(out, "dL/drotz");
            const double Lv = l != NULL ? strtod(l + 7, NULL) : NAN;
            const double gv = g != NULL && strchr(g, '=') != NULL ? strtod(strchr(g, '=') + 1, NULL) : NAN;
            ok &= rc == 0 && isfinite(Lv) && isfinite(gv) &&
                  (fr < 4 ? strstr(out, want) != NULL : strstr(out, "4 frames of 1 deg from phi 0 deg") != NULL);
            if (fr < 4) {
                Lsum += Lv;
                gsum += gv;
            } else {
                Lt = Lv;
                gt = gv;
            }
        }
        nbgi_test_check(ok && fabs(Lt - Lsum) <= 1e-9 * fabs(Lt) && fabs(gt - gsum) <= 1e-9 * fabs(gt),
                        "cligrad-33-grad-frames", "grad: the four frames alone at their own angles sum to the "
                        "template's scan: loss %.15g vs %.15g, dL/drotz %.15g vs %.15g", Lsum, Lt, gsum, gt);
    }
#undef SCAN
#ifdef NBG_HAVE_FORMATS
    test_setting(bin, dir);
    test_sensor(bin, dir);
#endif
    nbgi_test_rmtree(dir);
    return nbgi_test_summary();
}
