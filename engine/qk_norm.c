/* engine/qk_norm.c: what some families do to a token's projected q, k and v before RoPE: OLMo's
 * clamp of q, k and v (attn_config.clip_qkv), then the normalization of q and k (attn.h,
 * attn_qk_norm): RMSNorm per head (Qwen3) or over the whole projection (OLMo 2), or LayerNorm of
 * each head with its own weight (StableLM 2, Cohere), or with one weight and bias for all heads
 * (Phi). Sums are taken in double, so the norm is
 * exact to float rounding whatever the width. */
#include "attn_int.h"

#include <math.h>

size_t attn__qk_norm_len(const attn_config *cfg, bool is_k) {
    switch (cfg->qk_norm) {
    case ATTN_QK_NORM_HEAD:
    case ATTN_QK_NORM_HEAD_LAYERNORM_BIAS:
        return (size_t)cfg->head_dim;
    case ATTN_QK_NORM_WIDTH:
    case ATTN_QK_NORM_HEAD_LAYERNORM:
        return (size_t)(is_k ? cfg->n_kv_heads : cfg->n_heads) * cfg->head_dim;
    case ATTN_QK_NORM_NONE:
        break;
    }
    return 0;
}

/* x[0..n) = w * x / sqrt(mean(x^2) + eps), the Hugging Face RMSNorm. */
static void rms_norm(float *x, size_t n, const float *w, float eps) {
    double ss = 0.0;
    for (size_t i = 0; i < n; i++) {
        ss += (double)x[i] * x[i];
    }
    float inv = (float)(1.0 / sqrt(ss / (double)n + (double)eps));
    for (size_t i = 0; i < n; i++) {
        x[i] = w[i] * (x[i] * inv);
    }
}

/* x[0..n) = w * (x - mean) / sqrt(var + eps) (+ b when b is not NULL), torch's LayerNorm (biased
 * var). */
static void layer_norm(float *x, size_t n, const float *w, const float *b, float eps) {
    double sum = 0.0;
    for (size_t i = 0; i < n; i++) {
        sum += x[i];
    }
    double mean = sum / (double)n, ss = 0.0;
    for (size_t i = 0; i < n; i++) {
        double d = (double)x[i] - mean;
        ss += d * d;
    }
    double inv = 1.0 / sqrt(ss / (double)n + (double)eps);
    for (size_t i = 0; i < n; i++) {
        x[i] = w[i] * (float)(((double)x[i] - mean) * inv) + (b != NULL ? b[i] : 0.0f);
    }
}

/* x[0..n) clamped to [-c, c], as torch's clamp_(min=-c, max=c). */
static void clip(float *x, size_t n, float c) {
    for (size_t i = 0; i < n; i++) {
        x[i] = x[i] < -c ? -c : x[i] > c ? c : x[i];
    }
}

void attn__qkv_finish_heads(const attn_config *cfg, const struct attn__layer *l, float *row,
                            int32_t q_first, int32_t n_q, int32_t k_first, int32_t n_k) {
    size_t hd = (size_t)cfg->head_dim;
    float *q = row, *k = row + (size_t)cfg->n_heads * hd;
    float *v = k + (size_t)cfg->n_kv_heads * hd;
    if (cfg->clip_qkv > 0) {
        clip(q + q_first * hd, (size_t)n_q * hd, cfg->clip_qkv);
        clip(k + k_first * hd, (size_t)n_k * hd, cfg->clip_qkv);
        clip(v + k_first * hd, (size_t)n_k * hd, cfg->clip_qkv);
    }
    switch (cfg->qk_norm) {
    case ATTN_QK_NORM_HEAD:
        for (int32_t h = q_first; h < q_first + n_q; h++) {
            rms_norm(q + h * hd, hd, l->q_norm, cfg->qk_norm_eps);
        }
        for (int32_t h = k_first; h < k_first + n_k; h++) {
            rms_norm(k + h * hd, hd, l->k_norm, cfg->qk_norm_eps);
        }
        return;
    case ATTN_QK_NORM_WIDTH:
        /* one norm over every head: callers pass them all (attn__qk_norm_is_per_head) */
        rms_norm(q, (size_t)cfg->n_heads * hd, l->q_norm, cfg->qk_norm_eps);
        rms_norm(k, (size_t)cfg->n_kv_heads * hd, l->k_norm, cfg->qk_norm_eps);
        return;
    case ATTN_QK_NORM_HEAD_LAYERNORM:
        for (int32_t h = q_first; h < q_first + n_q; h++) {
            layer_norm(q + h * hd, hd, l->q_norm + h * hd, NULL, cfg->qk_norm_eps);
        }
        for (int32_t h = k_first; h < k_first + n_k; h++) {
            layer_norm(k + h * hd, hd, l->k_norm + h * hd, NULL, cfg->qk_norm_eps);
        }
        return;
    case ATTN_QK_NORM_HEAD_LAYERNORM_BIAS:
        for (int32_t h = q_first; h < q_first + n_q; h++) {
            layer_norm(q + h * hd, hd, l->q_norm, l->q_norm_bias, cfg->qk_norm_eps);
        }
        for (int32_t h = k_first; h < k_first + n_k; h++) {
            layer_norm(k + h * hd, hd, l->k_norm, l->k_norm_bias, cfg->qk_norm_eps);
        }
        return;
    case ATTN_QK_NORM_NONE:
        return;
    }
}

void attn__qkv_finish_row(const attn_config *cfg, const struct attn__layer *l, float *row) {
    attn__qkv_finish_heads(cfg, l, row, 0, cfg->n_heads, 0, cfg->n_kv_heads);
}

bool attn__qk_norm_is_per_head(const attn_config *cfg) {
    return cfg->qk_norm != ATTN_QK_NORM_WIDTH;
}
