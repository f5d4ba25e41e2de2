/*
 * test-batch.c -- many shots through the program: nbgrad shots and nbgrad batch, alone and under mpirun.
 *
 *   - nbgrad shots: the same seed gives the same list; another seed another; every line is a shot.
 *   - batch: one output per shot and format, each shot's image equal to the single run with the shot's flags
 *     (byte for byte); a rerun skips every shot (resume); a removed output is redone, and only it.
 *   - mpirun -n 1, 2 and 4 (--oversubscribe; as root with Open MPI's consent variables) give the same files, bit
 *     for bit, as the run without MPI (skipped where mpirun or the MPI build is missing, with the reason).
 *   - Refusals: a malformed line names the file and the line, an unknown key names the key, two shots with one id,
 *     an output name without {id}; a shot that fails (its source file is missing) stops the run, under MPI every
 *     rank, with a non-zero exit and the shot named, and the files of the other shots are complete.
 */
#include "clirun.h"

#include <signal.h>

#define BASE "-cell", "70", "80", "90", "90", "90", "90", "-N", "5", "-default_F", "100", "-detpixels", "48", \
             "-pixel", "0.8", "-distance", "100", "-oversample", "1"

static int g_mpi; /* 1 when mpirun runs the program with MPI */

static int file_eq(const char *a, const char *b)
{
    size_t na = 0, nb = 0;
    char *x = nbgi_test_read_file(a, &na), *y = nbgi_test_read_file(b, &nb);
    const int eq = x != NULL && y != NULL && na == nb && na > 0 && memcmp(x, y, na) == 0;
    free(x);
    free(y);
    return eq;
}

/* Whether shots 1 to 6 have the same files, bit for bit, in folders a and b (below r's work folder) for the two
 * extensions ext. */
static int same_shots(const run_result *r, const char *a, const char *b, const char *const ext[2])
{
    int same = 1;
    for (int i = 1; i <= 6; ++i) {
        for (int f = 0; f < 2; ++f) {
            char x[PATH_MAX + 64], y[PATH_MAX + 64];
            snprintf(x, sizeof x, "%s/%s/shot%06d.%s", r->work, a, i, ext[f]);
            snprintf(y, sizeof y, "%s/%s/shot%06d.%s", r->work, b, i, ext[f]);
            same &= file_eq(x, y);
        }
    }
    return same;
}

