/* tests/check_kv_attend.c: POST /v1/kv/attend, attention on the caller's projections, through
 * the real attnd, on a server of geometry alone (--geometry) and on one with weights. A
 * session's q/k/v fed in chunks answers what /v1/sdpa answers for the whole causal sequence
 * (with the model's RoPE when asked, against ref.c's rotation); the session endpoints (fork,
 * truncate, export/import) work on these caches; binary tensors and batches work as for x;
 * what does not fit is a 400 naming it, and a bad --geometry stops the start with one line.
 */
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "http_client.h"
#include "ref.h"

#define H  4
#define HK 2
#define HD 16
#define T  9

static struct http_client_daemon d_;

static void setup(void) {
    memset(&d_, 0, sizeof d_);
}

static void teardown(void) {
    http_client_daemon_kill(&d_);
}

static cJSON *post(const char *path, const char *body, long want) {
    char u[200];
    snprintf(u, sizeof u, "%s%s", d_.base, path);
    struct http_client_response r;
    http_client_request("POST", u, body, strlen(body), NULL, &r);
    ck_assert_msg(r.status == want, "%s: want %ld, got %ld: %s", path, want, r.status, r.body);
    cJSON *j = http_client_json(&r);
    http_client_response_release(&r);
    return j;
}

/* POSTs body to path expecting status, and the error's field (code or param) to be want. */
static void expect_error(const char *path, const char *body, long status, const char *field,
                         const char *want) {
    cJSON *e = post(path, body, status);
    const cJSON *v =
        cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(e, "error"), field);
    ck_assert_msg(cJSON_IsString(v) && strcmp(v->valuestring, want) == 0, "%s: want %s %s", path,
                  field, want);
    cJSON_Delete(e);
}

/* A (heads, n, HD) slice [first, first + n) of a (heads, T, HD) tensor as JSON (malloc'd). */
static char *heads_json(const float *a, int heads, int first, int n) {
    size_t cap = (size_t)heads * n * HD * 18 + 64, at = 0;
    char *s = malloc(cap);
    s[at++] = '[';
    for (int h = 0; h < heads; h++) {
        char *m = http_client_matrix_json(a + ((size_t)h * T + first) * HD, n, HD);
        at += (size_t)snprintf(s + at, cap - at, "%s%s", h > 0 ? "," : "", m);
        free(m);
    }
    snprintf(s + at, cap - at, "]");
    return s;
}

static char *qkv_body(const char *session, const float *q, const float *k, const float *v,
                      int first, int n, const char *extra) {
    char *qj = heads_json(q, H, first, n), *kj = heads_json(k, HK, first, n),
         *vj = heads_json(v, HK, first, n);
    size_t cap = strlen(qj) + strlen(kj) + strlen(vj) + 256;
    char *b = malloc(cap);
    snprintf(b, cap, "{\"session_id\":\"%s\",\"q\":%s,\"k\":%s,\"v\":%s%s}", session, qj, kj, vj,
             extra);
    free(qj);
    free(kj);
    free(vj);
    return b;
}

static float *randoms(uint64_t seed, int heads) {
    return http_client_random_rows(seed, heads * T, HD);
}

/* out (H, T, HD) of a session fed in chunks 5, 1, 3. */
static void feed(const char *session, const float *q, const float *k, const float *v,
                 const char *extra, float *out) {
    static const int chunks[] = {5, 1, 3};
    int first = 0;
    for (int c = 0; c < 3; c++) {
        char ex[128];
        snprintf(ex, sizeof ex, ",\"expect_n_past\":%d%s", first, extra);
        char *b = qkv_body(session, q, k, v, first, chunks[c], ex);
        cJSON *j = post("/v1/kv/attend", b, 200);
        free(b);
        size_t n;
        float *o = http_client_json_floats(cJSON_GetObjectItemCaseSensitive(j, "output"), &n);
        ck_assert_uint_eq(n, (size_t)H * chunks[c] * HD);
        for (int h = 0; h < H; h++) {
            memcpy(out + ((size_t)h * T + first) * HD, o + (size_t)h * chunks[c] * HD,
                   (size_t)chunks[c] * HD * sizeof(float));
        }
        free(o);
        cJSON_Delete(j);
        first += chunks[c];
    }
}

