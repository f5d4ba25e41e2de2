// mtzread.cc -- CCP4 MTZ files through gemmi (Debian gemmi-dev, header-only): the one C++ translation unit of the
// library, behind the plain C interface of mtz.h (nbgi_mtz_expand).  Built into the formats plug-in (or the library
// where the formats are linked in), so that the program's start-up does not load the C++ runtime.
//
// gemmi sizes its vectors from the header's counts (NCOL's reflections and batches, SYMINF's operations, NDIF) and
// parses the header's numbers without overflow checks, so the file is walked here first, record by record as gemmi
// will read it: every count is checked against the bytes the file holds and the memory limit, and every header
// record gemmi parses must be text with integers of at most 9 digits (a real's fraction may be longer).  gemmi then reads the bytes in memory through
// a stream that never seeks or reads outside them.  Every exception is caught and becomes a message.
#include "mtz.h"

#include <algorithm>
#include <cmath>
#include <cstdarg>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <string>
#include <vector>

#include <gemmi/mtz.hpp>

#include "nbgrad.h"

namespace {

// The largest index magnitude accepted (the HKL reader's IO_MAX_INDEX).
const double MAX_INDEX = 1000000.0;

// Bytes in memory as the stream gemmi's readers take (read, seek, read_rest), bounded on every side.  A history
// line (at an offset in hist) is handed over with a blank first byte made '_': gemmi 0.5.7 trims a history line
// from its first non-blank byte + 80, past the end of its 81-byte buffer, when the line starts with two blanks.
struct Bytes {
    const char *start, *end, *cur;
    const std::vector<size_t> *hist;
    bool read(void *buf, size_t n)
    {
        if (n > (size_t)(end - cur))
            return false;
        if (n == 0) // (a batch of no words: gemmi passes an empty vector's null data())
            return true;
        std::memcpy(buf, cur, n);
        if (n == 80 && std::binary_search(hist->begin(), hist->end(), (size_t)(cur - start))) {
            char *c = (char *)buf;
            if (c[0] == ' ' || c[0] == '\t' || c[0] == '\n' || c[0] == '\r' || c[0] == '\v' || c[0] == '\f')
                c[0] = '_';
        }
        cur += n;
        return true;
    }
    std::string read_rest()
    {
        std::string s(cur, end);
        cur = end;
        return s;
    }
    int seek(std::ptrdiff_t off)
    {
        if (off < 0 || off >= end - start)
            return 0;
        cur = start + off;
        return 1;
    }
};

struct Fail {
    int code;
    std::string msg;
};

[[noreturn]] void refuse(int code, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void refuse(int code, const char *fmt, ...)
{
    char buf[900];
    va_list ap;
    va_start(ap, fmt);
    std::vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    throw Fail{code, buf};
}

bool space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f'; }

// A header record (80 bytes at p, from byte at) that gemmi parses: text, and no run of more than 9 digits (gemmi's
// simple_atoi would overflow).
void text_record(const unsigned char *p, size_t at, const char *what)
{
    int run = 0;
    bool fraction = false; // the digits after a decimal point (a real's, which gemmi reads as one)
    for (int i = 0; i < 80; ++i) {
        if (p[i] >= 0x80)
            refuse(NBG_EFORMAT, "the %s record at byte %zu is not text (byte %d is 0x%02x)", what, at, i, p[i]);
        const bool digit = p[i] >= '0' && p[i] <= '9';
        if (digit && run == 0)
            fraction = i > 0 && p[i - 1] == '.';
        run = digit ? run + 1 : 0;
        if (run > 9 && !fraction)
            refuse(NBG_EFORMAT, "the %s record at byte %zu holds a number of more than 9 digits", what, at);
    }
}

// The first 4 bytes of a record that gemmi only compares with a keyword.
void key_bytes(const unsigned char *p, size_t at)
{
    for (int i = 0; i < 4; ++i)
        if (p[i] >= 0x80)
            refuse(NBG_EFORMAT, "the header record at byte %zu does not start with text", at);
}

// The record as gemmi sees it (NUL-terminated at 80).
std::string record(const unsigned char *p)
{
    char line[81];
    std::memcpy(line, p, 80);
    line[80] = '\0';
    return std::string(line);
}

// gemmi's comparison of a record's first 3 or 4 bytes with a keyword (ialpha3_id, ialpha4_id: case ignored)
bool is_key(const unsigned char *p, const char *key)
{
    const size_t n = std::strlen(key);
    for (size_t i = 0; i < n; ++i)
        if ((p[i] & ~0x20) != (key[i] & ~0x20))
            return false;
    return true;
}

// The integers after the record's first word, as gemmi's simple_atoi reads them.
std::vector<long> ints_after_word(const std::string &r, int n)
{
    std::vector<long> v;
    size_t i = 0;
    while (i < r.size() && !space(r[i]))
        ++i;
    for (int k = 0; k < n; ++k) {
        while (i < r.size() && space(r[i]))
            ++i;
        long sign = 1, x = 0;
        if (i < r.size() && (r[i] == '-' || r[i] == '+'))
            sign = r[i++] == '-' ? -1 : 1;
        while (i < r.size() && r[i] >= '0' && r[i] <= '9')
            x = x * 10 + (r[i++] - '0');
        v.push_back(sign * x);
    }
    return v;
}

// Walks the file as gemmi will read it and checks what gemmi sizes from it (see the top of the file).
void prescan(const unsigned char *b, size_t len, double max_bytes, std::vector<size_t> &hist)
{
    if (len < 80)
        refuse(NBG_EFORMAT, "not an MTZ file: %zu bytes, less than its 80-byte header", len);
    if (std::memcmp(b, "MTZ ", 4) != 0)
        refuse(NBG_EFORMAT, "not an MTZ file (it does not start with \"MTZ \")");
    const bool swap = (b[9] & 0xf0) == (gemmi::is_little_endian() ? 0x10 : 0x40);
    int32_t off32;
    std::memcpy(&off32, b + 4, 4);
    if (swap)
        gemmi::swap_four_bytes(&off32);
    int64_t off = off32;
    if (off32 == -1) {
        std::memcpy(&off, b + 12, 8);
        if (swap)
            gemmi::swap_eight_bytes(&off);
    }
    if (off < 21 || (uint64_t)(off - 1) > (uint64_t)(len - 80) / 4)
        refuse(NBG_EFORMAT, "the header offset (word %lld) is not within the file's %zu bytes (truncated?)",
               (long long)off, len);
    const size_t hpos = 4 * (size_t)(off - 1);
    long ncol = 0, nrefl = 0, nbatch = 0, ncolu = 0, nrec = 0;
    bool end = false;
    size_t at = hpos;
    for (; at + 80 <= len; at += 80) {
        const unsigned char *p = b + at;
        text_record(p, at, "header");
        ++nrec;
        const std::string r = record(p);
        if (is_key(p, "END")) { // as gemmi: any record whose first 3 letters are END
            end = true;
            at += 80;
            break;
        }
        if (is_key(p, "NCOL")) {
            const std::vector<long> v = ints_after_word(r, 3);
            if (v[0] < 0 || v[1] < 0 || v[2] < 0)
                refuse(NBG_EFORMAT, "the NCOL record declares %ld columns, %ld reflections and %ld batches", v[0],
                       v[1], v[2]);
            ncol = v[0]; // as gemmi: the last NCOL record counts
            nrefl = v[1];
            nbatch = v[2];
        } else if (is_key(p, "SYMI")) {
            const long n = ints_after_word(r, 1)[0];
            if (n < 0 || n > 384)
                refuse(NBG_EFORMAT, "the SYMINF record declares %ld symmetry operations", n);
        } else if (is_key(p, "NDIF")) {
            const long n = ints_after_word(r, 1)[0];
            if (n < 0 || (size_t)n > len / 80)
                refuse(NBG_EFORMAT, "the NDIF record declares %ld datasets", n);
        } else if (is_key(p, "COLU")) {
            ++ncolu;
        }
    }
    ncol = std::max(ncol, ncolu); // gemmi sizes its data by the COLUMN records (and refuses another NCOL count)
    const double data = 4.0 * (double)ncol * (double)nrefl;
    if (data > (double)(hpos - 80))
        refuse(NBG_EFORMAT, "the header declares %ld columns of %ld reflections (%.0f bytes), and the file holds "
               "%zu bytes of data before its header (truncated or corrupted)", ncol, nrefl, data, hpos - 80);
    if (data > max_bytes)
        refuse(NBG_ENOMEM, "%ld columns of %ld reflections (%.3g GB) exceed the memory limit (%.3g GB; "
               "nbg_ctx_set_limits)", ncol, nrefl, data / 1e9, max_bytes / 1e9);
    if ((double)nbatch * 240 > (double)(len - hpos) || nbatch > 10000000)
        refuse(NBG_EFORMAT, "the NCOL record declares %ld batches, more than its %zu header bytes can hold", nbatch,
               len - hpos);
    if (!end)
        refuse(NBG_EFORMAT, "the header (from byte %zu) has no END record (truncated?)", hpos);
    // the history and batch headers, up to MTZENDOFHEADERS (which a complete file has)
    bool mtze = false;
    long history = 0; // history lines still to come (gemmi reads them as text, whatever their first word)
    while (at + 80 <= len) {
        const unsigned char *p = b + at;
        key_bytes(p, at);
        const std::string r = record(p);
        at += 80;
        if (is_key(p, "MTZE")) {
            mtze = true;
            break;
        }
        if (history > 0) {
            --history;
            hist.push_back(at - 80);
        } else if (is_key(p, "MTZH")) {
            text_record(p, at - 80, "MTZHIST");
            const long n = ints_after_word(r, 1)[0];
            if (n < 0 || n > 30)
                refuse(NBG_EFORMAT, "the MTZHIST record at byte %zu declares %ld history lines (at most 30)", at - 80,
                       n);
            history = n;
        } else if (is_key(p, "MTZB")) {
            for (long k = 0; k < nbatch; ++k) {
                if (at + 160 > len)
                    refuse(NBG_EFORMAT, "batch header %ld of %ld is cut off at byte %zu (truncated?)", k + 1, nbatch,
                           len);
                text_record(b + at, at, "batch");
                const std::string bh = record(b + at);
                if (!is_key(b + at, "BH "))
                    refuse(NBG_EFORMAT, "batch header %ld (byte %zu) does not start with BH", k + 1, at);
                const std::vector<long> v = ints_after_word(bh, 4);
                if (v[2] < 0 || v[3] < 0 || v[1] != v[2] + v[3] || v[1] > 1000)
                    refuse(NBG_EFORMAT, "batch header %ld (byte %zu) declares %ld words: %ld integers and %ld reals",
                           k + 1, at, v[1], v[2], v[3]);
                at += 160 + 4 * (size_t)v[1]; // BH, its title, its words
                if (at + 80 > len)
                    refuse(NBG_EFORMAT, "batch header %ld of %ld is cut off at byte %zu (truncated?)", k + 1, nbatch,
                           len);
                text_record(b + at, at, "batch");
                at += 80; // BHCH
            }
        }
    }
    if (!mtze)
        refuse(NBG_EFORMAT, "the headers end without an MTZENDOFHEADERS record at byte %zu (truncated?)", len);
}

// The space group's operations as rotations (gemmi's Op, DEN-scaled), from gemmi's table when the file's symbol is
// known, else from its SYMM records (rotations of -1, 0 and 1 only).
std::vector<gemmi::Op> rotations(const gemmi::Mtz &mtz, std::string &name)
{
    std::vector<gemmi::Op> ops;
    if (mtz.spacegroup != nullptr) {
        for (const gemmi::Op &op : mtz.spacegroup->operations().sym_ops)
            ops.push_back(op);
        name = mtz.spacegroup->xhm();
        return ops;
    }
    if (mtz.symops.empty())
        refuse(NBG_EFORMAT, "no space group: gemmi does not know \"%.40s\" and no symmetry operations",
               mtz.spacegroup_name.c_str());
    for (const gemmi::Op &op : mtz.symops) {
        for (int i = 0; i < 3; ++i)
            for (int j = 0; j < 3; ++j)
                if (op.rot[i][j] != 0 && op.rot[i][j] != gemmi::Op::DEN && op.rot[i][j] != -gemmi::Op::DEN)
                    refuse(NBG_EFORMAT, "the symmetry operation %s is not a crystallographic rotation",
                           op.triplet().c_str());
        ops.push_back(op);
    }
    name = "\"" + mtz.spacegroup_name + "\" (from the file's " + std::to_string(ops.size()) + " operations)";
    return ops;
}

const gemmi::Mtz::Column *find(const gemmi::Mtz &mtz, const std::string &label)
{
    for (const gemmi::Mtz::Column &c : mtz.columns)
        if (c.label == label)
            return &c;
    return nullptr;
}

// The label of an anomalous column's partner ("F(+)" for "F(-)" and back), "" when it has none.
std::string partner(const std::string &label)
{
    const size_t p = label.find("(+)"), m = label.find("(-)");
    if (p != std::string::npos)
        return label.substr(0, p) + "(-)" + label.substr(p + 3);
    if (m != std::string::npos)
        return label.substr(0, m) + "(+)" + label.substr(m + 3);
    return "";
}

std::string labels(const gemmi::Mtz &mtz)
{
    std::string s;
    for (const gemmi::Mtz::Column &c : mtz.columns) {
        if (!s.empty())
            s += ", ";
        s += c.label + " (" + std::string(1, c.type ? c.type : '?') + ")";
        if (s.size() > 400) {
            s += ", ...";
            break;
        }
    }
    return s;
}

void expand(const unsigned char *buf, size_t len, const char *label, double max_bytes, nbgi_mtz_result *r,
            std::vector<nbgi_hkl_entry> &out)
{
    std::vector<size_t> hist;
    prescan(buf, len, max_bytes, hist);
    gemmi::Mtz mtz;
    mtz.warnings = nullptr;
    Bytes s{(const char *)buf, (const char *)buf + len, (const char *)buf, &hist};
    try {
        mtz.read_stream(s, true);
    } catch (const std::bad_alloc &) {
        throw;
    } catch (const std::exception &e) {
        refuse(NBG_EFORMAT, "not a readable MTZ file: %s", e.what());
    }
    if (mtz.columns.size() < 3 || mtz.columns[0].type != 'H' || mtz.columns[1].type != 'H' ||
        mtz.columns[2].type != 'H')
        refuse(NBG_EFORMAT, "the first three columns are not the Miller indices H, K, L (type H); the file's columns are %s",
               labels(mtz).c_str());
    const gemmi::Mtz::Column *col = nullptr;
    if (label != nullptr && label[0] != '\0') {
        col = find(mtz, label);
        if (col == nullptr)
            refuse(NBG_EINVAL, "no column \"%.64s\" (-hkl_column); the file's columns are %s", label,
                   labels(mtz).c_str());
        if (std::strchr("FJGK", col->type) == nullptr || col->type == '\0')
            refuse(NBG_EINVAL, "column \"%.64s\" is of type %c: nbgrad reads amplitudes (type F, or G for F(+)/F(-)) "
                   "or intensities (type J, or K for I(+)/I(-)); the file's columns are %s", label,
                   col->type ? col->type : '?', labels(mtz).c_str());
    } else {
        for (char t : {'F', 'J'}) {
            for (const gemmi::Mtz::Column &c : mtz.columns)
                if (c.type == t) {
                    col = &c;
                    break;
                }
            if (col != nullptr)
                break;
        }
        if (col == nullptr)
            refuse(NBG_EINVAL, "no amplitude (type F) or intensity (type J) column; the file's columns are %s (choose "
                   "one with -hkl_column)", labels(mtz).c_str());
    }
    const bool anomalous = col->type == 'G' || col->type == 'K';
    const bool intensity = col->type == 'J' || col->type == 'K';
    // the columns filling +hkl and -hkl: the chosen one both for F and J (Friedel's law), each its half for G, K
    const gemmi::Mtz::Column *plus = col, *minus = col;
    std::string other;
    if (anomalous) {
        const std::string pl = partner(col->label);
        const gemmi::Mtz::Column *pc = pl.empty() ? nullptr : find(mtz, pl);
        if (pc != nullptr && pc->type != col->type)
            pc = nullptr;
        const bool is_minus = col->label.find("(-)") != std::string::npos;
        plus = is_minus ? pc : col;
        minus = is_minus ? col : pc;
        other = pc != nullptr ? pc->label : "";
    }
    std::string sgname;
    const std::vector<gemmi::Op> ops = rotations(mtz, sgname);
    const size_t nrows = (size_t)mtz.nreflections, stride = mtz.columns.size();
    if (mtz.data.size() < nrows * stride)
        refuse(NBG_EFORMAT, "fewer values than the header declares");
    const double est = (double)nrows * (double)ops.size() * 2 * sizeof(nbgi_hkl_entry);
    if (est > max_bytes)
        refuse(NBG_ENOMEM, "%zu reflections expanded by %zu operations and Friedel mates (%.3g GB) exceed the "
               "memory limit (%.3g GB; nbg_ctx_set_limits)", nrows, ops.size(), est / 1e9, max_bytes / 1e9);
    long used = 0, missing = 0;
    std::vector<nbgi_hkl_entry> row;
    for (size_t i = 0; i < nrows; ++i) {
        const float *v = mtz.data.data() + i * stride;
        int hkl[3];
        for (int a = 0; a < 3; ++a) {
            const double x = v[a];
            if (!(std::fabs(x) <= MAX_INDEX) || x != std::floor(x))
                refuse(NBG_EFORMAT, "reflection %zu's index %c = %g is not an integer of magnitude at most %g",
                       i + 1, "HKL"[a], x, MAX_INDEX);
            hkl[a] = (int)x;
        }
        row.clear();
        bool any = false;
        for (int sign : {1, -1}) {
            const gemmi::Mtz::Column *c = sign > 0 ? plus : minus;
            if (c == nullptr)
                continue;
            const double x = v[c->idx];
            if (std::isnan(x))
                continue;
            if (!std::isfinite(x) || (!intensity && x < 0))
                refuse(NBG_EFORMAT, "reflection %zu (%d %d %d): %s = %g is not %s", i + 1, hkl[0], hkl[1], hkl[2],
                       c->label.c_str(), x, intensity ? "finite" : "a finite non-negative amplitude");
            const double F = intensity ? std::sqrt(std::max(x, 0.0)) : x;
            any = true;
            for (const gemmi::Op &op : ops) {
                const gemmi::Op::Miller m = op.apply_to_hkl({{sign * hkl[0], sign * hkl[1], sign * hkl[2]}});
                row.push_back({m[0], m[1], m[2], F});
                if (!anomalous)
                    row.push_back({-m[0], -m[1], -m[2], F});
            }
        }
        if (!any) {
            ++missing;
            continue;
        }
        ++used;
        // each index once per row (special positions and centric reflections map onto themselves), in index order;
        // where the two halves of an anomalous pair meet (centric), the plus half's value is kept
        std::stable_sort(row.begin(), row.end(), [](const nbgi_hkl_entry &a, const nbgi_hkl_entry &b) {
            return a.h != b.h ? a.h < b.h : a.k != b.k ? a.k < b.k : a.l < b.l;
        });
        for (size_t j = 0; j < row.size(); ++j)
            if (j == 0 || row[j].h != row[j - 1].h || row[j].k != row[j - 1].k || row[j].l != row[j - 1].l)
                out.push_back(row[j]);
    }
    if (used == 0)
        refuse(NBG_EFORMAT, "column %s has no value (all %zu reflections are missing)", col->label.c_str(), nrows);
    r->nrows = (long)nrows;
    r->nused = used;
    r->nmissing = missing;
    std::string how = intensity ? "intensities, F = sqrt(max(I, 0))" : "amplitudes";
    std::string friedel = anomalous ? (other.empty() ? "no Friedel mates (an anomalous column without its partner)"
                                                     : "its partner " + other + " for the Friedel mates")
                                    : "Friedel mates";
    std::snprintf(r->info, sizeof r->info,
                  "column %s (type %c, %s) of %zu reflections (%ld missing left out), expanded under %s (%zu "
                  "operations) with %s to %zu entries",
                  col->label.c_str(), col->type, how.c_str(), nrows, missing, sgname.c_str(), ops.size(),
                  friedel.c_str(), out.size());
}

} // namespace

extern "C" int nbgi_mtz_expand(const unsigned char *buf, size_t len, const char *label, double max_bytes,
                               nbgi_mtz_result *r)
{
    std::memset(r, 0, sizeof *r);
    int code = NBG_OK;
    try {
        std::vector<nbgi_hkl_entry> out;
        expand(buf, len, label, max_bytes, r, out);
        r->ent = (nbgi_hkl_entry *)std::malloc(sizeof(nbgi_hkl_entry) * (out.empty() ? 1 : out.size()));
        if (r->ent == nullptr)
            throw std::bad_alloc();
        std::memcpy(r->ent, out.data(), sizeof(nbgi_hkl_entry) * out.size());
        r->n = out.size();
        return NBG_OK;
    } catch (const Fail &f) {
        code = f.code;
        std::snprintf(r->msg, sizeof r->msg, "%s", f.msg.c_str());
    } catch (const std::bad_alloc &) {
        code = NBG_ENOMEM;
        std::snprintf(r->msg, sizeof r->msg, "out of memory");
    } catch (const std::exception &e) {
        code = NBG_EFORMAT;
        std::snprintf(r->msg, sizeof r->msg, "not a readable MTZ file: %s", e.what());
    } catch (...) {
        code = NBG_EFORMAT;
        std::snprintf(r->msg, sizeof r->msg, "not a readable MTZ file");
    }
    std::free(r->ent);
    r->ent = nullptr;
    r->n = 0;
    r->info[0] = '\0';
    return code;
}
