/* tests/check_attend.c: the layer forward (attn_forward on one cache) against tests/ref.c.
 * Every scenario feeds one random sequence to three caches: in the scenario's chunks asking for
 * weights (materialized path), in the same chunks without weights (tiled online-softmax path), and
 * in one pass. All three must match ref's output rows, the weights must match ref's probabilities
 * (rows summing to 1, or all zero when fully masked), and the cache must hold ref's post-RoPE K/V.
 * Tolerances: HARNESS_ATOL/RTOL (check_harness.h) against ref; the paths and the chunkings against
 * each other within 1e-5 absolute + 1e-5 relative. Batches are in check_batch.c, the KV cache's own
 * operations in check_kv.c. */
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../engine/attn_int.h"
#include "check_harness.h"
#include "ref.h"

/* Engine vs engine (paths, chunkings): the same float arithmetic up to summation order. */
#define SAME_ATOL 1e-5
#define SAME_RTOL 1e-5

typedef struct scenario {
    attn_config cfg;
    int32_t n_tokens;
    const int32_t *chunks; /* the calls' token counts, summing to n_tokens */
    int32_t n_chunks;
    const int32_t *positions; /* NULL = cache index */
    const uint8_t *key_valid; /* NULL = every key valid */
    int32_t ws_tokens;        /* workspace max_tokens */
    int32_t block_tokens;     /* the pool's block size */
    const attn_executor *ex;  /* NULL = none */
    uint64_t seed;
} scenario;

static scenario scenario_default(const attn_config *cfg, int32_t n_tokens, const int32_t *chunks,
                                 int32_t n_chunks) {
    scenario sc;
    memset(&sc, 0, sizeof(sc));
    sc.cfg = *cfg;
    sc.n_tokens = n_tokens;
    sc.chunks = chunks;
    sc.n_chunks = n_chunks;
    sc.ws_tokens = 512;
    sc.block_tokens = 16;
    sc.seed = 42;
    return sc;
}

/* Enough blocks for `caches` caches of n tokens each. */
static size_t pool_budget(const attn_config *cfg, int32_t block_tokens, int32_t n, int caches) {
    size_t block = 2 * (size_t)cfg->n_kv_heads * block_tokens * ref_head_dim(cfg) * sizeof(float);
    size_t blocks = (size_t)(n + block_tokens - 1) / block_tokens;
    return block * (blocks * caches + 1);
}

/* Each weight row with a visible key sums to 1 (with sinks: to the reference's sum, below 1); a
 * row ref says is fully masked is all zeros. */
static void expect_rows_normalized(const float *w, const float *w_ref, int32_t n_heads, int32_t n,
                                   bool has_sinks, const char *what) {
    for (int32_t h = 0; h < n_heads; h++) {
        for (int32_t i = 0; i < n; i++) {
            const float *row = w + ((size_t)h * n + i) * n;
            const float *row_ref = w_ref + ((size_t)h * n + i) * n;
            double sum = 0.0;
            double sum_ref = 0.0;
            for (int32_t j = 0; j < n; j++) {
                sum += row[j];
                sum_ref += row_ref[j];
            }
            if (sum_ref == 0.0) {
                char label[600];
                snprintf(label, sizeof(label), "%s: fully masked row (head %d, query %d)", what,
                         (int)h, (int)i);
                harness_expect_zero(row, (size_t)n, label);
            } else if (has_sinks) {
                /* the sink takes a share (small over a long context: 1e-3 over 2155 keys) */
                ck_assert_msg(fabs(sum - sum_ref) < 1e-5 && sum_ref < 1.0 - 1e-6,
                              "%s: head %d query %d sums to %.9g, ref %.9g", what, (int)h, (int)i,
                              sum, sum_ref);
            } else {
                ck_assert_msg(fabs(sum - 1.0) < 1e-5, "%s: head %d query %d sums to %.9g", what,
                              (int)h, (int)i, sum);
                ck_assert_float_eq_tol((float)sum, 1.0f, 1e-5f);
            }
        }
    }
}

static void check_scenario(const scenario *sc) {
    const attn_config *cfg = &sc->cfg;
    const int32_t n = sc->n_tokens;
    const int32_t hidden = cfg->hidden_size;
    const size_t out_count = (size_t)n * hidden;
    const size_t w_count = (size_t)cfg->n_heads * n * n;
    const size_t kv_count = (size_t)cfg->n_kv_heads * n * ref_head_dim(cfg);
    char desc[256];
    char what[512];
    harness_model hm;
    attn_kv_pool *pool = NULL;
    attn_workspace *ws = NULL;
    attn_kv *kv[3] = {NULL, NULL, NULL};

    harness_describe(cfg, desc, sizeof(desc));
    harness_model_init(&hm, cfg, sc->seed);
    float *x = harness_random_x(sc->seed, n, hidden);
    float *out_ref = harness_calloc(out_count, sizeof(float));
    float *w_ref = harness_calloc(w_count, sizeof(float));
    float *k_ref = harness_calloc(kv_count, sizeof(float));
    float *v_ref = harness_calloc(kv_count, sizeof(float));
    harness_ref_run(&hm, 0, x, sc->positions, sc->key_valid, n, out_ref, w_ref, k_ref, v_ref);

    ck_assert_int_eq(attn_kv_pool_create(hm.model, pool_budget(cfg, sc->block_tokens, n, 3),
                                         sc->block_tokens, &pool),
                     ATTN_OK);
    ck_assert_int_eq(attn_workspace_create(hm.model, sc->ws_tokens, sc->ex, &ws), ATTN_OK);
    float *out[3];
    float *w = harness_calloc(w_count, sizeof(float));
    int32_t one_pass[1] = {n};
    for (int c = 0; c < 3; c++) {
        out[c] = harness_calloc(out_count, sizeof(float));
        ck_assert_int_eq(attn_kv_create(pool, &kv[c]), ATTN_OK);
        harness_run r = {hm.model,
                         0,
                         ws,
                         kv[c],
                         x,
                         sc->positions,
                         sc->key_valid,
                         n,
                         0,
                         c == 2 ? one_pass : sc->chunks,
                         c == 2 ? 1 : sc->n_chunks,
                         out[c],
                         c == 0 ? w : NULL};
        int rc = harness_run_chunks(&r);
        ck_assert_msg(rc == ATTN_OK, "%s: forward (run %d) = %d (%s)", desc, c, rc,
                      attn_strerror(rc));
    }

    static const char *const runs[3] = {"chunks with weights", "chunks, tiled", "one pass"};
    for (int c = 0; c < 3; c++) {
        snprintf(what, sizeof(what), "%s: out (%s) vs ref", desc, runs[c]);
        harness_expect_close(out[c], out_ref, out_count, what);
        snprintf(what, sizeof(what), "%s: cache (%s) vs ref", desc, runs[c]);
        harness_expect_kv(kv[c], cfg, k_ref, v_ref, n, what);
    }
    snprintf(what, sizeof(what), "%s: tiled path vs materialized path", desc);
    harness_expect_close_tol(out[1], out[0], out_count, SAME_ATOL, SAME_RTOL, what);
    snprintf(what, sizeof(what), "%s: chunked vs one pass", desc);
    harness_expect_close_tol(out[1], out[2], out_count, SAME_ATOL, SAME_RTOL, what);
    snprintf(what, sizeof(what), "%s: weights vs ref", desc);
    harness_expect_weight_rows(w, w_ref, cfg->n_heads, 0, n, what);
    expect_rows_normalized(w, w_ref, cfg->n_heads, n, cfg->has_sinks, what);

    for (int c = 0; c < 3; c++) {
        attn_kv_destroy(kv[c]);
        free(out[c]);
    }
    ck_assert_int_eq(attn_kv_pool_blocks_free(pool), attn_kv_pool_blocks_total(pool));
    free(w);
    attn_workspace_destroy(ws);
    attn_kv_pool_destroy(pool);
    free(v_ref);
    free(k_ref);
    free(w_ref);
    free(out_ref);
    free(x);
    harness_model_release(&hm);
}

