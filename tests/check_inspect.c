/* tests/check_inspect.c: attn_inspect (selective probabilities, scores and log-sum-exp, head
 * reductions, captures) and head_scale against tests/ref.c. A sequence goes through a cache in
 * calls (chunked inside by a small workspace); each call inspects itself, and its selection must
 * equal the reference's full matrices at the call's rows. Probabilities and captures: HARNESS
 * tolerances; scores and LSE (absolute values of a few units): 1e-5 absolute + 1e-5 relative.
 * Also: the split-K path's merged LSE, attn_sdpa's and attn_forward_qkv's inspections, and the
 * checks that refuse a bad selection. */
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check_harness.h"
#include "ref.h"

#define SCORE_ATOL 1e-5
#define SCORE_RTOL 1e-5

/* The reference's matrices for one sequence: (n_heads, N, N) probabilities and scores, (n_heads,
 * N) LSE, (n_heads, N, d) post-RoPE q and contexts, (n_kv, N, d) K and V, and the output. */
typedef struct ref_all {
    int32_t n;
    float *out, *probs, *scores, *lse, *q, *k, *v, *head_out;
} ref_all;

static void ref_all_run(ref_all *r, const harness_model *hm, const float *x, int32_t n,
                        const uint8_t *key_valid, const float *head_scale) {
    const attn_config *c = &hm->cfg;
    size_t hd = (size_t)ref_head_dim(c);
    r->n = n;
    r->out = harness_calloc((size_t)n * c->hidden_size, sizeof(float));
    r->probs = harness_calloc((size_t)c->n_heads * n * n, sizeof(float));
    r->scores = harness_calloc((size_t)c->n_heads * n * n, sizeof(float));
    r->lse = harness_calloc((size_t)c->n_heads * n, sizeof(float));
    r->q = harness_calloc((size_t)c->n_heads * n * hd, sizeof(float));
    r->head_out = harness_calloc((size_t)c->n_heads * n * hd, sizeof(float));
    r->k = harness_calloc((size_t)c->n_kv_heads * n * hd, sizeof(float));
    r->v = harness_calloc((size_t)c->n_kv_heads * n * hd, sizeof(float));
    ref_forward_args a;
    memset(&a, 0, sizeof(a));
    a.n_tokens = n;
    a.x = x;
    a.key_valid = key_valid;
    a.out = r->out;
    a.weights = r->probs;
    a.scores = r->scores;
    a.lse = r->lse;
    a.q_rot = r->q;
    a.head_out = r->head_out;
    a.k = r->k;
    a.v = r->v;
    a.head_scale = head_scale;
    ref_layer_forward(c, &hm->layers[0], &a);
}

static void ref_all_release(ref_all *r) {
    free(r->out);
    free(r->probs);
    free(r->scores);
    free(r->lse);
    free(r->q);
    free(r->head_out);
    free(r->k);
    free(r->v);
}

/* a == b within tolerance, -inf only where the other is -inf too. */
static void expect_value(float got, float want, double atol, double rtol, const char *what,
                         int32_t i0, int32_t i1, int32_t i2) {
    if (isinf(want) || isinf(got)) {
        ck_assert_msg(got == want, "%s [%d,%d,%d]: got %g, want %g", what, (int)i0, (int)i1,
                      (int)i2, (double)got, (double)want);
        return;
    }
    ck_assert_msg(fabs((double)got - want) <= atol + rtol * fabs((double)want),
                  "%s [%d,%d,%d]: got %.9g, want %.9g", what, (int)i0, (int)i1, (int)i2,
                  (double)got, (double)want);
}

/* The reference's value of the selection's cell (hs, rs, kk): a reduction over its heads. */
static float ref_cell(const ref_all *r, const attn_config *c, const attn_inspect *ins, int32_t p,
                      int32_t hs, int32_t rs, int32_t kk) {
    int32_t n = r->n;
    int32_t n_sel = ins->heads != NULL ? ins->n_heads : c->n_heads;
    int32_t row = p + (ins->rows != NULL ? ins->rows[rs] : rs);
    int32_t key = ins->key_first + kk;
    double acc = ins->reduce == ATTN_REDUCE_MAX_HEADS ? -INFINITY : 0.0;
    int32_t h_lo = ins->reduce == ATTN_REDUCE_NONE ? hs : 0;
    int32_t h_hi = ins->reduce == ATTN_REDUCE_NONE ? hs + 1 : n_sel;
    for (int32_t i = h_lo; i < h_hi; i++) {
        int32_t h = ins->heads != NULL ? ins->heads[i] : i;
        double v = ins->kind == ATTN_INSPECT_LSE      ? r->lse[(size_t)h * n + row]
                   : ins->kind == ATTN_INSPECT_SCORES ? r->scores[((size_t)h * n + row) * n + key]
                                                      : r->probs[((size_t)h * n + row) * n + key];
        if (ins->reduce == ATTN_REDUCE_MAX_HEADS) {
            acc = v > acc ? v : acc;
        } else {
            acc += v;
        }
    }
    return (float)(ins->reduce == ATTN_REDUCE_MEAN_HEADS ? acc / n_sel : acc);
}

