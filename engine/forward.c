/* engine/forward.c: the layer forward over a batch of sequences. Each projection is one product
 * over every new token of every step (sgemm, sgemv, or the weight-streaming kernel for a few
 * tokens; sliced over the executor when there is one); RoPE and the K/V appends follow; attention
 * is cut into independent tasks (one GQA group x one query tile of one step) that an executor may
 * spread over threads. All memory comes from the workspace, sized at create time. */
#include "attn_int.h"

#include <cblas.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

/* Output rows (weight rows) per projection task when an executor spreads a few tokens' work:
 * enough tasks that two threads end together (the small preset's 768-row QKV projection was 3
 * tasks of 256 rows, two of them on one thread), each still 64 rows x hidden of streaming; two
 * whole panels of half-precision weights. */
#define LINEAR_SLICE 64

/* Many tokens: the weight rows are cut into LINEAR_WIDE_TASKS ranges, each one sgemm (float
 * weights) or one panel product (half precision: panel.c), or where the panels' kernels are
 * AVX2's (attn__panel_prefers_sgemm) one sgemm per LINEAR_PANEL rows widened into the task's own
 * buffer (a few tokens always take the panels' kernels). sgemm packs all of x again for every call:
 * at 64-row calls that packing took a sixth of a 512-token prefill (perf: sgemm_oncopy 18%), at 256
 * rows ~4%. Tasks, not threads, own the buffers, so their memory does not depend on the executor.
 */
#define LINEAR_WIDE_TASKS 4
#define LINEAR_PANEL      256

/* Up to this many tokens a projection of float weights streams them through attn__rows_dot:
 * OpenBLAS's sgemm packs the whole weight matrix for every call, which for a few rows costs
 * several times the bandwidth-bound read (M = 8 against a 6144 x 4096 matrix: 21 ms for sgemm,
 * 3.6 for the matrix-vector product). */
#define LINEAR_SMALL_ROWS 32

static size_t n_qkv_of(const attn_config *c) {
    return (size_t)(c->n_heads + 2 * c->n_kv_heads) * c->head_dim;
}

/* Attention tasks per query tile: one per KV head, or per MLA head group. */
static int32_t tasks_per_tile(const attn_config *c) {
    return c->kv_lora_rank > 0
               ? (c->n_heads + ATTN__MLA_HEADS_PER_TASK - 1) / ATTN__MLA_HEADS_PER_TASK
               : c->n_kv_heads;
}

static int32_t max_tasks_for(const attn_config *c, int32_t max_tokens) {
    /* A chunk has at most max_tokens parts, and a part of n tokens makes ceil(n / Q_TILE) tiles,
     * so tiles <= max_tokens + max_tokens / Q_TILE. */
    return tasks_per_tile(c) * (max_tokens + max_tokens / ATTN__Q_TILE + 1);
}

void attn_workspace_destroy(attn_workspace *ws) {
    if (ws == NULL) {
        return;
    }
    free(ws->x);
    free(ws->qkv);
    free(ws->attn);
    free(ws->y);
    free(ws->scratch);
    free(ws->lse);
    free(ws->splits);
    free(ws->tasks);
    free(ws->parts);
    free(ws->group_ready);
    free(ws->mla_qa);
    free(ws->mla_ckv);
    free(ws->mla_q);
    free(ws->mla_lat);
    free(ws->xpack);
    free(ws->panels);
    free(ws);
}

int attn_workspace_create(const attn_model *m, int32_t max_tokens, const attn_executor *ex,
                          attn_workspace **out) {
    if (m == NULL || out == NULL || max_tokens < 1 || max_tokens > (1 << 20)) {
        return ATTN_EINVAL;
    }
    const attn_config *c = &m->cfg;
    attn_workspace *ws = calloc(1, sizeof *ws);
    if (ws == NULL) {
        return ATTN_ENOMEM;
    }
    ws->model = m;
    ws->max_tokens = max_tokens;
    if (ex != NULL && ex->run != NULL) {
        ws->ex = *ex;
        ws->has_ex = true;
    }
    size_t t = (size_t)max_tokens;
    bool is_mla = c->kv_lora_rank > 0;
    int32_t v_dim = is_mla ? c->v_head_dim : c->head_dim;
    size_t hd_all = (size_t)c->n_heads * (v_dim > c->head_dim ? v_dim : c->head_dim);
    /* What a task's rows hold: head_dim keys and values, or MLA's latent against the absorbed
     * queries. The largest KV block a pool of this model may use is 256 tokens. */
    int32_t d_k = is_mla ? c->kv_lora_rank + c->qk_rope_head_dim : c->head_dim;
    int32_t d_v = is_mla ? c->kv_lora_rank : c->head_dim;
    size_t rows = (size_t)c->n_heads * t;
    ws->x = attn__alloc_floats(t * c->hidden_size);
    ws->qkv = attn__alloc_floats(t * n_qkv_of(c));
    ws->attn = attn__alloc_floats(t * hd_all);
    ws->y = attn__alloc_floats(t * c->hidden_size);
    ws->max_tasks = max_tasks_for(c, max_tokens);
    /* Per-row scratch for every query row, plus one key-packing area per task. */
    size_t pack = attn__task_scratch_floats(0, d_k, d_v, 256);
    ws->scratch = attn__alloc_floats(attn__task_scratch_floats((int32_t)rows, d_k, d_v, 256) +
                                     (size_t)ws->max_tasks * pack);
    ws->lse = attn__alloc_floats(rows);
    ws->tasks = calloc((size_t)ws->max_tasks, sizeof *ws->tasks);
    ws->splits = calloc((size_t)ws->max_tasks, sizeof *ws->splits);
    ws->parts = calloc(t, sizeof *ws->parts);
    ws->group_ready = calloc((size_t)c->n_kv_heads, sizeof *ws->group_ready);
    bool xpack_ok = true;
    if (m->weights_dtype != ATTN_DTYPE_F32) {
        /* the input of a projection, packed for the panels' kernels */
        size_t in_max = hd_all > (size_t)c->hidden_size ? hd_all : (size_t)c->hidden_size;
        ws->xpack = attn__alloc_floats(t * in_max);
        /* and for many tokens where the kernels are AVX2's, each wide task's widened weights
         * (made for the kernels of this moment: without them many tokens take the panels'
         * kernels too) */
        bool widens = max_tokens > LINEAR_SMALL_ROWS && attn__panel_prefers_sgemm();
        ws->panels =
            widens ? attn__alloc_floats((size_t)LINEAR_WIDE_TASKS * LINEAR_PANEL * in_max) : NULL;
        xpack_ok = ws->xpack != NULL && (!widens || ws->panels != NULL);
    }
    bool mla_ok = true;
    if (is_mla) {
        ws->mla_qa = c->q_lora_rank > 0 ? attn__alloc_floats(t * c->q_lora_rank) : NULL;
        ws->mla_ckv = attn__alloc_floats(t * (size_t)d_k);
        ws->mla_q = attn__alloc_floats(rows * (size_t)d_k);
        ws->mla_lat = attn__alloc_floats(rows * (size_t)d_v);
        mla_ok = (c->q_lora_rank == 0 || ws->mla_qa != NULL) && ws->mla_ckv != NULL &&
                 ws->mla_q != NULL && ws->mla_lat != NULL;
    }
    if (ws->x == NULL || ws->qkv == NULL || ws->attn == NULL || ws->y == NULL ||
        ws->scratch == NULL || ws->lse == NULL || ws->tasks == NULL || ws->splits == NULL ||
        ws->parts == NULL || ws->group_ready == NULL || !mla_ok || !xpack_ok) {
        attn_workspace_destroy(ws);
        return ATTN_ENOMEM;
    }
    *out = ws;
    return ATTN_OK;
}

