/* engine/tile_kv.c: decode attention's inner products against K/V rows as the cache holds them
 * (float, bfloat16, binary16 or Q8_0), widened in registers as they stream (AVX2 + FMA + F16C;
 * bfloat16 two vectors a shuffle each, in a column order of its own: PAIRED):
 * a task's few query rows against a block's keys (scores) and values (weighted sum), one kernel
 * per dtype and row count, prefetching across the edge of a block; and the widening of a block
 * for prefill's tiles. Without AVX2 a block is widened by kv_dtype.c and simd.c does the rest. */
#include "tile_avx2.h"
#include "tile_kv.h"

#ifdef TILE_HAVE_AVX2

/* Horizontal sums of eight vectors: result lane i = sum of v[i]'s lanes. */
__attribute__((always_inline, target("avx2,fma"))) static inline __m256 hsum8x8(const __m256 *v) {
    __m256 s01 = _mm256_hadd_ps(v[0], v[1]), s23 = _mm256_hadd_ps(v[2], v[3]);
    __m256 s45 = _mm256_hadd_ps(v[4], v[5]), s67 = _mm256_hadd_ps(v[6], v[7]);
    __m256 s0123 = _mm256_hadd_ps(s01, s23), s4567 = _mm256_hadd_ps(s45, s67);
    return _mm256_add_ps(_mm256_permute2f128_ps(s0123, s4567, 0x20),
                         _mm256_permute2f128_ps(s0123, s4567, 0x31));
}

/* Horizontal sums of four vectors: result lane i = sum of v[i]'s lanes (half hsum8x8's work). */
__attribute__((always_inline, target("avx2,fma"))) static inline __m128 hsum4x8(const __m256 *v) {
    __m256 s = _mm256_hadd_ps(_mm256_hadd_ps(v[0], v[1]), _mm256_hadd_ps(v[2], v[3]));
    return _mm_add_ps(_mm256_castps256_ps128(s), _mm256_extractf128_ps(s, 1));
}

/* A Q8_0 row's 8 int8 from value c (a multiple of 8), as floats not yet scaled (the weighted
 * sum's weights carry the scales). */
__attribute__((always_inline, target("avx2,fma,f16c"))) static inline __m256
q8_values(const uint8_t *row, int32_t c) {
    const uint8_t *p = row + (size_t)(c / ATTN__QK8_0) * ATTN__Q8_0_BYTES + 2 + c % ATTN__QK8_0;
    return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)p)));
}

/* A strip of bfloat16 values (CW even) is widened two vectors from one 32-byte load
 * (widen_bf16x16: a shuffle each, no shift competing with the FMAs for their ports), each 16
 * columns in the order 0-3 8-11 | 4-7 12-15. The strip's accumulators keep that order; at its
 * ends bf16_lane_swap puts them back in column order. */
#define PAIRED(DT, CW) ((DT) == 1 && (CW) % 2 == 0)

__attribute__((always_inline, target("avx2,fma,f16c"))) static inline void
strip_values(const int DT, const int CW, const uint8_t *row, int32_t c, __m256 *vv) {
    if (PAIRED(DT, CW)) {
#pragma GCC unroll 2
        for (int w = 0; w < CW; w += 2) {
            widen_bf16x16((const uint16_t *)(const void *)row + c + 8 * w, &vv[w], &vv[w + 1]);
        }
        return;
    }
#pragma GCC unroll 4
    for (int w = 0; w < CW; w++) {
        vv[w] = DT == 3 ? q8_values(row, c + 8 * w) : load_w8(DT, row, (size_t)c + 8 * w);
    }
}

/* s[a * lds + b] = q_a . k_b for MX rows and NK keys held as DT: t[b * 4 + a], the sum over the
 * columns before c (the vectors' horizontal sums), plus the columns from c on, one at a time. */
__attribute__((always_inline, target("avx2,fma,f16c"))) static inline void
scores_out(const int DT, const int MX, const int NK, const float *t, const float *q, size_t ldq,
           const uint8_t *k, size_t rb, int32_t c, int32_t d, float *s, size_t lds) {
#pragma GCC unroll 4
    for (int a = 0; a < MX; a++) {
#pragma GCC unroll 3
        for (int b = 0; b < NK; b++) {
            float sum = t[b * 4 + a];
            for (int32_t r = c; r < d; r++) {
                sum += q[a * ldq + r] * load_w1(DT, k + b * rb, (size_t)r);
            }
            s[a * lds + b] = sum;
        }
    }
}

