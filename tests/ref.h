/* tests/ref.h: a plain-loop reference of the attention block and of stateless SDPA, written for
 * clarity in the manner of llama2.c's run.c. It shares no code with engine/: the only thing taken
 * from engine/attn.h is the attn_config struct, as the description of a model. Every dot product
 * and sum accumulates in double and RoPE angles are computed in double, so the reference is more
 * exact than the engine and the tests measure the engine's float error alone.
 * Also here: a small seeded random generator for test tensors (not the engine's). */
#ifndef TESTS_REF_H
#define TESTS_REF_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "../engine/attn.h"

/* ---- random test data ---------------------------------------------------------------------- */

/* splitmix64, seeded by the test. Plain struct state, no globals. */
typedef struct ref_rng {
    uint64_t state;
} ref_rng;

void ref_rng_init(ref_rng *r, uint64_t seed);
uint64_t ref_rng_next(ref_rng *r);
/* Uniform in [lo, hi). */
float ref_rng_uniform(ref_rng *r, float lo, float hi);
/* Fills a[0..n) uniformly in [lo, hi). */
void ref_fill_uniform(ref_rng *r, float *a, size_t n, float lo, float hi);

/* ---- model description --------------------------------------------------------------------- */

/* One layer's weights in Hugging Face nn.Linear layout (out_features, in_features), row-major,
 * the same shapes as attn_layer_weights:
 *   wq (n_heads * head_dim, hidden)    bq (n_heads * head_dim)
 *   wk (n_kv_heads * head_dim, hidden) bk (n_kv_heads * head_dim)
 *   wv (n_kv_heads * head_dim, hidden) bv (n_kv_heads * head_dim)
 *   wo (hidden, n_heads * head_dim)    bo (hidden)
 * The biases are read only when the config says so (has_qkv_bias, has_o_bias), and
 *   sinks (n_heads), one logit per query head added to each softmax's denominator, only with
 *   has_sinks. */
typedef struct ref_layer {
    float *wq, *wk, *wv, *wo;
    float *bq, *bk, *bv, *bo;
    float *sinks;
} ref_layer;

/* Allocates every tensor of *w (biases always, so a test can switch the config's bias flags) and
 * fills them like nn.Linear's init: uniform in [-1/sqrt(in), 1/sqrt(in)). Aborts on OOM. */
void ref_layer_init_random(ref_layer *w, const attn_config *cfg, ref_rng *r);
void ref_layer_release(ref_layer *w);

/* The config's effective values, resolving the zero defaults documented in attn.h the same way
 * attn_config_check promises to (the reference never calls the engine to do it). */
int32_t ref_head_dim(const attn_config *cfg);
int32_t ref_rotary_dim(const attn_config *cfg); /* 0 when RoPE is off (rotary_dim == -1) */
double ref_rope_theta(const attn_config *cfg);
double ref_softmax_scale(const attn_config *cfg);

/* ---- RoPE ---------------------------------------------------------------------------------- */

/* inv_freq[i] for i < rotary_dim / 2: theta^(-2i / rotary_dim), then the config's scaling:
 * linear divides by factor; llama3 follows HF transformers' _compute_llama3_parameters:
 *   wavelen = 2 pi / f; low_wl = orig / low_freq_factor; high_wl = orig / high_freq_factor
 *   wavelen < high_wl: f;  wavelen > low_wl: f / factor;
 *   otherwise s = (orig / wavelen - low) / (high - low), f' = (1 - s) f / factor + s f. */
void ref_rope_inv_freq(const attn_config *cfg, double *inv_freq);

/* Rotates the first rotary_dim entries of one head vector vec (head_dim) at position pos:
 * angle_i = pos * inv_freq[i], pairs (i, i + rotary_dim/2) for the half style, (2i, 2i+1) for
 * the interleaved style; (a, b) -> (a cos - b sin, b cos + a sin). */
void ref_rope_rotate(const attn_config *cfg, const double *inv_freq, int32_t pos, double *vec);

/* ---- the layer forward --------------------------------------------------------------------- */

/* One whole sequence through one layer: token t sits at cache index t. Because attention is
 * causal, rows P..N-1 of this single pass are what an engine must produce when the same tokens
 * arrive after P cached ones, in any chunking. */
