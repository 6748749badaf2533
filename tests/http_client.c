/* tests/http_client.c: HTTP, daemon and JSON helpers for the server suites (see http_client.h).
 * libcurl for ordinary requests, plain sockets where a test needs a client that misbehaves. */
#include "http_client.h"

#include <check.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <arpa/inet.h>
#include <curl/curl.h>
#include <fcntl.h>

#include "../server/b64.h"
#include "../server/strbuf.h"

/* ---- time ----------------------------------------------------------------------------------- */

void http_client_sleep_ms(int ms) {
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

double http_client_mono_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

/* ---- files ---------------------------------------------------------------------------------- */

char *http_client_read_file(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    ck_assert_msg(f != NULL, "cannot open %s: %s", path, strerror(errno));
    struct strbuf b;
    strbuf_init(&b);
    char chunk[65536];
    size_t n;
    while ((n = fread(chunk, 1, sizeof chunk, f)) > 0) {
        strbuf_append(&b, chunk, n);
    }
    fclose(f);
    char *text = strbuf_detach(&b, len);
    ck_assert_ptr_nonnull(text);
    return text;
}

/* ---- libcurl -------------------------------------------------------------------------------- */

static void curl_init_once(void) {
    static bool done = false;
    if (!done) {
        curl_global_init(CURL_GLOBAL_ALL);
        done = true;
    }
}

static size_t on_data(char *p, size_t size, size_t n, void *user) {
    strbuf_append(user, p, size * n);
    return size * n;
}

static void response_from(struct http_client_response *out, CURL *c, CURLcode rc,
                          struct strbuf *body, struct strbuf *hdrs) {
    out->status = 0;
    if (rc == CURLE_OK) {
        curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &out->status);
    }
    out->body = strbuf_detach(body, &out->len);
    out->headers = strbuf_detach(hdrs, NULL);
}

static CURLcode perform(CURL *c, const char *method, const char *url, const char *body, size_t len,
                        const char *const *headers, struct strbuf *b, struct strbuf *h) {
    struct curl_slist *list = NULL;
    bool has_expect = false;
    for (int i = 0; headers != NULL && headers[i] != NULL; i++) {
        has_expect = has_expect || strncasecmp(headers[i], "Expect:", 7) == 0;
    }
    if (!has_expect) {
        list = curl_slist_append(list, "Expect:"); /* no 100-continue round trip */
    }
    if (body != NULL) {
        list = curl_slist_append(list, "Content-Type: application/json");
    }
    for (int i = 0; headers != NULL && headers[i] != NULL; i++) {
        list = curl_slist_append(list, headers[i]);
    }
    curl_easy_setopt(c, CURLOPT_URL, url);
    /* HEAD: no body follows the headers (set first: it resets the method, POSTFIELDS below
     * sets it again) */
    curl_easy_setopt(c, CURLOPT_NOBODY, strcmp(method, "HEAD") == 0 ? 1L : 0L);
    curl_easy_setopt(c, CURLOPT_CUSTOMREQUEST, method);
    curl_easy_setopt(c, CURLOPT_HTTPHEADER, list);
    curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(c, CURLOPT_TIMEOUT, 60L);
    if (body != NULL) {
        curl_easy_setopt(c, CURLOPT_POSTFIELDS, body);
        curl_easy_setopt(c, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t)len);
    } else {
        curl_easy_setopt(c, CURLOPT_POSTFIELDS, NULL);
        curl_easy_setopt(c, CURLOPT_HTTPGET, strcmp(method, "GET") == 0 ? 1L : 0L);
        curl_easy_setopt(c, CURLOPT_CUSTOMREQUEST, method);
        if (strcmp(method, "POST") == 0) {
            curl_easy_setopt(c, CURLOPT_POSTFIELDS, "");
            curl_easy_setopt(c, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t)0);
        }
    }
    curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, on_data);
    curl_easy_setopt(c, CURLOPT_WRITEDATA, b);
    curl_easy_setopt(c, CURLOPT_HEADERFUNCTION, on_data);
    curl_easy_setopt(c, CURLOPT_HEADERDATA, h);
    CURLcode rc = curl_easy_perform(c);
    curl_easy_setopt(c, CURLOPT_HTTPHEADER, NULL);
    curl_slist_free_all(list);
    return rc;
}

