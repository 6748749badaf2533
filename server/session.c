/* server/session.c: the session table (see session.h). Sessions sit in a chained hash table by
 * id and in one doubly linked LRU list (most recent first); tombstones sit in a second hash table
 * and a ring that forgets the oldest. All caches come from one attn_kv_pool; eviction walks the
 * LRU from its least recent end.
 */
#include "session.h"

#include <assert.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "error.h"
#include "log.h"

/* The right to change one session's caches (session.h). Lives inside its session. */
struct session_turn {
    struct session *s;
};

struct session {
    char id[129];
    struct session *hash_next;
    struct session *lru_prev, *lru_next; /* lru_prev toward the most recent end */
    int32_t layer_first, layer_count;    /* the model's loaded layers */
    int32_t pins;
    bool is_turn_taken;
    struct session_turn turn; /* handed out by session_turn_take */
    int64_t last_used_ms;
    attn_kv **kv;      /* (layer_count) by layer - layer_first; NULL = unused */
    int32_t *n_tokens; /* (layer_count) as of the last refresh */
    int32_t *n_held;   /* (layer_count) tokens a sliding layer's ring still holds, likewise */
    size_t *bytes;     /* (layer_count) self and cross caches, as of the last refresh */
    attn_kv **cross;   /* (layer_count) the context cross-attention reads; NULL = none */
    /* The disk tier. On disk: no caches, in the store's disk list instead of its LRU, not
     * returned by session_find. Restoring: its turn is held by the read of its file. A restore
     * error: that read failed, so jobs queued behind it fail with it, and when the last goes the
     * id is tombstoned (ERROR_SESSION_LOST) or goes back to disk (ERROR_KV_BUDGET_EXHAUSTED: the
     * file is whole, memory was short). */
    bool is_on_disk;
    int restore_error;
    char restore_why[256]; /* session_restore_reason: a restore's message, as long */
    size_t disk_bytes;     /* its file's size (kept while a restore is under way) */
    int32_t disk_tokens;   /* its length when it was written */
    int32_t disk_blocks;   /* the KV blocks it held when this process wrote it (0: unknown) */
    bool is_restoring;     /* its file is being read back (session_restore_begin .. _end) */
};

struct tombstone {
    char id[129];
    /* its file failed its checks at restore (session_lost), else evicted or expired */
    bool is_lost;
    struct tombstone *hash_next;
};

struct session_store {
    const attn_model *model;
    int32_t layer_first, layer_count;
    int32_t max_sessions;
    int32_t n_sessions;
    struct session **buckets;              /* (n_buckets) */
    size_t n_buckets;                      /* power of two */
    struct session *lru_head, *lru_tail;   /* sessions in memory, most recent first */
    struct session *disk_head, *disk_tail; /* sessions on disk, most recent first */
    struct tombstone **tomb_buckets;       /* (n_tomb_buckets) */
    size_t n_tomb_buckets;
    struct tombstone **ring; /* (max_tombstones), oldest at ring_next when full */
    int32_t max_tombstones, n_tombstones, ring_next;
    uint64_t tomb_changes; /* tombstones added or forgotten, ever (the disk tier syncs on it) */
    attn_kv_pool *kv_pool;
    uint64_t evictions[3];
    struct session_disk_ops disk; /* save == NULL: no disk tier */
    size_t disk_budget, disk_used;
    int32_t n_on_disk;
    uint64_t spills, disk_drops;
};

/* ---- hashing -------------------------------------------------------------------------------- */

/* FNV-1a, 64-bit. */
static uint64_t hash_id(const char *s) {
    uint64_t h = 1469598103934665603ULL;
    for (; *s; s++) {
        h ^= (unsigned char)*s;
        h *= 1099511628211ULL;
    }
    return h;
}

static size_t pow2_at_least(size_t n) {
    size_t p = 16;
    while (p < n) {
        p *= 2;
    }
    return p;
}

static struct session **bucket_of(struct session_store *st, const char *id) {
    return &st->buckets[hash_id(id) & (st->n_buckets - 1)];
}

static struct tombstone **tomb_bucket_of(struct session_store *st, const char *id) {
    return &st->tomb_buckets[hash_id(id) & (st->n_tomb_buckets - 1)];
}

static struct tombstone *tomb_find(struct session_store *st, const char *id) {
    for (struct tombstone *t = *tomb_bucket_of(st, id); t != NULL; t = t->hash_next) {
        if (strcmp(t->id, id) == 0) {
            return t;
        }
    }
    return NULL;
}

static void tomb_unlink(struct session_store *st, struct tombstone *t) {
    struct tombstone **pp = tomb_bucket_of(st, t->id);
    while (*pp != t) {
        pp = &(*pp)->hash_next;
    }
    *pp = t->hash_next;
}

/* Remembers id in the ring slot at ring_next, forgetting the tombstone that held it (the oldest)
 * if any. Forgotten tombstones leave NULL holes, reused when the ring comes round. */
