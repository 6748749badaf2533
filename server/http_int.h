/* server/http_int.h: what the files of the HTTP module share (http.c drives MHD and owns
 * requests and answers; http_conn.c owns connections: accepting within the limits, the watch
 * for a client's FIN, timeouts, drops and answers written around MHD; http_linger.c keeps a
 * closed connection's socket while its client is still sending). Not for other modules:
 * they use http.h. Cross-file functions are prefixed http__.
 *
 * Thread rule: loop thread only.
 */
#ifndef SERVER_HTTP_INT_H
#define SERVER_HTTP_INT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <microhttpd.h>
#include <uv.h>

#include "conn.h"
#include "http.h"
#include "strbuf.h"

/* Connections accepted per wake-up of the listening socket, so that a flood of connects cannot
 * keep the loop from serving the connections it has. Each may reclaim one victim, which MHD
 * closes only at its next pass, so MHD's own limit leaves this much room above ours. */
#define HTTP_ACCEPT_BATCH 64
#define HTTP_CONN_SLACK   (2 * HTTP_ACCEPT_BATCH)

struct header {
    char *name;
    char *value;
    struct header *next;
};

/* One TCP connection, from MHD's STARTED notice to its CLOSED one. Loop thread only. */
struct http_conn {
    struct conn c; /* first: conn.c hands back &c, the connection is (struct http_conn *)c */
    struct http_server *srv;
    struct MHD_Connection *mhd;
    int fd;
    uv_poll_t watch;     /* FIN, reset, first bytes; writes of a direct answer */
    int watch_events;    /* what the watch waits for; 0 = stopped */
    bool has_watch;      /* uv_poll_init succeeded (the handle must be closed) */
    bool is_counted;     /* in the conn table (false once dropped) */
    bool has_fin;        /* the client closed its sending side */
    bool is_dropped;     /* shut down here; MHD closes it at its next pass */
    bool is_body_unread; /* its last request was answered before its body was in */
    uint64_t rx_mark;    /* bytes received when it last became idle (see is_new_request) */
    struct http_conn *check_prev, *check_next; /* in srv's FIN-check list */
    bool is_checking;
    struct http_request *req; /* headers in, not yet completed; or NULL */
    /* The last request target MHD parsed, as MHD's log callback saw it: where it starts and
     * its length as a C string (see http_request_target_has_nul). */
    const char *target;
    size_t target_len;
    bool is_query_cut;     /* its query had more than HTTP_QUERY_ARGS_MAX arguments (http.c) */
    bool is_absolute_form; /* it began "http://" or "https://" as received, not decoded */
};

/* A socket kept open after MHD's close to read and drop what its client still sends
 * (http_linger.c). Slots in the server; loop thread only. */
#define HTTP_LINGER_SLOTS 16
#define HTTP_LINGER_MS    2000
struct http_linger {
    uv_poll_t watch;
    uv_timer_t timer;
    int fd;         /* a duplicate of the connection's socket */
    int n_open;     /* of its two handles, those not yet closed */
    bool in_use;    /* until both handles have closed */
    bool is_ending; /* handles closing, descriptor closed */
};

struct http_request {
    struct http_server *srv;
    struct MHD_Connection *conn;
    struct http_conn *hc; /* NULL once the connection is gone */
    uint64_t id;
    const char *method; /* MHD's, valid for the request's life */
    const char *url;
    const char *path; /* url, or its path when url is in absolute-form (http_request_path) */
    const char *version;
    double start_ms;
    const char *ended; /* why the request ended early (http_request_ended), or NULL */
    bool is_end_known; /* http_conn.c dropped it and set ended (NULL: its answer went out
                          whole): MHD's code, its reading of that hang-up, is not asked */
    struct strbuf body;
    size_t body_pad; /* bytes before the body in `body`, which put a framed body's binary part
                        at a 16-byte boundary, so its floats are read where they lie */
    bool is_too_large;
    bool is_busy; /* its body would have passed max_held_bytes: dropped (http_request_is_busy) */
    bool is_over_held;  /* its body alone passed max_held_bytes: dropped (413, not busy) */
    size_t held;        /* bytes of its body and answer counted in the server's held_bytes */
    bool is_in_handler; /* inside an access-handler call: answers are queued on return */
    bool is_suspended;
    bool is_answered;
    bool is_unanswered;           /* its answer could not be made (out of memory): MHD closes it */
    bool has_body_handed;         /* on_request was called */
    struct MHD_Response *pending; /* answer made inside the handler, queued on return */
    unsigned pending_status;
    struct header *headers; /* extra response headers */
    /* Streams: out[out_off..out.len) waits to be taken by the reader. A direct answer (see
     * direct_begin) uses the same buffer for everything it has still to write. */
    bool is_stream;
    bool is_stream_ended;
    bool is_direct;
    uint64_t direct_progress_ms; /* uv_now when a direct answer last moved a byte */
    struct strbuf out;
    size_t out_off;
    void *user;
};

