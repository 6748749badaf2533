/* bench/kernels.c (attn_kernels): the decode kernels alone, with their rows in L1/L2, against
 * the FMA issue rate measured in the same run.
 *
 * For each KV dtype, query rows per group (a GQA group's heads at one token) and head size, one
 * block of keys is scored (attn__small_qk_kv) and its values summed (attn__small_pv_kv) many
 * times. Each trial also runs a loop of twelve independent FMA chains on one thread, whose best
 * time gives the machine's FMA rate at that moment; a kernel's figure is its best time against
 * the best of the loop, so a VM's slow minutes (steal time, a busy sibling thread) move both.
 * Either kernel does rows x d / 8 FMAs of 8 lanes a key: "of FMA" is that count at the measured
 * rate over the kernel's time, 1.0 being every cycle's FMA slots used.
 *
 * Numbers, not pass/fail: the kernels' results are the test suite's concern (check_kv_dtype). */
#include "../engine/attn_int.h"
#include "bench_limits.h"
#include "bench_rand.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define HAVE_FMA_LOOP 1
#endif

/* The FMA loop: 12 x 200000 FMAs of 8 lanes, ~0.45 ms at two a cycle and 2.7 GHz, about as long
 * as a kernel's reps in a trial (the best of a much shorter loop came from fewer, luckier
 * moments). */
#define FMA_CHAINS 12
#define FMA_ITERS  200000

#ifdef HAVE_FMA_LOOP
/* Twelve independent chains: enough to cover the FMA latency at two a cycle. The asm barrier
 * keeps the multiplier opaque, so the compiler can neither fold nor vectorize the chains away. */
__attribute__((target("avx2,fma"), noinline)) static float fma_loop(long iters) {
    __m256 acc[FMA_CHAINS];
    for (int i = 0; i < FMA_CHAINS; i++) {
        acc[i] = _mm256_set1_ps((float)i);
    }
    __m256 x = _mm256_set1_ps(0.999f), y = _mm256_set1_ps(0.001f);
    for (long i = 0; i < iters; i++) {
#pragma GCC unroll 12
        for (int k = 0; k < FMA_CHAINS; k++) {
            acc[k] = _mm256_fmadd_ps(acc[k], x, y);
        }
        __asm__ volatile("" : "+x"(x));
    }
    float s = 0.0f;
    for (int i = 0; i < FMA_CHAINS; i++) {
        s += acc[i][0];
    }
    return s;
}
/* The same with 16 lanes, for the AVX-512 kernels: their "of FMA" is against this rate. */
__attribute__((target("avx512f"), noinline)) static float fma_loop512(long iters) {
    __m512 acc[FMA_CHAINS];
    for (int i = 0; i < FMA_CHAINS; i++) {
        acc[i] = _mm512_set1_ps((float)i);
    }
    __m512 x = _mm512_set1_ps(0.999f), y = _mm512_set1_ps(0.001f);
    for (long i = 0; i < iters; i++) {
#pragma GCC unroll 12
        for (int k = 0; k < FMA_CHAINS; k++) {
            acc[k] = _mm512_fmadd_ps(acc[k], x, y);
        }
        __asm__ volatile("" : "+v"(x));
    }
    float s = 0.0f;
    for (int i = 0; i < FMA_CHAINS; i++) {
        s += acc[i][0];
    }
    return s;
}
#endif

struct config {
    attn_dtype dtype;
    int32_t rows, d, keys;
};

struct result {
    double qk_ns, pv_ns; /* best time a key */
    double fma_per_ns;   /* the loop's best rate in the same trials: FMAs a ns */
    int lanes;           /* of the kernels and the loop: 8 (AVX2), 16 (AVX-512) */
};

/* Seconds of one FMA loop of 16 lanes (wide) or 8; 1e300 without AVX2 + FMA, where the loop
 * would be an illegal instruction. */
static double fma_seconds(bool wide) {
#ifdef HAVE_FMA_LOOP
    if (attn__tile_is_fast()) {
        double t0 = bench_seconds();
        volatile float sink = wide ? fma_loop512(FMA_ITERS) : fma_loop(FMA_ITERS);
        (void)sink;
        return bench_seconds() - t0;
    }
#endif
    (void)wide;
    return 1e300;
}

/* The projections of m tokens (half precision: panel.c's, the input's packing included; float:
 * attn__rows_dot) against PROJ_ROWS weight rows of PROJ_K values held as wdt, best of trials, each
 * followed by the FMA loop of the kernels' width: *gflops the kernel's, *of_fma its share of the
 * loop's rate. A llama o projection's rows, as the engine runs them: with 192 rows the input's
 * packing, once a call, weighed a fifth of 32 tokens' time. */
