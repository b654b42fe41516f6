/*
 * test_sim_emulator.c -- the SIMT emulator, one GPU operation at a time.
 *
 * Small kernels written directly with the kernel builder run on the `sim`
 * target, and their results are checked against the PTX ISA's definition
 * written out here: shfl.sync in every mode with clamps and segments,
 * vote.sync, mma.sync m16n8k16 (f16, bf16) and m16n8k32 (e4m3, e5m2: PTX
 * for sm_89 and sm_90 at ISA 8.4, refused on sm_80) against a float64 product,
 * ldmatrix x1/x2/x4 with and without .trans, cp.async with its
 * delayed visibility, and red.add.f32 as a host atomic across workers.
 * Deliberately broken kernels show that every detector fires (bounds,
 * alignment, barrier divergence, deadlock, and the strict mode's
 * shared-memory races under several seeds) with a message naming what went
 * wrong, and none hangs.
 *
 * Every kernel is also compiled for sm_80 and sm_90 and, where ptxas is
 * found, assembled, which proves the nvptx lowering of the same table rows.
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "ir/dtype.h"
#include "kb_kernel.h"

#define MAX_BUFS 4

static aj_ctx *ctx;
static aj_op *op;             /* any op: aj_codegen_run only hands it over */
static char ptxas[1024];
static int have_ptxas, ptx_kernels, ptx_assembled;
static uint64_t sim_seed;     /* the strict schedule's seed run() passes; 0: the default */

/* ---------------------------------------------------------------- harness */

typedef struct test_kernel test_kernel;

struct test_kernel {
    const char *name;                 /* the entry symbol */
    int threads;
    int32_t smem_bytes;
    const char *params[MAX_BUFS];     /* global pointers, NULL-terminated */
    void (*body)(aj_kb *kb, const test_kernel *k);
    int variant;                      /* a knob the body may read */
    const char *ptx_needles[5];       /* instructions the PTX must contain */
};

/* the FP8 mma's body: its PTX is sm_89's and sm_90's, not sm_80's */
static void mma8_body(aj_kb *kb, const test_kernel *k);

static aj_status build_test_kernel(aj_kb *kb, const aj_op *unused, void *user)
{
    const test_kernel *k = user;
    for (int i = 0; i < MAX_BUFS && k->params[i]; i++)
        aj_kb_add_param(kb, k->params[i], AJ_PARAM_PTR, AJ_KB_NO_ID);
    if (k->smem_bytes)
        aj_kb_smem_reserve(kb, k->smem_bytes);
    aj_kb_begin(kb, k->threads);
    k->body(kb, k);
    kb_kernel_finish_one_cta(kb);
    return AJ_OK;
}

static aj_kernel *compile(const test_kernel *k, aj_target target)
{
    return kb_kernel_compile(ctx, op, k->name, build_test_kernel, (void *)k, target);
}

/* The kernel's PTX for sm_80 and sm_90 (an FP8 kernel's: sm_89 and
 * sm_90) holds its instructions and, where ptxas is found, assembles. */
static void check_ptx(const test_kernel *k)
{
    static const aj_target targets[2][2] = {{AJ_TARGET_SM_80, AJ_TARGET_SM_90},
                                            {AJ_TARGET_SM_89, AJ_TARGET_SM_90}};
    for (int i = 0; i < 2; i++) {
        aj_target target = targets[k->body == mma8_body][i];
        aj_kernel *kern = compile(k, target);
        if (!kern)
            continue;
        size_t len;
        const char *ptx = aj_kernel_code(kern, &len);
        for (int n = 0; n < 5 && k->ptx_needles[n]; n++)
            CHECK_MSG(strstr(ptx, k->ptx_needles[n]) != NULL, "%s %s: PTX lacks '%s'",
                      k->name, aj_target_name(target), k->ptx_needles[n]);
        ptx_kernels++;
        if (have_ptxas) {
            ptxas_result r;
            ptxas_run(ptxas, aj_target_name(target), ptx, len, &r);
            CHECK_MSG(r.exit_code == 0, "%s: ptxas -arch=%s failed:\n%s\n%s", k->name,
                      aj_target_name(target), r.log, ptx);
            ptx_assembled += r.exit_code == 0;
        }
        aj_kernel_destroy(kern);
    }
}

static aj_status run_sim(const test_kernel *k, void *const *bufs, const size_t *bytes);

/* Compiles k for sim (and checks its PTX) and runs one CTA over the
 * buffers, named after k's parameters. */
static aj_status run(const test_kernel *k, void *const *bufs, const size_t *bytes)
{
    check_ptx(k);
    return run_sim(k, bufs, bytes);
}

static aj_status run_sim(const test_kernel *k, void *const *bufs, const size_t *bytes)
{
    aj_kernel *kern = compile(k, AJ_TARGET_SIM);
    if (!kern)
        return AJ_ERR_CODEGEN;
    aj_sim_buffer buffers[MAX_BUFS];
    int n = 0;
    for (; n < MAX_BUFS && k->params[n]; n++)
        buffers[n] = (aj_sim_buffer){k->params[n], bufs[n], bytes[n]};
    aj_status st = kb_kernel_run_sim(ctx, kern, k->name, k->threads, buffers, n, sim_seed);
    aj_kernel_destroy(kern);
    return st;
}

/* ---------------------------------------------------------------- builder shorthands */

static LLVMValueRef c32(aj_kb *kb, int64_t v) { return aj_kb_i32(kb, v); }
static LLVMValueRef add(aj_kb *kb, LLVMValueRef a, LLVMValueRef b) { return LLVMBuildAdd(kb->b, a, b, ""); }
static LLVMValueRef mul(aj_kb *kb, LLVMValueRef a, LLVMValueRef b) { return LLVMBuildMul(kb->b, a, b, ""); }
static LLVMValueRef and(aj_kb *kb, LLVMValueRef a, LLVMValueRef b) { return LLVMBuildAnd(kb->b, a, b, ""); }
static LLVMValueRef lshr(aj_kb *kb, LLVMValueRef a, int s) { return LLVMBuildLShr(kb->b, a, c32(kb, s), ""); }
static LLVMValueRef lt(aj_kb *kb, LLVMValueRef a, int64_t b) { return LLVMBuildICmp(kb->b, LLVMIntSLT, a, c32(kb, b), ""); }
static LLVMValueRef lane_id(aj_kb *kb) { return and(kb, aj_kb_thread_id(kb), c32(kb, 31)); }

/* &buf[index] for elements of elem_bytes */
static LLVMValueRef gaddr(aj_kb *kb, const char *buf, LLVMValueRef index, int elem_bytes)
{
    LLVMValueRef off = LLVMBuildMul(kb->b, LLVMBuildSExt(kb->b, index, kb->t_i64, ""),
                                    aj_kb_i64(kb, elem_bytes), "");
    return aj_kb_gptr_offset(kb, aj_kb_param(kb, buf), off);
}

static LLVMValueRef gload(aj_kb *kb, LLVMTypeRef type, const char *buf, LLVMValueRef index)
{
    unsigned bytes = type == kb->t_i16 ? 2 : 4;
    return aj_kb_load(kb, type, gaddr(kb, buf, index, (int)bytes), bytes);
}

static void gstore(aj_kb *kb, LLVMValueRef v, const char *buf, LLVMValueRef index)
{
    unsigned bytes = LLVMTypeOf(v) == kb->t_i16 ? 2 : 4;
    aj_kb_store(kb, v, gaddr(kb, buf, index, (int)bytes), bytes);
}

