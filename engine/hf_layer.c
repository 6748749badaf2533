/* engine/hf_layer.c: how each family lays out one layer's attention tensors in a checkpoint, and
 * how they become the engine's layer (fused q|k|v rows and o in nn.Linear layout). The bytes
 * come through a reader (hf_load.c opens the files); this file knows names, shapes and orders:
 * separate q/k/v/o projections (Llama and most; Phi's o is dense), Phi-3's fused qkv_proj,
 * GPT-NeoX's per-head and Falcon's per-group interleaved query_key_value, and GPT-2's Conv1D
 * c_attn / c_proj stored transposed. It also says which tensors under a layer's attention the
 * engine consumes: the loader refuses the rest.
 */
#include "attn_int.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The names each layout reads under <prefix>.<layer>.<attn_name>.: its projections' weights and
 * biases, and buffers old checkpoints saved that Hugging Face ignores at load (RoPE's inv_freq,
 * recomputed from the config; GPT-2's and GPT-NeoX's causal-mask constants "bias" and
 * "masked_bias", which encode the causal mask the engine applies). */
struct names {
    const char *weights[4];    /* read in this order; NULL past the last */
    const char *qkv_biases[3]; /* read when has_qkv_bias */
    const char *o_bias;        /* read when has_o_bias */
    const char *ignored[3];    /* buffers, never read */
};

static const struct names layouts[] = {
    [ATTN__HF_QKVO] = {{"q_proj.weight", "k_proj.weight", "v_proj.weight", "o_proj.weight"},
                       {"q_proj.bias", "k_proj.bias", "v_proj.bias"},
                       "o_proj.bias",
                       {"rotary_emb.inv_freq"}},
    [ATTN__HF_FUSED_QKV] = {{"qkv_proj.weight", "o_proj.weight"},
                            {"qkv_proj.bias"},
                            "o_proj.bias",
                            {"rotary_emb.inv_freq"}},
    [ATTN__HF_NEOX] = {{"query_key_value.weight", "dense.weight"},
                       {"query_key_value.bias"},
                       "dense.bias",
                       {"rotary_emb.inv_freq", "bias", "masked_bias"}},
    /* Falcon's RW checkpoints kept the rotary buffer as maybe_rotary.inv_freq. */
    [ATTN__HF_FALCON] = {{"query_key_value.weight", "dense.weight"},
                         {"query_key_value.bias"},
                         "dense.bias",
                         {"rotary_emb.inv_freq", "maybe_rotary.inv_freq"}},
    [ATTN__HF_MLA] = {{NULL}, {NULL}, NULL, {NULL}}, /* mla_names() */
    [ATTN__HF_GPT2] = {{"c_attn.weight", "c_proj.weight"},
                       {"c_attn.bias"},
                       "c_proj.bias",
                       {"bias", "masked_bias"}},
    [ATTN__HF_DENSE] = {{"q_proj.weight", "k_proj.weight", "v_proj.weight", "dense.weight"},
                        {"q_proj.bias", "k_proj.bias", "v_proj.bias"},
                        "dense.bias",
                        {"rotary_emb.inv_freq"}},
};

static bool in_list(const char *const *list, size_t n, const char *s) {
    for (size_t i = 0; i < n && list[i] != NULL; i++) {
        if (strcmp(list[i], s) == 0) {
            return true;
        }
    }
    return false;
}

/* Multi-head latent attention's tensors (DeepSeek-V2 / V3), each with whether the config has it,
 * where the layer keeps it and its shape (cols 0: a vector). */
struct mla_name {
    const char *name;
    bool is_present;
    float *dst;
    int32_t rows, cols;
};

