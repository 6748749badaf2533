/* tests/check_sdpa.c: stateless attn_sdpa against ref_sdpa: GQA head sharing, Tq != Tk with
 * bottom-right causal alignment, |i' - j| <= window, d_v != d_k, odd and tiny head dims, custom
 * scales, both paths (weights or not) agreeing, fully masked rows as zeros, and bad arguments.
 * Scratch is allocated at exactly attn_sdpa_scratch_bytes so that ASan sees any overrun.
 * Tolerances: HARNESS_ATOL/RTOL against ref; 1e-5 abs + 1e-5 rel between the two paths. */
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check_harness.h"
#include "ref.h"

/* Masks a case may carry (the seeds' boolean convention: nonzero attends). */
enum mask_kind {
    MASK_NONE = 0,
    MASK_PAIRS,       /* (Tq, Tk), each pair kept with probability 3/4 */
    MASK_KEY_PADDING, /* one row of Tk for every query (mask_ld 0), its last keys 0 */
    MASK_EMPTY_ROWS,  /* (Tq, Tk) with every third query's row all 0 */
};

typedef struct sdpa_case {
    int32_t n_heads, n_kv_heads, n_q, n_k, d_k, d_v;
    bool is_causal;
    int32_t window;
    float scale;
} sdpa_case;

/* The case's mask (NULL for none) and its row stride. */
static uint8_t *make_mask(const sdpa_case *c, enum mask_kind kind, ref_rng *rng, size_t *ld) {
    if (kind == MASK_NONE) {
        *ld = 0;
        return NULL;
    }
    *ld = kind == MASK_KEY_PADDING ? 0 : (size_t)c->n_k;
    size_t rows = kind == MASK_KEY_PADDING ? 1 : (size_t)c->n_q;
    uint8_t *m = harness_calloc(rows * c->n_k, 1);
    for (size_t i = 0; i < rows; i++) {
        for (int32_t j = 0; j < c->n_k; j++) {
            uint8_t on = 1;
            if (kind == MASK_PAIRS) {
                on = ref_rng_uniform(rng, 0.0f, 1.0f) < 0.75f;
            } else if (kind == MASK_KEY_PADDING) {
                on = j < c->n_k - c->n_k / 3;
            } else {
                on = i % 3 != 1 && ref_rng_uniform(rng, 0.0f, 1.0f) < 0.75f;
            }
            m[i * c->n_k + j] = on;
        }
    }
    return m;
}

static void describe(const sdpa_case *c, char *buf, size_t size) {
    snprintf(buf, size, "heads %d/%d n_q %d n_k %d d_k %d d_v %d causal %d window %d scale %g",
             (int)c->n_heads, (int)c->n_kv_heads, (int)c->n_q, (int)c->n_k, (int)c->d_k,
             (int)c->d_v, (int)c->is_causal, (int)c->window, (double)c->scale);
}

/* Runs attn_sdpa with its own exactly-sized scratch. */
static int run_sdpa(const attn_sdpa_params *p) {
    size_t bytes = attn_sdpa_scratch_bytes(p);
    void *scratch = malloc(bytes > 0 ? bytes : 1);
    ck_assert_ptr_nonnull(scratch);
    int rc = attn_sdpa(p, scratch);
    free(scratch);
    return rc;
}

