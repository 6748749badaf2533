/* engine/hf_load.c: loads a Hugging Face style folder (config.json + safetensors, single or
 * sharded) into an attn_model. This is the only engine file that parses JSON: it links cJSON,
 * already a project dependency, rather than a hand-rolled parser, and nothing cJSON-shaped leaves
 * this file. config.json and each safetensors header are parsed from memory (attn_int.h), so the
 * fuzz targets reach the same code as a load. Only the attention tensors of the requested layers
 * are read; F16 and BF16 are converted to float once, here. */
#include "hf_int.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "safetensors data is little-endian; this loader reads it in place"
#endif

#define MAX_JSON_BYTES (100u << 20) /* the safetensors spec caps headers at 100 MB */
#define MAX_SHARDS     256

typedef enum dtype { DTYPE_F32, DTYPE_F16, DTYPE_BF16 } dtype;

/* Everything one load needs; freed on one path in attn_model_load_hf. */
struct loader {
    const char *dir;
    struct attn__reason why;
    cJSON *weight_map; /* borrowed from index_json, or NULL for a single file */
    cJSON *index_json;
    char *shard_names[MAX_SHARDS]; /* file names, relative to dir */
    struct attn__st_header shard_headers[MAX_SHARDS];
    int n_shards;
    const char *prefix; /* the one of layout->prefixes the checkpoint uses */
    const struct attn__hf_layout *layout;
    void *convert_buf; /* reused buffer for F16/BF16 bytes */
    size_t convert_cap;
    /* The dtype of the projection weights read (ATTN_DTYPE_AUTO before the first, F32 once two
     * differ): what ATTN_DTYPE_AUTO holds them in. */
    attn_dtype weights_dtype;
};

static int path_join(struct loader *ld, const char *name, char *out, size_t size) {
    int n = snprintf(out, size, "%s/%s", ld->dir, name);
    if (n < 0 || (size_t)n >= size) {
        return attn__fail(&ld->why, ATTN_EIO, "path too long: %s/%s", ld->dir, name);
    }
    return ATTN_OK;
}

/* Reads the next n bytes of f into a new NUL-terminated buffer (for JSON text). */
static int read_bytes(struct loader *ld, FILE *f, size_t n, const char *path, char **out) {
    char *buf = malloc(n + 1);
    if (buf == NULL) {
        return attn__fail(&ld->why, ATTN_ENOMEM, "%s: out of memory for its %zu bytes", path, n);
    }
    if (fread(buf, 1, n, f) != n) {
        free(buf);
        return attn__fail(&ld->why, ATTN_EIO, "%s: short read", path);
    }
    buf[n] = '\0';
    *out = buf;
    return ATTN_OK;
}

/* Reads a whole (small) file into a NUL-terminated buffer of *len bytes before the NUL. */
static int read_text(struct loader *ld, const char *name, char **out, size_t *len) {
    char path[4096];
    int rc = path_join(ld, name, path, sizeof path);
    if (rc != ATTN_OK) {
        return rc;
    }
    FILE *f = fopen(path, "rb");
    if (f == NULL) {
        return attn__fail(&ld->why, ATTN_EIO, "cannot open %s: %s", path, strerror(errno));
    }
    if (fseek(f, 0, SEEK_END) != 0) {
        rc = attn__fail(&ld->why, ATTN_EIO, "%s: cannot seek", path);
        goto out;
    }
    long size = ftell(f);
    if (size < 0 || (unsigned long)size > MAX_JSON_BYTES || fseek(f, 0, SEEK_SET) != 0) {
        rc = attn__fail(&ld->why, ATTN_EIO, "%s: unreadable or larger than 100 MB", path);
        goto out;
    }
    if ((rc = read_bytes(ld, f, (size_t)size, path, out)) == ATTN_OK) {
        *len = (size_t)size;
    }
out:
    fclose(f);
    return rc;
}

static int parse_json_file(struct loader *ld, const char *name, cJSON **out) {
    char *text = NULL;
    size_t len = 0;
    int rc = read_text(ld, name, &text, &len);
    if (rc != ATTN_OK) {
        return rc;
    }
    const char *problem = NULL;
    cJSON *j = attn__hf_json_object(text, len, &problem);
    free(text);
    if (j == NULL) {
        return attn__fail(&ld->why, problem == attn__hf_json_no_memory ? ATTN_ENOMEM : ATTN_EIO,
                          "%s/%s: %s", ld->dir, name, problem);
    }
    *out = j;
    return ATTN_OK;
}

/* ---- safetensors headers -------------------------------------------------------------------- */

/* The header's byte count: the file's first 8 bytes, little-endian. It must be > 0, within the
 * spec's 100 MB and within the file. */
static int header_length(const struct attn__reason *why, const uint8_t *first8, uint64_t file_size,
                         uint64_t *out) {
    uint64_t n = 0;
    for (int b = 7; b >= 0; b--) {
        n = n << 8 | first8[b];
    }
    if (file_size < 8 || n == 0 || n > MAX_JSON_BYTES || n > file_size - 8) {
        return attn__fail(why, ATTN_EIO, "bad safetensors header length %llu",
                          (unsigned long long)n);
    }
    *out = n;
    return ATTN_OK;
}

