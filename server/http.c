/* server/http.c: libmicrohttpd in external epoll mode on the libuv loop (see http.h): driving
 * MHD, its request callbacks, and answers (complete or streamed). Connections (accepting within
 * the limits, a client's FIN, timeouts, answers around MHD) are http_conn.c's.
 *
 * The loop polls MHD's epoll fd and runs a timer for MHD's timeouts; every state change that
 * MHD must notice (a resumed connection, a socket shut down) schedules an immediate MHD_run
 * through that timer.
 */
#include "http_int.h"

#include <errno.h>
#include <stdarg.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <unistd.h>

#include "log.h"

/* Answers in parts up to this size are copied into one buffer before they go (see
 * http_request_reply_parts); larger ones go from their parts, a copy costing more than the
 * syscall it saves. */
#define HTTP_GATHER_MAX ((size_t)1 << 20)

#define STREAM_BLOCK_BYTES (64 * 1024)

/* Answers this small always go out, whatever max_held_bytes: errors, health, small decodes. */
#define HELD_SMALL ((size_t)64 * 1024)

/* The most parts an answer from parts may have: a JSON and the tensors of 256 steps, with room. */
#define HTTP_PARTS_MAX 2048

static double mono_ms(void) {
    return (double)uv_hrtime() / 1e6;
}

/* ---- driving MHD from the loop -------------------------------------------------------------- */

static void on_timer(uv_timer_t *t);
static void hold(struct http_request *r, size_t len);

/* Runs on every loop turn while active, which makes libuv poll with a zero timeout. */
static void on_spin(uv_idle_t *h) {
    struct http_server *s = h->data;
    if (uv_hrtime() >= s->spin_until_ns || (s->h.may_spin != NULL && !s->h.may_spin(s->h.ctx))) {
        uv_idle_stop(h);
    }
}

/* A pass moved bytes or answers: a closed-loop client's next request comes within tens of
 * microseconds, and a sleeping loop takes about as long again to wake for it (one client of
 * the small preset: 0.28 -> 0.22 ms a call). So poll for spin_ns before sleeping, unless the
 * cores are computing (then the spin would take one from them). */
static void spin_start(struct http_server *s) {
    if (s->spin_ns == 0 || (s->h.may_spin != NULL && !s->h.may_spin(s->h.ctx))) {
        return;
    }
    s->spin_until_ns = uv_hrtime() + s->spin_ns;
    uv_idle_start(&s->spin, on_spin);
}

static void run_mhd(struct http_server *s) {
    MHD_run(s->daemon);
    http__conns_after_run(s);
    spin_start(s);
    MHD_UNSIGNED_LONG_LONG timeout;
    if (MHD_get_timeout(s->daemon, &timeout) == MHD_YES) {
        uv_timer_start(&s->timer, on_timer, (uint64_t)timeout, 0);
    } else {
        uv_timer_stop(&s->timer);
    }
}

static void on_timer(uv_timer_t *t) {
    run_mhd(t->data);
}

static void on_poll(uv_poll_t *p, int status, int events) {
    run_mhd(p->data);
}

void http__schedule_run(struct http_server *s) {
    uv_timer_start(&s->timer, on_timer, 0, 0);
}

void http__wake(struct http_request *r) {
    if (r->is_suspended) {
        r->is_suspended = false;
        MHD_resume_connection(r->conn);
        http__schedule_run(r->srv);
    }
}

/* ---- answers -------------------------------------------------------------------------------- */

static void decorate(struct http_request *r, struct MHD_Response *resp, const char *content_type) {
    char id[32]; /* without printf, per answer (see strbuf_copy_string) */
    id[strbuf_format_int(id, (long long)r->id)] = '\0';
    MHD_add_response_header(resp, "X-Request-Id", id);
    if (content_type != NULL) {
        MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_TYPE, content_type);
    }
    for (struct header *h = r->headers; h != NULL; h = h->next) {
        MHD_add_response_header(resp, h->name, h->value);
    }
}

/* Queues resp now if the connection allows it, else keeps it for the handler's return. */
static void queue_answer(struct http_request *r, struct MHD_Response *resp, unsigned status) {
    r->is_answered = true;
    if (r->is_in_handler) {
        r->pending = resp;
        r->pending_status = status;
        return;
    }
    /* Suspended connections accept a response at any time (MHD_queue_response's contract). */
    MHD_queue_response(r->conn, status, resp);
    MHD_destroy_response(resp);
    http__wake(r);
}

static enum MHD_Result flush_pending(struct http_request *r) {
    if (r->pending == NULL) {
        return MHD_YES;
    }
    enum MHD_Result ret = MHD_queue_response(r->conn, r->pending_status, r->pending);
    MHD_destroy_response(r->pending);
    r->pending = NULL;
    return ret;
}

/* Answers with resp, or when it could not be made (NULL: out of memory), with nothing: the
 * access handler then tells MHD to close the connection (answered from inside the handler, the
 * connection was suspended instead and hung, its request never finishing, nor the drain). */