/* Checks every cell of a call's inspection output (the call's tokens start at index p). */
static void expect_selection(const ref_all *r, const attn_config *c, const attn_inspect *ins,
                             int32_t p, int32_t n_tokens, const char *what) {
    int32_t n_h = ins->reduce != ATTN_REDUCE_NONE ? 1
                  : ins->heads != NULL            ? ins->n_heads
                                                  : c->n_heads;
    int32_t n_r = ins->rows != NULL ? ins->n_rows : n_tokens;
    int32_t n_k = ins->kind == ATTN_INSPECT_LSE ? 1 : ins->n_keys;
    bool is_prob = ins->kind == ATTN_INSPECT_PROBS;
    for (int32_t hs = 0; hs < n_h; hs++) {
        for (int32_t rs = 0; rs < n_r; rs++) {
            for (int32_t kk = 0; kk < n_k; kk++) {
                float got = ins->out[((size_t)hs * n_r + rs) * n_k + kk];
                float want = ref_cell(r, c, ins, p, hs, rs, kk);
                expect_value(got, want, is_prob ? HARNESS_ATOL : SCORE_ATOL,
                             is_prob ? HARNESS_RTOL : SCORE_RTOL, what, hs, rs, kk);
            }
        }
    }
}

/* Rows [p, p + t) of a (heads, N, d) reference tensor against a call's (heads, t, d) capture. */
static void expect_capture(const float *got, const float *want, int32_t heads, int32_t n, int32_t p,
                           int32_t t, int32_t d, const char *what) {
    for (int32_t h = 0; h < heads; h++) {
        char label[300];
        snprintf(label, sizeof(label), "%s, head %d", what, (int)h);
        harness_expect_close(got + (size_t)h * t * d, want + ((size_t)h * n + p) * d, (size_t)t * d,
                             label);
    }
}

typedef struct inspect_case {
    attn_config cfg;
    int32_t n_tokens;
    const int32_t *calls;
    int32_t n_calls;
    const uint8_t *key_valid;
    int32_t ws_tokens;
    const attn_executor *ex;
} inspect_case;

/* One kind and reduction over each call: every head, row and key; then a sparse selection. */
static void check_case(const inspect_case *ic, attn_inspect_kind kind, attn_inspect_reduce reduce,
                       bool sparse) {
    const attn_config *c = &ic->cfg;
    int32_t n = ic->n_tokens, hd = ref_head_dim(c);
    char desc[200], what[400];
    harness_describe(c, desc, sizeof(desc));
    harness_model hm;
    harness_model_init(&hm, c, 7);
    float *x = harness_random_x(11, n, c->hidden_size);
    ref_all r;
    ref_all_run(&r, &hm, x, n, ic->key_valid, NULL);
    attn_kv_pool *pool = NULL;
    attn_workspace *ws = NULL;
    attn_kv *kv = NULL;
    ck_assert_int_eq(attn_kv_pool_create(hm.model, (size_t)64 << 20, 16, &pool), ATTN_OK);
    ck_assert_int_eq(attn_workspace_create(hm.model, ic->ws_tokens, ic->ex, &ws), ATTN_OK);
    ck_assert_int_eq(attn_kv_create(pool, &kv), ATTN_OK);
    float *out = harness_calloc((size_t)n * c->hidden_size, sizeof(float));
    int32_t p = 0;
    for (int32_t ci = 0; ci < ic->n_calls; ci++) {
        int32_t t = ic->calls[ci];
        int32_t heads[2] = {c->n_heads > 2 ? 1 : 0, c->n_heads - 1}, rows[2] = {0, t - 1};
        attn_inspect ins = {.kind = kind, .reduce = reduce, .key_first = 0, .n_keys = p + t};
        if (sparse) {
            ins.heads = heads;
            ins.n_heads = 2;
            ins.rows = t > 1 ? rows : rows + 1;
            ins.n_rows = t > 1 ? 2 : 1;
            ins.key_first = p + t > 4 ? 2 : 0;
            ins.n_keys = p + t - ins.key_first - (p + t > 4 ? 1 : 0);
        }
        size_t cells = (size_t)c->n_heads * t * (p + t);
        ins.out = harness_calloc(cells, sizeof(float));
        ins.q = harness_calloc((size_t)c->n_heads * t * hd, sizeof(float));
        ins.head_out = harness_calloc((size_t)c->n_heads * t * hd, sizeof(float));
        ins.k = harness_calloc((size_t)c->n_kv_heads * t * hd, sizeof(float));
        ins.v = harness_calloc((size_t)c->n_kv_heads * t * hd, sizeof(float));
        uint8_t *valid = NULL;
        if (ic->key_valid != NULL) {
            valid = harness_calloc((size_t)(p + t), 1);
            memcpy(valid, ic->key_valid, (size_t)(p + t));
        }
        attn_step st = {.kv = kv,
                        .x = x + (size_t)p * c->hidden_size,
                        .n_tokens = t,
                        .key_valid = valid,
                        .out = out + (size_t)p * c->hidden_size,
                        .inspect = &ins};
        int rc = attn_forward(hm.model, 0, ws, &st, 1);
        ck_assert_msg(rc == ATTN_OK, "%s: forward (call %d) = %d", desc, (int)ci, rc);
        snprintf(what, sizeof(what), "%s: kind %d reduce %d sparse %d call %d", desc, (int)kind,
                 (int)reduce, (int)sparse, (int)ci);
        expect_selection(&r, c, &ins, p, t, what);
        expect_capture(ins.q, r.q, c->n_heads, n, p, t, hd, "q capture");
        expect_capture(ins.head_out, r.head_out, c->n_heads, n, p, t, hd, "head_out capture");
        expect_capture(ins.k, r.k, c->n_kv_heads, n, p, t, hd, "k capture");
        expect_capture(ins.v, r.v, c->n_kv_heads, n, p, t, hd, "v capture");
        free(valid);
        free(ins.out);
        free(ins.q);
        free(ins.head_out);
        free(ins.k);
        free(ins.v);
        p += t;
    }
    snprintf(what, sizeof(what), "%s: output beside an inspection", desc);
    harness_expect_close(out, r.out, (size_t)n * c->hidden_size, what);
    free(out);
    attn_kv_destroy(kv);
    attn_workspace_destroy(ws);
    attn_kv_pool_destroy(pool);
    ref_all_release(&r);
    free(x);
    harness_model_release(&hm);
}

