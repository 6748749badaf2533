/* tests/check_error.c: the error contract of engine/attn.h: attn_strerror for every code, one
 * test that provokes each code, and bad arguments to the forward, workspace and cache functions
 * giving the documented code without touching any cache or out-param. */
#include <check.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check_harness.h"
#include "ref.h"

#if defined(__SANITIZE_ADDRESS__)
#define CHECK_ERROR_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define CHECK_ERROR_ASAN 1
#endif
#endif

#ifdef CHECK_ERROR_ASAN
/* ASan aborts on an impossible allocation unless told to return NULL as malloc does; the ENOMEM
 * test needs the ordinary behaviour. The ASan runtime reads this at start-up. */
const char *__asan_default_options(void);
const char *__asan_default_options(void) {
    return "allocator_may_return_null=1";
}
#endif

static const int all_codes[] = {ATTN_OK,        ATTN_EINVAL,   ATTN_ENOMEM,   ATTN_ERANGE,
                                ATTN_ESHAPE,    ATTN_EIO,      ATTN_ENOSPC,   ATTN_EUNSUPPORTED,
                                ATTN_ECANCELED, ATTN_EDROPPED, ATTN_EOVERFLOW};
#define N_CODES ((int)(sizeof(all_codes) / sizeof(all_codes[0])))

/* A model, a pool, a workspace and a cache with 5 tokens in it. */
typedef struct err_env {
    harness_model hm;
    attn_kv_pool *pool;
    attn_workspace *ws;
    attn_kv *kv;
    float *x;   /* (64, hidden): max_seq rows, so no call here can read past it */
    float *out; /* (64, hidden) */
} err_env;

static void env_init(err_env *e, int32_t n_blocks) {
    attn_config cfg = harness_config(4, 2, 16);
    cfg.max_seq = 64;
    harness_model_init(&e->hm, &cfg, 99);
    e->pool = NULL;
    e->ws = NULL;
    e->kv = NULL;
    size_t block = 2 * (size_t)2 * 16 * 16 * sizeof(float);
    ck_assert_int_eq(attn_kv_pool_create(e->hm.model, block * n_blocks, 16, &e->pool), ATTN_OK);
    ck_assert_int_eq(attn_workspace_create(e->hm.model, 8, NULL, &e->ws), ATTN_OK);
    ck_assert_int_eq(attn_kv_create(e->pool, &e->kv), ATTN_OK);
    e->x = harness_random_x(99, 64, 64);
    e->out = harness_calloc((size_t)64 * 64, sizeof(float));
    attn_step step = {e->kv, e->x, 5, NULL, NULL, e->out, NULL, NULL, NULL, 0, NULL, NULL, 0};
    ck_assert_int_eq(attn_forward(e->hm.model, 0, e->ws, &step, 1), ATTN_OK);
}

static void env_release(err_env *e) {
    free(e->out);
    free(e->x);
    attn_kv_destroy(e->kv);
    attn_workspace_destroy(e->ws);
    attn_kv_pool_destroy(e->pool);
    harness_model_release(&e->hm);
}

static attn_step good_step(const err_env *e) {
    attn_step s = {e->kv, e->x, 2, NULL, NULL, e->out, NULL, NULL, NULL, 0, NULL, NULL, 0};
    return s;
}

/* ---- strerror ------------------------------------------------------------------------------ */

START_TEST(test_error_strerror_every_code) {
    const char *unknown = attn_strerror(-1000);
    ck_assert_str_eq(unknown, "unknown error");
    for (int i = 0; i < N_CODES; i++) {
        const char *s = attn_strerror(all_codes[i]);
        ck_assert_ptr_nonnull(s);
        ck_assert_msg(strlen(s) > 0, "code %d: empty string", all_codes[i]);
        ck_assert_msg(strcmp(s, unknown) != 0, "code %d reads as unknown", all_codes[i]);
        ck_assert_ptr_eq(s, attn_strerror(all_codes[i])); /* static, not rebuilt per call */
        for (int j = 0; j < i; j++) {
            ck_assert_msg(strcmp(s, attn_strerror(all_codes[j])) != 0,
                          "codes %d and %d share the string \"%s\"", all_codes[i], all_codes[j], s);
        }
    }
    static const int others[] = {1, -11, 42, INT_MIN, INT_MAX};
    for (size_t i = 0; i < sizeof(others) / sizeof(others[0]); i++) {
        ck_assert_str_eq(attn_strerror(others[i]), "unknown error");
    }
}
END_TEST

