/* server/job_attend.c: the forward of POST /v1/attend, and POST /v1/kv/attend (q, k and v in):
 * admission against the session (its turn, lengths, the cache a first call makes), sizing the
 * outputs and inspections, the run on a worker, streamed steps, and the answer (see job_int.h).
 */
#include "job_int.h"

#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "error.h"
#include "log.h"

/* ---- POST /v1/attend ------------------------------------------------------------------------ */

/* Releases what the request held, from its done callback (it holds its session's turn): its
 * temporary cache, a layer cache that a failed first call left empty, and its pin (a session
 * that only this failed request had created goes with the turn). */
static void attend_finish(struct job *job, bool ok) {
    attn_kv_destroy(job->temp_kv); /* no worker uses it: the job is not running */
    job->temp_kv = NULL;
    if (ok && job->pj.turn != NULL && job->temp_cross != NULL) {
        /* The new context is in: it replaces the stored one only now, so a failed call loses
         * nothing. */
        session_cross_install(job->pj.turn, job->at.layer, job->temp_cross);
        job->temp_cross = NULL;
    }
    attn_kv_destroy(job->temp_cross);
    job->temp_cross = NULL;
    if (job->pj.turn != NULL && !ok && job->made_layer_kv) {
        /* a failed call leaves the session as it was: a cache it made goes, one it found stays
         * (even empty, as a truncate to 0 leaves it) */
        session_drop_layer_if_empty(job->pj.turn, job->at.layer);
    }
    job__unpin(job);
}

/* Values of each head's attention output (head_out): head_dim, or multi-head latent
 * attention's v_head_dim. */
static size_t head_out_width(const struct server *srv) {
    const attn_config *c = attn_model_config(srv->model);
    return c->kv_lora_rank > 0 ? (size_t)c->v_head_dim : (size_t)srv->limits.head_dim;
}

/* The inspection of a call (return_weights as an object, capture) once its keys are known: the
 * selection resolved against them, and its buffers. */
static int inspect_size(struct job *job, int32_t n_keys) {
    const struct api_limits *lim = &job->srv->limits;
    size_t t = (size_t)job->at.n_tokens, hd = (size_t)lim->head_dim;
    job->has_inspect = job->at.sel.is_set || job->at.capture != 0;
    if (!job->has_inspect) {
        return 0;
    }
    memset(&job->inspect, 0, sizeof job->inspect);
    if (job->at.sel.is_set) { /* resolved by attend_checks */
        int64_t values = api_selection_values(&job->at.sel, lim->n_heads);
        job->selected = malloc((size_t)(values > 0 ? values : 1) * sizeof(float));
        if (job->selected == NULL) {
            return job__set_err(job, ERROR_INTERNAL, NULL, "out of memory for the selection");
        }
        job->inspect = api_selection_inspect(&job->at.sel, job->selected);
    }
    size_t d_v = head_out_width(job->srv);
    size_t sizes[4] = {lim->n_heads * t * hd, lim->n_kv_heads * t * hd, lim->n_kv_heads * t * hd,
                       lim->n_heads * t * d_v};
    float **slots[4] = {&job->inspect.q, &job->inspect.k, &job->inspect.v, &job->inspect.head_out};
    for (int i = 0; i < 4; i++) {
        if (!(job->at.capture & (1u << i))) {
            continue;
        }
        if ((job->captures[i] = malloc(sizes[i] * sizeof(float))) == NULL) {
            return job__set_err(job, ERROR_INTERNAL, NULL, "out of memory for the capture");
        }
        *slots[i] = job->captures[i];
    }
    return 0;
}

/* Values of capture i (API_CAPTURE_* bit order: q, k, v, head_out), as inspect_size sizes it. */
static int64_t capture_values(const struct job *job, int i) {
    const struct api_limits *lim = &job->srv->limits;
    int64_t t = job->at.n_tokens, hd = lim->head_dim, d_v = (int64_t)head_out_width(job->srv);
    int64_t heads = i == 1 || i == 2 ? lim->n_kv_heads : lim->n_heads;
    return heads * t * (i == 3 ? d_v : hd);
}

