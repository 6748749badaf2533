/* server/http_conn.c: the HTTP module's connections (see http.h, http_int.h). The listening
 * socket is polled by the loop; each connection accepted is admitted within the limits
 * (conn.c: reclaim the oldest waiting connection, or refuse with the canned 503) and handed to
 * MHD with MHD_add_connection.
 *
 * Each connection also has a libuv watch of its own, because MHD alone loses a client's FIN:
 * its edge-triggered epoll reports data and FIN as one event, MHD stops reading after a short
 * read, and no second event ever comes, so a client that sent half a request and closed would
 * sit in CLOSE-WAIT until the idle timeout. The watch sees the FIN (and, on an idle connection,
 * the first byte of a request, which starts the header deadline). A connection is dropped by
 * shutting its socket down, which MHD notices at its next pass and closes. A request fully
 * received before the FIN is still answered: by MHD when it can, else directly (see
 * http__direct_needed).
 */
#include "http_int.h"

#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#include <linux/tcp.h>

#include "log.h"

#define ACCEPT_PAUSE_MS 100
/* A summary of reclaimed and refused connections is logged at most this often. */
#define LIMIT_LOG_MS 10000

static void drop(struct http_conn *hc);

/* ---- connections: the watch, FIN and drops -------------------------------------------------- */

static void on_watch(uv_poll_t *p, int status, int events);

static void watch_set(struct http_conn *hc, int events) {
    if (!hc->has_watch || hc->is_dropped || events == hc->watch_events) {
        return;
    }
    hc->watch_events = events;
    if (events == 0) {
        uv_poll_stop(&hc->watch);
    } else {
        uv_poll_start(&hc->watch, events, on_watch);
    }
}

static void check_add(struct http_conn *hc) {
    if (hc->is_checking) {
        return;
    }
    struct http_server *s = hc->srv;
    hc->is_checking = true;
    hc->check_prev = NULL;
    hc->check_next = s->check_head;
    if (s->check_head != NULL) {
        s->check_head->check_prev = hc;
    }
    s->check_head = hc;
}

static void check_remove(struct http_conn *hc) {
    if (!hc->is_checking) {
        return;
    }
    if (hc->check_prev != NULL) {
        hc->check_prev->check_next = hc->check_next;
    } else {
        hc->srv->check_head = hc->check_next;
    }
    if (hc->check_next != NULL) {
        hc->check_next->check_prev = hc->check_prev;
    }
    hc->is_checking = false;
}

/* Shuts the connection down: MHD sees the hang-up at its next pass and closes it (a suspended
 * request is resumed so that MHD looks at it at all). It stops counting against the limits at
 * once. */
static void drop(struct http_conn *hc) {
    if (hc->is_dropped) {
        return;
    }
    watch_set(hc, 0);
    hc->is_dropped = true;
    check_remove(hc);
    if (hc->is_counted) {
        conn_table_remove(hc->srv->conns, &hc->c);
        hc->is_counted = false;
    }
    shutdown(hc->fd, SHUT_RDWR);
    if (hc->req != NULL) {
        http__wake(hc->req);
    }
    http__schedule_run(hc->srv);
}

/* drop, with why its request (if any, and not decided already) ended for its log line: NULL
 * when its answer went out whole. libmicrohttpd reads every such hang-up as an error. */
static void drop_as(struct http_conn *hc, const char *why) {
    if (hc->req != NULL && !hc->req->is_end_known) {
        hc->req->is_end_known = true;
        hc->req->ended = why;
    }
    drop(hc);
}

/* True once the client can receive nothing more: a reset, or a socket closed both ways. */
static bool is_gone(int fd) {
    struct pollfd p = {fd, 0, 0};
    return poll(&p, 1, 0) > 0 && (p.revents & (POLLERR | POLLHUP | POLLNVAL)) != 0;
}

/* Unread bytes in the socket: > 0 some, 0 none but a FIN, -1 none yet (or an error). */
static int peek(int fd) {
    char c;
    ssize_t n = recv(fd, &c, 1, MSG_PEEK | MSG_DONTWAIT);
    return n > 0 ? 1 : n == 0 ? 0 : -1;
}

