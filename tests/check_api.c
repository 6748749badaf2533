/* tests/check_api.c: server/api.c and api_encode.c, string in and string out, with the request
 * and response files of proto/examples as inputs and expectations; plus server/b64.c and the
 * error table against proto/errors.json and proto/openapi.yaml. */
#include <check.h>
#include <float.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "../engine/attn.h"
#include "../server/api.h"
#include "../server/b64.h"
#include "../server/strbuf.h"
#include "../server/utf8.h"
#include "../server/error.h"
#include "http_client.h"

#define EX "proto/examples/"

/* The tiny preset the examples were made for (engine/attn.h: hidden 64, 4 heads, 2 layers,
 * 2 KV heads of 16). */
static const struct api_limits tiny = {64, 4, 0, 2, 1024, 2, 16};

static void expect_close(const float *got, const float *want, size_t n, double tol,
                         const char *what) {
    for (size_t i = 0; i < n; i++) {
        ck_assert_msg(fabs((double)got[i] - (double)want[i]) <= tol * (1 + fabs(want[i])),
                      "%s[%zu]: %.9g vs %.9g", what, i, (double)got[i], (double)want[i]);
    }
}

/* ---- the error table ------------------------------------------------------------------------ */

START_TEST(test_api_error_table_matches_proto) {
    char *text = http_client_read_file("proto/errors.json", NULL);
    cJSON *root = cJSON_Parse(text);
    ck_assert_ptr_nonnull(root);
    const cJSON *list = cJSON_GetObjectItemCaseSensitive(root, "errors");
    int n_c;
    const struct error_info *table = error_table(&n_c);
    ck_assert_int_eq(cJSON_GetArraySize(list), n_c);
    char *yaml = http_client_read_file("proto/openapi.yaml", NULL);
    for (const cJSON *e = list->child; e != NULL; e = e->next) {
        const char *code = cJSON_GetObjectItemCaseSensitive(e, "code")->valuestring;
        const struct error_info *row = NULL;
        for (int i = 0; i < n_c; i++) {
            if (strcmp(table[i].name, code) == 0) {
                row = &table[i];
            }
        }
        ck_assert_msg(row != NULL, "%s is in proto/errors.json but not in server/error.c", code);
        ck_assert_int_eq(row->http_status, cJSON_GetObjectItemCaseSensitive(e, "status")->valueint);
        ck_assert_str_eq(row->type, cJSON_GetObjectItemCaseSensitive(e, "type")->valuestring);
        ck_assert_str_eq(row->message, cJSON_GetObjectItemCaseSensitive(e, "message")->valuestring);
        /* ... and the human-readable table in openapi.yaml says the same. */
        char line[256];
        snprintf(line, sizeof line, "    %s: [%d, %s, ", code, row->http_status, row->type);
        ck_assert_msg(strstr(yaml, line) != NULL, "openapi.yaml lacks '%s'", line);
        ck_assert_ptr_eq(error_info_get(row->code), row);
    }
    /* Engine codes map onto rows of the table. */
    ck_assert_str_eq(error_info_get(ATTN_ENOSPC)->name, "kv_budget_exhausted");
    ck_assert_str_eq(error_info_get(ATTN_ERANGE)->name, "context_length_exceeded");
    ck_assert_str_eq(error_info_get(ATTN_ENOMEM)->name, "internal_error");
    ck_assert_int_eq(error_info_get(12345)->http_status, 500);
    free(yaml);
    cJSON_Delete(root);
    free(text);
}
END_TEST

/* error.request.json in, error.response.json out, byte for byte. */
START_TEST(test_api_error_example_exact) {
    size_t len;
    char *req = http_client_read_file(EX "error.request.json", &len);
    char *want = http_client_read_file(EX "error.response.json", NULL);
    struct api_attend_request r;
    struct api_error err;
    int rc = api_attend_request_parse(req, len, &tiny, &r, &err);
    ck_assert_int_eq(rc, ERROR_INVALID_REQUEST);
    char *got = api_error_encode(err.code, err.message, err.param, NULL);
    ck_assert_str_eq(got, want);
    free(got);
    free(want);
    free(req);
}
END_TEST

/* ---- requests from proto/examples ----------------------------------------------------------- */

static struct api_attend_request parse_attend_file(const char *name) {
    size_t len;
    char *body = http_client_read_file(name, &len);
    struct api_attend_request r;
    struct api_error err;
    int rc = api_attend_request_parse(body, len, &tiny, &r, &err);
    ck_assert_msg(rc == 0, "%s: %s (%s)", name, err.message, err.param);
    free(body);
    return r;
}

START_TEST(test_api_attend_examples_parse) {
    struct api_attend_request st = parse_attend_file(EX "attend_stateless.request.json");
    ck_assert_int_eq(st.n_tokens, 2);
    ck_assert_str_eq(st.session_id, "");
    ck_assert_int_eq(st.layer, 0);
    ck_assert(!st.return_weights && !st.stream && !st.has_expect_n_past);
    ck_assert_ptr_null(st.positions);
    ck_assert_int_eq(st.encoding, API_ENCODING_FLOAT);

    struct api_attend_request pre = parse_attend_file(EX "attend_prefill.request.json");
    ck_assert_int_eq(pre.n_tokens, 3);
    ck_assert_str_eq(pre.session_id, "chat-42");
    ck_assert(pre.return_weights);
    /* The prefill's first two rows are the stateless call's x. */
    ck_assert_mem_eq(pre.x, st.x, 2 * 64 * sizeof(float));

    struct api_attend_request dec = parse_attend_file(EX "attend_decode.request.json");
    ck_assert_int_eq(dec.n_tokens, 1);
    ck_assert(dec.has_expect_n_past);
    ck_assert_int_eq(dec.expect_n_past, 3);

    /* The same rows sent as base64 decode to the same floats. */
    struct api_attend_request b = parse_attend_file(EX "attend_base64.request.json");
    ck_assert_int_eq(b.n_tokens, 2);
    ck_assert_int_eq(b.encoding, API_ENCODING_BASE64);
    ck_assert_mem_eq(b.x, st.x, 2 * 64 * sizeof(float));

    struct api_attend_request sm = parse_attend_file(EX "attend_stream.request.json");
    ck_assert(sm.stream);
    api_attend_request_release(&st);
    api_attend_request_release(&pre);
    api_attend_request_release(&dec);
    api_attend_request_release(&b);
    api_attend_request_release(&sm);
}
END_TEST

START_TEST(test_api_session_requests_parse) {
    size_t len;
    char *body = http_client_read_file(EX "truncate.request.json", &len);
    struct api_truncate_request t;
    struct api_error err;
    ck_assert_int_eq(api_truncate_request_parse(body, len, &tiny, &t, &err), 0);
    ck_assert_int_eq(t.n_tokens, 2);
    ck_assert(!t.has_layer);
    free(body);
    /* "layer": null is leaving it out, first or last (once returned a stray 1: a 500). */
    const char *nulls[] = {"{\"layer\":null,\"n_tokens\":3}", "{\"n_tokens\":3,\"layer\":null}"};
    for (size_t i = 0; i < 2; i++) {
        ck_assert_int_eq(api_truncate_request_parse(nulls[i], strlen(nulls[i]), &tiny, &t, &err),
                         0);
        ck_assert_int_eq(t.n_tokens, 3);
        ck_assert(!t.has_layer);
    }
    const char *cut = "   {\"layer\": null  [";
    ck_assert_int_eq(api_truncate_request_parse(cut, strlen(cut), &tiny, &t, &err),
                     ERROR_INVALID_JSON);
    body = http_client_read_file(EX "fork.request.json", &len);
    struct api_fork_request f;
    ck_assert_int_eq(api_fork_request_parse(body, len, &f, &err), 0);
    ck_assert_str_eq(f.new_id, "chat-42.branch");
    free(body);
    const char *bad = "{\"n_tokens\":-1}";
    ck_assert_int_eq(api_truncate_request_parse(bad, strlen(bad), &tiny, &t, &err),
                     ERROR_INVALID_REQUEST);
    ck_assert_str_eq(err.param, "n_tokens");
    bad = "{\"n_tokens\":1,\"layer\":7}";
    ck_assert_int_eq(api_truncate_request_parse(bad, strlen(bad), &tiny, &t, &err),
                     ERROR_INVALID_REQUEST);
    ck_assert_str_eq(err.param, "layer");
    bad = "{\"new_id\":\"has space\"}";
    ck_assert_int_eq(api_fork_request_parse(bad, strlen(bad), &f, &err), ERROR_INVALID_REQUEST);
    ck_assert_str_eq(err.param, "new_id");
    bad = "{}";
    ck_assert_int_eq(api_fork_request_parse(bad, strlen(bad), &f, &err), ERROR_INVALID_REQUEST);
    ck_assert_str_eq(err.param, "new_id");
}
END_TEST

