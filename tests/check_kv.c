/* tests/check_kv.c: the paged KV cache: pool geometry and accounting, attn_kv_read against ref's
 * post-RoPE K/V, truncate (rollback) then re-append, fork then diverge, and running out of blocks
 * (ATTN_ENOSPC with nothing changed). Numerics use the tolerances of check_harness.h. */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check_harness.h"
#include "ref.h"

/* A model, a pool and a workspace: what every test here starts from. */
typedef struct kv_env {
    harness_model hm;
    attn_kv_pool *pool;
    attn_workspace *ws;
} kv_env;

/* Bytes of one block: K then V, each (n_kv_heads, block_tokens, head_dim) floats. */
static size_t block_bytes(const attn_config *cfg, int32_t block_tokens) {
    return 2 * (size_t)cfg->n_kv_heads * block_tokens * ref_head_dim(cfg) * sizeof(float);
}

static void env_init(kv_env *e, const attn_config *cfg, int32_t n_blocks, int32_t block_tokens) {
    harness_model_init(&e->hm, cfg, 11);
    e->pool = NULL;
    e->ws = NULL;
    ck_assert_int_eq(attn_kv_pool_create(e->hm.model, block_bytes(cfg, block_tokens) * n_blocks,
                                         block_tokens, &e->pool),
                     ATTN_OK);
    ck_assert_int_eq(attn_kv_pool_blocks_total(e->pool), n_blocks);
    ck_assert_int_eq(attn_workspace_create(e->hm.model, 64, NULL, &e->ws), ATTN_OK);
}

static void env_release(kv_env *e) {
    attn_workspace_destroy(e->ws);
    attn_kv_pool_destroy(e->pool);
    harness_model_release(&e->hm);
}

/* Appends tokens [first, first + n) of x (whose rows are the whole sequence) and writes their
 * output rows into out (same row indexing). Returns the forward's code. */
static int append(kv_env *e, attn_kv *kv, const float *x, int32_t first, int32_t n, float *out) {
    int32_t hidden = e->hm.cfg.hidden_size;
    attn_step step = {kv,   x + (size_t)first * hidden,
                      n,    NULL,
                      NULL, out + (size_t)first * hidden,
                      NULL, NULL,
                      NULL, 0,
                      NULL, NULL,
                      0};
    return attn_forward(e->hm.model, 0, e->ws, &step, 1);
}

/* Reads the whole cache (n_kv_heads, len, head_dim) into malloc'd k and v. */
static void read_all(const attn_kv *kv, const attn_config *cfg, float **k, float **v) {
    int32_t len = attn_kv_len(kv);
    size_t count = (size_t)cfg->n_kv_heads * len * ref_head_dim(cfg);
    *k = harness_calloc(count, sizeof(float));
    *v = harness_calloc(count, sizeof(float));
    ck_assert_int_eq(attn_kv_read(kv, 0, len, *k, *v), ATTN_OK);
}

/* Fails unless the cache holds exactly the bytes it held when k and v were read. */
static void expect_unchanged(const attn_kv *kv, const attn_config *cfg, const float *k,
                             const float *v, int32_t len) {
    float *k2 = NULL;
    float *v2 = NULL;
    ck_assert_int_eq(attn_kv_len(kv), len);
    read_all(kv, cfg, &k2, &v2);
    size_t bytes = (size_t)cfg->n_kv_heads * len * ref_head_dim(cfg) * sizeof(float);
    ck_assert_msg(memcmp(k, k2, bytes) == 0, "K changed");
    ck_assert_msg(memcmp(v, v2, bytes) == 0, "V changed");
    free(v2);
    free(k2);
}

/* Concatenates rows [0, n_a) of a and [0, n_b) of b. */
static float *concat_rows(const float *a, int32_t n_a, const float *b, int32_t n_b,
                          int32_t hidden) {
    float *c = harness_calloc((size_t)(n_a + n_b) * hidden, sizeof(float));
    memcpy(c, a, (size_t)n_a * hidden * sizeof(float));
    memcpy(c + (size_t)n_a * hidden, b, (size_t)n_b * hidden * sizeof(float));
    return c;
}

/* The engine's output rows [first, n) and its cache must equal ref's single pass over xs. */
static void expect_matches_ref(const kv_env *e, const attn_kv *kv, const float *xs, int32_t n,
                               const float *out, int32_t first, const char *what) {
    const attn_config *cfg = &e->hm.cfg;
    size_t kv_count = (size_t)cfg->n_kv_heads * n * ref_head_dim(cfg);
    float *out_ref = harness_calloc((size_t)n * cfg->hidden_size, sizeof(float));
    float *k_ref = harness_calloc(kv_count, sizeof(float));
    float *v_ref = harness_calloc(kv_count, sizeof(float));
    harness_ref_run(&e->hm, 0, xs, NULL, NULL, n, out_ref, NULL, k_ref, v_ref);
    harness_expect_rows(out, out_ref, first, n, cfg->hidden_size, what);
    harness_expect_kv(kv, cfg, k_ref, v_ref, n, what);
    free(v_ref);
    free(k_ref);
    free(out_ref);
}

