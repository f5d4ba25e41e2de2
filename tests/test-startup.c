/*
 * test-startup.c -- what the program loads at start, and the parts it loads later (src/plugin.c):
 *
 *   - the program (NBG_BIN, else build/nbgrad) needs no HDF5, CBFlib, MPI or CUDA library: its ELF NEEDED entries
 *     (readelf -d) name none of them;
 *   - the library reads and writes NXmx and CBF through the formats plug-in (nbg_write_nxmx, nbg_write_cbf and
 *     nbg_read_image round trips), and so does the program (-nxsfile, -cbffile, then -observed of each);
 *   - without the plug-in (this test and the program copied to a folder without it) the library's calls return
 *     NBG_EUNSUP with a message naming nbgrad-formats.so and where it was looked for, never exiting or printing,
 *     and the program exits 1 naming it, while a run that writes no NXmx or CBF needs no plug-in at all;
 *   - under an MPI launcher's environment the program runs nbgrad-mpi, and names it when it is missing.
 *
 * The plug-in checks are skipped in a build without the formats (FORMATS=0) or with them linked in (FORMATS_DL=0:
 * no nbgrad-formats.so next to the program).
 */
#include "testutil.h"

#include <limits.h>
#include <stdint.h>
#include <sys/wait.h>

static char g_bin[PATH_MAX];    /* the program */
static char g_bindir[PATH_MAX]; /* its folder */

