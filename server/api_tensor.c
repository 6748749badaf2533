/* server/api_tensor.c: tensor fields (see api_int.h): nested arrays read straight into
 * row-major floats, base64 objects, and the binary extension's raw parts, which a borrowing
 * parse reads where they lie. Every shape and value is checked as it is read, and nothing is
 * allocated beyond what was read.
 */
#include "api_int.h"

#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "b64.h"
#include "error.h"

/* Tensors larger than this many values are refused before any allocation (1 GiB of float). */
#define MAX_TENSOR_VALUES ((int64_t)1 << 28)

/* The first allocation of a nested-array tensor, in values; it doubles as numbers arrive. */
#define TENSOR_FIRST_VALUES 1024

/* ---- tensors -------------------------------------------------------------------------------- */

/* "rank 3" or "rank 3 or 4", for messages. */
static const char *rank_words(const struct tensor_spec *s, char *buf, size_t size) {
    if (s->min_rank > 0 && s->min_rank < s->rank) {
        snprintf(buf, size, "rank %d to %d", s->min_rank, s->rank);
    } else {
        snprintf(buf, size, "rank %d", s->rank);
    }
    return buf;
}

bool api__to_float32(double d, float *out) {
    static const double rounds_to_inf = (double)FLT_MAX + 0x1p103;
    if (!isfinite(d) || fabs(d) >= rounds_to_inf) {
        return false;
    }
    *out = fabs(d) <= FLT_MAX ? (float)d : d > 0 ? FLT_MAX : -FLT_MAX;
    return true;
}

