/* server/job_int.h: what the job module's files share (job.c: the common part, parsing and
 * admission; job_attend.c: the forward and q/k/v attend; job_sdpa.c: stateless SDPA;
 * job_session.c: the session operations, export and import; job_batch.c: many sessions' steps
 * in one call). Not for other modules: they see job.h.
 *
 * Thread rule: as job.h's.
 */
#ifndef SERVER_JOB_INT_H
#define SERVER_JOB_INT_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include "api.h"
#include "job.h"
#include "pool.h"
#include "route.h"
#include "snapshot.h"
#include "strbuf.h"

enum job_kind {
    JOB_ATTEND,
    JOB_SDPA,
    JOB_TRUNCATE,
    JOB_FORK,
    JOB_DELETE,
    JOB_EXPORT,
    JOB_IMPORT,
    JOB_ATTENTION,
};

struct job {
    struct pool_job pj; /* first, so the pool's pointer is the job's */
    enum job_kind kind;
    struct server *srv;
    struct route_req *rq; /* NULL once the client is gone */
    /* Set by the loop when the client goes, read by the worker running the job (an SDPA polls
     * it between tiles and stops). */
    atomic_bool is_abandoned;
    /* The request body and how its parse went (an attend or sdpa body is parsed on a pool thread
     * when it is large). */
    const char *body;
    size_t body_len;
    char *body_block; /* the body, taken from its request, freed with the job: a framed attend's
                         (its tensors may lie in it: api_body.may_borrow), or one whose request
                         closed while a pool thread parsed it (a client's reset) */
    int parse_rc;
    struct api_error parse_err;
    uv_work_t parse_work;
    bool is_parsing; /* parse_work is queued or running: it reads body */
    /* Detail for an error found by prepare. */
    char err_message[512];
    char err_param[64];
    /* The answer, made by run (worker) or prepare (control jobs). */
    char *response;
    size_t response_len;
    int response_status;
    const char *response_type; /* NULL: JSON */
    size_t response_json_len;  /* a binary-framed answer's JSON part (its Inference-Header-...) */
    bool is_framed;            /* the answer is framed by the binary tensor extension */
    struct api_raw_parts raw;  /* framed: the tensors sent after response (the JSON alone) from
                                  the job's own buffers, in field order (n 0: none, or appended) */
    /* The request body's JSON length when framed (Inference-Header-Content-Length), or -1 */
    int64_t request_json_len;
    /* attend */
    struct api_attend_request at;
    float *out;     /* (T, hidden_size) */
    float *weights; /* (n_heads, T, n_past + T), or per stream step (n_heads, n_past + i + 1) */
    /* return_weights as an object, capture: the engine's inspection of the call and where its
     * values go (at.sel's values; q, k, v, head_out by API_CAPTURE_* bit) */
    attn_inspect inspect;
    bool has_inspect;
    float *selected;
    float *captures[4];
    attn_kv *temp_kv;   /* a stateless call's cache */
    bool made_layer_kv; /* this call created its session's cache of the layer (dropped again
                           if the call fails with it still empty) */
    /* Cross-attention: the cache a context is projected into (a stateless call's, or a
     * session's new context, which done installs when the call succeeds) */
    attn_kv *temp_cross;
    int32_t n_keys;      /* keys the queries see: n_past + T, or the context's tokens */
    int32_t n_past0;     /* cache length before the request */
    int32_t next_index;  /* stream: the next token to compute */
    bool is_sized;       /* n_past0 known, buffers allocated */
    struct strbuf event; /* stream: the event run() encoded */
    struct strbuf room;  /* the answer's bytes, reserved when sized (before the call runs) */
    size_t room_want;    /* a batch: the bytes its room holds for its steps' answers */
    /* sdpa */
    struct api_sdpa_request sd;
    /* session operations */
    struct api_truncate_request tr;
    struct api_fork_request fk;
    /* export */
    struct snapshot_kv snap_kv; /* what the pool holds, read on the loop for the worker */
    /* GET /v1/sessions/{id}/attention */
    struct api_attention_request *attn_q; /* its jobs' only (2.1 KB, in every job before: a
                                             batch's steps zeroed 32 of them a call) */
    bool is_kv;                           /* POST /v1/kv/attend: q/k/v in, not x */
    /* A batch (job_batch.c): the batch's job holds the request and a slot per step; each step
     * is a job of its own, an attend without a request (rq NULL), reporting to its batch. */
    struct job *parent;       /* a step's batch, or NULL */
    int32_t slot;             /* a step's index in its batch */
    struct batch_slot *slots; /* a batch's: what each step answered, (at.n_steps) */
    struct job **steps;       /* a batch's: its steps not yet freed (NULL once a step is) */
    int32_t n_open;           /* a batch's steps not yet answered */
    int64_t n_weights;        /* a batch's: the weights its sized steps hold, all together */
    int64_t n_charged;        /* a step's share of its batch's n_weights */
};

