/* server/route.h: the daemon's context and its HTTP handlers: routing, authentication, one
 * handler per endpoint, and the jobs that carry engine work to the pool and answers back.
 *
 * Thread rule: loop thread only, except the jobs' run callbacks (workers), which touch only
 * their job.
 */
#ifndef SERVER_ROUTE_H
#define SERVER_ROUTE_H

#include <stdbool.h>
#include <stdint.h>

#include <uv.h>

#include "../engine/attn.h"
#include "api.h"
#include "config.h"
#include "http.h"
#include "metrics.h"
#include "pool.h"
#include "session.h"

/* Everything a request may need, wired by main(). Loop thread only. */
struct server {
    const struct config *cfg;
    uv_loop_t *loop;
    const attn_model *model;
    const char *model_source; /* the model folder, or "preset:<name> seed=<n>" */
    struct api_limits limits;
    struct session_store *sessions;
    struct spill *spill; /* the disk tier (--state-dir), or NULL */
    struct pool *pool;
    struct team *team; /* the computing threads the workers share */
    struct http_server *http;
    struct metrics metrics;
    bool is_draining;
    bool has_drained;
    /* Called once, on the loop thread, when draining has finished every request. It runs inside
     * HTTP callbacks, so it must only schedule the shutdown. */
    void (*on_drained)(struct server *srv);
};

/* One HTTP request as the route sees it. Created when its headers arrive, freed when http.c
 * reports it closed. Loop thread only. */
struct route_req {
    struct server *srv;
    struct http_request *http;
    int kind;                             /* route.c's route_kind */
    int status;                           /* the HTTP status answered, 0 = not yet */
    const char *error_name;               /* the error code answered, or NULL */
    char session[API_SESSION_ID_MAX + 1]; /* the session named, for logs ("" = none) */
    struct job *job;                      /* the job carrying this request, or NULL (job.h) */
    struct disk_delete *disk_delete;      /* a DELETE waiting for a file's removal (route.c) */
    /* Its answer changes nothing the server keeps (an export, a recomputed attention, SDPA, a
     * stateless attend): one that would pass --max-held-mb may be dropped for 503 server_busy.
     * Others (a session's step: it is in the cache already) are always sent. */
    bool is_answer_droppable;
};

/* Answers with a JSON body (malloc'd, ownership taken; NULL = no body, e.g. 204). Later answers
 * to the same request are dropped. */
void route_reply(struct route_req *rq, int status, char *body, size_t len);

/* Answers with a body of the given content type (malloc'd, ownership taken). */
void route_reply_typed(struct route_req *rq, int status, const char *type, char *body, size_t len);

/* Answers with a body of parts sent from where they are (http_request_reply_parts: owner's
 * memory, released once by release). */
void route_reply_parts(struct route_req *rq, int status, const char *type,
                       const struct http_part *parts, int n_parts, void (*release)(void *),
                       void *owner);

/* The live session id names, brought back from disk first if it is there (its restore then
 * runs ahead of any job queued on it). NULL when there is none: *rc says why
 * (ERROR_SESSION_NOT_FOUND, ERROR_SESSION_EVICTED, or a restore's refusal), and *state what the
 * store knows of the id. */
struct session *route_find_session(struct server *srv, const char *id, enum session_state *state,
                                   int *rc);

/* Answers with the Error body of code (error_code or attn_status) and the headers its status
 * needs (Allow, Retry-After, WWW-Authenticate). message/param NULL = default / null. */
void route_reply_error(struct route_req *rq, int code, const char *message, const char *param);

/* Starts a 200 text/event-stream answer (then http_request_stream_write / _end). */
void route_stream_begin(struct route_req *rq);

/* The Session body for s (malloc'd), or NULL when out of memory. own_pins: pins held by the
 * request being answered, left out of "pending". */
char *route_session_encode(struct session *s, int32_t own_pins, size_t *len);

/* The handlers to pass to http_server_create, with ctx = srv. */
void route_handlers(struct server *srv, struct http_handlers *out);

/* Starts draining: new requests get 503 draining, accepted ones finish, and on_drained fires
 * once nothing is left. The caller stops the listener (http_server_quiesce). */
void route_drain(struct server *srv);

/* Fires on_drained if the drain has nothing left (after the deadline cut what was arriving). */
void route_check_drained(struct server *srv);

/* Periodic housekeeping: expires idle sessions past --session-ttl-s; while draining, notices
 * that the last connection still sending headers has gone (timed out, closed). */
void route_tick(struct server *srv);

#endif /* SERVER_ROUTE_H */
