/* tests/check_family.c: the model-family rules of the Hugging Face loader (engine/hf_config.c,
 * and the tensor screen of hf_load.c). Each served family reads its own defaults (Mistral's
 * window and KV heads, Qwen2's use_sliding_window / max_window_layers / layer_types, biases by
 * family), and everything that would change attention without being computed is refused by
 * name: families known and not served, unknown model_types (unless trusted as Llama), screened
 * config fields with a non-neutral value, attnd-only fields in a real family, and attention
 * tensors nobody consumes (fixture folders tests/data/refuse_*). */
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "../engine/attn_int.h"

#define DATA "tests/data/"

/* config.json text of a 2-layer model of family `type` (NULL: no model_type), with `extra`
 * (",\"key\":value..." or "") spliced in. */
static void config_text(char *buf, size_t size, const char *type, const char *extra) {
    char mt[64] = "";
    if (type != NULL) {
        snprintf(mt, sizeof mt, "\"model_type\":\"%s\",", type);
    }
    snprintf(buf, size,
             "{%s\"hidden_size\":64,\"num_attention_heads\":4,\"num_hidden_layers\":2,"
             "\"rope_theta\":10000%s}",
             mt, extra);
}

struct parsed {
    int rc;
    attn_config cfg;
    struct attn__hf_layout lay;
    char err[512];
};

static struct parsed parse(const char *type, const char *extra, const char *trust) {
    struct parsed p;
    memset(&p, 0, sizeof p);
    char json[1024];
    config_text(json, sizeof json, type, extra);
    attn_load_params lp = {.trust_layout = trust};
    p.rc = attn__hf_config_parse(json, strlen(json), &lp, &p.cfg, &p.lay, p.err, sizeof p.err);
    return p;
}

/* As parse, with the load parameters lp (--max-seq...). */
static struct parsed parse_with(const char *type, const char *extra, const attn_load_params *lp) {
    struct parsed p;
    memset(&p, 0, sizeof p);
    char json[1024];
    config_text(json, sizeof json, type, extra);
    p.rc = attn__hf_config_parse(json, strlen(json), lp, &p.cfg, &p.lay, p.err, sizeof p.err);
    return p;
}

static void expect_ok(const struct parsed *p, const char *what) {
    ck_assert_msg(p->rc == ATTN_OK, "%s: %d (%s)", what, p->rc, p->err);
}

/* Refused with code `rc` and a reason naming `name`. */
static void expect_refused(const struct parsed *p, int rc, const char *name, const char *what) {
    ck_assert_msg(p->rc == rc, "%s: got %d, want %d (%s)", what, p->rc, rc, p->err);
    ck_assert_msg(strstr(p->err, name) != NULL, "%s: the reason does not name %s: %s", what, name,
                  p->err);
}

START_TEST(test_family_model_type_decides) {
    struct parsed p = parse("llama", "", NULL);
    expect_ok(&p, "llama");
    ck_assert_str_eq(p.lay.family, "llama");

    p = parse("foo", "", NULL);
    expect_refused(&p, ATTN_EUNSUPPORTED, "unknown model_type 'foo'", "unknown family");
    ck_assert_ptr_nonnull(strstr(p.err, "--trust-layout llama"));
    p = parse("foo", "", "llama");
    expect_ok(&p, "trusted unknown family");
    ck_assert_str_eq(p.lay.family, "llama (trusted layout of foo)");

    p = parse(NULL, "", NULL);
    expect_refused(&p, ATTN_EUNSUPPORTED, "no model_type", "no model_type");
    p = parse(NULL, "", "llama");
    expect_ok(&p, "trusted config without model_type");

    p = parse("foo", "", "gpt2");
    expect_refused(&p, ATTN_EINVAL, "gpt2", "a layout that cannot be trusted");
    /* A trusted layout is another model: fields other families read as a window, theta,
     * scale, causality, K/V layout or rotation are refused there unless neutral (an outside
     * audit found each served as plain Llama attention); Llama itself ignores them, as its
     * config class does. */
    static const char *const others[][2] = {
        {",\"sliding_window\":4", "sliding_window"},
        {",\"rotary_emb_base\":500", "rotary_emb_base"},
        {",\"position_embedding_type\":\"alibi\"", "position_embedding_type"},
        {",\"scale_attn_weights\":false", "scale_attn_weights"},
        {",\"softmax_scale\":0.5", "softmax_scale"},
        {",\"is_causal\":false", "is_causal"},
        {",\"multi_query\":true", "multi_query"},
        {",\"kv_lora_rank\":16", "kv_lora_rank"},
        {",\"rope_interleave\":true", "rope_interleave"},
        {",\"no_rope_layer_interval\":4", "no_rope_layer_interval"},
        {",\"use_bias\":true", "use_bias"},
    };
    for (size_t i = 0; i < sizeof others / sizeof others[0]; i++) {
        p = parse("foo", others[i][0], "llama");
        expect_refused(&p, ATTN_EUNSUPPORTED, others[i][1], others[i][0]);
        ck_assert_ptr_nonnull(strstr(p.err, "--trust-layout"));
    }
    p = parse("foo",
              ",\"sliding_window\":null,\"position_embedding_type\":\"rope\","
              "\"scale_attn_weights\":true,\"is_causal\":true,\"multi_query\":false",
              "llama");
    expect_ok(&p, "trusted, neutral values");
    p = parse("llama", ",\"sliding_window\":null", NULL);
    expect_ok(&p, "llama with a null window");
    ck_assert_int_eq(p.cfg.sliding_window, 0);

    /* Known and not served: refused with what it needs, trusted or not. */
    static const char *const unserved[] = {"llama4"};
    for (size_t i = 0; i < sizeof unserved / sizeof unserved[0]; i++) {
        p = parse(unserved[i], "", "llama");
        expect_refused(&p, ATTN_EUNSUPPORTED, unserved[i], unserved[i]);
        ck_assert_ptr_nonnull(strstr(p.err, "not served yet"));
    }
}
END_TEST

/* Found by tests/fuzz/fuzz_hf_config: a key written twice (cJSON reads the first value, Python's
 * json module the last) and a value outside the engine's range are refused at parse time, naming
 * the key or the field, instead of a later "invalid geometry". */
START_TEST(test_family_repeated_keys_and_ranges_are_named) {
    struct parsed p = parse("qwen2", ",\"model_type\":\"llama\"", NULL);
    expect_refused(&p, ATTN_EIO, "\"model_type\" appears twice", "a repeated model_type");
    p = parse("llama", ",\"rope_scaling\":{\"rope_type\":\"linear\",\"factor\":2,\"factor\":4}",
              NULL);
    expect_refused(&p, ATTN_EIO, "\"factor\" appears twice", "a repeated nested key");
    p = parse("llama", ",\"max_position_embeddings\":32,\"max_position_embeddings\":64", NULL);
    expect_refused(&p, ATTN_EIO, "max_position_embeddings", "a repeated field");

    static const struct {
        const char *extra;
        const char *named;
    } ranges[] = {
        {",\"num_key_value_heads\":3", "num_key_value_heads"},
        {",\"head_dim\":-4", "head_dim"},
        {",\"max_position_embeddings\":33554432", "max_position_embeddings"},
    };
    for (size_t i = 0; i < sizeof ranges / sizeof ranges[0]; i++) {
        p = parse("llama", ranges[i].extra, NULL);
        ck_assert_msg(p.rc != ATTN_OK, "%s accepted", ranges[i].extra);
        ck_assert_msg(strstr(p.err, ranges[i].named) != NULL, "%s: reason %s", ranges[i].extra,
                      p.err);
    }
    /* rope_theta is written by config_text itself; a second one would be a repeat, so a whole
     * text. */
    const char *slow = "{\"model_type\":\"llama\",\"hidden_size\":64,\"num_attention_heads\":4,"
                       "\"num_hidden_layers\":2,\"rope_theta\":0.5}";
    p.rc = attn__hf_config_parse(slow, strlen(slow), NULL, &p.cfg, &p.lay, p.err, sizeof p.err);
    expect_refused(&p, ATTN_EINVAL, "rope_theta must be finite and > 1", "rope_theta 0.5");
    /* read as Python's json reads them: "rope_theta\u0000" is not rope_theta (cJSON cut the
     * key at the NUL and served 500000; found by an outside audit's fuzzer), and nothing may
     * follow the object */
    static const char *const odd[][2] = {
        {"{\"model_type\":\"llama\",\"hidden_size\":64,\"num_attention_heads\":4,"
         "\"num_hidden_layers\":2,\"rope_theta\\u0000\":500000}",
         "\\u0000 escape"},
        {"{\"model_type\":\"llama\",\"hidden_size\":64,\"num_attention_heads\":4,"
         "\"num_hidden_layers\":2} {\"rope_theta\":5}",
         "bytes after the object"},
        /* numbers off JSON's grammar, which cJSON read as 500000 and Python refuses */
        {"{\"model_type\":\"llama\",\"hidden_size\":64,\"num_attention_heads\":4,"
         "\"num_hidden_layers\":2,\"rope_theta\":0500000}",
         "a leading zero"},
        {"{\"model_type\":\"llama\",\"hidden_size\":64,\"num_attention_heads\":4,"
         "\"num_hidden_layers\":2,\"rope_theta\":500000.}",
         "a point without digits"},
        {"{\"model_type\":\"llama\",\"hidden_size\":64,\"num_attention_heads\":4,"
         "\"num_hidden_layers\":2,\"rope_theta\":5.e5}",
         "a point without digits"},
        /* a form feed between values: cJSON skips it as a blank, Python refuses it */
        {"{\"model_type\":\"llama\",\f\"hidden_size\":64,\"num_attention_heads\":4,"
         "\"num_hidden_layers\":2}",
         "a control character between values"},
        /* a raw tab inside a string: Python's strict json refuses it */
        {"{\"model_type\":\"llama\",\"hidden_size\":64,\"num_attention_heads\":4,"
         "\"num_hidden_layers\":2,\"_name_or_path\":\"a\tb\"}",
         "control character"}};
    for (int i = 0; i < (int)(sizeof odd / sizeof odd[0]); i++) {
        p.rc = attn__hf_config_parse(odd[i][0], strlen(odd[i][0]), NULL, &p.cfg, &p.lay, p.err,
                                     sizeof p.err);
        expect_refused(&p, ATTN_EIO, odd[i][1], odd[i][0]);
    }
    const char *escaped = "{\"model_type\":\"llama\",\"hidden_size\":64,\"num_attention_heads\":4,"
                          "\"num_hidden_layers\":2,\"_name_or_path\":\"a\\\\u0000\"}\n";
    p.rc =
        attn__hf_config_parse(escaped, strlen(escaped), NULL, &p.cfg, &p.lay, p.err, sizeof p.err);
    expect_ok(&p, "an escaped backslash before u0000, and a newline after the object");
    const char *numbers = "{\"model_type\":\"llama\",\"hidden_size\":64,\"num_attention_heads\":4,"
                          "\"num_hidden_layers\":2,\"rope_theta\":5e+05,\"rms_norm_eps\":1E-5,"
                          "\"initializer_range\":0.02,\"bos_token_id\":-0,\"x\":[0,-1.5e-3]}";
    p.rc =
        attn__hf_config_parse(numbers, strlen(numbers), NULL, &p.cfg, &p.lay, p.err, sizeof p.err);
    expect_ok(&p, "numbers as JSON writes them");
    ck_assert_float_eq(p.cfg.rope_theta, 500000.0f);
}
END_TEST

