/* engine/attn_int.h: internals shared by the engine's files (and by white-box tests).
 * Not part of the public API: server/ must include only attn.h. */
#ifndef ENGINE_ATTN_INT_H
#define ENGINE_ATTN_INT_H

#include "attn.h"

/* Query tokens per attention task in the tiled path: with a GQA group of r heads a task holds
 * r * ATTN__Q_TILE rows, enough for efficient GEMMs while its score tile stays in L2. */
#define ATTN__Q_TILE 64

/* Below this many query rows a task's inner products take the dot-product kernels
 * (attn__small_qk_kv/pv_kv: no packing, each key read once); from it on, the register-blocked tile
 * kernels, or cblas_sgemm on CPUs without AVX2/FMA. */
#define ATTN__BLAS_MIN_ROWS 16

/* Alignment of every buffer the engine allocates (one cache line, and AVX-512 friendly). */
#define ATTN__ALIGN 64

/* One layer's weights, immutable after load. */
struct attn__layer {
    float *w_qkv; /* (n_qkv, hidden_size): rows of Wq, then Wk, then Wv; n_qkv = (H + 2 Hkv) hd;
                     NULL when the model holds them in half precision (w_qkv_h) */
    uint16_t *w_qkv_h;  /* the same in attn_model.weights_dtype (BF16 or F16), else NULL */
    uint16_t *w_o_h;    /* w_o likewise (w_o NULL then) */
    float *b_qkv;       /* (n_qkv) or NULL */
    float *w_o;         /* (hidden_size, n_heads * head_dim) */
    float *b_o;         /* (hidden_size) or NULL */
    float *q_norm;      /* NULL, or (attn__qk_norm_len(cfg, false)) */
    float *k_norm;      /* NULL, or (attn__qk_norm_len(cfg, true)) */
    float *q_norm_bias; /* NULL, or (head_dim) with ATTN_QK_NORM_HEAD_LAYERNORM_BIAS */
    float *k_norm_bias; /* likewise */
    float *sinks;       /* NULL, or (n_heads): each query head's sink logit */
    /* Multi-head latent attention (attn_config.kv_lora_rank > 0; w_qkv is then NULL): */
    float *w_q;       /* (n_heads * head_dim, hidden) when q_lora_rank is 0, else NULL */
    float *b_q;       /* its bias, or NULL */
    float *w_qa;      /* (q_lora_rank, hidden) when q_lora_rank > 0 */
    float *b_qa;      /* (q_lora_rank) or NULL */
    float *q_a_norm;  /* (q_lora_rank) */
    float *w_qb;      /* (n_heads * head_dim, q_lora_rank) */
    float *w_kva;     /* (kv_lora_rank + qk_rope_head_dim, hidden) */
    float *b_kva;     /* or NULL */
    float *kv_a_norm; /* (kv_lora_rank) */
    float *w_kvb;     /* (n_heads * (qk_nope_head_dim + v_head_dim), kv_lora_rank): head h's
                         W_UK_h rows, then its W_UV_h rows */
};

/* Immutable after create. */
struct attn_model {
    attn_config cfg;
    char family[80]; /* attn_model_family */
    int32_t layer_first;
    int32_t layer_count;
    struct attn__layer *layers; /* (layer_count) */
    float *rope_cos;            /* (max_seq, rotary_dim / 2): cos(pos * inv_freq[i]) */
    float *rope_sin;            /* (max_seq, rotary_dim / 2) */
    float *rope_cos_local;      /* NULL, or the same with rope_theta_local and no scaling */
    float *rope_sin_local;
    float *rope_cos_long; /* LongRoPE: the tables with long_factor; else NULL */
    float *rope_sin_long;
    size_t bytes;
    attn_dtype weights_dtype; /* F32, BF16 or F16: how w_qkv and w_o are held */
    bool has_weights;         /* false: geometry only (attn_model_create_geometry), no tensors */
    uint8_t fingerprint[ATTN_FINGERPRINT_BYTES]; /* attn__model_fingerprint_compute, once made */
    uint64_t config_digest; /* the fingerprint's digest of the attention config alone, likewise */
};

/* One thread at a time, together with all of its caches. */
struct attn_kv_pool {
    const attn_model *model;
    int32_t n_kv_heads;
    int32_t head_dim;
    /* A token's key and value row per KV head: head_dim each, or for multi-head latent attention
     * one latent row of k_dim = kv_lora_rank + qk_rope_head_dim whose first v_dim =
     * kv_lora_rank floats are also the value (v_in_k: no value rows of their own). */
    int32_t k_dim, v_dim;
    bool v_in_k;
    int32_t block_tokens;
    int32_t max_seq;
    attn_dtype dtype;   /* how each K and V row is held (never AUTO) */
    size_t k_row_bytes; /* attn__kv_row_bytes(dtype, k_dim), and for v_dim */
    size_t v_row_bytes;
    /* A pool that keeps queries (attn_kv_pool_create_ex) also holds each token's post-RoPE
     * query rows, n_heads of head_dim in its dtype, after the values: for attn_kv_attention. */
    bool keeps_queries;
    int32_t n_heads;
    size_t q_row_bytes; /* 0 unless keeps_queries */
    size_t q_offset;    /* where a block's query rows start */
    size_t block_bytes; /* n_kv_heads * block_tokens * (k_row_bytes + v_row_bytes, or k_row_bytes
                           if v_in_k), plus n_heads * block_tokens * q_row_bytes, rounded up to
                           ATTN__ALIGN */
    int32_t n_blocks;
    int32_t n_free;
    uint8_t *mem;        /* (n_blocks, block_bytes) */
    int32_t *free_stack; /* (n_blocks): ids of free blocks; the top is reused first (warm pages) */
    int32_t n_caches;
};

