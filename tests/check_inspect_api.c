/* tests/check_inspect_api.c: inspection through the real attnd (the engine's own numbers are
 * checked against ref.c in check_inspect.c; here, that the wire carries them): return_weights as
 * a selection equals the same cells of the full weights of an identical call, exp(scores - lse)
 * equals the probabilities, reductions are the mean / max of the heads; capture and head_mask on
 * /v1/kv/attend, where the output is per head; a masked call leaves the cache as an unmasked one
 * would; /v1/sdpa selections with a batch; GET /v1/sessions/{id}/attention (--keep-queries)
 * recomputes the weights the calls returned, also after an export and import; and refusals. The
 * daemon runs the small preset with an f32 KV cache, so a recomputation reads exactly the
 * queries the call had. */
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "http_client.h"

#define HIDDEN 512
#define HEADS  8
#define T      7

static struct http_client_daemon d_, plain_;

static void setup(void) {
    memset(&d_, 0, sizeof d_);
    memset(&plain_, 0, sizeof plain_);
    static const char *const args[] = {"--keep-queries", "1", "--kv-dtype", "f32", NULL};
    http_client_daemon_start(&d_, args);
}

static void teardown(void) {
    http_client_daemon_kill(&d_);
    http_client_daemon_kill(&plain_);
}

/* Stops the daemon with SIGTERM and expects a clean exit (under ASan: no leak either). */
static void stop_clean(struct http_client_daemon *d) {
    int rc = http_client_daemon_stop(d, 20000);
    char *log = rc != 0 ? http_client_daemon_log(d) : NULL;
    ck_assert_msg(rc == 0, "attnd exited %d: %s", rc, log != NULL ? log : "");
    free(log);
}

static cJSON *request(const struct http_client_daemon *d, const char *method, const char *path,
                      const char *body, long want) {
    char u[1200];
    snprintf(u, sizeof u, "%s%s", d->base, path);
    struct http_client_response r;
    http_client_request(method, u, body, body != NULL ? strlen(body) : 0, NULL, &r);
    ck_assert_msg(r.status == want, "%s %s: want %ld, got %ld: %.300s", method, path, want,
                  r.status, r.body);
    cJSON *j = http_client_json(&r);
    http_client_response_release(&r);
    return j;
}

/* The floats of field `name` of j (malloc'd), which must hold exactly n of them. */
static float *floats_of(const cJSON *j, const char *name, size_t n) {
    const cJSON *t = cJSON_GetObjectItemCaseSensitive(j, name);
    ck_assert_msg(t != NULL, "no field %s", name);
    size_t got;
    float *f = http_client_json_floats(t, &got);
    ck_assert_msg(got == n, "%s: %zu values, want %zu", name, got, n);
    return f;
}

/* A nested array of numbers and nulls (a score of a hidden key) flattened, null as -inf. */
static void flatten_scores(const cJSON *a, float *out, size_t *n) {
    if (cJSON_IsArray(a)) {
        const cJSON *e;
        cJSON_ArrayForEach(e, a) {
            flatten_scores(e, out, n);
        }
    } else {
        out[(*n)++] = cJSON_IsNull(a) ? -INFINITY : (float)a->valuedouble;
    }
}

/* A call of x's rows [first, first + t) on session s with `extra` fields; its answer. */
static cJSON *attend(const char *s, const float *x, int first, int t, const char *extra) {
    char *b = http_client_attend_body(s, x, first, t, HIDDEN, false, extra);
    cJSON *j = request(&d_, "POST", "/v1/attend", b, 200);
    free(b);
    return j;
}

static void expect_near(float got, float want, double tol, const char *what, int i) {
    ck_assert_msg(fabs((double)got - want) <= tol + tol * fabs((double)want),
                  "%s[%d]: got %.9g, want %.9g", what, i, (double)got, (double)want);
}

/* return_weights as a selection: the cells of the full weights, as probabilities, scores and LSE
 * (exp(score - lse) = p), reduced over heads, echoed in "selection"; rows and keys resolved from
 * the end; in base64 as well. */
