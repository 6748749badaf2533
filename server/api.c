/* server/api.c: the request half of the JSON edge (see api.h and proto/openapi.yaml): the bodies
 * of POST /v1/attend and /v1/kv/attend (one call or many steps) and of the session requests.
 * Bodies are read with the strict pull reader of json.h, one field at a time, and checked as
 * they are read (api_read.c, api_tensor.c, api_inspect.c; SDPA's is api_sdpa.c): tensors go
 * straight from the text into row-major float arrays, a field's errors are found as soon as its
 * bytes are, and an unknown or repeated field stops the parse at once. So a parse costs time
 * linear in the bytes read and memory proportional to the tensors it keeps, whatever the body
 * holds. Encoding responses is api_encode.c.
 */
#include "api_int.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "error.h"
#include "utf8.h"

/* ---- POST /v1/attend ------------------------------------------------------------------------ */

/* Frees a tensor of r unless it lies in the body (borrowed). */
static void free_tensor(const struct api_attend_request *r, float *p) {
    api__free_unborrowed(r->borrowed_lo, r->borrowed_hi, p);
}

void api_attend_request_release(struct api_attend_request *r) {
    for (int32_t i = 0; r->steps != NULL && i < r->n_steps; i++) {
        api_attend_request_release(&r->steps[i]);
    }
    api_selection_release(&r->sel);
    free_tensor(r, r->head_mask);
    free(r->steps);
    free_tensor(r, r->q);
    free_tensor(r, r->k);
    free_tensor(r, r->v);
    free_tensor(r, r->x);
    free(r->positions);
    free(r->key_mask);
    free_tensor(r, r->context);
    memset(r, 0, sizeof *r);
}

/* positions: integers in [0, max_seq), at most max_seq of them (their count is checked against
 * x's rows once both are read, since either may come first). */
static int parse_positions(struct json_reader *r, int32_t max_seq, int32_t **out, int32_t *n_out,
                           struct api_error *err) {
    static const char what[] = "an array of integers, one per token of x";
    if (json_peek(r) != JSON_TYPE_ARRAY) {
        return api__wrong_type(r, "positions", what, err);
    }
    json_array_begin(r);
    int32_t *pos = NULL;
    int32_t n = 0, cap = 0;
    int more, rc = 0;
    while ((more = json_array_next(r)) == 1) {
        double d;
        if (json_peek(r) != JSON_TYPE_NUMBER) {
            rc = json_peek(r) == JSON_TYPE_INVALID
                     ? api__wrong_type(r, "positions", what, err)
                     : api__fail(err, ERROR_INVALID_REQUEST, "positions",
                                 "positions[%d]: expected a non-negative integer", (int)n);
            break;
        }
        if (json_read_number(r, &d) != 0) {
            rc = api__syntax_error(r, err);
            break;
        }
        if (!isfinite(d) || d != floor(d) || d < 0) {
            rc = api__fail(err, ERROR_INVALID_REQUEST, "positions",
                           "positions[%d]: expected a non-negative integer", (int)n);
            break;
        }
        if (d >= (double)max_seq) {
            rc = api__fail(err, ERROR_CONTEXT_LENGTH_EXCEEDED, "positions",
                           "positions[%d]: %.0f is past the model's maximum position %d", (int)n, d,
                           (int)max_seq - 1);
            break;
        }
        if (n == max_seq) {
            rc = api__fail(err, ERROR_INVALID_REQUEST, "positions",
                           "positions: more values than the maximum sequence length %d",
                           (int)max_seq);
            break;
        }
        if (n == cap) {
            cap = cap > 0 ? (cap > max_seq / 2 ? max_seq : cap * 2) : 64;
            int32_t *p = realloc(pos, (size_t)cap * sizeof *p);
            if (p == NULL) {
                rc = api__out_of_memory(err, "positions");
                break;
            }
            pos = p;
        }
        pos[n++] = (int32_t)d;
    }
    if (rc == 0 && more < 0) {
        rc = api__syntax_error(r, err);
    }
    if (rc == 0 && n == 0) {
        /* never one per token (a call has at least one); an empty array left no list behind,
         * so every later check passed it as "no positions" (found by an outside audit) */
        rc = api__fail(err, ERROR_INVALID_REQUEST, "positions",
                       "positions: empty (one per token, or leave it out for the cache's order)");
    }
    if (rc != 0) {
        free(pos);
        return rc;
    }
    *out = pos;
    *n_out = n;
    return 0;
}