struct http_server {
    uv_loop_t *loop;
    struct MHD_Daemon *daemon;
    int listen_fd;
    uv_poll_t accept_poll;
    uv_timer_t accept_timer; /* resumes accepting after running out of descriptors */
    uv_poll_t poll;          /* MHD's epoll fd */
    uv_poll_t sizer;         /* closed at once: sizes the loop's watcher table (reserve_watchers) */
    uv_timer_t timer;        /* MHD's timeouts and immediate runs */
    uv_idle_t spin;          /* active: the loop polls without sleeping (see http_params) */
    uint64_t spin_ns;
    uint64_t spin_until_ns;  /* uv_hrtime() at which the current spin ends */
    uv_timer_t header_timer; /* the oldest started request's header deadline */
    uv_timer_t stall_timer;  /* direct answers that stopped moving (while n_direct > 0) */
    int n_open_handles;
    struct http_handlers h;
    size_t max_body_bytes;
    /* Bytes of request bodies and answers held for clients (loop thread), and the most: what a
     * client that sends or reads slowly keeps in memory, added over every connection. */
    size_t held_bytes, max_held_bytes;
    int64_t header_timeout_ms;
    int64_t idle_timeout_ms;
    int32_t n_direct; /* requests answered directly, alive */
    struct conn_limits limits;
    struct conn_table *conns;
    struct http_conn *check_head; /* connections whose FIN is decided after MHD's next pass */
    struct strbuf refusal;        /* the canned 503's last headers and body */
    uint64_t n_reclaimed, n_refused;
    uint64_t n_reclaimed_logged, n_refused_logged;
    uint64_t last_limit_log_ms;
    uint64_t next_id;
    int32_t n_requests;
    int32_t port;
    int32_t fd_ceiling; /* the loop's watcher table holds descriptors below it (0: unknown) */
    struct http_linger lingering[HTTP_LINGER_SLOTS];
    bool is_stopping; /* http_server_destroy began: no more lingering */
};

/* ---- http.c ---------------------------------------------------------------------------------- */

/* Runs MHD on the next loop turn (never call MHD_run from inside an MHD callback). */
void http__schedule_run(struct http_server *s);
/* Resumes a suspended request (MHD looks at it again at its next run). */
void http__wake(struct http_request *r);

/* The server's uv_close callback (h->data the server): frees it after its last handle. */
void http__handle_closed(uv_handle_t *h);

/* ---- http_conn.c ----------------------------------------------------------------------------- */

/* The connection layer's state in s from p (table, limits, timeouts, the canned refusal).
 * Returns 0, or -1 when out of memory (then http__conns_destroy still must be called). */
int http__conns_create(struct http_server *s, const struct http_params *p);
/* Frees it; every connection must be closed (after MHD_stop_daemon). */
void http__conns_destroy(struct http_server *s);
/* Starts accepting on s->listen_fd; inits the layer's handles (4, counted in n_open_handles). */
void http__conns_start(struct http_server *s);
/* Stops accepting and closes the listening socket, its watch closed first with cb (idempotent). */
void http__conns_stop_accepting(struct http_server *s, uv_close_cb cb);
/* uv_close on the layer's handles. */
void http__conns_close(struct http_server *s, uv_close_cb cb);
/* After each MHD_run: decides the connections whose client sent a FIN. */
void http__conns_after_run(struct http_server *s);
/* MHD's MHD_OPTION_NOTIFY_CONNECTION callback (cls = the server). */
void http__conn_notify(void *cls, struct MHD_Connection *mc, void **socket_context,
                       enum MHD_ConnectionNotificationCode code);

/* ---- http_linger.c --------------------------------------------------------------------------- */

/* For socket fd about to be closed with its answer sent (at MHD's CLOSED notice, or a canned
 * refusal): when its client has sent bytes nobody read, or may still be sending (body_unread:
 * answered before its body or request was in; what comes next may not have arrived yet), the
 * socket is kept open on a duplicate for up to HTTP_LINGER_MS, reading and dropping what comes,
 * so that the close does not reset the connection before the client has read its answer.
 * Without a free slot or descriptor it does nothing (the close may reset, as without this). */
void http__linger(struct http_server *s, int fd, bool body_unread);
/* Ends every lingering socket and lingers no more (http_server_destroy). */
void http__linger_stop(struct http_server *s);

/* MHD has read a request line on hc: its request has begun, and the header deadline runs (the
 * watch alone misses first bytes MHD read before the watch was polled: a new connection's). */
void http__conn_target_seen(struct http_conn *hc);
/* A request's headers are in (r->conn is its connection): it makes the connection busy. */
void http__conn_request_begin(struct http_request *r);
/* The request is over (MHD's completed notice): the connection waits again, or is dropped
 * when its client sent a FIN. */
void http__conn_request_end(struct http_request *r);
/* True once the request's connection is gone or dropped here. */
bool http__conn_is_dropped(const struct http_request *r);
/* True if the client can no longer receive: reset, or closed both ways. */
bool http__conn_is_gone(const struct http_request *r);

/* True when r must be answered directly, around MHD (see http_conn.c). */
bool http__direct_needed(const struct http_request *r);
/* Starts a direct answer: status line and headers into r->out. body_len < 0 = chunked. */
void http__direct_begin(struct http_request *r, int status, const char *content_type,
                        long long body_len);
/* Has the watch write what r->out holds (never from inside the caller). */
void http__direct_kick(struct http_request *r);
/* r, answered directly, is being freed. */
void http__direct_release(struct http_request *r);

#endif /* SERVER_HTTP_INT_H */
