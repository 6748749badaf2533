/* engine/tile.c: register-blocked kernels for the attention tiles of prefill (many query rows
 * against one key block), in AVX2 + FMA with a portable fallback. They replace cblas_sgemm
 * there because OpenBLAS threads every call above a tiny size and spends its time in
 * sched_yield on these short GEMMs; these run on the calling thread only, so attention tasks can
 * be spread over the caller's executor. The choice is made per call from the CPU's features. */
#include "attn_int.h"

#include <math.h>
#include <string.h>

#if defined(__x86_64__) && defined(__GNUC__)
#include <cpuid.h>
#include <immintrin.h>
#define TILE_HAVE_AVX2 1
#endif

/* Rows x columns of one register block: 6 x 16 floats = 12 ymm accumulators, which keeps the
 * two FMA ports busy while the loads (2 per step) and broadcasts (6) stay within budget. */
#define MR 6
#define NR 16

bool attn__tile_is_fast(void) {
#ifdef TILE_HAVE_AVX2
    /* Asked per block of scores, so the answer is kept: cpuid traps to the hypervisor in a VM
     * (measured: 90% of a small decode's time when asked each call). Threads racing here all
     * store the same value. 0 = not asked yet, 1 = no, 2 = yes. */
    static int known = 0;
    int k = __atomic_load_n(&known, __ATOMIC_RELAXED);
    if (k == 0) {
        /* F16C (half precision) by cpuid: clang's __builtin_cpu_supports does not know it */
        unsigned int a = 0, b = 0, c = 0, d = 0;
        bool has_f16c = __get_cpuid(1, &a, &b, &c, &d) && (c & bit_F16C) != 0;
        bool fast = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && has_f16c;
        k = fast ? 2 : 1;
        __atomic_store_n(&known, k, __ATOMIC_RELAXED);
    }
    return k == 2;
#else
    return false;
#endif
}

size_t attn__tile_pack_floats(int32_t n_keys, int32_t d_k) {
    return (size_t)d_k * ((n_keys + NR - 1) / NR * NR);
}

#ifdef TILE_HAVE_AVX2

/* kt (d x n_pad) = k (n x d)^T, columns past n zero, so the QK kernel streams NR-wide rows. */
__attribute__((target("avx2,fma"))) static void pack_kt(const float *k, int32_t n, int32_t d,
                                                        float *kt, int32_t n_pad) {
    for (int32_t c = 0; c < d; c++) {
        float *row = kt + (size_t)c * n_pad;
        for (int32_t j = 0; j < n; j++) {
            row[j] = k[(size_t)j * d + c];
        }
        for (int32_t j = n; j < n_pad; j++) {
            row[j] = 0.0f;
        }
    }
}

/* s[i][0..16) = sum_c q[i][c] kt[c][0..16), for MX rows. Always inlined with a constant MX so
 * the 2 * MX accumulators stay in registers. */
__attribute__((always_inline, target("avx2,fma"))) static inline void
qk_block(const int MX, const float *q, size_t ldq, const float *kt, int32_t n_pad, int32_t d,
         float *s, size_t lds, int32_t n) {
    __m256 acc[MR][2];
#pragma GCC unroll 6
    for (int i = 0; i < MX; i++) {
        acc[i][0] = _mm256_setzero_ps();
        acc[i][1] = _mm256_setzero_ps();
    }
    for (int32_t c = 0; c < d; c++) {
        __m256 b0 = _mm256_loadu_ps(kt + (size_t)c * n_pad);
        __m256 b1 = _mm256_loadu_ps(kt + (size_t)c * n_pad + 8);
#pragma GCC unroll 6
        for (int i = 0; i < MX; i++) {
            __m256 a = _mm256_broadcast_ss(q + i * ldq + c);
            acc[i][0] = _mm256_fmadd_ps(a, b0, acc[i][0]);
            acc[i][1] = _mm256_fmadd_ps(a, b1, acc[i][1]);
        }
    }
#pragma GCC unroll 6
    for (int i = 0; i < MX; i++) {
        float tmp[NR];
        _mm256_storeu_ps(tmp, acc[i][0]);
        _mm256_storeu_ps(tmp + 8, acc[i][1]);
        memcpy(s + i * lds, tmp, (size_t)(n < NR ? n : NR) * sizeof(float));
    }
}

__attribute__((target("avx2,fma"))) static void qk_avx2(const float *q, size_t ldq, int32_t m,
                                                        const float *k, int32_t n, int32_t d,
                                                        float *s, size_t lds, float *pack) {
    int32_t n_pad = (n + NR - 1) / NR * NR;
    pack_kt(k, n, d, pack, n_pad);
    for (int32_t j0 = 0; j0 < n; j0 += NR) {
        int32_t i = 0;
        for (; i + MR <= m; i += MR) {
            qk_block(MR, q + i * ldq, ldq, pack + j0, n_pad, d, s + i * lds + j0, lds, n - j0);
        }
        for (; i < m; i++) {
            qk_block(1, q + i * ldq, ldq, pack + j0, n_pad, d, s + i * lds + j0, lds, n - j0);
        }
    }
}