/* ---- geometry ------------------------------------------------------------------------------ */

/* MHA, GQA and MQA (8 query heads over 8, 4, 2, 1 kv heads) at head_dim 32, 64, 80 and 128, with
 * an odd number of tokens crossing block boundaries, prefilled in uneven chunks. */
START_TEST(test_attend_gqa_ratios_and_head_dims) {
    static const int32_t kv_heads[] = {8, 4, 2, 1};
    static const int32_t head_dims[] = {32, 64, 80, 128};
    static const int32_t chunks[] = {13, 5, 1, 1, 3};
    for (int r = 0; r < 4; r++) {
        for (int d = 0; d < 4; d++) {
            attn_config cfg = harness_config(8, kv_heads[r], head_dims[d]);
            scenario sc = scenario_default(&cfg, 23, chunks, 5);
            sc.seed = (uint64_t)(100 + 10 * r + d);
            check_scenario(&sc);
        }
    }
}
END_TEST

/* A long cached past (P = 300) then an odd chunk and single-token decodes: P = 0 is covered by
 * every other test; this one makes the tiled path run over many key tiles. */
START_TEST(test_attend_large_past_then_decode) {
    static const int32_t chunks[] = {300, 7, 1, 1, 1};
    static const int32_t shapes[][3] = {{8, 2, 64}, {4, 4, 80}, {8, 1, 128}};
    for (int s = 0; s < 3; s++) {
        attn_config cfg = harness_config(shapes[s][0], shapes[s][1], shapes[s][2]);
        scenario sc = scenario_default(&cfg, 310, chunks, 5);
        sc.seed = (uint64_t)(200 + s);
        check_scenario(&sc);
    }
}
END_TEST

/* Prefill then decode of single tokens equals one pass over all tokens, for configs mixing
 * every option (check_scenario compares the chunked runs with the one-pass run). */
START_TEST(test_attend_prefill_then_decode_equals_one_pass) {
    static const int32_t chunks[] = {9, 1, 1, 1, 1, 1, 1, 1};
    for (int variant = 0; variant < 6; variant++) {
        attn_config cfg = harness_config(8, 2, 32);
        cfg.rope_style = variant % 2 ? ATTN_ROPE_STYLE_INTERLEAVED : ATTN_ROPE_STYLE_HALF;
        cfg.sliding_window = variant >= 2 ? 5 : 0;
        cfg.rotary_dim = variant >= 4 ? 16 : 32;
        cfg.has_qkv_bias = variant != 3;
        cfg.has_o_bias = variant != 4;
        scenario sc = scenario_default(&cfg, 16, chunks, 8);
        sc.seed = (uint64_t)(300 + variant);
        check_scenario(&sc);
    }
}
END_TEST

/* Learned sinks (gpt-oss): one more logit per query head in every softmax denominator, in both
 * paths (weights, online softmax) and both kernels (decode dot products, prefill tiles), with a
 * window, GQA and MHA, a padding mask that leaves rows with no key, and a long prefill. */
START_TEST(test_attend_sinks) {
    static const int32_t chunks[] = {9, 1, 1, 1, 1, 1, 1, 1};
    static const uint8_t valid[16] = {0, 0, 1, 1, 1, 0, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1};
    for (int variant = 0; variant < 4; variant++) {
        attn_config cfg = harness_config(8, variant == 1 ? 8 : 2, 32);
        cfg.has_sinks = true;
        cfg.sliding_window = variant == 2 ? 4 : 0;
        scenario sc = scenario_default(&cfg, 16, chunks, 8);
        sc.key_valid = variant == 3 ? valid : NULL;
        sc.seed = (uint64_t)(330 + variant);
        check_scenario(&sc);
    }
    static const int32_t long_chunks[] = {150, 1, 1};
    attn_config cfg = harness_config(8, 2, 64);
    cfg.has_sinks = true;
    cfg.sliding_window = 37;
    scenario sc = scenario_default(&cfg, 152, long_chunks, 3);
    sc.seed = 339;
    check_scenario(&sc);
}
END_TEST

/* ---- masks --------------------------------------------------------------------------------- */

/* Sliding windows of 1 (only itself), 3, 8 and 16 keys (HF Mistral: i - j < W), across chunks
 * so that the window crosses chunk and block boundaries. */
START_TEST(test_attend_sliding_window) {
    static const int32_t windows[] = {1, 3, 8, 16};
    static const int32_t chunks[] = {5, 1, 9, 1, 5};
    for (int i = 0; i < 4; i++) {
        attn_config cfg = harness_config(4, 2, 32);
        cfg.sliding_window = windows[i];
        scenario sc = scenario_default(&cfg, 21, chunks, 5);
        sc.seed = (uint64_t)(400 + i);
        check_scenario(&sc);
    }
    /* A long window-limited context: the tiled path must skip whole tiles correctly. */
    static const int32_t long_chunks[] = {150, 1, 1};
    attn_config cfg = harness_config(8, 2, 64);
    cfg.sliding_window = 37;
    scenario sc = scenario_default(&cfg, 152, long_chunks, 3);
    check_scenario(&sc);
}
END_TEST

/* Padding: left padding (keys 0..2 invalid, so queries 0..2 see nothing at all) and holes later
 * on; also combined with a window. */
START_TEST(test_attend_padding_mask) {
    static const int32_t chunks[] = {5, 4, 1, 3};
    uint8_t valid[13];
    for (int i = 0; i < 13; i++) {
        valid[i] = !(i < 3 || i == 6 || i == 9);
    }
    for (int variant = 0; variant < 3; variant++) {
        attn_config cfg = harness_config(8, 4, 32);
        cfg.sliding_window = variant == 2 ? 4 : 0;
        cfg.has_o_bias = variant == 1;
        scenario sc = scenario_default(&cfg, 13, chunks, 4);
        sc.key_valid = valid;
        sc.seed = (uint64_t)(500 + variant);
        check_scenario(&sc);
    }
}
END_TEST

