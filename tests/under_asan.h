/* tests/under_asan.h: UNDER_ASAN is 1 in a build with AddressSanitizer (gcc or clang), else 0,
 * for the tests that limit the address space (RLIMIT_AS), which ASan's shadow memory cannot run
 * under, or that measure memory ASan changes. */
#ifndef TESTS_UNDER_ASAN_H
#define TESTS_UNDER_ASAN_H

#if defined(__SANITIZE_ADDRESS__)
#define UNDER_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define UNDER_ASAN 1
#endif
#endif
#ifndef UNDER_ASAN
#define UNDER_ASAN 0
#endif

#endif
