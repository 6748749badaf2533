/* engine/error.c: the engine's error strings. The mapping to HTTP statuses lives in server/. */
#include "attn.h"

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
        return "model file missing, unreadable or malformed";
    case ATTN_ENOSPC:
        return "KV pool has no free blocks";
    case ATTN_EUNSUPPORTED:
        return "unsupported model feature";
    case ATTN_ECANCELED:
        return "cancelled by the caller";
    default:
        return "unknown error";
    }
}
