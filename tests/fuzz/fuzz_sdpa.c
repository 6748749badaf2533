/* tests/fuzz/fuzz_sdpa.c: POST /v1/sdpa bodies (api_sdpa_request_parse). Accepted: consistent
 * shapes (GQA divides, one batch), finite tensors, work within API_SDPA_MAX_SCORES, a 0/1 mask
 * whose strides stay inside it, linear attention without scores' options, a window and a scale in
 * their ranges, a selection resolved inside the shapes. Refused: a valid error body. */
#include <math.h>
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
    if (r.n_batch < 1 || (!r.is_batched && r.n_batch != 1))
        abort();
    if ((int64_t)r.n_batch * r.n_heads * r.n_q * r.n_k > API_SDPA_MAX_SCORES)
        abort();
    size_t b = (size_t)r.n_batch;
    fuzz_check_finite(r.q, b * (size_t)r.n_heads * (size_t)r.n_q * (size_t)r.d_k);
    fuzz_check_finite(r.k, b * (size_t)r.n_kv_heads * (size_t)r.n_k * (size_t)r.d_k);
    fuzz_check_finite(r.v, b * (size_t)r.n_kv_heads * (size_t)r.n_k * (size_t)r.d_v);
    /* a mask: strides that stay inside it, 0/1 values; linear attention has none */
    if (r.mask != NULL) {
        if ((r.mask_ld != 0 && r.mask_ld != (size_t)r.n_k) || r.is_linear)
            abort();
        size_t rows = r.mask_ld == 0 ? 1 : (size_t)r.n_q;
        size_t n = (r.mask_batch_stride == 0 ? 1 : b) * rows * (size_t)r.n_k;
        if (r.mask_batch_stride != 0 && r.mask_batch_stride != rows * (size_t)r.n_k)
            abort();
        for (size_t i = 0; i < n; i++)
            if (r.mask[i] > 1)
                abort();
    }
    if (r.is_linear && (r.return_weights || r.window >= 0 || r.scale != 0.0f))
        abort();
    /* a window >= 0 or none (-1); a scale finite and > 0, or the default (0) */
    if (r.window < -1 || !isfinite(r.scale) || r.scale < 0.0f)
        abort();
    /* a selection resolved against the call's shapes: heads, rows and keys inside them,
     * ascending, within the limit of returned values */
    if (r.sel.is_set) {
        if (!r.return_weights || r.sel.key_first < 0 || r.sel.n_keys < 0 ||
            r.sel.key_first + r.sel.n_keys > r.n_k ||
            (int64_t)r.n_batch * api_selection_values(&r.sel, r.n_heads) > API_WEIGHTS_MAX_VALUES)
            abort();
        for (int32_t i = 0; i < r.sel.n_heads; i++)
            if (r.sel.heads[i] < 0 || r.sel.heads[i] >= r.n_heads ||
                (i > 0 && r.sel.heads[i] <= r.sel.heads[i - 1]))
                abort();
        for (int32_t i = 0; i < r.sel.n_rows; i++)
            if (r.sel.rows[i] < 0 || r.sel.rows[i] >= r.n_q ||
                (i > 0 && r.sel.rows[i] <= r.sel.rows[i - 1]))
                abort();
    }
    api_sdpa_request_release(&r);
    return 0;
}
