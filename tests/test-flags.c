/*
 * test-flags.c -- every flag the program accepts is documented, and the documentation cannot go stale.
 *
 * The flag tables (src/cli.c, and src/main.c for the gradient subcommands) drive the parser, the help and the
 * README's "All flags" section.  The list of flags comes from the program itself (the hidden option
 * `nbgrad --flags-list`: every name, aliases included, and the subcommands of a subcommand's own flag):
 *
 *   - the list is plausible (over 150 names, each a flag, none twice);
 *   - every flag is accepted by the parser (never "unknown flag");
 *   - every flag appears, as a whole word, in `nbgrad -h` and `nbgrad simulate -h`; a subcommand's own flag in the
 *     -h of each subcommand that takes it (grad, gradcheck, refine, ensemble, batch, shots);
 *   - README.md's generated section (from "<!-- BEGIN FLAGS" to "<!-- END FLAGS -->") is exactly the output of
 *     `nbgrad --flags-markdown`, and names every flag;
 *   - every parameter of the table (nbgrad_params.def, through nbg_param_info_get) has its line, name first, in
 *     `nbgrad -h`'s parameter help (its alias there too), and the flags its row names (nbg_param_info.flag) are
 *     flags of the program.
 *
 * Runs $NBG_BIN (default build/nbgrad) from the repository root, reading README.md there ($NBG_README overrides).
 */
#include "clirun.h"
#include "nbgrad.h"

#include <ctype.h>

#define ARGS(...) ((const char *const[]){__VA_ARGS__, NULL})

typedef struct {
    char name[64];
    char scope[128]; /* "" for the common flags; "grad, gradcheck, refine" for a subcommand's own */
} listed_flag;

/* Whether w occurs in text as a whole flag: not inside a longer name (-N in -Na, -help in --help). */
static int has_flag_word(const char *text, const char *w)
{
    const size_t n = strlen(w);
    for (const char *p = strstr(text, w); p != NULL; p = strstr(p + 1, w)) {
        const unsigned char before = p == text ? ' ' : (unsigned char)p[-1], after = (unsigned char)p[n];
        if (!isalnum(before) && before != '_' && before != '-' && !isalnum(after) && after != '_' && after != '-') {
            return 1;
        }
    }
    return 0;
}

/* Appends name to a comma-separated list of the missing (at most size bytes). */
static void note_missing(char *list, size_t size, const char *name)
{
    const size_t len = strlen(list);
    snprintf(list + len, size - len, "%s%s", len ? ", " : "", name);
}

static int run_case(run_result *r, const char *const *args)
{
    if (!new_case(r)) {
        return 0;
    }
    run_in(r, args);
    return 1;
}

/* The flags, from the program; returns how many (0 after a FAIL). */
static int read_list(listed_flag *flags, int cap)
{
    run_result r;
    if (!run_case(&r, ARGS("--flags-list"))) {
        return 0;
    }
    int n = 0, bad = 0, dup = 0;
    char badname[256] = "", dupname[256] = "";
    for (char *line = strtok(r.out, "\n"); line != NULL && n < cap; line = strtok(NULL, "\n")) {
        listed_flag *f = &flags[n];
        const size_t len = strcspn(line, " ");
        snprintf(f->name, sizeof f->name, "%.*s", (int)len, line);
        snprintf(f->scope, sizeof f->scope, "%s", line[len] == ' ' ? line + len + 1 : "");
        if (f->name[0] != '-' || len < 2 || len >= sizeof f->name) {
            ++bad;
            snprintf(badname, sizeof badname, "%.200s", line);
        }
        for (int j = 0; j < n; ++j) {
            if (strcmp(flags[j].name, f->name) == 0) {
                ++dup;
                snprintf(dupname, sizeof dupname, "%.63s", f->name);
            }
        }
        ++n;
    }
    nbgi_test_check(r.status == 0 && n > 150, "FLAGS-list", "nbgrad --flags-list exits 0 and lists over 150 flags "
                   "(exit %d, %d flags)", r.status, n);
    nbgi_test_check(bad == 0, "FLAGS-list", "every entry is a flag%s%s", bad ? ", not: " : "", badname);
    nbgi_test_check(dup == 0, "FLAGS-list", "no flag is listed twice%s%s", dup ? ", twice: " : "", dupname);
    result_free(&r);
    return n;
}

