/*
 * cpu.c -- the `cpu` target: native kernels for this machine's cores.
 *
 * The pipeline treats cpu like sim (host target machine, <entry>.entry
 * wrapper, object code loaded into an LLJIT), except that the kernel's
 * hidden argument is its work item.  What is cpu's own lives here: the
 * host's CPU as attnjit compiles for it (LLVM's name and features, less
 * what AJ_CPU_ISA masks), the vector width the templates size their
 * registers by, and the few C library functions the JIT-compiled code may
 * call.
 */
#include <stdio.h>
#include <stdlib.h>
#include <math.h>
#include <string.h>

#include <llvm-c/TargetMachine.h>

#include "codegen/codegen.h"

#define XXH_INLINE_ALL
#include <xxhash.h>

/*
 * AJ_CPU_ISA levels: the LLVM feature prefixes each one turns off, so that
 * the paths for older hosts can be run (and tested) on a newer one.  A
 * prefix covers every feature that implies the one it names (LLVM re-enables
 * a disabled feature when a later "+x" implies it).
 */
static const struct isa_level {
    const char *name;
    const char *masked[6];
} isa_levels[] = {
    {"native", {NULL}},
    {"avx512", {"avx512bf16", "avx512fp16", "amx-", "avx10", NULL}},
    {"avx2", {"avx512", "amx-", "avx10", "evex512", NULL}},
};

static const struct isa_level *isa_level(void)
{
    const char *env = getenv("AJ_CPU_ISA");
    if (!env || !*env)
        return &isa_levels[0];
    for (size_t i = 0; i < sizeof isa_levels / sizeof isa_levels[0]; i++)
        if (strcmp(env, isa_levels[i].name) == 0)
            return &isa_levels[i];
    return NULL;
}

aj_status aj_host_cpu(aj_ctx *ctx, char **name, char **features)
{
    const struct isa_level *level = isa_level();
    *name = *features = NULL;
    if (!level)
        return aj_fail(ctx, AJ_ERR_INVALID_ARG, "AJ_CPU_ISA = '%s': expected native, avx512 "
                       "or avx2", getenv("AJ_CPU_ISA"));
    char *host = LLVMGetHostCPUFeatures();
    char *out = strdup(host ? host : "");
    LLVMDisposeMessage(host);
    if (!out)
        return aj_fail(ctx, AJ_ERR_OUT_OF_MEMORY, "out of memory");
    /* "+sse2,+avx512f,..." -> "-avx512f" for the masked ones, in place */
    for (char *p = out; *p;) {
        char *end = strchr(p, ',');
        for (int i = 0; level->masked[i] && *p == '+'; i++)
            if (strncmp(p + 1, level->masked[i], strlen(level->masked[i])) == 0)
                *p = '-';
        p = end ? end + 1 : p + strlen(p);
    }
    *features = out;
    *name = LLVMGetHostCPUName();
    return AJ_OK;
}

void aj_host_cpu_id(char *out, size_t cap)
{
    char *name = NULL, *features = NULL;
    if (aj_host_cpu(NULL, &name, &features) != AJ_OK) {
        snprintf(out, cap, "cpu ?");
        return;
    }
    snprintf(out, cap, "cpu %s %016llx", name,
             (unsigned long long)XXH3_64bits(features, strlen(features)));
    LLVMDisposeMessage(name);
    free(features);
}

int aj_cpu_has_feature(const char *f)
{
    char *name = NULL, *features = NULL;
    if (aj_host_cpu(NULL, &name, &features) != AJ_OK)
        return 0;
    size_t n = strlen(f);
    int found = 0;
    for (const char *p = features; *p && !found;) {
        const char *end = strchr(p, ',');
        size_t len = end ? (size_t)(end - p) : strlen(p);
        found = len == n + 1 && p[0] == '+' && memcmp(p + 1, f, n) == 0;
        p = end ? end + 1 : p + len;
    }
    LLVMDisposeMessage(name);
    free(features);
    return found;
}

int aj_cpu_vector_width(void)
{
    return aj_cpu_has_feature("avx512f") ? 16 : aj_cpu_has_feature("avx") ? 8 : 4;
}

/* Wrappers with plain C types, so the table holds function pointers. */
static float cpu_exp2f(float x) { return exp2f(x); }
static float cpu_log2f(float x) { return log2f(x); }
static float cpu_rintf(float x) { return rintf(x); }
static float cpu_floorf(float x) { return floorf(x); }
static float cpu_fmaf(float a, float b, float c) { return fmaf(a, b, c); }
static float cpu_fmaxf(float a, float b) { return fmaxf(a, b); }
static float cpu_fminf(float a, float b) { return fminf(a, b); }

const aj_host_symbol *aj_cpu_symbols(size_t *count)
{
    static const aj_host_symbol symbols[] = {
        {"exp2f", (void *)cpu_exp2f},   {"log2f", (void *)cpu_log2f},
        {"rintf", (void *)cpu_rintf},   {"floorf", (void *)cpu_floorf},
        {"fmaf", (void *)cpu_fmaf},     {"fmaxf", (void *)cpu_fmaxf},
        {"fminf", (void *)cpu_fminf},
    };
    *count = sizeof symbols / sizeof symbols[0];
    return symbols;
}
