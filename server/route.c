/* server/route.c: routing, authentication, one handler per endpoint, and the request's life
 * (see route.h). Requests that need the engine or a session's turn become jobs (job.c); the rest
 * are answered here at once, on the loop thread, which is why health, readiness and metrics
 * never wait behind engine work.
 */
#include "route.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "error.h"
#include "job.h"
#include "log.h"
#include "snapshot.h"
#include "spill.h"
#include "utf8.h"
#include "ui.h"

#define JSON_TYPE    "application/json"
#define METRICS_TYPE "text/plain; version=0.0.4; charset=utf-8"

enum route_kind {
    ROUTE_NONE = 0,
    ROUTE_ATTEND,
    ROUTE_SDPA,
    ROUTE_SESSIONS,
    ROUTE_SESSION,
    ROUTE_TRUNCATE,
    ROUTE_FORK,
    ROUTE_EXPORT,
    ROUTE_KV_ATTEND,
    ROUTE_MODEL,
    ROUTE_HEALTHZ,
    ROUTE_READYZ,
    ROUTE_METRICS,
    ROUTE_UI,
    ROUTE_ATTENTION,
};

/* What a route does with a query string. */
enum query_rule {
    QUERY_REFUSED, /* an API route that takes none: any argument is a 400, never ignored */
    QUERY_OWN,     /* its handler reads and checks them (the attention route) */
    QUERY_IGNORED, /* probes and the page: /ui keeps its state there for the browser */
};

struct route_entry {
    enum route_kind kind;
    enum metrics_endpoint endpoint;
    const char *allow; /* the methods, as the Allow header lists them */
    bool needs_auth;
    enum query_rule query;
};

/* RFC 9110 section 9.1: HEAD wherever GET is. It runs as GET does (a handler that is not PUT or
 * DELETE answers as GET); libmicrohttpd sends the headers only. */
static const struct route_entry entries[] = {
    {ROUTE_NONE, METRICS_ENDPOINT_OTHER, "", false, QUERY_IGNORED},
    {ROUTE_ATTEND, METRICS_ENDPOINT_ATTEND, "POST", true, QUERY_REFUSED},
    {ROUTE_SDPA, METRICS_ENDPOINT_SDPA, "POST", true, QUERY_REFUSED},
    {ROUTE_SESSIONS, METRICS_ENDPOINT_SESSIONS, "GET, HEAD", true, QUERY_REFUSED},
    {ROUTE_SESSION, METRICS_ENDPOINT_SESSION, "GET, HEAD, PUT, DELETE", true, QUERY_REFUSED},
    {ROUTE_TRUNCATE, METRICS_ENDPOINT_TRUNCATE, "POST", true, QUERY_REFUSED},
    {ROUTE_FORK, METRICS_ENDPOINT_FORK, "POST", true, QUERY_REFUSED},
    {ROUTE_EXPORT, METRICS_ENDPOINT_EXPORT, "GET, HEAD", true, QUERY_REFUSED},
    {ROUTE_KV_ATTEND, METRICS_ENDPOINT_KV_ATTEND, "POST", true, QUERY_REFUSED},
    {ROUTE_MODEL, METRICS_ENDPOINT_MODEL, "GET, HEAD", true, QUERY_REFUSED},
    {ROUTE_HEALTHZ, METRICS_ENDPOINT_HEALTHZ, "GET, HEAD", false, QUERY_IGNORED},
    {ROUTE_READYZ, METRICS_ENDPOINT_READYZ, "GET, HEAD", false, QUERY_IGNORED},
    {ROUTE_METRICS, METRICS_ENDPOINT_METRICS, "GET, HEAD", false, QUERY_IGNORED},
    /* the page needs no key: its API calls carry it */
    {ROUTE_UI, METRICS_ENDPOINT_OTHER, "GET, HEAD", false, QUERY_IGNORED},
    {ROUTE_ATTENTION, METRICS_ENDPOINT_ATTENTION, "GET, HEAD", true, QUERY_OWN},
};

/* ---- replies -------------------------------------------------------------------------------- */

static int64_t now_ms(void) {
    return (int64_t)(uv_hrtime() / 1000000);
}

/* Starts answering rq with status and a body of len bytes (has_body: any at all): false when it
 * was answered already, or when its answer may be dropped and would pass --max-held-mb (it is
 * answered 503 server_busy then); the caller frees the body either way. */
static bool answer_begins(struct route_req *rq, int status, bool has_body, size_t len) {
    if (rq->status != 0) {
        return false;
    }
    if (has_body && rq->is_answer_droppable && !http_request_may_hold(rq->http, len)) {
        if (len > (size_t)rq->srv->cfg->max_held_mb << 20) {
            /* alone past the limit: a retry would meet it again, so no 503 */
            char msg[192];
            snprintf(msg, sizeof msg,
                     "the answer of %zu bytes is larger than --max-held-mb %lld MiB lets the "
                     "server hold at once",
                     len, (long long)rq->srv->cfg->max_held_mb);
            route_reply_error(rq, ERROR_INTERNAL, msg, NULL);
            return false;
        }
        /* answers unread by their clients hold --max-held-mb already */
        route_reply_error(rq, ERROR_SERVER_BUSY, NULL, NULL);
        return false;
    }
    rq->status = status;
    if (rq->srv->is_draining) {
        http_request_add_header(rq->http, "Connection", "close");
    }
    return true;
}

