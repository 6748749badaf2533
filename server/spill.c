/* server/spill.c: the disk tier (see spill.h). A session's file is DIR/<id>.session; ids are
 * [A-Za-z0-9._:-], so they are file names as they are, and the suffix keeps "." and ".." apart.
 */
#include "spill.h"

#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "api.h"
#include "error.h"
#include "log.h"
#include "snapshot.h"
#include "statedir.h"

#define SUFFIX ".session"

/* The tombstones a clean shutdown leaves (see save_tombstones), one list a model (by its
 * fingerprint's first 16 hex digits), so that two models sharing a directory keep theirs; not a
 * session file's name. */
#define TOMBSTONES_NAME   "tombstones-%.16s.list"
#define TOMBSTONES_HEADER "attnd-tombstones 1 "
/* Every TOMBSTONES_SYNC_MS while the server runs (a second a MiB for a long list), the list is
 * written again if it changed since it was last written, so that a server killed without its
 * shutdown (SIGKILL, a crash, the machine) keeps all but the last moments' tombstones: an
 * evicted id answers 410 after the restart, and one a DELETE freed stays free (the last
 * shutdown's list brought it back). Its write queues behind the session files' (one I/O
 * thread). */
#define TOMBSTONES_SYNC_MS 1000
#define TOMBSTONES_MAX     ((size_t)64 << 20)

struct spill {
    struct spill_params p;
    struct statedir *dir;
    struct pool *pool;
    size_t max_pending; /* written bytes queued at most; past it an eviction drops instead */
    struct metrics_disk m;
    uint64_t n_not_written; /* sessions save() could not queue, dropped (pending, size, memory) */
    /* failed writes and n_not_written when shutdown's writes began (a file dropped for
     * --state-budget-mb then is the disk tier's policy, as at any time, not a loss) */
    uint64_t lost_before_save_all;
    char **foreign; /* sorted: ids whose files this server leaves alone (see is_foreign) */
    int32_t n_foreign, cap_foreign;
    bool is_closing; /* shutdown's writes have begun: a restore still under way stays on disk */
    /* the tombstone list on disk follows the store's while the server runs (see sync_tombstones) */
    uv_timer_t *tomb_timer; /* malloc'd: its close ends after the spill is freed */
    uint64_t tomb_synced;   /* session_tombstones_changes when the last list was queued
                               (TOMB_UNSYNCED: the list on disk is not the store's) */
    int64_t tomb_next_ms;   /* no write of the list before (mono_ms) */
    bool is_tomb_writing;
    bool has_tomb_failed; /* the last write failed (logged once until one succeeds) */
};

/* One write or restore in flight. */
struct spill_op {
    struct spill *sp;
    char id[API_SESSION_ID_MAX + 1];
    struct session_turn *turn; /* a restore's */
    uint64_t started_ns;
    int check_rc; /* the I/O thread's verdict on the file, and why */
    char msg[256];
    /* a restore's caches, taken into the pool while the I/O thread checks the file */
    bool is_imported;
    int import_rc;
    char import_msg[256];
};

static void file_name(char *out, size_t size, const char *id) {
    snprintf(out, size, "%s" SUFFIX, id);
}

static int64_t unix_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static int64_t mono_ms(void) {
    return (int64_t)(uv_hrtime() / 1000000);
}

/* ---- files left alone ----------------------------------------------------------------------- */

static int by_id(const void *a, const void *b) {
    return strcmp(*(char *const *)a, *(char *const *)b);
}

/* session_disk_ops.is_foreign */
static bool is_foreign(void *ctx, const char *id) {
    const struct spill *sp = ctx;
    return sp->n_foreign > 0 &&
           bsearch(&id, sp->foreign, (size_t)sp->n_foreign, sizeof *sp->foreign, by_id) != NULL;
}

/* Appends id to the list, unsorted (the start's scan sorts it once after: each insertion in
 * order made the start quadratic, 5.5 s for 80,000 files left alone). Returns 0 or -1. */
static int foreign_append(struct spill *sp, const char *id) {
    if (sp->n_foreign == sp->cap_foreign) {
        int32_t cap = sp->cap_foreign > 0 ? 2 * sp->cap_foreign : 16;
        char **a = realloc(sp->foreign, (size_t)cap * sizeof *a);
        if (a == NULL) {
            return -1;
        }
        sp->foreign = a;
        sp->cap_foreign = cap;
    }
    char *copy = strdup(id);
    if (copy == NULL) {
        return -1;
    }
    sp->foreign[sp->n_foreign++] = copy;
    return 0;
}

