/* server/statedir.h: the disk tier's directory (--state-dir) and the one thread that does its
 * file I/O, so that neither the event loop nor a compute worker ever waits on the disk.
 *
 * Operations run in the order they were queued, one at a time: a read queued after a write of
 * the same name reads what that write wrote. A write is crash-safe: the bytes go to NAME.tmp,
 * are fsync'd, renamed over NAME, and the directory is fsync'd, so after a crash NAME is either
 * the old file or the new one, whole; leftover *.tmp files are removed at open. An flock on
 * DIR/.lock keeps two daemons out of one directory.
 *
 * Thread rule: every statedir_* function is loop thread only; the operations' `prepare` and
 * `check` callbacks run on the I/O thread and touch only their bytes; `done` runs on the loop.
 */
#ifndef SERVER_STATEDIR_H
#define SERVER_STATEDIR_H

#include <stddef.h>
#include <stdbool.h>
#include <stdint.h>

#include <uv.h>

struct statedir; /* opaque */

/* Loop thread, when an operation has finished: status 0 or a negative errno (or check's code);
 * for a read, the file's bytes (data, len: memory of its own, the callee's to release with
 * statedir_release). */
typedef void (*statedir_done_fn)(void *ctx, int status, uint8_t *data, size_t len);

/* Opens (creating it, mode 0700, if missing) and locks dir, and starts the I/O thread. Returns
 * 0 or -1 with a one-line reason in err. */
int statedir_open(uv_loop_t *loop, const char *dir, struct statedir **out, char *err,
                  size_t err_size);

/* Waits for every queued operation, runs their done callbacks, stops the thread and frees sd.
 * NULL is a no-op. */
void statedir_close(struct statedir *sd);

/* statedir_close, with last(ctx) called once every operation and callback is done: it may queue
 * more (run before sd goes, on this thread), written after everything else. */
void statedir_close_with(struct statedir *sd, void (*last)(void *ctx), void *ctx);

/* Reads file `name` whole, now, on this thread (for start-up, before any operation is queued),
 * first removing a NAME.tmp an interrupted write left. *data (malloc'd, the caller's to free)
 * gets len bytes. Returns 0, -ENOENT (no such file), -EINVAL (not a regular file), -EFBIG
 * (longer than max_len) or another negative errno. */
int statedir_read_now(struct statedir *sd, const char *name, size_t max_len, uint8_t **data,
                      size_t *len);

/* Writes data (len bytes, taken: freed after) as file `name`, calling prepare(data, len) on the
 * I/O thread first (e.g. to checksum it there). done may be NULL. Returns 0 or -ENOMEM. */
int statedir_write(struct statedir *sd, const char *name, uint8_t *data, size_t len,
                   void (*prepare)(uint8_t *data, size_t len), statedir_done_fn done, void *ctx);

/* Loop thread, for a read whose bytes are in (a file of at least one byte), while check runs on
 * them on the I/O thread: the caller may take them in (read only) before check has said whether
 * they are sound; done comes after, with the verdict and the same bytes. */
typedef void (*statedir_arrived_fn)(void *ctx, const uint8_t *data, size_t len);

/* Reads file `name` whole (a file longer than max_len fails with -EFBIG, unread), then calls
 * check(ctx, data, len) on the I/O thread (NULL: none;
 * nonzero fails the read with that status; it may write into ctx's memory that neither arrived
 * nor the loop touch until done) and, meanwhile, arrived on the loop (NULL: none). done gets the
 * bytes whenever the read itself succeeded, whatever check said. Returns 0 or -ENOMEM. */
int statedir_read(struct statedir *sd, const char *name, size_t max_len,
                  int (*check)(void *ctx, const uint8_t *data, size_t len),
                  statedir_arrived_fn arrived, statedir_done_fn done, void *ctx);

/* Releases a read's bytes (any thread). NULL is a no-op. The last buffer of up to 32 MiB is
 * kept for the next read: up to that much memory beyond the KV budget while sessions spill. */
void statedir_release(struct statedir *sd, uint8_t *data, size_t len);

/* Removes file `name` (missing is fine). done may be NULL. Returns 0 or -ENOMEM. */
int statedir_remove(struct statedir *sd, const char *name, statedir_done_fn done, void *ctx);

/* Bytes queued for writing and not yet written. */
size_t statedir_pending_bytes(const struct statedir *sd);

/* Calls fn for every entry of the directory whose name ends in suffix: a regular file (or a
 * symlink to one: is_file) with its first bytes (up to head_max) and its size; any other kind
 * (a directory, a FIFO, a dangling link) with none, never opened. Removes the regular files
 * NAME.tmp (NAME ending in suffix) that a crash left half-written. Synchronous: for start-up,
 * before any operation is queued. Returns the number of entries passed to fn, or a negative
 * errno when the directory could not be listed at all. */
int32_t statedir_scan(struct statedir *sd, const char *suffix, size_t head_max,
                      void (*fn)(void *ctx, const char *name, const uint8_t *head, size_t n,
                                 uint64_t size, bool is_file),
                      void *ctx);

#endif /* SERVER_STATEDIR_H */