void route_reply_typed(struct route_req *rq, int status, const char *type, char *body, size_t len) {
    if (!answer_begins(rq, status, body != NULL, len)) {
        free(body);
        return;
    }
    http_request_reply(rq->http, status, body != NULL ? type : NULL, body, len);
}

void route_reply_parts(struct route_req *rq, int status, const char *type,
                       const struct http_part *parts, int n_parts, void (*release)(void *),
                       void *owner) {
    size_t total = 0;
    for (int i = 0; i < n_parts; i++) {
        total += parts[i].len;
    }
    if (!answer_begins(rq, status, true, total)) {
        release(owner);
        return;
    }
    http_request_reply_parts(rq->http, status, type, parts, n_parts, release, owner);
}

void route_reply(struct route_req *rq, int status, char *body, size_t len) {
    route_reply_typed(rq, status, JSON_TYPE, body, len);
}

struct session *route_find_session(struct server *srv, const char *id, enum session_state *state,
                                   int *rc) {
    struct session *s = session_find(srv->sessions, id, state);
    *rc = s != NULL                           ? 0
          : *state == SESSION_STATE_TOMBSTONE ? session_gone_code(srv->sessions, id)
                                              : ERROR_SESSION_NOT_FOUND;
    if (s == NULL && *state == SESSION_STATE_ON_DISK && srv->spill != NULL) {
        *rc = spill_restore(srv->spill, id, &s);
        *state = *rc == 0 ? SESSION_STATE_LIVE : *state;
    }
    return s;
}

void route_reply_error(struct route_req *rq, int code, const char *message, const char *param) {
    if (rq->status != 0) {
        return;
    }
    const struct error_info *e = error_info_get(code);
    switch (e->http_status) {
    case 401:
        http_request_add_header(rq->http, "WWW-Authenticate", "Bearer");
        break;
    case 405:
        http_request_add_header(rq->http, "Allow", entries[rq->kind].allow);
        break;
    case 429:
    case 503:
        http_request_add_header(rq->http, "Retry-After", "1");
        break;
    default:
        break;
    }
    /* An engine code's own text says more than the generic message of its table row. */
    if ((message == NULL || message[0] == '\0') && code < 0 && code > -100) {
        message = attn_strerror(code);
    }
    rq->error_name = e->name;
    size_t len = 0;
    char *body = api_error_encode(code, message, param, &len);
    route_reply(rq, e->http_status, body, len);
}

void route_stream_begin(struct route_req *rq) {
    if (rq->status != 0) {
        return;
    }
    rq->status = 200;
    http_request_stream_begin(rq->http, 200, "text/event-stream");
}

/* ---- routing -------------------------------------------------------------------------------- */

/* Matches the path; for /v1/sessions/{id}... copies the id segment (possibly invalid) into id. */
static enum route_kind match(const char *path, char *id, size_t id_size, bool *is_id_valid) {
    static const struct {
        const char *path;
        enum route_kind kind;
    } fixed[] = {
        {"/v1/attend", ROUTE_ATTEND},
        {"/v1/sdpa", ROUTE_SDPA},
        {"/v1/sessions", ROUTE_SESSIONS},
        {"/v1/model", ROUTE_MODEL},
        {"/healthz", ROUTE_HEALTHZ},
        {"/readyz", ROUTE_READYZ},
        {"/metrics", ROUTE_METRICS},
        {"/v1/kv/attend", ROUTE_KV_ATTEND},
        {"/ui", ROUTE_UI},
    };
    for (size_t i = 0; i < sizeof fixed / sizeof fixed[0]; i++) {
        if (strcmp(path, fixed[i].path) == 0) {
            return fixed[i].kind;
        }
    }
    const char *prefix = "/v1/sessions/";
    size_t pl = strlen(prefix);
    if (strncmp(path, prefix, pl) != 0) {
        return ROUTE_NONE;
    }
    const char *seg = path + pl;
    const char *slash = strchr(seg, '/');
    size_t n = slash != NULL ? (size_t)(slash - seg) : strlen(seg);
    enum route_kind kind = ROUTE_SESSION;
    if (slash != NULL) {
        if (strcmp(slash, "/truncate") == 0) {
            kind = ROUTE_TRUNCATE;
        } else if (strcmp(slash, "/fork") == 0) {
            kind = ROUTE_FORK;
        } else if (strcmp(slash, "/export") == 0) {
            kind = ROUTE_EXPORT;
        } else if (strcmp(slash, "/attention") == 0) {
            kind = ROUTE_ATTENTION;
        } else {
            return ROUTE_NONE;
        }
    }
    if (n == 0) {
        return ROUTE_NONE;
    }
    *is_id_valid = api_session_id_is_valid(seg, n);
    size_t kept = n < id_size - 1 ? n : id_size - 1; /* memcpy, not printf, per request */
    memcpy(id, seg, kept);
    id[kept] = '\0';
    return kind;
}

