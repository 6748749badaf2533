/* tests/check_kv_dtype.c: K/V held as BF16, F16 or Q8_0. The encodings against ref.c's own
 * rounding (written from the formats' definitions) and ggml's block_q8_0 layout; the AVX2 decode
 * kernels against the portable loops; whole layers against ref.c rounding K/V the same way, in
 * both attention paths (online softmax, materialized weights) and every chunking; the pool's
 * capacity per dtype. Tolerance: check_harness.h's, since the reference holds the same K/V. */
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../engine/attn_int.h"
#include "check_harness.h"
#include "ref.h"

static const attn_dtype kv_dtypes[] = {ATTN_DTYPE_BF16, ATTN_DTYPE_F16, ATTN_DTYPE_Q8_0};

/* Encoding then widening gives ref_kv_round's values exactly, for rows of whole and partial
 * Q8_0 blocks; Q8_0 rows are ggml's blocks (scale, then 32 int8) and keep every value within
 * half a step of the original. */
START_TEST(test_kv_dtype_encodings_match_ref) {
    static const int32_t dims[] = {16, 32, 37, 64, 80, 128};
    ref_rng rng;
    ref_rng_init(&rng, 7100);
    for (size_t di = 0; di < sizeof dims / sizeof dims[0]; di++) {
        int32_t d = dims[di];
        float x[128], got[128];
        double want[128];
        uint8_t row[128 * 4];
        for (int rep = 0; rep < 50; rep++) {
            float range = rep % 3 == 0 ? 1e-3f : rep % 3 == 1 ? 1.0f : 300.0f;
            ref_fill_uniform(&rng, x, (size_t)d, -range, range);
            for (size_t t = 0; t < 3; t++) {
                attn_dtype dt = kv_dtypes[t];
                memset(row, 0xa5, sizeof row);
                attn__kv_encode(dt, x, d, row);
                attn__kv_widen_portable(dt, row, 0, 1, d, got, 0);
                for (int32_t i = 0; i < d; i++) {
                    want[i] = x[i];
                }
                ref_kv_round(dt, want, d);
                for (int32_t i = 0; i < d; i++) {
                    ck_assert_msg(got[i] == (float)want[i], "%s d=%d [%d]: %.9g, ref %.9g (x %.9g)",
                                  attn_dtype_name(dt), d, i, (double)got[i], want[i], (double)x[i]);
                }
                if (dt != ATTN_DTYPE_Q8_0) {
                    continue;
                }
                size_t nb = (size_t)(d + 31) / 32;
                ck_assert_uint_eq(attn__kv_row_bytes(dt, d), nb * 34);
                for (size_t b = 0; b < nb; b++) {
                    uint16_t h;
                    memcpy(&h, row + b * 34, 2);
                    float scale = attn__f16_to_f32(h);
                    const int8_t *q = (const int8_t *)(row + b * 34 + 2);
                    for (int32_t i = 0; i < 32; i++) {
                        int32_t c = (int32_t)b * 32 + i;
                        ck_assert_int_le(abs(q[i]), 127);
                        if (c >= d) {
                            ck_assert_int_eq(q[i], 0); /* the padding */
                        } else {
                            ck_assert(fabsf(x[c] - scale * q[i]) <=
                                      0.5f * scale + 1e-7f * fabsf(x[c]));
                        }
                    }
                }
            }
        }
    }
    /* A zero block has scale 0; a block of one large value scales it to +-127 exactly. */
    float x[32] = {0}, got[32];
    uint8_t row[34];
    attn__kv_encode(ATTN_DTYPE_Q8_0, x, 32, row);
    attn__kv_widen_portable(ATTN_DTYPE_Q8_0, row, 0, 1, 32, got, 0);
    harness_expect_zero(got, 32, "zero block");
    x[5] = -2.5f;
    x[6] = 1.25f;
    attn__kv_encode(ATTN_DTYPE_Q8_0, x, 32, row);
    uint16_t h;
    memcpy(&h, row, 2);
    /* 2.5 / 127 lies between binary16 1290 and 1291 x 2^-16: the scale is the one above */
    ck_assert_uint_eq(h, attn__f32_to_f16(1291.0f / 65536.0f));
    ck_assert_int_eq((int8_t)row[2 + 5], -127); /* -126.9 */
    ck_assert_int_eq((int8_t)row[2 + 6], 63);   /* 63.45 */
    /* Past binary16's range the scale is infinite (reported): no value reads back finite. */
    x[5] = 1e9f;
    ck_assert(attn__kv_encode(ATTN_DTYPE_Q8_0, x, 32, row));
    attn__kv_widen_portable(ATTN_DTYPE_Q8_0, row, 0, 1, 32, got, 0);
    ck_assert(!isfinite(got[5]) && !isfinite(got[6]));
    ck_assert_str_eq(attn_dtype_name(ATTN_DTYPE_Q8_0), "q8_0");
    ck_assert_str_eq(attn_dtype_name((attn_dtype)9), "?");
}
END_TEST

