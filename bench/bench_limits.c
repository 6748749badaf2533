/* bench/bench_limits.c: the machine's limits for attn_bench's ratios (see bench_limits.h): read
 * sweeps on fresh threads over buffers on 2 MiB pages, and cblas_sgemm at SGEMM_N^3.
 */
#define _DEFAULT_SOURCE /* MADV_HUGEPAGE */
#include "bench_limits.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

#include <cblas.h>

#include "../engine/attn.h"
#include "bench_rand.h"

/* The probe's sweep beyond the caches: 8x the L3, ~10 ms at this machine's DRAM bandwidth. */
#define PROBE_DRAM_BYTES ((size_t)256 << 20)

double bench_seconds(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

typedef struct sweep_job {
    float *p;
    size_t n;
    float sum; /* read-only sweep result, kept so the loads cannot be optimized away */
} sweep_job;

/* Sums floats with four independent 4-wide accumulators, so the loop is bound by loads rather than
 * by the latency of one chain of additions. memcpy keeps the loads free of aliasing questions. */
typedef float float4 __attribute__((vector_size(16)));

static float sum_floats(const float *p, size_t n) {
    float4 a0 = {0}, a1 = {0}, a2 = {0}, a3 = {0};
    size_t i = 0;
    for (; i + 16 <= n; i += 16) {
        float4 v0, v1, v2, v3;
        memcpy(&v0, p + i, sizeof(v0));
        memcpy(&v1, p + i + 4, sizeof(v1));
        memcpy(&v2, p + i + 8, sizeof(v2));
        memcpy(&v3, p + i + 12, sizeof(v3));
        a0 += v0;
        a1 += v1;
        a2 += v2;
        a3 += v3;
    }
    float4 a = (a0 + a1) + (a2 + a3);
    float sum = a[0] + a[1] + a[2] + a[3];
    for (; i < n; i++) {
        sum += p[i];
    }
    return sum;
}

static void *sweep_thread(void *arg) {
    sweep_job *job = arg;
    job->sum = sum_floats(job->p, job->n);
    return NULL;
}

/* Reads of an L3-sized buffer: the slice summed L3_SWEEPS times, so thread start-up is noise. */
#define L3_SWEEPS 64

static void *sweep_l3_thread(void *arg) {
    sweep_job *job = arg;
    float sum = 0.0f;
    for (int r = 0; r < L3_SWEEPS; r++) {
        sum += sum_floats(job->p, job->n);
        __asm__ volatile("" ::: "memory"); /* each sweep reads again: not one sum, reused */
    }
    job->sum = sum;
    return NULL;
}

static void *fill_thread(void *arg) {
    sweep_job *job = arg;
    for (size_t i = 0; i < job->n; i++) {
        job->p[i] = 1.0f;
    }
    return NULL;
}

/* Runs fn over n_threads equal slices of buf (n floats) on n_threads new threads and returns the
 * wall time from the first create to the last join, or a negative value if a thread failed. */
static double run_slices(float *buf, size_t n, int32_t n_threads, void *(*fn)(void *),
                         float *sum_out) {
    pthread_t tids[2];
    sweep_job jobs[2];
    size_t per = n / (size_t)n_threads;
    double t0 = bench_seconds();
    int32_t started = 0;
    for (int32_t t = 0; t < n_threads; t++) {
        jobs[t].p = buf + (size_t)t * per;
        jobs[t].n = t == n_threads - 1 ? n - (size_t)t * per : per;
        jobs[t].sum = 0.0f;
        if (pthread_create(&tids[t], NULL, fn, &jobs[t]) != 0) {
            break;
        }
        started++;
    }
    for (int32_t t = 0; t < started; t++) {
        pthread_join(tids[t], NULL);
    }
    double elapsed = bench_seconds() - t0;
    float sum = 0.0f;
    for (int32_t t = 0; t < started; t++) {
        sum += jobs[t].sum;
    }
    *sum_out = sum;
    return started == n_threads ? elapsed : -1.0;
}

/* A buffer of `bytes` rounded down to whole 2 MiB pages, filled with 1.0f so that page faults
 * are never timed. The engine puts weights and KV blocks on 2 MiB pages; the sweeps do the
 * same, or the roofline would charge the engine for TLB misses it does not take. */
static float *swept_buffer(size_t bytes, size_t *n_out) {
    size_t huge = (size_t)2 << 20;
    size_t n = bytes / huge * huge / sizeof(float);
    float *buf = NULL;
    if (n == 0 || posix_memalign((void **)&buf, huge, n * sizeof(float)) != 0) {
        fprintf(stderr, "attn_bench: cannot allocate %zu MiB for the bandwidth sweep\n",
                bytes >> 20);
        return NULL;
    }
#ifdef MADV_HUGEPAGE
    (void)madvise(buf, n * sizeof(float), MADV_HUGEPAGE);
#endif
    float sink = 0.0f;
    if (run_slices(buf, n, 2, fill_thread, &sink) < 0) {
        free(buf);
        return NULL;
    }
    *n_out = n;
    return buf;
}

/* GB/s of one sweep of buf's n floats on n_threads threads (L3: L3_SWEEPS sweeps of L3_BYTES),
 * or a negative value. *sink gets the sum read. */
static double sweep_gbs(float *buf, size_t n, int32_t n_threads, bool is_l3, float *sink) {
    float sum = 0.0f;
    if (is_l3) {
        n = L3_BYTES / sizeof(float);
    }
    double s = run_slices(buf, n, n_threads, is_l3 ? sweep_l3_thread : sweep_thread, &sum);
    *sink += sum;
    double bytes = (double)(n * sizeof(float)) * (is_l3 ? L3_SWEEPS : 1);
    return s > 0 ? bytes / s * 1e-9 : -1.0;
}

/* SGEMM_N^3 operands, a and b random. */
typedef struct sgemm_operands {
    float *a, *b, *c;
} sgemm_operands;

static void sgemm_operands_free(sgemm_operands *g) {
    free(g->a);
    free(g->b);
    free(g->c);
}

static int sgemm_operands_make(uint64_t seed, sgemm_operands *g) {
    size_t nn = (size_t)SGEMM_N * SGEMM_N;
    g->a = malloc(nn * sizeof(float));
    g->b = malloc(nn * sizeof(float));
    g->c = malloc(nn * sizeof(float));
    if (g->a == NULL || g->b == NULL || g->c == NULL) {
        sgemm_operands_free(g);
        return ATTN_ENOMEM;
    }
    bench_rand_fill(g->a, nn, seed);
    bench_rand_fill(g->b, nn, seed + 1);
    memset(g->c, 0, nn * sizeof(float));
    return ATTN_OK;
}

/* GFLOP/s of one cblas_sgemm C = A B (row-major, no transposes). */
static double sgemm_gflops(const sgemm_operands *g) {
    double t0 = bench_seconds();
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, SGEMM_N, SGEMM_N, SGEMM_N, 1.0f, g->a,
                SGEMM_N, g->b, SGEMM_N, 0.0f, g->c, SGEMM_N);
    double s = bench_seconds() - t0;
    return 2.0 * SGEMM_N * (double)SGEMM_N * SGEMM_N / s * 1e-9;
}

