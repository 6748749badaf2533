/* server/session.h: the session table: session id -> one attn_kv per layer used, an LRU list,
 * bounded tombstones for evicted or expired ids, pin counts, and the KV shards the caches live
 * in.
 *
 * The KV budget is split into n_shards engine pools (attn_kv_pool is single-threaded, so each
 * shard is used by at most one worker at a time; pool.c acquires a shard for a job's duration).
 * A session lives in one shard for its whole life. Eviction picks the least recently used
 * session with no pins (no request queued or running) in the shard that needs room.
 *
 * Thread rule: everything here is loop thread only. Caches are mutated by a worker only while
 * their shard is acquired; functions that touch a shard's caches (make_room, refresh, remove,
 * truncate, fork) must be called while no worker holds that shard; cache frees requested while
 * it is held are deferred to session_shard_release.
 */
#ifndef SERVER_SESSION_H
#define SERVER_SESSION_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "../engine/attn.h"

struct session_store; /* opaque; loop thread only */
struct session;       /* opaque; loop thread only */

struct session_store_params {
    const attn_model *model;
    size_t budget_bytes;    /* total KV budget, split evenly over the shards */
    int32_t n_shards;       /* >= 1 */
    int32_t block_tokens;   /* 0 = the engine's default */
    int32_t max_sessions;   /* >= 1 */
    int32_t max_tombstones; /* >= 1: evicted/expired ids remembered, oldest forgotten first */
};

enum session_evict_reason {
    SESSION_EVICT_BUDGET = 0,
    SESSION_EVICT_MAX_SESSIONS = 1,
    SESSION_EVICT_TTL = 2,
};

struct session_store_stats {
    int32_t n_sessions;
    size_t bytes_used; /* as of each shard's last release (exact when no worker runs) */
    size_t bytes_limit;
    int32_t blocks_used;
    int32_t blocks_total;
    int32_t block_tokens;
    int32_t n_shards;
    uint64_t evictions[3]; /* by session_evict_reason */
};

/* Creates the store and its shards' KV pools. Returns 0, ATTN_EINVAL (e.g. a budget smaller than
 * one block per shard) or ATTN_ENOMEM. */
int session_store_create(const struct session_store_params *p, struct session_store **out);

/* Destroys every session, cache and pool. No shard may be acquired. NULL is a no-op. */
void session_store_destroy(struct session_store *st);

void session_store_get_stats(const struct session_store *st, struct session_store_stats *out);

/* ---- lookup and lifecycle ------------------------------------------------------------------- */

enum session_state {
    SESSION_STATE_LIVE = 0,
    SESSION_STATE_UNKNOWN = 1,
    SESSION_STATE_TOMBSTONE = 2, /* evicted or expired: the id must not silently restart */
};

/* Finds a live session; *state (if not NULL) says live, unknown or tombstoned. May return NULL. */
struct session *session_find(struct session_store *st, const char *id, enum session_state *state);

/* Creates an empty session in the shard with the fewest sessions (then the most free blocks).
 * If max_sessions are live,
 * first evicts the least recently used idle session (tombstoned, reason max_sessions).
 * Returns 0, ERROR_SESSION_EXISTS, ERROR_SESSION_EVICTED (tombstoned id),
 * ERROR_KV_BUDGET_EXHAUSTED (max_sessions live and all pinned) or ATTN_ENOMEM. */
int session_create(struct session_store *st, const char *id, int64_t now_ms, struct session **out);

/* Removes an idle session (no pins) without a tombstone (DELETE, or a first request that
 * failed) and frees its caches (deferred while its shard is acquired). */
void session_remove(struct session_store *st, struct session *s);

/* Frees every cache of the session (deferred while its shard is acquired); the session stays,
 * empty. For DELETE while later requests of the session are still queued. */
void session_clear(struct session_store *st, struct session *s);

/* Forgets a tombstone. Returns true if there was one. */
bool session_tombstone_forget(struct session_store *st, const char *id);

/* Evicts (with tombstones, reason ttl) idle sessions unused for more than ttl_ms. Returns how
 * many. Sessions whose shard is acquired are expired too; their frees are deferred. */
