/* tests/check_framing.c: the binary tensor extension (KServe v2 / Open Inference Protocol),
 * through the real attnd (preset tiny). A request whose tensors come as raw float32 after its
 * JSON answers exactly what the same request in JSON answers; "binary_output" answers with raw
 * tensors after the JSON, bit for bit the floats a base64 answer carries; JSON and binary
 * tensors mix in one request; and every framing mistake is a 400 naming it, with nothing run.
 */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "http_client.h"

#define HIDDEN 64

static struct http_client_daemon daemon_;

static void setup(void) {
    memset(&daemon_, 0, sizeof daemon_);
    const char *args[] = {"--preset", "tiny", "--kv-dtype", "f32", NULL};
    http_client_daemon_start(&daemon_, args);
}

static void teardown(void) {
    http_client_daemon_kill(&daemon_);
}

/* A framed body: json, then the n_parts raw parts (little-endian float32 on this host). */
static char *framed(const char *json, const float *const *parts, const size_t *n_floats,
                    int n_parts, size_t *len) {
    size_t total = strlen(json);
    for (int i = 0; i < n_parts; i++) {
        total += n_floats[i] * 4;
    }
    char *b = malloc(total);
    size_t at = strlen(json);
    memcpy(b, json, at);
    for (int i = 0; i < n_parts; i++) {
        memcpy(b + at, parts[i], n_floats[i] * 4);
        at += n_floats[i] * 4;
    }
    *len = total;
    return b;
}

/* POSTs body (len bytes) to path with Inference-Header-Content-Length json_len (< 0: none). */
static void post(const char *path, const char *body, size_t len, long json_len,
                 struct http_client_response *r) {
    char u[200], h[96];
    snprintf(u, sizeof u, "%s%s", daemon_.base, path);
    snprintf(h, sizeof h, "Inference-Header-Content-Length: %ld", json_len);
    const char *hdrs[] = {h, "Content-Type: application/octet-stream", NULL};
    http_client_request("POST", u, body, len, json_len >= 0 ? hdrs : NULL, r);
}

/* A framed answer's tensor field: its floats (malloc'd), located by the JSON part's fields in
 * order. */
static float *raw_tensor(const struct http_client_response *r, const char *name, size_t *n) {
    char hl[32];
    ck_assert_ptr_nonnull(http_client_header(r, "Inference-Header-Content-Length", hl, sizeof hl));
    size_t json_len = (size_t)strtoull(hl, NULL, 10);
    ck_assert_uint_le(json_len, r->len);
    cJSON *j = cJSON_ParseWithLength(r->body, json_len);
    ck_assert_ptr_nonnull(j);
    size_t at = json_len;
    float *out = NULL;
    for (const cJSON *f = j->child; f != NULL; f = f->next) {
        const cJSON *size = cJSON_GetObjectItemCaseSensitive(f, "binary_data_size");
        if (!cJSON_IsNumber(size)) {
            continue;
        }
        size_t bytes = (size_t)size->valuedouble;
        if (strcmp(f->string, name) == 0) {
            ck_assert_uint_le(at + bytes, r->len);
            out = malloc(bytes);
            memcpy(out, r->body + at, bytes);
            *n = bytes / 4;
        }
        at += bytes;
    }
    ck_assert_uint_eq(at, r->len); /* the raw parts fill the rest exactly */
    cJSON_Delete(j);
    ck_assert_msg(out != NULL, "no binary tensor %s", name);
    return out;
}

static float *json_tensor(const struct http_client_response *r, const char *name, size_t *n) {
    cJSON *j = http_client_json(r);
    float *out = http_client_json_floats(cJSON_GetObjectItemCaseSensitive(j, name), n);
    cJSON_Delete(j);
    return out;
}

static void expect_error(const struct http_client_response *r, const char *param,
                         const char *needle) {
    ck_assert_msg(r->status == 400, "%ld %s", r->status, r->body);
    cJSON *j = http_client_json(r);
    const cJSON *e = cJSON_GetObjectItemCaseSensitive(j, "error");
    const cJSON *p = cJSON_GetObjectItemCaseSensitive(e, "param");
    ck_assert_msg(cJSON_IsString(p) && strcmp(p->valuestring, param) == 0, "%s", r->body);
    ck_assert_msg(strstr(cJSON_GetObjectItemCaseSensitive(e, "message")->valuestring, needle) !=
                      NULL,
                  "%s", r->body);
    cJSON_Delete(j);
}