/* A fully masked row gives zero attention, not NaN. With an output bias its output row is bo
 * (0 Wo^T + bo), which check_scenario compares with ref; here, without one, the row must be
 * exactly 0 on both paths, and its weights exactly 0. */
START_TEST(test_attend_fully_masked_rows_are_zero) {
    attn_config cfg = harness_config(4, 2, 16);
    cfg.has_o_bias = false;
    harness_model hm;
    attn_kv_pool *pool = NULL;
    attn_workspace *ws = NULL;
    harness_model_init(&hm, &cfg, 7);
    ck_assert_int_eq(attn_kv_pool_create(hm.model, pool_budget(&cfg, 16, 8, 2), 16, &pool),
                     ATTN_OK);
    ck_assert_int_eq(attn_workspace_create(hm.model, 8, NULL, &ws), ATTN_OK);
    float *x = harness_random_x(7, 6, cfg.hidden_size);
    uint8_t valid[6] = {0, 0, 1, 1, 0, 1};
    for (int path = 0; path < 2; path++) {
        attn_kv *kv = NULL;
        float out[6 * 64];
        float w[4 * 6 * 6];
        for (size_t i = 0; i < sizeof(w) / sizeof(w[0]); i++) {
            w[i] = NAN;
        }
        ck_assert_int_eq(attn_kv_create(pool, &kv), ATTN_OK);
        attn_step step = {kv,   x,    6, NULL, valid, out, path == 0 ? w : NULL,
                          NULL, NULL, 0, NULL, NULL,  0};
        ck_assert_int_eq(attn_forward(hm.model, 0, ws, &step, 1), ATTN_OK);
        harness_expect_zero(out, 2 * 64, path == 0 ? "rows 0-1, materialized" : "rows 0-1, tiled");
        for (int i = 2; i < 6 * 64; i++) {
            ck_assert_msg(isfinite(out[i]), "out[%d] = %g", i, (double)out[i]);
        }
        if (path == 0) {
            for (int h = 0; h < 4; h++) {
                harness_expect_zero(w + (size_t)h * 36, 12, "weights of rows 0-1");
                /* Row 4 sees keys 2, 3 and itself masked: weight 0 on key 4 and on 0, 1. */
                ck_assert_float_eq(w[h * 36 + 4 * 6 + 4], 0.0f);
                ck_assert_float_eq(w[h * 36 + 4 * 6 + 0], 0.0f);
                ck_assert_float_eq_tol(w[h * 36 + 4 * 6 + 2] + w[h * 36 + 4 * 6 + 3], 1.0f, 1e-6f);
            }
        }
        attn_kv_destroy(kv);
    }
    free(x);
    attn_workspace_destroy(ws);
    attn_kv_pool_destroy(pool);
    harness_model_release(&hm);
}
END_TEST

/* ---- RoPE ---------------------------------------------------------------------------------- */

/* Both styles x full, partial and no rotary x no, linear and llama3 scaling, at scattered
 * explicit positions (not the cache index, not monotonic). */
START_TEST(test_attend_rope_variants) {
    static const int32_t chunks[] = {4, 1, 4};
    static const int32_t positions[9] = {0, 1, 2, 50, 51, 33, 300, 301, 511};
    static const int32_t rotary[] = {32, 12, -1};
    for (int style = 0; style < 2; style++) {
        for (int rd = 0; rd < 3; rd++) {
            for (int scaling = 0; scaling < 3; scaling++) {
                attn_config cfg = harness_config(4, 2, 32);
                cfg.rope_style = style ? ATTN_ROPE_STYLE_INTERLEAVED : ATTN_ROPE_STYLE_HALF;
                cfg.rotary_dim = rotary[rd];
                cfg.rope_scaling.type = (attn_rope_scaling_type)scaling;
                cfg.rope_scaling.factor = scaling == 1 ? 4.0f : 8.0f;
                if (scaling == 2) {
                    /* Original context 32 puts the 16 frequencies of rotary 32 in all three
                     * llama3 regimes (wavelengths 6.3 .. 2e4 around 8 and 32). */
                    cfg.rope_scaling.low_freq_factor = 1.0f;
                    cfg.rope_scaling.high_freq_factor = 4.0f;
                    cfg.rope_scaling.original_max_position = 32;
                }
                scenario sc = scenario_default(&cfg, 9, chunks, 3);
                sc.positions = positions;
                sc.seed = (uint64_t)(600 + 9 * style + 3 * rd + scaling);
                check_scenario(&sc);
            }
        }
    }
}
END_TEST

/* Llama-3.1-like RoPE (theta 500000, llama3 scaling) at positions up to max_seq - 1 = 8191:
 * angles of ~8000 radians lose ~5e-4 rad if computed in float, which this test would see. */
START_TEST(test_attend_rope_large_positions) {
    static const int32_t chunks[] = {3, 1, 1};
    static const int32_t positions[5] = {8191, 4097, 8000, 6001, 8190};
    attn_config cfg = harness_config(4, 1, 128);
    cfg.max_seq = 8192;
    cfg.rope_theta = 500000.0f;
    cfg.rope_scaling = harness_llama3_scaling(8192);
    scenario sc = scenario_default(&cfg, 5, chunks, 3);
    sc.positions = positions;
    check_scenario(&sc);
    cfg.rope_scaling.type = ATTN_ROPE_SCALING_NONE;
    cfg.rope_theta = 10000.0f;
    sc = scenario_default(&cfg, 5, chunks, 3);
    sc.positions = positions;
    check_scenario(&sc);
}
END_TEST

/* ---- biases, scale, defaults --------------------------------------------------------------- */

START_TEST(test_attend_bias_combinations) {
    static const int32_t chunks[] = {6, 1};
    for (int qkv = 0; qkv < 2; qkv++) {
        for (int o = 0; o < 2; o++) {
            attn_config cfg = harness_config(4, 2, 32);
            cfg.has_qkv_bias = qkv;
            cfg.has_o_bias = o;
            scenario sc = scenario_default(&cfg, 7, chunks, 2);
            sc.seed = (uint64_t)(700 + 2 * qkv + o);
            check_scenario(&sc);
        }
    }
}
END_TEST

START_TEST(test_attend_custom_softmax_scale) {
    static const int32_t chunks[] = {6, 1};
    attn_config cfg = harness_config(4, 2, 32);
    cfg.softmax_scale = 0.5f; /* sharper than 1/sqrt(32) */
    scenario sc = scenario_default(&cfg, 7, chunks, 2);
    check_scenario(&sc);
}
END_TEST