static void tomb_add(struct session_store *st, const char *id, bool is_lost) {
    if (tomb_find(st, id) != NULL) {
        return;
    }
    struct tombstone *t = st->ring[st->ring_next];
    if (t != NULL) {
        tomb_unlink(st, t);
    } else {
        t = malloc(sizeof *t);
        if (t == NULL) {
            return; /* a lost tombstone degrades 410 to a fresh session; not worth failing */
        }
        st->n_tombstones++;
    }
    strcpy(t->id, id);
    t->is_lost = is_lost;
    struct tombstone **b = tomb_bucket_of(st, id);
    t->hash_next = *b;
    *b = t;
    st->ring[st->ring_next] = t;
    st->ring_next = (st->ring_next + 1) % st->max_tombstones;
    st->tomb_changes++;
}

int session_gone_code(struct session_store *st, const char *id) {
    const struct tombstone *t = tomb_find(st, id);
    return t != NULL && t->is_lost ? ERROR_SESSION_LOST : ERROR_SESSION_EVICTED;
}

void session_tombstone_add(struct session_store *st, const char *id, bool is_lost) {
    tomb_add(st, id, is_lost);
}

void session_tombstones_each(const struct session_store *st,
                             void (*fn)(void *ctx, const char *id, bool is_lost), void *ctx) {
    for (int32_t i = 0; i < st->max_tombstones; i++) {
        const struct tombstone *t = st->ring[(st->ring_next + i) % st->max_tombstones];
        if (t != NULL) {
            fn(ctx, t->id, t->is_lost);
        }
    }
}

bool session_tombstone_forget(struct session_store *st, const char *id) {
    struct tombstone *t = tomb_find(st, id);
    if (t == NULL) {
        return false;
    }
    tomb_unlink(st, t);
    for (int32_t i = 0; i < st->max_tombstones; i++) {
        if (st->ring[i] == t) {
            st->ring[i] = NULL;
            break;
        }
    }
    st->n_tombstones--;
    st->tomb_changes++;
    free(t);
    return true;
}

uint64_t session_tombstones_changes(const struct session_store *st) {
    return st->tomb_changes;
}

/* ---- LRU ------------------------------------------------------------------------------------ */

/* A session is in one of two lists, by the same links: the LRU (in memory) or the disk list. */
static void list_unlink(struct session **head, struct session **tail, struct session *s) {
    if (s->lru_prev != NULL) {
        s->lru_prev->lru_next = s->lru_next;
    } else {
        *head = s->lru_next;
    }
    if (s->lru_next != NULL) {
        s->lru_next->lru_prev = s->lru_prev;
    } else {
        *tail = s->lru_prev;
    }
    s->lru_prev = s->lru_next = NULL;
}

static void list_push_front(struct session **head, struct session **tail, struct session *s) {
    s->lru_prev = NULL;
    s->lru_next = *head;
    if (*head != NULL) {
        (*head)->lru_prev = s;
    } else {
        *tail = s;
    }
    *head = s;
}

static void lru_unlink(struct session_store *st, struct session *s) {
    if (s->is_on_disk) {
        list_unlink(&st->disk_head, &st->disk_tail, s);
    } else {
        list_unlink(&st->lru_head, &st->lru_tail, s);
    }
}

static void lru_push_front(struct session_store *st, struct session *s) {
    if (s->is_on_disk) {
        list_push_front(&st->disk_head, &st->disk_tail, s);
    } else {
        list_push_front(&st->lru_head, &st->lru_tail, s);
    }
}

static void touch(struct session_store *st, struct session *s, int64_t now_ms) {
    s->last_used_ms = now_ms;
    lru_unlink(st, s);
    lru_push_front(st, s);
}

/* ---- store ---------------------------------------------------------------------------------- */

int session_store_create(const struct session_store_params *p, struct session_store **out) {
    if (p->model == NULL || p->max_sessions < 1 || p->max_tombstones < 1) {
        return ATTN_EINVAL;
    }
    struct session_store *st = calloc(1, sizeof *st);
    if (st == NULL) {
        return ATTN_ENOMEM;
    }
    st->model = p->model;
    st->layer_first = attn_model_layer_first(p->model);
    st->layer_count = attn_model_layer_count(p->model);
    st->max_sessions = p->max_sessions;
    st->n_buckets = pow2_at_least((size_t)p->max_sessions);
    st->buckets = calloc(st->n_buckets, sizeof *st->buckets);
    st->max_tombstones = p->max_tombstones;
    st->n_tomb_buckets = pow2_at_least((size_t)p->max_tombstones);
    st->tomb_buckets = calloc(st->n_tomb_buckets, sizeof *st->tomb_buckets);
    st->ring = calloc((size_t)p->max_tombstones, sizeof *st->ring);
    if (st->buckets == NULL || st->tomb_buckets == NULL || st->ring == NULL) {
        session_store_destroy(st);
        return ATTN_ENOMEM;
    }
    int rc = attn_kv_pool_create_ex(p->model, p->budget_bytes, p->block_tokens, p->kv_dtype,
                                    p->keep_queries, &st->kv_pool);
    if (rc != ATTN_OK) {
        session_store_destroy(st);
        return rc;
    }
    *out = st;
    return 0;
}

/* The per-layer arrays of a session in memory (a session on disk has none). Returns 0 or -1;
 * on -1, what was made stays for session_free. */
