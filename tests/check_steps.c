/* tests/check_steps.c: many sessions' steps in one call (POST /v1/attend with "steps"), through
 * the real attnd (preset tiny, f32 K/V). A batch of decode steps runs as one engine call and
 * answers, step by step and bit for bit, what each session answers when stepped alone; a step
 * that fails (its session evicted, expect_n_past off) fails alone, names its session and leaves
 * it as it was, while the others advance; framed (binary) batches carry every step's tensors in
 * order; a malformed step is a 400 naming steps[i] and runs nothing.
 */
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "http_client.h"

#define HIDDEN  64
#define N_STEPS 6
#define PROMPT  9

static struct http_client_daemon a_, b_;

static void setup(void) {
    memset(&a_, 0, sizeof a_);
    memset(&b_, 0, sizeof b_);
}

static void teardown(void) {
    http_client_daemon_kill(&a_);
    http_client_daemon_kill(&b_);
}

static cJSON *post(const struct http_client_daemon *d, const char *body, long want) {
    char u[200];
    snprintf(u, sizeof u, "%s/v1/attend", d->base);
    struct http_client_response r;
    http_client_request("POST", u, body, strlen(body), NULL, &r);
    ck_assert_msg(r.status == want, "want %ld, got %ld: %s", want, r.status, r.body);
    cJSON *j = http_client_json(&r);
    http_client_response_release(&r);
    return j;
}

/* SIGTERM and a clean exit (under ASan, no leak and no error either). */
static void stop_ok(struct http_client_daemon *d) {
    char *log = http_client_daemon_log(d);
    int status = http_client_daemon_stop(d, 30000);
    ck_assert_msg(status == 0, "attnd exited with %d; log tail: %s", status,
                  strlen(log) > 3000 ? log + strlen(log) - 3000 : log);
    free(log);
}

static double metric(const struct http_client_daemon *d, const char *name) {
    return http_client_metric(d->base, name);
}

/* Session i's prompt, one call per session. */
static void prefill(const struct http_client_daemon *d, float *const *xs) {
    for (int i = 0; i < N_STEPS; i++) {
        char id[16];
        snprintf(id, sizeof id, "s%d", i);
        char *body = http_client_attend_body(id, xs[i], 0, PROMPT, HIDDEN, true, NULL);
        cJSON_Delete(post(d, body, 200));
        free(body);
    }
}

/* The batch body: one decode step for each session, token PROMPT of its stream; `extra` goes
 * at the top level, `bad` (or NULL) replaces step 2's expect_n_past. */
static char *batch_body(float *const *xs, const char *bad, const char *extra) {
    size_t cap = 64 * 1024;
    char *body = malloc(cap);
    size_t n = (size_t)snprintf(body, cap, "{\"layer\":0%s,\"steps\":[", extra);
    for (int i = 0; i < N_STEPS; i++) {
        char *x = http_client_matrix_json(xs[i] + PROMPT * HIDDEN, 1, HIDDEN);
        char expect[16];
        snprintf(expect, sizeof expect, "%d", PROMPT);
        n += (size_t)snprintf(body + n, cap - n,
                              "%s{\"session_id\":\"s%d\",\"x\":%s,\"expect_n_past\":%s}",
                              i > 0 ? "," : "", i, x, i == 2 && bad != NULL ? bad : expect);
        free(x);
    }
    snprintf(body + n, cap - n, "]}");
    return body;
}

/* The output floats of a result (or of an answer). */
static float *output_of(const cJSON *result, size_t *n) {
    return http_client_json_floats(cJSON_GetObjectItemCaseSensitive(result, "output"), n);
}

