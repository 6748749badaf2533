/* engine/hf_config.c: reads a Hugging Face config.json into an attn_config, through the table of
 * model families the engine serves. Each family row says what its own modeling code reads: its
 * defaults, which projections carry biases, how its sliding window applies, and which of the
 * engine's generic fields (partial rotary, rope_style) it may set. A family the engine does not
 * serve, and any config field that would change attention in a way the engine does not compute,
 * is refused by name (ATTN_EUNSUPPORTED) rather than served approximately. Tensor screening (every
 * attention tensor must be consumed) is hf_load.c's, from the layout this file fills in.
 */
#include "hf_int.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- the family table (its row type is in hf_int.h) ---------------------------------------- */

static int gemma2_extra(const struct attn__reason *why, const cJSON *j, attn_config *c);
static int granite_extra(const struct attn__reason *why, const cJSON *j, attn_config *c);
static int gemma3_extra(const struct attn__reason *why, const cJSON *j, attn_config *c);
static int gpt2_extra(const struct attn__reason *why, const cJSON *j, attn_config *c);
static int falcon_extra(const struct attn__reason *why, const cJSON *j, attn_config *c);
static int deepseek_extra(const struct attn__reason *why, const cJSON *j, attn_config *c);
static int mixtral_extra(const struct attn__reason *why, const cJSON *j, attn_config *c);
static int qwen2_moe_extra(const struct attn__reason *why, const cJSON *j, attn_config *c);
static int qwen3_moe_extra(const struct attn__reason *why, const cJSON *j, attn_config *c);
static int smollm3_extra(const struct attn__reason *why, const cJSON *j, attn_config *c);
static int olmo_extra(const struct attn__reason *why, const cJSON *j, attn_config *c);
static const struct family *family_find(const char *model_type);

static const char *const gpt2_keys[] = {"n_embd", "n_head", "n_layer", "n_positions"};
/* GPT2Config.attribute_map: the standard names set the same four (the later one applied wins). */
static const char *const gpt2_aliases[] = {"hidden_size", "num_attention_heads",
                                           "num_hidden_layers", "max_position_embeddings"};
static const char *const stablelm_reads[] = {"qk_layernorm", NULL};
static const char *const phi_reads[] = {"qk_layernorm", NULL};
static const char *const cohere_reads[] = {"use_qk_norm", NULL};
static const char *const cohere2_reads[] = {"layer_types", "sliding_window_pattern", NULL};
static const char *const neox_reads[] = {"rotary_pct", NULL};
static const char *const deepseek_v3_reads[] = {"rope_interleave", NULL};
/* FalconConfig.attribute_map: the original checkpoints' n_head / n_layer. */
static const char *const falcon_aliases[] = {NULL, "n_head", "n_layer", NULL};

static const char *const qwen_reads[] = {"layer_types", NULL};
static const char *const smollm3_reads[] = {"no_rope_layers", "layer_types", NULL};
static const char *const olmo_reads[] = {"clip_qkv", NULL};
static const char *const granite_reads[] = {"attention_multiplier", NULL};
static const char *const gemma2_reads[] = {"layer_types", "attn_logit_softcapping",
                                           "query_pre_attn_scalar", NULL};
static const char *const gemma3_reads[] = {
    "layer_types",          "attn_logit_softcapping", "query_pre_attn_scalar",
    "rope_local_base_freq", "sliding_window_pattern", NULL};

/* Served exactly, each against an fp64 reference written from its modeling code
 * (tests/gen_fixtures.py). */
