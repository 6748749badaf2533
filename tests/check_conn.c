/* tests/check_conn.c: the connection table (server/conn.c) on its own: counts in total and per
 * address, which connection a new one reclaims (the oldest waiting one, of its own address at
 * the per-address limit), refusal when every counted connection is busy, and the order of
 * started requests for the header deadline.
 */
#include <check.h>
#include <stdlib.h>
#include <string.h>

#include "../server/conn.h"

static void addr_of(uint8_t *key, uint8_t last) {
    memset(key, 0, CONN_ADDR_BYTES);
    key[10] = key[11] = 0xff;
    key[15] = last;
}

static struct conn_table *table(int32_t max_total, int32_t max_per_ip) {
    struct conn_limits l = {max_total, max_per_ip};
    struct conn_table *t;
    ck_assert_int_eq(conn_table_create(&l, &t), 0);
    return t;
}

START_TEST(test_conn_total_limit_reclaims_oldest_waiting) {
    struct conn_table *t = table(3, 0);
    struct conn c[3];
    uint8_t a[CONN_ADDR_BYTES];
    struct conn *victim;
    for (int i = 0; i < 3; i++) {
        addr_of(a, (uint8_t)i);
        ck_assert_int_eq(conn_table_admit(t, a, &victim), CONN_ADMIT_OK);
        ck_assert_int_eq(conn_table_add(t, &c[i], a), 0);
    }
    ck_assert_int_eq(conn_table_count(t), 3);
    addr_of(a, 9);
    ck_assert_int_eq(conn_table_admit(t, a, &victim), CONN_ADMIT_RECLAIM);
    ck_assert_ptr_eq(victim, &c[0]);
    /* A connection busy with a request is never the victim; one that waits again is the
     * youngest. */
    conn_table_set_busy(t, &c[0]);
    ck_assert_int_eq(conn_table_admit(t, a, &victim), CONN_ADMIT_RECLAIM);
    ck_assert_ptr_eq(victim, &c[1]);
    conn_table_set_waiting(t, &c[0]);
    conn_table_set_busy(t, &c[1]);
    ck_assert_int_eq(conn_table_admit(t, a, &victim), CONN_ADMIT_RECLAIM);
    ck_assert_ptr_eq(victim, &c[2]);
    conn_table_set_busy(t, &c[2]);
    conn_table_set_busy(t, &c[0]);
    ck_assert_int_eq(conn_table_admit(t, a, &victim), CONN_ADMIT_REFUSE);
    ck_assert_ptr_null(victim);
    conn_table_remove(t, &c[1]);
    ck_assert_int_eq(conn_table_admit(t, a, &victim), CONN_ADMIT_OK);
    conn_table_remove(t, &c[0]);
    conn_table_remove(t, &c[2]);
    ck_assert_int_eq(conn_table_count(t), 0);
    conn_table_destroy(t);
}
END_TEST

START_TEST(test_conn_per_address_limit_reclaims_its_own) {
    struct conn_table *t = table(100, 2);
    uint8_t a[CONN_ADDR_BYTES], b[CONN_ADDR_BYTES];
    addr_of(a, 1);
    addr_of(b, 2);
    struct conn ca[2], cb;
    struct conn *victim;
    ck_assert_int_eq(conn_table_add(t, &cb, b), 0); /* older, other address */
    ck_assert_int_eq(conn_table_add(t, &ca[0], a), 0);
    ck_assert_int_eq(conn_table_add(t, &ca[1], a), 0);
    ck_assert_int_eq(conn_table_addr_count(t, a), 2);
    ck_assert_int_eq(conn_table_admit(t, a, &victim), CONN_ADMIT_RECLAIM);
    ck_assert_ptr_eq(victim, &ca[0]);
    conn_table_set_busy(t, &ca[0]);
    conn_table_set_busy(t, &ca[1]);
    /* Busy at its limit: refused, though other addresses have idle connections. */
    ck_assert_int_eq(conn_table_admit(t, a, &victim), CONN_ADMIT_REFUSE);
    ck_assert_int_eq(conn_table_admit(t, b, &victim), CONN_ADMIT_OK);
    conn_table_remove(t, &ca[0]);
    conn_table_remove(t, &ca[1]);
    conn_table_remove(t, &cb);
    ck_assert_int_eq(conn_table_addr_count(t, a), 0);
    conn_table_destroy(t);
}
END_TEST

