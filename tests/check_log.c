/* tests/check_log.c: server/log.c: the line put together without printf (struct log_line) has
 * the bytes printf would give (numbers, "%.2f" on every kind of value, quoted client bytes, the
 * cut at the line's room), and the written line has its prefix and escaping whichever way the
 * message was made. */
#include <check.h>
#include <float.h>
#include <limits.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../server/log.h"
#include "../server/utf8.h"

/* xorshift64*: the same draws on every run */
static uint64_t next_u64(uint64_t *state) {
    *state ^= *state >> 12;
    *state ^= *state << 25;
    *state ^= *state >> 27;
    return *state * 2685821657736338717ULL;
}

static double uniform(uint64_t *state) {
    return (double)(next_u64(state) >> 11) / 9007199254740992.0;
}

static void assert_fixed2(double v) {
    struct log_line line;
    char want[512];
    log_line_init(&line);
    log_line_fixed2(&line, v);
    snprintf(want, sizeof want, "%.2f", v);
    ck_assert_msg(strcmp(line.text, want) == 0, "%.17g: %s, printf %s", v, line.text, want);
    ck_assert_uint_eq(line.len, strlen(want));
}

START_TEST(test_log_line_fixed2_is_printf) {
    uint64_t state = 0x9E3779B97F4A7C15ULL;
    /* milliseconds on a thousandths grid: those ending in 5 lie next to a half cent, where
     * rounding v * 100 in floating point picked the other digit for 4% of the grid */
    for (int i = 0; i < 200000; i++) {
        assert_fixed2((double)(next_u64(&state) % 100000000) / 1000.0);
    }
    /* exact halves of a cent (eighths), ties to even both ways */
    for (int i = 0; i < 20000; i++) {
        assert_fixed2((double)i / 8.0);
    }
    for (int i = 0; i < 200000; i++) {
        assert_fixed2(uniform(&state) * pow(10.0, (double)(i % 20) - 6.0));
    }
    /* the edges of the integer path (v * 100 < 4e15) and past it, signs and non-finite values
     * (snprintf's) */
    const double edges[] = {
        0.0,          -0.0, 0.005, 0.015,  0.125,  0.375, 9.995,    4e13,      3.9999999999999e13,
        4e13 - 0.005, 1e15, 1e300, -0.001, -1.005, -2.5,  INFINITY, -INFINITY, NAN,
        DBL_MIN};
    for (size_t i = 0; i < sizeof edges / sizeof edges[0]; i++) {
        assert_fixed2(edges[i]);
    }
}
END_TEST

START_TEST(test_log_line_integers_are_printf) {
    uint64_t state = 42;
    char want[64];
    struct log_line line;
    for (int i = 0; i < 100000; i++) {
        long long v = (long long)next_u64(&state) >> (next_u64(&state) % 64);
        log_line_init(&line);
        log_line_puts(&line, "n=");
        log_line_int(&line, v);
        snprintf(want, sizeof want, "n=%lld", v);
        ck_assert_str_eq(line.text, want);
    }
    const long long edges[] = {0, -1, 1, LLONG_MIN, LLONG_MAX, -10, 10};
    for (size_t i = 0; i < sizeof edges / sizeof edges[0]; i++) {
        log_line_init(&line);
        log_line_int(&line, edges[i]);
        snprintf(want, sizeof want, "%lld", edges[i]);
        ck_assert_str_eq(line.text, want);
    }
}
END_TEST

/* log_quote's rule, a character at a time (log.h): '"' and '\\' after a backslash, controls, DEL
 * and bytes that are not UTF-8 as \\xNN, and a cut with "..." where the next character would
 * leave no room for "...", the quote and the NUL. */
static void quote_ref(char *out, size_t size, const char *value) {
    const unsigned char *p = (const unsigned char *)value;
    size_t n = strlen(value), o = 0;
    out[o++] = '"';
    for (size_t i = 0; i < n;) {
        size_t len = p[i] < 0x20 || p[i] == 0x7F ? 0 : utf8_seq_len(p + i, n - i);
        size_t need = len == 0 ? 4 : (p[i] == '"' || p[i] == '\\') ? 2 : len;
        if (o + need + 5 > size) {
            memcpy(out + o, "...", 3);
            o += 3;
            break;
        }
        if (len == 0) {
            o += (size_t)sprintf(out + o, "\\x%02x", p[i]);
            i++;
            continue;
        }
        if (len == 1 && (p[i] == '"' || p[i] == '\\')) {
            out[o++] = '\\';
        }
        memcpy(out + o, p + i, len);
        o += len;
        i += len;
    }
    out[o++] = '"';
    out[o] = '\0';
}

