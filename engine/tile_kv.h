/* engine/tile_kv.h: what the decode kernels of tile_kv.c (AVX2) and tile_kv512.c (AVX-512)
 * share: how far ahead they prefetch, where the rows past a block are, the shape of one kernel,
 * and a task's rows dealt out to the kernels of each group size. Internal to those two files. */
#ifndef ATTND_ENGINE_TILE_KV_H
#define ATTND_ENGINE_TILE_KV_H

#include "attn_int.h"

/* How far ahead the scores kernel prefetches key rows: each pass of a few keys asks for every
 * line of the rows this far ahead (the hardware prefetcher stops at page boundaries, and a block
 * spans several pages). Every row, not one row in three as before: the small preset's 32-session
 * decode step (K/V out of L3) 4.1-4.5 -> 3.1-4.0 ms median over four alternated runs.
 * As far as the weighted sum's (PV_KEYS): near a block's end each kernel prefetches the rows the
 * other reads first (the scores kernel the block's values, the weighted sum the next block's
 * keys), and from there the other prefetches PV_KEYS on; 16 here left rows 16-31 of every value
 * and key run to demand misses (llama8b, 32 sessions at L=2048, bf16: 20.0-20.5 -> 18.6-18.8 ms;
 * 24, 40 and 48 rows in between; 64 slower). */
#define KV_PREFETCH_ROWS 32

/* Keys per run of the weighted sum: a run's value rows stay in L1 while its strips walk them.
 * Each run prefetches the next, so this is also the weighted sum's prefetch distance, which must
 * be the scores kernel's for the two to hand prefetching over at a block's edge. */
#define PV_KEYS KV_PREFETCH_ROWS

/* Row r of a block of n rows at base, rb bytes apart, for prefetching: past the block's end, the
 * rows read after it (`after`: the block's values after its keys, the next block's keys after
 * its values), so the prefetches run on across the edge of a block instead of loading the lines
 * of another head's rows that nobody reads next (at 128 tokens a block, a sixth of the traffic)
 * and leaving the next run's first rows to demand misses. */
__attribute__((always_inline)) static inline const uint8_t *
row_ahead(const uint8_t *base, size_t rb, int32_t n, struct attn__kv_after after, int32_t r) {
    if (r < n || after.rows == NULL) {
        return base + (size_t)r * rb;
    }
    return after.rows + (size_t)(r - n) * after.row_bytes;
}

/* ahead[b] = the row the scores kernel prefetches as it reads key j + b, for b < nk: the key
 * KV_PREFETCH_ROWS further on (row_ahead). */
__attribute__((always_inline)) static inline void keys_ahead(const uint8_t *k, size_t rb, int32_t n,
                                                             struct attn__kv_after after, int32_t j,
                                                             int nk, const uint8_t **ahead) {
#pragma GCC unroll 8
    for (int b = 0; b < nk; b++) {
        ahead[b] = row_ahead(k, rb, n, after, j + KV_PREFETCH_ROWS + b);
    }
}

/* One decode kernel: one group of query rows against a block, scores (in q, out s) or weighted
 * sum (in p, out o). */
typedef void rows_fn(const float *in, size_t ld_in, const uint8_t *rows, size_t rb, int32_t n,
                     struct attn__kv_after after, int32_t d, float *out, size_t ld_out);

/* The m query rows of a task against a block, in groups of at most 4 (fns[MX - 1] takes a group
 * of MX: the decode kernels are specialized per group size). */
static inline void rows_in_groups(rows_fn *const *fns, const float *in, size_t ld_in, int32_t m,
                                  const uint8_t *rows, size_t rb, int32_t n,
                                  struct attn__kv_after after, int32_t d, float *out,
                                  size_t ld_out) {
    int32_t i = 0;
    for (; i + 4 <= m; i += 4) {
        fns[3](in + i * ld_in, ld_in, rows, rb, n, after, d, out + i * ld_out, ld_out);
    }
    if (i < m) {
        fns[m - i - 1](in + i * ld_in, ld_in, rows, rb, n, after, d, out + i * ld_out, ld_out);
    }
}

#endif