START_TEST(test_conn_started_in_start_order) {
    struct conn_table *t = table(10, 0);
    uint8_t a[CONN_ADDR_BYTES];
    addr_of(a, 1);
    struct conn c[3];
    for (int i = 0; i < 3; i++) {
        ck_assert_int_eq(conn_table_add(t, &c[i], a), 0);
    }
    ck_assert_ptr_null(conn_table_oldest_started(t));
    conn_table_set_started(t, &c[2], 100);
    conn_table_set_started(t, &c[0], 200);
    conn_table_set_started(t, &c[2], 300); /* already started: keeps 100 */
    ck_assert_ptr_eq(conn_table_oldest_started(t), &c[2]);
    ck_assert_int_eq(conn_started_ms(&c[2]), 100);
    ck_assert(!conn_is_started(&c[1]));
    /* Headers complete: no longer under the deadline; waiting again: not started. */
    conn_table_set_busy(t, &c[2]);
    ck_assert_ptr_eq(conn_table_oldest_started(t), &c[0]);
    conn_table_set_started(t, &c[2], 400); /* busy: no-op */
    conn_table_set_waiting(t, &c[2]);
    ck_assert(!conn_is_started(&c[2]));
    conn_table_remove(t, &c[0]);
    ck_assert_ptr_null(conn_table_oldest_started(t));
    /* Walking: waiting ones oldest first. */
    ck_assert_ptr_eq(conn_table_first(t, CONN_STATE_WAITING), &c[1]);
    ck_assert_ptr_eq(conn_next(&c[1]), &c[2]);
    ck_assert_ptr_null(conn_table_first(t, CONN_STATE_BUSY));
    conn_table_remove(t, &c[1]);
    conn_table_remove(t, &c[2]);
    conn_table_destroy(t);
}
END_TEST

START_TEST(test_conn_many_addresses) {
    enum { N = 5000 };
    struct conn_table *t = table(N, 1);
    struct conn *c = calloc(N, sizeof *c);
    uint8_t a[CONN_ADDR_BYTES];
    struct conn *victim;
    for (int i = 0; i < N; i++) {
        memset(a, 0, sizeof a);
        memcpy(a, &i, sizeof i);
        ck_assert_int_eq(conn_table_admit(t, a, &victim), CONN_ADMIT_OK);
        ck_assert_int_eq(conn_table_add(t, &c[i], a), 0);
    }
    for (int i = 0; i < N; i++) {
        memset(a, 0, sizeof a);
        memcpy(a, &i, sizeof i);
        ck_assert_int_eq(conn_table_addr_count(t, a), 1);
        ck_assert_int_eq(conn_table_admit(t, a, &victim), CONN_ADMIT_RECLAIM);
        ck_assert_ptr_eq(victim, &c[i]);
    }
    for (int i = 0; i < N; i++) {
        conn_table_remove(t, &c[i]);
    }
    ck_assert_int_eq(conn_table_count(t), 0);
    free(c);
    conn_table_destroy(t);
}
END_TEST

/* check_main.c is given every suite by a table generated from the definitions below, each line
 * starting with `Suite *`. */
extern Suite *conn_suite(void);

Suite *conn_suite(void) {
    Suite *s = suite_create("conn");
    TCase *tc = tcase_create("table");
    tcase_add_test(tc, test_conn_total_limit_reclaims_oldest_waiting);
    tcase_add_test(tc, test_conn_per_address_limit_reclaims_its_own);
    tcase_add_test(tc, test_conn_started_in_start_order);
    tcase_add_test(tc, test_conn_many_addresses);
    suite_add_tcase(s, tc);
    return s;
}
