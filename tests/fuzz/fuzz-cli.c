/*
 * fuzz-cli.c -- libFuzzer harness for the command-line front end (src/cli.c) and the simulation behind it.
 *
 * Input: the command line as text, then optionally a NUL byte and the content of a file the command line can
 * name.  The text is split into argv tokens at spaces, tabs, newlines and carriage returns; "nbgrad" is put in
 * front.  The harness then does what `nbgrad simulate` does -- nbgi_cli_parse, a context for the flags' backend,
 * precision and thread count, nbgi_cli_load, nbg_describe, the mask-size check -- and, when the described work is
 * tiny, renders the image with nbg_simulate (and, tinier still, takes the adjoint with nbg_simulate_grad), then
 * frees everything.
 *
 * Files.  The harness never lets the flags reach the real file system: the value after every flag that names a
 * file (-hkl -mat -matrix -sourcefile -mask -img -dump, the outputs, and the gradient subcommands' -observed
 * -json -residual, which `simulate` refuses) is replaced before parsing by one of its in-memory files, chosen by
 * the token's text:
 *     hkl      a small HKL table              mat     a MOSFLM A matrix (a 50 x 60 x 70 A cell)
 *     sources  a two-source file              smv     a 16 x 16 SMV image (for -mask and -img)
 *     data     the bytes after the NUL        anything else: a path that does not exist (the I/O error path)
 * Outputs are never written: -nodump is forced and every output path is cleared before nbgi_cli_load.
 * A random misset without -misset_seed gets seed 1 (the program would use the clock).
 *
 * The program's printing (stdout, stderr) goes to /dev/null while the harness runs it; libFuzzer's own output and
 * the sanitizers' reports are unaffected (they do not go through the stdio stream variables).  With
 * NBG_FUZZ_VERBOSE set (to anything but empty) the printing is kept and the harness says how far each input got:
 *     build/fuzz/fuzz-cli INPUT...      (with NBG_FUZZ_VERBOSE=1 in the environment)
 */
#define _GNU_SOURCE /* memfd_create, before any system header */
#include "cli.h"
#include "fuzz_util.h"
#include "nbgrad.h"

#include <math.h>

/* Work budgets, in pixel-samples (pixels x sources x domains x phi steps x subpixels x layers). */
#define FUZZ_MAX_SIM_WORK 2e5
#define FUZZ_MAX_GRAD_WORK 2e4
#define FUZZ_MAX_TOKENS 256

static FILE *devnull;
static int verbose;
static const char *const missing_path = "/nonexistent/nbg-fuzz/missing";

enum { FX_HKL, FX_MAT, FX_SOURCES, FX_SMV, FX_DATA, FX_N };
static nbgi_fuzz_file fixture[FX_N];
static const char *const fixture_name[FX_N] = {"hkl", "mat", "sources", "smv", "data"};

static void fixture_text(int i, const char *text)
{
    nbgi_fuzz_file_set(&fixture[i], (const uint8_t *)text, strlen(text));
}

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    devnull = fopen("/dev/null", "w");
    if (devnull == NULL) {
        abort();
    }
    const char *v = getenv("NBG_FUZZ_VERBOSE");
    verbose = v != NULL && v[0] != '\0';
    /* OpenMP worker threads (-threads N) sleep at once after a parallel region instead of spinning for 200 ms */
    setenv("KMP_BLOCKTIME", "0", 0);
    setenv("OMP_WAIT_POLICY", "passive", 0);
    for (int i = 0; i < FX_N; ++i) {
        nbgi_fuzz_file_open(&fixture[i], fixture_name[i]);
    }
    fixture_text(FX_HKL, "# h k l F\n0 0 0 100\n1 0 0 50\n0 1 0 30 0\n0 0 1 20 0 1\n-1 -1 -1 10\n2 1 -1 5\n");
    fixture_text(FX_MAT, " 0.0200000 0.0000000 0.0000000\n 0.0000000 0.0166667 0.0000000\n"
                         " 0.0000000 0.0000000 0.0142857\n 1 0 0\n 0 1 0\n 0 0 1\n 50 60 70 90 90 90\n");
    fixture_text(FX_SOURCES, "# X Y Z weight lambda(m)\n-10 0 0 1 1e-10\n-10 0.01 0 1 1.02e-10\n");
    /* a 16 x 16 SMV image whose pixels are 0 on the border and 1 inside (a usable -mask) */
    enum { SIDE = 16 };
    uint8_t smv[512 + 2 * SIDE * SIDE];
    memset(smv, ' ', 512);
    const int hl = snprintf((char *)smv, 512,
                            "{\nHEADER_BYTES=512;\nDIM=2;\nBYTE_ORDER=little_endian;\nTYPE=unsigned_short;\n"
                            "SIZE1=%d;\nSIZE2=%d;\nPIXEL_SIZE=0.1;\nDISTANCE=100;\nWAVELENGTH=1;\n"
                            "BEAM_CENTER_X=0.8;\nBEAM_CENTER_Y=0.8;\nPHI=0;\nOSC_RANGE=0;\n}\f",
                            SIDE, SIDE);
    smv[hl] = ' '; /* snprintf's NUL */
    for (int s = 0; s < SIDE; ++s) {
        for (int f = 0; f < SIDE; ++f) {
            const int inside = s > 0 && s < SIDE - 1 && f > 0 && f < SIDE - 1;
            smv[512 + 2 * (s * SIDE + f)] = (uint8_t)inside; /* little-endian uint16 */
            smv[512 + 2 * (s * SIDE + f) + 1] = 0;
        }
    }
    nbgi_fuzz_file_set(&fixture[FX_SMV], smv, sizeof smv);
    return 0;
}

