/* server/api_read.c: reading a request body for the parsers of api*.c (see api_int.h): errors
 * with the field they name, the body as one JSON object (framed or not), an object's known
 * fields each at most once, and the scalar fields (booleans, integers in range, layers, short
 * strings, session ids, encodings).
 */
#include "api_int.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "error.h"
#include "utf8.h"

/* ---- errors --------------------------------------------------------------------------------- */

int api__fail(struct api_error *err, int code, const char *param, const char *fmt, ...) {
    err->code = code;
    snprintf(err->param, sizeof err->param, "%s", param ? param : "");
    utf8_trim_partial(err->param);
    err->message[0] = '\0';
    if (fmt != NULL) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err->message, sizeof err->message, fmt, ap);
        va_end(ap);
        utf8_trim_partial(err->message); /* a message cut at the buffer's end stays UTF-8 */
    }
    return code;
}

int api__syntax_error(const struct json_reader *r, struct api_error *err) {
    size_t at;
    const char *what = json_reader_error(r, &at);
    return api__fail(err, ERROR_INVALID_JSON, NULL, "request body is not valid JSON: %s (byte %zu)",
                     what, at);
}

int api__out_of_memory(struct api_error *err, const char *param) {
    return api__fail(err, ERROR_INTERNAL, param, "out of memory reading %s", param);
}

/* A member name made printable for a message or param: control bytes as \uXXXX, cut (at a
 * character boundary) to fit `size` with "..." when long. The name is valid UTF-8 (the reader
 * checked it) but may hold any character, NUL included. */
static void printable_name(const struct json_span *key, char *out, size_t size) {
    char head[48];
    bool is_whole;
    size_t n = json_span_decode(key, head, sizeof head, &is_whole);
    size_t o = 0;
    for (size_t i = 0; i < n;) {
        unsigned char c = (unsigned char)head[i];
        size_t len =
            c < 0x20 || c == 0x7F ? 6 : utf8_seq_len((const unsigned char *)head + i, n - i);
        if (o + len + 4 > size) {
            is_whole = false;
            break;
        }
        if (len == 6) {
            o += (size_t)snprintf(out + o, size - o, "\\u%04x", c);
            i++;
        } else {
            memcpy(out + o, head + i, len);
            o += len;
            i += len;
        }
    }
    out[o] = '\0';
    if (!is_whole) {
        memcpy(out + o, "...", 4);
    }
}

/* ---- objects: known fields, each at most once ------------------------------------------------ */

/* The index of key in names[0..n), or -1. */
static int field_index(const struct json_span *key, const char *const *names, int n) {
    for (int i = 0; i < n; i++) {
        if (json_span_equals(key, names[i])) {
            return i;
        }
    }
    return -1;
}

int api__next_field(struct json_reader *r, const char *const *names, int n, uint32_t *seen,
                    int *index, struct api_error *err) {
    struct json_span key;
    int more = json_object_next(r, &key);
    if (more < 0) {
        return api__syntax_error(r, err);
    }
    if (more == 0) {
        return 0;
    }
    int i = field_index(&key, names, n);
    if (i < 0) {
        char name[64];
        printable_name(&key, name, sizeof name);
        return api__fail(err, ERROR_INVALID_REQUEST, name, "unknown field '%s'", name);
    }
    if (*seen & (1u << i)) {
        return api__fail(err, ERROR_INVALID_REQUEST, names[i], "field '%s' appears twice",
                         names[i]);
    }
    *seen |= 1u << i;
    *index = i;
    return 1;
}

struct body_reader *api__body_of(struct json_reader *r) {
    return (struct body_reader *)r;
}

