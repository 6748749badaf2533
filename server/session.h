/* server/session.h: the session table: session id -> one attn_kv per layer used, an LRU list,
 * bounded tombstones for evicted or expired ids, pin counts, and the one engine KV pool that
 * every cache lives in (sessions' and stateless calls' temporary ones).
 *
 * The pool's block accounting belongs to the loop thread: before a forward is handed to a worker,
 * session_kv_reserve takes the blocks it will fill, evicting the least recently used sessions
 * with no pins (no request queued or running) anywhere in the pool if blocks are short. The
 * worker's attn_forward then only writes its own caches, so forwards on different caches run on
 * several workers at once while the loop creates, reserves, truncates or frees other caches.
 *
 * A session's caches change only through its *turn* (struct session_turn): at most one exists per
 * session, the scheduler takes it for the job that heads the session's queue and gives it back
 * when that job is finished, and every function that creates, frees, truncates or copies a
 * session's caches takes it as an argument. Code without the turn (a request refused at the
 * queue, a DELETE still waiting behind a prefill) therefore has no way to touch a cache that a
 * worker is writing. Eviction and expiry need no turn: they take only idle sessions (no pins, no
 * turn), and a session with work queued or running is pinned. A session that has no caches, no
 * pins and no turn is removed (no tombstone) the moment the last of them goes: a session exists
 * while it holds a cache or has work queued.
 *
 * Thread rule: everything here is loop thread only.
 */
#ifndef SERVER_SESSION_H
#define SERVER_SESSION_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "../engine/attn.h"

struct session_store; /* opaque; loop thread only */
struct session;       /* opaque; loop thread only */
struct session_turn;  /* opaque: the right to change one session's caches; loop thread only */

struct session_store_params {
    const attn_model *model;
    size_t budget_bytes;    /* the KV pool's size */
    int32_t block_tokens;   /* 0 = the engine's default */
    attn_dtype kv_dtype;    /* how the pool holds K/V (AUTO: the model's weights' dtype) */
    bool keep_queries;      /* the pool keeps each token's queries too (attn_kv_attention) */
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
    size_t bytes_used; /* blocks held, reserved ones included */
    size_t bytes_limit;
    int32_t blocks_used;
    int32_t blocks_total;
    int32_t block_tokens;
    size_t block_bytes;
    attn_dtype kv_dtype;
    uint64_t evictions[3]; /* by session_evict_reason (a spill to disk counts as its reason) */
    int32_t n_on_disk;     /* the disk tier: sessions whose caches are in files */
    size_t disk_bytes_used;
    size_t disk_bytes_limit;
    uint64_t spills;     /* sessions moved to disk */
    uint64_t disk_drops; /* sessions dropped from disk for its budget or ttl */
};

/* The disk tier, as the store sees it (spill.c implements it). Loop thread. */
struct session_disk_ops {
    /* Takes a copy of s's caches (s is idle and about to lose them) to write to its file;
     * returns the file's size, or 0 if it cannot (then s is evicted as without a disk tier). */
    size_t (*save)(void *ctx, struct session *s);
    /* Removes the file of the session id (dropped from disk, or restored). */
    void (*remove)(void *ctx, const char *id);
    /* The same, calling done(done_ctx, status) on the loop once the file is gone (status 0) or
     * could not be removed (a negative errno): a DELETE answers after it, so that no restart
     * brings the session back. */
    void (*remove_then)(void *ctx, const char *id, void (*done)(void *done_ctx, int status),
                        void *done_ctx);
    /* Whether the directory holds a file for the session id that this server leaves alone
     * (another model's, say): a session of that id is not created, since its file would
     * replace that one. */
    bool (*is_foreign)(void *ctx, const char *id);
    void *ctx;
};

/* Creates the store and its KV pool. Returns 0, ATTN_EINVAL (e.g. a budget smaller than one
 * block) or ATTN_ENOMEM. */
int session_store_create(const struct session_store_params *p, struct session_store **out);

/* Destroys every session, its caches and the pool. No forward may be running, and every
 * temporary cache must be destroyed before. NULL is a no-op. */
void session_store_destroy(struct session_store *st);

void session_store_get_stats(const struct session_store *st, struct session_store_stats *out);

