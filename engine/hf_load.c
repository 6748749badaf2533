/* engine/hf_load.c: loads a Hugging Face style folder (config.json + safetensors, single or
 * sharded) into an attn_model. This is the only engine file that parses JSON: it links cJSON,
 * already a project dependency, rather than a hand-rolled parser, and nothing cJSON-shaped leaves
 * this file. config.json and each safetensors header are parsed from memory (attn_int.h), so the
 * fuzz targets reach the same code as a load. Only the attention tensors of the requested layers
 * are read; F16 and BF16 are converted to float once, here. */
#include "attn_int.h"

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

/* Where a failure's reason goes: the caller's buffer (NULL or short is fine). */
struct reason {
    char *text;
    size_t size;
};

/* Everything one load needs; freed on one path in attn_model_load_hf. */
struct loader {
    const char *dir;
    struct reason why;
    cJSON *weight_map; /* borrowed from index_json, or NULL for a single file */
    cJSON *index_json;
    char *shard_names[MAX_SHARDS]; /* file names, relative to dir */
    struct attn__st_header shard_headers[MAX_SHARDS];
    int n_shards;
    const char *prefix; /* "model.layers" or "layers" */
    void *convert_buf;  /* reused buffer for F16/BF16 bytes */
    size_t convert_cap;
};

static int fail(const struct reason *why, int rc, const char *fmt, ...) {
    if (why->text != NULL && why->size > 0) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(why->text, why->size, fmt, ap);
        va_end(ap);
    }
    return rc;
}

static int path_join(struct loader *ld, const char *name, char *out, size_t size) {
    int n = snprintf(out, size, "%s/%s", ld->dir, name);
    if (n < 0 || (size_t)n >= size) {
        return fail(&ld->why, ATTN_EIO, "path too long: %s/%s", ld->dir, name);
    }
    return ATTN_OK;
}

/* Reads the next n bytes of f into a new NUL-terminated buffer (for JSON text). */
static int read_bytes(struct loader *ld, FILE *f, size_t n, const char *path, char **out) {
    char *buf = malloc(n + 1);
    if (buf == NULL) {
        return ATTN_ENOMEM;
    }
    if (fread(buf, 1, n, f) != n) {
        free(buf);
        return fail(&ld->why, ATTN_EIO, "%s: short read", path);
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
        return fail(&ld->why, ATTN_EIO, "cannot open %s: %s", path, strerror(errno));
    }
    if (fseek(f, 0, SEEK_END) != 0) {
        rc = fail(&ld->why, ATTN_EIO, "%s: cannot seek", path);
        goto out;
    }
    long size = ftell(f);
    if (size < 0 || (unsigned long)size > MAX_JSON_BYTES || fseek(f, 0, SEEK_SET) != 0) {
        rc = fail(&ld->why, ATTN_EIO, "%s: unreadable or larger than 100 MB", path);
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
    cJSON *j = cJSON_ParseWithLength(text, len);
    free(text);
    if (j == NULL || !cJSON_IsObject(j)) {
        cJSON_Delete(j);
        return fail(&ld->why, ATTN_EIO, "%s/%s: not a JSON object", ld->dir, name);
    }
    *out = j;
    return ATTN_OK;
}

/* ---- config.json ---------------------------------------------------------------------------- */

/* Reads an optional integer field; absent or null leaves *out as is. */
static int get_int(const struct reason *why, const cJSON *obj, const char *key, int32_t *out) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(obj, key);
    if (v == NULL || cJSON_IsNull(v)) {
        return ATTN_OK;
    }
    if (!cJSON_IsNumber(v) || v->valuedouble != floor(v->valuedouble) || v->valuedouble < 0 ||
        v->valuedouble > INT32_MAX) {
        return fail(why, ATTN_EIO, "config.json: %s must be a non-negative integer", key);
    }
    *out = (int32_t)v->valuedouble;
    return ATTN_OK;
}

static int get_float(const struct reason *why, const cJSON *obj, const char *key, float *out) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(obj, key);
    if (v == NULL || cJSON_IsNull(v)) {
        return ATTN_OK;
    }
    if (!cJSON_IsNumber(v) || !isfinite(v->valuedouble)) {
        return fail(why, ATTN_EIO, "config.json: %s must be a number", key);
    }
    *out = (float)v->valuedouble;
    return ATTN_OK;
}

