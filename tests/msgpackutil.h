/*
 * msgpackutil.h -- writing DIALS reflection tables (msgpack) in the tests: a string, and a column
 * [name: [type, [count, bytes]]] as DIALS writes one.  Include after <msgpack.h>.
 */
#ifndef NBG_TESTS_MSGPACKUTIL_H
#define NBG_TESTS_MSGPACKUTIL_H

#include <stdint.h>
#include <string.h>

static inline void pack_str(msgpack_packer *pk, const char *s)
{
    msgpack_pack_str(pk, strlen(s));
    msgpack_pack_str_body(pk, s, strlen(s));
}

/* A column [type, [count, bin]] under its name. */
static inline void pack_col(msgpack_packer *pk, const char *name, const char *type, uint64_t count, const void *bytes,
                            size_t size)
{
    pack_str(pk, name);
    msgpack_pack_array(pk, 2);
    pack_str(pk, type);
    msgpack_pack_array(pk, 2);
    msgpack_pack_uint64(pk, count);
    msgpack_pack_bin(pk, size);
    msgpack_pack_bin_body(pk, bytes, size);
}

#endif