/* The decode kernels (AVX-512 where the CPU has it and the loop allows it, else AVX2) and the
 * block widening agree with the portable loops over widened rows, for every dtype (float32 too:
 * a decode's attention takes the same kernels) and shapes with odd keys, few and many rows, dims
 * not a multiple of 8, and multiples of 32 (AVX-512's) with every row count up to 9. */
START_TEST(test_kv_dtype_kernels_agree) {
    /* (m, n, d); d = 288 and 520 pass Q8_0's 256-column chunks of scales (a latent's 512) */
    static const int32_t shapes[][3] = {{1, 7, 64},    {4, 16, 128}, {3, 5, 80},    {9, 33, 37},
                                        {4, 128, 128}, {2, 1, 16},   {4, 40, 288},  {3, 35, 520},
                                        {2, 13, 32},   {3, 9, 96},   {1, 21, 256},  {2, 50, 512},
                                        {7, 31, 64},   {5, 17, 160}, {6, 128, 128}, {9, 3, 192}};
    static const attn_dtype dtypes[] = {ATTN_DTYPE_F32, ATTN_DTYPE_BF16, ATTN_DTYPE_F16,
                                        ATTN_DTYPE_Q8_0};
    ref_rng rng;
    ref_rng_init(&rng, 7200);
    attn__tile_allow_wide(_i == 0);
    for (size_t t = 0; t < sizeof dtypes / sizeof dtypes[0]; t++) {
        attn_dtype dt = dtypes[t];
        for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++) {
            int32_t m = shapes[si][0], n = shapes[si][1], d = shapes[si][2];
            size_t rb = attn__kv_row_bytes(dt, d) + 6; /* rows further apart than they are long */
            uint8_t after_rows[64] = {0}; /* only prefetched: a wrong address must not fault */
            struct attn__kv_after after = {si % 2 ? after_rows : NULL, 7};
            float *q = harness_calloc((size_t)m * d, sizeof(float));
            float *src = harness_calloc((size_t)n * d, sizeof(float));
            uint8_t *rows = harness_calloc((size_t)n, rb);
            float *wide = harness_calloc((size_t)n * d, sizeof(float));
            float *wide2 = harness_calloc((size_t)n * d, sizeof(float));
            float *widen = harness_calloc((size_t)n * d, sizeof(float));
            float *s = harness_calloc((size_t)m * n, sizeof(float));
            float *s_want = harness_calloc((size_t)m * n, sizeof(float));
            float *p = harness_calloc((size_t)m * n, sizeof(float));
            float *o = harness_calloc((size_t)m * d, sizeof(float));
            float *o_want = harness_calloc((size_t)m * d, sizeof(float));
            ref_fill_uniform(&rng, q, (size_t)m * d, -1.0f, 1.0f);
            ref_fill_uniform(&rng, src, (size_t)n * d, -2.0f, 2.0f);
            ref_fill_uniform(&rng, p, (size_t)m * n, 0.0f, 1.0f);
            ref_fill_uniform(&rng, o, (size_t)m * d, -1.0f, 1.0f);
            memcpy(o_want, o, (size_t)m * d * sizeof(float));
            for (int32_t j = 0; j < n; j++) {
                attn__kv_encode(dt, src + (size_t)j * d, d, rows + (size_t)j * rb);
            }
            attn__kv_widen_portable(dt, rows, rb, n, d, wide, (size_t)d);
            attn__kv_widen(dt, rows, rb, n, d, wide2, (size_t)d);
            ck_assert_mem_eq(wide, wide2, (size_t)n * d * sizeof(float));
            attn__small_qk_kv(dt, q, (size_t)d, m, rows, rb, n, after, d, s, (size_t)n, widen);
            attn__qk(q, (size_t)d, m, wide, (size_t)d, n, d, s_want, (size_t)n);
            harness_expect_close_tol(s, s_want, (size_t)m * n, 1e-5, 1e-5, attn_dtype_name(dt));
            attn__small_pv_kv(dt, p, (size_t)n, m, rows, rb, n, after, d, o, (size_t)d, widen);
            attn__pv(p, (size_t)n, m, wide, (size_t)d, n, d, o_want, (size_t)d);
            harness_expect_close_tol(o, o_want, (size_t)m * d, 1e-5, 1e-5, attn_dtype_name(dt));
            free(o_want);
            free(o);
            free(p);
            free(s_want);
            free(s);
            free(widen);
            free(wide2);
            free(wide);
            free(rows);
            free(src);
            free(q);
        }
    }
    attn__tile_allow_wide(true);
}
END_TEST

