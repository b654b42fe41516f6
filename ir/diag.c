/*
 * diag.c -- status names, the context, error text, logging and the clock.
 *
 * The context is the only place error text lives: a failing call formats
 * its message into ctx->error with aj_fail(), and aj_last_error() hands the
 * same buffer back.  There is no global error state, so two threads with two
 * contexts never see each other's messages.
 */
#include "ir/diag.h"

#include <assert.h>
#include <stdio.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* ---------------------------------------------------------------- status */

/* Every status, in enum order; the names are the enumerators' own. */
#define AJ_STATUS_LIST(X)    \
    X(AJ_OK)                 \
    X(AJ_ERR_INVALID_ARG)    \
    X(AJ_ERR_PARSE)          \
    X(AJ_ERR_VERIFY)         \
    X(AJ_ERR_UNSUPPORTED)    \
    X(AJ_ERR_CODEGEN)        \
    X(AJ_ERR_NO_DEVICE)      \
    X(AJ_ERR_IO)             \
    X(AJ_ERR_OUT_OF_MEMORY)  \
    X(AJ_ERR_INTERNAL)       \
    X(AJ_ERR_KERNEL_FAULT)   \
    X(AJ_ERR_COMM)

#define AJ_STATUS_NAME(s) [s] = #s,
static const char *const status_names[] = { AJ_STATUS_LIST(AJ_STATUS_NAME) };
#undef AJ_STATUS_NAME

static_assert(sizeof status_names / sizeof status_names[0] == AJ_STATUS_COUNT,
              "AJ_STATUS_LIST must name every aj_status");

const char *aj_status_str(aj_status status)
{
    if ((int)status < 0 || (int)status >= AJ_STATUS_COUNT)
        return "AJ_STATUS_UNKNOWN";
    return status_names[status];
}

/* ---------------------------------------------------------------- context */

aj_status aj_ctx_create(const aj_ctx_config *config, aj_ctx **out)
{
    static const aj_ctx_config defaults = AJ_CTX_CONFIG_INIT;
    aj_ctx *ctx;

    /* No context exists yet, so these messages cannot be recorded; the
     * status alone tells the caller which rule failed. */
    if (!out)
        return aj_fail(NULL, AJ_ERR_INVALID_ARG, "aj_ctx_create: out is NULL");
    /* The first version of the struct ended with log_level; the fields a
     * caller's version lacks get their defaults. */
    aj_ctx_config cfg = defaults;
    if (config) {
        aj_status st = AJ_READ_STRUCT(NULL, "aj_ctx_create: config", config, aj_ctx_config,
                                      log_level, AJ_CTX_CONFIG_INIT, &cfg);
        if (st != AJ_OK)
            return st;
    }
    config = &cfg;
    if ((int)config->log_level < AJ_LOG_ERROR || (int)config->log_level > AJ_LOG_DEBUG)
        return aj_fail(NULL, AJ_ERR_INVALID_ARG,
                       "aj_ctx_create: config->log_level %d is out of range",
                       (int)config->log_level);

    ctx = calloc(1, sizeof *ctx);
    if (!ctx)
        return AJ_ERR_OUT_OF_MEMORY;
    ctx->config = cfg;
    if ((unsigned)ctx->config.cache_mode >= AJ_CACHE_MODE_COUNT) {
        free(ctx);
        return aj_fail(NULL, AJ_ERR_INVALID_ARG, "aj_ctx_create: config->cache_mode %d is "
                       "out of range", (int)config->cache_mode);
    }
    if (ctx->config.cache_dir) {
        ctx->cache_dir_copy = strdup(ctx->config.cache_dir);
        if (!ctx->cache_dir_copy) {
            free(ctx);
            return AJ_ERR_OUT_OF_MEMORY;
        }
        ctx->config.cache_dir = ctx->cache_dir_copy;
    }
    *out = ctx;
    return AJ_OK;
}

void aj_ctx_destroy(aj_ctx *ctx)
{
    if (!ctx)
        return;
    if (ctx->cache && ctx->cache_free)
        ctx->cache_free(ctx->cache);
    free(ctx->cache_dir_copy);
    free(ctx);
}

const char *aj_last_error(const aj_ctx *ctx)
{
    return ctx ? ctx->error : "";
}

/* ---------------------------------------------------------------- errors */

aj_status aj_fail(aj_ctx *ctx, aj_status status, const char *fmt, ...)
{
    va_list ap;

    va_start(ap, fmt);
    aj_failv(ctx, status, fmt, ap);
    va_end(ap);
    return status;
}

aj_status aj_failv(aj_ctx *ctx, aj_status status, const char *fmt, va_list ap)
{
    /* Format into a scratch buffer first: an argument may point into
     * ctx->error itself (re-recording an earlier message). */
    char text[AJ_ERROR_TEXT_MAX];

    if (!ctx)
        return status;
    vsnprintf(text, sizeof text, fmt, ap);
    memcpy(ctx->error, text, sizeof text);
    return status;
}

void aj_log(aj_ctx *ctx, aj_log_level level, const char *fmt, ...)
{
    char text[AJ_ERROR_TEXT_MAX];
    va_list ap;

    if (!ctx || !ctx->config.log_fn || level > ctx->config.log_level)
        return;
    va_start(ap, fmt);
    vsnprintf(text, sizeof text, fmt, ap);
    va_end(ap);
    ctx->config.log_fn(ctx->config.log_user, level, text);
}

/* ---------------------------------------------------------------- versioned structs */

aj_status aj_read_struct(aj_ctx *ctx, const char *what, const void *in, size_t min_size,
                         const void *defaults, size_t size, void *out, const char *init)
{
    AJ_CHECK_ARG(ctx, in, "%s is NULL", what);
    size_t given;
    memcpy(&given, in, sizeof given);
    AJ_CHECK_ARG(ctx, given >= min_size,
                 "%s->struct_size = %zu is smaller than any version of the struct (at least "
                 "%zu); start from %s", what, given, min_size, init);
    const unsigned char *bytes = in;
    for (size_t i = size; i < given; i++)
        AJ_CHECK_ARG(ctx, bytes[i] == 0,
                     "%s->struct_size = %zu: a newer struct than this attnjit's (%zu bytes) "
                     "with a field it does not know set (byte %zu)", what, given, size, i);
    memcpy(out, defaults, size);
    memcpy(out, in, given < size ? given : size);
    memcpy(out, &size, sizeof size);
    return AJ_OK;
}

/* ---------------------------------------------------------------- misc */

void aj_free(void *ptr)
{
    free(ptr);
}

#define AJ_STR_(x) #x
#define AJ_STR(x) AJ_STR_(x)

const char *aj_version_string(void)
{
    return AJ_STR(AJ_VERSION_MAJOR) "." AJ_STR(AJ_VERSION_MINOR) "."
           AJ_STR(AJ_VERSION_PATCH);
}

double aj_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}
