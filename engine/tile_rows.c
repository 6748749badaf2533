/* engine/tile_rows.c: the projections' inner products for a few tokens (a decode step, a small
 * batch) against float weight rows (AVX2 + FMA). Larger batches go to cblas_sgemm (forward.c);
 * without AVX2 simd.c's portable loop serves. Weights held in half precision are in panels, with
 * kernels of their own (panel.c, tile_panel.c). The kernels keep their dtype parameter (DT 0
 * here) from tile_avx2.h's readers, which the KV kernels share. */
#include "tile_avx2.h"

#ifdef TILE_HAVE_AVX2

/* How far ahead of its reads a lone row's dot product prefetches the weights, in bytes: one
 * llama-sized bf16 row. Streaming rows one after another is a single sequential read, which the
 * hardware prefetchers follow, but they run too few lines ahead to keep DRAM busy once the
 * widening and FMAs fill the core (on Zen 5: 36 GB/s a thread without, 41 with, against 39 read).
 */
#define ROW1_PREFETCH_BYTES 8192

/* y[i][j] = x_i . w_j for an MX x MW block: MX input rows against MW weight rows, each k-step
 * loading MX + MW vectors for MX * MW FMAs. Always inlined with constant MX, MW and DT so the
 * accumulators live in registers. Prefetches the next MW rows (the caller's next block of weight
 * rows: they are consecutive) at the offset it reads, a line each: prefetching a row's own bytes
 * ROW1_PREFETCH_BYTES on, as dot_row1 does, reached only the last of the next three rows at
 * llama's 8 KiB a row, and every other line of a float32 row (llama8b, bf16, 8 sessions at
 * L=2048: 5.7 -> 4.4-4.5 ms; 32 sessions 18.9 -> 17.5-17.7 ms, alternated). */
__attribute__((always_inline, target("avx2,fma,f16c"))) static inline void
dot_block(const int DT, const int MX, const int MW, const float *x, size_t ldx, const void *w,
          size_t ldw, int32_t k, float *y, size_t ldy) {
    __m256 acc[4][3];
#pragma GCC unroll 4
    for (int a = 0; a < MX; a++) {
#pragma GCC unroll 3
        for (int b = 0; b < MW; b++) {
            acc[a][b] = _mm256_setzero_ps();
        }
    }
    int32_t c = 0;
    for (; c + 8 <= k; c += 8) {
        if (KV_BYTE_OF(DT, c) % 64 == 0) {
#pragma GCC unroll 3
            for (int b = 0; b < MW; b++) {
                _mm_prefetch((const char *)w + KV_BYTE_OF(DT, (size_t)(b + MW) * ldw + c),
                             _MM_HINT_T0);
            }
        }
        __m256 wv[3];
#pragma GCC unroll 3
        for (int b = 0; b < MW; b++) {
            wv[b] = load_w8(DT, w, (size_t)b * ldw + c);
        }
#pragma GCC unroll 4
        for (int a = 0; a < MX; a++) {
            __m256 xv = _mm256_loadu_ps(x + a * ldx + c);
#pragma GCC unroll 3
            for (int b = 0; b < MW; b++) {
                acc[a][b] = _mm256_fmadd_ps(xv, wv[b], acc[a][b]);
            }
        }
    }
#pragma GCC unroll 4
    for (int a = 0; a < MX; a++) {
#pragma GCC unroll 3
        for (int b = 0; b < MW; b++) {
            float t[8];
            _mm256_storeu_ps(t, acc[a][b]);
            float sum = ((t[0] + t[4]) + (t[1] + t[5])) + ((t[2] + t[6]) + (t[3] + t[7]));
            for (int32_t r = c; r < k; r++) {
                sum += x[a * ldx + r] * load_w1(DT, w, (size_t)b * ldw + r);
            }
            y[a * ldy + b] = sum;
        }
    }
}

/* x . w for one input row and one weight row: eight accumulators (64 values a step), so neither
 * the FMA latency nor a second stream bounds a lone token's projection. Weight rows taken one
 * after another read memory sequentially; four rows side by side (four streams) ran at a third
 * of the read bandwidth on Zen 5. */
