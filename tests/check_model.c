/* tests/check_model.c: model objects: presets, attn_config_check (defaults and rejections),
 * models from caller tensors (copied, layer sub-ranges) and seeded random models (deterministic,
 * a layer's weights independent of which other layers are loaded). Numerics against ref use
 * HARNESS_ATOL/RTOL (check_harness.h); determinism is checked bit for bit. */
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check_harness.h"
#include "ref.h"

/* tiny, seed 0, F32: pinned (saved sessions carry it; a change here is a format change) */
#define FP_TINY_SEED0_F32 "09ae46f782366e354498ed4487dd8fb37af9cef5cbf588beee2b8754d53b7938"

/* Runs n tokens of x through `layer` of m on a fresh cache; returns the forward's code. */
static int forward_once(const attn_model *m, int32_t layer, const float *x, int32_t n, float *out) {
    attn_kv_pool *pool = NULL;
    attn_workspace *ws = NULL;
    attn_kv *kv = NULL;
    ck_assert_int_eq(attn_kv_pool_create(m, (size_t)8 << 20, 16, &pool), ATTN_OK);
    ck_assert_int_eq(attn_workspace_create(m, 64, NULL, &ws), ATTN_OK);
    ck_assert_int_eq(attn_kv_create(pool, &kv), ATTN_OK);
    attn_step step = {kv, x, n, NULL, NULL, out, NULL, NULL, NULL, 0, NULL, NULL, 0};
    int rc = attn_forward(m, layer, ws, &step, 1);
    attn_kv_destroy(kv);
    attn_workspace_destroy(ws);
    attn_kv_pool_destroy(pool);
    return rc;
}

/* ---- presets and config checking ----------------------------------------------------------- */

START_TEST(test_model_presets) {
    static const struct {
        const char *name;
        int32_t hidden, heads, kv_heads, head_dim, layers;
        float theta;
    } want[] = {
        {"tiny", 64, 4, 2, 16, 2, 10000.0f},
        {"small", 512, 8, 2, 64, 4, 10000.0f},
        {"llama8b", 4096, 32, 8, 128, 32, 500000.0f},
    };
    for (size_t i = 0; i < sizeof(want) / sizeof(want[0]); i++) {
        attn_config c;
        memset(&c, 0, sizeof(c));
        ck_assert_int_eq(attn_config_preset(want[i].name, &c), ATTN_OK);
        ck_assert_int_eq(attn_config_check(&c), ATTN_OK);
        ck_assert_int_eq(c.hidden_size, want[i].hidden);
        ck_assert_int_eq(c.n_heads, want[i].heads);
        ck_assert_int_eq(c.n_kv_heads, want[i].kv_heads);
        ck_assert_int_eq(c.head_dim, want[i].head_dim);
        ck_assert_int_eq(c.n_layers, want[i].layers);
        ck_assert_float_eq(c.rope_theta, want[i].theta);
        ck_assert_int_gt(c.max_seq, 0);
    }
    attn_config c;
    memset(&c, 0x5A, sizeof(c));
    attn_config before = c;
    ck_assert_int_eq(attn_config_preset("huge", &c), ATTN_EINVAL);
    ck_assert_int_eq(attn_config_preset("", &c), ATTN_EINVAL);
    ck_assert_int_eq(attn_config_preset(NULL, &c), ATTN_EINVAL);
    ck_assert_msg(memcmp(&c, &before, sizeof(c)) == 0, "a failed preset wrote its out-param");
}
END_TEST

/* Zero means default: head_dim = hidden / heads, rotary_dim = head_dim, theta 10000,
 * softmax_scale = 1 / sqrt(head_dim). Given values stay as they are. */
