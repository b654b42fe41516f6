/*
 * cpu.c -- the `cpu` target: native kernels for this machine's cores.
 *
 * The pipeline treats cpu like sim (host target machine from
 * LLVMGetHostCPUName / LLVMGetHostCPUFeatures, <entry>.entry wrapper,
 * LLJIT), except that the kernel's hidden argument is its work item and
 * the IR pipeline is default<O3>.  What is cpu's own lives here: the
 * vector width the templates size their registers by, and the few C
 * library functions the JIT-compiled code may call.
 */
#include <math.h>
#include <string.h>

#include <llvm-c/TargetMachine.h>

#include "codegen/codegen.h"

/* Whether LLVM's feature string ("+sse2,-avx512f,+avx,...") enables f. */
static int has_feature(const char *features, const char *f)
{
    size_t n = strlen(f);
    for (const char *p = features; p && *p;) {
        const char *end = strchr(p, ',');
        size_t len = end ? (size_t)(end - p) : strlen(p);
        if (len == n + 1 && p[0] == '+' && memcmp(p + 1, f, n) == 0)
            return 1;
        p = end ? end + 1 : NULL;
    }
    return 0;
}

int aj_cpu_vector_width(void)
{
    char *features = LLVMGetHostCPUFeatures();
    int width = has_feature(features, "avx512f") ? 16 : has_feature(features, "avx") ? 8 : 4;
    LLVMDisposeMessage(features);
    return width;
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
