/* server/api_inspect.c: what a request asks to see of its attention (see api.h and
 * api_int.h): return_weights as a selection of heads, rows and keys, capture, and the query of
 * GET /v1/sessions/{id}/attention; resolving a selection against a call's shape.
 */
#include "api_int.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "error.h"
#include "utf8.h"

/* ---- return_weights as a selection, capture ------------------------------------------------- */

/* Query heads a selection may name when the request's own count is not known yet (/v1/sdpa:
 * n_heads x n_q at most 2^24, attn_sdpa's limit); resolving checks them against q's. */
#define API_MAX_HEADS (1 << 24)

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
        return api__wrong_type(r, name, what, err);
    }
    /* grown as values come: the bound may be far above what a body holds */
    int32_t *a = NULL;
    json_array_begin(r);
    int32_t n = 0, cap = 0;
    int more, rc = 0;
    while (rc == 0 && (more = json_array_next(r)) == 1) {
        int64_t v;
        if (n == max_n) {
            rc = api__fail(err, ERROR_INVALID_REQUEST, name, "%s: more than %d values", name,
                           (int)max_n);
        } else if ((rc = api__get_int(r, name, min, max, &v, err)) == 0) {
            if (n == cap) {
                cap = cap > 0 ? (cap > max_n / 2 ? max_n : 2 * cap) : 16;
                int32_t *grown = realloc(a, (size_t)cap * sizeof *a);
                if (grown == NULL) {
                    rc = api__out_of_memory(err, name);
                    break;
                }
                a = grown;
            }
            a[n++] = (int32_t)v;
        }
    }
    if (rc == 0 && more < 0) {
        rc = api__syntax_error(r, err);
    }
    if (rc == 0 && n == 0) {
        rc = api__fail(err, ERROR_INVALID_REQUEST, name, "%s: empty (null selects all)", name);
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
    int rc = api__get_short_string(r, name, text, sizeof text, &len, what, err);
    if (rc != 0) {
        return rc;
    }
    for (int i = 0; i < n; i++) {
        if (len == strlen(names[i]) && memcmp(text, names[i], len) == 0) {
            *out = i;
            return 0;
        }
    }
    return api__fail(err, ERROR_INVALID_REQUEST, name, "%s: expected %s", name, what);
}

