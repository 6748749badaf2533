/* server/log.c: the log sink (stderr) and level. The level is the one mutable global the style
 * allows: it is written once by main() before any thread starts and only read afterwards. */
#include "log.h"

#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "strbuf.h"
#include "utf8.h"

static enum log_level g_level = LOG_LEVEL_INFO;

static const char *const level_names[] = {"error", "warn", "info", "debug"};
static const char *const level_tags[] = {"ERROR", "WARN ", "INFO ", "DEBUG"};

void log_set_level(enum log_level level) {
    g_level = level;
}

bool log_enabled(enum log_level level) {
    return level <= g_level;
}

int log_level_parse(const char *name, enum log_level *out) {
    for (int i = 0; i < 4; i++) {
        if (strcmp(name, level_names[i]) == 0) {
            *out = (enum log_level)i;
            return 0;
        }
    }
    return -1;
}

const char *log_level_name(enum log_level level) {
    return (unsigned)level < 4 ? level_names[level] : "?";
}

/* The length of the well-formed, printable character at p (0 if it must be escaped). */
static size_t printable_len(const unsigned char *p, size_t n) {
    if (p[0] < 0x20 || p[0] == 0x7F) {
        return 0;
    }
    return utf8_seq_len(p, n);
}

const char *log_quote(char *out, size_t size, const char *value) {
    static const char hex[] = "0123456789abcdef";
    const unsigned char *p = (const unsigned char *)value;
    size_t n = strlen(value), o = 0;
    out[o++] = '"';
    for (size_t i = 0; i < n;) {
        /* a run of ASCII that needs no escape at once, as much of it as has room */
        size_t run = i;
        while (run < n && p[run] >= 0x20 && p[run] < 0x7F && p[run] != '"' && p[run] != '\\') {
            run++;
        }
        if (run > i) {
            size_t k = run - i, room = size - 5 - o; /* o + 5 <= size holds throughout */
            k = k < room ? k : room;
            memcpy(out + o, p + i, k);
            o += k;
            i += k;
            if (i < run) {
                memcpy(out + o, "...", 3);
                o += 3;
                break;
            }
            continue;
        }
        size_t len = printable_len(p + i, n - i);
        bool is_quote = p[i] == '"' || p[i] == '\\';
        size_t need = len == 0 ? 4 : is_quote ? 2 : len;
        if (o + need + 5 > size) { /* room for the character, "...", the quote and NUL */
            memcpy(out + o, "...", 3);
            o += 3;
            break;
        }
        if (len == 0) {
            out[o++] = '\\';
            out[o++] = 'x';
            out[o++] = hex[p[i] >> 4];
            out[o++] = hex[p[i] & 15];
            i++;
            continue;
        }
        if (is_quote) { /* not a two-byte character: it had a backslash, one byte past the room */
            out[o++] = '\\';
        }
        memcpy(out + o, p + i, len);
        o += len;
        i += len;
    }
    out[o++] = '"';
    out[o] = '\0';
    return out;
}

/* Copies line[0..len) into out (room for 4 * len bytes) with every control byte and every byte
 * that is not well-formed UTF-8 written as \xNN. Returns the new length. */
static size_t escape_line(const char *line, size_t len, char *out) {
    static const char hex[] = "0123456789abcdef";
    const unsigned char *p = (const unsigned char *)line;
    size_t o = 0;
    for (size_t i = 0; i < len;) {
        /* a run of printable ASCII at once (a request's whole line, usually) */
        size_t run = i;
        while (run < len && p[run] >= 0x20 && p[run] < 0x7F) {
            run++;
        }
        memcpy(out + o, p + i, run - i);
        o += run - i;
        i = run;
        if (i == len) {
            break;
        }
        size_t n = printable_len(p + i, len - i);
        if (n == 0) {
            out[o++] = '\\';
            out[o++] = 'x';
            out[o++] = hex[p[i] >> 4];
            out[o++] = hex[p[i] & 15];
            i++;
            continue;
        }
        memcpy(out + o, p + i, n);
        o += n;
        i += n;
    }
    return o;
}