/* ---- each code, provoked ------------------------------------------------------------------- */

START_TEST(test_error_einval_null_model) {
    err_env e;
    env_init(&e, 4);
    attn_step s = good_step(&e);
    ck_assert_int_eq(attn_forward(NULL, 0, e.ws, &s, 1), ATTN_EINVAL);
    ck_assert_int_eq(attn_kv_len(e.kv), 5);
    env_release(&e);
}
END_TEST

/* A pool budget of 1 PiB cannot be reserved (it is larger than the user address space). */
START_TEST(test_error_enomem_pool_budget) {
    attn_config cfg = harness_config(8, 8, 128);
    attn_model *m = NULL;
    attn_kv_pool *sentinel = (attn_kv_pool *)&cfg;
    attn_kv_pool *pool = sentinel;
    ck_assert_int_eq(attn_model_create_random(&cfg, 1, NULL, &m), ATTN_OK);
    ck_assert_int_eq(attn_kv_pool_create(m, (size_t)1 << 50, 256, &pool), ATTN_ENOMEM);
    ck_assert_ptr_eq(pool, sentinel);
    attn_model_destroy(m);
}
END_TEST

START_TEST(test_error_erange_position) {
    err_env e;
    env_init(&e, 4);
    int32_t pos[2] = {10, 64}; /* max_seq is 64 */
    attn_step s = good_step(&e);
    s.positions = pos;
    ck_assert_int_eq(attn_forward(e.hm.model, 0, e.ws, &s, 1), ATTN_ERANGE);
    ck_assert_int_eq(attn_kv_len(e.kv), 5);
    env_release(&e);
}
END_TEST

/* Steps e's model with a cache from the pool of another model, made from other_cfg (NULL: the
 * same config as e's): ATTN_ESHAPE, and the foreign cache stays empty. */
static void expect_foreign_cache_is_eshape(const attn_config *other_cfg) {
    err_env e;
    env_init(&e, 4);
    attn_model *other = NULL;
    attn_kv_pool *other_pool = NULL;
    attn_kv *other_kv = NULL;
    ck_assert_int_eq(
        attn_model_create_random(other_cfg != NULL ? other_cfg : &e.hm.cfg, 2, NULL, &other),
        ATTN_OK);
    ck_assert_int_eq(attn_kv_pool_create(other, (size_t)1 << 20, 16, &other_pool), ATTN_OK);
    ck_assert_int_eq(attn_kv_create(other_pool, &other_kv), ATTN_OK);
    attn_step s = good_step(&e);
    s.kv = other_kv;
    ck_assert_int_eq(attn_forward(e.hm.model, 0, e.ws, &s, 1), ATTN_ESHAPE);
    ck_assert_int_eq(attn_kv_len(other_kv), 0);
    attn_kv_destroy(other_kv);
    attn_kv_pool_destroy(other_pool);
    attn_model_destroy(other);
    env_release(&e);
}

/* A cache from the pool of a model with another geometry. */
START_TEST(test_error_eshape_cache_of_other_model) {
    attn_config other_cfg = harness_config(4, 2, 32);
    expect_foreign_cache_is_eshape(&other_cfg);
}
END_TEST

/* attn.h: "a cache from another model's pool" is ATTN_ESHAPE, also when the geometry happens to
 * match (its K/V were made by other weights). */
START_TEST(test_error_eshape_cache_of_same_shaped_model) {
    expect_foreign_cache_is_eshape(NULL);
}
END_TEST

