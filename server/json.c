/* server/json.c: the strict pull reader (see json.h). One pointer walks the body; containers keep
 * a count per depth so that separators are checked without recursion. Numbers take Clinger's
 * exact fast path (an integer mantissa below 2^53 times a power of ten below 10^23 is one
 * correctly rounded IEEE operation) and fall back to strtod for the rest.
 */
#include "json.h"

#include <stdlib.h>
#include <string.h>

#include "utf8.h"

/* Numbers longer than this are copied to the heap for strtod (a valid number may have any
 * number of digits). */
#define NUMBER_STACK_BYTES 128

static int fail(struct json_reader *r, const char *at, const char *what) {
    if (!r->is_failed) {
        r->is_failed = true;
        r->error_at = (size_t)(at - r->begin);
        r->error_what = what;
    }
    return -1;
}

static void skip_ws(struct json_reader *r) {
    const char *p = r->p;
    while (p < r->end && (*p == ' ' || *p == '\t' || *p == '\n' || *p == '\r')) {
        p++;
    }
    r->p = p;
}

void json_reader_init(struct json_reader *r, const char *body, size_t len) {
    memset(r, 0, sizeof *r);
    r->begin = r->p = body;
    r->end = body + len;
}

enum json_type json_peek(struct json_reader *r) {
    if (r->is_failed) {
        return JSON_TYPE_INVALID;
    }
    skip_ws(r);
    if (r->p == r->end) {
        return JSON_TYPE_INVALID;
    }
    switch (*r->p) {
    case 'n':
        return JSON_TYPE_NULL;
    case 't':
    case 'f':
        return JSON_TYPE_BOOL;
    case '"':
        return JSON_TYPE_STRING;
    case '[':
        return JSON_TYPE_ARRAY;
    case '{':
        return JSON_TYPE_OBJECT;
    default:
        return *r->p == '-' || (*r->p >= '0' && *r->p <= '9') ? JSON_TYPE_NUMBER
                                                              : JSON_TYPE_INVALID;
    }
}

/* Consumes byte c (after whitespace) or fails with `what`. */
static int expect(struct json_reader *r, char c, const char *what) {
    if (r->is_failed) {
        return -1;
    }
    skip_ws(r);
    if (r->p == r->end) {
        return fail(r, r->p, "unexpected end of the body");
    }
    if (*r->p != c) {
        return fail(r, r->p, what);
    }
    r->p++;
    return 0;
}

/* ---- strings -------------------------------------------------------------------------------- */

static int hex4(const char *p, const char *end, uint32_t *out) {
    if (end - p < 4) {
        return -1;
    }
    uint32_t v = 0;
    for (int i = 0; i < 4; i++) {
        char c = p[i];
        int d = c >= '0' && c <= '9'   ? c - '0'
                : c >= 'a' && c <= 'f' ? c - 'a' + 10
                : c >= 'A' && c <= 'F' ? c - 'A' + 10
                                       : -1;
        if (d < 0) {
            return -1;
        }
        v = v << 4 | (uint32_t)d;
    }
    *out = v;
    return 0;
}

/* Reads one \u escape (p at the 'u'), joining a surrogate pair; *cp gets the code point and
 * *next the byte after the escape(s). Lone surrogates are refused: they are not text. */
static int read_u_escape(const char *p, const char *end, uint32_t *cp, const char **next) {
    uint32_t hi;
    if (hex4(p + 1, end, &hi) != 0) {
        return -1;
    }
    p += 5;
    if (hi >= 0xDC00 && hi <= 0xDFFF) {
        return -1;
    }
    if (hi >= 0xD800 && hi <= 0xDBFF) {
        uint32_t lo;
        if (end - p < 6 || p[0] != '\\' || p[1] != 'u' || hex4(p + 2, end, &lo) != 0 ||
            lo < 0xDC00 || lo > 0xDFFF) {
            return -1;
        }
        p += 6;
        hi = 0x10000 + ((hi - 0xD800) << 10) + (lo - 0xDC00);
    }
    *cp = hi;
    *next = p;
    return 0;
}