/* The in-memory file a path token stands for. */
static const char *fixture_path(const char *token)
{
    for (int i = 0; i < FX_N; ++i) {
        if (strcmp(token, fixture_name[i]) == 0) {
            return fixture[i].path;
        }
    }
    return missing_path;
}

static int names_a_file(const char *flag)
{
    static const char *const flags[] = {
        "-hkl",       "-mat",        "-matrix",  "-sourcefile", "-mask",      "-img",     "-dump",
        "-floatfile", "-floatimage", "-intfile", "-intimage",   "-pgmfile",   "-pgmimage", "-noisefile",
        "-noiseimage", "-observed", "-json", "-residual"};
    for (size_t i = 0; i < sizeof flags / sizeof flags[0]; ++i) {
        if (strcmp(flag, flags[i]) == 0) {
            return 1;
        }
    }
    return 0;
}

/* 1 when path is one of the harness's own files (or the missing one). */
static int is_fixture(const char *path)
{
    if (path == NULL || path == missing_path) {
        return 1;
    }
    for (int i = 0; i < FX_N; ++i) {
        if (path == fixture[i].path) {
            return 1;
        }
    }
    return 0;
}

/* Says how far an input got (NBG_FUZZ_VERBOSE). */
static void stage(const char *what, const nbg_ctx *ctx)
{
    if (verbose) {
        fprintf(stderr, "fuzz-cli: %s%s%s\n", what, ctx != NULL ? ": " : "", ctx != NULL ? nbg_errmsg(ctx) : "");
    }
}