/* ---- lookup and lifecycle ------------------------------------------------------------------- */

enum session_state {
    SESSION_STATE_LIVE = 0,
    SESSION_STATE_UNKNOWN = 1,
    SESSION_STATE_TOMBSTONE = 2, /* evicted or expired: the id must not silently restart */
    SESSION_STATE_ON_DISK = 3,   /* spilled: session_restore_begin brings it back */
};

/* The session named id wherever it is, in memory or on disk, or NULL (for describing it). */
struct session *session_lookup(struct session_store *st, const char *id);

/* Finds a live session (in memory); *state (if not NULL) says live, unknown, tombstoned or on
 * disk. May return NULL. */
struct session *session_find(struct session_store *st, const char *id, enum session_state *state);

/* Creates an empty session (ERROR_SESSION_EXISTS for an id on disk too). If max_sessions are live,
 * first evicts the least recently used idle session (tombstoned, reason max_sessions). Returns 0,
 * ERROR_SESSION_EXISTS, ERROR_SESSION_EVICTED (tombstoned id), ERROR_SESSION_FILE_FOREIGN (the
 * disk tier leaves a file of that id alone), ERROR_KV_BUDGET_EXHAUSTED (max_sessions live and all
 * pinned) or ATTN_ENOMEM. */
int session_create(struct session_store *st, const char *id, int64_t now_ms, struct session **out);

/* Takes s's turn. Returns NULL if another job holds it (then it is not this job's turn). The
 * holder must have s pinned. */
struct session_turn *session_turn_take(struct session_store *st, struct session *s);

/* Gives the turn back; removes the session if it is left with no caches and no pins. */
void session_turn_give(struct session_store *st, struct session_turn *t);

/* The session a turn belongs to. */
struct session *session_turn_session(const struct session_turn *t);

/* Frees every cache of the session (DELETE), and forgets how its restore from disk failed (the
 * file a restore short of memory kept is removed): the id is free again. The session itself goes
 * once its pins and turn do, unless later requests create caches first. */
void session_clear(struct session_store *st, struct session_turn *t);

/* What a request naming a tombstoned id is told: ERROR_SESSION_LOST if its file failed its checks
 * when read back, else ERROR_SESSION_EVICTED (evicted or expired). */
int session_gone_code(struct session_store *st, const char *id);

/* Forgets a tombstone. Returns true if there was one. */
bool session_tombstone_forget(struct session_store *st, const char *id);

/* Remembers id as evicted (is_lost: lost) again, as a PUT that forgot its tombstone and then
 * failed must leave it. */
void session_tombstone_add(struct session_store *st, const char *id, bool is_lost);

/* Calls fn for every tombstone, oldest first (adding them in this order remakes the list). */
void session_tombstones_each(const struct session_store *st,
                             void (*fn)(void *ctx, const char *id, bool is_lost), void *ctx);

/* How many times a tombstone was added or forgotten since the store began: the list changed
 * when this did. */
uint64_t session_tombstones_changes(const struct session_store *st);

/* Evicts (with tombstones, reason ttl) idle sessions unused for more than ttl_ms. Returns how
 * many. */
int32_t session_store_expire(struct session_store *st, int64_t now_ms, int64_t ttl_ms);

/* A pinned session is never evicted or expired. Every queued or running request pins its
 * session once. Both move the session to the most-recently-used end of the LRU; unpin removes the
 * session if it is left with no caches, no pins and no turn. */
void session_pin(struct session_store *st, struct session *s, int64_t now_ms);
void session_unpin(struct session_store *st, struct session *s, int64_t now_ms);

/* ---- getters (cheap, no side effects) -------------------------------------------------------- */

const char *session_id(const struct session *s);
int session_restore_error(const struct session *s);

/* Why the restore failed, as session_restore_end was told ("" if not). */
const char *session_restore_reason(const struct session *s); /* 0, or why its restore failed */
bool session_is_on_disk(const struct session *s);            /* its caches are in a file */
/* Its file is being read back: its caches are not all in, nor checked, until the read ends. */
bool session_is_restoring(const struct session *s);
int32_t session_disk_tokens(const struct session *s); /* its length when its file was written */
size_t session_disk_bytes(const struct session *s);   /* that file's size */
int32_t session_pins(const struct session *s);
int64_t session_idle_ms(const struct session *s, int64_t now_ms); /* 0 while pinned */
int32_t session_n_tokens(const struct session *s);                /* longest layer */
size_t session_bytes(const struct session *s);
int32_t session_n_layers_used(const struct session *s);

