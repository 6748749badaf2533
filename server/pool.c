/* server/pool.c: the scheduler and worker pool (see pool.h). Dispatch runs on the loop thread
 * from an idle handle (so callbacks never run inside pool_submit): it walks the FIFO once to
 * find each session's first job, then starts what it can on free workers, batching decode
 * steps and reserving their KV blocks. Workers run attn_forward (or the job's own work) through
 * uv_queue_work; the after-work callback returns unused reservations and reports to the jobs.
 */
#include "pool.h"

#include <assert.h>
#include <stdlib.h>
#include <string.h>

#include "error.h"

#define MAX_BATCH 64

enum job_state {
    JOB_QUEUED = 0,
    JOB_PARKED = 1,
    JOB_RUNNING = 2,
};

/* One worker slot: its workspace and the batch it runs. Loop thread, except that while
 * is_busy the worker thread owns jobs/steps/status/compute_ms. */
struct worker {
    struct pool *pool;
    uv_work_t req;
    attn_workspace *ws;
    bool is_busy;
    enum pool_job_kind kind;
    int32_t layer;
    int32_t n;
    struct pool_job *jobs[MAX_BATCH];
    attn_step steps[MAX_BATCH];
    attn_qkv_step qkv_steps[MAX_BATCH]; /* instead of steps when is_qkv */
    bool is_qkv;
    bool is_decode_batch; /* running decode steps (batchable) of `layer` */
    int status[MAX_BATCH];
    int32_t n_engine_calls;
    double compute_ms;
    bool ran_inline; /* computed on the loop thread; its after-work is due at dispatch's end */
};

struct pool {
    uv_loop_t *loop;
    const attn_model *model;
    struct team *team; /* or NULL */
    struct session_store *sessions;
    struct worker *workers; /* (n_workers) */
    int32_t n_workers;
    int32_t n_busy;
    int32_t max_batch_tokens;
    int32_t queue_depth;
    int64_t inline_macs;
    struct pool_job *head, *tail; /* the FIFO, arrival order */
    int32_t n_jobs;
    int32_t n_waiting; /* jobs that have not started yet */
    uv_idle_t kick;
    bool is_closing;
    uint64_t engine_steps, batched_steps, inline_steps;
    void (*idle_fn)(void *ctx);
    void *idle_ctx;
    /* Scratch for dispatch: candidates, and a pointer set of sessions already seen. */
    struct pool_job **cand;
    int32_t cand_cap;
    const void **seen;
    size_t seen_cap; /* power of two */
};

static double now_ms(void) {
    return (double)uv_hrtime() / 1e6;
}

/* ---- the FIFO ------------------------------------------------------------------------------- */

static void fifo_unlink(struct pool *pool, struct pool_job *j) {
    if (j->prev != NULL) {
        j->prev->next = j->next;
    } else {
        pool->head = j->next;
    }
    if (j->next != NULL) {
        j->next->prev = j->prev;
    } else {
        pool->tail = j->prev;
    }
    j->prev = j->next = NULL;
    pool->n_jobs--;
}

static void kick(struct pool *pool);

static void mark_started(struct pool_job *j, struct pool *pool) {
    if (!j->has_started) {
        j->has_started = true;
        j->queue_ms = now_ms() - j->submitted_at_ms;
        pool->n_waiting--;
    }
}

/* Gives the job its session's turn unless it holds it already. A job is only prepared once it
 * heads its session's queue, so the turn is free then; false means it is not, and the job waits. */
static bool take_turn(struct pool *pool, struct pool_job *j) {
    if (j->session != NULL && j->turn == NULL) {
        j->turn = session_turn_take(pool->sessions, j->session);
        return j->turn != NULL;
    }
    return true;
}

/* Reports a step's end to the job and forgets it if it is finished (giving back its session's
 * turn). Kicks dispatch, since the job's session may have a next job waiting. */
