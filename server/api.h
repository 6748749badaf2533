/* server/api.h: the JSON edge. The only module that knows the wire's field names: it parses
 * request bodies into C structs, checking every field against proto/openapi.yaml (type, range,
 * shape, finiteness), and encodes C structs into response bodies and stream events.
 *
 * Parsing reads the body in one pass with json.h's pull reader and builds no tree: tensors go
 * straight into float arrays, and an unknown or repeated field stops the parse at once.
 * Encoders return malloc'd strings (handed to libmicrohttpd in must-free mode) or append to a
 * strbuf. Every function here is pure: any thread, no shared state.
 */
#ifndef SERVER_API_H
#define SERVER_API_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "../engine/attn.h"
#include "strbuf.h"

#define API_SESSION_ID_MAX 128
/* Cap on returned attention probabilities per request (values), proto: return_weights. */
#define API_WEIGHTS_MAX_VALUES 16777216
/* Cap on /v1/sdpa's output (H x Tq x dv values), which small inputs could otherwise blow up. */
#define API_OUTPUT_MAX_VALUES 16777216
/* Cap on /v1/sdpa's work, in attention scores (H x Tq x Tk): about 2^31 x 2 (dk + dv) flops, so
 * at head dims of 128 some 1.1 TFLOP, under 20 s on one worker of the 2-core build machine; tiny
 * tensors (dk = 1) cannot ask for hours of work either. */
#define API_SDPA_MAX_SCORES ((int64_t)1 << 31)

/* A request error: code is an error_code; param is the offending field ("" = null); message is
 * the specific reason ("" = the error table's default). */
struct api_error {
    int code;
    char param[64];
    char message[256];
};

enum api_encoding {
    API_ENCODING_FLOAT = 0,  /* nested number arrays */
    API_ENCODING_BASE64 = 1, /* {"shape":[...],"b64":"..."} */
    /* "binary_output": true, the KServe v2 / Open Inference Protocol binary tensor extension:
     * {"shape":[...],"binary_data_size":N} in the JSON, the raw little-endian float32 after it,
     * in the order the fields appear */
    API_ENCODING_BINARY = 2,
};

/* A request body as the transport framed it. Without the binary tensor extension it is JSON
 * alone (binary NULL). With it (the request header Inference-Header-Content-Length gave the
 * JSON's length), raw bytes follow the JSON: each tensor field written {"shape": [...],
 * "binary_data_size": N} takes the next N bytes, little-endian float32, in the order the fields
 * appear, and every byte must be taken. */
struct api_body {
    const char *json;
    size_t json_len;
    const uint8_t *binary; /* NULL: not framed */
    size_t binary_len;
    /* The binary part outlives the request parsed from it (its caller frees the body after
     * api_attend_request_release): an attend's float32 tensors may then be read where they lie,
     * checked but not copied, when the host is little-endian and they are aligned. */
    bool may_borrow;
};

/* True if s[0..len) is a valid session id: [A-Za-z0-9._:-]{1,128}. */
bool api_session_id_is_valid(const char *s, size_t len);

/* The model facts request checks need. */
struct api_limits {
    int32_t hidden_size;
    int32_t n_heads;
    int32_t layer_first; /* loaded layers: layer_first .. layer_first + layer_count - 1 */
    int32_t layer_count;
    int32_t max_seq;
    int32_t n_kv_heads; /* /v1/kv/attend's k and v heads, */
    int32_t head_dim;   /* and every head's width */
};

/* ---- requests ------------------------------------------------------------------------------- */

/* return_weights as an object (proto: WeightsSelection): which heads, query rows and keys of the
 * attention to return, and as what. Heads are resolved when parsed; rows (negative: from the
 * end of the call's T) and keys (a python-style [start, end) of the call's key axis) when the
 * request runs, by api_selection_resolve. */
struct api_selection {
    bool is_set; /* return_weights was an object */
    attn_inspect_kind kind;
    attn_inspect_reduce reduce;
    int32_t *heads; /* owned, ascending, distinct; NULL = every head */
    int32_t n_heads;
    int32_t *rows; /* owned; NULL = every row; ascending and distinct once resolved */
    int32_t n_rows;
    bool has_key_start, has_key_end;
    int32_t key_start, key_end; /* as given; key_first/n_keys once resolved */
    int32_t key_first, n_keys;
};