int http_client_request(const char *method, const char *url, const char *body, size_t len,
                        const char *const *headers, struct http_client_response *out) {
    curl_init_once();
    CURL *c = curl_easy_init();
    ck_assert_ptr_nonnull(c);
    struct strbuf b, h;
    strbuf_init(&b);
    strbuf_init(&h);
    CURLcode rc = perform(c, method, url, body, len, headers, &b, &h);
    response_from(out, c, rc, &b, &h);
    curl_easy_cleanup(c);
    return rc == CURLE_OK ? 0 : -1;
}

void http_client_response_release(struct http_client_response *r) {
    free(r->body);
    free(r->headers);
    memset(r, 0, sizeof *r);
}

const char *http_client_header(const struct http_client_response *r, const char *name, char *buf,
                               size_t size) {
    size_t nl = strlen(name);
    for (const char *line = r->headers; line != NULL && *line; line = strchr(line, '\n')) {
        while (*line == '\n' || *line == '\r') {
            line++;
        }
        if (strncasecmp(line, name, nl) == 0 && line[nl] == ':') {
            const char *v = line + nl + 1;
            while (*v == ' ') {
                v++;
            }
            size_t n = strcspn(v, "\r\n");
            snprintf(buf, size, "%.*s", (int)n, v);
            return buf;
        }
    }
    return NULL;
}

cJSON *http_client_json(const struct http_client_response *r) {
    cJSON *j = cJSON_Parse(r->body);
    ck_assert_msg(j != NULL, "status %ld: body is not JSON: %.300s", r->status, r->body);
    return j;
}

struct http_client_conn {
    CURL *curl;
    char base[64];
};

struct http_client_conn *http_client_conn_open(const char *base_url) {
    curl_init_once();
    struct http_client_conn *c = calloc(1, sizeof *c);
    ck_assert_ptr_nonnull(c);
    c->curl = curl_easy_init();
    snprintf(c->base, sizeof c->base, "%s", base_url);
    return c;
}

int http_client_conn_request(struct http_client_conn *c, const char *method, const char *path,
                             const char *body, size_t len, struct http_client_response *out) {
    char url[512];
    snprintf(url, sizeof url, "%s%s", c->base, path);
    struct strbuf b, h;
    strbuf_init(&b);
    strbuf_init(&h);
    CURLcode rc = perform(c->curl, method, url, body, len, NULL, &b, &h);
    response_from(out, c->curl, rc, &b, &h);
    return rc == CURLE_OK ? 0 : -1;
}

void http_client_conn_close(struct http_client_conn *c) {
    if (c != NULL) {
        curl_easy_cleanup(c->curl);
        free(c);
    }
}

/* ---- raw sockets ---------------------------------------------------------------------------- */

int http_client_raw_send(int port, const char *request, size_t len, int rcvbuf) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    ck_assert_int_ge(fd, 0);
    if (rcvbuf > 0) {
        setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &rcvbuf, sizeof rcvbuf);
    }
    struct sockaddr_in a;
    memset(&a, 0, sizeof a);
    a.sin_family = AF_INET;
    a.sin_port = htons((uint16_t)port);
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    ck_assert_int_eq(connect(fd, (struct sockaddr *)&a, sizeof a), 0);
    size_t off = 0;
    while (off < len) {
        ssize_t n = write(fd, request + off, len - off);
        ck_assert_int_gt(n, 0);
        off += (size_t)n;
    }
    return fd;
}