START_TEST(test_steps_batch_is_one_call_and_equals_steps_alone) {
    const char *args[] = {"--preset", "tiny", "--kv-dtype", "f32", "--workers", "1", NULL};
    http_client_daemon_start(&a_, args);
    http_client_daemon_start(&b_, args);
    float *xs[N_STEPS];
    for (int i = 0; i < N_STEPS; i++) {
        xs[i] = http_client_random_rows(300 + (uint64_t)i, PROMPT + 1, HIDDEN);
    }
    prefill(&a_, xs);
    prefill(&b_, xs);
    double calls = metric(&a_, "attnd_engine_steps_total");
    char *body = batch_body(xs, NULL, "");
    cJSON *got = post(&a_, body, 200);
    free(body);
    ck_assert_double_eq(metric(&a_, "attnd_engine_steps_total"), calls + 1);
    const cJSON *results = cJSON_GetObjectItemCaseSensitive(got, "results");
    ck_assert_int_eq(cJSON_GetArraySize(results), N_STEPS);
    ck_assert_int_eq(cJSON_GetObjectItemCaseSensitive(got, "layer")->valueint, 0);
    for (int i = 0; i < N_STEPS; i++) {
        char id[16];
        snprintf(id, sizeof id, "s%d", i);
        const cJSON *r = cJSON_GetArrayItem(results, i);
        ck_assert_str_eq(cJSON_GetObjectItemCaseSensitive(r, "session_id")->valuestring, id);
        ck_assert_int_eq(cJSON_GetObjectItemCaseSensitive(r, "n_past")->valueint, PROMPT);
        ck_assert_int_eq(cJSON_GetObjectItemCaseSensitive(r, "n_tokens")->valueint, PROMPT + 1);
        /* the same step alone, on the other daemon */
        char extra[64];
        snprintf(extra, sizeof extra, ",\"expect_n_past\":%d", PROMPT);
        char *alone = http_client_attend_body(id, xs[i], PROMPT, 1, HIDDEN, false, extra);
        cJSON *want = post(&b_, alone, 200);
        free(alone);
        size_t ng, nw;
        float *g = output_of(r, &ng), *w = output_of(want, &nw);
        ck_assert_uint_eq(ng, nw);
        /* the engine's batched projections may sum in another order than a single token's:
         * the last bits may differ (check_batch.c holds the engine to the same bound) */
        for (size_t k = 0; k < ng; k++) {
            ck_assert_msg(fabsf(g[k] - w[k]) <= 1e-5f + 1e-5f * fabsf(w[k]),
                          "%s[%zu]: %.9g in the batch, %.9g alone", id, k, (double)g[k],
                          (double)w[k]);
        }
        free(g);
        free(w);
        cJSON_Delete(want);
    }
    cJSON_Delete(got);
    for (int i = 0; i < N_STEPS; i++) {
        free(xs[i]);
    }
    stop_ok(&a_);
    stop_ok(&b_);
}
END_TEST

