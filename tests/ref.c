/* tests/ref.c: the plain-loop reference (see ref.h). Written to be read, not to be fast: one
 * obvious loop per formula, double accumulators, no BLAS and nothing from engine/. The tests keep
 * sizes small enough that O(N^2 * heads * head_dim) in double is instant. */
#include "ref.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- helpers ------------------------------------------------------------------------------- */

/* M_PI is not in strict C11 with only _POSIX_C_SOURCE. */
static const double pi = 3.14159265358979323846;

/* Test scaffolding: an allocation failure here is not something to recover from. */
static void *xcalloc(size_t n, size_t size) {
    void *p = calloc(n == 0 ? 1 : n, size);
    if (p == NULL) {
        fprintf(stderr, "ref: out of memory (%zu x %zu bytes)\n", n, size);
        abort();
    }
    return p;
}

/* y[o] = sum_i W[o][i] x[i] (+ b[o]) for W (n_out, n_in) row-major, in double. */
static void linear(const float *w, const float *b, const double *x, int32_t n_out, int32_t n_in,
                   double *y) {
    for (int32_t o = 0; o < n_out; o++) {
        double acc = b != NULL ? (double)b[o] : 0.0;
        for (int32_t i = 0; i < n_in; i++) {
            acc += (double)w[(size_t)o * n_in + i] * x[i];
        }
        y[o] = acc;
    }
}

static double dot(const double *a, const double *b, int32_t n) {
    double acc = 0.0;
    for (int32_t i = 0; i < n; i++) {
        acc += a[i] * b[i];
    }
    return acc;
}

/* ---- random test data ---------------------------------------------------------------------- */

void ref_rng_init(ref_rng *r, uint64_t seed) {
    r->state = seed;
}

