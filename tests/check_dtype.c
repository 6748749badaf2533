/* tests/check_dtype.c: projections held in half precision. The conversions (round to nearest
 * even, subnormals, overflow, NaN); the kernels against the portable loop; a model holding BF16
 * or F16 weights against tests/ref.c over the same (rounded) weights, through decode (a few
 * rows) and prefill (many rows: widened panels and sgemm); checkpoints held in their own dtype
 * or the one asked for. Tolerances: check_harness.h's, the weights being the reference's own. */
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../engine/attn_int.h"
#include "check_harness.h"
#include "ref.h"

#define DATA "tests/data/"

static float f32_of(uint32_t u) {
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

START_TEST(test_dtype_conversions_round_to_nearest_even) {
    ck_assert_uint_eq(attn__f32_to_bf16(1.0f), 0x3f80);
    ck_assert_uint_eq(attn__f32_to_bf16(f32_of(0x3f808000u)), 0x3f80); /* tie: to even */
    ck_assert_uint_eq(attn__f32_to_bf16(f32_of(0x3f818000u)), 0x3f82); /* tie: to even, up */
    ck_assert_uint_eq(attn__f32_to_bf16(f32_of(0x3f808001u)), 0x3f81);
    ck_assert(isnan(attn__bf16_to_f32(attn__f32_to_bf16(NAN))));
    ck_assert_uint_eq(attn__f32_to_f16(1.0f), 0x3c00);
    ck_assert_uint_eq(attn__f32_to_f16(-2.0f), 0xc000);
    ck_assert_uint_eq(attn__f32_to_f16(65504.0f), 0x7bff);
    ck_assert_uint_eq(attn__f32_to_f16(65519.0f), 0x7bff);
    ck_assert_uint_eq(attn__f32_to_f16(65520.0f), 0x7c00); /* past the largest: infinity */
    ck_assert_uint_eq(attn__f32_to_f16(ldexpf(1.0f, -24)), 0x0001);
    ck_assert_uint_eq(attn__f32_to_f16(ldexpf(3.0f, -25)), 0x0002); /* 1.5 ulp: to even */
    ck_assert_uint_eq(attn__f32_to_f16(ldexpf(1.0f, -26)), 0x0000);
    ck_assert_uint_eq(attn__f32_to_f16(-0.0f), 0x8000);
    ck_assert_uint_eq(attn__f32_to_f16(1.0f + ldexpf(1.0f, -11)), 0x3c00); /* tie: to even */
    ck_assert(isnan(attn__f16_to_f32(attn__f32_to_f16(NAN))));
    /* every binary16 value comes back exactly */
    for (uint32_t h = 0; h < 0x10000u; h++) {
        float f = attn__f16_to_f32((uint16_t)h);
        if (!isnan(f)) {
            ck_assert_msg(attn__f32_to_f16(f) == h, "f16 %04x -> %g -> %04x", h, (double)f,
                          attn__f32_to_f16(f));
        }
    }
}
END_TEST

/* The AVX2 kernel and the portable loop both match the exact sum, for both kinds, many shapes
 * (odd k included; a lone row with k below, at and past 16, a 64-step with a tail, long rows). */
/* Runs of floats rounded by attn__half_round (eight at a time under AVX2) are bit for bit what
 * the one-value conversions give, and its overflow answer is theirs: random bit patterns of every
 * class (normal, subnormal, ties, past either range, infinities, NaNs) in runs of 1 to 40 at
 * every alignment, and runs with no infinity or NaN in them (the vector path's own). */
START_TEST(test_dtype_half_rows_match_one_by_one) {
    static const uint32_t edges[] = {
        0x3f808000u, 0x3f818000u, 0x3f808001u, 0x7f7fffffu, 0xff7fffffu, 0x477ff000u, 0x477fefffu,
        0x38800000u, 0x387fffffu, 0x33800000u, 0x33000000u, 0x00000001u, 0x80000000u, 0x7f800000u,
        0xff800000u, 0x7fc00000u, 0x7f800001u, 0xffffffffu, 0x3f800000u, 0x3a801000u};
    uint64_t seed = 12345;
    float src[48];
    uint16_t got[48];
    for (int round = 0; round < 4000; round++) {
        bool finite_only = round % 2 == 1;
        for (int i = 0; i < 48; i++) {
            seed = seed * 6364136223846793005u + 1442695040888963407u;
            uint32_t u = (uint32_t)(seed >> 32);
            if (seed % 5 == 0) {
                u = edges[(seed >> 8) % (sizeof edges / sizeof edges[0])];
            } else if (seed % 5 == 1) {
                u = (u & 0x807fffffu) | (uint32_t)(0x66 + (seed >> 40) % 0x30)
                                            << 23; /* f16's range */
            }
            if (finite_only && (u & 0x7f800000u) == 0x7f800000u) {
                u &= 0xbfffffffu;
            }
            src[i] = f32_of(u);
        }
        size_t off = (size_t)round % 8, n = 1 + (size_t)round % 40;
        for (int bf = 0; bf < 2; bf++) {
            attn_dtype dt = bf ? ATTN_DTYPE_BF16 : ATTN_DTYPE_F16;
            bool over = attn__half_round(dt, src + off, n, got + off), want_over = false;
            for (size_t i = off; i < off + n; i++) {
                uint16_t want = bf ? attn__f32_to_bf16(src[i]) : attn__f32_to_f16(src[i]);
                uint16_t e = bf ? 0x7f80u : 0x7c00u;
                want_over |= (want & e) == e;
                uint32_t u;
                memcpy(&u, &src[i], sizeof u);
                ck_assert_msg(got[i] == want, "%s of %08x (value %zu of %zu): %04x, want %04x",
                              bf ? "bf16" : "f16", u, i - off, n, got[i], want);
            }
            ck_assert_msg(over == want_over, "round %d, %s: overflow %d, want %d", round,
                          bf ? "bf16" : "f16", over, want_over);
        }
    }
}
END_TEST

/* The exact sum of x_i . w_r (w_r as its float or half values) and of the products'
 * magnitudes, in double. */
static void exact_dot(const float *xi, const float *wf, const uint16_t *wh, bool bf, int32_t k,
                      double *exact, double *magnitude) {
    *exact = 0;
    *magnitude = 0;
    for (int32_t c = 0; c < k; c++) {
        double wv = wh == NULL ? wf[c] : bf ? attn__bf16_to_f32(wh[c]) : attn__f16_to_f32(wh[c]);
        double t = (double)xi[c] * wv;
        *exact += t;
        *magnitude += fabs(t);
    }
}

/* Float32 accumulation in any order, within 2e-7 (about 3.4 float32 roundings) of the products'
 * magnitudes (k = 8192: one accumulator a column was 3.5e-5 and 4e-5 off, of 2100; k = 64: up
 * to 6.8e-7 of 11.4). */
static double dot_tolerance(double magnitude) {
    return 2e-7 * magnitude + 1e-7;
}

/* One float32 accumulator an output, the columns in order: its roundings add up as a random
 * walk, sqrt(k) of them of half an ulp of the running sum at most; 4 such walks of the products'
 * magnitudes (measured over this file's shapes: at most 1.1 walks). */
static double panel_tolerance(int32_t k, double magnitude) {
    return 4.0 * sqrt((double)k) * 0x1p-24 * magnitude + 1e-7;
}

/* The projections' kernels for float weights and a few rows (AVX-512's for 4 rows and more
 * where the CPU has them and the loop allows them, else AVX2's), against the exact sums. */
START_TEST(test_dtype_rows_dot_kernels_agree) {
    static const int32_t shapes[][3] = {
        {1, 64, 7},  {3, 65, 5},    {4, 128, 9},  {9, 37, 3},   {1, 5, 3},     {1, 16, 4},
        {1, 100, 6}, {2, 77, 5},    {1, 8192, 2}, {1, 8200, 2}, {1, 4096, 65}, {4, 4096, 13},
        {7, 96, 12}, {32, 512, 14}, {5, 40, 7},   {6, 16, 6},   {8, 23, 19}};
    ref_rng rng;
    ref_rng_init(&rng, 6100);
    attn__tile_allow_wide(_i == 0);
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
        int32_t m = shapes[s][0], k = shapes[s][1], n = shapes[s][2];
        float *x = harness_calloc((size_t)m * k, sizeof(float));
        float *w = harness_calloc((size_t)n * k, sizeof(float));
        float *y = harness_calloc((size_t)m * n, sizeof(float));
        ref_fill_uniform(&rng, x, (size_t)m * k, -1.0f, 1.0f);
        ref_fill_uniform(&rng, w, (size_t)n * k, -1.0f, 1.0f);
        attn__rows_dot(x, m, k, w, n, y, (size_t)n);
        for (int32_t i = 0; i < m * n; i++) {
            double exact, magnitude;
            exact_dot(x + (size_t)(i / n) * k, w + (size_t)(i % n) * k, NULL, false, k, &exact,
                      &magnitude);
            ck_assert_msg(fabs(y[i] - exact) <= dot_tolerance(magnitude),
                          "m %d k %d, element %d: kernel %.9g, exact %.9g", m, k, i, (double)y[i],
                          exact);
        }
        free(y);
        free(w);
        free(x);
    }
    attn__tile_allow_wide(true);
}
END_TEST