int32_t attn_workspace_max_tokens(const attn_workspace *ws) {
    return ws->max_tokens;
}

/* A step's inspection and head scales: a linear layer has no scores to read, and a cross
 * step or a latent cache no per-token keys and values of the step to capture. */
static int check_inspect(const attn_model *m, int32_t layer, const attn_step *st,
                         const attn_kv *cache) {
    const attn_inspect *ins = st->inspect;
    for (int32_t h = 0; st->head_scale != NULL && h < m->cfg.n_heads; h++) {
        if (!isfinite(st->head_scale[h])) {
            return ATTN_EINVAL;
        }
    }
    if (ins == NULL) {
        return ATTN_OK;
    }
    if (attn_config_layer_is_linear(&m->cfg, layer) ||
        ((ins->k != NULL || ins->v != NULL) && (st->cross != NULL || m->cfg.kv_lora_rank > 0))) {
        return ATTN_EINVAL;
    }
    int32_t n_keys = st->cross != NULL ? cache->len + st->n_context : cache->len + st->n_tokens;
    return attn__inspect_check(ins, m->cfg.n_heads, st->n_tokens, n_keys);
}

/* Checks every step before anything changes, so a failed forward leaves all caches as they were. */
static int validate(const attn_model *m, int32_t layer, const attn_workspace *ws,
                    const attn_step *steps, int32_t n_steps) {
    if (m == NULL || ws == NULL || steps == NULL || n_steps < 1 || ws->model != m) {
        return ATTN_EINVAL;
    }
    if (layer < m->layer_first || layer >= m->layer_first + m->layer_count) {
        return ATTN_EINVAL;
    }
    const attn_kv_pool *pool = NULL;
    int64_t blocks = 0;
    for (int32_t s = 0; s < n_steps; s++) {
        const attn_step *st = &steps[s];
        /* A cross step appends its context to `cross`; a self step its tokens to kv. */
        attn_kv *cache = st->cross != NULL ? st->cross : st->kv;
        int32_t n_new = st->cross != NULL ? st->n_context : st->n_tokens;
        if (cache == NULL || st->x == NULL || st->out == NULL || st->n_tokens < 1) {
            return ATTN_EINVAL;
        }
        if (st->cross != NULL &&
            (st->positions != NULL || st->key_valid != NULL || st->n_context < 0 ||
             (st->n_context > 0 && st->context == NULL) || st->cross->window > 0)) {
            return ATTN_EINVAL;
        }
        if (cache->pool->model != m) {
            return ATTN_ESHAPE;
        }
        /* A linear layer's cache is its state (attn_kv_create_for_layer), and nothing of a
         * score's (weights, masks, positions, a context) applies to it; a state serves no
         * other layer. */
        bool is_linear = attn_config_layer_is_linear(&m->cfg, layer);
        if (m->cfg.kv_lora_rank > 0 && st->cross != NULL) {
            return ATTN_EINVAL; /* a latent cache has no context form */
        }
        if (cache->is_state != is_linear ||
            (is_linear && (st->cross != NULL || st->weights != NULL || st->key_valid != NULL ||
                           st->positions != NULL))) {
            return ATTN_EINVAL;
        }
        /* A ring dropped what other layers' queries would see. */
        if (cache->window > 0 && !(attn_config_layer_is_sliding(&m->cfg, layer) &&
                                   m->cfg.sliding_window == cache->window)) {
            return ATTN_EINVAL;
        }
        if (pool == NULL) {
            pool = cache->pool;
        } else if (cache->pool != pool) {
            return ATTN_EINVAL;
        }
        for (int32_t u = 0; u < s; u++) {
            if ((steps[u].cross != NULL ? steps[u].cross : steps[u].kv) == cache) {
                return ATTN_EINVAL;
            }
        }
        if ((int64_t)cache->len + n_new > m->cfg.max_seq) {
            return ATTN_ERANGE;
        }
        int rc = check_inspect(m, layer, st, cache);
        if (rc != ATTN_OK) {
            return rc;
        }
        for (int32_t i = 0; st->positions != NULL && i < st->n_tokens; i++) {
            if (st->positions[i] < 0 || st->positions[i] >= m->cfg.max_seq) {
                return ATTN_ERANGE;
            }
        }
        blocks += attn_kv_blocks_needed(cache, n_new);
    }
    /* Reserved caches need no blocks, and then the pool's accounting is not even read. */
    if (blocks > 0 && blocks > pool->n_free) {
        return ATTN_ENOSPC;
    }
    return ATTN_OK;
}

/* y (n x out_dim) = x (n x in_dim) W^T (+ b), W (out_dim x in_dim) row-major, computed for the
 * weight rows [first, first + count). */
struct linear_job {
    const float *x;
    int32_t n, in_dim;
    const float *w, *b;
    const uint16_t *wh;  /* the weights in half precision, in panels, instead of w; or NULL */
    attn_dtype wh_dtype; /* wh's: BF16 or F16 */
    const float *xp;     /* with wh: x packed for the panels' kernels (pack_input), or NULL
                            where the panels are widened for sgemm instead */
    float *panels;       /* then: LINEAR_PANEL widened rows of weights per wide task */
    int32_t block_rows;  /* the kernels' block height xp was packed for */
    int32_t out_dim;
    float *y;
};

/* Half-precision weights rows [first, first + count) widened LINEAR_PANEL at a time into
 * `panel` (transposed: in_dim x rows), each followed by sgemm. */
static void linear_rows_widened(const struct linear_job *j, int32_t first, int32_t count, float *y,
                                float *panel) {
    for (int32_t r = 0; r < count; r += LINEAR_PANEL) {
        int32_t rows = count - r < LINEAR_PANEL ? count - r : LINEAR_PANEL;
        attn__panel_widen(j->wh_dtype, j->wh, j->in_dim, first + r, first + r + rows, panel,
                          (size_t)rows);
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, j->n, rows, j->in_dim, 1.0f, j->x,
                    j->in_dim, panel, rows, 0.0f, y + r, j->out_dim);
    }
}

static void linear_rows(const struct linear_job *j, int32_t first, int32_t count, float *panel) {
    float *y = j->y + first;
    const float *w = j->w != NULL ? j->w + (size_t)first * j->in_dim : NULL;
    if (j->wh != NULL && j->xp == NULL) {
        linear_rows_widened(j, first, count, y, panel);
    } else if (j->wh != NULL) {
        attn__panel_dot(j->block_rows, j->wh_dtype, j->xp, j->n, j->in_dim, j->wh, first,
                        first + count, y, (size_t)j->out_dim);
    } else if (j->n <= LINEAR_SMALL_ROWS && attn__tile_is_fast() &&
               (j->n > 1 || count < j->out_dim)) {
        attn__rows_dot(j->x, j->n, j->in_dim, w, count, y, (size_t)j->out_dim);
    } else if (j->n == 1) {
        cblas_sgemv(CblasRowMajor, CblasNoTrans, count, j->in_dim, 1.0f, w, j->in_dim, j->x, 1,
                    0.0f, y, 1);
    } else {
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, j->n, count, j->in_dim, 1.0f, j->x,
                    j->in_dim, w, j->in_dim, 0.0f, y, j->out_dim);
    }
    if (j->b != NULL) {
        for (int32_t i = 0; i < j->n; i++) {
            float *row = y + (size_t)i * j->out_dim;
            for (int32_t c = 0; c < count; c++) {
                row[c] += j->b[first + c];
            }
        }
    }
}

/* Few tokens: task i is the i-th LINEAR_SLICE of weight rows. */
static void linear_task(void *arg, int32_t i) {
    const struct linear_job *j = arg;
    int32_t first = i * LINEAR_SLICE;
    int32_t count = j->out_dim - first < LINEAR_SLICE ? j->out_dim - first : LINEAR_SLICE;
    linear_rows(j, first, count, NULL);
}

