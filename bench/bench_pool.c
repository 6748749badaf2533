/* bench/bench_pool.c: the benchmark's persistent pthread pool (see bench_pool.h).
 * A run publishes (task, arg, n) under the mutex and bumps a generation counter; workers and the
 * caller then claim indices from an atomic counter until none are left, and the caller waits
 * until every worker has checked out of the run. Between runs a worker polls the generation for
 * up to SPIN_NS, then blocks: a forward runs the executor several times in a row (projections,
 * attention, output), and a sleep-wake per run costs tens of microseconds, a third of a small
 * model's decode. (OpenBLAS is single-threaded beside the executor, so the poll steals no core
 * from its threads.)
 */
#include "bench_pool.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdlib.h>
#include <time.h>

#define SPIN_NS 200000

/* Thread rule: fields under `lock` are written by bench_pool_run and read by workers after they
 * observe a new generation under the same lock; next_index is the only field touched without it. */
struct bench_pool {
    pthread_mutex_t lock;
    pthread_cond_t work_ready; /* signalled when generation changes or is_stopping is set */
    pthread_cond_t work_done;  /* signalled when n_pending reaches 0 */
    uint64_t generation;       /* incremented once per run */
    bool is_stopping;
    int32_t n_pending; /* workers that have not yet finished the current run */
    attn_task_fn task;
    void *arg;
    int32_t n_tasks;
    atomic_int_fast32_t next_index; /* next task index to claim in the current run */
    int32_t n_workers;
    pthread_t *workers; /* (n_workers) */
};

static int64_t now_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (int64_t)t.tv_sec * 1000000000 + t.tv_nsec;
}

static void claim_and_run(bench_pool *pool) {
    for (;;) {
        int_fast32_t i = atomic_fetch_add_explicit(&pool->next_index, 1, memory_order_relaxed);
        if (i >= pool->n_tasks) {
            return;
        }
        pool->task(pool->arg, (int32_t)i);
    }
}

static void *worker_main(void *p) {
    bench_pool *pool = p;
    /* Generation 0 is the state at creation, so a run published before this thread first takes
     * the lock is still seen as new. */
    uint64_t seen = 0;
    pthread_mutex_lock(&pool->lock);
    for (;;) {
        if (!pool->is_stopping && pool->generation == seen) {
            pthread_mutex_unlock(&pool->lock);
            int64_t until = now_ns() + SPIN_NS;
            while (__atomic_load_n(&pool->generation, __ATOMIC_ACQUIRE) == seen &&
                   now_ns() < until) {
            }
            pthread_mutex_lock(&pool->lock);
        }
        while (!pool->is_stopping && pool->generation == seen) {
            pthread_cond_wait(&pool->work_ready, &pool->lock);
        }
        if (pool->is_stopping) {
            break;
        }
        seen = pool->generation;
        pthread_mutex_unlock(&pool->lock);
        claim_and_run(pool);
        pthread_mutex_lock(&pool->lock);
        if (__atomic_sub_fetch(&pool->n_pending, 1, __ATOMIC_ACQ_REL) == 0) {
            pthread_cond_signal(&pool->work_done);
        }
    }
    pthread_mutex_unlock(&pool->lock);
    return NULL;
}

/* Stops and joins the first n_started workers. */
static void stop_workers(bench_pool *pool, int32_t n_started) {
    pthread_mutex_lock(&pool->lock);
    pool->is_stopping = true;
    pthread_cond_broadcast(&pool->work_ready);
    pthread_mutex_unlock(&pool->lock);
    for (int32_t i = 0; i < n_started; i++) {
        pthread_join(pool->workers[i], NULL);
    }
}

int bench_pool_create(int32_t n_threads, bench_pool **out) {
    if (out == NULL || n_threads < 1) {
        return ATTN_EINVAL;
    }
    bench_pool *pool = calloc(1, sizeof(*pool));
    if (pool == NULL) {
        return ATTN_ENOMEM;
    }
    pool->n_workers = n_threads - 1;
    pool->workers = calloc((size_t)n_threads, sizeof(pthread_t));
    if (pool->workers == NULL) {
        free(pool);
        return ATTN_ENOMEM;
    }
    pthread_mutex_init(&pool->lock, NULL);
    pthread_cond_init(&pool->work_ready, NULL);
    pthread_cond_init(&pool->work_done, NULL);
    atomic_init(&pool->next_index, 0);
    for (int32_t i = 0; i < pool->n_workers; i++) {
        if (pthread_create(&pool->workers[i], NULL, worker_main, pool) != 0) {
            stop_workers(pool, i);
            pool->n_workers = 0;
            bench_pool_destroy(pool);
            return ATTN_ENOMEM;
        }
    }
    *out = pool;
    return ATTN_OK;
}

void bench_pool_destroy(bench_pool *pool) {
    if (pool == NULL) {
        return;
    }
    stop_workers(pool, pool->n_workers);
    pthread_cond_destroy(&pool->work_done);
    pthread_cond_destroy(&pool->work_ready);
    pthread_mutex_destroy(&pool->lock);
    free(pool->workers);
    free(pool);
}

void bench_pool_run(void *ctx, attn_task_fn task, void *arg, int32_t n) {
    bench_pool *pool = ctx;
    if (n <= 0) {
        return;
    }
    /* Waking a worker costs tens of microseconds; a single task is cheaper to run here. */
    if (pool->n_workers == 0 || n == 1) {
        for (int32_t i = 0; i < n; i++) {
            task(arg, i);
        }
        return;
    }
    pthread_mutex_lock(&pool->lock);
    pool->task = task;
    pool->arg = arg;
    pool->n_tasks = n;
    atomic_store_explicit(&pool->next_index, 0, memory_order_relaxed);
    __atomic_store_n(&pool->n_pending, pool->n_workers, __ATOMIC_RELAXED);
    __atomic_store_n(&pool->generation, pool->generation + 1, __ATOMIC_RELEASE);
    pthread_cond_broadcast(&pool->work_ready);
    pthread_mutex_unlock(&pool->lock);

    claim_and_run(pool);

    /* The last tasks end within a task's time of each other: poll for them a while before
     * sleeping, since a wake-up costs more than most tasks of a decode step take. */
    int64_t until = now_ns() + SPIN_NS;
    while (__atomic_load_n(&pool->n_pending, __ATOMIC_ACQUIRE) > 0 && now_ns() < until) {
    }
    pthread_mutex_lock(&pool->lock);
    while (__atomic_load_n(&pool->n_pending, __ATOMIC_ACQUIRE) > 0) {
        pthread_cond_wait(&pool->work_done, &pool->lock);
    }
    pthread_mutex_unlock(&pool->lock);
}

attn_executor bench_pool_executor(bench_pool *pool) {
    attn_executor ex = {.run = bench_pool_run, .ctx = pool};
    return ex;
}