static void check_case_all(const inspect_case *ic) {
    static const attn_inspect_kind kinds[] = {ATTN_INSPECT_PROBS, ATTN_INSPECT_SCORES,
                                              ATTN_INSPECT_LSE};
    for (size_t k = 0; k < 3; k++) {
        for (int reduce = ATTN_REDUCE_NONE; reduce <= ATTN_REDUCE_MAX_HEADS; reduce++) {
            check_case(ic, kinds[k], (attn_inspect_reduce)reduce, false);
            check_case(ic, kinds[k], (attn_inspect_reduce)reduce, true);
        }
    }
}

/* GQA with sinks and a window, prefilled in calls that a 24-token workspace chunks further, then
 * decoded: each call's selection against the reference's matrices at its rows. */
START_TEST(test_inspect_gqa_sinks_window) {
    static const int32_t calls[] = {45, 20, 1, 1};
    inspect_case ic = {.cfg = harness_config(8, 2, 32),
                       .n_tokens = 67,
                       .calls = calls,
                       .n_calls = 4,
                       .ws_tokens = 24};
    ic.cfg.has_sinks = true;
    ic.cfg.sliding_window = 30;
    check_case_all(&ic);
}
END_TEST

/* MHA with a padding mask (some rows see nothing: LSE -inf, probabilities 0) on two threads. */
START_TEST(test_inspect_padding_threads) {
    static const int32_t calls[] = {5, 30, 2};
    static uint8_t valid[37];
    for (int32_t j = 0; j < 37; j++) {
        valid[j] = j >= 3 && j % 7 != 4;
    }
    harness_threads state;
    attn_executor ex = harness_thread_executor(&state);
    inspect_case ic = {.cfg = harness_config(4, 4, 16),
                       .n_tokens = 37,
                       .calls = calls,
                       .n_calls = 3,
                       .key_valid = valid,
                       .ws_tokens = 64,
                       .ex = &ex};
    check_case_all(&ic);
}
END_TEST

/* Split-K: a decode step over 2100 keys with an executor merges partial tasks, and the LSE comes
 * from that merge. MQA with sinks. */
START_TEST(test_inspect_split_k_lse) {
    static const int32_t calls[] = {1024, 1075, 1};
    harness_threads state;
    attn_executor ex = harness_thread_executor(&state);
    inspect_case ic = {.cfg = harness_config(2, 1, 16),
                       .n_tokens = 2100,
                       .calls = calls,
                       .n_calls = 3,
                       .ws_tokens = 1100,
                       .ex = &ex};
    ic.cfg.has_sinks = true;
    ic.cfg.max_seq = 4096;
    check_case(&ic, ATTN_INSPECT_LSE, ATTN_REDUCE_NONE, false);
    check_case(&ic, ATTN_INSPECT_PROBS, ATTN_REDUCE_NONE, true);
}
END_TEST

