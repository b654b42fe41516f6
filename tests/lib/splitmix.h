/*
 * splitmix.h -- the tests' seeded generator of inputs (splitmix64): one
 * 64-bit state, a fixed sequence per seed on every machine.  Header-only.
 */
#ifndef AJ_TESTS_SPLITMIX_H
#define AJ_TESTS_SPLITMIX_H

#include <stdint.h>

/* The next 64 random bits of the stream *s, which it advances. */
static inline uint64_t splitmix_next(uint64_t *s)
{
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

#endif /* AJ_TESTS_SPLITMIX_H */