/* Owned by the pool's thread. */
struct attn_kv {
    attn_kv_pool *pool;
    int32_t len;        /* tokens appended (seen) */
    int32_t n_blocks;   /* blocks covering tokens [0, len) and reserved ones, dropped included */
    int32_t max_blocks; /* ceil(max_seq / block_tokens) */
    int32_t *blocks;    /* (max_blocks): block ids in token order; -1 for the dropped ones */
    /* A sliding layer's ring: 0 = every token is kept; else the layer's sliding_window, and the
     * first n_dropped blocks, whose tokens no later query can see, went back to the pool. */
    int32_t window;
    int32_t n_dropped;
    /* The length at the last attn_kv_reserve (-1: none yet). Until the next one, the ring keeps
     * what a query at max(call_start, len - block_tokens) can see, so that a truncate back into
     * that call's newest block_tokens tokens (a speculative step's rollback) always works. */
    int32_t call_start;
    /* A linear-attention layer's cache: no rows, but each KV head's running state (S, d_k x
     * d_v, then z, d_k, in double) in its blocks, heads_per_block to a block. */
    bool is_state;
    /* A layer's own cache (attn_kv_create_for_layer) in a pool that keeps queries: its tokens'
     * query rows are stored beside their keys. Never a plain cache (a context). */
    bool has_queries;
    /* Set (atomically: a forward's tasks append in parallel) when a finite key, value or query
     * became infinite in the pool's dtype (f16 past 65504, a q8_0 block's scale past binary16's
     * range): the forward takes its tokens back and fails with ATTN_EOVERFLOW. */
    int overflowed;
};

/* Where a task's keys and values live: block b (of block_tokens keys each, the last possibly
 * partial) starts k_block_stride bytes times id(b) past k_base, with id(b) = block_ids ?
 * block_ids[b] : b, and holds key rows of d_k values, k_row_bytes apart, in dtype; value rows of
 * d_v values likewise, v_row_bytes apart (more than d_v values' bytes when the values are the
 * leading part of each key row: a latent cache). Float keys' rows are contiguous (k_row_bytes is
 * d_k floats). */
struct attn__kv_view {
    const uint8_t *k_base;
    const uint8_t *v_base;
    const int32_t *block_ids;
    size_t k_block_stride; /* bytes, as every stride here */
    size_t v_block_stride;
    size_t k_row_bytes;
    size_t v_row_bytes;
    attn_dtype dtype; /* F32, BF16, F16 or Q8_0 */
    int32_t block_tokens;
    int32_t n_keys; /* keys that exist; later ones are never read */
};

/* Which keys a query row may see. Row t of a task is the query at key index q_index0 + t. */
struct attn__mask {
    int32_t q_index0;
    bool is_causal;
    int32_t window_left;      /* -1 = none, else keys with qi - j > window_left are hidden */
    int32_t window_right;     /* -1 = none, else keys with j - qi > window_right are hidden */
    const uint8_t *key_valid; /* NULL or (n_keys) */
    /* NULL, or row t's own mask: pair_valid + t * pair_ld holds one byte per key (0 hides it);
     * pair_ld 0 gives every row the same one (key padding) */
    const uint8_t *pair_valid;
    size_t pair_ld;
};

/* One unit of attention work: the r query heads of one GQA group against one KV head, for n_q
 * consecutive queries. Rows are ordered (local head, query). Strides are in floats. */
struct attn__task {
    const float *q; /* row (h, t) at q + h * q_head_stride + t * q_ld, d_k floats */
    size_t q_head_stride, q_ld;
    float *out; /* row (h, t) at out + h * out_head_stride + t * out_ld, d_v floats */
    size_t out_head_stride, out_ld;
    float *w; /* NULL (tiled online-softmax path), or probabilities: row (h, t) at
                 w + h * w_head_stride + t * w_ld, w_cols floats (zero past n_keys) */
    size_t w_head_stride, w_ld;
    int32_t w_cols;
    int32_t n_group; /* query heads sharing this KV head */
    int32_t n_q;
    int32_t d_k, d_v;
    float scale;
    float softcap;      /* 0, or scores s become softcap * tanh(s / softcap) (after scale) */
    const float *sinks; /* NULL, or the n_group heads' sink logits: each joins its rows'
                           softmax denominator (attn_config.has_sinks) */
    struct attn__kv_view kv;
    struct attn__mask mask;
    float *scratch; /* attn__task_scratch_floats(...) floats */
    /* Split-K: a part of the keys only, blocks [block_lo, block_hi] of the view (the tiled path,
     * w NULL); the task then leaves its unnormalized output, running max and sum in its scratch
     * for attn__tasks_merge, and writes nothing to out. */
    bool is_partial;
    int32_t block_lo, block_hi;
    /* NULL, or where each row's log-sum-exp goes (attn_inspect's LSE): row (h, t) at
     * lse + h * lse_head_stride + t * lse_ld; written by the run, or by attn__tasks_merge. */
    float *lse;
    size_t lse_head_stride, lse_ld;
    /* NULL, or the selection attn__tasks_inspect reads for this task's rows: row r is query head
     * head0 + r / n_q and token token0 + r % n_q of the inspection's axes. */
    const attn_inspect *inspect;
    int32_t head0, token0;
    int32_t inspect_rows; /* rows of the inspection's output (its R) */
};

/* The selections of tasks that ran (and merged): for each task with an inspection, the selected
 * heads and rows it holds get their scores or probabilities over the selected keys (read back
 * from its view, through its mask) or their LSE. On ex when given and nothing is reduced across
 * heads (tasks then write disjoint cells); else in order on the calling thread. */
void attn__tasks_inspect(const attn_executor *ex, const struct attn__task *tasks, int32_t n);

/* ---- inspect.c: the selection's checks and its output's bookkeeping ------------------------ */

/* ATTN_OK when ins fits a call of n_heads query heads, n_tokens rows and n_keys keys (heads and
 * rows ascending and in range, the key range inside [0, n_keys)). */
int attn__inspect_check(const attn_inspect *ins, int32_t n_heads, int32_t n_tokens, int32_t n_keys);
/* Sets every cell of ins->out to its starting value (what a masked key reads as; the reduction's
 * identity), before any task writes. */
