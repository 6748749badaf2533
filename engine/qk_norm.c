/* engine/qk_norm.c: the normalization some families apply to q and k before RoPE (attn.h,
 * attn_qk_norm): RMSNorm per head (Qwen3) or over the whole projection (OLMo 2), or LayerNorm of
 * each head with its own weight (StableLM 2, Cohere). Sums are taken in double, so the norm is
 * exact to float rounding whatever the width. */
#include "attn_int.h"

#include <math.h>

size_t attn__qk_norm_len(const attn_config *cfg, bool is_k) {
    switch (cfg->qk_norm) {
    case ATTN_QK_NORM_HEAD:
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

/* x[0..n) = w * (x - mean) / sqrt(var + eps), torch's LayerNorm without bias (biased var). */
static void layer_norm(float *x, size_t n, const float *w, float eps) {
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
        x[i] = w[i] * (float)(((double)x[i] - mean) * inv);
    }
}

void attn__qk_norm_heads(const attn_config *cfg, const struct attn__layer *l, float *row,
                         int32_t q_first, int32_t n_q, int32_t k_first, int32_t n_k) {
    size_t hd = (size_t)cfg->head_dim;
    float *q = row, *k = row + (size_t)cfg->n_heads * hd;
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
            layer_norm(q + h * hd, hd, l->q_norm + h * hd, cfg->qk_norm_eps);
        }
        for (int32_t h = k_first; h < k_first + n_k; h++) {
            layer_norm(k + h * hd, hd, l->k_norm + h * hd, cfg->qk_norm_eps);
        }
        return;
    case ATTN_QK_NORM_NONE:
        return;
    }
}

void attn__qk_norm_apply(const attn_config *cfg, const struct attn__layer *l, float *row) {
    attn__qk_norm_heads(cfg, l, row, 0, cfg->n_heads, 0, cfg->n_kv_heads);
}

bool attn__qk_norm_is_per_head(const attn_config *cfg) {
    return cfg->qk_norm != ATTN_QK_NORM_WIDTH;
}
