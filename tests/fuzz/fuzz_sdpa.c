/* tests/fuzz/fuzz_sdpa.c: POST /v1/sdpa bodies (api_sdpa_request_parse). Accepted: consistent
 * shapes (GQA divides), finite tensors, work within API_SDPA_MAX_SCORES. Refused: a valid error
 * body. */
#include <stdlib.h>

#include "fuzz.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    struct api_sdpa_request r;
    struct api_error err;
    int rc = api_sdpa_request_parse((const char *)data, size, &r, &err);
    if (rc != 0) {
        fuzz_check_error(rc, &err);
        return 0;
    }
    if (r.n_heads < 1 || r.n_kv_heads < 1 || r.n_heads % r.n_kv_heads != 0)
        abort();
    if (r.n_q < 1 || r.n_k < 1 || r.d_k < 1 || r.d_v < 1)
        abort();
    if ((int64_t)r.n_heads * r.n_q * r.n_k > API_SDPA_MAX_SCORES)
        abort();
    fuzz_check_finite(r.q, (size_t)r.n_heads * (size_t)r.n_q * (size_t)r.d_k);
    fuzz_check_finite(r.k, (size_t)r.n_kv_heads * (size_t)r.n_k * (size_t)r.d_k);
    fuzz_check_finite(r.v, (size_t)r.n_kv_heads * (size_t)r.n_k * (size_t)r.d_v);
    api_sdpa_request_release(&r);
    return 0;
}
