/* engine/attn.h: the only public header of the attention engine (build/libattn.a).
 *
 * Computes a transformer attention block (fused QKV projection, RoPE, grouped-query attention
 * over a paged KV cache, output projection) and stateless scaled-dot-product attention. The
 * engine knows nothing of HTTP, JSON, sessions or threads: it returns error codes, never logs,
 * and allocates only in the create functions.
 *
 * Thread rule for the whole API: an attn_model is immutable after create and may be shared by
 * any number of threads. An attn_workspace is used by one thread at a time. The block accounting
 * of an attn_kv_pool (every attn_kv_* and attn_kv_pool_* call) is touched by one thread at a
 * time. attn_forward touches that accounting only when a step needs new blocks; when every step's
 * blocks were taken beforehand with attn_kv_reserve, it only writes those caches, so forwards on
 * different caches may run on other threads while the pool's thread creates, reserves, truncates
 * or destroys other caches.
 */
#ifndef ENGINE_ATTN_H
#define ENGINE_ATTN_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* ---- errors --------------------------------------------------------------------------------- */

enum attn_status {
    ATTN_OK = 0,
    ATTN_EINVAL = -1,       /* an argument is invalid (NULL, negative, unknown name) */
    ATTN_ENOMEM = -2,       /* a heap allocation failed */
    ATTN_ERANGE = -3,       /* a position or length is past capacity (max_seq, cache length) */
    ATTN_ESHAPE = -4,       /* a dimension does not match the model or the other tensors */
    ATTN_EIO = -5,          /* a model file is missing, unreadable, malformed or inconsistent */
    ATTN_ENOSPC = -6,       /* the KV pool has no free blocks: free some caches and retry */
    ATTN_EUNSUPPORTED = -7, /* the model uses a feature the engine does not implement */
    ATTN_ECANCELED = -8,    /* the caller's cancel check said stop; outputs are incomplete */
    ATTN_EDROPPED = -9,     /* a sliding layer's cache no longer holds the tokens this needs */
    ATTN_EOVERFLOW = -10,   /* a key or value is past the range of the KV cache's dtype */
};

/* Returns a static, human-readable string for an attn_status code ("unknown error" otherwise). */
const char *attn_strerror(int code);

/* ---- configuration ------------------------------------------------------------------------- */

typedef enum attn_rope_style {
    ATTN_ROPE_STYLE_HALF = 0,        /* Llama / HF rotate_half: pairs (i, i + rotary_dim/2) */
    ATTN_ROPE_STYLE_INTERLEAVED = 1, /* RoFormer / GPT-J: pairs (2i, 2i + 1) */
} attn_rope_style;

typedef enum attn_rope_scaling_type {
    ATTN_ROPE_SCALING_NONE = 0,
    ATTN_ROPE_SCALING_LINEAR = 1, /* inv_freq /= factor */
    ATTN_ROPE_SCALING_LLAMA3 = 2, /* Llama 3.1's wavelength-dependent interpolation */
    /* YaRN: each frequency a blend of inv_freq / factor and inv_freq, ramping over the dims
     * whose rotations in original_max_position lie between beta_slow and beta_fast; cos and sin
     * are multiplied by attention_factor (gpt-oss, Qwen2.5 long context, DeepSeek's mscale). */
    ATTN_ROPE_SCALING_YARN = 3,
    /* LongRoPE (Phi-3 128k, Phi-4-mini): inv_freq[i] / short_factor[i], or / long_factor[i] for
     * the tokens of a call whose highest position is >= original_max_position; cos and sin
     * times attention_factor. */
    ATTN_ROPE_SCALING_LONGROPE = 4,
    /* Dynamic NTK: the tokens of a call whose highest position p is >= original_max_position
     * rotate with theta * (factor * (p + 1) / original - (factor - 1))^(d / (d - 2)), d the
     * rotary dims; other calls with theta. Cached keys keep the rotation they were written with,
     * as in transformers' cache. */
    ATTN_ROPE_SCALING_DYNAMIC = 5,
} attn_rope_scaling_type;

/* Frequencies a LongRoPE factor list may hold (rotary_dim / 2 of them); also the most rotary
 * dims / 2 dynamic NTK computes per call. */
#define ATTN_MAX_ROPE_FACTORS 256

typedef struct attn_rope_scaling {
    attn_rope_scaling_type type;
    float factor;           /* linear, llama3, yarn, dynamic: > 0; longrope: the context ratio
                               max_position_embeddings / original, for attention_factor only */
    float low_freq_factor;  /* llama3 */
    float high_freq_factor; /* llama3; must be > low_freq_factor */
    /* llama3, yarn, longrope: original_max_position_embeddings; dynamic: max_position_embeddings
     * (the context past which theta grows) */
    int32_t original_max_position;
    /* yarn, longrope: cos and sin are multiplied by it; 0 = derived as transformers does (yarn:
     * 0.1 ln(factor) + 1, or with mscale and mscale_all_dim their ratio of that form; longrope:
     * sqrt(1 + ln(factor) / ln(original_max_position)), 1 when factor <= 1). */
    float attention_factor;
    float beta_fast;            /* yarn: 0 = 32 */
    float beta_slow;            /* yarn: 0 = 1 */
    float mscale;               /* yarn: 0 = none */
    float mscale_all_dim;       /* yarn: 0 = none */
    bool yarn_fractional_range; /* yarn: truncate = false (gpt-oss) keeps the ramp's ends as
                                   computed; false floors and ceils them */
    float short_factor[ATTN_MAX_ROPE_FACTORS]; /* longrope: rotary_dim / 2 values, > 0 */
    float long_factor[ATTN_MAX_ROPE_FACTORS];
} attn_rope_scaling;

/* Layers a model may have at most (attn_config.is_full_layer has one entry per layer). */
#define ATTN_MAX_LAYERS 512

