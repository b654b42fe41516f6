/*
 * efficient_fwd.cu -- the CUDA C twin of attnjit's efficient forward
 * kernel, written for bench_nvrtc: the same algorithm, tiling and thread
 * layout (templates/efficient_fwd.c), specialised the same way (head dims,
 * dtype, mask and tile sizes are compile-time constants), so that NVRTC's
 * compile time can be set beside attnjit's for the same kernel.
 *
 * The bench defines before compiling:
 *   AJB_D, AJB_DV          head dims
 *   AJB_DTYPE              0 f16, 1 bf16, 2 f32
 *   AJB_CAUSAL             0 none, 1 causal (global positions, shift)
 *   AJB_BM, AJB_BN, AJB_WARPS, AJB_G   tiles, warps, lanes per row group
 *
 * No header is included, so that NVRTC needs none: f16 and bf16 are
 * converted with PTX cvt and bit shifts, as attnjit's kernels do.
 */
#define T (AJB_WARPS * 32)
#define R (T / AJB_G)              /* row groups */
#define RM (AJB_BM / R)            /* rows per thread */
#define CN (AJB_BN / AJB_G)        /* key columns per thread */
#define CV (AJB_DV / AJB_G)        /* output columns per thread (4-wide chunks) */
#define LDQ (AJB_D + 4)
#define LDKV ((AJB_D > AJB_DV ? AJB_D : AJB_DV) + 4)
#define LDP (AJB_BN + 4)
#define LOG2E 1.4426950408889634f

#if AJB_DTYPE == 2
typedef float elem_t;
#else
typedef unsigned short elem_t;
#endif

static __device__ __forceinline__ float to_f32(elem_t x)
{
#if AJB_DTYPE == 0
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(x));
    return f;
#elif AJB_DTYPE == 1
    return __uint_as_float((unsigned)x << 16);
#else
    return x;
#endif
}

static __device__ __forceinline__ elem_t from_f32(float f)
{
#if AJB_DTYPE == 0
    unsigned short h;
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f));
    return h;
#elif AJB_DTYPE == 1
    unsigned u = __float_as_uint(f);
    if ((u & 0x7fffffffu) > 0x7f800000u)
        return (elem_t)((u >> 16) | 0x40);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (elem_t)(u >> 16);
#else
    return f;
#endif
}

static __device__ __forceinline__ float ex2(float x)
{
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
    return y;
}

/* Loads rows [r0, r0 + rows) x cols of a (b, h) slice into shared f32,
 * zero past the sequence's end. */
static __device__ void load_tile(float *dst, int ld, const elem_t *src, long long stride_s,
                                 int r0, int rows, int seq, int cols)
{
    for (int e = threadIdx.x; e < rows * cols; e += T) {
        int r = e / cols, c = e % cols;
        float v = 0.f;
        if (r0 + r < seq)
            v = to_f32(src[(long long)(r0 + r) * stride_s + c]);
        dst[r * ld + c] = v;
    }
}

