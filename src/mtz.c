/*
 * mtz.c -- CCP4 MTZ files as structure-factor tables (nbgi_read_mtz, behind nbg_hkl_read_column): the file's bytes
 * go to src/mtzread.cc (gemmi, C++), which checks its header against its size and expands the chosen column to
 * every symmetry equivalent; the entries then become the dense table every HKL file gives (nbgi_hkl_from_entries,
 * a reflection listed twice averaged).  In the formats plug-in where there is one (src/plugin.c forwards to it), so
 * that the program does not load the C++ runtime at start-up.  Library code: it never prints.
 */
#include "formats.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifdef NBG_HAVE_FORMATS

int nbgi_mtz_parse(nbg_ctx *ctx, const char *path, const unsigned char *buf, size_t len, const char *column,
                   double default_F, nbg_hkl *out, char *what, size_t nwhat)
{
    memset(out, 0, sizeof *out);
    if (what != NULL && nwhat > 0) {
        what[0] = '\0';
    }
    nbg_limits lim;
    nbgi_limits_of(ctx, &lim);
    nbgi_mtz_result r;
    int rc = nbgi_mtz_expand(buf, len, column, lim.max_bytes, &r);
    if (rc != NBG_OK) {
        return nbgi_error(ctx, rc, "MTZ file %s: %s", path, r.msg);
    }
    rc = nbgi_hkl_from_entries(ctx, path, r.ent, r.n, default_F, 1, out);
    free(r.ent);
    if (rc == NBG_OK && what != NULL && nwhat > 0) {
        snprintf(what, nwhat, "%s, %ld distinct indices in the table", r.info, out->nrefl);
    }
    return rc;
}

int nbgi_read_mtz(nbg_ctx *ctx, const char *path, const char *column, double default_F, nbg_hkl *out, char *what,
                  size_t nwhat)
{
    memset(out, 0, sizeof *out);
    unsigned char *buf;
    size_t len;
    int rc = nbgi_read_whole(ctx, path, "MTZ file", &buf, &len);
    if (rc != NBG_OK) {
        return rc;
    }
    rc = nbgi_mtz_parse(ctx, path, buf, len, column, default_F, out, what, nwhat);
    free(buf);
    return rc;
}

#else /* !NBG_HAVE_FORMATS */

int nbgi_mtz_parse(nbg_ctx *ctx, const char *path, const unsigned char *buf, size_t len, const char *column,
                   double default_F, nbg_hkl *out, char *what, size_t nwhat)
{
    (void)buf, (void)len, (void)column, (void)default_F, (void)what, (void)nwhat;
    memset(out, 0, sizeof *out);
    return nbgi_error(ctx, NBG_EUNSUP, "reading %s: MTZ files need gemmi, and nbgrad was built without the file "
                      "formats (FORMATS=0)", path);
}

int nbgi_read_mtz(nbg_ctx *ctx, const char *path, const char *column, double default_F, nbg_hkl *out, char *what,
                  size_t nwhat)
{
    return nbgi_mtz_parse(ctx, path, NULL, 0, column, default_F, out, what, nwhat);
}

#endif