typedef enum attn_qk_norm {
    ATTN_QK_NORM_NONE = 0,
    /* RMSNorm of each head's head_dim values of q and of k, before RoPE, with one weight of
     * head_dim values for q and one for k, shared by the heads (Qwen3):
     * y = w * x / sqrt(mean(x^2) + eps). */
    ATTN_QK_NORM_HEAD = 1,
    /* The same RMSNorm over the whole q projection (n_heads * head_dim values) and the whole k
     * projection (n_kv_heads * head_dim), with weights of those widths, before the split into
     * heads (OLMo 2). */
    ATTN_QK_NORM_WIDTH = 2,
    /* LayerNorm without bias of each head's head_dim values, each head with its own weight of
     * head_dim values (q: n_heads * head_dim weights, k: n_kv_heads * head_dim), before RoPE
     * (StableLM 2's qk_layernorm, Cohere's use_qk_norm):
     * y = w_h * (x - mean(x)) / sqrt(mean((x - mean(x))^2) + eps). */
    ATTN_QK_NORM_HEAD_LAYERNORM = 3,
    /* LayerNorm with a weight and a bias of each head's head_dim values, one weight and one bias
     * of head_dim values for q and one for k, shared by the heads, before RoPE (Phi's
     * qk_layernorm): y = w * (x - mean(x)) / sqrt(mean((x - mean(x))^2) + eps) + b. */
    ATTN_QK_NORM_HEAD_LAYERNORM_BIAS = 4,
} attn_qk_norm;

/* What a layer's attention computes. */
typedef enum attn_layer_kind {
    ATTN_LAYER_SOFTMAX = 0, /* softmax attention over a KV cache */
    /* Linear attention (seed 004 3.7): phi = elu + 1, causal, no RoPE, no scale: token i gets
     * phi(q_i) S_i / (phi(q_i) . z_i + 1e-6), S_i = sum_{j <= i} phi(k_j)^T v_j and z_i = sum
     * phi(k_j), per KV head. Its cache is that running state, O(1) in the length; it has no
     * weights to return, and cannot forget tokens. No window, soft-cap or sinks. */
    ATTN_LAYER_LINEAR = 1,
} attn_layer_kind;

/* The geometry shared by every layer of a model. Zero-valued optional fields take the defaults
 * noted below when the config is passed through attn_config_check(). */
typedef struct attn_config {
    int32_t n_layers;    /* layers in the model (the loaded ones are a sub-range) */
    int32_t hidden_size; /* model width */
    int32_t n_heads;     /* query heads */
    int32_t n_kv_heads;  /* key/value heads; divides n_heads (== n_heads: MHA, 1: MQA) */
    int32_t head_dim;    /* 0 = hidden_size / n_heads */
    int32_t rotary_dim;  /* dims of each head that RoPE rotates, even, <= head_dim;
                            0 = head_dim; -1 = no RoPE at all */
    float rope_theta;    /* 0 = 10000; inv_freq[i] = theta^(-2i / rotary_dim) */
    attn_rope_style rope_style;
    attn_rope_scaling rope_scaling;
    int32_t max_seq;        /* positions 0 .. max_seq-1 are valid; also the cache capacity */
    int32_t sliding_window; /* 0 = none; else query at cache index i sees key j iff i - j < W
                               (HF Mistral semantics: W keys including itself) */
    bool has_qkv_bias;      /* q/k/v projections have biases */
    bool has_o_bias;        /* the output projection has a bias */
    float softmax_scale;    /* 0 = 1 / sqrt(head_dim) */
    attn_qk_norm qk_norm;   /* q/k normalization before RoPE */
    float qk_norm_eps;      /* its epsilon; 0 = 1e-6 */
    float clip_qkv;         /* 0 = none; else every value of the q, k and v projections (biases
                               added) is clamped to [-clip_qkv, clip_qkv], before the q/k norm
                               and RoPE (OLMo's clip_qkv) */
    float logit_softcap;    /* 0 = none; else each score s, after the softmax scale, becomes
                               cap * tanh(s / cap) before the mask (Gemma 2) */
    /* Learned attention sinks (gpt-oss): each query head h of each layer has a logit sink_h
     * that joins every softmax's denominator, unscaled and never masked:
     * p_j = exp(s_j) / (sum_k exp(s_k) + exp(sink_h)). The weights returned sum to less than 1
     * by the sink's share. */
    bool has_sinks;
    /* Only sliding layers rotate; full layers attend without positions (Cohere 2's global
     * layers: NoPE). */
    bool rope_sliding_only;
    /* Per absolute layer: true makes it attend without positions, its q and k unrotated
     * whatever its kind (SmolLM3's no_rope_layers 0s: NoPE). Unused past n_layers. */
    bool is_nope_layer[ATTN_MAX_LAYERS];
    float rope_theta_local; /* 0 = every layer rotates with rope_theta and rope_scaling; else the
                               sliding layers rotate with this theta and no scaling (Gemma 3) */
    /* Per absolute layer: true makes it a full-attention layer even when sliding_window is set
     * (the global layers of Gemma 2 / 3, Qwen2's layers below max_window_layers); false, the
     * default, lets sliding_window apply. Unused past n_layers. */
    bool is_full_layer[ATTN_MAX_LAYERS];
    /* Per absolute layer: what its attention computes (ATTN_LAYER_SOFTMAX by default). */
    attn_layer_kind layer_kind[ATTN_MAX_LAYERS];
    /* Multi-head latent attention (seed 003; DeepSeek-V2 / V3) on every layer when
     * kv_lora_rank > 0. A token's latent is c = RMSNorm(x W_kva)[:kv_lora_rank] (weight
     * kv_a_norm, eps mla_norm_eps) and its shared rotated key k_rot = RoPE((x W_kva)[kv_lora:]);
     * head h's key is [W_UK_h c | k_rot] and its value W_UV_h c, W_UK_h and W_UV_h being head
     * h's qk_nope_head_dim and v_head_dim rows of W_kvb; its query [q_nope | RoPE(q_rot)] comes
     * from x W_q, or with q_lora_rank > 0 from RMSNorm(x W_qa) W_qb. Then head_dim (the score's
     * dims, whose -1/2 power is the default softmax_scale) must be qk_nope_head_dim +
     * qk_rope_head_dim (0 fills it), rotary_dim qk_rope_head_dim (0 fills it), n_kv_heads 1, and
     * attention runs in the absorbed form: q_nope W_UK_h against the cached c, W_UV_h after.
     * The cache holds per token c and k_rot: kv_lora_rank + qk_rope_head_dim floats.
     * has_qkv_bias means biases on W_qa (or W_q) and W_kva, has_o_bias on W_o. */
    int32_t q_lora_rank;
    int32_t kv_lora_rank;
    int32_t qk_nope_head_dim;
    int32_t qk_rope_head_dim;
    int32_t v_head_dim;
    float mla_norm_eps; /* 0 = 1e-6 */
} attn_config;

