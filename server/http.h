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
};

struct http_params {
    const char *host;      /* numeric IPv4/IPv6 address or a host name */
    int32_t port;          /* 0 = ephemeral */
    size_t max_body_bytes; /* larger bodies are not kept (http_request_body_too_large) */
};

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

/* ---- the request ------------------------------------------------------------------------------
 */

uint64_t http_request_id(const struct http_request *r); /* 1, 2, ... per server */
const char *http_request_method(const struct http_request *r);
const char *http_request_path(const struct http_request *r);
/* A request header's value, or NULL (case-insensitive name). */
const char *http_request_header(const struct http_request *r, const char *name);
/* The body (NUL-terminated; empty until on_request). */
const char *http_request_body(const struct http_request *r, size_t *len);
bool http_request_body_too_large(const struct http_request *r);
/* Milliseconds (monotonic) when the headers arrived. */
double http_request_start_ms(const struct http_request *r);
void http_request_set_user(struct http_request *r, void *user);
void *http_request_user(const struct http_request *r);
bool http_request_is_answered(const struct http_request *r);

/* Adds a response header for the coming answer (copied). */
void http_request_add_header(struct http_request *r, const char *name, const char *value);

/* Answers with a complete body. Takes ownership of body (malloc'd; may be NULL when len is 0).
 * content_type may be NULL (no body). At most one answer per request. */
void http_request_reply(struct http_request *r, int status, const char *content_type, char *body,
                        size_t len);

/* Starts a streamed answer of unknown length (chunked). Then stream_write any number of times
 * and stream_end once. on_stream_drained fires whenever all written data has been taken. */
void http_request_stream_begin(struct http_request *r, int status, const char *content_type);
void http_request_stream_write(struct http_request *r, const char *data, size_t len);
void http_request_stream_end(struct http_request *r);
/* Bytes written to the stream and not yet handed to the socket. */
size_t http_request_stream_pending(const struct http_request *r);

/* True if the client has closed its end of the connection (checked without blocking). */
bool http_request_peer_closed(const struct http_request *r);

#endif /* SERVER_HTTP_H */