#define PROJ_K    4096
#define PROJ_ROWS 4096
/* Best of at most this many trials: a call is milliseconds. */
#define PROJ_TRIALS 20
static int measure_proj(attn_dtype wdt, int32_t m, int trials, double *gflops, double *of_fma,
                        int *lanes) {
    int32_t k = PROJ_K, n = PROJ_ROWS;
    int32_t block_rows = attn__panel_block_rows();
    bool is_wide = wdt == ATTN_DTYPE_F32 ? attn__rows512_covers(m) : attn__tile_is_wide();
    *lanes = is_wide ? 16 : 8;
    float *x = malloc((size_t)m * k * sizeof(float)), *wf = malloc((size_t)n * k * sizeof(float));
    float *xp = malloc((size_t)m * k * sizeof(float));
    uint16_t *wh = malloc((size_t)n * k * sizeof(uint16_t));
    uint16_t *panels = malloc(attn__panel_values(n, k) * sizeof(uint16_t));
    float *y = malloc((size_t)m * n * sizeof(float));
    if (!x || !wf || !xp || !wh || !panels || !y) {
        free(x), free(wf), free(xp), free(wh), free(panels), free(y);
        return -1;
    }
    bench_rand_fill(x, (size_t)m * k, 5);
    bench_rand_fill(wf, (size_t)n * k, 6);
    if (wdt != ATTN_DTYPE_F32) {
        (void)attn__half_round(wdt, wf, (size_t)n * k, wh);
        attn__panel_pack(wdt, wh, n, k, panels);
    }
    double best = 1e300, best_fma = 1e300;
    for (int t = 0; t < trials; t++) {
        double t0 = bench_seconds();
        if (wdt == ATTN_DTYPE_F32) {
            attn__rows_dot(x, m, k, wf, n, y, (size_t)n);
        } else {
            attn__panel_pack_x(block_rows, x, m, k, xp);
            attn__panel_dot(block_rows, wdt, xp, m, k, panels, 0, n, y, (size_t)n);
        }
        double dt = bench_seconds() - t0, f = fma_seconds(is_wide);
        best = dt < best ? dt : best;
        best_fma = f < best_fma ? f : best_fma;
    }
    double flops = 2.0 * m * k * n;
    *gflops = flops / best * 1e-9;
    /* the loop's FLOP/s: FMA_ITERS x FMA_CHAINS FMAs of lanes x 2 FLOPs */
    double loop = best_fma < 1e300 ? 2.0 * *lanes * FMA_ITERS * FMA_CHAINS / best_fma : 0;
    *of_fma = loop > 0 ? flops / best / loop : -1;
    volatile float sink = y[0];
    (void)sink;
    free(x), free(wf), free(xp), free(wh), free(panels), free(y);
    return 0;
}

/* Times one configuration: trials x (reps calls of each kernel, then the FMA loop). */
static int measure(const struct config *c, int trials, struct result *out) {
    int32_t n = c->keys, d = c->d, m = c->rows;
    size_t rb = attn__kv_row_bytes(c->dtype, d);
    bool is_wide = attn__kv512_covers(c->dtype, d); /* the kernels are AVX-512's */
    out->lanes = is_wide ? 16 : 8;
    float *src = malloc((size_t)n * d * sizeof(float));
    uint8_t *k = malloc((size_t)n * rb), *v = malloc((size_t)n * rb);
    float *q = malloc((size_t)m * d * sizeof(float)), *s = malloc((size_t)m * n * sizeof(float));
    float *o = calloc((size_t)m * d, sizeof(float));
    float *widen = malloc((size_t)n * d * sizeof(float));
    if (!src || !k || !v || !q || !s || !o || !widen) {
        free(src), free(k), free(v), free(q), free(s), free(o), free(widen);
        return -1;
    }
    for (int pass = 0; pass < 2; pass++) {
        bench_rand_fill(src, (size_t)n * d, 1 + (uint64_t)pass);
        for (int32_t j = 0; j < n; j++) {
            attn__kv_encode(c->dtype, src + (size_t)j * d, d, (pass ? v : k) + (size_t)j * rb);
        }
    }
    bench_rand_fill(q, (size_t)m * d, 3);
    struct attn__kv_after none = {NULL, 0};
    /* 200000 / (rows x d / 64) reps: ~0.5 ms of each kernel a trial at ~20 ns a key for four
     * rows of 128 */
    int reps = (int)(200000 / ((double)n * m * d / 64.0) + 1);
    double best_qk = 1e300, best_pv = 1e300, best_fma = 1e300;
    for (int t = 0; t < trials; t++) {
        double t0 = bench_seconds();
        for (int r = 0; r < reps; r++) {
            attn__small_qk_kv(c->dtype, q, (size_t)d, m, k, rb, n, none, d, s, (size_t)n, widen);
        }
        double t1 = bench_seconds();
        for (int i = 0; i < m * n; i++) {
            s[i] = s[i] * 1e-3f; /* weights of a sane size: the sums stay finite */
        }
        double t2 = bench_seconds();
        for (int r = 0; r < reps; r++) {
            attn__small_pv_kv(c->dtype, s, (size_t)n, m, v, rb, n, none, d, o, (size_t)d, widen);
        }
        double t3 = bench_seconds();
        best_qk = t1 - t0 < best_qk ? t1 - t0 : best_qk;
        best_pv = t3 - t2 < best_pv ? t3 - t2 : best_pv;
        double f = fma_seconds(is_wide);
        best_fma = f < best_fma ? f : best_fma;
    }
    out->qk_ns = best_qk * 1e9 / ((double)reps * n); /* bench_seconds: seconds */
    out->pv_ns = best_pv * 1e9 / ((double)reps * n);
    out->fma_per_ns = best_fma < 1e300 ? (double)FMA_ITERS * FMA_CHAINS / (best_fma * 1e9) : 0.0;
    volatile float sink = o[0];
    (void)sink;
    free(src), free(k), free(v), free(q), free(s), free(o), free(widen);
    return 0;
}

