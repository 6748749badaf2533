/* tests/check_json.c: server/json.c, the strict pull reader, and server/utf8.c: numbers against
 * strtod (the fast path must round exactly as strtod does), the RFC 8259 grammar (every invalid
 * form refused, at the right byte), strings (escapes, surrogate pairs, UTF-8 per RFC 3629) and
 * spans compared by their full length.
 */
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../server/json.h"
#include "../server/utf8.h"

/* Reads text as one number; returns 0 and *out, or -1. */
static int number_of(const char *text, double *out) {
    struct json_reader r;
    json_reader_init(&r, text, strlen(text));
    if (json_read_number(&r, out) != 0) {
        return -1;
    }
    return json_reader_finish(&r);
}

START_TEST(test_json_numbers_round_like_strtod) {
    const char *fixed[] = {"0",
                           "-0",
                           "1",
                           "-1",
                           "0.1",
                           "0.30000000000000004",
                           "9007199254740993",
                           "9007199254740992",
                           "123456789012345678901234567890",
                           "1e22",
                           "1e23",
                           "1.7976931348623157e308",
                           "2.2250738585072014e-308",
                           "4.9e-324",
                           "0.000000000000000000000000000001",
                           "3.4028234663852886e38",
                           "-1.5E+3",
                           "1e-400",
                           "0.1234567890123456789012345",
                           "1.00000000000000011102230246251565404236316680908203125"};
    for (size_t i = 0; i < sizeof fixed / sizeof fixed[0]; i++) {
        double got, want = strtod(fixed[i], NULL);
        ck_assert_msg(number_of(fixed[i], &got) == 0, "%s refused", fixed[i]);
        ck_assert_msg(memcmp(&got, &want, sizeof got) == 0, "%s: %.17g, strtod %.17g", fixed[i],
                      got, want);
    }
    /* Random decimals of every length and exponent the fast path and the fallback share. */
    uint64_t s = 12345;
    char text[64];
    for (int i = 0; i < 200000; i++) {
        s = s * 6364136223846793005ULL + 1442695040888963407ULL;
        int digits = 1 + (int)(s >> 59) % 20, dot = (int)(s >> 40) % (digits + 1);
        int exp = (int)((s >> 20) % 61) - 30;
        uint64_t m = s >> 1;
        int n = 0;
        if (s & 1) {
            text[n++] = '-';
        }
        for (int d = 0; d < digits; d++) {
            if (d == dot && d > 0) {
                text[n++] = '.';
            }
            text[n++] = (char)('0' + (d == 0 ? 1 + m % 9 : m % 10));
            m /= 10;
        }
        n += snprintf(text + n, sizeof text - (size_t)n, "e%d", exp);
        double got, want = strtod(text, NULL);
        ck_assert_msg(number_of(text, &got) == 0, "%s refused", text);
        ck_assert_msg(memcmp(&got, &want, sizeof got) == 0, "%s: %.17g, strtod %.17g", text, got,
                      want);
    }
    double d;
    ck_assert_int_eq(number_of("1e400", &d), 0);
    ck_assert(isinf(d));
}
END_TEST

START_TEST(test_json_rejects_what_rfc8259_does) {
    const char *bad[] = {"01",   "1.",        ".5",      "+1",        "1e",  "1e+",
                         "-",    "0x1",       "1.e3",    "Inf",       "NaN", "- 1",
                         "[1,]", "[,1]",      "[1 2]",   "{\"a\"1}",  "{,}", "{\"a\":1,}",
                         "[",    "\"abc",     "\"\\x\"", "\"\\u12\"", "tru", "nul",
                         "[1]]", "{\"a\":1}}"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        struct json_reader r;
        json_reader_init(&r, bad[i], strlen(bad[i]));
        /* Walk whatever value it starts with, as generically as a caller would. */
        int rc = 0;
        double d;
        bool b;
        struct json_span sp;
        switch (json_peek(&r)) {
        case JSON_TYPE_NUMBER:
            rc = json_read_number(&r, &d);
            break;
        case JSON_TYPE_BOOL:
            rc = json_read_bool(&r, &b);
            break;
        case JSON_TYPE_NULL:
            rc = json_read_null(&r);
            break;
        case JSON_TYPE_STRING:
            rc = json_read_string(&r, &sp);
            break;
        case JSON_TYPE_ARRAY:
            rc = json_array_begin(&r);
            while (rc == 0 && (rc = json_array_next(&r)) == 1) {
                rc = json_read_number(&r, &d);
            }
            break;
        case JSON_TYPE_OBJECT:
            rc = json_object_begin(&r);
            while (rc == 0 && (rc = json_object_next(&r, &sp)) == 1) {
                rc = json_read_number(&r, &d);
            }
            break;
        default:
            rc = -1;
        }
        if (rc == 0) {
            rc = json_reader_finish(&r);
        }
        ck_assert_msg(rc != 0, "'%s' accepted", bad[i]);
        size_t at;
        ck_assert_msg(json_reader_error(&r, &at) != NULL && at <= strlen(bad[i]), "'%s'", bad[i]);
    }
}
END_TEST