/* o[i][0..16) += sum_j p[i][j] v[j][0..16) for MX rows. Always inlined with a constant MX so the
 * 2 * MX accumulators stay in registers while each value row is loaded once. */
__attribute__((always_inline, target("avx2,fma"))) static inline void
pv_block(const int MX, const float *p, size_t ldp, const float *v, size_t ldv, int32_t n, float *o,
         size_t ldo) {
    __m256 acc[MR][2];
#pragma GCC unroll 6
    for (int i = 0; i < MX; i++) {
        acc[i][0] = _mm256_loadu_ps(o + i * ldo);
        acc[i][1] = _mm256_loadu_ps(o + i * ldo + 8);
    }
    for (int32_t j = 0; j < n; j++) {
        __m256 b0 = _mm256_loadu_ps(v + (size_t)j * ldv);
        __m256 b1 = _mm256_loadu_ps(v + (size_t)j * ldv + 8);
#pragma GCC unroll 6
        for (int i = 0; i < MX; i++) {
            __m256 a = _mm256_broadcast_ss(p + i * ldp + j);
            acc[i][0] = _mm256_fmadd_ps(a, b0, acc[i][0]);
            acc[i][1] = _mm256_fmadd_ps(a, b1, acc[i][1]);
        }
    }
#pragma GCC unroll 6
    for (int i = 0; i < MX; i++) {
        _mm256_storeu_ps(o + i * ldo, acc[i][0]);
        _mm256_storeu_ps(o + i * ldo + 8, acc[i][1]);
    }
}

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

/* o[:, 0..c_fast) += p v over n keys, register block by register block. */
__attribute__((target("avx2,fma"))) static void pv_columns(const float *p, size_t ldp, int32_t m,
                                                           const float *v, size_t ldv, int32_t n,
                                                           int32_t c_fast, float *o, size_t ldo) {
    for (int32_t c0 = 0; c0 < c_fast; c0 += NR) {
        int32_t i = 0;
        for (; i + MR <= m; i += MR) {
            pv_block(MR, p + i * ldp, ldp, v + c0, ldv, n, o + i * ldo + c0, ldo);
        }
        for (; i + 4 <= m; i += 4) {
            pv_block(4, p + i * ldp, ldp, v + c0, ldv, n, o + i * ldo + c0, ldo);
        }
        for (; i < m; i++) {
            pv_block(1, p + i * ldp, ldp, v + c0, ldv, n, o + i * ldo + c0, ldo);
        }
    }
}

/* o (MX rows, d columns) += p v for MX <= 4 rows, streaming the value rows in order, two keys at a
 * time: the 2 * MX weights stay in registers and each output vector is loaded and stored once
 * per key pair. Used for decode, where the value block is read once from memory. */
__attribute__((always_inline, target("avx2,fma"))) static inline void
pv_stream(const int MX, const float *p, size_t ldp, const float *v, size_t ldv, int32_t n,
          int32_t d, float *o, size_t ldo) {
    int32_t j = 0;
    for (; j + 2 <= n; j += 2) {
        const float *v0 = v + (size_t)j * ldv, *v1 = v0 + ldv;
        _mm_prefetch((const char *)(v0 + 8 * ldv), _MM_HINT_T0);
        __m256 w0[4], w1[4];
#pragma GCC unroll 4
        for (int i = 0; i < MX; i++) {
            w0[i] = _mm256_broadcast_ss(p + i * ldp + j);
            w1[i] = _mm256_broadcast_ss(p + i * ldp + j + 1);
        }
        for (int32_t c = 0; c < d; c += 8) {
            __m256 a = _mm256_loadu_ps(v0 + c), b = _mm256_loadu_ps(v1 + c);
#pragma GCC unroll 4
            for (int i = 0; i < MX; i++) {
                __m256 acc = _mm256_loadu_ps(o + i * ldo + c);
                acc = _mm256_fmadd_ps(w0[i], a, acc);
                acc = _mm256_fmadd_ps(w1[i], b, acc);
                _mm256_storeu_ps(o + i * ldo + c, acc);
            }
        }
    }
    for (; j < n; j++) {
        const float *v0 = v + (size_t)j * ldv;
        for (int i = 0; i < MX; i++) {
            __m256 w = _mm256_broadcast_ss(p + i * ldp + j);
            for (int32_t c = 0; c < d; c += 8) {
                __m256 acc = _mm256_loadu_ps(o + i * ldo + c);
                _mm256_storeu_ps(o + i * ldo + c, _mm256_fmadd_ps(w, _mm256_loadu_ps(v0 + c), acc));
            }
        }
    }
}

