/* engine/sdpa.c: stateless scaled-dot-product attention over caller tensors (seed notes
 * 3.1-3.6), run through the same tasks as the layer forward, with contiguous K/V viewed as
 * blocks of SDPA_BLOCK keys; linear attention (3.7) is linear.c's. */
#include "attn_int.h"

#include <math.h>

#define SDPA_BLOCK 64

/* Checks the dimensions only, so scratch can be sized before the tensors exist. */
static int check_dims(const attn_sdpa_params *p) {
    if (p == NULL) {
        return ATTN_EINVAL;
    }
    if (p->n_heads < 1 || p->n_kv_heads < 1 || p->n_q < 1 || p->n_k < 1 || p->d_k < 1 ||
        p->d_v < 1 || p->window < -1 || !isfinite(p->scale) || p->scale < 0 ||
        (p->mask_ld != 0 && p->mask_ld < (size_t)p->n_k)) {
        return ATTN_EINVAL;
    }
    if (p->kind != ATTN_SDPA_SOFTMAX && p->kind != ATTN_SDPA_LINEAR) {
        return ATTN_EINVAL;
    }
    /* Linear attention has no scale, window or mask, and no weights to return. */
    if (p->kind == ATTN_SDPA_LINEAR && (p->window >= 0 || p->scale != 0.0f || p->mask != NULL ||
                                        p->weights != NULL || p->inspect != NULL)) {
        return ATTN_EINVAL;
    }
    const attn_inspect *ins = p->inspect;
    if (ins != NULL &&
        (ins->q != NULL || ins->k != NULL || ins->v != NULL || ins->head_out != NULL)) {
        return ATTN_EINVAL; /* the caller has them */
    }
    if (p->n_heads % p->n_kv_heads != 0) {
        return ATTN_ESHAPE;
    }
    int rc = attn__inspect_check(ins, p->n_heads, p->n_q, p->n_k);
    if (rc != ATTN_OK) {
        return rc;
    }
    /* Keeps every index product inside size_t comfortably. */
    if ((int64_t)p->n_heads * p->n_q > (1 << 24) || (int64_t)p->n_kv_heads * p->n_k > (1 << 26) ||
        p->d_k > (1 << 16) || p->d_v > (1 << 16)) {
        return ATTN_ERANGE;
    }
    return ATTN_OK;
}

static int32_t n_q_tiles(const attn_sdpa_params *p) {
    return (p->n_q + ATTN__Q_TILE - 1) / ATTN__Q_TILE;
}

size_t attn_sdpa_scratch_bytes(const attn_sdpa_params *p) {
    if (check_dims(p) != ATTN_OK) {
        return 0;
    }
    if (p->kind == ATTN_SDPA_LINEAR) {
        return attn__linear_scratch_bytes(p);
    }
    int32_t r = p->n_heads / p->n_kv_heads;
    size_t n_tasks = (size_t)p->n_kv_heads * n_q_tiles(p);
    /* Per-row scratch for all rows, plus the per-task key-packing area. */
    size_t floats =
        (size_t)p->n_kv_heads * attn__task_scratch_floats(r * p->n_q, p->d_k, p->d_v, SDPA_BLOCK) +
        n_tasks * attn__task_scratch_floats(0, p->d_k, p->d_v, SDPA_BLOCK);
    if (p->inspect != NULL) {
        floats += (size_t)p->n_heads * p->n_q; /* each row's LSE */
    }
    /* Tasks first, then float scratch; round the task array up to float alignment. */
    size_t task_bytes = (n_tasks * sizeof(struct attn__task) + 63) / 64 * 64;
    return task_bytes + floats * sizeof(float);
}

