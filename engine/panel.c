/* engine/panel.c: projection weights held in half precision (bfloat16 or binary16), laid out in
 * panels, and their products with a batch of input rows.
 *
 * A panel is 32 consecutive weight rows (output columns) stored column by column of the input:
 * for each input column k, the 32 rows' values side by side (64 bytes). A product then reads
 * one contiguous stream per panel whatever the number of input rows, and a kernel keeps 32
 * outputs of several input rows in registers, widening each weight once for all of them (an
 * outer product: the weight vector against each input row's value broadcast). The row-major
 * form needed the weights widened into a float panel and repacked by sgemm for every call of
 * many tokens, and for a few tokens did one dot product per output. (Where the kernels are
 * AVX2's, many tokens still take sgemm over widened panels: attn__panel_prefers_sgemm.) Weights are
 * packed once, when the model is held in half precision: the bits are the checkpoint's, only their
 * order changes (attn__panel_unpack gives the rows back, for the fingerprint and for float).
 *
 * Within a panel's 64 bytes a bfloat16 value sits where one 32-bit lane's shift (or mask) makes
 * it a float: lane j holds row j in its low half and row 16 + j in its high half, so a vector
 * of lanes widens in one instruction per 16 rows. Binary16 values keep row order (F16C widens
 * eight or sixteen consecutive ones). The input rows are packed per call (attn__panel_pack_x):
 * blocks of the kernels' height, column by column, so a kernel's broadcasts read one line. */
#include "attn_int.h"

#include <string.h>

#ifdef __SSE2__
#include <emmintrin.h>
#endif

/* Columns of the input per pass over a block of input rows: a panel's part (128 KiB) stays in
 * L2 while every block of input rows takes its turn. A single block takes the whole row. (512,
 * 1024, 2048 and 4096 gave llama8b's 32-session step within 1%, and prefill S=512 218 ms at
 * 1024, 215 at 2048, 213 at 4096; 2048 leaves room in a 512 KiB L2.) */
#define PANEL_KC 2048

size_t attn__panel_values(int32_t rows, int32_t cols) {
    size_t panels = ((size_t)rows + ATTN__PANEL_ROWS - 1) / ATTN__PANEL_ROWS;
    return panels * ATTN__PANEL_ROWS * (size_t)cols;
}

/* Where a panel's row `lane` sits among its 32 values of a column. */
static int32_t panel_slot(bool is_bf16, int32_t lane) {
    return !is_bf16 ? lane : lane < 16 ? 2 * lane : 2 * (lane - 16) + 1;
}

/* The row whose value a panel's column holds at slot s (panel_slot's inverse). */
static int32_t slot_row(bool is_bf16, int32_t s) {
    return !is_bf16 ? s : s % 2 == 0 ? s / 2 : 16 + s / 2;
}

/* out[j][i] = in[i][j] for i, j < 8: eight values of eight rows into eight of eight columns (an
 * involution: unpacking is the same move back). SSE2's unpacks where there are (each x86-64),
 * else a value at a time. */
static inline __attribute__((always_inline)) void transpose8(const uint16_t *const in[8],
                                                             uint16_t *const out[8]) {
#ifdef __SSE2__
    __m128i a[8], t[8];
    for (int i = 0; i < 8; i++) {
        a[i] = _mm_loadu_si128((const __m128i *)in[i]);
    }
    for (int i = 0; i < 4; i++) {
        t[2 * i] = _mm_unpacklo_epi16(a[2 * i], a[2 * i + 1]);
        t[2 * i + 1] = _mm_unpackhi_epi16(a[2 * i], a[2 * i + 1]);
    }
    /* t[0]: columns 0-3 of rows 0,1; t[1]: 4-7 of rows 0,1; t[2], t[3] rows 2,3; ... */
    for (int h = 0; h < 2; h++) {
        __m128i u0 = _mm_unpacklo_epi32(t[h], t[2 + h]), u1 = _mm_unpackhi_epi32(t[h], t[2 + h]);
        __m128i u2 = _mm_unpacklo_epi32(t[4 + h], t[6 + h]);
        __m128i u3 = _mm_unpackhi_epi32(t[4 + h], t[6 + h]);
        _mm_storeu_si128((__m128i *)out[4 * h], _mm_unpacklo_epi64(u0, u2));
        _mm_storeu_si128((__m128i *)out[4 * h + 1], _mm_unpackhi_epi64(u0, u2));
        _mm_storeu_si128((__m128i *)out[4 * h + 2], _mm_unpacklo_epi64(u1, u3));
        _mm_storeu_si128((__m128i *)out[4 * h + 3], _mm_unpackhi_epi64(u1, u3));
    }
#else
    uint16_t v[8][8];
    for (int i = 0; i < 8; i++) {
        memcpy(v[i], in[i], sizeof v[i]);
    }
    for (int j = 0; j < 8; j++) {
        for (int i = 0; i < 8; i++) {
            out[j][i] = v[i][j];
        }
    }
#endif
}

