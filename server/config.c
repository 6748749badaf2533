/* server/config.c: the option table and its parser. Every option appears once in `options`,
 * which drives parsing, --help and the startup log; nothing else in attnd reads the
 * environment. Semantic checks that need the model (is the layer range inside it?) are left to
 * main(), which reports them the same way.
 */
#include "config.h"

#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "../engine/attn.h"
#include "blas.h"

enum option_type {
    OPTION_STRING,    /* const char * */
    OPTION_PRESET,    /* const char *, a name attn_config_preset knows */
    OPTION_I32,       /* int32_t within [min, max] */
    OPTION_I64,       /* int64_t within [min, max] */
    OPTION_U64,       /* uint64_t, any value */
    OPTION_LAYERS,    /* const char *, "all" | "N" | "A-B"; also sets layer_first/count */
    OPTION_LOG_LEVEL, /* enum log_level */
};

struct option {
    const char *name; /* the flag without "--" */
    const char *env;  /* the environment variable */
    enum option_type type;
    size_t offset; /* of the field in struct config */
    const char *def;
    int64_t min, max; /* for OPTION_I32 / OPTION_I64 */
    const char *help;
};

/* The one table. Defaults are strings so that --help prints exactly what the parser reads. */
static const struct option options[] = {
    {"host", "ATTND_HOST", OPTION_STRING, offsetof(struct config, host), "127.0.0.1", 0, 0,
     "IPv4 or IPv6 address to listen on (a host name: its first address only)"},
    {"port", "ATTND_PORT", OPTION_I32, offsetof(struct config, port), "8080", 0, 65535,
     "TCP port; 0 picks a free port (logged in the 'listening' line as port=)"},
    {"model", "ATTND_MODEL", OPTION_STRING, offsetof(struct config, model), "", 0, 0,
     "Hugging Face style folder (config.json and model.safetensors, or its shards with "
     "model.safetensors.index.json); empty = the built-in preset with seeded random weights"},
    {"weights-dtype", "ATTND_WEIGHTS_DTYPE", OPTION_STRING, offsetof(struct config, weights_dtype),
     "auto", 0, 0,
     "how the q/k/v and o projections are held: auto (a checkpoint's own BF16, F16 or F32, "
     "bit-exact; projections of mixed dtypes: f32, exact; a preset's bf16), f32 (exact from any), "
     "bf16 or f16 "
     "(rounded to nearest even from any other dtype; a weight that would round past the range "
     "refuses the start). Multi-head latent attention's stay f32"},
    {"kv-dtype", "ATTND_KV_DTYPE", OPTION_STRING, offsetof(struct config, kv_dtype), "auto", 0, 0,
     "how the KV cache holds keys and values: auto (the projections' dtype, so an F32 model stays "
     "exact), f32, bf16, f16 (rounded to nearest even) or q8_0 (32 values as int8 with one f16 "
     "scale; 3.76x the tokens of f32 at head_dim 128). README: Precision has each one's measured "
     "error"},
    {"keep-queries", "ATTND_KEEP_QUERIES", OPTION_I32, offsetof(struct config, keep_queries), "0",
     0, 1,
     "1: the KV cache also keeps each token's queries (n_heads x head_dim more per token, in "
     "the KV dtype), so GET /v1/sessions/{id}/attention and the /ui page can show the attention "
     "of tokens already cached; 0: they answer 409 queries_not_kept"},
    {"trust-layout", "ATTND_TRUST_LAYOUT", OPTION_STRING, offsetof(struct config, trust_layout), "",
     0, 0,
     "empty, or llama: serve a --model whose model_type attnd does not know (or that has none) as "
     "Llama attention, you vouching for it. Known families that are not served, and config "
     "fields or tensors that change attention, are refused all the same"},
    {"modeling-code", "ATTND_MODELING_CODE", OPTION_STRING, offsetof(struct config, modeling_code),
     "", 0, 0,
     "empty, transformers or checkpoint: whose code a --model means where transformers' port of "
     "its family and the modeling code shipped with the checkpoint compute different attention "
     "(a deepseek_v2 under yarn with mscale_all_dim: the softmax scale). Empty refuses such a "
     "model, naming both readings"},
    {"preset", "ATTND_PRESET", OPTION_PRESET, offsetof(struct config, preset), "small", 0, 0,
     "built-in model geometry when --model is empty: tiny, small, small-linear or llama8b"},
    {"seed", "ATTND_SEED", OPTION_U64, offsetof(struct config, seed), "0", 0, 0,
     "seed of the preset's random weights"},
    {"layers", "ATTND_LAYERS", OPTION_LAYERS, offsetof(struct config, layers), "all", 0, 0,
     "layers to load: all, N, or A-B (inclusive)"},
    {"kv-budget-mb", "ATTND_KV_BUDGET_MB", OPTION_I64, offsetof(struct config, kv_budget_mb),
     "1024", 1, 1048576, "KV cache pool size in MiB, shared by all sessions and workers"},
    {"kv-block-tokens", "ATTND_KV_BLOCK_TOKENS", OPTION_I32,
     offsetof(struct config, kv_block_tokens), "0", 0, INT32_MAX, /* [16, 256] or 0: below */
     "tokens per KV block, 16..256; 0 = the engine's default (128)"},
    {"max-sessions", "ATTND_MAX_SESSIONS", OPTION_I32, offsetof(struct config, max_sessions),
     "4096", 1, 1000000,
     "live sessions at most; the least recently used idle one is evicted "
     "to make room"},
    {"max-seq", "ATTND_MAX_SEQ", OPTION_I32, offsetof(struct config, max_seq), "0", 0, 1048576,
     "positions and tokens per session cache; 0 = the model's own (max_position_embeddings); "
     "above it serves positions its config does not reach (as dynamic rope scaling needs), "
     "without a warning"},
    {"workers", "ATTND_WORKERS", OPTION_I32, offsetof(struct config, workers), "0", 0, 256,
     "engine worker threads (libuv pool); 0 = one per online core, at most 48 / --blas-threads"},
    {"threads", "ATTND_THREADS", OPTION_I32, offsetof(struct config, threads), "0", 0, 256,
     "threads computing forwards at once, workers and their shared helpers together: a request "
     "alone uses them all, a full server never more; 0 = one per online core, at most 48 / "
     "--blas-threads (the larger of --threads and --workers, times --blas-threads, is at most "
     "48: OpenBLAS's work buffers)"},
    {"blas-threads", "ATTND_BLAS_THREADS", OPTION_I32, offsetof(struct config, blas_threads), "1",
     1, BLAS_MAX_BUFFERS,
     "OpenBLAS threads per GEMM call; the engine already spreads a forward over --threads, so "
     "more oversubscribe the cores"},
    {"avx512", "ATTND_AVX512", OPTION_I32, offsetof(struct config, avx512), "1", 0, 1,
     "1: AVX-512 kernels where the CPU has them, for decode attention over bf16, f16 and q8_0 "
     "K/V (head sizes a multiple of 32 up to 512) and the projections of 4 tokens or more, else "
     "AVX2's; 0: AVX2's always (on Intel cores before Ice Lake, 512-bit FMAs "
     "lower the clock of the AVX2 work after them: README, Benchmarks)"},
    {"max-batch-tokens", "ATTND_MAX_BATCH_TOKENS", OPTION_I32,
     offsetof(struct config, max_batch_tokens), "256", 16, 65536,
     "tokens per engine call, 16 to 65536: the cap of a batch of decode steps and the prefill "
     "chunk size"},
    {"inline-macs", "ATTND_INLINE_MACS", OPTION_I64, offsetof(struct config, inline_macs),
     "134217728", 0, (int64_t)1 << 40,
     "a forward of at most this many multiply-adds on an idle server runs on the event loop "
     "thread instead of a worker (two thread hand-offs saved: a small preset's step, a 32-session "
     "small step up to ~3300 keys, one llama8b layer's decode up to ~11000 keys); 0 = never"},
    {"spin-us", "ATTND_SPIN_US", OPTION_I32, offsetof(struct config, spin_us), "200", 0, 1000000,
     "after answering, while no worker computes, the event loop polls its connections this many "
     "microseconds before it sleeps, so a client's next request needs no thread wake-up; 0 = "
     "sleep at once"},
    {"max-body-mb", "ATTND_MAX_BODY_MB", OPTION_I64, offsetof(struct config, max_body_mb), "64", 1,
     4096, "largest request body in MiB (413 beyond)"},
    {"max-held-mb", "ATTND_MAX_HELD_MB", OPTION_I64, offsetof(struct config, max_held_mb), "1024",
     1, 1 << 20,
     "request bodies being received and answers being sent, held in memory at once across all "
     "connections, in MiB: a body that would pass it is dropped and answered 503 server_busy, "
     "as is an answer over 64 KiB that would and changes nothing kept (an export, SDPA, a "
     "stateless attend; a session's step is always answered); one larger than the whole limit "
     "is 413 (a body) or 500 (an answer), naming it. Clients that send or read slowly hold them"},
    {"queue-depth", "ATTND_QUEUE_DEPTH", OPTION_I32, offsetof(struct config, queue_depth), "256", 1,
     1000000, "accepted requests waiting to start at most (429 beyond)"},
    {"max-connections", "ATTND_MAX_CONNECTIONS", OPTION_I32,
     offsetof(struct config, max_connections), "4096", 1, 1000000,
     "open connections at most. Past it, a new connection closes the oldest one with no request "
     "in progress (idle keep-alive, or still sending headers) and gets 503 too_many_connections "
     "only when every connection is busy, so health checks get through a crowd of idle "
     "connections. Needs as many open files: the soft RLIMIT_NOFILE is raised to fit (up to the "
     "hard limit, which caps this value; both are logged)"},
    {"max-connections-per-ip", "ATTND_MAX_CONNECTIONS_PER_IP", OPTION_I32,
     offsetof(struct config, max_connections_per_ip), "1024", 0, 1000000,
     "connections from one client address at most; 0 = no limit. Past it, a new connection "
     "from that address closes the address's own oldest connection with no request in "
     "progress, and gets 503 only when all of them are busy: one client holds at most this "
     "many busy connections, yet a single local client (tests, a sidecar) is never locked out. "
     "Behind a reverse proxy every client shares the proxy's address: set 0 or "
     "--max-connections"},
    {"idle-timeout-s", "ATTND_IDLE_TIMEOUT_S", OPTION_I32, offsetof(struct config, idle_timeout_s),
     "15", 1, 86400,
     "a connection that moves no byte for this long is closed: idle between requests, stalled "
     "inside a request's headers or body, or not reading its answer. A request waiting for the "
     "engine (a long prefill, a queue) never times out"},
    {"header-timeout-s", "ATTND_HEADER_TIMEOUT_S", OPTION_I32,
     offsetof(struct config, header_timeout_s), "10", 1, 86400,
     "a request's headers must all arrive within this many seconds of its first byte, however "
     "steadily they trickle (slowloris); the connection is closed otherwise"},
    {"drain-timeout-s", "ATTND_DRAIN_TIMEOUT_S", OPTION_I32,
     offsetof(struct config, drain_timeout_s), "30", 0, 86400,
     "on SIGTERM/SIGINT/SIGHUP, how long requests still being received may take to arrive; then "
     "they "
     "and idle connections are dropped, requests fully received finish, and attnd exits 3 "
     "instead of 0 if anything was cut"},
    {"session-ttl-s", "ATTND_SESSION_TTL_S", OPTION_I64, offsetof(struct config, session_ttl_s),
     "3600", 0, 31536000,
     "idle seconds after which a session expires (410 after), checked once a second; 0 = never"},
    {"state-dir", "ATTND_STATE_DIR", OPTION_STRING, offsetof(struct config, state_dir), "", 0, 0,
     "a directory for sessions' files (created if missing): a session evicted for memory is "
     "written there instead of dropped and read back on its next request; on SIGTERM every "
     "session is written, and a start with the same directory and model brings them back. "
     "Empty: no disk tier"},
    {"state-budget-mb", "ATTND_STATE_BUDGET_MB", OPTION_I64,
     offsetof(struct config, state_budget_mb), "8192", 1, 1073741824,
     "bytes of session files in --state-dir at most, MiB; the least recently used go first "
     "(410 after)"},
    {"geometry", "ATTND_GEOMETRY", OPTION_STRING, offsetof(struct config, geometry), "", 0, 0,
     "serve attention alone, with no weights: heads=N,kv_heads=N,head_dim=N,layers=N (and "
     "optionally max_positions, rope_theta, rotary_dim, window, softcap, scale); only POST "
     "/v1/kv/attend (q, k, v in) and /v1/sdpa then, with sessions as usual. Not with --model"},
    {"api-key", "ATTND_API_KEY", OPTION_STRING, offsetof(struct config, api_key), "", 0, 0,
     "when set, /v1/* requests need 'Authorization: Bearer <key>'"},
    {"log-level", "ATTND_LOG_LEVEL", OPTION_LOG_LEVEL, offsetof(struct config, log_level), "info",
     0, 0, "error, warn, info or debug"},
};

