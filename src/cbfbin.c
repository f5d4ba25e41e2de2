/*
 * cbfbin.c -- the binary sections of a CBF file, found, checked and decoded by nbgrad rather than by CBFlib.
 *
 * CBFlib 0.9.7 (Debian's libcbf) trusts what a binary section's MIME header says: a header whose X-Binary-Size or
 * element count lies makes its decoders read and write past their buffers (a byte-offset section that holds more
 * elements than the caller's array overruns it; fuzzing found heap overflows, double frees, segfaults and
 * floating-point exceptions in its binary and header code).  So nbgrad reads the whole file, finds each binary
 * section itself, checks its header against itself and against the file, and decodes the data with bounds checks
 * on the input bytes and the output elements.  CBFlib is given a copy of the file (nbgi_cbf_file.text) in which
 * each section's text field is a placeholder word: it parses text only (the categories that carry the geometry)
 * and never sees a MIME header or a byte of binary data.
 *
 * The format facts this relies on (CIF 1.1 and the imgCIF/CBF specification of binary sections):
 *
 *  - A text field starts with a line whose first character is ';' and ends at the next line that starts with ';'
 *    (CBFlib also wants white space or the end of the file after that ';').  Lines end in LF, CR LF or CR.
 *  - A binary section is a text field whose first line (after the opening ';' line) is the MIME boundary
 *    "--CIF-BINARY-FORMAT-SECTION--" (CBFlib matches it in any case), then MIME header lines "Name: value" (a line
 *    that starts with a blank continues the one before), an empty line, the 4-byte start marker 0C 1A 04 D5,
 *    X-Binary-Size bytes of data, optional padding, the closing boundary "--CIF-BINARY-FORMAT-SECTION----" and
 *    the ';' line that ends the field.
 *  - Content-Type: application/octet-stream; conversions="x-CBF_BYTE_OFFSET" names the compression (also
 *    x-CBF_NONE, x-CBF_PACKED, x-CBF_PACKED_V2, x-CBF_CANONICAL...; no conversions: uncompressed).
 *    Content-Transfer-Encoding: BINARY says the data are raw bytes (BASE64 and others are text encodings).
 *    X-Binary-Element-Type: "signed 32-bit integer", "unsigned 16-bit integer", "signed 64-bit real IEEE"...
 *    (not stated: signed 32-bit integer); X-Binary-Element-Byte-Order: LITTLE_ENDIAN or BIG_ENDIAN;
 *    X-Binary-Number-of-Elements, X-Binary-Size-Fastest-/Second-/Third-Dimension (fastest first);
 *    X-Binary-Size-Padding (bytes after the data); Content-MD5: the base-64 MD5 digest of the X-Binary-Size data
 *    bytes.  Names are matched in any case.
 *  - byte_offset compression: each element is the previous one plus a delta (the first: 0 plus a delta), the
 *    delta stored little-endian in 1 byte; the 1-byte value -128 (0x80) says that a 2-byte delta follows instead,
 *    whose value -32768 (0x8000) says a 4-byte one follows, whose value -2^31 (0x80000000) an 8-byte one.  The sum
 *    is taken in the element's width, modulo 2^bits: CBFlib's writer (nbgrad's included) relies on that, writing
 *    the step from 2e9 to -2e9 in a 32-bit image as a 4-byte delta of 294967296, and it stores an IEEE real
 *    element's bits as that integer.  So a sum past the type's range is no error; a delta that the stream cuts
 *    short, a stream that ends before the last element, and bytes left after it are.
 *  - none: the elements one after another, elbytes each, in the stated byte order.
 */
#include "formats.h"

#ifdef NBG_HAVE_FORMATS

#include <cbf_codes.h> /* cbf_md5digest_to64, and through cbf_file.h CBFlib's MD5Init/MD5Update/MD5Final */
#include <errno.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>

#define BOUNDARY "--CIF-BINARY-FORMAT-SECTION--"
#define BOUNDARY_LEN (sizeof BOUNDARY - 1)
#define PLACEHOLDER "nbgrad-binary-section-"

static const unsigned char start_marker[4] = {0x0C, 0x1A, 0x04, 0xD5};

/* ------------------------------------------------------------------------------------------------------------ */
/* Lines and errors                                                                                             */
/* ------------------------------------------------------------------------------------------------------------ */

/* The end of the line that starts at p: the index of its CR or LF, or len. */
static size_t line_end(const unsigned char *b, size_t len, size_t p)
{
    while (p < len && b[p] != '\n' && b[p] != '\r')
        ++p;
    return p;
}

/* The start of the line after the one that ends at e (past LF, CR or CR LF). */
static size_t next_line(const unsigned char *b, size_t len, size_t e)
{
    if (e < len && b[e] == '\r')
        return e + 1 < len && b[e + 1] == '\n' ? e + 2 : e + 1;
    return e < len ? e + 1 : e;
}

static int is_blank(unsigned char c)
{
    return c == ' ' || c == '\t';
}

/* 1 when b[from, to) holds blanks only. */
static int blank_span(const unsigned char *b, size_t from, size_t to)
{
    for (size_t i = from; i < to; ++i) {
        if (!is_blank(b[i]))
            return 0;
    }
    return 1;
}

/* Copies b[0, n) into out (size >= 1) for a message: at most size - 1 bytes, anything unprintable as '?'. */
static void printable(char *out, size_t size, const char *b, size_t n)
{
    size_t k = 0;
    for (size_t i = 0; i < n && k + 1 < size; ++i)
        out[k++] = b[i] >= 0x20 && b[i] < 0x7f ? b[i] : '?';
    out[k] = '\0';
}

