/* bench/load_http.c: the load generator's HTTP/1.1 client (see load_http.h). */
#include "load_http.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

/* Room asked of the answer buffer before each read: a 32-step answer of the small preset is
 * 64 KiB of floats, read in one or two calls. */
#define READ_ROOM (64 * 1024)

static uint64_t mono_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static int buf_reserve(lhttp_buf *b, size_t extra) {
    if (b->len + extra + 1 <= b->cap) {
        return 0;
    }
    size_t cap = b->cap ? b->cap : 4096;
    while (cap < b->len + extra + 1) {
        cap *= 2;
    }
    char *p = realloc(b->data, cap);
    if (p == NULL) {
        return -1;
    }
    b->data = p;
    b->cap = cap;
    return 0;
}

static int buf_append(lhttp_buf *b, const void *p, size_t n) {
    if (buf_reserve(b, n) != 0) {
        return -1;
    }
    memcpy(b->data + b->len, p, n);
    b->len += n;
    b->data[b->len] = '\0';
    return 0;
}

int lhttp_resolve(const char *base_url, struct sockaddr_in *addr) {
    const char *p = strncmp(base_url, "http://", 7) == 0 ? base_url + 7 : NULL;
    if (p == NULL) {
        return -1;
    }
    char host[256];
    size_t n = strcspn(p, ":/");
    if (n == 0 || n >= sizeof host) {
        return -1;
    }
    memcpy(host, p, n);
    host[n] = '\0';
    long port = 80;
    if (p[n] == ':') {
        char *end = NULL;
        port = strtol(p + n + 1, &end, 10);
        if (end == p + n + 1 || (*end != '\0' && *end != '/') || port < 1 || port > 65535) {
            return -1;
        }
    }
    struct addrinfo hints = {.ai_family = AF_INET, .ai_socktype = SOCK_STREAM};
    struct addrinfo *res = NULL;
    if (getaddrinfo(host, NULL, &hints, &res) != 0 || res == NULL) {
        return -1;
    }
    memcpy(addr, res->ai_addr, sizeof *addr);
    addr->sin_port = htons((uint16_t)port);
    freeaddrinfo(res);
    return 0;
}

void lhttp_init(lhttp_conn *c, const struct sockaddr_in *addr) {
    memset(c, 0, sizeof *c);
    c->addr = *addr;
    c->fd = -1;
}

static void disconnect(lhttp_conn *c) {
    if (c->fd >= 0) {
        close(c->fd);
        c->fd = -1;
    }
}

void lhttp_release(lhttp_conn *c) {
    disconnect(c);
    free(c->out.data);
    free(c->in.data);
    free(c->chunked.data);
    memset(&c->out, 0, sizeof c->out);
    memset(&c->in, 0, sizeof c->in);
    memset(&c->chunked, 0, sizeof c->chunked);
}

static lhttp_state fail(lhttp_conn *c, const char *what, int err) {
    if (err != 0) {
        snprintf(c->error, sizeof c->error, "%s: %s", what, strerror(err));
    } else {
        snprintf(c->error, sizeof c->error, "%s", what);
    }
    disconnect(c);
    c->state = LHTTP_FAILED;
    return c->state;
}

