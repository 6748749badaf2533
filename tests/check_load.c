/* tests/check_load.c: attn_model_load_hf against the golden fixtures of tests/gen_fixtures.py
 * (tests/data, described in tests/data/README.md): config.json fields become the right
 * attn_config, F32 / sharded BF16 / F16 weights give the numpy float64 outputs (prefill then
 * decode, weights, post-RoPE K/V), layer subsets load alone, and each bad folder gives its code
 * with a reason. Tolerances: HARNESS_ATOL/RTOL (check_harness.h). Tests run from the repo root. */
#include <check.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "../engine/attn_int.h"
#include "check_harness.h"
#include "ref.h"

#define DATA "tests/data/"

#include "under_asan.h"

/* The fixture sequences: `prefill` tokens in one call, then `decode` single tokens. */
typedef struct fixture {
    const char *input; /* expected/<input>_x.bin and _pos.bin */
    int32_t hidden;
    int32_t n_heads;
    int32_t n_kv_heads;
    int32_t head_dim;
    int32_t prefill;
    int32_t decode;
} fixture;

static const fixture tiny = {"tiny", 64, 4, 2, 16, 7, 3};
static const fixture alt = {"alt", 32, 4, 1, 8, 9, 3};
static const fixture qwen3 = {"qwen3", 64, 4, 2, 32, 8, 3};
static const fixture olmo2 = {"olmo2", 64, 4, 4, 16, 6, 3};
static const fixture gemma2 = {"gemma2", 64, 4, 2, 32, 11, 3};
static const fixture gemma3 = {"gemma3", 64, 4, 1, 16, 9, 3};
static const fixture qwen2m = {"qwen2m", 32, 4, 2, 8, 8, 3};
static const fixture granite = {"granite", 64, 4, 2, 16, 7, 3};
static const fixture phi3 = {"phi3", 64, 4, 2, 16, 8, 3};
static const fixture neox = {"neox", 64, 4, 4, 16, 7, 3};
static const fixture gpt2 = {"gpt2", 64, 4, 4, 16, 8, 3};
static const fixture stablelm = {"stablelm", 64, 4, 2, 16, 7, 3};
static const fixture cohere = {"cohere", 64, 4, 2, 16, 6, 3};
static const fixture glm4 = {"glm4", 64, 4, 2, 16, 8, 3};
static const fixture phi3l = {"phi3l", 64, 4, 2, 16, 10, 3};
static const fixture yarnq = {"yarnq", 64, 4, 2, 16, 7, 3};
static const fixture yarnl = {"yarnl", 64, 4, 1, 16, 6, 3};
static const fixture dyn = {"dyn", 64, 4, 2, 16, 14, 4};
static const fixture gptoss = {"gptoss", 64, 4, 2, 24, 8, 3};
static const fixture cohere2 = {"cohere2", 64, 4, 2, 16, 8, 3};
static const fixture mixtral = {"mixtral", 64, 4, 2, 16, 9, 3};
static const fixture qwen2_moe = {"qwen2_moe", 64, 4, 2, 16, 8, 3};
static const fixture qwen3_moe = {"qwen3_moe", 64, 4, 1, 32, 8, 3};
static const fixture granitemoe = {"granitemoe", 64, 4, 2, 16, 7, 3};
static const fixture starcoder2 = {"starcoder2", 64, 4, 2, 16, 8, 3};
static const fixture gemma = {"gemma", 64, 4, 1, 32, 7, 3};
static const fixture smollm3 = {"smollm3", 64, 4, 2, 16, 8, 3};
static const fixture phi = {"phi", 64, 4, 4, 16, 7, 3};
static const fixture olmo = {"olmo", 64, 4, 4, 16, 7, 3};
static const fixture phiq = {"phiq", 64, 4, 2, 16, 7, 3};
static const fixture falcon_mq = {"falcon_mq", 64, 4, 1, 16, 7, 3};
static const fixture falcon_new = {"falcon_new", 64, 8, 2, 8, 7, 3};
static const fixture falcon_mha = {"falcon_mha", 64, 4, 4, 16, 7, 3};
/* multi-head latent attention: n_kv_heads 0, its cache being the latent (not compared here) */
static const fixture dsv3 = {"dsv3", 64, 4, 0, 12, 8, 3};
static const fixture dsv2 = {"dsv2", 64, 4, 0, 16, 8, 3};

static attn_model *load_ok(const char *dir, const attn_load_params *p) {
    attn_model *m = NULL;
    char err[256] = "";
    int rc = attn_model_load_hf(dir, p, &m, err, sizeof(err));
    ck_assert_msg(rc == ATTN_OK, "load %s: %d (%s): %s", dir, rc, attn_strerror(rc), err);
    ck_assert_ptr_nonnull(m);
    return m;
}

static float *read_expected(const char *name, size_t count) {
    char path[256];
    snprintf(path, sizeof(path), DATA "expected/%s.bin", name);
    return harness_read_file(path, count * sizeof(float));
}

/* Runs the fixture's sequence through `layer` of m (prefill, then single-token decodes asking
 * for weights) and compares with expected/<expected>_l<layer>_{out,weights,k,v}.bin. */
static void check_layer(const attn_model *m, int32_t layer, const fixture *f,
                        const char *expected) {
    const int32_t n = f->prefill + f->decode;
    const size_t kv_count = (size_t)f->n_kv_heads * n * f->head_dim;
    char name[128];
    char what[160];
    snprintf(name, sizeof(name), DATA "expected/%s_x.bin", f->input);
    float *x = harness_read_file(name, (size_t)n * f->hidden * sizeof(float));
    snprintf(name, sizeof(name), DATA "expected/%s_pos.bin", f->input);
    int32_t *pos = harness_read_file(name, (size_t)n * sizeof(int32_t));
    snprintf(name, sizeof(name), "%s_l%d_out", expected, (int)layer);
    float *out_want = read_expected(name, (size_t)n * f->hidden);
    snprintf(name, sizeof(name), "%s_l%d_weights", expected, (int)layer);
    float *w_want = read_expected(name, (size_t)f->n_heads * n * n);
    float *k_want = NULL, *v_want = NULL;
    if (f->n_kv_heads > 0) {
        snprintf(name, sizeof(name), "%s_l%d_k", expected, (int)layer);
        k_want = read_expected(name, kv_count);
        snprintf(name, sizeof(name), "%s_l%d_v", expected, (int)layer);
        v_want = read_expected(name, kv_count);
    }

    attn_kv_pool *pool = NULL;
    attn_workspace *ws = NULL;
    attn_kv *kv = NULL;
    ck_assert_int_eq(attn_kv_pool_create_typed(m, (size_t)1 << 20, 16, ATTN_DTYPE_F32, &pool),
                     ATTN_OK);
    ck_assert_int_eq(attn_workspace_create(m, 16, NULL, &ws), ATTN_OK);
    ck_assert_int_eq(attn_kv_create(pool, &kv), ATTN_OK);
    float *out = harness_calloc((size_t)n * f->hidden, sizeof(float));
    float *w = harness_calloc((size_t)f->n_heads * n * n, sizeof(float));
    int32_t chunks[8] = {f->prefill};
    for (int32_t i = 0; i < f->decode; i++) {
        chunks[1 + i] = 1;
    }
    harness_run r = {m, layer, ws, kv, x, pos, NULL, n, 0, chunks, 1 + f->decode, out, w};
    ck_assert_int_eq(harness_run_chunks(&r), ATTN_OK);

    snprintf(what, sizeof(what), "%s layer %d: out (rows %d.. are decodes)", expected, (int)layer,
             (int)f->prefill);
    harness_expect_close(out, out_want, (size_t)n * f->hidden, what);
    snprintf(what, sizeof(what), "%s layer %d: weights", expected, (int)layer);
    harness_expect_weight_rows(w, w_want, f->n_heads, 0, n, what);
    if (f->n_kv_heads > 0) {
        attn_config kv_cfg;
        memset(&kv_cfg, 0, sizeof(kv_cfg));
        kv_cfg.n_kv_heads = f->n_kv_heads;
        kv_cfg.head_dim = f->head_dim;
        snprintf(what, sizeof(what), "%s layer %d", expected, (int)layer);
        harness_expect_kv(kv, &kv_cfg, k_want, v_want, n, what);
    }

    free(w);
    free(out);
    attn_kv_destroy(kv);
    attn_workspace_destroy(ws);
    attn_kv_pool_destroy(pool);
    free(v_want);
    free(k_want);
    free(w_want);
    free(out_want);
    free(pos);
    free(x);
}

