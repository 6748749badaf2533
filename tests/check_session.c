/* tests/check_session.c: server/session.c: the session table with an LRU of capacity 2, pins,
 * bounded tombstones, reservations in the one KV pool (evicting the least recently used idle
 * sessions, never pinned ones), TTL expiry, fork and truncate. Caches are filled with real engine
 * forwards on the tiny preset. */
#include <check.h>
#include <stdlib.h>
#include <string.h>

#include "../engine/attn.h"
#include "../server/error.h"
#include "../server/log.h"
#include "../server/session.h"

/* Per test (CK_FORK): the tiny preset model and a workspace to fill caches with. */
static attn_model *model;
static attn_workspace *ws;
static struct session_store *st;

/* tiny: 2 kv heads x head_dim 16, so a block of 16 tokens holds 16 * 2 * 16 * 2 floats. */
#define BLOCK_TOKENS 16
#define BLOCK_BYTES  (16 * 2 * 16 * 2 * 4)

static void setup(void) {
    log_set_level(LOG_LEVEL_WARN); /* evictions are logged at info; keep the test output quiet */
    attn_config cfg;
    ck_assert_int_eq(attn_config_preset("tiny", &cfg), ATTN_OK);
    ck_assert_int_eq(attn_model_create_random(&cfg, 7, NULL, &model), ATTN_OK);
    ck_assert_int_eq(attn_workspace_create(model, 64, NULL, &ws), ATTN_OK);
    st = NULL;
}

static void teardown(void) {
    session_store_destroy(st);
    attn_workspace_destroy(ws);
    attn_model_destroy(model);
}

static void make_store(int32_t blocks, int32_t max_sessions, int32_t max_tombstones) {
    struct session_store_params p = {
        .model = model,
        .budget_bytes = (size_t)blocks * BLOCK_BYTES,
        .block_tokens = BLOCK_TOKENS,
        .max_sessions = max_sessions,
        .max_tombstones = max_tombstones,
    };
    ck_assert_int_eq(session_store_create(&p, &st), 0);
}

static struct session *create(const char *id, int64_t now) {
    struct session *s = NULL;
    int rc = session_create(st, id, now, &s);
    ck_assert_msg(rc == 0, "create %s: %d", id, rc);
    return s;
}

static enum session_state state_of(const char *id) {
    enum session_state state;
    session_find(st, id, &state);
    return state;
}

/* What a job does around its work on s: pin it (at time now) and take its turn. */
static struct session_turn *hold(struct session *s, int64_t now) {
    session_pin(st, s, now);
    struct session_turn *t = session_turn_take(st, s);
    ck_assert_ptr_nonnull(t);
    return t;
}

/* ...and then give the turn back and unpin. */
static void let_go(struct session_turn *t, int64_t now) {
    struct session *s = session_turn_session(t);
    session_turn_give(st, t);
    session_unpin(st, s, now);
}

/* Appends n tokens to the session's cache for `layer` with a real forward, holding its turn and
 * its blocks reserved first, as pool.c does (which also makes it the most recently used). */
static void fill(struct session *s, int32_t layer, int32_t n) {
    struct session_turn *t = hold(s, 0);
    attn_kv *kv;
    ck_assert_int_eq(session_kv_get(st, t, layer, &kv), 0);
    ck_assert_int_eq(session_kv_reserve(st, kv, n), 0);
    float *x = calloc((size_t)n * 64, sizeof(float));
    float *out = calloc((size_t)n * 64, sizeof(float));
    for (int32_t i = 0; i < n * 64; i++) {
        x[i] = (float)((i * 37) % 17) / 17.0f - 0.5f;
    }
    attn_step step = {.kv = kv, .x = x, .n_tokens = n, .out = out};
    ck_assert_int_eq(attn_forward(model, layer, ws, &step, 1), ATTN_OK);
    session_kv_unreserve(kv);
    session_refresh(t);
    let_go(t, 0);
    free(x);
    free(out);
}