/* A whole config.json text, parsed. */
static struct parsed parse_text(const char *json) {
    struct parsed p;
    memset(&p, 0, sizeof p);
    p.rc = attn__hf_config_parse(json, strlen(json), NULL, &p.cfg, &p.lay, p.err, sizeof p.err);
    return p;
}

/* A field written twice under two names that transformers versions (or a config class's
 * attribute_map) read differently is refused unless the two agree; a value the modeling code
 * would take literally (0) is not read as "absent". (Found by an outside audit: each of these
 * was served, some from a model no transformers version runs.) */
START_TEST(test_family_version_ambiguities_are_refused) {
    struct parsed p = parse(
        "llama", ",\"rope_scaling\":{\"type\":\"dynamic\",\"rope_type\":\"linear\",\"factor\":4}",
        NULL);
    expect_refused(&p, ATTN_EIO, "type 'dynamic' and rope_type 'linear' differ", "type/rope_type");
    p = parse("llama",
              ",\"rope_scaling\":{\"type\":\"linear\",\"rope_type\":\"linear\",\"factor\":4}",
              NULL);
    expect_ok(&p, "type and rope_type agreeing");
    ck_assert_float_eq(p.cfg.rope_scaling.factor, 4.0f);
    /* v5 reads rope_theta and partial_rotary_factor inside rope_scaling, v4 never */
    p = parse("llama",
              ",\"rope_scaling\":{\"rope_type\":\"linear\",\"factor\":2,\"rope_theta\":500}", NULL);
    expect_refused(&p, ATTN_EIO, "rope_scaling.rope_theta (500) differs", "theta inside");
    p = parse("llama",
              ",\"rope_scaling\":{\"rope_type\":\"linear\",\"factor\":2,\"rope_theta\":10000}",
              NULL);
    expect_ok(&p, "theta inside agreeing");
    p = parse("phi3",
              ",\"partial_rotary_factor\":0.75,\"rope_scaling\":{\"rope_type\":\"default\","
              "\"partial_rotary_factor\":0.5}",
              NULL);
    expect_refused(&p, ATTN_EIO, "rope_scaling.partial_rotary_factor (0.5) differs", "partial");
    /* rope_parameters, which only v5 reads, holds its own theta; beside a top-level one or a
     * rope_scaling that says otherwise, which applies depends on the version */
    p = parse_text("{\"model_type\":\"llama\",\"hidden_size\":64,\"num_attention_heads\":4,"
                   "\"num_hidden_layers\":2,\"rope_parameters\":{\"rope_type\":\"linear\","
                   "\"factor\":2,\"rope_theta\":500}}");
    expect_ok(&p, "v5 rope_parameters");
    ck_assert_float_eq(p.cfg.rope_theta, 500.0f);
    ck_assert_int_eq(p.cfg.rope_scaling.type, ATTN_ROPE_SCALING_LINEAR);
    p = parse("llama", ",\"rope_parameters\":{\"rope_type\":\"default\",\"rope_theta\":500}", NULL);
    expect_refused(&p, ATTN_EIO, "rope_parameters.rope_theta (500) differs", "both thetas");
    p = parse("llama",
              ",\"rope_scaling\":{\"rope_type\":\"linear\",\"factor\":4},"
              "\"rope_parameters\":{\"rope_type\":\"default\"}",
              NULL);
    expect_refused(&p, ATTN_EIO, "rope_scaling and rope_parameters name different scalings",
                   "both objects");
    p = parse("llama",
              ",\"rope_scaling\":{\"rope_type\":\"linear\",\"factor\":4},"
              "\"rope_parameters\":{\"rope_type\":\"linear\",\"factor\":4}",
              NULL);
    expect_ok(&p, "both objects agreeing");
    /* what exporters write for both readers: the same scaling, rope_theta in rope_parameters
     * and at the top level, type in one and rope_type in the other (a review found these
     * refused by a literal comparison) */
    p = parse_text("{\"model_type\":\"llama\",\"hidden_size\":64,\"num_attention_heads\":4,"
                   "\"num_hidden_layers\":2,\"rope_theta\":500000,\"rope_scaling\":{\"type\":"
                   "\"llama3\",\"factor\":8,\"low_freq_factor\":1,\"high_freq_factor\":4,"
                   "\"original_max_position_embeddings\":8192},\"rope_parameters\":{\"rope_type\":"
                   "\"llama3\",\"factor\":8,\"low_freq_factor\":1,\"high_freq_factor\":4,"
                   "\"original_max_position_embeddings\":8192,\"rope_theta\":500000}}");
    expect_ok(&p, "an exporter's both objects");
    ck_assert_float_eq(p.cfg.rope_theta, 500000.0f);
    ck_assert_int_eq(p.cfg.rope_scaling.type, ATTN_ROPE_SCALING_LLAMA3);
    /* beside a rope_scaling, v4 reads that and never a theta inside it: with none at the top
     * level, an inner one other than the default is ambiguous even when rope_parameters agrees */
    p = parse_text(
        "{\"model_type\":\"llama\",\"hidden_size\":64,\"num_attention_heads\":4,"
        "\"num_hidden_layers\":2,\"rope_scaling\":{\"rope_type\":\"linear\",\"factor\":2,"
        "\"rope_theta\":500000},\"rope_parameters\":{\"rope_type\":\"linear\","
        "\"factor\":2,\"rope_theta\":500000}}");
    expect_refused(&p, ATTN_EIO, "rope_scaling.rope_theta (500000) differs from the default",
                   "inner theta beside rope_scaling");
    p = parse_text("{\"model_type\":\"phi3\",\"hidden_size\":64,\"num_attention_heads\":4,"
                   "\"num_hidden_layers\":2,\"rope_scaling\":{\"rope_type\":\"default\","
                   "\"partial_rotary_factor\":0.5},\"rope_parameters\":{\"rope_type\":\"default\","
                   "\"partial_rotary_factor\":0.5}}");
    expect_refused(&p, ATTN_EIO, "partial_rotary_factor (0.5) differs from the default",
                   "inner partial beside rope_scaling");
    /* Phi3Config renames type su and yarn, which older releases computed their own way */
    p = parse("phi3", ",\"rope_scaling\":{\"type\":\"yarn\",\"factor\":4}", NULL);
    expect_refused(&p, ATTN_EUNSUPPORTED, "type 'yarn' is an old name", "phi3 yarn");
    p = parse("phi3", ",\"rope_scaling\":{\"type\":\"su\",\"short_factor\":[1]}", NULL);
    expect_refused(&p, ATTN_EUNSUPPORTED, "\"rope_type\": \"longrope\"", "phi3 su");
    /* GPT2Config.attribute_map: num_attention_heads sets n_head */
    const char *gpt2 = "{\"model_type\":\"gpt2\",\"n_embd\":64,\"n_layer\":2%s}";
    char text[256];
    snprintf(text, sizeof text, gpt2, ",\"n_head\":4,\"num_attention_heads\":8");
    p = parse_text(text);
    expect_refused(&p, ATTN_EIO, "n_head and num_attention_heads differ", "gpt2 alias");
    snprintf(text, sizeof text, gpt2, ",\"num_attention_heads\":8");
    p = parse_text(text);
    expect_ok(&p, "gpt2 alias alone");
    ck_assert_int_eq(p.cfg.n_heads, 8);
    ck_assert_int_eq(p.cfg.head_dim, 8);
    /* a K/V head count GPT-2 has no place for (it overran the fused projection's buffer) */
    snprintf(text, sizeof text, gpt2, ",\"n_head\":4,\"num_key_value_heads\":2");
    p = parse_text(text);
    expect_refused(&p, ATTN_EUNSUPPORTED, "num_key_value_heads 2", "gpt2 kv heads");
    /* 0 as written: rope_theta 0 is no rotation table at all, a cap of 0 divides by zero, a
     * window of 0 hides every key; none of them is "absent" */
    p = parse_text("{\"model_type\":\"llama\",\"hidden_size\":64,\"num_attention_heads\":4,"
                   "\"num_hidden_layers\":2,\"rope_theta\":0}");
    expect_refused(&p, ATTN_EINVAL, "rope_theta must be finite and > 1", "rope_theta 0");
    /* a finite double float cannot hold: it was narrowed to infinity (no rotation at all) */
    p = parse_text("{\"model_type\":\"llama\",\"hidden_size\":64,\"num_attention_heads\":4,"
                   "\"num_hidden_layers\":2,\"rope_theta\":1e300}");
    expect_refused(&p, ATTN_EIO, "rope_theta 1e+300 is beyond float's range", "rope_theta 1e300");
    p = parse("gemma2", ",\"attn_logit_softcapping\":1e39", NULL);
    expect_refused(&p, ATTN_EIO, "attn_logit_softcapping 1e+39 is beyond", "cap 1e39");
    p = parse("gemma2", ",\"attn_logit_softcapping\":0", NULL);
    expect_refused(&p, ATTN_EIO, "attn_logit_softcapping must be > 0", "cap 0");
    p = parse("gemma2", ",\"attn_logit_softcapping\":null", NULL);
    expect_ok(&p, "cap null");
    ck_assert_float_eq(p.cfg.logit_softcap, 0.0f);
    p = parse("mistral", ",\"num_key_value_heads\":2,\"sliding_window\":0", NULL);
    expect_refused(&p, ATTN_EIO, "sliding_window must be >= 1", "window 0");
    p = parse("qwen2",
              ",\"num_key_value_heads\":2,\"sliding_window\":0,\"use_sliding_window\":false", NULL);
    expect_ok(&p, "an unused window of 0");
    ck_assert_int_eq(p.cfg.sliding_window, 0);
}
END_TEST

