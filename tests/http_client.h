/* tests/http_client.h: what the server suites share: a libcurl HTTP client, raw-socket requests
 * (for clients that must stall or disconnect on purpose), starting and stopping a real attnd on
 * 127.0.0.1 with an ephemeral port, and JSON helpers for comparing answers with proto/examples.
 * It defines no suite.
 */
#ifndef TESTS_HTTP_CLIENT_H
#define TESTS_HTTP_CLIENT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include <cjson/cJSON.h>

/* ---- time ----------------------------------------------------------------------------------- */

/* Sleeps ms milliseconds (0..). */
void http_client_sleep_ms(int ms);

/* CLOCK_MONOTONIC in milliseconds, for deadlines and timings. */
double http_client_mono_ms(void);

/* ---- files ---------------------------------------------------------------------------------- */

/* The whole file (relative to the repo root, where tests run), malloc'd and NUL-terminated;
 * fails the test if it cannot be read. *len (if not NULL) gets its size. */
char *http_client_read_file(const char *path, size_t *len);

/* ---- HTTP ------------------------------------------------------------------------------------ */

struct http_client_response {
    long status; /* 0 if the request failed at the transport level */
    char *body;  /* NUL-terminated, malloc'd */
    size_t len;
    char *headers; /* raw header block, malloc'd */
};

/* One request with a fresh connection. headers: NULL-terminated "Name: value" strings or NULL.
 * body may be NULL. Returns 0, or -1 on a transport error (status 0). */
int http_client_request(const char *method, const char *url, const char *body, size_t len,
                        const char *const *headers, struct http_client_response *out);
void http_client_response_release(struct http_client_response *r);

/* The value of a response header (case-insensitive name) copied into buf, or NULL. */
const char *http_client_header(const struct http_client_response *r, const char *name, char *buf,
                               size_t size);

/* The response body parsed as JSON (the caller deletes it), failing the test if it is not. */
cJSON *http_client_json(const struct http_client_response *r);

/* A connection that keeps its socket: requests go one after another on it (keep-alive). */
struct http_client_conn;
struct http_client_conn *http_client_conn_open(const char *base_url);
int http_client_conn_request(struct http_client_conn *c, const char *method, const char *path,
                             const char *body, size_t len, struct http_client_response *out);
void http_client_conn_close(struct http_client_conn *c);

/* Raw socket to 127.0.0.1:port with `request` (a whole HTTP request text) sent; returns the fd.
 * rcvbuf > 0 sets SO_RCVBUF before connecting (a small window makes a non-reading client stall
 * the server soon). The caller reads (or does not read) the answer and closes it. */
int http_client_raw_send(int port, const char *request, size_t len, int rcvbuf);

/* Reads from fd until `needle` has been seen or timeout_ms passed; returns bytes read into the
 * malloc'd *out (NUL-terminated), or -1. */
ssize_t http_client_raw_read_until(int fd, const char *needle, int timeout_ms, char **out);

/* A connection to 127.0.0.1:port made within timeout_ms (a server that does not accept leaves
 * a plain connect() blocked for minutes); returns the (blocking) fd, or -1. */
int http_client_raw_connect(int port, int timeout_ms);

/* One request on a fresh connection, everything within timeout_ms: connects, sends `request`
 * (which should ask for Connection: close) and reads until the server closes. Returns the
 * status of the answer, or 0 when there was none in time; *out (if not NULL) gets everything
 * read (malloc'd, NUL-terminated). */
long http_client_raw_exchange(int port, const char *request, int timeout_ms, char **out);

/* Reads (and discards) from fd until the server closes it (end of stream or reset): true if
 * that happened within timeout_ms. */
bool http_client_raw_closed_within(int fd, int timeout_ms);

/* ---- the daemon ------------------------------------------------------------------------------ */

struct http_client_daemon {
    pid_t pid;
    int port;
    char base[64];      /* "http://127.0.0.1:<port>" */
    char log_path[128]; /* its stderr */
};

/* Starts $ATTND_BIN (default build/attnd) with --host 127.0.0.1 --port 0 and args
 * (NULL-terminated), waits until it logs its port, and fills *d. The daemon dies with the test
 * process. Fails the test if it does not come up within 10 s. A daemon *d held before (zeroed
 * or from an earlier start) is killed and its log removed first. */
void http_client_daemon_start(struct http_client_daemon *d, const char *const *args);

/* Runs $ATTND_BIN with the same fixed arguments and args (NULL-terminated) for a daemon that
 * should exit by itself (a refused start): returns its exit status (0..255, 128 + signal), or -1
 * when it was still running after timeout_ms (it is killed then). *log gets its stderr
 * (malloc'd). */
int http_client_daemon_run(const char *const *args, int timeout_ms, char **log);

/* Sends SIGTERM and waits up to timeout_ms; returns the exit status (0..255), 128 + signal if
 * it died by one, or -1 if it had to be killed. Idempotent. */
int http_client_daemon_stop(struct http_client_daemon *d, int timeout_ms);

/* Kills the daemon if it is still running (teardown) and removes its log, unless
 * $ATTND_TEST_KEEP_LOGS is set. */
void http_client_daemon_kill(struct http_client_daemon *d);

/* The daemon's log so far (malloc'd), for failure messages. */
char *http_client_daemon_log(const struct http_client_daemon *d);

/* ---- JSON ------------------------------------------------------------------------------------ */

/* True if a and b have the same structure: the same object keys (any order) with values of the
 * same JSON types, recursively (true and false count as one type); arrays compare their first
 * elements. On false, why gets the path where they differ. */
bool http_client_json_same_shape(const cJSON *a, const cJSON *b, char *why, size_t why_size);

/* Flattens a numeric tensor (nested arrays, or a {"shape","b64"} object) into a malloc'd float
 * array; *n gets the count. Fails the test on anything else. */
float *http_client_json_floats(const cJSON *tensor, size_t *n);

/* A JSON body for a (rows, cols) float matrix as nested arrays, %.9g (malloc'd). */
char *http_client_matrix_json(const float *x, int32_t rows, int32_t cols);

/* The same matrix as {"shape":[rows,cols],"b64":"..."} (malloc'd). */
char *http_client_matrix_b64(const float *x, int32_t rows, int32_t cols);

/* ---- attnd request bodies ------------------------------------------------------------------ */

/* (t, hidden) values uniform in [-1, 1) from a splitmix64 stream (malloc'd). */
float *http_client_random_rows(uint64_t seed, int32_t t, int32_t hidden);

/* The body of POST /v1/attend (malloc'd): rows [first, first + t) of x (hidden columns) as nested
 * arrays or base64, session_id when session is not NULL, then `extra` (e.g. ",\"layer\":1")
 * spliced in before the closing brace. */
char *http_client_attend_body(const char *session, const float *x, int32_t first, int32_t t,
                              int32_t hidden, bool b64, const char *extra);

/* The value of the metric line "name value" (labels included in name) of GET base/metrics, or
 * -1 when there is none. */
double http_client_metric(const char *base, const char *name);

#endif /* TESTS_HTTP_CLIENT_H */
