/* engine/model.c: model objects built from caller tensors or seeded random weights, and their
 * RoPE tables. Loading from files lives in hf_load.c; this file never touches the filesystem. */
#define _DEFAULT_SOURCE /* madvise's MADV_HUGEPAGE is a Linux extension */
#include "attn_int.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

/* Weights and KV pools are streamed end to end on every decode step; 2 MiB pages spare the TLB a
 * miss every 4 KiB. Buffers this large are aligned to a huge page and offered to the kernel. */
#define HUGE_PAGE_BYTES ((size_t)2 << 20)

void *attn__alloc_bytes(size_t n) {
    if (n == 0 || n > SIZE_MAX - ATTN__ALIGN) {
        return NULL;
    }
    size_t bytes = (n + ATTN__ALIGN - 1) / ATTN__ALIGN * ATTN__ALIGN;
    bool is_huge = bytes >= 2 * HUGE_PAGE_BYTES;
    void *p = NULL;
    if (posix_memalign(&p, is_huge ? HUGE_PAGE_BYTES : ATTN__ALIGN, bytes) != 0) {
        return NULL;
    }
#ifdef MADV_HUGEPAGE
    if (is_huge) {
        (void)madvise(p, bytes / HUGE_PAGE_BYTES * HUGE_PAGE_BYTES, MADV_HUGEPAGE);
    }
#endif
    return p;
}

float *attn__alloc_floats(size_t n) {
    return n > SIZE_MAX / sizeof(float) ? NULL : attn__alloc_bytes(n * sizeof(float));
}

static size_t n_qkv_rows(const attn_config *c) {
    return (size_t)(c->n_heads + 2 * c->n_kv_heads) * c->head_dim;
}

static int resolve_range(const attn_config *cfg, const attn_load_params *p, int32_t *first,
                         int32_t *count) {
    int32_t f = p ? p->layer_first : 0;
    int32_t n = p ? p->layer_count : 0;
    if (f < 0 || n < 0 || f >= cfg->n_layers) {
        return ATTN_EINVAL;
    }
    if (n == 0) {
        n = cfg->n_layers - f;
    }
    if (n > cfg->n_layers - f) {
        return ATTN_EINVAL;
    }
    *first = f;
    *count = n;
    return ATTN_OK;
}

void attn_model_destroy(attn_model *m) {
    if (m == NULL) {
        return;
    }
    for (int32_t i = 0; m->layers != NULL && i < m->layer_count; i++) {
        free(m->layers[i].w_qkv);
        free(m->layers[i].w_qkv_h);
        free(m->layers[i].w_o_h);
        free(m->layers[i].b_qkv);
        free(m->layers[i].w_o);
        free(m->layers[i].b_o);
        free(m->layers[i].q_norm);
        free(m->layers[i].k_norm);
        free(m->layers[i].q_norm_bias);
        free(m->layers[i].k_norm_bias);
        free(m->layers[i].sinks);
        float *mla[] = {m->layers[i].w_q,   m->layers[i].b_q,      m->layers[i].w_qa,
                        m->layers[i].b_qa,  m->layers[i].q_a_norm, m->layers[i].w_qb,
                        m->layers[i].w_kva, m->layers[i].b_kva,    m->layers[i].kv_a_norm,
                        m->layers[i].w_kvb};
        for (size_t t = 0; t < sizeof mla / sizeof mla[0]; t++) {
            free(mla[t]);
        }
    }
    free(m->layers);
    free(m->rope_cos);
    free(m->rope_sin);
    free(m->rope_cos_local);
    free(m->rope_sin_local);
    free(m->rope_cos_long);
    free(m->rope_sin_long);
    free(m);
}

/* Allocates and fills one cos/sin table pair of m (max_seq x rotary_dim / 2) for cfg. */
static int rope_table_pair(attn_model *m, const attn_config *cfg, bool long_factors,
                           float **cos_out, float **sin_out) {
    size_t n = (size_t)cfg->max_seq * (cfg->rotary_dim / 2);
    *cos_out = attn__alloc_floats(n);
    *sin_out = attn__alloc_floats(n);
    if (*cos_out == NULL || *sin_out == NULL) {
        return ATTN_ENOMEM;
    }
    attn__rope_tables(cfg, long_factors, *cos_out, *sin_out);
    m->bytes += 2 * n * sizeof(float);
    return ATTN_OK;
}