/* capture: the per-head tensors of the call to return (attn_inspect's captures). */
enum {
    API_CAPTURE_Q = 1u << 0,
    API_CAPTURE_K = 1u << 1,
    API_CAPTURE_V = 1u << 2,
    API_CAPTURE_HEAD_OUT = 1u << 3,
};

/* Resolves sel's rows against a call of n_rows query rows and its keys against n_keys keys
 * (negative indices count from the end; rows sorted, repeats dropped) and checks that the
 * selection (times n_batch) fits API_WEIGHTS_MAX_VALUES. 0, or ERROR_INVALID_REQUEST naming
 * return_weights.rows / .keys in *err. Once per request. */
int api_selection_resolve(struct api_selection *sel, int32_t n_heads, int32_t n_rows,
                          int32_t n_keys, int64_t n_batch, struct api_error *err);
/* Values the resolved selection returns per call: (H', R, K), (H', R) for lse; H' 1 reduced. */
int64_t api_selection_values(const struct api_selection *sel, int32_t n_heads);
/* The engine's view of a resolved selection, writing into out. */
attn_inspect api_selection_inspect(const struct api_selection *sel, float *out);

struct api_attend_request {
    /* Tensors may lie in the body's binary part (api_body.may_borrow): these bound it, and what
     * lies between is not freed. */
    uintptr_t borrowed_lo, borrowed_hi;
    float *x;                                /* (n_tokens, hidden_size) row-major, owned */
    int32_t n_tokens;                        /* T >= 1 */
    char session_id[API_SESSION_ID_MAX + 1]; /* "" = stateless */
    int32_t layer;                           /* absolute; defaulted to limits.layer_first */
    int32_t *positions;                      /* (n_tokens), owned; NULL = continue the cache */
    bool has_expect_n_past;
    int32_t expect_n_past;
    bool return_weights; /* true: every probability, or sel below */
    struct api_selection sel;
    uint32_t capture; /* API_CAPTURE_* */
    float *head_mask; /* NULL, or (n_heads), owned: each head's output is scaled by it */
    bool stream;
    enum api_encoding encoding; /* API_ENCODING_BINARY when binary_output was true */
    /* NULL, or (n_key_mask) bytes, owned: 0 hides that key (cached or new) from every query of
     * this request; its length must be n_past + n_tokens, checked when the request runs */
    uint8_t *key_mask;
    int32_t n_key_mask;
    /* Cross-attention (seeds 000, 001, 004 3.4): the queries of x attend to a context's keys
     * and values instead of the session's own tokens. */
    bool is_cross;  /* context given, or "cross": true (reuse the session's) */
    float *context; /* NULL, or (n_context, hidden_size), owned */
    int32_t n_context;
    bool replace_context; /* a session layer's stored context may be replaced by this one */
    /* A batch ("steps"): n_steps requests on one layer, each with its own session_id (or none:
     * stateless), x, positions, expect_n_past and return_weights, and nothing else; the top
     * level then has no x and gives each step its layer and encoding. Session ids differ. */
    struct api_attend_request *steps; /* (n_steps), owned, or NULL */
    int32_t n_steps;
    /* POST /v1/kv/attend: the caller's projections instead of x (NULL then), each owned:
     * q (n_heads, T, head_dim), k and v (n_kv_heads, T, head_dim); n_tokens is T. rope: rotate
     * q and k with the model's RoPE at the positions (false: the caller did). */
    float *q, *k, *v;
    int32_t k_tokens, v_tokens; /* T as k and v gave it (checked equal to q's) */
    bool rope;
};

/* Steps a batch may carry. */
#define API_MAX_STEPS 256

/* Parses a POST /v1/attend body. On success returns 0 and fills *out (release it with
 * api_attend_request_release). On failure returns the error code, fills *err and leaves *out
 * released. Checks: x rank 2 with hidden_size columns and 1..max_seq rows; layer loaded;
 * positions length T, each in [0, max_seq) (context_length_exceeded otherwise); weights of
 * n_heads x T x T values within API_WEIGHTS_MAX_VALUES (the n_past part is checked when the
 * request runs). */
int api_attend_request_parse(const char *body, size_t len, const struct api_limits *lim,
                             struct api_attend_request *out, struct api_error *err);