static int get_bool(const struct reason *why, const cJSON *obj, const char *key, bool *out) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(obj, key);
    if (v == NULL || cJSON_IsNull(v)) {
        return ATTN_OK;
    }
    if (!cJSON_IsBool(v)) {
        return fail(why, ATTN_EIO, "config.json: %s must be true or false", key);
    }
    *out = cJSON_IsTrue(v);
    return ATTN_OK;
}

static int parse_rope_scaling(const struct reason *why, const cJSON *rs, attn_rope_scaling *out) {
    memset(out, 0, sizeof *out);
    if (rs == NULL || cJSON_IsNull(rs)) {
        return ATTN_OK;
    }
    if (!cJSON_IsObject(rs)) {
        return fail(why, ATTN_EIO, "config.json: rope_scaling must be an object or null");
    }
    const cJSON *type = cJSON_GetObjectItemCaseSensitive(rs, "rope_type");
    if (type == NULL) {
        type = cJSON_GetObjectItemCaseSensitive(rs, "type");
    }
    if (!cJSON_IsString(type)) {
        return fail(why, ATTN_EIO, "config.json: rope_scaling needs a string rope_type");
    }
    const char *t = type->valuestring;
    int rc = ATTN_OK;
    if (strcmp(t, "default") == 0) {
        out->type = ATTN_ROPE_SCALING_NONE;
    } else if (strcmp(t, "linear") == 0) {
        out->type = ATTN_ROPE_SCALING_LINEAR;
        rc = get_float(why, rs, "factor", &out->factor);
    } else if (strcmp(t, "llama3") == 0) {
        out->type = ATTN_ROPE_SCALING_LLAMA3;
        if ((rc = get_float(why, rs, "factor", &out->factor)) != ATTN_OK ||
            (rc = get_float(why, rs, "low_freq_factor", &out->low_freq_factor)) != ATTN_OK ||
            (rc = get_float(why, rs, "high_freq_factor", &out->high_freq_factor)) != ATTN_OK ||
            (rc = get_int(why, rs, "original_max_position_embeddings",
                          &out->original_max_position)) != ATTN_OK) {
            return rc;
        }
    } else {
        return fail(why, ATTN_EUNSUPPORTED,
                    "config.json: rope_scaling type '%s' is not supported (default, linear, "
                    "llama3 are)",
                    t);
    }
    if (rc != ATTN_OK) {
        return rc;
    }
    if (out->type != ATTN_ROPE_SCALING_NONE && !(out->factor > 0)) {
        return fail(why, ATTN_EIO, "config.json: rope_scaling.factor must be > 0");
    }
    if (out->type == ATTN_ROPE_SCALING_LLAMA3 &&
        (!(out->low_freq_factor > 0) || !(out->high_freq_factor > out->low_freq_factor) ||
         out->original_max_position <= 0)) {
        return fail(why, ATTN_EIO,
                    "config.json: llama3 rope_scaling needs low_freq_factor > 0, "
                    "high_freq_factor > low_freq_factor and "
                    "original_max_position_embeddings > 0");
    }
    return ATTN_OK;
}

/* The rotary embedding: theta and scaling (also from transformers v5's rope_parameters),
 * attnd's own rope_style, and partial_rotary_factor. Needs c->head_dim. */
static int parse_rope(const struct reason *why, const cJSON *j, attn_config *c) {
    int rc;
    float partial = 1.0f;
    if ((rc = get_float(why, j, "rope_theta", &c->rope_theta)) != ATTN_OK ||
        (rc = get_float(why, j, "partial_rotary_factor", &partial)) != ATTN_OK) {
        return rc;
    }
    const cJSON *rp = cJSON_GetObjectItemCaseSensitive(j, "rope_parameters");
    const cJSON *rs = cJSON_GetObjectItemCaseSensitive(j, "rope_scaling");
    if (cJSON_IsObject(rp)) {
        if ((rc = get_float(why, rp, "rope_theta", &c->rope_theta)) != ATTN_OK) {
            return rc;
        }
        if (rs == NULL || cJSON_IsNull(rs)) {
            rs = rp;
        }
    }
    if ((rc = parse_rope_scaling(why, rs, &c->rope_scaling)) != ATTN_OK) {
        return rc;
    }
    const cJSON *style = cJSON_GetObjectItemCaseSensitive(j, "rope_style");
    if (style != NULL) {
        if (cJSON_IsString(style) && strcmp(style->valuestring, "half") == 0) {
            c->rope_style = ATTN_ROPE_STYLE_HALF;
        } else if (cJSON_IsString(style) && strcmp(style->valuestring, "interleaved") == 0) {
            c->rope_style = ATTN_ROPE_STYLE_INTERLEAVED;
        } else {
            return fail(why, ATTN_EUNSUPPORTED,
                        "config.json: rope_style must be \"half\" or \"interleaved\"");
        }
    }
    if (!(partial > 0.0f && partial <= 1.0f)) {
        return fail(why, ATTN_EIO, "config.json: partial_rotary_factor must be in (0, 1]");
    }
    c->rotary_dim = (int32_t)(c->head_dim * partial);
    if (c->rotary_dim % 2 != 0 || c->rotary_dim == 0) {
        return fail(why, ATTN_EUNSUPPORTED,
                    "config.json: rotary dim %d (head_dim x "
                    "partial_rotary_factor) must be even and > 0",
                    c->rotary_dim);
    }
    return ATTN_OK;
}

