/* bench/bench_rand.h: the benchmark programs' input generator (splitmix64 -> uniform floats).
 * Header-only because attn_bench and attn_load are separate programs; inputs only need to be
 * ordinary numbers (no denormals, no NaN) for the timings to mean something.
 */
#ifndef BENCH_BENCH_RAND_H
#define BENCH_BENCH_RAND_H

#include <stddef.h>
#include <stdint.h>

/* Fills p[0 .. n) with floats uniform in [-1, 1) from a splitmix64 stream seeded by seed. */
static inline void bench_rand_fill(float *p, size_t n, uint64_t seed) {
    uint64_t s = seed;
    for (size_t i = 0; i < n; i++) {
        s += 0x9e3779b97f4a7c15ull;
        uint64_t z = s;
        z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
        z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
        z ^= z >> 31;
        /* The top 24 bits give a float in [0, 2) exactly; shift it to [-1, 1). */
        p[i] = (float)((double)(z >> 40) / (double)(1ull << 23) - 1.0);
    }
}

#endif /* BENCH_BENCH_RAND_H */
