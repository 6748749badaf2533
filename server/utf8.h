/* server/utf8.h: UTF-8 checks shared by the JSON reader, the JSON encoder and the logs, so that
 * every body attnd sends is valid UTF-8 and no text is ever cut inside a character.
 *
 * Thread rule: pure functions, any thread.
 */
#ifndef SERVER_UTF8_H
#define SERVER_UTF8_H

#include <stddef.h>
#include <stdint.h>

/* The length (1..4) of the well-formed UTF-8 sequence at p[0..n) (RFC 3629: no overlong forms,
 * no surrogates, nothing past U+10FFFF), or 0 if p does not start one (n == 0 included). */
size_t utf8_seq_len(const unsigned char *p, size_t n);

/* Shortens the NUL-terminated s (in place) so that it does not end inside a character: a
 * trailing sequence that snprintf cut short is removed. */
void utf8_trim_partial(char *s);

/* Writes the code point cp (<= 0x10FFFF, not a surrogate) as UTF-8 into out; returns 1..4. */
size_t utf8_put(uint32_t cp, char *out);

#endif /* SERVER_UTF8_H */
