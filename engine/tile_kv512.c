/* engine/tile_kv512.c: decode attention's kernels of tile_kv.c in AVX-512 (F, BW, DQ, VL), for
 * CPUs that have it (Intel since Skylake-SP, AMD since Zen 4): a query group against a block's
 * keys (scores) and values (weighted sum), for K/V held as bfloat16, binary16 or Q8_0 (not
 * float: see attn__kv512_covers), head sizes a multiple of 32 (a Q8_0 block is then 32 whole
 * columns). Sixteen lanes an FMA and 32 registers: on the Intel Xeon VM (Cascade Lake), one
 * thread, head_dim 128, a block in L1/L2 (`attn_kernels`), bfloat16 with four query rows a group
 * took 20.4 -> 14.0-15.3 ns a key for the scores and 17.6 -> 10.5-11.4 for the weighted sum,
 * Q8_0 28.2 -> 22.1 and 25.8 -> 17.9; llama8b's attention alone at L=8192, bf16 from DRAM,
 * 0.66-0.70 -> 0.75-0.76 of the read bandwidth (paired, four alternated runs). Other head sizes
 * and float K/V stay with tile_kv.c, which chooses per call. */
#include "tile_avx2.h"
#include "tile_kv.h"

#ifdef TILE_HAVE_AVX2

#define T512 target("avx512f,avx512bw,avx512dq,avx512vl,avx2,fma,f16c")

/* Columns c .. c + 32 of a row held as DT (1 bfloat16, 2 binary16, 3 Q8_0) as two vectors.
 * Bfloat16 is widened by unpacks against zero from one 64-byte load (a shuffle a vector, no
 * shift): within each 8 columns, the first 4 go to v[0] and the last 4 to v[1], so v[0] holds
 * columns 0-3 8-11 16-19 24-27 and v[1] the rest (to_perm32). */
__attribute__((always_inline, T512)) static inline void widen32(const int DT, const uint8_t *row,
                                                                int32_t c, __m512 *v) {
    if (DT == 1) {
        __m512i x = _mm512_loadu_si512((const uint16_t *)(const void *)row + c);
        __asm__("" : "+v"(x)); /* one load, two unpacks of the register */
        v[0] = _mm512_castsi512_ps(_mm512_unpacklo_epi16(_mm512_setzero_si512(), x));
        v[1] = _mm512_castsi512_ps(_mm512_unpackhi_epi16(_mm512_setzero_si512(), x));
    } else if (DT == 2) {
        const uint16_t *h = (const uint16_t *)(const void *)row + c;
        v[0] = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)h));
        v[1] = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(h + 16)));
    } else {
        /* Q8_0: the 32 columns are one whole block, its scale times its int8s (a multiply a
         * vector: folding the scales into the weighted sum's weights instead, as tile_kv.c
         * does, would cost a multiply a block and row, and the scores need them here anyway) */
        const uint8_t *blk = row + (size_t)(c / ATTN__QK8_0) * ATTN__Q8_0_BYTES;
        uint16_t h;
        memcpy(&h, blk, sizeof h);
        __m512 scale = _mm512_set1_ps(_cvtsh_ss(h));
        __m512i lo = _mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(blk + 2)));
        __m512i hi = _mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(blk + 18)));
        v[0] = _mm512_mul_ps(_mm512_cvtepi32_ps(lo), scale);
        v[1] = _mm512_mul_ps(_mm512_cvtepi32_ps(hi), scale);
    }
}

/* 32 floats from column order (n[0] = columns 0-15, n[1] = 16-31) into widen32's bfloat16 order
 * (lane l of p[h] = column 8 (l / 4) + 4 h + l % 4), and back. */
__attribute__((always_inline, T512)) static inline void to_perm32(const __m512 *n, __m512 *p) {
    const __m512i i0 = _mm512_setr_epi32(0, 1, 2, 3, 8, 9, 10, 11, 16, 17, 18, 19, 24, 25, 26, 27);
    const __m512i i1 =
        _mm512_setr_epi32(4, 5, 6, 7, 12, 13, 14, 15, 20, 21, 22, 23, 28, 29, 30, 31);
    p[0] = _mm512_permutex2var_ps(n[0], i0, n[1]);
    p[1] = _mm512_permutex2var_ps(n[0], i1, n[1]);
}
__attribute__((always_inline, T512)) static inline void from_perm32(const __m512 *p, __m512 *n) {
    const __m512i i0 = _mm512_setr_epi32(0, 1, 2, 3, 16, 17, 18, 19, 4, 5, 6, 7, 20, 21, 22, 23);
    const __m512i i1 =
        _mm512_setr_epi32(8, 9, 10, 11, 24, 25, 26, 27, 12, 13, 14, 15, 28, 29, 30, 31);
    n[0] = _mm512_permutex2var_ps(p[0], i0, p[1]);
    n[1] = _mm512_permutex2var_ps(p[0], i1, p[1]);
}