/* head_scale scales each head's context before wo (the reference does the same), and leaves the
 * cache as it was: the next step without it equals a never-scaled cache's. */
START_TEST(test_inspect_head_scale) {
    attn_config c = harness_config(4, 2, 16);
    int32_t n = 12;
    harness_model hm;
    harness_model_init(&hm, &c, 3);
    float *x = harness_random_x(5, n, c.hidden_size);
    float scale[4] = {1.0f, 0.0f, 0.5f, -2.0f};
    ref_all plain, scaled;
    ref_all_run(&plain, &hm, x, n, NULL, NULL);
    ref_all_run(&scaled, &hm, x, n, NULL, scale);
    attn_kv_pool *pool = NULL;
    attn_workspace *ws = NULL;
    attn_kv *kv = NULL;
    ck_assert_int_eq(attn_kv_pool_create(hm.model, (size_t)8 << 20, 16, &pool), ATTN_OK);
    ck_assert_int_eq(attn_workspace_create(hm.model, 64, NULL, &ws), ATTN_OK);
    ck_assert_int_eq(attn_kv_create(pool, &kv), ATTN_OK);
    float *out = harness_calloc((size_t)n * c.hidden_size, sizeof(float));
    attn_step st = {.kv = kv, .x = x, .n_tokens = n - 1, .out = out, .head_scale = scale};
    ck_assert_int_eq(attn_forward(hm.model, 0, ws, &st, 1), ATTN_OK);
    harness_expect_close(out, scaled.out, (size_t)(n - 1) * c.hidden_size, "scaled output");
    attn_step last = {.kv = kv,
                      .x = x + (size_t)(n - 1) * c.hidden_size,
                      .n_tokens = 1,
                      .out = out + (size_t)(n - 1) * c.hidden_size};
    ck_assert_int_eq(attn_forward(hm.model, 0, ws, &last, 1), ATTN_OK);
    harness_expect_rows(out, plain.out, n - 1, n, c.hidden_size, "the next step, unscaled");
    float bad[4] = {1.0f, NAN, 1.0f, 1.0f};
    last.head_scale = bad;
    ck_assert_int_eq(attn_forward(hm.model, 0, ws, &last, 1), ATTN_EINVAL);
    free(out);
    attn_kv_destroy(kv);
    attn_workspace_destroy(ws);
    attn_kv_pool_destroy(pool);
    ref_all_release(&plain);
    ref_all_release(&scaled);
    free(x);
    harness_model_release(&hm);
}
END_TEST

/* Bad selections are refused before anything changes. */
START_TEST(test_inspect_refusals) {
    attn_config c = harness_config(4, 2, 16);
    harness_model hm;
    harness_model_init(&hm, &c, 3);
    float *x = harness_random_x(5, 4, c.hidden_size);
    attn_kv_pool *pool = NULL;
    attn_workspace *ws = NULL;
    attn_kv *kv = NULL;
    ck_assert_int_eq(attn_kv_pool_create(hm.model, (size_t)8 << 20, 16, &pool), ATTN_OK);
    ck_assert_int_eq(attn_workspace_create(hm.model, 64, NULL, &ws), ATTN_OK);
    ck_assert_int_eq(attn_kv_create(pool, &kv), ATTN_OK);
    float out[4 * 256], cells[4 * 4 * 4];
    int32_t down[2] = {2, 1}, far[1] = {4}, rows_far[1] = {4};
    attn_inspect cases[] = {
        {.kind = ATTN_INSPECT_PROBS, .heads = down, .n_heads = 2, .n_keys = 4, .out = cells},
        {.kind = ATTN_INSPECT_PROBS, .heads = far, .n_heads = 1, .n_keys = 4, .out = cells},
        {.kind = ATTN_INSPECT_PROBS, .rows = rows_far, .n_rows = 1, .n_keys = 4, .out = cells},
        {.kind = ATTN_INSPECT_PROBS, .key_first = 1, .n_keys = 4, .out = cells},
        {.kind = (attn_inspect_kind)7, .n_keys = 4, .out = cells},
    };
    static const int want[] = {ATTN_EINVAL, ATTN_EINVAL, ATTN_EINVAL, ATTN_ERANGE, ATTN_EINVAL};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        attn_step st = {.kv = kv, .x = x, .n_tokens = 4, .out = out, .inspect = &cases[i]};
        ck_assert_msg(attn_forward(hm.model, 0, ws, &st, 1) == want[i], "case %d", (int)i);
        ck_assert_int_eq(attn_kv_len(kv), 0);
    }
    attn_kv_destroy(kv);
    attn_workspace_destroy(ws);
    attn_kv_pool_destroy(pool);
    free(x);
    harness_model_release(&hm);
}
END_TEST