/* The cache's K/V against the reference's, rounded the same way. The engine projects in float
 * and the reference in double, so a value within a float rounding of a boundary between two
 * held values may round to either: allow one step of the dtype (bfloat16 2^-7 of the value,
 * binary16 2^-10: a step is that at the bottom of a binade and half of it at the top; Q8_0 its
 * block's largest value / 127) on at most 1% of the values (measured: 1 in 1472 for F16), every
 * other value within the harness tolerance. */
static void expect_kv_typed(const attn_kv *kv, const float *k, const float *v, size_t count,
                            attn_dtype dt, const char *what) {
    float *got[2] = {harness_calloc(count, sizeof(float)), harness_calloc(count, sizeof(float))};
    const float *want[2] = {k, v};
    ck_assert_int_eq(attn_kv_read(kv, 0, attn_kv_len(kv), got[0], got[1]), ATTN_OK);
    size_t off_by_one = 0;
    for (int kind = 0; kind < 2; kind++) {
        float amax = 0.0f;
        for (size_t i = 0; i < count; i++) {
            amax = fabsf(want[kind][i]) > amax ? fabsf(want[kind][i]) : amax;
        }
        for (size_t i = 0; i < count; i++) {
            double g = got[kind][i], w = want[kind][i], diff = fabs(g - w);
            if (diff <= HARNESS_ATOL + HARNESS_RTOL * fabs(w)) {
                continue;
            }
            double step = dt == ATTN_DTYPE_BF16  ? ldexp(fabs(w), -7)
                          : dt == ATTN_DTYPE_F16 ? ldexp(fabs(w), -10) + ldexp(1.0, -24)
                                                 : amax / 127.0 * 1.001;
            ck_assert_msg(diff <= step, "%s: %s[%zu] = %.9g, want %.9g", what, kind ? "v" : "k", i,
                          g, w);
            off_by_one++;
        }
    }
    ck_assert_msg(off_by_one <= 2 * count / 100, "%s: %zu of %zu values a step off", what,
                  off_by_one, 2 * count);
    free(got[1]);
    free(got[0]);
}