__attribute__((target("avx2,fma"))) static void pv_avx2(const float *p, size_t ldp, int32_t m,
                                                        const float *v, size_t ldv, int32_t n,
                                                        int32_t d, float *o, size_t ldo) {
    if (m <= 4 && d % 8 == 0) {
        switch (m) {
        case 4:
            pv_stream(4, p, ldp, v, ldv, n, d, o, ldo);
            return;
        case 3:
            pv_stream(3, p, ldp, v, ldv, n, d, o, ldo);
            return;
        case 2:
            pv_stream(2, p, ldp, v, ldv, n, d, o, ldo);
            return;
        default:
            pv_stream(1, p, ldp, v, ldv, n, d, o, ldo);
            return;
        }
    }
    int32_t c_fast = d / NR * NR;
    /* Keys in chunks of 16 so that the value rows one pass over the columns touches stay in L1
     * for the next pass (whole 64-key blocks at a 512-byte stride collide in L1's sets). */
    for (int32_t j0 = 0; j0 < n; j0 += 16) {
        int32_t nj = n - j0 < 16 ? n - j0 : 16;

        pv_columns(p + j0, ldp, m, v + (size_t)j0 * ldv, ldv, nj, c_fast, o, ldo);
    }
    if (c_fast < d) {
        /* The few columns past the last full register block. */
        for (int32_t i = 0; i < m; i++) {
            for (int32_t j = 0; j < n; j++) {
                float w = p[i * ldp + j];
                for (int32_t c = c_fast; c < d; c++) {
                    o[i * ldo + c] += w * v[(size_t)j * ldv + c];
                }
            }
        }
    }
}

/* exp(x) for x in [-87, 88.7]: Cephes' expf (range reduction by ln 2 in two parts, degree-5
 * polynomial), within 2 ulp of expf. */
__attribute__((always_inline, target("avx2,fma"))) static inline __m256 exp_avx2(__m256 x) {
    const __m256 log2e = _mm256_set1_ps(1.44269504088896341f), half = _mm256_set1_ps(0.5f);
    const __m256 c1 = _mm256_set1_ps(0.693359375f), c2 = _mm256_set1_ps(-2.12194440e-4f);
    __m256 fx = _mm256_floor_ps(_mm256_fmadd_ps(x, log2e, half));
    x = _mm256_fnmadd_ps(fx, c1, x);
    x = _mm256_fnmadd_ps(fx, c2, x);
    __m256 y = _mm256_set1_ps(1.9875691500e-4f);
    y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(1.3981999507e-3f));
    y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(8.3334519073e-3f));
    y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(4.1665795894e-2f));
    y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(1.6666665459e-1f));
    y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(5.0000001201e-1f));
    y = _mm256_fmadd_ps(y, _mm256_mul_ps(x, x), _mm256_add_ps(x, _mm256_set1_ps(1.0f)));
    __m256i e =
        _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(fx), _mm256_set1_epi32(127)), 23);
    return _mm256_mul_ps(y, _mm256_castsi256_ps(e));
}

/* The largest of s[0 .. n), -inf when n is 0; NaNs are passed over, as by the portable loop. */
__attribute__((target("avx2,fma"))) static float row_max_avx2(const float *s, int32_t n) {
    __m256 m0 = _mm256_set1_ps(-INFINITY), m1 = m0;
    int32_t j = 0;
    for (; j + 16 <= n; j += 16) {
        /* max_ps returns its second operand when either is NaN */
        m0 = _mm256_max_ps(_mm256_loadu_ps(s + j), m0);
        m1 = _mm256_max_ps(_mm256_loadu_ps(s + j + 8), m1);
    }
    float t[8], best = -INFINITY;
    _mm256_storeu_ps(t, _mm256_max_ps(m0, m1));
    for (int i = 0; i < 8; i++) {
        best = t[i] > best ? t[i] : best;
    }
    for (; j < n; j++) {
        best = s[j] > best ? s[j] : best;
    }
    return best;
}

/* s[j] = exp(s[j] - m) for j < n, returning the sum; -inf scores give exactly 0, and a NaN (a
 * NaN score, or +inf at m = +inf) stays NaN, as expf gives it: the caller tells such a row. */
__attribute__((target("avx2,fma"))) static float exp_shift_avx2(float *s, int32_t n, float m) {
    const __m256 mv = _mm256_set1_ps(m), lo = _mm256_set1_ps(-87.0f);
    __m256 sum = _mm256_setzero_ps();
    int32_t j = 0;
    for (; j + 8 <= n; j += 8) {
        __m256 x = _mm256_sub_ps(_mm256_loadu_ps(s + j), mv);
        __m256 dead = _mm256_cmp_ps(x, lo, _CMP_LT_OQ);
        /* max_ps returns its second operand when either is NaN: x, so NaN passes on */
        __m256 y = _mm256_andnot_ps(dead, exp_avx2(_mm256_max_ps(lo, x)));
        _mm256_storeu_ps(s + j, y);
        sum = _mm256_add_ps(sum, y);
    }
    float tmp[8];
    _mm256_storeu_ps(tmp, sum);
    float total = ((tmp[0] + tmp[4]) + (tmp[1] + tmp[5])) + ((tmp[2] + tmp[6]) + (tmp[3] + tmp[7]));
    for (; j < n; j++) {
        s[j] = expf(s[j] - m);
        total += s[j];
    }
    return total;
}

