/* tests/check_kinds.c: the seeds' other attention kinds through a real daemon, against tests/ref.c:
 * POST /v1/sdpa with a batch dimension and boolean masks (seeds 000, 001: 1 attends, 0 masks;
 * (B, Tq, Tk), (B, 1, Tk) key padding, (Tq, Tk), any dimension of 1 broadcast), and the refusals
 * of masks and batches that do not fit. */
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "check_harness.h"
#include "http_client.h"
#include "ref.h"

static struct http_client_daemon daemon_;

static void start_tiny(void) {
    const char *args[] = {"--preset", "tiny", "--workers", "1", NULL};
    http_client_daemon_start(&daemon_, args);
}

static void stop(void) {
    ck_assert_int_eq(http_client_daemon_stop(&daemon_, 20000), 0);
}

static void teardown(void) {
    http_client_daemon_kill(&daemon_);
}

/* POSTs body to path; the answer must have `status`. Returns the parsed body. */
static cJSON *post(const char *path, const char *body, long status) {
    char url[512];
    snprintf(url, sizeof url, "%s%s", daemon_.base, path);
    struct http_client_response r;
    http_client_request("POST", url, body, strlen(body), NULL, &r);
    ck_assert_msg(r.status == status, "POST %s: %ld, want %ld: %.600s", path, r.status, status,
                  r.body);
    cJSON *j = http_client_json(&r);
    http_client_response_release(&r);
    return j;
}

/* A 400 whose error names `param` and whose message holds `says`. */
static void post_refused(const char *body, const char *param, const char *says) {
    cJSON *j = post("/v1/sdpa", body, 400);
    const cJSON *e = cJSON_GetObjectItemCaseSensitive(j, "error");
    const char *p = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(e, "param"));
    const char *m = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(e, "message"));
    ck_assert_msg(p != NULL && strcmp(p, param) == 0 && m != NULL && strstr(m, says) != NULL,
                  "want param %s saying '%s': %s / %s", param, says, p ? p : "(none)",
                  m ? m : "(none)");
    cJSON_Delete(j);
}

/* A POST /v1/attend answered 400 naming param. */
static void post_refused_attend(const char *body, const char *param) {
    cJSON *j = post("/v1/attend", body, 400);
    const cJSON *e = cJSON_GetObjectItemCaseSensitive(j, "error");
    ck_assert_str_eq(cJSON_GetObjectItemCaseSensitive(e, "param")->valuestring, param);
    cJSON_Delete(j);
}

/* Nested arrays of x with the given shape. */
static cJSON *tensor_json(const float *x, const int64_t *dims, int rank) {
    if (rank == 1) {
        cJSON *a = cJSON_CreateArray();
        for (int64_t i = 0; i < dims[0]; i++) {
            cJSON_AddItemToArray(a, cJSON_CreateNumber((double)x[i]));
        }
        return a;
    }
    int64_t inner = 1;
    for (int d = 1; d < rank; d++) {
        inner *= dims[d];
    }
    cJSON *a = cJSON_CreateArray();
    for (int64_t i = 0; i < dims[0]; i++) {
        cJSON_AddItemToArray(a, tensor_json(x + i * inner, dims + 1, rank - 1));
    }
    return a;
}

static float *random_floats(ref_rng *rng, size_t n) {
    float *x = harness_calloc(n, sizeof(float));
    ref_fill_uniform(rng, x, n, -1.0f, 1.0f);
    return x;
}

/* One batched SDPA problem and the masks tried on it. */
enum { B = 2, H = 4, HKV = 2, TQ = 3, TK = 5, DK = 8, DV = 6 };

struct masked_case {
    const char *what;
    int rank; /* 0: no mask */
    int64_t dims[3];
    bool is_causal;
};

/* Runs one case over HTTP and against ref_sdpa per batch, mask included. */
static void check_masked(const struct masked_case *c, const float *q, const float *k,
                         const float *v, ref_rng *rng) {
    int64_t mn = 1;
    for (int d = 0; d < c->rank; d++) {
        mn *= c->dims[d];
    }
    float *mask = harness_calloc((size_t)mn, sizeof(float));
    uint8_t *mask8 = harness_calloc((size_t)mn, 1);
    for (int64_t i = 0; i < mn; i++) {
        mask8[i] = ref_rng_uniform(rng, 0.0f, 1.0f) < 0.7f;
        mask[i] = mask8[i];
    }
    if (c->rank >= 2 && c->dims[c->rank - 2] == TQ) {
        /* the last batch's query 2 sees nothing: zeros, not NaN */
        int64_t last = c->rank == 3 ? (c->dims[0] - 1) * TQ * TK : 0;
        for (int j = 0; j < TK; j++) {
            mask8[last + 2 * TK + j] = 0;
            mask[last + 2 * TK + j] = 0.0f;
        }
    }
    cJSON *body = cJSON_CreateObject();
    int64_t qd[4] = {B, H, TQ, DK}, kd[4] = {B, HKV, TK, DK}, vd[4] = {B, HKV, TK, DV};
    cJSON_AddItemToObject(body, "q", tensor_json(q, qd, 4));
    cJSON_AddItemToObject(body, "k", tensor_json(k, kd, 4));
    cJSON_AddItemToObject(body, "v", tensor_json(v, vd, 4));
    if (c->rank > 0) {
        cJSON_AddItemToObject(body, "mask", tensor_json(mask, c->dims, c->rank));
    }
    cJSON_AddBoolToObject(body, "causal", c->is_causal);
    cJSON_AddBoolToObject(body, "return_weights", true);
    char *text = cJSON_PrintUnformatted(body);
    cJSON *j = post("/v1/sdpa", text, 200);
    size_t n_out = 0, n_w = 0;
    float *out = http_client_json_floats(cJSON_GetObjectItemCaseSensitive(j, "output"), &n_out);
    float *w = http_client_json_floats(cJSON_GetObjectItemCaseSensitive(j, "weights"), &n_w);
    ck_assert_uint_eq(n_out, (size_t)B * H * TQ * DV);
    ck_assert_uint_eq(n_w, (size_t)B * H * TQ * TK);
    ck_assert_int_eq(cJSON_GetArraySize(cJSON_GetObjectItemCaseSensitive(j, "output")), B);

    float *want = harness_calloc(n_out, sizeof(float));
    float *want_w = harness_calloc(n_w, sizeof(float));
    for (int b = 0; b < B; b++) {
        const uint8_t *mb = NULL;
        size_t ld = 0;
        if (c->rank > 0) {
            int64_t tq = c->dims[c->rank - 2], bs = c->rank == 3 ? c->dims[0] : 1;
            mb = mask8 + (bs == 1 ? 0 : (size_t)b * tq * TK);
            ld = tq == 1 ? 0 : TK;
        }
        ref_sdpa_args a = {.n_heads = H,
                           .n_kv_heads = HKV,
                           .n_q = TQ,
                           .n_k = TK,
                           .d_k = DK,
                           .d_v = DV,
                           .q = q + (size_t)b * H * TQ * DK,
                           .k = k + (size_t)b * HKV * TK * DK,
                           .v = v + (size_t)b * HKV * TK * DV,
                           .is_causal = c->is_causal,
                           .window = -1,
                           .out = want + (size_t)b * H * TQ * DV,
                           .weights = want_w + (size_t)b * H * TQ * TK,
                           .mask = mb,
                           .mask_ld = ld};
        ref_sdpa(&a);
    }
    char what[128];
    snprintf(what, sizeof what, "%s: output", c->what);
    harness_expect_close(out, want, n_out, what);
    snprintf(what, sizeof what, "%s: weights", c->what);
    harness_expect_close(w, want_w, n_w, what);
    /* A masked pair's weight is exactly 0 (seed 001: mask (0, 1) gives weights[0, :, 0, 1] = 0). */
    for (int b = 0; b < B && c->rank > 0; b++) {
        for (int h = 0; h < H; h++) {
            for (int i = 0; i < TQ; i++) {
                for (int jj = 0; jj < TK; jj++) {
                    size_t at = (((size_t)b * H + h) * TQ + i) * TK + jj;
                    if (want_w[at] == 0.0f) {
                        ck_assert_msg(w[at] == 0.0f, "%s: masked weight %zu is %g", c->what, at,
                                      (double)w[at]);
                    }
                }
            }
        }
    }
    free(want_w);
    free(want);
    free(w);
    free(out);
    cJSON_Delete(j);
    free(text);
    cJSON_Delete(body);
    free(mask8);
    free(mask);
}