/* A config with every defaultable field left 0 (head_dim, rotary_dim, rope_theta,
 * softmax_scale): the model reports the filled-in values and computes what ref computes from
 * the defaults documented in attn.h. Hidden 96 with 6 heads gives head_dim 16. */
START_TEST(test_attend_config_defaults) {
    static const int32_t chunks[] = {5, 1};
    attn_config cfg = harness_config(6, 3, 0);
    cfg.hidden_size = 96;
    cfg.rotary_dim = 0;
    cfg.rope_theta = 0.0f;
    cfg.softmax_scale = 0.0f;
    scenario sc = scenario_default(&cfg, 6, chunks, 2);
    check_scenario(&sc);

    harness_model hm;
    harness_model_init(&hm, &cfg, 1);
    const attn_config *got = attn_model_config(hm.model);
    ck_assert_int_eq(got->head_dim, 16);
    ck_assert_int_eq(got->rotary_dim, 16);
    ck_assert_float_eq(got->rope_theta, 10000.0f);
    ck_assert_float_eq_tol(got->softmax_scale, 0.25f, 1e-7f);
    harness_model_release(&hm);

    /* An odd head_dim has no default RoPE to give (rotate_half pairs i with i + D/2): refused,
     * not rotated on D - 1 dims; without RoPE it is served. */
    attn_config odd = harness_config(2, 1, 17);
    odd.rotary_dim = 0;
    const char *why = NULL;
    ck_assert_int_eq(attn__config_check_why(&odd, &why), ATTN_ESHAPE);
    ck_assert_ptr_nonnull(why);
    odd.rotary_dim = -1;
    ck_assert_int_eq(attn__config_check_why(&odd, &why), ATTN_OK);
}
END_TEST

/* ---- positions and capacity ---------------------------------------------------------------- */

/* Explicit positions 0 and max_seq - 1 are valid and match ref; filling the cache to exactly
 * max_seq tokens works; position max_seq, a negative position and one token past capacity are
 * ATTN_ERANGE and leave the cache as it was. */
START_TEST(test_attend_positions_and_capacity) {
    attn_config cfg = harness_config(4, 2, 16);
    cfg.max_seq = 40;
    static const int32_t edge_chunks[] = {1, 1};
    static const int32_t edge_positions[2] = {39, 0};
    scenario sc = scenario_default(&cfg, 2, edge_chunks, 2);
    sc.positions = edge_positions;
    check_scenario(&sc);
    static const int32_t full_chunks[] = {33, 6, 1}; /* ends at length max_seq */
    sc = scenario_default(&cfg, 40, full_chunks, 3);
    check_scenario(&sc);

    harness_model hm;
    attn_kv_pool *pool = NULL;
    attn_workspace *ws = NULL;
    attn_kv *kv = NULL;
    harness_model_init(&hm, &cfg, 3);
    ck_assert_int_eq(attn_kv_pool_create(hm.model, pool_budget(&cfg, 16, 48, 1), 16, &pool),
                     ATTN_OK);
    ck_assert_int_eq(attn_workspace_create(hm.model, 64, NULL, &ws), ATTN_OK);
    ck_assert_int_eq(attn_kv_create(pool, &kv), ATTN_OK);
    float *x = harness_random_x(3, 41, cfg.hidden_size);
    float *out = harness_calloc((size_t)41 * cfg.hidden_size, sizeof(float));
    int32_t bad_pos[2][1] = {{40}, {-1}};
    for (int b = 0; b < 2; b++) {
        attn_step step = {kv, x, 1, bad_pos[b], NULL, out, NULL, NULL, NULL, 0, NULL, NULL, 0};
        ck_assert_int_eq(attn_forward(hm.model, 0, ws, &step, 1), ATTN_ERANGE);
        ck_assert_int_eq(attn_kv_len(kv), 0);
    }
    attn_step fill = {kv, x, 38, NULL, NULL, out, NULL, NULL, NULL, 0, NULL, NULL, 0};
    ck_assert_int_eq(attn_forward(hm.model, 0, ws, &fill, 1), ATTN_OK);
    attn_step over = {kv,   x,    3, NULL, NULL, out, NULL,
                      NULL, NULL, 0, NULL, NULL, 0}; /* 38 + 3 > 40 */
    ck_assert_int_eq(attn_forward(hm.model, 0, ws, &over, 1), ATTN_ERANGE);
    ck_assert_int_eq(attn_kv_len(kv), 38);
    attn_step last = {kv,   x,    2, NULL, NULL, out, NULL,
                      NULL, NULL, 0, NULL, NULL, 0}; /* exactly to 40 */
    ck_assert_int_eq(attn_forward(hm.model, 0, ws, &last, 1), ATTN_OK);
    ck_assert_int_eq(attn_kv_len(kv), 40);
    attn_step past = {kv, x, 1, NULL, NULL, out, NULL, NULL, NULL, 0, NULL, NULL, 0};
    ck_assert_int_eq(attn_forward(hm.model, 0, ws, &past, 1), ATTN_ERANGE);
    ck_assert_int_eq(attn_kv_len(kv), 40);
    free(out);
    free(x);
    attn_kv_destroy(kv);
    attn_workspace_destroy(ws);
    attn_kv_pool_destroy(pool);
    harness_model_release(&hm);
}
END_TEST

/* ---- workspace and executors --------------------------------------------------------------- */

/* A workspace of 4 tokens serves a 23-token prefill (and a 7-token chunk after it) by chunking
 * inside attn_forward, with weights too. */
START_TEST(test_attend_chunked_prefill_small_workspace) {
    static const int32_t chunks[] = {23, 7, 1};
    for (int variant = 0; variant < 2; variant++) {
        attn_config cfg = harness_config(8, 2, 32);
        cfg.sliding_window = variant ? 6 : 0;
        scenario sc = scenario_default(&cfg, 31, chunks, 3);
        sc.ws_tokens = variant ? 1 : 4;
        sc.seed = (uint64_t)(800 + variant);
        check_scenario(&sc);
    }
}
END_TEST

START_TEST(test_attend_serial_executor) {
    static const int32_t chunks[] = {40, 1};
    harness_serial state;
    attn_executor ex = harness_serial_executor(&state);
    attn_config cfg = harness_config(8, 4, 32);
    scenario sc = scenario_default(&cfg, 41, chunks, 2);
    sc.ex = &ex;
    check_scenario(&sc);
    ck_assert_msg(state.n_runs > 0, "the engine never used the executor it was given");
    ck_assert_int_gt(state.n_tasks, 0);
}
END_TEST

START_TEST(test_attend_thread_executor) {
    static const int32_t chunks[] = {70, 3, 1};
    harness_threads state;
    attn_executor ex = harness_thread_executor(&state);
    attn_config cfg = harness_config(8, 2, 64);
    cfg.sliding_window = 50;
    scenario sc = scenario_default(&cfg, 74, chunks, 3);
    sc.ex = &ex;
    check_scenario(&sc);
    ck_assert_msg(state.n_runs > 0, "the engine never used the executor it was given");
    ck_assert_msg(state.n_tasks_other > 0, "no task ran on the second thread");
}
END_TEST

