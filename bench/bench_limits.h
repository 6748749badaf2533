/* bench/bench_limits.h: this machine's limits for the benchmark's ratios, measured by attn_bench
 * itself: the cblas_sgemm peak at SGEMM_N^3 and the read bandwidth of sweeps over a buffer far
 * larger than the caches and over one that fits L3. Two ways: best-of-n measurements before and
 * after the cases (bench_limits_measure), and one-shot probes (bench_probe) timed right after
 * each rep of a case, so that a ratio can pair each rep with the limit of the same seconds on a
 * VM whose steal time moves both by a fifth from one minute to the next.
 */
#ifndef BENCH_BENCH_LIMITS_H
#define BENCH_BENCH_LIMITS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "../engine/attn.h"

#define SGEMM_N 2048
/* Calls that read at most this much read the same bytes every rep: they sit in L3 (16 MiB fits
 * the 32 MiB L3 with room for the code's own). */
#define L3_BYTES ((size_t)16 << 20)

typedef struct machine_limits {
    bool is_measured;
    double sgemm_gflops; /* best cblas_sgemm 2048^3 with the OpenBLAS threads set by the caller */
    double bw_gbs[2];    /* read bandwidth with 1 and 2 threads, GB/s (1e9 bytes) */
    double l3_gbs[2];    /* read bandwidth of an L3_BYTES buffer with 1 and 2 threads */
    size_t bw_bytes;
} machine_limits;

/* CLOCK_MONOTONIC in seconds. */
double bench_seconds(void);

/* Measures lim's every field: bandwidth over a sweep of bw_bytes (rounded down to 2 MiB pages)
 * and of L3_BYTES, and sgemm, each the best of n_runs after a warm-up. Returns ATTN_OK or
 * ATTN_ENOMEM. */
int bench_limits_measure(size_t bw_bytes, int32_t n_runs, uint64_t seed, machine_limits *lim);

/* The limit a case's roofline is bound by. */
typedef enum bench_bound {
    BENCH_BOUND_SGEMM, /* FLOPs: one cblas_sgemm SGEMM_N^3, GFLOP/s */
    BENCH_BOUND_DRAM,  /* bytes beyond the caches: one read sweep of a 256 MiB buffer, GB/s */
} bench_bound;

typedef struct bench_probe bench_probe;

/* Allocates and fills the probes' buffers (~300 MiB). n_threads: the sweeps' threads (1 or 2)
 * and OpenBLAS's during the sgemm probe; blas_threads_after: what OpenBLAS is set back to after
 * it (the engine's executor runs BLAS on one thread). ex, if not NULL, runs the sweeps on its
 * threads (it must have n_threads); else each sweep starts its own. ex must outlive the probe.
 * Returns ATTN_OK or ATTN_ENOMEM. */
int bench_probe_create(int32_t n_threads, int32_t blas_threads_after, const attn_executor *ex,
                       uint64_t seed, bench_probe **out);

/* One measurement of the bound's limit (GFLOP/s or GB/s), about 10 ms (a sweep) or 0.1 s (the
 * sgemm); a negative value if a sweep thread could not start. */
double bench_probe_run(bench_probe *p, bench_bound bound);

void bench_probe_destroy(bench_probe *p);

#endif
