/*
 * backend.cu -- the CUDA forward and adjoint kernels and the device memory they keep between calls.
 *
 * No physics lives here: the kernels call the loop nests the CPU uses, whose functions are marked NBG_HD (host and
 * device), one thread per pixel: the forward runs the CPU's row kernel (src/row_tmpl.h) with one lane
 * (NBG_ROW_LANES 1), the same text as the CPU's eight or sixteen; the adjoint runs the scalar adjoint nest
 * (grad/adjoint_tmpl.h), the CPU row adjoint's twin, in its tiled form where there are many crystal matrices or
 * sources (NBG_CUDA_TILED below; the CPU tests run that form too).  Each comes in double and in float (the float
 * lattice factor takes the phase relative to the nearest integer; the adjoint accumulates its gradients in double
 * in both).
 *
 * One call launches two kernels whatever the sampling: the pixel kernel, which also reduces its per-pixel sums
 * (solid angle, interpolation fallbacks; for the adjoint, the gradients) over each block, and a reduction kernel
 * that sums the block partials.  Both reductions have a fixed order (warp shuffles, then warps in order; blocks in
 * order), so the same call twice gives bit-identical results.  The context keeps its device buffers between calls
 * and grows them only when a size grows, so a repeated call pays no allocation, only the parameter copies.
 *
 * Nothing here needs GSL or LAPACKE; the CUDA runtime is linked statically.  tests/cudaemu/ runs this same file on
 * the CPU (NBG_CUDA_EMU), so that the launch, indexing and reduction code is tested where there is no GPU.
 */
#include "nbgi_cuda.h"

extern "C" {
#include "adjoint.h"
#define NBG_ROW_LANES 1 /* the forward nest, one pixel per thread */
#include "kernel.h"
#define NBG_TMPL NBG_TMPL_DOUBLE
#include "tmpl_on.h"
#include "adjoint_tmpl.h"
#include "jvp_tmpl.h"
#include "tmpl_off.h"
#define NBG_TMPL NBG_TMPL_FLOAT
#include "tmpl_on.h"
#include "adjoint_tmpl.h"
#include "tmpl_off.h"
}

#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifndef NBG_LAUNCH
#define NBG_LAUNCH(kern, grid, block, ...) kern<<<(grid), (block)>>>(__VA_ARGS__)
#endif

#define NBG_BLOCK 128                 /* threads per block of the pixel kernels */
#define NBG_WARPS (NBG_BLOCK / 32)
#define NBG_RBLOCK 256                /* threads per block of the reduction kernel */
#define NBG_NFIX ((int)NBG_ADJ_FIXED) /* doubles in the fixed part of nbgi_adjacc */
#define NBG_CUDA_MAXACC NBGI_CUDA_MAXACC /* crystal-vector and wavelength gradients one thread can hold */
/* Occupancy hints: the least blocks of NBG_BLOCK threads an SM should hold for each pixel kernel (the adjoint's
 * 0: none, the compiler's choice of registers).  Measured on an H200 (bench-cuda, samples per second of device
 * time): the forward kernel left alone takes 168 (double) and 186 (float) registers, 3 and 2 blocks an SM; held to
 * 5 blocks (at most 102 registers, a few bytes spilled) heavy2048 runs 1.27x faster in double and 2.05x in float.
 * The adjoint (255 registers, spilling already) only lost: held to 3 or 4 blocks it ran 1.04x to 1.9x slower.
 *
 * The forward kernel comes in two builds, chosen by the samples a pixel takes.  Held to 5 blocks it spills its
 * loops' state (some 90 local loads and stores a pixel in double), which a pixel of few samples pays in full;
 * held to 4 (128 registers) it spills less and runs fewer threads, which the inner loop of many samples pays.
 * Measured on an H200 (2026-11-27, bench-cuda's section 5: cubic2048, device time per sample at 1, 4, 9, 16, 25,
 * 36 and 64 samples a pixel, in ps, 5 blocks against 4): double 70.7/48.2, 30.6/29.5, 25.8/25.7, 24.0/24.2,
 * 23.2/23.6, 22.7/23.2, 22.2/22.8; float 44.4/41.3, 22.8/23.8, 19.1/20.4, 17.9/19.2, 17.3/18.6, 17.0/18.3,
 * 16.6/17.9; heavy2048 (3000 samples) 0.126 s/0.139 in double, 0.099/0.114 in float.  So pixels of fewer than
 * NBG_LIGHT_SAMPLES_DOUBLE (12) samples in double and NBG_LIGHT_SAMPLES_FLOAT (2) in float take the 4-block build:
 * cubic4k's kernel (1 sample) 1.19 -> 0.78 ms in double and 0.72 -> 0.67 ms in float. */
#ifndef NBG_MINB_FWD
#define NBG_MINB_FWD 5
#endif
#ifndef NBG_MINB_FWD_LIGHT
#define NBG_MINB_FWD_LIGHT 4
#endif
#ifndef NBG_LIGHT_SAMPLES_DOUBLE
#define NBG_LIGHT_SAMPLES_DOUBLE 12
#endif
#ifndef NBG_LIGHT_SAMPLES_FLOAT
#define NBG_LIGHT_SAMPLES_FLOAT 2
#endif
#ifndef NBG_MINB_ADJ
#define NBG_MINB_ADJ 0
#endif
#if NBG_MINB_ADJ > 0
#define NBG_ADJ_BOUNDS __launch_bounds__(NBG_BLOCK, NBG_MINB_ADJ)
#else
#define NBG_ADJ_BOUNDS
#endif
/* The adjoint's crystal-vector gradients (9 a phi step and mosaic domain) are a thread's local memory, indexed at run
 * time.  The per-sample form (nbgi_pixel_adjoint) adds 9 of them, and the crystal size's 3 and default_F's 1, at every
 * sample; the tiled form (nbgi_pixel_adjoint_tiled: NBG_ADJ_TILE matrices' gradients in registers, added once a
 * subpixel) fewer than one such read-modify-write a sample in the heavy case (50 matrices, 27 sources), for a division
 * and a scattering vector more a tile and source.  ptxas (nvcc 13.0, sm_90, spill stores / loads a thread, bytes):
 * double 1588 / 1700 per sample, 388 / 600 in tiles of 2, 724 / 1132 in tiles of 4; float 780 / 932, 28 / 36, 244 /
 * 380.  Not yet timed on a GPU (2026-11-27: none was lent).  The tiled form is taken where the accumulators are many
 * (CAP above 16: more than one matrix, or many sources); with one matrix and few sources (CAP 16) the two forms do the
 * same memory work and the per-sample one keeps the forward's summation order.  NBG_ADJ_TILE=0 at build time turns
 * the tiled form off (to time one against the other). */
