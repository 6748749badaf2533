/* bench/attn_bench.c: the engine benchmark (`make bench`). Times prefill, single-token decode and
 * batched decode on one random layer of the `small` and `llama8b` presets and of two variants of
 * llama8b's layer with other families' attention (`qwen3`: q/k RMSNorm; `gemma2`: a local layer
 * with soft-capped scores, its scalar and a 4096-token window in a ring cache), whose cost is
 * then set against llama8b's, case by case. It sets every figure
 * against this machine's limits measured in the same run (cblas_sgemm peak at 2048^3, read
 * bandwidth of a sweep over a buffer far larger than the caches). Prints one table, then RESULT
 * lines for bench/compare.py. Correctness is tests/' job: this program only checks return codes.
 */
#include <inttypes.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cblas.h>

#include "../engine/attn.h"
#include "bench_limits.h"
#include "bench_pool.h"
#include "bench_rand.h"

/* ---- cases and options ---------------------------------------------------------------------- */

static const int32_t prefill_lens[] = {128, 512, 2048};
/* Decode cache lengths, ascending: one cache is grown from stop to stop. BATCH_LEN is one of them,
 * so the batched cases fork that cache when it passes through. */
static const int32_t decode_lens[] = {512, 2048, 8192};
/* The long-context presets' (small's geometry, softmax or linear): where a state pays off. */
static const int32_t long_decode_lens[] = {512, 8192, 65536};
static const int32_t batch_sizes[] = {1, 8, 32};
enum { BATCH_LEN = 2048, MAX_RESULTS = 512, MAX_BATCH = 32, MAX_DTYPE_PAIRS = 8 };

/* The presets run: the engine's own, or llama8b's dimensions with another family's attention
 * (so that the cost of that attention shows against the plain layer of the same size). */
static void as_qwen3(attn_config *c) {
    c->qk_norm = ATTN_QK_NORM_HEAD; /* Qwen3-8B has llama8b's dimensions exactly */
    c->qk_norm_eps = 1e-6f;
    c->rope_theta = 1e6f;
}

/* DeepSeek-V3's attention layer: hidden 7168, 128 heads, q_lora 1536, the latent 512 + 64. */
static void as_deepseek_v3(attn_config *c) {
    c->hidden_size = 7168;
    c->n_heads = 128;
    c->n_kv_heads = 1;
    c->head_dim = 0; /* the config check fills MLA's */
    c->rotary_dim = 0;
    c->softmax_scale = 0.0f;
    c->q_lora_rank = 1536;
    c->kv_lora_rank = 512;
    c->qk_nope_head_dim = 128;
    c->qk_rope_head_dim = 64;
    c->v_head_dim = 128;
    c->rope_theta = 10000.0f;
    c->rope_style = ATTN_ROPE_STYLE_INTERLEAVED;
}

static void as_gemma2(attn_config *c) {
    c->softmax_scale = 0.0625f; /* query_pre_attn_scalar 256 */
    c->logit_softcap = 50.0f;
    c->sliding_window = 4096; /* the local layer: its cache is a ring of the window */
}

static const struct bench_preset {
    const char *name;
    const char *engine_preset;
    void (*adjust)(attn_config *c); /* NULL: the engine's preset as it is */
    bool is_long;                   /* decodes at long_decode_lens, no batch */
} presets[] = {
    {"small", "small", NULL, false},
    {"llama8b", "llama8b", NULL, false},
    {"qwen3", "llama8b", as_qwen3, false},
    {"gemma2", "llama8b", as_gemma2, false},
    /* linear attention's state against softmax's cache, both with small's geometry */
    {"small-long", "small", NULL, true},
    {"small-linear", "small-linear", NULL, true},
    /* multi-head latent attention at DeepSeek-V3's size: its decode reads the latent */
    {"deepseek-v3", "llama8b", as_deepseek_v3, false},
};
#define N_PRESETS ((int32_t)(sizeof presets / sizeof presets[0]))

typedef enum case_kind {
    CASE_KIND_PREFILL = 0, /* S new tokens into an empty cache */
    CASE_KIND_DECODE = 1,  /* 1 new token into one cache of length L */
    CASE_KIND_BATCH = 2,   /* B caches of length BATCH_LEN, 1 new token each, one forward */
    CASE_KIND_ATTEND = 3,  /* attention alone: 1 token's q, k and v into a cache of length L */
} case_kind;

typedef struct bench_opts {
    int32_t n_threads;       /* OpenBLAS threads and executor threads */
    bool use_executor;       /* false: attention runs on the calling thread only */
    bool is_quick;           /* fewer reps, smaller bandwidth buffer: smoke runs */
    bool skip_limits;        /* do not measure the machine (compare.py only needs ms) */
    bool is_paired;          /* probe the case's bound after every timed rep (bench_limits.h);
                                the default whenever the limits are measured */
    const char *preset;      /* a presets[] name, or "all" */
    const char *case_filter; /* comma-separated substrings of case names; NULL = all */
    size_t bw_bytes;         /* bandwidth sweep buffer */
    int32_t block_tokens;    /* KV block size passed to the pool */
    /* The dtype pairs to run every case in: how the projections are held (MLA's tensors stay
     * f32) and how the KV cache holds K/V (AUTO: the weights'). */
    attn_dtype weights_dtypes[MAX_DTYPE_PAIRS];
    attn_dtype kv_dtypes[MAX_DTYPE_PAIRS];
    int32_t n_dtype_pairs;
    int32_t n_reps; /* 0 = adaptive (see rep_policy) */
    uint64_t seed;
} bench_opts;

/* Reps after one discarded warm-up: at least min_reps and min_seconds of timed work (with the
 * probes of paired reps), at most max_reps. The figure reported is the median. */
typedef struct rep_policy {
    int32_t min_reps;
    int32_t max_reps;
    double min_seconds;
} rep_policy;

typedef struct case_result {
    char name[64];
    case_kind kind;
    int32_t reps;
    double ms;     /* median of the timed reps */
    double ms_min; /* fastest rep */
    /* mean of the timed reps: what a count of calls over a duration measures (bench/load.c's
     * tokens/s), stalls of the VM included, which the median leaves out */
    double ms_mean;
    /* Paired: the median over reps of (the call's time at the limit probed right after
     * the rep) / (the rep's time), and the median of those probes; else 0. */
    double paired;
    double paired_limit;
    double n_new; /* new tokens per call, all sequences */
    double flops; /* per call, as stated in the header */
    double bytes; /* per call, as stated in the header */
} case_result;

typedef struct result_list {
    case_result items[MAX_RESULTS];
    int32_t n;
    char presets[N_PRESETS * MAX_DTYPE_PAIRS][320]; /* a line describing each preset run */
    int32_t n_presets;
    /* what a preset measured beyond its cases (the ring's memory, KV capacity) */
    char notes[N_PRESETS * MAX_DTYPE_PAIRS * 2][256];
    int32_t n_notes;
} result_list;

/* ---- small helpers -------------------------------------------------------------------------- */

static int compare_doubles(const void *a, const void *b) {
    double x = *(const double *)a;
    double y = *(const double *)b;
    return (x > y) - (x < y);
}

static bool case_selected(const bench_opts *o, const char *name) {
    if (o->case_filter == NULL) {
        return true;
    }
    const char *f = o->case_filter;
    while (*f != '\0') {
        size_t len = strcspn(f, ",");
        char part[64];
        if (len > 0 && len < sizeof(part)) {
            memcpy(part, f, len);
            part[len] = '\0';
            if (strstr(name, part) != NULL) {
                return true;
            }
        }
        f += len;
        if (*f == ',') {
            f++;
        }
    }
    return false;
}

/* <preset>.<case>@<weights dtype>/<KV dtype>, e.g. llama8b.decode_L2048@bf16/q8_0. */
static void case_name(char *buf, size_t size, const char *preset, const char *dtypes,
                      case_kind kind, int32_t n) {
    switch (kind) {
    case CASE_KIND_PREFILL:
        snprintf(buf, size, "%s.prefill_S%" PRId32 "@%s", preset, n, dtypes);
        break;
    case CASE_KIND_DECODE:
        snprintf(buf, size, "%s.decode_L%" PRId32 "@%s", preset, n, dtypes);
        break;
    case CASE_KIND_BATCH:
        snprintf(buf, size, "%s.batch_B%" PRId32 "_L%d@%s", preset, n, BATCH_LEN, dtypes);
        break;
    case CASE_KIND_ATTEND:
        snprintf(buf, size, "%s.attend_L%" PRId32 "@%s", preset, n, dtypes);
        break;
    }
}