static uint64_t bytes_received(int fd) {
    struct tcp_info ti;
    socklen_t len = sizeof ti;
    memset(&ti, 0, sizeof ti);
    if (getsockopt(fd, IPPROTO_TCP, TCP_INFO, &ti, &len) != 0 ||
        len < offsetof(struct tcp_info, tcpi_bytes_received) + sizeof ti.tcpi_bytes_received) {
        return 0;
    }
    return ti.tcpi_bytes_received;
}

static bool is_received(const struct http_request *r) {
    return r->has_body_handed || r->is_answered;
}

/* After MHD's pass, decides each connection whose client sent a FIN: a request fully received
 * is answered (and the connection dropped after it, in http__conn_request_end); anything else can
 * never complete and is dropped now. Bytes still unread, or a suspended request, wait for later. */
void http__conns_after_run(struct http_server *s) {
    struct http_conn *next;
    for (struct http_conn *hc = s->check_head; hc != NULL; hc = next) {
        next = hc->check_next;
        if ((hc->req != NULL && hc->req->is_suspended) || peek(hc->fd) > 0) {
            continue;
        }
        check_remove(hc);
        if (hc->req == NULL || !is_received(hc->req)) {
            LOG_DEBUG("http", "client closed before its request was complete req=%llu session=-",
                      hc->req != NULL ? (unsigned long long)hc->req->id : 0ULL);
            drop_as(hc, "client_closed");
        }
    }
}

static void direct_flush(struct http_request *r);
static void header_timer_arm(struct http_server *s);

/* An idle connection woke up: a request starts if bytes arrived since it became idle (the event
 * may be stale: MHD can have read them in the same loop turn, before this ran). */
static bool is_new_request(struct http_conn *hc) {
    return peek(hc->fd) > 0 || bytes_received(hc->fd) > hc->rx_mark;
}

static void on_watch(uv_poll_t *p, int status, int events) {
    struct http_conn *hc = p->data;
    if (hc->req != NULL && hc->req->is_direct) {
        if (status < 0) {
            drop_as(hc, "client_closed");
        } else {
            direct_flush(hc->req);
        }
        return;
    }
    if (status < 0 || (events & UV_DISCONNECT) != 0) {
        /* Level-triggered: it would fire again at once. A FIN stays; nothing more to watch. */
        watch_set(hc, 0);
        if (status < 0 || is_gone(hc->fd)) {
            drop_as(hc, "client_closed");
            return;
        }
        hc->has_fin = true;
        check_add(hc);
        http__schedule_run(hc->srv);
        return;
    }
    if ((events & UV_READABLE) != 0 && hc->req == NULL) {
        if (!is_new_request(hc)) {
            return;
        }
        if (hc->is_counted) {
            conn_table_set_started(hc->srv->conns, &hc->c, (int64_t)uv_now(hc->srv->loop));
            header_timer_arm(hc->srv);
        }
    }
    watch_set(hc, UV_DISCONNECT);
}

/* ---- connections: limits, timeouts, accepting ----------------------------------------------- */

static void on_header_timer(uv_timer_t *t) {
    struct http_server *s = t->data;
    int64_t now = (int64_t)uv_now(s->loop);
    struct conn *c;
    while ((c = conn_table_oldest_started(s->conns)) != NULL &&
           conn_started_ms(c) + s->header_timeout_ms <= now) {
        LOG_DEBUG("http",
                  "request headers not complete within --header-timeout-s req=- session=- "
                  "timeout_ms=%lld",
                  (long long)s->header_timeout_ms);
        drop((struct http_conn *)c);
    }
    header_timer_arm(s);
}

static void header_timer_arm(struct http_server *s) {
    struct conn *c = conn_table_oldest_started(s->conns);
    if (c == NULL) {
        uv_timer_stop(&s->header_timer);
        return;
    }
    int64_t due = conn_started_ms(c) + s->header_timeout_ms - (int64_t)uv_now(s->loop);
    uv_timer_start(&s->header_timer, on_header_timer, due > 0 ? (uint64_t)due : 0, 0);
}