static int alloc_layers(struct session *s, int32_t n) {
    s->kv = calloc((size_t)n, sizeof *s->kv);
    s->n_tokens = calloc((size_t)n, sizeof *s->n_tokens);
    s->n_held = calloc((size_t)n, sizeof *s->n_held);
    s->bytes = calloc((size_t)n, sizeof *s->bytes);
    s->cross = calloc((size_t)n, sizeof *s->cross);
    if (s->kv == NULL || s->n_tokens == NULL || s->n_held == NULL || s->bytes == NULL ||
        s->cross == NULL) {
        /* all or none: a later try (a restore) allocates again only when kv is NULL */
        free(s->kv);
        free(s->n_tokens);
        free(s->n_held);
        free(s->bytes);
        free(s->cross);
        s->kv = s->cross = NULL;
        s->n_tokens = s->n_held = NULL;
        s->bytes = NULL;
        return -1;
    }
    s->layer_count = n;
    return 0;
}

static void session_free(struct session_store *st, struct session *s) {
    (void)st;
    for (int32_t i = 0; s->kv != NULL && i < s->layer_count; i++) {
        attn_kv_destroy(s->kv[i]);
        attn_kv_destroy(s->cross[i]);
    }
    free(s->kv);
    free(s->cross);
    free(s->n_tokens);
    free(s->n_held);
    free(s->bytes);
    free(s);
}

static void unlink_session(struct session_store *st, struct session *s) {
    struct session **pp = bucket_of(st, s->id);
    while (*pp != s) {
        pp = &(*pp)->hash_next;
    }
    *pp = s->hash_next;
    lru_unlink(st, s);
    if (s->is_on_disk) {
        st->n_on_disk--;
        st->disk_used -= s->disk_bytes;
    } else {
        st->n_sessions--;
    }
}

void session_store_destroy(struct session_store *st) {
    if (st == NULL) {
        return;
    }
    while (st->lru_head != NULL || st->disk_head != NULL) {
        struct session *s = st->lru_head != NULL ? st->lru_head : st->disk_head;
        unlink_session(st, s);
        session_free(st, s);
    }
    for (int32_t i = 0; i < st->max_tombstones && st->ring != NULL; i++) {
        free(st->ring[i]);
    }
    attn_kv_pool_destroy(st->kv_pool);
    free(st->ring);
    free(st->tomb_buckets);
    free(st->buckets);
    free(st);
}

void session_store_get_stats(const struct session_store *st, struct session_store_stats *out) {
    memset(out, 0, sizeof *out);
    out->n_sessions = st->n_sessions;
    out->blocks_total = attn_kv_pool_blocks_total(st->kv_pool);
    out->blocks_used = out->blocks_total - attn_kv_pool_blocks_free(st->kv_pool);
    out->bytes_used = attn_kv_pool_bytes_used(st->kv_pool);
    out->bytes_limit = attn_kv_pool_bytes_limit(st->kv_pool);
    out->block_tokens = attn_kv_pool_block_tokens(st->kv_pool);
    out->kv_dtype = attn_kv_pool_dtype(st->kv_pool);
    out->block_bytes = attn_kv_pool_block_bytes(st->kv_pool);
    memcpy(out->evictions, st->evictions, sizeof out->evictions);
    out->n_on_disk = st->n_on_disk;
    out->disk_bytes_used = st->disk_used;
    out->disk_bytes_limit = st->disk_budget;
    out->spills = st->spills;
    out->disk_drops = st->disk_drops;
}

const attn_model *session_store_model(const struct session_store *st) {
    return st->model;
}

void session_store_set_disk(struct session_store *st, const struct session_disk_ops *ops,
                            size_t budget_bytes) {
    st->disk = *ops;
    st->disk_budget = budget_bytes;
}

/* ---- sessions ------------------------------------------------------------------------------- */

/* The session named id, in memory or on disk, or NULL. */
static struct session *find_any(struct session_store *st, const char *id) {
    for (struct session *s = *bucket_of(st, id); s != NULL; s = s->hash_next) {
        if (strcmp(s->id, id) == 0) {
            return s;
        }
    }
    return NULL;
}

struct session *session_lookup(struct session_store *st, const char *id) {
    return find_any(st, id);
}

struct session *session_find(struct session_store *st, const char *id, enum session_state *state) {
    struct session *s = find_any(st, id);
    if (state != NULL) {
        *state = s != NULL ? (s->is_on_disk ? SESSION_STATE_ON_DISK : SESSION_STATE_LIVE)
                 : tomb_find(st, id) != NULL ? SESSION_STATE_TOMBSTONE
                                             : SESSION_STATE_UNKNOWN;
    }
    return s != NULL && !s->is_on_disk ? s : NULL;
}

/* Idle: no request queued or running and no job holding its turn, so no cache of it is in use.
 * Only idle sessions are evicted or expired. */
static bool is_idle(const struct session *s) {
    return s->pins == 0 && !s->is_turn_taken;
}

static const char *const evict_reasons[] = {"budget", "max_sessions", "ttl"};

/* Forgets s (on disk, or in memory and idle) with a tombstone, removing its file if it has one. */
static void drop(struct session_store *st, struct session *s) {
    if (s->is_on_disk) {
        st->disk.remove(st->disk.ctx, s->id);
    }
    tomb_add(st, s->id, false);
    unlink_session(st, s);
    session_free(st, s);
}

/* Drops the least recently used sessions on disk until the rest fit the disk budget. */
static void fit_disk_budget(struct session_store *st) {
    while (st->disk_used > st->disk_budget && st->disk_tail != NULL) {
        struct session *s = st->disk_tail;
        LOG_INFO("session", "dropped from disk req=- session=%s reason=state_budget bytes=%zu",
                 s->id, s->disk_bytes);
        drop(st, s);
        st->disk_drops++;
    }
}