static int32_t mla_names(const attn_config *c, struct attn__layer *l, struct mla_name *out) {
    bool lora = c->q_lora_rank > 0, bias = c->has_qkv_bias;
    int32_t hidden = c->hidden_size, qk = c->n_heads * c->head_dim;
    int32_t kva = c->kv_lora_rank + c->qk_rope_head_dim;
    int32_t kvb = c->n_heads * (c->qk_nope_head_dim + c->v_head_dim);
    struct mla_name all[] = {
        {"q_proj.weight", !lora, l ? l->w_q : NULL, qk, hidden},
        {"q_a_proj.weight", lora, l ? l->w_qa : NULL, c->q_lora_rank, hidden},
        {"q_a_proj.bias", lora && bias, l ? l->b_qa : NULL, c->q_lora_rank, 0},
        {"q_a_layernorm.weight", lora, l ? l->q_a_norm : NULL, c->q_lora_rank, 0},
        {"q_b_proj.weight", lora, l ? l->w_qb : NULL, qk, c->q_lora_rank},
        {"kv_a_proj_with_mqa.weight", true, l ? l->w_kva : NULL, kva, hidden},
        {"kv_a_proj_with_mqa.bias", bias, l ? l->b_kva : NULL, kva, 0},
        {"kv_a_layernorm.weight", true, l ? l->kv_a_norm : NULL, c->kv_lora_rank, 0},
        {"kv_b_proj.weight", true, l ? l->w_kvb : NULL, kvb, c->kv_lora_rank},
        {"o_proj.weight", true, l ? l->w_o : NULL, hidden, c->n_heads * c->v_head_dim},
        {"o_proj.bias", c->has_o_bias, l ? l->b_o : NULL, hidden, 0},
    };
    memcpy(out, all, sizeof all);
    return (int32_t)(sizeof all / sizeof all[0]);
}

#define MLA_NAMES 11

bool attn__hf_tensor_is_consumed(const attn_config *c, const struct attn__hf_layout *lay,
                                 const char *suffix) {
    if (lay->tensors == ATTN__HF_MLA) {
        struct mla_name n[MLA_NAMES];
        int32_t count = mla_names(c, NULL, n);
        for (int32_t i = 0; i < count; i++) {
            if (strcmp(n[i].name, suffix) == 0) {
                return n[i].is_present;
            }
        }
        /* a buffer old checkpoints saved, which the config restates */
        return strcmp(suffix, "rotary_emb.inv_freq") == 0;
    }
    const struct names *n = &layouts[lay->tensors];
    if (in_list(n->weights, 4, suffix) || in_list(n->ignored, 3, suffix) ||
        (c->has_qkv_bias && in_list(n->qkv_biases, 3, suffix)) ||
        (c->has_o_bias && strcmp(suffix, n->o_bias) == 0) ||
        (c->has_sinks && strcmp(suffix, "sinks") == 0)) {
        return true;
    }
    if (c->qk_norm == ATTN_QK_NORM_NONE) {
        return false;
    }
    if (lay->norms == ATTN__HF_NORM_LAYERNORM) {
        static const char *const phi[] = {"q_layernorm.weight", "q_layernorm.bias",
                                          "k_layernorm.weight", "k_layernorm.bias"};
        return in_list(phi, 4, suffix);
    }
    if (lay->norms != ATTN__HF_NORM_PER_HEAD_LIST) {
        return strcmp(suffix, "q_norm.weight") == 0 || strcmp(suffix, "k_norm.weight") == 0;
    }
    /* q_layernorm.norms.<h>.weight for h < n_heads, k_layernorm... for h < n_kv_heads. */
    static const char *const lists[2] = {"q_layernorm.norms.", "k_layernorm.norms."};
    int32_t heads[2] = {c->n_heads, c->n_kv_heads};
    for (int i = 0; i < 2; i++) {
        size_t len = strlen(lists[i]);
        if (strncmp(suffix, lists[i], len) != 0) {
            continue;
        }
        const char *p = suffix + len;
        int32_t h = 0;
        if (*p < '0' || *p > '9' || (p[0] == '0' && p[1] >= '0' && p[1] <= '9')) {
            return false; /* no digits, or a leading zero */
        }
        for (; *p >= '0' && *p <= '9' && h <= heads[i]; p++) {
            h = h * 10 + (*p - '0');
        }
        return h < heads[i] && strcmp(p, ".weight") == 0;
    }
    return false;
}

const char *attn__hf_layout_first_tensor(const struct attn__hf_layout *lay) {
    return lay->tensors == ATTN__HF_MLA ? "kv_a_proj_with_mqa.weight"
                                        : layouts[lay->tensors].weights[0];
}

/* ---- reading ----------------------------------------------------------------------------------
 */

static int read_named(const struct attn__hf_reader *rd, const char *prefix, int32_t layer,
                      const struct attn__hf_layout *lay, const char *suffix, int32_t rows,
                      int32_t cols, float *dst) {
    char name[320];
    snprintf(name, sizeof name, "%s.%d.%s.%s", prefix, (int)layer, lay->attn_name, suffix);
    return rd->read(rd->ctx, name, rows, cols, dst);
}

