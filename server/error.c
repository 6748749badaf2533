/* server/error.c: the error table. Keep it equal to proto/errors.json (tests/check_api.c compares
 * them). */
#include "error.h"

#include "../engine/attn.h"

static const struct error_info table[] = {
    {ERROR_INVALID_JSON, 400, "invalid_json", "invalid_request_error",
     "request body is not valid JSON"},
    {ERROR_INVALID_REQUEST, 400, "invalid_request", "invalid_request_error", "request is invalid"},
    {ERROR_CONTEXT_LENGTH_EXCEEDED, 400, "context_length_exceeded", "invalid_request_error",
     "the session's cache would exceed the model's maximum sequence length"},
    {ERROR_UNAUTHORIZED, 401, "unauthorized", "authentication_error",
     "missing or invalid API key (Authorization: Bearer <key>)"},
    {ERROR_NOT_FOUND, 404, "not_found", "not_found_error", "no such route"},
    {ERROR_SESSION_NOT_FOUND, 404, "session_not_found", "not_found_error", "no such session"},
    {ERROR_METHOD_NOT_ALLOWED, 405, "method_not_allowed", "invalid_request_error",
     "method not allowed on this route"},
    {ERROR_KV_OUT_OF_RANGE, 400, "kv_out_of_range", "invalid_request_error",
     "a key or value is not finite (a projection or RoPE overflowed float32) or past the range of "
     "the KV cache's dtype (f16: 65504; q8_0: about 8.3e6; bf16: about 3.39e38); the call appended "
     "nothing (a stream: nothing from the token that met it on): smaller inputs, or a wider "
     "--kv-dtype (bf16, or f32)"},
    {ERROR_N_PAST_MISMATCH, 409, "n_past_mismatch", "conflict_error",
     "the session's cache length differs from expect_n_past"},
    {ERROR_SESSION_EXISTS, 409, "session_exists", "conflict_error",
     "a session with this id already exists"},
    {ERROR_TOKENS_DROPPED, 409, "tokens_dropped", "conflict_error",
     "a sliding layer's cache keeps only its window and no longer holds the tokens this needs"},
    {ERROR_CONTEXT_EXISTS, 409, "context_exists", "conflict_error",
     "the session's layer holds a context already; replace_context: true replaces it"},
    {ERROR_FINGERPRINT_MISMATCH, 409, "fingerprint_mismatch", "conflict_error",
     "the saved session comes from another model or KV dtype than this server runs"},
    {ERROR_CORRUPT_SESSION, 400, "corrupt_session", "invalid_request_error",
     "the session file is torn or corrupt (its framing or checksum fails)"},
    {ERROR_SESSION_VERSION, 400, "unsupported_session_version", "invalid_request_error",
     "the session file's format version is newer than this server reads"},
    {ERROR_SESSION_EVICTED, 410, "session_evicted", "gone_error",
     "the session was evicted or expired; its cache is gone"},
    {ERROR_QUERIES_NOT_KEPT, 409, "queries_not_kept", "conflict_error",
     "the KV cache keeps no queries, so cached tokens' attention cannot be recomputed; start attnd "
     "with --keep-queries 1"},
    {ERROR_SESSION_FILE_FOREIGN, 409, "session_file_foreign", "conflict_error",
     "--state-dir holds a file for this id that this server leaves alone (another model, KV dtype, "
     "KV block size or --keep-queries, a newer format, or unreadable); use another id, or remove "
     "the file and restart (the id stays refused while this server runs)"},
    {ERROR_SESSION_LOST, 410, "session_lost", "gone_error",
     "the session's file failed its checks when it was read back from disk; it is gone"},
    {ERROR_PAYLOAD_TOO_LARGE, 413, "payload_too_large", "invalid_request_error",
     "request body is larger than --max-body-mb"},
    {ERROR_QUEUE_FULL, 429, "queue_full", "rate_limit_error",
     "too many queued requests; retry later"},
    {ERROR_INTERNAL, 500, "internal_error", "server_error", "internal error"},
    {ERROR_DRAINING, 503, "draining", "unavailable_error", "the server is shutting down"},
    {ERROR_TOO_MANY_CONNECTIONS, 503, "too_many_connections", "unavailable_error",
     "every connection is busy (--max-connections or --max-connections-per-ip); retry later"},
    {ERROR_SERVER_BUSY, 503, "server_busy", "unavailable_error",
     "the server holds --max-held-mb of request bodies and answers that their clients have not "
     "finished sending or reading; retry later"},
    {ERROR_KV_BUDGET_EXHAUSTED, 507, "kv_budget_exhausted", "insufficient_storage_error",
     "the KV cache pool cannot hold this request even after evicting idle sessions"},
};

/* Engine codes the server can meet at run time. EINVAL and ESHAPE mean the request got past
 * api.c's checks with a shape the engine refuses, so they are the client's; ENOMEM, EIO and
 * EUNSUPPORTED are ours. */
static int map_engine_code(int code) {
    switch (code) {
    case ATTN_EINVAL:
    case ATTN_ESHAPE:
        return ERROR_INVALID_REQUEST;
    case ATTN_ERANGE:
        return ERROR_CONTEXT_LENGTH_EXCEEDED;
    case ATTN_ENOSPC:
        return ERROR_KV_BUDGET_EXHAUSTED;
    case ATTN_EDROPPED:
        return ERROR_TOKENS_DROPPED;
    case ATTN_EOVERFLOW:
        return ERROR_KV_OUT_OF_RANGE;
    default:
        return ERROR_INTERNAL;
    }
}

const struct error_info *error_info_get(int code) {
    if (code < 0 && code > -100) {
        code = map_engine_code(code);
    }
    for (unsigned i = 0; i < sizeof table / sizeof table[0]; i++) {
        if (table[i].code == code) {
            return &table[i];
        }
    }
    for (unsigned i = 0; i < sizeof table / sizeof table[0]; i++) {
        if (table[i].code == ERROR_INTERNAL) {
            return &table[i];
        }
    }
    return &table[0]; /* unreachable: internal_error is in the table */
}

const struct error_info *error_table(int *n_out) {
    *n_out = (int)(sizeof table / sizeof table[0]);
    return table;
}
