/* tests/check_mla.c: multi-head latent attention (seed 003) in the engine against tests/ref.c's
 * expanded form: with and without q_lora_rank, with and without biases, both RoPE layouts;
 * prefill, decodes, chunks past the workspace and two caches in one call; weights; the latent
 * cache's size per token; refusals. Tolerances: check_harness.h's. */
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check_harness.h"
#include "ref.h"

struct mla_case {
    int32_t q_lora, kv_lora, nope, rope, v;
    bool has_bias;
    attn_rope_style style;
};

static attn_config mla_config(const struct mla_case *k) {
    attn_config c;
    memset(&c, 0, sizeof c);
    c.n_layers = 1;
    c.hidden_size = 64;
    c.n_heads = 4;
    c.n_kv_heads = 1;
    c.max_seq = 256;
    c.rope_theta = 10000.0f;
    c.rope_style = k->style;
    c.q_lora_rank = k->q_lora;
    c.kv_lora_rank = k->kv_lora;
    c.qk_nope_head_dim = k->nope;
    c.qk_rope_head_dim = k->rope;
    c.v_head_dim = k->v;
    c.has_qkv_bias = k->has_bias;
    c.has_o_bias = k->has_bias;
    c.mla_norm_eps = 1e-6f;
    return c;
}

static float *uniform(ref_rng *r, size_t n, float lo, float hi) {
    float *t = harness_calloc(n, sizeof(float));
    ref_fill_uniform(r, t, n, lo, hi);
    return t;
}