START_TEST(test_model_config_check_defaults) {
    attn_config c = harness_config(8, 2, 0);
    c.hidden_size = 256;
    c.rotary_dim = 0;
    c.rope_theta = 0.0f;
    c.softmax_scale = 0.0f;
    ck_assert_int_eq(attn_config_check(&c), ATTN_OK);
    ck_assert_int_eq(c.head_dim, 32);
    ck_assert_int_eq(c.rotary_dim, 32);
    ck_assert_float_eq(c.rope_theta, 10000.0f);
    ck_assert_float_eq_tol(c.softmax_scale, (float)(1.0 / sqrt(32.0)), 1e-7f);

    attn_config g = harness_config(8, 2, 48); /* head_dim need not be hidden / heads */
    g.rotary_dim = -1;
    g.rope_theta = 123.0f;
    g.softmax_scale = 0.3f;
    ck_assert_int_eq(attn_config_check(&g), ATTN_OK);
    ck_assert_int_eq(g.head_dim, 48);
    ck_assert_int_eq(g.rotary_dim, -1);
    ck_assert_float_eq(g.rope_theta, 123.0f);
    ck_assert_float_eq(g.softmax_scale, 0.3f);
}
END_TEST

/* Every way a config can be impossible gives ATTN_EINVAL or ATTN_ESHAPE (attn.h names both
 * without saying which is which). */
START_TEST(test_model_config_check_rejects) {
    for (int kind = 0; kind < 19; kind++) {
        attn_config c = harness_config(8, 2, 32);
        switch (kind) {
        case 0:
            c.n_heads = 0;
            break;
        case 1:
            c.n_kv_heads = 0;
            break;
        case 2:
            c.n_kv_heads = 3; /* does not divide 8 */
            break;
        case 3:
            c.n_kv_heads = 16;
            break;
        case 4:
            c.hidden_size = 0;
            break;
        case 5:
            c.head_dim = 0;
            c.hidden_size = 65; /* hidden / heads not whole */
            break;
        case 6:
            c.head_dim = -4;
            break;
        case 7:
            c.rotary_dim = 15; /* odd */
            break;
        case 8:
            c.rotary_dim = 34; /* > head_dim */
            break;
        case 9:
            c.rotary_dim = -2;
            break;
        case 10:
            c.max_seq = 0;
            break;
        case 11:
            c.sliding_window = -1;
            break;
        case 12:
            c.n_layers = 0;
            break;
        case 13:
            c.rope_scaling.type = ATTN_ROPE_SCALING_LINEAR;
            c.rope_scaling.factor = 0;
            break;
        case 14:
            c.rope_scaling.type = ATTN_ROPE_SCALING_LLAMA3;
            c.rope_scaling.factor = 8.0f;
            c.rope_scaling.low_freq_factor = 4.0f;
            c.rope_scaling.high_freq_factor = 4.0f; /* must be > low */
            c.rope_scaling.original_max_position = 8192;
            break;
        case 15:
            c.rope_scaling.type = ATTN_ROPE_SCALING_LLAMA3;
            c.rope_scaling.factor = 8.0f;
            c.rope_scaling.low_freq_factor = 1.0f;
            c.rope_scaling.high_freq_factor = 4.0f;
            c.rope_scaling.original_max_position = 0;
            break;
        case 16:
            c.rope_scaling.type = (attn_rope_scaling_type)7;
            break;
        case 17:
            c.rope_style = (attn_rope_style)5;
            break;
        default:
            c.rope_theta = -1.0f;
            break;
        }
        int rc = attn_config_check(&c);
        ck_assert_msg(rc == ATTN_EINVAL || rc == ATTN_ESHAPE,
                      "bad config kind %d: attn_config_check = %d (%s)", kind, rc,
                      attn_strerror(rc));
        /* The model constructors validate the same way. */
        attn_model *m = NULL;
        rc = attn_model_create_random(&c, 1, NULL, &m);
        ck_assert_msg(rc == ATTN_EINVAL || rc == ATTN_ESHAPE,
                      "bad config kind %d: attn_model_create_random = %d", kind, rc);
        ck_assert_ptr_null(m);
    }
    ck_assert_int_eq(attn_config_check(NULL), ATTN_EINVAL);
}
END_TEST

