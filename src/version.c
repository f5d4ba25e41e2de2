/*
 * version.c -- the library's version (nbg_version, nbg_version_number; the ABI rules are in include/nbgrad.h).
 */
#include "nbgrad.h"

_Static_assert(NBG_VERSION_MAJOR >= 0 && NBG_VERSION_MINOR >= 0 && NBG_VERSION_MINOR < 100 && NBG_VERSION_PATCH >= 0 &&
                   NBG_VERSION_PATCH < 100,
               "NBG_VERSION_NUMBER holds a minor and a patch version below 100");

const char *nbg_version(void)
{
    return NBG_VERSION;
}

int nbg_version_number(void)
{
    return NBG_VERSION_NUMBER;
}