START_TEST(test_kinds_sdpa_batches_and_masks_match_ref) {
    start_tiny();
    ref_rng rng;
    ref_rng_init(&rng, 9100);
    float *q = random_floats(&rng, (size_t)B * H * TQ * DK);
    float *k = random_floats(&rng, (size_t)B * HKV * TK * DK);
    float *v = random_floats(&rng, (size_t)B * HKV * TK * DV);
    static const struct masked_case cases[] = {
        {"no mask", 0, {0, 0, 0}, false},
        {"(B, Tq, Tk)", 3, {B, TQ, TK}, false},
        {"(B, 1, Tk) key padding", 3, {B, 1, TK}, false},
        {"(Tq, Tk)", 2, {TQ, TK}, false},
        {"(1, Tq, Tk)", 3, {1, TQ, TK}, false},
        {"(1, Tk)", 2, {1, TK}, false},
        {"(B, Tq, Tk) and causal", 3, {B, TQ, TK}, true},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        check_masked(&cases[i], q, k, v, &rng);
    }
    free(v);
    free(k);
    free(q);
    stop();
}
END_TEST

/* Unbatched tensors stay unbatched, with a (Tq, Tk) mask; masks and batches that do not fit,
 * and mask values other than 0 and 1, are a 400 naming the field. */
