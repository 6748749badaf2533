/* engine/kv.c: the paged KV store. A pool is one aligned arena of fixed-size blocks with a stack
 * of free ids; a cache is a block table. A sliding layer's cache is a ring: the blocks no later
 * query can see go back to the pool and serve again, so it holds about its window whatever its
 * length. Writing rows and reading them for attention go through the addressing helpers here, so
 * the layout is defined in one place. */
#include "attn_int.h"

#include <stdlib.h>
#include <string.h>

int attn_kv_pool_create(const attn_model *m, size_t budget_bytes, int32_t block_tokens,
                        attn_kv_pool **out) {
    return attn_kv_pool_create_ex(m, budget_bytes, block_tokens, ATTN_DTYPE_AUTO, false, out);
}

int attn_kv_pool_create_typed(const attn_model *m, size_t budget_bytes, int32_t block_tokens,
                              attn_dtype dtype, attn_kv_pool **out) {
    return attn_kv_pool_create_ex(m, budget_bytes, block_tokens, dtype, false, out);
}

/* A pool's shape for m: what attn_kv_pool_create_ex checks and derives, in *g. */
static int pool_geometry(const attn_model *m, int32_t block_tokens, attn_dtype dtype,
                         bool keeps_queries, attn_kv_pool *g) {
    if (m == NULL || block_tokens < 0 || (block_tokens != 0 && block_tokens < 16) ||
        block_tokens > 256 || dtype < ATTN_DTYPE_AUTO || dtype > ATTN_DTYPE_Q8_0) {
        return ATTN_EINVAL;
    }
    if (dtype == ATTN_DTYPE_AUTO) {
        dtype = m->weights_dtype; /* vLLM's rule: the cache holds what the model computes in */
    }
    if (block_tokens == 0) {
        block_tokens = 128; /* decode measured ~8% faster than with 64 (llama8b, L = 8192) */
    }
    const attn_config *c = &m->cfg;
    bool is_latent = c->kv_lora_rank > 0;
    g->model = m;
    g->n_kv_heads = c->n_kv_heads;
    g->head_dim = c->head_dim;
    g->k_dim = is_latent ? c->kv_lora_rank + c->qk_rope_head_dim : c->head_dim;
    g->v_dim = is_latent ? c->kv_lora_rank : c->head_dim;
    g->v_in_k = is_latent;
    if (is_latent && dtype == ATTN_DTYPE_Q8_0 && g->v_dim % ATTN__QK8_0 != 0) {
        return ATTN_EUNSUPPORTED; /* the value, a row's leading v_dim values, must be whole blocks
                                   */
    }
    g->block_tokens = block_tokens;
    g->max_seq = c->max_seq;
    g->dtype = dtype;
    g->k_row_bytes = attn__kv_row_bytes(dtype, g->k_dim);
    g->v_row_bytes = is_latent ? g->k_row_bytes : attn__kv_row_bytes(dtype, g->v_dim);
    size_t block_bytes =
        (size_t)c->n_kv_heads * block_tokens * (g->k_row_bytes + (is_latent ? 0 : g->v_row_bytes));
    if (keeps_queries && is_latent) {
        return ATTN_EUNSUPPORTED; /* its attention runs on absorbed queries, not a head's q */
    }
    g->keeps_queries = keeps_queries;
    g->n_heads = c->n_heads;
    g->q_offset = block_bytes;
    g->q_row_bytes = keeps_queries ? attn__kv_row_bytes(dtype, c->head_dim) : 0;
    block_bytes += (size_t)c->n_heads * block_tokens * g->q_row_bytes;
    g->block_bytes = (block_bytes + ATTN__ALIGN - 1) / ATTN__ALIGN * ATTN__ALIGN;
    for (int32_t l = 0; l < c->n_layers; l++) {
        /* a linear layer keeps one KV head's state in a block: a block too small for it made
         * a pool every request of that layer then failed on */
        if (attn_config_layer_is_linear(c, l)) {
            return g->block_bytes >= attn__kv_state_doubles(g) * sizeof(double) ? ATTN_OK
                                                                                : ATTN_EUNSUPPORTED;
        }
    }
    return ATTN_OK;
}

