/* server/metrics.c: Prometheus text rendering of struct metrics (see metrics.h). */
#include "metrics.h"

#include <inttypes.h>
#include <string.h>

static const char *const endpoint_names[METRICS_ENDPOINT_COUNT] = {
    "attend",    "sdpa",      "sessions", "session", "truncate", "fork",    "export",
    "attention", "kv_attend", "model",    "healthz", "readyz",   "metrics", "other",
};

/* The statuses attnd answers with; anything else counts as "other" (the last slot). */
static const int statuses[METRICS_N_STATUS - 1] = {200, 201, 204, 400, 401, 404, 405, 409,
                                                   410, 413, 429, 500, 503, 507, 502};

/* Upper bounds in seconds (le=), 1 ms .. 10 s. */
static const double bucket_le[METRICS_N_BUCKETS] = {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1,
                                                    0.25,  0.5,    1,     2.5,  5,     10,   1e300};

void metrics_init(struct metrics *m) {
    memset(m, 0, sizeof *m);
}

const char *metrics_endpoint_name(enum metrics_endpoint e) {
    return (unsigned)e < METRICS_ENDPOINT_COUNT ? endpoint_names[e] : "other";
}

static int status_slot(int status) {
    for (int i = 0; i < METRICS_N_STATUS - 1; i++) {
        if (statuses[i] == status) {
            return i;
        }
    }
    return METRICS_N_STATUS - 1;
}

void metrics_request_done(struct metrics *m, enum metrics_endpoint e, int http_status,
                          double seconds) {
    if ((unsigned)e >= METRICS_ENDPOINT_COUNT) {
        e = METRICS_ENDPOINT_OTHER;
    }
    m->requests[e][status_slot(http_status)]++;
    for (int b = 0; b < METRICS_N_BUCKETS; b++) {
        if (seconds <= bucket_le[b]) {
            m->latency_buckets[e][b]++;
            break;
        }
    }
    m->latency_sum_s[e] += seconds;
    m->latency_count[e]++;
}

static void render_requests(const struct metrics *m, struct strbuf *out) {
    strbuf_puts(out, "# HELP attnd_requests_total HTTP requests answered, by endpoint and "
                     "status.\n# TYPE attnd_requests_total counter\n");
    for (int e = 0; e < METRICS_ENDPOINT_COUNT; e++) {
        for (int s = 0; s < METRICS_N_STATUS; s++) {
            if (m->requests[e][s] == 0) {
                continue;
            }
            if (s < METRICS_N_STATUS - 1) {
                strbuf_printf(out,
                              "attnd_requests_total{endpoint=\"%s\",status=\"%d\"} %" PRIu64 "\n",
                              endpoint_names[e], statuses[s], m->requests[e][s]);
            } else {
                strbuf_printf(
                    out, "attnd_requests_total{endpoint=\"%s\",status=\"other\"} %" PRIu64 "\n",
                    endpoint_names[e], m->requests[e][s]);
            }
        }
    }
}

static void render_latency(const struct metrics *m, struct strbuf *out) {
    strbuf_puts(out, "# HELP attnd_request_duration_seconds Time from a request's headers to "
                     "its answer.\n# TYPE attnd_request_duration_seconds histogram\n");
    for (int e = 0; e < METRICS_ENDPOINT_COUNT; e++) {
        if (m->latency_count[e] == 0) {
            continue;
        }
        uint64_t cum = 0;
        for (int b = 0; b < METRICS_N_BUCKETS - 1; b++) {
            cum += m->latency_buckets[e][b];
            strbuf_printf(out,
                          "attnd_request_duration_seconds_bucket{endpoint=\"%s\",le=\"%g\"} "
                          "%" PRIu64 "\n",
                          endpoint_names[e], bucket_le[b], cum);
        }
        strbuf_printf(out,
                      "attnd_request_duration_seconds_bucket{endpoint=\"%s\",le=\"+Inf\"} "
                      "%" PRIu64 "\n",
                      endpoint_names[e], m->latency_count[e]);
        strbuf_printf(out, "attnd_request_duration_seconds_sum{endpoint=\"%s\"} %.6f\n",
                      endpoint_names[e], m->latency_sum_s[e]);
        strbuf_printf(out, "attnd_request_duration_seconds_count{endpoint=\"%s\"} %" PRIu64 "\n",
                      endpoint_names[e], m->latency_count[e]);
    }
}

const double metrics_restore_le[METRICS_N_RESTORE_BUCKETS] = {0.001, 0.002, 0.005, 0.01, 0.02, 0.05,
                                                              0.1,   0.2,   0.5,   1,    2,    5};