#define N_OPTIONS ((int)(sizeof options / sizeof options[0]))

static void set_err(char *err, size_t err_size, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static void set_err(char *err, size_t err_size, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, err_size, fmt, ap);
    va_end(ap);
}

static void *field(struct config *cfg, const struct option *o) {
    return (char *)cfg + o->offset;
}

/* Digits with an optional sign, nothing around them: strtoll alone skips leading blanks, so
 * " 2" passed where "2 " did not. */
static int parse_i64(const char *s, int64_t *out) {
    if (*s == '\0' || !(*s == '-' || *s == '+' || (*s >= '0' && *s <= '9'))) {
        return -1;
    }
    char *end;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    if (errno != 0 || *end != '\0') {
        return -1;
    }
    *out = v;
    return 0;
}

static int parse_u64(const char *s, uint64_t *out) {
    if (*s < '0' || *s > '9') {
        return -1;
    }
    char *end;
    errno = 0;
    unsigned long long v = strtoull(s, &end, 10);
    if (errno != 0 || *end != '\0') {
        return -1;
    }
    *out = v;
    return 0;
}

/* "all" -> (0, 0); "N" -> (N, 1); "A-B" -> (A, B - A + 1). */
static int parse_layers(const char *s, int32_t *first, int32_t *count) {
    if (strcmp(s, "all") == 0) {
        *first = 0;
        *count = 0;
        return 0;
    }
    char buf[64];
    if (strlen(s) >= sizeof buf) {
        return -1;
    }
    strcpy(buf, s);
    char *dash = strchr(buf, '-');
    int64_t a, b;
    if (dash == NULL) {
        if (parse_i64(buf, &a) != 0 || a < 0 || a > 100000) {
            return -1;
        }
        b = a;
    } else {
        *dash = '\0';
        if (parse_i64(buf, &a) != 0 || parse_i64(dash + 1, &b) != 0 || a < 0 || b < a ||
            b > 100000) {
            return -1;
        }
    }
    *first = (int32_t)a;
    *count = (int32_t)(b - a + 1);
    return 0;
}

