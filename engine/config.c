/* engine/config.c: named presets and validation of attn_config (defaults filled in here, once). */
#include "attn.h"

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
} presets[] = {
    {"tiny", 2, 64, 4, 2, 16, 1024, 10000.0f},
    {"small", 4, 512, 8, 2, 64, 8192, 10000.0f},
    {"llama8b", 32, 4096, 32, 8, 128, 8192, 500000.0f},
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
    int rc = attn_config_check(&c);
    if (rc == ATTN_OK) {
        *out = c;
    }
    return rc;
}

static int check_rope_scaling(const attn_rope_scaling *s) {
    switch (s->type) {
    case ATTN_ROPE_SCALING_NONE:
        return ATTN_OK;
    case ATTN_ROPE_SCALING_LINEAR:
        return isfinite(s->factor) && s->factor > 0 ? ATTN_OK : ATTN_EINVAL;
    case ATTN_ROPE_SCALING_LLAMA3:
        if (!isfinite(s->factor) || s->factor <= 0 || !(s->low_freq_factor > 0) ||
            !(s->high_freq_factor > s->low_freq_factor) || s->original_max_position <= 0) {
            return ATTN_EINVAL;
        }
        return ATTN_OK;
    }
    return ATTN_EINVAL;
}

int attn_config_check(attn_config *cfg) {
    if (cfg == NULL) {
        return ATTN_EINVAL;
    }
    attn_config c = *cfg;
    if (c.n_layers < 1 || c.hidden_size < 1 || c.n_heads < 1 || c.n_kv_heads < 1 || c.max_seq < 1 ||
        c.sliding_window < 0 || c.head_dim < 0) {
        return ATTN_EINVAL;
    }
    if (c.n_heads % c.n_kv_heads != 0) {
        return ATTN_ESHAPE;
    }
    if (c.head_dim == 0) {
        if (c.hidden_size % c.n_heads != 0) {
            return ATTN_ESHAPE;
        }
        c.head_dim = c.hidden_size / c.n_heads;
    }
    if (c.rotary_dim == 0) {
        c.rotary_dim = c.head_dim & ~1;
    }
    if (c.rotary_dim != -1 &&
        (c.rotary_dim < 0 || c.rotary_dim % 2 != 0 || c.rotary_dim > c.head_dim)) {
        return ATTN_ESHAPE;
    }
    if (c.rope_theta == 0) {
        c.rope_theta = 10000.0f;
    }
    if (!isfinite(c.rope_theta) || c.rope_theta <= 1.0f) {
        return ATTN_EINVAL;
    }
    if (c.rope_style != ATTN_ROPE_STYLE_HALF && c.rope_style != ATTN_ROPE_STYLE_INTERLEAVED) {
        return ATTN_EINVAL;
    }
    if (check_rope_scaling(&c.rope_scaling) != ATTN_OK) {
        return ATTN_EINVAL;
    }
    if (c.qk_norm != ATTN_QK_NORM_NONE && c.qk_norm != ATTN_QK_NORM_HEAD &&
        c.qk_norm != ATTN_QK_NORM_WIDTH) {
        return ATTN_EINVAL;
    }
    if (c.qk_norm_eps == 0) {
        c.qk_norm_eps = 1e-6f;
    }
    if (!isfinite(c.qk_norm_eps) || c.qk_norm_eps < 0) {
        return ATTN_EINVAL;
    }
    if (c.n_layers > ATTN_MAX_LAYERS) {
        return ATTN_ERANGE;
    }
    if (!isfinite(c.logit_softcap) || c.logit_softcap < 0 || !isfinite(c.rope_theta_local) ||
        (c.rope_theta_local != 0 && c.rope_theta_local <= 1.0f)) {
        return ATTN_EINVAL;
    }
    if (c.softmax_scale == 0) {
        c.softmax_scale = 1.0f / sqrtf((float)c.head_dim);
    }
    if (!isfinite(c.softmax_scale) || c.softmax_scale <= 0) {
        return ATTN_EINVAL;
    }
    /* Keeps every float count of a layer well inside size_t and int32 index arithmetic. */
    if ((int64_t)c.n_heads * c.head_dim > (1 << 20) || c.hidden_size > (1 << 20) ||
        c.max_seq > (1 << 24)) {
        return ATTN_ERANGE;
    }
    *cfg = c;
    return ATTN_OK;
}

bool attn_config_layer_is_sliding(const attn_config *cfg, int32_t layer) {
    return cfg->sliding_window > 0 && layer >= 0 && layer < ATTN_MAX_LAYERS &&
           !cfg->is_full_layer[layer];
}
