/* server/log.c: the log sink (stderr) and level. The level is the one mutable global the style
 * allows: it is written once by main() before any thread starts and only read afterwards. */
#include "log.h"

#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

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

void log_write(enum log_level level, const char *module, const char *fmt, ...) {
    char line[4096];
    struct timespec ts;
    struct tm tm;
    clock_gettime(CLOCK_REALTIME, &ts);
    gmtime_r(&ts.tv_sec, &tm);
    int n = snprintf(line, sizeof line, "%04d-%02d-%02dT%02d:%02d:%02d.%03ldZ %s %-7s ",
                     tm.tm_year + 1900, tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec,
                     ts.tv_nsec / 1000000, level_tags[(unsigned)level & 3], module);
    if (n < 0) {
        return;
    }
    va_list ap;
    va_start(ap, fmt);
    int m = vsnprintf(line + n, sizeof line - (size_t)n - 1, fmt, ap);
    va_end(ap);
    size_t len = (size_t)n + (m < 0 ? 0 : (size_t)m);
    if (len > sizeof line - 1) {
        len = sizeof line - 1;
    }
    /* Whatever the message holds, the line ends at its one newline. */
    char out[4 * sizeof line + 1];
    len = escape_line(line, len, out);
    out[len++] = '\n';
    /* One write(2) per line keeps concurrent lines whole; a short write to stderr is not worth
     * retrying here. */
    ssize_t w = write(STDERR_FILENO, out, len);
    (void)w;
}