/* True if layer (absolute index) is a linear-attention layer. */
bool attn_config_layer_is_linear(const attn_config *cfg, int32_t layer);

/* True if layer (absolute index) attends through cfg's sliding window. */
bool attn_config_layer_is_sliding(const attn_config *cfg, int32_t layer);

/* True if layer (absolute index) applies a rotary embedding: false without one (GPT-2), for
 * the full layers of a rope_sliding_only config (Cohere 2's NoPE layers) and for the layers
 * is_nope_layer names (SmolLM3's). */
bool attn_config_layer_rotates(const attn_config *cfg, int32_t layer);

/* Fills *out with a named preset: "tiny" (hidden 64, 4 heads, 2 kv heads, head_dim 16, 2 layers),
 * "small" (hidden 512, 8 heads, 2 kv heads, head_dim 64, 4 layers), "llama8b" (hidden 4096,
 * 32 heads, 8 kv heads, head_dim 128, rope_theta 500000, 32 layers) or "small-linear" (small's
 * geometry, every layer ATTN_LAYER_LINEAR, max_seq 131072). Returns ATTN_EINVAL for an unknown
 * name. */
int attn_config_preset(const char *name, attn_config *out);

/* Validates *cfg and replaces zero defaults by their values (head_dim, rotary_dim, rope_theta,
 * softmax_scale). Returns ATTN_EINVAL for a value out of its range (a count < 1, a non-finite or
 * non-positive theta or scale, bad scaling parameters), ATTN_ESHAPE for dimensions that do not
 * fit together (n_kv_heads not dividing n_heads, hidden_size not divisible without a head_dim,
 * rotary_dim odd or > head_dim, an odd head_dim with rotary_dim 0), ATTN_ERANGE for sizes past the
 * engine's limits. Callers that need a reason validate their own inputs first. */
int attn_config_check(attn_config *cfg);

/* ---- models -------------------------------------------------------------------------------- */

typedef struct attn_model attn_model; /* immutable after create; share freely across threads */

/* How numbers are held in memory: the projections' weights (AUTO, F32, BF16, F16) and the KV
 * cache (any). */
typedef enum attn_dtype {
    ATTN_DTYPE_AUTO = 0, /* weights: a checkpoint's own dtype, else F32; KV: the weights' dtype */
    ATTN_DTYPE_F32 = 1,
    ATTN_DTYPE_BF16 = 2, /* bfloat16: half the bytes, the dtype most checkpoints ship in */
    ATTN_DTYPE_F16 = 3,
    /* KV only: llama.cpp's block_q8_0, 32 values as int8 times one binary16 scale (34 bytes),
     * a row's last block zero-padded */
    ATTN_DTYPE_Q8_0 = 4,
} attn_dtype;

/* "auto", "f32", "bf16", "f16", "q8_0"; "?" for any other value. Static. */
const char *attn_dtype_name(attn_dtype dt);

/* The dtype attn_dtype_name calls name: ATTN_OK, or ATTN_EINVAL (*out untouched). */
int attn_dtype_parse(const char *name, attn_dtype *out);

/* The vector kernels the engine runs on this CPU: "avx512" (decode attention over BF16, F16 and
 * Q8_0 K/V with head sizes a multiple of 32 up to 512, and the projections of 4 tokens or more;
 * the rest takes AVX2's), "avx2" or "portable". Static. */
const char *attn_kernels_name(void);

/* false: the engine keeps to its AVX2 kernels even where the CPU has AVX-512 (to compare the
 * two, or where 512-bit instructions lower the clock of other work); true: the widest the CPU
 * has (the default). Process-wide: set it before any work starts. */
void attn_kernels_allow_avx512(bool allow);

/* Which layers to materialize, and an optional cap on positions. */

typedef struct attn_load_params {
    int32_t layer_first; /* first layer to load, >= 0 */
    int32_t layer_count; /* 0 = every layer from layer_first to the end */
    int32_t max_seq;     /* 0 = the config's max_seq; else overrides it (must be > 0) */
    /* attn_model_load_hf only: NULL, or "llama" to read a checkpoint of unknown model_type (or
     * none) as Llama attention, its user vouching for it. Families known and not served, and
     * fields or tensors that change attention, are refused all the same. */
    const char *trust_layout;
    /* How the q/k/v and o projections' weights are held: AUTO keeps a checkpoint's BF16 or F16
     * as it is (bit-exact: no rounding at load) and F32 as F32; F32 widens exactly; BF16 and
     * F16 round an F32 source to nearest even. The projections read the held dtype directly.
     * Multi-head latent attention's tensors stay F32. */
    attn_dtype weights_dtype;
    /* attn_model_load_hf only: whose modeling code a checkpoint means where transformers' port
     * of a family and the code shipped with the checkpoint (trust_remote_code) compute different
     * attention: NULL (such a config is refused, naming both), "transformers" or "checkpoint".
     * Today one case: deepseek_v2 under yarn with mscale_all_dim, whose softmax scale DeepSeek's
     * modeling_deepseek.py (and vLLM, SGLang) multiply by mscale(factor, mscale_all_dim)^2 and
     * transformers' DeepseekV2Attention does not. */
    const char *modeling_code;
} attn_load_params;

