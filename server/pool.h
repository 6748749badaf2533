/* server/pool.h: the job scheduler and the libuv worker pool that runs engine work.
 *
 * Jobs wait in one FIFO in arrival order. A job naming a session runs only when it is the first
 * of that session's jobs, so requests on one session run one at a time in order; jobs of
 * different sessions run in parallel, one engine call per worker, all on caches of the one KV
 * pool (session.h). When a forward job of a few tokens (a decode step) is dispatched, later
 * runnable decode steps of any other sessions on the same layer join it: one attn_forward call
 * advances all of them, reading the weights once (continuous batching); while such a batch runs,
 * later decode steps of its layer wait for the next one rather than start a second beside it.
 * Before a forward is
 * handed to a worker, the loop thread reserves the blocks of every cache it appends to
 * (session_kv_reserve, evicting idle sessions if needed), and after it returns the blocks a
 * failed step did not fill.
 *
 * Each job is described by callbacks (the work/after-work split of uv_queue_work): prepare and
 * done run on the loop thread and may touch anything; run executes on a worker and touches only
 * its job (and the engine through the step the pool runs). Thread rule: every pool_* function is
 * loop thread only.
 */
#ifndef SERVER_POOL_H
#define SERVER_POOL_H

#include <stdbool.h>
#include <stdint.h>

#include <uv.h>

#include "../engine/attn.h"
#include "session.h"
#include "team.h"

/* Steps of at most this many tokens are decode steps that may be batched together. */
#define POOL_BATCH_STEP_MAX_TOKENS 16

struct pool; /* opaque */

enum pool_job_kind {
    POOL_JOB_FORWARD, /* one engine step (attn_forward) on a reserved cache; may be batched */
    POOL_JOB_SDPA,    /* stateless work on a worker, no cache (ops->run does it) */
    POOL_JOB_CONTROL, /* done entirely by ops->prepare on the loop thread */
};

/* What a forward job contributes to one engine step; filled by ops->prepare. Arrays are the
 * job's own and must stay valid until ops->done. */
struct pool_step {
    attn_kv *kv;
    int32_t layer;
    const float *x; /* (n_tokens, hidden_size); NULL for a q/k/v step */
    /* A q/k/v step (the job's is_qkv): the caller's projections, per head (attn_qkv_step) */
    const float *q, *k, *v;
    bool rope;
    int32_t n_tokens;         /* >= 1 */
    const int32_t *positions; /* (n_tokens) or NULL */
    int32_t rope_reach;       /* attn_step.rope_reach: 0, or the highest position of the call */
    const uint8_t *key_valid; /* NULL, or (len(kv) + n_tokens): 0 hides that key */
    attn_kv *cross;           /* a cross-attention step (attn_step.cross): kv unused */
    const float *context;     /* (n_context, hidden_size) appended to cross first, or NULL */
    int32_t n_context;
    float *out;     /* (n_tokens, hidden_size), or a q/k/v step's (n_heads, n_tokens, head_dim) */
    float *weights; /* NULL, or (n_heads, n_tokens, len(kv) + n_tokens) */
    const attn_inspect *inspect; /* NULL, or attn_step.inspect */
    const float *head_scale;     /* NULL, or attn_step.head_scale */
};

enum pool_after {
    POOL_AFTER_FINISHED = 0, /* the pool forgets the job */
    POOL_AFTER_PARKED = 1,   /* another step follows; the job keeps its place at the head of its
                                session and runs again after pool_job_ready */
};

struct pool_job;

struct pool_job_ops {
    /* Loop thread, when the job's turn has come (no earlier job of its session is queued or
     * running; job->turn holds the session's turn). FORWARD: fill *step (resolving the cache,
     * checking expect_n_past and lengths) and return 0; the pool then reserves the step's blocks.
     * CONTROL: do the work and return 0 or an error. Any nonzero return finishes the job with that
     * status (done is called). May be called again for the same step if the job could not join a
     * batch, so it must not change state beyond resolving the cache. */
    int (*prepare)(struct pool_job *job, struct pool_step *step);
    /* Worker thread, after the job's engine step with its status (FORWARD), or to do the work
     * (SDPA, status 0). Touches only the job. Returns the job's status. May be NULL. */
    int (*run)(struct pool_job *job, int status);
    /* Loop thread: the step is over with `status` (0, an error_code or an attn_status). Must not
     * free the job: the pool still holds it until it calls release. */
    enum pool_after (*done)(struct pool_job *job, int status);
    /* Loop thread: the pool is finished with the job (after done returned
     * POOL_AFTER_FINISHED); the submitter may free it now. May be NULL. */
    void (*release)(struct pool_job *job);
};

