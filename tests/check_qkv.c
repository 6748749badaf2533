/* tests/check_qkv.c: attention on the caller's projections (attn_forward_qkv), on a model of
 * geometry alone (attn_model_create_geometry). A sequence fed in chunks (a prefill longer than
 * the workspace, decode steps, another prefill) gives, row by row, what ref_sdpa gives for the
 * whole causal sequence, with and without the model's RoPE and with a sliding window; several
 * caches in one call give what each gives alone; what it cannot do is refused. */
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check_harness.h"
#include "ref.h"

#define H  4
#define HK 2
#define HD 16
#define N  40

static attn_config geometry(int32_t window) {
    attn_config c;
    memset(&c, 0, sizeof c);
    c.n_layers = 2;
    c.n_heads = H;
    c.n_kv_heads = HK;
    c.head_dim = HD;
    c.max_seq = 512;
    c.rope_theta = 10000.0f;
    c.sliding_window = window;
    return c;
}

/* (heads, N, HD) values uniform in [-1, 1). */
static float *random_heads(uint64_t seed, int32_t heads) {
    ref_rng r;
    ref_rng_init(&r, seed);
    float *a = harness_calloc((size_t)heads * N * HD, sizeof(float));
    ref_fill_uniform(&r, a, (size_t)heads * N * HD, -1.0f, 1.0f);
    return a;
}

/* Rows [first, first + n) of a (heads, N, HD) tensor, as their own (heads, n, HD) one. */
static float *slice(const float *a, int32_t heads, int32_t first, int32_t n) {
    float *s = harness_calloc((size_t)heads * n * HD, sizeof(float));
    for (int32_t h = 0; h < heads; h++) {
        memcpy(s + (size_t)h * n * HD, a + ((size_t)h * N + first) * HD,
               (size_t)n * HD * sizeof(float));
    }
    return s;
}

/* q and k rotated by ref's RoPE at their cache index. */
static void rotate(const attn_config *c, float *a, int32_t heads) {
    double inv[HD / 2], vec[HD];
    ref_rope_inv_freq(c, inv);
    for (int32_t h = 0; h < heads; h++) {
        for (int32_t t = 0; t < N; t++) {
            float *row = a + ((size_t)h * N + t) * HD;
            for (int32_t d = 0; d < HD; d++) {
                vec[d] = row[d];
            }
            ref_rope_rotate(c, inv, t, vec);
            for (int32_t d = 0; d < HD; d++) {
                row[d] = (float)vec[d];
            }
        }
    }
}

/* The sequence through attn_forward_qkv in chunks; out (H, N, HD). */
static void run_chunks(const attn_model *m, attn_kv_pool *pool, attn_workspace *ws, bool rope,
                       const float *q, const float *k, const float *v, float *out) {
    static const int32_t chunks[] = {25, 1, 1, 13};
    attn_kv *kv = NULL;
    ck_assert_int_eq(attn_kv_create_for_layer(pool, 0, &kv), ATTN_OK);
    int32_t first = 0;
    for (size_t c = 0; c < sizeof chunks / sizeof chunks[0]; c++) {
        int32_t n = chunks[c];
        float *qs = slice(q, H, first, n), *ks = slice(k, HK, first, n),
              *vs = slice(v, HK, first, n);
        float *os = harness_calloc((size_t)H * n * HD, sizeof(float));
        attn_qkv_step st = {
            .kv = kv, .n_tokens = n, .q = qs, .k = ks, .v = vs, .rope = rope, .out = os};
        ck_assert_int_eq(attn_forward_qkv(m, 0, ws, &st, 1), ATTN_OK);
        for (int32_t h = 0; h < H; h++) {
            memcpy(out + ((size_t)h * N + first) * HD, os + (size_t)h * n * HD,
                   (size_t)n * HD * sizeof(float));
        }
        free(qs);
        free(ks);
        free(vs);
        free(os);
        first += n;
    }
    ck_assert_int_eq(attn_kv_len(kv), N);
    attn_kv_destroy(kv);
}