/* Split-K: decode steps over more than 2 x 1024 keys with an executor have each task's keys cut
 * in ranges merged by their log-sum-exp. MQA with sinks (one KV head: every query head in one
 * task, now two), and GQA with a window and a padding mask (a split whose keys are all hidden
 * for some rows); a 4-token step splits too. Against ref.c, and the tiled chunks (split) against
 * the one pass (not split). */
START_TEST(test_attend_split_k_long_decode) {
    static const int32_t chunks[] = {512, 512, 512, 512, 100, 1, 1, 4, 1};
    harness_threads state;
    attn_executor ex = harness_thread_executor(&state);
    for (int variant = 0; variant < 2; variant++) {
        attn_config cfg = harness_config(4, variant == 0 ? 1 : 2, 16);
        cfg.max_seq = 4096;
        cfg.has_sinks = variant == 0;
        cfg.sliding_window = variant == 1 ? 1500 : 0;
        static uint8_t valid[2155];
        for (int i = 0; i < 2155; i++) {
            valid[i] = variant == 0 || i % 7 != 3;
        }
        scenario sc = scenario_default(&cfg, 2155, chunks, 9);
        sc.ex = &ex;
        sc.key_valid = valid;
        sc.block_tokens = 64;
        sc.seed = (uint64_t)(900 + variant);
        check_scenario(&sc);
    }
}
END_TEST

/* rows (n, in) times W^T (out, in) plus b (when the config has biases), in double. */
static double *project(const float *x, int32_t n, int32_t in, const float *w, const float *b,
                       int32_t out) {
    double *y = harness_calloc((size_t)n * out, sizeof(double));
    for (int32_t i = 0; i < n; i++) {
        for (int32_t o = 0; o < out; o++) {
            double acc = b != NULL ? b[o] : 0.0;
            for (int32_t e = 0; e < in; e++) {
                acc += (double)x[(size_t)i * in + e] * w[(size_t)o * in + e];
            }
            y[(size_t)i * out + o] = acc;
        }
    }
    return y;
}

/* (n, heads * d) rows to (heads, n, d) floats. */
static float *heads_first(const double *y, int32_t n, int32_t heads, int32_t d) {
    float *t = harness_calloc((size_t)n * heads * d, sizeof(float));
    for (int32_t i = 0; i < n; i++) {
        for (int32_t h = 0; h < heads; h++) {
            for (int32_t e = 0; e < d; e++) {
                t[((size_t)h * n + i) * d + e] = (float)y[(size_t)i * heads * d + h * d + e];
            }
        }
    }
    return t;
}

/* The layer's output from per-head attention att (heads, t, d): heads merged per token, then o
 * (with its bias), in double; malloc'd (t, hidden) floats. */
static float *output_projection(const float *att, int32_t t, int32_t h, int32_t d,
                                const ref_layer *w, int32_t hidden) {
    float *merged = harness_calloc((size_t)t * h * d, sizeof(float));
    for (int32_t i = 0; i < t; i++) {
        for (int32_t hh = 0; hh < h; hh++) {
            memcpy(merged + (size_t)i * h * d + hh * d, att + ((size_t)hh * t + i) * d,
                   d * sizeof(float));
        }
    }
    double *od = project(merged, t, h * d, w->wo, w->bo, hidden);
    float *want = harness_calloc((size_t)t * hidden, sizeof(float));
    for (size_t i = 0; i < (size_t)t * hidden; i++) {
        want[i] = (float)od[i];
    }
    free(od);
    free(merged);
    return want;
}

/* Cross-attention steps (seed 004 3.4) against a reference written here: q from x, k and v from
 * the context through the same weights, no RoPE, no causal mask, then o. A context of S = 10
 * filled in one step and two (chunked past the workspace's rows), decodes that reuse it, weights,
 * GQA and MHA, with a self-attention step in the same call; refusals. */