static void check_masked_case(const sdpa_case *c, enum mask_kind kind, uint64_t seed) {
    const size_t q_count = (size_t)c->n_heads * c->n_q * c->d_k;
    const size_t k_count = (size_t)c->n_kv_heads * c->n_k * c->d_k;
    const size_t v_count = (size_t)c->n_kv_heads * c->n_k * c->d_v;
    const size_t o_count = (size_t)c->n_heads * c->n_q * c->d_v;
    const size_t w_count = (size_t)c->n_heads * c->n_q * c->n_k;
    char desc[200];
    char what[300];
    ref_rng rng;
    describe(c, desc, sizeof(desc));
    snprintf(desc + strlen(desc), sizeof desc - strlen(desc), " mask %d", (int)kind);
    ref_rng_init(&rng, seed);
    float *q = harness_calloc(q_count, sizeof(float));
    float *k = harness_calloc(k_count, sizeof(float));
    float *v = harness_calloc(v_count, sizeof(float));
    ref_fill_uniform(&rng, q, q_count, -1.0f, 1.0f);
    ref_fill_uniform(&rng, k, k_count, -1.0f, 1.0f);
    ref_fill_uniform(&rng, v, v_count, -1.0f, 1.0f);
    size_t mask_ld = 0;
    uint8_t *mask = make_mask(c, kind, &rng, &mask_ld);
    float *out_ref = harness_calloc(o_count, sizeof(float));
    float *w_ref = harness_calloc(w_count, sizeof(float));
    ref_sdpa_args ra = {.n_heads = c->n_heads,
                        .n_kv_heads = c->n_kv_heads,
                        .n_q = c->n_q,
                        .n_k = c->n_k,
                        .d_k = c->d_k,
                        .d_v = c->d_v,
                        .q = q,
                        .k = k,
                        .v = v,
                        .is_causal = c->is_causal,
                        .window = c->window,
                        .scale = c->scale,
                        .mask = mask,
                        .mask_ld = mask_ld,
                        .out = out_ref,
                        .weights = w_ref};
    ref_sdpa(&ra);

    float *out[2];
    float *w = harness_calloc(w_count, sizeof(float));
    for (int path = 0; path < 2; path++) {
        out[path] = harness_calloc(o_count, sizeof(float));
        attn_sdpa_params p = {.n_heads = c->n_heads,
                              .n_kv_heads = c->n_kv_heads,
                              .n_q = c->n_q,
                              .n_k = c->n_k,
                              .d_k = c->d_k,
                              .d_v = c->d_v,
                              .q = q,
                              .k = k,
                              .v = v,
                              .is_causal = c->is_causal,
                              .window = c->window,
                              .scale = c->scale,
                              .out = out[path],
                              .weights = path == 0 ? w : NULL,
                              .mask = mask,
                              .mask_ld = mask_ld};
        int rc = run_sdpa(&p);
        ck_assert_msg(rc == ATTN_OK, "%s: attn_sdpa = %d (%s)", desc, rc, attn_strerror(rc));
        snprintf(what, sizeof(what), "%s: out (%s) vs ref", desc,
                 path == 0 ? "materialized" : "tiled");
        harness_expect_close(out[path], out_ref, o_count, what);
    }
    snprintf(what, sizeof(what), "%s: tiled vs materialized", desc);
    harness_expect_close_tol(out[1], out[0], o_count, 1e-5, 1e-5, what);
    snprintf(what, sizeof(what), "%s: weights vs ref", desc);
    harness_expect_close(w, w_ref, w_count, what);

    /* Rows: probabilities summing to 1, or all zero (weights and output) when nothing is
     * visible, which ref decides. */
    for (int32_t r = 0; r < c->n_heads * c->n_q; r++) {
        double sum = 0.0;
        double sum_ref = 0.0;
        for (int32_t j = 0; j < c->n_k; j++) {
            sum += w[(size_t)r * c->n_k + j];
            sum_ref += w_ref[(size_t)r * c->n_k + j];
        }
        if (sum_ref == 0.0) {
            snprintf(what, sizeof(what), "%s: fully masked row %d", desc, (int)r);
            harness_expect_zero(w + (size_t)r * c->n_k, (size_t)c->n_k, what);
            harness_expect_zero(out[0] + (size_t)r * c->d_v, (size_t)c->d_v, what);
            harness_expect_zero(out[1] + (size_t)r * c->d_v, (size_t)c->d_v, what);
        } else {
            ck_assert_msg(fabs(sum - 1.0) < 1e-5, "%s: row %d sums to %.9g", desc, (int)r, sum);
        }
    }
    free(mask);
    free(out[1]);
    free(out[0]);
    free(w);
    free(w_ref);
    free(out_ref);
    free(v);
    free(k);
    free(q);
}

static void check_case(const sdpa_case *c, uint64_t seed) {
    check_masked_case(c, MASK_NONE, seed);
}

/* Every combination of head sharing, key dim (1 and 17 odd), value dim (equal and not), query
 * and key lengths (square, Tq < Tk, single query, Tq > Tk, 1 x 1), causality and window. */
