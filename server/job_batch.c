/* server/job_batch.c: many sessions' steps in one call (POST /v1/attend with "steps"). The
 * batch's job keeps the HTTP request; each step becomes an attend job of its own (no request:
 * it reports to its batch), admitted and queued in one loop turn, so the pool's dispatch finds
 * their decode steps ready together and runs them as one engine call on the shared layer
 * (continuous batching: one GEMM over every step's tokens, the weights read once). Each step is
 * checked, queued, run and answered exactly as it would be alone: a step that fails (its session
 * evicted, expect_n_past off, the pool full) fails alone and changes nothing, the others run.
 * The steps' sessions stay pinned until the batch has answered, so no step evicts a session of
 * its own call. When the last step has answered, the batch answers 200 with every step's result
 * in order.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "error.h"
#include "job_int.h"

/* A failed step's error object at most: its session id, message and param each escaped at up
 * to 6 bytes a byte (\u00XX), and the names and status around them. */
#define BATCH_ERROR_BYTES                                                                          \
    (6 * (API_SESSION_ID_MAX + sizeof(((struct batch_slot *)0)->message) +                         \
          sizeof(((struct batch_slot *)0)->param)) +                                               \
     256)
/* A step's job: an attend without a request of its own. */
static struct job *step_new(struct job *batch, int32_t i) {
    struct job *step = calloc(1, sizeof *step);
    if (step == NULL) {
        return NULL;
    }
    step->kind = JOB_ATTEND;
    step->srv = batch->srv;
    step->parent = batch;
    step->slot = i;
    step->request_json_len = -1;
    strbuf_init(&step->event);
    /* the step takes its parsed request over: the batch's copy is left empty */
    step->at = batch->at.steps[i];
    memset(&batch->at.steps[i], 0, sizeof batch->at.steps[i]);
    return step;
}

/* A framed batch's answer whose steps' tensors are in their buffers: the JSON in b, then every
 * ok step's tensors from where they lie, in step order (each step's in its fields' order). */
static void finish_from_parts(struct job *batch, struct strbuf *b, size_t json_len) {
    int32_t n = batch->at.n_steps;
    const struct api_raw_parts **raws = malloc((size_t)n * sizeof *raws);
    void **buffers = malloc((size_t)n * JOB_BUFFERS * sizeof *buffers);
    int n_raws = 0, n_buffers = 0;
    for (int32_t i = 0; raws != NULL && buffers != NULL && i < n; i++) {
        struct batch_slot *s = &batch->slots[i];
        if (s->status == 0) {
            raws[n_raws++] = &s->raw;
        }
        for (int k = 0; k < JOB_BUFFERS; k++) {
            buffers[n_buffers++] = s->buffers[k]; /* the answer frees them once sent */
            s->buffers[k] = NULL;
        }
    }
    char *json = raws != NULL && buffers != NULL ? strbuf_detach(b, NULL) : NULL;
    if (json == NULL) {
        strbuf_release(b);
        for (int i = 0; i < n_buffers; i++) {
            free(buffers[i]);
        }
        job__refuse(batch, ERROR_INTERNAL, "out of memory encoding the answer", NULL);
    } else if (batch->rq != NULL) {
        batch->response_status = 200;
        job__binary_answer(batch, batch->at.encoding);
        job__reply_parts(batch, json, json_len, raws, n_raws, buffers, n_buffers);
    } else {
        free(json);
        for (int i = 0; i < n_buffers; i++) {
            free(buffers[i]);
        }
    }
    free(raws);
    free(buffers);
    job__free(batch);
}

/* Every step has answered: the batch's answer, its results in step order. Framed answers (the
 * binary tensor extension) put every step's raw tensors after the one JSON, in the same order
 * as their fields. */
