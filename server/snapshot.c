/* server/snapshot.c: a session as one file (see snapshot.h; the layout, field by field, is
 * proto/session-file.md). All integers little-endian; every part starts 8-byte aligned.
 */
#include "snapshot.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "error.h"

static const char magic[8] = {'A', 'T', 'T', 'N', 'D', 'S', 'E', 'S'};

enum { SECTION_SELF = 0, SECTION_CROSS = 1 };
#define SECTION_HEAD_BYTES 16

static size_t pad8(size_t n) {
    return (n + 7) & ~(size_t)7;
}

static void put_u32(uint8_t *p, uint32_t v) {
    for (int i = 0; i < 4; i++) {
        p[i] = (uint8_t)(v >> (8 * i));
    }
}

static void put_u64(uint8_t *p, uint64_t v) {
    for (int i = 0; i < 8; i++) {
        p[i] = (uint8_t)(v >> (8 * i));
    }
}

static uint32_t get_u32(const uint8_t *p) {
    uint32_t v = 0;
    for (int i = 3; i >= 0; i--) {
        v = v << 8 | p[i];
    }
    return v;
}

static uint64_t get_u64(const uint8_t *p) {
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--) {
        v = v << 8 | p[i];
    }
    return v;
}

/* The caches a file holds for s, in order: by layer, its own cache then its context. */
static attn_kv *section_kv(struct session *s, int32_t layer, int kind) {
    return kind == SECTION_SELF ? session_kv_find(s, layer) : session_cross_find(s, layer);
}

/* The file's length for s, and (if not NULL) how many sections it has. */
static size_t file_bytes(struct session *s, const attn_model *m, uint32_t *n_sections) {
    int32_t first = attn_model_layer_first(m), count = attn_model_layer_count(m);
    size_t total = SNAPSHOT_HEADER_BYTES + pad8(strlen(session_id(s)));
    uint32_t n = 0;
    for (int32_t l = first; l < first + count; l++) {
        for (int kind = SECTION_SELF; kind <= SECTION_CROSS; kind++) {
            attn_kv *kv = section_kv(s, l, kind);
            if (kv != NULL) {
                total += SECTION_HEAD_BYTES + pad8(attn_kv_export_bytes(kv));
                n++;
            }
        }
    }
    if (n_sections != NULL) {
        *n_sections = n;
    }
    return total + 8; /* the checksum */
}

size_t snapshot_bytes(struct session *s, const attn_model *m) {
    return file_bytes(s, m, NULL);
}

struct snapshot_kv snapshot_kv_of(const attn_kv_pool *pool) {
    return (struct snapshot_kv){attn_kv_pool_dtype(pool), attn_kv_pool_keeps_queries(pool)};
}