/* s[j] = cap tanh(s[j] / cap) for j < n. Cephes' tanhf: an odd degree-11 polynomial below
 * |x| = 0.625, 1 - 2 / (exp(2|x|) + 1) above, with the sign put back; within a few ulp of
 * tanhf. */
__attribute__((target("avx2,fma"))) static void softcap_avx2(float *s, int32_t n, float cap) {
    const __m256 inv = _mm256_set1_ps(1.0f / cap), capv = _mm256_set1_ps(cap);
    const __m256 sign_bit = _mm256_set1_ps(-0.0f), one = _mm256_set1_ps(1.0f);
    const __m256 two = _mm256_set1_ps(2.0f), small = _mm256_set1_ps(0.625f);
    const __m256 top = _mm256_set1_ps(44.0f); /* tanh is 1.0f from 9.01 on; exp(88) is finite */
    int32_t j = 0;
    for (; j + 8 <= n; j += 8) {
        __m256 x = _mm256_mul_ps(_mm256_loadu_ps(s + j), inv);
        __m256 sign = _mm256_and_ps(x, sign_bit);
        __m256 z = _mm256_min_ps(_mm256_andnot_ps(sign_bit, x), top);
        __m256 e = exp_avx2(_mm256_add_ps(z, z));
        __m256 big = _mm256_sub_ps(one, _mm256_div_ps(two, _mm256_add_ps(e, one)));
        __m256 x2 = _mm256_mul_ps(x, x);
        __m256 p = _mm256_set1_ps(-5.70498872745e-3f);
        p = _mm256_fmadd_ps(p, x2, _mm256_set1_ps(2.06390887954e-2f));
        p = _mm256_fmadd_ps(p, x2, _mm256_set1_ps(-5.37397155531e-2f));
        p = _mm256_fmadd_ps(p, x2, _mm256_set1_ps(1.33314422036e-1f));
        p = _mm256_fmadd_ps(p, x2, _mm256_set1_ps(-3.33332819422e-1f));
        __m256 near = _mm256_fmadd_ps(_mm256_mul_ps(p, x2), x, x);
        __m256 t =
            _mm256_blendv_ps(_mm256_or_ps(big, sign), near, _mm256_cmp_ps(z, small, _CMP_LT_OQ));
        _mm256_storeu_ps(s + j, _mm256_mul_ps(capv, t));
    }
    for (; j < n; j++) {
        s[j] = cap * tanhf(s[j] * (1.0f / cap));
    }
}

/* Values as they are held: float (DT 0), bfloat16 (1), binary16 (2), or Q8_0 (3: blocks of a
 * binary16 scale and 32 int8, KV rows only). Eight from value i of w (for Q8_0 a multiple of 8
 * within one row), and one. Always inlined with a constant DT so each kernel is specialized. */
__attribute__((always_inline, target("avx2,fma,f16c"))) static inline __m256
load_w8(const int DT, const void *w, size_t i) {
    if (DT == 0) {
        return _mm256_loadu_ps((const float *)w + i);
    }
    if (DT == 3) {
        const uint8_t *blk = (const uint8_t *)w + i / ATTN__QK8_0 * ATTN__Q8_0_BYTES;
        uint16_t h;
        memcpy(&h, blk, sizeof h);
        __m128i q = _mm_loadl_epi64((const __m128i *)(blk + 2 + i % ATTN__QK8_0));
        return _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(q)),
                             _mm256_set1_ps(_cvtsh_ss(h)));
    }
    __m128i h = _mm_loadu_si128((const __m128i *)((const uint16_t *)w + i));
    if (DT == 1) {
        return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
    }
    return _mm256_cvtph_ps(h);
}

__attribute__((always_inline, target("avx2,fma,f16c"))) static inline float
load_w1(const int DT, const void *w, size_t i) {
    /* memcpy: a row need not be aligned to its element (the kernels' tests space rows oddly) */
    if (DT == 0) {
        float f;
        memcpy(&f, (const float *)w + i, sizeof f);
        return f;
    }
    if (DT == 3) {
        const uint8_t *blk = (const uint8_t *)w + i / ATTN__QK8_0 * ATTN__Q8_0_BYTES;
        uint16_t h;
        memcpy(&h, blk, sizeof h);
        return _cvtsh_ss(h) * (float)(int8_t)blk[2 + i % ATTN__QK8_0];
    }
    uint16_t h;
    memcpy(&h, (const uint16_t *)w + i, sizeof h);
    return DT == 1 ? attn__bf16_to_f32(h) : _cvtsh_ss(h);
}

