/*
 * model.c -- the image model: M = scale * I + B with a background plane, and the per-pixel losses against
 * observed counts through the detector's response (pedestal, gain, read noise).  See nbg_experiment and nbg_loss
 * in nbgrad.h for the formulas.  The model's arithmetic only: the forward (simulate.c) applies it; what renders
 * an image to judge it (the floor check) is floor.c.
 */
#include "plan.h"
#include "geometry.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int nbgi_model_is_identity(const nbg_experiment *e)
{
    return e->scale == 1 && e->bg[0] == 0 && e->bg[1] == 0 && e->bg[2] == 0;
}

void nbgi_model_xy(const nbgi_kparams *k, size_t i, double *x, double *y)
{
    double f, s;
    if (k->npanels == 0) {
        f = (double)(i % (size_t)k->fpixels);
        s = (double)(i / (size_t)k->fpixels);
    } else {
        /* a panel's pixel: where its centre falls on the detector plane, in the plane's pixels, so that the
         * background plane is the same function of position as on the single detector that panels may tile */
        int lo = 0, hi = k->npanels - 1;
        while (lo < hi) {
            const int mid = (lo + hi + 1) / 2;
            if (k->panels[mid].offset <= (long)i) {
                lo = mid;
            } else {
                hi = mid - 1;
            }
        }
        const nbgi_kpanel *q = k->panels + lo;
        const long j = (long)i - q->offset;
        const double pf = (double)(j % q->fpixels) + 0.5, ps = (double)(j / q->fpixels) + 0.5;
        double d[3];
        for (int a = 0; a < 3; ++a) d[a] = q->pix0[a] + q->pixel * (pf * q->fdet[a] + ps * q->sdet[a]) - k->pix0[a];
        f = (d[0] * k->fdet[0] + d[1] * k->fdet[1] + d[2] * k->fdet[2]) / k->pixel - 0.5;
        s = (d[0] * k->sdet[0] + d[1] * k->sdet[1] + d[2] * k->sdet[2]) / k->pixel - 0.5;
    }
    *x = (f - 0.5 * (k->fpixels - 1)) / NBG_BG_UNIT;
    *y = (s - 0.5 * (k->spixels - 1)) / NBG_BG_UNIT;
}

int nbgi_model_active(const nbgi_kparams *k, size_t i)
{
    return nbgi_pixel_active_at(k, (long)i);
}

double nbgi_model_bg(const nbg_experiment *e, const nbgi_kparams *k, size_t i)
{
    double x, y;
    nbgi_model_xy(k, i, &x, &y);
    return e->bg[0] + e->bg[1] * x + e->bg[2] * y;
}

void nbgi_model_apply(const nbg_experiment *e, const nbgi_kparams *k, float *image)
{
    if (nbgi_model_is_identity(e)) {
        return; /* bit for bit the simulated image */
    }
    const long nw = nbgi_nwalk(k); /* all panels' pixels, or the list's */
#pragma omp parallel for schedule(static) if (nw >= (long)NBGI_PARALLEL_MIN)
    for (long t = 0; t < nw; ++t) {
        const size_t i = nbgi_walk_at(k, t);
        if (nbgi_model_active(k, i)) {
            image[i] = (float)(e->scale * image[i] + nbgi_model_bg(e, k, i));
        }
    }
}

double nbgi_pixel_loss(nbg_loss loss, const nbg_detector_model *r, double M, double obs, double *dLdM, double *c)
{
    const double y = (obs - r->pedestal) / r->gain; /* photons */
    if (loss == NBG_LOSS_LSQ) {
        *dLdM = 2 * (M - y);
        if (c != NULL) {
            *c = 2;
        }
        return (M - y) * (M - y);
    }
    /* Poisson, shifted by s = (sigma_r / gain)^2 photons with read noise (s = 0 without): the mean M + s floored
     * at 1e-12 where it vanishes, the data y + s clipped at 0 */
    const double s = r->read_noise > 0 ? (r->read_noise / r->gain) * (r->read_noise / r->gain) : 0;
    const double m = M + s > 1e-12 ? M + s : 1e-12;
    const double yy = y + s > 0 ? y + s : 0;
    *dLdM = 1 - yy / m;
    if (c != NULL) {
        *c = 1 / m; /* Fisher scoring: E[y] / m^2 */
    }
    return m - (yy > 0 ? yy * log(m) : 0);
}