#define NBG_CUDA_TILED(cap) (NBG_ADJ_TILE > 0 && (cap) > 16)
#define NBG_ADJ_PPT 8                 /* pixels per thread of the adjoint kernel (at most) */
#define NBG_ADJ_WORK ((long)NBG_BLOCK * NBG_ADJ_PPT) /* work indices per block of the adjoint kernel */

typedef struct {
    int device;
    cudaEvent_t ev[2]; /* around the kernels of a call */
    float *img, *g;
    double *src, *abc, *F, *part, *sums;
    float *abc_f;          /* the crystal vectors rounded to float (the float kernels') */
    uint8_t *mask;
    nbgi_kpanel *panels;   /* the panel table (multi-panel detectors) */
    nbgi_kparams *views;   /* each panel's view, with device pointers */
    uint32_t *list;        /* the pixel list (nbg_experiment.pixels) */
    long *bstart;          /* panel-aligned blocks: block b's first work index (per-panel gradients) */
    nbgi_adjacc *tdir;     /* the tangent kernel's directions (a set per panel with panels), device pointers */
    double *tarr, *img_d, *tout; /* their abc and lam arrays; the image in double; the tangent images */
    size_t cap_img, cap_g, cap_src, cap_abc, cap_abc_f, cap_F, cap_part, cap_sums, cap_mask, cap_panels, cap_views,
        cap_list;
    size_t cap_bstart, cap_tdir, cap_tarr, cap_img_d, cap_tout;
} nbgi_cuda_state;

static int cuda_fail(nbg_ctx *ctx, cudaError_t e, const char *what)
{
    return nbgi_error(ctx, NBG_ECUDA, "CUDA %s failed: %s", what, cudaGetErrorString(e));
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

extern "C" int nbgi_cuda_init(nbg_ctx *ctx)
{
    int n = 0;
    const cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess || n == 0) {
        return nbgi_error(ctx, NBG_ENODEV, "no CUDA device (%s)", e != cudaSuccess ? cudaGetErrorString(e) : "none");
    }
    nbgi_cuda_state *st = (nbgi_cuda_state *)calloc(1, sizeof *st);
    if (st == NULL) {
        return nbgi_error(ctx, NBG_ENOMEM, "out of memory for the CUDA state");
    }
    cudaGetDevice(&st->device);
    cudaError_t ee;
    if ((ee = cudaEventCreate(&st->ev[0])) != cudaSuccess || (ee = cudaEventCreate(&st->ev[1])) != cudaSuccess) {
        free(st);
        return nbgi_error(ctx, NBG_ECUDA, "CUDA event creation failed: %s", cudaGetErrorString(ee));
    }
    ctx->cuda = st;
    return NBG_OK;
}

extern "C" void nbgi_cuda_release(nbg_ctx *ctx)
{
    nbgi_cuda_state *st = (nbgi_cuda_state *)ctx->cuda;
    if (st == NULL) {
        return;
    }
    cudaFree(st->img);
    cudaFree(st->g);
    cudaFree(st->src);
    cudaFree(st->abc);
    cudaFree(st->abc_f);
    cudaFree(st->F);
    cudaFree(st->part);
    cudaFree(st->sums);
    cudaFree(st->mask);
    cudaFree(st->panels);
    cudaFree(st->views);
    cudaFree(st->list);
    cudaFree(st->bstart);
    cudaFree(st->tdir);
    cudaFree(st->tarr);
    cudaFree(st->img_d);
    cudaFree(st->tout);
    cudaEventDestroy(st->ev[0]);
    cudaEventDestroy(st->ev[1]);
    free(st);
    ctx->cuda = NULL;
}

extern "C" int nbgi_cuda_describe(const nbg_ctx *ctx, nbg_device_info *info)
{
    const nbgi_cuda_state *st = (const nbgi_cuda_state *)ctx->cuda;
    cudaDeviceProp prop;
    int sms = 0, khz = 0, major = 0, minor = 0;
    if (cudaGetDeviceProperties(&prop, st->device) != cudaSuccess ||
        cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, st->device) != cudaSuccess ||
        cudaDeviceGetAttribute(&khz, cudaDevAttrClockRate, st->device) != cudaSuccess ||
        cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, st->device) != cudaSuccess ||
        cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, st->device) != cudaSuccess) {
        return NBG_ECUDA;
    }
    snprintf(info->name, sizeof info->name, "%.200s (compute %d.%d)", prop.name, major, minor);
    info->units = sms;
    info->clock_ghz = 1e-6 * khz;
    info->memory_gib = (double)prop.totalGlobalMem / (1024.0 * 1024.0 * 1024.0);
    /* FP64 and FP32 lanes per multiprocessor: the data-centre parts (6.0, 7.0, 8.0, 9.0, 10.0) have half as many
     * FP64 as FP32 lanes; the others 1/32 or 1/64 */
    int f32 = 0, f64 = 0;
    if (major == 9 || major == 10) {
        f32 = 128, f64 = 64;
    } else if ((major == 8 || major == 7 || major == 6) && minor == 0) {
        f32 = 64, f64 = 32;
    } else if (major >= 7) {
        f32 = 128, f64 = 2;
    }
    info->peak_gflops[NBG_DOUBLE] = 2.0 * f64 * sms * info->clock_ghz;
    info->peak_gflops[NBG_FLOAT] = 2.0 * f32 * sms * info->clock_ghz;
    return NBG_OK;
}

