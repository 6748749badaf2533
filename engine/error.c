/* engine/error.c: the engine's error strings, and the one way its internals write a failure's
 * reason. The mapping to HTTP statuses lives in server/. */
#include "attn.h"
#include "attn_int.h"

#include <stdarg.h>
#include <stdio.h>

const char *attn_strerror(int code) {
    switch (code) {
    case ATTN_OK:
        return "ok";
    case ATTN_EINVAL:
        return "invalid argument";
    case ATTN_ENOMEM:
        return "out of memory";
    case ATTN_ERANGE:
        return "position or length out of range";
    case ATTN_ESHAPE:
        return "shape mismatch";
    case ATTN_EIO:
        return "model file missing, unreadable, malformed or inconsistent";
    case ATTN_ENOSPC:
        return "KV pool has no free blocks";
    case ATTN_EUNSUPPORTED:
        return "unsupported model feature";
    case ATTN_ECANCELED:
        return "cancelled by the caller";
    case ATTN_EDROPPED:
        return "the sliding layer's cache dropped the tokens needed";
    case ATTN_EOVERFLOW:
        return "a key or value is past the range of the KV cache's dtype";
    default:
        return "unknown error";
    }
}

void attn__make_one_line(char *s) {
    for (; *s != '\0'; s++) {
        if ((unsigned char)*s < 0x20 || *s == 0x7f) {
            *s = '?';
        }
    }
}

int attn__fail(const struct attn__reason *why, int rc, const char *fmt, ...) {
    if (why->text != NULL && why->size > 0) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(why->text, why->size, fmt, ap);
        va_end(ap);
        attn__make_one_line(why->text);
    }
    return rc;
}