START_TEST(test_kinds_sdpa_mask_and_batch_refusals) {
    start_tiny();
    const char *q3 = "[[[1,0],[0,1]]]", *k3 = "[[[1,0],[0,1],[1,1]]]";
    const char *q4 = "[[[[1,0],[0,1]]],[[[1,0],[0,1]]]]", *k4 = "[[[[1,0],[0,1],[1,1]]],"
                                                                "[[[1,0],[0,1],[1,1]]]]";
    char body[1024];
    snprintf(body, sizeof body,
             "{\"q\":%s,\"k\":%s,\"v\":%s,\"mask\":[[1,0,1],[0,0,0]],\"return_weights\":true}", q3,
             k3, k3);
    cJSON *j = post("/v1/sdpa", body, 200);
    size_t n = 0;
    float *w = http_client_json_floats(cJSON_GetObjectItemCaseSensitive(j, "weights"), &n);
    ck_assert_uint_eq(n, 6);
    ck_assert(w[1] == 0.0f && w[0] > 0.0f && w[2] > 0.0f);
    ck_assert(w[3] == 0.0f && w[4] == 0.0f && w[5] == 0.0f); /* nothing visible: zeros */
    const cJSON *o = cJSON_GetObjectItemCaseSensitive(j, "output");
    ck_assert_int_eq(cJSON_GetArraySize(o), 1); /* (H, Tq, dv): no batch dimension */
    free(w);
    cJSON_Delete(j);

    static const struct {
        const char *q, *k, *mask, *param, *says;
    } bad[] = {
        {"q3", "k3", "[[1,2,1],[1,1,1]]", "mask", "1 attends, 0 masks"},
        {"q3", "k3", "[[1,1],[1,1]]", "mask", "expected Tk = 3"},
        {"q3", "k3", "[[1,1,1],[1,1,1],[1,1,1]]", "mask", "expected Tq = 2 or 1"},
        {"q3", "k3", "[[[1,1,1]],[[1,1,1]]]", "mask", "expected 1 (the batch)"},
        {"q4", "k4", "[[[1,1,1]],[[1,1,1]],[[1,1,1]]]", "mask", "expected the batch 2 or 1"},
        {"q4", "k4", "[1,1,1]", "mask", "rank 2 to 3"},
        {"q4", "k3", NULL, "k", "all batched (B, H, T, D) or none is"},
        {"q4", "k4x", NULL, "k", "batch 1, expected q's 2"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        const char *q = strcmp(bad[i].q, "q4") == 0 ? q4 : q3;
        const char *k = strcmp(bad[i].k, "k4") == 0    ? k4
                        : strcmp(bad[i].k, "k4x") == 0 ? "[[[[1,0],[0,1],[1,1]]]]"
                                                       : k3;
        int len = snprintf(body, sizeof body, "{\"q\":%s,\"k\":%s,\"v\":%s", q, k, k);
        if (bad[i].mask != NULL) {
            len += snprintf(body + len, sizeof body - (size_t)len, ",\"mask\":%s", bad[i].mask);
        }
        snprintf(body + len, sizeof body - (size_t)len, "}");
        post_refused(body, bad[i].param, bad[i].says);
    }
    stop();
}
END_TEST

/* POSTs q, k, v (each (B, H, T, D), given as dims) with `extra` fields; returns the output. */
static float *sdpa_output(const float *q, const int64_t *qd, const float *k, const int64_t *kd,
                          const float *v, const int64_t *vd, const char *extra, size_t *n) {
    cJSON *body = cJSON_CreateObject();
    cJSON_AddItemToObject(body, "q", tensor_json(q, qd, 4));
    cJSON_AddItemToObject(body, "k", tensor_json(k, kd, 4));
    cJSON_AddItemToObject(body, "v", tensor_json(v, vd, 4));
    char *text = cJSON_PrintUnformatted(body);
    size_t len = strlen(text);
    char *spliced = harness_calloc(len + strlen(extra) + 2, 1);
    memcpy(spliced, text, len - 1); /* without the closing brace */
    strcat(spliced, extra);
    strcat(spliced, "}");
    cJSON *j = post("/v1/sdpa", spliced, 200);
    float *out = http_client_json_floats(cJSON_GetObjectItemCaseSensitive(j, "output"), n);
    cJSON_Delete(j);
    free(spliced);
    free(text);
    cJSON_Delete(body);
    return out;
}

/* The seeds' own checks, over HTTP: seed 004 3.2 (causal: position 0 sees only itself, so its
 * output is V[0]), 3.6 (window 0: the output is V), 3.5 (GQA, 8 query heads over 2 KV heads,
 * batch 2, 6 tokens, d_model 32) and 3.4 (cross-attention, 6 queries over 10 keys, batch 2),
 * each also against tests/ref.c. */
START_TEST(test_kinds_seed_cases) {
    start_tiny();
    ref_rng rng;
    ref_rng_init(&rng, 9200);
    size_t n = 0;
    /* 3.2: Q = K = V = randn(1, 4, 8), causal */
    float *x = random_floats(&rng, 4 * 8);
    int64_t d1[4] = {1, 1, 4, 8};
    float *out = sdpa_output(x, d1, x, d1, x, d1, ",\"causal\":true", &n);
    ck_assert_uint_eq(n, 32);
    harness_expect_close_tol(out, x, 8, 1e-5, 0, "seed 3.2: out[:, 0] == V[:, 0]");
    free(out);
    free(x);
    /* 3.6: Q = K = V = randn(1, 8, 16), window 0 */
    x = random_floats(&rng, 8 * 16);
    int64_t d2[4] = {1, 1, 8, 16};
    out = sdpa_output(x, d2, x, d2, x, d2, ",\"window\":0", &n);
    ck_assert_uint_eq(n, 8 * 16);
    harness_expect_close_tol(out, x, n, 1e-5, 0, "seed 3.6: window 0 gives V");
    free(out);
    free(x);
    /* 3.5 GQA (B 2, 8 heads over 2, S 6, head dim 32 / 8 = 4) and 3.4 cross-attention (B 2, S_q
     * 6 over S_kv 10, 8 heads of 8: d_model 64) */
    static const int64_t shapes[2][3][4] = {{{2, 8, 6, 4}, {2, 2, 6, 4}, {2, 2, 6, 4}},
                                            {{2, 8, 6, 8}, {2, 8, 10, 8}, {2, 8, 10, 8}}};
    for (int c = 0; c < 2; c++) {
        const int64_t *qd = shapes[c][0], *kd = shapes[c][1], *vd = shapes[c][2];
        size_t nq = (size_t)(qd[0] * qd[1] * qd[2] * qd[3]);
        size_t nk = (size_t)(kd[0] * kd[1] * kd[2] * kd[3]);
        float *q = random_floats(&rng, nq), *k = random_floats(&rng, nk);
        float *v = random_floats(&rng, nk);
        out = sdpa_output(q, qd, k, kd, v, vd, c == 0 ? ",\"causal\":true" : "", &n);
        ck_assert_uint_eq(n, nq); /* (B, H, S_q, D): the seeds' (2, 6, 32) and (2, 6, 64) */
        float *want = harness_calloc(nq, sizeof(float));
        size_t per_q = nq / 2, per_k = nk / 2;
        for (int b = 0; b < 2; b++) {
            ref_sdpa_args a = {.n_heads = (int32_t)qd[1],
                               .n_kv_heads = (int32_t)kd[1],
                               .n_q = (int32_t)qd[2],
                               .n_k = (int32_t)kd[2],
                               .d_k = (int32_t)qd[3],
                               .d_v = (int32_t)vd[3],
                               .q = q + b * per_q,
                               .k = k + b * per_k,
                               .v = v + b * per_k,
                               .is_causal = c == 0,
                               .window = -1,
                               .out = want + b * per_q};
            ref_sdpa(&a);
        }
        harness_expect_close(out, want, nq, c == 0 ? "seed 3.5 GQA" : "seed 3.4 cross");
        free(want);
        free(out);
        free(v);
        free(k);
        free(q);
    }
    stop();
}
END_TEST

/* "kind": "linear" (seed 004 3.7) over HTTP against ref's quadratic form, batched, with head
 * sharing, causal and not; what it does not have is a 400 naming the field. */
START_TEST(test_kinds_sdpa_linear) {
    start_tiny();
    ref_rng rng;
    ref_rng_init(&rng, 9300);
    int64_t qd[4] = {2, 8, 5, 16}, kd[4] = {2, 2, 9, 16}, vd[4] = {2, 2, 9, 12};
    size_t nq = 2 * 8 * 5 * 16, nk = 2 * 2 * 9 * 16, nv = 2 * 2 * 9 * 12, no = 2 * 8 * 5 * 12;
    float *q = random_floats(&rng, nq), *k = random_floats(&rng, nk), *v = random_floats(&rng, nv);
    for (int causal = 0; causal < 2; causal++) {
        size_t n = 0;
        float *out = sdpa_output(
            q, qd, k, kd, v, vd,
            causal ? ",\"kind\":\"linear\",\"causal\":true" : ",\"kind\":\"linear\"", &n);
        ck_assert_uint_eq(n, no);
        float *want = harness_calloc(no, sizeof(float));
        for (int b = 0; b < 2; b++) {
            ref_sdpa_args a = {.n_heads = 8,
                               .n_kv_heads = 2,
                               .n_q = 5,
                               .n_k = 9,
                               .d_k = 16,
                               .d_v = 12,
                               .q = q + b * nq / 2,
                               .k = k + b * nk / 2,
                               .v = v + b * nv / 2,
                               .is_causal = causal,
                               .window = -1,
                               .out = want + b * no / 2};
            ref_linear_sdpa(&a);
        }
        harness_expect_close(out, want, no, causal ? "linear, causal" : "linear");
        free(want);
        free(out);
    }
    free(v);
    free(k);
    free(q);
    static const struct {
        const char *extra, *param;
    } bad[] = {{",\"return_weights\":true", "return_weights"},
               {",\"window\":2", "window"},
               {",\"scale\":0.5", "scale"},
               {",\"mask\":[[1,1]]", "mask"}};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        char body[256];
        snprintf(body, sizeof body,
                 "{\"q\":[[[1,0],[0,1]]],\"k\":[[[1,0],[0,1]]],\"v\":[[[1,0],[0,1]]],"
                 "\"kind\":\"linear\"%s}",
                 bad[i].extra);
        post_refused(body, bad[i].param, "not defined for kind linear");
    }
    post_refused("{\"q\":[[[1]]],\"k\":[[[1]]],\"v\":[[[1]]],\"kind\":\"cosine\"}", "kind",
                 "expected \"softmax\" or \"linear\"");
    stop();
}
END_TEST

/* The engine in-process, built as the daemon builds a preset (the reference its answers are
 * checked against: the engine itself is checked against tests/ref.c elsewhere). */
struct local_engine {
    attn_model *m;
    attn_kv_pool *pool;
    attn_workspace *ws;
    int32_t hidden, n_heads;
};