/* Applies one value; `source` names where it came from ("--port", "ATTND_PORT") for errors. */
static int apply(struct config *cfg, const struct option *o, const char *value, const char *source,
                 char *err, size_t err_size) {
    void *f = field(cfg, o);
    int64_t v;
    switch (o->type) {
    case OPTION_STRING:
        *(const char **)f = value;
        return 0;
    case OPTION_PRESET: {
        attn_config probe;
        if (attn_config_preset(value, &probe) != ATTN_OK) {
            set_err(err, err_size,
                    "%s: unknown preset '%s' (expected tiny, small, small-linear or llama8b)",
                    source, value);
            return -1;
        }
        *(const char **)f = value;
        return 0;
    }
    case OPTION_I32:
    case OPTION_I64:
        if (parse_i64(value, &v) != 0) {
            set_err(err, err_size, "%s: '%s' is not an integer", source, value);
            return -1;
        }
        if (v < o->min || v > o->max) {
            set_err(err, err_size, "%s: %" PRId64 " is out of range [%" PRId64 ", %" PRId64 "]",
                    source, v, o->min, o->max);
            return -1;
        }
        if (o->type == OPTION_I32) {
            *(int32_t *)f = (int32_t)v;
        } else {
            *(int64_t *)f = v;
        }
        return 0;
    case OPTION_U64:
        if (parse_u64(value, (uint64_t *)f) != 0) {
            set_err(err, err_size, "%s: '%s' is not an unsigned 64-bit integer", source, value);
            return -1;
        }
        return 0;
    case OPTION_LAYERS:
        if (parse_layers(value, &cfg->layer_first, &cfg->layer_count) != 0) {
            set_err(err, err_size, "%s: '%s' is not a layer range (all, N or A-B with A <= B)",
                    source, value);
            return -1;
        }
        *(const char **)f = value;
        return 0;
    case OPTION_LOG_LEVEL:
        if (log_level_parse(value, (enum log_level *)f) != 0) {
            set_err(err, err_size, "%s: '%s' is not a log level (error, warn, info, debug)", source,
                    value);
            return -1;
        }
        return 0;
    }
    return -1;
}

