/* tests/check_batch.c: attn_forward with several steps (continuous batching). A batch of caches
 * at different lengths, with different token counts, masks, positions and weight requests, must
 * give each cache what running its step alone gives (engine vs engine: 1e-5 abs + 1e-5 rel) and
 * what ref gives (HARNESS_ATOL/RTOL); chunking a batch over a small workspace changes nothing;
 * and a failing batch (ATTN_ENOSPC, ATTN_ERANGE, ATTN_EINVAL) advances no cache at all. */
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check_harness.h"
#include "ref.h"

#define SAME_ATOL 1e-5
#define SAME_RTOL 1e-5

/* One sequence of a batch: `past` tokens already cached, then `n_new` in the batch step. */
typedef struct seq {
    int32_t past;
    int32_t n_new;
    float *x;           /* (past + n_new, hidden) */
    int32_t *positions; /* NULL, or (past + n_new) */
    uint8_t *key_valid; /* NULL, or (past + n_new) */
    bool want_weights;
    attn_kv *kv;
    float *out;     /* (past + n_new, hidden) */
    float *weights; /* NULL, or (n_heads, n_new, past + n_new) */
} seq;

typedef struct batch_env {
    harness_model hm;
    attn_kv_pool *pool;
    attn_workspace *ws;
} batch_env;

static void env_init(batch_env *e, const attn_config *cfg, int32_t n_blocks, int32_t ws_tokens,
                     const attn_executor *ex) {
    size_t block = 2 * (size_t)cfg->n_kv_heads * 16 * ref_head_dim(cfg) * sizeof(float);
    harness_model_init(&e->hm, cfg, 21);
    e->pool = NULL;
    e->ws = NULL;
    ck_assert_int_eq(attn_kv_pool_create(e->hm.model, block * n_blocks, 16, &e->pool), ATTN_OK);
    ck_assert_int_eq(attn_workspace_create(e->hm.model, ws_tokens, ex, &e->ws), ATTN_OK);
}

static void env_release(batch_env *e) {
    attn_workspace_destroy(e->ws);
    attn_kv_pool_destroy(e->pool);
    harness_model_release(&e->hm);
}

/* Allocates s's tensors, creates its cache and prefills its `past` tokens (in one call). */
static void seq_prefill(batch_env *e, seq *s, uint64_t seed) {
    const attn_config *cfg = &e->hm.cfg;
    int32_t n = s->past + s->n_new;
    s->x = harness_random_x(seed, n, cfg->hidden_size);
    s->out = harness_calloc((size_t)n * cfg->hidden_size, sizeof(float));
    if (s->want_weights) {
        s->weights = harness_calloc((size_t)cfg->n_heads * s->n_new * n, sizeof(float));
    }
    s->kv = NULL;
    ck_assert_int_eq(attn_kv_create(e->pool, &s->kv), ATTN_OK);
    if (s->past > 0) {
        int32_t chunks[1] = {s->past};
        harness_run r = {e->hm.model, 0, e->ws,  s->kv, s->x,   s->positions, s->key_valid,
                         n,           0, chunks, 1,     s->out, NULL};
        /* harness_run_chunks checks that the chunks cover n tokens: run only the prefix. */
        r.n_tokens = s->past;
        ck_assert_int_eq(harness_run_chunks(&r), ATTN_OK);
    }
}

static void seq_release(seq *s) {
    attn_kv_destroy(s->kv);
    free(s->weights);
    free(s->out);
    free(s->x);
    free(s->positions);
    free(s->key_valid);
    memset(s, 0, sizeof(*s));
}

static attn_step seq_step(const seq *s, int32_t hidden) {
    attn_step st;
    memset(&st, 0, sizeof(st));
    st.kv = s->kv;
    st.x = s->x + (size_t)s->past * hidden;
    st.n_tokens = s->n_new;
    st.positions = s->positions != NULL ? s->positions + s->past : NULL;
    st.key_valid = s->key_valid;
    st.out = s->out + (size_t)s->past * hidden;
    st.weights = s->weights;
    return st;
}

/* Runs the seqs' steps as one batch. Their out rows and weights are first set to NaN, so that
 * anything the engine fails to write is caught. */
