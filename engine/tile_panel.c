/* engine/tile_panel.c: the kernels of panel.c's products, in AVX-512 (F, BW) where the CPU has
 * it, else AVX2 + FMA + F16C, else panel.c's portable loop. A kernel keeps a block of input rows
 * by a panel's 32 outputs in registers and, for each input column, widens the panel's 32 weights
 * once and adds them times each input row's value (broadcast from the packed block):
 * - AVX-512: 12 rows x 32 outputs, 24 accumulators; two instructions widen 32 weights, and
 *   each is followed by 24 FMAs.
 * - AVX2 (16 registers): 6 rows x 16 outputs, 12 accumulators, the panel in two passes (its
 *   first and second 32 bytes of each column); one or two rows the whole panel in one pass.
 * One or two rows (a decode step) stream the weights from DRAM, with a prefetch ahead. Also here:
 * the panels widened to float for sgemm (attn__panel_widen), which AVX2 cores prefer for many
 * rows. */
#include "tile_avx2.h"

#ifdef TILE_HAVE_AVX2

#define T512 target("avx512f,avx512bw,avx512dq,avx512vl,avx2,fma,f16c")
#define T256 target("avx2,fma,f16c")

/* Block heights: what the registers hold (see above). */
#define BLOCK512 12
#define BLOCK256 6

/* How far ahead of its reads a kernel prefetches its panel, in bytes: the first block of input
 * rows over a panel's part streams it from DRAM (a decode step: the only block), and the
 * hardware prefetchers alone run too few lines ahead to keep it busy (tile_rows.c's dot_row1
 * found the same). For 12 input rows and more it mattered as much: 32 tokens against 4096 weight
 * rows, one thread, 84 -> 122 GFLOP/s; llama8b's 32-session step 28.4-28.9 -> 26.4-26.8 ms,
 * prefill S=512 214 -> 209 ms. */
#define STREAM_PREFETCH_BYTES 8192

/* Accumulator sets of a kernel of MB input rows: one or two rows' FMAs alone would wait on
 * their own latency (2 or 4 chains where the two FMA ports need 8), so their columns are dealt
 * round-robin to 4 or 2 sets, summed at the end. */
#define SETS(MB) ((MB) == 1 ? 4 : (MB) == 2 ? 2 : 1)

/* A panel's 32 weights of one column as two 16-lane vectors: rows 0-15 and 16-31. */
__attribute__((always_inline, T512)) static inline void widen512(const int BF, const uint16_t *wk,
                                                                 __m512 *lo, __m512 *hi) {
    if (BF) {
        /* lane j: row j in the low half, row 16 + j in the high half */
        __m512i v = _mm512_loadu_si512((const void *)wk);
        *lo = _mm512_castsi512_ps(_mm512_slli_epi32(v, 16));
        *hi = _mm512_castsi512_ps(_mm512_and_si512(v, _mm512_set1_epi32((int)0xffff0000u)));
    } else {
        *lo = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)wk));
        *hi = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(wk + 16)));
    }
}

/* c[i * ldc + j] (+)= sum over kc columns of xp[k * MB + i] w_k[j], j < 32, i < MB. */
__attribute__((always_inline, T512)) static inline void tile512(const int BF, const int MB,
                                                                const float *xp, const uint16_t *w,
                                                                int32_t kc, float *c, size_t ldc,
                                                                bool add) {
    const int NS = SETS(MB);
    __m512 lo_acc[4][BLOCK512], hi_acc[4][BLOCK512];
#pragma GCC unroll 4
    for (int s = 0; s < NS; s++) {
#pragma GCC unroll 12
        for (int i = 0; i < MB; i++) {
            lo_acc[s][i] = _mm512_setzero_ps();
            hi_acc[s][i] = _mm512_setzero_ps();
        }
    }
    int32_t k = 0;
    for (; k + NS <= kc; k += NS) {
#pragma GCC unroll 4
        for (int s = 0; s < NS; s++) {
            const uint16_t *wk = w + (size_t)(k + s) * ATTN__PANEL_ROWS;
            _mm_prefetch((const char *)wk + STREAM_PREFETCH_BYTES, _MM_HINT_T0);
            __m512 lo, hi;
            widen512(BF, wk, &lo, &hi);
            const float *xk = xp + (size_t)(k + s) * MB;
#pragma GCC unroll 12
            for (int i = 0; i < MB; i++) {
                __m512 b = _mm512_set1_ps(xk[i]);
                lo_acc[s][i] = _mm512_fmadd_ps(b, lo, lo_acc[s][i]);
                hi_acc[s][i] = _mm512_fmadd_ps(b, hi, hi_acc[s][i]);
            }
        }
    }
    for (; k < kc; k++) {
        __m512 lo, hi;
        widen512(BF, w + (size_t)k * ATTN__PANEL_ROWS, &lo, &hi);
#pragma GCC unroll 12
        for (int i = 0; i < MB; i++) {
            __m512 b = _mm512_set1_ps(xp[(size_t)k * MB + i]);
            lo_acc[0][i] = _mm512_fmadd_ps(b, lo, lo_acc[0][i]);
            hi_acc[0][i] = _mm512_fmadd_ps(b, hi, hi_acc[0][i]);
        }
    }
#pragma GCC unroll 12
    for (int i = 0; i < MB; i++) {
#pragma GCC unroll 4
        for (int s = 1; s < NS; s++) {
            lo_acc[0][i] = _mm512_add_ps(lo_acc[0][i], lo_acc[s][i]);
            hi_acc[0][i] = _mm512_add_ps(hi_acc[0][i], hi_acc[s][i]);
        }
        float *row = c + (size_t)i * ldc;
        if (add) {
            lo_acc[0][i] = _mm512_add_ps(_mm512_loadu_ps(row), lo_acc[0][i]);
            hi_acc[0][i] = _mm512_add_ps(_mm512_loadu_ps(row + 16), hi_acc[0][i]);
        }
        _mm512_storeu_ps(row, lo_acc[0][i]);
        _mm512_storeu_ps(row + 16, hi_acc[0][i]);
    }
}

