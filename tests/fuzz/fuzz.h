/* tests/fuzz/fuzz.h: what every libFuzzer target checks beyond "no crash": a parser that refuses
 * its input must say why in an error body that is valid JSON and valid UTF-8, with a known code,
 * because that body goes to the client as it is. Targets abort() on a broken property, which
 * libFuzzer reports as a crash with the input that caused it.
 */
#ifndef TESTS_FUZZ_FUZZ_H
#define TESTS_FUZZ_FUZZ_H

#include <stddef.h>
#include <stdint.h>

#include "../../server/api.h"

/* Aborts unless code is a server error_code (not an engine code) of a 4xx status or 500, equal to
 * err->code, and err encodes (api_error_encode) into a JSON object with string code and message. */
void fuzz_check_error(int code, const struct api_error *err);

/* Aborts unless s[0..len) is well-formed UTF-8. */
void fuzz_check_utf8(const char *s, size_t len);

/* Aborts unless every one of the n floats is finite. */
void fuzz_check_finite(const float *x, size_t n);

#endif /* TESTS_FUZZ_FUZZ_H */