/* ---- pool geometry ------------------------------------------------------------------------- */

START_TEST(test_kv_pool_geometry) {
    attn_config cfg = harness_config(4, 2, 16);
    harness_model hm;
    attn_kv_pool *pool = NULL;
    harness_model_init(&hm, &cfg, 1);
    /* block_tokens 0 means 128; the budget holds 6 whole blocks and a remainder. */
    size_t block = block_bytes(&cfg, 128);
    ck_assert_int_eq(attn_kv_pool_create(hm.model, 6 * block + block / 2, 0, &pool), ATTN_OK);
    ck_assert_int_eq(attn_kv_pool_block_tokens(pool), 128);
    ck_assert_uint_eq(attn_kv_pool_block_bytes(pool), block);
    ck_assert_int_eq(attn_kv_pool_blocks_total(pool), 6);
    ck_assert_int_eq(attn_kv_pool_blocks_free(pool), 6);
    ck_assert_uint_eq(attn_kv_pool_bytes_used(pool), 0);
    ck_assert_uint_eq(attn_kv_pool_bytes_limit(pool), 6 * block);
    attn_kv_pool_destroy(pool);

    /* The documented range of block sizes, both ends. */
    static const int32_t sizes[] = {16, 256};
    for (int i = 0; i < 2; i++) {
        pool = NULL;
        ck_assert_int_eq(
            attn_kv_pool_create(hm.model, block_bytes(&cfg, sizes[i]) * 2, sizes[i], &pool),
            ATTN_OK);
        ck_assert_int_eq(attn_kv_pool_block_tokens(pool), sizes[i]);
        ck_assert_int_eq(attn_kv_pool_blocks_total(pool), 2);
        attn_kv_pool_destroy(pool);
    }
    attn_kv_pool_destroy(NULL);
    harness_model_release(&hm);
}
END_TEST

START_TEST(test_kv_pool_create_rejects_bad_arguments) {
    attn_config cfg = harness_config(4, 2, 16);
    harness_model hm;
    harness_model_init(&hm, &cfg, 1);
    attn_kv_pool *sentinel = (attn_kv_pool *)&hm; /* must stay untouched on failure */
    attn_kv_pool *pool = sentinel;
    static const int32_t bad_sizes[] = {15, 257, -16, 1};
    for (int i = 0; i < 4; i++) {
        ck_assert_int_eq(attn_kv_pool_create(hm.model, 1u << 24, bad_sizes[i], &pool), ATTN_EINVAL);
        ck_assert_ptr_eq(pool, sentinel);
    }
    ck_assert_int_eq(attn_kv_pool_create(hm.model, block_bytes(&cfg, 16) - 1, 16, &pool),
                     ATTN_EINVAL);
    ck_assert_int_eq(attn_kv_pool_create(hm.model, 0, 16, &pool), ATTN_EINVAL);
    ck_assert_int_eq(attn_kv_pool_create(NULL, 1u << 24, 16, &pool), ATTN_EINVAL);
    ck_assert_int_eq(attn_kv_pool_create(hm.model, 1u << 24, 16, NULL), ATTN_EINVAL);
    ck_assert_ptr_eq(pool, sentinel);
    harness_model_release(&hm);
}
END_TEST

/* ---- accounting ---------------------------------------------------------------------------- */

/* Blocks are taken as tokens arrive (16 per block here) and given back by destroy. */
START_TEST(test_kv_blocks_grow_and_return) {
    attn_config cfg = harness_config(4, 2, 16);
    kv_env e;
    env_init(&e, &cfg, 8, 16);
    size_t block = attn_kv_pool_block_bytes(e.pool);
    float *x = harness_random_x(5, 40, cfg.hidden_size);
    float *out = harness_calloc((size_t)40 * cfg.hidden_size, sizeof(float));
    attn_kv *a = NULL;
    attn_kv *b = NULL;

    ck_assert_int_eq(attn_kv_create(e.pool, &a), ATTN_OK);
    ck_assert_int_eq(attn_kv_len(a), 0);
    ck_assert_uint_eq(attn_kv_bytes(a), 0);
    ck_assert_int_eq(attn_kv_pool_blocks_free(e.pool), 8);
    ck_assert_int_eq(attn_kv_blocks_needed(a, 1), 1);
    ck_assert_int_eq(attn_kv_blocks_needed(a, 16), 1);
    ck_assert_int_eq(attn_kv_blocks_needed(a, 17), 2);
    ck_assert_int_eq(attn_kv_blocks_needed(a, 33), 3);

    ck_assert_int_eq(append(&e, a, x, 0, 10, out), ATTN_OK);
    ck_assert_int_eq(attn_kv_len(a), 10);
    ck_assert_uint_eq(attn_kv_bytes(a), block);
    ck_assert_int_eq(attn_kv_pool_blocks_free(e.pool), 7);
    ck_assert_uint_eq(attn_kv_pool_bytes_used(e.pool), block);
    ck_assert_int_eq(attn_kv_blocks_needed(a, 6), 0);
    ck_assert_int_eq(attn_kv_blocks_needed(a, 7), 1);
    ck_assert_int_eq(attn_kv_blocks_needed(a, 22), 1);
    ck_assert_int_eq(attn_kv_blocks_needed(a, 23), 2);

    ck_assert_int_eq(append(&e, a, x, 10, 6, out), ATTN_OK); /* exactly one full block */
    ck_assert_uint_eq(attn_kv_bytes(a), block);
    ck_assert_int_eq(attn_kv_blocks_needed(a, 1), 1);
    ck_assert_int_eq(append(&e, a, x, 16, 1, out), ATTN_OK);
    ck_assert_uint_eq(attn_kv_bytes(a), 2 * block);
    ck_assert_int_eq(attn_kv_pool_blocks_free(e.pool), 6);

    ck_assert_int_eq(attn_kv_create(e.pool, &b), ATTN_OK);
    ck_assert_int_eq(append(&e, b, x, 0, 33, out), ATTN_OK);
    ck_assert_uint_eq(attn_kv_bytes(b), 3 * block);
    ck_assert_int_eq(attn_kv_pool_blocks_free(e.pool), 3);
    ck_assert_uint_eq(attn_kv_pool_bytes_used(e.pool), 5 * block);

    attn_kv_destroy(a);
    ck_assert_int_eq(attn_kv_pool_blocks_free(e.pool), 5);
    attn_kv_destroy(b);
    ck_assert_int_eq(attn_kv_pool_blocks_free(e.pool), 8);
    ck_assert_uint_eq(attn_kv_pool_bytes_used(e.pool), 0);
    attn_kv_destroy(NULL);
    free(out);
    free(x);
    env_release(&e);
}
END_TEST