/* /v1/sdpa over the whole sequence, causal. */
static float *sdpa(const float *q, const float *k, const float *v) {
    char *qj = heads_json(q, H, 0, T), *kj = heads_json(k, HK, 0, T), *vj = heads_json(v, HK, 0, T);
    size_t cap = strlen(qj) + strlen(kj) + strlen(vj) + 128;
    char *b = malloc(cap);
    snprintf(b, cap, "{\"q\":%s,\"k\":%s,\"v\":%s,\"causal\":true}", qj, kj, vj);
    cJSON *j = post("/v1/sdpa", b, 200);
    size_t n;
    float *o = http_client_json_floats(cJSON_GetObjectItemCaseSensitive(j, "output"), &n);
    ck_assert_uint_eq(n, (size_t)H * T * HD);
    cJSON_Delete(j);
    free(b);
    free(qj);
    free(kj);
    free(vj);
    return o;
}

static void expect_close(const float *got, const float *want, size_t n, const char *what) {
    for (size_t i = 0; i < n; i++) {
        ck_assert_msg(fabsf(got[i] - want[i]) <= 1e-5f + 1e-4f * fabsf(want[i]),
                      "%s[%zu]: %.9g vs %.9g", what, i, (double)got[i], (double)want[i]);
    }
}

/* ref.c's RoPE (half style, theta 10000) on a (heads, T, HD) tensor at positions 0.. */
static void rotate(float *a, int heads) {
    attn_config c;
    memset(&c, 0, sizeof c);
    c.n_heads = H;
    c.n_kv_heads = HK;
    c.head_dim = HD;
    c.hidden_size = H * HD;
    c.rope_theta = 10000.0f;
    double inv[HD / 2], vec[HD];
    ref_rope_inv_freq(&c, inv);
    for (int i = 0; i < heads * T; i++) {
        for (int d = 0; d < HD; d++) {
            vec[d] = a[(size_t)i * HD + d];
        }
        ref_rope_rotate(&c, inv, i % T, vec);
        for (int d = 0; d < HD; d++) {
            a[(size_t)i * HD + d] = (float)vec[d];
        }
    }
}

START_TEST(test_kv_attend_geometry_matches_sdpa) {
    const char *args[] = {"--geometry", "heads=4,kv_heads=2,head_dim=16,layers=2,max_positions=256",
                          "--kv-dtype", "f32", NULL};
    http_client_daemon_start(&d_, args);
    float *q = randoms(1, H), *k = randoms(2, HK), *v = randoms(3, HK);
    float *got = malloc((size_t)H * T * HD * sizeof(float));
    feed("plain", q, k, v, "", got);
    float *want = sdpa(q, k, v);
    expect_close(got, want, (size_t)H * T * HD, "no rope");
    free(want);
    feed("rotated", q, k, v, ",\"rope\":true", got);
    rotate(q, H);
    rotate(k, HK);
    want = sdpa(q, k, v);
    expect_close(got, want, (size_t)H * T * HD, "rope");
    free(want);
    /* x has no weights to go through here */
    cJSON_Delete(post("/v1/attend", "{\"x\":[[0]]}", 400));
    free(got);
    free(q);
    free(k);
    free(v);
}
END_TEST

/* a (the answer to one token at position n - 1) against a fresh session fed all n tokens at
 * once, named fresh: a cache continued as if it had been built in one go. */
static void expect_like_fresh(const cJSON *a, const char *fresh, const float *q, const float *k,
                              const float *v, int n, const char *what) {
    char *b = qkv_body(fresh, q, k, v, 0, n, "");
    cJSON *f = post("/v1/kv/attend", b, 200);
    free(b);
    size_t na, nf;
    float *oa = http_client_json_floats(cJSON_GetObjectItemCaseSensitive(a, "output"), &na);
    float *of = http_client_json_floats(cJSON_GetObjectItemCaseSensitive(f, "output"), &nf);
    for (int h = 0; h < H; h++) {
        expect_close(oa + (size_t)h * HD, of + ((size_t)h * n + n - 1) * HD, HD, what);
    }
    free(oa);
    free(of);
    cJSON_Delete(f);
}