static void local_engine_init(struct local_engine *e, const char *preset, uint64_t seed,
                              int32_t ws_tokens) {
    attn_config cfg;
    ck_assert_int_eq(attn_config_preset(preset, &cfg), ATTN_OK);
    memset(e, 0, sizeof *e);
    attn_load_params lp = {.weights_dtype = ATTN_DTYPE_BF16}; /* a preset's default */
    ck_assert_int_eq(attn_model_create_random(&cfg, seed, &lp, &e->m), ATTN_OK);
    ck_assert_int_eq(attn_kv_pool_create(e->m, 16 << 20, 0, &e->pool), ATTN_OK);
    ck_assert_int_eq(attn_workspace_create(e->m, ws_tokens, NULL, &e->ws), ATTN_OK);
    e->hidden = attn_model_config(e->m)->hidden_size;
    e->n_heads = attn_model_config(e->m)->n_heads;
}

static void local_engine_release(struct local_engine *e) {
    attn_workspace_destroy(e->ws);
    attn_kv_pool_destroy(e->pool);
    attn_model_destroy(e->m);
}

/* POST /v1/attend's key_mask hides keys (cached or new) for that request only: a session's
 * prefill and decodes with and without it equal the engine run in-process with the same
 * key_valid, and a later request without it sees every key again. */
START_TEST(test_kinds_attend_key_mask_is_per_request) {
    const char *args[] = {"--preset", "tiny", "--seed", "3", "--workers", "1", NULL};
    http_client_daemon_start(&daemon_, args);
    struct local_engine eng;
    local_engine_init(&eng, "tiny", 3, 64);
    attn_kv *kv = NULL;
    ck_assert_int_eq(attn_kv_create(eng.pool, &kv), ATTN_OK);
    const int32_t hidden = eng.hidden, n = 9;
    float *x = http_client_random_rows(77, n, hidden);
    float *want = harness_calloc((size_t)n * hidden, sizeof(float));
    /* prefill 6 hiding token 2; a decode hiding 2 and 4; a decode hiding nothing */
    static const int32_t calls[][2] = {{0, 6}, {6, 1}, {7, 1}, {8, 1}};
    static const char *const masks[] = {"[1,1,0,1,1,1]", "[1,1,0,1,0,1,1]", NULL,
                                        "[0,1,1,1,1,1,1,1,1]"};
    static const uint8_t valid[][9] = {
        {1, 1, 0, 1, 1, 1}, {1, 1, 0, 1, 0, 1, 1}, {0}, {0, 1, 1, 1, 1, 1, 1, 1, 1}};
    for (int c = 0; c < 4; c++) {
        int32_t first = calls[c][0], t = calls[c][1];
        attn_step step = {.kv = kv,
                          .x = x + (size_t)first * hidden,
                          .n_tokens = t,
                          .key_valid = masks[c] != NULL ? valid[c] : NULL,
                          .out = want + (size_t)first * hidden};
        ck_assert_int_eq(attn_forward(eng.m, 0, eng.ws, &step, 1), ATTN_OK);
        char extra[96] = "";
        if (masks[c] != NULL) {
            snprintf(extra, sizeof extra, ",\"key_mask\":%s", masks[c]);
        }
        char *body = http_client_attend_body("km", x, first, t, hidden, c % 2 == 1, extra);
        cJSON *j = post("/v1/attend", body, 200);
        size_t got_n = 0;
        float *got = http_client_json_floats(cJSON_GetObjectItemCaseSensitive(j, "output"), &got_n);
        ck_assert_uint_eq(got_n, (size_t)t * hidden);
        char what[64];
        snprintf(what, sizeof what, "call %d (%s)", c, masks[c] != NULL ? masks[c] : "no mask");
        harness_expect_close(got, want + (size_t)first * hidden, got_n, what);
        free(got);
        cJSON_Delete(j);
        free(body);
    }
    /* The mask covers the cache and the new tokens exactly; 0 or 1 only. */
    static const struct {
        const char *mask, *says;
    } bad[] = {{"[1,1,1]", "needs 10"},
               {"[1,1,1,1,1,1,1,1,1,2]", "1 attends, 0 masks"},
               {"[[1,1]]", "rank 1"}};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        char extra[96];
        snprintf(extra, sizeof extra, ",\"key_mask\":%s", bad[i].mask);
        char *body = http_client_attend_body("km", x, 0, 1, hidden, false, extra);
        cJSON *j = post("/v1/attend", body, 400);
        const cJSON *e = cJSON_GetObjectItemCaseSensitive(j, "error");
        ck_assert_str_eq(cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(e, "param")),
                         "key_mask");
        const char *msg = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(e, "message"));
        ck_assert_msg(strstr(msg, bad[i].says) != NULL, "%s: %s", bad[i].mask, msg);
        cJSON_Delete(j);
        free(body);
    }
    free(want);
    free(x);
    attn_kv_destroy(kv);
    local_engine_release(&eng);
    stop();
}
END_TEST

/* GET base + path, which must answer 200; the parsed body. */
static cJSON *get_json(const char *path) {
    char url[512];
    snprintf(url, sizeof url, "%s%s", daemon_.base, path);
    struct http_client_response r;
    http_client_request("GET", url, NULL, 0, NULL, &r);
    ck_assert_msg(r.status == 200, "GET %s: %ld: %.300s", path, r.status, r.body);
    cJSON *j = http_client_json(&r);
    http_client_response_release(&r);
    return j;
}

/* The context_tokens of a session's layer in GET /v1/sessions/{id}, or -1. */
static int context_tokens(const char *session, int32_t layer) {
    char path[128];
    snprintf(path, sizeof path, "/v1/sessions/%s", session);
    cJSON *j = get_json(path);
    int n = -1;
    const cJSON *l;
    cJSON_ArrayForEach(l, cJSON_GetObjectItemCaseSensitive(j, "layers")) {
        const cJSON *c = cJSON_GetObjectItemCaseSensitive(l, "context_tokens");
        if (cJSON_GetObjectItemCaseSensitive(l, "layer")->valueint == layer && c != NULL) {
            n = c->valueint;
        }
    }
    cJSON_Delete(j);
    return n;
}

/* The engine in-process as the reference of one cross call: the context (n_context rows, 0 =
 * reuse) appended to cross, then x's t queries. */
