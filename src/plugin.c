/*
 * plugin.c -- the files that come with a build, found where the build or the install put them (nbgi_helper_path),
 * and the formats plug-in's loader.
 *
 * The program pays at start-up for every shared library it is linked with: loading and relocating HDF5 and CBFlib
 * with what they pull in (curl, krb5, gnutls, ...) and Open MPI took nearly all of `nbgrad --version`'s 10 ms.  So
 * with FORMATS_DL=1 (the default where the formats are built) the NXmx and CBF code lives in the plug-in
 * nbgrad-formats.so (src/fmtplugin.c), opened here on the first NXmx or CBF call, and an mpirun run of the program
 * executes nbgrad-mpi (src/batch.c, nbgi_mpi_reexec).  The entry points below are those of nxmx.c and cbf.c, which
 * the library then does not hold; each one forwards to the plug-in's table, or returns NBG_EUNSUP naming the
 * plug-in and where it was looked for.
 */
#define _GNU_SOURCE
#include "formats.h"

#include <dlfcn.h>
#include <link.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* the folder of the program or shared object holding this code, into dir (no trailing '/'); 0 when unknown */
static int module_dir(char *dir, size_t n)
{
    char path[PATH_MAX];
    Dl_info info;
    struct link_map *map = NULL;
    path[0] = '\0';
    /* a shared object is named by the path it was opened by; the program's own map has the name "" */
    if (dladdr1((void *)module_dir, &info, (void **)&map, RTLD_DL_LINKMAP) != 0 && map != NULL &&
        map->l_name != NULL && map->l_name[0] != '\0' && realpath(map->l_name, path) == NULL) {
        path[0] = '\0';
    }
    if (path[0] == '\0') {
        const ssize_t k = readlink("/proc/self/exe", path, sizeof path - 1);
        if (k <= 0) {
            return 0;
        }
        path[k] = '\0';
    }
    char *slash = strrchr(path, '/');
    if (slash == NULL || (size_t)(slash - path) >= n) {
        return 0;
    }
    *slash = '\0';
    snprintf(dir, n, "%s", slash == path ? "/" : path);
    return 1;
}

int nbgi_helper_path(const char *name, char *out, size_t nout, char *tried, size_t ntried)
{
    char dir[PATH_MAX];
    const char *where[] = {"%s/%s", "%s/../%s", "%s/../lib/nbgrad/%s"};
    size_t used = 0;
    if (ntried > 0) {
        tried[0] = '\0';
    }
    const int have_dir = module_dir(dir, sizeof dir);
    const int nwhere = (int)(sizeof where / sizeof where[0]);
    for (int i = 0; i <= nwhere; ++i) {
        char cand[PATH_MAX + 64];
        if (i < nwhere) {
            if (!have_dir) {
                continue;
            }
            snprintf(cand, sizeof cand, where[i], dir, name);
        } else {
#ifdef NBG_HELPER_DIR
            snprintf(cand, sizeof cand, "%s/%s", NBG_HELPER_DIR, name);
#else
            break;
#endif
        }
        if (access(cand, R_OK) == 0) {
            char real[PATH_MAX];
            snprintf(out, nout, "%s", realpath(cand, real) != NULL ? real : cand);
            return 1;
        }
        if (used + 1 < ntried) {
            const int k = snprintf(tried + used, ntried - used, "%s%s", used > 0 ? ", " : "", cand);
            used = k > 0 ? used + (size_t)k : used;
            used = used < ntried ? used : ntried - 1;
        }
    }
    return 0;
}

#ifdef NBG_FORMATS_DL

#include <pthread.h>

static pthread_once_t once = PTHREAD_ONCE_INIT;
static const nbgi_formats_api *api;
static char why[PATH_MAX + 2560];

static void load(void)
{
    char path[PATH_MAX], tried[2048];
    if (!nbgi_helper_path(NBGI_FORMATS_PLUGIN, path, sizeof path, tried, sizeof tried)) {
        snprintf(why, sizeof why, "it is missing (looked for %s)", tried);
        return;
    }
    void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (h == NULL) {
        const char *e = dlerror();
        snprintf(why, sizeof why, "%s", e != NULL ? e : path);
        return;
    }
    const nbgi_formats_api *(*get)(void) = (const nbgi_formats_api *(*)(void))dlsym(h, NBGI_FORMATS_SYMBOL);
    const nbgi_formats_api *a = get != NULL ? get() : NULL;
    const size_t abi[4] = NBGI_FORMATS_ABI;
    if (a == NULL || a->size != sizeof *a || a->version == NULL || strcmp(a->version, NBG_VERSION) != 0 ||
        memcmp(a->abi, abi, sizeof abi) != 0) {
        snprintf(why, sizeof why, "%s is not the plug-in of this nbgrad %s (%s)", path, NBG_VERSION,
                 a == NULL ? "no " NBGI_FORMATS_SYMBOL : a->version != NULL ? a->version : "no version");
        dlclose(h);
        return;
    }
    api = a; /* kept open for the process's life */
}

/* The plug-in's table, or NULL after NBG_EUNSUP: "<doing> <path>: <what> needs the plug-in ...: <why>". */
static const nbgi_formats_api *formats(nbg_ctx *ctx, const char *doing, const char *path, const char *what)
{
    pthread_once(&once, load);
    if (api == NULL) {
        nbgi_error(ctx, NBG_EUNSUP, "%s %s: %s is read and written by nbgrad's plug-in %s, which could not be loaded: %s",
                   doing, path != NULL ? path : "(null)", what, NBGI_FORMATS_PLUGIN, why);
    }
    return api;
}

static void no_image(float **image, size_t *npix, uint8_t **mask)
{
    if (image != NULL) {
        *image = NULL;
    }
    if (npix != NULL) {
        *npix = 0;
    }
    if (mask != NULL) {
        *mask = NULL;
    }
}