START_TEST(test_qkv_matches_ref) {
    for (int variant = 0; variant < 3; variant++) {
        attn_config c = geometry(variant == 2 ? 8 : 0);
        bool rope = variant >= 1;
        attn_model *m = NULL;
        ck_assert_int_eq(attn_model_create_geometry(&c, NULL, &m), ATTN_OK);
        ck_assert(!attn_model_has_weights(m));
        attn_kv_pool *pool = NULL;
        attn_workspace *ws = NULL;
        ck_assert_int_eq(attn_kv_pool_create_typed(m, 1 << 20, 16, ATTN_DTYPE_F32, &pool), ATTN_OK);
        ck_assert_int_eq(attn_workspace_create(m, 16, NULL, &ws), ATTN_OK);
        float *q = random_heads(900 + (uint64_t)variant, H);
        float *k = random_heads(910 + (uint64_t)variant, HK);
        float *v = random_heads(920 + (uint64_t)variant, HK);
        float *got = harness_calloc((size_t)H * N * HD, sizeof(float));
        float *want = harness_calloc((size_t)H * N * HD, sizeof(float));
        run_chunks(m, pool, ws, rope, q, k, v, got);
        if (rope) {
            rotate(&c, q, H);
            rotate(&c, k, HK);
        }
        ref_sdpa_args a = {.n_heads = H,
                           .n_kv_heads = HK,
                           .n_q = N,
                           .n_k = N,
                           .d_k = HD,
                           .d_v = HD,
                           .q = q,
                           .k = k,
                           .v = v,
                           .is_causal = true,
                           .window = c.sliding_window > 0 ? c.sliding_window - 1 : -1,
                           .scale = ref_softmax_scale(&c),
                           .out = want};
        ref_sdpa(&a);
        char what[64];
        snprintf(what, sizeof what, "variant %d", variant);
        harness_expect_close(got, want, (size_t)H * N * HD, what);
        free(q);
        free(k);
        free(v);
        free(got);
        free(want);
        attn_workspace_destroy(ws);
        attn_kv_pool_destroy(pool);
        attn_model_destroy(m);
    }
}
END_TEST

/* One decode step of q = -1e20 e0 + 1e20 e1 over `past` keys k = k_past e0 and its own key
 * k_new0 e0 + k_new1 e1: scores of +-1e40 (beyond float: +-inf) and NaN (+inf and -inf products
 * in one dot product) where the keys say so. out (H, HD) and, if w, weights (H, past + 1). */
static void overflow_step(const attn_model *m, attn_workspace *ws, int32_t past, float k_past,
                          float k_new0, float k_new1, float *out, float *w) {
    attn_kv_pool *pool = NULL;
    ck_assert_int_eq(attn_kv_pool_create_typed(m, 8 << 20, 64, ATTN_DTYPE_F32, &pool), ATTN_OK);
    attn_kv *kv = NULL;
    ck_assert_int_eq(attn_kv_create_for_layer(pool, 0, &kv), ATTN_OK);
    enum { CHUNK = 16 };
    float *q = harness_calloc((size_t)H * CHUNK * HD, sizeof(float));
    float *k = harness_calloc((size_t)HK * CHUNK * HD, sizeof(float));
    float *v = harness_calloc((size_t)HK * CHUNK * HD, sizeof(float));
    float *o = harness_calloc((size_t)H * CHUNK * HD, sizeof(float));
    for (int32_t done = 0; done < past; done += CHUNK) {
        int32_t n = past - done < CHUNK ? past - done : CHUNK;
        for (int32_t i = 0; i < HK * n; i++) {
            k[(size_t)i * HD] = k_past;
            v[(size_t)i * HD + 1] = 1.0f;
        }
        attn_qkv_step st = {.kv = kv, .n_tokens = n, .q = q, .k = k, .v = v, .out = o};
        ck_assert_int_eq(attn_forward_qkv(m, 0, ws, &st, 1), ATTN_OK);
    }
    memset(k, 0, (size_t)HK * HD * sizeof(float));
    memset(v, 0, (size_t)HK * HD * sizeof(float));
    for (int32_t h = 0; h < HK; h++) {
        k[(size_t)h * HD] = k_new0;
        k[(size_t)h * HD + 1] = k_new1;
        v[(size_t)h * HD + 2] = 5.0f;
    }
    for (int32_t h = 0; h < H; h++) {
        q[(size_t)h * HD] = -1e20f;
        q[(size_t)h * HD + 1] = 1e20f;
    }
    attn_qkv_step st = {.kv = kv, .n_tokens = 1, .q = q, .k = k, .v = v, .out = out, .weights = w};
    ck_assert_int_eq(attn_forward_qkv(m, 0, ws, &st, 1), ATTN_OK);
    free(q);
    free(k);
    free(v);
    free(o);
    attn_kv_destroy(kv);
    attn_kv_pool_destroy(pool);
}

