/* engine/simd.c: the portable inner products of small attention problems (decode: a handful of
 * query rows against a block of keys), where cblas_sgemm's packing costs more than the
 * arithmetic. GCC vector extensions, so one source serves every target; tile.c and tile_kv.c have
 * the AVX2 versions and uses these when the CPU lacks AVX2/FMA. */
#include "attn_int.h"

/* 16-byte vectors: baseline on x86-64 (SSE) and aarch64 (NEON), passed in registers. */
typedef float v4f __attribute__((vector_size(16), aligned(4)));

static inline v4f load4(const float *p) {
    v4f v;
    __builtin_memcpy(&v, p, sizeof v);
    return v;
}

static inline void store4(float *p, v4f v) {
    __builtin_memcpy(p, &v, sizeof v);
}

static inline float hsum4(v4f v) {
    return (v[0] + v[2]) + (v[1] + v[3]);
}

/* Four query rows against one key: the key row is loaded once and reused from registers. */
static inline void dot4(const float *q0, const float *q1, const float *q2, const float *q3,
                        const float *k, int32_t d, float *r) {
    v4f a0 = {0}, a1 = {0}, a2 = {0}, a3 = {0};
    int32_t c = 0;
    for (; c + 4 <= d; c += 4) {
        v4f kv = load4(k + c);
        a0 += load4(q0 + c) * kv;
        a1 += load4(q1 + c) * kv;
        a2 += load4(q2 + c) * kv;
        a3 += load4(q3 + c) * kv;
    }
    float s0 = hsum4(a0), s1 = hsum4(a1), s2 = hsum4(a2), s3 = hsum4(a3);
    for (; c < d; c++) {
        s0 += q0[c] * k[c];
        s1 += q1[c] * k[c];
        s2 += q2[c] * k[c];
        s3 += q3[c] * k[c];
    }
    r[0] = s0;
    r[1] = s1;
    r[2] = s2;
    r[3] = s3;
}

static inline float dot1(const float *q, const float *k, int32_t d) {
    v4f a = {0}, b = {0};
    int32_t c = 0;
    for (; c + 8 <= d; c += 8) {
        a += load4(q + c) * load4(k + c);
        b += load4(q + c + 4) * load4(k + c + 4);
    }
    for (; c + 4 <= d; c += 4) {
        a += load4(q + c) * load4(k + c);
    }
    float s = hsum4(a + b);
    for (; c < d; c++) {
        s += q[c] * k[c];
    }
    return s;
}

void attn__qk(const float *q, size_t ldq, int32_t m, const float *k, size_t ldk, int32_t n,
              int32_t d, float *s, size_t lds) {
    int32_t i = 0;
    for (; i + 4 <= m; i += 4) {
        const float *q0 = q + i * ldq;
        for (int32_t j = 0; j < n; j++) {
            float r[4];
            dot4(q0, q0 + ldq, q0 + 2 * ldq, q0 + 3 * ldq, k + j * ldk, d, r);
            s[i * lds + j] = r[0];
            s[(i + 1) * lds + j] = r[1];
            s[(i + 2) * lds + j] = r[2];
            s[(i + 3) * lds + j] = r[3];
        }
    }
    for (; i < m; i++) {
        for (int32_t j = 0; j < n; j++) {
            s[i * lds + j] = dot1(q + i * ldq, k + j * ldk, d);
        }
    }
}

/* o_i += p_ij v_j: each value row is read once per block and applied to every query row while
 * it is in L1; the output rows (m * d floats) stay in L1 across the block. */
void attn__pv(const float *p, size_t ldp, int32_t m, const float *v, size_t ldv, int32_t n,
              int32_t d, float *o, size_t ldo) {
    for (int32_t j = 0; j < n; j++) {
        const float *vj = v + j * ldv;
        for (int32_t i = 0; i < m; i++) {
            float w = p[i * ldp + j];
            if (w == 0.0f) {
                continue;
            }
            float *oi = o + i * ldo;
            v4f wv = {w, w, w, w};
            int32_t c = 0;
            for (; c + 4 <= d; c += 4) {
                store4(oi + c, load4(oi + c) + wv * load4(vj + c));
            }
            for (; c < d; c++) {
                oi[c] += w * vj[c];
            }
        }
    }
}