/* The tensors of a multi-head latent attention layer: where each lives in the layer, its
 * shape (rows x cols, cols 0 for a vector), and whether this config has it. */
struct mla_tensor {
    float **dst;
    size_t rows, cols;
    bool is_present;
};

static int32_t mla_tensors(const attn_config *c, struct attn__layer *l, struct mla_tensor *t) {
    size_t hidden = (size_t)c->hidden_size, qk = (size_t)c->n_heads * c->head_dim;
    size_t kva = (size_t)c->kv_lora_rank + c->qk_rope_head_dim;
    size_t kvb = (size_t)c->n_heads * (c->qk_nope_head_dim + c->v_head_dim);
    bool lora = c->q_lora_rank > 0;
    size_t qr = (size_t)c->q_lora_rank;
    struct mla_tensor all[] = {
        {&l->w_q, qk, hidden, !lora},
        {&l->b_q, qk, 0, !lora && c->has_qkv_bias},
        {&l->w_qa, qr, hidden, lora},
        {&l->b_qa, qr, 0, lora && c->has_qkv_bias},
        {&l->q_a_norm, qr, 0, lora},
        {&l->w_qb, qk, qr, lora},
        {&l->w_kva, kva, hidden, true},
        {&l->b_kva, kva, 0, c->has_qkv_bias},
        {&l->kv_a_norm, (size_t)c->kv_lora_rank, 0, true},
        {&l->w_kvb, kvb, (size_t)c->kv_lora_rank, true},
    };
    memcpy(t, all, sizeof all);
    return (int32_t)(sizeof all / sizeof all[0]);
}

#define MLA_TENSORS 10

static size_t tensor_floats(const struct mla_tensor *t) {
    return t->rows * (t->cols > 0 ? t->cols : 1);
}

/* The floats of one loaded layer's tensors (the bytes a layer holds in float32, over 4). */
static size_t layer_floats(const attn_config *c) {
    bool is_mla = c->kv_lora_rank > 0;
    /* The output projection reads each head's value: head_dim of them, or MLA's v_head_dim. */
    size_t hd_all = (size_t)c->n_heads * (is_mla ? c->v_head_dim : c->head_dim);
    size_t n = (is_mla ? 0 : n_qkv_rows(c) * c->hidden_size) + (size_t)c->hidden_size * hd_all;
    if (is_mla) {
        struct attn__layer none;
        struct mla_tensor t[MLA_TENSORS];
        int32_t k_n = mla_tensors(c, &none, t);
        for (int32_t k = 0; k < k_n; k++) {
            n += t[k].is_present ? tensor_floats(&t[k]) : 0;
        }
    }
    n += attn__qk_norm_len(c, false) + attn__qk_norm_len(c, true);
    n += c->qk_norm == ATTN_QK_NORM_HEAD_LAYERNORM_BIAS ? 2 * (size_t)c->head_dim : 0;
    n += c->has_sinks ? (size_t)c->n_heads : 0;
    return n;
}

int attn__model_alloc_layer(attn_model *m, int32_t i) {
    const attn_config cfg = m->cfg;
    struct attn__layer *l = &m->layers[i];
    bool is_mla = cfg.kv_lora_rank > 0;
    size_t hd_all = (size_t)cfg.n_heads * (is_mla ? cfg.v_head_dim : cfg.head_dim);
    if (is_mla) {
        struct mla_tensor t[MLA_TENSORS];
        int32_t n = mla_tensors(&cfg, l, t);
        for (int32_t k = 0; k < n; k++) {
            if (t[k].is_present && (*t[k].dst = attn__alloc_floats(tensor_floats(&t[k]))) == NULL) {
                return ATTN_ENOMEM;
            }
        }
    } else if ((l->w_qkv = attn__alloc_floats(n_qkv_rows(&cfg) * cfg.hidden_size)) == NULL) {
        return ATTN_ENOMEM;
    }
    if ((l->w_o = attn__alloc_floats((size_t)cfg.hidden_size * hd_all)) == NULL) {
        return ATTN_ENOMEM;
    }
    if (cfg.has_qkv_bias && !is_mla && (l->b_qkv = attn__alloc_floats(n_qkv_rows(&cfg))) == NULL) {
        return ATTN_ENOMEM;
    }
    if (cfg.has_o_bias && (l->b_o = attn__alloc_floats((size_t)cfg.hidden_size)) == NULL) {
        return ATTN_ENOMEM;
    }
    if (cfg.qk_norm != ATTN_QK_NORM_NONE) {
        l->q_norm = attn__alloc_floats(attn__qk_norm_len(&cfg, false));
        l->k_norm = attn__alloc_floats(attn__qk_norm_len(&cfg, true));
        if (l->q_norm == NULL || l->k_norm == NULL) {
            return ATTN_ENOMEM;
        }
    }
    if (cfg.qk_norm == ATTN_QK_NORM_HEAD_LAYERNORM_BIAS) {
        l->q_norm_bias = attn__alloc_floats((size_t)cfg.head_dim);
        l->k_norm_bias = attn__alloc_floats((size_t)cfg.head_dim);
        if (l->q_norm_bias == NULL || l->k_norm_bias == NULL) {
            return ATTN_ENOMEM;
        }
    }
    if (cfg.has_sinks && (l->sinks = attn__alloc_floats((size_t)cfg.n_heads)) == NULL) {
        return ATTN_ENOMEM;
    }
    return ATTN_OK;
}

