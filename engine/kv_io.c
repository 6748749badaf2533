/* engine/kv_io.c: one cache as bytes, and back, for saving a session. The bytes hold tokens, not
 * blocks, so a pool of another block size reads them; each row as the pool holds it (the dtype
 * must match: no rounding happens on the way); all integers little-endian. Layout:
 *
 *   int32 x 8: kind (0 rows, 1 linear state, 2 rows with queries), dtype, n_kv_heads, k_dim,
 *              v_dim (0: the values are the leading part of each key row, a latent), window,
 *              len (tokens seen), first (first token held)
 *   rows:      for each KV head, the key rows of tokens [first, len), then for each KV head the
 *              value rows (none for a latent); k_row_bytes / v_row_bytes each; kind 2 then has
 *              for each query head its query rows of the same tokens (q_row_bytes each)
 *   state:     for each KV head, its state's doubles (S then z)
 */
#include "attn_int.h"

#include <math.h>
#include <string.h>

#define KV_IO_HEADER_INTS 8

enum { KV_IO_ROWS = 0, KV_IO_STATE = 1, KV_IO_ROWS_QUERIES = 2 };

static void put_i32(uint8_t *p, int32_t v) {
    uint32_t u = (uint32_t)v;
    for (int i = 0; i < 4; i++) {
        p[i] = (uint8_t)(u >> (8 * i));
    }
}

static int32_t get_i32(const uint8_t *p) {
    uint32_t u = 0;
    for (int i = 3; i >= 0; i--) {
        u = u << 8 | p[i];
    }
    return (int32_t)u;
}

static size_t payload_bytes(const attn_kv_pool *pool, bool is_state, bool has_queries,
                            int32_t n_tokens) {
    if (is_state) {
        return (size_t)pool->n_kv_heads * attn__kv_state_doubles(pool) * sizeof(double);
    }
    size_t row = pool->k_row_bytes + (pool->v_in_k ? 0 : pool->v_row_bytes);
    size_t q = has_queries ? (size_t)pool->n_heads * (size_t)n_tokens * pool->q_row_bytes : 0;
    return (size_t)pool->n_kv_heads * (size_t)n_tokens * row + q;
}

/* Copies the payload from the bytes at `in` into kv, or (in NULL) from kv to the bytes at `out`:
 * each KV head's state, or the key rows of tokens [first, len) head by head, then the value
 * rows. */
static void copy_payload(const attn_kv *kv, int32_t first, const uint8_t *in, uint8_t *out) {
    bool to_cache = in != NULL;
    size_t at = 0;
    const attn_kv_pool *pool = kv->pool;
    if (kv->is_state) {
        size_t bytes = attn__kv_state_doubles(pool) * sizeof(double);
        for (int32_t g = 0; kv->n_blocks > 0 && g < pool->n_kv_heads; g++, at += bytes) {
            double *state = attn__kv_state(kv, g);
            memcpy(to_cache ? (void *)state : out + at, to_cache ? in + at : (void *)state, bytes);
        }
        return;
    }
    for (int kind = 0; kind < 3; kind++) {
        if ((kind == 1 && pool->v_in_k) || (kind == 2 && !kv->has_queries)) {
            continue;
        }
        size_t rb = kind == 0   ? pool->k_row_bytes
                    : kind == 1 ? pool->v_row_bytes
                                : pool->q_row_bytes;
        int32_t heads = kind == 2 ? pool->n_heads : pool->n_kv_heads;
        for (int32_t g = 0; g < heads; g++) {
            /* a head's rows follow one another within a block: one copy per block, not per row
             * (a 2048-token llama8b layer: 256 copies instead of 32768; its restore's copy into
             * the pool 0.5 -> 0.35 ms) */
            for (int32_t t = first, run; t < kv->len; t += run) {
                run = pool->block_tokens - t % pool->block_tokens;
                run = run < kv->len - t ? run : kv->len - t;
                uint8_t *row = kind == 0   ? attn__kv_row_bytes_k(kv, g, t)
                               : kind == 1 ? attn__kv_row_bytes_v(kv, g, t)
                                           : attn__kv_row_bytes_q(kv, g, t);
                size_t bytes = (size_t)run * rb;
                memcpy(to_cache ? row : out + at, to_cache ? in + at : row, bytes);
                at += bytes;
            }
        }
    }
}