int json_read_string(struct json_reader *r, struct json_span *out) {
    if (expect(r, '"', "expected a string") != 0) {
        return -1;
    }
    const char *start = r->p, *p = r->p, *end = r->end;
    bool has_escapes = false;
    for (;;) {
        /* The common case, plain ASCII text, in a tight loop. */
        while (p < end && (unsigned char)*p >= 0x20 && (unsigned char)*p < 0x80 && *p != '"' &&
               *p != '\\') {
            p++;
        }
        if (p == end) {
            return fail(r, p, "unterminated string");
        }
        unsigned char c = (unsigned char)*p;
        if (c == '"') {
            break;
        }
        if (c < 0x20) {
            return fail(r, p, "control character in a string (escape it)");
        }
        if (c == '\\') {
            has_escapes = true;
            if (p + 1 == end) {
                return fail(r, p, "unterminated string");
            }
            char e = p[1];
            if (e == 'u') {
                uint32_t cp;
                const char *next;
                if (read_u_escape(p + 1, end, &cp, &next) != 0) {
                    return fail(r, p, "bad \\u escape (4 hex digits; surrogates only in pairs)");
                }
                p = next;
            } else if (strchr("\"\\/bfnrt", e) != NULL && e != '\0') {
                p += 2;
            } else {
                return fail(r, p, "unknown escape in a string");
            }
            continue;
        }
        size_t n = utf8_seq_len((const unsigned char *)p, (size_t)(end - p));
        if (n == 0) {
            return fail(r, p, "invalid UTF-8 in a string");
        }
        p += n;
    }
    out->text = start;
    out->len = (size_t)(p - start);
    out->has_escapes = has_escapes;
    r->p = p + 1;
    return 0;
}

size_t json_span_decode(const struct json_span *s, char *out, size_t cap, bool *is_whole) {
    static const char from[] = "\"\\/bfnrt", to[] = "\"\\/\b\f\n\r\t";
    const char *p = s->text, *end = s->text + s->len;
    size_t n = 0;
    if (!s->has_escapes && s->len <= cap) {
        /* No escapes: the text is the string (a session id, a name), copied whole at once
         * rather than a character at a time (~40 instructions a character). */
        memcpy(out, p, s->len);
        p = end;
        n = s->len;
    }
    while (p < end) {
        char one[4];
        size_t len;
        const char *next;
        if (*p == '\\' && p[1] == 'u') {
            uint32_t cp = 0;
            next = end;
            read_u_escape(p + 1, end, &cp, &next); /* validated by json_read_string */
            len = utf8_put(cp, one);
        } else if (*p == '\\') {
            one[0] = to[strchr(from, p[1]) - from];
            len = 1;
            next = p + 2;
        } else {
            /* Unescaped text is valid UTF-8 (checked when read): copy whole characters. */
            len = utf8_seq_len((const unsigned char *)p, (size_t)(end - p));
            len = len > 0 ? len : 1;
            memcpy(one, p, len);
            next = p + len;
        }
        if (n + len > cap) {
            break;
        }
        memcpy(out + n, one, len);
        n += len;
        p = next;
    }
    if (is_whole != NULL) {
        *is_whole = p == end;
    }
    return n;
}

bool json_span_equals(const struct json_span *s, const char *name) {
    size_t n = strlen(name);
    if (!s->has_escapes) {
        return s->len == n && memcmp(s->text, name, n) == 0;
    }
    char buf[64];
    if (n > sizeof buf) {
        return false; /* no name compared against is that long */
    }
    bool is_whole;
    size_t m = json_span_decode(s, buf, n, &is_whole);
    return is_whole && m == n && memcmp(buf, name, n) == 0;
}

/* ---- containers ----------------------------------------------------------------------------- */

static int open_container(struct json_reader *r, char c, const char *what) {
    if (expect(r, c, what) != 0) {
        return -1;
    }
    if (r->depth == JSON_MAX_DEPTH) {
        return fail(r, r->p - 1, "nested too deeply");
    }
    r->count[r->depth++] = 0;
    return 0;
}

int json_object_begin(struct json_reader *r) {
    return open_container(r, '{', "expected an object");
}

int json_array_begin(struct json_reader *r) {
    return open_container(r, '[', "expected an array");
}

/* The separator before the next member or element, or the closing byte. Returns 1, 0 or -1 as
 * json_object_next does. */
static int next_item(struct json_reader *r, char close) {
    if (r->is_failed) {
        return -1;
    }
    skip_ws(r);
    if (r->p == r->end) {
        return fail(r, r->p, "unexpected end of the body");
    }
    if (r->depth == 0) {
        return fail(r, r->p, "no open object or array"); /* a caller's bug, refused safely */
    }
    int32_t *count = &r->count[r->depth - 1];
    if (*r->p == close) {
        r->p++;
        r->depth--;
        return 0;
    }
    if (*count > 0) {
        if (*r->p != ',') {
            return fail(r, r->p, close == '}' ? "expected ',' or '}'" : "expected ',' or ']'");
        }
        r->p++;
        skip_ws(r);
        if (r->p < r->end && *r->p == close) {
            return fail(r, r->p, "trailing comma");
        }
    }
    (*count)++;
    return 1;
}

int json_object_next(struct json_reader *r, struct json_span *key) {
    int rc = next_item(r, '}');
    if (rc != 1) {
        return rc;
    }
    if (json_read_string(r, key) != 0 || expect(r, ':', "expected ':' after a member name") != 0) {
        return -1;
    }
    return 1;
}

int json_array_next(struct json_reader *r) {
    return next_item(r, ']');
}

/* ---- scalars -------------------------------------------------------------------------------- */

