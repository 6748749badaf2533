/* server/job_session.c: the requests on one session that go through the scheduler besides the
 * forward (see job.h): truncate, fork and delete, which run as control jobs holding the
 * session's turn; export and the attention of cached tokens (--keep-queries), worker jobs
 * holding it; and import, which makes a new session.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "error.h"
#include "job_int.h"
#include "log.h"
#include "snapshot.h"

/* ---- session operations --------------------------------------------------------------------- */

/* A session with no cache at all exists only because this job's pin kept it: the call that was
 * making it failed before this job's turn came. It is answered as the id will be once the pin
 * goes: 404 (a 200 would describe a session that then vanishes, and a fork would copy it). */
static int require_cache(struct job *job) {
    if (session_n_layers_used(job->pj.session) == 0) {
        return job__set_err(job, ERROR_SESSION_NOT_FOUND, "session_id",
                            "the session holds no cache (the call that would have made it failed)");
    }
    return 0;
}

static int truncate_prepare(struct pool_job *pj, struct pool_step *step) {
    struct job *job = (struct job *)pj;
    struct session *s = pj->session;
    int nothing = require_cache(job);
    if (nothing != 0) {
        return nothing;
    }
    int32_t layer = job->tr.has_layer ? job->tr.layer : -1;
    int rc = session_truncate(job->srv->sessions, pj->turn, layer, job->tr.n_tokens);
    if (rc == ERROR_TOKENS_DROPPED) {
        /* Name a ring that cannot go back that far, and how far it can: of several, the one that
         * can go back least far, so that the length named is one this truncate takes. */
        const attn_model *m = job->srv->model;
        int32_t first = layer >= 0 ? layer : attn_model_layer_first(m);
        int32_t last = layer >= 0 ? layer : first + attn_model_layer_count(m) - 1;
        attn_kv *binding = NULL;
        int32_t binding_layer = -1;
        for (int32_t l = first; l <= last; l++) {
            attn_kv *kv = session_kv_find(s, l);
            if (kv != NULL && attn_kv_len(kv) > job->tr.n_tokens &&
                job->tr.n_tokens < attn_kv_truncate_min(kv) &&
                attn_config_layer_is_linear(attn_model_config(m), l)) {
                return job__set_err(
                    job, rc, "n_tokens",
                    "layer %d is linear attention: its state cannot forget tokens, so "
                    "it goes back to 0 or stays at its %d",
                    (int)l, (int)attn_kv_len(kv));
            }
            if (kv != NULL && attn_kv_len(kv) > job->tr.n_tokens &&
                job->tr.n_tokens < attn_kv_truncate_min(kv) &&
                (binding == NULL || attn_kv_truncate_min(kv) > attn_kv_truncate_min(binding))) {
                binding = kv;
                binding_layer = l;
            }
        }
        if (binding != NULL) {
            return job__set_err(job, rc, "n_tokens",
                                "layer %d slides (window %d) and its cache no longer holds the "
                                "tokens before %d: truncate to 0 or to at least %d",
                                (int)binding_layer, (int)attn_kv_window(binding),
                                (int)attn_kv_first_held(binding),
                                (int)attn_kv_truncate_min(binding));
        }
    }
    if (rc != 0) {
        return job__set_err(job, rc, "n_tokens", "n_tokens %d exceeds the %d tokens the %s holds",
                            (int)job->tr.n_tokens,
                            (int)(layer >= 0 && session_kv_find(s, layer) != NULL
                                      ? attn_kv_len(session_kv_find(s, layer))
                                  : layer >= 0 ? 0
                                               : session_n_tokens(s)),
                            layer >= 0 ? "layer" : "session");
    }
    job->response = route_session_encode(s, 1, &job->response_len);
    job->response_status = 200;
    return job->response != NULL ? 0 : ERROR_INTERNAL;
}