static void answer_with(struct http_request *r, struct MHD_Response *resp, int status,
                        const char *content_type) {
    if (resp == NULL) {
        LOG_ERROR("http", "cannot create a response req=%llu", (unsigned long long)r->id);
        r->is_answered = true;
        r->is_unanswered = true;
        http__wake(r);
        return;
    }
    decorate(r, resp, content_type);
    queue_answer(r, resp, (unsigned)status);
}

void http_request_reply(struct http_request *r, int status, const char *content_type, char *body,
                        size_t len) {
    if (r->is_answered) {
        free(body);
        return;
    }
    hold(r, body != NULL ? len : 0);
    if (http__direct_needed(r)) {
        http__direct_begin(r, status, content_type, (long long)(body != NULL ? len : 0));
        if (body != NULL) {
            strbuf_append(&r->out, body, len);
        }
        free(body);
        http__direct_kick(r);
        return;
    }
    struct MHD_Response *resp =
        body != NULL ? MHD_create_response_from_buffer(len, body, MHD_RESPMEM_MUST_FREE)
                     : MHD_create_response_from_buffer(0, NULL, MHD_RESPMEM_PERSISTENT);
    if (resp == NULL) {
        free(body);
    }
    answer_with(r, resp, status, content_type);
}

void http_request_reply_parts(struct http_request *r, int status, const char *content_type,
                              const struct http_part *parts, int n_parts, void (*release)(void *),
                              void *owner) {
    if (r->is_answered) {
        release(owner);
        return;
    }
    size_t total = 0;
    for (int i = 0; i < n_parts; i++) {
        total += parts[i].len;
    }
    hold(r, total);
    if (http__direct_needed(r)) {
        /* answered around MHD, from the one buffer a direct answer writes from */
        http__direct_begin(r, status, content_type, (long long)total);
        for (int i = 0; i < n_parts; i++) {
            strbuf_append(&r->out, parts[i].data, parts[i].len);
        }
        release(owner);
        http__direct_kick(r);
        return;
    }
    struct MHD_IoVec iov[HTTP_PARTS_MAX];
    struct MHD_Response *resp = NULL;
    char *whole = total <= HTTP_GATHER_MAX ? malloc(total > 0 ? total : 1) : NULL;
    if (whole != NULL) {
        /* One buffer: MHD then writes the headers and the body with one sendmsg, where from a
         * vector it sends the headers alone first and the client wakes twice for one answer
         * (~25 us of a 32-session small step's ~0.3 ms beyond compute). */
        size_t at = 0;
        for (int i = 0; i < n_parts; i++) {
            if (parts[i].len > 0) {
                memcpy(whole + at, parts[i].data, parts[i].len);
                at += parts[i].len;
            }
        }
        resp = MHD_create_response_from_buffer(total, whole, MHD_RESPMEM_MUST_FREE);
        if (resp == NULL) {
            free(whole);
        }
        release(owner);
    } else if (n_parts <= HTTP_PARTS_MAX) {
        for (int i = 0; i < n_parts; i++) {
            iov[i] = (struct MHD_IoVec){parts[i].data, parts[i].len};
        }
        /* MHD keeps its own copy of the vector; the memory is the owner's until release */
        resp = MHD_create_response_from_iovec(iov, (unsigned)n_parts, release, owner);
        if (resp == NULL) {
            release(owner);
        }
    } else {
        release(owner);
    }
    answer_with(r, resp, status, content_type);
}

static ssize_t stream_reader(void *cls, uint64_t pos, char *buf, size_t max) {
    struct http_request *r = cls;
    size_t avail = r->out.len - r->out_off;
    if (avail > 0) {
        size_t n = avail < max ? avail : max;
        memcpy(buf, r->out.data + r->out_off, n);
        r->out_off += n;
        if (r->out_off == r->out.len) {
            r->out.len = 0;
            r->out_off = 0;
            if (!r->is_stream_ended) {
                r->srv->h.on_stream_drained(r->srv->h.ctx, r);
            }
        }
        return (ssize_t)n;
    }
    if (r->out.has_failed) {
        /* an event (or the end) could not be queued, out of memory: the connection closes as a
         * reset one does, the stream stopping at its next step. It waited for a drain that never
         * came, the client and the session's later requests with it, or ended cleanly without
         * its [DONE]. */
        return MHD_CONTENT_READER_END_WITH_ERROR;
    }
    if (r->is_stream_ended) {
        return MHD_CONTENT_READER_END_OF_STREAM;
    }
    /* Nothing to send yet: park the connection until the next write (MHD's documented use of
     * suspend inside a content reader; returning 0 without it would busy-loop). */
    MHD_suspend_connection(r->conn);
    r->is_suspended = true;
    return 0;
}

void http_request_stream_begin(struct http_request *r, int status, const char *content_type) {
    if (r->is_answered) {
        return;
    }
    if (http__direct_needed(r)) {
        r->is_stream = true;
        http__direct_begin(r, status, content_type, -1);
        http__direct_kick(r);
        return;
    }
    struct MHD_Response *resp = MHD_create_response_from_callback(
        MHD_SIZE_UNKNOWN, STREAM_BLOCK_BYTES, stream_reader, r, NULL);
    if (resp == NULL) {
        LOG_ERROR("http", "cannot create a stream response req=%llu", (unsigned long long)r->id);
        r->is_answered = true;
        r->is_unanswered = true;
        http__wake(r);
        return;
    }
    r->is_stream = true;
    decorate(r, resp, content_type);
    MHD_add_response_header(resp, MHD_HTTP_HEADER_CACHE_CONTROL, "no-cache");
    queue_answer(r, resp, (unsigned)status);
}

