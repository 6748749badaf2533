/* server/job.c: the scheduled requests (see job.h): what every job shares (its life, the
 * answer), the forward (POST /v1/attend) and stateless SDPA. A job is one request's state from
 * submit to answer: the parsed body, output buffers, the temporary cache of a stateless forward,
 * and the answer that a worker encoded. The pool calls prepare (loop: resolve caches, check
 * lengths), run (worker: encode the answer), done (loop: answer, release pins) and release
 * (free). The session operations are in job_session.c, batches in job_batch.c.
 */
#include "job.h"
#include "job_int.h"

#include <errno.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "error.h"
#include "log.h"
#include "snapshot.h"
#include "utf8.h"

/* The largest SDPA scratch a request may ask the engine for (bytes). */
#define SDPA_SCRATCH_MAX ((size_t)1 << 30)

/* Bodies larger than this are parsed on a libuv pool thread (main sizes the pool one thread
 * above --workers for this), so that the loop, and with it health, readiness and metrics, never
 * stalls on a big JSON parse: a 10 MB body takes a few hundred ms. */
#define PARSE_OFFLOAD_BYTES ((size_t)256 * 1024)

int64_t job__now_ms(void) {
    return (int64_t)(uv_hrtime() / 1000000);
}

int job__set_err(struct job *job, int code, const char *param, const char *fmt, ...) {
    snprintf(job->err_param, sizeof job->err_param, "%s", param ? param : "");
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(job->err_message, sizeof job->err_message, fmt, ap);
    va_end(ap);
    utf8_trim_partial(job->err_message); /* a message cut at the buffer's end stays UTF-8 */
    return code;
}

/* ---- common --------------------------------------------------------------------------------- */

struct job *job__new(struct route_req *rq, enum job_kind kind) {
    struct job *job = calloc(1, sizeof *job);
    if (job == NULL) {
        route_reply_error(rq, ERROR_INTERNAL, "out of memory", NULL);
        return NULL;
    }
    job->kind = kind;
    job->srv = rq->srv;
    job->rq = rq;
    job->request_json_len = -1;
    strbuf_init(&job->event);
    return job;
}

void job__free(struct job *job) {
    /* A batch's or a step's links first: they read the batch's step count, which the release of
     * its request below clears. */
    if (job->parent != NULL) {
        job__batch_step_freed(job);
    }
    if (job->slots != NULL) {
        job__batch_release(job);
    }
    /* Loop thread, with no worker on the job: its own caches go back to the pool. */
    attn_kv_destroy(job->temp_kv);
    attn_kv_destroy(job->temp_cross);
    api_attend_request_release(&job->at);
    api_sdpa_request_release(&job->sd);
    free(job->body_block); /* after the request, whose tensors may lie in it */
    free(job->out);
    free(job->weights);
    free(job->selected);
    for (int i = 0; i < 4; i++) {
        free(job->captures[i]);
    }
    free(job->response);
    strbuf_release(&job->event);
    if (job->rq != NULL) {
        job->rq->job = NULL;
    }
    free(job);
}

void job__refuse(struct job *job, int code, const char *message, const char *param) {
    if (job->parent != NULL) {
        job__set_err(job, code, param, "%s", message != NULL ? message : "");
        job__batch_step_answered(job, code);
    } else if (job->rq != NULL) { /* a client gone takes no answer */
        route_reply_error(job->rq, code, message, param);
    }
}

bool job__is_gone(const struct job *job) {
    return job->parent != NULL ? job->parent->rq == NULL : job->rq == NULL;
}

void job__on_release(struct pool_job *pj) {
    job__free((struct job *)pj);
}

void job__unpin(struct job *job) {
    if (job->pj.session != NULL) {
        session_unpin(job->srv->sessions, job->pj.session, job__now_ms());
        job->pj.session = NULL;
    }
}

/* The request header Inference-Header-Content-Length (the binary tensor extension): the length
 * of the body's JSON part, the raw tensors after it. Returns 0 (job->request_json_len set, -1
 * when absent) or answers 400 and returns -1. */
