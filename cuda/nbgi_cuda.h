/*
 * nbgi_cuda.h -- the CUDA backend's entry points, called by the library's dispatch (src/simulate.c,
 * grad/grad.c) when the context's backend is CUDA.  Compiled only where nvcc is found (NBG_HAVE_CUDA).
 */
#ifndef NBG_CUDA_H
#define NBG_CUDA_H

#include "adjoint.h"
#include "internal.h"
#include "physics.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Finds a usable GPU and creates the context's device state; NBG_ENODEV when there is none. */
int nbgi_cuda_init(nbg_ctx *ctx);
void nbgi_cuda_release(nbg_ctx *ctx);
/* The context's GPU: name, multiprocessors, clock, peak rates (from the compute capability), memory. */
int nbgi_cuda_describe(const nbg_ctx *ctx, nbg_device_info *info);

/* The forward kernel on the device: the CPU's forward loop nest (src/row_tmpl.h) with one lane, one thread per
 * pixel.  k's arrays are host arrays; they are copied into device buffers kept by the context between calls
 * (reallocated only when a size grows).  omega_sum and oor are summed on the device in a fixed order.  times
 * receives the seconds spent copying the parameters to the device, in the kernels (device time between CUDA
 * events) and copying the results back. */
int nbgi_cuda_forward(nbg_ctx *ctx, const nbgi_kparams *k, int use_float, float *image, double *omega_sum, long *oor,
                     double times[3]);

/* The most crystal-vector and wavelength gradients (phi steps x mosaic domains x 9 + sources) the device's adjoint
 * holds a thread; a call that needs more runs its reverse pass on the CPU (grad/grad.c). */
#define NBGI_CUDA_MAXACC 1024

/* The adjoint on the device, in double or (use_float) float arithmetic: the scalar twin grad/adjoint_tmpl.h, one
 * thread per pixel, each thread's gradients of the plan-level quantities (ncomp doubles laid out as nbgi_adjacc's
 * fixed part, then abc, then lam) summed in a fixed order per block and then over blocks on the device: the same
 * call twice gives bit-identical gradients.  out receives the ncomp sums, image the forward values.  panel_out (NULL:
 * not wanted; panels only): each panel's own detector gradients (NBG_ADJ_DET doubles a panel, before the fold to
 * the plane's), from blocks aligned to the panels and summed per panel in block order. */
int nbgi_cuda_adjoint(nbg_ctx *ctx, const nbgi_kparams *k, int use_float, const float *dLdI, float *image, double *out,
                     int ncomp, double *panel_out, double times[3]);

/* The tangents on the device (forward mode, double; the scalar twin grad/jvp_tmpl.h, a thread a pixel): as
 * nbgi_jvp_cpu, out receives the nt tangent images (direction j at out[j * nw], nw the image's pixels or the
 * list's entries), image (and image_d where not NULL) the image, every pixel outside a list 0.  ptan (NULL: none)
 * the panels' own motion tangents, NBG_ADJ_DET a panel and direction.  times as nbgi_cuda_forward's. */
int nbgi_cuda_jvp(nbg_ctx *ctx, const nbgi_kparams *k, const nbgi_adjacc *t, int nt, const double *ptan, double *out,
                 float *image, double *image_d, double times[3]);

#ifdef __cplusplus
}
#endif
#endif