START_TEST(test_mla_matches_expanded_reference) {
    static const struct mla_case cases[] = {
        {0, 16, 8, 4, 12, false, ATTN_ROPE_STYLE_INTERLEAVED},
        {24, 16, 8, 4, 12, true, ATTN_ROPE_STYLE_INTERLEAVED},
        {24, 32, 16, 8, 16, true, ATTN_ROPE_STYLE_HALF},
        {12, 8, 0, 6, 8, false, ATTN_ROPE_STYLE_HALF}, /* no nope part: RoPE alone */
    };
    for (size_t ci = 0; ci < sizeof cases / sizeof cases[0]; ci++) {
        const struct mla_case *k = &cases[ci];
        attn_config cfg = mla_config(k);
        ck_assert_int_eq(attn_config_check(&cfg), ATTN_OK);
        ck_assert_int_eq(cfg.head_dim, k->nope + k->rope);
        const int32_t hidden = 64, h = 4, qk = k->nope + k->rope, n = 24;
        ref_rng rng;
        ref_rng_init(&rng, 8100 + ci);
        float b_in = 1.0f / 8.0f;
        int32_t qr = k->q_lora > 0 ? k->q_lora : 1;
        float *wq = uniform(&rng, (size_t)h * qk * hidden, -b_in, b_in);
        float *bq = uniform(&rng, (size_t)h * qk, -b_in, b_in);
        float *wq_a = uniform(&rng, (size_t)qr * hidden, -b_in, b_in);
        float *bq_a = uniform(&rng, (size_t)qr, -b_in, b_in);
        float *q_a_norm = uniform(&rng, (size_t)qr, 0.5f, 1.5f);
        float *wq_b = uniform(&rng, (size_t)h * qk * qr, -0.3f, 0.3f);
        float *wkv_a = uniform(&rng, (size_t)(k->kv_lora + k->rope) * hidden, -b_in, b_in);
        float *bkv_a = uniform(&rng, (size_t)(k->kv_lora + k->rope), -b_in, b_in);
        float *kv_a_norm = uniform(&rng, (size_t)k->kv_lora, 0.5f, 1.5f);
        float *wkv_b = uniform(&rng, (size_t)h * (k->nope + k->v) * k->kv_lora, -0.3f, 0.3f);
        float *wo = uniform(&rng, (size_t)hidden * h * k->v, -0.2f, 0.2f);
        float *bo = uniform(&rng, (size_t)hidden, -0.2f, 0.2f);
        attn_layer_weights lw = {.wq = wq,
                                 .bq = bq,
                                 .wo = wo,
                                 .bo = bo,
                                 .wq_a = wq_a,
                                 .bq_a = bq_a,
                                 .q_a_norm = q_a_norm,
                                 .wq_b = wq_b,
                                 .wkv_a = wkv_a,
                                 .bkv_a = bkv_a,
                                 .kv_a_norm = kv_a_norm,
                                 .wkv_b = wkv_b};
        ref_mla_layer rw = {wq,    bq,    wq_a,      bq_a,  q_a_norm, wq_b,
                            wkv_a, bkv_a, kv_a_norm, wkv_b, wo,       bo};
        attn_model *m = NULL;
        ck_assert_int_eq(attn_model_create(&cfg, &lw, NULL, &m), ATTN_OK);
        float *x = harness_random_x(8200 + ci, n, hidden);
        float *want = harness_calloc((size_t)n * hidden, sizeof(float));
        float *w_want = harness_calloc((size_t)h * n * n, sizeof(float));
        ref_mla_forward(&cfg, &rw, x, n, want, w_want);

        attn_kv_pool *pool = NULL;
        attn_workspace *ws = NULL;
        attn_kv *a = NULL, *b = NULL;
        ck_assert_int_eq(attn_kv_pool_create(m, 1 << 20, 16, &pool), ATTN_OK);
        /* the latent alone: kv_lora + rope floats a token, no values of their own */
        ck_assert_uint_eq(attn_kv_pool_block_bytes(pool),
                          (size_t)16 * (k->kv_lora + k->rope) * sizeof(float));
        ck_assert_int_eq(attn_workspace_create(m, 5, NULL, &ws), ATTN_OK);
        ck_assert_int_eq(attn_kv_create(pool, &a), ATTN_OK);
        ck_assert_int_eq(attn_kv_create(pool, &b), ATTN_OK);
        float *out_a = harness_calloc((size_t)n * hidden, sizeof(float));
        float *out_b = harness_calloc((size_t)n * hidden, sizeof(float));
        /* a: 9 (chunked by 5), decodes with weights, 7, the rest; b alongside, other splits */
        static const int32_t calls[][2] = {{9, 1}, {1, 11}, {1, 1}, {7, 4}, {1, 1}, {5, 6}};
        int32_t at_a = 0, at_b = 0;
        for (size_t c = 0; c < sizeof calls / sizeof calls[0]; c++) {
            int32_t ta = calls[c][0], tb = calls[c][1];
            float *w = harness_calloc((size_t)h * ta * (at_a + ta), sizeof(float));
            /* b's call inspects itself: its probabilities, computed after the forward from the
             * absorbed tasks' latent keys and row LSE */
            float *wb = harness_calloc((size_t)h * tb * (at_b + tb), sizeof(float));
            attn_inspect ins_b = {.kind = ATTN_INSPECT_PROBS, .n_keys = at_b + tb, .out = wb};
            attn_step st[2] = {
                {.kv = a,
                 .x = x + (size_t)at_a * hidden,
                 .n_tokens = ta,
                 .out = out_a + (size_t)at_a * hidden,
                 .weights = w},
                {.kv = b,
                 .x = x + (size_t)at_b * hidden,
                 .n_tokens = tb,
                 .out = out_b + (size_t)at_b * hidden,
                 .inspect = &ins_b},
            };
            ck_assert_int_eq(attn_forward(m, 0, ws, st, 2), ATTN_OK);
            /* this call's weight rows against the reference's, over the keys so far */
            for (int32_t hh = 0; hh < h; hh++) {
                for (int32_t i = 0; i < ta; i++) {
                    char what[96];
                    snprintf(what, sizeof what, "case %zu: weights of head %d, token %d", ci,
                             (int)hh, (int)(at_a + i));
                    harness_expect_close(w + ((size_t)hh * ta + i) * (at_a + ta),
                                         w_want + ((size_t)hh * n + at_a + i) * n,
                                         (size_t)(at_a + ta), what);
                }
            }
            for (int32_t hh = 0; hh < h; hh++) {
                for (int32_t i = 0; i < tb; i++) {
                    char what[96];
                    snprintf(what, sizeof what, "case %zu: inspected head %d, token %d", ci,
                             (int)hh, (int)(at_b + i));
                    harness_expect_close(wb + ((size_t)hh * tb + i) * (at_b + tb),
                                         w_want + ((size_t)hh * n + at_b + i) * n,
                                         (size_t)(at_b + tb), what);
                }
            }
            free(wb);
            free(w);
            at_a += ta;
            at_b += tb;
        }
        ck_assert_int_eq(at_a, n);
        ck_assert_int_eq(at_b, n);
        char what[64];
        snprintf(what, sizeof what, "case %zu: cache a", ci);
        harness_expect_close(out_a, want, (size_t)n * hidden, what);
        snprintf(what, sizeof what, "case %zu: cache b", ci);
        harness_expect_close(out_b, want, (size_t)n * hidden, what);
        /* A cross step has no latent form. */
        attn_step cross = {.cross = b, .x = x, .n_tokens = 1, .out = out_b};
        ck_assert_int_eq(attn_forward(m, 0, ws, &cross, 1), ATTN_EINVAL);
        attn_kv_destroy(b);
        attn_kv_destroy(a);
        attn_workspace_destroy(ws);
        attn_kv_pool_destroy(pool);
        attn_model_destroy(m);
        float *all[] = {out_b, out_a, w_want, want,     x,    bo,   wo, wkv_b, kv_a_norm,
                        bkv_a, wkv_a, wq_b,   q_a_norm, bq_a, wq_a, bq, wq};
        for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) {
            free(all[i]);
        }
    }
}
END_TEST

