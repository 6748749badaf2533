/* server/team.c: the shared helper threads (see team.h). A call of the executor publishes a
 * batch on the caller's stack and claims its tasks by an atomic counter, as do the helpers that
 * join; the caller returns once every claimed task finished and no helper holds the batch.
 * Helpers sleep on a condition variable until a batch has unclaimed tasks and a core is free
 * (threads computing < cores); they spin briefly first, since a forward calls the executor
 * several times in a row (projections, attention, output) and a sleep-wake costs tens of
 * microseconds, a fair part of a small model's decode. */
#include "team.h"

#include <pthread.h>
#include <stdbool.h>
#include <stdlib.h>
#include <time.h>

/* How long an idle helper polls for the next batch before it sleeps: longer than a small
 * model's projections (~0.05 ms on the calling thread), which come between a forward's executor
 * calls, or the helper would be asleep when the attention tasks come (50 us before: the small
 * preset's decode at L=2048 in attn_bench, whose pool spins the same, 0.13-0.20 -> 0.11-0.14
 * ms). The poll stops once every core computes, or when no forward is under way, so it never
 * takes a core that a worker or the loop thread could use. */
#define SPIN_NS 200000

struct batch {
    attn_task_fn fn;
    void *arg;
    int32_t n;
    int32_t next;               /* atomic: the next task to claim */
    int32_t done;               /* atomic: tasks finished */
    int32_t users;              /* helpers holding the batch (mutex; written atomically too, for
                                   the caller's poll) */
    struct batch *prev, *later; /* the list of batches with tasks left (mutex) */
};

struct team {
    pthread_mutex_t mu;
    pthread_cond_t wake;     /* helpers: a batch or a core may be there */
    pthread_cond_t finished; /* callers: a batch's last task or last helper is done */
    struct batch *head;      /* batches with unclaimed tasks, oldest first (mutex) */
    struct batch *tail;
    int32_t n_cores;
    int32_t n_computing; /* workers between enter and leave, plus helpers running tasks (mutex;
                            written atomically too, for the spinning helpers' reads) */
    int32_t n_in_jobs;   /* workers between enter and leave alone (the same) */
    uint32_t generation; /* atomic: bumped when a batch is published, for the spinning helpers */
    bool is_stopping;    /* mutex */
    pthread_t *helpers;
    int32_t n_helpers;
    uint64_t batches, tasks, helped_tasks; /* mutex */
};

static void unlink_batch(struct team *t, struct batch *b) {
    if (b->prev == NULL && t->head != b) {
        return; /* not listed (any more) */
    }
    if (b->prev != NULL) {
        b->prev->later = b->later;
    } else {
        t->head = b->later;
    }
    if (b->later != NULL) {
        b->later->prev = b->prev;
    } else {
        t->tail = b->prev;
    }
    b->prev = b->later = NULL;
}

/* Runs b's tasks until none is left to claim; returns how many this thread ran. */
static int32_t drain(struct team *t, struct batch *b) {
    int32_t ran = 0;
    for (;;) {
        int32_t i = __atomic_fetch_add(&b->next, 1, __ATOMIC_ACQ_REL);
        if (i >= b->n) {
            break;
        }
        b->fn(b->arg, i);
        ran++;
        if (__atomic_add_fetch(&b->done, 1, __ATOMIC_ACQ_REL) == b->n) {
            pthread_mutex_lock(&t->mu);
            pthread_cond_broadcast(&t->finished);
            pthread_mutex_unlock(&t->mu);
        }
    }
    return ran;
}

static bool may_help(const struct team *t) {
    return !t->is_stopping && t->head != NULL && t->n_computing < t->n_cores;
}

static int64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

static void cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#endif
}

static void *helper_main(void *arg) {
    struct team *t = arg;
    pthread_mutex_lock(&t->mu);
    for (;;) {
        if (!may_help(t) && !t->is_stopping && t->n_computing < t->n_cores && t->n_in_jobs > 0) {
            /* A core is idle and a forward is under way: poll it a while, without the lock, for
             * that forward's next batch. Between forwards the loop thread (answers, requests)
             * may want the core, so the helper sleeps at once then. */
            uint32_t gen = __atomic_load_n(&t->generation, __ATOMIC_ACQUIRE);
            pthread_mutex_unlock(&t->mu);
            int64_t until = now_ns() + SPIN_NS;
            while (__atomic_load_n(&t->generation, __ATOMIC_ACQUIRE) == gen && now_ns() < until &&
                   __atomic_load_n(&t->n_computing, __ATOMIC_RELAXED) < t->n_cores &&
                   __atomic_load_n(&t->n_in_jobs, __ATOMIC_RELAXED) > 0) {
                cpu_relax();
            }
            pthread_mutex_lock(&t->mu);
        }
        while (!may_help(t) && !t->is_stopping) {
            pthread_cond_wait(&t->wake, &t->mu);
        }
        if (t->is_stopping) {
            break;
        }
        struct batch *b = t->head;
        __atomic_add_fetch(&b->users, 1, __ATOMIC_RELAXED);
        __atomic_add_fetch(&t->n_computing, 1, __ATOMIC_RELAXED);
        pthread_mutex_unlock(&t->mu);
        int32_t ran = drain(t, b);
        pthread_mutex_lock(&t->mu);
        t->helped_tasks += (uint64_t)ran;
        __atomic_sub_fetch(&t->n_computing, 1, __ATOMIC_RELAXED);
        unlink_batch(t, b); /* nothing left to claim in it */
        if (__atomic_sub_fetch(&b->users, 1, __ATOMIC_RELEASE) == 0) {
            pthread_cond_broadcast(&t->finished);
        }
    }
    pthread_mutex_unlock(&t->mu);
    return NULL;
}