static int32_t free_blocks(void) {
    return attn_kv_pool_blocks_free(session_store_kv_pool(st));
}

START_TEST(test_session_lru_capacity_two) {
    make_store(64, 2, 16);
    struct session *a = create("a", 0);
    fill(a, 0, 1); /* a session with no cache would go with its last pin */
    fill(create("b", 1), 0, 1);
    /* Using a makes b the least recently used. */
    session_pin(st, a, 2);
    session_unpin(st, a, 3);
    create("c", 4);
    ck_assert_int_eq(state_of("a"), SESSION_STATE_LIVE);
    ck_assert_int_eq(state_of("b"), SESSION_STATE_TOMBSTONE);
    ck_assert_int_eq(state_of("c"), SESSION_STATE_LIVE);
    struct session_store_stats stats;
    session_store_get_stats(st, &stats);
    ck_assert_int_eq(stats.n_sessions, 2);
    ck_assert_uint_eq(stats.evictions[SESSION_EVICT_MAX_SESSIONS], 1);
    /* Most recently used first. */
    ck_assert_str_eq(session_id(session_store_first(st)), "c");
    ck_assert_str_eq(session_id(session_next(session_store_first(st))), "a");
}
END_TEST

START_TEST(test_session_pinned_is_never_evicted) {
    make_store(64, 2, 16);
    struct session *a = create("a", 0);
    struct session *b = create("b", 1);
    fill(a, 0, 1);
    fill(b, 0, 1);
    session_pin(st, a, 2);
    session_pin(st, b, 3);
    struct session *c = NULL;
    ck_assert_int_eq(session_create(st, "c", 4, &c), ERROR_KV_BUDGET_EXHAUSTED);
    ck_assert_ptr_null(c);
    /* b becomes idle: it goes, although a is older, because a is pinned. */
    session_unpin(st, b, 5);
    create("c", 6);
    ck_assert_int_eq(state_of("a"), SESSION_STATE_LIVE);
    ck_assert_int_eq(state_of("b"), SESSION_STATE_TOMBSTONE);
    ck_assert_int_eq(session_pins(a), 1);
    ck_assert_int_eq(session_idle_ms(a, 100), 0);
    session_unpin(st, a, 7);
    ck_assert_int_eq(session_idle_ms(a, 100), 93);
}
END_TEST

START_TEST(test_session_tombstones_are_bounded) {
    make_store(64, 2, 2);
    create("x", 0);
    create("y", 1);
    create("z", 2); /* evicts x */
    create("w", 3); /* evicts y */
    create("v", 4); /* evicts z; the ring of 2 forgets x */
    ck_assert_int_eq(state_of("x"), SESSION_STATE_UNKNOWN);
    ck_assert_int_eq(state_of("y"), SESSION_STATE_TOMBSTONE);
    ck_assert_int_eq(state_of("z"), SESSION_STATE_TOMBSTONE);
    /* A tombstoned id cannot silently restart; an existing one cannot be created twice. */
    struct session *s;
    ck_assert_int_eq(session_create(st, "y", 5, &s), ERROR_SESSION_EVICTED);
    ck_assert_int_eq(session_create(st, "v", 5, &s), ERROR_SESSION_EXISTS);
    ck_assert(session_tombstone_forget(st, "y"));
    ck_assert(!session_tombstone_forget(st, "y"));
    ck_assert_int_eq(state_of("y"), SESSION_STATE_UNKNOWN);
    /* After a forget the ring keeps working: new tombstones still push out the oldest. */
    create("y", 6); /* evicts w */
    create("u", 7); /* evicts v */
    ck_assert_int_eq(state_of("w"), SESSION_STATE_TOMBSTONE);
    ck_assert_int_eq(state_of("v"), SESSION_STATE_TOMBSTONE);
    ck_assert_int_eq(state_of("z"), SESSION_STATE_UNKNOWN);
}
END_TEST