/* Copies the plan's arrays into the context's device buffers, makes room for the image, ncomp per-block partials
 * and their ncomp sums, and returns the device copy of k. */
static int upload(nbg_ctx *ctx, const nbgi_kparams *k, int ncomp, unsigned nblocks, nbgi_kparams *kd)
{
    nbgi_cuda_state *st = (nbgi_cuda_state *)ctx->cuda;
    *kd = *k;
    const size_t nsrc = (size_t)k->nsources * NBG_SRC_STRIDE, nabc = (size_t)k->nphi * k->nmos * 9;
    const size_t npix = (size_t)nbgi_nwalk(k); /* the image on the device: compact over a pixel list */
    cudaError_t e;
    kd->runs = NULL; /* the device walks the list itself, a thread a pixel */
    kd->nruns = 0;
    if (k->list != NULL) {
        if ((e = ensure((void **)&st->list, &st->cap_list, npix * sizeof(uint32_t))) != cudaSuccess ||
            (e = cudaMemcpy(st->list, k->list, npix * sizeof(uint32_t), cudaMemcpyHostToDevice)) != cudaSuccess) {
            return cuda_fail(ctx, e, "copy of the pixel list");
        }
        kd->list = st->list;
    }
    if ((e = ensure((void **)&st->src, &st->cap_src, nsrc * sizeof(double))) != cudaSuccess ||
        (e = ensure((void **)&st->abc, &st->cap_abc, nabc * sizeof(double))) != cudaSuccess ||
        (e = ensure((void **)&st->img, &st->cap_img, npix * sizeof(float))) != cudaSuccess ||
        (e = ensure((void **)&st->part, &st->cap_part, (size_t)ncomp * nblocks * sizeof(double))) != cudaSuccess ||
        (e = ensure((void **)&st->sums, &st->cap_sums, (size_t)ncomp * sizeof(double))) != cudaSuccess) {
        return cuda_fail(ctx, e, "device allocation");
    }
    if ((e = cudaMemcpy(st->src, k->src, nsrc * sizeof(double), cudaMemcpyHostToDevice)) != cudaSuccess ||
        (e = cudaMemcpy(st->abc, k->abc, nabc * sizeof(double), cudaMemcpyHostToDevice)) != cudaSuccess) {
        return cuda_fail(ctx, e, "copy of the sources and crystal vectors");
    }
    kd->src = st->src;
    kd->abc = st->abc;
    if (k->abc_f != NULL) { /* the float kernels read them (nbgi_matrix) */
        if ((e = ensure((void **)&st->abc_f, &st->cap_abc_f, nabc * sizeof(float))) != cudaSuccess ||
            (e = cudaMemcpy(st->abc_f, k->abc_f, nabc * sizeof(float), cudaMemcpyHostToDevice)) != cudaSuccess) {
            return cuda_fail(ctx, e, "copy of the crystal vectors in float");
        }
        kd->abc_f = st->abc_f;
    }
    if (k->F != NULL) {
        const size_t nF = (size_t)k->nh * k->nk * k->nl;
        if ((e = ensure((void **)&st->F, &st->cap_F, nF * sizeof(double))) != cudaSuccess ||
            (e = cudaMemcpy(st->F, k->F, nF * sizeof(double), cudaMemcpyHostToDevice)) != cudaSuccess) {
            return cuda_fail(ctx, e, "structure-factor copy");
        }
        kd->F = st->F;
    }
    if (k->mask != NULL) {
        const size_t nall = (size_t)k->npix;
        if ((e = ensure((void **)&st->mask, &st->cap_mask, nall)) != cudaSuccess ||
            (e = cudaMemcpy(st->mask, k->mask, nall, cudaMemcpyHostToDevice)) != cudaSuccess) {
            return cuda_fail(ctx, e, "mask copy");
        }
        kd->mask = st->mask;
    }
    if (k->npanels > 0) {
        /* the panels' views, built here with the device pointers (the view's mask is the device mask from the
         * panel's offset), and the table the threads search for their panel */
        const size_t np = (size_t)k->npanels;
        nbgi_kparams *hv = (nbgi_kparams *)malloc(np * sizeof *hv);
        if (hv == NULL) {
            return nbgi_error(ctx, NBG_ENOMEM, "out of memory for %zu panel views", np);
        }
        for (size_t i = 0; i < np; ++i) {
            nbgi_panel_view(kd, (int)i, &hv[i]); /* kd->panels is still the host table */
        }
        if ((e = ensure((void **)&st->panels, &st->cap_panels, np * sizeof(nbgi_kpanel))) != cudaSuccess ||
            (e = ensure((void **)&st->views, &st->cap_views, np * sizeof(nbgi_kparams))) != cudaSuccess ||
            (e = cudaMemcpy(st->panels, k->panels, np * sizeof(nbgi_kpanel), cudaMemcpyHostToDevice)) !=
                cudaSuccess ||
            (e = cudaMemcpy(st->views, hv, np * sizeof(nbgi_kparams), cudaMemcpyHostToDevice)) != cudaSuccess) {
            free(hv);
            return cuda_fail(ctx, e, "copy of the panels");
        }
        free(hv);
        kd->panels = st->panels;
    }
    return NBG_OK;
}

/* The parameters that render image pixel i and its (f, s) within them: the single detector's, or (MULTI) the view
 * of the panel holding it, found by a binary search over the panels' offsets. */