/* Remembers that DIR/<id>.session is left alone, so no session of that id writes over it.
 * Returns 0, or -1 out of memory (the id is then only logged). */
static int foreign_add(struct spill *sp, const char *id) {
    if (is_foreign(sp, id)) {
        return 0;
    }
    if (foreign_append(sp, id) != 0) {
        return -1;
    }
    /* into its place: the list stays sorted for is_foreign's bsearch */
    int32_t at = sp->n_foreign - 1;
    char *copy = sp->foreign[at];
    while (at > 0 && strcmp(sp->foreign[at - 1], copy) > 0) {
        sp->foreign[at] = sp->foreign[at - 1];
        at--;
    }
    sp->foreign[at] = copy;
    return 0;
}

/* ---- writing -------------------------------------------------------------------------------- */

static void seal(uint8_t *data, size_t len) {
    snapshot_seal(data, len);
}

static void write_done(void *ctx, int status, uint8_t *data, size_t len) {
    (void)data;
    (void)len;
    struct spill_op *op = ctx;
    if (status != 0) {
        /* The store counts the session on disk; without its file it is gone. */
        LOG_WARN("spill", "session=%s could not be written (%s): dropped", op->id,
                 strerror(-status));
        op->sp->m.spill_failures++;
        session_disk_forget(op->sp->p.sessions, op->id);
    }
    free(op);
}

/* Queues s's file; its size, or 0 if it is not written. */
static size_t write_session(struct spill *sp, struct session *s) {
    if (statedir_pending_bytes(sp->dir) > sp->max_pending) {
        LOG_WARN("spill", "session=%s not written: %zu bytes already wait for the disk",
                 session_id(s), statedir_pending_bytes(sp->dir));
        return 0;
    }
    if (snapshot_bytes(s, sp->p.model) > sp->p.budget_bytes) {
        return 0; /* it alone would not fit: dropped as without a disk tier, before any copy */
    }
    uint8_t *file;
    size_t len;
    struct spill_op *op = calloc(1, sizeof *op);
    /* the header's time is the session's last use, so that a restart lists the sessions read
     * back in the order they were used: files written together at shutdown share their mtime
     * (one tick of the kernel's clock) */
    int64_t last_used = unix_ms() - session_idle_ms(s, mono_ms());
    if (op == NULL || snapshot_encode(s, sp->p.model, sp->p.kv, last_used, &file, &len) != 0) {
        free(op);
        return 0;
    }
    op->sp = sp;
    snprintf(op->id, sizeof op->id, "%s", session_id(s));
    char name[API_SESSION_ID_MAX + 16];
    file_name(name, sizeof name, op->id);
    if (statedir_write(sp->dir, name, file, len, seal, write_done, op) != 0) {
        free(op);
        return 0;
    }
    sp->m.spills++;
    return len;
}

/* session_disk_ops.save: the session's caches as a file, queued for the I/O thread. */
static size_t save(void *ctx, struct session *s) {
    struct spill *sp = ctx;
    size_t len = write_session(sp, s);
    sp->n_not_written += len == 0; /* the session is dropped as without a disk tier */
    return len;
}

/* session_disk_ops.remove */
static void remove_file(void *ctx, const char *id) {
    struct spill *sp = ctx;
    char name[API_SESSION_ID_MAX + 16];
    file_name(name, sizeof name, id);
    statedir_remove(sp->dir, name, NULL, NULL);
}

/* session_disk_ops.remove_then: the removal, then done on the loop. */
struct removal {
    char id[API_SESSION_ID_MAX + 1];
    void (*done)(void *done_ctx, int status);
    void *done_ctx;
};

static void removal_done(void *ctx, int status, uint8_t *data, size_t len) {
    (void)data;
    (void)len;
    struct removal *r = ctx;
    if (status != 0 && status != -ENOENT) {
        LOG_WARN("spill", "session=%s not deleted: its file stays: %s", r->id, strerror(-status));
    }
    r->done(r->done_ctx, status);
    free(r);
}

static void remove_file_then(void *ctx, const char *id, void (*done)(void *done_ctx, int status),
                             void *done_ctx) {
    struct spill *sp = ctx;
    struct removal *r = malloc(sizeof *r);
    char name[API_SESSION_ID_MAX + 16];
    file_name(name, sizeof name, id);
    if (r != NULL) {
        snprintf(r->id, sizeof r->id, "%s", id);
        r->done = done;
        r->done_ctx = done_ctx;
    }
    if (r == NULL || statedir_remove(sp->dir, name, removal_done, r) != 0) {
        LOG_WARN("spill", "session=%s not deleted: out of memory to remove its file", id);
        free(r);
        done(done_ctx, -ENOMEM);
    }
}