int api__begin_framed(struct body_reader *br, const struct api_body *b, struct api_error *err) {
    br->binary = b->binary;
    br->binary_len = b->binary_len;
    br->binary_used = 0;
    br->may_borrow = b->may_borrow && b->binary != NULL;
    struct json_reader *r = &br->json;
    const char *body = b->json;
    size_t len = b->json_len;
    json_reader_init(r, body, len);
    if (len == 0) {
        return api__fail(err, ERROR_INVALID_JSON, NULL,
                         "request body is empty; expected a JSON object");
    }
    enum json_type t = json_peek(r);
    if (t == JSON_TYPE_INVALID) {
        return api__fail(err, ERROR_INVALID_JSON, NULL,
                         "request body is not valid JSON: expected a value (byte 0)");
    }
    if (t != JSON_TYPE_OBJECT) {
        return api__fail(err, ERROR_INVALID_REQUEST, NULL, "request body must be a JSON object");
    }
    return json_object_begin(r) == 0 ? 0 : api__syntax_error(r, err);
}

int api__begin_body(struct body_reader *br, const char *body, size_t len, struct api_error *err) {
    struct api_body b = {body, len, NULL, 0, false};
    return api__begin_framed(br, &b, err);
}

int api__end_body(struct json_reader *r, struct api_error *err) {
    if (json_reader_finish(r) != 0) {
        return api__syntax_error(r, err);
    }
    struct body_reader *br = api__body_of(r);
    if (br->binary != NULL && br->binary_used != br->binary_len) {
        return api__fail(err, ERROR_INVALID_REQUEST, "Inference-Header-Content-Length",
                         "the body's binary part has %zu bytes, its tensors' binary_data_size "
                         "declare %zu",
                         br->binary_len, br->binary_used);
    }
    return 0;
}

void api__free_unborrowed(uintptr_t lo, uintptr_t hi, void *p) {
    uintptr_t a = (uintptr_t)p;
    if (a < lo || a >= hi) {
        free(p);
    }
}

/* ---- scalar fields -------------------------------------------------------------------------- */