/* Lane i = the sum of v[i]'s lanes, for 16 vectors: pairs and quads within 128-bit lanes, then
 * across them (45 instructions, against ~8 a vector one at a time). */
__attribute__((always_inline, T512)) static inline __m512 hsum16x16(const __m512 *v) {
    __m512 w[4];
#pragma GCC unroll 4
    for (int g = 0; g < 4; g++) {
        const __m512 *x = v + 4 * g;
        __m512 s01 =
            _mm512_add_ps(_mm512_shuffle_ps(x[0], x[1], 0x44), _mm512_shuffle_ps(x[0], x[1], 0xEE));
        __m512 s23 =
            _mm512_add_ps(_mm512_shuffle_ps(x[2], x[3], 0x44), _mm512_shuffle_ps(x[2], x[3], 0xEE));
        /* each 128-bit lane k: the sums of x[0..3]'s four values there */
        w[g] = _mm512_add_ps(_mm512_shuffle_ps(s01, s23, 0x88), _mm512_shuffle_ps(s01, s23, 0xDD));
    }
    __m512 u01 = _mm512_add_ps(_mm512_shuffle_f32x4(w[0], w[1], 0x88),
                               _mm512_shuffle_f32x4(w[0], w[1], 0xDD));
    __m512 u23 = _mm512_add_ps(_mm512_shuffle_f32x4(w[2], w[3], 0x88),
                               _mm512_shuffle_f32x4(w[2], w[3], 0xDD));
    return _mm512_add_ps(_mm512_shuffle_f32x4(u01, u23, 0x88),
                         _mm512_shuffle_f32x4(u01, u23, 0xDD));
}

/* s[a * lds + b] = q_a . k_b for MX <= 4 query rows (d apart, in widen32's order for bfloat16)
 * and NK keys, rb bytes apart, NK x MX <= 16: each key's 32 columns widened once for every row.
 * ahead[b]: the row to prefetch for key b. */
__attribute__((always_inline, T512)) static inline void
qk512_block(const int DT, const int MX, const int NK, const float *q, const uint8_t *k, size_t rb,
            const uint8_t *const *ahead, int32_t d, float *s, size_t lds) {
    __m512 acc[16];
#pragma GCC unroll 16
    for (int i = 0; i < 16; i++) {
        acc[i] = _mm512_setzero_ps();
    }
#pragma GCC unroll 8
    for (int b = 0; b < NK; b++) {
        for (size_t off = 0; off < KV_BYTE_OF(DT, d); off += 64) {
            _mm_prefetch((const char *)(ahead[b] + off), _MM_HINT_T0);
        }
    }
    for (int32_t c = 0; c < d; c += 32) {
        __m512 kv[8][2];
#pragma GCC unroll 8
        for (int b = 0; b < NK; b++) {
            widen32(DT, k + b * rb, c, kv[b]);
        }
#pragma GCC unroll 2
        for (int h = 0; h < 2; h++) {
#pragma GCC unroll 4
            for (int a = 0; a < MX; a++) {
                __m512 qv = _mm512_loadu_ps(q + (size_t)a * d + c + 16 * h);
#pragma GCC unroll 8
                for (int b = 0; b < NK; b++) {
                    acc[b * MX + a] = _mm512_fmadd_ps(qv, kv[b][h], acc[b * MX + a]);
                }
            }
        }
    }
    if (NK * MX > 4) {
        float t[16];
        _mm512_storeu_ps(t, hsum16x16(acc)); /* lane b * MX + a: row a against key b */
#pragma GCC unroll 4
        for (int a = 0; a < MX; a++) {
#pragma GCC unroll 8
            for (int b = 0; b < NK; b++) {
                s[a * lds + b] = t[b * MX + a];
            }
        }
    } else {
#pragma GCC unroll 4
        for (int a = 0; a < MX; a++) {
#pragma GCC unroll 4
            for (int b = 0; b < NK; b++) {
                s[a * lds + b] = _mm512_reduce_add_ps(acc[b * MX + a]);
            }
        }
    }
}

/* Keys a pass of the scores for MX rows: as many as 16 accumulators and the keys' vectors fit
 * the 32 registers (one row alone: eight chains to cover the FMA latency). */
#define QK512_KEYS(MX) ((MX) == 1 ? 8 : (MX) == 2 ? 6 : 4)

/* One group of MX query rows against a block's n keys (the rows copied d apart, in widen32's
 * order for bfloat16, d a multiple of 32 up to QUERY512_MAX_D). */
