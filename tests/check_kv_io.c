/* tests/check_kv_io.c: a cache as bytes and back (engine/kv_io.c). Each dtype, a ring and a
 * linear layer's state: the imported cache holds the same values, bit for bit, into a pool of
 * another block size, and a decode step after it answers as after the original; bytes of another
 * dtype, layer kind or window, torn or inconsistent bytes are refused and create nothing. */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check_harness.h"

/* Fills a cache of layer `layer` in pool with n tokens of x (one call). */
static attn_kv *filled(harness_model *hm, attn_kv_pool *pool, attn_workspace *ws, int32_t layer,
                       const float *x, int32_t n, float *out) {
    attn_kv *kv = NULL;
    ck_assert_int_eq(attn_kv_create_for_layer(pool, layer, &kv), ATTN_OK);
    attn_step st = {.kv = kv, .x = x, .n_tokens = n, .out = out};
    ck_assert_int_eq(attn_forward(hm->model, layer, ws, &st, 1), ATTN_OK);
    return kv;
}

/* One decode token through kv; returns its output row (hidden floats, malloc'd). */
static float *decode(harness_model *hm, attn_workspace *ws, int32_t layer, attn_kv *kv,
                     const float *x) {
    float *out = harness_calloc((size_t)hm->cfg.hidden_size, sizeof(float));
    attn_step st = {.kv = kv, .x = x, .n_tokens = 1, .out = out};
    ck_assert_int_eq(attn_forward(hm->model, layer, ws, &st, 1), ATTN_OK);
    return out;
}

/* Exports kv, imports it into `into` (another block size), checks both hold the same values
 * and decode alike; frees what it made. */
static void round_trip(harness_model *hm, attn_workspace *ws, int32_t layer, attn_kv *kv,
                       attn_kv_pool *into, const float *next_x, const char *what) {
    size_t bytes = attn_kv_export_bytes(kv);
    uint8_t *buf = harness_calloc(bytes, 1);
    ck_assert_int_eq(attn_kv_export(kv, buf, bytes - 1), ATTN_ERANGE);
    ck_assert_int_eq(attn_kv_export(kv, buf, bytes), ATTN_OK);
    attn_kv *copy = NULL;
    ck_assert_int_eq(attn_kv_import(into, layer, buf, bytes, &copy), ATTN_OK);
    ck_assert_int_eq(attn_kv_len(copy), attn_kv_len(kv));
    ck_assert_int_eq(attn_kv_first_held(copy), attn_kv_first_held(kv));
    if (!attn_kv_is_state(kv)) {
        int32_t first = attn_kv_first_held(kv), n = attn_kv_len(kv) - first;
        size_t count = (size_t)hm->cfg.n_kv_heads * n * hm->cfg.head_dim;
        float *k0 = harness_calloc(count, sizeof(float)),
              *v0 = harness_calloc(count, sizeof(float));
        float *k1 = harness_calloc(count, sizeof(float)),
              *v1 = harness_calloc(count, sizeof(float));
        ck_assert_int_eq(attn_kv_read(kv, first, n, k0, v0), ATTN_OK);
        ck_assert_int_eq(attn_kv_read(copy, first, n, k1, v1), ATTN_OK);
        ck_assert_msg(memcmp(k0, k1, count * sizeof(float)) == 0, "%s: keys differ", what);
        ck_assert_msg(memcmp(v0, v1, count * sizeof(float)) == 0, "%s: values differ", what);
        free(v1);
        free(k1);
        free(v0);
        free(k0);
    }
    float *a = decode(hm, ws, layer, kv, next_x);
    float *b = decode(hm, ws, layer, copy, next_x);
    /* the same values; only the blocks' sizes, and so the online softmax's order, differ */
    harness_expect_close_tol(b, a, (size_t)hm->cfg.hidden_size, 1e-6, 1e-5, what);
    free(b);
    free(a);
    attn_kv_destroy(copy);
    free(buf);
}

