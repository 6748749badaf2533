/* tests/fuzz/fuzz_attend.c: POST /v1/attend bodies (api_attend_request_parse) against the tiny
 * preset's limits. Accepted: the tensor has the checked shape and finite values, positions are in
 * range, a key_mask is 0/1, a context finite and alone with what cross-attention allows. Refused:
 * a valid error body. */
#include <stdlib.h>
#include <string.h>

#include "fuzz.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* What a request and each step of a batch hold alike: positions one per token inside max_seq,
 * expect_n_past >= 0, a finite head_mask, capture's four bits, selected rows inside the call's. */
static void check_own_fields(const struct api_attend_request *r, const struct api_limits *lim) {
    for (int32_t i = 0; r->positions != NULL && i < r->n_tokens; i++)
        if (r->positions[i] < 0 || r->positions[i] >= lim->max_seq)
            abort();
    if (r->has_expect_n_past && r->expect_n_past < 0)
        abort();
    if (r->head_mask != NULL)
        fuzz_check_finite(r->head_mask, (size_t)lim->n_heads);
    if ((r->capture &
         ~(unsigned)(API_CAPTURE_Q | API_CAPTURE_K | API_CAPTURE_V | API_CAPTURE_HEAD_OUT)) != 0)
        abort();
    if (r->sel.is_set && (r->sel.n_heads < 0 || r->sel.n_heads > lim->n_heads))
        abort();
    for (int32_t i = 0; r->sel.is_set && i < r->sel.n_rows; i++)
        if (r->sel.rows[i] < -r->n_tokens || r->sel.rows[i] >= r->n_tokens)
            abort();
}

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
    if (r.steps != NULL) {
        /* a batch: no x of its own; each step a plain request on the batch's layer, sessions
         * distinct */
        if (r.x != NULL || r.n_steps < 1 || r.n_steps > API_MAX_STEPS)
            abort();
        for (int32_t i = 0; i < r.n_steps; i++) {
            const struct api_attend_request *st = &r.steps[i];
            if (st->x == NULL || st->n_tokens < 1 || st->layer != r.layer || st->stream ||
                st->context != NULL || st->key_mask != NULL || st->steps != NULL)
                abort();
            fuzz_check_finite(st->x, (size_t)st->n_tokens * (size_t)lim.hidden_size);
            check_own_fields(st, &lim);
            for (int32_t j = 0; st->session_id[0] && j < i; j++)
                if (strcmp(st->session_id, r.steps[j].session_id) == 0)
                    abort();
        }
        api_attend_request_release(&r);
        return 0;
    }
    if (r.n_tokens < 1 || r.n_tokens > lim.max_seq || r.x == NULL)
        abort();
    if (r.layer < lim.layer_first || r.layer >= lim.layer_first + lim.layer_count)
        abort();
    fuzz_check_finite(r.x, (size_t)r.n_tokens * (size_t)lim.hidden_size);
    check_own_fields(&r, &lim);
    if (r.session_id[0] && !api_session_id_is_valid(r.session_id, strlen(r.session_id)))
        abort();
    /* key_mask: 0/1 within max_seq; a context: finite, within max_seq, and a cross request
     * carries none of what belongs to the session's own tokens. */
    if (r.key_mask != NULL && (r.n_key_mask < 1 || r.n_key_mask > lim.max_seq))
        abort();
    for (int32_t i = 0; r.key_mask != NULL && i < r.n_key_mask; i++)
        if (r.key_mask[i] > 1)
            abort();
    if (r.context != NULL) {
        if (r.n_context < 1 || r.n_context > lim.max_seq || !r.is_cross)
            abort();
        fuzz_check_finite(r.context, (size_t)r.n_context * (size_t)lim.hidden_size);
    }
    if (r.is_cross && (r.positions != NULL || r.key_mask != NULL || r.stream))
        abort();
    if (r.replace_context && r.context == NULL)
        abort();
    if (r.stream && (r.sel.is_set || r.capture != 0 || r.head_mask != NULL))
        abort();
    if (r.sel.is_set) {
        /* resolved as a request meeting a cache of 3 tokens would: inside it, sorted, once */
        struct api_error e;
        int32_t n_keys = r.is_cross ? 5 : 3 + r.n_tokens;
        if (api_selection_resolve(&r.sel, lim.n_heads, r.n_tokens, n_keys, 1, &e) != 0) {
            fuzz_check_error(e.code, &e);
        } else {
            for (int32_t i = 0; i < r.sel.n_heads; i++)
                if (r.sel.heads[i] < 0 || r.sel.heads[i] >= lim.n_heads ||
                    (i > 0 && r.sel.heads[i] <= r.sel.heads[i - 1]))
                    abort();
            for (int32_t i = 0; i < r.sel.n_rows; i++)
                if (r.sel.rows[i] < 0 || r.sel.rows[i] >= r.n_tokens ||
                    (i > 0 && r.sel.rows[i] <= r.sel.rows[i - 1]))
                    abort();
            if (r.sel.key_first < 0 || r.sel.n_keys < 0 || r.sel.key_first + r.sel.n_keys > n_keys)
                abort();
        }
    }
    api_attend_request_release(&r);
    return 0;
}