/* sdpa.request.json in -> the engine -> our encoder out, against numpy's sdpa.response.json. */
static void sdpa_golden(const char *req_name, const char *resp_name) {
    size_t len;
    char *body = http_client_read_file(req_name, &len);
    struct api_sdpa_request r;
    struct api_error err;
    ck_assert_msg(api_sdpa_request_parse(body, len, &r, &err) == 0, "%s", err.message);
    attn_sdpa_params p = {
        .n_heads = r.n_heads,
        .n_kv_heads = r.n_kv_heads,
        .n_q = r.n_q,
        .n_k = r.n_k,
        .d_k = r.d_k,
        .d_v = r.d_v,
        .q = r.q,
        .k = r.k,
        .v = r.v,
        .is_causal = r.causal,
        .window = r.window,
        .scale = r.scale,
    };
    size_t n_out = (size_t)r.n_heads * r.n_q * r.d_v, n_w = (size_t)r.n_heads * r.n_q * r.n_k;
    float *out = calloc(n_out, sizeof(float));
    float *w = r.return_weights ? calloc(n_w, sizeof(float)) : NULL;
    p.out = out;
    p.weights = w;
    void *scratch = malloc(attn_sdpa_scratch_bytes(&p) + 64);
    ck_assert_int_eq(attn_sdpa(&p, scratch), ATTN_OK);
    struct api_sdpa_response resp = {.n_batch = 1,
                                     .n_heads = r.n_heads,
                                     .n_q = r.n_q,
                                     .n_k = r.n_k,
                                     .d_v = r.d_v,
                                     .output = out,
                                     .weights = w,
                                     .timing = {0.5, 0.25},
                                     .encoding = r.encoding};
    char *got_text = api_sdpa_response_encode(&resp, NULL, NULL, NULL);
    cJSON *got = cJSON_Parse(got_text);
    char *want_text = http_client_read_file(resp_name, NULL);
    cJSON *want = cJSON_Parse(want_text);
    ck_assert_ptr_nonnull(got);
    ck_assert_ptr_nonnull(want);
    char why[256];
    ck_assert_msg(http_client_json_same_shape(got, want, why, sizeof why), "%s", why);
    const char *fields[] = {"output", "weights"};
    for (int f = 0; f < 2; f++) {
        const cJSON *g = cJSON_GetObjectItemCaseSensitive(got, fields[f]);
        const cJSON *e = cJSON_GetObjectItemCaseSensitive(want, fields[f]);
        if (e == NULL) {
            continue;
        }
        size_t ng, ne;
        float *gv = http_client_json_floats(g, &ng);
        float *ev = http_client_json_floats(e, &ne);
        ck_assert_uint_eq(ng, ne);
        expect_close(gv, ev, ng, 1e-5, fields[f]);
        free(gv);
        free(ev);
    }
    cJSON_Delete(got);
    cJSON_Delete(want);
    free(got_text);
    free(want_text);
    free(scratch);
    free(w);
    free(out);
    api_sdpa_request_release(&r);
    free(body);
}

START_TEST(test_api_sdpa_golden_float) {
    sdpa_golden(EX "sdpa.request.json", EX "sdpa.response.json");
}
END_TEST

START_TEST(test_api_sdpa_golden_base64) {
    sdpa_golden(EX "sdpa_base64.request.json", EX "sdpa_base64.response.json");
}
END_TEST

/* ---- every kind of bad request -------------------------------------------------------------- */

/* A non-finite float32 in a base64 or binary tensor is refused naming its (row-major) index, and
 * every finite one, subnormals and the largest included, comes through bit for bit. */
START_TEST(test_api_raw_tensors_refuse_non_finite_values) {
    const uint32_t bad[] = {0x7f800000u, 0xff800000u, 0x7fc00000u, 0xffffffffu, 0x7f800001u};
    const uint32_t good[] = {0x7f7fffffu, 0xff7fffffu, 0x00000001u, 0x80000000u, 0x3f800000u};
    for (int flavour = 0; flavour < 2; flavour++) {
        for (size_t k = 0; k < 2 * sizeof bad / sizeof bad[0]; k++) {
            bool is_bad = k % 2 == 0;
            int at = (int)(k * 13 % 64);
            uint8_t raw[64 * 4];
            for (int i = 0; i < 64; i++) {
                uint32_t u = i == at ? (is_bad ? bad[k / 2] : good[k / 2]) : 0x3f000000u + i;
                for (int b = 0; b < 4; b++) {
                    raw[i * 4 + b] = (uint8_t)(u >> (8 * b)); /* little-endian on the wire */
                }
            }
            char json[1024];
            struct api_body body = {json, 0, NULL, 0, false};
            if (flavour == 0) {
                char b64[400];
                b64_encode(raw, sizeof raw, b64);
                body.json_len = (size_t)snprintf(json, sizeof json,
                                                 "{\"x\":{\"shape\":[1,64],\"b64\":\"%s\"}}", b64);
            } else {
                body.json_len = (size_t)snprintf(
                    json, sizeof json, "{\"x\":{\"shape\":[1,64],\"binary_data_size\":256}}");
                body.binary = raw;
                body.binary_len = sizeof raw;
            }
            struct api_attend_request r;
            struct api_error err;
            int rc = api_attend_request_parse_body(&body, &tiny, &r, &err);
            if (is_bad) {
                char want[32];
                snprintf(want, sizeof want, "value %d ", at);
                ck_assert_msg(rc == ERROR_INVALID_REQUEST && strcmp(err.param, "x") == 0 &&
                                  strstr(err.message, want) != NULL,
                              "flavour %d, %08x at %d: rc %d, %s", flavour, bad[k / 2], at, rc,
                              err.message);
                ck_assert_ptr_null(r.x);
                continue;
            }
            ck_assert_msg(rc == 0, "flavour %d: %s", flavour, err.message);
            ck_assert_mem_eq(r.x, raw, sizeof raw); /* this host is little-endian */
            api_attend_request_release(&r);
        }
    }
    /* an infinity at every index of 67 binary values (a hidden size of 67: only the values'
     * count matters here): each of the check's eight lanes, and the three after its last whole
     * eight */
    const struct api_limits tiny67 = {67, 1, 0, 2, 1024, 1, 67};
    for (int at = 0; at < 67; at++) {
        uint8_t raw[67 * 4];
        for (int i = 0; i < 67; i++) {
            uint32_t u = i == at ? 0xff800000u : 0x3f000000u + (uint32_t)i;
            for (int b = 0; b < 4; b++) {
                raw[i * 4 + b] = (uint8_t)(u >> (8 * b));
            }
        }
        char json[128];
        struct api_body body = {json, 0, raw, sizeof raw, false};
        body.json_len = (size_t)snprintf(json, sizeof json,
                                         "{\"x\":{\"shape\":[1,67],\"binary_data_size\":268}}");
        struct api_attend_request r;
        struct api_error err;
        int rc = api_attend_request_parse_body(&body, &tiny67, &r, &err);
        char want[32];
        snprintf(want, sizeof want, "value %d ", at);
        ck_assert_msg(rc == ERROR_INVALID_REQUEST && strstr(err.message, want) != NULL,
                      "-inf at %d: rc %d, %s", at, rc, err.message);
        ck_assert_ptr_null(r.x);
    }
}
END_TEST