START_TEST(test_sdpa_sweep_small_shapes) {
    static const int32_t heads[][2] = {{8, 8}, {8, 4}, {8, 2}, {8, 1}, {3, 3}};
    static const int32_t d_ks[] = {1, 17, 32, 80};
    static const int32_t lens[][2] = {{7, 7}, {3, 11}, {1, 9}, {9, 4}, {1, 1}};
    static const int32_t windows[] = {-1, 0, 2, 20};
    uint64_t seed = 1000;
    for (int h = 0; h < 5; h++) {
        for (int d = 0; d < 4; d++) {
            for (int dv = 0; dv < 2; dv++) {
                for (int l = 0; l < 5; l++) {
                    for (int causal = 0; causal < 2; causal++) {
                        for (int wi = 0; wi < 4; wi++) {
                            sdpa_case c = {heads[h][0], heads[h][1], lens[l][0],
                                           lens[l][1],  d_ks[d],     dv ? 24 : d_ks[d],
                                           causal,      windows[wi], 0.0f};
                            check_case(&c, seed++);
                        }
                    }
                }
            }
        }
    }
}
END_TEST

/* The seeds' boolean masks, alone and on top of causal and window: per pair, key padding shared
 * by every query, and queries that see nothing (zeros, never NaN), over head sharing, Tq != Tk,
 * and lengths spanning several query and key tiles. */
START_TEST(test_sdpa_masks) {
    static const int32_t shapes[][6] = {
        {8, 2, 7, 7, 16, 16}, {4, 4, 3, 11, 8, 12}, {8, 1, 1, 9, 32, 32}, {4, 2, 70, 130, 64, 64}};
    uint64_t seed = 5000;
    for (int m = MASK_PAIRS; m <= MASK_EMPTY_ROWS; m++) {
        for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
            for (int causal = 0; causal < 2; causal++) {
                for (int wi = 0; wi < 2; wi++) {
                    const int32_t *d = shapes[s];
                    sdpa_case c = {d[0], d[1], d[2], d[3], d[4], d[5], causal, wi ? 3 : -1, 0.0f};
                    check_masked_case(&c, (enum mask_kind)m, seed++);
                }
            }
        }
    }
}
END_TEST

/* Linear attention (seed 004 3.7) against ref's quadratic form: causal (prefix sums, with
 * bottom-right alignment and queries before every key at zero) and not, head sharing, odd and
 * unequal dims, the seed's own shape (1024 tokens of 64), and inputs up to +-4 so that both
 * branches of elu + 1 and large prefix sums count. */