enum attend_field {
    ATTEND_X,
    ATTEND_SESSION_ID,
    ATTEND_LAYER,
    ATTEND_POSITIONS,
    ATTEND_EXPECT_N_PAST,
    ATTEND_RETURN_WEIGHTS,
    ATTEND_STREAM,
    ATTEND_ENCODING,
    ATTEND_KEY_MASK,
    ATTEND_CONTEXT,
    ATTEND_CROSS,
    ATTEND_REPLACE_CONTEXT,
    ATTEND_BINARY_OUTPUT,
    ATTEND_STEPS,
    ATTEND_Q,
    ATTEND_K,
    ATTEND_V,
    ATTEND_ROPE,
    ATTEND_CAPTURE,
    ATTEND_HEAD_MASK,
    ATTEND_N_FIELDS,
};

static const char *const attend_names[ATTEND_N_FIELDS] = {"x",
                                                          "session_id",
                                                          "layer",
                                                          "positions",
                                                          "expect_n_past",
                                                          "return_weights",
                                                          "stream",
                                                          "encoding_format",
                                                          "key_mask",
                                                          "context",
                                                          "cross",
                                                          "replace_context",
                                                          "binary_output",
                                                          "steps",
                                                          "q",
                                                          "k",
                                                          "v",
                                                          "rope",
                                                          "capture",
                                                          "head_mask"};

#define F(name) (1u << ATTEND_##name)

/* The fields of each route's request, of a batch's top level and of its steps. */
struct attend_route {
    const char *route;         /* for messages */
    uint32_t top, batch, step; /* the fields each may have */
    uint32_t required;         /* what a request (or a step) must have */
};

static const struct attend_route attend_route = {
    "POST /v1/attend",
    ~(F(Q) | F(K) | F(V) | F(ROPE)),
    F(LAYER) | F(STEPS) | F(ENCODING) | F(BINARY_OUTPUT),
    F(X) | F(SESSION_ID) | F(POSITIONS) | F(EXPECT_N_PAST) | F(RETURN_WEIGHTS) | F(CAPTURE) |
        F(HEAD_MASK),
    F(X),
};

static const struct attend_route kv_route = {
    "POST /v1/kv/attend",
    F(SESSION_ID) | F(LAYER) | F(Q) | F(K) | F(V) | F(POSITIONS) | F(EXPECT_N_PAST) |
        F(RETURN_WEIGHTS) | F(ROPE) | F(ENCODING) | F(BINARY_OUTPUT) | F(STEPS) | F(CAPTURE) |
        F(HEAD_MASK),
    F(LAYER) | F(STEPS) | F(ENCODING) | F(BINARY_OUTPUT) | F(ROPE),
    F(SESSION_ID) | F(Q) | F(K) | F(V) | F(POSITIONS) | F(EXPECT_N_PAST) | F(RETURN_WEIGHTS) |
        F(CAPTURE) | F(HEAD_MASK),
    F(Q) | F(K) | F(V), /* and a session_id, here or in X-Session-Id (job__attend_admit) */
};

/* One member of an attend body into r. */
/* A (tokens, hidden_size) tensor field of at most max_seq rows (x, a context). */
static int parse_token_rows(struct json_reader *jr, const struct api_limits *lim, const char *name,
                            const char *doc, float **out, int32_t *n_rows, struct api_error *err) {
    struct tensor_spec spec = {name, doc, 2, {-1, lim->hidden_size, -1, -1}, 0};
    int64_t dims[4];
    int rc = api__parse_tensor(jr, &spec, out, dims, NULL, err);
    if (rc == 0 && dims[0] > lim->max_seq) {
        rc = api__fail(err, ERROR_CONTEXT_LENGTH_EXCEEDED, name,
                       "%s: %lld tokens exceed the model's maximum sequence length %d", name,
                       (long long)dims[0], (int)lim->max_seq);
    }
    *n_rows = rc == 0 ? (int32_t)dims[0] : 0;
    return rc;
}

/* key_mask: one 0 or 1 per key of the session after this request (its length is checked when
 * the request runs, against the cache it meets), made bytes. */