void http_request_stream_write(struct http_request *r, const char *data, size_t len) {
    if (!r->is_stream || r->is_stream_ended) {
        return;
    }
    if (r->is_direct) {
        if (len > 0) {
            strbuf_printf(&r->out, "%zx\r\n", len);
            strbuf_append(&r->out, data, len);
            strbuf_puts(&r->out, "\r\n");
        }
        http__direct_kick(r);
        return;
    }
    strbuf_append(&r->out, data, len);
    if (!r->is_in_handler) {
        http__wake(r);
    }
}

void http_request_stream_end(struct http_request *r) {
    if (!r->is_stream || r->is_stream_ended) {
        return;
    }
    r->is_stream_ended = true;
    if (r->is_direct) {
        strbuf_puts(&r->out, "0\r\n\r\n");
        http__direct_kick(r);
        return;
    }
    if (!r->is_in_handler) {
        http__wake(r);
    }
}

size_t http_request_stream_pending(const struct http_request *r) {
    return r->out.len - r->out_off;
}

/* ---- MHD callbacks -------------------------------------------------------------------------- */

/* RFC 9112 section 3.2.2: a server MUST accept the absolute-form of a request target
 * ("http://host/v1/model", as sent to a proxy), whose path is what the origin-form would carry;
 * libmicrohttpd hands it over whole, which matched no route (404). */
static bool is_absolute_form(const char *target) {
    return strncasecmp(target, "http://", 7) == 0 || strncasecmp(target, "https://", 8) == 0;
}

static const char *origin_path(const char *url) {
    const char *slash = strchr(strstr(url, "//") + 2, '/');
    return slash != NULL ? slash : "/";
}

static struct http_request *request_new(struct http_server *s, struct MHD_Connection *conn,
                                        const char *url, const char *method, const char *version) {
    struct http_request *r = calloc(1, sizeof *r);
    if (r == NULL) {
        return NULL;
    }
    r->srv = s;
    r->conn = conn;
    r->id = ++s->next_id;
    r->url = url;
    r->method = method;
    r->version = version;
    r->start_ms = mono_ms();
    strbuf_init(&r->body);
    strbuf_init(&r->out);
    http__conn_request_begin(r);
    r->path =
        r->hc != NULL && r->hc->target == url && r->hc->is_absolute_form ? origin_path(url) : url;
    s->n_requests++;
    return r;
}

static void request_free(struct http_request *r) {
    r->srv->held_bytes -= r->held; /* its body and answer are gone (MHD freed the answer) */
    while (r->headers != NULL) {
        struct header *h = r->headers;
        r->headers = h->next;
        free(h->name);
        free(h->value);
        free(h);
    }
    if (r->pending != NULL) {
        MHD_destroy_response(r->pending);
    }
    strbuf_release(&r->body);
    strbuf_release(&r->out);
    if (r->is_direct) {
        http__direct_release(r);
    }
    r->srv->n_requests--;
    free(r);
}

/* Bodies declared up to this size are allocated whole before they arrive; larger ones grow as
 * they come, so a client that declares much and sends little holds little. */
#define BODY_RESERVE_MAX ((size_t)16 << 20)

/* Takes the body's declared size at once (grown by doubling, a 64 KiB body was copied about
 * twice over on the loop thread). */
static void reserve_body(struct http_request *r) {
    const char *v =
        MHD_lookup_connection_value(r->conn, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONTENT_LENGTH);
    char *end = NULL;
    unsigned long long n = v != NULL ? strtoull(v, &end, 10) : 0;
    /* A body framed by the binary tensor extension: its JSON part's length, so that the raw
     * part after it lands at a 16-byte boundary (malloc's and realloc's alignment) and its
     * floats can be read in place (job.c checks the header itself). */
    const char *f =
        MHD_lookup_connection_value(r->conn, MHD_HEADER_KIND, "Inference-Header-Content-Length");
    char *f_end = NULL;
    unsigned long long json_len = f != NULL ? strtoull(f, &f_end, 10) : 0;
    r->body_pad = f != NULL && f_end != f && *f_end == '\0' ? (16 - json_len % 16) % 16 : 0;
    if (v != NULL && end != v && *end == '\0' && n > 0 && n <= r->srv->max_body_bytes) {
        strbuf_reserve(&r->body,
                       (n < BODY_RESERVE_MAX ? (size_t)n : BODY_RESERVE_MAX) + r->body_pad);
    }
    static const char zeros[16] = {0};
    strbuf_append(&r->body, zeros, r->body_pad);
}

/* More query arguments than any route reads (the attention route's six, the page's few). */
#define HTTP_QUERY_ARGS_MAX 128
/* libmicrohttpd 0.9.75's memory per connection (its default, which attnd keeps): the read
 * buffer, which holds the whole request line, and a record per query argument and header
 * (56 bytes, 64 with alignment), with room for 16 headers. */
#define MHD_POOL_BYTES   (32 * 1024)
#define MHD_RECORD_BYTES 64

