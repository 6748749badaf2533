/* engine/config.c: named presets and validation of attn_config (defaults filled in here, once). */
#include "attn.h"
#include "attn_int.h"

#include <math.h>
#include <string.h>

static attn_config config_base(void) {
    attn_config c;
    memset(&c, 0, sizeof c);
    c.rope_theta = 10000.0f;
    c.rope_style = ATTN_ROPE_STYLE_HALF;
    c.rope_scaling.type = ATTN_ROPE_SCALING_NONE;
    return c;
}

/* The built-in geometries; everything not named takes config_base()'s value. */
static const struct preset {
    const char *name;
    int32_t n_layers, hidden_size, n_heads, n_kv_heads, head_dim, max_seq;
    float rope_theta;
    bool is_linear; /* every layer linear attention */
} presets[] = {
    {"tiny", 2, 64, 4, 2, 16, 1024, 10000.0f, false},
    {"small", 4, 512, 8, 2, 64, 8192, 10000.0f, false},
    {"llama8b", 32, 4096, 32, 8, 128, 8192, 500000.0f, false},
    /* small's geometry with linear attention, and the context of a long document */
    {"small-linear", 4, 512, 8, 2, 64, 1 << 17, 10000.0f, true},
};

int attn_config_preset(const char *name, attn_config *out) {
    if (name == NULL || out == NULL) {
        return ATTN_EINVAL;
    }
    const struct preset *p = NULL;
    for (size_t i = 0; i < sizeof presets / sizeof presets[0]; i++) {
        if (strcmp(name, presets[i].name) == 0) {
            p = &presets[i];
        }
    }
    if (p == NULL) {
        return ATTN_EINVAL;
    }
    attn_config c = config_base();
    c.n_layers = p->n_layers;
    c.hidden_size = p->hidden_size;
    c.n_heads = p->n_heads;
    c.n_kv_heads = p->n_kv_heads;
    c.head_dim = p->head_dim;
    c.max_seq = p->max_seq;
    c.rope_theta = p->rope_theta;
    for (int32_t l = 0; l < c.n_layers; l++) {
        c.layer_kind[l] = p->is_linear ? ATTN_LAYER_LINEAR : ATTN_LAYER_SOFTMAX;
    }
    int rc = attn_config_check(&c);
    if (rc == ATTN_OK) {
        *out = c;
    }
    return rc;
}

/* Records why a config is refused: a static sentence naming the field by its Hugging Face
 * config.json name, then attnd's own where it differs, so both a loader's user and an engine
 * caller can find it. */
static int refuse(int code, const char *reason, const char **why) {
    if (why != NULL) {
        *why = reason;
    }
    return code;
}

static bool positive(float x) {
    return isfinite(x) && x > 0;
}

/* transformers' yarn get_mscale: 0.1 * mscale * ln(scale) + 1, or 1 for scale <= 1. */
static double yarn_mscale(double scale, double mscale) {
    return scale <= 1 ? 1.0 : 0.1 * mscale * log(scale) + 1.0;
}

/* Checks the scaling parameters of *s for rotary_dim and fills its defaults (yarn's betas, the
 * attention factors), as transformers derives them. */
