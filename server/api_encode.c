/* server/api_encode.c: the response half of the JSON edge (see api.h): C structs to response
 * bodies and stream events, written by hand into a strbuf rather than through a cJSON tree,
 * because tensors dominate the bodies and a tree would cost one allocation per number. Request
 * parsing is in api.c.
 */
#include "api.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "b64.h"
#include "error.h"
#include "utf8.h"

/* ---- encoding helpers ----------------------------------------------------------------------- */

/* A JSON string. Control bytes are escaped, and any byte that does not start a well-formed
 * UTF-8 character (a message cut inside one, a client's invalid bytes) becomes U+FFFD, so every
 * body attnd sends is valid UTF-8 JSON whatever text it echoes. */
static void put_string(struct strbuf *b, const char *s) {
    strbuf_putc(b, '"');
    const unsigned char *p = (const unsigned char *)s;
    size_t n = strlen(s);
    for (size_t i = 0; i < n;) {
        /* a run of plain ASCII goes in one append (a session id whole), not a byte at a time */
        size_t run = i;
        while (run < n && p[run] >= 0x20 && p[run] < 0x80 && p[run] != '"' && p[run] != '\\') {
            run++;
        }
        if (run > i) {
            strbuf_append(b, s + i, run - i);
            i = run;
            continue;
        }
        unsigned char c = p[i];
        if (c == '"' || c == '\\') {
            strbuf_putc(b, '\\');
            strbuf_putc(b, (char)c);
        } else if (c == '\n') {
            strbuf_puts(b, "\\n");
        } else if (c == '\r') {
            strbuf_puts(b, "\\r");
        } else if (c == '\t') {
            strbuf_puts(b, "\\t");
        } else if (c < 0x20) {
            strbuf_printf(b, "\\u%04x", c);
        } else if (c >= 0x80) {
            size_t len = utf8_seq_len(p + i, n - i);
            if (len == 0) {
                strbuf_puts(b, "\xEF\xBF\xBD");
                i++;
            } else {
                strbuf_append(b, s + i, len);
                i += len;
            }
            continue;
        }
        i++;
    }
    strbuf_putc(b, '"');
}

static void put_string_or_null(struct strbuf *b, const char *s) {
    if (s == NULL) {
        strbuf_puts(b, "null");
    } else {
        put_string(b, s);
    }
}

/* %.9g round-trips every float32; JSON has no non-finite numbers, so they become null. */
static void put_float(struct strbuf *b, float f) {
    if (!isfinite(f)) {
        strbuf_puts(b, "null");
        return;
    }
    if (strbuf_reserve(b, 24) != 0) {
        return;
    }
    int n = snprintf(b->data + b->len, 24, "%.9g", (double)f);
    if (n > 0 && n < 24) {
        b->len += (size_t)n;
    }
}

static void put_nested(struct strbuf *b, const float *data, int rank, const int64_t *dims) {
    if (rank == 1) {
        strbuf_putc(b, '[');
        for (int64_t i = 0; i < dims[0]; i++) {
            if (i > 0) {
                strbuf_putc(b, ',');
            }
            put_float(b, data[i]);
        }
        strbuf_putc(b, ']');
        return;
    }
    int64_t inner = 1;
    for (int d = 1; d < rank; d++) {
        inner *= dims[d];
    }
    strbuf_putc(b, '[');
    for (int64_t i = 0; i < dims[0]; i++) {
        if (i > 0) {
            strbuf_putc(b, ',');
        }
        put_nested(b, data + i * inner, rank - 1, dims + 1);
    }
    strbuf_putc(b, ']');
}

static void put_b64(struct strbuf *b, const float *data, int rank, const int64_t *dims) {
    int64_t total = 1;
    strbuf_puts(b, "{\"shape\":[");
    for (int d = 0; d < rank; d++) {
        strbuf_printf(b, d > 0 ? ",%lld" : "%lld", (long long)dims[d]);
        total *= dims[d];
    }
    strbuf_puts(b, "],\"b64\":\"");
    size_t bytes = (size_t)total * 4;
    if (strbuf_reserve(b, b64_encoded_len(bytes)) != 0) {
        return;
    }
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
    b64_encode((const uint8_t *)data, bytes, b->data + b->len);
#else
    uint8_t *le = malloc(bytes ? bytes : 1);
    if (le == NULL) {
        b->has_failed = true;
        return;
    }
    for (int64_t i = 0; i < total; i++) {
        uint32_t u;
        memcpy(&u, &data[i], 4);
        le[i * 4] = (uint8_t)u;
        le[i * 4 + 1] = (uint8_t)(u >> 8);
        le[i * 4 + 2] = (uint8_t)(u >> 16);
        le[i * 4 + 3] = (uint8_t)(u >> 24);
    }
    b64_encode(le, bytes, b->data + b->len);
    free(le);
#endif
    b->len += b64_encoded_len(bytes);
    strbuf_puts(b, "\"}");
}