static int read_framing(struct job *job) {
    job->request_json_len = -1;
    const char *h = http_request_header(job->rq->http, "Inference-Header-Content-Length");
    if (h == NULL) {
        return 0;
    }
    char *end;
    errno = 0;
    unsigned long long n = strtoull(h, &end, 10);
    if (errno != 0 || end == h || *end != '\0' || h[0] < '0' || h[0] > '9' || n > job->body_len ||
        n == 0) {
        /* 0 would leave no JSON part: the framing, not the JSON, is what is wrong */
        char msg[160];
        snprintf(msg, sizeof msg,
                 "Inference-Header-Content-Length: expected the JSON part's length in bytes, from "
                 "1 to the body's %zu",
                 job->body_len);
        route_reply_error(job->rq, ERROR_INVALID_REQUEST, msg, "Inference-Header-Content-Length");
        return -1;
    }
    job->request_json_len = (int64_t)n;
    return 0;
}

void job__binary_answer(struct job *job, enum api_encoding enc) {
    job->is_framed = enc == API_ENCODING_BINARY;
    if (job->is_framed) {
        job->response_type = "application/octet-stream";
    }
}

/* The answer's Inference-Header-Content-Length: its JSON part's length. */
static void add_framing_header(struct job *job, size_t json_len) {
    char n[32];
    snprintf(n, sizeof n, "%zu", json_len);
    http_request_add_header(job->rq->http, "Inference-Header-Content-Length", n);
}

/* Answers the request (if its client is still there) with the job's response or the error. */
void job__answer(struct job *job, int status) {
    if (status == ATTN_EOVERFLOW && job->err_message[0] == '\0') {
        /* the table's text, which names the flags that mend it, over the engine's; with an f32
         * cache, or a linear layer's state (double whatever the dtype), there is no wider dtype
         * to offer: float32 itself overflowed */
        bool is_f32 =
            attn_kv_pool_dtype(session_store_kv_pool(job->srv->sessions)) == ATTN_DTYPE_F32 ||
            (job->kind == JOB_ATTEND &&
             attn_config_layer_is_linear(attn_model_config(job->srv->model), job->at.layer));
        job__set_err(job, status, NULL, "%s",
                     is_f32 ? "a key or value is not finite: a projection or RoPE overflowed "
                              "float32; the call appended nothing (a stream: nothing from the "
                              "token that met it on): send smaller inputs"
                            : error_info_get(status)->message);
    }
    const char *why = job->pj.session != NULL ? session_restore_reason(job->pj.session) : "";
    if ((status == ERROR_SESSION_LOST || status == ERROR_SESSION_FILE_FOREIGN) &&
        job->err_message[0] == '\0' && why[0] != '\0') {
        /* the table's text, with the file's own reason */
        job__set_err(job, status, "session_id", "%s: %s",
                     status == ERROR_SESSION_LOST ? "the session's file failed its checks"
                                                  : "the session's file is left alone",
                     why);
    }
    if (job->parent != NULL) {
        job__batch_step_answered(job, status);
        return;
    }
    if (job->rq == NULL || status == ERROR_CANCELLED) {
        return;
    }
    if (status == 0 && job->is_framed && job->raw.n > 0) {
        void *buffers[JOB_BUFFERS];
        job__take_buffers(job, buffers);
        const struct api_raw_parts *raws[1] = {&job->raw};
        char *json = job->response;
        job->response = NULL;
        job__reply_parts(job, json, job->response_json_len, raws, 1, buffers, JOB_BUFFERS);
        return;
    }
    if (status == 0 && job->is_framed) {
        add_framing_header(job, job->response_json_len);
    }
    if (status == 0 && job->response_type != NULL) {
        route_reply_typed(job->rq, job->response_status, job->response_type, job->response,
                          job->response_len);
        job->response = NULL;
    } else if (status == 0) {
        route_reply(job->rq, job->response_status, job->response, job->response_len);
        job->response = NULL;
    } else {
        route_reply_error(job->rq, status, job->err_message, job->err_param);
    }
}