START_TEST(test_session_reserve_evicts_lru_idle) {
    make_store(8, 16, 16);
    struct session *a = create("a", 0);
    struct session *b = create("b", 1);
    fill(a, 0, 3 * BLOCK_TOKENS); /* 3 blocks */
    fill(b, 1, 3 * BLOCK_TOKENS); /* 3 blocks */
    session_pin(st, a, 2);        /* touch a: b is now the LRU one */
    session_unpin(st, a, 3);
    struct session *r = create("r", 4);
    struct session_turn *rt = hold(r, 4); /* as its job would */
    attn_kv *kv;
    ck_assert_int_eq(session_kv_get(st, rt, 0, &kv), 0);
    ck_assert_int_eq(free_blocks(), 2);
    /* Too much even with every idle session gone: nobody is evicted, nothing is taken. */
    ck_assert_int_eq(session_kv_reserve(st, kv, 9 * BLOCK_TOKENS), ERROR_KV_BUDGET_EXHAUSTED);
    /* Past max_seq (1024): the engine's refusal, and nobody is evicted for it either. */
    ck_assert_int_eq(session_kv_reserve(st, kv, 1025), ATTN_ERANGE);
    ck_assert_int_eq(state_of("a"), SESSION_STATE_LIVE);
    ck_assert_int_eq(state_of("b"), SESSION_STATE_LIVE);
    ck_assert_int_eq(free_blocks(), 2);
    /* 4 blocks: evicting b (the LRU) is enough, a stays; r holds them, still empty. */
    ck_assert_int_eq(session_kv_reserve(st, kv, 4 * BLOCK_TOKENS), 0);
    ck_assert_int_eq(state_of("b"), SESSION_STATE_TOMBSTONE);
    ck_assert_int_eq(state_of("a"), SESSION_STATE_LIVE);
    ck_assert_int_eq(free_blocks(), 1);
    ck_assert_int_eq(attn_kv_len(kv), 0);
    ck_assert_uint_eq(attn_kv_bytes(kv), 4 * BLOCK_BYTES);
    session_kv_unreserve(kv);
    ck_assert_int_eq(free_blocks(), 5);
    /* A pinned session does not count as reclaimable. */
    session_pin(st, a, 5);
    ck_assert_int_eq(session_kv_reserve(st, kv, 6 * BLOCK_TOKENS), ERROR_KV_BUDGET_EXHAUSTED);
    ck_assert_int_eq(state_of("a"), SESSION_STATE_LIVE);
    session_unpin(st, a, 6);
    let_go(rt, 6); /* r keeps its (empty) cache, so it stays */
    struct session_store_stats stats;
    session_store_get_stats(st, &stats);
    ck_assert_uint_eq(stats.evictions[SESSION_EVICT_BUDGET], 1);
    ck_assert_int_eq(stats.blocks_used, 3);
    ck_assert_uint_eq(stats.bytes_used, 3 * BLOCK_BYTES);
    ck_assert_int_eq(session_n_tokens(a), 3 * BLOCK_TOKENS);
    ck_assert_uint_eq(session_bytes(a), 3 * BLOCK_BYTES);
}
END_TEST

/* The pool is shared: eviction goes by recency over every idle session, however they were
 * created, and one session may grow to the whole pool. */
START_TEST(test_session_one_session_may_take_the_whole_pool) {
    make_store(8, 16, 16);
    struct session *a = create("a", 0);
    struct session *b = create("b", 1);
    struct session *c = create("c", 2);
    fill(a, 0, 2 * BLOCK_TOKENS);
    fill(b, 0, 2 * BLOCK_TOKENS);
    fill(c, 0, 2 * BLOCK_TOKENS);
    session_pin(st, a, 3); /* a is used again: b, then c, are the least recently used */
    session_unpin(st, a, 4);
    /* a grows by 3 blocks (2 free): b goes, c stays. */
    fill(a, 1, 3 * BLOCK_TOKENS);
    ck_assert_int_eq(state_of("b"), SESSION_STATE_TOMBSTONE);
    ck_assert_int_eq(state_of("c"), SESSION_STATE_LIVE);
    /* a takes the rest: c goes, and a holds all 8 blocks. */
    fill(a, 1, 3 * BLOCK_TOKENS);
    ck_assert_int_eq(state_of("c"), SESSION_STATE_TOMBSTONE);
    ck_assert_uint_eq(session_bytes(a), 8 * BLOCK_BYTES);
    ck_assert_int_eq(free_blocks(), 0);
    struct session_store_stats stats;
    session_store_get_stats(st, &stats);
    ck_assert_int_eq(stats.blocks_used, 8);
    ck_assert_uint_eq(stats.evictions[SESSION_EVICT_BUDGET], 2);
}
END_TEST

