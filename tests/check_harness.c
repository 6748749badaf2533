/* tests/check_harness.c: shared helpers of the engine suites (see check_harness.h). Failures are
 * reported through Check's assertions, so a helper that finds a problem ends the test there with
 * a message naming the tensor and the element. */
#include "check_harness.h"

#include <check.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- comparisons --------------------------------------------------------------------------- */

void harness_expect_close_tol(const float *got, const float *want, size_t n, double atol,
                              double rtol, const char *what) {
    for (size_t i = 0; i < n; i++) {
        double tol = atol + rtol * fabs((double)want[i]);
        double diff = fabs((double)got[i] - (double)want[i]);
        /* Written so that a NaN in got fails (every comparison with NaN is false). */
        if (!(diff <= tol)) {
            ck_abort_msg("%s: element %zu: got %.9g, want %.9g (|diff| %.3g > tol %.3g)", what, i,
                         (double)got[i], (double)want[i], diff, tol);
        }
    }
}

void harness_expect_close(const float *got, const float *want, size_t n, const char *what) {
    harness_expect_close_tol(got, want, n, HARNESS_ATOL, HARNESS_RTOL, what);
}

void harness_expect_zero(const float *a, size_t n, const char *what) {
    for (size_t i = 0; i < n; i++) {
        if (!(a[i] == 0.0f)) {
            ck_abort_msg("%s: element %zu is %.9g, want exactly 0", what, i, (double)a[i]);
        }
    }
}

void harness_expect_rows(const float *got, const float *want, int32_t first, int32_t n,
                         int32_t hidden, const char *what) {
    size_t off = (size_t)first * hidden;
    harness_expect_close(got + off, want + off, (size_t)(n - first) * hidden, what);
}

void harness_expect_weight_rows(const float *got, const float *want, int32_t n_heads, int32_t first,
                                int32_t n, const char *what) {
    char label[256];
    for (int32_t h = 0; h < n_heads; h++) {
        for (int32_t i = first; i < n; i++) {
            size_t off = ((size_t)h * n + i) * n;
            snprintf(label, sizeof(label), "%s (head %d, query %d)", what, (int)h, (int)i);
            harness_expect_close(got + off, want + off, (size_t)n, label);
        }
    }
}

void harness_expect_kv(const attn_kv *kv, const attn_config *cfg, const float *k, const float *v,
                       int32_t n, const char *what) {
    size_t count = (size_t)cfg->n_kv_heads * n * ref_head_dim(cfg);
    float *gk = harness_calloc(count, sizeof(float));
    float *gv = harness_calloc(count, sizeof(float));
    char label[256];
    ck_assert_int_eq(attn_kv_len(kv), n);
    ck_assert_int_eq(attn_kv_read(kv, 0, n, gk, gv), ATTN_OK);
    snprintf(label, sizeof(label), "%s: post-RoPE K", what);
    harness_expect_close(gk, k, count, label);
    snprintf(label, sizeof(label), "%s: V", what);
    harness_expect_close(gv, v, count, label);
    free(gv);
    free(gk);
}

/* ---- configs and models -------------------------------------------------------------------- */

attn_rope_scaling harness_llama3_scaling(int32_t original_max_position) {
    attn_rope_scaling s;
    memset(&s, 0, sizeof s);
    s.type = ATTN_ROPE_SCALING_LLAMA3;
    s.factor = 8.0f;
    s.low_freq_factor = 1.0f;
    s.high_freq_factor = 4.0f;
    s.original_max_position = original_max_position;
    return s;
}

attn_config harness_config(int32_t n_heads, int32_t n_kv_heads, int32_t head_dim) {
    attn_config c;
    memset(&c, 0, sizeof(c));
    c.n_layers = 1;
    c.hidden_size = 64;
    c.n_heads = n_heads;
    c.n_kv_heads = n_kv_heads;
    c.head_dim = head_dim;
    c.rotary_dim = head_dim;
    c.rope_theta = 10000.0f;
    c.rope_style = ATTN_ROPE_STYLE_HALF;
    c.rope_scaling.type = ATTN_ROPE_SCALING_NONE;
    c.max_seq = 512;
    c.sliding_window = 0;
    c.has_qkv_bias = true;
    c.has_o_bias = true;
    c.softmax_scale = 0.0f;
    return c;
}