/* A JSON number that is a whole number in [0, 2^53], the range a double holds exactly, so that
 * the integer conversion below is always defined. */
static bool get_count(const cJSON *v, uint64_t *out) {
    if (!cJSON_IsNumber(v) || !(v->valuedouble >= 0 && v->valuedouble <= 9007199254740992.0) ||
        v->valuedouble != floor(v->valuedouble)) {
        return false;
    }
    *out = (uint64_t)v->valuedouble;
    return true;
}

/* One entry, {"dtype": "F32", "shape": [2, 3], "data_offsets": [begin, end]}, whose byte range
 * must lie inside a data section of data_bytes. The dtype is kept as written: a checkpoint may
 * hold tensors of types attnd never reads. */
static int parse_tensor(const struct attn__reason *why, const cJSON *e, uint64_t data_bytes,
                        struct attn__st_tensor *t) {
    const cJSON *dt = NULL, *shape = NULL, *offs = NULL;
    if (cJSON_IsObject(e)) {
        dt = cJSON_GetObjectItemCaseSensitive(e, "dtype");
        shape = cJSON_GetObjectItemCaseSensitive(e, "shape");
        offs = cJSON_GetObjectItemCaseSensitive(e, "data_offsets");
    }
    if (!cJSON_IsString(dt) || !cJSON_IsArray(shape) || !cJSON_IsArray(offs) ||
        cJSON_GetArraySize(offs) != 2) {
        return attn__fail(
            why, ATTN_EIO,
            "safetensors header: %s needs a dtype, a shape and data_offsets [begin, end]",
            e->string);
    }
    memset(t, 0, sizeof *t);
    snprintf(t->dtype, sizeof t->dtype, "%s", dt->valuestring);
    const cJSON *d;
    cJSON_ArrayForEach(d, shape) {
        if (t->n_dims == ATTN__ST_MAX_DIMS || !get_count(d, &t->shape[t->n_dims])) {
            return attn__fail(why, ATTN_EIO,
                              "safetensors header: %s: shape must be at most %d whole numbers",
                              e->string, ATTN__ST_MAX_DIMS);
        }
        t->n_dims++;
    }
    if (!get_count(offs->child, &t->begin) || !get_count(offs->child->next, &t->end) ||
        t->begin > t->end || t->end > data_bytes) {
        return attn__fail(why, ATTN_EIO,
                          "safetensors header: %s: data_offsets are not a range within the file's "
                          "%llu data bytes (truncated file?)",
                          e->string, (unsigned long long)data_bytes);
    }
    t->name = strdup(e->string);
    return t->name != NULL ? ATTN_OK : ATTN_ENOMEM;
}

static int by_begin(const void *a, const void *b) {
    const struct attn__st_tensor *x = *(const struct attn__st_tensor *const *)a;
    const struct attn__st_tensor *y = *(const struct attn__st_tensor *const *)b;
    return x->begin < y->begin   ? -1
           : x->begin > y->begin ? 1
                                 : (x->end > y->end) - (x->end < y->end);
}

static int by_name(const void *a, const void *b) {
    return strcmp((*(const struct attn__st_tensor *const *)a)->name,
                  (*(const struct attn__st_tensor *const *)b)->name);
}

/* A header names each tensor once and gives each bytes of its own (the format lays them end to
 * end; the safetensors library refuses overlaps): a repeated name or shared bytes would make
 * which weights are read depend on the reader. */
static int check_layout(const struct attn__reason *why, const struct attn__st_header *h) {
    if (h->n_tensors < 2) {
        return ATTN_OK;
    }
    const struct attn__st_tensor **order = malloc((size_t)h->n_tensors * sizeof *order);
    if (order == NULL) {
        return ATTN_ENOMEM;
    }
    for (int32_t i = 0; i < h->n_tensors; i++) {
        order[i] = &h->tensors[i];
    }
    int rc = ATTN_OK;
    qsort(order, (size_t)h->n_tensors, sizeof *order, by_name);
    for (int32_t i = 1; i < h->n_tensors && rc == ATTN_OK; i++) {
        if (strcmp(order[i - 1]->name, order[i]->name) == 0) {
            rc = attn__fail(why, ATTN_EIO, "safetensors header: %s is named twice", order[i]->name);
        }
    }
    qsort(order, (size_t)h->n_tensors, sizeof *order, by_begin);
    for (int32_t i = 1; i < h->n_tensors && rc == ATTN_OK; i++) {
        if (order[i]->begin < order[i - 1]->end) {
            rc = attn__fail(why, ATTN_EIO,
                            "safetensors header: the data of %s and %s overlap (bytes %llu..%llu "
                            "and %llu..%llu)",
                            order[i - 1]->name, order[i]->name,
                            (unsigned long long)order[i - 1]->begin,
                            (unsigned long long)order[i - 1]->end,
                            (unsigned long long)order[i]->begin, (unsigned long long)order[i]->end);
        }
    }
    free(order);
    return rc;
}

