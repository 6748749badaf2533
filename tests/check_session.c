/* tests/check_session.c: server/session.c: the session table with an LRU of capacity 2, pins,
 * bounded tombstones, eviction to make room in a shard, TTL expiry, fork and truncate, and frees
 * deferred while a shard is held. Caches are filled with real engine forwards on the tiny
 * preset. */
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

static void make_store(int32_t n_shards, int32_t blocks_per_shard, int32_t max_sessions,
                       int32_t max_tombstones) {
    struct session_store_params p = {
        .model = model,
        .budget_bytes = (size_t)n_shards * blocks_per_shard * BLOCK_BYTES,
        .n_shards = n_shards,
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

/* Appends n tokens to the session's cache for `layer` with a real forward, holding the shard as
 * a worker would. */
static void fill(struct session *s, int32_t layer, int32_t n) {
    attn_kv *kv;
    ck_assert_int_eq(session_kv_get(st, s, layer, &kv), 0);
    session_shard_acquire(st, session_shard(s));
    float *x = calloc((size_t)n * 64, sizeof(float));
    float *out = calloc((size_t)n * 64, sizeof(float));
    for (int32_t i = 0; i < n * 64; i++) {
        x[i] = (float)((i * 37) % 17) / 17.0f - 0.5f;
    }
    attn_step step = {.kv = kv, .x = x, .n_tokens = n, .out = out};
    ck_assert_int_eq(attn_forward(model, layer, ws, &step, 1), ATTN_OK);
    session_shard_release(st, session_shard(s));
    session_refresh(s);
    free(x);
    free(out);
}

static int32_t free_blocks(int32_t shard) {
    return attn_kv_pool_blocks_free(session_shard_pool(st, shard));
}

START_TEST(test_session_lru_capacity_two) {
    make_store(1, 64, 2, 16);
    struct session *a = create("a", 0);
    create("b", 1);
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
    make_store(1, 64, 2, 16);
    struct session *a = create("a", 0);
    struct session *b = create("b", 1);
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
    make_store(1, 64, 2, 2);
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

START_TEST(test_session_make_room_evicts_lru_idle) {
    make_store(1, 8, 16, 16);
    struct session *a = create("a", 0);
    struct session *b = create("b", 1);
    fill(a, 0, 3 * BLOCK_TOKENS); /* 3 blocks */
    fill(b, 1, 3 * BLOCK_TOKENS); /* 3 blocks */
    session_pin(st, a, 2);        /* touch a: b is now the LRU one */
    session_unpin(st, a, 3);
    ck_assert_int_eq(free_blocks(0), 2);
    /* Too much even with every idle session gone: nobody is evicted. */
    ck_assert_int_eq(session_shard_make_room(st, 0, 9), ERROR_KV_BUDGET_EXHAUSTED);
    ck_assert_int_eq(state_of("a"), SESSION_STATE_LIVE);
    ck_assert_int_eq(state_of("b"), SESSION_STATE_LIVE);
    /* 4 blocks: evicting b (the LRU) is enough, a stays. */
    ck_assert_int_eq(session_shard_make_room(st, 0, 4), 0);
    ck_assert_int_eq(state_of("b"), SESSION_STATE_TOMBSTONE);
    ck_assert_int_eq(state_of("a"), SESSION_STATE_LIVE);
    ck_assert_int_eq(free_blocks(0), 5);
    /* A pinned session does not count as reclaimable. */
    session_pin(st, a, 4);
    ck_assert_int_eq(session_shard_make_room(st, 0, 6), ERROR_KV_BUDGET_EXHAUSTED);
    ck_assert_int_eq(state_of("a"), SESSION_STATE_LIVE);
    session_unpin(st, a, 5);
    struct session_store_stats stats;
    session_store_get_stats(st, &stats);
    ck_assert_uint_eq(stats.evictions[SESSION_EVICT_BUDGET], 1);
    ck_assert_int_eq(stats.blocks_used, 3);
    ck_assert_uint_eq(stats.bytes_used, 3 * BLOCK_BYTES);
    ck_assert_int_eq(session_n_tokens(a), 3 * BLOCK_TOKENS);
    ck_assert_uint_eq(session_bytes(a), 3 * BLOCK_BYTES);
}
END_TEST

START_TEST(test_session_fork_and_truncate) {
    make_store(1, 32, 16, 16);
    struct session *a = create("a", 0);
    fill(a, 0, 20);
    fill(a, 1, 20);
    session_pin(st, a, 1); /* as a fork job would */
    struct session *c = NULL;
    ck_assert_int_eq(session_fork(st, a, "c", 2, &c), 0);
    ck_assert_int_eq(session_n_tokens(c), 20);
    ck_assert_int_eq(session_n_layers_used(c), 2);
    ck_assert_int_eq(session_shard(c), session_shard(a));
    /* The copy holds the same keys and values in blocks of its own. */
    float k1[2 * 20 * 16], v1[2 * 20 * 16], k2[2 * 20 * 16], v2[2 * 20 * 16];
    ck_assert_int_eq(attn_kv_read(session_kv_find(a, 1), 0, 20, k1, v1), ATTN_OK);
    ck_assert_int_eq(attn_kv_read(session_kv_find(c, 1), 0, 20, k2, v2), ATTN_OK);
    ck_assert_mem_eq(k1, k2, sizeof k1);
    ck_assert_mem_eq(v1, v2, sizeof v1);
    ck_assert_int_eq(session_fork(st, a, "c", 3, &c), ERROR_SESSION_EXISTS);
    /* Truncate one layer, then all of them; the copy is unaffected. */
    ck_assert_int_eq(session_truncate(st, a, 1, 7), 0);
    int32_t layer, n;
    size_t bytes;
    session_layer_at(a, 1, &layer, &n, &bytes);
    ck_assert_int_eq(layer, 1);
    ck_assert_int_eq(n, 7);
    ck_assert_int_eq(session_truncate(st, a, 1, 8), ERROR_INVALID_REQUEST);
    ck_assert_int_eq(session_truncate(st, a, -1, 21), ERROR_INVALID_REQUEST);
    ck_assert_int_eq(session_truncate(st, a, -1, 5), 0);
    session_layer_at(a, 0, &layer, &n, &bytes);
    ck_assert_int_eq(n, 5);
    ck_assert_uint_eq(bytes, BLOCK_BYTES);
    ck_assert_int_eq(session_n_tokens(a), 5);
    ck_assert_int_eq(session_n_tokens(c), 20);
    session_unpin(st, a, 4);
}
END_TEST

START_TEST(test_session_fork_evicts_others_but_not_source) {
    make_store(1, 8, 16, 16);
    struct session *old = create("old", 0);
    fill(old, 0, 3 * BLOCK_TOKENS);
    struct session *a = create("a", 1);
    fill(a, 0, 3 * BLOCK_TOKENS);
    session_pin(st, a, 2);
    struct session *c;
    /* 2 free, the copy needs 3: "old" goes. */
    ck_assert_int_eq(session_fork(st, a, "copy", 3, &c), 0);
    ck_assert_int_eq(state_of("old"), SESSION_STATE_TOMBSTONE);
    /* Now 2 free and only pinned a plus idle copy: another copy fits after evicting "copy"... */
    ck_assert_int_eq(session_fork(st, a, "copy2", 4, &c), 0);
    ck_assert_int_eq(state_of("copy"), SESSION_STATE_TOMBSTONE);
    /* ...but never by evicting the source itself. */
    ck_assert_int_eq(session_shard_make_room(st, 0, 8), ERROR_KV_BUDGET_EXHAUSTED);
    ck_assert_int_eq(state_of("a"), SESSION_STATE_LIVE);
    session_unpin(st, a, 5);
}
END_TEST

START_TEST(test_session_busy_shard_defers_frees) {
    make_store(1, 8, 16, 16);
    struct session *a = create("a", 0);
    fill(a, 0, 2 * BLOCK_TOKENS);
    ck_assert_int_eq(free_blocks(0), 6);
    session_shard_acquire(st, 0);
    ck_assert(session_shard_is_busy(st, 0));
    ck_assert_int_eq(session_shard_pick_idle(st), -1);
    session_remove(st, a);
    /* A worker may be using the pool: the blocks come back only on release. */
    ck_assert_int_eq(free_blocks(0), 6);
    ck_assert_int_eq(state_of("a"), SESSION_STATE_UNKNOWN);
    session_shard_release(st, 0);
    ck_assert_int_eq(free_blocks(0), 8);
    ck_assert_int_eq(session_shard_pick_idle(st), 0);
}
END_TEST

START_TEST(test_session_ttl_expiry) {
    make_store(1, 16, 16, 16);
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

START_TEST(test_session_shards_spread_and_clear) {
    make_store(2, 8, 16, 16);
    struct session *a = create("a", 0);
    ck_assert_int_eq(session_shard(a), 0);
    fill(a, 0, BLOCK_TOKENS);
    struct session *b = create("b", 1);
    ck_assert_int_eq(session_shard(b), 1); /* the shard with fewer sessions */
    /* One session each: the shard with more free blocks (a's holds one block), then the
     * emptier one by count. */
    ck_assert_int_eq(session_shard(create("c", 2)), 1);
    ck_assert_int_eq(session_shard(create("d", 3)), 0);
    struct session_store_stats stats;
    session_store_get_stats(st, &stats);
    ck_assert_int_eq(stats.n_shards, 2);
    ck_assert_int_eq(stats.blocks_total, 16);
    ck_assert_uint_eq(stats.bytes_limit, 16 * BLOCK_BYTES);
    /* clear keeps the session, empty. */
    session_clear(st, a);
    ck_assert_int_eq(session_n_layers_used(a), 0);
    ck_assert_int_eq(free_blocks(0), 8);
    ck_assert_int_eq(state_of("a"), SESSION_STATE_LIVE);
    /* An empty layer left by a failed first call is dropped. */
    attn_kv *kv;
    ck_assert_int_eq(session_kv_get(st, b, 1, &kv), 0);
    ck_assert_int_eq(session_n_layers_used(b), 1);
    session_drop_empty_layers(st, b);
    ck_assert_int_eq(session_n_layers_used(b), 0);
    ck_assert_int_eq(session_kv_get(st, b, 2, &kv), ATTN_EINVAL);
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
    tcase_add_test(tc, test_session_make_room_evicts_lru_idle);
    tcase_add_test(tc, test_session_fork_and_truncate);
    tcase_add_test(tc, test_session_fork_evicts_others_but_not_source);
    tcase_add_test(tc, test_session_busy_shard_defers_frees);
    tcase_add_test(tc, test_session_ttl_expiry);
    tcase_add_test(tc, test_session_shards_spread_and_clear);
    suite_add_tcase(s, tc);
    return s;
}