START_TEST(test_kv_io_round_trips) {
    static const attn_dtype dts[] = {ATTN_DTYPE_F32, ATTN_DTYPE_BF16, ATTN_DTYPE_Q8_0};
    for (int variant = 0; variant < 5; variant++) {
        attn_config cfg = harness_config(4, 2, 32);
        cfg.n_layers = 2;
        attn_dtype dt = variant < 3 ? dts[variant] : ATTN_DTYPE_F32;
        int32_t layer = 0;
        if (variant == 3) {
            cfg.sliding_window = 20; /* a ring: 70 tokens in 16-token blocks keep 48.. */
        }
        if (variant == 4) {
            cfg.layer_kind[1] = ATTN_LAYER_LINEAR;
            layer = 1;
        }
        harness_model hm;
        harness_model_init(&hm, &cfg, 8100 + (uint64_t)variant);
        const int32_t n = 70;
        float *x = harness_random_x(8200 + (uint64_t)variant, n + 1, cfg.hidden_size);
        float *out = harness_calloc((size_t)n * cfg.hidden_size, sizeof(float));
        attn_kv_pool *pool = NULL, *other = NULL;
        attn_workspace *ws = NULL;
        /* a linear layer's state (32 x 32 + 32 doubles a head) needs blocks of 32 tokens; the
         * ring's first held token, 48, starts a block of 16 and of 48 */
        int32_t bt = variant == 4 ? 32 : 16, bt_other = variant == 3 ? 48 : 2 * bt;
        ck_assert_int_eq(attn_kv_pool_create_typed(hm.model, 1 << 20, bt, dt, &pool), ATTN_OK);
        ck_assert_int_eq(attn_kv_pool_create_typed(hm.model, 1 << 20, bt_other, dt, &other),
                         ATTN_OK);
        ck_assert_int_eq(attn_workspace_create(hm.model, 128, NULL, &ws), ATTN_OK);
        attn_kv *kv = filled(&hm, pool, ws, layer, x, n, out);
        if (variant == 3) {
            /* the ring gives back what the window left behind, as the daemon has it do after
             * each request */
            ck_assert_int_eq(attn_kv_truncate(kv, n), ATTN_OK);
            ck_assert_int_eq(attn_kv_first_held(kv), 48);
        }
        char what[64];
        snprintf(what, sizeof what, "variant %d (%s)", variant, attn_dtype_name(dt));
        round_trip(&hm, ws, layer, kv, other, x + (size_t)n * cfg.hidden_size, what);
        if (variant == 3) {
            /* 48 does not start a block of 32: the tokens 32..47 that pool would keep are not
             * in the bytes */
            attn_kv_pool *p32 = NULL;
            ck_assert_int_eq(attn_kv_pool_create_typed(hm.model, 1 << 20, 32, dt, &p32), ATTN_OK);
            size_t bytes = attn_kv_export_bytes(kv);
            uint8_t *buf = harness_calloc(bytes, 1);
            ck_assert_int_eq(attn_kv_export(kv, buf, bytes), ATTN_OK);
            attn_kv *none = NULL;
            ck_assert_int_eq(attn_kv_import(p32, layer, buf, bytes, &none), ATTN_EDROPPED);
            ck_assert_ptr_null(none);
            ck_assert_int_eq(attn_kv_pool_blocks_free(p32), attn_kv_pool_blocks_total(p32));
            /* first 64 at len 71: the window (20) still sees 52..63, which such bytes lack; the
             * next attend read before the pool (found by an outside audit's fuzzer). f32 rows:
             * 2 KV heads x 7 tokens x (K + V) x 32 floats after the header. */
            ck_assert_int_eq(buf[24], 71); /* len: round_trip's step appended one */
            size_t crafted_bytes = 32 + (size_t)2 * 7 * 2 * 32 * 4;
            uint8_t *crafted = harness_calloc(crafted_bytes, 1);
            memcpy(crafted, buf, 32);
            crafted[28] = 64; /* first */
            ck_assert_int_eq(attn_kv_import(pool, layer, crafted, crafted_bytes, &none), ATTN_EIO);
            ck_assert_ptr_null(none);
            crafted[28] = 48; /* the same rows, first where a ring can drop to: the size is off */
            ck_assert_int_eq(attn_kv_import(pool, layer, crafted, crafted_bytes, &none), ATTN_EIO);
            free(crafted);
            free(buf);
            attn_kv_pool_destroy(p32);
        }
        attn_kv_destroy(kv);
        ck_assert_int_eq(attn_kv_pool_blocks_free(other), attn_kv_pool_blocks_total(other));
        attn_workspace_destroy(ws);
        attn_kv_pool_destroy(other);
        attn_kv_pool_destroy(pool);
        free(out);
        free(x);
        harness_model_release(&hm);
    }
}
END_TEST