/* s[a * lds + b] = q_a . k_b for MX <= 4 query rows and NK <= 3 keys held as DT (float, bfloat16
 * or binary16; Q8_0 has qk_q8_keys), rb bytes apart:
 * each key vector is widened once and used for every row. ahead[b]: the row to prefetch for key
 * b. PR: bfloat16 keys widened in pairs as strip_values does, against query rows whose every 16
 * columns are in that order (bf16_lane_order; d a multiple of 16). */
__attribute__((always_inline, target("avx2,fma,f16c"))) static inline void
qk_kv_block(const int DT, const int MX, const int NK, const int PR, const float *q, size_t ldq,
            const uint8_t *k, size_t rb, const uint8_t *const *ahead, int32_t d, float *s,
            size_t lds) {
    __m256 acc[16];
#pragma GCC unroll 16
    for (int a = 0; a < 16; a++) {
        acc[a] = _mm256_setzero_ps(); /* unrolled: a loop here became a rep stos per call */
    }
    /* the lines of the rows KV_PREFETCH_ROWS ahead, all at once: no branch in the loop */
#pragma GCC unroll 3
    for (int b = 0; b < NK; b++) {
        for (size_t off = 0; off < KV_BYTE_OF(DT, d); off += 64) {
            _mm_prefetch((const char *)(ahead[b] + off), _MM_HINT_T0);
        }
    }
    int32_t c = 0;
    for (; PR && c + 16 <= d; c += 16) {
        /* widen_bf16x16's order, each half apart: twelve accumulators and a key's two halves
         * would not fit the 16 registers, so each half loads the keys again (from L1) */
#pragma GCC unroll 2
        for (int half = 0; half < 2; half++) {
            __m256 kv[3];
#pragma GCC unroll 3
            for (int b = 0; b < NK; b++) {
                __m256i x = _mm256_loadu_si256(
                    (const __m256i *)((const uint16_t *)(const void *)(k + b * rb) + c));
                kv[b] = _mm256_castsi256_ps(half == 0
                                                ? _mm256_unpacklo_epi16(_mm256_setzero_si256(), x)
                                                : _mm256_unpackhi_epi16(_mm256_setzero_si256(), x));
            }
#pragma GCC unroll 4
            for (int a = 0; a < MX; a++) {
                __m256 qv = _mm256_loadu_ps(q + a * ldq + c + 8 * half);
#pragma GCC unroll 3
                for (int b = 0; b < NK; b++) {
                    acc[b * 4 + a] = _mm256_fmadd_ps(qv, kv[b], acc[b * 4 + a]);
                }
            }
        }
    }
    for (; c + 8 <= d; c += 8) {
        __m256 kv[3];
#pragma GCC unroll 3
        for (int b = 0; b < NK; b++) {
            kv[b] = load_w8(DT, k + b * rb, (size_t)c);
        }
#pragma GCC unroll 4
        for (int a = 0; a < MX; a++) {
            __m256 qv = _mm256_loadu_ps(q + a * ldq + c);
#pragma GCC unroll 3
            for (int b = 0; b < NK; b++) {
                acc[b * 4 + a] = _mm256_fmadd_ps(qv, kv[b], acc[b * 4 + a]);
            }
        }
    }
    float t[16];
    _mm256_storeu_ps(t, hsum8x8(acc)); /* lane b * 4 + a: row a against key b */
    if (NK > 2) {
        _mm_storeu_ps(t + 8, hsum4x8(acc + 8));
    }
    scores_out(DT, MX, NK, t, q, ldq, k, rb, c, d, s, lds);
}

/* The widest query rows the scores kernels copy (4 of them: 8 KiB of stack; see qk_kv_rows). */
#define QUERY_COPY_MAX_D 512