START_TEST(test_steps_fail_alone) {
    const char *args[] = {"--preset", "tiny", "--kv-dtype", "f32", NULL};
    http_client_daemon_start(&a_, args);
    float *xs[N_STEPS];
    for (int i = 0; i < N_STEPS; i++) {
        xs[i] = http_client_random_rows(400 + (uint64_t)i, PROMPT + 1, HIDDEN);
    }
    prefill(&a_, xs);
    /* step 2 expects the wrong length: 409 for it, the others advance */
    char *body = batch_body(xs, "7", "");
    cJSON *got = post(&a_, body, 200);
    free(body);
    const cJSON *results = cJSON_GetObjectItemCaseSensitive(got, "results");
    for (int i = 0; i < N_STEPS; i++) {
        const cJSON *r = cJSON_GetArrayItem(results, i);
        const cJSON *e = cJSON_GetObjectItemCaseSensitive(r, "error");
        char id[16];
        snprintf(id, sizeof id, "s%d", i);
        ck_assert_str_eq(cJSON_GetObjectItemCaseSensitive(r, "session_id")->valuestring, id);
        if (i == 2) {
            ck_assert_ptr_nonnull(e);
            ck_assert_int_eq(cJSON_GetObjectItemCaseSensitive(r, "status")->valueint, 409);
            ck_assert_str_eq(cJSON_GetObjectItemCaseSensitive(e, "code")->valuestring,
                             "n_past_mismatch");
        } else {
            ck_assert_ptr_null(e);
            ck_assert_int_eq(cJSON_GetObjectItemCaseSensitive(r, "n_tokens")->valueint, PROMPT + 1);
        }
    }
    cJSON_Delete(got);
    /* s2 is as it was: its own step still fits at PROMPT */
    char *again =
        http_client_attend_body("s2", xs[2], PROMPT, 1, HIDDEN, false, ",\"expect_n_past\":9");
    cJSON_Delete(post(&a_, again, 200));
    free(again);
    /* an evicted session among live ones: 410 for it alone */
    char u[128];
    snprintf(u, sizeof u, "%s/v1/sessions/s0", a_.base);
    struct http_client_response r;
    http_client_request("DELETE", u, NULL, 0, NULL, &r);
    ck_assert_int_eq(r.status, 204);
    http_client_response_release(&r);
    const char *mixed = "{\"steps\":[{\"session_id\":\"s1\",\"x\":[[%s]],\"expect_n_past\":10},"
                        "{\"session_id\":\"s0\",\"x\":[[%s]],\"expect_n_past\":10}]}";
    char row[HIDDEN * 4];
    size_t at = 0;
    for (int c = 0; c < HIDDEN; c++) {
        at += (size_t)snprintf(row + at, sizeof row - at, c > 0 ? ",0.5" : "0.5");
    }
    char *b2 = malloc(strlen(mixed) + 2 * at + 1);
    sprintf(b2, mixed, row, row);
    got = post(&a_, b2, 200);
    free(b2);
    results = cJSON_GetObjectItemCaseSensitive(got, "results");
    ck_assert_ptr_null(cJSON_GetObjectItemCaseSensitive(cJSON_GetArrayItem(results, 0), "error"));
    const cJSON *r1 = cJSON_GetArrayItem(results, 1);
    /* s0 was deleted, so it starts again empty: expect_n_past 10 says that is not what the
     * runner meant */
    ck_assert_int_eq(cJSON_GetObjectItemCaseSensitive(r1, "status")->valueint, 409);
    cJSON_Delete(got);
    for (int i = 0; i < N_STEPS; i++) {
        free(xs[i]);
    }
}
END_TEST

/* Under --max-sessions, a step that makes a new session evicts the least recently used idle
 * one, never a session a later step of the same call continues (it was idle only because its
 * step had not been admitted yet): both steps run, an uninvolved session goes. */
START_TEST(test_steps_new_session_spares_the_others) {
    const char *args[] = {"--preset", "tiny", "--kv-dtype", "f32", "--max-sessions", "3", NULL};
    http_client_daemon_start(&a_, args);
    float *xs[N_STEPS];
    for (int i = 0; i < N_STEPS; i++) {
        xs[i] = http_client_random_rows(700 + (uint64_t)i, PROMPT + 1, HIDDEN);
    }
    /* s1 first (the least recently used), then s0 and s2 */
    static const int order[] = {1, 0, 2};
    for (int k = 0; k < 3; k++) {
        char id[16];
        snprintf(id, sizeof id, "s%d", order[k]);
        char *body = http_client_attend_body(id, xs[order[k]], 0, PROMPT, HIDDEN, true, NULL);
        cJSON_Delete(post(&a_, body, 200));
        free(body);
    }
    char *x3 = http_client_matrix_json(xs[3], 1, HIDDEN);
    char *x1 = http_client_matrix_json(xs[1] + PROMPT * HIDDEN, 1, HIDDEN);
    size_t cap = strlen(x3) + strlen(x1) + 256;
    char *body = malloc(cap);
    snprintf(body, cap,
             "{\"steps\":[{\"session_id\":\"s3\",\"x\":%s},{\"session_id\":\"s1\",\"x\":%s,"
             "\"expect_n_past\":%d}]}",
             x3, x1, PROMPT);
    cJSON *got = post(&a_, body, 200);
    const cJSON *results = cJSON_GetObjectItemCaseSensitive(got, "results");
    for (int i = 0; i < 2; i++) {
        const cJSON *r = cJSON_GetArrayItem(results, i);
        ck_assert_msg(cJSON_GetObjectItemCaseSensitive(r, "error") == NULL, "step %d failed", i);
    }
    cJSON_Delete(got);
    char u[128];
    snprintf(u, sizeof u, "%s/v1/sessions/s0", a_.base);
    struct http_client_response r;
    http_client_request("GET", u, NULL, 0, NULL, &r);
    ck_assert_int_eq(r.status, 410); /* the uninvolved one, the least recently used left */
    http_client_response_release(&r);
    free(body);
    free(x1);
    free(x3);
    for (int i = 0; i < N_STEPS; i++) {
        free(xs[i]);
    }
    stop_ok(&a_);
}
END_TEST

