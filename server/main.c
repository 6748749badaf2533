/* server/main.c: attnd's entry point. Only wiring: parse the config, size the thread pools and
 * the open-file limit, build the model, the session store, the scheduler and the HTTP server,
 * run the loop, and on SIGINT/SIGTERM/SIGHUP drain and tear everything down in reverse order.
 * Startup failures print one line and exit non-zero (1, or 2 for a bad option); a drained shutdown
 * exits 0, or EXIT_DRAIN_CUT when the drain deadline cut requests that were still being received or
 * a session's file could not be written.
 */
#include <inttypes.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

#include <cblas.h>
#include <uv.h>

#include "../engine/attn.h"
#include "blas.h"
#include "config.h"
#include "error.h"
#include "http.h"
#include "log.h"
#include "pool.h"
#include "route.h"
#include "session.h"
#include "spill.h"

extern char **environ;

/* Evicted or expired ids remembered for 410 answers (proto/openapi.yaml, Sessions). */
#define MAX_TOMBSTONES 65536
/* Descriptors besides the connections: the loop, MHD's epoll fd, the log, model files. */
#define FD_RESERVE 64
/* The exit status of a drain whose deadline cut requests still being received (README). */
#define EXIT_DRAIN_CUT 3

/* The daemon: the server context plus main's own loop handles. Loop thread only. */
struct daemon {
    struct server srv; /* first: route's on_drained hands back &srv */
    uv_loop_t loop;
    uv_signal_t sigint, sigterm, sighup;
    uv_timer_t tick, shutdown, drain_deadline;
    uv_work_t pool_start; /* starts libuv's pool before the first request (start_handles) */
    int32_t n_cut;        /* requests the drain deadline dropped */
    int32_t n_lost;       /* sessions whose files could not be written at shutdown */
};

static void on_shutdown(uv_timer_t *t) {
    struct daemon *d = t->data;
    LOG_INFO("main", "shutting down");
    uv_close((uv_handle_t *)&d->sigint, NULL);
    uv_close((uv_handle_t *)&d->sigterm, NULL);
    uv_close((uv_handle_t *)&d->sighup, NULL);
    /* Closing the watchers restores the default action, which would turn a late second
     * SIGTERM into a kill instead of the exit 0 this drain promised. */
    signal(SIGINT, SIG_IGN);
    signal(SIGTERM, SIG_IGN);
    signal(SIGHUP, SIG_IGN);
    uv_close((uv_handle_t *)&d->tick, NULL);
    uv_close((uv_handle_t *)&d->shutdown, NULL);
    uv_close((uv_handle_t *)&d->drain_deadline, NULL);
    http_server_destroy(d->srv.http);
    d->srv.http = NULL;
    if (d->srv.spill != NULL) {
        /* every request is finished, so every session is idle: all of them go to disk */
        spill_save_all(d->srv.spill);
        d->n_lost = spill_close(d->srv.spill);
        d->srv.spill = NULL;
    }
    pool_destroy(d->srv.pool);
    d->srv.pool = NULL;
    team_destroy(d->srv.team); /* after the pool: no forward runs any more */
    d->srv.team = NULL;
}

static void on_drained(struct server *srv) {
    struct daemon *d = (struct daemon *)srv;
    /* Called from inside HTTP or pool callbacks: tear down on a fresh loop turn. */
    uv_timer_start(&d->shutdown, on_shutdown, 0, 0);
}

/* The drain's grace is over: whatever has not fully arrived is dropped (a client trickling an
 * upload would otherwise hold the drain forever); requests fully received finish. */
static void on_drain_deadline(uv_timer_t *t) {
    struct daemon *d = t->data;
    int32_t finishing = 0;
    int32_t n = http_server_cut_unreceived(d->srv.http, &finishing);
    d->n_cut += n;
    LOG_WARN("main",
             "drain deadline after %d s: cut requests still being received req=- session=- "
             "n_cut=%d finishing=%d",
             (int)d->srv.cfg->drain_timeout_s, (int)n, (int)finishing);
    route_check_drained(&d->srv); /* what was cut may have been all that was left */
}