/* Parses a comma-separated list of positive integers into out (at most max). */
static int parse_ints(const char *arg, int32_t *out, int max) {
    int n = 0;
    const char *p = arg;
    while (*p != '\0') {
        char *end;
        long x = strtol(p, &end, 10);
        if (end == p || x < 1 || x > 4096 || n == max || (*end != ',' && *end != '\0')) {
            return -1;
        }
        out[n++] = (int32_t)x;
        p = *end == ',' ? end + 1 : end;
    }
    return n;
}

static int parse_dtypes(const char *arg, attn_dtype *out, int max) {
    char buf[128];
    if (strlen(arg) >= sizeof buf) {
        return -1;
    }
    strcpy(buf, arg);
    int n = 0;
    for (char *save = NULL, *tok = strtok_r(buf, ",", &save); tok != NULL;
         tok = strtok_r(NULL, ",", &save)) {
        if (n == max || attn_dtype_parse(tok, &out[n]) != ATTN_OK || out[n] == ATTN_DTYPE_AUTO) {
            return -1;
        }
        n++;
    }
    return n;
}

static void usage(FILE *f) {
    fprintf(f, "usage: attn_kernels [flags]\n"
               "  --dtypes LIST  KV dtypes (default f32,bf16,f16,q8_0)\n"
               "  --rows LIST    query rows a group (default 1,2,3,4)\n"
               "  --dims LIST    head sizes (default 64,128)\n"
               "  --keys N       keys a block (default 128, the engine's)\n"
               "  --trials N     best of N trials (default 200)\n"
               "  --quick        20 trials\n"
               "  --avx2         AVX2 kernels even where the CPU has AVX-512\n"
               "  --proj LIST    tokens a batch for the projections' kernels (default 4,32; 0: "
               "none)\n");
}