/* What a step of a batch answered. */
/* The buffers of an attend job a framed answer's tensors may point into (job__take_buffers). */
#define JOB_BUFFERS 7

struct batch_slot {
    char session_id[API_SESSION_ID_MAX + 1];
    struct session *pinned; /* the step's session, pinned until the batch is freed (job__unpin) */
    int status;             /* 0 or the error code */
    char *response; /* its AttendResponse (and raw tensors when framed and not in raw), malloc'd */
    size_t len, json_len;
    struct api_raw_parts raw;   /* framed: its tensors, in buffers */
    void *buffers[JOB_BUFFERS]; /* taken from the step, which is freed before the answer */
    char message[512];
    char param[64];
};

int64_t job__now_ms(void);

/* Sets the job's error detail (message and param) and returns code. */
int job__set_err(struct job *job, int code, const char *param, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

/* A job for request rq (answers 500 and returns NULL when out of memory). */
struct job *job__new(struct route_req *rq, enum job_kind kind);
void job__free(struct job *job);
void job__on_release(struct pool_job *pj); /* pool_job_ops.release: frees the job */
void job__unpin(struct job *job);

/* Answers the request (if its client is still there) with the job's response or the error. */
void job__answer(struct job *job, int status);

/* Finds the live session named by the path (bringing it back from disk if it is there) and pins
 * it for the job; otherwise answers 404/410 and returns -1. */
int job__pin_path_session(struct job *job);

/* Queues the job; on a full queue answers 429 and frees it. */
void job__submit(struct job *job);

/* Marks the job's answer framed by the binary tensor extension (application/octet-stream, the
 * Inference-Header-Content-Length header) when enc is API_ENCODING_BINARY. */
void job__binary_answer(struct job *job, enum api_encoding enc);

/* Counts a job the pool cancelled (status ERROR_CANCELLED) in the metrics. */
void job__count_cancelled(struct job *job, int status);

/* pool_job_ops.done of jobs that only answer: the answer, then the pin goes. */
enum pool_after job__simple_done(struct pool_job *pj, int status);

/* Parses the request body (on a pool thread when it is large), then admits the job by kind. */
void job__parse_then_admit(struct job *job);

/* The admissions, once a body is parsed. */
/* What the request's layer cannot compute (a linear layer's weights, positions, masks, context
 * or captures; a context on a latent cache), which needs only the request and the model: the
 * field to name, with the message in msg, or NULL. */
const char *job__layer_refusal(const struct server *srv, const struct api_attend_request *at,
                               char *msg, size_t size);
void job__attend_admit(struct job *job);
void job__sdpa_admit(struct job *job);

/* What the model cannot do for an attend, whatever its sessions: x with no weights to project
 * it (--geometry), captured k/v of a latent cache, or q/k/v for a linear layer (q/k/v for a
 * latent cache never get here: the parse refuses them). Answers 400 and returns -1. */
int job__refuse_attend(struct job *job);

/* Moves the attend job's tensor buffers (out, weights, selected, captures) into to[JOB_BUFFERS],
 * leaving the job without them: what its raw parts point into, kept for the answer. */
void job__take_buffers(struct job *job, void **to);

/* A framed answer's JSON and the tensors after it, sent from where they are: json (malloc'd)
 * and buffers[n] are freed once the connection has sent them. Answers 500 when out of memory. */
void job__reply_parts(struct job *job, char *json, size_t json_len,
                      const struct api_raw_parts *const *raws, int n_raws, void **buffers,
                      int n_buffers);
void job__import_admit(struct job *job);

/* Refuses a job before it is queued: answers code (message, param: NULL for the defaults) to
 * its request, or to its batch for a step. Does not free the job. */
void job__refuse(struct job *job, int code, const char *message, const char *param);

/* The job's client has gone: its own, or its batch's. */
bool job__is_gone(const struct job *job);

/* Batches (job_batch.c). A parsed attend with steps becomes one job per step, queued together
 * so that the pool runs their decode steps as one engine call. */
void job__batch_admit(struct job *batch);
void job__batch_step_answered(struct job *step, int status); /* from job__answer */
void job__batch_step_freed(struct job *step);                /* from job__free */
void job__batch_client_gone(struct job *batch);
void job__batch_release(struct job *batch); /* frees the batch's slots (from job__free) */

#endif /* SERVER_JOB_INT_H */