static int connect_now(lhttp_conn *c) {
    c->fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (c->fd < 0) {
        return errno;
    }
    int one = 1;
    setsockopt(c->fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    /* blocking connect (loopback or a LAN: immediate), then non-blocking traffic */
    if (connect(c->fd, (const struct sockaddr *)&c->addr, sizeof c->addr) != 0) {
        int err = errno;
        disconnect(c);
        return err;
    }
    int fl = fcntl(c->fd, F_GETFL);
    if (fl < 0 || fcntl(c->fd, F_SETFL, fl | O_NONBLOCK) != 0) {
        int err = errno;
        disconnect(c);
        return err;
    }
    return 0;
}

/* Writes what it can of the request; RECEIVING once all of it is out. */
static lhttp_state send_some(lhttp_conn *c) {
    const char *piece[3] = {c->out.data, c->out_body, c->out_tail};
    size_t piece_len[3] = {c->out.len, c->out_body_len, c->out_tail_len};
    size_t total = piece_len[0] + piece_len[1] + piece_len[2];
    while (c->sent < total) {
        /* head and body in one call: one segment on the wire for a small request */
        struct iovec iov[3];
        int n_iov = 0;
        size_t before = 0; /* bytes of the pieces before this one */
        for (int i = 0; i < 3; i++) {
            if (c->sent < before + piece_len[i]) {
                size_t done = c->sent > before ? c->sent - before : 0;
                iov[n_iov++] = (struct iovec){(char *)piece[i] + done, piece_len[i] - done};
            }
            before += piece_len[i];
        }
        struct msghdr msg = {.msg_iov = iov, .msg_iovlen = (size_t)n_iov};
        ssize_t n = sendmsg(c->fd, &msg, MSG_NOSIGNAL);
        if (n < 0 && errno == EINTR) {
            continue;
        }
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
            return c->state;
        }
        if (n <= 0) {
            return fail(c, "send", n < 0 ? errno : EPIPE);
        }
        c->sent += (size_t)n;
    }
    c->state = LHTTP_RECEIVING;
    return c->state;
}

/* The request again on a new connection: the server closed the old one before it answered. */
static lhttp_state resend(lhttp_conn *c) {
    disconnect(c);
    c->is_reused = false;
    c->sent = 0;
    c->in.len = 0;
    int err = connect_now(c);
    if (err != 0) {
        return fail(c, "connect", err);
    }
    c->state = LHTTP_SENDING;
    return send_some(c);
}

int lhttp_start(lhttp_conn *c, const char *method, const char *path, const char *headers,
                const void *body, size_t body_len) {
    return lhttp_start_parts(c, method, path, headers, body, body_len, NULL, 0);
}

int lhttp_start_parts(lhttp_conn *c, const char *method, const char *path, const char *headers,
                      const void *body, size_t body_len, const void *tail, size_t tail_len) {
    c->started_ns = mono_ns();
    c->error[0] = '\0';
    c->out.len = 0;
    c->in.len = 0;
    c->sent = 0;
    c->head_end = 0;
    c->status = 0;
    c->content_length = -1;
    c->is_chunked = false;
    c->is_close = false;
    c->chunked.len = 0;
    c->chunk_at = 0;
    c->body = NULL;
    c->body_len = 0;
    char head[512];
    int n = snprintf(head, sizeof head, "%s %s HTTP/1.1\r\nHost: %s:%u\r\nContent-Length: %zu\r\n",
                     method, path, inet_ntoa(c->addr.sin_addr), (unsigned)ntohs(c->addr.sin_port),
                     (body != NULL ? body_len : (size_t)0) + (tail != NULL ? tail_len : (size_t)0));
    c->out_body = body;
    c->out_body_len = body != NULL ? body_len : 0;
    c->out_tail = tail;
    c->out_tail_len = tail != NULL ? tail_len : 0;
    if (n < 0 || (size_t)n >= sizeof head || buf_append(&c->out, head, (size_t)n) != 0 ||
        (headers != NULL && buf_append(&c->out, headers, strlen(headers)) != 0) ||
        buf_append(&c->out, "\r\n", 2) != 0) {
        fail(c, "out of memory for a request", 0);
        return -1;
    }
    c->is_reused = c->fd >= 0;
    if (c->fd < 0) {
        int err = connect_now(c);
        if (err != 0) {
            fail(c, "connect", err);
            return -1;
        }
    }
    c->state = LHTTP_SENDING;
    if (send_some(c) == LHTTP_FAILED) {
        if (!c->is_reused || resend(c) == LHTTP_FAILED) {
            return -1;
        }
    }
    return 0;
}

short lhttp_events(const lhttp_conn *c) {
    return c->state == LHTTP_SENDING ? POLLOUT : c->state == LHTTP_RECEIVING ? POLLIN : 0;
}

/* The value of header `name` in the answer's head (NUL-terminated by the caller's copy), or
 * NULL. */