START_TEST(test_sdpa_linear_matches_quadratic_form) {
    static const int32_t shapes[][6] = {
        {8, 8, 7, 7, 16, 16}, {8, 2, 3, 11, 16, 24},   {4, 1, 9, 4, 1, 5},
        {3, 3, 1, 1, 64, 64}, {4, 2, 70, 130, 32, 32}, {1, 1, 1024, 1024, 64, 64},
    };
    uint64_t seed = 7000;
    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++) {
        for (int causal = 0; causal < 2; causal++) {
            const int32_t *d = shapes[i];
            size_t nq = (size_t)d[0] * d[2] * d[4], nk = (size_t)d[1] * d[3] * d[4];
            size_t nv = (size_t)d[1] * d[3] * d[5], no = (size_t)d[0] * d[2] * d[5];
            ref_rng rng;
            ref_rng_init(&rng, seed++);
            float range = causal ? 4.0f : 1.0f;
            float *q = harness_calloc(nq, sizeof(float)), *k = harness_calloc(nk, sizeof(float));
            float *v = harness_calloc(nv, sizeof(float));
            ref_fill_uniform(&rng, q, nq, -range, range);
            ref_fill_uniform(&rng, k, nk, -range, range);
            ref_fill_uniform(&rng, v, nv, -1.0f, 1.0f);
            float *want = harness_calloc(no, sizeof(float)),
                  *got = harness_calloc(no, sizeof(float));
            ref_sdpa_args a = {.n_heads = d[0],
                               .n_kv_heads = d[1],
                               .n_q = d[2],
                               .n_k = d[3],
                               .d_k = d[4],
                               .d_v = d[5],
                               .q = q,
                               .k = k,
                               .v = v,
                               .is_causal = causal,
                               .window = -1,
                               .out = want};
            ref_linear_sdpa(&a);
            attn_sdpa_params p = {.n_heads = d[0],
                                  .n_kv_heads = d[1],
                                  .n_q = d[2],
                                  .n_k = d[3],
                                  .d_k = d[4],
                                  .d_v = d[5],
                                  .q = q,
                                  .k = k,
                                  .v = v,
                                  .is_causal = causal,
                                  .window = -1,
                                  .out = got,
                                  .kind = ATTN_SDPA_LINEAR,
                                  NULL};
            ck_assert_int_eq(run_sdpa(&p), ATTN_OK);
            char what[128];
            snprintf(what, sizeof what, "linear %d/%d heads, %d over %d, dk %d dv %d, causal %d",
                     (int)d[0], (int)d[1], (int)d[2], (int)d[3], (int)d[4], (int)d[5], causal);
            harness_expect_close(got, want, no, what);
            free(got);
            free(want);
            free(v);
            free(k);
            free(q);
        }
    }
    /* What linear attention does not have is refused. */
    float q[4] = {1, 2, 3, 4}, out[4];
    uint8_t mask[2] = {1, 1};
    attn_sdpa_params p = {.n_heads = 1,
                          .n_kv_heads = 1,
                          .n_q = 2,
                          .n_k = 2,
                          .d_k = 2,
                          .d_v = 2,
                          .q = q,
                          .k = q,
                          .v = q,
                          .window = -1,
                          .out = out,
                          .kind = ATTN_SDPA_LINEAR,
                          NULL};
    ck_assert_int_eq(run_sdpa(&p), ATTN_OK);
    p.weights = out;
    ck_assert_int_eq(attn_sdpa_scratch_bytes(&p), 0);
    p.weights = NULL;
    p.window = 0;
    ck_assert_int_eq(attn_sdpa_scratch_bytes(&p), 0);
    p.window = -1;
    p.scale = 0.5f;
    ck_assert_int_eq(attn_sdpa_scratch_bytes(&p), 0);
    p.scale = 0.0f;
    p.mask = mask;
    ck_assert_int_eq(attn_sdpa_scratch_bytes(&p), 0);
    p.mask = NULL;
    p.kind = (attn_sdpa_kind)7;
    ck_assert_int_eq(attn_sdpa_scratch_bytes(&p), 0);
}
END_TEST

/* Longer sequences so that the tiled path runs over several query and key tiles. */
START_TEST(test_sdpa_long_sequences) {
    static const sdpa_case cases[] = {
        {8, 2, 70, 70, 64, 64, true, -1, 0.0f},   {8, 2, 70, 70, 64, 64, false, -1, 0.0f},
        {4, 1, 5, 200, 128, 128, true, -1, 0.0f}, {4, 4, 130, 130, 80, 40, true, 33, 0.0f},
        {2, 1, 1, 300, 64, 64, false, 100, 0.0f}, {8, 8, 100, 37, 32, 32, true, -1, 0.0f},
        {6, 3, 65, 129, 33, 65, false, 64, 0.0f},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        check_case(&cases[i], 2000 + i);
    }
}
END_TEST

START_TEST(test_sdpa_custom_scale) {
    sdpa_case c = {4, 2, 6, 9, 16, 8, true, -1, 0.9f};
    check_case(&c, 3000);
    c.scale = 0.01f;
    c.is_causal = false;
    check_case(&c, 3001);
}
END_TEST

/* Tq > Tk with a causal mask: the first Tq - Tk queries sit before every key (bottom-right
 * alignment), so their rows are all zeros, never NaN. */