static int model_alloc(const attn_config *cfg_in, const attn_load_params *p, bool with_weights,
                       bool defer_layers, attn_model **out) {
    if (cfg_in == NULL || out == NULL) {
        return ATTN_EINVAL;
    }
    attn_config cfg = *cfg_in;
    if (p != NULL && (p->max_seq < 0 || p->weights_dtype < ATTN_DTYPE_AUTO ||
                      p->weights_dtype > ATTN_DTYPE_F16)) {
        return ATTN_EINVAL;
    }
    if (p != NULL && p->max_seq > 0) {
        cfg.max_seq = p->max_seq;
    }
    int rc = attn_config_check(&cfg);
    if (rc != ATTN_OK) {
        return rc;
    }
    int32_t first, count;
    rc = resolve_range(&cfg, p, &first, &count);
    if (rc != ATTN_OK) {
        return rc;
    }
    attn_model *m = calloc(1, sizeof *m);
    if (m == NULL) {
        return ATTN_ENOMEM;
    }
    m->cfg = cfg;
    m->weights_dtype = ATTN_DTYPE_F32; /* constructors convert once the weights are in */
    memcpy(m->family, "attnd", sizeof "attnd");
    m->layer_first = first;
    m->layer_count = count;
    m->layers = calloc((size_t)count, sizeof *m->layers);
    if (m->layers == NULL) {
        goto fail;
    }
    m->has_weights = with_weights;
    if (with_weights) {
        m->bytes = (size_t)count * layer_floats(&cfg) * sizeof(float);
    }
    for (int32_t i = 0; with_weights && !defer_layers && i < count; i++) {
        if (attn__model_alloc_layer(m, i) != ATTN_OK) {
            goto fail;
        }
    }
    if (cfg.rotary_dim > 0) {
        attn_config local = cfg; /* Gemma 3's local layers: their theta, no scaling */
        local.rope_theta = cfg.rope_theta_local;
        memset(&local.rope_scaling, 0, sizeof local.rope_scaling);
        if (rope_table_pair(m, &m->cfg, false, &m->rope_cos, &m->rope_sin) != ATTN_OK ||
            (cfg.rope_scaling.type == ATTN_ROPE_SCALING_LONGROPE &&
             rope_table_pair(m, &m->cfg, true, &m->rope_cos_long, &m->rope_sin_long) != ATTN_OK) ||
            (cfg.rope_theta_local > 0 && rope_table_pair(m, &local, false, &m->rope_cos_local,
                                                         &m->rope_sin_local) != ATTN_OK)) {
            goto fail;
        }
    }
    *out = m;
    return ATTN_OK;
fail:
    attn_model_destroy(m);
    return ATTN_ENOMEM;
}

int attn__model_alloc(const attn_config *cfg, const attn_load_params *p, bool defer_layers,
                      attn_model **out) {
    return model_alloc(cfg, p, true, defer_layers, out);
}

