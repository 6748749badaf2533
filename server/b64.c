/* server/b64.c: base64 encode/decode (see b64.h). */
#include "b64.h"

static const char alphabet[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

size_t b64_encoded_len(size_t n) {
    return (n + 2) / 3 * 4;
}

void b64_encode(const uint8_t *src, size_t n, char *dst) {
    size_t i = 0;
    char *p = dst;
    for (; i + 3 <= n; i += 3) {
        uint32_t v = (uint32_t)src[i] << 16 | (uint32_t)src[i + 1] << 8 | src[i + 2];
        *p++ = alphabet[v >> 18];
        *p++ = alphabet[(v >> 12) & 63];
        *p++ = alphabet[(v >> 6) & 63];
        *p++ = alphabet[v & 63];
    }
    if (n - i == 1) {
        uint32_t v = (uint32_t)src[i] << 16;
        *p++ = alphabet[v >> 18];
        *p++ = alphabet[(v >> 12) & 63];
        *p++ = '=';
        *p++ = '=';
    } else if (n - i == 2) {
        uint32_t v = (uint32_t)src[i] << 16 | (uint32_t)src[i + 1] << 8;
        *p++ = alphabet[v >> 18];
        *p++ = alphabet[(v >> 12) & 63];
        *p++ = alphabet[(v >> 6) & 63];
        *p++ = '=';
    }
    *p = '\0';
}

static int value_of(char c) {
    if (c >= 'A' && c <= 'Z') {
        return c - 'A';
    }
    if (c >= 'a' && c <= 'z') {
        return c - 'a' + 26;
    }
    if (c >= '0' && c <= '9') {
        return c - '0' + 52;
    }
    if (c == '+') {
        return 62;
    }
    if (c == '/') {
        return 63;
    }
    return -1;
}

size_t b64_decoded_len(const char *src, size_t len) {
    if (len == 0 || len % 4 != 0) {
        return 0;
    }
    size_t n = len / 4 * 3;
    if (src[len - 1] == '=') {
        n--;
        if (src[len - 2] == '=') {
            n--;
        }
    }
    return n;
}

int b64_decode(const char *src, size_t len, uint8_t *dst) {
    if (len % 4 != 0) {
        return -1;
    }
    size_t o = 0;
    for (size_t i = 0; i < len; i += 4) {
        int pad = 0;
        if (i + 4 == len) {
            pad = (src[i + 3] == '=') + (src[i + 2] == '=' && src[i + 3] == '=');
        }
        int v[4];
        for (int j = 0; j < 4; j++) {
            v[j] = j >= 4 - pad ? 0 : value_of(src[i + (size_t)j]);
            if (v[j] < 0) {
                return -1;
            }
        }
        /* The bits a padded quantum leaves over must be zero (RFC 4648 section 3.5), so each
         * byte string has one encoding and a damaged tail is not read as data. */
        if ((pad == 1 && (v[2] & 0x3) != 0) || (pad == 2 && (v[1] & 0xf) != 0)) {
            return -1;
        }
        uint32_t w =
            (uint32_t)v[0] << 18 | (uint32_t)v[1] << 12 | (uint32_t)v[2] << 6 | (uint32_t)v[3];
        dst[o++] = (uint8_t)(w >> 16);
        if (pad < 2) {
            dst[o++] = (uint8_t)(w >> 8);
        }
        if (pad < 1) {
            dst[o++] = (uint8_t)w;
        }
    }
    return 0;
}
