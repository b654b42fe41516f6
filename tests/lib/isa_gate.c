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
#include <unistd.h>

#include "isa_mask.h"

int main(int argc, char **argv)
{
    if (argc < 3) {
        fprintf(stderr, "usage: isa_gate ISA COMMAND [ARGS...]\n");
        return 2;
    }
    int changes = isa_mask_changes(argv[1]);
    if (changes < 0) {
        fprintf(stderr, "isa_gate: AJ_CPU_ISA = '%s': expected native, avx512 or avx2\n",
                argv[1]);
        return 2;
    }
    if (!changes) {
        printf("SKIP %s with AJ_CPU_ISA=%s: this host has none of the CPUID features that "
               "level masks, so its code is the native run's, which the unmasked test runs\n",
               argv[2], argv[1]);
        return 77;
    }
    setenv("AJ_CPU_ISA", argv[1], 1);
    execvp(argv[2], argv + 2);
    perror("isa_gate: exec");
    return 2;
}