/* Every flag is accepted: given values, it fails (or succeeds) for any reason but "unknown flag". */
static void test_accepted(const listed_flag *flags, int n)
{
    char missing[4096] = "";
    int crashed = 0;
    for (int i = 0; i < n; ++i) {
        char cmd[16] = "simulate";
        if (flags[i].scope[0] != '\0') {
            snprintf(cmd, sizeof cmd, "%.*s", (int)strcspn(flags[i].scope, ","), flags[i].scope);
        }
        /* values enough for any flag, then a bad count, so that no run gets to simulate */
        run_result r;
        if (!run_case(&r, ARGS(cmd, flags[i].name, "1", "1", "1", "1", "1", "1", "-detpixels", "0"))) {
            continue;
        }
        char unknown[128];
        snprintf(unknown, sizeof unknown, "unknown flag '%s'", flags[i].name);
        if (strstr(r.err, unknown) != NULL) {
            note_missing(missing, sizeof missing, flags[i].name);
        }
        crashed += r.status < 0 || r.status >= 126;
        result_free(&r);
    }
    nbgi_test_check(missing[0] == '\0', "FLAGS-accepted", "the parser accepts every listed flag%s%s",
                   missing[0] ? "; unknown: " : "", missing);
    nbgi_test_check(crashed == 0, "FLAGS-accepted", "and no run of a flag with arbitrary values crashes (%d did)",
                   crashed);
}

/* Every flag (of the subcommand cmd, when given) in the output of args. */
static void test_help(const listed_flag *flags, int n, const char *const *args, const char *what, const char *cmd)
{
    run_result r;
    if (!run_case(&r, args)) {
        return;
    }
    char missing[4096] = "";
    int count = 0;
    for (int i = 0; i < n; ++i) {
        if (cmd != NULL && (flags[i].scope[0] == '\0' || !has_flag_word(flags[i].scope, cmd))) {
            continue;
        }
        ++count;
        if (!has_flag_word(r.out, flags[i].name)) {
            note_missing(missing, sizeof missing, flags[i].name);
        }
    }
    nbgi_test_check(r.status == 0 && missing[0] == '\0' && count > 0, "FLAGS-help",
                   "%s exits 0 (got %d) and lists all %d flags%s%s", what, r.status, count,
                   missing[0] ? "; missing: " : "", missing);
    result_free(&r);
}

/* README's generated section from begin to end is exactly out (what the program printed). */
static void readme_section(const char *out, const char *begin, const char *end, const char *id, const char *cmd,
                           const char *how)
{
    const char *path = getenv("NBG_README");
    if (path == NULL || path[0] == '\0') {
        path = "README.md";
    }
    char *readme = nbgi_test_read_file(path, NULL);
    if (!nbgi_test_check(readme != NULL, id, "%s can be read", path)) {
        return;
    }
    char *b = strstr(readme, begin), *e = b != NULL ? strstr(b, end) : NULL;
    const int once = b != NULL && (b == readme || b[-1] == '\n') && strstr(b + 1, begin) == NULL;
    nbgi_test_check(once && e != NULL, id, "%s has one generated section (\"%s\" ... \"%.*s\")", path, begin,
                   (int)strlen(end) - 1, end);
    if (once && e != NULL) {
        e += strlen(end);
        const size_t len = (size_t)(e - b);
        const int same = len == strlen(out) && memcmp(b, out, len) == 0;
        size_t at = 0;
        while (at < len && b[at] == out[at]) {
            ++at;
        }
        size_t line = 1;
        for (size_t k = 0; k < at; ++k) {
            line += b[k] == '\n';
        }
        if (same) {
            nbgi_test_check(1, id, "the section is exactly the output of %s", cmd);
        } else {
            nbgi_test_check(0, id, "the section is not the output of %s (they differ from line %zu of the section): "
                           "regenerate it with %s", cmd, line, how);
        }
    }
    free(readme);
}

static void test_readme(const listed_flag *flags, int n)
{
    run_result r;
    if (!run_case(&r, ARGS("--flags-markdown"))) {
        return;
    }
    char missing[4096] = "";
    for (int i = 0; i < n; ++i) {
        if (!has_flag_word(r.out, flags[i].name)) {
            note_missing(missing, sizeof missing, flags[i].name);
        }
    }
    nbgi_test_check(r.status == 0 && missing[0] == '\0', "FLAGS-readme",
                   "nbgrad --flags-markdown exits 0 (got %d) and lists every flag%s%s", r.status,
                   missing[0] ? "; missing: " : "", missing);
    readme_section(r.out, "<!-- BEGIN FLAGS", "<!-- END FLAGS -->\n", "FLAGS-readme", "nbgrad --flags-markdown",
                   "the command above the flag table in src/cli.c");
    result_free(&r);
}

/* README's list of parameters is exactly nbgrad --params-markdown's (the table's), and names every parameter. */
static void test_readme_params(void)
{
    run_result r;
    if (!run_case(&r, ARGS("--params-markdown"))) {
        return;
    }
    char missing[2048] = "";
    for (nbg_param p = 0; p < NBG_NPARAMS; ++p) {
        char cell[64];
        snprintf(cell, sizeof cell, "| `%s`", nbg_param_name(p));
        if (strstr(r.out, cell) == NULL) {
            note_missing(missing, sizeof missing, nbg_param_name(p));
        }
    }
    nbgi_test_check(r.status == 0 && missing[0] == '\0', "PARAMS-readme",
                   "nbgrad --params-markdown exits 0 (got %d) and has a row for each of the %d parameters%s%s", r.status,
                   (int)NBG_NPARAMS, missing[0] ? "; missing: " : "", missing);
    readme_section(r.out, "<!-- BEGIN PARAMS", "<!-- END PARAMS -->\n", "PARAMS-readme", "nbgrad --params-markdown",
                   "nbgrad --params-markdown, pasted between the markers");
    result_free(&r);
}