/* Half-precision weights in panels (panel.c): packed, unpacked and widened bit for bit, and the
 * products of each kernel family (_i: 0 AVX-512 where the CPU has it, 1 AVX2, 2 portable) over
 * every block height, input rows past a block (the column passes), weight rows a panel leaves
 * over, and ranges of weight rows that cut panels, against the exact sums. */
START_TEST(test_dtype_panel_kernels_agree) {
    static const int32_t shapes[][5] = {
        /* m, k, rows, r0, r1 */
        {1, 64, 7, 0, 7},      {3, 65, 40, 0, 40},    {4, 128, 64, 0, 64},    {12, 37, 33, 5, 30},
        {13, 2100, 64, 0, 64}, {1, 8200, 32, 0, 32},  {1, 4096, 96, 32, 96},  {6, 16, 6, 2, 5},
        {7, 96, 100, 40, 100}, {25, 1030, 65, 1, 64}, {32, 512, 128, 0, 128}, {11, 3, 31, 0, 31},
        {2, 77, 160, 64, 160}, {40, 64, 48, 16, 48},  {5, 2049, 64, 0, 64}};
    ref_rng rng;
    ref_rng_init(&rng, 6200);
    attn__tile_allow_wide(_i == 0);
    int32_t block_rows = _i == 2 ? 4 : attn__panel_block_rows();
    for (int v = 0; v < 2; v++) {
        bool bf = v == 1;
        attn_dtype dt = bf ? ATTN_DTYPE_BF16 : ATTN_DTYPE_F16;
        for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
            int32_t m = shapes[s][0], k = shapes[s][1], rows = shapes[s][2];
            int32_t r0 = shapes[s][3], r1 = shapes[s][4], n = r1 - r0;
            float *x = harness_calloc((size_t)m * k, sizeof(float));
            float *xp = harness_calloc((size_t)m * k, sizeof(float));
            float *wf = harness_calloc((size_t)rows * k, sizeof(float));
            uint16_t *w = harness_calloc((size_t)rows * k, sizeof(uint16_t));
            uint16_t *panels = harness_calloc(attn__panel_values(rows, k), sizeof(uint16_t));
            uint16_t *back = harness_calloc((size_t)rows * k, sizeof(uint16_t));
            float *y = harness_calloc((size_t)m * n, sizeof(float));
            ref_fill_uniform(&rng, x, (size_t)m * k, -1.0f, 1.0f);
            ref_fill_uniform(&rng, wf, (size_t)rows * k, -1.0f, 1.0f);
            (void)attn__half_round(dt, wf, (size_t)rows * k, w);
            attn__panel_pack(dt, w, rows, k, panels);
            attn__panel_unpack(dt, panels, k, 0, rows, back);
            ck_assert_msg(memcmp(back, w, (size_t)rows * k * sizeof *back) == 0,
                          "rows %d k %d: unpacked differs", rows, k);
            attn__panel_unpack(dt, panels, k, r0, r1 - r0, back);
            ck_assert_msg(memcmp(back, w + (size_t)r0 * k, (size_t)(r1 - r0) * k * sizeof *back) ==
                              0,
                          "rows [%d, %d) k %d: unpacked differs", r0, r1, k);
            /* the panels widened for sgemm: the range's rows, transposed, exactly */
            float *wide = harness_calloc((size_t)k * n, sizeof(float));
            if (_i == 2) {
                attn__panel_widen_portable(dt, panels, k, r0, r1, wide, (size_t)n);
            } else {
                attn__panel_widen(dt, panels, k, r0, r1, wide, (size_t)n);
            }
            for (int32_t c = 0; c < k; c++) {
                for (int32_t r = r0; r < r1; r++) {
                    uint16_t h = w[(size_t)r * k + c];
                    float want = bf ? attn__bf16_to_f32(h) : attn__f16_to_f32(h);
                    ck_assert_msg(wide[(size_t)c * n + (r - r0)] == want,
                                  "widened rows [%d, %d) k %d: row %d column %d", r0, r1, k, r, c);
                }
            }
            free(wide);
            attn__panel_pack_x(block_rows, x, m, k, xp);
            attn__panel_dot(block_rows, dt, xp, m, k, panels, r0, r1, y, (size_t)n);
            for (int32_t i = 0; i < m * n; i++) {
                double exact, magnitude;
                exact_dot(x + (size_t)(i / n) * k, NULL, w + (size_t)(r0 + i % n) * k, bf, k,
                          &exact, &magnitude);
                ck_assert_msg(fabs(y[i] - exact) <= panel_tolerance(k, magnitude),
                              "block %d, m %d k %d rows [%d, %d) bf16 %d, element %d: kernel "
                              "%.9g, exact %.9g",
                              block_rows, m, k, r0, r1, bf, i, (double)y[i], exact);
            }
            free(y);
            free(back);
            free(panels);
            free(w);
            free(wf);
            free(xp);
            free(x);
        }
    }
    attn__tile_allow_wide(true);
}
END_TEST