void attn__inspect_begin(const attn_inspect *ins, int32_t n_heads, int32_t n_tokens);
/* Finishes a mean over heads. */
void attn__inspect_end(const attn_inspect *ins, int32_t n_heads, int32_t n_tokens);
/* Index of head h (or token row t) in the selection, -1 when not selected; n_all when the
 * selection is every one. */
int32_t attn__inspect_find(const int32_t *sel, int32_t n_sel, int32_t x);
/* Writes (or reduces into) the cell of selected head hs, selected row rs and key column kk. */
void attn__inspect_put(const attn_inspect *ins, int32_t n_rows, int32_t hs, int32_t rs, int32_t kk,
                       float value);

/* Floats of scratch one task with these dimensions needs. */
size_t attn__task_scratch_floats(int32_t n_rows, int32_t d_k, int32_t d_v, int32_t block_tokens);

/* ---- linear.c: linear attention for attn_sdpa (p checked by it) ---------------------------- */

size_t attn__linear_scratch_bytes(const attn_sdpa_params *p);
int attn__linear_sdpa(const attn_sdpa_params *p, void *scratch);

/* ---- forward.c's workspace, shared with mla.c ----------------------------------------------- */

/* A contiguous run of one step's tokens inside a chunk. */
struct chunk_part {
    int32_t step;
    int32_t first; /* first token of the step in this part */
    int32_t n;     /* tokens in this part */
    int32_t row;   /* row of the part's first token in the chunk buffers */
};

/* Tasks [first, first + n) of a chunk are one task's key range split n ways (split-K). */
struct attn__split {
    int32_t first, n;
};

/* One thread at a time. Every buffer is sized for max_tokens new tokens in one chunk. */
struct attn_workspace {
    const attn_model *model;
    int32_t max_tokens;
    attn_executor ex;
    bool has_ex;
    float *x;       /* (max_tokens, hidden): gathered inputs of a multi-step chunk */
    float *qkv;     /* (max_tokens, n_qkv): projected q | k | v per token (MLA: q alone) */
    float *attn;    /* (max_tokens, n_heads * head_dim, or MLA's n_heads * v_head_dim): the
                       attention output per token, the output projection's input */
    float *y;       /* (max_tokens, hidden): output projection of a multi-step chunk */
    float *scratch; /* the tasks' scratch: one row per query head and token */
    float *lse;     /* (max_tokens, n_heads): each row's log-sum-exp, for an inspection */
    struct attn__task *tasks;
    int32_t max_tasks;
    struct attn__split *splits; /* (max_tasks): the chunk's split-K groups, merged after */
    int32_t n_splits;
    struct chunk_part *parts; /* (max_tokens) */
    int32_t *group_ready;     /* (n_kv_heads): a pipelined chunk's groups projected (atomic) */
    /* Multi-head latent attention only (else NULL): */
    float *mla_qa;  /* (max_tokens, q_lora_rank): x W_qa, normalized */
    float *mla_ckv; /* (max_tokens, kv_lora_rank + qk_rope_head_dim): x W_kva, c normalized */
    float *mla_q;   /* (max_tokens, n_heads, kv_lora_rank + qk_rope_head_dim): absorbed queries */
    float *mla_lat; /* (max_tokens, n_heads, kv_lora_rank): attention over the latent */
    float *xpack;   /* half-precision weights only: a projection's input, packed (panel.c) */
    float *panels;  /* and for many tokens, widened weights per wide task (forward.c) */
};

/* y (n x out_dim) = x (n x in_dim) W^T (+ b) for W (out_dim x in_dim), on the workspace's
 * executor when it has one (forward.c). */
void attn__project(const attn_workspace *ws, const float *x, int32_t n, int32_t in_dim,
                   const float *w, const float *b, int32_t out_dim, float *y);

/* Binds task t (its n_group, n_q, d_k, d_v and kv set) to step st's part p: the weight rows of
 * heads h0.. for the part's tokens from q0 on (when the step asks for weights, total_keys
 * columns), its scratch out of ws (advancing *scratch_used), and the step's key mask; the
 * caller sets q_index0, is_causal and window_left (forward.c). */
void attn__task_bind(struct attn__task *t, attn_workspace *ws, const attn_step *st,
                     const struct chunk_part *p, int32_t h0, int32_t q0, int32_t total_keys,
                     size_t *scratch_used);

/* The highest position among a step's tokens, the first of which goes to cache index first,
 * or its rope_reach when that is higher (forward.c). */
int32_t attn__step_max_position(const attn_step *st, int32_t first);

/* ---- mla.c: a multi-head latent attention layer's chunk ------------------------------------- */

/* Query heads per MLA attention task: the latent is one KV head, so a query tile is split into
 * head groups to spread over the executor. */
#define ATTN__MLA_HEADS_PER_TASK 16

/* Projects a chunk's rows (x, rows x hidden), normalizes, rotates and appends each part's latent
 * rows to its step's cache, absorbs W_UK into the queries and builds the attention tasks into
 * ws->tasks; returns their count. */
int32_t attn__mla_begin(const attn_model *m, int32_t layer, attn_workspace *ws,
                        const attn_step *steps, const struct chunk_part *parts, int32_t n_parts,
                        const float *x, int32_t rows);

/* After the tasks: each head's value, W_UV_h times its attention over the latent, into
 * ws->attn. */
void attn__mla_end(const attn_model *m, int32_t layer, attn_workspace *ws, int32_t rows);

/* Runs one attention task (attend.c). Never allocates. */
void attn__task_run(const struct attn__task *t);