static const char *header_value(const char *head, size_t len, const char *name, size_t *vlen) {
    size_t nl = strlen(name);
    const char *p = memchr(head, '\n', len);
    const char *end = head + len;
    while (p != NULL && p + 1 < end) {
        const char *line = p + 1;
        const char *eol = memchr(line, '\n', (size_t)(end - line));
        if (eol == NULL) {
            break;
        }
        if ((size_t)(eol - line) > nl && strncasecmp(line, name, nl) == 0 && line[nl] == ':') {
            const char *v = line + nl + 1;
            while (v < eol && (*v == ' ' || *v == '\t')) {
                v++;
            }
            const char *ve = eol;
            while (ve > v && (ve[-1] == '\r' || ve[-1] == ' ' || ve[-1] == '\t')) {
                ve--;
            }
            *vlen = (size_t)(ve - v);
            return v;
        }
        p = eol;
    }
    return NULL;
}

static bool contains_token(const char *v, size_t n, const char *token) {
    size_t tl = strlen(token);
    for (size_t i = 0; i + tl <= n; i++) {
        if (strncasecmp(v + i, token, tl) == 0) {
            return true;
        }
    }
    return false;
}

/* Reads the head once it is whole: status, framing. false on a malformed one. */
static bool parse_head(lhttp_conn *c) {
    const char *h = c->in.data;
    if (c->head_end < 12 || strncmp(h, "HTTP/1.", 7) != 0 || h[8] != ' ') {
        return false;
    }
    char *end = NULL;
    c->status = strtol(h + 9, &end, 10);
    if (end != h + 12 || c->status < 100 || c->status > 599) {
        return false;
    }
    size_t vlen = 0;
    const char *v = header_value(h, c->head_end, "Transfer-Encoding", &vlen);
    c->is_chunked = v != NULL && contains_token(v, vlen, "chunked");
    v = header_value(h, c->head_end, "Content-Length", &vlen);
    c->content_length = -1;
    if (v != NULL && !c->is_chunked) {
        char num[24];
        if (vlen == 0 || vlen >= sizeof num) {
            return false;
        }
        memcpy(num, v, vlen);
        num[vlen] = '\0';
        long long cl = strtoll(num, &end, 10);
        if (*end != '\0' || cl < 0) {
            return false;
        }
        c->content_length = cl;
    }
    v = header_value(h, c->head_end, "Connection", &vlen);
    c->is_close = v != NULL && contains_token(v, vlen, "close");
    if (c->status == 204 || c->status == 304) {
        c->content_length = 0;
    }
    c->chunk_at = c->head_end;
    return true;
}

/* Joins the chunks read so far; 1 when the last one and its trailer are in, 0 for more, -1 on
 * a malformed chunk. */
static int parse_chunks(lhttp_conn *c) {
    for (;;) {
        const char *p = c->in.data + c->chunk_at;
        size_t left = c->in.len - c->chunk_at;
        const char *eol = memchr(p, '\n', left);
        if (eol == NULL) {
            return left > 64 ? -1 : 0;
        }
        char *end = NULL;
        unsigned long long size = strtoull(p, &end, 16);
        if (end == p || size > ((size_t)1 << 40)) {
            return -1;
        }
        size_t line = (size_t)(eol - p) + 1;
        if (size == 0) {
            /* the trailer: lines up to an empty one */
            const char *t = eol + 1;
            size_t tl = left - line;
            for (;;) {
                const char *te = memchr(t, '\n', tl);
                if (te == NULL) {
                    return 0;
                }
                if (te == t || (te == t + 1 && t[0] == '\r')) {
                    c->chunk_at = (size_t)(te + 1 - c->in.data);
                    return 1;
                }
                tl -= (size_t)(te + 1 - t);
                t = te + 1;
            }
        }
        if (left < line + size + 2) {
            return 0;
        }
        if (buf_append(&c->chunked, eol + 1, size) != 0) {
            return -1;
        }
        c->chunk_at += line + size + 2;
    }
}