static int32_t blocks_held(const struct session_store *st, const struct session *s);

/* Moves s (idle, in memory) to disk: the disk tier takes its caches' bytes, and they go back to
 * the pool. Returns false if the tier could not take them. */
static bool spill(struct session_store *st, struct session *s) {
    int32_t tokens = session_n_tokens(s);
    int32_t blocks = blocks_held(st, s);
    size_t bytes = st->disk.save(st->disk.ctx, s);
    if (bytes == 0) {
        return false;
    }
    for (int32_t i = 0; i < s->layer_count; i++) {
        attn_kv_destroy(s->kv[i]);
        attn_kv_destroy(s->cross[i]);
        s->kv[i] = s->cross[i] = NULL;
        s->n_tokens[i] = s->n_held[i] = 0;
        s->bytes[i] = 0;
    }
    lru_unlink(st, s);
    st->n_sessions--;
    s->is_on_disk = true;
    s->disk_bytes = bytes;
    s->disk_tokens = tokens;
    s->disk_blocks = blocks;
    lru_push_front(st, s);
    st->n_on_disk++;
    st->disk_used += bytes;
    st->spills++;
    fit_disk_budget(st);
    return true;
}

/* Evicts s (idle): to disk when there is a disk tier and memory was short, else with a
 * tombstone. */
static void evict(struct session_store *st, struct session *s, enum session_evict_reason why) {
    assert(is_idle(s));
    st->evictions[why]++;
    if (why != SESSION_EVICT_TTL && st->disk.save != NULL && spill(st, s)) {
        LOG_INFO("session", "spilled req=- session=%s reason=%s tokens=%d bytes=%zu", s->id,
                 evict_reasons[why], (int)s->disk_tokens, s->disk_bytes);
        return;
    }
    LOG_INFO("session", "evicted req=- session=%s reason=%s tokens=%d bytes=%zu", s->id,
             evict_reasons[why], (int)session_n_tokens(s), session_bytes(s));
    drop(st, s);
}

/* Makes room for one more session in memory under --max-sessions. */
static int fit_max_sessions(struct session_store *st) {
    if (st->n_sessions >= st->max_sessions) {
        struct session *victim = st->lru_tail;
        while (victim != NULL && !is_idle(victim)) {
            victim = victim->lru_prev;
        }
        if (victim == NULL) {
            return ERROR_KV_BUDGET_EXHAUSTED;
        }
        evict(st, victim, SESSION_EVICT_MAX_SESSIONS);
    }
    return 0;
}

int session_create(struct session_store *st, const char *id, int64_t now_ms, struct session **out) {
    enum session_state state;
    if (session_find(st, id, &state) != NULL || state == SESSION_STATE_ON_DISK) {
        return ERROR_SESSION_EXISTS;
    }
    if (state == SESSION_STATE_TOMBSTONE) {
        return session_gone_code(st, id);
    }
    if (st->disk.is_foreign != NULL && st->disk.is_foreign(st->disk.ctx, id)) {
        return ERROR_SESSION_FILE_FOREIGN;
    }
    int rc = fit_max_sessions(st);
    if (rc != 0) {
        return rc;
    }
    struct session *s = calloc(1, sizeof *s);
    if (s == NULL) {
        return ATTN_ENOMEM;
    }
    if (alloc_layers(s, st->layer_count) != 0) {
        session_free(st, s);
        return ATTN_ENOMEM;
    }
    strcpy(s->id, id);
    s->layer_first = st->layer_first;
    s->layer_count = st->layer_count;
    s->last_used_ms = now_ms;
    struct session **b = bucket_of(st, id);
    s->hash_next = *b;
    *b = s;
    lru_push_front(st, s);
    st->n_sessions++;
    *out = s;
    return 0;
}

static void back_to_disk(struct session_store *st, struct session *s);

/* Whether a restore that failed with code left the session's file in place, sound, for a later
 * try: memory was short (ERROR_KV_BUDGET_EXHAUSTED), or the file, read back whole, could not be
 * removed (ERROR_INTERNAL: the session may not change while it is there, spill.c). */
static bool restore_keeps_file(int code) {
    return code == ERROR_KV_BUDGET_EXHAUSTED || code == ERROR_INTERNAL;
}

/* Removes s if nothing keeps it: no cache, no pin, no turn; with a tombstone if it was lost, back
 * to disk if its restore left the file for a later try. */
static void collect_if_unused(struct session_store *st, struct session *s) {
    if (!is_idle(s) || session_n_layers_used(s) != 0) {
        return;
    }
    if (restore_keeps_file(s->restore_error)) {
        back_to_disk(st, s);
        return;
    }
    if (s->restore_error != 0 && s->restore_error != ERROR_SESSION_FILE_FOREIGN) {
        /* a foreign file keeps its id from being created instead */
        tomb_add(st, s->id, s->restore_error == ERROR_SESSION_LOST);
    }
    unlink_session(st, s);
    session_free(st, s);
}

struct session_turn *session_turn_take(struct session_store *st, struct session *s) {
    assert(s->pins > 0);
    if (s->is_turn_taken) {
        return NULL;
    }
    s->is_turn_taken = true;
    s->turn.s = s;
    return &s->turn;
}

