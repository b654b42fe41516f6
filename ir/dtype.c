/*
 * dtype.c -- f32 <-> f16 / bf16 conversions (see dtype.h) and aj_convert.
 */
#include "ir/dtype.h"

#include <math.h>
#include <stdatomic.h>
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

float aj_fragment_element(aj_dtype t, uint32_t reg, int e)
{
    switch (t) {
    case AJ_DTYPE_F16: return aj_f16_to_f32((uint16_t)(reg >> (16 * e)));
    case AJ_DTYPE_BF16: return aj_bf16_to_f32((uint16_t)(reg >> (16 * e)));
    case AJ_DTYPE_F8E4M3: return aj_f8e4m3_to_f32((uint8_t)(reg >> (8 * e)));
    case AJ_DTYPE_F8E5M2: return aj_f8e5m2_to_f32((uint8_t)(reg >> (8 * e)));
    default: return NAN;
    }
}

int aj_dtype_size(aj_dtype dtype)
{
    if ((unsigned)dtype >= AJ_DTYPE_COUNT)
        return 0;
    return dtype == AJ_DTYPE_F32 ? 4 : dtype >= AJ_DTYPE_F8E4M3 ? 1 : 2;
}

/* ---------------------------------------------------------------- batches */

/* The f32 <-> f16 / bf16 batch loops aj_convert runs (the ring rounds its
 * O, dQ, dK, dV through them, 2-8 MB a call), one table row per
 * instruction set.  The scalar loops are the rule; a vector loop gives
 * the same bits, block for block: F16C's vcvtps2ph rounds to nearest
 * even as the scalar code does, bf16 is the scalar integer sum 16 or 8
 * lanes wide, and a block holding a NaN (whose payload the hardware
 * keeps or quiets differently) runs the scalar loop. */
typedef void (*batch_fn)(const void *src, void *dst, size_t n);

/* The scalar loops, one element at a time (bf16 -> f32, a shift, the
 * compiler vectorises for any host). */
#define SCALAR_BATCH(name, src_t, dst_t, convert)                          \
    static void name(const void *src, void *dst, size_t n)                 \
    {                                                                      \
        for (size_t i = 0; i < n; i++)                                     \
            ((dst_t *)dst)[i] = convert(((const src_t *)src)[i]);          \
    }
SCALAR_BATCH(f32_to_f16_scalar, float, uint16_t, aj_f32_to_f16)
SCALAR_BATCH(f32_to_bf16_scalar, float, uint16_t, aj_f32_to_bf16)
SCALAR_BATCH(f16_to_f32_scalar, uint16_t, float, aj_f16_to_f32)
SCALAR_BATCH(bf16_to_f32_loop, uint16_t, float, aj_bf16_to_f32)
#undef SCALAR_BATCH

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>

#define AJ_X86_BATCHES 1
#define RNE (_MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC)

/* One vector loop: blocks of W elements, loaded into x; a block where
 * NAN_MASK is set runs the scalar loop, else STORE; the tail runs the
 * scalar loop. */
#define VECTOR_BATCH(name, isa, W, src_t, dst_t, scalar, LOAD, NAN_MASK, STORE)        \
    __attribute__((target(isa))) static void name(const void *src, void *dst, size_t n) \
    {                                                                                 \
        const src_t *s = src;                                                         \
        dst_t *d = dst;                                                               \
        size_t i = 0;                                                                 \
        for (; i + W <= n; i += W) {                                                  \
            LOAD;                                                                     \
            if (NAN_MASK)                                                             \
                scalar(s + i, d + i, W);                                              \
            else                                                                      \
                STORE;                                                                \
        }                                                                             \
        scalar(s + i, d + i, n - i);                                                  \
    }

/* bf16 nearest even, per 32-bit lane: (u + 0x7fff + (u >> 16 & 1)) >> 16 */
__attribute__((target("avx2"))) static __m128i bf16_round_avx2(__m256 x)
{
    const __m256i u = _mm256_castps_si256(x);
    const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
    const __m256i r = _mm256_srli_epi32(
        _mm256_add_epi32(u, _mm256_add_epi32(_mm256_set1_epi32(0x7fff), lsb)), 16);
    return _mm_packus_epi32(_mm256_castsi256_si128(r), _mm256_extracti128_si256(r, 1));
}

__attribute__((target("avx512f"))) static __m256i bf16_round_avx512(__m512 x)
{
    const __m512i u = _mm512_castps_si512(x);
    const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
    return _mm512_cvtepi32_epi16(_mm512_srli_epi32(
        _mm512_add_epi32(u, _mm512_add_epi32(_mm512_set1_epi32(0x7fff), lsb)), 16));
}

#define NAN8(x) _mm256_movemask_ps(_mm256_cmp_ps(x, x, _CMP_UNORD_Q))
#define NAN16(x) _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q)