/* A layer whose cache holds each dtype answers as ref.c with K/V rounded the same way: outputs
 * over a prefill of 40 (the tile kernels on widened blocks) then decodes (the streaming
 * kernels), weights over another chunking (the materialized path), the held K/V exactly. Two
 * shapes: head_dim 16 (one partial Q8_0 block per row, GQA 2) and 64 (two whole blocks, MQA 4),
 * blocks of 16 tokens so that a sequence spans several. */
START_TEST(test_kv_dtype_layer_matches_ref) {
    static const int32_t shapes[][3] = {{4, 2, 16}, {4, 1, 64}};
    for (size_t si = 0; si < 2; si++) {
        attn_config cfg = harness_config(shapes[si][0], shapes[si][1], shapes[si][2]);
        harness_model hm;
        harness_model_init(&hm, &cfg, 7300 + si);
        const int32_t n = 46, hidden = cfg.hidden_size;
        float *x = harness_random_x(7400 + (uint64_t)si, n, hidden);
        size_t kv_count = (size_t)cfg.n_kv_heads * n * cfg.head_dim;
        for (size_t t = 0; t < 3; t++) {
            attn_dtype dt = kv_dtypes[t];
            char what[64];
            snprintf(what, sizeof what, "%s head_dim %d", attn_dtype_name(dt), cfg.head_dim);
            float *want = harness_calloc((size_t)n * hidden, sizeof(float));
            float *want_w = harness_calloc((size_t)cfg.n_heads * n * n, sizeof(float));
            float *k = harness_calloc(kv_count, sizeof(float));
            float *v = harness_calloc(kv_count, sizeof(float));
            harness_ref_run_kv(&hm, 0, x, n, dt, want, want_w, k, v);
            attn_kv_pool *pool = NULL;
            attn_workspace *ws = NULL;
            ck_assert_int_eq(attn_kv_pool_create_typed(hm.model, 1 << 20, 16, dt, &pool), ATTN_OK);
            ck_assert_int_eq(attn_kv_pool_dtype(pool), dt);
            harness_threads th;
            attn_executor ex = harness_thread_executor(&th);
            ck_assert_int_eq(attn_workspace_create(hm.model, 48, &ex, &ws), ATTN_OK);
            float *out = harness_calloc((size_t)n * hidden, sizeof(float));
            float *w = harness_calloc((size_t)cfg.n_heads * n * n, sizeof(float));
            static const int32_t decode[] = {40, 1, 1, 1, 1, 1, 1};
            static const int32_t mixed[] = {5, 17, 1, 23};
            attn_kv *kv = NULL;
            ck_assert_int_eq(attn_kv_create(pool, &kv), ATTN_OK);
            harness_run r = {hm.model, 0, ws, kv, x, NULL, NULL, n, 0, decode, 7, out, NULL};
            ck_assert_int_eq(harness_run_chunks(&r), ATTN_OK);
            harness_expect_rows(out, want, 0, n, hidden, what);
            expect_kv_typed(kv, k, v, kv_count, dt, what);
            attn_kv_destroy(kv);
            ck_assert_int_eq(attn_kv_create(pool, &kv), ATTN_OK);
            harness_run rw = {hm.model, 0, ws, kv, x, NULL, NULL, n, 0, mixed, 4, out, w};
            ck_assert_int_eq(harness_run_chunks(&rw), ATTN_OK);
            harness_expect_rows(out, want, 0, n, hidden, what);
            harness_expect_weight_rows(w, want_w, cfg.n_heads, 0, n, what);
            attn_kv_destroy(kv);
            attn_workspace_destroy(ws);
            attn_kv_pool_destroy(pool);
            free(w);
            free(out);
            free(v);
            free(k);
            free(want_w);
            free(want);
        }
        free(x);
        harness_model_release(&hm);
    }
}
END_TEST

/* A finite value a dtype cannot hold is reported, and held as infinity (a Q8_0 block: its
 * scale), never clamped to a finite wrong one; a forward that met one takes its tokens back
 * and fails (ATTN_EOVERFLOW), and the cache then continues as if it had not been called. */