/* Parses a safetensors header; see attn_int.h. */
int attn__safetensors_header_parse(const uint8_t *buf, size_t len, uint64_t file_size,
                                   struct attn__st_header *out, char *err, size_t err_size) {
    const struct attn__reason why = {err, err_size};
    uint64_t n = 0;
    if (len < 8 || file_size < len) {
        return attn__fail(&why, ATTN_EIO, "too short for a safetensors file");
    }
    int rc = header_length(&why, buf, file_size, &n);
    if (rc != ATTN_OK) {
        return rc;
    }
    if (n > len - 8) {
        return attn__fail(&why, ATTN_EIO, "safetensors header: %llu bytes, only %zu given",
                          (unsigned long long)n, len - 8);
    }
    struct attn__st_header h = {8 + n, file_size - 8 - n, NULL, 0};
    const char *problem = NULL;
    cJSON *j = attn__hf_json_object((const char *)buf + 8, (size_t)n, &problem);
    if (j == NULL) {
        rc = attn__fail(&why, problem == attn__hf_json_no_memory ? ATTN_ENOMEM : ATTN_EIO,
                        "safetensors header: %s", problem);
        goto out;
    }
    size_t cap = 0;
    const cJSON *e;
    cJSON_ArrayForEach(e, j) {
        if (strcmp(e->string, "__metadata__") == 0) {
            continue;
        }
        if ((size_t)h.n_tensors == cap) {
            size_t new_cap = cap ? 2 * cap : 16;
            struct attn__st_tensor *t = realloc(h.tensors, new_cap * sizeof *t);
            if (t == NULL) {
                rc = ATTN_ENOMEM;
                goto out;
            }
            h.tensors = t;
            cap = new_cap;
        }
        if ((rc = parse_tensor(&why, e, h.data_bytes, &h.tensors[h.n_tensors])) != ATTN_OK) {
            goto out;
        }
        h.n_tensors++;
    }
    if ((rc = check_layout(&why, &h)) != ATTN_OK) {
        goto out;
    }
    *out = h;
    h.tensors = NULL;
    h.n_tensors = 0;
    rc = ATTN_OK;
out:
    cJSON_Delete(j);
    attn__safetensors_header_release(&h);
    return rc;
}

void attn__safetensors_header_release(struct attn__st_header *h) {
    if (h == NULL) {
        return;
    }
    for (int32_t i = 0; i < h->n_tensors; i++) {
        free(h->tensors[i].name);
    }
    free(h->tensors);
    h->tensors = NULL;
    h->n_tensors = 0;
}

const struct attn__st_tensor *attn__safetensors_tensor_find(const struct attn__st_header *h,
                                                            const char *name) {
    for (int32_t i = 0; i < h->n_tensors; i++) {
        if (strcmp(h->tensors[i].name, name) == 0) {
            return &h->tensors[i];
        }
    }
    return NULL;
}

/* ---- safetensors files ---------------------------------------------------------------------- */

static int shard_index(struct loader *ld, const char *name) {
    for (int i = 0; i < ld->n_shards; i++) {
        if (strcmp(ld->shard_names[i], name) == 0) {
            return i;
        }
    }
    return -1;
}

/* Opens shard `name` once: reads its 8-byte header length and its header, and parses that. */
static int shard_open(struct loader *ld, const char *name, int *out) {
    int i = shard_index(ld, name);
    if (i >= 0) {
        *out = i;
        return ATTN_OK;
    }
    if (ld->n_shards == MAX_SHARDS || strchr(name, '/') != NULL) {
        return attn__fail(&ld->why, ATTN_EIO, "bad or too many shard files (%s)", name);
    }
    char path[4096];
    int rc = path_join(ld, name, path, sizeof path);
    if (rc != ATTN_OK) {
        return rc;
    }
    FILE *f = fopen(path, "rb");
    if (f == NULL) {
        return attn__fail(&ld->why, ATTN_EIO, "cannot open %s: %s", path, strerror(errno));
    }
    struct stat st;
    uint8_t *head = NULL;
    uint8_t first8[8];
    uint64_t n = 0;
    char why[512] = "";
    const struct attn__reason here = {why, sizeof why};
    if (fstat(fileno(f), &st) != 0 || st.st_size < 8 || fread(first8, 1, 8, f) != 8) {
        rc = attn__fail(&ld->why, ATTN_EIO, "%s: too short for a safetensors file", path);
        goto out;
    }
    if ((rc = header_length(&here, first8, (uint64_t)st.st_size, &n)) != ATTN_OK) {
        goto out_why;
    }
    /* 8 + n bytes, plus a NUL that cJSON never needs but that bounds any reader of the text. */
    if ((head = malloc(8 + (size_t)n + 1)) == NULL) {
        rc = attn__fail(&ld->why, ATTN_ENOMEM, "%s: out of memory for its %llu-byte header", path,
                        (unsigned long long)n);
        goto out;
    }
    memcpy(head, first8, 8);
    if (fread(head + 8, 1, (size_t)n, f) != n) {
        rc = attn__fail(&ld->why, ATTN_EIO, "%s: short read", path);
        goto out;
    }
    head[8 + n] = '\0';
    i = ld->n_shards;
    rc = attn__safetensors_header_parse(head, 8 + (size_t)n, (uint64_t)st.st_size,
                                        &ld->shard_headers[i], why, sizeof why);
    if (rc != ATTN_OK) {
        goto out_why;
    }
    if ((ld->shard_names[i] = strdup(name)) == NULL) {
        attn__safetensors_header_release(&ld->shard_headers[i]);
        rc = attn__fail(&ld->why, ATTN_ENOMEM, "%s: out of memory", path);
        goto out;
    }
    ld->n_shards++;
    *out = i;
    goto out;
out_why:
    /* the header parser gives no reason when it runs out of memory: the code's own then (an
     * empty one left "<path>: " as the whole line, found by an outside audit's allocation
     * failures) */
    attn__fail(&ld->why, rc, "%s: %s", path, why[0] != '\0' ? why : attn_strerror(rc));
out:
    free(head);
    fclose(f);
    return rc;
}