static const struct family families[] = {
    {.model_type = "llama", .bias = BIAS_IF_ATTENTION_BIAS, .window = WINDOW_NOT_READ},
    {.model_type = "mistral",
     .default_kv_heads = 8,
     .default_window = 4096,
     .bias = BIAS_NONE,
     .window = WINDOW_ALL},
    /* Mixtral: Mistral's attention (MixtralAttention is MistralAttention) with MixtralConfig's
     * defaults: 8 KV heads, theta 1e6, no window when absent; rope_scaling, which the releases
     * that introduced Mixtral never read, is refused. block_sparse_moe.* is not read. */
    {.model_type = "mixtral",
     .default_kv_heads = 8,
     .bias = BIAS_NONE,
     .window = WINDOW_ALL,
     .default_theta = 1e6f,
     .read_extra = mixtral_extra},
    {.model_type = "qwen2",
     .default_kv_heads = 32,
     .default_window = 4096,
     .bias = BIAS_QKV,
     .window = WINDOW_QWEN2,
     .reads = qwen_reads},
    /* StarCoder2: Mistral's window on every layer (none when absent), biases on q/k/v/o iff
     * use_bias (true when absent), 2 KV heads when absent; transformers 4.38 took head_dim from
     * hidden_size and rotated without rope_scaling. */
    {.model_type = "starcoder2",
     .default_kv_heads = 2,
     .bias = BIAS_IF_ATTENTION_BIAS,
     .bias_flag = "use_bias",
     .default_attention_bias = true,
     .window = WINDOW_ALL,
     .is_head_dim_derived = true,
     .is_scaling_unread = true},
    /* Qwen3: Qwen2's window rule, Llama's bias rule, RMSNorm of each head of q and k. */
    {.model_type = "qwen3",
     .default_kv_heads = 32,
     .default_head_dim = 128,
     .default_window = 4096,
     .bias = BIAS_IF_ATTENTION_BIAS,
     .window = WINDOW_QWEN2,
     .qk_norm = ATTN_QK_NORM_HEAD,
     .default_norm_eps = 1e-6f,
     .reads = qwen_reads},
    /* Qwen3-MoE: Qwen3's attention (Qwen3MoeAttention is Qwen3Attention: biases iff
     * attention_bias, RMSNorm of each head of q and k, eps rms_norm_eps), 4 KV heads and
     * hidden_size / heads as head_dim when absent; with use_sliding_window, releases differ on
     * which layers slide (refused). The MoE block (mlp.*) is not attention and is not read. */
    {.model_type = "qwen3_moe",
     .default_kv_heads = 4,
     .bias = BIAS_IF_ATTENTION_BIAS,
     .window = WINDOW_NOT_READ,
     .qk_norm = ATTN_QK_NORM_HEAD,
     .default_norm_eps = 1e-6f,
     .has_own_window_rule = true,
     .read_extra = qwen3_moe_extra},
    /* Qwen2-MoE (Qwen1.5-MoE, Qwen2-57B-A14B): Qwen2's attention, q/k/v biases (qkv_bias) and
     * never o, 16 KV heads when absent; use_sliding_window, qkv_bias false and a head_dim other
     * than hidden_size / heads are read differently by transformers releases (refused). The MoE
     * block (mlp.gate, mlp.experts.*, mlp.shared_expert*) is not read. */
    {.model_type = "qwen2_moe",
     .default_kv_heads = 16,
     .bias = BIAS_QKV,
     .window = WINDOW_NOT_READ,
     .has_own_window_rule = true,
     .read_extra = qwen2_moe_extra},
    /* OLMo (1): Llama's attention with clip_qkv's clamp of q, k and v; transformers 4.40 took
     * head_dim from hidden_size. */
    {.model_type = "olmo",
     .bias = BIAS_IF_ATTENTION_BIAS,
     .window = WINDOW_NOT_READ,
     .reads = olmo_reads,
     .read_extra = olmo_extra,
     .is_head_dim_derived = true},
    /* OLMo 2: RMSNorm over the whole q and k projections, before the split into heads. */
    {.model_type = "olmo2",
     .bias = BIAS_IF_ATTENTION_BIAS,
     .window = WINDOW_NOT_READ,
     .qk_norm = ATTN_QK_NORM_WIDTH,
     .default_norm_eps = 1e-5f},
    /* Granite: Llama's attention with attention_multiplier as the softmax scale. */
    {.model_type = "granite",
     .bias = BIAS_IF_ATTENTION_BIAS,
     .window = WINDOW_NOT_READ,
     .reads = granite_reads,
     .read_extra = granite_extra},
    /* Granite MoE (granite-3.0 a400m / a800m, PowerMoE): Granite's attention
     * (GraniteMoeAttention is LlamaAttention with attention_multiplier as the scale); the experts
     * (block_sparse_moe.*) are not read. */
    {.model_type = "granitemoe",
     .bias = BIAS_IF_ATTENTION_BIAS,
     .window = WINDOW_NOT_READ,
     .reads = granite_reads,
     .read_extra = granite_extra},
    /* Gemma (1): Llama's attention with GemmaConfig's defaults (16 KV heads, head_dim 256);
     * transformers 4.38's GemmaRotaryEmbedding did not read rope_scaling. */
    {.model_type = "gemma",
     .default_kv_heads = 16,
     .default_head_dim = 256,
     .bias = BIAS_IF_ATTENTION_BIAS,
     .window = WINDOW_NOT_READ,
     .is_scaling_unread = true},
    /* Gemma 2: query_pre_attn_scalar, soft-capped scores, local (even) and global layers. */
    {.model_type = "gemma2",
     .default_kv_heads = 4,
     .default_head_dim = 256,
     .default_window = 4096,
     .bias = BIAS_IF_ATTENTION_BIAS,
     .window = WINDOW_GEMMA2,
     .reads = gemma2_reads,
     .read_extra = gemma2_extra},
    /* Gemma 3 (text): Gemma's q/k RMSNorm per head, 5 local layers to 1 global, local RoPE. */
    {.model_type = "gemma3_text",
     .class_defaults = {2304, 8, 26, 131072}, /* Gemma3TextConfig's */
     .default_kv_heads = 4,
     .default_head_dim = 256,
     .default_window = 4096,
     .bias = BIAS_IF_ATTENTION_BIAS,
     .window = WINDOW_GEMMA3,
     .qk_norm = ATTN_QK_NORM_HEAD,
     .default_norm_eps = 1e-6f,
     .default_theta = 1e6f,
     .is_norm_one_plus = true,
     .reads = gemma3_reads,
     .read_extra = gemma3_extra},
    /* Gemma 3 multimodal checkpoints: the text model's config and tensors, nested. */
    {.model_type = "gemma3", .text_config_of = "gemma3_text"},
    /* Phi-3 / 3.5 / 4-mini: a fused qkv_proj, partial rotary, the window on every layer. */
    {.model_type = "phi3",
     .bias = BIAS_NONE,
     .window = WINDOW_ALL,
     .tensors = ATTN__HF_FUSED_QKV,
     .rotary = ROTARY_PARTIAL,
     .has_legacy_scaling_names = true,
     .longrope_original = 4096},
    /* Phi (1, 1.5, 2): q_proj / k_proj / v_proj and dense, all with biases, partial rotary (0.5
     * when absent), and with qk_layernorm one LayerNorm (weight and bias) for every head of q and
     * one for k; transformers 4.37 took head_dim from hidden_size. */
    {.model_type = "phi",
     .bias = BIAS_ALL,
     .window = WINDOW_NOT_READ,
     .qk_norm = ATTN_QK_NORM_HEAD_LAYERNORM_BIAS,
     .qk_norm_flag = "qk_layernorm",
     .norm_eps_key = "layer_norm_eps",
     .default_norm_eps = 1e-5f,
     .norms = ATTN__HF_NORM_LAYERNORM,
     .reads = phi_reads,
     .tensors = ATTN__HF_DENSE,
     .rotary = ROTARY_PARTIAL,
     .default_partial = 0.5,
     .is_head_dim_derived = true},
    /* GPT-NeoX / Pythia: per-head fused query_key_value, biases, a quarter of each head
     * rotated. */
    {.model_type = "gpt_neox",
     .bias = BIAS_IF_ATTENTION_BIAS,
     .default_attention_bias = true,
     .window = WINDOW_NOT_READ,
     .tensors = ATTN__HF_NEOX,
     .attn_name = "attention",
     .prefixes = {"gpt_neox.layers", "layers"},
     .rotary = ROTARY_PARTIAL_NEOX,
     .theta_alias = "rotary_emb_base",
     .reads = neox_reads},
    /* Falcon: one fused query_key_value in the layout of its three attentions (multi_query,
     * new_decoder_architecture, or one K/V head per query head), whole-head RoPE, biases on
     * query_key_value and dense iff bias; alibi is refused (screened). */
    {.model_type = "falcon",
     .bias = BIAS_IF_ATTENTION_BIAS,
     .bias_flag = "bias",
     .window = WINDOW_NOT_READ,
     .tensors = ATTN__HF_FALCON,
     .attn_name = "self_attention",
     .prefixes = {"transformer.h", "h"},
     .key_aliases = falcon_aliases,
     .read_extra = falcon_extra},
    /* GPT-2: Conv1D projections, biases, no rotary embedding, scale_attn_weights. */
    {.model_type = "gpt2",
     .bias = BIAS_ALL,
     .window = WINDOW_NOT_READ,
     .tensors = ATTN__HF_GPT2,
     .attn_name = "attn",
     .prefixes = {"transformer.h", "h"},
     .keys = gpt2_keys,
     .key_aliases = gpt2_aliases,
     .rotary = ROTARY_NONE,
     .read_extra =
         gpt2_extra}, /* StableLM 2: a quarter of each head rotated, q/k/v biases with use_qkv_bias,
                       * and with qk_layernorm a LayerNorm per head, each with its own weight. */
    {.model_type = "stablelm",
     .default_kv_heads = 32,
     .bias = BIAS_QKV_IF_FLAG,
     .bias_flag = "use_qkv_bias",
     .window = WINDOW_NOT_READ,
     .qk_norm = ATTN_QK_NORM_HEAD_LAYERNORM,
     .qk_norm_flag = "qk_layernorm",
     .norm_eps_key = "layer_norm_eps",
     .default_norm_eps = 1e-5f,
     .norms = ATTN__HF_NORM_PER_HEAD_LIST,
     .rotary = ROTARY_PARTIAL,
     .default_partial = 0.25,
     .reads = stablelm_reads},
    /* Cohere / Command-R: interleaved rotary, and with use_qk_norm a LayerNorm per head whose
     * weight is a (heads, head_dim) matrix. */
    {.model_type = "cohere",
     .bias = BIAS_IF_ATTENTION_BIAS,
     .window = WINDOW_NOT_READ,
     .qk_norm = ATTN_QK_NORM_HEAD_LAYERNORM,
     .qk_norm_flag = "use_qk_norm",
     .norm_eps_key = "layer_norm_eps",
     .default_norm_eps = 1e-5f,
     .norms = ATTN__HF_NORM_MATRIX,
     .rope_style = ATTN_ROPE_STYLE_INTERLEAVED,
     .reads = cohere_reads},
    /* Cohere 2 (Command R7B, Command A): 3 sliding layers with interleaved RoPE to 1 full layer
     * without positions (sliding_window_pattern 4, or layer_types); biases iff attention_bias. */
    {.model_type = "cohere2",
     .default_window = 4096,
     .bias = BIAS_IF_ATTENTION_BIAS,
     .window = WINDOW_GEMMA3,
     .default_pattern = 4,
     .rope_style = ATTN_ROPE_STYLE_INTERLEAVED,
     .rope_sliding_only = true,
     .reads = cohere2_reads},
    /* GLM-4 (glm: GLM-4-9B; glm4: GLM-4-0414): half of each head rotated, interleaved; q/k/v
     * biases with attention_bias, o never. */
    {.model_type = "glm",
     .default_kv_heads = 2,
     .default_head_dim = 128,
     .bias = BIAS_QKV_IF_FLAG,
     .window = WINDOW_NOT_READ,
     .rotary = ROTARY_PARTIAL,
     .default_partial = 0.5,
     .rope_style = ATTN_ROPE_STYLE_INTERLEAVED},
    {.model_type = "glm4",
     .default_kv_heads = 2,
     .default_head_dim = 128,
     .bias = BIAS_QKV_IF_FLAG,
     .window = WINDOW_NOT_READ,
     .rotary = ROTARY_PARTIAL,
     .default_partial = 0.5,
     .rope_style = ATTN_ROPE_STYLE_INTERLEAVED},
    /* gpt-oss: learned sinks, sliding (even) and full layers, biases, yarn (configuration_gpt_oss
     * defaults: 8 KV heads, head_dim 64, window 128, theta 150000, yarn 32 over 4096 with an
     * unrounded ramp). */
    {.model_type = "gpt_oss",
     .default_kv_heads = 8,
     .default_head_dim = 64,
     .default_window = 128,
     .bias = BIAS_IF_ATTENTION_BIAS,
     .default_attention_bias = true,
     .window = WINDOW_GEMMA2,
     .reads = qwen_reads,
     .default_theta = 150000.0f,
     .has_sinks = true,
     .default_rope_scaling = "{\"rope_type\":\"yarn\",\"factor\":32.0,\"beta_fast\":32.0,"
                             "\"beta_slow\":1.0,\"truncate\":false,"
                             "\"original_max_position_embeddings\":4096}"},
    /* DeepSeek-V2 / V3 (and Kimi-K2): multi-head latent attention, RoPE on qk_rope_head_dim
     * dims in interleaved pairs (V2's complex rotary; V3's rope_interleave, true when absent),
     * biases on q_a_proj / kv_a_proj_with_mqa / o_proj iff attention_bias; the softmax scale
     * grows by yarn's mscale(factor, mscale_all_dim)^2. The MoE experts are not read. */
    {.model_type = "deepseek_v2",
     .bias = BIAS_IF_ATTENTION_BIAS,
     .window = WINDOW_NOT_READ,
     .tensors = ATTN__HF_MLA,
     .rope_style = ATTN_ROPE_STYLE_INTERLEAVED,
     .read_extra = deepseek_extra},
    {.model_type = "deepseek_v3",
     .bias = BIAS_IF_ATTENTION_BIAS,
     .window = WINDOW_NOT_READ,
     .tensors = ATTN__HF_MLA,
     .rope_style = ATTN_ROPE_STYLE_INTERLEAVED,
     .reads = deepseek_v3_reads,
     .read_extra = deepseek_extra},
    /* SmolLM3: Llama's attention (biases iff attention_bias) with layers that attend without
     * positions (no_rope_layers' 0s), use_sliding_window's window on the layers layer_types
     * names (smollm3_extra reads both); 4 KV heads and theta 2e6 when absent. */
    {.model_type = "smollm3",
     .default_kv_heads = 4,
     .default_theta = 2000000.0f,
     .bias = BIAS_IF_ATTENTION_BIAS,
     .window = WINDOW_NOT_READ,
     .has_own_window_rule = true,
     .reads = smollm3_reads,
     .read_extra = smollm3_extra},
    /* attnd's own layout: the engine's generic attention with every field explicit. */
    {.model_type = "attnd",
     .bias = BIAS_AS_THE_TENSORS_SAY,
     .window = WINDOW_ALL,
     .rotary = ROTARY_ENGINE_FIELDS},
};