/* s[a * lds + b] = q_a . k_b for MX <= 4 query rows and NK <= 2 Q8_0 keys, rb bytes apart;
 * ahead[b]: the row to prefetch for key b. Each 8 int8 are widened and scaled once for every
 * row. A lone key's 8s alternate between two sets of accumulators: one set, a chain of d / 8
 * dependent FMAs a row, waited on the FMA latency. The blocks' offsets are constants once d is
 * (the loop before this one computed each 8's block and offset from c). */
__attribute__((always_inline, target("avx2,fma,f16c"))) static inline void
qk_q8_keys(const int MX, const int NK, const float *q, size_t ldq, const uint8_t *k, size_t rb,
           const uint8_t *const *ahead, int32_t d, float *s, size_t lds) {
#pragma GCC unroll 2
    for (int b = 0; b < NK; b++) {
        for (size_t off = 0; off < KV_BYTE_OF(3, d); off += 64) {
            _mm_prefetch((const char *)(ahead[b] + off), _MM_HINT_T0);
        }
    }
    __m256 acc[8]; /* [set * 4 + a], the set the key's for two keys */
#pragma GCC unroll 8
    for (int i = 0; i < 8; i++) {
        acc[i] = _mm256_setzero_ps();
    }
    int32_t c = 0;
#pragma GCC unroll 16
    for (; c + ATTN__QK8_0 <= d; c += ATTN__QK8_0) {
        const uint8_t *blk = k + (size_t)c / ATTN__QK8_0 * ATTN__Q8_0_BYTES;
        __m256 scale[2];
#pragma GCC unroll 2
        for (int b = 0; b < NK; b++) {
            uint16_t h;
            memcpy(&h, blk + b * rb, sizeof h);
            scale[b] = _mm256_set1_ps(_cvtsh_ss(h));
        }
#pragma GCC unroll 4
        for (int sub = 0; sub < ATTN__QK8_0 / 8; sub++) {
            __m256 kv[2];
#pragma GCC unroll 2
            for (int b = 0; b < NK; b++) {
                __m128i x = _mm_loadl_epi64((const __m128i *)(blk + b * rb + 2 + 8 * sub));
                kv[b] = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(x)), scale[b]);
            }
#pragma GCC unroll 4
            for (int a = 0; a < MX; a++) {
                __m256 qv = _mm256_loadu_ps(q + a * ldq + c + 8 * sub);
#pragma GCC unroll 2
                for (int b = 0; b < NK; b++) {
                    int set = NK == 1 ? sub & 1 : b;
                    acc[set * 4 + a] = _mm256_fmadd_ps(qv, kv[b], acc[set * 4 + a]);
                }
            }
        }
    }
    for (; c + 8 <= d; c += 8) { /* the last block's whole 8s when d is not whole blocks */
#pragma GCC unroll 2
        for (int b = 0; b < NK; b++) {
            __m256 kv = load_w8(3, k + b * rb, (size_t)c);
#pragma GCC unroll 4
            for (int a = 0; a < MX; a++) {
                acc[b * 4 + a] =
                    _mm256_fmadd_ps(_mm256_loadu_ps(q + a * ldq + c), kv, acc[b * 4 + a]);
            }
        }
    }
    float t[8]; /* lane b * 4 + a: row a against key b */
    if (NK == 1) {
#pragma GCC unroll 4
        for (int a = 0; a < 4; a++) {
            acc[a] = _mm256_add_ps(acc[a], acc[4 + a]);
        }
        _mm_storeu_ps(t, hsum4x8(acc));
    } else {
        _mm256_storeu_ps(t, hsum8x8(acc));
    }
    scores_out(3, MX, NK, t, q, ldq, k, rb, c, d, s, lds);
}

/* Q8_0 keys a pass of the scores: two, eight accumulators (four rows) for the FMA latency, and
 * each query vector loaded once for both (llama8b attention alone, three alternated runs:
 * L=2048 0.61-0.62 ms with one key, 0.58-0.59 with two; L=8192 2.45-2.47, 2.28-2.40). */
#define Q8_KEYS 2

/* One group of MX query rows against the n keys of a block, a few at a time (PR: as qk_kv_block
 * says). */