/* The '?' MHD splits the query off at: the first in the target, which may lie past a NUL byte
 * in it (MHD searches the target's bytes, up to the NUL it wrote before the version, and parses
 * the arguments after it), so that "/healthz<NUL>?a&a..." went unseen and hung as on_target
 * says. MHD has checked the version before this call: "HTTP/1.d" with a NUL each side, so the
 * search stops at the first such, never past the request line (a target that itself holds
 * "<NUL>HTTP/1.1<NUL>" before its '?' still stops it early). */
static char *target_query(const char *uri) {
    char *query = strchr(uri, '?');
    for (const char *p = uri + strlen(uri); query == NULL;) {
        if (strncmp(p + 1, "HTTP/1.", 7) == 0 && p[8] >= '0' && p[8] <= '9' && p[9] == '\0') {
            return NULL;
        }
        query = strchr(p + 1, '?');
        p += 1 + strlen(p + 1);
    }
    return query;
}

/* MHD's log callback, called with the request target as received, before it splits off the
 * query or unescapes it in place; MHD ended it with a NUL where the version begins.
 *
 * libmicrohttpd 0.9.75 keeps a record per query argument in the connection's memory pool and,
 * when they do not fit beside the read buffer (some 450 arguments in a target of 2 KB, 128 in
 * one of 24 KB), queues an error it never sends and reads no further: the request hung
 * unanswered until --header-timeout-s cut it, unlogged. So a query of more arguments than any
 * route reads, or than fit, is cut here, in MHD's buffer before MHD splits it (to none: the '?'
 * it has found is followed by the end), and the request is refused (http_request_query_cut). */
static void *on_target(void *cls, const char *uri, struct MHD_Connection *conn) {
    const union MHD_ConnectionInfo *info =
        MHD_get_connection_info(conn, MHD_CONNECTION_INFO_SOCKET_CONTEXT);
    struct http_conn *hc = info != NULL ? info->socket_context : NULL;
    char *query = target_query(uri);
    size_t n_args = query != NULL && query[1] != '\0';
    for (const char *p = query; p != NULL && (p = strchr(p + 1, '&')) != NULL;) {
        n_args++;
    }
    size_t len = strlen(uri);
    /* a query past a NUL byte is cut whatever its size: the request is refused for the NUL */
    bool is_cut = n_args > HTTP_QUERY_ARGS_MAX || (query != NULL && query > uri + len) ||
                  (n_args > 0 && len + (n_args + 16) * MHD_RECORD_BYTES > MHD_POOL_BYTES);
    if (hc != NULL) {
        hc->target = uri;
        hc->target_len = len;
        hc->is_query_cut = is_cut;
        hc->is_absolute_form = is_absolute_form(uri);
        http__conn_target_seen(hc);
    }
    if (is_cut) {
        query[1] = '\0'; /* MHD's own buffer, writable: the const is its callback type's */
    }
    return NULL; /* no request context yet: on_access makes it */
}

bool http_request_query_cut(const struct http_request *r) {
    return r->hc != NULL && r->hc->target == r->url && r->hc->is_query_cut;
}

bool http_request_target_has_nul(const struct http_request *r) {
    const struct http_conn *hc = r->hc;
    /* Without a NUL in it, the target's C string runs to the NUL before the version (MHD's
     * url is the same bytes, split and unescaped in place) */
    return hc != NULL && hc->target == r->url && r->version[0] != '\0' &&
           hc->target + hc->target_len != r->version - 1;
}

bool http_request_method_has_nul(const struct http_request *r) {
    const struct http_conn *hc = r->hc;
    if (hc == NULL || hc->target != r->url) {
        return false;
    }
    /* Without a NUL in it, the method's C string runs to the NUL MHD wrote over the space after
     * it, and the target begins after that space (and any more MHD skipped) */
    const char *p = r->method + strlen(r->method) + 1;
    while (p < hc->target && *p == ' ') {
        p++;
    }
    return p != hc->target;
}

/* RFC 9110 section 5.6.2: the characters of a token, which a field name is. */
static bool is_tchar(unsigned char c) {
    return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
           (c != '\0' && strchr("!#$%&'*+-.^_`|~", c) != NULL);
}

/* Whether a field line whose value is value ends where next begins: MHD wrote a NUL over its
 * CR or LF (and over the LF of a CRLF), so a value that runs on past its C string's end held a
 * NUL byte, which MHD hands over cut at it. */
static bool line_ends_at(const char *value, const char *next) {
    const char *p = value + strlen(value);
    return next == p + 1 || (next == p + 2 && p[1] == '\0');
}

/* A value whose C string ends before its line does: a NUL in it (or a line after it that MHD
 * kept nowhere, such as one of an empty name after the first field). */
#define HELD_NUL "holds a NUL byte (its value ends before its line does)"

struct field_walk {
    const char *prev_key, *prev_value;
    const char *bad_key; /* the field found bad, or NULL */
    const char *why;
};