/* ---- restoring ------------------------------------------------------------------------------ */

/* I/O thread: the file's framing and checksum, before the loop sees it. */
static int check(void *ctx, const uint8_t *data, size_t len) {
    struct spill_op *op = ctx;
    struct snapshot_info info;
    op->check_rc = snapshot_check(data, len, &info, op->msg, sizeof op->msg);
    if (op->check_rc == 0 && strcmp(info.id, op->id) != 0) {
        snprintf(op->msg, sizeof op->msg, "the file holds session %s", info.id);
        op->check_rc = ERROR_CORRUPT_SESSION;
    }
    return op->check_rc != 0 ? -EBADMSG : 0;
}

/* Loop: the file's caches into the pool (its model first), all or nothing; why not in
 * op->import_msg. */
static void import_file(struct spill_op *op, const uint8_t *data, size_t len) {
    struct spill *sp = op->sp;
    struct snapshot_info info;
    char *msg = op->import_msg;
    size_t size = sizeof op->import_msg;
    int rc = snapshot_read_header(data, len, &info, msg, size);
    if (rc == 0) {
        rc = snapshot_match(&info, sp->p.model, sp->p.kv, msg, size);
    }
    if (rc == 0) {
        rc = snapshot_restore(sp->p.sessions, op->turn, data, len, msg, size);
    }
    op->is_imported = true;
    op->import_rc = rc;
}

/* Loop, while the I/O thread checksums the file: its caches go into the pool now, so that the
 * copy runs beside the checksum instead of after it (0.35 of a 2048-token llama8b layer's
 * 3.5 ms). The session's turn is held, so no request reads them before restore_done, which
 * takes them out again if the file fails (snapshot_restore checks every section's framing
 * itself: unchecked bytes can be wrong, never unsafe). Until then GET /v1/sessions may show
 * their length; and the room they take may have moved idle sessions to disk for a file that
 * then fails, as session_restore_prepare_room may have. */
static void restore_arrived(void *ctx, const uint8_t *data, size_t len) {
    struct spill_op *op = ctx;
    if (!op->sp->is_closing) { /* at shutdown the session stays in its file */
        import_file(op, data, len);
    }
}

/* A restored session's file is gone: only now may its requests change it, or a process killed
 * in between would find the old file at its next start and serve the session as it was before
 * those requests (found by an outside audit: 5 of 10 SIGKILLs right after a restored session's
 * next step brought it back at its old length). A file that cannot be removed keeps the session
 * on disk, as the file has it, and its requests fail (500): they went on from memory, and the
 * file, older with each, came back at the next start, or at the next restore once a later spill
 * of the session failed (found by an outside audit injecting unlinkat failures). */
static void restored_file_removed(void *ctx, int status, uint8_t *data, size_t len) {
    (void)data;
    (void)len;
    struct spill_op *op = ctx;
    struct spill *sp = op->sp;
    if (status != 0 && status != -ENOENT) {
        char why[128];
        snprintf(why, sizeof why, "its file could not be removed once read back (%s)",
                 strerror(-status));
        LOG_WARN("spill", "session=%s not restored: %s: it stays on disk as saved", op->id, why);
        session_clear(sp->p.sessions, op->turn);
        session_restore_end(sp->p.sessions, op->turn, ERROR_INTERNAL, why, mono_ms());
    } else {
        session_restore_end(sp->p.sessions, op->turn, 0, NULL, mono_ms());
    }
    if (sp->pool != NULL) {
        pool_wake(sp->pool);
    }
    free(op);
}

