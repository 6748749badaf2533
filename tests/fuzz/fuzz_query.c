/* tests/fuzz/fuzz_query.c: GET /v1/sessions/{id}/attention's query (api_attention_query, then
 * api_attention_select against a cache whose length the input's first byte sets). The input
 * is name=value pairs split at '&' as libmicrohttpd hands them on. Accepted: every head, row and
 * key index inside the cache, ascending, each once, and the values within the limit. */
#include <stdlib.h>
#include <string.h>

#include "fuzz.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static bool is_ascending_below(const int32_t *a, int32_t n, int32_t lo, int32_t hi) {
    for (int32_t i = 0; i < n; i++) {
        if (a[i] < lo || a[i] >= hi || (i > 0 && a[i] <= a[i - 1])) {
            return false;
        }
    }
    return true;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    const struct api_limits lim = {
        .hidden_size = 64, .n_heads = 4, .layer_first = 1, .layer_count = 2, .max_seq = 4096};
    if (size < 1 || size > 8192) {
        return 0;
    }
    int32_t n_tokens = data[0], row_min = data[0] / 3;
    char *text = malloc(size);
    memcpy(text, data + 1, size - 1);
    text[size - 1] = '\0';
    struct api_attention_request r;
    memset(&r, 0, sizeof r);
    r.layer = lim.layer_first;
    struct api_error err;
    int rc = 0;
    for (char *pair = text, *next; rc == 0 && pair != NULL; pair = next) {
        next = strchr(pair, '&');
        if (next != NULL) {
            *next++ = '\0';
        }
        char *eq = strchr(pair, '=');
        const char *value = "";
        if (eq != NULL) {
            *eq = '\0';
            value = eq + 1;
        }
        rc = api_attention_query(&r, pair, value, &lim, &err);
    }
    free(text);
    if (rc != 0) {
        fuzz_check_error(rc, &err);
        return 0;
    }
    if (r.layer < lim.layer_first || r.layer >= lim.layer_first + lim.layer_count)
        abort();
    struct api_selection sel;
    rc = api_attention_select(&r, lim.n_heads, n_tokens, row_min, &sel, &err);
    if (rc != 0) {
        fuzz_check_error(rc, &err);
        return 0;
    }
    if (!is_ascending_below(sel.heads, sel.n_heads, 0, lim.n_heads) ||
        !is_ascending_below(sel.rows, sel.n_rows, row_min, n_tokens) || sel.key_first < 0 ||
        sel.n_keys < 0 || sel.key_first + sel.n_keys > n_tokens ||
        api_selection_values(&sel, lim.n_heads) > API_WEIGHTS_MAX_VALUES)
        abort();
    api_selection_release(&sel);
    return 0;
}
