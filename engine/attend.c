/* engine/attend.c: one attention task (a GQA group of query rows against one KV head) in either
 * of two paths with identical results: materialized probabilities when the caller wants the
 * weights, or tiled online softmax (FlashAttention: running max m, running sum l, rescaled
 * accumulator) that holds one key block of scores at a time. Keys come through a kv_view, so the
 * same code serves the paged cache and contiguous caller tensors. */
#include "attn_int.h"

#include <cblas.h>
#include <math.h>
#include <string.h>

/* Scratch layout: q (rows x d_k), o (rows x d_v), s (rows x block_tokens), m (rows), l (rows),
 * then the transposed key block of the tile kernels, then a block of keys or values widened from
 * a KV dtype (block_tokens x max(d_k, d_v)). */
size_t attn__task_scratch_floats(int32_t n_rows, int32_t d_k, int32_t d_v, int32_t block_tokens) {
    return (size_t)n_rows * ((size_t)d_k + d_v + block_tokens + 2) +
           attn__tile_pack_floats(block_tokens, d_k) +
           (size_t)block_tokens * (size_t)(d_k > d_v ? d_k : d_v);
}

/* A task's scratch, laid out as attn__task_scratch_floats counts it. */
struct task_scratch {
    float *q, *o, *s, *m, *l, *pack, *widen;
};

static struct task_scratch scratch_of(const struct attn__task *t) {
    size_t rows = (size_t)t->n_group * t->n_q;
    struct task_scratch sc;
    sc.q = t->scratch;
    sc.o = sc.q + rows * t->d_k;
    sc.s = sc.o + rows * t->d_v;
    sc.m = sc.s + rows * t->kv.block_tokens;
    sc.l = sc.m + rows;
    sc.pack = sc.l + rows;
    sc.widen = sc.pack + attn__tile_pack_floats(t->kv.block_tokens, t->d_k);
    return sc;
}

/* How a task multiplies its tiles: SIMD dot loops for a few rows (decode), register-blocked
 * kernels or BLAS for many (prefill). */
typedef enum tile_mode { TILE_MODE_SMALL, TILE_MODE_FAST, TILE_MODE_BLAS } tile_mode;

struct tile_ctx {
    tile_mode mode;
    float *pack;
    float *widen; /* a block of keys or values widened from the cache's dtype */
};

/* Keys [lo, hi] visible to row t by position; key_valid is applied per key. Empty when hi < lo. */
static void visible_range(const struct attn__mask *mk, int32_t n_keys, int32_t t, int64_t *lo,
                          int64_t *hi) {
    int64_t qi = (int64_t)mk->q_index0 + t;
    int64_t l = 0, h = (int64_t)n_keys - 1;
    if (mk->is_causal && qi < h) {
        h = qi;
    }
    if (mk->window_right >= 0 && qi + mk->window_right < h) {
        h = qi + mk->window_right;
    }
    if (mk->window_left >= 0 && qi - mk->window_left > l) {
        l = qi - mk->window_left;
    }
    *lo = l;
    *hi = h;
}

static const uint8_t *block_k(const struct attn__kv_view *v, int64_t b) {
    int64_t id = v->block_ids ? v->block_ids[b] : b;
    return v->k_base + (size_t)id * v->k_block_stride;
}

static const uint8_t *block_v(const struct attn__kv_view *v, int64_t b) {
    int64_t id = v->block_ids ? v->block_ids[b] : b;
    return v->v_base + (size_t)id * v->v_block_stride;
}

/* What a loop over blocks reads after a block's keys or values, for the kernels' prefetches. */
static struct attn__kv_after keys_of(const struct attn__kv_view *v, int64_t b) {
    return (struct attn__kv_after){block_k(v, b), v->k_row_bytes};
}

static struct attn__kv_after values_of(const struct attn__kv_view *v, int64_t b) {
    return (struct attn__kv_after){block_v(v, b), v->v_row_bytes};
}

static const struct attn__kv_after nothing_after = {NULL, 0};

