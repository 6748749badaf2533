/* server/b64.h: base64 (RFC 4648 standard alphabet, with padding) for tensors sent as
 * {"shape":[...],"b64":"..."}. Pure functions; any thread.
 */
#ifndef SERVER_B64_H
#define SERVER_B64_H

#include <stddef.h>
#include <stdint.h>

/* Characters b64_encode writes for n bytes (without the NUL). */
size_t b64_encoded_len(size_t n);

/* Encodes n bytes of src into dst, which must hold b64_encoded_len(n) + 1 bytes (NUL added). */
void b64_encode(const uint8_t *src, size_t n, char *dst);

/* Bytes that len characters of padded base64 decode to (0 if len is not a multiple of 4). */
size_t b64_decoded_len(const char *src, size_t len);

/* Decodes len characters of padded base64 into dst (b64_decoded_len bytes). Strict: no
 * whitespace, padding only at the end, a padded quantum's leftover bits zero (so each byte string
 * has one encoding). Returns 0, or -1 for malformed input. */
int b64_decode(const char *src, size_t len, uint8_t *dst);

#endif /* SERVER_B64_H */
