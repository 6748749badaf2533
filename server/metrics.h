/* server/metrics.h: counters, gauges and a latency histogram, rendered in the Prometheus text
 * format for GET /metrics (names and labels listed in proto/openapi.yaml). Plain counters, no
 * atomics: thread rule "loop thread only" (workers report through their after-work callbacks).
 */
#ifndef SERVER_METRICS_H
#define SERVER_METRICS_H

#include <stddef.h>
#include <stdint.h>

#include "strbuf.h"

enum metrics_endpoint {
    METRICS_ENDPOINT_ATTEND = 0,
    METRICS_ENDPOINT_SDPA,
    METRICS_ENDPOINT_SESSIONS,
    METRICS_ENDPOINT_SESSION,
    METRICS_ENDPOINT_TRUNCATE,
    METRICS_ENDPOINT_FORK,
    METRICS_ENDPOINT_EXPORT,
    METRICS_ENDPOINT_ATTENTION,
    METRICS_ENDPOINT_KV_ATTEND,
    METRICS_ENDPOINT_MODEL,
    METRICS_ENDPOINT_HEALTHZ,
    METRICS_ENDPOINT_READYZ,
    METRICS_ENDPOINT_METRICS,
    METRICS_ENDPOINT_OTHER, /* unknown routes */
    METRICS_ENDPOINT_COUNT,
};

enum metrics_eviction {
    METRICS_EVICTION_BUDGET = 0,   /* made room in the KV pool */
    METRICS_EVICTION_MAX_SESSIONS, /* made room under --max-sessions */
    METRICS_EVICTION_TTL,          /* idle past --session-ttl-s */
    METRICS_EVICTION_COUNT,
};

#define METRICS_N_STATUS  16 /* distinct HTTP statuses tracked per endpoint (+ "other") */
#define METRICS_N_BUCKETS 14

/* Loop thread only. Zero-initialize (metrics_init). */
struct metrics {
    uint64_t requests[METRICS_ENDPOINT_COUNT][METRICS_N_STATUS];
    uint64_t latency_buckets[METRICS_ENDPOINT_COUNT][METRICS_N_BUCKETS]; /* cumulative at render */
    double latency_sum_s[METRICS_ENDPOINT_COUNT];
    uint64_t latency_count[METRICS_ENDPOINT_COUNT];
    uint64_t tokens_prefill;
    uint64_t tokens_decode;
    uint64_t jobs_cancelled; /* engine jobs stopped early because their client had gone */
};

#define METRICS_N_RESTORE_BUCKETS 12

/* The disk tier's counters (spill.h), sampled at render time. */
struct metrics_disk {
    uint64_t spills;           /* sessions written to disk for memory */
    uint64_t spill_failures;   /* writes that failed (the session was dropped) */
    uint64_t restores;         /* sessions read back */
    uint64_t restore_failures; /* reads refused: unreadable, corrupt or another model */
    uint64_t corrupt;          /* of which the file failed its checksum or framing */
    uint64_t disk_drops;       /* sessions dropped from disk (its budget, ttl) */
    int64_t sessions_on_disk;
    size_t bytes_on_disk;
    size_t bytes_limit;
    size_t pending_bytes; /* written files' bytes queued for the I/O thread */
    uint64_t restore_buckets[METRICS_N_RESTORE_BUCKETS]; /* per bucket, not cumulative */
    double restore_sum_s;
};

/* The upper bounds (seconds) of the restore latency buckets. */
extern const double metrics_restore_le[METRICS_N_RESTORE_BUCKETS];

/* Values sampled at render time by the caller (gauges, and counters kept by other modules). */
struct metrics_gauges {
    uint64_t evictions[METRICS_EVICTION_COUNT];
    uint64_t engine_steps;  /* attn_forward calls */
    uint64_t batched_steps; /* sequence steps those calls carried */
    uint64_t inline_steps;  /* of engine_steps, those run on the loop thread (--inline-macs) */
    int64_t sessions;
    size_t kv_bytes_used;
    size_t kv_bytes_limit;
    int64_t queue_depth;
    int64_t jobs_in_flight;
    int64_t workers;
    int64_t threads;                 /* --threads: computing threads, workers and helpers */
    uint64_t team_tasks;             /* tasks of the executor calls the team shared */
    uint64_t team_helped;            /* of which its helpers ran */
    int64_t connections;             /* open, as counted against --max-connections */
    uint64_t connections_refused;    /* turned away with 503 too_many_connections */
    uint64_t connections_reclaimed;  /* idle ones closed to admit a new one */
    uint64_t held_bytes;             /* request bodies and answers held for clients */
    uint64_t held_bytes_limit;       /* --max-held-mb */
    int draining;                    /* 0 or 1 */
    const struct metrics_disk *disk; /* NULL: no disk tier */
};

void metrics_init(struct metrics *m);

/* The endpoint's label value, e.g. "attend". */
const char *metrics_endpoint_name(enum metrics_endpoint e);

/* Counts one answered request: its endpoint, HTTP status and latency in seconds. */
void metrics_request_done(struct metrics *m, enum metrics_endpoint e, int http_status,
                          double seconds);

/* Appends the exposition text to out. */
void metrics_render(const struct metrics *m, const struct metrics_gauges *g, struct strbuf *out);

#endif /* SERVER_METRICS_H */