int nbgi_read_nxmx_modules(nbg_ctx *ctx, const char *path, int frame, float **image, size_t *npix,
                           nbg_geometry *g, uint8_t **mask, int *nmodules)
{
    const nbgi_formats_api *a = formats(ctx, "reading", path, "NeXus/NXmx");
    if (a == NULL) {
        no_image(image, npix, mask);
        return NBG_EUNSUP;
    }
    return a->read_nxmx_modules(ctx, path, frame, image, npix, g, mask, nmodules);
}

int nbgi_read_nxmx(nbg_ctx *ctx, const char *path, int frame, float **image, size_t *npix, nbg_geometry *g,
                   uint8_t **mask)
{
    return nbgi_read_nxmx_modules(ctx, path, frame, image, npix, g, mask, NULL);
}

int nbg_read_nxmx_panels(nbg_ctx *ctx, const char *path, nbg_geometry *g, nbg_panel **panels, int *npanels)
{
    const nbgi_formats_api *a = formats(ctx, "reading", path, "NeXus/NXmx");
    if (a == NULL) {
        if (panels != NULL) {
            *panels = NULL;
        }
        if (npanels != NULL) {
            *npanels = 0;
        }
        return NBG_EUNSUP;
    }
    return a->read_nxmx_panels(ctx, path, g, panels, npanels);
}

int nbgi_write_nxmx_panels_set(nbg_ctx *ctx, nbgi_outset *set, const char *path, const nbg_geometry *g,
                               const nbg_panel *panels, int npanels, nbg_dtype dtype, const void *frames,
                               int nframes, const uint8_t *mask)
{
    const nbgi_formats_api *a = formats(ctx, "writing", path, "NeXus/NXmx");
    return a == NULL ? NBG_EUNSUP
                     : a->write_nxmx_panels_set(ctx, set, path, g, panels, npanels, dtype, frames, nframes, mask);
}

int nbg_write_nxmx_panels(nbg_ctx *ctx, const char *path, const nbg_geometry *g, const nbg_panel *panels,
                          int npanels, nbg_dtype dtype, const void *frames, int nframes, const uint8_t *mask)
{
    return nbgi_write_nxmx_panels_set(ctx, NULL, path, g, panels, npanels, dtype, frames, nframes, mask);
}

int nbgi_write_nxmx_set(nbg_ctx *ctx, nbgi_outset *set, const char *path, const nbg_geometry *g, nbg_dtype dtype,
                        const void *frames, int nframes, const uint8_t *mask)
{
    const nbgi_formats_api *a = formats(ctx, "writing", path, "NeXus/NXmx");
    return a == NULL ? NBG_EUNSUP : a->write_nxmx_set(ctx, set, path, g, dtype, frames, nframes, mask);
}

int nbg_write_nxmx(nbg_ctx *ctx, const char *path, const nbg_geometry *g, nbg_dtype dtype, const void *frames,
                   int nframes, const uint8_t *mask)
{
    return nbgi_write_nxmx_set(ctx, NULL, path, g, dtype, frames, nframes, mask);
}

int nbgi_read_cbf_panels(nbg_ctx *ctx, const char *path, float **image, size_t *npix, nbg_geometry *g,
                         uint8_t **mask, nbg_panel **panels, int *npanels)
{
    const nbgi_formats_api *a = formats(ctx, "reading", path, "CBF");
    if (a == NULL) {
        no_image(image, npix, mask);
        if (panels != NULL) {
            *panels = NULL;
        }
        if (npanels != NULL) {
            *npanels = 0;
        }
        return NBG_EUNSUP;
    }
    return a->read_cbf_panels(ctx, path, image, npix, g, mask, panels, npanels);
}

int nbgi_read_cbf(nbg_ctx *ctx, const char *path, float **image, size_t *npix, nbg_geometry *g, uint8_t **mask)
{
    return nbgi_read_cbf_panels(ctx, path, image, npix, g, mask, NULL, NULL);
}

int nbg_read_cbf_panels(nbg_ctx *ctx, const char *path, nbg_geometry *g, nbg_panel **panels, int *npanels)
{
    const nbgi_formats_api *a = formats(ctx, "reading", path, "CBF");
    if (a == NULL) {
        if (panels != NULL) {
            *panels = NULL;
        }
        if (npanels != NULL) {
            *npanels = 0;
        }
        return NBG_EUNSUP;
    }
    return a->read_cbf_panel_list(ctx, path, g, panels, npanels);
}

int nbgi_write_cbf_set(nbg_ctx *ctx, nbgi_outset *set, const char *path, const nbg_geometry *g, int frame,
                       const int32_t *data)
{
    const nbgi_formats_api *a = formats(ctx, "writing", path, "CBF");
    return a == NULL ? NBG_EUNSUP : a->write_cbf_set(ctx, set, path, g, frame, data);
}

int nbg_write_cbf(nbg_ctx *ctx, const char *path, const nbg_geometry *g, int frame, const int32_t *data)
{
    return nbgi_write_cbf_set(ctx, NULL, path, g, frame, data);
}

int nbgi_read_mtz(nbg_ctx *ctx, const char *path, const char *column, double default_F, nbg_hkl *out, char *what,
                  size_t nwhat)
{
    if (out != NULL) {
        memset(out, 0, sizeof *out);
    }
    if (what != NULL && nwhat > 0) {
        what[0] = '\0';
    }
    const nbgi_formats_api *a = formats(ctx, "reading", path, "MTZ");
    return a == NULL ? NBG_EUNSUP : a->read_mtz(ctx, path, column, default_F, out, what, nwhat);
}

#endif /* NBG_FORMATS_DL */
