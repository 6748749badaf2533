/* engine/hf_int.h: what the Hugging Face config reader's files share: the row a model family
 * has in the family table (hf_config.c), the typed field readers (hf_fields.c) and the rotary
 * embedding's reader (hf_rope.c). Only engine/hf_*.c include it; they alone see JSON. */
#ifndef ATTN_HF_INT_H
#define ATTN_HF_INT_H

#include "attn_int.h"

#include <cjson/cJSON.h>

/* Which projections have biases. */
enum bias_rule {
    BIAS_NONE,               /* never (Mistral) */
    BIAS_ALL,                /* q, k, v and o always (GPT-2) */
    BIAS_IF_ATTENTION_BIAS,  /* q, k, v and o, iff attention_bias (Llama) */
    BIAS_QKV,                /* q, k and v always, o never (Qwen2) */
    BIAS_QKV_IF_FLAG,        /* q, k and v iff the family's bias flag, o never (GLM, StableLM) */
    BIAS_AS_THE_TENSORS_SAY, /* attnd's own layout: whatever the checkpoint holds */
};

/* How sliding_window applies, and to which layers (layer_types, where given, always decides). */
enum window_rule {
    WINDOW_NOT_READ, /* the family's attention never reads it (Llama) */
    WINDOW_ALL,      /* every layer, when set (Mistral, attnd) */
    WINDOW_QWEN2,    /* only with use_sliding_window; layers >= max_window_layers slide */
    WINDOW_GEMMA2,   /* layers 0, 2, 4...: (i + 1) % 2 != 0 */
    WINDOW_GEMMA3,   /* all but every sliding_window_pattern-th: (i + 1) % pattern != 0 */
};

/* Which rotary embedding the family applies. */
enum rotary_rule {
    ROTARY_WHOLE_HEADS,   /* every dim of a head (Llama); a partial factor is refused */
    ROTARY_PARTIAL,       /* the first partial_rotary_factor x head_dim dims (Phi-3) */
    ROTARY_PARTIAL_NEOX,  /* the same, the factor named rotary_pct, 0.25 when absent */
    ROTARY_NONE,          /* no rotary embedding: positions are in the caller's input (GPT-2) */
    ROTARY_ENGINE_FIELDS, /* attnd's own: partial_rotary_factor and rope_style */
};

struct family;

/* A family's own fields beyond the table's (Gemma's scalar, soft-cap and local RoPE). */
typedef int (*read_extra_fn)(const struct attn__reason *why, const cJSON *j, attn_config *c);