/* One used layer's cache, as of the last refresh. */
struct session_layer_stat {
    int32_t layer;          /* absolute index */
    int32_t n_tokens;       /* tokens seen (appended) */
    int32_t n_held;         /* tokens whose K/V are held: n_tokens, or fewer for a sliding layer */
    int32_t window;         /* the sliding layer's window, or 0 (every token is kept) */
    int32_t context_tokens; /* the stored context cross-attention reads, or -1 for none */
    bool is_linear;         /* a linear-attention layer: its cache is a state (n_held 0) */
    size_t bytes;           /* self and cross caches */
};

/* The i-th used layer (0 <= i < session_n_layers_used), by layer index. */
void session_layer_at(const struct session *s, int32_t i, struct session_layer_stat *out);

/* Sessions in most-recently-used order: first, then next until NULL. */
struct session *session_store_first(struct session_store *st);
struct session *session_next(struct session *s);

/* Sessions on disk, most recently used first; session_next walks on. */
struct session *session_store_first_on_disk(struct session_store *st);

/* ---- the disk tier --------------------------------------------------------------------------- */

/* Turns the disk tier on: sessions evicted for room (budget, max_sessions) go to ops->save
 * instead of being dropped; those on disk are bounded by budget_bytes, least recently used
 * dropped first (tombstoned, file removed). Expiry (ttl) drops from memory and disk alike. */
void session_store_set_disk(struct session_store *st, const struct session_disk_ops *ops,
                            size_t budget_bytes);

/* Registers a session found on disk at start (its file's size and the length it holds).
 * Returns 0, ERROR_SESSION_EXISTS or ATTN_ENOMEM. */
int session_add_on_disk(struct session_store *st, const char *id, size_t bytes, int32_t n_tokens,
                        int64_t last_used_ms);

/* Brings the session id from disk back into memory, empty, pinned, with its turn held (*out)
 * until session_restore_end: requests queued on it wait for the file's read. May evict for
 * --max-sessions. Returns 0, ERROR_SESSION_NOT_FOUND (not on disk), ERROR_KV_BUDGET_EXHAUSTED or
 * ATTN_ENOMEM. */
int session_restore_begin(struct session_store *st, const char *id, int64_t now_ms,
                          struct session_turn **out);

/* While a restore's file is read: evicts idle sessions for the blocks its caches held when this
 * process wrote them (nobody when they could not all be had, or for a file found at start), so
 * that the evictions' copies out of the pool run beside the disk's read instead of after it. A
 * file that then fails its checks has moved those sessions to disk for nothing (as spills, like
 * any eviction with --state-dir). */
void session_restore_prepare_room(struct session_store *st, struct session_turn *t);

/* Ends a restore: status 0, the caches are installed (session_kv_install); else requests queued
 * on the session fail with status (session_restore_error) and why (session_restore_reason:
 * NULL or a short text, copied), and when the last goes its id is tombstoned
 * (ERROR_SESSION_LOST: its file is bad) or it goes back to disk (ERROR_KV_BUDGET_EXHAUSTED:
 * memory was short; the file must still be there). Gives back the turn and the pin. */
void session_restore_end(struct session_store *st, struct session_turn *t, int status,
                         const char *why, int64_t now_ms);

/* Drops the session id from disk with a tombstone (its file could not be written). Returns 0 or
 * ERROR_SESSION_NOT_FOUND (not on disk). */
int session_disk_forget(struct session_store *st, const char *id);

/* Deletes the session id from disk, file and all, without a tombstone (DELETE); done(done_ctx,
 * status) is called once the file is gone (status 0), or could not be removed (a negative errno:
 * the session is on disk again, as its file has it, unless its id was taken meanwhile); not when
 * this returns an error. Returns 0, ERROR_SESSION_NOT_FOUND (not on disk) or ATTN_ENOMEM. */
