/* tests/fuzz/fuzz_snapshot.c: session files (PUT /v1/sessions/{id}, and --state-dir's files read
 * back): snapshot_check, snapshot_match and snapshot_restore into a session of preset tiny's
 * store (16-token blocks, the K/V dtype and kept queries the file's header names), its layer 0 a
 * 32-token sliding window (a ring, whose file says which blocks it dropped), layer 1 full (or
 * linear attention: see model_for). The target writes the model's fingerprint and the
 * checksum into each input, so the fuzzer gets past them to the framing and every cache's header
 * and payload (the checksum and the fingerprint have their own tests in check_persist.c). A refused
 * file must leave the session without caches; an accepted one must hold exactly what a re-export
 * says, within the model's limits, and its export imported again must export the same bytes. */
#include <stdlib.h>
#include <string.h>

#include "../../engine/attn.h"
#include "../../server/error.h"
#include "../../server/session.h"
#include "../../server/snapshot.h"
#include "fuzz.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* One model and store for each pool a file's header may name: its KV dtype (offset 48: f32,
 * bf16, f16, q8_0), whether its caches keep their queries (the flags' bit 0, offset 80), and, when
 * bit 7 of its "layers held" byte (offset 94, informative only) is set, a model whose layer 1 is
 * linear attention (a kind 1 cache: the running state). A q8_0 pool's model has 32-value heads
 * (q8_0 blocks are 32 values: rows of 34 bytes, which pad their sections). */
static attn_model *models_[4];
static struct session_store *stores_[2][4][2];

static attn_model *model_for(int linear, bool q8) {
    int m = linear | (q8 ? 2 : 0);
    if (models_[m] == NULL) {
        attn_config cfg;
        attn_load_params lp;
        memset(&lp, 0, sizeof lp);
        if (attn_config_preset("tiny", &cfg) != ATTN_OK) {
            abort();
        }
        cfg.sliding_window = 32;
        cfg.is_full_layer[1] = true;
        if (linear) {
            cfg.layer_kind[1] = ATTN_LAYER_LINEAR;
        }
        if (q8) {
            cfg.head_dim = 32;
        }
        if (attn_model_create_random(&cfg, 0, &lp, &models_[m]) != ATTN_OK) {
            abort();
        }
    }
    return models_[m];
}

static struct session_store *store_for(int linear, attn_dtype dt, bool queries) {
    static const attn_dtype dts[] = {ATTN_DTYPE_F32, ATTN_DTYPE_BF16, ATTN_DTYPE_F16,
                                     ATTN_DTYPE_Q8_0};
    int d = 0;
    while (d < 4 && dts[d] != dt) {
        d++;
    }
    if (d == 4) {
        d = 0; /* a damaged dtype: snapshot_check refuses it whatever the pool */
    }
    struct session_store **st = &stores_[linear][d][queries];
    if (*st == NULL) {
        struct session_store_params sp = {.model = model_for(linear, d == 3),
                                          .budget_bytes = (size_t)1 << 20,
                                          .block_tokens = 16,
                                          .kv_dtype = dts[d],
                                          .keep_queries = queries,
                                          .max_sessions = 4,
                                          .max_tombstones = 4};
        if (session_store_create(&sp, st) != 0) {
            return NULL; /* a pool this geometry cannot have */
        }
    }
    return *st;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    int linear = size >= SNAPSHOT_HEADER_BYTES && (data[94] & 0x80) != 0;
    attn_dtype dt = size >= SNAPSHOT_HEADER_BYTES ? (attn_dtype)(data[48] | data[49] << 8) : 0;
    bool queries = size >= SNAPSHOT_HEADER_BYTES && (data[80] & 1) != 0;
    struct session_store *store = store_for(linear, dt, queries);
    if (store == NULL) {
        return 0;
    }
    const attn_model *model = session_store_model(store);
    uint8_t *file = malloc(size > 0 ? size : 1);
    memcpy(file, data, size);
    if (size >= SNAPSHOT_MIN_BYTES) {
        attn_model_fingerprint(model, file + 16);
        snapshot_seal(file, size);
    }
    struct snapshot_info info;
    char msg[256];
    int rc = snapshot_check(file, size, &info, msg, sizeof msg);
    if (rc == 0) {
        rc = snapshot_match(&info, model, snapshot_kv_of(session_store_kv_pool(store)), msg,
                            sizeof msg);
    }
    if (rc != 0) {
        if (rc != ERROR_CORRUPT_SESSION && rc != ERROR_SESSION_VERSION &&
            rc != ERROR_FINGERPRINT_MISMATCH) {
            abort();
        }
        free(file);
        return 0;
    }
    struct session *s;
    if (session_create(store, "f", 0, &s) != 0) {
        abort();
    }
    session_pin(store, s, 0);
    struct session_turn *t = session_turn_take(store, s);
    rc = snapshot_restore(store, t, file, size, msg, sizeof msg);
    if (rc != 0 && session_n_layers_used(s) != 0) {
        abort(); /* all or nothing */
    }
    if (rc == 0) {
        /* what was made reads back within the model's limits, and exports again */
        for (int32_t l = 0; l < 2; l++) {
            attn_kv *kv = session_kv_find(s, l);
            if (kv != NULL && (attn_kv_len(kv) > attn_model_config(model)->max_seq ||
                               attn_kv_first_held(kv) > attn_kv_len(kv))) {
                abort();
            }
            /* a ring holds every key its next query sees: it drops only blocks wholly before
             * len - window + 1 (an outside audit's fuzzer found a file that claimed more, and
             * the next attend read before the pool) */
            int32_t w = kv != NULL ? attn_kv_window(kv) : 0;
            if (w > 0 && attn_kv_first_held(kv) > 0 &&
                attn_kv_first_held(kv) > attn_kv_len(kv) - w + 1) {
                abort();
            }
        }
        /* export -> import -> export gives the same bytes: nothing is lost or changed by a
         * round trip (the first export is this server's own form of the file) */
        uint8_t *again, *third;
        size_t n, n3;
        struct snapshot_kv kv = snapshot_kv_of(session_store_kv_pool(store));
        if (snapshot_encode(s, model, kv, info.saved_unix_ms, &again, &n) != 0) {
            abort();
        }
        snapshot_seal(again, n);
        struct snapshot_info info2;
        if (snapshot_check(again, n, &info2, msg, sizeof msg) != 0 ||
            info2.n_sections != info.n_sections || info2.n_tokens != info.n_tokens) {
            abort();
        }
        session_clear(store, t);
        if (snapshot_restore(store, t, again, n, msg, sizeof msg) != 0 ||
            snapshot_encode(s, model, kv, info.saved_unix_ms, &third, &n3) != 0) {
            abort();
        }
        snapshot_seal(third, n3);
        if (n3 != n || memcmp(third, again, n) != 0) {
            abort();
        }
        free(third);
        free(again);
    } else if (rc != ERROR_CORRUPT_SESSION && rc != ERROR_FINGERPRINT_MISMATCH &&
               rc != ERROR_KV_BUDGET_EXHAUSTED) {
        abort();
    }
    session_clear(store, t);
    session_turn_give(store, t);
    session_unpin(store, s, 0);
    free(file);
    return 0;
}