/* True once the whole answer is in (body set); sets *bad for a malformed one. */
static bool answer_complete(lhttp_conn *c, bool is_eof, bool *bad) {
    *bad = false;
    if (c->head_end == 0) {
        const char *blank = c->in.len >= 4 ? strstr(c->in.data, "\r\n\r\n") : NULL;
        if (blank == NULL) {
            *bad = is_eof || c->in.len > 64 * 1024;
            return false;
        }
        c->head_end = (size_t)(blank - c->in.data) + 4;
        if (!parse_head(c)) {
            *bad = true;
            return false;
        }
        if (c->status >= 100 && c->status < 200) {
            /* an interim answer: drop it, the real one follows */
            memmove(c->in.data, c->in.data + c->head_end, c->in.len - c->head_end + 1);
            c->in.len -= c->head_end;
            c->head_end = 0;
            return answer_complete(c, is_eof, bad);
        }
    }
    if (c->is_chunked) {
        int r = parse_chunks(c);
        *bad = r < 0 || (r == 0 && is_eof);
        if (r == 1) {
            c->body = c->chunked.data != NULL ? c->chunked.data : "";
            c->body_len = c->chunked.len;
        }
        return r == 1;
    }
    size_t have = c->in.len - c->head_end;
    if (c->content_length >= 0) {
        if (have > (size_t)c->content_length) {
            *bad = true; /* more than asked for: one request at a time */
            return false;
        }
        if (have < (size_t)c->content_length) {
            *bad = is_eof;
            return false;
        }
    } else if (!is_eof) {
        return false; /* the body ends when the connection does */
    } else {
        c->is_close = true;
    }
    c->body = c->in.data + c->head_end;
    c->body_len = have;
    return true;
}

static lhttp_state receive_some(lhttp_conn *c) {
    for (;;) {
        if (buf_reserve(&c->in, READ_ROOM) != 0) {
            return fail(c, "out of memory for an answer", 0);
        }
        ssize_t n = recv(c->fd, c->in.data + c->in.len, c->in.cap - c->in.len - 1, 0);
        if (n < 0 && errno == EINTR) {
            continue;
        }
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
            return c->state;
        }
        bool is_eof = n == 0;
        if (n < 0) {
            if (c->is_reused && c->in.len == 0 && (errno == ECONNRESET || errno == EPIPE)) {
                return resend(c);
            }
            return fail(c, "recv", errno);
        }
        if (is_eof && c->is_reused && c->in.len == 0) {
            return resend(c); /* closed while idle, before it read the request */
        }
        c->in.len += (size_t)n;
        c->in.data[c->in.len] = '\0';
        bool bad = false;
        if (answer_complete(c, is_eof, &bad)) {
            c->done_ns = mono_ns();
            c->state = LHTTP_DONE;
            if (c->is_close || is_eof) {
                disconnect(c);
            }
            return c->state;
        }
        if (bad) {
            return fail(
                c, is_eof ? "connection closed before the whole answer" : "malformed answer", 0);
        }
        if (is_eof) {
            return fail(c, "connection closed before the whole answer", 0);
        }
    }
}

lhttp_state lhttp_advance(lhttp_conn *c, short revents) {
    if (c->state == LHTTP_SENDING && (revents & (POLLOUT | POLLERR | POLLHUP))) {
        if (send_some(c) == LHTTP_FAILED) {
            return c->is_reused && c->in.len == 0 ? resend(c) : c->state;
        }
    }
    if (c->state == LHTTP_RECEIVING && (revents & (POLLIN | POLLERR | POLLHUP))) {
        return receive_some(c);
    }
    return c->state;
}

lhttp_state lhttp_run(lhttp_conn *c, const char *method, const char *path, const char *headers,
                      const void *body, size_t body_len, int timeout_ms) {
    if (lhttp_start(c, method, path, headers, body, body_len) != 0) {
        return c->state;
    }
    uint64_t deadline = c->started_ns + (uint64_t)timeout_ms * 1000000u;
    while (c->state == LHTTP_SENDING || c->state == LHTTP_RECEIVING) {
        uint64_t now = mono_ns();
        if (now >= deadline) {
            return fail(c, "timed out", 0);
        }
        struct pollfd p = {.fd = c->fd, .events = lhttp_events(c)};
        int n = poll(&p, 1, (int)((deadline - now) / 1000000u) + 1);
        if (n < 0 && errno != EINTR) {
            return fail(c, "poll", errno);
        }
        if (n > 0) {
            lhttp_advance(c, p.revents);
        }
    }
    return c->state;
}

void lhttp_finish(lhttp_conn *c) {
    if (c->state != LHTTP_DONE) {
        disconnect(c);
    }
    c->state = LHTTP_IDLE;
}
