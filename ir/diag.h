/*
 * diag.h -- the context, error text, logging and clock shared by every layer.
 *
 * A failing call records its status and a message on the context with
 * aj_fail(); the public aj_last_error() reads it back.  AJ_TRY propagates a
 * status to a function's single cleanup label (see STYLE.md).
 */
#ifndef AJ_IR_DIAG_H
#define AJ_IR_DIAG_H

#include <stdarg.h>
#include <stddef.h>

#include "attnjit/attnjit.h"

#define AJ_ERROR_TEXT_MAX 1024

struct aj_kernel_cache;

struct aj_ctx {
    aj_ctx_config config;      /* config.cache_dir points to cache_dir_copy */
    char *cache_dir_copy;
    char error[AJ_ERROR_TEXT_MAX];
    /* the runtime's kernel cache, made on first use; freed through the
     * function it leaves here (this layer knows nothing of it); atomic, as
     * threads sharing the context may make it at once */
    struct aj_kernel_cache *_Atomic cache;
    void (*cache_free)(struct aj_kernel_cache *cache);
};

#if defined(__GNUC__)
#define AJ_PRINTF(fmt, args) __attribute__((format(printf, fmt, args)))
#else
#define AJ_PRINTF(fmt, args)
#endif

/* Records `status` with a printf-style message on ctx (ctx may be NULL) and
 * returns status, so `return aj_fail(ctx, AJ_ERR_..., "...")` reads well. */
aj_status aj_fail(aj_ctx *ctx, aj_status status, const char *fmt, ...)
    AJ_PRINTF(3, 4);
aj_status aj_failv(aj_ctx *ctx, aj_status status, const char *fmt,
                   va_list ap);

/* Sends a message to the context's log callback, if any, at `level`. */
void aj_log(aj_ctx *ctx, aj_log_level level, const char *fmt, ...)
    AJ_PRINTF(3, 4);

/* The number of elements of array `a`. */
#define AJ_COUNT_OF(a) (sizeof(a) / sizeof((a)[0]))

/* Evaluates a status expression; on failure stores it in `st` and jumps to
 * the function's `done` label.  The enclosing function declares
 * `aj_status st = AJ_OK;` and ends with `done: ...; return st;`. */
#define AJ_TRY(expr)                  \
    do {                              \
        st = (expr);                  \
        if (st != AJ_OK) goto done;   \
    } while (0)

/* Fails with AJ_ERR_INVALID_ARG naming a NULL argument. */
#define AJ_CHECK_ARG(ctx, cond, ...)                                  \
    do {                                                              \
        if (!(cond))                                                  \
            return aj_fail((ctx), AJ_ERR_INVALID_ARG, __VA_ARGS__);   \
    } while (0)

/*
 * Versioned argument structs: the one rule for every public struct that
 * starts with `size_t struct_size` (attnjit.h, "Versioned structs").  A
 * caller built against an older header passes a smaller struct; one built
 * against a newer header a larger one.  aj_read_struct accepts
 *   min_size <= struct_size <= size      (min_size: the end of the struct's
 *                                         required fields)
 *   struct_size > size                   if every byte past `size` is 0
 *                                         (fields this attnjit does not know,
 *                                         left at their defaults)
 * and copies the bytes both sides know over `defaults` into `out` (`size`
 * bytes), whose struct_size it sets to `size`.  Anything else fails with
 * AJ_ERR_INVALID_ARG naming `what` ("aj_forward: args") and `init`. */
aj_status aj_read_struct(aj_ctx *ctx, const char *what, const void *in, size_t min_size,
                         const void *defaults, size_t size, void *out, const char *init);

/* The end of field `field` of struct `type`: a first version's size. */
#define AJ_STRUCT_END(type, field) (offsetof(type, field) + sizeof(((type *)0)->field))

/* aj_read_struct for struct `type` whose required fields end with field
 * `last_required`, with the defaults of initializer macro `init`. */
#define AJ_READ_STRUCT(ctx, what, in, type, last_required, init, out)                        \
    aj_read_struct((ctx), (what), (in), AJ_STRUCT_END(type, last_required), &(type)init,     \
                   sizeof(type), (out), #init)

/* In a public entry point: reads the caller's struct `given` into a local
 * copy and declares `const type *name` pointing at it; returns the
 * failure from the enclosing function. */
#define AJ_READ_STRUCT_OR_RETURN(ctx, what, given, type, last_required, init, name)           \
    type name##_read_;                                                                      \
    do {                                                                                    \
        aj_status read_st_ = aj_read_struct((ctx), (what), (given),                          \
                                            AJ_STRUCT_END(type, last_required), &(type)init, \
                                            sizeof(type), &name##_read_, #init);             \
        if (read_st_ != AJ_OK)                                                              \
            return read_st_;                                                                \
    } while (0);                                                                            \
    const type *name = &name##_read_

/* Seconds on a monotonic clock (timings, timeouts, compile statistics). */
double aj_now(void);

#endif /* AJ_IR_DIAG_H */