/* The address as a table key: IPv6 as is, IPv4 as ::ffff:a.b.c.d. */
static void addr_key(const struct sockaddr *sa, uint8_t *key) {
    memset(key, 0, CONN_ADDR_BYTES);
    if (sa != NULL && sa->sa_family == AF_INET6) {
        memcpy(key, &((const struct sockaddr_in6 *)sa)->sin6_addr, CONN_ADDR_BYTES);
    } else if (sa != NULL && sa->sa_family == AF_INET) {
        key[10] = key[11] = 0xff;
        memcpy(key + 12, &((const struct sockaddr_in *)sa)->sin_addr, 4);
    }
}

static void log_limits(struct http_server *s) {
    uint64_t now = uv_now(s->loop);
    if (now - s->last_limit_log_ms < LIMIT_LOG_MS && s->last_limit_log_ms != 0) {
        return;
    }
    s->last_limit_log_ms = now;
    LOG_WARN("http",
             "connection limit reached req=- session=- reclaimed=%llu refused=%llu open=%d "
             "max_connections=%d max_connections_per_ip=%d",
             (unsigned long long)(s->n_reclaimed - s->n_reclaimed_logged),
             (unsigned long long)(s->n_refused - s->n_refused_logged),
             (int)conn_table_count(s->conns), (int)s->limits.max_total, (int)s->limits.max_per_ip);
    s->n_reclaimed_logged = s->n_reclaimed;
    s->n_refused_logged = s->n_refused;
}

/* RFC 9110 section 6.6.1's Date: now, in IMF-fixdate. */
static void http_date(char *buf, size_t size) {
    time_t now = time(NULL);
    struct tm tm;
    gmtime_r(&now, &tm);
    strftime(buf, size, "%a, %d %b %Y %H:%M:%S GMT", &tm);
}

/* Sends the 503 (its head made now: Date, and a request id as every answer has; the rest canned)
 * and closes. What the client already sent is read first, and the socket lingers (http_linger.c)
 * for what it still sends: a close over unread bytes resets the connection, which could lose the
 * answer (a client writing a large body before it reads met the reset at once). */
static void refuse(struct http_server *s, int fd) {
    char sink[4096];
    for (int i = 0; i < 16 && recv(fd, sink, sizeof sink, MSG_DONTWAIT) > 0; i++) {
    }
    char date[64], head[256];
    http_date(date, sizeof date);
    int hl = snprintf(head, sizeof head,
                      "HTTP/1.1 503 Service Unavailable\r\nDate: %s\r\nConnection: close\r\n"
                      "Retry-After: 1\r\nX-Request-Id: %llu\r\n",
                      date, (unsigned long long)++s->next_id);
    struct iovec iov[2] = {{head, (size_t)hl}, {s->refusal.data, s->refusal.len}};
    struct msghdr msg = {.msg_iov = iov, .msg_iovlen = 2};
    ssize_t n = sendmsg(fd, &msg, MSG_NOSIGNAL | MSG_DONTWAIT);
    (void)n; /* best effort: the socket is new, its buffer empty */
    shutdown(fd, SHUT_WR);
    http__linger(s, fd, true); /* its request's headers or body may be still arriving */
    close(fd);
    s->n_refused++;
    log_limits(s);
}

static void admit(struct http_server *s, int fd, const struct sockaddr_storage *ss, socklen_t len) {
    uint8_t key[CONN_ADDR_BYTES];
    addr_key((const struct sockaddr *)ss, key);
    struct conn *victim;
    switch (conn_table_admit(s->conns, key, &victim)) {
    case CONN_ADMIT_REFUSE:
        refuse(s, fd);
        return;
    case CONN_ADMIT_RECLAIM:
        drop((struct http_conn *)victim);
        s->n_reclaimed++;
        log_limits(s);
        break;
    case CONN_ADMIT_OK:
        break;
    }
    /* MHD closes the socket itself when it cannot take it. */
    if (MHD_add_connection(s->daemon, fd, (const struct sockaddr *)ss, len) != MHD_YES) {
        LOG_WARN("http", "libmicrohttpd refused a connection req=- session=- error=\"%s\"",
                 strerror(errno));
    }
}