/* ---- cost model ----------------------------------------------------------------------------- */

/* Bytes of one weight of the q/k/v and o projections as held. */
static double projection_weight_bytes(const attn_config *c, attn_dtype dt) {
    return c->kv_lora_rank > 0 || dt == ATTN_DTYPE_F32 ? 4.0 : 2.0;
}

static double layer_weight_bytes(const attn_config *c, attn_dtype dt) {
    if (c->kv_lora_rank > 0) {
        /* MLA: W_qa and W_qb (or W_q), W_kva, W_kvb, W_o, their norms */
        double h = c->n_heads, qk = c->head_dim, hid = c->hidden_size, ql = c->q_lora_rank;
        double kva = c->kv_lora_rank + c->qk_rope_head_dim;
        double q = ql > 0 ? hid * ql + ql + ql * h * qk : hid * h * qk;
        double kv = hid * kva + c->kv_lora_rank +
                    (double)c->kv_lora_rank * h * (c->qk_nope_head_dim + c->v_head_dim);
        return 4.0 * (q + kv + h * c->v_head_dim * hid);
    }
    double d_q = (double)c->n_heads * c->head_dim;
    double d_kv = (double)c->n_kv_heads * c->head_dim;
    double n = (double)c->hidden_size * (d_q + 2 * d_kv) + d_q * c->hidden_size;
    double biases = (c->has_qkv_bias ? d_q + 2 * d_kv : 0) + (c->has_o_bias ? c->hidden_size : 0);
    return projection_weight_bytes(c, dt) * n + 4.0 * biases;
}

/* Bytes of K and V for one token (all kv heads; MLA: the latent and k_rot) as a pool of this
 * dtype holds them, from its blocks of 128 tokens. */
static double kv_token_bytes(const attn_model *m, attn_dtype kv_dt) {
    return (double)attn_kv_block_bytes_for(m, 128, kv_dt) / 128.0;
}

/* Bytes one session's cache of a linear layer holds whatever its length: each KV head's running
 * state (head_dim^2 + head_dim doubles, whatever the pool's dtype) in whole blocks of the pool,
 * as many as fit a block. */
static double state_session_bytes(const attn_model *m, attn_dtype kv_dt) {
    const attn_config *c = attn_model_config(m);
    double block = (double)attn_kv_block_bytes_for(m, 128, kv_dt);
    double state = ((double)c->head_dim * c->head_dim + c->head_dim) * sizeof(double);
    int32_t per = (int32_t)(block / state);
    return per > 0 ? (double)((c->n_kv_heads + per - 1) / per) * block : 0.0;
}

/* Keys visible to query i, summed over T new tokens after P cached ones (causal, window). */
static double visible_keys(const attn_config *c, int32_t n_past, int32_t n_new) {
    double sum = 0.0;
    for (int32_t i = 0; i < n_new; i++) {
        int64_t k = (int64_t)n_past + i + 1;
        if (c->sliding_window > 0 && k > c->sliding_window) {
            k = c->sliding_window;
        }
        sum += (double)k;
    }
    return sum;
}

/* Keys some new token can see, i.e. K/V rows that must be read at least once. */
static double keys_read(const attn_config *c, int32_t n_past, int32_t n_new) {
    int64_t first = 0;
    if (c->sliding_window > 0 && n_past > c->sliding_window - 1) {
        first = n_past - (c->sliding_window - 1);
    }
    return (double)((int64_t)n_past + n_new - first);
}

/* FLOPs and bytes of one forward of n_seq sequences, each with n_new tokens after n_past. */
static void step_cost(const attn_model *model, attn_dtype dt, attn_dtype kv_dt, int32_t n_seq,
                      int32_t n_past, int32_t n_new, double *flops, double *bytes) {
    const attn_config *c = attn_model_config(model);
    double m = (double)n_seq * n_new;
    double d_q = (double)c->n_heads * c->head_dim;
    double d_kv = (double)c->n_kv_heads * c->head_dim;
    double proj = 2.0 * m * (d_q + 2 * d_kv) * c->hidden_size + 2.0 * m * c->hidden_size * d_q;
    double attn = 4.0 * c->n_heads * c->head_dim * visible_keys(c, n_past, n_new) * n_seq;
    double kv = kv_token_bytes(model, kv_dt) * n_seq * (keys_read(c, n_past, n_new) + n_new);
    if (c->kv_lora_rank > 0) {
        /* MLA: the projections, absorbing W_UK and applying W_UV per token, and per visible key
         * a score over kv_lora + rope dims and a PV over kv_lora. */
        double h = c->n_heads, hid = c->hidden_size, ql = c->q_lora_rank, qk = c->head_dim;
        double kvl = c->kv_lora_rank, kva = kvl + c->qk_rope_head_dim;
        proj = 2.0 * m *
               ((ql > 0 ? hid * ql + ql * h * qk : hid * h * qk) + hid * kva +
                h * (c->qk_nope_head_dim + c->v_head_dim) * kvl + h * c->v_head_dim * hid);
        attn = 2.0 * h * (kva + kvl) * visible_keys(c, n_past, n_new) * n_seq;
    }
    if (attn_config_layer_is_linear(c, 0)) {
        /* Per token: the state update (2 Hkv D^2) and each head's read of it (2 H D^2); the
         * state (Hkv (D^2 + D) doubles) read and written once per call. */
        double d2 = (double)c->head_dim * c->head_dim;
        attn = 2.0 * m * (c->n_kv_heads + c->n_heads) * d2;
        kv = 2.0 * n_seq * c->n_kv_heads * (d2 + c->head_dim) * 8.0;
    }
    *flops = proj + attn;
    double act = 2.0 * m * c->hidden_size * 4.0;
    *bytes = layer_weight_bytes(c, dt) + kv + act;
}

/* FLOPs and bytes of attention alone for one new token after n_past (attn_forward_qkv): the
 * scores and weighted sum, the K/V read and the new row written, q, k, v read and out written. */
static void attend_cost(const attn_model *model, attn_dtype kv_dt, int32_t n_past, double *flops,
                        double *bytes) {
    const attn_config *c = attn_model_config(model);
    double d_q = (double)c->n_heads * c->head_dim, d_kv = (double)c->n_kv_heads * c->head_dim;
    *flops = 4.0 * d_q * visible_keys(c, n_past, 1);
    *bytes =
        kv_token_bytes(model, kv_dt) * (keys_read(c, n_past, 1) + 1) + 4.0 * (2 * d_q + 2 * d_kv);
}

/* ---- timing loop ---------------------------------------------------------------------------- */

/* One rep: does its untimed setup and cleanup itself and writes the timed part to *seconds. */
typedef int (*rep_fn)(void *ctx, double *seconds);

/* Paired, what each timed rep is followed by: one probe of the limit the case is bound
 * by, whose figure turns the case's work into its time at that limit in the same seconds. */
typedef struct pairing {
    bench_probe *probe;
    bench_bound bound;
    double work; /* the call's FLOPs (BENCH_BOUND_SGEMM) or bytes */
} pairing;