/* ---- configs ------------------------------------------------------------------------------- */

START_TEST(test_load_tiny_config) {
    attn_model *m = load_ok(DATA "hf_tiny_f32", NULL);
    const attn_config *c = attn_model_config(m);
    ck_assert_int_eq(c->n_layers, 2);
    ck_assert_int_eq(c->hidden_size, 64);
    ck_assert_int_eq(c->n_heads, 4);
    ck_assert_int_eq(c->n_kv_heads, 2);
    ck_assert_int_eq(c->head_dim, 16);
    ck_assert_int_eq(c->rotary_dim, 16);
    ck_assert_float_eq(c->rope_theta, 10000.0f);
    ck_assert_int_eq(c->rope_style, ATTN_ROPE_STYLE_HALF);
    ck_assert_int_eq(c->rope_scaling.type, ATTN_ROPE_SCALING_LLAMA3);
    ck_assert_float_eq(c->rope_scaling.factor, 8.0f);
    ck_assert_float_eq(c->rope_scaling.low_freq_factor, 1.0f);
    ck_assert_float_eq(c->rope_scaling.high_freq_factor, 4.0f);
    ck_assert_int_eq(c->rope_scaling.original_max_position, 64);
    ck_assert_int_eq(c->max_seq, 256);
    ck_assert_int_eq(c->sliding_window, 0);
    ck_assert(c->has_qkv_bias);
    ck_assert(c->has_o_bias);
    ck_assert_float_eq_tol(c->softmax_scale, 0.25f, 1e-7f);
    ck_assert_int_eq(attn_model_layer_first(m), 0);
    ck_assert_int_eq(attn_model_layer_count(m), 2);
    attn_model_destroy(m);
}
END_TEST

/* attnd's own layout: q/k/v biases without an o bias, head_dim from hidden / heads, partial
 * rotary, the interleaved style, linear scaling spelled "type", and a sliding window. */
START_TEST(test_load_alt_config) {
    attn_model *m = load_ok(DATA "hf_alt_f16", NULL);
    const attn_config *c = attn_model_config(m);
    ck_assert_int_eq(c->n_layers, 1);
    ck_assert_int_eq(c->hidden_size, 32);
    ck_assert_int_eq(c->n_heads, 4);
    ck_assert_int_eq(c->n_kv_heads, 1);
    ck_assert_int_eq(c->head_dim, 8);
    ck_assert_int_eq(c->rotary_dim, 4);
    ck_assert_float_eq(c->rope_theta, 1000.0f);
    ck_assert_int_eq(c->rope_style, ATTN_ROPE_STYLE_INTERLEAVED);
    ck_assert_int_eq(c->rope_scaling.type, ATTN_ROPE_SCALING_LINEAR);
    ck_assert_float_eq(c->rope_scaling.factor, 2.0f);
    ck_assert_int_eq(c->max_seq, 64);
    ck_assert_int_eq(c->sliding_window, 4);
    ck_assert(c->has_qkv_bias);
    ck_assert(!c->has_o_bias);
    ck_assert_str_eq(attn_model_family(m), "attnd");
    attn_model_destroy(m);

    /* A null sliding_window is none; rope_type "default" is no scaling. */
    m = load_ok(DATA "hf_alt_nowindow", NULL);
    c = attn_model_config(m);
    ck_assert_int_eq(c->sliding_window, 0);
    ck_assert_int_eq(c->rope_scaling.type, ATTN_ROPE_SCALING_NONE);
    attn_model_destroy(m);
}
END_TEST

START_TEST(test_load_max_seq_override) {
    attn_load_params p = {0, 0, 100, NULL, ATTN_DTYPE_AUTO, NULL};
    attn_model *m = load_ok(DATA "hf_tiny_f32", &p);
    ck_assert_int_eq(attn_model_config(m)->max_seq, 100);
    attn_model_destroy(m);
}
END_TEST

/* ---- numerics against numpy ---------------------------------------------------------------- */

START_TEST(test_load_tiny_f32_matches_numpy) {
    attn_model *m = load_ok(DATA "hf_tiny_f32", NULL);
    check_layer(m, 0, &tiny, "tiny_f32");
    check_layer(m, 1, &tiny, "tiny_f32");
    attn_model_destroy(m);
}
END_TEST

START_TEST(test_load_tiny_bf16_sharded_matches_numpy) {
    attn_model *m = load_ok(DATA "hf_tiny_bf16", NULL);
    check_layer(m, 0, &tiny, "tiny_bf16");
    check_layer(m, 1, &tiny, "tiny_bf16");
    attn_model_destroy(m);
}
END_TEST

START_TEST(test_load_alt_f16_matches_numpy) {
    attn_model *m = load_ok(DATA "hf_alt_f16", NULL);
    check_layer(m, 0, &alt, "alt_f16");
    attn_model_destroy(m);
}
END_TEST

/* The alt weights as a Qwen2 checkpoint, read by Qwen2's rules: q/k/v biases, no o bias, whole
 * heads rotated, and use_sliding_window with max_window_layers 0 making layer 0 slide. */
START_TEST(test_load_qwen2_f16_matches_numpy) {
    attn_model *m = load_ok(DATA "hf_qwen2_f16", NULL);
    const attn_config *c = attn_model_config(m);
    ck_assert_str_eq(attn_model_family(m), "qwen2");
    ck_assert_int_eq(c->sliding_window, 4);
    ck_assert_int_eq(c->rotary_dim, 8);
    ck_assert_int_eq(c->rope_style, ATTN_ROPE_STYLE_HALF);
    ck_assert(c->has_qkv_bias);
    ck_assert(!c->has_o_bias);
    check_layer(m, 0, &alt, "qwen2_f16");
    attn_model_destroy(m);
}
END_TEST

/* Qwen3 in BF16: q/k RMSNorm per head before RoPE, head_dim 32 apart from hidden / heads. */
START_TEST(test_load_qwen3_bf16_matches_numpy) {
    attn_model *m = load_ok(DATA "hf_qwen3_bf16", NULL);
    const attn_config *c = attn_model_config(m);
    ck_assert_str_eq(attn_model_family(m), "qwen3");
    ck_assert_int_eq(c->qk_norm, ATTN_QK_NORM_HEAD);
    ck_assert_float_eq(c->qk_norm_eps, 1e-6f);
    ck_assert_int_eq(c->head_dim, 32);
    ck_assert(!c->has_qkv_bias && !c->has_o_bias);
    ck_assert_int_eq(c->sliding_window, 0);
    check_layer(m, 0, &qwen3, "qwen3_bf16");
    check_layer(m, 1, &qwen3, "qwen3_bf16");
    attn_model_destroy(m);
}
END_TEST

/* Gemma 2: local layers 0 and 2 (window 4) around global layer 1, query_pre_attn_scalar as the
 * scale, soft-capped scores. */
START_TEST(test_load_gemma2_f32_matches_numpy) {
    attn_model *m = load_ok(DATA "hf_gemma2_f32", NULL);
    const attn_config *c = attn_model_config(m);
    ck_assert_str_eq(attn_model_family(m), "gemma2");
    ck_assert_float_eq_tol(c->softmax_scale, 1.0f / sqrtf(24.0f), 1e-7f);
    ck_assert_float_eq(c->logit_softcap, 1.0f);
    ck_assert(attn_config_layer_is_sliding(c, 0));
    ck_assert(!attn_config_layer_is_sliding(c, 1));
    ck_assert(attn_config_layer_is_sliding(c, 2));
    for (int32_t layer = 0; layer < 3; layer++) {
        check_layer(m, layer, &gemma2, "gemma2_f32");
    }
    attn_model_destroy(m);
}
END_TEST