/* Families known by name and not served yet, with why. */
static const struct {
    const char *model_type;
    const char *reason;
} unserved[] = {
    {"llama4", "its attention needs chunked attention and layers without RoPE"},
};

#define SERVED_LIST                                                                                \
    "llama, mistral, mixtral, qwen2, qwen2_moe, qwen3, qwen3_moe, olmo, olmo2, granite, "          \
    "granitemoe, starcoder2, gemma, gemma2, gemma3, phi3, phi, gpt_neox, falcon, gpt2, "           \
    "stablelm, cohere, cohere2, glm, glm4, gpt_oss, deepseek_v2, deepseek_v3, kimi_k2, smollm3, "  \
    "attnd"

/* Fields that change attention, which none of the served families computes: refused unless they
 * hold their neutral value (absent, null, false, 0, or what is named). */
enum neutral {
    NEUTRAL_NULL,     /* absent or null */
    NEUTRAL_FALSE,    /* absent, null or false */
    NEUTRAL_TRUE,     /* absent, null or true */
    NEUTRAL_ONE,      /* absent, null or 1 */
    NEUTRAL_ROPE,     /* absent, null or "rope" */
    NEUTRAL_ALL_FULL, /* absent, null, or a list of "full_attention" only */
};

struct screen {
    const char *field;
    enum neutral neutral;
};

static const struct screen screened[] = {
    {"attn_logit_softcapping", NEUTRAL_NULL},
    {"query_pre_attn_scalar", NEUTRAL_NULL},
    {"rope_local_base_freq", NEUTRAL_NULL},
    {"sliding_window_pattern", NEUTRAL_NULL},
    {"attention_multiplier", NEUTRAL_NULL},
    {"clip_qkv", NEUTRAL_NULL},
    {"attention_chunk_size", NEUTRAL_NULL},
    {"no_rope_layers", NEUTRAL_NULL},
    {"nope_layer_interval", NEUTRAL_NULL},
    {"use_qk_norm", NEUTRAL_FALSE},
    {"qk_layernorm", NEUTRAL_FALSE},
    {"qk_norm", NEUTRAL_FALSE},
    {"alibi", NEUTRAL_FALSE},
    {"use_logn_attn", NEUTRAL_FALSE},
    {"logn_attn", NEUTRAL_FALSE},
    {"attn_temperature_tuning", NEUTRAL_FALSE},
    {"use_bidirectional_attention", NEUTRAL_FALSE},
    {"rotary_pct", NEUTRAL_ONE},
    {"scale_attn_by_inverse_layer_idx", NEUTRAL_FALSE},
    {"layer_types", NEUTRAL_ALL_FULL},
};

/* Fields the served families read as a window, a theta, a scale, causality, a K/V layout or a
 * rotation, and Llama's config ignores. A checkpoint served by --trust-layout llama is another
 * model, whose attention such a field most likely changes: refused there unless neutral. */
static const struct screen trusted_screened[] = {
    {"sliding_window", NEUTRAL_NULL},     {"use_sliding_window", NEUTRAL_FALSE},
    {"rotary_emb_base", NEUTRAL_NULL},    {"position_embedding_type", NEUTRAL_ROPE},
    {"scale_attn_weights", NEUTRAL_TRUE}, {"softmax_scale", NEUTRAL_NULL},
    {"attn_scale", NEUTRAL_NULL},         {"attention_scale", NEUTRAL_NULL},
    {"is_causal", NEUTRAL_TRUE},          {"causal", NEUTRAL_TRUE},
    {"multi_query", NEUTRAL_FALSE},       {"new_decoder_architecture", NEUTRAL_FALSE},
    {"n_head_kv", NEUTRAL_NULL},          {"num_kv_heads", NEUTRAL_NULL},
    {"kv_lora_rank", NEUTRAL_NULL},       {"q_lora_rank", NEUTRAL_NULL},
    {"qk_rope_head_dim", NEUTRAL_NULL},   {"rope_interleave", NEUTRAL_FALSE},
    {"rope_type", NEUTRAL_NULL},          {"no_rope_layer_interval", NEUTRAL_NULL},
    {"use_bias", NEUTRAL_FALSE},
};

/* ---- family rules ------------------------------------------------------------------------------
 */

static bool is_neutral(const cJSON *v, enum neutral n) {
    if (v == NULL || cJSON_IsNull(v)) {
        return true;
    }
    switch (n) {
    case NEUTRAL_NULL:
        return false;
    case NEUTRAL_FALSE:
        return cJSON_IsFalse(v);
    case NEUTRAL_TRUE:
        return cJSON_IsTrue(v);
    case NEUTRAL_ROPE:
        return cJSON_IsString(v) && strcmp(v->valuestring, "rope") == 0;
    case NEUTRAL_ONE:
        return cJSON_IsNumber(v) && v->valuedouble == 1.0;
    case NEUTRAL_ALL_FULL: {
        if (!cJSON_IsArray(v)) {
            return false;
        }
        const cJSON *e;
        cJSON_ArrayForEach(e, v) {
            if (!cJSON_IsString(e) || strcmp(e->valuestring, "full_attention") != 0) {
                return false;
            }
        }
        return true;
    }
    }
    return false;
}

/* Every screened field holds its neutral value, except the ones the family reads itself; and
 * for a trusted layout every field other families read. */