START_TEST(test_session_fork_and_truncate) {
    make_store(32, 16, 16);
    struct session *a = create("a", 0);
    fill(a, 0, 20);
    fill(a, 1, 20);
    struct session_turn *t = hold(a, 1); /* as a fork job would */
    struct session *c = NULL;
    ck_assert_int_eq(session_fork(st, t, "c", 2, &c), 0);
    ck_assert_int_eq(session_n_tokens(c), 20);
    ck_assert_int_eq(session_n_layers_used(c), 2);
    /* The copy holds the same keys and values in blocks of its own. */
    float k1[2 * 20 * 16], v1[2 * 20 * 16], k2[2 * 20 * 16], v2[2 * 20 * 16];
    ck_assert_int_eq(attn_kv_read(session_kv_find(a, 1), 0, 20, k1, v1), ATTN_OK);
    ck_assert_int_eq(attn_kv_read(session_kv_find(c, 1), 0, 20, k2, v2), ATTN_OK);
    ck_assert_mem_eq(k1, k2, sizeof k1);
    ck_assert_mem_eq(v1, v2, sizeof v1);
    ck_assert_int_eq(session_fork(st, t, "c", 3, &c), ERROR_SESSION_EXISTS);
    /* Truncate one layer, then all of them; the copy is unaffected. */
    ck_assert_int_eq(session_truncate(st, t, 1, 7), 0);
    struct session_layer_stat ls;
    session_layer_at(a, 1, &ls);
    ck_assert_int_eq(ls.layer, 1);
    ck_assert_int_eq(ls.n_tokens, 7);
    ck_assert_int_eq(ls.n_held, 7);
    ck_assert_int_eq(ls.window, 0);
    ck_assert_int_eq(session_truncate(st, t, 1, 8), ERROR_INVALID_REQUEST);
    ck_assert_int_eq(session_truncate(st, t, -1, 21), ERROR_INVALID_REQUEST);
    ck_assert_int_eq(session_truncate(st, t, -1, 5), 0);
    session_layer_at(a, 0, &ls);
    ck_assert_int_eq(ls.n_tokens, 5);
    ck_assert_uint_eq(ls.bytes, BLOCK_BYTES);
    ck_assert_int_eq(session_n_tokens(a), 5);
    ck_assert_int_eq(session_n_tokens(c), 20);
    let_go(t, 4);
}
END_TEST

START_TEST(test_session_fork_evicts_others_but_not_source) {
    make_store(8, 16, 16);
    struct session *old = create("old", 0);
    fill(old, 0, 3 * BLOCK_TOKENS);
    struct session *a = create("a", 1);
    fill(a, 0, 3 * BLOCK_TOKENS);
    struct session_turn *t = hold(a, 2);
    struct session *c;
    /* 2 free, the copy needs 3: "old" goes. */
    ck_assert_int_eq(session_fork(st, t, "copy", 3, &c), 0);
    ck_assert_int_eq(state_of("old"), SESSION_STATE_TOMBSTONE);
    /* Now 2 free and only pinned a plus idle copy: another copy fits after evicting "copy"... */
    ck_assert_int_eq(session_fork(st, t, "copy2", 4, &c), 0);
    ck_assert_int_eq(state_of("copy"), SESSION_STATE_TOMBSTONE);
    /* ...but never by evicting the source itself (copy2 is pinned here, so only a could make
     * room). */
    session_pin(st, c, 6);
    ck_assert_int_eq(session_fork(st, t, "copy3", 7, &c),
                     ATTN_ENOSPC); /* the pool: room, not the count */
    ck_assert_int_eq(state_of("copy3"), SESSION_STATE_UNKNOWN);
    ck_assert_int_eq(state_of("a"), SESSION_STATE_LIVE);
    ck_assert_int_eq(session_n_tokens(a), 3 * BLOCK_TOKENS);
    session_unpin(st, session_find(st, "copy2", NULL), 8);
    let_go(t, 8);
}
END_TEST