/* ---- read ---------------------------------------------------------------------------------- */

/* attn_kv_read of any sub-range equals the same slice of ref's post-RoPE K/V, across blocks. */
START_TEST(test_kv_read_ranges_match_ref) {
    attn_config cfg = harness_config(4, 2, 32);
    cfg.rope_style = ATTN_ROPE_STYLE_INTERLEAVED;
    kv_env e;
    env_init(&e, &cfg, 8, 16);
    const int32_t n = 37;
    const int32_t d = 32;
    float *x = harness_random_x(6, n, cfg.hidden_size);
    float *out = harness_calloc((size_t)n * cfg.hidden_size, sizeof(float));
    attn_kv *kv = NULL;
    ck_assert_int_eq(attn_kv_create(e.pool, &kv), ATTN_OK);
    ck_assert_int_eq(append(&e, kv, x, 0, 20, out), ATTN_OK);
    ck_assert_int_eq(append(&e, kv, x, 20, 17, out), ATTN_OK);
    expect_matches_ref(&e, kv, x, n, out, 0, "37 tokens in two chunks");

    float *k_ref = harness_calloc((size_t)2 * n * d, sizeof(float));
    float *v_ref = harness_calloc((size_t)2 * n * d, sizeof(float));
    float *out_ref = harness_calloc((size_t)n * cfg.hidden_size, sizeof(float));
    harness_ref_run(&e.hm, 0, x, NULL, NULL, n, out_ref, NULL, k_ref, v_ref);
    static const int32_t ranges[][2] = {{0, 1}, {15, 2}, {5, 27}, {36, 1}, {16, 16}};
    for (int r = 0; r < 5; r++) {
        int32_t first = ranges[r][0];
        int32_t count = ranges[r][1];
        float *k = harness_calloc((size_t)2 * count * d, sizeof(float));
        float *v = harness_calloc((size_t)2 * count * d, sizeof(float));
        ck_assert_int_eq(attn_kv_read(kv, first, count, k, v), ATTN_OK);
        for (int h = 0; h < 2; h++) {
            char label[96];
            snprintf(label, sizeof(label), "K[%d, %d:%d]", h, (int)first, (int)(first + count));
            harness_expect_close(k + (size_t)h * count * d, k_ref + ((size_t)h * n + first) * d,
                                 (size_t)count * d, label);
            snprintf(label, sizeof(label), "V[%d, %d:%d]", h, (int)first, (int)(first + count));
            harness_expect_close(v + (size_t)h * count * d, v_ref + ((size_t)h * n + first) * d,
                                 (size_t)count * d, label);
        }
        free(v);
        free(k);
    }
    /* Out of bounds: past the length, negative start or count. */
    float k1[2 * 32];
    float v1[2 * 32];
    ck_assert_int_eq(attn_kv_read(kv, 37, 1, k1, v1), ATTN_ERANGE);
    ck_assert_int_eq(attn_kv_read(kv, 30, 8, k1, v1), ATTN_ERANGE);
    ck_assert_int_eq(attn_kv_read(kv, -1, 1, k1, v1), ATTN_ERANGE);
    ck_assert_int_eq(attn_kv_read(kv, 0, -1, k1, v1), ATTN_ERANGE);
    free(out_ref);
    free(v_ref);
    free(k_ref);
    attn_kv_destroy(kv);
    free(out);
    free(x);
    env_release(&e);
}
END_TEST

/* ---- truncate ------------------------------------------------------------------------------ */