ssize_t http_client_raw_read_until(int fd, const char *needle, int timeout_ms, char **out) {
    struct strbuf b;
    strbuf_init(&b);
    strbuf_reserve(&b, 0);
    double end = http_client_mono_ms() + timeout_ms;
    size_t nl = strlen(needle);
    bool found = false;
    while (!found) {
        int left = (int)(end - http_client_mono_ms());
        if (left <= 0) {
            break;
        }
        struct pollfd p = {fd, POLLIN, 0};
        if (poll(&p, 1, left) <= 0) {
            break;
        }
        char chunk[65536];
        ssize_t n = read(fd, chunk, sizeof chunk);
        if (n <= 0) {
            break;
        }
        /* Search only the new bytes (and the needle's length before them): streams are long. */
        size_t from = b.len > nl ? b.len - nl : 0;
        strbuf_append(&b, chunk, (size_t)n);
        found = strstr(b.data + from, needle) != NULL;
    }
    size_t len = 0;
    *out = strbuf_detach(&b, &len);
    return found ? (ssize_t)len : -1;
}

int http_client_raw_connect(int port, int timeout_ms) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    ck_assert_int_ge(fd, 0);
    struct sockaddr_in a;
    memset(&a, 0, sizeof a);
    a.sin_family = AF_INET;
    a.sin_port = htons((uint16_t)port);
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    int flags = fcntl(fd, F_GETFL);
    fcntl(fd, F_SETFL, flags | O_NONBLOCK);
    if (connect(fd, (struct sockaddr *)&a, sizeof a) != 0 && errno != EINPROGRESS) {
        close(fd);
        return -1;
    }
    struct pollfd p = {fd, POLLOUT, 0};
    int err = 0;
    socklen_t len = sizeof err;
    if (poll(&p, 1, timeout_ms) != 1 || getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) != 0 ||
        err != 0) {
        close(fd);
        return -1;
    }
    fcntl(fd, F_SETFL, flags);
    return fd;
}

long http_client_raw_exchange(int port, const char *request, int timeout_ms, char **out) {
    double end = http_client_mono_ms() + timeout_ms;
    if (out != NULL) {
        *out = NULL;
    }
    int fd = http_client_raw_connect(port, timeout_ms);
    if (fd < 0) {
        return 0;
    }
    size_t len = strlen(request);
    if (send(fd, request, len, MSG_NOSIGNAL) != (ssize_t)len) {
        close(fd);
        return 0;
    }
    struct strbuf b;
    strbuf_init(&b);
    strbuf_reserve(&b, 0);
    for (;;) {
        int left = (int)(end - http_client_mono_ms());
        struct pollfd p = {fd, POLLIN, 0};
        if (left <= 0 || poll(&p, 1, left) != 1) {
            break;
        }
        char chunk[65536];
        ssize_t n = read(fd, chunk, sizeof chunk);
        if (n <= 0) {
            break;
        }
        strbuf_append(&b, chunk, (size_t)n);
    }
    close(fd);
    long status = 0;
    if (b.len > 12 && strncmp(b.data, "HTTP/1.", 7) == 0) {
        status = strtol(b.data + 9, NULL, 10);
    }
    char *text = strbuf_detach(&b, NULL);
    if (out != NULL) {
        *out = text;
    } else {
        free(text);
    }
    return status;
}

bool http_client_raw_closed_within(int fd, int timeout_ms) {
    double end = http_client_mono_ms() + timeout_ms;
    for (;;) {
        int left = (int)(end - http_client_mono_ms());
        struct pollfd p = {fd, POLLIN, 0};
        if (left <= 0 || poll(&p, 1, left) != 1) {
            return false;
        }
        char chunk[65536];
        ssize_t n = read(fd, chunk, sizeof chunk);
        if (n == 0 || (n < 0 && errno != EINTR && errno != EAGAIN)) {
            return true;
        }
    }
}