static LLVMValueRef as_i32(aj_kb *kb, LLVMValueRef v)
{
    if (LLVMTypeOf(v) == kb->t_f32)
        return LLVMBuildBitCast(kb->b, v, kb->t_i32, "");
    if (LLVMTypeOf(v) == kb->t_i1)
        return LLVMBuildZExt(kb->b, v, kb->t_i32, "");
    return v;
}

/* two 16-bit elements into one register, `lo` in the low half */
static LLVMValueRef pack(aj_kb *kb, LLVMValueRef lo, LLVMValueRef hi)
{
    LLVMValueRef l = LLVMBuildZExt(kb->b, lo, kb->t_i32, "");
    LLVMValueRef h = LLVMBuildShl(kb->b, LLVMBuildZExt(kb->b, hi, kb->t_i32, ""), c32(kb, 16), "");
    return LLVMBuildOr(kb->b, l, h, "");
}

static uint32_t u32_of(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }
static float f32_of(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }

static uint64_t rng_state = 0x2545f4914f6cdd1dull;

static int rand_int(int lo, int hi)   /* uniform in [lo, hi] */
{
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return lo + (int)(rng_state % (uint64_t)(hi - lo + 1));
}

/* ---------------------------------------------------------------- table vs emulator */

/* Every emulator symbol the table names exists, and the emulator has no
 * symbol the table does not name: the two lists cannot drift. */
static void test_symbols_match_table(void)
{
    const char *names[AJ_INTR_COUNT + 1];
    size_t n = aj_intrinsic_sim_symbols(names, AJ_INTR_COUNT + 1);
    CHECK(n == AJ_INTR_COUNT);
    size_t nsyms = 0;
    const aj_host_symbol *syms = aj_sim_symbols(&nsyms);
    CHECK(nsyms == n);
    for (size_t i = 0; i < n; i++) {
        int found = 0;
        for (size_t j = 0; j < nsyms; j++)
            found += strcmp(names[i], syms[j].name) == 0 && syms[j].address != NULL;
        CHECK_MSG(found == 1, "table symbol %s is bound %d times by the emulator", names[i],
                  found);
    }
    for (size_t j = 0; j < nsyms; j++) {
        int found = 0;
        for (size_t i = 0; i < n; i++)
            found += strcmp(names[i], syms[j].name) == 0;
        CHECK_MSG(found == 1, "emulator symbol %s is named %d times in the table", syms[j].name,
                  found);
    }
}

/* ---------------------------------------------------------------- shfl.sync */

/* shfl.sync by the PTX ISA: the lane whose value `lane` receives. */
enum shfl_mode { UP, DOWN, BFLY, IDX };

static int ptx_shfl_source(enum shfl_mode mode, int lane, int b, int c)
{
    int bval = b & 31, cval = c & 31, segmask = (c >> 8) & 31;
    int max_lane = (lane & segmask) | (cval & ~segmask);
    int min_lane = lane & segmask;
    int j, pval;
    switch (mode) {
    case UP:   j = lane - bval; pval = j >= max_lane; break;
    case DOWN: j = lane + bval; pval = j <= max_lane; break;
    case BFLY: j = lane ^ bval; pval = j <= max_lane; break;
    default:   j = min_lane | (bval & ~segmask); pval = j <= max_lane; break;
    }
    return pval ? j : lane;
}

/* b < 0: each lane passes b = (7 * lane + 3) & 31, a permutation */
static const struct shfl_case {
    enum aj_intrinsic_id id;
    enum shfl_mode mode;
    int b, c;
} shfl_cases[] = {
    {AJ_INTR_SHFL_IDX_F32, IDX, 5, 0x1f},
    {AJ_INTR_SHFL_IDX_F32, IDX, -1, 0x1f},
    {AJ_INTR_SHFL_IDX_F32, IDX, 5, 0x0},
    {AJ_INTR_SHFL_IDX_F32, IDX, 3, 0x181f},
    {AJ_INTR_SHFL_IDX_F32, IDX, -1, 0x181f},
    {AJ_INTR_SHFL_UP_F32, UP, 1, 0x0},
    {AJ_INTR_SHFL_UP_F32, UP, 3, 0x1f},
    {AJ_INTR_SHFL_UP_F32, UP, 2, 0x1800},
    {AJ_INTR_SHFL_UP_F32, UP, 9, 0x181f},
    {AJ_INTR_SHFL_DOWN_F32, DOWN, 2, 0x1f},
    {AJ_INTR_SHFL_DOWN_F32, DOWN, 4, 0x0},
    {AJ_INTR_SHFL_DOWN_F32, DOWN, 1, 0x181f},
    {AJ_INTR_SHFL_DOWN_F32, DOWN, 5, 0x1007},
    {AJ_INTR_SHFL_BFLY_F32, BFLY, 1, 0x1f},
    {AJ_INTR_SHFL_BFLY_F32, BFLY, 16, 0x1f},
    {AJ_INTR_SHFL_BFLY_F32, BFLY, 8, 0x0},
    {AJ_INTR_SHFL_BFLY_F32, BFLY, 3, 0x181f},
    {AJ_INTR_SHFL_BFLY_F32, BFLY, 12, 0x1c0f},
    {AJ_INTR_SHFL_IDX_I32, IDX, 31, 0x1f},
    {AJ_INTR_SHFL_IDX_I32, IDX, 7, 0x0},
    {AJ_INTR_SHFL_IDX_I32, IDX, -1, 0x181f},
};
#define NUM_SHFL_CASES (int)(sizeof shfl_cases / sizeof shfl_cases[0])
#define SHFL_THREADS 64

/* out[case][tid] = the case's shuffle of fin[tid] (f32) or iin[tid] (i32) */
static void shfl_body(aj_kb *kb, const test_kernel *k)
{
    LLVMValueRef tid = aj_kb_thread_id(kb), lane = lane_id(kb);
    LLVMValueRef fv = gload(kb, kb->t_f32, "fin", tid);
    LLVMValueRef iv = gload(kb, kb->t_i32, "iin", tid);
    LLVMValueRef lane_b = and(kb, add(kb, mul(kb, lane, c32(kb, 7)), c32(kb, 3)), c32(kb, 31));
    for (int i = 0; i < NUM_SHFL_CASES; i++) {
        const struct shfl_case *sc = &shfl_cases[i];
        LLVMValueRef args[4] = {c32(kb, -1), sc->id == AJ_INTR_SHFL_IDX_I32 ? iv : fv,
                                sc->b < 0 ? lane_b : c32(kb, sc->b), c32(kb, sc->c)};
        LLVMValueRef r = aj_kb_intrinsic(kb, sc->id, args);
        gstore(kb, as_i32(kb, r), "out", add(kb, tid, c32(kb, i * SHFL_THREADS)));
    }
}

/* Two half-warp shuffles at once, each with its own membermask and site. */
static void shfl_halves_body(aj_kb *kb, const test_kernel *k)
{
    LLVMValueRef tid = aj_kb_thread_id(kb);
    LLVMValueRef v = gload(kb, kb->t_f32, "fin", tid);
    aj_kb_if_begin(kb, lt(kb, lane_id(kb), 16));
    {
        LLVMValueRef args[4] = {c32(kb, 0x0000ffff), v, c32(kb, 1), c32(kb, 0x1f)};
        gstore(kb, aj_kb_intrinsic(kb, AJ_INTR_SHFL_BFLY_F32, args), "out", tid);
    }
    aj_kb_else(kb);
    {
        LLVMValueRef args[4] = {c32(kb, (int32_t)0xffff0000u), v, c32(kb, 1), c32(kb, 0x1f)};
        gstore(kb, aj_kb_intrinsic(kb, AJ_INTR_SHFL_DOWN_F32, args), "out", tid);
    }
    aj_kb_if_end(kb);
}