/* A batch's steps answer in one response, so API_WEIGHTS_MAX_VALUES holds for the weights of
 * all of them (each checked alone first): a step's count joins its batch's as it is sized (its
 * buffers allocated), and the step that would pass the limit fails, naming return_weights. A
 * step that fails later gives its count back (job__batch_step_answered), which helps the steps
 * sized after that, not those already refused. */
static int charge_batch_weights(struct job *job, int64_t values) {
    struct job *batch = job->parent;
    if (batch == NULL || values == 0) {
        return 0;
    }
    if (batch->n_weights + values > API_WEIGHTS_MAX_VALUES) {
        return job__set_err(job, ERROR_INVALID_REQUEST, "return_weights",
                            "return_weights: this step's %lld values and the %lld the call's "
                            "steps prepared so far hold exceed the limit of %d values in one "
                            "response",
                            (long long)values, (long long)batch->n_weights, API_WEIGHTS_MAX_VALUES);
    }
    batch->n_weights += values;
    job->n_charged = values;
    return 0;
}

/* What a call asks that its cache's length n_past and the n_keys its queries see (n_past + T,
 * or a context's tokens) refuse: expect_n_past, key_mask's length, the maximum sequence length,
 * the weights' size, the selection (resolved here against them). Needs no buffer, so admission
 * runs it too, for a session not made yet (see job__attend_admit). Returns 0, or the code with
 * the job's error set. */
static int attend_checks(struct job *job, int32_t n_past, int32_t n_keys) {
    const struct api_limits *lim = &job->srv->limits;
    int32_t t = job->at.n_tokens;
    if (job->at.has_expect_n_past && job->at.expect_n_past != n_past) {
        return job__set_err(job, ERROR_N_PAST_MISMATCH, "expect_n_past",
                            "expect_n_past is %d but the cache holds %d tokens",
                            (int)job->at.expect_n_past, (int)n_past);
    }
    if (job->at.key_mask != NULL && job->at.n_key_mask != (int64_t)n_past + t) {
        return job__set_err(
            job, ERROR_INVALID_REQUEST, "key_mask",
            "key_mask has %d values; the cache holds %d tokens and x brings %d, so it "
            "needs %d",
            (int)job->at.n_key_mask, (int)n_past, (int)t, (int)(n_past + t));
    }
    if (!job->at.is_cross && (int64_t)n_past + t > lim->max_seq) {
        return job__set_err(
            job, ERROR_CONTEXT_LENGTH_EXCEEDED, "x",
            "the cache holds %d tokens; %d more exceed the model's maximum sequence "
            "length %d",
            (int)n_past, (int)t, (int)lim->max_seq);
    }
    if (job->at.return_weights && !job->at.sel.is_set &&
        (int64_t)lim->n_heads * t * n_keys > API_WEIGHTS_MAX_VALUES) {
        return job__set_err(job, ERROR_INVALID_REQUEST, "return_weights",
                            "return_weights: n_heads x T x %s = %lld values exceed the limit of %d",
                            job->at.is_cross ? "context tokens" : "(n_past + T)",
                            (long long)lim->n_heads * t * n_keys, API_WEIGHTS_MAX_VALUES);
    }
    if (job->at.sel.is_set) {
        /* resolving twice (admission, then the turn) is resolving once: the second finds the
         * heads and rows already in range and the same keys */
        struct api_error e;
        memset(&e, 0, sizeof e);
        if (api_selection_resolve(&job->at.sel, lim->n_heads, t, n_keys, 1, &e) != 0) {
            return job__set_err(job, e.code, e.param, "%s", e.message);
        }
    }
    return 0;
}

/* Allocates the output buffers once n_past and n_keys are known (see attend_checks), after the
 * checks. */
