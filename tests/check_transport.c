/* tests/check_transport.c: the daemon's HTTP transport against clients that hold, trickle,
 * half-close or abandon connections: health answers beside thousands of idle or slow-header
 * connections, connections past the limits are reclaimed (oldest idle first) or refused with
 * 503, idle and header timeouts close stalled clients, a FIN drops an incomplete request at once
 * but still gets a complete one its answer, a drain ends at its deadline, Host is required of
 * HTTP/1.1 and the Bearer scheme is case-insensitive. Each test runs a real attnd on 127.0.0.1.
 *
 * Tunings go through ATTND_* environment variables rather than flags where a test can: an older
 * daemon ignores them and starts, so the test fails on its behaviour, not on an unknown flag.
 */
#include <check.h>
#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <unistd.h>

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>

#include <cjson/cJSON.h>

#include "http_client.h"

#define TINY_HIDDEN 64
#define HEALTH      "GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n"

static struct http_client_daemon daemon_;

static void setup(void) {
    memset(&daemon_, 0, sizeof daemon_);
}

static void teardown(void) {
    http_client_daemon_kill(&daemon_);
}

/* Starts attnd (tiny preset, one worker) with env ("NAME=value" strings, NULL-terminated, or
 * NULL) set for it and the extra flags args. */
static void start(const char *const *env, const char *const *args) {
    const char *argv[40] = {"--preset", "tiny", "--workers", "1"};
    int n = 4;
    for (int i = 0; args != NULL && args[i] != NULL && n < 39; i++) {
        argv[n++] = args[i];
    }
    argv[n] = NULL;
    for (int i = 0; env != NULL && env[i] != NULL; i++) {
        char name[64];
        const char *eq = strchr(env[i], '=');
        snprintf(name, sizeof name, "%.*s", (int)(eq - env[i]), env[i]);
        setenv(name, eq + 1, 1);
    }
    http_client_daemon_start(&daemon_, argv);
}

static char *log_tail(void) {
    char *log = http_client_daemon_log(&daemon_);
    size_t n = strlen(log);
    if (n > 3000) {
        memmove(log, log + n - 3000, 3001);
    }
    return log;
}

static void stop_with(int want) {
    char *log = log_tail();
    int status = http_client_daemon_stop(&daemon_, 20000);
    ck_assert_msg(status == want, "attnd exited with %d, want %d; log tail: %s", status, want, log);
    free(log);
}

/* The daemon's log line (up to its newline) of the first request whose line holds `what`, e.g.
 * "path=\"/v1/sdpa\" status=0", waited for up to 5 s (it is written when the connection has
 * closed, which its client may see first): malloc'd, or NULL. */
static char *request_line(const char *what) {
    double end_ms = http_client_mono_ms() + 5000;
    char *line = NULL;
    while (line == NULL && http_client_mono_ms() < end_ms) {
        char *log = http_client_daemon_log(&daemon_);
        for (const char *p = strstr(log, "route   request "); p != NULL && line == NULL;
             p = strstr(p + 1, "route   request ")) {
            const char *end = strchr(p, '\n');
            char *l = strndup(p, end != NULL ? (size_t)(end - p) : strlen(p));
            if (strstr(l, what) != NULL) {
                line = l;
            } else {
                free(l);
            }
        }
        free(log);
        if (line == NULL) {
            http_client_sleep_ms(20);
        }
    }
    return line;
}

/* The test process holds thousands of sockets too. */
static void raise_open_files(void) {
    struct rlimit rl;
    getrlimit(RLIMIT_NOFILE, &rl);
    rl.rlim_cur = rl.rlim_max;
    setrlimit(RLIMIT_NOFILE, &rl);
}

/* A request to the daemon on a fresh connection; its status, 0 if none within timeout_ms. */
static long exchange(const char *request, int timeout_ms, char **out) {
    return http_client_raw_exchange(daemon_.port, request, timeout_ms, out);
}

/* /healthz on a fresh connection must answer 200 within 5 s (generous: two cores, and other
 * builds running); returns how long it took. */
static double health_within_5s(void) {
    double t0 = http_client_mono_ms();
    char *out;
    long status = exchange(HEALTH, 5000, &out);
    double ms = http_client_mono_ms() - t0;
    ck_assert_msg(status == 200, "no health answer within 5 s (status %ld, %.0f ms): %.200s",
                  status, ms, out != NULL ? out : "");
    free(out);
    return ms;
}

/* Opens n connections that send nothing, in batches, each given up to 2 s to be accepted (so
 * that the server really holds them; one that stops accepting only makes this slow). */
static int *open_idle(int n) {
    int *fds = malloc((size_t)n * sizeof *fds);
    ck_assert_ptr_nonnull(fds);
    struct sockaddr_in a;
    memset(&a, 0, sizeof a);
    a.sin_family = AF_INET;
    a.sin_port = htons((uint16_t)daemon_.port);
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    for (int first = 0; first < n; first += 250) {
        int last = first + 250 < n ? first + 250 : n;
        for (int i = first; i < last; i++) {
            fds[i] = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0);
            ck_assert_int_ge(fds[i], 0);
            int rc = connect(fds[i], (struct sockaddr *)&a, sizeof a);
            ck_assert_msg(rc == 0 || errno == EINPROGRESS, "connect %d: %s", i, strerror(errno));
        }
        double end = http_client_mono_ms() + 2000;
        for (int i = first; i < last; i++) {
            struct pollfd p = {fds[i], POLLOUT, 0};
            int left = (int)(end - http_client_mono_ms());
            poll(&p, 1, left > 0 ? left : 0);
        }
    }
    return fds;
}

static void close_all(int *fds, int n) {
    for (int i = 0; i < n; i++) {
        close(fds[i]);
    }
    free(fds);
}

static void send_all(int fd, const char *text) {
    size_t len = strlen(text);
    ck_assert_int_eq(send(fd, text, len, MSG_NOSIGNAL), (ssize_t)len);
}

/* Sockets of the daemon's port in CLOSE-WAIT (the client closed, the daemon has not). */
static int close_wait_count(void) {
    static const char *const files[] = {"/proc/net/tcp", "/proc/net/tcp6"};
    int n = 0;
    for (int f = 0; f < 2; f++) {
        FILE *fp = fopen(files[f], "r");
        if (fp == NULL) {
            continue;
        }
        char line[512];
        while (fgets(line, sizeof line, fp) != NULL) {
            char local[128];
            unsigned state;
            if (sscanf(line, " %*d: %127s %*s %x", local, &state) != 2) {
                continue;
            }
            const char *colon = strrchr(local, ':');
            if (colon != NULL && strtol(colon + 1, NULL, 16) == daemon_.port && state == 0x08) {
                n++;
            }
        }
        fclose(fp);
    }
    return n;
}

