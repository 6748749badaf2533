/* tests/fuzz/fuzz.c: the properties shared by the fuzz targets (see fuzz.h). */
#include "fuzz.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdlib.h>

#include "../../server/error.h"
#include "../../server/utf8.h"

void fuzz_check_utf8(const char *s, size_t len) {
    size_t i = 0;
    while (i < len) {
        size_t n = utf8_seq_len((const unsigned char *)s + i, len - i);
        if (n == 0)
            abort();
        i += n;
    }
}

void fuzz_check_error(int code, const struct api_error *err) {
    const struct error_info *info = error_info_get(code);
    if (code == 0 || code != err->code || info == NULL || info->code != code)
        abort();
    /* A parser refuses the client's bytes (4xx) or runs out of memory (500), nothing else. */
    if (!(info->http_status >= 400 && info->http_status < 500) && info->code != ERROR_INTERNAL)
        abort();
    size_t len = 0;
    char *body = api_error_encode(code, err->message, err->param, &len);
    if (body == NULL)
        abort();
    fuzz_check_utf8(body, len);
    cJSON *doc = cJSON_ParseWithLength(body, len);
    const cJSON *e = cJSON_GetObjectItemCaseSensitive(doc, "error");
    if (!cJSON_IsString(cJSON_GetObjectItemCaseSensitive(e, "code")) ||
        !cJSON_IsString(cJSON_GetObjectItemCaseSensitive(e, "message")))
        abort();
    cJSON_Delete(doc);
    free(body);
}

void fuzz_check_finite(const float *x, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (!isfinite(x[i]))
            abort();
}
