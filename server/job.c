/* server/job.c: the scheduled requests (see job.h): what every job shares (its life, the
 * answer), and a body's parse and admission. A job is one request's state from submit to
 * answer: the parsed body, output buffers, the temporary cache of a stateless forward, and the
 * answer that a worker encoded. The pool calls prepare (loop: resolve caches, check lengths),
 * run (worker: encode the answer), done (loop: answer, release pins) and release (free). The
 * forward (POST /v1/attend, /v1/kv/attend) is in job_attend.c, stateless SDPA in job_sdpa.c,
 * the session operations in job_session.c, batches in job_batch.c.
 */
#include "job.h"
#include "job_int.h"

#include <errno.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "error.h"
#include "snapshot.h"
#include "utf8.h"

/* Bodies larger than this are parsed on a libuv pool thread (main sizes the pool one thread
 * above --workers for this), so that the loop, and with it health, readiness and metrics, never
 * stalls on a big JSON parse: a 10 MB body takes a few hundred ms. */
#define PARSE_OFFLOAD_BYTES ((size_t)256 * 1024)

int64_t job__now_ms(void) {
    return (int64_t)(uv_hrtime() / 1000000);
}

int job__set_err(struct job *job, int code, const char *param, const char *fmt, ...) {
    strbuf_copy_string(job->err_param, sizeof job->err_param, param ? param : "");
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
    /* either array alone: job__batch_admit frees the batch when one of its two callocs failed
     * (the steps' leaked when only the slots' did; found by an outside audit's fault injector) */
    if (job->slots != NULL || job->steps != NULL) {
        job__batch_release(job);
    }
    /* Loop thread, with no worker on the job: its own caches go back to the pool. */
    attn_kv_destroy(job->temp_kv);
    attn_kv_destroy(job->temp_cross);
    api_attend_request_release(&job->at);
    api_sdpa_request_release(&job->sd);
    free(job->attn_q);
    free(job->body_block); /* after the request, whose tensors may lie in it */
    free(job->out);
    free(job->weights);
    free(job->selected);
    for (int i = 0; i < 4; i++) {
        free(job->captures[i]);
    }
    free(job->response);
    strbuf_release(&job->event);
    strbuf_release(&job->room);
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
    if (job->parent != NULL && job->pj.session != NULL) {
        /* A step's pin goes to its batch, which keeps it until the call has answered: a later
         * step of the call (its own engine call when the steps' tokens are more than
         * --max-batch-tokens) that needs room in the KV pool must not evict a session this call
         * has just stepped, answered 200 but gone (found by an outside audit). */
        job->parent->slots[job->slot].pinned = job->pj.session;
        job->pj.session = NULL;
        return;
    }
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
    char n[32]; /* without printf, per answer (see strbuf_copy_string) */
    n[strbuf_format_int(n, (long long)json_len)] = '\0';
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
    } else if (status == ERROR_INTERNAL && job->err_message[0] == '\0' && why[0] != '\0' &&
               session_restore_error(job->pj.session) == ERROR_INTERNAL) {
        /* a restore that could not remove the file it read (spill.c restored_file_removed) */
        job__set_err(job, status, "session_id", "the session stays on disk: %s", why);
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

void job__count_cancelled(struct job *job, int status) {
    if (status == ERROR_CANCELLED) {
        job->srv->metrics.jobs_cancelled++;
    }
}

enum pool_after job__simple_done(struct pool_job *pj, int status) {
    struct job *job = (struct job *)pj;
    job__count_cancelled(job, status);
    job__answer(job, status);
    job__unpin(job);
    return POOL_AFTER_FINISHED;
}

/* ---- parsing and admission ------------------------------------------------------------------ */

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
    if (job->kind == JOB_ATTEND && job__refuse_attend(job) != 0) {
        job__free(job);
    } else if (job->kind == JOB_ATTEND && job->at.steps != NULL) {
        job__batch_admit(job);
    } else if (job->kind == JOB_ATTEND) {
        job__attend_admit(job);
    } else if (job->kind == JOB_IMPORT) {
        job__import_admit(job);
    } else {
        job__sdpa_admit(job);
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
    if ((job->kind == JOB_ATTEND || job->kind == JOB_SDPA) && job->request_json_len >= 0) {
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
