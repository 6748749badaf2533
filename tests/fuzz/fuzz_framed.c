/* tests/fuzz/fuzz_framed.c: bodies framed by the binary tensor extension
 * (api_attend_request_parse_body, api_sdpa_request_parse_body). The input's first two bytes
 * (little-endian) give the JSON part's length, as Inference-Header-Content-Length does (clamped
 * to the rest); the rest is the body: JSON, then raw float32. Its third byte's low bit picks
 * sdpa, else its second bit /v1/kv/attend over /v1/attend, and its third lets the tensors be
 * read where they lie (borrowed from the body, not copied), as the server lets attend's and
 * SDPA's. Accepted: finite tensors of the checked shapes, the raw part taken whole. Refused: a
 * valid error body. Either way, a body read where it lies gives what the same body copied gives:
 * the same refusal, or the same values bit for bit. */
#include <stdlib.h>
#include <string.h>

#include "fuzz.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static bool same_bytes(const void *a, const void *b, size_t n) {
    return (a == NULL) == (b == NULL) && (a == NULL || memcmp(a, b, n) == 0);
}

/* Two parses of one attend or kv/attend body (or step) agree, value for value. */
static bool same_attend(const struct api_attend_request *a, const struct api_attend_request *b,
                        const struct api_limits *lim) {
    size_t t = (size_t)a->n_tokens, f = sizeof(float);
    if (a->n_tokens != b->n_tokens || a->n_steps != b->n_steps || a->layer != b->layer ||
        a->n_context != b->n_context || a->n_key_mask != b->n_key_mask ||
        a->encoding != b->encoding || a->capture != b->capture || a->is_cross != b->is_cross ||
        a->return_weights != b->return_weights || a->rope != b->rope ||
        a->has_expect_n_past != b->has_expect_n_past || a->expect_n_past != b->expect_n_past ||
        strcmp(a->session_id, b->session_id) != 0)
        return false;
    if (!same_bytes(a->x, b->x, t * (size_t)lim->hidden_size * f) ||
        !same_bytes(a->context, b->context, (size_t)a->n_context * (size_t)lim->hidden_size * f) ||
        !same_bytes(a->head_mask, b->head_mask, (size_t)lim->n_heads * f) ||
        !same_bytes(a->key_mask, b->key_mask, (size_t)a->n_key_mask) ||
        !same_bytes(a->positions, b->positions, t * sizeof(int32_t)) ||
        !same_bytes(a->q, b->q, (size_t)lim->n_heads * t * (size_t)lim->head_dim * f) ||
        !same_bytes(a->k, b->k, (size_t)lim->n_kv_heads * t * (size_t)lim->head_dim * f) ||
        !same_bytes(a->v, b->v, (size_t)lim->n_kv_heads * t * (size_t)lim->head_dim * f))
        return false;
    for (int32_t i = 0; i < a->n_steps; i++)
        if (!same_attend(&a->steps[i], &b->steps[i], lim))
            return false;
    return true;
}