START_TEST(test_inspect_api_selection) {
    float *x = http_client_random_rows(3, T, HIDDEN);
    cJSON *full = attend("full", x, 0, 3, ",\"return_weights\":true");
    cJSON_Delete(full);
    full = attend("full", x, 3, 4, ",\"return_weights\":true"); /* (8, 4, 7) */
    float *w = floats_of(full, "weights", HEADS * 4 * T);
    static const char *const sessions[] = {"p", "s", "l", "m"};
    static const char *const extra[] = {
        ",\"return_weights\":{\"heads\":[-1,2,2],\"rows\":[-1,0],\"keys\":[1,-1]}",
        ",\"return_weights\":{\"kind\":\"scores\",\"heads\":[2,7],\"rows\":[0,3],\"keys\":[1,6]}",
        ",\"return_weights\":{\"kind\":\"lse\",\"heads\":[2,7],\"rows\":[0,3]}",
        ",\"return_weights\":{\"reduce\":\"max_heads\",\"rows\":[3]},\"encoding_format\":"
        "\"base64\""};
    cJSON *got[4];
    for (int i = 0; i < 4; i++) {
        cJSON_Delete(attend(sessions[i], x, 0, 3, ""));
        got[i] = attend(sessions[i], x, 3, 4, extra[i]);
    }
    /* heads [2, 7], rows [0, 3] of this call, keys [1, 6) */
    const cJSON *sel = cJSON_GetObjectItemCaseSensitive(got[0], "selection");
    char *echo = cJSON_PrintUnformatted(sel);
    ck_assert_str_eq(echo, "{\"kind\":\"probs\",\"reduce\":\"none\",\"heads\":[2,7],\"rows\":[0,3],"
                           "\"keys\":[1,6]}");
    free(echo);
    float *p = floats_of(got[0], "weights", 2 * 2 * 5);
    float s[2 * 2 * 5];
    size_t n_s = 0;
    flatten_scores(cJSON_GetObjectItemCaseSensitive(got[1], "scores"), s, &n_s);
    ck_assert_uint_eq(n_s, 2 * 2 * 5);
    float *l = floats_of(got[2], "lse", 2 * 2);
    static const int heads[2] = {2, 7}, rows[2] = {0, 3};
    for (int h = 0; h < 2; h++) {
        for (int r = 0; r < 2; r++) {
            for (int k = 0; k < 5; k++) {
                int cell = (h * 2 + r) * 5 + k;
                float want = w[((size_t)heads[h] * 4 + rows[r]) * T + 1 + k];
                expect_near(p[cell], want, 1e-6, "probs vs full", cell);
                float from = isfinite(s[cell]) ? expf(s[cell] - l[h * 2 + r]) : 0.0f;
                expect_near(from, want, 1e-5, "exp(scores - lse) vs full", cell);
            }
        }
    }
    float *mx = floats_of(got[3], "weights", 1 * 1 * T);
    for (int k = 0; k < T; k++) {
        float want = 0.0f;
        for (int h = 0; h < HEADS; h++) {
            float v = w[((size_t)h * 4 + 3) * T + k];
            want = v > want ? v : want;
        }
        expect_near(mx[k], want, 1e-6, "max over heads", k);
    }
    ck_assert_msg(cJSON_IsObject(cJSON_GetObjectItemCaseSensitive(got[3], "weights")),
                  "base64 selection is not a {shape, b64} object");
    /* an lse is over every key a row sees: a part of the keys is refused, not answered over all
     * of them with the part echoed (found by an outside audit); the whole range is the lse */
    static const char *const lse_parts[] = {"[1,6]", "[0,0]", "[-2,null]"};
    for (int i = 0; i < 3; i++) {
        char e[160], *b;
        snprintf(e, sizeof e, ",\"return_weights\":{\"kind\":\"lse\",\"keys\":%s}", lse_parts[i]);
        b = http_client_attend_body("p", x, 6, 1, HIDDEN, false, e);
        cJSON *j = request(&d_, "POST", "/v1/attend", b, 400);
        free(b);
        const cJSON *er = cJSON_GetObjectItemCaseSensitive(j, "error");
        ck_assert_str_eq(cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(er, "param")),
                         "return_weights.keys");
        cJSON_Delete(j);
    }
    cJSON *whole = attend("l", x, 6, 1, ",\"return_weights\":{\"kind\":\"lse\",\"keys\":[0,null]}");
    char *whole_echo = cJSON_PrintUnformatted(cJSON_GetObjectItemCaseSensitive(whole, "selection"));
    ck_assert_msg(strstr(whole_echo, "\"keys\":[0,8]") != NULL, "%s", whole_echo);
    free(whole_echo);
    cJSON_Delete(whole);
    free(mx);
    free(l);
    free(p);
    free(w);
    for (int i = 0; i < 4; i++) {
        cJSON_Delete(got[i]);
    }
    cJSON_Delete(full);
    free(x);
    stop_clean(&d_);
}
END_TEST

