/* server/api_sdpa.c: the body of POST /v1/sdpa (see api.h): q, k, v and an optional mask with
 * their shapes checked against each other, the scale, and the kind of attention.
 */
#include "api_int.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "error.h"

/* ---- POST /v1/sdpa -------------------------------------------------------------------------- */

void api_sdpa_request_release(struct api_sdpa_request *r) {
    api_selection_release(&r->sel);
    api__free_unborrowed(r->borrowed_lo, r->borrowed_hi, r->q);
    api__free_unborrowed(r->borrowed_lo, r->borrowed_hi, r->k);
    api__free_unborrowed(r->borrowed_lo, r->borrowed_hi, r->v);
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
        return api__wrong_type(jr, "scale", "a finite number > 0", err);
    }
    if (json_read_number(jr, &d) != 0) {
        return api__syntax_error(jr, err);
    }
    if (d <= 0 || !api__to_float32(d, out)) {
        return api__fail(err, ERROR_INVALID_REQUEST, "scale",
                         "scale: expected a finite number > 0");
    }
    if (*out == 0.0f) {
        return api__fail(err, ERROR_INVALID_REQUEST, "scale", "scale: too small for float32");
    }
    return 0;
}

/* "softmax" (the default) or "linear". */
static int get_kind(struct json_reader *r, bool *is_linear, struct api_error *err) {
    static const char what[] = "\"softmax\" or \"linear\"";
    char text[8];
    size_t len;
    int rc = api__get_short_string(r, "kind", text, sizeof text, &len, what, err);
    if (rc != 0) {
        return rc;
    }
    if ((len == 7 && memcmp(text, "softmax", 7) == 0) ||
        (len == 6 && memcmp(text, "linear", 6) == 0)) {
        *is_linear = len == 6;
        return 0;
    }
    return api__fail(err, ERROR_INVALID_REQUEST, "kind", "kind: expected %s", what);
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
    if (index > SDPA_V && api__take_null(jr)) {
        return 0;
    }
    int64_t v;
    int rc;
    switch (index) {
    case SDPA_Q:
        return api__parse_tensor(jr, &specs[0], &r->q, dims->q, &dims->q_rank, err);
    case SDPA_K:
        return api__parse_tensor(jr, &specs[1], &r->k, dims->k, &dims->k_rank, err);
    case SDPA_V:
        return api__parse_tensor(jr, &specs[2], &r->v, dims->v, &dims->v_rank, err);
    case SDPA_MASK:
        return api__parse_tensor(jr, &specs[3], &dims->mask, dims->m, &dims->mask_rank, err);
    case SDPA_KIND:
        return get_kind(jr, &r->is_linear, err);
    case SDPA_BINARY_OUTPUT:
        return api__get_bool(jr, "binary_output", binary_output, err);
    case SDPA_CAUSAL:
        return api__get_bool(jr, "causal", &r->causal, err);
    case SDPA_WINDOW:
        rc = api__get_int(jr, "window", 0, INT32_MAX, &v, err);
        r->window = rc == 0 ? (int32_t)v : -1;
        return rc;
    case SDPA_SCALE:
        return get_scale(jr, &r->scale, err);
    case SDPA_RETURN_WEIGHTS:
        /* the query rows' bound: n_heads x n_q is at most 2^24 (attn_sdpa's limit) */
        return api__parse_return_weights(jr, 0, 1 << 24, &r->return_weights, &r->sel, err);
    default:
        return api__get_encoding(jr, &r->encoding, err);
    }
}

/* mask (as floats, the seeds' booleans) against the shapes: each dimension the batch, query or
 * key count, or 1 to broadcast (the key one never), every value 0 or 1; made bytes in r. */
