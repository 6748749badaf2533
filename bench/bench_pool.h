/* bench/bench_pool.h: a small persistent pthread pool that backs the engine's attn_executor in
 * the benchmark, so attention work can be spread over cores the way a server would do it.
 * The pool knows nothing of the engine beyond the executor signature; it is not a general
 * job queue (one run at a time, called from one thread).
 */
#ifndef BENCH_BENCH_POOL_H
#define BENCH_BENCH_POOL_H

#include <stdint.h>

#include "../engine/attn.h"

typedef struct bench_pool bench_pool; /* run from one thread at a time */

/* Creates a pool for n_threads threads in all: the thread that calls bench_pool_run takes part,
 * so n_threads - 1 workers are started (none for 1). Workers sleep on a condition variable
 * between runs. Returns ATTN_OK, ATTN_EINVAL (n_threads < 1) or ATTN_ENOMEM (allocation or
 * thread creation failed; nothing is left running then). */
int bench_pool_create(int32_t n_threads, bench_pool **out);

/* Stops and joins the workers and frees the pool. NULL is a no-op. No run may be in progress. */
void bench_pool_destroy(bench_pool *pool);

/* Runs task(arg, i) for every i in [0, n) on the pool's threads (the caller included) and
 * returns when all have finished. Indices are handed out one at a time, so uneven tasks balance.
 * ctx is the bench_pool. Matches attn_executor.run; one run at a time. */
void bench_pool_run(void *ctx, attn_task_fn task, void *arg, int32_t n);

/* An executor that runs on this pool; valid until bench_pool_destroy. */
attn_executor bench_pool_executor(bench_pool *pool);

#endif /* BENCH_BENCH_POOL_H */