START_TEST(test_kv_dtype_overflow_takes_the_call_back) {
    float x[32] = {0};
    uint8_t row[32 * 4];
    float got[32];
    x[3] = 65504.0f;
    ck_assert(!attn__kv_encode(ATTN_DTYPE_F16, x, 32, row));
    x[3] = 70000.0f;
    ck_assert(attn__kv_encode(ATTN_DTYPE_F16, x, 32, row));
    attn__kv_widen_portable(ATTN_DTYPE_F16, row, 0, 1, 32, got, 0);
    ck_assert(isinf(got[3]));
    x[3] = 1e38f;
    ck_assert(!attn__kv_encode(ATTN_DTYPE_BF16, x, 32, row));
    x[3] = 3.4e38f;
    ck_assert(attn__kv_encode(ATTN_DTYPE_BF16, x, 32, row));
    x[3] = 8.0e6f; /* 8e6 / 127 = 62992: a binary16 scale still */
    ck_assert(!attn__kv_encode(ATTN_DTYPE_Q8_0, x, 32, row));
    x[3] = 1e7f;
    x[4] = -2.0f;
    ck_assert(attn__kv_encode(ATTN_DTYPE_Q8_0, x, 32, row));
    attn__kv_widen_portable(ATTN_DTYPE_Q8_0, row, 0, 1, 32, got, 0);
    for (int i = 0; i < 32; i++) {
        ck_assert_msg(!isfinite(got[i]), "value %d read back %g", i, (double)got[i]);
    }
    ck_assert(!attn__kv_encode(ATTN_DTYPE_F32, x, 32, row));
    /* a value already infinite or NaN (a projection or RoPE that overflowed float) is reported
     * in every dtype: no cache keeps it */
    static const attn_dtype all[] = {ATTN_DTYPE_F32, ATTN_DTYPE_BF16, ATTN_DTYPE_F16,
                                     ATTN_DTYPE_Q8_0};
    for (size_t t = 0; t < 4; t++) {
        float y[32] = {0};
        y[7] = INFINITY;
        ck_assert_msg(attn__kv_encode(all[t], y, 32, row), "%s inf", attn_dtype_name(all[t]));
        y[7] = NAN;
        ck_assert_msg(attn__kv_encode(all[t], y, 32, row), "%s nan", attn_dtype_name(all[t]));
    }

    attn_config cfg = harness_config(4, 2, 16);
    harness_model hm;
    harness_model_init(&hm, &cfg, 7600);
    const int32_t hidden = cfg.hidden_size;
    float *xs = harness_random_x(7601, 8, hidden);
    float *big = harness_random_x(7602, 2, hidden);
    for (int32_t i = 0; i < 2 * hidden; i++) {
        big[i] *= 1e9f; /* keys and values far past 65504 and 8.3e6, finite in float */
    }
    static const attn_dtype narrow[] = {ATTN_DTYPE_F16, ATTN_DTYPE_Q8_0};
    for (size_t t = 0; t < 2; t++) {
        attn_kv_pool *pool = NULL;
        attn_workspace *ws = NULL;
        ck_assert_int_eq(attn_kv_pool_create_typed(hm.model, 1 << 20, 16, narrow[t], &pool),
                         ATTN_OK);
        ck_assert_int_eq(attn_workspace_create(hm.model, 16, NULL, &ws), ATTN_OK);
        attn_kv *kv = NULL, *fresh = NULL;
        ck_assert_int_eq(attn_kv_create(pool, &kv), ATTN_OK);
        ck_assert_int_eq(attn_kv_create(pool, &fresh), ATTN_OK);
        float *out = harness_calloc((size_t)8 * hidden, sizeof(float));
        float *want = harness_calloc((size_t)8 * hidden, sizeof(float));
        attn_step a = {.kv = kv, .x = xs, .n_tokens = 5, .out = out};
        ck_assert_int_eq(attn_forward(hm.model, 0, ws, &a, 1), ATTN_OK);
        /* reserved first, as the server does: the failed forward gives its length back and
         * leaves the pool's free list alone (another thread owns it), the blocks reserved */
        ck_assert_int_eq(attn_kv_reserve(kv, 20), ATTN_OK);
        int32_t free_before = attn_kv_pool_blocks_free(pool);
        attn_step bad = {.kv = kv, .x = big, .n_tokens = 2, .out = out + 5 * hidden};
        ck_assert_int_eq(attn_forward(hm.model, 0, ws, &bad, 1), ATTN_EOVERFLOW);
        ck_assert_int_eq(attn_kv_len(kv), 5);
        ck_assert_int_eq(attn_kv_pool_blocks_free(pool), free_before);
        ck_assert_int_eq(attn_kv_truncate(kv, 5), ATTN_OK); /* the owner unreserves */
        ck_assert_int_gt(attn_kv_pool_blocks_free(pool), free_before);
        attn_step b = {.kv = kv, .x = xs + 5 * hidden, .n_tokens = 3, .out = out + 5 * hidden};
        ck_assert_int_eq(attn_forward(hm.model, 0, ws, &b, 1), ATTN_OK);
        attn_step fa = {.kv = fresh, .x = xs, .n_tokens = 5, .out = want};
        attn_step fb = {.kv = fresh, .x = xs + 5 * hidden, .n_tokens = 3, .out = want + 5 * hidden};
        ck_assert_int_eq(attn_forward(hm.model, 0, ws, &fa, 1), ATTN_OK);
        ck_assert_int_eq(attn_forward(hm.model, 0, ws, &fb, 1), ATTN_OK);
        ck_assert_mem_eq(out, want, (size_t)8 * hidden * sizeof(float));
        /* two steps in one call: the good one is taken back too (all or nothing) */
        attn_kv *other = NULL;
        ck_assert_int_eq(attn_kv_create(pool, &other), ATTN_OK);
        attn_step pair[2] = {{.kv = other, .x = xs, .n_tokens = 4, .out = want},
                             {.kv = kv, .x = big, .n_tokens = 2, .out = out}};
        ck_assert_int_eq(attn_forward(hm.model, 0, ws, pair, 2), ATTN_EOVERFLOW);
        ck_assert_int_eq(attn_kv_len(other), 0);
        ck_assert_int_eq(attn_kv_len(kv), 8);
        free(want);
        free(out);
        attn_kv_destroy(other);
        attn_kv_destroy(fresh);
        attn_kv_destroy(kv);
        attn_workspace_destroy(ws);
        attn_kv_pool_destroy(pool);
    }
    free(big);
    free(xs);
    harness_model_release(&hm);
}
END_TEST

