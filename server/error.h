/* server/error.h: the server's error codes and the one table that maps a code to its HTTP
 * status, type and default message (proto/openapi.yaml x-error-table, proto/errors.json).
 *
 * Server codes are negative and far from the engine's (attn_status, -1 .. -9), which pass through
 * unchanged and are mapped here too (ATTN_ENOSPC -> kv_budget_exhausted, ...).
 */
#ifndef SERVER_ERROR_H
#define SERVER_ERROR_H

enum error_code {
    ERROR_OK = 0,
    ERROR_INVALID_JSON = -100,
    ERROR_INVALID_REQUEST = -101,
    ERROR_CONTEXT_LENGTH_EXCEEDED = -102,
    ERROR_UNAUTHORIZED = -103,
    ERROR_NOT_FOUND = -104,
    ERROR_SESSION_NOT_FOUND = -105,
    ERROR_METHOD_NOT_ALLOWED = -106,
    ERROR_N_PAST_MISMATCH = -107,
    ERROR_SESSION_EXISTS = -108,
    ERROR_SESSION_EVICTED = -109,
    ERROR_PAYLOAD_TOO_LARGE = -110,
    ERROR_QUEUE_FULL = -111,
    ERROR_INTERNAL = -112,
    ERROR_DRAINING = -113,
    ERROR_KV_BUDGET_EXHAUSTED = -114,
    ERROR_TOO_MANY_CONNECTIONS = -115,
    ERROR_TOKENS_DROPPED = -116,
    ERROR_CONTEXT_EXISTS = -117,
    ERROR_FINGERPRINT_MISMATCH = -118,
    ERROR_CORRUPT_SESSION = -119,
    ERROR_SESSION_VERSION = -120,
    ERROR_SESSION_LOST = -121,
    ERROR_QUERIES_NOT_KEPT = -122,
    ERROR_SESSION_FILE_FOREIGN = -123,
    ERROR_KV_OUT_OF_RANGE = -124,
    ERROR_SERVER_BUSY = -125,
    /* Not in the table: the client went away, so there is nobody to answer. */
    ERROR_CANCELLED = -199,
};

/* One row of the error table. Immutable. */
struct error_info {
    int code;            /* an error_code */
    int http_status;     /* e.g. 400 */
    const char *name;    /* the wire "code", e.g. "invalid_request" */
    const char *type;    /* the wire "type", e.g. "invalid_request_error" */
    const char *message; /* the default message */
};

/* The row for a server code or an engine attn_status code (mapped to its server code). Unknown
 * codes (and ERROR_OK) give the internal_error row. Never NULL. */
const struct error_info *error_info_get(int code);

/* The table itself, for tests and docs: *n_out gets its length. */
const struct error_info *error_table(int *n_out);

#endif /* SERVER_ERROR_H */
