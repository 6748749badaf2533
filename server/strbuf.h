/* server/strbuf.h: a growable byte buffer with a sticky out-of-memory flag.
 *
 * Used to build response bodies (api.c), stream buffers and request bodies (http.c). Appends
 * never fail loudly: after an allocation failure the buffer stops growing and has_failed is set,
 * so a writer appends everything and checks once at the end. Thread rule: one thread at a time.
 */
#ifndef SERVER_STRBUF_H
#define SERVER_STRBUF_H

#include <stdbool.h>
#include <stddef.h>

struct strbuf {
    char *data;      /* NUL-terminated when len > 0 or after strbuf_reserve */
    size_t len;      /* bytes written, excluding the NUL */
    size_t cap;      /* bytes allocated */
    bool has_failed; /* an allocation failed; contents are incomplete */
};

/* Initializes an empty buffer (no allocation). */
void strbuf_init(struct strbuf *b);

/* Frees the buffer's memory and leaves it empty (initialized). */
void strbuf_release(struct strbuf *b);

/* Makes room for `extra` more bytes plus a NUL. Returns 0, or -1 (and sets has_failed). */
int strbuf_reserve(struct strbuf *b, size_t extra);

void strbuf_append(struct strbuf *b, const void *data, size_t n);
void strbuf_puts(struct strbuf *b, const char *s);
void strbuf_putc(struct strbuf *b, char c);
void strbuf_printf(struct strbuf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* v in decimal, as "%lld" writes it, without printf: the answers of a batch write a few
 * hundred numbers, which vsnprintf's machinery made a fair part of their encoding. */
void strbuf_put_int(struct strbuf *b, long long v);

/* v with 3 decimals, the same bytes as "%.3f" (strbuf_format_fixed). For durations in
 * milliseconds. */
void strbuf_put_fixed3(struct strbuf *b, double v);

/* s into out[0..size), cut to fit and NUL-terminated (size > 0): snprintf's "%s" without
 * printf, which costs ~1,000 instructions a copy once libquadmath (loaded with OpenBLAS) has
 * registered printf hooks (glibc then formats every call the slow positional way). */
void strbuf_copy_string(char *out, size_t size, const char *s);

/* The longest text the two below write: printf's "%.6f" of the largest double. */
#define STRBUF_NUMBER_MAX 330

/* v in decimal into out (room for 24 bytes), as "%lld" writes it; returns the length. */
size_t strbuf_format_int(char *out, long long v);

/* v with decimals (0-6) digits after the point into out (room for STRBUF_NUMBER_MAX bytes), the
 * same bytes as printf's "%.*f" (rounded from v's exact value, a tie to even), without printf for
 * 0 <= v x 10^decimals < 4e15; returns the length. */
size_t strbuf_format_fixed(char *out, double v, int decimals);

/* Drops the first n bytes (n <= len), keeping the rest. */
void strbuf_consume(struct strbuf *b, size_t n);

/* Returns the malloc'd, NUL-terminated contents (the caller frees them) and leaves the buffer
 * empty; *len (if not NULL) gets their length. Returns NULL if an append had failed (the memory
 * is released then). An empty buffer gives "" (allocated). */
char *strbuf_detach(struct strbuf *b, size_t *len);

#endif /* SERVER_STRBUF_H */