START_TEST(test_framing_attend_matches_json) {
    float *x = http_client_random_rows(31, 5, HIDDEN);
    /* the same stateless call three ways: JSON in and out, binary in and out, binary in with
     * base64 out */
    char *body = http_client_attend_body(NULL, x, 0, 5, HIDDEN, false, ",\"return_weights\":true");
    struct http_client_response rj, rb, r64;
    post("/v1/attend", body, strlen(body), -1, &rj);
    ck_assert_int_eq(rj.status, 200);
    free(body);
    const char *head = "{\"x\":{\"shape\":[5,64],\"datatype\":\"FP32\",\"binary_data_size\":1280},"
                       "\"return_weights\":true,\"binary_output\":true}";
    const float *parts[] = {x};
    size_t nf[] = {5 * HIDDEN}, len;
    body = framed(head, parts, nf, 1, &len);
    post("/v1/attend", body, len, (long)strlen(head), &rb);
    ck_assert_msg(rb.status == 200, "%ld %s", rb.status, rb.body);
    char type[64];
    ck_assert_str_eq(http_client_header(&rb, "Content-Type", type, sizeof type),
                     "application/octet-stream");
    free(body);
    const char *head64 = "{\"x\":{\"shape\":[5,64],\"binary_data_size\":1280},"
                         "\"return_weights\":true,\"encoding_format\":\"base64\"}";
    body = framed(head64, parts, nf, 1, &len);
    post("/v1/attend", body, len, (long)strlen(head64), &r64);
    ck_assert_int_eq(r64.status, 200);
    free(body);
    const char *names[] = {"output", "weights"};
    for (int i = 0; i < 2; i++) {
        size_t nj, nb, n64;
        float *a = json_tensor(&rj, names[i], &nj);
        float *b = raw_tensor(&rb, names[i], &nb);
        float *c = json_tensor(&r64, names[i], &n64);
        ck_assert_uint_eq(nj, nb);
        ck_assert_uint_eq(nj, n64);
        /* base64 and raw carry the float bits; JSON's %.9g reads back to the same float */
        ck_assert_msg(memcmp(b, c, nb * 4) == 0, "%s: raw and base64 differ", names[i]);
        ck_assert_msg(memcmp(a, b, nb * 4) == 0, "%s: raw and JSON differ", names[i]);
        free(a);
        free(b);
        free(c);
    }
    http_client_response_release(&rj);
    http_client_response_release(&rb);
    http_client_response_release(&r64);
    /* a session's calls mix JSON and binary tensors: x raw, positions and key_mask in JSON */
    const char *mixed = "{\"session_id\":\"m\",\"x\":{\"shape\":[2,64],\"binary_data_size\":512},"
                        "\"positions\":[0,1],\"key_mask\":[1,1]}";
    size_t n2[] = {2 * HIDDEN};
    body = framed(mixed, parts, n2, 1, &len);
    post("/v1/attend", body, len, (long)strlen(mixed), &rj);
    ck_assert_msg(rj.status == 200, "%ld %s", rj.status, rj.body);
    http_client_response_release(&rj);
    free(body);
    free(x);
}
END_TEST

START_TEST(test_framing_answer_past_a_mebibyte_matches_base64) {
    /* 300 rows with their weights: 4 x 300 x 300 floats, 1.4 MB, past the size up to which the
     * server copies an answer's parts into one buffer (HTTP_GATHER_MAX), so this answer goes
     * out from its parts, where test_framing_attend_matches_json's goes out copied: the same
     * bytes either way */
    enum { ROWS = 300 };
    float *x = http_client_random_rows(51, ROWS, HIDDEN);
    char head[256], head64[256];
    snprintf(head, sizeof head,
             "{\"x\":{\"shape\":[%d,64],\"binary_data_size\":%d},\"return_weights\":true,"
             "\"binary_output\":true}",
             ROWS, ROWS * HIDDEN * 4);
    snprintf(head64, sizeof head64,
             "{\"x\":{\"shape\":[%d,64],\"binary_data_size\":%d},\"return_weights\":true,"
             "\"encoding_format\":\"base64\"}",
             ROWS, ROWS * HIDDEN * 4);
    const float *parts[] = {x};
    size_t nf[] = {(size_t)ROWS * HIDDEN}, len;
    struct http_client_response rb, r64;
    char *body = framed(head, parts, nf, 1, &len);
    post("/v1/attend", body, len, (long)strlen(head), &rb);
    ck_assert_msg(rb.status == 200, "%ld %s", rb.status, rb.body);
    ck_assert_uint_gt(rb.len, (size_t)1 << 20);
    free(body);
    body = framed(head64, parts, nf, 1, &len);
    post("/v1/attend", body, len, (long)strlen(head64), &r64);
    ck_assert_int_eq(r64.status, 200);
    free(body);
    const char *names[] = {"output", "weights"};
    size_t want[] = {(size_t)ROWS * HIDDEN, (size_t)4 * ROWS * ROWS};
    for (int i = 0; i < 2; i++) {
        size_t nb, n64;
        float *b = raw_tensor(&rb, names[i], &nb);
        float *c = json_tensor(&r64, names[i], &n64);
        ck_assert_uint_eq(nb, want[i]);
        ck_assert_uint_eq(n64, want[i]);
        ck_assert_msg(memcmp(b, c, nb * 4) == 0, "%s: raw and base64 differ", names[i]);
        free(b);
        free(c);
    }
    http_client_response_release(&rb);
    http_client_response_release(&r64);
    free(x);
}
END_TEST