/* s (rows x nb, ld lds) = q (rows x d_k) k_block^T. A few rows (decode) take the decode kernels,
 * which stream the keys in their dtype, float32 included (its older kernels prefetched a few rows
 * ahead, not across a block's edge: llama8b's layer at L=32768, 268 MB of float32 K/V, read at
 * 25-26 GB/s, since at 31-49 in three alternated runs); the prefill kernels take keys in a
 * narrower dtype widened a block at a time, their arithmetic per key dwarfing the widening. */
static void scores_block(const struct attn__task *t, const struct tile_ctx *tc, const float *q,
                         int32_t rows, const uint8_t *kb, int32_t nb, struct attn__kv_after after,
                         float *s, size_t lds) {
    const float *k = (const float *)(const void *)kb;
    if (tc->mode == TILE_MODE_SMALL) {
        attn__small_qk_kv(t->kv.dtype, q, (size_t)t->d_k, rows, kb, t->kv.k_row_bytes, nb, after,
                          t->d_k, s, lds, tc->widen);
        return;
    }
    if (t->kv.dtype != ATTN_DTYPE_F32) {
        attn__kv_widen(t->kv.dtype, kb, t->kv.k_row_bytes, nb, t->d_k, tc->widen, (size_t)t->d_k);
        k = tc->widen;
    }
    if (tc->mode == TILE_MODE_FAST) {
        attn__tile_qk(q, (size_t)t->d_k, rows, k, nb, t->d_k, s, lds, tc->pack);
    } else {
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, rows, nb, t->d_k, 1.0f, q, t->d_k, k,
                    t->d_k, 0.0f, s, (int)lds);
    }
}

/* o (rows x d_v) += p (rows x nb, ld ldp) v_block; a narrower dtype as in scores_block. */
static void accumulate_block(const struct attn__task *t, const struct tile_ctx *tc, const float *p,
                             size_t ldp, int32_t rows, const uint8_t *vb, int32_t nb,
                             struct attn__kv_after after, float *o) {
    const float *v = (const float *)(const void *)vb;
    size_t ldv = t->kv.v_row_bytes / sizeof(float);
    if (tc->mode == TILE_MODE_SMALL) {
        attn__small_pv_kv(t->kv.dtype, p, ldp, rows, vb, t->kv.v_row_bytes, nb, after, t->d_v, o,
                          (size_t)t->d_v, tc->widen);
        return;
    }
    if (t->kv.dtype != ATTN_DTYPE_F32) {
        attn__kv_widen(t->kv.dtype, vb, t->kv.v_row_bytes, nb, t->d_v, tc->widen, (size_t)t->d_v);
        v = tc->widen;
        ldv = (size_t)t->d_v;
    }
    if (tc->mode == TILE_MODE_FAST) {
        attn__tile_pv(p, ldp, rows, v, ldv, nb, t->d_v, o, (size_t)t->d_v);
    } else {
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, rows, t->d_v, nb, 1.0f, p, (int)ldp,
                    v, (int)ldv, 1.0f, o, t->d_v);
    }
}

/* Gemma 2's soft-capping of a block of scores: s = cap * tanh(s / cap), before the mask. */
static void softcap_block(float *s, int32_t rows, int32_t nb, size_t lds, float cap) {
    for (int32_t r = 0; r < rows; r++) {
        attn__softcap(s + (size_t)r * lds, nb, cap);
    }
}

/* What row t of a task may see: keys lo..hi by position, then those key_valid and its own
 * pair_valid row (each NULL when absent) leave. */
struct row_sight {
    int64_t lo, hi;
    const uint8_t *valid, *own;
};

static struct row_sight sight_of(const struct attn__task *t, int32_t row_t) {
    struct row_sight v;
    visible_range(&t->mask, t->kv.n_keys, row_t, &v.lo, &v.hi);
    v.valid = t->mask.key_valid;
    v.own =
        t->mask.pair_valid != NULL ? t->mask.pair_valid + (size_t)row_t * t->mask.pair_ld : NULL;
    return v;
}

static bool sees(const struct row_sight *v, int64_t j) {
    return j >= v->lo && j <= v->hi && (v->valid == NULL || v->valid[j]) &&
           (v->own == NULL || v->own[j]);
}