size_t attn_kv_block_bytes_for(const attn_model *m, int32_t block_tokens, attn_dtype dtype) {
    return attn_kv_block_bytes_ex(m, block_tokens, dtype, false);
}

size_t attn_kv_block_bytes_ex(const attn_model *m, int32_t block_tokens, attn_dtype dtype,
                              bool keeps_queries) {
    attn_kv_pool g;
    return pool_geometry(m, block_tokens, dtype, keeps_queries, &g) == ATTN_OK ? g.block_bytes : 0;
}

bool attn_kv_pool_keeps_queries(const attn_kv_pool *pool) {
    return pool->keeps_queries;
}

int attn_kv_pool_create_ex(const attn_model *m, size_t budget_bytes, int32_t block_tokens,
                           attn_dtype dtype, bool keeps_queries, attn_kv_pool **out) {
    attn_kv_pool g = {0};
    int rc = out == NULL ? ATTN_EINVAL : pool_geometry(m, block_tokens, dtype, keeps_queries, &g);
    if (rc != ATTN_OK) {
        return rc;
    }
    size_t block_bytes = g.block_bytes;
    size_t n_blocks = budget_bytes / block_bytes;
    if (n_blocks < 1) {
        return ATTN_EINVAL;
    }
    if (n_blocks > INT32_MAX / 2) {
        n_blocks = INT32_MAX / 2;
    }
    attn_kv_pool *pool = calloc(1, sizeof *pool);
    if (pool == NULL) {
        return ATTN_ENOMEM;
    }
    *pool = g;
    pool->n_blocks = (int32_t)n_blocks;
    pool->n_free = pool->n_blocks;
    /* A large aligned allocation is mapped lazily, so the budget costs nothing until used. */
    pool->mem = (uint8_t *)attn__alloc_floats(n_blocks * block_bytes / sizeof(float));
    pool->free_stack = malloc(n_blocks * sizeof *pool->free_stack);
    if (pool->mem == NULL || pool->free_stack == NULL) {
        attn_kv_pool_destroy(pool);
        return ATTN_ENOMEM;
    }
    /* Block 0 on top: low addresses are handed out first. */
    for (int32_t i = 0; i < pool->n_blocks; i++) {
        pool->free_stack[i] = pool->n_blocks - 1 - i;
    }
    *out = pool;
    return ATTN_OK;
}

void attn_kv_pool_destroy(attn_kv_pool *pool) {
    if (pool == NULL) {
        return;
    }
    free(pool->mem);
    free(pool->free_stack);
    free(pool);
}

size_t attn_kv_pool_block_bytes(const attn_kv_pool *pool) {
    return pool->block_bytes;
}

attn_dtype attn_kv_pool_dtype(const attn_kv_pool *pool) {
    return pool->dtype;
}

int32_t attn_kv_pool_block_tokens(const attn_kv_pool *pool) {
    return pool->block_tokens;
}

int32_t attn_kv_pool_blocks_total(const attn_kv_pool *pool) {
    return pool->n_blocks;
}

int32_t attn_kv_pool_blocks_free(const attn_kv_pool *pool) {
    return pool->n_free;
}

size_t attn_kv_pool_bytes_used(const attn_kv_pool *pool) {
    return (size_t)(pool->n_blocks - pool->n_free) * attn_kv_pool_block_bytes(pool);
}

size_t attn_kv_pool_bytes_limit(const attn_kv_pool *pool) {
    return (size_t)pool->n_blocks * attn_kv_pool_block_bytes(pool);
}

static int32_t state_blocks(const attn_kv_pool *pool);