/* attn_sdpa: causal with Tq < Tk and a pair mask, GQA; probabilities against ref_sdpa's weights,
 * scores and LSE against the same scores computed here in double. */
START_TEST(test_inspect_sdpa) {
    int32_t H = 4, Hkv = 2, nq = 5, nk = 70, d = 8;
    ref_rng rng;
    ref_rng_init(&rng, 9);
    float *q = harness_calloc((size_t)H * nq * d, sizeof(float));
    float *k = harness_calloc((size_t)Hkv * nk * d, sizeof(float));
    float *v = harness_calloc((size_t)Hkv * nk * d, sizeof(float));
    uint8_t *mask = harness_calloc((size_t)nq * nk, 1);
    ref_fill_uniform(&rng, q, (size_t)H * nq * d, -2, 2);
    ref_fill_uniform(&rng, k, (size_t)Hkv * nk * d, -2, 2);
    ref_fill_uniform(&rng, v, (size_t)Hkv * nk * d, -1, 1);
    for (size_t i = 0; i < (size_t)nq * nk; i++) {
        mask[i] = ref_rng_uniform(&rng, 0, 1) < 0.8f;
    }
    float *w_ref = harness_calloc((size_t)H * nq * nk, sizeof(float));
    float *o_ref = harness_calloc((size_t)H * nq * d, sizeof(float));
    ref_sdpa_args ra = {.n_heads = H,
                        .n_kv_heads = Hkv,
                        .n_q = nq,
                        .n_k = nk,
                        .d_k = d,
                        .d_v = d,
                        .q = q,
                        .k = k,
                        .v = v,
                        .is_causal = true,
                        .window = -1,
                        .out = o_ref,
                        .weights = w_ref,
                        .mask = mask,
                        .mask_ld = (size_t)nk};
    ref_sdpa(&ra);
    float *out = harness_calloc((size_t)H * nq * d, sizeof(float));
    float *cells = harness_calloc((size_t)H * nq * nk, sizeof(float));
    int32_t heads[1] = {3}, rows[2] = {1, 4};
    for (int kind = 0; kind < 3; kind++) {
        attn_inspect ins = {.kind = (attn_inspect_kind)kind,
                            .heads = heads,
                            .n_heads = 1,
                            .rows = rows,
                            .n_rows = 2,
                            .key_first = 10,
                            .n_keys = 60,
                            .out = cells};
        attn_sdpa_params p = {.n_heads = H,
                              .n_kv_heads = Hkv,
                              .n_q = nq,
                              .n_k = nk,
                              .d_k = d,
                              .d_v = d,
                              .q = q,
                              .k = k,
                              .v = v,
                              .is_causal = true,
                              .window = -1,
                              .out = out,
                              .mask = mask,
                              .mask_ld = (size_t)nk,
                              .inspect = &ins};
        size_t bytes = attn_sdpa_scratch_bytes(&p);
        void *scratch = malloc(bytes);
        ck_assert_int_eq(attn_sdpa(&p, scratch), ATTN_OK);
        free(scratch);
        harness_expect_close(out, o_ref, (size_t)H * nq * d, "sdpa output beside an inspection");
        for (int32_t rs = 0; rs < 2; rs++) {
            int32_t i = rows[rs], ip = i + nk - nq, h = heads[0], g = h / (H / Hkv);
            double s[70], mx = -INFINITY, sum = 0.0;
            for (int32_t j = 0; j < nk; j++) {
                double dot = 0.0;
                for (int32_t e = 0; e < d; e++) {
                    dot +=
                        (double)q[((size_t)h * nq + i) * d + e] * k[((size_t)g * nk + j) * d + e];
                }
                s[j] = j <= ip && mask[(size_t)i * nk + j] ? dot / sqrt((double)d) : -INFINITY;
                mx = s[j] > mx ? s[j] : mx;
            }
            for (int32_t j = 0; j < nk; j++) {
                sum += s[j] == -INFINITY ? 0.0 : exp(s[j] - mx);
            }
            if (kind == ATTN_INSPECT_LSE) {
                expect_value(cells[rs], (float)(mx + log(sum)), SCORE_ATOL, SCORE_RTOL, "sdpa lse",
                             0, rs, 0);
                continue;
            }
            for (int32_t kk = 0; kk < 60; kk++) {
                int32_t j = 10 + kk;
                float got = cells[(size_t)rs * 60 + kk];
                if (kind == ATTN_INSPECT_SCORES) {
                    expect_value(got, (float)s[j], SCORE_ATOL, SCORE_RTOL, "sdpa scores", 0, rs,
                                 kk);
                } else {
                    expect_value(got, w_ref[((size_t)h * nq + i) * nk + j], HARNESS_ATOL,
                                 HARNESS_RTOL, "sdpa probs", 0, rs, kk);
                }
            }
        }
    }
    attn_inspect capture = {.kind = ATTN_INSPECT_PROBS, .q = out};
    attn_sdpa_params bad = {.n_heads = H,
                            .n_kv_heads = Hkv,
                            .n_q = nq,
                            .n_k = nk,
                            .d_k = d,
                            .d_v = d,
                            .q = q,
                            .k = k,
                            .v = v,
                            .window = -1,
                            .out = out,
                            .inspect = &capture};
    ck_assert_int_eq(attn_sdpa_scratch_bytes(&bad), 0);
    free(cells);
    free(out);
    free(o_ref);
    free(w_ref);
    free(mask);
    free(v);
    free(k);
    free(q);
}
END_TEST