/* Replaces the scores of keys [j0, j0 + nb) that row t may not see by -inf. */
static void mask_row(const struct attn__task *t, int32_t row_t, int64_t j0, int32_t nb, float *s) {
    struct row_sight v = sight_of(t, row_t);
    if (v.valid == NULL && v.own == NULL && v.lo <= j0 && j0 + nb - 1 <= v.hi) {
        return; /* the usual case away from the diagonal and the window edge */
    }
    for (int32_t jj = 0; jj < nb; jj++) {
        if (!sees(&v, j0 + jj)) {
            s[jj] = -INFINITY;
        }
    }
}

/* Whether row t may see any key of [j0, j0 + nb): a block whose scores are all -inf while one
 * is visible overflowed float (|q . k| beyond 3.4e38), which is not the same as a masked row. */
static bool any_visible(const struct attn__task *t, int32_t row_t, int64_t j0, int64_t nb) {
    struct row_sight v = sight_of(t, row_t);
    for (int64_t j = j0 > v.lo ? j0 : v.lo; j < j0 + nb && j <= v.hi; j++) {
        if (sees(&v, j)) {
            return true;
        }
    }
    return false;
}

/* Scores float cannot hold. A row's running sum l is L_OVERFLOWED while every visible score it
 * met overflowed to -inf and none was finite (its m is still -inf): its softmax is over values
 * float cannot hold, so its output is NaN (null in an answer), never the zero row of a query
 * that sees no key. A finite score later clears it (l *= 0 when m moves off -inf): beside a
 * finite score, an overflowed one's weight is exactly 0. A visible score of +inf (overflowed
 * upward: which of several is largest is lost) or NaN (+inf and -inf products in one q . k)
 * makes l NaN for good: attn__exp_shift passes NaN on, and so does every later step. */
#define L_OVERFLOWED (-1.0f)

static bool row_is_undefined(float l) {
    return isnan(l) || l == L_OVERFLOWED;
}

static bool has_nan(const float *s, int32_t n) {
    for (int32_t j = 0; j < n; j++) {
        if (isnan(s[j])) {
            return true;
        }
    }
    return false;
}

static float *lse_cell(const struct attn__task *t, int32_t r) {
    return t->lse + (size_t)(r / t->n_q) * t->lse_head_stride + (size_t)(r % t->n_q) * t->lse_ld;
}