/* ---- models from caller tensors ------------------------------------------------------------ */

/* The tensors are copied: scribbling over the caller's buffers after create changes nothing. */
START_TEST(test_model_create_copies_tensors) {
    attn_config cfg = harness_config(4, 2, 16);
    harness_model hm;
    harness_model_init(&hm, &cfg, 5);
    float *x = harness_random_x(5, 9, cfg.hidden_size);
    float *out = harness_calloc((size_t)9 * 64, sizeof(float));
    float *out_ref = harness_calloc((size_t)9 * 64, sizeof(float));
    harness_ref_run(&hm, 0, x, NULL, NULL, 9, out_ref, NULL, NULL, NULL);
    ref_layer *w = &hm.layers[0];
    size_t q = (size_t)4 * 16 * 64;
    size_t kvn = (size_t)2 * 16 * 64;
    float *tensors[8] = {w->wq, w->wk, w->wv, w->wo, w->bq, w->bk, w->bv, w->bo};
    size_t counts[8] = {q, kvn, kvn, q, 64, 32, 32, 64};
    for (int t = 0; t < 8; t++) {
        for (size_t i = 0; i < counts[t]; i++) {
            tensors[t][i] = NAN;
        }
    }
    ck_assert_int_eq(forward_once(hm.model, 0, x, 9, out), ATTN_OK);
    harness_expect_close(out, out_ref, (size_t)9 * 64, "out after the caller's tensors changed");
    free(out_ref);
    free(out);
    free(x);
    harness_model_release(&hm);
}
END_TEST

/* Phi's q/k LayerNorm biases: required with ATTN_QK_NORM_HEAD_LAYERNORM_BIAS, copied, and part
 * of the fingerprint (another bias, another model). */
START_TEST(test_model_norm_biases) {
    attn_config cfg = harness_config(4, 2, 16);
    cfg.qk_norm = ATTN_QK_NORM_HEAD_LAYERNORM_BIAS;
    ref_layer layer;
    ref_rng rng;
    ref_rng_init(&rng, 78);
    ref_layer_init_random(&layer, &cfg, &rng);
    float weight[16], bias[2][16];
    for (int i = 0; i < 16; i++) {
        weight[i] = 1.0f;
        bias[0][i] = bias[1][i] = 0.0f;
    }
    attn_layer_weights lw = harness_weights(&cfg, &layer);
    lw.q_norm = lw.k_norm = weight;
    lw.q_norm_bias = bias[0];
    attn_model *m = NULL;
    ck_assert_int_eq(attn_model_create(&cfg, &lw, NULL, &m), ATTN_EINVAL); /* no k bias */
    lw.k_norm_bias = bias[1];
    uint8_t a[ATTN_FINGERPRINT_BYTES], b[ATTN_FINGERPRINT_BYTES];
    ck_assert_int_eq(attn_model_create(&cfg, &lw, NULL, &m), ATTN_OK);
    attn_model_fingerprint(m, a);
    attn_model_destroy(m);
    bias[1][3] = 0.5f;
    ck_assert_int_eq(attn_model_create(&cfg, &lw, NULL, &m), ATTN_OK);
    attn_model_fingerprint(m, b);
    attn_model_destroy(m);
    ck_assert_mem_ne(a, b, sizeof a);
    ref_layer_release(&layer);
}
END_TEST

/* layers[i] holds layer layer_first + i: a model of layers 1-2 of 3 computes each with its own
 * weights, and layer 0 is not loaded. */
