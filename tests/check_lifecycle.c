/* tests/check_lifecycle.c: a session's caches while a job uses them. Each test starts the real
 * attnd, runs a long first prefill on one session and, while a worker writes that session's
 * still-empty cache, sends it everything that could free or change a cache: requests refused at
 * the queue (429), over the size limit (413), invalid (400), abandoned by their client, a DELETE,
 * a fork, a truncate, TTL expiry and evictions. The prefill must then be answered and the session
 * must hold exactly its tokens. Under ASan a cache freed under the worker is a use-after-free that
 * kills the daemon; in the release build a crash or a lost prefill.
 */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "http_client.h"

/* One llama8b-shaped layer: a prefill of PREFILL tokens keeps a worker busy for about a second
 * (more under ASan), long enough to send every other request while it runs. */
#define HIDDEN  4096
#define PREFILL 1536

static struct http_client_daemon daemon_;

static void setup(void) {
    memset(&daemon_, 0, sizeof daemon_);
}

static void teardown(void) {
    http_client_daemon_kill(&daemon_);
}

static void stop_ok(void) {
    char *log = http_client_daemon_log(&daemon_);
    int status = http_client_daemon_stop(&daemon_, 30000);
    ck_assert_msg(status == 0, "attnd exited with %d; log tail: %s", status,
                  strlen(log) > 3000 ? log + strlen(log) - 3000 : log);
    free(log);
}

static long request(const char *method, const char *path, const char *body) {
    char u[256];
    snprintf(u, sizeof u, "%s%s", daemon_.base, path);
    struct http_client_response r;
    http_client_request(method, u, body, body != NULL ? strlen(body) : 0, NULL, &r);
    long status = r.status;
    http_client_response_release(&r);
    return status;
}

/* Sends POST path with body on a raw socket and returns it without reading the answer. */
static int raw_post(const char *path, const char *body) {
    size_t n = strlen(body);
    char *req = malloc(n + 256);
    int len = snprintf(req, n + 256,
                       "POST %s HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                       "Content-Length: %zu\r\n\r\n%s",
                       path, n, body);
    int fd = http_client_raw_send(daemon_.port, req, (size_t)len, 0);
    free(req);
    return fd;
}

static void wait_metric(const char *name, double want) {
    for (int i = 0; i < 3000 && http_client_metric(daemon_.base, name) != want; i++) {
        http_client_sleep_ms(5);
    }
    ck_assert_msg(http_client_metric(daemon_.base, name) == want, "%s never reached %g", name,
                  want);
}

/* Reads fd's answer and checks its status line and that it holds `needle`. */
static void expect_answer(int fd, const char *status_line, const char *needle) {
    char *seen = NULL;
    ssize_t n = http_client_raw_read_until(fd, needle, 120000, &seen);
    ck_assert_msg(n >= 0, "no '%s' in the answer: %.300s", needle, seen);
    ck_assert_msg(strncmp(seen, status_line, strlen(status_line)) == 0, "answer: %.300s", seen);
    free(seen);
    close(fd);
}

static int session_tokens(const char *id) {
    char u[256];
    snprintf(u, sizeof u, "%s/v1/sessions/%s", daemon_.base, id);
    struct http_client_response r;
    http_client_request("GET", u, NULL, 0, NULL, &r);
    ck_assert_msg(r.status == 200, "GET %s: %ld %s", id, r.status, r.body);
    cJSON *j = http_client_json(&r);
    int n = cJSON_GetObjectItemCaseSensitive(j, "n_tokens")->valueint;
    cJSON_Delete(j);
    http_client_response_release(&r);
    return n;
}

/* The queue holds one waiting job: while A's first prefill runs, every further request of any
 * session, A's included, is refused with 429, and refusing must leave A's cache alone. */
START_TEST(test_lifecycle_refused_requests_leave_a_running_cache_alone) {
    const char *args[] = {"--preset",
                          "llama8b",
                          "--layers",
                          "0",
                          "--workers",
                          "1",
                          "--queue-depth",
                          "1",
                          "--max-body-mb",
                          "64",
                          "--log-level",
                          "info",
                          "--session-ttl-s",
                          "1",
                          NULL};
    http_client_daemon_start(&daemon_, args);
    float *x = http_client_random_rows(7, PREFILL, HIDDEN);
    char *big = http_client_attend_body("A", x, 0, PREFILL, HIDDEN, true, NULL);
    int fd_a = raw_post("/v1/attend", big);
    wait_metric("attnd_jobs_in_flight", 1);

    char *one = http_client_attend_body("B", x, 0, 1, HIDDEN, false, NULL);
    int fd_b = raw_post("/v1/attend", one); /* waits: the queue is now full */
    wait_metric("attnd_queue_depth", 1);
    free(one);
    one = http_client_attend_body("A", x, 0, 1, HIDDEN, false, NULL);
    ck_assert_int_eq(request("POST", "/v1/attend", one), 429);
    free(one);
    one = http_client_attend_body("C", x, 0, 1, HIDDEN, false, NULL);
    ck_assert_int_eq(request("POST", "/v1/attend", one), 429);
    free(one);
    ck_assert_int_eq(request("DELETE", "/v1/sessions/A", NULL), 429);
    ck_assert_int_eq(request("POST", "/v1/sessions/A/fork", "{\"new_id\":\"A2\"}"), 429);
    ck_assert_int_eq(request("POST", "/v1/sessions/A/truncate", "{\"n_tokens\":0}"), 429);
    ck_assert_int_eq(request("POST", "/v1/attend", "{\"session_id\":\"A\",\"x\":[[1]]}"), 400);
    ck_assert_int_eq(request("POST", "/v1/attend", "{\"session_id\":\"A\",\"x\":"), 400);
    /* A declared body over --max-body-mb is refused from its headers (413). */
    char hdr[256];
    int hl = snprintf(hdr, sizeof hdr,
                      "POST /v1/attend HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Session-Id: A\r\n"
                      "Content-Length: %d\r\n\r\n",
                      100 << 20);
    int fd_big = http_client_raw_send(daemon_.port, hdr, (size_t)hl, 0);
    expect_answer(fd_big, "HTTP/1.1 413", "payload_too_large");
    /* A client that goes away while its request waits in the queue. */
    int fd_gone = raw_post("/v1/attend", "{\"session_id\":\"A\",\"x\":[[1]]}");
    close(fd_gone);

    char want[64];
    snprintf(want, sizeof want, "\"n_tokens\":%d", PREFILL);
    expect_answer(fd_a, "HTTP/1.1 200", want);
    expect_answer(fd_b, "HTTP/1.1 200", "\"n_tokens\":1");
    /* A holds exactly its prefill, and continues from it. */
    ck_assert_int_eq(session_tokens("A"), PREFILL);
    char extra[64];
    snprintf(extra, sizeof extra, ",\"expect_n_past\":%d", PREFILL);
    one = http_client_attend_body("A", x, 0, 1, HIDDEN, false, extra);
    ck_assert_int_eq(request("POST", "/v1/attend", one), 200);
    free(one);
    ck_assert_int_eq(session_tokens("A"), PREFILL + 1);
    free(big);
    free(x);
    stop_ok();
}
END_TEST