int config_parse_geometry(const char *spec, attn_config *out, char *err, size_t err_size) {
    static const char *const keys[] = {"heads",         "kv_heads",   "head_dim",   "layers",
                                       "max_positions", "rope_theta", "rotary_dim", "window",
                                       "softcap",       "scale"};
    enum { N_KEYS = 10, N_REQUIRED = 4 };
    double v[N_KEYS] = {0, 0, 0, 0, 4096, 10000, 0, 0, 0, 0};
    bool given[N_KEYS] = {false};
    const char *p = spec;
    while (*p != '\0') {
        const char *eq = strchr(p, '=');
        const char *end = strchr(p, ',');
        end = end != NULL ? end : p + strlen(p);
        int k = -1;
        for (int i = 0; eq != NULL && eq < end && i < N_KEYS; i++) {
            if ((size_t)(eq - p) == strlen(keys[i]) && strncmp(p, keys[i], (size_t)(eq - p)) == 0) {
                k = i;
            }
        }
        if (k < 0) {
            set_err(err, err_size,
                    "--geometry: '%.*s' is not key=value with a key of heads, kv_heads, head_dim, "
                    "layers, max_positions, rope_theta, rotary_dim, window, softcap, scale",
                    (int)(end - p), p);
            return -1;
        }
        if (given[k]) {
            set_err(err, err_size, "--geometry: %s given twice", keys[k]);
            return -1;
        }
        char *num_end;
        errno = 0;
        v[k] = strtod(eq + 1, &num_end);
        /* counts (and rotary_dim, window) are whole numbers, never truncated; a scale or cap so
         * small that float makes it 0 would read as "none" */
        bool is_count = k < 5 || k == 6 || k == 7;
        if (errno != 0 || num_end != end || eq + 1 == end || !isfinite(v[k]) || v[k] < 0 ||
            (is_count && (v[k] != floor(v[k]) || v[k] > 1048576)) ||
            (!is_count && v[k] != 0 && (float)v[k] == 0.0f)) {
            set_err(err, err_size, "--geometry: %s=%.*s is not a valid value", keys[k],
                    (int)(end - eq - 1), eq + 1);
            return -1;
        }
        given[k] = true;
        p = *end == ',' ? end + 1 : end;
        if (*end == ',' && *p == '\0') {
            /* a list cut after its comma: the rest of it may be missing */
            set_err(err, err_size,
                    "--geometry: ends with a comma (key=value pairs, comma-separated)");
            return -1;
        }
    }
    for (int i = 0; i < N_REQUIRED; i++) {
        if (!given[i]) {
            set_err(err, err_size, "--geometry: %s is required (heads, kv_heads, head_dim, layers)",
                    keys[i]);
            return -1;
        }
    }
    attn_config c;
    memset(&c, 0, sizeof c);
    c.n_heads = (int32_t)v[0];
    c.n_kv_heads = (int32_t)v[1];
    c.head_dim = (int32_t)v[2];
    c.n_layers = (int32_t)v[3];
    if (v[0] * v[2] > 1048576) { /* hidden_size: heads x head_dim, an int32 */
        set_err(err, err_size, "--geometry: heads x head_dim = %.0f is over 1048576", v[0] * v[2]);
        return -1;
    }
    c.hidden_size = c.n_heads * c.head_dim;
    c.max_seq = (int32_t)v[4];
    c.rope_theta = (float)v[5];
    c.rotary_dim = v[5] == 0 ? -1 : (int32_t)v[6];
    c.sliding_window = (int32_t)v[7];
    c.logit_softcap = (float)v[8];
    c.softmax_scale = (float)v[9];
    attn_config check = c;
    if (attn_config_check(&check) != ATTN_OK) {
        set_err(err, err_size,
                "--geometry: %s: not a valid attention geometry (kv_heads must divide heads; "
                "rotary_dim even and at most head_dim; layers and positions within the engine's "
                "limits)",
                spec);
        return -1;
    }
    *out = c;
    return 0;
}