/* Reads text as one string and decodes it; returns the decoded length, or -1. */
static long string_of(const char *text, size_t len, char *out) {
    struct json_reader r;
    json_reader_init(&r, text, len);
    struct json_span s;
    if (json_read_string(&r, &s) != 0 || json_reader_finish(&r) != 0) {
        return -1;
    }
    bool is_whole;
    size_t n = json_span_decode(&s, out, s.len, &is_whole);
    ck_assert(is_whole);
    return (long)n;
}

START_TEST(test_json_strings_escapes_and_utf8) {
    char out[64];
    ck_assert_int_eq(string_of("\"a\\\"b\\\\c\\/\\n\"", 13, out), 7);
    ck_assert_mem_eq(out, "a\"b\\c/\n", 7);
    /* \u0000 is a character like any other: the length counts it. */
    ck_assert_int_eq(string_of("\"ab\\u0000cd\"", 12, out), 5);
    ck_assert_mem_eq(out, "ab\0cd", 5);
    /* A surrogate pair is one 4-byte character; U+00E9 two bytes, raw or escaped. */
    ck_assert_int_eq(string_of("\"\\ud83d\\ude00\"", 14, out), 4);
    ck_assert_mem_eq(out, "\xF0\x9F\x98\x80", 4);
    ck_assert_int_eq(string_of("\"\xC3\xA9\\u00e9\"", 10, out), 4);
    ck_assert_mem_eq(out, "\xC3\xA9\xC3\xA9", 4);
    const char *bad[] = {"\"\\ud83d\"",          "\"\\ude00x\"", "\"\xC0\x80\"", "\"\xED\xA0\x80\"",
                         "\"\xF5\x80\x80\x80\"", "\"\xE2\x82\"", "\"\x80\"",     "\"a\nb\"",
                         "\"\\ud83d\\u0041\""};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        ck_assert_msg(string_of(bad[i], strlen(bad[i]), out) == -1, "case %zu accepted", i);
    }
}
END_TEST

START_TEST(test_json_spans_compare_by_full_length) {
    struct json_reader r;
    const char *text = "{\"x\\u0000\":1,\"x\":2,\"\\u0078\":3}";
    json_reader_init(&r, text, strlen(text));
    ck_assert_int_eq(json_object_begin(&r), 0);
    struct json_span k;
    double d;
    bool want[] = {false, true, true};
    for (int i = 0; i < 3; i++) {
        ck_assert_int_eq(json_object_next(&r, &k), 1);
        ck_assert_msg(json_span_equals(&k, "x") == want[i], "member %d", i);
        ck_assert_int_eq(json_read_number(&r, &d), 0);
    }
    ck_assert_int_eq(json_object_next(&r, &k), 0);
    ck_assert_int_eq(json_reader_finish(&r), 0);
}
END_TEST

START_TEST(test_json_utf8_helpers) {
    ck_assert_uint_eq(utf8_seq_len((const unsigned char *)"\xF4\x8F\xBF\xBF", 4), 4);
    ck_assert_uint_eq(utf8_seq_len((const unsigned char *)"\xF4\x90\x80\x80", 4), 0);
    ck_assert_uint_eq(utf8_seq_len((const unsigned char *)"\xE0\x9F\xBF", 3), 0);
    ck_assert_uint_eq(utf8_seq_len((const unsigned char *)"\xC2\xA0", 1), 0);
    char s[16] = "ab\xE2\x82";
    utf8_trim_partial(s);
    ck_assert_str_eq(s, "ab");
    strcpy(s, "ab\xE2\x82\xAC");
    utf8_trim_partial(s);
    ck_assert_str_eq(s, "ab\xE2\x82\xAC");
    strcpy(s, "ab\xC3");
    utf8_trim_partial(s);
    ck_assert_str_eq(s, "ab");
}
END_TEST

extern Suite *json_suite(void);

Suite *json_suite(void) {
    Suite *s = suite_create("json");
    TCase *tc = tcase_create("reader");
    tcase_add_test(tc, test_json_numbers_round_like_strtod);
    tcase_add_test(tc, test_json_rejects_what_rfc8259_does);
    tcase_add_test(tc, test_json_strings_escapes_and_utf8);
    tcase_add_test(tc, test_json_spans_compare_by_full_length);
    tcase_add_test(tc, test_json_utf8_helpers);
    suite_add_tcase(s, tc);
    return s;
}