/* Gemma 3 in BF16, alone and inside a multimodal checkpoint: Gemma's (1 + w) q/k norm, a local
 * layer with its own unscaled RoPE and a global one with theta 1e6 and linear scaling. */
START_TEST(test_load_gemma3_bf16_matches_numpy) {
    static const char *const dirs[2] = {DATA "hf_gemma3_bf16", DATA "hf_gemma3_mm_bf16"};
    static const char *const families[2] = {"gemma3_text", "gemma3"};
    for (int i = 0; i < 2; i++) {
        attn_model *m = load_ok(dirs[i], NULL);
        const attn_config *c = attn_model_config(m);
        ck_assert_str_eq(attn_model_family(m), families[i]);
        ck_assert_float_eq(c->rope_theta_local, 10000.0f);
        ck_assert(attn_config_layer_is_sliding(c, 0) && !attn_config_layer_is_sliding(c, 1));
        check_layer(m, 0, &gemma3, "gemma3_bf16");
        check_layer(m, 1, &gemma3, "gemma3_bf16");
        attn_model_destroy(m);
    }
}
END_TEST

/* Granite: attention_multiplier is the softmax scale; biases on q, k, v and o. */
START_TEST(test_load_granite_f32_matches_numpy) {
    attn_model *m = load_ok(DATA "hf_granite_f32", NULL);
    ck_assert_str_eq(attn_model_family(m), "granite");
    ck_assert_float_eq(attn_model_config(m)->softmax_scale, 0.05f);
    check_layer(m, 0, &granite, "granite_f32");
    attn_model_destroy(m);
}
END_TEST

/* Phi-3: the fused qkv_proj split into q | k | v rows, 12 of 16 dims rotated, the window on every
 * layer. */
START_TEST(test_load_phi3_bf16_matches_numpy) {
    attn_model *m = load_ok(DATA "hf_phi3_bf16", NULL);
    const attn_config *c = attn_model_config(m);
    ck_assert_str_eq(attn_model_family(m), "phi3");
    ck_assert_int_eq(c->rotary_dim, 12);
    ck_assert(attn_config_layer_is_sliding(c, 0) && attn_config_layer_is_sliding(c, 1));
    ck_assert(!c->has_qkv_bias && !c->has_o_bias);
    check_layer(m, 0, &phi3, "phi3_bf16");
    check_layer(m, 1, &phi3, "phi3_bf16");
    attn_model_destroy(m);
}
END_TEST

/* GPT-NeoX: query_key_value's per-head [q | k | v] rows, biases by default, rotary_pct 0.25,
 * rotary_emb_base; the causal-mask buffers of old checkpoints are accepted, not read. */
START_TEST(test_load_gpt_neox_f16_matches_numpy) {
    attn_model *m = load_ok(DATA "hf_gpt_neox_f16", NULL);
    const attn_config *c = attn_model_config(m);
    ck_assert_str_eq(attn_model_family(m), "gpt_neox");
    ck_assert_int_eq(c->rotary_dim, 4);
    ck_assert(c->has_qkv_bias && c->has_o_bias);
    ck_assert_int_eq(c->sliding_window, 0);
    check_layer(m, 0, &neox, "gpt_neox_f16");
    check_layer(m, 1, &neox, "gpt_neox_f16");
    attn_model_destroy(m);
}
END_TEST

/* Falcon: query_key_value in each of its three layouts (multi_query's one K/V head with the
 * original n_head / n_layer names; new_decoder_architecture's KV groups with biases; one K/V
 * head per query head, with the RW checkpoints' rotary buffer), BF16, F32 and F16. */
START_TEST(test_load_falcon_layouts_match_numpy) {
    static const struct {
        const char *dir, *expected;
        const fixture *f;
        bool has_bias;
    } cases[] = {
        {DATA "hf_falcon_mq_bf16", "falcon_mq_bf16", &falcon_mq, false},
        {DATA "hf_falcon_new_f32", "falcon_new_f32", &falcon_new, true},
        {DATA "hf_falcon_mha_f16", "falcon_mha_f16", &falcon_mha, true},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        attn_model *m = load_ok(cases[i].dir, NULL);
        const attn_config *c = attn_model_config(m);
        ck_assert_str_eq(attn_model_family(m), "falcon");
        ck_assert_int_eq(c->n_kv_heads, cases[i].f->n_kv_heads);
        ck_assert_int_eq(c->head_dim, cases[i].f->head_dim);
        ck_assert(c->has_qkv_bias == cases[i].has_bias && c->has_o_bias == cases[i].has_bias);
        check_layer(m, 0, cases[i].f, cases[i].expected);
        check_layer(m, 1, cases[i].f, cases[i].expected);
        attn_model_destroy(m);
    }
}
END_TEST

/* DeepSeek-V3 (q_lora_rank, rope_interleave, BF16, 2 layers) and V2 (q_proj, attention_bias,
 * yarn with mscale_all_dim at positions 100..): multi-head latent attention against the
 * expanded numpy reference of modeling_deepseek_v3, prefill then decodes, weights included. */
START_TEST(test_load_deepseek_matches_numpy) {
    attn_model *m = load_ok(DATA "hf_deepseek_v3_bf16", NULL);
    const attn_config *c = attn_model_config(m);
    ck_assert_str_eq(attn_model_family(m), "deepseek_v3");
    ck_assert(c->kv_lora_rank == 16 && c->q_lora_rank == 24 && c->head_dim == 12 &&
              c->rotary_dim == 4 && c->n_kv_heads == 1);
    ck_assert_int_eq(c->rope_style, ATTN_ROPE_STYLE_INTERLEAVED);
    check_layer(m, 0, &dsv3, "dsv3_bf16");
    check_layer(m, 1, &dsv3, "dsv3_bf16");
    attn_model_destroy(m);
    /* V2 under yarn with mscale_all_dim: DeepSeek's own code and transformers' port disagree on
     * the softmax scale, so the checkpoint loads only once its user says whose code it means. */
    attn_load_params lp = {0, 0, 4096, NULL, ATTN_DTYPE_AUTO, NULL};
    char err[512] = "";
    m = NULL;
    ck_assert_int_eq(attn_model_load_hf(DATA "hf_deepseek_v2_f32", &lp, &m, err, sizeof err),
                     ATTN_EUNSUPPORTED);
    ck_assert_msg(strstr(err, "--modeling-code") != NULL, "%s", err);
    ck_assert_ptr_null(m);
    double mscale = 0.1 * 0.707 * log(40.0) + 1.0;
    lp.modeling_code = "transformers"; /* DeepseekV2Attention: qk_head_dim^-1/2 alone */
    m = load_ok(DATA "hf_deepseek_v2_f32", &lp);
    ck_assert_float_eq_tol(attn_model_config(m)->softmax_scale, 0.25f, 1e-7f);
    attn_model_destroy(m);
    lp.modeling_code = "checkpoint"; /* the fixture's reference: modeling_deepseek.py's */
    m = load_ok(DATA "hf_deepseek_v2_f32", &lp);
    c = attn_model_config(m);
    ck_assert_str_eq(attn_model_family(m), "deepseek_v2");
    ck_assert(c->q_lora_rank == 0 && c->has_qkv_bias && c->has_o_bias);
    ck_assert_int_eq(c->rope_scaling.type, ATTN_ROPE_SCALING_YARN);
    ck_assert_float_eq_tol(c->softmax_scale, (float)(mscale * mscale / 4.0), 1e-6f);
    check_layer(m, 0, &dsv2, "dsv2_f32");
    attn_model_destroy(m);
}
END_TEST

/* The MoE families: the attention of the dense family each one's modeling code inherits, read
 * from a checkpoint that also holds its MoE block (block_sparse_moe.*, mlp.experts.*,
 * mlp.shared_expert*), accepted and not read. Mixtral (BF16): Mistral's window on every layer,
 * theta 1e6; Qwen2-MoE (F16): q/k/v biases, a window written but not used; Qwen3-MoE (BF16):
 * q/k norms, head_dim 32 apart from hidden / heads, positions 50..; Granite MoE (F32):
 * attention_multiplier as the scale, q/k/v/o biases. */
