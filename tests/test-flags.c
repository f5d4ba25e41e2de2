/*
 * test-flags.c -- every flag the program accepts is documented, and the documentation cannot go stale.
 *
 * The flag tables (src/cli.c, and src/main.c for the gradient subcommands) drive the parser, the help and the
 * manual's list of flags (docs/flags.md).  The list of flags comes from the program itself (the hidden option
 * `nbgrad --flags-list`: every name, aliases included, and the subcommands of a subcommand's own flag):
 *
 *   - the list is plausible (over 150 names, each a flag, none twice);
 *   - every flag is accepted by the parser (never "unknown flag");
 *   - every flag appears, as a whole word, in `nbgrad -h` and `nbgrad simulate -h`; a subcommand's own flag in the
 *     -h of each subcommand that takes it (grad, gradcheck, refine, ensemble, batch, shots);
 *   - docs/flags.md's generated section (from "<!-- BEGIN FLAGS" to "<!-- END FLAGS -->") is exactly the output of
 *     `nbgrad --flags-markdown`, and names every flag; docs/parameters.md's (from "<!-- BEGIN PARAMS" to
 *     "<!-- END PARAMS -->") is exactly `nbgrad --params-markdown`'s, a row for every parameter;
 *   - every parameter of the table (nbgrad_params.def, through nbg_param_info_get) has its line, name first, in
 *     `nbgrad -h`'s parameter help (its alias there too), and the flags its row names (nbg_param_info.flag) are
 *     flags of the program;
 *   - README.md links every markdown file of docs/, and every relative link of README.md and of those files names a
 *     file that exists (and, for "file.md#anchor" or "#anchor", a heading of that markdown file).
 *
 * Runs $NBG_BIN (default build/nbgrad) from the repository root, reading README.md and docs/ there ($NBG_README
 * and $NBG_DOCS, the docs directory, override them).
 */
#include "clirun.h"
#include "nbgrad.h"

#include <ctype.h>
#include <dirent.h>
#include <sys/stat.h>

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

/* The docs directory ($NBG_DOCS, default docs) and README.md ($NBG_README, default README.md). */
static const char *docs_dir(void)
{
    const char *d = getenv("NBG_DOCS");
    return d != NULL && d[0] != '\0' ? d : "docs";
}

static const char *readme_path(void)
{
    const char *p = getenv("NBG_README");
    return p != NULL && p[0] != '\0' ? p : "README.md";
}

/* The generated section of docs/<file> from begin to end is exactly out (what the program printed). */
static void doc_section(const char *file, const char *out, const char *begin, const char *end, const char *id,
                        const char *cmd, const char *how)
{
    char path[1024];
    snprintf(path, sizeof path, "%s/%s", docs_dir(), file);
    char *doc = nbgi_test_read_file(path, NULL);
    if (!nbgi_test_check(doc != NULL, id, "%s can be read", path)) {
        return;
    }
    char *b = strstr(doc, begin), *e = b != NULL ? strstr(b, end) : NULL;
    const int once = b != NULL && (b == doc || b[-1] == '\n') && strstr(b + 1, begin) == NULL;
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
            nbgi_test_check(1, id, "%s's section is exactly the output of %s", path, cmd);
        } else {
            nbgi_test_check(0, id, "%s's section is not the output of %s (they differ from line %zu of the section): "
                           "regenerate it with %s", path, cmd, line, how);
        }
    }
    free(doc);
}

static void test_docs_flags(const listed_flag *flags, int n)
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
    nbgi_test_check(r.status == 0 && missing[0] == '\0', "FLAGS-docs",
                   "nbgrad --flags-markdown exits 0 (got %d) and lists every flag%s%s", r.status,
                   missing[0] ? "; missing: " : "", missing);
    doc_section("flags.md", r.out, "<!-- BEGIN FLAGS", "<!-- END FLAGS -->\n", "FLAGS-docs",
                "nbgrad --flags-markdown", "the command above the flag table in src/cli.c");
    result_free(&r);
}