static void put_tensor(struct strbuf *b, const char *name, const float *data, int rank,
                       const int64_t *dims, enum api_encoding enc, struct api_raw_parts *raw) {
    strbuf_putc(b, '"');
    strbuf_puts(b, name);
    strbuf_puts(b, "\":");
    if (enc == API_ENCODING_BINARY && raw != NULL && raw->n < API_RAW_PARTS_MAX) {
        int64_t total = 1;
        strbuf_puts(b, "{\"shape\":[");
        for (int d = 0; d < rank; d++) {
            if (d > 0) {
                strbuf_putc(b, ',');
            }
            strbuf_put_int(b, (long long)dims[d]);
            total *= dims[d];
        }
        strbuf_puts(b, "],\"datatype\":\"FP32\",\"binary_data_size\":");
        strbuf_put_int(b, (long long)total * 4);
        strbuf_putc(b, '}');
        raw->data[raw->n] = data;
        raw->bytes[raw->n++] = (size_t)total * 4;
    } else if (enc == API_ENCODING_BASE64) {
        put_b64(b, data, rank, dims);
    } else {
        put_nested(b, data, rank, dims);
    }
}

/* The answer: the JSON in b, then (binary extension) the raw tensors, as one malloc'd buffer;
 * *json_len (if not NULL) gets the JSON's length, which the Inference-Header-Content-Length
 * header carries. */
static char *finish(struct strbuf *b, const struct api_raw_parts *raw, size_t *len,
                    size_t *json_len) {
    size_t n_json = b->len, total = b->len;
    for (int i = 0; i < raw->n; i++) {
        total += raw->bytes[i];
    }
    if (json_len != NULL) {
        *json_len = n_json;
    }
    if (raw->n == 0 || strbuf_reserve(b, total - n_json) != 0) {
        return strbuf_detach(b, len);
    }
    for (int i = 0; i < raw->n; i++) {
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
        memcpy(b->data + b->len, raw->data[i], raw->bytes[i]);
#else
        for (size_t j = 0; j < raw->bytes[i] / 4; j++) {
            uint32_t u;
            memcpy(&u, &raw->data[i][j], 4);
            uint8_t *p = (uint8_t *)b->data + b->len + j * 4;
            p[0] = (uint8_t)u, p[1] = (uint8_t)(u >> 8), p[2] = (uint8_t)(u >> 16);
            p[3] = (uint8_t)(u >> 24);
        }
#endif
        b->len += raw->bytes[i];
    }
    b->data[b->len] = '\0';
    return strbuf_detach(b, len);
}

/* Whether an answer's tensors may stay where they are, listed in keep for the caller to send
 * after the JSON: a binary answer on a little-endian host (the wire's bytes are little-endian:
 * elsewhere a copy swaps them). */
bool api_tensors_go_apart(enum api_encoding enc) {
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
    return enc == API_ENCODING_BINARY;
#else
    return false;
#endif
}

static bool keeps_tensors(struct api_raw_parts *keep, enum api_encoding enc) {
    if (keep != NULL) {
        keep->n = 0;
    }
    return keep != NULL && api_tensors_go_apart(enc);
}

/* The answer in b with its tensors raw: listed in *keep when is_kept, else appended (finish). */
static char *finish_or_keep(struct strbuf *b, const struct api_raw_parts *raw, bool is_kept,
                            struct api_raw_parts *keep, size_t *len, size_t *json_len) {
    if (!is_kept) {
        return finish(b, raw, len, json_len);
    }
    *keep = *raw;
    if (json_len != NULL) {
        *json_len = b->len;
    }
    return strbuf_detach(b, len);
}

static void put_timing(struct strbuf *b, const struct api_timing *t) {
    strbuf_puts(b, ",\"timing\":{\"queue_ms\":");
    strbuf_put_fixed3(b, t->queue_ms);
    strbuf_puts(b, ",\"compute_ms\":");
    strbuf_put_fixed3(b, t->compute_ms);
    strbuf_putc(b, '}');
}