/* Blocks per budget grow as rows shrink: x2 for BF16 and F16, x3.76 for Q8_0 at head_dim 128;
 * AUTO follows the weights; a fork copies typed blocks; other values are refused. */
START_TEST(test_kv_dtype_pool_capacity) {
    attn_config cfg = harness_config(4, 2, 128);
    cfg.hidden_size = 128;
    harness_model hm;
    harness_model_init(&hm, &cfg, 7500);
    size_t budget = 64u << 20;
    size_t bytes[5] = {0};
    for (attn_dtype dt = ATTN_DTYPE_F32; dt <= ATTN_DTYPE_Q8_0; dt++) {
        attn_kv_pool *pool = NULL;
        ck_assert_int_eq(attn_kv_pool_create_typed(hm.model, budget, 128, dt, &pool), ATTN_OK);
        bytes[dt] = attn_kv_pool_block_bytes(pool);
        ck_assert_uint_eq(attn_kv_pool_blocks_total(pool), budget / bytes[dt]);
        attn_kv_pool_destroy(pool);
    }
    ck_assert_uint_eq(bytes[ATTN_DTYPE_F32], 2u * 128 * 2 * 128 * 4);
    ck_assert_uint_eq(bytes[ATTN_DTYPE_BF16] * 2, bytes[ATTN_DTYPE_F32]);
    ck_assert_uint_eq(bytes[ATTN_DTYPE_F16] * 2, bytes[ATTN_DTYPE_F32]);
    ck_assert_uint_eq(bytes[ATTN_DTYPE_Q8_0], 2u * 128 * 2 * 136);
    attn_kv_pool *pool = NULL;
    ck_assert_int_eq(attn_kv_pool_create(hm.model, budget, 0, &pool), ATTN_OK);
    ck_assert_int_eq(attn_kv_pool_dtype(pool), ATTN_DTYPE_F32); /* a float model */
    attn_kv_pool_destroy(pool);
    ck_assert_int_eq(attn_kv_pool_create_typed(hm.model, budget, 0, (attn_dtype)5, &pool),
                     ATTN_EINVAL);
    ck_assert_int_eq(attn_kv_pool_create_typed(hm.model, budget, 0, (attn_dtype)-1, &pool),
                     ATTN_EINVAL);
    /* fork: the copy reads the same typed values */
    ck_assert_int_eq(attn_kv_pool_create_typed(hm.model, budget, 16, ATTN_DTYPE_Q8_0, &pool),
                     ATTN_OK);
    attn_workspace *ws = NULL;
    ck_assert_int_eq(attn_workspace_create(hm.model, 40, NULL, &ws), ATTN_OK);
    attn_kv *kv = NULL, *copy = NULL;
    ck_assert_int_eq(attn_kv_create(pool, &kv), ATTN_OK);
    const int32_t n = 37;
    float *x = harness_random_x(7600, n, cfg.hidden_size);
    float *out = harness_calloc((size_t)n * cfg.hidden_size, sizeof(float));
    static const int32_t one[] = {37};
    harness_run r = {hm.model, 0, ws, kv, x, NULL, NULL, n, 0, one, 1, out, NULL};
    ck_assert_int_eq(harness_run_chunks(&r), ATTN_OK);
    ck_assert_int_eq(attn_kv_fork(kv, &copy), ATTN_OK);
    size_t count = (size_t)cfg.n_kv_heads * n * cfg.head_dim;
    float *k0 = harness_calloc(count, sizeof(float)), *v0 = harness_calloc(count, sizeof(float));
    float *k1 = harness_calloc(count, sizeof(float)), *v1 = harness_calloc(count, sizeof(float));
    ck_assert_int_eq(attn_kv_read(kv, 0, n, k0, v0), ATTN_OK);
    ck_assert_int_eq(attn_kv_read(copy, 0, n, k1, v1), ATTN_OK);
    ck_assert_mem_eq(k0, k1, count * sizeof(float));
    ck_assert_mem_eq(v0, v1, count * sizeof(float));
    free(v1);
    free(k1);
    free(v0);
    free(k0);
    free(out);
    free(x);
    attn_kv_destroy(copy);
    attn_kv_destroy(kv);
    attn_workspace_destroy(ws);
    attn_kv_pool_destroy(pool);
    harness_model_release(&hm);
}
END_TEST

/* `extern` keeps this prototype out of the Makefile's suite-table scan, which matches lines
 * starting with `Suite *`. */
extern Suite *kvdtype_suite(void);

Suite *kvdtype_suite(void) {
    Suite *s = suite_create("kvdtype");
    TCase *tc = tcase_create("kvdtype");
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, test_kv_dtype_encodings_match_ref);
    tcase_add_loop_test(tc, test_kv_dtype_kernels_agree, 0, 2); /* AVX-512 allowed, not */
    tcase_add_test(tc, test_kv_dtype_overflow_takes_the_call_back);
    tcase_add_test(tc, test_kv_dtype_layer_matches_ref);
    tcase_add_test(tc, test_kv_dtype_pool_capacity);
    suite_add_tcase(s, tc);
    return s;
}