START_TEST(test_framing_sdpa_matches_json) {
    /* q (2, 3, 8), k and v (1, 4, 8): three raw parts in field order */
    float *q = http_client_random_rows(41, 2 * 3, 8), *k = http_client_random_rows(42, 4, 8),
          *v = http_client_random_rows(43, 4, 8);
    const char *head = "{\"q\":{\"shape\":[2,3,8],\"binary_data_size\":192},"
                       "\"k\":{\"shape\":[1,4,8],\"binary_data_size\":128},"
                       "\"v\":{\"shape\":[1,4,8],\"binary_data_size\":128},\"causal\":true,"
                       "\"return_weights\":true,\"binary_output\":true}";
    const float *parts[] = {q, k, v};
    size_t nf[] = {48, 32, 32}, len;
    char *body = framed(head, parts, nf, 3, &len);
    struct http_client_response rb, rj;
    post("/v1/sdpa", body, len, (long)strlen(head), &rb);
    ck_assert_msg(rb.status == 200, "%ld %s", rb.status, rb.body);
    free(body);
    char *qj = http_client_matrix_json(q, 3, 8), *kj = http_client_matrix_json(k, 4, 8),
         *vj = http_client_matrix_json(v, 4, 8);
    /* the JSON request nests the same values by hand: q's two heads of 3 rows */
    char *qj2 = http_client_matrix_json(q + 24, 3, 8);
    size_t jl = strlen(qj) + strlen(qj2) + strlen(kj) + strlen(vj) + 100;
    char *json = malloc(jl);
    snprintf(json, jl,
             "{\"q\":[%s,%s],\"k\":[%s],\"v\":[%s],\"causal\":true,\"return_weights\":true}", qj,
             qj2, kj, vj);
    post("/v1/sdpa", json, strlen(json), -1, &rj);
    ck_assert_msg(rj.status == 200, "%ld %s", rj.status, rj.body);
    size_t nb, nj;
    float *a = raw_tensor(&rb, "output", &nb), *b = json_tensor(&rj, "output", &nj);
    ck_assert_uint_eq(nb, 2 * 3 * 8);
    ck_assert_uint_eq(nb, nj);
    ck_assert(memcmp(a, b, nb * 4) == 0);
    free(a);
    free(b);
    /* the weights too: (2, 3, 4), sent from the job's buffers after the output */
    a = raw_tensor(&rb, "weights", &nb), b = json_tensor(&rj, "weights", &nj);
    ck_assert_uint_eq(nb, 2 * 3 * 4);
    ck_assert_uint_eq(nb, nj);
    ck_assert(memcmp(a, b, nb * 4) == 0);
    free(a);
    free(b);
    free(json);
    free(qj);
    free(qj2);
    free(kj);
    free(vj);
    free(q);
    free(k);
    free(v);
    http_client_response_release(&rb);
    http_client_response_release(&rj);
}
END_TEST

/* Two JSON answers carry the same output of n floats, bit for bit; releases both. */
static void expect_same_output(struct http_client_response *a, struct http_client_response *b,
                               size_t n) {
    size_t na, nb;
    float *x = json_tensor(a, "output", &na), *y = json_tensor(b, "output", &nb);
    ck_assert_uint_eq(na, n);
    ck_assert_uint_eq(nb, n);
    ck_assert(memcmp(x, y, n * 4) == 0);
    free(x);
    free(y);
    http_client_response_release(a);
    http_client_response_release(b);
}

/* Masks sent as raw parts (attend's key_mask, SDPA's mask) are read where they lie like any
 * tensor, then made bytes: the values read in place must not be freed as if copied (found by
 * an outside audit: a binary SDPA mask crashed the daemon, free() of a pointer into the body;
 * attend's key_mask alike). Each answers what the same request in JSON answers. */
