/* tests/check_team.c: the computing threads the workers share (server/team.c). Every task of a
 * call runs exactly once, with callers on several threads at once; a lone worker gets help; a
 * team whose cores are all taken by workers lends none (no oversubscription); one core means
 * no helper at all. */
#include <check.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "../server/team.h"

struct counts {
    int32_t n;
    int32_t *hits; /* atomic per index */
    int sleep_us;
};

static void count_task(void *arg, int32_t i) {
    struct counts *c = arg;
    if (c->sleep_us > 0) {
        struct timespec ts = {0, (long)c->sleep_us * 1000};
        nanosleep(&ts, NULL);
    }
    __atomic_add_fetch(&c->hits[i], 1, __ATOMIC_RELAXED);
}

struct caller {
    struct team *team;
    int32_t rounds;
    bool ok;
};

static void *call_many(void *arg) {
    struct caller *cl = arg;
    attn_executor ex = team_executor(cl->team);
    cl->ok = true;
    for (int32_t r = 0; r < cl->rounds; r++) {
        int32_t n = 1 + r % 97;
        int32_t hits[97] = {0};
        struct counts c = {n, hits, 0};
        team_enter(cl->team);
        ex.run(ex.ctx, count_task, &c, n);
        team_leave(cl->team);
        for (int32_t i = 0; i < n; i++) {
            cl->ok = cl->ok && hits[i] == 1;
        }
    }
    return NULL;
}

START_TEST(test_team_runs_every_task_once) {
    struct team *t = NULL;
    ck_assert_int_eq(team_create(3, &t), 0);
    pthread_t th[4];
    struct caller cl[4];
    for (int i = 0; i < 4; i++) {
        cl[i] = (struct caller){t, 400, false};
        ck_assert_int_eq(pthread_create(&th[i], NULL, call_many, &cl[i]), 0);
    }
    for (int i = 0; i < 4; i++) {
        pthread_join(th[i], NULL);
        ck_assert_msg(cl[i].ok, "caller %d: a task ran twice or never", i);
    }
    struct team_stats st;
    team_get_stats(t, &st);
    ck_assert_uint_gt(st.batches, 0);
    ck_assert_uint_le(st.helped_tasks, st.tasks);
    team_destroy(t);
}
END_TEST

/* Runs 16 tasks of 2 ms with `workers` computing threads declared; returns the tasks the
 * helpers ran. */
static uint64_t helped(int32_t cores, int32_t workers) {
    struct team *t = NULL;
    ck_assert_int_eq(team_create(cores, &t), 0);
    for (int32_t i = 0; i < workers; i++) {
        team_enter(t);
    }
    int32_t hits[16] = {0};
    struct counts c = {16, hits, 2000};
    attn_executor ex = team_executor(t);
    ex.run(ex.ctx, count_task, &c, 16);
    for (int32_t i = 0; i < 16; i++) {
        ck_assert_int_eq(hits[i], 1);
    }
    for (int32_t i = 0; i < workers; i++) {
        team_leave(t);
    }
    struct team_stats st;
    team_get_stats(t, &st);
    team_destroy(t);
    return st.helped_tasks;
}

START_TEST(test_team_helps_only_on_idle_cores) {
    /* a lone worker on two cores: the helper takes a fair share of 2 ms tasks */
    ck_assert_uint_ge(helped(2, 1), 4);
    /* both cores computing: the helper stays asleep */
    ck_assert_uint_eq(helped(2, 2), 0);
    /* one core: no helper exists, the caller runs everything */
    ck_assert_uint_eq(helped(1, 1), 0);
}
END_TEST

/* `extern` keeps this prototype out of the Makefile's suite-table scan, which matches lines
 * starting with `Suite *`. */
extern Suite *team_suite(void);

Suite *team_suite(void) {
    Suite *s = suite_create("team");
    TCase *tc = tcase_create("team");
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, test_team_runs_every_task_once);
    tcase_add_test(tc, test_team_helps_only_on_idle_cores);
    suite_add_tcase(s, tc);
    return s;
}