static void on_signal(uv_signal_t *h, int signum) {
    struct daemon *d = h->data;
    if (d->srv.is_draining) {
        LOG_WARN("main", "signal %d while draining; still finishing accepted requests", signum);
        return;
    }
    LOG_INFO("main",
             "signal %d: draining (no new connections; finishing accepted requests; requests "
             "still being received get drain_timeout_s=%d)",
             signum, (int)d->srv.cfg->drain_timeout_s);
    http_server_quiesce(d->srv.http);
    uv_timer_start(&d->drain_deadline, on_drain_deadline,
                   (uint64_t)d->srv.cfg->drain_timeout_s * 1000, 0);
    route_drain(&d->srv);
}

static void on_tick(uv_timer_t *t) {
    route_tick(t->data);
}

/* Builds the model from --model or the preset. Returns 0 or prints why and returns -1. */
static int load_model(const struct config *cfg, attn_model **model, char *source,
                      size_t source_size) {
    attn_dtype held = ATTN_DTYPE_AUTO;
    (void)attn_dtype_parse(cfg->weights_dtype, &held); /* config_parse checked it */
    if (held == ATTN_DTYPE_AUTO && cfg->model[0] == '\0') {
        held = ATTN_DTYPE_BF16; /* a preset's random weights: the dtype checkpoints ship in */
    }
    attn_load_params lp = {cfg->layer_first,
                           cfg->layer_count,
                           cfg->max_seq,
                           cfg->trust_layout[0] != '\0' ? cfg->trust_layout : NULL,
                           held,
                           cfg->modeling_code[0] != '\0' ? cfg->modeling_code : NULL};
    char err[512] = "";
    if (cfg->geometry[0] != '\0') {
        attn_config g;
        (void)config_parse_geometry(cfg->geometry, &g, err, sizeof err); /* config_parse did */
        if (cfg->layer_first >= g.n_layers ||
            (int64_t)cfg->layer_first + cfg->layer_count > g.n_layers) {
            /* named as for a preset: the engine's EINVAL would blame the geometry */
            fprintf(stderr, "attnd: --layers %s: --geometry has layers 0-%d\n", cfg->layers,
                    (int)g.n_layers - 1);
            return -1;
        }
        int rc = attn_model_create_geometry(&g, &lp, model);
        if (rc != ATTN_OK) {
            fprintf(stderr, "attnd: --geometry %s: %s\n", cfg->geometry, attn_strerror(rc));
            return -1;
        }
        snprintf(source, source_size, "geometry:%s", cfg->geometry);
        LOG_INFO("main", "--geometry: serving attention alone (no weights): POST /v1/kv/attend");
        return 0;
    }
    if (cfg->model[0] != '\0') {
        int rc = attn_model_load_hf(cfg->model, &lp, model, err, sizeof err);
        if (rc != ATTN_OK) {
            /* the loader's reason names what it refused; its code adds nothing to it (and
             * ERANGE's text, about positions, would mislead for a weight past a dtype) */
            fprintf(stderr, "attnd: --model %s: %s\n", cfg->model,
                    err[0] ? err : attn_strerror(rc));
            return -1;
        }
        snprintf(source, source_size, "%s", cfg->model);
        attn_dtype got = attn_model_weights_dtype(*model);
        if (held != ATTN_DTYPE_AUTO && got != held) {
            /* multi-head latent attention keeps its tensors in float whatever was asked */
            LOG_WARN("main",
                     "--weights-dtype %s: the projections are held as %s (multi-head "
                     "latent attention's tensors stay float)",
                     cfg->weights_dtype, attn_dtype_name(got));
        } else if (held == ATTN_DTYPE_AUTO && got == ATTN_DTYPE_F32) {
            LOG_INFO("main", "weights held as f32 (%s)",
                     attn_model_config(*model)->kv_lora_rank > 0
                         ? "multi-head latent attention's tensors stay float"
                         : "the checkpoint's F32, or projections of more than one dtype, which "
                           "float holds exactly");
        }
        return 0;
    }
    attn_config mc;
    attn_config_preset(cfg->preset, &mc); /* config_parse checked the name */
    if (cfg->layer_first >= mc.n_layers ||
        (int64_t)cfg->layer_first + cfg->layer_count > mc.n_layers) {
        fprintf(stderr, "attnd: --layers %s: preset %s has layers 0-%d\n", cfg->layers, cfg->preset,
                (int)mc.n_layers - 1);
        return -1;
    }
    int rc = attn_model_create_random(&mc, cfg->seed, &lp, model);
    if (rc != ATTN_OK) {
        fprintf(stderr, "attnd: cannot build preset %s: %s\n", cfg->preset, attn_strerror(rc));
        return -1;
    }
    snprintf(source, source_size, "preset:%s seed=%" PRIu64, cfg->preset, cfg->seed);
    LOG_INFO("main",
             "no --model given: serving the built-in preset=%s with seeded random weights "
             "seed=%" PRIu64,
             cfg->preset, cfg->seed);
    return 0;
}