START_TEST(test_framing_masks_read_in_place) {
    float *x = http_client_random_rows(61, 1, HIDDEN);
    const float one[] = {1.0f};
    const float *ap[] = {x, one};
    size_t an[] = {HIDDEN, 1}, len;
    const char *ah = "{\"x\":{\"shape\":[1,64],\"binary_data_size\":256},"
                     "\"key_mask\":{\"shape\":[1],\"binary_data_size\":4}}";
    char *body = framed(ah, ap, an, 2, &len);
    struct http_client_response rb, rj;
    post("/v1/attend", body, len, (long)strlen(ah), &rb);
    ck_assert_msg(rb.status == 200, "%ld %s", rb.status, rb.body);
    free(body);
    char *xj = http_client_matrix_json(x, 1, HIDDEN);
    char json[4096];
    snprintf(json, sizeof json, "{\"x\":%s,\"key_mask\":[1]}", xj);
    post("/v1/attend", json, strlen(json), -1, &rj);
    ck_assert_msg(rj.status == 200, "%ld %s", rj.status, rj.body);
    expect_same_output(&rb, &rj, HIDDEN);
    /* SDPA: q (1, 2, 8), k and v (1, 3, 8), then a (2, 3) mask, causal by hand */
    float *q = http_client_random_rows(62, 2, 8), *k = http_client_random_rows(63, 3, 8),
          *v = http_client_random_rows(64, 3, 8);
    const float mask[] = {1, 0, 0, 1, 1, 0};
    const float *sp[] = {q, k, v, mask};
    size_t sn[] = {16, 24, 24, 6};
    const char *sh = "{\"q\":{\"shape\":[1,2,8],\"binary_data_size\":64},"
                     "\"k\":{\"shape\":[1,3,8],\"binary_data_size\":96},"
                     "\"v\":{\"shape\":[1,3,8],\"binary_data_size\":96},"
                     "\"mask\":{\"shape\":[2,3],\"binary_data_size\":24}}";
    body = framed(sh, sp, sn, 4, &len);
    post("/v1/sdpa", body, len, (long)strlen(sh), &rb);
    ck_assert_msg(rb.status == 200, "%ld %s", rb.status, rb.body);
    free(body);
    char *qj = http_client_matrix_json(q, 2, 8), *kj = http_client_matrix_json(k, 3, 8),
         *vj = http_client_matrix_json(v, 3, 8);
    snprintf(json, sizeof json, "{\"q\":[%s],\"k\":[%s],\"v\":[%s],\"mask\":[[1,0,0],[1,1,0]]}", qj,
             kj, vj);
    post("/v1/sdpa", json, strlen(json), -1, &rj);
    ck_assert_msg(rj.status == 200, "%ld %s", rj.status, rj.body);
    expect_same_output(&rb, &rj, 16);
    free(qj);
    free(kj);
    free(vj);
    free(q);
    free(k);
    free(v);
    free(xj);
    free(x);
}
END_TEST