static enum MHD_Result check_field(void *cls, enum MHD_ValueKind kind, const char *key,
                                   const char *value) {
    struct field_walk *w = cls;
    size_t kl = strlen(key);
    bool is_token = kl > 0;
    for (size_t i = 0; i < kl && is_token; i++) {
        is_token = is_tchar((unsigned char)key[i]);
    }
    if (!is_token) {
        w->bad_key = "";
        w->why = kl == 0 ? "has an empty name"
                         : "has a name that is not a token (whitespace before the colon?)";
        return MHD_NO;
    }
    /* The name, the NUL MHD wrote over the colon, optional whitespace, the value: in one line
     * of the read buffer. A line continued on the next (obs-fold) is appended to the name
     * elsewhere in MHD's memory, so that "Content-Length: 5" + CRLF + " x" is a field named
     * "Content-Lengthx" and the body's length unknown to attnd, though not to other readers. */
    const char *p = key + kl + 1;
    while (p < value && (*p == ' ' || *p == '\t')) {
        p++;
    }
    if (p != value) {
        w->bad_key = key;
        w->why = "is folded over more than one line (obs-fold)";
        return MHD_NO;
    }
    /* RFC 9112 section 2.2: a bare CR, which MHD keeps in the value, ends the line for readers
     * that take it for one ("X-A: 1<CR>Content-Length: 40" a length to them, none to attnd) */
    if (strchr(value, '\r') != NULL) {
        w->bad_key = key;
        w->why = "holds a bare CR";
        return MHD_NO;
    }
    if (w->prev_value != NULL && !line_ends_at(w->prev_value, key)) {
        w->bad_key = w->prev_key;
        w->why = HELD_NUL;
        return MHD_NO;
    }
    w->prev_key = key;
    w->prev_value = value;
    return MHD_YES;
}

/* RFC 9112 section 5: no whitespace between a field name and its colon (a MUST reject), no
 * obs-fold, and RFC 9110 section 5.5: no NUL in a value. libmicrohttpd 0.9.75 keeps the first as
 * a name with a space in it, appends a folded line to the name, and cuts a value at its NUL, so
 * "Content-Length : 40" was no length at all (the body then read as the next request, which a
 * proxy reading the length would have forwarded as this one's body), and "X-Session-Id:
 * a<NUL>b" named session a. Checked on MHD's own copy of the header block: each field line
 * lies in the read buffer where it arrived, the name and value where the line put them. */
const char *http_request_bad_field(const struct http_request *r, char *name, size_t name_size) {
    struct field_walk w = {NULL, NULL, NULL, NULL};
    MHD_get_connection_values(r->conn, MHD_HEADER_KIND, check_field, &w);
    if (w.bad_key == NULL && w.prev_value != NULL) {
        /* the last line: its end, then the empty line (each CRLF or LF), then the block's end */
        const union MHD_ConnectionInfo *info =
            MHD_get_connection_info(r->conn, MHD_CONNECTION_INFO_REQUEST_HEADER_SIZE);
        const char *p = w.prev_value + strlen(w.prev_value);
        const char *end = info != NULL ? r->method + info->header_size : NULL;
        bool ok = end != NULL && end >= p + 2 && end <= p + 4;
        for (; ok && p < end; p++) {
            ok = *p == '\0';
        }
        if (!ok) {
            w.bad_key = w.prev_key;
            w.why = HELD_NUL;
        }
    }
    if (w.bad_key != NULL) {
        snprintf(name, name_size, "%s", w.bad_key);
    }
    return w.why;
}

static enum MHD_Result on_access(void *cls, struct MHD_Connection *conn, const char *url,
                                 const char *method, const char *version, const char *upload_data,
                                 size_t *upload_data_size, void **con_cls) {
    struct http_server *s = cls;
    struct http_request *r = *con_cls;
    if (r == NULL) {
        r = request_new(s, conn, url, method, version);
        if (r == NULL) {
            return MHD_NO; /* out of memory: MHD closes the connection */
        }
        *con_cls = r;
        r->is_in_handler = true;
        s->h.on_headers(s->h.ctx, r);
        r->is_in_handler = false;
        return r->is_unanswered ? MHD_NO : flush_pending(r);
    }
    if (r->is_direct || r->is_unanswered || http__conn_is_dropped(r)) {
        return MHD_NO; /* answered around MHD, or dropped: MHD only has to close it */
    }
    if (*upload_data_size > 0) {
        if (!r->is_answered && !r->is_too_large && !r->is_busy && !r->is_over_held) {
            if (r->body.len - r->body_pad + *upload_data_size > s->max_body_bytes) {
                r->is_too_large = true;
                strbuf_release(&r->body);
            } else if (r->held + *upload_data_size > s->max_held_bytes) {
                /* alone past it (a chunked body: a Content-Length is refused at the headers), so
                 * no wait would let it in */
                r->is_over_held = true;
                strbuf_release(&r->body);
            } else if (s->held_bytes + *upload_data_size > s->max_held_bytes) {
                /* bodies and answers held for clients would pass max_held_bytes: this one is
                 * dropped (and answered 503 once it is in), not kept growing */
                r->is_busy = true;
                strbuf_release(&r->body);
            } else {
                s->held_bytes += *upload_data_size;
                r->held += *upload_data_size;
                if (r->body.cap == 0) {
                    reserve_body(r);
                }
                strbuf_append(&r->body, upload_data, *upload_data_size);
            }
        }
        *upload_data_size = 0;
        return MHD_YES;
    }
    if (r->is_answered || r->has_body_handed) {
        return flush_pending(r);
    }
    r->has_body_handed = true;
    if (r->body.data == NULL) {
        strbuf_reserve(&r->body, 0); /* an empty body is "" rather than NULL */
    }
    r->is_in_handler = true;
    s->h.on_request(s->h.ctx, r);
    r->is_in_handler = false;
    if (r->is_unanswered) {
        return MHD_NO;
    }
    if (r->pending != NULL) {
        return flush_pending(r);
    }
    if (r->is_answered && r->is_stream) {
        return MHD_YES;
    }
    /* No answer yet: the engine (or a queue) will make it. */
    MHD_suspend_connection(conn);
    r->is_suspended = true;
    return MHD_YES;
}

