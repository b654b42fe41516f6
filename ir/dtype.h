/*
 * dtype.h -- scalar conversions between f32 and the 16-bit float formats,
 * rounding to nearest even (as PTX cvt.rn does).  One implementation for
 * the emulator, the CLI and the tests.
 */
#ifndef AJ_IR_DTYPE_H
#define AJ_IR_DTYPE_H

#include <stdint.h>

float aj_f16_to_f32(uint16_t h);
uint16_t aj_f32_to_f16(float f);
float aj_bf16_to_f32(uint16_t h);
uint16_t aj_f32_to_bf16(float f);

#endif /* AJ_IR_DTYPE_H */