static int parse_key_mask(struct json_reader *jr, const struct api_limits *lim,
                          struct api_attend_request *r, struct api_error *err) {
    struct tensor_spec spec = {"key_mask",
                               "(n_past + T): 1 = attend, 0 = never attend to that token",
                               1,
                               {-1, -1, -1, -1},
                               0};
    float *values = NULL;
    int64_t dims[4];
    int rc = api__parse_tensor(jr, &spec, &values, dims, NULL, err);
    if (rc == 0 && dims[0] > lim->max_seq) {
        rc = api__fail(err, ERROR_CONTEXT_LENGTH_EXCEEDED, "key_mask",
                       "key_mask: %lld keys exceed the model's maximum sequence length %d",
                       (long long)dims[0], (int)lim->max_seq);
    }
    if (rc == 0 && (r->key_mask = malloc((size_t)dims[0])) == NULL) {
        rc = api__out_of_memory(err, "key_mask");
    }
    for (int64_t i = 0; rc == 0 && i < dims[0]; i++) {
        if (values[i] != 0.0f && values[i] != 1.0f) {
            rc = api__fail(err, ERROR_INVALID_REQUEST, "key_mask",
                           "key_mask[%lld] is %.9g; 1 attends, 0 masks", (long long)i,
                           (double)values[i]);
            break;
        }
        r->key_mask[i] = values[i] != 0.0f;
    }
    r->n_key_mask = rc == 0 ? (int32_t)dims[0] : 0;
    free_tensor(r, values); /* a binary part may have been read where it lies */
    return rc;
}

static int parse_steps(struct json_reader *jr, const struct api_limits *lim,
                       const struct attend_route *route, struct api_attend_request *r,
                       struct api_error *err);

/* q (n_heads, T, head_dim), k or v (n_kv_heads, T, head_dim) of /v1/kv/attend; *t gets T. */
static int parse_heads(struct json_reader *jr, const struct api_limits *lim, const char *name,
                       float **out, int32_t *t, struct api_error *err) {
    bool is_q = name[0] == 'q';
    struct tensor_spec spec = {name,
                               is_q ? "(n_heads, T, head_dim)" : "(n_kv_heads, T, head_dim)",
                               3,
                               {is_q ? lim->n_heads : lim->n_kv_heads, -1, lim->head_dim, -1},
                               0};
    int64_t dims[4];
    int rc = api__parse_tensor(jr, &spec, out, dims, NULL, err);
    if (rc == 0 && dims[1] > lim->max_seq) {
        rc = api__fail(err, ERROR_CONTEXT_LENGTH_EXCEEDED, name,
                       "%s: %lld tokens exceed the model's maximum sequence length %d", name,
                       (long long)dims[1], (int)lim->max_seq);
    }
    *t = rc == 0 ? (int32_t)dims[1] : 0;
    return rc;
}

static int attend_field(struct json_reader *jr, int index, const struct api_limits *lim,
                        const struct attend_route *route, struct api_attend_request *r,
                        int32_t *n_positions, bool *binary_output, struct api_error *err) {
    if (!((route->required >> index) & 1u) && api__take_null(jr)) {
        return 0; /* every field but the required may be null: the same as leaving it out */
    }
    int64_t v;
    int rc;
    switch (index) {
    case ATTEND_X:
        return parse_token_rows(jr, lim, "x", "(T, hidden_size)", &r->x, &r->n_tokens, err);
    case ATTEND_SESSION_ID:
        return api__get_session_id(jr, "session_id", r->session_id, err);
    case ATTEND_LAYER:
        return api__get_layer(jr, lim, &r->layer, err);
    case ATTEND_POSITIONS:
        return parse_positions(jr, lim->max_seq, &r->positions, n_positions, err);
    case ATTEND_EXPECT_N_PAST:
        rc = api__get_int(jr, "expect_n_past", 0, INT32_MAX, &v, err);
        r->has_expect_n_past = rc == 0;
        r->expect_n_past = (int32_t)v;
        return rc;
    case ATTEND_RETURN_WEIGHTS:
        return api__parse_return_weights(jr, lim->n_heads, lim->max_seq, &r->return_weights,
                                         &r->sel, err);
    case ATTEND_CAPTURE:
        return api__parse_capture(jr, &r->capture, err);
    case ATTEND_HEAD_MASK: {
        struct tensor_spec spec = {"head_mask",
                                   "(n_heads): each head's output scale, 0 removes it",
                                   1,
                                   {lim->n_heads, -1, -1, -1},
                                   0};
        int64_t dims[4];
        return api__parse_tensor(jr, &spec, &r->head_mask, dims, NULL, err);
    }
    case ATTEND_STREAM:
        return api__get_bool(jr, "stream", &r->stream, err);
    case ATTEND_KEY_MASK:
        return parse_key_mask(jr, lim, r, err);
    case ATTEND_CONTEXT:
        return parse_token_rows(jr, lim, "context", "(S, hidden_size): the encoder states",
                                &r->context, &r->n_context, err);
    case ATTEND_CROSS:
        return api__get_bool(jr, "cross", &r->is_cross, err);
    case ATTEND_REPLACE_CONTEXT:
        return api__get_bool(jr, "replace_context", &r->replace_context, err);
    case ATTEND_BINARY_OUTPUT:
        return api__get_bool(jr, "binary_output", binary_output, err);
    case ATTEND_STEPS:
        return parse_steps(jr, lim, route, r, err);
    case ATTEND_Q:
        return parse_heads(jr, lim, "q", &r->q, &r->n_tokens, err);
    case ATTEND_K:
        return parse_heads(jr, lim, "k", &r->k, &r->k_tokens, err);
    case ATTEND_V:
        return parse_heads(jr, lim, "v", &r->v, &r->v_tokens, err);
    case ATTEND_ROPE:
        return api__get_bool(jr, "rope", &r->rope, err);
    default:
        return api__get_encoding(jr, &r->encoding, err);
    }
}