/* Many tokens: task i is the i-th of LINEAR_WIDE_TASKS ranges of weight rows, cut at multiples
 * of a panel (which is also a multiple of sgemm's widest register block, 8). */
static void linear_wide_task(void *arg, int32_t i) {
    const struct linear_job *j = arg;
    int32_t per =
        ((j->out_dim + LINEAR_WIDE_TASKS - 1) / LINEAR_WIDE_TASKS + ATTN__PANEL_ROWS - 1) /
        ATTN__PANEL_ROWS * ATTN__PANEL_ROWS;
    int32_t first = i * per < j->out_dim ? i * per : j->out_dim;
    int32_t count = j->out_dim - first < per ? j->out_dim - first : per;
    if (count > 0) {
        float *panel = j->panels != NULL ? j->panels + (size_t)i * LINEAR_PANEL * j->in_dim : NULL;
        linear_rows(j, first, count, panel);
    }
}

/* With an executor the weight rows are cut into slices run on its threads (BLAS is then expected
 * to be single-threaded); without one, a single call uses BLAS's own threads. A lone token on
 * the calling thread uses sgemv, which OpenBLAS threads well. Weights are w (float), or wh
 * (half precision, of the model's weights_dtype) when w is NULL. */
static struct linear_job linear_job_of(const attn_workspace *ws, const float *x, int32_t n,
                                       int32_t in_dim, const float *w, const uint16_t *wh,
                                       const float *b, int32_t out_dim, float *y) {
    return (struct linear_job){.x = x,
                               .n = n,
                               .in_dim = in_dim,
                               .w = w,
                               .b = b,
                               .wh = w == NULL ? wh : NULL,
                               .wh_dtype = ws->model->weights_dtype,
                               .out_dim = out_dim,
                               .y = y};
}

/* A job's input and where it is packed. */
struct pack_job {
    const struct linear_job *j;
    float *xp;
};

/* Task i of LINEAR_WIDE_TASKS packing a job's input: its share of the blocks of input rows
 * (each block packs alone, at its own place). */
static void pack_task(void *arg, int32_t i) {
    const struct pack_job *p = arg;
    const struct linear_job *j = p->j;
    int32_t blocks = (j->n + j->block_rows - 1) / j->block_rows;
    int32_t per = (blocks + LINEAR_WIDE_TASKS - 1) / LINEAR_WIDE_TASKS * j->block_rows;
    int32_t first = i * per;
    if (first < j->n) {
        int32_t rows = j->n - first < per ? j->n - first : per;
        size_t at = (size_t)first * j->in_dim;
        attn__panel_pack_x(j->block_rows, j->x + at, rows, j->in_dim, p->xp + at);
    }
}

/* Half-precision weights: x packed (once, before any task reads it) for the panels' kernels, or
 * for many rows on AVX2 nothing (the tasks widen their panels for sgemm, which packs x). */
static void pack_input(const attn_workspace *ws, struct linear_job *j) {
    if (j->wh == NULL) {
        return;
    }
    if (j->n > LINEAR_SMALL_ROWS && attn__panel_prefers_sgemm() && ws->panels != NULL) {
        j->xp = NULL;
        j->panels = ws->panels;
        return;
    }
    j->block_rows = attn__panel_block_rows();
    if (j->n == 1) {
        j->xp = j->x; /* a lone row is its own packing */
        return;
    }
    j->xp = ws->xpack;
    if (ws->has_ex && j->n > LINEAR_SMALL_ROWS) {
        /* a prefill's input (8 MiB for 512 llama tokens) packed by every thread: on one, the
         * others waited (1% of the prefill's profile each) */
        struct pack_job p = {j, ws->xpack};
        ws->ex.run(ws->ex.ctx, pack_task, &p, LINEAR_WIDE_TASKS);
        return;
    }
    attn__panel_pack_x(j->block_rows, j->x, j->n, j->in_dim, ws->xpack);
}

static void linear_held(const attn_workspace *ws, const float *x, int32_t n, int32_t in_dim,
                        const float *w, const uint16_t *wh, const float *b, int32_t out_dim,
                        float *y) {
    struct linear_job j = linear_job_of(ws, x, n, in_dim, w, wh, b, out_dim, y);
    pack_input(ws, &j);
    int32_t n_slices = (out_dim + LINEAR_SLICE - 1) / LINEAR_SLICE;
    bool spread = ws->has_ex && (int64_t)n * in_dim * out_dim >= ATTN__PARALLEL_MIN_MACS;
    if (spread && n > LINEAR_SMALL_ROWS && out_dim >= 8 * LINEAR_WIDE_TASKS) {
        ws->ex.run(ws->ex.ctx, linear_wide_task, &j, LINEAR_WIDE_TASKS);
    } else if (spread && n_slices > 1) {
        ws->ex.run(ws->ex.ctx, linear_task, &j, n_slices);
    } else {
        linear_rows(&j, 0, out_dim, ws->panels);
    }
}

static void linear(const attn_workspace *ws, const float *x, int32_t n, int32_t in_dim,
                   const float *w, const float *b, int32_t out_dim, float *y) {
    linear_held(ws, x, n, in_dim, w, NULL, b, out_dim, y);
}

void attn__project(const attn_workspace *ws, const float *x, int32_t n, int32_t in_dim,
                   const float *w, const float *b, int32_t out_dim, float *y) {
    linear(ws, x, n, in_dim, w, b, out_dim, y);
}

/* Splits the steps' tokens, starting at (*step, *first), into parts that fill one chunk of at
 * most max_tokens rows. Returns the number of parts and advances the cursor. */
static int32_t next_chunk(const attn_step *steps, int32_t n_steps, int32_t max_tokens,
                          int32_t *step, int32_t *first, struct chunk_part *parts,
                          int32_t *n_rows) {
    int32_t n_parts = 0, rows = 0;
    while (*step < n_steps && rows < max_tokens) {
        int32_t left = steps[*step].n_tokens - *first;
        int32_t take = left < max_tokens - rows ? left : max_tokens - rows;
        parts[n_parts++] = (struct chunk_part){*step, *first, take, rows};
        rows += take;
        *first += take;
        if (*first == steps[*step].n_tokens) {
            (*step)++;
            *first = 0;
        }
    }
    *n_rows = rows;
    return n_parts;
}

int32_t attn__step_max_position(const attn_step *st, int32_t first) {
    int32_t max = st->positions == NULL ? first + st->n_tokens - 1 : st->positions[0];
    for (int32_t i = 1; st->positions != NULL && i < st->n_tokens; i++) {
        max = st->positions[i] > max ? st->positions[i] : max;
    }
    return st->rope_reach > max ? st->rope_reach : max;
}

/* Query heads [q_first, q_first + n_q) and KV heads [k_first, k_first + n_k) of a layer. */
struct head_range {
    int32_t q_first, n_q, k_first, n_k;
};

/* Clips (clip_qkv), normalizes (qk_norm) and rotates (RoPE) the part's q, k and v rows of the
 * heads hr, and writes their k and v (and q, for a cache that keeps them) at the part's cache
 * slots, which attn__kv_grow took (the last p->n). Rows the caller projected (attn_forward_qkv)
 * are neither clipped nor normalized, and rotated only when it asks (rope). */