static void run_tiled(const struct attn__task *t, const struct tile_ctx *tc, const float *q,
                      float *o, float *s, float *m, float *l, int64_t b_lo, int64_t b_hi) {
    int32_t rows = t->n_group * t->n_q, bt = t->kv.block_tokens;
    for (int32_t r = 0; r < rows; r++) {
        m[r] = -INFINITY;
        l[r] = 0.0f;
    }
    memset(o, 0, (size_t)rows * t->d_v * sizeof(float));
    for (int64_t b = b_lo; b <= b_hi; b++) {
        int64_t j0 = b * bt;
        int32_t nb = (int32_t)(t->kv.n_keys - j0 < bt ? t->kv.n_keys - j0 : bt);
        /* the keys' prefetches run on into the block's values, theirs into the next keys */
        scores_block(t, tc, q, rows, block_k(&t->kv, b), nb, values_of(&t->kv, b), s, (size_t)bt);
        if (t->softcap > 0) {
            softcap_block(s, rows, nb, (size_t)bt, t->softcap);
        }
        for (int32_t r = 0; r < rows; r++) {
            float *sr = s + (size_t)r * bt;
            mask_row(t, r % t->n_q, j0, nb, sr);
            float bmax = attn__row_max(sr, nb);
            if (bmax == -INFINITY) {
                /* masked, overflowed downward, or NaN (which the maximum passes over; masked keys
                 * hold -inf, so a NaN left is a visible key's) */
                if (has_nan(sr, nb)) {
                    l[r] = NAN;
                } else if (m[r] == -INFINITY && any_visible(t, r % t->n_q, j0, nb)) {
                    l[r] = L_OVERFLOWED;
                }
                memset(sr, 0, (size_t)nb * sizeof(float));
                continue;
            }
            float m_new = m[r] > bmax ? m[r] : bmax;
            float sum = attn__exp_shift(sr, nb, m_new);
            if (m_new != m[r]) {
                float corr = expf(m[r] - m_new); /* 0 when m was -inf: nothing accumulated yet */
                float *orow = o + (size_t)r * t->d_v;
                for (int32_t c = 0; c < t->d_v; c++) {
                    orow[c] *= corr;
                }
                l[r] *= corr;
                m[r] = m_new;
            }
            l[r] += sum;
        }
        accumulate_block(t, tc, s, (size_t)bt, rows, block_v(&t->kv, b), nb,
                         b < b_hi ? keys_of(&t->kv, b + 1) : nothing_after, o);
    }
    if (t->is_partial) {
        return; /* o, m and l stay in the scratch for attn__tasks_merge */
    }
    for (int32_t r = 0; r < rows; r++) {
        float *orow = o + (size_t)r * t->d_v;
        float m_sum = m[r]; /* the maximum l[r] is a sum relative to */
        if (t->sinks != NULL) {
            /* The sink joins the denominator only: rescale to the larger maximum, then add it. */
            float sink = t->sinks[r / t->n_q];
            float m_new = m[r] > sink ? m[r] : sink;
            m_sum = m_new;
            float corr = expf(m[r] - m_new); /* 0 when no key was visible */
            l[r] = l[r] * corr + expf(sink - m_new);
            for (int32_t c = 0; c < t->d_v; c++) {
                orow[c] *= corr;
            }
        }
        float inv = l[r] > 0.0f ? 1.0f / l[r] : row_is_undefined(l[r]) ? NAN : 0.0f;
        for (int32_t c = 0; c < t->d_v; c++) {
            orow[c] *= inv;
        }
        if (t->lse != NULL) {
            *lse_cell(t, r) = l[r] > 0.0f ? m_sum + logf(l[r]) : isnan(inv) ? NAN : -INFINITY;
        }
    }
}

static float *weights_row(const struct attn__task *t, int32_t r) {
    return t->w + (size_t)(r / t->n_q) * t->w_head_stride + (size_t)(r % t->n_q) * t->w_ld;
}

static void run_materialized(const struct attn__task *t, const struct tile_ctx *tc, const float *q,
                             float *o, float *s, int64_t b_lo, int64_t b_hi) {
    int32_t rows = t->n_group * t->n_q, bt = t->kv.block_tokens;
    for (int32_t r = 0; r < rows; r++) {
        memset(weights_row(t, r), 0, (size_t)t->w_cols * sizeof(float));
    }
    memset(o, 0, (size_t)rows * t->d_v * sizeof(float));
    if (b_hi < b_lo) {
        for (int32_t r = 0; r < rows && t->lse != NULL; r++) {
            float sink = t->sinks != NULL ? t->sinks[r / t->n_q] : -INFINITY;
            *lse_cell(t, r) = sink; /* log(exp(sink)): the only term */
        }
        return;
    }
    int64_t c0 = b_lo * bt;
    int64_t c1 = (b_hi + 1) * bt < t->kv.n_keys ? (b_hi + 1) * bt : t->kv.n_keys;
    for (int64_t b = b_lo; b <= b_hi; b++) {
        int64_t j0 = b * bt;
        int32_t nb = (int32_t)(c1 - j0 < bt ? c1 - j0 : bt);
        scores_block(t, tc, q, rows, block_k(&t->kv, b), nb,
                     b < b_hi ? keys_of(&t->kv, b + 1) : values_of(&t->kv, b_lo), s, (size_t)bt);
        if (t->softcap > 0) {
            softcap_block(s, rows, nb, (size_t)bt, t->softcap);
        }
        for (int32_t r = 0; r < rows; r++) {
            mask_row(t, r % t->n_q, j0, nb, s + (size_t)r * bt);
            memcpy(weights_row(t, r) + j0, s + (size_t)r * bt, (size_t)nb * sizeof(float));
        }
    }
    for (int32_t r = 0; r < rows; r++) {
        float *w = weights_row(t, r) + c0;
        int64_t n = c1 - c0;
        float sink = t->sinks != NULL ? t->sinks[r / t->n_q] : -INFINITY;
        float mx = sink;
        for (int64_t j = 0; j < n; j++) {
            mx = w[j] > mx ? w[j] : mx;
        }
        if (mx == -INFINITY) {
            /* no key visible (a zero row), or every visible score overflowed or is NaN (NaN:
             * see L_OVERFLOWED); a +inf or NaN beside finite scores makes the sum NaN below */
            float fill = any_visible(t, r % t->n_q, c0, n) ? NAN : 0.0f;
            for (int64_t j = 0; j < n; j++) {
                w[j] = fill;
            }
            if (t->lse != NULL) {
                *lse_cell(t, r) = fill == 0.0f ? -INFINITY : NAN;
            }
            continue;
        }
        /* A sink is one more logit in the denominator; its probability is not returned. */
        float sum = attn__exp_shift(w, (int32_t)n, mx) + expf(sink - mx);
        float inv = 1.0f / sum;
        if (t->lse != NULL) {
            *lse_cell(t, r) = mx + logf(sum);
        }
        for (int64_t j = 0; j < n; j++) {
            w[j] *= inv;
        }
    }
    for (int64_t b = b_lo; b <= b_hi; b++) {
        int64_t j0 = b * bt;
        int32_t nb = (int32_t)(c1 - j0 < bt ? c1 - j0 : bt);
        for (int32_t r = 0; r < rows; r++) {
            memcpy(s + (size_t)r * bt, weights_row(t, r) + j0, (size_t)nb * sizeof(float));
        }
        accumulate_block(t, tc, s, (size_t)bt, rows, block_v(&t->kv, b), nb,
                         b < b_hi ? values_of(&t->kv, b + 1) : nothing_after, o);
    }
}