/* A refusal that names the file, the section (k, from 0) and the byte where its text field starts. */
static int sec_error(nbg_ctx *ctx, int status, const char *path, int k, size_t at, const char *fmt, ...)
    __attribute__((format(printf, 6, 7)));

static int sec_error(nbg_ctx *ctx, int status, const char *path, int k, size_t at, const char *fmt, ...)
{
    char msg[600];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return nbgi_error(ctx, status, "reading %s: binary section %d (its text field at byte %zu): %s", path, k + 1, at,
                      msg);
}

/* ------------------------------------------------------------------------------------------------------------ */
/* The MIME header                                                                                              */
/* ------------------------------------------------------------------------------------------------------------ */

/* A count: decimal digits only (blanks around them already trimmed), at most INT64_MAX; 0 when it is one. */
static int parse_count(const char *v, uint64_t *out)
{
    uint64_t x = 0;
    if (*v == '\0')
        return -1;
    for (; *v != '\0'; ++v) {
        if (*v < '0' || *v > '9' || x > (uint64_t)(INT64_MAX - 9) / 10)
            return -1;
        x = x * 10 + (uint64_t)(*v - '0');
    }
    *out = x;
    return 0;
}

/* Content-Type's conversions parameter (the compression): its first token, quoted or not. */
static void parse_conversions(const char *v, nbgi_cbf_section *s)
{
    s->compression = NBGI_CBF_UNCOMPRESSED;
    s->conversion[0] = '\0';
    const char *p = v;
    for (; *p != '\0'; ++p) {
        if (strncasecmp(p, "conversions", 11) == 0 && (p == v || p[-1] == ';' || p[-1] == ' ' || p[-1] == '\t'))
            break;
    }
    if (*p == '\0')
        return; /* application/octet-stream: no compression */
    p += 11;
    while (is_blank((unsigned char)*p))
        ++p;
    if (*p == '=')
        ++p;
    while (is_blank((unsigned char)*p))
        ++p;
    if (*p == '"')
        ++p;
    const size_t n = strcspn(p, "\"; \t");
    printable(s->conversion, sizeof s->conversion, p, n);
    /* the packing's flags follow in the same parameter ("x-CBF_PACKED flat", "x-CBF_PACKED uncorrelated_sections") */
    const char *rest = p + n, *stop = strchr(rest, ';');
    const size_t nrest = stop != NULL ? (size_t)(stop - rest) : strlen(rest);
    for (size_t i = 0; i < nrest; ++i) {
        if (nrest - i >= 4 && strncasecmp(rest + i, "flat", 4) == 0)
            s->packed_flat = 1;
        if (nrest - i >= 21 && strncasecmp(rest + i, "uncorrelated_sections", 21) == 0)
            s->packed_uncorrelated = 1;
    }
    if (strcasecmp(s->conversion, "x-CBF_BYTE_OFFSET") == 0)
        s->compression = NBGI_CBF_BYTE_OFFSET;
    else if (strcasecmp(s->conversion, "x-CBF_NONE") == 0)
        s->compression = NBGI_CBF_UNCOMPRESSED;
    else if (strcasecmp(s->conversion, "x-CBF_PACKED") == 0)
        s->compression = NBGI_CBF_PACKED;
    else
        s->compression = NBGI_CBF_OTHER;
}

/* Skips blanks, then the word w (in any case) and the blanks after it; NULL when the text does not start so. */
static const char *skip_word(const char *p, const char *w)
{
    while (is_blank((unsigned char)*p))
        ++p;
    const size_t n = strlen(w);
    if (strncasecmp(p, w, n) != 0 || (p[n] != '\0' && !is_blank((unsigned char)p[n])))
        return NULL;
    p += n;
    while (is_blank((unsigned char)*p))
        ++p;
    return p;
}

/* X-Binary-Element-Type, e.g. "signed 32-bit integer" or "unsigned 16-bit integer" or "signed 64-bit real IEEE":
 * sets elbytes (0 for a type nbgrad does not read: complex, another width), elsigned and elreal. */
static void parse_eltype(const char *v, nbgi_cbf_section *s)
{
    size_t n = strlen(v);
    if (n >= 2 && v[0] == '"' && v[n - 1] == '"')
        ++v, n -= 2;
    printable(s->eltype, sizeof s->eltype, v, n);
    s->elbytes = 0;
    const char *p = s->eltype, *q;
    int sign = 1;
    if ((q = skip_word(p, "signed")) == NULL) {
        sign = 0;
        q = skip_word(p, "unsigned");
    }
    int bits = 0;
    for (int k = 0; q != NULL && k < 3 && *q >= '0' && *q <= '9'; ++k)
        bits = 10 * bits + (*q++ - '0');
    if (q == NULL || strncasecmp(q, "-bit", 4) != 0)
        return;
    q += 4;
    s->elsigned = sign;
    const char *integer = skip_word(q, "integer");
    if (integer != NULL && *integer == '\0' && (bits == 8 || bits == 16 || bits == 32 || bits == 64)) {
        s->elreal = 0;
        s->elbytes = bits / 8;
    } else if ((q = skip_word(q, "real")) != NULL && (q = skip_word(q, "IEEE")) != NULL && *q == '\0' &&
               (bits == 32 || bits == 64)) {
        s->elreal = 1;
        s->elbytes = bits / 8;
    }
}