/* The fused and transposed layouts: each family's config names, rotary rule and refusals. */
START_TEST(test_family_layout_rules) {
    /* Phi-3: a partial rotary factor, floored as int(head_dim x factor) in double (0.7 x 10 is
     * 7 in Python, 6.99.. in float); longrope is refused by name. */
    struct parsed p = parse("phi3", ",\"head_dim\":20,\"partial_rotary_factor\":0.7", NULL);
    expect_ok(&p, "phi3 0.7 of 20");
    ck_assert_int_eq(p.cfg.rotary_dim, 14);
    ck_assert_int_eq(p.lay.tensors, ATTN__HF_FUSED_QKV);
    /* longrope: one factor per rotated pair (here 14 / 2); Phi3Config's original context is
     * 4096 when absent, and the factor is max_position_embeddings over it. */
    p = parse("phi3",
              ",\"head_dim\":20,\"partial_rotary_factor\":0.7,\"max_position_embeddings\":"
              "16384,\"rope_scaling\":{\"type\":\"longrope\",\"short_factor\":[1,1,1,1,1,1,"
              "1],\"long_factor\":[2,2,2,2,2,2,2]}",
              NULL);
    expect_ok(&p, "phi3 longrope");
    ck_assert_int_eq(p.cfg.rope_scaling.original_max_position, 4096);
    ck_assert_float_eq(p.cfg.rope_scaling.factor, 4.0f);
    p = parse("phi3",
              ",\"rope_scaling\":{\"type\":\"longrope\",\"short_factor\":[1],\"long_factor\":[2]}",
              NULL);
    expect_refused(&p, ATTN_EIO, "short_factor must list rotary dims / 2", "longrope list");
    /* Keys a scaling does not read, and types attnd does not compute, are refused by name. */
    p = parse("llama",
              ",\"rope_scaling\":{\"rope_type\":\"linear\",\"factor\":2,\"finetuned\":true}", NULL);
    expect_refused(&p, ATTN_EUNSUPPORTED, "rope_scaling.finetuned", "linear extra key");
    p = parse("llama", ",\"rope_scaling\":{\"type\":\"su\",\"short_factor\":[1]}", NULL);
    expect_refused(&p, ATTN_EUNSUPPORTED, "type 'su' is not supported", "su");
    /* yarn: factor and max_position_embeddings / original must agree; dynamic reads no other
     * original context than max_position_embeddings; betas default to 32 and 1. */
    p = parse("llama",
              ",\"max_position_embeddings\":8192,\"rope_scaling\":{\"rope_type\":\"yarn\","
              "\"factor\":4,\"original_max_position_embeddings\":8192}",
              NULL);
    expect_refused(&p, ATTN_EUNSUPPORTED, "transformers versions differ", "yarn factor");
    p = parse("llama",
              ",\"max_position_embeddings\":8192,\"rope_scaling\":{\"rope_type\":\"yarn\","
              "\"factor\":4,\"original_max_position_embeddings\":2048}",
              NULL);
    expect_ok(&p, "yarn");
    ck_assert_int_eq(attn_config_check(&p.cfg), ATTN_OK);
    ck_assert(p.cfg.rope_scaling.beta_fast == 32 && p.cfg.rope_scaling.beta_slow == 1);
    p = parse("llama",
              ",\"max_position_embeddings\":8192,\"rope_scaling\":{\"rope_type\":\"dynamic\","
              "\"factor\":2,\"original_max_position_embeddings\":4096}",
              NULL);
    expect_refused(&p, ATTN_EUNSUPPORTED, "dynamic rope_scaling with", "dynamic original");
    p = parse(
        "llama",
        ",\"max_position_embeddings\":64,\"rope_scaling\":{\"rope_type\":\"dynamic\",\"factor\":0}",
        NULL);
    expect_refused(&p, ATTN_EIO, "factor must be > 0", "dynamic factor 0");

    /* GPT-NeoX: rotary_pct 0.25 when absent, rotary_emb_base as theta, biases unless
     * attention_bias is false; the module is "attention" under gpt_neox.layers. */
    const char *neox = "{\"model_type\":\"gpt_neox\",\"hidden_size\":64,\"num_attention_heads\":4,"
                       "\"num_hidden_layers\":2,\"rotary_emb_base\":20000}";
    p.rc = attn__hf_config_parse(neox, strlen(neox), NULL, &p.cfg, &p.lay, p.err, sizeof p.err);
    expect_ok(&p, "gpt_neox");
    ck_assert_int_eq(p.cfg.rotary_dim, 4);
    ck_assert_float_eq(p.cfg.rope_theta, 20000.0f);
    ck_assert(p.cfg.has_qkv_bias && p.cfg.has_o_bias);
    ck_assert_str_eq(p.lay.attn_name, "attention");
    ck_assert_str_eq(p.lay.prefixes[0], "gpt_neox.layers");
    p = parse("gpt_neox", ",\"rotary_pct\":1.0,\"attention_bias\":false", NULL);
    expect_ok(&p, "gpt_neox whole rotary, no bias");
    ck_assert_int_eq(p.cfg.rotary_dim, 16);
    ck_assert(!p.cfg.has_qkv_bias && !p.cfg.has_o_bias);
    p = parse("gpt_neox", ",\"rotary_pct\":0.5,\"partial_rotary_factor\":0.25", NULL);
    expect_refused(&p, ATTN_EIO, "rotary_pct and partial_rotary_factor", "two fractions");
    /* config_text writes rope_theta 10000: a different rotary_emb_base is ambiguous. */
    p = parse("gpt_neox", ",\"rotary_emb_base\":10000", NULL);
    expect_ok(&p, "the same theta twice");
    p = parse("gpt_neox", ",\"rotary_emb_base\":20000", NULL);
    expect_refused(&p, ATTN_EIO, "rope_theta and rotary_emb_base differ", "two thetas");

    /* Falcon: K/V heads by multi_query / new_decoder_architecture, the original checkpoints'
     * n_head / n_layer / n_head_kv names, biases iff bias, head_dim from hidden_size only. */
    p = parse("falcon", "", NULL);
    expect_ok(&p, "falcon multi_query by default");
    ck_assert_int_eq(p.cfg.n_kv_heads, 1);
    ck_assert(!p.cfg.has_qkv_bias && !p.cfg.has_o_bias);
    ck_assert_str_eq(p.lay.attn_name, "self_attention");
    ck_assert_str_eq(p.lay.prefixes[0], "transformer.h");
    ck_assert_int_eq(p.lay.tensors, ATTN__HF_FALCON);
    p = parse("falcon", ",\"multi_query\":false,\"bias\":true", NULL);
    expect_ok(&p, "falcon one K/V head per query head");
    ck_assert_int_eq(p.cfg.n_kv_heads, 4);
    ck_assert(p.cfg.has_qkv_bias && p.cfg.has_o_bias);
    p = parse("falcon", ",\"multi_query\":false,\"num_kv_heads\":2", NULL);
    expect_refused(&p, ATTN_ESHAPE, "one K/V head per query head", "falcon kv heads ignored");
    p = parse("falcon", ",\"new_decoder_architecture\":true,\"n_head_kv\":2", NULL);
    expect_ok(&p, "falcon new_decoder_architecture");
    ck_assert_int_eq(p.cfg.n_kv_heads, 2);
    p = parse("falcon", ",\"new_decoder_architecture\":true", NULL);
    expect_ok(&p, "falcon new_decoder_architecture, no num_kv_heads");
    ck_assert_int_eq(p.cfg.n_kv_heads, 4);
    p = parse("falcon", ",\"new_decoder_architecture\":true,\"num_kv_heads\":3", NULL);
    expect_refused(&p, ATTN_ESHAPE, "num_kv_heads (3) must divide", "falcon 3 of 4");
    p = parse("falcon", ",\"new_decoder_architecture\":true,\"num_kv_heads\":1,\"n_head_kv\":2",
              NULL);
    expect_refused(&p, ATTN_EIO, "num_kv_heads and n_head_kv differ", "falcon two kv counts");
    p = parse("falcon", ",\"n_head\":8", NULL);
    expect_refused(&p, ATTN_EIO, "num_attention_heads and n_head differ", "falcon two counts");
    p = parse("falcon", ",\"alibi\":true", NULL);
    expect_refused(&p, ATTN_EUNSUPPORTED, "alibi changes falcon attention", "falcon alibi");
    p = parse("falcon", ",\"head_dim\":8", NULL);
    expect_refused(&p, ATTN_ESHAPE, "hidden_size / num_attention_heads", "falcon head_dim");
    const char *rw = "{\"model_type\":\"falcon\",\"hidden_size\":64,\"n_head\":4,\"n_layer\":3}";
    p.rc = attn__hf_config_parse(rw, strlen(rw), NULL, &p.cfg, &p.lay, p.err, sizeof p.err);
    expect_ok(&p, "falcon's original names");
    ck_assert(p.cfg.n_heads == 4 && p.cfg.n_layers == 3 && p.cfg.head_dim == 16);

    /* DeepSeek: the MLA dims (V3's defaults when absent), q_lora_rank null for q_proj, one
     * latent, head_dim the score's whatever the config's head_dim says, rope_interleave false
     * rotating halves, the yarn mscale_all_dim correction; a zero kv_lora_rank is refused. */
    p = parse("deepseek_v3", ",\"head_dim\":64,\"num_key_value_heads\":2", NULL);
    expect_refused(&p, ATTN_EUNSUPPORTED, "num_key_value_heads 2", "MLA with fewer K/V heads");
    p = parse("deepseek_v3", ",\"head_dim\":64,\"num_key_value_heads\":4", NULL);
    expect_ok(&p, "deepseek_v3 defaults");
    ck_assert(p.cfg.q_lora_rank == 1536 && p.cfg.kv_lora_rank == 512 &&
              p.cfg.qk_nope_head_dim == 128 && p.cfg.qk_rope_head_dim == 64 &&
              p.cfg.v_head_dim == 128 && p.cfg.n_kv_heads == 1 && p.cfg.head_dim == 192 &&
              p.cfg.rotary_dim == 64);
    ck_assert_int_eq(p.cfg.rope_style, ATTN_ROPE_STYLE_INTERLEAVED);
    ck_assert_int_eq(p.lay.tensors, ATTN__HF_MLA);
    p = parse("deepseek_v3", ",\"q_lora_rank\":null,\"rope_interleave\":false", NULL);
    expect_ok(&p, "deepseek_v3 q_proj, halves");
    ck_assert_int_eq(p.cfg.q_lora_rank, 0);
    ck_assert_int_eq(p.cfg.rope_style, ATTN_ROPE_STYLE_HALF);
    /* Kimi-K2's own model_type: DeepSeek-V3's code, read as deepseek_v3 */
    p = parse("kimi_k2", ",\"q_lora_rank\":null,\"rope_interleave\":false", NULL);
    expect_ok(&p, "kimi_k2");
    ck_assert_str_eq(p.lay.family, "kimi_k2");
    ck_assert(p.cfg.kv_lora_rank == 512 && p.cfg.rope_style == ATTN_ROPE_STYLE_HALF);
    p = parse("deepseek_v2", ",\"rope_interleave\":false", NULL);
    expect_ok(&p, "deepseek_v2 does not read rope_interleave");
    ck_assert_int_eq(p.cfg.rope_style, ATTN_ROPE_STYLE_INTERLEAVED);
    p = parse("deepseek_v3", ",\"kv_lora_rank\":0", NULL);
    expect_refused(&p, ATTN_EIO, "kv_lora_rank must be > 0", "deepseek kv_lora_rank 0");
    /* q_lora_rank 0 is not null: the modeling code (`if self.q_lora_rank is None`) builds a
     * zero-rank q_a_proj for it, never q_proj, so serving q_proj would be another model */
    p = parse("deepseek_v3", ",\"q_lora_rank\":0", NULL);
    expect_refused(&p, ATTN_EIO, "q_lora_rank must be > 0", "deepseek q_lora_rank 0");
    p = parse("deepseek_v3",
              ",\"max_position_embeddings\":2560,\"rope_scaling\":{\"type\":\"yarn\",\"factor\":40,"
              "\"original_max_position_embeddings\":64,\"mscale\":1.0,\"mscale_all_dim\":1.0}",
              NULL);
    expect_ok(&p, "deepseek yarn");
    double ms = 0.1 * log(40.0) + 1.0;
    ck_assert_float_eq_tol(p.cfg.softmax_scale, (float)(ms * ms / sqrt(192.0)), 1e-6f);
    /* V2: DeepSeek's modeling_deepseek.py applies the same mscale^2, transformers' port of V2
     * does not (found by an outside audit): refused until modeling_code says whose code */
    static const char v2_yarn[] =
        ",\"max_position_embeddings\":2560,\"rope_scaling\":{\"type\":\"yarn\",\"factor\":40,"
        "\"original_max_position_embeddings\":64,\"mscale\":0.707,\"mscale_all_dim\":0.707}";
    p = parse("deepseek_v2", v2_yarn, NULL);
    expect_refused(&p, ATTN_EUNSUPPORTED, "deepseek_v2 with rope_scaling.mscale_all_dim 0.707",
                   "V2 yarn without a modeling code");
    ck_assert_ptr_nonnull(strstr(p.err, "--modeling-code checkpoint or transformers"));
    double ms2 = 0.1 * 0.707 * log(40.0) + 1.0;
    char json[1024];
    config_text(json, sizeof json, "deepseek_v2", v2_yarn);
    static const char *const codes[] = {"checkpoint", "transformers"};
    for (int i = 0; i < 2; i++) {
        attn_load_params lp = {.modeling_code = codes[i]};
        p.rc = attn__hf_config_parse(json, strlen(json), &lp, &p.cfg, &p.lay, p.err, sizeof p.err);
        expect_ok(&p, codes[i]);
        double want = (i == 0 ? ms2 * ms2 : 1.0) / sqrt(192.0);
        ck_assert_float_eq_tol(p.cfg.softmax_scale, (float)want, 1e-6f);
        /* the rotary embedding's own attention factor is the same in both */
        ck_assert_float_eq_tol(p.cfg.rope_scaling.mscale_all_dim, 0.707f, 1e-7f);
    }
    attn_load_params bad = {.modeling_code = "remote"};
    p.rc = attn__hf_config_parse(json, strlen(json), &bad, &p.cfg, &p.lay, p.err, sizeof p.err);
    expect_refused(&p, ATTN_EINVAL, "modeling code 'remote'", "an unknown modeling code");
    /* where the two agree, no choice is asked for: no scaling, or mscale_all_dim 0 */
    p = parse("deepseek_v2", "", NULL);
    expect_ok(&p, "V2 without rope scaling");
    ck_assert_float_eq_tol(p.cfg.softmax_scale, (float)(1.0 / sqrt(192.0)), 1e-7f);
    p = parse("deepseek_v2",
              ",\"max_position_embeddings\":2560,\"rope_scaling\":{\"type\":\"yarn\","
              "\"factor\":40,\"original_max_position_embeddings\":64,\"mscale_all_dim\":0}",
              NULL);
    expect_ok(&p, "V2 yarn with mscale_all_dim 0");
    ck_assert_float_eq_tol(p.cfg.softmax_scale, (float)(1.0 / sqrt(192.0)), 1e-7f);
    /* V3: any mscale_all_dim but 0 applies, as transformers' `if mscale_all_dim:` reads it */
    p = parse("deepseek_v3",
              ",\"max_position_embeddings\":2560,\"rope_scaling\":{\"type\":\"yarn\",\"factor\":40,"
              "\"original_max_position_embeddings\":64,\"mscale\":1.0,\"mscale_all_dim\":-0.5}",
              NULL);
    expect_ok(&p, "deepseek_v3 negative mscale_all_dim");
    double msn = 0.1 * -0.5 * log(40.0) + 1.0;
    ck_assert_float_eq_tol(p.cfg.softmax_scale, (float)(msn * msn / sqrt(192.0)), 1e-6f);

    /* GPT-2: its own config names, no rotary embedding, both biases, the scale rule. */
    const char *gpt2 = "{\"model_type\":\"gpt2\",\"n_embd\":64,\"n_head\":4,\"n_layer\":3,"
                       "\"n_positions\":128}";
    p.rc = attn__hf_config_parse(gpt2, strlen(gpt2), NULL, &p.cfg, &p.lay, p.err, sizeof p.err);
    expect_ok(&p, "gpt2");
    ck_assert_int_eq(p.cfg.hidden_size, 64);
    ck_assert_int_eq(p.cfg.n_heads, 4);
    ck_assert_int_eq(p.cfg.n_kv_heads, 4);
    ck_assert_int_eq(p.cfg.n_layers, 3);
    ck_assert_int_eq(p.cfg.max_seq, 128);
    ck_assert_int_eq(p.cfg.rotary_dim, -1);
    ck_assert(p.cfg.has_qkv_bias && p.cfg.has_o_bias);
    ck_assert_float_eq(p.cfg.softmax_scale, 0.0f); /* the engine's head_dim^-1/2 */
    ck_assert_str_eq(p.lay.attn_name, "attn");
    const char *unscaled = "{\"model_type\":\"gpt2\",\"n_embd\":64,\"n_head\":4,\"n_layer\":3,"
                           "\"scale_attn_weights\":false}";
    p.rc = attn__hf_config_parse(unscaled, strlen(unscaled), NULL, &p.cfg, &p.lay, p.err,
                                 sizeof p.err);
    expect_ok(&p, "gpt2 unscaled");
    ck_assert_float_eq(p.cfg.softmax_scale, 1.0f);
    const char *by_layer = "{\"model_type\":\"gpt2\",\"n_embd\":64,\"n_head\":4,\"n_layer\":3,"
                           "\"scale_attn_by_inverse_layer_idx\":true}";
    p.rc = attn__hf_config_parse(by_layer, strlen(by_layer), NULL, &p.cfg, &p.lay, p.err,
                                 sizeof p.err);
    expect_refused(&p, ATTN_EUNSUPPORTED, "scale_attn_by_inverse_layer_idx", "gpt2 by layer");
    p = parse("gpt2", "", NULL); /* GPT2Config.attribute_map reads Llama's names as its own */
    expect_ok(&p, "gpt2 with llama's names");
    ck_assert(p.cfg.hidden_size == 64 && p.cfg.n_heads == 4 &&
              p.cfg.n_layers == 2); /* StableLM 2: a quarter rotated, q/k/v biases with
                                     * use_qkv_bias, the per-head LayerNorm only with qk_layernorm
                                     * (eps layer_norm_eps), its weights one tensor per head. */
    p = parse("stablelm", ",\"num_key_value_heads\":2,\"use_qkv_bias\":true", NULL);
    expect_ok(&p, "stablelm");
    ck_assert_int_eq(p.cfg.rotary_dim, 4);
    ck_assert(p.cfg.has_qkv_bias && !p.cfg.has_o_bias);
    ck_assert_int_eq(p.cfg.qk_norm, ATTN_QK_NORM_NONE);
    p = parse("stablelm",
              ",\"num_key_value_heads\":4,\"qk_layernorm\":true,\"layer_norm_eps\":1e-6", NULL);
    expect_ok(&p, "stablelm 12b");
    ck_assert_int_eq(p.cfg.qk_norm, ATTN_QK_NORM_HEAD_LAYERNORM);
    ck_assert_float_eq(p.cfg.qk_norm_eps, 1e-6f);
    ck_assert_int_eq(p.lay.norms, ATTN__HF_NORM_PER_HEAD_LIST);
    p = parse("stablelm", "", NULL); /* StableLmConfig's 32 KV heads when absent: not 4's divisor */
    expect_refused(&p, ATTN_ESHAPE, "num_key_value_heads (32)", "stablelm default kv heads");
    /* Cohere: interleaved whole-head rotary; use_qk_norm's weights a (heads, head_dim) matrix. */
    p = parse("cohere", ",\"use_qk_norm\":true", NULL);
    expect_ok(&p, "cohere");
    ck_assert_int_eq(p.cfg.rope_style, ATTN_ROPE_STYLE_INTERLEAVED);
    ck_assert_int_eq(p.cfg.rotary_dim, 16);
    ck_assert_int_eq(p.cfg.qk_norm, ATTN_QK_NORM_HEAD_LAYERNORM);
    ck_assert_int_eq(p.lay.norms, ATTN__HF_NORM_MATRIX);
    p = parse("cohere", ",\"partial_rotary_factor\":0.5", NULL);
    expect_refused(&p, ATTN_EUNSUPPORTED, "partial_rotary_factor", "cohere partial");
    /* GLM: half of each head, interleaved; head_dim 128 and 2 KV heads when absent. */
    p = parse("glm", ",\"attention_bias\":true", NULL);
    expect_ok(&p, "glm");
    ck_assert_int_eq(p.cfg.head_dim, 128);
    ck_assert_int_eq(p.cfg.n_kv_heads, 2);
    ck_assert_int_eq(p.cfg.rotary_dim, 64);
    ck_assert_int_eq(p.cfg.rope_style, ATTN_ROPE_STYLE_INTERLEAVED);
    ck_assert(p.cfg.has_qkv_bias && !p.cfg.has_o_bias);

    /* What each layout consumes, and nothing else. */
    attn_config c;
    memset(&c, 0, sizeof c);
    c.has_qkv_bias = c.has_o_bias = true;
    struct attn__hf_layout lay;
    memset(&lay, 0, sizeof lay);
    lay.tensors = ATTN__HF_GPT2;
    ck_assert(attn__hf_tensor_is_consumed(&c, &lay, "c_attn.weight"));
    ck_assert(attn__hf_tensor_is_consumed(&c, &lay, "masked_bias"));
    ck_assert(!attn__hf_tensor_is_consumed(&c, &lay, "q_attn.weight")); /* cross-attention's */
    ck_assert(!attn__hf_tensor_is_consumed(&c, &lay, "q_proj.weight"));
    lay.tensors = ATTN__HF_NEOX;
    ck_assert(attn__hf_tensor_is_consumed(&c, &lay, "query_key_value.bias"));
    c.has_qkv_bias = false;
    ck_assert(!attn__hf_tensor_is_consumed(&c, &lay, "query_key_value.bias"));
    lay.tensors = ATTN__HF_FUSED_QKV;
    ck_assert(attn__hf_tensor_is_consumed(&c, &lay, "qkv_proj.weight"));
    ck_assert(!attn__hf_tensor_is_consumed(&c, &lay, "q_norm.weight"));
    /* StableLM's per-head norm list: heads in range, written plainly, and nothing else. */
    lay.tensors = ATTN__HF_QKVO;
    lay.norms = ATTN__HF_NORM_PER_HEAD_LIST;
    ck_assert(!attn__hf_tensor_is_consumed(&c, &lay, "q_layernorm.norms.0.weight"));
    c.qk_norm = ATTN_QK_NORM_HEAD_LAYERNORM;
    c.n_heads = 12;
    c.n_kv_heads = 4;
    ck_assert(attn__hf_tensor_is_consumed(&c, &lay, "q_layernorm.norms.0.weight"));
    ck_assert(attn__hf_tensor_is_consumed(&c, &lay, "q_layernorm.norms.11.weight"));
    ck_assert(!attn__hf_tensor_is_consumed(&c, &lay, "q_layernorm.norms.12.weight"));
    ck_assert(attn__hf_tensor_is_consumed(&c, &lay, "k_layernorm.norms.3.weight"));
    ck_assert(!attn__hf_tensor_is_consumed(&c, &lay, "k_layernorm.norms.4.weight"));
    ck_assert(!attn__hf_tensor_is_consumed(&c, &lay, "k_layernorm.norms.03.weight"));
    ck_assert(!attn__hf_tensor_is_consumed(&c, &lay, "k_layernorm.norms.1.bias"));
    ck_assert(!attn__hf_tensor_is_consumed(&c, &lay, "k_layernorm.norms..weight"));
    ck_assert(!attn__hf_tensor_is_consumed(&c, &lay, "q_norm.weight"));
    /* sinks: only where the family has them. */
    ck_assert(!attn__hf_tensor_is_consumed(&c, &lay, "sinks"));
    c.has_sinks = true;
    ck_assert(attn__hf_tensor_is_consumed(&c, &lay, "sinks"));
    ck_assert(!attn__hf_tensor_is_consumed(&c, &lay, "sinks.weight"));

    /* gpt-oss with nothing but the geometry: GptOssConfig's defaults, its yarn included. */
    const char *oss = "{\"model_type\":\"gpt_oss\",\"hidden_size\":2880,"
                      "\"num_attention_heads\":64,\"num_hidden_layers\":24}";
    p.rc = attn__hf_config_parse(oss, strlen(oss), NULL, &p.cfg, &p.lay, p.err, sizeof p.err);
    expect_ok(&p, "gpt_oss defaults");
    ck_assert(p.cfg.has_sinks && p.cfg.has_qkv_bias && p.cfg.has_o_bias);
    ck_assert_int_eq(p.cfg.n_kv_heads, 8);
    ck_assert_int_eq(p.cfg.head_dim, 64);
    ck_assert_int_eq(p.cfg.sliding_window, 128);
    ck_assert(attn_config_layer_is_sliding(&p.cfg, 0) && !attn_config_layer_is_sliding(&p.cfg, 1));
    ck_assert_int_eq(p.cfg.rope_scaling.type, ATTN_ROPE_SCALING_YARN);
    ck_assert_float_eq(p.cfg.rope_scaling.factor, 32.0f);
    ck_assert_int_eq(p.cfg.rope_scaling.original_max_position, 4096);
    ck_assert(p.cfg.rope_scaling.yarn_fractional_range);
    ck_assert_float_eq(p.cfg.rope_theta, 150000.0f);
    p = parse("gpt_oss",
              ",\"num_key_value_heads\":2,\"attention_bias\":false,\"rope_scaling\":null", NULL);
    expect_ok(&p, "gpt_oss without biases or scaling");
    ck_assert(!p.cfg.has_qkv_bias && !p.cfg.has_o_bias);
    ck_assert_int_eq(p.cfg.rope_scaling.type, ATTN_ROPE_SCALING_NONE);
}
END_TEST