static void on_completed(void *cls, struct MHD_Connection *conn, void **con_cls,
                         enum MHD_RequestTerminationCode toe) {
    struct http_server *s = cls;
    struct http_request *r = *con_cls;
    if (r == NULL) {
        return;
    }
    switch (r->is_end_known ? MHD_REQUEST_TERMINATED_COMPLETED_OK : toe) {
    case MHD_REQUEST_TERMINATED_COMPLETED_OK:
        break;
    case MHD_REQUEST_TERMINATED_TIMEOUT_REACHED:
        r->ended = "timeout"; /* a body or an answer that stopped moving */
        break;
    case MHD_REQUEST_TERMINATED_DAEMON_SHUTDOWN:
        r->ended = "shutdown";
        break;
    case MHD_REQUEST_TERMINATED_CLIENT_ABORT:
    case MHD_REQUEST_TERMINATED_READ_ERROR:
        r->ended = "client_closed";
        break;
    default:
        /* libmicrohttpd reads a send that failed on a reset as an error of its own: a client
         * that reset its connection mid-answer is a client gone, as one that resets mid-body */
        r->ended = toe == MHD_REQUEST_TERMINATED_WITH_ERROR && http__conn_is_gone(r)
                       ? "client_closed"
                       : "error";
        break;
    }
    http__conn_request_end(r);
    s->h.on_closed(s->h.ctx, r);
    request_free(r);
    *con_cls = NULL;
}

static void on_mhd_log(void *cls, const char *fmt, va_list ap) {
    char msg[512];
    vsnprintf(msg, sizeof msg, fmt, ap);
    size_t n = strlen(msg);
    while (n > 0 && (msg[n - 1] == '\n' || msg[n - 1] == '\r')) {
        msg[--n] = '\0';
    }
    LOG_DEBUG("http", "libmicrohttpd: %s", msg);
}

static int hex_value(char c) {
    return c >= '0' && c <= '9'   ? c - '0'
           : c >= 'a' && c <= 'f' ? c - 'a' + 10
           : c >= 'A' && c <= 'F' ? c - 'A' + 10
                                  : -1;
}

/* Decodes %HH escapes in the path and query in place, except %00 and %2F: a NUL would end the C
 * string MHD hands on, so "/v1/sessions/ctl%00x" would act on session "ctl", and a decoded slash
 * would split an id into a route. Left as three bytes, each is just an invalid character (400
 * for an id, 404 for a route). */
static size_t unescape_url(void *cls, struct MHD_Connection *c, char *s) {
    char *out = s;
    for (const char *p = s; *p != '\0';) {
        int hi, lo;
        /* %2F stays as it is: an encoded slash is data, not a path separator (RFC 3986 2.2),
         * so /v1/sessions/a%2Fb names the (invalid) id "a%2Fb", not a route below "a" */
        if (p[0] == '%' && (hi = hex_value(p[1])) >= 0 && (lo = hex_value(p[2])) >= 0 &&
            (hi | lo) != 0 && (hi << 4 | lo) != '/') {
            *out++ = (char)(hi << 4 | lo);
            p += 3;
        } else {
            *out++ = *p++;
        }
    }
    *out = '\0';
    return (size_t)(out - s);
}

/* ---- the server ----------------------------------------------------------------------------- */

static int listen_on(const char *host, int32_t port, int32_t *bound_port, char *err,
                     size_t err_size) {
    struct addrinfo hints, *res = NULL;
    memset(&hints, 0, sizeof hints);
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = AI_PASSIVE;
    char port_s[16];
    snprintf(port_s, sizeof port_s, "%d", (int)port);
    int gai = getaddrinfo(host, port_s, &hints, &res);
    if (gai != 0) {
        snprintf(err, err_size, "--host %s: %s", host, gai_strerror(gai));
        return -1;
    }
    int fd = socket(res->ai_family, SOCK_STREAM, 0);
    if (fd < 0) {
        snprintf(err, err_size, "socket: %s", strerror(errno));
        freeaddrinfo(res);
        return -1;
    }
    int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (bind(fd, res->ai_addr, res->ai_addrlen) != 0 || listen(fd, 511) != 0) {
        snprintf(err, err_size, "cannot listen on %s port %d: %s", host, (int)port,
                 strerror(errno));
        close(fd);
        freeaddrinfo(res);
        return -1;
    }
    freeaddrinfo(res);
    struct sockaddr_storage ss;
    socklen_t sl = sizeof ss;
    getsockname(fd, (struct sockaddr *)&ss, &sl);
    *bound_port = ss.ss_family == AF_INET6 ? ntohs(((struct sockaddr_in6 *)&ss)->sin6_port)
                                           : ntohs(((struct sockaddr_in *)&ss)->sin_port);
    fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);
    fcntl(fd, F_SETFD, FD_CLOEXEC);
    return fd;
}

