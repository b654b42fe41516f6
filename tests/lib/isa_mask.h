/*
 * isa_mask.h -- whether an AJ_CPU_ISA level (docs/cpu.md) changes what the
 * cpu JIT compiles for on this host: it masks features only where the
 * host has them (the avx2 and avx512 levels mask nothing on a host without
 * AVX-512).  The one test of it, for tests/lib/isa_gate.c and the tests
 * that expect a masked level to differ (test_host_cache).
 *
 * Header-only; links the static library (codegen/codegen.h's aj_host_cpu).
 */
#ifndef AJ_TESTS_ISA_MASK_H
#define AJ_TESTS_ISA_MASK_H

#include <stdlib.h>
#include <string.h>

#include <llvm-c/Core.h>

#include "codegen/codegen.h"

/* The features aj_host_cpu compiles for with AJ_CPU_ISA = isa (NULL:
 * unset), malloc'd; NULL for a level it does not know. */
static inline char *isa_mask_features(const char *isa)
{
    if (isa)
        setenv("AJ_CPU_ISA", isa, 1);
    else
        unsetenv("AJ_CPU_ISA");
    char *name = NULL, *features = NULL;
    if (aj_host_cpu(NULL, &name, &features) != AJ_OK)
        return NULL;
    LLVMDisposeMessage(name);
    return features;
}

/* 1 where AJ_CPU_ISA = isa masks a feature of this host, 0 where it masks
 * none, -1 for a level aj_host_cpu does not know; AJ_CPU_ISA is as it was
 * on return. */
static inline int isa_mask_changes(const char *isa)
{
    const char *was = getenv("AJ_CPU_ISA");
    char *saved = was ? strdup(was) : NULL;
    char *native = isa_mask_features(NULL), *masked = isa_mask_features(isa);
    int changes = native && masked ? strcmp(native, masked) != 0 : -1;
    free(native);
    free(masked);
    if (saved)
        setenv("AJ_CPU_ISA", saved, 1);
    else
        unsetenv("AJ_CPU_ISA");
    free(saved);
    return changes;
}

#endif /* AJ_TESTS_ISA_MASK_H */