static int screen_fields(const struct attn__reason *why, const cJSON *j, const struct family *f,
                         bool is_trusted) {
    for (size_t i = 0; is_trusted && i < sizeof trusted_screened / sizeof trusted_screened[0];
         i++) {
        const cJSON *v = cJSON_GetObjectItemCaseSensitive(j, trusted_screened[i].field);
        if (!is_neutral(v, trusted_screened[i].neutral)) {
            return attn__fail(why, ATTN_EUNSUPPORTED,
                              "config.json: %s changes other families' attention, and "
                              "--trust-layout llama does not compute it; refused rather than "
                              "served wrong",
                              trusted_screened[i].field);
        }
    }
    for (size_t i = 0; i < sizeof screened / sizeof screened[0]; i++) {
        const char *name = screened[i].field;
        bool is_read = false;
        for (size_t r = 0; f->reads != NULL && f->reads[r] != NULL; r++) {
            is_read |= strcmp(f->reads[r], name) == 0;
        }
        if (is_read) {
            continue; /* the family computes it */
        }
        if (!is_neutral(cJSON_GetObjectItemCaseSensitive(j, name), screened[i].neutral)) {
            return attn__fail(why, ATTN_EUNSUPPORTED,
                              "config.json: %s changes %s attention in a way attnd does not "
                              "compute; refused rather than served wrong",
                              name, f->model_type);
        }
    }
    return ATTN_OK;
}

/* layer_types, when the config lists them: each layer's kind into c->is_full_layer. *n_sliding
 * gets the count of sliding layers, or -1 when the field is absent. */
static int read_layer_types(const struct attn__reason *why, const cJSON *j, attn_config *c,
                            int32_t *n_sliding) {
    const cJSON *types = cJSON_GetObjectItemCaseSensitive(j, "layer_types");
    *n_sliding = -1;
    if (types == NULL || cJSON_IsNull(types)) {
        return ATTN_OK;
    }
    if (!cJSON_IsArray(types) || cJSON_GetArraySize(types) != c->n_layers) {
        return attn__fail(why, ATTN_EIO,
                          "config.json: layer_types must list num_hidden_layers kinds");
    }
    int32_t i = 0, n = 0;
    const cJSON *e;
    cJSON_ArrayForEach(e, types) {
        const char *kind = cJSON_IsString(e) ? e->valuestring : "";
        bool is_sliding = strcmp(kind, "sliding_attention") == 0;
        if (!is_sliding && strcmp(kind, "full_attention") != 0) {
            return attn__fail(why, ATTN_EUNSUPPORTED,
                              "config.json: layer_types holds '%.40s' (full_attention and "
                              "sliding_attention are served)",
                              kind);
        }
        c->is_full_layer[i++] = !is_sliding;
        n += is_sliding;
    }
    *n_sliding = n;
    return ATTN_OK;
}

/* sliding_window, or the family's default when absent; null is none. One that applies
 * (is_used) must be >= 1: the modeling code takes any value but None as a window. */
static int read_window(const struct attn__reason *why, const cJSON *j, const struct family *f,
                       bool is_used, int32_t *window) {
    *window = f->default_window;
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(j, "sliding_window");
    if (v == NULL) {
        return ATTN_OK;
    }
    *window = 0;
    int rc = attn__hf_get_int(why, j, "sliding_window", window);
    if (rc == ATTN_OK && is_used && !cJSON_IsNull(v) && *window < 1) {
        return attn__fail(why, ATTN_EIO,
                          "config.json: sliding_window must be >= 1 (null for none)");
    }
    return rc;
}

/* A sliding_window the family's attention never reads: transformers' DynamicCache(config) (v4.56
 * on; the models build theirs from their config) still makes every layer's cache a sliding one,
 * which keeps the last sliding_window tokens, so a decode step sees only those where earlier
 * releases (and the same release's prefill) see every key. Refused when it could bind, a window
 * shorter than the positions served; null, 0 (read as none) or a longer one change nothing. */
static int refuse_stray_window(const struct attn__reason *why, const cJSON *j,
                               const struct family *f, int32_t max_seq) {
    int32_t window = 0;
    int rc = attn__hf_get_int(why, j, "sliding_window", &window);
    if (rc == ATTN_OK && window != 0 && window < max_seq) {
        return attn__fail(why, ATTN_EUNSUPPORTED,
                          "config.json: sliding_window %d: %s attention does not read it, but "
                          "transformers since 4.56 keeps only that many tokens in a decode's "
                          "cache (DynamicCache) while earlier releases attend to every key; "
                          "refused rather than served as one of them (null, or a window of at "
                          "least the %d positions served, is served as full attention)",
                          window, f->model_type, max_seq);
    }
    return rc;
}

/* Which layers slide, by the family's rule (configuration_*.py), unless layer_types lists them.
 * max_seq: the positions served (max_position_embeddings, or --max-seq). */
static int parse_window(const struct attn__reason *why, const cJSON *j, const struct family *f,
                        int32_t max_seq, attn_config *c) {
    int32_t window = 0, n_sliding = -1, max_window_layers = 28;
    int32_t pattern = f->default_pattern > 0 ? f->default_pattern : 6;
    bool use = false;
    int rc;
    if (f->window == WINDOW_NOT_READ) {
        return f->has_own_window_rule ? ATTN_OK : refuse_stray_window(why, j, f, max_seq);
    }
    if (f->window == WINDOW_QWEN2 &&
        ((rc = attn__hf_get_bool(why, j, "use_sliding_window", &use)) != ATTN_OK ||
         (rc = attn__hf_get_int(why, j, "max_window_layers", &max_window_layers)) != ATTN_OK)) {
        return rc;
    }
    if ((rc = read_window(why, j, f, f->window != WINDOW_QWEN2 || use, &window)) != ATTN_OK) {
        return rc;
    }
    if (f->window == WINDOW_QWEN2) {
        /* configuration_qwen2.py: without use_sliding_window there is no window at all. */
        window = use ? window : 0;
    }
    if (f->window != WINDOW_ALL && (rc = read_layer_types(why, j, c, &n_sliding)) != ATTN_OK) {
        return rc;
    }
    if (f->window == WINDOW_GEMMA3 &&
        (rc = attn__hf_get_int(why, j, "sliding_window_pattern", &pattern)) != ATTN_OK) {
        return rc;
    }
    if (pattern < 1) {
        return attn__fail(why, ATTN_EIO, "config.json: sliding_window_pattern must be >= 1");
    }
    if (n_sliding > 0 && window == 0) {
        return attn__fail(why, ATTN_EIO,
                          "config.json: layer_types has sliding layers but no sliding_window");
    }
    for (int32_t i = 0; n_sliding < 0 && i < c->n_layers; i++) {
        bool is_sliding = true; /* WINDOW_ALL */
        if (f->window == WINDOW_QWEN2) {
            is_sliding = i >= max_window_layers;
        } else if (f->window == WINDOW_GEMMA2) {
            is_sliding = (i + 1) % 2 != 0;
        } else if (f->window == WINDOW_GEMMA3) {
            is_sliding = (i + 1) % pattern != 0;
        }
        c->is_full_layer[i] = !is_sliding;
    }
    c->sliding_window = window;
    return ATTN_OK;
}

/* modeling_granite.py: self.scaling = config.attention_multiplier (1.0 when absent), in place
 * of head_dim^-1/2. */
static int granite_extra(const struct attn__reason *why, const cJSON *j, attn_config *c) {
    float multiplier = 1.0f;
    int rc = attn__hf_get_float(why, j, "attention_multiplier", &multiplier);
    if (rc == ATTN_OK && !(multiplier > 0)) {
        return attn__fail(why, ATTN_EIO, "config.json: attention_multiplier must be > 0");
    }
    c->softmax_scale = multiplier;
    return rc;
}

/* use_sliding_window true: the MoE Qwens' releases disagree on which layers slide (Qwen2-MoE:
 * v4's flash attention those from max_window_layers on, v5's layer_types the even ones below
 * it; Qwen3-MoE: v4.51 those from max_window_layers on, later releases every layer). Refused,
 * naming the fields; false (the default, and every published checkpoint's) is no window in all
 * of them. */
static int refuse_moe_window(const struct attn__reason *why, const cJSON *j, const char *family) {
    bool use = false;
    int rc = attn__hf_get_bool(why, j, "use_sliding_window", &use);
    if (rc == ATTN_OK && use) {
        return attn__fail(why, ATTN_EUNSUPPORTED,
                          "config.json: %s with use_sliding_window true: transformers versions "
                          "differ on which layers slide (max_window_layers, layer_types); refused "
                          "rather than served as one of them",
                          family);
    }
    return rc;
}