static void test_shots_and_batch(void)
{
    run_result r;
    if (!new_case(&r)) {
        return;
    }
    const char *gen[] = {"shots", "-n", "6", "-seed", "11", "-cell", "70", "80", "90", "90", "90", "90",
                         "-cell_jitter", "0.5", "-N", "5", "-N_jitter", "10", "-o", "shots.jsonl", NULL};
    run_in(&r, gen);
    const char *gen2[] = {"shots", "-n", "6", "-seed", "11", "-cell", "70", "80", "90", "90", "90", "90",
                          "-cell_jitter", "0.5", "-N", "5", "-N_jitter", "10", "-o", "again.jsonl", NULL};
    run_in(&r, gen2);
    const char *gen3[] = {"shots", "-n", "6", "-seed", "12", "-o", "other.jsonl", NULL};
    run_in(&r, gen3);
    char p1[PATH_MAX + 64], p2[PATH_MAX + 64], p3[PATH_MAX + 64];
    snprintf(p1, sizeof p1, "%s/shots.jsonl", r.work);
    snprintf(p2, sizeof p2, "%s/again.jsonl", r.work);
    snprintf(p3, sizeof p3, "%s/other.jsonl", r.work);
    size_t n1 = 0;
    char *list = nbgi_test_read_file(p1, &n1);
    int lines = 0;
    for (size_t i = 0; list != NULL && i < n1; ++i) lines += list[i] == '\n';
    nbgi_test_check(r.status == 0 && lines == 6 && file_eq(p1, p2) && !file_eq(p1, p3), "BATCH-shots",
                    "nbgrad shots: 6 lines, the same for the same seed, another for another seed");

    /* the batch, without MPI */
    if (mkdir(strcat(strcpy(p2, r.work), "/out"), 0700) != 0) {
        nbgi_test_check(0, "BATCH-run", "cannot make out/");
        free(list);
        return;
    }
    const char *batch[] = {"batch", BASE, "-shots", "shots.jsonl", "-floatfile", "out/{id}.bin", "-noisefile",
                           "out/{id}.img", "-seed", "3", NULL};
    run_in(&r, batch);
    int all = 1;
    for (int i = 1; i <= 6; ++i) {
        char name[64];
        snprintf(name, sizeof name, "out/shot%06d.bin", i);
        all &= exists_in(r.work, name);
        snprintf(name, sizeof name, "out/shot%06d.img", i);
        all &= exists_in(r.work, name);
    }
    nbgi_test_check(r.status == 0 && all && strstr(r.out, "6 shots simulated, 0 skipped") != NULL, "BATCH-run",
                    "6 shots, a float and a noise file each (exit %d: %s)", r.status, first_line(r.err));
    nbgi_test_check(strstr(r.err, "shot shot000006 (6 of 6, rank 0)") != NULL && strstr(r.out, "(6 of 6") == NULL,
                    "BATCH-progress", "each shot's progress on stderr, the totals on stdout");

    /* shot 2 equals the single run with its flags: its line's misset, cell, N, and seed 3 + 1 */
    run_result one;
    if (new_case(&one)) {
        const char *l2 = list != NULL ? strchr(list, '\n') + 1 : NULL;
        double m[3] = {0}, c[3] = {0}, N = 0;
        const int got = l2 != NULL && sscanf(strstr(l2, "\"misset\":["), "\"misset\":[%lf,%lf,%lf", &m[0], &m[1],
                                             &m[2]) == 3 &&
                        sscanf(strstr(l2, "\"cell\":["), "\"cell\":[%lf,%lf,%lf", &c[0], &c[1], &c[2]) == 3 &&
                        sscanf(strstr(l2, "\"N\":"), "\"N\":%lf", &N) == 1;
        char ms[3][40], cs[3][40], ns[40];
        for (int k = 0; k < 3; ++k) {
            snprintf(ms[k], sizeof ms[k], "%.17g", m[k]);
            snprintf(cs[k], sizeof cs[k], "%.17g", c[k]);
        }
        snprintf(ns, sizeof ns, "%.17g", N);
        const char *single[] = {"-cell", cs[0], cs[1], cs[2], "90", "90", "90", "-N", ns, "-default_F", "100",
                                "-detpixels", "48", "-pixel", "0.8", "-distance", "100", "-oversample", "1",
                                "-misset", ms[0], ms[1], ms[2], "-floatfile", "one.bin", "-noisefile", "one.img",
                                "-seed", "4", NULL};
        run_in(&one, single);
        char a[PATH_MAX + 64], b[PATH_MAX + 64], ai[PATH_MAX + 64], bi[PATH_MAX + 64];
        snprintf(a, sizeof a, "%s/out/shot000002.bin", r.work);
        snprintf(b, sizeof b, "%s/one.bin", one.work);
        snprintf(ai, sizeof ai, "%s/out/shot000002.img", r.work);
        snprintf(bi, sizeof bi, "%s/one.img", one.work);
        nbgi_test_check(got && one.status == 0 && file_eq(a, b) && file_eq(ai, bi), "BATCH-shot-equals-single",
                        "shot 2's float and noise files equal the single run with its misset, cell, N and seed");
        result_free(&one);
    }

    /* resume: a rerun skips all; a removed output is redone, and only that shot */
    run_in(&r, batch);
    nbgi_test_check(r.status == 0 && strstr(r.out, "0 shots simulated, 6 skipped") != NULL, "BATCH-resume-skip",
                    "a rerun skips every shot: %s", strstr(r.out, "batch: ") ? first_line(strstr(r.out, "batch: "))
                                                                             : first_line(r.out));
    char victim[PATH_MAX + 64], saved[PATH_MAX + 64];
    snprintf(victim, sizeof victim, "%s/out/shot000004.img", r.work);
    snprintf(saved, sizeof saved, "%s/saved.img", r.dir);
    rename(victim, saved);
    run_in(&r, batch);
    nbgi_test_check(r.status == 0 && strstr(r.out, "1 shots simulated, 5 skipped") != NULL && file_eq(victim, saved),
                    "BATCH-resume-redo", "the shot whose noise file was removed is redone, the same bytes: %s",
                    strstr(r.out, "batch: ") ? first_line(strstr(r.out, "batch: ")) : first_line(r.out));

    /* a killed run's temporary beside an output (NAME.tmpPID.N, PID gone) is removed by the resume; a file that
     * only looks like one, of no output's name, stays */
    {
        long dead = 999999;
        while (dead > 2 && kill((pid_t)dead, 0) == 0) {
            --dead;
        }
        char tmpn[PATH_MAX + 64], other[PATH_MAX + 64];
        snprintf(tmpn, sizeof tmpn, "%s/out/shot000003.img.tmp%ld.0", r.work, dead);
        snprintf(other, sizeof other, "%s/out/notes.txt.tmp%ld.0", r.work, dead);
        FILE *t1 = fopen(tmpn, "w"), *t2 = fopen(other, "w");
        if (t1 != NULL) fclose(t1);
        if (t2 != NULL) fclose(t2);
        run_in(&r, batch);
        nbgi_test_check(t1 != NULL && t2 != NULL && r.status == 0 && access(tmpn, F_OK) != 0 &&
                            access(other, F_OK) == 0 && strstr(r.err, "removed 1 temporary") != NULL,
                        "BATCH-resume-temporaries", "a resume removes the temporary a killed run left "
                        "(shot000003.img.tmp%ld.0) and keeps a file of no output's name (exit %d: %s)", dead, r.status,
                        first_line(r.err));
        remove(other);
    }
    /* -overwrite redoes every shot, the same bytes; -quiet: no progress, the totals still */
    const char *again[] = {"batch", BASE, "-shots", "shots.jsonl", "-floatfile", "out/{id}.bin", "-noisefile",
                           "out/{id}.img", "-seed", "3", "-overwrite", "-quiet", NULL};
    run_in(&r, again);
    nbgi_test_check(r.status == 0 && strstr(r.out, "6 shots simulated, 0 skipped") != NULL && file_eq(victim, saved) &&
                        r.err[0] == '\0',
                    "BATCH-overwrite-quiet", "-overwrite -quiet: every shot redone, the same bytes, nothing on stderr "
                    "(exit %d: %s)", r.status, first_line(r.err));

    /* the record of the configuration (out/nbgrad-batch.json): other flags or another line of a finished shot are
     * refused, and the files kept; -overwrite redoes them; a folder without a record is adopted, and said */
    char recp[PATH_MAX + 64];
    snprintf(recp, sizeof recp, "%s/out/nbgrad-batch.json", r.work);
    size_t rlen = 0;
    char *rec = nbgi_test_read_file(recp, &rlen);
    nbgi_test_check(rec != NULL && strstr(rec, "\"flags\"") != NULL && strstr(rec, "-seed 3") != NULL &&
                        strstr(rec, "{id}") == NULL && strstr(rec, "\"shot000006\"") != NULL &&
                        strstr(rec, "-overwrite") == NULL,
                    "BATCH-record", "out/nbgrad-batch.json records the flags (not the output names, not -overwrite) "
                    "and the 6 shots");
    free(rec);
    const char *seed4[] = {"batch", BASE, "-shots", "shots.jsonl", "-floatfile", "out/{id}.bin", "-noisefile",
                           "out/{id}.img", "-seed", "4", NULL};
    run_in(&r, seed4);
    nbgi_test_check(r.status == 1 && strstr(r.err, "out holds shots made with other flags") != NULL &&
                        strstr(r.err, "then:") != NULL && strstr(r.err, "-seed 4") != NULL && file_eq(victim, saved),
                    "BATCH-record-other-flags", "a rerun with -seed 4 into the folder of -seed 3 is refused, the files "
                    "kept (exit %d: %s)", r.status, first_line(r.err));
    const char *seed4o[] = {"batch", BASE, "-shots", "shots.jsonl", "-floatfile", "out/{id}.bin", "-noisefile",
                            "out/{id}.img", "-seed", "4", "-overwrite", NULL};
    run_in(&r, seed4o);
    const int redone = r.status == 0 && strstr(r.out, "6 shots simulated, 0 skipped") != NULL && !file_eq(victim, saved);
    run_in(&r, seed4);
    nbgi_test_check(redone && r.status == 0 && strstr(r.out, "0 shots simulated, 6 skipped") != NULL,
                    "BATCH-record-overwrite", "-overwrite redoes them with -seed 4, and a rerun with -seed 4 resumes "
                    "(exit %d: %s)", r.status, strstr(r.out, "batch: ") ? first_line(strstr(r.out, "batch: ")) : "");
    /* another line for shot 2 (a seed of its own) */
    char edited[PATH_MAX + 64];
    snprintf(edited, sizeof edited, "%s/edited.jsonl", r.work);
    FILE *ef = fopen(edited, "w");
    const char *l2 = list != NULL ? strchr(list, '\n') + 1 : NULL;
    if (ef != NULL && l2 != NULL) {
        fprintf(ef, "%.*s{\"seed\": 99, %s", (int)(l2 - list), list, l2 + 1);
        fclose(ef);
    }
    const char *edit[] = {"batch", BASE, "-shots", "edited.jsonl", "-floatfile", "out/{id}.bin", "-noisefile",
                          "out/{id}.img", "-seed", "4", NULL};
    run_in(&r, edit);
    nbgi_test_check(r.status == 1 && strstr(r.err, "1 finished shot was made from another line") != NULL &&
                        strstr(r.err, "shot000002, line 2") != NULL,
                    "BATCH-record-line", "a changed line of a finished shot is refused, naming it (exit %d: %s)",
                    r.status, first_line(r.err));
    /* a folder without a record (an older nbgrad's): adopted, said; the next run resumes */
    remove(recp);
    run_in(&r, seed4);
    const int adopted = r.status == 0 && strstr(r.err, "no record of the flags") != NULL &&
                        strstr(r.out, "0 shots simulated, 6 skipped") != NULL;
    run_in(&r, seed4);
    nbgi_test_check(adopted && r.status == 0 && strstr(r.out, "0 shots simulated, 6 skipped") != NULL &&
                        strstr(r.err, "no record") == NULL,
                    "BATCH-record-adopt", "a folder of finished shots without a record: kept and said, then recorded "
                    "(exit %d: %s)", r.status, first_line(r.err));
    /* back to -seed 3 for the comparisons below */
    run_in(&r, again);
    nbgi_test_check(r.status == 0 && file_eq(victim, saved), "BATCH-record-back",
                    "-overwrite with -seed 3 again: the first files, bit for bit (exit %d)", r.status);

    /* MPI: the same files whatever the number of ranks */
    if (!g_mpi) {
        nbgi_test_skip("BATCH-mpi", "mpirun or nbgrad's MPI build is missing");
    }
    for (int k = 1; g_mpi && k <= 4; k *= 2) {
        char dname[64], flt[64], noi[64];
        snprintf(dname, sizeof dname, "/mpi%d", k);
        snprintf(p3, sizeof p3, "%s%s", r.work, dname);
        mkdir(p3, 0700);
        snprintf(flt, sizeof flt, "mpi%d/{id}.bin", k);
        snprintf(noi, sizeof noi, "mpi%d/{id}.img", k);
        const char *mb[] = {"batch", BASE, "-shots", "shots.jsonl", "-floatfile", flt, "-noisefile", noi, "-seed", "3",
                            NULL};
        run_mpi(&r, k, mb);
        static const char *const bin_img[2] = {"bin", "img"};
        const int same = same_shots(&r, "out", dname + 1, bin_img);
        char id[32];
        snprintf(id, sizeof id, "BATCH-mpi-%d", k);
        nbgi_test_check(r.status == 0 && same && strstr(r.out, "6 shots simulated") != NULL, id,
                        "mpirun -n %d: the same 12 files, bit for bit (exit %d: %s)", k, r.status, first_line(r.err));
    }
    /* NXmx and CBF too: bit for bit for any rank count and any time of writing (no HDF5 object times; CBF's date
     * from SOURCE_DATE_EPOCH, the reproducible-builds convention); without MPI two runs a second apart */
    setenv("SOURCE_DATE_EPOCH", "1700000000", 1);
    int ran = 1;
    for (int k = 0; k < 2; ++k) {
        char dname[PATH_MAX + 64], nxs[64], cbf[64];
        snprintf(dname, sizeof dname, "%s/fmt%d", r.work, k);
        mkdir(dname, 0700);
        snprintf(nxs, sizeof nxs, "fmt%d/{id}.nxs", k);
        snprintf(cbf, sizeof cbf, "fmt%d/{id}.cbf", k);
        const char *fb[] = {"batch", BASE, "-shots", "shots.jsonl", "-nxsfile", nxs, "-cbffile", cbf, "-seed", "3",
                            NULL};
        if (k == 1 && g_mpi) {
            run_mpi(&r, 2, fb);
        } else {
            if (k == 1) {
                sleep(1);
            }
            run_in(&r, fb);
        }
        ran &= r.status == 0;
    }
    static const char *const nxs_cbf[2] = {"nxs", "cbf"};
    const int same_fmt = same_shots(&r, "fmt0", "fmt1", nxs_cbf);
    unsetenv("SOURCE_DATE_EPOCH");
    nbgi_test_check(ran && same_fmt, "BATCH-formats-bit-for-bit", "the 6 shots' NXmx and CBF files are the same bytes "
                    "%s", g_mpi ? "for one process and mpirun -n 2" : "for two runs a second apart (no MPI here)");
    free(list);
    result_free(&r);
}

