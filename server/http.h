/* server/http.h: HTTP/1.1 on libmicrohttpd, driven by the libuv loop. MHD runs in "external
 * polling" epoll mode: the loop polls MHD's epoll fd and calls MHD_run, so every HTTP callback
 * runs on the loop thread, next to the session table and the scheduler, with no locks. Health
 * and metrics stay responsive because engine work never runs on this thread.
 *
 * A request is handed to the handlers twice: once its headers are in (to reject early: routing,
 * auth, a declared body over the limit) and once its body is complete. A request not answered
 * during the second call is suspended until http_request_reply (or a stream) answers it. The
 * module knows nothing of JSON or routes.
 *
 * Connections are accepted here, not by MHD, and kept within limits (conn.h): past
 * --max-connections (or --max-connections-per-ip) a new connection reclaims the oldest one that
 * has no request in progress, and gets the canned refusal (503) only when every connection is
 * busy. A connection that moves no byte for idle_timeout_s is closed, one that started a request
 * must have sent all its headers within header_timeout_s, and a request waiting for the engine
 * never times out. When the client closes its sending side (FIN): a request not yet fully
 * received, or an idle connection, is dropped at once; a request fully received is still
 * answered, and the connection closed after that answer (requests pipelined behind it are not
 * served). A stream stops when a write to the socket fails.
 *
 * Thread rule: loop thread only.
 */
#ifndef SERVER_HTTP_H
#define SERVER_HTTP_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <uv.h>

struct http_server;  /* opaque */
struct http_request; /* opaque; owned by http.c, valid until on_closed returns */

struct http_handlers {
    void *ctx;
    /* Headers are in. May answer now (e.g. 401, 404, 413); otherwise the body is read. */
    void (*on_headers)(void *ctx, struct http_request *req);
    /* The body is complete (or over the limit: http_request_body_too_large). Answer now or
     * later. Not called if on_headers answered. */
    void (*on_request)(void *ctx, struct http_request *req);
    /* A stream's buffered data has all been handed to the socket: the producer may write more. */
    void (*on_stream_drained)(void *ctx, struct http_request *req);
    /* The request is over: answered and sent, or the client went away. req is freed after this
     * returns; the handler must drop every pointer to it. */
    void (*on_closed)(void *ctx, struct http_request *req);
    /* Whether the loop may poll without sleeping now (http_params.spin_us): false while the
     * cores are taken by other work. NULL: always. */
    bool (*may_spin)(void *ctx);
};

struct http_params {
    const char *host;         /* numeric IPv4/IPv6 address or a host name */
    int32_t port;             /* 0 = ephemeral */
    size_t max_body_bytes;    /* larger bodies are not kept (http_request_body_too_large) */
    size_t max_held_bytes;    /* bodies and answers held at once (http_request_is_busy) */
    int32_t max_connections;  /* open connections at most (>= 1) */
    int32_t max_per_ip;       /* connections from one client address at most; 0 = no limit */
    int32_t idle_timeout_s;   /* a connection that moves no byte for this long is closed */
    int32_t header_timeout_s; /* a started request's headers must all be in within this */
    /* After each pass over the connections the loop keeps polling them, without sleeping, for
     * this long (while may_spin allows): a kept-alive client's next request is then read
     * without a thread wake-up. 0 = sleep at once. */
    int32_t spin_us;
    /* Every descriptor the process may hold is below this (the open-file limit the connections
     * were fitted to): the loop's table of watched descriptors is sized for it at the start. */
    int32_t fd_ceiling;
    /* The answer to a connection refused at the limit (e.g. a JSON 503 body), sent with status
     * 503, Retry-After: 1 and Connection: close; copied. */
    const char *refusal_type;
    const char *refusal_body;
    size_t refusal_len;
};

/* Descriptors a server with max_connections may hold at once: its connections, those it is
 * closing while their replacements are accepted, the sockets it lingers on after an early
 * answer, and the listening socket. */
int64_t http_server_fds_needed(int32_t max_connections);

/* Binds and starts serving. Returns 0, or -1 with a one-line reason in err (e.g. port in use). */
int http_server_create(uv_loop_t *loop, const struct http_params *p, const struct http_handlers *h,
                       struct http_server **out, char *err, size_t err_size);

/* Stops MHD and closes the loop handles. Every request must be over (http_server_n_requests
 * is 0), since MHD may not be stopped with suspended connections. The memory goes once the loop
 * has run the handles' close callbacks. NULL is a no-op. */
void http_server_destroy(struct http_server *s);

/* The bound port (the real one when 0 was asked). */
int32_t http_server_port(const struct http_server *s);

/* Stops accepting connections; open connections keep being served (for draining). */
void http_server_quiesce(struct http_server *s);

/* Requests currently alive (headers received, not yet closed). */
int32_t http_server_n_requests(const struct http_server *s);

/* Whether a connection has begun a request whose headers are not all in (a request still being
 * received, as the drain counts it: http_server_cut_unreceived cuts it). */
bool http_server_has_partial_headers(const struct http_server *s);

/* Open connections (as counted against --max-connections). */
int32_t http_server_n_connections(const struct http_server *s);
/* Bytes of request bodies and answers held for clients now (max_held_bytes bounds them). */
size_t http_server_held_bytes(const struct http_server *s);

/* Connections turned away at the limits (the canned 503 too_many_connections), and idle ones
 * closed to admit a new one, since the start. */
uint64_t http_server_n_refused(const struct http_server *s);
uint64_t http_server_n_reclaimed(const struct http_server *s);