/* A forward on reserved blocks leaves the pool's accounting alone (what lets a worker run it
 * while the loop thread uses the pool); a temporary cache's reservation counts like any other. */
START_TEST(test_session_reserved_forward_leaves_the_pool_alone) {
    make_store(8, 16, 16);
    attn_kv *kv;
    ck_assert_int_eq(attn_kv_create(session_store_kv_pool(st), &kv), ATTN_OK);
    ck_assert_int_eq(session_kv_reserve(st, kv, 40), 0); /* 3 blocks */
    ck_assert_int_eq(free_blocks(), 5);
    float x[20 * 64], out[20 * 64];
    for (int32_t i = 0; i < 20 * 64; i++) {
        x[i] = (float)(i % 13) / 13.0f - 0.5f;
    }
    attn_step step = {.kv = kv, .x = x, .n_tokens = 20, .out = out};
    ck_assert_int_eq(attn_forward(model, 0, ws, &step, 1), ATTN_OK);
    ck_assert_int_eq(free_blocks(), 5);
    ck_assert_int_eq(attn_kv_len(kv), 20);
    /* The blocks reserved but not filled go back; the filled ones stay. */
    session_kv_unreserve(kv);
    ck_assert_int_eq(free_blocks(), 6);
    ck_assert_uint_eq(attn_kv_bytes(kv), 2 * BLOCK_BYTES);
    /* An idle session makes room for the temporary cache. */
    struct session *a = create("a", 0);
    fill(a, 0, 5 * BLOCK_TOKENS);
    ck_assert_int_eq(free_blocks(), 1);
    ck_assert_int_eq(session_kv_reserve(st, kv, 2 * BLOCK_TOKENS), 0);
    ck_assert_int_eq(state_of("a"), SESSION_STATE_TOMBSTONE);
    attn_kv_destroy(kv);
    ck_assert_int_eq(free_blocks(), 8);
}
END_TEST

START_TEST(test_session_ttl_expiry) {
    make_store(16, 16, 16);
    create("old", 0);
    create("new", 500);
    struct session *busy = create("busy", 0);
    session_pin(st, busy, 0);
    ck_assert_int_eq(session_store_expire(st, 1000, 600), 1);
    ck_assert_int_eq(state_of("old"), SESSION_STATE_TOMBSTONE);
    ck_assert_int_eq(state_of("new"), SESSION_STATE_LIVE);
    ck_assert_int_eq(state_of("busy"), SESSION_STATE_LIVE);
    struct session_store_stats stats;
    session_store_get_stats(st, &stats);
    ck_assert_uint_eq(stats.evictions[SESSION_EVICT_TTL], 1);
    session_unpin(st, busy, 0);
}
END_TEST