START_TEST(test_log_quote_by_its_rule) {
    uint64_t state = 7;
    static const char pieces[][8] = {"a",    "Z",        "\"",           "\\",   "\n",   "\x1b",
                                     "\x7f", "\xc3\xa9", "\xe2\x82\xac", "\xff", "\xc3", " ",
                                     "=",    "%"};
    for (int i = 0; i < 20000; i++) {
        char value[2048];
        size_t n = 0, count = next_u64(&state) % 600;
        for (size_t k = 0; k < count; k++) {
            const char *p = pieces[next_u64(&state) % (sizeof pieces / sizeof pieces[0])];
            memcpy(value + n, p, strlen(p));
            n += strlen(p);
        }
        value[n] = '\0';
        size_t size = 8 + next_u64(&state) % 1100;
        char want[1200];
        quote_ref(want, size, value);
        /* into exactly size bytes (a two-byte character before a cut wrote one past them) */
        char *exact = malloc(size);
        ck_assert_ptr_nonnull(exact);
        ck_assert_str_eq(log_quote(exact, size, value), want);
        ck_assert_uint_lt(strlen(want), size);
        free(exact);
        struct log_line line;
        log_line_init(&line);
        log_line_puts(&line, "k=");
        log_line_quoted(&line, value, size);
        ck_assert_str_eq(line.text + 2, want);
        ck_assert_uint_eq(line.len, 2 + strlen(want));
    }
}
END_TEST

START_TEST(test_log_line_cut_at_its_room) {
    struct log_line line;
    log_line_init(&line);
    char piece[1000];
    memset(piece, 'x', sizeof piece - 1);
    piece[sizeof piece - 1] = '\0';
    for (int i = 0; i < 6; i++) {
        log_line_puts(&line, piece);
        log_line_int(&line, 1234567);
        log_line_fixed2(&line, 12.5);
        log_line_quoted(&line, "quoted", 64);
        ck_assert_uint_le(line.len, LOG_LINE_MAX - 1);
        ck_assert_uint_eq(strlen(line.text), line.len);
    }
    ck_assert_uint_eq(line.len, LOG_LINE_MAX - 1);
}
END_TEST

/* What fn writes to stderr, NUL-terminated (malloc'd). */
static char *stderr_of(void (*fn)(void)) {
    FILE *f = tmpfile();
    ck_assert_ptr_nonnull(f);
    int saved = dup(STDERR_FILENO);
    ck_assert_int_ge(saved, 0);
    ck_assert_int_ge(dup2(fileno(f), STDERR_FILENO), 0);
    fn();
    ck_assert_int_ge(dup2(saved, STDERR_FILENO), 0);
    close(saved);
    long n = ftell(f);
    ck_assert_int_ge(n, 0);
    rewind(f);
    char *text = calloc(1, (size_t)n + 1);
    ck_assert_ptr_nonnull(text);
    ck_assert_uint_eq(fread(text, 1, (size_t)n, f), (size_t)n);
    fclose(f);
    return text;
}

static void write_both(void) {
    struct log_line line;
    log_line_init(&line);
    log_line_puts(&line, "request req=");
    log_line_int(&line, 17);
    log_line_puts(&line, " path=");
    log_line_quoted(&line, "/a\nb\x1b", 64);
    log_line_puts(&line, " raw=\n\xff ms=");
    log_line_fixed2(&line, 3.14159);
    log_line_write(LOG_LEVEL_INFO, "route", &line);
    log_write(LOG_LEVEL_INFO, "route", "request req=%d path=%s raw=\n\xff ms=%.2f", 17,
              "\"/a\\x0ab\\x1b\"", 3.14159);
    log_write(LOG_LEVEL_WARN, "a-module-name-past-seven", "%s", "x");
}