static void on_never(uv_poll_t *h, int status, int events) {
    (void)h, (void)status, (void)events;
}

/* libuv keeps its watchers in a table indexed by descriptor and grows it (a realloc) when a
 * descriptor past its end is first watched, aborting the process when that allocation fails:
 * a connection accepted on a new highest descriptor number while memory was short killed the
 * daemon. Watching, before the loop first runs, a descriptor numbered just below s->fd_ceiling
 * sizes the table for every descriptor the process may hold (it never shrinks). A ceiling the
 * open-file limit does not allow leaves the table to grow as before (logged). */
static void reserve_watchers(struct http_server *s) {
    int32_t fd_ceiling = s->fd_ceiling;
    int fd = fd_ceiling > 1 ? fcntl(s->listen_fd, F_DUPFD_CLOEXEC, fd_ceiling - 1) : -1;
    if (fd < 0 || uv_poll_init(s->loop, &s->sizer, fd) != 0) {
        LOG_WARN("http",
                 "cannot size the loop's watcher table for descriptors below %d req=- "
                 "session=- error=\"%s\"",
                 (int)fd_ceiling, fd < 0 ? strerror(errno) : "uv_poll_init");
        if (fd >= 0) {
            close(fd);
        }
        return;
    }
    s->sizer.data = s;
    s->n_open_handles++;
    uv_poll_start(&s->sizer, UV_READABLE, on_never); /* grows the table; nothing is polled yet */
    uv_close((uv_handle_t *)&s->sizer, http__handle_closed); /* before its descriptor, as always */
    close(fd);
}

static void init_handles(struct http_server *s) {
    const union MHD_DaemonInfo *info = MHD_get_daemon_info(s->daemon, MHD_DAEMON_INFO_EPOLL_FD);
    uv_poll_init(s->loop, &s->poll, info->epoll_fd);
    uv_timer_init(s->loop, &s->timer);
    uv_idle_init(s->loop, &s->spin);
    s->poll.data = s->timer.data = s->spin.data = s;
    s->n_open_handles = 3;
    reserve_watchers(s);
    uv_poll_start(&s->poll, UV_READABLE, on_poll);
    http__conns_start(s);
}

int http_server_create(uv_loop_t *loop, const struct http_params *p, const struct http_handlers *h,
                       struct http_server **out, char *err, size_t err_size) {
    struct http_server *s = calloc(1, sizeof *s);
    if (s == NULL) {
        snprintf(err, err_size, "out of memory");
        return -1;
    }
    s->loop = loop;
    s->h = *h;
    s->max_body_bytes = p->max_body_bytes;
    s->max_held_bytes = p->max_held_bytes > 0 ? p->max_held_bytes : SIZE_MAX;
    s->spin_ns = p->spin_us > 0 ? (uint64_t)p->spin_us * 1000 : 0;
    if (http__conns_create(s, p) != 0) {
        snprintf(err, err_size, "out of memory");
        goto fail;
    }
    s->listen_fd = listen_on(p->host, p->port, &s->port, err, err_size);
    if (s->listen_fd < 0) {
        goto fail;
    }
    /* Idle connections, stalled uploads and clients that stop reading all time out after
     * idle_timeout_s without a byte; MHD never times out a suspended request (one waiting for
     * the engine). MHD's own limit only has to leave room for victims being closed. */
    unsigned flags =
        MHD_USE_EPOLL | MHD_ALLOW_SUSPEND_RESUME | MHD_USE_ERROR_LOG | MHD_USE_NO_LISTEN_SOCKET;
    s->daemon = MHD_start_daemon(
        flags, 0, NULL, NULL, on_access, s, MHD_OPTION_EXTERNAL_LOGGER, on_mhd_log, s,
        MHD_OPTION_NOTIFY_COMPLETED, on_completed, s, MHD_OPTION_NOTIFY_CONNECTION,
        http__conn_notify, s, MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)p->idle_timeout_s,
        MHD_OPTION_CONNECTION_LIMIT, (unsigned)(p->max_connections + HTTP_CONN_SLACK),
        MHD_OPTION_UNESCAPE_CALLBACK, unescape_url, s, MHD_OPTION_URI_LOG_CALLBACK, on_target, s,
        MHD_OPTION_END);
    if (s->daemon == NULL) {
        snprintf(err, err_size, "libmicrohttpd failed to start on %s port %d", p->host,
                 (int)s->port);
        close(s->listen_fd);
        goto fail;
    }
    s->fd_ceiling = p->fd_ceiling;
    init_handles(s);
    run_mhd(s);
    *out = s;
    return 0;
fail:
    http__conns_destroy(s);
    free(s);
    return -1;
}

void http__handle_closed(uv_handle_t *h) {
    struct http_server *s = h->data;
    if (--s->n_open_handles == 0) {
        free(s);
    }
}