/* One layer's weights in Hugging Face nn.Linear layout (out_features, in_features), row-major. */
typedef struct attn_layer_weights {
    const float *wq;          /* (n_heads * head_dim, hidden_size) */
    const float *wk;          /* (n_kv_heads * head_dim, hidden_size) */
    const float *wv;          /* (n_kv_heads * head_dim, hidden_size) */
    const float *wo;          /* (hidden_size, n_heads * head_dim) */
    const float *bq;          /* (n_heads * head_dim) when has_qkv_bias, else ignored */
    const float *bk;          /* (n_kv_heads * head_dim) when has_qkv_bias */
    const float *bv;          /* (n_kv_heads * head_dim) when has_qkv_bias */
    const float *bo;          /* (hidden_size) when has_o_bias */
    const float *q_norm;      /* ATTN_QK_NORM_HEAD, HEAD_LAYERNORM_BIAS: (head_dim); WIDTH,
                                 HEAD_LAYERNORM: (n_heads * head_dim) */
    const float *k_norm;      /* likewise, with n_kv_heads */
    const float *sinks;       /* (n_heads) when has_sinks */
    const float *q_norm_bias; /* (head_dim) with ATTN_QK_NORM_HEAD_LAYERNORM_BIAS, else ignored */
    const float *k_norm_bias; /* (head_dim) likewise */
    /* Multi-head latent attention (kv_lora_rank > 0): wq is then W_q (n_heads * head_dim,
     * hidden_size) when q_lora_rank is 0, bq its bias; wk and wv are not read; wo is
     * (hidden_size, n_heads * v_head_dim). */
    const float *wq_a;      /* (q_lora_rank, hidden_size) */
    const float *bq_a;      /* (q_lora_rank) when has_qkv_bias */
    const float *q_a_norm;  /* (q_lora_rank) */
    const float *wq_b;      /* (n_heads * head_dim, q_lora_rank) */
    const float *wkv_a;     /* (kv_lora_rank + qk_rope_head_dim, hidden_size) */
    const float *bkv_a;     /* (kv_lora_rank + qk_rope_head_dim) when has_qkv_bias */
    const float *kv_a_norm; /* (kv_lora_rank) */
    const float *wkv_b;     /* (n_heads * (qk_nope_head_dim + v_head_dim), kv_lora_rank) */
} attn_layer_weights;

/* Creates a model from caller tensors: layers[i] holds layer (p->layer_first + i), for
 * i < p->layer_count (p may be NULL: all cfg->n_layers layers). The tensors are copied.
 * Returns ATTN_EINVAL (NULL arguments or tensors, a layer range outside the config),
 * the codes of attn_config_check for a bad config, or ATTN_ENOMEM. */
int attn_model_create(const attn_config *cfg, const attn_layer_weights *layers,
                      const attn_load_params *p, attn_model **out);

/* Creates a model with deterministic pseudo-random weights: every weight and bias is uniform in
 * [-1/sqrt(in_features), 1/sqrt(in_features)) (nn.Linear's init), drawn from a splitmix64
 * stream seeded by (seed, layer, tensor), so a layer's weights do not depend on which other
 * layers are loaded. p may be NULL. Same return codes as attn_model_create. */
int attn_model_create_random(const attn_config *cfg, uint64_t seed, const attn_load_params *p,
                             attn_model **out);

/* Loads a Hugging Face style folder: dir/config.json and dir/model.safetensors or the shards named
 * by dir/model.safetensors.index.json; tensors model.layers.{i}.self_attn.{q,k,v,o}_proj.{weight,
 * bias} in F32, F16 or BF16 (converted to float once). config.json is read by the rules of its
 * model_type (llama, mistral, qwen2, or attnd's own layout with every engine field explicit): a
 * family not served, a config field that changes attention in a way the engine does not compute,
 * or a tensor under a layer's self_attn that the engine does not consume is refused, naming it
 * (ATTN_EUNSUPPORTED). Only the layers in p are read. On failure returns ATTN_EIO (missing or
 * malformed file), ATTN_ESHAPE (tensor shape differs from the config), ATTN_EUNSUPPORTED (as
 * above, or an unknown rope_scaling type or dtype), or ATTN_EINVAL (NULL dir or out, layers
 * outside the model, a trust_layout other than "llama") and, if err is not NULL, writes a
 * one-line reason into err (err_size bytes, always NUL-terminated). A tensor the config implies
 * but the files lack is ATTN_EIO. */
int attn_model_load_hf(const char *dir, const attn_load_params *p, attn_model **out, char *err,
                       size_t err_size);

/* Frees the model. NULL is a no-op. No cache or workspace made for it may be used afterwards. */
void attn_model_destroy(attn_model *m);

/* The model's config, with defaults filled in. Borrowed, valid until attn_model_destroy. */
const attn_config *attn_model_config(const attn_model *m);

/* A model of attention geometry alone, without weights: for attn_forward_qkv, whose caller
 * projects q, k and v itself (an attention tier beside a model run elsewhere). cfg says the heads,
 * KV heads, head_dim, layers, positions, RoPE, window, scale and soft-cap; hidden_size 0 is taken
 * as n_heads * head_dim. attn_forward refuses such a model (ATTN_EUNSUPPORTED), and so does this
 * for multi-head latent attention (its caches hold a latent, not per-head K/V). */
int attn_model_create_geometry(const attn_config *cfg, const attn_load_params *p, attn_model **out);

/* False for attn_model_create_geometry's models. */
bool attn_model_has_weights(const attn_model *m);

/* The loaded layers are layer_first .. layer_first + layer_count - 1 (absolute indices). */
int32_t attn_model_layer_first(const attn_model *m);
int32_t attn_model_layer_count(const attn_model *m);

/* Bytes of float weights held by the model (all loaded layers, biases and RoPE tables). */
size_t attn_model_bytes(const attn_model *m);

/* The attention family served: the checkpoint's model_type ("llama", "mistral", "qwen2"), "llama
 * (trusted layout of X)" under trust_layout, or "attnd" (the engine's own layout: presets,
 * attn_model_create). Borrowed, valid until attn_model_destroy. */
const char *attn_model_family(const attn_model *m);

/* The dtype the model's q/k/v and o projections are held in (never ATTN_DTYPE_AUTO). */
attn_dtype attn_model_weights_dtype(const attn_model *m);

#define ATTN_FINGERPRINT_BYTES 32

/* What the model computes, in 32 bytes, computed once when it was made: a digest of its
 * attention config and of every loaded layer's index and tensors as held (so BF16 and F32
 * holdings of one checkpoint differ, as their answers do). Two loads of the same checkpoint with
 * the same parameters agree. Not cryptographic: it tells models apart, it does not resist a
 * forger. */
void attn_model_fingerprint(const attn_model *m, uint8_t out[ATTN_FINGERPRINT_BYTES]);

/* The part of the fingerprint that is the attention config alone (every field, max_seq
 * included), as one 64-bit word, never 0: with the layer range and the weights' dtype it tells
 * which of them two fingerprints differ by, when the weights alone do not. */
uint64_t attn_model_config_digest(const attn_model *m);

