/* engine/hf_rope.c: a config's rotary embedding: rope_theta, rope_scaling (each type's own keys,
 * refused by name when unknown), transformers v5's rope_parameters beside or instead of them
 * (refused when the two disagree), and the rotated fraction of each head by the family's rule. */
#include "hf_int.h"

#include <math.h>
#include <string.h>

/* The keys each rope_scaling type reads; any other is refused by name, since transformers
 * versions add parameters that change the rotation. */
struct scaling_kind {
    const char *name;
    attn_rope_scaling_type type;
    const char *keys[8];
};
static const struct scaling_kind scaling_kinds[] = {
    {"default", ATTN_ROPE_SCALING_NONE, {NULL}},
    {"linear", ATTN_ROPE_SCALING_LINEAR, {"factor", NULL}},
    {"llama3",
     ATTN_ROPE_SCALING_LLAMA3,
     {"factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings", NULL}},
    {"yarn",
     ATTN_ROPE_SCALING_YARN,
     {"factor", "attention_factor", "beta_fast", "beta_slow", "mscale", "mscale_all_dim",
      "original_max_position_embeddings", "truncate"}},
    {"longrope",
     ATTN_ROPE_SCALING_LONGROPE,
     {"short_factor", "long_factor", "factor", "attention_factor",
      "original_max_position_embeddings", NULL}},
    {"dynamic", ATTN_ROPE_SCALING_DYNAMIC, {"factor", "original_max_position_embeddings", NULL}},
};

static int check_scaling_keys(const struct attn__reason *why, const cJSON *rs,
                              const struct scaling_kind *k) {
    static const char *const always[] = {"rope_type", "type", "rope_theta",
                                         "partial_rotary_factor"};
    for (const cJSON *it = rs->child; it != NULL; it = it->next) {
        bool known = false;
        for (size_t i = 0; i < sizeof always / sizeof always[0]; i++) {
            known |= strcmp(it->string, always[i]) == 0;
        }
        for (size_t i = 0; i < 8 && k->keys[i] != NULL; i++) {
            known |= strcmp(it->string, k->keys[i]) == 0;
        }
        if (!known) {
            return attn__fail(why, ATTN_EUNSUPPORTED,
                              "config.json: rope_scaling.%s is not part of %s scaling as attnd "
                              "computes it; refused rather than served wrong",
                              it->string, k->name);
        }
    }
    return ATTN_OK;
}

/* A LongRoPE factor list: rotary_dim / 2 numbers. */
static int get_factor_list(const struct attn__reason *why, const cJSON *rs, const char *key,
                           int32_t half, float *out) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(rs, key);
    if (!cJSON_IsArray(v) || cJSON_GetArraySize(v) != half || half > ATTN_MAX_ROPE_FACTORS) {
        return attn__fail(why, ATTN_EIO,
                          "config.json: rope_scaling.%s must list rotary dims / 2 = %d numbers "
                          "(at most %d)",
                          key, half, ATTN_MAX_ROPE_FACTORS);
    }
    int32_t i = 0;
    for (const cJSON *it = v->child; it != NULL; it = it->next, i++) {
        if (!cJSON_IsNumber(it) || !isfinite(it->valuedouble) || !(it->valuedouble > 0)) {
            return attn__fail(why, ATTN_EIO, "config.json: rope_scaling.%s holds a value <= 0",
                              key);
        }
        out[i] = (float)it->valuedouble;
    }
    return ATTN_OK;
}

/* original_max_position_embeddings where a type needs it. transformers reads it from
 * rope_scaling (llama3, yarn) or from the config itself (longrope; Phi3Config's default 4096);
 * both present and different is ambiguous. *found says whether either was there. */
static int get_original(const struct attn__reason *why, const cJSON *j, const cJSON *rs,
                        int32_t *out, bool *found) {
    const char *key = "original_max_position_embeddings";
    int32_t top = 0, inner = 0;
    int rc;
    if ((rc = attn__hf_get_int(why, j, key, &top)) != ATTN_OK ||
        (rc = attn__hf_get_int(why, rs, key, &inner)) != ATTN_OK) {
        return rc;
    }
    if (top > 0 && inner > 0 && top != inner) {
        return attn__fail(why, ATTN_EIO,
                          "config.json: original_max_position_embeddings differs between the "
                          "config (%d) and rope_scaling (%d)",
                          top, inner);
    }
    *found = top > 0 || inner > 0;
    if (*found) {
        *out = top > 0 ? top : inner;
    }
    return ATTN_OK;
}