void attn__task_run(const struct attn__task *t) {
    int32_t rows = t->n_group * t->n_q;
    struct task_scratch sc = scratch_of(t);
    float *q = sc.q, *o = sc.o, *s = sc.s, *m = sc.m, *l = sc.l;
    struct tile_ctx tc = {TILE_MODE_SMALL, sc.pack, sc.widen};
    if (rows >= ATTN__BLAS_MIN_ROWS) {
        tc.mode = attn__tile_is_fast() ? TILE_MODE_FAST : TILE_MODE_BLAS;
    }
    /* Gather the group's query rows, pre-scaled, into one (rows x d_k) matrix so each key block
     * is read once for all heads that share it. */
    for (int32_t r = 0; r < rows; r++) {
        const float *src =
            t->q + (size_t)(r / t->n_q) * t->q_head_stride + (size_t)(r % t->n_q) * t->q_ld;
        float *dst = q + (size_t)r * t->d_k;
        for (int32_t c = 0; c < t->d_k; c++) {
            dst[c] = src[c] * t->scale;
        }
    }
    int64_t lo0, hi0, lo1, hi1;
    visible_range(&t->mask, t->kv.n_keys, 0, &lo0, &hi0);
    visible_range(&t->mask, t->kv.n_keys, t->n_q - 1, &lo1, &hi1);
    /* Both bounds grow with the query index, so rows 0 and n_q - 1 bound the whole task. */
    int64_t lo = lo0, hi = hi1;
    int64_t bt = t->kv.block_tokens;
    int64_t b_lo = lo / bt, b_hi = hi < lo ? b_lo - 1 : hi / bt;
    if (t->is_partial) {
        b_lo = b_lo > t->block_lo ? b_lo : t->block_lo;
        b_hi = b_hi < t->block_hi ? b_hi : t->block_hi;
        run_tiled(t, &tc, q, o, s, m, l, b_lo, b_hi);
        return;
    }
    if (t->w != NULL) {
        run_materialized(t, &tc, q, o, s, b_lo, b_hi);
    } else {
        run_tiled(t, &tc, q, o, s, m, l, b_lo, b_hi);
    }
    for (int32_t r = 0; r < rows; r++) {
        float *dst =
            t->out + (size_t)(r / t->n_q) * t->out_head_stride + (size_t)(r % t->n_q) * t->out_ld;
        memcpy(dst, o + (size_t)r * t->d_v, (size_t)t->d_v * sizeof(float));
    }
}