/* The byte offset of value c in a row held as DT (Q8_0: within a few bytes), for prefetching. */
#define KV_BYTE_OF(DT, c)                                                                          \
    ((DT) == 0 ? (size_t)(c)*4 : (DT) < 3 ? (size_t)(c)*2 : (size_t)(c)*17 / 16)

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

/* Sixteen bfloat16 weights widened with in-lane unpacks: lo holds values 0-3 and 8-11, hi 4-7
 * and 12-15 (bf16_lane_order puts x in that order). One load for both: vpmovzxwd, the
 * one-step widening, is a cross-lane op that Zen 5 issues about once a cycle (a probe: 4.8 G
 * FMA/s a core through it, 8.4 through unpacks), and a memory operand on each unpack would load
 * the weights twice (the compiler folds them unless told the value is in a register). */
__attribute__((always_inline, target("avx2,fma,f16c"))) static inline void
widen_bf16x16(const uint16_t *w, __m256 *lo, __m256 *hi) {
    __m256i v = _mm256_loadu_si256((const __m256i *)w), z = _mm256_setzero_si256();
    __asm__("" : "+x"(v)); /* one load, two unpacks of the register */
    *lo = _mm256_castsi256_ps(_mm256_unpacklo_epi16(z, v));
    *hi = _mm256_castsi256_ps(_mm256_unpackhi_epi16(z, v));
}

/* The longest input row put in widen_bf16x16's order on the stack (32 KiB); longer ones take
 * dot_row1. */
#define LANES_MAX_K 8192

/* xl = x in widen_bf16x16's order: in each whole 16 values the middle two quads swapped, the
 * tail as it is. */
__attribute__((always_inline, target("avx2,fma,f16c"))) static inline void
bf16_lane_order(const float *x, int32_t k, float *xl) {
    int32_t c = 0;
    for (; c + 16 <= k; c += 16) {
        __m256 a = _mm256_loadu_ps(x + c), b = _mm256_loadu_ps(x + c + 8);
        _mm256_storeu_ps(xl + c, _mm256_permute2f128_ps(a, b, 0x20));
        _mm256_storeu_ps(xl + c + 8, _mm256_permute2f128_ps(a, b, 0x31));
    }
    for (; c < k; c++) {
        xl[c] = x[c];
    }
}

/* y[r] = x . w_r for four bfloat16 weight rows side by side, xl in widen_bf16x16's order: each
 * 16 values of x loaded once for eight FMAs, two accumulators a row. For weights in cache (four
 * rows are four streams, which from DRAM read at a third of one: dot_row1 streams those). */
__attribute__((always_inline, target("avx2,fma,f16c"))) static inline void
dot_rows4_lanes(const float *xl, const uint16_t *w, size_t ldw, int32_t k, float *y) {
    __m256 acc[8];
#pragma GCC unroll 8
    for (int a = 0; a < 8; a++) {
        acc[a] = _mm256_setzero_ps();
    }
    int32_t c = 0;
    for (; c + 16 <= k; c += 16) {
        __m256 x0 = _mm256_loadu_ps(xl + c), x1 = _mm256_loadu_ps(xl + c + 8);
#pragma GCC unroll 4
        for (int r = 0; r < 4; r++) {
            __m256 lo, hi;
            widen_bf16x16(w + (size_t)r * ldw + c, &lo, &hi);
            acc[2 * r] = _mm256_fmadd_ps(x0, lo, acc[2 * r]);
            acc[2 * r + 1] = _mm256_fmadd_ps(x1, hi, acc[2 * r + 1]);
        }
    }
#pragma GCC unroll 4
    for (int r = 0; r < 4; r++) {
        float t[8];
        _mm256_storeu_ps(t, _mm256_add_ps(acc[2 * r], acc[2 * r + 1]));
        float sum = ((t[0] + t[4]) + (t[1] + t[5])) + ((t[2] + t[6]) + (t[3] + t[7]));
        for (int32_t i = c; i < k; i++) {
            sum += xl[i] * attn__bf16_to_f32(w[(size_t)r * ldw + i]);
        }
        y[r] = sum;
    }
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

__attribute__((target("avx2,fma,f16c"))) static void
rows_dot_half_avx2(const float *x, int32_t m, int32_t k, const uint16_t *w, bool is_bf16,
                   bool is_cached, int32_t n, float *y, size_t ldy) {
    if (is_bf16 && is_cached && m == 1 && k <= LANES_MAX_K) {
        float xl[LANES_MAX_K];
        bf16_lane_order(x, k, xl);
        int32_t j = 0;
        for (; j + 4 <= n; j += 4) {
            dot_rows4_lanes(xl, w + (size_t)j * k, (size_t)k, k, y + j);
        }
        for (; j < n; j++) {
            y[j] = dot_row1(1, x, w + (size_t)j * k, k);
        }
        return;
    }
    if (is_bf16) {
        rows_dot_t(1, x, m, k, w, n, y, ldy);
    } else {
        rows_dot_t(2, x, m, k, w, n, y, ldy);
    }
}

/* ---- decode attention against K/V held in a narrower dtype --------------------------------- */

/* A Q8_0 row's block holding value c: its scale, broadcast; its 8 int8 from value c (a multiple
 * of 8), as floats not yet scaled. */
__attribute__((always_inline, target("avx2,fma,f16c"))) static inline __m256
q8_scale(const uint8_t *row, int32_t c) {
    uint16_t h;
    memcpy(&h, row + (size_t)(c / ATTN__QK8_0) * ATTN__Q8_0_BYTES, sizeof h);
    return _mm256_set1_ps(_cvtsh_ss(h));
}

__attribute__((always_inline, target("avx2,fma,f16c"))) static inline __m256
q8_values(const uint8_t *row, int32_t c) {
    const uint8_t *p = row + (size_t)(c / ATTN__QK8_0) * ATTN__Q8_0_BYTES + 2 + c % ATTN__QK8_0;
    return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)p)));
}