/* The same for a body framed by the binary tensor extension (or not: binary NULL). */
int api_attend_request_parse_body(const struct api_body *body, const struct api_limits *lim,
                                  struct api_attend_request *out, struct api_error *err);

/* A POST /v1/kv/attend body: session_id (required), layer, q, k, v (required, the same T),
 * positions, expect_n_past, return_weights, rope, encoding_format, binary_output; or a batch:
 * layer, rope, encoding_format, binary_output and steps of {session_id, q, k, v, positions,
 * expect_n_past, return_weights}. Into the same struct as an attend (x NULL, q/k/v set). */
int api_kv_attend_request_parse_body(const struct api_body *body, const struct api_limits *lim,
                                     struct api_attend_request *out, struct api_error *err);
void api_attend_request_release(struct api_attend_request *r);

struct api_sdpa_request {
    float *q;        /* (n_batch, n_heads, n_q, d_k), owned or borrowed */
    float *k;        /* (n_batch, n_kv_heads, n_k, d_k), owned or borrowed */
    float *v;        /* (n_batch, n_kv_heads, n_k, d_v), owned or borrowed */
    int32_t n_batch; /* 1 when the tensors came without a batch dimension */
    bool is_batched; /* they came with one: the answer has it too */
    int32_t n_heads, n_kv_heads, n_q, n_k, d_k, d_v;
    /* NULL, or the boolean mask, owned: batch b, query i, key j at
     * mask[b * mask_batch_stride + i * mask_ld + j] (a stride 0 broadcasts) */
    uint8_t *mask;
    size_t mask_batch_stride, mask_ld;
    bool causal;
    int32_t window; /* -1 = none */
    float scale;    /* 0 = 1/sqrt(d_k) */
    bool return_weights;
    struct api_selection sel;   /* return_weights as an object */
    enum api_encoding encoding; /* API_ENCODING_BINARY when binary_output was true */
    bool is_linear;             /* "kind": "linear" (seed 004 3.7) rather than softmax */
    /* q, k and v may lie in the body's binary part (api_body.may_borrow): these bound it, and
     * release frees only what lies outside */
    uintptr_t borrowed_lo, borrowed_hi;
};

/* Parses a POST /v1/sdpa body; same contract as api_attend_request_parse. */
int api_sdpa_request_parse(const char *body, size_t len, struct api_sdpa_request *out,
                           struct api_error *err);
int api_sdpa_request_parse_body(const struct api_body *body, struct api_sdpa_request *out,
                                struct api_error *err);
void api_sdpa_request_release(struct api_sdpa_request *r);

/* GET /v1/sessions/{id}/attention's query (?layer=&heads=&rows=&keys=&kind=&reduce=): heads and
 * rows are comma lists of indices and python-style ranges a:b (negative: from the end), keys one
 * range; "" or "all" selects everything. Kept as text until the cache's length is known. */
#define API_SPEC_MAX 1024
struct api_attention_request {
    int32_t layer;
    char heads[API_SPEC_MAX];
    char rows[API_SPEC_MAX];
    char keys[64];
    attn_inspect_kind kind;
    attn_inspect_reduce reduce;
    uint32_t seen; /* the parameters given, each once */
};

/* Takes one query parameter into r (r zeroed, layer set to the first loaded, before the first).
 * 0, or ERROR_INVALID_REQUEST naming the parameter (unknown, repeated, malformed). */
int api_attention_query(struct api_attention_request *r, const char *name, const char *value,
                        const struct api_limits *lim, struct api_error *err);
/* Resolves r against a cache of n_tokens tokens whose rows from row_min on can be recomputed:
 * fills sel (release with api_selection_release), its values within API_WEIGHTS_MAX_VALUES. */
int api_attention_select(const struct api_attention_request *r, int32_t n_heads, int32_t n_tokens,
                         int32_t row_min, struct api_selection *sel, struct api_error *err);
void api_selection_release(struct api_selection *sel);

struct api_attention_response {
    const char *session_id;
    int32_t layer;
    int32_t n_tokens;  /* the cache's length */
    int32_t first_row; /* the first token whose attention can be recomputed */
    int32_t n_heads;
    const struct api_selection *sel;
    const float *values;
};
char *api_attention_response_encode(const struct api_attention_response *r, size_t *len);