/* The rope_scaling object (or v5's rope_parameters) into c->rope_scaling, with what
 * transformers derives from the config around it. Needs c->rotary_dim. */
static int parse_rope_scaling(const struct attn__reason *why, const cJSON *j, const cJSON *rs,
                              const struct family *f, attn_config *c) {
    attn_rope_scaling *out = &c->rope_scaling;
    memset(out, 0, sizeof *out);
    if (rs == NULL || cJSON_IsNull(rs)) {
        return ATTN_OK;
    }
    if (!cJSON_IsObject(rs)) {
        return attn__fail(why, ATTN_EIO, "config.json: rope_scaling must be an object or null");
    }
    const cJSON *rope_type = cJSON_GetObjectItemCaseSensitive(rs, "rope_type");
    const cJSON *legacy = cJSON_GetObjectItemCaseSensitive(rs, "type");
    const cJSON *type = rope_type != NULL ? rope_type : legacy;
    if (!cJSON_IsString(type) || (legacy != NULL && !cJSON_IsString(legacy))) {
        return attn__fail(why, ATTN_EIO, "config.json: rope_scaling needs a string rope_type");
    }
    if (rope_type != NULL && legacy != NULL &&
        strcmp(rope_type->valuestring, legacy->valuestring) != 0) {
        /* transformers v4's configs copy type over rope_type, later code reads rope_type first */
        return attn__fail(why, ATTN_EIO,
                          "config.json: rope_scaling's type '%s' and rope_type '%s' differ, and "
                          "transformers versions differ on which applies",
                          legacy->valuestring, rope_type->valuestring);
    }
    const char *name = type->valuestring;
    if (f->has_legacy_scaling_names && legacy != NULL &&
        (strcmp(name, "su") == 0 || strcmp(name, "yarn") == 0)) {
        /* Phi3Config._rope_scaling_adjustment renames type "su" and "yarn" to longrope; the
         * releases before it ran Phi-3's own variants, whose yarn scales attention otherwise. */
        return attn__fail(why, ATTN_EUNSUPPORTED,
                          strcmp(name, "su") == 0
                              ? "config.json: %s rope_scaling type '%s' is LongRoPE's old name; "
                                "replace it by \"rope_type\": \"longrope\""
                              : "config.json: %s rope_scaling type '%s' is an old name that "
                                "transformers releases compute differently (Phi-3's own YaRN, "
                                "later LongRoPE); replace it by the rope_type meant",
                          f->model_type, name);
    }
    const struct scaling_kind *kind = NULL;
    for (size_t i = 0; i < sizeof scaling_kinds / sizeof scaling_kinds[0]; i++) {
        if (strcmp(name, scaling_kinds[i].name) == 0) {
            kind = &scaling_kinds[i];
        }
    }
    if (kind == NULL) {
        return attn__fail(why, ATTN_EUNSUPPORTED,
                          "config.json: rope_scaling type '%s' is not supported (default, linear, "
                          "llama3, yarn, longrope, dynamic are)",
                          name);
    }
    int rc = check_scaling_keys(why, rs, kind);
    if (rc != ATTN_OK) {
        return rc;
    }
    out->type = kind->type;
    int32_t max_pos = 0;
    bool has_original = false;
    if ((rc = attn__hf_get_int(why, j, "max_position_embeddings", &max_pos)) != ATTN_OK ||
        (rc = attn__hf_get_float(why, rs, "factor", &out->factor)) != ATTN_OK ||
        (rc = get_original(why, j, rs, &out->original_max_position, &has_original)) != ATTN_OK) {
        return rc;
    }
    switch (out->type) {
    case ATTN_ROPE_SCALING_NONE:
    case ATTN_ROPE_SCALING_LINEAR:
        break;
    case ATTN_ROPE_SCALING_LLAMA3:
        if ((rc = attn__hf_get_float(why, rs, "low_freq_factor", &out->low_freq_factor)) !=
                ATTN_OK ||
            (rc = attn__hf_get_float(why, rs, "high_freq_factor", &out->high_freq_factor)) !=
                ATTN_OK) {
            return rc;
        }
        break;
    case ATTN_ROPE_SCALING_YARN: {
        bool truncate = true;
        if ((rc = attn__hf_get_float(why, rs, "attention_factor", &out->attention_factor)) !=
                ATTN_OK ||
            (rc = attn__hf_get_float(why, rs, "beta_fast", &out->beta_fast)) != ATTN_OK ||
            (rc = attn__hf_get_float(why, rs, "beta_slow", &out->beta_slow)) != ATTN_OK ||
            (rc = attn__hf_get_float(why, rs, "mscale", &out->mscale)) != ATTN_OK ||
            (rc = attn__hf_get_float(why, rs, "mscale_all_dim", &out->mscale_all_dim)) != ATTN_OK ||
            (rc = attn__hf_get_bool(why, rs, "truncate", &truncate)) != ATTN_OK) {
            return rc;
        }
        out->yarn_fractional_range = !truncate;
        if (!has_original) {
            out->original_max_position = max_pos;
        } else if (max_pos > 0 && (double)max_pos / out->original_max_position != out->factor) {
            /* Newer transformers take factor = max_position_embeddings / original, older ones
             * rope_scaling.factor: with both given and different, which model is meant is not
             * known. */
            return attn__fail(why, ATTN_EUNSUPPORTED,
                              "config.json: yarn rope_scaling.factor %g differs from "
                              "max_position_embeddings / original_max_position_embeddings = "
                              "%d / %d, and transformers versions differ on which applies; make "
                              "them agree",
                              out->factor, max_pos, out->original_max_position);
        }
        break;
    }
    case ATTN_ROPE_SCALING_LONGROPE: {
        int32_t half = c->rotary_dim / 2;
        if ((rc = get_factor_list(why, rs, "short_factor", half, out->short_factor)) != ATTN_OK ||
            (rc = get_factor_list(why, rs, "long_factor", half, out->long_factor)) != ATTN_OK ||
            (rc = attn__hf_get_float(why, rs, "attention_factor", &out->attention_factor)) !=
                ATTN_OK) {
            return rc;
        }
        if (!has_original && f->longrope_original > 0) {
            out->original_max_position = f->longrope_original;
            has_original = true;
        }
        if (has_original && max_pos > 0) {
            out->factor = (float)((double)max_pos / out->original_max_position);
        } else if (!has_original) {
            out->original_max_position = max_pos;
        }
        if (out->attention_factor == 0 && !(out->factor > 0)) {
            return attn__fail(why, ATTN_EIO,
                              "config.json: longrope needs rope_scaling.factor, "
                              "attention_factor or original_max_position_embeddings");
        }
        break;
    }
    case ATTN_ROPE_SCALING_DYNAMIC:
        /* _compute_dynamic_ntk_parameters grows theta past max_position_embeddings. */
        if (has_original && out->original_max_position != max_pos) {
            return attn__fail(why, ATTN_EUNSUPPORTED,
                              "config.json: dynamic rope_scaling with "
                              "original_max_position_embeddings %d other than "
                              "max_position_embeddings %d: implementations differ on which one "
                              "theta grows past",
                              out->original_max_position, max_pos);
        }
        out->original_max_position = max_pos;
        break;
    }
    if ((out->type == ATTN_ROPE_SCALING_YARN || out->type == ATTN_ROPE_SCALING_DYNAMIC) &&
        out->original_max_position <= 0) {
        return attn__fail(why, ATTN_EIO,
                          "config.json: %s rope_scaling needs max_position_embeddings (or "
                          "original_max_position_embeddings)",
                          kind->name);
    }
    if (out->type != ATTN_ROPE_SCALING_NONE && out->type != ATTN_ROPE_SCALING_LONGROPE &&
        !(out->factor > 0)) {
        return attn__fail(why, ATTN_EIO, "config.json: rope_scaling.factor must be > 0");
    }
    return ATTN_OK; /* ranges are checked with the whole config (attn__config_check_why) */
}

