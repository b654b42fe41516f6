/*
 * cache.h -- the kernel cache (see cache.c for the design).
 */
#ifndef AJ_RUNTIME_CACHE_H
#define AJ_RUNTIME_CACHE_H

#include "codegen/codegen.h"

typedef struct aj_kernel_cache aj_kernel_cache;

#define AJ_CACHE_KEY_MAX 512

/* The context's cache, made on first use; NULL with AJ_CACHE_OFF (or when
 * out of memory: then nothing is cached). */
aj_kernel_cache *aj_cache_of(aj_ctx *ctx);

/* What a cache entry holds (aj_cache_kind, codegen/target.h): a row of
 * cache.c's entry_kinds (its key prefix, what its content depends on,
 * its file suffix); every kind goes to disk where the cache has a
 * directory.  PTX, cpu and sim kernels are
 * aj_kernels; a cubin is the driver linker's output for one PTX (disk
 * only). */

/* The kind of entry a compile for `target` makes (its target row's). */
aj_cache_kind aj_cache_kind_of(aj_target target);

/* The key of an entry of `kind`: the kind, `fields` (what decides the
 * content: op hash, target, options; PTX hash, compute capability, driver
 * version), what the kind's content depends on (the host CPU for host
 * code, and the emulator for sim's) and the versions of what produces it.
 * The one place keys are made. */
void aj_cache_key(aj_cache_kind kind, const char *fields, char *out, size_t cap);

/* A new reference to the kernel cached under `key`, from memory, else
 * (with a cache directory) from disk.  On a miss, NULL with *claimed = 1:
 * the caller now owns the key's compile and must end the claim with
 * aj_cache_end_claim (after aj_cache_store, or on failure); a thread that
 * looks up a claimed key waits until the claim ends, then looks again, so
 * an op compiled by many threads at once is compiled once.  (*claimed = 0
 * on a miss only when memory for the claim ran out.)  Thread-safe. */
aj_kernel *aj_cache_lookup_or_claim(aj_ctx *ctx, aj_kernel_cache *c, aj_cache_kind kind,
                                    const char *key, int *claimed);
void aj_cache_end_claim(aj_kernel_cache *c, const char *key);

/* Keeps a reference in memory and, with a cache directory, writes the
 * disk entry. */
void aj_cache_store(aj_ctx *ctx, aj_kernel_cache *c, aj_cache_kind kind, const char *key,
                    aj_kernel *k);

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