static void render_disk(const struct metrics_disk *d, struct strbuf *out) {
    strbuf_printf(
        out,
        "# HELP attnd_spills_total Session writes to --state-dir begun (for memory, or at "
        "shutdown); attnd_spill_failures_total counts those that failed.\n"
        "# TYPE attnd_spills_total counter\nattnd_spills_total %" PRIu64 "\n"
        "# HELP attnd_spill_failures_total Session writes that failed (the session "
        "was dropped).\n"
        "# TYPE attnd_spill_failures_total counter\n"
        "attnd_spill_failures_total %" PRIu64 "\n"
        "# HELP attnd_restores_total Sessions read back from --state-dir.\n"
        "# TYPE attnd_restores_total counter\nattnd_restores_total %" PRIu64 "\n"
        "# HELP attnd_restore_failures_total Session files refused at restore.\n"
        "# TYPE attnd_restore_failures_total counter\n"
        "attnd_restore_failures_total %" PRIu64 "\n"
        "# HELP attnd_corrupt_sessions_total Session files refused for a failed "
        "checksum or framing.\n"
        "# TYPE attnd_corrupt_sessions_total counter\n"
        "attnd_corrupt_sessions_total %" PRIu64 "\n"
        "# HELP attnd_disk_drops_total Sessions dropped from --state-dir (its budget, "
        "ttl).\n"
        "# TYPE attnd_disk_drops_total counter\nattnd_disk_drops_total %" PRIu64 "\n"
        "# HELP attnd_sessions_on_disk Sessions whose caches are in --state-dir.\n"
        "# TYPE attnd_sessions_on_disk gauge\nattnd_sessions_on_disk %" PRId64 "\n"
        "# HELP attnd_disk_bytes_used Bytes of session files in --state-dir.\n"
        "# TYPE attnd_disk_bytes_used gauge\nattnd_disk_bytes_used %zu\n"
        "# HELP attnd_disk_bytes_limit --state-budget-mb in bytes.\n"
        "# TYPE attnd_disk_bytes_limit gauge\nattnd_disk_bytes_limit %zu\n"
        "# HELP attnd_spill_pending_bytes Bytes of session files waiting to be "
        "written.\n"
        "# TYPE attnd_spill_pending_bytes gauge\nattnd_spill_pending_bytes %zu\n",
        d->spills, d->spill_failures, d->restores, d->restore_failures, d->corrupt, d->disk_drops,
        d->sessions_on_disk, d->bytes_on_disk, d->bytes_limit, d->pending_bytes);
    strbuf_puts(out, "# HELP attnd_restore_duration_seconds From a request naming a session on "
                     "disk to its caches back in memory.\n"
                     "# TYPE attnd_restore_duration_seconds histogram\n");
    uint64_t cum = 0;
    for (int b = 0; b < METRICS_N_RESTORE_BUCKETS; b++) {
        cum += d->restore_buckets[b];
        strbuf_printf(out, "attnd_restore_duration_seconds_bucket{le=\"%g\"} %" PRIu64 "\n",
                      metrics_restore_le[b], cum);
    }
    strbuf_printf(out,
                  "attnd_restore_duration_seconds_bucket{le=\"+Inf\"} %" PRIu64 "\n"
                  "attnd_restore_duration_seconds_sum %.6f\n"
                  "attnd_restore_duration_seconds_count %" PRIu64 "\n",
                  d->restores, d->restore_sum_s, d->restores);
}