/* keys: [start, end], each an integer (negative: from the end of the key axis) or null. */
static int parse_key_range(struct json_reader *r, int32_t max_seq, struct api_selection *sel,
                           struct api_error *err) {
    static const char name[] = "return_weights.keys";
    static const char what[] = "[start, end]: two integers or nulls (a half-open range)";
    if (json_peek(r) != JSON_TYPE_ARRAY) {
        return api__wrong_type(r, name, what, err);
    }
    json_array_begin(r);
    int32_t n = 0;
    int more, rc = 0;
    while (rc == 0 && (more = json_array_next(r)) == 1) {
        int64_t v = 0;
        bool is_null = api__take_null(r);
        if (n == 2) {
            rc = api__fail(err, ERROR_INVALID_REQUEST, name, "%s: expected %s", name, what);
        } else if (is_null ||
                   (rc = api__get_int(r, name, -(int64_t)max_seq, max_seq, &v, err)) == 0) {
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
        rc = api__syntax_error(r, err);
    }
    if (rc == 0 && n != 2) {
        rc = api__fail(err, ERROR_INVALID_REQUEST, name, "%s: expected %s", name, what);
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
    while ((rc = api__next_field(r, names, 5, &seen, &index, err)) == 1) {
        if (api__take_null(r)) {
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

int api__parse_return_weights(struct json_reader *r, int32_t n_heads, int32_t max_seq, bool *flag,
                              struct api_selection *sel, struct api_error *err) {
    if (json_peek(r) == JSON_TYPE_OBJECT) {
        *flag = true;
        int rc = parse_selection(r, n_heads, max_seq, sel, err);
        if (rc != 0 && strncmp(err->param, "return_weights", 14) != 0) {
            /* next_field names a stranger or a repeat bare: say where it sits */
            api__prepend(err->param, sizeof err->param, "return_weights", ".");
            api__prepend(err->message, sizeof err->message, "return_weights", ": ");
        }
        return rc;
    }
    if (json_peek(r) != JSON_TYPE_BOOL) {
        return api__wrong_type(r, "return_weights", "true, false or a selection object", err);
    }
    return json_read_bool(r, flag) == 0 ? 0 : api__syntax_error(r, err);
}

int api__parse_capture(struct json_reader *r, uint32_t *out, struct api_error *err) {
    static const char *const names[] = {"q", "k", "v", "head_out"};
    if (json_peek(r) != JSON_TYPE_ARRAY) {
        return api__wrong_type(r, "capture", "an array of \"q\", \"k\", \"v\", \"head_out\"", err);
    }
    json_array_begin(r);
    int more, rc = 0, i = 0;
    while (rc == 0 && (more = json_array_next(r)) == 1) {
        if ((rc = get_choice(r, "capture", names, 4, &i, err)) == 0) {
            if (*out & (1u << i)) {
                rc = api__fail(err, ERROR_INVALID_REQUEST, "capture",
                               "capture: \"%s\" appears twice", names[i]);
            }
            *out |= 1u << i;
        }
    }
    if (rc == 0 && more < 0) {
        rc = api__syntax_error(r, err);
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
    return api__fail(err, ERROR_INVALID_REQUEST, param,
                     "%s: [%lld, %lld) is a part of the %d keys; an lse is over all the keys a row "
                     "sees (leave keys out)",
                     param, (long long)start, (long long)end, (int)n_keys);
}

int api_selection_resolve(struct api_selection *sel, int32_t n_heads, int32_t n_rows,
                          int32_t n_keys, int64_t n_batch, struct api_error *err) {
    for (int32_t i = 0; i < sel->n_heads; i++) {
        int32_t v = sel->heads[i] < 0 ? sel->heads[i] + n_heads : sel->heads[i];
        if (v < 0 || v >= n_heads) {
            return api__fail(err, ERROR_INVALID_REQUEST, "return_weights.heads",
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
            return api__out_of_memory(err, "return_weights");
        }
        for (int32_t i = 0; i < n_rows; i++) {
            sel->rows[i] = i;
        }
        sel->n_rows = n_rows;
    }
    for (int32_t i = 0; i < sel->n_rows; i++) {
        int32_t v = sel->rows[i] < 0 ? sel->rows[i] + n_rows : sel->rows[i];
        if (v < 0 || v >= n_rows) {
            return api__fail(err, ERROR_INVALID_REQUEST, "return_weights.rows",
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
        return api__fail(err, ERROR_INVALID_REQUEST, "return_weights.keys",
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
        return api__fail(err, ERROR_INVALID_REQUEST, "return_weights",
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
        return api__fail(err, ERROR_INVALID_REQUEST, shown,
                         "unknown query parameter '%s' (layer, heads, rows, keys, kind, reduce)",
                         shown);
    }
    if (r->seen & (1u << i)) {
        return api__fail(err, ERROR_INVALID_REQUEST, name, "%s: given twice", name);
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
            return api__fail(err, ERROR_INVALID_REQUEST, "layer",
                             "layer: expected one of the loaded layers %d-%d",
                             (int)lim->layer_first, (int)(lim->layer_first + lim->layer_count - 1));
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
            return api__fail(err, ERROR_INVALID_REQUEST, name, "%s: longer than %zu characters",
                             name, cap - 1);
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
        return api__fail(err, ERROR_INVALID_REQUEST, name, "%s: expected %s", name,
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
        return api__out_of_memory(err, name);
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
            return api__fail(err, ERROR_INVALID_REQUEST, name,
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
        rc = api__fail(err, ERROR_INVALID_REQUEST, "heads", "heads: none selected");
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
            rc = api__fail(err, ERROR_INVALID_REQUEST, "keys",
                           "keys: '%s' is not a range a:b of the cache's %d keys", r->keys,
                           (int)n_tokens);
        } else if (r->kind == ATTN_INSPECT_LSE && (k0 != 0 || k1 != n_tokens)) {
            rc = lse_of_part(err, "keys", k0, k1, n_tokens);
        }
        sel->key_first = (int32_t)k0;
        sel->n_keys = (int32_t)(k1 - k0);
    }
    if (rc == 0 && api_selection_values(sel, n_heads) > API_WEIGHTS_MAX_VALUES) {
        rc = api__fail(err, ERROR_INVALID_REQUEST, "rows",
                       "rows: the selection holds %lld values, over the limit of %d; select fewer "
                       "heads, rows or keys",
                       (long long)api_selection_values(sel, n_heads), API_WEIGHTS_MAX_VALUES);
    }
    if (rc != 0) {
        api_selection_release(sel);
    }
    return rc;
}