__attribute__((always_inline, target("avx2,fma,f16c"))) static inline void
qk_kv_keys(const int DT, const int MX, const int PR, const float *q, size_t ldq, const uint8_t *k,
           size_t rb, int32_t n, struct attn__kv_after after, int32_t d, float *s, size_t lds) {
    int32_t j = 0;
    if (DT == 3) {
        for (; j + Q8_KEYS <= n; j += Q8_KEYS) {
            const uint8_t *ahead[2];
            keys_ahead(k, rb, n, after, j, Q8_KEYS, ahead);
            qk_q8_keys(MX, Q8_KEYS, q, ldq, k + (size_t)j * rb, rb, ahead, d, s + j, lds);
        }
        for (; j < n; j++) {
            const uint8_t *ahead[1];
            keys_ahead(k, rb, n, after, j, 1, ahead);
            qk_q8_keys(MX, 1, q, ldq, k + (size_t)j * rb, rb, ahead, d, s + j, lds);
        }
        return;
    }
    /* three keys a pass (12 accumulators hide the FMA latency better than 8: bf16 from L2 18.8
     * -> 16.7 ns a key; paired bfloat16 two a pass, 7% slower) */
    for (; j + 3 <= n; j += 3) {
        const uint8_t *ahead[3];
        keys_ahead(k, rb, n, after, j, 3, ahead);
        qk_kv_block(DT, MX, 3, PR, q, ldq, k + (size_t)j * rb, rb, ahead, d, s + j, lds);
    }
    for (; j < n; j++) {
        const uint8_t *ahead[1];
        keys_ahead(k, rb, n, after, j, 1, ahead);
        qk_kv_block(DT, MX, 1, PR, q, ldq, k + (size_t)j * rb, rb, ahead, d, s + j, lds);
    }
}

/* qk_kv_keys on a copy of the query rows, d apart, where d allows: with the head size a
 * constant every row's address is one register plus a constant (at a stride known only at run
 * time the compiler kept an address per row and 8 columns, spilled to the stack, and reloaded
 * one for each FMA); bfloat16 keys widened in pairs where d allows, against the rows in that
 * order. */
__attribute__((always_inline, target("avx2,fma,f16c"))) static inline void
qk_kv_rows(const int DT, const int MX, const float *q, size_t ldq, const uint8_t *k, size_t rb,
           int32_t n, struct attn__kv_after after, int32_t d, float *s, size_t lds) {
    if (d > QUERY_COPY_MAX_D) {
        qk_kv_keys(DT, MX, 0, q, ldq, k, rb, n, after, d, s, lds);
        return;
    }
    float qc[4 * QUERY_COPY_MAX_D];
    const int paired = DT == 1 && d % 16 == 0;
#pragma GCC unroll 4
    for (int a = 0; a < MX; a++) {
        if (paired) {
            bf16_lane_order(q + a * ldq, d, qc + (size_t)a * d);
        } else {
            memcpy(qc + (size_t)a * d, q + a * ldq, (size_t)d * sizeof *qc);
        }
    }
    if (paired) {
        qk_kv_keys(DT, MX, 1, qc, (size_t)d, k, rb, n, after, d, s, lds);
    } else {
        qk_kv_keys(DT, MX, 0, qc, (size_t)d, k, rb, n, after, d, s, lds);
    }
}

/* acc[a][w] += p[a * ldp] x the value row's columns c + 8 w .. c + 8 w + 8, for MX rows and CW
 * vectors: one key of a strip. */
__attribute__((always_inline, target("avx2,fma,f16c"))) static inline void
pv_key(const int DT, const int MX, const int CW, const float *p, size_t ldp, const uint8_t *row,
       int32_t c, __m256 (*acc)[4]) {
    __m256 vv[4];
    strip_values(DT, CW, row, c, vv);
#pragma GCC unroll 4
    for (int a = 0; a < MX; a++) {
        __m256 pa = _mm256_broadcast_ss(p + a * ldp);
#pragma GCC unroll 4
        for (int w = 0; w < CW; w++) {
            acc[a][w] = _mm256_fmadd_ps(pa, vv[w], acc[a][w]);
        }
    }
}

/* o[:, c .. c + 8 CW) += p v over keys [j0, j1) for MX <= 4 rows, the MX x CW accumulators in
 * registers for the whole run (NS sets over alternate keys when one row alone would wait on the
 * FMA latency). Prefetches the same lines PV_KEYS rows ahead, for the next run. */
