/*
 * bench-formats.c -- file sizes and write/read times of nbgrad's image formats, against SMV, on one image.
 *
 *   bench-formats [PIXELS]     (default 4096: a PIXELS x PIXELS detector)
 *
 * The image is a simulated one (triclinic cell, Poisson noise with nanoBragg's ADC offset of 40), so that the
 * compressed formats see realistic data.  Each format is written to a temporary directory (best of 3 writes, after
 * a warm-up) and read back with nbg_read_image (best of 3); the table gives bytes, MB/s of image data and the
 * ratios to SMV.  The formats: SMV (2-byte integers, nanoBragg's), raw float32, NXmx float32 and int32 (HDF5,
 * as nbgrad writes it), full CBF (byte-offset int32).
 */
#define _GNU_SOURCE
#include "nbgrad.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

typedef struct {
    const char *name, *file;
    double bytes, write_s, read_s;
    int ok;
} row;

static long file_size(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0 ? (long)st.st_size : -1;
}

int main(int argc, char **argv)
{
    const int n = argc > 1 ? atoi(argv[1]) : 4096;
    if (n < 16 || n > 16384) {
        fprintf(stderr, "bench-formats: PIXELS must be 16 to 16384\n");
        return 2;
    }
    nbg_ctx *ctx = NULL;
    if (nbg_ctx_create(&ctx, NBG_BACKEND_CPU, NBG_DOUBLE, 0) != NBG_OK) {
        fprintf(stderr, "bench-formats: no context\n");
        return 1;
    }
    nbg_experiment e;
    nbg_experiment_default(&e);
    const double cell[6] = {70, 80, 90, 85, 95, 105};
    e.has_cell = 1;
    memcpy(e.cell, cell, sizeof cell);
    e.misset[0] = 10, e.misset[1] = 5, e.misset[2] = 3;
    e.Na = e.Nb = e.Nc = 8;
    e.lambda = 1.0;
    e.default_F = 100;
    e.fpixels = e.spixels = n;
    e.pixel = 0.075;
    e.distance = 150;
    e.oversample = 1;
    e.shape = NBG_SHAPE_GAUSS;
    const size_t npix = (size_t)n * n;
    float *img = malloc(npix * sizeof *img);
    uint16_t *u16 = malloc(npix * sizeof *u16);
    int32_t *i32 = malloc(npix * sizeof *i32);
    nbg_report r;
    char dir[] = "/tmp/nbg-bench-formats.XXXXXX";
    if (img == NULL || u16 == NULL || i32 == NULL || mkdtemp(dir) == NULL) {
        fprintf(stderr, "bench-formats: out of memory or no temporary directory\n");
        return 1;
    }
    const double t0 = now();
    if (nbg_simulate(ctx, &e, img, npix, &r) != NBG_OK ||
        nbg_noise_image(ctx, img, n, n, NULL, 40, 7, u16, NULL, NULL) != NBG_OK) {
        fprintf(stderr, "bench-formats: %s\n", nbg_errmsg(ctx));
        return 1;
    }
    for (size_t i = 0; i < npix; ++i) i32[i] = u16[i];
    printf("bench-formats: a %dx%d image (simulated in %.2f s), written to %s\n", n, n, now() - t0, dir);
    nbg_geometry g;
    int have_geom = nbg_geometry_from_report(ctx, &e, &r, 1, &g) == NBG_OK;
    g.pedestal = 40;
    g.saturation = 65535;
    nbg_smv_header h;
    nbg_smv_header_from_report(&r, &h);

    row rows[] = {{"SMV uint16", "img.smv", 0, 0, 0, 0},     {"raw float32", "img.bin", 0, 0, 0, 0},
                  {"NXmx float32", "imgf.nxs", 0, 0, 0, 0},  {"NXmx int32", "imgi.nxs", 0, 0, 0, 0},
                  {"CBF int32", "img.cbf", 0, 0, 0, 0}};
    const int nrows = sizeof rows / sizeof rows[0];
    char path[512];
    for (int k = 0; k < nrows; ++k) {
        snprintf(path, sizeof path, "%s/%s", dir, rows[k].file);
        double best = INFINITY;
        int rc = NBG_OK;
        for (int rep = 0; rep < 4 && rc == NBG_OK; ++rep) {
            const double t = now();
            switch (k) {
            case 0: rc = nbg_write_smv(ctx, path, &h, u16); break;
            case 1: rc = nbg_write_float(ctx, path, img, npix); break;
            case 2: rc = have_geom ? nbg_write_nxmx(ctx, path, &g, NBG_DATA_FLOAT32, img, 1, NULL) : NBG_EINVAL; break;
            case 3: rc = have_geom ? nbg_write_nxmx(ctx, path, &g, NBG_DATA_INT32, i32, 1, NULL) : NBG_EINVAL; break;
            default: rc = have_geom ? nbg_write_cbf(ctx, path, &g, 0, i32) : NBG_EINVAL; break;
            }
            if (rep > 0) {
                best = fmin(best, now() - t);
            }
        }
        if (rc != NBG_OK) {
            printf("  %s: cannot write: %s\n", rows[k].name, nbg_errmsg(ctx));
            continue;
        }
        rows[k].write_s = best;
        rows[k].bytes = (double)file_size(path);
        best = INFINITY;
        for (int rep = 0; rep < 4 && rc == NBG_OK; ++rep) {
            float *back = NULL;
            size_t nb = 0;
            const double t = now();
            rc = nbg_read_image(ctx, path, 0, npix, &back, &nb, NULL, NULL, NULL);
            if (rep > 0) {
                best = fmin(best, now() - t);
            }
            if (rc == NBG_OK && nb != npix) {
                rc = NBG_EFORMAT;
            }
            /* the data read back are the data written */
            for (size_t i = 0; rc == NBG_OK && i < npix; i += 997) {
                const float want = k == 1 || k == 2 ? img[i] : (float)u16[i];
                if (back[i] != want) {
                    rc = NBG_EFORMAT;
                }
            }
            free(back);
        }
        if (rc != NBG_OK) {
            printf("  %s: cannot read back: %s\n", rows[k].name, nbg_errmsg(ctx));
            continue;
        }
        rows[k].read_s = best;
        rows[k].ok = 1;
        unlink(path);
    }
    rmdir(dir);
    const double mb = npix * 4 / 1e6; /* the image as floats, for MB/s */
    printf("| format | bytes | size / SMV | write s | write / SMV | read s | read / SMV |\n");
    printf("|---|---|---|---|---|---|---|\n");
    for (int k = 0; k < nrows; ++k) {
        if (!rows[k].ok) {
            printf("| %s | failed | | | | | |\n", rows[k].name);
            continue;
        }
        printf("| %s | %.0f | %.2f | %.3f (%.0f MB/s) | %.2f | %.3f | %.2f |\n", rows[k].name, rows[k].bytes,
               rows[k].bytes / rows[0].bytes, rows[k].write_s, mb / rows[k].write_s,
               rows[k].write_s / rows[0].write_s, rows[k].read_s, rows[k].read_s / rows[0].read_s);
    }
    free(img);
    free(u16);
    free(i32);
    nbg_ctx_destroy(ctx);
    return 0;
}