/* Runs tasks[0..n) on ex (NULL: the calling thread). */
/* Work (multiply-adds) below which parallel parts run on the calling thread. Both executors
 * (attn_bench's pool, the daemon's team) poll for a forward's next batch between its calls, so
 * a hand-off costs microseconds, not the tens a sleep-wake took when this was 1 << 20: at that
 * bound every part of the small preset's decode ran on one thread (attn_bench, three alternated
 * runs at 1 << 16: decode at L=512 0.069-0.078 -> 0.042-0.047 ms, at L=2048 0.097-0.113 ->
 * 0.083-0.093). 1 << 17 keeps those (the smallest of them, the output projection, is 1 << 18)
 * while a tiny model's calls (tests) stay on their thread. */
#define ATTN__PARALLEL_MIN_MACS ((int64_t)1 << 17)

void attn__tasks_run(const attn_executor *ex, const struct attn__task *tasks, int32_t n);

/* Combines the n partial tasks of one split (the same rows, disjoint key blocks, run) by their
 * log-sum-exp, adds the sinks, normalizes and writes the rows to out. */
void attn__tasks_merge(const struct attn__task *parts, int32_t n);

/* ---- simd.c: portable versions of the small kernels (used without AVX2/FMA) ---------------- */

/* s[i * lds + j] = dot(q + i * ldq, k + j * ldk) over d, for i < m, j < n. */
void attn__qk(const float *q, size_t ldq, int32_t m, const float *k, size_t ldk, int32_t n,
              int32_t d, float *s, size_t lds);

/* o[i * ldo + c] += sum_j p[i * ldp + j] * v[j * ldv + c], for i < m, c < d. */
void attn__pv(const float *p, size_t ldp, int32_t m, const float *v, size_t ldv, int32_t n,
              int32_t d, float *o, size_t ldo);

/* ---- tile.c: register-blocked prefill kernels (AVX2 + FMA) --------------------------------- */

/* True when this CPU runs the AVX2 + FMA tile kernels; otherwise callers use cblas_sgemm. */
bool attn__tile_is_fast(void);

/* True when this CPU also runs the AVX-512 (F, BW, DQ, VL) kernels (tile_kv512.c: decode
 * attention; tile_rows512.c: projections of 4 tokens or more), and they are allowed:
 * attn__tile_allow_wide(false) keeps the AVX2 ones, for tests and benchmarks that compare the
 * two (true: asked of the CPU again). Process-wide; set it before any work. */
bool attn__tile_is_wide(void);
void attn__tile_allow_wide(bool allow);

/* Floats of packing space attn__tile_qk needs for a key block of n_keys keys. */
size_t attn__tile_pack_floats(int32_t n_keys, int32_t d_k);

/* s (m x n, ld lds) = q (m x d, ld ldq) k^T with k (n x d) contiguous; pack holds
 * attn__tile_pack_floats(n, d) floats. Only when attn__tile_is_fast(). */
void attn__tile_qk(const float *q, size_t ldq, int32_t m, const float *k, int32_t n, int32_t d,
                   float *s, size_t lds, float *pack);

/* o (m x d, ld ldo) += p (m x n, ld ldp) v with v (n x d, rows ldv >= d floats apart). Only
 * when attn__tile_is_fast(). */
void attn__tile_pv(const float *p, size_t ldp, int32_t m, const float *v, size_t ldv, int32_t n,
                   int32_t d, float *o, size_t ldo);

/* ---- tile_kv.c: decode attention against K/V as held (AVX2 + FMA + F16C) ------------------ */

/* The rows a decode kernel's caller reads after the block it passes, which the kernel prefetches
 * into as it nears the block's end (rows NULL: none, or unknown). */
struct attn__kv_after {
    const uint8_t *rows;
    size_t row_bytes;
};

/* The products of a few query rows (decode), s = q k^T in dot-product form and o += p v, against
 * key or value rows held in a KV dtype (F32, BF16, F16, Q8_0), row_bytes apart: read as they
 * stream, widened in registers (AVX2 + F16C), else widened into widen (n x d floats) for simd.c's
 * portable loops. */
void attn__small_qk_kv(attn_dtype dt, const float *q, size_t ldq, int32_t m, const uint8_t *k,
                       size_t row_bytes, int32_t n, struct attn__kv_after after, int32_t d,
                       float *s, size_t lds, float *widen);
void attn__small_pv_kv(attn_dtype dt, const float *p, size_t ldp, int32_t m, const uint8_t *v,
                       size_t row_bytes, int32_t n, struct attn__kv_after after, int32_t d,
                       float *o, size_t ldo, float *widen);

/* tile_kv512.c: the same in AVX-512, for the head sizes (d a multiple of 32 up to 512) and KV
 * dtypes (BF16, F16, Q8_0) attn__kv512_covers, when attn__tile_is_wide(). The kernels exist
 * only in builds with the vector kernels (TILE_HAVE_AVX2). */
bool attn__kv512_covers(attn_dtype dt, int32_t d);
void attn__kv512_qk(attn_dtype dt, const float *q, size_t ldq, int32_t m, const uint8_t *k,
                    size_t row_bytes, int32_t n, struct attn__kv_after after, int32_t d, float *s,
                    size_t lds);
void attn__kv512_pv(attn_dtype dt, const float *p, size_t ldp, int32_t m, const uint8_t *v,
                    size_t row_bytes, int32_t n, struct attn__kv_after after, int32_t d, float *o,
                    size_t ldo);

/* dst row j (d floats, ld apart) = the n rows of d values at src (row_bytes apart) held as dt,
 * widened: AVX2 + F16C where available. */
void attn__kv_widen(attn_dtype dt, const uint8_t *src, size_t row_bytes, int32_t n, int32_t d,
                    float *dst, size_t ld);

/* ---- tile_rows.c: projections of a few tokens (AVX2 + FMA + F16C) ------------------------- */

/* y (m x n, ld ldy) = x (m x k) w^T for w (n x k), both row-major: the projection of a few
 * tokens, streaming each weight row from memory once. Only when attn__tile_is_fast(). */
void attn__rows_dot(const float *x, int32_t m, int32_t k, const float *w, int32_t n, float *y,
                    size_t ldy);

