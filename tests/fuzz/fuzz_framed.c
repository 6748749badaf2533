/* tests/fuzz/fuzz_framed.c: bodies framed by the binary tensor extension
 * (api_attend_request_parse_body, api_sdpa_request_parse_body). The input's first two bytes
 * (little-endian) give the JSON part's length, as Inference-Header-Content-Length does (clamped
 * to the rest); the rest is the body: JSON, then raw float32. Its third byte's low bit picks
 * sdpa, else its second bit /v1/kv/attend over /v1/attend, and its third lets the tensors be
 * read where they lie (borrowed from the body, not copied), as the server lets attend's and
 * SDPA's. Accepted: finite tensors of the checked shapes, the raw part taken whole. Refused: a
 * valid error body. */
#include <stdlib.h>
#include <string.h>

#include "fuzz.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

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
    struct api_error err;
    if (is_sdpa) {
        struct api_sdpa_request r;
        int rc = api_sdpa_request_parse_body(&body, &r, &err);
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
    struct api_attend_request r;
    bool is_kv = data[-1] & 2; /* the third byte's second bit: POST /v1/kv/attend */
    int rc = is_kv ? api_kv_attend_request_parse_body(&body, &lim, &r, &err)
                   : api_attend_request_parse_body(&body, &lim, &r, &err);
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
