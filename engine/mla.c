/* engine/mla.c: multi-head latent attention (seed 003; DeepSeek-V2 / V3) for one chunk of a
 * forward. The low-rank projections make each token's latent c (normalized) and its shared
 * rotated key k_rot, which the cache keeps: kv_lora_rank + qk_rope_head_dim floats a token.
 * Attention runs in the absorbed form for prefill and decode alike: head h's query is
 * (q_nope W_UK_h | RoPE(q_rot)) against each cached (c | k_rot), which equals q . k of the
 * expanded heads, and its value is W_UV_h applied to the attention-weighted latents. The
 * latent is one KV head, so a query tile's heads are split into groups to make tasks. */
#include "attn_int.h"

#include <cblas.h>
#include <math.h>
#include <string.h>

/* x = w * x / sqrt(mean(x^2) + eps) over n values (DeepSeek's RMSNorm), in place. */
static void rms_norm(float *x, int32_t n, const float *w, float eps) {
    double ss = 0.0;
    for (int32_t i = 0; i < n; i++) {
        ss += (double)x[i] * x[i];
    }
    float inv = (float)(1.0 / sqrt(ss / n + eps));
    for (int32_t i = 0; i < n; i++) {
        x[i] = w[i] * (x[i] * inv);
    }
}

/* The queries of the chunk's rows: x W_q, or RMSNorm(x W_qa) W_qb, into ws->qkv (rows x
 * n_heads * head_dim). */
static void project_queries(const attn_config *c, const struct attn__layer *l, attn_workspace *ws,
                            const float *x, int32_t rows) {
    int32_t qk = c->n_heads * c->head_dim;
    if (c->q_lora_rank == 0) {
        attn__project(ws, x, rows, c->hidden_size, l->w_q, l->b_q, qk, ws->qkv);
        return;
    }
    attn__project(ws, x, rows, c->hidden_size, l->w_qa, l->b_qa, c->q_lora_rank, ws->mla_qa);
    for (int32_t r = 0; r < rows; r++) {
        rms_norm(ws->mla_qa + (size_t)r * c->q_lora_rank, c->q_lora_rank, l->q_a_norm,
                 c->mla_norm_eps);
    }
    attn__project(ws, ws->mla_qa, rows, c->q_lora_rank, l->w_qb, NULL, qk, ws->qkv);
}

/* Rotates each part's q_rot and k_rot at its tokens' positions and appends the latent rows. */
static void rotate_and_append(const attn_model *m, const attn_step *steps,
                              const struct chunk_part *parts, int32_t n_parts, attn_workspace *ws) {
    const attn_config *c = &m->cfg;
    int32_t nope = c->qk_nope_head_dim, kvl = c->kv_lora_rank;
    size_t q_ld = (size_t)c->n_heads * c->head_dim, d_k = (size_t)kvl + c->qk_rope_head_dim;
    for (int32_t i = 0; i < n_parts; i++) {
        const struct chunk_part *p = &parts[i];
        const attn_step *st = &steps[p->step];
        int32_t base = st->kv->len;
        struct attn__rope_frame frame;
        int32_t max_pos =
            attn__rope_depends_on_call(c) ? attn__step_max_position(st, base - p->first) : 0;
        attn__rope_frame_init(m, false, max_pos, &frame);
        attn__kv_grow(st->kv, p->n);
        for (int32_t t = 0; t < p->n; t++) {
            float *q = ws->qkv + (size_t)(p->row + t) * q_ld;
            float *ckv = ws->mla_ckv + (size_t)(p->row + t) * d_k;
            int32_t pos = st->positions ? st->positions[p->first + t] : base + t;
            /* every head's rotated part (head_dim apart), and the one shared k_rot */
            attn__rope_apply(c, &frame, q + nope, c->n_heads, ckv + kvl, 1, pos);
            attn__kv_put_k(st->kv, 0, base + t, ckv);
        }
    }
}

/* ws->mla_q[r][h] = (q_nope W_UK_h | q_rot) for the chunk's rows: W_UK_h is head h's first
 * qk_nope_head_dim rows of W_kvb (qk_nope_head_dim x kv_lora_rank). */
static void absorb_queries(const attn_config *c, const struct attn__layer *l, attn_workspace *ws,
                           int32_t rows) {
    int32_t h_n = c->n_heads, nope = c->qk_nope_head_dim, kvl = c->kv_lora_rank;
    int32_t rope = c->qk_rope_head_dim, hd = c->head_dim;
    size_t d_k = (size_t)kvl + rope, kvb_rows = (size_t)nope + c->v_head_dim;
    for (int32_t h = 0; h < h_n; h++) {
        float *dst = ws->mla_q + (size_t)h * d_k;
        if (nope > 0) {
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, rows, kvl, nope, 1.0f,
                        ws->qkv + (size_t)h * hd, h_n * hd, l->w_kvb + (size_t)h * kvb_rows * kvl,
                        kvl, 0.0f, dst, (int)(h_n * d_k));
        } else {
            for (int32_t r = 0; r < rows; r++) {
                memset(dst + (size_t)r * h_n * d_k, 0, (size_t)kvl * sizeof(float));
            }
        }
        for (int32_t r = 0; r < rows; r++) {
            memcpy(dst + (size_t)r * h_n * d_k + kvl,
                   ws->qkv + (size_t)r * h_n * hd + h * hd + nope, (size_t)rope * sizeof(float));
        }
    }
}