/* Every screened field refuses a non-neutral value, naming it, and accepts its neutral ones. */
START_TEST(test_family_screened_fields) {
    static const struct {
        const char *field;
        const char *bad;
        const char *neutral;
    } cases[] = {
        {"attn_logit_softcapping", "50.0", "null"},
        {"query_pre_attn_scalar", "256", "null"},
        {"rope_local_base_freq", "10000", "null"},
        {"sliding_window_pattern", "6", "null"},
        {"attention_multiplier", "0.0078125", "null"},
        {"clip_qkv", "8", "null"},
        {"attention_chunk_size", "8192", "null"},
        {"no_rope_layers", "[1,0]", "null"},
        {"nope_layer_interval", "4", "null"},
        {"use_qk_norm", "true", "false"},
        {"qk_layernorm", "true", "false"},
        {"qk_norm", "true", "false"},
        {"alibi", "true", "false"},
        {"use_logn_attn", "true", "false"},
        {"logn_attn", "true", "false"},
        {"attn_temperature_tuning", "true", "false"},
        {"rotary_pct", "0.25", "1.0"},
        {"layer_types", "[\"sliding_attention\",\"full_attention\"]",
         "[\"full_attention\",\"full_attention\"]"},
    };
    static const char *const families[] = {"llama", "mistral",   "mixtral", "qwen2", "qwen2_moe",
                                           "qwen3", "qwen3_moe", "olmo2",   "attnd"};
    for (size_t f = 0; f < sizeof families / sizeof families[0]; f++) {
        for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
            if ((strcmp(families[f], "qwen2") == 0 || strcmp(families[f], "qwen3") == 0) &&
                strcmp(cases[i].field, "layer_types") == 0) {
                continue; /* the Qwen families read it (test_family_defaults_and_windows); the
                             MoE Qwens screen it */
            }
            char extra[256], what[128];
            snprintf(what, sizeof what, "%s %s=%s", families[f], cases[i].field, cases[i].bad);
            snprintf(extra, sizeof extra, ",\"num_key_value_heads\":2,\"%s\":%s", cases[i].field,
                     cases[i].bad);
            struct parsed p = parse(families[f], extra, NULL);
            expect_refused(&p, ATTN_EUNSUPPORTED, cases[i].field, what);
            snprintf(extra, sizeof extra, ",\"num_key_value_heads\":2,\"%s\":%s", cases[i].field,
                     cases[i].neutral);
            p = parse(families[f], extra, NULL);
            expect_ok(&p, extra);
        }
    }
}
END_TEST