/* A JSON number is the float32 it rounds to: FLT_MAX as the server prints it (3.40282347e+38,
 * above FLT_MAX by less than half an ulp) and as numpy does (3.4028235e+38) read back as FLT_MAX;
 * from FLT_MAX + 2^103 on, which rounds to infinity, a value is refused. */
START_TEST(test_api_float32_range_edges) {
    static const struct {
        const char *text;
        float want; /* 0: refused */
    } cases[] = {
        {"3.40282347e+38", FLT_MAX},
        {"-3.40282347e+38", -FLT_MAX},
        {"3.4028235e+38", FLT_MAX},
        {"3.4028235677973362e+38", FLT_MAX}, /* just below FLT_MAX + 2^103 */
        {"3.4028235677973366e+38", 0},       /* FLT_MAX + 2^103: a tie, to infinity */
        {"-3.5e38", 0},
        {"1e39", 0},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char body[2048] = "{\"x\":[[";
        strcat(body, cases[i].text);
        for (int e = 1; e < 64; e++) {
            strcat(body, ",0.5");
        }
        strcat(body, "]]}");
        struct api_attend_request r;
        struct api_error err;
        int rc = api_attend_request_parse(body, strlen(body), &tiny, &r, &err);
        if (cases[i].want == 0) {
            ck_assert_msg(rc == ERROR_INVALID_REQUEST && strcmp(err.param, "x") == 0,
                          "%s: rc %d (%s)", cases[i].text, rc, err.message);
            ck_assert_ptr_null(r.x);
            continue;
        }
        ck_assert_msg(rc == 0, "%s: %s", cases[i].text, err.message);
        ck_assert_msg(r.x[0] == cases[i].want, "%s: read as %.9g", cases[i].text, (double)r.x[0]);
        api_attend_request_release(&r);
    }
}
END_TEST

/* GET .../attention's heads= and rows= lists: the indices named, sorted, each once, however
 * often and in whatever order they are named (a list of more items than indices once lost the
 * items past that count); an empty item is refused, not read as index 0. */
START_TEST(test_api_attention_lists) {
    static const struct {
        const char *heads, *rows;
        int32_t want_heads[8], n_heads, want_rows[10], n_rows; /* n_heads < 0: refused */
    } cases[] = {
        {"0:4,0:4,7", "", {0, 1, 2, 3, 7}, 5, {0}, 10},
        {"0,0,0,0,0,0,0,0,5", "0,0,0,0,3", {0, 5}, 2, {0, 3}, 2},
        {"-1,6,-2:", "9:,-1,2:4", {6, 7}, 2, {2, 3, 9}, 3},
        {"all", "all", {0}, 8, {0}, 10},
        {",5", "", {0}, -1, {0}, 0},
        {"5,,6", "", {0}, -1, {0}, 0},
        {"5,", "", {0}, -1, {0}, 0},
        {"1", ",", {0}, -1, {0}, 0},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        struct api_attention_request r;
        memset(&r, 0, sizeof r);
        struct api_error err;
        ck_assert_int_eq(api_attention_query(&r, "heads", cases[i].heads, &tiny, &err), 0);
        if (cases[i].rows[0] != '\0') {
            ck_assert_int_eq(api_attention_query(&r, "rows", cases[i].rows, &tiny, &err), 0);
        }
        struct api_selection sel;
        int rc = api_attention_select(&r, 8, 10, 0, &sel, &err);
        if (cases[i].n_heads < 0) {
            ck_assert_msg(rc == ERROR_INVALID_REQUEST, "heads '%s' rows '%s': accepted",
                          cases[i].heads, cases[i].rows);
            ck_assert_str_eq(err.param, cases[i].rows[0] == ',' ? "rows" : "heads");
            continue;
        }
        ck_assert_msg(rc == 0, "case %zu: %s", i, err.message);
        ck_assert_int_eq(sel.n_heads, cases[i].n_heads);
        ck_assert_int_eq(sel.n_rows, cases[i].n_rows);
        for (int32_t h = 0; h < sel.n_heads && cases[i].n_heads < 8; h++) {
            ck_assert_int_eq(sel.heads[h], cases[i].want_heads[h]);
        }
        for (int32_t w = 0; w < sel.n_rows && cases[i].n_rows < 10; w++) {
            ck_assert_int_eq(sel.rows[w], cases[i].want_rows[w]);
        }
        api_selection_release(&sel);
    }
}
END_TEST

/* A batch of many steps: each parsed in order with its own session and row (the steps' array
 * grows as they come), and one past API_MAX_STEPS refused, naming steps. */
START_TEST(test_api_attend_many_steps) {
    static const int counts[] = {1, 8, 9, 40, API_MAX_STEPS, API_MAX_STEPS + 1};
    for (size_t k = 0; k < sizeof counts / sizeof counts[0]; k++) {
        int n = counts[k];
        struct strbuf b;
        strbuf_init(&b);
        strbuf_puts(&b, "{\"steps\":[");
        for (int i = 0; i < n; i++) {
            strbuf_printf(&b, "%s{\"session_id\":\"s%d\",\"x\":[[", i ? "," : "", i);
            for (int c = 0; c < 64; c++) {
                strbuf_printf(&b, "%s%d", c ? "," : "", i * 64 + c);
            }
            strbuf_puts(&b, "]]}");
        }
        strbuf_puts(&b, "]}");
        ck_assert(!b.has_failed);
        struct api_attend_request r;
        struct api_error err;
        int rc = api_attend_request_parse(b.data, b.len, &tiny, &r, &err);
        if (n > API_MAX_STEPS) {
            ck_assert_int_eq(rc, ERROR_INVALID_REQUEST);
            ck_assert_str_eq(err.param, "steps");
            strbuf_release(&b);
            continue;
        }
        ck_assert_msg(rc == 0, "%d steps: %s", n, err.message);
        ck_assert_int_eq(r.n_steps, n);
        for (int i = 0; i < n; i++) {
            char id[16];
            snprintf(id, sizeof id, "s%d", i);
            ck_assert_str_eq(r.steps[i].session_id, id);
            ck_assert_int_eq(r.steps[i].n_tokens, 1);
            ck_assert_float_eq(r.steps[i].x[0], (float)(i * 64));
            ck_assert_float_eq(r.steps[i].x[63], (float)(i * 64 + 63));
        }
        api_attend_request_release(&r);
        strbuf_release(&b);
    }
}
END_TEST