/* A value past an f16 cache's range: 400 kv_out_of_range and nothing appended (the session
 * continues from where it was, as a fresh feed would), alone or as one of several steps. */
START_TEST(test_kv_attend_value_past_the_cache_dtype) {
    const char *args[] = {"--preset", "tiny", "--kv-dtype", "f16", NULL};
    http_client_daemon_start(&d_, args);
    float *q = randoms(21, H), *k = randoms(22, HK), *v = randoms(23, HK);
    float *big = randoms(24, HK);
    for (int i = 0; i < HK * T * HD; i++) {
        big[i] *= 1e6f;
    }
    char *b = qkv_body("s", q, k, v, 0, 5, "");
    cJSON_Delete(post("/v1/kv/attend", b, 200));
    free(b);
    b = qkv_body("s", q, k, big, 5, 1, ",\"expect_n_past\":5");
    expect_error("/v1/kv/attend", b, 400, "code", "kv_out_of_range");
    free(b);
    b = qkv_body("s", q, k, v, 5, 1, ",\"expect_n_past\":5");
    cJSON *a = post("/v1/kv/attend", b, 200);
    free(b);
    expect_like_fresh(a, "fresh", q, k, v, 6, "after the refusal");
    cJSON_Delete(a);
    free(big);
    free(v);
    free(k);
    free(q);
    ck_assert_int_eq(http_client_daemon_stop(&d_, 10000), 0);
}
END_TEST

/* On a model with weights: the session endpoints work on q/k/v caches. */
START_TEST(test_kv_attend_sessions) {
    const char *args[] = {"--preset", "tiny", "--kv-dtype", "f32", NULL};
    http_client_daemon_start(&d_, args);
    float *q = randoms(11, H), *k = randoms(12, HK), *v = randoms(13, HK);
    char *b = qkv_body("s", q, k, v, 0, 6, "");
    cJSON_Delete(post("/v1/kv/attend", b, 200));
    free(b);
    cJSON_Delete(post("/v1/sessions/s/fork", "{\"new_id\":\"c\"}", 201));
    cJSON_Delete(post("/v1/sessions/s/truncate", "{\"n_tokens\":4}", 200));
    /* the copy continues from 6, the original from 4: each as a fresh feed would */
    b = qkv_body("c", q, k, v, 6, 1, ",\"expect_n_past\":6");
    cJSON *a = post("/v1/kv/attend", b, 200);
    free(b);
    b = qkv_body("s", q, k, v, 4, 1, ",\"expect_n_past\":4");
    cJSON_Delete(post("/v1/kv/attend", b, 200));
    free(b);
    expect_like_fresh(a, "fresh", q, k, v, 7, "fork");
    cJSON_Delete(a);
    /* mistakes: T disagrees, no session, x here, q on /v1/attend */
    char *qj = heads_json(q, H, 0, 2), *kj = heads_json(k, HK, 0, 3), *vj = heads_json(v, HK, 0, 2);
    char *bad = malloc(strlen(qj) + strlen(kj) + strlen(vj) + 128);
    sprintf(bad, "{\"session_id\":\"s\",\"q\":%s,\"k\":%s,\"v\":%s}", qj, kj, vj);
    expect_error("/v1/kv/attend", bad, 400, "param", "k");
    sprintf(bad, "{\"q\":%s,\"k\":%s,\"v\":%s}", qj, vj, vj);
    cJSON_Delete(post("/v1/kv/attend", bad, 400));
    /* ... unless X-Session-Id names it, as on /v1/attend */
    char u[200];
    snprintf(u, sizeof u, "%s/v1/kv/attend", d_.base);
    const char *hdr[] = {"X-Session-Id: h", NULL};
    struct http_client_response r;
    http_client_request("POST", u, bad, strlen(bad), hdr, &r);
    ck_assert_msg(r.status == 200, "header only: %ld %s", r.status, r.body);
    cJSON *j = http_client_json(&r);
    ck_assert_str_eq(cJSON_GetObjectItemCaseSensitive(j, "session_id")->valuestring, "h");
    ck_assert_int_eq(cJSON_GetObjectItemCaseSensitive(j, "n_past")->valueint, 0);
    cJSON_Delete(j);
    http_client_response_release(&r);
    sprintf(bad, "{\"session_id\":\"s\",\"q\":%s,\"k\":%s,\"v\":%s}", qj, vj, vj);
    http_client_request("POST", u, bad, strlen(bad), hdr, &r);
    ck_assert_msg(r.status == 400 && strstr(r.body, "\"param\":\"session_id\"") != NULL,
                  "header and body differ: %ld %s", r.status, r.body);
    http_client_response_release(&r);
    cJSON_Delete(post("/v1/kv/attend", "{\"session_id\":\"s\",\"x\":[[0]]}", 400));
    sprintf(bad, "{\"q\":%s,\"x\":[[0]]}", qj);
    cJSON_Delete(post("/v1/attend", bad, 400));
    /* positions without "rope": true would enter nothing: refused, not ignored */
    sprintf(bad, "{\"session_id\":\"s\",\"q\":%s,\"k\":%s,\"v\":%s,\"positions\":[3,9]}", qj, vj,
            vj);
    expect_error("/v1/kv/attend", bad, 400, "param", "positions");
    /* a step without its session: the whole call refused, naming the step, nothing applied */
    bad = realloc(bad, 2 * (strlen(qj) + 2 * strlen(vj)) + 256);
    sprintf(bad,
            "{\"steps\":[{\"session_id\":\"m1\",\"q\":%s,\"k\":%s,\"v\":%s},{\"q\":%s,\"k\":%s,"
            "\"v\":%s}]}",
            qj, vj, vj, qj, vj, vj);
    expect_error("/v1/kv/attend", bad, 400, "param", "steps[1].session_id");
    snprintf(u, sizeof u, "%s/v1/sessions/m1", d_.base);
    http_client_request("GET", u, NULL, 0, NULL, &r);
    ck_assert_int_eq(r.status, 404);
    http_client_response_release(&r);
    free(bad);
    free(qj);
    free(kj);
    free(vj);
    free(q);
    free(k);
    free(v);
}
END_TEST