/* The median of v's n values. Sorts v: measure reads the fastest rep from samples[0] after. */
static double median_of(double *v, int32_t n) {
    qsort(v, (size_t)n, sizeof(double), compare_doubles);
    return n % 2 == 1 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

/* Times fn's reps by pol (the median and the fastest into res) and, with pr, pairs each rep with
 * a probe (res->paired, res->paired_limit). */
static int measure(const rep_policy *pol, rep_fn fn, void *ctx, const pairing *pr,
                   case_result *res) {
    double *samples = malloc((size_t)pol->max_reps * 3 * sizeof(double));
    if (samples == NULL) {
        return ATTN_ENOMEM;
    }
    double *ratios = samples + pol->max_reps, *limits = ratios + pol->max_reps;
    double warm = 0.0;
    int rc = fn(ctx, &warm);
    int32_t n = 0;
    double total = 0.0;
    while (rc == ATTN_OK && n < pol->max_reps && (n < pol->min_reps || total < pol->min_seconds)) {
        rc = fn(ctx, &samples[n]);
        total += samples[n];
        if (rc == ATTN_OK && pr != NULL) {
            double t0 = bench_seconds();
            limits[n] = bench_probe_run(pr->probe, pr->bound);
            rc = limits[n] > 0 ? ATTN_OK : ATTN_ENOMEM;
            ratios[n] = pr->work / (limits[n] * 1e9) / samples[n];
            /* The probes count toward min_seconds: a 0.1 s sgemm after each of 200 reps of a
             * 2 ms case would make it last 20 s. */
            total += bench_seconds() - t0;
        }
        n++;
    }
    if (rc == ATTN_OK) {
        res->reps = n;
        double sum = 0.0;
        for (int32_t i = 0; i < n; i++) {
            sum += samples[i];
        }
        res->ms_mean = 1e3 * sum / n;
        res->ms = 1e3 * median_of(samples, n);
        res->ms_min = 1e3 * samples[0];
        res->paired = pr != NULL ? median_of(ratios, n) : 0.0;
        res->paired_limit = pr != NULL ? median_of(limits, n) : 0.0;
    }
    free(samples);
    return rc;
}

/* Everything one preset's cases share. */
typedef struct preset_run {
    const bench_opts *opts;
    const int32_t *decode_lens; /* ascending */
    int32_t n_decode_lens;
    bool has_batch;
    bool has_attend; /* attention alone runs (see preset_set_lens) */
    rep_policy policy;
    const char *name;
    char dtypes[16];      /* "<weights>/<kv>", the case names' suffix */
    char name_dtypes[48]; /* "<preset>@<dtypes>" */
    attn_dtype weights_dtype;
    attn_dtype kv_dtype; /* as the pool holds it (never AUTO) */
    attn_model *model;
    const attn_config *cfg;
    attn_kv_pool *pool;
    attn_workspace *ws;
    int32_t max_tokens; /* workspace tokens, also the prefill chunk when filling caches */
    float *x;           /* (max(max_tokens, MAX_BATCH), hidden) random hidden states */
    float *out;         /* same shape, forward outputs */
    result_list *results;
    const machine_limits *lim; /* measured before the cases, or not measured */
    bench_probe *probe;        /* paired, else NULL */
} preset_run;

typedef struct prefill_ctx {
    preset_run *run;
    int32_t n_new;
} prefill_ctx;

static int prefill_rep(void *p, double *seconds) {
    prefill_ctx *c = p;
    attn_kv *kv = NULL;
    int rc = attn_kv_create_for_layer(c->run->pool, 0, &kv);
    if (rc != ATTN_OK) {
        return rc;
    }
    attn_step step = {.kv = kv, .x = c->run->x, .n_tokens = c->n_new, .out = c->run->out};
    double t0 = bench_seconds();
    rc = attn_forward(c->run->model, 0, c->run->ws, &step, 1);
    *seconds = bench_seconds() - t0;
    attn_kv_destroy(kv);
    return rc;
}

/* n_seq caches of equal length n_past, one new token each, in one forward. */
typedef struct decode_ctx {
    preset_run *run;
    attn_kv *const *kvs; /* (n_seq) */
    int32_t n_seq;
    int32_t n_past;
    attn_step steps[MAX_BATCH];
} decode_ctx;

/* A linear layer's state cannot forget the new token: each rep advances a copy (made and freed
 * outside the timing) instead. */
static int decode_rep_on_copies(decode_ctx *c, double *seconds) {
    attn_kv *copies[MAX_BATCH] = {NULL};
    attn_step steps[MAX_BATCH];
    int rc = ATTN_OK;
    for (int32_t i = 0; i < c->n_seq && rc == ATTN_OK; i++) {
        rc = attn_kv_fork(c->kvs[i], &copies[i]);
        steps[i] = c->steps[i];
        steps[i].kv = copies[i];
    }
    if (rc == ATTN_OK) {
        double t0 = bench_seconds();
        rc = attn_forward(c->run->model, 0, c->run->ws, steps, c->n_seq);
        *seconds = bench_seconds() - t0;
    }
    for (int32_t i = 0; i < c->n_seq; i++) {
        attn_kv_destroy(copies[i]);
    }
    return rc;
}

static int decode_rep(void *p, double *seconds) {
    decode_ctx *c = p;
    if (attn_kv_is_state(c->kvs[0])) {
        return decode_rep_on_copies(c, seconds);
    }
    double t0 = bench_seconds();
    int rc = attn_forward(c->run->model, 0, c->run->ws, c->steps, c->n_seq);
    *seconds = bench_seconds() - t0;
    for (int32_t i = 0; i < c->n_seq && rc == ATTN_OK; i++) {
        rc = attn_kv_truncate(c->kvs[i], c->n_past);
    }
    return rc;
}

/* One cache of length n_past and one new token's q, k and v (attn_forward_qkv, as
 * /v1/kv/attend runs it): a decode's attention without its projections. */
typedef struct attend_ctx {
    preset_run *run;
    attn_kv *kv;
    int32_t n_past;
    attn_qkv_step step;
} attend_ctx;

static int attend_rep(void *p, double *seconds) {
    attend_ctx *c = p;
    double t0 = bench_seconds();
    int rc = attn_forward_qkv(c->run->model, 0, c->run->ws, &c->step, 1);
    *seconds = bench_seconds() - t0;
    return rc == ATTN_OK ? attn_kv_truncate(c->kv, c->n_past) : rc;
}

/* ---- reporting ------------------------------------------------------------------------------ */

static double roofline_bandwidth(const bench_opts *o, const machine_limits *lim) {
    return o->n_threads >= 2 ? lim->bw_gbs[1] : lim->bw_gbs[0];
}

/* A call that reads at most 2 x L3_BYTES reads the same bytes every rep, back to back (it is not
 * paired: pairing_of), and they fit the 32 MiB L3: it reads them from there. (Above 16 MiB such
 * calls were set against DRAM's bandwidth, a roofline 3x too long for bytes read from L3: small's
 * batch of 8 sessions in float32, 19 MB, or llama8b's attention alone at L=8192 in Q8_0.) */
static bool reads_from_l3(const case_result *r) {
    return r->bytes <= 2.0 * (double)L3_BYTES;
}

/* The roofline time of a call: its bytes at the measured bandwidth or its FLOPs at the sgemm
 * peak, whichever takes longer (a batch of decode steps turns compute-bound: 32 tokens through
 * llama8b's projections are 2.7 GFLOP). */
static double roofline_ms(const bench_opts *o, const machine_limits *lim, const case_result *r) {
    /* on one thread L3's 1-thread sweep: DRAM's, which --threads 1 took, is a third of it */
    double bw =
        reads_from_l3(r) ? lim->l3_gbs[o->n_threads >= 2 ? 1 : 0] : roofline_bandwidth(o, lim);
    double mem = r->bytes / (bw * 1e9) * 1e3;
    double flop = r->flops / (lim->sgemm_gflops * 1e9) * 1e3;
    return mem > flop ? mem : flop;
}

/* The limit that bounds a case under lim, for a call beyond the caches (the only ones paired):
 * the side of roofline_ms that takes longer, and the sgemm peak for a prefill, as its figure is
 * given. */
static bench_bound case_bound(const bench_opts *o, const machine_limits *lim,
                              const case_result *r) {
    bool is_flop = r->flops / lim->sgemm_gflops > r->bytes / roofline_bandwidth(o, lim);
    return r->kind == CASE_KIND_PREFILL || is_flop ? BENCH_BOUND_SGEMM : BENCH_BOUND_DRAM;
}

static void print_row(const bench_opts *o, const machine_limits *lim, const case_result *r) {
    double s = r->ms * 1e-3;
    char limit[96] = "-";
    if (lim->is_measured && r->kind == CASE_KIND_PREFILL) {
        snprintf(limit, sizeof(limit), "%5.1f%% of sgemm peak",
                 100.0 * r->flops / s * 1e-9 / lim->sgemm_gflops);
    } else if (lim->is_measured) {
        double roof_ms = roofline_ms(o, lim, r);
        snprintf(limit, sizeof(limit), "%4.2f of roofline (roof %.3f ms, %.2fx)", roof_ms / r->ms,
                 roof_ms, r->ms / roof_ms);
    }
    char paired[64] = "";
    if (r->paired > 0 && r->kind == CASE_KIND_PREFILL) {
        snprintf(paired, sizeof paired, "; paired %5.1f%%", 100.0 * r->paired);
    } else if (r->paired > 0) {
        snprintf(paired, sizeof paired, "; paired %4.2f (%.2fx)", r->paired, 1.0 / r->paired);
    }
    printf("%-36s %5" PRId32 " %10.3f %11.1f %9.1f %8.2f  %s%s\n", r->name, r->reps, r->ms,
           r->n_new / s, r->flops / s * 1e-9, r->bytes / s * 1e-9, limit, paired);
    fflush(stdout);
}

static void print_result_line(const bench_opts *o, const machine_limits *lim,
                              const case_result *r) {
    double s = r->ms * 1e-3;
    double frac = -1.0;
    double roof_ms = -1.0;
    if (lim->is_measured && r->kind == CASE_KIND_PREFILL) {
        frac = r->flops / s * 1e-9 / lim->sgemm_gflops;
    } else if (lim->is_measured) {
        roof_ms = roofline_ms(o, lim, r);
        frac = roof_ms / r->ms;
    }
    printf("RESULT impl=attnd case=%s ms=%.4f min_ms=%.4f mean_ms=%.4f reps=%" PRId32
           " tok_s=%.2f gflops=%.2f gbs=%.3f roof_ms=%.4f frac=%.4f paired=%.4f"
           " paired_limit=%.2f\n",
           r->name, r->ms, r->ms_min, r->ms_mean, r->reps, r->n_new / s, r->flops / s * 1e-9,
           r->bytes / s * 1e-9, roof_ms, frac, r->paired > 0 ? r->paired : -1.0,
           r->paired > 0 ? r->paired_limit : -1.0);
}

/* Keeps r for the table, which is printed once the machine has been measured again after the
 * cases; stderr shows progress meanwhile. */
static int add_result(preset_run *run, const case_result *r) {
    if (run->results->n >= MAX_RESULTS) {
        fprintf(stderr, "attn_bench: more than %d cases: raise MAX_RESULTS\n", MAX_RESULTS);
        return ATTN_ERANGE;
    }
    run->results->items[run->results->n++] = *r;
    fprintf(stderr, "attn_bench: %-36s %10.3f ms (%" PRId32 " reps)\n", r->name, r->ms, r->reps);
    return ATTN_OK;
}

/* ---- cases ---------------------------------------------------------------------------------- */

/* The pairing of case r's reps (at pr), or NULL when unpaired. A call whose data could sit in
 * the caches (2 x L3_BYTES or less: the small presets) is not paired: every probe sweeps them
 * out, and the rep after it would time the refill (small's decode at L=2048: 0.20 ms against
 * 0.14, even with an untimed rep between). */
static const pairing *pairing_of(const preset_run *run, const case_result *r, pairing *pr) {
    if (run->probe == NULL || r->bytes <= 2.0 * (double)L3_BYTES) {
        return NULL;
    }
    bench_bound b = case_bound(run->opts, run->lim, r);
    *pr = (pairing){
        .probe = run->probe, .bound = b, .work = b == BENCH_BOUND_SGEMM ? r->flops : r->bytes};
    return pr;
}

/* Times case r's reps of fn (paired as pairing_of says) and keeps the result; a failure is
 * reported by the case's name. */
static int time_case(preset_run *run, rep_fn fn, void *ctx, case_result *r) {
    pairing pr;
    int rc = measure(&run->policy, fn, ctx, pairing_of(run, r, &pr), r);
    if (rc != ATTN_OK) {
        fprintf(stderr, "attn_bench: %s: %s\n", r->name, attn_strerror(rc));
        return rc;
    }
    return add_result(run, r);
}

static int run_prefill_cases(preset_run *run) {
    for (size_t i = 0; i < sizeof(prefill_lens) / sizeof(prefill_lens[0]); i++) {
        case_result r = {.kind = CASE_KIND_PREFILL, .n_new = prefill_lens[i]};
        case_name(r.name, sizeof(r.name), run->name, run->dtypes, r.kind, prefill_lens[i]);
        if (!case_selected(run->opts, r.name)) {
            continue;
        }
        step_cost(run->model, run->weights_dtype, run->kv_dtype, 1, 0, prefill_lens[i], &r.flops,
                  &r.bytes);
        prefill_ctx ctx = {.run = run, .n_new = prefill_lens[i]};
        int rc = time_case(run, prefill_rep, &ctx, &r);
        if (rc != ATTN_OK) {
            return rc;
        }
    }
    return ATTN_OK;
}

/* Grows kv to n_tokens with forwards of at most the workspace's max_tokens (chunked prefill). */
static int fill_cache(preset_run *run, attn_kv *kv, int32_t n_tokens) {
    while (attn_kv_len(kv) < n_tokens) {
        int32_t n = n_tokens - attn_kv_len(kv);
        n = n < run->max_tokens ? n : run->max_tokens;
        attn_step step = {.kv = kv, .x = run->x, .n_tokens = n, .out = run->out};
        int rc = attn_forward(run->model, 0, run->ws, &step, 1);
        if (rc != ATTN_OK) {
            return rc;
        }
    }
    return ATTN_OK;
}

static int time_decode(preset_run *run, attn_kv *const *kvs, int32_t n_seq, int32_t n_past,
                       case_result *r) {
    decode_ctx ctx = {.run = run, .kvs = kvs, .n_seq = n_seq, .n_past = n_past};
    size_t hidden = (size_t)run->cfg->hidden_size;
    for (int32_t i = 0; i < n_seq; i++) {
        ctx.steps[i] = (attn_step){.kv = kvs[i],
                                   .x = run->x + (size_t)i * hidden,
                                   .n_tokens = 1,
                                   .out = run->out + (size_t)i * hidden};
    }
    r->n_new = n_seq;
    step_cost(run->model, run->weights_dtype, run->kv_dtype, n_seq, n_past, 1, &r->flops,
              &r->bytes);
    return time_case(run, decode_rep, &ctx, r);
}

static int time_attend(preset_run *run, attn_kv *kv, int32_t n_past, case_result *r) {
    const attn_config *c = run->cfg;
    size_t d_q = (size_t)c->n_heads * c->head_dim, d_kv = (size_t)c->n_kv_heads * c->head_dim;
    /* q, k and v side by side in the run's hidden states, which hold many tokens' worth */
    attend_ctx ctx = {.run = run,
                      .kv = kv,
                      .n_past = n_past,
                      .step = {.kv = kv,
                               .n_tokens = 1,
                               .q = run->x,
                               .k = run->x + d_q,
                               .v = run->x + d_q + d_kv,
                               .out = run->out}};
    r->n_new = 1;
    attend_cost(run->model, run->kv_dtype, n_past, &r->flops, &r->bytes);
    return time_case(run, attend_rep, &ctx, r);
}

/* The batched cases, with kvs[0] at BATCH_LEN tokens: the other caches are forks of it, so they
 * hold their own blocks (distinct memory to read) without 31 more prefills. */
static int run_batch_cases(preset_run *run, attn_kv *kv0) {
    attn_kv *kvs[MAX_BATCH] = {kv0};
    int32_t n_forks = 1;
    int rc = ATTN_OK;
    for (size_t i = 0; i < sizeof(batch_sizes) / sizeof(batch_sizes[0]) && rc == ATTN_OK; i++) {
        int32_t b = batch_sizes[i];
        case_result r = {.kind = CASE_KIND_BATCH};
        case_name(r.name, sizeof(r.name), run->name, run->dtypes, r.kind, b);
        if (!case_selected(run->opts, r.name)) {
            continue;
        }
        for (; n_forks < b && rc == ATTN_OK; n_forks++) {
            rc = attn_kv_fork(kv0, &kvs[n_forks]);
        }
        if (rc != ATTN_OK) {
            n_forks--;
            fprintf(stderr, "attn_bench: %s: fork: %s\n", r.name, attn_strerror(rc));
            break;
        }
        rc = time_decode(run, kvs, b, BATCH_LEN, &r);
    }
    for (int32_t i = 1; i < n_forks; i++) {
        attn_kv_destroy(kvs[i]);
    }
    return rc;
}

static bool any_batch_selected(const preset_run *run) {
    for (size_t i = 0; i < sizeof(batch_sizes) / sizeof(batch_sizes[0]); i++) {
        char name[64];
        case_name(name, sizeof(name), run->name, run->dtypes, CASE_KIND_BATCH, batch_sizes[i]);
        if (case_selected(run->opts, name)) {
            return true;
        }
    }
    return false;
}

/* One cache grows through the decode lengths; each decode case times steps at a fixed length by
 * truncating the new token away after every rep. */
static int run_decode_cases(preset_run *run) {
    bool need_batch = run->has_batch && any_batch_selected(run);
    attn_kv *kv = NULL;
    int rc = ATTN_OK;
    char sizes[160] = "";
    for (int32_t i = 0; i < run->n_decode_lens && rc == ATTN_OK; i++) {
        int32_t len = run->decode_lens[i];
        case_result r = {.kind = CASE_KIND_DECODE};
        case_name(r.name, sizeof(r.name), run->name, run->dtypes, r.kind, len);
        bool need_decode = case_selected(run->opts, r.name);
        bool at_batch = need_batch && len == BATCH_LEN;
        case_result ra = {.kind = CASE_KIND_ATTEND};
        case_name(ra.name, sizeof(ra.name), run->name, run->dtypes, ra.kind, len);
        bool need_attend = run->has_attend && case_selected(run->opts, ra.name);
        if (!need_decode && !at_batch && !need_attend) {
            continue;
        }
        if (kv == NULL) {
            rc = attn_kv_create_for_layer(run->pool, 0, &kv);
        }
        if (rc == ATTN_OK) {
            rc = fill_cache(run, kv, len);
            if (rc != ATTN_OK) {
                fprintf(stderr, "attn_bench: filling a cache to %" PRId32 ": %s\n", len,
                        attn_strerror(rc));
            }
        }
        if (rc == ATTN_OK) {
            size_t at = strlen(sizes);
            snprintf(sizes + at, sizeof sizes - at, "%s%" PRId32 ": %.2f MiB", at ? ", " : "", len,
                     (double)attn_kv_bytes(kv) / 1048576.0);
        }
        if (rc == ATTN_OK && attn_kv_window(kv) > 0 && i + 1 == run->n_decode_lens) {
            /* The ring gives back what the window left behind once its reservation is returned,
             * as the daemon does after each request. */
            rc = attn_kv_truncate(kv, len);
            result_list *res = run->results;
            double full = kv_token_bytes(run->model, run->kv_dtype) * len / 1048576.0;
            snprintf(res->notes[res->n_notes++], sizeof res->notes[0],
                     "%s: at L=%" PRId32 " the local layer's ring holds %.1f MiB of KV (%" PRId32
                     " tokens), where a full cache holds %.1f MiB: %.2fx\n",
                     run->name, len, (double)attn_kv_bytes(kv) / 1048576.0,
                     len - attn_kv_first_held(kv), full,
                     (double)attn_kv_bytes(kv) / 1048576.0 / full);
        }
        if (rc == ATTN_OK && need_decode) {
            rc = time_decode(run, &kv, 1, len, &r);
        }
        if (rc == ATTN_OK && need_attend) {
            rc = time_attend(run, kv, len, &ra);
        }
        if (rc == ATTN_OK && at_batch) {
            rc = run_batch_cases(run, kv);
        }
    }
    if (rc == ATTN_OK && sizes[0] != '\0' && run->n_decode_lens == 3 &&
        run->decode_lens == long_decode_lens) {
        result_list *res = run->results;
        snprintf(res->notes[res->n_notes++], sizeof res->notes[0],
                 "%s: one session's cache of the layer at L = %s\n", run->name, sizes);
    }
    attn_kv_destroy(kv);
    return rc;
}

/* ---- setup ---------------------------------------------------------------------------------- */

/* Touches every block of the pool once (a one-block cache forked until the pool is full), so
 * first-touch page faults are paid here and not inside the timed reps. */
static int warm_pool(preset_run *run) {
    int32_t total = attn_kv_pool_blocks_total(run->pool);
    attn_kv **forks = calloc((size_t)total, sizeof(attn_kv *));
    attn_kv *seed = NULL;
    int32_t n = 0;
    int rc = forks == NULL ? ATTN_ENOMEM : attn_kv_create_for_layer(run->pool, 0, &seed);
    if (rc == ATTN_OK) {
        rc = fill_cache(run, seed, attn_kv_pool_block_tokens(run->pool));
    }
    while (rc == ATTN_OK && n < total && attn_kv_pool_blocks_free(run->pool) > 0) {
        rc = attn_kv_fork(seed, &forks[n]);
        n += rc == ATTN_OK;
    }
    if (rc == ATTN_ENOSPC && n > 0) {
        /* A linear layer's state spans several blocks: the last free ones may not hold a whole
         * fork (small-linear with a bf16 pool: two blocks a state, an odd number free). */
        rc = ATTN_OK;
    }
    for (int32_t i = 0; i < n; i++) {
        attn_kv_destroy(forks[i]);
    }
    attn_kv_destroy(seed);
    free(forks);
    return rc;
}

static int32_t max_selected(const preset_run *run, case_kind kind, const int32_t *vals, size_t n) {
    int32_t best = 0;
    for (size_t i = 0; i < n; i++) {
        char name[64];
        case_name(name, sizeof(name), run->name, run->dtypes, kind, vals[i]);
        if (case_selected(run->opts, name) && vals[i] > best) {
            best = vals[i];
        }
    }
    return best;
}

/* Blocks the selected cases hold at their peak: one prefill cache, or the decode cache at its
 * longest plus one new token, or the batch's caches (the phases never overlap). */
static int32_t blocks_needed(const preset_run *run, int32_t block_tokens) {
    int32_t s = max_selected(run, CASE_KIND_PREFILL, prefill_lens,
                             sizeof(prefill_lens) / sizeof(prefill_lens[0]));
    int32_t l = max_selected(run, CASE_KIND_DECODE, run->decode_lens, (size_t)run->n_decode_lens);
    int32_t la = run->has_attend ? max_selected(run, CASE_KIND_ATTEND, run->decode_lens,
                                                (size_t)run->n_decode_lens)
                                 : 0;
    l = la > l ? la : l;
    int32_t b = run->has_batch ? max_selected(run, CASE_KIND_BATCH, batch_sizes,
                                              sizeof(batch_sizes) / sizeof(batch_sizes[0]))
                               : 0;
    int32_t need = (s + block_tokens - 1) / block_tokens;
    int32_t dec = l > 0 ? (l + 1 + block_tokens - 1) / block_tokens : 0;
    int32_t bat = b * ((BATCH_LEN + 1 + block_tokens - 1) / block_tokens);
    need = dec > need ? dec : need;
    need = bat > need ? bat : need;
    return need;
}

/* Creates the pool, in the run's KV dtype, with room for blocks_needed plus slack. */
static int create_pool(preset_run *run) {
    int32_t bt = run->opts->block_tokens;
    int32_t need = blocks_needed(run, bt);
    need += 8 + need / 16;
    size_t block_bytes = attn_kv_block_bytes_for(run->model, bt, run->kv_dtype);
    return attn_kv_pool_create_typed(run->model, (size_t)need * block_bytes, bt, run->kv_dtype,
                                     &run->pool);
}

/* Whether name is one of the comma-separated list's items. */
static bool in_list(const char *list, const char *name) {
    size_t len = strlen(name);
    for (const char *p = list; *p != '\0';) {
        size_t n = strcspn(p, ",");
        if (n == len && strncmp(p, name, n) == 0) {
            return true;
        }
        p += n + (p[n] == ',');
    }
    return false;
}

static const struct bench_preset *preset_find(const char *name) {
    for (int32_t i = 0; i < N_PRESETS; i++) {
        if (strcmp(presets[i].name, name) == 0) {
            return &presets[i];
        }
    }
    return NULL;
}

/* Every item of the comma-separated list names a preset. */
static bool presets_known(const char *list) {
    char name[32];
    for (const char *p = list; *p != '\0';) {
        size_t n = strcspn(p, ",");
        if (n == 0 || n >= sizeof name) {
            return false;
        }
        memcpy(name, p, n);
        name[n] = '\0';
        if (preset_find(name) == NULL) {
            return false;
        }
        p += n + (p[n] == ',');
    }
    return *list != '\0';
}

static void preset_set_lens(preset_run *run, const struct bench_preset *bp) {
    run->decode_lens = bp->is_long ? long_decode_lens : decode_lens;
    run->n_decode_lens = bp->is_long ? 3 : (int32_t)(sizeof decode_lens / sizeof decode_lens[0]);
    run->has_batch = !bp->is_long;
    /* Attention alone (attn_forward_qkv) serves softmax attention with expanded heads: not a
     * linear layer's state, not multi-head latent attention. */
    attn_config c;
    bool known = attn_config_preset(bp->engine_preset, &c) == ATTN_OK;
    if (known && bp->adjust != NULL) {
        bp->adjust(&c);
    }
    run->has_attend = known && c.kv_lora_rank == 0 && !attn_config_layer_is_linear(&c, 0);
}

/* Whether the preset, in dtype pair d, has a case the filters select. */
static bool preset_selected(const bench_opts *o, const char *preset, int32_t d) {
    preset_run probe = {.opts = o, .name = preset};
    attn_dtype kv = o->kv_dtypes[d] != ATTN_DTYPE_AUTO ? o->kv_dtypes[d] : o->weights_dtypes[d];
    snprintf(probe.dtypes, sizeof probe.dtypes, "%s/%s", attn_dtype_name(o->weights_dtypes[d]),
             attn_dtype_name(kv));
    preset_set_lens(&probe, preset_find(preset));
    bool is_named = strcmp(o->preset, "all") == 0 || in_list(o->preset, preset);
    return is_named && blocks_needed(&probe, 64) > 0;
}

static int run_preset(const bench_opts *o, const char *preset, attn_dtype weights_dtype,
                      attn_dtype kv_dtype, const attn_executor *ex, const machine_limits *lim,
                      bench_probe *probe, result_list *results) {
    preset_run run = {.opts = o, .name = preset, .results = results, .lim = lim, .probe = probe};
    run.weights_dtype = weights_dtype;
    run.policy = o->is_quick ? (rep_policy){3, 20, 0.05} : (rep_policy){5, 200, 1.0};
    if (o->n_reps > 0) {
        run.policy = (rep_policy){o->n_reps, o->n_reps, 0.0};
    }
    const struct bench_preset *bp = preset_find(preset);
    preset_set_lens(&run, bp);
    attn_config cfg;
    int rc = attn_config_preset(bp->engine_preset, &cfg);
    if (rc == ATTN_OK && bp->adjust != NULL) {
        bp->adjust(&cfg);
    }
    /* The longest decode case appends one token after the last decode length. */
    int32_t longest = run.decode_lens[run.n_decode_lens - 1];
    attn_load_params lp = {.layer_first = 0,
                           .layer_count = 1,
                           .max_seq = longest >= 16384 ? longest + 1 : 16384,
                           .weights_dtype = weights_dtype};
    if (rc == ATTN_OK) {
        rc = attn_model_create_random(&cfg, o->seed, &lp, &run.model);
    }
    if (rc != ATTN_OK) {
        fprintf(stderr, "attn_bench: model %s: %s\n", preset, attn_strerror(rc));
        return rc;
    }
    run.cfg = attn_model_config(run.model);
    /* what AUTO holds: the weights' dtype, which MLA keeps f32 */
    run.kv_dtype = kv_dtype != ATTN_DTYPE_AUTO ? kv_dtype : attn_model_weights_dtype(run.model);
    run.weights_dtype = attn_model_weights_dtype(run.model);
    snprintf(run.dtypes, sizeof run.dtypes, "%s/%s", attn_dtype_name(run.weights_dtype),
             attn_dtype_name(run.kv_dtype));
    snprintf(run.name_dtypes, sizeof run.name_dtypes, "%s@%s", preset, run.dtypes);
    run.max_tokens = prefill_lens[sizeof(prefill_lens) / sizeof(prefill_lens[0]) - 1];
    size_t rows = (size_t)(run.max_tokens > MAX_BATCH ? run.max_tokens : MAX_BATCH);
    size_t n_x = rows * (size_t)run.cfg->hidden_size;
    run.x = malloc(n_x * sizeof(float));
    run.out = malloc(n_x * sizeof(float));
    rc = run.x == NULL || run.out == NULL ? ATTN_ENOMEM : ATTN_OK;
    if (rc == ATTN_OK) {
        bench_rand_fill(run.x, n_x, o->seed ^ 0x5eedull);
        memset(run.out, 0, n_x * sizeof(float));
        rc = attn_workspace_create(run.model, run.max_tokens, ex, &run.ws);
    }
    if (rc == ATTN_OK) {
        rc = create_pool(&run);
    }
    if (rc == ATTN_OK) {
        rc = warm_pool(&run);
    }
    if (rc != ATTN_OK) {
        fprintf(stderr, "attn_bench: %s setup: %s\n", preset, attn_strerror(rc));
    } else {
        /* a linear layer's cache is its state, the same bytes at every length */
        bool is_linear = attn_config_layer_is_linear(run.cfg, 0);
        double kv_kib = (is_linear ? state_session_bytes(run.model, run.kv_dtype)
                                   : kv_token_bytes(run.model, run.kv_dtype)) /
                        1024.0;
        snprintf(results->presets[results->n_presets++], sizeof(results->presets[0]),
                 "%s: hidden %" PRId32 ", heads %" PRId32 "/%" PRId32 " kv, head_dim %" PRId32
                 "%s%s%s, weights %.1f MiB/layer, KV %.1f KiB/%s, pool %.0f MiB in %" PRId32
                 "-token blocks\n",
                 run.name_dtypes, run.cfg->hidden_size, run.cfg->n_heads, run.cfg->n_kv_heads,
                 run.cfg->head_dim,
                 run.cfg->qk_norm != ATTN_QK_NORM_NONE ? ", q/k RMSNorm per head" : "",
                 run.cfg->logit_softcap > 0 ? ", scores soft-capped at 50, scale 256^-1/2" : "",
                 run.cfg->sliding_window > 0 ? ", sliding window 4096 (a ring cache)" : "",
                 layer_weight_bytes(run.cfg, run.weights_dtype) / 1048576.0, kv_kib,
                 is_linear ? "session (a state)" : "token",
                 (double)attn_kv_pool_bytes_limit(run.pool) / 1048576.0,
                 attn_kv_pool_block_tokens(run.pool));
        if (run.cfg->kv_lora_rank > 0) {
            /* the latent against what expanded heads, or GQA with 8 KV heads of 128, would hold */
            double mla = kv_token_bytes(run.model, ATTN_DTYPE_F32);
            /* each head's key (head_dim: nope + rope) and its value (v_head_dim) */
            double expanded =
                (double)run.cfg->n_heads * (run.cfg->head_dim + run.cfg->v_head_dim) * 4.0;
            double gqa = 2.0 * 8 * 128 * 4.0;
            snprintf(results->notes[results->n_notes++], sizeof results->notes[0],
                     "%s: the cache holds %.0f bytes a token (latent %d + k_rot %d floats); "
                     "expanded heads would hold %.0f (%.0fx), GQA with 8 KV heads of 128 %.0f "
                     "(%.1fx)\n",
                     preset, mla, (int)run.cfg->kv_lora_rank, (int)run.cfg->qk_rope_head_dim,
                     expanded, expanded / mla, gqa, gqa / mla);
        }
        /* Sessions a GiB of --kv-budget-mb holds, at the batch cases' length, across all of a
         * model's layers as this one: the capacity each KV dtype buys. A linear layer's cache is
         * its state, the same bytes at every length (double whatever the dtype): not tokens. */
        if (is_linear) {
            double f32_state = state_session_bytes(run.model, ATTN_DTYPE_F32);
            double state = state_session_bytes(run.model, run.kv_dtype);
            snprintf(results->notes[results->n_notes++], sizeof results->notes[0],
                     "%s: KV capacity: a state of %.0f bytes/session/layer at any length, %.2f "
                     "sessions x %d layers per GiB of --kv-budget-mb, %.2fx f32's\n",
                     run.name_dtypes, state, 1073741824.0 / (state * run.cfg->n_layers),
                     (int)run.cfg->n_layers, f32_state / state);
        } else {
            double f32_tok = kv_token_bytes(run.model, ATTN_DTYPE_F32);
            double tok = kv_token_bytes(run.model, run.kv_dtype);
            double per_gib = 1073741824.0 / (tok * BATCH_LEN * run.cfg->n_layers);
            snprintf(results->notes[results->n_notes++], sizeof results->notes[0],
                     "%s: KV capacity: %.0f bytes/token/layer, %.2f sessions of %d tokens x %d "
                     "layers per GiB of --kv-budget-mb, %.2fx f32's\n",
                     run.name_dtypes, tok, per_gib, BATCH_LEN, (int)run.cfg->n_layers,
                     f32_tok / tok);
        }
        rc = run_prefill_cases(&run);
    }
    if (rc == ATTN_OK) {
        rc = run_decode_cases(&run);
    }
    attn_kv_pool_destroy(run.pool);
    attn_workspace_destroy(run.ws);
    attn_model_destroy(run.model);
    free(run.x);
    free(run.out);
    return rc;
}

/* ---- main ----------------------------------------------------------------------------------- */

static void usage(FILE *f) {
    fprintf(f, "usage: attn_bench [flags]\n"
               "  --threads N       OpenBLAS and executor threads (default 2)\n"
               "  --no-executor     run attention on the calling thread only\n"
               "  --quick           fewer reps and a 1 GiB bandwidth buffer (smoke runs)\n"
               "  --preset LIST     comma-separated: small, llama8b, qwen3, gemma2, small-long, "
               "small-linear, deepseek-v3; or all (default)\n"
               "  --case LIST       comma-separated substrings of case names, e.g. decode,_B32\n"
               "  --reps N          exactly N timed reps per case (default: adaptive)\n"
               "  --block-tokens N  KV block size (default 128, the engine's)\n"
               "  --dtypes LIST     weights/KV dtype pairs to run every case in (default "
               "f32/f32,bf16/bf16,bf16/f16,bf16/q8_0);\n"
               "                    weights f32, bf16 or f16; KV auto (the weights'), f32, bf16, "
               "f16 or q8_0\n"
               "  --weights-dtype D one pair: the projections' dtype (KV: --kv-dtype, or auto)\n"
               "  --kv-dtype D      one pair: the KV cache's dtype (weights: --weights-dtype, or "
               "f32)\n"
               "  --bw-mib N        bandwidth sweep buffer in MiB (default 2048)\n"
               "  --skip-limits     do not measure sgemm peak and bandwidth (nor pair the reps)\n"
               "  --paired          pair the reps (the default, unless --skip-limits)\n"
               "  --no-paired       do not probe the limit a case is bound by after each of its\n"
               "                    timed reps (by default one sgemm 2048^3 or a read sweep of\n"
               "                    256 MiB, whose figure gives that rep's own ratio; the table\n"
               "                    adds their median; calls within the caches are not paired)\n"
               "  --seed N          weights and inputs seed (default 1)\n"
               "  --avx2            the engine's AVX2 kernels even where the CPU has AVX-512 "
               "(decode\n"
               "                    attention, the projections of 4 tokens or more)\n");
}

static bool parse_int(const char *s, long lo, long hi, long *out) {
    char *end = NULL;
    long v = strtol(s, &end, 10);
    if (s[0] == '\0' || *end != '\0' || v < lo || v > hi) {
        return false;
    }
    *out = v;
    return true;
}

/* --dtypes W/KV,...: weights f32, bf16 or f16; KV auto, f32, bf16, f16 or q8_0. */
static bool parse_dtype_pairs(const char *list, bench_opts *o) {
    int32_t n = 0;
    for (const char *p = list; *p != '\0' && n < MAX_DTYPE_PAIRS;) {
        char w[8], kv[8];
        int used = 0;
        if (sscanf(p, "%7[^/,]/%7[^,]%n", w, kv, &used) != 2 ||
            attn_dtype_parse(w, &o->weights_dtypes[n]) != ATTN_OK ||
            attn_dtype_parse(kv, &o->kv_dtypes[n]) != ATTN_OK ||
            o->weights_dtypes[n] == ATTN_DTYPE_AUTO || o->weights_dtypes[n] == ATTN_DTYPE_Q8_0) {
            return false;
        }
        n++;
        p += used;
        if (*p == ',') {
            p++;
        } else if (*p != '\0') {
            return false;
        }
    }
    o->n_dtype_pairs = n;
    return n > 0;
}

/* Returns 0 when the flags are valid, 1 after --help, -1 after printing what is wrong. */
static int parse_args(int argc, char **argv, bench_opts *o) {
    size_t bw_mib = 0;
    attn_dtype one_w = ATTN_DTYPE_F32, one_kv = ATTN_DTYPE_AUTO;
    bool has_one = false;
    int paired = 0; /* 1: --paired, -1: --no-paired, 0: the default */
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *val = i + 1 < argc ? argv[i + 1] : NULL;
        long v = 0;
        bool ok = true;
        if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
            usage(stdout);
            return 1;
        } else if (strcmp(a, "--no-executor") == 0) {
            o->use_executor = false;
        } else if (strcmp(a, "--quick") == 0) {
            o->is_quick = true;
        } else if (strcmp(a, "--avx2") == 0) {
            attn_kernels_allow_avx512(false);
        } else if (strcmp(a, "--skip-limits") == 0) {
            o->skip_limits = true;
        } else if (strcmp(a, "--paired") == 0 || strcmp(a, "--no-paired") == 0) {
            paired = strcmp(a, "--paired") == 0 ? 1 : -1;
        } else if (val == NULL) {
            ok = false;
        } else if (strcmp(a, "--threads") == 0 && (ok = parse_int(val, 1, 64, &v))) {
            o->n_threads = (int32_t)v;
            i++;
        } else if (strcmp(a, "--preset") == 0) {
            o->preset = val;
            ok = strcmp(val, "all") == 0 || presets_known(val);
            i++;
        } else if (strcmp(a, "--case") == 0) {
            o->case_filter = val;
            i++;
        } else if (strcmp(a, "--reps") == 0 && (ok = parse_int(val, 1, 100000, &v))) {
            o->n_reps = (int32_t)v;
            i++;
        } else if (strcmp(a, "--weights-dtype") == 0 || strcmp(a, "--kv-dtype") == 0) {
            /* one pair: the other half as given before, or its default */
            attn_dtype dt = ATTN_DTYPE_AUTO;
            bool is_w = strcmp(a, "--weights-dtype") == 0;
            ok = attn_dtype_parse(val, &dt) == ATTN_OK &&
                 (is_w ? dt != ATTN_DTYPE_AUTO && dt != ATTN_DTYPE_Q8_0 : true);
            if (ok) {
                one_w = is_w ? dt : one_w;
                one_kv = is_w ? one_kv : dt;
                has_one = true;
            }
            i++;
        } else if (strcmp(a, "--dtypes") == 0) {
            ok = parse_dtype_pairs(val, o);
            i++;
        } else if (strcmp(a, "--block-tokens") == 0 && (ok = parse_int(val, 16, 256, &v))) {
            o->block_tokens = (int32_t)v;
            i++;
        } else if (strcmp(a, "--bw-mib") == 0 && (ok = parse_int(val, 64, 1 << 20, &v))) {
            bw_mib = (size_t)v;
            i++;
        } else if (strcmp(a, "--seed") == 0 && (ok = parse_int(val, 0, 0x7fffffffL, &v))) {
            o->seed = (uint64_t)v;
            i++;
        } else {
            ok = false;
        }
        if (!ok) {
            fprintf(stderr, "attn_bench: bad flag or value: %s%s%s (see --help)\n", a,
                    val != NULL ? " " : "", val != NULL ? val : "");
            return -1;
        }
    }
    if (has_one) {
        o->weights_dtypes[0] = one_w;
        o->kv_dtypes[0] = one_kv;
        o->n_dtype_pairs = 1;
    }
    if (paired > 0 && o->skip_limits) {
        fprintf(stderr, "attn_bench: --paired needs the limits (drop --skip-limits)\n");
        return -1;
    }
    o->is_paired = paired > 0 || (paired == 0 && !o->skip_limits);
    if (bw_mib == 0) {
        bw_mib = o->is_quick ? 1024 : 2048;
    }
    o->bw_bytes = bw_mib << 20;
    return 0;
}