/* Consumes the literal word (after whitespace) or fails. */
static int literal(struct json_reader *r, const char *word, const char *what) {
    if (r->is_failed) {
        return -1;
    }
    skip_ws(r);
    size_t n = strlen(word);
    if ((size_t)(r->end - r->p) < n || memcmp(r->p, word, n) != 0) {
        return fail(r, r->p, what);
    }
    r->p += n;
    return 0;
}

int json_read_bool(struct json_reader *r, bool *out) {
    if (json_peek(r) == JSON_TYPE_BOOL && *r->p == 't') {
        *out = true;
        return literal(r, "true", "expected true");
    }
    *out = false;
    return literal(r, "false", "expected true or false");
}

int json_read_null(struct json_reader *r) {
    return literal(r, "null", "expected null");
}

/* Exact powers of ten: every one up to 1e22 is a double. */
static const double pow10_exact[] = {1e0,  1e1,  1e2,  1e3,  1e4,  1e5,  1e6,  1e7,
                                     1e8,  1e9,  1e10, 1e11, 1e12, 1e13, 1e14, 1e15,
                                     1e16, 1e17, 1e18, 1e19, 1e20, 1e21, 1e22};

static bool is_digit(char c) {
    return c >= '0' && c <= '9';
}

/* strtod on a copy of [s, e): the body is not NUL-terminated at the number's end, and strtod
 * accepts more than JSON does (hex, inf), which the grammar check has already excluded. */
static int slow_number(struct json_reader *r, const char *s, const char *e, double *out) {
    size_t n = (size_t)(e - s);
    char stack[NUMBER_STACK_BYTES];
    char *buf = n < sizeof stack ? stack : malloc(n + 1);
    if (buf == NULL) {
        return fail(r, s, "out of memory reading a number");
    }
    memcpy(buf, s, n);
    buf[n] = '\0';
    *out = strtod(buf, NULL);
    if (buf != stack) {
        free(buf);
    }
    return 0;
}

int json_read_number(struct json_reader *r, double *out) {
    if (r->is_failed) {
        return -1;
    }
    skip_ws(r);
    const char *s = r->p, *p = r->p, *end = r->end;
    bool is_negative = p < end && *p == '-';
    p += is_negative;
    if (p == end || !is_digit(*p)) {
        return fail(r, p, "expected a number");
    }
    /* Up to 19 significant digits fit in the mantissa; more make the value inexact here. */
    uint64_t mant = 0;
    int n_sig = 0, exp10 = 0;
    bool is_inexact = false;
    if (*p == '0') {
        p++;
    } else {
        for (; p < end && is_digit(*p); p++) {
            if (n_sig < 19) {
                mant = mant * 10 + (uint64_t)(*p - '0');
                n_sig++;
            } else {
                exp10++;
                is_inexact = true;
            }
        }
    }
    if (p < end && *p == '.') {
        p++;
        if (p == end || !is_digit(*p)) {
            return fail(r, p, "expected a digit after '.'");
        }
        for (; p < end && is_digit(*p); p++) {
            if (mant == 0 && *p == '0') {
                exp10--; /* leading zeros of a fraction are not significant */
            } else if (n_sig < 19) {
                mant = mant * 10 + (uint64_t)(*p - '0');
                n_sig++;
                exp10--;
            } else {
                is_inexact = true;
            }
        }
    }
    if (p < end && (*p == 'e' || *p == 'E')) {
        p++;
        bool is_exp_negative = false;
        if (p < end && (*p == '+' || *p == '-')) {
            is_exp_negative = *p == '-';
            p++;
        }
        if (p == end || !is_digit(*p)) {
            return fail(r, p, "expected a digit in the exponent");
        }
        int e = 0;
        for (; p < end && is_digit(*p); p++) {
            if (e < 100000) {
                e = e * 10 + (*p - '0');
            }
        }
        exp10 += is_exp_negative ? -e : e;
    }
    r->p = p;
    double d = 0.0; /* set on every path; gcc 12 at -O1 cannot tell (-Werror builds failed) */
    if (mant == 0 && !is_inexact) {
        d = 0.0;
    } else if (!is_inexact && mant <= (UINT64_C(1) << 53) && exp10 >= -22 && exp10 <= 22) {
        d = exp10 < 0 ? (double)mant / pow10_exact[-exp10] : (double)mant * pow10_exact[exp10];
    } else {
        if (slow_number(r, s, p, &d) != 0) {
            return -1;
        }
        *out = d;
        return 0;
    }
    *out = is_negative ? -d : d;
    return 0;
}

/* ---- the end -------------------------------------------------------------------------------- */

int json_reader_finish(struct json_reader *r) {
    if (r->is_failed) {
        return -1;
    }
    skip_ws(r);
    return r->p == r->end ? 0 : fail(r, r->p, "data after the JSON value");
}

const char *json_reader_error(const struct json_reader *r, size_t *at) {
    *at = r->error_at;
    return r->is_failed ? r->error_what : "no error";
}