/* Rollback: 40 tokens, truncate to 13 (returning two of three blocks), then 20 other tokens: the
 * outputs and the cache equal one straight run over the 13 kept tokens and the 20 new ones. */
START_TEST(test_kv_truncate_then_reappend_equals_straight_run) {
    attn_config cfg = harness_config(8, 2, 32);
    cfg.sliding_window = 9;
    kv_env e;
    env_init(&e, &cfg, 8, 16);
    const int32_t hidden = cfg.hidden_size;
    float *x = harness_random_x(7, 40, hidden);
    float *y = harness_random_x(8, 20, hidden);
    float *out = harness_calloc((size_t)40 * hidden, sizeof(float));
    attn_kv *kv = NULL;
    ck_assert_int_eq(attn_kv_create(e.pool, &kv), ATTN_OK);
    ck_assert_int_eq(append(&e, kv, x, 0, 33, out), ATTN_OK);
    ck_assert_int_eq(append(&e, kv, x, 33, 7, out), ATTN_OK);
    ck_assert_int_eq(attn_kv_pool_blocks_free(e.pool), 5);

    ck_assert_int_eq(attn_kv_truncate(kv, 13), ATTN_OK);
    ck_assert_int_eq(attn_kv_len(kv), 13);
    ck_assert_int_eq(attn_kv_pool_blocks_free(e.pool), 7);
    ck_assert_uint_eq(attn_kv_bytes(kv), attn_kv_pool_block_bytes(e.pool));

    float *xs = concat_rows(x, 13, y, 20, hidden);
    float *out2 = harness_calloc((size_t)33 * hidden, sizeof(float));
    ck_assert_int_eq(append(&e, kv, xs, 13, 1, out2), ATTN_OK);
    ck_assert_int_eq(append(&e, kv, xs, 14, 19, out2), ATTN_OK);
    expect_matches_ref(&e, kv, xs, 33, out2, 13, "truncate to 13 then 20 new tokens");

    /* Truncating to the current length and then to 0 are valid; 0 frees every block. */
    ck_assert_int_eq(attn_kv_truncate(kv, 33), ATTN_OK);
    ck_assert_int_eq(attn_kv_len(kv), 33);
    ck_assert_int_eq(attn_kv_truncate(kv, 0), ATTN_OK);
    ck_assert_int_eq(attn_kv_len(kv), 0);
    ck_assert_uint_eq(attn_kv_bytes(kv), 0);
    ck_assert_int_eq(attn_kv_pool_blocks_free(e.pool), 8);
    float *out3 = harness_calloc((size_t)33 * hidden, sizeof(float));
    ck_assert_int_eq(append(&e, kv, xs, 0, 33, out3), ATTN_OK);
    expect_matches_ref(&e, kv, xs, 33, out3, 0, "truncate to 0 then refill");
    free(out3);
    free(out2);
    free(xs);
    attn_kv_destroy(kv);
    free(out);
    free(y);
    free(x);
    env_release(&e);
}
END_TEST

START_TEST(test_kv_truncate_out_of_range_is_erange) {
    attn_config cfg = harness_config(4, 2, 16);
    kv_env e;
    env_init(&e, &cfg, 4, 16);
    float *x = harness_random_x(9, 20, cfg.hidden_size);
    float *out = harness_calloc((size_t)20 * cfg.hidden_size, sizeof(float));
    attn_kv *kv = NULL;
    ck_assert_int_eq(attn_kv_create(e.pool, &kv), ATTN_OK);
    ck_assert_int_eq(attn_kv_truncate(kv, 1), ATTN_ERANGE);
    ck_assert_int_eq(append(&e, kv, x, 0, 20, out), ATTN_OK);
    float *k = NULL;
    float *v = NULL;
    read_all(kv, &cfg, &k, &v);
    ck_assert_int_eq(attn_kv_truncate(kv, 21), ATTN_ERANGE);
    ck_assert_int_eq(attn_kv_truncate(kv, -1), ATTN_ERANGE);
    expect_unchanged(kv, &cfg, k, v, 20);
    ck_assert_int_eq(attn_kv_pool_blocks_free(e.pool), 2);
    free(v);
    free(k);
    attn_kv_destroy(kv);
    free(out);
    free(x);
    env_release(&e);
}
END_TEST

/* ---- fork ---------------------------------------------------------------------------------- */

/* Fork a cache whose last block is partly filled, then append different tokens to each: both
 * must equal their own straight runs (so the fork did not share the partial block), and the
 * copy must survive the original's destruction. */
