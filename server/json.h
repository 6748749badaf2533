/* server/json.h: a strict JSON (RFC 8259) pull reader over one request body. The caller walks
 * the document it expects (object members, array elements, values) and the reader checks the
 * syntax as it goes: no tree is built, nothing is allocated, and every byte is looked at a
 * bounded number of times, so a parse costs time linear in what was read and memory only for
 * what the caller keeps. Strings are validated (escapes, UTF-8) and handed out as spans of the
 * body with their length, so a "\u0000" inside a key or an id is a byte like any other and never
 * ends the string early.
 *
 * A syntax error stops the reader: every later call fails too, and json_reader_error says what
 * and where. Errors of meaning (a string where a number belongs) are the caller's.
 *
 * Thread rule: a reader belongs to one thread; the functions are otherwise pure.
 */
#ifndef SERVER_JSON_H
#define SERVER_JSON_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define JSON_MAX_DEPTH 16

enum json_type {
    JSON_TYPE_INVALID = 0, /* end of the body, or a byte that cannot start a value */
    JSON_TYPE_NULL,
    JSON_TYPE_BOOL,
    JSON_TYPE_NUMBER,
    JSON_TYPE_STRING,
    JSON_TYPE_ARRAY,
    JSON_TYPE_OBJECT,
};

struct json_reader {
    const char *begin, *p, *end;
    int32_t depth;
    int32_t count[JSON_MAX_DEPTH]; /* members or elements read so far, per open container */
    bool is_failed;
    size_t error_at;        /* byte offset of the first syntax error */
    const char *error_what; /* what was wrong there (static text) */
};

/* A string as it sits in the body: the bytes between the quotes, still escaped. */
struct json_span {
    const char *text;
    size_t len;
    bool has_escapes; /* false: text is already the decoded string */
};

void json_reader_init(struct json_reader *r, const char *body, size_t len);

/* The type of the next value, judged by its first byte (after whitespace). Never fails by
 * itself; a value that turns out to be malformed fails when it is read. */
enum json_type json_peek(struct json_reader *r);

/* Containers. begin consumes '{' or '['. json_object_next moves to the next member: it returns
 * 1 with *key holding the member's name (the value comes next), 0 after consuming '}', or -1 on
 * a syntax error. json_array_next likewise returns 1 when an element comes next, 0 after ']'. */
int json_object_begin(struct json_reader *r);
int json_object_next(struct json_reader *r, struct json_span *key);
int json_array_begin(struct json_reader *r);
int json_array_next(struct json_reader *r);

/* Scalars: 0, or -1 on a syntax error (including a value of another type). Numbers are
 * converted with correct rounding (huge exponents give +-inf, which the caller may refuse). */
int json_read_number(struct json_reader *r, double *out);
int json_read_bool(struct json_reader *r, bool *out);
int json_read_null(struct json_reader *r);
int json_read_string(struct json_reader *r, struct json_span *out);

/* 0 if nothing but whitespace follows the value read last, else -1. */
int json_reader_finish(struct json_reader *r);

/* The first syntax error: its text and byte offset. Meaningful after a -1. */
const char *json_reader_error(const struct json_reader *r, size_t *at);

/* Decodes the span's escapes into out[0..cap): whole characters only, as many as fit. Returns
 * the decoded length; *is_whole (if not NULL) says whether the whole string fit (a cap of
 * s->len bytes is always enough). The span must come from json_read_string or
 * json_object_next. */
size_t json_span_decode(const struct json_span *s, char *out, size_t cap, bool *is_whole);

/* True if the decoded span equals the NUL-terminated `name`, length included. */
bool json_span_equals(const struct json_span *s, const char *name);

#endif /* SERVER_JSON_H */