static int sdpa_mask(struct api_sdpa_request *r, struct sdpa_dims *d, struct api_error *err) {
    int rank = d->mask_rank;
    int64_t b = rank == 3 ? d->m[0] : 1, tq = d->m[rank - 2], tk = d->m[rank - 1];
    if (rank == 3 && b != 1 && b != r->n_batch) {
        return r->n_batch == 1
                   ? api__fail(
                         err, ERROR_INVALID_REQUEST, "mask",
                         "mask: dimension 0 is %lld, expected 1 (the batch) for shape (B, Tq, Tk)",
                         (long long)b)
                   : api__fail(
                         err, ERROR_INVALID_REQUEST, "mask",
                         "mask: dimension 0 is %lld, expected the batch %d or 1 for shape (B, Tq, "
                         "Tk)",
                         (long long)b, (int)r->n_batch);
    }
    if (tq != 1 && tq != r->n_q) {
        return api__fail(err, ERROR_INVALID_REQUEST, "mask",
                         "mask: dimension %d is %lld, expected Tq = %d or 1", rank - 2,
                         (long long)tq, (int)r->n_q);
    }
    if (tk != r->n_k) {
        return api__fail(err, ERROR_INVALID_REQUEST, "mask",
                         "mask: dimension %d is %lld, expected Tk = %d", rank - 1, (long long)tk,
                         (int)r->n_k);
    }
    size_t n = (size_t)(b * tq * tk);
    r->mask = malloc(n);
    if (r->mask == NULL) {
        return api__out_of_memory(err, "mask");
    }
    for (size_t i = 0; i < n; i++) {
        if (d->mask[i] != 0.0f && d->mask[i] != 1.0f) {
            return api__fail(err, ERROR_INVALID_REQUEST, "mask",
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
        return api__fail(err, ERROR_INVALID_REQUEST, missing, "%s: required tensor", missing);
    }
    if (d->k_rank != d->q_rank || d->v_rank != d->q_rank) {
        const char *which = d->k_rank != d->q_rank ? "k" : "v";
        return api__fail(
            err, ERROR_INVALID_REQUEST, which,
            "%s: rank %d, but q has rank %d: q, k and v are all batched (B, H, T, D) or "
            "none is",
            which, which[0] == 'k' ? d->k_rank : d->v_rank, d->q_rank);
    }
    /* Past an optional leading batch, each is (heads, length, dim). */
    int o = d->q_rank - 3;
    if (o == 1 && (d->k[0] != d->q[0] || d->v[0] != d->q[0])) {
        const char *which = d->k[0] != d->q[0] ? "k" : "v";
        return api__fail(err, ERROR_INVALID_REQUEST, which, "%s: batch %lld, expected q's %lld",
                         which, (long long)(which[0] == 'k' ? d->k[0] : d->v[0]),
                         (long long)d->q[0]);
    }
    if (d->k[o + 2] != d->q[o + 2]) {
        return api__fail(err, ERROR_INVALID_REQUEST, "k",
                         "k: dimension %d is %lld, expected %lld (q's dk) for shape (Hkv, Tk, dk)",
                         o + 2, (long long)d->k[o + 2], (long long)d->q[o + 2]);
    }
    if (d->q[o] % d->k[o] != 0) {
        return api__fail(err, ERROR_INVALID_REQUEST, "k",
                         "k: %lld kv heads do not divide the %lld query heads", (long long)d->k[o],
                         (long long)d->q[o]);
    }
    if (d->v[o] != d->k[o] || d->v[o + 1] != d->k[o + 1]) {
        return api__fail(err, ERROR_INVALID_REQUEST, "v",
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
    int rc = api__begin_framed(&br, body, err);
    if (br.may_borrow) {
        r.borrowed_lo = (uintptr_t)body->binary;
        r.borrowed_hi = (uintptr_t)body->binary + body->binary_len;
    }
    while (rc == 0 &&
           (rc = api__next_field(&br.json, sdpa_names, SDPA_N_FIELDS, &seen, &index, err)) == 1) {
        rc = sdpa_field(&br.json, index, &r, &dims, &binary_output, err);
    }
    if (rc == 0) {
        rc = api__end_body(&br.json, err);
    }
    if (rc == 0) {
        rc = sdpa_shapes(&r, &dims, err);
    }
    if (rc == 0) {
        rc = api__apply_binary_output(binary_output, seen, SDPA_ENCODING, &r.encoding, err);
    }
    /* as parsed: a binary part may have been read where it lies (found by an outside audit:
     * free() of a pointer into the body crashed the daemon) */
    api__free_unborrowed(r.borrowed_lo, r.borrowed_hi, dims.mask);
    if (rc == 0 && r.is_linear) {
        /* Linear attention has no scores: nothing to scale, mask or return. */
        static const char *const names[] = {"window", "scale", "mask", "return_weights"};
        bool given[] = {r.window >= 0, r.scale != 0.0f, r.mask != NULL, r.return_weights};
        for (int i = 0; i < 4 && rc == 0; i++) {
            if (given[i]) {
                rc =
                    api__fail(err, ERROR_INVALID_REQUEST, names[i],
                              "%s: not defined for kind linear (phi(q) S / (phi(q) . z + 1e-6) has "
                              "no scores to scale, mask or return)",
                              names[i]);
            }
        }
    }
    int64_t bh = (int64_t)r.n_batch * r.n_heads;
    if (rc == 0 && bh * r.n_q * r.n_k > API_SDPA_MAX_SCORES) {
        rc = api__fail(err, ERROR_INVALID_REQUEST, "k",
                       "k: B x H x Tq x Tk = %lld attention scores exceed the limit of %lld per "
                       "request",
                       (long long)(bh * r.n_q * r.n_k), (long long)API_SDPA_MAX_SCORES);
    }
    if (rc == 0 && bh * r.n_q * r.d_v > API_OUTPUT_MAX_VALUES) {
        rc = api__fail(err, ERROR_INVALID_REQUEST, "v",
                       "v: the output B x H x Tq x dv = %lld values exceeds the limit of %d",
                       (long long)(bh * r.n_q * r.d_v), API_OUTPUT_MAX_VALUES);
    }
    if (rc == 0 && r.sel.is_set) {
        /* the sdpa's shapes are all known: the selection resolves here */
        rc = api_selection_resolve(&r.sel, r.n_heads, r.n_q, r.n_k, r.n_batch, err);
    } else if (rc == 0 && r.return_weights && bh * r.n_q * r.n_k > API_WEIGHTS_MAX_VALUES) {
        rc = api__fail(err, ERROR_INVALID_REQUEST, "return_weights",
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
