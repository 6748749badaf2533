/* tests/fuzz/fuzz_snapshot.c: session files (PUT /v1/sessions/{id}, and --state-dir's files read
 * back): snapshot_check, snapshot_match and snapshot_restore into a session of preset tiny's
 * store (f32 K/V, 16-token blocks), its layer 0 a 32-token sliding window (a ring, whose file
 * says which blocks it dropped), layer 1 full. The target writes the model's fingerprint and the
 * checksum into each input, so the fuzzer gets past them to the framing and every cache's header
 * and payload (the checksum and the fingerprint have their own tests in check_persist.c). A refused
 * file must leave the session without caches; an accepted one must hold exactly what a re-export
 * says, within the model's limits. */
#include <stdlib.h>
#include <string.h>

#include "../../engine/attn.h"
#include "../../server/error.h"
#include "../../server/session.h"
#include "../../server/snapshot.h"
#include "fuzz.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static attn_model *model_;
static struct session_store *store_;

static void init(void) {
    attn_config cfg;
    attn_load_params lp;
    memset(&lp, 0, sizeof lp);
    if (attn_config_preset("tiny", &cfg) != ATTN_OK) {
        abort();
    }
    cfg.sliding_window = 32;
    cfg.is_full_layer[1] = true;
    if (attn_model_create_random(&cfg, 0, &lp, &model_) != ATTN_OK) {
        abort();
    }
    struct session_store_params sp = {.model = model_,
                                      .budget_bytes = (size_t)1 << 20,
                                      .block_tokens = 16,
                                      .kv_dtype = ATTN_DTYPE_F32,
                                      .max_sessions = 4,
                                      .max_tombstones = 4};
    if (session_store_create(&sp, &store_) != 0) {
        abort();
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (model_ == NULL) {
        init();
    }
    uint8_t *file = malloc(size > 0 ? size : 1);
    memcpy(file, data, size);
    if (size >= SNAPSHOT_MIN_BYTES) {
        attn_model_fingerprint(model_, file + 16);
        snapshot_seal(file, size);
    }
    struct snapshot_info info;
    char msg[256];
    int rc = snapshot_check(file, size, &info, msg, sizeof msg);
    if (rc == 0) {
        rc = snapshot_match(&info, model_, snapshot_kv_of(session_store_kv_pool(store_)), msg,
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
    if (session_create(store_, "f", 0, &s) != 0) {
        abort();
    }
    session_pin(store_, s, 0);
    struct session_turn *t = session_turn_take(store_, s);
    rc = snapshot_restore(store_, t, file, size, msg, sizeof msg);
    if (rc != 0 && session_n_layers_used(s) != 0) {
        abort(); /* all or nothing */
    }
    if (rc == 0) {
        /* what was made reads back within the model's limits, and exports again */
        for (int32_t l = 0; l < 2; l++) {
            attn_kv *kv = session_kv_find(s, l);
            if (kv != NULL && (attn_kv_len(kv) > attn_model_config(model_)->max_seq ||
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
        uint8_t *again;
        size_t n;
        if (snapshot_encode(s, model_, snapshot_kv_of(session_store_kv_pool(store_)), 0, &again,
                            &n) != 0) {
            abort();
        }
        snapshot_seal(again, n);
        struct snapshot_info info2;
        if (snapshot_check(again, n, &info2, msg, sizeof msg) != 0 ||
            info2.n_sections != info.n_sections) {
            abort();
        }
        free(again);
    } else if (rc != ERROR_CORRUPT_SESSION && rc != ERROR_FINGERPRINT_MISMATCH &&
               rc != ERROR_KV_BUDGET_EXHAUSTED) {
        abort();
    }
    session_clear(store_, t);
    session_turn_give(store_, t);
    session_unpin(store_, s, 0);
    free(file);
    return 0;
}
