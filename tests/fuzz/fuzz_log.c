/* tests/fuzz/fuzz_log.c: log_quote, which writes a client's bytes (a path, a method, a session id)
 * into a request's log line. The input's first two bytes set the field's size (8 to 2055), the
 * rest is the value. Into exactly that many bytes (ASan sees one past them; a two-byte character
 * before a cut once wrote there), the field must be one quoted, well-formed UTF-8 string with no
 * control byte, and reading its escapes back must give the value, or, where it was cut ("..."
 * before the closing quote), the start of the value. */
#include <stdlib.h>
#include <string.h>

#include "../../server/log.h"
#include "fuzz.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static int hex_value(char c) {
    return c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
}

/* The bytes the escapes of q[0..n) stand for, into out; -1 for an escape log_quote never writes. */
static long unquote(const char *q, size_t n, char *out) {
    size_t o = 0;
    for (size_t i = 0; i < n; i++) {
        if (q[i] != '\\') {
            out[o++] = q[i];
            continue;
        }
        if (i + 1 < n && (q[i + 1] == '"' || q[i + 1] == '\\')) {
            out[o++] = q[++i];
        } else if (i + 3 < n && q[i + 1] == 'x' && hex_value(q[i + 2]) >= 0 &&
                   hex_value(q[i + 3]) >= 0) {
            out[o++] = (char)(hex_value(q[i + 2]) * 16 + hex_value(q[i + 3]));
            i += 3;
        } else {
            return -1;
        }
    }
    return (long)o;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 2 || size > 4096) {
        return 0;
    }
    size_t field = 8 + (((size_t)data[0] << 8 | data[1]) & 2047);
    size_t n = size - 2;
    char *value = malloc(n + 1);
    memcpy(value, data + 2, n);
    value[n] = '\0'; /* a NUL in the input ends the value, as it ends a C string */
    n = strlen(value);
    char *out = malloc(field);
    log_quote(out, field, value);
    size_t len = strlen(out);
    if (len >= field || len < 2 || out[0] != '"' || out[len - 1] != '"')
        abort();
    fuzz_check_utf8(out, len);
    for (size_t i = 0; i < len; i++) {
        if ((unsigned char)out[i] < 0x20 || out[i] == 0x7F)
            abort();
    }
    char *back = malloc(len);
    long m = unquote(out + 1, len - 2, back);
    if (m < 0)
        abort();
    bool is_whole = (size_t)m == n && memcmp(back, value, n) == 0;
    if (!is_whole) {
        /* cut: "..." closes it, and what comes before is where the value starts */
        if (m < 3 || memcmp(back + m - 3, "...", 3) != 0 || (size_t)m - 3 > n ||
            memcmp(back, value, (size_t)m - 3) != 0)
            abort();
    }
    free(back);
    free(out);
    free(value);
    return 0;
}