/* The parameter table against the program: each parameter's line in nbgrad -h's parameter help (from its
 * "parameters (-params" heading to "exit status:"), and each flag its row names among the program's flags. */
static void test_params(const listed_flag *flags, int n)
{
    run_result r;
    if (!run_case(&r, ARGS("-h"))) {
        return;
    }
    const char *from = strstr(r.out, "parameters (-params");
    const char *to = from != NULL ? strstr(from, "\nexit status:") : NULL;
    nbgi_test_check(r.status == 0 && from != NULL && to != NULL, "FLAGS-params",
                    "nbgrad -h exits 0 (got %d) and has the parameter help (\"parameters (-params\" ... \"exit "
                    "status:\")", r.status);
    char *help = from != NULL && to != NULL ? strndup(from, (size_t)(to - from + 1)) : NULL;
    char missing[4096] = "", badflag[4096] = "";
    int count = 0, flagged = 0;
    for (nbg_param p = 0; p < NBG_NPARAMS && help != NULL; ++p) {
        nbg_param_info in;
        if (nbg_param_info_get(p, &in) != NBG_OK) {
            note_missing(missing, sizeof missing, "(no table entry)");
            continue;
        }
        ++count;
        char line[96];
        snprintf(line, sizeof line, "\n  %s ", in.name);
        if (strstr(help, line) == NULL || (in.alias[0] != '\0' && !has_flag_word(help, in.alias))) {
            note_missing(missing, sizeof missing, in.name);
        }
        /* the flag column: comma-separated flags, "" none */
        for (const char *f = in.flag; *f != '\0';) {
            f += strspn(f, ", ");
            const size_t len = strcspn(f, ", ");
            if (len == 0) {
                break;
            }
            int known = 0;
            for (int i = 0; i < n && !known; ++i) {
                known = strlen(flags[i].name) == len && strncmp(flags[i].name, f, len) == 0;
            }
            ++flagged;
            if (!known) {
                char word[96];
                snprintf(word, sizeof word, "%s: %.*s", in.name, (int)len, f);
                note_missing(badflag, sizeof badflag, word);
            }
            f += len;
        }
    }
    nbgi_test_check(help != NULL && count == NBG_NPARAMS && missing[0] == '\0', "FLAGS-params",
                    "every one of the %d parameters of the table has its line in nbgrad -h%s%s", count,
                    missing[0] ? "; missing: " : "", missing);
    nbgi_test_check(help != NULL && flagged > 0 && badflag[0] == '\0', "FLAGS-params",
                    "the %d flags the table's rows name are the program's%s%s", flagged,
                    badflag[0] ? "; unknown: " : "", badflag);
    free(help);
    result_free(&r);
}

int main(void)
{
    if (!clirun_setup("nbg-test-flags-")) {
        return nbgi_test_summary();
    }
    static listed_flag flags[512];
    const int n = read_list(flags, 512);
    if (n > 0) {
        test_accepted(flags, n);
        test_help(flags, n, ARGS("-h"), "nbgrad -h", NULL);
        char common[4096] = "";
        /* nbgrad simulate -h: the common flags */
        run_result r;
        if (run_case(&r, ARGS("simulate", "-h"))) {
            for (int i = 0; i < n; ++i) {
                if (flags[i].scope[0] == '\0' && !has_flag_word(r.out, flags[i].name)) {
                    note_missing(common, sizeof common, flags[i].name);
                }
            }
            nbgi_test_check(r.status == 0 && common[0] == '\0', "FLAGS-help",
                           "nbgrad simulate -h exits 0 (got %d) and lists every common flag%s%s", r.status,
                           common[0] ? "; missing: " : "", common);
            result_free(&r);
        }
        test_help(flags, n, ARGS("grad", "-h"), "nbgrad grad -h (its own flags)", "grad");
        test_help(flags, n, ARGS("gradcheck", "-h"), "nbgrad gradcheck -h (its own flags)", "gradcheck");
#ifndef NBG_NO_REFINE
        test_help(flags, n, ARGS("refine", "-h"), "nbgrad refine -h (its own flags)", "refine");
        test_help(flags, n, ARGS("ensemble", "-h"), "nbgrad ensemble -h (its own flags)", "ensemble");
#endif
        test_help(flags, n, ARGS("batch", "-h"), "nbgrad batch -h (its own flags)", "batch");
#ifdef NBG_HAVE_FORMATS
        test_help(flags, n, ARGS("shots", "-h"), "nbgrad shots -h (its own flags)", "shots");
#endif
        test_readme(flags, n);
        test_readme_params();
        test_params(flags, n);
    }
    nbgi_test_rmtree(g_root);
    return nbgi_test_summary();
}