void attn__panel_pack(attn_dtype dt, const uint16_t *src, int32_t rows, int32_t cols,
                      uint16_t *dst) {
    bool is_bf16 = dt == ATTN_DTYPE_BF16;
    static const uint16_t zeros[8];
    for (int32_t p0 = 0; p0 < rows; p0 += ATTN__PANEL_ROWS) {
        uint16_t *panel = dst + (size_t)p0 * cols;
        /* eight slots of eight columns at a time; the last panel's rows past the matrix are
         * zero (kernels read them, nobody keeps them) */
        for (int32_t s0 = 0; s0 < ATTN__PANEL_ROWS; s0 += 8) {
            const uint16_t *row[8];
            for (int32_t i = 0; i < 8; i++) {
                int32_t r = p0 + slot_row(is_bf16, s0 + i);
                row[i] = r < rows ? src + (size_t)r * cols : NULL;
            }
            int32_t k = 0;
            for (; k + 8 <= cols; k += 8) {
                const uint16_t *in[8];
                uint16_t *out[8];
                for (int32_t i = 0; i < 8; i++) {
                    in[i] = row[i] != NULL ? row[i] + k : zeros;
                    out[i] = panel + (size_t)(k + i) * ATTN__PANEL_ROWS + s0;
                }
                transpose8(in, out);
            }
            for (; k < cols; k++) {
                for (int32_t i = 0; i < 8; i++) {
                    panel[(size_t)k * ATTN__PANEL_ROWS + s0 + i] = row[i] != NULL ? row[i][k] : 0;
                }
            }
        }
    }
}

void attn__panel_unpack(attn_dtype dt, const uint16_t *panels, int32_t cols, int32_t first,
                        int32_t n_rows, uint16_t *dst) {
    bool is_bf16 = dt == ATTN_DTYPE_BF16;
    uint16_t sink[8];
    int32_t end = first + n_rows;
    for (int32_t p0 = first / ATTN__PANEL_ROWS * ATTN__PANEL_ROWS; p0 < end;
         p0 += ATTN__PANEL_ROWS) {
        const uint16_t *panel = panels + (size_t)p0 * cols;
        for (int32_t s0 = 0; s0 < ATTN__PANEL_ROWS; s0 += 8) {
            uint16_t *row[8]; /* where each slot's row goes, or NULL outside [first, end) */
            for (int32_t i = 0; i < 8; i++) {
                int32_t r = p0 + slot_row(is_bf16, s0 + i);
                row[i] = r >= first && r < end ? dst + (size_t)(r - first) * cols : NULL;
            }
            int32_t k = 0;
            for (; k + 8 <= cols; k += 8) {
                const uint16_t *in[8];
                uint16_t *out[8];
                for (int32_t i = 0; i < 8; i++) {
                    in[i] = panel + (size_t)(k + i) * ATTN__PANEL_ROWS + s0;
                    out[i] = row[i] != NULL ? row[i] + k : sink;
                }
                transpose8(in, out);
            }
            for (; k < cols; k++) {
                for (int32_t i = 0; i < 8; i++) {
                    if (row[i] != NULL) {
                        row[i][k] = panel[(size_t)k * ATTN__PANEL_ROWS + s0 + i];
                    }
                }
            }
        }
    }
}

void attn__panel_pack_x(int32_t block_rows, const float *x, int32_t m, int32_t k, float *xp) {
    for (int32_t b0 = 0; b0 < m; b0 += block_rows) {
        int32_t mb = m - b0 < block_rows ? m - b0 : block_rows;
        float *blk = xp + (size_t)b0 * k;
        for (int32_t i = 0; i < mb; i++) {
            const float *row = x + (size_t)(b0 + i) * k;
            for (int32_t c = 0; c < k; c++) {
                blk[(size_t)c * mb + i] = row[c];
            }
        }
    }
}