static bool method_allowed(enum route_kind kind, const char *method) {
    const char *allow = entries[kind].allow;
    size_t n = strlen(method);
    for (const char *p = allow; (p = strstr(p, method)) != NULL; p += n) {
        bool starts = p == allow || p[-1] == ' ';
        bool ends = p[n] == '\0' || p[n] == ',';
        if (starts && ends) {
            return true;
        }
    }
    return false;
}

/* credentials = auth-scheme [ 1*SP token68 ] (RFC 9110 section 11.4): the scheme is
 * case-insensitive and may be followed by more than one space. The key is compared in constant
 * time, so that response timing does not reveal it. */
static bool key_matches(const char *header, const char *key) {
    static const char bearer[] = "Bearer";
    size_t bl = sizeof bearer - 1;
    if (header == NULL || strncasecmp(header, bearer, bl) != 0 || header[bl] != ' ') {
        return false;
    }
    const char *given = header + bl;
    while (*given == ' ') {
        given++;
    }
    size_t gl = strlen(given), kl = strlen(key);
    while (gl > 0 && (given[gl - 1] == ' ' || given[gl - 1] == '\t')) {
        gl--; /* optional whitespace around a field value is not part of it (section 5.5) */
    }
    unsigned diff = (unsigned)(gl != kl);
    for (size_t i = 0; i < kl; i++) {
        diff |= (unsigned)(unsigned char)key[i] ^ (unsigned)(unsigned char)given[i < gl ? i : 0];
    }
    return diff == 0;
}

/* ---- endpoints answered at once ------------------------------------------------------------- */

static void handle_status(struct route_req *rq, const char *status) {
    size_t len = 0;
    char *body = api_status_encode(status, &len);
    route_reply(rq, 200, body, len);
}

/* The heatmap page (ui.h). The policy keeps it to its inline script and style and to this
 * server's API. */
static void handle_ui(struct route_req *rq) {
    size_t len = 0;
    const char *page = ui_page(&len);
    char *body = malloc(len);
    if (body == NULL) {
        route_reply_error(rq, ERROR_INTERNAL, "out of memory", NULL);
        return;
    }
    memcpy(body, page, len);
    http_request_add_header(rq->http, "Content-Security-Policy",
                            "default-src 'none'; script-src 'unsafe-inline'; style-src "
                            "'unsafe-inline'; connect-src 'self'; base-uri 'none'; "
                            "form-action 'none'; frame-ancestors 'none'");
    route_reply_typed(rq, 200, "text/html; charset=utf-8", body, len);
}

static void handle_metrics(struct route_req *rq) {
    struct server *srv = rq->srv;
    struct session_store_stats st;
    session_store_get_stats(srv->sessions, &st);
    struct team_stats ts = {0, 0, 0};
    if (srv->team != NULL) {
        team_get_stats(srv->team, &ts);
    }
    struct metrics_gauges g = {
        .evictions = {st.evictions[SESSION_EVICT_BUDGET], st.evictions[SESSION_EVICT_MAX_SESSIONS],
                      st.evictions[SESSION_EVICT_TTL]},
        .engine_steps = pool_engine_steps(srv->pool),
        .batched_steps = pool_batched_steps(srv->pool),
        .inline_steps = pool_inline_steps(srv->pool),
        .sessions = st.n_sessions,
        .kv_bytes_used = st.bytes_used,
        .kv_bytes_limit = st.bytes_limit,
        .queue_depth = pool_queue_depth(srv->pool),
        .jobs_in_flight = pool_n_running(srv->pool),
        .workers = srv->cfg->workers,
        .threads = srv->cfg->threads,
        .team_tasks = ts.tasks,
        .team_helped = ts.helped_tasks,
        .connections = http_server_n_connections(srv->http),
        .connections_refused = http_server_n_refused(srv->http),
        .connections_reclaimed = http_server_n_reclaimed(srv->http),
        .held_bytes = http_server_held_bytes(srv->http),
        .held_bytes_limit = (uint64_t)srv->cfg->max_held_mb << 20,
        .draining = srv->is_draining,
    };
    struct metrics_disk disk;
    if (srv->spill != NULL) {
        spill_get_metrics(srv->spill, &disk);
        g.disk = &disk;
    }
    struct strbuf b;
    strbuf_init(&b);
    metrics_render(&srv->metrics, &g, &b);
    size_t len = 0;
    char *body = strbuf_detach(&b, &len);
    if (body == NULL) {
        route_reply_error(rq, ERROR_INTERNAL, "out of memory", NULL);
        return;
    }
    rq->status = 200;
    http_request_reply(rq->http, 200, METRICS_TYPE, body, len);
}