struct family {
    const char *model_type;
    int32_t default_kv_heads; /* num_key_value_heads when absent; 0 = num_attention_heads */
    /* The config class's own values of hidden_size, num_attention_heads, num_hidden_layers and
     * max_position_embeddings, taken when the file leaves them out (Google's gemma-3-4b writes
     * no num_attention_heads); 0: the key is required (max_position_embeddings: 4096). */
    int32_t class_defaults[4];
    int32_t default_head_dim; /* head_dim when absent; 0 = hidden_size / num_attention_heads */
    int32_t default_window;   /* sliding_window when absent (null stays none) */
    enum bias_rule bias;
    enum window_rule window;
    attn_qk_norm qk_norm;        /* q_norm / k_norm tensors, eps from rms_norm_eps */
    float default_norm_eps;      /* rms_norm_eps when absent */
    const char *qk_norm_flag;    /* the norm applies only when this bool is true; NULL = always */
    const char *norm_eps_key;    /* the norm's eps field; NULL = rms_norm_eps */
    enum attn__hf_norms norms;   /* how the norm weights are stored */
    float default_theta;         /* rope_theta when absent; 0 = the engine's 10000 */
    bool is_norm_one_plus;       /* Gemma's RMSNorm: the weight applied is 1 + w */
    const char *const *reads;    /* screened fields it computes itself (NULL-terminated), or NULL */
    read_extra_fn read_extra;    /* or NULL */
    const char *text_config_of;  /* a multimodal wrapper: read text_config as this family */
    bool default_attention_bias; /* attention_bias when absent (GPT-NeoX: true) */
    enum attn__hf_tensors tensors;  /* how a layer's projections are stored */
    const char *attn_name;          /* the attention module's name; NULL = "self_attn" */
    const char *prefixes[2];        /* where layers sit; NULL = model.layers, layers */
    const char *const *keys;        /* the config's names for hidden_size, num_attention_heads,
                                     * num_hidden_layers, max_position_embeddings; NULL = those */
    const char *const *key_aliases; /* older names for the same four (NULL entries: none), which
                                     * the config class maps onto them; or NULL */
    enum rotary_rule rotary;
    double default_partial;        /* ROTARY_PARTIAL: partial_rotary_factor when absent; 0 = 1 */
    attn_rope_style rope_style;    /* how pairs rotate (Cohere, GLM: interleaved) */
    const char *theta_alias;       /* an older name of rope_theta it may use instead, or NULL */
    const char *bias_flag;         /* BIAS_QKV_IF_FLAG's flag; NULL = attention_bias */
    bool has_legacy_scaling_names; /* rope_scaling type "su" / "yarn" meant Phi-3's variants */
    int32_t longrope_original;     /* original_max_position_embeddings when absent (Phi3Config:
                                      4096); 0 = max_position_embeddings */
    bool has_sinks;                /* self_attn.sinks: one learned logit per query head (gpt-oss) */
    bool rope_sliding_only;        /* full layers without RoPE (Cohere 2) */
    int32_t default_pattern;       /* WINDOW_GEMMA3: sliding_window_pattern when absent; 0 = 6 */
    const char *default_rope_scaling; /* rope_scaling (JSON) when absent, or NULL */
    /* Its first transformers releases took head_dim = hidden_size / num_attention_heads whatever
     * the config said, later ones read head_dim: a head_dim other than that is refused. */
    bool is_head_dim_derived;
    /* Its first transformers releases rotated without reading rope_scaling, later ones apply
     * it: any scaling but the default is refused. */
    bool is_scaling_unread;
    /* WINDOW_NOT_READ: sliding_window has a rule of its own here, so parse_window does not
     * refuse it as a stray one: the config class nulls it unless use_sliding_window (the MoE
     * Qwens), or read_extra reads it (SmolLM3). */
    bool has_own_window_rule;
};

/* ---- field readers (hf_fields.c): each reads an optional field; absent or null leaves *out as
 * is, a value of the wrong type or range fails naming the key ---- */

int attn__hf_get_int(const struct attn__reason *why, const cJSON *obj, const char *key,
                     int32_t *out);
int attn__hf_get_int_either(const struct attn__reason *why, const cJSON *obj, const char *key,
                            const char *alias, int32_t *out);
int attn__hf_get_float(const struct attn__reason *why, const cJSON *obj, const char *key,
                       float *out);
int attn__hf_get_double(const struct attn__reason *why, const cJSON *obj, const char *key,
                        double *out);
int attn__hf_get_bool(const struct attn__reason *why, const cJSON *obj, const char *key, bool *out);

/* Parses text[0..len) as one JSON object as Python's json (and so transformers) reads it, or
 * returns NULL with *problem saying why: not a JSON object, a \u0000 escape (cJSON ends a key or
 * string at it, so "rope_theta\u0000" would be read as rope_theta, which Python keeps apart), or
 * anything but whitespace after the object. */
cJSON *attn__hf_json_object(const char *text, size_t len, const char **problem);

/* *problem when the parse ran out of memory: the caller's code is then ATTN_ENOMEM. */
extern const char attn__hf_json_no_memory[];

/* The rotary embedding (hf_rope.c): theta and scaling (also from transformers v5's
 * rope_parameters), the rotated fraction of each head, and, for attnd's own layout, rope_style.
 * Needs c->head_dim. */
int attn__hf_parse_rope(const struct attn__reason *why, const cJSON *j, const struct family *f,
                        attn_config *c);

#endif