bool api_session_id_is_valid(const char *s, size_t len) {
    if (len < 1 || len > API_SESSION_ID_MAX) {
        return false;
    }
    for (size_t i = 0; i < len; i++) {
        char c = s[i];
        bool ok = (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') ||
                  c == '.' || c == '_' || c == ':' || c == '-';
        if (!ok) {
            return false;
        }
    }
    return true;
}

int api__wrong_type(struct json_reader *r, const char *name, const char *expected,
                    struct api_error *err) {
    if (json_peek(r) == JSON_TYPE_INVALID) {
        json_read_null(r); /* records the syntax error at this byte */
        return api__syntax_error(r, err);
    }
    return api__fail(err, ERROR_INVALID_REQUEST, name, "%s: expected %s", name, expected);
}

bool api__take_null(struct json_reader *r) {
    return json_peek(r) == JSON_TYPE_NULL && json_read_null(r) == 0;
}

int api__get_bool(struct json_reader *r, const char *name, bool *out, struct api_error *err) {
    if (json_peek(r) != JSON_TYPE_BOOL) {
        return api__wrong_type(r, name, "true or false", err);
    }
    return json_read_bool(r, out) == 0 ? 0 : api__syntax_error(r, err);
}

int api__get_int(struct json_reader *r, const char *name, int64_t min, int64_t max, int64_t *out,
                 struct api_error *err) {
    double d;
    if (json_peek(r) != JSON_TYPE_NUMBER) {
        return api__wrong_type(r, name, "an integer", err);
    }
    if (json_read_number(r, &d) != 0) {
        return api__syntax_error(r, err);
    }
    if (!isfinite(d) || d != floor(d)) {
        return api__fail(err, ERROR_INVALID_REQUEST, name, "%s: expected an integer", name);
    }
    if (d < (double)min || d > (double)max) {
        /* past 2^53 a double holds no exact integer: %g says so rather than print 300 digits
         * of 1e300, or 2^64 for 2^64 + 1 */
        return api__fail(err, ERROR_INVALID_REQUEST, name,
                         fabs(d) < 9007199254740992.0 ? "%s: %.0f is out of range [%lld, %lld]"
                                                      : "%s: %.6g is out of range [%lld, %lld]",
                         name, d, (long long)min, (long long)max);
    }
    *out = (int64_t)d;
    return 0;
}

int api__get_layer(struct json_reader *r, const struct api_limits *lim, int32_t *out,
                   struct api_error *err) {
    int64_t v;
    int rc = api__get_int(r, "layer", 0, INT32_MAX, &v, err);
    if (rc != 0) {
        return rc;
    }
    if (v < lim->layer_first || v >= (int64_t)lim->layer_first + lim->layer_count) {
        return api__fail(err, ERROR_INVALID_REQUEST, "layer",
                         "layer: %lld is not loaded (loaded layers: %d-%d)", (long long)v,
                         (int)lim->layer_first, (int)(lim->layer_first + lim->layer_count - 1));
    }
    *out = (int32_t)v;
    return 0;
}

int api__get_short_string(struct json_reader *r, const char *name, char *out, size_t size,
                          size_t *len, const char *what, struct api_error *err) {
    struct json_span s;
    if (json_peek(r) != JSON_TYPE_STRING) {
        return api__wrong_type(r, name, what, err);
    }
    if (json_read_string(r, &s) != 0) {
        return api__syntax_error(r, err);
    }
    bool is_whole;
    size_t n = json_span_decode(&s, out, size - 1, &is_whole);
    out[n] = '\0';
    if (!is_whole) {
        out[0] = '\0';
        return api__fail(err, ERROR_INVALID_REQUEST, name, "%s: expected %s", name, what);
    }
    *len = n;
    return 0;
}

int api__get_session_id(struct json_reader *r, const char *name, char *out, struct api_error *err) {
    static const char what[] = "a string of 1 to 128 characters from [A-Za-z0-9._:-]";
    size_t len;
    int rc = api__get_short_string(r, name, out, API_SESSION_ID_MAX + 1, &len, what, err);
    if (rc == 0 && !api_session_id_is_valid(out, len)) {
        out[0] = '\0';
        rc = api__fail(err, ERROR_INVALID_REQUEST, name, "%s: expected %s", name, what);
    }
    return rc;
}

int api__get_encoding(struct json_reader *r, enum api_encoding *out, struct api_error *err) {
    static const char what[] = "\"float\" or \"base64\"";
    char text[8];
    size_t len;
    int rc = api__get_short_string(r, "encoding_format", text, sizeof text, &len, what, err);
    if (rc != 0) {
        return rc;
    }
    if (len == 5 && memcmp(text, "float", 5) == 0) {
        *out = API_ENCODING_FLOAT;
    } else if (len == 6 && memcmp(text, "base64", 6) == 0) {
        *out = API_ENCODING_BASE64;
    } else {
        return api__fail(err, ERROR_INVALID_REQUEST, "encoding_format",
                         "encoding_format: expected %s", what);
    }
    return 0;
}

int api__apply_binary_output(bool binary_output, uint32_t seen, int encoding_bit,
                             enum api_encoding *enc, struct api_error *err) {
    if (binary_output && ((seen >> encoding_bit) & 1u)) {
        return api__fail(
            err, ERROR_INVALID_REQUEST, "encoding_format",
            "encoding_format: not with binary_output (its tensors are raw float32 after "
            "the JSON)");
    }
    if (binary_output) {
        *enc = API_ENCODING_BINARY;
    }
    return 0;
}

void api__prepend(char *s, size_t size, const char *prefix, const char *sep) {
    /* a message about the unnamed whole (": expected ...") takes the prefix as its name */
    bool is_nameless = sep[0] != '\0' && strncmp(s, sep, strlen(sep)) == 0;
    size_t pl = strlen(prefix), sl = s[0] && !is_nameless ? strlen(sep) : 0, n = strlen(s);
    if (pl + sl >= size) {
        return;
    }
    if (n > size - 1 - pl - sl) {
        n = size - 1 - pl - sl;
    }
    memmove(s + pl + sl, s, n);
    memcpy(s, prefix, pl);
    memcpy(s + pl, sep, sl);
    s[pl + sl + n] = '\0';
}