/* rope_theta, or the family's older name for it; both present and different is ambiguous.
 * *given: whether either was there (else c->rope_theta stays the family's default). */
static int parse_theta(const struct attn__reason *why, const cJSON *j, const struct family *f,
                       attn_config *c, bool *given) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(j, "rope_theta");
    *given = v != NULL && !cJSON_IsNull(v);
    int rc = attn__hf_get_float(why, j, "rope_theta", &c->rope_theta);
    const cJSON *a =
        f->theta_alias != NULL ? cJSON_GetObjectItemCaseSensitive(j, f->theta_alias) : NULL;
    if (rc != ATTN_OK || a == NULL || cJSON_IsNull(a)) {
        return rc;
    }
    float alias = 0;
    if ((rc = attn__hf_get_float(why, j, f->theta_alias, &alias)) != ATTN_OK) {
        return rc;
    }
    if (*given && alias != c->rope_theta) {
        return attn__fail(why, ATTN_EIO, "config.json: rope_theta and %s differ", f->theta_alias);
    }
    c->rope_theta = alias;
    *given = true;
    return ATTN_OK;
}

/* The rotary objects a config may hold, each NULL when absent: rope_scaling (v4's, which v5
 * also reads) and rope_parameters (v5's alone). */
struct rotary_objects {
    const cJSON *scaling, *params;
};

