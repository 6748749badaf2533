/* tests/check_ref.c: tests the tests. The C reference (tests/ref.c) is checked against the golden
 * outputs that tests/gen_fixtures.py computed in float64 numpy, reading the weights straight from
 * the fixture safetensors with a throwaway reader (cJSON for the header), so that two independent
 * implementations agree before either is used to judge the engine. Also checks ref's SDPA against
 * hand-computed cases and its llama3 frequencies against values worked out by hand. */
#include <check.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "check_harness.h"
#include "ref.h"

/* ---- a minimal safetensors reader (F32 and F16 only) --------------------------------------- */

typedef struct st_file {
    unsigned char *bytes;
    size_t size;
    cJSON *header;
    size_t data_start;
} st_file;

static void st_open(st_file *f, const char *path) {
    FILE *fp = fopen(path, "rb");
    ck_assert_msg(fp != NULL, "cannot open %s", path);
    fseek(fp, 0, SEEK_END);
    f->size = (size_t)ftell(fp);
    fseek(fp, 0, SEEK_SET);
    f->bytes = harness_calloc(f->size, 1);
    ck_assert_uint_eq(fread(f->bytes, 1, f->size, fp), f->size);
    fclose(fp);
    uint64_t n = 0;
    for (int i = 7; i >= 0; i--) {
        n = (n << 8) | f->bytes[i];
    }
    ck_assert_uint_le(8 + n, f->size);
    f->header = cJSON_ParseWithLength((const char *)f->bytes + 8, (size_t)n);
    ck_assert_ptr_nonnull(f->header);
    f->data_start = 8 + (size_t)n;
}

static void st_close(st_file *f) {
    cJSON_Delete(f->header);
    free(f->bytes);
}

/* IEEE half to float, for the F16 fixture. */
static float half_to_float(uint16_t h) {
    int sign = (h >> 15) & 1;
    int exp = (h >> 10) & 0x1F;
    int mant = h & 0x3FF;
    double v;
    if (exp == 0) {
        v = ldexp((double)mant, -24);
    } else {
        ck_assert_int_ne(exp, 31); /* the fixtures hold no inf or NaN */
        v = ldexp((double)(mant | 0x400), exp - 25);
    }
    return (float)(sign ? -v : v);
}

/* Returns a malloc'd float copy of tensor name, which must hold exactly n elements. */
static float *st_tensor(const st_file *f, const char *name, size_t n) {
    const cJSON *t = cJSON_GetObjectItemCaseSensitive(f->header, name);
    ck_assert_msg(t != NULL, "tensor %s missing", name);
    const char *dtype = cJSON_GetObjectItemCaseSensitive(t, "dtype")->valuestring;
    const cJSON *offs = cJSON_GetObjectItemCaseSensitive(t, "data_offsets");
    size_t begin = (size_t)cJSON_GetArrayItem(offs, 0)->valuedouble;
    size_t end = (size_t)cJSON_GetArrayItem(offs, 1)->valuedouble;
    const unsigned char *p = f->bytes + f->data_start + begin;
    float *out = harness_calloc(n, sizeof(float));
    if (strcmp(dtype, "F32") == 0) {
        ck_assert_uint_eq(end - begin, n * 4);
        for (size_t i = 0; i < n; i++) {
            uint32_t u = (uint32_t)p[4 * i] | (uint32_t)p[4 * i + 1] << 8 |
                         (uint32_t)p[4 * i + 2] << 16 | (uint32_t)p[4 * i + 3] << 24;
            memcpy(&out[i], &u, sizeof(u));
        }
    } else {
        ck_assert_str_eq(dtype, "F16");
        ck_assert_uint_eq(end - begin, n * 2);
        for (size_t i = 0; i < n; i++) {
            out[i] = half_to_float((uint16_t)(p[2 * i] | p[2 * i + 1] << 8));
        }
    }
    return out;
}