static int attend_size(struct job *job, int32_t n_past, int32_t n_keys) {
    const struct api_limits *lim = &job->srv->limits;
    int32_t t = job->at.n_tokens;
    int rc = attend_checks(job, n_past, n_keys);
    if (rc != 0) {
        return rc;
    }
    int64_t n_weights = (int64_t)lim->n_heads * (job->at.stream ? 1 : t) * n_keys;
    /* q/k/v steps answer each head's output (n_heads, T, head_dim), the others (T, hidden) */
    size_t row =
        job->at.q != NULL ? (size_t)lim->n_heads * lim->head_dim : (size_t)lim->hidden_size;
    job->out = malloc((size_t)t * row * sizeof(float));
    bool is_full = job->at.return_weights && !job->at.sel.is_set;
    if (is_full) {
        job->weights = malloc((size_t)n_weights * sizeof(float));
    }
    if (job->out == NULL || (is_full && job->weights == NULL)) {
        return job__set_err(job, ERROR_INTERNAL, NULL, "out of memory for the output");
    }
    rc = inspect_size(job, n_keys);
    int64_t n_returned = is_full              ? n_weights
                         : job->at.sel.is_set ? api_selection_values(&job->at.sel, lim->n_heads)
                                              : 0;
    if (rc != 0 || (rc = charge_batch_weights(job, n_returned)) != 0) {
        return rc;
    }
    /* The answer's (or each event's) bytes are taken now, before the call changes the session:
     * an encoding that failed afterwards answered 500 for a call whose tokens the cache kept
     * (a retry then met n_past_mismatch, and a first call's session stayed). */
    int64_t n_values = job->at.stream ? (int64_t)row + (is_full ? n_weights : 0)
                                      : (int64_t)t * (int64_t)row + n_returned;
    for (int i = 0; i < 4; i++) {
        n_values += job->captures[i] != NULL ? capture_values(job, i) : 0;
    }
    int64_t n_ints = job->at.sel.is_set ? (int64_t)lim->n_heads + t : 0;
    struct strbuf *room = job->at.stream ? &job->event : &job->room;
    size_t bytes =
        api_answer_bytes_bound(n_values, n_ints, strlen(job->at.session_id), job->at.encoding);
    bool is_short = strbuf_reserve(room, bytes) != 0;
    if (!is_short && job->parent != NULL) {
        /* the batch's answer holds this step's too; the room it had stays for the steps sized
         * before (a failed growth is not the sticky failure of a write) */
        struct strbuf *all = &job->parent->room;
        is_short = strbuf_reserve(all, job->parent->room_want + bytes) != 0;
        all->has_failed = false;
        job->parent->room_want += is_short ? 0 : bytes;
    }
    if (is_short) {
        strbuf_release(room);
        return job__set_err(job, ERROR_INTERNAL, NULL, "out of memory for the answer");
    }
    job->n_past0 = n_past;
    job->n_keys = n_keys;
    job->is_sized = true;
    return 0;
}

/* A cross-attention step: the context this call brings (into a cache of the job's own) or the
 * one the session's layer holds. */
static int cross_prepare(struct job *job, struct pool_step *step) {
    struct pool_job *pj = &job->pj;
    struct session *s = pj->turn != NULL ? session_turn_session(pj->turn) : NULL;
    attn_kv *stored = s != NULL ? session_cross_find(s, job->at.layer) : NULL;
    if (job->at.context == NULL && stored == NULL) {
        return s != NULL
                   ? job__set_err(job, ERROR_INVALID_REQUEST, "cross",
                                  "cross: session %s holds no context at layer %d; send it in "
                                  "context",
                                  job->at.session_id, (int)job->at.layer)
                   : job__set_err(job, ERROR_INVALID_REQUEST, "cross",
                                  "cross: a call without a session must bring its context");
    }
    if (job->at.context != NULL && stored != NULL && !job->at.replace_context) {
        return job__set_err(
            job, ERROR_CONTEXT_EXISTS, "context",
            "context: session %s holds a context of %d tokens at layer %d; send "
            "replace_context: true to replace it, or cross: true without context to "
            "attend to it",
            job->at.session_id, (int)attn_kv_len(stored), (int)job->at.layer);
    }
    attn_kv *cross = stored;
    if (job->at.context != NULL) {
        if (job->temp_cross == NULL) {
            int rc = attn_kv_create(session_store_kv_pool(job->srv->sessions), &job->temp_cross);
            if (rc != ATTN_OK) {
                return rc;
            }
        }
        cross = job->temp_cross; /* empty until the forward: prepare may run again */
    }
    if (!job->is_sized) {
        attn_kv *self = s != NULL ? session_kv_find(s, job->at.layer) : NULL;
        int32_t n_keys = job->at.context != NULL ? job->at.n_context : attn_kv_len(stored);
        int rc = attend_size(job, self != NULL ? attn_kv_len(self) : 0, n_keys);
        if (rc != 0) {
            return rc;
        }
    }
    step->kv = NULL;
    step->cross = cross;
    step->context = job->at.context;
    step->n_context = job->at.context != NULL ? job->at.n_context : 0;
    step->layer = job->at.layer;
    step->weights = job->weights;
    step->inspect = job->has_inspect ? &job->inspect : NULL;
    step->head_scale = job->at.head_mask;
    step->key_valid = NULL;
    step->x = job->at.x;
    step->n_tokens = job->at.n_tokens;
    step->positions = NULL;
    step->rope_reach = 0;
    step->out = job->out;
    return 0;
}