static void complete(struct pool *pool, struct pool_job *j, int status) {
    kick(pool);
    mark_started(j, pool);
    j->state = JOB_PARKED;
    enum pool_after after = j->ops->done(j, status);
    if (after == POOL_AFTER_FINISHED) {
        if (j->turn != NULL) {
            session_turn_give(pool->sessions, j->turn);
            j->turn = NULL;
        }
        fifo_unlink(pool, j);
        if (j->ops->release != NULL) {
            j->ops->release(j);
        }
    }
}

/* ---- dispatch's scratch: the candidates and the seen-set ------------------------------------ */

/* Sizes the scratch for n jobs. At submit, where a failure refuses the job, not in dispatch: a
 * dispatch that could not allocate left the queued jobs waiting for a kick that only the next
 * request brought, and a lone request was never answered (found by an outside audit, failing
 * this allocation with a fault injector). */
static int scratch_reserve(struct pool *pool, int32_t n) {
    if (pool->cand_cap < n) {
        struct pool_job **c = realloc(pool->cand, (size_t)n * 2 * sizeof *c);
        if (c == NULL) {
            return -1;
        }
        pool->cand = c;
        pool->cand_cap = n * 2;
    }
    size_t cap = 64;
    while (cap < 2 * (size_t)n) {
        cap *= 2;
    }
    if (cap > pool->seen_cap) {
        const void **p = realloc(pool->seen, cap * sizeof *p);
        if (p == NULL) {
            return -1;
        }
        pool->seen = p;
        pool->seen_cap = cap;
    }
    return 0;
}

static void seen_reset(struct pool *pool) {
    memset(pool->seen, 0, pool->seen_cap * sizeof *pool->seen);
}

/* Adds p; returns true if it was already there. */
static bool seen_add(struct pool *pool, const void *p) {
    size_t mask = pool->seen_cap - 1;
    size_t i = ((uintptr_t)p >> 4) * 0x9E3779B97F4A7C15ULL & mask;
    while (pool->seen[i] != NULL) {
        if (pool->seen[i] == p) {
            return true;
        }
        i = (i + 1) & mask;
    }
    pool->seen[i] = p;
    return false;
}

/* ---- workers -------------------------------------------------------------------------------- */

/* A worker's batch: the engine call (or the job's own work), its time, each job's status. */
static void work_run(struct worker *w) {
    double t0 = now_ms();
    w->n_engine_calls = 0;
    if (w->kind == POOL_JOB_SDPA) {
        w->status[0] = w->jobs[0]->ops->run(w->jobs[0], 0);
        w->compute_ms = now_ms() - t0;
        w->jobs[0]->compute_ms += w->compute_ms;
        w->jobs[0]->batch_size = 1;
        return;
    }
    int rc = w->is_qkv ? attn_forward_qkv(w->pool->model, w->layer, w->ws, w->qkv_steps, w->n)
                       : attn_forward(w->pool->model, w->layer, w->ws, w->steps, w->n);
    w->n_engine_calls = 1;
    if (rc != ATTN_OK && w->n > 1) {
        /* The engine advances all caches of a call or none: retry each step alone so that one
         * bad step does not fail the others. */
        for (int32_t i = 0; i < w->n; i++) {
            w->status[i] =
                w->is_qkv ? attn_forward_qkv(w->pool->model, w->layer, w->ws, &w->qkv_steps[i], 1)
                          : attn_forward(w->pool->model, w->layer, w->ws, &w->steps[i], 1);
            w->n_engine_calls++;
        }
    } else {
        for (int32_t i = 0; i < w->n; i++) {
            w->status[i] = rc;
        }
    }
    w->compute_ms = now_ms() - t0;
    for (int32_t i = 0; i < w->n; i++) {
        /* The worker owns running jobs, so it may fill these for run() to report. */
        w->jobs[i]->compute_ms += w->compute_ms;
        w->jobs[i]->batch_size = w->n;
        if (w->jobs[i]->ops->run != NULL) {
            w->status[i] = w->jobs[i]->ops->run(w->jobs[i], w->status[i]);
        }
    }
}