/* Both limits measurements and the one used (the higher of each: load from other processes only
 * lowers them), then the cost model and the column header. */
static void print_header(const bench_opts *o, const machine_limits *before,
                         const machine_limits *after, const machine_limits *lim) {
    printf("attn_bench: threads %" PRId32 " (OpenBLAS %s, core %s), attention executor: %s, "
           "decode kernels %s\n",
           o->n_threads, openblas_get_config(), openblas_get_corename(),
           o->use_executor ? "bench pthread pool" : "none (calling thread)", attn_kernels_name());
    if (lim->is_measured) {
        printf("machine, measured before / after the cases (the higher is used): cblas_sgemm "
               "%d^3 peak %.1f / %.1f GFLOP/s; read bandwidth over %zu MiB %.1f / %.1f GB/s with 1 "
               "thread, %.1f / %.1f GB/s with 2; over 16 MiB (L3) %.1f / %.1f GB/s with 1 "
               "thread, %.1f / %.1f GB/s with 2\n",
               SGEMM_N, before->sgemm_gflops, after->sgemm_gflops, lim->bw_bytes >> 20,
               before->bw_gbs[0], after->bw_gbs[0], before->bw_gbs[1], after->bw_gbs[1],
               before->l3_gbs[0], after->l3_gbs[0], before->l3_gbs[1], after->l3_gbs[1]);
        double lo =
            before->sgemm_gflops < after->sgemm_gflops ? before->sgemm_gflops : after->sgemm_gflops;
        double bw_lo = before->bw_gbs[1] < after->bw_gbs[1] ? before->bw_gbs[1] : after->bw_gbs[1];
        if (lo < 0.85 * lim->sgemm_gflops || bw_lo < 0.85 * lim->bw_gbs[1]) {
            printf("WARNING: the limits moved by more than 15%% during the run: the machine is "
                   "busy, so every figure below is unreliable\n");
        }
    } else {
        printf("machine: not measured (--skip-limits)\n");
    }
    printf("FLOPs per call = 2*M*N*K per projection (M new tokens; QKV N=(H+2*Hkv)*D, K=hidden; "
           "O N=hidden, K=H*D)\n"
           "              + 4*H*D*(visible keys) per new token (QK^T and PV); RoPE, softmax "
           "not counted\n"
           "bytes per call = weights once + K/V read (keys visible to any new token, per "
           "sequence) + K/V written (new tokens) + x read + output written\n"
           "attend_L: attention alone (one token's q, k, v given, no projections): its QK^T and "
           "PV FLOPs; bytes the K/V read and written, q, k, v read and the output written\n"
           "limit: prefill as %% of the sgemm peak; decode and batch as roofline time / "
           "measured time, roofline = max(bytes / %d-thread bandwidth, FLOPs / sgemm peak) "
           "(1.00 = at the roofline), the bandwidth of a 16 MiB buffer (L3) for calls that read "
           "32 MiB or less (the L3's size, rep after rep)\n"
           "(the small preset's decode moves a few MiB, which stay in L3: its roofline is "
           "L3's)\n"
           "ms is the median of the timed reps after one warm-up; GB = 1e9 bytes\n%s\n",
           o->n_threads >= 2 ? 2 : 1,
           o->is_paired ? "paired: each timed rep of a call beyond the caches (more than 32 "
                          "MiB) is followed by one probe of the limit its roofline is bound by "
                          "(an sgemm 2048^3 or a read sweep of 256 MiB); the median over reps "
                          "of (the call at the probed limit) / (the rep): the same ratio as the "
                          "limit column with each rep set against the machine of its own "
                          "seconds\n"
                        : "");
}