/* A cross-attention request: context means cross (and "cross": false with it contradicts), and
 * what belongs to the session's own tokens (positions, key_mask, expect_n_past) or to a token
 * at a time (stream) is refused with it; replace_context needs a context. */
static int check_cross(struct api_attend_request *r, uint32_t seen, struct api_error *err) {
    bool said_cross = (seen >> ATTEND_CROSS) & 1u;
    if (r->context != NULL && said_cross && !r->is_cross) {
        return api__fail(err, ERROR_INVALID_REQUEST, "cross",
                         "cross: false contradicts context (a context is attended across)");
    }
    r->is_cross = r->is_cross || r->context != NULL;
    if (r->replace_context && r->context == NULL) {
        return api__fail(err, ERROR_INVALID_REQUEST, "replace_context",
                         "replace_context: true needs the context that replaces the stored one");
    }
    if (!r->is_cross) {
        return 0;
    }
    if (r->capture & (API_CAPTURE_K | API_CAPTURE_V)) {
        return api__fail(
            err, ERROR_INVALID_REQUEST, "capture",
            "capture: k and v are the context's in cross-attention, not this call's (q "
            "and head_out are)");
    }
    static const char *const names[] = {"positions", "key_mask", "expect_n_past", "stream"};
    bool given[] = {r->positions != NULL, r->key_mask != NULL, r->has_expect_n_past, r->stream};
    for (int i = 0; i < 4; i++) {
        if (given[i]) {
            return api__fail(err, ERROR_INVALID_REQUEST, names[i],
                             "%s: not part of cross-attention (the queries see the whole context, "
                             "unrotated, and the session's own tokens are not touched)",
                             names[i]);
        }
    }
    return 0;
}

/* Rewrites a step's error so that it names the step: param "steps[i].x", message prefixed. */
static int step_error(int rc, int32_t i, struct api_error *err) {
    char prefix[24];
    snprintf(prefix, sizeof prefix, "steps[%d]", (int)i);
    api__prepend(err->param, sizeof err->param, prefix, ".");
    api__prepend(err->message, sizeof err->message, prefix, ": ");
    utf8_trim_partial(err->message);
    return rc;
}

/* A request's (or a step's) checks, once it is read: what its route requires is there, its
 * tensors agree on T, positions match it, its weights fit. */