/* rope_style and partial rotary are the engine's generic fields: attnd reads them, the real
 * families' attention does not (their apply_rotary_pos_emb rotates whole heads). */
START_TEST(test_family_engine_fields_are_attnd_only) {
    struct parsed p =
        parse("attnd", ",\"rope_style\":\"interleaved\",\"partial_rotary_factor\":0.5", NULL);
    expect_ok(&p, "attnd");
    ck_assert_int_eq(p.cfg.rotary_dim, 8);
    ck_assert_int_eq(p.cfg.rope_style, ATTN_ROPE_STYLE_INTERLEAVED);
    p = parse("llama", ",\"rope_style\":\"interleaved\"", NULL);
    expect_refused(&p, ATTN_EUNSUPPORTED, "rope_style", "llama rope_style");
    p = parse("qwen2", ",\"num_key_value_heads\":2,\"partial_rotary_factor\":0.5", NULL);
    expect_refused(&p, ATTN_EUNSUPPORTED, "partial_rotary_factor", "qwen2 partial rotary");
    p = parse(
        "llama",
        ",\"rope_parameters\":{\"rope_type\":\"default\",\"rope_theta\":10000,\"partial_rotary_"
        "factor\":0.5}",
        NULL);
    expect_refused(&p, ATTN_EUNSUPPORTED, "partial_rotary_factor", "v5 rope_parameters");
    p = parse("llama", ",\"partial_rotary_factor\":1.0", NULL);
    expect_ok(&p, "llama with a whole rotary");
}
END_TEST

/* Each family's own defaults and window rule (configuration_*.py). */
START_TEST(test_family_defaults_and_windows) {
    /* Llama's attention never reads sliding_window, but transformers' DynamicCache(config) since
     * 4.56 makes every layer's cache keep only that many tokens, so decode steps see a window
     * that earlier releases (and the same release's prefill) do not: a window that could bind
     * is refused (found by an outside audit), one of at least the positions served (4096 here, or
     * --max-seq) changes nothing; num_key_value_heads defaults to the heads. */
    struct parsed p = parse("llama", ",\"sliding_window\":4", NULL);
    expect_refused(&p, ATTN_EUNSUPPORTED, "sliding_window 4: llama attention does not read it",
                   "llama with a stray window");
    static const char *const stray[] = {"olmo",     "olmo2",    "gemma",  "granite", "granitemoe",
                                        "gpt_neox", "stablelm", "cohere", "glm4"};
    for (size_t i = 0; i < sizeof stray / sizeof stray[0]; i++) {
        p = parse(stray[i], ",\"num_key_value_heads\":2,\"head_dim\":16,\"sliding_window\":4",
                  NULL);
        expect_refused(&p, ATTN_EUNSUPPORTED, "sliding_window 4", stray[i]);
    }
    attn_load_params longer = {.max_seq = 100000};
    p = parse_with("llama", ",\"sliding_window\":32768", &longer);
    expect_refused(&p, ATTN_EUNSUPPORTED, "100000 positions served", "a window --max-seq passes");
    p = parse("llama", ",\"sliding_window\":32768", NULL);
    expect_ok(&p, "llama with a window longer than its positions");
    ck_assert_int_eq(p.cfg.sliding_window, 0);
    p = parse("llama", ",\"sliding_window\":0", NULL);
    expect_ok(&p, "llama with a window of 0, read as none");
    p = parse("llama", "", NULL);
    ck_assert_int_eq(p.cfg.n_kv_heads, 4);
    /* Mistral: an absent window is 4096 and absent KV heads 8; null means none / one per head. */
    p = parse("mistral", "", NULL);
    expect_refused(&p, ATTN_ESHAPE, "num_key_value_heads (8)", "mistral default KV heads");
    p = parse("mistral", ",\"num_key_value_heads\":null,\"sliding_window\":null", NULL);
    expect_ok(&p, "mistral nulls");
    ck_assert_int_eq(p.cfg.n_kv_heads, 4);
    ck_assert_int_eq(p.cfg.sliding_window, 0);
    p = parse("mistral", ",\"num_key_value_heads\":2", NULL);
    expect_ok(&p, "mistral");
    ck_assert_int_eq(p.cfg.sliding_window, 4096);
    p = parse("mistral", ",\"num_key_value_heads\":2,\"sliding_window\":16", NULL);
    ck_assert_int_eq(p.cfg.sliding_window, 16);

    /* Qwen2: off unless use_sliding_window; then layers >= max_window_layers (28) slide. */
    static const struct {
        const char *extra;
        int32_t window;   /* the config's window */
        unsigned sliding; /* bit i: layer i slides */
    } qwen2[] = {
        {",\"sliding_window\":16", 0, 0},
        {",\"use_sliding_window\":true,\"sliding_window\":16", 16, 0}, /* 2 layers < 28 */
        {",\"use_sliding_window\":true,\"sliding_window\":16,\"max_window_layers\":0", 16, 3},
        {",\"use_sliding_window\":true,\"sliding_window\":16,\"max_window_layers\":2", 16, 0},
        {",\"use_sliding_window\":true,\"sliding_window\":16,\"max_window_layers\":1", 16, 2},
        {",\"use_sliding_window\":true,\"max_window_layers\":0", 4096, 3},
        {",\"use_sliding_window\":true,\"sliding_window\":null,\"max_window_layers\":0", 0, 0},
        {",\"use_sliding_window\":true,\"sliding_window\":16,"
         "\"layer_types\":[\"sliding_attention\",\"sliding_attention\"]",
         16, 3},
        {",\"use_sliding_window\":true,\"sliding_window\":16,"
         "\"layer_types\":[\"full_attention\",\"sliding_attention\"]",
         16, 2},
    };
    for (size_t i = 0; i < sizeof qwen2 / sizeof qwen2[0]; i++) {
        char extra[256];
        snprintf(extra, sizeof extra, ",\"num_key_value_heads\":2%s", qwen2[i].extra);
        p = parse("qwen2", extra, NULL);
        expect_ok(&p, extra);
        ck_assert_msg(p.cfg.sliding_window == qwen2[i].window, "%s: window %d, want %d", extra,
                      (int)p.cfg.sliding_window, (int)qwen2[i].window);
        for (int32_t layer = 0; layer < 2; layer++) {
            bool want = (qwen2[i].sliding >> layer) & 1u;
            ck_assert_msg(attn_config_layer_is_sliding(&p.cfg, layer) == want,
                          "%s: layer %d slides: %d, want %d", extra, (int)layer,
                          attn_config_layer_is_sliding(&p.cfg, layer), want);
        }
    }
    /* A layer kind nobody serves is refused by name. */
    p = parse("qwen2",
              ",\"num_key_value_heads\":2,\"use_sliding_window\":true,"
              "\"layer_types\":[\"chunked_attention\",\"full_attention\"]",
              NULL);
    expect_refused(&p, ATTN_EUNSUPPORTED, "chunked_attention", "an unknown layer kind");
}
END_TEST