START_TEST(test_api_attend_rejects_bad_requests) {
    /* A valid 1 x 64 row to build requests around. */
    char row[1024] = "[[";
    for (int i = 0; i < 64; i++) {
        strcat(row, i ? ",0.5" : "0.5");
    }
    strcat(row, "]]");
    char short_row[] = "[[1,2,3]]";
    char b64_bad[] = "{\"shape\":[1,64],\"b64\":\"AAAA\"}";
    static char buf[40][4096];
    struct {
        const char *body;
        int code;
        const char *param;
    } cases[] = {
        {"", ERROR_INVALID_JSON, ""},
        {"{\"x\":", ERROR_INVALID_JSON, ""},
        {"[1,2]", ERROR_INVALID_REQUEST, ""},
        {"{}", ERROR_INVALID_REQUEST, "x"},
        {buf[0], ERROR_INVALID_REQUEST, "x"}, /* short row */
        {buf[1], ERROR_INVALID_REQUEST, "bogus"},
        {buf[2], ERROR_INVALID_REQUEST, "layer"}, /* not loaded */
        {buf[3], ERROR_INVALID_REQUEST, "layer"}, /* wrong type */
        {buf[4], ERROR_INVALID_REQUEST, "session_id"},
        {buf[5], ERROR_INVALID_REQUEST, "positions"}, /* wrong length */
        {buf[6], ERROR_CONTEXT_LENGTH_EXCEEDED, "positions"},
        {buf[7], ERROR_INVALID_REQUEST, "x"}, /* not finite in float32 */
        {buf[8], ERROR_INVALID_REQUEST, "encoding_format"},
        {buf[9], ERROR_INVALID_REQUEST, "x"}, /* base64 of the wrong size */
        {buf[10], ERROR_INVALID_REQUEST, "stream"},
        {buf[11], ERROR_INVALID_REQUEST, "x"}, /* duplicate field */
        {buf[12], ERROR_INVALID_JSON, ""},     /* trailing garbage */
        {buf[13], ERROR_INVALID_REQUEST, "expect_n_past"},
        {buf[14], ERROR_INVALID_REQUEST, "x"},         /* rank 1 */
        {buf[15], ERROR_INVALID_REQUEST, "x"},         /* a string inside */
        {buf[16], ERROR_INVALID_REQUEST, "positions"}, /* empty: was taken as none */
        {buf[17], ERROR_INVALID_REQUEST, "steps[0].positions"},
    };
    snprintf(buf[0], sizeof buf[0], "{\"x\":%s}", short_row);
    snprintf(buf[1], sizeof buf[1], "{\"x\":%s,\"bogus\":1}", row);
    snprintf(buf[2], sizeof buf[2], "{\"x\":%s,\"layer\":2}", row);
    snprintf(buf[3], sizeof buf[3], "{\"x\":%s,\"layer\":\"0\"}", row);
    snprintf(buf[4], sizeof buf[4], "{\"x\":%s,\"session_id\":\"a/b\"}", row);
    snprintf(buf[5], sizeof buf[5], "{\"x\":%s,\"positions\":[1,2]}", row);
    snprintf(buf[6], sizeof buf[6], "{\"x\":%s,\"positions\":[1024]}", row);
    snprintf(buf[7], sizeof buf[7], "{\"x\":[[1e39%s}", row + 5);
    snprintf(buf[8], sizeof buf[8], "{\"x\":%s,\"encoding_format\":\"hex\"}", row);
    snprintf(buf[9], sizeof buf[9], "{\"x\":%s}", b64_bad);
    snprintf(buf[10], sizeof buf[10], "{\"x\":%s,\"stream\":1}", row);
    snprintf(buf[11], sizeof buf[11], "{\"x\":%s,\"x\":%s}", row, row);
    snprintf(buf[12], sizeof buf[12], "{\"x\":%s} {", row);
    snprintf(buf[13], sizeof buf[13], "{\"x\":%s,\"expect_n_past\":-2}", row);
    snprintf(buf[14], sizeof buf[14], "{\"x\":[0.5,0.5]}");
    snprintf(buf[15], sizeof buf[15], "{\"x\":[[\"0.5\"%s}", row + 5);
    snprintf(buf[16], sizeof buf[16], "{\"x\":%s,\"positions\":[]}", row);
    snprintf(buf[17], sizeof buf[17], "{\"steps\":[{\"x\":%s,\"positions\":[]}]}", row);
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        struct api_attend_request r;
        struct api_error err;
        int rc = api_attend_request_parse(cases[i].body, strlen(cases[i].body), &tiny, &r, &err);
        ck_assert_msg(rc == cases[i].code, "case %zu: code %d, want %d (%s)", i, rc, cases[i].code,
                      err.message);
        ck_assert_msg(strcmp(err.param, cases[i].param) == 0, "case %zu: param '%s', want '%s'", i,
                      err.param, cases[i].param);
        ck_assert_msg(err.message[0] != '\0', "case %zu: no message", i);
        ck_assert_ptr_null(r.x);
    }
}
END_TEST

/* A framed body whose caller keeps it (may_borrow): aligned float32 tensors are read where
 * they lie, steps' and SDPA's too; an unaligned one, or any where the caller does not keep the
 * body, is copied; a non-finite value is still refused, naming the field; release frees only copies
 * (ASan would see a free of the body). */
START_TEST(test_api_framed_tensors_read_in_place) {
    enum { H = 64 };
    static const char one[] = "{\"x\":{\"shape\":[1,64],\"binary_data_size\":256}}";
    static const char two[] =
        "{\"steps\":[{\"session_id\":\"a\",\"x\":{\"shape\":[1,64],\"binary_data_size\":256}},"
        "{\"session_id\":\"b\",\"x\":{\"shape\":[1,64],\"binary_data_size\":256}}]}";
    float *block = malloc(4096); /* malloc's alignment, as the server's body */
    ck_assert_ptr_nonnull(block);
    for (int shift = 0; shift < 2; shift++) {
        uint8_t *raw = (uint8_t *)block + 64 + shift; /* aligned, then not */
        for (int i = 0; i < 2 * H; i++) {
            float v = (float)i * 0.25f;
            memcpy(raw + 4 * i, &v, 4);
        }
        for (int borrow = 0; borrow < 2; borrow++) {
            struct api_body b = {one, strlen(one), raw, 4 * H, borrow == 1};
            struct api_attend_request r;
            struct api_error err;
            ck_assert_int_eq(api_attend_request_parse_body(&b, &tiny, &r, &err), 0);
            bool in_place = (const uint8_t *)r.x == raw;
            ck_assert_int_eq(in_place, borrow == 1 && shift == 0);
            ck_assert_float_eq(r.x[5], 1.25f);
            api_attend_request_release(&r);
            struct api_body bb = {two, strlen(two), raw, 8 * H, borrow == 1};
            ck_assert_int_eq(api_attend_request_parse_body(&bb, &tiny, &r, &err), 0);
            ck_assert_int_eq(r.n_steps, 2);
            ck_assert_int_eq((const uint8_t *)r.steps[1].x == raw + 4 * H,
                             borrow == 1 && shift == 0);
            ck_assert_float_eq(r.steps[1].x[0], 16.0f);
            api_attend_request_release(&r);
        }
    }
    /* SDPA's q, k and v the same way: (1, 1, 64) each, three parts in field order */
    static const char sdpa[] = "{\"q\":{\"shape\":[1,1,64],\"binary_data_size\":256},"
                               "\"k\":{\"shape\":[1,1,64],\"binary_data_size\":256},"
                               "\"v\":{\"shape\":[1,1,64],\"binary_data_size\":256}}";
    for (int shift = 0; shift < 2; shift++) {
        uint8_t *raw = (uint8_t *)block + 64 + shift;
        for (int i = 0; i < 3 * H; i++) {
            float v = (float)i * 0.5f;
            memcpy(raw + 4 * i, &v, 4);
        }
        for (int borrow = 0; borrow < 2; borrow++) {
            struct api_body b = {sdpa, strlen(sdpa), raw, 12 * H, borrow == 1};
            struct api_sdpa_request r;
            struct api_error err;
            ck_assert_int_eq(api_sdpa_request_parse_body(&b, &r, &err), 0);
            bool in_place = borrow == 1 && shift == 0;
            ck_assert_int_eq((const uint8_t *)r.q == raw, in_place);
            ck_assert_int_eq((const uint8_t *)r.k == raw + 4 * H, in_place);
            ck_assert_int_eq((const uint8_t *)r.v == raw + 8 * H, in_place);
            ck_assert_float_eq(r.v[1], 64.5f);
            api_sdpa_request_release(&r);
        }
    }
    float inf = INFINITY;
    memcpy((uint8_t *)block + 64 + 4 * 7, &inf, 4);
    struct api_body b = {one, strlen(one), (uint8_t *)block + 64, 4 * H, true};
    struct api_attend_request r;
    struct api_error err;
    ck_assert_int_eq(api_attend_request_parse_body(&b, &tiny, &r, &err), ERROR_INVALID_REQUEST);
    ck_assert_str_eq(err.param, "x");
    ck_assert_ptr_nonnull(strstr(err.message, "value 7"));
    free(block);
}
END_TEST