static int run_batch(batch_env *e, seq *seqs, int32_t n_seqs) {
    const attn_config *cfg = &e->hm.cfg;
    attn_step steps[16];
    ck_assert_int_le(n_seqs, 16);
    for (int32_t i = 0; i < n_seqs; i++) {
        steps[i] = seq_step(&seqs[i], cfg->hidden_size);
        for (size_t j = 0; j < (size_t)steps[i].n_tokens * cfg->hidden_size; j++) {
            steps[i].out[j] = NAN;
        }
        size_t n_w = (size_t)cfg->n_heads * seqs[i].n_new * (seqs[i].past + seqs[i].n_new);
        for (size_t j = 0; steps[i].weights != NULL && j < n_w; j++) {
            steps[i].weights[j] = NAN;
        }
    }
    return attn_forward(e->hm.model, 0, e->ws, steps, n_seqs);
}

/* The step's output rows, weights and the whole cache against ref's pass over all its tokens. */
static void seq_expect_ref(const batch_env *e, const seq *s, const char *what) {
    const attn_config *cfg = &e->hm.cfg;
    const int32_t n = s->past + s->n_new;
    const size_t kv_count = (size_t)cfg->n_kv_heads * n * ref_head_dim(cfg);
    float *out_ref = harness_calloc((size_t)n * cfg->hidden_size, sizeof(float));
    float *w_ref = harness_calloc((size_t)cfg->n_heads * n * n, sizeof(float));
    float *k_ref = harness_calloc(kv_count, sizeof(float));
    float *v_ref = harness_calloc(kv_count, sizeof(float));
    char label[256];
    harness_ref_run(&e->hm, 0, s->x, s->positions, s->key_valid, n, out_ref, w_ref, k_ref, v_ref);
    snprintf(label, sizeof(label), "%s: out", what);
    harness_expect_rows(s->out, out_ref, s->past, n, cfg->hidden_size, label);
    snprintf(label, sizeof(label), "%s: cache", what);
    harness_expect_kv(s->kv, cfg, k_ref, v_ref, n, label);
    if (s->weights != NULL) {
        for (int32_t h = 0; h < cfg->n_heads; h++) {
            for (int32_t i = 0; i < s->n_new; i++) {
                snprintf(label, sizeof(label), "%s: weights (head %d, new token %d)", what, (int)h,
                         (int)i);
                harness_expect_close(s->weights + ((size_t)h * s->n_new + i) * n,
                                     w_ref + ((size_t)h * n + s->past + i) * n, (size_t)n, label);
            }
        }
    }
    free(v_ref);
    free(k_ref);
    free(w_ref);
    free(out_ref);
}

/* Four sequences: empty / 5 / 17 / 40 cached tokens, 6 / 1 / 1 / 3 new ones, weights asked by
 * two of them, padding in one, explicit positions in another. */
static void make_mixed_batch(batch_env *e, seq *seqs) {
    static const int32_t past[4] = {0, 5, 17, 40};
    static const int32_t n_new[4] = {6, 1, 1, 3};
    for (int i = 0; i < 4; i++) {
        seq *s = &seqs[i];
        int32_t n = past[i] + n_new[i];
        memset(s, 0, sizeof(*s));
        s->past = past[i];
        s->n_new = n_new[i];
        s->want_weights = i == 0 || i == 3;
        if (i == 2) {
            s->key_valid = harness_calloc((size_t)n, 1);
            for (int32_t j = 0; j < n; j++) {
                s->key_valid[j] = j != 3 && j != 17;
            }
        }
        if (i == 3) {
            s->positions = harness_calloc((size_t)n, sizeof(int32_t));
            for (int32_t j = 0; j < n; j++) {
                s->positions[j] = 100 + 2 * j;
            }
        }
        seq_prefill(e, s, (uint64_t)(31 + i));
    }
}