template <int MULTI>
__device__ static inline const nbgi_kparams *pixel_params(const nbgi_kparams *p, const nbgi_kparams *views, long i,
                                                         int *f, int *s, int *panel)
{
    if (!MULTI) {
        *f = (int)(i % p->fpixels);
        *s = (int)(i / p->fpixels);
        *panel = 0;
        return p;
    }
    const int k = nbgi_panel_of_pixel(p, i);
    const nbgi_kpanel *q = p->panels + k;
    const long j = i - q->offset;
    *f = (int)(j % q->fpixels);
    *s = (int)(j / q->fpixels);
    *panel = k;
    return views + k;
}

/* Sums v over the warp in a fixed order (a shuffle tree); the result is valid in lane 0.  Every thread of the
 * block calls it. */
__device__ static inline double warp_sum(double v)
{
    for (int d = 16; d > 0; d >>= 1) {
        v += __shfl_down_sync(0xffffffffu, v, d);
    }
    return v;
}

/* Writes the block's sums of ncomp per-thread values, component c at part[c * nblocks + block]: each warp sums
 * its lanes (warp_sum), then thread c adds the warps' sums in warp order.  sh holds ncomp * NBG_WARPS doubles. */
template <typename Get>
__device__ static inline void block_partials(Get get, int ncomp, double *sh, double *part, unsigned nblocks)
{
    const int lane = (int)threadIdx.x & 31, warp = (int)threadIdx.x >> 5;
    for (int c = 0; c < ncomp; ++c) {
        const double v = warp_sum(get(c));
        if (lane == 0) {
            sh[c * NBG_WARPS + warp] = v;
        }
    }
    __syncthreads();
    for (int c = (int)threadIdx.x; c < ncomp; c += NBG_BLOCK) {
        double s = 0;
        for (int w = 0; w < NBG_WARPS; ++w) {
            s += sh[c * NBG_WARPS + w];
        }
        part[(size_t)c * nblocks + blockIdx.x] = s;
    }
}

/* out[c] = sum over blocks b of part[c * nblocks + b], one block per component: each thread sums a fixed stride
 * of blocks in order, then a fixed tree over the threads. */
__global__ void nbgi_reduce_kernel(const double *part, unsigned nblocks, double *out)
{
    __shared__ double sh[NBG_RBLOCK];
    const size_t c = blockIdx.x;
    double v = 0;
    for (unsigned b = threadIdx.x; b < nblocks; b += NBG_RBLOCK) {
        v += part[c * nblocks + b];
    }
    sh[threadIdx.x] = v;
    __syncthreads();
    for (int w = NBG_RBLOCK / 2; w > 0; w >>= 1) {
        if ((int)threadIdx.x < w) {
            sh[threadIdx.x] += sh[threadIdx.x + w];
        }
        __syncthreads();
    }
    if (threadIdx.x == 0) {
        out[c] = sh[0];
    }
}

template <int FLOAT, int MULTI, int MINB>
__global__ void __launch_bounds__(NBG_BLOCK, MINB)
    nbgi_forward_kernel(nbgi_kparams p, const nbgi_kparams *views, float *img, double *part, unsigned nblocks)
{
    __shared__ double sh[2 * NBG_WARPS];
    /* thread t: image pixel t, or with a pixel list its entry t (the image then compact: img[t]) */
    const long nwork = p.list != NULL ? p.nlist : p.npix;
    const long t = (long)blockIdx.x * NBG_BLOCK + threadIdx.x;
    double sums[2] = {0, 0}; /* solid angle, interpolation fallbacks */
    if (t < nwork) {
        const long i = p.list != NULL ? (long)p.list[t] : t;
        int f, s, panel;
        const nbgi_kparams *pp = pixel_params<MULTI>(&p, views, i, &f, &s, &panel);
        float v = 0.0f; /* 0 where the pixel is inactive */
        if (FLOAT) {
            nbgi_pixstat_f ps = {0, 0};
            nbgi_row_f(pp, s, f, 1, &v, &ps, NULL, NULL);
            sums[0] = ps.omega_sum;
            sums[1] = (double)ps.oor;
        } else {
            nbgi_pixstat_d ps = {0, 0};
            nbgi_row_d(pp, s, f, 1, &v, &ps, NULL, NULL);
            sums[0] = ps.omega_sum;
            sums[1] = (double)ps.oor;
        }
        img[t] = v;
    }
    block_partials([&](int c) { return sums[c]; }, 2, sh, part, nblocks);
}

/* The adjoint pixel kernel: CAP bounds the per-thread crystal-vector and wavelength accumulators (nvar of them
 * are used), so that a thread's local memory is no larger than the experiment needs. */