static void team_run(void *ctx, attn_task_fn fn, void *arg, int32_t n) {
    struct team *t = ctx;
    /* Every core busy (this worker among them): no helper could join, and publishing the batch
     * would only take the lock twice. A core that frees up meanwhile goes to the next job. */
    bool is_full = __atomic_load_n(&t->n_computing, __ATOMIC_RELAXED) >= t->n_cores;
    if (n <= 1 || t->n_helpers == 0 || is_full) {
        for (int32_t i = 0; i < n; i++) {
            fn(arg, i);
        }
        return;
    }
    struct batch b = {fn, arg, n, 0, 0, 0, NULL, NULL};
    pthread_mutex_lock(&t->mu);
    b.prev = t->tail;
    if (t->tail != NULL) {
        t->tail->later = &b;
    } else {
        t->head = &b;
    }
    t->tail = &b;
    t->batches++;
    t->tasks += (uint64_t)n;
    __atomic_add_fetch(&t->generation, 1, __ATOMIC_RELEASE);
    if (t->n_computing < t->n_cores) {
        pthread_cond_broadcast(&t->wake);
    }
    pthread_mutex_unlock(&t->mu);
    drain(t, &b);
    pthread_mutex_lock(&t->mu);
    unlink_batch(t, &b);
    if (t->n_in_jobs <= 1) {
        /* The batch's last tasks end within a task's time of each other: alone on the cores,
         * poll for them a while before sleeping, as a wake-up costs more than most tasks of a
         * decode step take. With other forwards under way the core is theirs instead. */
        pthread_mutex_unlock(&t->mu);
        int64_t until = now_ns() + SPIN_NS;
        while ((__atomic_load_n(&b.done, __ATOMIC_ACQUIRE) < n ||
                __atomic_load_n(&b.users, __ATOMIC_ACQUIRE) > 0) &&
               now_ns() < until) {
            cpu_relax();
        }
        pthread_mutex_lock(&t->mu);
    }
    while (__atomic_load_n(&b.done, __ATOMIC_ACQUIRE) < n || b.users > 0) {
        pthread_cond_wait(&t->finished, &t->mu);
    }
    pthread_mutex_unlock(&t->mu);
}

int team_create(int32_t n_cores, struct team **out) {
    struct team *t = calloc(1, sizeof *t);
    if (t == NULL) {
        return -1;
    }
    t->n_cores = n_cores < 1 ? 1 : n_cores;
    pthread_mutex_init(&t->mu, NULL);
    pthread_cond_init(&t->wake, NULL);
    pthread_cond_init(&t->finished, NULL);
    int32_t want = t->n_cores - 1;
    t->helpers = want > 0 ? calloc((size_t)want, sizeof *t->helpers) : NULL;
    if (want > 0 && t->helpers == NULL) {
        team_destroy(t);
        return -1;
    }
    for (int32_t i = 0; i < want; i++) {
        if (pthread_create(&t->helpers[i], NULL, helper_main, t) != 0) {
            team_destroy(t);
            return -1;
        }
        t->n_helpers++;
    }
    *out = t;
    return 0;
}

void team_destroy(struct team *t) {
    if (t == NULL) {
        return;
    }
    pthread_mutex_lock(&t->mu);
    t->is_stopping = true;
    pthread_cond_broadcast(&t->wake);
    pthread_mutex_unlock(&t->mu);
    for (int32_t i = 0; i < t->n_helpers; i++) {
        pthread_join(t->helpers[i], NULL);
    }
    free(t->helpers);
    pthread_cond_destroy(&t->finished);
    pthread_cond_destroy(&t->wake);
    pthread_mutex_destroy(&t->mu);
    free(t);
}

attn_executor team_executor(struct team *t) {
    return (attn_executor){team_run, t};
}

void team_enter(struct team *t) {
    pthread_mutex_lock(&t->mu);
    __atomic_add_fetch(&t->n_computing, 1, __ATOMIC_RELAXED);
    __atomic_add_fetch(&t->n_in_jobs, 1, __ATOMIC_RELAXED);
    pthread_mutex_unlock(&t->mu);
}

void team_leave(struct team *t) {
    pthread_mutex_lock(&t->mu);
    __atomic_sub_fetch(&t->n_computing, 1, __ATOMIC_RELAXED);
    __atomic_sub_fetch(&t->n_in_jobs, 1, __ATOMIC_RELAXED);
    if (may_help(t)) {
        pthread_cond_broadcast(&t->wake); /* a core came free for a batch still running */
    }
    pthread_mutex_unlock(&t->mu);
}

void team_get_stats(struct team *t, struct team_stats *out) {
    pthread_mutex_lock(&t->mu);
    out->batches = t->batches;
    out->tasks = t->tasks;
    out->helped_tasks = t->helped_tasks;
    pthread_mutex_unlock(&t->mu);
}