/* Finds a tensor's header entry; NULL (not an error) when the checkpoint has no such tensor. */
static int tensor_find(struct loader *ld, const char *name, int *shard,
                       const struct attn__st_tensor **entry) {
    const char *file = "model.safetensors";
    if (ld->weight_map != NULL) {
        const cJSON *f = cJSON_GetObjectItemCaseSensitive(ld->weight_map, name);
        if (f == NULL) {
            *entry = NULL;
            return ATTN_OK;
        }
        if (!cJSON_IsString(f)) {
            return attn__fail(&ld->why, ATTN_EIO, "weight_map entry for %s is not a file name",
                              name);
        }
        file = f->valuestring;
    }
    int rc = shard_open(ld, file, shard);
    if (rc != ATTN_OK) {
        return rc;
    }
    *entry = attn__safetensors_tensor_find(&ld->shard_headers[*shard], name);
    if (*entry == NULL && ld->weight_map != NULL) {
        return attn__fail(&ld->why, ATTN_EIO, "%s: listed in the index but missing from %s", name,
                          file);
    }
    return ATTN_OK;
}

static int parse_dtype(struct loader *ld, const struct attn__st_tensor *t, dtype *out,
                       size_t *elem) {
    if (strcmp(t->dtype, "F32") == 0) {
        *out = DTYPE_F32;
        *elem = 4;
    } else if (strcmp(t->dtype, "F16") == 0) {
        *out = DTYPE_F16;
        *elem = 2;
    } else if (strcmp(t->dtype, "BF16") == 0) {
        *out = DTYPE_BF16;
        *elem = 2;
    } else {
        return attn__fail(&ld->why, ATTN_EUNSUPPORTED,
                          "%s: dtype %s is not supported (F32, F16, BF16 are)", t->name, t->dtype);
    }
    return ATTN_OK;
}

/* IEEE binary16 to float, including subnormals, infinities and NaN. */
static float half_to_float(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000) << 16;
    uint32_t exp = (h >> 10) & 0x1f, man = h & 0x3ff, bits;
    if (exp == 0x1f) {
        bits = sign | 0x7f800000u | (man << 13);
    } else if (exp != 0) {
        bits = sign | ((exp + 112) << 23) | (man << 13);
    } else if (man == 0) {
        bits = sign;
    } else {
        /* subnormal: value = man * 2^-24, exactly representable in float */
        float v = (float)man * 5.9604644775390625e-08f;
        return sign ? -v : v;
    }
    float f;
    memcpy(&f, &bits, sizeof f);
    return f;
}

static float bf16_to_float(uint16_t h) {
    uint32_t bits = (uint32_t)h << 16;
    float f;
    memcpy(&f, &bits, sizeof f);
    return f;
}

/* The header's shape of tensor t must be [rows, cols] ([rows] when cols is 0). */
static int check_shape(struct loader *ld, const struct attn__st_tensor *t, int32_t rows,
                       int32_t cols) {
    int32_t want_dims = cols > 0 ? 2 : 1;
    if (t->n_dims == want_dims && t->shape[0] == (uint64_t)rows &&
        (cols == 0 || t->shape[1] == (uint64_t)cols)) {
        return ATTN_OK;
    }
    char got[ATTN__ST_MAX_DIMS * 24 + 3] = "[";
    for (int32_t i = 0; i < t->n_dims; i++) {
        size_t used = strlen(got);
        snprintf(got + used, sizeof got - used, "%s%llu", i ? ", " : "",
                 (unsigned long long)t->shape[i]);
    }
    strcat(got, "]");
    if (cols > 0) {
        return attn__fail(&ld->why, ATTN_ESHAPE, "%s: shape %s, expected [%d, %d] from config.json",
                          t->name, got, rows, cols);
    }
    return attn__fail(&ld->why, ATTN_ESHAPE, "%s: shape %s, expected [%d] from config.json",
                      t->name, got, rows);
}

