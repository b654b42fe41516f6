/*
 * fuzz_cli.c -- libFuzzer target: the CLI's argument parsing for compile
 * and run.  The input is split at NUL bytes into argv; parsing must accept
 * or refuse (usage, exit 1) without crashing.  Nothing is executed, so no
 * file is read or written.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "tools/cli.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define MAX_ARGS 64

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static aj_ctx *ctx;
    if (!ctx && aj_ctx_create(NULL, &ctx) != AJ_OK)
        abort();
    if (size < 2 || size > 4096)
        return 0;
    /* the first byte picks the command; the rest, split at NULs, is argv */
    size_t n = size - 1;
    char *buf = malloc(n + 1);
    memcpy(buf, data + 1, n);
    buf[n] = '\0';
    char *argv[MAX_ARGS + 1];
    int argc = 0;
    for (char *p = buf; p < buf + n && argc < MAX_ARGS; p += strlen(p) + 1)
        argv[argc++] = p;
    argv[argc] = NULL;
    if (data[0] & 1) {
        cli_compile_opts o;
        int rc = cli_parse_compile_args(ctx, argc, argv, &o);
        if (rc != 0 && rc != 1)
            abort();
        if (rc == 0 && (!o.spec || o.options.target == AJ_TARGET_ANY))
            abort();
    } else {
        cli_run_opts o;
        int rc = cli_parse_run_args(argc, argv, &o);
        if (rc != 0 && rc != 1)
            abort();
        if (rc == 0 && (!o.spec || o.device == AJ_DEVICE_KIND_COUNT))
            abort();
    }
    free(buf);
    return 0;
}
