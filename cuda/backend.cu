/*
 * backend.cu -- the CUDA forward and adjoint kernels and the device memory they keep between calls.
 *
 * No physics lives here: the kernels call the per-pixel loop nests the CPU uses (src/pixel_tmpl.h for the
 * forward, grad/adjoint_tmpl.h for the adjoint), whose functions are marked NBG_HD (host and device).  One
 * forward call launches one kernel; one adjoint call launches one kernel.  Reductions (solid-angle sum,
 * interpolation fallbacks, gradients) go through a fixed-order tree per block and a block-order sum on the host,
 * so results are reproducible bit for bit.  Nothing here needs GSL or LAPACKE; the CUDA runtime is linked
 * statically.
 */
#include "nbg_cuda.h"

extern "C" {
#include "adjoint.h"
#include "kernel.h"
#define NBG_R double
#define NBG_SFX(name) name##_d
#include "adjoint_tmpl.h"
#undef NBG_R
#undef NBG_SFX
}

#include <cuda_runtime.h>
#include <stdlib.h>
#include <string.h>

#define NBG_BLOCK 128
#define NBG_CUDA_MAXACC 1024 /* plan-level gradient components one thread can hold (fixed + abc + lam) */

typedef struct {
    int device;
    float *img, *g;
    double *src, *abc, *F, *part;
    uint8_t *mask;
    size_t cap_img, cap_g, cap_src, cap_abc, cap_F, cap_part, cap_mask;
} nbg_cuda_state;

static int cuda_fail(nbg_ctx *ctx, cudaError_t e, const char *what)
{
    return nbg_error(ctx, NBG_ECUDA, "CUDA %s failed: %s", what, cudaGetErrorString(e));
}

/* Grows a device buffer to at least need bytes (kept between calls). */
static cudaError_t ensure(void **p, size_t *cap, size_t need)
{
    if (need <= *cap && *p != NULL) {
        return cudaSuccess;
    }
    if (*p != NULL) {
        cudaFree(*p);
        *p = NULL;
        *cap = 0;
    }
    const cudaError_t e = cudaMalloc(p, need ? need : 16);
    if (e == cudaSuccess) {
        *cap = need;
    }
    return e;
}

extern "C" int nbg_cuda_init(nbg_ctx *ctx)
{
    int n = 0;
    const cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess || n == 0) {
        return nbg_error(ctx, NBG_ENODEV, "no CUDA device (%s)", e != cudaSuccess ? cudaGetErrorString(e) : "none");
    }
    nbg_cuda_state *st = (nbg_cuda_state *)calloc(1, sizeof *st);
    if (st == NULL) {
        return NBG_ENOMEM;
    }
    cudaGetDevice(&st->device);
    ctx->cuda = st;
    return NBG_OK;
}

extern "C" void nbg_cuda_release(nbg_ctx *ctx)
{
    nbg_cuda_state *st = (nbg_cuda_state *)ctx->cuda;
    if (st == NULL) {
        return;
    }
    cudaFree(st->img);
    cudaFree(st->g);
    cudaFree(st->src);
    cudaFree(st->abc);
    cudaFree(st->F);
    cudaFree(st->part);
    cudaFree(st->mask);
    free(st);
    ctx->cuda = NULL;
}

/* Copies the plan's arrays into the context's device buffers and returns the device copy of k. */
static int upload(nbg_ctx *ctx, const nbg_kparams *k, nbg_kparams *kd)
{
    nbg_cuda_state *st = (nbg_cuda_state *)ctx->cuda;
    *kd = *k;
    const size_t nsrc = (size_t)k->nsources * NBG_SRC_STRIDE, nabc = (size_t)k->nphi * k->nmos * 9;
    const size_t npix = (size_t)k->fpixels * k->spixels;
    cudaError_t e;
    if ((e = ensure((void **)&st->src, &st->cap_src, nsrc * sizeof(double))) != cudaSuccess ||
        (e = ensure((void **)&st->abc, &st->cap_abc, nabc * sizeof(double))) != cudaSuccess) {
        return cuda_fail(ctx, e, "allocation");
    }
    if ((e = cudaMemcpy(st->src, k->src, nsrc * sizeof(double), cudaMemcpyHostToDevice)) != cudaSuccess ||
        (e = cudaMemcpy(st->abc, k->abc, nabc * sizeof(double), cudaMemcpyHostToDevice)) != cudaSuccess) {
        return cuda_fail(ctx, e, "copy");
    }
    kd->src = st->src;
    kd->abc = st->abc;
    if (k->F != NULL) {
        const size_t nF = (size_t)k->nh * k->nk * k->nl;
        if ((e = ensure((void **)&st->F, &st->cap_F, nF * sizeof(double))) != cudaSuccess ||
            (e = cudaMemcpy(st->F, k->F, nF * sizeof(double), cudaMemcpyHostToDevice)) != cudaSuccess) {
            return cuda_fail(ctx, e, "structure-factor copy");
        }
        kd->F = st->F;
    }
    if (k->mask != NULL) {
        if ((e = ensure((void **)&st->mask, &st->cap_mask, npix)) != cudaSuccess ||
            (e = cudaMemcpy(st->mask, k->mask, npix, cudaMemcpyHostToDevice)) != cudaSuccess) {
            return cuda_fail(ctx, e, "mask copy");
        }
        kd->mask = st->mask;
    }
    if ((e = ensure((void **)&st->img, &st->cap_img, npix * sizeof(float))) != cudaSuccess) {
        return cuda_fail(ctx, e, "image allocation");
    }
    return NBG_OK;
}

