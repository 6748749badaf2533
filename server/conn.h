/* server/conn.h: the open connections as the limits see them. The table counts them, in total
 * and per client address, and keeps them in two states: *waiting* (no request in progress: an
 * idle keep-alive connection, a fresh one, or one still sending its request headers) and *busy*
 * (a request's headers are in, until its answer is sent). Waiting connections are kept oldest
 * first, so that a new connection past a limit can reclaim the oldest one (as nginx reuses idle
 * keep-alive connections); those that have started sending headers are also kept in the order
 * they started, for the header deadline. A busy connection is never reclaimed.
 *
 * It knows nothing of sockets, MHD or libuv: http.c reports every change and acts on the
 * answers (closes a victim, refuses a socket). Thread rule: loop thread only.
 */
#ifndef SERVER_CONN_H
#define SERVER_CONN_H

#include <stdbool.h>
#include <stdint.h>

#define CONN_ADDR_BYTES 16 /* an IPv6 address; IPv4 as ::ffff:a.b.c.d */

struct conn_table; /* opaque */
struct conn_addr;  /* opaque: one client address's count and waiting list */

enum conn_state {
    CONN_STATE_WAITING = 0,
    CONN_STATE_BUSY = 1,
};

/* One connection's place in the table, embedded in the caller's connection struct between
 * conn_table_add and conn_table_remove. Every field belongs to conn.c. */
struct conn {
    struct conn_addr *addr;
    enum conn_state state;
    int64_t started_ms;                   /* when it started sending headers; -1 = not (or busy) */
    struct conn *prev, *next;             /* the waiting (oldest first) or the busy list */
    struct conn *addr_prev, *addr_next;   /* the address's waiting list, oldest first */
    struct conn *start_prev, *start_next; /* the started list, by started_ms */
};

struct conn_limits {
    int32_t max_total;  /* connections at most (>= 1) */
    int32_t max_per_ip; /* connections from one address at most; 0 = no limit */
};

/* Returns 0, or -1 when out of memory. */
int conn_table_create(const struct conn_limits *limits, struct conn_table **out);
/* Every connection must have been removed. NULL is a no-op. */
void conn_table_destroy(struct conn_table *t);

enum conn_admit {
    CONN_ADMIT_OK = 0,      /* there is room */
    CONN_ADMIT_RECLAIM = 1, /* room once *victim (a waiting connection) is removed and closed */
    CONN_ADMIT_REFUSE = 2,  /* the limit is reached and every connection it counts is busy */
};

/* Decides about a new connection from addr (CONN_ADDR_BYTES). At the per-address limit the
 * victim is that address's oldest waiting connection; otherwise, at the total limit, the oldest
 * waiting connection of all. Changes nothing: the caller removes the victim, then adds. */
enum conn_admit conn_table_admit(const struct conn_table *t, const uint8_t *addr,
                                 struct conn **victim);

/* Adds c (waiting, not started) from addr. Returns 0, or -1 when out of memory (c is then not
 * in the table). */
int conn_table_add(struct conn_table *t, struct conn *c, const uint8_t *addr);
void conn_table_remove(struct conn_table *t, struct conn *c);

/* A request's headers are in: c leaves the waiting lists. */
void conn_table_set_busy(struct conn_table *t, struct conn *c);
/* Its request is over: c waits again, as the youngest, not started. */
void conn_table_set_waiting(struct conn_table *t, struct conn *c);
/* The first bytes of a request arrived at now_ms: the header deadline runs from then. No-op
 * unless c is waiting and not started. */
void conn_table_set_started(struct conn_table *t, struct conn *c, int64_t now_ms);

/* The connection that started sending headers first, or NULL. */
struct conn *conn_table_oldest_started(const struct conn_table *t);

/* The first connection in state, and the next one after c in the same state (NULL at the end).
 * Waiting ones come oldest first. Remove nothing but the current one while walking. */
struct conn *conn_table_first(const struct conn_table *t, enum conn_state state);
struct conn *conn_next(const struct conn *c);

int32_t conn_table_count(const struct conn_table *t);
/* Connections counted for addr (0 if none). */
int32_t conn_table_addr_count(const struct conn_table *t, const uint8_t *addr);
bool conn_is_started(const struct conn *c);
/* When c started sending headers (uv_now milliseconds); -1 if it has not. */
int64_t conn_started_ms(const struct conn *c);

#endif /* SERVER_CONN_H */