/* ---- panel.c, tile_panel.c: projection weights held in half precision, in panels ---------- */

/* A panel: this many weight rows, column by column of the input (panel.c says why and how). */
#define ATTN__PANEL_ROWS 32
/* The most input rows a kernel takes at once (attn__panel_block_rows). */
#define ATTN__PANEL_BLOCK_MAX 12

/* Values (uint16_t) the panels of a rows x cols matrix take: its rows rounded up to a panel. */
size_t attn__panel_values(int32_t rows, int32_t cols);
/* dst (attn__panel_values) = src (rows x cols, row-major, values of dt: BF16 or F16) in panels,
 * the last panel's missing rows zero. */
void attn__panel_pack(attn_dtype dt, const uint16_t *src, int32_t rows, int32_t cols,
                      uint16_t *dst);
/* dst (n_rows x cols, row-major) = rows [first, first + n_rows) of the panels of a matrix of
 * cols columns, bit for bit (a panel's rows at a time is the fast way). */
void attn__panel_unpack(attn_dtype dt, const uint16_t *panels, int32_t cols, int32_t first,
                        int32_t n_rows, uint16_t *dst);
/* Input rows per block of the kernels this CPU runs now (AVX-512, AVX2, portable): the
 * block_rows that attn__panel_pack_x and attn__panel_dot take, the same for both. */
int32_t attn__panel_block_rows(void);
/* xp (m x k floats) = x (m x k, row-major) in blocks of block_rows rows, each column by column:
 * for m == 1, x itself. */
void attn__panel_pack_x(int32_t block_rows, const float *x, int32_t m, int32_t k, float *xp);
/* y[i * ldy + r - r0] = x_i . w_r for i < m and weight rows r in [r0, r1): w the panels of a
 * matrix of k columns (dtype dt), xp the input packed by attn__panel_pack_x(block_rows). */
void attn__panel_dot(int32_t block_rows, attn_dtype dt, const float *xp, int32_t m, int32_t k,
                     const uint16_t *w, int32_t r0, int32_t r1, float *y, size_t ldy);
/* One block of mb <= block_rows input rows (xp at its first column) by one panel (w, kc
 * columns): c[i * ldc + j] = (add ? c[i * ldc + j] : 0) + sum_k xp[k * mb + i] w_k[j], j < 32.
 * attn__panel_tile runs the kernels block_rows names; the portable one is panel.c's. */
void attn__panel_tile(int32_t block_rows, bool is_bf16, int32_t mb, const float *xp,
                      const uint16_t *w, int32_t kc, float *c, size_t ldc, bool add);
/* Whether a product of many input rows (a prefill) should rather widen the panels and call
 * sgemm: where the kernels are AVX2's (on an Intel core with OpenBLAS's AVX2 kernels, prefill
 * S=512 took 83% of the sgemm peak through sgemm, 75% through the AVX2 panel kernel; AVX-512's
 * panel kernel beat sgemm there). */
bool attn__panel_prefers_sgemm(void);
/* b[c * ldb + r - r0] = w_r[c] for weight rows r in [r0, r1) and every column c < k: the panels
 * widened into the transposed (k x (r1 - r0)) float matrix that sgemm reads. */
void attn__panel_widen(attn_dtype dt, const uint16_t *w, int32_t k, int32_t r0, int32_t r1,
                       float *b, size_t ldb);
void attn__panel_widen_portable(attn_dtype dt, const uint16_t *w, int32_t k, int32_t r0, int32_t r1,
                                float *b, size_t ldb);
void attn__panel_tile_portable(bool is_bf16, int32_t mb, const float *xp, const uint16_t *w,
                               int32_t kc, float *c, size_t ldc, bool add);

/* ---- half.c: half-precision weights ------------------------------------------------------- */

/* Round to nearest even (NaN stays NaN, past binary16's range infinity), and back, exactly. */
uint16_t attn__f32_to_bf16(float f);
float attn__bf16_to_f32(uint16_t h);
uint16_t attn__f32_to_f16(float f);
float attn__f16_to_f32(uint16_t h);

/* half_rows.c: dst[i] = src[i] rounded to dt (ATTN_DTYPE_BF16 or ATTN_DTYPE_F16) for i < n, bit
 * for bit as the functions above (eight at a time where the CPU has AVX2). Returns whether any
 * result has every exponent bit set: an infinity or a NaN (past the range, or already so). */
bool attn__half_round(attn_dtype dt, const float *src, size_t n, uint16_t *dst);

/* tile_rows512.c: attn__rows_dot in AVX-512 for the batches it covers (m >= 4 input rows, when
 * attn__tile_is_wide()). attn__rows_dot512 exists only in builds with the vector kernels
 * (TILE_HAVE_AVX2). */
bool attn__rows512_covers(int32_t m);
void attn__rows_dot512(const float *x, int32_t m, int32_t k, const float *w, int32_t n, float *y,
                       size_t ldy);

/* Holds m's q/k/v and o projections in dtype (F32 is a no-op): converts each layer's not held
 * yet and frees its float copy before the next layer's, then counts m's bytes and dtype as
 * dtype's. ATTN_ENOMEM leaves m partly converted, fit only for attn_model_destroy. */
int attn__model_hold_weights(attn_model *m, attn_dtype dtype);

/* Layer i's q/k/v and o projections converted to dtype and their float copies freed (nothing
 * when dtype is F32, the layer is MLA's or held already), or back to float from the half dtype
 * they were held in (exact): how a loader holds each layer as soon as it is read, so that its
 * peak is the half weights and one layer in float. Neither counts m's bytes or dtype:
 * attn__model_hold_weights does, last. ATTN_ENOMEM as above. */
int attn__model_hold_layer(attn_model *m, int32_t i, attn_dtype dtype);
int attn__model_unhold_layer(attn_model *m, int32_t i, attn_dtype held);

/* The largest of s[0 .. n) (-inf for none; NaNs passed over). SIMD where available. */
float attn__row_max(const float *s, int32_t n);