/* Reads tensor `name` of shape (rows[, cols]) (cols 0: a vector) into dst as float. */
/* A NaN or infinity in an attention tensor would make every answer null: refused by name. */
static int check_finite(struct loader *ld, const char *name, const float *x, size_t n,
                        int32_t cols) {
    for (size_t i = 0; i < n; i++) {
        if (!isfinite(x[i])) {
            size_t c = cols > 0 ? (size_t)cols : 1;
            return attn__fail(&ld->why, ATTN_EIO,
                              "%s: value %g at row %zu, column %zu is not finite", name,
                              (double)x[i], i / c, i % c);
        }
    }
    return ATTN_OK;
}

static int tensor_read(struct loader *ld, const char *name, int32_t rows, int32_t cols,
                       float *dst) {
    int shard;
    const struct attn__st_tensor *t = NULL;
    int rc = tensor_find(ld, name, &shard, &t);
    if (rc != ATTN_OK) {
        return rc;
    }
    if (t == NULL) {
        return attn__fail(&ld->why, ATTN_EIO, "tensor %s not found", name);
    }
    dtype dt = DTYPE_F32;
    size_t elem = 4;
    if ((rc = parse_dtype(ld, t, &dt, &elem)) != ATTN_OK) {
        return rc;
    }
    if (cols > 0) { /* a matrix: a projection's weights */
        attn_dtype held = dt == DTYPE_BF16  ? ATTN_DTYPE_BF16
                          : dt == DTYPE_F16 ? ATTN_DTYPE_F16
                                            : ATTN_DTYPE_F32;
        ld->weights_dtype = ld->weights_dtype == ATTN_DTYPE_AUTO || ld->weights_dtype == held
                                ? held
                                : ATTN_DTYPE_F32; /* mixed: float holds them all exactly */
    }
    if ((rc = check_shape(ld, t, rows, cols)) != ATTN_OK) {
        return rc;
    }
    /* The header checked that the range lies inside the file; it must also hold the shape. */
    size_t n = (size_t)rows * (cols > 0 ? (size_t)cols : 1);
    if (t->end - t->begin != n * elem) {
        return attn__fail(&ld->why, ATTN_EIO, "%s: data_offsets span %llu bytes, its shape %zu",
                          name, (unsigned long long)(t->end - t->begin), n * elem);
    }
    uint64_t start = ld->shard_headers[shard].data_start + t->begin;
    char path[4096];
    if ((rc = path_join(ld, ld->shard_names[shard], path, sizeof path)) != ATTN_OK) {
        return rc;
    }
    FILE *f = fopen(path, "rb");
    if (f == NULL) {
        return attn__fail(&ld->why, ATTN_EIO, "cannot open %s: %s", path, strerror(errno));
    }
    void *buf = dst;
    if (dt != DTYPE_F32) {
        if (ld->convert_cap < n * elem) {
            free(ld->convert_buf);
            ld->convert_buf = malloc(n * elem);
            ld->convert_cap = ld->convert_buf ? n * elem : 0;
            if (ld->convert_buf == NULL) {
                fclose(f);
                return attn__fail(&ld->why, ATTN_ENOMEM,
                                  "%s: out of memory converting its %zu bytes", name, n * elem);
            }
        }
        buf = ld->convert_buf;
    }
    rc = ATTN_OK;
    if (fseeko(f, (off_t)start, SEEK_SET) != 0 || fread(buf, elem, n, f) != n) {
        rc = attn__fail(&ld->why, ATTN_EIO, "%s: short read from %s", name, path);
    }
    fclose(f);
    if (rc != ATTN_OK) {
        return rc;
    }
    if (dt != DTYPE_F32) {
        const uint16_t *h = buf;
        for (size_t i = 0; i < n; i++) {
            dst[i] = dt == DTYPE_F16 ? half_to_float(h[i]) : bf16_to_float(h[i]);
        }
    }
    return check_finite(ld, name, dst, n, cols);
}

static int tensor_exists(struct loader *ld, const char *name, bool *out) {
    int shard;
    const struct attn__st_tensor *t = NULL;
    int rc = tensor_find(ld, name, &shard, &t);
    if (rc == ATTN_OK) {
        *out = t != NULL;
    }
    return rc;
}

/* The first of the family's prefixes under which the checkpoint holds this layer. */
static int pick_prefix(struct loader *ld, int32_t layer) {
    const char *const *prefixes = ld->layout->prefixes;
    for (size_t i = 0; i < 3 && prefixes[i] != NULL; i++) {
        char name[256];
        snprintf(name, sizeof name, "%s.%d.%s.%s", prefixes[i], layer, ld->layout->attn_name,
                 attn__hf_layout_first_tensor(ld->layout));
        bool found = false;
        int rc = tensor_exists(ld, name, &found);
        if (rc != ATTN_OK) {
            return rc;
        }
        if (found) {
            ld->prefix = prefixes[i];
            return ATTN_OK;
        }
    }
    return attn__fail(&ld->why, ATTN_EIO, "tensor %s.%d.%s.%s not found", prefixes[0], layer,
                      ld->layout->attn_name, attn__hf_layout_first_tensor(ld->layout));
}

