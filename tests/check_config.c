/* tests/check_config.c: server/config.c: defaults, environment over defaults, flags over the
 * environment, both flag forms, derived thread counts, and one clear error per bad input. */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../server/config.h"

/* Parses argv (NULL-terminated) and envp with `cores` cores; returns the result. */
static enum config_result parse(struct config *cfg, const char *const *argv,
                                const char *const *envp, int32_t cores, char *err) {
    int argc = 0;
    while (argv[argc] != NULL) {
        argc++;
    }
    return config_parse(cfg, argc, (char *const *)argv, (char *const *)envp, cores, err, 256);
}

START_TEST(test_config_defaults) {
    struct config cfg;
    char err[256];
    const char *argv[] = {"attnd", NULL};
    ck_assert_int_eq(parse(&cfg, argv, NULL, 2, err), CONFIG_OK);
    ck_assert_str_eq(cfg.host, "127.0.0.1");
    ck_assert_int_eq(cfg.port, 8080);
    ck_assert_str_eq(cfg.model, "");
    ck_assert_str_eq(cfg.preset, "small");
    ck_assert_uint_eq(cfg.seed, 0);
    ck_assert_int_eq(cfg.layer_first, 0);
    ck_assert_int_eq(cfg.layer_count, 0);
    ck_assert_int_eq(cfg.kv_budget_mb, 1024);
    ck_assert_int_eq(cfg.max_body_mb, 64);
    ck_assert_str_eq(cfg.api_key, "");
    ck_assert_int_eq(cfg.log_level, LOG_LEVEL_INFO);
    /* workers and computing threads default to the cores, BLAS to one thread a call. */
    ck_assert_int_eq(cfg.workers, 2);
    ck_assert_int_eq(cfg.threads, 2);
    ck_assert_int_eq(cfg.blas_threads, 1);
}
END_TEST

START_TEST(test_config_derived_threads) {
    struct config cfg;
    char err[256];
    const char *one_worker[] = {"attnd", "--workers", "1", NULL};
    ck_assert_int_eq(parse(&cfg, one_worker, NULL, 8, err), CONFIG_OK);
    ck_assert_int_eq(cfg.workers, 1);
    ck_assert_int_eq(cfg.threads, 8); /* one worker, seven helpers */
    ck_assert_int_eq(cfg.blas_threads, 1);
    const char *four[] = {"attnd", "--workers=4", "--threads", "3", NULL};
    ck_assert_int_eq(parse(&cfg, four, NULL, 8, err), CONFIG_OK);
    ck_assert_int_eq(cfg.threads, 3);
    const char *explicit_blas[] = {"attnd", "--workers=4", "--blas-threads", "3", NULL};
    ck_assert_int_eq(parse(&cfg, explicit_blas, NULL, 8, err), CONFIG_OK);
    ck_assert_int_eq(cfg.blas_threads, 3);
    /* Each computing thread may be in a BLAS call with a work buffer per BLAS thread, and
     * OpenBLAS has BLAS_MAX_BUFFERS (48) that the start reserves: on 64 cores the defaults made
     * 64 and the start failed ('cannot reserve 64 OpenBLAS buffers (1..48)'). */
    const char *none[] = {"attnd", NULL};
    ck_assert_int_eq(parse(&cfg, none, NULL, 64, err), CONFIG_OK);
    ck_assert_int_eq(cfg.workers, 48);
    ck_assert_int_eq(cfg.threads, 48);
    const char *two_blas[] = {"attnd", "--blas-threads", "2", NULL};
    ck_assert_int_eq(parse(&cfg, two_blas, NULL, 64, err), CONFIG_OK);
    ck_assert_int_eq(cfg.workers, 24);
    ck_assert_int_eq(cfg.threads, 24);
}
END_TEST