/* Runs the command line the way `nbgrad simulate` does, short of writing outputs. */
static void run(int argc, char **argv)
{
    nbgi_cli c;
    nbgi_cli_init(&c);
    nbg_ctx *ctx = NULL;
    float *img = NULL, *dLdI = NULL;
    nbg_param *ids = NULL;
    double *grad = NULL;
    NBG_FUZZ_CHECK(nbg_ctx_create(&ctx, NBG_BACKEND_CPU, NBG_DOUBLE, 1) == NBG_OK, "no CPU context");
    const int parsed = nbgi_cli_parse(ctx, &c, argc, argv, 1);
    nbg_ctx_destroy(ctx);
    ctx = NULL;
    if (!parsed || c.help) {
        stage(parsed ? "help" : "refused by nbgi_cli_parse", NULL);
        goto done;
    }
    /* the paths can only be the harness's files: every value after a file flag was replaced */
    NBG_FUZZ_CHECK(is_fixture(c.hklfile) && is_fixture(c.matfile) && is_fixture(c.sourcefile),
                   "a file path that is not the harness's own reached the loader");
    c.nodump = 1;
    c.dumpfile = missing_path;
    c.floatfile = c.intfile = c.pgmfile = c.noisefile = NULL;
    if (c.e.misset_random && !c.have_misset_seed) {
        c.e.misset_seed = 1;
        c.have_misset_seed = 1;
    }
    if (nbg_ctx_create(&ctx, c.backend, c.precision, c.threads > 0 ? c.threads : 1) != NBG_OK) {
        ctx = NULL;
        stage("no context for the backend", NULL);
        goto done;
    }
    if (!nbgi_cli_load(ctx, &c)) {
        stage("refused by nbgi_cli_load", ctx);
        goto done;
    }
    nbg_report r;
    if (nbg_describe(ctx, &c.e, &r) != NBG_OK) {
        NBG_FUZZ_CHECK(nbg_errmsg(ctx)[0] != '\0', "nbg_describe failed without a message");
        stage("refused by nbg_describe", ctx);
        goto done;
    }
    NBG_FUZZ_CHECK(r.fpixels >= 1 && r.spixels >= 1, "nbg_describe succeeded with an empty detector");
    /* the program refuses a mask that does not cover the detector (the library indexes it per pixel) */
    if (c.mask != NULL && (c.mask_f != r.fpixels || c.mask_s != r.spixels)) {
        stage("the mask does not cover the detector", NULL);
        goto done;
    }
    const size_t npix = (size_t)r.fpixels * (size_t)r.spixels;
    const double work = (double)npix * (r.steps > 0 ? (double)r.steps : 1.0) *
                        (r.thicksteps > 0 ? (double)r.thicksteps : 1.0);
    if (!(work <= FUZZ_MAX_SIM_WORK)) {
        stage("described; too much work to simulate", NULL);
        goto done;
    }
    img = malloc(npix * sizeof *img);
    if (img == NULL) {
        abort();
    }
    if (nbg_simulate(ctx, &c.e, img, npix, &r) != NBG_OK) {
        NBG_FUZZ_CHECK(nbg_errmsg(ctx)[0] != '\0', "nbg_simulate failed without a message");
        stage("refused by nbg_simulate", ctx);
        goto done;
    }
    nbgi_fuzz_touch(img, npix * sizeof *img);
    if (!(work <= FUZZ_MAX_GRAD_WORK)) {
        stage("simulated; too much work for the adjoint", NULL);
        goto done;
    }
    /* the adjoint of L = sum of pixels, for every parameter (and F when the table is small) */
    dLdI = malloc(npix * sizeof *dLdI);
    if (dLdI == NULL) {
        abort();
    }
    for (size_t i = 0; i < npix; ++i) {
        dLdI[i] = 1.0f;
    }
    /* every parameter the documented restrictions of nbg_simulate_grad allow for this experiment */
    const nbg_experiment *e = &c.e;
    int skip[NBG_NPARAMS] = {0};
    if (!(e->mosaic > 0 && r.mosaic_domains > 1)) {
        skip[NBG_P_MOSAIC] = 1;
    }
    if (!e->has_cell) {
        for (int p = NBG_P_A; p <= NBG_P_GAMMA; ++p) skip[p] = 1;
    }
    if (e->misset_random) {
        skip[NBG_P_ROTX] = skip[NBG_P_ROTY] = skip[NBG_P_ROTZ] = 1;
    }
    if (e->sample_x > 0 || e->sample_y > 0 || e->sample_z > 0) {
        skip[NBG_P_NA] = skip[NBG_P_NB] = skip[NBG_P_NC] = 1;
    }
    if (e->flux > 0) {
        skip[NBG_P_FLUENCE] = 1;
    }
    size_t ndF = 1;
    if (c.e.hkl != NULL) {
        const nbg_hkl *t = c.e.hkl;
        ndF = (size_t)(t->h_max - t->h_min + 1) * (size_t)(t->k_max - t->k_min + 1) * (size_t)(t->l_max - t->l_min + 1);
    }
    if (ndF > 4096) {
        ndF = 0; /* the structure factors only when the table is small */
    }
    ids = malloc(sizeof *ids * (NBG_NPARAMS + ndF + 1));
    grad = malloc(sizeof *grad * (NBG_NPARAMS + ndF + 1));
    if (ids == NULL || grad == NULL) {
        abort();
    }
    int nids = 0;
    for (int p = 0; p < NBG_NPARAMS; ++p) {
        if (!skip[p]) {
            ids[nids++] = (nbg_param)p;
        }
    }
    for (size_t i = 0; i < ndF; ++i) {
        ids[nids++] = NBG_P_F(i);
    }
    if (nbg_simulate_grad(ctx, &c.e, dLdI, ids, nids, grad, img, npix, NULL) == NBG_OK) {
        stage("simulated and differentiated", NULL);
    } else {
        stage("simulated; refused by nbg_simulate_grad", ctx);
    }
done:
    free(ids);
    free(grad);
    free(dLdI);
    free(img);
    nbgi_cli_free(&c);
    nbg_ctx_destroy(ctx);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    /* the command line (up to the first NUL) and the data file (after it) */
    const uint8_t *nul = memchr(data, 0, size);
    const size_t textlen = nul != NULL ? (size_t)(nul - data) : size;
    if (nul != NULL) {
        nbgi_fuzz_file_set(&fixture[FX_DATA], nul + 1, size - textlen - 1);
    } else {
        nbgi_fuzz_file_set(&fixture[FX_DATA], NULL, 0);
    }
    char *text = malloc(textlen + 1);
    char **argv = malloc((FUZZ_MAX_TOKENS + 2) * sizeof *argv);
    if (text == NULL || argv == NULL) {
        abort();
    }
    memcpy(text, data, textlen);
    text[textlen] = '\0';
    int argc = 0;
    argv[argc++] = "nbgrad";
    for (char *p = text; *p != '\0';) {
        while (*p == ' ' || *p == '\t' || *p == '\n' || *p == '\r') {
            *p++ = '\0';
        }
        if (*p == '\0') {
            break;
        }
        if (argc == FUZZ_MAX_TOKENS + 1) {
            goto out; /* too long a command line: not interesting */
        }
        argv[argc++] = p;
        while (*p != '\0' && *p != ' ' && *p != '\t' && *p != '\n' && *p != '\r') {
            ++p;
        }
    }
    argv[argc] = NULL;
    /* the value after every flag that names a file becomes one of the harness's files */
    for (int i = 1; i + 1 < argc; ++i) {
        if (names_a_file(argv[i])) {
            argv[i + 1] = (char *)fixture_path(argv[i + 1]);
        }
    }
    FILE *out = stdout, *err = stderr;
    if (!verbose) {
        stdout = devnull;
        stderr = devnull;
    }
    run(argc, argv);
    stdout = out;
    stderr = err;
out:
    free(argv);
    free(text);
    return 0;
}