START_TEST(test_kv_fork_then_diverge) {
    attn_config cfg = harness_config(8, 4, 32);
    kv_env e;
    env_init(&e, &cfg, 10, 16);
    const int32_t hidden = cfg.hidden_size;
    float *x = harness_random_x(10, 21, hidden);
    float *ya = harness_random_x(11, 3, hidden);
    float *yb = harness_random_x(12, 6, hidden);
    float *out = harness_calloc((size_t)21 * hidden, sizeof(float));
    attn_kv *a = NULL;
    attn_kv *b = NULL;
    ck_assert_int_eq(attn_kv_create(e.pool, &a), ATTN_OK);
    ck_assert_int_eq(append(&e, a, x, 0, 21, out), ATTN_OK);
    ck_assert_int_eq(attn_kv_pool_blocks_free(e.pool), 8);

    ck_assert_int_eq(attn_kv_fork(a, &b), ATTN_OK);
    ck_assert_ptr_nonnull(b);
    ck_assert_ptr_ne(a, b);
    ck_assert_int_eq(attn_kv_len(b), 21);
    ck_assert_uint_eq(attn_kv_bytes(b), attn_kv_bytes(a));
    ck_assert_int_eq(attn_kv_pool_blocks_free(e.pool), 6);
    float *k = NULL;
    float *v = NULL;
    read_all(a, &cfg, &k, &v);
    expect_unchanged(b, &cfg, k, v, 21);

    float *xa = concat_rows(x, 21, ya, 3, hidden);
    float *xb = concat_rows(x, 21, yb, 6, hidden);
    float *out_a = harness_calloc((size_t)24 * hidden, sizeof(float));
    float *out_b = harness_calloc((size_t)27 * hidden, sizeof(float));
    ck_assert_int_eq(append(&e, a, xa, 21, 3, out_a), ATTN_OK);
    ck_assert_int_eq(append(&e, b, xb, 21, 1, out_b), ATTN_OK);
    ck_assert_int_eq(append(&e, b, xb, 22, 4, out_b), ATTN_OK);
    expect_matches_ref(&e, a, xa, 24, out_a, 21, "original after fork");
    expect_matches_ref(&e, b, xb, 26, out_b, 21, "fork");

    attn_kv_destroy(a);
    ck_assert_int_eq(append(&e, b, xb, 26, 1, out_b), ATTN_OK);
    expect_matches_ref(&e, b, xb, 27, out_b, 21, "fork after the original is destroyed");
    attn_kv_destroy(b);
    ck_assert_int_eq(attn_kv_pool_blocks_free(e.pool), 10);

    /* Forking an empty cache gives an empty cache. */
    ck_assert_int_eq(attn_kv_create(e.pool, &a), ATTN_OK);
    ck_assert_int_eq(attn_kv_fork(a, &b), ATTN_OK);
    ck_assert_int_eq(attn_kv_len(b), 0);
    ck_assert_int_eq(attn_kv_pool_blocks_free(e.pool), 10);
    attn_kv_destroy(b);
    attn_kv_destroy(a);
    free(out_b);
    free(out_a);
    free(xb);
    free(xa);
    free(v);
    free(k);
    free(out);
    free(yb);
    free(ya);
    free(x);
    env_release(&e);
}
END_TEST

START_TEST(test_kv_fork_without_space_is_enospc) {
    attn_config cfg = harness_config(4, 2, 16);
    kv_env e;
    env_init(&e, &cfg, 3, 16);
    float *x = harness_random_x(13, 20, cfg.hidden_size);
    float *out = harness_calloc((size_t)20 * cfg.hidden_size, sizeof(float));
    attn_kv *a = NULL;
    attn_kv *sentinel = (attn_kv *)&e;
    attn_kv *b = sentinel;
    ck_assert_int_eq(attn_kv_create(e.pool, &a), ATTN_OK);
    ck_assert_int_eq(append(&e, a, x, 0, 20, out), ATTN_OK); /* 2 of 3 blocks */
    float *k = NULL;
    float *v = NULL;
    read_all(a, &cfg, &k, &v);
    ck_assert_int_eq(attn_kv_fork(a, &b), ATTN_ENOSPC);
    ck_assert_ptr_eq(b, sentinel);
    ck_assert_int_eq(attn_kv_pool_blocks_free(e.pool), 1);
    expect_unchanged(a, &cfg, k, v, 20);
    ck_assert_int_eq(attn_kv_truncate(a, 16), ATTN_OK); /* now one block: the copy fits */
    ck_assert_int_eq(attn_kv_fork(a, &b), ATTN_OK);
    ck_assert_int_eq(attn_kv_pool_blocks_free(e.pool), 1);
    attn_kv_destroy(b);
    attn_kv_destroy(a);
    free(v);
    free(k);
    free(out);
    free(x);
    env_release(&e);
}
END_TEST

/* ---- exhaustion ---------------------------------------------------------------------------- */

/* A pool of 3 blocks of 16 tokens: a full pool refuses an append with ATTN_ENOSPC, changing
 * neither the failing cache nor any other, and later appends are still exact. */
