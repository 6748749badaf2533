/* tests/fuzz/fuzz_safetensors.c: a safetensors file's header (attn__safetensors_header_parse),
 * the input being the whole file. Accepted: every tensor's byte range lies inside the file's
 * data section, apart from every other tensor's, and its name finds it again (names are
 * distinct: attn__safetensors_tensor_find). */
#include <stdlib.h>

#include "../../engine/attn_int.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    struct attn__st_header h;
    char err[256];
    int rc = attn__safetensors_header_parse(data, size, size, &h, err, sizeof err);
    if (rc != 0) {
        if (rc >= 0 || err[0] == '\0')
            abort();
        return 0;
    }
    if (h.data_start + h.data_bytes != size)
        abort();
    for (int32_t i = 0; i < h.n_tensors; i++) {
        const struct attn__st_tensor *t = &h.tensors[i];
        if (t->begin > t->end || t->end > h.data_bytes)
            abort();
        if (attn__safetensors_tensor_find(&h, t->name) != t)
            abort();
        /* no two tensors' bytes overlap (an empty one holds none) */
        for (int32_t j = 0; j < i && j < 512; j++) {
            const struct attn__st_tensor *u = &h.tensors[j];
            if (t->begin < t->end && u->begin < u->end && t->begin < u->end && u->begin < t->end)
                abort();
        }
    }
    attn__safetensors_header_release(&h);
    return 0;
}