__attribute__((always_inline, target("avx2,fma,f16c"))) static inline float
dot_row1(const int DT, const float *x, const void *w, int32_t k) {
    __m256 acc[8];
#pragma GCC unroll 8
    for (int a = 0; a < 8; a++) {
        acc[a] = _mm256_setzero_ps();
    }
    const char *bytes = (const char *)w;
    int32_t c = 0;
    for (; c + 64 <= k; c += 64) {
        size_t ahead = KV_BYTE_OF(DT, c) + ROW1_PREFETCH_BYTES;
        for (size_t line = 0; line < KV_BYTE_OF(DT, 64); line += 64) {
            _mm_prefetch(bytes + ahead + line, _MM_HINT_T0);
        }
#pragma GCC unroll 8
        for (int a = 0; a < 8; a++) {
            acc[a] = _mm256_fmadd_ps(_mm256_loadu_ps(x + c + 8 * a),
                                     load_w8(DT, w, (size_t)c + 8 * a), acc[a]);
        }
    }
    for (; c + 8 <= k; c += 8) {
        acc[0] = _mm256_fmadd_ps(_mm256_loadu_ps(x + c), load_w8(DT, w, (size_t)c), acc[0]);
    }
#pragma GCC unroll 4
    for (int a = 0; a < 4; a++) {
        acc[a] = _mm256_add_ps(acc[a], acc[a + 4]);
    }
    __m256 v = _mm256_add_ps(_mm256_add_ps(acc[0], acc[1]), _mm256_add_ps(acc[2], acc[3]));
    float t[8];
    _mm256_storeu_ps(t, v);
    float sum = ((t[0] + t[4]) + (t[1] + t[5])) + ((t[2] + t[6]) + (t[3] + t[7]));
    for (; c < k; c++) {
        sum += x[c] * load_w1(DT, w, (size_t)c);
    }
    return sum;
}

/* Weight rows outer: each group of three is streamed from memory once and reused from L1 for
 * every input row. Fewer than four input rows (decode) take dot_row1, a weight row at a time. */
__attribute__((always_inline, target("avx2,fma,f16c"))) static inline void
rows_dot_t(const int DT, const float *x, int32_t m, int32_t k, const void *w, int32_t n, float *y,
           size_t ldy) {
    size_t es = DT == 0 ? sizeof(float) : sizeof(uint16_t);
    int32_t j = 0;
    if (m < 4) {
        for (; j < n; j++) {
            const void *wj = (const char *)w + (size_t)j * k * es;
            for (int32_t i = 0; i < m; i++) {
                y[i * ldy + j] = dot_row1(DT, x + (size_t)i * k, wj, k);
            }
        }
    }
    for (; j + 3 <= n; j += 3) {
        const void *wj = (const char *)w + (size_t)j * k * es;
        int32_t i = 0;
        for (; i + 4 <= m; i += 4) {
            dot_block(DT, 4, 3, x + (size_t)i * k, (size_t)k, wj, (size_t)k, k, y + i * ldy + j,
                      ldy);
        }
        for (; i < m; i++) {
            dot_block(DT, 1, 3, x + (size_t)i * k, (size_t)k, wj, (size_t)k, k, y + i * ldy + j,
                      ldy);
        }
    }
    for (; j < n; j++) {
        const void *wj = (const char *)w + (size_t)j * k * es;
        int32_t i = 0;
        for (; i + 4 <= m; i += 4) {
            dot_block(DT, 4, 1, x + (size_t)i * k, (size_t)k, wj, (size_t)k, k, y + i * ldy + j,
                      ldy);
        }
        for (; i < m; i++) {
            dot_block(DT, 1, 1, x + (size_t)i * k, (size_t)k, wj, (size_t)k, k, y + i * ldy + j,
                      ldy);
        }
    }
}

__attribute__((target("avx2,fma,f16c"))) static void rows_dot_avx2(const float *x, int32_t m,
                                                                   int32_t k, const float *w,
                                                                   int32_t n, float *y,
                                                                   size_t ldy) {
    rows_dot_t(0, x, m, k, w, n, y, ldy);
}

#endif /* TILE_HAVE_AVX2 */

void attn__rows_dot(const float *x, int32_t m, int32_t k, const float *w, int32_t n, float *y,
                    size_t ldy) {
#ifdef TILE_HAVE_AVX2
    if (attn__rows512_covers(m)) {
        attn__rows_dot512(x, m, k, w, n, y, ldy);
        return;
    }
    rows_dot_avx2(x, m, k, w, n, y, ldy);
#else
    attn__qk(x, (size_t)k, m, w, (size_t)k, n, k, y, ldy);
#endif
}