START_TEST(test_sdpa_rows_before_every_key_are_zero) {
    const int32_t n_q = 5;
    const int32_t n_k = 2;
    float q[2 * 5 * 4];
    float k[1 * 2 * 4];
    float v[1 * 2 * 3];
    float out[2 * 5 * 3];
    float w[2 * 5 * 2];
    ref_rng rng;
    ref_rng_init(&rng, 3100);
    ref_fill_uniform(&rng, q, 40, -1.0f, 1.0f);
    ref_fill_uniform(&rng, k, 8, -1.0f, 1.0f);
    ref_fill_uniform(&rng, v, 6, -1.0f, 1.0f);
    for (int i = 0; i < 30; i++) {
        out[i] = NAN;
    }
    attn_sdpa_params p = {2,
                          1,
                          n_q,
                          n_k,
                          4,
                          3,
                          q,
                          k,
                          v,
                          true,
                          -1,
                          0.0f,
                          out,
                          w,
                          NULL,
                          NULL,
                          NULL,
                          0,
                          ATTN_SDPA_SOFTMAX,
                          NULL};
    ck_assert_int_eq(run_sdpa(&p), ATTN_OK);
    for (int h = 0; h < 2; h++) {
        harness_expect_zero(out + (size_t)h * n_q * 3, 3 * 3, "queries 0-2 (before the keys)");
        harness_expect_zero(w + (size_t)h * n_q * n_k, 3 * 2, "weights of queries 0-2");
        ck_assert_float_eq(w[h * 10 + 3 * 2 + 0], 1.0f); /* query 3 sees key 0 alone */
        ck_assert_float_eq(w[h * 10 + 3 * 2 + 1], 0.0f);
        ck_assert_float_eq_tol(out[(h * 5 + 3) * 3 + 1], v[1], 1e-6f);
    }
}
END_TEST

/* The cancel check: polled once before each tile (KV head x 64 query rows); true stops the call
 * with ATTN_ECANCELED at once, and a check that never says stop changes nothing. */
struct cancel_after {
    int calls;
    int stop_at; /* the call that answers true */
};

static bool cancel_after_check(void *ctx) {
    struct cancel_after *c = ctx;
    return ++c->calls == c->stop_at;
}

START_TEST(test_sdpa_cancel_stops_between_tiles) {
    enum { H = 4, HKV = 2, NQ = 200, NK = 300, D = 16 };
    const int n_tiles = HKV * ((NQ + 63) / 64); /* 8 */
    float *q = malloc(sizeof(float) * H * NQ * D), *k = malloc(sizeof(float) * HKV * NK * D);
    float *v = malloc(sizeof(float) * HKV * NK * D);
    float *plain = malloc(sizeof(float) * H * NQ * D), *out = malloc(sizeof(float) * H * NQ * D);
    ref_rng rng;
    ref_rng_init(&rng, 3300);
    ref_fill_uniform(&rng, q, H * NQ * D, -1.0f, 1.0f);
    ref_fill_uniform(&rng, k, HKV * NK * D, -1.0f, 1.0f);
    ref_fill_uniform(&rng, v, HKV * NK * D, -1.0f, 1.0f);
    attn_sdpa_params p = {.n_heads = H,
                          .n_kv_heads = HKV,
                          .n_q = NQ,
                          .n_k = NK,
                          .d_k = D,
                          .d_v = D,
                          .q = q,
                          .k = k,
                          .v = v,
                          .is_causal = true,
                          .window = -1,
                          .out = plain};
    void *scratch = malloc(attn_sdpa_scratch_bytes(&p));
    ck_assert_int_eq(attn_sdpa(&p, scratch), ATTN_OK);

    struct cancel_after never = {0, -1};
    p.out = out;
    p.is_cancelled = cancel_after_check;
    p.cancel_ctx = &never;
    ck_assert_int_eq(attn_sdpa(&p, scratch), ATTN_OK);
    ck_assert_int_eq(never.calls, n_tiles);
    ck_assert_int_eq(memcmp(out, plain, sizeof(float) * H * NQ * D), 0);

    for (int stop_at = 1; stop_at <= n_tiles; stop_at++) {
        struct cancel_after c = {0, stop_at};
        p.cancel_ctx = &c;
        ck_assert_int_eq(attn_sdpa(&p, scratch), ATTN_ECANCELED);
        ck_assert_int_eq(c.calls, stop_at); /* not polled again after it said stop */
    }
    ck_assert_str_eq(attn_strerror(ATTN_ECANCELED), "cancelled by the caller");
    free(scratch);
    free(out);
    free(plain);
    free(v);
    free(k);
    free(q);
}
END_TEST