static const struct option *find_option(const char *name, size_t len) {
    for (int i = 0; i < N_OPTIONS; i++) {
        if (strlen(options[i].name) == len && strncmp(options[i].name, name, len) == 0) {
            return &options[i];
        }
    }
    return NULL;
}

/* Where each option's value came from, for the errors of checks made after all are read: the
 * environment variable's name when it came from there, else the flag. */
struct origins {
    bool from_env[N_OPTIONS];
    char buf[64];
};

static const char *origin_of(struct origins *o, const char *name) {
    const struct option *opt = find_option(name, strlen(name));
    if (opt != NULL && o->from_env[opt - options]) {
        return opt->env;
    }
    snprintf(o->buf, sizeof o->buf, "--%s", name);
    return o->buf;
}

/* Cross-option checks and the derived defaults. */
static int resolve(struct config *cfg, int32_t cores, struct origins *from, char *err,
                   size_t err_size) {
    if (cfg->host[0] == '\0') {
        set_err(err, err_size, "%s: must not be empty", origin_of(from, "host"));
        return -1;
    }
    attn_dtype dt;
    if (attn_dtype_parse(cfg->weights_dtype, &dt) != ATTN_OK || dt == ATTN_DTYPE_Q8_0) {
        set_err(err, err_size, "%s: '%s' is not a dtype (auto, f32, bf16, f16)",
                origin_of(from, "weights-dtype"), cfg->weights_dtype);
        return -1;
    }
    if (attn_dtype_parse(cfg->kv_dtype, &dt) != ATTN_OK) {
        set_err(err, err_size, "%s: '%s' is not a dtype (auto, f32, bf16, f16, q8_0)",
                origin_of(from, "kv-dtype"), cfg->kv_dtype);
        return -1;
    }
    if (cfg->modeling_code[0] != '\0' && strcmp(cfg->modeling_code, "transformers") != 0 &&
        strcmp(cfg->modeling_code, "checkpoint") != 0) {
        set_err(err, err_size, "%s: '%s' is not one (empty, transformers or checkpoint)",
                origin_of(from, "modeling-code"), cfg->modeling_code);
        return -1;
    }
    if (cfg->trust_layout[0] != '\0' && strcmp(cfg->trust_layout, "llama") != 0) {
        set_err(err, err_size, "%s: '%s' is not a layout (empty, or llama)",
                origin_of(from, "trust-layout"), cfg->trust_layout);
        return -1;
    }
    if (cfg->geometry[0] != '\0') {
        attn_config g;
        char why[256];
        if (config_parse_geometry(cfg->geometry, &g, why, sizeof why) != 0) {
            /* its reason begins "--geometry: " */
            const char *rest = strncmp(why, "--geometry: ", 12) == 0 ? why + 12 : why;
            set_err(err, err_size, "%s: %s", origin_of(from, "geometry"), rest);
            return -1;
        }
        if (cfg->model[0] != '\0') {
            char model[64];
            snprintf(model, sizeof model, "%s", origin_of(from, "model"));
            set_err(err, err_size, "%s: not with %s (a model brings its own)",
                    origin_of(from, "geometry"), model);
            return -1;
        }
    }
    /* route.c compares the key with the Authorization header's value, whose surrounding
     * whitespace is not part of it (RFC 9110 section 5.5) and which holds no control byte but
     * HTAB: such a key would start and then answer every /v1 request 401. The key itself is
     * not echoed. */
    const char *key = cfg->api_key;
    size_t key_len = strlen(key);
    bool is_unsendable = key_len > 0 && (key[0] == ' ' || key[0] == '\t' ||
                                         key[key_len - 1] == ' ' || key[key_len - 1] == '\t');
    for (size_t i = 0; i < key_len; i++) {
        unsigned char c = (unsigned char)key[i];
        is_unsendable = is_unsendable || (c < 0x20 && c != '\t') || c == 0x7F;
    }
    if (is_unsendable) {
        set_err(err, err_size,
                "%s: a key that begins or ends with whitespace or holds a control byte never "
                "matches an Authorization header (every /v1 request would get 401)",
                origin_of(from, "api-key"));
        return -1;
    }
    if (cfg->kv_block_tokens != 0 && (cfg->kv_block_tokens < 16 || cfg->kv_block_tokens > 256)) {
        set_err(err, err_size, "%s: %d is out of range [16, 256] (or 0: the engine's 128)",
                origin_of(from, "kv-block-tokens"), (int)cfg->kv_block_tokens);
        return -1;
    }
    if (cores < 1) {
        cores = 1;
    }
    /* Every computing thread may be in a BLAS call at once, each of its BLAS threads with a work
     * buffer of its own, and blas_reserve takes them all at the start: the defaults take no
     * more cores than that allows (on 64 cores the start failed, 'cannot reserve 64 OpenBLAS
     * buffers'), and explicit counts past it are refused here, by name (--blas-threads is at
     * most BLAS_MAX_BUFFERS by its range). */
    int32_t fit = BLAS_MAX_BUFFERS / cfg->blas_threads;
    if (cfg->workers == 0) {
        cfg->workers = cores < fit ? cores : fit;
    }
    if (cfg->threads == 0) {
        cfg->threads = cores < fit ? cores : fit;
    }
    if (cfg->workers > fit || cfg->threads > fit) {
        const char *name = cfg->workers > cfg->threads ? "workers" : "threads";
        int32_t n = cfg->workers > cfg->threads ? cfg->workers : cfg->threads;
        char blas[64];
        snprintf(blas, sizeof blas, "%s", origin_of(from, "blas-threads"));
        set_err(err, err_size,
                "%s: %d threads x %s %d = %d OpenBLAS work buffers, over its %d (the larger of "
                "--threads and --workers, times --blas-threads, is at most %d)",
                origin_of(from, name), (int)n, blas, (int)cfg->blas_threads,
                (int)(n * cfg->blas_threads), BLAS_MAX_BUFFERS, BLAS_MAX_BUFFERS);
        return -1;
    }
    return 0;
}

