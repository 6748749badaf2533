/* server/blas.h: OpenBLAS's work buffers, reserved at startup. OpenBLAS (0.3.21) allocates each
 * of its per-call work buffers (128 MiB of address space each) on first use and, when that
 * allocation fails, retries it forever: under a memory cap a request would then spin on a worker
 * without end and SIGTERM could never finish. Reserving every buffer the workers can use at once
 * before the first request turns that into a clear startup failure, and a request never reaches
 * the retry loop.
 *
 * Thread rule: main thread, at startup, before any thread calls BLAS.
 */
#ifndef SERVER_BLAS_H
#define SERVER_BLAS_H

#include <stddef.h>
#include <stdint.h>

/* OpenBLAS has at least this many buffer slots (NUM_BUFFERS is max(50, 2 x its CPU count)):
 * the most n_buffers may be, so max(workers, computing threads) x BLAS threads at most
 * (config.c refuses more, and fits the core-count defaults under it). */
#define BLAS_MAX_BUFFERS 48

/* Makes OpenBLAS allocate n_buffers work buffers now (one per thread that may run a BLAS call
 * at the same time: max(workers, computing threads) x BLAS threads) and keep them for later calls.
 * First checks with plain allocations that the address space is there, so that a cap makes this
 * fail instead of hang. Returns 0, or -1 with a one-line reason in err. */
int blas_reserve(int32_t n_buffers, char *err, size_t err_size);

#endif /* SERVER_BLAS_H */