static void test_shfl(void)
{
    static float fin[SHFL_THREADS];
    static int32_t iin[SHFL_THREADS];
    static uint32_t out[NUM_SHFL_CASES * SHFL_THREADS];
    for (int t = 0; t < SHFL_THREADS; t++) {
        fin[t] = 1000.0f + 1.25f * (float)t;
        iin[t] = 0x10000 * t + 7;
    }
    memset(out, 0, sizeof out);
    const test_kernel k = {"t_shfl", SHFL_THREADS, 0, {"fin", "iin", "out"}, shfl_body, 0,
                           {"shfl.sync.idx.b32", "shfl.sync.up.b32", "shfl.sync.down.b32",
                            "shfl.sync.bfly.b32"}};
    void *bufs[] = {fin, iin, out};
    size_t bytes[] = {sizeof fin, sizeof iin, sizeof out};
    CHECK_STATUS(ctx, run(&k, bufs, bytes), AJ_OK);
    int wrong = 0;
    for (int i = 0; i < NUM_SHFL_CASES; i++) {
        const struct shfl_case *sc = &shfl_cases[i];
        for (int t = 0; t < SHFL_THREADS; t++) {
            int lane = t % 32, base = t - lane;
            int b = sc->b < 0 ? (7 * lane + 3) & 31 : sc->b;
            int src = base + ptx_shfl_source(sc->mode, lane, b, sc->c);
            uint32_t want = sc->id == AJ_INTR_SHFL_IDX_I32 ? (uint32_t)iin[src] : u32_of(fin[src]);
            uint32_t got = out[i * SHFL_THREADS + t];
            if (got != want && wrong++ < 8)
                fprintf(stderr, "shfl case %d (mode %d, b %d, c 0x%x) thread %d: got 0x%08x, "
                        "want 0x%08x (lane %d)\n", i, sc->mode, b, sc->c, t, got, want,
                        src - base);
        }
    }
    CHECK_MSG(wrong == 0, "%d shuffled values differ from the PTX ISA's rule", wrong);

    const test_kernel halves = {"t_shfl_halves", 32, 0, {"fin", "out"}, shfl_halves_body, 0,
                                {"shfl.sync.bfly.b32", "shfl.sync.down.b32"}};
    void *hbufs[] = {fin, out};
    size_t hbytes[] = {sizeof fin, sizeof out};
    CHECK_STATUS(ctx, run(&halves, hbufs, hbytes), AJ_OK);
    for (int t = 0; t < 32; t++) {
        int src = t < 16 ? t ^ 1 : ptx_shfl_source(DOWN, t, 1, 0x1f);
        CHECK_MSG(out[t] == u32_of(fin[src]), "half-warp shuffle, lane %d: got %g, want %g",
                  t, f32_of(out[t]), fin[src]);
    }
}

/* ---------------------------------------------------------------- vote.sync */

#define VOTE_THREADS 96

/* out[0..]: ballot, all, any over the warp; out[3 * T ..]: a ballot over
 * the low half-warp and an all over the high one, each with its mask */
static void vote_body(aj_kb *kb, const test_kernel *k)
{
    LLVMValueRef tid = aj_kb_thread_id(kb);
    LLVMValueRef pred = LLVMBuildICmp(kb->b, LLVMIntNE, gload(kb, kb->t_i32, "in", tid),
                                      c32(kb, 0), "");
    gstore(kb, aj_kb_ballot(kb, pred), "out", tid);
    gstore(kb, as_i32(kb, aj_kb_vote_all(kb, pred)), "out", add(kb, tid, c32(kb, VOTE_THREADS)));
    gstore(kb, as_i32(kb, aj_kb_vote_any(kb, pred)), "out",
           add(kb, tid, c32(kb, 2 * VOTE_THREADS)));
    LLVMValueRef at = add(kb, tid, c32(kb, 3 * VOTE_THREADS));
    aj_kb_if_begin(kb, lt(kb, lane_id(kb), 16));
    {
        LLVMValueRef args[2] = {c32(kb, 0x0000ffff), pred};
        gstore(kb, aj_kb_intrinsic(kb, AJ_INTR_VOTE_BALLOT, args), "out", at);
    }
    aj_kb_else(kb);
    {
        LLVMValueRef args[2] = {c32(kb, (int32_t)0xffff0000u), pred};
        gstore(kb, as_i32(kb, aj_kb_intrinsic(kb, AJ_INTR_VOTE_ALL, args)), "out", at);
    }
    aj_kb_if_end(kb);
}

static void test_vote(void)
{
    /* warp 0: a pattern whose high half is all true; warp 1: all true;
     * warp 2: all false */
    static int32_t in[VOTE_THREADS];
    static uint32_t out[4 * VOTE_THREADS];
    for (int t = 0; t < VOTE_THREADS; t++)
        in[t] = t < 32 ? (t >= 16 || t % 3 == 0) * (t + 1) : t < 64 ? -t : 0;
    const test_kernel k = {"t_vote", VOTE_THREADS, 0, {"in", "out"}, vote_body, 0,
                           {"vote.sync.ballot.b32", "vote.sync.all.pred", "vote.sync.any.pred"}};
    void *bufs[] = {in, out};
    size_t bytes[] = {sizeof in, sizeof out};
    CHECK_STATUS(ctx, run(&k, bufs, bytes), AJ_OK);
    for (int w = 0; w < VOTE_THREADS / 32; w++) {
        uint32_t ballot = 0;
        for (int l = 0; l < 32; l++)
            ballot |= (uint32_t)(in[32 * w + l] != 0) << l;
        for (int l = 0; l < 32; l++) {
            int t = 32 * w + l;
            CHECK_MSG(out[t] == ballot, "ballot, thread %d: 0x%08x, want 0x%08x", t, out[t],
                      ballot);
            CHECK(out[VOTE_THREADS + t] == (ballot == 0xffffffffu));
            CHECK(out[2 * VOTE_THREADS + t] == (ballot != 0));
            uint32_t want = l < 16 ? ballot & 0xffff : (ballot >> 16) == 0xffff;
            CHECK_MSG(out[3 * VOTE_THREADS + t] == want, "masked vote, thread %d: 0x%08x, "
                      "want 0x%08x", t, out[3 * VOTE_THREADS + t], want);
        }
    }
    CHECK(out[0] == 0xffff9249u);   /* lanes 0, 3, 6, .., 15 and 16..31 */
}

/* ---------------------------------------------------------------- mma.sync */

/* C's fragment (16x8 f32, row-major in "c"): c[i] = C[g + 8 (i >> 1)][2t +
 * (i & 1)], and the elements' indices, where D's go too. */
static void mma_load_c(aj_kb *kb, LLVMValueRef g, LLVMValueRef t, LLVMValueRef c[4],
                       LLVMValueRef cd_at[4])
{
    LLVMValueRef t2 = mul(kb, t, c32(kb, 2));
    for (int i = 0; i < 4; i++) {
        LLVMValueRef row = add(kb, g, c32(kb, 8 * (i >> 1)));
        cd_at[i] = add(kb, mul(kb, row, c32(kb, 8)), add(kb, t2, c32(kb, i & 1)));
        c[i] = gload(kb, kb->t_f32, "c", cd_at[i]);
    }
}

/* The worst relative error of D (16x8) against C + A B in float64, A 16xK
 * and B Kx8 row-major; a NaN is infinitely bad. */