static void cross_expect(struct local_engine *r, attn_kv *cross, const float *ctx, int32_t n_ctx,
                         const float *x, int32_t t, const cJSON *got, const char *what) {
    float *out = harness_calloc((size_t)t * r->hidden, sizeof(float));
    int32_t keys = attn_kv_len(cross) + n_ctx;
    float *w = harness_calloc((size_t)r->n_heads * t * keys, sizeof(float));
    attn_step st = {.cross = cross,
                    .context = ctx,
                    .n_context = n_ctx,
                    .x = x,
                    .n_tokens = t,
                    .out = out,
                    .weights = w};
    ck_assert_int_eq(attn_forward(r->m, 0, r->ws, &st, 1), ATTN_OK);
    size_t n = 0;
    float *o = http_client_json_floats(cJSON_GetObjectItemCaseSensitive(got, "output"), &n);
    ck_assert_uint_eq(n, (size_t)t * r->hidden);
    harness_expect_close(o, out, n, what);
    const cJSON *wj = cJSON_GetObjectItemCaseSensitive(got, "weights");
    if (wj != NULL) {
        float *gw = http_client_json_floats(wj, &n);
        ck_assert_uint_eq(n, (size_t)r->n_heads * t * keys);
        harness_expect_close(gw, w, n, what);
        free(gw);
    }
    ck_assert_int_eq(cJSON_GetObjectItemCaseSensitive(got, "context_tokens")->valueint, keys);
    free(o);
    free(w);
    free(out);
}

/* A body for session (NULL: stateless) with x rows and, when n_ctx > 0, a context; extra is
 * spliced in. malloc'd. */
static char *cross_body(const char *session, const float *x, int32_t t, const float *ctx,
                        int32_t n_ctx, int32_t hidden, const char *extra) {
    char *xs = http_client_matrix_json(x, t, hidden);
    char *cs = n_ctx > 0 ? http_client_matrix_json(ctx, n_ctx, hidden) : NULL;
    size_t size = strlen(xs) + (cs ? strlen(cs) : 0) + strlen(extra) + 256;
    char *b = harness_calloc(size, 1);
    int len = snprintf(b, size, "{\"x\":%s", xs);
    if (session != NULL) {
        len += snprintf(b + len, size - (size_t)len, ",\"session_id\":\"%s\"", session);
    }
    if (cs != NULL) {
        len += snprintf(b + len, size - (size_t)len, ",\"context\":%s", cs);
    }
    snprintf(b + len, size - (size_t)len, "%s}", extra);
    free(cs);
    free(xs);
    return b;
}

/* Cross-attention through /v1/attend (seed 004 3.4 with the layer's projections): stateless with
 * a context; a session storing one per layer, reused by later calls without resending it,
 * beside the layer's own self-attention cache; 409 context_exists unless replace_context; the
 * replacement; a fork carrying it; and the refusals. Against the engine in-process. */
START_TEST(test_kinds_attend_cross_attention) {
    const char *args[] = {"--preset", "tiny", "--seed", "3", "--workers", "1", NULL};
    http_client_daemon_start(&daemon_, args);
    struct local_engine r;
    local_engine_init(&r, "tiny", 3, 64);
    float *x = http_client_random_rows(81, 4, r.hidden);
    float *ctx = http_client_random_rows(82, 7, r.hidden);
    float *ctx2 = http_client_random_rows(83, 3, r.hidden);
    attn_kv *stateless = NULL, *stored = NULL, *stored2 = NULL;
    ck_assert_int_eq(attn_kv_create(r.pool, &stateless), ATTN_OK);
    ck_assert_int_eq(attn_kv_create(r.pool, &stored), ATTN_OK);
    ck_assert_int_eq(attn_kv_create(r.pool, &stored2), ATTN_OK);

    char *b = cross_body(NULL, x, 2, ctx, 5, r.hidden, ",\"return_weights\":true");
    cJSON *j = post("/v1/attend", b, 200);
    cross_expect(&r, stateless, ctx, 5, x, 2, j, "stateless cross");
    ck_assert_int_eq(cJSON_GetObjectItemCaseSensitive(j, "n_tokens")->valueint, 0);
    cJSON_Delete(j);
    free(b);

    b = cross_body("enc", x, 1, ctx, 7, r.hidden, ",\"return_weights\":true");
    j = post("/v1/attend", b, 200);
    cross_expect(&r, stored, ctx, 7, x, 1, j, "the session's context, stored");
    cJSON_Delete(j);
    free(b);
    ck_assert_int_eq(context_tokens("enc", 0), 7);
    b = cross_body("enc", x + r.hidden, 2, NULL, 0, r.hidden, ",\"cross\":true");
    j = post("/v1/attend", b, 200);
    cross_expect(&r, stored, NULL, 0, x + r.hidden, 2, j, "the stored context, reused");
    cJSON_Delete(j);
    free(b);
    /* A new context without replace_context: 409, nothing changes. */
    b = cross_body("enc", x, 1, ctx2, 3, r.hidden, "");
    j = post("/v1/attend", b, 409);
    const cJSON *e = cJSON_GetObjectItemCaseSensitive(j, "error");
    ck_assert_str_eq(cJSON_GetObjectItemCaseSensitive(e, "code")->valuestring, "context_exists");
    ck_assert_str_eq(cJSON_GetObjectItemCaseSensitive(e, "param")->valuestring, "context");
    cJSON_Delete(j);
    free(b);
    ck_assert_int_eq(context_tokens("enc", 0), 7);
    /* The layer's own self-attention cache lives beside it. */
    b = cross_body("enc", x, 3, NULL, 0, r.hidden, "");
    j = post("/v1/attend", b, 200);
    ck_assert_int_eq(cJSON_GetObjectItemCaseSensitive(j, "n_tokens")->valueint, 3);
    ck_assert_ptr_null(cJSON_GetObjectItemCaseSensitive(j, "context_tokens"));
    cJSON_Delete(j);
    free(b);
    b = cross_body("enc", x + 3 * r.hidden, 1, NULL, 0, r.hidden, ",\"cross\":true");
    j = post("/v1/attend", b, 200);
    cross_expect(&r, stored, NULL, 0, x + 3 * r.hidden, 1, j, "reused after self calls");
    ck_assert_int_eq(cJSON_GetObjectItemCaseSensitive(j, "n_past")->valueint, 3);
    ck_assert_int_eq(cJSON_GetObjectItemCaseSensitive(j, "n_tokens")->valueint, 3);
    cJSON_Delete(j);
    free(b);
    /* Replaced explicitly; a fork carries the new one. */
    b = cross_body("enc", x, 2, ctx2, 3, r.hidden, ",\"replace_context\":true");
    j = post("/v1/attend", b, 200);
    cross_expect(&r, stored2, ctx2, 3, x, 2, j, "the replaced context");
    cJSON_Delete(j);
    free(b);
    ck_assert_int_eq(context_tokens("enc", 0), 3);
    cJSON_Delete(post("/v1/sessions/enc/fork", "{\"new_id\":\"enc2\"}", 201));
    ck_assert_int_eq(context_tokens("enc2", 0), 3);
    b = cross_body("enc2", x + r.hidden, 1, NULL, 0, r.hidden, ",\"cross\":true");
    j = post("/v1/attend", b, 200);
    cross_expect(&r, stored2, NULL, 0, x + r.hidden, 1, j, "the fork's context");
    cJSON_Delete(j);
    free(b);

    static const struct {
        const char *session, *extra, *param;
        bool has_context;
    } bad[] = {
        {"enc", ",\"cross\":true,\"layer\":1", "cross", false},
        {NULL, ",\"cross\":true", "cross", false},
        {"enc", ",\"positions\":[0]", "positions", true},
        {"enc", ",\"stream\":true", "stream", true},
        {"enc", ",\"cross\":false", "cross", true},
        {"enc", ",\"replace_context\":true", "replace_context", false},
        {"enc", ",\"expect_n_past\":3", "expect_n_past", true},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        b = cross_body(bad[i].session, x, 1, ctx, bad[i].has_context ? 2 : 0, r.hidden,
                       bad[i].extra);
        j = post("/v1/attend", b, 400);
        e = cJSON_GetObjectItemCaseSensitive(j, "error");
        ck_assert_msg(
            strcmp(cJSON_GetObjectItemCaseSensitive(e, "param")->valuestring, bad[i].param) == 0,
            "%s: %s", bad[i].extra, cJSON_GetObjectItemCaseSensitive(e, "message")->valuestring);
        cJSON_Delete(j);
        free(b);
    }
    attn_kv_destroy(stored2);
    attn_kv_destroy(stored);
    attn_kv_destroy(stateless);
    free(ctx2);
    free(ctx);
    free(x);
    local_engine_release(&r);
    stop();
}
END_TEST