static void work_cb(uv_work_t *req) {
    struct worker *w = req->data;
    if (w->pool->team != NULL) {
        team_enter(w->pool->team); /* this thread computes: a core the helpers leave alone */
    }
    work_run(w);
    if (w->pool->team != NULL) {
        team_leave(w->pool->team);
    }
}

/* The cache a step appends to, and how many tokens: a cross step's context, else its own. */
static attn_kv *step_cache(const struct pool_step *s) {
    return s->cross != NULL ? s->cross : s->kv;
}

static int32_t step_appends(const struct pool_step *s) {
    return s->cross != NULL ? s->n_context : s->n_tokens;
}

/* Returns the blocks reserved for w's steps that their forwards did not fill (all of them when
 * a step failed: the engine leaves a failed step's cache length unchanged). Loop thread, before
 * the jobs' done callbacks may free the caches. */
static void unreserve(struct worker *w) {
    if (w->kind != POOL_JOB_FORWARD) {
        return;
    }
    for (int32_t i = 0; i < w->n; i++) {
        session_kv_unreserve(w->steps[i].cross != NULL ? w->steps[i].cross : w->steps[i].kv);
    }
}

static void after_work_cb(uv_work_t *req, int uv_status) {
    struct worker *w = req->data;
    struct pool *pool = w->pool;
    w->is_busy = false;
    pool->n_busy--;
    unreserve(w);
    if (w->kind == POOL_JOB_FORWARD) {
        pool->engine_steps += (uint64_t)w->n_engine_calls;
        pool->batched_steps += (uint64_t)w->n;
        pool->inline_steps += w->ran_inline ? (uint64_t)w->n_engine_calls : 0;
    }
    for (int32_t i = 0; i < w->n; i++) {
        struct pool_job *j = w->jobs[i];
        /* uv_status is only UV_ECANCELED for uv_cancel, which attnd never calls. */
        complete(pool, j, uv_status == 0 ? w->status[i] : ERROR_INTERNAL);
        w->jobs[i] = NULL;
    }
    w->n = 0;
    kick(pool);
}

static struct worker *free_worker(struct pool *pool) {
    for (int32_t i = 0; i < pool->n_workers; i++) {
        if (!pool->workers[i].is_busy) {
            return &pool->workers[i];
        }
    }
    return NULL;
}

/* A forward of at most inline_macs multiply-adds (projections and attention) on an otherwise
 * idle pool runs on the loop thread, in place: handing it to a worker thread and back costs two
 * thread wake-ups, a fair part of a small model's decode step (the small preset, one client:
 * ~0.03 of 0.24 ms beyond compute; one llama8b layer's decode step, ~0.07 of 1.4 ms). Larger
 * ones, or any while another batch runs, go to the workers, so the loop is held for one step of
 * a lone client at most, which that client's answer waits for anyway. */
static bool runs_inline(const struct pool *pool, const struct worker *w) {
    const attn_config *c = attn_model_config(pool->model);
    /* MLA's absorbed attention and cross contexts cost otherwise than counted below */
    if (w->kind != POOL_JOB_FORWARD || pool->n_busy != 1 || pool->inline_macs <= 0 ||
        c->kv_lora_rank > 0) {
        return false;
    }
    int64_t hd = (int64_t)c->n_heads * c->head_dim;
    int64_t per_token = w->is_qkv
                            ? 0
                            : (int64_t)c->hidden_size *
                                  ((int64_t)(c->n_heads + 2 * c->n_kv_heads) * c->head_dim + hd);
    int64_t macs = 0;
    for (int32_t i = 0; i < w->n; i++) {
        const attn_step *s = &w->steps[i];
        if (s->cross != NULL) {
            return false;
        }
        int64_t keys = (int64_t)attn_kv_len(s->kv) + s->n_tokens;
        macs += (int64_t)s->n_tokens * (per_token + keys * hd * 2);
    }
    return macs <= pool->inline_macs;
}

