/*
 * isa_gate.c -- runs a cpu test on an older host's paths (AJ_CPU_ISA,
 * docs/cpu.md) where that changes the code:
 *
 *   isa_gate ISA COMMAND [ARGS...]
 *
 * With AJ_CPU_ISA=ISA the JIT compiles for this host's CPUID features less
 * those the level masks.  Where this host has none of them (the avx512 and
 * avx2 levels on a host without AVX-512) the code is the native run's,
 * which the unmasked test runs: the gate says so and exits 77, which ctest
 * counts as skipped (SKIP_RETURN_CODE), not passed.  Else it runs COMMAND
 * with AJ_CPU_ISA=ISA.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <llvm-c/Core.h>

#include "codegen/codegen.h"

/* The features aj_host_cpu compiles for with AJ_CPU_ISA = isa (NULL:
 * unset); NULL after an error, printed. */
static char *features_for(const char *isa)
{
    if (isa)
        setenv("AJ_CPU_ISA", isa, 1);
    else
        unsetenv("AJ_CPU_ISA");
    char *name = NULL, *features = NULL;
    if (aj_host_cpu(NULL, &name, &features) != AJ_OK) {
        fprintf(stderr, "isa_gate: AJ_CPU_ISA = '%s': expected native, avx512 or avx2\n",
                isa ? isa : "");
        return NULL;
    }
    LLVMDisposeMessage(name);
    return features;
}

int main(int argc, char **argv)
{
    if (argc < 3) {
        fprintf(stderr, "usage: isa_gate ISA COMMAND [ARGS...]\n");
        return 2;
    }
    char *native = features_for(NULL), *masked = features_for(argv[1]);
    if (!native || !masked)
        return 2;
    int same = strcmp(native, masked) == 0;
    free(native);
    free(masked);
    if (same) {
        printf("SKIP %s with AJ_CPU_ISA=%s: this host has none of the CPUID features that "
               "level masks, so its code is the native run's, which the unmasked test runs\n",
               argv[2], argv[1]);
        return 77;
    }
    execvp(argv[2], argv + 2);
    perror("isa_gate: exec");
    return 2;
}
