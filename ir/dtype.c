/*
 * dtype.c -- f32 <-> f16 / bf16 conversions (see dtype.h) and aj_convert.
 */
#include "ir/dtype.h"

#include <math.h>
#include <stdbool.h>
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

/* ---------------------------------------------------------------- fp8 */

/* An 8-bit float of `ebits` exponent bits (bias 2^(ebits-1) - 1) and
 * `mbits` mantissa bits.  e4m3fn has no infinities: its top exponent
 * holds numbers, all but S.1111.111 (NaN). */
typedef struct f8_format {
    int ebits, mbits;
    bool ieee_top;     /* the top exponent is inf / NaN (e5m2) */
    uint8_t max_code;  /* the largest finite magnitude's code */
} f8_format;

static const f8_format e4m3 = {4, 3, false, 0x7e};   /* 448 */
static const f8_format e5m2 = {5, 2, true, 0x7b};    /* 57344 */

static float f8_decode(const f8_format *f, uint8_t b)
{
    int bias = (1 << (f->ebits - 1)) - 1, emax = (1 << f->ebits) - 1;
    int exp = (b >> f->mbits) & emax, man = b & ((1 << f->mbits) - 1);
    float sign = b & 0x80 ? -1.0f : 1.0f;
    if (f->ieee_top && exp == emax)
        return man ? NAN : sign * INFINITY;
    if (!f->ieee_top && exp == emax && man == (1 << f->mbits) - 1)
        return NAN;
    if (exp == 0)
        return sign * ldexpf((float)man, 1 - bias - f->mbits);
    return sign * ldexpf((float)(man | 1 << f->mbits), exp - bias - f->mbits);
}

/* Nearest even, saturating out-of-range values and infinities to the
 * largest finite (PTX's cvt.rn.satfinite); NaN stays NaN. */
static uint8_t f8_encode(const f8_format *f, float x)
{
    int bias = (1 << (f->ebits - 1)) - 1;
    uint8_t sign = signbit(x) ? 0x80 : 0;
    float a = fabsf(x);
    if (isnan(x))
        return (uint8_t)(sign | 0x7f);   /* a NaN in both formats */
    if (a >= f8_decode(f, f->max_code))
        return (uint8_t)(sign | f->max_code);
    if (a == 0)
        return sign;
    int k;
    frexpf(a, &k);                        /* a = m 2^k, 0.5 <= m < 1 */
    int e = k - 1 < 1 - bias ? 1 - bias : k - 1;   /* subnormals share 2^(1-bias) */
    float q = nearbyintf(ldexpf(a, f->mbits - e)); /* a in units of the last place */
    uint32_t code = (uint32_t)q;
    if (e > 1 - bias || code >= 1u << f->mbits)  /* normal: (exp, implicit 1 + man) */
        code = (uint32_t)(e + bias - 1) * (1u << f->mbits) + code;
    if (code > f->max_code)
        code = f->max_code;
    return (uint8_t)(sign | code);
}

float aj_f8e4m3_to_f32(uint8_t b) { return f8_decode(&e4m3, b); }
uint8_t aj_f32_to_f8e4m3(float f) { return f8_encode(&e4m3, f); }
float aj_f8e5m2_to_f32(uint8_t b) { return f8_decode(&e5m2, b); }
uint8_t aj_f32_to_f8e5m2(float f) { return f8_encode(&e5m2, f); }

int aj_dtype_size(aj_dtype dtype)
{
    if ((unsigned)dtype >= AJ_DTYPE_COUNT)
        return 0;
    return dtype == AJ_DTYPE_F32 ? 4 : dtype >= AJ_DTYPE_F8E4M3 ? 1 : 2;
}

/* ---------------------------------------------------------------- aj_convert */

static float load_f32(const void *src, aj_dtype t, size_t i)
{
    switch (t) {
    case AJ_DTYPE_F32: return ((const float *)src)[i];
    case AJ_DTYPE_F16: return aj_f16_to_f32(((const uint16_t *)src)[i]);
    case AJ_DTYPE_BF16: return aj_bf16_to_f32(((const uint16_t *)src)[i]);
    case AJ_DTYPE_F8E4M3: return aj_f8e4m3_to_f32(((const uint8_t *)src)[i]);
    default: return aj_f8e5m2_to_f32(((const uint8_t *)src)[i]);
    }
}

aj_status aj_convert(const void *src, aj_dtype src_dtype, void *dst, aj_dtype dst_dtype,
                     size_t count)
{
    if ((unsigned)src_dtype >= AJ_DTYPE_COUNT || (unsigned)dst_dtype >= AJ_DTYPE_COUNT ||
        (count && (!src || !dst)))
        return AJ_ERR_INVALID_ARG;
    /* rounding f32 results (the ring's O, dQ, dK, dV): one loop per pair,
     * no per-element switch */
    if (src_dtype == AJ_DTYPE_F32 && dst_dtype == AJ_DTYPE_F16) {
        for (size_t i = 0; i < count; i++)
            ((uint16_t *)dst)[i] = aj_f32_to_f16(((const float *)src)[i]);
        return AJ_OK;
    }
    if (src_dtype == AJ_DTYPE_F32 && dst_dtype == AJ_DTYPE_BF16) {
        for (size_t i = 0; i < count; i++)
            ((uint16_t *)dst)[i] = aj_f32_to_bf16(((const float *)src)[i]);
        return AJ_OK;
    }
    for (size_t i = 0; i < count; i++) {
        float f = load_f32(src, src_dtype, i);
        switch (dst_dtype) {
        case AJ_DTYPE_F32: ((float *)dst)[i] = f; break;
        case AJ_DTYPE_F16: ((uint16_t *)dst)[i] = aj_f32_to_f16(f); break;
        case AJ_DTYPE_BF16: ((uint16_t *)dst)[i] = aj_f32_to_bf16(f); break;
        case AJ_DTYPE_F8E4M3: ((uint8_t *)dst)[i] = aj_f32_to_f8e4m3(f); break;
        default: ((uint8_t *)dst)[i] = aj_f32_to_f8e5m2(f); break;
        }
    }
    return AJ_OK;
}