int attn_kv_create(attn_kv_pool *pool, attn_kv **out) {
    if (pool == NULL || out == NULL) {
        return ATTN_EINVAL;
    }
    attn_kv *kv = calloc(1, sizeof *kv);
    if (kv == NULL) {
        return ATTN_ENOMEM;
    }
    kv->pool = pool;
    kv->call_start = -1;
    kv->max_blocks = (pool->max_seq + pool->block_tokens - 1) / pool->block_tokens;
    if (attn__kv_states_per_block(pool) >= 1 && kv->max_blocks < state_blocks(pool)) {
        kv->max_blocks = state_blocks(pool); /* a linear layer's state may need more */
    }
    kv->blocks = malloc((size_t)kv->max_blocks * sizeof *kv->blocks);
    if (kv->blocks == NULL) {
        free(kv);
        return ATTN_ENOMEM;
    }
    pool->n_caches++;
    *out = kv;
    return ATTN_OK;
}

size_t attn__kv_state_doubles(const attn_kv_pool *pool) {
    return (size_t)pool->head_dim * pool->head_dim + (size_t)pool->head_dim;
}

int32_t attn__kv_states_per_block(const attn_kv_pool *pool) {
    return (int32_t)(pool->block_bytes / (attn__kv_state_doubles(pool) * sizeof(double)));
}

/* Blocks a linear-attention cache holds once it has seen a token. */
static int32_t state_blocks(const attn_kv_pool *pool) {
    int32_t per = attn__kv_states_per_block(pool);
    return (pool->n_kv_heads + per - 1) / per;
}

double *attn__kv_state(const attn_kv *kv, int32_t g) {
    const attn_kv_pool *pool = kv->pool;
    int32_t per = attn__kv_states_per_block(pool);
    double *block = (double *)(pool->mem + (size_t)kv->blocks[g / per] * pool->block_bytes);
    return block + (size_t)(g % per) * attn__kv_state_doubles(pool);
}

int attn_kv_create_for_layer(attn_kv_pool *pool, int32_t layer, attn_kv **out) {
    if (pool == NULL || out == NULL) {
        return ATTN_EINVAL;
    }
    const attn_config *c = &pool->model->cfg;
    if (layer < 0 || layer >= c->n_layers) {
        return ATTN_EINVAL;
    }
    bool is_linear = attn_config_layer_is_linear(c, layer);
    if (is_linear && attn__kv_states_per_block(pool) < 1) {
        return ATTN_EINVAL; /* one KV head's state must fit in a block */
    }
    int rc = attn_kv_create(pool, out);
    if (rc == ATTN_OK && attn_config_layer_is_sliding(c, layer)) {
        (*out)->window = c->sliding_window;
    }
    if (rc == ATTN_OK) {
        (*out)->is_state = is_linear;
        (*out)->has_queries = pool->keeps_queries && !is_linear;
    }
    return rc;
}

/* Blocks entirely below the first key a query at index len or later can see: a ring may drop
 * them. */
static int32_t dead_blocks(const attn_kv *kv, int32_t len) {
    if (kv->window <= 0 || len - kv->window + 1 <= 0) {
        return 0;
    }
    int32_t dead = (len - kv->window + 1) / kv->pool->block_tokens;
    return dead < kv->n_blocks ? dead : kv->n_blocks;
}

/* Gives back the ring's blocks that no query at index upto (<= len) or later can see. */
static void drop_dead_to(attn_kv *kv, int32_t upto) {
    attn_kv_pool *pool = kv->pool;
    int32_t dead = dead_blocks(kv, upto);
    for (; kv->n_dropped < dead; kv->n_dropped++) {
        pool->free_stack[pool->n_free++] = kv->blocks[kv->n_dropped];
        kv->blocks[kv->n_dropped] = -1;
    }
}

/* Gives the ring's dead blocks back to the pool. */
static void drop_dead(attn_kv *kv) {
    drop_dead_to(kv, kv->len);
}

/* Gives back the blocks past the first `keep` (dropped ones have none to give). */
static void release_blocks(attn_kv *kv, int32_t keep) {
    attn_kv_pool *pool = kv->pool;
    while (kv->n_blocks > keep) {
        int32_t id = kv->blocks[--kv->n_blocks];
        if (id >= 0) {
            pool->free_stack[pool->n_free++] = id;
        }
    }
    if (kv->n_dropped > kv->n_blocks) {
        kv->n_dropped = kv->n_blocks;
    }
}