/* A value the rotary objects may repeat from the config's top level (key: rope_theta or
 * partial_rotary_factor). v4 reads it at the top level only, v5 inside the objects too. So one
 * inside must agree with the top level's value (top: its name there), or, when the config gives
 * none (top NULL), with the default v4 takes (*value on entry), unless it sits in a
 * rope_parameters with no rope_scaling beside it, which only v5 reads. Compared as float
 * (as_float) where the value is held as one. *value: the one that applies. */
static int agree_inner(const struct attn__reason *why, const struct rotary_objects *o,
                       const char *key, const char *top, bool as_float, double *value) {
    const cJSON *objs[2] = {o->scaling, o->params};
    static const char *const names[2] = {"rope_scaling", "rope_parameters"};
    for (int i = 0; i < 2; i++) {
        const cJSON *v = objs[i] != NULL ? cJSON_GetObjectItemCaseSensitive(objs[i], key) : NULL;
        if (v == NULL || cJSON_IsNull(v)) {
            continue;
        }
        if (!cJSON_IsNumber(v) || !isfinite(v->valuedouble)) {
            return attn__fail(why, ATTN_EIO, "config.json: %s.%s must be a number", names[i], key);
        }
        bool is_v5_only = i == 1 && o->scaling == NULL;
        bool differs = as_float ? (float)v->valuedouble != (float)*value : v->valuedouble != *value;
        if ((top != NULL || !is_v5_only) && differs) {
            return attn__fail(why, ATTN_EIO,
                              "config.json: %s.%s (%.9g) differs from %s %s (%.9g), and "
                              "transformers versions differ on which applies",
                              names[i], key, v->valuedouble,
                              top != NULL ? "the config's" : "the default", top != NULL ? top : key,
                              *value);
        }
        *value = v->valuedouble;
    }
    return ATTN_OK;
}

/* A rotary object's type: rope_type, or its old name type; NULL when the two differ. */
static const cJSON *scaling_type(const cJSON *o, bool *is_consistent) {
    const cJSON *rt = cJSON_GetObjectItemCaseSensitive(o, "rope_type");
    const cJSON *t = cJSON_GetObjectItemCaseSensitive(o, "type");
    *is_consistent = rt == NULL || t == NULL || cJSON_Compare(rt, t, true);
    return rt != NULL ? rt : t;
}

/* Whether rope_scaling and rope_parameters name the same scaling: one type, and the same value
 * for every other key but rope_theta and partial_rotary_factor (agree_inner's). Exporters that
 * write both for v4 and v5 readers leave rope_theta in rope_parameters only. */
