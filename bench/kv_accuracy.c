/* bench/kv_accuracy.c: how far each KV cache dtype moves attention from the exact answer, for the
 * README's precision table. A program, not a test (tests/check_kv_dtype.c holds the engine to
 * ref.c rounding K/V the same way): here every dtype is measured against the fp64 answer over
 * exact K/V, on the family fixtures (their numpy references, weights as shipped) and on long
 * contexts (tests/ref.c, a random llama-shaped layer). Errors of outputs are relative to the
 * largest output magnitude (max) and as a whole (rms: sqrt(sum d^2 / sum want^2)); errors of
 * weights are absolute (they are probabilities). Run: make accuracy. */
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../engine/attn.h"
#include "../tests/ref.h"

static const attn_dtype kv_dtypes[] = {ATTN_DTYPE_F32, ATTN_DTYPE_BF16, ATTN_DTYPE_F16,
                                       ATTN_DTYPE_Q8_0};
#define N_DTYPES 4

struct fixture {
    const char *dir, *input, *expected;
    int32_t n_layers, hidden, n_heads, prefill, decode; /* layers 0 .. n_layers - 1 */
};

/* A family of each kind: GQA with q/k norms, soft-cap and a window, sinks, F16, MQA groups, MLA. */
static const struct fixture fixtures[] = {
    {"tests/data/hf_qwen3_bf16", "qwen3", "qwen3_bf16", 2, 64, 4, 8, 3},
    {"tests/data/hf_gemma2_f32", "gemma2", "gemma2_f32", 3, 64, 4, 11, 3},
    {"tests/data/hf_gpt_oss_bf16", "gptoss", "gpt_oss_bf16", 3, 64, 4, 8, 3},
    {"tests/data/hf_qwen2_f16", "alt", "qwen2_f16", 1, 32, 4, 9, 3},
    {"tests/data/hf_falcon_new_f32", "falcon_new", "falcon_new_f32", 2, 64, 8, 7, 3},
    {"tests/data/hf_stablelm_bf16", "stablelm", "stablelm_bf16", 2, 64, 4, 7, 3},
    {"tests/data/hf_deepseek_v3_bf16", "dsv3", "dsv3_bf16", 2, 64, 4, 8, 3},
};

struct errors {
    double out_max, out_rms, w_max;
};

static void *read_all(const char *path, size_t bytes) {
    FILE *f = fopen(path, "rb");
    void *p = malloc(bytes);
    if (f == NULL || p == NULL || fread(p, 1, bytes, f) != bytes) {
        fprintf(stderr, "kv_accuracy: cannot read %zu bytes of %s (run from the repository)\n",
                bytes, path);
        exit(1);
    }
    fclose(f);
    return p;
}

static void *xcalloc(size_t n, size_t size) {
    void *p = calloc(n, size);
    if (p == NULL) {
        fprintf(stderr, "kv_accuracy: out of memory\n");
        exit(1);
    }
    return p;
}

static void out_errors(const float *got, const float *want, size_t n, struct errors *e) {
    double scale = 0, d2 = 0, w2 = 0, worst = 0;
    for (size_t i = 0; i < n; i++) {
        double d = fabs((double)got[i] - want[i]);
        scale = fabs(want[i]) > scale ? fabs(want[i]) : scale;
        worst = d > worst ? d : worst;
        d2 += d * d;
        w2 += (double)want[i] * want[i];
    }
    e->out_max = worst / scale;
    e->out_rms = sqrt(d2 / w2);
}

static double max_abs_diff(const float *a, const float *b, size_t n) {
    double m = 0;
    for (size_t i = 0; i < n; i++) {
        double d = fabs((double)a[i] - b[i]);
        m = d > m ? d : m;
    }
    return m;
}

/* Runs n tokens of x through one layer of m in calls of chunks[] tokens, into out (n x hidden),
 * and weights (n_heads x n x n, each call's rows placed) when not NULL. */