static void prepare_heads(const attn_model *m, int32_t layer, const attn_step *st,
                          const struct chunk_part *p, float *qkv, bool is_caller_projected,
                          bool rope, struct head_range hr) {
    const attn_config *c = &m->cfg;
    const struct attn__layer *l = &m->layers[layer - m->layer_first];
    bool is_local = attn_config_layer_is_sliding(c, layer);
    size_t n_qkv = n_qkv_of(c), hd = (size_t)c->head_dim;
    size_t k_off = (size_t)c->n_heads * hd, v_off = k_off + (size_t)c->n_kv_heads * hd;
    int32_t base = st->kv->len - p->n;
    struct attn__rope_frame frame;
    bool rotates = attn_config_layer_rotates(c, layer) && (!is_caller_projected || rope);
    if (rotates) {
        /* A call's rotation may depend on the whole step's reach (longrope, dynamic), not only
         * on this part's. */
        int32_t max_pos =
            attn__rope_depends_on_call(c) ? attn__step_max_position(st, base - p->first) : 0;
        attn__rope_frame_init(m, is_local, max_pos, &frame);
    }
    for (int32_t i = 0; i < p->n; i++) {
        float *row = qkv + (size_t)(p->row + i) * n_qkv;
        int32_t idx = base + i;
        int32_t pos = st->positions ? st->positions[p->first + i] : idx;
        if (!is_caller_projected) {
            attn__qkv_finish_heads(c, l, row, hr.q_first, hr.n_q, hr.k_first, hr.n_k);
        }
        if (rotates) {
            attn__rope_apply(c, &frame, row + hr.q_first * hd, hr.n_q,
                             row + k_off + hr.k_first * hd, hr.n_k, pos);
        }
        for (int32_t h = hr.k_first; h < hr.k_first + hr.n_k; h++) {
            attn__kv_put_k(st->kv, h, idx, row + k_off + h * hd);
            attn__kv_put_v(st->kv, h, idx, row + v_off + h * hd);
        }
        for (int32_t h = hr.q_first; st->kv->has_queries && h < hr.q_first + hr.n_q; h++) {
            attn__kv_put_q(st->kv, h, idx, row + h * hd);
        }
    }
}

/* Appends the part's tokens to its cache, every head prepared (prepare_heads). */
static void rope_and_append(const attn_model *m, int32_t layer, const attn_step *st,
                            const struct chunk_part *p, float *qkv, bool is_caller_projected,
                            bool rope) {
    const attn_config *c = &m->cfg;
    attn__kv_grow(st->kv, p->n);
    struct head_range all = {0, c->n_heads, 0, c->n_kv_heads};
    prepare_heads(m, layer, st, p, qkv, is_caller_projected, rope, all);
}

/* Projects a cross step's context through the layer's K and V (in chunks of the workspace's
 * rows), clips and normalizes them where the layer does, and appends them to the cross cache,
 * unrotated. */
static void append_context(const attn_model *m, int32_t layer, attn_workspace *ws,
                           const attn_step *st) {
    const attn_config *c = &m->cfg;
    const struct attn__layer *l = &m->layers[layer - m->layer_first];
    size_t n_qkv = n_qkv_of(c), hd = (size_t)c->head_dim;
    size_t k_off = (size_t)c->n_heads * hd, v_off = k_off + (size_t)c->n_kv_heads * hd;
    for (int32_t first = 0; first < st->n_context; first += ws->max_tokens) {
        int32_t n = st->n_context - first < ws->max_tokens ? st->n_context - first : ws->max_tokens;
        linear_held(ws, st->context + (size_t)first * c->hidden_size, n, c->hidden_size, l->w_qkv,
                    l->w_qkv_h, l->b_qkv, (int32_t)n_qkv, ws->qkv);
        int32_t base = st->cross->len;
        attn__kv_grow(st->cross, n);
        for (int32_t i = 0; i < n; i++) {
            float *row = ws->qkv + (size_t)i * n_qkv;
            attn__qkv_finish_row(c, l, row);
            for (int32_t h = 0; h < c->n_kv_heads; h++) {
                attn__kv_put_k(st->cross, h, base + i, row + k_off + h * hd);
                attn__kv_put_v(st->cross, h, base + i, row + v_off + h * hd);
            }
        }
    }
}

void attn__task_bind(struct attn__task *t, attn_workspace *ws, const attn_step *st,
                     const struct chunk_part *p, int32_t h0, int32_t q0, int32_t total_keys,
                     size_t *scratch_used) {
    t->w = NULL;
    if (st->weights != NULL) {
        /* weights (n_heads, n_tokens, total_keys); this tile's first row is token
         * p->first + q0 of head h0. */
        size_t ld = (size_t)total_keys;
        t->w = st->weights + ((size_t)h0 * st->n_tokens + p->first + q0) * ld;
        t->w_head_stride = (size_t)st->n_tokens * ld;
        t->w_ld = ld;
        t->w_cols = total_keys;
    }
    t->mask.window_right = -1;
    t->mask.key_valid = st->key_valid;
    t->mask.pair_valid = NULL;
    t->mask.pair_ld = 0;
    t->is_partial = false; /* split_task makes it partial */
    t->lse = NULL;
    t->inspect = st->inspect;
    if (st->inspect != NULL) {
        int32_t n_heads = ws->model->cfg.n_heads;
        t->lse = ws->lse + (size_t)(p->row + q0) * n_heads + h0;
        t->lse_head_stride = 1;
        t->lse_ld = (size_t)n_heads;
        t->head0 = h0;
        t->token0 = p->first + q0;
        t->inspect_rows = st->inspect->rows != NULL ? st->inspect->n_rows : st->n_tokens;
    }
    t->scratch = ws->scratch + *scratch_used;
    *scratch_used +=
        attn__task_scratch_floats(t->n_group * t->n_q, t->d_k, t->d_v, t->kv.block_tokens);
}

/* Split-K: a part of at most SPLIT_MAX_Q tokens (decode, a few speculative ones) whose keys
 * reach 2 * SPLIT_KEYS has each task's keys cut in ranges of about SPLIT_KEYS, so that a long
 * context keeps every thread busy even with fewer KV heads than threads (MQA, a small model). */
#define SPLIT_MAX_Q 8
#define SPLIT_KEYS  1024

/* Ways to split the tasks of a part with n_keys keys, at most max_ways. */
static int32_t split_ways(const attn_workspace *ws, const attn_step *st, const struct chunk_part *p,
                          int32_t n_keys, int32_t max_ways) {
    if (!ws->has_ex || st->weights != NULL || p->n > SPLIT_MAX_Q || n_keys < 2 * SPLIT_KEYS) {
        return 1;
    }
    int32_t ways = n_keys / SPLIT_KEYS;
    return ways < max_ways ? ways : max_ways;
}

/* Replaces task t (bound, is_partial false) by `ways` partial tasks over consecutive block
 * ranges, t and the ones after it, each with its own scratch; records the split. */
static int32_t split_task(attn_workspace *ws, struct attn__task *t, int32_t ways,
                          size_t *scratch_used) {
    int32_t n_blocks = (t->kv.n_keys + t->kv.block_tokens - 1) / t->kv.block_tokens;
    int32_t per = (n_blocks + ways - 1) / ways;
    ways = (n_blocks + per - 1) / per;
    size_t floats =
        attn__task_scratch_floats(t->n_group * t->n_q, t->d_k, t->d_v, t->kv.block_tokens);
    for (int32_t i = 0; i < ways; i++) {
        struct attn__task *u = t + i;
        if (i > 0) {
            *u = *t;
            u->scratch = ws->scratch + *scratch_used;
            *scratch_used += floats;
        }
        u->is_partial = true;
        u->block_lo = i * per;
        u->block_hi = (i + 1) * per - 1;
    }
    ws->splits[ws->n_splits++] = (struct attn__split){(int32_t)(t - ws->tasks), ways};
    return ways;
}

/* Builds the attention tasks of one part: per KV head, query tiles of ATTN__Q_TILE tokens (each
 * task split `max_ways` ways at most, see split_ways). */
