/* server/strbuf.c: growable byte buffer (see strbuf.h). Doubling growth keeps appends O(1)
 * amortized for the large tensor bodies api.c writes. */
#include "strbuf.h"

#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void strbuf_init(struct strbuf *b) {
    b->data = NULL;
    b->len = 0;
    b->cap = 0;
    b->has_failed = false;
}

void strbuf_release(struct strbuf *b) {
    free(b->data);
    strbuf_init(b);
}

int strbuf_reserve(struct strbuf *b, size_t extra) {
    if (b->has_failed) {
        return -1;
    }
    if (extra > SIZE_MAX / 2 - b->len - 1) {
        b->has_failed = true;
        return -1;
    }
    size_t need = b->len + extra + 1;
    if (need <= b->cap) {
        return 0;
    }
    size_t cap = b->cap ? b->cap : 256;
    while (cap < need) {
        cap *= 2;
    }
    char *p = realloc(b->data, cap);
    if (p == NULL) {
        b->has_failed = true;
        return -1;
    }
    b->data = p;
    b->cap = cap;
    b->data[b->len] = '\0';
    return 0;
}

void strbuf_append(struct strbuf *b, const void *data, size_t n) {
    if (n == 0 || strbuf_reserve(b, n) != 0) {
        return;
    }
    memcpy(b->data + b->len, data, n);
    b->len += n;
    b->data[b->len] = '\0';
}

void strbuf_puts(struct strbuf *b, const char *s) {
    strbuf_append(b, s, strlen(s));
}

void strbuf_putc(struct strbuf *b, char c) {
    strbuf_append(b, &c, 1);
}

void strbuf_printf(struct strbuf *b, const char *fmt, ...) {
    char small[256];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(small, sizeof small, fmt, ap);
    va_end(ap);
    if (n < 0) {
        b->has_failed = true;
        return;
    }
    if ((size_t)n < sizeof small) {
        strbuf_append(b, small, (size_t)n);
        return;
    }
    if (strbuf_reserve(b, (size_t)n) != 0) {
        return;
    }
    va_start(ap, fmt);
    vsnprintf(b->data + b->len, (size_t)n + 1, fmt, ap);
    va_end(ap);
    b->len += (size_t)n;
}

void strbuf_copy_string(char *out, size_t size, const char *s) {
    size_t n = strnlen(s, size - 1);
    memcpy(out, s, n);
    out[n] = '\0';
}

size_t strbuf_format_int(char *out, long long v) {
    char tmp[24];
    char *p = tmp + sizeof tmp;
    /* the magnitude as unsigned, so LLONG_MIN has one too */
    unsigned long long u = v < 0 ? 0ull - (unsigned long long)v : (unsigned long long)v;
    do {
        *--p = (char)('0' + u % 10);
        u /= 10;
    } while (u > 0);
    if (v < 0) {
        *--p = '-';
    }
    size_t n = (size_t)(tmp + sizeof tmp - p);
    memcpy(out, p, n);
    return n;
}

size_t strbuf_format_fixed(char *out, double v, int decimals) {
    static const double scales[7] = {1, 10, 100, 1000, 1e4, 1e5, 1e6};
    int d = decimals < 0 ? 0 : decimals > 6 ? 6 : decimals;
    /* the integer path while v x 10^d stays below 2^52, where its fraction is exact */
    if (signbit(v) || !(v * scales[d] < 4e15)) { /* negative, huge, NaN: printf's own words */
        int n = snprintf(out, STRBUF_NUMBER_MAX, "%.*f", d, v);
        return n < 0 ? 0 : (size_t)n < STRBUF_NUMBER_MAX ? (size_t)n : STRBUF_NUMBER_MAX - 1;
    }
    /* v x 10^d rounded to an integer as printf rounds v's exact value: p + e is the product
     * exactly (fma gives the multiplication's error) and r is p's fraction, a multiple of p's
     * ulp, while e is at most half of one: e decides only an exact half, and a tie goes to
     * even. (v x 10^d + 0.5 truncated, before, gave the other digit in 4% of the thousandths
     * of a millisecond that lie next to a half.) */
    double p = v * scales[d], e = fma(v, scales[d], -p), f = floor(p), r = p - f;
    if (r > 0.5 || (r == 0.5 && (e > 0 || (e == 0 && fmod(f, 2.0) == 1.0)))) {
        f += 1.0;
    }
    unsigned long long m = (unsigned long long)f, unit = (unsigned long long)scales[d];
    size_t n = strbuf_format_int(out, (long long)(m / unit));
    if (d > 0) {
        out[n++] = '.';
        for (int k = d - 1; k >= 0; k--, m /= 10) {
            out[n + (size_t)k] = (char)('0' + m % 10);
        }
        n += (size_t)d;
    }
    return n;
}

void strbuf_put_int(struct strbuf *b, long long v) {
    char text[24];
    strbuf_append(b, text, strbuf_format_int(text, v));
}

void strbuf_put_fixed3(struct strbuf *b, double v) {
    char text[STRBUF_NUMBER_MAX];
    strbuf_append(b, text, strbuf_format_fixed(text, v, 3));
}

void strbuf_consume(struct strbuf *b, size_t n) {
    if (n >= b->len) {
        b->len = 0;
    } else {
        memmove(b->data, b->data + n, b->len - n);
        b->len -= n;
    }
    if (b->data != NULL) {
        b->data[b->len] = '\0';
    }
}

char *strbuf_detach(struct strbuf *b, size_t *len) {
    if (!b->has_failed && b->data == NULL) {
        strbuf_reserve(b, 0);
    }
    if (b->has_failed) {
        strbuf_release(b);
        return NULL;
    }
    char *p = b->data;
    if (len != NULL) {
        *len = b->len;
    }
    strbuf_init(b);
    return p;
}