int snapshot_encode(struct session *s, const attn_model *m, struct snapshot_kv pool_kv,
                    int64_t unix_ms, uint8_t **out, size_t *len) {
    int32_t first = attn_model_layer_first(m), count = attn_model_layer_count(m);
    const char *id = session_id(s);
    size_t id_len = strlen(id);
    uint32_t n_sections;
    size_t total = file_bytes(s, m, &n_sections);
    /* malloc, not calloc: the rows are most of it and are written once; the header and the
     * padding are zeroed where they are laid out */
    uint8_t *p = malloc(total);
    if (p == NULL) {
        return ATTN_ENOMEM;
    }
    memset(p, 0, SNAPSHOT_HEADER_BYTES + pad8(id_len));
    memcpy(p, magic, sizeof magic);
    put_u32(p + 8, SNAPSHOT_VERSION);
    put_u32(p + 12, SNAPSHOT_HEADER_BYTES);
    attn_model_fingerprint(m, p + 16);
    put_u32(p + 48, (uint32_t)pool_kv.dtype);
    put_u32(p + 52, (uint32_t)id_len);
    put_u32(p + 56, n_sections);
    put_u32(p + 60, (uint32_t)session_n_tokens(s));
    put_u64(p + 64, total);
    put_u64(p + 72, (uint64_t)unix_ms);
    put_u32(p + 80, pool_kv.has_queries ? SNAPSHOT_FLAG_QUERIES : 0);
    /* the fingerprint's parts, so that a refusal can name which differs */
    put_u64(p + 84, attn_model_config_digest(m));
    p[92] = (uint8_t)first;
    p[93] = (uint8_t)(first >> 8);
    p[94] = (uint8_t)(count < 255 ? count : 255);
    p[95] = (uint8_t)attn_model_weights_dtype(m);
    memcpy(p + SNAPSHOT_HEADER_BYTES, id, id_len);
    size_t at = SNAPSHOT_HEADER_BYTES + pad8(id_len);
    for (int32_t l = first; l < first + count; l++) {
        for (int kind = SECTION_SELF; kind <= SECTION_CROSS; kind++) {
            attn_kv *kv = section_kv(s, l, kind);
            if (kv == NULL) {
                continue;
            }
            size_t n = attn_kv_export_bytes(kv);
            put_u32(p + at, (uint32_t)kind);
            put_u32(p + at + 4, (uint32_t)l);
            put_u64(p + at + 8, n);
            attn_kv_export(kv, p + at + SECTION_HEAD_BYTES, n); /* sized just above */
            memset(p + at + SECTION_HEAD_BYTES + n, 0, pad8(n) - n);
            at += SECTION_HEAD_BYTES + pad8(n);
        }
    }
    *out = p;
    *len = total;
    return 0;
}

void snapshot_seal(uint8_t *file, size_t len) {
    put_u64(file + len - 8, attn_checksum64(file, len - 8));
}

static int fail(int code, char *msg, size_t msg_size, const char *text) {
    snprintf(msg, msg_size, "%s", text);
    return code;
}

int snapshot_read_header(const uint8_t *p, size_t len, struct snapshot_info *info, char *msg,
                         size_t msg_size) {
    if (len == 0) {
        return fail(ERROR_CORRUPT_SESSION, msg, msg_size, "the session file is empty (torn?)");
    }
    if (len < sizeof magic || memcmp(p, magic, sizeof magic) != 0) {
        return fail(ERROR_CORRUPT_SESSION, msg, msg_size,
                    "not an attnd session file (its first bytes are not \"ATTNDSES\")");
    }
    if (len < SNAPSHOT_HEADER_BYTES) {
        return fail(ERROR_CORRUPT_SESSION, msg, msg_size,
                    "the session file is torn: it ends inside its header");
    }
    memset(info, 0, sizeof *info);
    info->version = get_u32(p + 8);
    if (info->version > SNAPSHOT_VERSION || info->version == 0) {
        snprintf(msg, msg_size,
                 "the session file's format version is %u; this attnd reads versions 1 to %d",
                 (unsigned)info->version, SNAPSHOT_VERSION);
        return info->version == 0 ? ERROR_CORRUPT_SESSION : ERROR_SESSION_VERSION;
    }
    uint32_t header_bytes = get_u32(p + 12), id_len = get_u32(p + 52);
    memcpy(info->fingerprint, p + 16, ATTN_FINGERPRINT_BYTES);
    info->kv_dtype = (attn_dtype)get_u32(p + 48);
    info->n_sections = (int32_t)get_u32(p + 56);
    info->n_tokens = (int32_t)get_u32(p + 60);
    info->file_bytes = get_u64(p + 64);
    info->saved_unix_ms = (int64_t)get_u64(p + 72);
    uint32_t flags = get_u32(p + 80);
    info->config_digest = get_u64(p + 84);
    info->layer_first = p[92] | p[93] << 8;
    info->layer_count = p[94];
    info->weights_dtype = (attn_dtype)p[95];
    info->has_queries = (flags & SNAPSHOT_FLAG_QUERIES) != 0;
    /* a cache's dtype is a concrete one (never AUTO); another code is damage, not another model */
    attn_dtype dt = info->kv_dtype;
    bool is_dtype = dt == ATTN_DTYPE_F32 || dt == ATTN_DTYPE_BF16 || dt == ATTN_DTYPE_F16 ||
                    dt == ATTN_DTYPE_Q8_0;
    if (!is_dtype || header_bytes != SNAPSHOT_HEADER_BYTES || id_len == 0 ||
        id_len > API_SESSION_ID_MAX || info->n_sections < 1 || info->n_tokens < 0 ||
        (flags & ~SNAPSHOT_FLAG_QUERIES) != 0) {
        return fail(ERROR_CORRUPT_SESSION, msg, msg_size, "the session file's header is corrupt");
    }
    if (len < SNAPSHOT_HEADER_BYTES + id_len) {
        return fail(ERROR_CORRUPT_SESSION, msg, msg_size,
                    "the session file ends inside its header");
    }
    memcpy(info->id, p + SNAPSHOT_HEADER_BYTES, id_len);
    info->id[id_len] = '\0';
    if (!api_session_id_is_valid(info->id, id_len)) {
        return fail(ERROR_CORRUPT_SESSION, msg, msg_size,
                    "the session file's id is not a valid session id");
    }
    for (size_t i = SNAPSHOT_HEADER_BYTES + id_len;
         i < SNAPSHOT_HEADER_BYTES + pad8(id_len) && i < len; i++) {
        if (p[i] != 0) { /* the format pads the id with zeros */
            return fail(ERROR_CORRUPT_SESSION, msg, msg_size,
                        "the session file's id padding is not zero");
        }
    }
    return 0;
}