static int check_value(double d, const struct tensor_spec *s, int64_t flat, struct api_error *err,
                       float *out) {
    if (!api__to_float32(d, out)) {
        return api__fail(err, ERROR_INVALID_REQUEST, s->name,
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
        return api__fail(err, ERROR_INVALID_REQUEST, s->name, "%s: dimension %d is empty", s->name,
                         d);
    }
    if (s->want[d] >= 0 && size != s->want[d]) {
        return api__fail(err, ERROR_INVALID_REQUEST, s->name,
                         "%s: dimension %d is %lld, expected %lld for shape %s", s->name, d,
                         (long long)size, (long long)s->want[d], s->doc);
    }
    if (size > MAX_TENSOR_VALUES / product_before) {
        return api__fail(err, ERROR_INVALID_REQUEST, s->name, "%s: too many values", s->name);
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
        return api__syntax_error(r, err);
    }
    for (;;) {
        int more = json_array_next(r);
        if (more < 0) {
            rc = api__syntax_error(r, err);
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
                rc = api__fail(
                    err, ERROR_INVALID_REQUEST, s->name,
                    "%s: ragged: an array at depth %d has %lld values, the first had %lld", s->name,
                    depth, (long long)count[depth], (long long)dims[depth]);
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
            rc = api__fail(err, ERROR_INVALID_REQUEST, s->name,
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
                rc = t == JSON_TYPE_INVALID ? api__wrong_type(r, s->name, "", err)
                                            : api__fail(err, ERROR_INVALID_REQUEST, s->name,
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
            rc = t == JSON_TYPE_INVALID ? api__wrong_type(r, s->name, "", err)
                 : t == JSON_TYPE_ARRAY
                     ? api__fail(err, ERROR_INVALID_REQUEST, s->name,
                                 "%s: expected %s %s, got deeper nesting", s->name, ranks, s->doc)
                     : api__fail(err, ERROR_INVALID_REQUEST, s->name,
                                 "%s: value %lld (row-major) is not a number", s->name,
                                 (long long)f.n);
            break;
        }
        double d;
        float v = 0.0f;
        if (json_read_number(r, &d) != 0) {
            rc = api__syntax_error(r, err);
            break;
        }
        rc = check_value(d, s, f.n, err, &v);
        if (rc != 0) {
            break;
        }
        int pushed = floats_push(&f, v);
        if (pushed != 0) {
            rc = pushed == -1 ? api__fail(err, ERROR_INVALID_REQUEST, s->name,
                                          "%s: too many values", s->name)
                              : api__out_of_memory(err, s->name);
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

/* The value of the little-endian float32 at p, as its bits. */
static uint32_t le_bits(const uint8_t *p) {
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

/* Whether every one of n little-endian float32 values at raw is finite: one branch-free pass,
 * eight values a step in lanes of their own, which -O2's vectorizer (its cheapest model takes
 * no loop that needs a remainder) makes two SSE compares and ors; the loop a value at a time
 * stayed scalar, 8 instructions a value (callgrind: 16 M of a 32-session binary batch run's
 * 57 M instructions of request handling). */
static bool all_finite_le(const uint8_t *raw, int64_t n) {
    enum { LANES = 8 };
    uint32_t any[LANES] = {0};
    int64_t i = 0;
    for (; i + LANES <= n; i += LANES) {
        for (int l = 0; l < LANES; l++) {
            any[l] |= (le_bits(raw + (i + l) * 4) & 0x7f800000u) == 0x7f800000u;
        }
    }
    for (; i < n; i++) {
        any[0] |= (le_bits(raw + i * 4) & 0x7f800000u) == 0x7f800000u;
    }
    uint32_t any_not_finite = 0;
    for (int l = 0; l < LANES; l++) {
        any_not_finite |= any[l];
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
            uint32_t u = le_bits(raw + i * 4);
            memcpy(&data[i], &u, 4);
        }
        return 0;
    }
    int rc = 0;
    for (int64_t i = 0; rc == 0 && i < total; i++) {
        uint32_t u = le_bits(raw + i * 4);
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
    int rc = api__get_short_string(r, s->name, text, sizeof text, &len, "\"FP32\"", err);
    if (rc == 0 && !(len == 4 && memcmp(text, "FP32", 4) == 0)) {
        rc = api__fail(err, ERROR_INVALID_REQUEST, s->name, "%s: datatype must be \"FP32\"",
                       s->name);
    }
    return rc;
}

/* The next n bytes of a framed body's raw part, for a tensor declaring binary_data_size n. */
static int take_binary(struct json_reader *r, const struct tensor_spec *s, size_t n,
                       const uint8_t **out, struct api_error *err) {
    struct body_reader *br = api__body_of(r);
    if (br->binary == NULL) {
        return api__fail(
            err, ERROR_INVALID_REQUEST, s->name,
            "%s: binary_data_size needs the binary tensor extension: the request header "
            "Inference-Header-Content-Length giving the JSON's length, the raw bytes after "
            "it",
            s->name);
    }
    if (n > br->binary_len - br->binary_used) {
        return api__fail(
            err, ERROR_INVALID_REQUEST, s->name,
            "%s: binary_data_size %zu runs past the body's binary part (%zu bytes left)", s->name,
            n, br->binary_len - br->binary_used);
    }
    *out = br->binary + br->binary_used;
    br->binary_used += n;
    return 0;
}

/* A tensor object whose shape is missing or wrong: what is wrong, and what one looks like. */
static int tensor_object_error(const struct tensor_spec *s, const char *what,
                               struct api_error *err) {
    char ranks[32];
    return api__fail(
        err, ERROR_INVALID_REQUEST, s->name,
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
        return api__syntax_error(r, err);
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
            return api__syntax_error(r, err);
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
        return api__syntax_error(r, err);
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
    while ((rc = api__next_field(r, names, 4, &seen, &index, err)) == 1) {
        if (index == 2) {
            rc = api__get_int(r, s->name, 0, INT64_MAX / 2, &binary_size, err);
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
                return api__wrong_type(r, s->name, "b64 as a string", err);
            }
            if (json_read_string(r, &text) != 0) {
                return api__syntax_error(r, err);
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
            return api__fail(err, ERROR_INVALID_REQUEST, s->name,
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
            return api__fail(err, ERROR_INVALID_REQUEST, s->name,
                             "%s: binary_data_size must be 4 * prod(shape) = %zu bytes of float32",
                             s->name, bytes);
        }
        rc = take_binary(r, s, bytes, &raw, err);
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
        if (rc == 0 && api__body_of(r)->may_borrow && (uintptr_t)raw % _Alignof(float) == 0 &&
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
            rc = api__out_of_memory(err, s->name);
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
            return api__out_of_memory(err, s->name);
        }
        len = json_span_decode(&text, unescaped, text.len, NULL);
        b64 = unescaped;
    }
    rc = 0;
    if (len != b64_encoded_len(bytes) || b64_decoded_len(b64, len) != bytes) {
        rc = api__fail(err, ERROR_INVALID_REQUEST, s->name,
                       "%s: b64 must hold exactly 4 * prod(shape) = %zu bytes of float32", s->name,
                       bytes);
    }
    float *data = rc == 0 ? malloc(bytes) : NULL;
    if (rc == 0 && data == NULL) {
        rc = api__out_of_memory(err, s->name);
    }
    if (rc == 0 && b64_decode(b64, len, (uint8_t *)data) != 0) {
        rc = api__fail(err, ERROR_INVALID_REQUEST, s->name, "%s: b64 is not valid base64", s->name);
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

int api__parse_tensor(struct json_reader *r, const struct tensor_spec *s, float **out,
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
        return api__wrong_type(r, s->name, "", err);
    default:
        return api__fail(err, ERROR_INVALID_REQUEST, s->name,
                         "%s: expected nested arrays of %s %s, or a base64 object", s->name,
                         rank_words(s, ranks, sizeof ranks), s->doc);
    }
    if (rc == 0 && rank_out != NULL) {
        *rank_out = rank;
    }
    return rc;
}