/* How far ahead the scores kernel prefetches key rows: each pass of a few keys asks for every
 * line of the rows this far ahead (the hardware prefetcher stops at page boundaries, and a block
 * spans several pages). Every row, not one row in three as before: the small preset's 32-session
 * decode step (K/V out of L3) 4.1-4.5 -> 3.1-4.0 ms median over four alternated runs. Q8_0's
 * block loop keeps its own prefetch, a block 8 rows ahead.
 * As far as the weighted sum's (PV_KEYS): near a block's end each kernel prefetches the rows the
 * other reads first (the scores kernel the block's values, the weighted sum the next block's
 * keys), and from there the other prefetches PV_KEYS on; 16 here left rows 16-31 of every value
 * and key run to demand misses (llama8b, 32 sessions at L=2048, bf16: 20.0-20.5 -> 18.6-18.8 ms;
 * 24, 40 and 48 rows in between; 64 slower). */
#define KV_PREFETCH_ROWS 32

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

/* s[a * lds + b] = q_a . k_b for MX <= 4 query rows and NK <= 3 keys held as DT, rb bytes apart:
 * each key vector is widened once and used for every row. ahead[b]: the row to prefetch for key
 * b. */
__attribute__((always_inline, target("avx2,fma,f16c"))) static inline void
qk_kv_block(const int DT, const int MX, const int NK, const float *q, size_t ldq, const uint8_t *k,
            size_t rb, const uint8_t *const *ahead, int32_t d, float *s, size_t lds) {
    __m256 acc[16];
#pragma GCC unroll 16
    for (int a = 0; a < 16; a++) {
        acc[a] = _mm256_setzero_ps(); /* unrolled: a loop here became a rep stos per call */
    }
    if (DT != 3) {
        /* the lines of the rows KV_PREFETCH_ROWS ahead, all at once: no branch in the loop */
#pragma GCC unroll 3
        for (int b = 0; b < NK; b++) {
            for (size_t off = 0; off < KV_BYTE_OF(DT, d); off += 64) {
                _mm_prefetch((const char *)(ahead[b] + off), _MM_HINT_T0);
            }
        }
    }
    int32_t c = 0;
    for (; DT == 3 && c + ATTN__QK8_0 <= d; c += ATTN__QK8_0) {
        /* Q8_0 a whole block at a time: its scale widened once, not per 8 values */
        _mm_prefetch((const char *)(k + 8 * rb + KV_BYTE_OF(DT, c)), _MM_HINT_T0);
        __m256 sv[3];
#pragma GCC unroll 3
        for (int b = 0; b < NK; b++) {
            sv[b] = q8_scale(k + b * rb, c);
        }
#pragma GCC unroll 4
        for (int32_t sub = 0; sub < ATTN__QK8_0; sub += 8) {
            __m256 kv[3];
#pragma GCC unroll 3
            for (int b = 0; b < NK; b++) {
                kv[b] = _mm256_mul_ps(q8_values(k + b * rb, c + sub), sv[b]);
            }
#pragma GCC unroll 4
            for (int a = 0; a < MX; a++) {
                __m256 qv = _mm256_loadu_ps(q + a * ldq + c + sub);
#pragma GCC unroll 3
                for (int b = 0; b < NK; b++) {
                    acc[b * 4 + a] = _mm256_fmadd_ps(qv, kv[b], acc[b * 4 + a]);
                }
            }
        }
    }
    for (; c + 8 <= d; c += 8) {
#pragma GCC unroll 3
        for (int b = 0; DT == 3 && b < NK; b++) {
            /* a Q8_0 row's tail (d not whole blocks) */
            _mm_prefetch((const char *)(ahead[b] + KV_BYTE_OF(DT, c)), _MM_HINT_T0);
        }
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

/* One group of MX query rows against the n keys of a block, a few at a time. */
__attribute__((always_inline, target("avx2,fma,f16c"))) static inline void
qk_kv_rows(const int DT, const int MX, const float *q, size_t ldq, const uint8_t *k, size_t rb,
           int32_t n, struct attn__kv_after after, int32_t d, float *s, size_t lds) {
    int32_t j = 0;
    /* three keys a pass (12 accumulators hide the FMA latency better than 8: bf16 from L2 18.8
     * -> 16.7 ns a key); Q8_0 one, as its scales took the registers of two and spilled
     * accumulators to the stack (llama8b L=2048 on one thread: 0.49-0.50 -> 0.46-0.48 ms) */
    for (; DT != 3 && j + 3 <= n; j += 3) {
        const uint8_t *ahead[3];
#pragma GCC unroll 3
        for (int b = 0; b < 3; b++) {
            ahead[b] = row_ahead(k, rb, n, after, j + KV_PREFETCH_ROWS + b);
        }
        qk_kv_block(DT, MX, 3, q, ldq, k + (size_t)j * rb, rb, ahead, d, s + j, lds);
    }
    for (; j < n; j++) {
        const uint8_t *ahead[1] = {row_ahead(k, rb, n, after, j + KV_PREFETCH_ROWS)};
        qk_kv_block(DT, MX, 1, q, ldq, k + (size_t)j * rb, rb, ahead, d, s + j, lds);
    }
}

/* CALL(MX, i) for the query rows of a task in groups of MX <= 4 from row i: the decode kernels
 * are specialized per group size. */
#define FOR_ROW_GROUPS(m, CALL)                                                                    \
    do {                                                                                           \
        int32_t i_ = 0;                                                                            \
        for (; i_ + 4 <= (m); i_ += 4) {                                                           \
            CALL(4, i_);                                                                           \
        }                                                                                          \
        switch ((m)-i_) {                                                                          \
        case 3:                                                                                    \
            CALL(3, i_);                                                                           \
            break;                                                                                 \
        case 2:                                                                                    \
            CALL(2, i_);                                                                           \
            break;                                                                                 \
        case 1:                                                                                    \
            CALL(1, i_);                                                                           \
            break;                                                                                 \
        default:                                                                                   \
            break;                                                                                 \
        }                                                                                          \
    } while (0)

/* Keys per run of pv_kv_rows: a run's value rows stay in L1 while its strips walk them. Each run
 * prefetches the next, so this is also the weighted sum's prefetch distance, which must be the
 * scores kernel's for the two to hand prefetching over at a block's edge. */
#define PV_KEYS KV_PREFETCH_ROWS

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
        }
    }
    /* Every strip prefetches its part of each row PV_KEYS ahead (a line twice when two strips
     * share it: an idle load slot, cheaper than a branch a key). The run's rows ahead are found
     * once: past the block they continue in `after`, at its row size. */
    const uint8_t *ahead = row_ahead(v, rb, n, after, j0 + PV_KEYS) + KV_BYTE_OF(DT, c);
    size_t ahead_rb = j0 + PV_KEYS < n || after.rows == NULL ? rb : after.row_bytes;
    int32_t j = j0;
    for (; j + NS <= j1; j += NS) {
#pragma GCC unroll 2
        for (int u = 0; u < NS; u++) {
            const uint8_t *row = v + (size_t)(j + u) * rb;
            _mm_prefetch((const char *)ahead, _MM_HINT_T0);
            ahead += ahead_rb;
            __m256 vv[4];
#pragma GCC unroll 4
            for (int w = 0; w < CW; w++) {
                vv[w] = DT == 3 ? q8_values(row, c + 8 * w) : load_w8(DT, row, (size_t)c + 8 * w);
            }
#pragma GCC unroll 4
            for (int a = 0; a < MX; a++) {
                __m256 pa = _mm256_broadcast_ss(p + a * ldp + (j + u - pj));
#pragma GCC unroll 4
                for (int w = 0; w < CW; w++) {
                    acc[u][a][w] = _mm256_fmadd_ps(pa, vv[w], acc[u][a][w]);
                }
            }
        }
    }
    for (; j < j1; j++) {
        const uint8_t *row = v + (size_t)j * rb;
#pragma GCC unroll 4
        for (int w = 0; w < CW; w++) {
            __m256 vw = DT == 3 ? q8_values(row, c + 8 * w) : load_w8(DT, row, (size_t)c + 8 * w);
#pragma GCC unroll 4
            for (int a = 0; a < MX; a++) {
                acc[0][a][w] =
                    _mm256_fmadd_ps(_mm256_broadcast_ss(p + a * ldp + (j - pj)), vw, acc[0][a][w]);
            }
        }
    }