/* Cross-attention: a selection's keys are the context's tokens; capture k is refused (the keys
 * are the context's), q is not. */
START_TEST(test_inspect_api_cross) {
    float *x = http_client_random_rows(13, 2, HIDDEN),
          *ctx = http_client_random_rows(14, 5, HIDDEN);
    char *cj = http_client_matrix_json(ctx, 5, HIDDEN);
    size_t cap = strlen(cj) + 128;
    char *extra = malloc(cap);
    snprintf(extra, cap, ",\"context\":%s,\"return_weights\":true", cj);
    cJSON *full = attend(NULL, x, 0, 2, extra);
    float *w = floats_of(full, "weights", HEADS * 2 * 5);
    snprintf(extra, cap,
             ",\"context\":%s,\"return_weights\":{\"heads\":[5],\"keys\":[-3,null]},"
             "\"capture\":[\"q\"]",
             cj);
    cJSON *sel = attend(NULL, x, 0, 2, extra);
    float *s = floats_of(sel, "weights", 1 * 2 * 3);
    for (int r = 0; r < 2; r++) {
        for (int k = 0; k < 3; k++) {
            expect_near(s[r * 3 + k], w[(5 * 2 + r) * 5 + 2 + k], 1e-6, "cross selection", k);
        }
    }
    float *q = floats_of(cJSON_GetObjectItemCaseSensitive(sel, "capture"), "q", HEADS * 2 * 64);
    free(q);
    snprintf(extra, cap, ",\"context\":%s,\"capture\":[\"k\"]", cj);
    char *b = http_client_attend_body(NULL, x, 0, 2, HIDDEN, false, extra);
    cJSON_Delete(request(&d_, "POST", "/v1/attend", b, 400));
    free(b);
    free(s);
    free(w);
    cJSON_Delete(sel);
    cJSON_Delete(full);
    free(extra);
    free(cj);
    free(ctx);
    free(x);
    stop_clean(&d_);
}
END_TEST

/* Each head's output and the q/k/v of /v1/kv/attend: capture gives back what was sent (no rope)
 * and head_out equals the output; head_mask scales each head's output, and the session's next
 * step equals a twin's that never had a mask. */
