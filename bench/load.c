/* bench/load.c: a load generator for attnd (`make load`, built as attn_load). N closed-loop
 * clients, each with its own session: a prefill of T tokens, then single-token decode steps
 * (POST /v1/attend with session_id and expect_n_past) for D seconds; prints requests/s and the
 * p50/p90/p99 latency of the decode steps. With --batch B each client drives B sessions the way a
 * model runner advances its batch: one prefill call per session, then every decode call carries
 * one step of each of its sessions ("steps"), and tokens/s counts the steps. One thread drives
 * every client through poll() over keep-alive connections of its own minimal HTTP client
 * (load_http.c), so the generator takes as little CPU as it can from the daemon it measures on
 * the same machine. With --spawn it also starts the daemon and stops
 * it afterwards.
 */
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/resource.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cjson/cJSON.h>
#include <poll.h>

#include "../server/json.h"

#include "bench_rand.h"
#include "load_http.h"

/* ---- types ---------------------------------------------------------------------------------- */

typedef struct load_opts {
    const char *url;        /* base URL, no trailing slash */
    const char *spawn_path; /* NULL, or the attnd binary to start */
    char **daemon_args;     /* extra attnd flags (after --), NULL-terminated */
    int32_t n_clients;
    int32_t n_batch; /* sessions per client: decode calls carry one step of each */
    double duration_s;
    int32_t n_prefill;   /* tokens of each session's prefill */
    int32_t layer;       /* -1 = omit (the server's first loaded layer) */
    int32_t max_tokens;  /* 0 = the model's max_position_embeddings */
    const char *api_key; /* NULL = no Authorization header */
    bool is_json_floats; /* send x as nested arrays instead of base64 */
    bool is_binary;      /* the binary tensor extension, both ways */
    double ready_timeout_s;
} load_opts;

typedef struct buffer {
    char *data; /* NUL-terminated when len > 0 */
    size_t len;
    size_t cap;
} buffer;

typedef enum client_phase {
    PHASE_IDLE = 0,
    PHASE_PREFILL = 1,
    PHASE_DECODE = 2,
    PHASE_TRUNCATE = 3,
    PHASE_DEAD = 4, /* a transport error: the client stops */
} client_phase;

/* One closed-loop client: at most one request in flight. Its sessions (one, or --batch of them)
 * advance in lockstep: a prefill or truncate goes through them one call each (cursor), a decode
 * call steps them all. */
typedef struct client {
    int32_t index;
    lhttp_conn conn;
    int32_t generation; /* bumped when failed sessions are replaced by fresh ones */
    int32_t n_tokens;   /* the cache length the client believes each of its sessions has */
    int32_t cursor;     /* the session the current prefill or truncate is for */
    client_phase phase;
    char *x_json;    /* this client's decode row as the JSON value of "x" */
    float *x;        /* the same row as floats (--binary), n_batch times over: a batch call's
                        raw part, which stays the same from call to call */
    buffer body;     /* the request being sent */
    size_t json_len; /* --binary: the JSON header's length in body, else 0 */
    bool has_tail;   /* the request's body goes on with x, all n_batch rows (a batch call) */
    /* A decode call's text, made once per generation rather than printed every call (printf
     * was a tenth of the generator's CPU): each session's `{"session_id":"...","expect_n_past":`
     * one after another in step_heads, session k's ending at step_head_end[k]; and the rest of
     * a step after the number, `,"x":...}`. */
    buffer step_heads;
    size_t *step_head_end; /* (n_batch) */
    int32_t step_heads_generation;
    char *step_tail;
} client;

typedef struct latency_stats {
    double *ms; /* (n) latencies of successful requests */
    size_t n;
    size_t cap;
    /* server-reported timing of those requests (a batch: its first step's, the steps having run
     * as one engine call); compute_ms one by one, for a median comparable to attn_bench's */
    double sum_queue_ms;
    double sum_compute_ms;
    double *compute_ms; /* (n_compute) */
    size_t n_compute;
    size_t cap_compute;
} latency_stats;

typedef struct error_stats {
    int64_t by_status[600]; /* [0] counts transport errors and malformed answers */
    int64_t n;
    char first[320]; /* the first error, for the report */
} error_stats;

/* What the checks read of one session's answer (read_step): its status when it failed, its
 * token count, its output's shape and base64 text (the JSON encoding's), its timing. */
typedef struct step_view {
    bool has_status, has_n_tokens, has_b64, has_timing, has_compute;
    double status, n_tokens, queue_ms, compute_ms;
    int32_t n_shape; /* the shape's length; its first two in shape */
    double shape[2];
    struct json_span b64;
} step_view;

typedef struct load_run {
    const load_opts *opts;
    char base_url[256];
    struct sockaddr_in addr;
    char headers[600];    /* header lines every request carries, each ending \r\n */
    struct pollfd *polls; /* (n_clients) */
    client *clients;      /* (n_clients) */
    int32_t hidden;
    int32_t max_tokens;
    char *prefill_json; /* the prefill's "x" value, shared by all clients */
    float *prefill_x;   /* the same as floats (--binary) */
    /* What an answer's values are checked against: every session's prefill is the same x into
     * an empty session, so each must give the first one's output again (prefill_ref, NULL until
     * one is answered); values holds the answer being checked (a batch: step 0's, then step k's,
     * which must agree, its sessions having had the same tokens). */
    float *prefill_ref;      /* (n_prefill, hidden) */
    float *values;           /* (n_prefill + 1, hidden) */
    struct step_view *views; /* (n_batch): what the answer being checked says of each session */
    char why[120];           /* what the last answer refused got wrong */
    latency_stats prefill;
    latency_stats decode;
    error_stats errors;
    int64_t n_truncates;
    int64_t n_replaced;
    bool is_stopping;
    bool is_prefill_only; /* clients go idle once their sessions are prefilled */
    double last_done_s;
} load_run;

/* ---- small helpers -------------------------------------------------------------------------- */