/* Half h (0, 1) of a panel column's 32 weights as two 8-lane vectors: bfloat16 half h holds rows
 * 8h..8h+7 (the lanes' low halves) and 16+8h..16+8h+7 (high), binary16 half h rows 16h..16h+7
 * and 16h+8..16h+15. */
__attribute__((always_inline, T256)) static inline void widen256(const int BF, const uint16_t *wk,
                                                                 int h, __m256 *lo, __m256 *hi) {
    const uint16_t *p = wk + 16 * h;
    if (BF) {
        __m256i v = _mm256_loadu_si256((const __m256i *)p);
        *lo = _mm256_castsi256_ps(_mm256_slli_epi32(v, 16));
        *hi = _mm256_castsi256_ps(_mm256_and_si256(v, _mm256_set1_epi32((int)0xffff0000u)));
    } else {
        *lo = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p));
        *hi = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(p + 8)));
    }
}

/* One pass of the AVX2 kernel over half H (0, 1) of each column's 32 weights (widen256). */
__attribute__((always_inline, T256)) static inline void
tile256_half(const int BF, const int MB, const int H, const float *xp, const uint16_t *w,
             int32_t kc, float *c, size_t ldc, bool add) {
    __m256 lo_acc[BLOCK256], hi_acc[BLOCK256];
#pragma GCC unroll 6
    for (int i = 0; i < MB; i++) {
        lo_acc[i] = _mm256_setzero_ps();
        hi_acc[i] = _mm256_setzero_ps();
    }
    for (int32_t k = 0; k < kc; k++) {
        if (H == 0) { /* the first pass brings the panel's lines */
            _mm_prefetch((const char *)(w + (size_t)k * ATTN__PANEL_ROWS) + STREAM_PREFETCH_BYTES,
                         _MM_HINT_T0);
        }
        __m256 lo, hi;
        widen256(BF, w + (size_t)k * ATTN__PANEL_ROWS, H, &lo, &hi);
        const float *xk = xp + (size_t)k * MB;
#pragma GCC unroll 6
        for (int i = 0; i < MB; i++) {
            __m256 b = _mm256_broadcast_ss(xk + i);
            lo_acc[i] = _mm256_fmadd_ps(b, lo, lo_acc[i]);
            hi_acc[i] = _mm256_fmadd_ps(b, hi, hi_acc[i]);
        }
    }
    int lo_col = BF ? 8 * H : 16 * H, hi_col = BF ? 16 + 8 * H : 16 * H + 8;
#pragma GCC unroll 6
    for (int i = 0; i < MB; i++) {
        float *row = c + (size_t)i * ldc;
        if (add) {
            lo_acc[i] = _mm256_add_ps(_mm256_loadu_ps(row + lo_col), lo_acc[i]);
            hi_acc[i] = _mm256_add_ps(_mm256_loadu_ps(row + hi_col), hi_acc[i]);
        }
        _mm256_storeu_ps(row + lo_col, lo_acc[i]);
        _mm256_storeu_ps(row + hi_col, hi_acc[i]);
    }
}