static void handle_model(struct route_req *rq) {
    struct server *srv = rq->srv;
    struct api_model_info info = {
        .source = srv->model_source,
        .family = attn_model_family(srv->model),
        .layer_first = attn_model_layer_first(srv->model),
        .layer_count = attn_model_layer_count(srv->model),
        .weights_bytes = attn_model_bytes(srv->model),
        .weights_dtype = attn_dtype_name(attn_model_weights_dtype(srv->model)),
    };
    struct session_store_stats st;
    session_store_get_stats(srv->sessions, &st);
    info.kv_dtype = attn_dtype_name(st.kv_dtype);
    uint8_t fp[ATTN_FINGERPRINT_BYTES];
    char hex[SNAPSHOT_FINGERPRINT_HEX];
    attn_model_fingerprint(srv->model, fp);
    snapshot_fingerprint_hex(fp, hex);
    info.fingerprint = hex;
    info.kv_bytes_per_token = st.block_bytes / (size_t)st.block_tokens;
    size_t len = 0;
    char *body = api_model_encode(attn_model_config(srv->model), &info, &len);
    route_reply(rq, 200, body, len);
}

/* Fills *out (layers malloc'd into *layers) for session s; own_pins of its pins belong to the
 * request being answered and are not "pending". */
static int describe(struct session *s, int32_t own_pins, int64_t now, struct api_session *out,
                    struct api_session_layer **layers) {
    /* a session being read back is described as its file says until the read ends: its caches
     * may be in the pool before the file's checksum has answered */
    bool in_file = session_is_on_disk(s) || session_is_restoring(s);
    int32_t n = in_file ? 0 : session_n_layers_used(s);
    *layers = calloc((size_t)(n > 0 ? n : 1), sizeof **layers);
    if (*layers == NULL) {
        return -1;
    }
    for (int32_t i = 0; i < n; i++) {
        struct session_layer_stat st;
        session_layer_at(s, i, &st);
        (*layers)[i] = (struct api_session_layer){
            st.layer, st.n_tokens, st.n_held, st.window, st.context_tokens, st.bytes, st.is_linear};
    }
    out->session_id = session_id(s);
    out->n_tokens = session_n_tokens(s);
    out->bytes = session_bytes(s);
    out->idle_ms = session_idle_ms(s, now);
    out->pending = session_pins(s) - own_pins;
    out->location = "memory";
    out->layers = *layers;
    out->n_layers = n;
    if (in_file) {
        out->location = "disk";
        out->n_tokens = session_disk_tokens(s);
        out->bytes = session_disk_bytes(s);
        out->pending = session_is_on_disk(s) ? 0 : out->pending;
    }
    return 0;
}

char *route_session_encode(struct session *s, int32_t own_pins, size_t *len) {
    struct api_session as;
    struct api_session_layer *layers;
    if (describe(s, own_pins, now_ms(), &as, &layers) != 0) {
        return NULL;
    }
    char *body = api_session_encode(&as, len);
    free(layers);
    return body;
}

static void handle_sessions(struct route_req *rq) {
    struct server *srv = rq->srv;
    struct session_store_stats st;
    session_store_get_stats(srv->sessions, &st);
    size_t n_all = (size_t)st.n_sessions + (size_t)st.n_on_disk;
    struct api_session *all = calloc(n_all + 1, sizeof *all);
    struct api_session_layer **layers = calloc(n_all + 1, sizeof *layers);
    int32_t n = 0;
    char *body = NULL;
    size_t len = 0;
    if (all != NULL && layers != NULL) {
        int64_t now = now_ms();
        for (int on_disk = 0; on_disk < 2; on_disk++) {
            struct session *s = on_disk ? session_store_first_on_disk(srv->sessions)
                                        : session_store_first(srv->sessions);
            for (; s != NULL && n < st.n_sessions + st.n_on_disk; s = session_next(s)) {
                if (describe(s, 0, now, &all[n], &layers[n]) != 0) {
                    break;
                }
                n++;
            }
        }
        struct api_pool pool = {
            .bytes_used = st.bytes_used,
            .bytes_limit = st.bytes_limit,
            .block_tokens = st.block_tokens,
            .blocks_used = st.blocks_used,
            .blocks_total = st.blocks_total,
            .dtype = attn_dtype_name(st.kv_dtype),
        };
        if (n == st.n_sessions + st.n_on_disk) {
            body = api_session_list_encode(all, n, &pool, &len);
        }
    }
    for (int32_t i = 0; i < n; i++) {
        free(layers[i]);
    }
    free(layers);
    free(all);
    if (body == NULL) {
        route_reply_error(rq, ERROR_INTERNAL, "out of memory", NULL);
        return;
    }
    route_reply(rq, 200, body, len);
}

/* The session named by the path, in memory or on disk (described where it is, not brought
 * back), or an answer (404 / 410) and NULL. */
