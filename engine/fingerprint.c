/* engine/fingerprint.c: the model fingerprint, 32 bytes that name what a model computes: its
 * attention config (every field, in a fixed little-endian encoding, so struct padding never
 * enters) and every loaded layer's tensors as held (index, dtype and bytes). Two loads of the
 * same checkpoint agree, and a session saved by one model can be refused by another. The digest
 * is XXH64's round (4 lanes over 32-byte stripes) finished into four 64-bit words, each mixing
 * all lanes and the length: it tells models apart at memory speed (the weights of a layer are
 * tens to hundreds of MiB); it is not cryptographic and does not resist a forger. */
#include "attn_int.h"

#include <stdlib.h>
#include <string.h>

#define P1 0x9E3779B185EBCA87ull
#define P2 0xC2B2AE3D27D4EB4Full
#define P3 0x165667B19E3779F9ull
#define P4 0x85EBCA77C2B2AE63ull
#define P5 0x27D4EB2F165667C5ull

struct digest {
    uint64_t acc[4];
    uint8_t stripe[32]; /* bytes not yet folded in */
    size_t n_stripe;
    uint64_t total;
};

static uint64_t rotl(uint64_t x, int r) {
    return (x << r) | (x >> (64 - r));
}

static uint64_t round64(uint64_t acc, uint64_t v) {
    return rotl(acc + v * P2, 31) * P1;
}

static uint64_t read64(const uint8_t *p) {
    uint64_t v;
    memcpy(&v, p, sizeof v);
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
    v = __builtin_bswap64(v); /* little-endian, whatever the host */
#endif
    return v;
}

static void digest_init(struct digest *d) {
    memset(d, 0, sizeof *d);
    d->acc[0] = P1 + P2;
    d->acc[1] = P2;
    d->acc[2] = 0;
    d->acc[3] = 0 - P1;
}

static void fold(struct digest *d, const uint8_t *s) {
    for (int i = 0; i < 4; i++) {
        d->acc[i] = round64(d->acc[i], read64(s + 8 * i));
    }
}

static void digest_update(struct digest *d, const void *data, size_t n) {
    const uint8_t *p = data;
    d->total += n;
    while (d->n_stripe > 0 && n > 0) {
        d->stripe[d->n_stripe++] = *p++;
        n--;
        if (d->n_stripe == 32) {
            fold(d, d->stripe);
            d->n_stripe = 0;
        }
    }
    /* Whole stripes, only once the partial stripe is empty (the loop above emptied it). The
     * lanes live in locals: through d, every round stored and reloaded its lane (p may alias d,
     * as far as the compiler knows), which halved the speed (10 GB/s against 20). */
    uint64_t a0 = d->acc[0], a1 = d->acc[1], a2 = d->acc[2], a3 = d->acc[3];
    for (; n >= 32; p += 32, n -= 32) {
        a0 = round64(a0, read64(p));
        a1 = round64(a1, read64(p + 8));
        a2 = round64(a2, read64(p + 16));
        a3 = round64(a3, read64(p + 24));
    }
    d->acc[0] = a0;
    d->acc[1] = a1;
    d->acc[2] = a2;
    d->acc[3] = a3;
    memcpy(d->stripe + d->n_stripe, p, n); /* n is 0 here unless the stripe was empty */
    d->n_stripe += n;
}

static uint64_t avalanche(uint64_t h) {
    h ^= h >> 33;
    h *= P2;
    h ^= h >> 29;
    h *= P3;
    h ^= h >> 32;
    return h;
}

static void digest_final(struct digest *d, uint8_t out[ATTN_FINGERPRINT_BYTES]) {
    /* the tail, zero-padded, and the length: a shorter input is never a prefix's twin */
    memset(d->stripe + d->n_stripe, 0, 32 - d->n_stripe);
    fold(d, d->stripe);
    uint64_t all = d->total * P5;
    for (int i = 0; i < 4; i++) {
        all = (rotl(all, 27) ^ round64(0, d->acc[i])) * P1 + P4;
    }
    for (int i = 0; i < 4; i++) {
        uint64_t w = avalanche(all ^ (d->acc[i] * (P3 + 2 * (uint64_t)i)) ^ (uint64_t)i);
        for (int b = 0; b < 8; b++) {
            out[8 * i + b] = (uint8_t)(w >> (8 * b));
        }
    }
}

uint64_t attn_checksum64(const void *data, size_t n) {
    struct digest d;
    digest_init(&d);
    digest_update(&d, data, n);
    uint8_t out[ATTN_FINGERPRINT_BYTES];
    digest_final(&d, out);
    return read64(out);
}