/* ---- the daemon ----------------------------------------------------------------------------- */

char *http_client_daemon_log(const struct http_client_daemon *d) {
    size_t len;
    FILE *f = fopen(d->log_path, "rb");
    if (f == NULL) {
        return strdup("(no log)");
    }
    fclose(f);
    return http_client_read_file(d->log_path, &len);
}

static void daemon_reap(struct http_client_daemon *d) {
    if (d->pid > 0) {
        kill(d->pid, SIGKILL);
        waitpid(d->pid, NULL, 0);
        d->pid = 0;
    }
}

/* Forks and execs $ATTND_BIN with --host 127.0.0.1 --port 0 and args, stderr to d->log_path. */
static void daemon_spawn(struct http_client_daemon *d, const char *const *args) {
    memset(d, 0, sizeof *d);
    const char *bin = getenv("ATTND_BIN");
    if (bin == NULL || bin[0] == '\0') {
        bin = "build/attnd";
    }
    snprintf(d->log_path, sizeof d->log_path, "/tmp/attnd-test-XXXXXX");
    int log_fd = mkstemp(d->log_path);
    ck_assert_int_ge(log_fd, 0);
    const char *argv[64] = {bin, "--host", "127.0.0.1", "--port", "0"};
    int argc = 5;
    for (int i = 0; args != NULL && args[i] != NULL && argc < 62; i++) {
        argv[argc++] = args[i];
    }
    argv[argc] = NULL;
    pid_t pid = fork();
    ck_assert_int_ge(pid, 0);
    if (pid == 0) {
        /* The daemon must not outlive a test process that fails or times out. */
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        dup2(log_fd, STDERR_FILENO);
        int null_fd = open("/dev/null", O_RDWR);
        dup2(null_fd, STDOUT_FILENO);
        execv(bin, (char *const *)argv);
        fprintf(stderr, "cannot exec %s: %s\n", bin, strerror(errno));
        _exit(127);
    }
    close(log_fd);
    d->pid = pid;
}

void http_client_daemon_start(struct http_client_daemon *d, const char *const *args) {
    curl_init_once();
    http_client_daemon_kill(d); /* a daemon *d held before, and its log */
    daemon_spawn(d, args);
    pid_t pid = d->pid;
    double end = http_client_mono_ms() + 10000;
    while (http_client_mono_ms() < end) {
        size_t len;
        char *log = http_client_read_file(d->log_path, &len);
        const char *line = strstr(log, " listening ");
        const char *p = line != NULL ? strstr(line, "port=") : NULL;
        if (p != NULL && strchr(p, '\n') != NULL) {
            d->port = atoi(p + 5);
            free(log);
            snprintf(d->base, sizeof d->base, "http://127.0.0.1:%d", d->port);
            return;
        }
        int status;
        if (waitpid(pid, &status, WNOHANG) == pid) {
            d->pid = 0;
            ck_abort_msg("attnd exited during startup (status %d): %s", status, log);
        }
        free(log);
        http_client_sleep_ms(20);
    }
    daemon_reap(d);
    ck_abort_msg("attnd did not start within 10 s (log: %s)", d->log_path);
}

int http_client_daemon_run(const char *const *args, int timeout_ms, char **log) {
    struct http_client_daemon d;
    daemon_spawn(&d, args);
    double end = http_client_mono_ms() + timeout_ms;
    int rc = -1, status = 0;
    while (http_client_mono_ms() < end) {
        if (waitpid(d.pid, &status, WNOHANG) == d.pid) {
            d.pid = 0;
            rc = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
            break;
        }
        http_client_sleep_ms(10);
    }
    daemon_reap(&d);
    *log = http_client_read_file(d.log_path, NULL);
    unlink(d.log_path);
    return rc;
}