static struct session *path_session(struct route_req *rq) {
    enum session_state state;
    session_find(rq->srv->sessions, rq->session, &state);
    struct session *s = session_lookup(rq->srv->sessions, rq->session);
    if (s == NULL) {
        route_reply_error(rq,
                          state == SESSION_STATE_TOMBSTONE
                              ? session_gone_code(rq->srv->sessions, rq->session)
                              : ERROR_SESSION_NOT_FOUND,
                          NULL, "session_id");
    }
    return s;
}

/* A DELETE of a session on disk, answered once its file is gone, so that a process killed just
 * after the 204 cannot bring the session back at its next start (found by an outside audit: 2 in
 * 10 SIGKILLs right after the answer did). The request may end first (its client gone): then
 * nobody is answered. */
struct disk_delete {
    struct route_req *rq; /* NULL once the request ended */
};

static void disk_deleted(void *ctx, int status) {
    struct disk_delete *dd = ctx;
    if (dd->rq != NULL) {
        dd->rq->disk_delete = NULL;
        if (status == 0) {
            route_reply(dd->rq, 204, NULL, 0);
        } else {
            /* the session stays on disk (session_disk_delete): not deleted */
            char msg[160];
            snprintf(msg, sizeof msg, "the session's file could not be removed (%s): it stays",
                     strerror(-status));
            route_reply_error(dd->rq, ERROR_INTERNAL, msg, "session_id");
        }
    }
    free(dd);
}

static void delete_on_disk(struct route_req *rq) {
    struct disk_delete *dd = malloc(sizeof *dd);
    if (dd == NULL) {
        route_reply_error(rq, ERROR_INTERNAL, "out of memory", NULL);
        return;
    }
    dd->rq = rq;
    rq->disk_delete = dd;
    /* no need to read it back; disk_deleted answers (perhaps right away) */
    int rc = session_disk_delete(rq->srv->sessions, rq->session, disk_deleted, dd);
    if (rc != 0) {
        rq->disk_delete = NULL;
        free(dd);
        route_reply_error(rq, rc, rc == ERROR_SESSION_NOT_FOUND ? NULL : "out of memory",
                          "session_id");
    }
}

static void handle_session(struct route_req *rq, const char *method) {
    if (strcmp(method, "PUT") == 0) {
        job_submit_import(rq);
        return;
    }
    if (strcmp(method, "DELETE") == 0) {
        enum session_state state;
        struct session *s = session_find(rq->srv->sessions, rq->session, &state);
        if (s == NULL && state == SESSION_STATE_TOMBSTONE) {
            session_tombstone_forget(rq->srv->sessions, rq->session);
            route_reply(rq, 204, NULL, 0);
            return;
        }
        if (s == NULL && state == SESSION_STATE_ON_DISK) {
            delete_on_disk(rq);
            return;
        }
        if (s == NULL) {
            route_reply_error(rq, ERROR_SESSION_NOT_FOUND, NULL, "session_id");
            return;
        }
        job_submit_delete(rq, s);
        return;
    }
    struct session *s = path_session(rq);
    if (s == NULL) {
        return;
    }
    size_t len = 0;
    char *body = route_session_encode(s, 0, &len);
    if (body == NULL) {
        route_reply_error(rq, ERROR_INTERNAL, "out of memory", NULL);
        return;
    }
    route_reply(rq, 200, body, len);
}

/* ---- HTTP handlers -------------------------------------------------------------------------- */

/* A query argument on a route that takes none: ignoring it would answer as if the client had
 * not asked (POST /v1/attend?stream=true, GET /v1/sessions?limit=10), so it is refused by name. */
static bool refuse_query(void *ctx, const char *name, const char *value) {
    (void)value;
    struct route_req *rq = ctx;
    char shown[64], msg[160];
    snprintf(shown, sizeof shown, "%s", name);
    utf8_trim_partial(shown);
    snprintf(msg, sizeof msg, "unknown query parameter '%s': %s takes none", shown,
             http_request_path(rq->http));
    route_reply_error(rq, ERROR_INVALID_REQUEST, msg, shown);
    return false;
}