/* Scores that overflow float are not a masked row and never a guess: where every key's score is
 * -inf, where any is +inf (which of them is largest is lost) or NaN, the answer is NaN (null to a
 * client), never the zero row a query that sees no key gets, nor an even split among the +inf
 * keys; where one key's score is finite and the rest -inf, it takes all the weight, exactly.
 * Short (one task) and long (split across the executor's threads, then merged), tiled and
 * materialized. */
START_TEST(test_qkv_overflowed_scores) {
    attn_config c = geometry(0);
    c.max_seq = 4096;
    attn_model *m = NULL;
    ck_assert_int_eq(attn_model_create_geometry(&c, NULL, &m), ATTN_OK);
    harness_threads state;
    attn_executor ex = harness_thread_executor(&state);
    attn_workspace *ws = NULL;
    ck_assert_int_eq(attn_workspace_create(m, 16, &ex, &ws), ATTN_OK);
    static const struct {
        float k_past, k_new0, k_new1;
        bool is_nan; /* else one-hot on the new key */
        const char *what;
    } cases[] = {
        {1e20f, 1e20f, 0.0f, true, "every score -inf"},
        {1e20f, 0.0f, 0.0f, false, "-inf beside one finite"},
        {-1e20f, 0.0f, 0.0f, true, "many +inf"},
        {0.0f, -1e20f, 0.0f, true, "one +inf"},
        {0.0f, 1e20f, 1e20f, true, "one NaN"},
    };
    /* 24 and 2304 keys fill whole vectors (and 64-token blocks), 21 leaves a scalar tail */
    static const int32_t pasts[] = {20, 23, 2303};
    for (size_t i = 0; i < sizeof pasts / sizeof pasts[0]; i++) {
        int32_t past = pasts[i];
        float out[H * HD];
        float *w = harness_calloc((size_t)H * (past + 1), sizeof(float));
        for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
            for (int with_weights = 0; with_weights < 2; with_weights++) {
                overflow_step(m, ws, past, cases[k].k_past, cases[k].k_new0, cases[k].k_new1, out,
                              with_weights ? w : NULL);
                for (int32_t h = 0; h < H; h++) {
                    for (int32_t e = 0; e < HD; e++) {
                        float got = out[h * HD + e];
                        ck_assert_msg(cases[k].is_nan ? isnan(got) : got == (e == 2 ? 5.0f : 0.0f),
                                      "%s, past %d, weights %d: out[%d][%d] = %g", cases[k].what,
                                      (int)past, with_weights, (int)h, (int)e, (double)got);
                    }
                    for (int32_t j = 0; with_weights && j <= past; j++) {
                        float got = w[(size_t)h * (past + 1) + j];
                        ck_assert_msg(cases[k].is_nan ? isnan(got)
                                                      : got == (j == past ? 1.0f : 0.0f),
                                      "%s, past %d: weight [%d][%d] = %g", cases[k].what, (int)past,
                                      (int)h, (int)j, (double)got);
                    }
                }
            }
        }
        free(w);
    }
    attn_workspace_destroy(ws);
    attn_model_destroy(m);
}
END_TEST