/* configuration_qwen3_moe.py / modeling_qwen3_moe.py: Qwen3's attention, no window. */
static int qwen3_moe_extra(const struct attn__reason *why, const cJSON *j, attn_config *c) {
    (void)c;
    return refuse_moe_window(why, j, "qwen3_moe");
}

/* configuration_qwen2_moe.py / modeling_qwen2_moe.py: q/k/v biases with qkv_bias (true when
 * absent; added in March 2025, huggingface/transformers#36735: the releases before it always
 * have them, so false is refused), and head_dim hidden_size / heads (v4's attention takes that,
 * raising on another head_dim where it reads one; v5's LlamaAttention reads head_dim: refused). */
static int qwen2_moe_extra(const struct attn__reason *why, const cJSON *j, attn_config *c) {
    bool qkv_bias = true;
    int rc = refuse_moe_window(why, j, "qwen2_moe");
    if (rc != ATTN_OK || (rc = attn__hf_get_bool(why, j, "qkv_bias", &qkv_bias)) != ATTN_OK) {
        return rc;
    }
    if (!qkv_bias) {
        return attn__fail(why, ATTN_EUNSUPPORTED,
                          "config.json: qwen2_moe with qkv_bias false: transformers releases "
                          "since 2025 drop the q/k/v biases, earlier ones always have them; "
                          "refused rather than served as one of them");
    }
    if ((int64_t)c->head_dim * c->n_heads != c->hidden_size) {
        return attn__fail(why, ATTN_EUNSUPPORTED,
                          "config.json: qwen2_moe head_dim %d is not hidden_size / "
                          "num_attention_heads (%d / %d): transformers v4 attends with the "
                          "latter (or raises), v5 with head_dim; refused rather than served as "
                          "one of them",
                          c->head_dim, c->hidden_size, c->n_heads);
    }
    return ATTN_OK;
}

/* modeling_mixtral.py: the releases that introduced Mixtral built its rotary embedding from
 * rope_theta alone (MixtralConfig had no rope_scaling), later ones through the config like
 * Llama's, so a scaling other than "default" means two models. */
static int mixtral_extra(const struct attn__reason *why, const cJSON *j, attn_config *c) {
    (void)c;
    const cJSON *rs = cJSON_GetObjectItemCaseSensitive(j, "rope_scaling");
    if (rs == NULL || cJSON_IsNull(rs)) {
        return ATTN_OK;
    }
    const cJSON *type = cJSON_GetObjectItemCaseSensitive(rs, "rope_type");
    if (type == NULL) {
        type = cJSON_GetObjectItemCaseSensitive(rs, "type");
    }
    if (cJSON_IsObject(rs) && cJSON_IsString(type) && strcmp(type->valuestring, "default") == 0) {
        return ATTN_OK;
    }
    return attn__fail(why, ATTN_EUNSUPPORTED,
                      "config.json: mixtral with rope_scaling: the transformers releases that "
                      "introduced Mixtral ignore it, later ones apply it; refused rather than "
                      "served as one of them");
}

/* modeling_gpt2.py: scores are divided by sqrt(head_dim) only when scale_attn_weights (true
 * when absent). */
static int gpt2_extra(const struct attn__reason *why, const cJSON *j, attn_config *c) {
    if (c->n_kv_heads != c->n_heads) {
        /* GPT2Config has no such field and its attention one K/V head per query head: a config
         * that names fewer is not the model transformers runs from it */
        return attn__fail(why, ATTN_EUNSUPPORTED,
                          "config.json: num_key_value_heads %d: gpt2 attention has one K/V head "
                          "per query head (n_head %d)",
                          c->n_kv_heads, c->n_heads);
    }
    bool scale = true;
    int rc = attn__hf_get_bool(why, j, "scale_attn_weights", &scale);
    c->softmax_scale = scale ? 0.0f : 1.0f; /* 0: the engine's head_dim^-1/2 */
    return rc;
}

/* modeling_falcon.py: head_dim is hidden_size / num_attention_heads (no head_dim field); the
 * K/V heads are num_kv_heads (n_head_kv; num_attention_heads when absent) with
 * new_decoder_architecture, else 1 with multi_query (true when absent), else one per query head. */
static int falcon_extra(const struct attn__reason *why, const cJSON *j, attn_config *c) {
    bool new_arch = false, multi_query = true;
    int32_t kv = -1;
    int rc;
    if ((rc = attn__hf_get_bool(why, j, "new_decoder_architecture", &new_arch)) != ATTN_OK ||
        (rc = attn__hf_get_bool(why, j, "multi_query", &multi_query)) != ATTN_OK ||
        (rc = attn__hf_get_int_either(why, j, "num_kv_heads", "n_head_kv", &kv)) != ATTN_OK) {
        return rc;
    }
    if (c->head_dim * c->n_heads != c->hidden_size) {
        return attn__fail(why, ATTN_ESHAPE,
                          "config.json: falcon attention has head_dim = hidden_size / "
                          "num_attention_heads (%d / %d), not %d",
                          c->hidden_size, c->n_heads, c->head_dim);
    }
    if (new_arch) {
        c->n_kv_heads = kv >= 0 ? kv : c->n_heads;
    } else if (multi_query) {
        c->n_kv_heads = 1;
    } else {
        c->n_kv_heads = c->n_heads;
        if (kv >= 0 && kv != c->n_heads) {
            /* _split_heads gives one K/V head per query head here: any other count fails there. */
            return attn__fail(why, ATTN_ESHAPE,
                              "config.json: falcon without multi_query or "
                              "new_decoder_architecture has one K/V head per query head, not "
                              "num_kv_heads %d",
                              kv);
        }
    }
    if (c->n_kv_heads <= 0 || c->n_heads % c->n_kv_heads != 0) {
        return attn__fail(why, ATTN_ESHAPE,
                          "config.json: num_kv_heads (%d) must divide num_attention_heads (%d)",
                          c->n_kv_heads, c->n_heads);
    }
    return ATTN_OK;
}

/* modeling_olmo.py: `if self.config.clip_qkv is not None`, the q, k and v projections are
 * clamp_(min=-clip_qkv, max=clip_qkv). */
static int olmo_extra(const struct attn__reason *why, const cJSON *j, attn_config *c) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(j, "clip_qkv");
    if (v == NULL || cJSON_IsNull(v)) {
        return ATTN_OK;
    }
    int rc = attn__hf_get_float(why, j, "clip_qkv", &c->clip_qkv);
    if (rc == ATTN_OK && !(c->clip_qkv > 0)) {
        /* 0 would zero q, k and v (and is the engine's "none"); OLMo's own code asserts > 0 */
        return attn__fail(why, ATTN_EIO, "config.json: clip_qkv must be > 0 (null for none)");
    }
    return rc;
}

/* configuration_smollm3.py: layer i rotates iff no_rope_layers[i] (1 or 0, at least
 * num_hidden_layers of them; when null, every no_rope_layer_interval-th layer (4) is NoPE), as
 * SmolLM3Attention's `if self.use_rope` reads it. */
static int smollm3_nope_layers(const struct attn__reason *why, const cJSON *j, attn_config *c) {
    const cJSON *list = cJSON_GetObjectItemCaseSensitive(j, "no_rope_layers");
    if (list == NULL || cJSON_IsNull(list)) {
        int32_t interval = 4;
        int rc = attn__hf_get_int(why, j, "no_rope_layer_interval", &interval);
        if (rc == ATTN_OK && interval < 1) {
            rc = attn__fail(why, ATTN_EIO, "config.json: no_rope_layer_interval must be >= 1");
        }
        for (int32_t i = 0; rc == ATTN_OK && i < c->n_layers; i++) {
            c->is_nope_layer[i] = (i + 1) % interval == 0;
        }
        return rc;
    }
    if (!cJSON_IsArray(list) || cJSON_GetArraySize(list) < c->n_layers) {
        return attn__fail(why, ATTN_EIO,
                          "config.json: no_rope_layers must list 1 (RoPE) or 0 (none) for each of "
                          "the num_hidden_layers layers");
    }
    int32_t i = 0;
    const cJSON *e;
    cJSON_ArrayForEach(e, list) {
        if (i == c->n_layers) {
            break; /* entries past the layers are never read */
        }
        if (!cJSON_IsNumber(e) || (e->valuedouble != 0 && e->valuedouble != 1)) {
            return attn__fail(why, ATTN_EIO,
                              "config.json: no_rope_layers[%d] must be 1 (RoPE) or 0 (none)",
                              (int)i);
        }
        c->is_nope_layer[i++] = e->valuedouble == 0;
    }
    return ATTN_OK;
}