/* A step does not evict a session of its own call: with the steps in separate engine calls
 * (--max-batch-tokens), A's step took the pool's last free block and answered, and B's step
 * then evicted A (idle once its step was done) to make room: the call answered 200 for A, whose
 * next call got 410 (found by an outside audit). The steps' sessions now stay pinned until the
 * call has answered: B's step gets 507 and both sessions stay. */
START_TEST(test_steps_spare_their_own_sessions) {
    const char *args[] = {"--preset",
                          "tiny",
                          "--kv-dtype",
                          "f32",
                          "--kv-budget-mb",
                          "1",
                          "--layers",
                          "0",
                          "--kv-block-tokens",
                          "16",
                          "--max-batch-tokens",
                          "16",
                          "--max-seq",
                          "4096",
                          NULL};
    http_client_daemon_start(&a_, args);
    /* 1 MiB of 16-token blocks of 256 bytes a token: 256 blocks; A and B take 255 */
    float *x = http_client_random_rows(900, 512, HIDDEN);
    static const char *const ids[] = {"A", "B"};
    static const int32_t lens[] = {2048, 2032};
    for (int i = 0; i < 2; i++) {
        for (int32_t done = 0; done < lens[i]; done += 512) {
            int32_t t = lens[i] - done < 512 ? lens[i] - done : 512;
            char *body = http_client_attend_body(ids[i], x, 0, t, HIDDEN, true, NULL);
            cJSON_Delete(post(&a_, body, 200));
            free(body);
        }
    }
    char *xa = http_client_matrix_b64(x, 16, HIDDEN),
         *xb = http_client_matrix_b64(x + 16, 16, HIDDEN);
    size_t cap = strlen(xa) + strlen(xb) + 128;
    char *body = malloc(cap);
    snprintf(body, cap,
             "{\"steps\":[{\"session_id\":\"A\",\"x\":%s},{\"session_id\":\"B\",\"x\":%s}]}", xa,
             xb);
    cJSON *got = post(&a_, body, 200);
    const cJSON *results = cJSON_GetObjectItemCaseSensitive(got, "results");
    const cJSON *ra = cJSON_GetArrayItem(results, 0), *rb = cJSON_GetArrayItem(results, 1);
    ck_assert_msg(cJSON_GetObjectItemCaseSensitive(ra, "error") == NULL, "A's step failed");
    const cJSON *eb = cJSON_GetObjectItemCaseSensitive(rb, "error");
    ck_assert_msg(eb != NULL, "B's step ran: it must have evicted a session");
    ck_assert_str_eq(cJSON_GetObjectItemCaseSensitive(eb, "code")->valuestring,
                     "kv_budget_exhausted");
    cJSON_Delete(got);
    for (int i = 0; i < 2; i++) {
        char u[128];
        snprintf(u, sizeof u, "%s/v1/sessions/%s", a_.base, ids[i]);
        struct http_client_response r;
        http_client_request("GET", u, NULL, 0, NULL, &r);
        ck_assert_msg(r.status == 200, "session %s: %ld", ids[i], r.status);
        http_client_response_release(&r);
    }
    free(body);
    free(xa);
    free(xb);
    free(x);
    stop_ok(&a_);
}
END_TEST