static double max_of(double a, double b) {
    return a > b ? a : b;
}

int bench_limits_measure(size_t bw_bytes, int32_t n_runs, uint64_t seed, machine_limits *lim) {
    size_t n = 0;
    float *buf = swept_buffer(bw_bytes, &n);
    if (buf == NULL) {
        return ATTN_ENOMEM;
    }
    float sink = 0.0f;
    double bw[2] = {0.0, 0.0}, l3[2] = {0.0, 0.0};
    for (int32_t r = 0; r < n_runs; r++) {
        bw[0] = max_of(bw[0], sweep_gbs(buf, n, 1, false, &sink));
        bw[1] = max_of(bw[1], sweep_gbs(buf, n, 2, false, &sink));
        l3[0] = max_of(l3[0], sweep_gbs(buf, n, 1, true, &sink));
        l3[1] = max_of(l3[1], sweep_gbs(buf, n, 2, true, &sink));
    }
    free(buf);
    sgemm_operands g;
    if (bw[0] <= 0 || bw[1] <= 0 || l3[0] <= 0 || l3[1] <= 0 ||
        sgemm_operands_make(seed, &g) != ATTN_OK) {
        return ATTN_ENOMEM;
    }
    double peak = 0.0;
    for (int32_t r = 0; r <= n_runs; r++) {
        double gf = sgemm_gflops(&g);
        peak = r > 0 ? max_of(peak, gf) : peak; /* the first run warms OpenBLAS up */
    }
    sgemm_operands_free(&g);
    *lim = (machine_limits){.is_measured = true,
                            .sgemm_gflops = peak,
                            .bw_gbs = {bw[0], bw[1]},
                            .l3_gbs = {l3[0], l3[1]},
                            .bw_bytes = n * sizeof(float)};
    /* Every element is 1.0f, so a sum of 0 would mean the sweeps read nothing. */
    return sink > 0.0f ? ATTN_OK : ATTN_EINVAL;
}

struct bench_probe {
    int32_t n_threads;          /* the sweeps' (1 or 2, as bench_limits_measure's) */
    int32_t blas_threads;       /* OpenBLAS's during the sgemm */
    int32_t blas_threads_after; /* and after it */
    const attn_executor *ex;    /* runs the sweeps, or NULL */
    sgemm_operands g;
    float *buf; /* PROBE_DRAM_BYTES */
    size_t n;
    float sink;
};