enum config_result config_parse(struct config *cfg, int argc, char *const *argv, char *const *envp,
                                int32_t cores, char *err, size_t err_size) {
    memset(cfg, 0, sizeof *cfg);
    err[0] = '\0';
    struct origins from;
    memset(&from, 0, sizeof from);
    for (int i = 0; i < N_OPTIONS; i++) {
        if (apply(cfg, &options[i], options[i].def, "default", err, err_size) != 0) {
            return CONFIG_ERROR;
        }
    }
    /* The flags are found first, so that a variable whose option a flag sets is never read: a
     * bad value there must not refuse a start that overrides it. */
    bool by_flag[N_OPTIONS] = {false};
    for (int pass = 0; pass < 2; pass++) {
        for (int a = 1; a < argc; a++) {
            const char *arg = argv[a];
            if (strcmp(arg, "--help") == 0 || strcmp(arg, "-h") == 0) {
                return CONFIG_HELP;
            }
            if (strncmp(arg, "--", 2) != 0) {
                set_err(err, err_size,
                        "unexpected argument '%s' (options start with --; see --help)", arg);
                return CONFIG_ERROR;
            }
            const char *name = arg + 2;
            const char *eq = strchr(name, '=');
            size_t len = eq ? (size_t)(eq - name) : strlen(name);
            const struct option *o = find_option(name, len);
            if (o == NULL) {
                set_err(err, err_size, "unknown option '--%.*s' (see --help)", (int)len, name);
                return CONFIG_ERROR;
            }
            const char *value;
            if (eq != NULL) {
                value = eq + 1;
            } else if (a + 1 < argc) {
                value = argv[++a];
            } else {
                set_err(err, err_size, "--%s: missing value", o->name);
                return CONFIG_ERROR;
            }
            if (pass == 0) {
                by_flag[o - options] = true;
                continue;
            }
            char source[64];
            snprintf(source, sizeof source, "--%s", o->name);
            if (apply(cfg, o, value, source, err, err_size) != 0) {
                return CONFIG_ERROR;
            }
        }
        for (int e = 0; pass == 0 && envp != NULL && envp[e] != NULL; e++) {
            const char *eq = strchr(envp[e], '=');
            if (eq == NULL) {
                continue;
            }
            for (int i = 0; i < N_OPTIONS; i++) {
                size_t n = strlen(options[i].env);
                if (!by_flag[i] && (size_t)(eq - envp[e]) == n &&
                    strncmp(envp[e], options[i].env, n) == 0) {
                    if (apply(cfg, &options[i], eq + 1, options[i].env, err, err_size) != 0) {
                        return CONFIG_ERROR;
                    }
                    from.from_env[i] = true;
                }
            }
        }
    }
    return resolve(cfg, cores, &from, err, err_size) == 0 ? CONFIG_OK : CONFIG_ERROR;
}