START_TEST(test_kv_io_refusals_create_nothing) {
    attn_config cfg = harness_config(4, 2, 32);
    cfg.n_layers = 2;
    cfg.layer_kind[1] = ATTN_LAYER_LINEAR;
    harness_model hm;
    harness_model_init(&hm, &cfg, 8300);
    const int32_t n = 40;
    float *x = harness_random_x(8301, n, cfg.hidden_size);
    float *out = harness_calloc((size_t)n * cfg.hidden_size, sizeof(float));
    attn_kv_pool *bf = NULL, *f32 = NULL;
    attn_workspace *ws = NULL;
    ck_assert_int_eq(attn_kv_pool_create_typed(hm.model, 1 << 20, 64, ATTN_DTYPE_BF16, &bf),
                     ATTN_OK);
    ck_assert_int_eq(attn_kv_pool_create_typed(hm.model, 1 << 20, 64, ATTN_DTYPE_F32, &f32),
                     ATTN_OK);
    ck_assert_int_eq(attn_workspace_create(hm.model, 64, NULL, &ws), ATTN_OK);
    attn_kv *kv = filled(&hm, bf, ws, 0, x, n, out);
    size_t bytes = attn_kv_export_bytes(kv);
    uint8_t *buf = harness_calloc(bytes + 8, 1);
    ck_assert_int_eq(attn_kv_export(kv, buf, bytes), ATTN_OK);
    int32_t free_before = attn_kv_pool_blocks_free(f32);
    attn_kv *got = NULL;
    /* another dtype, another kind of layer, a layer the model lacks */
    ck_assert_int_eq(attn_kv_import(f32, 0, buf, bytes, &got), ATTN_EUNSUPPORTED);
    ck_assert_int_eq(attn_kv_import(bf, 1, buf, bytes, &got), ATTN_EUNSUPPORTED);
    ck_assert_int_eq(attn_kv_import(bf, 2, buf, bytes, &got), ATTN_EINVAL);
    /* torn, or with bytes to spare, or a length past the bytes, or a first past the length */
    ck_assert_int_eq(attn_kv_import(bf, 0, buf, bytes - 1, &got), ATTN_EIO);
    ck_assert_int_eq(attn_kv_import(bf, 0, buf, bytes + 8, &got), ATTN_EIO);
    ck_assert_int_eq(attn_kv_import(bf, 0, buf, 10, &got), ATTN_EIO);
    buf[24] = (uint8_t)(n + 1); /* len */
    ck_assert_int_eq(attn_kv_import(bf, 0, buf, bytes, &got), ATTN_EIO);
    buf[24] = (uint8_t)n;
    buf[28] = 16; /* first held 16 on a layer without a window */
    ck_assert_int_eq(attn_kv_import(bf, 0, buf, bytes, &got), ATTN_EIO);
    buf[28] = 0;
    ck_assert_ptr_null(got);
    ck_assert_int_eq(attn_kv_pool_blocks_free(f32), free_before);
    /* and the bytes as written still import */
    ck_assert_int_eq(attn_kv_import(bf, 0, buf, bytes, &got), ATTN_OK);
    attn_kv_destroy(got);
    attn_kv_destroy(kv);
    ck_assert_int_eq(attn_kv_pool_blocks_free(bf), attn_kv_pool_blocks_total(bf));
    free(buf);
    attn_workspace_destroy(ws);
    attn_kv_pool_destroy(f32);
    attn_kv_pool_destroy(bf);
    free(out);
    free(x);
    harness_model_release(&hm);
}
END_TEST