static int check_step(const struct api_attend_request *st, uint32_t seen, int32_t n_positions,
                      const struct api_limits *lim, const struct attend_route *route,
                      struct api_error *err) {
    for (int i = 0; i < ATTEND_N_FIELDS; i++) {
        if (((route->required >> i) & 1u) && !((seen >> i) & 1u)) {
            return api__fail(err, ERROR_INVALID_REQUEST, attend_names[i], "%s: required",
                             attend_names[i]);
        }
    }
    if (st->q != NULL && (st->k_tokens != st->n_tokens || st->v_tokens != st->n_tokens)) {
        return api__fail(err, ERROR_INVALID_REQUEST, st->k_tokens != st->n_tokens ? "k" : "v",
                         "%s: %d tokens, q has %d (q, k and v are the same tokens' projections)",
                         st->k_tokens != st->n_tokens ? "k" : "v",
                         (int)(st->k_tokens != st->n_tokens ? st->k_tokens : st->v_tokens),
                         (int)st->n_tokens);
    }
    if (st->positions != NULL && n_positions != st->n_tokens) {
        return api__fail(err, ERROR_INVALID_REQUEST, "positions",
                         "positions: has %d values, expected %d (one per token of %s)",
                         (int)n_positions, (int)st->n_tokens, st->q != NULL ? "q" : "x");
    }
    /* the rows are the call's own: known now, so a step's wrong row fails the body before any
     * step runs (at run time it failed that step alone, after the others had advanced) */
    for (int32_t i = 0; st->sel.is_set && i < st->sel.n_rows; i++) {
        if (st->sel.rows[i] < -st->n_tokens || st->sel.rows[i] >= st->n_tokens) {
            return api__fail(err, ERROR_INVALID_REQUEST, "return_weights.rows",
                             "return_weights.rows: %d is outside this call's %d query rows",
                             (int)st->sel.rows[i], (int)st->n_tokens);
        }
    }
    if (st->return_weights && !st->sel.is_set && !st->is_cross &&
        (int64_t)lim->n_heads * st->n_tokens * st->n_tokens > API_WEIGHTS_MAX_VALUES) {
        return api__fail(err, ERROR_INVALID_REQUEST, "return_weights",
                         "return_weights: n_heads x T x T = %lld values exceed the limit of %d",
                         (long long)lim->n_heads * st->n_tokens * st->n_tokens,
                         API_WEIGHTS_MAX_VALUES);
    }
    return 0;
}

/* The fields of one object of a route: the next field, refused if the route's mask lacks it. */
static int next_route_field(struct json_reader *jr, uint32_t allowed, const char *where,
                            uint32_t *seen, int *index, struct api_error *err) {
    int rc = api__next_field(jr, attend_names, ATTEND_N_FIELDS, seen, index, err);
    if (rc == 1 && !((allowed >> *index) & 1u)) {
        return api__fail(err, ERROR_INVALID_REQUEST, attend_names[*index], "%s: not a field of %s",
                         attend_names[*index], where);
    }
    return rc;
}

/* steps: an array of 1..API_MAX_STEPS objects, each a step (the route's step fields only). */
static int parse_steps(struct json_reader *jr, const struct api_limits *lim,
                       const struct attend_route *route, struct api_attend_request *r,
                       struct api_error *err) {
    if (json_peek(jr) != JSON_TYPE_ARRAY) {
        return api__wrong_type(jr, "steps", "an array of step objects", err);
    }
    /* grown as steps come (a whole API_MAX_STEPS was 90 KB zeroed for every batch call) */
    int32_t cap = 8;
    r->steps = calloc((size_t)cap, sizeof *r->steps);
    if (r->steps == NULL) {
        return api__out_of_memory(err, "steps");
    }
    char where[64];
    snprintf(where, sizeof where, "a step of %s", route->route);
    json_array_begin(jr);
    int more;
    while ((more = json_array_next(jr)) == 1) {
        int32_t i = r->n_steps;
        if (i == API_MAX_STEPS) {
            return api__fail(err, ERROR_INVALID_REQUEST, "steps", "steps: more than %d",
                             API_MAX_STEPS);
        }
        if (i == cap) {
            int32_t grown = 2 * cap < API_MAX_STEPS ? 2 * cap : API_MAX_STEPS;
            struct api_attend_request *more_steps =
                realloc(r->steps, (size_t)grown * sizeof *r->steps);
            if (more_steps == NULL) {
                return api__out_of_memory(err, "steps");
            }
            memset(more_steps + cap, 0, (size_t)(grown - cap) * sizeof *more_steps);
            r->steps = more_steps;
            cap = grown;
        }
        if (json_peek(jr) != JSON_TYPE_OBJECT) {
            return step_error(api__wrong_type(jr, "", "a step object", err), i, err);
        }
        struct api_attend_request *st = &r->steps[i];
        r->n_steps++; /* counted now, so that release frees what a failed step holds */
        st->layer = lim->layer_first;
        st->borrowed_lo = r->borrowed_lo;
        st->borrowed_hi = r->borrowed_hi;
        int32_t n_positions = 0;
        uint32_t seen = 0;
        bool unused = false;
        int index, rc;
        json_object_begin(jr);
        while ((rc = next_route_field(jr, route->step, where, &seen, &index, err)) == 1) {
            rc = attend_field(jr, index, lim, route, st, &n_positions, &unused, err);
            if (rc != 0) {
                break;
            }
        }
        if (rc == 0) {
            rc = check_step(st, seen, n_positions, lim, route, err);
        }
        if (rc == 0 && st->q != NULL && st->session_id[0] == '\0') {
            /* as a call alone: q/k/v append to a session's cache, there is no stateless form */
            rc = api__fail(err, ERROR_INVALID_REQUEST, "session_id", "session_id: required");
        }
        for (int32_t j = 0; rc == 0 && st->session_id[0] && j < i; j++) {
            if (strcmp(r->steps[j].session_id, st->session_id) == 0) {
                rc = api__fail(err, ERROR_INVALID_REQUEST, "session_id",
                               "session_id: %s is steps[%d]'s too (one step per session a call)",
                               st->session_id, (int)j);
            }
        }
        if (rc != 0) {
            return step_error(rc, i, err);
        }
    }
    if (more < 0) {
        return api__syntax_error(jr, err);
    }
    if (r->n_steps == 0) {
        return api__fail(err, ERROR_INVALID_REQUEST, "steps", "steps: at least one step");
    }
    return 0;
}