static int reader_read(void *ctx, const char *name, int32_t rows, int32_t cols, float *dst) {
    return tensor_read(ctx, name, rows, cols, dst);
}

static int read_layer(struct loader *ld, const attn_config *c, int32_t layer,
                      struct attn__layer *l) {
    const struct attn__hf_reader rd = {reader_read, ld};
    int rc = attn__hf_layer_read(&rd, c, ld->layout, ld->prefix, layer, l);
    if (rc == ATTN_ENOMEM && ld->why.text != NULL && ld->why.size > 0 && ld->why.text[0] == '\0') {
        /* its reordering buffer (a fused projection's) says nothing itself */
        return attn__fail(&ld->why, rc, "layer %d: out of memory reading its tensors", (int)layer);
    }
    return rc;
}

/* attnd's own layout: biases are what the checkpoint holds (q/k/v as a set, o alone). */
static int detect_biases(struct loader *ld, int32_t layer, bool wants_qkv_bias, attn_config *c) {
    char name[256];
    snprintf(name, sizeof name, "%s.%d.self_attn.q_proj.bias", ld->prefix, layer);
    int rc = tensor_exists(ld, name, &c->has_qkv_bias);
    if (rc != ATTN_OK) {
        return rc;
    }
    snprintf(name, sizeof name, "%s.%d.self_attn.o_proj.bias", ld->prefix, layer);
    if ((rc = tensor_exists(ld, name, &c->has_o_bias)) != ATTN_OK) {
        return rc;
    }
    if (wants_qkv_bias && !c->has_qkv_bias) {
        return attn__fail(&ld->why, ATTN_EIO,
                          "config.json sets attention_bias but %s.%d.self_attn.q_proj."
                          "bias is missing",
                          ld->prefix, layer);
    }
    return ATTN_OK;
}

/* ---- screening: every attention tensor is consumed --------------------------------------------
 */

/* A tensor named <prefix>.<layer>.<attn_name>.<suffix> must be one the engine consumes: anything
 * else there (q/k norms, sinks, a bias the family does not have) changes attention, and serving
 * the layer without it would be wrong. */
static int screen_tensor(struct loader *ld, const attn_config *c, const char *family,
                         const char *name) {
    size_t pl = strlen(ld->prefix);
    if (strncmp(name, ld->prefix, pl) != 0 || name[pl] != '.') {
        return ATTN_OK;
    }
    const char *p = name + pl + 1;
    const char *digits = p;
    while (*p >= '0' && *p <= '9') {
        p++;
    }
    const char *module = ld->layout->attn_name;
    size_t ml = strlen(module);
    if (p == digits || p[0] != '.' || strncmp(p + 1, module, ml) != 0 || p[1 + ml] != '.') {
        return ATTN_OK;
    }
    if (!attn__hf_tensor_is_consumed(c, ld->layout, p + 2 + ml)) {
        return attn__fail(&ld->why, ATTN_EUNSUPPORTED,
                          "tensor %s is not part of %s attention as attnd computes it; refused "
                          "rather than served without it",
                          name, family);
    }
    return ATTN_OK;
}

/* Screens every tensor of the checkpoint (the index's names, or the single file's header). */
static int screen_tensors(struct loader *ld, const attn_config *c, const char *family) {
    int rc = ATTN_OK;
    if (ld->weight_map != NULL) {
        const cJSON *e;
        cJSON_ArrayForEach(e, ld->weight_map) {
            if ((rc = screen_tensor(ld, c, family, e->string)) != ATTN_OK) {
                return rc;
            }
        }
        return ATTN_OK;
    }
    int shard;
    if ((rc = shard_open(ld, "model.safetensors", &shard)) != ATTN_OK) {
        return rc;
    }
    const struct attn__st_header *h = &ld->shard_headers[shard];
    for (int32_t i = 0; i < h->n_tensors && rc == ATTN_OK; i++) {
        rc = screen_tensor(ld, c, family, h->tensors[i].name);
    }
    return rc;
}

static void loader_release(struct loader *ld) {
    cJSON_Delete(ld->index_json);
    for (int i = 0; i < ld->n_shards; i++) {
        free(ld->shard_names[i]);
        attn__safetensors_header_release(&ld->shard_headers[i]);
    }
    free(ld->convert_buf);
}

