/* engine/hf_fields.c: config.json's typed fields, read as the Python config classes hold them:
 * an optional field absent or null leaves the caller's default, and a value of the wrong type or
 * range is refused naming the key rather than coerced. */
#include "hf_int.h"

#include <errno.h>
#include <math.h>
#include <string.h>

/* Reads an optional integer field; absent or null leaves *out as is. */
int attn__hf_get_int(const struct attn__reason *why, const cJSON *obj, const char *key,
                     int32_t *out) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(obj, key);
    if (v == NULL || cJSON_IsNull(v)) {
        return ATTN_OK;
    }
    if (!cJSON_IsNumber(v) || v->valuedouble != floor(v->valuedouble) || v->valuedouble < 0 ||
        v->valuedouble > INT32_MAX) {
        return attn__fail(why, ATTN_EIO, "config.json: %s must be a non-negative integer", key);
    }
    *out = (int32_t)v->valuedouble;
    return ATTN_OK;
}

/* get_int of key, or of alias (a name the config class maps onto key; NULL: none); both present
 * and different is ambiguous. */
int attn__hf_get_int_either(const struct attn__reason *why, const cJSON *obj, const char *key,
                            const char *alias, int32_t *out) {
    int rc = attn__hf_get_int(why, obj, key, out);
    const cJSON *a = alias != NULL ? cJSON_GetObjectItemCaseSensitive(obj, alias) : NULL;
    if (rc != ATTN_OK || a == NULL || cJSON_IsNull(a)) {
        return rc;
    }
    int32_t value = 0;
    if ((rc = attn__hf_get_int(why, obj, alias, &value)) != ATTN_OK) {
        return rc;
    }
    const cJSON *k = cJSON_GetObjectItemCaseSensitive(obj, key);
    if (k != NULL && !cJSON_IsNull(k) && value != *out) {
        return attn__fail(why, ATTN_EIO, "config.json: %s and %s differ", key, alias);
    }
    *out = value;
    return ATTN_OK;
}

/* get_double narrowed to float; a value float cannot hold (beyond 3.4e38) is refused rather than
 * taken as infinity (a rope_theta of 1e300 would stop every rotation). */
int attn__hf_get_float(const struct attn__reason *why, const cJSON *obj, const char *key,
                       float *out) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(obj, key);
    if (v == NULL || cJSON_IsNull(v)) {
        return ATTN_OK; /* *out may hold a default float cannot narrow from double: leave it */
    }
    double value = 0;
    int rc = attn__hf_get_double(why, obj, key, &value);
    if (rc != ATTN_OK) {
        return rc;
    }
    if (!isfinite((float)value)) {
        return attn__fail(why, ATTN_EIO, "config.json: %s %g is beyond float's range", key, value);
    }
    *out = (float)value;
    return ATTN_OK;
}

/* Reads an optional number as the double Python holds (a rotary factor is multiplied in double
 * and floored, where a float's rounding could lose a dim); absent or null leaves *out as is. */
int attn__hf_get_double(const struct attn__reason *why, const cJSON *obj, const char *key,
                        double *out) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(obj, key);
    if (v == NULL || cJSON_IsNull(v)) {
        return ATTN_OK;
    }
    if (!cJSON_IsNumber(v) || !isfinite(v->valuedouble)) {
        return attn__fail(why, ATTN_EIO, "config.json: %s must be a number", key);
    }
    *out = v->valuedouble;
    return ATTN_OK;
}

int attn__hf_get_bool(const struct attn__reason *why, const cJSON *obj, const char *key,
                      bool *out) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(obj, key);
    if (v == NULL || cJSON_IsNull(v)) {
        return ATTN_OK;
    }
    if (!cJSON_IsBool(v)) {
        return attn__fail(why, ATTN_EIO, "config.json: %s must be true or false", key);
    }
    *out = cJSON_IsTrue(v);
    return ATTN_OK;
}