/* SmolLM3's windows: layer_types, when null the NoPE layers if use_sliding_window and
 * sliding_window are set (configuration_smollm3.py), name the layers whose mask slides;
 * SmolLM3Attention passes sliding_window to the attention only with use_sliding_window. A sliding
 * layer without use_sliding_window is sliding in eager and sdpa attention (the mask) and not in
 * flash attention (no window passed): refused. */
static int smollm3_window(const struct attn__reason *why, const cJSON *j, const struct family *f,
                          attn_config *c) {
    bool use = false;
    int32_t window = 0, n_sliding = -1;
    int rc;
    if ((rc = attn__hf_get_bool(why, j, "use_sliding_window", &use)) != ATTN_OK ||
        (rc = read_window(why, j, f, use, &window)) != ATTN_OK ||
        (rc = read_layer_types(why, j, c, &n_sliding)) != ATTN_OK) {
        return rc;
    }
    if (n_sliding < 0) {
        n_sliding = 0;
        for (int32_t i = 0; i < c->n_layers; i++) {
            bool is_sliding = use && window > 0 && c->is_nope_layer[i];
            c->is_full_layer[i] = !is_sliding;
            n_sliding += is_sliding;
        }
    } else if (n_sliding > 0 && !use) {
        return attn__fail(why, ATTN_EUNSUPPORTED,
                          "config.json: layer_types names sliding_attention layers but "
                          "use_sliding_window is false: transformers' eager and sdpa attention "
                          "slide them (the mask follows layer_types), its flash attention does "
                          "not (SmolLM3Attention passes no window)");
    }
    if (n_sliding > 0 && window == 0) {
        return attn__fail(why, ATTN_EIO,
                          "config.json: layer_types has sliding layers but no sliding_window");
    }
    c->sliding_window = n_sliding > 0 ? window : 0;
    return ATTN_OK;
}

static int smollm3_extra(const struct attn__reason *why, const cJSON *j, attn_config *c) {
    int rc = smollm3_nope_layers(why, j, c);
    return rc != ATTN_OK ? rc : smollm3_window(why, j, family_find("smollm3"), c);
}

/* configuration_deepseek_v3.py (V2's alike): the MLA dimensions, q_lora_rank null for a plain
 * q_proj, one latent instead of KV heads, head_dim the score's (its config field is the rotary
 * dims, which qk_rope_head_dim restates). */
static int deepseek_extra(const struct attn__reason *why, const cJSON *j, attn_config *c) {
    int rc;
    if (c->n_kv_heads != c->n_heads) {
        /* modeling_deepseek: the latent expands to one K/V head per query head, and repeat_kv
         * by heads / num_key_value_heads would then repeat them again: no model runs so */
        return attn__fail(why, ATTN_EUNSUPPORTED,
                          "config.json: num_key_value_heads %d: multi-head latent attention has "
                          "one K/V head per query head (num_attention_heads %d)",
                          c->n_kv_heads, c->n_heads);
    }
    c->q_lora_rank = 1536;
    c->kv_lora_rank = 512;
    c->qk_nope_head_dim = 128;
    c->qk_rope_head_dim = 64;
    c->v_head_dim = 128;
    /* not rms_norm_eps: modeling_deepseek_v3 (and V2) builds q_a_layernorm and kv_a_layernorm
     * without the config's eps, so they keep the RMSNorm default, as DeepSeek's own inference
     * code does; rms_norm_eps is the decoder's other norms' */
    c->mla_norm_eps = 1e-6f;
    const cJSON *ql = cJSON_GetObjectItemCaseSensitive(j, "q_lora_rank");
    if (ql != NULL && cJSON_IsNull(ql)) {
        c->q_lora_rank = 0;
    } else if ((rc = attn__hf_get_int(why, j, "q_lora_rank", &c->q_lora_rank)) != ATTN_OK) {
        return rc;
    }
    if ((rc = attn__hf_get_int(why, j, "kv_lora_rank", &c->kv_lora_rank)) != ATTN_OK ||
        (rc = attn__hf_get_int(why, j, "qk_nope_head_dim", &c->qk_nope_head_dim)) != ATTN_OK ||
        (rc = attn__hf_get_int(why, j, "qk_rope_head_dim", &c->qk_rope_head_dim)) != ATTN_OK ||
        (rc = attn__hf_get_int(why, j, "v_head_dim", &c->v_head_dim)) != ATTN_OK) {
        return rc;
    }
    if (c->kv_lora_rank <= 0) {
        return attn__fail(why, ATTN_EIO, "config.json: kv_lora_rank must be > 0");
    }
    /* 0 is not null: the modeling code's `if self.q_lora_rank is None` builds a zero-rank
     * q_a_proj for it, never q_proj; the engine's 0 means q_proj, so refuse rather than serve it */
    if (ql == NULL || !cJSON_IsNull(ql)) {
        if (c->q_lora_rank <= 0) {
            return attn__fail(why, ATTN_EIO,
                              "config.json: q_lora_rank must be > 0 (null for a plain q_proj)");
        }
    }
    c->n_kv_heads = 1;
    c->head_dim = c->qk_nope_head_dim + c->qk_rope_head_dim;
    return ATTN_OK;
}

/* After the rotary embedding is read: V3's rope_interleave false rotates halves, and yarn's
 * mscale_all_dim grows the softmax scale by its mscale squared (modeling_deepseek_v3, and every
 * version of DeepSeek's own modeling_deepseek.py). transformers' DeepseekV2Attention leaves the
 * scale at qk_head_dim^-1/2, so a deepseek_v2 config where the two differ means two attentions:
 * refused unless modeling_code says whose (an outside audit found the V3 rule served for V2). */
static int deepseek_finish(const struct attn__reason *why, const cJSON *j, const struct family *f,
                           const char *modeling_code, attn_config *c) {
    bool interleave = true;
    int rc = f->reads == deepseek_v3_reads
                 ? attn__hf_get_bool(why, j, "rope_interleave", &interleave)
                 : ATTN_OK;
    if (rc != ATTN_OK) {
        return rc;
    }
    c->rope_style = interleave ? ATTN_ROPE_STYLE_INTERLEAVED : ATTN_ROPE_STYLE_HALF;
    double scale = 1.0 / sqrt((double)c->head_dim);
    const attn_rope_scaling *rs = &c->rope_scaling;
    /* transformers' yarn_get_mscale: 1 at factor <= 1; any mscale_all_dim but 0 applies */
    if (rs->type != ATTN_ROPE_SCALING_NONE && rs->mscale_all_dim != 0 && rs->factor > 1) {
        double m = 0.1 * rs->mscale_all_dim * log((double)rs->factor) + 1.0;
        bool is_v2 = f->reads != deepseek_v3_reads;
        if (is_v2 && modeling_code == NULL) {
            return attn__fail(why, ATTN_EUNSUPPORTED,
                              "config.json: deepseek_v2 with rope_scaling.mscale_all_dim %g: "
                              "DeepSeek's modeling_deepseek.py (and vLLM) scale the softmax by "
                              "qk_head_dim^-1/2 x %.6g, transformers' DeepseekV2Attention by "
                              "qk_head_dim^-1/2 alone; say whose with --modeling-code checkpoint "
                              "or transformers",
                              (double)rs->mscale_all_dim, m * m);
        }
        if (!is_v2 || strcmp(modeling_code, "checkpoint") == 0) {
            scale *= m * m;
        }
    }
    c->softmax_scale = (float)scale;
    return ATTN_OK;
}

/* Gemma's softmax scale: query_pre_attn_scalar^-1/2 (256 when absent), not head_dim's. */
static int gemma_scale(const struct attn__reason *why, const cJSON *j, attn_config *c) {
    float scalar = 256.0f;
    int rc = attn__hf_get_float(why, j, "query_pre_attn_scalar", &scalar);
    if (rc != ATTN_OK) {
        return rc;
    }
    if (!(scalar > 0)) {
        return attn__fail(why, ATTN_EIO, "config.json: query_pre_attn_scalar must be > 0");
    }
    c->softmax_scale = (float)(1.0 / sqrt((double)scalar));
    return ATTN_OK;
}