/* attn_forward_qkv: the selection of a call equals the probabilities the materialized path
 * returns for the same call, exp(scores - lse) equals them too, and head_scale scales out. */
START_TEST(test_inspect_qkv) {
    attn_config c = harness_config(4, 2, 16);
    harness_model hm;
    harness_model_init(&hm, &c, 3);
    int32_t t = 6, d = 16;
    ref_rng rng;
    ref_rng_init(&rng, 4);
    float q[4 * 6 * 16], k[2 * 6 * 16], v[2 * 6 * 16];
    ref_fill_uniform(&rng, q, sizeof q / sizeof q[0], -1, 1);
    ref_fill_uniform(&rng, k, sizeof k / sizeof k[0], -1, 1);
    ref_fill_uniform(&rng, v, sizeof v / sizeof v[0], -1, 1);
    attn_kv_pool *pool = NULL;
    attn_workspace *ws = NULL;
    ck_assert_int_eq(attn_kv_pool_create(hm.model, (size_t)8 << 20, 16, &pool), ATTN_OK);
    ck_assert_int_eq(attn_workspace_create(hm.model, 64, NULL, &ws), ATTN_OK);
    float w[4 * 6 * 6], probs[4 * 6 * 6], scores[4 * 6 * 6], lse[4 * 6];
    float out0[4 * 6 * 16], out1[4 * 6 * 16], head_out[4 * 6 * 16];
    attn_kv *kv[4];
    attn_inspect ins[3] = {
        {.kind = ATTN_INSPECT_PROBS, .n_keys = t, .out = probs, .head_out = head_out},
        {.kind = ATTN_INSPECT_SCORES, .n_keys = t, .out = scores},
        {.kind = ATTN_INSPECT_LSE, .out = lse},
    };
    float scale[4] = {0.0f, 1.0f, 1.0f, 3.0f};
    for (int i = 0; i < 4; i++) {
        ck_assert_int_eq(attn_kv_create(pool, &kv[i]), ATTN_OK);
        attn_qkv_step st = {.kv = kv[i],
                            .n_tokens = t,
                            .q = q,
                            .k = k,
                            .v = v,
                            .rope = true,
                            .out = i == 0 ? out0 : out1,
                            .weights = i == 0 ? w : NULL,
                            .inspect = i > 0 ? &ins[i - 1] : NULL,
                            .head_scale = i == 1 ? scale : NULL};
        ck_assert_int_eq(attn_forward_qkv(hm.model, 0, ws, &st, 1), ATTN_OK);
    }
    harness_expect_close(probs, w, sizeof w / sizeof w[0], "qkv: selection vs weights");
    for (int32_t h = 0; h < 4; h++) {
        for (int32_t i = 0; i < t; i++) {
            for (int32_t j = 0; j < t; j++) {
                size_t cell = ((size_t)h * t + i) * t + j;
                float want = scores[cell] == -INFINITY ? 0.0f : expf(scores[cell] - lse[h * t + i]);
                expect_value(probs[cell], want, HARNESS_ATOL, HARNESS_RTOL, "qkv exp(s - lse)", h,
                             i, j);
            }
            for (int32_t e = 0; e < d; e++) {
                size_t o = ((size_t)h * t + i) * d + e;
                expect_value(head_out[o], out0[o], HARNESS_ATOL, HARNESS_RTOL, "qkv head_out", h, i,
                             e);
            }
        }
    }
    for (int i = 0; i < 4; i++) {
        attn_kv_destroy(kv[i]);
    }
    attn_workspace_destroy(ws);
    attn_kv_pool_destroy(pool);
    harness_model_release(&hm);
}
END_TEST

/* A pool that keeps queries: attn_kv_attention recomputes any cached row's probabilities,
 * scores and LSE as the reference has them (GQA, sinks, a window), after a prefill in calls, and
 * the same from the cache's export imported again, and from a fork; a ring's dropped rows are
 * refused; a pool without queries refuses. */