static double now_seconds(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* This process's CPU time (user + system), seconds. */
static double cpu_seconds(void) {
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return (double)(ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) +
           1e-6 * (double)(ru.ru_utime.tv_usec + ru.ru_stime.tv_usec);
}

static void sleep_ms(long ms) {
    struct timespec ts = {.tv_sec = ms / 1000, .tv_nsec = (ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

static bool buffer_reserve(buffer *b, size_t extra) {
    if (b->len + extra + 1 <= b->cap) {
        return true;
    }
    size_t cap = b->cap ? b->cap : 1024;
    while (cap < b->len + extra + 1) {
        cap *= 2;
    }
    char *p = realloc(b->data, cap);
    if (p == NULL) {
        return false;
    }
    b->data = p;
    b->cap = cap;
    return true;
}

static bool buffer_append(buffer *b, const char *s, size_t n) {
    if (!buffer_reserve(b, n)) {
        return false;
    }
    memcpy(b->data + b->len, s, n);
    b->len += n;
    b->data[b->len] = '\0';
    return true;
}

static bool buffer_printf(buffer *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

static bool buffer_printf(buffer *b, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(NULL, 0, fmt, ap);
    va_end(ap);
    if (n < 0 || !buffer_reserve(b, (size_t)n)) {
        return false;
    }
    va_start(ap, fmt);
    vsnprintf(b->data + b->len, (size_t)n + 1, fmt, ap);
    va_end(ap);
    b->len += (size_t)n;
    return true;
}

static bool push_double(double **v, size_t *n, size_t *cap, double x) {
    if (*n == *cap) {
        size_t c = *cap ? 2 * *cap : 4096;
        double *p = realloc(*v, c * sizeof(double));
        if (p == NULL) {
            return false;
        }
        *v = p;
        *cap = c;
    }
    (*v)[(*n)++] = x;
    return true;
}

static bool latency_add(latency_stats *s, double ms) {
    return push_double(&s->ms, &s->n, &s->cap, ms);
}

static int compare_doubles(const void *a, const void *b) {
    double x = *(const double *)a;
    double y = *(const double *)b;
    return (x > y) - (x < y);
}

/* Nearest-rank percentile of sorted values: the smallest value with at least q of them <= it. */
static double percentile(const double *sorted, size_t n, double q) {
    size_t rank = (size_t)ceil(q * (double)n);
    return sorted[rank > 0 ? rank - 1 : 0];
}

/* The "x" tensor value for rows x cols floats: a base64 object of little-endian float32 (written
 * byte by byte, so it does not depend on the host's byte order) or nested arrays. */
static char *tensor_json(const float *v, int32_t rows, int32_t cols, bool is_json_floats) {
    buffer b = {0};
    size_t n = (size_t)rows * (size_t)cols;
    bool ok = true;
    if (is_json_floats) {
        ok = buffer_append(&b, "[", 1);
        for (int32_t r = 0; r < rows && ok; r++) {
            ok = buffer_append(&b, r ? ",[" : "[", r ? 2 : 1);
            for (int32_t c = 0; c < cols && ok; c++) {
                ok = buffer_printf(&b, c ? ",%.9g" : "%.9g", v[(size_t)r * cols + c]);
            }
            ok = ok && buffer_append(&b, "]", 1);
        }
        ok = ok && buffer_append(&b, "]", 1);
    } else {
        static const char alphabet[] =
            "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
        size_t n_bytes = 4 * n;
        ok = buffer_printf(&b, "{\"shape\":[%" PRId32 ",%" PRId32 "],\"b64\":\"", rows, cols) &&
             buffer_reserve(&b, (n_bytes + 2) / 3 * 4 + 3);
        for (size_t i = 0; i < n_bytes && ok; i += 3) {
            uint8_t in[3] = {0, 0, 0};
            size_t k = n_bytes - i < 3 ? n_bytes - i : 3;
            for (size_t j = 0; j < k; j++) {
                uint32_t bits;
                memcpy(&bits, &v[(i + j) / 4], sizeof(bits));
                in[j] = (uint8_t)(bits >> (8 * ((i + j) % 4)));
            }
            char out[4] = {alphabet[in[0] >> 2], alphabet[((in[0] & 3) << 4) | (in[1] >> 4)],
                           alphabet[((in[1] & 15) << 2) | (in[2] >> 6)], alphabet[in[2] & 63]};
            if (k < 3) {
                out[3] = '=';
                out[2] = k < 2 ? '=' : out[2];
            }
            ok = buffer_append(&b, out, 4);
        }
        ok = ok && buffer_append(&b, "\"}", 2);
    }
    if (!ok) {
        free(b.data);
        return NULL;
    }
    return b.data;
}

/* ---- requests ------------------------------------------------------------------------------- */

/* This process's id, read once (getpid is a system call each time: 32 a batch call). */
static long g_pid;

/* The id of a client's session k (generation-stamped, so a replaced session gets a new id). */
static void session_id(const client *c, int32_t k, char *out, size_t size) {
    snprintf(out, size, "load-%ld-%" PRId32 "-%" PRId32 "-%" PRId32, g_pid, c->index, c->generation,
             k);
}

/* Counts an error; the first one is kept for the report, naming the client's session k. */
static void record_error(load_run *r, long status, const client *c, int32_t k, const char *what) {
    r->errors.by_status[status > 0 && status < 600 ? status : 0]++;
    r->errors.n++;
    if (r->errors.first[0] == '\0') {
        char id[96];
        session_id(c, k, id, sizeof id);
        snprintf(r->errors.first, sizeof(r->errors.first),
                 "client %" PRId32 " (session %s): %s: %.*s", c->index, id, what, 200,
                 c->conn.state == LHTTP_DONE ? c->conn.body : c->conn.error);
    }
}

/* Starts the client's request: method "POST" (with c->body, and with --binary's header when
 * c->json_len is set) or "DELETE". A request that cannot start (a refused connection) counts
 * when it is accounted for, as one that fails on the way. */
static bool start_request(load_run *r, client *c, const char *method, const char *path) {
    char headers[sizeof r->headers + 64];
    snprintf(headers, sizeof headers, "%s", r->headers);
    if (c->json_len > 0) {
        size_t n = strlen(headers);
        snprintf(headers + n, sizeof headers - n, "Inference-Header-Content-Length: %zu\r\n",
                 c->json_len);
    }
    bool is_post = strcmp(method, "POST") == 0;
    size_t tail_len = c->has_tail ? (size_t)r->opts->n_batch * (size_t)r->hidden * 4 : 0;
    c->has_tail = false; /* this request's alone */
    (void)lhttp_start_parts(&c->conn, method, path, headers, is_post ? c->body.data : NULL,
                            is_post ? c->body.len : 0, tail_len > 0 ? c->x : NULL, tail_len);
    return true;
}

/* Abandons the client's sessions (their state is unknown after an error) for fresh ones. */
static void replace_sessions(client *c) {
    c->generation++;
    c->n_tokens = 0;
    c->cursor = 0;
}

/* Sends the body built in c->body. --binary: its first json_len bytes are the JSON header and
 * the call carries its own Inference-Header-Content-Length beside the run's headers. */
static bool send_attend(load_run *r, client *c, size_t json_len) {
    c->json_len = r->opts->is_binary ? json_len : 0;
    return start_request(r, c, "POST", "/v1/attend");
}

/* Appends "x": rows of this run's tensor: a binary tensor field (its raw bytes go after the
 * header), a base64 object or nested arrays (json). */
static bool append_x(const load_run *r, buffer *b, const char *json, int32_t rows) {
    if (r->opts->is_binary) {
        size_t bytes = (size_t)rows * (size_t)r->hidden * sizeof(float);
        return buffer_printf(b,
                             "\"x\":{\"shape\":[%" PRId32 ",%" PRId32 "],\"binary_data_size\":%zu}",
                             rows, r->hidden, bytes);
    }
    return buffer_printf(b, "\"x\":%s", json);
}

/* The fields every attend call of the run has: its layer and how tensors come back. */
static bool append_common(load_run *r, client *c) {
    bool ok = r->opts->is_binary ? buffer_printf(&c->body, "\"binary_output\":true,")
                                 : buffer_printf(&c->body, "\"encoding_format\":\"base64\",");
    if (ok && r->opts->layer >= 0) {
        ok = buffer_printf(&c->body, "\"layer\":%" PRId32 ",", r->opts->layer);
    }
    return ok;
}

/* One call for the client's session k: its prefill, or (without --batch) a decode step. */
static bool start_attend_one(load_run *r, client *c, int32_t k, bool is_prefill) {
    char id[96];
    session_id(c, k, id, sizeof id);
    int32_t rows = is_prefill ? r->opts->n_prefill : 1;
    c->body.len = 0;
    bool ok = buffer_printf(&c->body, "{\"session_id\":\"%s\",\"expect_n_past\":%" PRId32 ",", id,
                            c->n_tokens) &&
              append_common(r, c) &&
              append_x(r, &c->body, is_prefill ? r->prefill_json : c->x_json, rows) &&
              buffer_append(&c->body, "}", 1);
    size_t json_len = c->body.len;
    if (ok && r->opts->is_binary) {
        const float *x = is_prefill ? r->prefill_x : c->x;
        ok = buffer_append(&c->body, (const char *)x, (size_t)rows * (size_t)r->hidden * 4);
    }
    return ok && send_attend(r, c, json_len);
}

/* Makes the client's step_heads for its current generation of sessions. */
static bool make_step_heads(load_run *r, client *c) {
    c->step_heads.len = 0;
    bool ok = true;
    for (int32_t k = 0; k < r->opts->n_batch && ok; k++) {
        char id[96];
        session_id(c, k, id, sizeof id);
        ok = buffer_printf(&c->step_heads,
                           "%s{\"session_id\":\"%s\",\"expect_n_past\":", k ? "," : "", id);
        c->step_head_end[k] = c->step_heads.len;
    }
    c->step_heads_generation = ok ? c->generation : -1;
    return ok;
}

/* Appends a non-negative integer's decimal digits. */
static bool append_count(buffer *b, int32_t v) {
    char digits[12];
    size_t n = 0;
    uint32_t u = v > 0 ? (uint32_t)v : 0;
    do {
        digits[sizeof digits - ++n] = (char)('0' + u % 10);
        u /= 10;
    } while (u > 0);
    return buffer_append(b, digits + sizeof digits - n, n);
}

/* One decode call carrying a step of each of the client's --batch sessions. */
static bool start_attend_batch(load_run *r, client *c) {
    c->body.len = 0;
    bool ok = (c->step_heads_generation == c->generation || make_step_heads(r, c)) &&
              buffer_append(&c->body, "{", 1) && append_common(r, c) &&
              buffer_append(&c->body, "\"steps\":[", 9);
    size_t tail_len = strlen(c->step_tail);
    for (int32_t k = 0; k < r->opts->n_batch && ok; k++) {
        size_t from = k > 0 ? c->step_head_end[k - 1] : 0;
        ok = buffer_append(&c->body, c->step_heads.data + from, c->step_head_end[k] - from) &&
             append_count(&c->body, c->n_tokens) && buffer_append(&c->body, c->step_tail, tail_len);
    }
    ok = ok && buffer_append(&c->body, "]}", 2);
    size_t json_len = c->body.len;
    if (!ok) {
        return false;
    }
    c->has_tail = r->opts->is_binary; /* the rows follow from c->x, not copied into body */
    return send_attend(r, c, json_len);
}

static bool start_next(load_run *r, client *c) {
    if (r->is_stopping || (r->is_prefill_only && c->n_tokens > 0)) {
        c->phase = PHASE_IDLE;
        return true;
    }
    if (c->n_tokens == 0) {
        c->phase = PHASE_PREFILL;
        return start_attend_one(r, c, c->cursor, true);
    }
    if (c->n_tokens + 1 > r->max_tokens) {
        /* Roll back to the prefill rather than run into context_length_exceeded. */
        char id[96];
        char path[160];
        session_id(c, c->cursor, id, sizeof id);
        snprintf(path, sizeof(path), "/v1/sessions/%s/truncate", id);
        c->body.len = 0;
        c->phase = PHASE_TRUNCATE;
        c->json_len = 0;
        return buffer_printf(&c->body, "{\"n_tokens\":%" PRId32 "}", r->opts->n_prefill) &&
               start_request(r, c, "POST", path);
    }
    c->phase = PHASE_DECODE;
    return r->opts->n_batch > 1 ? start_attend_batch(r, c) : start_attend_one(r, c, 0, false);
}

/* The n float32 values of an output into out: --binary's raw part (at raw), or else its base64
 * ("b64"), little-endian. False unless the base64 carries exactly n values. */
static bool output_values(const step_view *answer, const char *raw, size_t n, float *out) {
    if (raw != NULL) {
        memcpy(out, raw, n * sizeof(float));
        return true;
    }
    /* base64 has no character JSON must escape; an escaped one is not the daemon's answer */
    const char *t = answer->has_b64 && !answer->b64.has_escapes ? answer->b64.text : NULL;
    size_t len = t != NULL ? answer->b64.len : 0;
    if (len != (4 * n + 2) / 3 * 4) {
        return false;
    }
    static int8_t value_of[256];
    if (value_of['B'] == 0) {
        memset(value_of, -1, sizeof value_of);
        const char *alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
        for (int i = 0; i < 64; i++) {
            value_of[(uint8_t)alphabet[i]] = (int8_t)i;
        }
    }
    uint32_t word = 0;
    size_t n_bytes = 0;
    for (size_t i = 0; i < len && n_bytes < 4 * n; i += 4) {
        uint32_t quad = 0;
        for (size_t j = 0; j < 4; j++) {
            int8_t v = t[i + j] == '=' ? 0 : value_of[(uint8_t)t[i + j]];
            if (v < 0) {
                return false;
            }
            quad = quad << 6 | (uint32_t)v;
        }
        for (int j = 2; j >= 0 && n_bytes < 4 * n; j--) {
            word |= (quad >> (8 * j) & 0xffu) << (8 * (n_bytes % 4));
            if (++n_bytes % 4 == 0) {
                memcpy(&out[n_bytes / 4 - 1], &word, sizeof word);
                word = 0;
            }
        }
    }
    return true;
}

/* Four floats as one vector value (GCC and clang's vector extension): the loads go through
 * memcpy, so the values may lie at any address (a framed answer's, read where it lies). */
typedef float f32x4 __attribute__((vector_size(16)));
typedef int32_t i32x4 __attribute__((vector_size(16)));

static f32x4 load_f32x4(const unsigned char *p) {
    f32x4 v;
    memcpy(&v, p, sizeof v);
    return v;
}

static f32x4 abs_f32x4(f32x4 x) {
    return (f32x4)((i32x4)x & 0x7fffffff);
}

/* a > b ? a : b lane by lane: b where a is a NaN (b, an accumulator, stays a number) */
static f32x4 max_f32x4(f32x4 a, f32x4 b) {
    i32x4 m = a > b;
    return (f32x4)(((i32x4)a & m) | ((i32x4)b & ~m));
}

/* The largest |v[i]|, |ref[i]| and |v[i] - ref[i]| over the n floats at v and ref (ref may be
 * NULL: those two 0), and whether each v[i] is finite. v and ref are bytes at any alignment (a
 * framed answer's values are read where they lie, not copied out first). Vectors of four, two
 * at a time and without a branch: value by value with a branch each this was 23 instructions a
 * value, the load generator's largest cost (callgrind: 0.37 M of a 32-step call's checks). It
 * is still a tenth of the generator's CPU on 32-step calls at L=2048 (perf, ~19 us a call, as
 * with eight lanes kept in arrays before): the answer's 64 KiB, not the arithmetic. */
static bool value_extremes(const void *v, const void *ref, size_t n, float *largest, float *scale,
                           float *worst) {
    const unsigned char *a = v, *b = ref != NULL ? ref : v; /* no ref: v against itself */
    f32x4 zero = {0};
    f32x4 big0 = zero, big1 = zero, sc0 = zero, sc1 = zero, wo0 = zero, wo1 = zero;
    i32x4 bad = {0};
    const i32x4 exponent = {0x7f800000, 0x7f800000, 0x7f800000, 0x7f800000};
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        f32x4 x0 = load_f32x4(a + 4 * i), x1 = load_f32x4(a + 4 * i + 16);
        f32x4 y0 = load_f32x4(b + 4 * i), y1 = load_f32x4(b + 4 * i + 16);
        bad |= (((i32x4)x0 & exponent) == exponent) | (((i32x4)x1 & exponent) == exponent);
        big0 = max_f32x4(abs_f32x4(x0), big0);
        big1 = max_f32x4(abs_f32x4(x1), big1);
        sc0 = max_f32x4(abs_f32x4(y0), sc0);
        sc1 = max_f32x4(abs_f32x4(y1), sc1);
        wo0 = max_f32x4(abs_f32x4(x0 - y0), wo0);
        wo1 = max_f32x4(abs_f32x4(x1 - y1), wo1);
    }
    big0 = max_f32x4(big1, big0);
    sc0 = max_f32x4(sc1, sc0);
    wo0 = max_f32x4(wo1, wo0);
    bool finite = true;
    *largest = *scale = *worst = 0.0f;
    for (int l = 0; l < 4; l++) {
        finite = finite && bad[l] == 0;
        *largest = big0[l] > *largest ? big0[l] : *largest;
        *scale = sc0[l] > *scale ? sc0[l] : *scale;
        *worst = wo0[l] > *worst ? wo0[l] : *worst;
    }
    for (; i < n; i++) {
        float x, y;
        memcpy(&x, a + 4 * i, sizeof x);
        memcpy(&y, b + 4 * i, sizeof y);
        finite = finite && isfinite(x);
        *largest = fabsf(x) > *largest ? fabsf(x) : *largest;
        *scale = fabsf(y) > *scale ? fabsf(y) : *scale;
        *worst = fabsf(x - y) > *worst ? fabsf(x - y) : *worst;
    }
    if (ref == NULL) {
        *scale = *worst = 0.0f;
    }
    return finite;
}

/* Whether an answer's n values (at v, any alignment) can be right: every one finite, not all
 * zero (a server that skips the work), and, with ref, each within 1e-3 x ref's largest
 * magnitude of ref (the same computation again, maybe batched otherwise). Says why not in
 * r->why. */
static bool values_ok(load_run *r, const void *v, const float *ref, size_t n) {
    float largest, scale, worst;
    if (!value_extremes(v, ref, n, &largest, &scale, &worst)) {
        for (size_t i = 0; i < n; i++) { /* the first that is not finite, named */
            float x;
            memcpy(&x, (const unsigned char *)v + 4 * i, sizeof x);
            if (!isfinite(x)) {
                snprintf(r->why, sizeof r->why, "output value %zu is %g", i, (double)x);
                break;
            }
        }
        return false;
    }
    if (largest == 0.0f) {
        snprintf(r->why, sizeof r->why, "every output value is 0");
        return false;
    }
    if (ref != NULL && !(worst <= 1e-3f * scale)) {
        snprintf(r->why, sizeof r->why,
                 "output differs by %.3g (of %.3g) from the same tokens' answered before", worst,
                 scale);
        return false;
    }
    return true;
}

/* ---- answers ------------------------------------------------------------------------------- */

/* An answer's JSON is read with the daemon's pull reader (server/json.c: strict, nothing
 * allocated): with cJSON a 32-step answer's 5 KB cost ~400k instructions a call (a node and a
 * key copy per item, strtod per number), the largest part of the generator's own work, on the
 * cores the daemon it measures computes on. */

/* Skips the next value, whatever it holds. 0, or -1 on a syntax error. */
static int skip_value(struct json_reader *rd) {
    struct json_span span;
    double number;
    bool flag;
    int more;
    switch (json_peek(rd)) {
    case JSON_TYPE_OBJECT:
        if (json_object_begin(rd) != 0) {
            return -1;
        }
        while ((more = json_object_next(rd, &span)) == 1) {
            if (skip_value(rd) != 0) {
                return -1;
            }
        }
        return more == 0 ? 0 : -1;
    case JSON_TYPE_ARRAY:
        if (json_array_begin(rd) != 0) {
            return -1;
        }
        while ((more = json_array_next(rd)) == 1) {
            if (skip_value(rd) != 0) {
                return -1;
            }
        }
        return more == 0 ? 0 : -1;
    case JSON_TYPE_STRING:
        return json_read_string(rd, &span);
    case JSON_TYPE_NUMBER:
        return json_read_number(rd, &number);
    case JSON_TYPE_BOOL:
        return json_read_bool(rd, &flag);
    case JSON_TYPE_NULL:
        return json_read_null(rd);
    case JSON_TYPE_INVALID:
        break;
    }
    return json_read_null(rd); /* fails, recording where */
}

/* A number where one is expected: *has says whether it was one (anything else is skipped). */
static int read_number_if(struct json_reader *rd, double *out, bool *has) {
    *has = json_peek(rd) == JSON_TYPE_NUMBER;
    return *has ? json_read_number(rd, out) : skip_value(rd);
}

/* "output": {"shape": [...], "b64": "..."} (or framed: shape and binary_data_size). */
static int read_output(struct json_reader *rd, step_view *v) {
    if (json_peek(rd) != JSON_TYPE_OBJECT) {
        return skip_value(rd);
    }
    struct json_span key;
    int more, rc = json_object_begin(rd);
    while (rc == 0 && (more = json_object_next(rd, &key)) == 1) {
        if (json_span_equals(&key, "shape") && json_peek(rd) == JSON_TYPE_ARRAY) {
            rc = json_array_begin(rd);
            while (rc == 0 && (more = json_array_next(rd)) == 1) {
                bool is_number;
                double d = 0;
                rc = read_number_if(rd, &d, &is_number);
                if (v->n_shape < 2) {
                    v->shape[v->n_shape] = is_number ? d : NAN;
                }
                v->n_shape++;
            }
            rc = rc == 0 && more == 0 ? 0 : -1;
        } else if (json_span_equals(&key, "b64") && json_peek(rd) == JSON_TYPE_STRING) {
            rc = json_read_string(rd, &v->b64);
            v->has_b64 = rc == 0;
        } else {
            rc = skip_value(rd);
        }
    }
    return rc == 0 && more == 0 ? 0 : -1;
}

/* "timing": {"queue_ms": ..., "compute_ms": ...} */
static int read_timing(struct json_reader *rd, step_view *v) {
    if (json_peek(rd) != JSON_TYPE_OBJECT) {
        return skip_value(rd);
    }
    v->has_timing = true;
    struct json_span key;
    bool has_queue;
    int more, rc = json_object_begin(rd);
    while (rc == 0 && (more = json_object_next(rd, &key)) == 1) {
        if (json_span_equals(&key, "queue_ms")) {
            rc = read_number_if(rd, &v->queue_ms, &has_queue);
            v->queue_ms = has_queue ? v->queue_ms : 0.0;
        } else if (json_span_equals(&key, "compute_ms")) {
            rc = read_number_if(rd, &v->compute_ms, &v->has_compute);
            v->compute_ms = v->has_compute ? v->compute_ms : 0.0;
        } else {
            rc = skip_value(rd);
        }
    }
    return rc == 0 && more == 0 ? 0 : -1;
}

/* One session's answer (an object), or a failed step's error object. */
static int read_step(struct json_reader *rd, step_view *v) {
    memset(v, 0, sizeof *v);
    if (json_peek(rd) != JSON_TYPE_OBJECT) {
        return skip_value(rd); /* not an answer: nothing in v passes the checks */
    }
    struct json_span key;
    int more, rc = json_object_begin(rd);
    while (rc == 0 && (more = json_object_next(rd, &key)) == 1) {
        if (json_span_equals(&key, "status")) {
            rc = read_number_if(rd, &v->status, &v->has_status);
        } else if (json_span_equals(&key, "n_tokens")) {
            rc = read_number_if(rd, &v->n_tokens, &v->has_n_tokens);
        } else if (json_span_equals(&key, "output")) {
            rc = read_output(rd, v);
        } else if (json_span_equals(&key, "timing")) {
            rc = read_timing(rd, v);
        } else {
            rc = skip_value(rd);
        }
    }
    return rc == 0 && more == 0 ? 0 : -1;
}

/* Checks one session's answer: n_tokens as expected and an output of shape (rows, hidden). */
static bool step_answer_ok(const load_run *r, const step_view *v, int32_t n_tokens, int32_t rows) {
    return v->has_n_tokens && v->n_tokens == n_tokens && v->n_shape == 2 && v->shape[0] == rows &&
           v->shape[1] == r->hidden;
}

/* Reads an attend answer's JSON into views: a batch's "results", at most n_steps of them (their
 * count in *n_read), or the body itself as views[0]. False for malformed JSON or a part that
 * is not as an answer has it. */
static bool read_answer(const char *json, size_t len, bool is_batch, int32_t n_steps,
                        step_view *views, int32_t *n_read) {
    struct json_reader rd;
    json_reader_init(&rd, json, len);
    *n_read = 0;
    if (!is_batch) {
        *n_read = 1;
        return read_step(&rd, &views[0]) == 0 && json_reader_finish(&rd) == 0;
    }
    struct json_span key;
    int more;
    if (json_object_begin(&rd) != 0) {
        return false;
    }
    while ((more = json_object_next(&rd, &key)) == 1) {
        if (!json_span_equals(&key, "results")) {
            if (skip_value(&rd) != 0) {
                return false;
            }
            continue;
        }
        if (json_array_begin(&rd) != 0) {
            return false;
        }
        while ((more = json_array_next(&rd)) == 1) {
            int rc = *n_read < n_steps ? read_step(&rd, &views[*n_read]) : skip_value(&rd);
            if (rc != 0) {
                return false;
            }
            (*n_read)++;
        }
        if (more < 0) {
            return false;
        }
    }
    return more == 0 && json_reader_finish(&rd) == 0;
}

/* Checks an attend answer: n_steps sessions' answers (a batch's "results", in order, or the
 * body itself) of `rows` new tokens each, and their values (values_ok: a prefill's, s being
 * r->prefill, against the first prefill's; a batch's steps against its first). Adds the server's
 * timing (a batch's first step's: the steps ran as one engine call) to s. A failed step's own
 * status goes to *step_status (else it stays 200) and its index to *bad_step. */
static bool attend_answer_ok(load_run *r, const client *c, bool is_batch, int32_t rows,
                             latency_stats *s, long *step_status, int32_t *bad_step) {
    int32_t n_steps = is_batch ? r->opts->n_batch : 1;
    /* a framed (--binary) answer's JSON is its first line; the raw outputs follow it */
    const char *body = c->conn.body;
    size_t body_len = c->conn.body_len;
    size_t json_len = body_len;
    size_t n_values = (size_t)rows * (size_t)r->hidden;
    bool is_prefill = s == &r->prefill;
    *step_status = 200;
    r->why[0] = '\0';
    if (r->opts->is_binary) {
        const char *nl = memchr(body, '\n', body_len);
        json_len = nl != NULL ? (size_t)(nl - body) + 1 : 0;
    }
    int32_t n_read;
    bool ok =
        read_answer(body, json_len, is_batch, n_steps, r->views, &n_read) && n_read == n_steps;
    if (ok && r->opts->is_binary) {
        ok = body_len == json_len + (size_t)n_steps * n_values * 4;
    }
    for (int32_t k = 0; k < n_steps && ok; k++) {
        const step_view *answer = &r->views[k];
        if (answer->has_status) {
            *step_status = (long)answer->status;
        }
        ok = step_answer_ok(r, answer, c->n_tokens + rows, rows);
        *bad_step = is_batch ? k : *bad_step;
        /* the values: a batch's steps against its first, a prefill against the first prefill;
         * framed, a later step's are read where they lie (the first is kept, as their ref) */
        float *v = r->values + (k > 0 ? (size_t)r->hidden : 0);
        const char *raw = r->opts->is_binary ? body + json_len + (size_t)k * n_values * 4 : NULL;
        const void *at = v;
        if (raw != NULL && k > 0) {
            at = raw;
        } else if (ok && !output_values(answer, raw, n_values, v)) {
            snprintf(r->why, sizeof r->why, "output values missing or malformed");
            ok = false;
        }
        const float *ref = k > 0 ? r->values : is_prefill ? r->prefill_ref : NULL;
        ok = ok && values_ok(r, at, ref, n_values);
        if (ok && is_prefill && r->prefill_ref == NULL) {
            r->prefill_ref = malloc(n_values * sizeof(float));
            ok = r->prefill_ref != NULL;
            if (ok) {
                memcpy(r->prefill_ref, v, n_values * sizeof(float));
            }
        }
    }
    const step_view *first = &r->views[0];
    if (ok && first->has_timing) {
        s->sum_queue_ms += first->queue_ms;
        s->sum_compute_ms += first->compute_ms;
        if (first->has_compute) {
            ok = push_double(&s->compute_ms, &s->n_compute, &s->cap_compute, first->compute_ms);
        }
    }
    return ok;
}

/* Accounts for a finished request and starts the client's next one. */
static bool on_done(load_run *r, client *c) {
    long status = c->conn.status;
    r->last_done_s = now_seconds();
    r->why[0] = '\0';
    double ms = (double)(c->conn.done_ns - c->conn.started_ns) * 1e-6;
    if (c->conn.state != LHTTP_DONE) {
        record_error(r, 0, c, c->cursor, "transport");
        lhttp_finish(&c->conn);
        c->phase = PHASE_DEAD;
        return true;
    }
    bool ok = false;
    int32_t k = c->cursor; /* the session concerned: a batch's failed step says which */
    switch (c->phase) {
    case PHASE_PREFILL:
        ok = status == 200 &&
             attend_answer_ok(r, c, false, r->opts->n_prefill, &r->prefill, &status, &k);
        if (ok && ++c->cursor == r->opts->n_batch) {
            c->n_tokens = r->opts->n_prefill;
            c->cursor = 0;
        }
        ok = ok && latency_add(&r->prefill, ms);
        break;
    case PHASE_DECODE:
        ok = status == 200 &&
             attend_answer_ok(r, c, r->opts->n_batch > 1, 1, &r->decode, &status, &k);
        if (ok) {
            c->n_tokens++;
            ok = latency_add(&r->decode, ms);
        }
        break;
    case PHASE_TRUNCATE:
        ok = status == 200;
        if (ok && ++c->cursor == r->opts->n_batch) {
            c->n_tokens = r->opts->n_prefill;
            c->cursor = 0;
            r->n_truncates++;
        }
        break;
    case PHASE_IDLE:
    case PHASE_DEAD:
        break;
    }
    if (!ok) {
        /* The sessions' state is now unknown (409, 410, 507...): carry on with fresh ones; a
         * failed first prefill ends the client (the run reports it). */
        char what[160];
        snprintf(what, sizeof(what), "HTTP %ld%s%s", status, r->why[0] != '\0' ? ", " : "", r->why);
        record_error(r, status, c, k, what);
        if (r->is_prefill_only) {
            c->phase = PHASE_DEAD;
            return true;
        }
        replace_sessions(c);
        r->n_replaced += r->opts->n_batch;
    }
    lhttp_finish(&c->conn);
    return start_next(r, c);
}

/* How long a request may take before it counts as a transport error. */
#define REQUEST_TIMEOUT_NS (120 * 1000000000ull)

/* True when the client's request has ended (answered, failed or timed out). */
static bool has_ended(const client *c, uint64_t now_ns) {
    lhttp_state st = c->conn.state;
    return st == LHTTP_DONE || st == LHTTP_FAILED ||
           ((st == LHTTP_SENDING || st == LHTTP_RECEIVING) &&
            now_ns - c->conn.started_ns > REQUEST_TIMEOUT_NS);
}

/* Polls the clients' connections until none has a request in flight or the deadline passes
 * (deadline_s <= 0: none); at the deadline is_stopping is set and in-flight requests finish. */
static int pump(load_run *r, double deadline_s) {
    for (;;) {
        if (deadline_s > 0 && !r->is_stopping && now_seconds() >= deadline_s) {
            r->is_stopping = true;
        }
        uint64_t now_ns = (uint64_t)(now_seconds() * 1e9);
        nfds_t n = 0;
        for (int32_t i = 0; i < r->opts->n_clients; i++) {
            client *c = &r->clients[i];
            if (has_ended(c, now_ns)) {
                if (c->conn.state != LHTTP_DONE && c->conn.state != LHTTP_FAILED) {
                    snprintf(c->conn.error, sizeof c->conn.error, "timed out");
                    c->conn.state = LHTTP_FAILED;
                }
                if (!on_done(r, c)) {
                    fprintf(stderr, "attn_load: out of memory\n");
                    return -1;
                }
            }
            short ev = lhttp_events(&c->conn);
            r->polls[i] = (struct pollfd){.fd = ev != 0 ? c->conn.fd : -1, .events = ev};
            n += ev != 0;
        }
        if (n == 0) {
            return 0;
        }
        int got = poll(r->polls, (nfds_t)r->opts->n_clients, 50);
        if (got < 0 && errno != EINTR) {
            return -1;
        }
        for (int32_t i = 0; i < r->opts->n_clients && got > 0; i++) {
            if (r->polls[i].fd >= 0 && r->polls[i].revents != 0) {
                lhttp_advance(&r->clients[i].conn, r->polls[i].revents);
            }
        }
    }
}

/* ---- blocking calls: model, readiness, cleanup ---------------------------------------------- */

/* One request on a connection of its own; its status (-1 on a transport error), the body in
 * resp. */
static long http_simple(const load_run *r, const char *method, const char *path, buffer *resp,
                        long timeout_ms) {
    lhttp_conn conn;
    lhttp_init(&conn, &r->addr);
    long status = -1;
    resp->len = 0;
    if (lhttp_run(&conn, method, path, r->headers, NULL, 0, (int)timeout_ms) == LHTTP_DONE) {
        status = conn.status;
        status = buffer_append(resp, conn.body, conn.body_len) ? status : -1;
    }
    lhttp_release(&conn);
    return status;
}

/* Reads hidden_size and max_position_embeddings from GET /v1/model. */
static int read_model(load_run *r) {
    buffer resp = {0};
    long status = http_simple(r, "GET", "/v1/model", &resp, 10000);
    cJSON *root = status == 200 ? cJSON_ParseWithLength(resp.data, resp.len) : NULL;
    const cJSON *hidden = cJSON_GetObjectItemCaseSensitive(root, "hidden_size");
    const cJSON *max_pos = cJSON_GetObjectItemCaseSensitive(root, "max_position_embeddings");
    int rc = 0;
    if (!cJSON_IsNumber(hidden) || !cJSON_IsNumber(max_pos) || hidden->valueint < 1 ||
        max_pos->valueint < 2) {
        fprintf(stderr, "attn_load: GET %s/v1/model: HTTP %ld, %.200s\n", r->base_url, status,
                resp.len ? resp.data : "(no body)");
        rc = -1;
    } else {
        r->hidden = hidden->valueint;
        r->max_tokens = r->opts->max_tokens > 0 ? r->opts->max_tokens : max_pos->valueint;
    }
    cJSON_Delete(root);
    free(resp.data);
    return rc;
}

/* ---- the daemon (--spawn) ------------------------------------------------------------------- */

typedef struct daemon_proc {
    pid_t pid;       /* > 0 while it runs */
    bool has_log;    /* log_path names a file we created */
    int exit_status; /* once it has exited: its status, 128 + signal, or -1 if killed by us */
    char log_path[64];
    int port;
} daemon_proc;

static void print_log_tail(const char *log_path) {
    FILE *f = fopen(log_path, "r");
    if (f == NULL) {
        return;
    }
    char line[1024];
    fflush(stdout);
    fprintf(stderr, "attn_load: attnd log (%s):\n", log_path);
    while (fgets(line, sizeof(line), f) != NULL) {
        fprintf(stderr, "  %s", line);
    }
    fclose(f);
}

/* A TCP port on 127.0.0.1 that is free right now (bound to port 0, then released). Choosing it
 * here, rather than reading attnd's log, works at every --log-level; if another process takes it
 * before attnd binds, attnd exits and the readiness wait says so. */
static int pick_free_port(void) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0) {
        return -1;
    }
    struct sockaddr_in addr = {.sin_family = AF_INET, .sin_port = 0};
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof(addr);
    int port = -1;
    if (bind(fd, (struct sockaddr *)&addr, sizeof(addr)) == 0 &&
        getsockname(fd, (struct sockaddr *)&addr, &len) == 0) {
        port = ntohs(addr.sin_port);
    }
    close(fd);
    return port;
}

/* Starts attnd on 127.0.0.1 at a free port with the user's extra flags, its output going to a
 * log file. Readiness is wait_ready's job. */
static int spawn_daemon(const load_opts *o, daemon_proc *d) {
    d->port = pick_free_port();
    if (d->port <= 0) {
        fprintf(stderr, "attn_load: cannot find a free port on 127.0.0.1: %s\n", strerror(errno));
        return -1;
    }
    snprintf(d->log_path, sizeof(d->log_path), "/tmp/attn_load.XXXXXX");
    int fd = mkstemp(d->log_path);
    if (fd < 0) {
        fprintf(stderr, "attn_load: mkstemp: %s\n", strerror(errno));
        return -1;
    }
    d->has_log = true;
    size_t n_extra = 0;
    while (o->daemon_args[n_extra] != NULL) {
        n_extra++;
    }
    char port[16];
    snprintf(port, sizeof(port), "%d", d->port);
    char **argv = calloc(n_extra + 6, sizeof(char *));
    if (argv == NULL) {
        close(fd);
        return -1;
    }
    argv[0] = (char *)o->spawn_path;
    argv[1] = "--host";
    argv[2] = "127.0.0.1";
    argv[3] = "--port";
    argv[4] = port;
    memcpy(argv + 5, o->daemon_args, n_extra * sizeof(char *));
    d->pid = fork();
    if (d->pid == 0) {
        dup2(fd, STDOUT_FILENO);
        dup2(fd, STDERR_FILENO);
        execv(o->spawn_path, argv);
        fprintf(stderr, "attn_load: exec %s: %s\n", o->spawn_path, strerror(errno));
        _exit(127);
    }
    close(fd);
    free(argv);
    if (d->pid < 0) {
        fprintf(stderr, "attn_load: fork: %s\n", strerror(errno));
        return -1;
    }
    return 0;
}

/* True (and the exit status recorded) if the spawned daemon has exited. */
static bool daemon_has_exited(daemon_proc *d) {
    int status = 0;
    if (d->pid <= 0 || waitpid(d->pid, &status, WNOHANG) != d->pid) {
        return false;
    }
    d->pid = -1;
    d->exit_status = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    return true;
}

/* SIGTERM, then up to 30 s for the drain (SIGKILL after that). */
static void stop_daemon(daemon_proc *d) {
    if (d->pid <= 0) {
        return;
    }
    kill(d->pid, SIGTERM);
    for (int i = 0; i < 600; i++) {
        if (daemon_has_exited(d)) {
            return;
        }
        sleep_ms(50);
    }
    kill(d->pid, SIGKILL);
    waitpid(d->pid, NULL, 0);
    d->pid = -1;
    d->exit_status = -1;
}

/* Polls GET /readyz until 200 (a model may take a while to build); d, when not NULL, is the
 * spawned daemon, whose early exit ends the wait at once. */
static int wait_ready(const load_run *r, daemon_proc *d, double timeout_s) {
    buffer resp = {0};
    double deadline = now_seconds() + timeout_s;
    long status = -1;
    while (now_seconds() < deadline) {
        status = http_simple(r, "GET", "/readyz", &resp, 2000);
        if (status == 200) {
            break;
        }
        if (d != NULL && daemon_has_exited(d)) {
            fprintf(stderr, "attn_load: attnd exited with status %d before it was ready\n",
                    d->exit_status);
            break;
        }
        sleep_ms(100);
    }
    free(resp.data);
    if (status != 200) {
        fprintf(stderr, "attn_load: %s/readyz not ready (last status %ld)\n", r->base_url, status);
        return -1;
    }
    return 0;
}

/* ---- the run -------------------------------------------------------------------------------- */

static int setup_clients(load_run *r) {
    const load_opts *o = r->opts;
    size_t hidden = (size_t)r->hidden;
    float *x = malloc((size_t)o->n_prefill * hidden * sizeof(float));
    if (x == NULL) {
        return -1;
    }
    bench_rand_fill(x, (size_t)o->n_prefill * hidden, 7);
    r->prefill_json = tensor_json(x, o->n_prefill, r->hidden, o->is_json_floats);
    r->prefill_x = o->is_binary ? malloc((size_t)o->n_prefill * hidden * sizeof(float)) : NULL;
    if (r->prefill_x != NULL) {
        memcpy(r->prefill_x, x, (size_t)o->n_prefill * hidden * sizeof(float));
    }
    r->values = malloc(((size_t)o->n_prefill + 1) * hidden * sizeof(float));
    r->views = calloc((size_t)o->n_batch, sizeof *r->views);
    r->clients = calloc((size_t)o->n_clients, sizeof(client));
    r->polls = calloc((size_t)o->n_clients, sizeof *r->polls);
    int rc = r->prefill_json != NULL && r->values != NULL && r->views != NULL &&
                     r->clients != NULL && r->polls != NULL
                 ? 0
                 : -1;
    for (int32_t i = 0; i < o->n_clients && rc == 0; i++) {
        client *c = &r->clients[i];
        c->index = i;
        bench_rand_fill(x, hidden, 100 + (uint64_t)i);
        c->x_json = tensor_json(x, 1, r->hidden, o->is_json_floats);
        c->x = o->is_binary ? malloc((size_t)o->n_batch * hidden * sizeof(float)) : NULL;
        for (int32_t k = 0; c->x != NULL && k < o->n_batch; k++) {
            memcpy(c->x + (size_t)k * hidden, x, hidden * sizeof(float));
        }
        lhttp_init(&c->conn, &r->addr);
        buffer tail = {0};
        bool made = c->x_json != NULL && buffer_append(&tail, ",", 1) &&
                    append_x(r, &tail, c->x_json, 1) && buffer_append(&tail, "}", 1);
        c->step_tail = tail.data;
        c->step_head_end = calloc((size_t)o->n_batch, sizeof *c->step_head_end);
        c->step_heads_generation = -1;
        if (!made || c->step_head_end == NULL || (o->is_binary && c->x == NULL)) {
            rc = -1;
            break;
        }
    }
    free(x);
    return rc;
}

static void free_clients(load_run *r) {
    for (int32_t i = 0; r->clients != NULL && i < r->opts->n_clients; i++) {
        client *c = &r->clients[i];
        lhttp_release(&c->conn);
        free(c->x);
        free(c->x_json);
        free(c->body.data);
        free(c->step_heads.data);
        free(c->step_head_end);
        free(c->step_tail);
    }
    free(r->clients);
    free(r->polls);
    free(r->prefill_json);
    free(r->prefill_x);
    free(r->prefill_ref);
    free(r->values);
    free(r->views);
    free(r->prefill.ms);
    free(r->decode.ms);
    free(r->prefill.compute_ms);
    free(r->decode.compute_ms);
}

static void print_stats(const char *label, latency_stats *s, double elapsed_s) {
    if (s->n == 0) {
        printf("%s: no successful requests\n", label);
        return;
    }
    qsort(s->ms, s->n, sizeof(double), compare_doubles);
    qsort(s->compute_ms, s->n_compute, sizeof(double), compare_doubles);
    printf("%s: %zu requests", label, s->n);
    if (elapsed_s > 0) {
        printf(" in %.2f s = %.1f req/s", elapsed_s, (double)s->n / elapsed_s);
    }
    printf("; latency ms p50 %.2f, p90 %.2f, p99 %.2f, max %.2f; server timing mean queue %.2f "
           "ms, compute %.2f ms",
           percentile(s->ms, s->n, 0.50), percentile(s->ms, s->n, 0.90),
           percentile(s->ms, s->n, 0.99), s->ms[s->n - 1], s->sum_queue_ms / (double)s->n,
           s->sum_compute_ms / (double)s->n);
    if (s->n_compute > 0) {
        printf(" (p50 %.3f ms)", percentile(s->compute_ms, s->n_compute, 0.50));
    }
    printf("\n");
}

static void print_errors(const error_stats *e) {
    if (e->n == 0) {
        printf("errors: none\n");
        return;
    }
    printf("errors: %" PRId64 " (", e->n);
    const char *sep = "";
    for (int s = 0; s < 600; s++) {
        if (e->by_status[s] > 0) {
            printf("%s%s%d x%" PRId64, sep, s == 0 ? "transport/malformed " : "HTTP ", s,
                   e->by_status[s]);
            sep = ", ";
        }
    }
    printf("); first: %s\n", e->first);
}

/* Deletes every client's sessions (best effort; failures only noted). */
static void delete_sessions(load_run *r) {
    buffer resp = {0};
    int32_t n_failed = 0;
    for (int32_t i = 0; i < r->opts->n_clients; i++) {
        for (int32_t k = 0; k < r->opts->n_batch; k++) {
            char id[96];
            char path[160];
            session_id(&r->clients[i], k, id, sizeof id);
            snprintf(path, sizeof(path), "/v1/sessions/%s", id);
            long status = http_simple(r, "DELETE", path, &resp, 10000);
            n_failed += status != 204 && status != 404;
        }
    }
    free(resp.data);
    if (n_failed > 0) {
        printf("cleanup: %" PRId32 " session deletes failed\n", n_failed);
    }
}

static int run_load(load_run *r) {
    const load_opts *o = r->opts;
    if (read_model(r) != 0 || setup_clients(r) != 0) {
        return -1;
    }
    if (r->max_tokens < o->n_prefill + 1) {
        fprintf(stderr,
                "attn_load: --prefill %" PRId32 " leaves no room below %" PRId32 " tokens\n",
                o->n_prefill, r->max_tokens);
        return -1;
    }
    printf("attn_load: %" PRId32 " clients", o->n_clients);
    if (o->n_batch > 1) {
        printf(" of %" PRId32 " sessions each (one step of each a call)", o->n_batch);
    }
    printf(" against %s (hidden %" PRId32 "), prefill %" PRId32
           " tokens, then %.1f s of 1-token decode steps; sessions roll back to the prefill at "
           "%" PRId32 " tokens\n",
           r->base_url, r->hidden, o->n_prefill, o->duration_s, r->max_tokens);
    fflush(stdout);

    /* Every session's prefill first (each client's one after another); then clients wait. */
    int32_t n_sessions = o->n_clients * o->n_batch;
    r->is_prefill_only = true;
    for (int32_t i = 0; i < o->n_clients; i++) {
        if (!start_next(r, &r->clients[i])) {
            return -1;
        }
    }
    if (pump(r, 0) != 0) {
        return -1;
    }
    r->is_prefill_only = false;
    print_stats("prefill", &r->prefill, 0);
    if (r->prefill.n < (size_t)n_sessions) {
        print_errors(&r->errors);
        fprintf(stderr, "attn_load: %zu of %" PRId32 " prefills failed\n",
                (size_t)n_sessions - r->prefill.n, n_sessions);
        return -1;
    }

    double t0 = now_seconds(), cpu0 = cpu_seconds();
    for (int32_t i = 0; i < o->n_clients; i++) {
        if (!start_next(r, &r->clients[i])) {
            return -1;
        }
    }
    if (pump(r, t0 + o->duration_s) != 0) {
        return -1;
    }
    double elapsed = r->last_done_s - t0, cpu_s = cpu_seconds() - cpu0;
    print_stats("decode", &r->decode, elapsed);
    if (r->decode.n > 0) {
        /* what the generator took from the cores it shares with the daemon */
        printf("decode: the generator's own CPU %.3f ms a call (%.1f%% of a core)\n",
               cpu_s * 1e3 / (double)r->decode.n, elapsed > 0 ? 100.0 * cpu_s / elapsed : 0.0);
    }
    if (o->n_batch > 1 && elapsed > 0) {
        printf("decode: %zu steps of %" PRId32 " sessions = %.1f tokens/s\n", r->decode.n,
               o->n_batch, (double)r->decode.n * o->n_batch / elapsed);
    }
    if (r->n_truncates > 0 || r->n_replaced > 0) {
        printf("sessions: %" PRId64 " rolled back at %" PRId32 " tokens, %" PRId64
               " replaced after an error\n",
               r->n_truncates, r->max_tokens, r->n_replaced);
    }
    print_errors(&r->errors);
    if (r->decode.n > 0) {
        latency_stats *s = &r->decode;
        printf("RESULT impl=attnd_load clients=%" PRId32 " batch=%" PRId32
               " duration_s=%.3f requests=%zu rps=%.2f tokens_per_s=%.2f p50_ms=%.3f "
               "p90_ms=%.3f p99_ms=%.3f max_ms=%.3f compute_p50_ms=%.3f client_cpu_ms=%.4f "
               "errors=%" PRId64 "\n",
               o->n_clients, o->n_batch, elapsed, s->n, (double)s->n / elapsed,
               (double)s->n * o->n_batch / elapsed, percentile(s->ms, s->n, 0.5),
               percentile(s->ms, s->n, 0.9), percentile(s->ms, s->n, 0.99), s->ms[s->n - 1],
               s->n_compute > 0 ? percentile(s->compute_ms, s->n_compute, 0.5) : -1.0,
               cpu_s * 1e3 / (double)s->n, r->errors.n);
    }
    delete_sessions(r);
    return r->errors.n == 0 && r->decode.n > 0 ? 0 : 1;
}

/* ---- main ----------------------------------------------------------------------------------- */

static void usage(FILE *f) {
    fprintf(f, "usage: attn_load [flags] [-- attnd flags]\n"
               "  --url URL          attnd base URL (default http://127.0.0.1:8080)\n"
               "  --spawn PATH       start PATH (e.g. build/attnd) on 127.0.0.1 at a free port\n"
               "                     and the flags after --, load it, then stop it with SIGTERM\n"
               "  --clients N        concurrent decode clients, one session each (default 16)\n"
               "  --batch B          B sessions per client: each decode call is one POST\n"
               "                     /v1/attend with a step of each (\"steps\"; default 1)\n"
               "  --duration S       seconds of decode steps (default 10)\n"
               "  --prefill T        tokens of each session's prefill (default 128)\n"
               "  --layer L          layer to attend (default: the server's first loaded layer)\n"
               "  --max-tokens N     roll a session back to its prefill at N tokens\n"
               "                     (default: the model's max_position_embeddings)\n"
               "  --api-key KEY      send Authorization: Bearer KEY\n"
               "  --json-floats      send x as nested JSON arrays instead of base64\n"
               "  --binary           the binary tensor extension both ways (raw float32)\n"
               "  --ready-timeout S  seconds to wait for a spawned attnd (default 120)\n");
}

static bool parse_num(const char *s, double lo, double hi, double *out) {
    char *end = NULL;
    double v = strtod(s, &end);
    if (s[0] == '\0' || *end != '\0' || !(v >= lo && v <= hi)) {
        return false;
    }
    *out = v;
    return true;
}

/* Returns 0 when the flags are valid, 1 after --help, -1 after printing what is wrong. */
static int parse_args(int argc, char **argv, load_opts *o) {
    static char *no_args[] = {NULL};
    o->daemon_args = no_args;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *val = i + 1 < argc ? argv[i + 1] : NULL;
        double v = 0;
        bool ok = true;
        if (strcmp(a, "--") == 0) {
            o->daemon_args = argv + i + 1;
            break;
        } else if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
            usage(stdout);
            return 1;
        } else if (strcmp(a, "--json-floats") == 0) {
            o->is_json_floats = true;
            continue;
        } else if (strcmp(a, "--binary") == 0) {
            o->is_binary = true;
            continue;
        } else if (val == NULL) {
            ok = false;
        } else if (strcmp(a, "--url") == 0) {
            o->url = val;
        } else if (strcmp(a, "--spawn") == 0) {
            o->spawn_path = val;
        } else if (strcmp(a, "--api-key") == 0) {
            o->api_key = val;
        } else if (strcmp(a, "--clients") == 0 && (ok = parse_num(val, 1, 4096, &v))) {
            o->n_clients = (int32_t)v;
        } else if (strcmp(a, "--batch") == 0 && (ok = parse_num(val, 1, 256, &v))) {
            o->n_batch = (int32_t)v;
        } else if (strcmp(a, "--duration") == 0 && (ok = parse_num(val, 0.1, 86400, &v))) {
            o->duration_s = v;
        } else if (strcmp(a, "--prefill") == 0 && (ok = parse_num(val, 1, 1 << 20, &v))) {
            o->n_prefill = (int32_t)v;
        } else if (strcmp(a, "--layer") == 0 && (ok = parse_num(val, 0, 1 << 20, &v))) {
            o->layer = (int32_t)v;
        } else if (strcmp(a, "--max-tokens") == 0 && (ok = parse_num(val, 2, 1 << 24, &v))) {
            o->max_tokens = (int32_t)v;
        } else if (strcmp(a, "--ready-timeout") == 0 && (ok = parse_num(val, 1, 3600, &v))) {
            o->ready_timeout_s = v;
        } else {
            ok = false;
        }
        if (!ok) {
            fprintf(stderr, "attn_load: bad flag or value: %s%s%s (see --help)\n", a,
                    val != NULL ? " " : "", val != NULL ? val : "");
            return -1;
        }
        i++;
    }
    return 0;
}

