/*
 * gradcheck.c -- the finite-difference check of the adjoint that any user can run on any experiment.
 *
 * Loss L = sum_p w_p I_p with fixed pseudo-random weights w_p in [0.5, 1.5), so that a gradient that misplaces
 * pixels cannot pass by symmetry.  For each parameter: central differences in double at steps h and h/2,
 *     D(h) = (L(x + h) - L(x - h)) / 2h,   numeric = (4 D(h/2) - D(h)) / 3   (Richardson, error O(h^4)),
 * compared as |adjoint - numeric| <= atol + rtol max(|adjoint|, |numeric|) with atol the differences' rounding
 * floor (1e-13 |L| / h), and the error of D must shrink like h^2: log2(|D(h) - adjoint| / |D(h/2) - adjoint|) is about 2 wherever that
 * error stands above rounding.  Pixels whose discrete choices (rounded Miller indices, interpolation windows,
 * tophat edge, resolution cut) differ between any of the evaluations are left out of both sides.  A blank image
 * is refused; a parameter whose adjoint and difference are both at the rounding floor gets the status ZERO (the
 * experiment does not depend on it: no proof, and no failure), while a zero adjoint against a non-zero difference
 * fails.  The loss is the image model's, L = sum w_p M_p with M = scale I + B: the simulation's parameters' terms
 * are scale times sum w dI/dtheta, the image-level parameters' are linear (their differences are exact).
 */
#include "adjoint.h"
#include "grad.h"
#include "forward.h"
#include "internal.h"
#include "param.h"
#include "plan.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Evaluates L = sum w M = scale sum w I + sum w B at the experiment's current values; fills the signatures. */
static int eval_loss(nbg_ctx *ctx, const nbg_experiment *e, const float *w, const uint8_t *skip, uint64_t *sig,
                     double *L)
{
    nbgi_plan pl;
    const int rc = nbgi_plan_build(ctx, e, &pl);
    if (rc != NBG_OK) {
        return rc;
    }
    *L = e->scale * nbgi_forward_wsum_cpu(&pl.k, w, skip, sig);
    if (e->bg[0] != 0 || e->bg[1] != 0 || e->bg[2] != 0) {
        double sb = 0;
        const size_t npix = (size_t)pl.k.npix;
        for (size_t i = 0; i < npix; ++i) {
            if (nbgi_model_active(&pl.k, i) && (skip == NULL || !skip[i])) {
                sb += w[i] * nbgi_model_bg(e, &pl.k, i);
            }
        }
        *L += sb;
    }
    nbgi_plan_free(&pl);
    if (isnan(*L)) {
        return nbgi_error(ctx, NBG_ENOMEM, "gradcheck: out of memory");
    }
    return NBG_OK;
}

/* Structure factors: a directional check along a pseudo-random direction v over the table entries (or along
 * default_F without a table): <dL/dF, v> against (L(F + h v) - L(F - h v)) / 2h.  L is quadratic in F, so the
 * central difference is exact up to rounding. */
