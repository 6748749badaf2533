/* engine/tile_avx2.h: what the AVX2 kernels of tile.c, tile_rows.c and tile_kv.c share: the
 * intrinsics and, always inlined so that every kernel is specialized per dtype, the readers of
 * values as they are held. Internal to those three files. */
#ifndef ATTND_ENGINE_TILE_AVX2_H
#define ATTND_ENGINE_TILE_AVX2_H

#include "attn_int.h"

#include <string.h>

#if defined(__x86_64__) && defined(__GNUC__)
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

/* The byte offset of value c in a row held as DT (Q8_0: within a few bytes), for prefetching. */
#define KV_BYTE_OF(DT, c)                                                                          \
    ((DT) == 0 ? (size_t)(c)*4 : (DT) < 3 ? (size_t)(c)*2 : (size_t)(c)*17 / 16)

#endif /* TILE_HAVE_AVX2 */

#endif