/* attn__tasks_inspect for one task: see attn_int.h. Runs after the task (and its merge), so its
 * scratch is free: row 0 of its q and s areas and its widening block serve here. */
static void task_inspect(const struct attn__task *t) {
    const attn_inspect *ins = t->inspect;
    if (ins == NULL || ins->out == NULL || (t->is_partial && t->block_lo != 0)) {
        return;
    }
    int32_t rows = t->n_group * t->n_q, bt = t->kv.block_tokens;
    struct task_scratch sc = scratch_of(t);
    float *q = sc.q, *s = sc.s;
    struct tile_ctx tc = {TILE_MODE_SMALL, sc.pack, sc.widen};
    int64_t k_first = ins->key_first, k_end = (int64_t)ins->key_first + ins->n_keys;
    for (int32_t r = 0; r < rows; r++) {
        int32_t hs = attn__inspect_find(ins->heads, ins->n_heads, t->head0 + r / t->n_q);
        int32_t rs = attn__inspect_find(ins->rows, ins->n_rows, t->token0 + r % t->n_q);
        if (hs < 0 || rs < 0) {
            continue;
        }
        float lse = *lse_cell(t, r);
        if (ins->kind == ATTN_INSPECT_LSE) {
            attn__inspect_put(ins, t->inspect_rows, hs, rs, 0, lse);
            continue;
        }
        const float *src =
            t->q + (size_t)(r / t->n_q) * t->q_head_stride + (size_t)(r % t->n_q) * t->q_ld;
        for (int32_t c = 0; c < t->d_k; c++) {
            q[c] = src[c] * t->scale;
        }
        int64_t lo, hi;
        visible_range(&t->mask, t->kv.n_keys, r % t->n_q, &lo, &hi);
        int64_t a = k_first > lo ? k_first : lo, b = k_end - 1 < hi ? k_end - 1 : hi;
        /* Hidden by position: not read. A score -inf; a probability 0 (the output's start),
         * but NaN in a row whose softmax float cannot compute (lse NaN), as the whole weights'
         * row is (exp(score - lse)). */
        bool is_undefined = ins->kind == ATTN_INSPECT_PROBS && isnan(lse);
        for (int64_t j = k_first; (ins->kind == ATTN_INSPECT_SCORES || is_undefined) && j < k_end;
             j++) {
            if (j < a || j > b) {
                attn__inspect_put(ins, t->inspect_rows, hs, rs, (int32_t)(j - k_first),
                                  is_undefined ? NAN : -INFINITY);
            }
        }
        for (int64_t blk = a / bt; a <= b && blk <= b / bt; blk++) {
            int64_t j0 = blk * bt;
            int32_t nb = (int32_t)(t->kv.n_keys - j0 < bt ? t->kv.n_keys - j0 : bt);
            scores_block(t, &tc, q, 1, block_k(&t->kv, blk), nb,
                         blk < b / bt ? keys_of(&t->kv, blk + 1) : nothing_after, s, (size_t)bt);
            if (t->softcap > 0) {
                softcap_block(s, 1, nb, (size_t)bt, t->softcap);
            }
            mask_row(t, r % t->n_q, j0, nb, s);
            int64_t from = j0 > a ? j0 : a, to = j0 + nb - 1 < b ? j0 + nb - 1 : b;
            for (int64_t j = from; j <= to; j++) {
                float score = s[j - j0];
                float value = ins->kind == ATTN_INSPECT_SCORES    ? score
                              : score == -INFINITY && !isnan(lse) ? 0.0f
                                                                  : expf(score - lse);
                attn__inspect_put(ins, t->inspect_rows, hs, rs, (int32_t)(j - k_first), value);
            }
        }
    }
}

static void inspect_one(void *arg, int32_t i) {
    const struct attn__task *tasks = arg;
    task_inspect(&tasks[i]);
}