/* The values of a selection under the name of their kind, shaped ([n_batch,] [H',] R [, K])
 * with H' dropped when reduced over heads. */
static void put_selected(struct strbuf *b, const struct api_selection *sel, const float *values,
                         int32_t n_heads, int64_t n_batch, enum api_encoding enc,
                         struct api_raw_parts *raw) {
    static const char *const names[] = {"weights", "scores", "lse"};
    int64_t dims[4];
    int rank = 0;
    if (n_batch > 0) {
        dims[rank++] = n_batch;
    }
    if (sel->reduce == ATTN_REDUCE_NONE) {
        dims[rank++] = sel->heads != NULL ? sel->n_heads : n_heads;
    }
    dims[rank++] = sel->n_rows;
    if (sel->kind != ATTN_INSPECT_LSE) {
        dims[rank++] = sel->n_keys;
    }
    put_tensor(b, names[sel->kind], values, rank, dims, enc, raw);
}

/* "kind":..,"reduce":..,"heads":[..],"rows":[..],"keys":[first,end]: what a selection is. */
static void put_selection_fields(struct strbuf *b, const struct api_selection *sel,
                                 int32_t n_heads) {
    static const char *const kinds[] = {"probs", "scores", "lse"};
    static const char *const reduces[] = {"none", "mean_heads", "max_heads"};
    strbuf_printf(b, "\"kind\":\"%s\",\"reduce\":\"%s\",\"heads\":[", kinds[sel->kind],
                  reduces[sel->reduce]);
    int32_t nh = sel->heads != NULL ? sel->n_heads : n_heads;
    for (int32_t i = 0; i < nh; i++) {
        strbuf_printf(b, i > 0 ? ",%d" : "%d", (int)(sel->heads != NULL ? sel->heads[i] : i));
    }
    strbuf_puts(b, "],\"rows\":[");
    for (int32_t i = 0; i < sel->n_rows; i++) {
        strbuf_printf(b, i > 0 ? ",%d" : "%d", (int)sel->rows[i]);
    }
    strbuf_printf(b, "],\"keys\":[%d,%d]", (int)sel->key_first,
                  (int)(sel->key_first + sel->n_keys));
}

/* A selection's values (return_weights as an object), under the name of their kind, shaped
 * ([n_batch,] [H',] R [, K]) with H' dropped when reduced over heads; then "selection" saying
 * what they are: kind, reduce, the heads, the rows and the key range [first, end). */
static void put_selection(struct strbuf *b, const struct api_selection *sel, const float *values,
                          int32_t n_heads, int64_t n_batch, enum api_encoding enc,
                          struct api_raw_parts *raw) {
    strbuf_putc(b, ',');
    put_selected(b, sel, values, n_heads, n_batch, enc, raw);
    strbuf_puts(b, ",\"selection\":{");
    put_selection_fields(b, sel, n_heads);
    strbuf_putc(b, '}');
}

/* capture: {"q": ..., "k": ..., "v": ..., "head_out": ...}, the ones asked. */
static void put_captures(struct strbuf *b, const struct api_attend_response *r,
                         struct api_raw_parts *raw) {
    const float *t[4] = {r->capture_q, r->capture_k, r->capture_v, r->capture_head_out};
    static const char *const names[] = {"q", "k", "v", "head_out"};
    int32_t heads[4] = {r->n_heads, r->n_kv_heads, r->n_kv_heads, r->n_heads};
    int32_t width[4] = {r->head_dim, r->head_dim, r->head_dim, r->d_v};
    bool any = false;
    for (int i = 0; i < 4; i++) {
        if (t[i] == NULL) {
            continue;
        }
        strbuf_puts(b, any ? "," : ",\"capture\":{");
        any = true;
        int64_t dims[3] = {heads[i], r->n_new, width[i]};
        put_tensor(b, names[i], t[i], 3, dims, r->encoding, raw);
    }
    if (any) {
        strbuf_putc(b, '}');
    }
}

/* ---- responses ------------------------------------------------------------------------------ */

char *api_attend_response_encode(const struct api_attend_response *r, size_t *len, size_t *json_len,
                                 struct api_raw_parts *keep) {
    return api_attend_response_encode_in(NULL, r, len, json_len, keep);
}

