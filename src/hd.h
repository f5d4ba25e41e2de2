/*
 * hd.h -- NBG_HD marks a function that runs on the host and, compiled by nvcc, on the device.
 */
#ifndef NBG_HD_H
#define NBG_HD_H
#ifdef __CUDACC__
#define NBG_HD __host__ __device__
#else
#define NBG_HD
#endif
#endif
