/* server/snapshot.h: a session as one self-describing file (the format is proto/session-file.md):
 * what GET /v1/sessions/{id}/export sends, PUT /v1/sessions/{id} takes, and the disk tier
 * (statedir.h) writes and reads back. The file names the model it came from (its fingerprint)
 * and the KV dtype, holds each used layer's caches as the engine exports them (tokens, not
 * blocks), and ends with a checksum over everything before it.
 *
 * Encoding and restoring touch caches: loop thread, holding the session's turn (or, for
 * encoding, with the session idle). Sealing and checking touch only the bytes: any thread.
 */
#ifndef SERVER_SNAPSHOT_H
#define SERVER_SNAPSHOT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "../engine/attn.h"
#include "api.h"
#include "session.h"

#define SNAPSHOT_VERSION      1  /* the newest format this build writes and reads */
#define SNAPSHOT_HEADER_BYTES 96 /* the fixed header, before the id */
#define SNAPSHOT_MIN_BYTES    (SNAPSHOT_HEADER_BYTES + 8 + 8)
/* Header flags (offset 80; 0 in files from before it): the caches keep their tokens' queries
 * (--keep-queries; kv_io kind 2). */
#define SNAPSHOT_FLAG_QUERIES 1u

/* What a file's header says. */
/* What a server's KV pool holds, which a file's caches must match: their dtype, and whether each
 * layer's cache keeps its tokens' queries (--keep-queries). */
struct snapshot_kv {
    attn_dtype dtype;
    bool has_queries;
};

/* The pool's (immutable) description, for the calls below. */
struct snapshot_kv snapshot_kv_of(const attn_kv_pool *pool);

struct snapshot_info {
    uint32_t version;
    uint8_t fingerprint[ATTN_FINGERPRINT_BYTES];
    attn_dtype kv_dtype;
    bool has_queries; /* header flag bit 0 */
    char id[API_SESSION_ID_MAX + 1];
    int32_t n_sections;
    int32_t n_tokens;      /* the longest layer's length */
    int64_t saved_unix_ms; /* the session's last use (the disk tier's files; older files and
                            * exports: when written), wall-clock ms */
    uint64_t file_bytes;   /* the whole file's length, as the header states it */
    /* What the fingerprint covers, stated apart (0 in files written before they were): the
     * config's digest, the layer range (count 255 = 255 or more) and the weights' dtype. */
    uint64_t config_digest;
    int32_t layer_first, layer_count;
    attn_dtype weights_dtype;
};

/* Writes s's caches (every used layer's own cache and cross-attention context) as a file into a
 * new malloc'd buffer (*out, *len), checksum not yet set: snapshot_seal sets it. Returns 0 or
 * ATTN_ENOMEM. */
int snapshot_encode(struct session *s, const attn_model *m, struct snapshot_kv pool_kv,
                    int64_t unix_ms, uint8_t **out, size_t *len);

/* The length snapshot_encode's file for s would have, without making it. */
size_t snapshot_bytes(struct session *s, const attn_model *m);

/* Sets the checksum of an encoded file. */
void snapshot_seal(uint8_t *file, size_t len);

/* Reads the header of a file whose first len bytes are at p (at least SNAPSHOT_HEADER_BYTES plus
 * the id). Returns 0, ERROR_CORRUPT_SESSION (not a session file, or impossible fields) or
 * ERROR_SESSION_VERSION (a newer format), with the reason in msg. */
int snapshot_read_header(const uint8_t *p, size_t len, struct snapshot_info *info, char *msg,
                         size_t msg_size);

/* Checks a whole file: its header, its length, its checksum and its sections' framing. Returns
 * 0 or snapshot_read_header's codes, with the reason in msg. */
int snapshot_check(const uint8_t *p, size_t len, struct snapshot_info *info, char *msg,
                   size_t msg_size);

/* A fingerprint as GET /v1/model's attnd.fingerprint shows it: 64 lowercase hex digits. */
#define SNAPSHOT_FINGERPRINT_HEX (2 * ATTN_FINGERPRINT_BYTES + 1)
void snapshot_fingerprint_hex(const uint8_t fp[ATTN_FINGERPRINT_BYTES],
                              char out[SNAPSHOT_FINGERPRINT_HEX]);

/* Compares a file's model fingerprint, KV dtype and kept queries with this server's. Returns 0
 * or ERROR_FINGERPRINT_MISMATCH naming what differs in msg. */
int snapshot_match(const struct snapshot_info *info, const attn_model *m, struct snapshot_kv kv,
                   char *msg, size_t msg_size);

/* Recreates, in the turn's session (which holds no caches), the caches of a checked file,
 * evicting idle sessions for room. All or nothing. Returns 0, ERROR_FINGERPRINT_MISMATCH (a
 * section this server cannot hold: another geometry, layer or window), ERROR_CORRUPT_SESSION
 * (inconsistent bytes), ERROR_KV_BUDGET_EXHAUSTED or ATTN_ENOMEM, with the reason in msg. */
int snapshot_restore(struct session_store *st, struct session_turn *t, const uint8_t *p, size_t len,
                     char *msg, size_t msg_size);

#endif /* SERVER_SNAPSHOT_H */