/* The store, the scheduler and the server context around the model. Returns 0, or prints why
 * and returns -1 (having freed what it made). */
static int build_server(struct daemon *d, const struct config *cfg, attn_model *model,
                        const char *source) {
    struct server *srv = &d->srv;
    const attn_config *mc = attn_model_config(model);
    struct session_store_params sp = {
        .model = model,
        .budget_bytes = (size_t)cfg->kv_budget_mb << 20,
        .block_tokens = cfg->kv_block_tokens,
        .kv_dtype = ATTN_DTYPE_AUTO,
        .keep_queries = cfg->keep_queries != 0,
        .max_sessions = cfg->max_sessions,
        .max_tombstones = MAX_TOMBSTONES,
    };
    (void)attn_dtype_parse(cfg->kv_dtype, &sp.kv_dtype); /* config_parse checked it */
    int rc = session_store_create(&sp, &srv->sessions);
    if (rc != 0) {
        size_t block =
            attn_kv_block_bytes_ex(model, cfg->kv_block_tokens, sp.kv_dtype, sp.keep_queries);
        if (block == 0 && sp.keep_queries && mc->kv_lora_rank > 0) {
            fprintf(stderr,
                    "attnd: --keep-queries: this model's multi-head latent attention attends with "
                    "absorbed queries over a latent cache; it has no per-head queries to keep\n");
            return -1;
        }
        int32_t min_tokens = 16;
        while (min_tokens < 256 &&
               attn_kv_block_bytes_ex(model, min_tokens, sp.kv_dtype, sp.keep_queries) == 0) {
            min_tokens *= 2;
        }
        if (block == 0 && mc->kv_lora_rank == 0) {
            /* a linear-attention layer's state must fit in one block */
            fprintf(stderr,
                    "attnd: --kv-block-tokens %d: a block is smaller than a linear-attention "
                    "layer's state (head_dim^2 + head_dim doubles a KV head); use %d or more\n",
                    (int)cfg->kv_block_tokens, (int)min_tokens);
            return -1;
        }
        if (block == 0) {
            /* the other shape a pool refuses: Q8_0 blocks must tile a latent's value part */
            fprintf(stderr,
                    "attnd: --kv-dtype %s: this model's cache cannot hold it: a latent cache "
                    "needs kv_lora_rank (%d) a multiple of 32 for q8_0 (%s)\n",
                    cfg->kv_dtype, (int)mc->kv_lora_rank, attn_strerror(rc));
            return -1;
        }
        fprintf(stderr,
                "attnd: --kv-budget-mb %lld: cannot make a KV pool of that size with blocks of "
                "%zu bytes (%s)\n",
                (long long)cfg->kv_budget_mb, block, attn_strerror(rc));
        return -1;
    }
    if (team_create(cfg->threads, &srv->team) != 0) {
        fprintf(stderr, "attnd: cannot start %d computing threads\n", (int)cfg->threads);
        session_store_destroy(srv->sessions);
        return -1;
    }
    struct pool_params pp = {
        .team = srv->team,
        .loop = &d->loop,
        .model = model,
        .sessions = srv->sessions,
        .n_workers = cfg->workers,
        .max_batch_tokens = cfg->max_batch_tokens,
        .queue_depth = cfg->queue_depth,
        .inline_macs = cfg->inline_macs,
    };
    rc = pool_create(&pp, &srv->pool);
    if (rc != 0) {
        fprintf(stderr, "attnd: cannot create %d engine workspaces: %s\n", (int)cfg->workers,
                attn_strerror(rc));
        team_destroy(srv->team);
        session_store_destroy(srv->sessions);
        return -1;
    }
    if (cfg->state_dir[0] != '\0') {
        struct spill_params fp = {
            .loop = &d->loop,
            .dir = cfg->state_dir,
            .budget_bytes = (size_t)cfg->state_budget_mb << 20,
            .sessions = srv->sessions,
            .model = model,
            .kv = snapshot_kv_of(session_store_kv_pool(srv->sessions)),
        };
        char err[512];
        if (spill_open(&fp, &srv->spill, err, sizeof err) != 0) {
            fprintf(stderr, "attnd: %s\n", err);
            pool_destroy(srv->pool);
            uv_run(&d->loop, UV_RUN_DEFAULT); /* lets the pool's handle close */
            team_destroy(srv->team);
            session_store_destroy(srv->sessions);
            return -1;
        }
        spill_set_pool(srv->spill, srv->pool);
    }
    srv->cfg = cfg;
    srv->loop = &d->loop;
    srv->model = model;
    srv->model_source = source;
    srv->limits = (struct api_limits){
        .hidden_size = mc->hidden_size,
        .n_heads = mc->n_heads,
        .layer_first = attn_model_layer_first(model),
        .layer_count = attn_model_layer_count(model),
        .max_seq = mc->max_seq,
        .n_kv_heads = mc->n_kv_heads,
        .head_dim = mc->head_dim,
    };
    metrics_init(&srv->metrics);
    srv->on_drained = on_drained;
    return 0;
}