int attn_sdpa(const attn_sdpa_params *p, void *scratch) {
    int rc = check_dims(p);
    if (rc != ATTN_OK) {
        return rc;
    }
    if (p->q == NULL || p->k == NULL || p->v == NULL || p->out == NULL || scratch == NULL) {
        return ATTN_EINVAL;
    }
    if (p->kind == ATTN_SDPA_LINEAR) {
        return attn__linear_sdpa(p, scratch);
    }
    int32_t r = p->n_heads / p->n_kv_heads;
    size_t n_tasks = (size_t)p->n_kv_heads * n_q_tiles(p);
    struct attn__task *tasks = scratch;
    float *fs = (float *)((char *)scratch + (n_tasks * sizeof(struct attn__task) + 63) / 64 * 64);
    size_t used = 0;
    int32_t i = 0;
    float *lse = NULL;
    if (p->inspect != NULL) {
        lse = fs; /* (n_heads, n_q) */
        used = (size_t)p->n_heads * p->n_q;
    }
    for (int32_t g = 0; g < p->n_kv_heads; g++) {
        for (int32_t q0 = 0; q0 < p->n_q; q0 += ATTN__Q_TILE) {
            int32_t nq = p->n_q - q0 < ATTN__Q_TILE ? p->n_q - q0 : ATTN__Q_TILE;
            struct attn__task *t = &tasks[i++];
            size_t h0 = (size_t)g * r;
            t->q = p->q + (h0 * p->n_q + q0) * p->d_k;
            t->q_head_stride = (size_t)p->n_q * p->d_k;
            t->q_ld = (size_t)p->d_k;
            t->out = p->out + (h0 * p->n_q + q0) * p->d_v;
            t->out_head_stride = (size_t)p->n_q * p->d_v;
            t->out_ld = (size_t)p->d_v;
            t->w = NULL;
            if (p->weights != NULL) {
                t->w = p->weights + (h0 * p->n_q + q0) * p->n_k;
                t->w_head_stride = (size_t)p->n_q * p->n_k;
                t->w_ld = (size_t)p->n_k;
                t->w_cols = p->n_k;
            }
            t->n_group = r;
            t->n_q = nq;
            t->d_k = p->d_k;
            t->d_v = p->d_v;
            t->scale = p->scale > 0 ? p->scale : 1.0f / sqrtf((float)p->d_k);
            t->softcap = 0.0f;
            t->sinks = NULL;
            t->kv.k_base = (const uint8_t *)(p->k + (size_t)g * p->n_k * p->d_k);
            t->kv.v_base = (const uint8_t *)(p->v + (size_t)g * p->n_k * p->d_v);
            t->kv.block_ids = NULL;
            t->kv.k_row_bytes = (size_t)p->d_k * sizeof(float);
            t->kv.v_row_bytes = (size_t)p->d_v * sizeof(float);
            t->kv.k_block_stride = SDPA_BLOCK * t->kv.k_row_bytes;
            t->kv.v_block_stride = SDPA_BLOCK * t->kv.v_row_bytes;
            t->kv.dtype = ATTN_DTYPE_F32;
            t->is_partial = false;
            t->kv.block_tokens = SDPA_BLOCK;
            t->kv.n_keys = p->n_k;
            t->mask.q_index0 = p->n_k - p->n_q + q0;
            t->mask.is_causal = p->is_causal;
            t->mask.window_left = p->window;
            t->mask.window_right = p->window;
            t->mask.key_valid = NULL;
            t->mask.pair_valid = p->mask != NULL ? p->mask + (size_t)q0 * p->mask_ld : NULL;
            t->mask.pair_ld = p->mask_ld;
            t->lse = NULL;
            t->inspect = p->inspect;
            if (lse != NULL) {
                t->lse = lse + h0 * p->n_q + q0;
                t->lse_head_stride = (size_t)p->n_q;
                t->lse_ld = 1;
                t->head0 = (int32_t)h0;
                t->token0 = q0;
                t->inspect_rows = p->inspect->rows != NULL ? p->inspect->n_rows : p->n_q;
            }
            t->scratch = fs + used;
            used += attn__task_scratch_floats(r * nq, p->d_k, p->d_v, SDPA_BLOCK);
        }
    }
    /* One task at a time on this thread (the caller's worker), so the cancel check sits between
     * tiles. */
    attn__inspect_begin(p->inspect, p->n_heads, p->n_q);
    for (size_t j = 0; j < n_tasks; j++) {
        if (p->is_cancelled != NULL && p->is_cancelled(p->cancel_ctx)) {
            return ATTN_ECANCELED;
        }
        attn__task_run(&tasks[j]);
        attn__tasks_inspect(NULL, &tasks[j], 1);
    }
    attn__inspect_end(p->inspect, p->n_heads, p->n_q);
    return ATTN_OK;
}