START_TEST(test_inspect_api_capture_head_mask) {
    float *q = http_client_random_rows(5, HEADS * 2, 64), *k = http_client_random_rows(6, 4, 64),
          *v = http_client_random_rows(7, 4, 64);
    char *qj = http_client_matrix_json(q, HEADS * 2, 64), *kj = http_client_matrix_json(k, 4, 64),
         *vj = http_client_matrix_json(v, 4, 64);
    /* (heads * T, 64) rows as (heads, T = 2, 64) — reshaped by hand below */
    cJSON *qa = cJSON_Parse(qj), *ka = cJSON_Parse(kj), *va = cJSON_Parse(vj);
    cJSON *q3 = cJSON_CreateArray(), *k3 = cJSON_CreateArray(), *v3 = cJSON_CreateArray();
    for (int h = 0; h < HEADS; h++) {
        cJSON *pair = cJSON_CreateArray();
        cJSON_AddItemToArray(pair, cJSON_Duplicate(cJSON_GetArrayItem(qa, 2 * h), 1));
        cJSON_AddItemToArray(pair, cJSON_Duplicate(cJSON_GetArrayItem(qa, 2 * h + 1), 1));
        cJSON_AddItemToArray(q3, pair);
    }
    for (int h = 0; h < 2; h++) {
        cJSON *kp = cJSON_CreateArray(), *vp = cJSON_CreateArray();
        for (int t = 0; t < 2; t++) {
            cJSON_AddItemToArray(kp, cJSON_Duplicate(cJSON_GetArrayItem(ka, 2 * h + t), 1));
            cJSON_AddItemToArray(vp, cJSON_Duplicate(cJSON_GetArrayItem(va, 2 * h + t), 1));
        }
        cJSON_AddItemToArray(k3, kp);
        cJSON_AddItemToArray(v3, vp);
    }
    char *qs = cJSON_PrintUnformatted(q3), *ks = cJSON_PrintUnformatted(k3),
         *vs = cJSON_PrintUnformatted(v3);
    size_t cap = strlen(qs) + strlen(ks) + strlen(vs) + 512;
    char *body = malloc(cap);
    float *out[3];
    static const char *const names[] = {"plain", "masked", "twin"};
    for (int i = 0; i < 3; i++) {
        snprintf(body, cap, "{\"session_id\":\"%s\",\"q\":%s,\"k\":%s,\"v\":%s%s}", names[i], qs,
                 ks, vs,
                 i == 1 ? ",\"capture\":[\"q\",\"k\",\"v\",\"head_out\"],"
                          "\"head_mask\":[0,1,0.5,-2,1,1,1,1]"
                        : "");
        cJSON *j = request(&d_, "POST", "/v1/kv/attend", body, 200);
        out[i] = floats_of(j, "output", HEADS * 2 * 64);
        if (i == 1) {
            const cJSON *cap_j = cJSON_GetObjectItemCaseSensitive(j, "capture");
            float *cq = floats_of(cap_j, "q", HEADS * 2 * 64), *ck = floats_of(cap_j, "k", 4 * 64),
                  *cv = floats_of(cap_j, "v", 4 * 64);
            float *ho = floats_of(cap_j, "head_out", HEADS * 2 * 64);
            for (int e = 0; e < HEADS * 2 * 64; e++) {
                expect_near(cq[e], q[e], 0, "captured q", e);
                expect_near(ho[e], out[0][e], 1e-6, "head_out vs the unmasked output", e);
            }
            for (int e = 0; e < 4 * 64; e++) {
                expect_near(ck[e], k[e], 0, "captured k", e);
                expect_near(cv[e], v[e], 0, "captured v", e);
            }
            free(cq);
            free(ck);
            free(cv);
            free(ho);
        }
        cJSON_Delete(j);
    }
    static const float scale[HEADS] = {0, 1, 0.5f, -2, 1, 1, 1, 1};
    for (int e = 0; e < HEADS * 2 * 64; e++) {
        expect_near(out[1][e], out[0][e] * scale[e / 128], 1e-6, "masked output", e);
    }
    /* the next step: masked and twin sessions alike */
    float *next[2];
    for (int i = 0; i < 2; i++) {
        snprintf(body, cap,
                 "{\"session_id\":\"%s\",\"q\":%s,\"k\":%s,\"v\":%s,\"expect_n_past\":2}",
                 names[i + 1], qs, ks, vs);
        cJSON *j = request(&d_, "POST", "/v1/kv/attend", body, 200);
        next[i] = floats_of(j, "output", HEADS * 2 * 64);
        cJSON_Delete(j);
    }
    for (int e = 0; e < HEADS * 2 * 64; e++) {
        expect_near(next[0][e], next[1][e], 0, "the step after a masked one", e);
    }
    /* refusals */
    static const char *const bad[][2] = {
        {",\"head_mask\":[1,1]", "head_mask"},
        {",\"head_mask\":[1,1,1,1,1,1,1,null]", "head_mask"},
        {",\"capture\":[\"q\",\"q\"]", "capture"},
        {",\"capture\":[\"x\"]", "capture"},
        {",\"return_weights\":{\"rows\":[2]}", "return_weights.rows"},
        {",\"return_weights\":{\"kind\":\"lse\",\"extra\":1}", "return_weights.extra"},
        {",\"return_weights\":{\"keys\":[0]}", "return_weights.keys"},
        {",\"return_weights\":{\"heads\":[8]}", "return_weights.heads"},
        {",\"return_weights\":{\"reduce\":\"sum\"}", "return_weights.reduce"},
        {",\"return_weights\":7", "return_weights"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        snprintf(body, cap, "{\"session_id\":\"bad\",\"q\":%s,\"k\":%s,\"v\":%s%s}", qs, ks, vs,
                 bad[i][0]);
        cJSON *j = request(&d_, "POST", "/v1/kv/attend", body, 400);
        const cJSON *e = cJSON_GetObjectItemCaseSensitive(j, "error");
        const char *param = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(e, "param"));
        ck_assert_msg(param != NULL && strcmp(param, bad[i][1]) == 0, "%s: param %s, want %s",
                      bad[i][0], param ? param : "null", bad[i][1]);
        cJSON_Delete(j);
    }
    cJSON *info = request(&d_, "GET", "/v1/sessions/bad", NULL, 404);
    cJSON_Delete(info);
    for (int i = 0; i < 3; i++) {
        free(out[i]);
    }
    free(next[0]);
    free(next[1]);
    free(body);
    free(qs);
    free(ks);
    free(vs);
    cJSON_Delete(q3);
    cJSON_Delete(k3);
    cJSON_Delete(v3);
    cJSON_Delete(qa);
    cJSON_Delete(ka);
    cJSON_Delete(va);
    free(qj);
    free(kj);
    free(vj);
    free(q);
    free(k);
    free(v);
    stop_clean(&d_);
}
END_TEST

