/*
 * kb_one_block.h -- the launch shape of the tests' hand-built kernels
 * (written with codegen/kbuilder.h): one block, grid 1 x 1 x 1.
 * Header-only.
 */
#ifndef AJ_TESTS_KB_ONE_BLOCK_H
#define AJ_TESTS_KB_ONE_BLOCK_H

#include <string.h>

#include "codegen/kbuilder.h"

/* Ends the kernel kb is building with a one-block launch shape. */
static inline void kb_finish_one_block(aj_kb *kb)
{
    aj_kernel_layout layout;
    memset(&layout, 0, sizeof layout);
    for (int d = 0; d < 3; d++)
        layout.grid[d] = (aj_grid_dim){AJ_EXTENT_ONE, 1};
    aj_kb_finish(kb, &layout);
}

#endif /* AJ_TESTS_KB_ONE_BLOCK_H */