static int32_t part_tasks(const attn_model *m, int32_t layer, attn_workspace *ws,
                          const attn_step *st, const struct chunk_part *p, struct attn__task *tasks,
                          size_t *scratch_used, int32_t max_ways) {
    const attn_config *c = &m->cfg;
    const struct attn__layer *l = &m->layers[layer - m->layer_first];
    bool is_cross = st->cross != NULL;
    int32_t window_left =
        !is_cross && attn_config_layer_is_sliding(c, layer) ? c->sliding_window - 1 : -1;
    int32_t r = c->n_heads / c->n_kv_heads;
    size_t n_qkv = n_qkv_of(c), hd = (size_t)c->head_dim, hd_all = (size_t)c->n_heads * hd;
    const attn_kv *cache = is_cross ? st->cross : st->kv;
    int32_t n_keys = cache->len;     /* a self part's tokens are appended already */
    int32_t p_start = n_keys - p->n; /* cache index of a self part's first token */
    /* Columns of the weights: the keys after the whole step. */
    int32_t total_keys = is_cross ? n_keys : st->kv->len - p->first - p->n + st->n_tokens;
    int32_t ways = split_ways(ws, st, p, n_keys, max_ways);
    int32_t n_tasks = 0;
    for (int32_t q0 = 0; q0 < p->n; q0 += ATTN__Q_TILE) {
        int32_t nq = p->n - q0 < ATTN__Q_TILE ? p->n - q0 : ATTN__Q_TILE;
        for (int32_t g = 0; g < c->n_kv_heads; g++) {
            struct attn__task *t = &tasks[n_tasks++];
            int32_t row = p->row + q0;
            t->q = ws->qkv + (size_t)row * n_qkv + (size_t)g * r * hd;
            t->q_head_stride = hd;
            t->q_ld = n_qkv;
            t->out = ws->attn + (size_t)row * hd_all + (size_t)g * r * hd;
            t->out_head_stride = hd;
            t->out_ld = hd_all;
            t->n_group = r;
            t->n_q = nq;
            t->d_k = c->head_dim;
            t->d_v = c->head_dim;
            t->scale = c->softmax_scale;
            t->softcap = c->logit_softcap;
            t->sinks = l->sinks != NULL ? l->sinks + (size_t)g * r : NULL;
            t->kv = attn__kv_view_of(cache, g, n_keys);
            attn__task_bind(t, ws, st, p, g * r, q0, total_keys, scratch_used);
            t->mask.q_index0 = p_start + q0;
            t->mask.is_causal = !is_cross; /* every query sees the whole context */
            t->mask.window_left = window_left;
            if (ways > 1) {
                n_tasks += split_task(ws, t, ways, scratch_used) - 1;
            }
        }
    }
    return n_tasks;
}

/* After a part's attention: its captures (attn_inspect's q, k, v, head_out) out of the chunk's
 * rows, then its head scales applied to the attention output that o_proj will read. */
static void finish_part(const attn_config *c, attn_workspace *ws, const attn_step *st,
                        const struct chunk_part *p) {
    const attn_inspect *ins = st->inspect;
    if (ins == NULL && st->head_scale == NULL) {
        return;
    }
    bool is_mla = c->kv_lora_rank > 0;
    size_t hd = (size_t)c->head_dim, d_v = is_mla ? (size_t)c->v_head_dim : hd;
    size_t q_ld = is_mla ? (size_t)c->n_heads * hd : n_qkv_of(c), out_ld = c->n_heads * d_v;
    size_t k_off = (size_t)c->n_heads * hd, v_off = k_off + (size_t)c->n_kv_heads * hd;
    size_t T = (size_t)st->n_tokens;
    for (int32_t i = 0; i < p->n; i++) {
        const float *row = ws->qkv + (size_t)(p->row + i) * q_ld;
        float *head_out = ws->attn + (size_t)(p->row + i) * out_ld;
        size_t tok = (size_t)(p->first + i);
        for (int32_t h = 0; ins != NULL && h < c->n_heads; h++) {
            if (ins->q != NULL) {
                memcpy(ins->q + (h * T + tok) * hd, row + h * hd, hd * sizeof(float));
            }
            if (ins->head_out != NULL) {
                memcpy(ins->head_out + (h * T + tok) * d_v, head_out + h * d_v,
                       d_v * sizeof(float));
            }
        }
        for (int32_t g = 0; ins != NULL && g < c->n_kv_heads; g++) {
            if (ins->k != NULL) {
                memcpy(ins->k + (g * T + tok) * hd, row + k_off + g * hd, hd * sizeof(float));
            }
            if (ins->v != NULL) {
                memcpy(ins->v + (g * T + tok) * hd, row + v_off + g * hd, hd * sizeof(float));
            }
        }
        for (int32_t h = 0; st->head_scale != NULL && h < c->n_heads; h++) {
            for (size_t e = 0; e < d_v; e++) {
                head_out[h * d_v + e] *= st->head_scale[h];
            }
        }
    }
}

/* An inspection's output starts (or, for a mean, ends) before (after) all of a forward's
 * chunks. */
static void inspect_steps(const attn_config *c, const attn_step *steps, int32_t n_steps,
                          bool is_begin) {
    for (int32_t s = 0; s < n_steps; s++) {
        if (is_begin) {
            attn__inspect_begin(steps[s].inspect, c->n_heads, steps[s].n_tokens);
        } else {
            attn__inspect_end(steps[s].inspect, c->n_heads, steps[s].n_tokens);
        }
    }
}

/* ---- decode chunks whose projection and attention overlap ----------------------------------- */

/* A chunk of a few tokens a step (decode, a batch of sessions) runs its q/k/v projection and its
 * attention as one executor batch, KV group by group: group g's projection (its query heads'
 * rows, its key and value rows, then their norm, RoPE and append) is one task, each of the
 * group's attention tasks waits for it, and the batch puts group g's attention next to group
 * g + 2's projection. Both stream from memory, and one thread's attention (held to ~10 GB/s by
 * its own outstanding misses) beside the other's projection (~17 GB/s) read about 27 GB/s
 * together (a probe), where the two threads on attention alone read ~17: llama8b's decode at
 * L=8192 went from 1.16x and 1.22x of its roofline to 1.11x and 1.09x (attn_bench, paired,
 * alternated), L=2048 and the batches unchanged. Needs enough groups to alternate; a model with
 * fewer (the small preset's 2) splits its attention across threads instead. */
#define PIPE_MIN_GROUPS 4

struct pipe_job {
    const attn_model *m;
    int32_t layer;
    attn_workspace *ws;
    const attn_step *steps;
    const struct chunk_part *parts;
    int32_t n_parts;
    struct linear_job qkv; /* the chunk's rows against the whole w_qkv */
    int32_t per_group;     /* attention tasks per group: tasks[r * n_groups + g] */
};

/* A pipelined chunk's parts are a query tile each (part_tasks binds a tile's groups in order),
 * so its tasks form (parts, groups) in that order. */
_Static_assert(LINEAR_SMALL_ROWS <= ATTN__Q_TILE, "a pipelined part is one query tile");

static bool can_pipeline(const attn_model *m, int32_t layer, const attn_workspace *ws,
                         const attn_step *steps, const struct chunk_part *parts, int32_t n_parts,
                         int32_t rows) {
    const attn_config *c = &m->cfg;
    if (!ws->has_ex || c->kv_lora_rank > 0 || attn_config_layer_is_linear(c, layer) ||
        c->n_kv_heads < PIPE_MIN_GROUPS || !attn__qk_norm_is_per_head(c) ||
        rows > LINEAR_SMALL_ROWS ||
        (int64_t)rows * c->hidden_size * (int64_t)n_qkv_of(c) < ATTN__PARALLEL_MIN_MACS) {
        return false;
    }
    for (int32_t i = 0; i < n_parts; i++) {
        if (steps[parts[i].step].cross != NULL) {
            return false;
        }
    }
    return true;
}