int attn_model_create_geometry(const attn_config *cfg_in, const attn_load_params *p,
                               attn_model **out) {
    if (cfg_in == NULL || out == NULL) {
        return ATTN_EINVAL;
    }
    attn_config cfg = *cfg_in;
    if (cfg.hidden_size == 0) {
        cfg.hidden_size = cfg.n_heads * cfg.head_dim;
    }
    /* the caller's q, k and v are per head: no latent, no projections of its own */
    if (cfg.kv_lora_rank > 0) {
        return ATTN_EUNSUPPORTED;
    }
    attn_model *m = NULL;
    int rc = model_alloc(&cfg, p, false, false, &m);
    if (rc != ATTN_OK) {
        return rc;
    }
    memcpy(m->family, "geometry", sizeof "geometry");
    if ((rc = attn__model_fingerprint_compute(m)) != ATTN_OK) {
        attn_model_destroy(m);
        return rc;
    }
    *out = m;
    return ATTN_OK;
}

bool attn_model_has_weights(const attn_model *m) {
    return m->has_weights;
}

/* Copies an MLA layer's tensors from the caller's; ATTN_EINVAL when one it needs is NULL. */
static int copy_mla(const attn_config *c, const attn_layer_weights *w, struct attn__layer *l) {
    const float *src[MLA_TENSORS] = {w->wq,   w->bq,    w->wq_a,  w->bq_a,      w->q_a_norm,
                                     w->wq_b, w->wkv_a, w->bkv_a, w->kv_a_norm, w->wkv_b};
    struct mla_tensor t[MLA_TENSORS];
    int32_t n = mla_tensors(c, l, t);
    if (w->wo == NULL || (c->has_o_bias && w->bo == NULL)) {
        return ATTN_EINVAL;
    }
    for (int32_t k = 0; k < n; k++) {
        if (t[k].is_present && src[k] == NULL) {
            return ATTN_EINVAL;
        }
        if (t[k].is_present) {
            memcpy(*t[k].dst, src[k], tensor_floats(&t[k]) * sizeof(float));
        }
    }
    size_t o = (size_t)c->hidden_size * c->n_heads * c->v_head_dim;
    memcpy(l->w_o, w->wo, o * sizeof(float));
    if (c->has_o_bias) {
        memcpy(l->b_o, w->bo, (size_t)c->hidden_size * sizeof(float));
    }
    return ATTN_OK;
}

int attn_model_create(const attn_config *cfg, const attn_layer_weights *layers,
                      const attn_load_params *p, attn_model **out) {
    if (layers == NULL || out == NULL) {
        return ATTN_EINVAL;
    }
    attn_model *m = NULL;
    int rc = attn__model_alloc(cfg, p, false, &m);
    if (rc != ATTN_OK) {
        return rc;
    }
    const attn_config *c = &m->cfg;
    size_t hidden = (size_t)c->hidden_size;
    size_t q_rows = (size_t)c->n_heads * c->head_dim;
    size_t kv_rows = (size_t)c->n_kv_heads * c->head_dim;
    for (int32_t i = 0; i < m->layer_count && c->kv_lora_rank > 0; i++) {
        if (copy_mla(c, &layers[i], &m->layers[i]) != ATTN_OK) {
            attn_model_destroy(m);
            return ATTN_EINVAL;
        }
    }
    for (int32_t i = 0; i < m->layer_count && c->kv_lora_rank == 0; i++) {
        const attn_layer_weights *w = &layers[i];
        struct attn__layer *l = &m->layers[i];
        if (w->wq == NULL || w->wk == NULL || w->wv == NULL || w->wo == NULL ||
            (c->has_qkv_bias && (w->bq == NULL || w->bk == NULL || w->bv == NULL)) ||
            (c->has_o_bias && w->bo == NULL) ||
            (c->qk_norm != ATTN_QK_NORM_NONE && (w->q_norm == NULL || w->k_norm == NULL)) ||
            (l->q_norm_bias != NULL && (w->q_norm_bias == NULL || w->k_norm_bias == NULL)) ||
            (c->has_sinks && w->sinks == NULL)) {
            attn_model_destroy(m);
            return ATTN_EINVAL;
        }
        memcpy(l->w_qkv, w->wq, q_rows * hidden * sizeof(float));
        memcpy(l->w_qkv + q_rows * hidden, w->wk, kv_rows * hidden * sizeof(float));
        memcpy(l->w_qkv + (q_rows + kv_rows) * hidden, w->wv, kv_rows * hidden * sizeof(float));
        memcpy(l->w_o, w->wo, hidden * q_rows * sizeof(float));
        if (c->has_qkv_bias) {
            memcpy(l->b_qkv, w->bq, q_rows * sizeof(float));
            memcpy(l->b_qkv + q_rows, w->bk, kv_rows * sizeof(float));
            memcpy(l->b_qkv + q_rows + kv_rows, w->bv, kv_rows * sizeof(float));
        }
        if (c->has_o_bias) {
            memcpy(l->b_o, w->bo, hidden * sizeof(float));
        }
        if (c->qk_norm != ATTN_QK_NORM_NONE) {
            memcpy(l->q_norm, w->q_norm, attn__qk_norm_len(c, false) * sizeof(float));
            memcpy(l->k_norm, w->k_norm, attn__qk_norm_len(c, true) * sizeof(float));
        }
        if (l->q_norm_bias != NULL) {
            memcpy(l->q_norm_bias, w->q_norm_bias, (size_t)c->head_dim * sizeof(float));
            memcpy(l->k_norm_bias, w->k_norm_bias, (size_t)c->head_dim * sizeof(float));
        }
        if (c->has_sinks) {
            memcpy(l->sinks, w->sinks, (size_t)c->n_heads * sizeof(float));
        }
    }
    if ((rc = attn__model_hold_weights(m, p != NULL ? p->weights_dtype : ATTN_DTYPE_F32)) !=
        ATTN_OK) {
        attn_model_destroy(m);
        return rc;
    }
    if ((rc = attn__model_fingerprint_compute(m)) != ATTN_OK) {
        attn_model_destroy(m);
        return rc;
    }
    *out = m;
    return ATTN_OK;
}