/* The q/k-norm families: their norm kind, eps from rms_norm_eps (or the family's default), and
 * Qwen3's own defaults (head_dim 128, 32 KV heads) when the fields are absent. */
START_TEST(test_family_qk_norms) {
    struct parsed p = parse("qwen3", ",\"num_key_value_heads\":2,\"head_dim\":8", NULL);
    expect_ok(&p, "qwen3");
    ck_assert_int_eq(p.cfg.qk_norm, ATTN_QK_NORM_HEAD);
    ck_assert_float_eq(p.cfg.qk_norm_eps, 1e-6f);
    ck_assert_int_eq(p.cfg.head_dim, 8);
    const char *bare = "{\"model_type\":\"qwen3\",\"hidden_size\":64,\"num_attention_heads\":32,"
                       "\"num_hidden_layers\":1}";
    p.rc = attn__hf_config_parse(bare, strlen(bare), NULL, &p.cfg, &p.lay, p.err, sizeof p.err);
    expect_ok(&p, "qwen3 defaults");
    ck_assert_int_eq(p.cfg.head_dim, 128);
    ck_assert_int_eq(p.cfg.n_kv_heads, 32);
    p = parse("olmo2", "", NULL);
    expect_ok(&p, "olmo2");
    ck_assert_int_eq(p.cfg.qk_norm, ATTN_QK_NORM_WIDTH);
    ck_assert_float_eq(p.cfg.qk_norm_eps, 1e-5f);
    ck_assert_int_eq(p.cfg.n_kv_heads, 4);
    p = parse("olmo2", ",\"rms_norm_eps\":0", NULL);
    expect_refused(&p, ATTN_EIO, "rms_norm_eps", "a zero eps");
    p = parse("llama", ",\"rms_norm_eps\":1e-5", NULL);
    ck_assert_int_eq(p.cfg.qk_norm, ATTN_QK_NORM_NONE);
}
END_TEST

/* The MoE families read their dense sibling's attention with their own config class's defaults
 * (configuration_mixtral.py, _qwen2_moe.py, _qwen3_moe.py, _granitemoe.py), and refuse, naming
 * it, each field that transformers releases read differently. */
START_TEST(test_family_moe_rules) {
    /* Mixtral: Mistral's attention; MixtralConfig's 8 KV heads, theta 1e6 and no window (not
     * Mistral's 4096) when absent; attention_bias is not read (no biases, as Mistral). */
    struct parsed p = parse_text("{\"model_type\":\"mixtral\",\"hidden_size\":64,"
                                 "\"num_attention_heads\":8,\"num_hidden_layers\":2}");
    expect_ok(&p, "mixtral defaults");
    ck_assert_str_eq(p.lay.family, "mixtral");
    ck_assert_int_eq(p.cfg.n_kv_heads, 8);
    ck_assert_float_eq(p.cfg.rope_theta, 1e6f);
    ck_assert_int_eq(p.cfg.sliding_window, 0);
    ck_assert(!p.cfg.has_qkv_bias && !p.cfg.has_o_bias);
    p = parse("mixtral", ",\"num_key_value_heads\":2,\"sliding_window\":16,\"attention_bias\":true",
              NULL);
    expect_ok(&p, "mixtral with a window");
    ck_assert_int_eq(p.cfg.sliding_window, 16);
    ck_assert(attn_config_layer_is_sliding(&p.cfg, 0) && attn_config_layer_is_sliding(&p.cfg, 1));
    ck_assert(!p.cfg.has_qkv_bias && !p.cfg.has_o_bias);
    /* rope_scaling: the releases that introduced Mixtral never read it, later ones apply it */
    p = parse("mixtral",
              ",\"num_key_value_heads\":2,\"rope_scaling\":{\"type\":\"linear\",\"factor\":2}",
              NULL);
    expect_refused(&p, ATTN_EUNSUPPORTED, "mixtral with rope_scaling", "mixtral rope_scaling");
    ck_assert_ptr_nonnull(strstr(p.err, "transformers"));
    p = parse("mixtral", ",\"num_key_value_heads\":2,\"rope_scaling\":null", NULL);
    expect_ok(&p, "mixtral rope_scaling null");
    p = parse("mixtral", ",\"num_key_value_heads\":2,\"rope_scaling\":{\"rope_type\":\"default\"}",
              NULL);
    expect_ok(&p, "mixtral default rope_scaling");

    /* Qwen2-MoE: Qwen2's q/k/v biases (never o), 16 KV heads when absent, a window written but
     * not used without use_sliding_window. */
    p = parse_text("{\"model_type\":\"qwen2_moe\",\"hidden_size\":64,"
                   "\"num_attention_heads\":16,\"num_hidden_layers\":2}");
    expect_ok(&p, "qwen2_moe defaults");
    ck_assert_int_eq(p.cfg.n_kv_heads, 16);
    ck_assert(p.cfg.has_qkv_bias && !p.cfg.has_o_bias);
    ck_assert_int_eq(p.cfg.sliding_window, 0);
    p = parse("qwen2_moe",
              ",\"num_key_value_heads\":2,\"sliding_window\":4,\"max_window_layers\":0,"
              "\"use_sliding_window\":false,\"qkv_bias\":true,\"head_dim\":16,"
              "\"layer_types\":[\"full_attention\",\"full_attention\"]",
              NULL);
    expect_ok(&p, "qwen2_moe as v5 saves it");
    ck_assert_int_eq(p.cfg.sliding_window, 0);
    ck_assert(p.cfg.has_qkv_bias && !p.cfg.has_o_bias);
    /* v4's flash attention slides layers >= max_window_layers, v5's layer_types the even ones
     * below it; v5 drops the q/k/v biases with qkv_bias false, v4 has them; v4's attention
     * refuses a head_dim other than hidden_size / heads, v5's reads it */
    static const struct {
        const char *extra, *named;
    } ambiguous[] = {
        {",\"use_sliding_window\":true,\"sliding_window\":4,\"max_window_layers\":1",
         "qwen2_moe with use_sliding_window true"},
        {",\"use_sliding_window\":true", "use_sliding_window"},
        {",\"qkv_bias\":false", "qkv_bias false"},
        {",\"head_dim\":32", "head_dim 32 is not hidden_size / num_attention_heads"},
        {",\"layer_types\":[\"sliding_attention\",\"full_attention\"]", "layer_types"},
    };
    for (size_t i = 0; i < sizeof ambiguous / sizeof ambiguous[0]; i++) {
        char extra[256];
        snprintf(extra, sizeof extra, ",\"num_key_value_heads\":2%s", ambiguous[i].extra);
        p = parse("qwen2_moe", extra, NULL);
        expect_refused(&p, ATTN_EUNSUPPORTED, ambiguous[i].named, extra);
    }

    /* Qwen3-MoE: Qwen3's attention (q/k norms per head, eps 1e-6, biases iff attention_bias)
     * with Qwen3MoeConfig's 4 KV heads and no head_dim field: hidden_size / heads when absent,
     * not Qwen3's 128. */
    p = parse_text("{\"model_type\":\"qwen3_moe\",\"hidden_size\":64,"
                   "\"num_attention_heads\":8,\"num_hidden_layers\":2}");
    expect_ok(&p, "qwen3_moe defaults");
    ck_assert_int_eq(p.cfg.n_kv_heads, 4);
    ck_assert_int_eq(p.cfg.head_dim, 8);
    ck_assert_int_eq(p.cfg.qk_norm, ATTN_QK_NORM_HEAD);
    ck_assert_float_eq(p.cfg.qk_norm_eps, 1e-6f);
    ck_assert(!p.cfg.has_qkv_bias && !p.cfg.has_o_bias);
    ck_assert_int_eq(p.cfg.sliding_window, 0);
    p = parse("qwen3_moe",
              ",\"num_key_value_heads\":2,\"head_dim\":128,\"attention_bias\":true,"
              "\"sliding_window\":null,\"max_window_layers\":48,\"use_sliding_window\":false",
              NULL);
    expect_ok(&p, "qwen3_moe as 30B-A3B writes it");
    ck_assert_int_eq(p.cfg.head_dim, 128);
    ck_assert(p.cfg.has_qkv_bias && p.cfg.has_o_bias);
    /* v4.51 slides layers >= max_window_layers, later releases every layer */
    p = parse("qwen3_moe",
              ",\"num_key_value_heads\":2,\"use_sliding_window\":true,\"sliding_window\":16,"
              "\"max_window_layers\":1",
              NULL);
    expect_refused(&p, ATTN_EUNSUPPORTED, "qwen3_moe with use_sliding_window true",
                   "qwen3_moe window");
    ck_assert_ptr_nonnull(strstr(p.err, "max_window_layers"));

    /* Granite MoE: attention_multiplier (1.0 when absent) as the scale, biases iff
     * attention_bias, one K/V head per query head when absent. */
    p = parse("granitemoe", "", NULL);
    expect_ok(&p, "granitemoe defaults");
    ck_assert_float_eq(p.cfg.softmax_scale, 1.0f);
    ck_assert_int_eq(p.cfg.n_kv_heads, 4);
    ck_assert(!p.cfg.has_qkv_bias && !p.cfg.has_o_bias);
    p = parse("granitemoe", ",\"attention_multiplier\":0.0078125,\"attention_bias\":true", NULL);
    expect_ok(&p, "granitemoe");
    ck_assert_float_eq(p.cfg.softmax_scale, 0.0078125f);
    ck_assert(p.cfg.has_qkv_bias && p.cfg.has_o_bias);
}
END_TEST

/* Gemma's own defaults: the scale from query_pre_attn_scalar (256), Gemma 2's cap of 50 and its
 * even local layers, Gemma 3's 5:1 pattern and local RoPE; a multimodal Gemma 3 needs its
 * text_config; bidirectional attention is refused. */