/* The JSON text of a call's field. */
static char *field_text(const cJSON *j, const char *name) {
    const cJSON *t = cJSON_GetObjectItemCaseSensitive(j, name);
    ck_assert_msg(t != NULL, "no field %s", name);
    return cJSON_PrintUnformatted(t);
}

/* A row whose score overflows float (head 0's first: 1e40 x scale) has no probabilities: the
 * whole weights give it NaN (null) in every cell, the causally hidden one too, and a selection
 * of its cells must say the same; under max_heads its NaN must not give way to another head's
 * value. Before, the selection gave the hidden cell 0 and max_heads answered head 1's 1. */
START_TEST(test_inspect_api_sdpa_overflowed_row) {
    const char *qkv = "\"q\":[[[1e20,0],[1,0]],[[1,0],[0,1]]],\"k\":[[[1e20,0],[1,0]]],"
                      "\"v\":[[[1,2],[3,4]]],\"causal\":true";
    struct {
        const char *selection, *want;
    } cases[] = {
        {"true", "[[[null,null],[1,0]],[[1,0],[0.5,0.5]]]"},
        {"{\"heads\":[0],\"rows\":[0]}", "[[[null,null]]]"},
        {"{\"rows\":[0],\"reduce\":\"max_heads\"}", "[[null,null]]"},
        {"{\"rows\":[0],\"reduce\":\"mean_heads\"}", "[[null,null]]"},
    };
    char body[512];
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        snprintf(body, sizeof body, "{%s,\"return_weights\":%s}", qkv, cases[i].selection);
        cJSON *j = request(&d_, "POST", "/v1/sdpa", body, 200);
        char *got = field_text(j, "weights");
        ck_assert_msg(strcmp(got, cases[i].want) == 0, "%s: weights %s, want %s",
                      cases[i].selection, got, cases[i].want);
        free(got);
        cJSON_Delete(j);
    }
    stop_clean(&d_);
}
END_TEST