START_TEST(test_error_eio_missing_model) {
    attn_model *m = NULL;
    char err[128];
    ck_assert_int_eq(attn_model_load_hf("tests/data/no_such_model", NULL, &m, err, sizeof(err)),
                     ATTN_EIO);
    ck_assert_ptr_null(m);
}
END_TEST

START_TEST(test_error_enospc_full_pool) {
    err_env e;
    env_init(&e, 1); /* one block of 16 tokens, 5 used */
    attn_step s = good_step(&e);
    s.n_tokens = 8;
    ck_assert_int_eq(attn_forward(e.hm.model, 0, e.ws, &s, 1), ATTN_OK);
    ck_assert_int_eq(attn_forward(e.hm.model, 0, e.ws, &s, 1), ATTN_ENOSPC); /* 13 + 8 > 16 */
    ck_assert_int_eq(attn_kv_len(e.kv), 13);
    env_release(&e);
}
END_TEST

START_TEST(test_error_eunsupported_rope_scaling) {
    attn_model *m = NULL;
    char err[128];
    ck_assert_int_eq(attn_model_load_hf("tests/data/refuse_mrope", NULL, &m, err, sizeof(err)),
                     ATTN_EUNSUPPORTED);
    ck_assert_ptr_null(m);
}
END_TEST

/* ---- bad arguments ------------------------------------------------------------------------- */

/* Each broken forward gives its documented code and leaves the cache at 5 tokens. */
START_TEST(test_error_forward_bad_arguments) {
    err_env e;
    env_init(&e, 4);
    for (int kind = 0; kind < 11; kind++) {
        attn_step s = good_step(&e);
        int32_t layer = 0;
        const attn_step *steps = &s;
        int32_t n_steps = 1;
        attn_workspace *ws = e.ws;
        int32_t pos[2] = {5, -1};
        int want = ATTN_EINVAL;
        switch (kind) {
        case 0:
            s.kv = NULL;
            break;
        case 1:
            s.x = NULL;
            break;
        case 2:
            s.out = NULL;
            break;
        case 3:
            s.n_tokens = 0;
            break;
        case 4:
            s.n_tokens = -3;
            break;
        case 5:
            layer = 1; /* the model has one layer */
            break;
        case 6:
            layer = -1;
            break;
        case 7:
            steps = NULL;
            break;
        case 8:
            ws = NULL;
            break;
        case 9:
            s.positions = pos;
            want = ATTN_ERANGE;
            break;
        default:
            s.n_tokens = 60;
            want = ATTN_ERANGE; /* 5 + 60 > max_seq 64 */
            break;
        }
        int rc = attn_forward(e.hm.model, layer, ws, steps, n_steps);
        ck_assert_msg(rc == want, "bad forward kind %d: got %d (%s), want %d (%s)", kind, rc,
                      attn_strerror(rc), want, attn_strerror(want));
        ck_assert_msg(attn_kv_len(e.kv) == 5, "bad forward kind %d changed the cache length", kind);
    }
    attn_step s = good_step(&e);
    ck_assert_int_eq(attn_forward(e.hm.model, 0, e.ws, &s, 1), ATTN_OK);
    ck_assert_int_eq(attn_kv_len(e.kv), 7);
    env_release(&e);
}
END_TEST

/* A workspace sized for a small model must not be usable with a larger one (its buffers would
 * overflow); attn.h names no code, so any failure passes, but not success. */
START_TEST(test_error_workspace_of_other_model) {
    err_env e;
    env_init(&e, 4);
    attn_config big_cfg = harness_config(8, 8, 64);
    big_cfg.hidden_size = 256;
    attn_model *big = NULL;
    attn_kv_pool *pool = NULL;
    attn_kv *kv = NULL;
    ck_assert_int_eq(attn_model_create_random(&big_cfg, 3, NULL, &big), ATTN_OK);
    ck_assert_int_eq(attn_kv_pool_create(big, (size_t)4 << 20, 16, &pool), ATTN_OK);
    ck_assert_int_eq(attn_kv_create(pool, &kv), ATTN_OK);
    float *x = harness_random_x(4, 8, 256);
    float *out = harness_calloc((size_t)8 * 256, sizeof(float));
    attn_step s = {kv, x, 8, NULL, NULL, out, NULL, NULL, NULL, 0, NULL, NULL, 0};
    int rc = attn_forward(big, 0, e.ws, &s, 1);
    ck_assert_msg(rc == ATTN_EINVAL || rc == ATTN_ESHAPE,
                  "forward with another model's workspace: got %d (%s)", rc, attn_strerror(rc));
    ck_assert_int_eq(attn_kv_len(kv), 0);
    free(out);
    free(x);
    attn_kv_destroy(kv);
    attn_kv_pool_destroy(pool);
    attn_model_destroy(big);
    env_release(&e);
}
END_TEST