/* NULL tensors are ATTN_EINVAL; impossible dimensions are ATTN_EINVAL or ATTN_ESHAPE (attn.h
 * allows either); a failing call writes nothing to out. */
START_TEST(test_sdpa_bad_arguments) {
    float q[4 * 2 * 8];
    float k[2 * 3 * 8];
    float v[2 * 3 * 8];
    float out[4 * 2 * 8];
    float scratch[8192];
    ref_rng rng;
    ref_rng_init(&rng, 3200);
    ref_fill_uniform(&rng, q, 64, -1.0f, 1.0f);
    ref_fill_uniform(&rng, k, 48, -1.0f, 1.0f);
    ref_fill_uniform(&rng, v, 48, -1.0f, 1.0f);
    const attn_sdpa_params good = {4,
                                   2,
                                   2,
                                   3,
                                   8,
                                   8,
                                   q,
                                   k,
                                   v,
                                   false,
                                   -1,
                                   0.0f,
                                   out,
                                   NULL,
                                   NULL,
                                   NULL,
                                   NULL,
                                   0,
                                   ATTN_SDPA_SOFTMAX,
                                   NULL};
    ck_assert_uint_le(attn_sdpa_scratch_bytes(&good), sizeof(scratch));
    ck_assert_int_eq(attn_sdpa(&good, scratch), ATTN_OK);

    for (int kind = 0; kind < 4; kind++) {
        attn_sdpa_params p = good;
        const char *names[4] = {"q", "k", "v", "out"};
        if (kind == 0) {
            p.q = NULL;
        } else if (kind == 1) {
            p.k = NULL;
        } else if (kind == 2) {
            p.v = NULL;
        } else {
            p.out = NULL;
        }
        ck_assert_msg(attn_sdpa(&p, scratch) == ATTN_EINVAL, "NULL %s", names[kind]);
    }
    ck_assert_int_eq(attn_sdpa(NULL, scratch), ATTN_EINVAL);

    for (int kind = 0; kind < 9; kind++) {
        attn_sdpa_params p = good;
        switch (kind) {
        case 0:
            p.n_heads = 0;
            break;
        case 1:
            p.n_kv_heads = 0;
            break;
        case 2:
            p.n_kv_heads = 3; /* does not divide 4 */
            break;
        case 3:
            p.n_q = 0;
            break;
        case 4:
            p.n_k = -1;
            break;
        case 5:
            p.d_k = 0;
            break;
        case 6:
            p.d_v = 0;
            break;
        case 7:
            p.window = -2;
            break;
        default:
            p.n_kv_heads = 8; /* more kv heads than heads */
            break;
        }
        for (int i = 0; i < 64; i++) {
            out[i] = 12345.0f;
        }
        int rc = attn_sdpa(&p, scratch);
        ck_assert_msg(rc == ATTN_EINVAL || rc == ATTN_ESHAPE, "bad dims kind %d: got %d (%s)", kind,
                      rc, attn_strerror(rc));
        for (int i = 0; i < 64; i++) {
            ck_assert_msg(out[i] == 12345.0f, "bad dims kind %d wrote out[%d]", kind, i);
        }
    }
}
END_TEST

/* `extern` keeps this prototype out of the Makefile's suite-table scan, which matches lines
 * starting with `Suite *`. */
extern Suite *sdpa_suite(void);

Suite *sdpa_suite(void) {
    Suite *s = suite_create("sdpa");
    TCase *tc = tcase_create("sdpa");
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, test_sdpa_sweep_small_shapes);
    tcase_add_test(tc, test_sdpa_long_sequences);
    tcase_add_test(tc, test_sdpa_masks);
    tcase_add_test(tc, test_sdpa_linear_matches_quadratic_form);
    tcase_add_test(tc, test_sdpa_custom_scale);
    tcase_add_test(tc, test_sdpa_rows_before_every_key_are_zero);
    tcase_add_test(tc, test_sdpa_bad_arguments);
    tcase_add_test(tc, test_sdpa_cancel_stops_between_tiles);
    suite_add_tcase(s, tc);
    return s;
}