template <int FLOAT, int CAP, int MULTI>
__global__ void NBG_ADJ_BOUNDS nbgi_adjoint_kernel(nbgi_kparams p, const nbgi_kparams *views, const float *g,
                                                  float *img, double *part, unsigned nblocks, int nvar,
                                                  const long *bstart)
{
    __shared__ double sh[(NBG_NFIX + CAP + NBG_ADJ_DET) * NBG_WARPS];
    double local[CAP];
    for (int c = 0; c < nvar; ++c) {
        local[c] = 0;
    }
    nbgi_adjacc acc;
    memset(&acc, 0, sizeof acc);
    acc.abc = local;
    acc.lam = local + p.nphi * p.nmos * 9;
    /* thread t: image pixel t, or with a pixel list its entry t (g and the image then compact: g[t], img[t]); with
     * bstart (MULTI, per-panel gradients) the blocks are aligned to the panels: block b runs the work indices
     * [bstart[b], bstart[b + 1]), all of one panel, and its partials carry that panel's own detector gradients */
    const long nwork = p.list != NULL ? p.nlist : p.npix;
    const int aligned = MULTI && bstart != NULL;
    /* block b's work indices: [b NBG_ADJ_WORK, (b + 1) NBG_ADJ_WORK), or [bstart[b], bstart[b + 1]); thread x takes
     * x, x + NBG_BLOCK, ... of them (NBG_ADJ_PPT at most), so that the block's reduction is paid once per
     * NBG_ADJ_PPT pixels.  Which thread and block sum a pixel depends on the image alone: the same bits on any GPU. */
    const long t0 = aligned ? bstart[blockIdx.x] : (long)blockIdx.x * NBG_ADJ_WORK;
    const long tend = aligned ? bstart[blockIdx.x + 1] : (t0 + NBG_ADJ_WORK < nwork ? t0 + NBG_ADJ_WORK : nwork);
    double mine[NBG_ADJ_DET];
    for (int c = 0; c < NBG_ADJ_DET; ++c) {
        mine[c] = 0;
    }
    for (long t = t0 + (long)threadIdx.x; t < tend; t += NBG_BLOCK) {
        const long i = p.list != NULL ? (long)p.list[t] : t;
        int f, s, panel;
        const nbgi_kparams *pp = pixel_params<MULTI>(&p, views, i, &f, &s, &panel);
        double *det = (double *)&acc, before[NBG_ADJ_DET];
        if (MULTI) {
            for (int c = 0; c < NBG_ADJ_DET; ++c) {
                before[c] = det[c];
                det[c] = 0;
            }
        }
        float v = 0.0f;
        if (nbgi_pixel_active(pp, f, s)) {
            v = NBG_CUDA_TILED(CAP) ? (FLOAT ? (float)nbgi_pixel_adjoint_tiled_f(pp, f, s, g[t], &acc)
                                             : (float)nbgi_pixel_adjoint_tiled_d(pp, f, s, (double)g[t], &acc))
                : FLOAT ? (float)nbgi_pixel_adjoint_f(pp, f, s, g[t], &acc)
                        : (float)nbgi_pixel_adjoint_d(pp, f, s, (double)g[t], &acc);
        }
        img[t] = v;
        if (MULTI) {
            /* the pixel's detector gradients are on its panel's vectors: kept as the panel's own (mine), and
             * carried to the plane's */
            double px[NBG_ADJ_DET];
            for (int c = 0; c < NBG_ADJ_DET; ++c) {
                px[c] = det[c];
                det[c] = before[c];
                mine[c] += px[c];
            }
            nbgi_panel_fold(p.panels + panel, px, det);
        }
    }
    const double *fixed = (const double *)&acc;
    const int nfv = NBG_NFIX + nvar;
    block_partials([&](int c) { return c < NBG_NFIX ? fixed[c] : c < nfv ? local[c - NBG_NFIX] : mine[c - nfv]; },
                   nfv + (aligned ? NBG_ADJ_DET : 0), sh, part, nblocks);
}

/* The tangent kernel (forward mode, always in double: the CPU's too): thread w takes work index w (image pixel w,
 * or the list's entry w) and writes its value, in float and (img_d) in double, and its nt tangents, direction j at
 * out[j nwork + w]: no sums, so no reduction.  t holds the nt directions, or (MULTI) nt for each panel, carried to
 * its vectors on the host (nbgi_cuda_jvp). */
template <int MULTI>
__global__ void nbgi_jvp_kernel(nbgi_kparams p, const nbgi_kparams *views, const nbgi_adjacc *t, int nt, float *img,
                                double *img_d, double *out)
{
    const long nwork = p.list != NULL ? p.nlist : p.npix;
    const long w = (long)blockIdx.x * NBG_BLOCK + threadIdx.x;
    if (w >= nwork) {
        return;
    }
    const long i = p.list != NULL ? (long)p.list[w] : w;
    int f, s, panel;
    const nbgi_kparams *pp = pixel_params<MULTI>(&p, views, i, &f, &s, &panel);
    double dS[NBG_JVP_MAX], S = 0;
    if (nbgi_pixel_active(pp, f, s)) {
        S = nbgi_pixel_jvp_d(pp, f, s, MULTI ? t + (size_t)panel * nt : t, nt, dS);
    } else {
        for (int j = 0; j < nt; ++j) {
            dS[j] = 0;
        }
    }
    img[w] = (float)S;
    if (img_d != NULL) {
        img_d[w] = S;
    }
    for (int j = 0; j < nt; ++j) {
        out[(size_t)j * nwork + w] = dS[j];
    }
}

/* Copies a device image (compact over a pixel list) into the host's: with a list, the listed pixels' values
 * scattered into it and every other pixel 0. */
template <typename T>
static int copy_image(nbg_ctx *ctx, const nbgi_kparams *k, const T *dev, T *host)
{
    const size_t npix = (size_t)nbgi_nwalk(k);
    cudaError_t e;
    if (k->list == NULL) {
        e = cudaMemcpy(host, dev, npix * sizeof(T), cudaMemcpyDeviceToHost);
        return e == cudaSuccess ? NBG_OK : cuda_fail(ctx, e, "copy of the image");
    }
    T *tmp = (T *)malloc(npix * sizeof(T));
    if (tmp == NULL) {
        return nbgi_error(ctx, NBG_ENOMEM, "out of memory for the pixel list's values");
    }
    if ((e = cudaMemcpy(tmp, dev, npix * sizeof(T), cudaMemcpyDeviceToHost)) != cudaSuccess) {
        free(tmp);
        return cuda_fail(ctx, e, "copy of the image");
    }
    memset(host, 0, sizeof(T) * (size_t)k->npix);
    for (size_t t = 0; t < npix; ++t) {
        host[k->list[t]] = tmp[t];
    }
    free(tmp);
    return NBG_OK;
}