static void on_headers(void *ctx, struct http_request *req) {
    struct server *srv = ctx;
    struct route_req *rq = calloc(1, sizeof *rq);
    if (rq == NULL) {
        /* an Error body as every error has (it was empty); none if even that cannot be made */
        size_t len = 0;
        char *body = api_error_encode(ERROR_INTERNAL, "out of memory", NULL, &len);
        http_request_reply(req, 500, body != NULL ? JSON_TYPE : NULL, body, body != NULL ? len : 0);
        return;
    }
    rq->srv = srv;
    rq->http = req;
    http_request_set_user(req, rq);
    bool is_id_valid = true;
    rq->kind = match(http_request_path(req), rq->session, sizeof rq->session, &is_id_valid);
    const char *method = http_request_method(req);
    const struct route_entry *e = &entries[rq->kind];
    /* A NUL byte in the request target: MHD hands the path over as a C string, cut at it, so
     * /v1/sessions/a<NUL>b would act on session a. */
    if (http_request_target_has_nul(req)) {
        http_request_add_header(req, "Connection", "close");
        route_reply_error(rq, ERROR_INVALID_REQUEST, "the request target holds a NUL byte", NULL);
        return;
    }
    /* So is the method: "DELETE<NUL>x", a method no route has, ran as DELETE. */
    if (http_request_method_has_nul(req)) {
        http_request_add_header(req, "Connection", "close");
        route_reply_error(rq, ERROR_INVALID_REQUEST, "the method holds a NUL byte", NULL);
        return;
    }
    if (http_request_query_cut(req)) {
        route_reply_error(rq, ERROR_INVALID_REQUEST,
                          "the query has more arguments than any route reads (128), or than fit "
                          "beside its target in the request's buffer",
                          NULL);
        return;
    }
    /* A field line two readers could take apart differently (whitespace before the colon, a
     * line folded onto the next, a NUL in the value): refused, and the connection closed, since
     * where its body ends is not known either. */
    char field[128];
    const char *why = http_request_bad_field(req, field, sizeof field);
    if (why != NULL) {
        char msg[256];
        utf8_trim_partial(field);
        snprintf(msg, sizeof msg, "a header field%s%s%s %s", field[0] ? " (" : "", field,
                 field[0] ? ")" : "", why);
        http_request_add_header(req, "Connection", "close");
        route_reply_error(rq, ERROR_INVALID_REQUEST, msg, field[0] ? field : NULL);
        return;
    }
    /* RFC 9112 section 3.2: an HTTP/1.1 request without Host, or with several, is a 400. */
    int32_t n_host = http_request_header_count(req, "Host");
    if (n_host > 1 || (n_host == 0 && strcmp(http_request_version(req), "HTTP/1.1") == 0)) {
        route_reply_error(rq, ERROR_INVALID_REQUEST,
                          n_host > 1 ? "more than one Host header"
                                     : "an HTTP/1.1 request needs a Host header",
                          "Host");
        return;
    }
    /* RFC 9112 section 6.1: libmicrohttpd decodes the chunked coding alone; with any other the
     * body's length is unknown, and it would wait for the idle timeout. */
    const char *te = http_request_header(req, "Transfer-Encoding");
    if (te != NULL && strcasecmp(te, "chunked") != 0) {
        route_reply_error(rq, ERROR_INVALID_REQUEST,
                          "Transfer-Encoding: only chunked is understood (no other coding)",
                          "Transfer-Encoding");
        return;
    }
    /* Two fields are one list (RFC 9110 section 5.3): "chunked" then "identity" is the coding
     * list "chunked, identity", refused above as one field; libmicrohttpd reads the first. */
    if (te != NULL && http_request_header_count(req, "Transfer-Encoding") > 1) {
        route_reply_error(rq, ERROR_INVALID_REQUEST, "more than one Transfer-Encoding header",
                          "Transfer-Encoding");
        return;
    }
    /* RFC 9112 section 6.1: an HTTP/1.0 message with Transfer-Encoding MUST be taken as
     * faultily framed and its connection closed (a 1.0 hop before attnd knows no chunks, and may
     * hold part of this body as the next request); libmicrohttpd decoded the chunks and kept the
     * connection alive. */
    if (te != NULL && strcmp(http_request_version(req), "HTTP/1.1") != 0) {
        http_request_add_header(req, "Connection", "close");
        route_reply_error(rq, ERROR_INVALID_REQUEST,
                          "Transfer-Encoding in an HTTP/1.0 request: its framing is not known",
                          "Transfer-Encoding");
        return;
    }
    /* RFC 9112 section 6.3: two Content-Lengths, or one beside Transfer-Encoding, leave where
     * the body ends to whoever reads it (a proxy one way, attnd the other: a request smuggled
     * in the body). Refused, and the connection closed, since its next bytes cannot be framed. */
    if (http_request_header_count(req, "Content-Length") > 1 ||
        (te != NULL && http_request_header(req, "Content-Length") != NULL)) {
        http_request_add_header(req, "Connection", "close");
        route_reply_error(rq, ERROR_INVALID_REQUEST,
                          te != NULL ? "Content-Length beside Transfer-Encoding"
                                     : "more than one Content-Length header",
                          "Content-Length");
        return;
    }
    /* Headers that decide what a request means: two copies could be read either way (by a
     * proxy one, by attnd the other), so neither is. */
    static const char *const once[] = {"X-Session-Id", "Inference-Header-Content-Length",
                                       "Authorization"};
    for (size_t i = 0; i < sizeof once / sizeof once[0]; i++) {
        if (http_request_header_count(req, once[i]) > 1) {
            char msg[96];
            snprintf(msg, sizeof msg, "more than one %s header", once[i]);
            route_reply_error(rq, ERROR_INVALID_REQUEST, msg, once[i]);
            return;
        }
    }
    /* every /v1/ path needs the key, a route or not: without it, 404s would map the API */
    bool needs_auth = e->needs_auth ||
                      (rq->kind == ROUTE_NONE && strncmp(http_request_path(req), "/v1/", 4) == 0);
    if (needs_auth && srv->cfg->api_key[0] != '\0' &&
        !key_matches(http_request_header(req, "Authorization"), srv->cfg->api_key)) {
        route_reply_error(rq, ERROR_UNAUTHORIZED, NULL, "Authorization");
        return;
    }
    if (rq->kind == ROUTE_NONE) {
        route_reply_error(rq, ERROR_NOT_FOUND, NULL, NULL);
        return;
    }
    if (!method_allowed(rq->kind, method)) {
        char msg[128];
        snprintf(msg, sizeof msg, "%s is not allowed here; allowed: %s", method, e->allow);
        route_reply_error(rq, ERROR_METHOD_NOT_ALLOWED, msg, NULL);
        return;
    }
    if (srv->is_draining && rq->kind != ROUTE_HEALTHZ && rq->kind != ROUTE_METRICS) {
        route_reply_error(rq, ERROR_DRAINING, NULL, NULL);
        return;
    }
    const char *cl = http_request_header(req, "Content-Length");
    if (cl != NULL) {
        errno = 0;
        char *end;
        unsigned long long n = strtoull(cl, &end, 10);
        if (errno == 0 && *end == '\0' && n > (unsigned long long)srv->cfg->max_body_mb << 20) {
            char msg[128];
            snprintf(msg, sizeof msg, "request body of %llu bytes is over --max-body-mb %lld MiB",
                     n, (long long)srv->cfg->max_body_mb);
            route_reply_error(rq, ERROR_PAYLOAD_TOO_LARGE, msg, NULL);
            return;
        }
        if (errno == 0 && *end == '\0' && n > (unsigned long long)srv->cfg->max_held_mb << 20) {
            /* alone past what may be held at once: a 503 would send the client back forever */
            char msg[160];
            snprintf(msg, sizeof msg,
                     "request body of %llu bytes is over --max-held-mb %lld MiB, the bodies and "
                     "answers the server holds at once",
                     n, (long long)srv->cfg->max_held_mb);
            route_reply_error(rq, ERROR_PAYLOAD_TOO_LARGE, msg, NULL);
            return;
        }
    }
    if (!is_id_valid) {
        route_reply_error(rq, ERROR_INVALID_REQUEST,
                          "the session id in the path must be 1 to 128 characters from "
                          "[A-Za-z0-9._:-]",
                          "session_id");
        return;
    }
    if (e->query == QUERY_REFUSED) {
        http_request_queries(req, refuse_query, rq); /* answers at the first argument */
    }
}