START_TEST(test_load_moe_families_match_numpy) {
    static const struct {
        const char *dir, *family, *expected;
        const fixture *f;
        int32_t n_layers, window;
        bool has_qkv_bias, has_o_bias;
        attn_qk_norm qk_norm;
        float theta, scale; /* scale: head_dim^-1/2, Granite's attention_multiplier */
    } cases[] = {
        {DATA "hf_mixtral_bf16", "mixtral", "mixtral_bf16", &mixtral, 2, 5, false, false,
         ATTN_QK_NORM_NONE, 1e6f, 0.25f},
        {DATA "hf_qwen2_moe_f16", "qwen2_moe", "qwen2_moe_f16", &qwen2_moe, 2, 0, true, false,
         ATTN_QK_NORM_NONE, 1e6f, 0.25f},
        {DATA "hf_qwen3_moe_bf16", "qwen3_moe", "qwen3_moe_bf16", &qwen3_moe, 2, 0, false, false,
         ATTN_QK_NORM_HEAD, 1e6f, 0.17677669f},
        {DATA "hf_granitemoe_f32", "granitemoe", "granitemoe_f32", &granitemoe, 1, 0, true, true,
         ATTN_QK_NORM_NONE, 10000.0f, 0.0625f},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        attn_model *m = load_ok(cases[i].dir, NULL);
        const attn_config *c = attn_model_config(m);
        ck_assert_str_eq(attn_model_family(m), cases[i].family);
        ck_assert_int_eq(c->n_kv_heads, cases[i].f->n_kv_heads);
        ck_assert_int_eq(c->head_dim, cases[i].f->head_dim);
        ck_assert_int_eq(c->sliding_window, cases[i].window);
        ck_assert(c->has_qkv_bias == cases[i].has_qkv_bias);
        ck_assert(c->has_o_bias == cases[i].has_o_bias);
        ck_assert_int_eq(c->qk_norm, cases[i].qk_norm);
        ck_assert_float_eq(c->rope_theta, cases[i].theta);
        ck_assert_float_eq_tol(c->softmax_scale, cases[i].scale, 1e-7f); /* 32^-1/2: 0.1767.. */
        for (int32_t layer = 0; layer < cases[i].n_layers; layer++) {
            ck_assert(attn_config_layer_is_sliding(c, layer) == (cases[i].window > 0));
            check_layer(m, layer, cases[i].f, cases[i].expected);
        }
        attn_model_destroy(m);
    }
}
END_TEST

/* GPT-2: Conv1D weights stored (in, out), biases, no rotary embedding, n_embd / n_head names. */
START_TEST(test_load_gpt2_f32_matches_numpy) {
    attn_model *m = load_ok(DATA "hf_gpt2_f32", NULL);
    const attn_config *c = attn_model_config(m);
    ck_assert_str_eq(attn_model_family(m), "gpt2");
    ck_assert_int_eq(c->rotary_dim, -1);
    ck_assert_int_eq(c->hidden_size, 64);
    ck_assert_int_eq(c->max_seq, 64);
    ck_assert_float_eq_tol(c->softmax_scale, 0.25f, 1e-7f);
    check_layer(m, 0, &gpt2, "gpt2_f32");
    check_layer(m, 1, &gpt2, "gpt2_f32");
    attn_model_destroy(m);
}
END_TEST

/* A family's fixture: its folder, family name, expected-output prefix, inputs and layers. */
struct family_case {
    const char *dir, *family, *expected;
    const fixture *f;
    int32_t layers;
};

/* Each case loads as its family, every layer matching its reference (check_layer). */
static void check_family_cases(const struct family_case *cases, size_t n) {
    for (size_t i = 0; i < n; i++) {
        attn_model *m = load_ok(cases[i].dir, NULL);
        ck_assert_str_eq(attn_model_family(m), cases[i].family);
        for (int32_t layer = 0; layer < cases[i].layers; layer++) {
            check_layer(m, layer, cases[i].f, cases[i].expected);
        }
        attn_model_destroy(m);
    }
}

/* StableLM 2 (qk_layernorm: a LayerNorm per head with its own weight, one tensor each),
 * Cohere (use_qk_norm: the same norm, its weights one matrix; interleaved rotary) and GLM-4 (half
 * of each head rotated, interleaved; q/k/v biases). */
START_TEST(test_load_norm_and_rotary_families_match_numpy) {
    static const struct family_case cases[] = {
        {DATA "hf_stablelm_bf16", "stablelm", "stablelm_bf16", &stablelm, 2},
        {DATA "hf_cohere_f32", "cohere", "cohere_f32", &cohere, 1},
        {DATA "hf_glm4_bf16", "glm4", "glm4_bf16", &glm4, 2},
        /* a sliding layer with interleaved RoPE, a full one without positions */
        {DATA "hf_cohere2_f32", "cohere2", "cohere2_f32", &cohere2, 2},
    };
    check_family_cases(cases, sizeof cases / sizeof cases[0]);
}
END_TEST

/* StarCoder2 (use_bias: q/k/v/o biases; the window on every layer; F16), Gemma (MQA, head_dim
 * 32 apart from hidden / heads; BF16), SmolLM3 (a sliding RoPE layer, a sliding NoPE layer, a
 * full NoPE layer; BF16), Phi (dense as o, biases, 6 of 16 dims rotated; F16; and with
 * qk_layernorm, one LayerNorm with a bias for every head; BF16) and OLMo (clip_qkv clamping about
 * a third of q, k and v; F32), each layer from its own reference. */
START_TEST(test_load_later_families_match_numpy) {
    static const struct family_case cases[] = {
        {DATA "hf_starcoder2_f16", "starcoder2", "starcoder2_f16", &starcoder2, 2},
        {DATA "hf_gemma_bf16", "gemma", "gemma_bf16", &gemma, 2},
        {DATA "hf_smollm3_bf16", "smollm3", "smollm3_bf16", &smollm3, 3},
        {DATA "hf_phi_f16", "phi", "phi_f16", &phi, 2},
        {DATA "hf_olmo_f32", "olmo", "olmo_f32", &olmo, 2},
        {DATA "hf_phi_qk_layernorm_bf16", "phi", "phi_qk_layernorm_bf16", &phiq, 1},
    };
    check_family_cases(cases, sizeof cases / sizeof cases[0]);
    attn_model *m = load_ok(DATA "hf_starcoder2_f16", NULL);
    const attn_config *c = attn_model_config(m);
    ck_assert(c->has_qkv_bias && c->has_o_bias);
    ck_assert(attn_config_layer_is_sliding(c, 0) && attn_config_layer_is_sliding(c, 1));
    ck_assert_int_eq(c->sliding_window, 3);
    attn_model_destroy(m);
    m = load_ok(DATA "hf_smollm3_bf16", NULL);
    c = attn_model_config(m);
    ck_assert(attn_config_layer_rotates(c, 0) && !attn_config_layer_rotates(c, 1) &&
              !attn_config_layer_rotates(c, 2));
    ck_assert(attn_config_layer_is_sliding(c, 0) && attn_config_layer_is_sliding(c, 1) &&
              !attn_config_layer_is_sliding(c, 2));
    attn_model_destroy(m);
    m = load_ok(DATA "hf_phi_f16", NULL);
    c = attn_model_config(m);
    ck_assert_int_eq(c->rotary_dim, 6); /* int(16 x 0.4) */
    ck_assert(c->has_qkv_bias && c->has_o_bias);
    attn_model_destroy(m);
    m = load_ok(DATA "hf_olmo_f32", NULL);
    ck_assert_float_eq(attn_model_config(m)->clip_qkv, 0.25f);
    ck_assert_int_eq(attn_model_config(m)->n_kv_heads, 4);
    attn_model_destroy(m);
    m = load_ok(DATA "hf_phi_qk_layernorm_bf16", NULL);
    ck_assert_int_eq(attn_model_config(m)->qk_norm, ATTN_QK_NORM_HEAD_LAYERNORM_BIAS);
    ck_assert_float_eq(attn_model_config(m)->qk_norm_eps, 1e-5f);
    attn_model_destroy(m);
}
END_TEST