static void on_accept(uv_poll_t *p, int status, int events);

static void on_accept_timer(uv_timer_t *t) {
    struct http_server *s = t->data;
    if (s->listen_fd >= 0) {
        uv_poll_start(&s->accept_poll, UV_READABLE, on_accept);
    }
}

static void on_accept(uv_poll_t *p, int status, int events) {
    struct http_server *s = p->data;
    for (int i = 0; i < HTTP_ACCEPT_BATCH; i++) {
        struct sockaddr_storage ss;
        socklen_t len = sizeof ss;
        int fd = accept(s->listen_fd, (struct sockaddr *)&ss, &len);
        if (fd < 0) {
            if (errno == EINTR || errno == ECONNABORTED) {
                continue;
            }
            if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM) {
                /* The limits keep within RLIMIT_NOFILE (main), so this is another part of the
                 * process holding descriptors: back off rather than spin on a ready socket. */
                LOG_WARN("http", "cannot accept req=- session=- error=\"%s\" pause_ms=%d",
                         strerror(errno), ACCEPT_PAUSE_MS);
                uv_poll_stop(&s->accept_poll);
                uv_timer_start(&s->accept_timer, on_accept_timer, ACCEPT_PAUSE_MS, 0);
            }
            break;
        }
        fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);
        fcntl(fd, F_SETFD, FD_CLOEXEC);
        admit(s, fd, &ss, len);
    }
    http__schedule_run(s);
}

/* MHD's STARTED notice (inside MHD_add_connection): the connection joins the table, waiting. */
static struct http_conn *conn_open(struct http_server *s, struct MHD_Connection *mc) {
    const union MHD_ConnectionInfo *fd_info =
        MHD_get_connection_info(mc, MHD_CONNECTION_INFO_CONNECTION_FD);
    const union MHD_ConnectionInfo *addr_info =
        MHD_get_connection_info(mc, MHD_CONNECTION_INFO_CLIENT_ADDRESS);
    struct http_conn *hc = calloc(1, sizeof *hc);
    if (hc == NULL || fd_info == NULL) {
        free(hc);
        return NULL;
    }
    uint8_t key[CONN_ADDR_BYTES];
    addr_key(addr_info != NULL ? addr_info->client_addr : NULL, key);
    if (conn_table_add(s->conns, &hc->c, key) != 0) {
        free(hc);
        return NULL;
    }
    hc->srv = s;
    hc->mhd = mc;
    hc->fd = fd_info->connect_fd;
    hc->is_counted = true;
    if (uv_poll_init(s->loop, &hc->watch, hc->fd) == 0) {
        hc->has_watch = true;
        hc->watch.data = hc;
        watch_set(hc, UV_READABLE | UV_DISCONNECT);
    } else {
        LOG_WARN("http", "cannot watch a connection; a client's FIN is seen only by "
                         "libmicrohttpd req=- session=-");
    }
    return hc;
}

static void on_conn_handle_closed(uv_handle_t *h) {
    free(h->data);
}

/* MHD's CLOSED notice, before it closes the socket. */
static void conn_close(struct http_conn *hc) {
    if (hc->is_counted) {
        conn_table_remove(hc->srv->conns, &hc->c);
        hc->is_counted = false;
    }
    check_remove(hc);
    if (hc->req != NULL) {
        hc->req->hc = NULL;
    }
    if (!hc->is_dropped) { /* one dropped here was cut on purpose */
        http__linger(hc->srv, hc->fd, hc->is_body_unread);
    }
    if (hc->has_watch) {
        uv_close((uv_handle_t *)&hc->watch, on_conn_handle_closed);
    } else {
        free(hc);
    }
}

void http__conn_notify(void *cls, struct MHD_Connection *mc, void **socket_context,
                       enum MHD_ConnectionNotificationCode code) {
    struct http_server *s = cls;
    if (code == MHD_CONNECTION_NOTIFY_STARTED) {
        *socket_context = conn_open(s, mc);
        if (*socket_context == NULL) {
            const union MHD_ConnectionInfo *info =
                MHD_get_connection_info(mc, MHD_CONNECTION_INFO_CONNECTION_FD);
            LOG_WARN("http", "out of memory for a connection; closing it req=- session=-");
            if (info != NULL) {
                shutdown(info->connect_fd, SHUT_RDWR);
            }
        }
        return;
    }
    if (*socket_context != NULL) {
        conn_close(*socket_context);
        *socket_context = NULL;
    }
}