static int fork_prepare(struct pool_job *pj, struct pool_step *step) {
    struct job *job = (struct job *)pj;
    int nothing = require_cache(job);
    if (nothing != 0) {
        return nothing;
    }
    struct session *copy;
    int rc = session_fork(job->srv->sessions, pj->turn, job->fk.new_id, job__now_ms(), &copy);
    switch (rc) {
    case 0:
        break;
    case ERROR_SESSION_EXISTS:
        return job__set_err(job, rc, "new_id", "a session named %s already exists", job->fk.new_id);
    case ERROR_SESSION_EVICTED:
        return job__set_err(job, rc, "new_id",
                            "%s was evicted or expired; DELETE it before reusing the id",
                            job->fk.new_id);
    case ERROR_SESSION_LOST:
        return job__set_err(job, rc, "new_id",
                            "%s was lost (its file failed its checks when read back); DELETE it "
                            "before reusing the id",
                            job->fk.new_id);
    case ERROR_SESSION_FILE_FOREIGN:
        return job__set_err(job, rc, "new_id",
                            "--state-dir holds a file named %s that this server leaves alone; "
                            "use another id",
                            job->fk.new_id);
    case ERROR_KV_BUDGET_EXHAUSTED:
        return job__set_err(job, rc, NULL,
                            "--max-sessions sessions are live and none is idle but the source: "
                            "the copy would be one more");
    case ATTN_ENOSPC:
        return job__set_err(job, ERROR_KV_BUDGET_EXHAUSTED, NULL,
                            "the copy does not fit in the KV pool even after evicting idle "
                            "sessions");
    default:
        return rc;
    }
    LOG_INFO("session", "forked req=%llu session=%s new=%s tokens=%d",
             job->rq != NULL ? (unsigned long long)http_request_id(job->rq->http) : 0ULL,
             session_id(pj->session), job->fk.new_id, (int)session_n_tokens(copy));
    job->response = route_session_encode(copy, 0, &job->response_len);
    job->response_status = 201;
    return job->response != NULL ? 0 : ERROR_INTERNAL;
}

/* Frees the session's caches; the session itself goes when the pool gives back this job's turn,
 * unless later requests of it are queued already: they then start from an empty session, as
 * they would after a completed DELETE. */
static int delete_prepare(struct pool_job *pj, struct pool_step *step) {
    struct job *job = (struct job *)pj;
    session_clear(job->srv->sessions, pj->turn);
    job__unpin(job);
    job->response_status = 204;
    return 0;
}

static const struct pool_job_ops truncate_ops = {truncate_prepare, NULL, job__simple_done,
                                                 job__on_release};
static const struct pool_job_ops fork_ops = {fork_prepare, NULL, job__simple_done, job__on_release};
static const struct pool_job_ops delete_ops = {delete_prepare, NULL, job__simple_done,
                                               job__on_release};

/* Answers the parse error in job->parse_err (if job->parse_rc says the body failed) or a missing
 * session and frees the job; otherwise pins the path's session and queues the job with ops. */
static void control_submit(struct job *job, const struct pool_job_ops *ops) {
    if (job->parse_rc != 0) {
        route_reply_error(job->rq, job->parse_err.code, job->parse_err.message,
                          job->parse_err.param);
        job__free(job);
        return;
    }
    if (job__pin_path_session(job) != 0) {
        job__free(job);
        return;
    }
    job->pj.kind = POOL_JOB_CONTROL;
    job->pj.ops = ops;
    job__submit(job);
}

void job_submit_truncate(struct route_req *rq) {
    struct job *job = job__new(rq, JOB_TRUNCATE);
    if (job == NULL) {
        return;
    }
    size_t len;
    const char *body = http_request_body(rq->http, &len);
    job->parse_rc =
        api_truncate_request_parse(body, len, &rq->srv->limits, &job->tr, &job->parse_err);
    control_submit(job, &truncate_ops);
}

void job_submit_fork(struct route_req *rq) {
    struct job *job = job__new(rq, JOB_FORK);
    if (job == NULL) {
        return;
    }
    size_t len;
    const char *body = http_request_body(rq->http, &len);
    job->parse_rc = api_fork_request_parse(body, len, &job->fk, &job->parse_err);
    control_submit(job, &fork_ops);
}

void job_submit_delete(struct route_req *rq, struct session *s) {
    struct job *job = job__new(rq, JOB_DELETE);
    if (job == NULL) {
        return;
    }
    session_pin(rq->srv->sessions, s, job__now_ms());
    job->pj.session = s;
    job->pj.kind = POOL_JOB_CONTROL;
    job->pj.ops = &delete_ops;
    job->pj.ignores_restore_error = true; /* a session whose file failed is deleted all the same */
    job__submit(job);
}

/* ---- export and import ---------------------------------------------------------------------- */

static int export_prepare(struct pool_job *pj, struct pool_step *step) {
    struct job *job = (struct job *)pj;
    int nothing = require_cache(job); /* (a file with no layer is no session: PUT refuses it) */
    if (nothing != 0) {
        return nothing;
    }
    job->snap_kv = snapshot_kv_of(session_store_kv_pool(job->srv->sessions));
    return 0;
}