static int check_rope_scaling(attn_rope_scaling *s, int32_t rotary_dim, const char **why) {
    int32_t half = rotary_dim / 2;
    switch (s->type) {
    case ATTN_ROPE_SCALING_NONE:
        return ATTN_OK;
    case ATTN_ROPE_SCALING_LINEAR:
        return positive(s->factor) ? ATTN_OK
                                   : refuse(ATTN_EINVAL, "rope_scaling.factor must be > 0", why);
    case ATTN_ROPE_SCALING_LLAMA3:
        if (!positive(s->factor) || !positive(s->low_freq_factor) ||
            !(isfinite(s->high_freq_factor) && s->high_freq_factor > s->low_freq_factor) ||
            s->original_max_position <= 0) {
            return refuse(ATTN_EINVAL,
                          "llama3 rope_scaling needs factor > 0, 0 < low_freq_factor < "
                          "high_freq_factor and original_max_position_embeddings > 0",
                          why);
        }
        return ATTN_OK;
    case ATTN_ROPE_SCALING_YARN:
        if (s->beta_fast == 0) {
            s->beta_fast = 32;
        }
        if (s->beta_slow == 0) {
            s->beta_slow = 1;
        }
        if (!positive(s->factor) || s->original_max_position <= 0 || !positive(s->beta_fast) ||
            !positive(s->beta_slow) || !isfinite(s->mscale) || !isfinite(s->mscale_all_dim) ||
            !isfinite(s->attention_factor) || s->attention_factor < 0 || rotary_dim < 2) {
            return refuse(ATTN_EINVAL,
                          "yarn rope_scaling needs factor > 0, original_max_position_embeddings "
                          "> 0, beta_fast and beta_slow > 0, finite mscale, mscale_all_dim and "
                          "attention_factor, and rotary dims",
                          why);
        }
        if (s->attention_factor == 0) {
            s->attention_factor = s->mscale != 0 && s->mscale_all_dim != 0
                                      ? (float)(yarn_mscale(s->factor, s->mscale) /
                                                yarn_mscale(s->factor, s->mscale_all_dim))
                                      : (float)yarn_mscale(s->factor, 1.0);
        }
        return ATTN_OK;
    case ATTN_ROPE_SCALING_LONGROPE:
        if (half < 1 || half > ATTN_MAX_ROPE_FACTORS || s->original_max_position <= 0 ||
            !isfinite(s->factor) || !isfinite(s->attention_factor) || s->attention_factor < 0) {
            return refuse(ATTN_EINVAL,
                          "longrope rope_scaling needs rotary dims / 2 in 1..256, "
                          "original_max_position_embeddings > 0 and a finite factor",
                          why);
        }
        for (int32_t i = 0; i < half; i++) {
            if (!positive(s->short_factor[i]) || !positive(s->long_factor[i])) {
                return refuse(ATTN_EINVAL,
                              "longrope short_factor and long_factor must hold rotary dims / 2 "
                              "values > 0",
                              why);
            }
        }
        if (s->attention_factor == 0) {
            s->attention_factor =
                s->factor <= 1 ? 1.0f
                               : (float)sqrt(1.0 + log(s->factor) / log(s->original_max_position));
        }
        return ATTN_OK;
    case ATTN_ROPE_SCALING_DYNAMIC:
        if (!positive(s->factor) || s->original_max_position <= 0 || rotary_dim <= 2 ||
            half > ATTN_MAX_ROPE_FACTORS) {
            return refuse(ATTN_EINVAL,
                          "dynamic rope_scaling needs factor > 0, max_position_embeddings > 0 "
                          "and rotary dims in 4..512",
                          why);
        }
        return ATTN_OK;
    }
    return refuse(ATTN_EINVAL, "unknown rope_scaling type", why);
}

/* Multi-head latent attention's dimensions, and what does not combine with it; fills head_dim,
 * rotary_dim and the norm's eps. */
static int check_mla(attn_config *c, const char **why) {
    if (c->kv_lora_rank < 0 || c->q_lora_rank < 0 || c->qk_nope_head_dim < 0 ||
        c->qk_rope_head_dim <= 0 || c->qk_rope_head_dim % 2 != 0 || c->v_head_dim <= 0 ||
        c->kv_lora_rank > (1 << 16) || c->q_lora_rank > (1 << 16) ||
        c->qk_nope_head_dim > (1 << 16) || c->qk_rope_head_dim > (1 << 16) ||
        c->v_head_dim > (1 << 16)) {
        return refuse(ATTN_EINVAL,
                      "kv_lora_rank, q_lora_rank, qk_nope_head_dim, qk_rope_head_dim (even, > 0) "
                      "and v_head_dim must be in range",
                      why);
    }
    if (c->n_kv_heads != 1) {
        return refuse(ATTN_ESHAPE,
                      "multi-head latent attention caches one latent: n_kv_heads must be 1", why);
    }
    int32_t qk = c->qk_nope_head_dim + c->qk_rope_head_dim;
    if ((c->head_dim != 0 && c->head_dim != qk) ||
        (c->rotary_dim != 0 && c->rotary_dim != c->qk_rope_head_dim)) {
        return refuse(ATTN_ESHAPE,
                      "multi-head latent attention: head_dim must be qk_nope_head_dim + "
                      "qk_rope_head_dim and rotary_dim qk_rope_head_dim",
                      why);
    }
    c->head_dim = qk;
    c->rotary_dim = c->qk_rope_head_dim;
    bool has_linear = false, has_nope = false;
    for (int32_t l = 0; l < c->n_layers; l++) {
        has_linear |= c->layer_kind[l] != ATTN_LAYER_SOFTMAX;
        has_nope |= c->is_nope_layer[l];
    }
    if (c->sliding_window > 0 || c->qk_norm != ATTN_QK_NORM_NONE || c->logit_softcap > 0 ||
        c->has_sinks || c->rope_sliding_only || has_nope || c->rope_theta_local > 0 || has_linear ||
        c->clip_qkv != 0) {
        return refuse(ATTN_EUNSUPPORTED,
                      "multi-head latent attention does not combine with sliding_window, q/k "
                      "norms, clip_qkv, soft-capping, sinks, layers without RoPE or linear layers",
                      why);
    }
    if (c->mla_norm_eps == 0) {
        c->mla_norm_eps = 1e-6f;
    }
    if (!isfinite(c->mla_norm_eps) || c->mla_norm_eps < 0) {
        return refuse(ATTN_EINVAL, "rms_norm_eps (mla_norm_eps) must be finite and >= 0", why);
    }
    return ATTN_OK;
}