/* Polls until no socket of the daemon is in CLOSE-WAIT; false after timeout_ms. */
static bool close_waits_gone_within(int timeout_ms) {
    double end = http_client_mono_ms() + timeout_ms;
    while (close_wait_count() > 0) {
        if (http_client_mono_ms() > end) {
            return false;
        }
        http_client_sleep_ms(20);
    }
    return true;
}

/* A POST /v1/attend whose headers are in but whose body (declared 100000 bytes) has only
 * begun: waits for the 100 Continue that says the daemon has read the headers (the connection
 * is busy from then on). */
static int partial_upload(const char *session) {
    char req[512];
    snprintf(req, sizeof req,
             "POST /v1/attend HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Session-Id: %s\r\n"
             "Content-Type: application/json\r\nContent-Length: 100000\r\n"
             "Expect: 100-continue\r\n\r\n",
             session);
    int fd = http_client_raw_send(daemon_.port, req, strlen(req), 0);
    char *seen;
    ck_assert_msg(http_client_raw_read_until(fd, "100 Continue", 5000, &seen) >= 0,
                  "no 100 Continue: %s", seen);
    free(seen);
    send_all(fd, "{\"x\":[[");
    return fd;
}

/* The whole request text of POST /v1/attend with t tokens of x (nested arrays). */
static char *attend_request(const char *session, int32_t t, uint64_t seed, const char *extra) {
    float *x = http_client_random_rows(seed, t, TINY_HIDDEN);
    char *body = http_client_attend_body(session, x, 0, t, TINY_HIDDEN, false, extra);
    size_t n = strlen(body) + 256;
    char *req = malloc(n);
    ck_assert_ptr_nonnull(req);
    snprintf(req, n,
             "POST /v1/attend HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
             "Content-Length: %zu\r\n\r\n%s",
             strlen(body), body);
    free(body);
    free(x);
    return req;
}

/* Sends request and half-closes at once (one write, then FIN); returns everything read until
 * the daemon closes (10 s at most). */
static char *half_closed_exchange(const char *request) {
    int fd = http_client_raw_connect(daemon_.port, 5000);
    ck_assert_int_ge(fd, 0);
    send_all(fd, request);
    ck_assert_int_eq(shutdown(fd, SHUT_WR), 0);
    char *seen;
    http_client_raw_read_until(fd, "\x01never\x01", 10000, &seen);
    close(fd);
    return seen;
}

/* The body of an HTTP answer (after the blank line). */
static const char *body_of(const char *answer) {
    const char *p = strstr(answer, "\r\n\r\n");
    ck_assert_msg(p != NULL, "no complete head: %.300s", answer);
    return p + 4;
}

/* ---- item 5: connection exhaustion ---------------------------------------------------------- */

START_TEST(test_transport_health_beside_2000_idle_connections) {
    raise_open_files();
    start(NULL, NULL); /* the default limits */
    int n = 2000;
    int *fds = open_idle(n);
    double worst = 0;
    for (int i = 0; i < 5; i++) {
        double ms = health_within_5s();
        worst = ms > worst ? ms : worst;
    }
    /* The default per-address limit (1024) closed the oldest idle ones to make room. */
    char *log = http_client_daemon_log(&daemon_);
    ck_assert_msg(strstr(log, "connection limit reached") != NULL, "no limit in the log");
    free(log);
    close_all(fds, n);
    health_within_5s();
    stop_with(0);
}
END_TEST

START_TEST(test_transport_health_beside_1100_slow_header_connections) {
    raise_open_files();
    const char *env[] = {"ATTND_HEADER_TIMEOUT_S=60", NULL};
    start(env, NULL);
    int n = 1100;
    int *fds = open_idle(n);
    http_client_sleep_ms(200);
    /* Each has begun a request and trickles it: waiting, never complete. */
    for (int i = 0; i < n; i++) {
        send(fds[i], "GET /healthz HTTP/1.1\r\nX-Slow: ", 31, MSG_NOSIGNAL);
    }
    http_client_sleep_ms(200);
    for (int round = 0; round < 3; round++) {
        for (int i = 0; i < n; i++) {
            send(fds[i], "a", 1, MSG_NOSIGNAL);
        }
        health_within_5s();
    }
    close_all(fds, n);
    stop_with(0);
}
END_TEST

START_TEST(test_transport_total_limit_reclaims_the_oldest_idle_connection) {
    const char *env[] = {"ATTND_MAX_CONNECTIONS=20", "ATTND_MAX_CONNECTIONS_PER_IP=0", NULL};
    start(env, NULL);
    int fds[20];
    for (int i = 0; i < 20; i++) {
        fds[i] = http_client_raw_connect(daemon_.port, 5000);
        ck_assert_int_ge(fds[i], 0);
        http_client_sleep_ms(5); /* accepted in this order */
    }
    http_client_sleep_ms(100);
    /* The 21st connection (a health probe) makes room by closing the oldest idle one... */
    health_within_5s();
    ck_assert_msg(http_client_raw_closed_within(fds[0], 5000), "the oldest was not reclaimed");
    /* ...the probe's connection closed with its answer, so the next one finds room, and the
     * one after it closes the next oldest, while the younger ones stay. */
    int extra[2];
    for (int i = 0; i < 2; i++) {
        extra[i] = http_client_raw_connect(daemon_.port, 5000);
        ck_assert_int_ge(extra[i], 0);
        http_client_sleep_ms(50);
    }
    ck_assert_msg(http_client_raw_closed_within(fds[1], 5000), "the second oldest stayed");
    for (int i = 2; i < 20; i++) {
        ck_assert_msg(!http_client_raw_closed_within(fds[i], 0), "connection %d was closed", i);
    }
    ck_assert(!http_client_raw_closed_within(extra[0], 0));
    ck_assert(http_client_metric(daemon_.base, "attnd_connections_reclaimed_total") >= 2);
    ck_assert(http_client_metric(daemon_.base, "attnd_connections_refused_total") == 0);
    close(extra[0]);
    close(extra[1]);
    for (int i = 0; i < 20; i++) {
        close(fds[i]);
    }
    stop_with(0);
}
END_TEST

/* Checks what a refused connection read: 503 too_many_connections in the proto error shape,
 * closing; frees it. */