static void on_request(void *ctx, struct http_request *req) {
    struct route_req *rq = http_request_user(req);
    if (rq == NULL || rq->status != 0) {
        return;
    }
    if (http_request_body_too_large(req)) {
        route_reply_error(rq, ERROR_PAYLOAD_TOO_LARGE, NULL, NULL);
        return;
    }
    if (http_request_body_over_held(req)) {
        char msg[128];
        snprintf(msg, sizeof msg,
                 "request body is over --max-held-mb %lld MiB, the bodies and answers the server "
                 "holds at once",
                 (long long)rq->srv->cfg->max_held_mb);
        route_reply_error(rq, ERROR_PAYLOAD_TOO_LARGE, msg, NULL);
        return;
    }
    if (http_request_is_busy(req)) {
        route_reply_error(rq, ERROR_SERVER_BUSY, NULL, NULL);
        return;
    }
    if (http_request_body_failed(req)) {
        /* the body's buffer could not grow: what it holds is not the body the client sent, and
         * parsed it was answered 400 (found by an outside audit with a fault injector) */
        route_reply_error(rq, ERROR_INTERNAL, "out of memory receiving the request body", NULL);
        return;
    }
    rq->is_answer_droppable =
        rq->kind == ROUTE_EXPORT || rq->kind == ROUTE_ATTENTION || rq->kind == ROUTE_SDPA;
    switch (rq->kind) {
    case ROUTE_ATTEND:
        job_submit_attend(rq);
        break;
    case ROUTE_SDPA:
        job_submit_sdpa(rq);
        break;
    case ROUTE_SESSIONS:
        handle_sessions(rq);
        break;
    case ROUTE_SESSION:
        handle_session(rq, http_request_method(req));
        break;
    case ROUTE_TRUNCATE:
        job_submit_truncate(rq);
        break;
    case ROUTE_FORK:
        job_submit_fork(rq);
        break;
    case ROUTE_EXPORT:
        job_submit_export(rq);
        break;
    case ROUTE_ATTENTION:
        job_submit_attention(rq);
        break;
    case ROUTE_KV_ATTEND:
        job_submit_kv_attend(rq);
        break;
    case ROUTE_MODEL:
        handle_model(rq);
        break;
    case ROUTE_HEALTHZ:
        handle_status(rq, "ok");
        break;
    case ROUTE_READYZ:
        handle_status(rq, "ready");
        break;
    case ROUTE_METRICS:
        handle_metrics(rq);
        break;
    case ROUTE_UI:
        handle_ui(rq);
        break;
    case ROUTE_NONE:
        break;
    }
}