/* Walks the sections of a checked-length file: calls fn for each (if not NULL). Returns 0, or
 * ERROR_CORRUPT_SESSION if their framing does not add up to the file, or fn's code. */
static int walk_sections(const uint8_t *p, size_t len, const struct snapshot_info *info,
                         int (*fn)(void *ctx, int kind, int32_t layer, const uint8_t *payload,
                                   size_t n),
                         void *ctx, char *msg, size_t msg_size) {
    size_t at = SNAPSHOT_HEADER_BYTES + pad8(strlen(info->id));
    size_t end = len - 8;
    for (int32_t i = 0; i < info->n_sections; i++) {
        if (end - at < SECTION_HEAD_BYTES || at > end) {
            return fail(ERROR_CORRUPT_SESSION, msg, msg_size,
                        "the session file's sections overrun it");
        }
        uint32_t kind = get_u32(p + at);
        int32_t layer = (int32_t)get_u32(p + at + 4);
        uint64_t n = get_u64(p + at + 8);
        at += SECTION_HEAD_BYTES;
        if (kind > SECTION_CROSS || n > end - at || pad8(n) > end - at) {
            return fail(ERROR_CORRUPT_SESSION, msg, msg_size,
                        "a section of the session file is corrupt");
        }
        int rc = fn != NULL ? fn(ctx, (int)kind, layer, p + at, n) : 0;
        if (rc != 0) {
            return rc;
        }
        at += pad8(n);
    }
    if (at != end) {
        return fail(ERROR_CORRUPT_SESSION, msg, msg_size,
                    "the session file's sections do not fill it");
    }
    return 0;
}

int snapshot_check(const uint8_t *p, size_t len, struct snapshot_info *info, char *msg,
                   size_t msg_size) {
    int rc = snapshot_read_header(p, len, info, msg, msg_size);
    if (rc != 0) {
        return rc;
    }
    if (info->file_bytes != len || len < SNAPSHOT_MIN_BYTES) {
        snprintf(msg, msg_size, "the session file is %zu bytes; its header says %llu (torn?)", len,
                 (unsigned long long)info->file_bytes);
        return ERROR_CORRUPT_SESSION;
    }
    if (get_u64(p + len - 8) != attn_checksum64(p, len - 8)) {
        return fail(ERROR_CORRUPT_SESSION, msg, msg_size,
                    "the session file fails its checksum (corrupt or altered)");
    }
    return walk_sections(p, len, info, NULL, NULL, msg, msg_size);
}