static void restore_done(void *ctx, int status, uint8_t *data, size_t len) {
    struct spill_op *op = ctx;
    struct spill *sp = op->sp;
    int rc = 0;
    if (status == -ENOMEM || status == -EMFILE || status == -ENFILE ||
        (status == 0 && sp->is_closing)) {
        /* The file is fine, or not known to be bad: memory is short (for the read's buffer),
         * descriptors are (the process's or the system's: its open failed before a byte was
         * read; taking that for a bad file removed a sound one, found by an outside audit's
         * fault injection), or shutdown has written every other session and would not write
         * this one again. It stays on disk. */
        rc = ERROR_KV_BUDGET_EXHAUSTED;
        snprintf(op->msg, sizeof op->msg, "%s",
                 status == 0         ? "attnd is shutting down"
                 : status == -ENOMEM ? "no memory to read the file into"
                                     : "no file descriptor to read the file with");
    } else if (status == -EFBIG && op->check_rc == 0) {
        /* longer than its header states, refused before a byte was read (statedir's max_len):
         * a framing fault like a file cut short, and counted corrupt with it (it read "cannot
         * read it: File too large" and was not) */
        rc = ERROR_CORRUPT_SESSION;
        snprintf(op->msg, sizeof op->msg,
                 "the session file is longer than its header says (torn, or extended?)");
    } else if (status != 0) {
        rc = op->check_rc != 0 ? op->check_rc : ERROR_SESSION_LOST;
        if (op->check_rc == 0) {
            snprintf(op->msg, sizeof op->msg, "cannot read it: %s", strerror(-status));
        }
    } else {
        if (!op->is_imported) {
            import_file(op, data, len);
        }
        rc = op->import_rc;
        memcpy(op->msg, op->import_msg, sizeof op->msg);
    }
    if (rc != 0 && op->is_imported && op->import_rc == 0) {
        session_clear(sp->p.sessions, op->turn); /* taken in, but the session is not coming back */
    }
    statedir_release(sp->dir, data, len);
    double seconds = (double)(uv_hrtime() - op->started_ns) / 1e9;
    char name[API_SESSION_ID_MAX + 16];
    file_name(name, sizeof name, op->id);
    if (rc == 0) {
        sp->m.restores++;
        sp->m.restore_sum_s += seconds;
        int b = 0;
        while (b < METRICS_N_RESTORE_BUCKETS && seconds > metrics_restore_le[b]) {
            b++;
        }
        if (b < METRICS_N_RESTORE_BUCKETS) {
            sp->m.restore_buckets[b]++;
        }
        LOG_INFO("spill", "restored req=- session=%s bytes=%zu ms=%.2f", op->id, len,
                 seconds * 1e3);
        /* memory holds the truth now: the turn is held until the file is gone */
        if (statedir_remove(sp->dir, name, restored_file_removed, op) != 0) {
            restored_file_removed(op, -ENOMEM, NULL, 0); /* as a removal that failed */
        }
        return;
    } else if (rc == ERROR_FINGERPRINT_MISMATCH) {
        /* A sound file this server cannot hold (a sliding window saved with another
         * --kv-block-tokens): left alone, as at start, not lost. */
        LOG_WARN("spill", "left alone %s: %s", name, op->msg);
        if (foreign_add(sp, op->id) != 0) {
            LOG_WARN("spill", "out of memory: session %s may be created over %s", op->id, name);
        }
        session_restore_end(sp->p.sessions, op->turn, ERROR_SESSION_FILE_FOREIGN, op->msg,
                            mono_ms());
    } else if (rc == ERROR_KV_BUDGET_EXHAUSTED || rc == ATTN_ENOMEM) {
        /* The file is fine; memory is short. It stays on disk for a later request. */
        LOG_WARN("spill", "session=%s not restored: %s", op->id, op->msg);
        session_restore_end(sp->p.sessions, op->turn, ERROR_KV_BUDGET_EXHAUSTED, NULL, mono_ms());
    } else {
        sp->m.restore_failures++;
        sp->m.corrupt += rc == ERROR_CORRUPT_SESSION;
        LOG_WARN("spill", "session=%s refused at restore, now gone: %s", op->id, op->msg);
        statedir_remove(sp->dir, name, NULL, NULL); /* never served */
        session_restore_end(sp->p.sessions, op->turn, ERROR_SESSION_LOST, op->msg, mono_ms());
    }
    if (sp->pool != NULL) {
        pool_wake(sp->pool);
    }
    free(op);
}

int spill_restore(struct spill *sp, const char *id, struct session **out) {
    struct spill_op *op = calloc(1, sizeof *op);
    if (op == NULL) {
        return ATTN_ENOMEM;
    }
    int rc = session_restore_begin(sp->p.sessions, id, mono_ms(), &op->turn);
    if (rc != 0) {
        free(op);
        return rc;
    }
    op->sp = sp;
    op->started_ns = uv_hrtime();
    snprintf(op->id, sizeof op->id, "%s", id);
    char name[API_SESSION_ID_MAX + 16];
    file_name(name, sizeof name, id);
    struct session *s = session_turn_session(op->turn);
    if (statedir_read(sp->dir, name, session_disk_bytes(s), check, restore_arrived, restore_done,
                      op) != 0) {
        /* back to disk: the caller gets no session to queue on */
        session_restore_end(sp->p.sessions, op->turn, ERROR_KV_BUDGET_EXHAUSTED, NULL, mono_ms());
        free(op);
        return ATTN_ENOMEM;
    }
    /* after the read is queued: the spills this makes queue their writes behind it (a 2048-token
     * llama8b layer evicting another: 4.2-4.7 -> 3.5-3.8 ms) */
    session_restore_prepare_room(sp->p.sessions, op->turn);
    *out = s;
    return 0;
}