/* A linear-attention session (preset small-linear, seed 5): a prefill and decodes equal the
 * engine in-process over one pass, the session's bytes stay those of one state as it grows
 * (n_held 0, "attention": "linear"), GET /v1/model says linear, a truncate it cannot do is 409
 * tokens_dropped naming the layer, a fork continues alike, and what linear attention does not
 * have (weights, key_mask, positions, a context) is a 400 naming the field. */
START_TEST(test_kinds_linear_session) {
    const char *args[] = {"--preset", "small-linear", "--seed", "5", "--workers", "1", NULL};
    http_client_daemon_start(&daemon_, args);
    struct local_engine eng;
    local_engine_init(&eng, "small-linear", 5, 256);
    attn_kv *kv = NULL;
    ck_assert_int_eq(attn_kv_create_for_layer(eng.pool, 1, &kv), ATTN_OK);
    const int32_t hidden = eng.hidden, n = 70;
    float *x = http_client_random_rows(91, n, hidden);
    float *want = harness_calloc((size_t)n * hidden, sizeof(float));
    attn_step one = {.kv = kv, .x = x, .n_tokens = n, .out = want};
    ck_assert_int_eq(attn_forward(eng.m, 1, eng.ws, &one, 1), ATTN_OK);

    cJSON *model = get_json("/v1/model");
    const cJSON *l0 =
        cJSON_GetArrayItem(cJSON_GetObjectItemCaseSensitive(
                               cJSON_GetObjectItemCaseSensitive(model, "attnd"), "layers"),
                           1);
    ck_assert_str_eq(cJSON_GetObjectItemCaseSensitive(l0, "attention")->valuestring, "linear");
    /* its feature map takes no softmax scale, so none is shown (it showed head_dim^-1/2) */
    ck_assert(cJSON_IsNull(cJSON_GetObjectItemCaseSensitive(l0, "softmax_scale")));
    cJSON_Delete(model);
    int bytes = -1;
    for (int32_t first = 0; first < n;) {
        int32_t t = first == 0 ? 64 : 1;
        char *body =
            http_client_attend_body("lin", x, first, t, hidden, first % 2 == 1, ",\"layer\":1");
        cJSON *j = post("/v1/attend", body, 200);
        size_t got_n = 0;
        float *got = http_client_json_floats(cJSON_GetObjectItemCaseSensitive(j, "output"), &got_n);
        harness_expect_close(got, want + (size_t)first * hidden, got_n, "linear session");
        free(got);
        cJSON_Delete(j);
        free(body);
        first += t;
        cJSON *sj = get_json("/v1/sessions/lin");
        const cJSON *layer = cJSON_GetArrayItem(cJSON_GetObjectItemCaseSensitive(sj, "layers"), 0);
        ck_assert_int_eq(cJSON_GetObjectItemCaseSensitive(layer, "n_tokens")->valueint, first);
        ck_assert_int_eq(cJSON_GetObjectItemCaseSensitive(layer, "n_held")->valueint, 0);
        ck_assert_str_eq(cJSON_GetObjectItemCaseSensitive(layer, "attention")->valuestring,
                         "linear");
        int b = cJSON_GetObjectItemCaseSensitive(layer, "bytes")->valueint;
        ck_assert(bytes < 0 || b == bytes); /* one state, whatever the length */
        bytes = b;
        cJSON_Delete(sj);
    }
    cJSON *j = post("/v1/sessions/lin/truncate", "{\"n_tokens\":10}", 409);
    const cJSON *e = cJSON_GetObjectItemCaseSensitive(j, "error");
    ck_assert_str_eq(cJSON_GetObjectItemCaseSensitive(e, "code")->valuestring, "tokens_dropped");
    ck_assert(strstr(cJSON_GetObjectItemCaseSensitive(e, "message")->valuestring,
                     "layer 1 is linear attention") != NULL);
    cJSON_Delete(j);
    /* a token whose keys and values overflow float: 400, and the state goes on as it was (it
     * took the infinities, and answered null ever after) */
    float *huge = harness_calloc((size_t)hidden, sizeof(float));
    for (int32_t i = 0; i < hidden; i++) {
        huge[i] = 3e38f;
    }
    char *huge_body = http_client_attend_body("lin", huge, 0, 1, hidden, false, ",\"layer\":1");
    j = post("/v1/attend", huge_body, 400);
    e = cJSON_GetObjectItemCaseSensitive(j, "error");
    ck_assert_str_eq(cJSON_GetObjectItemCaseSensitive(e, "code")->valuestring, "kv_out_of_range");
    ck_assert(strstr(cJSON_GetObjectItemCaseSensitive(e, "message")->valuestring, "not finite") !=
              NULL);
    cJSON_Delete(j);
    free(huge_body);
    free(huge);
    cJSON_Delete(post("/v1/sessions/lin/fork", "{\"new_id\":\"lin2\"}", 201));
    float *more = http_client_random_rows(92, 1, hidden);
    float *next = harness_calloc((size_t)hidden, sizeof(float));
    attn_step step = {.kv = kv, .x = more, .n_tokens = 1, .out = next};
    ck_assert_int_eq(attn_forward(eng.m, 1, eng.ws, &step, 1), ATTN_OK);
    for (int c = 0; c < 2; c++) {
        char *body = http_client_attend_body(c == 0 ? "lin" : "lin2", more, 0, 1, hidden, false,
                                             ",\"layer\":1");
        j = post("/v1/attend", body, 200);
        size_t got_n = 0;
        float *got = http_client_json_floats(cJSON_GetObjectItemCaseSensitive(j, "output"), &got_n);
        harness_expect_close(got, next, got_n, c == 0 ? "after the 409 and 400" : "the fork");
        free(got);
        cJSON_Delete(j);
        free(body);
    }
    static const char *const bad[][2] = {{",\"return_weights\":true", "return_weights"},
                                         {",\"key_mask\":[1]", "key_mask"},
                                         {",\"positions\":[0]", "positions"},
                                         {",\"cross\":true", "cross"}};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        char extra[64];
        snprintf(extra, sizeof extra, ",\"layer\":1%s", bad[i][0]);
        char *body = http_client_attend_body(NULL, x, 0, 1, hidden, false, extra);
        j = post("/v1/attend", body, 400);
        e = cJSON_GetObjectItemCaseSensitive(j, "error");
        ck_assert_str_eq(cJSON_GetObjectItemCaseSensitive(e, "param")->valuestring, bad[i][1]);
        cJSON_Delete(j);
        free(body);
    }
    free(next);
    free(more);
    free(want);
    free(x);
    attn_kv_destroy(kv);
    local_engine_release(&eng);
    stop();
}
END_TEST