static int run(const attn_model *m, int32_t layer, attn_dtype dt, const float *x,
               const int32_t *pos, int32_t n, const int32_t *chunks, int32_t n_chunks, float *out,
               float *weights) {
    const attn_config *c = attn_model_config(m);
    attn_kv_pool *pool = NULL;
    attn_workspace *ws = NULL;
    attn_kv *kv = NULL;
    size_t budget = (size_t)attn_kv_block_bytes_for(m, 16, dt) * (size_t)(n / 16 + 2);
    int rc = attn_kv_pool_create_typed(m, budget, 16, dt, &pool);
    if (rc == ATTN_OK) {
        rc = attn_workspace_create(m, 256, NULL, &ws);
    }
    if (rc == ATTN_OK) {
        rc = attn_kv_create_for_layer(pool, layer, &kv);
    }
    float *w = weights != NULL ? xcalloc((size_t)c->n_heads * n * n, sizeof(float)) : NULL;
    for (int32_t k = 0, first = 0; k < n_chunks && rc == ATTN_OK; first += chunks[k++]) {
        int32_t t = chunks[k];
        attn_step st = {.kv = kv,
                        .x = x + (size_t)first * c->hidden_size,
                        .n_tokens = t,
                        .positions = pos != NULL ? pos + first : NULL,
                        .out = out + (size_t)first * c->hidden_size,
                        .weights = w};
        rc = attn_forward(m, layer, ws, &st, 1);
        for (int32_t h = 0; w != NULL && h < c->n_heads; h++) {
            for (int32_t i = 0; i < t; i++) {
                memcpy(weights + ((size_t)h * n + first + i) * n,
                       w + ((size_t)h * t + i) * (first + t), (size_t)(first + t) * sizeof(float));
            }
        }
    }
    free(w);
    attn_kv_destroy(kv);
    attn_workspace_destroy(ws);
    attn_kv_pool_destroy(pool);
    return rc;
}

static void print_row(const char *what, attn_dtype dt, const struct errors *e) {
    printf("%-34s %-5s %10.2e %10.2e", what, attn_dtype_name(dt), e->out_max, e->out_rms);
    if (e->w_max >= 0) {
        printf(" %10.2e\n", e->w_max);
    } else {
        printf(" %10s\n", "-");
    }
}

/* One layer of a fixture in every KV dtype against its fp64 expectation; the worst kept. */
static void fixture_layer(const attn_model *m, const struct fixture *fx, int32_t layer,
                          const float *x, const int32_t *pos, struct errors worst[N_DTYPES]) {
    int32_t n = fx->prefill + fx->decode;
    size_t n_out = (size_t)n * fx->hidden, n_w = (size_t)fx->n_heads * n * n;
    char path[256], what[64];
    snprintf(what, sizeof what, "%s l%d", fx->dir + strlen("tests/data/"), (int)layer);
    snprintf(path, sizeof path, "tests/data/expected/%s_l%d_out.bin", fx->expected, (int)layer);
    float *want = read_all(path, n_out * sizeof(float));
    snprintf(path, sizeof path, "tests/data/expected/%s_l%d_weights.bin", fx->expected, (int)layer);
    float *want_w = read_all(path, n_w * sizeof(float));
    int32_t chunks[8] = {fx->prefill, 1, 1, 1, 1, 1, 1, 1};
    float *out = xcalloc(n_out, sizeof(float)), *w = xcalloc(n_w, sizeof(float));
    for (int d = 0; d < N_DTYPES; d++) {
        if (run(m, layer, kv_dtypes[d], x, pos, n, chunks, 1 + fx->decode, out, w) != ATTN_OK) {
            printf("%-34s %-5s refused by the pool (e.g. q8_0 on a latent of %s)\n", what,
                   attn_dtype_name(kv_dtypes[d]), "kv_lora_rank % 32 != 0");
            continue;
        }
        struct errors e;
        out_errors(out, want, n_out, &e);
        e.w_max = max_abs_diff(w, want_w, n_w);
        print_row(what, kv_dtypes[d], &e);
        worst[d].out_max = e.out_max > worst[d].out_max ? e.out_max : worst[d].out_max;
        worst[d].out_rms = e.out_rms > worst[d].out_rms ? e.out_rms : worst[d].out_rms;
        worst[d].w_max = e.w_max > worst[d].w_max ? e.w_max : worst[d].w_max;
    }
    free(w);
    free(out);
    free(want_w);
    free(want);
}

static void fixtures_table(struct errors worst[N_DTYPES]) {
    for (size_t f = 0; f < sizeof fixtures / sizeof fixtures[0]; f++) {
        const struct fixture *fx = &fixtures[f];
        attn_model *m = NULL;
        char err[256] = "", path[256];
        if (attn_model_load_hf(fx->dir, NULL, &m, err, sizeof err) != ATTN_OK) {
            fprintf(stderr, "kv_accuracy: %s: %s\n", fx->dir, err);
            exit(1);
        }
        int32_t n = fx->prefill + fx->decode;
        size_t n_out = (size_t)n * fx->hidden;
        snprintf(path, sizeof path, "tests/data/expected/%s_x.bin", fx->input);
        float *x = read_all(path, n_out * sizeof(float));
        snprintf(path, sizeof path, "tests/data/expected/%s_pos.bin", fx->input);
        int32_t *pos = read_all(path, (size_t)n * sizeof(int32_t));
        for (int32_t layer = 0; layer < fx->n_layers; layer++) {
            fixture_layer(m, fx, layer, x, pos, worst);
        }
        free(pos);
        free(x);
        attn_model_destroy(m);
    }
}