void http_server_destroy(struct http_server *s) {
    if (s == NULL) {
        return;
    }
    http_server_quiesce(s);
    http__linger_stop(s); /* and none starts as MHD closes the connections below */
    /* Closed before MHD closes its epoll descriptor (see http__conns_stop_accepting). */
    uv_close((uv_handle_t *)&s->poll, http__handle_closed);
    uv_timer_stop(&s->timer);
    uv_idle_stop(&s->spin);
    /* Closes every connection; each CLOSED notice closes its watch. */
    MHD_stop_daemon(s->daemon);
    http__conns_destroy(s);
    uv_close((uv_handle_t *)&s->timer, http__handle_closed);
    uv_close((uv_handle_t *)&s->spin, http__handle_closed);
    http__conns_close(s, http__handle_closed);
}

int32_t http_server_port(const struct http_server *s) {
    return s->port;
}

void http_server_quiesce(struct http_server *s) {
    http__conns_stop_accepting(s, http__handle_closed);
}

int32_t http_server_n_requests(const struct http_server *s) {
    return s->n_requests;
}

/* ---- request accessors ---------------------------------------------------------------------- */

uint64_t http_request_id(const struct http_request *r) {
    return r->id;
}

const char *http_request_method(const struct http_request *r) {
    return r->method;
}

const char *http_request_path(const struct http_request *r) {
    return r->path;
}

const char *http_request_version(const struct http_request *r) {
    return r->version;
}

const char *http_request_header(const struct http_request *r, const char *name) {
    return MHD_lookup_connection_value(r->conn, MHD_HEADER_KIND, name);
}

/* MHD's query arguments, to the caller's function; MHD_NO stops at the first it refuses. */
struct query_visit {
    bool (*fn)(void *ctx, const char *name, const char *value);
    void *ctx;
};

static enum MHD_Result visit_query(void *cls, enum MHD_ValueKind kind, const char *key,
                                   const char *value) {
    struct query_visit *v = cls;
    return v->fn(v->ctx, key != NULL ? key : "", value != NULL ? value : "") ? MHD_YES : MHD_NO;
}

void http_request_queries(const struct http_request *r,
                          bool (*fn)(void *ctx, const char *name, const char *value), void *ctx) {
    struct query_visit v = {fn, ctx};
    MHD_get_connection_values(r->conn, MHD_GET_ARGUMENT_KIND, visit_query, &v);
}

struct header_count {
    const char *name;
    int32_t n;
};

static enum MHD_Result count_header(void *cls, enum MHD_ValueKind kind, const char *key,
                                    const char *value) {
    struct header_count *hc = cls;
    hc->n += key != NULL && strcasecmp(key, hc->name) == 0;
    return MHD_YES;
}

int32_t http_request_header_count(const struct http_request *r, const char *name) {
    struct header_count hc = {name, 0};
    MHD_get_connection_values(r->conn, MHD_HEADER_KIND, count_header, &hc);
    return hc.n;
}

const char *http_request_body(const struct http_request *r, size_t *len) {
    if (r->body.data == NULL) {
        *len = 0;
        return "";
    }
    *len = r->body.len - r->body_pad;
    return r->body.data + r->body_pad;
}

const char *http_request_take_body(struct http_request *r, size_t *len, char **block) {
    const char *body = http_request_body(r, len);
    *block = r->body.data; /* NULL for an empty body, whose "" is static */
    strbuf_init(&r->body);
    r->body_pad = 0;
    return body;
}

bool http_request_body_too_large(const struct http_request *r) {
    return r->is_too_large;
}

size_t http_server_held_bytes(const struct http_server *s) {
    return s->held_bytes;
}

bool http_request_is_busy(const struct http_request *r) {
    return r->is_busy;
}

bool http_request_body_over_held(const struct http_request *r) {
    return r->is_over_held;
}

bool http_request_body_failed(const struct http_request *r) {
    return r->body.has_failed;
}

bool http_request_may_hold(const struct http_request *r, size_t len) {
    const struct http_server *s = r->srv;
    return len <= HELD_SMALL || s->held_bytes + len <= s->max_held_bytes;
}

/* Counts an answer of len bytes as held until the request ends. */
static void hold(struct http_request *r, size_t len) {
    r->srv->held_bytes += len;
    r->held += len;
}

double http_request_start_ms(const struct http_request *r) {
    return r->start_ms;
}

const char *http_request_ended(const struct http_request *r) {
    return r->ended;
}

void http_request_set_user(struct http_request *r, void *user) {
    r->user = user;
}

void *http_request_user(const struct http_request *r) {
    return r->user;
}

bool http_request_is_answered(const struct http_request *r) {
    return r->is_answered;
}

void http_request_add_header(struct http_request *r, const char *name, const char *value) {
    struct header *h = calloc(1, sizeof *h);
    if (h == NULL) {
        return;
    }
    h->name = strdup(name);
    h->value = strdup(value);
    if (h->name == NULL || h->value == NULL) {
        free(h->name);
        free(h->value);
        free(h);
        return;
    }
    h->next = r->headers;
    r->headers = h;
}

bool http_request_peer_closed(const struct http_request *r) {
    return http__conn_is_gone(r);
}
