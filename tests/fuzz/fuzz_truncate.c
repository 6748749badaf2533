/* tests/fuzz/fuzz_truncate.c: POST /v1/sessions/{id}/truncate bodies
 * (api_truncate_request_parse). Accepted: n_tokens >= 0 and a loaded layer. */
#include <stdlib.h>

#include "fuzz.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    const struct api_limits lim = {
        .hidden_size = 64, .n_heads = 4, .layer_first = 1, .layer_count = 2, .max_seq = 4096};
    struct api_truncate_request r;
    struct api_error err;
    int rc = api_truncate_request_parse((const char *)data, size, &lim, &r, &err);
    if (rc != 0) {
        fuzz_check_error(rc, &err);
        return 0;
    }
    if (r.n_tokens < 0)
        abort();
    if (r.has_layer && (r.layer < lim.layer_first || r.layer >= lim.layer_first + lim.layer_count))
        abort();
    return 0;
}