/* Writes "<UTC time> <LEVEL> <module padded to 7> " into out (room for 128 bytes; a module is cut
 * at 64) and returns its length: by hand, not snprintf (see struct log_line). */
static size_t put_prefix(char *out, enum log_level level, const char *module) {
    struct timespec ts;
    struct tm tm;
    clock_gettime(CLOCK_REALTIME, &ts);
    gmtime_r(&ts.tv_sec, &tm);
    const int fields[7] = {
        tm.tm_year + 1900,          tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec,
        (int)(ts.tv_nsec / 1000000)};
    static const char seps[7] = {'-', '-', 'T', ':', ':', '.', 'Z'};
    static const int widths[7] = {4, 2, 2, 2, 2, 2, 3};
    size_t o = 0;
    for (int f = 0; f < 7; f++) {
        int v = fields[f] < 0 ? 0 : fields[f];
        for (int w = widths[f] - 1; w >= 0; w--, v /= 10) {
            out[o + (size_t)w] = (char)('0' + v % 10);
        }
        o += (size_t)widths[f];
        out[o++] = seps[f];
    }
    out[o++] = ' ';
    memcpy(out + o, level_tags[(unsigned)level & 3], 5);
    o += 5;
    out[o++] = ' ';
    size_t m = strnlen(module, 64);
    memcpy(out + o, module, m);
    o += m;
    for (; m < 7; m++) {
        out[o++] = ' ';
    }
    out[o++] = ' ';
    return o;
}

/* The line: prefix and message, each escaped straight into the line, a newline, one write(2). */
static void emit(enum log_level level, const char *module, const char *msg, size_t msg_len) {
    char head[128];
    size_t n = put_prefix(head, level, module);
    msg_len = msg_len < LOG_LINE_MAX ? msg_len : LOG_LINE_MAX;
    /* Whatever the message holds, the line ends at its one newline. */
    char out[4 * (sizeof head + LOG_LINE_MAX) + 1];
    size_t len = escape_line(head, n, out);
    len += escape_line(msg, msg_len, out + len);
    out[len++] = '\n';
    /* One write(2) per line keeps concurrent lines whole; a short write to stderr is not worth
     * retrying here. */
    ssize_t w = write(STDERR_FILENO, out, len);
    (void)w;
}

void log_write(enum log_level level, const char *module, const char *fmt, ...) {
    char msg[LOG_LINE_MAX];
    va_list ap;
    va_start(ap, fmt);
    int m = vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    if (m < 0) {
        return;
    }
    emit(level, module, msg, (size_t)m < sizeof msg ? (size_t)m : sizeof msg - 1);
}

void log_line_init(struct log_line *line) {
    line->len = 0;
    line->text[0] = '\0';
}

/* Appends n bytes, as many as fit (one byte stays for the NUL). */
static void line_append(struct log_line *line, const char *s, size_t n) {
    size_t room = sizeof line->text - 1 - line->len;
    n = n < room ? n : room;
    memcpy(line->text + line->len, s, n);
    line->len += n;
    line->text[line->len] = '\0';
}

void log_line_puts(struct log_line *line, const char *s) {
    line_append(line, s, strlen(s));
}

void log_line_quoted(struct log_line *line, const char *value, size_t size) {
    size_t room = sizeof line->text - line->len;
    if (room < 8) {
        return;
    }
    log_quote(line->text + line->len, size < room ? size : room, value);
    line->len += strlen(line->text + line->len);
}

void log_line_int(struct log_line *line, long long v) {
    char text[24];
    line_append(line, text, strbuf_format_int(text, v));
}

void log_line_fixed2(struct log_line *line, double v) {
    char text[STRBUF_NUMBER_MAX];
    line_append(line, text, strbuf_format_fixed(text, v, 2));
}

void log_line_write(enum log_level level, const char *module, const struct log_line *line) {
    emit(level, module, line->text, line->len);
}