static double mma_worst(const float *c, const float *d, const double *a, const double *b, int K)
{
    double worst = 0;
    for (int m = 0; m < 16; m++)
        for (int n = 0; n < 8; n++) {
            double want = c[m * 8 + n];
            for (int kk = 0; kk < K; kk++)
                want += a[m * K + kk] * b[kk * 8 + n];
            double err = fabs(d[m * 8 + n] - want) / fmax(fabs(want), 1.0);
            if (!(err <= worst))
                worst = isnan(err) ? INFINITY : err;
        }
    return worst;
}

/*
 * Each lane loads its fragments by the PTX ISA's layout (lane = 4g + t):
 *
 *   a[r] = A[g + 8 (r & 1)][2t + 8 (r >> 1) + {0, 1}]     (row-major 16x16)
 *   b[r] = B[2t + 8 r + {0, 1}][g]                        (16x8, k x n)
 *   c[i] = C[g + 8 (i >> 1)][2t + (i & 1)], d[i] likewise (16x8)
 *
 * with {0, 1} the low and high half of the register.
 */
static void mma_body(aj_kb *kb, const test_kernel *k)
{
    LLVMValueRef lane = lane_id(kb);
    LLVMValueRef g = lshr(kb, lane, 2), t = and(kb, lane, c32(kb, 3));
    LLVMValueRef t2 = mul(kb, t, c32(kb, 2));
    LLVMValueRef a[4], b[2], c[4], d[4];
    for (int r = 0; r < 4; r++) {
        LLVMValueRef row = add(kb, g, c32(kb, 8 * (r & 1)));
        LLVMValueRef at = add(kb, mul(kb, row, c32(kb, 16)), add(kb, t2, c32(kb, 8 * (r >> 1))));
        a[r] = pack(kb, gload(kb, kb->t_i16, "a", at),
                    gload(kb, kb->t_i16, "a", add(kb, at, c32(kb, 1))));
    }
    for (int r = 0; r < 2; r++) {
        LLVMValueRef kk = add(kb, t2, c32(kb, 8 * r));
        LLVMValueRef at = add(kb, mul(kb, kk, c32(kb, 8)), g);
        b[r] = pack(kb, gload(kb, kb->t_i16, "b", at),
                    gload(kb, kb->t_i16, "b", add(kb, at, c32(kb, 8))));
    }
    LLVMValueRef cd_at[4];
    mma_load_c(kb, g, t, c, cd_at);
    aj_kb_mma_m16n8k16(kb, (aj_dtype)k->variant, a, b, c, d);
    for (int i = 0; i < 4; i++)
        gstore(kb, d[i], "d", cd_at[i]);
}

static void test_mma(aj_dtype dtype)
{
    static uint16_t a[16 * 16], b[16 * 8];
    static float c[16 * 8], d[16 * 8];
    double ad[16 * 16], bd[16 * 8];
    /* quarters in [-2, 2] are exact in both formats; for bf16 row 5 of A
     * is scaled by 2^17, beyond f16's range, so an f16 decoding would
     * show; every sum stays exact in f32 */
    for (int i = 0; i < 16 * 16; i++) {
        float f = (float)rand_int(-8, 8) * 0.25f;
        if (dtype == AJ_DTYPE_BF16 && i / 16 == 5)
            f *= 131072.0f;
        a[i] = dtype == AJ_DTYPE_F16 ? aj_f32_to_f16(f) : aj_f32_to_bf16(f);
        ad[i] = dtype == AJ_DTYPE_F16 ? aj_f16_to_f32(a[i]) : aj_bf16_to_f32(a[i]);
        CHECK(ad[i] == f);
    }
    for (int i = 0; i < 16 * 8; i++) {
        float f = (float)rand_int(-8, 8) * 0.25f;
        b[i] = dtype == AJ_DTYPE_F16 ? aj_f32_to_f16(f) : aj_f32_to_bf16(f);
        bd[i] = f;
        c[i] = (float)rand_int(-16, 16);
        d[i] = NAN;
    }
    char name[32];
    snprintf(name, sizeof name, "t_mma_%s", aj_dtype_name(dtype));
    const test_kernel k = {name, 32, 0, {"a", "b", "c", "d"}, mma_body, (int)dtype,
                           {dtype == AJ_DTYPE_F16
                                ? "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32"
                                : "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32"}};
    void *bufs[] = {a, b, c, d};
    size_t bytes[] = {sizeof a, sizeof b, sizeof c, sizeof d};
    CHECK_STATUS(ctx, run(&k, bufs, bytes), AJ_OK);
    double worst = mma_worst(c, d, ad, bd, 16);
    CHECK_MSG(worst <= 1e-6, "mma %s: relative error %g against the float64 product",
              aj_dtype_name(dtype), worst);
}

/*
 * mma.m16n8k32 with 8-bit floats (PTX ISA "Matrix Fragments for
 * mma.m16n8k32"): lane 4g + t loads 4 consecutive bytes per register,
 *
 *   a[r] = A[g + 8 (r & 1)][4t + 16 (r >> 1) + 0..3]      (row-major 16x32)
 *   b[r] = B[4t + 16 r + 0..3][g]                         (32x8, k x n; stored
 *                                                          as B^T, n-major)
 *   c, d as m16n8k16's
 */
static void mma8_body(aj_kb *kb, const test_kernel *k)
{
    LLVMValueRef lane = lane_id(kb);
    LLVMValueRef g = lshr(kb, lane, 2), t = and(kb, lane, c32(kb, 3));
    LLVMValueRef t4 = mul(kb, t, c32(kb, 4));
    LLVMValueRef a[4], b[2], c[4], d[4];
    for (int r = 0; r < 4; r++) {   /* byte offsets / 4: the u32 words */
        LLVMValueRef row = add(kb, g, c32(kb, 8 * (r & 1)));
        LLVMValueRef at = add(kb, mul(kb, row, c32(kb, 32)), add(kb, t4, c32(kb, 16 * (r >> 1))));
        a[r] = gload(kb, kb->t_i32, "a", lshr(kb, at, 2));
    }
    for (int r = 0; r < 2; r++) {
        LLVMValueRef at = add(kb, mul(kb, g, c32(kb, 32)), add(kb, t4, c32(kb, 16 * r)));
        b[r] = gload(kb, kb->t_i32, "b", lshr(kb, at, 2));
    }
    LLVMValueRef cd_at[4];
    mma_load_c(kb, g, t, c, cd_at);
    aj_kb_mma_m16n8k32(kb, (aj_dtype)(k->variant & 0xff), (aj_dtype)(k->variant >> 8), a, b, c,
                       d);
    for (int i = 0; i < 4; i++)
        gstore(kb, d[i], "d", cd_at[i]);
}

