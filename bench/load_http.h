/* bench/load_http.h: the load generator's HTTP/1.1 client: one keep-alive connection per client,
 * non-blocking, driven by the caller's poll(). It does what attn_load asks of HTTP and no more
 * (one request at a time per connection, Content-Length or chunked answers), so that the
 * generator's own CPU, which it takes from the daemon it measures on the same cores, is the
 * system calls and little else: libcurl's multi interface and its per-request setup cost about
 * as much again as the syscalls (a 32-step call of the small preset: ~0.16 ms of the client's
 * CPU a call). */
#ifndef ATTND_BENCH_LOAD_HTTP_H
#define ATTND_BENCH_LOAD_HTTP_H

#include <netinet/in.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct lhttp_buf {
    char *data;
    size_t len;
    size_t cap;
} lhttp_buf;

typedef enum lhttp_state {
    LHTTP_IDLE = 0,  /* no request, or its answer was taken */
    LHTTP_SENDING,   /* the request is being written */
    LHTTP_RECEIVING, /* the request is out; the answer is being read */
    LHTTP_DONE,      /* a whole answer: lhttp_status, lhttp_body */
    LHTTP_FAILED,    /* a transport error or a malformed answer: lhttp_error */
} lhttp_state;

typedef struct lhttp_conn {
    struct sockaddr_in addr;
    int fd; /* -1: not connected */
    lhttp_state state;
    bool is_reused;       /* the request went out on a connection that had answered before */
    lhttp_buf out;        /* the request's head */
    const char *out_body; /* its body, the caller's (not copied: 64 KiB a 32-step call) */
    size_t out_body_len;
    const char *out_tail; /* the body's rest, the caller's too (a batch's unchanging tensors) */
    size_t out_tail_len;
    size_t sent;     /* of head and body */
    lhttp_buf in;    /* the answer as read */
    size_t head_end; /* past the answer's blank line; 0 while the head is incomplete */
    long status;
    int64_t content_length; /* -1: chunked, or until the connection closes */
    bool is_chunked;
    bool is_close;     /* the server closes after this answer */
    lhttp_buf chunked; /* a chunked answer's body, joined */
    size_t chunk_at;   /* how far into in the chunk parser has read */
    const char *body;  /* the answer's body once DONE */
    size_t body_len;
    uint64_t started_ns; /* when lhttp_start was called */
    uint64_t done_ns;
    char error[160];
} lhttp_conn;

/* Parses "http://host[:port]" (host a dotted IPv4 address or a name) into addr. 0 or -1. */
int lhttp_resolve(const char *base_url, struct sockaddr_in *addr);

void lhttp_init(lhttp_conn *c, const struct sockaddr_in *addr);
void lhttp_release(lhttp_conn *c);

/* Starts a request: method and path, extra header lines (each ending "\r\n", or NULL) and a
 * body (NULL for none; not copied: it must stay as it is until the request is DONE or FAILED).
 * Connects first when not connected. 0, or -1 with the connection FAILED (its error says why). */
int lhttp_start(lhttp_conn *c, const char *method, const char *path, const char *headers,
                const void *body, size_t body_len);

/* lhttp_start with a body in two pieces, sent one after the other (tail may be NULL): a call
 * whose tensors stay the same from call to call keeps them apart from the JSON that changes. */
int lhttp_start_parts(lhttp_conn *c, const char *method, const char *path, const char *headers,
                      const void *body, size_t body_len, const void *tail, size_t tail_len);

/* The poll() events the connection waits for (0 unless SENDING or RECEIVING). */
short lhttp_events(const lhttp_conn *c);

/* Moves the request on after poll() said revents; returns the new state. A request whose
 * reused connection the server had closed before answering (keep-alive timeout) is sent again
 * on a new connection, as browsers and libcurl do. */
lhttp_state lhttp_advance(lhttp_conn *c, short revents);

/* One request to the end: start, then poll until DONE or FAILED or timeout_ms. */
lhttp_state lhttp_run(lhttp_conn *c, const char *method, const char *path, const char *headers,
                      const void *body, size_t body_len, int timeout_ms);

/* Takes the answer: the connection is IDLE again (closed if the server said so). */
void lhttp_finish(lhttp_conn *c);

#endif
