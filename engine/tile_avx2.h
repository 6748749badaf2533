/* engine/tile_avx2.h: what the AVX2 kernels of tile.c, tile_rows.c, tile_kv.c and half_rows.c
 * share: the intrinsics (TILE_HAVE_AVX2 where they are) and, always inlined so that every kernel
 * is specialized per dtype, the readers of values as they are held. Internal to those files. */
#ifndef ATTND_ENGINE_TILE_AVX2_H
#define ATTND_ENGINE_TILE_AVX2_H

#include "attn_int.h"

#include <string.h>

/* ATTN_PORTABLE_KERNELS leaves the AVX2 kernels out of a build, for the fuzz build: clang
 * spends minutes on their sanitized instantiations, its targets fuzz parsers rather than
 * arithmetic, and `make asan` runs these kernels under ASan and UBSan. */
#if defined(__x86_64__) && defined(__GNUC__) && !defined(ATTN_PORTABLE_KERNELS)
#include <immintrin.h>
#define TILE_HAVE_AVX2 1
#endif

#ifdef TILE_HAVE_AVX2

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

/* Values 0-7 | 8-15 <-> widen_bf16x16's order 0-3 8-11 | 4-7 12-15, for vectors a and b (its
 * own inverse: an exchange of 128-bit halves). */
__attribute__((always_inline, target("avx2,fma,f16c"))) static inline void
bf16_lane_swap(__m256 *a, __m256 *b) {
    __m256 lo = _mm256_permute2f128_ps(*a, *b, 0x20), hi = _mm256_permute2f128_ps(*a, *b, 0x31);
    *a = lo;
    *b = hi;
}

/* xl = x in widen_bf16x16's order: in each whole 16 values the middle two quads swapped, the
 * tail as it is. */
__attribute__((always_inline, target("avx2,fma,f16c"))) static inline void
bf16_lane_order(const float *x, int32_t k, float *xl) {
    int32_t c = 0;
    for (; c + 16 <= k; c += 16) {
        __m256 a = _mm256_loadu_ps(x + c), b = _mm256_loadu_ps(x + c + 8);
        bf16_lane_swap(&a, &b);
        _mm256_storeu_ps(xl + c, a);
        _mm256_storeu_ps(xl + c + 8, b);
    }
    for (; c < k; c++) {
        xl[c] = x[c];
    }
}

/* The byte offset of value c in a row held as DT (Q8_0: within a few bytes), for prefetching. */
#define KV_BYTE_OF(DT, c)                                                                          \
    ((DT) == 0 ? (size_t)(c)*4 : (DT) < 3 ? (size_t)(c)*2 : (size_t)(c)*17 / 16)

#endif /* TILE_HAVE_AVX2 */

#endif