/* Three caches in one call, at different lengths, with weights for one: as each alone. */
START_TEST(test_qkv_batch_equals_alone) {
    attn_config c = geometry(0);
    attn_model *m = NULL;
    ck_assert_int_eq(attn_model_create_geometry(&c, NULL, &m), ATTN_OK);
    attn_kv_pool *pool = NULL;
    attn_workspace *ws = NULL;
    ck_assert_int_eq(attn_kv_pool_create_typed(m, 1 << 20, 16, ATTN_DTYPE_F32, &pool), ATTN_OK);
    ck_assert_int_eq(attn_workspace_create(m, 64, NULL, &ws), ATTN_OK);
    float *q = random_heads(930, H), *k = random_heads(931, HK), *v = random_heads(932, HK);
    static const int32_t past[3] = {0, 7, 20};
    attn_kv *batch[3], *alone[3];
    attn_qkv_step steps[3];
    float *out_b[3], *out_a[3], *w_b = harness_calloc((size_t)H * 2 * 22, sizeof(float));
    float *w_a = harness_calloc((size_t)H * 2 * 22, sizeof(float));
    for (int i = 0; i < 3; i++) {
        ck_assert_int_eq(attn_kv_create_for_layer(pool, 1, &batch[i]), ATTN_OK);
        ck_assert_int_eq(attn_kv_create_for_layer(pool, 1, &alone[i]), ATTN_OK);
        if (past[i] > 0) {
            float *o = harness_calloc((size_t)H * past[i] * HD, sizeof(float));
            float *qs = slice(q, H, 0, past[i]), *ks = slice(k, HK, 0, past[i]),
                  *vs = slice(v, HK, 0, past[i]);
            attn_qkv_step p = {.n_tokens = past[i], .q = qs, .k = ks, .v = vs, .out = o};
            p.kv = batch[i];
            ck_assert_int_eq(attn_forward_qkv(m, 1, ws, &p, 1), ATTN_OK);
            p.kv = alone[i];
            ck_assert_int_eq(attn_forward_qkv(m, 1, ws, &p, 1), ATTN_OK);
            free(o);
            free(qs);
            free(ks);
            free(vs);
        }
    }
    float *qs = slice(q, H, 20, 2), *ks = slice(k, HK, 20, 2), *vs = slice(v, HK, 20, 2);
    for (int i = 0; i < 3; i++) {
        out_b[i] = harness_calloc((size_t)H * 2 * HD, sizeof(float));
        out_a[i] = harness_calloc((size_t)H * 2 * HD, sizeof(float));
        steps[i] = (attn_qkv_step){.kv = batch[i],
                                   .n_tokens = 2,
                                   .q = qs,
                                   .k = ks,
                                   .v = vs,
                                   .rope = true,
                                   .out = out_b[i],
                                   .weights = i == 2 ? w_b : NULL};
    }
    ck_assert_int_eq(attn_forward_qkv(m, 1, ws, steps, 3), ATTN_OK);
    for (int i = 0; i < 3; i++) {
        attn_qkv_step st = steps[i];
        st.kv = alone[i];
        st.out = out_a[i];
        st.weights = i == 2 ? w_a : NULL;
        ck_assert_int_eq(attn_forward_qkv(m, 1, ws, &st, 1), ATTN_OK);
        harness_expect_close_tol(out_b[i], out_a[i], (size_t)H * 2 * HD, 1e-6, 1e-6, "batched");
        ck_assert_int_eq(attn_kv_len(batch[i]), past[i] + 2);
        free(out_b[i]);
        free(out_a[i]);
        attn_kv_destroy(batch[i]);
        attn_kv_destroy(alone[i]);
    }
    harness_expect_close_tol(w_b, w_a, (size_t)H * 2 * 22, 1e-6, 1e-6, "weights");
    /* each weights row is a distribution over the 22 keys */
    for (int32_t r = 0; r < H * 2; r++) {
        double sum = 0;
        for (int32_t j = 0; j < 22; j++) {
            sum += w_b[r * 22 + j];
        }
        ck_assert_msg(fabs(sum - 1.0) < 1e-5, "row %d sums to %g", (int)r, sum);
    }
    free(qs);
    free(ks);
    free(vs);
    free(w_a);
    free(w_b);
    free(q);
    free(k);
    free(v);
    attn_workspace_destroy(ws);
    attn_kv_pool_destroy(pool);
    attn_model_destroy(m);
}
END_TEST

