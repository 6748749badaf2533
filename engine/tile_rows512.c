/* engine/tile_rows512.c: the projections of a small batch (4 to 32 tokens) in AVX-512 (F, BW),
 * for CPUs that have it: tile_rows.c's blocks of input rows against float weight rows (half
 * precision ones are panel.c's), with 16 lanes an FMA and 32 registers, so a block is 4 input rows
 * by 6 weight rows (24 accumulators) instead of 4 by 3. Every input vector loaded feeds six FMAs,
 * and each weight row streams once per 4 input rows from L1. A lone token (and 2-3) stays with
 * tile_rows.c's dot_row1: it is bound by the weights' stream, not by arithmetic. */
#include "tile_avx2.h"

#ifdef TILE_HAVE_AVX2

#define T512 target("avx512f,avx512bw,avx512dq,avx512vl,avx2,fma,f16c")

/* Sixteen weights from value i of w as floats, in column order (bfloat16: zero-extended and
 * shifted, two instructions; the unpacks that take one would put x's columns out of order, and
 * x is shared by every weight row). */
__attribute__((always_inline, T512)) static inline __m512 load_w16(const int DT, const void *w,
                                                                   size_t i) {
    if (DT == 0) {
        return _mm512_loadu_ps((const float *)w + i);
    }
    __m256i h = _mm256_loadu_si256((const __m256i *)((const uint16_t *)w + i));
    if (DT == 1) {
        return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
    }
    return _mm512_cvtph_ps(h);
}

/* Columns a weight group's pass covers: six bfloat16 rows of 1024 (12 KiB) stay in L1 while
 * every four input rows take their turn, where whole rows (llama's 4096: 48 KiB) came from L2
 * for each. */
#define ROWS512_CHUNK 1024

/* y[a * ldy + b] (+)= the sum over columns [c0, c1) of x_a w_b, for MX <= 4 input rows and
 * MW <= 6 weight rows (ldw values apart): set on the first chunk, added after. is_first (the
 * first input rows of the group) prefetches the weights' next chunk, a line at a time. */
__attribute__((always_inline, T512)) static inline void
dot_block512(const int DT, const int MX, const int MW, const float *x, size_t ldx, const void *w,
             size_t ldw, int32_t c0, int32_t c1, bool is_first, float *y, size_t ldy) {
    __m512 acc[4][6];
#pragma GCC unroll 4
    for (int a = 0; a < MX; a++) {
#pragma GCC unroll 6
        for (int b = 0; b < MW; b++) {
            acc[a][b] = _mm512_setzero_ps();
        }
    }
    int32_t c = c0;
    for (; c + 16 <= c1; c += 16) {
        if (is_first && KV_BYTE_OF(DT, c) % 64 == 0) {
#pragma GCC unroll 6
            for (int b = 0; b < MW; b++) {
                _mm_prefetch((const char *)w + KV_BYTE_OF(DT, (size_t)b * ldw + c + ROWS512_CHUNK),
                             _MM_HINT_T0);
            }
        }
        __m512 wv[6];
#pragma GCC unroll 6
        for (int b = 0; b < MW; b++) {
            wv[b] = load_w16(DT, w, (size_t)b * ldw + c);
        }
#pragma GCC unroll 4
        for (int a = 0; a < MX; a++) {
            __m512 xv = _mm512_loadu_ps(x + a * ldx + c);
#pragma GCC unroll 6
            for (int b = 0; b < MW; b++) {
                acc[a][b] = _mm512_fmadd_ps(xv, wv[b], acc[a][b]);
            }
        }
    }
#pragma GCC unroll 4
    for (int a = 0; a < MX; a++) {
#pragma GCC unroll 6
        for (int b = 0; b < MW; b++) {
            float sum = _mm512_reduce_add_ps(acc[a][b]);
            for (int32_t r = c; r < c1; r++) {
                sum += x[a * ldx + r] * load_w1(DT, w, (size_t)b * ldw + r);
            }
            y[a * ldy + b] = c0 == 0 ? sum : y[a * ldy + b] + sum;
        }
    }
}

/* MW weight rows (at wj) against every four input rows, then the rest one at a time, a chunk
 * of columns at a time. */
__attribute__((always_inline, T512)) static inline void weight_group512(const int DT, const int MW,
                                                                        const float *x, int32_t m,
                                                                        int32_t k, const void *wj,
                                                                        float *y, size_t ldy) {
    for (int32_t c0 = 0; c0 < k; c0 += ROWS512_CHUNK) {
        int32_t c1 = k - c0 < ROWS512_CHUNK ? k : c0 + ROWS512_CHUNK;
        int32_t i = 0;
        for (; i + 4 <= m; i += 4) {
            dot_block512(DT, 4, MW, x + (size_t)i * k, (size_t)k, wj, (size_t)k, c0, c1, i == 0,
                         y + i * ldy, ldy);
        }
        for (; i < m; i++) {
            dot_block512(DT, 1, MW, x + (size_t)i * k, (size_t)k, wj, (size_t)k, c0, c1, i == 0,
                         y + i * ldy, ldy);
        }
    }
}

/* Weight rows outer, six at a time: each group streams from memory once. */
__attribute__((always_inline, T512)) static inline void rows_dot512_t(const int DT, const float *x,
                                                                      int32_t m, int32_t k,
                                                                      const void *w, int32_t n,
                                                                      float *y, size_t ldy) {
    size_t es = DT == 0 ? sizeof(float) : sizeof(uint16_t);
    int32_t j = 0;
    for (; j + 6 <= n; j += 6) {
        weight_group512(DT, 6, x, m, k, (const char *)w + (size_t)j * k * es, y + j, ldy);
    }
    for (; j < n; j++) {
        weight_group512(DT, 1, x, m, k, (const char *)w + (size_t)j * k * es, y + j, ldy);
    }
}

__attribute__((noinline, T512)) static void
rows512_f32(const float *x, int32_t m, int32_t k, const void *w, int32_t n, float *y, size_t ldy) {
    rows_dot512_t(0, x, m, k, w, n, y, ldy);
}

#endif /* TILE_HAVE_AVX2 */

bool attn__rows512_covers(int32_t m) {
#ifdef TILE_HAVE_AVX2
    return m >= 4 && attn__tile_is_wide();
#else
    (void)m;
    return false;
#endif
}

#ifdef TILE_HAVE_AVX2
void attn__rows_dot512(const float *x, int32_t m, int32_t k, const float *w, int32_t n, float *y,
                       size_t ldy) {
    rows512_f32(x, m, k, w, n, y, ldy);
}
#endif