START_TEST(test_kv_attend_bad_geometry_stops_the_start) {
    const char *cases[][3] = {
        {"--geometry", "heads=4,kv_heads=3,head_dim=16,layers=2", "not a valid attention"},
        {"--geometry", "heads=4,head_dim=16,layers=2", "kv_heads is required"},
        {"--geometry", "heads=4,kv_heads=2,head_dim=16,layers=2,colour=3", "'colour=3'"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        const char *args[] = {cases[i][0], cases[i][1], NULL};
        char *log = NULL;
        int status = http_client_daemon_run(args, 10000, &log);
        ck_assert_msg(status == 2 && strstr(log, cases[i][2]) != NULL, "%s: status %d: %s",
                      cases[i][1], status, log);
        free(log);
    }
    const char *both[] = {"--geometry", "heads=4,kv_heads=2,head_dim=16,layers=2", "--model",
                          "tests/data/llama", NULL};
    char *log = NULL;
    int status = http_client_daemon_run(both, 10000, &log);
    ck_assert_msg(status == 2 && strstr(log, "not with --model") != NULL, "%d: %s", status, log);
    free(log);
    /* layers the geometry does not have are named as for a preset (the line blamed the
     * geometry: "--geometry heads=...: invalid argument") */
    const char *layers[] = {"--geometry", "heads=4,kv_heads=2,head_dim=16,layers=2", "--layers",
                            "1-2", NULL};
    status = http_client_daemon_run(layers, 10000, &log);
    ck_assert_msg(status == 1 && strstr(log, "attnd: --layers 1-2: --geometry has layers 0-1\n"),
                  "%d: %s", status, log);
    free(log);
}
END_TEST

extern Suite *kvattend_suite(void);

Suite *kvattend_suite(void) {
    Suite *s = suite_create("kvattend");
    TCase *tc = tcase_create("qkv");
    tcase_set_tags(tc, "server");
    tcase_set_timeout(tc, 60);
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_add_test(tc, test_kv_attend_geometry_matches_sdpa);
    tcase_add_test(tc, test_kv_attend_sessions);
    tcase_add_test(tc, test_kv_attend_value_past_the_cache_dtype);
    tcase_add_test(tc, test_kv_attend_bad_geometry_stops_the_start);
    suite_add_tcase(s, tc);
    return s;
}