size_t attn_kv_export_bytes(const attn_kv *kv) {
    int32_t held = kv->len - attn_kv_first_held(kv);
    bool has_state = kv->is_state && kv->n_blocks > 0;
    return KV_IO_HEADER_INTS * 4 + (kv->is_state
                                        ? (has_state ? payload_bytes(kv->pool, true, false, 0) : 0)
                                        : payload_bytes(kv->pool, false, kv->has_queries, held));
}

int attn_kv_export(const attn_kv *kv, uint8_t *out, size_t size) {
    if (kv == NULL || out == NULL) {
        return ATTN_EINVAL;
    }
    if (size < attn_kv_export_bytes(kv)) {
        return ATTN_ERANGE;
    }
    const attn_kv_pool *pool = kv->pool;
    int32_t first = attn_kv_first_held(kv);
    int32_t header[KV_IO_HEADER_INTS] = {kv->is_state      ? KV_IO_STATE
                                         : kv->has_queries ? KV_IO_ROWS_QUERIES
                                                           : KV_IO_ROWS,
                                         (int32_t)pool->dtype,
                                         pool->n_kv_heads,
                                         pool->k_dim,
                                         pool->v_in_k ? 0 : pool->v_dim,
                                         kv->window,
                                         kv->len,
                                         first};
    for (int i = 0; i < KV_IO_HEADER_INTS; i++) {
        put_i32(out + 4 * i, header[i]);
    }
    copy_payload(kv, first, NULL, out + KV_IO_HEADER_INTS * 4);
    return ATTN_OK;
}

/* What import bytes describe, once checked against the pool (kv_io_check). */
struct kv_io_plan {
    bool is_state, has_state, has_queries;
    int32_t len, first;
    int32_t n_dropped, n_blocks; /* rows: blocks dropped before first, blocks covering [0, len) */
};

/* Checks the bytes' header and size against what pool holds for layer (see attn_kv_import's
 * codes), and plans the cache. */
static int kv_io_check(const attn_kv_pool *pool, int32_t layer, const uint8_t *data, size_t size,
                       struct kv_io_plan *plan) {
    if (pool == NULL || data == NULL) {
        return ATTN_EINVAL;
    }
    if (size < KV_IO_HEADER_INTS * 4) {
        return ATTN_EIO;
    }
    int32_t h[KV_IO_HEADER_INTS];
    for (int i = 0; i < KV_IO_HEADER_INTS; i++) {
        h[i] = get_i32(data + 4 * i);
    }
    int32_t kind = h[0], dtype = h[1], n_kv = h[2], k_dim = h[3], v_dim = h[4], window = h[5];
    int32_t len = h[6], first = h[7];
    const attn_config *c = &pool->model->cfg;
    if (layer < -1 || layer >= c->n_layers) {
        return ATTN_EINVAL;
    }
    /* layer -1: attn_kv_create's plain cache (a cross-attention context) */
    bool is_state = layer >= 0 && attn_config_layer_is_linear(c, layer);
    int32_t want_window =
        layer >= 0 && attn_config_layer_is_sliding(c, layer) ? c->sliding_window : 0;
    if (kind < KV_IO_ROWS || kind > KV_IO_ROWS_QUERIES || dtype < ATTN_DTYPE_F32 ||
        dtype > ATTN_DTYPE_Q8_0 || n_kv < 1 || k_dim < 1 || v_dim < 0 || window < 0) {
        return ATTN_EIO; /* no cache of any server: damage, not another model's */
    }
    /* What the bytes say must be what this pool holds for this layer: anything else is another
     * model, dtype or layer, refused whole. */
    /* a layer's own cache keeps queries as its pool does; a context never */
    bool has_queries = layer >= 0 && !is_state && pool->keeps_queries;
    int32_t want_kind = is_state ? KV_IO_STATE : has_queries ? KV_IO_ROWS_QUERIES : KV_IO_ROWS;
    if (kind != want_kind || dtype != (int32_t)pool->dtype || n_kv != pool->n_kv_heads ||
        k_dim != pool->k_dim || v_dim != (pool->v_in_k ? 0 : pool->v_dim) ||
        window != want_window) {
        return ATTN_EUNSUPPORTED;
    }
    if (len < 0 || len > pool->max_seq || first < 0 || first > len || (is_state && first != len)) {
        return ATTN_EIO;
    }
    bool has_state = is_state && len > 0;
    size_t want =
        KV_IO_HEADER_INTS * 4 + (is_state ? (has_state ? payload_bytes(pool, true, false, 0) : 0)
                                          : payload_bytes(pool, false, has_queries, len - first));
    if (size != want) {
        return ATTN_EIO;
    }
    /* A ring drops whole blocks: the first one held must start a block of this pool, or tokens
     * this pool would keep are missing from the bytes. Anything else starts at token 0. */
    if (!is_state && first > 0 && (window == 0 || first % pool->block_tokens != 0)) {
        return window == 0 ? ATTN_EIO : ATTN_EDROPPED; /* the tokens before first are not there */
    }
    /* and a ring drops only what no later query sees, keys before len - window + 1: a file
     * whose first is past that lacks rows the next query reads (it read before the pool's
     * blocks; found by an outside audit's fuzzer) */
    if (!is_state && first > 0 && (int64_t)first > (int64_t)len - window + 1) {
        return ATTN_EIO;
    }
    plan->is_state = is_state;
    plan->has_state = has_state;
    plan->has_queries = has_queries;
    plan->len = len;
    plan->first = first;
    plan->n_dropped = is_state ? 0 : first / pool->block_tokens;
    plan->n_blocks = is_state ? 0 : (len + pool->block_tokens - 1) / pool->block_tokens;
    return ATTN_OK;
}

