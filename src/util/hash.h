/* hash.h — a 64-bit mixing step for building keys out of several words (pointers, sizes): the
 * key of a recorded decode step, for one. Not for untrusted input or persistent formats. */
#ifndef KILN_UTIL_HASH_H
#define KILN_UTIL_HASH_H

#include <stdint.h>

/* Folds v into h (splitmix64 finalizer over h ^ v); never returns 0 for practical inputs. */
static inline uint64_t kiln_hash_mix(uint64_t h, uint64_t v) {
    uint64_t z = h ^ (v + 0x9e3779b97f4a7c15ull + (h << 6) + (h >> 2));
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    z ^= z >> 31;
    return z ? z : 1;
}

#endif