static void check_refusal(char *seen) {
    ck_assert_msg(strncmp(seen, "HTTP/1.1 503 ", 13) == 0, "not a 503: %.300s", seen);
    ck_assert_ptr_nonnull(strstr(seen, "Connection: close\r\n"));
    ck_assert_ptr_nonnull(strstr(seen, "Retry-After: 1\r\n"));
    /* as every answer (openapi): a request id and a Date (found missing by an outside audit) */
    ck_assert_ptr_nonnull(strstr(seen, "\r\nX-Request-Id: "));
    ck_assert_ptr_nonnull(strstr(seen, " GMT\r\n"));
    ck_assert_ptr_nonnull(strstr(seen, "\r\nDate: "));
    cJSON *j = cJSON_Parse(body_of(seen));
    ck_assert_msg(j != NULL, "body is not JSON: %s", seen);
    const cJSON *e = cJSON_GetObjectItemCaseSensitive(j, "error");
    ck_assert_str_eq(cJSON_GetObjectItemCaseSensitive(e, "code")->valuestring,
                     "too_many_connections");
    ck_assert_str_eq(cJSON_GetObjectItemCaseSensitive(e, "type")->valuestring, "unavailable_error");
    ck_assert(cJSON_IsNull(cJSON_GetObjectItemCaseSensitive(e, "param")));
    cJSON_Delete(j);
    free(seen);
}

/* A connection on which an attend request with a body of n_body bytes (white space: its
 * answer, if any, comes before it matters) has been sent whole, as a client that writes its
 * whole request before it reads does; fails if any of it could not be sent (a reset). */
static int send_whole_body(size_t n_body) {
    int fd = http_client_raw_connect(daemon_.port, 5000);
    ck_assert_int_ge(fd, 0);
    struct timeval tv = {10, 0};
    setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
    char head[160];
    int hl = snprintf(head, sizeof head,
                      "POST /v1/attend HTTP/1.1\r\nHost: x\r\nContent-Type: "
                      "application/json\r\nContent-Length: %zu\r\n\r\n",
                      n_body);
    ck_assert_int_eq(send(fd, head, (size_t)hl, MSG_NOSIGNAL), hl);
    char *body = malloc(n_body);
    ck_assert_ptr_nonnull(body);
    memset(body, ' ', n_body);
    size_t sent = 0;
    while (sent < n_body) {
        ssize_t n = send(fd, body + sent, n_body - sent, MSG_NOSIGNAL);
        ck_assert_msg(n > 0, "the body's send failed after %zu of %zu bytes: %s", sent, n_body,
                      n < 0 ? strerror(errno) : "nothing sent");
        sent += (size_t)n;
    }
    free(body);
    return fd;
}

/* Checks a canned refusal: 503 too_many_connections in the proto error shape, closing. */
static void expect_refusal(void) {
    int fd = http_client_raw_connect(daemon_.port, 5000);
    ck_assert_int_ge(fd, 0);
    char *seen;
    http_client_raw_read_until(fd, "\x01never\x01", 5000, &seen);
    close(fd);
    check_refusal(seen);
}

START_TEST(test_transport_busy_connections_get_503) {
    const char *env[] = {"ATTND_MAX_CONNECTIONS=3", "ATTND_MAX_CONNECTIONS_PER_IP=0", NULL};
    start(env, NULL);
    int busy[3];
    for (int i = 0; i < 3; i++) {
        char id[16];
        snprintf(id, sizeof id, "b%d", i);
        busy[i] = partial_upload(id);
    }
    /* Every connection is busy (a request in progress): nothing to reclaim. */
    expect_refusal();
    /* A refused client that writes its whole request before it reads still gets the 503 (before
     * the lingering close, the refusal read what had come, closed, and the rest of a large body
     * reset the connection) */
    int whole = send_whole_body((size_t)2 << 20);
    char *seen;
    http_client_raw_read_until(whole, "\x01never\x01", 5000, &seen);
    close(whole);
    check_refusal(seen);
    /* A client that leaves frees its connection at once (its FIN drops the request)... */
    close(busy[0]);
    double end = http_client_mono_ms() + 5000;
    long status = 0;
    while (status != 200 && http_client_mono_ms() < end) {
        status = exchange(HEALTH, 2000, NULL);
    }
    ck_assert_int_eq(status, 200);
    /* counted: the refusal never reaches a handler, so the request counters miss it */
    ck_assert(http_client_metric(daemon_.base, "attnd_connections_refused_total") >= 1);
    ck_assert(http_client_metric(daemon_.base, "attnd_connections") >= 2); /* busy[1], busy[2] */
    close(busy[1]);
    close(busy[2]);
    stop_with(0);
}
END_TEST

START_TEST(test_transport_per_ip_limit_refuses_only_when_busy) {
    const char *env[] = {"ATTND_MAX_CONNECTIONS=100", "ATTND_MAX_CONNECTIONS_PER_IP=2", NULL};
    start(env, NULL);
    /* An idle connection of the address is reclaimed for its next one... */
    int idle = http_client_raw_connect(daemon_.port, 5000);
    int b0 = partial_upload("p0");
    health_within_5s();
    ck_assert_msg(http_client_raw_closed_within(idle, 5000), "the idle one stayed");
    /* ...but with both of its connections busy, the next gets 503. */
    int b1 = partial_upload("p1");
    expect_refusal();
    close(idle);
    close(b0);
    close(b1);
    stop_with(0);
}
END_TEST

START_TEST(test_transport_slow_headers_are_cut) {
    const char *env[] = {"ATTND_HEADER_TIMEOUT_S=1", "ATTND_IDLE_TIMEOUT_S=30", NULL};
    start(env, NULL);
    int fd = http_client_raw_connect(daemon_.port, 5000);
    ck_assert_int_ge(fd, 0);
    send_all(fd, "GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n");
    /* A header line every 100 ms keeps bytes flowing, so only a deadline on the whole head
     * (not an idle timeout) ends it. */
    double t0 = http_client_mono_ms();
    bool is_closed = false;
    while (!is_closed && http_client_mono_ms() - t0 < 8000) {
        if (send(fd, "X-Slow: a\r\n", 11, MSG_NOSIGNAL) < 0) {
            is_closed = true;
            break;
        }
        is_closed = http_client_raw_closed_within(fd, 100);
        health_within_5s(); /* and health answers meanwhile */
    }
    ck_assert_msg(is_closed, "a slowloris client was still connected after 8 s");
    close(fd);
    stop_with(0);
}
END_TEST

/* The header deadline runs from a request's first byte on a new connection too, when those
 * bytes come at once and nothing follows: libmicrohttpd read them before attnd watched the socket,
 * so the deadline never started and only --idle-timeout-s ended the connection. */
START_TEST(test_transport_stalled_first_headers_are_cut) {
    const char *env[] = {"ATTND_HEADER_TIMEOUT_S=1", "ATTND_IDLE_TIMEOUT_S=30", NULL};
    start(env, NULL);
    const char *head = "GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n";
    int fd = http_client_raw_send(daemon_.port, head, strlen(head), 0);
    double t0 = http_client_mono_ms();
    ck_assert_msg(http_client_raw_closed_within(fd, 8000),
                  "headers stalled since the connection's first bytes were not cut in 8 s");
    double ms = http_client_mono_ms() - t0;
    ck_assert_msg(ms >= 800, "cut after %.0f ms, before the 1 s deadline", ms);
    close(fd);
    stop_with(0);
}
END_TEST

