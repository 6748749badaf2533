/* server/statedir.c: the state directory and its I/O thread (see statedir.h). Operations wait in
 * a FIFO under a mutex; the thread takes them one at a time, then hands them to the loop
 * through a uv_async (the loop runs their done callbacks and frees them).
 */
#define _GNU_SOURCE /* O_CLOEXEC, dirfd */
#include "statedir.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "log.h"

enum op_kind { OP_WRITE, OP_READ, OP_REMOVE };

struct op {
    enum op_kind kind;
    struct op *next;
    char name[256];
    uint8_t *data;
    size_t len;
    size_t max_len; /* a read's: a longer file fails (-EFBIG) before any byte is read */
    void (*prepare)(uint8_t *data, size_t len);
    int (*check)(void *ctx, const uint8_t *data, size_t len);
    statedir_arrived_fn arrived;
    struct op *arrived_next; /* in the arrived list, while the check runs */
    statedir_done_fn done;
    void *ctx;
    int status;
};

struct statedir {
    uv_loop_t *loop;
    char dir[4096];
    int dir_fd, lock_fd;
    uv_thread_t thread;
    uv_mutex_t mu;
    uv_cond_t cv;
    struct op *todo_head, *todo_tail;       /* queued, under mu */
    struct op *done_head, *done_tail;       /* finished, under mu, for the loop */
    struct op *arrived_head, *arrived_tail; /* read and being checked, under mu, for the loop */
    int32_t n_busy;                         /* queued or running, under mu */
    size_t pending_write_bytes;             /* under mu */
    bool is_stopping;                       /* under mu */
    uint8_t *spare;                         /* under mu: a released read's buffer, for the next */
    size_t spare_bytes;
    uv_async_t async;
};

static void push(struct op **head, struct op **tail, struct op *op) {
    op->next = NULL;
    if (*tail != NULL) {
        (*tail)->next = op;
    } else {
        *head = op;
    }
    *tail = op;
}

static struct op *pop(struct op **head, struct op **tail) {
    struct op *op = *head;
    if (op != NULL) {
        *head = op->next;
        if (*head == NULL) {
            *tail = NULL;
        }
    }
    return op;
}

/* ---- the I/O thread ------------------------------------------------------------------------- */

static int write_all(int fd, const uint8_t *p, size_t n) {
    while (n > 0) {
        ssize_t w = write(fd, p, n);
        if (w < 0) {
            if (errno == EINTR) {
                continue;
            }
            return -errno;
        }
        p += w;
        n -= (size_t)w;
    }
    return 0;
}

