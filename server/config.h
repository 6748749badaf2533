/* server/config.h: attnd's configuration, parsed once at startup from (in increasing
 * precedence) the defaults, ATTND_* environment variables and command-line flags. One table in
 * config.c lists every option (name, env var, type, default, limits, help); --help is printed
 * from it. After config_parse the struct is immutable and passed down as const.
 */
#ifndef SERVER_CONFIG_H
#define SERVER_CONFIG_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "../engine/attn.h"

#include "log.h"

/* Immutable after config_parse. String fields point into argv, the environment or string
 * literals, all of which outlive the process's use of the config. */
struct config {
    const char *host;          /* address to bind */
    int32_t port;              /* TCP port; 0 = an ephemeral port (logged as port=) */
    const char *model;         /* HF-style model folder, or "" for the built-in preset */
    const char *trust_layout;  /* "" or "llama": how to read an unknown model_type */
    const char *modeling_code; /* "", "transformers" or "checkpoint" (attn_load_params) */
    const char *weights_dtype; /* auto, f32, bf16 or f16: how the projections are held */
    const char *kv_dtype;      /* auto, f32, bf16, f16 or q8_0: how the KV cache holds K/V */
    int32_t keep_queries;      /* 1: the KV pool keeps each token's queries (inspection) */
    const char *preset;        /* built-in preset when model is "" */
    uint64_t seed;             /* seed of the preset's random weights */
    const char *layers;        /* "all", "N" or "A-B" as given */
    int32_t layer_first;       /* parsed from layers */
    int32_t layer_count;       /* parsed from layers; 0 = to the last layer */
    int64_t kv_budget_mb;      /* KV pool budget, MiB */
    int32_t kv_block_tokens;   /* tokens per KV block (0 = the engine's default) */
    int32_t max_sessions;      /* live sessions at most */
    int32_t max_seq;           /* 0 = the model's max positions */
    int32_t workers;           /* engine worker threads (resolved: never 0 after parse) */
    int32_t threads;           /* computing threads, workers and helpers (never 0 after parse) */
    int32_t blas_threads;      /* OpenBLAS threads per call */
    int32_t avx512;            /* 1: AVX-512 kernels where the CPU has them */
    int32_t max_batch_tokens;  /* tokens per engine call (batch cap, prefill chunk) */
    int64_t inline_macs;       /* a forward this small on an idle pool runs on the loop thread */
    int32_t spin_us;           /* the loop's poll before it sleeps, while no worker computes */
    int64_t max_body_mb;       /* largest request body, MiB */
    int64_t max_held_mb;       /* request bodies and answers held for clients at once, MiB */
    int32_t queue_depth;       /* accepted requests waiting at most */
    int32_t max_connections;   /* open connections at most (before the RLIMIT_NOFILE fit) */
    /* connections from one client address at most; 0 = no limit */
    int32_t max_connections_per_ip;
    int32_t idle_timeout_s;   /* seconds a connection may move no byte (not while suspended) */
    int32_t header_timeout_s; /* seconds from a request's first byte to its last header */
    int32_t drain_timeout_s;  /* seconds a drain waits for requests still being received */
    int64_t session_ttl_s;    /* idle seconds before a session expires; 0 = never */
    const char *state_dir;    /* the disk tier's directory, or "" for none */
    int64_t state_budget_mb;  /* bytes of session files at most, MiB */
    const char *geometry;     /* "" or "heads=..,kv_heads=..,head_dim=..,layers=..[,...]" */
    const char *api_key;      /* "" = no authentication */
    enum log_level log_level;
};

enum config_result {
    CONFIG_OK = 0,
    CONFIG_HELP = 1,   /* --help was given: print config_help and exit 0 */
    CONFIG_ERROR = -1, /* err holds one line saying which option and why */
};

/* Fills *cfg from defaults, then envp (NULL-terminated "NAME=value" strings, e.g. environ),
 * then argv[1..argc-1] (`--name value` or `--name=value`). Resolves workers 0 and threads 0 to
 * the number of online cores, at most BLAS_MAX_BUFFERS / blas_threads (blas.h), and refuses
 * counts whose BLAS work buffers would pass BLAS_MAX_BUFFERS. cores is the machine's core count
 * (pass sysconf(_SC_NPROCESSORS_ONLN)); taking it as an argument keeps tests deterministic.
 * On CONFIG_ERROR, err (err_size bytes) gets a one-line reason. */
enum config_result config_parse(struct config *cfg, int argc, char *const *argv, char *const *envp,
                                int32_t cores, char *err, size_t err_size);

/* Reads --geometry's "key=value,..." into a config of attention geometry alone (no weights):
 * heads, kv_heads, head_dim and layers are required; max_positions (default 4096), rope_theta
 * (default 10000; 0 for no RoPE), rotary_dim, window (a sliding window on every layer), softcap
 * and scale are optional. Returns 0, or -1 with a one-line reason in err. */
int config_parse_geometry(const char *spec, attn_config *out, char *err, size_t err_size);

/* Writes the usage text, every option with its env var, default and help, to f. */
void config_help(FILE *f);

/* Logs the effective configuration at info level, one option per line (the API key masked), and
 * warns of each ATTND_* variable in envp that is no option's. */
void config_log(const struct config *cfg, char *const *envp);

#endif /* SERVER_CONFIG_H */
