/* server/utf8.c: UTF-8 well-formedness (see utf8.h), following RFC 3629's table of valid byte
 * sequences rather than decoding and re-checking, so that every rule is one range test.
 */
#include "utf8.h"

#include <string.h>

size_t utf8_seq_len(const unsigned char *p, size_t n) {
    if (n == 0) {
        return 0;
    }
    unsigned c = p[0];
    if (c < 0x80) {
        return 1;
    }
    /* RFC 3629 section 4: the second byte's range depends on the first byte; the rest are
     * 80..BF. */
    size_t len;
    unsigned lo = 0x80, hi = 0xBF;
    if (c >= 0xC2 && c <= 0xDF) {
        len = 2;
    } else if (c >= 0xE0 && c <= 0xEF) {
        len = 3;
        if (c == 0xE0) {
            lo = 0xA0; /* no overlong 3-byte forms */
        } else if (c == 0xED) {
            hi = 0x9F; /* no UTF-16 surrogates */
        }
    } else if (c >= 0xF0 && c <= 0xF4) {
        len = 4;
        if (c == 0xF0) {
            lo = 0x90; /* no overlong 4-byte forms */
        } else if (c == 0xF4) {
            hi = 0x8F; /* nothing past U+10FFFF */
        }
    } else {
        return 0;
    }
    if (n < len || p[1] < lo || p[1] > hi) {
        return 0;
    }
    for (size_t i = 2; i < len; i++) {
        if (p[i] < 0x80 || p[i] > 0xBF) {
            return 0;
        }
    }
    return len;
}

void utf8_trim_partial(char *s) {
    size_t n = strlen(s);
    /* A character is at most 4 bytes: look back at most 3 continuation bytes for its lead. */
    size_t i = n;
    while (i > 0 && n - i < 4 && ((unsigned char)s[i - 1] & 0xC0) == 0x80) {
        i--;
    }
    if (i > 0 && (unsigned char)s[i - 1] >= 0xC0) {
        size_t lead = i - 1;
        if (utf8_seq_len((const unsigned char *)s + lead, n - lead) != n - lead) {
            s[lead] = '\0';
        }
    }
}

size_t utf8_put(uint32_t cp, char *out) {
    if (cp < 0x80) {
        out[0] = (char)cp;
        return 1;
    }
    if (cp < 0x800) {
        out[0] = (char)(0xC0 | cp >> 6);
        out[1] = (char)(0x80 | (cp & 0x3F));
        return 2;
    }
    if (cp < 0x10000) {
        out[0] = (char)(0xE0 | cp >> 12);
        out[1] = (char)(0x80 | (cp >> 6 & 0x3F));
        out[2] = (char)(0x80 | (cp & 0x3F));
        return 3;
    }
    out[0] = (char)(0xF0 | cp >> 18);
    out[1] = (char)(0x80 | (cp >> 12 & 0x3F));
    out[2] = (char)(0x80 | (cp >> 6 & 0x3F));
    out[3] = (char)(0x80 | (cp & 0x3F));
    return 4;
}