/* The fingerprint's digest of n bytes, as one 64-bit word: a checksum for saved sessions (it
 * catches torn and flipped bytes at memory speed; like the fingerprint, it is not
 * cryptographic). */
uint64_t attn_checksum64(const void *data, size_t n);

/* ---- paged KV cache ------------------------------------------------------------------------ */

typedef struct attn_kv_pool attn_kv_pool; /* one thread at a time, with all its caches */
typedef struct attn_kv attn_kv;           /* one layer's K/V for one sequence */

/* Creates a pool of KV blocks for model m: budget_bytes / block_bytes blocks, each holding
 * block_tokens tokens of K and V for all kv heads of one layer, laid out as
 * K (n_kv_heads, block_tokens, head_dim) then V (n_kv_heads, block_tokens, head_dim), each row
 * in the pool's dtype, the block rounded up to 64 bytes. block_tokens is 16..256 (0 = 128).
 * The memory is reserved at once and touched only when blocks are first used. The dtype is
 * ATTN_DTYPE_AUTO here: the model's weights' dtype (F32 stays exact end to end). Returns
 * ATTN_EINVAL (budget smaller than one block) or ATTN_ENOMEM. */
int attn_kv_pool_create(const attn_model *m, size_t budget_bytes, int32_t block_tokens,
                        attn_kv_pool **out);

/* The same with the dtype the cache holds K and V in: AUTO, F32 (exact), BF16 or F16 (each value
 * rounded to nearest even when appended), or Q8_0 (each 32 values of a row scaled to int8 by
 * their largest magnitude). Attention reads every dtype directly. Multi-head latent attention's
 * latent takes any (Q8_0 when kv_lora_rank is a multiple of 32, else ATTN_EUNSUPPORTED);
 * linear-attention layers' states are double whatever the dtype. ATTN_EINVAL for another
 * value. */
int attn_kv_pool_create_typed(const attn_model *m, size_t budget_bytes, int32_t block_tokens,
                              attn_dtype dtype, attn_kv_pool **out);

/* The same, and with keeps_queries the pool also holds each token's post-RoPE query rows
 * (n_heads x head_dim more per token, in the same dtype), so that attn_kv_attention can
 * recompute the attention of tokens already cached. Not for multi-head latent attention
 * (ATTN_EUNSUPPORTED). */
int attn_kv_pool_create_ex(const attn_model *m, size_t budget_bytes, int32_t block_tokens,
                           attn_dtype dtype, bool keeps_queries, attn_kv_pool **out);
bool attn_kv_pool_keeps_queries(const attn_kv_pool *pool);

/* The block_bytes attn_kv_pool_create_typed (_ex) would give these arguments, or 0 where it would
 * refuse them (for a message before the budget is chosen). */
size_t attn_kv_block_bytes_for(const attn_model *m, int32_t block_tokens, attn_dtype dtype);
size_t attn_kv_block_bytes_ex(const attn_model *m, int32_t block_tokens, attn_dtype dtype,
                              bool keeps_queries);

/* The dtype the pool holds K and V in (never AUTO). */
attn_dtype attn_kv_pool_dtype(const attn_kv_pool *pool);

/* Frees the pool and its memory. NULL is a no-op. Every cache of the pool must be destroyed
 * before. */
void attn_kv_pool_destroy(attn_kv_pool *pool);

size_t attn_kv_pool_block_bytes(const attn_kv_pool *pool);
int32_t attn_kv_pool_block_tokens(const attn_kv_pool *pool);
int32_t attn_kv_pool_blocks_total(const attn_kv_pool *pool);
int32_t attn_kv_pool_blocks_free(const attn_kv_pool *pool);
size_t attn_kv_pool_bytes_used(const attn_kv_pool *pool);  /* blocks in use * block_bytes */
size_t attn_kv_pool_bytes_limit(const attn_kv_pool *pool); /* blocks_total * block_bytes */

/* Creates an empty cache (no blocks held yet) with capacity max_seq tokens, which keeps every
 * token and serves any layer of the model. */
int attn_kv_create(attn_kv_pool *pool, attn_kv **out);

/* Creates an empty cache for `layer` of the pool's model only. For a sliding layer (window W)
 * it is a ring: tokens that no later query can see (all but the last W - 1) are dropped a whole
 * block at a time, their blocks going back to the pool at attn_kv_reserve and attn_kv_truncate,
 * or when a forward takes new blocks (never otherwise: a forward into reserved blocks leaves the
 * pool alone). Between calls it holds the blocks covering the W - 1 tokens before
 * max(s, len - block_tokens), s its length at the last attn_kv_reserve, plus at most one dead
 * block until the next of those, whatever its length: so after a reserved call a truncate to
 * any length from there on (a speculative step's rollback of up to block_tokens tokens) always
 * works. For other layers it is attn_kv_create's cache. ATTN_EINVAL for a layer the model does
 * not have. */
int attn_kv_create_for_layer(attn_kv_pool *pool, int32_t layer, attn_kv **out);

/* Returns the cache's blocks to its pool and frees it. NULL is a no-op. */
void attn_kv_destroy(attn_kv *kv);

/* Tokens appended (its length: the next token goes to this cache index). */
int32_t attn_kv_len(const attn_kv *kv);

/* The first token whose K/V the cache still holds: 0, or for a ring the first of the block after
 * the last one dropped. Tokens [attn_kv_first_held(kv), attn_kv_len(kv)) are held. */
int32_t attn_kv_first_held(const attn_kv *kv);

/* The ring's window (tokens a query sees, itself included), or 0 for a cache that keeps all. */
int32_t attn_kv_window(const attn_kv *kv);

/* True for a linear-attention layer's cache: a running state, not tokens' K/V. */
bool attn_kv_is_state(const attn_kv *kv);

/* Bytes of the blocks the cache holds (a partly filled block counts whole). */
size_t attn_kv_bytes(const attn_kv *kv);

/* Blocks that appending n_new tokens would take from the pool (0 if they fit in the last block,
 * or, for a ring, in the blocks it can drop). Lets the caller free space (evict) before a
 * forward that would fail with ATTN_ENOSPC. */
int32_t attn_kv_blocks_needed(const attn_kv *kv, int32_t n_new);

