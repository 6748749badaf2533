/* engine/tile_rows512.c: the projections of a small batch (4 to 32 tokens) in AVX-512 (F, BW),
 * for CPUs that have it: tile_rows.c's blocks of input rows against float weight rows (half
 * precision ones are panel.c's), with 16 lanes an FMA and 32 registers, so a block is 4 input rows
 * by 6 weight rows (24 accumulators) instead of 4 by 3. Every input vector loaded feeds six FMAs,
 * and each weight row streams once per 4 input rows from L1. A lone token (and 2-3) stays with
 * tile_rows.c's dot_row1: it is bound by the weights' stream, not by arithmetic. */
#include "tile_avx2.h"

#ifdef TILE_HAVE_AVX2

#define T512 target("avx512f,avx512bw,avx512dq,avx512vl,avx2,fma,f16c")

/* Columns a weight group's pass covers: six rows of 1024 (24 KiB) stay in L1 while every four
 * input rows take their turn, where whole rows (llama's 4096: 96 KiB) came from L2 for each. */
#define ROWS512_CHUNK 1024

/* y[a * ldy + b] (+)= the sum over columns [c0, c1) of x_a w_b, for MX <= 4 input rows and
 * MW <= 6 weight rows (ldw values apart): set on the first chunk, added after. is_first (the
 * first input rows of the group) prefetches the weights' next chunk, a line at a time. */
__attribute__((always_inline, T512)) static inline void
dot_block512(const int MX, const int MW, const float *x, size_t ldx, const float *w, size_t ldw,
             int32_t c0, int32_t c1, bool is_first, float *y, size_t ldy) {
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
        if (is_first) { /* 16 floats: a line a row */
#pragma GCC unroll 6
            for (int b = 0; b < MW; b++) {
                _mm_prefetch((const char *)(w + (size_t)b * ldw + c + ROWS512_CHUNK), _MM_HINT_T0);
            }
        }
        __m512 wv[6];
#pragma GCC unroll 6
        for (int b = 0; b < MW; b++) {
            wv[b] = _mm512_loadu_ps(w + (size_t)b * ldw + c);
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
                sum += x[a * ldx + r] * w[(size_t)b * ldw + r];
            }
            y[a * ldy + b] = c0 == 0 ? sum : y[a * ldy + b] + sum;
        }
    }
}

/* MW weight rows (at wj) against every four input rows, then the rest one at a time, a chunk
 * of columns at a time. */
__attribute__((always_inline, T512)) static inline void weight_group512(const int MW,
                                                                        const float *x, int32_t m,
                                                                        int32_t k, const float *wj,
                                                                        float *y, size_t ldy) {
    for (int32_t c0 = 0; c0 < k; c0 += ROWS512_CHUNK) {
        int32_t c1 = k - c0 < ROWS512_CHUNK ? k : c0 + ROWS512_CHUNK;
        int32_t i = 0;
        for (; i + 4 <= m; i += 4) {
            dot_block512(4, MW, x + (size_t)i * k, (size_t)k, wj, (size_t)k, c0, c1, i == 0,
                         y + i * ldy, ldy);
        }
        for (; i < m; i++) {
            dot_block512(1, MW, x + (size_t)i * k, (size_t)k, wj, (size_t)k, c0, c1, i == 0,
                         y + i * ldy, ldy);
        }
    }
}

/* Weight rows outer, six at a time: each group streams from memory once. */
__attribute__((always_inline, T512)) static inline void rows_dot512_t(const float *x, int32_t m,
                                                                      int32_t k, const float *w,
                                                                      int32_t n, float *y,
                                                                      size_t ldy) {
    int32_t j = 0;
    for (; j + 6 <= n; j += 6) {
        weight_group512(6, x, m, k, w + (size_t)j * k, y + j, ldy);
    }
    for (; j < n; j++) {
        weight_group512(1, x, m, k, w + (size_t)j * k, y + j, ldy);
    }
}

__attribute__((noinline, T512)) static void
rows512_f32(const float *x, int32_t m, int32_t k, const float *w, int32_t n, float *y, size_t ldy) {
    rows_dot512_t(x, m, k, w, n, y, ldy);
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