/* gpt-oss: each head's learned sink in every softmax denominator (the weights sum to less than
 * 1), sliding and full layers from layer_types, q/k/v/o biases, head_dim 24 of hidden 64, yarn
 * 32x with gpt-oss's unrounded ramp, BF16; a later layer loads alone. */
START_TEST(test_load_gpt_oss_bf16_matches_numpy) {
    attn_model *m = load_ok(DATA "hf_gpt_oss_bf16", NULL);
    const attn_config *c = attn_model_config(m);
    ck_assert_str_eq(attn_model_family(m), "gpt_oss");
    ck_assert(c->has_sinks && c->has_qkv_bias && c->has_o_bias);
    ck_assert_int_eq(c->head_dim, 24);
    ck_assert_int_eq(c->sliding_window, 3);
    ck_assert(attn_config_layer_is_sliding(c, 0) && !attn_config_layer_is_sliding(c, 1) &&
              attn_config_layer_is_sliding(c, 2));
    ck_assert_int_eq(c->rope_scaling.type, ATTN_ROPE_SCALING_YARN);
    ck_assert(c->rope_scaling.yarn_fractional_range);
    ck_assert_float_eq_tol(c->rope_scaling.attention_factor, (float)(0.1 * log(32.0) + 1.0), 1e-6f);
    for (int32_t layer = 0; layer < 3; layer++) {
        check_layer(m, layer, &gptoss, "gpt_oss_bf16");
    }
    attn_model_destroy(m);
    attn_load_params only2 = {2, 1, 0, NULL, ATTN_DTYPE_AUTO, NULL};
    m = load_ok(DATA "hf_gpt_oss_bf16", &only2);
    check_layer(m, 2, &gptoss, "gpt_oss_bf16");
    attn_model_destroy(m);
}
END_TEST

/* Qwen2 with max_window_layers 1: a full layer 0 and a sliding layer 1. */
START_TEST(test_load_qwen2_mixed_f32_matches_numpy) {
    attn_model *m = load_ok(DATA "hf_qwen2_mixed_f32", NULL);
    const attn_config *c = attn_model_config(m);
    ck_assert(!attn_config_layer_is_sliding(c, 0) && attn_config_layer_is_sliding(c, 1));
    check_layer(m, 0, &qwen2m, "qwen2_mixed_f32");
    check_layer(m, 1, &qwen2m, "qwen2_mixed_f32");
    attn_model_destroy(m);
}
END_TEST

/* OLMo 2: q/k RMSNorm over the whole projection width, positions from 90. */
START_TEST(test_load_olmo2_f32_matches_numpy) {
    attn_model *m = load_ok(DATA "hf_olmo2_f32", NULL);
    const attn_config *c = attn_model_config(m);
    ck_assert_str_eq(attn_model_family(m), "olmo2");
    ck_assert_int_eq(c->qk_norm, ATTN_QK_NORM_WIDTH);
    ck_assert_float_eq(c->qk_norm_eps, 1e-6f);
    check_layer(m, 0, &olmo2, "olmo2_f32");
    attn_model_destroy(m);
}
END_TEST

/* Only layer 1 (which straddles the two BF16 shards): same results, less memory, and layer 0
 * is not there. */
START_TEST(test_load_layer_subset) {
    static const char *const dirs[2] = {DATA "hf_tiny_f32", DATA "hf_tiny_bf16"};
    static const char *const expected[2] = {"tiny_f32", "tiny_bf16"};
    for (int i = 0; i < 2; i++) {
        attn_load_params p = {1, 1, 0, NULL, ATTN_DTYPE_AUTO, NULL};
        attn_model *full = load_ok(dirs[i], NULL);
        attn_model *m = load_ok(dirs[i], &p);
        ck_assert_int_eq(attn_model_layer_first(m), 1);
        ck_assert_int_eq(attn_model_layer_count(m), 1);
        ck_assert_int_eq(attn_model_config(m)->n_layers, 2);
        ck_assert_uint_lt(attn_model_bytes(m), attn_model_bytes(full));
        check_layer(m, 1, &tiny, expected[i]);

        attn_kv_pool *pool = NULL;
        attn_workspace *ws = NULL;
        attn_kv *kv = NULL;
        float x[64] = {0};
        float out[64];
        ck_assert_int_eq(attn_kv_pool_create_typed(m, (size_t)1 << 20, 16, ATTN_DTYPE_F32, &pool),
                         ATTN_OK);
        ck_assert_int_eq(attn_workspace_create(m, 4, NULL, &ws), ATTN_OK);
        ck_assert_int_eq(attn_kv_create(pool, &kv), ATTN_OK);
        attn_step step = {kv, x, 1, NULL, NULL, out, NULL, NULL, NULL, 0, NULL, NULL, 0};
        ck_assert_int_eq(attn_forward(m, 0, ws, &step, 1), ATTN_EINVAL);
        ck_assert_int_eq(attn_forward(m, 2, ws, &step, 1), ATTN_EINVAL);
        ck_assert_int_eq(attn_kv_len(kv), 0);
        attn_kv_destroy(kv);
        attn_workspace_destroy(ws);
        attn_kv_pool_destroy(pool);
        attn_model_destroy(m);
        attn_model_destroy(full);
    }
}
END_TEST

/* Rotary scalings past theta: LongRoPE (short factors while a call stays within the original
 * context, long ones once it reaches past it, cos and sin times the attention factor), YaRN (as
 * Qwen2.5 writes it, and DeepSeek's mscale pair with gpt-oss's unrounded ramp) and dynamic NTK
 * (theta grown per call past max_position_embeddings, served with a longer max_seq). */
START_TEST(test_load_rope_scalings_match_numpy) {
    attn_model *m = load_ok(DATA "hf_phi3_longrope_f32", NULL);
    const attn_rope_scaling *s = &attn_model_config(m)->rope_scaling;
    ck_assert_int_eq(s->type, ATTN_ROPE_SCALING_LONGROPE);
    ck_assert_int_eq(s->original_max_position, 16);
    ck_assert_float_eq_tol(s->factor, 4.0f, 1e-6f);
    ck_assert_float_eq_tol(s->attention_factor, (float)sqrt(1.0 + log(4.0) / log(16.0)), 1e-6f);
    check_layer(m, 0, &phi3l, "phi3_longrope_f32");
    attn_model_destroy(m);

    m = load_ok(DATA "hf_qwen2_yarn_f32", NULL);
    s = &attn_model_config(m)->rope_scaling;
    ck_assert_int_eq(s->type, ATTN_ROPE_SCALING_YARN);
    ck_assert_int_eq(s->original_max_position, 2048);
    ck_assert_float_eq_tol(s->attention_factor, (float)(0.1 * log(4.0) + 1.0), 1e-6f);
    ck_assert(s->beta_fast == 32.0f && s->beta_slow == 1.0f && !s->yarn_fractional_range);
    check_layer(m, 0, &yarnq, "qwen2_yarn_f32");
    attn_model_destroy(m);

    m = load_ok(DATA "hf_llama_yarn_f32", NULL);
    s = &attn_model_config(m)->rope_scaling;
    ck_assert_int_eq(s->original_max_position, 4096);
    ck_assert(s->yarn_fractional_range);
    ck_assert_float_eq_tol(s->attention_factor,
                           (float)((0.1 * log(8.0) + 1.0) / (0.1 * 0.8 * log(8.0) + 1.0)), 1e-6f);
    check_layer(m, 0, &yarnl, "llama_yarn_f32");
    attn_model_destroy(m);

    attn_load_params longer = {0, 0, 32, NULL, ATTN_DTYPE_AUTO, NULL};
    m = load_ok(DATA "hf_llama_dynamic_f32", &longer);
    s = &attn_model_config(m)->rope_scaling;
    ck_assert_int_eq(s->type, ATTN_ROPE_SCALING_DYNAMIC);
    ck_assert_int_eq(s->original_max_position, 16);
    check_layer(m, 0, &dyn, "llama_dynamic_f32");
    attn_model_destroy(m);
}
END_TEST

/* ---- errors -------------------------------------------------------------------------------- */

typedef struct bad_folder {
    const char *dir;
    int want; /* 0: any failure (attn.h does not name the code) */
} bad_folder;

