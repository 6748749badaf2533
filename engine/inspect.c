/* engine/inspect.c: the bookkeeping of an attention inspection (attn_inspect): checking a
 * selection against a call, and the cells of its output. The values themselves come from the
 * tasks that computed the attention (attend.c), so they see exactly the call's keys and masks. */
#include "attn_int.h"

#include <math.h>
#include <stdlib.h>

static bool is_ascending_in(const int32_t *a, int32_t n, int32_t limit) {
    for (int32_t i = 0; i < n; i++) {
        if (a[i] < 0 || a[i] >= limit || (i > 0 && a[i] <= a[i - 1])) {
            return false;
        }
    }
    return true;
}

int attn__inspect_check(const attn_inspect *ins, int32_t n_heads, int32_t n_tokens,
                        int32_t n_keys) {
    if (ins == NULL) {
        return ATTN_OK;
    }
    if ((unsigned)ins->kind > ATTN_INSPECT_LSE || (unsigned)ins->reduce > ATTN_REDUCE_MAX_HEADS) {
        return ATTN_EINVAL;
    }
    if ((ins->heads != NULL &&
         (ins->n_heads < 1 || !is_ascending_in(ins->heads, ins->n_heads, n_heads))) ||
        (ins->rows != NULL &&
         (ins->n_rows < 1 || !is_ascending_in(ins->rows, ins->n_rows, n_tokens)))) {
        return ATTN_EINVAL;
    }
    if (ins->out != NULL && ins->kind != ATTN_INSPECT_LSE &&
        (ins->key_first < 0 || ins->n_keys < 0 || (int64_t)ins->key_first + ins->n_keys > n_keys)) {
        return ATTN_ERANGE;
    }
    return ATTN_OK;
}

static int32_t selected(const int32_t *sel, int32_t n_sel, int32_t n_all) {
    return sel != NULL ? n_sel : n_all;
}

/* Cells of the output: (H', R, K) or (H', R). */
static size_t cells(const attn_inspect *ins, int32_t n_heads, int32_t n_tokens) {
    size_t h =
        ins->reduce == ATTN_REDUCE_NONE ? (size_t)selected(ins->heads, ins->n_heads, n_heads) : 1;
    size_t k = ins->kind == ATTN_INSPECT_LSE ? 1 : (size_t)ins->n_keys;
    return h * (size_t)selected(ins->rows, ins->n_rows, n_tokens) * k;
}

void attn__inspect_begin(const attn_inspect *ins, int32_t n_heads, int32_t n_tokens) {
    if (ins == NULL || ins->out == NULL) {
        return;
    }
    /* A probability of a hidden key is 0 (under any reduction), a score or an LSE -inf; a mean
     * starts at 0 (the tasks then add a hidden key's -inf score explicitly). */
    bool is_zero = ins->reduce == ATTN_REDUCE_MEAN_HEADS || ins->kind == ATTN_INSPECT_PROBS;
    float start = is_zero ? 0.0f : -INFINITY;
    size_t n = cells(ins, n_heads, n_tokens);
    for (size_t i = 0; i < n; i++) {
        ins->out[i] = start;
    }
}

void attn__inspect_end(const attn_inspect *ins, int32_t n_heads, int32_t n_tokens) {
    if (ins == NULL || ins->out == NULL || ins->reduce != ATTN_REDUCE_MEAN_HEADS) {
        return;
    }
    float inv = 1.0f / (float)selected(ins->heads, ins->n_heads, n_heads);
    size_t n = cells(ins, n_heads, n_tokens);
    for (size_t i = 0; i < n; i++) {
        ins->out[i] *= inv; /* -inf scores stay -inf */
    }
}

int32_t attn__inspect_find(const int32_t *sel, int32_t n_sel, int32_t x) {
    if (sel == NULL) {
        return x;
    }
    int32_t lo = 0, hi = n_sel - 1;
    while (lo <= hi) {
        int32_t mid = lo + (hi - lo) / 2;
        if (sel[mid] == x) {
            return mid;
        }
        if (sel[mid] < x) {
            lo = mid + 1;
        } else {
            hi = mid - 1;
        }
    }
    return -1;
}

void attn__inspect_put(const attn_inspect *ins, int32_t n_rows, int32_t hs, int32_t rs, int32_t kk,
                       float value) {
    size_t k = ins->kind == ATTN_INSPECT_LSE ? 1 : (size_t)ins->n_keys;
    size_t h = ins->reduce == ATTN_REDUCE_NONE ? (size_t)hs : 0;
    float *cell = ins->out + (h * (size_t)n_rows + (size_t)rs) * k + (size_t)kk;
    switch (ins->reduce) {
    case ATTN_REDUCE_NONE:
        *cell = value;
        break;
    case ATTN_REDUCE_MEAN_HEADS:
        *cell += value;
        break;
    case ATTN_REDUCE_MAX_HEADS:
        /* NaN (a head whose row float cannot compute) wins, as in a mean: never the others' */
        *cell = value > *cell || isnan(value) ? value : *cell;
        break;
    }
}

