/* tests/fuzz/fuzz_hf_config.c: a Hugging Face config.json (attn__hf_config_parse), with and
 * without --trust-layout llama (the input's first byte chooses). Accepted: a config that
 * attn_config_check accepts as it is, with a one-line family name, and one accepted without
 * either flag is accepted alike with each, giving the same config. Refused: a one-line reason. */
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "../../engine/attn_int.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* The reason and the family go to logs and to GET /v1/model: no control byte, no newline. */
static bool is_one_line(const char *s) {
    for (; *s != '\0'; s++)
        if ((unsigned char)*s < 0x20 || *s == 0x7f)
            return false;
    return true;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size == 0)
        return 0;
    static const char *const codes[] = {NULL, "transformers", "checkpoint", NULL};
    attn_load_params lp = {.trust_layout = (data[0] & 1) ? "llama" : NULL,
                           .modeling_code = codes[(data[0] >> 1) & 3]};
    attn_config cfg;
    struct attn__hf_layout lay;
    memset(&cfg, 0, sizeof cfg);
    char err[512];
    err[0] = '\0';
    int rc =
        attn__hf_config_parse((const char *)data + 1, size - 1, &lp, &cfg, &lay, err, sizeof err);
    if (rc != 0) {
        if (rc >= 0 || err[0] == '\0' || !is_one_line(err))
            abort();
        return 0;
    }
    if (!is_one_line(lay.family))
        abort();
    if (attn_config_check(&cfg) != 0)
        abort();
    /* A config served without either flag is served the same with them: --trust-layout changes
     * only what an unknown model_type means, --modeling-code only a model whose two codes
     * differ (refused without it). */
    if (lp.trust_layout == NULL && lp.modeling_code == NULL) {
        for (int v = 1; v < 6; v++) {
            attn_load_params lp2 = {.trust_layout = (v & 1) ? "llama" : NULL,
                                    .modeling_code = codes[(v >> 1) & 3]};
            attn_config cfg2;
            struct attn__hf_layout lay2;
            memset(&cfg2, 0, sizeof cfg2);
            /* (attn_config_check fills in the defaults, as it did in cfg) */
            if (attn__hf_config_parse((const char *)data + 1, size - 1, &lp2, &cfg2, &lay2, err,
                                      sizeof err) != 0 ||
                attn_config_check(&cfg2) != 0 || memcmp(&cfg, &cfg2, sizeof cfg) != 0 ||
                strcmp(lay.family, lay2.family) != 0)
                abort();
        }
    }
    return 0;
}