/* A of type `dtype`, B of `b_type` (e4m3 x e4m3, e5m2 x e5m2, e4m3 x e5m2) */
static void test_mma8(aj_dtype dtype, aj_dtype b_type)
{
    static uint8_t a[16 * 32], bt[8 * 32];   /* A row-major; B^T: bt[n * 32 + k] = B[k][n] */
    static float c[16 * 8], d[16 * 8];
    double ad[16 * 32], bd[32 * 8];
    /* quarters in [-2, 2] are exact in both formats; for e5m2 row 5 of A
     * is scaled by 2^10, beyond e4m3's 448, so an e4m3 decoding would
     * show; every sum stays exact in f32 */
    for (int i = 0; i < 16 * 32; i++) {
        float f = (float)rand_int(-8, 8) * 0.25f, back;
        if (dtype == AJ_DTYPE_F8E5M2 && i / 32 == 5)
            f *= 1024.0f;
        aj_convert(&f, AJ_DTYPE_F32, &a[i], dtype, 1);
        aj_convert(&a[i], dtype, &back, AJ_DTYPE_F32, 1);
        CHECK(back == f);
        ad[i] = f;
    }
    for (int kk = 0; kk < 32; kk++)
        for (int n = 0; n < 8; n++) {
            float f = (float)rand_int(-8, 8) * 0.25f;
            if (b_type == AJ_DTYPE_F8E5M2 && n == 3)   /* beyond e4m3's range */
                f *= 512.0f;
            aj_convert(&f, AJ_DTYPE_F32, &bt[n * 32 + kk], b_type, 1);
            bd[kk * 8 + n] = f;
        }
    for (int i = 0; i < 16 * 8; i++) {
        c[i] = (float)rand_int(-16, 16);
        d[i] = NAN;
    }
    char name[48], needle[64];
    snprintf(name, sizeof name, "t_mma8_%s_%s", aj_dtype_name(dtype), aj_dtype_name(b_type));
    snprintf(needle, sizeof needle, "mma.sync.aligned.m16n8k32.row.col.f32.%s.%s.f32",
             dtype == AJ_DTYPE_F8E4M3 ? "e4m3" : "e5m2", b_type == AJ_DTYPE_F8E4M3 ? "e4m3" : "e5m2");
    const test_kernel k = {name, 32, 0, {"a", "b", "c", "d"}, mma8_body,
                           (int)dtype | (int)b_type << 8, {needle, ".version 8.4"}};
    void *bufs[] = {a, bt, c, d};
    size_t bytes[] = {sizeof a, sizeof bt, sizeof c, sizeof d};
    CHECK_STATUS(ctx, run(&k, bufs, bytes), AJ_OK);
    double worst = mma_worst(c, d, ad, bd, 32);
    CHECK_MSG(worst <= 1e-6, "mma m16n8k32 %s x %s: relative error %g against the float64 "
              "product", aj_dtype_name(dtype), aj_dtype_name(b_type), worst);
    /* sm_80 has no FP8 tensor cores: the build says so */
    aj_compile_options opt = AJ_COMPILE_OPTIONS_INIT;
    opt.target = AJ_TARGET_SM_80;
    opt.emit = AJ_EMIT_PTX;
    aj_kernel *on80 = NULL;
    CHECK_STATUS(ctx, aj_codegen_run(ctx, op, &opt, k.name, build_test_kernel, (void *)&k, &on80),
                 AJ_ERR_UNSUPPORTED);
    CHECK_ERROR(ctx, "mma.m16n8k32 with 8-bit floats needs compute capability 8.9 or newer; "
                     "sm_80 has no FP8 tensor cores");
    aj_kernel_destroy(on80);
}

/* ---------------------------------------------------------------- ldmatrix */

/* Shared memory: matrix m, row r at byte (8 m + r) * 32 -- 16 bytes of
 * row, 16 of gap, so rows are not contiguous. */
#define LDM_PITCH 32

static const struct { int count, trans; } ldm_variants[] = {
    {1, 0}, {2, 0}, {4, 0}, {1, 1}, {2, 1}, {4, 1},
};

/* src: 4 matrices of 8x8 u16; out[(variant * 4 + m) * 32 + lane] */
static void ldmatrix_body(aj_kb *kb, const test_kernel *k)
{
    LLVMValueRef lane = lane_id(kb);
    /* each lane copies row `lane` (matrix lane / 8, row lane % 8) */
    for (int col = 0; col < 8; col++) {
        LLVMValueRef v = gload(kb, kb->t_i16, "src", add(kb, mul(kb, lane, c32(kb, 8)),
                                                          c32(kb, col)));
        LLVMValueRef off = add(kb, mul(kb, lane, c32(kb, LDM_PITCH)), c32(kb, 2 * col));
        aj_kb_store(kb, v, aj_kb_smem_ptr(kb, off), 2);
    }
    aj_kb_barrier(kb);
    LLVMValueRef row_addr = aj_kb_smem_ptr(kb, mul(kb, lane, c32(kb, LDM_PITCH)));
    for (int v = 0; v < 6; v++) {
        LLVMValueRef out[4];
        aj_kb_ldmatrix(kb, ldm_variants[v].count, ldm_variants[v].trans, row_addr, out);
        for (int m = 0; m < ldm_variants[v].count; m++)
            gstore(kb, out[m], "out", add(kb, lane, c32(kb, (v * 4 + m) * 32)));
    }
}

static void test_ldmatrix(void)
{
    static uint16_t src[4 * 64];
    static uint32_t out[6 * 4 * 32];
    for (int i = 0; i < 4 * 64; i++)
        src[i] = (uint16_t)(0x1000 * (i / 64) + i % 64 + 0x100);   /* matrix, row, col */
    const test_kernel k = {"t_ldmatrix", 32, 4 * 8 * LDM_PITCH, {"src", "out"}, ldmatrix_body,
                           0, {"ldmatrix.sync.aligned.m8n8.x1.shared.b16",
                               "ldmatrix.sync.aligned.m8n8.x2.trans.shared.b16",
                               "ldmatrix.sync.aligned.m8n8.x4.shared.b16",
                               "ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16"}};
    void *bufs[] = {src, out};
    size_t bytes[] = {sizeof src, sizeof out};
    CHECK_STATUS(ctx, run(&k, bufs, bytes), AJ_OK);
    /* lane 4g + t: row g, cols 2t, 2t+1; with .trans column g, rows 2t, 2t+1 */
    int wrong = 0;
    for (int v = 0; v < 6; v++)
        for (int m = 0; m < ldm_variants[v].count; m++)
            for (int lane = 0; lane < 32; lane++) {
                int g = lane / 4, t = lane % 4;
                const uint16_t *mat = &src[64 * m];
                uint32_t lo = ldm_variants[v].trans ? mat[(2 * t) * 8 + g] : mat[g * 8 + 2 * t];
                uint32_t hi = ldm_variants[v].trans ? mat[(2 * t + 1) * 8 + g]
                                                    : mat[g * 8 + 2 * t + 1];
                uint32_t got = out[(v * 4 + m) * 32 + lane];
                if (got != (lo | hi << 16) && wrong++ < 8)
                    fprintf(stderr, "ldmatrix x%d%s matrix %d lane %d: 0x%08x, want 0x%08x\n",
                            ldm_variants[v].count, ldm_variants[v].trans ? ".trans" : "", m,
                            lane, got, lo | hi << 16);
            }
    CHECK_MSG(wrong == 0, "%d ldmatrix registers differ from the PTX ISA's layout", wrong);
}

/* ---------------------------------------------------------------- cp.async */

/*
 * Per lane: copy 16 bytes of src into region 0 (group 0), 16 into region 1
 * (group 1), then read at each step (out[step * 32 + lane], first word):
 *   0: region 0 before any wait              -> the 0xFF fill
 *   1: region 0 after wait_group 1           -> the data
 *   2: region 1 after wait_group 1           -> the fill (group 1 pending)
 *   3: region 1 after wait_group 0           -> the data
 * then a zero-fill copy of lane % 17 bytes into region 2 and wait_all;
 * out[128 + 4 * lane + w] = its four words.
 */