/* ---- the attention of tokens already cached -------------------------------------------------- */

int attn_kv_attention(const attn_model *m, int32_t layer, const attn_kv *kv,
                      const attn_inspect *ins) {
    if (m == NULL || kv == NULL || ins == NULL || ins->out == NULL || ins->q != NULL ||
        ins->k != NULL || ins->v != NULL || ins->head_out != NULL) {
        return ATTN_EINVAL;
    }
    const attn_config *c = &m->cfg;
    if (kv->pool->model != m) {
        return ATTN_ESHAPE;
    }
    if (layer < m->layer_first || layer >= m->layer_first + m->layer_count) {
        return ATTN_EINVAL;
    }
    bool is_sliding = attn_config_layer_is_sliding(c, layer);
    if (!kv->has_queries || attn_config_layer_is_linear(c, layer)) {
        return ATTN_EUNSUPPORTED;
    }
    if (kv->window > 0 && !(is_sliding && kv->window == c->sliding_window)) {
        return ATTN_EINVAL; /* a ring of another layer */
    }
    int rc = attn__inspect_check(ins, c->n_heads, kv->len, kv->len);
    if (rc != ATTN_OK) {
        return rc;
    }
    /* A ring keeps what later queries see: an old row's query, or keys it saw, may be gone. */
    int32_t first_row = ins->rows != NULL ? ins->rows[0] : 0;
    int32_t first_key = kv->window > 0 ? first_row - kv->window + 1 : 0;
    first_key = first_key > 0 ? first_key : 0;
    if (kv->len > 0 && first_key < attn_kv_first_held(kv)) {
        return ATTN_EDROPPED;
    }
    const struct attn__layer *l = &m->layers[layer - m->layer_first];
    int32_t r = c->n_heads / c->n_kv_heads, d = c->head_dim, bt = kv->pool->block_tokens;
    int32_t n_rows = ins->rows != NULL ? ins->n_rows : kv->len;
    size_t task_floats = attn__task_scratch_floats(r, d, d, bt);
    float *buf = attn__alloc_floats(task_floats + 2 * (size_t)r * d + (size_t)r);
    if (buf == NULL) {
        return ATTN_ENOMEM;
    }
    float *q = buf + task_floats, *o = q + (size_t)r * d, *lse = o + (size_t)r * d;
    attn__inspect_begin(ins, c->n_heads, kv->len);
    for (int32_t rs = 0; rs < n_rows; rs++) {
        int32_t i = ins->rows != NULL ? ins->rows[rs] : rs;
        for (int32_t g = 0; g < c->n_kv_heads; g++) {
            bool any = false;
            for (int32_t j = 0; j < r && !any; j++) {
                any = attn__inspect_find(ins->heads, ins->n_heads, g * r + j) >= 0;
            }
            if (!any) {
                continue;
            }
            for (int32_t j = 0; j < r; j++) {
                attn__kv_widen_portable(kv->pool->dtype, attn__kv_row_bytes_q(kv, g * r + j, i), 0,
                                        1, d, q + (size_t)j * d, 0);
            }
            /* One query row of the group's heads, as the forward ran it when i was new. */
            struct attn__task t = {.q = q,
                                   .q_head_stride = (size_t)d,
                                   .q_ld = (size_t)d,
                                   .out = o,
                                   .out_head_stride = (size_t)d,
                                   .out_ld = (size_t)d,
                                   .n_group = r,
                                   .n_q = 1,
                                   .d_k = d,
                                   .d_v = d,
                                   .scale = c->softmax_scale,
                                   .softcap = c->logit_softcap,
                                   .sinks = l->sinks != NULL ? l->sinks + (size_t)g * r : NULL,
                                   .kv = attn__kv_view_of(kv, g, kv->len),
                                   .mask = {.q_index0 = i,
                                            .is_causal = true,
                                            .window_left = is_sliding ? c->sliding_window - 1 : -1,
                                            .window_right = -1},
                                   .scratch = buf,
                                   .lse = lse,
                                   .lse_head_stride = 1,
                                   .lse_ld = 1,
                                   .inspect = ins,
                                   .head0 = g * r,
                                   .token0 = i,
                                   .inspect_rows = n_rows};
            attn__task_run(&t);
            attn__tasks_inspect(NULL, &t, 1);
        }
    }
    attn__inspect_end(ins, c->n_heads, kv->len);
    free(buf);
    return ATTN_OK;
}
