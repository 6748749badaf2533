/* server/api.c: the request half of the JSON edge (see api.h and proto/openapi.yaml). Bodies
 * are parsed with cJSON and checked field by field; tensors come as nested arrays or base64
 * objects and land in malloc'd row-major float arrays. Encoding responses is api_encode.c.
 */
#include "api.h"

#include <float.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "b64.h"
#include "error.h"

/* Tensors larger than this many values are refused before any allocation (1 GiB of float). */
#define MAX_TENSOR_VALUES ((int64_t)1 << 28)

/* ---- errors --------------------------------------------------------------------------------- */

static int fail(struct api_error *err, int code, const char *param, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

static int fail(struct api_error *err, int code, const char *param, const char *fmt, ...) {
    err->code = code;
    snprintf(err->param, sizeof err->param, "%s", param ? param : "");
    err->message[0] = '\0';
    if (fmt != NULL) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err->message, sizeof err->message, fmt, ap);
        va_end(ap);
    }
    return code;
}

/* ---- generic field helpers ------------------------------------------------------------------ */

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

/* Parses body as one JSON object. On failure returns NULL with *err filled. */
static cJSON *parse_object(const char *body, size_t len, struct api_error *err) {
    const char *end = NULL;
    if (len == 0) {
        fail(err, ERROR_INVALID_JSON, NULL, "request body is empty; expected a JSON object");
        return NULL;
    }
    cJSON *root = cJSON_ParseWithLengthOpts(body, len, &end, 0);
    if (root == NULL) {
        size_t at = end != NULL && end >= body ? (size_t)(end - body) : 0;
        fail(err, ERROR_INVALID_JSON, NULL, "request body is not valid JSON (near byte %zu)", at);
        return NULL;
    }
    for (const char *p = end; p != NULL && p < body + len; p++) {
        if (*p != ' ' && *p != '\t' && *p != '\r' && *p != '\n' && *p != '\0') {
            cJSON_Delete(root);
            fail(err, ERROR_INVALID_JSON, NULL,
                 "request body has data after the JSON value (byte %zu)", (size_t)(p - body));
            return NULL;
        }
    }
    if (!cJSON_IsObject(root)) {
        cJSON_Delete(root);
        fail(err, ERROR_INVALID_REQUEST, NULL, "request body must be a JSON object");
        return NULL;
    }
    for (const cJSON *a = root->child; a != NULL; a = a->next) {
        for (const cJSON *b = root->child; b != a; b = b->next) {
            if (strcmp(a->string, b->string) == 0) {
                fail(err, ERROR_INVALID_REQUEST, a->string, "field '%s' appears twice", a->string);
                cJSON_Delete(root);
                return NULL;
            }
        }
    }
    return root;
}

static int unknown_field(const cJSON *item, struct api_error *err) {
    return fail(err, ERROR_INVALID_REQUEST, item->string, "unknown field '%s'", item->string);
}

static int get_bool(const cJSON *item, bool *out, struct api_error *err) {
    if (!cJSON_IsBool(item)) {
        return fail(err, ERROR_INVALID_REQUEST, item->string, "%s: expected true or false",
                    item->string);
    }
    *out = cJSON_IsTrue(item);
    return 0;
}

static int get_int(const cJSON *item, int64_t min, int64_t max, int64_t *out,
                   struct api_error *err) {
    if (!cJSON_IsNumber(item) || !isfinite(item->valuedouble) ||
        item->valuedouble != floor(item->valuedouble)) {
        return fail(err, ERROR_INVALID_REQUEST, item->string, "%s: expected an integer",
                    item->string);
    }
    double d = item->valuedouble;
    if (d < (double)min || d > (double)max) {
        return fail(err, ERROR_INVALID_REQUEST, item->string,
                    "%s: %.0f is out of range [%lld, %lld]", item->string, d, (long long)min,
                    (long long)max);
    }
    *out = (int64_t)d;
    return 0;
}