void attn_kv_destroy(attn_kv *kv) {
    if (kv == NULL) {
        return;
    }
    release_blocks(kv, 0);
    kv->pool->n_caches--;
    free(kv->blocks);
    free(kv);
}

int32_t attn_kv_len(const attn_kv *kv) {
    return kv->len;
}

int32_t attn_kv_first_held(const attn_kv *kv) {
    if (kv->is_state) {
        return kv->len; /* a state, no token's K/V */
    }
    int32_t first = kv->n_dropped * kv->pool->block_tokens;
    return first < kv->len ? first : kv->len;
}

int32_t attn_kv_window(const attn_kv *kv) {
    return kv->window;
}

bool attn_kv_is_state(const attn_kv *kv) {
    return kv->is_state;
}

size_t attn_kv_bytes(const attn_kv *kv) {
    return (size_t)(kv->n_blocks - kv->n_dropped) * attn_kv_pool_block_bytes(kv->pool);
}

int32_t attn_kv_blocks_needed(const attn_kv *kv, int32_t n_new) {
    if (n_new <= 0) {
        return 0;
    }
    if (kv->is_state) {
        return kv->n_blocks == 0 ? state_blocks(kv->pool) : 0;
    }
    int64_t want = ((int64_t)kv->len + n_new + kv->pool->block_tokens - 1) / kv->pool->block_tokens;
    int64_t droppable = dead_blocks(kv, kv->len) - kv->n_dropped;
    int64_t need = want - kv->n_blocks - (droppable > 0 ? droppable : 0);
    return need > 0 ? (int32_t)need : 0;
}

int32_t attn_kv_truncate_min(const attn_kv *kv) {
    if (kv->is_state) {
        return kv->len; /* a state cannot forget: its length, or 0 */
    }
    /* The next query, at index n_tokens, sees keys from n_tokens - window + 1 on. */
    return kv->n_dropped > 0 ? kv->n_dropped * kv->pool->block_tokens + kv->window - 1 : 0;
}

int attn_kv_truncate(attn_kv *kv, int32_t n_tokens) {
    if (kv == NULL) {
        return ATTN_EINVAL;
    }
    if (n_tokens < 0 || n_tokens > kv->len) {
        return ATTN_ERANGE;
    }
    if (n_tokens > 0 && n_tokens < attn_kv_truncate_min(kv)) {
        return ATTN_EDROPPED;
    }
    kv->len = n_tokens;
    if (kv->is_state) {
        release_blocks(kv, n_tokens > 0 ? kv->n_blocks : 0); /* 0 starts over */
        return ATTN_OK;
    }
    release_blocks(kv, (n_tokens + kv->pool->block_tokens - 1) / kv->pool->block_tokens);
    /* Between calls a ring keeps the window of the last call's start, or of its newest
     * block_tokens tokens for a longer call: going back into them stays possible. */
    int32_t upto = n_tokens;
    if (kv->call_start >= 0) {
        int32_t back = n_tokens - kv->pool->block_tokens;
        upto = kv->call_start > back ? kv->call_start : back;
        upto = upto < n_tokens ? upto : n_tokens;
    }
    drop_dead_to(kv, upto);
    return ATTN_OK;
}

int attn_kv_fork(const attn_kv *src, attn_kv **out) {
    if (src == NULL || out == NULL) {
        return ATTN_EINVAL;
    }
    attn_kv_pool *pool = src->pool;
    if (pool->n_free < src->n_blocks - src->n_dropped) {
        return ATTN_ENOSPC;
    }
    attn_kv *kv = NULL;
    int rc = attn_kv_create(pool, &kv);
    if (rc != ATTN_OK) {
        return rc;
    }
    kv->window = src->window;
    kv->call_start = src->call_start;
    kv->is_state = src->is_state;
    kv->has_queries = src->has_queries;
    kv->len = src->len;
    for (int32_t b = 0; b < src->n_blocks; b++) {
        if (src->blocks[b] < 0) {
            kv->blocks[kv->n_blocks++] = -1;
            kv->n_dropped++;
            continue;
        }
        int32_t id = pool->free_stack[--pool->n_free];
        kv->blocks[kv->n_blocks++] = id;
        memcpy(pool->mem + (size_t)id * pool->block_bytes,
               pool->mem + (size_t)src->blocks[b] * pool->block_bytes, pool->block_bytes);
    }
    *out = kv;
    return ATTN_OK;
}

