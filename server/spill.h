/* server/spill.h: the disk tier (--state-dir): sessions evicted for memory are written to files
 * (snapshot.h) instead of dropped, and read back, transparently, when a request names them;
 * at shutdown every session in memory is written, and at start the files of the same model are
 * found again. It ties the session store (which decides who goes), the file format and the
 * directory's I/O thread (statedir.h) together.
 *
 * Thread rule: loop thread only (the file I/O and checksums run on statedir's thread).
 */
#ifndef SERVER_SPILL_H
#define SERVER_SPILL_H

#include <stddef.h>
#include <stdint.h>

#include <uv.h>

#include "../engine/attn.h"
#include "metrics.h"
#include "pool.h"
#include "session.h"
#include "snapshot.h"

struct spill; /* opaque */

struct spill_params {
    uv_loop_t *loop;
    const char *dir;
    size_t budget_bytes; /* --state-budget-mb: files at most */
    struct session_store *sessions;
    const attn_model *model;
    struct snapshot_kv kv; /* what the pool holds (snapshot_kv_of) */
};

/* Opens the directory, finds the sessions its files hold for this model (other files are left
 * alone, and logged), and turns the store's disk tier on. Returns 0 or -1 with a one-line reason
 * in err. */
int spill_open(const struct spill_params *p, struct spill **out, char *err, size_t err_size);

/* The pool whose queued jobs wait for restores (kicked when one ends). */
void spill_set_pool(struct spill *sp, struct pool *pool);

/* Starts bringing the session id back from disk; *out gets it, in memory with its turn held by
 * the read: the caller pins it and queues its job, which runs once the read is done (or fails
 * with the restore's error). Returns 0, ERROR_SESSION_NOT_FOUND (not on disk),
 * ERROR_KV_BUDGET_EXHAUSTED or ATTN_ENOMEM. */
int spill_restore(struct spill *sp, const char *id, struct session **out);

/* Writes every session in memory to disk and waits for every file operation (at shutdown, once
 * no request is left). */
void spill_save_all(struct spill *sp);

/* Waits for the queued file operations and frees sp. Returns how many sessions were lost since
 * spill_save_all (writes that failed, or that could not be queued: a file past the budget, no
 * memory), 0 for NULL. */
int32_t spill_close(struct spill *sp);

/* The tier's counters, for GET /metrics. */
void spill_get_metrics(const struct spill *sp, struct metrics_disk *out);

#endif /* SERVER_SPILL_H */