START_TEST(test_kv_pool_exhaustion_is_enospc_and_changes_nothing) {
    attn_config cfg = harness_config(4, 2, 16);
    kv_env e;
    env_init(&e, &cfg, 3, 16);
    const int32_t hidden = cfg.hidden_size;
    float *x = harness_random_x(14, 48, hidden);
    float *out = harness_calloc((size_t)48 * hidden, sizeof(float));
    float *xb = harness_random_x(15, 4, hidden);
    float *out_b = harness_calloc((size_t)4 * hidden, sizeof(float));
    attn_kv *a = NULL;
    attn_kv *b = NULL;
    ck_assert_int_eq(attn_kv_create(e.pool, &a), ATTN_OK);
    ck_assert_int_eq(attn_kv_create(e.pool, &b), ATTN_OK);
    ck_assert_int_eq(append(&e, a, x, 0, 40, out), ATTN_OK);
    ck_assert_int_eq(attn_kv_pool_blocks_free(e.pool), 0);
    float *k = NULL;
    float *v = NULL;
    read_all(a, &cfg, &k, &v);

    ck_assert_int_eq(attn_kv_blocks_needed(b, 1), 1);
    ck_assert_int_eq(append(&e, b, xb, 0, 1, out_b), ATTN_ENOSPC);
    ck_assert_int_eq(attn_kv_len(b), 0);
    ck_assert_uint_eq(attn_kv_bytes(b), 0);
    ck_assert_int_eq(append(&e, a, x, 40, 9, out), ATTN_ENOSPC); /* 49 > 48 */
    ck_assert_int_eq(attn_kv_pool_blocks_free(e.pool), 0);
    expect_unchanged(a, &cfg, k, v, 40);

    /* 8 more fit in a's last block; the earlier failures left no trace in the results. */
    ck_assert_int_eq(append(&e, a, x, 40, 8, out), ATTN_OK);
    expect_matches_ref(&e, a, x, 48, out, 40, "append after ATTN_ENOSPC");

    /* Freeing space lets b proceed. */
    ck_assert_int_eq(attn_kv_truncate(a, 16), ATTN_OK);
    ck_assert_int_eq(attn_kv_pool_blocks_free(e.pool), 2);
    ck_assert_int_eq(append(&e, b, xb, 0, 4, out_b), ATTN_OK);
    expect_matches_ref(&e, b, xb, 4, out_b, 0, "append after space was freed");
    attn_kv_destroy(b);
    attn_kv_destroy(a);
    free(v);
    free(k);
    free(out_b);
    free(xb);
    free(out);
    free(x);
    env_release(&e);
}
END_TEST

/* Reserved blocks are taken at once; a forward within them leaves the pool's counters alone (the
 * server reserves on its loop thread and runs forwards on workers), and gives the same answer. */
START_TEST(test_kv_reserve_then_forward_leaves_pool_alone) {
    attn_config cfg = harness_config(4, 2, 16);
    kv_env e;
    env_init(&e, &cfg, 4, 16);
    const int32_t hidden = cfg.hidden_size;
    float *x = harness_random_x(21, 40, hidden);
    float *out = harness_calloc((size_t)40 * hidden, sizeof(float));
    attn_kv *a = NULL;
    ck_assert_int_eq(attn_kv_create(e.pool, &a), ATTN_OK);
    ck_assert_int_eq(attn_kv_reserve(a, -1), ATTN_EINVAL);
    ck_assert_int_eq(attn_kv_reserve(a, cfg.max_seq + 1), ATTN_ERANGE);
    ck_assert_int_eq(attn_kv_reserve(a, 65), ATTN_ENOSPC); /* 5 blocks of 16 > 4 */
    ck_assert_int_eq(attn_kv_pool_blocks_free(e.pool), 4);
    ck_assert_int_eq(attn_kv_reserve(a, 33), ATTN_OK);
    ck_assert_int_eq(attn_kv_len(a), 0);
    ck_assert_int_eq(attn_kv_pool_blocks_free(e.pool), 1);
    ck_assert_int_eq(attn_kv_blocks_needed(a, 33), 0);
    ck_assert_int_eq(attn_kv_blocks_needed(a, 49), 1);
    ck_assert_int_eq(append(&e, a, x, 0, 20, out), ATTN_OK);
    ck_assert_int_eq(append(&e, a, x, 20, 13, out), ATTN_OK);
    ck_assert_int_eq(attn_kv_pool_blocks_free(e.pool), 1);
    expect_matches_ref(&e, a, x, 33, out, 20, "forward into reserved blocks");
    /* A reservation past the length goes back with truncate. */
    ck_assert_int_eq(attn_kv_reserve(a, 7), ATTN_OK);
    ck_assert_int_eq(attn_kv_pool_blocks_free(e.pool), 1);
    ck_assert_int_eq(attn_kv_reserve(a, 16), ATTN_OK); /* 49 tokens: a fourth block */
    ck_assert_int_eq(attn_kv_pool_blocks_free(e.pool), 0);
    ck_assert_int_eq(attn_kv_truncate(a, 33), ATTN_OK);
    ck_assert_int_eq(attn_kv_pool_blocks_free(e.pool), 1);
    attn_kv_destroy(a);
    ck_assert_int_eq(attn_kv_pool_blocks_free(e.pool), 4);
    free(out);
    free(x);
    env_release(&e);
}
END_TEST

/* Blocks of block_tokens covering tokens [first, last). */
static int32_t blocks_covering(int32_t first, int32_t last, int32_t block_tokens) {
    return last <= first ? 0 : (last - 1) / block_tokens - first / block_tokens + 1;
}

/* A sliding layer's ring (window 21, blocks of 16) runs 150 tokens in a pool of 6 blocks (96
 * tokens), in calls of many sizes: every output row equals ref's single pass, the held K/V equal
 * ref's, it never holds more than the window and the call need, and what it dropped is refused
 * by read, truncate (ATTN_EDROPPED, nothing changed) and a layer of another window. Truncating
 * where it may, forking, and emptying it each continue exactly. */
