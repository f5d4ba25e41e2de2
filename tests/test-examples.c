/*
 * test-examples.c -- the examples a user copies are built by make and run here: the refinement example
 * converges with the truth inside its error bars, the sensitivity example writes non-blank maps, the CI
 * gradient check passes, the module example puts every module back within its standard errors.
 */
#include "testutil.h" /* first: it sets _GNU_SOURCE */

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Runs cmd, capturing its output into out (size n); returns the exit status. */
static int run(const char *cmd, char *out, size_t n)
{
    FILE *p = popen(cmd, "r");
    if (p == NULL) {
        return -1;
    }
    size_t len = fread(out, 1, n - 1, p);
    out[len] = '\0';
    const int st = pclose(p);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

int main(void)
{
    static char out[1 << 16];
    int rc = run("build/examples/refine_cell 2>&1", out, sizeof out);
    nbgi_test_check(rc == 0 && strstr(out, "9 of 9 parameters within 3 standard errors") != NULL, "examples-1-refine",
                   "refine_cell converges and recovers the truth within 3 standard errors (exit %d)", rc);

    char dir[512];
    if (nbgi_test_mkdtemp("nbgrad-sens", dir, sizeof dir) == NULL) {
        nbgi_test_check(0, "examples-2-sensitivity", "could not make a temporary folder");
    } else {
        char cmd[1024];
        snprintf(cmd, sizeof cmd, "build/examples/sensitivity_map %s 2>&1", dir);
        rc = run(cmd, out, sizeof out);
        nbgi_test_check(rc == 0, "examples-2-sensitivity", "sensitivity_map ran (exit %d)", rc);
        const char *maps[] = {"a", "gamma", "rotx", "Na", "lambda", "distance", "beam_fast", "det_roty"};
        for (int i = 0; i < 8; ++i) {
            char path[1024];
            snprintf(path, sizeof path, "%s/dI_d%s.pgm", dir, maps[i]);
            size_t size = 0;
            unsigned char *d = nbgi_test_read_file(path, &size);
            int varied = 0;
            if (d != NULL && size > 256 * 256) {
                const unsigned char *px = d + size - 256 * 256;
                for (size_t k = 0; k < 256 * 256; ++k) {
                    varied += px[k] != 127 && px[k] != 128;
                }
            }
            nbgi_test_check(varied > 100, "examples-2-map", "%s holds a map (%d pixels respond)", path, varied);
            free(d);
        }
        nbgi_test_rmtree(dir);
    }

    rc = run("build/examples/ci_gradcheck 2>&1", out, sizeof out);
    nbgi_test_check(rc == 0 && strstr(out, " 0 failed") != NULL, "examples-3-ci-gradcheck",
                   "ci_gradcheck passes on its lysozyme-like experiment (exit %d)", rc);
    rc = run("build/examples/refine_modules 2>&1", out, sizeof out);
    nbgi_test_check(rc == 0 && strstr(out, "converged after") != NULL &&
                       strstr(out, "64 of 64 module shifts within 3 standard errors") != NULL,
                   "examples-modules", "refine_modules fits the 32 Jungfrau modules' shifts and the orientation on "
                   "spot regions, every shift within 3 standard errors (exit %d)", rc);
    return nbgi_test_summary();
}