void session_turn_give(struct session_store *st, struct session_turn *t) {
    struct session *s = t->s;
    assert(s->is_turn_taken);
    s->is_turn_taken = false;
    collect_if_unused(st, s);
}

struct session *session_turn_session(const struct session_turn *t) {
    return t->s;
}

void session_clear(struct session_store *st, struct session_turn *t) {
    struct session *s = t->s;
    if (restore_keeps_file(s->restore_error) && st->disk.remove != NULL) {
        /* its restore left the file for the next try: deleted, the session must not come back
         * from it (at the next restart) */
        st->disk.remove(st->disk.ctx, s->id);
    }
    s->restore_error = 0; /* deleted on purpose: the id is free again */
    for (int32_t i = 0; i < st->layer_count; i++) {
        attn_kv_destroy(s->kv[i]);
        attn_kv_destroy(s->cross[i]);
        s->kv[i] = NULL;
        s->cross[i] = NULL;
        s->n_tokens[i] = 0;
        s->n_held[i] = 0;
        s->bytes[i] = 0;
    }
}

int32_t session_store_expire(struct session_store *st, int64_t now_ms, int64_t ttl_ms) {
    int32_t n = 0;
    struct session *s = st->lru_tail;
    while (s != NULL) {
        struct session *prev = s->lru_prev;
        if (is_idle(s) && now_ms - s->last_used_ms > ttl_ms) {
            evict(st, s, SESSION_EVICT_TTL);
            n++;
        }
        s = prev;
    }
    for (s = st->disk_tail; s != NULL && now_ms - s->last_used_ms > ttl_ms;) {
        struct session *prev = s->lru_prev;
        LOG_INFO("session", "dropped from disk req=- session=%s reason=ttl bytes=%zu", s->id,
                 s->disk_bytes);
        drop(st, s);
        st->evictions[SESSION_EVICT_TTL]++;
        st->disk_drops++; /* both: expired (ttl), and dropped from disk */
        n++;
        s = prev;
    }
    return n;
}

void session_pin(struct session_store *st, struct session *s, int64_t now_ms) {
    s->pins++;
    touch(st, s, now_ms);
}

void session_unpin(struct session_store *st, struct session *s, int64_t now_ms) {
    assert(s->pins > 0);
    s->pins--;
    touch(st, s, now_ms);
    collect_if_unused(st, s);
}

/* ---- getters -------------------------------------------------------------------------------- */

const char *session_id(const struct session *s) {
    return s->id;
}

int32_t session_pins(const struct session *s) {
    return s->pins;
}

int64_t session_idle_ms(const struct session *s, int64_t now_ms) {
    return s->pins > 0 || now_ms < s->last_used_ms ? 0 : now_ms - s->last_used_ms;
}

int32_t session_n_tokens(const struct session *s) {
    if (s->is_on_disk) {
        return s->disk_tokens;
    }
    int32_t n = 0;
    for (int32_t i = 0; i < s->layer_count; i++) {
        if (s->kv[i] != NULL && s->n_tokens[i] > n) {
            n = s->n_tokens[i];
        }
    }
    return n;
}

size_t session_bytes(const struct session *s) {
    size_t n = 0;
    for (int32_t i = 0; i < s->layer_count; i++) {
        n += s->bytes[i];
    }
    return n;
}

int session_restore_error(const struct session *s) {
    return s->restore_error;
}

const char *session_restore_reason(const struct session *s) {
    return s->restore_why;
}

bool session_is_on_disk(const struct session *s) {
    return s->is_on_disk;
}

size_t session_disk_bytes(const struct session *s) {
    return s->disk_bytes;
}

bool session_is_restoring(const struct session *s) {
    return s->is_restoring;
}

int32_t session_disk_tokens(const struct session *s) {
    return s->disk_tokens;
}

int32_t session_n_layers_used(const struct session *s) {
    int32_t n = 0;
    for (int32_t i = 0; i < s->layer_count; i++) {
        n += s->kv[i] != NULL || s->cross[i] != NULL;
    }
    return n;
}

void session_layer_at(const struct session *s, int32_t i, struct session_layer_stat *out) {
    for (int32_t l = 0; l < s->layer_count; l++) {
        if ((s->kv[l] != NULL || s->cross[l] != NULL) && i-- == 0) {
            out->layer = l + s->layer_first;
            out->n_tokens = s->n_tokens[l];
            out->n_held = s->n_held[l];
            /* fixed at creation, and a cross cache changes only with the turn's session */
            out->window = s->kv[l] != NULL ? attn_kv_window(s->kv[l]) : 0;
            out->context_tokens = s->cross[l] != NULL ? attn_kv_len(s->cross[l]) : -1;
            out->is_linear = s->kv[l] != NULL && attn_kv_is_state(s->kv[l]);
            out->bytes = s->bytes[l];
            return;
        }
    }
}

struct session *session_store_first(struct session_store *st) {
    return st->lru_head;
}

struct session *session_next(struct session *s) {
    return s->lru_next;
}

struct session *session_store_first_on_disk(struct session_store *st) {
    return st->disk_head;
}

/* ---- caches --------------------------------------------------------------------------------- */