/* splitmix64 (Steele, Lea, Flood 2014). */
uint64_t ref_rng_next(ref_rng *r) {
    uint64_t z = (r->state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

float ref_rng_uniform(ref_rng *r, float lo, float hi) {
    /* 24 random bits give every float in [0, 1) on a uniform grid. */
    double u = (double)(ref_rng_next(r) >> 40) / (double)(1u << 24);
    return (float)(lo + (hi - lo) * u);
}

void ref_fill_uniform(ref_rng *r, float *a, size_t n, float lo, float hi) {
    for (size_t i = 0; i < n; i++) {
        a[i] = ref_rng_uniform(r, lo, hi);
    }
}

/* ---- model description --------------------------------------------------------------------- */

int32_t ref_head_dim(const attn_config *cfg) {
    return cfg->head_dim > 0 ? cfg->head_dim : cfg->hidden_size / cfg->n_heads;
}

int32_t ref_rotary_dim(const attn_config *cfg) {
    if (cfg->rotary_dim < 0) {
        return 0;
    }
    return cfg->rotary_dim > 0 ? cfg->rotary_dim : ref_head_dim(cfg);
}

double ref_rope_theta(const attn_config *cfg) {
    return cfg->rope_theta > 0.0f ? (double)cfg->rope_theta : 10000.0;
}

double ref_softmax_scale(const attn_config *cfg) {
    return cfg->softmax_scale > 0.0f ? (double)cfg->softmax_scale
                                     : 1.0 / sqrt((double)ref_head_dim(cfg));
}

static float *random_tensor(ref_rng *r, size_t n, int32_t in_features) {
    float *t = xcalloc(n, sizeof(float));
    float bound = (float)(1.0 / sqrt((double)in_features));
    ref_fill_uniform(r, t, n, -bound, bound);
    return t;
}

void ref_layer_init_random(ref_layer *w, const attn_config *cfg, ref_rng *r) {
    size_t hidden = (size_t)cfg->hidden_size;
    size_t q_dim = (size_t)cfg->n_heads * ref_head_dim(cfg);
    size_t kv_dim = (size_t)cfg->n_kv_heads * ref_head_dim(cfg);
    w->wq = random_tensor(r, q_dim * hidden, cfg->hidden_size);
    w->wk = random_tensor(r, kv_dim * hidden, cfg->hidden_size);
    w->wv = random_tensor(r, kv_dim * hidden, cfg->hidden_size);
    w->wo = random_tensor(r, hidden * q_dim, (int32_t)q_dim);
    w->bq = random_tensor(r, q_dim, cfg->hidden_size);
    w->bk = random_tensor(r, kv_dim, cfg->hidden_size);
    w->bv = random_tensor(r, kv_dim, cfg->hidden_size);
    w->bo = random_tensor(r, hidden, (int32_t)q_dim);
    /* Sinks in [-1, 3): from a small share of a row's mass to most of it. */
    w->sinks = xcalloc((size_t)cfg->n_heads, sizeof(float));
    ref_fill_uniform(r, w->sinks, (size_t)cfg->n_heads, -1.0f, 3.0f);
}

void ref_layer_release(ref_layer *w) {
    free(w->wq);
    free(w->wk);
    free(w->wv);
    free(w->wo);
    free(w->bq);
    free(w->bk);
    free(w->bv);
    free(w->bo);
    free(w->sinks);
    memset(w, 0, sizeof(*w));
}

/* ---- RoPE ---------------------------------------------------------------------------------- */

void ref_rope_inv_freq(const attn_config *cfg, double *inv_freq) {
    const attn_rope_scaling *sc = &cfg->rope_scaling;
    int32_t rotary_dim = ref_rotary_dim(cfg);
    double theta = ref_rope_theta(cfg);
    for (int32_t i = 0; i < rotary_dim / 2; i++) {
        double f = pow(theta, -(2.0 * i) / rotary_dim);
        if (sc->type == ATTN_ROPE_SCALING_LINEAR) {
            f /= sc->factor;
        } else if (sc->type == ATTN_ROPE_SCALING_LLAMA3) {
            double orig = (double)sc->original_max_position;
            double low_wavelen = orig / sc->low_freq_factor;
            double high_wavelen = orig / sc->high_freq_factor;
            double wavelen = 2.0 * pi / f;
            if (wavelen < high_wavelen) {
                /* high frequency: kept as is */
            } else if (wavelen > low_wavelen) {
                f /= sc->factor;
            } else {
                double s = (orig / wavelen - sc->low_freq_factor) /
                           (sc->high_freq_factor - sc->low_freq_factor);
                f = (1.0 - s) * f / sc->factor + s * f;
            }
        }
        inv_freq[i] = f;
    }
}

void ref_rope_rotate(const attn_config *cfg, const double *inv_freq, int32_t pos, double *vec) {
    int32_t half = ref_rotary_dim(cfg) / 2;
    for (int32_t i = 0; i < half; i++) {
        double angle = (double)pos * inv_freq[i];
        double c = cos(angle);
        double s = sin(angle);
        int32_t ia = cfg->rope_style == ATTN_ROPE_STYLE_INTERLEAVED ? 2 * i : i;
        int32_t ib = cfg->rope_style == ATTN_ROPE_STYLE_INTERLEAVED ? 2 * i + 1 : i + half;
        double a = vec[ia];
        double b = vec[ib];
        vec[ia] = a * c - b * s;
        vec[ib] = b * c + a * s;
    }
}

/* ---- softmax over one row ------------------------------------------------------------------ */

/* p[j] = exp(s[j] - max) / (sum over visible j + exp(sink - max)), 0 elsewhere; sink is -inf
 * without sinks. Returns false (and all zeros) when no key is visible, which is how a fully
 * masked row becomes zeros instead of 0/0. */
static bool softmax_row(const double *s, const bool *visible, int32_t n, double sink, double *p) {
    double max = sink;
    for (int32_t j = 0; j < n; j++) {
        if (visible[j] && s[j] > max) {
            max = s[j];
        }
    }
    double sum = 0.0;
    for (int32_t j = 0; j < n; j++) {
        p[j] = visible[j] ? exp(s[j] - max) : 0.0;
        sum += p[j];
    }
    if (sum == 0.0) {
        return false;
    }
    sum += exp(sink - max);
    for (int32_t j = 0; j < n; j++) {
        p[j] /= sum;
    }
    return true;
}

/* ---- what a KV cache of each dtype holds ----------------------------------------------------- */

static double bf16_round(float f) {
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    u = (u + 0x7fffu + ((u >> 16) & 1u)) & 0xffff0000u; /* to nearest, ties to even */
    memcpy(&f, &u, sizeof f);
    return f;
}

void ref_kv_round(attn_dtype dt, double *row, int32_t d) {
    if (dt == ATTN_DTYPE_BF16 || dt == ATTN_DTYPE_F16) {
        for (int32_t i = 0; i < d; i++) {
            float f = (float)row[i];
            row[i] = dt == ATTN_DTYPE_BF16 ? bf16_round(f) : (double)(_Float16)f;
        }
        return;
    }
    if (dt != ATTN_DTYPE_Q8_0) {
        return;
    }
    for (int32_t b = 0; b < d; b += 32) {
        int32_t n = d - b < 32 ? d - b : 32;
        float amax = 0.0f;
        for (int32_t i = 0; i < n; i++) {
            float a = fabsf((float)row[b + i]);
            amax = a > amax ? a : amax;
        }
        float want = amax / 127.0f;
        float scale = (float)(_Float16)want;
        if (scale < want) {
            int e;
            frexpf(scale, &e); /* scale = m 2^e, m in [0.5, 1): its binary16 ulp is 2^(e - 11) */
            scale += ldexpf(1.0f, e - 1 >= -14 ? e - 11 : -24);
        }
        float inv = scale > 0.0f ? 1.0f / scale : 0.0f;
        for (int32_t i = 0; i < n; i++) {
            float q = roundf((float)row[b + i] * inv);
            q = q > 127.0f ? 127.0f : q < -127.0f ? -127.0f : q;
            row[b + i] = (double)q * scale;
        }
    }
}

/* ---- the layer forward --------------------------------------------------------------------- */

/* Row i of head h's scores (-inf where hidden) and log-sum-exp, when asked. */
static void inspect_row(const ref_forward_args *a, int32_t h, int32_t i, int32_t n, const double *s,
                        const bool *visible, double sink) {
    double max = sink;
    for (int32_t j = 0; j < n; j++) {
        if (visible[j] && s[j] > max) {
            max = s[j];
        }
        if (a->scores != NULL) {
            a->scores[((size_t)h * n + i) * n + j] = visible[j] ? (float)s[j] : -INFINITY;
        }
    }
    if (a->lse == NULL) {
        return;
    }
    double sum = max == -INFINITY ? 0.0 : exp(sink - max);
    for (int32_t j = 0; j < n && max != -INFINITY; j++) {
        sum += visible[j] ? exp(s[j] - max) : 0.0;
    }
    a->lse[(size_t)h * n + i] = sum > 0.0 ? (float)(max + log(sum)) : -INFINITY;
}

void ref_layer_forward(const attn_config *cfg, const ref_layer *w, const ref_forward_args *a) {
    const int32_t n = a->n_tokens;
    const int32_t hidden = cfg->hidden_size;
    const int32_t n_heads = cfg->n_heads;
    const int32_t n_kv = cfg->n_kv_heads;
    const int32_t d = ref_head_dim(cfg);
    const int32_t group = n_heads / n_kv;
    const int32_t q_dim = n_heads * d;
    const int32_t kv_dim = n_kv * d;
    const double scale = ref_softmax_scale(cfg);

    /* q (N, n_heads*d), k and v (N, n_kv*d), ctx (N, n_heads*d), all in double. */
    double *xd = xcalloc((size_t)hidden, sizeof(double));
    double *q = xcalloc((size_t)n * q_dim, sizeof(double));
    double *k = xcalloc((size_t)n * kv_dim, sizeof(double));
    double *v = xcalloc((size_t)n * kv_dim, sizeof(double));
    double *ctx = xcalloc((size_t)n * q_dim, sizeof(double));
    double *s = xcalloc((size_t)n, sizeof(double));
    double *p = xcalloc((size_t)n, sizeof(double));
    bool *visible = xcalloc((size_t)n, sizeof(bool));
    double *inv_freq = xcalloc((size_t)d, sizeof(double));

    /* Projections. */
    for (int32_t t = 0; t < n; t++) {
        for (int32_t i = 0; i < hidden; i++) {
            xd[i] = a->x[(size_t)t * hidden + i];
        }
        linear(w->wq, cfg->has_qkv_bias ? w->bq : NULL, xd, q_dim, hidden, q + (size_t)t * q_dim);
        linear(w->wk, cfg->has_qkv_bias ? w->bk : NULL, xd, kv_dim, hidden, k + (size_t)t * kv_dim);
        linear(w->wv, cfg->has_qkv_bias ? w->bv : NULL, xd, kv_dim, hidden, v + (size_t)t * kv_dim);
    }

    /* RoPE at each token's position, on every query and key head. */
    ref_rope_inv_freq(cfg, inv_freq);
    for (int32_t t = 0; t < n; t++) {
        int32_t pos = a->positions != NULL ? a->positions[t] : t;
        for (int32_t h = 0; h < n_heads; h++) {
            ref_rope_rotate(cfg, inv_freq, pos, q + (size_t)t * q_dim + (size_t)h * d);
        }
        for (int32_t h = 0; h < n_kv; h++) {
            ref_rope_rotate(cfg, inv_freq, pos, k + (size_t)t * kv_dim + (size_t)h * d);
        }
    }

    /* What the engine's cache holds of them. */
    if (a->kv_dtype != ATTN_DTYPE_AUTO && a->kv_dtype != ATTN_DTYPE_F32) {
        for (int32_t t = 0; t < n; t++) {
            for (int32_t h = 0; h < n_kv; h++) {
                ref_kv_round(a->kv_dtype, k + (size_t)t * kv_dim + (size_t)h * d, d);
                ref_kv_round(a->kv_dtype, v + (size_t)t * kv_dim + (size_t)h * d, d);
            }
        }
    }

    /* Post-RoPE K and V in the cache layout (n_kv_heads, N, head_dim). */
    for (int32_t h = 0; h < n_kv; h++) {
        for (int32_t t = 0; t < n; t++) {
            for (int32_t i = 0; i < d; i++) {
                size_t dst = ((size_t)h * n + t) * d + i;
                size_t src = (size_t)t * kv_dim + (size_t)h * d + i;
                if (a->k != NULL) {
                    a->k[dst] = (float)k[src];
                }
                if (a->v != NULL) {
                    a->v[dst] = (float)v[src];
                }
            }
        }
    }

    /* Attention, one query head and one query row at a time. */
    for (int32_t h = 0; h < n_heads; h++) {
        int32_t kvh = h / group;
        for (int32_t i = 0; i < n; i++) {
            const double *qi = q + (size_t)i * q_dim + (size_t)h * d;
            for (int32_t j = 0; j < n; j++) {
                bool causal_ok = j <= i;
                bool window_ok = cfg->sliding_window == 0 || i - j < cfg->sliding_window;
                bool valid = a->key_valid == NULL || a->key_valid[j] != 0;
                visible[j] = causal_ok && window_ok && valid;
                s[j] =
                    visible[j] ? scale * dot(qi, k + (size_t)j * kv_dim + (size_t)kvh * d, d) : 0.0;
            }
            double sink = cfg->has_sinks ? (double)w->sinks[h] : -INFINITY;
            softmax_row(s, visible, n, sink, p);
            inspect_row(a, h, i, n, s, visible, sink);
            double *ci = ctx + (size_t)i * q_dim + (size_t)h * d;
            for (int32_t j = 0; j < n; j++) {
                const double *vj = v + (size_t)j * kv_dim + (size_t)kvh * d;
                for (int32_t e = 0; e < d; e++) {
                    ci[e] += p[j] * vj[e];
                }
                if (a->weights != NULL) {
                    a->weights[((size_t)h * n + i) * n + j] = (float)p[j];
                }
            }
        }
    }

    /* Post-RoPE queries and each head's context, as asked; then the head scales. */
    for (int32_t h = 0; h < n_heads; h++) {
        for (int32_t t = 0; t < n; t++) {
            for (int32_t e = 0; e < d; e++) {
                size_t dst = ((size_t)h * n + t) * d + e,
                       src = (size_t)t * q_dim + (size_t)h * d + e;
                if (a->q_rot != NULL) {
                    a->q_rot[dst] = (float)q[src];
                }
                if (a->head_out != NULL) {
                    a->head_out[dst] = (float)ctx[src];
                }
                if (a->head_scale != NULL) {
                    ctx[src] *= a->head_scale[h];
                }
            }
        }
    }

    /* Output projection. */
    double *o = xcalloc((size_t)hidden, sizeof(double));
    for (int32_t t = 0; t < n; t++) {
        linear(w->wo, cfg->has_o_bias ? w->bo : NULL, ctx + (size_t)t * q_dim, hidden, q_dim, o);
        for (int32_t i = 0; i < hidden; i++) {
            a->out[(size_t)t * hidden + i] = (float)o[i];
        }
    }

    free(o);
    free(inv_freq);
    free(visible);
    free(p);
    free(s);
    free(ctx);
    free(v);
    free(k);
    free(q);
    free(xd);
}

/* ---- stateless SDPA ------------------------------------------------------------------------ */

/* y (out) = W (out x in) x + b, in double. */
static void affine(const float *w, const float *b, const double *x, int32_t in, int32_t out,
                   double *y) {
    for (int32_t o = 0; o < out; o++) {
        double acc = b != NULL ? b[o] : 0.0;
        for (int32_t e = 0; e < in; e++) {
            acc += (double)w[(size_t)o * in + e] * x[e];
        }
        y[o] = acc;
    }
}

static void rms_norm(double *x, int32_t n, const float *w, double eps) {
    double ss = 0.0;
    for (int32_t i = 0; i < n; i++) {
        ss += x[i] * x[i];
    }
    double inv = 1.0 / sqrt(ss / n + eps);
    for (int32_t i = 0; i < n; i++) {
        x[i] = w[i] * x[i] * inv;
    }
}

void ref_mla_forward(const attn_config *cfg, const ref_mla_layer *w, const float *x,
                     int32_t n_tokens, float *out, float *weights) {
    const int32_t n = n_tokens, h_n = cfg->n_heads, hidden = cfg->hidden_size;
    const int32_t nope = cfg->qk_nope_head_dim, rope = cfg->qk_rope_head_dim;
    const int32_t kvl = cfg->kv_lora_rank, vd = cfg->v_head_dim, qk = nope + rope;
    const int32_t qlr = cfg->q_lora_rank;
    const double eps = cfg->mla_norm_eps > 0 ? cfg->mla_norm_eps : 1e-6;
    const double scale =
        cfg->softmax_scale > 0 ? (double)cfg->softmax_scale : 1.0 / sqrt((double)qk);
    attn_config rc = *cfg; /* RoPE over the rope dims alone */
    rc.head_dim = rope;
    rc.rotary_dim = rope;
    double *inv_freq = xcalloc((size_t)rope, sizeof(double));
    ref_rope_inv_freq(&rc, inv_freq);
    double *q = xcalloc((size_t)n * h_n * qk, sizeof(double));
    double *k = xcalloc((size_t)n * h_n * qk, sizeof(double));
    double *v = xcalloc((size_t)n * h_n * vd, sizeof(double));
    double *xd = xcalloc((size_t)hidden, sizeof(double));
    double *qa = xcalloc((size_t)(qlr > 0 ? qlr : 1), sizeof(double));
    double *ckv = xcalloc((size_t)kvl + rope, sizeof(double));
    double *kvb = xcalloc((size_t)h_n * (nope + vd), sizeof(double));
    for (int32_t i = 0; i < n; i++) {
        for (int32_t e = 0; e < hidden; e++) {
            xd[e] = x[(size_t)i * hidden + e];
        }
        double *qi = q + (size_t)i * h_n * qk;
        if (qlr > 0) {
            affine(w->wq_a, cfg->has_qkv_bias ? w->bq_a : NULL, xd, hidden, qlr, qa);
            rms_norm(qa, qlr, w->q_a_norm, eps);
            affine(w->wq_b, NULL, qa, qlr, h_n * qk, qi);
        } else {
            affine(w->wq, cfg->has_qkv_bias ? w->bq : NULL, xd, hidden, h_n * qk, qi);
        }
        affine(w->wkv_a, cfg->has_qkv_bias ? w->bkv_a : NULL, xd, hidden, kvl + rope, ckv);
        rms_norm(ckv, kvl, w->kv_a_norm, eps);
        affine(w->wkv_b, NULL, ckv, kvl, h_n * (nope + vd), kvb);
        ref_rope_rotate(&rc, inv_freq, i, ckv + kvl);
        for (int32_t h = 0; h < h_n; h++) {
            ref_rope_rotate(&rc, inv_freq, i, qi + (size_t)h * qk + nope);
            double *kh = k + ((size_t)i * h_n + h) * qk;
            memcpy(kh, kvb + (size_t)h * (nope + vd), (size_t)nope * sizeof(double));
            memcpy(kh + nope, ckv + kvl, (size_t)rope * sizeof(double));
            memcpy(v + ((size_t)i * h_n + h) * vd, kvb + (size_t)h * (nope + vd) + nope,
                   (size_t)vd * sizeof(double));
        }
    }
    double *s = xcalloc((size_t)n, sizeof(double)), *p = xcalloc((size_t)n, sizeof(double));
    bool *visible = xcalloc((size_t)n, sizeof(bool));
    double *ctx = xcalloc((size_t)n * h_n * vd, sizeof(double));
    for (int32_t h = 0; h < h_n; h++) {
        for (int32_t i = 0; i < n; i++) {
            for (int32_t j = 0; j < n; j++) {
                visible[j] = j <= i;
                s[j] = visible[j] ? scale * dot(q + ((size_t)i * h_n + h) * qk,
                                                k + ((size_t)j * h_n + h) * qk, qk)
                                  : 0.0;
            }
            softmax_row(s, visible, n, -INFINITY, p);
            for (int32_t j = 0; j < n; j++) {
                for (int32_t e = 0; e < vd; e++) {
                    ctx[((size_t)i * h_n + h) * vd + e] += p[j] * v[((size_t)j * h_n + h) * vd + e];
                }
                if (weights != NULL) {
                    weights[((size_t)h * n + i) * n + j] = (float)p[j];
                }
            }
        }
    }
    double *o = xcalloc((size_t)hidden, sizeof(double));
    for (int32_t i = 0; i < n; i++) {
        affine(w->wo, cfg->has_o_bias ? w->bo : NULL, ctx + (size_t)i * h_n * vd, h_n * vd, hidden,
               o);
        for (int32_t e = 0; e < hidden; e++) {
            out[(size_t)i * hidden + e] = (float)o[e];
        }
    }
    free(o);
    free(ctx);
    free(visible);
    free(p);
    free(s);
    free(kvb);
    free(ckv);
    free(qa);
    free(xd);
    free(v);
    free(k);
    free(q);
    free(inv_freq);
}

static double elu_plus_one(double x) {
    return x > 0.0 ? x + 1.0 : exp(x);
}

void ref_linear_sdpa(const ref_sdpa_args *a) {
    const int32_t group = a->n_heads / a->n_kv_heads;
    const int32_t shift = a->n_k - a->n_q;
    double *acc = xcalloc((size_t)a->d_v, sizeof(double));
    for (int32_t h = 0; h < a->n_heads; h++) {
        int32_t kvh = h / group;
        for (int32_t i = 0; i < a->n_q; i++) {
            const float *q = a->q + ((size_t)h * a->n_q + i) * a->d_k;
            double den = 0.0;
            memset(acc, 0, (size_t)a->d_v * sizeof(double));
            for (int32_t j = 0; j < a->n_k && (!a->is_causal || j <= i + shift); j++) {
                const float *k = a->k + ((size_t)kvh * a->n_k + j) * a->d_k;
                const float *v = a->v + ((size_t)kvh * a->n_k + j) * a->d_v;
                double w = 0.0;
                for (int32_t e = 0; e < a->d_k; e++) {
                    w += elu_plus_one(q[e]) * elu_plus_one(k[e]);
                }
                den += w;
                for (int32_t e = 0; e < a->d_v; e++) {
                    acc[e] += w * v[e];
                }
            }
            for (int32_t e = 0; e < a->d_v; e++) {
                a->out[((size_t)h * a->n_q + i) * a->d_v + e] = (float)(acc[e] / (den + 1e-6));
            }
        }
    }
    free(acc);
}

void ref_sdpa(const ref_sdpa_args *a) {
    const int32_t group = a->n_heads / a->n_kv_heads;
    const int32_t shift = a->n_k - a->n_q; /* bottom-right alignment */
    const double scale = a->scale > 0.0 ? a->scale : 1.0 / sqrt((double)a->d_k);
    double *qd = xcalloc((size_t)a->d_k, sizeof(double));
    double *kd = xcalloc((size_t)a->d_k, sizeof(double));
    double *s = xcalloc((size_t)a->n_k, sizeof(double));
    double *p = xcalloc((size_t)a->n_k, sizeof(double));
    bool *visible = xcalloc((size_t)a->n_k, sizeof(bool));

    for (int32_t h = 0; h < a->n_heads; h++) {
        int32_t kvh = h / group;
        for (int32_t i = 0; i < a->n_q; i++) {
            int32_t ii = i + shift;
            for (int32_t e = 0; e < a->d_k; e++) {
                qd[e] = a->q[((size_t)h * a->n_q + i) * a->d_k + e];
            }
            for (int32_t j = 0; j < a->n_k; j++) {
                bool causal_ok = !a->is_causal || j <= ii;
                bool window_ok = a->window < 0 || abs(ii - j) <= a->window;
                bool mask_ok = a->mask == NULL || a->mask[(size_t)i * a->mask_ld + j] != 0;
                visible[j] = causal_ok && window_ok && mask_ok;
                for (int32_t e = 0; e < a->d_k; e++) {
                    kd[e] = a->k[((size_t)kvh * a->n_k + j) * a->d_k + e];
                }
                s[j] = visible[j] ? scale * dot(qd, kd, a->d_k) : 0.0;
            }
            softmax_row(s, visible, a->n_k, -INFINITY, p);
            for (int32_t e = 0; e < a->d_v; e++) {
                double acc = 0.0;
                for (int32_t j = 0; j < a->n_k; j++) {
                    acc += p[j] * a->v[((size_t)kvh * a->n_k + j) * a->d_v + e];
                }
                a->out[((size_t)h * a->n_q + i) * a->d_v + e] = (float)acc;
            }
            if (a->weights != NULL) {
                for (int32_t j = 0; j < a->n_k; j++) {
                    a->weights[((size_t)h * a->n_q + i) * a->n_k + j] = (float)p[j];
                }
            }
        }
    }

    free(visible);
    free(p);
    free(s);
    free(kd);
    free(qd);
}