char *api_attend_response_encode_in(struct strbuf *room, const struct api_attend_response *r,
                                    size_t *len, size_t *json_len, struct api_raw_parts *keep) {
    struct strbuf b;
    struct api_raw_parts raw = {{NULL}, {0}, 0};
    strbuf_init(&b);
    if (room != NULL) {
        b = *room;
        strbuf_init(room);
        b.len = 0;
    }
    bool is_kept = keeps_tensors(keep, r->encoding);
    strbuf_reserve(&b, (size_t)r->n_new * (size_t)r->hidden_size *
                               (r->encoding == API_ENCODING_BINARY ? (is_kept ? 0 : 4) : 14) +
                           256);
    strbuf_puts(&b, "{\"session_id\":");
    put_string_or_null(&b, r->session_id);
    strbuf_puts(&b, ",\"layer\":");
    strbuf_put_int(&b, r->layer);
    strbuf_puts(&b, ",\"n_past\":");
    strbuf_put_int(&b, r->n_past);
    strbuf_puts(&b, ",\"n_tokens\":");
    strbuf_put_int(&b, r->n_tokens);
    if (r->is_cross) {
        strbuf_printf(&b, ",\"context_tokens\":%d", (int)r->context_tokens);
    }
    int64_t od[3] = {r->n_new, r->hidden_size, 0};
    if (r->is_per_head) {
        od[0] = r->n_heads, od[1] = r->n_new, od[2] = r->head_dim;
    }
    strbuf_putc(&b, ',');
    put_tensor(&b, "output", r->output, r->is_per_head ? 3 : 2, od, r->encoding, &raw);
    if (r->weights != NULL) {
        int64_t wd[3] = {r->n_heads, r->n_new, r->is_cross ? r->context_tokens : r->n_tokens};
        strbuf_putc(&b, ',');
        put_tensor(&b, "weights", r->weights, 3, wd, r->encoding, &raw);
    }
    if (r->sel != NULL) {
        put_selection(&b, r->sel, r->selected, r->n_heads, 0, r->encoding, &raw);
    }
    put_captures(&b, r, &raw);
    put_timing(&b, &r->timing);
    strbuf_puts(&b, "}\n");
    return finish_or_keep(&b, &raw, is_kept, keep, len, json_len);
}

size_t api_answer_bytes_bound(int64_t n_values, int64_t n_ints, size_t id_len,
                              enum api_encoding enc) {
    /* a value: JSON's %.9g is at most 15 characters ("-1.23456789e-38"), with its comma and
     * its share of the brackets at most 20, and put_float asks 24 free for the last one; base64
     * 4/3 of 4 bytes and its padding; framed, nothing where the raw parts go out from the
     * caller's buffers (api_tensors_go_apart: room there was address space never written, 32-64
     * MB more for a 30 MB answer), else the 4 bytes each is copied as. An integer at most 11
     * digits and a comma; the id escaped at most 6 bytes a byte (\u00XX); the names, shapes and
     * timing well under 1 KiB. */
    size_t per_value = enc == API_ENCODING_BINARY   ? (api_tensors_go_apart(enc) ? 0 : 4)
                       : enc == API_ENCODING_BASE64 ? 6
                                                    : 20;
    return (size_t)n_values * per_value + (size_t)n_ints * 12 + id_len * 6 + 1024;
}

void api_stream_event_encode(struct strbuf *out, const struct api_stream_event *e) {
    strbuf_printf(out, "data: {\"index\":%d,\"position\":%d,\"n_past\":%d", (int)e->index,
                  (int)e->position, (int)e->n_past);
    int64_t od[1] = {e->hidden_size};
    strbuf_putc(out, ',');
    put_tensor(out, "output", e->output, 1, od, e->encoding, NULL);
    if (e->weights != NULL) {
        int64_t wd[2] = {e->n_heads, (int64_t)e->n_past + 1};
        strbuf_putc(out, ',');
        put_tensor(out, "weights", e->weights, 2, wd, e->encoding, NULL);
    }
    strbuf_puts(out, "}\n\n");
}

void api_stream_usage_encode(struct strbuf *out, const struct api_attend_response *r) {
    strbuf_puts(out, "data: {\"session_id\":");
    put_string_or_null(out, r->session_id);
    strbuf_printf(out, ",\"layer\":%d,\"n_past\":%d,\"n_tokens\":%d,\"usage\":{\"tokens\":%d}",
                  (int)r->layer, (int)r->n_past, (int)r->n_tokens, (int)r->n_new);
    put_timing(out, &r->timing);
    strbuf_puts(out, "}\n\ndata: [DONE]\n\n");
}