void snapshot_fingerprint_hex(const uint8_t fp[ATTN_FINGERPRINT_BYTES],
                              char out[SNAPSHOT_FINGERPRINT_HEX]) {
    for (int i = 0; i < ATTN_FINGERPRINT_BYTES; i++) {
        snprintf(out + 2 * i, 3, "%02x", fp[i]);
    }
}

int snapshot_match(const struct snapshot_info *info, const attn_model *m, struct snapshot_kv kv,
                   char *msg, size_t msg_size) {
    uint8_t fp[ATTN_FINGERPRINT_BYTES];
    attn_model_fingerprint(m, fp);
    if (memcmp(fp, info->fingerprint, sizeof fp) != 0) {
        char want[SNAPSHOT_FINGERPRINT_HEX], got[SNAPSHOT_FINGERPRINT_HEX];
        snapshot_fingerprint_hex(fp, want);
        snapshot_fingerprint_hex(info->fingerprint, got);
        int32_t first = attn_model_layer_first(m), count = attn_model_layer_count(m);
        attn_dtype wdt = attn_model_weights_dtype(m);
        char why[200];
        if (info->config_digest == 0) {
            snprintf(why, sizeof why, "another config, weights, weights dtype or layer range");
        } else if (info->config_digest != attn_model_config_digest(m)) {
            snprintf(why, sizeof why,
                     "another attention config: family, geometry, RoPE, window or maximum "
                     "sequence length (--max-seq)");
        } else if (info->layer_first != first || info->layer_count != (count < 255 ? count : 255)) {
            snprintf(why, sizeof why,
                     "the layers %d..%d, where this server holds %d..%d (--layers)",
                     (int)info->layer_first, (int)(info->layer_first + info->layer_count - 1),
                     (int)first, (int)(first + count - 1));
        } else if (info->weights_dtype != wdt) {
            snprintf(why, sizeof why,
                     "weights held as %s, where this server holds them as %s (--weights-dtype)",
                     attn_dtype_name(info->weights_dtype), attn_dtype_name(wdt));
        } else {
            snprintf(why, sizeof why,
                     "other weights with the same config (another checkpoint, or --seed)");
        }
        snprintf(msg, msg_size,
                 "fingerprint: the session was saved by model %.16s..., this server runs %.16s...: "
                 "%s",
                 got, want, why);
        return ERROR_FINGERPRINT_MISMATCH;
    }
    if (info->kv_dtype != kv.dtype) {
        snprintf(msg, msg_size, "kv_dtype: the session holds %s K/V, this server's pool holds %s",
                 attn_dtype_name(info->kv_dtype), attn_dtype_name(kv.dtype));
        return ERROR_FINGERPRINT_MISMATCH;
    }
    if (info->has_queries != kv.has_queries) {
        snprintf(msg, msg_size,
                 "queries: the session's caches %s their tokens' queries, this server's %s "
                 "(--keep-queries)",
                 info->has_queries ? "keep" : "do not keep", kv.has_queries ? "do" : "do not");
        return ERROR_FINGERPRINT_MISMATCH;
    }
    return 0;
}

/* ---- restore -------------------------------------------------------------------------------- */

struct restore {
    struct session_store *st;
    struct session_turn *t;
    int32_t blocks; /* summed by the first walk */
    char *msg;
    size_t msg_size;
};

/* Why the engine refuses a section, as a file error. */
static int section_error(struct restore *r, int rc, int32_t layer) {
    if (rc == ATTN_EUNSUPPORTED || rc == ATTN_EINVAL) {
        snprintf(r->msg, r->msg_size,
                 "layer %d: this server does not hold that layer with the saved shape, window "
                 "or kind, or with queries kept as the file has them or not (--keep-queries)",
                 (int)layer);
        return ERROR_FINGERPRINT_MISMATCH;
    }
    if (rc == ATTN_EDROPPED) {
        snprintf(r->msg, r->msg_size,
                 "layer %d: a sliding window's cache saved with another --kv-block-tokens (its "
                 "first token held does not start a block of this server's)",
                 (int)layer);
        return ERROR_FINGERPRINT_MISMATCH;
    }
    if (rc == ATTN_ENOSPC) {
        return fail(ERROR_KV_BUDGET_EXHAUSTED, r->msg, r->msg_size,
                    "the KV pool cannot hold the session even after evicting idle sessions");
    }
    if (rc == ATTN_ENOMEM) {
        return fail(ATTN_ENOMEM, r->msg, r->msg_size, "out of memory");
    }
    snprintf(r->msg, r->msg_size, "layer %d: the saved cache is inconsistent", (int)layer);
    return ERROR_CORRUPT_SESSION;
}