static int attend_prepare(struct pool_job *pj, struct pool_step *step) {
    struct job *job = (struct job *)pj;
    struct server *srv = job->srv;
    if (job__is_gone(job)) {
        return ERROR_CANCELLED;
    }
    if (job->next_index > 0 && job->rq != NULL && http_request_peer_closed(job->rq->http)) {
        return ERROR_CANCELLED;
    }
    if (job->at.is_cross) {
        return cross_prepare(job, step);
    }
    attn_kv *kv;
    if (pj->turn != NULL) {
        job->made_layer_kv = job->made_layer_kv ||
                             session_kv_find(session_turn_session(pj->turn), job->at.layer) == NULL;
        int rc = session_kv_get(srv->sessions, pj->turn, job->at.layer, &kv);
        if (rc != 0) {
            return rc;
        }
    } else {
        if (job->temp_kv == NULL) {
            int rc = attn_kv_create_for_layer(session_store_kv_pool(srv->sessions), job->at.layer,
                                              &job->temp_kv);
            if (rc != ATTN_OK) {
                return rc;
            }
        }
        kv = job->temp_kv;
    }
    if (!job->is_sized) {
        int rc = attend_size(job, attn_kv_len(kv), attn_kv_len(kv) + job->at.n_tokens);
        if (rc != 0) {
            return rc;
        }
    }
    int32_t hidden = srv->limits.hidden_size;
    step->kv = kv;
    step->cross = NULL;
    step->layer = job->at.layer;
    step->weights = job->weights;
    step->inspect = job->has_inspect ? &job->inspect : NULL;
    step->head_scale = job->at.head_mask;
    step->key_valid = job->at.key_mask; /* the engine reads the step's first P + T */
    if (!job->at.stream) {
        step->x = job->at.x;
        step->q = job->at.q;
        step->k = job->at.k;
        step->v = job->at.v;
        step->rope = job->at.rope;
        step->n_tokens = job->at.n_tokens;
        step->positions = job->at.positions;
        step->rope_reach = 0;
        step->out = job->out;
    } else {
        int32_t i = job->next_index;
        step->x = job->at.x + (size_t)i * hidden;
        step->n_tokens = 1;
        step->positions = job->at.positions != NULL ? &job->at.positions[i] : NULL;
        /* Each token is its own engine step, but rotates as the whole call would: a rotation
         * that depends on the call's reach (longrope, dynamic) sees the call's highest
         * position, as the same call without stream does. */
        step->rope_reach = job->n_past0 + job->at.n_tokens - 1;
        for (int32_t p = 0; job->at.positions != NULL && p < job->at.n_tokens; p++) {
            step->rope_reach = p == 0 || job->at.positions[p] > step->rope_reach
                                   ? job->at.positions[p]
                                   : step->rope_reach;
        }
        step->out = job->out + (size_t)i * hidden;
    }
    return 0;
}