/* With room in the queue, requests of A wait for its prefill and then run in order: an abandoned
 * one is skipped, a DELETE deletes what the prefill made, and TTL expiry and eviction (a fork
 * that needs A's blocks) never touch a session with work queued. */
START_TEST(test_lifecycle_queued_requests_wait_for_the_running_cache) {
    /* 20 MiB of f32 KV: A's prefill reserves 12 MiB and the idle session holds 2, so a fork of
     * A (12 MiB more) cannot fit even once every idle session is evicted. */
    const char *args[] = {
        "--preset",       "llama8b", "--layers",    "0",    "--workers",       "1",
        "--kv-budget-mb", "20",      "--log-level", "info", "--session-ttl-s", "1",
        "--kv-dtype",     "f32",     NULL};
    http_client_daemon_start(&daemon_, args);
    float *x = http_client_random_rows(8, PREFILL, HIDDEN);
    char *one = http_client_attend_body("idle", x, 0, 200, HIDDEN, false, NULL);
    ck_assert_int_eq(request("POST", "/v1/attend", one), 200);
    free(one);
    char *big = http_client_attend_body("A", x, 0, PREFILL, HIDDEN, true, NULL);
    int fd_a = raw_post("/v1/attend", big);
    wait_metric("attnd_jobs_in_flight", 1);
    one = http_client_attend_body("A", x, 0, 1, HIDDEN, false, NULL);
    int fd_gone = raw_post("/v1/attend", one);
    free(one);
    close(fd_gone);
    /* Each request is in the queue before the next is sent, so they queue in this order. */
    wait_metric("attnd_queue_depth", 1);
    int fd_fork = raw_post("/v1/sessions/A/fork", "{\"new_id\":\"A2\"}");
    wait_metric("attnd_queue_depth", 2);
    int fd_trunc = raw_post("/v1/sessions/A/truncate", "{\"n_tokens\":5}");
    wait_metric("attnd_queue_depth", 3);
    char del[128];
    int dl = snprintf(del, sizeof del,
                      "DELETE /v1/sessions/A HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: "
                      "0\r\n\r\n");
    int fd_del = http_client_raw_send(daemon_.port, del, (size_t)dl, 0);
    wait_metric("attnd_queue_depth", 4);
    /* The idle session expires (TTL 1 s) while A, busy, must not. */
    for (int i = 0; i < 400 && http_client_metric(daemon_.base, "attnd_sessions") > 1; i++) {
        http_client_sleep_ms(10);
    }
    char want[64];
    snprintf(want, sizeof want, "\"n_tokens\":%d", PREFILL);
    expect_answer(fd_a, "HTTP/1.1 200", want);
    /* The fork needs 12 MiB more of a 20 MiB pool: 507, and the source is untouched. */
    expect_answer(fd_fork, "HTTP/1.1 507", "kv_budget_exhausted");
    expect_answer(fd_trunc, "HTTP/1.1 200", "\"n_tokens\":5");
    expect_answer(fd_del, "HTTP/1.1 204", "\r\n\r\n");
    {
        char u[256];
        snprintf(u, sizeof u, "%s/v1/sessions/A", daemon_.base);
        struct http_client_response r;
        http_client_request("GET", u, NULL, 0, NULL, &r);
        ck_assert_msg(r.status == 404, "A after DELETE: %ld %s", r.status, r.body);
        http_client_response_release(&r);
    }
    ck_assert_int_eq(request("GET", "/v1/sessions/idle", NULL), 410);
    free(big);
    free(x);
    stop_ok();
}
END_TEST

extern Suite *lifecycle_suite(void);

Suite *lifecycle_suite(void) {
    Suite *s = suite_create("lifecycle");
    TCase *tc = tcase_create("in_use");
    tcase_set_tags(tc, "server");
    tcase_set_timeout(tc, 240);
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_add_test(tc, test_lifecycle_refused_requests_leave_a_running_cache_alone);
    tcase_add_test(tc, test_lifecycle_queued_requests_wait_for_the_running_cache);
    suite_add_tcase(s, tc);
    return s;
}