/* A request refused for what its layer cannot compute (return_weights on a linear layer) changes
 * nothing, also at --max-sessions: naming a new id, it made that session first, which evicted
 * the least recently used idle one (then 410 session_evicted), and was refused after (found by
 * an outside audit). */
START_TEST(test_kinds_linear_refusal_evicts_nothing) {
    const char *args[] = {"--preset", "small-linear",   "--seed", "5", "--workers",
                          "1",        "--max-sessions", "2",      NULL};
    http_client_daemon_start(&daemon_, args);
    const int32_t hidden = 512;
    float *x = http_client_random_rows(93, 1, hidden);
    static const char *const ids[] = {"old1", "old2"};
    for (int i = 0; i < 2; i++) {
        char *body = http_client_attend_body(ids[i], x, 0, 1, hidden, false, ",\"layer\":1");
        cJSON_Delete(post("/v1/attend", body, 200));
        free(body);
    }
    static const char *const bad[][2] = {{",\"return_weights\":true", "return_weights"},
                                         {",\"positions\":[0]", "positions"},
                                         {",\"capture\":[\"q\"]", "capture"}};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        char extra[64];
        snprintf(extra, sizeof extra, ",\"layer\":1%s", bad[i][0]);
        char *body = http_client_attend_body("new", x, 0, 1, hidden, false, extra);
        cJSON *j = post("/v1/attend", body, 400);
        const cJSON *e = cJSON_GetObjectItemCaseSensitive(j, "error");
        ck_assert_str_eq(cJSON_GetObjectItemCaseSensitive(e, "param")->valuestring, bad[i][1]);
        cJSON_Delete(j);
        free(body);
    }
    /* in a steps call, such a step is malformed: the whole call is refused naming the step,
     * and no step runs (old1 stays at 1 token) */
    char *rows = http_client_attend_body(NULL, x, 0, 1, hidden, false, "");
    const char *x_at = strstr(rows, "\"x\":");
    ck_assert_ptr_nonnull(x_at);
    size_t x_len = strlen(x_at) - 1; /* "x":[...] without the closing brace */
    char *steps = malloc(2 * x_len + 256);
    ck_assert_ptr_nonnull(steps);
    snprintf(steps, 2 * x_len + 256,
             "{\"layer\":1,\"steps\":[{\"session_id\":\"old1\",%.*s},"
             "{\"session_id\":\"new\",\"return_weights\":true,%.*s}]}",
             (int)x_len, x_at, (int)x_len, x_at);
    cJSON *j = post("/v1/attend", steps, 400);
    const cJSON *e = cJSON_GetObjectItemCaseSensitive(j, "error");
    ck_assert_str_eq(cJSON_GetObjectItemCaseSensitive(e, "param")->valuestring,
                     "steps[1].return_weights");
    cJSON_Delete(j);
    free(steps);
    free(rows);
    for (int i = 0; i < 2; i++) { /* both still there, at their length */
        char *body = http_client_attend_body(ids[i], x, 0, 1, hidden, false,
                                             ",\"layer\":1,\"expect_n_past\":1");
        cJSON_Delete(post("/v1/attend", body, 200));
        free(body);
    }
    free(x);
    stop();
}
END_TEST

/* A first request on a new id that its empty cache refuses (409 expect_n_past, a key_mask of
 * another length, cross without a context, a selection's keys past the call's) evicts nothing at
 * --max-sessions: it made its session first, which evicted the least recently used idle one (then
 * 410 session_evicted), and was refused at its turn (found by an outside audit: a client resyncing
 * with expect_n_past after a restart or a move lost another session to each 409). A step of a steps
 * call alike. */
START_TEST(test_kinds_new_id_refusal_evicts_nothing) {
    const char *args[] = {"--preset", "tiny", "--workers", "1", "--max-sessions", "2", NULL};
    http_client_daemon_start(&daemon_, args);
    const int32_t hidden = 64;
    float *x = http_client_random_rows(94, 1, hidden);
    static const char *const ids[] = {"old1", "old2"};
    for (int i = 0; i < 2; i++) {
        char *body = http_client_attend_body(ids[i], x, 0, 1, hidden, false, NULL);
        cJSON_Delete(post("/v1/attend", body, 200));
        free(body);
    }
    static const struct {
        const char *extra, *param;
        long status;
    } bad[] = {{",\"expect_n_past\":5", "expect_n_past", 409},
               {",\"key_mask\":[1,1,1]", "key_mask", 400},
               {",\"cross\":true", "cross", 400},
               {",\"return_weights\":{\"keys\":[0,5]}", "return_weights.keys", 400}};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        char *body = http_client_attend_body("new", x, 0, 1, hidden, false, bad[i].extra);
        cJSON *j = post("/v1/attend", body, bad[i].status);
        const cJSON *e = cJSON_GetObjectItemCaseSensitive(j, "error");
        ck_assert_str_eq(cJSON_GetObjectItemCaseSensitive(e, "param")->valuestring, bad[i].param);
        cJSON_Delete(j);
        free(body);
    }
    cJSON *j = post("/v1/attend",
                    "{\"steps\":[{\"session_id\":\"new2\",\"expect_n_past\":3,\"x\":[[0,0,0,0,0,0,"
                    "0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,"
                    "0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0]]}]}",
                    200);
    const cJSON *r0 = cJSON_GetArrayItem(cJSON_GetObjectItemCaseSensitive(j, "results"), 0);
    ck_assert_int_eq(cJSON_GetObjectItemCaseSensitive(r0, "status")->valueint, 409);
    cJSON_Delete(j);
    for (int i = 0; i < 2; i++) { /* both still there, at their length */
        char *body =
            http_client_attend_body(ids[i], x, 0, 1, hidden, false, ",\"expect_n_past\":1");
        cJSON_Delete(post("/v1/attend", body, 200));
        free(body);
    }
    free(x);
    stop();
}
END_TEST

/* A DeepSeek-V3 checkpoint: GET /v1/model shows its latent (kv_lora 16 + rope 4 floats a token),
 * its weights come back per head over the tokens, and a context (cross-attention) is refused by
 * name: the latent cache has no context form. */