START_TEST(test_attend_cross_steps_match_reference) {
    static const int32_t heads[][2] = {{4, 2}, {4, 4}};
    for (int hi = 0; hi < 2; hi++) {
        attn_config cfg = harness_config(heads[hi][0], heads[hi][1], 16);
        cfg.n_layers = 1;
        harness_model hm;
        harness_model_init(&hm, &cfg, 61 + hi);
        const ref_layer *w = &hm.layers[0];
        const int32_t hidden = cfg.hidden_size, h = cfg.n_heads, hkv = cfg.n_kv_heads, d = 16;
        const int32_t s = 10, t = 6;
        float *ctx = harness_random_x(62, s, hidden), *x = harness_random_x(63, t, hidden);
        /* The reference: projections in double, attention by ref_sdpa, o in double. */
        double *qd = project(x, t, hidden, w->wq, w->bq, h * d);
        double *kd = project(ctx, s, hidden, w->wk, w->bk, hkv * d);
        double *vd = project(ctx, s, hidden, w->wv, w->bv, hkv * d);
        float *q = heads_first(qd, t, h, d), *k = heads_first(kd, s, hkv, d);
        float *v = heads_first(vd, s, hkv, d);
        float *att = harness_calloc((size_t)h * t * d, sizeof(float));
        float *w_ref = harness_calloc((size_t)h * t * s, sizeof(float));
        ref_sdpa_args a = {.n_heads = h,
                           .n_kv_heads = hkv,
                           .n_q = t,
                           .n_k = s,
                           .d_k = d,
                           .d_v = d,
                           .q = q,
                           .k = k,
                           .v = v,
                           .window = -1,
                           .out = att,
                           .weights = w_ref};
        ref_sdpa(&a);
        float *want = output_projection(att, t, h, d, w, hidden);

        attn_kv_pool *pool = NULL;
        attn_workspace *ws = NULL;
        attn_kv *cross = NULL, *self = NULL;
        ck_assert_int_eq(attn_kv_pool_create(hm.model, 1 << 20, 16, &pool), ATTN_OK);
        ck_assert_int_eq(attn_workspace_create(hm.model, 4, NULL, &ws), ATTN_OK);
        ck_assert_int_eq(attn_kv_create(pool, &cross), ATTN_OK);
        ck_assert_int_eq(attn_kv_create(pool, &self), ATTN_OK);
        float *out = harness_calloc((size_t)t * hidden, sizeof(float));
        float *wts = harness_calloc((size_t)h * t * s, sizeof(float));
        float *self_out = harness_calloc((size_t)3 * hidden, sizeof(float));
        /* the context in two steps (4 + 6 rows, the second chunked), 2 queries with weights */
        attn_step st = {
            .cross = cross, .context = ctx, .n_context = 4, .x = x, .n_tokens = 1, .out = out};
        ck_assert_int_eq(attn_forward(hm.model, 0, ws, &st, 1), ATTN_OK);
        ck_assert_int_eq(attn_kv_len(cross), 4);
        float *w2 = harness_calloc((size_t)h * 2 * s, sizeof(float));
        attn_step both[2] = {
            {.cross = cross,
             .context = ctx + 4 * hidden,
             .n_context = 6,
             .x = x,
             .n_tokens = 2,
             .out = out,
             .weights = w2},
            {.kv = self, .x = x, .n_tokens = 3, .out = self_out},
        };
        ck_assert_int_eq(attn_forward(hm.model, 0, ws, both, 2), ATTN_OK);
        ck_assert_int_eq(attn_kv_len(cross), s);
        ck_assert_int_eq(attn_kv_len(self), 3);
        for (int32_t hh = 0; hh < h; hh++) {
            memcpy(wts + (size_t)hh * t * s, w2 + (size_t)hh * 2 * s, 2 * s * sizeof(float));
        }
        /* decodes reusing the context: rows 2..5, one call of 4 rows past the workspace's */
        attn_step more = {
            .cross = cross, .x = x + 2 * hidden, .n_tokens = 4, .out = out + 2 * hidden};
        ck_assert_int_eq(attn_forward(hm.model, 0, ws, &more, 1), ATTN_OK);
        ck_assert_int_eq(attn_kv_len(cross), s);
        harness_expect_close(out, want, (size_t)t * hidden, "cross: every query");
        for (int32_t hh = 0; hh < h; hh++) {
            harness_expect_close(wts + (size_t)hh * t * s, w_ref + (size_t)hh * t * s, 2 * s,
                                 "cross: weights");
        }
        /* Refused: positions, key_valid, a ring as the cross cache, a negative context. */
        int32_t pos[1] = {0};
        uint8_t valid[11] = {1};
        attn_step bad = more;
        bad.positions = pos;
        ck_assert_int_eq(attn_forward(hm.model, 0, ws, &bad, 1), ATTN_EINVAL);
        bad = more;
        bad.key_valid = valid;
        ck_assert_int_eq(attn_forward(hm.model, 0, ws, &bad, 1), ATTN_EINVAL);
        bad = more;
        bad.n_context = -1;
        ck_assert_int_eq(attn_forward(hm.model, 0, ws, &bad, 1), ATTN_EINVAL);
        ck_assert_int_eq(attn_kv_len(cross), s);
        free(w2);
        free(self_out);
        free(wts);
        free(out);
        attn_kv_destroy(self);
        attn_kv_destroy(cross);
        attn_workspace_destroy(ws);
        attn_kv_pool_destroy(pool);
        free(want);
        free(w_ref);
        free(att);
        free(v);
        free(k);
        free(q);
        free(vd);
        free(kd);
        free(qd);
        free(x);
        free(ctx);
        harness_model_release(&hm);
    }
}
END_TEST

/* A linear layer's state cannot take a token back: a call whose keys or values overflow float
 * (x far past the weights' range) fails with ATTN_EOVERFLOW and leaves every state of the call
 * as it was, whether the bad row is in its first chunk or a later one (the workspace holds 8
 * tokens: 13 come in two chunks), alone or beside another session, and for a state still empty;
 * each then goes on exactly (bit for bit) as a state that never saw the call. */
START_TEST(test_attend_linear_overflow_leaves_the_state) {
    attn_config cfg = harness_config(4, 2, 16);
    cfg.layer_kind[0] = ATTN_LAYER_LINEAR;
    harness_model hm;
    harness_model_init(&hm, &cfg, 81);
    const int32_t hidden = cfg.hidden_size, n = 24;
    float *x = harness_random_x(82, n, hidden);
    float *bad = harness_random_x(83, 13, hidden);
    attn_kv_pool *pool = NULL;
    attn_workspace *ws = NULL;
    ck_assert_int_eq(attn_kv_pool_create(hm.model, 1 << 20, 16, &pool), ATTN_OK);
    ck_assert_int_eq(attn_workspace_create(hm.model, 8, NULL, &ws), ATTN_OK);
    float *got = harness_calloc((size_t)n * hidden, sizeof(float));
    float *want = harness_calloc((size_t)n * hidden, sizeof(float));
    float *junk = harness_calloc((size_t)n * hidden, sizeof(float));
    attn_kv *clean = NULL;
    ck_assert_int_eq(attn_kv_create_for_layer(pool, 0, &clean), ATTN_OK);
    attn_step c0 = {.kv = clean, .x = x, .n_tokens = n, .out = want};
    ck_assert_int_eq(attn_forward(hm.model, 0, ws, &c0, 1), ATTN_OK);
    /* the bad token at row 2 (first chunk) or row 11 (second chunk); prefix 0 (empty state) or 5 */
    static const int32_t cases[][2] = {{2, 5}, {11, 5}, {2, 0}, {11, 0}};
    for (size_t t = 0; t < sizeof cases / sizeof cases[0]; t++) {
        int32_t bad_row = cases[t][0], prefix = cases[t][1];
        attn_kv *kv = NULL, *other = NULL;
        ck_assert_int_eq(attn_kv_create_for_layer(pool, 0, &kv), ATTN_OK);
        ck_assert_int_eq(attn_kv_create_for_layer(pool, 0, &other), ATTN_OK);
        if (prefix > 0) {
            attn_step p = {.kv = kv, .x = x, .n_tokens = prefix, .out = got};
            ck_assert_int_eq(attn_forward(hm.model, 0, ws, &p, 1), ATTN_OK);
        }
        memcpy(bad, x + (size_t)prefix * hidden, (size_t)13 * hidden * sizeof(float));
        for (int32_t i = 0; i < hidden; i++) {
            bad[(size_t)bad_row * hidden + i] = 3e38f * (i % 2 ? 1.0f : -1.0f);
        }
        attn_step one = {.kv = kv, .x = bad, .n_tokens = 13, .out = junk};
        ck_assert_int_eq(attn_forward(hm.model, 0, ws, &one, 1), ATTN_EOVERFLOW);
        ck_assert_int_eq(attn_kv_len(kv), prefix);
        /* beside a good step (other, which must come back to empty too) */
        attn_step two[2] = {{.kv = other, .x = x, .n_tokens = 6, .out = junk},
                            {.kv = kv, .x = bad, .n_tokens = 13, .out = junk + 6 * hidden}};
        ck_assert_int_eq(attn_forward(hm.model, 0, ws, two, 2), ATTN_EOVERFLOW);
        ck_assert_int_eq(attn_kv_len(kv), prefix);
        ck_assert_int_eq(attn_kv_len(other), 0);
        attn_step rest = {.kv = kv,
                          .x = x + (size_t)prefix * hidden,
                          .n_tokens = n - prefix,
                          .out = got + (size_t)prefix * hidden};
        ck_assert_int_eq(attn_forward(hm.model, 0, ws, &rest, 1), ATTN_OK);
        /* against a state called alike without the failed calls (chunks change the sums'
         * rounding, so the same calls) */
        attn_kv *twin = NULL;
        ck_assert_int_eq(attn_kv_create_for_layer(pool, 0, &twin), ATTN_OK);
        float *twin_out = junk;
        if (prefix > 0) {
            attn_step p = {.kv = twin, .x = x, .n_tokens = prefix, .out = twin_out};
            ck_assert_int_eq(attn_forward(hm.model, 0, ws, &p, 1), ATTN_OK);
        }
        rest.kv = twin;
        rest.out = twin_out + (size_t)prefix * hidden;
        ck_assert_int_eq(attn_forward(hm.model, 0, ws, &rest, 1), ATTN_OK);
        ck_assert_mem_eq(got + (size_t)prefix * hidden, twin_out + (size_t)prefix * hidden,
                         (size_t)(n - prefix) * hidden * sizeof(float));
        attn_kv_destroy(twin);
        attn_step o = {.kv = other, .x = x, .n_tokens = n, .out = got};
        ck_assert_int_eq(attn_forward(hm.model, 0, ws, &o, 1), ATTN_OK);
        ck_assert_mem_eq(got, want, (size_t)n * hidden * sizeof(float));
        attn_kv_destroy(other);
        attn_kv_destroy(kv);
    }
    attn_kv_destroy(clean);
    ck_assert_int_eq(attn_kv_pool_blocks_free(pool), attn_kv_pool_blocks_total(pool));
    attn_workspace_destroy(ws);
    attn_kv_pool_destroy(pool);
    free(junk);
    free(want);
    free(got);
    free(bad);
    free(x);
    harness_model_release(&hm);
}
END_TEST

