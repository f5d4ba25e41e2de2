/*
 * omp.h -- a serial stand-in for the OpenMP runtime, used only by the fuzzing build (tests/fuzz/) when the
 * compiler cannot link OpenMP: the library's pragmas are then ignored and these calls describe one thread.
 */
#ifndef NBG_FUZZ_NOOMP_H
#define NBG_FUZZ_NOOMP_H

static inline int omp_get_max_threads(void) { return 1; }
static inline int omp_get_num_threads(void) { return 1; }
static inline int omp_get_thread_num(void) { return 0; }
static inline int omp_get_num_procs(void) { return 1; }
static inline void omp_set_num_threads(int n) { (void)n; }
static inline int omp_in_parallel(void) { return 0; }

#endif