/* POSTs a framed body (its first hl bytes the JSON, raw tensors after) to a_'s /v1/attend and
 * expects 200; returns the answer's JSON length (its raw tensors follow in *r). */
static size_t post_framed(const char *body, size_t hl, size_t len, struct http_client_response *r) {
    char u[128], h[80];
    snprintf(u, sizeof u, "%s/v1/attend", a_.base);
    snprintf(h, sizeof h, "Inference-Header-Content-Length: %zu", hl);
    const char *hdrs[] = {h, NULL};
    http_client_request("POST", u, body, len, hdrs, r);
    ck_assert_msg(r->status == 200, "%ld %s", r->status, r->body);
    char n[32];
    return (size_t)strtoull(http_client_header(r, "Inference-Header-Content-Length", n, sizeof n),
                            NULL, 10);
}

START_TEST(test_steps_binary_and_malformed) {
    const char *args[] = {"--preset", "tiny", "--kv-dtype", "f32", NULL};
    http_client_daemon_start(&a_, args);
    float *x = http_client_random_rows(500, 3, HIDDEN);
    /* two stateless steps, framed both ways: the raw parts follow in step order */
    const char *head = "{\"binary_output\":true,\"steps\":["
                       "{\"x\":{\"shape\":[1,64],\"binary_data_size\":256}},"
                       "{\"x\":{\"shape\":[2,64],\"binary_data_size\":512},"
                       "\"return_weights\":true}]}";
    size_t hl = strlen(head), len = hl + 3 * HIDDEN * 4;
    char *body = malloc(len);
    memcpy(body, head, hl);
    memcpy(body + hl, x, 3 * HIDDEN * 4);
    struct http_client_response r;
    size_t json_len = post_framed(body, hl, len, &r);
    /* output 1x64, then output 2x64 and weights 4x2x2 */
    ck_assert_uint_eq(r.len, json_len + (64 + 128 + 16) * 4);
    /* the second step's output, against the same step in JSON */
    char *alone = http_client_attend_body(NULL, x + HIDDEN, 0, 2, HIDDEN, true, NULL);
    cJSON *want = post(&a_, alone, 200);
    size_t nw;
    float *w = output_of(want, &nw);
    ck_assert_uint_eq(nw, 128);
    float got[128];
    memcpy(got, r.body + json_len + 64 * 4, sizeof got);
    for (int k = 0; k < 128; k++) {
        ck_assert_msg(fabsf(got[k] - w[k]) <= 1e-5f + 1e-5f * fabsf(w[k]), "[%d]: %.9g vs %.9g", k,
                      (double)got[k], (double)w[k]);
    }
    free(w);
    cJSON_Delete(want);
    free(alone);
    http_client_response_release(&r);
    free(body);
    /* malformed steps: named, nothing runs */
    const char *bad[][2] = {
        {"{\"steps\":[{\"session_id\":\"q\",\"x\":[[1]]}]}", "steps[0].x"},
        {"{\"steps\":[{\"session_id\":\"q\",\"layer\":1,\"x\":[[1]]}]}", "steps[0].layer"},
        {"{\"steps\":[{\"session_id\":\"q\"}]}", "steps[0].x"},
        {"{\"steps\":{}}", "steps"},
        {"{\"steps\":[],\"session_id\":\"q\"}", "steps"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        cJSON *e = post(&a_, bad[i][0], 400);
        const cJSON *p =
            cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(e, "error"), "param");
        ck_assert_msg(cJSON_IsString(p) && strcmp(p->valuestring, bad[i][1]) == 0, "%s: %s",
                      bad[i][0], cJSON_PrintUnformatted(e));
        cJSON_Delete(e);
    }
    /* a step's row outside its own rows is known from the body: the body fails, naming the
     * step, and step 0 does not run (it used to, with step 1 failing alone at run time) */
    char *x1 = http_client_matrix_json(x, 1, HIDDEN);
    char rows_body[4096];
    snprintf(rows_body, sizeof rows_body,
             "{\"steps\":[{\"session_id\":\"q\",\"x\":%s},{\"session_id\":\"q2\",\"x\":%s,"
             "\"return_weights\":{\"rows\":[1]}}]}",
             x1, x1);
    free(x1);
    cJSON *e = post(&a_, rows_body, 400);
    const cJSON *p =
        cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(e, "error"), "param");
    ck_assert_str_eq(cJSON_GetStringValue(p), "steps[1].return_weights.rows");
    cJSON_Delete(e);
    char u[128];
    snprintf(u, sizeof u, "%s/v1/sessions/q", a_.base);
    http_client_request("GET", u, NULL, 0, NULL, &r);
    ck_assert_int_eq(r.status, 404);
    http_client_response_release(&r);
    free(x);
    stop_ok(&a_);
}
END_TEST