/* 16-byte vectors (GCC's extensions, SSE2 or NEON): the check runs beside a restore's copy into
 * the pool at memory speed (a byte-wise loop would add milliseconds to an 8 MiB restore). */
typedef uint16_t v8u16 __attribute__((vector_size(16), aligned(1)));
typedef uint32_t v4u32 __attribute__((vector_size(16), aligned(1)));

/* Whether n halves (binary16 or bfloat16, little-endian) are all finite: an exponent of all ones
 * (e_mask) is an infinity or a NaN. */
static bool halves_finite(const uint8_t *p, size_t n, uint16_t e_mask) {
    const v8u16 m = {e_mask, e_mask, e_mask, e_mask, e_mask, e_mask, e_mask, e_mask};
    v8u16 bad = {0};
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        v8u16 v;
        __builtin_memcpy(&v, p + 2 * i, sizeof v);
        bad |= (v8u16)((v & m) == m);
    }
    uint16_t any = 0;
    for (int k = 0; k < 8; k++) {
        any |= bad[k];
    }
    for (; i < n; i++) {
        uint16_t h = (uint16_t)(p[2 * i] | (p[2 * i + 1] << 8));
        any |= (h & e_mask) == e_mask;
    }
    return any == 0;
}

static bool floats_finite(const uint8_t *p, size_t n) {
    const uint32_t e = 0x7f800000u;
    const v4u32 m = {e, e, e, e};
    v4u32 bad = {0};
    size_t i = 0;
    for (; i + 4 <= n; i += 4) {
        v4u32 v;
        __builtin_memcpy(&v, p + 4 * i, sizeof v);
        bad |= (v4u32)((v & m) == m);
    }
    uint32_t any = bad[0] | bad[1] | bad[2] | bad[3];
    for (; i < n; i++) {
        uint32_t w = (uint32_t)p[4 * i] | (uint32_t)p[4 * i + 1] << 8 |
                     (uint32_t)p[4 * i + 2] << 16 | (uint32_t)p[4 * i + 3] << 24;
        any |= (w & e) == e;
    }
    return any == 0;
}

/* Whether the rows of `bytes` (rows of row_bytes each, in the pool's dtype) hold finite values
 * only: Q8_0's int8 always are, its block scales must be. */