START_TEST(test_family_gemma_rules) {
    struct parsed p;
    const char *g2 = "{\"model_type\":\"gemma2\",\"hidden_size\":64,\"num_attention_heads\":4,"
                     "\"num_hidden_layers\":4}";
    p.rc = attn__hf_config_parse(g2, strlen(g2), NULL, &p.cfg, &p.lay, p.err, sizeof p.err);
    expect_ok(&p, "gemma2 defaults");
    ck_assert_float_eq(p.cfg.logit_softcap, 50.0f);
    ck_assert_float_eq_tol(p.cfg.softmax_scale, 1.0f / 16.0f, 1e-9f);
    ck_assert_int_eq(p.cfg.head_dim, 256);
    ck_assert_int_eq(p.cfg.n_kv_heads, 4);
    ck_assert_int_eq(p.cfg.sliding_window, 4096);
    for (int32_t layer = 0; layer < 4; layer++) {
        ck_assert(attn_config_layer_is_sliding(&p.cfg, layer) == (layer % 2 == 0));
    }
    p = parse("gemma2", ",\"num_key_value_heads\":2,\"attn_logit_softcapping\":null", NULL);
    expect_ok(&p, "gemma2 without a cap");
    ck_assert_float_eq(p.cfg.logit_softcap, 0.0f);

    const char *g3 = "{\"model_type\":\"gemma3_text\",\"hidden_size\":64,"
                     "\"num_attention_heads\":4,\"num_hidden_layers\":12}";
    p.rc = attn__hf_config_parse(g3, strlen(g3), NULL, &p.cfg, &p.lay, p.err, sizeof p.err);
    expect_ok(&p, "gemma3 defaults");
    ck_assert_float_eq(p.cfg.logit_softcap, 0.0f);
    ck_assert_float_eq(p.cfg.rope_theta, 1e6f);
    ck_assert_float_eq(p.cfg.rope_theta_local, 10000.0f);
    ck_assert_int_eq(p.cfg.qk_norm, ATTN_QK_NORM_HEAD);
    ck_assert(p.lay.is_norm_one_plus);
    for (int32_t layer = 0; layer < 12; layer++) {
        ck_assert(attn_config_layer_is_sliding(&p.cfg, layer) == (layer % 6 != 5));
    }
    p = parse("gemma3", ",\"num_key_value_heads\":2", NULL);
    expect_refused(&p, ATTN_EIO, "text_config", "gemma3 without its text model");
    /* Google's gemma-3-4b leaves num_attention_heads (and more) out of its text_config:
     * Gemma3TextConfig's own values apply (it was refused as "required"; found by an outside
     * audit on the published config) */
    const char *g3mm = "{\"model_type\":\"gemma3\",\"text_config\":{\"model_type\":\"gemma3_text\","
                       "\"hidden_size\":2560,\"num_hidden_layers\":34,\"sliding_window\":1024}}";
    p.rc = attn__hf_config_parse(g3mm, strlen(g3mm), NULL, &p.cfg, &p.lay, p.err, sizeof p.err);
    expect_ok(&p, "gemma-3-4b's text_config");
    ck_assert(p.cfg.hidden_size == 2560 && p.cfg.n_heads == 8 && p.cfg.n_kv_heads == 4 &&
              p.cfg.head_dim == 256 && p.cfg.n_layers == 34 && p.cfg.max_seq == 131072);
    const char *g3bare = "{\"model_type\":\"gemma3_text\"}";
    p.rc = attn__hf_config_parse(g3bare, strlen(g3bare), NULL, &p.cfg, &p.lay, p.err, sizeof p.err);
    expect_ok(&p, "Gemma3TextConfig() itself");
    ck_assert(p.cfg.hidden_size == 2304 && p.cfg.n_heads == 8 && p.cfg.n_layers == 26);
    p = parse("gemma2", ",\"num_key_value_heads\":2,\"use_bidirectional_attention\":true", NULL);
    expect_refused(&p, ATTN_EUNSUPPORTED, "use_bidirectional_attention", "bidirectional");
}
END_TEST

/* StarCoder2 and Gemma: their config classes' defaults, StarCoder2's use_bias and window on every
 * layer; a head_dim or a rope scaling that transformers releases read differently is refused. */
START_TEST(test_family_starcoder2_and_gemma_rules) {
    struct parsed p = parse("starcoder2", "", NULL);
    expect_ok(&p, "starcoder2 defaults");
    ck_assert_int_eq(p.cfg.n_kv_heads, 2);             /* Starcoder2Config: 2 when absent */
    ck_assert(p.cfg.has_qkv_bias && p.cfg.has_o_bias); /* use_bias: true when absent */
    ck_assert_int_eq(p.cfg.sliding_window, 0);
    p = parse("starcoder2", ",\"use_bias\":false,\"attention_bias\":true,\"sliding_window\":16",
              NULL);
    expect_ok(&p, "starcoder2 without biases, with a window");
    ck_assert(!p.cfg.has_qkv_bias && !p.cfg.has_o_bias);
    ck_assert_int_eq(p.cfg.sliding_window, 16);
    ck_assert(attn_config_layer_is_sliding(&p.cfg, 0) && attn_config_layer_is_sliding(&p.cfg, 1));
    p = parse("starcoder2", ",\"head_dim\":16", NULL);
    expect_ok(&p, "starcoder2 head_dim = hidden / heads");
    p = parse("starcoder2", ",\"head_dim\":32", NULL);
    expect_refused(&p, ATTN_EUNSUPPORTED, "head_dim 32 is not hidden_size / num_attention_heads",
                   "starcoder2 head_dim");
    static const char *const scalings[] = {
        ",\"rope_scaling\":{\"rope_type\":\"linear\",\"factor\":2}",
        ",\"rope_parameters\":{\"rope_type\":\"dynamic\",\"factor\":2,\"rope_theta\":10000},"
        "\"max_position_embeddings\":64",
    };
    static const char *const unscaled[] = {"starcoder2", "gemma"};
    for (int f = 0; f < 2; f++) {
        for (int i = 0; i < 2; i++) {
            char extra[256];
            snprintf(extra, sizeof extra, ",\"num_key_value_heads\":2%s", scalings[i]);
            p = parse(unscaled[f], extra, NULL);
            expect_refused(&p, ATTN_EUNSUPPORTED, "rope_scaling", extra);
            ck_assert_ptr_nonnull(strstr(p.err, "versions differ"));
        }
        p = parse(unscaled[f],
                  ",\"num_key_value_heads\":2,\"rope_scaling\":null,\"rope_parameters\":"
                  "{\"rope_type\":\"default\",\"rope_theta\":10000}",
                  NULL);
        expect_ok(&p, "no scaling, in both spellings");
    }

    /* GemmaConfig: 16 KV heads and head_dim 256 when absent; biases iff attention_bias; no
     * window. */
    p = parse_text("{\"model_type\":\"gemma\",\"hidden_size\":3072,\"num_attention_heads\":16,"
                   "\"num_hidden_layers\":2,\"sliding_window\":null}");
    expect_ok(&p, "gemma defaults");
    ck_assert_int_eq(p.cfg.n_kv_heads, 16);
    ck_assert_int_eq(p.cfg.head_dim, 256);
    ck_assert_int_eq(p.cfg.sliding_window, 0);
    ck_assert(!p.cfg.has_qkv_bias && !p.cfg.has_o_bias);
    ck_assert_float_eq(p.cfg.softmax_scale, 0.0f); /* the engine's head_dim^-1/2 */
    p = parse("gemma", ",\"num_key_value_heads\":1,\"head_dim\":32,\"attention_bias\":true", NULL);
    expect_ok(&p, "gemma with biases");
    ck_assert(p.cfg.has_qkv_bias && p.cfg.has_o_bias);
    ck_assert_int_eq(p.cfg.head_dim, 32);
    p = parse("gemma", ",\"num_key_value_heads\":1,\"query_pre_attn_scalar\":24", NULL);
    expect_refused(&p, ATTN_EUNSUPPORTED, "query_pre_attn_scalar", "gemma 1 has no scalar");
}
END_TEST

/* SmolLM3: NoPE layers from no_rope_layers (else every no_rope_layer_interval-th), its window on
 * the layers layer_types names (else on the NoPE layers, with use_sliding_window); a sliding layer
 * without use_sliding_window, which transformers' attention implementations treat differently,
 * is refused. */
START_TEST(test_family_smollm3_rules) {
    const char *bare = "{\"model_type\":\"smollm3\",\"hidden_size\":64,\"num_attention_heads\":4,"
                       "\"num_hidden_layers\":8}";
    struct parsed p = parse_text(bare);
    expect_ok(&p, "smollm3 defaults");
    ck_assert_int_eq(p.cfg.n_kv_heads, 4);
    ck_assert_float_eq(p.cfg.rope_theta, 2000000.0f);
    ck_assert(!p.cfg.has_qkv_bias && !p.cfg.has_o_bias);
    ck_assert_int_eq(p.cfg.sliding_window, 0);
    for (int32_t layer = 0; layer < 8; layer++) { /* every 4th layer: 3 and 7 */
        ck_assert(attn_config_layer_rotates(&p.cfg, layer) == (layer % 4 != 3));
        ck_assert(!attn_config_layer_is_sliding(&p.cfg, layer));
    }
    p = parse("smollm3", ",\"num_key_value_heads\":null,\"no_rope_layer_interval\":2", NULL);
    expect_ok(&p, "smollm3 interval 2");
    ck_assert_int_eq(p.cfg.n_kv_heads, 4);
    ck_assert(attn_config_layer_rotates(&p.cfg, 0) && !attn_config_layer_rotates(&p.cfg, 1));
    p = parse("smollm3", ",\"no_rope_layers\":[0,1,1],\"no_rope_layer_interval\":1", NULL);
    expect_ok(&p, "smollm3 list, longer than the layers, beside an interval");
    ck_assert(!attn_config_layer_rotates(&p.cfg, 0) && attn_config_layer_rotates(&p.cfg, 1));
    static const struct {
        const char *extra, *named;
        int rc;
    } bad[] = {
        {",\"no_rope_layers\":[1]", "no_rope_layers must list", ATTN_EIO},
        {",\"no_rope_layers\":[1,2]", "no_rope_layers[1] must be 1 (RoPE) or 0", ATTN_EIO},
        {",\"no_rope_layers\":{\"0\":1}", "no_rope_layers must list", ATTN_EIO},
        {",\"no_rope_layer_interval\":0", "no_rope_layer_interval must be >= 1", ATTN_EIO},
        {",\"sliding_window\":16,\"layer_types\":[\"sliding_attention\",\"full_attention\"]",
         "use_sliding_window is false", ATTN_EUNSUPPORTED},
        {",\"use_sliding_window\":true,\"layer_types\":[\"sliding_attention\","
         "\"full_attention\"]",
         "no sliding_window", ATTN_EIO},
        {",\"use_sliding_window\":true,\"sliding_window\":0", "sliding_window must be >= 1",
         ATTN_EIO},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        p = parse("smollm3", bad[i].extra, NULL);
        expect_refused(&p, bad[i].rc, bad[i].named, bad[i].extra);
    }
    /* with use_sliding_window and a window, the NoPE layers slide (configuration_smollm3's
     * layer_types when null); layer_types, when given, decides */
    p = parse("smollm3",
              ",\"use_sliding_window\":true,\"sliding_window\":16,\"no_rope_layers\":[1,0]", NULL);
    expect_ok(&p, "smollm3 derived layer_types");
    ck_assert_int_eq(p.cfg.sliding_window, 16);
    ck_assert(!attn_config_layer_is_sliding(&p.cfg, 0) && attn_config_layer_is_sliding(&p.cfg, 1));
    p = parse("smollm3",
              ",\"use_sliding_window\":true,\"sliding_window\":16,\"no_rope_layers\":[1,0],"
              "\"layer_types\":[\"sliding_attention\",\"full_attention\"]",
              NULL);
    expect_ok(&p, "smollm3 explicit layer_types");
    ck_assert(attn_config_layer_is_sliding(&p.cfg, 0) && !attn_config_layer_is_sliding(&p.cfg, 1));
    p = parse("smollm3", ",\"use_sliding_window\":false,\"sliding_window\":16", NULL);
    expect_ok(&p, "smollm3 window unused");
    ck_assert_int_eq(p.cfg.sliding_window, 0);
}
END_TEST