START_TEST(test_model_create_layer_range) {
    attn_config cfg = harness_config(4, 2, 16);
    cfg.n_layers = 3;
    ref_layer layers[3];
    ref_rng rng;
    ref_rng_init(&rng, 77);
    for (int l = 0; l < 3; l++) {
        ref_layer_init_random(&layers[l], &cfg, &rng);
    }
    attn_layer_weights lw[2] = {harness_weights(&cfg, &layers[1]),
                                harness_weights(&cfg, &layers[2])};
    attn_load_params p = {1, 2, 0, NULL, ATTN_DTYPE_AUTO, NULL};
    attn_model *m = NULL;
    ck_assert_int_eq(attn_model_create(&cfg, lw, &p, &m), ATTN_OK);
    ck_assert_int_eq(attn_model_layer_first(m), 1);
    ck_assert_int_eq(attn_model_layer_count(m), 2);
    ck_assert_int_eq(attn_model_config(m)->n_layers, 3);

    float *x = harness_random_x(8, 7, 64);
    float *out = harness_calloc((size_t)7 * 64, sizeof(float));
    float *out_ref = harness_calloc((size_t)7 * 64, sizeof(float));
    for (int32_t l = 1; l <= 2; l++) {
        ref_forward_args a = {.n_tokens = 7, .x = x, .out = out_ref, .kv_dtype = ATTN_DTYPE_AUTO};
        ref_layer_forward(&cfg, &layers[l], &a);
        ck_assert_int_eq(forward_once(m, l, x, 7, out), ATTN_OK);
        harness_expect_close(out, out_ref, (size_t)7 * 64, l == 1 ? "layer 1" : "layer 2");
    }
    ck_assert_int_eq(forward_once(m, 0, x, 7, out), ATTN_EINVAL);
    ck_assert_int_eq(forward_once(m, 3, x, 7, out), ATTN_EINVAL);
    ck_assert_int_eq(forward_once(m, -1, x, 7, out), ATTN_EINVAL);

    /* NULL arguments and missing tensors are refused. */
    attn_model *bad = NULL;
    ck_assert_int_eq(attn_model_create(NULL, lw, &p, &bad), ATTN_EINVAL);
    ck_assert_int_eq(attn_model_create(&cfg, NULL, &p, &bad), ATTN_EINVAL);
    attn_layer_weights missing[2] = {lw[0], lw[1]};
    missing[1].wv = NULL;
    ck_assert_int_eq(attn_model_create(&cfg, missing, &p, &bad), ATTN_EINVAL);
    missing[1] = lw[1];
    missing[0].bq = NULL; /* the config has q/k/v biases */
    ck_assert_int_eq(attn_model_create(&cfg, missing, &p, &bad), ATTN_EINVAL);
    ck_assert_ptr_null(bad);

    free(out_ref);
    free(out);
    free(x);
    attn_model_destroy(m);
    attn_model_destroy(NULL);
    for (int l = 0; l < 3; l++) {
        ref_layer_release(&layers[l]);
    }
}
END_TEST

/* A NULL out-param is an invalid argument (ATTN_EINVAL), not a crash. */
START_TEST(test_model_create_null_out_is_einval) {
    attn_config cfg = harness_config(4, 2, 16);
    ref_layer w;
    ref_rng rng;
    ref_rng_init(&rng, 5);
    ref_layer_init_random(&w, &cfg, &rng);
    attn_layer_weights lw = harness_weights(&cfg, &w);
    ck_assert_int_eq(attn_model_create(&cfg, &lw, NULL, NULL), ATTN_EINVAL);
    ref_layer_release(&w);
}
END_TEST

START_TEST(test_model_create_random_null_out_is_einval) {
    attn_config cfg = harness_config(4, 2, 16);
    ck_assert_int_eq(attn_model_create_random(&cfg, 1, NULL, NULL), ATTN_EINVAL);
}
END_TEST

/* A layer range outside the config: attn.h lists ATTN_EINVAL, ATTN_ESHAPE and ATTN_ENOMEM for
 * attn_model_create, and of those only ATTN_EINVAL fits (the same for the random model). */