/* Takes now, without changing the length, the blocks that appending n_new more tokens would
 * need, so that a later attn_forward of up to n_new tokens on kv leaves the pool's accounting
 * alone (see the thread rule). ATTN_ENOSPC when the pool lacks them (nothing is taken),
 * ATTN_ERANGE when attn_kv_len(kv) + n_new > max_seq, ATTN_EINVAL for n_new < 0. Reserved,
 * unused blocks go back with attn_kv_truncate or attn_kv_destroy. */
int attn_kv_reserve(attn_kv *kv, int32_t n_new);

/* Keeps the first n_tokens tokens and returns whole unused blocks to the pool
 * (speculative-decoding rollback). ATTN_ERANGE if n_tokens > attn_kv_len(kv) or < 0;
 * ATTN_EDROPPED (nothing changed) if the ring dropped tokens the query at n_tokens would see
 * (n_tokens - window + 1 < attn_kv_first_held(kv)); 0 always empties it. */
int attn_kv_truncate(attn_kv *kv, int32_t n_tokens);

/* The smallest n_tokens other than 0 that attn_kv_truncate accepts: 0 when it accepts any
 * length up to attn_kv_len (a cache that dropped nothing), else the first token held plus the
 * window minus 1. */
int32_t attn_kv_truncate_min(const attn_kv *kv);

/* Creates a copy of src (same pool, same tokens, same window, own blocks for the held ones).
 * ATTN_ENOSPC when the pool cannot hold the copy (nothing is changed then), ATTN_ENOMEM. */
int attn_kv_fork(const attn_kv *src, attn_kv **out);

/* Copies tokens [first, first + count) of the cache into k and v, each laid out
 * (n_kv_heads, count, head_dim) row-major, post-RoPE as stored; for multi-head latent
 * attention k gets (1, count, kv_lora_rank + qk_rope_head_dim) latent rows [c | k_rot] and v
 * (1, count, kv_lora_rank), their c; each value as the pool's dtype holds it, widened to float.
 * ATTN_ERANGE if out of bounds,
 * ATTN_EDROPPED if first < attn_kv_first_held(kv). For tests and inspection; not a hot path. */
int attn_kv_read(const attn_kv *kv, int32_t first, int32_t count, float *k, float *v);

/* A cache as bytes, for saving a session (layout in engine/kv_io.c): its shape, length and first
 * token held, then the held tokens' rows exactly as the pool holds them (or a linear layer's
 * state). Tokens, not blocks: a pool with another block size reads them. Loop thread rule as
 * for every attn_kv_* call. attn_kv_export: ATTN_ERANGE when size < attn_kv_export_bytes. */
size_t attn_kv_export_bytes(const attn_kv *kv);
int attn_kv_export(const attn_kv *kv, uint8_t *out, size_t size);

/* Recreates in pool, for layer (or -1: attn_kv_create's plain cache, as a cross-attention
 * context is), the cache attn_kv_export wrote (*out, new). ATTN_EUNSUPPORTED
 * when the bytes describe another shape, dtype, window or kind of layer than this pool holds for
 * this layer; ATTN_EDROPPED for a ring whose first held token does not start one of this pool's
 * blocks (a pool of another block size: it would hold tokens the bytes lack); ATTN_EIO when they
 * are inconsistent or of the wrong size; ATTN_ENOSPC when the pool lacks the blocks; ATTN_EINVAL
 * for a layer the model does not have. Nothing is created on failure. */
int attn_kv_import(attn_kv_pool *pool, int32_t layer, const uint8_t *data, size_t size,
                   attn_kv **out);

/* Blocks attn_kv_import of these bytes would take from pool (so the caller can free them
 * first), or one of attn_kv_import's codes (negative) for bytes it would refuse. */
int32_t attn_kv_import_blocks(attn_kv_pool *pool, int32_t layer, const uint8_t *data, size_t size);

/* ---- forward ------------------------------------------------------------------------------- */

/* Runs task(arg, i) for every i in [0, n) and returns when all have finished. The engine uses
 * it, when given, to spread work over the caller's threads: attention (one KV head of one
 * sequence and query tile each) and the projections (slices of weight rows). Each thread must
 * start its tasks in increasing i (claiming them from a shared counter does, as does any fixed
 * split of [0, n) walked in order): a task may wait for one of lower i that another thread runs
 * (a decode's projection of a KV group, then that group's attention). With an
 * executor, run BLAS single-threaded (e.g. openblas_set_num_threads(1)): the engine calls it from
 * the executor's threads. Without one, everything runs on the calling thread and BLAS may use
 * its own threads. The engine itself never starts a thread. */
typedef void (*attn_task_fn)(void *arg, int32_t i);
typedef struct attn_executor {
    void (*run)(void *ctx, attn_task_fn task, void *arg, int32_t n);
    void *ctx;
} attn_executor;

typedef struct attn_workspace attn_workspace; /* one thread at a time */

/* Creates the scratch memory for forwards of up to max_tokens new tokens in one call (summed
 * over the steps of a batch), at any context length up to the model's max_seq. ex may be NULL
 * (everything runs on the calling thread); it is copied. ATTN_EINVAL, ATTN_ENOMEM. */
int attn_workspace_create(const attn_model *m, int32_t max_tokens, const attn_executor *ex,
                          attn_workspace **out);
void attn_workspace_destroy(attn_workspace *ws); /* NULL is a no-op */
int32_t attn_workspace_max_tokens(const attn_workspace *ws);

/* What a call may read of its own attention besides the output (issue: inspection), computed
 * only for the selection, after the forward's own pass: O(selection x head_dim) more time and
 * no memory beyond `out`, at any context length. The key axis of a step is its cache's index
 * after the step (P + n_tokens keys; a cross step: the context's tokens). */
typedef enum attn_inspect_kind {
    ATTN_INSPECT_PROBS = 0,  /* probabilities; 0 for a key the row may not see */
    ATTN_INSPECT_SCORES = 1, /* pre-softmax scores: scale q.k, then any soft-cap; -inf for a key
                                the row may not see */
    ATTN_INSPECT_LSE = 2,    /* per head and row, log(sum of exp(score) over the visible keys,
                                plus exp(sink) where the layer has sinks): the probabilities are
                                exp(score - lse); -inf when the row sees nothing. What a caller
                                needs to merge partial attentions. */
} attn_inspect_kind;

