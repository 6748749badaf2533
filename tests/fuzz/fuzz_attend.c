/* tests/fuzz/fuzz_attend.c: POST /v1/attend bodies (api_attend_request_parse) against the tiny
 * preset's limits. Accepted: the tensor has the checked shape and finite values, positions are in
 * range. Refused: a valid error body. */
#include <stdlib.h>
#include <string.h>

#include "fuzz.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    const struct api_limits lim = {
        .hidden_size = 64, .n_heads = 4, .layer_first = 0, .layer_count = 2, .max_seq = 4096};
    struct api_attend_request r;
    struct api_error err;
    int rc = api_attend_request_parse((const char *)data, size, &lim, &r, &err);
    if (rc != 0) {
        fuzz_check_error(rc, &err);
        return 0;
    }
    if (r.n_tokens < 1 || r.n_tokens > lim.max_seq || r.x == NULL)
        abort();
    if (r.layer < lim.layer_first || r.layer >= lim.layer_first + lim.layer_count)
        abort();
    fuzz_check_finite(r.x, (size_t)r.n_tokens * (size_t)lim.hidden_size);
    for (int32_t i = 0; r.positions != NULL && i < r.n_tokens; i++)
        if (r.positions[i] < 0 || r.positions[i] >= lim.max_seq)
            abort();
    if (r.session_id[0] && !api_session_id_is_valid(r.session_id, strlen(r.session_id)))
        abort();
    api_attend_request_release(&r);
    return 0;
}