int main(int argc, char **argv) {
    attn_dtype dtypes[8] = {ATTN_DTYPE_F32, ATTN_DTYPE_BF16, ATTN_DTYPE_F16, ATTN_DTYPE_Q8_0};
    int n_dtypes = 4;
    int32_t rows[8] = {1, 2, 3, 4}, dims[8] = {64, 128}, keys = 128;
    int n_rows = 4, n_dims = 2, trials = 200;
    int32_t proj[8] = {4, 32};
    int n_proj = 2;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *val = i + 1 < argc ? argv[i + 1] : NULL;
        int32_t one[1];
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            usage(stdout);
            return 0;
        } else if (!strcmp(a, "--quick")) {
            trials = 20;
        } else if (!strcmp(a, "--avx2")) {
            attn__tile_allow_wide(false);
        } else if (val != NULL && !strcmp(a, "--dtypes")) {
            n_dtypes = parse_dtypes(val, dtypes, 8), i++;
        } else if (val != NULL && !strcmp(a, "--rows")) {
            n_rows = parse_ints(val, rows, 8), i++;
        } else if (val != NULL && !strcmp(a, "--dims")) {
            n_dims = parse_ints(val, dims, 8), i++;
        } else if (val != NULL && !strcmp(a, "--proj")) {
            n_proj = !strcmp(val, "0") ? 0 : parse_ints(val, proj, 8), i++;
            n_proj = n_proj == 0 ? 0 : n_proj < 0 ? -1 : n_proj;
        } else if (val != NULL && !strcmp(a, "--keys")) {
            keys = parse_ints(val, one, 1) == 1 ? one[0] : -1, i++;
        } else if (val != NULL && !strcmp(a, "--trials")) {
            trials = parse_ints(val, one, 1) == 1 ? one[0] : -1, i++;
        } else {
            fprintf(stderr, "attn_kernels: unknown or incomplete flag %s\n", a);
            usage(stderr);
            return 2;
        }
        if (n_dtypes < 1 || n_rows < 1 || n_dims < 1 || keys < 1 || trials < 1 || n_proj < 0) {
            fprintf(stderr, "attn_kernels: bad value for %s\n", a);
            return 2;
        }
    }
    for (int i = 0; i < n_rows; i++) {
        if (rows[i] > 64) {
            fprintf(stderr, "attn_kernels: --rows at most 64\n");
            return 2;
        }
    }
    printf("attn_kernels: %s kernels (AVX-512 where they cover the dtype and head size); one "
           "block of %d keys (L1/L2), best of %d trials; \"of FMA\": rows x d / lanes FMAs a key "
           "at the rate of a 12-chain FMA loop of as many lanes (8 AVX2, 16 AVX-512) on one "
           "thread, measured in the same trials\n",
           attn_kernels_name(), keys, trials);
    printf("%-6s %4s %4s %5s  %12s %7s  %12s %7s  %9s\n", "dtype", "rows", "d", "lanes",
           "scores ns/key", "of FMA", "wsum ns/key", "of FMA", "FMA GF/s");
    for (int a = 0; a < n_dtypes; a++) {
        for (int b = 0; b < n_dims; b++) {
            for (int r = 0; r < n_rows; r++) {
                struct config c = {dtypes[a], rows[r], dims[b], keys};
                struct result res;
                if (measure(&c, trials, &res) != 0) {
                    fprintf(stderr, "attn_kernels: out of memory\n");
                    return 1;
                }
                double fmas = (double)c.rows * c.d / res.lanes; /* a key, either kernel */
                double of_qk = res.fma_per_ns > 0 ? fmas / (res.qk_ns * res.fma_per_ns) : -1;
                double of_pv = res.fma_per_ns > 0 ? fmas / (res.pv_ns * res.fma_per_ns) : -1;
                double gflops = res.fma_per_ns * 2.0 * res.lanes;
                printf("%-6s %4d %4d %5d  %12.2f %7.2f  %12.2f %7.2f  %9.2f\n",
                       attn_dtype_name(c.dtype), c.rows, c.d, res.lanes, res.qk_ns, of_qk,
                       res.pv_ns, of_pv, gflops);
                printf("RESULT impl=attnd_kernels dtype=%s rows=%d d=%d keys=%d lanes=%d "
                       "qk_ns=%.3f pv_ns=%.3f qk_of_fma=%.3f pv_of_fma=%.3f fma_gflops=%.2f\n",
                       attn_dtype_name(c.dtype), c.rows, c.d, c.keys, res.lanes, res.qk_ns,
                       res.pv_ns, of_qk, of_pv, gflops);
                fflush(stdout);
            }
        }
    }
    if (n_proj > 0) {
        printf("projections: m tokens of %d values against %d weight rows, one thread, best of %d "
               "trials; \"of FMA\" as above\n",
               PROJ_K, PROJ_ROWS, trials < PROJ_TRIALS ? trials : PROJ_TRIALS);
        printf("%-7s %4s %5s  %9s %7s  %9s\n", "weights", "m", "lanes", "GFLOP/s", "of FMA", "");
    }
    static const attn_dtype wdts[] = {ATTN_DTYPE_BF16, ATTN_DTYPE_F16, ATTN_DTYPE_F32};
    for (int a = 0; a < 3; a++) {
        for (int i = 0; i < n_proj; i++) {
            double gflops, of_fma;
            int lanes;
            if (measure_proj(wdts[a], proj[i], trials < PROJ_TRIALS ? trials : PROJ_TRIALS, &gflops,
                             &of_fma, &lanes) != 0) {
                fprintf(stderr, "attn_kernels: out of memory\n");
                return 1;
            }
            printf("%-7s %4d %5d  %9.2f %7.2f\n", attn_dtype_name(wdts[a]), proj[i], lanes, gflops,
                   of_fma);
            printf("RESULT impl=attnd_proj weights=%s m=%d k=%d n=%d lanes=%d gflops=%.2f "
                   "of_fma=%.3f\n",
                   attn_dtype_name(wdts[a]), proj[i], PROJ_K, PROJ_ROWS, lanes, gflops, of_fma);
            fflush(stdout);
        }
    }
    return 0;
}
