/*
 * cuda_runtime.h -- a test-only stand-in for the CUDA runtime that runs CUDA kernels on the CPU, so that the
 * backend's own code (cuda/backend.cu: launches, indexing, block reductions, device buffers) is exercised by
 * `make test` on machines without a GPU.  tests/test-cuda.c is linked against it as build/tests/test-cuda-emu.
 *
 * It is compiled by the host C++ compiler with -DNBG_CUDA_EMU and -Itests/cudaemu, which makes backend.cu's
 * `#include <cuda_runtime.h>` find this file.  What it models:
 *   - a launch runs its blocks one after another; the threads of a block are fibers on one OS thread (started
 *     with makecontext, then switched with _setjmp/_longjmp, which make no system call) switched at every
 *     __syncthreads() and warp shuffle, in a different shuffled order in every round between barriers, so code that
 *     reads shared memory that no barrier orders after its write gives a wrong answer here too (tests/test-cudaemu.cc
 *     checks that it does);
 *   - __shared__ variables are static storage (one block runs at a time), threadIdx and blockIdx are set before
 *     each switch;
 *   - a __syncthreads() reached by some threads of a block while others have returned (a divergent barrier) makes
 *     the launch fail with cudaErrorLaunchFailure, as compute-sanitizer's synccheck would report;
 *   - device memory is host memory from cudaMalloc (malloc); cudaMemcpy copies.
 * What it cannot model: the device's own arithmetic (fused multiply-adds, its sin/exp), local-memory and register
 * limits, occupancy, timing, or a kernel that reads host memory through a pointer it should not have.  Those need a
 * GPU (tests/test-cuda.c built by nvcc as build/tests/test-cuda).
 */
#ifndef NBG_CUDA_EMU_RUNTIME_H
#define NBG_CUDA_EMU_RUNTIME_H

#include <setjmp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <ucontext.h>

#define __global__
#define __device__
#define __launch_bounds__(...) /* occupancy hints: nothing to the emulator */
#define __host__
#define __shared__ static
#define __forceinline__ inline

typedef enum {
    cudaSuccess = 0,
    cudaErrorInvalidValue = 1,
    cudaErrorMemoryAllocation = 2,
    cudaErrorNoDevice = 100,
    cudaErrorLaunchFailure = 719
} cudaError_t;

typedef enum {
    cudaMemcpyHostToHost = 0,
    cudaMemcpyHostToDevice = 1,
    cudaMemcpyDeviceToHost = 2,
    cudaMemcpyDeviceToDevice = 3
} cudaMemcpyKind;

struct dim3 {
    unsigned x, y, z;
    dim3(unsigned a = 1, unsigned b = 1, unsigned c = 1) : x(a), y(b), z(c) {}
};