attn_kv *session_kv_find(struct session *s, int32_t layer) {
    int32_t i = layer - s->layer_first;
    return i >= 0 && i < s->layer_count ? s->kv[i] : NULL;
}

int session_kv_get(struct session_store *st, struct session_turn *t, int32_t layer, attn_kv **out) {
    struct session *s = t->s;
    int32_t i = layer - s->layer_first;
    if (i < 0 || i >= s->layer_count) {
        return ATTN_EINVAL;
    }
    if (s->kv[i] == NULL) {
        int rc = attn_kv_create_for_layer(st->kv_pool, layer, &s->kv[i]);
        if (rc != ATTN_OK) {
            return rc;
        }
        s->n_tokens[i] = 0;
        s->n_held[i] = 0;
        s->bytes[i] = 0;
    }
    *out = s->kv[i];
    return 0;
}

static void refresh(struct session *s);

attn_kv *session_cross_find(struct session *s, int32_t layer) {
    int32_t i = layer - s->layer_first;
    return i >= 0 && i < s->layer_count ? s->cross[i] : NULL;
}

void session_cross_install(struct session_turn *t, int32_t layer, attn_kv *cross) {
    struct session *s = t->s;
    int32_t i = layer - s->layer_first;
    attn_kv_destroy(s->cross[i]);
    s->cross[i] = cross;
    refresh(s);
}

void session_drop_layer_if_empty(struct session_turn *t, int32_t layer) {
    struct session *s = t->s;
    int32_t i = layer - s->layer_first;
    if (i >= 0 && i < s->layer_count && s->kv[i] != NULL && attn_kv_len(s->kv[i]) == 0) {
        attn_kv_destroy(s->kv[i]);
        s->kv[i] = NULL;
        s->n_tokens[i] = 0;
        s->n_held[i] = 0;
        s->bytes[i] = 0;
    }
}

/* Re-reads the counts of s; callers hold its turn or own it outright (a fresh fork). */
static void refresh(struct session *s) {
    for (int32_t i = 0; i < s->layer_count; i++) {
        if (s->kv[i] != NULL) {
            s->n_tokens[i] = attn_kv_len(s->kv[i]);
            s->n_held[i] = s->n_tokens[i] - attn_kv_first_held(s->kv[i]);
        }
        s->bytes[i] = (s->kv[i] != NULL ? attn_kv_bytes(s->kv[i]) : 0) +
                      (s->cross[i] != NULL ? attn_kv_bytes(s->cross[i]) : 0);
    }
}

void session_refresh(struct session_turn *t) {
    refresh(t->s);
}

int session_truncate(struct session_store *st, struct session_turn *t, int32_t layer,
                     int32_t n_tokens) {
    struct session *s = t->s;
    refresh(s);
    if (layer >= 0) {
        attn_kv *kv = session_kv_find(s, layer);
        int32_t len = kv != NULL ? attn_kv_len(kv) : 0;
        if (n_tokens > len) {
            return ERROR_INVALID_REQUEST;
        }
        int rc = kv != NULL ? attn_kv_truncate(kv, n_tokens) : ATTN_OK;
        if (rc != ATTN_OK) {
            return rc == ATTN_EDROPPED ? ERROR_TOKENS_DROPPED : ERROR_INVALID_REQUEST;
        }
    } else {
        if (n_tokens > session_n_tokens(s)) {
            return ERROR_INVALID_REQUEST;
        }
        /* All layers or none: first the rings that could not go back that far. */
        for (int32_t i = 0; i < s->layer_count; i++) {
            if (s->kv[i] != NULL && attn_kv_len(s->kv[i]) > n_tokens && n_tokens > 0 &&
                n_tokens < attn_kv_truncate_min(s->kv[i])) {
                return ERROR_TOKENS_DROPPED;
            }
        }
        for (int32_t i = 0; i < s->layer_count; i++) {
            if (s->kv[i] != NULL && attn_kv_len(s->kv[i]) > n_tokens) {
                attn_kv_truncate(s->kv[i], n_tokens);
            }
        }
    }
    refresh(s);
    return 0;
}

/* Blocks the session's caches hold. */
static int32_t blocks_held(const struct session_store *st, const struct session *s) {
    size_t bb = attn_kv_pool_block_bytes(st->kv_pool);
    size_t total = 0;
    for (int32_t i = 0; i < s->layer_count; i++) {
        if (s->kv[i] != NULL) {
            total += attn_kv_bytes(s->kv[i]);
        }
        if (s->cross[i] != NULL) {
            total += attn_kv_bytes(s->cross[i]);
        }
    }
    return (int32_t)(total / bb);
}

/* Evicts least-recently-used idle sessions other than `keep` (may be NULL) until blocks_needed
 * blocks are free. Returns 0, or ERROR_KV_BUDGET_EXHAUSTED if even evicting every one of them
 * is not enough (then nobody is evicted). */