static int parse_config(const struct reason *why, const cJSON *j, attn_config *c,
                        bool *wants_bias) {
    memset(c, 0, sizeof *c);
    int rc;
    int32_t max_pos = 0;
    bool use_window = true;
    if ((rc = get_int(why, j, "hidden_size", &c->hidden_size)) != ATTN_OK ||
        (rc = get_int(why, j, "num_attention_heads", &c->n_heads)) != ATTN_OK ||
        (rc = get_int(why, j, "num_hidden_layers", &c->n_layers)) != ATTN_OK ||
        (rc = get_int(why, j, "max_position_embeddings", &max_pos)) != ATTN_OK ||
        (rc = get_int(why, j, "head_dim", &c->head_dim)) != ATTN_OK ||
        (rc = get_int(why, j, "sliding_window", &c->sliding_window)) != ATTN_OK ||
        (rc = get_bool(why, j, "use_sliding_window", &use_window)) != ATTN_OK ||
        (rc = get_bool(why, j, "attention_bias", wants_bias)) != ATTN_OK) {
        return rc;
    }
    if (c->hidden_size <= 0 || c->n_heads <= 0 || c->n_layers <= 0) {
        return fail(why, ATTN_EIO,
                    "config.json: hidden_size, num_attention_heads and "
                    "num_hidden_layers are required and must be > 0");
    }
    c->n_kv_heads = c->n_heads;
    if ((rc = get_int(why, j, "num_key_value_heads", &c->n_kv_heads)) != ATTN_OK) {
        return rc;
    }
    if (c->n_kv_heads <= 0 || c->n_heads % c->n_kv_heads != 0) {
        return fail(why, ATTN_ESHAPE,
                    "config.json: num_key_value_heads (%d) must divide "
                    "num_attention_heads (%d)",
                    c->n_kv_heads, c->n_heads);
    }
    if (!use_window) {
        c->sliding_window = 0; /* Qwen2 ships a window it does not use */
    }
    c->max_seq = max_pos > 0 ? max_pos : 4096;
    if (c->head_dim == 0) {
        if (c->hidden_size % c->n_heads != 0) {
            return fail(why, ATTN_ESHAPE,
                        "config.json: hidden_size %% num_attention_heads != 0 "
                        "and no head_dim given");
        }
        c->head_dim = c->hidden_size / c->n_heads;
    }
    return parse_rope(why, j, c);
}

/* Parses config.json text; see attn_int.h. */
int attn__hf_config_parse(const char *json, size_t len, attn_config *cfg, bool *wants_bias,
                          char *err, size_t err_size) {
    const struct reason why = {err, err_size};
    cJSON *j = cJSON_ParseWithLength(json, len);
    if (j == NULL || !cJSON_IsObject(j)) {
        cJSON_Delete(j);
        return fail(&why, ATTN_EIO, "config.json: not a JSON object");
    }
    attn_config c;
    bool bias = false;
    int rc = parse_config(&why, j, &c, &bias);
    cJSON_Delete(j);
    if (rc == ATTN_OK) {
        *cfg = c;
        *wants_bias = bias;
    }
    return rc;
}

/* ---- safetensors headers -------------------------------------------------------------------- */

/* The header's byte count: the file's first 8 bytes, little-endian. It must be > 0, within the
 * spec's 100 MB and within the file. */