static int count_blocks(void *ctx, int kind, int32_t layer, const uint8_t *payload, size_t n) {
    struct restore *r = ctx;
    const attn_model *m = session_store_model(r->st);
    const attn_config *c = attn_model_config(m);
    /* a layer no model of this fingerprint has, or a context on a linear layer (which never
     * takes one), is damage: no server wrote it */
    if (layer < 0 || layer >= c->n_layers ||
        (kind == SECTION_CROSS && attn_config_layer_is_linear(c, layer))) {
        snprintf(r->msg, r->msg_size, "layer %d: the saved %s is inconsistent", (int)layer,
                 kind == SECTION_CROSS ? "context" : "cache");
        return ERROR_CORRUPT_SESSION;
    }
    if (layer < attn_model_layer_first(m) ||
        layer >= attn_model_layer_first(m) + attn_model_layer_count(m)) {
        return section_error(r, ATTN_EINVAL, layer);
    }
    int32_t b = attn_kv_import_blocks(session_store_kv_pool(r->st),
                                      kind == SECTION_SELF ? layer : -1, payload, n);
    if (b < 0) {
        return section_error(r, b, layer);
    }
    r->blocks += b;
    return 0;
}

static int import_section(void *ctx, int kind, int32_t layer, const uint8_t *payload, size_t n) {
    struct restore *r = ctx;
    if (section_kv(session_turn_session(r->t), layer, kind) != NULL) {
        snprintf(r->msg, r->msg_size, "layer %d appears twice in the session file", (int)layer);
        return ERROR_CORRUPT_SESSION;
    }
    attn_kv *kv = NULL;
    /* a context is a plain cache (attn_kv_create's), whatever the layer's own kind */
    int rc = attn_kv_import(session_store_kv_pool(r->st), kind == SECTION_SELF ? layer : -1,
                            payload, n, &kv);
    if (rc != ATTN_OK) {
        return section_error(r, rc, layer);
    }
    if (kind == SECTION_SELF) {
        session_kv_install(r->t, layer, kv);
    } else {
        session_cross_install(r->t, layer, kv);
    }
    return 0;
}

int snapshot_restore(struct session_store *st, struct session_turn *t, const uint8_t *p, size_t len,
                     char *msg, size_t msg_size) {
    struct snapshot_info info;
    int rc = snapshot_read_header(p, len, &info, msg, msg_size);
    if (rc != 0) {
        return rc;
    }
    struct restore r = {st, t, 0, msg, msg_size};
    /* Every section is checked and counted before any is made, and the room is made for all of
     * them at once, so a refusal leaves nobody evicted. Duplicates are caught by the second walk
     * (the first one sees no caches); a refusal there frees what it made. */
    rc = walk_sections(p, len, &info, count_blocks, &r, msg, msg_size);
    if (rc == 0) {
        rc = session_store_make_room(st, r.blocks, session_turn_session(t));
        if (rc != 0) {
            return section_error(&r, ATTN_ENOSPC, -1);
        }
        rc = walk_sections(p, len, &info, import_section, &r, msg, msg_size);
    }
    if (rc == 0 && session_n_tokens(session_turn_session(t)) != info.n_tokens) {
        /* the header's count is what GET /v1/sessions shows of a session on disk */
        snprintf(msg, msg_size, "the session file's header says %d tokens, its caches hold %d",
                 (int)info.n_tokens, (int)session_n_tokens(session_turn_session(t)));
        rc = ERROR_CORRUPT_SESSION;
    }
    if (rc != 0) {
        session_clear(st, t);
    }
    return rc;
}