static bool same_scaling(const cJSON *a, const cJSON *b) {
    bool ok_a, ok_b;
    const cJSON *ta = scaling_type(a, &ok_a), *tb = scaling_type(b, &ok_b);
    if (!ok_a || !ok_b || (ta == NULL) != (tb == NULL) ||
        (ta != NULL && !cJSON_Compare(ta, tb, true))) {
        return false;
    }
    static const char *const skip[] = {"rope_type", "type", "rope_theta", "partial_rotary_factor"};
    const cJSON *pair[2][2] = {{a, b}, {b, a}};
    for (int p = 0; p < 2; p++) {
        for (const cJSON *it = pair[p][0]->child; it != NULL; it = it->next) {
            bool is_skipped = false;
            for (size_t i = 0; i < sizeof skip / sizeof skip[0]; i++) {
                is_skipped |= strcmp(it->string, skip[i]) == 0;
            }
            const cJSON *other = cJSON_GetObjectItemCaseSensitive(pair[p][1], it->string);
            if (!is_skipped && (other == NULL || !cJSON_Compare(it, other, true))) {
                return false;
            }
        }
    }
    return true;
}

/* The fraction of each head that rotates, by the family's rule: *partial in (0, 1]. */
static int parse_partial(const struct attn__reason *why, const cJSON *j,
                         const struct rotary_objects *o, const struct family *f, double *partial) {
    int rc;
    double factor = -1;
    *partial = 1.0;
    if ((rc = attn__hf_get_double(why, j, "partial_rotary_factor", &factor)) != ATTN_OK) {
        return rc;
    }
    bool top_given = factor >= 0;
    if (f->rotary == ROTARY_PARTIAL_NEOX) {
        /* configuration_gpt_neox.py: rotary_pct, 0.25 when absent. */
        *partial = 0.25;
        if ((rc = attn__hf_get_double(why, j, "rotary_pct", partial)) != ATTN_OK) {
            return rc;
        }
        if (factor >= 0 && factor != *partial) {
            return attn__fail(why, ATTN_EIO,
                              "config.json: rotary_pct and partial_rotary_factor "
                              "differ");
        }
    } else if (factor >= 0) {
        *partial = factor;
    } else if (f->rotary == ROTARY_PARTIAL && f->default_partial > 0) {
        *partial = f->default_partial;
    }
    const char *top = f->rotary == ROTARY_PARTIAL_NEOX ? "rotary_pct (or its default)"
                      : top_given                      ? "partial_rotary_factor"
                                                       : NULL;
    if ((rc = agree_inner(why, o, "partial_rotary_factor", top, false, partial)) != ATTN_OK) {
        return rc;
    }
    if (!(*partial > 0.0 && *partial <= 1.0)) {
        return attn__fail(why, ATTN_EIO,
                          "config.json: the rotary fraction (partial_rotary_factor, rotary_pct) "
                          "must be in (0, 1]");
    }
    if (*partial != 1.0 && f->rotary == ROTARY_WHOLE_HEADS) {
        /* Their apply_rotary_pos_emb rotates whole heads: a partial table cannot be applied. */
        return attn__fail(why, ATTN_EUNSUPPORTED,
                          "config.json: partial_rotary_factor %g is not part of %s attention",
                          *partial, f->model_type);
    }
    return ATTN_OK;
}

