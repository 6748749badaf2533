/* tests/fuzz/fuzz_fork.c: POST /v1/sessions/{id}/fork bodies (api_fork_request_parse).
 * Accepted: new_id is a valid session id (no NUL, no byte outside the id alphabet). */
#include <stdlib.h>
#include <string.h>

#include "fuzz.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    struct api_fork_request r;
    struct api_error err;
    int rc = api_fork_request_parse((const char *)data, size, &r, &err);
    if (rc != 0) {
        fuzz_check_error(rc, &err);
        return 0;
    }
    if (!api_session_id_is_valid(r.new_id, strlen(r.new_id)))
        abort();
    return 0;
}