/* s[j] = exp(s[j] - m) for j < n (-inf gives 0, NaN stays NaN); returns the sum. SIMD where
 * available. */
float attn__exp_shift(float *s, int32_t n, float m);

/* s[j] = cap tanh(s[j] / cap) for j < n (Gemma's score soft-cap), within a few ulp of tanhf.
 * SIMD where available. */
void attn__softcap(float *s, int32_t n, float cap);

/* ---- rope.c ------------------------------------------------------------------------------ */

/* The rotation of one call's tokens in one layer: a (max_seq, rotary_dim / 2) table pair, or,
 * for a dynamic NTK call past the original context, frequencies computed for that call. */
struct attn__rope_frame {
    const float *cos_table; /* NULL: compute from inv */
    const float *sin_table;
    int32_t half;                      /* rotary_dim / 2 */
    double inv[ATTN_MAX_ROPE_FACTORS]; /* when cos_table is NULL */
    float cos_row[ATTN_MAX_ROPE_FACTORS];
    float sin_row[ATTN_MAX_ROPE_FACTORS];
};

/* Fills cos/sin tables (max_seq, rotary_dim / 2) for cfg (checked), angles in double, times the
 * scaling's attention factor; long_factors picks LongRoPE's long list. */
void attn__rope_tables(const attn_config *cfg, bool long_factors, float *cos_table,
                       float *sin_table);

/* Sets up *f for a call whose highest position is max_pos, in a local (sliding) layer or not. */
void attn__rope_frame_init(const attn_model *m, bool is_local, int32_t max_pos,
                           struct attn__rope_frame *f);

/* Whether the rotation of a call depends on its highest position (longrope, dynamic). */
bool attn__rope_depends_on_call(const attn_config *cfg);

/* Rotates the first rotary_dim dims of the n_q heads at q and the n_k heads at k (head_dim
 * floats each, consecutive) by the angles of position pos in frame f. */
void attn__rope_apply(const attn_config *cfg, struct attn__rope_frame *f, float *q, int32_t n_q,
                      float *k, int32_t n_k, int32_t pos);

/* ---- kv.c -------------------------------------------------------------------------------- */

/* Grows kv by n_new tokens' blocks (the caller checked there are enough free) and sets its
 * length; the K/V rows are written afterwards with attn__kv_row_k / attn__kv_row_v. */
void attn__kv_grow(attn_kv *kv, int32_t n_new);

/* A failed forward's take-back: kv's length back to len, its blocks kept (reserved ones stay
 * reserved, for the thread that reserved them to give back: a forward never touches the pool's
 * free list when its blocks were reserved, see attn_kv_reserve). Returns false, changing
 * nothing, if the tokens len's next query would see are no longer held (a ring that dropped
 * blocks during the forward, which only an append without a reservation does). */
bool attn__kv_take_back(attn_kv *kv, int32_t len);

/* The running state of kv head g of a linear-attention cache (its blocks taken): S (d_k x d_v)
 * then z (d_k), in double. */
double *attn__kv_state(const attn_kv *kv, int32_t g);

/* Doubles of one KV head's linear-attention state, and how many fit in one of pool's blocks. */
size_t attn__kv_state_doubles(const attn_kv_pool *pool);
int32_t attn__kv_states_per_block(const attn_kv_pool *pool);

/* ---- linear.c: a linear-attention layer's tokens (forward.c) ------------------------------- */

/* Advances state (a cache of a linear layer, its blocks taken) by n tokens whose projected q, k
 * and v are rows of qkv (ld floats apart, q | k | v as the forward lays them), writing each
 * token's attention output, n_heads x head_dim, to out (out_ld floats apart). scratch holds
 * head_dim x 2 doubles. */
void attn__linear_advance(const attn_config *c, attn_kv *state, const float *qkv, size_t ld,
                          int32_t n, float *out, size_t out_ld, double *scratch);

/* The bytes of kv head h's key (value) row at cache index idx, in the pool's dtype; a latent
 * cache's value row is its key row. */
uint8_t *attn__kv_row_bytes_k(const attn_kv *kv, int32_t h, int32_t idx);
/* Query head h's row of token idx in a pool that keeps queries. */
uint8_t *attn__kv_row_bytes_q(const attn_kv *kv, int32_t h, int32_t idx);
/* Stores query head h's row of token idx (a pool that keeps queries; a no-op otherwise). */
void attn__kv_put_q(attn_kv *kv, int32_t h, int32_t idx, const float *src);
uint8_t *attn__kv_row_bytes_v(const attn_kv *kv, int32_t h, int32_t idx);

/* Gives an empty row cache n_blocks blocks (the first n_dropped dropped, the rest taken from the
 * pool, which the caller checked holds them) and length len; rows are written afterwards. */
void attn__kv_adopt(attn_kv *kv, int32_t n_dropped, int32_t n_blocks, int32_t len);

/* Writes kv head h's key (or value) row at cache index idx (taken by attn__kv_grow) from src,
 * k_dim (v_dim) floats, in the pool's dtype. A latent cache has key rows only. */
void attn__kv_put_k(attn_kv *kv, int32_t h, int32_t idx, const float *src);
void attn__kv_put_v(attn_kv *kv, int32_t h, int32_t idx, const float *src);

/* ---- kv_dtype.c: how a KV row is held in each dtype ----------------------------------------- */

/* Values per Q8_0 block, and its bytes: a binary16 scale, then QK8_0 int8. */
#define ATTN__QK8_0      32
#define ATTN__Q8_0_BYTES (2 + ATTN__QK8_0)

/* Bytes of one row of d values held as dt (F32, BF16, F16 or Q8_0). */
size_t attn__kv_row_bytes(attn_dtype dt, int32_t d);