int http_client_daemon_stop(struct http_client_daemon *d, int timeout_ms) {
    if (d->pid <= 0) {
        return -1;
    }
    kill(d->pid, SIGTERM);
    double end = http_client_mono_ms() + timeout_ms;
    int status = 0;
    while (http_client_mono_ms() < end) {
        pid_t w = waitpid(d->pid, &status, WNOHANG);
        if (w == d->pid) {
            d->pid = 0;
            if (WIFEXITED(status)) {
                if (WEXITSTATUS(status) == 0) {
                    unlink(d->log_path);
                }
                return WEXITSTATUS(status);
            }
            return WIFSIGNALED(status) ? 128 + WTERMSIG(status) : -1;
        }
        http_client_sleep_ms(10);
    }
    http_client_daemon_kill(d);
    return -1;
}

/* The log goes too (a failed test's process dies before its teardown, so its daemon's log stays
 * in /tmp for reading), unless $ATTND_TEST_KEEP_LOGS is set. */
void http_client_daemon_kill(struct http_client_daemon *d) {
    daemon_reap(d);
    if (d->log_path[0] != '\0' && getenv("ATTND_TEST_KEEP_LOGS") == NULL) {
        unlink(d->log_path);
        d->log_path[0] = '\0';
    }
}

/* ---- JSON ----------------------------------------------------------------------------------- */

static int kind_of(const cJSON *j) {
    if (cJSON_IsBool(j)) {
        return cJSON_True; /* true and false are one type here */
    }
    return j->type & 0xFF;
}

static bool shape_at(const cJSON *a, const cJSON *b, char *path, size_t path_size, char *why,
                     size_t why_size) {
    if (kind_of(a) != kind_of(b)) {
        snprintf(why, why_size, "%s: types differ", path);
        return false;
    }
    size_t pl = strlen(path);
    if (cJSON_IsObject(a)) {
        if (cJSON_GetArraySize(a) != cJSON_GetArraySize(b)) {
            snprintf(why, why_size, "%s: %d keys vs %d", path, cJSON_GetArraySize(a),
                     cJSON_GetArraySize(b));
            return false;
        }
        for (const cJSON *c = a->child; c != NULL; c = c->next) {
            const cJSON *o = cJSON_GetObjectItemCaseSensitive(b, c->string);
            if (o == NULL) {
                snprintf(why, why_size, "%s.%s: missing", path, c->string);
                return false;
            }
            snprintf(path + pl, path_size - pl, ".%s", c->string);
            if (!shape_at(c, o, path, path_size, why, why_size)) {
                return false;
            }
            path[pl] = '\0';
        }
    } else if (cJSON_IsArray(a) && a->child != NULL && b->child != NULL) {
        snprintf(path + pl, path_size - pl, "[0]");
        if (!shape_at(a->child, b->child, path, path_size, why, why_size)) {
            return false;
        }
        path[pl] = '\0';
    }
    return true;
}

bool http_client_json_same_shape(const cJSON *a, const cJSON *b, char *why, size_t why_size) {
    char path[512] = "$";
    return shape_at(a, b, path, sizeof path, why, why_size);
}

static void collect(const cJSON *j, struct strbuf *out) {
    if (cJSON_IsArray(j)) {
        for (const cJSON *c = j->child; c != NULL; c = c->next) {
            collect(c, out);
        }
        return;
    }
    ck_assert_msg(cJSON_IsNumber(j), "tensor holds a non-number");
    float f = (float)j->valuedouble;
    strbuf_append(out, &f, sizeof f);
}

float *http_client_json_floats(const cJSON *tensor, size_t *n) {
    ck_assert_ptr_nonnull(tensor);
    if (cJSON_IsObject(tensor)) {
        const cJSON *b = cJSON_GetObjectItemCaseSensitive(tensor, "b64");
        ck_assert_msg(cJSON_IsString(b), "base64 tensor without b64");
        size_t len = strlen(b->valuestring);
        size_t bytes = b64_decoded_len(b->valuestring, len);
        float *f = malloc(bytes + 4);
        ck_assert_int_eq(b64_decode(b->valuestring, len, (uint8_t *)f), 0);
        *n = bytes / 4;
        return f;
    }
    struct strbuf out;
    strbuf_init(&out);
    collect(tensor, &out);
    size_t len;
    float *f = (float *)strbuf_detach(&out, &len);
    *n = len / sizeof(float);
    return f;
}