/* A linear-attention layer against a reference written here: projections in double, then
 * ref_linear_sdpa's quadratic form (causal, no RoPE), then o. The layer runs as a session would:
 * a prefill, decodes, calls longer than the workspace (chunked), two sessions in one forward, a
 * fork, a reservation; its cache stays one state whatever the length, cannot forget (truncate
 * is ATTN_EDROPPED but for 0 and its length), and refuses weights, masks and positions. */
START_TEST(test_attend_linear_layer_matches_reference) {
    attn_config cfg = harness_config(4, 2, 16);
    cfg.n_layers = 2;
    cfg.layer_kind[0] = ATTN_LAYER_LINEAR; /* layer 1 stays softmax */
    harness_model hm;
    harness_model_init(&hm, &cfg, 71);
    const ref_layer *w = &hm.layers[0];
    const int32_t hidden = cfg.hidden_size, h = cfg.n_heads, hkv = cfg.n_kv_heads, d = 16, n = 40;
    float *x = harness_random_x(72, n, hidden);
    double *qd = project(x, n, hidden, w->wq, w->bq, h * d);
    double *kd = project(x, n, hidden, w->wk, w->bk, hkv * d);
    double *vd = project(x, n, hidden, w->wv, w->bv, hkv * d);
    float *q = heads_first(qd, n, h, d), *k = heads_first(kd, n, hkv, d);
    float *v = heads_first(vd, n, hkv, d), *att = harness_calloc((size_t)h * n * d, 4);
    ref_sdpa_args a = {.n_heads = h,
                       .n_kv_heads = hkv,
                       .n_q = n,
                       .n_k = n,
                       .d_k = d,
                       .d_v = d,
                       .q = q,
                       .k = k,
                       .v = v,
                       .is_causal = true,
                       .window = -1,
                       .out = att};
    ref_linear_sdpa(&a);
    float *want = output_projection(att, n, h, d, w, hidden);

    attn_kv_pool *pool = NULL;
    attn_workspace *ws = NULL;
    attn_kv *a1 = NULL, *a2 = NULL, *plain = NULL;
    ck_assert_int_eq(attn_kv_pool_create(hm.model, 1 << 20, 16, &pool), ATTN_OK);
    ck_assert_int_eq(attn_workspace_create(hm.model, 8, NULL, &ws), ATTN_OK);
    ck_assert_int_eq(attn_kv_create_for_layer(pool, 0, &a1), ATTN_OK);
    ck_assert_int_eq(attn_kv_create_for_layer(pool, 0, &a2), ATTN_OK);
    ck_assert_int_eq(attn_kv_create(pool, &plain), ATTN_OK);
    float *out1 = harness_calloc((size_t)n * hidden, sizeof(float));
    float *out2 = harness_calloc((size_t)n * hidden, sizeof(float));
    /* a plain cache, or weights, on the linear layer; the state on the softmax layer */
    attn_step bad = {.kv = plain, .x = x, .n_tokens = 1, .out = out1};
    ck_assert_int_eq(attn_forward(hm.model, 0, ws, &bad, 1), ATTN_EINVAL);
    bad.kv = a1;
    bad.weights = out2;
    ck_assert_int_eq(attn_forward(hm.model, 0, ws, &bad, 1), ATTN_EINVAL);
    bad.weights = NULL;
    ck_assert_int_eq(attn_forward(hm.model, 1, ws, &bad, 1), ATTN_EINVAL);
    /* a1: 17 (chunked by 8), then decodes; a2 alongside in the same calls, other chunkings */
    static const int32_t calls[][2] = {{17, 3}, {1, 14}, {1, 1}, {13, 2}, {1, 1}, {7, 19}};
    int32_t at1 = 0, at2 = 0;
    size_t bytes = 0;
    for (size_t c = 0; c < sizeof calls / sizeof calls[0]; c++) {
        attn_step st[2] = {
            {.kv = a1,
             .x = x + (size_t)at1 * hidden,
             .n_tokens = calls[c][0],
             .out = out1 + (size_t)at1 * hidden},
            {.kv = a2,
             .x = x + (size_t)at2 * hidden,
             .n_tokens = calls[c][1],
             .out = out2 + (size_t)at2 * hidden},
        };
        ck_assert_int_eq(attn_forward(hm.model, 0, ws, st, 2), ATTN_OK);
        at1 += calls[c][0];
        at2 += calls[c][1];
        bytes = bytes == 0 ? attn_kv_bytes(a1) : bytes;
        ck_assert_uint_eq(attn_kv_bytes(a1), bytes); /* O(1) in the length */
    }
    ck_assert_int_eq(at1, n);
    ck_assert_int_eq(at2, n);
    harness_expect_close(out1, want, (size_t)n * hidden, "linear layer, session 1");
    harness_expect_close(out2, want, (size_t)n * hidden, "linear layer, session 2");
    /* It cannot forget; a fork continues alike; 0 starts over. */
    ck_assert_int_eq(attn_kv_truncate(a1, n - 1), ATTN_EDROPPED);
    ck_assert_int_eq(attn_kv_truncate_min(a1), n);
    ck_assert_int_eq(attn_kv_truncate(a1, n), ATTN_OK);
    ck_assert_int_eq(attn_kv_truncate(a2, 0), ATTN_OK);
    ck_assert_uint_eq(attn_kv_bytes(a2), 0);
    attn_kv *copy = NULL;
    ck_assert_int_eq(attn_kv_truncate(a1, 0), ATTN_OK);
    ck_assert_int_eq(attn_kv_reserve(a1, 30), ATTN_OK); /* the daemon's way */
    int32_t free_now = attn_kv_pool_blocks_free(pool);
    attn_step st = {.kv = a1, .x = x, .n_tokens = 30, .out = out1};
    ck_assert_int_eq(attn_forward(hm.model, 0, ws, &st, 1), ATTN_OK);
    ck_assert_int_eq(attn_kv_pool_blocks_free(pool), free_now);
    ck_assert_int_eq(attn_kv_fork(a1, &copy), ATTN_OK);
    attn_step rest[2] = {
        {.kv = a1, .x = x + 30 * hidden, .n_tokens = 10, .out = out1 + 30 * hidden},
        {.kv = copy, .x = x + 30 * hidden, .n_tokens = 10, .out = out2 + 30 * hidden},
    };
    ck_assert_int_eq(attn_forward(hm.model, 0, ws, rest, 2), ATTN_OK);
    harness_expect_close(out1, want, (size_t)n * hidden, "linear layer, reserved, restarted");
    harness_expect_close(out2 + 30 * hidden, want + 30 * hidden, (size_t)10 * hidden,
                         "linear layer, its fork");
    attn_kv_destroy(copy);
    attn_kv_destroy(plain);
    attn_kv_destroy(a2);
    attn_kv_destroy(a1);
    ck_assert_int_eq(attn_kv_pool_blocks_free(pool), attn_kv_pool_blocks_total(pool));
    attn_workspace_destroy(ws);
    attn_kv_pool_destroy(pool);
    free(out2);
    free(out1);
    free(want);
    free(att);
    free(v);
    free(k);
    free(q);
    free(vd);
    free(kd);
    free(qd);
    free(x);
    harness_model_release(&hm);
}
END_TEST