int32_t session_store_expire(struct session_store *st, int64_t now_ms, int64_t ttl_ms);

/* A pinned session is never evicted or expired. Every queued or running request pins its
 * session once. Both move the session to the most-recently-used end of the LRU. */
void session_pin(struct session_store *st, struct session *s, int64_t now_ms);
void session_unpin(struct session_store *st, struct session *s, int64_t now_ms);

/* ---- getters (cheap, no side effects) -------------------------------------------------------- */

const char *session_id(const struct session *s);
int32_t session_shard(const struct session *s);
int32_t session_pins(const struct session *s);
int64_t session_idle_ms(const struct session *s, int64_t now_ms); /* 0 while pinned */
int32_t session_n_tokens(const struct session *s);                /* longest layer */
size_t session_bytes(const struct session *s);
int32_t session_n_layers_used(const struct session *s);

/* The i-th used layer (0 <= i < session_n_layers_used), by layer index: its absolute index,
 * tokens and bytes as of the last refresh. */
void session_layer_at(const struct session *s, int32_t i, int32_t *layer, int32_t *n_tokens,
                      size_t *bytes);

/* Sessions in most-recently-used order: first, then next until NULL. */
struct session *session_store_first(struct session_store *st);
struct session *session_next(struct session *s);

/* ---- caches ---------------------------------------------------------------------------------- */

/* The session's cache for absolute layer `layer`, or NULL if it has not used it. */
attn_kv *session_kv_find(struct session *s, int32_t layer);

/* The session's cache for `layer`, created empty on first use. Returns 0 or ATTN_ENOMEM /
 * ATTN_EINVAL (layer not loaded). */
int session_kv_get(struct session_store *st, struct session *s, int32_t layer, attn_kv **out);

/* Drops layer caches that hold no tokens (after a failed first call on a layer). */
void session_drop_empty_layers(struct session_store *st, struct session *s);

/* Re-reads the session's per-layer token and byte counts from the engine. Call after a job on
 * its shard has finished. */
void session_refresh(struct session *s);

/* Truncates every layer (or only `layer` if >= 0) holding more than n_tokens tokens to
 * n_tokens. Returns 0 or ERROR_INVALID_REQUEST (n_tokens above the longest layer, or above
 * `layer`'s length). Shard must not be acquired. */
int session_truncate(struct session_store *st, struct session *s, int32_t layer, int32_t n_tokens);

/* Creates session new_id in s's shard holding copies of all s's caches, evicting idle sessions
 * of the shard (never s) if blocks are short. Returns 0, ERROR_SESSION_EXISTS,
 * ERROR_SESSION_EVICTED, ERROR_KV_BUDGET_EXHAUSTED or ATTN_ENOMEM; on failure nothing is
 * created. Shard must not be acquired. */
int session_fork(struct session_store *st, struct session *s, const char *new_id, int64_t now_ms,
                 struct session **out);

/* ---- shards (used by pool.c) ----------------------------------------------------------------- */

int32_t session_store_n_shards(const struct session_store *st);
bool session_shard_is_busy(const struct session_store *st, int32_t shard);

/* Marks the shard held by a worker / releases it (running deferred cache frees and refreshing
 * its block counts). */
void session_shard_acquire(struct session_store *st, int32_t shard);
void session_shard_release(struct session_store *st, int32_t shard);

/* The idle shard with the most free blocks, or -1 if all are acquired. */
int32_t session_shard_pick_idle(const struct session_store *st);

/* The shard's engine pool, for temporary (stateless) caches. */
attn_kv_pool *session_shard_pool(struct session_store *st, int32_t shard);

/* Evicts least-recently-used idle sessions of the shard (tombstoned, reason budget) until it has
 * blocks_needed free blocks. Returns 0, or ERROR_KV_BUDGET_EXHAUSTED if even evicting every idle
 * session there is not enough (then nothing is evicted). Shard must not be acquired. */
int session_shard_make_room(struct session_store *st, int32_t shard, int32_t blocks_needed);

/* Frees a cache of the shard now, or when the shard is released if it is acquired. */
void session_shard_free_kv(struct session_store *st, int32_t shard, attn_kv *kv);

#endif /* SERVER_SESSION_H */