static int open_index(struct loader *ld) {
    char path[4096];
    int rc = path_join(ld, "model.safetensors.index.json", path, sizeof path);
    if (rc != ATTN_OK) {
        return rc;
    }
    struct stat st;
    if (stat(path, &st) != 0) {
        return ATTN_OK; /* a single model.safetensors */
    }
    if ((rc = parse_json_file(ld, "model.safetensors.index.json", &ld->index_json)) != ATTN_OK) {
        return rc;
    }
    ld->weight_map = cJSON_GetObjectItemCaseSensitive(ld->index_json, "weight_map");
    if (!cJSON_IsObject(ld->weight_map)) {
        return attn__fail(&ld->why, ATTN_EIO, "model.safetensors.index.json: no weight_map object");
    }
    return ATTN_OK;
}

/* The model or a layer of it could not be allocated (rc). Shapes are checked as each tensor is
 * read, after this: name the sizes config.json asked for, since a wrong config is the likelier
 * cause than a small machine. */
static int cannot_allocate(struct loader *ld, const attn_config *cfg, const attn_load_params *p,
                           int32_t first, int rc) {
    return attn__fail(&ld->why, rc,
                      "cannot allocate the model config.json describes (hidden_size %d, %d heads "
                      "x %d, %d KV heads, %d layers to load, %d positions): %s",
                      cfg->hidden_size, cfg->n_heads, cfg->head_dim, cfg->n_kv_heads,
                      p != NULL && p->layer_count > 0 ? p->layer_count : cfg->n_layers - first,
                      p != NULL && p->max_seq > 0 ? p->max_seq : cfg->max_seq, attn_strerror(rc));
}

/* Whether held (BF16 or F16, for the projections) can hold every projection weight of layer i
 * (the model's i-th loaded layer): a finite weight past its range would become infinite, and
 * every answer null. Rounding (to nearest even, or to a subnormal or zero) is what converting
 * down means; overflow is refused, naming the weight. Latent attention's tensors stay float
 * whatever held is. */
static int check_holdable(struct loader *ld, const attn_model *m, int32_t i, attn_dtype held) {
    const attn_config *c = &m->cfg;
    const struct attn__layer *l = &m->layers[i];
    if ((held != ATTN_DTYPE_BF16 && held != ATTN_DTYPE_F16) || c->kv_lora_rank > 0) {
        return ATTN_OK;
    }
    bool is_bf16 = held == ATTN_DTYPE_BF16;
    int32_t hd = c->head_dim, q_rows = c->n_heads * hd, kv_rows = c->n_kv_heads * hd;
    size_t hidden = (size_t)c->hidden_size, n_qkv = (size_t)(q_rows + 2 * kv_rows) * hidden;
    size_t n_o = hidden * (size_t)q_rows;
    enum { CHUNK = 4096 };
    uint16_t chunk[CHUNK];
    for (int o = 0; o < 2; o++) {
        const float *w = o == 0 ? l->w_qkv : l->w_o;
        size_t n = o == 0 ? n_qkv : n_o, cols = o == 0 ? hidden : (size_t)q_rows;
        for (size_t k = 0; w != NULL && k < n; k++) {
            if (k % CHUNK == 0) {
                /* a chunk rounded at once; value by value only where some result is an infinity
                 * or NaN (a NaN weight stays NaN and passes, as below): value by value, a BF16
                 * checkpoint held as such spent about 0.3 s a Llama-3-8B layer here */
                size_t m_k = n - k < CHUNK ? n - k : CHUNK;
                if (!attn__half_round(held, w + k, m_k, chunk)) {
                    k += m_k - 1;
                    continue;
                }
            }
            uint16_t h = is_bf16 ? attn__f32_to_bf16(w[k]) : attn__f32_to_f16(w[k]);
            float back = is_bf16 ? attn__bf16_to_f32(h) : attn__f16_to_f32(h);
            if (!isinf(back)) {
                continue;
            }
            size_t row = k / cols;
            const char *which = o == 1                             ? "o_proj"
                                : row < (size_t)q_rows             ? "q_proj"
                                : row < (size_t)(q_rows + kv_rows) ? "k_proj"
                                                                   : "v_proj";
            size_t r = o == 1                             ? row
                       : row < (size_t)q_rows             ? row
                       : row < (size_t)(q_rows + kv_rows) ? row - (size_t)q_rows
                                                          : row - (size_t)(q_rows + kv_rows);
            return attn__fail(&ld->why, ATTN_ERANGE,
                              "--weights-dtype %s: layer %d's %s weight %g (row %zu, column "
                              "%zu) is past %s's range: serve it as %s",
                              attn_dtype_name(held), (int)(m->layer_first + i), which, (double)w[k],
                              r, k % cols, attn_dtype_name(held), is_bf16 ? "f32" : "bf16 or f32");
        }
    }
    return ATTN_OK;
}

/* Reads the model's layers, holding each in half precision as soon as it is read when the
 * weights are to be held so (the dtype asked for, or the checkpoint's own as read so far), so
 * that the load's peak is the half weights and one layer in float, not every layer in float
 * (5.4 GB for the 2.7 GB of a BF16 Llama-3-8B's 32 layers). A checkpoint that turns out mixed
 * (a later layer in another dtype) is held in float: the layers held so far go back, exactly. */