/* The score soft-cap: `def_cap` when absent, none when null. */
static int gemma_softcap(const struct attn__reason *why, const cJSON *j, float def_cap,
                         attn_config *c) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(j, "attn_logit_softcapping");
    c->logit_softcap = v == NULL ? def_cap : 0; /* null: none */
    if (v == NULL || cJSON_IsNull(v)) {
        return ATTN_OK;
    }
    int rc = attn__hf_get_float(why, j, "attn_logit_softcapping", &c->logit_softcap);
    if (rc == ATTN_OK && !(c->logit_softcap > 0)) {
        /* the modeling code caps whenever it is not None: 0 divides by zero */
        return attn__fail(why, ATTN_EIO,
                          "config.json: attn_logit_softcapping must be > 0 (null for none)");
    }
    return rc;
}

/* configuration_gemma2.py: the cap defaults to 50. */
static int gemma2_extra(const struct attn__reason *why, const cJSON *j, attn_config *c) {
    int rc = gemma_scale(why, j, c);
    return rc != ATTN_OK ? rc : gemma_softcap(why, j, 50.0f, c);
}

/* configuration_gemma3.py: no cap by default; local layers rotate with rope_local_base_freq
 * (10000) and no scaling, global ones with rope_theta and rope_scaling. */
static int gemma3_extra(const struct attn__reason *why, const cJSON *j, attn_config *c) {
    int rc;
    c->rope_theta_local = 10000.0f;
    if ((rc = gemma_scale(why, j, c)) != ATTN_OK ||
        (rc = gemma_softcap(why, j, 0.0f, c)) != ATTN_OK ||
        (rc = attn__hf_get_float(why, j, "rope_local_base_freq", &c->rope_theta_local)) !=
            ATTN_OK) {
        return rc;
    }
    if (!(c->rope_theta_local > 1.0f)) {
        return attn__fail(why, ATTN_EIO, "config.json: rope_local_base_freq must be > 1");
    }
    return ATTN_OK;
}

static int parse_bias(const struct attn__reason *why, const cJSON *j, const struct family *f,
                      attn_config *c, struct attn__hf_layout *lay) {
    bool attention_bias = f->default_attention_bias;
    int rc = attn__hf_get_bool(why, j, f->bias_flag != NULL ? f->bias_flag : "attention_bias",
                               &attention_bias);
    if (rc != ATTN_OK) {
        return rc;
    }
    lay->has_biases_from_tensors = false;
    switch (f->bias) {
    case BIAS_NONE:
        c->has_qkv_bias = c->has_o_bias = false;
        break;
    case BIAS_ALL:
        c->has_qkv_bias = c->has_o_bias = true;
        break;
    case BIAS_IF_ATTENTION_BIAS:
        c->has_qkv_bias = c->has_o_bias = attention_bias;
        break;
    case BIAS_QKV:
        c->has_qkv_bias = true;
        c->has_o_bias = false;
        break;
    case BIAS_QKV_IF_FLAG:
        c->has_qkv_bias = attention_bias;
        c->has_o_bias = false;
        break;
    case BIAS_AS_THE_TENSORS_SAY:
        /* hf_load.c looks; attention_bias then only insists on q/k/v biases. */
        lay->has_biases_from_tensors = true;
        lay->wants_qkv_bias = attention_bias;
        break;
    }
    return ATTN_OK;
}

/* ---- the family -------------------------------------------------------------------------------
 */

static const struct family *family_find(const char *model_type) {
    for (size_t i = 0; i < sizeof families / sizeof families[0]; i++) {
        if (strcmp(families[i].model_type, model_type) == 0) {
            return &families[i];
        }
    }
    return NULL;
}

/* model_types whose checkpoints ship another family's modeling code: read by that family's
 * rules, served under their own name. */
static const struct {
    const char *model_type, *read_as;
} aliases[] = {
    /* Kimi-K2: DeepSeek-V3's code as its remote code, architectures DeepseekV3ForCausalLM */
    {"kimi_k2", "deepseek_v3"},
};

/* The family whose rules apply; lay->family gets the name served. */
static int pick_family(const struct attn__reason *why, const cJSON *j, const char *trust_layout,
                       const struct family **out, bool *is_trusted, struct attn__hf_layout *lay) {
    *is_trusted = false;
    const cJSON *mt = cJSON_GetObjectItemCaseSensitive(j, "model_type");
    if (mt != NULL && !cJSON_IsString(mt)) {
        return attn__fail(why, ATTN_EIO, "config.json: model_type must be a string");
    }
    const char *name = mt != NULL ? mt->valuestring : NULL;
    const struct family *f = name != NULL ? family_find(name) : NULL;
    for (size_t i = 0; name != NULL && f == NULL && i < sizeof aliases / sizeof aliases[0]; i++) {
        f = strcmp(aliases[i].model_type, name) == 0 ? family_find(aliases[i].read_as) : NULL;
    }
    if (f != NULL) {
        snprintf(lay->family, sizeof lay->family, "%s", name);
        *out = f;
        return ATTN_OK;
    }
    for (size_t i = 0; name != NULL && i < sizeof unserved / sizeof unserved[0]; i++) {
        if (strcmp(unserved[i].model_type, name) == 0) {
            return attn__fail(
                why, ATTN_EUNSUPPORTED,
                "config.json: model_type '%s' is not served yet (%s); served: " SERVED_LIST, name,
                unserved[i].reason);
        }
    }
    if (trust_layout != NULL && strcmp(trust_layout, "llama") == 0) {
        snprintf(lay->family, sizeof lay->family, "llama (trusted layout of %.40s)",
                 name != NULL ? name : "a config without model_type");
        attn__make_one_line(lay->family);
        *out = family_find("llama");
        *is_trusted = true;
        return ATTN_OK;
    }
    if (trust_layout != NULL) {
        return attn__fail(why, ATTN_EINVAL, "trust layout '%s': only 'llama' can be trusted",
                          trust_layout);
    }
    if (name == NULL) {
        return attn__fail(why, ATTN_EUNSUPPORTED,
                          "config.json has no model_type: refused (served: " SERVED_LIST
                          "; --trust-layout llama serves it as Llama attention, you vouching "
                          "for it)");
    }
    return attn__fail(why, ATTN_EUNSUPPORTED,
                      "config.json: unknown model_type '%s': refused (served: " SERVED_LIST
                      "; --trust-layout llama serves it as Llama attention, you vouching for "
                      "it)",
                      name);
}

