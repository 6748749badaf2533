/* server/log.c: the log sink (stderr) and level. The level is the one mutable global the style
 * allows: it is written once by main() before any thread starts and only read afterwards. */
#include "log.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

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
    if (len > sizeof line - 2) {
        len = sizeof line - 2;
    }
    line[len++] = '\n';
    /* One write(2) per line keeps concurrent lines whole; a short write to stderr is not worth
     * retrying here. */
    ssize_t w = write(STDERR_FILENO, line, len);
    (void)w;
}
