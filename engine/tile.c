/* engine/tile.c: register-blocked kernels for the attention tiles of prefill (many query rows
 * against one key block), in AVX2 + FMA with a portable fallback. They replace cblas_sgemm
 * there because OpenBLAS threads every call above a tiny size and spends its time in
 * sched_yield on these short GEMMs; these run on the calling thread only, so attention tasks can
 * be spread over the caller's executor. The choice is made per call from the CPU's features.
 * Beside them: the softmax's row max and exp, and the soft-cap's tanh. Decode attention's
 * kernels are in tile_kv.c, the projections' in tile_rows.c. */
#include "tile_avx2.h"

#include <math.h>

#ifdef TILE_HAVE_AVX2
#include <cpuid.h>
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

/* 0 = not asked yet, 1 = no, 2 = yes; attn__tile_allow_wide(false) pins it to 1. */
static int wide_known = 0;

bool attn__tile_is_wide(void) {
#ifdef TILE_HAVE_AVX2
    int k = __atomic_load_n(&wide_known, __ATOMIC_RELAXED);
    if (k == 0) {
        /* __builtin_cpu_supports also asks the OS (XCR0) whether it saves the zmm registers */
        bool wide = attn__tile_is_fast() && __builtin_cpu_supports("avx512f") &&
                    __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512dq") &&
                    __builtin_cpu_supports("avx512vl");
        k = wide ? 2 : 1;
        __atomic_store_n(&wide_known, k, __ATOMIC_RELAXED);
    }
    return k == 2;
#else
    return false;
#endif
}

void attn__tile_allow_wide(bool allow) {
    __atomic_store_n(&wide_known, allow ? 0 : 1, __ATOMIC_RELAXED);
}

const char *attn_kernels_name(void) {
    return attn__tile_is_wide() ? "avx512" : attn__tile_is_fast() ? "avx2" : "portable";
}

void attn_kernels_allow_avx512(bool allow) {
    attn__tile_allow_wide(allow);
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

#endif /* TILE_HAVE_AVX2 */

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