/* Waits for the call's kernels (queued since start()); times[1] receives their device time. */
static int wait_kernels(nbg_ctx *ctx, const char *what, double *times)
{
    nbgi_cuda_state *st = (nbgi_cuda_state *)ctx->cuda;
    float ms = 0;
    cudaError_t e;
    if ((e = cudaEventRecord(st->ev[1], 0)) != cudaSuccess || (e = cudaEventSynchronize(st->ev[1])) != cudaSuccess) {
        return cuda_fail(ctx, e, what);
    }
    cudaEventElapsedTime(&ms, st->ev[0], st->ev[1]);
    times[1] = 1e-3 * ms;
    return NBG_OK;
}

/* After the pixel kernel: launches the reduction of ncomp components, waits, copies the image and the sums back;
 * times[1] receives the device time of both kernels, times[2] the copies. */
static int finish(nbg_ctx *ctx, const nbgi_kparams *k, unsigned nblocks, int ncomp, float *image, double *sums,
                  const char *what, double *times)
{
    nbgi_cuda_state *st = (nbgi_cuda_state *)ctx->cuda;
    cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess) {
        return cuda_fail(ctx, e, what);
    }
    NBG_LAUNCH(nbgi_reduce_kernel, ncomp, NBG_RBLOCK, st->part, nblocks, st->sums);
    if ((e = cudaGetLastError()) != cudaSuccess) {
        return cuda_fail(ctx, e, "reduction kernel launch");
    }
    const int wrc = wait_kernels(ctx, what, times);
    if (wrc != NBG_OK) {
        return wrc;
    }
    const double t0 = nbgi_now();
    const int rc = copy_image(ctx, k, st->img, image);
    if (rc != NBG_OK) {
        return rc;
    }
    if ((e = cudaMemcpy(sums, st->sums, (size_t)ncomp * sizeof(double), cudaMemcpyDeviceToHost)) != cudaSuccess) {
        return cuda_fail(ctx, e, "copy of the sums");
    }
    times[2] = nbgi_now() - t0;
    return NBG_OK;
}

/* Marks the start of a call's kernels; times[0] receives the host time spent since t0 (the uploads). */
static int start(nbg_ctx *ctx, double t0, double *times)
{
    nbgi_cuda_state *st = (nbgi_cuda_state *)ctx->cuda;
    times[0] = nbgi_now() - t0;
    const cudaError_t e = cudaEventRecord(st->ev[0], 0);
    return e == cudaSuccess ? NBG_OK : cuda_fail(ctx, e, "event record");
}

/* The forward kernel of a precision: the build for panels or one plane, held to the blocks an SM that suit light
 * pixels (few samples) or heavy ones (see NBG_MINB_FWD). */
template <int FLOAT>
static void launch_forward(const nbgi_kparams &kd, nbgi_cuda_state *st, unsigned nblocks, int multi, int light)
{
    void (*kern)(nbgi_kparams, const nbgi_kparams *, float *, double *, unsigned) =
        multi ? (light ? nbgi_forward_kernel<FLOAT, 1, NBG_MINB_FWD_LIGHT>
                       : nbgi_forward_kernel<FLOAT, 1, NBG_MINB_FWD>)
              : (light ? nbgi_forward_kernel<FLOAT, 0, NBG_MINB_FWD_LIGHT>
                       : nbgi_forward_kernel<FLOAT, 0, NBG_MINB_FWD>);
    NBG_LAUNCH(kern, nblocks, NBG_BLOCK, kd, st->views, st->img, st->part, nblocks);
}

extern "C" int nbgi_cuda_forward(nbg_ctx *ctx, const nbgi_kparams *k, int use_float, float *image, double *omega_sum,
                                long *oor, double times[3])
{
    const double t0 = nbgi_now();
    nbgi_cuda_state *st = (nbgi_cuda_state *)ctx->cuda;
    const size_t npix = (size_t)nbgi_nwalk(k); /* a thread a pixel: the image's, or the list's */
    const unsigned nblocks = (unsigned)((npix + NBG_BLOCK - 1) / NBG_BLOCK);
    nbgi_kparams kd;
    int rc = upload(ctx, k, 2, nblocks, &kd);
    if (rc == NBG_OK) {
        rc = start(ctx, t0, times);
    }
    if (rc != NBG_OK) {
        return rc;
    }
    const int multi = k->npanels > 0;
    const double per_pixel = nbgi_samples(k) / (double)(npix > 0 ? npix : 1);
    if (use_float) {
        launch_forward<1>(kd, st, nblocks, multi, per_pixel < NBG_LIGHT_SAMPLES_FLOAT);
    } else {
        launch_forward<0>(kd, st, nblocks, multi, per_pixel < NBG_LIGHT_SAMPLES_DOUBLE);
    }
    double sums[2];
    rc = finish(ctx, k, nblocks, 2, image, sums, "forward kernel", times);
    if (rc == NBG_OK) {
        *omega_sum = sums[0];
        *oor = (long)sums[1];
    }
    return rc;
}

template <int FLOAT, int MULTI>
static void launch_adjoint(const nbgi_kparams &kd, nbgi_cuda_state *st, unsigned nblocks, int nvar,
                           const long *bstart)
{
    void (*kern)(nbgi_kparams, const nbgi_kparams *, const float *, float *, double *, unsigned, int, const long *) =
        nvar <= 16 ? nbgi_adjoint_kernel<FLOAT, 16, MULTI>
                   : nvar <= 128 ? nbgi_adjoint_kernel<FLOAT, 128, MULTI>
                                 : nbgi_adjoint_kernel<FLOAT, NBG_CUDA_MAXACC, MULTI>;
    NBG_LAUNCH(kern, nblocks, NBG_BLOCK, kd, st->views, st->g, st->img, st->part, nblocks, nvar, bstart);
}

