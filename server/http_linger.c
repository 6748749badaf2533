/* server/http_linger.c: lingering closes (RFC 9112 section 9.6). An answer given before its
 * request's body was in (413 past --max-body-mb or --max-held-mb, as the headers say; the canned
 * 503 of a connection past the limits, before anything is read) ends the connection while the
 * client may still be sending. Closed at once with those bytes unread, the socket is reset (the
 * kernel's answer to unread data), and a client still writing its body sees the reset before it
 * reads the answer: curl reported no status at all, Python's http.client a broken pipe. So the
 * socket is kept open on a duplicate for up to HTTP_LINGER_MS after the close, its sending side
 * shut (the answer, then a FIN), reading and dropping whatever comes until the client closes or
 * the time is up.
 *
 * Thread rule: loop thread only.
 */
#include <errno.h>
#include <fcntl.h>
#include <stddef.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <unistd.h>

#include "http_int.h"
#include "log.h"

/* Bytes dropped per wake-up, so that one fast client cannot keep the loop from the others. */
#define LINGER_READ_MAX ((size_t)1 << 20)

/* The slot holding handle h, its member `member`. */
#define LINGER_OF(h, member)                                                                       \
    ((struct http_linger *)(void *)((char *)(h)-offsetof(struct http_linger, member)))

static void end(struct http_linger *l);

static void slot_closed(struct http_linger *l) {
    if (--l->n_open == 0) {
        l->in_use = false;
    }
}

/* The server's accounting last: it may free the server, and with it the slot. */
static void on_watch_closed(uv_handle_t *h) {
    slot_closed(LINGER_OF(h, watch));
    http__handle_closed(h);
}

static void on_timer_closed(uv_handle_t *h) {
    slot_closed(LINGER_OF(h, timer));
    http__handle_closed(h);
}

static void on_readable(uv_poll_t *p, int status, int events) {
    (void)events;
    struct http_linger *l = LINGER_OF(p, watch);
    if (status < 0) {
        end(l);
        return;
    }
    char sink[16384];
    for (size_t got = 0; got < LINGER_READ_MAX;) {
        ssize_t n = recv(l->fd, sink, sizeof sink, MSG_DONTWAIT);
        if (n > 0) {
            got += (size_t)n;
            continue;
        }
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) {
            return;
        }
        end(l); /* the client's FIN (0), or its reset */
        return;
    }
}

static void on_deadline(uv_timer_t *t) {
    end(LINGER_OF(t, timer));
}

/* Handles closed before the descriptor, as libuv needs (its epoll entry goes by number). */
static void end(struct http_linger *l) {
    if (l->is_ending) {
        return;
    }
    l->is_ending = true;
    uv_close((uv_handle_t *)&l->watch, on_watch_closed);
    uv_close((uv_handle_t *)&l->timer, on_timer_closed);
    close(l->fd);
}

void http__linger(struct http_server *s, int fd, bool body_unread) {
    int unread = 0;
    if (ioctl(fd, FIONREAD, &unread) != 0) {
        unread = 0;
    }
    if (s->is_stopping || (unread <= 0 && !body_unread)) {
        return; /* nothing unread, nothing more to come: a close sends no reset */
    }
    struct http_linger *l = NULL;
    for (int i = 0; i < HTTP_LINGER_SLOTS && l == NULL; i++) {
        l = s->lingering[i].in_use ? NULL : &s->lingering[i];
    }
    /* A duplicate only below the descriptor ceiling, for which the loop's watcher table is
     * sized: libuv aborts when growing it fails (see reserve_watchers in http.c). */
    int dup_fd = l != NULL ? fcntl(fd, F_DUPFD_CLOEXEC, 0) : -1;
    if (dup_fd >= 0 && s->fd_ceiling > 0 && dup_fd >= s->fd_ceiling) {
        close(dup_fd);
        dup_fd = -1;
    }
    if (dup_fd < 0 || uv_poll_init(s->loop, &l->watch, dup_fd) != 0) {
        LOG_DEBUG("http",
                  "closing a connection with %d bytes unread, not lingering (%s) req=- "
                  "session=-",
                  unread, l == NULL ? "every slot in use" : "no descriptor");
        if (dup_fd >= 0) {
            close(dup_fd);
        }
        return;
    }
    uv_timer_init(s->loop, &l->timer);
    l->watch.data = l->timer.data = s;
    l->fd = dup_fd;
    l->in_use = true;
    l->is_ending = false;
    l->n_open = 2;
    s->n_open_handles += 2;
    shutdown(dup_fd, SHUT_WR); /* MHD has; again in case it did not: the FIN follows the answer */
    uv_poll_start(&l->watch, UV_READABLE | UV_DISCONNECT, on_readable);
    uv_timer_start(&l->timer, on_deadline, HTTP_LINGER_MS, 0);
}

void http__linger_stop(struct http_server *s) {
    s->is_stopping = true;
    for (int i = 0; i < HTTP_LINGER_SLOTS; i++) {
        if (s->lingering[i].in_use) {
            end(&s->lingering[i]);
        }
    }
}
