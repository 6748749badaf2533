/* tests/check_harness.h: what the engine suites share: tolerance checks, small random models
 * built from tests/ref.c weights, a driver that feeds a sequence to the engine in chunks, test
 * executors and fixture file reading. It defines no suite (check_*.c is globbed by the Makefile,
 * and the suite table only picks up `Suite *x_suite(void)` definitions). */
#ifndef TESTS_CHECK_HARNESS_H
#define TESTS_CHECK_HARNESS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "../engine/attn.h"
#include "ref.h"

/* Engine vs reference tolerance: |got - want| <= ATOL + RTOL * |want|. The test tensors are O(1)
 * (inputs uniform in [-1, 1), nn.Linear-scaled weights), the engine computes in float with BLAS
 * reordering sums over up to ~1000 terms (|error| ~ 1e-6), and ref.c is exact to ~1e-15, so
 * 1e-5 absolute plus 1e-4 relative is tight yet leaves headroom for summation order. */
#define HARNESS_ATOL 1e-5
#define HARNESS_RTOL 1e-4

/* Fails the test at the first element of got (n floats) that is NaN or out of tolerance from
 * want, naming what, the index and both values. */
void harness_expect_close(const float *got, const float *want, size_t n, const char *what);
void harness_expect_close_tol(const float *got, const float *want, size_t n, double atol,
                              double rtol, const char *what);

/* Fails unless every element of a (n floats) is exactly 0 (so NaN fails too). */
void harness_expect_zero(const float *a, size_t n, const char *what);

/* A one-layer config: hidden 64, full half-style RoPE, theta 10000, max_seq 512, q/k/v and o
 * biases, no window, no scaling, default softmax scale. Tests change what they sweep. */
attn_config harness_config(int32_t n_heads, int32_t n_kv_heads, int32_t head_dim);

/* Llama 3.1's RoPE scaling (factor 8, low 1, high 4) over original_max_position positions. */
attn_rope_scaling harness_llama3_scaling(int32_t original_max_position);

/* A short human-readable summary of cfg for failure messages. */
void harness_describe(const attn_config *cfg, char *buf, size_t size);

/* Random weights for cfg->n_layers layers, kept both as ref_layer (for ref.c) and as an engine
 * model made by attn_model_create from the same tensors (biases passed only when the config has
 * them, since the engine must ignore them otherwise). Fails the test if the engine refuses. */
typedef struct harness_model {
    attn_config cfg;
    ref_layer *layers; /* cfg.n_layers */
    attn_model *model;
} harness_model;

void harness_model_init(harness_model *hm, const attn_config *cfg, uint64_t seed);
void harness_model_release(harness_model *hm);

/* The engine layer weights view of a ref_layer under cfg. */
attn_layer_weights harness_weights(const attn_config *cfg, const ref_layer *w);

/* malloc'd (n_tokens, hidden) input uniform in [-1, 1). */
float *harness_random_x(uint64_t seed, int32_t n_tokens, int32_t hidden);

/* calloc that fails the test instead of returning NULL. */
void *harness_calloc(size_t n, size_t size);

/* One sequence fed to one cache in chunks: tokens first .. n_tokens-1 of x (the cache must hold
 * exactly the first `first` tokens already), split into calls of chunks[0], chunks[1], ... tokens
 * (summing to n_tokens - first). out gets rows first.. of (n_tokens, hidden); when weights is
 * not NULL each call asks for weights and they are placed into the full (n_heads, n_tokens,
 * n_tokens) matrix (which is left as is elsewhere). key_valid and positions, when given, cover
 * all n_tokens; each call passes the prefix it needs. */
typedef struct harness_run {
    const attn_model *model;
    int32_t layer;
    attn_workspace *ws;
    attn_kv *kv;
    const float *x;
    const int32_t *positions;
    const uint8_t *key_valid;
    int32_t n_tokens;
    int32_t first;
    const int32_t *chunks;
    int32_t n_chunks;
    float *out;
    float *weights;
} harness_run;

/* Returns ATTN_OK or the first failing attn_forward code (later chunks are then not run). */
int harness_run_chunks(const harness_run *r);

/* The same sequence through ref.c: out (N, hidden), weights (n_heads, N, N) or NULL, k and v
 * (n_kv_heads, N, head_dim) or NULL. */
void harness_ref_run(const harness_model *hm, int32_t layer, const float *x,
                     const int32_t *positions, const uint8_t *key_valid, int32_t n_tokens,
                     float *out, float *weights, float *k, float *v);

/* The same, the reference rounding K and V to what a cache of kv_dtype holds (ref_kv_round). */
void harness_ref_run_kv(const harness_model *hm, int32_t layer, const float *x, int32_t n_tokens,
                        attn_dtype kv_dtype, float *out, float *weights, float *k, float *v);

/* Checks rows [first, n) of an engine (n, hidden) output against ref's. */
void harness_expect_rows(const float *got, const float *want, int32_t first, int32_t n,
                         int32_t hidden, const char *what);

/* Checks the rows [first, n) of (n_heads, n, n) weights, columns 0..n-1. */
void harness_expect_weight_rows(const float *got, const float *want, int32_t n_heads, int32_t first,
                                int32_t n, const char *what);

/* Checks the whole cache against ref's post-RoPE K/V (n_kv_heads, n, head_dim). */
void harness_expect_kv(const attn_kv *kv, const attn_config *cfg, const float *k, const float *v,
                       int32_t n, const char *what);

/* ---- executors for attn_workspace_create --------------------------------------------------- */

/* Runs the tasks one after another on the calling thread; counts calls and tasks. */
typedef struct harness_serial {
    int32_t n_runs;
    int32_t n_tasks;
} harness_serial;

attn_executor harness_serial_executor(harness_serial *state);

/* Runs the tasks on the calling thread and one pthread per run call, splitting even and odd
 * indices between them; counts calls and the tasks the second thread ran. */
typedef struct harness_threads {
    int32_t n_runs;
    int32_t n_tasks_other;
} harness_threads;

attn_executor harness_thread_executor(harness_threads *state);

/* ---- fixture files ------------------------------------------------------------------------- */

/* Reads the whole file at path (relative to the repo root, where tests run) into a malloc'd
 * buffer and checks that it holds exactly size bytes. */
void *harness_read_file(const char *path, size_t size);

#endif /* TESTS_CHECK_HARNESS_H */