void config_help(FILE *f) {
    fprintf(f, "usage: attnd [--option value | --option=value]...\n\n"
               "attnd serves a transformer's attention layers over HTTP/JSON (see "
               "proto/openapi.yaml).\nEvery option can also be set by its environment variable; "
               "flags win over the environment.\n\n");
    for (int i = 0; i < N_OPTIONS; i++) {
        const struct option *o = &options[i];
        fprintf(f, "  --%-18s %s (default: %s)\n", o->name, o->env, o->def[0] ? o->def : "\"\"");
        fprintf(f, "      %s\n", o->help);
    }
    fprintf(f, "  --%-18s print this help and exit (also -h)\n", "help");
}

void config_log(const struct config *cfg, char *const *envp) {
    /* A misspelt variable (ATTND_KV_BUDGET for ATTND_KV_BUDGET_MB) would leave its option at its
     * default without a word, where a misspelt flag refuses the start. Other programs' ATTND_*
     * variables may share the environment (a test runner's ATTND_BIN), so it is a warning. */
    for (int e = 0; envp != NULL && envp[e] != NULL; e++) {
        const char *eq = strchr(envp[e], '=');
        if (eq == NULL || strncmp(envp[e], "ATTND_", 6) != 0) {
            continue;
        }
        bool is_known = false;
        for (int i = 0; i < N_OPTIONS && !is_known; i++) {
            is_known = strlen(options[i].env) == (size_t)(eq - envp[e]) &&
                       strncmp(envp[e], options[i].env, (size_t)(eq - envp[e])) == 0;
        }
        if (!is_known) {
            LOG_WARN("config", "%.*s is not a variable of attnd's options (see --help): ignored",
                     (int)(eq - envp[e]), envp[e]);
        }
    }
    for (int i = 0; i < N_OPTIONS; i++) {
        const struct option *o = &options[i];
        const void *f = (const char *)cfg + o->offset;
        switch (o->type) {
        case OPTION_STRING:
        case OPTION_PRESET:
        case OPTION_LAYERS: {
            const char *s = *(const char *const *)f;
            if (strcmp(o->name, "api-key") == 0) {
                s = s[0] ? "(set)" : "(none)";
            }
            char quoted[1024]; /* a path's '"' must not end the field */
            LOG_INFO("config", "option name=%s value=%s", o->name,
                     log_quote(quoted, sizeof quoted, s));
            break;
        }
        case OPTION_I32:
            LOG_INFO("config", "option name=%s value=%d", o->name, (int)*(const int32_t *)f);
            break;
        case OPTION_I64:
            LOG_INFO("config", "option name=%s value=%" PRId64, o->name, *(const int64_t *)f);
            break;
        case OPTION_U64:
            LOG_INFO("config", "option name=%s value=%" PRIu64, o->name, *(const uint64_t *)f);
            break;
        case OPTION_LOG_LEVEL:
            LOG_INFO("config", "option name=%s value=%s", o->name,
                     log_level_name(*(const enum log_level *)f));
            break;
        }
    }
}