static void cp_async_body(aj_kb *kb, const test_kernel *k)
{
    LLVMValueRef lane = lane_id(kb);
    LLVMValueRef at16 = mul(kb, lane, c32(kb, 16));
    LLVMValueRef region[3];
    for (int r = 0; r < 3; r++)
        region[r] = aj_kb_smem_ptr(kb, add(kb, at16, c32(kb, 512 * r)));
    LLVMValueRef src0 = gaddr(kb, "src", mul(kb, lane, c32(kb, 4)), 4);
    LLVMValueRef src1 = gaddr(kb, "src", add(kb, mul(kb, lane, c32(kb, 4)), c32(kb, 128)), 4);
    aj_kb_cp_async_16(kb, region[0], src0, NULL);
    aj_kb_cp_async_commit(kb);
    aj_kb_cp_async_16(kb, region[1], src1, NULL);
    aj_kb_cp_async_commit(kb);
    gstore(kb, aj_kb_load(kb, kb->t_f32, region[0], 4), "out", lane);
    aj_kb_cp_async_wait(kb, 1);
    gstore(kb, aj_kb_load(kb, kb->t_f32, region[0], 4), "out", add(kb, lane, c32(kb, 32)));
    gstore(kb, aj_kb_load(kb, kb->t_f32, region[1], 4), "out", add(kb, lane, c32(kb, 64)));
    aj_kb_cp_async_wait(kb, 0);
    gstore(kb, aj_kb_load(kb, kb->t_f32, region[1], 4), "out", add(kb, lane, c32(kb, 96)));

    LLVMValueRef src_bytes = LLVMBuildURem(kb->b, lane, c32(kb, 17), "");
    aj_kb_cp_async_16(kb, region[2], src0, src_bytes);
    aj_kb_cp_async_wait_all(kb);
    for (int w = 0; w < 4; w++) {
        LLVMValueRef word = aj_kb_load(kb, kb->t_i32,
                                       aj_kb_smem_ptr(kb, add(kb, at16, c32(kb, 1024 + 4 * w))), 4);
        gstore(kb, word, "out", add(kb, mul(kb, lane, c32(kb, 4)), c32(kb, 128 + w)));
    }
}

static void test_cp_async(void)
{
    static uint32_t src[2 * 32 * 4], out[128 + 32 * 4];
    for (int i = 0; i < 2 * 32 * 4; i++)
        src[i] = u32_of(0.5f * (float)i + 1.0f);
    const test_kernel k = {"t_cp_async", 32, 3 * 512, {"src", "out"}, cp_async_body, 0,
                           {"cp.async.cg.shared.global", "], 16, %r", "cp.async.commit_group",
                            "cp.async.wait_group 1", "cp.async.wait_all"}};
    void *bufs[] = {src, out};
    size_t bytes[] = {sizeof src, sizeof out};
    CHECK_STATUS(ctx, run(&k, bufs, bytes), AJ_OK);
    for (int l = 0; l < 32; l++) {
        CHECK_MSG(out[l] == 0xffffffffu && isnan(f32_of(out[l])),
                  "lane %d read 0x%08x before the wait: the copy was visible too early", l,
                  out[l]);
        CHECK_MSG(out[32 + l] == src[4 * l], "lane %d: group 0 after wait_group 1: 0x%08x",
                  l, out[32 + l]);
        CHECK_MSG(out[64 + l] == 0xffffffffu, "lane %d: group 1 landed at wait_group 1", l);
        CHECK_MSG(out[96 + l] == src[128 + 4 * l], "lane %d: group 1 after wait_group 0", l);
        const uint8_t *want = (const uint8_t *)&src[4 * l];
        const uint8_t *got = (const uint8_t *)&out[128 + 4 * l];
        int n = l % 17, ok = 1;
        for (int i = 0; i < 16; i++)
            ok &= got[i] == (i < n ? want[i] : 0);
        CHECK_MSG(ok, "lane %d: zero-fill copy of %d bytes is wrong", l, n);
    }
}

/* red.global.add.f32: every thread of 64 CTAs adds 1 to out[tid % 8] */
static void red_add_body(aj_kb *kb, const test_kernel *k)
{
    LLVMValueRef slot = and(kb, aj_kb_thread_id(kb), c32(kb, 7));
    LLVMValueRef args[2] = {gaddr(kb, "out", slot, 4), aj_kb_f32(kb, 1.0)};
    aj_kb_intrinsic(kb, AJ_INTR_RED_ADD_F32, args);
}

/* The emulator's CTAs run on several host threads, so red.add must be a
 * real atomic: 64 CTAs x 128 threads on 4 workers lose no update. */
static void test_red_add(void)
{
    static float out[8];
    const test_kernel k = {"t_red_add", 128, 0, {"out"}, red_add_body, 0,
                           {"red.global.add.f32"}};
    check_ptx(&k);
    aj_kernel *kern = compile(&k, AJ_TARGET_SIM);
    if (!kern)
        return;
    void *ptr = out, *args[1] = {&ptr};
    aj_sim_buffer buffer = {"out", out, sizeof out};
    aj_sim_launch launch = {
        .kernel_name = k.name,
        .entry = kern->stages[0].host_entry,
        .grid = {64, 1, 1},
        .block_threads = k.threads,
        .args = args,
        .buffers = &buffer,
        .num_buffers = 1,
        .workers = 4,
    };
    for (int rep = 0; rep < 3; rep++) {
        memset(out, 0, sizeof out);
        CHECK_STATUS(ctx, aj_sim_run(ctx, &launch), AJ_OK);
        for (int i = 0; i < 8; i++)
            CHECK_MSG(out[i] == 64 * 16, "run %d: out[%d] = %g, want 1024 (lost updates)", rep,
                      i, out[i]);
    }
    aj_kernel_destroy(kern);
}

/* ---------------------------------------------------------------- races */

/*
 * Strict mode's race detector.  Each kernel exchanges shared memory between
 * threads; `variant` picks the synchronisation between the write and the
 * read:
 */
enum sync_kind { SYNC_NONE, SYNC_BARRIER, SYNC_WARP };

static void sync_threads(aj_kb *kb, enum sync_kind sync)
{
    if (sync == SYNC_BARRIER) {
        aj_kb_barrier(kb);
    } else if (sync == SYNC_WARP) {
        LLVMValueRef mask = c32(kb, -1);
        aj_kb_intrinsic(kb, AJ_INTR_BAR_WARP_SYNC, &mask);
    }
}

/* Thread t stores in[t] at word t and reads word t ^ partner:
 * out[t] = in[t ^ partner] (partner 1: a lane of the same warp, 32: the
 * same lane of the other warp). */
static void exchange_body(aj_kb *kb, const test_kernel *k)
{
    int partner = k->variant >> 4;
    LLVMValueRef tid = aj_kb_thread_id(kb);
    LLVMValueRef v = gload(kb, kb->t_f32, "in", tid);
    aj_kb_store(kb, v, aj_kb_smem_ptr(kb, mul(kb, tid, c32(kb, 4))), 4);
    sync_threads(kb, (enum sync_kind)(k->variant & 15));
    LLVMValueRef other = LLVMBuildXor(kb->b, tid, c32(kb, partner), "");
    gstore(kb, aj_kb_load(kb, kb->t_f32, aj_kb_smem_ptr(kb, mul(kb, other, c32(kb, 4))), 4),
           "out", tid);
}

/* Thread t copies in[4t .. 4t+3] with cp.async into slot t, waits for it,
 * and reads slot t ^ 1: out[t] = in[4 (t ^ 1)]; variant 1 adds the
 * barrier after the wait.  Variant 2: a correct exchange, then a second
 * copy into slot t with no barrier after the neighbour's read of it. */