/* Hands w's batch (its steps' blocks reserved) to a worker thread, or runs it in place. */
static void start(struct pool *pool, struct worker *w, enum pool_job_kind kind) {
    w->is_busy = true;
    w->kind = kind;
    if (kind != POOL_JOB_FORWARD) {
        w->is_decode_batch = false; /* set by dispatch_one for forwards */
    }
    pool->n_busy++;
    for (int32_t i = 0; i < w->n; i++) {
        struct pool_job *j = w->jobs[i];
        mark_started(j, pool);
        j->state = JOB_RUNNING;
        attn_step *s = &w->steps[i];
        memset(s, 0, sizeof *s);
        s->kv = j->step.kv;
        s->x = j->step.x;
        s->n_tokens = j->step.n_tokens;
        s->positions = j->step.positions;
        s->rope_reach = j->step.rope_reach;
        s->key_valid = j->step.key_valid;
        s->cross = j->step.cross;
        s->context = j->step.context;
        s->n_context = j->step.n_context;
        s->out = j->step.out;
        s->weights = j->step.weights;
        s->inspect = j->step.inspect;
        s->head_scale = j->step.head_scale;
        attn_qkv_step *qs = &w->qkv_steps[i];
        *qs = (attn_qkv_step){.kv = j->step.kv,
                              .n_tokens = j->step.n_tokens,
                              .q = j->step.q,
                              .k = j->step.k,
                              .v = j->step.v,
                              .positions = j->step.positions,
                              .rope = j->step.rope,
                              .out = j->step.out,
                              .weights = j->step.weights,
                              .inspect = j->step.inspect,
                              .head_scale = j->step.head_scale};
        w->status[i] = 0;
    }
    w->req.data = w;
    if (runs_inline(pool, w)) {
        work_cb(&w->req);
        w->ran_inline = true;
        return;
    }
    int rc = uv_queue_work(pool->loop, &w->req, work_cb, after_work_cb);
    if (rc != 0) {
        /* uv_queue_work only fails for a NULL callback; report it like any failed step. */
        w->is_busy = false;
        pool->n_busy--;
        unreserve(w);
        for (int32_t i = 0; i < w->n; i++) {
            complete(pool, w->jobs[i], ERROR_INTERNAL);
        }
        w->n = 0;
    }
}

/* ---- dispatch ------------------------------------------------------------------------------- */

/* Adds to w's batch (headed by a decode step) the runnable decode steps among cand[from..n)
 * that fit: same layer, tokens within the cap, blocks reserved. */
static void gather(struct pool *pool, struct worker *w, int32_t from, int32_t n, int32_t *tokens) {
    for (int32_t i = from; i < n && w->n < MAX_BATCH; i++) {
        struct pool_job *k = pool->cand[i];
        if (k == NULL || k->state != JOB_QUEUED || k->kind != POOL_JOB_FORWARD ||
            !k->is_batchable || k->layer != w->layer || k->is_qkv != w->is_qkv ||
            !take_turn(pool, k)) {
            continue;
        }
        int rc = k->session != NULL ? session_restore_error(k->session) : 0;
        if (rc == 0) {
            rc = k->ops->prepare(k, &k->step);
        }
        if (rc != 0) {
            pool->cand[i] = NULL; /* complete() may hand the job back to its owner */
            complete(pool, k, rc);
            continue;
        }
        if (*tokens + k->step.n_tokens > pool->max_batch_tokens ||
            session_kv_reserve(pool->sessions, step_cache(&k->step), step_appends(&k->step)) != 0) {
            continue; /* it runs (or fails) on its own turn */
        }
        *tokens += k->step.n_tokens;
        k->state = JOB_RUNNING; /* taken: start() below sets it for good */
        w->jobs[w->n++] = k;
    }
}

/* True while a worker runs decode steps of this layer (and kind): a decode step that comes
 * now waits to join the next batch instead of starting a second, smaller one beside it. Two
 * forwards at once each get half the threads, and the weights are read twice: with one decode
 * batch in flight per layer, 32 small-model clients at L=2048 went from 3090-3150 to
 * 3300-3350 steps a second (what --workers 1 gives), while prefills still run beside it. */