/* The "error" member of an Error object, for put_error and a batch's failed step. */
static void put_error_member(struct strbuf *b, int code, const char *message, const char *param) {
    const struct error_info *e = error_info_get(code);
    strbuf_puts(b, "\"error\":{\"message\":");
    put_string(b, message != NULL && message[0] ? message : e->message);
    strbuf_puts(b, ",\"type\":");
    put_string(b, e->type);
    strbuf_puts(b, ",\"code\":");
    put_string(b, e->name);
    strbuf_puts(b, ",\"param\":");
    put_string_or_null(b, param != NULL && param[0] ? param : NULL);
    strbuf_putc(b, '}');
}

static void put_error(struct strbuf *b, int code, const char *message, const char *param) {
    strbuf_putc(b, '{');
    put_error_member(b, code, message, param);
    strbuf_putc(b, '}');
}

void api_stream_error_encode(struct strbuf *out, int code, const char *message, const char *param) {
    strbuf_puts(out, "data: ");
    put_error(out, code, message, param);
    strbuf_puts(out, "\n\ndata: [DONE]\n\n");
}

char *api_error_encode(int code, const char *message, const char *param, size_t *len) {
    struct strbuf b;
    strbuf_init(&b);
    put_error(&b, code, message, param);
    strbuf_putc(&b, '\n');
    return strbuf_detach(&b, len);
}

void api_batch_open(struct strbuf *out, int32_t layer) {
    strbuf_printf(out, "{\"layer\":%d,\"results\":[", (int)layer);
}

void api_batch_error_put(struct strbuf *out, const char *session_id, int code, const char *message,
                         const char *param) {
    strbuf_puts(out, "{\"session_id\":");
    put_string_or_null(out, session_id != NULL && session_id[0] ? session_id : NULL);
    strbuf_printf(out, ",\"status\":%d,", error_info_get(code)->http_status);
    /* written straight into out, whose room was taken before the steps ran (a buffer of its own
     * here was one more allocation after them) */
    put_error_member(out, code, message, param);
    strbuf_putc(out, '}');
}

void api_batch_close(struct strbuf *out) {
    strbuf_puts(out, "]}\n");
}

char *api_attention_response_encode(const struct api_attention_response *r, size_t *len) {
    struct strbuf b;
    strbuf_init(&b);
    strbuf_puts(&b, "{\"session_id\":");
    put_string(&b, r->session_id);
    strbuf_printf(&b, ",\"layer\":%d,\"n_tokens\":%d,\"first_row\":%d,", (int)r->layer,
                  (int)r->n_tokens, (int)r->first_row);
    put_selection_fields(&b, r->sel, r->n_heads);
    strbuf_putc(&b, ',');
    put_selected(&b, r->sel, r->values, r->n_heads, 0, API_ENCODING_FLOAT, NULL);
    strbuf_puts(&b, "}\n");
    return strbuf_detach(&b, len);
}

char *api_sdpa_response_encode(const struct api_sdpa_response *r, size_t *len, size_t *json_len,
                               struct api_raw_parts *keep) {
    struct strbuf b;
    struct api_raw_parts raw = {{NULL}, {0}, 0};
    bool is_kept = keeps_tensors(keep, r->encoding);
    strbuf_init(&b);
    strbuf_reserve(&b, (size_t)r->n_batch * r->n_heads * (size_t)r->n_q * (size_t)r->d_v *
                               (r->encoding == API_ENCODING_BINARY ? (is_kept ? 0 : 4) : 14) +
                           256);
    strbuf_putc(&b, '{');
    /* The batch dimension leads when the request had one. */
    int o = r->is_batched ? 0 : 1;
    int64_t od[4] = {r->n_batch, r->n_heads, r->n_q, r->d_v};
    put_tensor(&b, "output", r->output, 4 - o, od + o, r->encoding, &raw);
    if (r->weights != NULL) {
        int64_t wd[4] = {r->n_batch, r->n_heads, r->n_q, r->n_k};
        strbuf_putc(&b, ',');
        put_tensor(&b, "weights", r->weights, 4 - o, wd + o, r->encoding, &raw);
    }
    if (r->sel != NULL) {
        put_selection(&b, r->sel, r->selected, r->n_heads, r->is_batched ? r->n_batch : 0,
                      r->encoding, &raw);
    }
    put_timing(&b, &r->timing);
    strbuf_puts(&b, "}\n");
    return finish_or_keep(&b, &raw, is_kept, keep, len, json_len);
}