/* A job. The submitter owns the memory and fills the public part; the pool links it in and
 * hands it back through ops->release. */
struct pool_job {
    /* Set by the submitter. */
    enum pool_job_kind kind;
    const struct pool_job_ops *ops;
    struct session *session; /* NULL = stateless; the submitter pins it */
    bool is_batchable;       /* a forward of <= POOL_BATCH_STEP_MAX_TOKENS tokens per step */
    int32_t layer;           /* for batching: steps must share the layer */
    bool is_qkv;             /* its steps are q/k/v ones (attn_forward_qkv): batched only so */
    /* Runs on its session whatever the session's restore from disk came to (DELETE), where every
     * other job queued on it fails with the restore's error. */
    bool ignores_restore_error;
    /* Set by the pool: the session's turn (session.h), held from the job's first prepare until
     * after its done returns POOL_AFTER_FINISHED. NULL for stateless jobs. */
    struct session_turn *turn;
    /* Read by the submitter in ops->done. */
    double queue_ms;    /* submission to first start */
    double compute_ms;  /* engine time summed over steps */
    int32_t batch_size; /* sequences in the last engine step that carried this job */
    /* Pool-private. */
    struct pool_job *prev, *next;
    int state;
    bool has_started;
    double submitted_at_ms;
    struct pool_step step;
};

struct pool_params {
    uv_loop_t *loop;
    const attn_model *model;
    struct session_store *sessions;
    int32_t n_workers;        /* worker threads (the libuv pool must have at least this many) */
    int32_t max_batch_tokens; /* tokens per engine call: batch cap and workspace size */
    int32_t queue_depth;      /* waiting (never started) jobs at most */
    struct team *team;        /* the helpers the workers' forwards share; NULL: each alone */
    int64_t inline_macs;      /* a forward of at most this many multiply-adds, when no other
                                 batch runs, runs on the loop thread (0 = never) */
};

/* Creates the pool and one engine workspace per worker. Returns 0, or ATTN_ENOMEM / ATTN_EINVAL.
 */
int pool_create(const struct pool_params *p, struct pool **out);

/* Frees the pool. No job may be queued or running (pool_is_idle). NULL is a no-op. */
void pool_destroy(struct pool *pool);

/* Queues a job. Returns 0, ERROR_QUEUE_FULL when queue_depth jobs are already waiting, or
 * ATTN_ENOMEM (then no callback is ever called). The job runs later: callbacks are never called
 * from inside pool_submit. */
int pool_submit(struct pool *pool, struct pool_job *job);

/* Looks at the queue again on the next loop turn (a session's turn was given back from outside
 * the pool, e.g. by a restore from disk). */
void pool_wake(struct pool *pool);

/* Makes a parked job runnable again. */
void pool_job_ready(struct pool *pool, struct pool_job *job);

/* True when no job is queued, parked or running. */
bool pool_is_idle(const struct pool *pool);

/* Jobs waiting to start for the first time, and workers busy. */
int32_t pool_queue_depth(const struct pool *pool);
int32_t pool_n_running(const struct pool *pool);

/* Engine calls made and sequence steps they carried (their ratio is the mean batch size). */
uint64_t pool_engine_steps(const struct pool *pool);
uint64_t pool_batched_steps(const struct pool *pool);
uint64_t pool_inline_steps(const struct pool *pool); /* engine calls run on the loop thread */

/* Calls fn after the pool becomes idle (checked after every job). For draining. */
void pool_set_idle_callback(struct pool *pool, void (*fn)(void *ctx), void *ctx);

#endif /* SERVER_POOL_H */