/* docs/parameters.md's list is exactly nbgrad --params-markdown's (the table's), and names every parameter. */
static void test_docs_params(void)
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
    nbgi_test_check(r.status == 0 && missing[0] == '\0', "PARAMS-docs",
                   "nbgrad --params-markdown exits 0 (got %d) and has a row for each of the %d parameters%s%s", r.status,
                   (int)NBG_NPARAMS, missing[0] ? "; missing: " : "", missing);
    doc_section("parameters.md", r.out, "<!-- BEGIN PARAMS", "<!-- END PARAMS -->\n", "PARAMS-docs",
                "nbgrad --params-markdown", "the command beside --params-markdown in src/main.c");
    result_free(&r);
}

/* GitHub's anchor of a heading's text h (n characters): lower case, every character but letters, digits, spaces,
 * '-' and '_' dropped, each space a '-'. */
static void heading_slug(const char *h, size_t n, char *slug, size_t size)
{
    size_t k = 0;
    for (size_t i = 0; i < n && k + 1 < size; ++i) {
        const unsigned char c = (unsigned char)h[i];
        if (isalnum(c) || c == '-' || c == '_' || c >= 0x80) {
            slug[k++] = (char)tolower(c);
        } else if (c == ' ') {
            slug[k++] = '-';
        }
    }
    slug[k] = '\0';
}

/* Whether markdown text has a heading (outside fenced code) whose anchor is anchor; a repeated heading's anchors
 * get -1, -2 ... as on GitHub. */
static int has_anchor(const char *text, const char *anchor)
{
    static char seen[256][128];
    int nseen = 0, fenced = 0;
    for (const char *line = text; *line != '\0';) {
        const char *nl = strchr(line, '\n');
        const size_t len = nl != NULL ? (size_t)(nl - line) : strlen(line);
        if (strncmp(line, "```", 3) == 0) {
            fenced = !fenced;
        } else if (!fenced && line[0] == '#') {
            size_t hashes = strspn(line, "#");
            if (hashes <= 6 && hashes < len && line[hashes] == ' ') {
                char slug[128], name[140];
                heading_slug(line + hashes + 1, len - hashes - 1, slug, sizeof slug);
                int repeats = 0;
                for (int i = 0; i < nseen; ++i) {
                    repeats += strcmp(seen[i], slug) == 0;
                }
                if (repeats == 0) {
                    snprintf(name, sizeof name, "%s", slug);
                } else {
                    snprintf(name, sizeof name, "%s-%d", slug, repeats);
                }
                if (strcmp(name, anchor) == 0) {
                    return 1;
                }
                if (nseen < 256) {
                    snprintf(seen[nseen++], sizeof seen[0], "%s", slug);
                }
            }
        }
        line += len + (nl != NULL);
    }
    return 0;
}

/* Whether the link target (relative to dir, the directory of the file from, whose text is text) names an existing
 * file, and for "file.md#anchor" or "#anchor" a heading of that file. */
static int link_ok(const char *dir, const char *text, const char *target)
{
    char path[1024], anchor[256] = "";
    const char *hash = strchr(target, '#');
    const size_t plen = hash != NULL ? (size_t)(hash - target) : strlen(target);
    if (hash != NULL) {
        snprintf(anchor, sizeof anchor, "%s", hash + 1);
    }
    if (plen == 0) {
        return anchor[0] != '\0' && has_anchor(text, anchor);
    }
    struct stat st;
    if (plen >= 512 || snprintf(path, sizeof path, "%s/%.*s", dir, (int)plen, target) >= (int)sizeof path ||
        stat(path, &st) != 0) {
        return 0;
    }
    if (anchor[0] == '\0' || plen < 3 || strncmp(target + plen - 3, ".md", 3) != 0) {
        return 1;
    }
    char *doc = nbgi_test_read_file(path, NULL);
    const int ok = doc != NULL && has_anchor(doc, anchor);
    free(doc);
    return ok;
}

/* Every relative markdown link ("](target)") of the file at path, outside code (fenced blocks, indented lines,
 * `spans`), names an existing file (and heading); *nlinks gets the number of relative links.  Returns the text,
 * or NULL when it cannot be read. */