START_TEST(test_load_bad_folders) {
    static const bad_folder cases[] = {
        {DATA "refuse_yarn_factor", ATTN_EUNSUPPORTED},
        {DATA "refuse_mrope", ATTN_EUNSUPPORTED},
        {DATA "bad_dtype_i8", ATTN_EUNSUPPORTED},
        {DATA "bad_shape", ATTN_ESHAPE},
        {DATA "bad_truncated", ATTN_EIO},
        {DATA "bad_no_config", ATTN_EIO},
        {DATA "bad_missing_shard", ATTN_EIO},
        {DATA "bad_overlap", ATTN_EIO},
        {DATA "bad_name_twice", ATTN_EIO},
        {DATA "bad_nan_weight", ATTN_EIO},
        {DATA "bad_inf_f16", ATTN_EIO},
        {DATA "refuse_unlisted_qk_norm", ATTN_EUNSUPPORTED},
        {DATA "bad_missing_tensor", 0},
        {DATA "no_such_folder", ATTN_EIO},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        attn_model *sentinel = (attn_model *)&cases[i];
        attn_model *m = sentinel;
        char err[256];
        memset(err, 'x', sizeof(err));
        int rc = attn_model_load_hf(cases[i].dir, NULL, &m, err, sizeof(err));
        if (cases[i].want != 0) {
            ck_assert_msg(rc == cases[i].want, "%s: got %d (%s), want %d (%s); reason: %.200s",
                          cases[i].dir, rc, attn_strerror(rc), cases[i].want,
                          attn_strerror(cases[i].want), memchr(err, 0, sizeof(err)) ? err : "");
        } else {
            ck_assert_msg(rc < 0, "%s: got %d, want a failure", cases[i].dir, rc);
        }
        ck_assert_ptr_eq(m, sentinel);
        ck_assert_msg(memchr(err, 0, sizeof(err)) != NULL, "%s: reason not NUL-terminated",
                      cases[i].dir);
        ck_assert_msg(strlen(err) > 0, "%s: empty reason", cases[i].dir);
    }
}
END_TEST

/* A weight past binary16's range is served as it is, or as bfloat16, and refused as binary16,
 * naming it: it would be infinite, and every answer null. */
START_TEST(test_load_weight_past_f16_range) {
    static const attn_dtype ok[] = {ATTN_DTYPE_AUTO, ATTN_DTYPE_F32, ATTN_DTYPE_BF16};
    for (size_t i = 0; i < sizeof ok / sizeof ok[0]; i++) {
        attn_load_params p = {.weights_dtype = ok[i]};
        attn_model *m = NULL;
        char err[256] = "";
        ck_assert_msg(attn_model_load_hf(DATA "big_weight_f32", &p, &m, err, sizeof err) == ATTN_OK,
                      "%s", err);
        attn_model_destroy(m);
    }
    attn_load_params p = {.weights_dtype = ATTN_DTYPE_F16};
    attn_model *m = NULL;
    char err[256] = "";
    ck_assert_int_eq(attn_model_load_hf(DATA "big_weight_f32", &p, &m, err, sizeof err),
                     ATTN_ERANGE);
    ck_assert_ptr_null(m);
    ck_assert_msg(strstr(err, "v_proj") != NULL && strstr(err, "row 3, column 5") != NULL &&
                      strstr(err, "f16") != NULL && strstr(err, "serve it as bf16 or f32") != NULL,
                  "%s", err);
}
END_TEST

/* A config.json whose sizes no machine holds (the weights are checked against it only as each
 * tensor is read, after the allocation) is refused with the sizes it asked for, not a bare "out
 * of memory" that reads as the machine's fault. */
START_TEST(test_load_config_too_big_names_its_sizes) {
    char dir[] = "/tmp/attnd-check-big-XXXXXX", path[64], target[4096];
    ck_assert_ptr_nonnull(getcwd(target, sizeof target - 64));
    strcat(target, "/" DATA "hf_tiny_f32/model.safetensors");
    ck_assert_ptr_nonnull(mkdtemp(dir));
    snprintf(path, sizeof path, "%s/config.json", dir);
    FILE *f = fopen(path, "w");
    ck_assert_ptr_nonnull(f);
    /* 16 TB of weights a layer, a petabyte in all: past any x86-64 address space, so the
     * allocation fails however the kernel overcommits (a size that fits it, 50 GB, was served
     * virtually on a big machine and failed later, at the shapes) */
    fputs("{\"model_type\": \"llama\", \"hidden_size\": 1048576, \"num_attention_heads\": 8192, "
          "\"num_key_value_heads\": 8192, \"head_dim\": 128, \"num_hidden_layers\": 64, "
          "\"max_position_embeddings\": 256, \"attention_bias\": true}",
          f);
    ck_assert_int_eq(fclose(f), 0);
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    ck_assert_int_eq(symlink(target, path), 0);
    attn_model *m = NULL;
    char err[512] = "";
    int rc = attn_model_load_hf(dir, NULL, &m, err, sizeof err);
    ck_assert_int_eq(unlink(path), 0);
    snprintf(path, sizeof path, "%s/config.json", dir);
    ck_assert_int_eq(unlink(path), 0);
    ck_assert_int_eq(rmdir(dir), 0);
    ck_assert_msg(rc == ATTN_ENOMEM, "got %d: %s", rc, err);
    ck_assert_ptr_null(m);
    ck_assert_msg(strstr(err, "hidden_size 1048576") != NULL && strstr(err, "64 layers") != NULL &&
                      strstr(err, "out of memory") != NULL,
                  "%s", err);
}
END_TEST

/* A short reason buffer is truncated but NUL-terminated; err may be NULL. */
/* A safetensors header is read as Python's json reads it (the reference loader's): a \u0000 in
 * a name (cJSON cut "...q_proj.weight\u0000junk" to q_proj.weight and loaded it; found by an
 * outside audit's fuzzer) or a second value after the object is refused; spaces after it (the
 * padding writers add) are not. */
static int parse_header_text(const char *json, char *err, size_t err_size) {
    size_t n = strlen(json), len = 8 + n + 4;
    uint8_t *buf = harness_calloc(len, 1);
    for (int b = 0; b < 8; b++) {
        buf[b] = (uint8_t)((uint64_t)n >> (8 * b));
    }
    memcpy(buf + 8, json, n);
    struct attn__st_header h;
    int rc = attn__safetensors_header_parse(buf, len, len, &h, err, err_size);
    if (rc == ATTN_OK) {
        attn__safetensors_header_release(&h);
    }
    free(buf);
    return rc;
}

START_TEST(test_load_safetensors_header_as_python_reads_it) {
    char err[256];
    ck_assert_int_eq(parse_header_text("{\"w\":{\"dtype\":\"F32\",\"shape\":[1],"
                                       "\"data_offsets\":[0,4]}}   ",
                                       err, sizeof err),
                     ATTN_OK);
    ck_assert_int_eq(parse_header_text("{\"w\\u0000junk\":{\"dtype\":\"F32\",\"shape\":[1],"
                                       "\"data_offsets\":[0,4]}}",
                                       err, sizeof err),
                     ATTN_EIO);
    ck_assert_msg(strstr(err, "u0000") != NULL, "%s", err);
    ck_assert_int_eq(parse_header_text("{\"w\":{\"dtype\":\"F32\",\"shape\":[1],"
                                       "\"data_offsets\":[0,4]}}{}",
                                       err, sizeof err),
                     ATTN_EIO);
    ck_assert_msg(strstr(err, "after the object") != NULL, "%s", err);
}
END_TEST

START_TEST(test_load_reason_buffer) {
    attn_model *m = NULL;
    char err[8];
    memset(err, 'x', sizeof(err));
    ck_assert_int_eq(attn_model_load_hf(DATA "refuse_mrope", NULL, &m, err, sizeof(err)),
                     ATTN_EUNSUPPORTED);
    ck_assert_msg(memchr(err, 0, sizeof(err)) != NULL, "reason not NUL-terminated");
    ck_assert_int_eq(attn_model_load_hf(DATA "refuse_mrope", NULL, &m, NULL, 0), ATTN_EUNSUPPORTED);
    ck_assert_ptr_null(m);
}
END_TEST