/* A batch: the top level has only what every step shares; each step gets it. */
static int check_batch(struct api_attend_request *r, uint32_t seen,
                       const struct attend_route *route, struct api_error *err) {
    for (int i = 0; i < ATTEND_N_FIELDS; i++) {
        if (((seen >> i) & 1u) && !((route->batch >> i) & 1u)) {
            /* a step field goes in each step; others (stream, key_mask...) a batch has not */
            return api__fail(
                err, ERROR_INVALID_REQUEST, attend_names[i],
                ((route->step >> i) & 1u)
                    ? "%s: not with steps (each step has its own; a batch's top level "
                      "has only what all share)"
                    : "%s: not with steps (a call with steps has no such field, at its "
                      "top level or in a step)",
                attend_names[i]);
        }
    }
    for (int32_t i = 0; i < r->n_steps; i++) {
        r->steps[i].layer = r->layer;
        r->steps[i].encoding = r->encoding;
        r->steps[i].rope = r->rope;
    }
    return 0;
}

/* q/k/v the caller rotated (no "rope": true) take no positions: none would enter the attention,
 * so a forgotten "rope" must not pass as a rotated answer. */
static int check_rope_positions(const struct api_attend_request *r, struct api_error *err) {
    if (r->q != NULL && r->positions != NULL && !r->rope) {
        return api__fail(
            err, ERROR_INVALID_REQUEST, "positions",
            "positions: only with \"rope\": true (q and k are taken as rotated already, "
            "so no position would enter the attention)");
    }
    return 0;
}