namespace nbgi_emu {
enum { MAXTHREADS = 1024, STACK = 256 * 1024 };
enum { READY = 0, BARRIER = 1, DONE = 2 };

struct state {
    dim3 tid, bid, bdim, gdim;
    ucontext_t sched;
    ucontext_t fib[MAXTHREADS];
    jmp_buf sched_jb, fib_jb[MAXTHREADS];
    int started[MAXTHREADS];
    int order[MAXTHREADS];
    int status[MAXTHREADS];
    char *stacks;
    int cur;
    void (*body)(void *);
    void *arg;
    cudaError_t last;
    uint64_t exch[MAXTHREADS]; /* warp-shuffle exchange slots */
};

inline state &st()
{
    static state s;
    return s;
}

inline void entry()
{
    state &s = st();
    s.body(s.arg);
    s.status[s.cur] = DONE;
    _longjmp(s.sched_jb, 1); /* never returns: the fiber's stack is abandoned */
}

inline void barrier()
{
    state &s = st();
    s.status[s.cur] = BARRIER;
    if (_setjmp(s.fib_jb[s.cur]) == 0) {
        _longjmp(s.sched_jb, 1);
    }
}

/* Runs fiber t until its next barrier or its end. */
inline void resume(int t)
{
    state &s = st();
    s.cur = t;
    s.tid = dim3((unsigned)t, 0, 0);
    if (_setjmp(s.sched_jb) == 0) {
        if (!s.started[t]) {
            s.started[t] = 1;
            swapcontext(&s.sched, &s.fib[t]);
        } else {
            _longjmp(s.fib_jb[t], 1);
        }
    }
}

/* Runs body(arg) as a grid of grid.x blocks of block.x threads. */
inline cudaError_t launch(dim3 grid, dim3 block, void (*body)(void *), void *arg)
{
    state &s = st();
    const int n = (int)block.x;
    if (n < 1 || n > MAXTHREADS || grid.x < 1 || block.y != 1 || block.z != 1 || grid.y != 1 || grid.z != 1) {
        return s.last = cudaErrorInvalidValue;
    }
    if (s.stacks == NULL && (s.stacks = (char *)malloc((size_t)MAXTHREADS * STACK)) == NULL) {
        return s.last = cudaErrorMemoryAllocation;
    }
    s.body = body;
    s.arg = arg;
    s.bdim = block;
    s.gdim = grid;
    for (unsigned b = 0; b < grid.x; ++b) {
        s.bid = dim3(b, 0, 0);
        for (int t = 0; t < n; ++t) {
            getcontext(&s.fib[t]);
            s.fib[t].uc_stack.ss_sp = s.stacks + (size_t)t * STACK;
            s.fib[t].uc_stack.ss_size = STACK;
            s.fib[t].uc_link = NULL;
            makecontext(&s.fib[t], entry, 0);
            s.status[t] = READY;
            s.started[t] = 0;
        }
        for (int round = 0;; ++round) {
            /* a fresh order for every round of every block: a deterministic shuffle (Fisher-Yates, LCG) */
            uint64_t x = 0x9E3779B97F4A7C15ULL * (b + 1) + 0xD1B54A32D192ED03ULL * (uint64_t)(round + 1);
            for (int j = 0; j < n; ++j) {
                s.order[j] = j;
            }
            for (int j = n - 1; j > 0; --j) {
                x = x * 6364136223846793005ULL + 1442695040888963407ULL;
                const int k = (int)((x >> 33) % (uint64_t)(j + 1));
                const int tmp = s.order[j];
                s.order[j] = s.order[k];
                s.order[k] = tmp;
            }
            for (int j = 0; j < n; ++j) {
                const int t = s.order[j];
                if (s.status[t] == READY) {
                    resume(t);
                }
            }
            int waiting = 0, done = 0;
            for (int t = 0; t < n; ++t) {
                waiting += s.status[t] == BARRIER;
                done += s.status[t] == DONE;
            }
            if (done == n) {
                break;
            }
            if (done > 0) {
                fprintf(stderr, "cuda-emu: divergent __syncthreads in block %u (%d of %d threads returned)\n", b,
                        done, n);
                return s.last = cudaErrorLaunchFailure;
            }
            for (int t = 0; t < n; ++t) {
                s.status[t] = READY;
            }
        }
    }
    return cudaSuccess;
}

/* Adapts a kernel call with its arguments to launch()'s body. */
template <typename F> struct thunk {
    F f;
    static void run(void *p) { ((thunk *)p)->f(); }
};
template <typename F> inline cudaError_t launch_fn(dim3 grid, dim3 block, F f)
{
    thunk<F> t{f};
    cudaError_t e = launch(grid, block, &thunk<F>::run, &t);
    st().last = e;
    return e;
}
} // namespace nbgi_emu

#define threadIdx (nbgi_emu::st().tid)
#define blockIdx (nbgi_emu::st().bid)
#define blockDim (nbgi_emu::st().bdim)
#define gridDim (nbgi_emu::st().gdim)
#define warpSize 32

inline void __syncthreads(void) { nbgi_emu::barrier(); }

/* Every thread of the block must call it together (the backend's reductions do). */
template <typename T> inline T __shfl_down_sync(unsigned mask, T v, unsigned delta)
{
    nbgi_emu::state &s = nbgi_emu::st();
    const unsigned t = s.tid.x;
    static_assert(sizeof(T) <= sizeof(uint64_t), "shuffle of a type wider than 8 bytes");
    memcpy(&s.exch[t], &v, sizeof v);
    nbgi_emu::barrier();
    T r = v;
    if ((t % 32) + delta < 32 && t + delta < s.bdim.x) {
        memcpy(&r, &s.exch[t + delta], sizeof r);
    }
    nbgi_emu::barrier();
    (void)mask;
    return r;
}