/* See hf_int.h. */
int attn__hf_parse_rope(const struct attn__reason *why, const cJSON *j, const struct family *f,
                        attn_config *c) {
    if (f->rotary == ROTARY_NONE) {
        c->rotary_dim = -1; /* positions are in the caller's hidden states, as the model adds */
        return ATTN_OK;
    }
    int rc;
    bool theta_given = false;
    if ((rc = parse_theta(why, j, f, c, &theta_given)) != ATTN_OK) {
        return rc;
    }
    const cJSON *rp = cJSON_GetObjectItemCaseSensitive(j, "rope_parameters");
    const cJSON *rs = cJSON_GetObjectItemCaseSensitive(j, "rope_scaling");
    struct rotary_objects o = {cJSON_IsObject(rs) ? rs : NULL, cJSON_IsObject(rp) ? rp : NULL};
    if (o.scaling != NULL && o.params != NULL && !same_scaling(o.scaling, o.params)) {
        return attn__fail(why, ATTN_EIO,
                          "config.json: rope_scaling and rope_parameters name different scalings "
                          "(type or another key), and transformers versions differ on which "
                          "applies");
    }
    if (o.params != NULL && (rs == NULL || cJSON_IsNull(rs))) {
        rs = o.params;
    }
    /* the family's default when none was written (0: config.c's, 10000) */
    double theta = theta_given || c->rope_theta != 0 ? c->rope_theta : 10000.0;
    if ((rc = agree_inner(why, &o, "rope_theta", theta_given ? "rope_theta" : NULL, true,
                          &theta)) != ATTN_OK) {
        return rc;
    }
    for (int i = 0; i < 2; i++) {
        const cJSON *obj = i == 0 ? o.scaling : o.params;
        theta_given |= obj != NULL && cJSON_GetObjectItemCaseSensitive(obj, "rope_theta") != NULL;
    }
    if (theta_given && theta == 0) {
        /* the engine reads 0 as its default, 10000, and checks the range of any other value */
        return attn__fail(why, ATTN_EINVAL, "config.json: rope_theta must be finite and > 1");
    }
    c->rope_theta = (float)theta;
    c->rope_style = f->rope_style;
    const cJSON *style = cJSON_GetObjectItemCaseSensitive(j, "rope_style");
    if (style != NULL && !cJSON_IsNull(style)) {
        if (f->rotary != ROTARY_ENGINE_FIELDS) {
            return attn__fail(why, ATTN_EUNSUPPORTED,
                              "config.json: rope_style is attnd's own field, which %s attention "
                              "does not read (model_type attnd serves it)",
                              f->model_type);
        }
        if (cJSON_IsString(style) && strcmp(style->valuestring, "half") == 0) {
            c->rope_style = f->rope_style;
        } else if (cJSON_IsString(style) && strcmp(style->valuestring, "interleaved") == 0) {
            c->rope_style = ATTN_ROPE_STYLE_INTERLEAVED;
        } else {
            return attn__fail(why, ATTN_EUNSUPPORTED,
                              "config.json: rope_style must be \"half\" or \"interleaved\"");
        }
    }
    double partial = 1.0;
    if ((rc = parse_partial(why, j, &o, f, &partial)) != ATTN_OK) {
        return rc;
    }
    /* int(head_dim * partial_rotary_factor), as the modeling code computes it; multi-head latent
     * attention rotates its qk_rope_head_dim dims. */
    c->rotary_dim = (int32_t)floor(c->head_dim * partial);
    if (c->kv_lora_rank > 0) {
        c->rotary_dim = c->qk_rope_head_dim;
    }
    if (c->rotary_dim % 2 != 0 || c->rotary_dim == 0) {
        return attn__fail(why, ATTN_EUNSUPPORTED,
                          "config.json: rotary dim %d (head_dim x the rotary fraction) must be "
                          "even and > 0",
                          c->rotary_dim);
    }
    if (rs != NULL || f->default_rope_scaling == NULL) {
        rc = parse_rope_scaling(why, j, rs, f, c);
        if (rc == ATTN_OK && f->is_scaling_unread &&
            c->rope_scaling.type != ATTN_ROPE_SCALING_NONE) {
            return attn__fail(why, ATTN_EUNSUPPORTED,
                              "config.json: rope_scaling (or rope_parameters) names a scaling, "
                              "which transformers' first %s releases do not apply and later ones "
                              "do: versions differ on which applies",
                              f->model_type);
        }
        return rc;
    }
    /* The scaling the family's config class sets when config.json names none. */
    cJSON *fallback = cJSON_Parse(f->default_rope_scaling);
    if (fallback == NULL) {
        return attn__fail(why, ATTN_ENOMEM, "config.json: out of memory");
    }
    rc = parse_rope_scaling(why, j, fallback, f, c);
    cJSON_Delete(fallback);
    return rc;
}