/* Worker: the session's turn is this job's, so nothing changes its caches while they are read;
 * the copy and the checksum stay off the loop. */
static int export_run(struct pool_job *pj, int status) {
    struct job *job = (struct job *)pj;
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    uint8_t *file;
    size_t len;
    int rc = snapshot_encode(pj->session, job->srv->model, job->snap_kv,
                             (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000, &file, &len);
    if (rc != 0) {
        return rc;
    }
    snapshot_seal(file, len);
    job->response = (char *)file;
    job->response_len = len;
    job->response_status = 200;
    job->response_type = "application/octet-stream";
    return 0;
}

static const struct pool_job_ops export_ops = {export_prepare, export_run, job__simple_done,
                                               job__on_release};

void job_submit_export(struct route_req *rq) {
    struct job *job = job__new(rq, JOB_EXPORT);
    if (job == NULL || job__pin_path_session(job) != 0) {
        if (job != NULL) {
            job__free(job);
        }
        return;
    }
    job->pj.kind = POOL_JOB_SDPA; /* work on a worker, with the session's turn */
    job->pj.ops = &export_ops;
    job__submit(job);
}

/* ---- GET /v1/sessions/{id}/attention -------------------------------------------------------- */

static bool take_query(void *ctx, const char *name, const char *value) {
    struct job *job = ctx;
    job->parse_rc =
        api_attention_query(job->attn_q, name, value, &job->srv->limits, &job->parse_err);
    return job->parse_rc == 0;
}

static int attention_prepare(struct pool_job *pj, struct pool_step *step) {
    return require_cache((struct job *)pj);
}

/* Worker, holding the session's turn: nothing changes the cache while its rows are recomputed. */
static int attention_run(struct pool_job *pj, int status) {
    struct job *job = (struct job *)pj;
    struct server *srv = job->srv;
    int32_t layer = job->attn_q->layer, n_heads = srv->limits.n_heads;
    attn_kv *kv = session_kv_find(pj->session, layer);
    int32_t n_tokens = kv != NULL ? attn_kv_len(kv) : 0;
    /* a ring keeps what later queries see: row i needs keys from i - window + 1 on */
    int32_t held = kv != NULL ? attn_kv_first_held(kv) : 0, window = kv ? attn_kv_window(kv) : 0;
    int32_t first_row = held > 0 && window > 0 ? held + window - 1 : held;
    first_row = first_row < n_tokens ? first_row : n_tokens;
    struct api_selection sel;
    struct api_error e = {0};
    if (api_attention_select(job->attn_q, n_heads, n_tokens, first_row, &sel, &e) != 0) {
        return job__set_err(job, e.code, e.param, "%s", e.message);
    }
    int64_t n_values = api_selection_values(&sel, n_heads);
    float *values = malloc((size_t)(n_values > 0 ? n_values : 1) * sizeof(float));
    int rc = values == NULL ? job__set_err(job, ERROR_INTERNAL, NULL, "out of memory") : 0;
    if (rc == 0 && sel.n_rows > 0) {
        attn_inspect ins = api_selection_inspect(&sel, values);
        rc = attn_kv_attention(srv->model, layer, kv, &ins);
        if (rc != ATTN_OK) {
            rc = job__set_err(job, ERROR_INTERNAL, NULL, "recomputing the attention failed: %s",
                              attn_strerror(rc));
        }
    }
    if (rc == 0) {
        struct api_attention_response r = {
            session_id(pj->session), layer, n_tokens, first_row, n_heads, &sel, values};
        job->response = api_attention_response_encode(&r, &job->response_len);
        job->response_status = 200;
        rc = job->response != NULL ? 0 : job__set_err(job, ERROR_INTERNAL, NULL, "out of memory");
    }
    free(values);
    api_selection_release(&sel);
    return rc;
}

static const struct pool_job_ops attention_ops = {attention_prepare, attention_run,
                                                  job__simple_done, job__on_release};

void job_submit_attention(struct route_req *rq) {
    struct server *srv = rq->srv;
    if (!attn_kv_pool_keeps_queries(session_store_kv_pool(srv->sessions))) {
        route_reply_error(rq, ERROR_QUERIES_NOT_KEPT, NULL, NULL);
        return;
    }
    struct job *job = job__new(rq, JOB_ATTENTION);
    if (job == NULL) {
        return;
    }
    job->attn_q = calloc(1, sizeof *job->attn_q);
    if (job->attn_q == NULL) {
        route_reply_error(rq, ERROR_INTERNAL, "out of memory", NULL);
        job__free(job);
        return;
    }
    job->attn_q->layer = srv->limits.layer_first;
    http_request_queries(rq->http, take_query, job);
    if (job->parse_rc != 0) {
        route_reply_error(rq, job->parse_rc, job->parse_err.message, job->parse_err.param);
        job__free(job);
        return;
    }
    if (attn_config_layer_is_linear(attn_model_config(srv->model), job->attn_q->layer)) {
        route_reply_error(rq, ERROR_INVALID_REQUEST,
                          "layer: a linear-attention layer has no attention weights", "layer");
        job__free(job);
        return;
    }
    if (job__pin_path_session(job) != 0) {
        job__free(job);
        return;
    }
    job->pj.kind = POOL_JOB_SDPA; /* work on a worker, with the session's turn */
    job->pj.ops = &attention_ops;
    job__submit(job);
}

/* Loop, after snapshot_check passed (parse_body): the file's model, then the id, then the
 * caches, made all at once or not at all. */
void job__import_admit(struct job *job) {
    struct route_req *rq = job->rq;
    struct server *srv = job->srv;
    const uint8_t *file = (const uint8_t *)http_request_body(rq->http, &job->body_len);
    struct snapshot_info info;
    char msg[256];
    int rc = snapshot_read_header(file, job->body_len, &info, msg, sizeof msg);
    if (rc == 0) {
        rc = snapshot_match(&info, srv->model, snapshot_kv_of(session_store_kv_pool(srv->sessions)),
                            msg, sizeof msg);
    }
    if (rc != 0) {
        route_reply_error(rq, rc, msg, "body");
        job__free(job);
        return;
    }
    enum session_state state;
    session_find(srv->sessions, rq->session, &state);
    /* a PUT brings the id back, if it succeeds: a failed one leaves the tombstone as it was */
    bool was_gone = state == SESSION_STATE_TOMBSTONE;
    bool was_lost = was_gone && session_gone_code(srv->sessions, rq->session) == ERROR_SESSION_LOST;
    if (was_gone) {
        session_tombstone_forget(srv->sessions, rq->session);
    }
    struct session *s;
    rc = session_create(srv->sessions, rq->session, job__now_ms(), &s);
    if (rc != 0) {
        route_reply_error(rq, rc,
                          rc == ERROR_SESSION_EXISTS
                              ? "a session with this id exists (in memory or on disk); DELETE it "
                                "first to replace it"
                              : NULL,
                          "session_id");
        if (was_gone) {
            session_tombstone_add(srv->sessions, rq->session, was_lost);
        }
        job__free(job);
        return;
    }
    session_pin(srv->sessions, s, job__now_ms());
    job->pj.session = s;
    struct session_turn *t = session_turn_take(srv->sessions, s); /* new: nobody else has it */
    rc = snapshot_restore(srv->sessions, t, file, job->body_len, msg, sizeof msg);
    session_turn_give(srv->sessions, t);
    if (rc != 0) {
        route_reply_error(rq, rc, msg, rc == ERROR_KV_BUDGET_EXHAUSTED ? NULL : "body");
    } else {
        LOG_INFO("session", "imported req=%llu session=%s tokens=%d bytes=%zu",
                 (unsigned long long)http_request_id(rq->http), rq->session,
                 (int)session_n_tokens(s), job->body_len);
        size_t len;
        char *body = route_session_encode(s, 1, &len);
        if (body != NULL) {
            route_reply(rq, 201, body, len);
        } else {
            /* all or nothing: an import that cannot say it succeeded has not (a 500 left the
             * session, and the PUT tried again met 409 session_exists) */
            t = session_turn_take(srv->sessions, s);
            session_clear(srv->sessions, t);
            session_turn_give(srv->sessions, t);
            rc = ERROR_INTERNAL;
            route_reply_error(rq, rc, "out of memory", NULL);
        }
    }
    job__unpin(job); /* a failed import's empty session goes with its pin */
    if (rc != 0 && was_gone) {
        session_tombstone_add(srv->sessions, rq->session, was_lost);
    }
    job__free(job);
}

void job_submit_import(struct route_req *rq) {
    struct job *job = job__new(rq, JOB_IMPORT);
    if (job != NULL) {
        job__parse_then_admit(job);
    }
}