static void put_session(struct strbuf *b, const struct api_session *s) {
    strbuf_puts(b, "{\"session_id\":");
    put_string(b, s->session_id);
    strbuf_printf(b,
                  ",\"n_tokens\":%d,\"bytes\":%zu,\"idle_ms\":%lld,\"pending\":%d,\"location\":"
                  "\"%s\",\"layers\":[",
                  (int)s->n_tokens, s->bytes, (long long)s->idle_ms, (int)s->pending,
                  s->location != NULL ? s->location : "memory");
    for (int32_t i = 0; i < s->n_layers; i++) {
        const struct api_session_layer *l = &s->layers[i];
        strbuf_printf(b, "%s{\"layer\":%d,\"n_tokens\":%d,\"n_held\":%d,\"bytes\":%zu",
                      i > 0 ? "," : "", (int)l->layer, (int)l->n_tokens, (int)l->n_held, l->bytes);
        if (l->window > 0) {
            strbuf_printf(b, ",\"window\":%d", (int)l->window);
        }
        if (l->context_tokens >= 0) {
            strbuf_printf(b, ",\"context_tokens\":%d", (int)l->context_tokens);
        }
        if (l->is_linear) {
            strbuf_puts(b, ",\"attention\":\"linear\"");
        }
        strbuf_putc(b, '}');
    }
    strbuf_puts(b, "]}");
}

char *api_session_encode(const struct api_session *s, size_t *len) {
    struct strbuf b;
    strbuf_init(&b);
    put_session(&b, s);
    strbuf_putc(&b, '\n');
    return strbuf_detach(&b, len);
}

char *api_session_list_encode(const struct api_session *sessions, int32_t n_sessions,
                              const struct api_pool *pool, size_t *len) {
    struct strbuf b;
    strbuf_init(&b);
    strbuf_puts(&b, "{\"sessions\":[");
    for (int32_t i = 0; i < n_sessions; i++) {
        if (i > 0) {
            strbuf_putc(&b, ',');
        }
        put_session(&b, &sessions[i]);
    }
    strbuf_printf(&b,
                  "],\"pool\":{\"bytes_used\":%zu,\"bytes_limit\":%zu,\"block_tokens\":%d,"
                  "\"blocks_used\":%d,\"blocks_total\":%d,\"dtype\":",
                  pool->bytes_used, pool->bytes_limit, (int)pool->block_tokens,
                  (int)pool->blocks_used, (int)pool->blocks_total);
    put_string(&b, pool->dtype);
    strbuf_puts(&b, "}}\n");
    return strbuf_detach(&b, len);
}

static void put_float_list(struct strbuf *b, const char *key, const float *v, int32_t n) {
    strbuf_printf(b, ",\"%s\":[", key);
    for (int32_t i = 0; i < n; i++) {
        if (i > 0) {
            strbuf_putc(b, ',');
        }
        put_float(b, v[i]);
    }
    strbuf_putc(b, ']');
}

/* The rope_scaling object as config.json spells it, with the values attnd derived (YaRN's and
 * LongRoPE's attention_factor, the betas), or null. rotary_dim sizes LongRoPE's lists. */
static void put_rope_scaling(struct strbuf *b, const attn_rope_scaling *rs, int32_t rotary_dim) {
    static const char *const names[] = {NULL, "linear", "llama3", "yarn", "longrope", "dynamic"};
    if (rs->type <= ATTN_ROPE_SCALING_NONE || rs->type > ATTN_ROPE_SCALING_DYNAMIC) {
        strbuf_puts(b, "null");
        return;
    }
    strbuf_printf(b, "{\"rope_type\":\"%s\",\"factor\":", names[rs->type]);
    put_float(b, rs->factor);
    if (rs->type == ATTN_ROPE_SCALING_LLAMA3) {
        strbuf_puts(b, ",\"low_freq_factor\":");
        put_float(b, rs->low_freq_factor);
        strbuf_puts(b, ",\"high_freq_factor\":");
        put_float(b, rs->high_freq_factor);
    }
    if (rs->type == ATTN_ROPE_SCALING_YARN || rs->type == ATTN_ROPE_SCALING_LONGROPE) {
        strbuf_puts(b, ",\"attention_factor\":");
        put_float(b, rs->attention_factor);
    }
    if (rs->type == ATTN_ROPE_SCALING_YARN) {
        strbuf_puts(b, ",\"beta_fast\":");
        put_float(b, rs->beta_fast);
        strbuf_puts(b, ",\"beta_slow\":");
        put_float(b, rs->beta_slow);
        strbuf_printf(b, ",\"truncate\":%s", rs->yarn_fractional_range ? "false" : "true");
        if (rs->mscale != 0 || rs->mscale_all_dim != 0) {
            /* DeepSeek's: attention_factor above is their ratio */
            strbuf_puts(b, ",\"mscale\":");
            put_float(b, rs->mscale);
            strbuf_puts(b, ",\"mscale_all_dim\":");
            put_float(b, rs->mscale_all_dim);
        }
    }
    if (rs->type == ATTN_ROPE_SCALING_LONGROPE) {
        put_float_list(b, "short_factor", rs->short_factor, rotary_dim / 2);
        put_float_list(b, "long_factor", rs->long_factor, rotary_dim / 2);
    }
    if (rs->type == ATTN_ROPE_SCALING_LINEAR) {
        strbuf_putc(b, '}');
        return;
    }
    /* dynamic: the checkpoint's max_position_embeddings, past which theta grows */
    strbuf_printf(b, ",\"%s\":%d}",
                  rs->type == ATTN_ROPE_SCALING_DYNAMIC ? "max_position_embeddings"
                                                        : "original_max_position_embeddings",
                  (int)rs->original_max_position);
}