void harness_describe(const attn_config *cfg, char *buf, size_t size) {
    static const char *const scaling[] = {"none", "linear", "llama3"};
    int st = (int)cfg->rope_scaling.type;
    snprintf(buf, size,
             "hidden %d heads %d/%d head_dim %d rotary %d %s scaling %s theta %g window %d "
             "bias qkv %d o %d max_seq %d",
             (int)cfg->hidden_size, (int)cfg->n_heads, (int)cfg->n_kv_heads, (int)cfg->head_dim,
             (int)cfg->rotary_dim, cfg->rope_style == ATTN_ROPE_STYLE_HALF ? "half" : "interleaved",
             st >= 0 && st <= 2 ? scaling[st] : "?", (double)cfg->rope_theta,
             (int)cfg->sliding_window, (int)cfg->has_qkv_bias, (int)cfg->has_o_bias,
             (int)cfg->max_seq);
}

attn_layer_weights harness_weights(const attn_config *cfg, const ref_layer *w) {
    attn_layer_weights lw;
    memset(&lw, 0, sizeof(lw));
    lw.wq = w->wq;
    lw.wk = w->wk;
    lw.wv = w->wv;
    lw.wo = w->wo;
    if (cfg->has_qkv_bias) {
        lw.bq = w->bq;
        lw.bk = w->bk;
        lw.bv = w->bv;
    }
    if (cfg->has_o_bias) {
        lw.bo = w->bo;
    }
    if (cfg->has_sinks) {
        lw.sinks = w->sinks;
    }
    return lw;
}

void harness_model_init(harness_model *hm, const attn_config *cfg, uint64_t seed) {
    ref_rng rng;
    char desc[256];
    hm->cfg = *cfg;
    hm->layers = harness_calloc((size_t)cfg->n_layers, sizeof(ref_layer));
    attn_layer_weights *lw = harness_calloc((size_t)cfg->n_layers, sizeof(attn_layer_weights));
    ref_rng_init(&rng, seed);
    for (int32_t l = 0; l < cfg->n_layers; l++) {
        ref_layer_init_random(&hm->layers[l], cfg, &rng);
        lw[l] = harness_weights(cfg, &hm->layers[l]);
    }
    hm->model = NULL;
    int rc = attn_model_create(cfg, lw, NULL, &hm->model);
    harness_describe(cfg, desc, sizeof(desc));
    ck_assert_msg(rc == ATTN_OK, "attn_model_create(%s) = %d (%s)", desc, rc, attn_strerror(rc));
    ck_assert_ptr_nonnull(hm->model);
    free(lw);
}

void harness_model_release(harness_model *hm) {
    attn_model_destroy(hm->model);
    for (int32_t l = 0; l < hm->cfg.n_layers; l++) {
        ref_layer_release(&hm->layers[l]);
    }
    free(hm->layers);
    memset(hm, 0, sizeof(*hm));
}

void *harness_calloc(size_t n, size_t size) {
    void *p = calloc(n == 0 ? 1 : n, size);
    ck_assert_msg(p != NULL, "out of memory (%zu x %zu bytes)", n, size);
    return p;
}

float *harness_random_x(uint64_t seed, int32_t n_tokens, int32_t hidden) {
    ref_rng rng;
    size_t n = (size_t)n_tokens * hidden;
    float *x = harness_calloc(n, sizeof(float));
    ref_rng_init(&rng, seed ^ 0x5851F42D4C957F2Dull);
    ref_fill_uniform(&rng, x, n, -1.0f, 1.0f);
    return x;
}

/* ---- running sequences --------------------------------------------------------------------- */

int harness_run_chunks(const harness_run *r) {
    const attn_config *cfg = attn_model_config(r->model);
    const int32_t hidden = cfg->hidden_size;
    const int32_t n = r->n_tokens;
    int32_t p = r->first;
    float *w = NULL;
    int rc = ATTN_OK;

    if (r->weights != NULL) {
        w = harness_calloc((size_t)cfg->n_heads * n * n, sizeof(float));
    }
    for (int32_t c = 0; c < r->n_chunks && rc == ATTN_OK; c++) {
        int32_t t = r->chunks[c];
        attn_step step;
        memset(&step, 0, sizeof(step));
        step.kv = r->kv;
        step.x = r->x + (size_t)p * hidden;
        step.n_tokens = t;
        step.positions = r->positions != NULL ? r->positions + p : NULL;
        step.key_valid = r->key_valid;
        step.out = r->out + (size_t)p * hidden;
        step.weights = w;
        /* NaN everywhere the call must write, so that an entry it skips cannot pass. */
        for (size_t i = 0; i < (size_t)t * hidden; i++) {
            step.out[i] = NAN;
        }
        if (w != NULL) {
            for (size_t i = 0; i < (size_t)cfg->n_heads * t * (p + t); i++) {
                w[i] = NAN;
            }
        }
        ck_assert_int_eq(attn_kv_len(r->kv), p);
        rc = attn_forward(r->model, r->layer, r->ws, &step, 1);
        if (rc != ATTN_OK) {
            break;
        }
        ck_assert_int_eq(attn_kv_len(r->kv), p + t);
        if (w != NULL) {
            /* (n_heads, t, p + t) into rows p.. of (n_heads, n, n). */
            for (int32_t h = 0; h < cfg->n_heads; h++) {
                for (int32_t i = 0; i < t; i++) {
                    memcpy(r->weights + ((size_t)h * n + p + i) * n,
                           w + ((size_t)h * t + i) * (p + t), (size_t)(p + t) * sizeof(float));
                }
            }
        }
        p += t;
    }
    if (rc == ATTN_OK) {
        ck_assert_msg(p == n, "chunks sum to %d, sequence has %d tokens", (int)p, (int)n);
    }
    free(w);
    return rc;
}