/* ---- answers written around MHD ---------------------------------------------------------- */

/* A suspended request whose client sent a FIN and nothing after it cannot be answered through
 * MHD: libmicrohttpd 0.9.75, once resumed, reads before it writes, takes the end of stream for
 * an aborted request and closes the connection unanswered. Such an answer is written here
 * instead (direct_begin). A FIN that arrives between this check and MHD's next pass (one loop
 * turn) still loses the answer. */
bool http__direct_needed(const struct http_request *r) {
    return r->is_suspended && !r->is_in_handler && r->hc != NULL && !r->hc->is_dropped &&
           peek(r->hc->fd) == 0;
}

/* MHD's timeout does not cover a suspended connection, so a direct answer whose client stops
 * reading is dropped here after idle_timeout_s without progress, as MHD would drop it. */
static void on_stall_timer(uv_timer_t *t) {
    struct http_server *s = t->data;
    uint64_t now = uv_now(s->loop);
    struct conn *next;
    for (struct conn *c = conn_table_first(s->conns, CONN_STATE_BUSY); c != NULL; c = next) {
        next = conn_next(c);
        struct http_request *r = ((struct http_conn *)c)->req;
        if (r != NULL && r->is_direct && r->out.len > r->out_off &&
            (int64_t)(now - r->direct_progress_ms) >= s->idle_timeout_ms) {
            LOG_DEBUG("http", "client stopped reading its answer req=%llu session=-",
                      (unsigned long long)r->id);
            drop_as((struct http_conn *)c, "timeout");
        }
    }
}

/* Starts a direct answer: the status line and headers go into r->out (MHD never sees this
 * answer), and the connection ends with it. body_len < 0 means chunked (a stream). */
void http__direct_begin(struct http_request *r, int status, const char *content_type,
                        long long body_len) {
    struct strbuf *b = &r->out;
    const char *reason = MHD_get_reason_phrase_for((unsigned)status);
    char date[64];
    http_date(date, sizeof date);
    strbuf_printf(b, "HTTP/1.1 %d %s\r\nDate: %s\r\nConnection: close\r\nX-Request-Id: %llu\r\n",
                  status, reason != NULL ? reason : "", date, (unsigned long long)r->id);
    if (content_type != NULL) {
        strbuf_printf(b, "Content-Type: %s\r\n", content_type);
    }
    for (struct header *h = r->headers; h != NULL; h = h->next) {
        if (strcasecmp(h->name, "Connection") != 0) {
            strbuf_printf(b, "%s: %s\r\n", h->name, h->value);
        }
    }
    if (body_len < 0) {
        strbuf_puts(b, "Cache-Control: no-cache\r\nTransfer-Encoding: chunked\r\n\r\n");
    } else {
        strbuf_printf(b, "Content-Length: %lld\r\n\r\n", body_len);
    }
    r->is_direct = true;
    r->is_answered = true;
    r->direct_progress_ms = uv_now(r->srv->loop);
    if (r->srv->n_direct++ == 0) {
        uv_timer_start(&r->srv->stall_timer, on_stall_timer, 1000, 1000);
    }
    LOG_DEBUG("http", "client closed its sending side; answering directly req=%llu session=-",
              (unsigned long long)r->id);
}

/* Writes what the socket takes; the watch calls again when it takes more. The answer done (or
 * the client gone), the connection is dropped; a stream drained asks its producer for more. */