START_TEST(test_framing_mistakes_are_400) {
    float *x = http_client_random_rows(51, 2, HIDDEN);
    const float *parts[] = {x};
    size_t n2[] = {2 * HIDDEN}, n1[] = {HIDDEN}, len;
    const char *head = "{\"x\":{\"shape\":[2,64],\"binary_data_size\":512}}";
    struct http_client_response r;
    /* bytes left over, bytes missing, a size that is not the shape's */
    char *body = framed(head, parts, n2, 1, &len);
    post("/v1/attend", body, len - 4, (long)strlen(head), &r);
    expect_error(&r, "x", "runs past");
    http_client_response_release(&r);
    free(body);
    body = framed(head, parts, n2, 1, &len);
    char *more = malloc(len + 4);
    memcpy(more, body, len);
    memset(more + len, 0, 4);
    post("/v1/attend", more, len + 4, (long)strlen(head), &r);
    expect_error(&r, "Inference-Header-Content-Length", "516 bytes");
    http_client_response_release(&r);
    free(more);
    free(body);
    const char *wrong = "{\"x\":{\"shape\":[2,64],\"binary_data_size\":256}}";
    body = framed(wrong, parts, n1, 1, &len);
    post("/v1/attend", body, len, (long)strlen(wrong), &r);
    expect_error(&r, "x", "4 * prod(shape) = 512");
    http_client_response_release(&r);
    free(body);
    /* no header, a header past the body, a header that is not a length */
    post("/v1/attend", head, strlen(head), -1, &r);
    expect_error(&r, "x", "Inference-Header-Content-Length");
    http_client_response_release(&r);
    body = framed(head, parts, n2, 1, &len);
    post("/v1/attend", body, len, (long)len + 1, &r);
    expect_error(&r, "Inference-Header-Content-Length", "to the body's");
    http_client_response_release(&r);
    /* 0 leaves no JSON part: the header is named, not the JSON ("body is empty") */
    post("/v1/attend", body, len, 0, &r);
    expect_error(&r, "Inference-Header-Content-Length", "from 1");
    http_client_response_release(&r);
    char u[200];
    snprintf(u, sizeof u, "%s/v1/attend", daemon_.base);
    /* a sign is no length, nor is a plus (strtoull would take both) */
    const char *bad[] = {"Inference-Header-Content-Length: -3", NULL};
    http_client_request("POST", u, body, len, bad, &r);
    expect_error(&r, "Inference-Header-Content-Length", "length");
    http_client_response_release(&r);
    char plus[96];
    snprintf(plus, sizeof plus, "Inference-Header-Content-Length: +%zu", strlen(head));
    const char *bad_plus[] = {plus, NULL};
    http_client_request("POST", u, body, len, bad_plus, &r);
    expect_error(&r, "Inference-Header-Content-Length", "length");
    http_client_response_release(&r);
    /* two lengths, even one of them right: which splits the body depends on who reads it */
    char right[96];
    snprintf(right, sizeof right, "Inference-Header-Content-Length: %zu", strlen(head));
    const char *two[] = {right, "Inference-Header-Content-Length: 5", NULL};
    http_client_request("POST", u, body, len, two, &r);
    expect_error(&r, "Inference-Header-Content-Length", "more than one");
    http_client_response_release(&r);
    free(body);
    /* a datatype other than FP32, b64 and binary_data_size together, binary_output with stream
     * or with encoding_format */
    const char *fp16 = "{\"x\":{\"shape\":[2,64],\"datatype\":\"FP16\",\"binary_data_size\":512}}";
    body = framed(fp16, parts, n2, 1, &len);
    post("/v1/attend", body, len, (long)strlen(fp16), &r);
    expect_error(&r, "x", "FP32");
    http_client_response_release(&r);
    free(body);
    const char *both = "{\"x\":{\"shape\":[2,64],\"b64\":\"\",\"binary_data_size\":512}}";
    body = framed(both, parts, n2, 1, &len);
    post("/v1/attend", body, len, (long)strlen(both), &r);
    expect_error(&r, "x", "binary_data_size");
    http_client_response_release(&r);
    free(body);
    const char *stream = "{\"session_id\":\"s\",\"x\":{\"shape\":[2,64],\"binary_data_size\":512},"
                         "\"stream\":true,\"binary_output\":true}";
    body = framed(stream, parts, n2, 1, &len);
    post("/v1/attend", body, len, (long)strlen(stream), &r);
    expect_error(&r, "binary_output", "stream");
    http_client_response_release(&r);
    free(body);
    const char *enc = "{\"x\":{\"shape\":[2,64],\"binary_data_size\":512},"
                      "\"encoding_format\":\"float\",\"binary_output\":true}";
    body = framed(enc, parts, n2, 1, &len);
    post("/v1/attend", body, len, (long)strlen(enc), &r);
    expect_error(&r, "encoding_format", "binary_output");
    http_client_response_release(&r);
    free(body);
    /* a NaN in the raw part is refused like one in JSON */
    float nan_rows[2 * HIDDEN];
    memcpy(nan_rows, x, sizeof nan_rows);
    nan_rows[70] = 0.0f / 0.0f;
    const float *np[] = {nan_rows};
    body = framed(head, np, n2, 1, &len);
    post("/v1/attend", body, len, (long)strlen(head), &r);
    expect_error(&r, "x", "value 70");
    http_client_response_release(&r);
    free(body);
    /* nothing ran: session s does not exist */
    snprintf(u, sizeof u, "%s/v1/sessions/s", daemon_.base);
    http_client_request("GET", u, NULL, 0, NULL, &r);
    ck_assert_int_eq(r.status, 404);
    http_client_response_release(&r);
    free(x);
}
END_TEST

extern Suite *framing_suite(void);

Suite *framing_suite(void) {
    Suite *s = suite_create("framing");
    TCase *tc = tcase_create("binary");
    tcase_set_tags(tc, "server");
    tcase_set_timeout(tc, 60);
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_add_test(tc, test_framing_attend_matches_json);
    tcase_add_test(tc, test_framing_answer_past_a_mebibyte_matches_base64);
    tcase_add_test(tc, test_framing_sdpa_matches_json);
    tcase_add_test(tc, test_framing_masks_read_in_place);
    tcase_add_test(tc, test_framing_mistakes_are_400);
    suite_add_tcase(s, tc);
    return s;
}