START_TEST(test_kinds_mla_model) {
    const char *args[] = {
        "--model", "tests/data/hf_deepseek_v3_bf16", "--workers", "1", "--max-seq", "128", NULL};
    http_client_daemon_start(&daemon_, args);
    cJSON *model = get_json("/v1/model");
    const cJSON *mla =
        cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(model, "attnd"), "mla");
    ck_assert_int_eq(cJSON_GetObjectItemCaseSensitive(mla, "cache_floats_per_token")->valueint, 20);
    ck_assert_int_eq(cJSON_GetObjectItemCaseSensitive(mla, "q_lora_rank")->valueint, 24);
    /* the config's terms, not the engine's geometry (one K/V head of nope + rope dims): a K/V
     * head per query head, head_dim the rotated dims, as DeepseekV3Config has them (found by an
     * outside audit: 1, 12 and a partial_rotary_factor of 1/3 no DeepSeek config holds) */
    ck_assert_int_eq(cJSON_GetObjectItemCaseSensitive(model, "num_key_value_heads")->valueint, 4);
    ck_assert_int_eq(cJSON_GetObjectItemCaseSensitive(model, "head_dim")->valueint, 4);
    ck_assert_double_eq(
        cJSON_GetObjectItemCaseSensitive(model, "partial_rotary_factor")->valuedouble, 1.0);
    cJSON_Delete(model);
    /* /v1/kv/attend: refused for the latent before any shape (tensors shaped by the config's
     * heads used to get a shape error against the engine's one K/V head) */
    const char *qkv = "{\"session_id\":\"k\",\"q\":[[[1,2,3,4]]],\"k\":[[[1,2,3,4]]],"
                      "\"v\":[[[1,2,3,4]]]}";
    cJSON *e = post("/v1/kv/attend", qkv, 400);
    const cJSON *err = cJSON_GetObjectItemCaseSensitive(e, "error");
    ck_assert_ptr_nonnull(
        strstr(cJSON_GetObjectItemCaseSensitive(err, "message")->valuestring, "latent"));
    cJSON_Delete(e);
    float *x = http_client_random_rows(95, 5, 64);
    char *b = cross_body("ds", x, 5, NULL, 0, 64, ",\"return_weights\":true");
    cJSON *j = post("/v1/attend", b, 200);
    size_t n = 0;
    float *w = http_client_json_floats(cJSON_GetObjectItemCaseSensitive(j, "weights"), &n);
    ck_assert_uint_eq(n, 4 * 5 * 5); /* (heads, T, n_tokens) */
    for (int32_t hh = 0; hh < 4; hh++) {
        for (int32_t i = 0; i < 5; i++) {
            double sum = 0.0;
            for (int32_t k = 0; k < 5; k++) {
                sum += w[(hh * 5 + i) * 5 + k];
                ck_assert(k <= i || w[(hh * 5 + i) * 5 + k] == 0.0f); /* causal */
            }
            ck_assert_msg(fabs(sum - 1.0) < 1e-5, "head %d row %d sums to %g", hh, i, sum);
        }
    }
    free(w);
    cJSON_Delete(j);
    free(b);
    b = cross_body("ds", x, 1, x, 2, 64, "");
    post_refused_attend(b, "context"); /* the field sent is named */
    free(b);
    free(x);
    stop();
    /* V2 with a plain q_proj: q_lora_rank null, as its config.json has it (it showed 0, which
     * in a config.json means a rank-0 q_a_proj to transformers, and is refused) */
    const char *v2[] = {"--model",
                        "tests/data/hf_deepseek_v2_f32",
                        "--modeling-code",
                        "checkpoint",
                        "--workers",
                        "1",
                        "--max-seq",
                        "128",
                        NULL};
    http_client_daemon_start(&daemon_, v2);
    model = get_json("/v1/model");
    mla = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(model, "attnd"), "mla");
    ck_assert(cJSON_IsNull(cJSON_GetObjectItemCaseSensitive(mla, "q_lora_rank")));
    cJSON_Delete(model);
    stop();
}
END_TEST

/* A block too small for a linear layer's state (small-linear, head_dim 64: 33 KB of doubles, a
 * bf16 block of 64 tokens 32 KiB) stops the start naming --kv-block-tokens and the size that
 * works; it started, and every attend then failed with a bare "invalid argument" (found by an
 * outside audit). */
START_TEST(test_kinds_linear_state_must_fit_a_block) {
    attn_config cfg;
    ck_assert_int_eq(attn_config_preset("small-linear", &cfg), ATTN_OK);
    attn_load_params lp = {.weights_dtype = ATTN_DTYPE_BF16};
    attn_model *m = NULL;
    ck_assert_int_eq(attn_model_create_random(&cfg, 1, &lp, &m), ATTN_OK);
    attn_kv_pool *pool = NULL;
    ck_assert_int_eq(attn_kv_pool_create_typed(m, 64 << 20, 64, ATTN_DTYPE_BF16, &pool),
                     ATTN_EUNSUPPORTED);
    ck_assert_int_eq(attn_kv_pool_create_typed(m, 64 << 20, 128, ATTN_DTYPE_BF16, &pool), ATTN_OK);
    attn_kv_pool_destroy(pool);
    attn_model_destroy(m);
    const char *args[] = {"--preset", "small-linear", "--kv-block-tokens", "32", NULL};
    char *log = NULL;
    int status = http_client_daemon_run(args, 10000, &log);
    ck_assert_msg(status == 1 && strstr(log, "--kv-block-tokens 32") != NULL &&
                      strstr(log, "use 128 or more") != NULL,
                  "status %d: %s", status, log);
    free(log);
}
END_TEST

/* `extern` keeps this prototype out of the Makefile's suite-table scan, which matches lines
 * starting with `Suite *`. */
extern Suite *kinds_suite(void);

Suite *kinds_suite(void) {
    Suite *s = suite_create("kinds");
    TCase *tc = tcase_create("kinds");
    tcase_set_timeout(tc, 60);
    tcase_add_checked_fixture(tc, NULL, teardown);
    tcase_add_test(tc, test_kinds_sdpa_batches_and_masks_match_ref);
    tcase_add_test(tc, test_kinds_sdpa_mask_and_batch_refusals);
    tcase_add_test(tc, test_kinds_attend_key_mask_is_per_request);
    tcase_add_test(tc, test_kinds_seed_cases);
    tcase_add_test(tc, test_kinds_sdpa_linear);
    tcase_add_test(tc, test_kinds_attend_cross_attention);
    tcase_add_test(tc, test_kinds_linear_session);
    tcase_add_test(tc, test_kinds_linear_refusal_evicts_nothing);
    tcase_add_test(tc, test_kinds_new_id_refusal_evicts_nothing);
    tcase_add_test(tc, test_kinds_mla_model);
    tcase_add_test(tc, test_kinds_linear_state_must_fit_a_block);
    suite_add_tcase(s, tc);
    return s;
}