/* Fixed-order tree sum over the block of v; the result is valid in thread 0. */
__device__ static double block_sum(double v, double *sh)
{
    sh[threadIdx.x] = v;
    __syncthreads();
    for (int w = NBG_BLOCK / 2; w > 0; w >>= 1) {
        if ((int)threadIdx.x < w) {
            sh[threadIdx.x] += sh[threadIdx.x + w];
        }
        __syncthreads();
    }
    const double r = sh[0];
    __syncthreads();
    return r;
}

template <int FLOAT>
__global__ void nbg_forward_kernel(nbg_kparams p, float *img, double *part)
{
    __shared__ double sh[NBG_BLOCK];
    const long npix = (long)p.fpixels * p.spixels;
    const long i = (long)blockIdx.x * NBG_BLOCK + threadIdx.x;
    double om = 0, oor = 0;
    if (i < npix) {
        const int f = (int)(i % p.fpixels), s = (int)(i / p.fpixels);
        float v = 0.0f;
        if (nbg_pixel_active(&p, f, s)) {
            if (FLOAT) {
                nbg_pixstat_f st = {0, 0};
                v = (float)nbg_pixel_f(&p, f, s, &st);
                om = st.omega_sum;
                oor = (double)st.oor;
            } else {
                nbg_pixstat_d st = {0, 0};
                v = (float)nbg_pixel_d(&p, f, s, &st);
                om = st.omega_sum;
                oor = (double)st.oor;
            }
        }
        img[i] = v;
    }
    const double so = block_sum(om, sh), sr = block_sum(oor, sh);
    if (threadIdx.x == 0) {
        part[2 * blockIdx.x] = so;
        part[2 * blockIdx.x + 1] = sr;
    }
}

extern "C" int nbg_cuda_forward(nbg_ctx *ctx, const nbg_kparams *k, int use_float, float *image, double *omega_sum,
                                long *oor)
{
    nbg_cuda_state *st = (nbg_cuda_state *)ctx->cuda;
    nbg_kparams kd;
    int rc = upload(ctx, k, &kd);
    if (rc != NBG_OK) {
        return rc;
    }
    const size_t npix = (size_t)k->fpixels * k->spixels;
    const unsigned nblocks = (unsigned)((npix + NBG_BLOCK - 1) / NBG_BLOCK);
    cudaError_t e = ensure((void **)&st->part, &st->cap_part, 2 * (size_t)nblocks * sizeof(double));
    if (e != cudaSuccess) {
        return cuda_fail(ctx, e, "allocation");
    }
    if (use_float) {
        nbg_forward_kernel<1><<<nblocks, NBG_BLOCK>>>(kd, st->img, st->part);
    } else {
        nbg_forward_kernel<0><<<nblocks, NBG_BLOCK>>>(kd, st->img, st->part);
    }
    if ((e = cudaGetLastError()) != cudaSuccess) {
        return cuda_fail(ctx, e, "forward kernel launch");
    }
    if ((e = cudaMemcpy(image, st->img, npix * sizeof(float), cudaMemcpyDeviceToHost)) != cudaSuccess) {
        return cuda_fail(ctx, e, "forward kernel");
    }
    double *part = (double *)malloc(2 * (size_t)nblocks * sizeof(double));
    if (part == NULL) {
        return NBG_ENOMEM;
    }
    if ((e = cudaMemcpy(part, st->part, 2 * (size_t)nblocks * sizeof(double), cudaMemcpyDeviceToHost)) != cudaSuccess) {
        free(part);
        return cuda_fail(ctx, e, "copy");
    }
    double so = 0, sr = 0;
    for (unsigned b = 0; b < nblocks; ++b) {
        so += part[2 * b];
        sr += part[2 * b + 1];
    }
    free(part);
    *omega_sum = so;
    *oor = (long)sr;
    return NBG_OK;
}