__attribute__((always_inline, target("avx2,fma,f16c"))) static inline void
pv_strip(const int DT, const int MX, const int CW, const int NS, const float *p, size_t ldp,
         int32_t pj, const uint8_t *v, size_t rb, int32_t n, struct attn__kv_after after,
         int32_t j0, int32_t j1, int32_t c, float *o, size_t ldo) {
    __m256 acc[2][4][4];
#pragma GCC unroll 2
    for (int u = 0; u < NS; u++) {
#pragma GCC unroll 4
        for (int a = 0; a < MX; a++) {
#pragma GCC unroll 4
            for (int w = 0; w < CW; w++) {
                acc[u][a][w] =
                    u == 0 ? _mm256_loadu_ps(o + a * ldo + c + 8 * w) : _mm256_setzero_ps();
            }
            if (PAIRED(DT, CW) && u == 0) {
#pragma GCC unroll 2
                for (int w = 0; w < CW; w += 2) {
                    bf16_lane_swap(&acc[0][a][w], &acc[0][a][w + 1]);
                }
            }
        }
    }
    /* Every strip prefetches its part of each row PV_KEYS ahead (a line twice when two strips
     * share it: an idle load slot, cheaper than a branch a key). The run's rows ahead are found
     * once: past the block they continue in `after`, at its row size. */
    const uint8_t *ahead = row_ahead(v, rb, n, after, j0 + PV_KEYS) + KV_BYTE_OF(DT, c);
    size_t ahead_rb = j0 + PV_KEYS < n || after.rows == NULL ? rb : after.row_bytes;
    int32_t j = j0;
    if (NS == 1) {
        /* four keys an iteration: one at a time, the loop's own instructions took issue slots
         * from the FMAs (bfloat16 from L1, head_dim 128: three rows 75-80 -> 47-53 cycles a key,
         * two rows 37-39 -> 31-32, four 0-5% fewer; the other dtypes at two and three rows
         * 3-12% fewer) */
#pragma GCC unroll 4
        for (; j < j1; j++) {
            _mm_prefetch((const char *)ahead, _MM_HINT_T0);
            ahead += ahead_rb;
            pv_key(DT, MX, CW, p + (j - pj), ldp, v + (size_t)j * rb, c, acc[0]);
        }
    }
    for (; NS == 2 && j + 2 <= j1; j += 2) {
#pragma GCC unroll 2
        for (int u = 0; u < 2; u++) {
            _mm_prefetch((const char *)ahead, _MM_HINT_T0);
            ahead += ahead_rb;
            pv_key(DT, MX, CW, p + (j + u - pj), ldp, v + (size_t)(j + u) * rb, c, acc[u]);
        }
    }
    for (; j < j1; j++) {
        __m256 vv[4];
        strip_values(DT, CW, v + (size_t)j * rb, c, vv);
#pragma GCC unroll 4
        for (int w = 0; w < CW; w++) {
#pragma GCC unroll 4
            for (int a = 0; a < MX; a++) {
                acc[0][a][w] = _mm256_fmadd_ps(_mm256_broadcast_ss(p + a * ldp + (j - pj)), vv[w],
                                               acc[0][a][w]);
            }
        }
    }
#pragma GCC unroll 4
    for (int a = 0; a < MX; a++) {
        __m256 sum[4];
#pragma GCC unroll 4
        for (int w = 0; w < CW; w++) {
            sum[w] = NS > 1 ? _mm256_add_ps(acc[0][a][w], acc[NS - 1][a][w]) : acc[0][a][w];
        }
        if (PAIRED(DT, CW)) {
#pragma GCC unroll 2
            for (int w = 0; w < CW; w += 2) {
                bf16_lane_swap(&sum[w], &sum[w + 1]);
            }
        }
#pragma GCC unroll 4
        for (int w = 0; w < CW; w++) {
            _mm256_storeu_ps(o + a * ldo + c + 8 * w, sum[w]);
        }
    }
}

/* o[:, c0 .. c1) += p v over keys [j0, j1), one value at a time: the columns after the last
 * whole 8 (p as given, unscaled values widened with their scales). */