static void start_pool_work(uv_work_t *w) {
    (void)w;
}

/* Signals, the TTL sweep, the shutdown timer, and libuv's thread pool. */
static void start_handles(struct daemon *d) {
    uv_signal_init(&d->loop, &d->sigint);
    uv_signal_init(&d->loop, &d->sigterm);
    uv_signal_init(&d->loop, &d->sighup);
    d->sigint.data = d->sigterm.data = d->sighup.data = d;
    uv_signal_start(&d->sigint, on_signal, SIGINT);
    uv_signal_start(&d->sigterm, on_signal, SIGTERM);
    /* a closing terminal's hangup drains too: its default action killed the daemon at once,
     * and with --state-dir lost every session in memory (noticed by an outside audit) */
    uv_signal_start(&d->sighup, on_signal, SIGHUP);
    uv_timer_init(&d->loop, &d->tick);
    d->tick.data = &d->srv;
    uv_timer_start(&d->tick, on_tick, 1000, 1000);
    uv_timer_init(&d->loop, &d->shutdown);
    d->shutdown.data = d;
    uv_timer_init(&d->loop, &d->drain_deadline);
    d->drain_deadline.data = d;
    /* libuv starts its thread pool at the first uv_queue_work and aborts the process if a
     * thread cannot be made: started here, a lack of memory stops the start, not a serving
     * daemon at its first forward. */
    uv_queue_work(&d->loop, &d->pool_start, start_pool_work, NULL);
}

/* Descriptors the process holds at most with max_connections. */
static int64_t fds_for(int32_t max_connections) {
    return http_server_fds_needed(max_connections) + FD_RESERVE;
}

/* Each connection holds a descriptor: raises the soft RLIMIT_NOFILE to fit max_connections, as
 * far as the hard limit allows. Returns the connection limit that fits: max_connections, or
 * fewer when the hard limit is lower (a limit the process cannot keep would end in EMFILE). */