/* A base-64 MD5 digest: 22 characters of the alphabet and "==". */
static int is_digest(const char *v)
{
    if (strlen(v) != 24 || strcmp(v + 22, "==") != 0)
        return 0;
    for (int i = 0; i < 22; ++i) {
        const char c = v[i];
        if (!((c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '+' || c == '/'))
            return 0;
    }
    return 1;
}

/* One header, name: value (both trimmed), into s; a malformed value of a field nbgrad uses is refused. */
static int apply_header(nbg_ctx *ctx, const char *path, int k, size_t at, const char *name, const char *value,
                        nbgi_cbf_section *s, int *has_size)
{
    static const char *const dims[3] = {"X-Binary-Size-Fastest-Dimension", "X-Binary-Size-Second-Dimension",
                                        "X-Binary-Size-Third-Dimension"};
    uint64_t *count = NULL;
    if (strcasecmp(name, "Content-Type") == 0) {
        parse_conversions(value, s);
    } else if (strcasecmp(name, "Content-Transfer-Encoding") == 0) {
        printable(s->encoding, sizeof s->encoding, value, strlen(value));
    } else if (strcasecmp(name, "X-Binary-Element-Type") == 0) {
        parse_eltype(value, s);
    } else if (strcasecmp(name, "X-Binary-Element-Byte-Order") == 0) {
        s->bigendian = strcasecmp(value, "LITTLE_ENDIAN") == 0 ? 0 : strcasecmp(value, "BIG_ENDIAN") == 0 ? 1 : -1;
    } else if (strcasecmp(name, "Content-MD5") == 0) {
        if (!is_digest(value))
            return sec_error(ctx, NBG_EFORMAT, path, k, at, "Content-MD5 \"%.40s\" is not a base-64 MD5 digest",
                             value);
        snprintf(s->md5, sizeof s->md5, "%s", value);
    } else if (strcasecmp(name, "X-Binary-Size") == 0) {
        count = &s->size;
        *has_size = 1;
    } else if (strcasecmp(name, "X-Binary-Number-of-Elements") == 0) {
        count = &s->nel;
        s->has_nel = 1;
    } else if (strcasecmp(name, "X-Binary-ID") == 0 || strcasecmp(name, "X-Binary-Size-Padding") == 0) {
        uint64_t unused;
        if (parse_count(value[0] == '-' ? value + 1 : value, &unused) != 0)
            return sec_error(ctx, NBG_EFORMAT, path, k, at, "%s \"%.40s\" is not a whole number", name, value);
    } else {
        for (int d = 0; d < 3; ++d) {
            if (strcasecmp(name, dims[d]) == 0)
                count = &s->dim[d];
        }
    }
    if (count != NULL && parse_count(value, count) != 0)
        return sec_error(ctx, NBG_EFORMAT, path, k, at, "%s \"%.40s\" is not a count (digits, at most 2^63 - 1)",
                         name, value);
    return NBG_OK;
}

/* A header line being gathered (a line and its continuations). */
typedef struct {
    char name[48];
    char value[512];
    size_t n;
    int open;
} mime_line;

/* Appends b[from, to) trimmed to the value, after a blank when it is not the first piece. */
static int append_value(mime_line *m, const unsigned char *b, size_t from, size_t to)
{
    while (from < to && is_blank(b[from]))
        ++from;
    while (to > from && is_blank(b[to - 1]))
        --to;
    if (m->n + 1 + (to - from) >= sizeof m->value)
        return -1;
    if (m->n > 0 && to > from)
        m->value[m->n++] = ' ';
    printable(m->value + m->n, sizeof m->value - m->n, (const char *)b + from, to - from);
    m->n += to - from;
    return 0;
}

/* Applies the line gathered, if any. */
static int flush_header(nbg_ctx *ctx, const char *path, int k, size_t at, mime_line *m, nbgi_cbf_section *s,
                        int *has_size)
{
    if (!m->open)
        return NBG_OK;
    m->open = 0;
    m->value[m->n] = '\0';
    return apply_header(ctx, path, k, at, m->name, m->value, s, has_size);
}

/* Parses the header lines from p up to the empty line that ends them; *after: the byte after that line. */
static int parse_mime(nbg_ctx *ctx, const char *path, int k, size_t at, const unsigned char *b, size_t len,
                      size_t p, nbgi_cbf_section *s, size_t *after)
{
    mime_line m;
    memset(&m, 0, sizeof m);
    int has_size = 0, rc;
    while (p < len) {
        const size_t e = line_end(b, len, p);
        if (blank_span(b, p, e)) { /* the empty line: the header's end */
            if ((rc = flush_header(ctx, path, k, at, &m, s, &has_size)) != NBG_OK)
                return rc;
            if (!has_size)
                return sec_error(ctx, NBG_EFORMAT, path, k, at, "its MIME header gives no X-Binary-Size");
            *after = next_line(b, len, e);
            return NBG_OK;
        }
        if (is_blank(b[p])) { /* a continuation */
            if (!m.open || append_value(&m, b, p, e) != 0)
                return sec_error(ctx, NBG_EFORMAT, path, k, at, "a malformed MIME header line at byte %zu", p);
        } else {
            if ((rc = flush_header(ctx, path, k, at, &m, s, &has_size)) != NBG_OK)
                return rc;
            const unsigned char *colon = memchr(b + p, ':', e - p);
            if (colon == NULL)
                return sec_error(ctx, NBG_EFORMAT, path, k, at, "a MIME header line without ':' at byte %zu", p);
            size_t ne = (size_t)(colon - b);
            while (ne > p && is_blank(b[ne - 1]))
                --ne;
            printable(m.name, sizeof m.name, (const char *)b + p, ne - p); /* a longer name is no field nbgrad knows */
            m.n = 0;
            m.open = 1;
            if (append_value(&m, b, ne + 1, e) != 0)
                return sec_error(ctx, NBG_EFORMAT, path, k, at, "a MIME header line too long at byte %zu", p);
        }
        p = next_line(b, len, e);
    }
    return sec_error(ctx, NBG_EFORMAT, path, k, at, "its MIME header does not end (no empty line before the data)");
}

/* ------------------------------------------------------------------------------------------------------------ */
/* Finding the sections                                                                                         */
/* ------------------------------------------------------------------------------------------------------------ */

/* When the line at p is ';' (blanks after it allowed) and the next line is the opening MIME boundary: the start
 * of the MIME header's first line; else 0. */
static size_t opens_binary(const unsigned char *b, size_t len, size_t p)
{
    const size_t e = line_end(b, len, p + 1);
    if (!blank_span(b, p + 1, e))
        return 0;
    const size_t q = next_line(b, len, e);
    if (len - q < BOUNDARY_LEN || strncasecmp((const char *)b + q, BOUNDARY, BOUNDARY_LEN) != 0)
        return 0;
    const size_t qe = line_end(b, len, q + BOUNDARY_LEN);
    if (!blank_span(b, q + BOUNDARY_LEN, qe))
        return 0; /* e.g. the closing boundary, "--CIF-BINARY-FORMAT-SECTION----" */
    return next_line(b, len, qe);
}

/* The end of the text field of a section whose data end at from: just past the first ';' that starts a line (the
 * line break after from) and is followed by white space or the end of the file; 0 when there is none. */
static size_t field_end(const unsigned char *b, size_t len, size_t from)
{
    for (size_t i = from + 1; i < len; ++i) {
        const unsigned char *semi = memchr(b + i, ';', len - i);
        if (semi == NULL)
            return 0;
        i = (size_t)(semi - b);
        const int at_line = b[i - 1] == '\n' || b[i - 1] == '\r';
        const int then_space = i + 1 == len || b[i + 1] == ' ' || b[i + 1] == '\t' || b[i + 1] == '\n' ||
                               b[i + 1] == '\r' || b[i + 1] == '\f' || b[i + 1] == '\v';
        if (at_line && then_space)
            return i + 1;
    }
    return 0;
}

/* The section whose text field opens at b[at] (';'); header: its MIME header's first line. */
static int parse_section(nbg_ctx *ctx, const char *path, int k, const unsigned char *b, size_t len, size_t at,
                         size_t header, nbgi_cbf_section *s)
{
    memset(s, 0, sizeof *s);
    s->at = at;
    s->elbytes = 4, s->elsigned = 1; /* not stated: signed 32-bit integer */
    size_t p = 0;
    int rc = parse_mime(ctx, path, k, at, b, len, header, s, &p);
    if (rc != NBG_OK)
        return rc;
    if (len - p < sizeof start_marker || memcmp(b + p, start_marker, sizeof start_marker) != 0)
        return sec_error(ctx, NBG_EFORMAT, path, k, at, "no start marker (bytes 0C 1A 04 D5) after its MIME header, "
                         "at byte %zu", p);
    s->data = p + sizeof start_marker;
    if (s->size > len - s->data)
        return sec_error(ctx, NBG_EFORMAT, path, k, at, "X-Binary-Size says %llu bytes of data but the file has %zu "
                         "after the start marker (truncated, or a wrong size)", (unsigned long long)s->size,
                         len - s->data);
    if ((s->end = field_end(b, len, s->data + (size_t)s->size)) == 0)
        return sec_error(ctx, NBG_EFORMAT, path, k, at, "its text field does not end: no ';' line after its %llu "
                         "bytes of data (truncated, or a wrong X-Binary-Size)", (unsigned long long)s->size);
    return NBG_OK;
}

/* The text outside the binary sections, b[from, to), as CBFlib will see it: no control byte (CBFlib takes 0x1A
 * or 0x04 in a text field for old-style binary data) and no MIME boundary (CBFlib would parse what follows as a
 * binary section). */
static int check_text(nbg_ctx *ctx, const char *path, const unsigned char *b, size_t from, size_t to)
{
    for (size_t i = from; i < to; ++i) {
        const unsigned char c = b[i];
        if ((c < 0x20 && c != '\t' && c != '\n' && c != '\r' && c != '\f' && c != '\v') || c == 0x7f)
            return nbgi_error(ctx, NBG_EFORMAT, "reading %s: a control byte 0x%02x at byte %zu, outside any binary "
                              "section (damaged, or a binary section nbgrad did not find)", path, c, i);
        if (c == '-' && to - i >= BOUNDARY_LEN && strncasecmp((const char *)b + i, BOUNDARY, BOUNDARY_LEN) == 0)
            return nbgi_error(ctx, NBG_EFORMAT, "reading %s: a MIME boundary (%s) at byte %zu that does not open a "
                              "binary section (one must be the first line of its own text field, after a ';' line)",
                              path, BOUNDARY, i);
    }
    return NBG_OK;
}

/* Appends a section to f->sec. */
static int add_section(nbg_ctx *ctx, const char *path, nbgi_cbf_file *f, const nbgi_cbf_section *s, int *cap)
{
    if (f->nsec == *cap) {
        const int ncap = *cap > 0 ? 2 * *cap : 4;
        nbgi_cbf_section *ns = realloc(f->sec, (size_t)ncap * sizeof *ns);
        if (ns == NULL)
            return nbgi_error(ctx, NBG_ENOMEM, "reading %s: out of memory for its binary sections", path);
        f->sec = ns, *cap = ncap;
    }
    f->sec[f->nsec++] = *s;
    return NBG_OK;
}

/* Walks the file's lines, following CIF text fields, and records each binary section; checks the text between. */
static int find_sections(nbg_ctx *ctx, const char *path, nbgi_cbf_file *f)
{
    const unsigned char *b = f->bytes;
    const size_t len = f->len;
    size_t p = 0, text_from = 0;
    int in_text = 0, cap = 0, rc;
    while (p < len) { /* p starts a line */
        size_t header;
        if (b[p] == ';' && !in_text && (header = opens_binary(b, len, p)) != 0) {
            if (f->nsec == INT32_MAX)
                return nbgi_error(ctx, NBG_EFORMAT, "reading %s: too many binary sections", path);
            nbgi_cbf_section s;
            if ((rc = check_text(ctx, path, b, text_from, p)) != NBG_OK ||
                (rc = parse_section(ctx, path, f->nsec, b, len, p, header, &s)) != NBG_OK ||
                (rc = add_section(ctx, path, f, &s, &cap)) != NBG_OK)
                return rc;
            text_from = p = s.end; /* the rest of the closing ';' line is text */
        } else if (b[p] == ';') {
            /* a text field opens, or closes (CBFlib: when white space or the end follows the ';') */
            in_text = !in_text || !(p + 1 == len || b[p + 1] == ' ' || b[p + 1] == '\t' || b[p + 1] == '\n' ||
                                    b[p + 1] == '\r' || b[p + 1] == '\f' || b[p + 1] == '\v');
        }
        p = next_line(b, len, line_end(b, len, p));
    }
    return check_text(ctx, path, b, text_from, len);
}

/* ------------------------------------------------------------------------------------------------------------ */
/* Loading                                                                                                      */
/* ------------------------------------------------------------------------------------------------------------ */

/* The whole of fp, from its current position, into f->bytes. */
static int read_all(nbg_ctx *ctx, const char *path, FILE *fp, nbgi_cbf_file *f)
{
    struct stat st;
    size_t cap = 65536;
    if (fstat(fileno(fp), &st) == 0 && S_ISREG(st.st_mode) && st.st_size > 0 && (uint64_t)st.st_size < SIZE_MAX / 4)
        cap = (size_t)st.st_size + 1; /* + 1: the end is seen without growing */
    char what[4200];
    snprintf(what, sizeof what, "reading %s (the file and a copy of its text)", path);
    for (;;) {
        int rc = nbgi_check_bytes(ctx, 2.0 * (double)cap, what);
        if (rc != NBG_OK)
            return rc;
        unsigned char *nb = realloc(f->bytes, cap);
        if (nb == NULL)
            return nbgi_error(ctx, NBG_ENOMEM, "reading %s: out of memory for the file (%zu bytes)", path, cap);
        f->bytes = nb;
        f->len += fread(f->bytes + f->len, 1, cap - f->len, fp);
        if (ferror(fp))
            return nbgi_error(ctx, NBG_EIO, "reading %s: %s", path, strerror(errno));
        if (f->len < cap)
            return NBG_OK;
        if (cap > SIZE_MAX / 4)
            return nbgi_error(ctx, NBG_ENOMEM, "reading %s: the file is too large", path);
        cap *= 2;
    }
}

/* f->text: the file with each binary section's text field (';' to ';') replaced by its placeholder word. */
static int build_text(nbg_ctx *ctx, const char *path, nbgi_cbf_file *f)
{
    const size_t room = f->len + (size_t)f->nsec * 32 + 1;
    f->text = malloc(room);
    if (f->text == NULL)
        return nbgi_error(ctx, NBG_ENOMEM, "reading %s: out of memory for a copy of its text", path);
    size_t n = 0, from = 0;
    for (int k = 0; k <= f->nsec; ++k) {
        const size_t to = k < f->nsec ? f->sec[k].at : f->len;
        memcpy(f->text + n, f->bytes + from, to - from);
        n += to - from;
        if (k == f->nsec)
            break;
        n += (size_t)snprintf(f->text + n, room - n, PLACEHOLDER "%d", k + 1);
        from = f->sec[k].end;
    }
    f->text[n] = '\0';
    f->textlen = n;
    return NBG_OK;
}

void nbgi_cbf_release(nbgi_cbf_file *f)
{
    free(f->bytes);
    free(f->text);
    free(f->sec);
    memset(f, 0, sizeof *f);
}

int nbgi_cbf_load(nbg_ctx *ctx, const char *path, FILE *fp, nbgi_cbf_file *f)
{
    memset(f, 0, sizeof *f);
    int rc = read_all(ctx, path, fp, f);
    if (rc == NBG_OK)
        rc = find_sections(ctx, path, f);
    if (rc == NBG_OK)
        rc = build_text(ctx, path, f);
    if (rc != NBG_OK)
        nbgi_cbf_release(f);
    return rc;
}

int nbgi_cbf_section_of(const nbgi_cbf_file *f, const char *value)
{
    const size_t n = sizeof PLACEHOLDER - 1;
    if (value == NULL || strncmp(value, PLACEHOLDER, n) != 0 || value[n] < '1' || value[n] > '9')
        return -1;
    char *end;
    errno = 0;
    const long k = strtol(value + n, &end, 10);
    if (errno != 0 || *end != '\0' || k < 1 || k > f->nsec)
        return -1;
    return (int)k - 1;
}

/* ------------------------------------------------------------------------------------------------------------ */
/* Decoding                                                                                                     */
/* ------------------------------------------------------------------------------------------------------------ */

int nbgi_cbf_check(nbg_ctx *ctx, const char *path, const nbgi_cbf_file *f, int k, uint64_t nel)
{
    const nbgi_cbf_section *s = &f->sec[k];
    if (s->encoding[0] != '\0' && strcasecmp(s->encoding, "BINARY") != 0)
        return sec_error(ctx, NBG_EUNSUP, path, k, s->at, "Content-Transfer-Encoding %s is not supported: nbgrad "
                         "reads binary sections stored as raw bytes (BINARY)", s->encoding);
    if (s->compression == NBGI_CBF_OTHER)
        return sec_error(ctx, NBG_EUNSUP, path, k, s->at, "its compression %s is not supported: nbgrad decodes "
                         "x-CBF_BYTE_OFFSET, x-CBF_PACKED (32-bit integers) and x-CBF_NONE (uncompressed) only",
                         s->conversion);
    if (s->compression == NBGI_CBF_PACKED && (s->elbytes != 4 || s->elreal))
        return sec_error(ctx, NBG_EUNSUP, path, k, s->at, "x-CBF_PACKED data of element type \"%s\" are not "
                         "supported: nbgrad unpacks signed or unsigned 32-bit integers only", s->eltype);
    if (s->elbytes == 0)
        return sec_error(ctx, NBG_EUNSUP, path, k, s->at, "X-Binary-Element-Type \"%s\" is not supported: nbgrad "
                         "reads signed or unsigned 8-, 16-, 32- or 64-bit integers and 32- or 64-bit IEEE reals",
                         s->eltype);
    if (s->bigendian < 0)
        return sec_error(ctx, NBG_EFORMAT, path, k, s->at, "X-Binary-Element-Byte-Order is neither LITTLE_ENDIAN "
                         "nor BIG_ENDIAN");
    if (s->compression == NBGI_CBF_UNCOMPRESSED) {
        if (nel > s->size / (uint64_t)s->elbytes || nel * (uint64_t)s->elbytes != s->size)
            return sec_error(ctx, NBG_EFORMAT, path, k, s->at, "X-Binary-Size is %llu bytes but %llu uncompressed "
                             "elements of %d bytes take %.17g", (unsigned long long)s->size, (unsigned long long)nel,
                             s->elbytes, (double)nel * s->elbytes);
    } else if (s->compression == NBGI_CBF_PACKED) {
        if (s->size < 32 || nel / 170 > s->size)
            return sec_error(ctx, NBG_EFORMAT, path, k, s->at, "X-Binary-Size is %llu bytes: too few for a packed "
                             "header and %llu elements", (unsigned long long)s->size, (unsigned long long)nel);
    } else if (nel > s->size) {
        return sec_error(ctx, NBG_EFORMAT, path, k, s->at, "X-Binary-Size is %llu bytes but %llu byte-offset elements "
                         "take one byte each at least", (unsigned long long)s->size, (unsigned long long)nel);
    }
    return NBG_OK;
}

/* Checks the data's Content-MD5, when there is one.  The digest is CBFlib's MD5 (RSA's reference code, which the
 * program links already), fed the bytes in chunks that its unsigned int length can take. */
static int check_digest(nbg_ctx *ctx, const char *path, int k, const nbgi_cbf_section *s, const unsigned char *data)
{
    if (s->md5[0] == '\0')
        return NBG_OK;
    MD5_CTX md;
    MD5Init(&md);
    for (uint64_t done = 0; done < s->size;) {
        const uint64_t left = s->size - done;
        const unsigned int n = left > (1u << 30) ? (1u << 30) : (unsigned int)left;
        MD5Update(&md, (unsigned char *)(uintptr_t)(data + done), n); /* MD5Update does not write the data */
        done += n;
    }
    unsigned char digest[16];
    char b64[25];
    MD5Final(digest, &md);
    cbf_md5digest_to64(b64, digest);
    if (strcmp(b64, s->md5) != 0)
        return sec_error(ctx, NBG_EFORMAT, path, k, s->at, "its data do not match their Content-MD5 (%s, the data's "
                         "is %s): the file is damaged", s->md5, b64);
    return NBG_OK;
}

/* The little-endian unsigned integer of n bytes at p. */
static uint64_t read_le(const unsigned char *p, int n)
{
    uint64_t v = 0;
    for (int i = n - 1; i >= 0; --i)
        v = v << 8 | p[i];
    return v;
}

static uint64_t read_be(const unsigned char *p, int n)
{
    uint64_t v = 0;
    for (int i = 0; i < n; ++i)
        v = v << 8 | p[i];
    return v;
}

/* The value of an element whose bits (the low 8 * elbytes of v) are given, as nbg_read_image returns it: the
 * integer or real through double to float. */
static inline float element_value(uint64_t v, const nbgi_cbf_section *s)
{
    const int bits = 8 * s->elbytes;
    if (s->elreal) {
        if (bits == 32) {
            const uint32_t u = (uint32_t)v;
            float x;
            memcpy(&x, &u, sizeof x);
            return (float)(double)x;
        }
        double x;
        memcpy(&x, &v, sizeof x);
        return (float)x;
    }
    if (!s->elsigned)
        return (float)(double)v;
    if (bits < 64 && (v >> (bits - 1)) != 0)
        v |= ~UINT64_C(0) << bits; /* sign extension */
    return (float)(double)(int64_t)v;
}

/* The delta after a 1-byte escape (0x80) at src[*pos], per the byte_offset rules; 0 with *pos past it, or the width
 * in bytes of the delta that the stream's end cuts short. */
static int wide_delta(const unsigned char *src, size_t size, size_t *pos, uint64_t *d)
{
    size_t p = *pos + 1;
    int w = 2;
    uint64_t v = 0;
    for (; w <= 8; w *= 2) {
        if (size - p < (size_t)w)
            return w;
        v = read_le(src + p, w);
        p += (size_t)w;
        if (w == 8 || v != UINT64_C(1) << (8 * w - 1))
            break; /* not the escape of this width */
    }
    *d = w == 8 || (v >> (8 * w - 1)) == 0 ? v : v | ~UINT64_C(0) << (8 * w); /* the delta, sign-extended */
    *pos = p;
    return 0;
}

static int decode_byte_offset(nbg_ctx *ctx, const char *path, int k, const nbgi_cbf_section *s,
                              const unsigned char *src, size_t nel, float *out)
{
    const size_t size = (size_t)s->size;
    const uint64_t mask = s->elbytes == 8 ? ~UINT64_C(0) : (UINT64_C(1) << (8 * s->elbytes)) - 1;
    uint64_t acc = 0;
    size_t p = 0;
    for (size_t i = 0; i < nel; ++i) {
        if (p >= size)
            return sec_error(ctx, NBG_EFORMAT, path, k, s->at, "the byte-offset data end before element %zu of the "
                             "%zu declared (all %zu bytes used)", i, nel, size);
        uint64_t d;
        if (src[p] != 0x80) {
            d = (uint64_t)(int64_t)(int8_t)src[p];
            ++p;
        } else {
            const int cut = wide_delta(src, size, &p, &d);
            if (cut != 0)
                return sec_error(ctx, NBG_EFORMAT, path, k, s->at, "the byte-offset data end inside the %d-byte "
                                 "delta of element %zu (at data byte %zu of %zu)", cut, i, p, size);
        }
        acc = (acc + d) & mask; /* the sum in the element's width */
        out[i] = element_value(acc, s);
    }
    if (p != size)
        return sec_error(ctx, NBG_EFORMAT, path, k, s->at, "the byte-offset data hold more than the %zu elements "
                         "declared (%zu of their %zu bytes left after element %zu)", nel, size - p, size, nel - 1);
    return NBG_OK;
}

static void decode_uncompressed(const nbgi_cbf_section *s, const unsigned char *src, size_t nel, float *out)
{
    const int w = s->elbytes;
    for (size_t i = 0; i < nel; ++i) {
        const unsigned char *e = src + i * (size_t)w;
        out[i] = element_value(s->bigendian ? read_be(e, w) : read_le(e, w), s);
    }
}


/* x-CBF_PACKED (the CCP4 packing of J. P. Abrahams as CBFlib writes it), read from the format's description:
 *  - 32 bytes of header: the element count, the minimum, the maximum and a reserved word, 64 bits each
 *    (little-endian); then a bit stream read from the least significant bit of each byte on;
 *  - chunks: a 6-bit code (low 3 bits: the chunk holds 2^c elements; high 3: the index of the width of each
 *    element's difference in 0, 4, 5, 6, 7, 8, 16, 65 bits; 65 means the element's own width, 32, when the data
 *    are averaged, else 65 bits of which the low 32 count), then the differences, two's complement in that width;
 *  - each element is its prediction plus its difference, modulo 2^32 (a signed element is stored offset by 2^31).
 *    The prediction is the element before it ("flat", or no dimensions in the MIME header), else the average
 *    of the neighbours already decoded: the element before it in its row and the three above it (left, same, right)
 *    in the previous row, those that exist (the first column: above and above-right; the last: before and above),
 *    with, from the second section of a 3-D array on (unless "uncorrelated_sections"), the same neighbours one
 *    section back, the one before it moved to the element under the current one; the average of n = 2, 4, 8 of
 *    them is (sum + n/2) >> log2 n in 32-bit two's complement (the sum wraps); the first row of a section uses the
 *    element before it, the first element of a later section the element under it.
 * Each difference is read within the X-Binary-Size bytes and written within the nel elements: a stream that ends
 * early is NBG_EFORMAT naming the element. */
typedef struct {
    const unsigned char *p;
    size_t size, bit; /* bytes, and the next bit to read */
} bitreader;

/* The next n (<= 65) bits as an integer, sign-extended from bit n-1 when n < 32 and signext; -1 when the stream
 * ends first. */
static int get_bits(bitreader *b, unsigned n, int signext, uint32_t *out)
{
    if (n > b->size * 8 - b->bit || b->bit > b->size * 8)
        return -1;
    uint32_t v = 0;
    for (unsigned i = 0; i < n; ++i, ++b->bit) {
        const unsigned bitv = (b->p[b->bit >> 3] >> (b->bit & 7)) & 1u;
        if (i < 32)
            v |= (uint32_t)bitv << i;
    }
    if (signext && n > 0 && n < 32 && (v >> (n - 1)) & 1u)
        v |= ~UINT32_C(0) << n;
    *out = v;
    return 0;
}

static int decode_packed(nbg_ctx *ctx, const char *path, int k, const nbgi_cbf_section *s, const unsigned char *src,
                         size_t nel, float *out)
{
    static const unsigned widths[8] = {0, 4, 5, 6, 7, 8, 16, 65};
    const uint64_t stated = read_le(src, 8);
    if (stated != nel)
        return sec_error(ctx, NBG_EFORMAT, path, k, s->at, "the packed data say %llu elements, the MIME header %zu",
                         (unsigned long long)stated, nel);
    size_t df = (size_t)s->dim[0], dm = (size_t)s->dim[1], ds = (size_t)s->dim[2];
    const int avg = !s->packed_flat && (df != 0 || dm != 0 || ds != 0);
    if (ds == 0)
        ds = 1;
    if (dm == 0)
        dm = 1;
    if (df == 0)
        df = nel / (dm * ds);
    if (avg && (df < 2 || df * dm * ds != nel))
        return sec_error(ctx, NBG_EUNSUP, path, k, s->at, "packed data averaged over a %zu x %zu x %zu array of %zu "
                         "elements are not supported (a row needs 2 elements at least)", df, dm, ds, nel);
    /* elements are kept as the uint32 bits of their value: the signed offset 2^31 only matters to the difference */
    const uint32_t unsign = s->elsigned ? UINT32_C(0x80000000) : 0;
    uint32_t *v = malloc(nel * sizeof *v);
    if (v == NULL)
        return sec_error(ctx, NBG_ENOMEM, path, k, s->at, "out of memory unpacking %zu elements", nel);
    bitreader b = {src + 32, (size_t)s->size - 32, 0};
    uint32_t last = unsign; /* the prediction of the next element, offset by unsign */
    size_t i = 0, f = 0, m = 0, sl = 0; /* the next element and its indices */
    const size_t plane = df * dm;
    int rc = NBG_OK;
    while (i < nel && rc == NBG_OK) {
        uint32_t code;
        if (get_bits(&b, 6, 0, &code) != 0) {
            rc = sec_error(ctx, NBG_EFORMAT, path, k, s->at, "the packed data end before element %zu of %zu", i, nel);
            break;
        }
        size_t count = (size_t)1 << (code & 7);
        unsigned w = widths[(code >> 3) & 7];
        if (avg && w == 65)
            w = 32;
        if (count > nel - i)
            count = nel - i;
        for (size_t c = 0; c < count; ++c, ++i) {
            uint32_t d = 0;
            if (w > 0 && get_bits(&b, w, 1, &d) != 0) {
                rc = sec_error(ctx, NBG_EFORMAT, path, k, s->at, "the packed data end inside element %zu of %zu", i,
                               nel);
                break;
            }
            v[i] = (last + d) - unsign; /* modulo 2^32 */
            out[i] = s->elsigned ? (float)(double)(int32_t)v[i] : (float)(double)v[i];
            if (!avg) {
                last = v[i] + unsign;
                continue;
            }
            /* the indices of element i + 1, and its neighbours */
            if (++f == df) {
                f = 0;
                if (++m == dm)
                    m = 0, ++sl;
            }
            const size_t n = i + 1;
            size_t nb[8];
            int nn = 0;
            if (m > 0) {
                const int first = f == 0, lastcol = f == df - 1;
                size_t here[4];
                int nh = 0;
                if (!first)
                    here[nh++] = n - 1; /* before */
                if (!lastcol || first)
                    here[nh++] = n - df + 1; /* above right */
                here[nh++] = n - df;         /* above */
                if (!first && !lastcol)
                    here[nh++] = n - df - 1; /* above left */
                for (int h = 0; h < nh; ++h) nb[nn++] = here[h];
                if (sl > 0 && !s->packed_uncorrelated) {
                    for (int h = 0; h < nh; ++h)
                        nb[nn++] = here[h] == n - 1 ? n - plane : here[h] - plane;
                }
            } else if (f == 0) {
                nb[nn++] = n - plane; /* the first element of a later section: the one under it */
            } else {
                nb[nn++] = n - 1;
            }
            uint32_t sum = 0;
            for (int h = 0; h < nn; ++h) sum += v[nb[h]];
            const int half = nn >> 1;
            static const int shift[4] = {1, 2, 0, 3};
            const uint32_t a = half > 0 ? (uint32_t)((int32_t)(sum + (uint32_t)half) >> shift[half - 1]) : sum;
            last = a + unsign;
        }
    }
    free(v);
    if (rc == NBG_OK && b.size - (b.bit + 7) / 8 > 8)
        rc = sec_error(ctx, NBG_EFORMAT, path, k, s->at, "the packed data hold %zu bytes more than the %zu elements "
                       "declared", b.size - (b.bit + 7) / 8, nel);
    return rc;
}

int nbgi_cbf_decode(nbg_ctx *ctx, const char *path, const nbgi_cbf_file *f, int k, uint64_t nel, float *out)
{
    int rc = nbgi_cbf_check(ctx, path, f, k, nel);
    if (rc != NBG_OK)
        return rc;
    const nbgi_cbf_section *s = &f->sec[k];
    const unsigned char *src = f->bytes + s->data; /* s->size bytes, inside the file (parse_section) */
    if ((rc = check_digest(ctx, path, k, s, src)) != NBG_OK)
        return rc;
    if (s->compression == NBGI_CBF_BYTE_OFFSET)
        return decode_byte_offset(ctx, path, k, s, src, (size_t)nel, out);
    if (s->compression == NBGI_CBF_PACKED)
        return decode_packed(ctx, path, k, s, src, (size_t)nel, out);
    decode_uncompressed(s, src, (size_t)nel, out);
    return NBG_OK;
}

#endif /* NBG_HAVE_FORMATS */
