/*
 * hd.h -- NBG_HD marks a function that runs on the host and, compiled by nvcc, on the device; NBG_RESTRICT is C's
 * restrict, spelled for C++ (nvcc, and the emulated CUDA build) as __restrict__; NBG_INLINE forces a function
 * inline (so that arguments its callers pass as constants, such as a NULL output, fold away in each copy).
 */
#ifndef NBG_HD_H
#define NBG_HD_H
#ifdef __CUDACC__
#define NBG_HD __host__ __device__
#else
#define NBG_HD
#endif
#define NBG_INLINE __attribute__((always_inline))
#ifdef __cplusplus
#define NBG_RESTRICT __restrict__
#else
#define NBG_RESTRICT restrict
#endif
#endif