static void put_i32(struct digest *d, int32_t v) {
    uint8_t b[4] = {(uint8_t)v, (uint8_t)(v >> 8), (uint8_t)(v >> 16), (uint8_t)(v >> 24)};
    digest_update(d, b, 4);
}

static void put_f32(struct digest *d, float f) {
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    put_i32(d, (int32_t)u);
}

static void put_config(struct digest *d, const attn_config *c) {
    static const char tag[] = "attnd attention config v1";
    digest_update(d, tag, sizeof tag);
    int32_t ints[] = {c->n_layers,
                      c->hidden_size,
                      c->n_heads,
                      c->n_kv_heads,
                      c->head_dim,
                      c->rotary_dim,
                      (int32_t)c->rope_style,
                      c->max_seq,
                      c->sliding_window,
                      c->has_qkv_bias,
                      c->has_o_bias,
                      (int32_t)c->qk_norm,
                      c->has_sinks,
                      c->rope_sliding_only,
                      c->q_lora_rank,
                      c->kv_lora_rank,
                      c->qk_nope_head_dim,
                      c->qk_rope_head_dim,
                      c->v_head_dim};
    for (size_t i = 0; i < sizeof ints / sizeof ints[0]; i++) {
        put_i32(d, ints[i]);
    }
    float floats[] = {c->rope_theta,    c->softmax_scale,    c->qk_norm_eps,
                      c->logit_softcap, c->rope_theta_local, c->mla_norm_eps};
    for (size_t i = 0; i < sizeof floats / sizeof floats[0]; i++) {
        put_f32(d, floats[i]);
    }
    const attn_rope_scaling *s = &c->rope_scaling;
    put_i32(d, (int32_t)s->type);
    put_i32(d, s->original_max_position);
    put_i32(d, s->yarn_fractional_range);
    float sf[] = {s->factor,    s->low_freq_factor, s->high_freq_factor, s->attention_factor,
                  s->beta_fast, s->beta_slow,       s->mscale,           s->mscale_all_dim};
    for (size_t i = 0; i < sizeof sf / sizeof sf[0]; i++) {
        put_f32(d, sf[i]);
    }
    for (int32_t i = 0; i < ATTN_MAX_ROPE_FACTORS; i++) {
        put_f32(d, s->short_factor[i]);
        put_f32(d, s->long_factor[i]);
    }
    for (int32_t i = 0; i < ATTN_MAX_LAYERS; i++) {
        put_i32(d, c->is_full_layer[i]);
        put_i32(d, (int32_t)c->layer_kind[i]);
    }
    /* Fields added since, each hashed only when set (tagged), so that a model without them keeps
     * its fingerprint, and its saved sessions. */
    bool has_nope = false;
    for (int32_t i = 0; i < ATTN_MAX_LAYERS; i++) {
        has_nope |= c->is_nope_layer[i];
    }
    if (has_nope) {
        static const char nope_tag[] = "is_nope_layer";
        digest_update(d, nope_tag, sizeof nope_tag);
        for (int32_t i = 0; i < ATTN_MAX_LAYERS; i++) {
            put_i32(d, c->is_nope_layer[i]);
        }
    }
    if (c->clip_qkv != 0) {
        static const char clip_tag[] = "clip_qkv";
        digest_update(d, clip_tag, sizeof clip_tag);
        put_f32(d, c->clip_qkv);
    }
}

/* One tensor: a tag (its place in the layer), its element size and count, its bytes; absent
 * ones count as a tag alone. Float and half tensors are bytes as held (little-endian hosts). */
static void put_tensor(struct digest *d, int32_t tag, const void *p, size_t n, size_t elem) {
    put_i32(d, tag);
    if (p == NULL) {
        put_i32(d, -1);
        return;
    }
    put_i32(d, (int32_t)elem);
    put_i32(d, (int32_t)(n >> 31));
    put_i32(d, (int32_t)(n & 0x7fffffff));
    digest_update(d, p, n * elem);
}

/* put_tensor of a rows x cols matrix held in panels (panel.c), digested in row-major order as
 * the checkpoint's bytes are: the fingerprint does not depend on how the engine lays them out.
 * part: room for a panel's rows. */
static void put_panels(struct digest *d, int32_t tag, const uint16_t *p, attn_dtype dt, size_t rows,
                       size_t cols, uint16_t *part) {
    put_i32(d, tag);
    if (p == NULL) {
        put_i32(d, -1);
        return;
    }
    size_t n = rows * cols;
    put_i32(d, (int32_t)sizeof *p);
    put_i32(d, (int32_t)(n >> 31));
    put_i32(d, (int32_t)(n & 0x7fffffff));
    for (size_t r0 = 0; r0 < rows; r0 += ATTN__PANEL_ROWS) {
        size_t n_rows = rows - r0 < ATTN__PANEL_ROWS ? rows - r0 : ATTN__PANEL_ROWS;
        attn__panel_unpack(dt, p, (int32_t)cols, (int32_t)r0, (int32_t)n_rows, part);
        digest_update(d, part, n_rows * cols * sizeof *part);
    }
}

