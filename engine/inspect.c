/* engine/inspect.c: the bookkeeping of an attention inspection (attn_inspect): checking a
 * selection against a call, and the cells of its output. The values themselves come from the
 * tasks that computed the attention (attend.c), so they see exactly the call's keys and masks. */
#include "attn_int.h"

#include <math.h>

static bool is_ascending_in(const int32_t *a, int32_t n, int32_t limit) {
    for (int32_t i = 0; i < n; i++) {
        if (a[i] < 0 || a[i] >= limit || (i > 0 && a[i] <= a[i - 1])) {
            return false;
        }
    }
    return true;
}

int attn__inspect_check(const attn_inspect *ins, int32_t n_heads, int32_t n_tokens,
                        int32_t n_keys) {
    if (ins == NULL) {
        return ATTN_OK;
    }
    if ((unsigned)ins->kind > ATTN_INSPECT_LSE || (unsigned)ins->reduce > ATTN_REDUCE_MAX_HEADS) {
        return ATTN_EINVAL;
    }
    if ((ins->heads != NULL &&
         (ins->n_heads < 1 || !is_ascending_in(ins->heads, ins->n_heads, n_heads))) ||
        (ins->rows != NULL &&
         (ins->n_rows < 1 || !is_ascending_in(ins->rows, ins->n_rows, n_tokens)))) {
        return ATTN_EINVAL;
    }
    if (ins->out != NULL && ins->kind != ATTN_INSPECT_LSE &&
        (ins->key_first < 0 || ins->n_keys < 0 || (int64_t)ins->key_first + ins->n_keys > n_keys)) {
        return ATTN_ERANGE;
    }
    return ATTN_OK;
}

static int32_t selected(const int32_t *sel, int32_t n_sel, int32_t n_all) {
    return sel != NULL ? n_sel : n_all;
}

/* Cells of the output: (H', R, K) or (H', R). */
static size_t cells(const attn_inspect *ins, int32_t n_heads, int32_t n_tokens) {
    size_t h =
        ins->reduce == ATTN_REDUCE_NONE ? (size_t)selected(ins->heads, ins->n_heads, n_heads) : 1;
    size_t k = ins->kind == ATTN_INSPECT_LSE ? 1 : (size_t)ins->n_keys;
    return h * (size_t)selected(ins->rows, ins->n_rows, n_tokens) * k;
}

void attn__inspect_begin(const attn_inspect *ins, int32_t n_heads, int32_t n_tokens) {
    if (ins == NULL || ins->out == NULL) {
        return;
    }
    /* A probability of a hidden key is 0 (under any reduction), a score or an LSE -inf; a mean
     * starts at 0 (the tasks then add a hidden key's -inf score explicitly). */
    bool is_zero = ins->reduce == ATTN_REDUCE_MEAN_HEADS || ins->kind == ATTN_INSPECT_PROBS;
    float start = is_zero ? 0.0f : -INFINITY;
    size_t n = cells(ins, n_heads, n_tokens);
    for (size_t i = 0; i < n; i++) {
        ins->out[i] = start;
    }
}

void attn__inspect_end(const attn_inspect *ins, int32_t n_heads, int32_t n_tokens) {
    if (ins == NULL || ins->out == NULL || ins->reduce != ATTN_REDUCE_MEAN_HEADS) {
        return;
    }
    float inv = 1.0f / (float)selected(ins->heads, ins->n_heads, n_heads);
    size_t n = cells(ins, n_heads, n_tokens);
    for (size_t i = 0; i < n; i++) {
        ins->out[i] *= inv; /* -inf scores stay -inf */
    }
}

int32_t attn__inspect_find(const int32_t *sel, int32_t n_sel, int32_t x) {
    if (sel == NULL) {
        return x;
    }
    int32_t lo = 0, hi = n_sel - 1;
    while (lo <= hi) {
        int32_t mid = lo + (hi - lo) / 2;
        if (sel[mid] == x) {
            return mid;
        }
        if (sel[mid] < x) {
            lo = mid + 1;
        } else {
            hi = mid - 1;
        }
    }
    return -1;
}

void attn__inspect_put(const attn_inspect *ins, int32_t n_rows, int32_t hs, int32_t rs, int32_t kk,
                       float value) {
    size_t k = ins->kind == ATTN_INSPECT_LSE ? 1 : (size_t)ins->n_keys;
    size_t h = ins->reduce == ATTN_REDUCE_NONE ? (size_t)hs : 0;
    float *cell = ins->out + (h * (size_t)n_rows + (size_t)rs) * k + (size_t)kk;
    switch (ins->reduce) {
    case ATTN_REDUCE_NONE:
        *cell = value;
        break;
    case ATTN_REDUCE_MEAN_HEADS:
        *cell += value;
        break;
    case ATTN_REDUCE_MAX_HEADS:
        *cell = value > *cell ? value : *cell;
        break;
    }
}