/* dst (attn__kv_row_bytes(dt, d) bytes) = the d floats at src held as dt: BF16 and F16 round to
 * nearest even; Q8_0 scales each block by s, the smallest binary16 >= max|x| / 127, and rounds
 * x / s to the nearest integer, half away from zero. Unlike llama.cpp (s rounded to nearest,
 * quantized by the unrounded scale) every value read back is then within half a step of x; the
 * layout is the same. Returns true if a value is not finite, or could not be held: BF16 or F16
 * past its range (held as infinity), or a Q8_0 block whose s would pass binary16's (s is then
 * held as infinity, so that no value of the block reads back finite, and wrong). A cache never
 * keeps such a row: the forward that wrote it takes its tokens back (a key that overflowed
 * float in a projection or RoPE would poison every later answer of the session). */
bool attn__kv_encode(attn_dtype dt, const float *src, int32_t d, uint8_t *dst);

/* The portable attn__kv_widen. */
void attn__kv_widen_portable(attn_dtype dt, const uint8_t *src, size_t row_bytes, int32_t n,
                             int32_t d, float *dst, size_t ld);

/* The view of kv head h over the first n_keys tokens of kv. */
struct attn__kv_view attn__kv_view_of(const attn_kv *kv, int32_t h, int32_t n_keys);

/* ---- model.c ----------------------------------------------------------------------------- */

/* ---- qk_norm.c: clip_qkv and the q/k norms ---------------------------------------------------
 */

/* Values in the q (is_k false) or k norm weight of cfg's qk_norm; 0 for none. */
size_t attn__qk_norm_len(const attn_config *cfg, bool is_k);

/* What comes between the projections and RoPE, on one token's projected row in place: q
 * (n_heads * head_dim values at row), k (n_kv_heads * head_dim values at row + n_heads *
 * head_dim) and v (as many, after k). First cfg's clip_qkv clamps q, k and v, then cfg's qk_norm
 * normalizes q and k with layer l's weights. A no-op without either. */
void attn__qkv_finish_row(const attn_config *cfg, const struct attn__layer *l, float *row);

/* The same for query heads [q_first, q_first + n_q) and KV heads [k_first, k_first + n_k) (their
 * k and v) only, when attn__qk_norm_is_per_head (else the norm spans every head: callers pass
 * them all). */
void attn__qkv_finish_heads(const attn_config *cfg, const struct attn__layer *l, float *row,
                            int32_t q_first, int32_t n_q, int32_t k_first, int32_t n_k);

/* Whether cfg's qk_norm treats each head alone (OLMo 2's spans the whole projection). */
bool attn__qk_norm_is_per_head(const attn_config *cfg);

/* Sets m->fingerprint from its config and tensors as held (fingerprint.c): the last step of
 * every constructor. ATTN_ENOMEM: no room to read half-precision weights back in row order. */
int attn__model_fingerprint_compute(attn_model *m);

/* Allocates a model for cfg (checked, max_seq overridden by p) with the layer range of p and
 * uninitialized weights; computes the RoPE tables. Shared by every constructor. With defer_layers
 * the layers' tensors are left for attn__model_alloc_layer, which a loader calls for each layer
 * just before reading it (so that unread layers take no address space). */
int attn__model_alloc(const attn_config *cfg, const attn_load_params *p, bool defer_layers,
                      attn_model **out);
int attn__model_alloc_layer(attn_model *m, int32_t i);

/* ---- hf_load.c: the checkpoint readers, in memory ---------------------------------------- */
/* attn_model_load_hf reads files and hands their bytes to these; the fuzz targets in tests/fuzz
 * call them directly. Pure functions, any thread; a reason goes to err (NUL-terminated, cut to
 * err_size; err may be NULL) on failure only. */

/* Where a failure's reason goes: the caller's buffer (text NULL or size 0: nowhere). */
struct attn__reason {
    char *text;
    size_t size;
};

/* Writes the printf-formatted reason into why (cut to fit, NUL-terminated, made one line) and
 * returns rc. Reasons quote file contents (a model_type, a tensor name), which may hold any byte:
 * a caller logs a reason as one line. */