int attn__model_fingerprint_compute(attn_model *m) {
    const attn_config *c = &m->cfg;
    struct digest d;
    digest_init(&d);
    put_config(&d, c);
    put_i32(&d, m->layer_first);
    put_i32(&d, m->layer_count);
    put_i32(&d, (int32_t)m->weights_dtype);
    size_t hid = (size_t)c->hidden_size, h = (size_t)c->n_heads;
    size_t n_qkv = (h + 2 * (size_t)c->n_kv_heads) * c->head_dim;
    bool is_mla = c->kv_lora_rank > 0;
    size_t o_in = h * (size_t)(is_mla ? c->v_head_dim : c->head_dim);
    size_t ql = (size_t)c->q_lora_rank, kvl = (size_t)c->kv_lora_rank;
    size_t kva = kvl + (size_t)c->qk_rope_head_dim;
    size_t kvb = h * (size_t)(c->qk_nope_head_dim + c->v_head_dim);
    /* half-precision weights are read back in row order a panel's rows at a time */
    bool has_panels = m->layer_count > 0 && m->layers[0].w_qkv_h != NULL;
    uint16_t *part = NULL;
    if (has_panels && (part = malloc((size_t)ATTN__PANEL_ROWS * (hid > o_in ? hid : o_in) *
                                     sizeof *part)) == NULL) {
        return ATTN_ENOMEM;
    }
    for (int32_t i = 0; i < m->layer_count; i++) {
        const struct attn__layer *l = &m->layers[i];
        put_i32(&d, m->layer_first + i);
        put_tensor(&d, 1, l->w_qkv, n_qkv * hid, sizeof(float));
        put_panels(&d, 2, l->w_qkv_h, m->weights_dtype, n_qkv, hid, part);
        put_tensor(&d, 3, l->b_qkv, n_qkv, sizeof(float));
        put_tensor(&d, 4, l->w_o, hid * o_in, sizeof(float));
        put_panels(&d, 5, l->w_o_h, m->weights_dtype, hid, o_in, part);
        put_tensor(&d, 6, l->b_o, hid, sizeof(float));
        put_tensor(&d, 7, l->q_norm, attn__qk_norm_len(c, false), sizeof(float));
        put_tensor(&d, 8, l->k_norm, attn__qk_norm_len(c, true), sizeof(float));
        put_tensor(&d, 9, l->sinks, h, sizeof(float));
        put_tensor(&d, 10, l->w_q, h * c->head_dim * hid, sizeof(float));
        put_tensor(&d, 11, l->b_q, h * c->head_dim, sizeof(float));
        put_tensor(&d, 12, l->w_qa, ql * hid, sizeof(float));
        put_tensor(&d, 13, l->b_qa, ql, sizeof(float));
        put_tensor(&d, 14, l->q_a_norm, ql, sizeof(float));
        put_tensor(&d, 15, l->w_qb, h * c->head_dim * ql, sizeof(float));
        put_tensor(&d, 16, l->w_kva, kva * hid, sizeof(float));
        put_tensor(&d, 17, l->b_kva, kva, sizeof(float));
        put_tensor(&d, 18, l->kv_a_norm, kvl, sizeof(float));
        put_tensor(&d, 19, l->w_kvb, kvb * kvl, sizeof(float));
        /* tensors added since: only when present, as put_config's later fields */
        if (l->q_norm_bias != NULL) {
            put_tensor(&d, 20, l->q_norm_bias, (size_t)c->head_dim, sizeof(float));
            put_tensor(&d, 21, l->k_norm_bias, (size_t)c->head_dim, sizeof(float));
        }
    }
    free(part);
    digest_final(&d, m->fingerprint);
    struct digest cd;
    digest_init(&cd);
    put_config(&cd, c);
    uint8_t word[ATTN_FINGERPRINT_BYTES];
    digest_final(&cd, word);
    m->config_digest = read64(word) != 0 ? read64(word) : 1; /* 0 means "not stated" in files */
    return ATTN_OK;
}

uint64_t attn_model_config_digest(const attn_model *m) {
    return m->config_digest;
}

void attn_model_fingerprint(const attn_model *m, uint8_t out[ATTN_FINGERPRINT_BYTES]) {
    memcpy(out, m->fingerprint, ATTN_FINGERPRINT_BYTES);
}