START_TEST(test_transport_idle_connections_time_out) {
    const char *env[] = {"ATTND_IDLE_TIMEOUT_S=1", NULL};
    start(env, NULL);
    int fresh = http_client_raw_connect(daemon_.port, 5000);
    const char *req = "GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n";
    int kept = http_client_raw_send(daemon_.port, req, strlen(req), 0);
    char *seen;
    ck_assert_int_ge(http_client_raw_read_until(kept, "\"ok\"", 5000, &seen), 0);
    free(seen);
    /* a body that stops coming: closed too, and its request's line says why */
    const char *partial = "POST /v1/attend HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: "
                          "1000\r\n\r\n{\"x\":[[1,2";
    int stalled = http_client_raw_send(daemon_.port, partial, strlen(partial), 0);
    ck_assert_msg(http_client_raw_closed_within(fresh, 5000), "a silent connection stayed");
    ck_assert_msg(http_client_raw_closed_within(kept, 5000), "an idle keep-alive one stayed");
    ck_assert_msg(http_client_raw_closed_within(stalled, 5000), "a stalled body stayed");
    char *log = http_client_daemon_log(&daemon_);
    ck_assert_msg(strstr(log, "path=\"/v1/attend\" status=0 code=- ") != NULL &&
                      strstr(log, " ended=timeout") != NULL,
                  "no line for the stalled body: %s", log);
    free(log);
    close(fresh);
    close(kept);
    close(stalled);
    stop_with(0);
}
END_TEST

/* ---- item 9: a client's FIN ends what can no longer complete -------------------------------- */

START_TEST(test_transport_aborted_uploads_do_not_linger) {
    start(NULL, NULL);
    const char *partial = "POST /v1/attend HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: "
                          "1000\r\n\r\n{\"x\":[[1,2";
    /* Part of a body and close at once (data and FIN in one go): 20 of them. */
    for (int i = 0; i < 20; i++) {
        int fd = http_client_raw_send(daemon_.port, partial, strlen(partial), 0);
        close(fd);
    }
    /* Part of the headers, and an answered request followed by a close. */
    for (int i = 0; i < 5; i++) {
        int fd = http_client_raw_send(daemon_.port, "GET /heal", 9, 0);
        close(fd);
        fd = http_client_raw_send(daemon_.port, HEALTH, strlen(HEALTH), 0);
        close(fd);
    }
    ck_assert_msg(close_waits_gone_within(5000), "%d connections still in CLOSE-WAIT",
                  close_wait_count());
    /* A half-closed partial upload is dropped too: the client sees the daemon close. */
    int fd = http_client_raw_send(daemon_.port, partial, strlen(partial), 0);
    ck_assert_int_eq(shutdown(fd, SHUT_WR), 0);
    ck_assert_msg(http_client_raw_closed_within(fd, 5000), "a half-closed upload was kept");
    close(fd);
    stop_with(0);
}
END_TEST

/* A (1, n, d) tensor of random floats as {"shape":[1,n,d],"b64":"..."} (malloc'd). */
static char *rank3_b64(uint64_t seed, int32_t n, int32_t d) {
    float *x = http_client_random_rows(seed, n, d);
    char *t = http_client_matrix_b64(x, n, d);
    const char *b64 = strstr(t, "\"b64\""); /* `"b64":"..."}` */
    size_t size = strlen(b64) + 64;
    char *out = malloc(size);
    snprintf(out, size, "{\"shape\":[1,%d,%d],%s", (int)n, (int)d, b64);
    free(t);
    free(x);
    return out;
}

/* POST /v1/sdpa of q, k and v of 32768 x 8 (base64, a 4 MiB body): about 6 s of work for the
 * one worker. Returns the connection once the job runs. */
static int long_sdpa(void) {
    const int32_t n = 32768, d = 8;
    char *q = rank3_b64(1, n, d), *k = rank3_b64(2, n, d), *v = rank3_b64(3, n, d);
    size_t body_len = strlen(q) + strlen(k) + strlen(v) + 64;
    char *req = malloc(body_len + 256);
    char *body = malloc(body_len);
    body_len = (size_t)snprintf(body, body_len, "{\"q\":%s,\"k\":%s,\"v\":%s}", q, k, v);
    int head = snprintf(req, 256,
                        "POST /v1/sdpa HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: "
                        "application/json\r\nContent-Length: %zu\r\n\r\n",
                        body_len);
    memcpy(req + head, body, body_len);
    int fd = http_client_raw_send(daemon_.port, req, (size_t)head + body_len, 0);
    double end = http_client_mono_ms() + 20000;
    while (http_client_metric(daemon_.base, "attnd_jobs_in_flight") != 1 &&
           http_client_mono_ms() < end) {
        http_client_sleep_ms(10);
    }
    ck_assert_msg(http_client_metric(daemon_.base, "attnd_jobs_in_flight") == 1,
                  "the SDPA never started");
    free(body);
    free(req);
    free(q);
    free(k);
    free(v);
    return fd;
}

/* Closes fd with a reset: the client is gone, not merely done sending. */
static void reset_close(int fd) {
    struct linger lg = {1, 0};
    setsockopt(fd, SOL_SOCKET, SO_LINGER, &lg, sizeof lg);
    close(fd);
}

START_TEST(test_transport_abandoned_sdpa_stops_at_a_tile) {
    start(NULL, NULL);
    double end = http_client_mono_ms() + 20000;
    reset_close(long_sdpa());
    double t0 = http_client_mono_ms();
    while (http_client_metric(daemon_.base, "attnd_jobs_cancelled_total") < 1 &&
           http_client_mono_ms() < end) {
        http_client_sleep_ms(10);
    }
    /* Counted only when the engine returned ATTN_ECANCELED (or the job never ran): a job that
     * ran to its end is not, whatever the time it took. */
    ck_assert_msg(http_client_metric(daemon_.base, "attnd_jobs_cancelled_total") == 1,
                  "the abandoned SDPA was not cancelled");
    /* its log line says the client went (it said ended=error, as for a failure of the server) */
    char *line = request_line("path=\"/v1/sdpa\" status=0");
    ck_assert_msg(line != NULL && strstr(line, " ended=client_closed") != NULL, "%s", line);
    free(line);
    ck_assert_int_eq(http_client_metric(daemon_.base, "attnd_jobs_in_flight"), 0);
    /* The worker is free again: a small SDPA is answered. */
    const char *small_body = "{\"q\":[[[1]]],\"k\":[[[1]]],\"v\":[[[2]]]}";
    char small[256];
    snprintf(small, sizeof small,
             "POST /v1/sdpa HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n"
             "Content-Type: application/json\r\nContent-Length: %zu\r\n\r\n%s",
             strlen(small_body), small_body);
    ck_assert_int_eq(exchange(small, 5000, NULL), 200);
    fprintf(stderr, "abandoned sdpa: cancelled %.0f ms after the reset\n",
            http_client_mono_ms() - t0);
    stop_with(0);
}
END_TEST