static void test_refusals(void)
{
    run_result r;
    const char *none[] = {NULL};
    struct {
        const char *id, *what, *text, *word1, *word2;
    } cases[] = {
        {"BATCH-bad-json", "a malformed line", "{\"id\": \"a\"}\n{\"id\": \"b\", \"misset\": [1, 2\n", "line 2",
         "shots.jsonl"},
        {"BATCH-bad-key", "an unknown key", "{\"id\": \"a\", \"missett\": [1, 2, 3]}\n", "line 1", "missett"},
        {"BATCH-bad-type", "a value of the wrong type", "{\"id\": \"a\", \"N\": \"five\"}\n", "\"N\"", "line 1"},
        {"BATCH-dup-id", "two shots with one id", "{\"id\": \"a\"}\n{\"id\": \"a\"}\n", "lines 1 and 2", "\"a\""},
        {"BATCH-bad-id", "an id that is not a file name", "{\"id\": \"../x\"}\n", "\"id\"", "line 1"},
        {"BATCH-bad-expt-type", "an experiment list that is not a file name",
         "{\"id\": \"a\"}\n{\"id\": \"b\", \"expt\": 5}\n", "\"expt\"", "line 2"},
        {"BATCH-missing-expt", "a shot's experiment list that does not exist",
         "\n{\"id\": \"b\", \"expt\": \"none.expt\"}\n{\"id\": \"a\"}\n", "line 2", "none.expt"},
        {"BATCH-bad-expt", "a shot's experiment list that is not one", "{\"id\": \"a\", \"expt\": \"shots.jsonl\"}\n",
         "line 1", "shots.jsonl"},
        {"BATCH-bad-spectrum-scale", "a spectrum_scale that is not positive",
         "{\"id\": \"a\", \"spectrum_scale\": 0}\n", "\"spectrum_scale\"", "line 1"},
        {"BATCH-bad-orient", "an orient of two numbers", "{\"id\": \"a\", \"orient\": [1, 2]}\n", "\"orient\"",
         "line 1"},
    };
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; ++k) {
        if (!new_case(&r)) {
            return;
        }
        put_file(&r, "shots.jsonl", cases[k].text);
        const char *args[] = {"batch", BASE, "-shots", "shots.jsonl", "-floatfile", "{id}.bin", NULL};
        const char *words[] = {cases[k].word1, cases[k].word2, NULL};
        const char *inputs[] = {"shots.jsonl", NULL};
        expect_failure(cases[k].id, cases[k].what, &r, args, words, inputs);
        result_free(&r);
    }
    (void)none;
    if (new_case(&r)) {
        put_file(&r, "shots.jsonl", "{\"id\": \"a\"}\n{\"id\": \"b\"}\n");
        const char *args[] = {"batch", BASE, "-shots", "shots.jsonl", "-floatfile", "same.bin", NULL};
        const char *words[] = {"{id}", NULL};
        const char *inputs[] = {"shots.jsonl", NULL};
        expect_failure("BATCH-no-id-in-name", "an output name without {id}", &r, args, words, inputs);
        result_free(&r);
    }
    /* every shot's expanded names against the inputs and each other (issue 29): a shot "s" writing {id}.jsonl over
     * the shot list s.jsonl (with -overwrite), a shot "lyso" writing {id}.hkl over -hkl lyso.hkl, shots "a1" and "1"
     * writing {id}.img and a{id}.img; the inputs stay as they were */
    static const struct {
        const char *id, *what, *list, *extra[4], *words[3];
    } names[] = {
        {"BATCH-name-over-list", "a shot's output over the shot list", "{\"id\": \"s\"}\n{\"id\": \"t\"}\n",
         {"-floatfile", "{id}.jsonl", "-overwrite", NULL}, {"shot s", "-shots", NULL}},
        {"BATCH-name-over-hkl", "a shot's output over -hkl", "{\"id\": \"lyso\"}\n",
         {"-floatfile", "{id}.hkl", "-hkl", "lyso.hkl"}, {"shot lyso", "-hkl", NULL}},
        {"BATCH-name-over-expt", "a shot's output over its own experiment list",
         "{\"id\": \"a\", \"expt\": \"a.expt\"}\n", {"-exptfile", "{id}.expt", NULL}, {"shot a", "\"expt\"", NULL}},
        {"BATCH-name-collision", "two shots' outputs with one name", "{\"id\": \"a1\"}\n{\"id\": \"1\"}\n",
         {"-floatfile", "{id}.img", "-intfile", "a{id}.img"}, {"a1.img", "shot 1", NULL}},
    };
    for (size_t k = 0; k < sizeof names / sizeof names[0]; ++k) {
        if (!new_case(&r)) {
            return;
        }
        const char *list = k == 0 ? "s.jsonl" : "shots.jsonl";
        put_file(&r, list, names[k].list);
        put_file(&r, "lyso.hkl", "1 2 3 100\n");
        const char *args[64] = {"batch", BASE, "-nodump", "-shots", list};
        int n = 0;
        while (args[n] != NULL) {
            ++n;
        }
        for (int j = 0; j < 4 && names[k].extra[j] != NULL; ++j) {
            args[n++] = names[k].extra[j];
        }
        args[n] = NULL;
        const char *inputs[] = {list, "lyso.hkl", NULL};
        size_t before = 0, after = 0;
        char *b0 = read_in(&r, list, &before);
        expect_failure(names[k].id, names[k].what, &r, args, names[k].words, inputs);
        char *b1 = read_in(&r, list, &after);
        size_t h0 = 0;
        char *hk = read_in(&r, "lyso.hkl", &h0);
        nbgi_test_check(b0 != NULL && b1 != NULL && before == after && memcmp(b0, b1, before) == 0 && hk != NULL &&
                            h0 == 10 && memcmp(hk, "1 2 3 100\n", 10) == 0,
                        names[k].id, "%s: the shot list and the HKL file are as they were", names[k].what);
        free(b0);
        free(b1);
        free(hk);
        result_free(&r);
    }
    /* a failing shot stops the run; the other shots' files are complete */
    for (int k = 0; k <= 2; k += 2) {
        if (!new_case(&r) || (k > 0 && !g_mpi)) {
            if (k > 0) {
                nbgi_test_skip("BATCH-fail-mpi", "mpirun or nbgrad's MPI build is missing");
            }
            break;
        }
        put_file(&r, "shots.jsonl",
                 "{\"id\": \"a\"}\n{\"id\": \"b\"}\n{\"id\": \"c\", \"sourcefile\": \"missing.txt\"}\n{\"id\": \"d\"}"
                 "\n{\"id\": \"e\"}\n{\"id\": \"f\"}\n");
        const char *args[] = {"batch", BASE, "-shots", "shots.jsonl", "-floatfile", "{id}.bin", NULL};
        if (k == 0) {
            run_in(&r, args);
        } else {
            run_mpi(&r, 2, args);
        }
        char id[32];
        snprintf(id, sizeof id, "BATCH-fail-%s", k == 0 ? "one" : "mpi");
        const int named = strstr(r.err, "shot c") != NULL && strstr(r.err, "missing.txt") != NULL;
        /* one process: a and b done, c fails, d not started.  Two ranks (rank 0: a, c, e; rank 1: b, d, f): rank 0
         * stops at c, so e is never started; rank 1 learns of it at the ranks' next agreement (every ~0.05 s of
         * work), so its d and f may be done, complete, or not started */
        const int a_ok = exists_in(r.work, "a.bin") && exists_in(r.work, "b.bin");
        const int rest = !exists_in(r.work, "c.bin") && !exists_in(r.work, "e.bin") &&
                         (k > 0 || !exists_in(r.work, "f.bin"));
        char extra[1024];
        const char *allowed[] = {"shots.jsonl", "a.bin", "b.bin", "d.bin", "nbgrad-batch.json",
                                 k > 0 ? "f.bin" : NULL, NULL};
        unexpected_files(r.work, allowed, extra, sizeof extra);
        nbgi_test_check(r.status != 0 && r.status < 128 && named && a_ok && rest && extra[0] == '\0', id,
                        "%s: exit %d, the shot named (%s), earlier shots complete, nothing after (%s)",
                        k == 0 ? "one process" : "mpirun -n 2", r.status, first_line(r.err), extra);
        result_free(&r);
    }
}

int main(void)
{
    if (!clirun_setup("nbg-test-batch-")) {
        return nbgi_test_summary();
    }
    if (!clirun_has_shot_lists()) {
        nbgi_test_rmtree(g_root);
        return nbgi_test_summary();
    }
    /* MPI: mpirun present and the program built with it (its batch refuses mpirun otherwise) */
    g_mpi = access("/usr/bin/mpirun", X_OK) == 0;
    if (g_mpi) {
        run_result probe;
        if (new_case(&probe)) {
            put_file(&probe, "s.jsonl", "{\"id\": \"p\"}\n");
            const char *args[] = {"batch", BASE, "-shots", "s.jsonl", "-floatfile", "{id}.bin", NULL};
            run_mpi(&probe, 1, args);
            g_mpi = probe.status == 0 && exists_in(probe.work, "p.bin");
            if (!g_mpi) {
                printf("note: mpirun -n 1 nbgrad batch did not run (%s%s)\n", first_line(probe.err),
                       first_line(probe.out));
            }
            result_free(&probe);
        }
    }
    test_shots_and_batch();
    test_refusals();
    nbgi_test_rmtree(g_root);
    return nbgi_test_summary();
}