static void check_mixed_batch(const attn_config *cfg, int32_t ws_tokens) {
    batch_env e;
    seq seqs[4];
    seq alone[4];
    char desc[256];
    char what[400];
    harness_describe(cfg, desc, sizeof(desc));
    env_init(&e, cfg, 32, ws_tokens, NULL);
    make_mixed_batch(&e, seqs);

    /* The same steps alone, on forks taken before the batch, as the engine-vs-engine check. */
    for (int i = 0; i < 4; i++) {
        alone[i] = seqs[i];
        alone[i].out = harness_calloc((size_t)(seqs[i].past + seqs[i].n_new) * cfg->hidden_size,
                                      sizeof(float));
        alone[i].weights = NULL;
        alone[i].kv = NULL;
        ck_assert_int_eq(attn_kv_fork(seqs[i].kv, &alone[i].kv), ATTN_OK);
        ck_assert_int_eq(run_batch(&e, &alone[i], 1), ATTN_OK);
    }

    int rc = run_batch(&e, seqs, 4);
    ck_assert_msg(rc == ATTN_OK, "%s: batch = %d (%s)", desc, rc, attn_strerror(rc));
    for (int i = 0; i < 4; i++) {
        int32_t n = seqs[i].past + seqs[i].n_new;
        ck_assert_int_eq(attn_kv_len(seqs[i].kv), n);
        snprintf(what, sizeof(what), "%s, ws %d: step %d (past %d, new %d)", desc, (int)ws_tokens,
                 i, (int)seqs[i].past, (int)seqs[i].n_new);
        seq_expect_ref(&e, &seqs[i], what);
        size_t off = (size_t)seqs[i].past * cfg->hidden_size;
        char label[480];
        snprintf(label, sizeof(label), "%s: batched vs alone", what);
        harness_expect_close_tol(seqs[i].out + off, alone[i].out + off,
                                 (size_t)seqs[i].n_new * cfg->hidden_size, SAME_ATOL, SAME_RTOL,
                                 label);
        attn_kv_destroy(alone[i].kv);
        free(alone[i].out);
        seq_release(&seqs[i]);
    }
    ck_assert_int_eq(attn_kv_pool_blocks_free(e.pool), 32);
    env_release(&e);
}

START_TEST(test_batch_equals_each_alone) {
    attn_config cfg = harness_config(8, 2, 32);
    check_mixed_batch(&cfg, 64);
    cfg.sliding_window = 7;
    cfg.rope_style = ATTN_ROPE_STYLE_INTERLEAVED;
    check_mixed_batch(&cfg, 64);
    attn_config mqa = harness_config(4, 1, 80);
    mqa.has_qkv_bias = false;
    check_mixed_batch(&mqa, 64);
}
END_TEST

/* 11 new tokens over a workspace of 4, then of 1: steps are split across chunks. */
START_TEST(test_batch_chunked_over_small_workspace) {
    attn_config cfg = harness_config(8, 4, 32);
    check_mixed_batch(&cfg, 4);
    check_mixed_batch(&cfg, 1);
}
END_TEST

/* Eight decodes at different lengths in one step, spread over two threads by the executor. */
START_TEST(test_batch_many_decodes_with_threads) {
    attn_config cfg = harness_config(8, 2, 64);
    harness_threads state;
    attn_executor ex = harness_thread_executor(&state);
    batch_env e;
    seq seqs[8];
    env_init(&e, &cfg, 64, 16, &ex);
    for (int i = 0; i < 8; i++) {
        memset(&seqs[i], 0, sizeof(seqs[i]));
        seqs[i].past = 1 + 9 * i;
        seqs[i].n_new = 1;
        seqs[i].want_weights = i % 3 == 0;
        seq_prefill(&e, &seqs[i], (uint64_t)(50 + i));
    }
    ck_assert_int_eq(run_batch(&e, seqs, 8), ATTN_OK);
    for (int i = 0; i < 8; i++) {
        char what[64];
        snprintf(what, sizeof(what), "decode %d (past %d)", i, (int)seqs[i].past);
        seq_expect_ref(&e, &seqs[i], what);
        seq_release(&seqs[i]);
    }
    ck_assert_int_gt(state.n_runs, 0);
    env_release(&e);
}
END_TEST

/* ---- pipelined decode --------------------------------------------------------------------- */

/* Eight decodes on a model with 4 KV groups and an executor: the chunk's projection and
 * attention run as one executor batch, group by group (forward.c's pipeline), and every
 * output, weight and cache row still matches ref. */