/* Whether the JSON text holds a \u0000 escape (an escaped backslash before "u0000" is not one). */
static bool has_nul_escape(const char *s, size_t len) {
    for (size_t i = 0; i + 1 < len; i++) {
        if (s[i] != '\\') {
            continue;
        }
        if (s[i + 1] == 'u' && i + 5 < len && memcmp(s + i + 2, "0000", 4) == 0) {
            return true;
        }
        i++; /* the escaped character, whatever it is */
    }
    return false;
}

/* Whether s[i..n) starts a number JSON's grammar allows, -?(0|[1-9][0-9]*)(.[0-9]+)?
 * ([eE][+-]?[0-9]+)?, ending where the token of number characters ends: cJSON takes any run
 * strtod reads ("0500", "5.", "1.e5"), which Python's json and serde_json (the safetensors
 * reader) refuse. */
static bool is_json_number(const char *s, size_t i, size_t n, size_t *next) {
    size_t j = i;
    j += j < n && s[j] == '-';
    if (j < n && s[j] == '0') {
        j++;
    } else if (j < n && s[j] >= '1' && s[j] <= '9') {
        while (j < n && s[j] >= '0' && s[j] <= '9') {
            j++;
        }
    } else {
        return false;
    }
    if (j < n && s[j] == '.') {
        size_t d = ++j;
        while (j < n && s[j] >= '0' && s[j] <= '9') {
            j++;
        }
        if (j == d) {
            return false;
        }
    }
    if (j < n && (s[j] == 'e' || s[j] == 'E')) {
        j++;
        j += j < n && (s[j] == '+' || s[j] == '-');
        size_t d = j;
        while (j < n && s[j] >= '0' && s[j] <= '9') {
            j++;
        }
        if (j == d) {
            return false;
        }
    }
    size_t end = j;
    while (end < n && strchr("0123456789+-.eE", s[end]) != NULL && s[end] != '\0') {
        end++;
    }
    *next = end;
    return end == j; /* the whole run of number characters is the number */
}

/* What Python's json (strict) refuses and cJSON takes, outside the \u0000 escape: a number off
 * JSON's grammar, or a raw control character inside a string or between values (cJSON skips
 * every byte up to 0x20 as a blank). NULL when there is none. */
static const char *lenient_json(const char *s, size_t n) {
    bool in_string = false;
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        if (in_string) {
            if (c == '\\') {
                i++;
            } else if (c == '"') {
                in_string = false;
            } else if (c < 0x20) {
                return "a control character inside a string (write it as an escape)";
            }
        } else if (c == '"') {
            in_string = true;
        } else if (c < 0x20 && c != '\t' && c != '\n' && c != '\r') {
            return "a control character between values (JSON's blanks are space, tab, CR, LF)";
        } else if (c == '-' || (c >= '0' && c <= '9')) {
            size_t next = i;
            if (!is_json_number(s, i, n, &next)) {
                return "a number JSON does not allow (a leading zero, or a point without digits)";
            }
            i = next - 1;
        }
    }
    return NULL;
}

const char attn__hf_json_no_memory[] = "out of memory reading it";

cJSON *attn__hf_json_object(const char *text, size_t len, const char **problem) {
    const char *end = NULL;
    errno = 0;
    cJSON *j = cJSON_ParseWithLengthOpts(text, len, &end, false);
    if (j == NULL && errno == ENOMEM) {
        /* cJSON says NULL alike for bad JSON and for a failed allocation; malloc's errno tells
         * them apart (a file short of memory is not a malformed one) */
        *problem = attn__hf_json_no_memory;
        return NULL;
    }
    if (j == NULL || !cJSON_IsObject(j)) {
        cJSON_Delete(j);
        *problem = "not a JSON object";
        return NULL;
    }
    for (const char *p = end; p != NULL && p < text + len; p++) {
        if (*p != ' ' && *p != '\t' && *p != '\n' && *p != '\r') {
            cJSON_Delete(j);
            *problem = "more than one JSON value (bytes after the object)";
            return NULL;
        }
    }
    if (has_nul_escape(text, len)) {
        cJSON_Delete(j);
        *problem = "a \\u0000 escape, which would cut a key or string short";
        return NULL;
    }
    if ((*problem = lenient_json(text, len)) != NULL) {
        cJSON_Delete(j);
        return NULL;
    }
    return j;
}