/* A llama-shaped random layer (the small preset: hidden 512, 8 heads over 2 KV heads of 64): n
 * tokens prefilled in chunks of 256, the last 8 as decodes, against ref.c in fp64 over exact K/V;
 * weights too when with_weights (n_heads x n x n floats). */
/* gain multiplies wq and wk, so the scores by gain^2: the random layer's scores have a standard
 * deviation of about 0.11 (x and weights uniform), nearly flat attention, where rounding K moves
 * the weights least; trained models' scores spread over several units. */
static void long_context(int32_t n, bool with_weights, float gain) {
    attn_config c;
    attn_config_preset("small", &c);
    c.n_layers = 1;
    c.max_seq = n;
    if (attn_config_check(&c) != ATTN_OK) {
        fprintf(stderr, "kv_accuracy: bad config\n");
        exit(1);
    }
    ref_rng rng;
    ref_rng_init(&rng, 4242);
    ref_layer rl;
    ref_layer_init_random(&rl, &c, &rng);
    size_t q_n = (size_t)c.n_heads * c.head_dim * c.hidden_size;
    size_t k_n = (size_t)c.n_kv_heads * c.head_dim * c.hidden_size;
    for (size_t i = 0; i < q_n; i++) {
        rl.wq[i] *= gain;
    }
    for (size_t i = 0; i < k_n; i++) {
        rl.wk[i] *= gain;
    }
    attn_layer_weights lw = {.wq = rl.wq, .wk = rl.wk, .wv = rl.wv, .wo = rl.wo};
    attn_model *m = NULL;
    if (attn_model_create(&c, &lw, NULL, &m) != ATTN_OK) {
        fprintf(stderr, "kv_accuracy: model\n");
        exit(1);
    }
    size_t n_out = (size_t)n * c.hidden_size, n_w = (size_t)c.n_heads * n * n;
    float *x = xcalloc(n_out, sizeof(float)), *want = xcalloc(n_out, sizeof(float));
    ref_fill_uniform(&rng, x, n_out, -1.0f, 1.0f);
    float *want_w = with_weights ? xcalloc(n_w, sizeof(float)) : NULL;
    ref_forward_args a = {
        .n_tokens = n, .x = x, .out = want, .weights = want_w, .kv_dtype = ATTN_DTYPE_AUTO};
    ref_layer_forward(&c, &rl, &a);
    int32_t chunks[64], n_chunks = 0;
    for (int32_t left = n - 8; left > 0; left -= 256) {
        chunks[n_chunks++] = left < 256 ? left : 256;
    }
    for (int i = 0; i < 8; i++) {
        chunks[n_chunks++] = 1;
    }
    float *out = xcalloc(n_out, sizeof(float));
    float *w = with_weights ? xcalloc(n_w, sizeof(float)) : NULL;
    char what[64];
    if (gain == 1.0f) {
        snprintf(what, sizeof what, "random llama-shaped, L=%d", (int)n);
    } else {
        snprintf(what, sizeof what, "same, scores x%g, L=%d", (double)(gain * gain), (int)n);
    }
    for (int d = 0; d < N_DTYPES; d++) {
        if (run(m, 0, kv_dtypes[d], x, NULL, n, chunks, n_chunks, out, w) != ATTN_OK) {
            fprintf(stderr, "kv_accuracy: forward failed\n");
            exit(1);
        }
        struct errors e;
        out_errors(out, want, n_out, &e);
        e.w_max = with_weights ? max_abs_diff(w, want_w, n_w) : -1.0;
        print_row(what, kv_dtypes[d], &e);
    }
    free(w);
    free(out);
    free(want_w);
    free(want);
    free(x);
    attn_model_destroy(m);
    ref_layer_release(&rl);
}

int main(void) {
    printf("attention with each KV dtype against the exact answer (fp64 over exact K/V)\n"
           "out max: max |got - want| / max |want|; out rms: sqrt(sum d^2 / sum want^2); "
           "weights: max |got - want|\n\n");
    printf("%-34s %-5s %10s %10s %10s\n", "case", "KV", "out max", "out rms", "weights");
    struct errors worst[N_DTYPES] = {{0, 0, 0}};
    fixtures_table(worst);
    for (int d = 0; d < N_DTYPES; d++) {
        print_row("fixtures, worst", kv_dtypes[d], &worst[d]);
    }
    long_context(1024, true, 1.0f);
    long_context(4096, false, 1.0f);
    long_context(1024, true, 3.0f); /* score sd ~1 */
    long_context(1024, true, 9.0f); /* score sd ~9 */
    return 0;
}