/* A body over 256 KiB is parsed on a libuv pool thread while its connection is suspended; a
 * client that sends it whole and resets makes libmicrohttpd close that suspended connection,
 * which freed the request's body before or during the parse (found by an outside audit: a
 * use-after-free; this body, past glibc's largest mmap threshold, was unmapped and the daemon
 * died of SIGSEGV). Here the one worker runs a long SDPA, so of the pool's two threads one is
 * left for parses: the second body's parse waits behind the first's while both clients reset.
 * The parses must read memory of their own, and the daemon serve on. */
START_TEST(test_transport_reset_during_a_large_parse) {
    start(NULL, NULL);
    const int32_t n = 98304, d = 16; /* q, k and v of 98304 x 16 as JSON: a 41 MiB body */
    char row[256];
    int rl = snprintf(row, sizeof row, "[0.123456");
    for (int32_t c = 1; c < d; c++) {
        rl += snprintf(row + rl, sizeof row - (size_t)rl, ",0.123456");
    }
    rl += snprintf(row + rl, sizeof row - (size_t)rl, "]");
    size_t tensor = 3 + (size_t)n * ((size_t)rl + 1); /* [[row,...,row]] */
    size_t body_len = 3 * tensor + 16;                /* {"q":T,"k":T,"v":T} */
    char *req = malloc(body_len + 256);
    ck_assert_ptr_nonnull(req);
    size_t off = (size_t)snprintf(req, 256,
                                  "POST /v1/sdpa HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: "
                                  "application/json\r\nContent-Length: %zu\r\n\r\n{",
                                  body_len);
    size_t body_at = off - 1;
    const char *names[3] = {"\"q\":[[", ",\"k\":[[", ",\"v\":[["};
    for (int t = 0; t < 3; t++) {
        off += (size_t)sprintf(req + off, "%s", names[t]);
        for (int32_t r = 0; r < n; r++) {
            memcpy(req + off, row, (size_t)rl);
            off += (size_t)rl;
            req[off++] = r + 1 < n ? ',' : ']';
        }
        req[off++] = ']';
    }
    req[off++] = '}';
    ck_assert_uint_eq(off - body_at, body_len);
    int busy = long_sdpa();
    int a = http_client_raw_send(daemon_.port, req, off, 0);
    int b = http_client_raw_send(daemon_.port, req, off, 0);
    reset_close(a);
    reset_close(b);
    free(req);
    http_client_sleep_ms(500);
    reset_close(busy);
    health_within_5s();
    stop_with(0);
}
END_TEST

/* ---- item 12: half-close, Host, Bearer --------------------------------------------------------
 */

START_TEST(test_transport_half_closed_client_gets_its_answer) {
    /* Small prefill chunks make the long request several engine steps (the per-step check of
     * the client must not take a FIN for a departure). */
    const char *args[] = {"--max-batch-tokens", "16", NULL};
    start(NULL, args);
    char *seen = half_closed_exchange("GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n");
    ck_assert_msg(strncmp(seen, "HTTP/1.1 200 ", 13) == 0, "healthz: %.300s", seen);
    free(seen);
    const struct {
        int32_t t;
        const char *extra;
    } cases[] = {{2, NULL}, {64, NULL}, {8, ",\"stream\":true"}};
    for (int i = 0; i < 3; i++) {
        char id[16];
        snprintf(id, sizeof id, "h%d", i);
        char *req = attend_request(id, cases[i].t, 500 + (uint64_t)i, cases[i].extra);
        seen = half_closed_exchange(req);
        free(req);
        ck_assert_msg(strncmp(seen, "HTTP/1.1 200 ", 13) == 0, "case %d: %.300s", i, seen);
        if (cases[i].extra == NULL) {
            cJSON *j = cJSON_Parse(body_of(seen));
            ck_assert_msg(j != NULL, "case %d: body is not whole JSON", i);
            ck_assert_int_eq(cJSON_GetObjectItemCaseSensitive(j, "n_tokens")->valueint, cases[i].t);
            cJSON_Delete(j);
        } else {
            ck_assert_msg(strstr(seen, "data: [DONE]") != NULL, "stream cut: %.300s", seen);
        }
        free(seen);
        /* answered whole, so its log line has no ended= (a direct answer's said ended=error) */
        char what[64];
        snprintf(what, sizeof what, "session=\"%s\"", id);
        char *line = request_line(what);
        ck_assert_msg(line != NULL && strstr(line, " status=200 ") != NULL &&
                          strstr(line, " ended=") == NULL,
                      "case %d: %s", i, line);
        free(line);
    }
    stop_with(0);
}
END_TEST

START_TEST(test_transport_http11_needs_one_host) {
    start(NULL, NULL);
    char *out;
    long status = exchange("GET /healthz HTTP/1.1\r\nConnection: close\r\n\r\n", 5000, &out);
    ck_assert_msg(status == 400, "no Host: %ld %.300s", status, out);
    cJSON *j = cJSON_Parse(body_of(out));
    const cJSON *e = cJSON_GetObjectItemCaseSensitive(j, "error");
    ck_assert_str_eq(cJSON_GetObjectItemCaseSensitive(e, "code")->valuestring, "invalid_request");
    ck_assert_str_eq(cJSON_GetObjectItemCaseSensitive(e, "param")->valuestring, "Host");
    cJSON_Delete(j);
    free(out);
    status = exchange("GET /healthz HTTP/1.1\r\nHost: a\r\nHost: b\r\nConnection: close\r\n\r\n",
                      5000, NULL);
    ck_assert_int_eq(status, 400);
    status = exchange("GET /healthz HTTP/1.0\r\n\r\n", 5000, NULL);
    ck_assert_int_eq(status, 200);
    ck_assert_int_eq(exchange(HEALTH, 5000, NULL), 200);
    stop_with(0);
}
END_TEST

/* A transfer coding other than chunked leaves the body's length unknown: a 400 naming the header
 * at once (the library would wait for the idle timeout), the connection closed; chunked in any
 * case is read as before. */