void metrics_render(const struct metrics *m, const struct metrics_gauges *g, struct strbuf *out) {
    render_requests(m, out);
    render_latency(m, out);
    strbuf_printf(out,
                  "# HELP attnd_tokens_total Tokens computed, by phase (prefill: from an empty "
                  "cache; decode: appended to a non-empty one).\n"
                  "# TYPE attnd_tokens_total counter\n"
                  "attnd_tokens_total{phase=\"prefill\"} %" PRIu64 "\n"
                  "attnd_tokens_total{phase=\"decode\"} %" PRIu64 "\n",
                  m->tokens_prefill, m->tokens_decode);
    strbuf_printf(out,
                  "# HELP attnd_jobs_cancelled_total Jobs stopped before their end because their "
                  "client had gone.\n"
                  "# TYPE attnd_jobs_cancelled_total counter\n"
                  "attnd_jobs_cancelled_total %" PRIu64 "\n",
                  m->jobs_cancelled);
    static const char *const reasons[METRICS_EVICTION_COUNT] = {"budget", "max_sessions", "ttl"};
    strbuf_puts(out, "# HELP attnd_evictions_total Sessions evicted or expired, by reason.\n"
                     "# TYPE attnd_evictions_total counter\n");
    for (int r = 0; r < METRICS_EVICTION_COUNT; r++) {
        strbuf_printf(out, "attnd_evictions_total{reason=\"%s\"} %" PRIu64 "\n", reasons[r],
                      g->evictions[r]);
    }
    strbuf_printf(out,
                  "# HELP attnd_engine_steps_total Engine forward calls.\n"
                  "# TYPE attnd_engine_steps_total counter\n"
                  "attnd_engine_steps_total %" PRIu64 "\n"
                  "# HELP attnd_batched_steps_total Sequence steps carried by engine forward "
                  "calls (over attnd_engine_steps_total: the mean batch size).\n"
                  "# TYPE attnd_batched_steps_total counter\n"
                  "attnd_batched_steps_total %" PRIu64 "\n"
                  "# HELP attnd_inline_steps_total Engine forward calls run on the event loop "
                  "thread, small enough for --inline-macs on an idle server.\n"
                  "# TYPE attnd_inline_steps_total counter\n"
                  "attnd_inline_steps_total %" PRIu64 "\n",
                  g->engine_steps, g->batched_steps, g->inline_steps);
    strbuf_printf(out,
                  "# HELP attnd_sessions Live sessions.\n# TYPE attnd_sessions gauge\n"
                  "attnd_sessions %" PRId64 "\n"
                  "# HELP attnd_kv_bytes_used KV cache bytes in use.\n"
                  "# TYPE attnd_kv_bytes_used gauge\nattnd_kv_bytes_used %zu\n"
                  "# HELP attnd_kv_bytes_limit KV cache bytes usable.\n"
                  "# TYPE attnd_kv_bytes_limit gauge\nattnd_kv_bytes_limit %zu\n"
                  "# HELP attnd_queue_depth Accepted requests waiting to start.\n"
                  "# TYPE attnd_queue_depth gauge\nattnd_queue_depth %" PRId64 "\n"
                  "# HELP attnd_jobs_in_flight Engine jobs running on workers.\n"
                  "# TYPE attnd_jobs_in_flight gauge\nattnd_jobs_in_flight %" PRId64 "\n"
                  "# HELP attnd_workers Engine worker threads.\n"
                  "# TYPE attnd_workers gauge\nattnd_workers %" PRId64 "\n"
                  "# HELP attnd_threads Threads computing forwards at once, workers and helpers "
                  "(--threads).\n"
                  "# TYPE attnd_threads gauge\nattnd_threads %" PRId64 "\n"
                  "# HELP attnd_team_tasks_total Parallel tasks (projection slices, attention "
                  "tasks) of the forwards' executor calls offered to the helpers (not those made "
                  "while every core computed: they run on their worker).\n"
                  "# TYPE attnd_team_tasks_total counter\nattnd_team_tasks_total %" PRIu64 "\n"
                  "# HELP attnd_team_helped_tasks_total Of those, the tasks helper threads ran "
                  "(a core a worker left idle).\n"
                  "# TYPE attnd_team_helped_tasks_total counter\n"
                  "attnd_team_helped_tasks_total %" PRIu64 "\n"
                  "# HELP attnd_draining 1 once shutdown has begun.\n"
                  "# TYPE attnd_draining gauge\nattnd_draining %d\n",
                  g->sessions, g->kv_bytes_used, g->kv_bytes_limit, g->queue_depth,
                  g->jobs_in_flight, g->workers, g->threads, g->team_tasks, g->team_helped,
                  g->draining);
    strbuf_printf(out,
                  "# HELP attnd_connections Open connections (counted against "
                  "--max-connections).\n"
                  "# TYPE attnd_connections gauge\nattnd_connections %" PRId64 "\n"
                  "# HELP attnd_connections_refused_total Connections turned away at the limits "
                  "with 503 too_many_connections.\n"
                  "# TYPE attnd_connections_refused_total counter\n"
                  "attnd_connections_refused_total %" PRIu64 "\n"
                  "# HELP attnd_connections_reclaimed_total Idle connections closed to admit a "
                  "new one at the limits.\n"
                  "# TYPE attnd_connections_reclaimed_total counter\n"
                  "attnd_connections_reclaimed_total %" PRIu64 "\n"
                  "# HELP attnd_held_bytes Request bodies being received and answers being sent, "
                  "held in memory for their clients.\n"
                  "# TYPE attnd_held_bytes gauge\nattnd_held_bytes %" PRIu64 "\n"
                  "# HELP attnd_held_bytes_limit --max-held-mb in bytes (past it: 503 "
                  "server_busy).\n"
                  "# TYPE attnd_held_bytes_limit gauge\nattnd_held_bytes_limit %" PRIu64 "\n",
                  g->connections, g->connections_refused, g->connections_reclaimed, g->held_bytes,
                  g->held_bytes_limit);
    if (g->disk != NULL) {
        render_disk(g->disk, out);
    }
}