void attn__panel_tile_portable(bool is_bf16, int32_t mb, const float *xp, const uint16_t *w,
                               int32_t kc, float *c, size_t ldc, bool add) {
    float acc[ATTN__PANEL_BLOCK_MAX][ATTN__PANEL_ROWS] = {{0}};
    for (int32_t k = 0; k < kc; k++) {
        const uint16_t *wk = w + (size_t)k * ATTN__PANEL_ROWS;
        float wv[ATTN__PANEL_ROWS];
        for (int32_t r = 0; r < ATTN__PANEL_ROWS; r++) {
            uint16_t h = wk[panel_slot(is_bf16, r)];
            wv[r] = is_bf16 ? attn__bf16_to_f32(h) : attn__f16_to_f32(h);
        }
        for (int32_t i = 0; i < mb; i++) {
            float xv = xp[(size_t)k * mb + i];
            for (int32_t r = 0; r < ATTN__PANEL_ROWS; r++) {
                acc[i][r] += xv * wv[r];
            }
        }
    }
    for (int32_t i = 0; i < mb; i++) {
        for (int32_t r = 0; r < ATTN__PANEL_ROWS; r++) {
            c[(size_t)i * ldc + r] = add ? c[(size_t)i * ldc + r] + acc[i][r] : acc[i][r];
        }
    }
}

void attn__panel_widen_portable(attn_dtype dt, const uint16_t *w, int32_t k, int32_t r0, int32_t r1,
                                float *b, size_t ldb) {
    bool is_bf16 = dt == ATTN_DTYPE_BF16;
    for (int32_t r = r0; r < r1; r++) {
        const uint16_t *from = w + (size_t)(r / ATTN__PANEL_ROWS) * k * ATTN__PANEL_ROWS +
                               panel_slot(is_bf16, r % ATTN__PANEL_ROWS);
        for (int32_t c = 0; c < k; c++) {
            uint16_t h = from[(size_t)c * ATTN__PANEL_ROWS];
            b[(size_t)c * ldb + (r - r0)] = is_bf16 ? attn__bf16_to_f32(h) : attn__f16_to_f32(h);
        }
    }
}

void attn__panel_dot(int32_t block_rows, attn_dtype dt, const float *xp, int32_t m, int32_t k,
                     const uint16_t *w, int32_t r0, int32_t r1, float *y, size_t ldy) {
    bool is_bf16 = dt == ATTN_DTYPE_BF16;
    int32_t kc_max = m <= block_rows ? k : PANEL_KC; /* one block: each weight is read once */
    int32_t p_first = r0 / ATTN__PANEL_ROWS, p_last = (r1 - 1) / ATTN__PANEL_ROWS;
    for (int32_t k0 = 0; k0 < k; k0 += kc_max) {
        int32_t kc = k - k0 < kc_max ? k - k0 : kc_max;
        for (int32_t p = p_first; p <= p_last; p++) {
            const uint16_t *wp = w + ((size_t)p * k + k0) * ATTN__PANEL_ROWS;
            int32_t c_lo = p * ATTN__PANEL_ROWS > r0 ? p * ATTN__PANEL_ROWS : r0;
            int32_t c_hi = (p + 1) * ATTN__PANEL_ROWS < r1 ? (p + 1) * ATTN__PANEL_ROWS : r1;
            bool whole = c_hi - c_lo == ATTN__PANEL_ROWS;
            for (int32_t b0 = 0; b0 < m; b0 += block_rows) {
                int32_t mb = m - b0 < block_rows ? m - b0 : block_rows;
                const float *xb = xp + (size_t)b0 * k + (size_t)k0 * mb;
                float *yb = y + (size_t)b0 * ldy + (c_lo - r0);
                if (whole) {
                    attn__panel_tile(block_rows, is_bf16, mb, xb, wp, kc, yb, ldy, k0 > 0);
                    continue;
                }
                /* a panel the range cuts (or the matrix's last): the whole panel into a tile,
                 * then the range's columns */
                float tile[ATTN__PANEL_BLOCK_MAX * ATTN__PANEL_ROWS];
                attn__panel_tile(block_rows, is_bf16, mb, xb, wp, kc, tile, ATTN__PANEL_ROWS,
                                 false);
                for (int32_t i = 0; i < mb; i++) {
                    const float *t =
                        tile + (size_t)i * ATTN__PANEL_ROWS + (c_lo % ATTN__PANEL_ROWS);
                    float *out = yb + (size_t)i * ldy;
                    for (int32_t c = 0; c < c_hi - c_lo; c++) {
                        out[c] = k0 > 0 ? out[c] + t[c] : t[c];
                    }
                }
            }
        }
    }
}