#define QUERY512_MAX_D 512
__attribute__((always_inline, T512)) static inline void
qk512_rows(const int DT, const int MX, const float *q, size_t ldq, const uint8_t *k, size_t rb,
           int32_t n, struct attn__kv_after after, int32_t d, float *s, size_t lds) {
    float qc[4 * QUERY512_MAX_D];
#pragma GCC unroll 4
    for (int a = 0; a < MX; a++) {
        const float *src = q + a * ldq;
        float *dst = qc + (size_t)a * d;
        for (int32_t c = 0; c < d; c += 32) {
            __m512 nat[2] = {_mm512_loadu_ps(src + c), _mm512_loadu_ps(src + c + 16)}, p[2];
            if (DT == 1) {
                to_perm32(nat, p);
            } else {
                p[0] = nat[0];
                p[1] = nat[1];
            }
            _mm512_storeu_ps(dst + c, p[0]);
            _mm512_storeu_ps(dst + c + 16, p[1]);
        }
    }
    const int NK = QK512_KEYS(MX);
    int32_t j = 0;
    for (; j + NK <= n; j += NK) {
        const uint8_t *ahead[8];
        keys_ahead(k, rb, n, after, j, NK, ahead);
        qk512_block(DT, MX, NK, qc, k + (size_t)j * rb, rb, ahead, d, s + j, lds);
    }
    for (; j < n; j++) {
        const uint8_t *ahead[1];
        keys_ahead(k, rb, n, after, j, 1, ahead);
        qk512_block(DT, MX, 1, qc, k + (size_t)j * rb, rb, ahead, d, s + j, lds);
    }
}

/* o[:, c .. c + 16 CW) += p v over keys [j0, j1) for MX <= 4 rows, CW (even) vectors of
 * accumulators a row held in registers for the run; prefetches the strip's lines PV_KEYS rows
 * ahead, for the next run. */
__attribute__((always_inline, T512)) static inline void
pv512_strip(const int DT, const int MX, const int CW, const float *p, size_t ldp, const uint8_t *v,
            size_t rb, int32_t n, struct attn__kv_after after, int32_t j0, int32_t j1, int32_t c,
            float *o, size_t ldo) {
    __m512 acc[4][8];
#pragma GCC unroll 4
    for (int a = 0; a < MX; a++) {
#pragma GCC unroll 4
        for (int w = 0; w < CW; w += 2) {
            __m512 nat[2] = {_mm512_loadu_ps(o + a * ldo + c + 16 * w),
                             _mm512_loadu_ps(o + a * ldo + c + 16 * w + 16)};
            if (DT == 1) {
                to_perm32(nat, &acc[a][w]);
            } else {
                acc[a][w] = nat[0];
                acc[a][w + 1] = nat[1];
            }
        }
    }
    const uint8_t *ahead = row_ahead(v, rb, n, after, j0 + PV_KEYS) + KV_BYTE_OF(DT, c);
    size_t ahead_rb = j0 + PV_KEYS < n || after.rows == NULL ? rb : after.row_bytes;
#pragma GCC unroll 2
    for (int32_t j = j0; j < j1; j++) {
        for (size_t off = 0; off < KV_BYTE_OF(DT, 16 * CW); off += 64) {
            _mm_prefetch((const char *)(ahead + off), _MM_HINT_T0);
        }
        ahead += ahead_rb;
        const uint8_t *row = v + (size_t)j * rb;
        __m512 vv[8];
#pragma GCC unroll 4
        for (int w = 0; w < CW; w += 2) {
            widen32(DT, row, c + 16 * w, &vv[w]);
        }
#pragma GCC unroll 4
        for (int a = 0; a < MX; a++) {
            __m512 pa = _mm512_set1_ps(p[a * ldp + j]);
#pragma GCC unroll 8
            for (int w = 0; w < CW; w++) {
                acc[a][w] = _mm512_fmadd_ps(pa, vv[w], acc[a][w]);
            }
        }
    }
#pragma GCC unroll 4
    for (int a = 0; a < MX; a++) {
#pragma GCC unroll 4
        for (int w = 0; w < CW; w += 2) {
            __m512 nat[2];
            if (DT == 1) {
                from_perm32(&acc[a][w], nat);
            } else {
                nat[0] = acc[a][w];
                nat[1] = acc[a][w + 1];
            }
            _mm512_storeu_ps(o + a * ldo + c + 16 * w, nat[0]);
            _mm512_storeu_ps(o + a * ldo + c + 16 * w + 16, nat[1]);
        }
    }
}

/* o (MX <= 4 rows, d columns, d a multiple of 32) += p v: runs of PV_KEYS keys, each walked once
 * per strip of columns whose accumulators stay in registers (as tile_kv.c's pv_kv_rows). */