START_TEST(test_session_clear_and_drop_empty_layers) {
    make_store(16, 16, 16);
    struct session *a = create("a", 0);
    fill(a, 0, BLOCK_TOKENS);
    struct session *b = create("b", 1);
    struct session_store_stats stats;
    session_store_get_stats(st, &stats);
    ck_assert_int_eq(stats.n_sessions, 2);
    ck_assert_int_eq(stats.blocks_total, 16);
    ck_assert_int_eq(stats.blocks_used, 1);
    ck_assert_int_eq(stats.block_tokens, BLOCK_TOKENS);
    ck_assert_uint_eq(stats.bytes_limit, 16 * BLOCK_BYTES);
    /* clear keeps the session, empty, while a job of it holds its turn or a pin... */
    struct session_turn *t = hold(a, 2);
    session_pin(st, a, 2); /* a later request of a, queued */
    session_clear(st, t);
    ck_assert_int_eq(session_n_layers_used(a), 0);
    ck_assert_int_eq(free_blocks(), 16);
    let_go(t, 3);
    ck_assert_int_eq(state_of("a"), SESSION_STATE_LIVE);
    /* ...and it goes with the last of them: no cache, no pin, no turn. */
    session_unpin(st, a, 4);
    ck_assert_int_eq(state_of("a"), SESSION_STATE_UNKNOWN);
    /* An empty layer left by a failed first call is dropped, and the session with it when that
     * call was all it had (as after a failed first request). */
    attn_kv *kv;
    t = hold(b, 5);
    ck_assert_int_eq(session_kv_get(st, t, 1, &kv), 0);
    ck_assert_int_eq(session_n_layers_used(b), 1);
    session_drop_layer_if_empty(t, 0); /* another layer: nothing happens */
    ck_assert_int_eq(session_n_layers_used(b), 1);
    session_drop_layer_if_empty(t, 1);
    ck_assert_int_eq(session_n_layers_used(b), 0);
    ck_assert_int_eq(session_kv_get(st, t, 2, &kv), ATTN_EINVAL);
    let_go(t, 6);
    ck_assert_int_eq(state_of("b"), SESSION_STATE_UNKNOWN);
}
END_TEST

/* One turn per session: a second job of the same session cannot get one while the first holds
 * it, and a session whose turn is held is never evicted or expired, pins or not. */
START_TEST(test_session_turn_is_exclusive_and_protects) {
    make_store(4, 1, 16);
    struct session *a = create("a", 0);
    struct session_turn *t = hold(a, 0);
    session_pin(st, a, 0);
    ck_assert_ptr_null(session_turn_take(st, a));
    session_unpin(st, a, 0);
    attn_kv *kv;
    ck_assert_int_eq(session_kv_get(st, t, 0, &kv), 0);
    ck_assert_int_eq(session_store_expire(st, 1000000, 1), 0);
    struct session *b = NULL;
    ck_assert_int_eq(session_create(st, "b", 1, &b), ERROR_KV_BUDGET_EXHAUSTED);
    ck_assert_int_eq(state_of("a"), SESSION_STATE_LIVE);
    let_go(t, 2);
    ck_assert_int_eq(state_of("a"), SESSION_STATE_LIVE); /* it keeps its (empty) cache */
    ck_assert_int_eq(session_store_expire(st, 1000000, 1), 1);
}
END_TEST

/* check_main.c is given every suite by a table generated from the definitions below, each line
 * starting with `Suite *`. */
extern Suite *session_suite(void);

Suite *session_suite(void) {
    Suite *s = suite_create("session");
    TCase *tc = tcase_create("table");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_add_test(tc, test_session_lru_capacity_two);
    tcase_add_test(tc, test_session_pinned_is_never_evicted);
    tcase_add_test(tc, test_session_tombstones_are_bounded);
    tcase_add_test(tc, test_session_reserve_evicts_lru_idle);
    tcase_add_test(tc, test_session_one_session_may_take_the_whole_pool);
    tcase_add_test(tc, test_session_fork_and_truncate);
    tcase_add_test(tc, test_session_fork_evicts_others_but_not_source);
    tcase_add_test(tc, test_session_reserved_forward_leaves_the_pool_alone);
    tcase_add_test(tc, test_session_ttl_expiry);
    tcase_add_test(tc, test_session_clear_and_drop_empty_layers);
    tcase_add_test(tc, test_session_turn_is_exclusive_and_protects);
    suite_add_tcase(s, tc);
    return s;
}