static void pipe_project(const struct pipe_job *j, int32_t g) {
    const attn_config *c = &j->m->cfg;
    int32_t r = c->n_heads / c->n_kv_heads, hd = c->head_dim;
    int32_t k_row = c->n_heads * hd, v_row = k_row + c->n_kv_heads * hd;
    linear_rows(&j->qkv, g * r * hd, r * hd, NULL);
    linear_rows(&j->qkv, k_row + g * hd, hd, NULL);
    linear_rows(&j->qkv, v_row + g * hd, hd, NULL);
    struct head_range hr = {g * r, r, g, 1};
    for (int32_t i = 0; i < j->n_parts; i++) {
        prepare_heads(j->m, j->layer, &j->steps[j->parts[i].step], &j->parts[i], j->ws->qkv, false,
                      false, hr);
    }
    __atomic_store_n(&j->ws->group_ready[g], 1, __ATOMIC_RELEASE);
}

static void pipe_attend(const struct pipe_job *j, int32_t g, int32_t r) {
    /* Group g's projection comes earlier in the batch. Each thread starting its tasks in
     * increasing order (attn_executor's contract), the lowest-numbered waiting task's projection
     * is finished or running on a thread that waits for nothing lower: every wait ends. */
    while (!__atomic_load_n(&j->ws->group_ready[g], __ATOMIC_ACQUIRE)) {
#if defined(__x86_64__) || defined(__i386__)
        __builtin_ia32_pause();
#endif
    }
    attn__task_run(&j->ws->tasks[(size_t)r * j->m->cfg.n_kv_heads + g]);
}

/* Task i of the batch: projections 0 and 1, then each group's attention tasks followed by the
 * projection two groups on, while there is one. */
static void pipe_task(void *arg, int32_t i) {
    const struct pipe_job *j = arg;
    int32_t n_groups = j->m->cfg.n_kv_heads, per = j->per_group;
    if (i < 2) {
        pipe_project(j, i);
        return;
    }
    int32_t k = i - 2, paired = (n_groups - 2) * (per + 1);
    if (k < paired) {
        int32_t g = k / (per + 1), r = k % (per + 1);
        if (r < per) {
            pipe_attend(j, g, r);
        } else {
            pipe_project(j, g + 2);
        }
        return;
    }
    k -= paired;
    pipe_attend(j, n_groups - 2 + k / per, k % per);
}

/* The chunk's projection, appends and attention (tasks already bound, none split). */
static void run_pipelined(const attn_model *m, int32_t layer, attn_workspace *ws,
                          const attn_step *steps, const struct chunk_part *parts, int32_t n_parts,
                          const float *x, int32_t rows, int32_t n_tasks) {
    const attn_config *c = &m->cfg;
    const struct attn__layer *l = &m->layers[layer - m->layer_first];
    struct pipe_job j = {m,
                         layer,
                         ws,
                         steps,
                         parts,
                         n_parts,
                         linear_job_of(ws, x, rows, c->hidden_size, l->w_qkv, l->w_qkv_h, l->b_qkv,
                                       (int32_t)n_qkv_of(c), ws->qkv),
                         n_tasks / c->n_kv_heads};
    pack_input(ws, &j.qkv);
    for (int32_t g = 0; g < c->n_kv_heads; g++) {
        ws->group_ready[g] = 0;
    }
    ws->ex.run(ws->ex.ctx, pipe_task, &j, c->n_kv_heads + n_tasks);
}

/* ---- linear attention's states ------------------------------------------------------------ */

/* A state cannot take a token back as a cache can (a sum forgets its terms), so a call whose key
 * or value rows are not finite (a projection past float's range) must be caught before any state
 * takes them: a state that took one would answer NaN for the rest of its session. A chunk checks
 * all its rows before any of its states moves; a call of several chunks also keeps a copy of its
 * states from before the first, for when a later chunk fails (struct state_saves). */
static bool linear_rows_finite(const attn_config *c, const float *qkv, int32_t n_rows) {
    size_t n_qkv = n_qkv_of(c), k_off = (size_t)c->n_heads * c->head_dim;
    for (int32_t r = 0; r < n_rows; r++) {
        const float *kv = qkv + (size_t)r * n_qkv + k_off;
        for (size_t e = 0; e < n_qkv - k_off; e++) {
            if (!isfinite(kv[e])) {
                return false;
            }
        }
    }
    return true;
}

/* The states of a call's steps as they were before it: length, and contents when it had any. */
struct state_saves {
    int32_t *len;    /* (n_steps) */
    double *doubles; /* (n_steps, n_kv_heads, state doubles) */
    size_t per_head; /* state doubles of one KV head */
};

static int save_states(const attn_config *c, const attn_step *steps, int32_t n_steps,
                       struct state_saves *sv) {
    sv->per_head = attn__kv_state_doubles(steps[0].kv->pool);
    size_t per_step = sv->per_head * (size_t)c->n_kv_heads;
    sv->len = malloc((size_t)n_steps * sizeof *sv->len);
    sv->doubles = malloc((size_t)n_steps * per_step * sizeof *sv->doubles);
    if (sv->len == NULL || sv->doubles == NULL) {
        free(sv->len);
        free(sv->doubles);
        return ATTN_ENOMEM;
    }
    for (int32_t s = 0; s < n_steps; s++) {
        const attn_kv *kv = steps[s].kv;
        sv->len[s] = kv->len;
        for (int32_t g = 0; g < c->n_kv_heads && kv->len > 0; g++) {
            memcpy(sv->doubles + s * per_step + g * sv->per_head, attn__kv_state(kv, g),
                   sv->per_head * sizeof(double));
        }
    }
    return ATTN_OK;
}

/* Puts the states back. One that was empty keeps the blocks it took, zeroed, as a fresh state
 * has them (the pool's owner gives them back, as with a cache's reserved blocks). */
static void restore_states(const attn_config *c, const attn_step *steps, int32_t n_steps,
                           const struct state_saves *sv) {
    size_t per_step = sv->per_head * (size_t)c->n_kv_heads;
    for (int32_t s = 0; s < n_steps; s++) {
        attn_kv *kv = steps[s].kv;
        for (int32_t g = 0; g < c->n_kv_heads && kv->n_blocks > 0; g++) {
            double *state = attn__kv_state(kv, g);
            if (sv->len[s] > 0) {
                memcpy(state, sv->doubles + s * per_step + g * sv->per_head,
                       sv->per_head * sizeof(double));
            } else {
                memset(state, 0, sv->per_head * sizeof(double));
            }
        }
        kv->len = sv->len[s];
    }
}

/* Each part's tokens into its state and out of it, in order; false, with no state moved, when a
 * key or value row of the chunk is not finite. */
static bool run_linear_parts(const attn_config *c, const struct attn__layer *l, attn_workspace *ws,
                             const attn_step *steps, const struct chunk_part *parts,
                             int32_t n_parts) {
    size_t n_qkv = n_qkv_of(c), hd_all = (size_t)c->n_heads * c->head_dim;
    for (int32_t i = 0; i < n_parts; i++) {
        float *rows_qkv = ws->qkv + (size_t)parts[i].row * n_qkv;
        for (int32_t r = 0; r < parts[i].n; r++) {
            attn__qkv_finish_row(c, l, rows_qkv + (size_t)r * n_qkv);
        }
        if (!linear_rows_finite(c, rows_qkv, parts[i].n)) {
            return false;
        }
    }
    for (int32_t i = 0; i < n_parts; i++) {
        const struct chunk_part *p = &parts[i];
        attn__kv_grow(steps[p->step].kv, p->n);
        attn__linear_advance(c, steps[p->step].kv, ws->qkv + (size_t)p->row * n_qkv, n_qkv, p->n,
                             ws->attn + (size_t)p->row * hd_all, hd_all, (double *)ws->scratch);
    }
    return true;
}