/* return_weights' limit holds for a whole response: steps that each fit alone (tiny: 4 heads
 * x 1024 x 1024 values) fit together up to the limit (four of them exactly), and the step that
 * would pass it fails alone, naming return_weights, its session left unmade. */
START_TEST(test_steps_weights_limit_is_per_response) {
    const char *args[] = {"--preset", "tiny", "--kv-dtype", "f32", NULL};
    http_client_daemon_start(&a_, args);
    enum { T = 1024, STEPS = 5 };
    float *x = http_client_random_rows(600, T, HIDDEN);
    char head[1024];
    size_t hl = (size_t)snprintf(head, sizeof head, "{\"binary_output\":true,\"steps\":[");
    for (int i = 0; i < STEPS; i++) {
        hl += (size_t)snprintf(head + hl, sizeof head - hl,
                               "%s{\"session_id\":\"w%d\",\"x\":{\"shape\":[%d,%d],"
                               "\"binary_data_size\":%d},\"return_weights\":true}",
                               i > 0 ? "," : "", i, T, HIDDEN, T * HIDDEN * 4);
    }
    hl += (size_t)snprintf(head + hl, sizeof head - hl, "]}");
    size_t part = (size_t)T * HIDDEN * 4, len = hl + STEPS * part;
    char *body = malloc(len);
    memcpy(body, head, hl);
    for (int i = 0; i < STEPS; i++) {
        memcpy(body + hl + i * part, x, part);
    }
    struct http_client_response r;
    size_t json_len = post_framed(body, hl, len, &r);
    cJSON *got = cJSON_ParseWithLength(r.body, json_len);
    ck_assert_ptr_nonnull(got);
    const cJSON *results = cJSON_GetObjectItemCaseSensitive(got, "results");
    int n_failed = 0, failed = -1;
    for (int i = 0; i < STEPS; i++) {
        const cJSON *res = cJSON_GetArrayItem(results, i);
        const cJSON *e = cJSON_GetObjectItemCaseSensitive(res, "error");
        if (e != NULL) {
            n_failed++;
            failed = i;
            ck_assert_int_eq(cJSON_GetObjectItemCaseSensitive(res, "status")->valueint, 400);
            ck_assert_str_eq(cJSON_GetObjectItemCaseSensitive(e, "param")->valuestring,
                             "return_weights");
        } else {
            ck_assert_ptr_nonnull(cJSON_GetObjectItemCaseSensitive(res, "weights"));
        }
    }
    ck_assert_int_eq(n_failed, 1);
    /* four steps' outputs and weights, nothing of the fifth's */
    ck_assert_uint_eq(r.len, json_len + (STEPS - 1) * ((size_t)T * HIDDEN + 4 * (size_t)T * T) * 4);
    cJSON_Delete(got);
    http_client_response_release(&r);
    char u[128];
    snprintf(u, sizeof u, "%s/v1/sessions/w%d", a_.base, failed);
    http_client_request("GET", u, NULL, 0, NULL, &r);
    ck_assert_int_eq(r.status, 404);
    http_client_response_release(&r);
    free(body);
    free(x);
    stop_ok(&a_);
}
END_TEST