char *http_client_matrix_json(const float *x, int32_t rows, int32_t cols) {
    struct strbuf b;
    strbuf_init(&b);
    strbuf_putc(&b, '[');
    for (int32_t r = 0; r < rows; r++) {
        strbuf_puts(&b, r > 0 ? ",[" : "[");
        for (int32_t c = 0; c < cols; c++) {
            strbuf_printf(&b, c > 0 ? ",%.9g" : "%.9g", (double)x[(size_t)r * cols + c]);
        }
        strbuf_putc(&b, ']');
    }
    strbuf_putc(&b, ']');
    return strbuf_detach(&b, NULL);
}

char *http_client_matrix_b64(const float *x, int32_t rows, int32_t cols) {
    size_t bytes = (size_t)rows * cols * sizeof(float);
    char *enc = malloc(b64_encoded_len(bytes) + 1);
    ck_assert_ptr_nonnull(enc);
    b64_encode((const uint8_t *)x, bytes, enc);
    struct strbuf b;
    strbuf_init(&b);
    strbuf_printf(&b, "{\"shape\":[%d,%d],\"b64\":\"", (int)rows, (int)cols);
    strbuf_puts(&b, enc);
    strbuf_puts(&b, "\"}");
    free(enc);
    return strbuf_detach(&b, NULL);
}

/* ---- attnd request bodies ------------------------------------------------------------------ */

float *http_client_random_rows(uint64_t seed, int32_t t, int32_t hidden) {
    float *x = malloc((size_t)t * hidden * sizeof(float));
    ck_assert_ptr_nonnull(x);
    uint64_t s = seed * 0x9E3779B97F4A7C15ULL + 1;
    for (int32_t i = 0; i < t * hidden; i++) {
        s += 0x9E3779B97F4A7C15ULL;
        uint64_t z = s;
        z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
        z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
        z ^= z >> 31;
        x[i] = (float)((double)(z >> 11) / 9007199254740992.0 * 2.0 - 1.0);
    }
    return x;
}

char *http_client_attend_body(const char *session, const float *x, int32_t first, int32_t t,
                              int32_t hidden, bool b64, const char *extra) {
    const float *rows = x + (size_t)first * hidden;
    char *tensor =
        b64 ? http_client_matrix_b64(rows, t, hidden) : http_client_matrix_json(rows, t, hidden);
    size_t n = strlen(tensor) + 512 + (extra ? strlen(extra) : 0);
    char *body = malloc(n);
    ck_assert_ptr_nonnull(body);
    if (session != NULL) {
        snprintf(body, n, "{\"session_id\":\"%s\",\"x\":%s%s}", session, tensor,
                 extra ? extra : "");
    } else {
        snprintf(body, n, "{\"x\":%s%s}", tensor, extra ? extra : "");
    }
    free(tensor);
    return body;
}

double http_client_metric(const char *base, const char *name) {
    char url[256];
    snprintf(url, sizeof url, "%s/metrics", base);
    struct http_client_response r;
    http_client_request("GET", url, NULL, 0, NULL, &r);
    ck_assert_int_eq(r.status, 200);
    double v = -1;
    size_t nl = strlen(name);
    for (const char *p = r.body; p != NULL && *p; p = strchr(p, '\n')) {
        if (*p == '\n') {
            p++;
        }
        if (strncmp(p, name, nl) == 0 && p[nl] == ' ') {
            v = atof(p + nl + 1);
            break;
        }
    }
    http_client_response_release(&r);
    return v;
}