/* Column k of the panel into one set of a streaming kernel's accumulators. */
__attribute__((always_inline, T256)) static inline void
stream_column256(const int BF, const int MB, const float *xp, const uint16_t *w, int32_t k,
                 __m256 acc[2][4]) {
    const uint16_t *wk = w + (size_t)k * ATTN__PANEL_ROWS;
    _mm_prefetch((const char *)wk + STREAM_PREFETCH_BYTES, _MM_HINT_T0);
    __m256 wv[4];
    widen256(BF, wk, 0, &wv[0], &wv[1]);
    widen256(BF, wk, 1, &wv[2], &wv[3]);
#pragma GCC unroll 2
    for (int i = 0; i < MB; i++) {
        __m256 b = _mm256_broadcast_ss(xp + (size_t)k * MB + i);
#pragma GCC unroll 4
        for (int v = 0; v < 4; v++) {
            acc[i][v] = _mm256_fmadd_ps(b, wv[v], acc[i][v]);
        }
    }
}

/* The AVX2 kernel of one or two input rows: the whole panel in one pass (four vectors of
 * weights a column), so that it streams from DRAM once, with two accumulator sets for one row. */
__attribute__((always_inline, T256)) static inline void
tile256_stream(const int BF, const int MB, const float *xp, const uint16_t *w, int32_t kc, float *c,
               size_t ldc, bool add) {
    const int NS = MB == 1 ? 2 : 1;
    __m256 acc[2][2][4]; /* set, row, vector: half 0's lo and hi, half 1's lo and hi */
#pragma GCC unroll 2
    for (int s = 0; s < NS; s++) {
#pragma GCC unroll 2
        for (int i = 0; i < MB; i++) {
#pragma GCC unroll 4
            for (int v = 0; v < 4; v++) {
                acc[s][i][v] = _mm256_setzero_ps();
            }
        }
    }
    int32_t k = 0;
    for (; k + NS <= kc; k += NS) {
#pragma GCC unroll 2
        for (int s = 0; s < NS; s++) {
            stream_column256(BF, MB, xp, w, k + s, acc[s]);
        }
    }
    for (; k < kc; k++) {
        stream_column256(BF, MB, xp, w, k, acc[0]);
    }
    /* bfloat16 halves hold rows 0-7 | 16-23 and 8-15 | 24-31; binary16 halves rows in order */
    const int col[4] = {0, BF ? 16 : 8, BF ? 8 : 16, 24};
#pragma GCC unroll 2
    for (int i = 0; i < MB; i++) {
        float *row = c + (size_t)i * ldc;
#pragma GCC unroll 4
        for (int v = 0; v < 4; v++) {
            __m256 sum = NS == 2 ? _mm256_add_ps(acc[0][i][v], acc[1][i][v]) : acc[0][i][v];
            if (add) {
                sum = _mm256_add_ps(_mm256_loadu_ps(row + col[v]), sum);
            }
            _mm256_storeu_ps(row + col[v], sum);
        }
    }
}

/* attn__panel_widen of whole panels [p0, p1) into b (their first row at column 0), a column of
 * the input at a time across the panels: b's rows are then written in order (a panel at a time
 * wrote 128 bytes a kilobyte apart, twice the time). */
__attribute__((T256)) static void widen_panels256(bool is_bf16, const uint16_t *w, int32_t k,
                                                  int32_t p0, int32_t p1, float *b, size_t ldb) {
    for (int32_t c = 0; c < k; c++) {
        float *row = b + (size_t)c * ldb;
        for (int32_t p = p0; p < p1; p++, row += ATTN__PANEL_ROWS) {
            const uint16_t *wk = w + ((size_t)p * k + c) * ATTN__PANEL_ROWS;
            __m256 v[4];
            widen256(is_bf16, wk, 0, &v[0], &v[1]);
            widen256(is_bf16, wk, 1, &v[2], &v[3]);
            /* bfloat16 halves hold rows 0-7 | 16-23 and 8-15 | 24-31; binary16 rows in order */
            _mm256_storeu_ps(row, v[0]);
            _mm256_storeu_ps(row + (is_bf16 ? 16 : 8), v[1]);
            _mm256_storeu_ps(row + (is_bf16 ? 8 : 16), v[2]);
            _mm256_storeu_ps(row + 24, v[3]);
        }
    }
}

typedef void (*tile_fn)(const float *xp, const uint16_t *w, int32_t kc, float *c, size_t ldc,
                        bool add);

/* One function per dtype and block height, each with its loops unrolled for that height. */
#define TILE512(BF, MB)                                                                            \
    __attribute__((T512)) static void tile512_##BF##_##MB(                                         \
        const float *xp, const uint16_t *w, int32_t kc, float *c, size_t ldc, bool add) {          \
        tile512(BF, MB, xp, w, kc, c, ldc, add);                                                   \
    }
