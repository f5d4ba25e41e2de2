/*
 * hd.h -- NBG_HD marks a function that runs on the host and, compiled by nvcc, on the device; NBG_RESTRICT is C's
 * restrict, spelled for C++ (nvcc, and the emulated CUDA build) as __restrict__; NBG_INLINE forces a function
 * inline (so that arguments its callers pass as constants, such as a NULL output, fold away in each copy).
 * NBG_NARROW_VECTORS is 1 where the CPU's vector registers are 256 bits wide (AVX or AVX2 without AVX-512): the
 * CPU forward then takes a row's pixels 4 (double, where there are many crystal matrices) or 8 (float) at a time,
 * one register, not 8 or 16 (two, which spilled out of AVX2's 16 registers: heavy sampling's forward 17-25 % slower,
 * src/row_tmpl.h); with one matrix the double forward keeps 8 (src/forward_cpu.c).
 */
#ifndef NBG_HD_H
#define NBG_HD_H
#ifdef __CUDACC__
#define NBG_HD __host__ __device__
#else
#define NBG_HD
#endif
#define NBG_INLINE __attribute__((always_inline))
#if defined(__AVX__) && !defined(__AVX512F__) && !defined(__CUDACC__)
#define NBG_NARROW_VECTORS 1
#else
#define NBG_NARROW_VECTORS 0
#endif
#ifdef __cplusplus
#define NBG_RESTRICT __restrict__
#else
#define NBG_RESTRICT restrict
#endif
#endif