static int check_F(nbg_ctx *ctx, const nbg_experiment *e, const float *w, double L0, double rtol,
                   nbg_gradcheck_result *r)
{
    memset(r, 0, sizeof *r);
    r->param = NBG_P_F_ALL;
    nbg_report rep;
    int rc = nbg_describe(ctx, e, &rep);
    if (rc != NBG_OK) {
        return rc;
    }
    const size_t npix = rep.npix;
    const nbg_hkl *t = e->hkl;
    const size_t n = (size_t)nbgi_param_nF(e);
    double *dF = calloc(n, sizeof(double)), *v = malloc(n * sizeof(double));
    nbg_param *ids = malloc(n * sizeof(nbg_param));
    float *img = malloc(npix * sizeof(float));
    nbg_hkl tp = {0};
    if (t != NULL) {
        tp = *t;
        tp.F = malloc(n * sizeof(double));
    }
    if (dF == NULL || v == NULL || ids == NULL || img == NULL || (t != NULL && tp.F == NULL)) {
        rc = nbgi_error(ctx, NBG_ENOMEM, "gradcheck: out of memory for %zu structure factors", n);
        goto out;
    }
    for (size_t i = 0; i < n; ++i) {
        ids[i] = NBG_P_F((long)i);
    }
    rc = nbg_simulate_grad(ctx, e, w, ids, (int)n, dF, img, npix, NULL);
    if (rc != NBG_OK) {
        goto out;
    }
    uint64_t state = 0xD1B54A32D192ED03ULL;
    double adj = 0;
    for (size_t i = 0; i < n; ++i) {
        state = state * 6364136223846793005ULL + 1442695040888963407ULL;
        v[i] = (double)(state >> 11) * (1.0 / 9007199254740992.0) - 0.5;
        adj += dF[i] * v[i];
    }
    const double Fscale = t != NULL ? 1.0 : fmax(fabs(e->default_F), 1.0);
    const double h = 1e-3 * Fscale;
    double Lv[2];
    for (int j = 0; j < 2; ++j) {
        nbg_experiment ep = *e;
        const double sgn = j == 0 ? 1 : -1;
        if (t != NULL) {
            for (size_t i = 0; i < n; ++i) {
                tp.F[i] = t->F[i] + sgn * h * v[i];
            }
            ep.hkl = &tp;
        } else {
            ep.default_F = e->default_F + sgn * h * v[0];
        }
        rc = eval_loss(ctx, &ep, w, NULL, NULL, &Lv[j]);
        if (rc != NBG_OK) {
            goto out;
        }
    }
    const double num = (Lv[0] - Lv[1]) / (2 * h);
    const double atol = 1e-13 * fabs(L0) / h;
    const double denom = fmax(fabs(adj), fabs(num));
    r->adjoint = adj;
    r->numeric = num;
    r->step = h;
    r->order = NAN;
    r->relerr = denom > 0 ? fabs(adj - num) / denom : 0;
    r->loss = L0;
    r->pass = denom > atol && fabs(adj - num) <= atol + rtol * denom;
    r->status = !(denom > atol) ? NBG_CHECK_ZERO : r->pass ? NBG_CHECK_PASS : NBG_CHECK_FAIL;
    snprintf(r->reason, sizeof r->reason, "%s", !(denom > atol) ? "the gradient is zero: no pixel depends on F"
                                              : r->pass ? "directional check over all table entries"
                                                        : "relative error above tolerance");
out:
    free(dF);
    free(v);
    free(ids);
    free(img);
    free(tp.F);
    return rc;
}