START_TEST(test_model_layer_range_past_config_is_einval) {
    attn_config cfg = harness_config(4, 2, 16);
    cfg.n_layers = 3;
    static const attn_load_params bad[] = {
        {2, 2, 0, NULL, ATTN_DTYPE_AUTO, NULL}, {3, 0, 0, NULL, ATTN_DTYPE_AUTO, NULL},
        {0, 4, 0, NULL, ATTN_DTYPE_AUTO, NULL}, {-1, 1, 0, NULL, ATTN_DTYPE_AUTO, NULL},
        {0, 0, 0, NULL, (attn_dtype)-1, NULL},  {0, 0, 0, NULL, (attn_dtype)4, NULL}};
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        attn_model *m = NULL;
        int rc = attn_model_create_random(&cfg, 1, &bad[i], &m);
        ck_assert_msg(rc == ATTN_EINVAL, "layers first %d count %d of 3: got %d (%s), want %d",
                      (int)bad[i].layer_first, (int)bad[i].layer_count, rc, attn_strerror(rc),
                      ATTN_EINVAL);
        ck_assert_ptr_null(m);
    }
}
END_TEST

/* attn_model_bytes counts at least the float weights of the loaded layers, and grows with them. */
START_TEST(test_model_bytes) {
    attn_config cfg = harness_config(8, 2, 32);
    cfg.n_layers = 4;
    attn_model *all = NULL;
    attn_model *two = NULL;
    attn_load_params p = {1, 2, 0, NULL, ATTN_DTYPE_AUTO, NULL};
    ck_assert_int_eq(attn_model_create_random(&cfg, 9, NULL, &all), ATTN_OK);
    ck_assert_int_eq(attn_model_create_random(&cfg, 9, &p, &two), ATTN_OK);
    size_t per_layer = sizeof(float) * ((size_t)(8 + 2 + 2) * 32 * 64 + (size_t)64 * 8 * 32 +
                                        (size_t)(8 + 2 + 2) * 32 + 64);
    ck_assert_uint_ge(attn_model_bytes(two), 2 * per_layer);
    ck_assert_uint_ge(attn_model_bytes(all), 4 * per_layer);
    ck_assert_uint_gt(attn_model_bytes(all), attn_model_bytes(two));
    attn_model_destroy(two);
    attn_model_destroy(all);
}
END_TEST

/* ---- random models ------------------------------------------------------------------------- */

/* Same seed, same weights (bit-identical outputs); another seed, other weights; and loading only
 * layers 2-3 gives layers 2 and 3 exactly as loading all 4 does. */
START_TEST(test_model_random_deterministic) {
    attn_config cfg;
    ck_assert_int_eq(attn_config_preset("tiny", &cfg), ATTN_OK);
    cfg.n_layers = 4;
    cfg.max_seq = 128;
    attn_model *a = NULL;
    attn_model *b = NULL;
    attn_model *c = NULL;
    attn_model *sub = NULL;
    attn_load_params p = {2, 2, 0, NULL, ATTN_DTYPE_AUTO, NULL};
    ck_assert_int_eq(attn_model_create_random(&cfg, 1234, NULL, &a), ATTN_OK);
    ck_assert_int_eq(attn_model_create_random(&cfg, 1234, NULL, &b), ATTN_OK);
    ck_assert_int_eq(attn_model_create_random(&cfg, 1235, NULL, &c), ATTN_OK);
    ck_assert_int_eq(attn_model_create_random(&cfg, 1234, &p, &sub), ATTN_OK);
    ck_assert_int_eq(attn_model_layer_first(sub), 2);
    ck_assert_int_eq(attn_model_layer_count(sub), 2);

    const int32_t n = 11;
    const size_t count = (size_t)n * cfg.hidden_size;
    float *x = harness_random_x(3, n, cfg.hidden_size);
    float *oa = harness_calloc(count, sizeof(float));
    float *ob = harness_calloc(count, sizeof(float));
    for (int32_t l = 0; l < 4; l++) {
        ck_assert_int_eq(forward_once(a, l, x, n, oa), ATTN_OK);
        ck_assert_int_eq(forward_once(b, l, x, n, ob), ATTN_OK);
        ck_assert_msg(memcmp(oa, ob, count * sizeof(float)) == 0,
                      "layer %d: same seed, different outputs", (int)l);
        for (size_t i = 0; i < count; i++) {
            ck_assert_msg(isfinite(oa[i]), "layer %d: out[%zu] = %g", (int)l, i, (double)oa[i]);
        }
        ck_assert_int_eq(forward_once(c, l, x, n, ob), ATTN_OK);
        ck_assert_msg(memcmp(oa, ob, count * sizeof(float)) != 0,
                      "layer %d: seeds 1234 and 1235 give the same outputs", (int)l);
        if (l >= 2) {
            ck_assert_int_eq(forward_once(sub, l, x, n, ob), ATTN_OK);
            ck_assert_msg(memcmp(oa, ob, count * sizeof(float)) == 0,
                          "layer %d: loading layers 2-3 alone changes its weights", (int)l);
        } else {
            ck_assert_int_eq(forward_once(sub, l, x, n, ob), ATTN_EINVAL);
        }
    }
    /* Layers differ from each other (the stream is seeded by the layer too). */
    ck_assert_int_eq(forward_once(a, 0, x, n, oa), ATTN_OK);
    ck_assert_int_eq(forward_once(a, 1, x, n, ob), ATTN_OK);
    ck_assert_msg(memcmp(oa, ob, count * sizeof(float)) != 0, "layers 0 and 1 are identical");
    free(ob);
    free(oa);
    free(x);
    attn_model_destroy(sub);
    attn_model_destroy(c);
    attn_model_destroy(b);
    attn_model_destroy(a);
}
END_TEST

