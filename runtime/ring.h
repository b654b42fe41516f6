/*
 * ring.h -- the ring scheduler's internals shared with shard.c.
 */
#ifndef AJ_RUNTIME_RING_H
#define AJ_RUNTIME_RING_H

#include <stdint.h>

#include "attnjit/attnjit.h"

/* Rank `rank`'s chunks of a `seq`-long sequence (1 contiguous, 2 zigzag);
 * AJ_ERR_INVALID_ARG, naming `fn`, if seq does not split evenly. */
aj_status aj_shard_chunks(aj_ctx *ctx, const char *fn, aj_shard_layout layout, int rank,
                          int size, int64_t seq, aj_shard_chunk chunks[2], int *num_chunks);

#endif /* AJ_RUNTIME_RING_H */
