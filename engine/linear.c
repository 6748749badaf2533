/* engine/linear.c: linear attention (seed 004 3.7) for attn_sdpa. phi(x) = elu(x) + 1, and per
 * KV head a running state S = sum_j phi(k_j)^T v_j (d_k x d_v) and z = sum_j phi(k_j) in double:
 * the causal form (prefix sums) then costs one state update per key and one product per query,
 * and the state form equals the quadratic one, phi(q_i) . phi(k_j) summed over j, to the
 * rounding of the float output. */
#include "attn_int.h"

#include <math.h>
#include <string.h>

/* elu(x) + 1: x + 1 above 0, exp(x) at or below. */
static double phi(float x) {
    return x > 0.0f ? (double)x + 1.0 : exp((double)x);
}

/* S (d_k x d_v), z, phi(k) and one output row, in double. */
size_t attn__linear_scratch_bytes(const attn_sdpa_params *p) {
    return ((size_t)p->d_k * p->d_v + 2 * (size_t)p->d_k + (size_t)p->d_v) * sizeof(double);
}

struct linear_state {
    double *s;   /* (d_k, d_v) */
    double *z;   /* (d_k) */
    double *f;   /* (d_k): phi of the row at hand */
    double *acc; /* (d_v) */
    int32_t d_k, d_v;
};

static void add_key(struct linear_state *st, const float *k, const float *v) {
    for (int32_t e = 0; e < st->d_k; e++) {
        st->f[e] = phi(k[e]);
        st->z[e] += st->f[e];
    }
    for (int32_t e = 0; e < st->d_k; e++) {
        double *row = st->s + (size_t)e * st->d_v;
        for (int32_t c = 0; c < st->d_v; c++) {
            row[c] += st->f[e] * v[c];
        }
    }
}

/* out = phi(q) S / (phi(q) . z + 1e-6), the seed's denominator. */
static void read_query(struct linear_state *st, const float *q, float *out) {
    double den = 1e-6;
    for (int32_t e = 0; e < st->d_k; e++) {
        st->f[e] = phi(q[e]);
        den += st->f[e] * st->z[e];
    }
    memset(st->acc, 0, (size_t)st->d_v * sizeof(double));
    for (int32_t e = 0; e < st->d_k; e++) {
        const double *row = st->s + (size_t)e * st->d_v;
        for (int32_t c = 0; c < st->d_v; c++) {
            st->acc[c] += st->f[e] * row[c];
        }
    }
    for (int32_t c = 0; c < st->d_v; c++) {
        out[c] = (float)(st->acc[c] / den);
    }
}

void attn__linear_advance(const attn_config *c, attn_kv *state, const float *qkv, size_t ld,
                          int32_t n, float *out, size_t out_ld, double *scratch) {
    int32_t hd = c->head_dim, r = c->n_heads / c->n_kv_heads;
    size_t k_off = (size_t)c->n_heads * hd, v_off = k_off + (size_t)c->n_kv_heads * hd;
    struct linear_state st = {.d_k = hd, .d_v = hd, .f = scratch, .acc = scratch + hd};
    for (int32_t g = 0; g < c->n_kv_heads; g++) {
        st.s = attn__kv_state(state, g);
        st.z = st.s + (size_t)hd * hd;
        for (int32_t i = 0; i < n; i++) {
            const float *row = qkv + (size_t)i * ld;
            /* causal: token i sees itself, so its key joins the state first */
            add_key(&st, row + k_off + (size_t)g * hd, row + v_off + (size_t)g * hd);
            for (int32_t h = g * r; h < (g + 1) * r; h++) {
                read_query(&st, row + (size_t)h * hd, out + (size_t)i * out_ld + (size_t)h * hd);
            }
        }
    }
}

int attn__linear_sdpa(const attn_sdpa_params *p, void *scratch) {
    int32_t r = p->n_heads / p->n_kv_heads;
    int64_t shift = (int64_t)p->n_k - p->n_q; /* query i sits at key index i + shift */
    struct linear_state st = {.d_k = p->d_k, .d_v = p->d_v};
    st.s = scratch;
    st.z = st.s + (size_t)p->d_k * p->d_v;
    st.f = st.z + p->d_k;
    st.acc = st.f + p->d_k;
    for (int32_t g = 0; g < p->n_kv_heads; g++) {
        if (p->is_cancelled != NULL && p->is_cancelled(p->cancel_ctx)) {
            return ATTN_ECANCELED;
        }
        memset(st.s, 0, ((size_t)p->d_k * p->d_v + p->d_k) * sizeof(double));
        const float *k = p->k + (size_t)g * p->n_k * p->d_k;
        const float *v = p->v + (size_t)g * p->n_k * p->d_v;
        int32_t added = 0;
        for (int32_t i = 0; i < p->n_q; i++) {
            int64_t last = p->is_causal ? i + shift : (int64_t)p->n_k - 1;
            for (; added <= last && added < p->n_k; added++) {
                add_key(&st, k + (size_t)added * p->d_k, v + (size_t)added * p->d_v);
            }
            for (int32_t h = g * r; h < (g + 1) * r; h++) {
                size_t row = (size_t)h * p->n_q + i;
                read_query(&st, p->q + row * p->d_k, p->out + row * p->d_v);
            }
        }
    }
    return ATTN_OK;
}
