/*
 * cache.h -- the kernel cache (see cache.c for the design).
 */
#ifndef AJ_RUNTIME_CACHE_H
#define AJ_RUNTIME_CACHE_H

#include "codegen/codegen.h"

typedef struct aj_kernel_cache aj_kernel_cache;

/* The context's cache, made on first use; NULL with AJ_CACHE_OFF (or when
 * out of memory: then nothing is cached). */
aj_kernel_cache *aj_cache_of(aj_ctx *ctx);

/* A new reference to the kernel cached under `key`, from memory, else (if
 * use_disk) from disk; NULL on a miss.  Thread-safe. */
aj_kernel *aj_cache_lookup(aj_ctx *ctx, aj_kernel_cache *c, const char *key, int use_disk);

/* Keeps a reference in memory and, if use_disk, writes the disk entry. */
void aj_cache_store(aj_ctx *ctx, aj_kernel_cache *c, const char *key, aj_kernel *k,
                    int use_disk);

/* What a cache entry holds.  Each kind has its own key prefix and file
 * suffix (cache.c's entry_kinds); a kernel is an aj_kernel (memory and
 * disk), a cubin the driver linker's output for one PTX (disk only). */
typedef enum aj_cache_kind {
    AJ_CACHE_KERNEL = 0,
    AJ_CACHE_CUBIN = 1,
    AJ_CACHE_KIND_COUNT
} aj_cache_kind;

/* The key of an entry of `kind`: the kind, `fields` (what decides the
 * content: op hash, target, options; PTX hash, compute capability, driver
 * version) and the versions of what produces it.  The one place keys are
 * made. */
void aj_cache_key(aj_cache_kind kind, const char *fields, char *out, size_t cap);

/* Raw entries on disk: the bytes stored under `key` (malloc'd, the caller
 * frees), or NULL on a miss or without a disk cache; a damaged entry is
 * removed and counted.  Thread-safe. */
uint8_t *aj_cache_blob_lookup(aj_ctx *ctx, aj_kernel_cache *c, aj_cache_kind kind,
                              const char *key, size_t *len);
void aj_cache_blob_store(aj_ctx *ctx, aj_kernel_cache *c, aj_cache_kind kind,
                         const char *key, const void *data, size_t len);

/* The disk cache's directory, or NULL when the cache is in memory only. */
const char *aj_cache_disk_dir(const aj_kernel_cache *c);

#endif /* AJ_RUNTIME_CACHE_H */