START_TEST(test_inspect_cached_rows) {
    attn_config c = harness_config(8, 2, 32);
    c.has_sinks = true;
    c.sliding_window = 20;
    int32_t n = 70;
    harness_model hm;
    harness_model_init(&hm, &c, 21);
    float *x = harness_random_x(22, n, c.hidden_size);
    ref_all r;
    ref_all_run(&r, &hm, x, n, NULL, NULL);
    attn_kv_pool *pool = NULL, *plain = NULL;
    attn_workspace *ws = NULL;
    attn_kv *kv = NULL, *copy = NULL, *fork = NULL, *no_q = NULL;
    ck_assert_int_eq(
        attn_kv_pool_create_ex(hm.model, (size_t)8 << 20, 16, ATTN_DTYPE_AUTO, true, &pool),
        ATTN_OK);
    ck_assert(attn_kv_pool_keeps_queries(pool));
    ck_assert_int_eq(attn_workspace_create(hm.model, 32, NULL, &ws), ATTN_OK);
    ck_assert_int_eq(attn_kv_create_for_layer(pool, 0, &kv), ATTN_OK);
    float *out = harness_calloc((size_t)n * c.hidden_size, sizeof(float));
    int32_t calls[] = {50, 19, 1}, p = 0;
    for (int i = 0; i < 3; i++) {
        attn_step st = {.kv = kv,
                        .x = x + (size_t)p * c.hidden_size,
                        .n_tokens = calls[i],
                        .out = out + (size_t)p * c.hidden_size};
        ck_assert_int_eq(attn_forward(hm.model, 0, ws, &st, 1), ATTN_OK);
        p += calls[i];
    }
    size_t bytes = attn_kv_export_bytes(kv);
    uint8_t *saved = harness_calloc(bytes, 1);
    ck_assert_int_eq(attn_kv_export(kv, saved, bytes), ATTN_OK);
    ck_assert_int_eq(attn_kv_import(pool, 0, saved, bytes, &copy), ATTN_OK);
    ck_assert_int_eq(attn_kv_fork(kv, &fork), ATTN_OK);
    int32_t first = attn_kv_first_held(kv);
    ck_assert_int_gt(first, 0); /* the ring dropped blocks */
    /* the first row whose window is all held */
    int32_t rows[3] = {first + c.sliding_window - 1, 60, n - 1}, heads[3] = {0, 3, 7};
    float *cells = harness_calloc((size_t)c.n_heads * n * n, sizeof(float));
    const attn_kv *caches[3] = {kv, copy, fork};
    for (int ci = 0; ci < 3; ci++) {
        for (int kind = 0; kind < 3; kind++) {
            for (int reduce = 0; reduce < 3; reduce++) {
                attn_inspect ins = {.kind = (attn_inspect_kind)kind,
                                    .reduce = (attn_inspect_reduce)reduce,
                                    .heads = reduce == 1 ? heads : NULL,
                                    .n_heads = 3,
                                    .rows = rows,
                                    .n_rows = 3,
                                    .key_first = 5,
                                    .n_keys = n - 5,
                                    .out = cells};
                ck_assert_int_eq(attn_kv_attention(hm.model, 0, caches[ci], &ins), ATTN_OK);
                char what[120];
                snprintf(what, sizeof what, "cached rows (cache %d) kind %d reduce %d", ci, kind,
                         reduce);
                expect_selection(&r, &c, &ins, 0, n, what);
            }
        }
    }
    int32_t dropped[1] = {first + c.sliding_window - 2};
    attn_inspect gone = {.kind = ATTN_INSPECT_LSE, .rows = dropped, .n_rows = 1, .out = cells};
    ck_assert_int_eq(attn_kv_attention(hm.model, 0, kv, &gone), ATTN_EDROPPED);
    ck_assert_int_eq(attn_kv_pool_create(hm.model, (size_t)8 << 20, 16, &plain), ATTN_OK);
    ck_assert_int_eq(attn_kv_create_for_layer(plain, 0, &no_q), ATTN_OK);
    attn_inspect any = {.kind = ATTN_INSPECT_LSE, .out = cells};
    ck_assert_int_eq(attn_kv_attention(hm.model, 0, no_q, &any), ATTN_EUNSUPPORTED);
    /* a file with queries is not a plain pool's, nor the other way round */
    attn_kv *wrong = NULL;
    ck_assert_int_eq(attn_kv_import(plain, 0, saved, bytes, &wrong), ATTN_EUNSUPPORTED);
    free(cells);
    free(saved);
    free(out);
    attn_kv_destroy(no_q);
    attn_kv_destroy(fork);
    attn_kv_destroy(copy);
    attn_kv_destroy(kv);
    attn_workspace_destroy(ws);
    attn_kv_pool_destroy(plain);
    attn_kv_pool_destroy(pool);
    ref_all_release(&r);
    free(x);
    harness_model_release(&hm);
}
END_TEST