static int read_layers(struct loader *ld, attn_model *m, const attn_load_params *p) {
    attn_dtype asked = p != NULL ? p->weights_dtype : ATTN_DTYPE_AUTO;
    attn_dtype held_so_far = ATTN_DTYPE_AUTO;
    for (int32_t i = 0; i < m->layer_count; i++) {
        int rc = attn__model_alloc_layer(m, i);
        if (rc != ATTN_OK) {
            return cannot_allocate(ld, &m->cfg, p, m->layer_first, rc);
        }
        if ((rc = read_layer(ld, &m->cfg, m->layer_first + i, &m->layers[i])) != ATTN_OK) {
            return rc;
        }
        attn_dtype held = asked != ATTN_DTYPE_AUTO ? asked : ld->weights_dtype;
        if (held_so_far != ATTN_DTYPE_AUTO && held != held_so_far) {
            for (int32_t j = 0; j < i; j++) {
                if ((rc = attn__model_unhold_layer(m, j, held_so_far)) != ATTN_OK) {
                    return rc;
                }
            }
        }
        held_so_far = held;
        if ((rc = check_holdable(ld, m, i, held)) != ATTN_OK) {
            return rc;
        }
        if ((rc = attn__model_hold_layer(m, i, held)) != ATTN_OK) {
            return attn__fail(&ld->why, rc, "cannot hold the weights in half precision: %s",
                              attn_strerror(rc));
        }
    }
    return ATTN_OK;
}

int attn_model_load_hf(const char *dir, const attn_load_params *p, attn_model **out, char *err,
                       size_t err_size) {
    if (err != NULL && err_size > 0) {
        err[0] = '\0';
    }
    struct loader ld;
    memset(&ld, 0, sizeof ld);
    ld.dir = dir;
    ld.why.text = err;
    ld.why.size = err_size;
    if (dir == NULL || out == NULL) {
        return attn__fail(&ld.why, ATTN_EINVAL, "no model folder given");
    }
    attn_config cfg;
    struct attn__hf_layout lay;
    char *config_text = NULL;
    size_t config_len = 0;
    attn_model *m = NULL;
    int rc = read_text(&ld, "config.json", &config_text, &config_len);
    if (rc != ATTN_OK) {
        goto out;
    }
    if ((rc = attn__hf_config_parse(config_text, config_len, p, &cfg, &lay, err, err_size)) !=
        ATTN_OK) {
        goto out;
    }
    int32_t first = p ? p->layer_first : 0;
    if (first < 0 || first >= cfg.n_layers || (p && p->layer_count < 0) ||
        (p && p->layer_count > cfg.n_layers - first)) {
        rc = attn__fail(&ld.why, ATTN_EINVAL, "layers %d..%d requested, the model has %d", first,
                        first + (p ? p->layer_count : 1) - 1, cfg.n_layers);
        goto out;
    }
    ld.layout = &lay;
    if ((rc = open_index(&ld)) != ATTN_OK || (rc = pick_prefix(&ld, first)) != ATTN_OK) {
        goto out;
    }
    if (lay.has_biases_from_tensors &&
        (rc = detect_biases(&ld, first, lay.wants_qkv_bias, &cfg)) != ATTN_OK) {
        goto out;
    }
    if ((rc = screen_tensors(&ld, &cfg, lay.family)) != ATTN_OK) {
        goto out;
    }
    if ((rc = attn__model_alloc(&cfg, p, true, &m)) != ATTN_OK) {
        cannot_allocate(&ld, &cfg, p, first, rc);
        goto out;
    }
    if ((rc = read_layers(&ld, m, p)) != ATTN_OK) {
        goto out;
    }
    /* the shards read, screened as a whole: a tensor one holds that the index leaves out is
     * still in the checkpoint (transformers loads whole shards) */
    for (int i = 0; ld.weight_map != NULL && i < ld.n_shards && rc == ATTN_OK; i++) {
        const struct attn__st_header *h = &ld.shard_headers[i];
        for (int32_t t = 0; t < h->n_tensors && rc == ATTN_OK; t++) {
            rc = screen_tensor(&ld, &cfg, lay.family, h->tensors[t].name);
        }
    }
    if (rc != ATTN_OK) {
        goto out;
    }
    attn_dtype held =
        p != NULL && p->weights_dtype != ATTN_DTYPE_AUTO ? p->weights_dtype : ld.weights_dtype;
    if ((rc = attn__model_hold_weights(m, held)) != ATTN_OK) {
        attn__fail(&ld.why, rc, "cannot hold the weights in half precision: %s", attn_strerror(rc));
        goto out;
    }
    if ((rc = attn__model_fingerprint_compute(m)) != ATTN_OK) {
        attn__fail(&ld.why, rc, "cannot compute the model's fingerprint: %s", attn_strerror(rc));
        goto out;
    }
    snprintf(m->family, sizeof m->family, "%s", lay.family);
    *out = m;
    m = NULL;
out:
    attn_model_destroy(m);
    free(config_text);
    loader_release(&ld);
    return rc;
}