extern "C" __global__ void __launch_bounds__(T, 1)
efficient_fwd(const elem_t *__restrict__ q, const elem_t *__restrict__ k,
              const elem_t *__restrict__ v, elem_t *__restrict__ o, float *__restrict__ lse,
              long long sqb, long long sqh, long long sqs, long long skb, long long skh,
              long long sks, long long svb, long long svh, long long svs, long long slb,
              long long slh, long long sob, long long soh, long long sos, int heads_q,
              int heads_kv, int seq_q, int seq_k, long long q_offset, long long kv_offset,
              long long mask_shift, float scale)
{
    extern __shared__ float smem[];
    float *sq = smem, *skv = sq + AJB_BM * LDQ, *sp = skv + AJB_BN * LDKV;
    const int tid = threadIdx.x, lane = tid % AJB_G, group = tid / AJB_G;
    const int m0 = blockIdx.x * AJB_BM, h = blockIdx.y, b = blockIdx.z;
    const int hk = h / (heads_q / heads_kv);
    q += b * sqb + h * sqh;
    k += b * skb + hk * skh;
    v += b * svb + hk * svh;
    o += b * sob + h * soh;
    lse += b * slb + h * slh;

    /* visible keys of row i: j <= i + (q_offset - kv_offset + shift) */
    const long long diag = q_offset - kv_offset + mask_shift;
    int n_begin = 0, n_end = (seq_k + AJB_BN - 1) / AJB_BN;
#if AJB_CAUSAL
    {
        int rows = seq_q - m0 < AJB_BM ? seq_q - m0 : AJB_BM;
        long long hi = (long long)(m0 + rows - 1) + diag;
        if (hi < 0)
            n_end = 0;
        else if (hi < seq_k - 1)
            n_end = (int)(hi / AJB_BN) + 1;
    }
#endif

    load_tile(sq, LDQ, q, sqs, m0, AJB_BM, seq_q, AJB_D);

    float acc[RM][CN], out[RM][CV], mrow[RM], lrow[RM];
#pragma unroll
    for (int r = 0; r < RM; r++) {
        mrow[r] = -__int_as_float(0x7f800000);
        lrow[r] = 0.f;
#pragma unroll
        for (int c = 0; c < CV; c++)
            out[r][c] = 0.f;
    }

    for (int nb = n_begin; nb < n_end; nb++) {
        const int n0 = nb * AJB_BN;
        __syncthreads();
        load_tile(skv, LDKV, k, sks, n0, AJB_BN, seq_k, AJB_D);
        __syncthreads();
#pragma unroll
        for (int r = 0; r < RM; r++)
#pragma unroll
            for (int t = 0; t < CN; t++)
                acc[r][t] = 0.f;
        for (int d4 = 0; d4 < AJB_D / 4; d4++) {
            float4 qv[RM], kv[CN];
#pragma unroll
            for (int r = 0; r < RM; r++)
                qv[r] = *(const float4 *)&sq[(group + R * r) * LDQ + 4 * d4];
#pragma unroll
            for (int t = 0; t < CN; t++)
                kv[t] = *(const float4 *)&skv[(lane + AJB_G * t) * LDKV + 4 * d4];
#pragma unroll
            for (int r = 0; r < RM; r++)
#pragma unroll
                for (int t = 0; t < CN; t++) {
                    float a = acc[r][t];
                    a = fmaf(qv[r].x, kv[t].x, a);
                    a = fmaf(qv[r].y, kv[t].y, a);
                    a = fmaf(qv[r].z, kv[t].z, a);
                    a = fmaf(qv[r].w, kv[t].w, a);
                    acc[r][t] = a;
                }
        }
        /* scores in log2 units, mask, online softmax, P to shared memory */
#pragma unroll
        for (int r = 0; r < RM; r++) {
            const int i = m0 + group + R * r;
            float s[CN], mx = -__int_as_float(0x7f800000);
#pragma unroll
            for (int t = 0; t < CN; t++) {
                const int j = n0 + lane + AJB_G * t;
                bool ok = j < seq_k;
#if AJB_CAUSAL
                ok = ok && (long long)j <= (long long)i + diag;
#endif
                s[t] = ok ? acc[r][t] * (scale * LOG2E) : -__int_as_float(0x7f800000);
                mx = fmaxf(mx, s[t]);
            }
#pragma unroll
            for (int off = AJB_G / 2; off > 0; off /= 2)
                mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, off, AJB_G));
            const float mnew = fmaxf(mrow[r], mx);
            const float base = mnew == -__int_as_float(0x7f800000) ? 0.f : mnew;
            const float alpha = ex2(mrow[r] - base);
            float sum = 0.f;
#pragma unroll
            for (int t = 0; t < CN; t++) {
                const float p = ex2(s[t] - base);
                sum += p;
                sp[(group + R * r) * LDP + lane + AJB_G * t] = p;
            }
#pragma unroll
            for (int off = AJB_G / 2; off > 0; off /= 2)
                sum += __shfl_xor_sync(0xffffffffu, sum, off, AJB_G);
            lrow[r] = lrow[r] * alpha + sum;
            mrow[r] = mnew;
#pragma unroll
            for (int c = 0; c < CV; c++)
                out[r][c] *= alpha;
        }
        __syncthreads();
        load_tile(skv, LDKV, v, svs, n0, AJB_BN, seq_k, AJB_DV);
        __syncthreads();
        for (int j = 0; j < AJB_BN; j++) {
            float p[RM];
#pragma unroll
            for (int r = 0; r < RM; r++)
                p[r] = sp[(group + R * r) * LDP + j];
#pragma unroll
            for (int c4 = 0; c4 < CV / 4; c4++) {
                const float4 vv = *(const float4 *)&skv[j * LDKV + 4 * (lane + AJB_G * c4)];
#pragma unroll
                for (int r = 0; r < RM; r++) {
                    out[r][4 * c4 + 0] = fmaf(p[r], vv.x, out[r][4 * c4 + 0]);
                    out[r][4 * c4 + 1] = fmaf(p[r], vv.y, out[r][4 * c4 + 1]);
                    out[r][4 * c4 + 2] = fmaf(p[r], vv.z, out[r][4 * c4 + 2]);
                    out[r][4 * c4 + 3] = fmaf(p[r], vv.w, out[r][4 * c4 + 3]);
                }
            }
        }
    }

    /* epilogue: O / l, LSE in natural log; rows with no key: O = 0, -inf */
#pragma unroll
    for (int r = 0; r < RM; r++) {
        const int i = m0 + group + R * r;
        if (i >= seq_q)
            continue;
        const bool empty = lrow[r] == 0.f;
        const float inv = empty ? 0.f : 1.f / lrow[r];
#pragma unroll
        for (int c4 = 0; c4 < CV / 4; c4++)
#pragma unroll
            for (int e = 0; e < 4; e++)
                o[(long long)i * sos + 4 * (lane + AJB_G * c4) + e] =
                    from_f32(out[r][4 * c4 + e] * inv);
        if (lane == 0)
            lse[i] = empty ? -__int_as_float(0x7f800000)
                           : (mrow[r] + __log2f(lrow[r])) / LOG2E;
    }
}
