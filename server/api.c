/* server/api.c: the request half of the JSON edge (see api.h and proto/openapi.yaml). Bodies are
 * read with the strict pull reader of json.h, one field at a time, and checked as they are read:
 * tensors go straight from the text into row-major float arrays, a field's errors are found as
 * soon as its bytes are, and an unknown or repeated field stops the parse at once. So a parse
 * costs time linear in the bytes read and memory proportional to the tensors it keeps, whatever
 * the body holds. Encoding responses is api_encode.c.
 */
#include "api.h"

#include <float.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "b64.h"
#include "error.h"
#include "json.h"
#include "utf8.h"

/* Tensors larger than this many values are refused before any allocation (1 GiB of float). */
#define MAX_TENSOR_VALUES ((int64_t)1 << 28)

/* The first allocation of a nested-array tensor, in values; it doubles as numbers arrive. */
#define TENSOR_FIRST_VALUES 1024

/* ---- errors --------------------------------------------------------------------------------- */

static int fail(struct api_error *err, int code, const char *param, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

static int fail(struct api_error *err, int code, const char *param, const char *fmt, ...) {
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

/* The reader's syntax error as invalid_json. */
static int syntax_error(const struct json_reader *r, struct api_error *err) {
    size_t at;
    const char *what = json_reader_error(r, &at);
    return fail(err, ERROR_INVALID_JSON, NULL, "request body is not valid JSON: %s (byte %zu)",
                what, at);
}

static int out_of_memory(struct api_error *err, const char *param) {
    return fail(err, ERROR_INTERNAL, param, "out of memory reading %s", param);
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

/* Moves to the next member of the open object and identifies it among names: returns 1 with
 * *index set, 0 at the object's end, or an error code (syntax, unknown field, or a field seen
 * before, tracked in *seen). Each member costs one comparison per known name, so an object of
 * any size is refused at its first stranger or repeat. */
static int next_field(struct json_reader *r, const char *const *names, int n, uint32_t *seen,
                      int *index, struct api_error *err) {
    struct json_span key;
    int more = json_object_next(r, &key);
    if (more < 0) {
        return syntax_error(r, err);
    }
    if (more == 0) {
        return 0;
    }
    int i = field_index(&key, names, n);
    if (i < 0) {
        char name[64];
        printable_name(&key, name, sizeof name);
        return fail(err, ERROR_INVALID_REQUEST, name, "unknown field '%s'", name);
    }
    if (*seen & (1u << i)) {
        return fail(err, ERROR_INVALID_REQUEST, names[i], "field '%s' appears twice", names[i]);
    }
    *seen |= 1u << i;
    *index = i;
    return 1;
}

/* A body's reader: the JSON, and the raw part of a framed body with how much of it the tensors
 * read so far have taken. `json` comes first, so the helpers that take the json_reader reach
 * the rest (body_of). */
struct body_reader {
    struct json_reader json;
    const uint8_t *binary; /* NULL: the body is not framed */
    size_t binary_len, binary_used;
    bool may_borrow; /* tensors may be read where they lie (api_body.may_borrow) */
};

static struct body_reader *body_of(struct json_reader *r) {
    return (struct body_reader *)r;
}

/* Starts reading a body that must be one JSON object. */
static int begin_framed(struct body_reader *br, const struct api_body *b, struct api_error *err) {
    br->binary = b->binary;
    br->binary_len = b->binary_len;
    br->binary_used = 0;
    br->may_borrow = b->may_borrow && b->binary != NULL;
    struct json_reader *r = &br->json;
    const char *body = b->json;
    size_t len = b->json_len;
    json_reader_init(r, body, len);
    if (len == 0) {
        return fail(err, ERROR_INVALID_JSON, NULL, "request body is empty; expected a JSON object");
    }
    enum json_type t = json_peek(r);
    if (t == JSON_TYPE_INVALID) {
        return fail(err, ERROR_INVALID_JSON, NULL,
                    "request body is not valid JSON: expected a value (byte 0)");
    }
    if (t != JSON_TYPE_OBJECT) {
        return fail(err, ERROR_INVALID_REQUEST, NULL, "request body must be a JSON object");
    }
    return json_object_begin(r) == 0 ? 0 : syntax_error(r, err);
}

/* The JSON-only body of the functions without framing. */
static int begin_body(struct body_reader *br, const char *body, size_t len, struct api_error *err) {
    struct api_body b = {body, len, NULL, 0, false};
    return begin_framed(br, &b, err);
}

/* After the object's closing brace: nothing but whitespace may follow, and a framed body's raw
 * part must have been taken whole by its tensors. */
static int end_body(struct json_reader *r, struct api_error *err) {
    if (json_reader_finish(r) != 0) {
        return syntax_error(r, err);
    }
    struct body_reader *br = body_of(r);
    if (br->binary != NULL && br->binary_used != br->binary_len) {
        return fail(err, ERROR_INVALID_REQUEST, "Inference-Header-Content-Length",
                    "the body's binary part has %zu bytes, its tensors' binary_data_size "
                    "declare %zu",
                    br->binary_len, br->binary_used);
    }
    return 0;
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

/* A value of the wrong JSON type for field `name`: invalid_request naming what was expected
 * (or invalid_json when the bytes are no value at all). */
static int wrong_type(struct json_reader *r, const char *name, const char *expected,
                      struct api_error *err) {
    if (json_peek(r) == JSON_TYPE_INVALID) {
        json_read_null(r); /* records the syntax error at this byte */
        return syntax_error(r, err);
    }
    return fail(err, ERROR_INVALID_REQUEST, name, "%s: expected %s", name, expected);
}

/* Consumes a null and returns true if the next value is one (an optional field left unset). */
static bool take_null(struct json_reader *r) {
    return json_peek(r) == JSON_TYPE_NULL && json_read_null(r) == 0;
}

static int get_bool(struct json_reader *r, const char *name, bool *out, struct api_error *err) {
    if (json_peek(r) != JSON_TYPE_BOOL) {
        return wrong_type(r, name, "true or false", err);
    }
    return json_read_bool(r, out) == 0 ? 0 : syntax_error(r, err);
}

static int get_int(struct json_reader *r, const char *name, int64_t min, int64_t max, int64_t *out,
                   struct api_error *err) {
    double d;
    if (json_peek(r) != JSON_TYPE_NUMBER) {
        return wrong_type(r, name, "an integer", err);
    }
    if (json_read_number(r, &d) != 0) {
        return syntax_error(r, err);
    }
    if (!isfinite(d) || d != floor(d)) {
        return fail(err, ERROR_INVALID_REQUEST, name, "%s: expected an integer", name);
    }
    if (d < (double)min || d > (double)max) {
        /* past 2^53 a double holds no exact integer: %g says so rather than print 300 digits
         * of 1e300, or 2^64 for 2^64 + 1 */
        return fail(err, ERROR_INVALID_REQUEST, name,
                    fabs(d) < 9007199254740992.0 ? "%s: %.0f is out of range [%lld, %lld]"
                                                 : "%s: %.6g is out of range [%lld, %lld]",
                    name, d, (long long)min, (long long)max);
    }
    *out = (int64_t)d;
    return 0;
}

/* A layer index: an integer >= 0 that must be one of the loaded layers. */
static int get_layer(struct json_reader *r, const struct api_limits *lim, int32_t *out,
                     struct api_error *err) {
    int64_t v;
    int rc = get_int(r, "layer", 0, INT32_MAX, &v, err);
    if (rc != 0) {
        return rc;
    }
    if (v < lim->layer_first || v >= (int64_t)lim->layer_first + lim->layer_count) {
        return fail(err, ERROR_INVALID_REQUEST, "layer",
                    "layer: %lld is not loaded (loaded layers: %d-%d)", (long long)v,
                    (int)lim->layer_first, (int)(lim->layer_first + lim->layer_count - 1));
    }
    *out = (int32_t)v;
    return 0;
}

/* A short string field decoded into out[0..size) (NUL-terminated; *len its length, which may
 * include NUL bytes). Longer strings are refused with `what`. */
static int get_short_string(struct json_reader *r, const char *name, char *out, size_t size,
                            size_t *len, const char *what, struct api_error *err) {
    struct json_span s;
    if (json_peek(r) != JSON_TYPE_STRING) {
        return wrong_type(r, name, what, err);
    }
    if (json_read_string(r, &s) != 0) {
        return syntax_error(r, err);
    }
    bool is_whole;
    size_t n = json_span_decode(&s, out, size - 1, &is_whole);
    out[n] = '\0';
    if (!is_whole) {
        out[0] = '\0';
        return fail(err, ERROR_INVALID_REQUEST, name, "%s: expected %s", name, what);
    }
    *len = n;
    return 0;
}

/* A session id, compared by its full decoded length: "a\u0000b" is not "a". */
static int get_session_id(struct json_reader *r, const char *name, char *out,
                          struct api_error *err) {
    static const char what[] = "a string of 1 to 128 characters from [A-Za-z0-9._:-]";
    size_t len;
    int rc = get_short_string(r, name, out, API_SESSION_ID_MAX + 1, &len, what, err);
    if (rc == 0 && !api_session_id_is_valid(out, len)) {
        out[0] = '\0';
        rc = fail(err, ERROR_INVALID_REQUEST, name, "%s: expected %s", name, what);
    }
    return rc;
}

static int get_encoding(struct json_reader *r, enum api_encoding *out, struct api_error *err) {
    static const char what[] = "\"float\" or \"base64\"";
    char text[8];
    size_t len;
    int rc = get_short_string(r, "encoding_format", text, sizeof text, &len, what, err);
    if (rc != 0) {
        return rc;
    }
    if (len == 5 && memcmp(text, "float", 5) == 0) {
        *out = API_ENCODING_FLOAT;
    } else if (len == 6 && memcmp(text, "base64", 6) == 0) {
        *out = API_ENCODING_BASE64;
    } else {
        return fail(err, ERROR_INVALID_REQUEST, "encoding_format", "encoding_format: expected %s",
                    what);
    }
    return 0;
}

/* "binary_output": true answers with the binary tensor extension; encoding_format says how
 * tensors go into JSON, so the two together contradict each other. Applied once the body is
 * read (fields come in any order). */
static int apply_binary_output(bool binary_output, uint32_t seen, int encoding_bit,
                               enum api_encoding *enc, struct api_error *err) {
    if (binary_output && ((seen >> encoding_bit) & 1u)) {
        return fail(err, ERROR_INVALID_REQUEST, "encoding_format",
                    "encoding_format: not with binary_output (its tensors are raw float32 after "
                    "the JSON)");
    }
    if (binary_output) {
        *enc = API_ENCODING_BINARY;
    }
    return 0;
}

/* ---- tensors -------------------------------------------------------------------------------- */

/* What a tensor field must look like: its rank, and per dim either a required size or -1. */
struct tensor_spec {
    const char *name; /* the field, for errors */
    const char *doc;  /* its shape in words, e.g. "(T, hidden_size)" */
    int rank;         /* 1..4: its rank, or the highest it may have */
    int64_t want[4];  /* required size per dim, or -1 for any */
    int min_rank;     /* 0, or the lowest rank it may have (a leading batch dimension is
                       * optional); want[] then applies to the dims as read */
};

/* "rank 3" or "rank 3 or 4", for messages. */
static const char *rank_words(const struct tensor_spec *s, char *buf, size_t size) {
    if (s->min_rank > 0 && s->min_rank < s->rank) {
        snprintf(buf, size, "rank %d to %d", s->min_rank, s->rank);
    } else {
        snprintf(buf, size, "rank %d", s->rank);
    }
    return buf;
}

/* A JSON number as the float32 it rounds to (to nearest), or false where that is infinite:
 * magnitudes up to FLT_MAX plus half its unit in the last place (2^103) round to FLT_MAX, so
 * FLT_MAX printed with 9 digits (3.40282347e+38, a little above it) reads back as itself. */
static bool to_float32(double d, float *out) {
    static const double rounds_to_inf = (double)FLT_MAX + 0x1p103;
    if (!isfinite(d) || fabs(d) >= rounds_to_inf) {
        return false;
    }
    *out = fabs(d) <= FLT_MAX ? (float)d : d > 0 ? FLT_MAX : -FLT_MAX;
    return true;
}

static int check_value(double d, const struct tensor_spec *s, int64_t flat, struct api_error *err,
                       float *out) {
    if (!to_float32(d, out)) {
        return fail(err, ERROR_INVALID_REQUEST, s->name,
                    "%s: value %lld (row-major) is not a finite float32 number", s->name,
                    (long long)flat);
    }
    return 0;
}

/* Checks one dimension's size against the spec: empty, required size, and the total cap given
 * the dims before it (product_before). */
static int check_dim(const struct tensor_spec *s, int d, int64_t size, int64_t product_before,
                     struct api_error *err) {
    if (size < 1) {
        return fail(err, ERROR_INVALID_REQUEST, s->name, "%s: dimension %d is empty", s->name, d);
    }
    if (s->want[d] >= 0 && size != s->want[d]) {
        return fail(err, ERROR_INVALID_REQUEST, s->name,
                    "%s: dimension %d is %lld, expected %lld for shape %s", s->name, d,
                    (long long)size, (long long)s->want[d], s->doc);
    }
    if (size > MAX_TENSOR_VALUES / product_before) {
        return fail(err, ERROR_INVALID_REQUEST, s->name, "%s: too many values", s->name);
    }
    return 0;
}

/* A float buffer that grows as numbers arrive, so its size follows what was parsed. */
struct floats {
    float *data;
    int64_t n, cap;
};

static int floats_push(struct floats *f, float v) {
    if (f->n == f->cap) {
        int64_t cap = f->cap > 0 ? f->cap * 2 : TENSOR_FIRST_VALUES;
        if (cap > MAX_TENSOR_VALUES) {
            cap = MAX_TENSOR_VALUES;
        }
        if (f->n == cap) {
            return -1;
        }
        float *p = realloc(f->data, (size_t)cap * sizeof *p);
        if (p == NULL) {
            return -2;
        }
        f->data = p;
        f->cap = cap;
    }
    f->data[f->n++] = v;
    return 0;
}

/* Hands over the values with no spare capacity (so that what a request holds is what it
 * parsed). */
static float *floats_take(struct floats *f) {
    float *p = f->n < f->cap ? realloc(f->data, (size_t)f->n * sizeof *p) : f->data;
    p = p != NULL ? p : f->data;
    f->data = NULL;
    return p;
}

/* Nested arrays of rank s->rank, read straight into floats. Each dimension's size is fixed by
 * its first complete array and every later one must match; a row longer than that, a number
 * where an array belongs or the reverse is refused the moment it is read, so a ragged body
 * never makes the parser allocate more than what it has read. A spec with a range of ranks
 * takes the rank from the depth of the first number. */
static int parse_nested(struct json_reader *r, const struct tensor_spec *s, float **out,
                        int64_t *dims, int *rank_out, struct api_error *err) {
    char ranks[32];
    rank_words(s, ranks, sizeof ranks);
    int64_t count[4] = {0, 0, 0, 0};
    bool is_known[4] = {false, false, false, false};
    struct floats f = {NULL, 0, 0};
    int depth = 0, rc = 0;
    int rank = s->min_rank > 0 && s->min_rank < s->rank ? 0 : s->rank; /* 0: not known yet */
    if (json_array_begin(r) != 0) {
        return syntax_error(r, err);
    }
    for (;;) {
        int more = json_array_next(r);
        if (more < 0) {
            rc = syntax_error(r, err);
            break;
        }
        if (more == 0) {
            /* An array of this depth closed: its length is the dimension, or must equal it. */
            if (!is_known[depth]) {
                /* The total is capped as values arrive (floats_push), so each dimension is
                 * checked on its own here. */
                rc = check_dim(s, depth, count[depth], 1, err);
                if (rc != 0) {
                    break;
                }
                dims[depth] = count[depth];
                is_known[depth] = true;
            } else if (count[depth] != dims[depth]) {
                rc = fail(err, ERROR_INVALID_REQUEST, s->name,
                          "%s: ragged: an array at depth %d has %lld values, the first had %lld",
                          s->name, depth, (long long)count[depth], (long long)dims[depth]);
                break;
            }
            if (depth == 0) {
                break;
            }
            depth--;
            continue;
        }
        count[depth]++;
        if ((is_known[depth] && count[depth] > dims[depth]) ||
            (s->want[depth] >= 0 && count[depth] > s->want[depth])) {
            int64_t want = is_known[depth] ? dims[depth] : s->want[depth];
            rc = fail(err, ERROR_INVALID_REQUEST, s->name,
                      "%s: an array at depth %d has more than %lld values (shape %s)", s->name,
                      depth, (long long)want, s->doc);
            break;
        }
        enum json_type t = json_peek(r);
        if (rank == 0 && t == JSON_TYPE_NUMBER && depth + 1 >= s->min_rank) {
            rank = depth + 1;
        }
        if (depth < (rank != 0 ? rank : s->rank) - 1) {
            if (t != JSON_TYPE_ARRAY) {
                rc = t == JSON_TYPE_INVALID ? wrong_type(r, s->name, "", err)
                                            : fail(err, ERROR_INVALID_REQUEST, s->name,
                                                   "%s: expected nested arrays of %s %s, or a "
                                                   "base64 object",
                                                   s->name, ranks, s->doc);
                break;
            }
            json_array_begin(r);
            depth++;
            count[depth] = 0;
            continue;
        }
        if (t != JSON_TYPE_NUMBER) {
            rc = t == JSON_TYPE_INVALID ? wrong_type(r, s->name, "", err)
                 : t == JSON_TYPE_ARRAY
                     ? fail(err, ERROR_INVALID_REQUEST, s->name,
                            "%s: expected %s %s, got deeper nesting", s->name, ranks, s->doc)
                     : fail(err, ERROR_INVALID_REQUEST, s->name,
                            "%s: value %lld (row-major) is not a number", s->name, (long long)f.n);
            break;
        }
        double d;
        float v = 0.0f;
        if (json_read_number(r, &d) != 0) {
            rc = syntax_error(r, err);
            break;
        }
        rc = check_value(d, s, f.n, err, &v);
        if (rc != 0) {
            break;
        }
        int pushed = floats_push(&f, v);
        if (pushed != 0) {
            rc = pushed == -1
                     ? fail(err, ERROR_INVALID_REQUEST, s->name, "%s: too many values", s->name)
                     : out_of_memory(err, s->name);
            break;
        }
    }
    if (rc != 0) {
        free(f.data);
        return rc;
    }
    *out = floats_take(&f);
    *rank_out = rank;
    return 0;
}

/* {"shape": [...], "b64": "..."}: little-endian float32 bytes. The base64 text is decoded
 * straight from the body (it holds no escapes unless a client wrote some). */

/* Whether every one of n little-endian float32 values at raw is finite: one branch-free pass,
 * which vectorizes. */
static bool all_finite_le(const uint8_t *raw, int64_t n) {
    uint32_t any_not_finite = 0;
    for (int64_t i = 0; i < n; i++) {
        const uint8_t *p = raw + i * 4;
        uint32_t u =
            (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
        any_not_finite |= (u & 0x7f800000u) == 0x7f800000u;
    }
    return any_not_finite == 0;
}

/* Little-endian float32 bytes to host floats, each checked (check_value). */
static int floats_from_le(const uint8_t *raw, int64_t total, const struct tensor_spec *s,
                          float *data, struct api_error *err) {
    /* Branch-free passes (they vectorize: a 32-session binary batch spent 5% of the loop
     * thread's time here value by value), then, only if some value is not finite, the pass
     * below that names the first. */
    if (all_finite_le(raw, total)) {
        for (int64_t i = 0; i < total; i++) {
            const uint8_t *p = raw + i * 4;
            uint32_t u =
                (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
            memcpy(&data[i], &u, 4);
        }
        return 0;
    }
    int rc = 0;
    for (int64_t i = 0; rc == 0 && i < total; i++) {
        const uint8_t *p = raw + i * 4;
        uint32_t u =
            (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
        float v;
        memcpy(&v, &u, 4);
        rc = check_value((double)v, s, i, err, &data[i]);
    }
    return rc;
}

/* A tensor object's datatype, when given: only "FP32" (the binary extension's name for what
 * every tensor here is). */
static int get_datatype(struct json_reader *r, const struct tensor_spec *s, struct api_error *err) {
    char text[8];
    size_t len;
    int rc = get_short_string(r, s->name, text, sizeof text, &len, "\"FP32\"", err);
    if (rc == 0 && !(len == 4 && memcmp(text, "FP32", 4) == 0)) {
        rc = fail(err, ERROR_INVALID_REQUEST, s->name, "%s: datatype must be \"FP32\"", s->name);
    }
    return rc;
}

/* The next n bytes of a framed body's raw part, for a tensor declaring binary_data_size n. */
static int take_binary(struct json_reader *r, const struct tensor_spec *s, size_t n,
                       const uint8_t **out, struct api_error *err) {
    struct body_reader *br = body_of(r);
    if (br->binary == NULL) {
        return fail(err, ERROR_INVALID_REQUEST, s->name,
                    "%s: binary_data_size needs the binary tensor extension: the request header "
                    "Inference-Header-Content-Length giving the JSON's length, the raw bytes after "
                    "it",
                    s->name);
    }
    if (n > br->binary_len - br->binary_used) {
        return fail(err, ERROR_INVALID_REQUEST, s->name,
                    "%s: binary_data_size %zu runs past the body's binary part (%zu bytes left)",
                    s->name, n, br->binary_len - br->binary_used);
    }
    *out = br->binary + br->binary_used;
    br->binary_used += n;
    return 0;
}

/* A tensor object whose shape is missing or wrong: what is wrong, and what one looks like. */
static int tensor_object_error(const struct tensor_spec *s, const char *what,
                               struct api_error *err) {
    char ranks[32];
    return fail(err, ERROR_INVALID_REQUEST, s->name,
                "%s: %s; a tensor object is {\"shape\": [the %s sizes %s], \"b64\": \"...\"} "
                "or, with the binary tensor extension, {\"shape\": [...], \"binary_data_size\": "
                "bytes}",
                s->name, what, rank_words(s, ranks, sizeof ranks), s->doc);
}

/* tensor_object_error, or the syntax error where the bytes are no JSON value at all. */
static int wrong_type_or(struct json_reader *r, const struct tensor_spec *s, const char *what,
                         struct api_error *err) {
    if (json_peek(r) == JSON_TYPE_INVALID) {
        json_read_null(r); /* records the syntax error at this byte */
        return syntax_error(r, err);
    }
    return tensor_object_error(s, what, err);
}

/* A tensor object's shape, checked as a nested array's would be once its rank is known (the
 * rank first: [1, 1, 64] for a (T, hidden) tensor is a rank mistake, not a size one). */
static int read_shape(struct json_reader *r, const struct tensor_spec *s, int64_t *dims,
                      int *rank_out, struct api_error *err) {
    if (json_peek(r) != JSON_TYPE_ARRAY) {
        return wrong_type_or(r, s, "shape is not an array of sizes", err);
    }
    json_array_begin(r);
    int d = 0, more;
    while ((more = json_array_next(r)) == 1) {
        double v;
        if (json_peek(r) != JSON_TYPE_NUMBER) {
            return wrong_type_or(r, s, "shape holds something other than a number", err);
        }
        if (json_read_number(r, &v) != 0) {
            return syntax_error(r, err);
        }
        if (d == s->rank) {
            char what[64];
            snprintf(what, sizeof what, "shape has more than %d sizes", s->rank);
            return tensor_object_error(s, what, err);
        }
        if (v != floor(v) || v < 0) {
            char what[64];
            snprintf(what, sizeof what, "shape[%d] is %.17g, not a size", d, v);
            return tensor_object_error(s, what, err);
        }
        /* past the cap, one more than it: check_dim names it once the rank is known */
        dims[d++] = v > (double)MAX_TENSOR_VALUES ? MAX_TENSOR_VALUES + 1 : (int64_t)v;
    }
    if (more < 0) {
        return syntax_error(r, err);
    }
    int min = s->min_rank > 0 ? s->min_rank : s->rank;
    if (d < min) {
        char what[64];
        snprintf(what, sizeof what, "shape has %d size%s", d, d == 1 ? "" : "s");
        return tensor_object_error(s, what, err);
    }
    int64_t product = 1;
    for (int i = 0; i < d; i++) {
        int rc = check_dim(s, i, dims[i], product, err);
        if (rc != 0) {
            return rc;
        }
        product *= dims[i];
    }
    *rank_out = d;
    return 0;
}

static int parse_b64(struct json_reader *r, const struct tensor_spec *s, float **out, int64_t *dims,
                     int *rank_out, struct api_error *err) {
    static const char *const names[] = {"shape", "b64", "binary_data_size", "datatype"};
    int rank = s->rank;
    struct json_span text = {NULL, 0, false};
    bool has_shape = false;
    int64_t binary_size = -1;
    uint32_t seen = 0;
    int index, rc;
    json_object_begin(r);
    while ((rc = next_field(r, names, 4, &seen, &index, err)) == 1) {
        if (index == 2) {
            rc = get_int(r, s->name, 0, INT64_MAX / 2, &binary_size, err);
            if (rc != 0) {
                return rc;
            }
            continue;
        }
        if (index == 3) {
            rc = get_datatype(r, s, err);
            if (rc != 0) {
                return rc;
            }
            continue;
        }
        if (index == 1) {
            if (json_peek(r) != JSON_TYPE_STRING) {
                return wrong_type(r, s->name, "b64 as a string", err);
            }
            if (json_read_string(r, &text) != 0) {
                return syntax_error(r, err);
            }
            continue;
        }
        if ((rc = read_shape(r, s, dims, &rank, err)) != 0) {
            return rc;
        }
        has_shape = true;
    }
    if (rc != 0) {
        /* A stranger inside the tensor object is about the tensor: name the tensor field. */
        if (rc == ERROR_INVALID_REQUEST) {
            return fail(err, ERROR_INVALID_REQUEST, s->name,
                        "%s: a tensor object has the fields shape and b64, or shape and "
                        "binary_data_size (and datatype \"FP32\")",
                        s->name);
        }
        return rc;
    }
    if (!has_shape || (text.text == NULL) == (binary_size < 0)) {
        return tensor_object_error(s,
                                   !has_shape          ? "no shape"
                                   : text.text == NULL ? "neither b64 nor binary_data_size"
                                                       : "both b64 and binary_data_size",
                                   err);
    }
    int64_t total = 1;
    for (int d = 0; d < rank; d++) {
        total *= dims[d];
    }
    size_t bytes = (size_t)total * 4;
    if (binary_size >= 0) {
        const uint8_t *raw = NULL;
        if ((size_t)binary_size != bytes) {
            return fail(err, ERROR_INVALID_REQUEST, s->name,
                        "%s: binary_data_size must be 4 * prod(shape) = %zu bytes of float32",
                        s->name, bytes);
        }
        rc = take_binary(r, s, bytes, &raw, err);
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
        if (rc == 0 && body_of(r)->may_borrow && (uintptr_t)raw % _Alignof(float) == 0 &&
            all_finite_le(raw, total)) {
            /* read where it lies: the body outlives the request (a non-finite value takes the
             * copying path below, which names it) */
            *out = (float *)(uintptr_t)raw;
            *rank_out = rank;
            return 0;
        }
#endif
        float *data = rc == 0 ? malloc(bytes > 0 ? bytes : 1) : NULL;
        if (rc == 0 && data == NULL) {
            rc = out_of_memory(err, s->name);
        }
        if (rc == 0) {
            rc = floats_from_le(raw, total, s, data, err);
        }
        if (rc != 0) {
            free(data);
            return rc;
        }
        *out = data;
        *rank_out = rank;
        return 0;
    }
    char *unescaped = NULL;
    const char *b64 = text.text;
    size_t len = text.len;
    if (text.has_escapes) {
        unescaped = malloc(text.len);
        if (unescaped == NULL) {
            return out_of_memory(err, s->name);
        }
        len = json_span_decode(&text, unescaped, text.len, NULL);
        b64 = unescaped;
    }
    rc = 0;
    if (len != b64_encoded_len(bytes) || b64_decoded_len(b64, len) != bytes) {
        rc = fail(err, ERROR_INVALID_REQUEST, s->name,
                  "%s: b64 must hold exactly 4 * prod(shape) = %zu bytes of float32", s->name,
                  bytes);
    }
    float *data = rc == 0 ? malloc(bytes) : NULL;
    if (rc == 0 && data == NULL) {
        rc = out_of_memory(err, s->name);
    }
    if (rc == 0 && b64_decode(b64, len, (uint8_t *)data) != 0) {
        rc = fail(err, ERROR_INVALID_REQUEST, s->name, "%s: b64 is not valid base64", s->name);
    }
    free(unescaped);
    /* Little-endian float32 to host order, in place (byte i*4 is read before value i is
     * written). */
    if (rc == 0) {
        rc = floats_from_le((const uint8_t *)data, total, s, data, err);
    }
    if (rc != 0) {
        free(data);
        return rc;
    }
    *out = data;
    *rank_out = rank;
    return 0;
}

/* Parses a tensor field (nested arrays or a base64 object) into a malloc'd array; dims gets its
 * shape. */
static int parse_tensor(struct json_reader *r, const struct tensor_spec *s, float **out,
                        int64_t *dims, int *rank_out, struct api_error *err) {
    char ranks[32];
    int rank = 0;
    int rc;
    switch (json_peek(r)) {
    case JSON_TYPE_OBJECT:
        rc = parse_b64(r, s, out, dims, &rank, err);
        break;
    case JSON_TYPE_ARRAY:
        rc = parse_nested(r, s, out, dims, &rank, err);
        break;
    case JSON_TYPE_INVALID:
        return wrong_type(r, s->name, "", err);
    default:
        return fail(err, ERROR_INVALID_REQUEST, s->name,
                    "%s: expected nested arrays of %s %s, or a base64 object", s->name,
                    rank_words(s, ranks, sizeof ranks), s->doc);
    }
    if (rc == 0 && rank_out != NULL) {
        *rank_out = rank;
    }
    return rc;
}

/* ---- POST /v1/attend ------------------------------------------------------------------------ */

/* ---- return_weights as a selection, capture, head_mask --------------------------------------- */

/* Query heads a selection may name when the request's own count is not known yet. */
#define API_MAX_HEADS 4096

static int compare_int32(const void *a, const void *b) {
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    return (x > y) - (x < y);
}

/* Sorts a[0..n) and drops repeats; returns the new count. */
static int32_t sort_unique(int32_t *a, int32_t n) {
    qsort(a, (size_t)n, sizeof *a, compare_int32);
    int32_t m = 0;
    for (int32_t i = 0; i < n; i++) {
        if (m == 0 || a[i] != a[m - 1]) {
            a[m++] = a[i];
        }
    }
    return m;
}

/* An array of 1..max_n integers in [min, max]. */
static int parse_index_list(struct json_reader *r, const char *name, int64_t min, int64_t max,
                            int32_t max_n, int32_t **out, int32_t *n_out, struct api_error *err) {
    char what[96];
    snprintf(what, sizeof what, "an array of integers in [%lld, %lld], or null for all",
             (long long)min, (long long)max);
    if (json_peek(r) != JSON_TYPE_ARRAY) {
        return wrong_type(r, name, what, err);
    }
    /* grown as values come: the bound may be far above what a body holds */
    int32_t *a = NULL;
    json_array_begin(r);
    int32_t n = 0, cap = 0;
    int more, rc = 0;
    while (rc == 0 && (more = json_array_next(r)) == 1) {
        int64_t v;
        if (n == max_n) {
            rc =
                fail(err, ERROR_INVALID_REQUEST, name, "%s: more than %d values", name, (int)max_n);
        } else if ((rc = get_int(r, name, min, max, &v, err)) == 0) {
            if (n == cap) {
                cap = cap > 0 ? (cap > max_n / 2 ? max_n : 2 * cap) : 16;
                int32_t *grown = realloc(a, (size_t)cap * sizeof *a);
                if (grown == NULL) {
                    rc = out_of_memory(err, name);
                    break;
                }
                a = grown;
            }
            a[n++] = (int32_t)v;
        }
    }
    if (rc == 0 && more < 0) {
        rc = syntax_error(r, err);
    }
    if (rc == 0 && n == 0) {
        rc = fail(err, ERROR_INVALID_REQUEST, name, "%s: empty (null selects all)", name);
    }
    if (rc != 0) {
        free(a);
        return rc;
    }
    *out = a;
    *n_out = n;
    return 0;
}

/* One of names (a string field); *out its index. */
static int get_choice(struct json_reader *r, const char *name, const char *const *names, int n,
                      int *out, struct api_error *err) {
    char what[128] = "one of";
    for (int i = 0; i < n; i++) {
        size_t l = strlen(what);
        snprintf(what + l, sizeof what - l, "%s \"%s\"", i > 0 ? "," : "", names[i]);
    }
    char text[16];
    size_t len;
    int rc = get_short_string(r, name, text, sizeof text, &len, what, err);
    if (rc != 0) {
        return rc;
    }
    for (int i = 0; i < n; i++) {
        if (len == strlen(names[i]) && memcmp(text, names[i], len) == 0) {
            *out = i;
            return 0;
        }
    }
    return fail(err, ERROR_INVALID_REQUEST, name, "%s: expected %s", name, what);
}

/* keys: [start, end], each an integer (negative: from the end of the key axis) or null. */
static int parse_key_range(struct json_reader *r, int32_t max_seq, struct api_selection *sel,
                           struct api_error *err) {
    static const char name[] = "return_weights.keys";
    static const char what[] = "[start, end]: two integers or nulls (a half-open range)";
    if (json_peek(r) != JSON_TYPE_ARRAY) {
        return wrong_type(r, name, what, err);
    }
    json_array_begin(r);
    int32_t n = 0;
    int more, rc = 0;
    while (rc == 0 && (more = json_array_next(r)) == 1) {
        int64_t v = 0;
        bool is_null = take_null(r);
        if (n == 2) {
            rc = fail(err, ERROR_INVALID_REQUEST, name, "%s: expected %s", name, what);
        } else if (is_null || (rc = get_int(r, name, -(int64_t)max_seq, max_seq, &v, err)) == 0) {
            if (n == 0) {
                sel->has_key_start = !is_null;
                sel->key_start = (int32_t)v;
            } else {
                sel->has_key_end = !is_null;
                sel->key_end = (int32_t)v;
            }
            n++;
        }
    }
    if (rc == 0 && more < 0) {
        rc = syntax_error(r, err);
    }
    if (rc == 0 && n != 2) {
        rc = fail(err, ERROR_INVALID_REQUEST, name, "%s: expected %s", name, what);
    }
    return rc;
}

/* return_weights as an object: {heads, rows, keys, kind, reduce}, each optional. */
static int parse_selection(struct json_reader *r, int32_t n_heads, int32_t max_seq,
                           struct api_selection *sel, struct api_error *err) {
    static const char *const names[] = {"heads", "rows", "keys", "kind", "reduce"};
    static const char *const kinds[] = {"probs", "scores", "lse"};
    static const char *const reduces[] = {"none", "mean_heads", "max_heads"};
    uint32_t seen = 0;
    int index, rc, choice = 0;
    sel->is_set = true;
    json_object_begin(r);
    while ((rc = next_field(r, names, 5, &seen, &index, err)) == 1) {
        if (take_null(r)) {
            continue;
        }
        switch (index) {
        case 0:
            /* n_heads 0: not known yet (/v1/sdpa: q's shape may come later) */
            rc = parse_index_list(
                r, "return_weights.heads", n_heads > 0 ? -(int64_t)n_heads : -API_MAX_HEADS,
                n_heads > 0 ? n_heads - 1 : API_MAX_HEADS - 1,
                n_heads > 0 ? n_heads : API_MAX_HEADS, &sel->heads, &sel->n_heads, err);
            break;
        case 1:
            rc = parse_index_list(r, "return_weights.rows", -(int64_t)max_seq, max_seq - 1, max_seq,
                                  &sel->rows, &sel->n_rows, err);
            break;
        case 2:
            rc = parse_key_range(r, max_seq, sel, err);
            break;
        case 3:
            rc = get_choice(r, "return_weights.kind", kinds, 3, &choice, err);
            sel->kind = (attn_inspect_kind)choice;
            break;
        default:
            rc = get_choice(r, "return_weights.reduce", reduces, 3, &choice, err);
            sel->reduce = (attn_inspect_reduce)choice;
            break;
        }
        if (rc != 0) {
            return rc;
        }
    }
    return rc;
}

static void prepend(char *s, size_t size, const char *prefix, const char *sep);

/* return_weights: true, false, or a selection. */
static int parse_return_weights(struct json_reader *r, int32_t n_heads, int32_t max_seq, bool *flag,
                                struct api_selection *sel, struct api_error *err) {
    if (json_peek(r) == JSON_TYPE_OBJECT) {
        *flag = true;
        int rc = parse_selection(r, n_heads, max_seq, sel, err);
        if (rc != 0 && strncmp(err->param, "return_weights", 14) != 0) {
            /* next_field names a stranger or a repeat bare: say where it sits */
            prepend(err->param, sizeof err->param, "return_weights", ".");
            prepend(err->message, sizeof err->message, "return_weights", ": ");
        }
        return rc;
    }
    if (json_peek(r) != JSON_TYPE_BOOL) {
        return wrong_type(r, "return_weights", "true, false or a selection object", err);
    }
    return json_read_bool(r, flag) == 0 ? 0 : syntax_error(r, err);
}

/* capture: an array of distinct names among q, k, v and head_out. */
static int parse_capture(struct json_reader *r, uint32_t *out, struct api_error *err) {
    static const char *const names[] = {"q", "k", "v", "head_out"};
    if (json_peek(r) != JSON_TYPE_ARRAY) {
        return wrong_type(r, "capture", "an array of \"q\", \"k\", \"v\", \"head_out\"", err);
    }
    json_array_begin(r);
    int more, rc = 0, i = 0;
    while (rc == 0 && (more = json_array_next(r)) == 1) {
        if ((rc = get_choice(r, "capture", names, 4, &i, err)) == 0) {
            if (*out & (1u << i)) {
                rc = fail(err, ERROR_INVALID_REQUEST, "capture", "capture: \"%s\" appears twice",
                          names[i]);
            }
            *out |= 1u << i;
        }
    }
    if (rc == 0 && more < 0) {
        rc = syntax_error(r, err);
    }
    return rc;
}

int64_t api_selection_values(const struct api_selection *sel, int32_t n_heads) {
    int64_t h = sel->reduce != ATTN_REDUCE_NONE ? 1 : sel->heads != NULL ? sel->n_heads : n_heads;
    int64_t k = sel->kind == ATTN_INSPECT_LSE ? 1 : sel->n_keys;
    return h * sel->n_rows * k;
}

/* An lse is the log of a row's whole softmax denominator, over every key the row sees (what
 * probs = exp(scores - lse) needs); a part of the keys would be another quantity, so it is
 * refused rather than answered over all of them with the part echoed (found by an outside
 * audit). */
static int lse_of_part(struct api_error *err, const char *param, int64_t start, int64_t end,
                       int32_t n_keys) {
    return fail(err, ERROR_INVALID_REQUEST, param,
                "%s: [%lld, %lld) is a part of the %d keys; an lse is over all the keys a row "
                "sees (leave keys out)",
                param, (long long)start, (long long)end, (int)n_keys);
}

int api_selection_resolve(struct api_selection *sel, int32_t n_heads, int32_t n_rows,
                          int32_t n_keys, int64_t n_batch, struct api_error *err) {
    for (int32_t i = 0; i < sel->n_heads; i++) {
        int32_t v = sel->heads[i] < 0 ? sel->heads[i] + n_heads : sel->heads[i];
        if (v < 0 || v >= n_heads) {
            return fail(err, ERROR_INVALID_REQUEST, "return_weights.heads",
                        "return_weights.heads: %d is not one of the %d query heads",
                        (int)sel->heads[i], (int)n_heads);
        }
        sel->heads[i] = v;
    }
    if (sel->heads != NULL) {
        sel->n_heads = sort_unique(sel->heads, sel->n_heads);
    }
    if (sel->rows == NULL) {
        if ((sel->rows = malloc((size_t)n_rows * sizeof *sel->rows)) == NULL) {
            return out_of_memory(err, "return_weights");
        }
        for (int32_t i = 0; i < n_rows; i++) {
            sel->rows[i] = i;
        }
        sel->n_rows = n_rows;
    }
    for (int32_t i = 0; i < sel->n_rows; i++) {
        int32_t v = sel->rows[i] < 0 ? sel->rows[i] + n_rows : sel->rows[i];
        if (v < 0 || v >= n_rows) {
            return fail(err, ERROR_INVALID_REQUEST, "return_weights.rows",
                        "return_weights.rows: %d is outside this call's %d query rows",
                        (int)sel->rows[i], (int)n_rows);
        }
        sel->rows[i] = v;
    }
    sel->n_rows = sort_unique(sel->rows, sel->n_rows);
    int64_t start = sel->has_key_start ? sel->key_start : 0;
    int64_t end = sel->has_key_end ? sel->key_end : n_keys;
    start += start < 0 ? n_keys : 0;
    end += end < 0 ? n_keys : 0;
    if (start < 0 || end > n_keys || start > end) {
        return fail(err, ERROR_INVALID_REQUEST, "return_weights.keys",
                    "return_weights.keys: [%lld, %lld) is not a range of this call's %d keys",
                    (long long)start, (long long)end, (int)n_keys);
    }
    if (sel->kind == ATTN_INSPECT_LSE && (start != 0 || end != n_keys)) {
        return lse_of_part(err, "return_weights.keys", start, end, n_keys);
    }
    sel->key_first = (int32_t)start;
    sel->n_keys = (int32_t)(end - start);
    int64_t values = api_selection_values(sel, n_heads) * n_batch;
    if (values > API_WEIGHTS_MAX_VALUES) {
        return fail(err, ERROR_INVALID_REQUEST, "return_weights",
                    "return_weights: the selection holds %lld values, over the limit of %d",
                    (long long)values, API_WEIGHTS_MAX_VALUES);
    }
    return 0;
}

attn_inspect api_selection_inspect(const struct api_selection *sel, float *out) {
    return (attn_inspect){.kind = sel->kind,
                          .reduce = sel->reduce,
                          .heads = sel->heads,
                          .n_heads = sel->n_heads,
                          .rows = sel->rows,
                          .n_rows = sel->n_rows,
                          .key_first = sel->key_first,
                          .n_keys = sel->n_keys,
                          .out = out};
}

void api_selection_release(struct api_selection *sel) {
    free(sel->heads);
    free(sel->rows);
    memset(sel, 0, sizeof *sel);
}

/* Frees a tensor of r unless it lies in the body (borrowed). */
static void free_tensor(const struct api_attend_request *r, float *p) {
    uintptr_t a = (uintptr_t)p;
    if (a < r->borrowed_lo || a >= r->borrowed_hi) {
        free(p);
    }
}

void api_attend_request_release(struct api_attend_request *r) {
    for (int32_t i = 0; r->steps != NULL && i < r->n_steps; i++) {
        api_attend_request_release(&r->steps[i]);
    }
    api_selection_release(&r->sel);
    free_tensor(r, r->head_mask);
    free(r->steps);
    free_tensor(r, r->q);
    free_tensor(r, r->k);
    free_tensor(r, r->v);
    free_tensor(r, r->x);
    free(r->positions);
    free(r->key_mask);
    free_tensor(r, r->context);
    memset(r, 0, sizeof *r);
}

/* positions: integers in [0, max_seq), at most max_seq of them (their count is checked against
 * x's rows once both are read, since either may come first). */
static int parse_positions(struct json_reader *r, int32_t max_seq, int32_t **out, int32_t *n_out,
                           struct api_error *err) {
    static const char what[] = "an array of integers, one per token of x";
    if (json_peek(r) != JSON_TYPE_ARRAY) {
        return wrong_type(r, "positions", what, err);
    }
    json_array_begin(r);
    int32_t *pos = NULL;
    int32_t n = 0, cap = 0;
    int more, rc = 0;
    while ((more = json_array_next(r)) == 1) {
        double d;
        if (json_peek(r) != JSON_TYPE_NUMBER) {
            rc = json_peek(r) == JSON_TYPE_INVALID
                     ? wrong_type(r, "positions", what, err)
                     : fail(err, ERROR_INVALID_REQUEST, "positions",
                            "positions[%d]: expected a non-negative integer", (int)n);
            break;
        }
        if (json_read_number(r, &d) != 0) {
            rc = syntax_error(r, err);
            break;
        }
        if (!isfinite(d) || d != floor(d) || d < 0) {
            rc = fail(err, ERROR_INVALID_REQUEST, "positions",
                      "positions[%d]: expected a non-negative integer", (int)n);
            break;
        }
        if (d >= (double)max_seq) {
            rc = fail(err, ERROR_CONTEXT_LENGTH_EXCEEDED, "positions",
                      "positions[%d]: %.0f is past the model's maximum position %d", (int)n, d,
                      (int)max_seq - 1);
            break;
        }
        if (n == max_seq) {
            rc = fail(err, ERROR_INVALID_REQUEST, "positions",
                      "positions: more values than the maximum sequence length %d", (int)max_seq);
            break;
        }
        if (n == cap) {
            cap = cap > 0 ? (cap > max_seq / 2 ? max_seq : cap * 2) : 64;
            int32_t *p = realloc(pos, (size_t)cap * sizeof *p);
            if (p == NULL) {
                rc = out_of_memory(err, "positions");
                break;
            }
            pos = p;
        }
        pos[n++] = (int32_t)d;
    }
    if (rc == 0 && more < 0) {
        rc = syntax_error(r, err);
    }
    if (rc == 0 && n == 0) {
        /* never one per token (a call has at least one); an empty array left no list behind,
         * so every later check passed it as "no positions" (found by an outside audit) */
        rc = fail(err, ERROR_INVALID_REQUEST, "positions",
                  "positions: empty (one per token, or leave it out for the cache's order)");
    }
    if (rc != 0) {
        free(pos);
        return rc;
    }
    *out = pos;
    *n_out = n;
    return 0;
}

enum attend_field {
    ATTEND_X,
    ATTEND_SESSION_ID,
    ATTEND_LAYER,
    ATTEND_POSITIONS,
    ATTEND_EXPECT_N_PAST,
    ATTEND_RETURN_WEIGHTS,
    ATTEND_STREAM,
    ATTEND_ENCODING,
    ATTEND_KEY_MASK,
    ATTEND_CONTEXT,
    ATTEND_CROSS,
    ATTEND_REPLACE_CONTEXT,
    ATTEND_BINARY_OUTPUT,
    ATTEND_STEPS,
    ATTEND_Q,
    ATTEND_K,
    ATTEND_V,
    ATTEND_ROPE,
    ATTEND_CAPTURE,
    ATTEND_HEAD_MASK,
    ATTEND_N_FIELDS,
};

static const char *const attend_names[ATTEND_N_FIELDS] = {"x",
                                                          "session_id",
                                                          "layer",
                                                          "positions",
                                                          "expect_n_past",
                                                          "return_weights",
                                                          "stream",
                                                          "encoding_format",
                                                          "key_mask",
                                                          "context",
                                                          "cross",
                                                          "replace_context",
                                                          "binary_output",
                                                          "steps",
                                                          "q",
                                                          "k",
                                                          "v",
                                                          "rope",
                                                          "capture",
                                                          "head_mask"};

#define F(name) (1u << ATTEND_##name)

/* The fields of each route's request, of a batch's top level and of its steps. */
struct attend_route {
    const char *route;         /* for messages */
    uint32_t top, batch, step; /* the fields each may have */
    uint32_t required;         /* what a request (or a step) must have */
};

static const struct attend_route attend_route = {
    "POST /v1/attend",
    ~(F(Q) | F(K) | F(V) | F(ROPE)),
    F(LAYER) | F(STEPS) | F(ENCODING) | F(BINARY_OUTPUT),
    F(X) | F(SESSION_ID) | F(POSITIONS) | F(EXPECT_N_PAST) | F(RETURN_WEIGHTS) | F(CAPTURE) |
        F(HEAD_MASK),
    F(X),
};

static const struct attend_route kv_route = {
    "POST /v1/kv/attend",
    F(SESSION_ID) | F(LAYER) | F(Q) | F(K) | F(V) | F(POSITIONS) | F(EXPECT_N_PAST) |
        F(RETURN_WEIGHTS) | F(ROPE) | F(ENCODING) | F(BINARY_OUTPUT) | F(STEPS) | F(CAPTURE) |
        F(HEAD_MASK),
    F(LAYER) | F(STEPS) | F(ENCODING) | F(BINARY_OUTPUT) | F(ROPE),
    F(SESSION_ID) | F(Q) | F(K) | F(V) | F(POSITIONS) | F(EXPECT_N_PAST) | F(RETURN_WEIGHTS) |
        F(CAPTURE) | F(HEAD_MASK),
    F(Q) | F(K) | F(V), /* and a session_id, here or in X-Session-Id (job__attend_admit) */
};

/* One member of an attend body into r. */
/* A (tokens, hidden_size) tensor field of at most max_seq rows (x, a context). */
static int parse_token_rows(struct json_reader *jr, const struct api_limits *lim, const char *name,
                            const char *doc, float **out, int32_t *n_rows, struct api_error *err) {
    struct tensor_spec spec = {name, doc, 2, {-1, lim->hidden_size, -1, -1}, 0};
    int64_t dims[4];
    int rc = parse_tensor(jr, &spec, out, dims, NULL, err);
    if (rc == 0 && dims[0] > lim->max_seq) {
        rc = fail(err, ERROR_CONTEXT_LENGTH_EXCEEDED, name,
                  "%s: %lld tokens exceed the model's maximum sequence length %d", name,
                  (long long)dims[0], (int)lim->max_seq);
    }
    *n_rows = rc == 0 ? (int32_t)dims[0] : 0;
    return rc;
}

/* key_mask: one 0 or 1 per key of the session after this request (its length is checked when
 * the request runs, against the cache it meets), made bytes. */
static int parse_key_mask(struct json_reader *jr, const struct api_limits *lim,
                          struct api_attend_request *r, struct api_error *err) {
    struct tensor_spec spec = {"key_mask",
                               "(n_past + T): 1 = attend, 0 = never attend to that token",
                               1,
                               {-1, -1, -1, -1},
                               0};
    float *values = NULL;
    int64_t dims[4];
    int rc = parse_tensor(jr, &spec, &values, dims, NULL, err);
    if (rc == 0 && dims[0] > lim->max_seq) {
        rc = fail(err, ERROR_CONTEXT_LENGTH_EXCEEDED, "key_mask",
                  "key_mask: %lld keys exceed the model's maximum sequence length %d",
                  (long long)dims[0], (int)lim->max_seq);
    }
    if (rc == 0 && (r->key_mask = malloc((size_t)dims[0])) == NULL) {
        rc = out_of_memory(err, "key_mask");
    }
    for (int64_t i = 0; rc == 0 && i < dims[0]; i++) {
        if (values[i] != 0.0f && values[i] != 1.0f) {
            rc =
                fail(err, ERROR_INVALID_REQUEST, "key_mask",
                     "key_mask[%lld] is %.9g; 1 attends, 0 masks", (long long)i, (double)values[i]);
            break;
        }
        r->key_mask[i] = values[i] != 0.0f;
    }
    r->n_key_mask = rc == 0 ? (int32_t)dims[0] : 0;
    free(values);
    return rc;
}

static int parse_steps(struct json_reader *jr, const struct api_limits *lim,
                       const struct attend_route *route, struct api_attend_request *r,
                       struct api_error *err);

/* q (n_heads, T, head_dim), k or v (n_kv_heads, T, head_dim) of /v1/kv/attend; *t gets T. */
static int parse_heads(struct json_reader *jr, const struct api_limits *lim, const char *name,
                       float **out, int32_t *t, struct api_error *err) {
    bool is_q = name[0] == 'q';
    struct tensor_spec spec = {name,
                               is_q ? "(n_heads, T, head_dim)" : "(n_kv_heads, T, head_dim)",
                               3,
                               {is_q ? lim->n_heads : lim->n_kv_heads, -1, lim->head_dim, -1},
                               0};
    int64_t dims[4];
    int rc = parse_tensor(jr, &spec, out, dims, NULL, err);
    if (rc == 0 && dims[1] > lim->max_seq) {
        rc = fail(err, ERROR_CONTEXT_LENGTH_EXCEEDED, name,
                  "%s: %lld tokens exceed the model's maximum sequence length %d", name,
                  (long long)dims[1], (int)lim->max_seq);
    }
    *t = rc == 0 ? (int32_t)dims[1] : 0;
    return rc;
}

static int attend_field(struct json_reader *jr, int index, const struct api_limits *lim,
                        const struct attend_route *route, struct api_attend_request *r,
                        int32_t *n_positions, bool *binary_output, struct api_error *err) {
    if (!((route->required >> index) & 1u) && take_null(jr)) {
        return 0; /* every field but the required may be null: the same as leaving it out */
    }
    int64_t v;
    int rc;
    switch (index) {
    case ATTEND_X:
        return parse_token_rows(jr, lim, "x", "(T, hidden_size)", &r->x, &r->n_tokens, err);
    case ATTEND_SESSION_ID:
        return get_session_id(jr, "session_id", r->session_id, err);
    case ATTEND_LAYER:
        return get_layer(jr, lim, &r->layer, err);
    case ATTEND_POSITIONS:
        return parse_positions(jr, lim->max_seq, &r->positions, n_positions, err);
    case ATTEND_EXPECT_N_PAST:
        rc = get_int(jr, "expect_n_past", 0, INT32_MAX, &v, err);
        r->has_expect_n_past = rc == 0;
        r->expect_n_past = (int32_t)v;
        return rc;
    case ATTEND_RETURN_WEIGHTS:
        return parse_return_weights(jr, lim->n_heads, lim->max_seq, &r->return_weights, &r->sel,
                                    err);
    case ATTEND_CAPTURE:
        return parse_capture(jr, &r->capture, err);
    case ATTEND_HEAD_MASK: {
        struct tensor_spec spec = {"head_mask",
                                   "(n_heads): each head's output scale, 0 removes it",
                                   1,
                                   {lim->n_heads, -1, -1, -1},
                                   0};
        int64_t dims[4];
        return parse_tensor(jr, &spec, &r->head_mask, dims, NULL, err);
    }
    case ATTEND_STREAM:
        return get_bool(jr, "stream", &r->stream, err);
    case ATTEND_KEY_MASK:
        return parse_key_mask(jr, lim, r, err);
    case ATTEND_CONTEXT:
        return parse_token_rows(jr, lim, "context", "(S, hidden_size): the encoder states",
                                &r->context, &r->n_context, err);
    case ATTEND_CROSS:
        return get_bool(jr, "cross", &r->is_cross, err);
    case ATTEND_REPLACE_CONTEXT:
        return get_bool(jr, "replace_context", &r->replace_context, err);
    case ATTEND_BINARY_OUTPUT:
        return get_bool(jr, "binary_output", binary_output, err);
    case ATTEND_STEPS:
        return parse_steps(jr, lim, route, r, err);
    case ATTEND_Q:
        return parse_heads(jr, lim, "q", &r->q, &r->n_tokens, err);
    case ATTEND_K:
        return parse_heads(jr, lim, "k", &r->k, &r->k_tokens, err);
    case ATTEND_V:
        return parse_heads(jr, lim, "v", &r->v, &r->v_tokens, err);
    case ATTEND_ROPE:
        return get_bool(jr, "rope", &r->rope, err);
    default:
        return get_encoding(jr, &r->encoding, err);
    }
}

/* A cross-attention request: context means cross (and "cross": false with it contradicts), and
 * what belongs to the session's own tokens (positions, key_mask, expect_n_past) or to a token
 * at a time (stream) is refused with it; replace_context needs a context. */
static int check_cross(struct api_attend_request *r, uint32_t seen, struct api_error *err) {
    bool said_cross = (seen >> ATTEND_CROSS) & 1u;
    if (r->context != NULL && said_cross && !r->is_cross) {
        return fail(err, ERROR_INVALID_REQUEST, "cross",
                    "cross: false contradicts context (a context is attended across)");
    }
    r->is_cross = r->is_cross || r->context != NULL;
    if (r->replace_context && r->context == NULL) {
        return fail(err, ERROR_INVALID_REQUEST, "replace_context",
                    "replace_context: true needs the context that replaces the stored one");
    }
    if (!r->is_cross) {
        return 0;
    }
    if (r->capture & (API_CAPTURE_K | API_CAPTURE_V)) {
        return fail(err, ERROR_INVALID_REQUEST, "capture",
                    "capture: k and v are the context's in cross-attention, not this call's (q "
                    "and head_out are)");
    }
    static const char *const names[] = {"positions", "key_mask", "expect_n_past", "stream"};
    bool given[] = {r->positions != NULL, r->key_mask != NULL, r->has_expect_n_past, r->stream};
    for (int i = 0; i < 4; i++) {
        if (given[i]) {
            return fail(err, ERROR_INVALID_REQUEST, names[i],
                        "%s: not part of cross-attention (the queries see the whole context, "
                        "unrotated, and the session's own tokens are not touched)",
                        names[i]);
        }
    }
    return 0;
}

/* Puts prefix (and sep, if s is not empty) before the string s of a size-byte buffer, cutting
 * the end of s if it must. */
static void prepend(char *s, size_t size, const char *prefix, const char *sep) {
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

/* Rewrites a step's error so that it names the step: param "steps[i].x", message prefixed. */
static int step_error(int rc, int32_t i, struct api_error *err) {
    char prefix[24];
    snprintf(prefix, sizeof prefix, "steps[%d]", (int)i);
    prepend(err->param, sizeof err->param, prefix, ".");
    prepend(err->message, sizeof err->message, prefix, ": ");
    utf8_trim_partial(err->message);
    return rc;
}

/* A request's (or a step's) checks, once it is read: what its route requires is there, its
 * tensors agree on T, positions match it, its weights fit. */
static int check_step(const struct api_attend_request *st, uint32_t seen, int32_t n_positions,
                      const struct api_limits *lim, const struct attend_route *route,
                      struct api_error *err) {
    for (int i = 0; i < ATTEND_N_FIELDS; i++) {
        if (((route->required >> i) & 1u) && !((seen >> i) & 1u)) {
            return fail(err, ERROR_INVALID_REQUEST, attend_names[i], "%s: required",
                        attend_names[i]);
        }
    }
    if (st->q != NULL && (st->k_tokens != st->n_tokens || st->v_tokens != st->n_tokens)) {
        return fail(err, ERROR_INVALID_REQUEST, st->k_tokens != st->n_tokens ? "k" : "v",
                    "%s: %d tokens, q has %d (q, k and v are the same tokens' projections)",
                    st->k_tokens != st->n_tokens ? "k" : "v",
                    (int)(st->k_tokens != st->n_tokens ? st->k_tokens : st->v_tokens),
                    (int)st->n_tokens);
    }
    if (st->positions != NULL && n_positions != st->n_tokens) {
        return fail(err, ERROR_INVALID_REQUEST, "positions",
                    "positions: has %d values, expected %d (one per token of %s)", (int)n_positions,
                    (int)st->n_tokens, st->q != NULL ? "q" : "x");
    }
    /* the rows are the call's own: known now, so a step's wrong row fails the body before any
     * step runs (at run time it failed that step alone, after the others had advanced) */
    for (int32_t i = 0; st->sel.is_set && i < st->sel.n_rows; i++) {
        if (st->sel.rows[i] < -st->n_tokens || st->sel.rows[i] >= st->n_tokens) {
            return fail(err, ERROR_INVALID_REQUEST, "return_weights.rows",
                        "return_weights.rows: %d is outside this call's %d query rows",
                        (int)st->sel.rows[i], (int)st->n_tokens);
        }
    }
    if (st->return_weights && !st->sel.is_set && !st->is_cross &&
        (int64_t)lim->n_heads * st->n_tokens * st->n_tokens > API_WEIGHTS_MAX_VALUES) {
        return fail(err, ERROR_INVALID_REQUEST, "return_weights",
                    "return_weights: n_heads x T x T = %lld values exceed the limit of %d",
                    (long long)lim->n_heads * st->n_tokens * st->n_tokens, API_WEIGHTS_MAX_VALUES);
    }
    return 0;
}

/* The fields of one object of a route: the next field, refused if the route's mask lacks it. */
static int next_route_field(struct json_reader *jr, uint32_t allowed, const char *where,
                            uint32_t *seen, int *index, struct api_error *err) {
    int rc = next_field(jr, attend_names, ATTEND_N_FIELDS, seen, index, err);
    if (rc == 1 && !((allowed >> *index) & 1u)) {
        return fail(err, ERROR_INVALID_REQUEST, attend_names[*index], "%s: not a field of %s",
                    attend_names[*index], where);
    }
    return rc;
}

/* steps: an array of 1..API_MAX_STEPS objects, each a step (the route's step fields only). */
static int parse_steps(struct json_reader *jr, const struct api_limits *lim,
                       const struct attend_route *route, struct api_attend_request *r,
                       struct api_error *err) {
    if (json_peek(jr) != JSON_TYPE_ARRAY) {
        return wrong_type(jr, "steps", "an array of step objects", err);
    }
    /* grown as steps come (a whole API_MAX_STEPS was 90 KB zeroed for every batch call) */
    int32_t cap = 8;
    r->steps = calloc((size_t)cap, sizeof *r->steps);
    if (r->steps == NULL) {
        return out_of_memory(err, "steps");
    }
    char where[64];
    snprintf(where, sizeof where, "a step of %s", route->route);
    json_array_begin(jr);
    int more;
    while ((more = json_array_next(jr)) == 1) {
        int32_t i = r->n_steps;
        if (i == API_MAX_STEPS) {
            return fail(err, ERROR_INVALID_REQUEST, "steps", "steps: more than %d", API_MAX_STEPS);
        }
        if (i == cap) {
            int32_t grown = 2 * cap < API_MAX_STEPS ? 2 * cap : API_MAX_STEPS;
            struct api_attend_request *more_steps =
                realloc(r->steps, (size_t)grown * sizeof *r->steps);
            if (more_steps == NULL) {
                return out_of_memory(err, "steps");
            }
            memset(more_steps + cap, 0, (size_t)(grown - cap) * sizeof *more_steps);
            r->steps = more_steps;
            cap = grown;
        }
        if (json_peek(jr) != JSON_TYPE_OBJECT) {
            return step_error(wrong_type(jr, "", "a step object", err), i, err);
        }
        struct api_attend_request *st = &r->steps[i];
        r->n_steps++; /* counted now, so that release frees what a failed step holds */
        st->layer = lim->layer_first;
        st->borrowed_lo = r->borrowed_lo;
        st->borrowed_hi = r->borrowed_hi;
        int32_t n_positions = 0;
        uint32_t seen = 0;
        bool unused = false;
        int index, rc;
        json_object_begin(jr);
        while ((rc = next_route_field(jr, route->step, where, &seen, &index, err)) == 1) {
            rc = attend_field(jr, index, lim, route, st, &n_positions, &unused, err);
            if (rc != 0) {
                break;
            }
        }
        if (rc == 0) {
            rc = check_step(st, seen, n_positions, lim, route, err);
        }
        if (rc == 0 && st->q != NULL && st->session_id[0] == '\0') {
            /* as a call alone: q/k/v append to a session's cache, there is no stateless form */
            rc = fail(err, ERROR_INVALID_REQUEST, "session_id", "session_id: required");
        }
        for (int32_t j = 0; rc == 0 && st->session_id[0] && j < i; j++) {
            if (strcmp(r->steps[j].session_id, st->session_id) == 0) {
                rc = fail(err, ERROR_INVALID_REQUEST, "session_id",
                          "session_id: %s is steps[%d]'s too (one step per session a call)",
                          st->session_id, (int)j);
            }
        }
        if (rc != 0) {
            return step_error(rc, i, err);
        }
    }
    if (more < 0) {
        return syntax_error(jr, err);
    }
    if (r->n_steps == 0) {
        return fail(err, ERROR_INVALID_REQUEST, "steps", "steps: at least one step");
    }
    return 0;
}

/* A batch: the top level has only what every step shares; each step gets it. */
static int check_batch(struct api_attend_request *r, uint32_t seen,
                       const struct attend_route *route, struct api_error *err) {
    for (int i = 0; i < ATTEND_N_FIELDS; i++) {
        if (((seen >> i) & 1u) && !((route->batch >> i) & 1u)) {
            /* a step field goes in each step; others (stream, key_mask...) a batch has not */
            return fail(err, ERROR_INVALID_REQUEST, attend_names[i],
                        ((route->step >> i) & 1u)
                            ? "%s: not with steps (each step has its own; a batch's top level "
                              "has only what all share)"
                            : "%s: not with steps (a call with steps has no such field, at its "
                              "top level or in a step)",
                        attend_names[i]);
        }
    }
    for (int32_t i = 0; i < r->n_steps; i++) {
        r->steps[i].layer = r->layer;
        r->steps[i].encoding = r->encoding;
        r->steps[i].rope = r->rope;
    }
    return 0;
}

/* q/k/v the caller rotated (no "rope": true) take no positions: none would enter the attention,
 * so a forgotten "rope" must not pass as a rotated answer. */
static int check_rope_positions(const struct api_attend_request *r, struct api_error *err) {
    if (r->q != NULL && r->positions != NULL && !r->rope) {
        return fail(err, ERROR_INVALID_REQUEST, "positions",
                    "positions: only with \"rope\": true (q and k are taken as rotated already, "
                    "so no position would enter the attention)");
    }
    return 0;
}

static int parse_attend(const struct api_body *body, const struct api_limits *lim,
                        const struct attend_route *route, struct api_attend_request *out,
                        struct api_error *err) {
    memset(out, 0, sizeof *out);
    struct api_attend_request r;
    memset(&r, 0, sizeof r);
    r.layer = lim->layer_first;
    if (body->may_borrow && body->binary != NULL) {
        r.borrowed_lo = (uintptr_t)body->binary;
        r.borrowed_hi = (uintptr_t)body->binary + body->binary_len;
    }
    struct body_reader br;
    int32_t n_positions = 0;
    uint32_t seen = 0;
    bool binary_output = false;
    int index;
    int rc = begin_framed(&br, body, err);
    while (rc == 0 &&
           (rc = next_route_field(&br.json, route->top, route->route, &seen, &index, err)) == 1) {
        rc = attend_field(&br.json, index, lim, route, &r, &n_positions, &binary_output, err);
    }
    if (rc == 0) {
        rc = end_body(&br.json, err);
    }
    if (rc == 0) {
        rc = apply_binary_output(binary_output, seen, ATTEND_ENCODING, &r.encoding, err);
    }
    if (rc == 0 && r.steps != NULL) {
        rc = check_batch(&r, seen, route, err);
        for (int32_t i = 0; rc == 0 && i < r.n_steps; i++) {
            if ((rc = check_rope_positions(&r.steps[i], err)) != 0) {
                rc = step_error(rc, i, err);
            }
        }
    } else if (rc == 0) {
        rc = check_rope_positions(&r, err);
    }
    if (rc == 0 && r.steps == NULL) {
        rc = check_step(&r, seen, n_positions, lim, route, err);
        if (rc == 0) {
            rc = check_cross(&r, seen, err);
        }
        if (rc == 0 && r.encoding == API_ENCODING_BINARY && r.stream) {
            rc = fail(err, ERROR_INVALID_REQUEST, "binary_output",
                      "binary_output: not with stream (stream events are text)");
        }
        const char *per_call = r.sel.is_set     ? "return_weights"
                               : r.capture != 0 ? "capture"
                               : r.head_mask    ? "head_mask"
                                                : NULL;
        if (rc == 0 && r.stream && per_call != NULL) {
            rc = fail(err, ERROR_INVALID_REQUEST, per_call,
                      "%s: not with stream (%s); send the tokens in one call", per_call,
                      r.sel.is_set ? "a stream's weights are every probability of each token"
                                   : "it applies to a whole call");
        }
    }
    if (rc != 0) {
        api_attend_request_release(&r);
        return rc;
    }
    *out = r;
    return 0;
}

int api_attend_request_parse(const char *body, size_t len, const struct api_limits *lim,
                             struct api_attend_request *out, struct api_error *err) {
    struct api_body b = {body, len, NULL, 0, false};
    return api_attend_request_parse_body(&b, lim, out, err);
}

int api_attend_request_parse_body(const struct api_body *body, const struct api_limits *lim,
                                  struct api_attend_request *out, struct api_error *err) {
    return parse_attend(body, lim, &attend_route, out, err);
}

int api_kv_attend_request_parse_body(const struct api_body *body, const struct api_limits *lim,
                                     struct api_attend_request *out, struct api_error *err) {
    return parse_attend(body, lim, &kv_route, out, err);
}

/* ---- POST /v1/sdpa -------------------------------------------------------------------------- */

void api_sdpa_request_release(struct api_sdpa_request *r) {
    api_selection_release(&r->sel);
    free(r->q);
    free(r->k);
    free(r->v);
    free(r->mask);
    memset(r, 0, sizeof *r);
}

enum sdpa_field {
    SDPA_Q,
    SDPA_K,
    SDPA_V,
    SDPA_CAUSAL,
    SDPA_WINDOW,
    SDPA_SCALE,
    SDPA_RETURN_WEIGHTS,
    SDPA_ENCODING,
    SDPA_MASK,
    SDPA_KIND,
    SDPA_BINARY_OUTPUT,
    SDPA_N_FIELDS,
};

static const char *const sdpa_names[SDPA_N_FIELDS] = {"q",
                                                      "k",
                                                      "v",
                                                      "causal",
                                                      "window",
                                                      "scale",
                                                      "return_weights",
                                                      "encoding_format",
                                                      "mask",
                                                      "kind",
                                                      "binary_output"};

/* The shapes read for q, k, v and mask, checked against each other once all are in. */
struct sdpa_dims {
    int64_t q[4], k[4], v[4], m[4];
    int q_rank, k_rank, v_rank, mask_rank;
    float *mask; /* as parsed, until it is checked and made bytes */
};

static int get_scale(struct json_reader *jr, float *out, struct api_error *err) {
    double d;
    if (json_peek(jr) != JSON_TYPE_NUMBER) {
        return wrong_type(jr, "scale", "a finite number > 0", err);
    }
    if (json_read_number(jr, &d) != 0) {
        return syntax_error(jr, err);
    }
    if (d <= 0 || !to_float32(d, out)) {
        return fail(err, ERROR_INVALID_REQUEST, "scale", "scale: expected a finite number > 0");
    }
    if (*out == 0.0f) {
        return fail(err, ERROR_INVALID_REQUEST, "scale", "scale: too small for float32");
    }
    return 0;
}

/* "softmax" (the default) or "linear". */
static int get_kind(struct json_reader *r, bool *is_linear, struct api_error *err) {
    static const char what[] = "\"softmax\" or \"linear\"";
    char text[8];
    size_t len;
    int rc = get_short_string(r, "kind", text, sizeof text, &len, what, err);
    if (rc != 0) {
        return rc;
    }
    if ((len == 7 && memcmp(text, "softmax", 7) == 0) ||
        (len == 6 && memcmp(text, "linear", 6) == 0)) {
        *is_linear = len == 6;
        return 0;
    }
    return fail(err, ERROR_INVALID_REQUEST, "kind", "kind: expected %s", what);
}

static int sdpa_field(struct json_reader *jr, int index, struct api_sdpa_request *r,
                      struct sdpa_dims *dims, bool *binary_output, struct api_error *err) {
    static const struct tensor_spec specs[4] = {
        {"q", "(H, Tq, dk) or (B, H, Tq, dk)", 4, {-1, -1, -1, -1}, 3},
        {"k", "(Hkv, Tk, dk) or (B, Hkv, Tk, dk)", 4, {-1, -1, -1, -1}, 3},
        {"v", "(Hkv, Tk, dv) or (B, Hkv, Tk, dv)", 4, {-1, -1, -1, -1}, 3},
        {"mask",
         "(Tq, Tk) or (B, Tq, Tk), 1 = attend, 0 = masked, a dimension of 1 broadcast",
         3,
         {-1, -1, -1, -1},
         2},
    };
    if (index > SDPA_V && take_null(jr)) {
        return 0;
    }
    int64_t v;
    int rc;
    switch (index) {
    case SDPA_Q:
        return parse_tensor(jr, &specs[0], &r->q, dims->q, &dims->q_rank, err);
    case SDPA_K:
        return parse_tensor(jr, &specs[1], &r->k, dims->k, &dims->k_rank, err);
    case SDPA_V:
        return parse_tensor(jr, &specs[2], &r->v, dims->v, &dims->v_rank, err);
    case SDPA_MASK:
        return parse_tensor(jr, &specs[3], &dims->mask, dims->m, &dims->mask_rank, err);
    case SDPA_KIND:
        return get_kind(jr, &r->is_linear, err);
    case SDPA_BINARY_OUTPUT:
        return get_bool(jr, "binary_output", binary_output, err);
    case SDPA_CAUSAL:
        return get_bool(jr, "causal", &r->causal, err);
    case SDPA_WINDOW:
        rc = get_int(jr, "window", 0, INT32_MAX, &v, err);
        r->window = rc == 0 ? (int32_t)v : -1;
        return rc;
    case SDPA_SCALE:
        return get_scale(jr, &r->scale, err);
    case SDPA_RETURN_WEIGHTS:
        /* the query rows' bound: n_heads x n_q is at most 2^24 (attn_sdpa's limit) */
        return parse_return_weights(jr, 0, 1 << 24, &r->return_weights, &r->sel, err);
    default:
        return get_encoding(jr, &r->encoding, err);
    }
}

/* mask (as floats, the seeds' booleans) against the shapes: each dimension the batch, query or
 * key count, or 1 to broadcast (the key one never), every value 0 or 1; made bytes in r. */
static int sdpa_mask(struct api_sdpa_request *r, struct sdpa_dims *d, struct api_error *err) {
    int rank = d->mask_rank;
    int64_t b = rank == 3 ? d->m[0] : 1, tq = d->m[rank - 2], tk = d->m[rank - 1];
    if (rank == 3 && b != 1 && b != r->n_batch) {
        return r->n_batch == 1
                   ? fail(err, ERROR_INVALID_REQUEST, "mask",
                          "mask: dimension 0 is %lld, expected 1 (the batch) for shape (B, Tq, Tk)",
                          (long long)b)
                   : fail(err, ERROR_INVALID_REQUEST, "mask",
                          "mask: dimension 0 is %lld, expected the batch %d or 1 for shape (B, Tq, "
                          "Tk)",
                          (long long)b, (int)r->n_batch);
    }
    if (tq != 1 && tq != r->n_q) {
        return fail(err, ERROR_INVALID_REQUEST, "mask",
                    "mask: dimension %d is %lld, expected Tq = %d or 1", rank - 2, (long long)tq,
                    (int)r->n_q);
    }
    if (tk != r->n_k) {
        return fail(err, ERROR_INVALID_REQUEST, "mask",
                    "mask: dimension %d is %lld, expected Tk = %d", rank - 1, (long long)tk,
                    (int)r->n_k);
    }
    size_t n = (size_t)(b * tq * tk);
    r->mask = malloc(n);
    if (r->mask == NULL) {
        return out_of_memory(err, "mask");
    }
    for (size_t i = 0; i < n; i++) {
        if (d->mask[i] != 0.0f && d->mask[i] != 1.0f) {
            return fail(err, ERROR_INVALID_REQUEST, "mask",
                        "mask: value %zu (row-major) is %.9g; 1 attends, 0 masks", i,
                        (double)d->mask[i]);
        }
        r->mask[i] = d->mask[i] != 0.0f;
    }
    r->mask_batch_stride = b == 1 ? 0 : (size_t)(tq * tk);
    r->mask_ld = tq == 1 ? 0 : (size_t)tk;
    return 0;
}

/* q, k and v against each other, in the order a reader of the shapes would check them; then
 * the mask against them. */
static int sdpa_shapes(struct api_sdpa_request *r, struct sdpa_dims *d, struct api_error *err) {
    if (r->q == NULL || r->k == NULL || r->v == NULL) {
        const char *missing = r->q == NULL ? "q" : r->k == NULL ? "k" : "v";
        return fail(err, ERROR_INVALID_REQUEST, missing, "%s: required tensor", missing);
    }
    if (d->k_rank != d->q_rank || d->v_rank != d->q_rank) {
        const char *which = d->k_rank != d->q_rank ? "k" : "v";
        return fail(err, ERROR_INVALID_REQUEST, which,
                    "%s: rank %d, but q has rank %d: q, k and v are all batched (B, H, T, D) or "
                    "none is",
                    which, which[0] == 'k' ? d->k_rank : d->v_rank, d->q_rank);
    }
    /* Past an optional leading batch, each is (heads, length, dim). */
    int o = d->q_rank - 3;
    if (o == 1 && (d->k[0] != d->q[0] || d->v[0] != d->q[0])) {
        const char *which = d->k[0] != d->q[0] ? "k" : "v";
        return fail(err, ERROR_INVALID_REQUEST, which, "%s: batch %lld, expected q's %lld", which,
                    (long long)(which[0] == 'k' ? d->k[0] : d->v[0]), (long long)d->q[0]);
    }
    if (d->k[o + 2] != d->q[o + 2]) {
        return fail(err, ERROR_INVALID_REQUEST, "k",
                    "k: dimension %d is %lld, expected %lld (q's dk) for shape (Hkv, Tk, dk)",
                    o + 2, (long long)d->k[o + 2], (long long)d->q[o + 2]);
    }
    if (d->q[o] % d->k[o] != 0) {
        return fail(err, ERROR_INVALID_REQUEST, "k",
                    "k: %lld kv heads do not divide the %lld query heads", (long long)d->k[o],
                    (long long)d->q[o]);
    }
    if (d->v[o] != d->k[o] || d->v[o + 1] != d->k[o + 1]) {
        return fail(err, ERROR_INVALID_REQUEST, "v",
                    "v: shape (%lld, %lld, dv) must match k's (Hkv, Tk) = (%lld, %lld)",
                    (long long)d->v[o], (long long)d->v[o + 1], (long long)d->k[o],
                    (long long)d->k[o + 1]);
    }
    r->is_batched = o == 1;
    r->n_batch = o == 1 ? (int32_t)d->q[0] : 1;
    r->n_heads = (int32_t)d->q[o];
    r->n_q = (int32_t)d->q[o + 1];
    r->d_k = (int32_t)d->q[o + 2];
    r->n_kv_heads = (int32_t)d->k[o];
    r->n_k = (int32_t)d->k[o + 1];
    r->d_v = (int32_t)d->v[o + 2];
    return d->mask_rank > 0 ? sdpa_mask(r, d, err) : 0;
}

int api_sdpa_request_parse(const char *body, size_t len, struct api_sdpa_request *out,
                           struct api_error *err) {
    struct api_body b = {body, len, NULL, 0, false};
    return api_sdpa_request_parse_body(&b, out, err);
}

int api_sdpa_request_parse_body(const struct api_body *body, struct api_sdpa_request *out,
                                struct api_error *err) {
    memset(out, 0, sizeof *out);
    struct api_sdpa_request r;
    memset(&r, 0, sizeof r);
    r.window = -1;
    struct sdpa_dims dims;
    memset(&dims, 0, sizeof dims);
    struct body_reader br;
    uint32_t seen = 0;
    bool binary_output = false;
    int index;
    int rc = begin_framed(&br, body, err);
    while (rc == 0 &&
           (rc = next_field(&br.json, sdpa_names, SDPA_N_FIELDS, &seen, &index, err)) == 1) {
        rc = sdpa_field(&br.json, index, &r, &dims, &binary_output, err);
    }
    if (rc == 0) {
        rc = end_body(&br.json, err);
    }
    if (rc == 0) {
        rc = sdpa_shapes(&r, &dims, err);
    }
    if (rc == 0) {
        rc = apply_binary_output(binary_output, seen, SDPA_ENCODING, &r.encoding, err);
    }
    free(dims.mask);
    if (rc == 0 && r.is_linear) {
        /* Linear attention has no scores: nothing to scale, mask or return. */
        static const char *const names[] = {"window", "scale", "mask", "return_weights"};
        bool given[] = {r.window >= 0, r.scale != 0.0f, r.mask != NULL, r.return_weights};
        for (int i = 0; i < 4 && rc == 0; i++) {
            if (given[i]) {
                rc = fail(err, ERROR_INVALID_REQUEST, names[i],
                          "%s: not defined for kind linear (phi(q) S / (phi(q) . z + 1e-6) has "
                          "no scores to scale, mask or return)",
                          names[i]);
            }
        }
    }
    int64_t bh = (int64_t)r.n_batch * r.n_heads;
    if (rc == 0 && bh * r.n_q * r.n_k > API_SDPA_MAX_SCORES) {
        rc = fail(err, ERROR_INVALID_REQUEST, "k",
                  "k: B x H x Tq x Tk = %lld attention scores exceed the limit of %lld per "
                  "request",
                  (long long)(bh * r.n_q * r.n_k), (long long)API_SDPA_MAX_SCORES);
    }
    if (rc == 0 && bh * r.n_q * r.d_v > API_OUTPUT_MAX_VALUES) {
        rc = fail(err, ERROR_INVALID_REQUEST, "v",
                  "v: the output B x H x Tq x dv = %lld values exceeds the limit of %d",
                  (long long)(bh * r.n_q * r.d_v), API_OUTPUT_MAX_VALUES);
    }
    if (rc == 0 && r.sel.is_set) {
        /* the sdpa's shapes are all known: the selection resolves here */
        rc = api_selection_resolve(&r.sel, r.n_heads, r.n_q, r.n_k, r.n_batch, err);
    } else if (rc == 0 && r.return_weights && bh * r.n_q * r.n_k > API_WEIGHTS_MAX_VALUES) {
        rc = fail(err, ERROR_INVALID_REQUEST, "return_weights",
                  "return_weights: B x H x Tq x Tk = %lld values exceed the limit of %d",
                  (long long)(bh * r.n_q * r.n_k), API_WEIGHTS_MAX_VALUES);
    }
    if (rc != 0) {
        api_sdpa_request_release(&r);
        return rc;
    }
    *out = r;
    return 0;
}

/* ---- GET /v1/sessions/{id}/attention -------------------------------------------------------- */

static const char *const attention_params[] = {"layer", "heads", "rows", "keys", "kind", "reduce"};

int api_attention_query(struct api_attention_request *r, const char *name, const char *value,
                        const struct api_limits *lim, struct api_error *err) {
    static const char *const kinds[] = {"probs", "scores", "lse"};
    static const char *const reduces[] = {"none", "mean_heads", "max_heads"};
    int i = 0;
    while (i < 6 && strcmp(name, attention_params[i]) != 0) {
        i++;
    }
    if (i == 6) {
        char shown[64];
        snprintf(shown, sizeof shown, "%s", name);
        utf8_trim_partial(shown);
        return fail(err, ERROR_INVALID_REQUEST, shown,
                    "unknown query parameter '%s' (layer, heads, rows, keys, kind, reduce)", shown);
    }
    if (r->seen & (1u << i)) {
        return fail(err, ERROR_INVALID_REQUEST, name, "%s: given twice", name);
    }
    r->seen |= 1u << i;
    size_t len = strlen(value);
    char *end = NULL;
    switch (i) {
    case 0: {
        /* digits only: strtol alone would take "+1" and " 1", which heads and rows refuse */
        long v = value[0] >= '0' && value[0] <= '9' ? strtol(value, &end, 10) : -1;
        if (len == 0 || (end != NULL && *end != '\0') || v < lim->layer_first ||
            v >= (long)lim->layer_first + lim->layer_count) {
            return fail(err, ERROR_INVALID_REQUEST, "layer",
                        "layer: expected one of the loaded layers %d-%d", (int)lim->layer_first,
                        (int)(lim->layer_first + lim->layer_count - 1));
        }
        r->layer = (int32_t)v;
        return 0;
    }
    case 1:
    case 2:
    case 3: {
        char *dst = i == 1 ? r->heads : i == 2 ? r->rows : r->keys;
        size_t cap = i == 3 ? sizeof r->keys : sizeof r->heads;
        if (len >= cap) {
            return fail(err, ERROR_INVALID_REQUEST, name, "%s: longer than %zu characters", name,
                        cap - 1);
        }
        memcpy(dst, value, len + 1);
        return 0;
    }
    default: {
        const char *const *names = i == 4 ? kinds : reduces;
        for (int c = 0; c < 3; c++) {
            if (strcmp(value, names[c]) == 0) {
                if (i == 4) {
                    r->kind = (attn_inspect_kind)c;
                } else {
                    r->reduce = (attn_inspect_reduce)c;
                }
                return 0;
            }
        }
        return fail(err, ERROR_INVALID_REQUEST, name, "%s: expected %s", name,
                    i == 4 ? "probs, scores or lse" : "none, mean_heads or max_heads");
    }
    }
}

/* One end of a range or an index: an optional '-' and digits, from s up to (not including)
 * stop; empty gives dflt. Negative values count from n (-0 is 0). *ok false when malformed. */
static int64_t spec_number(const char *s, const char *stop, int64_t dflt, int32_t n, bool *ok) {
    if (s == stop) {
        return dflt;
    }
    bool neg = *s == '-';
    s += neg;
    int64_t v = 0;
    if (s == stop) {
        *ok = false;
    }
    for (; s < stop; s++) {
        if (*s < '0' || *s > '9' || v > INT32_MAX) {
            *ok = false;
            return 0;
        }
        v = v * 10 + (*s - '0');
    }
    return neg && v > 0 ? n - v : v; /* -0 is 0, as in python: the start, not the end */
}

/* A spec of indices in [lo, n) ("" or "all": all of them; else comma-separated indices and
 * ranges a:b, none empty) into a sorted list without repeats. */
static int spec_indices(const char *name, const char *spec, int32_t lo, int32_t n, int32_t **out,
                        int32_t *n_out, struct api_error *err) {
    *out = NULL;
    *n_out = 0;
    int32_t count = n - lo > 0 ? n - lo : 0;
    int32_t *a = malloc((size_t)(count > 0 ? count : 1) * sizeof *a);
    uint8_t *chosen = calloc((size_t)(count > 0 ? count : 1), 1); /* by index - lo */
    if (a == NULL || chosen == NULL) {
        free(a);
        free(chosen);
        return out_of_memory(err, name);
    }
    bool is_all = spec[0] == '\0' || strcmp(spec, "all") == 0;
    for (const char *p = spec; !is_all;) {
        const char *comma = strchr(p, ',');
        const char *stop = comma != NULL ? comma : p + strlen(p);
        const char *colon = memchr(p, ':', (size_t)(stop - p));
        bool ok = stop > p;
        int64_t a0 = spec_number(p, colon != NULL ? colon : stop, lo, n, &ok);
        int64_t a1 = colon != NULL ? spec_number(colon + 1, stop, n, n, &ok) : a0 + 1;
        if (!ok || a0 < lo || a1 > n || a0 >= a1) {
            free(a);
            free(chosen);
            return fail(err, ERROR_INVALID_REQUEST, name,
                        "%s: '%.*s' is not an index or range a:b of [%d, %d)", name,
                        (int)(stop - p), p, (int)lo, (int)n);
        }
        memset(chosen + (a0 - lo), 1, (size_t)(a1 - a0));
        if (comma == NULL) {
            break;
        }
        p = comma + 1;
    }
    int32_t m = 0;
    for (int32_t i = 0; i < count; i++) {
        if (is_all || chosen[i]) {
            a[m++] = lo + i;
        }
    }
    free(chosen);
    *n_out = m;
    *out = a;
    return 0;
}

int api_attention_select(const struct api_attention_request *r, int32_t n_heads, int32_t n_tokens,
                         int32_t row_min, struct api_selection *sel, struct api_error *err) {
    memset(sel, 0, sizeof *sel);
    sel->is_set = true;
    sel->kind = r->kind;
    sel->reduce = r->reduce;
    int rc = spec_indices("heads", r->heads, 0, n_heads, &sel->heads, &sel->n_heads, err);
    if (rc == 0) {
        rc = spec_indices("rows", r->rows, row_min, n_tokens, &sel->rows, &sel->n_rows, err);
    }
    if (rc == 0 && sel->n_heads == 0) {
        rc = fail(err, ERROR_INVALID_REQUEST, "heads", "heads: none selected");
    }
    if (rc == 0) {
        const char *colon = strchr(r->keys, ':');
        const char *end = r->keys + strlen(r->keys);
        bool ok = strcmp(r->keys, "all") == 0 || r->keys[0] == '\0' || colon != NULL;
        int64_t k0 = 0, k1 = n_tokens;
        if (colon != NULL) {
            k0 = spec_number(r->keys, colon, 0, n_tokens, &ok);
            k1 = spec_number(colon + 1, end, n_tokens, n_tokens, &ok);
        }
        if (!ok || k0 < 0 || k1 > n_tokens || k0 > k1) {
            rc = fail(err, ERROR_INVALID_REQUEST, "keys",
                      "keys: '%s' is not a range a:b of the cache's %d keys", r->keys,
                      (int)n_tokens);
        } else if (r->kind == ATTN_INSPECT_LSE && (k0 != 0 || k1 != n_tokens)) {
            rc = lse_of_part(err, "keys", k0, k1, n_tokens);
        }
        sel->key_first = (int32_t)k0;
        sel->n_keys = (int32_t)(k1 - k0);
    }
    if (rc == 0 && api_selection_values(sel, n_heads) > API_WEIGHTS_MAX_VALUES) {
        rc = fail(err, ERROR_INVALID_REQUEST, "rows",
                  "rows: the selection holds %lld values, over the limit of %d; select fewer "
                  "heads, rows or keys",
                  (long long)api_selection_values(sel, n_heads), API_WEIGHTS_MAX_VALUES);
    }
    if (rc != 0) {
        api_selection_release(sel);
    }
    return rc;
}

/* ---- session requests ----------------------------------------------------------------------- */

int api_truncate_request_parse(const char *body, size_t len, const struct api_limits *lim,
                               struct api_truncate_request *out, struct api_error *err) {
    static const char *const names[] = {"n_tokens", "layer"};
    memset(out, 0, sizeof *out);
    struct api_truncate_request r = {0};
    struct body_reader br;
    uint32_t seen = 0;
    int index;
    int64_t v;
    int rc = begin_body(&br, body, len, err);
    while (rc == 0 && (rc = next_field(&br.json, names, 2, &seen, &index, err)) == 1) {
        if (index == 0) {
            rc = get_int(&br.json, "n_tokens", 0, INT32_MAX, &v, err);
            r.n_tokens = (int32_t)v;
        } else if (take_null(&br.json)) {
            rc = 0; /* "layer": null is the same as leaving it out */
        } else {
            rc = get_layer(&br.json, lim, &r.layer, err);
            r.has_layer = true;
        }
    }
    if (rc == 0) {
        rc = end_body(&br.json, err);
    }
    if (rc == 0 && !(seen & 1u)) {
        rc = fail(err, ERROR_INVALID_REQUEST, "n_tokens", "n_tokens: required integer >= 0");
    }
    if (rc == 0) {
        *out = r;
    }
    return rc;
}

int api_fork_request_parse(const char *body, size_t len, struct api_fork_request *out,
                           struct api_error *err) {
    static const char *const names[] = {"new_id"};
    memset(out, 0, sizeof *out);
    struct api_fork_request r = {{0}};
    struct body_reader br;
    uint32_t seen = 0;
    int index;
    int rc = begin_body(&br, body, len, err);
    while (rc == 0 && (rc = next_field(&br.json, names, 1, &seen, &index, err)) == 1) {
        rc = get_session_id(&br.json, "new_id", r.new_id, err);
    }
    if (rc == 0) {
        rc = end_body(&br.json, err);
    }
    if (rc == 0 && !(seen & 1u)) {
        rc = fail(err, ERROR_INVALID_REQUEST, "new_id", "new_id: required session id");
    }
    if (rc == 0) {
        *out = r;
    }
    return rc;
}