static bool same_sdpa(const struct api_sdpa_request *a, const struct api_sdpa_request *b) {
    if (a->n_batch != b->n_batch || a->n_heads != b->n_heads || a->n_kv_heads != b->n_kv_heads ||
        a->n_q != b->n_q || a->n_k != b->n_k || a->d_k != b->d_k || a->d_v != b->d_v ||
        a->mask_batch_stride != b->mask_batch_stride || a->mask_ld != b->mask_ld ||
        a->causal != b->causal || a->window != b->window || a->scale != b->scale ||
        a->is_linear != b->is_linear || a->encoding != b->encoding)
        return false;
    size_t nb = (size_t)a->n_batch, f = sizeof(float);
    size_t mask_n = (a->mask_batch_stride == 0 ? 1 : nb) * (a->mask_ld == 0 ? 1 : (size_t)a->n_q) *
                    (size_t)a->n_k;
    return same_bytes(a->q, b->q, nb * a->n_heads * a->n_q * a->d_k * f) &&
           same_bytes(a->k, b->k, nb * a->n_kv_heads * a->n_k * a->d_k * f) &&
           same_bytes(a->v, b->v, nb * a->n_kv_heads * a->n_k * a->d_v * f) &&
           same_bytes(a->mask, b->mask, mask_n);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 3) {
        return 0;
    }
    size_t json_len = (size_t)data[0] | (size_t)data[1] << 8;
    bool is_sdpa = data[2] & 1;
    bool may_borrow = (data[2] & 4) != 0; /* tensors read where they lie */
    data += 3;
    size -= 3;
    if (json_len > size) {
        json_len = size;
    }
    struct api_body body = {(const char *)data, json_len, data + json_len, size - json_len,
                            may_borrow};
    /* the same body the other way: copied if the first may borrow, else read where it lies */
    struct api_body other = body;
    other.may_borrow = !may_borrow;
    struct api_error err, err2;
    if (is_sdpa) {
        struct api_sdpa_request r, r2;
        int rc = api_sdpa_request_parse_body(&body, &r, &err);
        int rc2 = api_sdpa_request_parse_body(&other, &r2, &err2);
        if (rc != rc2 || (rc == 0 && !same_sdpa(&r, &r2)))
            abort();
        if (rc2 == 0)
            api_sdpa_request_release(&r2);
        if (rc != 0) {
            fuzz_check_error(rc, &err);
            return 0;
        }
        fuzz_check_finite(r.q, (size_t)r.n_batch * r.n_heads * r.n_q * r.d_k);
        fuzz_check_finite(r.k, (size_t)r.n_batch * r.n_kv_heads * r.n_k * r.d_k);
        fuzz_check_finite(r.v, (size_t)r.n_batch * r.n_kv_heads * r.n_k * r.d_v);
        api_sdpa_request_release(&r);
        return 0;
    }
    const struct api_limits lim = {.hidden_size = 4,
                                   .n_heads = 2,
                                   .layer_first = 0,
                                   .layer_count = 2,
                                   .max_seq = 64,
                                   .n_kv_heads = 1,
                                   .head_dim = 2};
    struct api_attend_request r, r2;
    bool is_kv = data[-1] & 2; /* the third byte's second bit: POST /v1/kv/attend */
    int rc = is_kv ? api_kv_attend_request_parse_body(&body, &lim, &r, &err)
                   : api_attend_request_parse_body(&body, &lim, &r, &err);
    int rc2 = is_kv ? api_kv_attend_request_parse_body(&other, &lim, &r2, &err2)
                    : api_attend_request_parse_body(&other, &lim, &r2, &err2);
    if (rc != rc2 || (rc == 0 && !same_attend(&r, &r2, &lim)))
        abort();
    if (rc2 == 0)
        api_attend_request_release(&r2);
    if (rc != 0) {
        fuzz_check_error(rc, &err);
        return 0;
    }
    if (r.steps != NULL) {
        for (int32_t i = 0; i < r.n_steps; i++)
            if ((is_kv ? r.steps[i].q : r.steps[i].x) == NULL || r.steps[i].n_tokens < 1)
                abort();
        api_attend_request_release(&r);
        return 0;
    }
    if (r.n_tokens < 1 || r.n_tokens > lim.max_seq || (is_kv ? r.q : r.x) == NULL)
        abort();
    if (is_kv) {
        /* q (2, T, 2), k and v (1, T, 2): the same T. No session named is not the parser's
         * refusal: the X-Session-Id header may name it (the admission checks; an outside
         * audit's fuzzer stopped on this oracle) */
        if (r.k == NULL || r.v == NULL || r.k_tokens != r.n_tokens || r.v_tokens != r.n_tokens ||
            r.x != NULL)
            abort();
        fuzz_check_finite(r.q, (size_t)r.n_tokens * 4);
        fuzz_check_finite(r.k, (size_t)r.n_tokens * 2);
        fuzz_check_finite(r.v, (size_t)r.n_tokens * 2);
        api_attend_request_release(&r);
        return 0;
    }
    if (r.q != NULL || r.k != NULL || r.v != NULL)
        abort();
    fuzz_check_finite(r.x, (size_t)r.n_tokens * (size_t)lim.hidden_size);
    if (r.context != NULL)
        fuzz_check_finite(r.context, (size_t)r.n_context * (size_t)lim.hidden_size);
    if (r.encoding == API_ENCODING_BINARY && r.stream)
        abort();
    api_attend_request_release(&r);
    return 0;
}
