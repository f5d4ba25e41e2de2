/*
 * fuzz_util.h -- shared pieces of the libFuzzer harnesses in tests/fuzz/.
 *
 * The readers take a path, so each harness keeps one anonymous in-memory file per process (memfd_create; where
 * that is unavailable, a file under $TMPDIR or /tmp that is unlinked at once) and hands the readers its
 * /proc/self/fd/N name.  Nothing is left on disk and no descriptor is opened per input.  A reader that opens the
 * path in a way /proc/self/fd/N does not allow (HDF5) gets a named file instead (nbgi_fuzz_file_open_named).
 */
#ifndef NBG_FUZZ_UTIL_H
#define NBG_FUZZ_UTIL_H

#ifndef _GNU_SOURCE
#define _GNU_SOURCE /* memfd_create */
#endif

#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

typedef struct {
    int fd;
    char path[4200];
} nbgi_fuzz_file;

/* Opens the per-process scratch file; aborts when it cannot (that is a broken machine, not a finding). */
static inline void nbgi_fuzz_file_open(nbgi_fuzz_file *f, const char *name)
{
    f->fd = memfd_create(name, MFD_CLOEXEC);
    if (f->fd < 0) {
        const char *base = getenv("TMPDIR");
        char tmpl[4096];
        snprintf(tmpl, sizeof tmpl, "%s/nbg-fuzz-XXXXXX", base != NULL && base[0] != '\0' ? base : "/tmp");
        f->fd = mkstemp(tmpl);
        if (f->fd >= 0) {
            unlink(tmpl);
        }
    }
    if (f->fd < 0) {
        fprintf(stderr, "nbgi_fuzz_file_open: no scratch file: %s\n", strerror(errno));
        abort();
    }
    snprintf(f->path, sizeof f->path, "/proc/self/fd/%d", f->fd);
}

/* The named scratch file's path, removed at exit. */
static char nbgi_fuzz_named_path[4200];

static inline void nbgi_fuzz_named_remove(void)
{
    if (nbgi_fuzz_named_path[0] != '\0') {
        unlink(nbgi_fuzz_named_path);
    }
}

/* Opens a per-process scratch file with a real name, for readers that cannot open /proc/self/fd/N (HDF5 opens
 * the path itself and refuses it): a file under $TMPDIR or /tmp, removed when the process exits normally (one
 * that crashes leaves it behind).  One such file per process; aborts when it cannot make it. */
static inline void nbgi_fuzz_file_open_named(nbgi_fuzz_file *f, const char *name)
{
    const char *base = getenv("TMPDIR");
    snprintf(f->path, sizeof f->path, "%s/%s-XXXXXX", base != NULL && base[0] != '\0' ? base : "/tmp", name);
    f->fd = mkstemp(f->path);
    if (f->fd < 0 || nbgi_fuzz_named_path[0] != '\0') {
        fprintf(stderr, "nbgi_fuzz_file_open_named: no scratch file %s: %s\n", f->path, strerror(errno));
        abort();
    }
    snprintf(nbgi_fuzz_named_path, sizeof nbgi_fuzz_named_path, "%s", f->path);
    atexit(nbgi_fuzz_named_remove);
}

/* Replaces the file's contents with data[0..size). */
static inline void nbgi_fuzz_file_set(nbgi_fuzz_file *f, const uint8_t *data, size_t size)
{
    if (ftruncate(f->fd, 0) != 0) {
        perror("nbgi_fuzz_file_set: ftruncate");
        abort();
    }
    size_t done = 0;
    while (done < size) {
        const ssize_t n = pwrite(f->fd, data + done, size - done, (off_t)done);
        if (n < 0 && errno == EINTR) {
            continue;
        }
        if (n <= 0) {
            perror("nbgi_fuzz_file_set: pwrite");
            abort();
        }
        done += (size_t)n;
    }
}

/* Reads v so that the compiler cannot drop the load: ASan then checks that the memory is really there. */
static inline void nbgi_fuzz_touch(const volatile void *p, size_t n)
{
    if (n > 0) {
        (void)((const volatile unsigned char *)p)[0];
        (void)((const volatile unsigned char *)p)[n - 1];
    }
}

/* The invariants of a structure-factor table a reader returned (reader names it in the messages): a table, bounds
 * in order, every entry addressable; then frees it. */
#define NBG_FUZZ_CHECK_TABLE(hkl, reader)                                                                          \
    do {                                                                                                          \
        NBG_FUZZ_CHECK((hkl).F != NULL, reader " succeeded without a table");                                    \
        NBG_FUZZ_CHECK((hkl).h_min <= (hkl).h_max && (hkl).k_min <= (hkl).k_max && (hkl).l_min <= (hkl).l_max, \
                       reader " returned bounds out of order");                                                  \
        const size_t n_ = (size_t)((hkl).h_max - (hkl).h_min + 1) * (size_t)((hkl).k_max - (hkl).k_min + 1) *   \
                          (size_t)((hkl).l_max - (hkl).l_min + 1);                                              \
        nbgi_fuzz_touch((hkl).F, n_ * sizeof *(hkl).F);                                                          \
        nbg_hkl_free(&(hkl));                                                                                    \
    } while (0)

/* An invariant the library promises, checked on what it returned: a violation is a finding.  The message goes
 * straight to file descriptor 2 (the CLI harness points the stdio streams elsewhere), then abort() hands the
 * input to libFuzzer as a crash. */
#define NBG_FUZZ_CHECK(cond, msg)                                                                                  \
    do {                                                                                                          \
        if (!(cond)) {                                                                                            \
            nbgi_fuzz_fail(__FILE__, __LINE__, (msg));                                                             \
        }                                                                                                         \
    } while (0)

static inline void nbgi_fuzz_fail(const char *file, int line, const char *msg)
{
    char buf[512];
    const int n = snprintf(buf, sizeof buf, "==fuzz== ERROR: invariant violated: %s (%s:%d)\n", msg, file, line);
    if (n > 0 && write(2, buf, (size_t)n < sizeof buf ? (size_t)n : sizeof buf - 1) < 0) {
        /* nowhere to say it */
    }
    abort();
}

/* LeakSanitizer: the OpenMP runtime's own thread bookkeeping, freed by no one at exit, is not nbgrad's leak; nor
 * is what CBFlib 0.9.7's parser drops when it stops at a syntax error in the text (tokens from cbf_lex, nodes from
 * cbf_make_node, all under cbf_parse; nbgrad frees its handle: tests/fuzz/regress/image/leak-cbflib-*).  A handle
 * nbgrad failed to free would still show through what cbf_make_handle allocates.  The suppression needs full
 * unwinding at malloc (fuzz-image sets it: CBFlib has no frame pointers).  (Each harness is one translation unit,
 * so this definition appears once per program.) */
const char *__lsan_default_suppressions(void);
const char *__lsan_default_suppressions(void)
{
    return "leak:libomp.so\nleak:cbf_parse\n";
}

#endif