/* Rounds a ref layer's projection weights to the dtype, in place: the model and the reference
 * then hold the same values. */
static void round_layer(const attn_config *c, ref_layer *w, attn_dtype dt) {
    size_t q = (size_t)c->n_heads * c->head_dim * c->hidden_size;
    size_t kv = (size_t)c->n_kv_heads * c->head_dim * c->hidden_size;
    float *t[] = {w->wq, w->wk, w->wv, w->wo};
    size_t n[] = {q, kv, kv, q};
    for (int i = 0; i < 4; i++) {
        for (size_t j = 0; j < n[i]; j++) {
            t[i][j] = dt == ATTN_DTYPE_BF16 ? attn__bf16_to_f32(attn__f32_to_bf16(t[i][j]))
                                            : attn__f16_to_f32(attn__f32_to_f16(t[i][j]));
        }
    }
}

/* A model holding BF16 (or F16) projections answers as ref.c over the same weights: a prefill of
 * 50 tokens (past the few-rows kernel: widened panels and sgemm, spread over the executor's
 * wide tasks when there is one: hidden 256, 384 q/k/v rows), decodes (the few-rows kernel),
 * with an executor and without; it holds half the projections' bytes. A default pool of it
 * holds K/V in the weights' dtype. */
START_TEST(test_dtype_half_model_matches_ref) {
    static const attn_dtype dts[] = {ATTN_DTYPE_BF16, ATTN_DTYPE_F16};
    /* _i 1: AVX2's kernels, where a 50-token chunk widens the panels for sgemm */
    attn__tile_allow_wide(_i == 0);
    for (int run = 0; run < 4; run++) {
        int d = run % 2;
        harness_threads threads;
        attn_executor ex = harness_thread_executor(&threads);
        attn_config cfg = harness_config(8, 2, 32);
        cfg.hidden_size = 256;
        harness_model hm;
        harness_model_init(&hm, &cfg, 6200 + d);
        round_layer(&cfg, &hm.layers[0], dts[d]);
        attn_layer_weights lw = harness_weights(&cfg, &hm.layers[0]);
        attn_load_params p = {0, 0, 0, NULL, dts[d], NULL};
        attn_model *half = NULL, *f32 = NULL;
        ck_assert_int_eq(attn_model_create(&cfg, &lw, &p, &half), ATTN_OK);
        p.weights_dtype = ATTN_DTYPE_F32;
        ck_assert_int_eq(attn_model_create(&cfg, &lw, &p, &f32), ATTN_OK);
        ck_assert_int_eq(attn_model_weights_dtype(half), dts[d]);
        ck_assert_int_eq(attn_model_weights_dtype(f32), ATTN_DTYPE_F32);
        /* q, k, v and o: (8 + 2 + 2 + 8) heads of 32 x hidden 256, two bytes saved on each */
        size_t proj = (size_t)(8 + 2 + 2 + 8) * 32 * 256 * (sizeof(float) - sizeof(uint16_t));
        ck_assert_uint_eq(attn_model_bytes(f32) - attn_model_bytes(half), proj);
        attn_model_destroy(hm.model);
        hm.model = half; /* the harness runs ref.c on hm.layers and the engine on this */
        const int32_t n = 54, hidden = cfg.hidden_size;
        float *x = harness_random_x(6300 + d, n, hidden);
        float *want = harness_calloc((size_t)n * hidden, sizeof(float));
        harness_ref_run(&hm, 0, x, NULL, NULL, n, want, NULL, NULL, NULL);
        attn_kv_pool *pool = NULL;
        attn_workspace *ws = NULL;
        attn_kv *kv = NULL;
        ck_assert_int_eq(attn_kv_pool_create(half, 1 << 20, 0, &pool), ATTN_OK);
        ck_assert_int_eq(attn_kv_pool_dtype(pool), dts[d]);
        attn_kv_pool_destroy(pool);
        /* a float cache, so that the weights' dtype alone differs from the reference */
        ck_assert_int_eq(attn_kv_pool_create_typed(half, 1 << 20, 0, ATTN_DTYPE_F32, &pool),
                         ATTN_OK);
        ck_assert_int_eq(attn_workspace_create(half, 64, run >= 2 ? &ex : NULL, &ws), ATTN_OK);
        ck_assert_int_eq(attn_kv_create(pool, &kv), ATTN_OK);
        float *out = harness_calloc((size_t)n * hidden, sizeof(float));
        int32_t chunks[] = {50, 1, 1, 2};
        harness_run r = {half, 0, ws, kv, x, NULL, NULL, n, 0, chunks, 4, out, NULL};
        ck_assert_int_eq(harness_run_chunks(&r), ATTN_OK);
        harness_expect_rows(out, want, 0, n, hidden, dts[d] == ATTN_DTYPE_BF16 ? "bf16" : "f16");
        if (run >= 2) {
            ck_assert_msg(threads.n_tasks_other > 0, "no projection task ran on the second thread");
        }
        free(out);
        attn_kv_destroy(kv);
        attn_workspace_destroy(ws);
        attn_kv_pool_destroy(pool);
        attn_model_destroy(f32);
        free(want);
        free(x);
        harness_model_release(&hm);
    }
    attn__tile_allow_wide(true);
}
END_TEST