static void put_layer(struct strbuf *b, const attn_config *cfg, int32_t layer) {
    bool is_sliding = attn_config_layer_is_sliding(cfg, layer);
    strbuf_printf(b, "{\"layer\":%d,\"attention\":\"%s\",\"sliding_window\":", (int)layer,
                  attn_config_layer_is_linear(cfg, layer) ? "linear"
                  : is_sliding                            ? "sliding"
                                                          : "full");
    if (is_sliding) {
        strbuf_printf(b, "%d", (int)cfg->sliding_window);
    } else {
        strbuf_puts(b, "null");
    }
    /* Gemma 3's local layers rotate with their own theta and no scaling. */
    bool is_local_rope = is_sliding && cfg->rope_theta_local > 0;
    bool rotates = attn_config_layer_rotates(cfg, layer);
    attn_rope_scaling none = {0};
    strbuf_puts(b, ",\"rope_theta\":");
    if (rotates) {
        put_float(b, is_local_rope ? cfg->rope_theta_local : cfg->rope_theta);
    } else {
        strbuf_puts(b, "null");
    }
    strbuf_puts(b, ",\"rope_scaling\":");
    put_rope_scaling(b, is_local_rope || !rotates ? &none : &cfg->rope_scaling, cfg->rotary_dim);
    strbuf_puts(b, ",\"softmax_scale\":");
    if (attn_config_layer_is_linear(cfg, layer)) {
        strbuf_puts(b, "null"); /* a linear layer's feature map takes no scale */
    } else {
        put_float(b, cfg->softmax_scale);
    }
    strbuf_puts(b, ",\"qk_norm\":");
    if (cfg->qk_norm == ATTN_QK_NORM_NONE) {
        strbuf_puts(b, "null");
    } else {
        strbuf_printf(b, "{\"kind\":\"%s\",\"eps\":",
                      cfg->qk_norm == ATTN_QK_NORM_HEAD    ? "rms_per_head"
                      : cfg->qk_norm == ATTN_QK_NORM_WIDTH ? "rms_over_width"
                      : cfg->qk_norm == ATTN_QK_NORM_HEAD_LAYERNORM_BIAS
                          ? "layernorm_shared_with_bias"
                          : "layernorm_each_head");
        put_float(b, cfg->qk_norm_eps);
        strbuf_putc(b, '}');
    }
    strbuf_puts(b, ",\"logit_softcap\":");
    if (cfg->logit_softcap > 0) {
        put_float(b, cfg->logit_softcap);
    } else {
        strbuf_puts(b, "null");
    }
    strbuf_printf(b, ",\"sinks\":%s,\"clip_qkv\":", cfg->has_sinks ? "true" : "false");
    if (cfg->clip_qkv > 0) {
        put_float(b, cfg->clip_qkv);
    } else {
        strbuf_puts(b, "null");
    }
    strbuf_putc(b, '}');
}