void job__take_buffers(struct job *job, void **to) {
    void **from[JOB_BUFFERS] = {(void **)&job->out,         (void **)&job->weights,
                                (void **)&job->selected,    (void **)&job->captures[0],
                                (void **)&job->captures[1], (void **)&job->captures[2],
                                (void **)&job->captures[3]};
    for (int i = 0; i < JOB_BUFFERS; i++) {
        to[i] = *from[i];
        *from[i] = NULL;
    }
}

/* What a framed answer sent from parts holds until the connection has sent it. */
struct held_answer {
    char *json;
    int n_buffers;
    void *buffers[]; /* (n_buffers) */
};

static void held_answer_free(void *p) {
    struct held_answer *h = p;
    free(h->json);
    for (int i = 0; i < h->n_buffers; i++) {
        free(h->buffers[i]);
    }
    free(h);
}

void job__reply_parts(struct job *job, char *json, size_t json_len,
                      const struct api_raw_parts *const *raws, int n_raws, void **buffers,
                      int n_buffers) {
    int n_parts = 1;
    for (int i = 0; i < n_raws; i++) {
        n_parts += raws[i]->n;
    }
    struct held_answer *h = malloc(sizeof *h + (size_t)n_buffers * sizeof(void *));
    struct http_part *parts = malloc((size_t)n_parts * sizeof *parts);
    if (h == NULL || parts == NULL) {
        free(h);
        free(parts);
        free(json);
        for (int i = 0; i < n_buffers; i++) {
            free(buffers[i]);
        }
        route_reply_error(job->rq, ERROR_INTERNAL, "out of memory for the answer", NULL);
        return;
    }
    h->json = json;
    h->n_buffers = n_buffers;
    memcpy(h->buffers, buffers, (size_t)n_buffers * sizeof(void *));
    parts[0] = (struct http_part){json, json_len};
    int k = 1;
    for (int i = 0; i < n_raws; i++) {
        for (int j = 0; j < raws[i]->n; j++) {
            parts[k++] = (struct http_part){raws[i]->data[j], raws[i]->bytes[j]};
        }
    }
    add_framing_header(job, json_len);
    route_reply_parts(job->rq, job->response_status,
                      job->response_type != NULL ? job->response_type : "application/json", parts,
                      n_parts, held_answer_free, h);
    free(parts);
}

/* Finds the live session named rq->session (bringing it back from disk if it is there) and pins
 * it for job, or answers 404/410 (or why it cannot come back). */
int job__pin_path_session(struct job *job) {
    struct route_req *rq = job->rq;
    enum session_state state;
    int rc;
    struct session *s = route_find_session(job->srv, rq->session, &state, &rc);
    if (s == NULL) {
        route_reply_error(rq, rc, NULL, "session_id");
        return -1;
    }
    session_pin(job->srv->sessions, s, job__now_ms());
    job->pj.session = s;
    return 0;
}

/* Queues the job; on a full queue answers 429 and frees it. A refused job never had its
 * session's turn, so it cannot have touched (and must not touch) any cache: it only gives back
 * its pin, which removes a session that this request alone had created. */
