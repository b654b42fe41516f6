/*
 * dtype.h -- scalar conversions between f32 and the 16-bit float formats,
 * rounding to nearest even (as PTX cvt.rn does).  One implementation for
 * the emulator, the CLI and the tests.  And the constants of the numerics
 * the kernels and the expression interpreter share.
 */
#ifndef AJ_IR_DTYPE_H
#define AJ_IR_DTYPE_H

#include <stddef.h>
#include <stdint.h>

#include "attnjit/attnjit.h"

#define AJ_LOG2E 1.44269504088896340736
#define AJ_LN2 0.693147180559945309417
#define AJ_2_SQRTPI 1.12837916709551257390   /* 2 / sqrt(pi), erf's slope at 0 */

float aj_f16_to_f32(uint16_t h);
uint16_t aj_f32_to_f16(float f);
float aj_bf16_to_f32(uint16_t h);
uint16_t aj_f32_to_bf16(float f);
/* The 8-bit floats of a KV cache (OCP FP8): e4m3fn (bias 7, no inf,
 * S.1111.111 is NaN, saturating at +-448 when encoding) and e5m2 (bias
 * 15, IEEE-like inf and NaN). */
float aj_f8e4m3_to_f32(uint8_t b);
uint8_t aj_f32_to_f8e4m3(float f);
float aj_f8e5m2_to_f32(uint8_t b);
uint8_t aj_f32_to_f8e5m2(float f);
/* Element e (lowest first) of a 32-bit register of packed 16-bit (f16,
 * bf16: two) or 8-bit (f8e4m3, f8e5m2: four) floats, as mma and wgmma
 * fragments hold them; NaN for another dtype. */
float aj_fragment_element(aj_dtype t, uint32_t reg, int e);
/* aj_convert's batch loops by instruction set.  Every path gives the
 * scalar loops' bits; aj_convert runs the widest the host has. */
typedef enum aj_convert_isa {
    AJ_CONVERT_SCALAR = 0,
    AJ_CONVERT_AVX2 = 1,     /* x86 AVX2 + F16C */
    AJ_CONVERT_AVX512 = 2,   /* x86 AVX-512F */
    AJ_CONVERT_ISA_COUNT
} aj_convert_isa;
aj_convert_isa aj_convert_host_isa(void);
/* aj_convert on the named path: AJ_ERR_UNSUPPORTED if the host lacks it
 * (tests compare the paths). */
aj_status aj_convert_with(aj_convert_isa isa, const void *src, aj_dtype src_dtype, void *dst,
                          aj_dtype dst_dtype, size_t count);
/* (bytes per element: aj_dtype_size, attnjit.h) */

#endif /* AJ_IR_DTYPE_H */