/* Layers outside the model, or a non-positive max_seq override, are refused; attn.h names no
 * code for these, so any failure passes, but a model must not come back. */
/* tests/check_pool.c's: the check binary's reallocs fail while it is above 0. */
extern int reallocs_to_fail;

/* A shard's header that cannot be held (its tensor list's realloc fails) refuses the load with
 * a reason that says so: it gave "<path>: " and nothing after, the daemon's whole startup line
 * (found by an outside audit failing each allocation of a load in turn). */
START_TEST(test_load_out_of_memory_says_so) {
    attn_model *m = NULL;
    char err[512];
    reallocs_to_fail = 1; /* the first realloc of a load: the first shard's tensor list */
    int rc = attn_model_load_hf(DATA "hf_tiny_bf16", NULL, &m, err, sizeof err);
    reallocs_to_fail = 0;
    ck_assert_int_eq(rc, ATTN_ENOMEM);
    ck_assert_ptr_null(m);
    ck_assert_msg(strstr(err, "safetensors: ") != NULL &&
                      strstr(err, attn_strerror(ATTN_ENOMEM)) != NULL,
                  "%s", err);
}
END_TEST

START_TEST(test_load_bad_params) {
    static const attn_load_params bad[] = {
        {2, 0, 0, NULL, ATTN_DTYPE_AUTO, NULL},    {1, 2, 0, NULL, ATTN_DTYPE_AUTO, NULL},
        {-1, 0, 0, NULL, ATTN_DTYPE_AUTO, NULL},   {0, -1, 0, NULL, ATTN_DTYPE_AUTO, NULL},
        {0, 0, -5, NULL, ATTN_DTYPE_AUTO, NULL},   {0, 0, 0, NULL, (attn_dtype)9, NULL},
        {0, 0, 0, NULL, ATTN_DTYPE_AUTO, "remote"}};
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        attn_model *m = NULL;
        char err[256] = "";
        int rc = attn_model_load_hf(DATA "hf_tiny_f32", &bad[i], &m, err, sizeof(err));
        ck_assert_msg(rc < 0, "params {%d, %d, %d}: got %d, want a failure",
                      (int)bad[i].layer_first, (int)bad[i].layer_count, (int)bad[i].max_seq, rc);
        ck_assert_ptr_null(m);
    }
}
END_TEST

/* A llama checkpoint of n_layers layers of hidden x hidden projections (8 heads of hidden / 8),
 * layer l's tensors in dtypes[l] ('b' BF16, 'f' F32), the same pseudo-random values whatever
 * the dtype (each one a bfloat16, so that F32 holds it exactly), written to a fresh folder dir
 * (a mkdtemp template). */
static void write_llama(char *dir, int hidden, int n_layers, const char *dtypes) {
    ck_assert_ptr_nonnull(mkdtemp(dir));
    char path[512];
    snprintf(path, sizeof path, "%s/config.json", dir);
    FILE *f = fopen(path, "w");
    ck_assert_ptr_nonnull(f);
    fprintf(f,
            "{\"model_type\": \"llama\", \"hidden_size\": %d, \"num_attention_heads\": 8, "
            "\"num_key_value_heads\": 8, \"num_hidden_layers\": %d, "
            "\"max_position_embeddings\": 64, \"rope_theta\": 10000.0}",
            hidden, n_layers);
    fclose(f);
    static const char *const names[] = {"q_proj", "k_proj", "v_proj", "o_proj"};
    size_t n = (size_t)hidden * (size_t)hidden;
    char header[16384];
    size_t len = (size_t)snprintf(header, sizeof header, "{");
    uint64_t off = 0;
    for (int l = 0; l < n_layers; l++) {
        size_t bytes = n * (dtypes[l] == 'b' ? 2u : 4u);
        for (int t = 0; t < 4; t++, off += bytes) {
            len += (size_t)snprintf(header + len, sizeof header - len,
                                    "%s\"model.layers.%d.self_attn.%s.weight\": {\"dtype\": "
                                    "\"%s\", \"shape\": [%d, %d], \"data_offsets\": [%llu, %llu]}",
                                    l + t ? ", " : "", l, names[t],
                                    dtypes[l] == 'b' ? "BF16" : "F32", hidden, hidden,
                                    (unsigned long long)off, (unsigned long long)(off + bytes));
        }
    }
    len += (size_t)snprintf(header + len, sizeof header - len, "}");
    while (len % 8 != 0) {
        header[len++] = ' ';
    }
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    f = fopen(path, "wb");
    ck_assert_ptr_nonnull(f);
    uint64_t hl = len;
    ck_assert_int_eq(fwrite(&hl, 8, 1, f), 1); /* little-endian, as the build machine */
    ck_assert_int_eq(fwrite(header, 1, len, f), len);
    uint32_t *w = malloc(n * sizeof *w), state = 12345;
    ck_assert_ptr_nonnull(w);
    for (int k = 0; k < 4 * n_layers; k++) {
        bool is_bf16 = dtypes[k / 4] == 'b';
        for (size_t i = 0; i < n; i++) {
            state = state * 1664525u + 1013904223u;
            /* sign, exponent 2^-8 .. 2^-5, 7 mantissa bits */
            uint16_t h = (uint16_t)(((state >> 31) << 15) | ((119u + (state >> 20) % 4) << 7) |
                                    ((state >> 8) & 0x7f));
            if (is_bf16) {
                ((uint16_t *)w)[i] = h;
            } else {
                w[i] = (uint32_t)h << 16;
            }
        }
        ck_assert_int_eq(fwrite(w, is_bf16 ? 2 : 4, n, f), n);
    }
    free(w);
    fclose(f);
}

static void remove_checkpoint(const char *dir) {
    char path[512];
    snprintf(path, sizeof path, "%s/config.json", dir);
    unlink(path);
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    unlink(path);
    rmdir(dir);
}

static size_t vm_size_bytes(void) {
    FILE *f = fopen("/proc/self/status", "r");
    char line[256];
    size_t kb = 0;
    while (f != NULL && fgets(line, sizeof line, f) != NULL) {
        if (sscanf(line, "VmSize: %zu kB", &kb) == 1) {
            break;
        }
    }
    if (f != NULL) {
        fclose(f);
    }
    return kb * 1024;
}

/* A half-precision checkpoint is read in float a layer at a time and each layer held in half
 * as soon as it is read, so the load never holds more than one layer in float (for a
 * Llama-3-8B-shaped BF16 layer, 168 MB of float beside 84 MB of BF16: a 32-layer start once
 * peaked at 8 GB for 2.7 GB of weights, then at the 5.4 GB of every layer in float). Loaded
 * under an address-space limit of its half bytes, a quarter of its float bytes and a margin:
 * reading every layer in float before holding any needs its whole float bytes. */
START_TEST(test_load_half_checkpoint_peak_memory) {
    if (UNDER_ASAN) {
        /* ASan reserves terabytes of shadow memory and keeps freed blocks in quarantine, so an
         * address-space limit cannot bound the load's peak; the plain build runs this. */
        return;
    }
    char dir[] = "/tmp/attnd_check_peak_XXXXXX";
    const int hidden = 512, n_layers = 16;
    write_llama(dir, hidden, n_layers, "bbbbbbbbbbbbbbbb");
    size_t f32_bytes = (size_t)n_layers * 4 * hidden * hidden * sizeof(float);
    pid_t pid = fork();
    ck_assert_int_ge(pid, 0);
    if (pid == 0) {
        struct rlimit lim = {vm_size_bytes() + f32_bytes / 2 + f32_bytes / 4 + (8u << 20),
                             RLIM_INFINITY};
        setrlimit(RLIMIT_AS, &lim);
        attn_model *m = NULL;
        char err[256] = "";
        int rc = attn_model_load_hf(dir, NULL, &m, err, sizeof err);
        if (rc != ATTN_OK) {
            fprintf(stderr, "peak load: %s\n", err);
        }
        _exit(rc == ATTN_OK && attn_model_weights_dtype(m) == ATTN_DTYPE_BF16 ? 0 : 1);
    }
    int status = 0;
    ck_assert_int_eq(waitpid(pid, &status, 0), pid);
    remove_checkpoint(dir);
    ck_assert_msg(WIFEXITED(status) && WEXITSTATUS(status) == 0,
                  "a BF16 checkpoint of %zu float bytes did not load within 3/4 of them and a "
                  "margin",
                  f32_bytes);
}
END_TEST

