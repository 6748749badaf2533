/* server/conn.c: the connection table (see conn.h): counts per address in a small chained hash
 * table, and intrusive doubly linked lists, so that every operation is O(1) but the address
 * lookup.
 */
#include "conn.h"

#include <stdlib.h>
#include <string.h>

struct conn_addr {
    uint8_t key[CONN_ADDR_BYTES];
    int32_t n;                          /* connections from this address, waiting or busy */
    struct conn *wait_head, *wait_tail; /* its waiting connections, oldest first */
    struct conn_addr *next;             /* in the hash bucket */
};

/* A list through one pair of links of struct conn: which pair is chosen by the functions. */
struct list {
    struct conn *head, *tail;
};

struct conn_table {
    struct conn_limits limits;
    int32_t n;
    struct list waiting; /* through prev/next, oldest first */
    struct list busy;    /* through prev/next */
    struct list started; /* through start_prev/start_next, by started_ms */
    struct conn_addr **buckets;
    uint32_t n_buckets; /* a power of two */
};

/* ---- helpers -------------------------------------------------------------------------------- */

static void push_main(struct list *l, struct conn *c) {
    c->prev = l->tail;
    c->next = NULL;
    if (l->tail != NULL) {
        l->tail->next = c;
    } else {
        l->head = c;
    }
    l->tail = c;
}

static void unlink_main(struct list *l, struct conn *c) {
    if (c->prev != NULL) {
        c->prev->next = c->next;
    } else {
        l->head = c->next;
    }
    if (c->next != NULL) {
        c->next->prev = c->prev;
    } else {
        l->tail = c->prev;
    }
    c->prev = c->next = NULL;
}

static void push_addr(struct conn_addr *a, struct conn *c) {
    c->addr_prev = a->wait_tail;
    c->addr_next = NULL;
    if (a->wait_tail != NULL) {
        a->wait_tail->addr_next = c;
    } else {
        a->wait_head = c;
    }
    a->wait_tail = c;
}

static void unlink_addr(struct conn_addr *a, struct conn *c) {
    if (c->addr_prev != NULL) {
        c->addr_prev->addr_next = c->addr_next;
    } else {
        a->wait_head = c->addr_next;
    }
    if (c->addr_next != NULL) {
        c->addr_next->addr_prev = c->addr_prev;
    } else {
        a->wait_tail = c->addr_prev;
    }
    c->addr_prev = c->addr_next = NULL;
}

static void push_started(struct list *l, struct conn *c) {
    c->start_prev = l->tail;
    c->start_next = NULL;
    if (l->tail != NULL) {
        l->tail->start_next = c;
    } else {
        l->head = c;
    }
    l->tail = c;
}

static void unlink_started(struct list *l, struct conn *c) {
    if (c->start_prev != NULL) {
        c->start_prev->start_next = c->start_next;
    } else {
        l->head = c->start_next;
    }
    if (c->start_next != NULL) {
        c->start_next->start_prev = c->start_prev;
    } else {
        l->tail = c->start_prev;
    }
    c->start_prev = c->start_next = NULL;
}

/* FNV-1a over the address bytes. */
static uint32_t hash(const uint8_t *key) {
    uint32_t h = 2166136261u;
    for (int i = 0; i < CONN_ADDR_BYTES; i++) {
        h = (h ^ key[i]) * 16777619u;
    }
    return h;
}

static struct conn_addr **slot(const struct conn_table *t, const uint8_t *key) {
    struct conn_addr **p = &t->buckets[hash(key) & (t->n_buckets - 1)];
    while (*p != NULL && memcmp((*p)->key, key, CONN_ADDR_BYTES) != 0) {
        p = &(*p)->next;
    }
    return p;
}

/* Takes c out of the waiting lists (the caller then puts it elsewhere or drops it). */
static void leave_waiting(struct conn_table *t, struct conn *c) {
    unlink_main(&t->waiting, c);
    unlink_addr(c->addr, c);
    if (c->started_ms >= 0) {
        unlink_started(&t->started, c);
        c->started_ms = -1;
    }
}

/* ---- the table ------------------------------------------------------------------------------ */