/* Worker: encodes the answer (or the stream event) from the job's buffers. */
static int attend_run(struct pool_job *pj, int status) {
    struct job *job = (struct job *)pj;
    if (status != 0) {
        return status;
    }
    const struct api_limits *lim = &job->srv->limits;
    if (!job->at.stream) {
        struct api_attend_response r = {
            .session_id = job->at.session_id[0] ? job->at.session_id : NULL,
            .layer = job->at.layer,
            .n_past = job->n_past0,
            .n_tokens = job->n_past0 + (job->at.is_cross ? 0 : job->at.n_tokens),
            .is_cross = job->at.is_cross,
            .context_tokens = job->n_keys,
            .n_new = job->at.n_tokens,
            .hidden_size = lim->hidden_size,
            .n_heads = lim->n_heads,
            .output = job->out,
            .weights = job->weights,
            .timing = {pj->queue_ms, pj->compute_ms},
            .encoding = job->at.encoding,
            .is_per_head = job->at.q != NULL,
            .head_dim = lim->head_dim,
            .sel = job->at.sel.is_set ? &job->at.sel : NULL,
            .selected = job->selected,
            .capture_q = job->captures[0],
            .capture_k = job->captures[1],
            .capture_v = job->captures[2],
            .capture_head_out = job->captures[3],
            .n_kv_heads = lim->n_kv_heads,
            .d_v = (int32_t)head_out_width(job->srv),
        };
        /* framed: the tensors go out from the job's buffers, not copied after the JSON */
        job->response = api_attend_response_encode_in(&job->room, &r, &job->response_len,
                                                      &job->response_json_len, &job->raw);
        job->response_status = 200;
        job__binary_answer(job, job->at.encoding);
        return job->response != NULL
                   ? 0
                   : job__set_err(job, ERROR_INTERNAL, NULL, "out of memory encoding the answer");
    }
    int32_t i = job->next_index;
    struct api_stream_event e = {
        .index = i,
        .position = job->at.positions != NULL ? job->at.positions[i] : job->n_past0 + i,
        .n_past = job->n_past0 + i,
        .hidden_size = lim->hidden_size,
        .n_heads = lim->n_heads,
        .output = job->out + (size_t)i * lim->hidden_size,
        .weights = job->weights,
        .encoding = job->at.encoding,
    };
    job->event.len = 0;
    api_stream_event_encode(&job->event, &e);
    if (job->event.has_failed) {
        strbuf_release(&job->event);
        return job__set_err(job, ERROR_INTERNAL, NULL, "out of memory encoding the event");
    }
    return 0;
}

static void count_tokens(struct job *job, int32_t n) {
    if (job->n_past0 == 0) {
        job->srv->metrics.tokens_prefill += (uint64_t)n;
    } else {
        job->srv->metrics.tokens_decode += (uint64_t)n;
    }
}

/* A stream step is over: send its event, or the error, and decide whether another follows. */
static enum pool_after stream_done(struct job *job, int status) {
    struct route_req *rq = job->rq;
    if (status != 0 || rq == NULL) {
        if (rq != NULL && job->next_index == 0) {
            job__answer(job, status);
        } else if (rq != NULL) {
            if (status != ERROR_CANCELLED) {
                struct strbuf b;
                strbuf_init(&b);
                api_stream_error_encode(&b, status, job->err_message, job->err_param);
                http_request_stream_write(rq->http, b.data, b.len);
                strbuf_release(&b);
                rq->error_name = error_info_get(status)->name;
            }
            http_request_stream_end(rq->http);
        }
        attend_finish(job, false);
        return POOL_AFTER_FINISHED;
    }
    count_tokens(job, 1);
    if (job->next_index == 0) {
        route_stream_begin(rq);
    }
    http_request_stream_write(rq->http, job->event.data, job->event.len);
    job->next_index++;
    if (job->next_index < job->at.n_tokens) {
        return POOL_AFTER_PARKED; /* job_stream_drained makes it ready again */
    }
    struct api_attend_response r = {
        .session_id = job->at.session_id[0] ? job->at.session_id : NULL,
        .layer = job->at.layer,
        .n_past = job->n_past0,
        .n_tokens = job->n_past0 + job->at.n_tokens,
        .n_new = job->at.n_tokens,
        .timing = {job->pj.queue_ms, job->pj.compute_ms},
    };
    struct strbuf b;
    strbuf_init(&b);
    api_stream_usage_encode(&b, &r);
    http_request_stream_write(rq->http, b.data, b.len);
    strbuf_release(&b);
    http_request_stream_end(rq->http);
    attend_finish(job, true);
    return POOL_AFTER_FINISHED;
}