struct api_truncate_request {
    int32_t n_tokens; /* >= 0 */
    bool has_layer;
    int32_t layer; /* when has_layer: a loaded layer */
};

int api_truncate_request_parse(const char *body, size_t len, const struct api_limits *lim,
                               struct api_truncate_request *out, struct api_error *err);

struct api_fork_request {
    char new_id[API_SESSION_ID_MAX + 1];
};

int api_fork_request_parse(const char *body, size_t len, struct api_fork_request *out,
                           struct api_error *err);

/* ---- responses ------------------------------------------------------------------------------ */

struct api_timing {
    double queue_ms;
    double compute_ms;
};

struct api_attend_response {
    const char *session_id; /* NULL = stateless (null on the wire) */
    int32_t layer;
    int32_t n_past;   /* cache length before */
    int32_t n_tokens; /* cache length after */
    int32_t n_new;    /* T: rows of output */
    int32_t hidden_size;
    int32_t n_heads;
    const float *output;  /* (n_new, hidden_size) */
    const float *weights; /* NULL, or (n_heads, n_new, n_tokens), or when is_cross
                             (n_heads, n_new, context_tokens) */
    struct api_timing timing;
    enum api_encoding encoding;
    bool is_cross;          /* a cross-attention answer, */
    int32_t context_tokens; /* over a context of this many tokens */
    bool is_per_head;       /* a /v1/kv/attend answer: output is (n_heads, n_new, head_dim) */
    int32_t head_dim;
    /* return_weights as an object: the resolved selection and its values (weights, scores or
     * lse by its kind) */
    const struct api_selection *sel;
    const float *selected;
    /* capture: (n_heads, n_new, head_dim) q and head_out, (n_kv_heads, n_new, head_dim) k and v;
     * NULL where not asked */
    const float *capture_q, *capture_k, *capture_v, *capture_head_out;
    int32_t n_kv_heads;
    int32_t d_v; /* head_out's width (multi-head latent attention: v_head_dim) */
};

/* The tensors an answer framed by the binary tensor extension carries after its JSON, in the
 * order of their fields: output, weights or a selection, then the captures. */
#define API_RAW_PARTS_MAX 8
struct api_raw_parts {
    const float *data[API_RAW_PARTS_MAX];
    size_t bytes[API_RAW_PARTS_MAX];
    int n;
};

/* Encodes an AttendResponse. Returns a malloc'd NUL-terminated string (*len its length), or
 * NULL when out of memory. With API_ENCODING_BINARY it is the JSON then the raw tensors, and
 * *json_len (if not NULL) gets the JSON's length (the Inference-Header-Content-Length); with
 * raw not NULL the tensors stay where they are, listed in *raw for the caller to send after the
 * JSON (float32 as the host holds it: little-endian hosts only; a big-endian one appends them
 * byte-swapped still, raw->n 0). */
char *api_attend_response_encode(const struct api_attend_response *r, size_t *len, size_t *json_len,
                                 struct api_raw_parts *raw);

/* The same into room, a buffer reserved for the answer (api_answer_bytes_bound) before the call
 * ran, which it takes over (leaving it empty): an answer within its room allocates nothing more,
 * so a call that has changed its session cannot fail for want of memory to say so. */
char *api_attend_response_encode_in(struct strbuf *room, const struct api_attend_response *r,
                                    size_t *len, size_t *json_len, struct api_raw_parts *raw);

/* Whether an answer framed in enc sends its tensors from the caller's buffers (api_raw_parts),
 * not copied behind its JSON: the binary framing on a little-endian machine. */
bool api_tensors_go_apart(enum api_encoding enc);

/* Bytes an AttendResponse or a StreamEvent of n_values floats, n_ints integers (a selection's
 * heads and rows) and a session id of id_len bytes takes at most in `enc`, encoded with its raw
 * parts kept apart (as every job encodes them), the tensors copied in otherwise included. */
size_t api_answer_bytes_bound(int64_t n_values, int64_t n_ints, size_t id_len,
                              enum api_encoding enc);

