/*
 * test-builder.c -- the library's experiment builder (nbg_builder in nbgrad.h, src/build.c): nanoBragg's flags and
 * the files they name into an nbg_experiment through the public API alone.
 *
 *   - a bad flag (unknown, with the closest flag named; a value missing or malformed; a partial -cell) is
 *     NBG_EINVAL with a message naming it; a file that cannot be read or is malformed gives its status (NBG_EIO,
 *     NBG_EFORMAT) with the flag and file named;
 *   - the library prints nothing: stdout and stderr (the file descriptors) stay empty through failing and
 *     succeeding builds, notes and a drawn seed included; the notes are the builder's messages;
 *   - the experiment built renders the image the program writes for the same flags, bit for bit, and so does a
 *     copy of the builder after the original is gone;
 *   - the F cache is neither read nor written unless -dump names it; the mask, the flag table and the context the
 *     flags ask for are there; parse and load are refused out of order.
 *
 * Runs $NBG_BIN (default build/nbgrad) for the program's image, as test-cli does.
 */
#include "clirun.h"

#include <fcntl.h>

#define SMALL "-cell", "70", "80", "90", "75", "85", "95", "-misset", "10", "5", "3", "-N", "5", "-lambda", "1", \
              "-distance", "100", "-detpixels", "64", "-pixel", "0.5", "-oversample", "2"

static nbg_ctx *g_ctx;

/* Builds from the NULL-terminated flags: the status of parse, then of load when parse succeeded; *out (may be
 * NULL) receives the builder, else it is destroyed. */
static int build(const char *const *flags, nbg_builder **out)
{
    int n = 0;
    while (flags[n] != NULL) {
        ++n;
    }
    nbg_builder *b = NULL;
    int rc = nbg_builder_create(&b);
    if (rc == NBG_OK) {
        rc = nbg_builder_parse(g_ctx, b, n, flags);
    }
    if (rc == NBG_OK) {
        rc = nbg_builder_load(g_ctx, b);
    }
    if (out != NULL) {
        *out = b;
    } else {
        nbg_builder_destroy(b);
    }
    return rc;
}

#define FLAGS(...) ((const char *const[]){__VA_ARGS__, NULL})

/* A refusal: the status expected and every word in the message. */
static void refused(const char *id, const char *what, const char *const *flags, int status, const char *const *words)
{
    const int rc = build(flags, NULL);
    const char *msg = nbg_errmsg(g_ctx);
    int all = 1;
    for (int i = 0; words[i] != NULL; ++i) {
        all &= strstr(msg, words[i]) != NULL;
    }
    nbgi_test_check(rc == status && all, id, "%s: status %d (want %d), message \"%s\"", what, rc, status, msg);
}

static int write_text(const char *path, const char *text)
{
    FILE *f = fopen(path, "w");
    if (f == NULL) {
        return 0;
    }
    const int ok = fputs(text, f) >= 0;
    return fclose(f) == 0 && ok;
}