static void cp_async_exchange_body(aj_kb *kb, const test_kernel *k)
{
    LLVMValueRef tid = aj_kb_thread_id(kb);
    LLVMValueRef slot = aj_kb_smem_ptr(kb, mul(kb, tid, c32(kb, 16)));
    LLVMValueRef src = gaddr(kb, "in", mul(kb, tid, c32(kb, 4)), 4);
    aj_kb_cp_async_16(kb, slot, src, NULL);
    aj_kb_cp_async_wait_all(kb);
    if (k->variant >= 1)
        aj_kb_barrier(kb);
    LLVMValueRef other = LLVMBuildXor(kb->b, tid, c32(kb, 1), "");
    gstore(kb, aj_kb_load(kb, kb->t_f32, aj_kb_smem_ptr(kb, mul(kb, other, c32(kb, 16))), 4),
           "out", tid);
    if (k->variant == 2) {
        aj_kb_cp_async_16(kb, slot, src, NULL);
        aj_kb_cp_async_wait_all(kb);
    }
}

#define RACE_SEEDS 6

static void test_races(void)
{
    static const struct {
        test_kernel k;
        const char *needle;   /* NULL: race-free, out[t] = in[partner(t)] */
        const char *op;       /* what the race message names: either of the accesses */
    } cases[] = {
        {{"t_race_lanes", 32, 256, {"in", "out"}, exchange_body, 1 << 4 | SYNC_NONE, {0}},
         "shared-memory race: ", "store"},
        {{"t_race_lanes_barrier", 32, 256, {"in", "out"}, exchange_body,
          1 << 4 | SYNC_BARRIER, {"bar.sync"}}, NULL, NULL},
        {{"t_race_lanes_warp_sync", 32, 256, {"in", "out"}, exchange_body, 1 << 4 | SYNC_WARP,
          {"bar.warp.sync"}}, NULL, NULL},
        {{"t_race_warps_warp_sync", 64, 256, {"in", "out"}, exchange_body,
          32 << 4 | SYNC_WARP, {0}}, "shared-memory race: ", "store"},
        {{"t_race_warps_barrier", 64, 256, {"in", "out"}, exchange_body,
          32 << 4 | SYNC_BARRIER, {0}}, NULL, NULL},
        {{"t_race_cp_async", 32, 512, {"in", "out"}, cp_async_exchange_body, 0, {0}},
         "shared-memory race: ", "cp.async"},
        {{"t_race_cp_async_barrier", 32, 512, {"in", "out"}, cp_async_exchange_body, 1, {0}},
         NULL, NULL},
        {{"t_race_cp_async_reuse", 32, 512, {"in", "out"}, cp_async_exchange_body, 2, {0}},
         "shared-memory race: ", "cp.async"},
    };
    static float in[128], out[64];
    for (int i = 0; i < 128; i++)
        in[i] = 0.5f * (float)i + 1.0f;
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        const test_kernel *k = &cases[i].k;
        check_ptx(k);
        /* the race shows whichever thread runs first: every seed finds it */
        for (sim_seed = 1; sim_seed <= RACE_SEEDS; sim_seed++) {
            for (int t = 0; t < 64; t++)
                out[t] = NAN;
            void *bufs[] = {in, out};
            size_t bytes[] = {sizeof in, sizeof out};
            aj_status st = run_sim(k, bufs, bytes);
            if (!cases[i].needle) {
                CHECK_MSG(st == AJ_OK, "%s, seed %llu: %s", k->name,
                          (unsigned long long)sim_seed, aj_last_error(ctx));
                int partner = k->body == exchange_body ? k->variant >> 4 : 1;
                int scale = k->body == exchange_body ? 1 : 4;
                for (int t = 0; t < k->threads; t++)
                    CHECK_MSG(out[t] == in[scale * (t ^ partner)], "%s, thread %d: %g, want %g",
                              k->name, t, out[t], in[scale * (t ^ partner)]);
                continue;
            }
            CHECK_MSG(st == AJ_ERR_KERNEL_FAULT, "%s, seed %llu: %s, want a race", k->name,
                      (unsigned long long)sim_seed, aj_status_str(st));
            char seed[64];
            snprintf(seed, sizeof seed, "AJ_SIM_SEED=%llu reproduces",
                     (unsigned long long)sim_seed);
            CHECK_ERROR(ctx, cases[i].needle);
            CHECK_ERROR(ctx, cases[i].op);
            CHECK_ERROR(ctx, k->name);
            CHECK_ERROR(ctx, "with no barrier in between");
            CHECK_ERROR(ctx, seed);
        }
    }
    sim_seed = 0;
}

/* ---------------------------------------------------------------- detectors */

static void oob_load_body(aj_kb *kb, const test_kernel *k)
{
    LLVMValueRef tid = aj_kb_thread_id(kb);
    gstore(kb, gload(kb, kb->t_f32, "in", add(kb, tid, c32(kb, 1))), "out", tid);
}

static void oob_store_body(aj_kb *kb, const test_kernel *k)
{
    gstore(kb, aj_kb_f32(kb, 1.0), "out", add(kb, aj_kb_thread_id(kb), c32(kb, 8)));
}

static void oob_shared_body(aj_kb *kb, const test_kernel *k)
{
    LLVMValueRef off = add(kb, mul(kb, aj_kb_thread_id(kb), c32(kb, 4)), c32(kb, 4));
    aj_kb_store(kb, aj_kb_f32(kb, 1.0), aj_kb_smem_ptr(kb, off), 4);
}

static void misaligned_body(aj_kb *kb, const test_kernel *k)
{
    LLVMValueRef tid = aj_kb_thread_id(kb);
    LLVMValueRef off = add(kb, mul(kb, tid, c32(kb, 4)), c32(kb, 2));
    LLVMValueRef p = aj_kb_gptr_offset(kb, aj_kb_param(kb, "in"),
                                       LLVMBuildSExt(kb->b, off, kb->t_i64, ""));
    gstore(kb, aj_kb_load(kb, kb->t_f32, p, 4), "out", tid);
}

/* the two branches store different values first, so that no pass can
 * merge their barriers into one */
static void barrier_divergence_body(aj_kb *kb, const test_kernel *k)
{
    LLVMValueRef tid = aj_kb_thread_id(kb);
    aj_kb_if_begin(kb, lt(kb, tid, 16));
    gstore(kb, aj_kb_f32(kb, 1.0), "out", tid);
    aj_kb_barrier(kb);
    aj_kb_else(kb);
    gstore(kb, aj_kb_f32(kb, 2.0), "out", tid);
    aj_kb_barrier(kb);
    aj_kb_if_end(kb);
}

static void barrier_exited_body(aj_kb *kb, const test_kernel *k)
{
    aj_kb_if_begin(kb, lt(kb, aj_kb_thread_id(kb), 16));
    aj_kb_barrier(kb);
    aj_kb_if_end(kb);
}

static void shfl_exited_body(aj_kb *kb, const test_kernel *k)
{
    LLVMValueRef tid = aj_kb_thread_id(kb);
    aj_kb_if_begin(kb, lt(kb, tid, 16));
    LLVMValueRef args[4] = {c32(kb, -1), aj_kb_f32(kb, 1.0), c32(kb, 0), c32(kb, 0x1f)};
    gstore(kb, aj_kb_intrinsic(kb, AJ_INTR_SHFL_IDX_F32, args), "out", tid);
    aj_kb_if_end(kb);
}

static void shfl_outside_mask_body(aj_kb *kb, const test_kernel *k)
{
    LLVMValueRef tid = aj_kb_thread_id(kb);
    aj_kb_if_begin(kb, lt(kb, tid, 16));
    LLVMValueRef args[4] = {c32(kb, 0xffff), aj_kb_f32(kb, 1.0), add(kb, tid, c32(kb, 16)),
                            c32(kb, 0x1f)};
    gstore(kb, aj_kb_intrinsic(kb, AJ_INTR_SHFL_IDX_F32, args), "out", tid);
    aj_kb_if_end(kb);
}