static void direct_flush(struct http_request *r) {
    struct http_conn *hc = r->hc;
    if (hc == NULL || hc->is_dropped) {
        return;
    }
    if (r->out.has_failed) {
        LOG_ERROR("http", "out of memory for a direct answer req=%llu session=-",
                  (unsigned long long)r->id);
        drop_as(hc, "error");
        return;
    }
    while (r->out_off < r->out.len) {
        ssize_t n = send(hc->fd, r->out.data + r->out_off, r->out.len - r->out_off,
                         MSG_NOSIGNAL | MSG_DONTWAIT);
        if (n < 0 && errno == EINTR) {
            continue;
        }
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
            watch_set(hc, UV_WRITABLE);
            return;
        }
        if (n < 0) {
            drop_as(hc, "client_closed");
            return;
        }
        r->out_off += (size_t)n;
        r->direct_progress_ms = uv_now(r->srv->loop);
    }
    r->out.len = 0;
    r->out_off = 0;
    watch_set(hc, 0);
    if (r->is_stream && !r->is_stream_ended) {
        r->srv->h.on_stream_drained(r->srv->h.ctx, r);
        return;
    }
    drop_as(hc, NULL); /* the answer went out whole */
}

/* Data for a direct answer is written from the watch, never from inside the caller (who may be
 * in the middle of a job, and on_stream_drained must not run inside it). */
void http__direct_kick(struct http_request *r) {
    if (r->hc != NULL) {
        watch_set(r->hc, UV_WRITABLE);
    }
}

/* ---- the layer ------------------------------------------------------------------------------ */

/* The canned end of the 503 refusal: its last headers and its body (refuse() writes the rest). */
static void refusal_init(struct strbuf *b, const struct http_params *p) {
    strbuf_init(b);
    strbuf_printf(b, "Content-Type: %s\r\nContent-Length: %zu\r\n\r\n",
                  p->refusal_type != NULL ? p->refusal_type : "text/plain", p->refusal_len);
    strbuf_append(b, p->refusal_body != NULL ? p->refusal_body : "", p->refusal_len);
}

int http__conns_create(struct http_server *s, const struct http_params *p) {
    s->header_timeout_ms = (int64_t)p->header_timeout_s * 1000;
    s->idle_timeout_ms = (int64_t)p->idle_timeout_s * 1000;
    s->limits = (struct conn_limits){p->max_connections, p->max_per_ip};
    refusal_init(&s->refusal, p);
    if (s->refusal.has_failed) {
        return -1;
    }
    return conn_table_create(&s->limits, &s->conns);
}

void http__conns_destroy(struct http_server *s) {
    conn_table_destroy(s->conns);
    s->conns = NULL;
    strbuf_release(&s->refusal);
}

void http__conns_start(struct http_server *s) {
    uv_poll_init(s->loop, &s->accept_poll, s->listen_fd);
    uv_timer_init(s->loop, &s->accept_timer);
    uv_timer_init(s->loop, &s->header_timer);
    uv_timer_init(s->loop, &s->stall_timer);
    s->accept_poll.data = s;
    s->accept_timer.data = s->header_timer.data = s->stall_timer.data = s;
    s->n_open_handles += 4;
    uv_poll_start(&s->accept_poll, UV_READABLE, on_accept);
}

void http__conns_stop_accepting(struct http_server *s, uv_close_cb cb) {
    if (s->listen_fd < 0) {
        return;
    }
    /* Closed, not only stopped, before the socket is: libuv's close of a poll handle takes its
     * descriptor out of the loop's epoll by number, and by then the number may be another
     * thread's file (the disk tier's I/O thread writes sessions during the drain). */
    uv_close((uv_handle_t *)&s->accept_poll, cb);
    uv_timer_stop(&s->accept_timer);
    close(s->listen_fd);
    s->listen_fd = -1;
}

void http__conns_close(struct http_server *s, uv_close_cb cb) {
    uv_timer_stop(&s->header_timer);
    uv_timer_stop(&s->stall_timer);
    if (!uv_is_closing((uv_handle_t *)&s->accept_poll)) {
        uv_close((uv_handle_t *)&s->accept_poll, cb);
    }
    uv_close((uv_handle_t *)&s->accept_timer, cb);
    uv_close((uv_handle_t *)&s->header_timer, cb);
    uv_close((uv_handle_t *)&s->stall_timer, cb);
}