/* /v1/sdpa with a batch: a selection per batch element, the cells of the full weights. */
START_TEST(test_inspect_api_sdpa) {
    const char *qkv = "\"q\":[[[[1,0],[0,1],[1,1]]],[[[0,2],[1,0],[2,1]]]],"
                      "\"k\":[[[[1,0],[0,1],[1,-1]]],[[[1,1],[0,1],[3,0]]]],"
                      "\"v\":[[[[1,2],[3,4],[5,6]]],[[[1,0],[0,1],[1,1]]]],\"causal\":true";
    char body[1024];
    snprintf(body, sizeof body, "{%s,\"return_weights\":true}", qkv);
    cJSON *full = request(&d_, "POST", "/v1/sdpa", body, 200);
    float *w = floats_of(full, "weights", 2 * 1 * 3 * 3);
    snprintf(body, sizeof body, "{%s,\"return_weights\":{\"rows\":[-1],\"keys\":[1,3]}}", qkv);
    cJSON *sel = request(&d_, "POST", "/v1/sdpa", body, 200);
    float *s = floats_of(sel, "weights", 2 * 1 * 1 * 2);
    for (int b = 0; b < 2; b++) {
        for (int k = 0; k < 2; k++) {
            expect_near(s[b * 2 + k], w[b * 9 + 2 * 3 + 1 + k], 1e-7, "sdpa selection", b);
        }
    }
    snprintf(body, sizeof body, "{%s,\"kind\":\"linear\",\"return_weights\":{\"rows\":[0]}}", qkv);
    cJSON_Delete(request(&d_, "POST", "/v1/sdpa", body, 400));
    free(s);
    free(w);
    cJSON_Delete(sel);
    cJSON_Delete(full);
    stop_clean(&d_);
}
END_TEST

/* GET /v1/sessions/{id}/attention: the weights the calls returned, recomputed from the cache,
 * for chosen heads, rows and keys, also after the session went out and came back in; a server
 * without --keep-queries says so. */