/* ---- start and stop ------------------------------------------------------------------------- */

struct found {
    char id[API_SESSION_ID_MAX + 1];
    uint64_t bytes;
    int32_t n_tokens;
    int64_t used_ms; /* the session's last use, from its header (wall clock) */
    bool is_too_big; /* alone larger than --state-budget-mb */
};

struct scan {
    struct spill *sp;
    struct found *all;
    int32_t n, cap;
    int32_t n_other;
    bool is_short; /* a file could not be listed (memory): the start is refused */
};

static void on_file(void *ctx, const char *name, const uint8_t *head, size_t n, uint64_t size,
                    bool is_file) {
    struct scan *sc = ctx;
    struct snapshot_info info;
    char msg[256] = "not a regular file";
    int rc = is_file ? snapshot_read_header(head, n, &info, msg, sizeof msg) : -1;
    if (rc == 0) {
        rc = snapshot_match(&info, sc->sp->p.model, sc->sp->p.kv, msg, sizeof msg);
    }
    char want[API_SESSION_ID_MAX + 16];
    if (rc == 0) {
        file_name(want, sizeof want, info.id);
        if (strcmp(want, name) != 0) {
            snprintf(msg, sizeof msg, "it holds session %s", info.id);
            rc = -1;
        }
    }
    if (rc != 0) {
        LOG_WARN("spill", "left alone %s: %s", name, msg);
        sc->n_other++;
        size_t n_id = strlen(name) - strlen(SUFFIX); /* the scan passes names with the suffix */
        char id[API_SESSION_ID_MAX + 1];
        if (n_id <= API_SESSION_ID_MAX) {
            memcpy(id, name, n_id);
            id[n_id] = '\0';
            sc->is_short |= foreign_append(sc->sp, id) != 0;
        }
        return;
    }
    if (sc->n == sc->cap) {
        int32_t cap = sc->cap > 0 ? 2 * sc->cap : 64;
        struct found *a = realloc(sc->all, (size_t)cap * sizeof *a);
        if (a == NULL) {
            sc->is_short = true;
            return;
        }
        sc->all = a;
        sc->cap = cap;
    }
    struct found *f = &sc->all[sc->n++];
    snprintf(f->id, sizeof f->id, "%s", info.id);
    /* a file longer than its header says (torn, or extended: its restore will say it is lost)
     * costs the budget no more than a sound one would */
    f->bytes = size < info.file_bytes ? size : info.file_bytes;
    f->is_too_big = f->bytes > sc->sp->p.budget_bytes;
    f->n_tokens = info.n_tokens;
    f->used_ms = info.saved_unix_ms;
}

/* Least recently used first, and before all a file the budget cannot hold at all: the budget
 * then drops it first, not every other session before it. */
static int by_use(const void *a, const void *b) {
    const struct found *x = a, *y = b;
    if (x->is_too_big != y->is_too_big) {
        return x->is_too_big ? -1 : 1;
    }
    return (x->used_ms > y->used_ms) - (x->used_ms < y->used_ms);
}

/* ---- tombstones across restarts --------------------------------------------------------------
 * An id dropped from disk (--state-budget-mb, a failed write, ttl) or lost answers 410 while the
 * server runs; written at shutdown and read at the next start, it goes on doing so after a
 * restart, instead of 404 and, for an attend, a fresh empty session under the old id. The file:
 * a header line with the model's fingerprint, then "E <id>" (evicted) or "L <id>" (lost) a
 * line, oldest first. Another model's list is another file, left alone. */

static void fingerprint_hex(const attn_model *m, char out[SNAPSHOT_FINGERPRINT_HEX]) {
    uint8_t fp[ATTN_FINGERPRINT_BYTES];
    attn_model_fingerprint(m, fp);
    snapshot_fingerprint_hex(fp, out);
}

struct tomb_text {
    char *data;
    size_t len, cap;
    int32_t n;
    bool has_failed;
};