static enum pool_after attend_done(struct pool_job *pj, int status) {
    struct job *job = (struct job *)pj;
    job__count_cancelled(job, status);
    if (pj->turn != NULL) {
        session_refresh(pj->turn); /* the worker is done: the counts are settled */
    }
    if (job->at.stream) {
        return stream_done(job, status);
    }
    if (status == 0) {
        count_tokens(job, job->at.n_tokens);
    }
    job__answer(job, status);
    attend_finish(job, status == 0);
    return POOL_AFTER_FINISHED;
}

static const struct pool_job_ops attend_ops = {attend_prepare, attend_run, attend_done,
                                               job__on_release};

/* Loop: the body is parsed; resolve the session and queue the forward. */
const char *job__layer_refusal(const struct server *srv, const struct api_attend_request *at,
                               char *msg, size_t size) {
    if (at->is_cross && attn_model_config(srv->model)->kv_lora_rank > 0) {
        const char *field = at->context != NULL ? "context" : "cross"; /* as sent */
        snprintf(msg, size,
                 "%s: the model's multi-head latent attention caches a latent, which has no "
                 "context form",
                 field);
        return field;
    }
    if (attn_config_layer_is_linear(attn_model_config(srv->model), at->layer)) {
        /* Linear attention has no scores, positions or context. */
        const char *names[] = {"return_weights", "key_mask", "positions",
                               at->context != NULL ? "context" : "cross", "capture"};
        bool given[] = {at->return_weights, at->key_mask != NULL, at->positions != NULL,
                        at->is_cross, at->capture != 0};
        for (int i = 0; i < 5; i++) {
            if (given[i]) {
                snprintf(msg, size,
                         "%s: layer %d is linear attention, which has no scores, positions or "
                         "context",
                         names[i], (int)at->layer);
                return names[i];
            }
        }
    }
    return NULL;
}

void job__attend_admit(struct job *job) {
    struct route_req *rq = job->rq;
    struct server *srv = job->srv;
    const char *hdr = rq != NULL ? http_request_header(rq->http, "X-Session-Id") : NULL;
    if (hdr != NULL) {
        if (!api_session_id_is_valid(hdr, strlen(hdr))) {
            job__refuse(job, ERROR_INVALID_REQUEST,
                        "the X-Session-Id header must be 1 to 128 characters from "
                        "[A-Za-z0-9._:-]",
                        "X-Session-Id");
            job__free(job);
            return;
        }
        if (job->at.session_id[0] != '\0' && strcmp(job->at.session_id, hdr) != 0) {
            job__refuse(job, ERROR_INVALID_REQUEST,
                        "session_id in the body differs from the X-Session-Id header",
                        "session_id");
            job__free(job);
            return;
        }
        strbuf_copy_string(job->at.session_id, sizeof job->at.session_id, hdr);
    }
    if (job->at.q != NULL && job->at.session_id[0] == '\0') {
        /* q/k/v append to a session's cache: there is no stateless form */
        job__refuse(job, ERROR_INVALID_REQUEST,
                    rq != NULL ? "session_id: required (in the body or the X-Session-Id header)"
                               : "session_id: required",
                    "session_id");
        job__free(job);
        return;
    }
    if (rq != NULL && job->at.session_id[0] != '\0') {
        /* for its log line */
        strbuf_copy_string(rq->session, sizeof rq->session, job->at.session_id);
    } else if (rq != NULL) {
        rq->is_answer_droppable = true; /* stateless: its answer changes nothing kept */
    }
    /* What the layer cannot compute is refused before the session is looked up: a session
     * made for it would evict an idle one at --max-sessions, and a refused request changes
     * nothing (found by an outside audit: return_weights on a linear layer naming a new id
     * evicted the least recently used session, which then answered 410). A steps call checks
     * its steps so before any runs (job__batch_admit). */
    char why[200];
    const char *field = job__layer_refusal(srv, &job->at, why, sizeof why);
    if (field != NULL) {
        job__refuse(job, ERROR_INVALID_REQUEST, why, field);
        job__free(job);
        return;
    }
    if (job->at.session_id[0] != '\0') {
        enum session_state state;
        int rc;
        struct session *s = route_find_session(srv, job->at.session_id, &state, &rc);
        if (s == NULL && state != SESSION_STATE_UNKNOWN) {
            job__refuse(job, rc, NULL, "session_id"); /* evicted, or cannot come back */
            job__free(job);
            return;
        }
        if (s == NULL) {
            /* A new session's caches hold 0 tokens at this request's turn (no request of its can
             * be ahead of this one), so what that refuses is refused before the session is made:
             * making it may evict an idle session for --max-sessions, and a refused request
             * changes nothing (found by an outside audit: a 409 expect_n_past on a new id, as a
             * client resyncing after a restart or a move sends, evicted the least recently used
             * idle session; so did a selection's keys past the call's). */
            char msg[sizeof job->err_message], param[sizeof job->err_param];
            int code = 0;
            if (job->at.is_cross && job->at.context == NULL) {
                code = ERROR_INVALID_REQUEST;
                snprintf(param, sizeof param, "cross");
                snprintf(msg, sizeof msg,
                         "cross: session %s holds no context at layer %d; send it in context",
                         job->at.session_id, (int)job->at.layer);
            } else if ((code = attend_checks(
                            job, 0, job->at.is_cross ? job->at.n_context : job->at.n_tokens)) !=
                       0) {
                memcpy(msg, job->err_message, sizeof msg);
                memcpy(param, job->err_param, sizeof param);
            }
            if (code != 0) {
                job__refuse(job, code, msg, param);
                job__free(job);
                return;
            }
            rc = session_create(srv->sessions, job->at.session_id, job__now_ms(), &s);
            if (rc != 0) {
                job__refuse(job, rc,
                            rc == ERROR_KV_BUDGET_EXHAUSTED
                                ? "--max-sessions sessions are live and all are busy"
                                : NULL,
                            "session_id");
                job__free(job);
                return;
            }
        }
        session_pin(srv->sessions, s, job__now_ms());
        job->pj.session = s;
    }
    job->pj.kind = POOL_JOB_FORWARD;
    job->pj.ops = &attend_ops;
    job->pj.is_batchable = job->at.stream || job->at.n_tokens <= POOL_BATCH_STEP_MAX_TOKENS;
    job->pj.is_qkv = job->at.q != NULL;
    job->pj.layer = job->at.layer;
    job__submit(job);
}

