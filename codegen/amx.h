/*
 * amx.h -- Intel AMX tile operations for the cpu target's kernels
 * (docs/cpu.md "AMX tiles"), lowered one of two ways:
 *
 *   native    the llvm.x86 tile intrinsics on fixed tile registers, on a
 *             host whose CPUID reports amx-tile and amx-bf16 (amx-fp16 for
 *             f16) and whose OS granted this process the tile data
 *             (arch_prctl)
 *   stand-in  calls of aj_amx_standin_* below, which run the same
 *             operations on an in-memory tile file on the kernel's stack,
 *             so that the AMX kernels' numbers are tested on any host (as
 *             the sim target runs the GPU kernels' intrinsics on the
 *             emulator)
 *
 * Semantics, from Intel's Architecture Instruction Set Extensions
 * Programming Reference (chapter "Intel AMX") and the Intrinsics Guide's
 * pseudocode for the sums' order: ldtilecfg takes a 64-byte
 * block (byte 0 the palette, 1 for the only one defined; bytes 16..31
 * each tile's bytes per row, u16; bytes 48..55 its rows, u8); a tile holds
 * at most 16 rows of 64 bytes; tileloadd / tilestored move rows x colsb
 * bytes, row r at base + r * stride; tdpbf16ps C += A B takes A as rows of
 * bf16 pairs and B in the pair ("VNNI") layout -- row k of B holds, in each
 * 32-bit column n, the pair (b[2k][n], b[2k+1][n]):
 *
 *   C[m][n] += A[m].bf16[2k] B[k].bf16[2n] + A[m].bf16[2k+1] B[k].bf16[2n+1]
 *
 * for k < A.colsb / 4, the two products added in that order to the f32
 * running sum (the Intrinsics Guide's order; the reference manual's newer
 * text sums each column's even and odd products apart before adding them
 * to C, so the hardware's last bit may differ from the stand-in's: tests
 * compare both against float64 within tolerances), denormal inputs read as
 * zero, denormal results flushed to zero, round to nearest even.  Shapes
 * that disagree (C.rows != A.rows,
 * C.colsb != B.colsb, A.colsb != 4 B.rows) and tiles used before a
 * configuration are #UD on the hardware; the stand-in reports them and
 * aborts the process, as the fault would.
 */
#ifndef AJ_CODEGEN_AMX_H
#define AJ_CODEGEN_AMX_H

#include <stddef.h>
#include <stdint.h>

#include "codegen/kbuilder.h"

#define AJ_AMX_TILES 8
#define AJ_AMX_ROWS 16    /* rows of a tile, at most */
#define AJ_AMX_COLSB 64   /* bytes of a tile row, at most */

/* How the cpu kernels run tile products on this host. */
typedef enum aj_amx_mode {
    AJ_AMX_OFF,       /* no tile products: the vector paths */
    AJ_AMX_STANDIN,   /* the stand-in (AJ_CPU_AMX=standin) */
    AJ_AMX_NATIVE,    /* the tile instructions */
} aj_amx_mode;

/* The mode for products of `dtype` (bf16: amx-bf16's tdpbf16ps; f16:
 * amx-fp16's tdpfp16ps; any other: off), from the host's features
 * (codegen/cpu.c: CPUID, less what AJ_CPU_ISA masks), the OS's permission
 * and AJ_CPU_AMX: auto (the default: native where the host can, else
 * off), off, standin, or native (the tile instructions whether or not
 * this host can run them: kernels compiled for another host; aj_host_cpu
 * then adds amx-tile, amx-bf16 and amx-fp16 to the features, and
 * aj_cpu_amx_check_runnable refuses the cpu device).  `why`, when not NULL, gets the reason as a phrase
 * ("CPUID reports no amx-tile and amx-bf16 ...").  The OS is asked for
 * the tile data once per process, the first time the features allow it.
 * An AJ_CPU_AMX of another value is refused by aj_host_cpu
 * (AJ_ERR_INVALID_ARG) and reads as off here. */
aj_amx_mode aj_cpu_amx_mode(aj_dtype dtype, char *why, size_t cap);
/* AJ_ERR_UNSUPPORTED, naming the reason, where AJ_CPU_AMX=native asks for
 * tile instructions this process cannot run; else AJ_OK. */
aj_status aj_cpu_amx_check_runnable(aj_ctx *ctx);
const char *aj_amx_mode_name(aj_amx_mode mode);

/* ------------------------------------------------------------ stand-in */

/* The stand-in's tile file: the configuration and the tiles' bytes. */
typedef struct aj_amx_file {
    uint16_t colsb[AJ_AMX_TILES];
    uint8_t rows[AJ_AMX_TILES];
    uint32_t configured;
    uint8_t pad[36];
    uint8_t tile[AJ_AMX_TILES][AJ_AMX_ROWS][AJ_AMX_COLSB];
} aj_amx_file;

void aj_amx_standin_ldtilecfg(aj_amx_file *f, const uint8_t *cfg);
void aj_amx_standin_tilerelease(aj_amx_file *f);
void aj_amx_standin_tilezero(aj_amx_file *f, int32_t t);
void aj_amx_standin_tileloadd(aj_amx_file *f, int32_t t, const void *base, int64_t stride);
void aj_amx_standin_tilestored(aj_amx_file *f, int32_t t, void *base, int64_t stride);
void aj_amx_standin_tdpbf16ps(aj_amx_file *f, int32_t c, int32_t a, int32_t b);
/* tdpfp16ps: the same on f16 pairs, whose denormal inputs count (no DAZ;
 * an f16 product is exact in f32 too) and denormal results flush */
void aj_amx_standin_tdpfp16ps(aj_amx_file *f, int32_t c, int32_t a, int32_t b);

/* ------------------------------------------------------------ emitters */

/* Tile operations in a kernel being built.  Every tile is configured as
 * 16 rows of 64 bytes (16 f32, 32 bf16 or 16 bf16 pairs). */
typedef struct aj_amx {
    aj_kb *kb;
    aj_amx_mode mode;      /* native or stand-in */
    aj_dtype dtype;        /* of the products: bf16 or f16 */
    LLVMValueRef file;     /* stand-in: the tile file (a stack buffer) */
    LLVMValueRef cfg;      /* the configuration block (a constant) */
} aj_amx;

/* Sets up t for a kernel whose products take `dtype` (bf16 or f16; the
 * stand-in's tile file joins the entry block's buffers); emits nothing
 * where the code runs. */
void aj_amx_init(aj_amx *t, aj_kb *kb, aj_amx_mode mode, aj_dtype dtype);
/* ldtilecfg (every tile 16 x 64 bytes) and tilerelease, around the code
 * that uses the tiles */
void aj_amx_config(aj_amx *t);
void aj_amx_release(aj_amx *t);
void aj_amx_zero(aj_amx *t, int tile);
/* rows r of the tile <-> base + r * stride (bytes, i64) */
void aj_amx_load(aj_amx *t, int tile, LLVMValueRef base, LLVMValueRef stride);
void aj_amx_store(aj_amx *t, int tile, LLVMValueRef base, LLVMValueRef stride);
/* tile c += tile a x tile b, pairs of t->dtype into f32 (tdpbf16ps or
 * tdpfp16ps) */
void aj_amx_dot(aj_amx *t, int c, int a, int b);

#endif /* AJ_CODEGEN_AMX_H */