typedef enum attn_inspect_reduce {
    ATTN_REDUCE_NONE = 0,
    ATTN_REDUCE_MEAN_HEADS = 1, /* the mean over the selected heads */
    ATTN_REDUCE_MAX_HEADS = 2,  /* the maximum over the selected heads */
} attn_inspect_reduce;

typedef struct attn_inspect {
    attn_inspect_kind kind;
    attn_inspect_reduce reduce;
    const int32_t *heads; /* NULL: every query head; else n_heads strictly ascending indices */
    int32_t n_heads;
    const int32_t *rows; /* NULL: every token of the step; else n_rows strictly ascending token
                            indices of the step, in [0, n_tokens) */
    int32_t n_rows;
    int32_t key_first; /* key columns [key_first, key_first + n_keys) of the step's key axis */
    int32_t n_keys;    /* >= 0; not used by ATTN_INSPECT_LSE */
    float *out;        /* NULL (no selection), or (H', R, n_keys), LSE: (H', R), where H' is the
                          selected heads' count (1 when reduced) and R the selected rows' */
    /* Captures, each NULL or the step's tensor as computed (before the cache's dtype rounds k
     * and v), per head: q (n_heads, n_tokens, d_qk) after any q norm and RoPE; k and v
     * (n_kv_heads, n_tokens, head_dim), k after norm and RoPE (not for a cross step, whose keys
     * are the context's, nor multi-head latent attention, whose cache holds latents); head_out
     * (n_heads, n_tokens, d_v), each head's attention output before head_scale and o_proj. For
     * multi-head latent attention d_qk is head_dim (nope | rope) and d_v v_head_dim. */
    float *q;
    float *k;
    float *v;
    float *head_out;
} attn_inspect;

/* One sequence's share of a forward: n_tokens new tokens appended to kv.
 * Masks, with P = attn_kv_len(kv) before the call and cache index P + i for new token i:
 * causal (token i sees keys with index <= P + i), the model's sliding window, and key_valid.
 * A row whose keys are all masked gives a zero attention output (and zero weights), never NaN;
 * the layer output of that token is then the output bias (zero without one). */
typedef struct attn_step {
    attn_kv *kv;              /* the cache to append to; must come from a pool of this model */
    const float *x;           /* (n_tokens, hidden_size) row-major hidden states */
    int32_t n_tokens;         /* >= 1 */
    const int32_t *positions; /* (n_tokens) RoPE positions in [0, max_seq); NULL = P + i */
    const uint8_t *key_valid; /* NULL, or (P + n_tokens): 0 masks that key out (padding) */
    float *out;               /* (n_tokens, hidden_size) row-major */
    float *weights;           /* NULL, or (n_heads, n_tokens, P + n_tokens) row-major:
                                 attention probabilities; asking for them selects the
                                 materialized-scores path, otherwise the tiled online-softmax
                                 path runs and never holds a full score matrix */
    /* Cross-attention (seeds 000, 001, 004 3.4) when not NULL: the step's n_context context rows
     * (n_context, hidden_size) are first projected through the layer's K and V (biases and k
     * norm as the layer has them, no RoPE) and appended to `cross`, a cache from
     * attn_kv_create (n_context may be 0: the context it holds serves again); then the step's
     * queries (projected from x, no RoPE) attend to every token of `cross`, with no causal mask
     * or window. kv is then not used (may be NULL), positions and key_valid must be NULL, and
     * weights are (n_heads, n_tokens, len(cross) after the append). */
    attn_kv *cross;
    const float *context;
    int32_t n_context;
    /* NULL, or what to read of this step's attention (above); not for a linear layer. */
    const attn_inspect *inspect;
    /* NULL, or (n_heads) factors: head h's attention output is multiplied by head_scale[h]
     * before o_proj (0 removes the head: ablation). The cache is not affected. */
    const float *head_scale;
    /* 0, or the highest position of the call this step is a part of (a stream's one-token
     * steps): a rotation that depends on a call's reach (longrope, dynamic) then takes the
     * larger of it and the step's own highest position, so that each part rotates as the whole
     * call does. */
    int32_t rope_reach;
} attn_step;

/* Advances n_steps caches (distinct caches of one pool) by their new tokens through layer
 * `layer` (absolute index). The QKV and output projections run as one GEMM over all the steps'
 * tokens, so concurrent decodes read the weights once. Either every cache is advanced or none
 * is: on any error no cache changes length. Total tokens may exceed the workspace's max_tokens:
 * the work is then split into chunks (chunked prefill), with identical results.
 * Returns ATTN_EINVAL (NULL pointers, n_steps < 1, n_tokens < 1, layer not loaded, a workspace
 * made for another model, caches from different pools, one cache in two steps, a ring
 * cache (attn_kv_create_for_layer) of a layer with another window, a cross step with positions,
 * key_valid, a ring cross cache or a negative n_context), ATTN_ESHAPE
 * (a cache from another model's pool), ATTN_ERANGE (a position outside [0, max_seq) or a cache
 * that would exceed max_seq), ATTN_ENOSPC (not enough free blocks for all the appends),
 * ATTN_EOVERFLOW (a key, value or kept query not finite or past the cache dtype's range: found
 * as it is appended, after which every cache goes back to its length; its blocks stay with it,
 * as reserved ones, for attn_kv_truncate to give back. A linear layer's states are checked
 * before they take a chunk's rows and put back as they were, contents and length, when a later
 * chunk fails; a call of more tokens than the workspace's max_tokens on a linear layer copies
 * its states first, and may fail ATTN_ENOMEM for it. The one exception to all-or-nothing: a
 * ring that had to drop blocks during the call, which only a cache appended to without
 * attn_kv_reserve does, keeps its new tokens, held as non-finite values). */
int attn_forward(const attn_model *m, int32_t layer, attn_workspace *ws, const attn_step *steps,
                 int32_t n_steps);

/* One cache's step of attention on projections its caller made (attn_forward_qkv). Layouts are
 * per head, row-major. */