static void tomb_line(void *ctx, const char *id, bool is_lost) {
    struct tomb_text *t = ctx;
    size_t need = strlen(id) + 4;
    if (!t->has_failed && t->len + need > t->cap) {
        char *grown = realloc(t->data, 2 * (t->len + need));
        t->has_failed = grown == NULL;
        t->data = grown != NULL ? grown : t->data;
        t->cap = grown != NULL ? 2 * (t->len + need) : t->cap;
    }
    if (!t->has_failed) {
        t->len +=
            (size_t)snprintf(t->data + t->len, t->cap - t->len, "%c %s\n", is_lost ? 'L' : 'E', id);
        t->n++;
    }
}

static void tombstones_written(void *ctx, int status, uint8_t *data, size_t len) {
    (void)ctx;
    (void)data;
    (void)len;
    if (status != 0) {
        LOG_WARN("spill",
                 "cannot write the tombstones: %s: evicted ids answer 404, not 410, after the "
                 "restart",
                 strerror(-status));
    }
}

/* tomb_synced when the list on disk is not the store's: never a count of changes. */
#define TOMB_UNSYNCED UINT64_MAX

/* A running server's write of the list: the next may start. One that failed is tried again at
 * the next tick (logged once until a write succeeds). statedir_close_with runs the callbacks of
 * every write before spill_close frees the spill. */
static void tombstones_synced(void *ctx, int status, uint8_t *data, size_t len) {
    struct spill *sp = ctx;
    sp->is_tomb_writing = false;
    if (status != 0) {
        sp->tomb_synced = TOMB_UNSYNCED;
        if (!sp->has_tomb_failed) {
            tombstones_written(ctx, status, data, len);
        }
    } else if (sp->has_tomb_failed) {
        LOG_INFO("spill", "the tombstone list is written again");
    }
    sp->has_tomb_failed = status != 0;
}

/* Writes the list as the store holds it now (done: tombstones_synced while the server runs,
 * tombstones_written at shutdown, which touches nothing of the spill). Returns how many ids it
 * holds, or -1 when it could not be queued. */
static int32_t write_tombstones(struct spill *sp, statedir_done_fn done) {
    char fp[SNAPSHOT_FINGERPRINT_HEX], name[64];
    fingerprint_hex(sp->p.model, fp);
    snprintf(name, sizeof name, TOMBSTONES_NAME, fp);
    struct tomb_text t = {NULL, 0, 4096, 0, false};
    t.data = malloc(t.cap);
    t.has_failed = t.data == NULL;
    if (!t.has_failed) {
        t.len = (size_t)snprintf(t.data, t.cap, "%s%s\n", TOMBSTONES_HEADER, fp);
    }
    session_tombstones_each(sp->p.sessions, tomb_line, &t);
    if (t.has_failed ||
        statedir_write(sp->dir, name, (uint8_t *)t.data, t.len, NULL, done, sp) != 0) {
        free(t.has_failed ? t.data : NULL); /* statedir_write frees what it was given */
        LOG_WARN("spill", "out of memory for %s: evicted ids may answer 404 after a restart", name);
        return -1;
    }
    sp->tomb_synced = session_tombstones_changes(sp->p.sessions);
    /* a long list waits longer for its next write, a second a MiB: under steady evictions the
     * rewrites take at most about 1 MiB/s of the I/O thread, which restores queue behind */
    size_t mib = t.len >> 20;
    sp->tomb_next_ms =
        mono_ms() + (mib > 1 ? (int64_t)mib * TOMBSTONES_SYNC_MS : TOMBSTONES_SYNC_MS);
    return t.n;
}

/* statedir_close_with's last step: the list, once every write of the shutdown has ended (a
 * write that failed leaves a tombstone too). */
static void save_tombstones(void *ctx) {
    struct spill *sp = ctx;
    int32_t n = write_tombstones(sp, tombstones_written);
    if (n >= 0) {
        LOG_INFO("spill", "shutdown: %d tombstones of evicted or lost ids written", (int)n);
    }
}

static void sync_tombstones(uv_timer_t *timer) {
    struct spill *sp = timer->data;
    if (!sp->is_closing && !sp->is_tomb_writing && mono_ms() >= sp->tomb_next_ms &&
        session_tombstones_changes(sp->p.sessions) != sp->tomb_synced) {
        sp->is_tomb_writing = write_tombstones(sp, tombstones_synced) >= 0;
    }
}

static void free_timer(uv_handle_t *h) {
    free(h);
}

/* At start, after the session files: the last list's tombstones, but for ids that have a file
 * (a session on disk, or one left alone) now. Returns 1 when the store now holds a list other
 * than the file's (lines skipped), which the first sync then writes, 0, or -1 with a reason in
 * err when the list is there but could not be read (an I/O error, memory, descriptors): the
 * first sync would write the store's list over it, and every id it held would answer 404. */
