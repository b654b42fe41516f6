/*
 * fuzz_npy.c -- libFuzzer target: the .npy reader.  Any byte string must be
 * read or refused with a message, never crash or read out of bounds; an
 * array that reads must have a consistent element count.
 */
#include <stdint.h>
#include <stdlib.h>

#include "tools/npy.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void check(npy_status st, const npy_array *a, const char *err)
{
    if (st != NPY_OK) {
        if (!err[0])
            abort();
        return;
    }
    size_t n = 1;
    for (int i = 0; i < a->rank; i++)
        n *= (size_t)a->shape[i];
    if (n != a->count)
        abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    npy_array a;
    char err[256] = "";
    npy_status st = npy_read_f32_mem(data, size, "fuzz.npy", &a, err, sizeof err);
    check(st, &a, err);
    if (st == NPY_OK)
        npy_free(&a);
    err[0] = '\0';
    st = npy_read_i32_mem(data, size, "fuzz.npy", &a, err, sizeof err);
    check(st, &a, err);
    if (st == NPY_OK)
        npy_free(&a);
    return 0;
}