/* The soft-cap kernel (SIMD where the machine has it) against tanh in double: scores across
 * both of its branches (|s / cap| below and above 0.625), saturation, zero and tiny values, at
 * every offset of a vector, within 4 float ulp of the result or 1e-37. */
START_TEST(test_attend_softcap_kernel_matches_tanh) {
    static const float caps[] = {50.0f, 30.0f, 1.0f};
    enum { N = 4099 };
    float *s = harness_calloc(N, sizeof(float));
    float *x = harness_calloc(N, sizeof(float));
    for (size_t c = 0; c < sizeof caps / sizeof caps[0]; c++) {
        float cap = caps[c];
        for (int32_t j = 0; j < N; j++) {
            /* -12 cap .. 12 cap, denser near 0 and around the branch point */
            double u = (double)(j - N / 2) / (N / 2);
            x[j] = (float)(12.0 * cap * u * u * u);
        }
        x[7] = 0.0f;
        x[8] = 1e-30f;
        x[9] = -0.625f * cap;
        x[10] = 0.6249f * cap;
        x[11] = 1e30f;
        x[12] = -1e30f;
        memcpy(s, x, N * sizeof(float));
        attn__softcap(s, N, cap);
        for (int32_t j = 0; j < N; j++) {
            double want = cap * tanh((double)x[j] * (1.0 / cap));
            double tol = fabs(want) * 4.0 * 1.1920929e-7 + 1e-37;
            ck_assert_msg(fabs(s[j] - want) <= tol, "cap %g, s %.9g: got %.9g, want %.9g",
                          (double)cap, (double)x[j], (double)s[j], want);
        }
    }
    free(x);
    free(s);
}
END_TEST

/* The row maximum (SIMD where the machine has it) against a plain loop: every length up to 70
 * and every position of the largest value, with -inf (masked) and NaN entries passed over. */
START_TEST(test_attend_row_max_kernel) {
    float s[70];
    for (int32_t n = 0; n <= 70; n++) {
        for (int32_t at = 0; at < (n > 0 ? n : 1); at++) {
            for (int32_t j = 0; j < n; j++) {
                s[j] = j % 5 == 1 ? -INFINITY : (float)((j * 37) % 11) - 20.0f;
            }
            if (n > 3) {
                s[(at + 2) % n] = NAN;
                s[(at + 16) % n] = NAN; /* the lane of the largest, a vector later */
            }
            if (n > 0 && (at + 2) % n != at && (at + 16) % n != at) {
                s[at] = 3.5f;
            }
            float want = -INFINITY;
            for (int32_t j = 0; j < n; j++) {
                want = s[j] > want ? s[j] : want;
            }
            float got = attn__row_max(s, n);
            ck_assert_msg(got == want, "n %d, max at %d: got %g, want %g", n, at, (double)got,
                          (double)want);
        }
    }
}
END_TEST

/* `extern` keeps this prototype out of the Makefile's suite-table scan, which matches lines
 * starting with `Suite *`. */
extern Suite *attend_suite(void);

Suite *attend_suite(void) {
    Suite *s = suite_create("attend");
    TCase *tc = tcase_create("attend");
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, test_attend_gqa_ratios_and_head_dims);
    tcase_add_test(tc, test_attend_softcap_kernel_matches_tanh);
    tcase_add_test(tc, test_attend_row_max_kernel);
    tcase_add_test(tc, test_attend_cross_steps_match_reference);
    tcase_add_test(tc, test_attend_linear_layer_matches_reference);
    tcase_add_test(tc, test_attend_linear_overflow_leaves_the_state);
    tcase_add_test(tc, test_attend_large_past_then_decode);
    tcase_add_test(tc, test_attend_prefill_then_decode_equals_one_pass);
    tcase_add_test(tc, test_attend_sinks);
    tcase_add_test(tc, test_attend_sliding_window);
    tcase_add_test(tc, test_attend_padding_mask);
    tcase_add_test(tc, test_attend_fully_masked_rows_are_zero);
    tcase_add_test(tc, test_attend_rope_variants);
    tcase_add_test(tc, test_attend_rope_large_positions);
    tcase_add_test(tc, test_attend_bias_combinations);
    tcase_add_test(tc, test_attend_custom_softmax_scale);
    tcase_add_test(tc, test_attend_config_defaults);
    tcase_add_test(tc, test_attend_positions_and_capacity);
    tcase_add_test(tc, test_attend_chunked_prefill_small_workspace);
    tcase_add_test(tc, test_attend_serial_executor);
    tcase_add_test(tc, test_attend_thread_executor);
    tcase_add_test(tc, test_attend_split_k_long_decode);
    suite_add_tcase(s, tc);
    return s;
}