typedef struct ref_forward_args {
    int32_t n_tokens;         /* N >= 1 */
    const float *x;           /* (N, hidden_size) row-major */
    const int32_t *positions; /* (N) RoPE positions; NULL = the cache index */
    const uint8_t *key_valid; /* NULL, or (N): 0 masks that key out for every query */
    float *out;               /* (N, hidden_size) row-major */
    float *weights;           /* NULL, or (n_heads, N, N): probabilities, 0 where masked */
    float *k;                 /* NULL, or (n_kv_heads, N, head_dim): post-RoPE keys */
    float *v;                 /* NULL, or (n_kv_heads, N, head_dim): values */
    /* AUTO or F32: K and V exact (double); BF16, F16, Q8_0: each post-RoPE key row and value
     * row is rounded to float, then to what that dtype holds (ref_kv_round), before attention
     * reads it: the answer of an engine whose cache holds that dtype */
    attn_dtype kv_dtype;
    /* Inspection (each NULL or filled): */
    float *q_rot;            /* (n_heads, N, head_dim): post-RoPE queries */
    float *scores;           /* (n_heads, N, N): scale q.k, -inf where masked */
    float *lse;              /* (n_heads, N): log(sum exp(visible scores) + exp(sink)), -inf
                                when nothing is visible and there is no sink */
    float *head_out;         /* (n_heads, N, head_dim): each head's context */
    const float *head_scale; /* (n_heads): multiplies each head's context before wo */
} ref_forward_args;

/* row[0..d) = the values a KV cache of dtype dt holds for it, computed here from the formats'
 * definitions: bfloat16 and binary16 rounded to nearest even from float; Q8_0 (ggml's
 * block_q8_0) per 32 values: scale = the smallest binary16 >= max |x| / 127, q = round(x * (1 /
 * scale)) (half
 * away from zero) in [-127, 127], value = q * scale; a partial last block as if zero-padded. */
void ref_kv_round(attn_dtype dt, double *row, int32_t d);

/* q/k/v = x W^T (+ b); RoPE on q and k; for query head h (kv head h / (n_heads / n_kv_heads)),
 * query i sees key j iff j <= i, (W == 0 || i - j < W) and key_valid[j]; softmax(scale q.k) with
 * the max subtracted; a row with no visible key gives a zero context (and zero weights);
 * out = ctx Wo^T (+ bo). Aborts on OOM. */
void ref_layer_forward(const attn_config *cfg, const ref_layer *w, const ref_forward_args *a);

/* ---- stateless SDPA ------------------------------------------------------------------------ */

/* Mirrors the attn_sdpa_params contract of attn.h: query i sits at key index
 * i' = i + n_k - n_q; key j is visible iff (!is_causal || j <= i') and
 * (window < 0 || |i' - j| <= window); query head h reads kv head h / (n_heads / n_kv_heads). */
typedef struct ref_sdpa_args {
    int32_t n_heads, n_kv_heads;
    int32_t n_q, n_k;
    int32_t d_k, d_v;
    const float *q; /* (n_heads, n_q, d_k) */
    const float *k; /* (n_kv_heads, n_k, d_k) */
    const float *v; /* (n_kv_heads, n_k, d_v) */
    bool is_causal;
    int32_t window;      /* -1 = none */
    double scale;        /* 0 = 1 / sqrt(d_k) */
    float *out;          /* (n_heads, n_q, d_v) */
    float *weights;      /* NULL, or (n_heads, n_q, n_k) */
    const uint8_t *mask; /* NULL, or query i sees key j only if mask[i * mask_ld + j] != 0 */
    size_t mask_ld;
} ref_sdpa_args;

void ref_sdpa(const ref_sdpa_args *a);

/* ---- multi-head latent attention ------------------------------------------------------------- */

/* One MLA layer (attn_config.kv_lora_rank > 0), the tensors of attn_layer_weights' MLA part: wq
 * and bq (when q_lora_rank is 0) or wq_a, bq_a, q_a_norm and wq_b; wkv_a, bkv_a, kv_a_norm,
 * wkv_b; wo (hidden, n_heads * v_head_dim) and bo. Biases are read as the config says. */
typedef struct ref_mla_layer {
    const float *wq, *bq, *wq_a, *bq_a, *q_a_norm, *wq_b;
    const float *wkv_a, *bkv_a, *kv_a_norm, *wkv_b, *wo, *bo;
} ref_mla_layer;

/* The layer over x (n_tokens, hidden) at positions 0.. in the expanded form of the modeling
 * code: per head k = [W_UK_h c | k_rot] and v = W_UV_h c, causal softmax with the config's
 * scale, then o. out (n_tokens, hidden); weights (n_heads, n, n) or NULL. */
void ref_mla_forward(const attn_config *cfg, const ref_mla_layer *w, const float *x,
                     int32_t n_tokens, float *out, float *weights);

/* Linear attention, seed 004 3.7, in its quadratic form: with phi(x) = elu(x) + 1, query i gets
 * sum_j w_ij v_j / (sum_j w_ij + 1e-6), w_ij = phi(q_i) . phi(k_j), over the keys it sees (all,
 * or with is_causal j <= i + n_k - n_q); head h reads kv head h / (n_heads / n_kv_heads). Reads
 * the dims, q, k, v, is_causal and out of a. */
void ref_linear_sdpa(const ref_sdpa_args *a);

#endif /* TESTS_REF_H */