static int32_t fit_open_files(int32_t max_connections) {
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) != 0) {
        return max_connections;
    }
    rlim_t need = (rlim_t)fds_for(max_connections);
    if (rl.rlim_cur != RLIM_INFINITY && rl.rlim_cur < need && rl.rlim_cur < rl.rlim_max) {
        rlim_t old = rl.rlim_cur;
        rl.rlim_cur = rl.rlim_max == RLIM_INFINITY || rl.rlim_max >= need ? need : rl.rlim_max;
        if (setrlimit(RLIMIT_NOFILE, &rl) == 0) {
            LOG_INFO("main", "raised the open-file limit RLIMIT_NOFILE from=%llu to=%llu hard=%llu",
                     (unsigned long long)old, (unsigned long long)rl.rlim_cur,
                     (unsigned long long)rl.rlim_max);
        } else {
            getrlimit(RLIMIT_NOFILE, &rl);
        }
    }
    if (rl.rlim_cur == RLIM_INFINITY || rl.rlim_cur >= need) {
        return max_connections;
    }
    int64_t fit = (int64_t)rl.rlim_cur - FD_RESERVE - (http_server_fds_needed(0));
    fit = fit > 1 ? fit : 1;
    LOG_WARN("main",
             "the open-file limit (soft=%llu hard=%llu) holds only %lld connections: serving at "
             "most that many instead of --max-connections %d",
             (unsigned long long)rl.rlim_cur, (unsigned long long)rl.rlim_max, (long long)fit,
             (int)max_connections);
    return (int32_t)fit;
}

/* Every descriptor the process may hold is below this: fds_for the connections fit_open_files
 * fitted, within the open-file limit. */
static int32_t fd_ceiling(int32_t max_connections) {
    int64_t ceiling = fds_for(max_connections);
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY &&
        (int64_t)rl.rlim_cur < ceiling) {
        ceiling = (int64_t)rl.rlim_cur;
    }
    return ceiling < INT32_MAX ? (int32_t)ceiling : INT32_MAX;
}

/* The canned 503 for a connection past the limits, sent before its request is read. */
static char *refusal_body(size_t *len) {
    return api_error_encode(ERROR_TOO_MANY_CONNECTIONS, NULL, NULL, len);
}