START_TEST(test_inspect_api_cached_attention) {
    float *x = http_client_random_rows(9, T, HIDDEN);
    cJSON *a = attend("cached", x, 0, 5, ",\"return_weights\":true,\"layer\":1");
    cJSON *b = attend("cached", x, 5, 2, ",\"return_weights\":true,\"layer\":1");
    float *wa = floats_of(a, "weights", HEADS * 5 * 5),
          *wb = floats_of(b, "weights", HEADS * 2 * T);
    /* the full matrix, as the calls saw it: rows 0-4 from the first, 5-6 from the second */
    char *saved = NULL; /* the session file, with its queries */
    size_t saved_len = 0;
    float want[HEADS * T * T];
    memset(want, 0, sizeof want);
    for (int h = 0; h < HEADS; h++) {
        for (int r = 0; r < T; r++) {
            for (int k = 0; k < T; k++) {
                want[(h * T + r) * T + k] =
                    r < 5 ? (k < 5 ? wa[(h * 5 + r) * 5 + k] : 0.0f) : wb[(h * 2 + r - 5) * T + k];
            }
        }
    }
    for (int pass = 0; pass < 2; pass++) {
        cJSON *g =
            request(&d_, "GET", "/v1/sessions/cached/attention?layer=1&heads=1,6:8", NULL, 200);
        ck_assert_int_eq(cJSON_GetObjectItemCaseSensitive(g, "n_tokens")->valueint, T);
        float *got = floats_of(g, "weights", 3 * T * T);
        static const int heads[3] = {1, 6, 7};
        for (int h = 0; h < 3; h++) {
            for (int i = 0; i < T * T; i++) {
                expect_near(got[h * T * T + i], want[heads[h] * T * T + i], 2e-6,
                            pass == 0 ? "recomputed weights" : "recomputed after import", i);
            }
        }
        free(got);
        cJSON_Delete(g);
        if (pass == 0) {
            /* out and back in: the file carries the queries */
            char u[200];
            snprintf(u, sizeof u, "%s/v1/sessions/cached/export", d_.base);
            struct http_client_response r;
            http_client_request("GET", u, NULL, 0, NULL, &r);
            ck_assert_int_eq(r.status, 200);
            struct http_client_response put;
            snprintf(u, sizeof u, "%s/v1/sessions/cached", d_.base);
            http_client_request("DELETE", u, NULL, 0, NULL, &put);
            ck_assert_int_eq(put.status, 204);
            http_client_response_release(&put);
            snprintf(u, sizeof u, "%s/v1/sessions/cached", d_.base);
            http_client_request("PUT", u, r.body, r.len, NULL, &put);
            ck_assert_msg(put.status == 201, "import: %ld %s", put.status, put.body);
            http_client_response_release(&put);
            saved = malloc(r.len);
            memcpy(saved, r.body, r.len);
            saved_len = r.len;
            http_client_response_release(&r);
        }
    }
    cJSON *g = request(&d_, "GET",
                       "/v1/sessions/cached/attention?layer=1&kind=lse&rows=-1&reduce=mean_heads",
                       NULL, 200);
    float *l = floats_of(g, "lse", 1);
    ck_assert(isfinite(l[0]));
    free(l);
    cJSON_Delete(g);
    /* -0 is 0, as in python: keys=-0: is all of them, heads=-0 the first */
    g = request(&d_, "GET", "/v1/sessions/cached/attention?layer=1&heads=-0&rows=-1&keys=-0:", NULL,
                200);
    char *echo = cJSON_PrintUnformatted(g); /* the resolved selection, at the top level */
    ck_assert_msg(strstr(echo, "\"heads\":[0]") != NULL && strstr(echo, "\"keys\":[0,7]") != NULL,
                  "%s", echo);
    free(echo);
    cJSON_Delete(g);
    static const char *const bad[] = {"?layer=9",          "?layer=1&rows=7",
                                      "?layer=1&keys=5:2", "?heads=9",
                                      "?kind=p",           "?x=1",
                                      "?layer=1&layer=1",  "?layer=+1",
                                      "?layer=%201",       "?layer=1&kind=lse&keys=2:4"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        char path[128];
        snprintf(path, sizeof path, "/v1/sessions/cached/attention%s", bad[i]);
        cJSON_Delete(request(&d_, "GET", path, NULL, 400));
    }
    cJSON_Delete(request(&d_, "GET", "/v1/sessions/none/attention", NULL, 404));
    static const char *const no_args[] = {"--kv-dtype", "f32", NULL};
    http_client_daemon_start(&plain_, no_args);
    cJSON *e = request(&plain_, "GET", "/v1/sessions/cached/attention", NULL, 409);
    const cJSON *err = cJSON_GetObjectItemCaseSensitive(e, "error");
    ck_assert_str_eq(cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(err, "code")),
                     "queries_not_kept");
    cJSON_Delete(e);
    /* a file with queries is not for a server that keeps none */
    char u[200];
    snprintf(u, sizeof u, "%s/v1/sessions/cached", plain_.base);
    struct http_client_response put;
    http_client_request("PUT", u, saved, saved_len, NULL, &put);
    ck_assert_msg(put.status == 409 && strstr(put.body, "fingerprint_mismatch") != NULL &&
                      strstr(put.body, "--keep-queries") != NULL,
                  "import into a plain server: %ld %s", put.status, put.body);
    http_client_response_release(&put);
    free(saved);
    free(wa);
    free(wb);
    cJSON_Delete(a);
    cJSON_Delete(b);
    free(x);
    stop_clean(&plain_);
    stop_clean(&d_);
}
END_TEST

extern Suite *inspect_api_suite(void);

Suite *inspect_api_suite(void) {
    Suite *s = suite_create("inspect_api");
    TCase *tc = tcase_create("inspect_api");
    tcase_set_tags(tc, "server"); /* daemons: not for `make valgrind`'s engine run */
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, test_inspect_api_selection);
    tcase_add_test(tc, test_inspect_api_capture_head_mask);
    tcase_add_test(tc, test_inspect_api_sdpa);
    tcase_add_test(tc, test_inspect_api_sdpa_overflowed_row);
    tcase_add_test(tc, test_inspect_api_cross);
    tcase_add_test(tc, test_inspect_api_cached_attention);
    suite_add_tcase(s, tc);
    return s;
}