static void on_stream_drained(void *ctx, struct http_request *req) {
    struct route_req *rq = http_request_user(req);
    if (rq != NULL && rq->job != NULL) {
        job_stream_drained(rq->job);
    }
}

/* Drained: no job left, no request alive, and none still sending its headers (those get the
 * drain's grace like a body still arriving; a connection that ends without a request notifies
 * nobody, so route_tick and the drain deadline look again). */
static void maybe_drained(struct server *srv) {
    if (srv->is_draining && !srv->has_drained && pool_is_idle(srv->pool) &&
        http_server_n_requests(srv->http) == 0 && !http_server_has_partial_headers(srv->http)) {
        srv->has_drained = true;
        LOG_INFO("main", "drained: every accepted request is finished");
        srv->on_drained(srv);
    }
}

static void on_pool_idle(void *ctx) {
    maybe_drained(ctx);
}

/* The request's line: method, path and a path's session id are the client's bytes, quoted and
 * escaped, so a request is one line and cannot forge fields. Put together without printf: one
 * line a request (see struct log_line). */
static void log_request(enum log_level level, struct http_request *req, const struct route_req *rq,
                        double ms) {
    struct log_line line;
    log_line_init(&line);
    log_line_puts(&line, "request req=");
    log_line_int(&line, (long long)http_request_id(req));
    log_line_puts(&line, " session=");
    if (rq->session[0] != '\0') {
        log_line_quoted(&line, rq->session, 2 * API_SESSION_ID_MAX + 8);
    } else {
        log_line_puts(&line, "-");
    }
    log_line_puts(&line, " method=");
    log_line_quoted(&line, http_request_method(req), 40);
    log_line_puts(&line, " path=");
    log_line_quoted(&line, http_request_path(req), 1024);
    log_line_puts(&line, " status=");
    log_line_int(&line, rq->status);
    log_line_puts(&line, " code=");
    log_line_puts(&line, rq->error_name != NULL ? rq->error_name : "-");
    log_line_puts(&line, " ms=");
    log_line_fixed2(&line, ms);
    const char *ended = http_request_ended(req);
    if (ended != NULL) {
        log_line_puts(&line, " ended=");
        log_line_puts(&line, ended);
    }
    log_line_write(level, "route", &line);
}

static void on_closed(void *ctx, struct http_request *req) {
    struct server *srv = ctx;
    struct route_req *rq = http_request_user(req);
    if (rq == NULL) {
        return;
    }
    double ms = (double)uv_hrtime() / 1e6 - http_request_start_ms(req);
    metrics_request_done(&srv->metrics, entries[rq->kind].endpoint, rq->status, ms / 1000.0);
    bool is_quiet =
        rq->kind == ROUTE_HEALTHZ || rq->kind == ROUTE_READYZ || rq->kind == ROUTE_METRICS;
    enum log_level level = rq->status >= 500 ? LOG_LEVEL_WARN
                           : is_quiet        ? LOG_LEVEL_DEBUG
                                             : LOG_LEVEL_INFO;
    if (log_enabled(level)) {
        log_request(level, req, rq, ms);
    }
    if (rq->job != NULL) {
        job_client_gone(rq->job);
    }
    if (rq->disk_delete != NULL) {
        rq->disk_delete->rq = NULL; /* its removal goes on; nobody to answer */
    }
    free(rq);
    http_request_set_user(req, NULL);
    /* The request count drops after this returns; check again on the next loop turn. */
    if (srv->is_draining) {
        pool_set_idle_callback(srv->pool, on_pool_idle, srv);
    }
}

/* The loop's spin would take a core from a worker's forward (and its helpers). */
static bool may_spin(void *ctx) {
    struct server *srv = ctx;
    return pool_n_running(srv->pool) == 0;
}

void route_handlers(struct server *srv, struct http_handlers *out) {
    out->ctx = srv;
    out->may_spin = may_spin;
    out->on_headers = on_headers;
    out->on_request = on_request;
    out->on_stream_drained = on_stream_drained;
    out->on_closed = on_closed;
}

void route_drain(struct server *srv) {
    if (srv->is_draining) {
        return;
    }
    srv->is_draining = true;
    pool_set_idle_callback(srv->pool, on_pool_idle, srv);
}

void route_check_drained(struct server *srv) {
    maybe_drained(srv);
}

void route_tick(struct server *srv) {
    maybe_drained(srv);
    if (srv->cfg->session_ttl_s <= 0) {
        return;
    }
    int32_t n = session_store_expire(srv->sessions, now_ms(), srv->cfg->session_ttl_s * 1000);
    if (n > 0) {
        LOG_INFO("session", "expired idle sessions req=- session=- n=%d ttl_s=%lld", (int)n,
                 (long long)srv->cfg->session_ttl_s);
    }
}
