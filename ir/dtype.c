/*
 * dtype.c -- f32 <-> f16 / bf16 conversions (see dtype.h) and aj_convert.
 */
#include "ir/dtype.h"

#include <math.h>
#include <string.h>

#include "ir/diag.h"

static uint32_t bits_of(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

static float float_of(uint32_t u)
{
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

float aj_f16_to_f32(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000) << 16, exp = (h >> 10) & 0x1f, man = h & 0x3ffu;
    if (exp == 0x1f)                              /* inf, NaN (payload kept) */
        return float_of(sign | 0x7f800000u | man << 13);
    if (exp == 0) {                               /* zero, subnormal: exact */
        float f = ldexpf((float)man, -24);
        return sign ? -f : f;
    }
    return float_of(sign | (exp + 112) << 23 | man << 13);
}

uint16_t aj_f32_to_f16(float f)
{
    uint32_t sign = (bits_of(f) >> 16) & 0x8000;
    float a = fabsf(f);
    if (isnan(f))
        return (uint16_t)(sign | 0x7e00);
    if (a >= 65520.0f)                            /* rounds to infinity */
        return (uint16_t)(sign | 0x7c00);
    if (a < 6.103515625e-05f) {                   /* subnormal: multiples of 2^-24 */
        float q = nearbyintf(a * 16777216.0f);    /* default rounding: nearest even */
        return (uint16_t)(sign | (uint32_t)q);
    }
    uint32_t au = bits_of(a);
    au += 0xfff + ((au >> 13) & 1);               /* nearest even at bit 13 */
    return (uint16_t)(sign | ((au >> 13) - (112u << 10)));
}

float aj_bf16_to_f32(uint16_t h)
{
    return float_of((uint32_t)h << 16);
}

uint16_t aj_f32_to_bf16(float f)
{
    uint32_t u = bits_of(f);
    if (isnan(f))
        return (uint16_t)((u >> 16) | 0x40);      /* quiet NaN, sign kept */
    u += 0x7fff + ((u >> 16) & 1);
    return (uint16_t)(u >> 16);
}

static float load_f32(const void *src, aj_dtype t, size_t i)
{
    if (t == AJ_DTYPE_F32)
        return ((const float *)src)[i];
    uint16_t h = ((const uint16_t *)src)[i];
    return t == AJ_DTYPE_F16 ? aj_f16_to_f32(h) : aj_bf16_to_f32(h);
}

aj_status aj_convert(const void *src, aj_dtype src_dtype, void *dst, aj_dtype dst_dtype,
                     size_t count)
{
    if ((unsigned)src_dtype >= AJ_DTYPE_COUNT || (unsigned)dst_dtype >= AJ_DTYPE_COUNT ||
        (count && (!src || !dst)))
        return AJ_ERR_INVALID_ARG;
    for (size_t i = 0; i < count; i++) {
        float f = load_f32(src, src_dtype, i);
        switch (dst_dtype) {
        case AJ_DTYPE_F32: ((float *)dst)[i] = f; break;
        case AJ_DTYPE_F16: ((uint16_t *)dst)[i] = aj_f32_to_f16(f); break;
        default: ((uint16_t *)dst)[i] = aj_f32_to_bf16(f); break;
        }
    }
    return AJ_OK;
}