__attribute__((always_inline, target("avx2,fma,f16c"))) static inline void
pv_columns1(const int DT, const int MX, const float *p, size_t ldp, const uint8_t *v, size_t rb,
            int32_t j0, int32_t j1, int32_t c0, int32_t c1, float *o, size_t ldo) {
    for (int32_t c = c0; c < c1; c++) {
        for (int32_t j = j0; j < j1; j++) {
            float x = load_w1(DT, v + (size_t)j * rb, (size_t)c);
            for (int a = 0; a < MX; a++) {
                o[a * ldo + c] += p[a * ldp + j] * x;
            }
        }
    }
}

/* Q8_0 blocks whose scales a run folds into its weights at once (a quarter of a head of 1024). */
#define Q8_RUN_BLOCKS 8

/* ps[(b * MX + a) * PV_KEYS + jj] = p[a][j0 + jj] x the scale of block b0 + b of value row
 * j0 + jj, for nj <= PV_KEYS keys and nb <= Q8_RUN_BLOCKS blocks: the weights of a run with its
 * rows' scales in them, so the strips widen each 8 int8 and nothing more (the scale's load,
 * widening, broadcast and multiply for every 8 values cost as much as the widening). */
__attribute__((always_inline, target("avx2,fma,f16c"))) static inline void
q8_scaled_weights(const int MX, const float *p, size_t ldp, const uint8_t *v, size_t rb, int32_t j0,
                  int32_t nj, int32_t b0, int32_t nb, float *ps) {
    uint16_t sh[Q8_RUN_BLOCKS][PV_KEYS];
    for (int32_t jj = 0; jj < nj; jj++) {
        const uint8_t *row = v + (size_t)(j0 + jj) * rb + (size_t)b0 * ATTN__Q8_0_BYTES;
        for (int32_t b = 0; b < nb; b++) {
            memcpy(&sh[b][jj], row + (size_t)b * ATTN__Q8_0_BYTES, sizeof sh[b][jj]);
        }
    }
    for (int32_t b = 0; b < nb; b++) {
#pragma GCC unroll 4
        for (int a = 0; a < MX; a++) {
            const float *pa = p + a * ldp + j0;
            float *out = ps + ((size_t)b * MX + a) * PV_KEYS;
            int32_t jj = 0;
            for (; jj + 8 <= nj; jj += 8) {
                __m256 sv = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(sh[b] + jj)));
                _mm256_storeu_ps(out + jj, _mm256_mul_ps(_mm256_loadu_ps(pa + jj), sv));
            }
            for (; jj < nj; jj++) {
                out[jj] = pa[jj] * _cvtsh_ss(sh[b][jj]);
            }
        }
    }
}

/* o (MX <= 4 rows, d columns) += p v for value rows held as DT, rb bytes apart. Runs of PV_KEYS
 * keys, each walked once per strip of output columns whose accumulators stay in registers: the
 * kernel before this one loaded and stored every accumulator every two keys, which held it to
 * the store port at about half the FMA rate (llama8b decode attention in L3: ~16 GB/s of bf16).
 * Q8_0 takes its weights scaled per block (q8_scaled_weights), Q8_RUN_BLOCKS blocks of columns
 * at a time; a strip (16 or 32 columns from a multiple of its width) lies in one block. */
