/* server/log.h: leveled logging to stderr, one line per event:
 *   <UTC time> <LEVEL> <module> <message> key=value ...
 * Lines about a request carry req= and session= fields (the caller writes them in the message).
 * The level is set once at startup, before any thread starts; log lines are written with a
 * single write(2) so that lines from different threads never interleave.
 *
 * One event is one line, always: log_write escapes every control byte and every byte that is not
 * well-formed UTF-8 in the finished line (as \xNN), so no value can start a line of its own. A
 * value that a client chose (a path, a method, a header) is also written quoted with log_quote,
 * so that it cannot pose as another key=value field either.
 */
#ifndef SERVER_LOG_H
#define SERVER_LOG_H

#include <stdbool.h>
#include <stddef.h>

enum log_level {
    LOG_LEVEL_ERROR = 0,
    LOG_LEVEL_WARN = 1,
    LOG_LEVEL_INFO = 2,
    LOG_LEVEL_DEBUG = 3,
};

/* Sets the most verbose level written (default LOG_LEVEL_INFO). Startup only. */
void log_set_level(enum log_level level);

/* True if lines of this level are written. Cheap. */
bool log_enabled(enum log_level level);

/* Parses "error", "warn", "info" or "debug". Returns 0, or -1 for anything else. */
int log_level_parse(const char *name, enum log_level *out);

/* The level's lower-case name. */
const char *log_level_name(enum log_level level);

/* Writes value as a double-quoted field into out[0..size) and returns out: '"' and '\\' are
 * escaped with a backslash, control bytes and bytes that are not UTF-8 as \xNN, and a value too
 * long for out is cut (at a character boundary) with "..." before the closing quote. size >= 8. */
const char *log_quote(char *out, size_t size, const char *value);

/* Writes one line (a trailing newline is added). Use the LOG_* macros, which skip evaluating the
 * arguments when the level is off. A message longer than LOG_LINE_MAX - 1 bytes is cut. */
void log_write(enum log_level level, const char *module, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* The longest message a line holds; the rest is cut. */
#define LOG_LINE_MAX 4096

/* A message put together piece by piece, for the lines written per request: printf costs ~20k
 * instructions a line here, since libquadmath (loaded with OpenBLAS) registers printf hooks and
 * glibc then formats every call the slow positional way. log_line_write writes it as log_write
 * writes its message (the same prefix, the same escaping). A piece past the room is cut. */
struct log_line {
    size_t len;
    char text[LOG_LINE_MAX];
};

void log_line_init(struct log_line *line);
void log_line_puts(struct log_line *line, const char *s);
/* value as log_quote writes it into a buffer of size bytes (the same cut). */
void log_line_quoted(struct log_line *line, const char *value, size_t size);
/* v as "%lld" writes it. */
void log_line_int(struct log_line *line, long long v);
/* v with two decimals, the same bytes as "%.2f". */
void log_line_fixed2(struct log_line *line, double v);
void log_line_write(enum log_level level, const char *module, const struct log_line *line);

#define LOG_ERROR(module, ...)                                                                     \
    do {                                                                                           \
        if (log_enabled(LOG_LEVEL_ERROR)) {                                                        \
            log_write(LOG_LEVEL_ERROR, module, __VA_ARGS__);                                       \
        }                                                                                          \
    } while (0)
#define LOG_WARN(module, ...)                                                                      \
    do {                                                                                           \
        if (log_enabled(LOG_LEVEL_WARN)) {                                                         \
            log_write(LOG_LEVEL_WARN, module, __VA_ARGS__);                                        \
        }                                                                                          \
    } while (0)
#define LOG_INFO(module, ...)                                                                      \
    do {                                                                                           \
        if (log_enabled(LOG_LEVEL_INFO)) {                                                         \
            log_write(LOG_LEVEL_INFO, module, __VA_ARGS__);                                        \
        }                                                                                          \
    } while (0)
#define LOG_DEBUG(module, ...)                                                                     \
    do {                                                                                           \
        if (log_enabled(LOG_LEVEL_DEBUG)) {                                                        \
            log_write(LOG_LEVEL_DEBUG, module, __VA_ARGS__);                                       \
        }                                                                                          \
    } while (0)

#endif /* SERVER_LOG_H */