/* The end of a drain's grace: drops every request whose body has not all arrived and every
 * connection without a request in progress (idle ones, and ones still sending headers).
 * Requests fully received are left to finish, *n_finishing of them. Returns how many requests
 * were cut (a request counts from its first byte, so headers still arriving count too). Their
 * connections close at MHD's next pass, so on_closed follows later, never inside this call, and
 * a cut request's http_request_ended is "shutdown". */
int32_t http_server_cut_unreceived(struct http_server *s, int32_t *n_finishing);

/* ---- the request ------------------------------------------------------------------------------
 */

uint64_t http_request_id(const struct http_request *r); /* 1, 2, ... per server */
const char *http_request_method(const struct http_request *r);
const char *http_request_path(const struct http_request *r);
/* The protocol version as sent, e.g. "HTTP/1.1". */
const char *http_request_version(const struct http_request *r);
/* A request header's value, or NULL (case-insensitive name; the first if repeated). */
const char *http_request_header(const struct http_request *r, const char *name);
/* How many times the header appears (case-insensitive name). */
int32_t http_request_header_count(const struct http_request *r, const char *name);

/* Whether the request target's query had more arguments than any route reads; they were cut
 * (the request has none), and the request must be refused. */
bool http_request_query_cut(const struct http_request *r);
/* Whether the request target held a NUL byte (the path handed over ends at it). */
bool http_request_target_has_nul(const struct http_request *r);
/* Whether the method held a NUL byte (the method handed over ends at it: "DELETE<NUL>x"). */
bool http_request_method_has_nul(const struct http_request *r);
/* A header field line that libmicrohttpd took in a way another reader would not (see http.c):
 * NULL when there is none, else why, with the field's name copied into name (cut to fit; empty
 * when the name itself is the fault). */
const char *http_request_bad_field(const struct http_request *r, char *name, size_t name_size);
/* Calls fn for each query argument (?name=value&..., decoded) in order, until it returns
 * false. A name without '=' has the value "". */
void http_request_queries(const struct http_request *r,
                          bool (*fn)(void *ctx, const char *name, const char *value), void *ctx);
/* The body (NUL-terminated; empty until on_request). */
const char *http_request_body(const struct http_request *r, size_t *len);
/* The body, taken from the request: *block (malloc'd, or NULL for an empty body) holds it until
 * the caller frees it; the request's body is empty after. For a reader that may outlive the
 * request: a framed attend's tensors, a parse on a pool thread. */
const char *http_request_take_body(struct http_request *r, size_t *len, char **block);
bool http_request_body_too_large(const struct http_request *r);
/* Its body was dropped: holding it would have passed max_held_bytes (answer 503 server_busy). */
bool http_request_is_busy(const struct http_request *r);
/* Its body alone would have passed max_held_bytes: dropped (answer 413 naming the limit). */
bool http_request_body_over_held(const struct http_request *r);
/* Its body could not all be held: an allocation failed, so what it holds is cut short or empty
 * (answer 500, never parse it). */
bool http_request_body_failed(const struct http_request *r);
/* Whether an answer of len bytes may be held until its client reads it: small ones always, a
 * larger one while the bodies and answers held stay within max_held_bytes. */
bool http_request_may_hold(const struct http_request *r, size_t len);
/* Milliseconds (monotonic) when the headers arrived. */
double http_request_start_ms(const struct http_request *r);
/* Why the connection ended the request before its answer was sent ("client_closed",
 * "timeout", "shutdown", "error"), for the closing log line; NULL when it was sent whole. */
const char *http_request_ended(const struct http_request *r);
void http_request_set_user(struct http_request *r, void *user);
void *http_request_user(const struct http_request *r);
bool http_request_is_answered(const struct http_request *r);

/* Adds a response header for the coming answer (copied). */
void http_request_add_header(struct http_request *r, const char *name, const char *value);

/* Answers with a complete body. Takes ownership of body (malloc'd; may be NULL when len is 0).
 * content_type may be NULL (no body). At most one answer per request. */
void http_request_reply(struct http_request *r, int status, const char *content_type, char *body,
                        size_t len);

/* A piece of a body answered from memory its caller keeps (http_request_reply_parts). */
struct http_part {
    const void *data;
    size_t len;
};

/* Answers with a complete body made of parts, sent from where they are (no copy): the caller's
 * memory must stay as it is until release(owner) is called, once, when the answer is sent or
 * dropped (possibly before this returns). At most one answer per request. */
void http_request_reply_parts(struct http_request *r, int status, const char *content_type,
                              const struct http_part *parts, int n_parts, void (*release)(void *),
                              void *owner);

/* Starts a streamed answer of unknown length (chunked). Then stream_write any number of times
 * and stream_end once. on_stream_drained fires whenever all written data has been taken. */
void http_request_stream_begin(struct http_request *r, int status, const char *content_type);
void http_request_stream_write(struct http_request *r, const char *data, size_t len);
void http_request_stream_end(struct http_request *r);
/* Bytes written to the stream and not yet handed to the socket. */
size_t http_request_stream_pending(const struct http_request *r);

/* True if the answer can no longer reach the client: its connection was reset (or closed both
 * ways), or this server dropped it. A FIN alone is not closed: a client that half-closed after
 * its request still gets the answer; one that closed entirely is found out by the first write
 * (streams) or by its reset. Checked without blocking. */
bool http_request_peer_closed(const struct http_request *r);

#endif /* SERVER_HTTP_H */