/* The tasks of one part: per query tile, per group of heads, over the step's latent cache. */
static int32_t part_tasks(const attn_config *c, attn_workspace *ws, const attn_step *st,
                          const struct chunk_part *p, struct attn__task *tasks,
                          size_t *scratch_used) {
    int32_t h_n = c->n_heads, kvl = c->kv_lora_rank;
    int32_t d_k = kvl + c->qk_rope_head_dim;
    int32_t n_keys = st->kv->len; /* the part's tokens are appended already */
    int32_t p_start = n_keys - p->n;
    int32_t total_keys = st->kv->len - p->first - p->n + st->n_tokens; /* after the step */
    int32_t n_tasks = 0;
    for (int32_t q0 = 0; q0 < p->n; q0 += ATTN__Q_TILE) {
        int32_t nq = p->n - q0 < ATTN__Q_TILE ? p->n - q0 : ATTN__Q_TILE;
        for (int32_t h0 = 0; h0 < h_n; h0 += ATTN__MLA_HEADS_PER_TASK) {
            int32_t g = h_n - h0 < ATTN__MLA_HEADS_PER_TASK ? h_n - h0 : ATTN__MLA_HEADS_PER_TASK;
            struct attn__task *t = &tasks[n_tasks++];
            size_t row = (size_t)p->row + q0;
            t->q = ws->mla_q + (row * h_n + h0) * d_k;
            t->q_head_stride = (size_t)d_k;
            t->q_ld = (size_t)h_n * d_k;
            t->out = ws->mla_lat + (row * h_n + h0) * kvl;
            t->out_head_stride = (size_t)kvl;
            t->out_ld = (size_t)h_n * kvl;
            t->n_group = g;
            t->n_q = nq;
            t->d_k = d_k;
            t->d_v = kvl;
            t->scale = c->softmax_scale;
            t->softcap = 0.0f;
            t->sinks = NULL;
            t->kv = attn__kv_view_of(st->kv, 0, n_keys);
            attn__task_bind(t, ws, st, p, h0, q0, total_keys, scratch_used);
            t->mask.q_index0 = p_start + q0;
            t->mask.is_causal = true;
            t->mask.window_left = -1;
        }
    }
    return n_tasks;
}

int32_t attn__mla_begin(const attn_model *m, int32_t layer, attn_workspace *ws,
                        const attn_step *steps, const struct chunk_part *parts, int32_t n_parts,
                        const float *x, int32_t rows) {
    const attn_config *c = &m->cfg;
    const struct attn__layer *l = &m->layers[layer - m->layer_first];
    int32_t kvl = c->kv_lora_rank, d_k = kvl + c->qk_rope_head_dim;
    project_queries(c, l, ws, x, rows);
    attn__project(ws, x, rows, c->hidden_size, l->w_kva, l->b_kva, d_k, ws->mla_ckv);
    for (int32_t r = 0; r < rows; r++) {
        rms_norm(ws->mla_ckv + (size_t)r * d_k, kvl, l->kv_a_norm, c->mla_norm_eps);
    }
    rotate_and_append(m, steps, parts, n_parts, ws);
    absorb_queries(c, l, ws, rows);
    int32_t n_tasks = 0;
    size_t scratch_used = 0;
    for (int32_t i = 0; i < n_parts; i++) {
        n_tasks +=
            part_tasks(c, ws, &steps[parts[i].step], &parts[i], ws->tasks + n_tasks, &scratch_used);
    }
    return n_tasks;
}

void attn__mla_end(const attn_model *m, int32_t layer, attn_workspace *ws, int32_t rows) {
    const attn_config *c = &m->cfg;
    const struct attn__layer *l = &m->layers[layer - m->layer_first];
    int32_t h_n = c->n_heads, kvl = c->kv_lora_rank, nope = c->qk_nope_head_dim;
    int32_t v = c->v_head_dim;
    /* value_h = W_UV_h (v_head_dim x kv_lora_rank, after W_UK_h in W_kvb) times the latent */
    for (int32_t h = 0; h < h_n; h++) {
        const float *w_uv = l->w_kvb + ((size_t)h * (nope + v) + nope) * kvl;
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, rows, v, kvl, 1.0f,
                    ws->mla_lat + (size_t)h * kvl, h_n * kvl, w_uv, kvl, 0.0f,
                    ws->attn + (size_t)h * v, h_n * v);
    }
}