static bool rows_finite(const attn_kv_pool *pool, const uint8_t *p, size_t bytes,
                        size_t row_bytes) {
    switch (pool->dtype) {
    case ATTN_DTYPE_BF16:
        return halves_finite(p, bytes / 2, 0x7f80);
    case ATTN_DTYPE_F16:
        return halves_finite(p, bytes / 2, 0x7c00);
    case ATTN_DTYPE_Q8_0:
        for (size_t at = 0; at + ATTN__Q8_0_BYTES <= bytes; at += ATTN__Q8_0_BYTES) {
            if (!halves_finite(p + at, 1, 0x7c00)) {
                return false;
            }
        }
        (void)row_bytes; /* a row is whole blocks */
        return true;
    default:
        return floats_finite(p, bytes / 4);
    }
}

/* The payload's values as a cache can hold them: every K, V and query value finite (a request
 * putting a non-finite one in is refused, kv_out_of_range), and a linear state finite with its
 * normalizer z (a sum of elu + 1 features) never negative. A file with a sound checksum and
 * such values was imported, and every later answer of the session was null, or (a negative z)
 * plausible and wrong (found by an outside audit's fuzzer). */
static bool payload_sound(const attn_kv_pool *pool, const struct kv_io_plan *plan,
                          const uint8_t *payload, size_t bytes) {
    if (!plan->is_state) {
        return rows_finite(pool, payload, bytes, pool->k_row_bytes);
    }
    size_t d = (size_t)pool->head_dim, per_head = attn__kv_state_doubles(pool);
    for (int32_t g = 0; plan->has_state && g < pool->n_kv_heads; g++) {
        for (size_t i = 0; i < per_head; i++) {
            double v;
            memcpy(&v, payload + ((size_t)g * per_head + i) * sizeof v, sizeof v);
            if (!isfinite(v) || (i >= d * d && v < 0)) {
                return false;
            }
        }
    }
    return true;
}

int32_t attn_kv_import_blocks(attn_kv_pool *pool, int32_t layer, const uint8_t *data, size_t size) {
    struct kv_io_plan plan;
    int rc = kv_io_check(pool, layer, data, size, &plan);
    if (rc != ATTN_OK) {
        return rc;
    }
    if (!plan.has_state) {
        return plan.n_blocks - plan.n_dropped;
    }
    /* a state's blocks: what an empty cache of this layer takes for one token */
    attn_kv *kv = NULL;
    rc = attn_kv_create_for_layer(pool, layer, &kv);
    int32_t n = rc == ATTN_OK ? attn_kv_blocks_needed(kv, 1) : rc;
    attn_kv_destroy(kv);
    return n;
}

int attn_kv_import(attn_kv_pool *pool, int32_t layer, const uint8_t *data, size_t size,
                   attn_kv **out) {
    struct kv_io_plan plan;
    int rc = out == NULL ? ATTN_EINVAL : kv_io_check(pool, layer, data, size, &plan);
    if (rc != ATTN_OK) {
        return rc;
    }
    if (!payload_sound(pool, &plan, data + KV_IO_HEADER_INTS * 4, size - KV_IO_HEADER_INTS * 4)) {
        return ATTN_EIO;
    }
    if (!plan.is_state && plan.n_blocks - plan.n_dropped > pool->n_free) {
        return ATTN_ENOSPC;
    }
    attn_kv *kv = NULL;
    rc = layer >= 0 ? attn_kv_create_for_layer(pool, layer, &kv) : attn_kv_create(pool, &kv);
    if (rc == ATTN_OK && plan.has_state) {
        rc = attn_kv_reserve(kv, 1); /* the state's blocks, zeroed, then overwritten */
    }
    if (rc != ATTN_OK) {
        attn_kv_destroy(kv);
        return rc;
    }
    if (plan.is_state) {
        kv->len = plan.len;
    } else {
        attn__kv_adopt(kv, plan.n_dropped, plan.n_blocks, plan.len);
    }
    copy_payload(kv, plan.first, data + KV_IO_HEADER_INTS * 4, NULL);
    *out = kv;
    return ATTN_OK;
}