START_TEST(test_config_env_then_flags) {
    struct config cfg;
    char err[256];
    const char *envp[] = {"PATH=/bin",
                          "ATTND_PORT=9000",
                          "ATTND_PRESET=tiny",
                          "ATTND_API_KEY=s3cret",
                          "ATTND_LAYERS=1-3",
                          "ATTND_SEED=18446744073709551615",
                          NULL};
    const char *argv[] = {"attnd", NULL};
    ck_assert_int_eq(parse(&cfg, argv, envp, 2, err), CONFIG_OK);
    ck_assert_int_eq(cfg.port, 9000);
    ck_assert_str_eq(cfg.preset, "tiny");
    ck_assert_str_eq(cfg.api_key, "s3cret");
    ck_assert_int_eq(cfg.layer_first, 1);
    ck_assert_int_eq(cfg.layer_count, 3);
    ck_assert_uint_eq(cfg.seed, 18446744073709551615ULL);
    /* A flag beats the environment, in both spellings. */
    const char *flags[] = {"attnd", "--port", "9100", "--preset=small", "--layers", "2", NULL};
    ck_assert_int_eq(parse(&cfg, flags, envp, 2, err), CONFIG_OK);
    ck_assert_int_eq(cfg.port, 9100);
    ck_assert_str_eq(cfg.preset, "small");
    ck_assert_int_eq(cfg.layer_first, 2);
    ck_assert_int_eq(cfg.layer_count, 1);
    ck_assert_str_eq(cfg.api_key, "s3cret");
    /* A bad variable refuses the start, unless a flag sets its option (then it is not read). */
    const char *bad_env[] = {"ATTND_PORT=80x", "ATTND_SEED=-1", NULL};
    const char *bare[] = {"attnd", "--seed", "7", NULL};
    ck_assert_int_eq(parse(&cfg, bare, bad_env, 2, err), CONFIG_ERROR);
    ck_assert_ptr_nonnull(strstr(err, "ATTND_PORT"));
    const char *both[] = {"attnd", "--seed", "7", "--port=9200", NULL};
    ck_assert_int_eq(parse(&cfg, both, bad_env, 2, err), CONFIG_OK);
    ck_assert_int_eq(cfg.port, 9200);
    ck_assert_uint_eq(cfg.seed, 7);
}
END_TEST

START_TEST(test_config_help) {
    struct config cfg;
    char err[256];
    const char *argv[] = {"attnd", "--port", "1", "--help", NULL};
    ck_assert_int_eq(parse(&cfg, argv, NULL, 2, err), CONFIG_HELP);
    /* --help lists every option with its variable and default. */
    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    config_help(f);
    fclose(f);
    const char *must[] = {"--host",          "ATTND_HOST",     "--port",         "ATTND_PORT",
                          "(default: 8080)", "--model",        "--preset",       "--seed",
                          "--layers",        "--kv-budget-mb", "--max-sessions", "--max-seq",
                          "--workers",       "--blas-threads", "--max-body-mb",  "--queue-depth",
                          "--session-ttl-s", "--api-key",      "ATTND_API_KEY",  "--log-level",
                          "ATTND_LOG_LEVEL"};
    for (size_t i = 0; i < sizeof must / sizeof must[0]; i++) {
        ck_assert_msg(strstr(text, must[i]) != NULL, "--help lacks %s", must[i]);
    }
    free(text);
}
END_TEST