static int do_write(struct statedir *sd, struct op *op) {
    if (op->prepare != NULL) {
        op->prepare(op->data, op->len);
    }
    char tmp[300];
    snprintf(tmp, sizeof tmp, "%s.tmp", op->name);
    int fd = openat(sd->dir_fd, tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (fd < 0) {
        return -errno;
    }
    int rc = write_all(fd, op->data, op->len);
    if (rc == 0 && fsync(fd) != 0) {
        rc = -errno;
    }
    if (close(fd) != 0 && rc == 0) {
        rc = -errno;
    }
    if (rc == 0 && renameat(sd->dir_fd, tmp, sd->dir_fd, op->name) != 0) {
        rc = -errno;
    }
    if (rc != 0) {
        unlinkat(sd->dir_fd, tmp, 0);
        return rc;
    }
    /* the rename itself is durable only once the directory is */
    return fsync(sd->dir_fd) == 0 ? 0 : -errno;
}

/* ---- reading a file whole ------------------------------------------------------------------- */

enum {
    HUGE_PAGE = 2 << 20,
    SPARE_MAX = 32 << 20, /* the largest read buffer kept for the next read */
};

static size_t buffer_bytes(size_t n) {
    return (n + HUGE_PAGE - 1) & ~(size_t)(HUGE_PAGE - 1);
}

/* Memory for a read of n bytes: the spare a released read left (see statedir_release), if it is
 * large enough: its pages are in place (a fresh buffer's first touch cost 0.5 ms of an 8 MiB
 * read's 3), else anonymous memory, 2 MiB-aligned and advised into huge pages: a direct read
 * pins every page of its buffer, and pinning 4 KiB pages cost more than the device did (cold
 * 8 MiB: 10 ms into fresh 4 KiB pages, 3 ms into huge ones). The slack of the over-sized mapping
 * is unmapped, so that a buffer is buffer_bytes(n) bytes at its start. */
static uint8_t *buffer_new(struct statedir *sd, size_t n) {
    size_t len = buffer_bytes(n);
    uv_mutex_lock(&sd->mu);
    uint8_t *spare = sd->spare;
    size_t spare_bytes = sd->spare_bytes;
    bool fits = spare != NULL && spare_bytes >= len;
    if (fits) {
        sd->spare = NULL;
    }
    uv_mutex_unlock(&sd->mu);
    if (fits) {
        if (spare_bytes > len) { /* trimmed: a buffer is always buffer_bytes(n) long */
            munmap(spare + len, spare_bytes - len);
        }
        return spare;
    }
    uint8_t *p =
        mmap(NULL, len + HUGE_PAGE, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) {
        return NULL;
    }
    uint8_t *a = (uint8_t *)(((uintptr_t)p + HUGE_PAGE - 1) & ~(uintptr_t)(HUGE_PAGE - 1));
    if (a > p) {
        munmap(p, (size_t)(a - p));
    }
    munmap(a + len, (size_t)(p + len + HUGE_PAGE - (a + len)));
    madvise(a, len, MADV_HUGEPAGE); /* a hint: without it the read is slower, not wrong */
    return a;
}

/* Whether every page of the file sits in the page cache (asked without reading it). */
static bool is_cached(int fd, size_t n) {
    long page = sysconf(_SC_PAGESIZE);
    size_t n_pages = (n + (size_t)page - 1) / (size_t)page;
    void *map = mmap(NULL, n, PROT_READ, MAP_SHARED, fd, 0);
    unsigned char *vec = malloc(n_pages);
    bool all = map != MAP_FAILED && vec != NULL && mincore(map, n, vec) == 0;
    for (size_t i = 0; all && i < n_pages; i++) {
        all = (vec[i] & 1) != 0;
    }
    free(vec);
    if (map != MAP_FAILED) {
        munmap(map, n);
    }
    return all;
}

/* Reads the file's n bytes into buf (room for n rounded up to a page): 0, or a negative errno.
 * It asks for whole pages, as a direct read must; the file's last page comes back short. */
static int read_whole(int fd, uint8_t *buf, size_t n) {
    size_t done = 0;
    while (done < n) {
        size_t want = ((n + 4095) & ~(size_t)4095) - done;
        ssize_t got = pread(fd, buf + done, want, (off_t)done);
        if (got < 0 && errno == EINTR) {
            continue;
        }
        if (got <= 0) {
            return got < 0 ? -errno : -EIO; /* a file shorter than its fstat: changed under us */
        }
        done += (size_t)got;
    }
    return 0;
}

/* Reads the file whole into a buffer of its own (buffer_new). A file the page cache holds is
 * copied from it. One that is not (a spill written a while ago) is read with O_DIRECT: the
 * device gets the whole file as one request of many segments in flight at once, where the page
 * cache's readahead fed it a window at a time (cold 8 MiB: 3 ms against 9-10, on a disk that
 * streams 3.3 GB/s). A filesystem without O_DIRECT (tmpfs) reads through the cache. */
static int do_read(struct statedir *sd, struct op *op) {
    /* non-blocking: a FIFO put in a file's place must not hold the I/O thread */
    int fd = openat(sd->dir_fd, op->name, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0) {
        return -errno;
    }
    struct stat stbuf;
    int rc = fstat(fd, &stbuf) == 0 ? 0 : -errno;
    if (rc == 0 && !S_ISREG(stbuf.st_mode)) {
        rc = -EINVAL; /* not a file of ours */
    }
    if (rc == 0 && (uint64_t)stbuf.st_size > op->max_len) {
        rc = -EFBIG; /* longer than the file written (or its header states): torn, not read */
    }
    size_t n = rc == 0 ? (size_t)stbuf.st_size : 0;
    uint8_t *buf = NULL; /* an empty file: no bytes, no buffer */
    if (rc == 0 && n > 0 && (buf = buffer_new(sd, n)) == NULL) {
        rc = -ENOMEM;
    }
    if (buf != NULL) {
        int direct = is_cached(fd, n) ? -1
                                      : openat(sd->dir_fd, op->name,
                                               O_RDONLY | O_DIRECT | O_NONBLOCK | O_CLOEXEC);
        rc = direct >= 0 ? read_whole(direct, buf, n) : -EINVAL;
        if (direct >= 0) {
            close(direct);
        }
        if (rc == -EINVAL) { /* no O_DIRECT here, or the file was cached */
            rc = read_whole(fd, buf, n);
        }
    }
    close(fd);
    if (rc != 0) {
        statedir_release(sd, buf, n);
        return rc;
    }
    op->data = buf;
    op->len = n;
    return 0;
}

void statedir_release(struct statedir *sd, uint8_t *data, size_t len) {
    if (data == NULL) {
        return;
    }
    size_t bytes = buffer_bytes(len);
    uv_mutex_lock(&sd->mu);
    if (bytes <= SPARE_MAX && (sd->spare == NULL || sd->spare_bytes < bytes)) {
        uint8_t *old = sd->spare;
        size_t old_bytes = sd->spare_bytes;
        sd->spare = data; /* the larger one is kept, for the next read */
        sd->spare_bytes = bytes;
        data = old;
        bytes = old_bytes;
    }
    uv_mutex_unlock(&sd->mu);
    if (data != NULL) {
        munmap(data, bytes);
    }
}

/* The file work of op, on the I/O thread (or, at close, the thread that joined it). */
static void execute(struct statedir *sd, struct op *op) {
    switch (op->kind) {
    case OP_WRITE:
        op->status = do_write(sd, op);
        free(op->data);
        op->data = NULL;
        break;
    case OP_READ:
        op->status = do_read(sd, op);
        if (op->status == 0 && op->arrived != NULL && op->len > 0) {
            /* the loop takes the bytes in while they are checked here */
            uv_mutex_lock(&sd->mu);
            op->arrived_next = NULL;
            if (sd->arrived_tail != NULL) {
                sd->arrived_tail->arrived_next = op;
            } else {
                sd->arrived_head = op;
            }
            sd->arrived_tail = op;
            uv_mutex_unlock(&sd->mu);
            uv_async_send(&sd->async);
        }
        if (op->status == 0 && op->check != NULL) {
            op->status = op->check(op->ctx, op->len > 0 ? op->data : (const uint8_t *)"", op->len);
        }
        break;
    case OP_REMOVE:
        op->status = unlinkat(sd->dir_fd, op->name, 0) == 0 || errno == ENOENT ? 0 : -errno;
        break;
    }
}

/* op done, for run_done (mu held). */
static void finish(struct statedir *sd, struct op *op) {
    if (op->kind == OP_WRITE) {
        sd->pending_write_bytes -= op->len;
    }
    push(&sd->done_head, &sd->done_tail, op);
}

static void thread_main(void *arg) {
    struct statedir *sd = arg;
    uv_mutex_lock(&sd->mu);
    for (;;) {
        while (sd->todo_head == NULL && !sd->is_stopping) {
            uv_cond_wait(&sd->cv, &sd->mu);
        }
        struct op *op = pop(&sd->todo_head, &sd->todo_tail);
        if (op == NULL) {
            break; /* stopping, and nothing is left */
        }
        uv_mutex_unlock(&sd->mu);
        execute(sd, op);
        uv_mutex_lock(&sd->mu);
        finish(sd, op);
        uv_async_send(&sd->async);
    }
    uv_mutex_unlock(&sd->mu);
}

/* ---- the loop side -------------------------------------------------------------------------- */

/* Runs the done callbacks of finished operations. */
static void run_done(struct statedir *sd) {
    uv_mutex_lock(&sd->mu);
    struct op *arrived = sd->arrived_head;
    sd->arrived_head = sd->arrived_tail = NULL;
    struct op *list = sd->done_head;
    sd->done_head = sd->done_tail = NULL;
    uv_mutex_unlock(&sd->mu);
    /* first: an operation's done may be in this same list, and never comes before its arrived */
    for (struct op *op = arrived; op != NULL;) {
        struct op *next = op->arrived_next; /* read first: the op may be done, and freed below */
        op->arrived(op->ctx, op->data, op->len);
        op = next;
    }
    while (list != NULL) {
        struct op *op = list;
        list = op->next;
        if (op->status != 0 && op->kind != OP_READ) {
            LOG_WARN("statedir", "%s %s failed: %s", op->kind == OP_WRITE ? "write" : "remove",
                     op->name, strerror(-op->status));
        }
        if (op->done != NULL) {
            op->done(op->ctx, op->status, op->data, op->len);
        } else {
            statedir_release(sd, op->data, op->len); /* only a read has data here */
        }
        uv_mutex_lock(&sd->mu);
        sd->n_busy--;
        uv_mutex_unlock(&sd->mu);
        free(op);
    }
}

static void on_async(uv_async_t *h) {
    run_done(h->data);
}

int statedir_open(uv_loop_t *loop, const char *dir, struct statedir **out, char *err,
                  size_t err_size) {
    if (strlen(dir) >= sizeof((struct statedir *)0)->dir) {
        snprintf(err, err_size, "--state-dir: the path is too long");
        return -1;
    }
    if (mkdir(dir, 0700) != 0 && errno != EEXIST) {
        snprintf(err, err_size, "--state-dir %s: cannot create it: %s", dir, strerror(errno));
        return -1;
    }
    struct statedir *sd = calloc(1, sizeof *sd);
    if (sd == NULL) {
        snprintf(err, err_size, "--state-dir: out of memory");
        return -1;
    }
    snprintf(sd->dir, sizeof sd->dir, "%s", dir);
    sd->loop = loop;
    sd->lock_fd = -1;
    sd->dir_fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (sd->dir_fd < 0) {
        snprintf(err, err_size, "--state-dir %s: %s", dir, strerror(errno));
        free(sd);
        return -1;
    }
    sd->lock_fd = openat(sd->dir_fd, ".lock", O_RDWR | O_CREAT | O_CLOEXEC, 0600);
    if (sd->lock_fd < 0 || flock(sd->lock_fd, LOCK_EX | LOCK_NB) != 0) {
        snprintf(err, err_size, "--state-dir %s: %s", dir,
                 sd->lock_fd < 0 ? strerror(errno)
                                 : "another attnd is using this directory (its .lock is held)");
        if (sd->lock_fd >= 0) {
            close(sd->lock_fd);
        }
        close(sd->dir_fd);
        free(sd);
        return -1;
    }
    uv_mutex_init(&sd->mu);
    uv_cond_init(&sd->cv);
    uv_async_init(loop, &sd->async, on_async);
    sd->async.data = sd;
    if (uv_thread_create(&sd->thread, thread_main, sd) != 0) {
        snprintf(err, err_size, "--state-dir: cannot start its I/O thread");
        uv_close((uv_handle_t *)&sd->async, NULL);
        uv_run(loop, UV_RUN_NOWAIT);
        uv_cond_destroy(&sd->cv);
        uv_mutex_destroy(&sd->mu);
        close(sd->lock_fd);
        close(sd->dir_fd);
        free(sd);
        return -1;
    }
    *out = sd;
    return 0;
}

static void on_async_closed(uv_handle_t *h) {
    free(h->data);
}

/* With the I/O thread gone: runs what is queued and the callbacks, which may queue more (a write
 * that failed removes its session's file), here, until nothing is left. */
static void drain_here(struct statedir *sd) {
    for (;;) {
        run_done(sd);
        uv_mutex_lock(&sd->mu);
        struct op *op = pop(&sd->todo_head, &sd->todo_tail);
        uv_mutex_unlock(&sd->mu);
        if (op == NULL) {
            break;
        }
        execute(sd, op);
        uv_mutex_lock(&sd->mu);
        finish(sd, op);
        uv_mutex_unlock(&sd->mu);
    }
}

void statedir_close(struct statedir *sd) {
    statedir_close_with(sd, NULL, NULL);
}

void statedir_close_with(struct statedir *sd, void (*last)(void *ctx), void *ctx) {
    if (sd == NULL) {
        return;
    }
    uv_mutex_lock(&sd->mu);
    sd->is_stopping = true;
    uv_cond_signal(&sd->cv);
    uv_mutex_unlock(&sd->mu);
    uv_thread_join(&sd->thread); /* it leaves once the queue is empty */
    drain_here(sd);
    if (last != NULL) {
        last(ctx);
        drain_here(sd);
    }
    if (sd->spare != NULL) {
        munmap(sd->spare, sd->spare_bytes);
    }
    uv_cond_destroy(&sd->cv);
    uv_mutex_destroy(&sd->mu);
    close(sd->lock_fd); /* releases the flock */
    close(sd->dir_fd);
    uv_close((uv_handle_t *)&sd->async, on_async_closed);
}

static int queue(struct statedir *sd, enum op_kind kind, const char *name, uint8_t *data,
                 size_t len, statedir_done_fn done, void *ctx, struct op **out) {
    struct op *op = calloc(1, sizeof *op);
    if (op == NULL) {
        free(data);
        return -ENOMEM;
    }
    op->kind = kind;
    snprintf(op->name, sizeof op->name, "%s", name);
    op->data = data;
    op->len = len;
    op->done = done;
    op->ctx = ctx;
    *out = op;
    return 0;
}

static void start(struct statedir *sd, struct op *op) {
    uv_mutex_lock(&sd->mu);
    push(&sd->todo_head, &sd->todo_tail, op);
    sd->n_busy++;
    if (op->kind == OP_WRITE) {
        sd->pending_write_bytes += op->len;
    }
    uv_cond_signal(&sd->cv);
    uv_mutex_unlock(&sd->mu);
}

int statedir_write(struct statedir *sd, const char *name, uint8_t *data, size_t len,
                   void (*prepare)(uint8_t *data, size_t len), statedir_done_fn done, void *ctx) {
    struct op *op;
    int rc = queue(sd, OP_WRITE, name, data, len, done, ctx, &op);
    if (rc == 0) {
        op->prepare = prepare;
        start(sd, op);
    }
    return rc;
}

int statedir_read(struct statedir *sd, const char *name, size_t max_len,
                  int (*check)(void *ctx, const uint8_t *data, size_t len),
                  statedir_arrived_fn arrived, statedir_done_fn done, void *ctx) {
    struct op *op;
    int rc = queue(sd, OP_READ, name, NULL, 0, done, ctx, &op);
    if (rc == 0) {
        op->max_len = max_len;
        op->check = check;
        op->arrived = arrived;
        start(sd, op);
    }
    return rc;
}

int statedir_remove(struct statedir *sd, const char *name, statedir_done_fn done, void *ctx) {
    struct op *op;
    int rc = queue(sd, OP_REMOVE, name, NULL, 0, done, ctx, &op);
    if (rc == 0) {
        start(sd, op);
    }
    return rc;
}

size_t statedir_pending_bytes(const struct statedir *sd) {
    uv_mutex_lock((uv_mutex_t *)&sd->mu);
    size_t n = sd->pending_write_bytes;
    uv_mutex_unlock((uv_mutex_t *)&sd->mu);
    return n;
}

int32_t statedir_scan(struct statedir *sd, const char *suffix, size_t head_max,
                      void (*fn)(void *ctx, const char *name, const uint8_t *head, size_t n,
                                 uint64_t size, bool is_file),
                      void *ctx) {
    int fd = dup(sd->dir_fd);
    DIR *d = fd >= 0 ? fdopendir(fd) : NULL;
    int rc = d == NULL ? -errno : 0;
    uint8_t *head = malloc(head_max);
    if (d == NULL || head == NULL) {
        if (d != NULL) {
            closedir(d);
        } else if (fd >= 0) {
            close(fd);
        }
        free(head);
        return rc != 0 ? rc : -ENOMEM; /* not listed: not "no files" */
    }
    rewinddir(d);
    int32_t n_files = 0;
    size_t sl = strlen(suffix);
    struct dirent *e;
    while ((errno = 0, e = readdir(d)) != NULL) { /* errno: an end, or a failure */
        size_t n = strlen(e->d_name);
        struct stat stbuf;
        if (n > sl + 4 && strcmp(e->d_name + n - 4, ".tmp") == 0 &&
            memcmp(e->d_name + n - 4 - sl, suffix, sl) == 0) {
            /* NAME.tmp, a write a crash interrupted (never read): this directory's own only */
            if (fstatat(sd->dir_fd, e->d_name, &stbuf, AT_SYMLINK_NOFOLLOW) == 0 &&
                S_ISREG(stbuf.st_mode) && unlinkat(sd->dir_fd, e->d_name, 0) == 0) {
                LOG_INFO("statedir", "removed %s: a write that a crash interrupted", e->d_name);
            }
            continue;
        }
        if (n <= sl || strcmp(e->d_name + n - sl, suffix) != 0) {
            continue;
        }
        /* Only a regular file (a symlink's target counts) is opened: opening a FIFO would
         * block the start for good, a device's open may act. Any other entry comes as no file,
         * so that the caller leaves it alone and keeps its name from new sessions. */
        ssize_t got = 0;
        uint64_t size = 0;
        bool is_file = false;
        if (fstatat(sd->dir_fd, e->d_name, &stbuf, 0) == 0 && S_ISREG(stbuf.st_mode)) {
            int f = openat(sd->dir_fd, e->d_name, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
            if (f >= 0 && fstat(f, &stbuf) == 0 && S_ISREG(stbuf.st_mode)) {
                got = pread(f, head, head_max, 0);
                size = (uint64_t)stbuf.st_size;
                is_file = true;
            }
            if (f < 0 || got < 0) {
                /* the caller leaves it alone as "not a regular file" or an empty one: the
                 * log says why (an audit's injected EIO read as a FIFO's line) */
                LOG_WARN("statedir", "cannot %s %s: %s", f < 0 ? "open" : "read", e->d_name,
                         strerror(errno));
            }
            if (f >= 0) {
                close(f);
            }
        }
        fn(ctx, e->d_name, head, got > 0 ? (size_t)got : 0, size, is_file);
        n_files++;
    }
    rc = errno != 0 ? -errno : 0; /* a directory read that failed midway lists part of it */
    closedir(d);
    free(head);
    return rc != 0 ? rc : n_files;
}

int statedir_read_now(struct statedir *sd, const char *name, size_t max_len, uint8_t **data,
                      size_t *len) {
    char tmp[300];
    snprintf(tmp, sizeof tmp, "%s.tmp", name);
    struct stat st;
    if (fstatat(sd->dir_fd, tmp, &st, AT_SYMLINK_NOFOLLOW) == 0 && S_ISREG(st.st_mode) &&
        unlinkat(sd->dir_fd, tmp, 0) == 0) {
        LOG_INFO("statedir", "removed %s: a write that a crash interrupted", tmp);
    }
    /* as the scan: only a regular file is opened (a FIFO's open would block the start) */
    if (fstatat(sd->dir_fd, name, &st, 0) != 0) {
        return -errno;
    }
    if (!S_ISREG(st.st_mode)) {
        return -EINVAL;
    }
    if ((uint64_t)st.st_size > max_len) {
        return -EFBIG;
    }
    int fd = openat(sd->dir_fd, name, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0) {
        return -errno;
    }
    size_t n = (size_t)st.st_size, got = 0;
    uint8_t *buf = malloc(n + 1);
    int rc = buf == NULL ? -ENOMEM : 0;
    while (rc == 0 && got < n) {
        ssize_t r = pread(fd, buf + got, n - got, (off_t)got);
        rc = r < 0 ? -errno : r == 0 ? -EIO : 0; /* shorter than its size: cut while read */
        got += r > 0 ? (size_t)r : 0;
    }
    close(fd);
    if (rc != 0) {
        free(buf);
        return rc;
    }
    *data = buf;
    *len = n;
    return 0;
}