__attribute__((always_inline, T512)) static inline void
pv512_rows(const int DT, const int MX, const float *p, size_t ldp, const uint8_t *v, size_t rb,
           int32_t n, struct attn__kv_after after, int32_t d, float *o, size_t ldo) {
    /* strips of 128 columns for one or two rows (16 accumulators at most), 64 for more */
    const int CW = MX <= 2 ? 8 : 4;
    for (int32_t j0 = 0; j0 < n; j0 += PV_KEYS) {
        int32_t j1 = n - j0 < PV_KEYS ? n : j0 + PV_KEYS;
        int32_t c = 0;
        for (; c + 16 * CW <= d; c += 16 * CW) {
            pv512_strip(DT, MX, CW, p, ldp, v, rb, n, after, j0, j1, c, o, ldo);
        }
        for (; c < d; c += 32) {
            pv512_strip(DT, MX, 2, p, ldp, v, rb, n, after, j0, j1, c, o, ldo);
        }
    }
}

/* One function per kernel, dtype and row count, with head sizes 64 and 128 as constants (see
 * tile_kv.c's ROWS_KERNEL for why each is compiled alone). */
#define ROWS512_KERNEL(kind, DT, MX)                                                               \
    __attribute__((noinline, T512)) static void kind##512_##DT##_##MX(                             \
        const float *in, size_t ld_in, const uint8_t *rows, size_t rb, int32_t n,                  \
        struct attn__kv_after after, int32_t d, float *out, size_t ld_out) {                       \
        if (d == 128) {                                                                            \
            kind##512_rows(DT, MX, in, ld_in, rows, rb, n, after, 128, out, ld_out);               \
        } else if (d == 64) {                                                                      \
            kind##512_rows(DT, MX, in, ld_in, rows, rb, n, after, 64, out, ld_out);                \
        } else {                                                                                   \
            kind##512_rows(DT, MX, in, ld_in, rows, rb, n, after, d, out, ld_out);                 \
        }                                                                                          \
    }
#define ROWS512_KERNELS(DT, MX) ROWS512_KERNEL(qk, DT, MX) ROWS512_KERNEL(pv, DT, MX)
#define ROWS512_KERNELS_DT(DT)                                                                     \
    ROWS512_KERNELS(DT, 1) ROWS512_KERNELS(DT, 2) ROWS512_KERNELS(DT, 3) ROWS512_KERNELS(DT, 4)
ROWS512_KERNELS_DT(1)
ROWS512_KERNELS_DT(2)
ROWS512_KERNELS_DT(3)
#define ROWS512_TABLE(kind, DT)                                                                    \
    { kind##512_##DT##_1, kind##512_##DT##_2, kind##512_##DT##_3, kind##512_##DT##_4 }
/* [DT - 1][MX - 1] */
static rows_fn *const qk512[3][4] = {ROWS512_TABLE(qk, 1), ROWS512_TABLE(qk, 2),
                                     ROWS512_TABLE(qk, 3)};
static rows_fn *const pv512[3][4] = {ROWS512_TABLE(pv, 1), ROWS512_TABLE(pv, 2),
                                     ROWS512_TABLE(pv, 3)};

#endif /* TILE_HAVE_AVX2 */

bool attn__kv512_covers(attn_dtype dt, int32_t d) {
#ifdef TILE_HAVE_AVX2
    /* Not float K/V: twice the bytes a value, so AVX2's kernels already keep up with DRAM, and
     * these were slower there (llama8b attention alone at L=8192, paired, three alternated runs:
     * 0.77-0.84 of the read bandwidth against AVX2's 0.87-0.88), though faster in cache. */
    return attn__tile_is_wide() && d % 32 == 0 && d <= QUERY512_MAX_D &&
           (dt == ATTN_DTYPE_BF16 || dt == ATTN_DTYPE_F16 || dt == ATTN_DTYPE_Q8_0);
#else
    (void)dt;
    (void)d;
    return false;
#endif
}

#ifdef TILE_HAVE_AVX2
/* The tables' row of a KV dtype attn__kv512_covers (its DT - 1). */
static int dtype512(attn_dtype dt) {
    return dt == ATTN_DTYPE_BF16 ? 0 : dt == ATTN_DTYPE_F16 ? 1 : 2;
}

void attn__kv512_qk(attn_dtype dt, const float *q, size_t ldq, int32_t m, const uint8_t *k,
                    size_t row_bytes, int32_t n, struct attn__kv_after after, int32_t d, float *s,
                    size_t lds) {
    rows_in_groups(qk512[dtype512(dt)], q, ldq, m, k, row_bytes, n, after, d, s, lds);
}

void attn__kv512_pv(attn_dtype dt, const float *p, size_t ldp, int32_t m, const uint8_t *v,
                    size_t row_bytes, int32_t n, struct attn__kv_after after, int32_t d, float *o,
                    size_t ldo) {
    rows_in_groups(pv512[dtype512(dt)], p, ldp, m, v, row_bytes, n, after, d, o, ldo);
}
#endif