#pragma GCC unroll 4
    for (int a = 0; a < MX; a++) {
#pragma GCC unroll 4
        for (int w = 0; w < CW; w++) {
            __m256 sum = NS > 1 ? _mm256_add_ps(acc[0][a][w], acc[NS - 1][a][w]) : acc[0][a][w];
            _mm256_storeu_ps(o + a * ldo + c + 8 * w, sum);
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
typedef void rows_fn(const float *in, size_t ld_in, const uint8_t *rows, size_t rb, int32_t n,
                     struct attn__kv_after after, int32_t d, float *out, size_t ld_out);
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

/* The m query rows of a task against a block, in groups of at most 4, by fns (qk_rows or
 * pv_rows of the block's dtype). */
static void rows_avx2(rows_fn *const *fns, const float *in, size_t ld_in, int32_t m,
                      const uint8_t *rows, size_t rb, int32_t n, struct attn__kv_after after,
                      int32_t d, float *out, size_t ld_out) {
#define GROUP(MX, i)                                                                               \
    fns[(MX)-1](in + (i)*ld_in, ld_in, rows, rb, n, after, d, out + (i)*ld_out, ld_out)
    FOR_ROW_GROUPS(m, GROUP);
#undef GROUP
}

__attribute__((target("avx2,fma,f16c"))) static void widen_avx2(attn_dtype dt, const uint8_t *src,
                                                                size_t rb, int32_t n, int32_t d,
                                                                float *dst, size_t ld) {
#define WIDEN(DT) widen_t(DT, src, rb, n, d, dst, ld)
    KV_DISPATCH(dt, WIDEN);
#undef WIDEN
}

#endif /* TILE_HAVE_AVX2 */

void attn__rows_dot(const float *x, int32_t m, int32_t k, const float *w, int32_t n, float *y,
                    size_t ldy) {
#ifdef TILE_HAVE_AVX2
    rows_dot_avx2(x, m, k, w, n, y, ldy);
#else
    attn__qk(x, (size_t)k, m, w, (size_t)k, n, k, y, ldy);
#endif
}

void attn__softcap(float *s, int32_t n, float cap) {
#ifdef TILE_HAVE_AVX2
    if (attn__tile_is_fast()) {
        softcap_avx2(s, n, cap);
        return;
    }
#endif
    for (int32_t j = 0; j < n; j++) {
        s[j] = cap * tanhf(s[j] * (1.0f / cap));
    }
}

void attn__rows_dot_half(const float *x, int32_t m, int32_t k, const uint16_t *w, bool is_bf16,
                         bool is_cached, int32_t n, float *y, size_t ldy) {
#ifdef TILE_HAVE_AVX2
    if (attn__tile_is_fast()) {
        rows_dot_half_avx2(x, m, k, w, is_bf16, is_cached, n, y, ldy);
        return;
    }
#endif
    attn__rows_dot_half_portable(x, m, k, w, is_bf16, n, y, ldy);
}

float attn__row_max(const float *s, int32_t n) {
#ifdef TILE_HAVE_AVX2
    if (attn__tile_is_fast()) {
        return row_max_avx2(s, n);
    }
#endif
    float best = -INFINITY;
    for (int32_t j = 0; j < n; j++) {
        best = s[j] > best ? s[j] : best;
    }
    return best;
}

float attn__exp_shift(float *s, int32_t n, float m) {
#ifdef TILE_HAVE_AVX2
    if (attn__tile_is_fast()) {
        return exp_shift_avx2(s, n, m);
    }
#endif
    float total = 0.0f;
    for (int32_t j = 0; j < n; j++) {
        s[j] = expf(s[j] - m);
        total += s[j];
    }
    return total;
}

void attn__tile_qk(const float *q, size_t ldq, int32_t m, const float *k, int32_t n, int32_t d,
                   float *s, size_t lds, float *pack) {
#ifdef TILE_HAVE_AVX2
    qk_avx2(q, ldq, m, k, n, d, s, lds, pack);
#else
    (void)pack;
    attn__qk(q, ldq, m, k, (size_t)d, n, d, s, lds);
#endif
}

void attn__tile_pv(const float *p, size_t ldp, int32_t m, const float *v, size_t ldv, int32_t n,
                   int32_t d, float *o, size_t ldo) {
#ifdef TILE_HAVE_AVX2
    pv_avx2(p, ldp, m, v, ldv, n, d, o, ldo);
#else
    attn__pv(p, ldp, m, v, ldv, n, d, o, ldo);
#endif
}

void attn__small_qk_kv(attn_dtype dt, const float *q, size_t ldq, int32_t m, const uint8_t *k,
                       size_t row_bytes, int32_t n, struct attn__kv_after after, int32_t d,
                       float *s, size_t lds, float *widen) {
#ifdef TILE_HAVE_AVX2
    if (attn__tile_is_fast()) {
        rows_avx2(qk_rows[kernel_dtype(dt)], q, ldq, m, k, row_bytes, n, after, d, s, lds);
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
    if (attn__tile_is_fast()) {
        rows_avx2(pv_rows[kernel_dtype(dt)], p, ldp, m, v, row_bytes, n, after, d, o, ldo);
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