/* The fingerprint and held dtype of the 4-layer checkpoint of write_llama(dtypes), loaded with
 * weights_dtype asked. */
static attn_dtype load_dtypes(const char *dtypes, attn_dtype asked,
                              uint8_t fp[ATTN_FINGERPRINT_BYTES]) {
    char dir[] = "/tmp/attnd_check_dtypes_XXXXXX";
    write_llama(dir, 64, 4, dtypes);
    attn_load_params p = {0, 0, 0, NULL, asked, NULL};
    attn_model *m = load_ok(dir, &p);
    attn_dtype held = attn_model_weights_dtype(m);
    attn_model_fingerprint(m, fp);
    attn_model_destroy(m);
    remove_checkpoint(dir);
    return held;
}

/* Layers are held in half as they are read; a checkpoint whose dtypes differ from layer to
 * layer is held in float, so the layers held before the first float one go back, exactly: the
 * same weights (fingerprint) as a float checkpoint of the same values, wherever the float layer
 * is. Asked for bf16, the same weights as a BF16 checkpoint's. */
START_TEST(test_load_mixed_dtype_checkpoint_held_exactly) {
    uint8_t all_f32[ATTN_FINGERPRINT_BYTES], all_bf16[ATTN_FINGERPRINT_BYTES];
    uint8_t fp[ATTN_FINGERPRINT_BYTES];
    ck_assert_int_eq(load_dtypes("ffff", ATTN_DTYPE_AUTO, all_f32), ATTN_DTYPE_F32);
    ck_assert_int_eq(load_dtypes("bbbb", ATTN_DTYPE_AUTO, all_bf16), ATTN_DTYPE_BF16);
    ck_assert(memcmp(all_f32, all_bf16, sizeof fp) != 0);
    static const char *const mixed[] = {"bbbf", "fbbb", "bfbb", "bbfb"};
    for (int k = 0; k < 4; k++) {
        ck_assert_int_eq(load_dtypes(mixed[k], ATTN_DTYPE_AUTO, fp), ATTN_DTYPE_F32);
        ck_assert_msg(memcmp(fp, all_f32, sizeof fp) == 0, "%s: not the float checkpoint's",
                      mixed[k]);
        ck_assert_int_eq(load_dtypes(mixed[k], ATTN_DTYPE_BF16, fp), ATTN_DTYPE_BF16);
        ck_assert_msg(memcmp(fp, all_bf16, sizeof fp) == 0, "%s as bf16: not the BF16 one's",
                      mixed[k]);
    }
    ck_assert_int_eq(load_dtypes("bbbb", ATTN_DTYPE_F32, fp), ATTN_DTYPE_F32);
    ck_assert(memcmp(fp, all_f32, sizeof fp) == 0);
}
END_TEST

/* --wrap=malloc (the Makefile's link of the check binary): the code under test's mallocs, and
 * cJSON's through its hooks, fail on demand: the nth from when mallocs_until_fail is set. */
static long mallocs_until_fail;
void *__real_malloc(size_t n);
void *__wrap_malloc(size_t n);

void *__wrap_malloc(size_t n) {
    if (mallocs_until_fail > 0 && --mallocs_until_fail == 0) {
        errno = ENOMEM;
        return NULL;
    }
    return __real_malloc(n);
}

/* Each malloc of a checkpoint's load fails in turn (cJSON's among them): the load is
 * ATTN_ENOMEM with a reason, never a malformed file. cJSON short of memory read as "not a JSON
 * object" (ATTN_EIO: config.json, the safetensors header), and three of the loader's own
 * allocations gave ATTN_ENOMEM with an empty reason. */
START_TEST(test_load_out_of_memory_is_enomem_with_a_reason) {
    static const char *const dirs[] = {DATA "hf_tiny_f32", DATA "hf_qwen2_f16",
                                       DATA "hf_tiny_bf16"};
    cJSON_Hooks hooks = {__wrap_malloc, free};
    cJSON_InitHooks(&hooks);
    for (size_t d = 0; d < sizeof dirs / sizeof dirs[0]; d++) {
        long n = 1;
        for (;; n++) {
            attn_model *m = NULL;
            char err[512] = "";
            mallocs_until_fail = n;
            int rc = attn_model_load_hf(dirs[d], NULL, &m, err, sizeof err);
            bool failed = mallocs_until_fail == 0;
            mallocs_until_fail = 0;
            if (!failed) {
                ck_assert_int_eq(rc, ATTN_OK);
                attn_model_destroy(m);
                break;
            }
            ck_assert_msg(rc == ATTN_ENOMEM && err[0] != '\0', "%s, malloc %ld: %s: '%s'", dirs[d],
                          n, attn_strerror(rc), err);
            ck_assert_ptr_null(m);
        }
        ck_assert_int_gt(n, 10);
    }
    cJSON_InitHooks(NULL);
}
END_TEST

/* `extern` keeps this prototype out of the Makefile's suite-table scan, which matches lines
 * starting with `Suite *`. */
extern Suite *load_suite(void);

Suite *load_suite(void) {
    Suite *s = suite_create("load");
    TCase *tc = tcase_create("load");
    tcase_add_test(tc, test_load_tiny_config);
    tcase_add_test(tc, test_load_out_of_memory_is_enomem_with_a_reason);
    tcase_add_test(tc, test_load_alt_config);
    tcase_add_test(tc, test_load_max_seq_override);
    tcase_add_test(tc, test_load_tiny_f32_matches_numpy);
    tcase_add_test(tc, test_load_tiny_bf16_sharded_matches_numpy);
    tcase_add_test(tc, test_load_alt_f16_matches_numpy);
    tcase_add_test(tc, test_load_qwen2_f16_matches_numpy);
    tcase_add_test(tc, test_load_qwen3_bf16_matches_numpy);
    tcase_add_test(tc, test_load_olmo2_f32_matches_numpy);
    tcase_add_test(tc, test_load_gemma2_f32_matches_numpy);
    tcase_add_test(tc, test_load_gemma3_bf16_matches_numpy);
    tcase_add_test(tc, test_load_qwen2_mixed_f32_matches_numpy);
    tcase_add_test(tc, test_load_granite_f32_matches_numpy);
    tcase_add_test(tc, test_load_phi3_bf16_matches_numpy);
    tcase_add_test(tc, test_load_rope_scalings_match_numpy);
    tcase_add_test(tc, test_load_gpt_neox_f16_matches_numpy);
    tcase_add_test(tc, test_load_falcon_layouts_match_numpy);
    tcase_add_test(tc, test_load_deepseek_matches_numpy);
    tcase_add_test(tc, test_load_moe_families_match_numpy);
    tcase_add_test(tc, test_load_gpt2_f32_matches_numpy);
    tcase_add_test(tc, test_load_norm_and_rotary_families_match_numpy);
    tcase_add_test(tc, test_load_gpt_oss_bf16_matches_numpy);
    tcase_add_test(tc, test_load_later_families_match_numpy);
    tcase_add_test(tc, test_load_layer_subset);
    tcase_add_test(tc, test_load_bad_folders);
    tcase_add_test(tc, test_load_weight_past_f16_range);
    tcase_add_test(tc, test_load_config_too_big_names_its_sizes);
    tcase_add_test(tc, test_load_safetensors_header_as_python_reads_it);
    tcase_add_test(tc, test_load_reason_buffer);
    tcase_add_test(tc, test_load_bad_params);
    tcase_add_test(tc, test_load_out_of_memory_says_so);
    tcase_add_test(tc, test_load_half_checkpoint_peak_memory);
    tcase_add_test(tc, test_load_mixed_dtype_checkpoint_held_exactly);
    suite_add_tcase(s, tc);
    return s;
}