START_TEST(test_kv_ring_keeps_the_window_exactly) {
    attn_config cfg = harness_config(4, 2, 16);
    cfg.n_layers = 2;
    cfg.sliding_window = 21;
    cfg.is_full_layer[1] = true;
    const int32_t n = 150, bt = 16, w = 21, hidden = cfg.hidden_size;
    kv_env e;
    env_init(&e, &cfg, 6, bt);
    float *x = harness_random_x(31, n, hidden);
    float *out = harness_calloc((size_t)n * hidden, sizeof(float));
    float *out_ref = harness_calloc((size_t)n * hidden, sizeof(float));
    size_t kv_count = (size_t)cfg.n_kv_heads * n * 16;
    float *k_ref = harness_calloc(kv_count, sizeof(float));
    float *v_ref = harness_calloc(kv_count, sizeof(float));
    harness_ref_run(&e.hm, 0, x, NULL, NULL, n, out_ref, NULL, k_ref, v_ref);

    attn_kv *ring = NULL;
    ck_assert_int_eq(attn_kv_create_for_layer(e.pool, 2, &ring), ATTN_EINVAL);
    ck_assert_int_eq(attn_kv_create_for_layer(e.pool, 1, &ring), ATTN_OK);
    ck_assert_int_eq(attn_kv_window(ring), 0); /* the full layer keeps everything */
    attn_kv_destroy(ring);
    ck_assert_int_eq(attn_kv_create_for_layer(e.pool, 0, &ring), ATTN_OK);
    ck_assert_int_eq(attn_kv_window(ring), w);
    static const int32_t calls[] = {37, 1, 1, 1, 1, 1, 1, 1, 13, 13, 13, 5, 1, 1, 60};
    int32_t len = 0;
    for (size_t c = 0; c < sizeof calls / sizeof calls[0]; c++) {
        ck_assert_int_eq(append(&e, ring, x, len, calls[c], out), ATTN_OK);
        len += calls[c];
        int32_t first = attn_kv_first_held(ring);
        ck_assert_int_eq(attn_kv_len(ring), len);
        ck_assert_msg(first <= (len - w + 1 > 0 ? len - w + 1 : 0), "dropped a visible token");
        /* What the call's queries see, and one dead block a forward drops only when it next
         * needs a block. */
        int32_t most =
            blocks_covering(len - calls[c] - w + 1 > 0 ? len - calls[c] - w + 1 : 0, len, bt) + 1;
        ck_assert_msg(attn_kv_bytes(ring) <= (size_t)most * block_bytes(&cfg, bt),
                      "after %d tokens: %zu bytes, more than %d blocks", (int)len,
                      attn_kv_bytes(ring), (int)most);
    }
    ck_assert_int_eq(len, n);
    harness_expect_rows(out, out_ref, 0, n, hidden, "ring: every row");
    int32_t first = attn_kv_first_held(ring);
    ck_assert_int_gt(first, 0);
    /* The held K/V are ref's. */
    int32_t held = n - first;
    float *k = harness_calloc((size_t)cfg.n_kv_heads * held * 16, sizeof(float));
    float *v = harness_calloc((size_t)cfg.n_kv_heads * held * 16, sizeof(float));
    ck_assert_int_eq(attn_kv_read(ring, first, held, k, v), ATTN_OK);
    for (int32_t h = 0; h < cfg.n_kv_heads; h++) {
        size_t at = ((size_t)h * n + first) * 16, got = (size_t)h * held * 16;
        harness_expect_close(k + got, k_ref + at, (size_t)held * 16, "ring: held K");
        harness_expect_close(v + got, v_ref + at, (size_t)held * 16, "ring: held V");
    }
    ck_assert_int_eq(attn_kv_read(ring, first - 1, 1, k, v), ATTN_EDROPPED);
    /* A layer whose queries would see what the ring dropped refuses it. */
    attn_step step = {ring, x, 1, NULL, NULL, out, NULL, NULL, NULL, 0, NULL, NULL, 0};
    ck_assert_int_eq(attn_forward(e.hm.model, 1, e.ws, &step, 1), ATTN_EINVAL);
    ck_assert_int_eq(attn_kv_len(ring), n);

    /* Back to the shortest length it can: the first query there sees only held tokens. */
    int32_t min = attn_kv_truncate_min(ring);
    ck_assert_int_eq(min, first + w - 1);
    size_t bytes = attn_kv_bytes(ring);
    ck_assert_int_eq(attn_kv_truncate(ring, min - 1), ATTN_EDROPPED);
    ck_assert_int_eq(attn_kv_len(ring), n);
    ck_assert_uint_eq(attn_kv_bytes(ring), bytes);
    ck_assert_int_eq(attn_kv_truncate(ring, min), ATTN_OK);
    attn_kv *copy = NULL;
    ck_assert_int_eq(attn_kv_fork(ring, &copy), ATTN_OK);
    ck_assert_int_eq(attn_kv_first_held(copy), attn_kv_first_held(ring));
    memset(out, 0, (size_t)n * hidden * sizeof(float));
    /* In calls of 8 beside the fork's blocks: each call frees what the previous one left. */
    for (int32_t t = min; t < n; t += 8) {
        ck_assert_int_eq(append(&e, ring, x, t, n - t < 8 ? n - t : 8, out), ATTN_OK);
    }
    harness_expect_rows(out, out_ref, min, n, hidden, "ring: after truncate");
    memset(out, 0, (size_t)n * hidden * sizeof(float));
    ck_assert_int_eq(append(&e, copy, x, min, 1, out), ATTN_OK);
    harness_expect_rows(out, out_ref, min, min + 1, hidden, "ring: its fork");
    attn_kv_destroy(copy);

    /* Emptied, it starts over. */
    ck_assert_int_eq(attn_kv_truncate(ring, 0), ATTN_OK);
    ck_assert_int_eq(attn_kv_first_held(ring), 0);
    ck_assert_uint_eq(attn_kv_bytes(ring), 0);
    ck_assert_int_eq(append(&e, ring, x, 0, 30, out), ATTN_OK);
    harness_expect_rows(out, out_ref, 0, 30, hidden, "ring: started over");
    attn_kv_destroy(ring);
    ck_assert_int_eq(attn_kv_pool_blocks_free(e.pool), 6);
    free(v);
    free(k);
    free(v_ref);
    free(k_ref);
    free(out_ref);
    free(out);
    free(x);
    env_release(&e);
}
END_TEST