/* The answers' number writers against printf: every integer as "%lld" writes it (the extremes
 * too), and durations as "%.3f" does, over a million values of many sizes, a quarter of them on
 * a grid of ten-thousandths, where many lie next to a half (rounding v x 1000 in floating point
 * picked the other digit for 4% of those), and exact halves, which go to even. */
START_TEST(test_api_number_writers_match_printf) {
    static const long long ints[] = {0, 1, -1, 9, 10, -10, 2048, 123456789, LLONG_MAX, LLONG_MIN};
    char want[64];
    for (size_t i = 0; i < sizeof ints / sizeof ints[0]; i++) {
        struct strbuf b;
        strbuf_init(&b);
        strbuf_put_int(&b, ints[i]);
        snprintf(want, sizeof want, "%lld", ints[i]);
        ck_assert_str_eq(b.data, want);
        strbuf_release(&b);
    }
    uint64_t seed = 12345;
    for (int i = 0; i < 1000000; i++) {
        seed = seed * 6364136223846793005ull + 1442695040888963407ull;
        double u = (double)(seed >> 11) / 9007199254740992.0;          /* [0, 1) */
        double v = i % 4 == 0 ? (double)(seed >> 30) / 10000.0         /* the grid */
                              : u * pow(10.0, (double)(i % 16) - 4.0); /* 1e-4 .. 1e12 */
        struct strbuf b;
        strbuf_init(&b);
        strbuf_put_fixed3(&b, v);
        snprintf(want, sizeof want, "%.3f", v);
        ck_assert_msg(strcmp(b.data, want) == 0, "%.17g: %s, printf %s", v, b.data, want);
        strbuf_release(&b);
    }
    static const struct {
        double v;
        const char *want;
    } fixed[] = {{0.0, "0.000"},
                 {0.0625, "0.062"}, /* an exact half: to even, as printf */
                 {0.1875, "0.188"},
                 {1.0005, "1.000"}, /* just below the half in binary */
                 {2.0005, "2.001"}, /* just above it */
                 {5843.0355, "5843.035"},
                 {1.5, "1.500"},
                 {2.25, "2.250"},
                 {1e14, "100000000000000.000"},
                 {-1.25, "-1.250"},
                 {2e15, "2000000000000000.000"},
                 {NAN, NULL}};
    for (size_t i = 0; i < sizeof fixed / sizeof fixed[0]; i++) {
        struct strbuf b;
        strbuf_init(&b);
        strbuf_put_fixed3(&b, fixed[i].v);
        snprintf(want, sizeof want, "%.3f", fixed[i].v);
        ck_assert_str_eq(b.data, fixed[i].want != NULL ? fixed[i].want : want);
        strbuf_release(&b);
    }
}
END_TEST

/* The id copies without printf: snprintf's "%s" into every size, from every length. */
START_TEST(test_api_copy_string_is_snprintf) {
    char src[80], got[80], want[80];
    for (size_t len = 0; len < 70; len++) {
        for (size_t i = 0; i < len; i++) {
            src[i] = (char)('a' + (len * 7 + i) % 26);
        }
        src[len] = '\0';
        for (size_t size = 1; size <= sizeof got; size++) {
            memset(got, 'x', sizeof got);
            memset(want, 'x', sizeof want);
            strbuf_copy_string(got, size, src);
            snprintf(want, size, "%s", src);
            ck_assert_mem_eq(got, want, sizeof got);
        }
    }
}
END_TEST

/* A field a call with steps has not at its top level: a step field is said to go in each step,
 * one no step has (stream) is said to be no field of such a call (it said "each step has its
 * own" of stream too; noticed by an outside audit). */
