/*
 * wgmma_shapes.h -- the N of wgmma.mma_async m64nNk16 (.f16 / .bf16 into
 * .f32) that codegen/intrinsics.def has rows for and the emulator
 * (runtime/sim/wgmma.c) has entries for: every N the PTX ISA allows for
 * these types, 8 to 256 in steps of 8.  X(N) once per N; the file holds
 * macros only, so intrinsics.def can include it inside an enum.
 */
#ifndef AJ_CODEGEN_WGMMA_SHAPES_H
#define AJ_CODEGEN_WGMMA_SHAPES_H

#define AJ_WGMMA_NS(X) \
    X(8) X(16) X(24) X(32) X(40) X(48) X(56) X(64) X(72) X(80) X(88) X(96) X(104) \
    X(112) X(120) X(128) X(136) X(144) X(152) X(160) X(168) X(176) X(184) X(192) \
    X(200) X(208) X(216) X(224) X(232) X(240) X(248) X(256)

#endif /* AJ_CODEGEN_WGMMA_SHAPES_H */