START_TEST(test_transport_unknown_transfer_coding_is_refused) {
    start(NULL, NULL);
    static const char *const codings[] = {"gzip", "gzip, chunked", "chunked, gzip", "identity"};
    for (size_t i = 0; i < sizeof codings / sizeof codings[0]; i++) {
        char req[256], *out;
        snprintf(req, sizeof req,
                 "POST /v1/attend HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: %s\r\n\r\n{}",
                 codings[i]);
        long status = exchange(req, 2000, &out);
        ck_assert_msg(status == 400, "%s: %ld %.300s", codings[i], status, out);
        ck_assert_msg(strstr(out, "\"param\":\"Transfer-Encoding\"") != NULL, "%s: %.300s",
                      codings[i], out);
        free(out);
    }
    char *out;
    long status = exchange("POST /v1/attend HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: Chunked\r\n"
                           "Connection: close\r\n\r\n2\r\n{}\r\n0\r\n\r\n",
                           5000, &out);
    ck_assert_msg(status == 400 && strstr(out, "\"param\":\"x\"") != NULL, "chunked: %.300s", out);
    free(out);
    ck_assert_int_eq(exchange(HEALTH, 5000, NULL), 200);
    stop_with(0);
}
END_TEST

/* A misspelt variable left its option at the default without a word (a misspelt flag refuses
 * the start): each ATTND_* variable that is no option's is named in a warning. */
START_TEST(test_transport_unknown_variables_are_named) {
    const char *env[] = {"ATTND_KV_BUDGET=64", NULL};
    start(env, NULL);
    char *log = http_client_daemon_log(&daemon_);
    ck_assert_msg(strstr(log, "WARN  config  ATTND_KV_BUDGET is not a variable of attnd's "
                              "options (see --help): ignored") != NULL,
                  "%.2000s", log);
    ck_assert_ptr_null(strstr(log, "ATTND_KV_BUDGET_MB is not"));
    free(log);
    stop_with(0);
}
END_TEST

START_TEST(test_transport_bearer_scheme_is_case_insensitive) {
    const char *args[] = {"--api-key", "k-123", NULL};
    start(NULL, args);
    const char *ok[] = {"Bearer k-123", "bearer k-123", "BEARER k-123", "bEaReR   k-123"};
    const char *bad[] = {"Bearerk-123", "bearer k-12", "bearer k-1234", "Basic k-123", "bearer"};
    char req[256];
    for (int i = 0; i < 4; i++) {
        snprintf(req, sizeof req,
                 "GET /v1/model HTTP/1.1\r\nHost: x\r\nAuthorization: %s\r\nConnection: "
                 "close\r\n\r\n",
                 ok[i]);
        ck_assert_msg(exchange(req, 5000, NULL) == 200, "'%s' was refused", ok[i]);
    }
    for (int i = 0; i < 5; i++) {
        snprintf(req, sizeof req,
                 "GET /v1/model HTTP/1.1\r\nHost: x\r\nAuthorization: %s\r\nConnection: "
                 "close\r\n\r\n",
                 bad[i]);
        ck_assert_msg(exchange(req, 5000, NULL) == 401, "'%s' was accepted", bad[i]);
    }
    stop_with(0);
}
END_TEST

/* ---- item 8: a drain that ends --------------------------------------------------------------- */

/* Sends SIGTERM and waits up to timeout_ms for the exit, trickling one byte into trickle_fd
 * (when >= 0) every 100 ms and reading stream_fd (when >= 0) into *stream meanwhile. Returns
 * the exit status, or -1 if the daemon was still running (then it is killed). */
static int stop_while_trickling(int trickle_fd, int stream_fd, char **stream, int timeout_ms) {
    kill(daemon_.pid, SIGTERM);
    double end = http_client_mono_ms() + timeout_ms;
    int status = -1;
    while (http_client_mono_ms() < end) {
        if (trickle_fd >= 0) {
            send(trickle_fd, " ", 1, MSG_NOSIGNAL);
        }
        if (stream_fd >= 0) {
            char *more;
            http_client_raw_read_until(stream_fd, "\x01never\x01", 100, &more);
            size_t a = strlen(*stream), b = strlen(more);
            *stream = realloc(*stream, a + b + 1);
            memcpy(*stream + a, more, b + 1);
            free(more);
        } else {
            http_client_sleep_ms(100);
        }
        int ws;
        if (waitpid(daemon_.pid, &ws, WNOHANG) == daemon_.pid) {
            daemon_.pid = 0;
            status = WIFEXITED(ws) ? WEXITSTATUS(ws) : 128 + WTERMSIG(ws);
            break;
        }
    }
    if (daemon_.pid > 0) { /* killed, its log kept for the caller (teardown removes it) */
        kill(daemon_.pid, SIGKILL);
        waitpid(daemon_.pid, NULL, 0);
        daemon_.pid = 0;
    }
    return status;
}

START_TEST(test_transport_drain_deadline_cuts_trickling_upload) {
    const char *env[] = {"ATTND_DRAIN_TIMEOUT_S=1", NULL};
    start(env, NULL);
    char *log_path = strdup(daemon_.log_path);
    /* A stream running at SIGTERM, read as it comes, must still finish in full. */
    const int32_t t = 300;
    char *req = attend_request("drain", t, 801, ",\"stream\":true");
    int stream_fd = http_client_raw_send(daemon_.port, req, strlen(req), 0);
    free(req);
    char *stream;
    ck_assert_int_ge(http_client_raw_read_until(stream_fd, "}\n\n", 10000, &stream), 0);
    /* An upload that trickles a byte every 100 ms would hold the drain forever. */
    int trickle = partial_upload("slow");
    int status = stop_while_trickling(trickle, stream_fd, &stream, 15000);
    char *log = http_client_read_file(log_path, NULL);
    ck_assert_msg(status == 3, "exit %d, want 3 (cut); log: %.3000s", status, log);
    ck_assert_ptr_nonnull(strstr(log, "drain deadline"));
    ck_assert_ptr_nonnull(strstr(log, "n_cut=1"));
    ck_assert_msg(strstr(stream, "data: [DONE]") != NULL, "the running stream was cut");
    free(log);
    free(stream);
    free(log_path);
    close(stream_fd);
    close(trickle);
}
END_TEST

/* A request whose headers are still arriving at SIGTERM is a request still being received, as
 * one whose body is: it gets --drain-timeout-s to arrive, even on a server with nothing else to
 * finish. Headers completed within it are answered (503 draining: the request came after the
 * shutdown began); headers that never end are cut at the deadline, and the exit status is 3.
 * (The drain ended at once, since no request had begun: the connection was closed unanswered
 * and the exit status was 0.) */
