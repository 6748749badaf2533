/* engine/rope.c: rotary position embedding. Frequencies follow HF transformers' rope init
 * functions (default, linear, llama3); the tables are computed once in double precision. */
#include "attn_int.h"

#include <math.h>

/* inv_freq[i] = theta^(-2i / rotary_dim), then rescaled per cfg->rope_scaling. */
static double rope_inv_freq(const attn_config *cfg, int32_t i) {
    double inv = pow((double)cfg->rope_theta, -2.0 * i / cfg->rotary_dim);
    const attn_rope_scaling *s = &cfg->rope_scaling;
    if (s->type == ATTN_ROPE_SCALING_LINEAR) {
        return inv / s->factor;
    }
    if (s->type == ATTN_ROPE_SCALING_LLAMA3) {
        /* Llama 3.1: long wavelengths are interpolated by `factor`, short ones kept, and the
         * band between blended linearly in old_context / wavelen. */
        double old_ctx = s->original_max_position;
        double low_wavelen = old_ctx / s->low_freq_factor;
        double high_wavelen = old_ctx / s->high_freq_factor;
        double wavelen = 2.0 * 3.14159265358979323846 / inv;
        if (wavelen > low_wavelen) {
            return inv / s->factor;
        }
        if (wavelen < high_wavelen) {
            return inv;
        }
        double smooth =
            (old_ctx / wavelen - s->low_freq_factor) / (s->high_freq_factor - s->low_freq_factor);
        return (1.0 - smooth) * inv / s->factor + smooth * inv;
    }
    return inv;
}

void attn__rope_tables(const attn_config *cfg, float *cos_table, float *sin_table) {
    int32_t half = cfg->rotary_dim / 2;
    for (int32_t i = 0; i < half; i++) {
        double inv = rope_inv_freq(cfg, i);
        for (int32_t pos = 0; pos < cfg->max_seq; pos++) {
            double angle = pos * inv;
            cos_table[(size_t)pos * half + i] = (float)cos(angle);
            sin_table[(size_t)pos * half + i] = (float)sin(angle);
        }
    }
}

void attn__rope_apply(const attn_model *m, float *x, int32_t n_heads, int32_t pos, bool is_local) {
    const attn_config *cfg = &m->cfg;
    int32_t half = cfg->rotary_dim / 2;
    if (half <= 0) {
        return;
    }
    const float *cos_table = is_local && m->rope_cos_local ? m->rope_cos_local : m->rope_cos;
    const float *sin_table = is_local && m->rope_sin_local ? m->rope_sin_local : m->rope_sin;
    const float *c = cos_table + (size_t)pos * half;
    const float *s = sin_table + (size_t)pos * half;
    for (int32_t h = 0; h < n_heads; h++) {
        float *v = x + (size_t)h * cfg->head_dim;
        if (cfg->rope_style == ATTN_ROPE_STYLE_HALF) {
            /* rotate_half: (x[i], x[i + half]) -> (x[i] c - x[i + half] s, x[i + half] c + x[i] s)
             */
            for (int32_t i = 0; i < half; i++) {
                float a = v[i], b = v[i + half];
                v[i] = a * c[i] - b * s[i];
                v[i + half] = b * c[i] + a * s[i];
            }
        } else {
            /* interleaved: (x[2i], x[2i + 1]) rotated by the same angle */
            for (int32_t i = 0; i < half; i++) {
                float a = v[2 * i], b = v[2 * i + 1];
                v[2 * i] = a * c[i] - b * s[i];
                v[2 * i + 1] = b * c[i] + a * s[i];
            }
        }
    }
}