START_TEST(test_log_line_written_as_log_write_writes) {
    char *text = stderr_of(write_both);
    char *lines[3];
    char *p = text;
    for (int i = 0; i < 3; i++) {
        char *nl = strchr(p, '\n');
        ck_assert_ptr_nonnull(nl);
        *nl = '\0';
        lines[i] = p;
        p = nl + 1;
    }
    ck_assert_str_eq(p, "");
    for (int i = 0; i < 3; i++) {
        /* 2026-11-28T08:01:02.345Z: the prefix's shape, digits where digits go */
        const char *t = lines[i];
        ck_assert_msg(strlen(t) > 25, "%s", t);
        for (int k = 0; k < 24; k++) {
            const char *shape = "dddd-dd-ddTdd:dd:dd.dddZ";
            ck_assert_msg(shape[k] == 'd' ? (t[k] >= '0' && t[k] <= '9') : t[k] == shape[k], "%s",
                          t);
        }
    }
    /* the same message both ways, after the timestamp */
    ck_assert_str_eq(lines[0] + 24, lines[1] + 24);
    ck_assert_str_eq(lines[0] + 24,
                     " INFO  route   request req=17 path=\"/a\\x0ab\\x1b\" raw=\\x0a\\xff ms=3.14");
    ck_assert_str_eq(lines[2] + 24, " WARN  a-module-name-past-seven x");
    free(text);
}
END_TEST

/* Random messages of printable ASCII, controls, DEL, well-formed and broken UTF-8. */
static char g_message[4][600];

static void write_messages(void) {
    for (int i = 0; i < 4; i++) {
        log_write(LOG_LEVEL_INFO, "m", "%s", g_message[i]);
    }
}

/* What the line must hold: printable ASCII and well-formed UTF-8 as they are, every other byte as
 * \xNN (the rule log.h states), byte by byte. */
static void escaped(const char *msg, char *out) {
    const unsigned char *p = (const unsigned char *)msg;
    size_t n = strlen(msg), o = 0;
    for (size_t i = 0; i < n;) {
        size_t len = p[i] < 0x20 || p[i] == 0x7F ? 0 : utf8_seq_len(p + i, n - i);
        if (len == 0) {
            o += (size_t)sprintf(out + o, "\\x%02x", p[i]);
            i++;
        } else {
            memcpy(out + o, p + i, len);
            o += len;
            i += len;
        }
    }
    out[o] = '\0';
}

START_TEST(test_log_line_escapes_every_byte_it_must) {
    uint64_t state = 99;
    static const char pieces[][8] = {
        "abc",          "x",        "\t",   "\n",       "\x1f",
        "\x7f",         "\xc3\xa9", "\xc3", "\xe2\x82", "\xf0\x9f\x98\x80",
        "\xed\xa0\x80", "\xff",     " ~"};
    for (int round = 0; round < 200; round++) {
        for (int i = 0; i < 4; i++) {
            size_t n = 0, count = next_u64(&state) % 100;
            for (size_t k = 0; k < count; k++) {
                const char *p = pieces[next_u64(&state) % (sizeof pieces / sizeof pieces[0])];
                memcpy(g_message[i] + n, p, strlen(p));
                n += strlen(p);
            }
            g_message[i][n] = '\0';
        }
        char *text = stderr_of(write_messages);
        char *line = text;
        for (int i = 0; i < 4; i++) {
            char *nl = strchr(line, '\n');
            ck_assert_ptr_nonnull(nl);
            *nl = '\0';
            char want[4 * 600 + 32] = " INFO  m       ";
            escaped(g_message[i], want + strlen(want));
            ck_assert_str_eq(line + 24, want);
            line = nl + 1;
        }
        free(text);
    }
}
END_TEST

/* The suite constructor, registered in the generated suite table (see check_main.c). */
extern Suite *log_suite(void);

Suite *log_suite(void) {
    Suite *s = suite_create("log");
    TCase *tc = tcase_create("core");
    tcase_add_test(tc, test_log_line_fixed2_is_printf);
    tcase_add_test(tc, test_log_line_integers_are_printf);
    tcase_add_test(tc, test_log_quote_by_its_rule);
    tcase_add_test(tc, test_log_line_cut_at_its_room);
    tcase_add_test(tc, test_log_line_written_as_log_write_writes);
    tcase_add_test(tc, test_log_line_escapes_every_byte_it_must);
    suite_add_tcase(s, tc);
    return s;
}