static bool decode_batch_running(const struct pool *pool, const struct pool_job *j) {
    for (int32_t w = 0; w < pool->n_workers; w++) {
        const struct worker *k = &pool->workers[w];
        if (k->is_busy && k->is_decode_batch && k->layer == j->layer && k->is_qkv == j->is_qkv) {
            return true;
        }
    }
    return false;
}

/* Tries to start candidate i. */
static void dispatch_one(struct pool *pool, int32_t i, int32_t n_cand) {
    struct pool_job *j = pool->cand[i];
    if (j->kind == POOL_JOB_FORWARD && j->is_batchable && decode_batch_running(pool, j)) {
        return;
    }
    if ((j->kind != POOL_JOB_CONTROL && pool->n_busy == pool->n_workers) || !take_turn(pool, j)) {
        return;
    }
    /* A session whose file could not be read back: every job queued on it fails the same way,
     * rather than start from an empty cache; a DELETE deletes it. */
    int rc =
        j->session != NULL && !j->ignores_restore_error ? session_restore_error(j->session) : 0;
    if (rc == 0) {
        rc = j->ops->prepare(j, &j->step);
    }
    if (rc == 0 && j->kind == POOL_JOB_FORWARD) {
        rc = session_kv_reserve(pool->sessions, step_cache(&j->step), step_appends(&j->step));
    }
    if (rc != 0 || j->kind == POOL_JOB_CONTROL) {
        pool->cand[i] = NULL; /* complete() may hand the job back to its owner */
        complete(pool, j, rc);
        return;
    }
    struct worker *w = free_worker(pool);
    w->n = 0;
    w->jobs[w->n++] = j;
    if (j->kind == POOL_JOB_SDPA) {
        start(pool, w, POOL_JOB_SDPA);
        return;
    }
    w->layer = j->step.layer;
    w->is_qkv = j->is_qkv;
    w->is_decode_batch = j->is_batchable;
    j->state = JOB_RUNNING;
    if (j->is_batchable) {
        int32_t tokens = j->step.n_tokens;
        gather(pool, w, i + 1, n_cand, &tokens);
    }
    start(pool, w, POOL_JOB_FORWARD);
}

static void dispatch(struct pool *pool) {
    if (pool->n_jobs == 0) {
        return;
    }
    seen_reset(pool); /* sized for n_jobs by pool_submit */
    /* Each session's first job, in arrival order; a running or parked first job blocks the
     * session's later ones. */
    int32_t n = 0;
    for (struct pool_job *j = pool->head; j != NULL; j = j->next) {
        if (j->session != NULL && seen_add(pool, j->session)) {
            continue;
        }
        if (j->state == JOB_QUEUED) {
            pool->cand[n++] = j;
        }
    }
    for (int32_t i = 0; i < n; i++) {
        if (pool->cand[i] != NULL && pool->cand[i]->state == JOB_QUEUED) {
            dispatch_one(pool, i, n);
        }
    }
    /* Batches run in place report only now: their jobs may finish and be freed, which the walk
     * above must not see. */
    for (int32_t i = 0; i < pool->n_workers; i++) {
        struct worker *w = &pool->workers[i];
        if (w->ran_inline) {
            after_work_cb(&w->req, 0);
            w->ran_inline = false;
        }
    }
}

static void kick_cb(uv_idle_t *h) {
    struct pool *pool = h->data;
    uv_idle_stop(h);
    dispatch(pool);
    if (pool->n_jobs == 0 && pool->n_busy == 0 && pool->idle_fn != NULL) {
        pool->idle_fn(pool->idle_ctx);
    }
}

static void kick(struct pool *pool) {
    if (!pool->is_closing) {
        uv_idle_start(&pool->kick, kick_cb);
    }
}

/* ---- public --------------------------------------------------------------------------------- */

void pool_wake(struct pool *pool) {
    kick(pool);
}

