/* engine/tile.c: register-blocked kernels for the attention tiles of prefill (many query rows
 * against one key block), in AVX2 + FMA with a portable fallback. They replace cblas_sgemm
 * there because OpenBLAS threads every call above a tiny size and spends its time in
 * sched_yield on these short GEMMs; these run on the calling thread only, so attention tasks can
 * be spread over the caller's executor. The choice is made per call from the CPU's features. */
#include "attn_int.h"

#include <math.h>
#include <string.h>

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define TILE_HAVE_AVX2 1
#endif

/* Rows x columns of one register block: 6 x 16 floats = 12 ymm accumulators, which keeps the
 * two FMA ports busy while the loads (2 per step) and broadcasts (6) stay within budget. */
#define MR 6
#define NR 16

bool attn__tile_is_fast(void) {
#ifdef TILE_HAVE_AVX2
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
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

/* s[i][0..16) = sum_c q[i][c] kt[c][0..16), for MR rows. Only constant indices into acc, so
 * the compiler keeps all 12 accumulators in registers. */
__attribute__((target("avx2,fma"))) static void qk_block_full(const float *q, size_t ldq,
                                                              const float *kt, int32_t n_pad,
                                                              int32_t d, float *s, size_t lds,
                                                              int32_t n) {
    __m256 acc[MR][2];
#pragma GCC unroll 6
    for (int32_t i = 0; i < MR; i++) {
        acc[i][0] = _mm256_setzero_ps();
        acc[i][1] = _mm256_setzero_ps();
    }
    for (int32_t c = 0; c < d; c++) {
        __m256 b0 = _mm256_loadu_ps(kt + (size_t)c * n_pad);
        __m256 b1 = _mm256_loadu_ps(kt + (size_t)c * n_pad + 8);
#pragma GCC unroll 6
        for (int32_t i = 0; i < MR; i++) {
            __m256 a = _mm256_broadcast_ss(q + i * ldq + c);
            acc[i][0] = _mm256_fmadd_ps(a, b0, acc[i][0]);
            acc[i][1] = _mm256_fmadd_ps(a, b1, acc[i][1]);
        }
    }
#pragma GCC unroll 6
    for (int32_t i = 0; i < MR; i++) {
        float tmp[NR];
        _mm256_storeu_ps(tmp, acc[i][0]);
        _mm256_storeu_ps(tmp + 8, acc[i][1]);
        memcpy(s + i * lds, tmp, (size_t)(n < NR ? n : NR) * sizeof(float));
    }
}

/* One row of the same product, for the ragged rows past the last full block. */
__attribute__((target("avx2,fma"))) static void
qk_block_row(const float *q, const float *kt, int32_t n_pad, int32_t d, float *s, int32_t n) {
    __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
    for (int32_t c = 0; c < d; c++) {
        __m256 a = _mm256_broadcast_ss(q + c);
        acc0 = _mm256_fmadd_ps(a, _mm256_loadu_ps(kt + (size_t)c * n_pad), acc0);
        acc1 = _mm256_fmadd_ps(a, _mm256_loadu_ps(kt + (size_t)c * n_pad + 8), acc1);
    }
    float tmp[NR];
    _mm256_storeu_ps(tmp, acc0);
    _mm256_storeu_ps(tmp + 8, acc1);
    memcpy(s, tmp, (size_t)(n < NR ? n : NR) * sizeof(float));
}

__attribute__((target("avx2,fma"))) static void qk_avx2(const float *q, size_t ldq, int32_t m,
                                                        const float *k, int32_t n, int32_t d,
                                                        float *s, size_t lds, float *pack) {
    int32_t n_pad = (n + NR - 1) / NR * NR;
    pack_kt(k, n, d, pack, n_pad);
    for (int32_t j0 = 0; j0 < n; j0 += NR) {
        int32_t i = 0;
        for (; i + MR <= m; i += MR) {
            qk_block_full(q + i * ldq, ldq, pack + j0, n_pad, d, s + i * lds + j0, lds, n - j0);
        }
        for (; i < m; i++) {
            qk_block_row(q + i * ldq, pack + j0, n_pad, d, s + i * lds + j0, n - j0);
        }
    }
}

/* o[i][0..16) += sum_j p[i][j] v[j][0..16), for MR rows (accumulators in registers). */
__attribute__((target("avx2,fma"))) static void pv_block_full(const float *p, size_t ldp,
                                                              const float *v, size_t ldv, int32_t n,
                                                              float *o, size_t ldo) {
    __m256 acc[MR][2];
#pragma GCC unroll 6
    for (int32_t i = 0; i < MR; i++) {
        acc[i][0] = _mm256_loadu_ps(o + i * ldo);
        acc[i][1] = _mm256_loadu_ps(o + i * ldo + 8);
    }
    for (int32_t j = 0; j < n; j++) {
        __m256 b0 = _mm256_loadu_ps(v + (size_t)j * ldv);
        __m256 b1 = _mm256_loadu_ps(v + (size_t)j * ldv + 8);
#pragma GCC unroll 6
        for (int32_t i = 0; i < MR; i++) {
            __m256 a = _mm256_broadcast_ss(p + i * ldp + j);
            acc[i][0] = _mm256_fmadd_ps(a, b0, acc[i][0]);
            acc[i][1] = _mm256_fmadd_ps(a, b1, acc[i][1]);
        }
    }
#pragma GCC unroll 6
    for (int32_t i = 0; i < MR; i++) {
        _mm256_storeu_ps(o + i * ldo, acc[i][0]);
        _mm256_storeu_ps(o + i * ldo + 8, acc[i][1]);
    }
}

__attribute__((target("avx2,fma"))) static void pv_block_row(const float *p, const float *v,
                                                             size_t ldv, int32_t n, float *o) {
    __m256 acc0 = _mm256_loadu_ps(o), acc1 = _mm256_loadu_ps(o + 8);
    for (int32_t j = 0; j < n; j++) {
        __m256 a = _mm256_broadcast_ss(p + j);
        acc0 = _mm256_fmadd_ps(a, _mm256_loadu_ps(v + (size_t)j * ldv), acc0);
        acc1 = _mm256_fmadd_ps(a, _mm256_loadu_ps(v + (size_t)j * ldv + 8), acc1);
    }
    _mm256_storeu_ps(o, acc0);
    _mm256_storeu_ps(o + 8, acc1);
}

__attribute__((target("avx2,fma"))) static void pv_avx2(const float *p, size_t ldp, int32_t m,
                                                        const float *v, int32_t n, int32_t d,
                                                        float *o, size_t ldo) {
    int32_t c_fast = d / NR * NR;
    for (int32_t c0 = 0; c0 < c_fast; c0 += NR) {
        int32_t i = 0;
        for (; i + MR <= m; i += MR) {
            pv_block_full(p + i * ldp, ldp, v + c0, (size_t)d, n, o + i * ldo + c0, ldo);
        }
        for (; i < m; i++) {
            pv_block_row(p + i * ldp, v + c0, (size_t)d, n, o + i * ldo + c0);
        }
    }
    if (c_fast < d) {
        /* The few columns past the last full register block. */
        for (int32_t i = 0; i < m; i++) {
            for (int32_t j = 0; j < n; j++) {
                float w = p[i * ldp + j];
                for (int32_t c = c_fast; c < d; c++) {
                    o[i * ldo + c] += w * v[(size_t)j * d + c];
                }
            }
        }
    }
}

/* s[j] = exp(s[j] - m) for j < n, returning the sum; -inf scores give exactly 0. Cephes' expf
 * (range reduction by ln 2 in two parts, degree-5 polynomial), within 2 ulp of expf. */
__attribute__((target("avx2,fma"))) static float exp_shift_avx2(float *s, int32_t n, float m) {
    const __m256 mv = _mm256_set1_ps(m), lo = _mm256_set1_ps(-87.0f);
    const __m256 log2e = _mm256_set1_ps(1.44269504088896341f), half = _mm256_set1_ps(0.5f);
    const __m256 c1 = _mm256_set1_ps(0.693359375f), c2 = _mm256_set1_ps(-2.12194440e-4f);
    const __m256 one = _mm256_set1_ps(1.0f);
    __m256 sum = _mm256_setzero_ps();
    int32_t j = 0;
    for (; j + 8 <= n; j += 8) {
        __m256 x = _mm256_sub_ps(_mm256_loadu_ps(s + j), mv);
        __m256 dead = _mm256_cmp_ps(x, lo, _CMP_LT_OQ);
        x = _mm256_max_ps(x, lo);
        __m256 fx = _mm256_floor_ps(_mm256_fmadd_ps(x, log2e, half));
        x = _mm256_fnmadd_ps(fx, c1, x);
        x = _mm256_fnmadd_ps(fx, c2, x);
        __m256 y = _mm256_set1_ps(1.9875691500e-4f);
        y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(1.3981999507e-3f));
        y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(8.3334519073e-3f));
        y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(4.1665795894e-2f));
        y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(1.6666665459e-1f));
        y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(5.0000001201e-1f));
        y = _mm256_fmadd_ps(y, _mm256_mul_ps(x, x), _mm256_add_ps(x, one));
        __m256i e =
            _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(fx), _mm256_set1_epi32(127)), 23);
        y = _mm256_mul_ps(y, _mm256_castsi256_ps(e));
        y = _mm256_andnot_ps(dead, y);
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

#endif /* TILE_HAVE_AVX2 */

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

void attn__tile_pv(const float *p, size_t ldp, int32_t m, const float *v, int32_t n, int32_t d,
                   float *o, size_t ldo) {
#ifdef TILE_HAVE_AVX2
    pv_avx2(p, ldp, m, v, n, d, o, ldo);
#else
    attn__pv(p, ldp, m, v, (size_t)d, n, d, o, ldo);
#endif
}