void job__submit(struct job *job) {
    int rc = pool_submit(job->srv->pool, &job->pj);
    if (rc != 0) {
        job__refuse(job, rc, NULL, NULL);
        job__unpin(job);
        job__free(job);
        return;
    }
    if (job->rq != NULL) {
        job->rq->job = job;
    }
}

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
    if (job->at.sel.is_set) {
        struct api_error e;
        memset(&e, 0, sizeof e);
        if (api_selection_resolve(&job->at.sel, lim->n_heads, job->at.n_tokens, n_keys, 1, &e) !=
            0) {
            return job__set_err(job, e.code, e.param, "%s", e.message);
        }
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

/* Allocates the output buffers once n_past (the self cache's length) and n_keys (the keys the
 * queries see: n_past + T, or a context's tokens) are known, after the length checks. */
static int attend_size(struct job *job, int32_t n_past, int32_t n_keys) {
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
    int64_t n_weights = (int64_t)lim->n_heads * (job->at.stream ? 1 : t) * n_keys;
    if (job->at.return_weights && !job->at.sel.is_set &&
        (int64_t)lim->n_heads * t * n_keys > API_WEIGHTS_MAX_VALUES) {
        return job__set_err(job, ERROR_INVALID_REQUEST, "return_weights",
                            "return_weights: n_heads x T x %s = %lld values exceed the limit of %d",
                            job->at.is_cross ? "context tokens" : "(n_past + T)",
                            (long long)lim->n_heads * t * n_keys, API_WEIGHTS_MAX_VALUES);
    }
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
    int rc = inspect_size(job, n_keys);
    int64_t n_returned = is_full              ? n_weights
                         : job->at.sel.is_set ? api_selection_values(&job->at.sel, lim->n_heads)
                                              : 0;
    if (rc != 0 || (rc = charge_batch_weights(job, n_returned)) != 0) {
        return rc;
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
        step->out = job->out;
    } else {
        int32_t i = job->next_index;
        step->x = job->at.x + (size_t)i * hidden;
        step->n_tokens = 1;
        step->positions = job->at.positions != NULL ? &job->at.positions[i] : NULL;
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
        job->response =
            api_attend_response_encode(&r, &job->response_len, &job->response_json_len, &job->raw);
        job->response_status = 200;
        job__binary_answer(job, job->at.encoding);
        return job->response != NULL ? 0
                                     : job__set_err(job, ERROR_INTERNAL, NULL,
                                                    "out of memory encoding the job__answer");
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

static void count_cancelled(struct job *job, int status) {
    if (status == ERROR_CANCELLED) {
        job->srv->metrics.jobs_cancelled++;
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
    count_cancelled(job, status);
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
        snprintf(job->at.session_id, sizeof job->at.session_id, "%s", hdr);
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
        snprintf(rq->session, sizeof rq->session, "%s", job->at.session_id); /* for its log line */
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
             * idle session). */
            char msg[320]; /* a 128-character id and the text around it */
            const char *param = NULL;
            int code = ERROR_INVALID_REQUEST;
            if (job->at.has_expect_n_past && job->at.expect_n_past != 0) {
                code = ERROR_N_PAST_MISMATCH;
                param = "expect_n_past";
                snprintf(msg, sizeof msg, "expect_n_past is %d but the cache holds 0 tokens",
                         (int)job->at.expect_n_past);
            } else if (job->at.key_mask != NULL && job->at.n_key_mask != job->at.n_tokens) {
                param = "key_mask";
                snprintf(msg, sizeof msg,
                         "key_mask has %d values; the cache holds 0 tokens and x brings %d, so it "
                         "needs %d",
                         (int)job->at.n_key_mask, (int)job->at.n_tokens, (int)job->at.n_tokens);
            } else if (job->at.is_cross && job->at.context == NULL) {
                param = "cross";
                snprintf(msg, sizeof msg,
                         "cross: session %s holds no context at layer %d; send it in context",
                         job->at.session_id, (int)job->at.layer);
            }
            if (param != NULL) {
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

static void sdpa_admit(struct job *job);

/* /v1/kv/attend on a model with multi-head latent attention, refused before its body is read. */
#define MLA_HAS_NO_KV                                                                              \
    "the model's multi-head latent attention caches a latent, not per-head k and v: "              \
    "POST /v1/kv/attend does not serve it"

/* Any thread: parses the body into the job (touches nothing else; limits are immutable). A
 * body framed by the binary tensor extension is its JSON, then the raw tensors. */
static void parse_body(struct job *job) {
    struct api_body body = {job->body, job->body_len, NULL, 0, false};
    if (job->request_json_len >= 0) {
        body.json_len = (size_t)job->request_json_len;
        body.binary = (const uint8_t *)job->body + body.json_len;
        body.binary_len = job->body_len - body.json_len;
        body.may_borrow = job->body_block != NULL; /* freed after the request, in job__free */
    }
    if (job->kind == JOB_ATTEND && job->is_kv &&
        attn_model_config(job->srv->model)->kv_lora_rank > 0) {
        /* before the shapes: a latent model's k and v have no shape to be checked against (its
         * geometry's one K/V head of qk_nope + qk_rope dims is the engine's, not the caller's) */
        job->parse_rc = ERROR_INVALID_REQUEST;
        snprintf(job->parse_err.message, sizeof job->parse_err.message, "%s", MLA_HAS_NO_KV);
        snprintf(job->parse_err.param, sizeof job->parse_err.param, "k");
    } else if (job->kind == JOB_ATTEND && job->is_kv) {
        job->parse_rc =
            api_kv_attend_request_parse_body(&body, &job->srv->limits, &job->at, &job->parse_err);
    } else if (job->kind == JOB_ATTEND) {
        job->parse_rc =
            api_attend_request_parse_body(&body, &job->srv->limits, &job->at, &job->parse_err);
    } else if (job->kind == JOB_IMPORT) {
        /* the file's framing and checksum: the part of an import that reads every byte */
        struct snapshot_info info;
        job->parse_rc = snapshot_check((const uint8_t *)job->body, job->body_len, &info,
                                       job->parse_err.message, sizeof job->parse_err.message);
        snprintf(job->parse_err.param, sizeof job->parse_err.param, "body");
    } else {
        job->parse_rc = api_sdpa_request_parse_body(&body, &job->sd, &job->parse_err);
    }
}

/* Whether the request, or any step of its batch, captures one of these tensors. */
static bool has_capture(const struct job *job, uint32_t bits) {
    bool any = (job->at.capture & bits) != 0;
    for (int32_t i = 0; i < job->at.n_steps; i++) {
        any = any || (job->at.steps[i].capture & bits) != 0;
    }
    return any;
}

/* What the model cannot do for an attend, whatever its sessions: x with no weights to project
 * it (--geometry), captured k/v of a latent cache, or q/k/v for a linear layer (q/k/v for a
 * latent cache never get here: parse_body refuses them). Answers 400 and returns -1. */
static int refuse_attend(struct job *job) {
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

/* Loop: answers a parse error, or admits the request. */
static void admit(struct job *job) {
    job->body = NULL; /* the request's buffer; not needed any more */
    if (job->rq == NULL) {
        job__free(job); /* the client is gone (a reset, or shutdown) while a pool thread parsed */
        return;
    }
    job->rq->job = NULL;
    if (job->parse_rc != 0) {
        route_reply_error(job->rq, job->parse_rc, job->parse_err.message, job->parse_err.param);
        job__free(job);
        return;
    }
    if (job->kind == JOB_ATTEND && refuse_attend(job) != 0) {
        job__free(job);
    } else if (job->kind == JOB_ATTEND && job->at.steps != NULL) {
        job__batch_admit(job);
    } else if (job->kind == JOB_ATTEND) {
        job__attend_admit(job);
    } else if (job->kind == JOB_IMPORT) {
        job__import_admit(job);
    } else {
        sdpa_admit(job);
    }
}

static void parse_work_cb(uv_work_t *w) {
    parse_body(w->data);
}

static void parse_after_cb(uv_work_t *w, int status) {
    struct job *job = w->data;
    job->is_parsing = false;
    admit(job);
}

/* Parses the request body, on a pool thread when it is large, then admits the job. */
void job__parse_then_admit(struct job *job) {
    job->body = http_request_body(job->rq->http, &job->body_len);
    if (job->kind != JOB_IMPORT && read_framing(job) != 0) {
        job__free(job);
        return;
    }
    if (job->kind == JOB_ATTEND && job->request_json_len >= 0) {
        /* framed: the job keeps the body, so its tensors are read where they lie */
        job->body = http_request_take_body(job->rq->http, &job->body_len, &job->body_block);
    }
    if (job->body_len > PARSE_OFFLOAD_BYTES) {
        job->parse_work.data = job;
        /* The connection stays suspended (no answer yet), but a reset closes it all the same:
         * job_client_gone then takes the body's buffer from the request, for the parse. */
        if (uv_queue_work(job->srv->loop, &job->parse_work, parse_work_cb, parse_after_cb) == 0) {
            job->is_parsing = true;
            job->rq->job = job;
            return;
        }
    }
    parse_body(job);
    admit(job);
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

/* ---- POST /v1/sdpa -------------------------------------------------------------------------- */

static void sdpa_params(const struct api_sdpa_request *sd, attn_sdpa_params *p) {
    memset(p, 0, sizeof *p);
    p->n_heads = sd->n_heads;
    p->n_kv_heads = sd->n_kv_heads;
    p->n_q = sd->n_q;
    p->n_k = sd->n_k;
    p->d_k = sd->d_k;
    p->d_v = sd->d_v;
    p->q = sd->q;
    p->k = sd->k;
    p->v = sd->v;
    p->is_causal = sd->causal;
    p->window = sd->window;
    p->scale = sd->scale;
    p->mask = sd->mask;
    p->mask_ld = sd->mask_ld;
    p->kind = sd->is_linear ? ATTN_SDPA_LINEAR : ATTN_SDPA_SOFTMAX;
}

/* Points p's tensors at batch b of sd's (and of out and weights). */
static void sdpa_params_at(const struct api_sdpa_request *sd, int32_t b, float *out, float *weights,
                           float *selected, attn_inspect *ins, attn_sdpa_params *p) {
    if (selected != NULL) {
        *ins = api_selection_inspect(
            &sd->sel, selected + (size_t)b * api_selection_values(&sd->sel, sd->n_heads));
        p->inspect = ins;
    }
    size_t hq = (size_t)sd->n_heads * sd->n_q, hk = (size_t)sd->n_kv_heads * sd->n_k;
    p->q = sd->q + (size_t)b * hq * sd->d_k;
    p->k = sd->k + (size_t)b * hk * sd->d_k;
    p->v = sd->v + (size_t)b * hk * sd->d_v;
    p->out = out + (size_t)b * hq * sd->d_v;
    p->weights = weights != NULL ? weights + (size_t)b * hq * sd->n_k : NULL;
    p->mask = sd->mask != NULL ? sd->mask + (size_t)b * sd->mask_batch_stride : NULL;
}

/* The engine's cancel check: polled by the worker between tiles. */
static bool sdpa_is_cancelled(void *ctx) {
    struct job *job = ctx;
    return atomic_load_explicit(&job->is_abandoned, memory_order_relaxed);
}

static int sdpa_prepare(struct pool_job *pj, struct pool_step *step) {
    return ((struct job *)pj)->rq == NULL ? ERROR_CANCELLED : 0;
}

/* Worker: the whole computation, with buffers of its own. */
static int sdpa_run(struct pool_job *pj, int status) {
    struct job *job = (struct job *)pj;
    const struct api_sdpa_request *sd = &job->sd;
    attn_sdpa_params p;
    sdpa_params(sd, &p);
    size_t n_out = (size_t)sd->n_batch * sd->n_heads * sd->n_q * sd->d_v;
    size_t n_w = (size_t)sd->n_batch * sd->n_heads * sd->n_q * sd->n_k;
    float *out = malloc(n_out * sizeof(float));
    bool is_full = sd->return_weights && !sd->sel.is_set;
    float *weights = is_full ? malloc(n_w * sizeof(float)) : NULL;
    size_t n_sel =
        sd->sel.is_set ? (size_t)(sd->n_batch * api_selection_values(&sd->sel, sd->n_heads)) : 0;
    float *selected = sd->sel.is_set ? malloc((n_sel > 0 ? n_sel : 1) * sizeof(float)) : NULL;
    attn_inspect ins;
    if (selected != NULL) {
        ins = api_selection_inspect(&sd->sel, selected);
        p.inspect = &ins; /* sized with it */
    }
    p.out = out;
    p.weights = weights;
    p.is_cancelled = sdpa_is_cancelled;
    p.cancel_ctx = job;
    /* Every batch has the same dimensions, so one scratch serves them in turn. */
    void *scratch = out != NULL ? malloc(attn_sdpa_scratch_bytes(&p) + 64) : NULL;
    int rc = job__set_err(job, ERROR_INTERNAL, NULL, "out of memory for the computation");
    if (out != NULL && scratch != NULL && (weights != NULL || !is_full) &&
        (selected != NULL || !sd->sel.is_set)) {
        double t0 = (double)uv_hrtime() / 1e6;
        rc = ATTN_OK;
        for (int32_t b = 0; b < sd->n_batch && rc == ATTN_OK; b++) {
            sdpa_params_at(sd, b, out, weights, selected, &ins, &p);
            rc = attn_sdpa(&p, scratch);
        }
        double ms = (double)uv_hrtime() / 1e6 - t0;
        if (rc == ATTN_OK) {
            struct api_sdpa_response r = {
                .n_batch = sd->n_batch,
                .is_batched = sd->is_batched,
                .n_heads = sd->n_heads,
                .n_q = sd->n_q,
                .n_k = sd->n_k,
                .d_v = sd->d_v,
                .output = out,
                .weights = weights,
                .sel = sd->sel.is_set ? &sd->sel : NULL,
                .selected = selected,
                .timing = {pj->queue_ms, ms},
                .encoding = sd->encoding,
            };
            job->response =
                api_sdpa_response_encode(&r, &job->response_len, &job->response_json_len);
            job->response_status = 200;
            job__binary_answer(job, sd->encoding);
            rc = job->response != NULL ? 0
                                       : job__set_err(job, ERROR_INTERNAL, NULL,
                                                      "out of memory encoding the job__answer");
        } else if (rc == ATTN_ECANCELED) {
            rc = ERROR_CANCELLED;
        } else {
            job__set_err(job, ERROR_INVALID_REQUEST, "q", "the engine refused the tensors: %s",
                         attn_strerror(rc));
            rc = ERROR_INVALID_REQUEST;
        }
    }
    free(scratch);
    free(weights);
    free(selected);
    free(out);
    return rc;
}

enum pool_after job__simple_done(struct pool_job *pj, int status) {
    struct job *job = (struct job *)pj;
    count_cancelled(job, status);
    job__answer(job, status);
    job__unpin(job);
    return POOL_AFTER_FINISHED;
}

static const struct pool_job_ops sdpa_ops = {sdpa_prepare, sdpa_run, job__simple_done,
                                             job__on_release};

static void sdpa_admit(struct job *job) {
    struct route_req *rq = job->rq;
    /* The size query reads only dims and checks pointers, so q stands in for the output. */
    attn_sdpa_params p;
    sdpa_params(&job->sd, &p);
    p.out = job->sd.q;
    size_t scratch = attn_sdpa_scratch_bytes(&p);
    if (scratch == 0 || scratch > SDPA_SCRATCH_MAX) {
        route_reply_error(rq, ERROR_INVALID_REQUEST,
                          "q, k, v: dimensions beyond what one request may compute", "q");
        job__free(job);
        return;
    }
    job->pj.kind = POOL_JOB_SDPA;
    job->pj.ops = &sdpa_ops;
    job__submit(job);
}

void job_submit_sdpa(struct route_req *rq) {
    struct job *job = job__new(rq, JOB_SDPA);
    if (job != NULL) {
        job__parse_then_admit(job);
    }
}

/* ---- notifications from the request ---------------------------------------------------------- */

void job_stream_drained(struct job *job) {
    if (job->kind == JOB_ATTEND && job->at.stream) {
        pool_job_ready(job->srv->pool, &job->pj);
    }
}

void job_client_gone(struct job *job) {
    if (job->slots != NULL) {
        job__batch_client_gone(job); /* a batch: its steps are the jobs in the pool */
        return;
    }
    if (job->is_parsing) {
        /* MHD closes a suspended connection whose socket reports an error (a client that sent
         * its body and reset), and frees the request with its body: the pool thread parsing it
         * keeps reading, so the buffer is the job's until the parse is over. */
        if (job->body_block == NULL) {
            size_t len = 0;
            (void)http_request_take_body(job->rq->http, &len, &job->body_block);
        }
    }
    job->rq = NULL;
    atomic_store_explicit(&job->is_abandoned, true, memory_order_relaxed);
    pool_job_ready(job->srv->pool, &job->pj);
}