/* Phi: biases on q/k/v and dense always, half of each head rotated when partial_rotary_factor is
 * absent, one K/V head per query head when num_key_value_heads is; a head_dim other than
 * hidden_size / heads (which transformers 4.37 and Phi's q/k LayerNorm use) is refused. */
START_TEST(test_family_phi_rules) {
    const char *bare = "{\"model_type\":\"phi\",\"hidden_size\":64,\"num_attention_heads\":4,"
                       "\"num_hidden_layers\":2}";
    struct parsed p = parse_text(bare);
    expect_ok(&p, "phi defaults");
    ck_assert_int_eq(p.cfg.n_kv_heads, 4);
    ck_assert_int_eq(p.cfg.rotary_dim, 8);
    ck_assert_float_eq(p.cfg.rope_theta, 10000.0f);
    ck_assert(p.cfg.has_qkv_bias && p.cfg.has_o_bias);
    ck_assert_int_eq(p.lay.tensors, ATTN__HF_DENSE);
    ck_assert_str_eq(p.lay.attn_name, "self_attn");
    /* what the layout consumes: q/k/v and dense with their biases, not o_proj */
    ck_assert(attn__hf_tensor_is_consumed(&p.cfg, &p.lay, "dense.weight"));
    ck_assert(attn__hf_tensor_is_consumed(&p.cfg, &p.lay, "dense.bias"));
    ck_assert(attn__hf_tensor_is_consumed(&p.cfg, &p.lay, "k_proj.bias"));
    ck_assert(!attn__hf_tensor_is_consumed(&p.cfg, &p.lay, "o_proj.weight"));
    ck_assert(!attn__hf_tensor_is_consumed(&p.cfg, &p.lay, "q_layernorm.weight"));
    ck_assert_int_eq(p.cfg.qk_norm, ATTN_QK_NORM_NONE);
    p = parse("phi", ",\"partial_rotary_factor\":0.4,\"sliding_window\":null", NULL);
    expect_ok(&p, "phi-2's factor");
    ck_assert_int_eq(p.cfg.rotary_dim, 6);
    ck_assert_int_eq(p.cfg.sliding_window, 0);
    p = parse("phi", ",\"partial_rotary_factor\":0.4,\"sliding_window\":4", NULL);
    expect_refused(&p, ATTN_EUNSUPPORTED, "sliding_window 4", "phi with a stray window");
    p = parse("phi", ",\"head_dim\":32", NULL);
    expect_refused(&p, ATTN_EUNSUPPORTED, "head_dim 32", "phi head_dim");
    p = parse("phi", ",\"qk_layernorm\":false", NULL);
    expect_ok(&p, "phi without q/k norms");
    ck_assert_int_eq(p.cfg.qk_norm, ATTN_QK_NORM_NONE);
    /* qk_layernorm: nn.LayerNorm(hidden_size / heads, eps=layer_norm_eps) for q and for k */
    p = parse("phi", ",\"qk_layernorm\":true,\"layer_norm_eps\":1e-6", NULL);
    expect_ok(&p, "phi with q/k norms");
    ck_assert_int_eq(p.cfg.qk_norm, ATTN_QK_NORM_HEAD_LAYERNORM_BIAS);
    ck_assert_float_eq(p.cfg.qk_norm_eps, 1e-6f);
    ck_assert_int_eq(p.lay.norms, ATTN__HF_NORM_LAYERNORM);
    static const char *const norms[] = {"q_layernorm.weight", "q_layernorm.bias",
                                        "k_layernorm.weight", "k_layernorm.bias"};
    for (int i = 0; i < 4; i++) {
        ck_assert(attn__hf_tensor_is_consumed(&p.cfg, &p.lay, norms[i]));
    }
    ck_assert(!attn__hf_tensor_is_consumed(&p.cfg, &p.lay, "q_norm.weight"));
    ck_assert(!attn__hf_tensor_is_consumed(&p.cfg, &p.lay, "q_layernorm.norms.0.weight"));
    p = parse("phi", ",\"qk_layernorm\":true", NULL);
    ck_assert_float_eq(p.cfg.qk_norm_eps, 1e-5f); /* PhiConfig's layer_norm_eps */
}
END_TEST

/* OLMo: clip_qkv (none when absent or null) clamps q, k and v; biases iff attention_bias; a
 * head_dim other than hidden_size / heads (transformers 4.40's) is refused. clip_qkv stays refused
 * in the families that do not read it. */
START_TEST(test_family_olmo_rules) {
    struct parsed p = parse("olmo", "", NULL);
    expect_ok(&p, "olmo defaults");
    ck_assert_float_eq(p.cfg.clip_qkv, 0.0f);
    ck_assert_int_eq(p.cfg.n_kv_heads, 4);
    ck_assert(!p.cfg.has_qkv_bias && !p.cfg.has_o_bias);
    p = parse("olmo", ",\"clip_qkv\":null,\"attention_bias\":true", NULL);
    expect_ok(&p, "olmo clip null, biases");
    ck_assert_float_eq(p.cfg.clip_qkv, 0.0f);
    ck_assert(p.cfg.has_qkv_bias && p.cfg.has_o_bias);
    p = parse("olmo", ",\"clip_qkv\":8.0", NULL);
    expect_ok(&p, "olmo clip 8");
    ck_assert_float_eq(p.cfg.clip_qkv, 8.0f);
    static const char *const bad[] = {",\"clip_qkv\":0", ",\"clip_qkv\":-1", ",\"clip_qkv\":\"8\""};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        p = parse("olmo", bad[i], NULL);
        expect_refused(&p, ATTN_EIO, "clip_qkv", bad[i]);
    }
    p = parse("olmo", ",\"head_dim\":8", NULL);
    expect_refused(&p, ATTN_EUNSUPPORTED, "head_dim 8", "olmo head_dim");
    p = parse("olmo2", ",\"clip_qkv\":8.0", NULL);
    expect_refused(&p, ATTN_EUNSUPPORTED, "clip_qkv changes olmo2 attention", "olmo2 clip");
}
END_TEST

/* Biases come from each family's own rule, not from whichever tensors happen to be there. */
START_TEST(test_family_bias_rules) {
    struct parsed p = parse("llama", ",\"attention_bias\":true", NULL);
    ck_assert(p.cfg.has_qkv_bias && p.cfg.has_o_bias);
    p = parse("llama", "", NULL);
    ck_assert(!p.cfg.has_qkv_bias && !p.cfg.has_o_bias);
    p = parse("mistral", ",\"num_key_value_heads\":2,\"attention_bias\":true", NULL);
    ck_assert(!p.cfg.has_qkv_bias && !p.cfg.has_o_bias);
    p = parse("qwen2", ",\"num_key_value_heads\":2", NULL);
    ck_assert(p.cfg.has_qkv_bias && !p.cfg.has_o_bias);
    p = parse("attnd", ",\"attention_bias\":true", NULL);
    ck_assert(p.lay.has_biases_from_tensors && p.lay.wants_qkv_bias);
}
END_TEST

/* Folders whose attention holds what the engine would drop: refused, naming the tensor. */
START_TEST(test_family_unconsumed_tensors_are_refused) {
    static const struct {
        const char *dir;
        const char *named;
    } cases[] = {
        {DATA "refuse_qk_norm", "_norm.weight"},
        {DATA "refuse_sinks", "model.layers.0.self_attn.sinks"},
        {DATA "refuse_o_bias", "model.layers.0.self_attn.o_proj.bias"},
        {DATA "refuse_llama4", "model_type 'llama4'"},
        {DATA "refuse_gemma_scaling", "rope_scaling"},
        {DATA "refuse_smollm3_window", "use_sliding_window is false"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        attn_model *m = NULL;
        char err[512] = "";
        int rc = attn_model_load_hf(cases[i].dir, NULL, &m, err, sizeof err);
        ck_assert_msg(rc == ATTN_EUNSUPPORTED && strstr(err, cases[i].named) != NULL,
                      "%s: %d (%s), want ATTN_EUNSUPPORTED naming %s", cases[i].dir, rc, err,
                      cases[i].named);
        ck_assert_ptr_null(m);
        /* Trusting the layout does not serve what is known to be wrong. */
        attn_load_params lp = {0, 0, 0, "llama", ATTN_DTYPE_AUTO, NULL};
        ck_assert_int_eq(attn_model_load_hf(cases[i].dir, &lp, &m, err, sizeof err),
                         ATTN_EUNSUPPORTED);
    }
}
END_TEST

extern Suite *family_suite(void);

Suite *family_suite(void) {
    Suite *s = suite_create("family");
    TCase *tc = tcase_create("family");
    tcase_add_test(tc, test_family_model_type_decides);
    tcase_add_test(tc, test_family_screened_fields);
    tcase_add_test(tc, test_family_repeated_keys_and_ranges_are_named);
    tcase_add_test(tc, test_family_layout_rules);
    tcase_add_test(tc, test_family_version_ambiguities_are_refused);
    tcase_add_test(tc, test_family_engine_fields_are_attnd_only);
    tcase_add_test(tc, test_family_defaults_and_windows);
    tcase_add_test(tc, test_family_qk_norms);
    tcase_add_test(tc, test_family_gemma_rules);
    tcase_add_test(tc, test_family_moe_rules);
    tcase_add_test(tc, test_family_starcoder2_and_gemma_rules);
    tcase_add_test(tc, test_family_smollm3_rules);
    tcase_add_test(tc, test_family_phi_rules);
    tcase_add_test(tc, test_family_olmo_rules);
    tcase_add_test(tc, test_family_bias_rules);
    tcase_add_test(tc, test_family_unconsumed_tensors_are_refused);
    suite_add_tcase(s, tc);
    return s;
}