/* What MLA's config may not have, and what it fills in. */
START_TEST(test_mla_config_rules) {
    struct mla_case k = {0, 16, 8, 4, 12, false, ATTN_ROPE_STYLE_INTERLEAVED};
    attn_config c = mla_config(&k);
    c.n_kv_heads = 2;
    ck_assert_int_eq(attn_config_check(&c), ATTN_ESHAPE);
    c = mla_config(&k);
    c.head_dim = 16;
    ck_assert_int_eq(attn_config_check(&c), ATTN_ESHAPE);
    c = mla_config(&k);
    c.qk_rope_head_dim = 3;
    ck_assert_int_eq(attn_config_check(&c), ATTN_EINVAL);
    c = mla_config(&k);
    c.sliding_window = 8;
    ck_assert_int_eq(attn_config_check(&c), ATTN_EUNSUPPORTED);
    c = mla_config(&k);
    c.layer_kind[0] = ATTN_LAYER_LINEAR;
    ck_assert_int_eq(attn_config_check(&c), ATTN_EUNSUPPORTED);
    c = mla_config(&k);
    ck_assert_int_eq(attn_config_check(&c), ATTN_OK);
    ck_assert_int_eq(c.head_dim, 12);
    ck_assert_int_eq(c.rotary_dim, 4);
    ck_assert_float_eq_tol(c.softmax_scale, 1.0f / sqrtf(12.0f), 1e-7f);
}
END_TEST

/* `extern` keeps this prototype out of the Makefile's suite-table scan, which matches lines
 * starting with `Suite *`. */
extern Suite *mla_suite(void);

Suite *mla_suite(void) {
    Suite *s = suite_create("mla");
    TCase *tc = tcase_create("mla");
    tcase_add_test(tc, test_mla_matches_expanded_reference);
    tcase_add_test(tc, test_mla_config_rules);
    suite_add_tcase(s, tc);
    return s;
}