static void check_pipelined_decodes(const attn_config *cfg) {
    harness_threads state;
    attn_executor ex = harness_thread_executor(&state);
    batch_env e;
    seq seqs[8];
    env_init(&e, cfg, 96, 16, &ex);
    for (int i = 0; i < 8; i++) {
        memset(&seqs[i], 0, sizeof(seqs[i]));
        seqs[i].past = 3 + 11 * i;
        seqs[i].n_new = i == 5 ? 2 : 1; /* a speculative pair among the single tokens */
        seqs[i].want_weights = i % 3 == 1;
        seq_prefill(&e, &seqs[i], (uint64_t)(70 + i));
    }
    int32_t runs = state.n_runs;
    ck_assert_int_eq(run_batch(&e, seqs, 8), ATTN_OK);
    /* q/k/v with attention, then the output projection: two batches, not three */
    ck_assert_int_eq(state.n_runs - runs, 2);
    ck_assert_int_gt(state.n_tasks_other, 0);
    for (int i = 0; i < 8; i++) {
        char what[96];
        snprintf(what, sizeof(what), "pipelined decode %d (past %d)", i, (int)seqs[i].past);
        seq_expect_ref(&e, &seqs[i], what);
        seq_release(&seqs[i]);
    }
    env_release(&e);
}

START_TEST(test_batch_pipelined_decodes) {
    attn_config cfg = harness_config(8, 4, 32);
    cfg.hidden_size = 256;
    check_pipelined_decodes(&cfg);
    cfg.sliding_window = 9;
    cfg.rope_style = ATTN_ROPE_STYLE_INTERLEAVED;
    cfg.has_sinks = true;
    check_pipelined_decodes(&cfg);
    attn_config gqa = harness_config(16, 4, 16); /* four query heads a group */
    gqa.hidden_size = 256;
    gqa.has_qkv_bias = false;
    check_pipelined_decodes(&gqa);
    attn_config partial = harness_config(8, 4, 32); /* half the dims rotated, llama3's scaling */
    partial.hidden_size = 256;
    partial.rotary_dim = 16;
    partial.rope_scaling = harness_llama3_scaling(64);
    check_pipelined_decodes(&partial);
}
END_TEST

/* A per-head q/k norm (RMSNorm, LayerNorm with a weight per head) and clip_qkv's clamp are
 * applied group by group in the pipeline: with BF16 weights, a sequence's outputs with an executor
 * (pipelined) equal those without one (everything in order on the calling thread). */
static void check_pipelined_norm(attn_qk_norm norm, float clip_qkv) {
    attn_config cfg = harness_config(8, 4, 32);
    cfg.hidden_size = 256;
    harness_model hm;
    harness_model_init(&hm, &cfg, 31); /* for its random projections */
    attn_layer_weights lw = harness_weights(&cfg, &hm.layers[0]);
    cfg.qk_norm = norm;
    cfg.clip_qkv = clip_qkv;
    /* one weight for every head, or one each */
    bool is_shared = norm == ATTN_QK_NORM_HEAD || norm == ATTN_QK_NORM_HEAD_LAYERNORM_BIAS;
    float *q_norm = harness_random_x(5, 1, 32 * (is_shared ? 1 : cfg.n_heads));
    float *k_norm = harness_random_x(6, 1, 32 * (is_shared ? 1 : cfg.n_kv_heads));
    float *biases = harness_random_x(8, 2, 32); /* Phi's: q's, then k's */
    lw.q_norm = q_norm;
    lw.k_norm = k_norm;
    lw.q_norm_bias = biases;
    lw.k_norm_bias = biases + 32;
    attn_load_params params = {0, 0, 0, NULL, ATTN_DTYPE_BF16, NULL};
    attn_model *m = NULL;
    ck_assert_int_eq(attn_model_create(&cfg, &lw, &params, &m), ATTN_OK);
    harness_threads state;
    attn_executor ex = harness_thread_executor(&state);
    attn_workspace *ws[2] = {NULL, NULL};
    attn_kv_pool *pool = NULL;
    ck_assert_int_eq(attn_workspace_create(m, 16, &ex, &ws[0]), ATTN_OK);
    ck_assert_int_eq(attn_workspace_create(m, 16, NULL, &ws[1]), ATTN_OK);
    ck_assert_int_eq(attn_kv_pool_create(m, (size_t)8 << 20, 16, &pool), ATTN_OK);
    const int32_t n = 24;
    float *x = harness_random_x(7, n, cfg.hidden_size);
    float *out[2];
    for (int w = 0; w < 2; w++) {
        attn_kv *kv = NULL;
        ck_assert_int_eq(attn_kv_create(pool, &kv), ATTN_OK);
        out[w] = harness_calloc((size_t)n * cfg.hidden_size, sizeof(float));
        /* a 12-token prefill (itself a few rows: pipelined too), then single tokens */
        for (int32_t t = 0; t < n; t += t == 0 ? 12 : 1) {
            attn_step st;
            memset(&st, 0, sizeof(st));
            st.kv = kv;
            st.x = x + (size_t)t * cfg.hidden_size;
            st.n_tokens = t == 0 ? 12 : 1;
            st.out = out[w] + (size_t)t * cfg.hidden_size;
            ck_assert_int_eq(attn_forward(m, 0, ws[w], &st, 1), ATTN_OK);
        }
        attn_kv_destroy(kv);
    }
    ck_assert_int_gt(state.n_tasks_other, 0);
    harness_expect_close_tol(out[0], out[1], (size_t)n * cfg.hidden_size, 1e-6, 1e-6,
                             "pipelined vs on the calling thread");
    free(out[0]);
    free(out[1]);
    free(x);
    free(q_norm);
    free(k_norm);
    free(biases);
    attn_kv_pool_destroy(pool);
    attn_workspace_destroy(ws[0]);
    attn_workspace_destroy(ws[1]);
    attn_model_destroy(m);
    harness_model_release(&hm);
}