/* Runs one chunk; false when its rows could not be taken (a linear layer's non-finite keys or
 * values), before any cache or state moved. */
static bool run_chunk(const attn_model *m, int32_t layer, attn_workspace *ws,
                      const attn_step *steps, const struct chunk_part *parts, int32_t n_parts,
                      int32_t rows) {
    const attn_config *c = &m->cfg;
    const struct attn__layer *l = &m->layers[layer - m->layer_first];
    int32_t hidden = c->hidden_size, hd_all = c->n_heads * c->head_dim;
    bool is_mla = c->kv_lora_rank > 0;
    int32_t hd_out = is_mla ? c->n_heads * c->v_head_dim : hd_all; /* o's inputs per token */
    bool single = n_parts == 1;
    const float *x = ws->x;
    if (single) {
        x = steps[parts[0].step].x + (size_t)parts[0].first * hidden;
    } else {
        for (int32_t i = 0; i < n_parts; i++) {
            const struct chunk_part *p = &parts[i];
            memcpy(ws->x + (size_t)p->row * hidden, steps[p->step].x + (size_t)p->first * hidden,
                   (size_t)p->n * hidden * sizeof(float));
        }
    }
    int32_t n_tasks = 0;
    size_t scratch_used = 0;
    /* The workspace holds tasks and row scratch for max_tokens tokens: a chunk of `rows` may
     * split each task that many times over. */
    int32_t max_ways = ws->max_tokens / (rows > 0 ? rows : 1);
    ws->n_splits = 0;
    bool is_pipelined = can_pipeline(m, layer, ws, steps, parts, n_parts, rows);
    if (is_mla) {
        n_tasks = attn__mla_begin(m, layer, ws, steps, parts, n_parts, x, rows);
    } else if (!is_pipelined) {
        linear_held(ws, x, rows, hidden, l->w_qkv, l->w_qkv_h, l->b_qkv, (int32_t)n_qkv_of(c),
                    ws->qkv);
    }
    bool is_linear = attn_config_layer_is_linear(c, layer);
    if (is_linear && !run_linear_parts(c, l, ws, steps, parts, n_parts)) {
        return false;
    }
    for (int32_t i = 0; i < n_parts && !is_linear && !is_mla; i++) {
        const attn_step *st = &steps[parts[i].step];
        if (st->cross != NULL) {
            /* Queries only: no RoPE, and nothing appended (x's own k and v go unused). */
            for (int32_t r = 0; r < parts[i].n; r++) {
                attn__qkv_finish_row(c, l, ws->qkv + (size_t)(parts[i].row + r) * n_qkv_of(c));
            }
        } else if (is_pipelined) {
            attn__kv_grow(st->kv, parts[i].n); /* the rows come in pipe_project */
        } else {
            rope_and_append(m, layer, st, &parts[i], ws->qkv, false, false);
        }
        n_tasks += part_tasks(m, layer, ws, st, &parts[i], ws->tasks + n_tasks, &scratch_used,
                              is_pipelined ? 1 : max_ways);
    }
    if (is_pipelined) {
        run_pipelined(m, layer, ws, steps, parts, n_parts, x, rows, n_tasks);
    } else {
        attn__tasks_run(ws->has_ex ? &ws->ex : NULL, ws->tasks, n_tasks);
    }
    for (int32_t i = 0; i < ws->n_splits; i++) {
        attn__tasks_merge(ws->tasks + ws->splits[i].first, ws->splits[i].n);
    }
    if (is_mla) {
        attn__mla_end(m, layer, ws, rows);
    }
    attn__tasks_inspect(ws->has_ex ? &ws->ex : NULL, ws->tasks, n_tasks);
    for (int32_t i = 0; i < n_parts; i++) {
        finish_part(c, ws, &steps[parts[i].step], &parts[i]);
    }
    float *y = single ? steps[parts[0].step].out + (size_t)parts[0].first * hidden : ws->y;
    linear_held(ws, ws->attn, rows, hd_out, l->w_o, l->w_o_h, l->b_o, hidden, y);
    if (!single) {
        for (int32_t i = 0; i < n_parts; i++) {
            const struct chunk_part *p = &parts[i];
            memcpy(steps[p->step].out + (size_t)p->first * hidden, ws->y + (size_t)p->row * hidden,
                   (size_t)p->n * hidden * sizeof(float));
        }
    }
    return true;
}

/* ---- keys and values past the cache's dtype ------------------------------------------------- */

/* Takes back the n tokens a call appended to kv: its length only, on the worker that ran the
 * call (the blocks stay, reserved: giving them back is the pool's owner's, see attn_kv_reserve).
 * A ring that dropped blocks during the call, which only an append without a reservation does,
 * cannot; the tokens appended then stay, held as infinities, so that what sees them answers NaN,
 * never a finite wrong number. */
static void take_back(attn_kv *kv, int32_t n) {
    if (kv != NULL && n > 0 && kv->len >= n) {
        (void)attn__kv_take_back(kv, kv->len - n);
    }
}

static bool overflowed(attn_kv *kv) {
    return kv != NULL && __atomic_exchange_n(&kv->overflowed, 0, __ATOMIC_RELAXED) != 0;
}

/* After a forward: if a key or value could not be held in some cache's dtype (f16 past 65504, a
 * q8_0 scale past binary16's), every cache of the call goes back to where it was and the call
 * fails, as when it is refused before any append. */
static int settle_overflow(const attn_step *steps, int32_t n_steps) {
    bool any = false;
    for (int32_t s = 0; s < n_steps; s++) {
        any |= overflowed(steps[s].kv); /* both read, so that both flags clear */
        any |= overflowed(steps[s].cross);
    }
    if (!any) {
        return ATTN_OK;
    }
    for (int32_t s = 0; s < n_steps; s++) {
        if (steps[s].cross != NULL) {
            take_back(steps[s].cross, steps[s].n_context);
        } else {
            take_back(steps[s].kv, steps[s].n_tokens);
        }
    }
    return ATTN_EOVERFLOW;
}

int attn_forward(const attn_model *m, int32_t layer, attn_workspace *ws, const attn_step *steps,
                 int32_t n_steps) {
    if (m != NULL && !m->has_weights) {
        return ATTN_EUNSUPPORTED; /* geometry alone: attn_forward_qkv */
    }
    int rc = validate(m, layer, ws, steps, n_steps);
    if (rc != ATTN_OK) {
        return rc;
    }
    /* Contexts first, so that each cross step's queries see all of theirs. */
    for (int32_t s = 0; s < n_steps; s++) {
        if (steps[s].cross != NULL) {
            append_context(m, layer, ws, &steps[s]);
        }
    }
    struct state_saves saves = {0};
    bool has_saves = false;
    if (attn_config_layer_is_linear(&m->cfg, layer)) {
        int64_t total = 0;
        for (int32_t s = 0; s < n_steps; s++) {
            total += steps[s].n_tokens;
        }
        if (total > ws->max_tokens) {
            rc = save_states(&m->cfg, steps, n_steps, &saves);
            if (rc != ATTN_OK) {
                return rc;
            }
            has_saves = true;
        }
    }
    inspect_steps(&m->cfg, steps, n_steps, true);
    int32_t step = 0, first = 0, n_chunks = 0;
    bool is_taken = true;
    while (step < n_steps && is_taken) {
        int32_t rows = 0;
        int32_t n_parts =
            next_chunk(steps, n_steps, ws->max_tokens, &step, &first, ws->parts, &rows);
        is_taken = run_chunk(m, layer, ws, steps, ws->parts, n_parts, rows);
        n_chunks += is_taken;
    }
    if (!is_taken) {
        if (has_saves && n_chunks > 0) {
            restore_states(&m->cfg, steps, n_steps, &saves);
        }
        rc = ATTN_EOVERFLOW;
    } else {
        inspect_steps(&m->cfg, steps, n_steps, false);
        rc = settle_overflow(steps, n_steps);
    }
    if (has_saves) {
        free(saves.len);
        free(saves.doubles);
    }
    return rc;
}