/* The flags' errors, statuses and messages. */
static void test_refusals(const char *dir)
{
    refused("BUILD-unknown", "an unknown flag", FLAGS(SMALL, "-distanse", "100"), NBG_EINVAL,
            FLAGS("unknown flag '-distanse'", "did you mean '-distance'?"));
    refused("BUILD-unknown", "an unknown flag far from any", FLAGS(SMALL, "-zzqqxx"), NBG_EINVAL,
            FLAGS("unknown flag '-zzqqxx'"));
    refused("BUILD-missing-value", "a value missing", FLAGS(SMALL, "-distance"), NBG_EINVAL,
            FLAGS("-distance needs 1 value"));
    refused("BUILD-number", "a malformed number", FLAGS(SMALL, "-distance", "1x"), NBG_EINVAL,
            FLAGS("-distance expects a number, got '1x'"));
    refused("BUILD-choice", "a bad choice", FLAGS(SMALL, "-pivot", "x"), NBG_EINVAL,
            FLAGS("-pivot expects beam or sample, got 'x'"));
    refused("BUILD-cell", "-cell with 5 values", FLAGS("-cell", "70", "80", "90", "90", "90", "-default_F", "1"),
            NBG_EINVAL, FLAGS("-cell needs a b c alpha beta gamma (6 values), got 5"));
    refused("BUILD-cell", "-cell with 1 value", FLAGS("-default_F", "1", "-cell", "70"), NBG_EINVAL,
            FLAGS("-cell", "got 1"));
    refused("BUILD-help", "-h", FLAGS(SMALL, "-h"), NBG_EINVAL, FLAGS("-h asks for the program's help"));
    char missing[1200], bad[1200];
    snprintf(missing, sizeof missing, "%s/missing.hkl", dir);
    snprintf(bad, sizeof bad, "%s/bad.hkl", dir);
    write_text(bad, "1 2 3 4\n1 2 x 4\n");
    refused("BUILD-file", "a missing -hkl", FLAGS(SMALL, "-hkl", missing), NBG_EIO, FLAGS("-hkl: ", "missing.hkl"));
    refused("BUILD-file", "a malformed -hkl", FLAGS(SMALL, "-hkl", bad), NBG_EFORMAT, FLAGS("-hkl: ", "bad.hkl"));
    refused("BUILD-file", "a missing -mask (read while parsing)", FLAGS(SMALL, "-default_F", "1", "-mask", missing),
            NBG_EIO, FLAGS("-mask: ", "missing.hkl"));
    refused("BUILD-motions", "-motions without panels", FLAGS(SMALL, "-default_F", "1", "-motions", bad), NBG_EINVAL,
            FLAGS("-motions moves panels, and this detector has none"));
}