int attn__fail(const struct attn__reason *why, int rc, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* Replaces the control bytes of the NUL-terminated s (newlines included) with '?', in place. */
void attn__make_one_line(char *s);

/* How a family stores one layer's attention projections (hf_layer.c reads each). */
enum attn__hf_tensors {
    ATTN__HF_QKVO = 0,  /* q_proj, k_proj, v_proj, o_proj (Llama and most) */
    ATTN__HF_FUSED_QKV, /* qkv_proj rows q | k | v, then o_proj (Phi-3) */
    ATTN__HF_NEOX,      /* query_key_value rows head by head [q_h | k_h | v_h], dense (GPT-NeoX) */
    ATTN__HF_FALCON, /* query_key_value rows group by group [q_g.. | k_g | v_g], dense (Falcon) */
    ATTN__HF_GPT2,   /* Conv1D c_attn (in, q | k | v) and c_proj (in, out), transposed (GPT-2) */
    ATTN__HF_MLA,    /* DeepSeek: q_proj or q_a_proj / q_a_layernorm / q_b_proj, kv_a_proj_with_mqa,
                        kv_a_layernorm, kv_b_proj, o_proj */
    ATTN__HF_DENSE,  /* q_proj, k_proj, v_proj, dense as the output projection (Phi) */
};

/* How a family stores its q/k norm weights (when the config applies a norm). */
enum attn__hf_norms {
    ATTN__HF_NORM_VECTOR = 0,    /* q_norm.weight, k_norm.weight: one vector each (Qwen3, OLMo 2) */
    ATTN__HF_NORM_MATRIX,        /* q_norm.weight (n_heads, head_dim), k_norm.weight (Cohere) */
    ATTN__HF_NORM_PER_HEAD_LIST, /* q_layernorm.norms.<h>.weight, k_layernorm...: one per head
                                  * (StableLM 2) */
    ATTN__HF_NORM_LAYERNORM,     /* q_layernorm.weight and .bias, k_layernorm...: one nn.LayerNorm
                                  * each, for every head (Phi) */
};

/* What a checkpoint's family means for reading its tensors (hf_config.c fills it). */
struct attn__hf_layout {
    char family[80]; /* the model_type served, e.g. "qwen2", or "llama (trusted layout of x)" */
    /* attnd's own layout only: biases are whatever the checkpoint holds (q/k/v together, o
     * alone), and wants_qkv_bias (its attention_bias) insists on the q/k/v ones. Every other
     * family fixes has_qkv_bias / has_o_bias in the config from its own rule. */
    bool has_biases_from_tensors;
    bool wants_qkv_bias;
    bool is_norm_one_plus;   /* Gemma: the q/k norm weight applied is 1 + the tensor */
    const char *prefixes[3]; /* where the layers' tensors may sit, NULL-terminated (static) */
    enum attn__hf_tensors tensors;
    enum attn__hf_norms norms;
    const char *attn_name; /* a layer's attention module: <prefix>.<i>.<attn_name>.<tensor> */
};

/* Parses config.json text, json[0..len) (no NUL needed), by the rules of its model_type's family
 * (hf_config.c's table), into *cfg (which attn_config_check accepts, though its defaults are not
 * filled in yet; max_seq defaults to 4096) and *layout, both written on success only.
 * p (NULL: the defaults): p->trust_layout NULL, or "llama": an unknown model_type (or none) is
 * then read as Llama; p->modeling_code as attn_load_params says. Returns
 * ATTN_OK, ATTN_EIO (not a JSON object, a key repeated in an object, a field of the wrong type or
 * range, a required field missing), ATTN_EUNSUPPORTED (a family not served, a field that changes
 * attention in a way the engine does not compute, an unknown rope scaling), or what
 * attn__config_check_why returns for the config read (its reason in err), or ATTN_EINVAL
 * (another trust_layout or modeling_code). */
int attn__hf_config_parse(const char *json, size_t len, const attn_load_params *p, attn_config *cfg,
                          struct attn__hf_layout *layout, char *err, size_t err_size);

/* ---- hf_layer.c: one layer's attention tensors, by the family's layout ---------------------- */

/* Reads tensor `name` of shape (rows, cols) ((rows) when cols is 0) as float into dst; the
 * loader's files behind it. Returns ATTN_OK or a code with its reason recorded by the reader. */
struct attn__hf_reader {
    int (*read)(void *ctx, const char *name, int32_t rows, int32_t cols, float *dst);
    void *ctx;
};

/* True if the engine consumes the tensor <prefix>.<i>.<lay->attn_name>.<suffix> of a layer with
 * config c (projections, the biases c has, q/k norms c applies, buffers that restate what the
 * engine computes anyway); the loader refuses any other. */
bool attn__hf_tensor_is_consumed(const attn_config *c, const struct attn__hf_layout *lay,
                                 const char *suffix);

/* The name of the first tensor every layer of the layout holds (to find the prefix). */
const char *attn__hf_layout_first_tensor(const struct attn__hf_layout *lay);

/* Reads layer `layer`'s attention, as stored under prefix in lay's layout, into l (allocated by
 * attn__model_alloc for c): fused q|k|v rows and o in nn.Linear layout, biases and q/k norm
 * weights where c has them. */
int attn__hf_layer_read(const struct attn__hf_reader *rd, const attn_config *c,
                        const struct attn__hf_layout *lay, const char *prefix, int32_t layer,
                        struct attn__layer *l);

/* attn_config_check, and on failure *why (if not NULL) names the field and its rule in a static
 * sentence. */
int attn__config_check_why(attn_config *cfg, const char **why);

#define ATTN__ST_MAX_DIMS 8

/* One tensor of a safetensors header. */
struct attn__st_tensor {
    char *name;     /* owned by the header */
    char dtype[16]; /* as written ("F32", "BF16", "I8", ...); only the reader of a tensor checks it
                     */
    int32_t n_dims;
    uint64_t shape[ATTN__ST_MAX_DIMS]; /* (n_dims) */
    uint64_t begin, end;               /* byte range in the data section, begin <= end */
};

/* A parsed safetensors header. Immutable after parse. */
struct attn__st_header {
    uint64_t data_start;             /* file offset of the data section: 8 + the header's length */
    uint64_t data_bytes;             /* file size - data_start; every tensor's end is <= this */
    struct attn__st_tensor *tensors; /* (n_tensors), in the header's order, __metadata__ skipped */
    int32_t n_tensors;
};

/* Parses the start of a safetensors file: buf[0..len) holds its first 8 bytes (the header's
 * length n, little-endian) and at least the n bytes of JSON after them; file_size is the whole
 * file's size, which every tensor's byte range must fit in. Fills *out (release it with
 * attn__safetensors_header_release) on success. Returns ATTN_OK, ATTN_EIO (a bad length, a header
 * that is not a JSON object of well-formed entries, a range past the file) or ATTN_ENOMEM. */
int attn__safetensors_header_parse(const uint8_t *buf, size_t len, uint64_t file_size,
                                   struct attn__st_header *out, char *err, size_t err_size);
/* Frees what parse allocated; h may be NULL, and a released header may be released again. */
void attn__safetensors_header_release(struct attn__st_header *h);

/* The tensor called name (the first, if the header repeats it), or NULL. Borrowed from h. */
const struct attn__st_tensor *attn__safetensors_tensor_find(const struct attn__st_header *h,
                                                            const char *name);

/* ---- memory ------------------------------------------------------------------------------ */

/* Aligned, uninitialized allocations, NULL for 0 bytes, on overflow or on ENOMEM; free with
 * free(). Aligned to ATTN__ALIGN, and those of 4 MiB or more to a 2 MiB page and offered to the
 * kernel as huge pages (weights and KV pools are streamed end to end). */
void *attn__alloc_bytes(size_t n);
float *attn__alloc_floats(size_t n); /* n floats */

#endif /* ENGINE_ATTN_INT_H */
