/*
 * mtz.h -- the C interface of src/mtzread.cc, which reads a CCP4 MTZ file's bytes through gemmi (Debian gemmi-dev,
 * header-only) and expands the chosen column to every symmetry equivalent.  Used by src/mtz.c (nbgi_read_mtz) and
 * by nothing else; plain C types only, so that the C++ side includes no nbgrad header but this one.
 */
#ifndef NBG_MTZ_H
#define NBG_MTZ_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

/* One structure-factor entry: an index and its amplitude. */
typedef struct {
    int h, k, l;
    double F;
} nbgi_hkl_entry;

/* What nbgi_mtz_expand read. */
typedef struct {
    nbgi_hkl_entry *ent; /* malloc'd: the expanded entries, row by row of the file (each row's equivalents once,
                            ordered by index); the caller frees it */
    size_t n;
    long nrows;          /* the file's reflections */
    long nused;          /* rows with a value (not NaN) in the chosen column */
    long nmissing;       /* rows whose value is NaN (left out) */
    char info[512];      /* one line: the column used, its type, the space group and what was expanded */
    char msg[1024];      /* on failure: what is wrong (the caller prefixes "MTZ file NAME: ") */
} nbgi_mtz_result;

/* Reads the MTZ file in buf (len bytes) and expands column label (NULL or "": the first amplitude column, type F,
 * else the first intensity column, type J; an intensity I becomes F = sqrt(max(I, 0))) to all its symmetry
 * equivalents under the file's space group, and to the Friedel mates for F and J columns (an anomalous column, type
 * G or K, fills its own half, and its "(+)"/"(-)" partner the other when the file has one).  Rows whose value is
 * NaN are left out.  max_bytes bounds every allocation (the header's counts are checked against the file's size
 * and it before gemmi reads anything).  Returns 0 (NBG_OK), or a negative nbg_status (NBG_EFORMAT, NBG_ENOMEM,
 * NBG_EINVAL for an unknown label) with r->msg; every exception is caught. */
int nbgi_mtz_expand(const unsigned char *buf, size_t len, const char *label, double max_bytes, nbgi_mtz_result *r);

#ifdef __cplusplus
}
#endif

#endif