static void finish(struct job *batch) {
    /* its room was taken before any step ran: the answer of steps that changed their sessions
     * cannot fail for want of memory (it was 500 out of memory, every session advanced) */
    struct strbuf b = batch->room;
    strbuf_init(&batch->room);
    /* room for every step's answer at once (an error object at most BATCH_ERROR_BYTES), so the
     * answer is not copied again as it grows */
    size_t room = 64;
    for (int32_t i = 0; i < batch->at.n_steps; i++) {
        room += batch->slots[i].status == 0 ? batch->slots[i].len + 1 : BATCH_ERROR_BYTES;
    }
    strbuf_reserve(&b, room);
    api_batch_open(&b, batch->at.layer);
    bool is_framed = batch->at.encoding == API_ENCODING_BINARY;
    for (int32_t i = 0; i < batch->at.n_steps; i++) {
        struct batch_slot *s = &batch->slots[i];
        if (i > 0) {
            strbuf_putc(&b, ',');
        }
        if (s->status != 0) {
            api_batch_error_put(&b, s->session_id, s->status, s->message, s->param);
            continue;
        }
        /* its JSON, without the newline that ends a whole answer */
        size_t n = is_framed ? s->json_len : s->len;
        while (n > 0 && s->response[n - 1] == '\n') {
            n--;
        }
        strbuf_append(&b, s->response, n);
    }
    api_batch_close(&b);
    size_t json_len = b.len;
    bool is_parts = false;
    for (int32_t i = 0; is_framed && i < batch->at.n_steps; i++) {
        struct batch_slot *s = &batch->slots[i];
        if (s->status == 0 && s->raw.n > 0) {
            is_parts = true; /* its tensors are in its buffers */
        } else if (s->status == 0) {
            strbuf_append(&b, s->response + s->json_len, s->len - s->json_len);
        }
    }
    if (is_parts && !b.has_failed) {
        finish_from_parts(batch, &b, json_len);
        return;
    }
    if (b.has_failed) {
        strbuf_release(&b);
        job__refuse(batch, ERROR_INTERNAL, "out of memory encoding the answer", NULL);
        job__free(batch);
        return;
    }
    batch->response_len = b.len;
    batch->response = strbuf_detach(&b, NULL);
    batch->response_status = 200;
    batch->response_json_len = json_len;
    job__binary_answer(batch, batch->at.encoding);
    job__answer(batch, 0);
    job__free(batch);
}

void job__batch_step_answered(struct job *step, int status) {
    struct job *batch = step->parent;
    struct batch_slot *s = &batch->slots[step->slot];
    strbuf_copy_string(s->session_id, sizeof s->session_id, step->at.session_id);
    s->status = status;
    if (status == 0) {
        s->response = step->response;
        s->len = step->response_len;
        s->json_len = step->response_json_len;
        step->response = NULL;
        s->raw = step->raw; /* its tensors stay in its buffers, which the slot keeps */
        job__take_buffers(step, s->buffers);
    } else {
        strbuf_copy_string(s->message, sizeof s->message, step->err_message);
        strbuf_copy_string(s->param, sizeof s->param, step->err_param);
        batch->n_weights -= step->n_charged; /* its weights are not in the answer */
        step->n_charged = 0;
    }
    if (--batch->n_open == 0) {
        finish(batch);
    }
}

void job__batch_step_freed(struct job *step) {
    if (step->parent->steps != NULL) {
        step->parent->steps[step->slot] = NULL;
    }
    step->parent = NULL;
}