static int header_length(const struct reason *why, const uint8_t *first8, uint64_t file_size,
                         uint64_t *out) {
    uint64_t n = 0;
    for (int b = 7; b >= 0; b--) {
        n = n << 8 | first8[b];
    }
    if (file_size < 8 || n == 0 || n > MAX_JSON_BYTES || n > file_size - 8) {
        return fail(why, ATTN_EIO, "bad safetensors header length %llu", (unsigned long long)n);
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
static int parse_tensor(const struct reason *why, const cJSON *e, uint64_t data_bytes,
                        struct attn__st_tensor *t) {
    const cJSON *dt = NULL, *shape = NULL, *offs = NULL;
    if (cJSON_IsObject(e)) {
        dt = cJSON_GetObjectItemCaseSensitive(e, "dtype");
        shape = cJSON_GetObjectItemCaseSensitive(e, "shape");
        offs = cJSON_GetObjectItemCaseSensitive(e, "data_offsets");
    }
    if (!cJSON_IsString(dt) || !cJSON_IsArray(shape) || !cJSON_IsArray(offs) ||
        cJSON_GetArraySize(offs) != 2) {
        return fail(why, ATTN_EIO,
                    "safetensors header: %s needs a dtype, a shape and data_offsets [begin, end]",
                    e->string);
    }
    memset(t, 0, sizeof *t);
    snprintf(t->dtype, sizeof t->dtype, "%s", dt->valuestring);
    const cJSON *d;
    cJSON_ArrayForEach(d, shape) {
        if (t->n_dims == ATTN__ST_MAX_DIMS || !get_count(d, &t->shape[t->n_dims])) {
            return fail(why, ATTN_EIO,
                        "safetensors header: %s: shape must be at most %d whole numbers", e->string,
                        ATTN__ST_MAX_DIMS);
        }
        t->n_dims++;
    }
    if (!get_count(offs->child, &t->begin) || !get_count(offs->child->next, &t->end) ||
        t->begin > t->end || t->end > data_bytes) {
        return fail(why, ATTN_EIO,
                    "safetensors header: %s: data_offsets are not a range within the file's "
                    "%llu data bytes (truncated file?)",
                    e->string, (unsigned long long)data_bytes);
    }
    t->name = strdup(e->string);
    return t->name != NULL ? ATTN_OK : ATTN_ENOMEM;
}

/* Parses a safetensors header; see attn_int.h. */
int attn__safetensors_header_parse(const uint8_t *buf, size_t len, uint64_t file_size,
                                   struct attn__st_header *out, char *err, size_t err_size) {
    const struct reason why = {err, err_size};
    uint64_t n = 0;
    if (len < 8 || file_size < len) {
        return fail(&why, ATTN_EIO, "too short for a safetensors file");
    }
    int rc = header_length(&why, buf, file_size, &n);
    if (rc != ATTN_OK) {
        return rc;
    }
    if (n > len - 8) {
        return fail(&why, ATTN_EIO, "safetensors header: %llu bytes, only %zu given",
                    (unsigned long long)n, len - 8);
    }
    struct attn__st_header h = {8 + n, file_size - 8 - n, NULL, 0};
    cJSON *j = cJSON_ParseWithLength((const char *)buf + 8, (size_t)n);
    if (j == NULL || !cJSON_IsObject(j)) {
        rc = fail(&why, ATTN_EIO, "safetensors header is not a JSON object");
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
        return fail(&ld->why, ATTN_EIO, "bad or too many shard files (%s)", name);
    }
    char path[4096];
    int rc = path_join(ld, name, path, sizeof path);
    if (rc != ATTN_OK) {
        return rc;
    }
    FILE *f = fopen(path, "rb");
    if (f == NULL) {
        return fail(&ld->why, ATTN_EIO, "cannot open %s: %s", path, strerror(errno));
    }
    struct stat st;
    uint8_t *head = NULL;
    uint8_t first8[8];
    uint64_t n = 0;
    char why[512] = "";
    const struct reason here = {why, sizeof why};
    if (fstat(fileno(f), &st) != 0 || st.st_size < 8 || fread(first8, 1, 8, f) != 8) {
        rc = fail(&ld->why, ATTN_EIO, "%s: too short for a safetensors file", path);
        goto out;
    }
    if ((rc = header_length(&here, first8, (uint64_t)st.st_size, &n)) != ATTN_OK) {
        goto out_why;
    }
    /* 8 + n bytes, plus a NUL that cJSON never needs but that bounds any reader of the text. */
    if ((head = malloc(8 + (size_t)n + 1)) == NULL) {
        rc = ATTN_ENOMEM;
        goto out;
    }
    memcpy(head, first8, 8);
    if (fread(head + 8, 1, (size_t)n, f) != n) {
        rc = fail(&ld->why, ATTN_EIO, "%s: short read", path);
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
        rc = ATTN_ENOMEM;
        goto out;
    }
    ld->n_shards++;
    *out = i;
    goto out;
out_why:
    fail(&ld->why, rc, "%s: %s", path, why);
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
            return fail(&ld->why, ATTN_EIO, "weight_map entry for %s is not a file name", name);
        }
        file = f->valuestring;
    }
    int rc = shard_open(ld, file, shard);
    if (rc != ATTN_OK) {
        return rc;
    }
    *entry = attn__safetensors_tensor_find(&ld->shard_headers[*shard], name);
    if (*entry == NULL && ld->weight_map != NULL) {
        return fail(&ld->why, ATTN_EIO, "%s: listed in the index but missing from %s", name, file);
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
        return fail(&ld->why, ATTN_EUNSUPPORTED,
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
        return fail(&ld->why, ATTN_ESHAPE, "%s: shape %s, expected [%d, %d] from config.json",
                    t->name, got, rows, cols);
    }
    return fail(&ld->why, ATTN_ESHAPE, "%s: shape %s, expected [%d] from config.json", t->name, got,
                rows);
}

/* Reads tensor `name` of shape (rows[, cols]) (cols 0: a vector) into dst as float. */
static int tensor_read(struct loader *ld, const char *name, int32_t rows, int32_t cols,
                       float *dst) {
    int shard;
    const struct attn__st_tensor *t = NULL;
    int rc = tensor_find(ld, name, &shard, &t);
    if (rc != ATTN_OK) {
        return rc;
    }
    if (t == NULL) {
        return fail(&ld->why, ATTN_EIO, "tensor %s not found", name);
    }
    dtype dt = DTYPE_F32;
    size_t elem = 4;
    if ((rc = parse_dtype(ld, t, &dt, &elem)) != ATTN_OK) {
        return rc;
    }
    if ((rc = check_shape(ld, t, rows, cols)) != ATTN_OK) {
        return rc;
    }
    /* The header checked that the range lies inside the file; it must also hold the shape. */
    size_t n = (size_t)rows * (cols > 0 ? (size_t)cols : 1);
    if (t->end - t->begin != n * elem) {
        return fail(&ld->why, ATTN_EIO, "%s: data_offsets span %llu bytes, its shape %zu", name,
                    (unsigned long long)(t->end - t->begin), n * elem);
    }
    uint64_t start = ld->shard_headers[shard].data_start + t->begin;
    char path[4096];
    if ((rc = path_join(ld, ld->shard_names[shard], path, sizeof path)) != ATTN_OK) {
        return rc;
    }
    FILE *f = fopen(path, "rb");
    if (f == NULL) {
        return fail(&ld->why, ATTN_EIO, "cannot open %s: %s", path, strerror(errno));
    }
    void *buf = dst;
    if (dt != DTYPE_F32) {
        if (ld->convert_cap < n * elem) {
            free(ld->convert_buf);
            ld->convert_buf = malloc(n * elem);
            ld->convert_cap = ld->convert_buf ? n * elem : 0;
            if (ld->convert_buf == NULL) {
                fclose(f);
                return ATTN_ENOMEM;
            }
        }
        buf = ld->convert_buf;
    }
    rc = ATTN_OK;
    if (fseeko(f, (off_t)start, SEEK_SET) != 0 || fread(buf, elem, n, f) != n) {
        rc = fail(&ld->why, ATTN_EIO, "%s: short read from %s", name, path);
    }
    fclose(f);
    if (rc != ATTN_OK || dt == DTYPE_F32) {
        return rc;
    }
    const uint16_t *h = buf;
    for (size_t i = 0; i < n; i++) {
        dst[i] = dt == DTYPE_F16 ? half_to_float(h[i]) : bf16_to_float(h[i]);
    }
    return ATTN_OK;
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

/* Checkpoints saved from the bare model (not ...ForCausalLM) drop the "model." prefix. */
static int pick_prefix(struct loader *ld, int32_t layer) {
    static const char *const prefixes[] = {"model.layers", "layers"};
    for (size_t i = 0; i < sizeof prefixes / sizeof prefixes[0]; i++) {
        char name[256];
        snprintf(name, sizeof name, "%s.%d.self_attn.q_proj.weight", prefixes[i], layer);
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
    return fail(&ld->why, ATTN_EIO, "tensor model.layers.%d.self_attn.q_proj.weight not found",
                layer);
}

static int read_layer(struct loader *ld, const attn_config *c, int32_t layer,
                      struct attn__layer *l) {
    size_t hidden = (size_t)c->hidden_size;
    int32_t q_rows = c->n_heads * c->head_dim, kv_rows = c->n_kv_heads * c->head_dim;
    const char *proj[4] = {"q_proj", "k_proj", "v_proj", "o_proj"};
    float *w_dst[4] = {l->w_qkv, l->w_qkv + (size_t)q_rows * hidden,
                       l->w_qkv + (size_t)(q_rows + kv_rows) * hidden, l->w_o};
    int32_t rows[4] = {q_rows, kv_rows, kv_rows, c->hidden_size};
    int32_t cols[4] = {c->hidden_size, c->hidden_size, c->hidden_size, q_rows};
    float *b_dst[4] = {l->b_qkv, l->b_qkv ? l->b_qkv + q_rows : NULL,
                       l->b_qkv ? l->b_qkv + q_rows + kv_rows : NULL, l->b_o};
    for (int i = 0; i < 4; i++) {
        char name[256];
        snprintf(name, sizeof name, "%s.%d.self_attn.%s.weight", ld->prefix, layer, proj[i]);
        int rc = tensor_read(ld, name, rows[i], cols[i], w_dst[i]);
        if (rc != ATTN_OK) {
            return rc;
        }
        if (b_dst[i] != NULL) {
            snprintf(name, sizeof name, "%s.%d.self_attn.%s.bias", ld->prefix, layer, proj[i]);
            if ((rc = tensor_read(ld, name, rows[i], 0, b_dst[i])) != ATTN_OK) {
                return rc;
            }
        }
    }
    return ATTN_OK;
}

/* Biases are detected from the tensors themselves: Llama's attention_bias puts them on q, k, v
 * and o, while Qwen2 has q/k/v biases and no such field. */
static int detect_biases(struct loader *ld, int32_t layer, bool wants_bias, attn_config *c) {
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
    if (wants_bias && !c->has_qkv_bias) {
        return fail(&ld->why, ATTN_EIO,
                    "config.json sets attention_bias but %s.%d.self_attn.q_proj."
                    "bias is missing",
                    ld->prefix, layer);
    }
    return ATTN_OK;
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
        return fail(&ld->why, ATTN_EIO, "model.safetensors.index.json: no weight_map object");
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
        return fail(&ld.why, ATTN_EINVAL, "no model folder given");
    }
    attn_config cfg;
    bool wants_bias = false;
    char *config_text = NULL;
    size_t config_len = 0;
    attn_model *m = NULL;
    int rc = read_text(&ld, "config.json", &config_text, &config_len);
    if (rc != ATTN_OK) {
        goto out;
    }
    if ((rc = attn__hf_config_parse(config_text, config_len, &cfg, &wants_bias, err, err_size)) !=
        ATTN_OK) {
        goto out;
    }
    int32_t first = p ? p->layer_first : 0;
    if (first < 0 || first >= cfg.n_layers || (p && p->layer_count < 0) ||
        (p && p->layer_count > cfg.n_layers - first)) {
        rc = fail(&ld.why, ATTN_EINVAL, "layers %d..%d requested, the model has %d", first,
                  first + (p ? p->layer_count : 1) - 1, cfg.n_layers);
        goto out;
    }
    if ((rc = open_index(&ld)) != ATTN_OK || (rc = pick_prefix(&ld, first)) != ATTN_OK ||
        (rc = detect_biases(&ld, first, wants_bias, &cfg)) != ATTN_OK) {
        goto out;
    }
    if ((rc = attn__model_alloc(&cfg, p, &m)) != ATTN_OK) {
        fail(&ld.why, rc, "config.json describes an invalid attention geometry: %s",
             attn_strerror(rc));
        goto out;
    }
    for (int32_t i = 0; i < m->layer_count; i++) {
        if ((rc = read_layer(&ld, &m->cfg, m->layer_first + i, &m->layers[i])) != ATTN_OK) {
            goto out;
        }
    }
    *out = m;
    m = NULL;
out:
    attn_model_destroy(m);
    free(config_text);
    loader_release(&ld);
    return rc;
}