/* Runs cmd (sh -c) and returns its exit status, its stdout and stderr together in out (NUL-terminated). */
static int run_sh(const char *cmd, char *out, size_t n)
{
    char full[PATH_MAX * 4];
    snprintf(full, sizeof full, "%s 2>&1", cmd);
    FILE *p = popen(full, "r");
    if (p == NULL) {
        snprintf(out, n, "popen failed");
        return -1;
    }
    size_t k = fread(out, 1, n - 1, p);
    while (k > 0 && out[k - 1] == '\n') {
        --k;
    }
    out[k] = '\0';
    const int st = pclose(p);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

static int copy_file(const char *from, const char *to)
{
    char cmd[PATH_MAX * 4], out[256];
    snprintf(cmd, sizeof cmd, "cp '%s' '%s' && chmod +x '%s'", from, to, to);
    return run_sh(cmd, out, sizeof out) == 0;
}

static int exists(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0;
}

static void make_geometry(nbg_geometry *g)
{
    nbg_geometry_default(g);
    g->fpixels = 8, g->spixels = 6;
    g->pixel_f = 0.1, g->pixel_s = 0.1;
    g->fast[0] = 1, g->fast[1] = 0, g->fast[2] = 0;
    g->slow[0] = 0, g->slow[1] = -1, g->slow[2] = 0;
    g->origin[0] = -0.4, g->origin[1] = 0.3, g->origin[2] = -100;
    g->wavelength = 1.0;
    g->nframes = 1;
}

/* The library's NXmx and CBF calls, with the plug-in (want_ok) or without it. */
static void library_formats(const char *dir, int want_ok, const char *tag)
{
    nbg_ctx *ctx = NULL;
    if (nbg_ctx_create(&ctx, NBG_BACKEND_CPU, NBG_DOUBLE, 1) != NBG_OK) {
        nbgi_test_check(0, tag, "nbg_ctx_create failed");
        return;
    }
    nbg_geometry g;
    make_geometry(&g);
    float img[48];
    int32_t ints[48];
    for (int i = 0; i < 48; ++i) {
        img[i] = (float)(i * 1.5);
        ints[i] = i * 3;
    }
    char nxs[PATH_MAX + 16], cbf[PATH_MAX + 16], id[64];
    snprintf(nxs, sizeof nxs, "%s/a.nxs", dir);
    snprintf(cbf, sizeof cbf, "%s/a.cbf", dir);
    const char *what[2] = {"nxmx", "cbf"};
    for (int k = 0; k < 2; ++k) {
        const char *path = k == 0 ? nxs : cbf;
        int rc = k == 0 ? nbg_write_nxmx(ctx, path, &g, NBG_DATA_FLOAT32, img, 1, NULL)
                        : nbg_write_cbf(ctx, path, &g, 0, ints);
        snprintf(id, sizeof id, "%s-write-%s", tag, what[k]);
        if (want_ok) {
            nbgi_test_check(rc == NBG_OK && exists(path), id, "written through the plug-in (status %d: %s)", rc,
                            rc == NBG_OK ? "" : nbg_errmsg(ctx));
        } else {
            const char *m = nbg_errmsg(ctx);
            nbgi_test_check(rc == NBG_EUNSUP && strstr(m, "nbgrad-formats.so") != NULL &&
                                strstr(m, "looked for") != NULL && !exists(path),
                            id, "NBG_EUNSUP naming the plug-in and where it was looked for (status %d: %s)", rc, m);
        }
        float *back = NULL;
        size_t npix = 0;
        nbg_geometry r;
        int have = 0;
        snprintf(id, sizeof id, "%s-read-%s", tag, what[k]);
        if (want_ok) {
            rc = nbg_read_image(ctx, path, 0, 48, &back, &npix, &r, &have, NULL);
            int same = rc == NBG_OK && npix == 48 && back != NULL;
            for (int i = 0; same && i < 48; ++i) {
                same = back[i] == (k == 0 ? img[i] : (float)ints[i]);
            }
            nbgi_test_check(same && r.fpixels == 8 && r.spixels == 6, id,
                            "read back through the plug-in, the same 48 pixels (status %d%s%s)", rc,
                            rc == NBG_OK ? "" : ": ", rc == NBG_OK ? "" : nbg_errmsg(ctx));
        } else {
            /* a file of the format's signature, so that the reader is the format's */
            FILE *f = fopen(path, "wb");
            if (f != NULL) {
                fputs(k == 0 ? "\x89HDF\r\n\x1a\n" : "###CBF: VERSION 1.5\n", f);
                fclose(f);
            }
            rc = nbg_read_image(ctx, path, 0, 0, &back, &npix, &r, &have, NULL);
            const char *m = nbg_errmsg(ctx);
            nbgi_test_check(rc == NBG_EUNSUP && back == NULL && npix == 0 && strstr(m, "nbgrad-formats.so") != NULL,
                            id, "NBG_EUNSUP naming the plug-in, no image (status %d: %s)", rc, m);
        }
        free(back);
    }
    nbg_ctx_destroy(ctx);
}

/* readelf -d's NEEDED entries of the program name none of the libraries it loads on demand. */
static void needed_entries(void)
{
    char cmd[PATH_MAX + 64], out[16384];
    snprintf(cmd, sizeof cmd, "readelf -d '%s'", g_bin);
    const int rc = run_sh(cmd, out, sizeof out);
    if (rc != 0 || strstr(out, "(NEEDED)") == NULL) {
        nbgi_test_skip("needed-entries", "readelf -d did not run (%d): %.200s", rc, out);
        return;
    }
    const char *banned[] = {"libhdf5", "libcbf", "libmpi", "libopen-rte", "libopen-pal", "libcudart", "libcurl",
                            "libcuda"};
    char found[512] = "";
    int n = 0;
    for (const char *line = out; (line = strstr(line, "(NEEDED)")) != NULL; ++line) {
        const char *b = strchr(line, '['), *e = b != NULL ? strchr(b, ']') : NULL;
        if (e == NULL) {
            break;
        }
        ++n;
        for (size_t i = 0; i < sizeof banned / sizeof banned[0]; ++i) {
            if (strncmp(b + 1, banned[i], strlen(banned[i])) == 0 && strlen(found) + (size_t)(e - b) + 2 < sizeof found) {
                strncat(found, b + 1, (size_t)(e - b - 1));
                strcat(found, " ");
            }
        }
    }
    nbgi_test_check(found[0] == '\0', "needed-entries",
                    "%s's %d NEEDED libraries include no HDF5, CBFlib, MPI, curl or CUDA library%s%s", g_bin, n,
                    found[0] != '\0' ? ": " : "", found);
}

#define TINY "-detpixels 8 -cell 70 80 90 90 90 90 -default_F 100 -N 5"

#ifdef NBG_HAVE_FORMATS
/* The program writes NXmx and CBF and reads each back as -observed. */
static void program_formats(const char *dir)
{
    char cmd[PATH_MAX * 3], out[8192];
    snprintf(cmd, sizeof cmd, "cd '%s' && '%s' " TINY " -nxsfile p.nxs -cbffile p.cbf", dir, g_bin);
    int rc = run_sh(cmd, out, sizeof out);
    char nxs[PATH_MAX + 32], cbf[PATH_MAX + 32];
    snprintf(nxs, sizeof nxs, "%s/p.nxs", dir);
    snprintf(cbf, sizeof cbf, "%s/p.cbf", dir);
    nbgi_test_check(rc == 0 && exists(nxs) && exists(cbf), "program-write", "-nxsfile and -cbffile written (exit %d)",
                    rc);
    const char *files[2] = {"p.nxs", "p.cbf"};
    for (int k = 0; k < 2; ++k) {
        snprintf(cmd, sizeof cmd, "cd '%s' && '%s' grad " TINY " -params a -observed %s", dir, g_bin, files[k]);
        rc = run_sh(cmd, out, sizeof out);
        nbgi_test_check(rc == 0 && strstr(out, "dL/da") != NULL, k == 0 ? "program-read-nxmx" : "program-read-cbf",
                        "nbgrad grad -observed %s reads it (exit %d%s%.300s)", files[k], rc, rc == 0 ? "" : ": ",
                        rc == 0 ? "" : out);
    }
}
#endif

/* The program copied to a folder without the plug-in and nbgrad-mpi. */
static void program_alone(const char *dir, int have_plugin, int have_mpi)
{
    char prog[PATH_MAX + 16], cmd[PATH_MAX * 3], out[8192];
    snprintf(prog, sizeof prog, "%s/nbgrad", dir);
    if (!copy_file(g_bin, prog)) {
        nbgi_test_check(0, "alone-copy", "could not copy %s to %s", g_bin, dir);
        return;
    }
    snprintf(cmd, sizeof cmd, "cd '%s' && ./nbgrad " TINY " -floatfile x.bin", dir);
    int rc = run_sh(cmd, out, sizeof out);
    nbgi_test_check(rc == 0, "alone-float", "alone, a run writing a float image needs no plug-in (exit %d)", rc);
    if (have_plugin) {
        const char *flag[2] = {"-nxsfile", "-cbffile"}, *file[2] = {"y.nxs", "y.cbf"};
        for (int k = 0; k < 2; ++k) {
            snprintf(cmd, sizeof cmd, "cd '%s' && ./nbgrad " TINY " %s %s", dir, flag[k], file[k]);
            rc = run_sh(cmd, out, sizeof out);
            char want[PATH_MAX + 64];
            snprintf(want, sizeof want, "%s/nbgrad-formats.so", dir);
            nbgi_test_check(rc == 1 && strstr(out, "nbgrad-formats.so, which could not be loaded") != NULL &&
                                strstr(out, want) != NULL,
                            k == 0 ? "alone-nxmx" : "alone-cbf",
                            "alone, %s exits 1 naming the missing plug-in and where it looked (exit %d: %.400s)",
                            flag[k], rc, strstr(out, "error") != NULL ? strstr(out, "error") : out);
        }
    } else {
        nbgi_test_skip("alone-nxmx", "no formats plug-in in this build");
    }
    if (have_mpi) {
        /* an MPI launcher's environment without the launcher: nbgrad looks for nbgrad-mpi, which is not there */
        snprintf(cmd, sizeof cmd,
                 "cd '%s' && OMPI_COMM_WORLD_SIZE=1 ./nbgrad batch " TINY " -shots none.jsonl -floatfile o_{id}.bin",
                 dir);
        rc = run_sh(cmd, out, sizeof out);
        nbgi_test_check(rc != 0 && strstr(out, "nbgrad-mpi, which is missing") != NULL, "alone-mpi",
                        "under mpirun's environment, batch names the missing nbgrad-mpi (exit %d: %.300s)", rc, out);
    } else {
        nbgi_test_skip("alone-mpi", "no nbgrad-mpi in this build");
    }
}

int main(int argc, char **argv)
{
    /* the copy of this test without the plug-in next to it: the library's refusals only */
    if (argc == 3 && strcmp(argv[1], "--alone") == 0) {
        library_formats(argv[2], 0, "lib-alone");
        return nbgi_test_summary();
    }
    const char *bin = getenv("NBG_BIN");
    if (bin == NULL || bin[0] == '\0' || realpath(bin, g_bin) == NULL) {
        if (realpath("build/nbgrad", g_bin) == NULL) {
            nbgi_test_check(0, "program", "no program: set NBG_BIN or build build/nbgrad");
            return nbgi_test_summary();
        }
    }
    snprintf(g_bindir, sizeof g_bindir, "%s", g_bin);
    *strrchr(g_bindir, '/') = '\0';
    char plugin[PATH_MAX + 32], mpiprog[PATH_MAX + 16];
    snprintf(plugin, sizeof plugin, "%s/nbgrad-formats.so", g_bindir);
    snprintf(mpiprog, sizeof mpiprog, "%s/nbgrad-mpi", g_bindir);
#ifdef NBG_HAVE_FORMATS
    const int have_plugin = exists(plugin);
#else
    const int have_plugin = 0;
#endif
    const int have_mpi = exists(mpiprog);

    needed_entries();
    char dirbuf[PATH_MAX];
    char *dir = nbgi_test_mkdtemp("nbg-startup.", dirbuf, sizeof dirbuf);
    if (dir == NULL) {
        nbgi_test_check(0, "tmpdir", "no temporary directory");
        return nbgi_test_summary();
    }
    char with[PATH_MAX + 8], alone[PATH_MAX + 8];
    snprintf(with, sizeof with, "%s/with", dir);
    snprintf(alone, sizeof alone, "%s/alone", dir);
    if (mkdir(with, 0700) != 0 || mkdir(alone, 0700) != 0) {
        nbgi_test_check(0, "tmpdir", "cannot make folders in %s", dir);
        nbgi_test_rmtree(dir);
        return nbgi_test_summary();
    }
#ifdef NBG_HAVE_FORMATS
    library_formats(with, 1, "lib");
    program_formats(with);
#else
    nbgi_test_skip("lib-formats", "built without the formats (FORMATS=0)");
#endif
    dir = alone; /* the folder without the plug-in */
    program_alone(dir, have_plugin, have_mpi);

    if (have_plugin) {
        /* this test copied to a folder without the plug-in: its library calls refuse, and it exits normally */
        char self[PATH_MAX], copy[PATH_MAX + 32], cmd[PATH_MAX * 4], out[16384];
        const ssize_t k = readlink("/proc/self/exe", self, sizeof self - 1);
        snprintf(copy, sizeof copy, "%s/test-startup", dir);
        if (k > 0) {
            self[k] = '\0';
        }
        if (k > 0 && copy_file(self, copy)) {
            snprintf(cmd, sizeof cmd, "'%s' --alone '%s'", copy, dir);
            const int rc = run_sh(cmd, out, sizeof out);
            /* its lines, as this program's checks */
            for (char *line = strtok(out, "\n"); line != NULL; line = strtok(NULL, "\n")) {
                if (strncmp(line, "PASS ", 5) == 0 || strncmp(line, "FAIL ", 5) == 0) {
                    nbgi_test_check(line[0] == 'P', "lib-alone", "%s", line + 5);
                }
            }
            nbgi_test_check(rc == 0, "lib-alone-exit", "the copy without the plug-in exited %d", rc);
        } else {
            nbgi_test_check(0, "lib-alone", "could not copy this test to %s", dir);
        }
    } else {
        nbgi_test_skip("lib-alone", "no formats plug-in in this build");
    }
    nbgi_test_rmtree(dirbuf);
    return nbgi_test_summary();
}
