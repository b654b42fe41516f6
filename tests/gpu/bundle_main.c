/*
 * bundle_main.c -- attnjit-gpu, the GPU bundle's one binary: the GPU
 * checks as subcommands (bundle.h).  build-gpu/run.sh runs each in a
 * process of its own.
 *
 *   attnjit-gpu check [gpu_check's options]   forward correctness, speed, start-up
 *   attnjit-gpu backward cuda                  the backward kernels against the reference
 *   attnjit-gpu flash-bwd cuda                 the flash backward against the reference
 *   attnjit-gpu ring [--out FILE]              a 1-rank NCCL ring against aj_forward
 *
 * Exit status: the subcommand's (77: no usable GPU), 2 for a bad command.
 */
#include <stdio.h>
#include <string.h>

#include "bundle.h"

static const struct {
    const char *name;
    int (*run)(int argc, char **argv);
} commands[] = {
    {"check", gpu_check_main},
    {"backward", gpu_backward_main},
    {"flash-bwd", gpu_flash_bwd_main},
    {"ring", gpu_ring_main},
};

int main(int argc, char **argv)
{
    for (size_t i = 0; argc > 1 && i < sizeof commands / sizeof commands[0]; i++)
        if (strcmp(argv[1], commands[i].name) == 0)
            return commands[i].run(argc - 1, argv + 1);
    fprintf(stderr, "usage: attnjit-gpu check|backward|flash-bwd|ring [options]\n");
    return 2;
}