/* splitmix64 (Steele, Lea, Flood 2014): a tiny, well-mixed generator; one stream per tensor. */
static uint64_t splitmix64(uint64_t *state) {
    uint64_t z = (*state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

/* Fills x[0..n) uniform in [-bound, bound) from the stream named by (seed, layer, tensor). */
static void fill_uniform(float *x, size_t n, float bound, uint64_t seed, int32_t layer,
                         int32_t tensor) {
    uint64_t state = seed ^ ((uint64_t)(uint32_t)layer << 32) ^ ((uint64_t)tensor << 8);
    splitmix64(&state);
    for (size_t i = 0; i < n; i++) {
        double u = (double)(splitmix64(&state) >> 11) * (1.0 / 9007199254740992.0);
        x[i] = (float)((2.0 * u - 1.0) * bound);
    }
}

/* An MLA layer's tensors as nn.Linear would start them (norm weights around 1), one stream each
 * (tensors 16..). */
static void fill_mla(const attn_config *c, struct attn__layer *l, uint64_t seed, int32_t layer) {
    struct mla_tensor t[MLA_TENSORS];
    int32_t n = mla_tensors(c, l, t);
    for (int32_t k = 0; k < n; k++) {
        if (!t[k].is_present) {
            continue;
        }
        /* a bias takes its weight's in_features: the tensor before it */
        size_t in = t[k].cols > 0 ? t[k].cols : k > 0 ? t[k - 1].cols : 1;
        bool is_norm = t[k].dst == &l->q_a_norm || t[k].dst == &l->kv_a_norm;
        float bound = is_norm ? 0.5f : 1.0f / sqrtf((float)(in > 0 ? in : 1));
        fill_uniform(*t[k].dst, tensor_floats(&t[k]), bound, seed, layer, 16 + k);
        for (size_t j = 0; is_norm && j < tensor_floats(&t[k]); j++) {
            (*t[k].dst)[j] += 1.0f;
        }
    }
}

int attn_model_create_random(const attn_config *cfg, uint64_t seed, const attn_load_params *p,
                             attn_model **out) {
    if (out == NULL) {
        return ATTN_EINVAL;
    }
    attn_model *m = NULL;
    int rc = attn__model_alloc(cfg, p, false, &m);
    if (rc != ATTN_OK) {
        return rc;
    }
    const attn_config *c = &m->cfg;
    size_t hidden = (size_t)c->hidden_size;
    size_t hd_all = (size_t)c->n_heads * (c->kv_lora_rank > 0 ? c->v_head_dim : c->head_dim);
    float in_bound = 1.0f / sqrtf((float)hidden);
    float o_bound = 1.0f / sqrtf((float)hd_all);
    for (int32_t i = 0; i < m->layer_count; i++) {
        struct attn__layer *l = &m->layers[i];
        int32_t layer = m->layer_first + i;
        if (c->kv_lora_rank > 0) {
            fill_mla(c, l, seed, layer);
        } else {
            fill_uniform(l->w_qkv, n_qkv_rows(c) * hidden, in_bound, seed, layer, 1);
        }
        fill_uniform(l->w_o, hidden * hd_all, o_bound, seed, layer, 2);
        if (l->b_qkv != NULL) {
            fill_uniform(l->b_qkv, n_qkv_rows(c), in_bound, seed, layer, 3);
        }
        if (l->b_o != NULL) {
            fill_uniform(l->b_o, hidden, o_bound, seed, layer, 4);
        }
        /* Norm weights around 1 (their init), spread so that a wrong one shows. */
        float *norms[2] = {l->q_norm, l->k_norm};
        for (int32_t n = 0; n < 2 && norms[n] != NULL; n++) {
            size_t len = attn__qk_norm_len(c, n == 1);
            fill_uniform(norms[n], len, 0.5f, seed, layer, 5 + n);
            for (size_t j = 0; j < len; j++) {
                norms[n][j] += 1.0f;
            }
        }
        /* Norm biases (Phi's) around their init, 0, likewise. */
        float *biases[2] = {l->q_norm_bias, l->k_norm_bias};
        for (int32_t n = 0; n < 2 && biases[n] != NULL; n++) {
            fill_uniform(biases[n], (size_t)c->head_dim, 0.5f, seed, layer, 8 + n);
        }
        /* Sinks in [-1, 3): from negligible to most of a row's mass, so a wrong one shows. */
        if (l->sinks != NULL) {
            fill_uniform(l->sinks, (size_t)c->n_heads, 2.0f, seed, layer, 7);
            for (int32_t h = 0; h < c->n_heads; h++) {
                l->sinks[h] += 1.0f;
            }
        }
    }
    if ((rc = attn__model_hold_weights(m, p != NULL ? p->weights_dtype : ATTN_DTYPE_F32)) !=
        ATTN_OK) {
        attn_model_destroy(m);
        return rc;
    }
    if ((rc = attn__model_fingerprint_compute(m)) != ATTN_OK) {
        attn_model_destroy(m);
        return rc;
    }
    *out = m;
    return ATTN_OK;
}

const attn_config *attn_model_config(const attn_model *m) {
    return &m->cfg;
}

int32_t attn_model_layer_first(const attn_model *m) {
    return m->layer_first;
}

int32_t attn_model_layer_count(const attn_model *m) {
    return m->layer_count;
}

size_t attn_model_bytes(const attn_model *m) {
    return m->bytes;
}

attn_dtype attn_model_weights_dtype(const attn_model *m) {
    return m->weights_dtype;
}

/* A rows x cols matrix of floats in half precision (bfloat16, else binary16), rounded to
 * nearest even, in panels (panel.c); NULL on ENOMEM. */
static uint16_t *to_half(const float *src, int32_t rows, int32_t cols, bool is_bf16) {
    attn_dtype dt = is_bf16 ? ATTN_DTYPE_BF16 : ATTN_DTYPE_F16;
    size_t n = (size_t)rows * cols, packed = attn__panel_values(rows, cols);
    uint16_t *h = packed > SIZE_MAX / sizeof *h ? NULL : attn__alloc_bytes(packed * sizeof *h);
    uint16_t *row_major = h == NULL ? NULL : attn__alloc_bytes(n * sizeof *h);
    if (row_major == NULL) {
        free(h);
        return NULL;
    }
    /* a value past the range is refused before (hf_load.c's check_holdable) or cannot be */
    (void)attn__half_round(dt, src, n, row_major);
    attn__panel_pack(dt, row_major, rows, cols, h);
    free(row_major);
    return h;
}

/* to_half's panels back to floats, row-major (exact), into a new buffer; NULL on ENOMEM. */
static float *from_half(const uint16_t *panels, int32_t rows, int32_t cols, bool is_bf16) {
    attn_dtype dt = is_bf16 ? ATTN_DTYPE_BF16 : ATTN_DTYPE_F16;
    float *f = attn__alloc_floats((size_t)rows * cols);
    uint16_t *part =
        f == NULL ? NULL : attn__alloc_bytes((size_t)ATTN__PANEL_ROWS * cols * sizeof *part);
    if (part == NULL) {
        free(f);
        return NULL;
    }
    for (int32_t r0 = 0; r0 < rows; r0 += ATTN__PANEL_ROWS) {
        int32_t n = rows - r0 < ATTN__PANEL_ROWS ? rows - r0 : ATTN__PANEL_ROWS;
        attn__panel_unpack(dt, panels, cols, r0, n, part);
        float *to = f + (size_t)r0 * cols;
        for (size_t i = 0; i < (size_t)n * cols; i++) {
            to[i] = is_bf16 ? attn__bf16_to_f32(part[i]) : attn__f16_to_f32(part[i]);
        }
    }
    free(part);
    return f;
}

/* The floats of a layer's projections that may be held in half: fused q/k/v, and o. */
static size_t qkv_floats(const attn_config *c) {
    return n_qkv_rows(c) * c->hidden_size;
}

static size_t o_floats(const attn_config *c) {
    return (size_t)c->hidden_size * c->n_heads * c->head_dim;
}

/* Whether dtype is one the projections may be held in besides float, for m's attention kind. */
static bool holds_half(const attn_model *m, attn_dtype dtype) {
    /* multi-head latent attention's tensors stay float */
    return (dtype == ATTN_DTYPE_BF16 || dtype == ATTN_DTYPE_F16) && m->cfg.kv_lora_rank == 0;
}

int attn__model_hold_layer(attn_model *m, int32_t i, attn_dtype dtype) {
    struct attn__layer *l = &m->layers[i];
    if (!holds_half(m, dtype) || l->w_qkv == NULL) {
        return ATTN_OK; /* float, or held already */
    }
    const attn_config *c = &m->cfg;
    bool is_bf16 = dtype == ATTN_DTYPE_BF16;
    l->w_qkv_h = to_half(l->w_qkv, (int32_t)n_qkv_rows(c), c->hidden_size, is_bf16);
    l->w_o_h = to_half(l->w_o, c->hidden_size, c->n_heads * c->head_dim, is_bf16);
    if (l->w_qkv_h == NULL || l->w_o_h == NULL) {
        return ATTN_ENOMEM;
    }
    free(l->w_qkv);
    free(l->w_o);
    l->w_qkv = l->w_o = NULL;
    return ATTN_OK;
}

int attn__model_unhold_layer(attn_model *m, int32_t i, attn_dtype held) {
    struct attn__layer *l = &m->layers[i];
    if (l->w_qkv_h == NULL) {
        return ATTN_OK;
    }
    bool is_bf16 = held == ATTN_DTYPE_BF16;
    const attn_config *c = &m->cfg;
    l->w_qkv = from_half(l->w_qkv_h, (int32_t)n_qkv_rows(c), c->hidden_size, is_bf16);
    l->w_o = from_half(l->w_o_h, c->hidden_size, c->n_heads * c->head_dim, is_bf16);
    if (l->w_qkv == NULL || l->w_o == NULL) {
        return ATTN_ENOMEM;
    }
    free(l->w_qkv_h);
    free(l->w_o_h);
    l->w_qkv_h = l->w_o_h = NULL;
    return ATTN_OK;
}

int attn__model_hold_weights(attn_model *m, attn_dtype dtype) {
    if (!holds_half(m, dtype)) {
        return ATTN_OK;
    }
    /* Each layer's float copy goes as soon as its half copy is made, so that the load never
     * holds every layer in both (3x the half weights at the peak). On failure the model is
     * partly converted: every caller destroys it. */
    for (int32_t i = 0; i < m->layer_count; i++) {
        int rc = attn__model_hold_layer(m, i, dtype);
        if (rc != ATTN_OK) {
            return rc;
        }
    }
    /* the float copies go; the panels come, their last rows rounded up to a panel */
    const attn_config *c = &m->cfg;
    size_t panels = attn__panel_values((int32_t)n_qkv_rows(c), c->hidden_size) +
                    attn__panel_values(c->hidden_size, c->n_heads * c->head_dim);
    m->bytes -= (size_t)m->layer_count *
                ((qkv_floats(c) + o_floats(c)) * sizeof(float) - panels * sizeof(uint16_t));
    m->weights_dtype = dtype;
    return ATTN_OK;
}

const char *attn_model_family(const attn_model *m) {
    return m->family;
}