/* Every KV dtype: a call's selection reads the keys as the cache holds them, so its
 * probabilities equal the materialized weights of the same call on a twin cache of that dtype,
 * and exp(scores - lse) equals them too (the decode kernels of each dtype, and the widened
 * prefill path). */
START_TEST(test_inspect_kv_dtypes) {
    static const attn_dtype dts[] = {ATTN_DTYPE_F32, ATTN_DTYPE_BF16, ATTN_DTYPE_F16,
                                     ATTN_DTYPE_Q8_0};
    attn_config c = harness_config(8, 2, 64);
    harness_model hm;
    harness_model_init(&hm, &c, 31);
    int32_t n = 40;
    float *x = harness_random_x(32, n, c.hidden_size);
    float *out = harness_calloc((size_t)n * c.hidden_size, sizeof(float));
    float *w = harness_calloc((size_t)c.n_heads * n * n, sizeof(float));
    float *p = harness_calloc((size_t)c.n_heads * n * n, sizeof(float));
    float *sc = harness_calloc((size_t)c.n_heads * n * n, sizeof(float));
    float *lse = harness_calloc((size_t)c.n_heads * n, sizeof(float));
    for (size_t di = 0; di < 4; di++) {
        attn_kv_pool *pool = NULL;
        attn_workspace *ws = NULL;
        ck_assert_int_eq(attn_kv_pool_create_typed(hm.model, (size_t)8 << 20, 16, dts[di], &pool),
                         ATTN_OK);
        ck_assert_int_eq(attn_workspace_create(hm.model, 64, NULL, &ws), ATTN_OK);
        int32_t calls[2] = {n - 1, 1};
        attn_kv *kv[4];
        for (int i = 0; i < 4; i++) {
            ck_assert_int_eq(attn_kv_create(pool, &kv[i]), ATTN_OK);
        }
        for (int ci = 0, at = 0; ci < 2; at += calls[ci], ci++) {
            int32_t t = calls[ci], keys = at + t;
            attn_inspect ins[3] = {{.kind = ATTN_INSPECT_PROBS, .n_keys = keys, .out = p},
                                   {.kind = ATTN_INSPECT_SCORES, .n_keys = keys, .out = sc},
                                   {.kind = ATTN_INSPECT_LSE, .out = lse}};
            for (int i = 0; i < 4; i++) {
                attn_step st = {.kv = kv[i],
                                .x = x + (size_t)at * c.hidden_size,
                                .n_tokens = t,
                                .out = out,
                                .weights = i == 0 ? w : NULL,
                                .inspect = i > 0 ? &ins[i - 1] : NULL};
                ck_assert_int_eq(attn_forward(hm.model, 0, ws, &st, 1), ATTN_OK);
            }
            char what[96];
            snprintf(what, sizeof what, "dtype %s call %d: selection vs weights",
                     attn_dtype_name(dts[di]), ci);
            harness_expect_close_tol(p, w, (size_t)c.n_heads * t * keys, 1e-6, 1e-5, what);
            for (int32_t h = 0; h < c.n_heads; h++) {
                for (int32_t r = 0; r < t; r++) {
                    for (int32_t j = 0; j < keys; j++) {
                        size_t cell = ((size_t)h * t + r) * keys + j;
                        float from = sc[cell] == -INFINITY ? 0.0f : expf(sc[cell] - lse[h * t + r]);
                        expect_value(from, w[cell], 1e-6, 1e-5, what, h, r, j);
                    }
                }
            }
        }
        for (int i = 0; i < 4; i++) {
            attn_kv_destroy(kv[i]);
        }
        attn_workspace_destroy(ws);
        attn_kv_pool_destroy(pool);
    }
    free(lse);
    free(sc);
    free(p);
    free(w);
    free(out);
    free(x);
    harness_model_release(&hm);
}
END_TEST

extern Suite *inspect_suite(void);

Suite *inspect_suite(void) {
    Suite *s = suite_create("inspect");
    TCase *tc = tcase_create("inspect");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, test_inspect_gqa_sinks_window);
    tcase_add_test(tc, test_inspect_padding_threads);
    tcase_add_test(tc, test_inspect_split_k_lse);
    tcase_add_test(tc, test_inspect_head_scale);
    tcase_add_test(tc, test_inspect_refusals);
    tcase_add_test(tc, test_inspect_sdpa);
    tcase_add_test(tc, test_inspect_qkv);
    tcase_add_test(tc, test_inspect_cached_rows);
    tcase_add_test(tc, test_inspect_kv_dtypes);
    suite_add_tcase(s, tc);
    return s;
}