static int parse_attend(const struct api_body *body, const struct api_limits *lim,
                        const struct attend_route *route, struct api_attend_request *out,
                        struct api_error *err) {
    memset(out, 0, sizeof *out);
    struct api_attend_request r;
    memset(&r, 0, sizeof r);
    r.layer = lim->layer_first;
    if (body->may_borrow && body->binary != NULL) {
        r.borrowed_lo = (uintptr_t)body->binary;
        r.borrowed_hi = (uintptr_t)body->binary + body->binary_len;
    }
    struct body_reader br;
    int32_t n_positions = 0;
    uint32_t seen = 0;
    bool binary_output = false;
    int index;
    int rc = api__begin_framed(&br, body, err);
    while (rc == 0 &&
           (rc = next_route_field(&br.json, route->top, route->route, &seen, &index, err)) == 1) {
        rc = attend_field(&br.json, index, lim, route, &r, &n_positions, &binary_output, err);
    }
    if (rc == 0) {
        rc = api__end_body(&br.json, err);
    }
    if (rc == 0) {
        rc = api__apply_binary_output(binary_output, seen, ATTEND_ENCODING, &r.encoding, err);
    }
    if (rc == 0 && r.steps != NULL) {
        rc = check_batch(&r, seen, route, err);
        for (int32_t i = 0; rc == 0 && i < r.n_steps; i++) {
            if ((rc = check_rope_positions(&r.steps[i], err)) != 0) {
                rc = step_error(rc, i, err);
            }
        }
    } else if (rc == 0) {
        rc = check_rope_positions(&r, err);
    }
    if (rc == 0 && r.steps == NULL) {
        rc = check_step(&r, seen, n_positions, lim, route, err);
        if (rc == 0) {
            rc = check_cross(&r, seen, err);
        }
        if (rc == 0 && r.encoding == API_ENCODING_BINARY && r.stream) {
            rc = api__fail(err, ERROR_INVALID_REQUEST, "binary_output",
                           "binary_output: not with stream (stream events are text)");
        }
        const char *per_call = r.sel.is_set     ? "return_weights"
                               : r.capture != 0 ? "capture"
                               : r.head_mask    ? "head_mask"
                                                : NULL;
        if (rc == 0 && r.stream && per_call != NULL) {
            rc = api__fail(err, ERROR_INVALID_REQUEST, per_call,
                           "%s: not with stream (%s); send the tokens in one call", per_call,
                           r.sel.is_set ? "a stream's weights are every probability of each token"
                                        : "it applies to a whole call");
        }
    }
    if (rc != 0) {
        api_attend_request_release(&r);
        return rc;
    }
    *out = r;
    return 0;
}

int api_attend_request_parse(const char *body, size_t len, const struct api_limits *lim,
                             struct api_attend_request *out, struct api_error *err) {
    struct api_body b = {body, len, NULL, 0, false};
    return api_attend_request_parse_body(&b, lim, out, err);
}

int api_attend_request_parse_body(const struct api_body *body, const struct api_limits *lim,
                                  struct api_attend_request *out, struct api_error *err) {
    return parse_attend(body, lim, &attend_route, out, err);
}

int api_kv_attend_request_parse_body(const struct api_body *body, const struct api_limits *lim,
                                     struct api_attend_request *out, struct api_error *err) {
    return parse_attend(body, lim, &kv_route, out, err);
}

/* ---- session requests ----------------------------------------------------------------------- */

int api_truncate_request_parse(const char *body, size_t len, const struct api_limits *lim,
                               struct api_truncate_request *out, struct api_error *err) {
    static const char *const names[] = {"n_tokens", "layer"};
    memset(out, 0, sizeof *out);
    struct api_truncate_request r = {0};
    struct body_reader br;
    uint32_t seen = 0;
    int index;
    int64_t v;
    int rc = api__begin_body(&br, body, len, err);
    while (rc == 0 && (rc = api__next_field(&br.json, names, 2, &seen, &index, err)) == 1) {
        if (index == 0) {
            rc = api__get_int(&br.json, "n_tokens", 0, INT32_MAX, &v, err);
            r.n_tokens = (int32_t)v;
        } else if (api__take_null(&br.json)) {
            rc = 0; /* "layer": null is the same as leaving it out */
        } else {
            rc = api__get_layer(&br.json, lim, &r.layer, err);
            r.has_layer = true;
        }
    }
    if (rc == 0) {
        rc = api__end_body(&br.json, err);
    }
    if (rc == 0 && !(seen & 1u)) {
        rc = api__fail(err, ERROR_INVALID_REQUEST, "n_tokens", "n_tokens: required integer >= 0");
    }
    if (rc == 0) {
        *out = r;
    }
    return rc;
}

int api_fork_request_parse(const char *body, size_t len, struct api_fork_request *out,
                           struct api_error *err) {
    static const char *const names[] = {"new_id"};
    memset(out, 0, sizeof *out);
    struct api_fork_request r = {{0}};
    struct body_reader br;
    uint32_t seen = 0;
    int index;
    int rc = api__begin_body(&br, body, len, err);
    while (rc == 0 && (rc = api__next_field(&br.json, names, 1, &seen, &index, err)) == 1) {
        rc = api__get_session_id(&br.json, "new_id", r.new_id, err);
    }
    if (rc == 0) {
        rc = api__end_body(&br.json, err);
    }
    if (rc == 0 && !(seen & 1u)) {
        rc = api__fail(err, ERROR_INVALID_REQUEST, "new_id", "new_id: required session id");
    }
    if (rc == 0) {
        *out = r;
    }
    return rc;
}