START_TEST(test_qkv_refusals) {
    attn_config c = geometry(0);
    c.layer_kind[1] = ATTN_LAYER_LINEAR;
    attn_model *m = NULL;
    ck_assert_int_eq(attn_model_create_geometry(&c, NULL, &m), ATTN_OK);
    attn_kv_pool *pool = NULL;
    attn_workspace *ws = NULL;
    ck_assert_int_eq(attn_kv_pool_create_typed(m, 1 << 20, 32, ATTN_DTYPE_F32, &pool), ATTN_OK);
    ck_assert_int_eq(attn_workspace_create(m, 16, NULL, &ws), ATTN_OK);
    attn_kv *kv = NULL;
    ck_assert_int_eq(attn_kv_create_for_layer(pool, 0, &kv), ATTN_OK);
    float q[H * HD] = {0}, k[HK * HD] = {0}, v[HK * HD] = {0}, out[H * HD], x[H * HD] = {0};
    attn_qkv_step st = {.kv = kv, .n_tokens = 1, .q = q, .k = k, .v = v, .out = out};
    /* a linear layer, a layer not loaded, a NULL tensor */
    ck_assert_int_eq(attn_forward_qkv(m, 1, ws, &st, 1), ATTN_EUNSUPPORTED);
    ck_assert_int_eq(attn_forward_qkv(m, 2, ws, &st, 1), ATTN_EINVAL);
    st.k = NULL;
    ck_assert_int_eq(attn_forward_qkv(m, 0, ws, &st, 1), ATTN_EINVAL);
    st.k = k;
    /* no weights: attn_forward refuses; nothing changed */
    attn_step fs = {.kv = kv, .x = x, .n_tokens = 1, .out = out};
    ck_assert_int_eq(attn_forward(m, 0, ws, &fs, 1), ATTN_EUNSUPPORTED);
    ck_assert_int_eq(attn_kv_len(kv), 0);
    ck_assert_int_eq(attn_forward_qkv(m, 0, ws, &st, 1), ATTN_OK);
    ck_assert_int_eq(attn_kv_len(kv), 1);
    attn_kv_destroy(kv);
    attn_workspace_destroy(ws);
    attn_kv_pool_destroy(pool);
    attn_model_destroy(m);
    /* a latent has no per-head K/V to bring */
    attn_config mla = geometry(0);
    mla.kv_lora_rank = 32;
    mla.qk_rope_head_dim = 8;
    mla.qk_nope_head_dim = 16;
    mla.v_head_dim = 16;
    ck_assert_int_eq(attn_model_create_geometry(&mla, NULL, &m), ATTN_EUNSUPPORTED);
}
END_TEST

extern Suite *qkv_suite(void);

Suite *qkv_suite(void) {
    Suite *s = suite_create("qkv");
    TCase *tc = tcase_create("qkv");
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, test_qkv_matches_ref);
    tcase_add_test(tc, test_qkv_batch_equals_alone);
    tcase_add_test(tc, test_qkv_overflowed_scores);
    tcase_add_test(tc, test_qkv_refusals);
    suite_add_tcase(s, tc);
    return s;
}