int session_disk_delete(struct session_store *st, const char *id,
                        void (*done)(void *done_ctx, int status), void *done_ctx);

/* Moves every idle session in memory to disk (at shutdown), least recently used first, so that
 * the disk budget drops the oldest. */
void session_store_spill_all(struct session_store *st);

/* The model the store's caches belong to. */
const attn_model *session_store_model(const struct session_store *st);

/* Evicts idle sessions other than keep until `blocks` blocks are free. Returns 0 or
 * ERROR_KV_BUDGET_EXHAUSTED (then nobody is evicted). */
int session_store_make_room(struct session_store *st, int32_t blocks, const struct session *keep);

/* ---- caches ---------------------------------------------------------------------------------- */

/* The session's cache for absolute layer `layer`, or NULL if it has not used it. */
attn_kv *session_kv_find(struct session *s, int32_t layer);

/* The turn's session's cache for `layer`, created empty on first use. Returns 0 or ATTN_ENOMEM /
 * ATTN_EINVAL (layer not loaded). */
int session_kv_get(struct session_store *st, struct session_turn *t, int32_t layer, attn_kv **out);

/* The context layer (absolute index) of s holds for cross-attention, or NULL. */
attn_kv *session_cross_find(struct session *s, int32_t layer);

/* Makes kv (a cache from the store's pool, for `layer`) the turn's session's cache of layer,
 * freeing the one it replaces. */
void session_kv_install(struct session_turn *t, int32_t layer, attn_kv *kv);

/* Makes cross (a cache from the store's pool, filled) the context of the turn's session at
 * layer, freeing the one it replaces. */
void session_cross_install(struct session_turn *t, int32_t layer, attn_kv *cross);

/* Drops the turn's session's cache of `layer` (absolute) if it holds no tokens (after a failed
 * call that created it). */
void session_drop_layer_if_empty(struct session_turn *t, int32_t layer);

/* Re-reads the session's per-layer token and byte counts from the engine, once the turn's job
 * has no step running (e.g. after its forward has finished). */
void session_refresh(struct session_turn *t);

/* Truncates every layer (or only `layer` if >= 0) holding more than n_tokens tokens to
 * n_tokens. Returns 0 or ERROR_INVALID_REQUEST (n_tokens above the longest layer, or above
 * `layer`'s length). */
int session_truncate(struct session_store *st, struct session_turn *t, int32_t layer,
                     int32_t n_tokens);

/* Creates session new_id holding copies of all the turn's session's caches, evicting idle
 * sessions if blocks are short. Returns 0, ERROR_SESSION_EXISTS, ERROR_SESSION_EVICTED,
 * ERROR_SESSION_FILE_FOREIGN, ATTN_ENOSPC (the pool cannot hold the copy even after evicting
 * idle sessions), ERROR_KV_BUDGET_EXHAUSTED (--max-sessions live and all busy) or ATTN_ENOMEM;
 * on failure nothing is created. */
int session_fork(struct session_store *st, struct session_turn *t, const char *new_id,
                 int64_t now_ms, struct session **out);

/* ---- the KV pool (used by pool.c and job.c) -------------------------------------------------- */

/* The engine pool, for the temporary caches of stateless calls (created and destroyed on the
 * loop thread). Borrowed, valid until session_store_destroy. */
attn_kv_pool *session_store_kv_pool(struct session_store *st);

/* Takes now the blocks that appending n_new tokens to kv will need (attn_kv_reserve), first
 * evicting least-recently-used idle sessions (tombstoned, reason budget) until they are free.
 * kv must belong to a pinned session or be a temporary cache, so it is never evicted itself.
 * Returns 0, ERROR_KV_BUDGET_EXHAUSTED if even evicting every idle session is not enough (then
 * nothing is evicted or taken), or ATTN_ERANGE (past max_seq) / ATTN_EINVAL from the engine. */
int session_kv_reserve(struct session_store *st, attn_kv *kv, int32_t n_new);

/* Returns to the pool the blocks reserved for kv but not filled (after a forward that failed or
 * was never run). */
void session_kv_unreserve(attn_kv *kv);

#endif /* SERVER_SESSION_H */
