/*
 * test-cudaemu.cc -- the emulated CUDA runtime (tests/cudaemu/cuda_runtime.h) catches what it claims to catch,
 * so that test-cuda-emu passing means something:
 *   reduce-correct       a shared-memory tree sum with its barriers gives the right sum
 *   reduce-missing-sync  the same tree without the barrier between its levels gives a wrong sum (the threads of a
 *                        block interleave only at barriers, in a shuffled order, so a read that a barrier does
 *                        not order after the write it needs sees a stale value)
 *   divergent-barrier    a barrier that some threads of a block skip fails the launch
 *   shuffle              a warp-shuffle sum equals the serial sum in every warp
 *   blocks               every block and thread index is visited once
 */
#include "testutil.h"

#include <cuda_runtime.h>

#define NT 128

__global__ void tree(const double *in, double *out, int sync)
{
    __shared__ double sh[NT];
    sh[threadIdx.x] = in[blockIdx.x * NT + threadIdx.x];
    __syncthreads();
    for (int w = NT / 2; w > 0; w >>= 1) {
        if ((int)threadIdx.x < w) {
            sh[threadIdx.x] += sh[threadIdx.x + w];
        }
        if (sync) {
            __syncthreads();
        }
    }
    if (threadIdx.x == 0) {
        out[blockIdx.x] = sh[0];
    }
}

__global__ void divergent(int *flag)
{
    if (threadIdx.x < 64) {
        __syncthreads();
    }
    flag[0] = 1;
}

__global__ void warps(const double *in, double *out)
{
    double v = in[threadIdx.x];
    for (int d = 16; d > 0; d >>= 1) {
        v += __shfl_down_sync(0xffffffffu, v, d);
    }
    if (threadIdx.x % 32 == 0) {
        out[threadIdx.x / 32] = v;
    }
}

__global__ void visit(int *count)
{
    count[blockIdx.x * blockDim.x + threadIdx.x] += 1;
}

int main(void)
{
    enum { NB = 3 };
    double in[NB * NT], out[NB], want[NB];
    for (int b = 0; b < NB; ++b) {
        want[b] = 0;
        for (int t = 0; t < NT; ++t) {
            in[b * NT + t] = 1.0 + t + 1000.0 * b;
            want[b] += in[b * NT + t];
        }
    }
    cudaError_t e = NBG_LAUNCH(tree, NB, NT, in, out, 1);
    int ok = e == cudaSuccess;
    for (int b = 0; b < NB; ++b) {
        ok = ok && out[b] == want[b];
    }
    nbgi_test_check(ok, "cudaemu-reduce-correct", "3 blocks of 128: sums %g %g %g (want %g %g %g)", out[0], out[1],
                   out[2], want[0], want[1], want[2]);
    /* without the barrier between levels, a thread reads a partial sum its neighbour has not yet written */
    e = NBG_LAUNCH(tree, NB, NT, in, out, 0);
    int wrong = 0;
    for (int b = 0; b < NB; ++b) {
        wrong += out[b] != want[b];
    }
    nbgi_test_check(e == cudaSuccess && wrong > 0, "cudaemu-reduce-missing-sync",
                   "a tree without its barriers between levels gives %d wrong block sums of %d", wrong, NB);
    int flag = 0;
    e = NBG_LAUNCH(divergent, 1, NT, &flag);
    const cudaError_t last = cudaGetLastError();
    nbgi_test_check(e == cudaErrorLaunchFailure && last == cudaErrorLaunchFailure, "cudaemu-divergent-barrier",
                   "a barrier half the block skips: %s", cudaGetErrorString(e));
    nbgi_test_check(cudaGetLastError() == cudaSuccess, "cudaemu-last-error-cleared",
                   "cudaGetLastError clears the error");
    double wout[NT / 32];
    e = NBG_LAUNCH(warps, 1, NT, in, wout);
    ok = e == cudaSuccess;
    for (int w = 0; w < NT / 32; ++w) {
        double s = 0;
        for (int t = 0; t < 32; ++t) {
            s += in[32 * w + t];
        }
        ok = ok && wout[w] == s;
    }
    nbgi_test_check(ok, "cudaemu-shuffle", "warp sums by __shfl_down_sync equal the serial sums");
    int count[5 * 64] = {0};
    e = NBG_LAUNCH(visit, 5, 64, count);
    ok = e == cudaSuccess;
    for (int i = 0; i < 5 * 64; ++i) {
        ok = ok && count[i] == 1;
    }
    nbgi_test_check(ok, "cudaemu-blocks", "5 blocks x 64 threads: every (block, thread) runs once");
    return nbgi_test_summary();
}