int nbg_gradcheck(nbg_ctx *ctx, const nbg_experiment *e, const nbg_param *params, int nparams, double rtol,
                  double h_scale, nbg_gradcheck_result *results)
{
    if (ctx == NULL || e == NULL || (nparams > 0 && results == NULL)) {
        return nbgi_error(ctx, NBG_EINVAL, "nbg_gradcheck: NULL argument");
    }
    if (e->pixels != NULL || e->npixels_list != 0) {
        return nbgi_error(ctx, NBG_EUNSUP, "nbg_gradcheck checks the whole image: clear the pixel list");
    }
    if (!(rtol > 0 && rtol < 1) || !(h_scale > 0 && isfinite(h_scale))) {
        return nbgi_error(ctx, NBG_EINVAL, "nbg_gradcheck: rtol must be in (0, 1) and h_scale positive (got %g, %g)",
                         rtol, h_scale);
    }
    int rc = nbgi_params_check(ctx, e, params, nparams, 1, "nbg_gradcheck");
    if (rc != NBG_OK) {
        return rc;
    }
    nbg_report rep;
    rc = nbg_describe(ctx, e, &rep);
    if (rc != NBG_OK) {
        return rc;
    }
    /* the experiment the steps are taken in: the caller's, with its own copies of what a step writes (the panel
     * motions; the structure-factor table when an entry is checked) */
    nbg_experiment base = *e;
    nbg_hkl table = {0};
    int nlist = 0, wantF = 0;
    for (int j = 0; j < nparams; ++j) {
        nlist += params[j] != NBG_P_F_ALL;
        wantF |= nbgi_param_kind(params[j], NULL, NULL, NULL) == NBGI_K_F;
    }
    const size_t npix = rep.npix;
    float *w = malloc(sizeof(float) * npix);
    float *wx = malloc(sizeof(float) * npix);
    float *img = malloc(sizeof(float) * npix);
    uint64_t *sig0 = malloc(sizeof(uint64_t) * npix);
    uint64_t *sig = malloc(sizeof(uint64_t) * npix);
    uint8_t *skip = malloc(npix);
    nbg_param *plist = malloc(sizeof(nbg_param) * (size_t)(nlist > 0 ? nlist : 1));
    double *gv = malloc(sizeof(double) * (size_t)(nlist > 0 ? nlist : 1));
    nbg_panel_motion *mot = malloc(sizeof(nbg_panel_motion) * (size_t)(e->nmotions > 0 ? e->nmotions : 1));
    const long nF = nbgi_param_nF(e);
    if (wantF && e->hkl != NULL) {
        table = *e->hkl;
        table.F = malloc(sizeof(double) * (size_t)nF);
        if (table.F != NULL) {
            memcpy(table.F, e->hkl->F, sizeof(double) * (size_t)nF);
        }
        base.hkl = &table;
    }
    if (!w || !wx || !img || !sig0 || !sig || !skip || !plist || !gv || !mot || (wantF && e->hkl && !table.F)) {
        rc = nbgi_error(ctx, NBG_ENOMEM, "gradcheck: out of memory for %zu pixels", npix);
        goto done;
    }
    if (e->nmotions > 0) {
        memcpy(mot, e->motions, sizeof(nbg_panel_motion) * (size_t)e->nmotions);
        base.motions = mot;
    }
    /* fixed pseudo-random weights (a 64-bit LCG, independent of the simulation's random streams) */
    uint64_t state = 0x9E3779B97F4A7C15ULL;
    for (size_t i = 0; i < npix; ++i) {
        state = state * 6364136223846793005ULL + 1442695040888963407ULL;
        w[i] = 0.5f + (float)((state >> 40) * (1.0 / 16777216.0));
    }
    double L0;
    rc = eval_loss(ctx, &base, w, NULL, sig0, &L0);
    if (rc != NBG_OK) {
        goto done;
    }
    /* every listed parameter's adjoint from one reverse pass (the directional F check runs its own) */
    int np = 0;
    for (int j = 0; j < nparams; ++j) {
        if (params[j] != NBG_P_F_ALL) {
            plist[np++] = params[j];
        }
    }
    rc = nbg_simulate_grad(ctx, &base, w, plist, np, gv, img, npix, NULL);
    if (rc != NBG_OK) {
        goto done;
    }
    float imax = 0;
    double isum = 0;
    for (size_t i = 0; i < npix; ++i) {
        imax = fmaxf(imax, img[i]);
        isum += img[i];
    }
    if (!(imax > 0)) {
        rc = nbgi_error(ctx, NBG_EINVAL, "gradcheck: the image is blank; a check on it proves nothing");
        goto done;
    }
    int ig = 0;
    for (int pi = 0; pi < nparams; ++pi) {
        const nbg_param p = params[pi];
        nbg_gradcheck_result *r = &results[pi];
        char label[48];
        nbg_param_label(e, p, label, sizeof label);
        if (p == NBG_P_F_ALL) {
            rc = check_F(ctx, &base, w, L0, rtol, r);
            if (rc != NBG_OK) {
                goto done;
            }
            if (ctx->progress != NULL) {
                ctx->progress(ctx->progress_user, label, pi + 1, nparams);
            }
            continue;
        }
        memset(r, 0, sizeof *r);
        r->param = p;
        double x0;
        nbg_param_get(&base, p, &x0);
        const double h = h_scale * nbgi_param_step(p, x0, isum / (double)npix);
        r->loss = L0;
        r->step = h;
        const double offs[4] = {h, -h, h / 2, -h / 2};
        /* pass 1: which pixels change their discrete choices */
        memset(skip, 0, npix);
        nbg_experiment ep = base;
        for (int j = 0; j < 4; ++j) {
            nbg_param_set(&ep, p, x0 + offs[j]);
            double Lj;
            rc = eval_loss(ctx, &ep, w, NULL, sig, &Lj);
            if (rc != NBG_OK) {
                nbg_param_set(&ep, p, x0);
                goto done;
            }
            for (size_t i = 0; i < npix; ++i) {
                skip[i] |= sig[i] != sig0[i];
            }
        }
        long excluded = 0;
        for (size_t i = 0; i < npix; ++i) {
            excluded += skip[i];
        }
        r->excluded = excluded;
        /* pass 2: the finite differences over the pixels kept */
        double Lv[4];
        for (int j = 0; j < 4; ++j) {
            nbg_param_set(&ep, p, x0 + offs[j]);
            rc = eval_loss(ctx, &ep, w, skip, NULL, &Lv[j]);
            if (rc != NBG_OK) {
                nbg_param_set(&ep, p, x0);
                goto done;
            }
        }
        nbg_param_set(&ep, p, x0); /* the copies the steps wrote to are back at the start */
        double adj = gv[ig++];
        if (excluded > 0) {
            for (size_t i = 0; i < npix; ++i) {
                wx[i] = skip[i] ? 0.0f : w[i];
            }
            rc = nbg_simulate_grad(ctx, &base, wx, &p, 1, &adj, img, npix, NULL);
            if (rc != NBG_OK) {
                goto done;
            }
        }
        const double D1 = (Lv[0] - Lv[1]) / (2 * h);
        const double D2 = (Lv[2] - Lv[3]) / h;
        const double num = (4 * D2 - D1) / 3;
        r->adjoint = adj;
        r->numeric = num;
        const double denom = fmax(fabs(num), fabs(adj));
        r->relerr = denom > 0 ? fabs(adj - num) / denom : 0;
        /* convergence order of the plain central difference, where its error stands above rounding */
        const double e1 = fabs(D1 - adj), e2 = fabs(D2 - adj);
        const double floor_err = 1e-13 * fabs(L0) / h + rtol * 1e-3 * denom;
        r->order = (e2 > 0 && e1 > 0) ? log2(e1 / e2) : NAN;
        const int resolved = e1 > 16 * floor_err;
        /* |adjoint - numeric| <= atol + rtol |numeric|, atol the finite difference's rounding floor: L is a sum
         * known to about 1e-15 of itself, so differences of it over 2h carry about 1e-15 |L| / h; atol takes
         * a hundred times that */
        const double atol = 1e-13 * fabs(L0) / h;
        r->pass = 1;
        r->status = NBG_CHECK_PASS;
        if (denom <= atol) {
            r->pass = 0;
            r->status = NBG_CHECK_ZERO;
            snprintf(r->reason, sizeof r->reason, "zero gradient: adjoint and difference both below the rounding "
                     "floor %.2g; no pixel of this experiment depends on %.40s", atol, label);
        } else if (!(fabs(adj - num) <= atol + rtol * denom)) {
            r->pass = 0;
            r->status = NBG_CHECK_FAIL;
            snprintf(r->reason, sizeof r->reason, "relative error %.3g above %.3g", r->relerr, rtol);
        } else if (resolved && !(r->order > 1.5 && r->order < 2.6)) {
            r->pass = 0;
            r->status = NBG_CHECK_FAIL;
            snprintf(r->reason, sizeof r->reason, "finite-difference error shrinks with order %.2f, not 2", r->order);
        } else if (!resolved) {
            snprintf(r->reason, sizeof r->reason, "difference error at rounding level (linear in the parameter)");
        }
        if (excluded > 0) {
            const size_t len = strlen(r->reason);
            snprintf(r->reason + len, sizeof r->reason - len, "%s%ld pixels left out: their rounded Miller indices "
                     "change within the step", len ? "; " : "", excluded);
        }
        if (ctx->progress != NULL) {
            ctx->progress(ctx->progress_user, label, pi + 1, nparams);
        }
    }
    rc = NBG_OK;
done:
    free(w);
    free(wx);
    free(img);
    free(sig0);
    free(sig);
    free(skip);
    free(plist);
    free(gv);
    free(mot);
    free(table.F);
    return rc;
}