static void mma_missing_lanes_body(aj_kb *kb, const test_kernel *k)
{
    LLVMValueRef tid = aj_kb_thread_id(kb);
    aj_kb_if_begin(kb, lt(kb, tid, 16));
    LLVMValueRef z = c32(kb, 0), zf = aj_kb_f32(kb, 0.0);
    LLVMValueRef a[4] = {z, z, z, z}, b[2] = {z, z}, c[4] = {zf, zf, zf, zf}, d[4];
    aj_kb_mma_m16n8k16(kb, AJ_DTYPE_F16, a, b, c, d);
    gstore(kb, d[0], "out", tid);
    aj_kb_if_end(kb);
}

static void cp_async_oob_body(aj_kb *kb, const test_kernel *k)
{
    LLVMValueRef tid = aj_kb_thread_id(kb);
    LLVMValueRef dst = aj_kb_smem_ptr(kb, mul(kb, tid, c32(kb, 16)));
    aj_kb_cp_async_16(kb, dst, gaddr(kb, "in", mul(kb, tid, c32(kb, 4)), 4), NULL);
    aj_kb_cp_async_wait_all(kb);
}

static void ldmatrix_misaligned_body(aj_kb *kb, const test_kernel *k)
{
    LLVMValueRef off = add(kb, mul(kb, lane_id(kb), c32(kb, 16)), c32(kb, 8));
    LLVMValueRef out[4];
    aj_kb_ldmatrix(kb, 1, 0, aj_kb_smem_ptr(kb, off), out);
    gstore(kb, out[0], "out", aj_kb_thread_id(kb));
}

/* Each broken kernel fails with AJ_ERR_KERNEL_FAULT and says why. */
static void red_add_oob_body(aj_kb *kb, const test_kernel *k)
{
    LLVMValueRef args[2] = {gaddr(kb, "out", add(kb, aj_kb_thread_id(kb), c32(kb, 8)), 4),
                            aj_kb_f32(kb, 1.0)};
    aj_kb_intrinsic(kb, AJ_INTR_RED_ADD_F32, args);
}

/* The fault names one thread of [lo, hi] as the one at fault. */
static void check_faulting_thread(const char *kernel, int lo, int hi)
{
    const char *at = strstr(aj_last_error(ctx), "): thread ");
    int tid = -1;
    CHECK_MSG(at && sscanf(at, "): thread %d:", &tid) == 1 && tid >= lo && tid <= hi,
              "%s: the fault should name one of threads %d..%d: %s", kernel, lo, hi,
              aj_last_error(ctx));
}

static void test_detectors(void)
{
    /* faulty: the threads that fault; the strict emulator's random order
     * decides which of them faults first and is named */
    static const struct {
        test_kernel k;
        int faulty[2];
        const char *needles[4];
    } cases[] = {
        {{"t_oob_load", 32, 0, {"in", "out"}, oob_load_body, 0, {0}}, {31, 31},
         {"out-of-bounds global load of 4 bytes", "past the end of 'in'"}},
        {{"t_oob_store", 32, 0, {"in", "out"}, oob_store_body, 0, {0}}, {24, 31},
         {"out-of-bounds global store of 4 bytes", "past the end of 'out'"}},
        {{"t_oob_shared", 32, 128, {"in", "out"}, oob_shared_body, 0, {0}}, {31, 31},
         {"out-of-bounds shared store of 4 bytes at offset 128"}},
        {{"t_misaligned", 32, 0, {"in", "out"}, misaligned_body, 0, {0}}, {0, 31},
         {"misaligned global load of 4 bytes"}},
        {{"t_barrier_divergence", 32, 0, {"in", "out"}, barrier_divergence_body, 0, {0}},
         {-1, -1},
         {"barrier divergence: thread 0 waits at barrier", "thread 16 at barrier"}},
        {{"t_barrier_exited", 32, 0, {"in", "out"}, barrier_exited_body, 0, {0}}, {-1, -1},
         {"barrier divergence: thread 0", "thread 16 never reaches (it has exited)"}},
        {{"t_shfl_exited", 32, 0, {"in", "out"}, shfl_exited_body, 0, {0}}, {-1, -1},
         {"deadlock: thread 0 waits in shfl.sync.idx (membermask 0xffffffff)",
          "lanes 0xffff0000", "lane 16 has exited"}},
        {{"t_shfl_outside_mask", 32, 0, {"in", "out"}, shfl_outside_mask_body, 0, {0}},
         {-1, -1},
         {"thread 0: shfl.sync.idx reads lane 16", "not in its membermask 0x0000ffff"}},
        {{"t_mma_missing_lanes", 32, 0, {"in", "out"}, mma_missing_lanes_body, 0, {0}},
         {-1, -1},
         {"deadlock: thread 0 waits in mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32",
          "all 32 lanes", "lane 16 has exited"}},
        {{"t_cp_async_oob", 32, 512, {"in", "out"}, cp_async_oob_body, 0, {0}}, {8, 31},
         {"out-of-bounds global cp.async read of 16 bytes", "past the end of 'in'"}},
        {{"t_red_add_oob", 32, 0, {"in", "out"}, red_add_oob_body, 0, {0}}, {24, 31},
         {"out-of-bounds global red.add of 4 bytes", "past the end of 'out'"}},
        {{"t_ldmatrix_misaligned", 32, 512, {"in", "out"}, ldmatrix_misaligned_body, 0, {0}},
         {0, 7}, {"misaligned shared ldmatrix row read of 16 bytes", "16-byte alignment"}},
    };
    /* in and out apart, so that an access past one does not land in the other */
    static float memory[256];
    float *in = memory, *out = memory + 128;
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        void *bufs[] = {in, out};
        size_t bytes[] = {32 * sizeof *in, 32 * sizeof *out};
        aj_status st = run(&cases[i].k, bufs, bytes);
        CHECK_MSG(st == AJ_ERR_KERNEL_FAULT, "%s: %s (%s)", cases[i].k.name, aj_status_str(st),
                  aj_last_error(ctx));
        char kernel_name[64];
        snprintf(kernel_name, sizeof kernel_name, "kernel %s, CTA (0,0,0): ", cases[i].k.name);
        CHECK_ERROR(ctx, kernel_name);
        for (int n = 0; n < 4 && cases[i].needles[n]; n++)
            CHECK_ERROR(ctx, cases[i].needles[n]);
        if (cases[i].faulty[0] >= 0)
            check_faulting_thread(cases[i].k.name, cases[i].faulty[0], cases[i].faulty[1]);
    }
}

int main(void)
{
    have_ptxas = kb_kernel_setup(&ctx, &op, ptxas, sizeof ptxas, "sm_80 and sm_90");

    test_symbols_match_table();
    test_shfl();
    test_vote();
    test_mma(AJ_DTYPE_F16);
    test_mma(AJ_DTYPE_BF16);
    test_mma8(AJ_DTYPE_F8E4M3, AJ_DTYPE_F8E4M3);
    test_mma8(AJ_DTYPE_F8E5M2, AJ_DTYPE_F8E5M2);
    test_mma8(AJ_DTYPE_F8E4M3, AJ_DTYPE_F8E5M2);
    test_ldmatrix();
    test_cp_async();
    test_red_add();
    test_detectors();
    test_races();

    printf("PTX: %d kernels generated, %d assembled by ptxas (sm_80, sm_90; FP8 mma: sm_89, "
           "sm_90)\n", ptx_kernels, ptx_assembled);
    aj_op_destroy(op);
    aj_ctx_destroy(ctx);
    return check_report();
}