/* The variants' medians over llama8b's for the same case (> 1: the family's attention costs
 * more than the plain layer of the same size). */
static void print_versus_llama8b(const result_list *res) {
    bool is_first = true;
    for (int32_t i = 0; i < res->n; i++) {
        const case_result *r = &res->items[i];
        const char *dot = strchr(r->name, '.');
        if (dot == NULL || strncmp(r->name, "small.", 6) == 0 ||
            strncmp(r->name, "llama8b.", 8) == 0) {
            continue;
        }
        char base[64];
        snprintf(base, sizeof base, "llama8b%s", dot);
        for (int32_t j = 0; j < res->n; j++) {
            if (strcmp(res->items[j].name, base) == 0 && res->items[j].ms > 0) {
                if (is_first) {
                    printf("\n%-36s %10s %10s %8s\n", "against llama8b", "ms", "llama8b", "ratio");
                    is_first = false;
                }
                printf("%-36s %10.3f %10.3f %8.2f\n", r->name, r->ms, res->items[j].ms,
                       r->ms / res->items[j].ms);
            }
        }
    }
}

static int measure_limits(const bench_opts *o, machine_limits *lim) {
    int32_t n_runs = o->is_quick ? 3 : 5;
    if (bench_limits_measure(o->bw_bytes, n_runs, o->seed, lim) != ATTN_OK) {
        fprintf(stderr, "attn_bench: measuring the machine's limits failed\n");
        return ATTN_ENOMEM;
    }
    return ATTN_OK;
}