/* A client that goes while its batch runs: every step still finishes or stops, each session
 * holds whole steps only, and the daemon serves on (under ASan: nothing touches a freed batch). */
START_TEST(test_steps_client_gone) {
    const char *args[] = {"--preset", "tiny", "--kv-dtype", "f32", "--workers", "1", NULL};
    http_client_daemon_start(&a_, args);
    float *x = http_client_random_rows(600, 256, HIDDEN);
    char *big = http_client_attend_body("g0", x, 0, 256, HIDDEN, true, NULL);
    char *one = http_client_attend_body("g1", x, 0, 1, HIDDEN, true, NULL);
    /* two steps: a 256-token prefill and a decode-sized one */
    const char *xb = strstr(big, "\"x\":"), *xo = strstr(one, "\"x\":");
    size_t cap = strlen(big) + strlen(one) + 128;
    char *body = malloc(cap);
    snprintf(body, cap, "{\"steps\":[{\"session_id\":\"g0\",%.*s},{\"session_id\":\"g1\",%.*s}]}",
             (int)(strlen(xb) - 1), xb, (int)(strlen(xo) - 1), xo);
    for (int round = 0; round < 5; round++) {
        size_t n = strlen(body);
        char *req = malloc(n + 256);
        int len = snprintf(req, n + 256,
                           "POST /v1/attend HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: "
                           "application/json\r\nContent-Length: %zu\r\n\r\n%s",
                           n, body);
        int fd = http_client_raw_send(a_.port, req, (size_t)len, 0);
        free(req);
        http_client_sleep_ms(round * 3);
        close(fd);
    }
    /* the daemon is alive, and the sessions hold whole calls (multiples of their steps) */
    char u[128];
    struct http_client_response r;
    for (int tries = 0; tries < 100; tries++) {
        snprintf(u, sizeof u, "%s/healthz", a_.base);
        http_client_request("GET", u, NULL, 0, NULL, &r);
        long st = r.status;
        http_client_response_release(&r);
        if (st == 200 && metric(&a_, "attnd_jobs_in_flight") == 0 &&
            metric(&a_, "attnd_queue_depth") == 0) {
            break;
        }
        http_client_sleep_ms(50);
    }
    snprintf(u, sizeof u, "%s/v1/sessions/g1", a_.base);
    http_client_request("GET", u, NULL, 0, NULL, &r);
    if (r.status == 200) {
        cJSON *j = http_client_json(&r);
        ck_assert_int_le(cJSON_GetObjectItemCaseSensitive(j, "n_tokens")->valueint, 5);
        cJSON_Delete(j);
    }
    http_client_response_release(&r);
    free(body);
    free(big);
    free(one);
    free(x);
    stop_ok(&a_);
}
END_TEST

extern Suite *steps_suite(void);

Suite *steps_suite(void) {
    Suite *s = suite_create("steps");
    TCase *tc = tcase_create("batch");
    tcase_set_tags(tc, "server");
    tcase_set_timeout(tc, 60);
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_add_test(tc, test_steps_batch_is_one_call_and_equals_steps_alone);
    tcase_add_test(tc, test_steps_fail_alone);
    tcase_add_test(tc, test_steps_new_session_spares_the_others);
    tcase_add_test(tc, test_steps_spare_their_own_sessions);
    tcase_add_test(tc, test_steps_binary_and_malformed);
    tcase_add_test(tc, test_steps_client_gone);
    tcase_add_test(tc, test_steps_weights_limit_is_per_response);
    suite_add_tcase(s, tc);
    return s;
}
