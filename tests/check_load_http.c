/* tests/check_load_http.c: the load generator's HTTP client (bench/load_http.c) against a real
 * attnd: keep-alive reuse, a request sent again after the server closed an idle connection, a
 * chunked answer (a stream), a large binary answer, errors, and a refused connection. */
#include <check.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../bench/load_http.h"
#include "http_client.h"

static struct http_client_daemon daemon_;

static void start(const char *const *args) {
    http_client_daemon_start(&daemon_, args);
}

static void stop(void) {
    ck_assert_int_eq(http_client_daemon_stop(&daemon_, 10000), 0);
}

static void conn_to_daemon(lhttp_conn *c) {
    struct sockaddr_in addr;
    ck_assert_int_eq(lhttp_resolve(daemon_.base, &addr), 0);
    lhttp_init(c, &addr);
}

/* Requests one after another on one connection; after the server's idle timeout closed it, the
 * next request goes out again on a new one and is answered. */
START_TEST(test_load_http_keep_alive_and_resend) {
    const char *args[] = {"--preset", "small", "--workers", "1", "--idle-timeout-s", "1", NULL};
    start(args);
    lhttp_conn c;
    conn_to_daemon(&c);
    ck_assert_int_eq(lhttp_run(&c, "GET", "/readyz", NULL, NULL, 0, 5000), LHTTP_DONE);
    ck_assert_int_eq(c.status, 200);
    ck_assert(!c.is_reused);
    int fd = c.fd;
    lhttp_finish(&c);
    ck_assert_int_eq(lhttp_run(&c, "GET", "/v1/model", NULL, NULL, 0, 5000), LHTTP_DONE);
    ck_assert_int_eq(c.status, 200);
    ck_assert(c.is_reused);
    ck_assert_int_eq(c.fd, fd); /* the same connection */
    ck_assert_ptr_nonnull(strstr(c.body, "\"hidden_size\":512"));
    lhttp_finish(&c);
    http_client_sleep_ms(2500); /* past the idle timeout: the server closes the connection */
    ck_assert_int_eq(lhttp_run(&c, "GET", "/readyz", NULL, NULL, 0, 5000), LHTTP_DONE);
    ck_assert_int_eq(c.status, 200);
    ck_assert(!c.is_reused); /* sent again, on a new connection */
    lhttp_finish(&c);
    lhttp_release(&c);
    stop();
}
END_TEST

/* A binary answer of 64 KiB of floats (its bytes whole, after its JSON), a streamed (chunked)
 * answer joined, and an error answer with its status and body. */
START_TEST(test_load_http_answers) {
    const char *args[] = {"--preset", "small", "--workers", "1", NULL};
    start(args);
    lhttp_conn c;
    conn_to_daemon(&c);
    enum { T = 32, H = 512 };
    float *x = http_client_random_rows(7, T, H);
    char json[256];
    int n = snprintf(json, sizeof json,
                     "{\"binary_output\":true,\"x\":{\"shape\":[%d,%d],\"binary_data_size\":%d}}",
                     T, H, T * H * 4);
    size_t body_len = (size_t)n + (size_t)T * H * 4;
    char *body = malloc(body_len);
    ck_assert_ptr_nonnull(body);
    memcpy(body, json, (size_t)n);
    memcpy(body + n, x, (size_t)T * H * 4);
    char headers[128];
    snprintf(headers, sizeof headers, "Inference-Header-Content-Length: %d\r\n", n);
    ck_assert_int_eq(lhttp_run(&c, "POST", "/v1/attend", headers, body, body_len, 10000),
                     LHTTP_DONE);
    ck_assert_int_eq(c.status, 200);
    const char *nl = memchr(c.body, '\n', c.body_len);
    ck_assert_ptr_nonnull(nl);
    ck_assert_uint_eq(c.body_len - (size_t)(nl + 1 - c.body), (size_t)T * H * 4);
    lhttp_finish(&c);
    /* a stream: server-sent events, chunked */
    char *sbody = http_client_attend_body("s", x, 0, 3, H, false, ",\"stream\":true");
    ck_assert_int_eq(lhttp_run(&c, "POST", "/v1/attend", "Content-Type: application/json\r\n",
                               sbody, strlen(sbody), 10000),
                     LHTTP_DONE);
    ck_assert_int_eq(c.status, 200);
    ck_assert(c.is_chunked);
    ck_assert_ptr_nonnull(strstr(c.body, "data: [DONE]"));
    size_t events = 0;
    for (const char *p = c.body; (p = strstr(p, "data: {\"index\":")) != NULL; p++) {
        events++;
    }
    ck_assert_uint_eq(events, 3); /* one a token */
    lhttp_finish(&c);
    free(sbody);
    /* an error: its status and JSON */
    ck_assert_int_eq(lhttp_run(&c, "POST", "/v1/attend", NULL, "{", 1, 5000), LHTTP_DONE);
    ck_assert_int_eq(c.status, 400);
    ck_assert_ptr_nonnull(strstr(c.body, "\"error\""));
    lhttp_finish(&c);
    lhttp_release(&c);
    free(body);
    free(x);
    stop();
    /* nobody listening: FAILED, saying why */
    lhttp_conn gone;
    conn_to_daemon(&gone);
    ck_assert_int_eq(lhttp_run(&gone, "GET", "/readyz", NULL, NULL, 0, 2000), LHTTP_FAILED);
    ck_assert_ptr_nonnull(strstr(gone.error, "connect"));
    lhttp_release(&gone);
}
END_TEST

extern Suite *load_http_suite(void);

Suite *load_http_suite(void) {
    Suite *s = suite_create("load_http");
    TCase *tc = tcase_create("load_http");
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, test_load_http_keep_alive_and_resend);
    tcase_add_test(tc, test_load_http_answers);
    suite_add_tcase(s, tc);
    return s;
}