int attn__config_check_why(attn_config *cfg, const char **why) {
    if (cfg == NULL) {
        return refuse(ATTN_EINVAL, "no config", why);
    }
    attn_config c = *cfg;
    if (c.n_layers < 1 || c.n_layers > ATTN_MAX_LAYERS) {
        return refuse(c.n_layers < 1 ? ATTN_EINVAL : ATTN_ERANGE,
                      "num_hidden_layers (n_layers) must be 1..512", why);
    }
    if (c.hidden_size < 1 || c.hidden_size > (1 << 20)) {
        return refuse(c.hidden_size < 1 ? ATTN_EINVAL : ATTN_ERANGE,
                      "hidden_size must be 1..1048576", why);
    }
    if (c.n_heads < 1 || c.n_kv_heads < 1) {
        return refuse(ATTN_EINVAL,
                      "num_attention_heads and num_key_value_heads (n_heads, n_kv_heads) must be "
                      ">= 1",
                      why);
    }
    if (c.max_seq < 1 || c.max_seq > (1 << 24)) {
        return refuse(c.max_seq < 1 ? ATTN_EINVAL : ATTN_ERANGE,
                      "max_position_embeddings (max_seq) must be 1..16777216", why);
    }
    if (c.sliding_window < 0) {
        return refuse(ATTN_EINVAL, "sliding_window must be >= 0", why);
    }
    if (c.head_dim < 0) {
        return refuse(ATTN_EINVAL, "head_dim must be >= 0 (0: hidden_size / heads)", why);
    }
    if (c.n_heads % c.n_kv_heads != 0) {
        return refuse(ATTN_ESHAPE,
                      "num_attention_heads (n_heads) must be a multiple of num_key_value_heads "
                      "(n_kv_heads)",
                      why);
    }
    if (c.kv_lora_rank != 0) {
        int rc = check_mla(&c, why);
        if (rc != ATTN_OK) {
            return rc;
        }
    }
    if (c.head_dim == 0) {
        if (c.hidden_size % c.n_heads != 0) {
            return refuse(ATTN_ESHAPE,
                          "hidden_size must be a multiple of num_attention_heads when head_dim "
                          "is not given",
                          why);
        }
        c.head_dim = c.hidden_size / c.n_heads;
    }
    /* Keeps every float count of a layer well inside size_t and int32 index arithmetic. */
    if ((int64_t)c.n_heads * c.head_dim > (1 << 20)) {
        return refuse(ATTN_ERANGE, "num_attention_heads x head_dim must be <= 1048576", why);
    }
    if (c.rotary_dim == 0) {
        /* all of the head: an odd head_dim is refused below (rotate_half pairs i with i + D/2;
         * rotating D - 1 of its dims would be a plausible wrong answer, not the model's) */
        c.rotary_dim = c.head_dim;
    }
    if (c.rotary_dim != -1 &&
        (c.rotary_dim < 0 || c.rotary_dim % 2 != 0 || c.rotary_dim > c.head_dim)) {
        return refuse(ATTN_ESHAPE,
                      "the rotary dimensions (partial_rotary_factor x head_dim, rotary_dim) must "
                      "be even and at most head_dim",
                      why);
    }
    if (c.rope_theta == 0) {
        c.rope_theta = 10000.0f;
    }
    if (!isfinite(c.rope_theta) || c.rope_theta <= 1.0f) {
        return refuse(ATTN_EINVAL, "rope_theta must be finite and > 1", why);
    }
    if (c.rope_theta_local != 0 && !(isfinite(c.rope_theta_local) && c.rope_theta_local > 1.0f)) {
        return refuse(ATTN_EINVAL, "rope_local_base_freq (rope_theta_local) must be finite and > 1",
                      why);
    }
    if (c.rope_style != ATTN_ROPE_STYLE_HALF && c.rope_style != ATTN_ROPE_STYLE_INTERLEAVED) {
        return refuse(ATTN_EINVAL, "rope_style must be half or interleaved", why);
    }
    if (c.rotary_dim > 0) {
        int rc = check_rope_scaling(&c.rope_scaling, c.rotary_dim, why);
        if (rc != ATTN_OK) {
            return rc;
        }
    }
    if (c.qk_norm != ATTN_QK_NORM_NONE && c.qk_norm != ATTN_QK_NORM_HEAD &&
        c.qk_norm != ATTN_QK_NORM_WIDTH && c.qk_norm != ATTN_QK_NORM_HEAD_LAYERNORM &&
        c.qk_norm != ATTN_QK_NORM_HEAD_LAYERNORM_BIAS) {
        return refuse(ATTN_EINVAL,
                      "qk_norm must be none, head, width, head_layernorm or head_layernorm_bias",
                      why);
    }
    if (c.qk_norm_eps == 0) {
        c.qk_norm_eps = 1e-6f;
    }
    if (!isfinite(c.qk_norm_eps) || c.qk_norm_eps < 0) {
        return refuse(ATTN_EINVAL, "rms_norm_eps (qk_norm_eps) must be finite and >= 0", why);
    }
    if (!isfinite(c.clip_qkv) || c.clip_qkv < 0) {
        return refuse(ATTN_EINVAL, "clip_qkv must be finite and >= 0 (0: none)", why);
    }
    if (!isfinite(c.logit_softcap) || c.logit_softcap < 0) {
        return refuse(ATTN_EINVAL, "attn_logit_softcapping (logit_softcap) must be finite and >= 0",
                      why);
    }
    for (int32_t l = 0; l < c.n_layers; l++) {
        if (c.layer_kind[l] != ATTN_LAYER_SOFTMAX && c.layer_kind[l] != ATTN_LAYER_LINEAR) {
            return refuse(ATTN_EINVAL, "layer_kind must be softmax or linear", why);
        }
        if (c.layer_kind[l] == ATTN_LAYER_LINEAR &&
            (c.logit_softcap > 0 || c.has_sinks || (c.sliding_window > 0 && !c.is_full_layer[l]))) {
            return refuse(ATTN_EUNSUPPORTED,
                          "a linear-attention layer has no scores and no window: "
                          "attn_logit_softcapping, sinks and sliding_window cannot apply to it",
                          why);
        }
    }
    if (c.softmax_scale == 0) {
        c.softmax_scale = 1.0f / sqrtf((float)c.head_dim);
    }
    if (!isfinite(c.softmax_scale) || c.softmax_scale <= 0) {
        return refuse(ATTN_EINVAL,
                      "the softmax scale (query_pre_attn_scalar^-1/2, attention_multiplier, "
                      "softmax_scale) must be finite and > 0",
                      why);
    }
    *cfg = c;
    return ATTN_OK;
}

int attn_config_check(attn_config *cfg) {
    return attn__config_check_why(cfg, NULL);
}

bool attn_config_layer_is_linear(const attn_config *cfg, int32_t layer) {
    return layer >= 0 && layer < ATTN_MAX_LAYERS && cfg->layer_kind[layer] == ATTN_LAYER_LINEAR;
}

bool attn_config_layer_is_sliding(const attn_config *cfg, int32_t layer) {
    return cfg->sliding_window > 0 && layer >= 0 && layer < ATTN_MAX_LAYERS &&
           !cfg->is_full_layer[layer];
}

bool attn_config_layer_rotates(const attn_config *cfg, int32_t layer) {
    return cfg->rotary_dim > 0 && !attn_config_layer_is_linear(cfg, layer) &&
           (!cfg->rope_sliding_only || attn_config_layer_is_sliding(cfg, layer)) &&
           (layer < 0 || layer >= ATTN_MAX_LAYERS || !cfg->is_nope_layer[layer]);
}
