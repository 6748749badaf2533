/* tests/check_pool.c: server/pool.c when its own allocations fail. The check binary is linked
 * with --wrap=realloc (Makefile), so every realloc of the code under test comes here first and a
 * test can make the next ones fail. */
#include <check.h>
#include <stdlib.h>

#include "../engine/attn.h"
#include "../server/pool.h"

/* Reallocs still to fail; set only while the loop thread is the one running pool code (and by
 * tests/check_load.c, around a model load). */
int reallocs_to_fail;

void *__real_realloc(void *p, size_t n);
void *__wrap_realloc(void *p, size_t n);

void *__wrap_realloc(void *p, size_t n) {
    if (reallocs_to_fail > 0) {
        reallocs_to_fail--;
        return NULL;
    }
    return __real_realloc(p, n);
}

/* A CONTROL job: done entirely on the loop thread, its status recorded. */
struct control_job {
    struct pool_job pj;
    int n_done;
    int status;
};

static int control_prepare(struct pool_job *job, struct pool_step *step) {
    (void)job;
    (void)step;
    return 0;
}

static enum pool_after control_done(struct pool_job *job, int status) {
    struct control_job *c = (struct control_job *)job;
    c->n_done++;
    c->status = status;
    return POOL_AFTER_FINISHED;
}

static const struct pool_job_ops control_ops = {control_prepare, NULL, control_done, NULL};

static void run_loop(uv_loop_t *loop) {
    for (int i = 0; i < 100; i++) {
        uv_run(loop, UV_RUN_NOWAIT);
    }
}

/* A job is refused at submit or answered, never left queued: when the scratch dispatch sizes
 * for the queue could not be allocated, dispatch gave up and nothing kicked it again, so a lone
 * request waited until another one came (forever on a quiet server). */
START_TEST(test_pool_failed_allocation_strands_no_job) {
    attn_config cfg;
    attn_model *model = NULL;
    ck_assert_int_eq(attn_config_preset("tiny", &cfg), ATTN_OK);
    ck_assert_int_eq(attn_model_create_random(&cfg, 7, NULL, &model), ATTN_OK);
    uv_loop_t loop;
    ck_assert_int_eq(uv_loop_init(&loop), 0);
    struct pool_params p = {
        .loop = &loop, .model = model, .n_workers = 1, .max_batch_tokens = 16, .queue_depth = 4};
    struct pool *pool = NULL;
    ck_assert_int_eq(pool_create(&p, &pool), 0);

    struct control_job a = {.pj = {.kind = POOL_JOB_CONTROL, .ops = &control_ops}};
    reallocs_to_fail = 1; /* the first realloc of the pool's scratch, at submit or at dispatch */
    int rc = pool_submit(pool, &a.pj);
    uv_run(&loop, UV_RUN_NOWAIT);
    reallocs_to_fail = 0;
    run_loop(&loop);
    ck_assert_msg(rc != 0 || a.n_done == 1, "submitted (rc 0) but never run: done called %d times",
                  a.n_done);
    ck_assert_int_eq(a.n_done, rc != 0 ? 0 : 1);

    /* and the pool goes on serving */
    struct control_job b = {.pj = {.kind = POOL_JOB_CONTROL, .ops = &control_ops}};
    ck_assert_int_eq(pool_submit(pool, &b.pj), 0);
    run_loop(&loop);
    ck_assert_int_eq(b.n_done, 1);
    ck_assert_int_eq(b.status, 0);
    ck_assert(pool_is_idle(pool));

    pool_destroy(pool);
    run_loop(&loop);
    ck_assert_int_eq(uv_loop_close(&loop), 0);
    attn_model_destroy(model);
}
END_TEST

extern Suite *pool_suite(void);

Suite *pool_suite(void) {
    Suite *s = suite_create("pool");
    TCase *tc = tcase_create("failures");
    tcase_add_test(tc, test_pool_failed_allocation_strands_no_job);
    suite_add_tcase(s, tc);
    return s;
}