static int parse_config(const struct attn__reason *why, const cJSON *j, const attn_load_params *p,
                        attn_config *c, struct attn__hf_layout *lay) {
    memset(c, 0, sizeof *c);
    memset(lay, 0, sizeof *lay);
    const struct family *f = NULL;
    bool is_trusted = false;
    int rc = pick_family(why, j, p->trust_layout, &f, &is_trusted, lay);
    if (rc != ATTN_OK) {
        return rc;
    }
    lay->prefixes[0] = "model.layers";
    lay->prefixes[1] = "layers"; /* saved from the bare model, not ...ForCausalLM */
    if (f->text_config_of != NULL) {
        /* A multimodal checkpoint: the text model's own config, and its tensors under the
         * language model (both spellings transformers has saved). */
        j = cJSON_GetObjectItemCaseSensitive(j, "text_config");
        if (!cJSON_IsObject(j)) {
            return attn__fail(why, ATTN_EIO, "config.json: model_type %s needs a text_config",
                              f->model_type);
        }
        f = family_find(f->text_config_of);
        lay->prefixes[0] = "language_model.model.layers";
        lay->prefixes[1] = "model.language_model.layers";
    }
    if ((rc = screen_fields(why, j, f, is_trusted)) != ATTN_OK) {
        return rc;
    }
    lay->is_norm_one_plus = f->is_norm_one_plus;
    c->has_sinks = f->has_sinks;
    c->rope_sliding_only = f->rope_sliding_only;
    lay->tensors = f->tensors;
    lay->attn_name = f->attn_name != NULL ? f->attn_name : "self_attn";
    if (f->prefixes[0] != NULL) {
        lay->prefixes[0] = f->prefixes[0];
        lay->prefixes[1] = f->prefixes[1];
    }
    static const char *const standard_keys[] = {"hidden_size", "num_attention_heads",
                                                "num_hidden_layers", "max_position_embeddings"};
    const char *const *key = f->keys != NULL ? f->keys : standard_keys;
    c->rope_theta = f->default_theta;
    c->hidden_size = f->class_defaults[0];
    c->n_heads = f->class_defaults[1];
    c->n_layers = f->class_defaults[2];
    int32_t max_pos = f->class_defaults[3];
    static const char *const no_aliases[4] = {NULL, NULL, NULL, NULL};
    const char *const *alias = f->key_aliases != NULL ? f->key_aliases : no_aliases;
    if ((rc = attn__hf_get_int_either(why, j, key[0], alias[0], &c->hidden_size)) != ATTN_OK ||
        (rc = attn__hf_get_int_either(why, j, key[1], alias[1], &c->n_heads)) != ATTN_OK ||
        (rc = attn__hf_get_int_either(why, j, key[2], alias[2], &c->n_layers)) != ATTN_OK ||
        (rc = attn__hf_get_int_either(why, j, key[3], alias[3], &max_pos)) != ATTN_OK ||
        (rc = attn__hf_get_int(why, j, "head_dim", &c->head_dim)) != ATTN_OK) {
        return rc;
    }
    if (c->head_dim == 0 && cJSON_GetObjectItemCaseSensitive(j, "head_dim") == NULL) {
        c->head_dim = f->default_head_dim; /* 0 stays: hidden_size / heads, below */
    }
    bool has_norm = f->qk_norm != ATTN_QK_NORM_NONE;
    if (has_norm && f->qk_norm_flag != NULL) {
        has_norm = false;
        if ((rc = attn__hf_get_bool(why, j, f->qk_norm_flag, &has_norm)) != ATTN_OK) {
            return rc;
        }
    }
    c->qk_norm = has_norm ? f->qk_norm : ATTN_QK_NORM_NONE;
    lay->norms = f->norms;
    if (has_norm) {
        const char *eps_key = f->norm_eps_key != NULL ? f->norm_eps_key : "rms_norm_eps";
        c->qk_norm_eps = f->default_norm_eps;
        if ((rc = attn__hf_get_float(why, j, eps_key, &c->qk_norm_eps)) != ATTN_OK) {
            return rc;
        }
        if (!(c->qk_norm_eps > 0)) {
            return attn__fail(why, ATTN_EIO, "config.json: %s must be > 0", eps_key);
        }
    }
    if (c->hidden_size <= 0 || c->n_heads <= 0 || c->n_layers <= 0) {
        return attn__fail(why, ATTN_EIO, "config.json: %s, %s and %s are required and must be > 0",
                          key[0], key[1], key[2]);
    }
    if (c->n_layers > ATTN_MAX_LAYERS) {
        return attn__fail(why, ATTN_EUNSUPPORTED, "config.json: %d layers, attnd serves %d at most",
                          c->n_layers, ATTN_MAX_LAYERS);
    }
    /* An absent field takes the family's default; an explicit null means one per query head. */
    bool has_kv_field = cJSON_GetObjectItemCaseSensitive(j, "num_key_value_heads") != NULL;
    c->n_kv_heads = f->default_kv_heads > 0 && !has_kv_field ? f->default_kv_heads : c->n_heads;
    if ((rc = attn__hf_get_int(why, j, "num_key_value_heads", &c->n_kv_heads)) != ATTN_OK) {
        return rc;
    }
    if (c->n_kv_heads <= 0 || c->n_heads % c->n_kv_heads != 0) {
        return attn__fail(why, ATTN_ESHAPE,
                          "config.json: num_key_value_heads (%d) must divide "
                          "num_attention_heads (%d)",
                          c->n_kv_heads, c->n_heads);
    }
    c->max_seq = max_pos > 0 ? max_pos : 4096;
    if (c->head_dim == 0) {
        if (c->hidden_size % c->n_heads != 0) {
            return attn__fail(why, ATTN_ESHAPE,
                              "config.json: hidden_size %% num_attention_heads != 0 "
                              "and no head_dim given");
        }
        c->head_dim = c->hidden_size / c->n_heads;
    }
    if (f->is_head_dim_derived &&
        (c->hidden_size % c->n_heads != 0 || c->head_dim != c->hidden_size / c->n_heads)) {
        return attn__fail(why, ATTN_EUNSUPPORTED,
                          "config.json: head_dim %d is not hidden_size / num_attention_heads "
                          "(%d / %d), which transformers' first %s releases use in its place: "
                          "versions differ on which applies",
                          c->head_dim, c->hidden_size, c->n_heads, f->model_type);
    }
    if ((rc = parse_window(why, j, f, p->max_seq > 0 ? p->max_seq : c->max_seq, c)) != ATTN_OK ||
        (rc = parse_bias(why, j, f, c, lay)) != ATTN_OK ||
        (f->read_extra != NULL && (rc = f->read_extra(why, j, c)) != ATTN_OK)) {
        return rc;
    }
    if ((rc = attn__hf_parse_rope(why, j, f, c)) != ATTN_OK) {
        return rc;
    }
    return f->tensors == ATTN__HF_MLA ? deepseek_finish(why, j, f, p->modeling_code, c) : ATTN_OK;
}

/* Parses config.json text; see attn_int.h. */
static int compare_names(const void *a, const void *b) {
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

/* A key written twice means two values: cJSON would read the first and Python's json module,
 * which Hugging Face uses, the last, so attnd would serve another model than the checkpoint's.
 * Refused, in every object of the file (sorting the names keeps a large object linear-log). */
static int refuse_repeated_keys(const struct attn__reason *why, const cJSON *node) {
    int32_t n = 0;
    for (const cJSON *it = node->child; it != NULL; it = it->next) {
        n++;
    }
    if (n == 0) {
        return ATTN_OK;
    }
    int rc = ATTN_OK;
    if (cJSON_IsObject(node)) {
        const char **names = malloc((size_t)n * sizeof *names);
        if (names == NULL) {
            return attn__fail(why, ATTN_ENOMEM, "config.json: out of memory");
        }
        int32_t i = 0;
        for (const cJSON *it = node->child; it != NULL; it = it->next) {
            names[i++] = it->string != NULL ? it->string : "";
        }
        qsort(names, (size_t)n, sizeof *names, compare_names);
        for (i = 1; i < n && rc == ATTN_OK; i++) {
            if (strcmp(names[i - 1], names[i]) == 0) {
                rc = attn__fail(why, ATTN_EIO,
                                "config.json: key \"%.64s\" appears twice in one object", names[i]);
            }
        }
        free(names);
    }
    for (const cJSON *it = node->child; it != NULL && rc == ATTN_OK; it = it->next) {
        rc = refuse_repeated_keys(why, it);
    }
    return rc;
}

int attn__hf_config_parse(const char *json, size_t len, const attn_load_params *p, attn_config *cfg,
                          struct attn__hf_layout *layout, char *err, size_t err_size) {
    const struct attn__reason why = {err, err_size};
    static const attn_load_params defaults = {0};
    p = p != NULL ? p : &defaults;
    if (p->modeling_code != NULL && strcmp(p->modeling_code, "transformers") != 0 &&
        strcmp(p->modeling_code, "checkpoint") != 0) {
        return attn__fail(&why, ATTN_EINVAL, "modeling code '%s': transformers or checkpoint",
                          p->modeling_code);
    }
    const char *problem = NULL;
    cJSON *j = attn__hf_json_object(json, len, &problem);
    if (j == NULL) {
        return attn__fail(&why, problem == attn__hf_json_no_memory ? ATTN_ENOMEM : ATTN_EIO,
                          "config.json: %s", problem);
    }
    attn_config c;
    struct attn__hf_layout lay;
    int rc = refuse_repeated_keys(&why, j);
    if (rc == ATTN_OK) {
        rc = parse_config(&why, j, p, &c, &lay);
    }
    cJSON_Delete(j);
    if (rc == ATTN_OK) {
        attn_config checked = c;
        const char *invalid = NULL;
        if ((rc = attn__config_check_why(&checked, &invalid)) != ATTN_OK) {
            attn__fail(&why, rc, "config.json: %s", invalid);
        }
    }
    if (rc == ATTN_OK) {
        *cfg = c;
        *layout = lay;
    }
    return rc;
}