/* Reserved ahead (the daemon's way), a ring drops its dead blocks at the reservation and at the
 * truncate that returns the unused ones, never in the forward: decoding stays within the window
 * and a small pool. */
START_TEST(test_kv_ring_reserved_decode_stays_small) {
    attn_config cfg = harness_config(4, 2, 16);
    cfg.sliding_window = 17;
    const int32_t n = 200, bt = 16, hidden = cfg.hidden_size;
    kv_env e;
    env_init(&e, &cfg, 4, bt);
    float *x = harness_random_x(32, n, hidden);
    float *out = harness_calloc((size_t)n * hidden, sizeof(float));
    float *out_ref = harness_calloc((size_t)n * hidden, sizeof(float));
    harness_ref_run(&e.hm, 0, x, NULL, NULL, n, out_ref, NULL, NULL, NULL);
    attn_kv *ring = NULL;
    ck_assert_int_eq(attn_kv_create_for_layer(e.pool, 0, &ring), ATTN_OK);
    ck_assert_int_eq(attn_kv_reserve(ring, 40), ATTN_OK);
    ck_assert_int_eq(append(&e, ring, x, 0, 40, out), ATTN_OK);
    ck_assert_int_eq(attn_kv_truncate(ring, 40), ATTN_OK);
    for (int32_t t = 40; t < n; t++) {
        int32_t needed = attn_kv_blocks_needed(ring, 1);
        ck_assert_int_le(needed, attn_kv_pool_blocks_free(e.pool));
        ck_assert_int_eq(attn_kv_reserve(ring, 1), ATTN_OK);
        int32_t free_before = attn_kv_pool_blocks_free(e.pool);
        ck_assert_int_eq(append(&e, ring, x, t, 1, out), ATTN_OK);
        ck_assert_int_eq(attn_kv_pool_blocks_free(e.pool), free_before);
        ck_assert_int_eq(attn_kv_truncate(ring, t + 1), ATTN_OK);
        ck_assert_uint_le(attn_kv_bytes(ring), 3 * block_bytes(&cfg, bt));
    }
    harness_expect_rows(out, out_ref, 0, n, hidden, "reserved ring");
    attn_kv_destroy(ring);
    free(out_ref);
    free(out);
    free(x);
    env_release(&e);
}
END_TEST

/* `extern` keeps this prototype out of the Makefile's suite-table scan, which matches lines
 * starting with `Suite *`. */
extern Suite *kv_suite(void);

Suite *kv_suite(void) {
    Suite *s = suite_create("kv");
    TCase *tc = tcase_create("kv");
    tcase_add_test(tc, test_kv_pool_geometry);
    tcase_add_test(tc, test_kv_pool_create_rejects_bad_arguments);
    tcase_add_test(tc, test_kv_blocks_grow_and_return);
    tcase_add_test(tc, test_kv_read_ranges_match_ref);
    tcase_add_test(tc, test_kv_truncate_then_reappend_equals_straight_run);
    tcase_add_test(tc, test_kv_truncate_out_of_range_is_erange);
    tcase_add_test(tc, test_kv_fork_then_diverge);
    tcase_add_test(tc, test_kv_fork_without_space_is_enospc);
    tcase_add_test(tc, test_kv_pool_exhaustion_is_enospc_and_changes_nothing);
    tcase_add_test(tc, test_kv_reserve_then_forward_leaves_pool_alone);
    tcase_add_test(tc, test_kv_ring_keeps_the_window_exactly);
    tcase_add_test(tc, test_kv_ring_reserved_decode_stays_small);
    suite_add_tcase(s, tc);
    return s;
}