static int load_tombstones(struct spill *sp, char *err, size_t err_size) {
    char fp[SNAPSHOT_FINGERPRINT_HEX], name[64];
    fingerprint_hex(sp->p.model, fp);
    snprintf(name, sizeof name, TOMBSTONES_NAME, fp);
    uint8_t *data = NULL;
    size_t len = 0;
    int rc = statedir_read_now(sp->dir, name, TOMBSTONES_MAX, &data, &len);
    if (rc == -ENOENT) {
        return 0;
    }
    if (rc != 0 && rc != -EFBIG && rc != -EINVAL) { /* not one it would leave alone */
        snprintf(err, err_size, "--state-dir %s: cannot read %s: %s", sp->p.dir, name,
                 strerror(-rc));
        return -1;
    }
    size_t hl = strlen(TOMBSTONES_HEADER);
    if (rc != 0 || len < hl + 2 * ATTN_FINGERPRINT_BYTES + 1 ||
        memcmp(data, TOMBSTONES_HEADER, hl) != 0 || data[hl + 2 * ATTN_FINGERPRINT_BYTES] != '\n') {
        LOG_WARN("spill", "left alone %s: %s", name,
                 rc != 0 ? strerror(-rc) : "not a tombstone list");
        free(data);
        return 0;
    }
    if (memcmp(data + hl, fp, 2 * ATTN_FINGERPRINT_BYTES) != 0) {
        LOG_INFO("spill", "left alone %s: another model's", name);
        free(data);
        return 0;
    }
    int32_t n = 0, n_bad = 0, n_skipped = 0;
    const char *p = (const char *)data + hl + 2 * ATTN_FINGERPRINT_BYTES + 1;
    const char *end = (const char *)data + len;
    while (p < end) {
        const char *nl = memchr(p, '\n', (size_t)(end - p));
        const char *stop = nl != NULL ? nl : end;
        size_t n_id = stop - p > 2 ? (size_t)(stop - p) - 2 : 0;
        enum session_state state = SESSION_STATE_UNKNOWN;
        char id[API_SESSION_ID_MAX + 1];
        if ((p[0] == 'E' || p[0] == 'L') && p[1] == ' ' && api_session_id_is_valid(p + 2, n_id)) {
            memcpy(id, p + 2, n_id);
            id[n_id] = '\0';
            if (session_find(sp->p.sessions, id, &state) == NULL &&
                state == SESSION_STATE_UNKNOWN && !is_foreign(sp, id)) {
                session_tombstone_add(sp->p.sessions, id, p[0] == 'L');
                n++;
            } else {
                n_skipped++; /* a file has it now (a crash came between the two) */
            }
        } else {
            n_bad++;
        }
        p = stop + 1;
    }
    free(data);
    LOG_INFO("spill", "%d tombstones of evicted or lost ids read from %s%s", (int)n, name,
             n_bad > 0 ? " (some lines malformed, skipped)" : "");
    return n_bad > 0 || n_skipped > 0;
}

/* spill_open's way out once the directory is open: what it made so far, undone. */
static int open_failed(struct spill *sp, struct found *all) {
    free(all);
    for (int32_t i = 0; i < sp->n_foreign; i++) {
        free(sp->foreign[i]);
    }
    free(sp->foreign);
    statedir_close(sp->dir);
    free(sp);
    return -1;
}