static char *check_links(const char *path, int *nlinks)
{
    char *text = nbgi_test_read_file(path, NULL);
    *nlinks = 0;
    if (!nbgi_test_check(text != NULL, "DOCS-links", "%s can be read", path)) {
        return NULL;
    }
    char dir[1024];
    snprintf(dir, sizeof dir, "%s", path);
    char *slash = strrchr(dir, '/');
    if (slash != NULL) {
        *slash = '\0';
    } else {
        snprintf(dir, sizeof dir, ".");
    }
    char broken[4096] = "";
    int fenced = 0, code = 0;
    for (const char *line = text; *line != '\0';) {
        const char *nl = strchr(line, '\n');
        const size_t len = nl != NULL ? (size_t)(nl - line) : strlen(line);
        if (strncmp(line, "```", 3) == 0) {
            fenced = !fenced;
        } else if (len == 0) {
            code = 0; /* a code span ends with its paragraph */
        } else if (!fenced && strncmp(line, "    ", 4) != 0 && line[0] != '\t') {
            for (size_t i = 0; i < len; ++i) {
                if (line[i] == '`') {
                    code = !code;
                    while (i + 1 < len && line[i + 1] == '`') {
                        ++i;
                    }
                } else if (!code && line[i] == ']' && i + 1 < len && line[i + 1] == '(') {
                    const char *t = line + i + 2, *close = memchr(t, ')', len - (size_t)(t - line));
                    if (close == NULL) {
                        continue;
                    }
                    char target[512];
                    snprintf(target, sizeof target, "%.*s", (int)(close - t), t);
                    if (strstr(target, "://") != NULL || strncmp(target, "mailto:", 7) == 0) {
                        continue;
                    }
                    ++*nlinks;
                    if (!link_ok(dir, text, target)) {
                        note_missing(broken, sizeof broken, target);
                    }
                }
            }
        }
        line += len + (nl != NULL);
    }
    nbgi_test_check(broken[0] == '\0', "DOCS-links", "%s: its %d relative links name existing files and headings%s%s",
                    path, *nlinks, broken[0] ? "; broken: " : "", broken);
    return text;
}

static int is_markdown(const struct dirent *de)
{
    const size_t n = strlen(de->d_name);
    return n >= 4 && de->d_name[0] != '.' && strcmp(de->d_name + n - 3, ".md") == 0;
}

/* README.md links every markdown file of the docs directory; the links of README.md and of those files resolve. */
static void test_doc_links(void)
{
    int nreadme = 0;
    char *readme = check_links(readme_path(), &nreadme);
    const char *dir = docs_dir();
    struct dirent **list = NULL;
    const int ndocs = scandir(dir, &list, is_markdown, alphasort);
    if (!nbgi_test_check(ndocs >= 0, "DOCS-links", "the docs directory %s can be listed", dir)) {
        free(readme);
        return;
    }
    char unlinked[4096] = "";
    for (int k = 0; k < ndocs; ++k) {
        const struct dirent *de = list[k];
        char path[1024], link[300], anchored[300];
        snprintf(path, sizeof path, "%s/%s", dir, de->d_name);
        int nlinks = 0;
        free(check_links(path, &nlinks));
        snprintf(link, sizeof link, "](docs/%s)", de->d_name);
        snprintf(anchored, sizeof anchored, "](docs/%s#", de->d_name);
        if (readme == NULL || (strstr(readme, link) == NULL && strstr(readme, anchored) == NULL)) {
            note_missing(unlinked, sizeof unlinked, de->d_name);
        }
        free(list[k]);
    }
    free(list);
    nbgi_test_check(readme != NULL && ndocs > 0 && nreadme >= ndocs && unlinked[0] == '\0', "DOCS-links",
                    "%s links each of the %d markdown files of %s%s%s", readme_path(), ndocs, dir,
                    unlinked[0] ? "; not linked: " : "", unlinked);
    free(readme);
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
        test_docs_flags(flags, n);
        test_docs_params();
        test_params(flags, n);
    }
    test_doc_links();
    nbgi_test_rmtree(g_root);
    return nbgi_test_summary();
}