START_TEST(test_transport_drain_waits_for_headers_still_arriving) {
    const char *env[] = {"ATTND_DRAIN_TIMEOUT_S=2", NULL};
    start(env, NULL);
    const char *head = "GET /readyz HTTP/1.1\r\nHost: a\r\n";
    int fd = http_client_raw_send(daemon_.port, head, strlen(head), 0);
    http_client_sleep_ms(200);
    kill(daemon_.pid, SIGTERM);
    http_client_sleep_ms(300);
    send_all(fd, "Connection: close\r\n\r\n");
    char *out;
    int got = http_client_raw_read_until(fd, "\r\n\r\n", 5000, &out);
    ck_assert_msg(got >= 0 && strncmp(out, "HTTP/1.1 503", 12) == 0,
                  "headers completed during the drain got no answer: '%.300s'", out);
    free(out);
    close(fd);
    int status = stop_while_trickling(-1, -1, NULL, 10000);
    ck_assert_msg(status == 0, "exit %d, want 0", status);
    http_client_daemon_kill(&daemon_); /* its log */

    start(env, NULL);
    char *log_path = strdup(daemon_.log_path);
    fd = http_client_raw_send(daemon_.port, head, strlen(head), 0);
    http_client_sleep_ms(200);
    double t0 = http_client_mono_ms();
    status = stop_while_trickling(-1, -1, NULL, 10000);
    double ms = http_client_mono_ms() - t0;
    char *log = http_client_read_file(log_path, NULL);
    ck_assert_msg(status == 3 && ms >= 1500, "exit %d after %.0f ms, want 3 after the 2 s deadline",
                  status, ms);
    ck_assert_ptr_nonnull(strstr(log, "n_cut=1"));
    free(log);
    free(log_path);
    close(fd);
}
END_TEST

/* What the deadline cut is logged as the README says: each request cut says ended=shutdown (it
 * said ended=error, MHD's reading of the hang-up), and the deadline's line counts the requests
 * left to finish without the connections still sending headers (finishing=-1 here). */
START_TEST(test_transport_drain_deadline_logs_what_it_cut) {
    const char *env[] = {"ATTND_DRAIN_TIMEOUT_S=1", NULL};
    start(env, NULL);
    char *log_path = strdup(daemon_.log_path);
    int upload = partial_upload("cut");
    const char *head = "GET /readyz HTTP/1.1\r\nHost: a\r\n";
    int headers = http_client_raw_send(daemon_.port, head, strlen(head), 0);
    http_client_sleep_ms(200);
    int status = stop_while_trickling(-1, -1, NULL, 10000);
    char *log = http_client_read_file(log_path, NULL);
    ck_assert_msg(status == 3, "exit %d, want 3 (cut)", status);
    ck_assert_msg(strstr(log, "n_cut=2 finishing=0") != NULL, "log: %.3000s", log);
    const char *line = strstr(log, "path=\"/v1/attend\" status=0");
    ck_assert_msg(line != NULL && strncmp(strchr(line, '\n') - 15, " ended=shutdown", 15) == 0,
                  "log: %.3000s", log);
    free(log);
    free(log_path);
    close(upload);
    close(headers);
}
END_TEST

START_TEST(test_transport_drain_follows_an_abandoned_upload) {
    start(NULL, NULL); /* the default 30 s deadline */
    int fd = partial_upload("gone");
    kill(daemon_.pid, SIGTERM);
    http_client_sleep_ms(200);
    /* The client sends a little more and gives up at once (the bytes and the FIN arrive
     * together): nothing is left to wait for. */
    send_all(fd, "1,2,3");
    close(fd);
    double t0 = http_client_mono_ms();
    int status = stop_while_trickling(-1, -1, NULL, 10000);
    ck_assert_msg(status == 0, "exit %d after %.0f ms, want a prompt 0", status,
                  http_client_mono_ms() - t0);
}
END_TEST

/* A body refused on its headers (413, over --max-held-mb) while the client still sends it: the
 * client, writing the whole body before it reads, as simple clients do, must not be reset
 * before it reads the answer. Before the lingering close, MHD closed the socket with the body
 * unread, the kernel reset it, and such a client got a broken pipe (39 times in 40 from Python;
 * curl now and then no status at all). */
START_TEST(test_transport_early_answer_survives_the_rest_of_the_body) {
    const char *args[] = {"--max-held-mb", "2", NULL};
    start(NULL, args);
    for (int round = 0; round < 5; round++) {
        int fd = send_whole_body((size_t)5 << 19);
        char *got = NULL;
        ck_assert_int_gt(http_client_raw_read_until(fd, "--max-held-mb", 5000, &got), 0);
        ck_assert_msg(strncmp(got, "HTTP/1.1 413", 12) == 0 && strstr(got, "--max-held-mb"),
                      "round %d: %.200s", round, got);
        free(got);
        ck_assert(http_client_raw_closed_within(fd, 5000));
        close(fd);
    }
    health_within_5s();
}
END_TEST

/* What a server holds for clients that send or read slowly is bounded across connections by
 * --max-held-mb (an outside audit held 5 GB with 100 slow readers of a 50 MB export): a body that
 * would pass it is refused with 503 server_busy and Retry-After, as is an answer that changes
 * nothing kept (a stateless call with its weights, an export); a session's step, which is in the
 * cache already, is answered whatever its size; small answers always go out. A body or such an
 * answer larger than the whole limit could never be held: 413 and 500 naming --max-held-mb, not a
 * 503 that sends its client back forever (an audit's export of a 72 MB session under
 * --max-held-mb 64 was 503 "retry later" with nothing held). */
