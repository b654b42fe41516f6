/*
 * tune.h -- the tuning database, as aj_compile reads it (see tune.c).
 */
#ifndef AJ_RUNTIME_TUNE_H
#define AJ_RUNTIME_TUNE_H

#include "attnjit/attnjit.h"
#include "ir/diag.h"

typedef struct aj_tune_entry {
    aj_schedule schedule;
    int32_t workers;
    double median_ms;
    int32_t warpgroups, producer;   /* the wgmma kernel's; 0: none */
} aj_tune_entry;

/* The recorded best of op on dev: AJ_OK, or AJ_ERR_IO (no database, no
 * entry, or a damaged one, which is also logged) with a message. */
aj_status aj_tune_db_lookup(aj_ctx *ctx, const aj_device *dev, const aj_op *op,
                            aj_tune_entry *out);

#endif /* AJ_RUNTIME_TUNE_H */