/* Takes blocks until the cache can hold n_tokens; the caller checked they are free. Only when
 * it takes some (so the caller owns the pool's accounting) does a ring drop its dead blocks
 * first, which then serve again. */
static void take_blocks(attn_kv *kv, int32_t n_tokens) {
    attn_kv_pool *pool = kv->pool;
    if (kv->is_state) {
        /* All of the state at once, starting from zero. */
        while (n_tokens > 0 && kv->n_blocks < state_blocks(pool)) {
            int32_t id = pool->free_stack[--pool->n_free];
            kv->blocks[kv->n_blocks++] = id;
            memset(pool->mem + (size_t)id * pool->block_bytes, 0, pool->block_bytes);
        }
        return;
    }
    int32_t want = (n_tokens + pool->block_tokens - 1) / pool->block_tokens;
    if (kv->n_blocks < want) {
        drop_dead(kv);
    }
    while (kv->n_blocks < want) {
        kv->blocks[kv->n_blocks++] = pool->free_stack[--pool->n_free];
    }
}

int attn_kv_reserve(attn_kv *kv, int32_t n_new) {
    if (kv == NULL || n_new < 0) {
        return ATTN_EINVAL;
    }
    if ((int64_t)kv->len + n_new > kv->pool->max_seq) {
        return ATTN_ERANGE;
    }
    if (attn_kv_blocks_needed(kv, n_new) > kv->pool->n_free) {
        return ATTN_ENOSPC;
    }
    drop_dead(kv);
    take_blocks(kv, kv->len + n_new);
    kv->call_start = kv->len;
    return ATTN_OK;
}

void attn__kv_adopt(attn_kv *kv, int32_t n_dropped, int32_t n_blocks, int32_t len) {
    attn_kv_pool *pool = kv->pool;
    for (int32_t b = 0; b < n_blocks; b++) {
        kv->blocks[b] = b < n_dropped ? -1 : pool->free_stack[--pool->n_free];
    }
    kv->n_blocks = n_blocks;
    kv->n_dropped = n_dropped;
    kv->len = len;
    kv->call_start = -1;
}

bool attn__kv_take_back(attn_kv *kv, int32_t len) {
    if (kv->is_state || len < 0 || len > kv->len) {
        return false;
    }
    if (kv->n_dropped > 0 && len < attn_kv_truncate_min(kv)) {
        return false;
    }
    kv->len = len;
    return true;
}

void attn__kv_grow(attn_kv *kv, int32_t n_new) {
    take_blocks(kv, kv->len + n_new); /* a no-op for reserved blocks: the pool is not touched */
    kv->len += n_new;
}

/* Within a block: K (n_kv_heads, block_tokens, k_row_bytes), then V (n_kv_heads, block_tokens,
 * v_row_bytes), or for a latent cache K alone, whose rows begin with the value. */
uint8_t *attn__kv_row_bytes_k(const attn_kv *kv, int32_t h, int32_t idx) {
    const attn_kv_pool *pool = kv->pool;
    int32_t b = idx / pool->block_tokens, off = idx % pool->block_tokens;
    return pool->mem + (size_t)kv->blocks[b] * pool->block_bytes +
           ((size_t)h * pool->block_tokens + off) * pool->k_row_bytes;
}