static double max_of(double a, double b) {
    return a > b ? a : b;
}

int main(int argc, char **argv) {
    bench_opts o = {
        .n_threads = 2,
        .use_executor = true,
        .preset = "all",
        .block_tokens = 128,
        .weights_dtypes = {ATTN_DTYPE_F32, ATTN_DTYPE_BF16, ATTN_DTYPE_BF16, ATTN_DTYPE_BF16},
        .kv_dtypes = {ATTN_DTYPE_F32, ATTN_DTYPE_BF16, ATTN_DTYPE_F16, ATTN_DTYPE_Q8_0},
        .n_dtype_pairs = 4,
        .seed = 1};
    int prc = parse_args(argc, argv, &o);
    if (prc != 0) {
        return prc > 0 ? EXIT_SUCCESS : 2;
    }
    bool any_selected = false;
    for (int32_t i = 0; i < N_PRESETS; i++) {
        for (int32_t d = 0; d < o.n_dtype_pairs; d++) {
            any_selected = any_selected || preset_selected(&o, presets[i].name, d);
        }
    }
    if (!any_selected) {
        fprintf(stderr, "attn_bench: no case of preset %s matches --case %s\n", o.preset,
                o.case_filter != NULL ? o.case_filter : "");
        return 2;
    }
    openblas_set_num_threads(o.n_threads);

    machine_limits before = {0};
    if (!o.skip_limits && measure_limits(&o, &before) != ATTN_OK) {
        return EXIT_FAILURE;
    }

    bench_pool *pool = NULL;
    attn_executor ex = {0};
    if (o.use_executor) {
        int rc = bench_pool_create(o.n_threads, &pool);
        if (rc != ATTN_OK) {
            fprintf(stderr, "attn_bench: thread pool: %s\n", attn_strerror(rc));
            return EXIT_FAILURE;
        }
        ex = bench_pool_executor(pool);
        /* The engine spreads projections and attention over the executor's threads, so BLAS
         * must not start threads of its own: they would spin on the same cores. */
        openblas_set_num_threads(1);
    }
    bench_probe *probe = NULL;
    if (o.is_paired && bench_probe_create(o.n_threads, o.use_executor ? 1 : o.n_threads,
                                          o.use_executor ? &ex : NULL, o.seed, &probe) != ATTN_OK) {
        bench_pool_destroy(pool);
        return EXIT_FAILURE;
    }

    result_list results = {.n = 0};
    int rc = ATTN_OK;
    for (int32_t i = 0; i < N_PRESETS && rc == ATTN_OK; i++) {
        for (int32_t d = 0; d < o.n_dtype_pairs && rc == ATTN_OK; d++) {
            if (preset_selected(&o, presets[i].name, d)) {
                rc = run_preset(&o, presets[i].name, o.weights_dtypes[d], o.kv_dtypes[d],
                                o.use_executor ? &ex : NULL, &before, probe, &results);
            }
        }
    }
    bench_probe_destroy(probe);
    bench_pool_destroy(pool);
    openblas_set_num_threads(o.n_threads);

    machine_limits after = {0};
    machine_limits lim = {0};
    if (!o.skip_limits && measure_limits(&o, &after) == ATTN_OK) {
        lim = after;
        lim.sgemm_gflops = max_of(before.sgemm_gflops, after.sgemm_gflops);
        lim.bw_gbs[0] = max_of(before.bw_gbs[0], after.bw_gbs[0]);
        lim.bw_gbs[1] = max_of(before.bw_gbs[1], after.bw_gbs[1]);
        lim.l3_gbs[0] = max_of(before.l3_gbs[0], after.l3_gbs[0]);
        lim.l3_gbs[1] = max_of(before.l3_gbs[1], after.l3_gbs[1]);
    }
    print_header(&o, &before, &after, &lim);
    for (int32_t i = 0; i < results.n_presets; i++) {
        printf("%s", results.presets[i]);
    }
    printf("\n%-36s %5s %10s %11s %9s %8s  %s\n", "case", "reps", "ms", "tokens/s", "GFLOP/s",
           "GB/s", "machine limit");
    for (int32_t i = 0; i < results.n; i++) {
        print_row(&o, &lim, &results.items[i]);
    }
    print_versus_llama8b(&results);
    for (int32_t i = 0; i < results.n_notes; i++) {
        printf("%s", results.notes[i]);
    }
    printf("\n");
    for (int32_t i = 0; i < results.n; i++) {
        print_result_line(&o, &lim, &results.items[i]);
    }
    return rc == ATTN_OK ? EXIT_SUCCESS : EXIT_FAILURE;
}