int conn_table_create(const struct conn_limits *limits, struct conn_table **out) {
    struct conn_table *t = calloc(1, sizeof *t);
    if (t == NULL) {
        return -1;
    }
    t->limits = *limits;
    /* About one bucket per connection, up to 64k: chains stay short without a resize. */
    t->n_buckets = 16;
    while (t->n_buckets < (uint32_t)limits->max_total && t->n_buckets < 65536) {
        t->n_buckets *= 2;
    }
    t->buckets = calloc(t->n_buckets, sizeof *t->buckets);
    if (t->buckets == NULL) {
        free(t);
        return -1;
    }
    *out = t;
    return 0;
}

void conn_table_destroy(struct conn_table *t) {
    if (t == NULL) {
        return;
    }
    for (uint32_t i = 0; i < t->n_buckets; i++) {
        while (t->buckets[i] != NULL) {
            struct conn_addr *a = t->buckets[i];
            t->buckets[i] = a->next;
            free(a);
        }
    }
    free(t->buckets);
    free(t);
}

enum conn_admit conn_table_admit(const struct conn_table *t, const uint8_t *addr,
                                 struct conn **victim) {
    *victim = NULL;
    if (t->limits.max_per_ip > 0) {
        const struct conn_addr *a = *slot(t, addr);
        if (a != NULL && a->n >= t->limits.max_per_ip) {
            *victim = a->wait_head;
            return *victim != NULL ? CONN_ADMIT_RECLAIM : CONN_ADMIT_REFUSE;
        }
    }
    if (t->n >= t->limits.max_total) {
        *victim = t->waiting.head;
        return *victim != NULL ? CONN_ADMIT_RECLAIM : CONN_ADMIT_REFUSE;
    }
    return CONN_ADMIT_OK;
}

int conn_table_add(struct conn_table *t, struct conn *c, const uint8_t *addr) {
    struct conn_addr **p = slot(t, addr);
    if (*p == NULL) {
        *p = calloc(1, sizeof **p);
        if (*p == NULL) {
            return -1;
        }
        memcpy((*p)->key, addr, CONN_ADDR_BYTES);
    }
    memset(c, 0, sizeof *c);
    c->addr = *p;
    c->state = CONN_STATE_WAITING;
    c->started_ms = -1;
    c->addr->n++;
    t->n++;
    push_main(&t->waiting, c);
    push_addr(c->addr, c);
    return 0;
}

void conn_table_remove(struct conn_table *t, struct conn *c) {
    if (c->state == CONN_STATE_WAITING) {
        leave_waiting(t, c);
    } else {
        unlink_main(&t->busy, c);
    }
    t->n--;
    if (--c->addr->n == 0) {
        struct conn_addr **p = slot(t, c->addr->key);
        *p = c->addr->next;
        free(c->addr);
    }
    c->addr = NULL;
}

void conn_table_set_busy(struct conn_table *t, struct conn *c) {
    if (c->state == CONN_STATE_BUSY) {
        return;
    }
    leave_waiting(t, c);
    c->state = CONN_STATE_BUSY;
    push_main(&t->busy, c);
}

void conn_table_set_waiting(struct conn_table *t, struct conn *c) {
    if (c->state == CONN_STATE_WAITING) {
        return;
    }
    unlink_main(&t->busy, c);
    c->state = CONN_STATE_WAITING;
    c->started_ms = -1;
    push_main(&t->waiting, c);
    push_addr(c->addr, c);
}

void conn_table_set_started(struct conn_table *t, struct conn *c, int64_t now_ms) {
    if (c->state != CONN_STATE_WAITING || c->started_ms >= 0) {
        return;
    }
    /* The loop's clock never goes back, so appending keeps the list in start order. */
    c->started_ms = now_ms;
    push_started(&t->started, c);
}

struct conn *conn_table_oldest_started(const struct conn_table *t) {
    return t->started.head;
}

struct conn *conn_table_first(const struct conn_table *t, enum conn_state state) {
    return state == CONN_STATE_WAITING ? t->waiting.head : t->busy.head;
}

struct conn *conn_next(const struct conn *c) {
    return c->next;
}

int32_t conn_table_count(const struct conn_table *t) {
    return t->n;
}

int32_t conn_table_addr_count(const struct conn_table *t, const uint8_t *addr) {
    const struct conn_addr *a = *slot(t, addr);
    return a != NULL ? a->n : 0;
}

bool conn_is_started(const struct conn *c) {
    return c->started_ms >= 0;
}

int64_t conn_started_ms(const struct conn *c) {
    return c->started_ms;
}