START_TEST(test_batch_pipelined_per_head_norms) {
    check_pipelined_norm(ATTN_QK_NORM_HEAD, 0.0f);
    check_pipelined_norm(ATTN_QK_NORM_HEAD_LAYERNORM, 0.0f);
    check_pipelined_norm(ATTN_QK_NORM_HEAD_LAYERNORM_BIAS, 0.0f);
    check_pipelined_norm(ATTN_QK_NORM_NONE, 0.05f);
    check_pipelined_norm(ATTN_QK_NORM_HEAD, 0.05f);
}
END_TEST

/* ---- all or nothing ------------------------------------------------------------------------ */

typedef struct snapshot {
    int32_t len;
    float *k;
    float *v;
} snapshot;

static snapshot take_snapshot(const attn_kv *kv, const attn_config *cfg) {
    snapshot s;
    s.len = attn_kv_len(kv);
    size_t count = (size_t)cfg->n_kv_heads * s.len * ref_head_dim(cfg);
    s.k = harness_calloc(count, sizeof(float));
    s.v = harness_calloc(count, sizeof(float));
    ck_assert_int_eq(attn_kv_read(kv, 0, s.len, s.k, s.v), ATTN_OK);
    return s;
}

/* Fails unless kv holds exactly what it held at the snapshot; frees the snapshot. */
static void expect_snapshot(const attn_kv *kv, const attn_config *cfg, snapshot *s,
                            const char *what) {
    snapshot now = take_snapshot(kv, cfg);
    size_t bytes = (size_t)cfg->n_kv_heads * s->len * ref_head_dim(cfg) * sizeof(float);
    ck_assert_msg(now.len == s->len, "%s: length %d, was %d", what, (int)now.len, (int)s->len);
    ck_assert_msg(memcmp(now.k, s->k, bytes) == 0 && memcmp(now.v, s->v, bytes) == 0,
                  "%s: cache content changed", what);
    free(now.v);
    free(now.k);
    free(s->v);
    free(s->k);
}

/* Caches at 10, 32 and 16 tokens fill a pool of 4 blocks. A batch where one step fits in its
 * last block and another needs a new block fails as a whole; then the fitting step alone works
 * and is exact. */