/* The fingerprint names what a model computes: equal for the same model made twice (random or
 * from a checkpoint), different for another seed, another holding of the same weights, another
 * config field, another layer range; and its value for one model is pinned, since saved
 * sessions will carry it. */
static void fp_of(const attn_config *cfg, uint64_t seed, attn_dtype dt, int32_t layers,
                  uint8_t out[ATTN_FINGERPRINT_BYTES]) {
    attn_load_params p = {.layer_count = layers, .weights_dtype = dt};
    attn_model *m = NULL;
    ck_assert_int_eq(attn_model_create_random(cfg, seed, &p, &m), ATTN_OK);
    attn_model_fingerprint(m, out);
    attn_model_destroy(m);
}

START_TEST(test_model_fingerprint) {
    attn_config cfg;
    ck_assert_int_eq(attn_config_preset("tiny", &cfg), ATTN_OK);
    uint8_t a[ATTN_FINGERPRINT_BYTES], b[ATTN_FINGERPRINT_BYTES];
    fp_of(&cfg, 0, ATTN_DTYPE_F32, 0, a);
    fp_of(&cfg, 0, ATTN_DTYPE_F32, 0, b);
    ck_assert_mem_eq(a, b, sizeof a);
    char hex[2 * ATTN_FINGERPRINT_BYTES + 1];
    for (int i = 0; i < ATTN_FINGERPRINT_BYTES; i++) {
        snprintf(hex + 2 * i, 3, "%02x", a[i]);
    }
    ck_assert_str_eq(hex, FP_TINY_SEED0_F32);
    fp_of(&cfg, 1, ATTN_DTYPE_F32, 0, b);
    ck_assert_mem_ne(a, b, sizeof a);
    fp_of(&cfg, 0, ATTN_DTYPE_BF16, 0, b);
    ck_assert_mem_ne(a, b, sizeof a);
    fp_of(&cfg, 0, ATTN_DTYPE_F32, 1, b); /* layer 0 alone */
    ck_assert_mem_ne(a, b, sizeof a);
    attn_config other = cfg;
    other.rope_theta = 10001.0f;
    fp_of(&other, 0, ATTN_DTYPE_F32, 0, b);
    ck_assert_mem_ne(a, b, sizeof a);
    other = cfg;
    other.sliding_window = 64;
    fp_of(&other, 0, ATTN_DTYPE_F32, 0, b);
    ck_assert_mem_ne(a, b, sizeof a);
    other = cfg; /* fields hashed only when set (the pinned value above is without them) */
    other.is_nope_layer[1] = true;
    fp_of(&other, 0, ATTN_DTYPE_F32, 0, b);
    ck_assert_mem_ne(a, b, sizeof a);
    other = cfg;
    other.clip_qkv = 8.0f;
    fp_of(&other, 0, ATTN_DTYPE_F32, 0, b);
    ck_assert_mem_ne(a, b, sizeof a);
    /* a checkpoint loaded twice agrees; held in F32 instead of its BF16 it differs */
    attn_model *m = NULL;
    char err[256] = "";
    ck_assert_int_eq(attn_model_load_hf("tests/data/hf_tiny_bf16", NULL, &m, err, sizeof err),
                     ATTN_OK);
    attn_model_fingerprint(m, a);
    attn_model_destroy(m);
    ck_assert_int_eq(attn_model_load_hf("tests/data/hf_tiny_bf16", NULL, &m, err, sizeof err),
                     ATTN_OK);
    attn_model_fingerprint(m, b);
    attn_model_destroy(m);
    ck_assert_mem_eq(a, b, sizeof a);
    attn_load_params f32 = {.weights_dtype = ATTN_DTYPE_F32};
    ck_assert_int_eq(attn_model_load_hf("tests/data/hf_tiny_bf16", &f32, &m, err, sizeof err),
                     ATTN_OK);
    attn_model_fingerprint(m, b);
    attn_model_destroy(m);
    ck_assert_mem_ne(a, b, sizeof a);
}
END_TEST

