/*
 * npy.h -- reading and writing NumPy .npy files for the attnjit tool.
 *
 * The tool's tensors (q, k, v, o, lse, ..., see docs/design.md "Tensor names")
 * travel as .npy files.  The reader takes format versions 1.0, 2.0 and 3.0
 * and the dtypes '<f2', '<f4', '<f8' (converted to float32), '<i4' (kept
 * as int32, for cu_seqlens) and '|u1' (widened to int32: an f8 KV cache's
 * codes).  It validates every byte it relies on: a file
 * that is malformed, truncated, longer than its header says, or beyond the
 * limits below is an error with a one-line message, never a crash or a
 * silently different array.
 *
 * What the reader accepts, exactly:
 *  - byte order '<'; also '=' and '|', which numpy reads as "native" and
 *    which are little-endian on every host attnjit runs on.  '>' is refused.
 *  - a header that is the dict numpy writes: keys 'descr', 'fortran_order'
 *    and 'shape', each once, in any order, nothing else; strings in ' or "
 *    without escapes; spaces (only) between tokens; an optional trailing
 *    comma; then spaces and a final '\n'.
 *  - fortran_order False only: attnjit never transposes behind your back.
 *  - a file holding exactly the data the header promises, as numpy writes
 *    it: fewer bytes is "truncated data", more is "trailing data".
 *
 * Limits: rank 0..NPY_MAX_RANK; header at most NPY_MAX_HEADER_BYTES (numpy's
 * own default refusal); the data, as stored and as float32/int32 in memory,
 * at most NPY_MAX_DATA_BYTES, which also bounds every nonzero dimension.
 */
#ifndef AJ_TOOLS_NPY_H
#define AJ_TOOLS_NPY_H

#include <stddef.h>
#include <stdint.h>

#define NPY_MAX_RANK 8
#define NPY_MAX_HEADER_BYTES 10000
#define NPY_MAX_DATA_BYTES ((uint64_t)16 << 30) /* 16 GiB */

typedef enum npy_status {
    NPY_OK = 0,
    NPY_ERR_IO = 1,            /* the file could not be opened, read or written */
    NPY_ERR_FORMAT = 2,        /* not a well-formed .npy file, or truncated */
    NPY_ERR_UNSUPPORTED = 3,   /* a valid .npy this reader refuses: dtype, order, size */
    NPY_ERR_OUT_OF_MEMORY = 4,
    NPY_ERR_INVALID_ARG = 5,   /* caller's mistake: NULL, bad rank, negative dim */
} npy_status;

/*
 * An array as read.  Exactly one of f32 and i32 is non-NULL after a
 * successful read (also for zero elements); both are owned by the array and
 * freed by npy_free().  count is the product of shape[0..rank), 1 for rank 0.
 */
typedef struct npy_array {
    int rank;
    int64_t shape[NPY_MAX_RANK];
    char dtype[4];  /* the stored dtype without its byte order: "f2", "f4", "f8", "i4", "u1" */
    float *f32;     /* the data as float32 (from f2, f4, f8); NULL for int arrays */
    int32_t *i32;   /* the data of an i4 or u1 array; NULL for float arrays */
    size_t count;
} npy_array;

/*
 * The readers.  On success fill *out and return NPY_OK; on failure leave
 * *out zeroed and write one line into err (truncated to errcap; err may be
 * NULL), starting with the path or name:
 *     "q.npy: truncated data: header promises 4096 bytes, file has 100"
 * npy_read_f32 takes f2, f4 and f8 (f2 widens exactly; f8 rounds to
 * nearest, and a finite f8 value beyond float32's range is an error rather
 * than an infinity).  npy_read_i32 takes i4 and u1.  Each names the dtype it
 * found when it refuses one.
 */
npy_status npy_read_f32(const char *path, npy_array *out, char *err, size_t errcap);
npy_status npy_read_i32(const char *path, npy_array *out, char *err, size_t errcap);

/* The same from a file image in memory; name (NULL: "<memory>") prefixes
 * messages.  The bytes are not kept.  For tests and fuzzing. */
npy_status npy_read_f32_mem(const void *data, size_t len, const char *name, npy_array *out,
                            char *err, size_t errcap);
npy_status npy_read_i32_mem(const void *data, size_t len, const char *name, npy_array *out,
                            char *err, size_t errcap);

/*
 * The writers: a C-order array of shape[0..rank) as .npy version 1.0,
 * '<f4' or '<i4', with the header numpy itself would write (padded so the
 * data starts at a multiple of 64 bytes).  shape may be NULL for rank 0;
 * data may be NULL when an element count is 0.  The file at path is
 * replaced in place; a failed write (unwritable path, full disk) returns
 * NPY_ERR_IO with the path and the system's reason, and may leave a partial
 * file behind, which the reader rejects as truncated.
 */
npy_status npy_write_f32(const char *path, const float *data, int rank, const int64_t *shape,
                         char *err, size_t errcap);
npy_status npy_write_i32(const char *path, const int32_t *data, int rank, const int64_t *shape,
                         char *err, size_t errcap);

/* Frees an array's data and zeroes it; safe on a zeroed or freed array. */
void npy_free(npy_array *a);

#endif /* AJ_TOOLS_NPY_H */