/* `kernel<<<grid, block>>>(args)` is written NBG_LAUNCH(kernel, grid, block, args) in backend.cu. */
#define NBG_LAUNCH(kern, grid, block, ...) nbgi_emu::launch_fn((grid), (block), [&]() { kern(__VA_ARGS__); })

inline cudaError_t cudaGetDeviceCount(int *n)
{
    const char *off = getenv("NBG_CUDA_EMU_NODEV");
    *n = (off != NULL && off[0] == '1') ? 0 : 1;
    return *n ? cudaSuccess : cudaErrorNoDevice;
}
inline cudaError_t cudaGetDevice(int *d)
{
    *d = 0;
    return cudaSuccess;
}
inline cudaError_t cudaMalloc(void **p, size_t n)
{
    *p = malloc(n ? n : 1);
    return *p ? cudaSuccess : cudaErrorMemoryAllocation;
}
inline cudaError_t cudaFree(void *p)
{
    free(p);
    return cudaSuccess;
}
inline cudaError_t cudaMemcpy(void *dst, const void *src, size_t n, cudaMemcpyKind kind)
{
    (void)kind;
    if (n > 0) {
        memcpy(dst, src, n);
    }
    return cudaSuccess;
}
inline cudaError_t cudaDeviceSynchronize(void) { return cudaSuccess; }

/* The emulated device: one "multiprocessor" (the launch runs on one CPU thread), no clock, no peak. */
struct cudaDeviceProp {
    char name[256];
    size_t totalGlobalMem;
};
enum cudaDeviceAttr {
    cudaDevAttrClockRate = 13,
    cudaDevAttrMultiProcessorCount = 16,
    cudaDevAttrComputeCapabilityMajor = 75,
    cudaDevAttrComputeCapabilityMinor = 76
};
inline cudaError_t cudaGetDeviceProperties(cudaDeviceProp *p, int dev)
{
    (void)dev;
    snprintf(p->name, sizeof p->name, "CUDA emulated on the CPU");
    p->totalGlobalMem = 0;
    return cudaSuccess;
}
inline cudaError_t cudaDeviceGetAttribute(int *v, cudaDeviceAttr a, int dev)
{
    (void)dev;
    *v = a == cudaDevAttrMultiProcessorCount ? 1 : 0;
    return cudaSuccess;
}

/* Events hold the host's monotonic time when recorded (launches are synchronous here). */
typedef struct nbgi_emu_event {
    double t;
} *cudaEvent_t;
typedef struct nbgi_emu_stream *cudaStream_t;
inline cudaError_t cudaEventCreate(cudaEvent_t *ev)
{
    *ev = (cudaEvent_t)calloc(1, sizeof **ev);
    return *ev ? cudaSuccess : cudaErrorMemoryAllocation;
}
inline cudaError_t cudaEventDestroy(cudaEvent_t ev)
{
    free(ev);
    return cudaSuccess;
}
inline cudaError_t cudaEventRecord(cudaEvent_t ev, cudaStream_t stream = 0)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    ev->t = (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
    (void)stream;
    return cudaSuccess;
}
inline cudaError_t cudaEventSynchronize(cudaEvent_t ev)
{
    (void)ev;
    return cudaSuccess;
}
inline cudaError_t cudaEventElapsedTime(float *ms, cudaEvent_t a, cudaEvent_t b)
{
    *ms = (float)(1e3 * (b->t - a->t));
    return cudaSuccess;
}
inline cudaError_t cudaGetLastError(void)
{
    const cudaError_t e = nbgi_emu::st().last;
    nbgi_emu::st().last = cudaSuccess;
    return e;
}
inline const char *cudaGetErrorString(cudaError_t e)
{
    switch (e) {
    case cudaSuccess: return "no error";
    case cudaErrorInvalidValue: return "invalid argument";
    case cudaErrorMemoryAllocation: return "out of memory";
    case cudaErrorNoDevice: return "no CUDA-capable device is detected (emulated)";
    case cudaErrorLaunchFailure: return "unspecified launch failure (emulated: divergent barrier)";
    }
    return "unknown error";
}

#endif