int bench_probe_create(int32_t n_threads, int32_t blas_threads_after, const attn_executor *ex,
                       uint64_t seed, bench_probe **out) {
    bench_probe *p = calloc(1, sizeof *p);
    if (p == NULL) {
        return ATTN_ENOMEM;
    }
    p->n_threads = n_threads >= 2 ? 2 : 1;
    p->blas_threads = n_threads;
    p->blas_threads_after = blas_threads_after;
    p->ex = ex;
    p->buf = swept_buffer(PROBE_DRAM_BYTES, &p->n);
    if (p->buf == NULL || sgemm_operands_make(seed, &p->g) != ATTN_OK) {
        free(p->buf);
        free(p);
        return ATTN_ENOMEM;
    }
    *out = p;
    return ATTN_OK;
}

/* A sweep cut into PROBE_SLICES tasks for an executor, whose threads claim them as they come. */
#define PROBE_SLICES 16

typedef struct probe_sweep {
    float *buf;
    size_t per; /* floats a slice */
    float sums[PROBE_SLICES];
} probe_sweep;

static void probe_sweep_task(void *arg, int32_t i) {
    probe_sweep *w = arg;
    sweep_job job = {w->buf + (size_t)i * w->per, w->per, 0.0f};
    (void)sweep_thread(&job);
    w->sums[i] = job.sum;
}

/* One sweep on the executor's threads, the ones the engine's kernels run on: fresh threads
 * beside a pool that has just run start on a busy core and read a fifth less. */
static double probe_sweep_gbs(bench_probe *p) {
    probe_sweep w = {.buf = p->buf, .per = p->n / PROBE_SLICES};
    double t0 = bench_seconds();
    p->ex->run(p->ex->ctx, probe_sweep_task, &w, PROBE_SLICES);
    double s = bench_seconds() - t0;
    for (int32_t i = 0; i < PROBE_SLICES; i++) {
        p->sink += w.sums[i];
    }
    return (double)(w.per * PROBE_SLICES * sizeof(float)) / s * 1e-9;
}

/* Task i of an sgemm on the executor: C's i-th band of SGEMM_N / n rows, single-threaded BLAS. */
typedef struct probe_sgemm {
    const sgemm_operands *g;
    int32_t rows; /* a band's, the last one's the rest */
    int32_t n_bands;
} probe_sgemm;

static void probe_sgemm_task(void *arg, int32_t i) {
    const probe_sgemm *w = arg;
    size_t at = (size_t)i * (size_t)w->rows * SGEMM_N;
    int32_t rows = i == w->n_bands - 1 ? SGEMM_N - i * w->rows : w->rows;
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, rows, SGEMM_N, SGEMM_N, 1.0f,
                w->g->a + at, SGEMM_N, w->g->b, SGEMM_N, 0.0f, w->g->c + at, SGEMM_N);
}

/* One SGEMM_N^3 product. On an executor: one band of rows per thread, on the engine's threads.
 * OpenBLAS's own threads spin (sched_yield) for ~0.1 s after each call, and the next rep of the
 * case would share a core with them (a 0.5 ms batch took 1.8). On this VM the banded product
 * runs within a few per cent of OpenBLAS's threaded one (6 alternations: 130-153 against
 * 138-161 GFLOP/s). */
static double probe_sgemm_gflops(bench_probe *p) {
    if (p->ex == NULL) {
        openblas_set_num_threads(p->blas_threads);
        double gf = sgemm_gflops(&p->g);
        openblas_set_num_threads(p->blas_threads_after);
        return gf;
    }
    /* one band per executor thread: blas_threads is --threads, which the executor has too */
    probe_sgemm w = {.g = &p->g, .rows = SGEMM_N / p->blas_threads, .n_bands = p->blas_threads};
    double t0 = bench_seconds();
    p->ex->run(p->ex->ctx, probe_sgemm_task, &w, w.n_bands);
    double s = bench_seconds() - t0;
    return 2.0 * SGEMM_N * (double)SGEMM_N * SGEMM_N / s * 1e-9;
}

double bench_probe_run(bench_probe *p, bench_bound bound) {
    if (bound == BENCH_BOUND_SGEMM) {
        return probe_sgemm_gflops(p);
    }
    return p->ex != NULL ? probe_sweep_gbs(p)
                         : sweep_gbs(p->buf, p->n, p->n_threads, false, &p->sink);
}

void bench_probe_destroy(bench_probe *p) {
    if (p != NULL) {
        sgemm_operands_free(&p->g);
        free(p->buf);
        free(p);
    }
}