/* ---- attention on the caller's projections ------------------------------------------------ */

/* attn_forward_qkv's steps go through the same chunks and tasks as attn_forward's, as steps
 * whose rows come from the caller instead of a projection: this many at a time. */
#define QKV_STEPS_AT_ONCE 64

/* One chunk of caller-projected steps: their q, k and v into the workspace's rows (token-major,
 * as the projections leave them), RoPE if asked and the append, the attention tasks, and each
 * head's output back to the caller's (head, token) layout. */
static void run_chunk_qkv(const attn_model *m, int32_t layer, attn_workspace *ws,
                          const attn_qkv_step *qs, const attn_step *steps,
                          const struct chunk_part *parts, int32_t n_parts, int32_t rows) {
    const attn_config *c = &m->cfg;
    size_t n_qkv = n_qkv_of(c), hd = (size_t)c->head_dim, hd_all = (size_t)c->n_heads * hd;
    size_t k_off = hd_all, v_off = k_off + (size_t)c->n_kv_heads * hd;
    for (int32_t i = 0; i < n_parts; i++) {
        const struct chunk_part *p = &parts[i];
        const attn_qkv_step *q = &qs[p->step];
        size_t T = (size_t)q->n_tokens;
        for (int32_t t = 0; t < p->n; t++) {
            float *row = ws->qkv + (size_t)(p->row + t) * n_qkv;
            size_t tok = (size_t)(p->first + t);
            for (int32_t h = 0; h < c->n_heads; h++) {
                memcpy(row + h * hd, q->q + (h * T + tok) * hd, hd * sizeof(float));
            }
            for (int32_t g = 0; g < c->n_kv_heads; g++) {
                memcpy(row + k_off + g * hd, q->k + (g * T + tok) * hd, hd * sizeof(float));
                memcpy(row + v_off + g * hd, q->v + (g * T + tok) * hd, hd * sizeof(float));
            }
        }
    }
    int32_t n_tasks = 0;
    size_t scratch_used = 0;
    int32_t max_ways = ws->max_tokens / (rows > 0 ? rows : 1);
    ws->n_splits = 0;
    for (int32_t i = 0; i < n_parts; i++) {
        const attn_step *st = &steps[parts[i].step];
        rope_and_append(m, layer, st, &parts[i], ws->qkv, true, qs[parts[i].step].rope);
        n_tasks +=
            part_tasks(m, layer, ws, st, &parts[i], ws->tasks + n_tasks, &scratch_used, max_ways);
    }
    attn__tasks_run(ws->has_ex ? &ws->ex : NULL, ws->tasks, n_tasks);
    for (int32_t i = 0; i < ws->n_splits; i++) {
        attn__tasks_merge(ws->tasks + ws->splits[i].first, ws->splits[i].n);
    }
    attn__tasks_inspect(ws->has_ex ? &ws->ex : NULL, ws->tasks, n_tasks);
    for (int32_t i = 0; i < n_parts; i++) {
        finish_part(c, ws, &steps[parts[i].step], &parts[i]);
    }
    for (int32_t i = 0; i < n_parts; i++) {
        const struct chunk_part *p = &parts[i];
        const attn_qkv_step *q = &qs[p->step];
        size_t T = (size_t)q->n_tokens;
        for (int32_t t = 0; t < p->n; t++) {
            const float *row = ws->attn + (size_t)(p->row + t) * hd_all;
            size_t tok = (size_t)(p->first + t);
            for (int32_t h = 0; h < c->n_heads; h++) {
                memcpy(q->out + (h * T + tok) * hd, row + h * hd, hd * sizeof(float));
            }
        }
    }
}

/* The attn_step that stands for a q/k/v step in the checks, chunks and tasks (x is q: some
 * rows, never read as hidden states). */
static attn_step mirror_of(const attn_qkv_step *q) {
    return (attn_step){.kv = q->kv,
                       .x = q->q,
                       .n_tokens = q->n_tokens,
                       .positions = q->positions,
                       .out = q->out,
                       .weights = q->weights,
                       .inspect = q->inspect,
                       .head_scale = q->head_scale};
}

int attn_forward_qkv(const attn_model *m, int32_t layer, attn_workspace *ws,
                     const attn_qkv_step *steps, int32_t n_steps) {
    if (m == NULL || steps == NULL || n_steps < 1) {
        return ATTN_EINVAL;
    }
    if (m->cfg.kv_lora_rank > 0 ||
        (layer >= 0 && layer < m->cfg.n_layers && attn_config_layer_is_linear(&m->cfg, layer))) {
        return ATTN_EUNSUPPORTED;
    }
    /* The same checks as attn_forward's, on steps that mirror these (x stands for the rows). */
    attn_step mirror[QKV_STEPS_AT_ONCE];
    for (int32_t s0 = 0; s0 < n_steps; s0 += QKV_STEPS_AT_ONCE) {
        int32_t n = n_steps - s0 < QKV_STEPS_AT_ONCE ? n_steps - s0 : QKV_STEPS_AT_ONCE;
        for (int32_t s = 0; s < n; s++) {
            const attn_qkv_step *q = &steps[s0 + s];
            if (q->q == NULL || q->k == NULL || q->v == NULL) {
                return ATTN_EINVAL;
            }
            mirror[s] = mirror_of(q);
        }
        int rc = validate(m, layer, ws, mirror, n);
        if (rc != ATTN_OK) {
            return rc;
        }
    }
    /* Across groups: a cache in two groups would be one cache in two steps, and the blocks of
     * all of them must be free, so that either every cache advances or none. */
    int64_t blocks = 0;
    for (int32_t s = 0; s < n_steps; s++) {
        for (int32_t u = s < QKV_STEPS_AT_ONCE ? s : 0; u < s; u++) {
            if (steps[u].kv == steps[s].kv) {
                return ATTN_EINVAL;
            }
        }
        blocks += attn_kv_blocks_needed(steps[s].kv, steps[s].n_tokens);
    }
    if (blocks > 0 && blocks > steps[0].kv->pool->n_free) {
        return ATTN_ENOSPC;
    }
    for (int32_t s0 = 0; s0 < n_steps; s0 += QKV_STEPS_AT_ONCE) {
        int32_t n = n_steps - s0 < QKV_STEPS_AT_ONCE ? n_steps - s0 : QKV_STEPS_AT_ONCE;
        for (int32_t s = 0; s < n; s++) {
            mirror[s] = mirror_of(&steps[s0 + s]);
        }
        inspect_steps(&m->cfg, mirror, n, true);
        int32_t step = 0, first = 0;
        while (step < n) {
            int32_t rows = 0;
            int32_t n_parts =
                next_chunk(mirror, n, ws->max_tokens, &step, &first, ws->parts, &rows);
            run_chunk_qkv(m, layer, ws, steps + s0, mirror, ws->parts, n_parts, rows);
        }
        inspect_steps(&m->cfg, mirror, n, false);
    }
    bool any = false;
    for (int32_t s = 0; s < n_steps; s++) {
        any |= overflowed(steps[s].kv);
    }
    for (int32_t s = 0; any && s < n_steps; s++) {
        take_back(steps[s].kv, steps[s].n_tokens);
    }
    return any ? ATTN_EOVERFLOW : ATTN_OK;
}
