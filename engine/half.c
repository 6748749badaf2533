/* engine/half.c: weights held in half precision (bfloat16 or IEEE binary16): the conversions to
 * and from float (round to nearest even, as checkpoints are written). Their products are
 * panel.c's. */
#include "attn_int.h"

#include <math.h>
#include <string.h>

static uint32_t bits_of(float f) {
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

static float float_of(uint32_t u) {
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

uint16_t attn__f32_to_bf16(float f) {
    uint32_t u = bits_of(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) {
        return (uint16_t)((u >> 16) | 0x40u); /* NaN stays a (quiet) NaN */
    }
    return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

float attn__bf16_to_f32(uint16_t h) {
    return float_of((uint32_t)h << 16);
}

uint16_t attn__f32_to_f16(float f) {
    uint32_t u = bits_of(f);
    uint16_t sign = (uint16_t)((u >> 16) & 0x8000u);
    uint32_t a = u & 0x7fffffffu;
    if (a > 0x7f800000u) {
        return (uint16_t)(sign | 0x7e00u); /* NaN */
    }
    if (a >= 0x477ff000u) {
        return (uint16_t)(sign | 0x7c00u); /* rounds past 65504: infinity */
    }
    if (a < 0x38800000u) {
        /* below f16's smallest normal: a subnormal (or zero), rounded to nearest even in the
         * float arithmetic, which is exact here */
        float scaled = float_of(a) * 16777216.0f; /* 2^24: f16's subnormal unit becomes 1 */
        return (uint16_t)(sign | (uint16_t)lrintf(scaled));
    }
    uint32_t mant = a & 0x7fffffu;
    uint32_t exp = (a >> 23) - 112; /* rebias 127 -> 15 */
    uint32_t h = (exp << 10) | (mant >> 13);
    uint32_t rest = mant & 0x1fffu;
    if (rest > 0x1000u || (rest == 0x1000u && (h & 1u))) {
        h++; /* may carry into the exponent, which is right */
    }
    return (uint16_t)(sign | h);
}

float attn__f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1fu, mant = h & 0x3ffu;
    if (exp == 0) {
        float f = (float)mant * (1.0f / 16777216.0f); /* subnormal or zero: mant x 2^-24 */
        return sign ? -f : f;
    }
    if (exp == 31) {
        return float_of(sign | 0x7f800000u | (mant << 13)); /* inf or NaN */
    }
    return float_of(sign | ((exp + 112) << 23) | (mant << 13));
}