START_TEST(test_batch_enospc_is_all_or_nothing) {
    attn_config cfg = harness_config(4, 2, 16);
    batch_env e;
    seq seqs[3];
    static const int32_t past[3] = {10, 32, 16};
    env_init(&e, &cfg, 4, 64, NULL);
    for (int i = 0; i < 3; i++) {
        memset(&seqs[i], 0, sizeof(seqs[i]));
        seqs[i].past = past[i];
        seqs[i].n_new = i == 0 ? 2 : 1;
        seq_prefill(&e, &seqs[i], (uint64_t)(60 + i));
    }
    ck_assert_int_eq(attn_kv_pool_blocks_free(e.pool), 0);
    snapshot snap[3];
    for (int i = 0; i < 3; i++) {
        snap[i] = take_snapshot(seqs[i].kv, &cfg);
    }
    ck_assert_int_eq(attn_kv_blocks_needed(seqs[0].kv, 2), 0);
    ck_assert_int_eq(attn_kv_blocks_needed(seqs[1].kv, 1), 1);
    ck_assert_int_eq(run_batch(&e, seqs, 2), ATTN_ENOSPC);
    ck_assert_int_eq(attn_kv_pool_blocks_free(e.pool), 0);
    for (int i = 0; i < 3; i++) {
        char what[32];
        snprintf(what, sizeof(what), "cache %d", i);
        expect_snapshot(seqs[i].kv, &cfg, &snap[i], what);
    }
    ck_assert_int_eq(run_batch(&e, seqs, 1), ATTN_OK);
    seq_expect_ref(&e, &seqs[0], "the fitting step after the failed batch");
    for (int i = 0; i < 3; i++) {
        seq_release(&seqs[i]);
    }
    env_release(&e);
}
END_TEST

/* One bad step (a position past max_seq; a cache that would pass max_seq; n_tokens 0; NULL x)
 * fails the whole batch with its code, and the good steps' caches stay as they were. */
START_TEST(test_batch_bad_step_fails_whole_batch) {
    attn_config cfg = harness_config(4, 2, 16);
    cfg.max_seq = 48;
    batch_env e;
    env_init(&e, &cfg, 16, 64, NULL);
    for (int bad = 0; bad < 4; bad++) {
        seq seqs[3];
        static const int32_t past[3] = {3, 20, 45};
        for (int i = 0; i < 3; i++) {
            memset(&seqs[i], 0, sizeof(seqs[i]));
            seqs[i].past = past[i];
            seqs[i].n_new = i == 2 && bad == 1 ? 4 : 2; /* 45 + 4 > 48 */
            if (i == 1 && bad == 0) {
                seqs[i].positions = harness_calloc(22, sizeof(int32_t));
                for (int j = 0; j < 22; j++) {
                    seqs[i].positions[j] = j;
                }
                seqs[i].positions[21] = 48;
            }
            seq_prefill(&e, &seqs[i], (uint64_t)(70 + 3 * bad + i));
        }
        snapshot snap[3];
        for (int i = 0; i < 3; i++) {
            snap[i] = take_snapshot(seqs[i].kv, &cfg);
        }
        attn_step steps[3];
        for (int i = 0; i < 3; i++) {
            steps[i] = seq_step(&seqs[i], cfg.hidden_size);
        }
        int want = ATTN_ERANGE;
        if (bad == 2) {
            steps[1].n_tokens = 0;
            want = ATTN_EINVAL;
        } else if (bad == 3) {
            steps[2].x = NULL;
            want = ATTN_EINVAL;
        }
        int rc = attn_forward(e.hm.model, 0, e.ws, steps, 3);
        ck_assert_msg(rc == want, "bad step kind %d: got %d (%s), want %d", bad, rc,
                      attn_strerror(rc), want);
        for (int i = 0; i < 3; i++) {
            char what[64];
            snprintf(what, sizeof(what), "bad step kind %d, cache %d", bad, i);
            expect_snapshot(seqs[i].kv, &cfg, &snap[i], what);
            seq_release(&seqs[i]);
        }
    }
    ck_assert_int_eq(attn_kv_pool_blocks_free(e.pool), 16);
    env_release(&e);
}
END_TEST

/* `extern` keeps this prototype out of the Makefile's suite-table scan, which matches lines
 * starting with `Suite *`. */
extern Suite *batch_suite(void);

Suite *batch_suite(void) {
    Suite *s = suite_create("batch");
    TCase *tc = tcase_create("batch");
    tcase_set_timeout(tc, 30);
    tcase_add_test(tc, test_batch_equals_each_alone);
    tcase_add_test(tc, test_batch_chunked_over_small_workspace);
    tcase_add_test(tc, test_batch_many_decodes_with_threads);
    tcase_add_test(tc, test_batch_pipelined_decodes);
    tcase_add_test(tc, test_batch_pipelined_per_head_norms);
    tcase_add_test(tc, test_batch_enospc_is_all_or_nothing);
    tcase_add_test(tc, test_batch_bad_step_fails_whole_batch);
    suite_add_tcase(s, tc);
    return s;
}