/* The session files' checksum is part of their format: every saved file is checked with it, so
 * it must give the words it gave when the format was made (values from that build's code), at
 * every length around its 32-byte stripe, whatever the implementation becomes. */
START_TEST(test_model_checksum_is_stable) {
    static uint8_t b[4096];
    for (int i = 0; i < 4096; i++) {
        b[i] = (uint8_t)(i * 131 + 7);
    }
    static const struct {
        size_t n;
        uint64_t sum;
    } want[] = {
        {0, 0x69a1013026774a91ull},    {1, 0xce979fe4445bff2bull},  {31, 0xcee80093f90fb378ull},
        {32, 0xb0c9b23aa9840134ull},   {33, 0x95765198f08d6260ull}, {100, 0xc886e70f61542769ull},
        {4096, 0xdb3d5ddd9a5cb80aull},
    };
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
        ck_assert_msg(attn_checksum64(b, want[i].n) == want[i].sum, "n=%zu", want[i].n);
    }
}
END_TEST

/* `extern` keeps this prototype out of the Makefile's suite-table scan, which matches lines
 * starting with `Suite *`. */
extern Suite *model_suite(void);

Suite *model_suite(void) {
    Suite *s = suite_create("model");
    TCase *tc = tcase_create("model");
    tcase_add_test(tc, test_model_presets);
    tcase_add_test(tc, test_model_config_check_defaults);
    tcase_add_test(tc, test_model_config_check_rejects);
    tcase_add_test(tc, test_model_create_copies_tensors);
    tcase_add_test(tc, test_model_create_layer_range);
    tcase_add_test(tc, test_model_layer_range_past_config_is_einval);
    tcase_add_test(tc, test_model_bytes);
    tcase_add_test(tc, test_model_random_deterministic);
    tcase_add_test(tc, test_model_fingerprint);
    tcase_add_test(tc, test_model_norm_biases);
    tcase_add_test(tc, test_model_checksum_is_stable);
    suite_add_tcase(s, tc);
    /* Their own case, so that CK_RUN_CASE=model can run the rest without fork (valgrind) even
     * while an engine that dereferences a NULL out-param crashes these. */
    TCase *null_out = tcase_create("model_null_out");
    tcase_add_test(null_out, test_model_create_null_out_is_einval);
    tcase_add_test(null_out, test_model_create_random_null_out_is_einval);
    suite_add_tcase(s, null_out);
    return s;
}