START_TEST(test_transport_held_bytes_are_bounded) {
    const char *args[] = {"--max-held-mb", "2", NULL};
    start(NULL, args);
    char u[128];
    struct http_client_response r;
    /* an upload of 1.5 MiB of its 1.75 left hanging: held while the rest is awaited */
    int slow = http_client_raw_connect(daemon_.port, 5000);
    ck_assert_int_ge(slow, 0);
    size_t n_slow = (size_t)3 << 19;
    char *part = malloc(n_slow);
    ck_assert_ptr_nonnull(part);
    int head = snprintf(part, n_slow,
                        "POST /v1/attend HTTP/1.1\r\nHost: x\r\nContent-Length: %zu\r\n\r\n{",
                        (size_t)7 << 18);
    memset(part + head, ' ', n_slow - (size_t)head);
    ck_assert_int_eq(write(slow, part, n_slow), (ssize_t)n_slow);
    free(part);
    for (int i = 0; i < 200 && http_client_metric(daemon_.base, "attnd_held_bytes") <
                                   (double)(n_slow - (size_t)head - 1);
         i++) {
        http_client_sleep_ms(10);
    }
    /* a body of 1.25 MiB (a row, then white space JSON allows): over the budget as it arrives */
    float *x = http_client_random_rows(5, 300, 64);
    char *row = http_client_attend_body(NULL, x, 0, 1, 64, false, "");
    size_t n_row = strlen(row), n_big = (size_t)5 << 18;
    char *big = malloc(((size_t)5 << 19) + 1);
    ck_assert_ptr_nonnull(big);
    memcpy(big, row, n_row - 1);
    memset(big + n_row - 1, ' ', n_big - n_row);
    big[n_big - 1] = '}';
    big[n_big] = '\0';
    snprintf(u, sizeof u, "%s/v1/attend", daemon_.base);
    http_client_request("POST", u, big, strlen(big), NULL, &r);
    ck_assert_msg(r.status == 503 && strstr(r.body, "server_busy") != NULL, "%ld %s", r.status,
                  r.body);
    char ra[16];
    ck_assert_ptr_nonnull(http_client_header(&r, "Retry-After", ra, sizeof ra));
    http_client_response_release(&r);
    /* 120 rows asking for weights: an answer of ~0.7 MB. Stateless: 503 beside the upload */
    char *weights = http_client_attend_body(NULL, x, 0, 120, 64, true, ",\"return_weights\":true");
    http_client_request("POST", u, weights, strlen(weights), NULL, &r);
    ck_assert_msg(r.status == 503 && strstr(r.body, "server_busy") != NULL, "%ld %.200s", r.status,
                  r.body);
    http_client_response_release(&r);
    free(weights);
    close(slow); /* its buffers go at once */
    for (int i = 0; i < 200 && http_client_metric(daemon_.base, "attnd_held_bytes") > 0; i++) {
        http_client_sleep_ms(10);
    }
    ck_assert_int_eq(http_client_metric(daemon_.base, "attnd_held_bytes"), 0);
    /* alone past the limit: 2.5 MiB of body, then a stateless answer of ~4 MB */
    memcpy(big, row, n_row - 1);
    memset(big + n_row - 1, ' ', ((size_t)5 << 19) - n_row);
    big[((size_t)5 << 19) - 1] = '}';
    big[(size_t)5 << 19] = '\0';
    free(row);
    http_client_request("POST", u, big, strlen(big), NULL, &r);
    ck_assert_msg(r.status == 413 && strstr(r.body, "--max-held-mb") != NULL, "%ld %s", r.status,
                  r.body);
    http_client_response_release(&r);
    /* the same body chunked, its length unknown until it is in */
    {
        size_t n_body = strlen(big), n_req = n_body + 256;
        char *req = malloc(n_req);
        ck_assert_ptr_nonnull(req);
        int k = snprintf(req, n_req,
                         "POST /v1/attend HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
                         "Transfer-Encoding: chunked\r\n\r\n%zx\r\n",
                         n_body);
        memcpy(req + k, big, n_body);
        snprintf(req + k + n_body, n_req - (size_t)k - n_body, "\r\n0\r\n\r\n");
        char *out = NULL;
        long status = http_client_raw_exchange(daemon_.port, req, 10000, &out);
        ck_assert_msg(status == 413 && strstr(out, "--max-held-mb") != NULL, "chunked: %ld %.300s",
                      status, out);
        free(out);
        free(req);
    }
    weights = http_client_attend_body(NULL, x, 0, 300, 64, true, ",\"return_weights\":true");
    http_client_request("POST", u, weights, strlen(weights), NULL, &r);
    ck_assert_msg(r.status == 500 && strstr(r.body, "--max-held-mb") != NULL, "%ld %.200s",
                  r.status, r.body);
    http_client_response_release(&r);
    free(weights);
    /* the same in a session: its tokens are in the cache, so it is answered */
    weights = http_client_attend_body("s", x, 0, 300, 64, true, ",\"return_weights\":true");
    http_client_request("POST", u, weights, strlen(weights), NULL, &r);
    ck_assert_msg(r.status == 200 && r.len > ((size_t)2 << 20), "%ld %zu", r.status, r.len);
    http_client_response_release(&r);
    free(weights);
    /* its export (~300 KB of float32 K/V) fits; the budget came back when each answer ended */
    snprintf(u, sizeof u, "%s/v1/sessions/s/export", daemon_.base);
    http_client_request("GET", u, NULL, 0, NULL, &r);
    ck_assert_int_eq(r.status, 200);
    http_client_response_release(&r);
    snprintf(u, sizeof u, "%s/healthz", daemon_.base);
    http_client_request("GET", u, NULL, 0, NULL, &r);
    ck_assert_int_eq(r.status, 200);
    http_client_response_release(&r);
    /* the gauges: nothing held between requests (the counts were given back), and the limit */
    ck_assert_int_eq(http_client_metric(daemon_.base, "attnd_held_bytes"), 0);
    ck_assert_int_eq(http_client_metric(daemon_.base, "attnd_held_bytes_limit"), 2 << 20);
    free(big);
    free(x);
    stop_with(0);
}
END_TEST

/* check_main.c is given every suite by a table generated from the definitions below, each line
 * starting with `Suite *`. */
extern Suite *transport_suite(void);

static TCase *daemon_case(Suite *s, const char *name) {
    TCase *tc = tcase_create(name);
    tcase_set_tags(tc, "server");
    tcase_set_timeout(tc, 60);
    tcase_add_checked_fixture(tc, setup, teardown);
    suite_add_tcase(s, tc);
    return tc;
}

Suite *transport_suite(void) {
    Suite *s = suite_create("transport");
    TCase *tc = daemon_case(s, "limits");
    tcase_add_test(tc, test_transport_health_beside_2000_idle_connections);
    tcase_add_test(tc, test_transport_health_beside_1100_slow_header_connections);
    tcase_add_test(tc, test_transport_total_limit_reclaims_the_oldest_idle_connection);
    tcase_add_test(tc, test_transport_busy_connections_get_503);
    tcase_add_test(tc, test_transport_per_ip_limit_refuses_only_when_busy);
    tc = daemon_case(s, "timeouts");
    tcase_add_test(tc, test_transport_slow_headers_are_cut);
    tcase_add_test(tc, test_transport_stalled_first_headers_are_cut);
    tcase_add_test(tc, test_transport_idle_connections_time_out);
    tc = daemon_case(s, "fin");
    tcase_add_test(tc, test_transport_aborted_uploads_do_not_linger);
    tcase_add_test(tc, test_transport_half_closed_client_gets_its_answer);
    tcase_add_test(tc, test_transport_abandoned_sdpa_stops_at_a_tile);
    tcase_add_test(tc, test_transport_reset_during_a_large_parse);
    tcase_add_test(tc, test_transport_held_bytes_are_bounded);
    tcase_add_test(tc, test_transport_early_answer_survives_the_rest_of_the_body);
    tc = daemon_case(s, "protocol");
    tcase_add_test(tc, test_transport_http11_needs_one_host);
    tcase_add_test(tc, test_transport_unknown_transfer_coding_is_refused);
    tcase_add_test(tc, test_transport_bearer_scheme_is_case_insensitive);
    tcase_add_test(tc, test_transport_unknown_variables_are_named);
    tc = daemon_case(s, "drain");
    tcase_add_test(tc, test_transport_drain_deadline_cuts_trickling_upload);
    tcase_add_test(tc, test_transport_drain_deadline_logs_what_it_cut);
    tcase_add_test(tc, test_transport_drain_follows_an_abandoned_upload);
    tcase_add_test(tc, test_transport_drain_waits_for_headers_still_arriving);
    return s;
}
