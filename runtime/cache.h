/*
 * cache.h -- the kernel cache (see cache.c for the design).
 */
#ifndef AJ_RUNTIME_CACHE_H
#define AJ_RUNTIME_CACHE_H

#include "codegen/codegen.h"

typedef struct aj_kernel_cache aj_kernel_cache;

#define AJ_CACHE_KEY_MAX 512

/* The cache key of a compile of the op whose canonical hash is op_hash
 * (options resolved: no AJ_EMIT_AUTO), and whether its entry may go to
 * disk.  The one place a key is derived (see cache.c). */
void aj_cache_key(const char *op_hash, const aj_compile_options *opt, char *key, size_t cap,
                  int *use_disk);

/* The context's cache, made on first use; NULL with AJ_CACHE_OFF (or when
 * out of memory: then nothing is cached). */
aj_kernel_cache *aj_cache_of(aj_ctx *ctx);

/* A new reference to the kernel cached under `key`, from memory, else (if
 * use_disk) from disk; NULL on a miss.  Thread-safe. */
aj_kernel *aj_cache_lookup(aj_ctx *ctx, aj_kernel_cache *c, const char *key, int use_disk);

/* Keeps a reference in memory and, if use_disk, writes the disk entry. */
void aj_cache_store(aj_ctx *ctx, aj_kernel_cache *c, const char *key, aj_kernel *k,
                    int use_disk);

/* The disk cache's directory, or NULL when the cache is in memory only. */
const char *aj_cache_disk_dir(const aj_kernel_cache *c);

#endif /* AJ_RUNTIME_CACHE_H */