void attn__tasks_inspect(const attn_executor *ex, const struct attn__task *tasks, int32_t n) {
    bool is_reduced = false;
    int32_t n_inspecting = 0;
    for (int32_t i = 0; i < n; i++) {
        if (tasks[i].inspect != NULL && tasks[i].inspect->out != NULL) {
            n_inspecting++;
            is_reduced = is_reduced || tasks[i].inspect->reduce != ATTN_REDUCE_NONE;
        }
    }
    if (n_inspecting == 0) {
        return;
    }
    /* A split task's parts hold one task's rows: its first part inspects them. */
    if (ex != NULL && ex->run != NULL && !is_reduced && n > 1) {
        ex->run(ex->ctx, inspect_one, (void *)tasks, n);
        return;
    }
    for (int32_t i = 0; i < n; i++) {
        inspect_one((void *)tasks, i);
    }
}

static void run_one(void *arg, int32_t i) {
    const struct attn__task *tasks = arg;
    attn__task_run(&tasks[i]);
}

void attn__tasks_run(const attn_executor *ex, const struct attn__task *tasks, int32_t n) {
    int64_t macs = 0; /* the scores and the weighted sum: keys x rows x (d_k + d_v) */
    for (int32_t i = 0; i < n && macs < ATTN__PARALLEL_MIN_MACS; i++) {
        macs += (int64_t)tasks[i].kv.n_keys * tasks[i].n_group * tasks[i].n_q *
                (tasks[i].d_k + tasks[i].d_v);
    }
    if (ex != NULL && ex->run != NULL && n > 1 && macs >= ATTN__PARALLEL_MIN_MACS) {
        ex->run(ex->ctx, run_one, (void *)tasks, n);
        return;
    }
    for (int32_t i = 0; i < n; i++) {
        attn__task_run(&tasks[i]);
    }
}

void attn__tasks_merge(const struct attn__task *parts, int32_t n) {
    const struct attn__task *t = &parts[0];
    int32_t rows = t->n_group * t->n_q;
    for (int32_t r = 0; r < rows; r++) {
        float mx = t->sinks != NULL ? t->sinks[r / t->n_q] : -INFINITY;
        for (int32_t i = 0; i < n; i++) {
            const float *m = scratch_of(&parts[i]).m;
            mx = m[r] > mx ? m[r] : mx;
        }
        float *dst =
            t->out + (size_t)(r / t->n_q) * t->out_head_stride + (size_t)(r % t->n_q) * t->out_ld;
        memset(dst, 0, (size_t)t->d_v * sizeof(float));
        /* NaN where a part met a +inf or NaN score, or where every part that saw a key met only
         * overflowed ones and no sink is there (see L_OVERFLOWED); else with no key visible and
         * no sink a zero row, as the whole task gives */
        bool undefined = false;
        for (int32_t i = 0; i < n; i++) {
            float l = scratch_of(&parts[i]).l[r];
            undefined = undefined || isnan(l) || (mx == -INFINITY && l == L_OVERFLOWED);
        }
        if (undefined || mx == -INFINITY) {
            for (int32_t c = 0; undefined && c < t->d_v; c++) {
                dst[c] = NAN;
            }
            if (t->lse != NULL) {
                *lse_cell(t, r) = undefined ? NAN : -INFINITY;
            }
            continue;
        }
        float sum = t->sinks != NULL ? expf(t->sinks[r / t->n_q] - mx) : 0.0f;
        for (int32_t i = 0; i < n; i++) {
            struct task_scratch sc = scratch_of(&parts[i]);
            const float *o = sc.o + (size_t)r * t->d_v, *m = sc.m, *l = sc.l;
            if (m[r] == -INFINITY) {
                continue;
            }
            float w = expf(m[r] - mx);
            sum += l[r] * w;
            for (int32_t c = 0; c < t->d_v; c++) {
                dst[c] += w * o[c];
            }
        }
        float inv = sum > 0.0f ? 1.0f / sum : 0.0f;
        for (int32_t c = 0; c < t->d_v; c++) {
            dst[c] *= inv;
        }
        if (t->lse != NULL) {
            *lse_cell(t, r) = sum > 0.0f ? mx + logf(sum) : -INFINITY;
        }
    }
}