/* dst (cols x rows) = src (rows x cols)^T. */
static void transpose(const float *src, int32_t rows, int32_t cols, float *dst) {
    for (int32_t r = 0; r < rows; r++) {
        for (int32_t c = 0; c < cols; c++) {
            dst[(size_t)c * rows + r] = src[(size_t)r * cols + c];
        }
    }
}

/* Separate projections (o_proj, or Phi's dense): q, k, v rows straight into w_qkv, o into
 * w_o. */
static int read_qkvo(const struct attn__hf_reader *rd, const attn_config *c,
                     const struct attn__hf_layout *lay, const char *prefix, int32_t layer,
                     struct attn__layer *l) {
    const struct names *n = &layouts[lay->tensors];
    size_t hidden = (size_t)c->hidden_size;
    int32_t q_rows = c->n_heads * c->head_dim, kv_rows = c->n_kv_heads * c->head_dim;
    float *w_dst[4] = {l->w_qkv, l->w_qkv + (size_t)q_rows * hidden,
                       l->w_qkv + (size_t)(q_rows + kv_rows) * hidden, l->w_o};
    int32_t rows[4] = {q_rows, kv_rows, kv_rows, c->hidden_size};
    int32_t cols[4] = {c->hidden_size, c->hidden_size, c->hidden_size, q_rows};
    float *b_dst[4] = {l->b_qkv, l->b_qkv ? l->b_qkv + q_rows : NULL,
                       l->b_qkv ? l->b_qkv + q_rows + kv_rows : NULL, l->b_o};
    const char *biases[4] = {n->qkv_biases[0], n->qkv_biases[1], n->qkv_biases[2], n->o_bias};
    for (int i = 0; i < 4; i++) {
        int rc = read_named(rd, prefix, layer, lay, n->weights[i], rows[i], cols[i], w_dst[i]);
        if (rc == ATTN_OK && b_dst[i] != NULL) {
            rc = read_named(rd, prefix, layer, lay, biases[i], rows[i], 0, b_dst[i]);
        }
        if (rc != ATTN_OK) {
            return rc;
        }
    }
    return ATTN_OK;
}

/* One fused projection whose rows are already q | k | v (Phi-3's qkv_proj), then o. */
static int read_fused(const struct attn__hf_reader *rd, const attn_config *c,
                      const struct attn__hf_layout *lay, const char *prefix, int32_t layer,
                      struct attn__layer *l) {
    const struct names *n = &layouts[ATTN__HF_FUSED_QKV];
    int32_t n_qkv = (c->n_heads + 2 * c->n_kv_heads) * c->head_dim;
    int32_t hd_all = c->n_heads * c->head_dim;
    int rc = read_named(rd, prefix, layer, lay, n->weights[0], n_qkv, c->hidden_size, l->w_qkv);
    if (rc == ATTN_OK && l->b_qkv != NULL) {
        rc = read_named(rd, prefix, layer, lay, n->qkv_biases[0], n_qkv, 0, l->b_qkv);
    }
    if (rc == ATTN_OK) {
        rc = read_named(rd, prefix, layer, lay, n->weights[1], c->hidden_size, hd_all, l->w_o);
    }
    if (rc == ATTN_OK && l->b_o != NULL) {
        rc = read_named(rd, prefix, layer, lay, n->o_bias, c->hidden_size, 0, l->b_o);
    }
    return rc;
}

/* A fused query_key_value whose rows go KV group by KV group: the group's n_heads / n_kv_heads
 * query heads, then its key head, then its value head, head_dim rows each; dense is o. GPT-NeoX
 * is the case of one query head per group (modeling_gpt_neox: view(..., heads, 3 * head_size)
 * then split). Falcon (modeling_falcon, _split_heads) has three: new_decoder_architecture's
 * view(..., kv_heads, heads / kv_heads + 2, head_dim), multi_query's single group
 * [q_0 .. q_{H-1} | k | v], and otherwise NeoX's per-head [q_h | k_h | v_h]. */