VECTOR_BATCH(f32_to_f16_avx2, "avx2,f16c", 8, float, uint16_t, f32_to_f16_scalar,
             const __m256 x = _mm256_loadu_ps(s + i), NAN8(x),
             _mm_storeu_si128((__m128i *)(d + i), _mm256_cvtps_ph(x, RNE)))
VECTOR_BATCH(f32_to_bf16_avx2, "avx2", 8, float, uint16_t, f32_to_bf16_scalar,
             const __m256 x = _mm256_loadu_ps(s + i), NAN8(x),
             _mm_storeu_si128((__m128i *)(d + i), bf16_round_avx2(x)))
VECTOR_BATCH(f16_to_f32_avx2, "avx2,f16c", 8, uint16_t, float, f16_to_f32_scalar,
             const __m256 x = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(s + i))),
             NAN8(x), _mm256_storeu_ps(d + i, x))
VECTOR_BATCH(f32_to_f16_avx512, "avx512f", 16, float, uint16_t, f32_to_f16_scalar,
             const __m512 x = _mm512_loadu_ps(s + i), NAN16(x),
             _mm256_storeu_si256((__m256i *)(d + i), _mm512_cvtps_ph(x, RNE)))
VECTOR_BATCH(f32_to_bf16_avx512, "avx512f", 16, float, uint16_t, f32_to_bf16_scalar,
             const __m512 x = _mm512_loadu_ps(s + i), NAN16(x),
             _mm256_storeu_si256((__m256i *)(d + i), bf16_round_avx512(x)))
VECTOR_BATCH(f16_to_f32_avx512, "avx512f", 16, uint16_t, float, f16_to_f32_scalar,
             const __m512 x = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(s + i))),
             NAN16(x), _mm512_storeu_ps(d + i, x))
#undef NAN8
#undef NAN16
#undef VECTOR_BATCH
#undef RNE
#endif

typedef struct batch_paths {
    batch_fn f32_to_f16, f32_to_bf16, f16_to_f32, bf16_to_f32;
} batch_paths;

static const batch_paths paths[AJ_CONVERT_ISA_COUNT] = {
    [AJ_CONVERT_SCALAR] = {f32_to_f16_scalar, f32_to_bf16_scalar, f16_to_f32_scalar,
                           bf16_to_f32_loop},
#ifdef AJ_X86_BATCHES
    [AJ_CONVERT_AVX2] = {f32_to_f16_avx2, f32_to_bf16_avx2, f16_to_f32_avx2, bf16_to_f32_loop},
    [AJ_CONVERT_AVX512] = {f32_to_f16_avx512, f32_to_bf16_avx512, f16_to_f32_avx512,
                           bf16_to_f32_loop},
#endif
};

aj_convert_isa aj_convert_host_isa(void)
{
    static _Atomic int host = -1;   /* found once; every thread finds the same */
    int isa = atomic_load_explicit(&host, memory_order_relaxed);
    if (isa >= 0)
        return (aj_convert_isa)isa;
    isa = AJ_CONVERT_SCALAR;
#ifdef AJ_X86_BATCHES
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx512f"))
        isa = AJ_CONVERT_AVX512;
    else if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("f16c"))
        isa = AJ_CONVERT_AVX2;
#endif
    atomic_store_explicit(&host, isa, memory_order_relaxed);
    return (aj_convert_isa)isa;
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


static batch_fn batch_for(const batch_paths *b, aj_dtype src, aj_dtype dst)
{
    if (src == AJ_DTYPE_F32 && dst == AJ_DTYPE_F16)
        return b->f32_to_f16;
    if (src == AJ_DTYPE_F32 && dst == AJ_DTYPE_BF16)
        return b->f32_to_bf16;
    if (src == AJ_DTYPE_F16 && dst == AJ_DTYPE_F32)
        return b->f16_to_f32;
    if (src == AJ_DTYPE_BF16 && dst == AJ_DTYPE_F32)
        return b->bf16_to_f32;
    return NULL;
}

aj_status aj_convert_with(aj_convert_isa isa, const void *src, aj_dtype src_dtype, void *dst,
                          aj_dtype dst_dtype, size_t count)
{
    if ((unsigned)src_dtype >= AJ_DTYPE_COUNT || (unsigned)dst_dtype >= AJ_DTYPE_COUNT ||
        (count && (!src || !dst)) || (unsigned)isa >= AJ_CONVERT_ISA_COUNT)
        return AJ_ERR_INVALID_ARG;
    if (isa > aj_convert_host_isa())
        return AJ_ERR_UNSUPPORTED;
    const batch_fn batch = batch_for(&paths[isa], src_dtype, dst_dtype);
    if (batch) {
        batch(src, dst, count);
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

aj_status aj_convert(const void *src, aj_dtype src_dtype, void *dst, aj_dtype dst_dtype,
                     size_t count)
{
    return aj_convert_with(aj_convert_host_isa(), src, src_dtype, dst, dst_dtype, count);
}