void http__conn_target_seen(struct http_conn *hc) {
    if (hc->is_counted && hc->req == NULL) {
        conn_table_set_started(hc->srv->conns, &hc->c, (int64_t)uv_now(hc->srv->loop));
        header_timer_arm(hc->srv);
    }
}

void http__conn_request_begin(struct http_request *r) {
    const union MHD_ConnectionInfo *info =
        MHD_get_connection_info(r->conn, MHD_CONNECTION_INFO_SOCKET_CONTEXT);
    struct http_conn *hc = info != NULL ? info->socket_context : NULL;
    r->hc = hc;
    if (hc == NULL) {
        return;
    }
    hc->req = r;
    if (hc->is_counted) {
        conn_table_set_busy(r->srv->conns, &hc->c);
    }
    /* The watch keeps waiting for READABLE too until it fires: a client that sends nothing more
     * while its request runs (the usual one) never wakes it, and one that does (body bytes MHD
     * has not read yet, a pipelined request) switches it to DISCONNECT alone in on_watch, so a
     * level-triggered READABLE cannot spin. Switching here cost each request three epoll_ctl
     * calls (libuv removes the fd at every uv_poll_start and adds it back at its next poll). */
}

void http__conn_request_end(struct http_request *r) {
    struct http_conn *hc = r->hc;
    if (hc == NULL) {
        return;
    }
    hc->req = NULL;
    r->hc = NULL;
    /* answered before its body was in: the client may still be sending it (see conn_close) */
    hc->is_body_unread =
        !r->has_body_handed && (http_request_header(r, "Content-Length") != NULL ||
                                http_request_header(r, "Transfer-Encoding") != NULL);
    if (hc->has_fin) {
        drop(hc); /* its client sends nothing more: the connection ends with this answer */
    } else if (hc->is_counted) {
        conn_table_set_waiting(r->srv->conns, &hc->c);
        hc->rx_mark = bytes_received(hc->fd);
        watch_set(hc, UV_READABLE | UV_DISCONNECT);
    }
}

bool http__conn_is_dropped(const struct http_request *r) {
    return r->hc == NULL || r->hc->is_dropped;
}

bool http__conn_is_gone(const struct http_request *r) {
    return http__conn_is_dropped(r) || is_gone(r->hc->fd);
}

int64_t http_server_fds_needed(int32_t max_connections) {
    return (int64_t)max_connections + HTTP_CONN_SLACK + HTTP_LINGER_SLOTS + 1;
}

bool http_server_has_partial_headers(const struct http_server *s) {
    return conn_table_oldest_started(s->conns) != NULL;
}

int32_t http_server_n_connections(const struct http_server *s) {
    return conn_table_count(s->conns);
}

uint64_t http_server_n_refused(const struct http_server *s) {
    return s->n_refused;
}

uint64_t http_server_n_reclaimed(const struct http_server *s) {
    return s->n_reclaimed;
}

int32_t http_server_cut_unreceived(struct http_server *s, int32_t *n_finishing) {
    int32_t n = 0;
    *n_finishing = s->n_requests;
    struct conn *next;
    for (struct conn *c = conn_table_first(s->conns, CONN_STATE_BUSY); c != NULL; c = next) {
        next = conn_next(c);
        struct http_conn *hc = (struct http_conn *)c;
        if (hc->req != NULL && !is_received(hc->req)) {
            LOG_WARN("http",
                     "dropping a request still being received req=%llu session=- "
                     "body_bytes=%zu",
                     (unsigned long long)hc->req->id, hc->req->body.len - hc->req->body_pad);
            drop_as(hc, "shutdown");
            n++;
            (*n_finishing)--;
        }
    }
    for (struct conn *c = conn_table_first(s->conns, CONN_STATE_WAITING); c != NULL; c = next) {
        next = conn_next(c);
        if (conn_is_started(c)) {
            LOG_WARN("http", "dropping a request still sending its headers req=- session=-");
            n++;
        }
        drop((struct http_conn *)c);
    }
    return n;
}

void http__direct_release(struct http_request *r) {
    if (--r->srv->n_direct == 0) {
        uv_timer_stop(&r->srv->stall_timer);
    }
}
