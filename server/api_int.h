/* server/api_int.h: what the request parsers of the JSON edge share. api_read.c has the errors,
 * an object's fields and the scalars; api_tensor.c the tensor fields; api_inspect.c selections,
 * captures and the attention query; api.c POST /v1/attend (with /v1/kv/attend) and the session
 * requests; api_sdpa.c POST /v1/sdpa. Not for other modules: they use api.h. Cross-file
 * functions are prefixed api__.
 */
#ifndef SERVER_API_INT_H
#define SERVER_API_INT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "api.h"
#include "json.h"

/* A body's reader: the JSON, and the raw part of a framed body with how much of it the tensors
 * read so far have taken. `json` comes first, so the helpers that take the json_reader reach
 * the rest (api__body_of). */
struct body_reader {
    struct json_reader json;
    const uint8_t *binary; /* NULL: the body is not framed */
    size_t binary_len, binary_used;
    bool may_borrow; /* tensors may be read where they lie (api_body.may_borrow) */
};

/* What a tensor field must look like: its rank, and per dim either a required size or -1. */
struct tensor_spec {
    const char *name; /* the field, for errors */
    const char *doc;  /* its shape in words, e.g. "(T, hidden_size)" */
    int rank;         /* 1..4: its rank, or the highest it may have */
    int64_t want[4];  /* required size per dim, or -1 for any */
    int min_rank;     /* 0, or the lowest rank it may have (a leading batch dimension is
                       * optional); want[] then applies to the dims as read */
};

/* ---- api_read.c: errors, an object's fields, scalars ---- */

/* Fills err (the message from fmt, both cut at a character boundary to fit) and returns code. */
int api__fail(struct api_error *err, int code, const char *param, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

/* The reader's syntax error as invalid_json. */
int api__syntax_error(const struct json_reader *r, struct api_error *err);

int api__out_of_memory(struct api_error *err, const char *param);

/* Moves to the next member of the open object and identifies it among names: returns 1 with
 * *index set, 0 at the object's end, or an error code (syntax, unknown field, or a field seen
 * before, tracked in *seen). Each member costs one comparison per known name, so an object of
 * any size is refused at its first stranger or repeat. */
int api__next_field(struct json_reader *r, const char *const *names, int n, uint32_t *seen,
                    int *index, struct api_error *err);

struct body_reader *api__body_of(struct json_reader *r);

/* Starts reading a body that must be one JSON object. */
int api__begin_framed(struct body_reader *br, const struct api_body *b, struct api_error *err);

/* The JSON-only body of the functions without framing. */
int api__begin_body(struct body_reader *br, const char *body, size_t len, struct api_error *err);

/* After the object's closing brace: nothing but whitespace may follow, and a framed body's raw
 * part must have been taken whole by its tensors. */
int api__end_body(struct json_reader *r, struct api_error *err);

/* A value of the wrong JSON type for field `name`: invalid_request naming what was expected
 * (or invalid_json when the bytes are no value at all). */
int api__wrong_type(struct json_reader *r, const char *name, const char *expected,
                    struct api_error *err);

/* Consumes a null and returns true if the next value is one (an optional field left unset). */
bool api__take_null(struct json_reader *r);

int api__get_bool(struct json_reader *r, const char *name, bool *out, struct api_error *err);

int api__get_int(struct json_reader *r, const char *name, int64_t min, int64_t max, int64_t *out,
                 struct api_error *err);

/* A layer index: an integer >= 0 that must be one of the loaded layers. */
int api__get_layer(struct json_reader *r, const struct api_limits *lim, int32_t *out,
                   struct api_error *err);

/* A short string field decoded into out[0..size) (NUL-terminated; *len its length, which may
 * include NUL bytes). Longer strings are refused with `what`. */
int api__get_short_string(struct json_reader *r, const char *name, char *out, size_t size,
                          size_t *len, const char *what, struct api_error *err);

/* A session id, compared by its full decoded length: "a\u0000b" is not "a". */
int api__get_session_id(struct json_reader *r, const char *name, char *out, struct api_error *err);

int api__get_encoding(struct json_reader *r, enum api_encoding *out, struct api_error *err);

/* "binary_output": true answers with the binary tensor extension; encoding_format says how
 * tensors go into JSON, so the two together contradict each other. Applied once the body is
 * read (fields come in any order). */
int api__apply_binary_output(bool binary_output, uint32_t seen, int encoding_bit,
                             enum api_encoding *enc, struct api_error *err);

/* Puts prefix (and sep, if s is not empty) before the string s of a size-byte buffer, cutting
 * the end of s if it must. */
void api__prepend(char *s, size_t size, const char *prefix, const char *sep);

/* Frees p unless it lies in [lo, hi): a tensor read where it lies in the body (borrowed). */
void api__free_unborrowed(uintptr_t lo, uintptr_t hi, void *p);

/* ---- api_tensor.c: tensor fields (nested arrays, base64, binary parts) ---- */

/* A JSON number as the float32 it rounds to (to nearest), or false where that is infinite:
 * magnitudes up to FLT_MAX plus half its unit in the last place (2^103) round to FLT_MAX, so
 * FLT_MAX printed with 9 digits (3.40282347e+38, a little above it) reads back as itself. */
bool api__to_float32(double d, float *out);

/* Parses a tensor field (nested arrays or a base64 object) into a malloc'd array; dims gets its
 * shape. */
int api__parse_tensor(struct json_reader *r, const struct tensor_spec *s, float **out,
                      int64_t *dims, int *rank_out, struct api_error *err);

/* ---- api_inspect.c: selections, captures, the attention query ---- */

/* return_weights: true, false, or a selection. */
int api__parse_return_weights(struct json_reader *r, int32_t n_heads, int32_t max_seq, bool *flag,
                              struct api_selection *sel, struct api_error *err);

/* capture: an array of distinct names among q, k, v and head_out. */
int api__parse_capture(struct json_reader *r, uint32_t *out, struct api_error *err);

#endif
