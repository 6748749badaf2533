/* engine/rope.c: rotary position embedding. Frequencies follow transformers' rope init
 * functions (default, linear, llama3, yarn, longrope, dynamic); the tables are computed once in
 * double precision, and for dynamic NTK past the original context, per call. */
#include "attn_int.h"

#include <math.h>

static const double pi = 3.14159265358979323846;

/* YaRN's dimension (possibly fractional) at which a frequency turns n_rot times within the
 * original context: d ln(original / (2 pi n_rot)) / (2 ln theta). */
static double yarn_correction_dim(double n_rot, double dim, double theta, double original) {
    return dim * log(original / (n_rot * 2.0 * pi)) / (2.0 * log(theta));
}

/* The weight of inv_freq / factor (interpolation) at frequency i: 0 below the correction range,
 * 1 above it, linear between. */
static double yarn_ramp(const attn_rope_scaling *s, double theta, int32_t dim, int32_t i) {
    double low = yarn_correction_dim(s->beta_fast, dim, theta, s->original_max_position);
    double high = yarn_correction_dim(s->beta_slow, dim, theta, s->original_max_position);
    if (!s->yarn_fractional_range) {
        low = floor(low);
        high = ceil(high);
    }
    low = low > 0 ? low : 0;
    high = high < dim - 1 ? high : dim - 1;
    if (low == high) {
        high += 0.001; /* as transformers does, so the ramp is a step, not 0/0 */
    }
    double r = (i - low) / (high - low);
    return r < 0 ? 0 : r > 1 ? 1 : r;
}

/* inv_freq[i] = theta^(-2i / rotary_dim), then rescaled per cfg->rope_scaling (not dynamic,
 * whose per-call theta the frame computes). */
static double rope_inv_freq(const attn_config *cfg, bool long_factors, int32_t i) {
    double theta = cfg->rope_theta;
    double inv = pow(theta, -2.0 * i / cfg->rotary_dim);
    const attn_rope_scaling *s = &cfg->rope_scaling;
    switch (s->type) {
    case ATTN_ROPE_SCALING_LINEAR:
        return inv / s->factor;
    case ATTN_ROPE_SCALING_LLAMA3: {
        /* Llama 3.1: long wavelengths are interpolated by `factor`, short ones kept, and the
         * band between blended linearly in old_context / wavelen. */
        double old_ctx = s->original_max_position;
        double low_wavelen = old_ctx / s->low_freq_factor;
        double high_wavelen = old_ctx / s->high_freq_factor;
        double wavelen = 2.0 * pi / inv;
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
    case ATTN_ROPE_SCALING_YARN: {
        double ramp = yarn_ramp(s, theta, cfg->rotary_dim, i);
        return inv / s->factor * ramp + inv * (1.0 - ramp);
    }
    case ATTN_ROPE_SCALING_LONGROPE:
        return inv / (long_factors ? s->long_factor[i] : s->short_factor[i]);
    case ATTN_ROPE_SCALING_NONE:
    case ATTN_ROPE_SCALING_DYNAMIC:
        break;
    }
    return inv;
}

/* What cos and sin are multiplied by (transformers' attention_scaling). */
static double rope_attention_factor(const attn_rope_scaling *s) {
    bool has = s->type == ATTN_ROPE_SCALING_YARN || s->type == ATTN_ROPE_SCALING_LONGROPE;
    return has ? s->attention_factor : 1.0;
}

void attn__rope_tables(const attn_config *cfg, bool long_factors, float *cos_table,
                       float *sin_table) {
    int32_t half = cfg->rotary_dim / 2;
    double mag = rope_attention_factor(&cfg->rope_scaling);
    for (int32_t i = 0; i < half; i++) {
        double inv = rope_inv_freq(cfg, long_factors, i);
        for (int32_t pos = 0; pos < cfg->max_seq; pos++) {
            double angle = pos * inv;
            cos_table[(size_t)pos * half + i] = (float)(mag * cos(angle));
            sin_table[(size_t)pos * half + i] = (float)(mag * sin(angle));
        }
    }
}

bool attn__rope_depends_on_call(const attn_config *cfg) {
    attn_rope_scaling_type t = cfg->rope_scaling.type;
    return cfg->rotary_dim > 0 &&
           (t == ATTN_ROPE_SCALING_LONGROPE || t == ATTN_ROPE_SCALING_DYNAMIC);
}

void attn__rope_frame_init(const attn_model *m, bool is_local, int32_t max_pos,
                           struct attn__rope_frame *f) {
    const attn_config *cfg = &m->cfg;
    const attn_rope_scaling *s = &cfg->rope_scaling;
    f->half = cfg->rotary_dim / 2;
    f->cos_table = m->rope_cos;
    f->sin_table = m->rope_sin;
    if (is_local && m->rope_cos_local != NULL) {
        f->cos_table = m->rope_cos_local;
        f->sin_table = m->rope_sin_local;
        return;
    }
    /* transformers decides on seq_len = max(position_ids) + 1 of the forward call. */
    int64_t seq_len = (int64_t)max_pos + 1;
    if (s->type == ATTN_ROPE_SCALING_LONGROPE && seq_len > s->original_max_position) {
        f->cos_table = m->rope_cos_long;
        f->sin_table = m->rope_sin_long;
    } else if (s->type == ATTN_ROPE_SCALING_DYNAMIC && seq_len > s->original_max_position) {
        /* _compute_dynamic_ntk_parameters: theta grows with the length the call reaches. */
        double d = cfg->rotary_dim;
        double grow = (double)s->factor * (double)seq_len / s->original_max_position -
                      ((double)s->factor - 1.0);
        double theta = cfg->rope_theta * pow(grow, d / (d - 2.0));
        for (int32_t i = 0; i < f->half; i++) {
            f->inv[i] = pow(theta, -2.0 * i / d);
        }
        f->cos_table = NULL;
        f->sin_table = NULL;
    }
}

static void rotate(const attn_config *cfg, float *x, int32_t n_heads, const float *c,
                   const float *s) {
    int32_t half = cfg->rotary_dim / 2;
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

void attn__rope_apply(const attn_config *cfg, struct attn__rope_frame *f, float *q, int32_t n_q,
                      float *k, int32_t n_k, int32_t pos) {
    if (f->half <= 0) {
        return;
    }
    const float *c, *s;
    if (f->cos_table != NULL) {
        c = f->cos_table + (size_t)pos * f->half;
        s = f->sin_table + (size_t)pos * f->half;
    } else {
        for (int32_t i = 0; i < f->half; i++) {
            double angle = pos * f->inv[i];
            f->cos_row[i] = (float)cos(angle);
            f->sin_row[i] = (float)sin(angle);
        }
        c = f->cos_row;
        s = f->sin_row;
    }
    rotate(cfg, q, n_q, c, s);
    rotate(cfg, k, n_k, c, s);
}