static int read_grouped(const struct attn__hf_reader *rd, const attn_config *c,
                        const struct attn__hf_layout *lay, const char *prefix, int32_t layer,
                        struct attn__layer *l, float *tmp) {
    const struct names *n = &layouts[lay->tensors];
    int32_t hd = c->head_dim, heads = c->n_heads, kv_heads = c->n_kv_heads;
    int32_t per_group = heads / kv_heads, hidden = c->hidden_size;
    int32_t rows = (heads + 2 * kv_heads) * hd;
    size_t row_floats[2] = {(size_t)hidden, 1};
    float *dst[2] = {l->w_qkv, l->b_qkv};
    const char *names[2] = {n->weights[0], n->qkv_biases[0]};
    for (int part = 0; part < 2 && dst[part] != NULL; part++) {
        int rc = read_named(rd, prefix, layer, lay, names[part], rows, part == 0 ? hidden : 0, tmp);
        if (rc != ATTN_OK) {
            return rc;
        }
        size_t rf = row_floats[part], head_floats = (size_t)hd * rf;
        float *q = dst[part], *k = q + (size_t)heads * head_floats;
        float *v = k + (size_t)kv_heads * head_floats;
        for (int32_t g = 0; g < kv_heads; g++) {
            const float *src = tmp + (size_t)g * (per_group + 2) * head_floats;
            memcpy(q + (size_t)g * per_group * head_floats, src,
                   (size_t)per_group * head_floats * sizeof(float));
            memcpy(k + (size_t)g * head_floats, src + (size_t)per_group * head_floats,
                   head_floats * sizeof(float));
            memcpy(v + (size_t)g * head_floats, src + (size_t)(per_group + 1) * head_floats,
                   head_floats * sizeof(float));
        }
    }
    int rc = read_named(rd, prefix, layer, lay, n->weights[1], hidden, heads * hd, l->w_o);
    if (rc == ATTN_OK && l->b_o != NULL) {
        rc = read_named(rd, prefix, layer, lay, n->o_bias, hidden, 0, l->b_o);
    }
    return rc;
}

/* GPT-2: Conv1D stores (in, out), the transpose of nn.Linear; c_attn's outputs are q | k | v. */
static int read_gpt2(const struct attn__hf_reader *rd, const attn_config *c,
                     const struct attn__hf_layout *lay, const char *prefix, int32_t layer,
                     struct attn__layer *l, float *tmp) {
    const struct names *n = &layouts[ATTN__HF_GPT2];
    if (c->n_kv_heads != c->n_heads) {
        return ATTN_EINVAL; /* c_attn is 3 x heads wide; w_qkv and tmp hold heads + 2 kv_heads */
    }
    int32_t hidden = c->hidden_size, n_qkv = 3 * c->n_heads * c->head_dim;
    int32_t hd_all = c->n_heads * c->head_dim;
    int rc = read_named(rd, prefix, layer, lay, n->weights[0], hidden, n_qkv, tmp);
    if (rc != ATTN_OK) {
        return rc;
    }
    transpose(tmp, hidden, n_qkv, l->w_qkv);
    if ((rc = read_named(rd, prefix, layer, lay, n->weights[1], hd_all, hidden, tmp)) != ATTN_OK) {
        return rc;
    }
    transpose(tmp, hd_all, hidden, l->w_o);
    if (l->b_qkv != NULL) {
        rc = read_named(rd, prefix, layer, lay, n->qkv_biases[0], n_qkv, 0, l->b_qkv);
    }
    if (rc == ATTN_OK && l->b_o != NULL) {
        rc = read_named(rd, prefix, layer, lay, n->o_bias, hidden, 0, l->b_o);
    }
    return rc;
}