static void st_layer(const st_file *f, const attn_config *cfg, int32_t layer, ref_layer *w) {
    char name[128];
    size_t hidden = (size_t)cfg->hidden_size;
    size_t q_dim = (size_t)cfg->n_heads * ref_head_dim(cfg);
    size_t kv_dim = (size_t)cfg->n_kv_heads * ref_head_dim(cfg);
    const char *proj[4] = {"q_proj", "k_proj", "v_proj", "o_proj"};
    float **weight[4] = {&w->wq, &w->wk, &w->wv, &w->wo};
    float **bias[4] = {&w->bq, &w->bk, &w->bv, &w->bo};
    size_t out_dim[4] = {q_dim, kv_dim, kv_dim, hidden};
    size_t in_dim[4] = {hidden, hidden, hidden, q_dim};
    memset(w, 0, sizeof(*w));
    for (int i = 0; i < 4; i++) {
        snprintf(name, sizeof(name), "model.layers.%d.self_attn.%s.weight", (int)layer, proj[i]);
        *weight[i] = st_tensor(f, name, out_dim[i] * in_dim[i]);
        bool has_bias = i < 3 ? cfg->has_qkv_bias : cfg->has_o_bias;
        if (has_bias) {
            snprintf(name, sizeof(name), "model.layers.%d.self_attn.%s.bias", (int)layer, proj[i]);
            *bias[i] = st_tensor(f, name, out_dim[i]);
        }
    }
}

/* ---- the fixture models, as the C side describes them -------------------------------------- */

/* Must agree with TINY_CONFIG in tests/gen_fixtures.py. */
static attn_config tiny_config(void) {
    attn_config c = harness_config(4, 2, 16);
    c.n_layers = 2;
    c.max_seq = 256;
    c.rope_scaling = harness_llama3_scaling(64);
    return c;
}

/* Must agree with ALT_CONFIG in tests/gen_fixtures.py. */
static attn_config alt_config(void) {
    attn_config c = harness_config(4, 1, 8);
    c.hidden_size = 32;
    c.rotary_dim = 4;
    c.rope_theta = 1000.0f;
    c.rope_style = ATTN_ROPE_STYLE_INTERLEAVED;
    c.rope_scaling.type = ATTN_ROPE_SCALING_LINEAR;
    c.rope_scaling.factor = 2.0f;
    c.sliding_window = 4;
    c.max_seq = 64;
    c.has_o_bias = false;
    return c;
}

/* Runs ref over the fixture's input (tests/data/expected/<input>_x.bin, <input>_pos.bin, n tokens)
 * with the weights of st_path and compares every layer with <expected>_l<i>_*.bin. */
static void check_against_numpy(const attn_config *cfg, const char *st_path, const char *input,
                                const char *expected, int32_t n) {
    const int32_t hidden = cfg->hidden_size;
    const size_t kv_count = (size_t)cfg->n_kv_heads * n * ref_head_dim(cfg);
    const size_t w_count = (size_t)cfg->n_heads * n * n;
    char path[256];
    st_file f;
    st_open(&f, st_path);
    snprintf(path, sizeof(path), "tests/data/expected/%s_x.bin", input);
    float *x = harness_read_file(path, (size_t)n * hidden * sizeof(float));
    snprintf(path, sizeof(path), "tests/data/expected/%s_pos.bin", input);
    int32_t *pos = harness_read_file(path, (size_t)n * sizeof(int32_t));
    float *out = harness_calloc((size_t)n * hidden, sizeof(float));
    float *weights = harness_calloc(w_count, sizeof(float));
    float *k = harness_calloc(kv_count, sizeof(float));
    float *v = harness_calloc(kv_count, sizeof(float));

    for (int32_t l = 0; l < cfg->n_layers; l++) {
        ref_layer w;
        ref_forward_args a = {.n_tokens = n,
                              .x = x,
                              .positions = pos,
                              .out = out,
                              .weights = weights,
                              .k = k,
                              .v = v,
                              .kv_dtype = ATTN_DTYPE_AUTO};
        st_layer(&f, cfg, l, &w);
        ref_layer_forward(cfg, &w, &a);
        const char *what[4] = {"out", "weights", "k", "v"};
        const float *got[4] = {out, weights, k, v};
        size_t count[4] = {(size_t)n * hidden, w_count, kv_count, kv_count};
        for (int i = 0; i < 4; i++) {
            char label[320];
            snprintf(path, sizeof(path), "tests/data/expected/%s_l%d_%s.bin", expected, (int)l,
                     what[i]);
            float *want = harness_read_file(path, count[i] * sizeof(float));
            snprintf(label, sizeof(label), "ref vs numpy %s", path);
            /* Both sides are double-accurate; only the final float rounding differs. */
            harness_expect_close_tol(got[i], want, count[i], 1e-6, 1e-6, label);
            free(want);
        }
        ref_layer_release(&w);
    }
    free(v);
    free(k);
    free(weights);
    free(out);
    free(pos);
    free(x);
    st_close(&f);
}

