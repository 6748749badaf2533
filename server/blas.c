/* server/blas.c: reserving OpenBLAS's work buffers at startup (see blas.h). It uses the two
 * buffer functions OpenBLAS exports for its own interface layer; their behaviour is read from
 * OpenBLAS's driver/others/memory.c: a buffer slot, once given memory, keeps it for the life of
 * the process and is reused by later calls, and the first allocation of a slot is what retries
 * without end when it fails.
 */
#include "blas.h"

#include <stdio.h>
#include <stdlib.h>

/* OpenBLAS's buffer functions (libopenblas exports them; cblas.h does not declare them). */
void *blas_memory_alloc(int procpos);
void blas_memory_free(void *buffer);

/* What one buffer takes (BUFFER_SIZE plus its alignment page in the x86-64 build), with room
 * for the other allocations of a call. */
#define BUFFER_BYTES ((size_t)132 << 20)

#define MAX_BUFFERS BLAS_MAX_BUFFERS

int blas_reserve(int32_t n_buffers, char *err, size_t err_size) {
    if (n_buffers < 1 || n_buffers > MAX_BUFFERS) {
        snprintf(err, err_size, "cannot reserve %d OpenBLAS buffers (1..%d)", (int)n_buffers,
                 MAX_BUFFERS);
        return -1;
    }
    void *probe[MAX_BUFFERS] = {0};
    void *held[MAX_BUFFERS] = {0};
    int rc = 0;
    /* Plain allocations first: if the address space is not there, say so instead of letting
     * OpenBLAS retry forever. */
    for (int32_t i = 0; i < n_buffers && rc == 0; i++) {
        probe[i] = malloc(BUFFER_BYTES);
        if (probe[i] == NULL) {
            snprintf(err, err_size,
                     "OpenBLAS needs %d work buffers of %zu MiB (workers x BLAS threads) and only "
                     "%d fit in the address space allowed (ulimit -v)",
                     (int)n_buffers, BUFFER_BYTES >> 20, (int)i);
            rc = -1;
        }
    }
    for (int32_t i = 0; i < n_buffers; i++) {
        free(probe[i]);
    }
    if (rc != 0) {
        return rc;
    }
    /* Held all at once, so that each takes a slot of its own; freed, they stay allocated. */
    for (int32_t i = 0; i < n_buffers; i++) {
        held[i] = blas_memory_alloc(0);
    }
    for (int32_t i = 0; i < n_buffers; i++) {
        blas_memory_free(held[i]);
    }
    return 0;
}