/* One or two rows stream the panel once (tile256_stream); more take it in two halves. (The
 * streaming kernel's arrays hold two rows: it is instantiated with at most 2 even where the
 * branch that calls it is dead.) */
#define TILE256(BF, MB)                                                                            \
    __attribute__((T256)) static void tile256_##BF##_##MB(                                         \
        const float *xp, const uint16_t *w, int32_t kc, float *c, size_t ldc, bool add) {          \
        if (MB <= 2) {                                                                             \
            tile256_stream(BF, MB <= 2 ? MB : 1, xp, w, kc, c, ldc, add);                          \
            return;                                                                                \
        }                                                                                          \
        tile256_half(BF, MB, 0, xp, w, kc, c, ldc, add);                                           \
        tile256_half(BF, MB, 1, xp, w, kc, c, ldc, add);                                           \
    }
#define HEIGHTS6(X, BF)  X(BF, 1) X(BF, 2) X(BF, 3) X(BF, 4) X(BF, 5) X(BF, 6)
#define HEIGHTS12(X, BF) HEIGHTS6(X, BF) X(BF, 7) X(BF, 8) X(BF, 9) X(BF, 10) X(BF, 11) X(BF, 12)
HEIGHTS12(TILE512, 0)
HEIGHTS12(TILE512, 1)
HEIGHTS6(TILE256, 0)
HEIGHTS6(TILE256, 1)

#define NAME512(BF, MB) tile512_##BF##_##MB,
#define NAME256(BF, MB) tile256_##BF##_##MB,
static const tile_fn tiles512[2][BLOCK512] = {{HEIGHTS12(NAME512, 0)}, {HEIGHTS12(NAME512, 1)}};
static const tile_fn tiles256[2][BLOCK256] = {{HEIGHTS6(NAME256, 0)}, {HEIGHTS6(NAME256, 1)}};

int32_t attn__panel_block_rows(void) {
    return attn__tile_is_wide() ? BLOCK512 : attn__tile_is_fast() ? BLOCK256 : 4;
}

bool attn__panel_prefers_sgemm(void) {
    return !attn__tile_is_wide() && attn__tile_is_fast();
}

void attn__panel_widen(attn_dtype dt, const uint16_t *w, int32_t k, int32_t r0, int32_t r1,
                       float *b, size_t ldb) {
    /* the whole panels in the range by the vector kernel, a panel cut at either end alone */
    int32_t p0 = (r0 + ATTN__PANEL_ROWS - 1) / ATTN__PANEL_ROWS, p1 = r1 / ATTN__PANEL_ROWS;
    if (p0 >= p1 || !attn__tile_is_fast()) {
        attn__panel_widen_portable(dt, w, k, r0, r1, b, ldb);
        return;
    }
    widen_panels256(dt == ATTN_DTYPE_BF16, w, k, p0, p1, b + (p0 * ATTN__PANEL_ROWS - r0), ldb);
    attn__panel_widen_portable(dt, w, k, r0, p0 * ATTN__PANEL_ROWS, b, ldb);
    attn__panel_widen_portable(dt, w, k, p1 * ATTN__PANEL_ROWS, r1,
                               b + (p1 * ATTN__PANEL_ROWS - r0), ldb);
}

void attn__panel_tile(int32_t block_rows, bool is_bf16, int32_t mb, const float *xp,
                      const uint16_t *w, int32_t kc, float *c, size_t ldc, bool add) {
    if (block_rows == BLOCK512) {
        tiles512[is_bf16][mb - 1](xp, w, kc, c, ldc, add);
    } else if (block_rows == BLOCK256) {
        tiles256[is_bf16][mb - 1](xp, w, kc, c, ldc, add);
    } else {
        attn__panel_tile_portable(is_bf16, mb, xp, w, kc, c, ldc, add);
    }
}

#else

int32_t attn__panel_block_rows(void) {
    return 4;
}

bool attn__panel_prefers_sgemm(void) {
    return false;
}

void attn__panel_widen(attn_dtype dt, const uint16_t *w, int32_t k, int32_t r0, int32_t r1,
                       float *b, size_t ldb) {
    attn__panel_widen_portable(dt, w, k, r0, r1, b, ldb);
}

void attn__panel_tile(int32_t block_rows, bool is_bf16, int32_t mb, const float *xp,
                      const uint16_t *w, int32_t kc, float *c, size_t ldc, bool add) {
    (void)block_rows;
    attn__panel_tile_portable(is_bf16, mb, xp, w, kc, c, ldc, add);
}

#endif /* TILE_HAVE_AVX2 */