/* A checkpoint's projections are held in its own dtype (BF16 bit-exact), or in the one asked
 * for; a dtype outside the enum is refused. */
START_TEST(test_dtype_checkpoints_held_as_shipped) {
    attn_model *m = NULL;
    char err[256] = "";
    ck_assert_int_eq(attn_model_load_hf(DATA "hf_tiny_bf16", NULL, &m, err, sizeof err), ATTN_OK);
    ck_assert_int_eq(attn_model_weights_dtype(m), ATTN_DTYPE_BF16);
    attn_model_destroy(m);
    ck_assert_int_eq(attn_model_load_hf(DATA "hf_alt_f16", NULL, &m, err, sizeof err), ATTN_OK);
    ck_assert_int_eq(attn_model_weights_dtype(m), ATTN_DTYPE_F16);
    attn_model_destroy(m);
    ck_assert_int_eq(attn_model_load_hf(DATA "hf_tiny_f32", NULL, &m, err, sizeof err), ATTN_OK);
    ck_assert_int_eq(attn_model_weights_dtype(m), ATTN_DTYPE_F32);
    attn_model_destroy(m);
    attn_load_params p = {0, 0, 0, NULL, ATTN_DTYPE_F32, NULL};
    ck_assert_int_eq(attn_model_load_hf(DATA "hf_tiny_bf16", &p, &m, err, sizeof err), ATTN_OK);
    ck_assert_int_eq(attn_model_weights_dtype(m), ATTN_DTYPE_F32);
    attn_model_destroy(m);
    p.weights_dtype = ATTN_DTYPE_BF16;
    ck_assert_int_eq(attn_model_load_hf(DATA "hf_tiny_f32", &p, &m, err, sizeof err), ATTN_OK);
    ck_assert_int_eq(attn_model_weights_dtype(m), ATTN_DTYPE_BF16);
    attn_model_destroy(m);
    p.weights_dtype = (attn_dtype)7;
    m = NULL;
    ck_assert_int_lt(attn_model_load_hf(DATA "hf_tiny_f32", &p, &m, err, sizeof err), 0);
    ck_assert_ptr_null(m);
}
END_TEST

/* `extern` keeps this prototype out of the Makefile's suite-table scan, which matches lines
 * starting with `Suite *`. */
extern Suite *dtype_suite(void);

Suite *dtype_suite(void) {
    Suite *s = suite_create("dtype");
    TCase *tc = tcase_create("dtype");
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, test_dtype_conversions_round_to_nearest_even);
    tcase_add_test(tc, test_dtype_half_rows_match_one_by_one);
    tcase_add_loop_test(tc, test_dtype_rows_dot_kernels_agree, 0, 2); /* AVX-512, not */
    tcase_add_loop_test(tc, test_dtype_panel_kernels_agree, 0, 3);    /* AVX-512, AVX2, C */
    tcase_add_loop_test(tc, test_dtype_half_model_matches_ref, 0, 2); /* AVX-512, not */
    tcase_add_test(tc, test_dtype_checkpoints_held_as_shipped);
    suite_add_tcase(s, tc);
    return s;
}