static int make_room(struct session_store *st, int32_t blocks_needed, const struct session *keep) {
    int32_t avail = attn_kv_pool_blocks_free(st->kv_pool);
    if (avail >= blocks_needed) {
        return 0;
    }
    /* First check that evicting every idle session would be enough, so that a request that
     * cannot fit anyway evicts nobody. */
    int64_t reclaimable = avail;
    for (struct session *s = st->lru_tail; s != NULL; s = s->lru_prev) {
        if (is_idle(s) && s != keep) {
            reclaimable += blocks_held(st, s);
        }
    }
    if (reclaimable < blocks_needed) {
        return ERROR_KV_BUDGET_EXHAUSTED;
    }
    struct session *s = st->lru_tail;
    while (s != NULL && attn_kv_pool_blocks_free(st->kv_pool) < blocks_needed) {
        struct session *prev = s->lru_prev;
        if (is_idle(s) && s != keep) {
            evict(st, s, SESSION_EVICT_BUDGET);
        }
        s = prev;
    }
    return 0;
}

int session_fork(struct session_store *st, struct session_turn *t, const char *new_id,
                 int64_t now_ms, struct session **out) {
    struct session *s = t->s;
    enum session_state state;
    if (session_find(st, new_id, &state) != NULL || state == SESSION_STATE_ON_DISK) {
        return ERROR_SESSION_EXISTS;
    }
    if (state == SESSION_STATE_TOMBSTONE) {
        return session_gone_code(st, new_id);
    }
    int rc = make_room(st, blocks_held(st, s), s);
    if (rc != 0) {
        return rc == ERROR_KV_BUDGET_EXHAUSTED ? ATTN_ENOSPC : rc; /* the pool, not the count */
    }
    /* session_create may evict for --max-sessions; s is not idle (its turn is held), so it
     * stays. */
    struct session *c;
    rc = session_create(st, new_id, now_ms, &c);
    if (rc != 0) {
        return rc;
    }
    for (int32_t i = 0; i < s->layer_count; i++) {
        rc = s->kv[i] != NULL ? attn_kv_fork(s->kv[i], &c->kv[i]) : ATTN_OK;
        if (rc == ATTN_OK && s->cross[i] != NULL) {
            rc = attn_kv_fork(s->cross[i], &c->cross[i]);
        }
        if (rc != ATTN_OK) {
            unlink_session(st, c);
            session_free(st, c);
            return rc;
        }
    }
    refresh(c);
    *out = c;
    return 0;
}

/* ---- the KV pool ---------------------------------------------------------------------------- */

attn_kv_pool *session_store_kv_pool(struct session_store *st) {
    return st->kv_pool;
}

int session_kv_reserve(struct session_store *st, attn_kv *kv, int32_t n_new) {
    /* The engine's own checks, first, so that a reservation it would refuse evicts nobody. */
    if (n_new < 0) {
        return ATTN_EINVAL;
    }
    if ((int64_t)attn_kv_len(kv) + n_new > attn_model_config(st->model)->max_seq) {
        return ATTN_ERANGE;
    }
    int rc = make_room(st, attn_kv_blocks_needed(kv, n_new), NULL);
    if (rc != 0) {
        return rc;
    }
    rc = attn_kv_reserve(kv, n_new);
    return rc == ATTN_ENOSPC ? ERROR_KV_BUDGET_EXHAUSTED : rc;
}

void session_kv_unreserve(attn_kv *kv) {
    attn_kv_truncate(kv, attn_kv_len(kv));
}

/* ---- the disk tier -------------------------------------------------------------------------- */

int session_add_on_disk(struct session_store *st, const char *id, size_t bytes, int32_t n_tokens,
                        int64_t last_used_ms) {
    enum session_state state;
    if (session_find(st, id, &state) != NULL || state == SESSION_STATE_ON_DISK) {
        return ERROR_SESSION_EXISTS;
    }
    struct session *s = calloc(1, sizeof *s);
    if (s == NULL) {
        return ATTN_ENOMEM;
    }
    /* An entry on disk needs no per-layer arrays until it is restored; session_free and the
     * getters cope with them NULL (layer_count 0). */
    strcpy(s->id, id);
    s->layer_first = st->layer_first;
    s->is_on_disk = true;
    s->disk_bytes = bytes;
    s->disk_tokens = n_tokens;
    s->last_used_ms = last_used_ms;
    struct session **b = bucket_of(st, id);
    s->hash_next = *b;
    *b = s;
    lru_push_front(st, s);
    st->n_on_disk++;
    st->disk_used += bytes;
    fit_disk_budget(st);
    return 0;
}

int session_restore_begin(struct session_store *st, const char *id, int64_t now_ms,
                          struct session_turn **out) {
    struct session *s = find_any(st, id);
    if (s == NULL || !s->is_on_disk) {
        return ERROR_SESSION_NOT_FOUND;
    }
    /* Off the disk list first: the eviction below may spill another session, whose file can
     * push the disk over its budget, and the oldest files are then dropped: not this one (it
     * was freed under the caller). */
    lru_unlink(st, s);
    st->n_on_disk--;
    st->disk_used -= s->disk_bytes;
    int rc = fit_max_sessions(st);
    if (rc == 0 && s->kv == NULL && alloc_layers(s, st->layer_count) != 0) {
        rc = ATTN_ENOMEM; /* alloc_layers made nothing: the next try allocates again */
    }
    if (rc != 0) {
        lru_push_front(st, s); /* still on disk, the most recently asked for */
        st->n_on_disk++;
        st->disk_used += s->disk_bytes;
        fit_disk_budget(st); /* a spill above may have filled it while this was off */
        return rc;
    }
    s->is_on_disk = false;
    s->is_restoring = true;
    s->restore_error = 0;
    lru_push_front(st, s);
    st->n_sessions++;
    s->pins++;
    s->last_used_ms = now_ms;
    s->is_turn_taken = true;
    s->turn.s = s;
    *out = &s->turn;
    return 0;
}