__attribute__((always_inline, target("avx2,fma,f16c"))) static inline void
pv_kv_rows(const int DT, const int MX, const float *p, size_t ldp, const uint8_t *v, size_t rb,
           int32_t n, struct attn__kv_after after, int32_t d, float *o, size_t ldo) {
    /* strips of CW vectors: 8 accumulators for 2 or 4 rows, 6 for 3, 2 x 4 for a lone row */
    const int CW = MX == 2 || MX == 1 ? 4 : 2, NS = MX == 1 ? 2 : 1;
    const int32_t chunk = DT == 3 ? Q8_RUN_BLOCKS * ATTN__QK8_0 : d;
    float ps[DT == 3 ? Q8_RUN_BLOCKS * 4 * PV_KEYS : 1];
    for (int32_t j0 = 0; j0 < n; j0 += PV_KEYS) {
        int32_t j1 = n - j0 < PV_KEYS ? n : j0 + PV_KEYS;
        for (int32_t c0 = 0; c0 < d; c0 += chunk) {
            int32_t c1 = d - c0 < chunk ? d : c0 + chunk;
            const float *pc = p;
            size_t ldpc = ldp;
            int32_t pj = 0;
            if (DT == 3) {
                q8_scaled_weights(MX, p, ldp, v, rb, j0, j1 - j0, c0 / ATTN__QK8_0,
                                  (c1 - c0 + ATTN__QK8_0 - 1) / ATTN__QK8_0, ps);
                ldpc = PV_KEYS;
                pj = j0;
            }
            int32_t c = c0;
            for (; c + 8 * CW <= c1; c += 8 * CW) {
                if (DT == 3) {
                    pc = ps + (size_t)((c - c0) / ATTN__QK8_0) * MX * PV_KEYS;
                }
                pv_strip(DT, MX, CW, NS, pc, ldpc, pj, v, rb, n, after, j0, j1, c, o, ldo);
            }
            for (; c + 8 <= c1; c += 8) {
                if (DT == 3) {
                    pc = ps + (size_t)((c - c0) / ATTN__QK8_0) * MX * PV_KEYS;
                }
                pv_strip(DT, MX, 1, NS, pc, ldpc, pj, v, rb, n, after, j0, j1, c, o, ldo);
            }
            pv_columns1(DT, MX, p, ldp, v, rb, j0, j1, c, c1, o, ldo);
        }
    }
}

/* The decode kernels as one function per dtype and row count, each taking one group of query
 * rows against a block: scores (qk: in q, out s) or weighted sum (pv: in p, out o). Inlined into
 * one dispatching function, their loops shared its registers with every other variant's and
 * spilled scalars in the inner loops (the weighted sum of 4 rows at head_dim 128 from L2: ~25 ns
 * a key, against ~13 for the same loop compiled alone). Each has the common head sizes, 64 and
 * 128, as constants, so their loops over d unroll with no remainder tests. */
#define ROWS_KERNEL(kind, DT, MX)                                                                  \
    __attribute__((noinline, target("avx2,fma,f16c"))) static void kind##_rows_##DT##_##MX(        \
        const float *in, size_t ld_in, const uint8_t *rows, size_t rb, int32_t n,                  \
        struct attn__kv_after after, int32_t d, float *out, size_t ld_out) {                       \
        if (d == 128) {                                                                            \
            kind##_kv_rows(DT, MX, in, ld_in, rows, rb, n, after, 128, out, ld_out);               \
        } else if (d == 64) {                                                                      \
            kind##_kv_rows(DT, MX, in, ld_in, rows, rb, n, after, 64, out, ld_out);                \
        } else {                                                                                   \
            kind##_kv_rows(DT, MX, in, ld_in, rows, rb, n, after, d, out, ld_out);                 \
        }                                                                                          \
    }
#define ROWS_KERNELS(DT, MX) ROWS_KERNEL(qk, DT, MX) ROWS_KERNEL(pv, DT, MX)
#define ROWS_KERNELS_DT(DT)                                                                        \
    ROWS_KERNELS(DT, 1) ROWS_KERNELS(DT, 2) ROWS_KERNELS(DT, 3) ROWS_KERNELS(DT, 4)