/* A cross-attention context is attn_kv_create's plain cache even on a sliding layer: it imports
 * as one (layer -1), every token kept, and not as that layer's ring. */
START_TEST(test_kv_io_context_cache_is_plain) {
    attn_config cfg = harness_config(4, 2, 32);
    cfg.sliding_window = 8;
    harness_model hm;
    harness_model_init(&hm, &cfg, 8400);
    const int32_t n = 40;
    float *x = harness_random_x(8401, n, cfg.hidden_size);
    float *out = harness_calloc((size_t)cfg.hidden_size, sizeof(float));
    attn_kv_pool *pool = NULL;
    attn_workspace *ws = NULL;
    ck_assert_int_eq(attn_kv_pool_create_typed(hm.model, 1 << 20, 16, ATTN_DTYPE_F32, &pool),
                     ATTN_OK);
    ck_assert_int_eq(attn_workspace_create(hm.model, 64, NULL, &ws), ATTN_OK);
    attn_kv *ctx = NULL;
    ck_assert_int_eq(attn_kv_create(pool, &ctx), ATTN_OK);
    attn_step st = {.cross = ctx, .context = x, .n_context = n, .x = x, .n_tokens = 1, .out = out};
    ck_assert_int_eq(attn_forward(hm.model, 0, ws, &st, 1), ATTN_OK);
    size_t bytes = attn_kv_export_bytes(ctx);
    uint8_t *buf = harness_calloc(bytes, 1);
    ck_assert_int_eq(attn_kv_export(ctx, buf, bytes), ATTN_OK);
    attn_kv *got = NULL;
    ck_assert_int_eq(attn_kv_import(pool, 0, buf, bytes, &got), ATTN_EUNSUPPORTED);
    ck_assert_int_eq(attn_kv_import_blocks(pool, -1, buf, bytes), 3);
    ck_assert_int_eq(attn_kv_import(pool, -1, buf, bytes, &got), ATTN_OK);
    ck_assert_int_eq(attn_kv_window(got), 0);
    ck_assert_int_eq(attn_kv_len(got), n);
    size_t count = (size_t)cfg.n_kv_heads * n * cfg.head_dim;
    float *k0 = harness_calloc(count, sizeof(float)), *v0 = harness_calloc(count, sizeof(float));
    float *k1 = harness_calloc(count, sizeof(float)), *v1 = harness_calloc(count, sizeof(float));
    ck_assert_int_eq(attn_kv_read(ctx, 0, n, k0, v0), ATTN_OK);
    ck_assert_int_eq(attn_kv_read(got, 0, n, k1, v1), ATTN_OK);
    ck_assert(memcmp(k0, k1, count * sizeof(float)) == 0);
    ck_assert(memcmp(v0, v1, count * sizeof(float)) == 0);
    free(k0);
    free(v0);
    free(k1);
    free(v1);
    attn_kv_destroy(got);
    attn_kv_destroy(ctx);
    free(buf);
    attn_workspace_destroy(ws);
    attn_kv_pool_destroy(pool);
    free(out);
    free(x);
    harness_model_release(&hm);
}
END_TEST

/* `extern` keeps this prototype out of the Makefile's suite-table scan, which matches lines
 * starting with `Suite *`. */
extern Suite *kvio_suite(void);

Suite *kvio_suite(void) {
    Suite *s = suite_create("kvio");
    TCase *tc = tcase_create("kvio");
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, test_kv_io_round_trips);
    tcase_add_test(tc, test_kv_io_refusals_create_nothing);
    tcase_add_test(tc, test_kv_io_context_cache_is_plain);
    suite_add_tcase(s, tc);
    return s;
}
