/* tests/fault_inject.c: a test-only allocation fault injector, LD_PRELOADed into a daemon the
 * tests start (never linked into attnd). It fails the Nth call of malloc, calloc, realloc,
 * posix_memalign or aligned_alloc counted after it was armed, in any thread, once.
 *
 * Arming: the test writes "N" to the file named by $FAULT_INJECT_ARM and sends SIGUSR2; N < 0
 * disarms and writes "<calls counted> <N that failed, or 0>" to $FAULT_INJECT_ARM.status.
 * Built by the Makefile as $(BUILD)/tests/libfault_inject.so, without sanitizers (under ASan,
 * ASAN_OPTIONS needs verify_asan_link_order=0: this library comes before ASan's runtime). */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

static _Atomic long remaining; /* > 0: armed, the call that brings it to 0 fails */
static _Atomic long counted;
static _Atomic long failed_at;
static _Atomic int armed;

static void *(*real_malloc)(size_t);
static void *(*real_calloc)(size_t, size_t);
static void *(*real_realloc)(void *, size_t);
static void (*real_free)(void *);
static int (*real_posix_memalign)(void **, size_t, size_t);
static void *(*real_aligned_alloc)(size_t, size_t);

/* dlsym itself allocates: those first calls are served from here */
static char boot[16384];
static size_t boot_used;
static int resolving;

static void resolve(void) {
    if (real_malloc != NULL || resolving) {
        return;
    }
    resolving = 1;
    real_malloc = (void *(*)(size_t))dlsym(RTLD_NEXT, "malloc");
    real_calloc = (void *(*)(size_t, size_t))dlsym(RTLD_NEXT, "calloc");
    real_realloc = (void *(*)(void *, size_t))dlsym(RTLD_NEXT, "realloc");
    real_free = (void (*)(void *))dlsym(RTLD_NEXT, "free");
    real_posix_memalign = (int (*)(void **, size_t, size_t))dlsym(RTLD_NEXT, "posix_memalign");
    real_aligned_alloc = (void *(*)(size_t, size_t))dlsym(RTLD_NEXT, "aligned_alloc");
    resolving = 0;
}

static void *boot_alloc(size_t n) {
    size_t at = (boot_used + 15) & ~(size_t)15;
    if (at + n > sizeof boot) {
        return NULL;
    }
    boot_used = at + n;
    return boot + at;
}

static int is_boot(const void *p) {
    return (const char *)p >= boot && (const char *)p < boot + sizeof boot;
}

/* 1 when this call is the one to fail */
static int hit(void) {
    if (!atomic_load(&armed)) {
        return 0;
    }
    long c = atomic_fetch_add(&counted, 1) + 1;
    long r = atomic_load(&remaining);
    while (r > 0) {
        if (atomic_compare_exchange_weak(&remaining, &r, r - 1)) {
            if (r == 1) {
                atomic_store(&failed_at, c);
                return 1;
            }
            return 0;
        }
    }
    return 0;
}

static void put_long(char *buf, size_t *at, long v) {
    char d[24];
    int n = 0;
    if (v < 0) {
        buf[(*at)++] = '-';
        v = -v;
    }
    do {
        d[n++] = (char)('0' + v % 10);
        v /= 10;
    } while (v != 0);
    while (n > 0) {
        buf[(*at)++] = d[--n];
    }
}

/* Async-signal-safe: raw system calls only. */
static void on_arm(int sig) {
    (void)sig;
    const char *path = getenv("FAULT_INJECT_ARM");
    char b[32] = {0};
    int fd = path != NULL ? (int)syscall(SYS_openat, AT_FDCWD, path, O_RDONLY) : -1;
    if (fd < 0) {
        return;
    }
    long k = syscall(SYS_read, fd, b, sizeof b - 1);
    syscall(SYS_close, fd);
    if (k <= 0) {
        return;
    }
    long n = strtol(b, NULL, 10);
    if (n >= 0) {
        atomic_store(&armed, 0);
        atomic_store(&counted, 0);
        atomic_store(&failed_at, 0);
        atomic_store(&remaining, n);
        atomic_store(&armed, 1);
        return;
    }
    atomic_store(&armed, 0);
    atomic_store(&remaining, 0);
    char status[512], out[64];
    size_t len = strlen(path), at = 0;
    if (len + sizeof ".status" > sizeof status) {
        return;
    }
    memcpy(status, path, len);
    memcpy(status + len, ".status", sizeof ".status");
    put_long(out, &at, atomic_load(&counted));
    out[at++] = ' ';
    put_long(out, &at, atomic_load(&failed_at));
    out[at++] = '\n';
    fd = (int)syscall(SYS_openat, AT_FDCWD, status, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    if (fd >= 0) {
        syscall(SYS_write, fd, out, at);
        syscall(SYS_close, fd);
    }
}

__attribute__((constructor)) static void init(void) {
    resolve();
    if (getenv("FAULT_INJECT_ARM") != NULL) {
        struct sigaction sa;
        memset(&sa, 0, sizeof sa);
        sa.sa_handler = on_arm;
        sa.sa_flags = SA_RESTART;
        sigaction(SIGUSR2, &sa, NULL);
    }
}

void *malloc(size_t n) {
    if (real_malloc == NULL) {
        if (resolving) {
            return boot_alloc(n);
        }
        resolve();
    }
    if (hit()) {
        errno = ENOMEM;
        return NULL;
    }
    return real_malloc(n);
}

void *calloc(size_t a, size_t b) {
    if (real_calloc == NULL) {
        if (resolving) {
            return b != 0 && a > (size_t)-1 / b ? NULL : boot_alloc(a * b); /* boot is zeroed */
        }
        resolve();
    }
    if (hit()) {
        errno = ENOMEM;
        return NULL;
    }
    return real_calloc(a, b);
}

void free(void *p) {
    if (p == NULL || is_boot(p)) {
        return;
    }
    resolve();
    real_free(p);
}

void *realloc(void *p, size_t n) {
    resolve();
    if (is_boot(p)) {
        void *q = malloc(n);
        if (q != NULL) {
            size_t room = (size_t)(boot + sizeof boot - (char *)p);
            memcpy(q, p, n < room ? n : room);
        }
        return q;
    }
    if (hit()) {
        errno = ENOMEM;
        return NULL;
    }
    return real_realloc(p, n);
}

int posix_memalign(void **out, size_t align, size_t n) {
    resolve();
    if (hit()) {
        return ENOMEM;
    }
    return real_posix_memalign(out, align, n);
}

void *aligned_alloc(size_t align, size_t n) {
    resolve();
    if (hit()) {
        errno = ENOMEM;
        return NULL;
    }
    return real_aligned_alloc(align, n);
}