/* Everything the builder does, with the process's stdout and stderr pointed at files: they must stay empty. */
static void test_quiet(const char *dir)
{
    char outp[1200], errp[1200], hkl[1200];
    snprintf(outp, sizeof outp, "%s/stdout.txt", dir);
    snprintf(errp, sizeof errp, "%s/stderr.txt", dir);
    snprintf(hkl, sizeof hkl, "%s/missing.hkl", dir);
    fflush(stdout);
    fflush(stderr);
    const int so = dup(1), se = dup(2);
    const int fo = open(outp, O_WRONLY | O_CREAT | O_TRUNC, 0600), fe = open(errp, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    if (so < 0 || se < 0 || fo < 0 || fe < 0 || dup2(fo, 1) < 0 || dup2(fe, 2) < 0) {
        nbgi_test_check(0, "BUILD-quiet", "could not capture stdout and stderr");
        return;
    }
    nbg_builder *b = NULL;
    const int bad = build(FLAGS(SMALL, "-bogus"), NULL) != NBG_OK && build(FLAGS(SMALL, "-hkl", hkl), NULL) != NBG_OK;
    /* a note (-density), a seed drawn (-misset random): messages, not output */
    const int good = build(FLAGS(SMALL, "-default_F", "1", "-density", "3", "-misset", "random"), &b) == NBG_OK;
    fflush(stdout);
    fflush(stderr);
    dup2(so, 1);
    dup2(se, 2);
    close(so);
    close(se);
    close(fo);
    close(fe);
    size_t no = 1, ne = 1;
    free(nbgi_test_read_file(outp, &no));
    free(nbgi_test_read_file(errp, &ne));
    nbgi_test_check(bad && good && no == 0 && ne == 0, "BUILD-quiet",
                    "failing and succeeding builds print nothing (stdout %zu bytes, stderr %zu bytes)", no, ne);
    int note = 0, seed = 0;
    for (int i = 0; i < nbg_builder_nmessages(b); ++i) {
        nbg_msg_level level;
        const char *t = nbg_builder_message(b, i, &level);
        note |= level == NBG_MSG_NOTE && strcmp(t, "-density is accepted and ignored, as by nanoBragg") == 0;
        seed |= level == NBG_MSG_INFO && strncmp(t, "random misset seed: ", 20) == 0;
    }
    nbgi_test_check(note && seed && nbg_builder_message(b, nbg_builder_nmessages(b), NULL) == NULL, "BUILD-messages",
                    "the note and the seed drawn are the builder's messages (%d of them)", nbg_builder_nmessages(b));
    nbg_builder_destroy(b);
}

/* The image of the built experiment against the program's -floatfile for the same flags; a copy's too. */
static void test_same_image(void)
{
    run_result r;
    if (!new_case(&r) || !put_file(&r, "t.hkl", "0 0 1 50\n1 0 0 80\n0 1 0 60\n1 1 1 40\n2 1 0 70\n1 2 3 90\n")) {
        nbgi_test_check(0, "BUILD-image", "cannot set up the case");
        return;
    }
    char hkl[PATH_MAX + 16], dump[PATH_MAX + 16];
    snprintf(hkl, sizeof hkl, "%s/t.hkl", r.work);
    snprintf(dump, sizeof dump, "%s/F.bin", r.work);
    run_in(&r, FLAGS(SMALL, "-hkl", "t.hkl", "-default_F", "10", "-nodump", "-floatfile", "out.float"));
    size_t size = 0;
    float *want = read_in(&r, "out.float", &size);
    nbg_builder *b = NULL, *c = NULL;
    const int rc = build(FLAGS(SMALL, "-hkl", hkl, "-default_F", "10"), &b);
    nbg_ctx *ctx = NULL;
    nbg_report rep;
    float *got = NULL, *again = NULL;
    if (rc == NBG_OK && nbg_builder_ctx_create(b, &ctx) == NBG_OK &&
        nbg_describe(ctx, nbg_builder_experiment(b), &rep) == NBG_OK) {
        got = calloc(rep.npix, sizeof *got);
        again = calloc(rep.npix, sizeof *again);
    }
    const int ok = got != NULL && again != NULL && want != NULL && size == rep.npix * sizeof(float) &&
                   nbg_simulate(ctx, nbg_builder_experiment(b), got, rep.npix, NULL) == NBG_OK;
    nbgi_test_check(ok && memcmp(got, want, size) == 0, "BUILD-image",
                    "the built experiment renders the program's -floatfile bit for bit (%zu bytes; program exit %d)",
                    size, r.status);
    const int copied = ok && nbg_builder_copy(b, &c) == NBG_OK;
    nbg_builder_destroy(b);
    nbgi_test_check(copied && nbg_simulate(ctx, nbg_builder_experiment(c), again, rep.npix, NULL) == NBG_OK &&
                        memcmp(again, want, size) == 0, "BUILD-copy",
                    "a copy renders the same image after the original is destroyed");
    nbg_builder_destroy(c);
    /* the F cache: not written without -dump, written where -dump names it */
    nbgi_test_check(!exists_in(r.work, "Fdump.bin") && access("Fdump.bin", F_OK) != 0, "BUILD-fdump",
                    "no Fdump.bin written without -dump");
    nbgi_test_check(build(FLAGS(SMALL, "-hkl", hkl, "-dump", dump), NULL) == NBG_OK && exists_in(r.work, "F.bin"),
                    "BUILD-fdump", "the F cache is written where -dump names it");
    free(want);
    free(got);
    free(again);
    nbg_ctx_destroy(ctx);
    result_free(&r);
}

/* The mask, the flag table, the context, the order of the calls. */
static void test_accessors(const char *dir)
{
    char mask[1200];
    snprintf(mask, sizeof mask, "%s/mask.img", dir);
    /* a mask file of the detector's header, every 7th pixel skipped */
    nbg_smv_header h;
    nbg_report rep;
    nbg_builder *b = NULL;
    int f = 0, s = 0;
    const int described = build(FLAGS(SMALL, "-default_F", "1"), &b) == NBG_OK &&
                          nbg_describe(g_ctx, nbg_builder_experiment(b), &rep) == NBG_OK;
    nbg_builder_destroy(b);
    b = NULL;
    if (described) {
        nbg_smv_header_from_report(&rep, &h);
    }
    uint16_t *data = calloc(64 * 64, sizeof *data);
    for (int i = 0; data != NULL && i < 64 * 64; ++i) {
        data[i] = i % 7 != 0;
    }
    const int wrote = described && data != NULL && nbg_write_smv(g_ctx, mask, &h, data) == NBG_OK;
    const int rc = wrote ? build(FLAGS(SMALL, "-default_F", "1", "-mask", mask), &b) : -1;
    const uint8_t *m = nbg_builder_mask(b, &f, &s);
    nbgi_test_check(rc == NBG_OK && m != NULL && f == 64 && s == 64 && m[0] == 0 && m[1] == 1 &&
                        nbg_builder_experiment(b)->mask == m, "BUILD-mask",
                    "-mask is the experiment's mask (%d x %d; status %d: %s)", f, s, rc,
                    rc != NBG_OK ? nbg_errmsg(g_ctx) : "");
    nbg_builder_destroy(b);
    free(data);

    int n = 0, cell = 0, distance = 0;
    const char *names, *arg, *help;
    for (; nbg_flag_info(n, &names, &arg, &help) == NBG_OK; ++n) {
        cell |= strcmp(names, "-cell") == 0 && arg != NULL && strcmp(arg, "a b c alpha beta gamma") == 0;
        distance |= strcmp(names, "-distance") == 0 && help != NULL;
    }
    nbgi_test_check(n > 100 && cell && distance && nbg_flag_info(-1, NULL, NULL, NULL) == NBG_EINVAL, "BUILD-flags",
                    "nbg_flag_info lists the flag table (%d entries)", n);

    nbg_ctx *ctx = NULL;
    nbg_limits l = {0, 0};
    const int made = build(FLAGS(SMALL, "-default_F", "1", "-threads", "2", "-max_memory", "2"), &b) == NBG_OK &&
                     nbg_builder_ctx_create(b, &ctx) == NBG_OK && nbg_ctx_limits(ctx, &l) == NBG_OK;
    nbgi_test_check(made && nbg_ctx_backend(ctx) == NBG_BACKEND_CPU && l.max_bytes == 2.0 * 1073741824.0,
                    "BUILD-ctx", "the context has the flags' backend and limits (max_bytes %g)", l.max_bytes);
    nbgi_test_check(nbg_builder_frames(b) == 1, "BUILD-frames", "one frame without -frames");
    nbg_ctx_destroy(ctx);
    const char *one[] = {"-default_F", "1"};
    nbgi_test_check(nbg_builder_parse(g_ctx, b, 2, one) == NBG_EINVAL && strstr(nbg_errmsg(g_ctx), "already") &&
                        nbg_builder_load(g_ctx, b) == NBG_EINVAL, "BUILD-order",
                    "a second parse or load is refused (\"%s\")", nbg_errmsg(g_ctx));
    nbg_builder_destroy(b);
    nbg_builder_create(&b);
    nbgi_test_check(nbg_builder_load(g_ctx, b) == NBG_EINVAL && strstr(nbg_errmsg(g_ctx), "no flags parsed"),
                    "BUILD-order", "load before parse is refused");
    nbg_builder_destroy(b);
}

int main(void)
{
    if (!clirun_setup("nbg-test-builder-")) {
        return nbgi_test_summary();
    }
    if (nbg_ctx_create(&g_ctx, NBG_BACKEND_CPU, NBG_DOUBLE, 2) != NBG_OK) {
        nbgi_test_check(0, "BUILD-setup", "no context");
        return nbgi_test_summary();
    }
    test_refusals(g_root);
    test_quiet(g_root);
    test_same_image();
    test_accessors(g_root);
    nbg_ctx_destroy(g_ctx);
    nbgi_test_rmtree(g_root);
    return nbgi_test_summary();
}