/* Each bad input fails with a message naming where it came from. */
START_TEST(test_config_bad_values_are_named) {
    static const struct {
        const char *argv[4];
        const char *env;
        const char *expect; /* substring of the error */
    } cases[] = {
        {{"attnd", "--port", "http", NULL}, NULL, "--port: 'http' is not an integer"},
        {{"attnd", "--port", "70000", NULL}, NULL, "--port: 70000 is out of range [0, 65535]"},
        {{"attnd", "--workers", "-1", NULL}, NULL, "--workers: -1 is out of range"},
        {{"attnd", "--kv-budget-mb", "0", NULL}, NULL, "--kv-budget-mb: 0 is out of range"},
        {{"attnd", "--kv-block-tokens", "8", NULL}, NULL, "--kv-block-tokens: 8"},
        {{"attnd", "--weights-dtype", "fp8", NULL}, NULL, "--weights-dtype: 'fp8' is not a dtype"},
        {{"attnd", "--weights-dtype", "q8_0", NULL},
         NULL,
         "--weights-dtype: 'q8_0' is not a dtype"},
        {{"attnd", "--kv-dtype", "q4_0", NULL}, NULL, "--kv-dtype: 'q4_0' is not a dtype"},
        {{"attnd", "--layers", "3-1", NULL}, NULL, "--layers: '3-1' is not a layer range"},
        {{"attnd", "--log-level", "loud", NULL}, NULL, "--log-level: 'loud' is not a log level"},
        {{"attnd", "--preset", "gpt5", NULL}, NULL, "--preset: unknown preset 'gpt5'"},
        {{"attnd", "--seed", "-3", NULL}, NULL, "--seed: '-3' is not an unsigned"},
        {{"attnd", "--host", "", NULL}, NULL, "--host: must not be empty"},
        {{"attnd", "--bogus", "1", NULL}, NULL, "unknown option '--bogus'"},
        {{"attnd", "--port", NULL}, NULL, "--port: missing value"},
        {{"attnd", "stray", NULL}, NULL, "unexpected argument 'stray'"},
        {{"attnd", NULL}, "ATTND_QUEUE_DEPTH=many", "ATTND_QUEUE_DEPTH: 'many' is not an integer"},
        {{"attnd", NULL}, "ATTND_MAX_BODY_MB=0", "ATTND_MAX_BODY_MB: 0 is out of range"},
        /* checks made once every value is read name where the value came from too (they named
         * the flag the user never passed; found by an outside audit) */
        {{"attnd", NULL}, "ATTND_KV_DTYPE=zz", "ATTND_KV_DTYPE: 'zz' is not a dtype"},
        {{"attnd", NULL}, "ATTND_GEOMETRY=heads=4", "ATTND_GEOMETRY: kv_heads is required"},
        {{"attnd", "--kv-dtype", "zz", NULL}, "ATTND_KV_DTYPE=bf16", "--kv-dtype: 'zz'"},
        {{"attnd", "--modeling-code", "remote", NULL}, NULL, "--modeling-code: 'remote'"},
        {{"attnd", "--workers", " 2", NULL}, NULL, "--workers: ' 2' is not an integer"},
        {{"attnd", "--seed", " 2", NULL}, NULL, "--seed: ' 2' is not an unsigned"},
        /* --geometry: no count truncated, no key twice, no overflow (an outside audit's fuzzer:
         * window=2.5 served 2, scale=1e-50 the default scale, heads twice the last, and 65536 x
         * 65536 overflowed int) */
        {{"attnd", "--geometry", "heads=4,kv_heads=2,head_dim=16,layers=2,window=2.5", NULL},
         NULL,
         "window=2.5 is not a valid value"},
        {{"attnd", "--geometry", "heads=4,kv_heads=2,head_dim=16,layers=2,scale=1e-50", NULL},
         NULL,
         "scale=1e-50 is not a valid value"},
        {{"attnd", "--geometry", "heads=4,kv_heads=2,head_dim=16,layers=2,heads=8", NULL},
         NULL,
         "heads given twice"},
        {{"attnd", "--geometry", "heads=65536,kv_heads=1,head_dim=65536,layers=1", NULL},
         NULL,
         "heads x head_dim = 4294967296 is over"},
        /* a list cut after its comma was served as if whole (an operator audit) */
        {{"attnd", "--geometry", "heads=4,kv_heads=2,head_dim=16,layers=2,", NULL},
         NULL,
         "--geometry: ends with a comma"},
        /* more threads in BLAS calls at once than OpenBLAS has work buffers: refused by name
         * here, not by the start's 'cannot reserve 49 OpenBLAS buffers (1..48)' */
        {{"attnd", "--threads", "49", NULL},
         NULL,
         "--threads: 49 threads x --blas-threads 1 = 49 OpenBLAS work buffers, over its 48"},
        {{"attnd", "--blas-threads", "2", NULL},
         "ATTND_WORKERS=25",
         "ATTND_WORKERS: 25 threads x --blas-threads 2 = 50"},
        {{"attnd", "--blas-threads", "49", NULL},
         NULL,
         "--blas-threads: 49 is out of range [1, 48]"},
        /* a key no Authorization header can carry (surrounding whitespace is not part of the
         * header's value, control bytes cannot be sent) started and then answered every /v1
         * request 401; the key itself is not echoed */
        {{"attnd", "--api-key", "s3cret ", NULL}, NULL, "--api-key: a key that begins or ends"},
        {{"attnd", NULL}, "ATTND_API_KEY=\ts3cret", "ATTND_API_KEY: a key that begins or ends"},
        {{"attnd", "--api-key", "s3\ncret", NULL}, NULL, "holds a control byte never matches"},
        /* a geometry the engine refuses is named once, by where it came from (the line read
         * "ATTND_GEOMETRY: --geometry heads=...") */
        {{"attnd", NULL},
         "ATTND_GEOMETRY=heads=2,kv_heads=3,head_dim=4,layers=1",
         "ATTND_GEOMETRY: heads=2,kv_heads=3,head_dim=4,layers=1: not a valid attention geometry"},
        {{"attnd", "--geometry", "heads=2,kv_heads=3,head_dim=4,layers=1", NULL},
         NULL,
         "--geometry: heads=2,kv_heads=3,head_dim=4,layers=1: not a valid attention geometry"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        struct config cfg;
        char err[256];
        const char *envp[] = {cases[i].env, NULL};
        ck_assert_int_eq(parse(&cfg, cases[i].argv, envp, 2, err), CONFIG_ERROR);
        ck_assert_msg(strstr(err, cases[i].expect) != NULL, "case %zu: got '%s', want '%s'", i, err,
                      cases[i].expect);
    }
}
END_TEST

/* check_main.c is given every suite by a table generated from the definitions below, each line
 * starting with `Suite *`. */
extern Suite *config_suite(void);

Suite *config_suite(void) {
    Suite *s = suite_create("config");
    TCase *tc = tcase_create("parse");
    tcase_add_test(tc, test_config_defaults);
    tcase_add_test(tc, test_config_derived_threads);
    tcase_add_test(tc, test_config_env_then_flags);
    tcase_add_test(tc, test_config_help);
    tcase_add_test(tc, test_config_bad_values_are_named);
    suite_add_tcase(s, tc);
    return s;
}