int pool_create(const struct pool_params *p, struct pool **out) {
    if (p->n_workers < 1 || p->max_batch_tokens < 1 || p->queue_depth < 1) {
        return ATTN_EINVAL;
    }
    struct pool *pool = calloc(1, sizeof *pool);
    if (pool == NULL) {
        return ATTN_ENOMEM;
    }
    pool->loop = p->loop;
    pool->model = p->model;
    pool->sessions = p->sessions;
    pool->n_workers = p->n_workers;
    pool->team = p->team;
    attn_executor ex = p->team != NULL ? team_executor(p->team) : (attn_executor){0};
    pool->max_batch_tokens = p->max_batch_tokens;
    pool->queue_depth = p->queue_depth;
    pool->inline_macs = p->inline_macs;
    pool->workers = calloc((size_t)p->n_workers, sizeof *pool->workers);
    if (pool->workers == NULL) {
        free(pool);
        return ATTN_ENOMEM;
    }
    for (int32_t i = 0; i < p->n_workers; i++) {
        pool->workers[i].pool = pool;
        int rc = attn_workspace_create(p->model, p->max_batch_tokens, p->team ? &ex : NULL,
                                       &pool->workers[i].ws);
        if (rc != ATTN_OK) {
            for (int32_t k = 0; k < i; k++) {
                attn_workspace_destroy(pool->workers[k].ws);
            }
            free(pool->workers);
            free(pool);
            return rc;
        }
    }
    uv_idle_init(p->loop, &pool->kick);
    pool->kick.data = pool;
    *out = pool;
    return 0;
}

static void on_kick_closed(uv_handle_t *h) {
    struct pool *pool = h->data;
    for (int32_t i = 0; i < pool->n_workers; i++) {
        attn_workspace_destroy(pool->workers[i].ws);
    }
    free(pool->workers);
    free(pool->cand);
    free(pool->seen);
    free(pool);
}

void pool_destroy(struct pool *pool) {
    if (pool == NULL) {
        return;
    }
    assert(pool_is_idle(pool));
    pool->is_closing = true;
    /* The memory goes when libuv has closed the idle handle: the caller runs the loop once
     * more (main does, until no handles remain). */
    uv_close((uv_handle_t *)&pool->kick, on_kick_closed);
}

int pool_submit(struct pool *pool, struct pool_job *job) {
    if (pool->n_waiting >= pool->queue_depth) {
        return ERROR_QUEUE_FULL;
    }
    if (scratch_reserve(pool, pool->n_jobs + 1) != 0) {
        return ATTN_ENOMEM;
    }
    job->prev = pool->tail;
    job->next = NULL;
    if (pool->tail != NULL) {
        pool->tail->next = job;
    } else {
        pool->head = job;
    }
    pool->tail = job;
    pool->n_jobs++;
    pool->n_waiting++;
    job->state = JOB_QUEUED;
    job->has_started = false;
    job->submitted_at_ms = now_ms();
    job->queue_ms = 0;
    job->compute_ms = 0;
    job->batch_size = 0;
    job->turn = NULL;
    kick(pool);
    return 0;
}

void pool_job_ready(struct pool *pool, struct pool_job *job) {
    if (job->state == JOB_PARKED) {
        job->state = JOB_QUEUED;
        kick(pool);
    }
}

bool pool_is_idle(const struct pool *pool) {
    return pool->n_jobs == 0 && pool->n_busy == 0;
}

int32_t pool_queue_depth(const struct pool *pool) {
    return pool->n_waiting;
}

int32_t pool_n_running(const struct pool *pool) {
    return pool->n_busy;
}

uint64_t pool_engine_steps(const struct pool *pool) {
    return pool->engine_steps;
}

uint64_t pool_batched_steps(const struct pool *pool) {
    return pool->batched_steps;
}

uint64_t pool_inline_steps(const struct pool *pool) {
    return pool->inline_steps;
}

void pool_set_idle_callback(struct pool *pool, void (*fn)(void *ctx), void *ctx) {
    pool->idle_fn = fn;
    pool->idle_ctx = ctx;
    kick(pool);
}