/* A layer index: an integer >= 0 that must be one of the loaded layers. */
static int get_layer(const cJSON *item, const struct api_limits *lim, int32_t *out,
                     struct api_error *err) {
    int64_t v;
    int rc = get_int(item, 0, INT32_MAX, &v, err);
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

static int get_session_id(const cJSON *item, const char *param, char *out, struct api_error *err) {
    if (!cJSON_IsString(item) ||
        !api_session_id_is_valid(item->valuestring, strlen(item->valuestring))) {
        return fail(err, ERROR_INVALID_REQUEST, param,
                    "%s: expected a string of 1 to 128 characters from [A-Za-z0-9._:-]", param);
    }
    strcpy(out, item->valuestring);
    return 0;
}

static int get_encoding(const cJSON *item, enum api_encoding *out, struct api_error *err) {
    if (cJSON_IsString(item) && strcmp(item->valuestring, "float") == 0) {
        *out = API_ENCODING_FLOAT;
        return 0;
    }
    if (cJSON_IsString(item) && strcmp(item->valuestring, "base64") == 0) {
        *out = API_ENCODING_BASE64;
        return 0;
    }
    return fail(err, ERROR_INVALID_REQUEST, item->string,
                "encoding_format: expected \"float\" or \"base64\"");
}

/* ---- tensors -------------------------------------------------------------------------------- */

/* What a tensor field must look like: its rank, and per dim either a required size or -1. */
struct tensor_spec {
    const char *name; /* the field, for errors */
    const char *doc;  /* its shape in words, e.g. "(T, hidden_size)" */
    int rank;         /* 1..3 */
    int64_t want[3];  /* required size per dim, or -1 for any */
};

static int check_value(double d, const struct tensor_spec *s, int64_t flat, struct api_error *err,
                       float *out) {
    if (!isfinite(d) || fabs(d) > FLT_MAX) {
        return fail(err, ERROR_INVALID_REQUEST, s->name,
                    "%s: value %lld (row-major) is not a finite float32 number", s->name,
                    (long long)flat);
    }
    *out = (float)d;
    return 0;
}

static int check_dims(const struct tensor_spec *s, const int64_t *dims, struct api_error *err) {
    int64_t total = 1;
    for (int d = 0; d < s->rank; d++) {
        if (dims[d] < 1) {
            return fail(err, ERROR_INVALID_REQUEST, s->name, "%s: dimension %d is empty", s->name,
                        d);
        }
        if (s->want[d] >= 0 && dims[d] != s->want[d]) {
            return fail(err, ERROR_INVALID_REQUEST, s->name,
                        "%s: dimension %d is %lld, expected %lld for shape %s", s->name, d,
                        (long long)dims[d], (long long)s->want[d], s->doc);
        }
        if (dims[d] > MAX_TENSOR_VALUES / total) {
            return fail(err, ERROR_INVALID_REQUEST, s->name, "%s: too many values", s->name);
        }
        total *= dims[d];
    }
    return 0;
}

/* Fills out (row-major) from nested arrays whose dims are known to be dims; *pos counts
 * values written. */
static int fill_nested(const cJSON *arr, int depth, const int64_t *dims,
                       const struct tensor_spec *s, float *out, int64_t *pos,
                       struct api_error *err) {
    int n = cJSON_GetArraySize(arr);
    if (n != dims[depth]) {
        return fail(err, ERROR_INVALID_REQUEST, s->name,
                    "%s: ragged array: an array at depth %d has %d values, expected %lld "
                    "(shape %s)",
                    s->name, depth, n, (long long)dims[depth], s->doc);
    }
    for (const cJSON *c = arr->child; c != NULL; c = c->next) {
        if (depth + 1 < s->rank) {
            if (!cJSON_IsArray(c)) {
                return fail(err, ERROR_INVALID_REQUEST, s->name,
                            "%s: expected nested arrays of rank %d %s", s->name, s->rank, s->doc);
            }
            int rc = fill_nested(c, depth + 1, dims, s, out, pos, err);
            if (rc != 0) {
                return rc;
            }
        } else {
            if (!cJSON_IsNumber(c)) {
                return fail(err, ERROR_INVALID_REQUEST, s->name,
                            "%s: value %lld (row-major) is not a number", s->name, (long long)*pos);
            }
            int rc = check_value(c->valuedouble, s, *pos, err, &out[*pos]);
            if (rc != 0) {
                return rc;
            }
            (*pos)++;
        }
    }
    return 0;
}

static int parse_nested(const cJSON *item, const struct tensor_spec *s, float **out, int64_t *dims,
                        struct api_error *err) {
    const cJSON *cur = item;
    for (int d = 0; d < s->rank; d++) {
        if (!cJSON_IsArray(cur)) {
            return fail(err, ERROR_INVALID_REQUEST, s->name,
                        "%s: expected nested arrays of rank %d %s, or a base64 object", s->name,
                        s->rank, s->doc);
        }
        dims[d] = cJSON_GetArraySize(cur);
        if (dims[d] == 0) {
            return fail(err, ERROR_INVALID_REQUEST, s->name, "%s: dimension %d is empty", s->name,
                        d);
        }
        cur = cur->child;
    }
    if (cJSON_IsArray(cur)) {
        return fail(err, ERROR_INVALID_REQUEST, s->name,
                    "%s: expected rank %d %s, got deeper nesting", s->name, s->rank, s->doc);
    }
    int rc = check_dims(s, dims, err);
    if (rc != 0) {
        return rc;
    }
    int64_t total = 1;
    for (int d = 0; d < s->rank; d++) {
        total *= dims[d];
    }
    float *data = malloc((size_t)total * sizeof(float));
    if (data == NULL) {
        return fail(err, ERROR_INTERNAL, s->name, "out of memory for %s", s->name);
    }
    int64_t pos = 0;
    rc = fill_nested(item, 0, dims, s, data, &pos, err);
    if (rc != 0) {
        free(data);
        return rc;
    }
    *out = data;
    return 0;
}

static int parse_b64(const cJSON *item, const struct tensor_spec *s, float **out, int64_t *dims,
                     struct api_error *err) {
    const cJSON *shape = NULL, *text = NULL;
    for (const cJSON *c = item->child; c != NULL; c = c->next) {
        if (strcmp(c->string, "shape") == 0 && shape == NULL) {
            shape = c;
        } else if (strcmp(c->string, "b64") == 0 && text == NULL) {
            text = c;
        } else {
            return fail(err, ERROR_INVALID_REQUEST, s->name,
                        "%s: a base64 tensor has exactly the fields shape and b64", s->name);
        }
    }
    if (!cJSON_IsArray(shape) || cJSON_GetArraySize(shape) != s->rank) {
        return fail(err, ERROR_INVALID_REQUEST, s->name,
                    "%s: shape must be an array of %d positive integers %s", s->name, s->rank,
                    s->doc);
    }
    int d = 0;
    for (const cJSON *c = shape->child; c != NULL; c = c->next, d++) {
        if (!cJSON_IsNumber(c) || c->valuedouble != floor(c->valuedouble) || c->valuedouble < 1 ||
            c->valuedouble > (double)MAX_TENSOR_VALUES) {
            return fail(err, ERROR_INVALID_REQUEST, s->name,
                        "%s: shape must be an array of %d positive integers %s", s->name, s->rank,
                        s->doc);
        }
        dims[d] = (int64_t)c->valuedouble;
    }
    int rc = check_dims(s, dims, err);
    if (rc != 0) {
        return rc;
    }
    int64_t total = 1;
    for (d = 0; d < s->rank; d++) {
        total *= dims[d];
    }
    size_t bytes = (size_t)total * 4;
    if (!cJSON_IsString(text)) {
        return fail(err, ERROR_INVALID_REQUEST, s->name, "%s: b64 must be a string", s->name);
    }
    size_t len = strlen(text->valuestring);
    if (len != b64_encoded_len(bytes) || b64_decoded_len(text->valuestring, len) != bytes) {
        return fail(err, ERROR_INVALID_REQUEST, s->name,
                    "%s: b64 must hold exactly 4 * prod(shape) = %zu bytes of float32", s->name,
                    bytes);
    }
    float *data = malloc(bytes);
    if (data == NULL) {
        return fail(err, ERROR_INTERNAL, s->name, "out of memory for %s", s->name);
    }
    uint8_t *raw = (uint8_t *)data;
    if (b64_decode(text->valuestring, len, raw) != 0) {
        free(data);
        return fail(err, ERROR_INVALID_REQUEST, s->name, "%s: b64 is not valid base64", s->name);
    }
    /* Little-endian float32 to host order, in place (byte i*4 is read before value i is
     * written). */
    for (int64_t i = 0; i < total; i++) {
        const uint8_t *p = raw + i * 4;
        uint32_t u =
            (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
        float f;
        memcpy(&f, &u, 4);
        if (check_value((double)f, s, i, err, &data[i]) != 0) {
            free(data);
            return err->code;
        }
    }
    *out = data;
    return 0;
}

/* Parses a tensor field into a malloc'd array; dims gets its shape. */
static int parse_tensor(const cJSON *item, const struct tensor_spec *s, float **out, int64_t *dims,
                        struct api_error *err) {
    if (cJSON_IsObject(item)) {
        return parse_b64(item, s, out, dims, err);
    }
    return parse_nested(item, s, out, dims, err);
}

/* ---- POST /v1/attend ------------------------------------------------------------------------ */

void api_attend_request_release(struct api_attend_request *r) {
    free(r->x);
    free(r->positions);
    memset(r, 0, sizeof *r);
}

static int parse_positions(const cJSON *item, int32_t n_tokens, int32_t max_seq, int32_t **out,
                           struct api_error *err) {
    if (!cJSON_IsArray(item)) {
        return fail(err, ERROR_INVALID_REQUEST, "positions",
                    "positions: expected an array of "
                    "integers, one per token of x");
    }
    if (cJSON_GetArraySize(item) != n_tokens) {
        return fail(err, ERROR_INVALID_REQUEST, "positions",
                    "positions: has %d values, expected %d (one per token of x)",
                    cJSON_GetArraySize(item), (int)n_tokens);
    }
    int32_t *pos = malloc((size_t)n_tokens * sizeof *pos);
    if (pos == NULL) {
        return fail(err, ERROR_INTERNAL, "positions", "out of memory");
    }
    int i = 0;
    for (const cJSON *c = item->child; c != NULL; c = c->next, i++) {
        if (!cJSON_IsNumber(c) || c->valuedouble != floor(c->valuedouble) || c->valuedouble < 0 ||
            !isfinite(c->valuedouble)) {
            free(pos);
            return fail(err, ERROR_INVALID_REQUEST, "positions",
                        "positions[%d]: expected a non-negative integer", i);
        }
        if (c->valuedouble >= (double)max_seq) {
            free(pos);
            return fail(err, ERROR_CONTEXT_LENGTH_EXCEEDED, "positions",
                        "positions[%d]: %.0f is past the model's maximum position %d", i,
                        c->valuedouble, (int)max_seq - 1);
        }
        pos[i] = (int32_t)c->valuedouble;
    }
    *out = pos;
    return 0;
}

int api_attend_request_parse(const char *body, size_t len, const struct api_limits *lim,
                             struct api_attend_request *out, struct api_error *err) {
    memset(out, 0, sizeof *out);
    cJSON *root = parse_object(body, len, err);
    if (root == NULL) {
        return err->code;
    }
    struct api_attend_request r;
    memset(&r, 0, sizeof r);
    r.layer = lim->layer_first;
    const cJSON *x = NULL, *positions = NULL;
    int64_t v;
    int rc = 0;
    for (const cJSON *c = root->child; c != NULL && rc == 0; c = c->next) {
        const char *k = c->string;
        if (strcmp(k, "x") == 0) {
            x = c;
        } else if (cJSON_IsNull(c)) {
            if (strcmp(k, "session_id") != 0 && strcmp(k, "layer") != 0 &&
                strcmp(k, "positions") != 0 && strcmp(k, "expect_n_past") != 0 &&
                strcmp(k, "return_weights") != 0 && strcmp(k, "stream") != 0 &&
                strcmp(k, "encoding_format") != 0) {
                rc = unknown_field(c, err);
            }
        } else if (strcmp(k, "session_id") == 0) {
            rc = get_session_id(c, "session_id", r.session_id, err);
        } else if (strcmp(k, "layer") == 0) {
            rc = get_layer(c, lim, &r.layer, err);
        } else if (strcmp(k, "positions") == 0) {
            positions = c;
        } else if (strcmp(k, "expect_n_past") == 0) {
            rc = get_int(c, 0, INT32_MAX, &v, err);
            r.has_expect_n_past = true;
            r.expect_n_past = (int32_t)v;
        } else if (strcmp(k, "return_weights") == 0) {
            rc = get_bool(c, &r.return_weights, err);
        } else if (strcmp(k, "stream") == 0) {
            rc = get_bool(c, &r.stream, err);
        } else if (strcmp(k, "encoding_format") == 0) {
            rc = get_encoding(c, &r.encoding, err);
        } else {
            rc = unknown_field(c, err);
        }
    }
    if (rc == 0 && x == NULL) {
        rc = fail(err, ERROR_INVALID_REQUEST, "x", "x: required (T, hidden_size) tensor");
    }
    if (rc == 0) {
        struct tensor_spec spec = {"x", "(T, hidden_size)", 2, {-1, lim->hidden_size, -1}};
        int64_t dims[3];
        rc = parse_tensor(x, &spec, &r.x, dims, err);
        if (rc == 0 && dims[0] > lim->max_seq) {
            rc = fail(err, ERROR_CONTEXT_LENGTH_EXCEEDED, "x",
                      "x: %lld tokens exceed the model's maximum sequence length %d",
                      (long long)dims[0], (int)lim->max_seq);
        }
        r.n_tokens = rc == 0 ? (int32_t)dims[0] : 0;
    }
    if (rc == 0 && positions != NULL && !cJSON_IsNull(positions)) {
        rc = parse_positions(positions, r.n_tokens, lim->max_seq, &r.positions, err);
    }
    if (rc == 0 && r.return_weights &&
        (int64_t)lim->n_heads * r.n_tokens * r.n_tokens > API_WEIGHTS_MAX_VALUES) {
        rc = fail(err, ERROR_INVALID_REQUEST, "return_weights",
                  "return_weights: n_heads x T x T = %lld values exceed the limit of %d",
                  (long long)lim->n_heads * r.n_tokens * r.n_tokens, API_WEIGHTS_MAX_VALUES);
    }
    cJSON_Delete(root);
    if (rc != 0) {
        api_attend_request_release(&r);
        return rc;
    }
    *out = r;
    return 0;
}

/* ---- POST /v1/sdpa -------------------------------------------------------------------------- */

void api_sdpa_request_release(struct api_sdpa_request *r) {
    free(r->q);
    free(r->k);
    free(r->v);
    memset(r, 0, sizeof *r);
}

static int sdpa_tensors(const cJSON *q, const cJSON *k, const cJSON *v, struct api_sdpa_request *r,
                        struct api_error *err) {
    if (q == NULL || k == NULL || v == NULL) {
        const char *missing = q == NULL ? "q" : k == NULL ? "k" : "v";
        return fail(err, ERROR_INVALID_REQUEST, missing, "%s: required tensor", missing);
    }
    int64_t qd[3], kd[3], vd[3];
    struct tensor_spec qs = {"q", "(H, Tq, dk)", 3, {-1, -1, -1}};
    int rc = parse_tensor(q, &qs, &r->q, qd, err);
    if (rc != 0) {
        return rc;
    }
    struct tensor_spec ks = {"k", "(Hkv, Tk, dk)", 3, {-1, -1, qd[2]}};
    rc = parse_tensor(k, &ks, &r->k, kd, err);
    if (rc != 0) {
        return rc;
    }
    if (qd[0] % kd[0] != 0) {
        return fail(err, ERROR_INVALID_REQUEST, "k",
                    "k: %lld kv heads do not divide the %lld query heads", (long long)kd[0],
                    (long long)qd[0]);
    }
    struct tensor_spec vs = {"v", "(Hkv, Tk, dv)", 3, {kd[0], kd[1], -1}};
    rc = parse_tensor(v, &vs, &r->v, vd, err);
    if (rc != 0) {
        return rc;
    }
    r->n_heads = (int32_t)qd[0];
    r->n_q = (int32_t)qd[1];
    r->d_k = (int32_t)qd[2];
    r->n_kv_heads = (int32_t)kd[0];
    r->n_k = (int32_t)kd[1];
    r->d_v = (int32_t)vd[2];
    return 0;
}

int api_sdpa_request_parse(const char *body, size_t len, struct api_sdpa_request *out,
                           struct api_error *err) {
    memset(out, 0, sizeof *out);
    cJSON *root = parse_object(body, len, err);
    if (root == NULL) {
        return err->code;
    }
    struct api_sdpa_request r;
    memset(&r, 0, sizeof r);
    r.window = -1;
    const cJSON *q = NULL, *k = NULL, *v = NULL;
    int64_t iv;
    int rc = 0;
    for (const cJSON *c = root->child; c != NULL && rc == 0; c = c->next) {
        const char *name = c->string;
        if (strcmp(name, "q") == 0) {
            q = c;
        } else if (strcmp(name, "k") == 0) {
            k = c;
        } else if (strcmp(name, "v") == 0) {
            v = c;
        } else if (strcmp(name, "causal") == 0) {
            rc = cJSON_IsNull(c) ? 0 : get_bool(c, &r.causal, err);
        } else if (strcmp(name, "window") == 0) {
            if (!cJSON_IsNull(c)) {
                rc = get_int(c, 0, INT32_MAX, &iv, err);
                r.window = (int32_t)iv;
            }
        } else if (strcmp(name, "scale") == 0) {
            if (!cJSON_IsNull(c)) {
                if (!cJSON_IsNumber(c) || !isfinite(c->valuedouble) || c->valuedouble <= 0 ||
                    c->valuedouble > FLT_MAX) {
                    rc = fail(err, ERROR_INVALID_REQUEST, "scale",
                              "scale: expected a finite number > 0");
                }
                r.scale = (float)c->valuedouble;
                if (rc == 0 && r.scale == 0.0f) {
                    rc = fail(err, ERROR_INVALID_REQUEST, "scale", "scale: too small for float32");
                }
            }
        } else if (strcmp(name, "return_weights") == 0) {
            rc = cJSON_IsNull(c) ? 0 : get_bool(c, &r.return_weights, err);
        } else if (strcmp(name, "encoding_format") == 0) {
            rc = cJSON_IsNull(c) ? 0 : get_encoding(c, &r.encoding, err);
        } else {
            rc = unknown_field(c, err);
        }
    }
    if (rc == 0) {
        rc = sdpa_tensors(q, k, v, &r, err);
    }
    if (rc == 0 && (int64_t)r.n_heads * r.n_q * r.d_v > API_OUTPUT_MAX_VALUES) {
        rc = fail(err, ERROR_INVALID_REQUEST, "v",
                  "v: the output H x Tq x dv = %lld values exceeds the limit of %d",
                  (long long)r.n_heads * r.n_q * r.d_v, API_OUTPUT_MAX_VALUES);
    }
    if (rc == 0 && r.return_weights &&
        (int64_t)r.n_heads * r.n_q * r.n_k > API_WEIGHTS_MAX_VALUES) {
        rc = fail(err, ERROR_INVALID_REQUEST, "return_weights",
                  "return_weights: H x Tq x Tk = %lld values exceed the limit of %d",
                  (long long)r.n_heads * r.n_q * r.n_k, API_WEIGHTS_MAX_VALUES);
    }
    cJSON_Delete(root);
    if (rc != 0) {
        api_sdpa_request_release(&r);
        return rc;
    }
    *out = r;
    return 0;
}

/* ---- session requests ----------------------------------------------------------------------- */

int api_truncate_request_parse(const char *body, size_t len, const struct api_limits *lim,
                               struct api_truncate_request *out, struct api_error *err) {
    memset(out, 0, sizeof *out);
    cJSON *root = parse_object(body, len, err);
    if (root == NULL) {
        return err->code;
    }
    struct api_truncate_request r = {0};
    bool has_n = false;
    int64_t v;
    int rc = 0;
    for (const cJSON *c = root->child; c != NULL && rc == 0; c = c->next) {
        if (strcmp(c->string, "n_tokens") == 0) {
            rc = get_int(c, 0, INT32_MAX, &v, err);
            r.n_tokens = (int32_t)v;
            has_n = true;
        } else if (strcmp(c->string, "layer") == 0) {
            if (cJSON_IsNull(c)) {
                continue;
            }
            rc = get_layer(c, lim, &r.layer, err);
            r.has_layer = true;
        } else {
            rc = unknown_field(c, err);
        }
    }
    if (rc == 0 && !has_n) {
        rc = fail(err, ERROR_INVALID_REQUEST, "n_tokens", "n_tokens: required integer >= 0");
    }
    cJSON_Delete(root);
    if (rc == 0) {
        *out = r;
    }
    return rc;
}

int api_fork_request_parse(const char *body, size_t len, struct api_fork_request *out,
                           struct api_error *err) {
    memset(out, 0, sizeof *out);
    cJSON *root = parse_object(body, len, err);
    if (root == NULL) {
        return err->code;
    }
    struct api_fork_request r = {{0}};
    bool has_id = false;
    int rc = 0;
    for (const cJSON *c = root->child; c != NULL && rc == 0; c = c->next) {
        if (strcmp(c->string, "new_id") == 0) {
            rc = get_session_id(c, "new_id", r.new_id, err);
            has_id = true;
        } else {
            rc = unknown_field(c, err);
        }
    }
    if (rc == 0 && !has_id) {
        rc = fail(err, ERROR_INVALID_REQUEST, "new_id", "new_id: required session id");
    }
    cJSON_Delete(root);
    if (rc == 0) {
        *out = r;
    }
    return rc;
}