int main(int argc, char **argv) {
    signal(SIGPIPE, SIG_IGN);
    struct config cfg;
    char err[512];
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    switch (
        config_parse(&cfg, argc, argv, environ, cores > 0 ? (int32_t)cores : 1, err, sizeof err)) {
    case CONFIG_HELP:
        config_help(stdout);
        return 0;
    case CONFIG_ERROR:
        fprintf(stderr, "attnd: %s\n", err);
        return 2;
    case CONFIG_OK:
        break;
    }
    log_set_level(cfg.log_level);
    LOG_INFO("main", "attnd starting pid=%d cores=%ld", (int)getpid(), cores);
    config_log(&cfg, environ);

    /* Both pools are sized before any thread exists: libuv reads UV_THREADPOOL_SIZE at its
     * first uv_queue_work, and one BLAS thread per call keeps the computing threads within the
     * cores (see --blas-threads). The libuv pool has one thread more than --workers: the
     * scheduler never runs more than --workers engine jobs, so large request bodies always find
     * a thread to be parsed on (job.c) even while every worker is busy. */
    char n_threads[16];
    snprintf(n_threads, sizeof n_threads, "%d", (int)cfg.workers + 1);
    setenv("UV_THREADPOOL_SIZE", n_threads, 1);
    openblas_set_num_threads(cfg.blas_threads);
    attn_kernels_allow_avx512(cfg.avx512 != 0);
    /* BLAS calls run at once on the workers and on the team's helpers, which join only while
     * fewer than --threads threads compute: at most max(workers, threads) callers. */
    int32_t callers = cfg.workers > cfg.threads ? cfg.workers : cfg.threads;
    if (blas_reserve(callers * cfg.blas_threads, err, sizeof err) != 0) {
        /* _exit, not return: under the same cap, OpenBLAS's own threads (started when the
         * library loaded) may still be retrying their first buffer, and exit's handlers would
         * wait for them forever. */
        fprintf(stderr, "attnd: %s\n", err);
        fflush(stderr);
        _exit(1);
    }

    static struct daemon d; /* static: large, and outlives every callback */
    static char source[4096];
    attn_model *model = NULL;
    if (load_model(&cfg, &model, source, sizeof source) != 0) {
        return 1;
    }
    const attn_config *mc = attn_model_config(model);
    char quoted[1024];
    LOG_INFO("main",
             "model source=%s family=\"%s\" layers=%d-%d hidden=%d heads=%d kv_heads=%d "
             "head_dim=%d max_seq=%d weights_bytes=%zu",
             log_quote(quoted, sizeof quoted, source), attn_model_family(model),
             (int)attn_model_layer_first(model),
             (int)(attn_model_layer_first(model) + attn_model_layer_count(model) - 1),
             (int)mc->hidden_size, (int)mc->n_heads, (int)mc->n_kv_heads, (int)mc->head_dim,
             (int)mc->max_seq, attn_model_bytes(model));
    uv_loop_init(&d.loop);
    if (build_server(&d, &cfg, model, source) != 0) {
        uv_loop_close(&d.loop);
        attn_model_destroy(model);
        return 1;
    }
    struct server *srv = &d.srv;
    struct http_handlers handlers;
    route_handlers(srv, &handlers);
    size_t refusal_len = 0;
    char *refusal = refusal_body(&refusal_len);
    int32_t max_connections = fit_open_files(cfg.max_connections);
    struct http_params hp = {
        .host = cfg.host,
        .port = cfg.port,
        .max_body_bytes = (size_t)cfg.max_body_mb << 20,
        .max_held_bytes = (size_t)cfg.max_held_mb << 20,
        .max_connections = max_connections,
        .max_per_ip = cfg.max_connections_per_ip,
        .idle_timeout_s = cfg.idle_timeout_s,
        .header_timeout_s = cfg.header_timeout_s,
        .spin_us = cfg.spin_us,
        .fd_ceiling = fd_ceiling(max_connections),
        .refusal_type = "application/json",
        .refusal_body = refusal,
        .refusal_len = refusal_len,
    };
    int rc = http_server_create(&d.loop, &hp, &handlers, &srv->http, err, sizeof err);
    free(refusal);
    if (rc != 0) {
        fprintf(stderr, "attnd: %s\n", err);
        spill_close(srv->spill);
        pool_destroy(srv->pool);
        uv_run(&d.loop, UV_RUN_DEFAULT); /* lets the pool's handle close */
        uv_loop_close(&d.loop);
        session_store_destroy(srv->sessions);
        attn_model_destroy(model);
        return 1;
    }
    start_handles(&d);
    if (cfg.workers > cfg.threads) {
        /* every worker computes its own forward: --threads bounds only what helpers add */
        LOG_WARN("main",
                 "--workers %d is above --threads %d: up to %d forwards compute at once, more "
                 "threads than --threads asks",
                 (int)cfg.workers, (int)cfg.threads, (int)cfg.workers);
    }
    LOG_INFO("main", "listening host=%s port=%d workers=%d threads=%d blas_threads=%d kernels=%s",
             cfg.host, (int)http_server_port(srv->http), (int)cfg.workers, (int)cfg.threads,
             (int)cfg.blas_threads, attn_kernels_name());
    uv_run(&d.loop, UV_RUN_DEFAULT);

    /* Every handle is closed (on_shutdown): nothing runs any more. */
    uv_loop_close(&d.loop);
    session_store_destroy(srv->sessions);
    attn_model_destroy(model);
    uv_library_shutdown();
    int status = d.n_cut > 0 || d.n_lost > 0 ? EXIT_DRAIN_CUT : 0;
    LOG_INFO("main", "exit status=%d n_cut=%d sessions_lost=%d", status, (int)d.n_cut,
             (int)d.n_lost);
    return status;
}
