/* engine/kv_dtype.c: how the KV cache holds one row of values in each of its dtypes, written once
 * when a token is appended and widened back to float by the attention kernels (tile_kv.c streams
 * them in registers; this file is the portable reference). Q8_0 is llama.cpp's block_q8_0, so a
 * row exported from attnd reads as ggml's q8_0 tensor row. */
#include "attn_int.h"

#include <math.h>
#include <string.h>

const char *attn_dtype_name(attn_dtype dt) {
    switch (dt) {
    case ATTN_DTYPE_AUTO:
        return "auto";
    case ATTN_DTYPE_F32:
        return "f32";
    case ATTN_DTYPE_BF16:
        return "bf16";
    case ATTN_DTYPE_F16:
        return "f16";
    case ATTN_DTYPE_Q8_0:
        return "q8_0";
    }
    return "?";
}

int attn_dtype_parse(const char *name, attn_dtype *out) {
    for (attn_dtype dt = ATTN_DTYPE_AUTO; name != NULL && dt <= ATTN_DTYPE_Q8_0; dt++) {
        if (strcmp(name, attn_dtype_name(dt)) == 0) {
            *out = dt;
            return ATTN_OK;
        }
    }
    return ATTN_EINVAL;
}

size_t attn__kv_row_bytes(attn_dtype dt, int32_t d) {
    switch (dt) {
    case ATTN_DTYPE_BF16:
    case ATTN_DTYPE_F16:
        return (size_t)d * sizeof(uint16_t);
    case ATTN_DTYPE_Q8_0:
        return (size_t)(d + ATTN__QK8_0 - 1) / ATTN__QK8_0 * ATTN__Q8_0_BYTES;
    default:
        return (size_t)d * sizeof(float);
    }
}

/* One Q8_0 block from n <= 32 values (the rest of the block zero). Returns true if its scale
 * overflowed binary16. */
static bool encode_q8_0_block(const float *x, int32_t n, uint8_t *dst) {
    float amax = 0.0f;
    bool is_finite = true;
    for (int32_t i = 0; i < n; i++) {
        float a = fabsf(x[i]);
        amax = a > amax ? a : amax;
        is_finite &= isfinite(a) != 0;
    }
    /* The smallest binary16 scale >= max / 127 (llama.cpp rounds it to nearest, so a block's
     * largest value may land past 127 and be clamped: up to 0.56 of a step off, not 0.5). */
    float want = amax / 127.0f;
    uint16_t scale_h = attn__f32_to_f16(want);
    if (attn__f16_to_f32(scale_h) < want) {
        scale_h++; /* positive and finite: the next binary16 up */
    }
    bool overflows = (scale_h & 0x7c00) == 0x7c00 || !is_finite;
    if (overflows) {
        scale_h = 0x7c00; /* infinity: the block reads back infinite or NaN, never clamped */
    }
    float scale = attn__f16_to_f32(scale_h);
    memcpy(dst, &scale_h, sizeof scale_h);
    int8_t *q = (int8_t *)(dst + 2);
    for (int32_t i = 0; i < ATTN__QK8_0; i++) {
        /* x / s, not x * (1 / s): the reciprocal's rounding could cost a hair past half a step */
        float v = i < n && scale > 0.0f && isfinite(scale) ? roundf(x[i] / scale) : 0.0f;
        v = overflows && i < n ? (x[i] < 0.0f ? -1.0f : 1.0f) : v;
        v = v > 127.0f ? 127.0f : v < -127.0f ? -127.0f : v;
        q[i] = v == v ? (int8_t)v : 0;
    }
    return overflows;
}

bool attn__kv_encode(attn_dtype dt, const float *src, int32_t d, uint8_t *dst) {
    bool overflows = false;
    switch (dt) {
    case ATTN_DTYPE_BF16:
    case ATTN_DTYPE_F16:
        /* an infinity (or NaN), from a value past the range or already so, is an overflow */
        return attn__half_round(dt, src, (size_t)d, (uint16_t *)(void *)dst);
    case ATTN_DTYPE_Q8_0:
        for (int32_t c = 0; c < d; c += ATTN__QK8_0) {
            int32_t n = d - c < ATTN__QK8_0 ? d - c : ATTN__QK8_0;
            overflows |=
                encode_q8_0_block(src + c, n, dst + (size_t)c / ATTN__QK8_0 * ATTN__Q8_0_BYTES);
        }
        return overflows;
    default:
        memcpy(dst, src, (size_t)d * sizeof(float));
        for (int32_t i = 0; i < d; i++) {
            overflows |= !isfinite(src[i]); /* a projection or RoPE that overflowed float */
        }
        return overflows;
    }
}

/* Value c of a row held as dt. */
static float widen_one(attn_dtype dt, const uint8_t *row, int32_t c) {
    uint16_t h;
    switch (dt) {
    case ATTN_DTYPE_BF16:
        memcpy(&h, row + (size_t)c * 2, sizeof h);
        return attn__bf16_to_f32(h);
    case ATTN_DTYPE_F16:
        memcpy(&h, row + (size_t)c * 2, sizeof h);
        return attn__f16_to_f32(h);
    case ATTN_DTYPE_Q8_0: {
        const uint8_t *blk = row + (size_t)(c / ATTN__QK8_0) * ATTN__Q8_0_BYTES;
        memcpy(&h, blk, sizeof h);
        return attn__f16_to_f32(h) * (float)(int8_t)blk[2 + c % ATTN__QK8_0];
    }
    default: {
        float f;
        memcpy(&f, row + (size_t)c * sizeof f, sizeof f);
        return f;
    }
    }
}

void attn__kv_widen_portable(attn_dtype dt, const uint8_t *src, size_t row_bytes, int32_t n,
                             int32_t d, float *dst, size_t ld) {
    for (int32_t j = 0; j < n; j++) {
        const uint8_t *row = src + (size_t)j * row_bytes;
        float *out = dst + (size_t)j * ld;
        for (int32_t c = 0; c < d; c++) {
            out[c] = widen_one(dt, row, c);
        }
    }
}