uint8_t *attn__kv_row_bytes_v(const attn_kv *kv, int32_t h, int32_t idx) {
    const attn_kv_pool *pool = kv->pool;
    if (pool->v_in_k) {
        return attn__kv_row_bytes_k(kv, h, idx);
    }
    int32_t b = idx / pool->block_tokens, off = idx % pool->block_tokens;
    return pool->mem + (size_t)kv->blocks[b] * pool->block_bytes +
           (size_t)pool->n_kv_heads * pool->block_tokens * pool->k_row_bytes +
           ((size_t)h * pool->block_tokens + off) * pool->v_row_bytes;
}

uint8_t *attn__kv_row_bytes_q(const attn_kv *kv, int32_t h, int32_t idx) {
    const attn_kv_pool *pool = kv->pool;
    int32_t b = idx / pool->block_tokens, off = idx % pool->block_tokens;
    return pool->mem + (size_t)kv->blocks[b] * pool->block_bytes + pool->q_offset +
           ((size_t)h * pool->block_tokens + off) * pool->q_row_bytes;
}

static void note_overflow(attn_kv *kv, bool overflows) {
    if (overflows) {
        __atomic_store_n(&kv->overflowed, 1, __ATOMIC_RELAXED);
    }
}

void attn__kv_put_q(attn_kv *kv, int32_t h, int32_t idx, const float *src) {
    if (kv->has_queries) {
        note_overflow(kv, attn__kv_encode(kv->pool->dtype, src, kv->pool->head_dim,
                                          attn__kv_row_bytes_q(kv, h, idx)));
    }
}

void attn__kv_put_k(attn_kv *kv, int32_t h, int32_t idx, const float *src) {
    note_overflow(kv, attn__kv_encode(kv->pool->dtype, src, kv->pool->k_dim,
                                      attn__kv_row_bytes_k(kv, h, idx)));
}

void attn__kv_put_v(attn_kv *kv, int32_t h, int32_t idx, const float *src) {
    note_overflow(kv, attn__kv_encode(kv->pool->dtype, src, kv->pool->v_dim,
                                      attn__kv_row_bytes_v(kv, h, idx)));
}

struct attn__kv_view attn__kv_view_of(const attn_kv *kv, int32_t h, int32_t n_keys) {
    const attn_kv_pool *pool = kv->pool;
    struct attn__kv_view v;
    v.k_base = pool->mem + (size_t)h * pool->block_tokens * pool->k_row_bytes;
    v.v_base = pool->v_in_k
                   ? v.k_base
                   : pool->mem + (size_t)pool->n_kv_heads * pool->block_tokens * pool->k_row_bytes +
                         (size_t)h * pool->block_tokens * pool->v_row_bytes;
    v.block_ids = kv->blocks;
    v.k_block_stride = pool->block_bytes;
    v.v_block_stride = pool->block_bytes;
    v.k_row_bytes = pool->k_row_bytes;
    v.v_row_bytes = pool->v_row_bytes;
    v.dtype = pool->dtype;
    v.block_tokens = pool->block_tokens;
    v.n_keys = n_keys;
    return v;
}

int attn_kv_read(const attn_kv *kv, int32_t first, int32_t count, float *k, float *v) {
    if (kv == NULL || k == NULL || v == NULL) {
        return ATTN_EINVAL;
    }
    if (first < 0 || count < 0 || first > kv->len - count) {
        return ATTN_ERANGE;
    }
    if (count > 0 && first < attn_kv_first_held(kv)) {
        return ATTN_EDROPPED;
    }
    const attn_kv_pool *pool = kv->pool;
    size_t kd = (size_t)pool->k_dim, vd = (size_t)pool->v_dim;
    for (int32_t h = 0; h < pool->n_kv_heads; h++) {
        for (int32_t t = 0; t < count; t++) {
            attn__kv_widen_portable(pool->dtype, attn__kv_row_bytes_k(kv, h, first + t), 0, 1,
                                    (int32_t)kd, k + ((size_t)h * count + t) * kd, 0);
            attn__kv_widen_portable(pool->dtype, attn__kv_row_bytes_v(kv, h, first + t), 0, 1,
                                    (int32_t)vd, v + ((size_t)h * count + t) * vd, 0);
        }
    }
    return ATTN_OK;
}