int spill_open(const struct spill_params *p, struct spill **out, char *err, size_t err_size) {
    struct spill *sp = calloc(1, sizeof *sp);
    if (sp == NULL) {
        snprintf(err, err_size, "--state-dir: out of memory");
        return -1;
    }
    sp->p = *p;
    if (statedir_open(p->loop, p->dir, &sp->dir, err, err_size) != 0) {
        free(sp);
        return -1;
    }
    struct session_store_stats st;
    session_store_get_stats(p->sessions, &st);
    sp->max_pending = st.bytes_limit > ((size_t)256 << 20) ? st.bytes_limit : (size_t)256 << 20;
    struct session_disk_ops ops = {save, remove_file, remove_file_then, is_foreign, sp};
    session_store_set_disk(p->sessions, &ops, p->budget_bytes);
    /* The files of this model come back, least recently used first (by the last use their
     * headers state) so that the most recent heads the disk list; their times are wall-clock,
     * the store's monotonic: they keep their order, not their age. */
    struct scan sc = {sp, NULL, 0, 0, 0, false};
    int32_t n_files =
        statedir_scan(sp->dir, SUFFIX, SNAPSHOT_HEADER_BYTES + API_SESSION_ID_MAX, on_file, &sc);
    if (n_files < 0 || sc.is_short) {
        /* A file not listed is no session and no file left alone: its id would answer 404, and
         * a new session of that id would be written over it. The start is refused instead. */
        snprintf(err, err_size, "--state-dir %s: cannot list its session files: %s", p->dir,
                 n_files < 0 ? strerror(-n_files) : "out of memory");
        return open_failed(sp, sc.all);
    }
    if (sc.n > 1) {
        qsort(sc.all, (size_t)sc.n, sizeof *sc.all, by_use);
    }
    if (sp->n_foreign > 1) { /* one name a file: no duplicates to drop */
        qsort(sp->foreign, (size_t)sp->n_foreign, sizeof *sp->foreign, by_id);
    }
    int64_t now = mono_ms();
    for (int32_t i = 0; i < sc.n; i++) {
        if (session_add_on_disk(p->sessions, sc.all[i].id, (size_t)sc.all[i].bytes,
                                sc.all[i].n_tokens, now) == ATTN_ENOMEM) {
            snprintf(err, err_size, "--state-dir %s: out of memory for its sessions", p->dir);
            return open_failed(sp, sc.all);
        }
    }
    free(sc.all);
    LOG_INFO("spill", "state dir %s: %d sessions of this model found, %d other files left alone",
             p->dir, (int)sc.n, (int)(n_files - sc.n));
    int loaded = load_tombstones(sp, err, err_size);
    if (loaded < 0) {
        return open_failed(sp, NULL);
    }
    sp->tomb_synced = loaded > 0 ? TOMB_UNSYNCED : session_tombstones_changes(p->sessions);
    sp->tomb_timer = malloc(sizeof *sp->tomb_timer);
    if (sp->tomb_timer != NULL) {
        uv_timer_init(p->loop, sp->tomb_timer);
        sp->tomb_timer->data = sp;
        uv_timer_start(sp->tomb_timer, sync_tombstones, TOMBSTONES_SYNC_MS, TOMBSTONES_SYNC_MS);
        uv_unref((uv_handle_t *)sp->tomb_timer); /* it never keeps the loop (the drain) alive */
    } else {
        LOG_WARN("spill", "out of memory: the tombstone list is written at shutdown only");
    }
    *out = sp;
    return 0;
}

void spill_set_pool(struct spill *sp, struct pool *pool) {
    sp->pool = pool;
}

void spill_save_all(struct spill *sp) {
    struct session_store_stats before;
    session_store_get_stats(sp->p.sessions, &before);
    sp->max_pending = SIZE_MAX; /* at shutdown every session waits its turn for the disk */
    sp->is_closing = true;
    if (sp->tomb_timer != NULL) {
        uv_timer_stop(sp->tomb_timer); /* the shutdown writes the last list */
    }
    sp->lost_before_save_all = sp->m.spill_failures + sp->n_not_written;
    session_store_spill_all(sp->p.sessions);
    LOG_INFO("spill", "shutdown: %d sessions in memory, writing them to %s", (int)before.n_sessions,
             sp->p.dir);
}

int32_t spill_close(struct spill *sp) {
    if (sp == NULL) {
        return 0;
    }
    if (sp->tomb_timer != NULL) {
        uv_timer_stop(sp->tomb_timer);
        uv_close((uv_handle_t *)sp->tomb_timer, free_timer);
    }
    /* runs the last writes' callbacks (a sync of the list among them), which count their
     * failures, then writes the tombstones */
    sp->is_closing = true;
    statedir_close_with(sp->dir, save_tombstones, sp);
    int32_t lost = (int32_t)(sp->m.spill_failures + sp->n_not_written - sp->lost_before_save_all);
    for (int32_t i = 0; i < sp->n_foreign; i++) {
        free(sp->foreign[i]);
    }
    free(sp->foreign);
    free(sp);
    return lost;
}

void spill_get_metrics(const struct spill *sp, struct metrics_disk *out) {
    *out = sp->m;
    struct session_store_stats st;
    session_store_get_stats(sp->p.sessions, &st);
    out->sessions_on_disk = st.n_on_disk;
    out->bytes_on_disk = st.disk_bytes_used;
    out->bytes_limit = st.disk_bytes_limit;
    out->disk_drops = st.disk_drops;
    out->pending_bytes = statedir_pending_bytes(sp->dir);
}
