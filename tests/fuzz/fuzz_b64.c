/* tests/fuzz/fuzz_b64.c: base64 both ways. Any input: decoding either refuses it or writes
 * exactly b64_decoded_len bytes, and a decoded text encodes back to itself when its padding bits
 * are zero (the strict decoder accepts nothing else). The input's bytes, encoded, decode back to
 * themselves. */
#include <stdlib.h>
#include <string.h>

#include "../../server/b64.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    const char *text = (const char *)data;
    size_t n = b64_decoded_len(text, size);
    uint8_t *bytes = malloc(n + 1);
    char *again = malloc(b64_encoded_len(n) + 1);
    if (bytes == NULL || again == NULL)
        abort();
    if (b64_decode(text, size, bytes) == 0) {
        b64_encode(bytes, n, again);
        if (strlen(again) != size || memcmp(again, text, size) != 0)
            abort();
    }
    free(bytes);
    free(again);

    char *enc = malloc(b64_encoded_len(size) + 1);
    if (enc == NULL)
        abort();
    b64_encode(data, size, enc);
    size_t m = b64_decoded_len(enc, strlen(enc));
    uint8_t *dec = malloc(m + 1);
    if (dec == NULL || m != size || b64_decode(enc, strlen(enc), dec) != 0)
        abort();
    if (size > 0 && memcmp(dec, data, size) != 0)
        abort();
    free(enc);
    free(dec);
    return 0;
}