typedef struct attn_qkv_step {
    attn_kv *kv;                 /* the cache to append k and v to */
    int32_t n_tokens;            /* T >= 1 */
    const float *q;              /* (n_heads, T, head_dim) */
    const float *k;              /* (n_kv_heads, T, head_dim), appended */
    const float *v;              /* (n_kv_heads, T, head_dim), appended */
    const int32_t *positions;    /* (T) RoPE positions in [0, max_seq), or NULL = P + i */
    bool rope;                   /* rotate q and k with the layer's RoPE at positions (false: the
                                    caller did; the cache then holds k as given) */
    float *out;                  /* (n_heads, T, head_dim): each head's output, before any o_proj */
    float *weights;              /* NULL, or (n_heads, T, P + T): the probabilities */
    const attn_inspect *inspect; /* as attn_step's (head_out is out before head_scale) */
    const float *head_scale;     /* as attn_step's, applied to out */
} attn_qkv_step;

/* attn_forward without the projections: appends each step's k and v to its cache and attends
 * its q causally over the cache (the layer's window, scale, soft-cap and sinks as the model has
 * them; no q/k norm, which is part of a projection). Batching, chunking and all-or-nothing as
 * attn_forward; the same codes, and ATTN_EUNSUPPORTED for a linear-attention layer or multi-head
 * latent attention. Works on any model, with weights or not. */
int attn_forward_qkv(const attn_model *m, int32_t layer, attn_workspace *ws,
                     const attn_qkv_step *steps, int32_t n_steps);

/* Recomputes the attention of tokens already in kv, a cache of layer `layer` (absolute) from a
 * pool that keeps queries (attn_kv_pool_create_ex): ins selects as for a forward, its rows and
 * keys being cache indices (rows NULL: every token; key axis [0, len)), its captures NULL. Each
 * row sees what the forward let it see when it was new (causal, the layer's window, its sinks
 * and soft-cap), except a key_valid (padding) mask, which the cache does not keep. On the calling
 * thread; nothing changes. ATTN_EUNSUPPORTED (the pool keeps no queries, or a linear layer),
 * ATTN_EDROPPED (a row whose query or any key it saw a ring no longer holds: its window must
 * lie at or after attn_kv_first_held), ATTN_EINVAL / ATTN_ERANGE (a bad selection),
 * ATTN_ENOMEM. */
int attn_kv_attention(const attn_model *m, int32_t layer, const attn_kv *kv,
                      const attn_inspect *ins);

/* ---- stateless scaled-dot-product attention ------------------------------------------------ */

/* out = softmax(scale * q k^T + mask) v, per query head h reading kv head h / (n_heads /
 * n_kv_heads). Query i sits at key index i + (n_k - n_q) (bottom-right alignment), and key j is
 * visible iff (!is_causal || j <= i') and (window < 0 || |i' - j| <= window), with
 * i' = i + n_k - n_q. */
/* What attn_sdpa computes. */
typedef enum attn_sdpa_kind {
    ATTN_SDPA_SOFTMAX = 0, /* softmax(scale q k^T + mask) v */
    /* Linear attention (seed 004 3.7): with phi(x) = elu(x) + 1 elementwise, query i gets
     * phi(q_i) S / (phi(q_i) . z + 1e-6), S = sum_j phi(k_j)^T v_j and z = sum_j phi(k_j) over
     * the keys it sees (all of them, or with is_causal those up to i' = i + n_k - n_q: prefix
     * sums). No scale; window, mask and weights are not defined for it. */
    ATTN_SDPA_LINEAR = 1,
} attn_sdpa_kind;

typedef struct attn_sdpa_params {
    int32_t n_heads;    /* query heads */
    int32_t n_kv_heads; /* divides n_heads */
    int32_t n_q;        /* query length Tq >= 1 */
    int32_t n_k;        /* key length Tk >= 1 */
    int32_t d_k;        /* query/key dim >= 1 */
    int32_t d_v;        /* value dim >= 1 */
    const float *q;     /* (n_heads, n_q, d_k) row-major */
    const float *k;     /* (n_kv_heads, n_k, d_k) row-major */
    const float *v;     /* (n_kv_heads, n_k, d_v) row-major */
    bool is_causal;
    int32_t window; /* -1 = none, else >= 0 */
    float scale;    /* 0 = 1 / sqrt(d_k) */
    float *out;     /* (n_heads, n_q, d_v) row-major */
    float *weights; /* NULL, or (n_heads, n_q, n_k): probabilities (materialized path) */
    /* NULL, or polled (on the calling thread) before each tile of work, one KV head x 64 query
     * rows, so a caller whose client has gone can stop a long call within one tile: true makes
     * attn_sdpa return ATTN_ECANCELED at once. */
    bool (*is_cancelled)(void *ctx);
    void *cancel_ctx;
    /* NULL, or a boolean mask shared by the heads: query i sees key j only where
     * mask[i * mask_ld + j] is nonzero (n_k bytes per row; mask_ld 0 gives every query the same
     * row, a key padding mask). It narrows what causal and window leave visible. */
    const uint8_t *mask;
    size_t mask_ld;
    attn_sdpa_kind kind;
    /* NULL, or a selection of the weights, scores or LSE (rows are query rows, keys [0, n_k));
     * its captures must be NULL (the caller has q, k and v). Softmax only. */
    const attn_inspect *inspect;
} attn_sdpa_params;

/* Bytes of scratch attn_sdpa needs for these dimensions (the tensor pointers may still be NULL);
 * 0 when the dimensions are invalid (attn_sdpa then says why). */
size_t attn_sdpa_scratch_bytes(const attn_sdpa_params *p);

/* Computes p->out (and p->weights). A query that sees no key (all masked) gets a zero output
 * row and zero weights, never NaN; one whose visible scores float cannot hold (all overflowing
 * to -inf, any to +inf or NaN: |scale q . k| beyond 3.4e38) gets NaN, as its softmax cannot be
 * computed in float. scratch must hold
 * attn_sdpa_scratch_bytes(p) bytes, aligned for float. Returns ATTN_EINVAL (NULL tensors or
 * scratch, a size < 1, window < -1, a negative or non-finite scale, a mask_ld below n_k other than
 * 0; for ATTN_SDPA_LINEAR a window, a mask, a scale or weights; an unknown kind), ATTN_ESHAPE
 * (n_kv_heads not dividing n_heads), ATTN_ERANGE (sizes past the engine's limits) or ATTN_ECANCELED
 * (is_cancelled said so; out and weights are then partly written). */
int attn_sdpa(const attn_sdpa_params *p, void *scratch);

#endif /* ENGINE_ATTN_H */