void session_restore_prepare_room(struct session_store *st, struct session_turn *t) {
    /* the blocks the caches held when they were written, which they take again (a file found
     * at start: not known, nothing done); make_room evicts nobody when they could not be had */
    if (t->s->disk_blocks > 0) {
        make_room(st, t->s->disk_blocks, t->s);
    }
}

void session_restore_end(struct session_store *st, struct session_turn *t, int status,
                         const char *why, int64_t now_ms) {
    struct session *s = t->s;
    s->is_restoring = false;
    s->restore_error = status;
    snprintf(s->restore_why, sizeof s->restore_why, "%s", why != NULL ? why : "");
    refresh(s);
    s->is_turn_taken = false;
    session_unpin(st, s, now_ms);
}

int session_store_make_room(struct session_store *st, int32_t blocks, const struct session *keep) {
    return make_room(st, blocks, keep);
}

void session_kv_install(struct session_turn *t, int32_t layer, attn_kv *kv) {
    struct session *s = t->s;
    int32_t i = layer - s->layer_first;
    attn_kv_destroy(s->kv[i]);
    s->kv[i] = kv;
    refresh(s);
}

/* A session whose restore found memory short, once nothing holds it: on disk again, as before
 * (its file was left in place). */
static void back_to_disk(struct session_store *st, struct session *s) {
    lru_unlink(st, s);
    st->n_sessions--;
    s->is_on_disk = true;
    s->restore_error = 0;
    lru_push_front(st, s);
    st->n_on_disk++;
    st->disk_used += s->disk_bytes;
    fit_disk_budget(st);
}

int session_disk_forget(struct session_store *st, const char *id) {
    struct session *s = find_any(st, id);
    if (s == NULL || !s->is_on_disk) {
        return ERROR_SESSION_NOT_FOUND;
    }
    drop(st, s);
    return 0;
}

/* A DELETE of a session on disk while its file is removed: what puts it back if the file stays. */
struct disk_delete {
    struct session_store *st;
    char id[129]; /* as a session's */
    size_t bytes;
    int32_t tokens;
    int64_t last_used_ms;
    void (*done)(void *done_ctx, int status);
    void *done_ctx;
};

/* A file that could not be removed still holds the session: it is on disk again, as before the
 * DELETE, or it was answered 204 and came back at the next start (found by an outside audit
 * failing the removal's unlinkat). An id taken meanwhile (a new session, which writes over the
 * file when it is spilled) is left as it is. */
static void disk_delete_done(void *ctx, int status) {
    struct disk_delete *d = ctx;
    if (status != 0 && status != -ENOENT) {
        int rc = session_add_on_disk(d->st, d->id, d->bytes, d->tokens, d->last_used_ms);
        if (rc != 0) {
            LOG_WARN("session",
                     "session=%s: its file could not be removed, and the id is %s: a restart "
                     "may serve the file",
                     d->id, rc == ERROR_SESSION_EXISTS ? "taken again" : "out of memory");
        }
    }
    d->done(d->done_ctx, status == -ENOENT ? 0 : status);
    free(d);
}

int session_disk_delete(struct session_store *st, const char *id,
                        void (*done)(void *done_ctx, int status), void *done_ctx) {
    struct session *s = find_any(st, id);
    if (s == NULL || !s->is_on_disk) {
        return ERROR_SESSION_NOT_FOUND;
    }
    struct disk_delete *d = malloc(sizeof *d);
    if (d == NULL) {
        return ATTN_ENOMEM;
    }
    *d = (struct disk_delete){st,   "",      s->disk_bytes, s->disk_tokens, s->last_used_ms,
                              done, done_ctx};
    snprintf(d->id, sizeof d->id, "%s", s->id);
    /* gone from the store first: the removal's done may run before remove_then returns */
    unlink_session(st, s);
    session_free(st, s);
    st->disk.remove_then(st->disk.ctx, d->id, disk_delete_done, d);
    return 0;
}

void session_store_spill_all(struct session_store *st) {
    struct session *s = st->lru_tail;
    while (s != NULL) {
        struct session *prev = s->lru_prev;
        /* not an eviction: neither counted as one nor logged with a budget's reason; one that
         * cannot be written is lost with the process, as any session without a disk tier, but
         * with a tombstone (the list is written after these files), as an eviction whose file
         * could not be written leaves one: without it the id answered 404 after the restart,
         * and an attend made a fresh empty session under it (found by an outside audit: a
         * session alone past --state-budget-mb, or a file image that could not be allocated) */
        if (is_idle(s) && session_n_layers_used(s) > 0 && st->disk.save != NULL) {
            int32_t tokens = session_n_tokens(s);
            if (spill(st, s)) {
                LOG_INFO("session", "spilled req=- session=%s reason=shutdown tokens=%d bytes=%zu",
                         s->id, (int)s->disk_tokens, s->disk_bytes);
            } else {
                LOG_WARN("session", "lost req=- session=%s reason=shutdown tokens=%d: not written",
                         s->id, (int)tokens);
                tomb_add(st, s->id, false);
            }
        }
        s = prev;
    }
}