START_TEST(test_api_steps_top_level_fields_say_where) {
    char row[512] = "[[0";
    for (int c = 1; c < 64; c++) {
        strcat(row, ",0");
    }
    strcat(row, "]]");
    static const struct {
        const char *top, *param, *says;
    } cases[] = {
        {"\"expect_n_past\":1", "expect_n_past", "each step has its own"},
        {"\"stream\":true", "stream", "has no such field"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char body[1024];
        snprintf(body, sizeof body, "{%s,\"steps\":[{\"x\":%s}]}", cases[i].top, row);
        struct api_attend_request r;
        struct api_error err;
        int rc = api_attend_request_parse(body, strlen(body), &tiny, &r, &err);
        ck_assert_int_eq(rc, ERROR_INVALID_REQUEST);
        ck_assert_str_eq(err.param, cases[i].param);
        ck_assert_msg(strstr(err.message, cases[i].says) != NULL, "case %zu: %s", i, err.message);
    }
}
END_TEST

/* A tensor object's mistakes are named as a nested array's are: the rank first (a [1, 1, 64] x
 * is a rank mistake, not a size one), then each size, then what the object lacks (found by an
 * outside audit: each was one generic sentence). */
START_TEST(test_api_tensor_object_mistakes_say_what) {
    static const struct {
        const char *x;
        const char *says;
    } cases[] = {
        {"{\"shape\":[1,1,64],\"b64\":\"AAAA\"}", "shape has more than 2 sizes"},
        {"{\"shape\":[64],\"b64\":\"AAAA\"}", "shape has 1 size;"},
        {"{\"shape\":[],\"b64\":\"AAAA\"}", "shape has 0 sizes"},
        {"{\"shape\":[0,64],\"b64\":\"\"}", "dimension 0 is empty"},
        {"{\"shape\":[64,1],\"b64\":\"AAAA\"}", "dimension 1 is 1, expected 64"},
        {"{\"shape\":[1.5,64],\"b64\":\"AAAA\"}", "shape[0] is 1.5, not a size"},
        {"{\"shape\":[1,\"64\"],\"b64\":\"AAAA\"}", "other than a number"},
        {"{\"shape\":\"1,64\",\"b64\":\"AAAA\"}", "shape is not an array"},
        {"{\"shape\":[1e15,64],\"b64\":\"AAAA\"}", "too many values"},
        {"{\"shape\":[1e15,1,64],\"b64\":\"AAAA\"}", "shape has more than 2 sizes"},
        {"{\"b64\":\"AAAA\"}", "no shape"},
        {"{\"shape\":[1,64]}", "neither b64 nor binary_data_size"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char body[256];
        snprintf(body, sizeof body, "{\"x\":%s}", cases[i].x);
        struct api_attend_request r;
        struct api_error err;
        int rc = api_attend_request_parse(body, strlen(body), &tiny, &r, &err);
        ck_assert_msg(rc == ERROR_INVALID_REQUEST && strcmp(err.param, "x") == 0, "%s: %d %s", body,
                      rc, err.param);
        ck_assert_msg(strstr(err.message, cases[i].says) != NULL, "%s: '%s' does not say '%s'",
                      body, err.message, cases[i].says);
        ck_assert_ptr_null(r.x);
    }
    /* bytes that are no JSON value inside a shape are a JSON mistake, as anywhere else */
    static const char *const broken[] = {"{\"x\":{\"shape\":[1,@],\"b64\":\"\"}}",
                                         "{\"x\":{\"shape\":[1,", "{\"x\":{\"shape\":@}}"};
    for (size_t i = 0; i < sizeof broken / sizeof broken[0]; i++) {
        struct api_attend_request r;
        struct api_error err;
        int rc = api_attend_request_parse(broken[i], strlen(broken[i]), &tiny, &r, &err);
        ck_assert_msg(rc == ERROR_INVALID_JSON, "%s: %d %s", broken[i], rc, err.message);
    }
}
END_TEST

/* Every strict prefix of a valid request (a body cut short anywhere) is refused cleanly, with
 * no leak (the ASan build checks) and nothing allocated left behind in the struct. */
START_TEST(test_api_truncated_bodies_are_refused) {
    const char *files[] = {EX "attend_prefill.request.json", EX "attend_base64.request.json",
                           EX "sdpa.request.json", EX "sdpa_base64.request.json"};
    for (int f = 0; f < 4; f++) {
        size_t len;
        char *body = http_client_read_file(files[f], &len);
        for (size_t cut = 0; cut + 1 < len; cut++) {
            struct api_error err;
            int rc;
            if (f < 2) {
                struct api_attend_request r;
                rc = api_attend_request_parse(body, cut, &tiny, &r, &err);
                ck_assert_ptr_null(r.x);
            } else {
                struct api_sdpa_request r;
                rc = api_sdpa_request_parse(body, cut, &r, &err);
                ck_assert_ptr_null(r.q);
            }
            ck_assert_msg(rc == ERROR_INVALID_JSON || rc == ERROR_INVALID_REQUEST,
                          "%s cut at %zu: rc %d", files[f], cut, rc);
        }
        free(body);
    }
}
END_TEST

/* Names and ids are compared by their full length, so a NUL inside one never aliases a shorter
 * one; names are shown printable in errors. */
START_TEST(test_api_nul_in_names_and_ids_is_refused) {
    struct api_attend_request r;
    struct api_error err;
    const char *victim = "{\"session_id\":\"victim\\u0000x\",\"x\":[[1]]}";
    ck_assert_int_eq(api_attend_request_parse(victim, strlen(victim), &tiny, &r, &err),
                     ERROR_INVALID_REQUEST);
    ck_assert_str_eq(err.param, "session_id");
    const char *key = "{\"x\\u0000\":[[1]]}";
    ck_assert_int_eq(api_attend_request_parse(key, strlen(key), &tiny, &r, &err),
                     ERROR_INVALID_REQUEST);
    ck_assert_str_eq(err.param, "x\\u0000");
    ck_assert_ptr_nonnull(strstr(err.message, "unknown field"));
    struct api_fork_request f;
    const char *fork = "{\"new_id\":\"a\\u0000\"}";
    ck_assert_int_eq(api_fork_request_parse(fork, strlen(fork), &f, &err), ERROR_INVALID_REQUEST);
    ck_assert_str_eq(err.param, "new_id");
    /* An escaped name that decodes to a known one is that name. */
    const char *escaped = "{\"\\u006cayer\":0,\"layer\":1}";
    ck_assert_int_eq(api_attend_request_parse(escaped, strlen(escaped), &tiny, &r, &err),
                     ERROR_INVALID_REQUEST);
    ck_assert_ptr_nonnull(strstr(err.message, "appears twice"));
}
END_TEST

/* Invalid UTF-8 anywhere in a string is invalid_json (never echoed); a long name in an error is
 * cut at a character boundary, so every message stays UTF-8. */
START_TEST(test_api_invalid_utf8_and_long_names) {
    struct api_attend_request r;
    struct api_error err;
    const char *bad = "{\"caf\xC3\":1}";
    ck_assert_int_eq(api_attend_request_parse(bad, strlen(bad), &tiny, &r, &err),
                     ERROR_INVALID_JSON);
    char body[700] = "{\"";
    for (int i = 0; i < 200; i++) {
        strcat(body, "\xE2\x82\xAC"); /* the euro sign, 3 bytes */
    }
    strcat(body, "\":1}");
    ck_assert_int_eq(api_attend_request_parse(body, strlen(body), &tiny, &r, &err),
                     ERROR_INVALID_REQUEST);
    /* Whatever a message holds, the encoded error is valid UTF-8: bad bytes become U+FFFD. */
    char *enc = api_error_encode(ERROR_INVALID_REQUEST, "x \xC3 y \xFF\xE2\x82", "p\x80", NULL);
    ck_assert_str_eq(
        enc, "{\"error\":{\"message\":\"x \xEF\xBF\xBD y \xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD\","
             "\"type\":\"invalid_request_error\",\"code\":\"invalid_request\","
             "\"param\":\"p\xEF\xBF\xBD\"}}\n");
    free(enc);
    /* escapes between runs of plain text, at either end, and characters kept as they are */
    enc = api_error_encode(ERROR_INVALID_REQUEST, "\"a\\b\n\r\t\x01\x7F caf\xC3\xA9 \xE2\x82\xAC\"",
                           "\x1F", NULL);
    ck_assert_str_eq(enc, "{\"error\":{\"message\":\"\\\"a\\\\b\\n\\r\\t\\u0001\x7F caf\xC3\xA9 "
                          "\xE2\x82\xAC\\\"\",\"type\":\"invalid_request_error\","
                          "\"code\":\"invalid_request\",\"param\":\"\\u001f\"}}\n");
    free(enc);
    const char *texts[] = {err.param, err.message};
    for (int t = 0; t < 2; t++) {
        const unsigned char *p = (const unsigned char *)texts[t];
        size_t n = strlen(texts[t]);
        ck_assert_uint_gt(n, 10);
        for (size_t i = 0; i < n;) {
            size_t len = utf8_seq_len(p + i, n - i);
            ck_assert_msg(len > 0, "text %d is not UTF-8 at byte %zu: %s", t, i, texts[t]);
            i += len;
        }
    }
}
END_TEST

/* An SDPA body of q (1, nq, 1) and k, v (1, nk, 1), all ones (malloc'd; *len its length). */
static char *ones_sdpa_body(int nq, int nk, size_t *len) {
    size_t o = 0;
    char *body = malloc((size_t)(nq + 2 * nk) * 4 + 256);
    const char *names[] = {"q", "k", "v"};
    for (int t = 0; t < 3; t++) {
        o += (size_t)sprintf(body + o, "%s\"%s\":[[", t ? "," : "{", names[t]);
        for (int i = 0; i < (t ? nk : nq); i++) {
            o += (size_t)sprintf(body + o, "%s[1]", i ? "," : "");
        }
        o += (size_t)sprintf(body + o, "]]");
    }
    o += (size_t)sprintf(body + o, "}");
    *len = o;
    return body;
}

/* The work of one SDPA request is bounded by H x Tq x Tk scores: small tensors (a head dim of 1)
 * cannot ask for hours of work. 2^31 scores pass, one key more does not. */
START_TEST(test_api_sdpa_work_is_bounded) {
    size_t len;
    struct api_sdpa_request r;
    struct api_error err;
    char *body = ones_sdpa_body(32768, 65537, &len);
    ck_assert_int_eq(api_sdpa_request_parse(body, len, &r, &err), ERROR_INVALID_REQUEST);
    ck_assert_str_eq(err.param, "k");
    ck_assert_ptr_nonnull(strstr(err.message, "attention scores exceed"));
    ck_assert_ptr_null(r.q);
    free(body);
    body = ones_sdpa_body(32768, 65536, &len);
    ck_assert_int_eq(api_sdpa_request_parse(body, len, &r, &err), 0);
    api_sdpa_request_release(&r);
    free(body);
}
END_TEST

/* A selection may name any of /v1/sdpa's query heads: their count is q's (n_heads x n_q up to
 * 2^24), not the 4096 the parser allowed before q's shape is known, which refused head 4500 of
 * 5000 as 'out of range [-4096, 4095]' while a selection of all 5000 was answered. */
START_TEST(test_api_sdpa_selection_names_any_head) {
    enum { H = 5000 };
    size_t cap = 256 + H * 6;
    char *body = malloc(cap);
    ck_assert_ptr_nonnull(body);
    size_t n = (size_t)snprintf(body, cap, "{\"q\":[");
    for (int h = 0; h < H; h++) {
        n += (size_t)snprintf(body + n, cap - n, "%s[[1]]", h > 0 ? "," : "");
    }
    snprintf(body + n, cap - n,
             "],\"k\":[[[1]]],\"v\":[[[1]]],\"return_weights\":{\"heads\":[4500,-1]}}");
    struct api_sdpa_request r;
    struct api_error err;
    ck_assert_msg(api_sdpa_request_parse(body, strlen(body), &r, &err) == 0, "%s", err.message);
    ck_assert_int_eq(r.sel.n_heads, 2);
    ck_assert_int_eq(r.sel.heads[0], 4500);
    ck_assert_int_eq(r.sel.heads[1], H - 1);
    api_sdpa_request_release(&r);
    free(body);
}
END_TEST

START_TEST(test_api_sdpa_rejects_bad_requests) {
    struct {
        const char *body;
        const char *param;
    } cases[] = {
        {"{\"q\":[[[1]]],\"k\":[[[1]]]}", "v"},
        {"{\"q\":[[[1,2]]],\"k\":[[[1]]],\"v\":[[[1]]]}", "k"},           /* dk differs */
        {"{\"q\":[[[1]]],\"k\":[[[1]],[[1]]],\"v\":[[[1]],[[1]]]}", "k"}, /* 2 kv heads, 1 q */
        {"{\"q\":[[[1]]],\"k\":[[[1],[2]]],\"v\":[[[1]]]}", "v"},         /* Tk differs */
        {"{\"q\":[[[1]]],\"k\":[[[1]]],\"v\":[[[1]]],\"window\":-1}", "window"},
        {"{\"q\":[[[1]]],\"k\":[[[1]]],\"v\":[[[1]]],\"scale\":0}", "scale"},
        {"{\"q\":[[1]],\"k\":[[[1]]],\"v\":[[[1]]]}", "q"}, /* rank 2 */
        {"{\"q\":[[[1]]],\"k\":[[[1]]],\"v\":[[[1]]],\"causal\":\"yes\"}", "causal"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        struct api_sdpa_request r;
        struct api_error err;
        int rc = api_sdpa_request_parse(cases[i].body, strlen(cases[i].body), &r, &err);
        ck_assert_msg(rc == ERROR_INVALID_REQUEST, "case %zu: rc %d", i, rc);
        ck_assert_msg(strcmp(err.param, cases[i].param) == 0, "case %zu: param '%s', want '%s'", i,
                      err.param, cases[i].param);
    }
}
END_TEST

/* ---- responses ------------------------------------------------------------------------------ */

/* An encoded attend response has exactly the example's structure, and its numbers read back as
 * the very same floats (%.9g round-trips float32). */
START_TEST(test_api_attend_response_roundtrip) {
    float out[3 * 64], w[4 * 3 * 5];
    for (int i = 0; i < 3 * 64; i++) {
        out[i] = (float)sin(i * 1.7) * powf(10.0f, (float)(i % 9) - 4);
    }
    for (int i = 0; i < 4 * 3 * 5; i++) {
        w[i] = (float)(i % 5) / 10.0f;
    }
    struct api_attend_response r = {
        "chat-42", 0, 2,     5, 3,    64,   4,    out,  w,    {1.5, 2.25}, API_ENCODING_FLOAT,
        false,     0, false, 0, NULL, NULL, NULL, NULL, NULL, NULL,        0,
        0};
    char *text = api_attend_response_encode(&r, NULL, NULL, NULL);
    cJSON *got = cJSON_Parse(text);
    char *ex = http_client_read_file(EX "attend_prefill.response.json", NULL);
    cJSON *want = cJSON_Parse(ex);
    char why[256];
    ck_assert_msg(http_client_json_same_shape(got, want, why, sizeof why), "%s", why);
    size_t n;
    float *back = http_client_json_floats(cJSON_GetObjectItemCaseSensitive(got, "output"), &n);
    ck_assert_uint_eq(n, 3 * 64);
    ck_assert_mem_eq(back, out, sizeof out);
    free(back);
    back = http_client_json_floats(cJSON_GetObjectItemCaseSensitive(got, "weights"), &n);
    ck_assert_uint_eq(n, 4 * 3 * 5);
    ck_assert_mem_eq(back, w, sizeof w);
    free(back);
    ck_assert_int_eq(cJSON_GetObjectItemCaseSensitive(got, "n_past")->valueint, 2);
    ck_assert_int_eq(cJSON_GetObjectItemCaseSensitive(got, "n_tokens")->valueint, 5);
    cJSON_Delete(got);
    cJSON_Delete(want);
    free(ex);
    free(text);
    /* base64 output: the b64 example's structure, and the same bytes back. */
    r.session_id = NULL;
    r.weights = NULL;
    r.encoding = API_ENCODING_BASE64;
    text = api_attend_response_encode(&r, NULL, NULL, NULL);
    got = cJSON_Parse(text);
    ck_assert(cJSON_IsNull(cJSON_GetObjectItemCaseSensitive(got, "session_id")));
    ex = http_client_read_file(EX "attend_base64.response.json", NULL);
    want = cJSON_Parse(ex);
    cJSON_ReplaceItemInObject(want, "session_id", cJSON_CreateNull());
    ck_assert_msg(http_client_json_same_shape(got, want, why, sizeof why), "%s", why);
    back = http_client_json_floats(cJSON_GetObjectItemCaseSensitive(got, "output"), &n);
    ck_assert_uint_eq(n, 3 * 64);
    ck_assert_mem_eq(back, out, sizeof out);
    free(back);
    cJSON_Delete(got);
    cJSON_Delete(want);
    free(ex);
    free(text);
}
END_TEST

/* SSE framing: one `data: {json}\n\n` per token, the usage event, then `data: [DONE]\n\n`, with
 * the events shaped like the stream example's. */
START_TEST(test_api_stream_framing) {
    float out[64];
    for (int i = 0; i < 64; i++) {
        out[i] = (float)i / 64.0f;
    }
    struct strbuf b;
    strbuf_init(&b);
    struct api_stream_event e = {0, 2, 2, 64, 4, out, NULL, API_ENCODING_FLOAT};
    api_stream_event_encode(&b, &e);
    struct api_attend_response u = {"chat-stream",
                                    0,
                                    2,
                                    3,
                                    1,
                                    64,
                                    4,
                                    NULL,
                                    NULL,
                                    {1, 2},
                                    API_ENCODING_FLOAT,
                                    false,
                                    0,
                                    false,
                                    0,
                                    NULL,
                                    NULL,
                                    NULL,
                                    NULL,
                                    NULL,
                                    NULL,
                                    0,
                                    0};
    api_stream_usage_encode(&b, &u);
    char *ex = http_client_read_file(EX "attend_stream.response.txt", NULL);
    /* Split both into events and compare them one by one. */
    char *texts[2] = {b.data, ex};
    char *events[2][8];
    int n_events[2] = {0, 0};
    for (int t = 0; t < 2; t++) {
        char *p = texts[t];
        while (*p) {
            ck_assert_msg(strncmp(p, "data: ", 6) == 0, "event does not start with 'data: '");
            char *end = strstr(p, "\n\n");
            ck_assert_ptr_nonnull(end);
            *end = '\0';
            ck_assert_int_lt(n_events[t], 8);
            events[t][n_events[t]++] = p + 6;
            p = end + 2;
        }
    }
    /* Ours: 1 token + usage + DONE; the example: 2 tokens + usage + DONE. */
    ck_assert_int_eq(n_events[0], 3);
    ck_assert_int_eq(n_events[1], 4);
    ck_assert_str_eq(events[0][2], "[DONE]");
    ck_assert_str_eq(events[1][3], "[DONE]");
    char why[256];
    for (int k = 0; k < 2; k++) {
        cJSON *g = cJSON_Parse(events[0][k]);
        cJSON *w_ = cJSON_Parse(events[1][k == 0 ? 0 : 2]);
        ck_assert_ptr_nonnull(g);
        ck_assert_ptr_nonnull(w_);
        ck_assert_msg(http_client_json_same_shape(g, w_, why, sizeof why), "event %d: %s", k, why);
        cJSON_Delete(g);
        cJSON_Delete(w_);
    }
    /* An error mid-stream is an Error event, then [DONE]. */
    strbuf_release(&b);
    api_stream_error_encode(&b, ATTN_ENOSPC, NULL, NULL);
    ck_assert_str_eq(b.data,
                     "data: {\"error\":{\"message\":\"the KV cache pool cannot hold this request "
                     "even after evicting idle sessions\",\"type\":\"insufficient_storage_error\","
                     "\"code\":\"kv_budget_exhausted\",\"param\":null}}\n\ndata: [DONE]\n\n");
    strbuf_release(&b);
    free(ex);
}
END_TEST

/* GET /v1/model's fingerprint for preset tiny, seed 0, as the daemon holds it (BF16) */
#define FP_EXAMPLE "642ed3acfb2a825d5825bc1e1c992b3dcc6b93b3b68dc5fa6f8076256c652b56"

START_TEST(test_api_model_and_status_shapes) {
    attn_config cfg;
    ck_assert_int_eq(attn_config_preset("tiny", &cfg), ATTN_OK);
    ck_assert_int_eq(attn_config_check(&cfg), ATTN_OK);
    struct api_model_info info = {
        "preset:tiny seed=0", "attnd", 0, 2, 114688, "bf16", "bf16", 256, FP_EXAMPLE};
    char *text = api_model_encode(&cfg, &info, NULL);
    char *ex = http_client_read_file(EX "model.response.json", NULL);
    ck_assert_str_eq(text, ex); /* the captured example is exactly this model */
    free(ex);
    free(text);
    text = api_status_encode("ok", NULL);
    ex = http_client_read_file(EX "healthz.response.json", NULL);
    ck_assert_str_eq(text, ex);
    free(ex);
    free(text);
}
END_TEST

START_TEST(test_api_session_shapes) {
    char *ex = http_client_read_file(EX "session_get.response.json", NULL);
    cJSON *j = cJSON_Parse(ex);
    /* idle_ms is whatever the capture measured; everything else is fixed by the requests. */
    int64_t idle = (int64_t)cJSON_GetObjectItemCaseSensitive(j, "idle_ms")->valuedouble;
    cJSON_Delete(j);
    /* tiny: 2 kv heads x head_dim 16 x 128-token blocks x K and V x 2 bytes (bf16) = 16384 per
     * block, and as many again for the 4 query heads' rows (capture.sh's daemon keeps queries) */
    struct api_session_layer layers[1] = {{0, 4, 4, 0, -1, 32768, false}};
    struct api_session s = {"chat-42", 4, 32768, idle, 0, "memory", layers, 1};
    char *text = api_session_encode(&s, NULL);
    ck_assert_str_eq(text, ex);
    free(ex);
    free(text);
    struct api_pool pool = {65536, 1073741824, 128, 4, 65536, "bf16"};
    text = api_session_list_encode(&s, 1, &pool, NULL);
    ex = http_client_read_file(EX "sessions_list.response.json", NULL);
    cJSON *g = cJSON_Parse(text), *w = cJSON_Parse(ex);
    char why[256];
    ck_assert_msg(http_client_json_same_shape(g, w, why, sizeof why), "%s", why);
    cJSON_Delete(g);
    cJSON_Delete(w);
    free(ex);
    free(text);
}
END_TEST

/* ---- base64 and ids -------------------------------------------------------------------------- */

START_TEST(test_api_b64_rfc4648_vectors) {
    const char *plain[] = {"", "f", "fo", "foo", "foob", "fooba", "foobar"};
    const char *coded[] = {"", "Zg==", "Zm8=", "Zm9v", "Zm9vYg==", "Zm9vYmE=", "Zm9vYmFy"};
    for (int i = 0; i < 7; i++) {
        char enc[16];
        b64_encode((const uint8_t *)plain[i], strlen(plain[i]), enc);
        ck_assert_str_eq(enc, coded[i]);
        uint8_t dec[16];
        size_t n = b64_decoded_len(coded[i], strlen(coded[i]));
        ck_assert_uint_eq(n, strlen(plain[i]));
        ck_assert_int_eq(b64_decode(coded[i], strlen(coded[i]), dec), 0);
        ck_assert_mem_eq(dec, plain[i], n);
    }
    uint8_t dec[16];
    ck_assert_int_eq(b64_decode("Zm9", 3, dec), -1);
    ck_assert_int_eq(b64_decode("Zm=v", 4, dec), -1);
    ck_assert_int_eq(b64_decode("Zm9v Zg==", 8, dec), -1);
    ck_assert_int_eq(b64_decode("Zg==Zg==", 8, dec), -1);
    /* Leftover bits of a padded quantum must be zero: "Zh==" and "Zm9=" would decode, with
     * their stray bits dropped, to what "Zg==" and "Zm8=" mean. */
    ck_assert_int_eq(b64_decode("Zh==", 4, dec), -1);
    ck_assert_int_eq(b64_decode("Zm9=", 4, dec), -1);
    ck_assert_int_eq(b64_decode("Zm8=", 4, dec), 0);
}
END_TEST

START_TEST(test_api_session_id_rules) {
    ck_assert(api_session_id_is_valid("a", 1));
    ck_assert(api_session_id_is_valid("A-z_0.9:x", 9));
    char id[130];
    memset(id, 'a', sizeof id);
    ck_assert(api_session_id_is_valid(id, 128));
    ck_assert(!api_session_id_is_valid(id, 129));
    ck_assert(!api_session_id_is_valid("", 0));
    ck_assert(!api_session_id_is_valid("a b", 3));
    ck_assert(!api_session_id_is_valid("a/b", 3));
    ck_assert(!api_session_id_is_valid("\xc3\xa9", 2));
}
END_TEST

/* check_main.c is given every suite by a table generated from the definitions below, each line
 * starting with `Suite *`. */
extern Suite *api_suite(void);

Suite *api_suite(void) {
    Suite *s = suite_create("api");
    TCase *tc = tcase_create("proto");
    /* the number writers' million values take 3-4 s under ASan, check's default limit 4 */
    tcase_set_timeout(tc, 30);
    tcase_add_test(tc, test_api_error_table_matches_proto);
    tcase_add_test(tc, test_api_error_example_exact);
    tcase_add_test(tc, test_api_attend_examples_parse);
    tcase_add_test(tc, test_api_float32_range_edges);
    tcase_add_test(tc, test_api_attention_lists);
    tcase_add_test(tc, test_api_session_requests_parse);
    tcase_add_test(tc, test_api_sdpa_golden_float);
    tcase_add_test(tc, test_api_sdpa_golden_base64);
    tcase_add_test(tc, test_api_attend_rejects_bad_requests);
    tcase_add_test(tc, test_api_attend_many_steps);
    tcase_add_test(tc, test_api_steps_top_level_fields_say_where);
    tcase_add_test(tc, test_api_number_writers_match_printf);
    tcase_add_test(tc, test_api_copy_string_is_snprintf);
    tcase_add_test(tc, test_api_framed_tensors_read_in_place);
    tcase_add_test(tc, test_api_tensor_object_mistakes_say_what);
    tcase_add_test(tc, test_api_sdpa_rejects_bad_requests);
    tcase_add_test(tc, test_api_sdpa_selection_names_any_head);
    tcase_add_test(tc, test_api_sdpa_work_is_bounded);
    tcase_add_test(tc, test_api_nul_in_names_and_ids_is_refused);
    tcase_add_test(tc, test_api_invalid_utf8_and_long_names);
    tcase_add_test(tc, test_api_truncated_bodies_are_refused);
    tcase_add_test(tc, test_api_attend_response_roundtrip);
    tcase_add_test(tc, test_api_stream_framing);
    tcase_add_test(tc, test_api_model_and_status_shapes);
    tcase_add_test(tc, test_api_session_shapes);
    tcase_add_test(tc, test_api_b64_rfc4648_vectors);
    tcase_add_test(tc, test_api_raw_tensors_refuse_non_finite_values);
    tcase_add_test(tc, test_api_session_id_rules);
    suite_add_tcase(s, tc);
    return s;
}