START_TEST(test_ref_matches_numpy_tiny_f32) {
    attn_config cfg = tiny_config();
    check_against_numpy(&cfg, "tests/data/hf_tiny_f32/model.safetensors", "tiny", "tiny_f32", 10);
}
END_TEST

START_TEST(test_ref_matches_numpy_alt_f16) {
    attn_config cfg = alt_config();
    check_against_numpy(&cfg, "tests/data/hf_alt_f16/model.safetensors", "alt", "alt_f16", 12);
}
END_TEST

/* Llama 3.1's published setting (factor 8, low 1, high 4, original 8192, theta 500000) on
 * head_dim 128, worked out by hand from the formula in HF's _compute_llama3_parameters: entry 0
 * has wavelength 2 pi (high frequency, kept); entry 63 has wavelength ~3.3e6 > 8192 (divided by
 * 8); entry 30 has wavelength 2 pi 500000^(60/128) ~ 2947, inside (2048, 8192), so it is
 * smoothed with s = (8192 / 2947 - 1) / 3. */
START_TEST(test_ref_llama3_inv_freq_regimes) {
    attn_config cfg = harness_config(32, 8, 128);
    double f[64];
    cfg.rope_theta = 500000.0f;
    cfg.rope_scaling = harness_llama3_scaling(8192);
    ref_rope_inv_freq(&cfg, f);
    ck_assert_double_eq_tol(f[0], 1.0, 1e-15);
    double base63 = pow(500000.0, -126.0 / 128.0);
    ck_assert_double_eq_tol(f[63], base63 / 8.0, 1e-15 * base63);
    double base30 = pow(500000.0, -60.0 / 128.0);
    double wavelen = 2.0 * 3.14159265358979323846 / base30;
    ck_assert(wavelen > 2048.0 && wavelen < 8192.0);
    double s = (8192.0 / wavelen - 1.0) / 3.0;
    ck_assert_double_eq_tol(f[30], (1.0 - s) * base30 / 8.0 + s * base30, 1e-15);
}
END_TEST

/* Two keys, one query, d = 1: scores are scale * q k = (0, ln 3) with scale 1, so the
 * probabilities are 1/4 and 3/4 and the output is their mix of v. */
START_TEST(test_ref_sdpa_by_hand) {
    float q[1] = {1.0f};
    float k[2] = {0.0f, (float)log(3.0)};
    float v[4] = {1.0f, 10.0f, 3.0f, 30.0f}; /* d_v = 2 */
    float out[2];
    float w[2];
    ref_sdpa_args a = {1, 1, 1, 2, 1, 2, q, k, v, false, -1, 1.0, out, w, NULL, 0};
    ref_sdpa(&a);
    ck_assert_float_eq_tol(w[0], 0.25f, 1e-7f);
    ck_assert_float_eq_tol(w[1], 0.75f, 1e-7f);
    ck_assert_float_eq_tol(out[0], 0.25f * 1.0f + 0.75f * 3.0f, 1e-6f);
    ck_assert_float_eq_tol(out[1], 0.25f * 10.0f + 0.75f * 30.0f, 1e-5f);
    /* One query over two keys sits at key index 1 (bottom-right); a window of 0 leaves it only
     * key 1. */
    a.window = 0;
    ref_sdpa(&a);
    ck_assert_float_eq(w[0], 0.0f);
    ck_assert_float_eq(w[1], 1.0f);
    ck_assert_float_eq_tol(out[0], 3.0f, 1e-6f);
}
END_TEST

/* `extern` keeps this prototype out of the Makefile's suite-table scan, which matches lines
 * starting with `Suite *`. */
extern Suite *ref_suite(void);

Suite *ref_suite(void) {
    Suite *s = suite_create("ref");
    TCase *tc = tcase_create("ref");
    tcase_add_test(tc, test_ref_matches_numpy_tiny_f32);
    tcase_add_test(tc, test_ref_matches_numpy_alt_f16);
    tcase_add_test(tc, test_ref_llama3_inv_freq_regimes);
    tcase_add_test(tc, test_ref_sdpa_by_hand);
    suite_add_tcase(s, tc);
    return s;
}