char *api_model_encode(const attn_config *cfg, const struct api_model_info *info, size_t *len) {
    struct strbuf b;
    strbuf_init(&b);
    /* Multi-head latent attention in its config's terms, not the engine's geometry (one K/V
     * head of qk_nope + qk_rope dims, the latent's): a K/V head per query head, and head_dim
     * the rotated dims, as DeepseekV3Config sets it; attnd.mla holds the rest. */
    bool is_mla = cfg->kv_lora_rank > 0;
    int32_t head_dim = is_mla ? cfg->qk_rope_head_dim : cfg->head_dim;
    strbuf_printf(&b,
                  "{\"hidden_size\":%d,\"num_attention_heads\":%d,\"num_key_value_heads\":%d,"
                  "\"head_dim\":%d,\"rope_theta\":",
                  (int)cfg->hidden_size, (int)cfg->n_heads,
                  (int)(is_mla ? cfg->n_heads : cfg->n_kv_heads), (int)head_dim);
    if (cfg->rotary_dim > 0) {
        put_float(&b, cfg->rope_theta);
    } else {
        strbuf_puts(&b, "null");
    }
    strbuf_puts(&b, ",\"rope_scaling\":");
    put_rope_scaling(&b, &cfg->rope_scaling, cfg->rotary_dim);
    strbuf_printf(&b, ",\"max_position_embeddings\":%d,\"attention_bias\":%s,\"sliding_window\":",
                  (int)cfg->max_seq, cfg->has_qkv_bias ? "true" : "false");
    if (cfg->sliding_window > 0) {
        strbuf_printf(&b, "%d", (int)cfg->sliding_window);
    } else {
        strbuf_puts(&b, "null");
    }
    strbuf_printf(&b, ",\"num_hidden_layers\":%d,\"partial_rotary_factor\":", (int)cfg->n_layers);
    bool has_rope = cfg->rotary_dim > 0 && head_dim > 0;
    put_float(&b, has_rope ? (float)cfg->rotary_dim / (float)head_dim : 0.0f);
    strbuf_puts(&b, ",\"attnd\":{\"source\":");
    put_string(&b, info->source);
    strbuf_puts(&b, ",\"family\":");
    put_string(&b, info->family);
    strbuf_printf(&b,
                  ",\"layer_first\":%d,\"layer_count\":%d,\"rope_style\":\"%s\",\"o_bias\":%s,"
                  "\"softmax_scale\":",
                  (int)info->layer_first, (int)info->layer_count,
                  !has_rope                                        ? "none"
                  : cfg->rope_style == ATTN_ROPE_STYLE_INTERLEAVED ? "interleaved"
                                                                   : "half",
                  cfg->has_o_bias ? "true" : "false");
    put_float(&b, cfg->softmax_scale);
    if (cfg->kv_lora_rank > 0) {
        /* multi-head latent attention: what the cache holds per token */
        /* q_lora_rank as config.json says it: null for a plain q_proj (the engine's 0) */
        char q_rank[16] = "null";
        if (cfg->q_lora_rank > 0) {
            snprintf(q_rank, sizeof q_rank, "%d", (int)cfg->q_lora_rank);
        }
        strbuf_printf(&b,
                      ",\"mla\":{\"q_lora_rank\":%s,\"kv_lora_rank\":%d,\"qk_nope_head_dim\":%d,"
                      "\"qk_rope_head_dim\":%d,\"v_head_dim\":%d,\"cache_floats_per_token\":%d}",
                      q_rank, (int)cfg->kv_lora_rank, (int)cfg->qk_nope_head_dim,
                      (int)cfg->qk_rope_head_dim, (int)cfg->v_head_dim,
                      (int)(cfg->kv_lora_rank + cfg->qk_rope_head_dim));
    }
    strbuf_printf(&b, ",\"weights_bytes\":%zu,\"weights_dtype\":", info->weights_bytes);
    put_string(&b, info->weights_dtype);
    strbuf_puts(&b, ",\"kv_dtype\":");
    put_string(&b, info->kv_dtype);
    strbuf_printf(&b, ",\"kv_bytes_per_token\":%zu,\"fingerprint\":", info->kv_bytes_per_token);
    put_string(&b, info->fingerprint);
    strbuf_puts(&b, ",\"layers\":[");
    for (int32_t i = 0; i < info->layer_count; i++) {
        if (i > 0) {
            strbuf_putc(&b, ',');
        }
        put_layer(&b, cfg, info->layer_first + i);
    }
    strbuf_puts(&b, "]}}\n");
    return strbuf_detach(&b, len);
}

char *api_status_encode(const char *status, size_t *len) {
    struct strbuf b;
    strbuf_init(&b);
    strbuf_puts(&b, "{\"status\":");
    put_string(&b, status);
    strbuf_puts(&b, "}\n");
    return strbuf_detach(&b, len);
}