START_TEST(test_error_workspace_and_cache_create_bad_arguments) {
    err_env e;
    env_init(&e, 4);
    attn_workspace *ws_sentinel = (attn_workspace *)&e;
    attn_workspace *ws = ws_sentinel;
    ck_assert_int_eq(attn_workspace_create(NULL, 8, NULL, &ws), ATTN_EINVAL);
    ck_assert_int_eq(attn_workspace_create(e.hm.model, 0, NULL, &ws), ATTN_EINVAL);
    ck_assert_int_eq(attn_workspace_create(e.hm.model, -1, NULL, &ws), ATTN_EINVAL);
    ck_assert_int_eq(attn_workspace_create(e.hm.model, 8, NULL, NULL), ATTN_EINVAL);
    ck_assert_ptr_eq(ws, ws_sentinel);
    ck_assert_int_eq(attn_workspace_max_tokens(e.ws), 8);
    attn_workspace_destroy(NULL);

    attn_kv *kv_sentinel = (attn_kv *)&e;
    attn_kv *kv = kv_sentinel;
    ck_assert_int_eq(attn_kv_create(NULL, &kv), ATTN_EINVAL);
    ck_assert_int_eq(attn_kv_create(e.pool, NULL), ATTN_EINVAL);
    ck_assert_int_eq(attn_kv_fork(NULL, &kv), ATTN_EINVAL);
    ck_assert_int_eq(attn_kv_fork(e.kv, NULL), ATTN_EINVAL);
    ck_assert_ptr_eq(kv, kv_sentinel);
    ck_assert_int_eq(attn_kv_pool_blocks_free(e.pool), 3);
    env_release(&e);
}
END_TEST

START_TEST(test_error_load_bad_arguments) {
    attn_model *m = NULL;
    char err[64];
    ck_assert_int_eq(attn_model_load_hf(NULL, NULL, &m, err, sizeof(err)), ATTN_EINVAL);
    ck_assert_int_eq(attn_model_load_hf("tests/data/hf_tiny_f32", NULL, NULL, err, sizeof(err)),
                     ATTN_EINVAL);
    ck_assert_ptr_null(m);
}
END_TEST

/* `extern` keeps this prototype out of the Makefile's suite-table scan, which matches lines
 * starting with `Suite *`. */
extern Suite *error_suite(void);

Suite *error_suite(void) {
    Suite *s = suite_create("error");
    TCase *tc = tcase_create("error");
    tcase_add_test(tc, test_error_strerror_every_code);
    tcase_add_test(tc, test_error_einval_null_model);
    tcase_add_test(tc, test_error_enomem_pool_budget);
    tcase_add_test(tc, test_error_erange_position);
    tcase_add_test(tc, test_error_eshape_cache_of_other_model);
    tcase_add_test(tc, test_error_eshape_cache_of_same_shaped_model);
    tcase_add_test(tc, test_error_eio_missing_model);
    tcase_add_test(tc, test_error_enospc_full_pool);
    tcase_add_test(tc, test_error_eunsupported_rope_scaling);
    tcase_add_test(tc, test_error_forward_bad_arguments);
    tcase_add_test(tc, test_error_workspace_of_other_model);
    tcase_add_test(tc, test_error_workspace_and_cache_create_bad_arguments);
    tcase_add_test(tc, test_error_load_bad_arguments);
    suite_add_tcase(s, tc);
    return s;
}
