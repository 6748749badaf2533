/* engine/half_rows.c: runs of floats rounded to bfloat16 or binary16 (to nearest even), bit for
 * bit as half.c's one-value conversions: eight at a time with AVX2 where the CPU has it
 * (bfloat16 by integer rounding, binary16 by F16C's vcvtps2ph); the rest, and any eight holding
 * an infinity or a NaN (whose bits half.c decides), one at a time. A KV cache's new rows and a
 * model's weights held in half go through here: a call per value cost ~26 instructions a value
 * (callgrind: 10 M of small's 32-step decode run were the calls alone). */
#include "tile_avx2.h"

/* All exponent bits set: an infinity or a NaN. */
static bool is_all_exponent(uint16_t h, bool is_bf16) {
    uint16_t e = is_bf16 ? 0x7f80u : 0x7c00u;
    return (h & e) == e;
}

static bool round_one(const float *src, bool is_bf16, uint16_t *dst) {
    *dst = is_bf16 ? attn__f32_to_bf16(*src) : attn__f32_to_f16(*src);
    return is_all_exponent(*dst, is_bf16);
}

#ifdef TILE_HAVE_AVX2
/* The whole eights of src[0 .. n): returns how many values it rounded; *over as
 * attn__half_round says. */
__attribute__((target("avx2,fma,f16c"))) static size_t
round_avx2(const float *src, size_t n, bool is_bf16, uint16_t *dst, bool *over) {
    const __m256i exp32 = _mm256_set1_epi32(0x7f800000), one = _mm256_set1_epi32(1);
    const __m256i half_ulp = _mm256_set1_epi32(0x7fff);
    const __m128i exp16 = _mm_set1_epi16((short)(is_bf16 ? 0x7f80 : 0x7c00));
    __m128i all_exp = _mm_setzero_si128();
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 x = _mm256_loadu_ps(src + i);
        __m256i u = _mm256_castps_si256(x);
        if (!_mm256_testz_si256(_mm256_cmpeq_epi32(_mm256_and_si256(u, exp32), exp32),
                                _mm256_set1_epi32(-1))) {
            for (size_t k = i; k < i + 8; k++) { /* an infinity or NaN among them */
                *over |= round_one(src + k, is_bf16, dst + k);
            }
            continue;
        }
        __m128i h;
        if (is_bf16) {
            /* (u + 0x7fff + the kept part's lowest bit) >> 16, as attn__f32_to_bf16 */
            __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(u, 16), one);
            __m256i r = _mm256_srli_epi32(_mm256_add_epi32(_mm256_add_epi32(u, half_ulp), lsb), 16);
            /* 16-bit halves of each 128-bit lane, then lanes 0 and 2 of 64 bits: values 0-7 */
            __m256i packed = _mm256_permute4x64_epi64(_mm256_packus_epi32(r, r), 0x08);
            h = _mm256_castsi256_si128(packed);
        } else {
            h = _mm256_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
        }
        _mm_storeu_si128((__m128i *)(void *)(dst + i), h);
        all_exp = _mm_or_si128(all_exp, _mm_cmpeq_epi16(_mm_and_si128(h, exp16), exp16));
    }
    *over |= !_mm_testz_si128(all_exp, all_exp);
    return i;
}
#endif

bool attn__half_round(attn_dtype dt, const float *src, size_t n, uint16_t *dst) {
    bool is_bf16 = dt == ATTN_DTYPE_BF16, over = false;
    size_t i = 0;
#ifdef TILE_HAVE_AVX2
    if (attn__tile_is_fast()) {
        i = round_avx2(src, n, is_bf16, dst, &over);
    }
#endif
    for (; i < n; i++) {
        over |= round_one(src + i, is_bf16, dst + i);
    }
    return over;
}