void job__batch_admit(struct job *batch) {
    if (batch->rq != NULL && http_request_header(batch->rq->http, "X-Session-Id") != NULL) {
        /* one id for many sessions' steps: neither the steps' nor a proxy's to route by */
        job__refuse(batch, ERROR_INVALID_REQUEST,
                    "X-Session-Id names one session; a call with steps names each step's "
                    "session_id in its step",
                    "X-Session-Id");
        job__free(batch);
        return;
    }
    int32_t n = batch->at.n_steps;
    bool is_stateless = true;
    for (int32_t i = 0; i < n; i++) {
        is_stateless = is_stateless && batch->at.steps[i].session_id[0] == '\0';
    }
    batch->rq->is_answer_droppable = is_stateless; /* no step's answer is in a cache */
    for (int32_t i = 0; i < n; i++) {
        /* What a step's layer cannot compute is malformed, as a bad field is: the whole call is
         * refused naming the step, and nothing runs (the README's rule for a steps call). */
        char msg[200], param[64], full[240];
        const char *field = job__layer_refusal(batch->srv, &batch->at.steps[i], msg, sizeof msg);
        if (field != NULL) {
            snprintf(param, sizeof param, "steps[%d].%s", (int)i, field);
            snprintf(full, sizeof full, "steps[%d].%s", (int)i, msg);
            job__refuse(batch, ERROR_INVALID_REQUEST, full, param);
            job__free(batch);
            return;
        }
    }
    batch->slots = calloc((size_t)n, sizeof *batch->slots);
    batch->steps = calloc((size_t)n, sizeof *batch->steps);
    /* the answer's room: an error object a step (as finish counts them); each step adds its
     * answer's bytes when it is sized, before it runs (job__batch_room) */
    batch->room_want = 64 + (size_t)n * BATCH_ERROR_BYTES;
    if (batch->slots == NULL || batch->steps == NULL ||
        strbuf_reserve(&batch->room, batch->room_want) != 0) {
        job__refuse(batch, ERROR_INTERNAL, "out of memory", NULL);
        job__free(batch);
        return;
    }
    /* The sessions the steps name that are in memory, pinned while the steps are admitted: a
     * step that creates its session may evict an idle one for --max-sessions, and that must not
     * be a session a later step of this call continues (it was idle only because its step had
     * not been admitted yet). */
    struct session **held = calloc((size_t)n, sizeof *held);
    if (held == NULL) {
        job__refuse(batch, ERROR_INTERNAL, "out of memory", NULL);
        job__free(batch);
        return;
    }
    for (int32_t i = 0; i < n; i++) {
        const char *id = batch->at.steps[i].session_id;
        held[i] = id[0] != '\0' ? session_find(batch->srv->sessions, id, NULL) : NULL;
        if (held[i] != NULL) {
            session_pin(batch->srv->sessions, held[i], job__now_ms());
        }
    }
    /* One more than the steps while they are admitted: a step refused at once answers inside
     * this loop, and the batch must not finish (and be freed) before the loop is over. */
    batch->n_open = n + 1;
    batch->rq->job = batch;
    for (int32_t i = 0; i < n; i++) {
        struct job *step = step_new(batch, i);
        if (step == NULL) {
            batch->slots[i].status = ERROR_INTERNAL;
            snprintf(batch->slots[i].message, sizeof batch->slots[i].message, "out of memory");
            batch->n_open--;
            continue;
        }
        batch->steps[i] = step;
        job__attend_admit(step); /* queues it, or refuses it (answering its slot) */
    }
    for (int32_t i = 0; i < n; i++) {
        if (held[i] != NULL) {
            session_unpin(batch->srv->sessions, held[i], job__now_ms());
        }
    }
    free(held);
    if (--batch->n_open == 0) {
        finish(batch);
    }
}

void job__batch_client_gone(struct job *batch) {
    batch->rq = NULL;
    for (int32_t i = 0; i < batch->at.n_steps; i++) {
        if (batch->steps[i] != NULL) {
            job_client_gone(batch->steps[i]);
        }
    }
}

void job__batch_release(struct job *batch) {
    for (int32_t i = 0; batch->slots != NULL && i < batch->at.n_steps; i++) {
        if (batch->slots[i].pinned != NULL) {
            session_unpin(batch->srv->sessions, batch->slots[i].pinned, job__now_ms());
        }
        free(batch->slots[i].response);
        for (int k = 0; k < JOB_BUFFERS; k++) {
            free(batch->slots[i].buffers[k]);
        }
    }
    /* steps still running would report to a freed batch: a batch is freed only once every step
     * has answered, and a step is freed after it answers */
    for (int32_t i = 0; batch->steps != NULL && i < batch->at.n_steps; i++) {
        if (batch->steps[i] != NULL) {
            batch->steps[i]->parent = NULL;
        }
    }
    free(batch->slots);
    free(batch->steps);
}
