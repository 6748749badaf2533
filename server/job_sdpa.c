/* server/job_sdpa.c: POST /v1/sdpa, attention on the caller's q, k and v with no session and no
 * weights: the scratch it may ask for, the run on a worker (which stops between tiles when its
 * client goes), and the answer (see job_int.h).
 */
#include "job_int.h"

#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "error.h"

/* The largest SDPA scratch a request may ask the engine for (bytes). */
#define SDPA_SCRATCH_MAX ((size_t)1 << 30)

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
    /* the job's buffers, which job__free frees: a binary answer sends its tensors from them */
    float *out = job->out = malloc(n_out * sizeof(float));
    bool is_full = sd->return_weights && !sd->sel.is_set;
    float *weights = job->weights = is_full ? malloc(n_w * sizeof(float)) : NULL;
    size_t n_sel =
        sd->sel.is_set ? (size_t)(sd->n_batch * api_selection_values(&sd->sel, sd->n_heads)) : 0;
    float *selected = job->selected =
        sd->sel.is_set ? malloc((n_sel > 0 ? n_sel : 1) * sizeof(float)) : NULL;
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
            job->response = api_sdpa_response_encode(&r, &job->response_len,
                                                     &job->response_json_len, &job->raw);
            job->response_status = 200;
            job__binary_answer(job, sd->encoding);
            rc = job->response != NULL
                     ? 0
                     : job__set_err(job, ERROR_INTERNAL, NULL, "out of memory encoding the answer");
        } else if (rc == ATTN_ECANCELED) {
            rc = ERROR_CANCELLED;
        } else {
            job__set_err(job, ERROR_INVALID_REQUEST, "q", "the engine refused the tensors: %s",
                         attn_strerror(rc));
            rc = ERROR_INVALID_REQUEST;
        }
    }
    free(scratch);
    return rc;
}

static const struct pool_job_ops sdpa_ops = {sdpa_prepare, sdpa_run, job__simple_done,
                                             job__on_release};

void job__sdpa_admit(struct job *job) {
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