static void ref_run(const harness_model *hm, int32_t layer, const float *x,
                    const int32_t *positions, const uint8_t *key_valid, int32_t n_tokens,
                    attn_dtype kv_dtype, float *out, float *weights, float *k, float *v) {
    ref_forward_args a;
    memset(&a, 0, sizeof(a));
    a.n_tokens = n_tokens;
    a.x = x;
    a.positions = positions;
    a.key_valid = key_valid;
    a.out = out;
    a.weights = weights;
    a.k = k;
    a.v = v;
    a.kv_dtype = kv_dtype;
    ref_layer_forward(&hm->cfg, &hm->layers[layer], &a);
}

void harness_ref_run(const harness_model *hm, int32_t layer, const float *x,
                     const int32_t *positions, const uint8_t *key_valid, int32_t n_tokens,
                     float *out, float *weights, float *k, float *v) {
    ref_run(hm, layer, x, positions, key_valid, n_tokens, ATTN_DTYPE_AUTO, out, weights, k, v);
}

void harness_ref_run_kv(const harness_model *hm, int32_t layer, const float *x, int32_t n_tokens,
                        attn_dtype kv_dtype, float *out, float *weights, float *k, float *v) {
    ref_run(hm, layer, x, NULL, NULL, n_tokens, kv_dtype, out, weights, k, v);
}

/* ---- executors ----------------------------------------------------------------------------- */

static void serial_run(void *ctx, attn_task_fn task, void *arg, int32_t n) {
    harness_serial *s = ctx;
    s->n_runs++;
    for (int32_t i = 0; i < n; i++) {
        task(arg, i);
        s->n_tasks++;
    }
}

attn_executor harness_serial_executor(harness_serial *state) {
    attn_executor ex = {serial_run, state};
    memset(state, 0, sizeof(*state));
    return ex;
}

typedef struct odd_tasks {
    attn_task_fn task;
    void *arg;
    int32_t n;
    int32_t ran;
} odd_tasks;

static void *run_odd(void *p) {
    odd_tasks *o = p;
    for (int32_t i = 1; i < o->n; i += 2) {
        o->task(o->arg, i);
        o->ran++;
    }
    return NULL;
}

static void thread_run(void *ctx, attn_task_fn task, void *arg, int32_t n) {
    harness_threads *s = ctx;
    odd_tasks odd = {task, arg, n, 0};
    pthread_t thread;
    s->n_runs++;
    int rc = pthread_create(&thread, NULL, run_odd, &odd);
    ck_assert_msg(rc == 0, "pthread_create: %d", rc);
    for (int32_t i = 0; i < n; i += 2) {
        task(arg, i);
    }
    pthread_join(thread, NULL);
    s->n_tasks_other += odd.ran;
}

attn_executor harness_thread_executor(harness_threads *state) {
    attn_executor ex = {thread_run, state};
    memset(state, 0, sizeof(*state));
    return ex;
}

/* ---- fixture files ------------------------------------------------------------------------- */

void *harness_read_file(const char *path, size_t size) {
    FILE *f = fopen(path, "rb");
    ck_assert_msg(f != NULL, "cannot open %s (tests run from the repo root)", path);
    void *buf = harness_calloc(size + 1, 1);
    size_t got = fread(buf, 1, size + 1, f);
    fclose(f);
    ck_assert_msg(got == size, "%s: %zu bytes, want %zu", path, got, size);
    return buf;
}