/* Whether the request, or any step of its batch, captures one of these tensors. */
static bool has_capture(const struct job *job, uint32_t bits) {
    bool any = (job->at.capture & bits) != 0;
    for (int32_t i = 0; i < job->at.n_steps; i++) {
        any = any || (job->at.steps[i].capture & bits) != 0;
    }
    return any;
}

int job__refuse_attend(struct job *job) {
    const attn_model *m = job->srv->model;
    const attn_config *c = attn_model_config(m);
    char msg[200];
    const char *param = NULL;
    if (!job->is_kv && !attn_model_has_weights(m)) {
        snprintf(msg, sizeof msg,
                 "this server serves attention geometry alone (--geometry), with no weights to "
                 "project x: POST /v1/kv/attend takes q, k and v");
        param = job->at.steps != NULL ? "steps" : "x";
    } else if (c->kv_lora_rank > 0 && has_capture(job, API_CAPTURE_K | API_CAPTURE_V)) {
        snprintf(msg, sizeof msg,
                 "capture: the model's multi-head latent attention has no per-head k and v (its "
                 "cache holds a latent); q and head_out can be captured");
        param = "capture";
    } else if (job->is_kv && attn_config_layer_is_linear(c, job->at.layer)) {
        snprintf(msg, sizeof msg,
                 "layer %d is linear attention: POST /v1/kv/attend serves softmax attention "
                 "layers",
                 (int)job->at.layer);
        param = "layer";
    }
    if (param == NULL) {
        return 0;
    }
    route_reply_error(job->rq, ERROR_INVALID_REQUEST, msg, param);
    return -1;
}

void job_submit_kv_attend(struct route_req *rq) {
    struct job *job = job__new(rq, JOB_ATTEND);
    if (job != NULL) {
        job->is_kv = true;
        job__parse_then_admit(job);
    }
}

void job_submit_attend(struct route_req *rq) {
    struct job *job = job__new(rq, JOB_ATTEND);
    if (job != NULL) {
        job__parse_then_admit(job);
    }
}