/* One token of a stream: appends `data: {StreamEvent}\n\n` to out. */
struct api_stream_event {
    int32_t index;
    int32_t position;
    int32_t n_past;
    int32_t hidden_size;
    int32_t n_heads;
    const float *output;  /* (hidden_size) */
    const float *weights; /* NULL, or (n_heads, n_past + 1) */
    enum api_encoding encoding;
};
void api_stream_event_encode(struct strbuf *out, const struct api_stream_event *e);

/* The end of a successful stream: appends the StreamUsage event (from r's session_id, layer,
 * n_past, n_tokens, n_new, timing) and then `data: [DONE]\n\n`. */
void api_stream_usage_encode(struct strbuf *out, const struct api_attend_response *r);

/* A failed step: appends `data: {Error}\n\n` and then `data: [DONE]\n\n`. */
void api_stream_error_encode(struct strbuf *out, int code, const char *message, const char *param);

struct api_sdpa_response {
    int32_t n_batch;
    bool is_batched; /* the tensors carry the batch dimension */
    int32_t n_heads, n_q, n_k, d_v;
    const float *output;             /* (n_batch, n_heads, n_q, d_v) */
    const float *weights;            /* NULL, or (n_batch, n_heads, n_q, n_k) */
    const struct api_selection *sel; /* return_weights as an object: its values per batch */
    const float *selected;
    struct api_timing timing;
    enum api_encoding encoding;
};
/* Encodes an SdpaResponse; the contract of api_attend_response_encode, keep as its raw. */
char *api_sdpa_response_encode(const struct api_sdpa_response *r, size_t *len, size_t *json_len,
                               struct api_raw_parts *keep);

struct api_session_layer {
    int32_t layer;
    int32_t n_tokens;       /* seen */
    int32_t n_held;         /* whose K/V are held (a sliding layer keeps about its window) */
    int32_t window;         /* 0: none */
    int32_t context_tokens; /* the stored cross-attention context, or -1 for none */
    size_t bytes;
    bool is_linear; /* a linear-attention layer: a state, not tokens */
};

struct api_session {
    const char *session_id;
    int32_t n_tokens; /* longest layer */
    size_t bytes;
    int64_t idle_ms;
    int32_t pending;
    const char *location;                   /* "memory" or "disk" (--state-dir) */
    const struct api_session_layer *layers; /* (n_layers), by layer index */
    int32_t n_layers;
};

struct api_pool {
    size_t bytes_used;
    size_t bytes_limit;
    int32_t block_tokens;
    int32_t blocks_used;
    int32_t blocks_total;
    const char *dtype; /* how the pool holds K/V: attn_dtype_name */
};

char *api_session_encode(const struct api_session *s, size_t *len);
char *api_session_list_encode(const struct api_session *sessions, int32_t n_sessions,
                              const struct api_pool *pool, size_t *len);

/* attnd-specific model facts for GET /v1/model. */
struct api_model_info {
    const char *source; /* model folder or "preset:<name> seed=<n>" */
    const char *family; /* attn_model_family: the attention family served */
    int32_t layer_first;
    int32_t layer_count;
    size_t weights_bytes;
    const char *weights_dtype; /* how the projections are held: "f32", "bf16" or "f16" */
    const char *kv_dtype;      /* how the KV cache holds K/V: "f32", "bf16", "f16" or "q8_0" */
    size_t kv_bytes_per_token; /* one layer's cache per token, all KV heads, in that dtype */
    const char *fingerprint;   /* attn_model_fingerprint in lowercase hex */
};
char *api_model_encode(const attn_config *cfg, const struct api_model_info *info, size_t *len);

/* {"status":"<status>"} */
char *api_status_encode(const char *status, size_t *len);

/* The Error body for code (an error_code or attn_status). message NULL or "" = the table's
 * default; param NULL or "" = null. */
char *api_error_encode(int code, const char *message, const char *param, size_t *len);

/* A batch's answer is {"layer": L, "results": [...]}: each result a step's AttendResponse, or
 * for a step that failed {"session_id": id or null, "status": HTTP status, "error": {...}}.
 * These append the parts to out: the opening (with the layer), a failed step's result, the
 * closing. */
void api_batch_open(struct strbuf *out, int32_t layer);
void api_batch_error_put(struct strbuf *out, const char *session_id, int code, const char *message,
                         const char *param);
void api_batch_close(struct strbuf *out);

#endif /* SERVER_API_H */