int main(int argc, char **argv) {
    load_opts o = {.url = "http://127.0.0.1:8080",
                   .n_clients = 16,
                   .n_batch = 1,
                   .duration_s = 10.0,
                   .n_prefill = 128,
                   .layer = -1,
                   .ready_timeout_s = 120.0};
    int prc = parse_args(argc, argv, &o);
    if (prc != 0) {
        return prc > 0 ? EXIT_SUCCESS : 2;
    }
    signal(SIGPIPE, SIG_IGN);
    g_pid = (long)getpid();
    load_run r = {.opts = &o};
    daemon_proc d = {.pid = -1};
    int rc = 0;
    if (o.spawn_path != NULL) {
        rc = spawn_daemon(&o, &d);
        snprintf(r.base_url, sizeof(r.base_url), "http://127.0.0.1:%d", d.port);
    } else {
        snprintf(r.base_url, sizeof(r.base_url), "%s", o.url);
        size_t len = strlen(r.base_url);
        if (len > 0 && r.base_url[len - 1] == '/') {
            r.base_url[len - 1] = '\0';
        }
    }
    int n = snprintf(r.headers, sizeof r.headers, "Content-Type: application/json\r\n");
    if (o.api_key != NULL) {
        n += snprintf(r.headers + n, sizeof r.headers - (size_t)n, "Authorization: Bearer %s\r\n",
                      o.api_key);
    }
    if (rc == 0 && ((size_t)n >= sizeof r.headers || lhttp_resolve(r.base_url, &r.addr) != 0)) {
        fprintf(stderr, "attn_load: cannot use %s%s (an http:// URL, an API key under 500 bytes)\n",
                r.base_url, (size_t)n >= sizeof r.headers ? " with that --api-key" : "");
        rc = -1;
    }
    if (rc == 0) {
        rc = wait_ready(&r, o.spawn_path != NULL ? &d : NULL,
                        o.spawn_path != NULL ? o.ready_timeout_s : 10.0);
    }
    if (rc == 0) {
        rc = run_load(&r);
    }
    free_clients(&r);
    if (d.pid > 0) {
        stop_daemon(&d);
        printf("attnd: stopped with SIGTERM, exit status %d\n", d.exit_status);
    }
    if (d.has_log && (d.exit_status != 0 || rc != 0)) {
        print_log_tail(d.log_path);
        rc = rc == 0 ? 1 : rc;
    } else if (d.has_log) {
        unlink(d.log_path);
    }
    return rc == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