__global__ void nbg_adjoint_kernel(nbg_kparams p, const float *g, float *img, double *part, int ncomp)
{
    __shared__ double sh[NBG_BLOCK];
    double local[NBG_CUDA_MAXACC];
    const int nfixed = (int)NBG_ADJ_FIXED;
    const int nabc = p.nphi * p.nmos * 9;
    for (int c = 0; c < ncomp - nfixed; ++c) {
        local[c] = 0;
    }
    nbg_adjacc acc;
    memset(&acc, 0, sizeof acc);
    acc.abc = local;
    acc.lam = local + nabc;
    const long npix = (long)p.fpixels * p.spixels;
    const long i = (long)blockIdx.x * NBG_BLOCK + threadIdx.x;
    if (i < npix) {
        const int f = (int)(i % p.fpixels), s = (int)(i / p.fpixels);
        float v = 0.0f;
        if (nbg_pixel_active(&p, f, s)) {
            v = (float)nbg_pixel_adjoint_d(&p, f, s, (double)g[i], &acc);
        }
        img[i] = v;
    }
    const double *fixed = (const double *)&acc;
    for (int c = 0; c < ncomp; ++c) {
        const double r = block_sum(c < nfixed ? fixed[c] : local[c - nfixed], sh);
        if (threadIdx.x == 0) {
            part[(size_t)blockIdx.x * ncomp + c] = r;
        }
    }
}

extern "C" int nbg_cuda_adjoint(nbg_ctx *ctx, const nbg_kparams *k, const float *dLdI, float *image, double *out,
                                int ncomp)
{
    if (ncomp - (int)NBG_ADJ_FIXED > NBG_CUDA_MAXACC) {
        return nbg_error(ctx, NBG_EUNSUP, "the CUDA adjoint holds at most %d crystal-vector and wavelength "
                         "gradients per thread (this experiment has %d phi x mosaic x 9 + sources)",
                         NBG_CUDA_MAXACC, ncomp - (int)NBG_ADJ_FIXED);
    }
    nbg_cuda_state *st = (nbg_cuda_state *)ctx->cuda;
    nbg_kparams kd;
    int rc = upload(ctx, k, &kd);
    if (rc != NBG_OK) {
        return rc;
    }
    const size_t npix = (size_t)k->fpixels * k->spixels;
    const unsigned nblocks = (unsigned)((npix + NBG_BLOCK - 1) / NBG_BLOCK);
    cudaError_t e;
    if ((e = ensure((void **)&st->part, &st->cap_part, (size_t)ncomp * nblocks * sizeof(double))) != cudaSuccess ||
        (e = ensure((void **)&st->g, &st->cap_g, npix * sizeof(float))) != cudaSuccess) {
        return cuda_fail(ctx, e, "allocation");
    }
    if ((e = cudaMemcpy(st->g, dLdI, npix * sizeof(float), cudaMemcpyHostToDevice)) != cudaSuccess) {
        return cuda_fail(ctx, e, "copy");
    }
    nbg_adjoint_kernel<<<nblocks, NBG_BLOCK>>>(kd, st->g, st->img, st->part, ncomp);
    if ((e = cudaGetLastError()) != cudaSuccess) {
        return cuda_fail(ctx, e, "adjoint kernel launch");
    }
    if ((e = cudaMemcpy(image, st->img, npix * sizeof(float), cudaMemcpyDeviceToHost)) != cudaSuccess) {
        return cuda_fail(ctx, e, "adjoint kernel");
    }
    double *part = (double *)malloc((size_t)ncomp * nblocks * sizeof(double));
    if (part == NULL) {
        return NBG_ENOMEM;
    }
    if ((e = cudaMemcpy(part, st->part, (size_t)ncomp * nblocks * sizeof(double), cudaMemcpyDeviceToHost)) !=
        cudaSuccess) {
        free(part);
        return cuda_fail(ctx, e, "copy");
    }
    for (int c = 0; c < ncomp; ++c) {
        double s = 0;
        for (unsigned b = 0; b < nblocks; ++b) {
            s += part[(size_t)b * ncomp + c];
        }
        out[c] = s;
    }
    free(part);
    return NBG_OK;
}