ROWS_KERNELS_DT(0)
ROWS_KERNELS_DT(1)
ROWS_KERNELS_DT(2)
ROWS_KERNELS_DT(3)
#define ROWS_TABLE(kind, DT)                                                                       \
    { kind##_rows_##DT##_1, kind##_rows_##DT##_2, kind##_rows_##DT##_3, kind##_rows_##DT##_4 }
static rows_fn *const qk_rows[4][4] = {ROWS_TABLE(qk, 0), ROWS_TABLE(qk, 1), ROWS_TABLE(qk, 2),
                                       ROWS_TABLE(qk, 3)};
static rows_fn *const pv_rows[4][4] = {ROWS_TABLE(pv, 0), ROWS_TABLE(pv, 1), ROWS_TABLE(pv, 2),
                                       ROWS_TABLE(pv, 3)};

/* The kernels' index of a KV dtype: 0 float, 1 bfloat16, 2 binary16, 3 Q8_0. */
static int kernel_dtype(attn_dtype dt) {
    switch (dt) {
    case ATTN_DTYPE_BF16:
        return 1;
    case ATTN_DTYPE_F16:
        return 2;
    case ATTN_DTYPE_Q8_0:
        return 3;
    default:
        return 0;
    }
}

__attribute__((always_inline, target("avx2,fma,f16c"))) static inline void
widen_t(const int DT, const uint8_t *src, size_t rb, int32_t n, int32_t d, float *dst, size_t ld) {
    for (int32_t j = 0; j < n; j++) {
        const uint8_t *row = src + (size_t)j * rb;
        float *out = dst + (size_t)j * ld;
        int32_t c = 0;
        for (; c + 8 <= d; c += 8) {
            _mm256_storeu_ps(out + c, load_w8(DT, row, (size_t)c));
        }
        for (; c < d; c++) {
            out[c] = load_w1(DT, row, (size_t)c);
        }
    }
}

/* CALL(DT) with the kernels' constant index of KV dtype dt (see kernel_dtype). */
#define KV_DISPATCH(dt, CALL)                                                                      \
    do {                                                                                           \
        switch (dt) {                                                                              \
        case ATTN_DTYPE_BF16:                                                                      \
            CALL(1);                                                                               \
            break;                                                                                 \
        case ATTN_DTYPE_F16:                                                                       \
            CALL(2);                                                                               \
            break;                                                                                 \
        case ATTN_DTYPE_Q8_0:                                                                      \
            CALL(3);                                                                               \
            break;                                                                                 \
        default:                                                                                   \
            CALL(0);                                                                               \
            break;                                                                                 \
        }                                                                                          \
    } while (0)

__attribute__((target("avx2,fma,f16c"))) static void widen_avx2(attn_dtype dt, const uint8_t *src,
                                                                size_t rb, int32_t n, int32_t d,
                                                                float *dst, size_t ld) {
#define WIDEN(DT) widen_t(DT, src, rb, n, d, dst, ld)
    KV_DISPATCH(dt, WIDEN);
#undef WIDEN
}

#endif /* TILE_HAVE_AVX2 */

void attn__small_qk_kv(attn_dtype dt, const float *q, size_t ldq, int32_t m, const uint8_t *k,
                       size_t row_bytes, int32_t n, struct attn__kv_after after, int32_t d,
                       float *s, size_t lds, float *widen) {
#ifdef TILE_HAVE_AVX2
    if (attn__kv512_covers(dt, d)) {
        attn__kv512_qk(dt, q, ldq, m, k, row_bytes, n, after, d, s, lds);
        return;
    }
    if (attn__tile_is_fast()) {
        rows_in_groups(qk_rows[kernel_dtype(dt)], q, ldq, m, k, row_bytes, n, after, d, s, lds);
        return;
    }
#endif
    attn__kv_widen_portable(dt, k, row_bytes, n, d, widen, (size_t)d);
    attn__qk(q, ldq, m, widen, (size_t)d, n, d, s, lds);
}

void attn__small_pv_kv(attn_dtype dt, const float *p, size_t ldp, int32_t m, const uint8_t *v,
                       size_t row_bytes, int32_t n, struct attn__kv_after after, int32_t d,
                       float *o, size_t ldo, float *widen) {
#ifdef TILE_HAVE_AVX2
    if (attn__kv512_covers(dt, d)) {
        attn__kv512_pv(dt, p, ldp, m, v, row_bytes, n, after, d, o, ldo);
        return;
    }
    if (attn__tile_is_fast()) {
        rows_in_groups(pv_rows[kernel_dtype(dt)], p, ldp, m, v, row_bytes, n, after, d, o, ldo);
        return;
    }
#endif
    attn__kv_widen_portable(dt, v, row_bytes, n, d, widen, (size_t)d);
    attn__pv(p, ldp, m, widen, (size_t)d, n, d, o, ldo);
}

void attn__kv_widen(attn_dtype dt, const uint8_t *src, size_t row_bytes, int32_t n, int32_t d,
                    float *dst, size_t ld) {
#ifdef TILE_HAVE_AVX2
    if (attn__tile_is_fast()) {
        widen_avx2(dt, src, row_bytes, n, d, dst, ld);
        return;
    }
#endif
    attn__kv_widen_portable(dt, src, row_bytes, n, d, dst, ld);
}