static int read_norms(const struct attn__hf_reader *rd, const attn_config *c,
                      const struct attn__hf_layout *lay, const char *prefix, int32_t layer,
                      struct attn__layer *l) {
    const char *norm[2] = {"q_norm.weight", "k_norm.weight"};
    const char *list[2] = {"q_layernorm.norms", "k_layernorm.norms"};
    const char *layernorm[2][2] = {{"q_layernorm.weight", "q_layernorm.bias"},
                                   {"k_layernorm.weight", "k_layernorm.bias"}};
    float *dst[2] = {l->q_norm, l->k_norm};
    float *bias[2] = {l->q_norm_bias, l->k_norm_bias};
    int32_t heads[2] = {c->n_heads, c->n_kv_heads};
    for (int i = 0; i < 2 && c->qk_norm != ATTN_QK_NORM_NONE; i++) {
        size_t len = attn__qk_norm_len(c, i == 1);
        int rc = ATTN_OK;
        switch (lay->norms) {
        case ATTN__HF_NORM_VECTOR:
            rc = read_named(rd, prefix, layer, lay, norm[i], (int32_t)len, 0, dst[i]);
            break;
        case ATTN__HF_NORM_MATRIX:
            rc = read_named(rd, prefix, layer, lay, norm[i], heads[i], c->head_dim, dst[i]);
            break;
        case ATTN__HF_NORM_PER_HEAD_LIST:
            for (int32_t h = 0; h < heads[i] && rc == ATTN_OK; h++) {
                char suffix[64];
                snprintf(suffix, sizeof suffix, "%s.%d.weight", list[i], (int)h);
                rc = read_named(rd, prefix, layer, lay, suffix, c->head_dim, 0,
                                dst[i] + (size_t)h * c->head_dim);
            }
            break;
        case ATTN__HF_NORM_LAYERNORM:
            rc = read_named(rd, prefix, layer, lay, layernorm[i][0], (int32_t)len, 0, dst[i]);
            if (rc == ATTN_OK) {
                rc = read_named(rd, prefix, layer, lay, layernorm[i][1], (int32_t)len, 0, bias[i]);
            }
            break;
        }
        if (rc != ATTN_OK) {
            return rc;
        }
        /* Gemma3RMSNorm multiplies by (1.0 + weight.float()): the same float sum, once. */
        for (size_t j = 0; lay->is_norm_one_plus && j < len; j++) {
            dst[i][j] += 1.0f;
        }
    }
    return ATTN_OK;
}

/* DeepSeek's tensors as they are (nn.Linear layout). Its q_proj has no bias even with
 * attention_bias, which the engine's optional b_q then holds as zeros. */
static int read_mla(const struct attn__hf_reader *rd, const attn_config *c,
                    const struct attn__hf_layout *lay, const char *prefix, int32_t layer,
                    struct attn__layer *l) {
    struct mla_name n[MLA_NAMES];
    int32_t count = mla_names(c, l, n);
    for (int32_t i = 0; i < count; i++) {
        if (!n[i].is_present) {
            continue;
        }
        int rc = read_named(rd, prefix, layer, lay, n[i].name, n[i].rows, n[i].cols, n[i].dst);
        if (rc != ATTN_OK) {
            return rc;
        }
    }
    if (l->b_q != NULL) {
        memset(l->b_q, 0, (size_t)c->n_heads * c->head_dim * sizeof(float));
    }
    return ATTN_OK;
}

int attn__hf_layer_read(const struct attn__hf_reader *rd, const attn_config *c,
                        const struct attn__hf_layout *lay, const char *prefix, int32_t layer,
                        struct attn__layer *l) {
    int rc = ATTN_OK;
    float *tmp = NULL;
    if (lay->tensors == ATTN__HF_NEOX || lay->tensors == ATTN__HF_FALCON ||
        lay->tensors == ATTN__HF_GPT2) {
        /* The largest tensor a reordering reads: the fused projection. */
        size_t n = (size_t)(c->n_heads + 2 * c->n_kv_heads) * c->head_dim * c->hidden_size;
        if ((tmp = malloc(n * sizeof(float))) == NULL) {
            return ATTN_ENOMEM;
        }
    }
    switch (lay->tensors) {
    case ATTN__HF_QKVO:
    case ATTN__HF_DENSE:
        rc = read_qkvo(rd, c, lay, prefix, layer, l);
        break;
    case ATTN__HF_FUSED_QKV:
        rc = read_fused(rd, c, lay, prefix, layer, l);
        break;
    case ATTN__HF_NEOX:
    case ATTN__HF_FALCON:
        rc = read_grouped(rd, c, lay, prefix, layer, l, tmp);
        break;
    case ATTN__HF_GPT2:
        rc = read_gpt2(rd, c, lay, prefix, layer, l, tmp);
        break;
    case ATTN__HF_MLA:
        rc = read_mla(rd, c, lay, prefix, layer, l);
        break;
    }
    free(tmp);
    if (rc == ATTN_OK && c->has_sinks) {
        rc = read_named(rd, prefix, layer, lay, "sinks", c->n_heads, 0, l->sinks);
    }
    return rc != ATTN_OK ? rc : read_norms(rd, c, lay, prefix, layer, l);
}