/* Blocks aligned to the panels (per-panel gradients): each panel's work indices (its pixels, or its entries of the
 * pixel list) cut into blocks of at most NBG_ADJ_WORK; *bs (malloc'd) the nblocks + 1 block starts, bpanel each
 * block's panel. */
static int panel_blocks(nbg_ctx *ctx, const nbgi_kparams *k, long **bs, int **bpanel, unsigned *nblocks)
{
    const long nwork = nbgi_nwalk(k);
    const size_t cap = (size_t)(nwork / NBG_ADJ_WORK) + (size_t)k->npanels + 2;
    *bs = (long *)malloc(cap * sizeof(long));
    *bpanel = (int *)malloc(cap * sizeof(int));
    if (*bs == NULL || *bpanel == NULL) {
        free(*bs);
        free(*bpanel);
        *bs = NULL;
        *bpanel = NULL;
        return nbgi_error(ctx, NBG_ENOMEM, "out of memory for %zu blocks", cap);
    }
    unsigned n = 0;
    long t = 0;
    for (int q = 0; q < k->npanels; ++q) {
        const long pend = q + 1 < k->npanels ? k->panels[q + 1].offset : k->npix; /* image index */
        long end = pend;
        if (k->list != NULL) {
            end = t;
            while (end < nwork && (long)k->list[end] < pend) {
                ++end;
            }
        }
        while (t < end) {
            (*bs)[n] = t;
            (*bpanel)[n++] = q;
            t = t + NBG_ADJ_WORK < end ? t + NBG_ADJ_WORK : end;
        }
    }
    (*bs)[n] = nwork;
    *nblocks = n;
    return NBG_OK;
}

extern "C" int nbgi_cuda_adjoint(nbg_ctx *ctx, const nbgi_kparams *k, int use_float, const float *dLdI, float *image,
                                double *out, int ncomp, double *panel_out, double times[3])
{
    const double t0 = nbgi_now();
    const int nvar = ncomp - NBG_NFIX;
    if (nvar < 0 || nvar > NBG_CUDA_MAXACC) {
        return nbgi_error(ctx, NBG_EUNSUP, "the CUDA adjoint holds at most %d crystal-vector and wavelength "
                         "gradients per thread (this experiment has %d: phi steps x mosaic domains x 9 + sources)",
                         NBG_CUDA_MAXACC, nvar);
    }
    nbgi_cuda_state *st = (nbgi_cuda_state *)ctx->cuda;
    const size_t npix = (size_t)nbgi_nwalk(k); /* NBG_ADJ_PPT pixels a thread: the image's, or the list's */
    unsigned nblocks = (unsigned)((npix + NBG_ADJ_WORK - 1) / NBG_ADJ_WORK);
    long *bs = NULL;
    int *bpanel = NULL;
    const int aligned = panel_out != NULL && k->npanels > 0;
    int rc = aligned ? panel_blocks(ctx, k, &bs, &bpanel, &nblocks) : NBG_OK;
    nbgi_kparams kd;
    if (rc == NBG_OK) {
        rc = upload(ctx, k, ncomp + (aligned ? NBG_ADJ_DET : 0), nblocks, &kd);
    }
    cudaError_t e;
    if (rc == NBG_OK && aligned &&
        ((e = ensure((void **)&st->bstart, &st->cap_bstart, (nblocks + 1) * sizeof(long))) != cudaSuccess ||
         (e = cudaMemcpy(st->bstart, bs, (nblocks + 1) * sizeof(long), cudaMemcpyHostToDevice)) != cudaSuccess)) {
        rc = cuda_fail(ctx, e, "copy of the panel blocks");
    }
    free(bs);
    if (rc != NBG_OK) {
        free(bpanel);
        return rc;
    }
    const long *bstart = aligned ? st->bstart : NULL;
    float *gl = NULL; /* dL/dI at the listed pixels, compact */
    if (k->list != NULL) {
        gl = (float *)malloc(npix * sizeof(float));
        if (gl == NULL) {
            free(bpanel);
            return nbgi_error(ctx, NBG_ENOMEM, "out of memory for dL/dI at the listed pixels");
        }
        for (size_t t = 0; t < npix; ++t) {
            gl[t] = dLdI[k->list[t]];
        }
    }
    if ((e = ensure((void **)&st->g, &st->cap_g, npix * sizeof(float))) != cudaSuccess ||
        (e = cudaMemcpy(st->g, gl != NULL ? gl : dLdI, npix * sizeof(float), cudaMemcpyHostToDevice)) !=
            cudaSuccess) {
        free(gl);
        free(bpanel);
        return cuda_fail(ctx, e, "copy of dL/dI");
    }
    free(gl);
    if ((rc = start(ctx, t0, times)) != NBG_OK) {
        free(bpanel);
        return rc;
    }
    if (use_float && k->npanels > 0) {
        launch_adjoint<1, 1>(kd, st, nblocks, nvar, bstart);
    } else if (use_float) {
        launch_adjoint<1, 0>(kd, st, nblocks, nvar, NULL);
    } else if (k->npanels > 0) {
        launch_adjoint<0, 1>(kd, st, nblocks, nvar, bstart);
    } else {
        launch_adjoint<0, 0>(kd, st, nblocks, nvar, NULL);
    }
    rc = finish(ctx, k, nblocks, ncomp, image, out, "adjoint kernel", times);
    if (rc == NBG_OK && aligned) {
        /* each panel's own detector gradients: its blocks' partials (components ncomp on), summed in block order */
        double *pp = (double *)malloc((size_t)NBG_ADJ_DET * nblocks * sizeof(double));
        if (pp == NULL) {
            rc = nbgi_error(ctx, NBG_ENOMEM, "out of memory for the panels' partial sums");
        } else if ((e = cudaMemcpy(pp, st->part + (size_t)ncomp * nblocks,
                                   (size_t)NBG_ADJ_DET * nblocks * sizeof(double), cudaMemcpyDeviceToHost)) !=
                   cudaSuccess) {
            rc = cuda_fail(ctx, e, "copy of the panels' partial sums");
        } else {
            memset(panel_out, 0, sizeof(double) * NBG_ADJ_DET * (size_t)k->npanels);
            for (unsigned b = 0; b < nblocks; ++b) {
                for (int c = 0; c < NBG_ADJ_DET; ++c) {
                    panel_out[(size_t)bpanel[b] * NBG_ADJ_DET + c] += pp[(size_t)c * nblocks + b];
                }
            }
        }
        free(pp);
    }
    free(bpanel);
    return rc;
}

extern "C" int nbgi_cuda_jvp(nbg_ctx *ctx, const nbgi_kparams *k, const nbgi_adjacc *t, int nt, const double *ptan,
                            double *out, float *image, double *image_d, double times[3])
{
    const double t0 = nbgi_now();
    nbgi_cuda_state *st = (nbgi_cuda_state *)ctx->cuda;
    const size_t nw = (size_t)nbgi_nwalk(k); /* a thread a pixel: the image's, or the list's */
    const unsigned nblocks = (unsigned)((nw + NBG_BLOCK - 1) / NBG_BLOCK);
    const size_t nabc = (size_t)k->nphi * k->nmos * 9, nsrc = (size_t)k->nsources, per = nabc + nsrc;
    const size_t nsets = k->npanels > 0 ? (size_t)k->npanels : 1;
    nbgi_kparams kd;
    int rc = upload(ctx, k, 1, 1, &kd);
    if (rc != NBG_OK) {
        return rc;
    }
    cudaError_t e;
    if ((e = ensure((void **)&st->tarr, &st->cap_tarr, (size_t)nt * per * sizeof(double))) != cudaSuccess ||
        (e = ensure((void **)&st->tdir, &st->cap_tdir, nsets * (size_t)nt * sizeof(nbgi_adjacc))) != cudaSuccess ||
        (e = ensure((void **)&st->tout, &st->cap_tout, (size_t)nt * nw * sizeof(double))) != cudaSuccess ||
        (image_d != NULL && (e = ensure((void **)&st->img_d, &st->cap_img_d, nw * sizeof(double))) != cudaSuccess)) {
        return cuda_fail(ctx, e, "device allocation for the tangents");
    }
    /* the directions: their crystal-vector and wavelength tangents on the device, and the fixed parts with those
     * pointers; with panels a set per panel, its detector tangents carried to the panel's vectors (and its own
     * motion added, ptan), as the CPU's rows do */
    nbgi_adjacc *hd = (nbgi_adjacc *)calloc(nsets * (size_t)(nt > 0 ? nt : 1), sizeof(nbgi_adjacc));
    if (hd == NULL) {
        return nbgi_error(ctx, NBG_ENOMEM, "out of memory for %d tangent directions", nt);
    }
    for (int j = 0; j < nt; ++j) {
        double *dev = st->tarr + (size_t)j * per;
        if ((e = cudaMemcpy(dev, t[j].abc, nabc * sizeof(double), cudaMemcpyHostToDevice)) != cudaSuccess ||
            (e = cudaMemcpy(dev + nabc, t[j].lam, nsrc * sizeof(double), cudaMemcpyHostToDevice)) != cudaSuccess) {
            free(hd);
            return cuda_fail(ctx, e, "copy of the tangent directions");
        }
        for (size_t q = 0; q < nsets; ++q) {
            nbgi_adjacc *d = hd + q * (size_t)nt + j;
            memcpy(d, &t[j], NBG_ADJ_FIXED * sizeof(double));
            if (k->npanels > 0) {
                nbgi_panel_tangent(&k->panels[q], (const double *)&t[j], (double *)d);
                if (ptan != NULL) {
                    const double *own = ptan + ((size_t)j * k->npanels + q) * NBG_ADJ_DET;
                    for (int c = 0; c < NBG_ADJ_DET; ++c) {
                        ((double *)d)[c] += own[c];
                    }
                }
            }
            d->abc = dev;
            d->lam = dev + nabc;
        }
    }
    e = cudaMemcpy(st->tdir, hd, nsets * (size_t)nt * sizeof(nbgi_adjacc), cudaMemcpyHostToDevice);
    free(hd);
    if (e != cudaSuccess) {
        return cuda_fail(ctx, e, "copy of the tangent directions");
    }
    if ((rc = start(ctx, t0, times)) != NBG_OK) {
        return rc;
    }
    double *img_d = image_d != NULL ? st->img_d : NULL;
    if (k->npanels > 0) {
        NBG_LAUNCH(nbgi_jvp_kernel<1>, nblocks, NBG_BLOCK, kd, st->views, st->tdir, nt, st->img, img_d, st->tout);
    } else {
        NBG_LAUNCH(nbgi_jvp_kernel<0>, nblocks, NBG_BLOCK, kd, st->views, st->tdir, nt, st->img, img_d, st->tout);
    }
    if ((e = cudaGetLastError()) != cudaSuccess) {
        return cuda_fail(ctx, e, "tangent kernel launch");
    }
    if ((rc = wait_kernels(ctx, "tangent kernel", times)) != NBG_OK) {
        return rc;
    }
    const double t1 = nbgi_now();
    rc = copy_image(ctx, k, st->img, image);
    if (rc == NBG_OK && image_d != NULL) {
        rc = copy_image(ctx, k, st->img_d, image_d);
    }
    if (rc == NBG_OK && nt > 0 &&
        (e = cudaMemcpy(out, st->tout, (size_t)nt * nw * sizeof(double), cudaMemcpyDeviceToHost)) != cudaSuccess) {
        rc = cuda_fail(ctx, e, "copy of the tangent images");
    }
    times[2] = nbgi_now() - t1;
    return rc;
}
