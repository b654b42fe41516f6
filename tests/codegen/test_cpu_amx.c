/*
 * test_cpu_amx.c -- the AMX tiles of the cpu target (codegen/amx.h,
 * docs/cpu.md "AMX tiles"):
 *
 *   stand-in   tdpbf16ps and the tile moves against their definition in
 *              Intel's AMX reference: sums against float64, exact integer
 *              products, the two products of a pair added in order, DAZ on
 *              inputs, FTZ on results, partial shapes and row strides; the
 *              faults (#UD) a wrong configuration or shape raises
 *   selection  which kernels take the tiles under AJ_CPU_AMX (bf16 with
 *              head dims and block_m multiples of 32; not f16, not d 80, not
 *              block_m 16, not off), the cache key moving with the mode, a
 *              bad AJ_CPU_AMX refused, aj_cpu_describe's AMX line
 *   hardware   on a host whose AMX runs: tdpbf16ps itself against float64
 *              within the bound the stand-in is held to (the order of its
 *              sums is not the stand-in's: the bits that differ are
 *              counted and printed, docs/cpu.md "AMX tiles")
 *   native     AJ_CPU_AMX=native: the forward's IR calls the tile
 *              intrinsics, LLVM compiles them to ldtilecfg / tileloadd /
 *              tdpbf16ps / tilestored / tilerelease, the kernel compiles to
 *              object code, and a host without AMX refuses the cpu device
 *
 * The numbers of whole kernels on the tiles are the numeric tests run again
 * with AJ_CPU_AMX=standin (tests/CMakeLists.txt, label cpu_isa).
 */
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
#define HAVE_TILE_ASM 1
#endif
#include <math.h>
#include <signal.h>
#include <stdint.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <llvm-c/IRReader.h>
#include <llvm-c/Target.h>
#include <llvm-c/TargetMachine.h>

#include "check.h"
#include "check_compile.h"
#include "codegen/amx.h"
#include "codegen/codegen.h"
#include "ir/dtype.h"
#include "splitmix.h"

static aj_ctx *ctx;

/* uniform in [0, 1) */
static double uniform(uint64_t *rng)
{
    return (double)(splitmix_next(rng) >> 11) * 0x1p-53;
}

/* ---------------------------------------------------------------- stand-in */

/* A palette-1 block: tile t rows[t] x colsb[t] */
static void config(uint8_t cfg[64], const int rows[8], const int colsb[8])
{
    memset(cfg, 0, 64);
    cfg[0] = 1;
    for (int t = 0; t < 8; t++) {
        cfg[16 + 2 * t] = (uint8_t)colsb[t];
        cfg[48 + t] = (uint8_t)rows[t];
    }
}

static void config_full(uint8_t cfg[64])
{
    const int rows[8] = {16, 16, 16, 16, 16, 16, 16, 16};
    const int colsb[8] = {64, 64, 64, 64, 64, 64, 64, 64};
    config(cfg, rows, colsb);
}

/* C (m x n f32, ldc) += A (m x 2kp bf16, or f16 with f16 set) B (kp x n
 * pairs), through tiles 0 (C), 1 (A), 2 (B) shaped to fit */
static void standin_product_of(int f16, int m, int kp, int n, float *c, int ldc,
                               const uint16_t *a, int lda, const uint16_t *b, int ldb)
{
    static aj_amx_file file;
    uint8_t cfg[64];
    const int rows[8] = {m, m, kp, 0, 0, 0, 0, 0};
    const int colsb[8] = {4 * n, 4 * kp, 4 * n, 0, 0, 0, 0, 0};
    config(cfg, rows, colsb);
    aj_amx_standin_ldtilecfg(&file, cfg);
    aj_amx_standin_tileloadd(&file, 0, c, 4 * ldc);
    aj_amx_standin_tileloadd(&file, 1, a, 2 * lda);
    aj_amx_standin_tileloadd(&file, 2, b, 2 * ldb);
    if (f16)
        aj_amx_standin_tdpfp16ps(&file, 0, 1, 2);
    else
        aj_amx_standin_tdpbf16ps(&file, 0, 1, 2);
    aj_amx_standin_tilestored(&file, 0, c, 4 * ldc);
    aj_amx_standin_tilerelease(&file);
}

static void standin_product(int m, int kp, int n, float *c, int ldc, const uint16_t *a, int lda,
                            const uint16_t *b, int ldb)
{
    standin_product_of(0, m, kp, n, c, ldc, a, lda, b, ldb);
}

/* The float64 sums of C (m x n, ldc) += A (m x 2kp bf16, lda) B (kp pair
 * rows of n pairs, ldb) added to want, and their products' magnitudes to
 * mag (the caller starts both at C and |C|) */
static void reference_product(int m, int kp, int n, const uint16_t *a, int lda,
                              const uint16_t *b, int ldb, double *want, double *mag, int ldc)
{
    for (int i = 0; i < m; i++)
        for (int j = 0; j < n; j++)
            for (int k = 0; k < 2 * kp; k++) {
                double p = (double)aj_bf16_to_f32(a[i * lda + k]) *
                           aj_bf16_to_f32(b[k / 2 * ldb + 2 * j + k % 2]);
                want[i * ldc + j] += p;
                mag[i * ldc + j] += fabs(p);
            }
}

/* Full and partial shapes, strided rows, random bf16: each C against the
 * float64 sum (32 products of f32-exact terms: relative 2^-20 of the sum of
 * magnitudes), and rows and columns outside the tile untouched. */
static void test_standin_sums(void)
{
    static const int shapes[][3] = {{16, 16, 16}, {4, 4, 8}, {1, 1, 1}, {16, 3, 5}, {7, 16, 16}};
    uint64_t rng = 7;
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
        int m = shapes[s][0], kp = shapes[s][1], n = shapes[s][2];
        enum { LD = 40 };   /* row strides wider than any tile */
        float c[17 * LD];
        uint16_t a[17 * LD], b[17 * LD];
        double want[17 * LD], mag[17 * LD];
        for (int i = 0; i < 17 * LD; i++) {
            c[i] = (float)(uniform(&rng) * 4 - 2);
            a[i] = aj_f32_to_bf16((float)(uniform(&rng) * 2 - 1));
            b[i] = aj_f32_to_bf16((float)(uniform(&rng) * 2 - 1));
            want[i] = c[i];
            mag[i] = fabs(c[i]);
        }
        reference_product(m, kp, n, a, LD, b, LD, want, mag, LD);
        standin_product(m, kp, n, c, LD, a, LD, b, LD);
        int bad = 0;
        for (int i = 0; i < 17; i++)
            for (int j = 0; j < LD; j++) {
                double tol = i < m && j < n ? mag[i * LD + j] * 0x1p-20 : 0;
                bad += fabs(c[i * LD + j] - want[i * LD + j]) > tol;
            }
        CHECK_MSG(bad == 0, "shape m %d kp %d n %d: %d elements off", m, kp, n, bad);
    }
}

/* Small integers are exact in bf16 and their sums in f32: C must equal the
 * integer product exactly. */
static void test_standin_exact(void)
{
    uint16_t a[16 * 32], b[16 * 32];
    float c[16 * 16];
    long want[16 * 16];
    uint64_t rng = 11;
    for (int i = 0; i < 16 * 32; i++) {
        a[i] = aj_f32_to_bf16((float)((int)(uniform(&rng) * 31) - 15));
        b[i] = aj_f32_to_bf16((float)((int)(uniform(&rng) * 31) - 15));
    }
    for (int i = 0; i < 16; i++)
        for (int j = 0; j < 16; j++) {
            c[i * 16 + j] = (float)(i - j);
            want[i * 16 + j] = i - j;
            for (int k = 0; k < 32; k++)
                want[i * 16 + j] += (long)aj_bf16_to_f32(a[i * 32 + k]) *
                                    (long)aj_bf16_to_f32(b[(k / 2) * 32 + 2 * j + k % 2]);
        }
    standin_product(16, 16, 16, c, 16, a, 32, b, 32);
    int bad = 0;
    for (int i = 0; i < 256; i++)
        bad += c[i] != (float)want[i];
    CHECK_MSG(bad == 0, "%d of 256 integer products differ", bad);
}

/* One pair into one C element: c + a0 b0 + a1 b1, in that order. */
static float one_pair(float c, float a0, float b0, float a1, float b1)
{
    uint16_t a[2] = {aj_f32_to_bf16(a0), aj_f32_to_bf16(a1)};
    uint16_t b[2] = {aj_f32_to_bf16(b0), aj_f32_to_bf16(b1)};
    standin_product(1, 1, 1, &c, 1, a, 2, b, 2);
    return c;
}

static void test_standin_rounding(void)
{
    /* the stand-in's order (the Intrinsics Guide's, codegen/amx.h): 1 +
     * 2^-24 ties to 1, twice; the products summed first would make
     * 1 + 2^-23 */
    CHECK(one_pair(1.0f, 0x1p-12f, 0x1p-12f, 0x1p-12f, 0x1p-12f) == 1.0f);
    /* a denormal bf16 input reads as zero (DAZ): 2^-130 x 2^100 adds nothing */
    uint16_t tiny = 0x0001;   /* the smallest bf16 denormal */
    float tiny_f;
    uint32_t u = (uint32_t)tiny << 16;
    memcpy(&tiny_f, &u, sizeof tiny_f);
    CHECK(one_pair(0.5f, tiny_f, 0x1p100f, 0.0f, 0.0f) == 0.5f);
    /* a denormal result is flushed, keeping its sign (FTZ; -0 + -0 then
     * stays -0) */
    float r = one_pair(0.0f, -0x1p-70f, 0x1p-70f, -0.0f, 0.0f);
    CHECK(r == 0.0f && signbit(r));
    CHECK(one_pair(0.0f, 0x1p-60f, 0x1p-60f, 0.0f, 0.0f) == 0x1p-120f);   /* normal: kept */
    /* infinities and NaN go through */
    CHECK(isinf(one_pair(0.0f, INFINITY, 2.0f, 0.0f, 0.0f)));
    CHECK(isnan(one_pair(0.0f, INFINITY, 0.0f, 0.0f, 0.0f)));
}

/* v 2^exp2 as an f16 (exact for the small integers and powers of two used) */
static uint16_t f16_of(int v, int exp2)
{
    return aj_f32_to_f16(ldexpf((float)v, exp2));
}

/* tdpfp16ps: exact integer products, denormal f16 inputs counted (no DAZ),
 * a denormal accumulator flushed as bf16's is */
static void test_standin_f16(void)
{
    uint16_t a[16 * 32], b[16 * 32];
    float c[16 * 16];
    long want[16 * 16];
    uint64_t rng = 13;
    int av[16 * 32], bv[16 * 32];
    for (int i = 0; i < 16 * 32; i++) {
        av[i] = (int)(uniform(&rng) * 61) - 30;
        bv[i] = (int)(uniform(&rng) * 61) - 30;
        a[i] = f16_of(av[i], 0);
        b[i] = f16_of(bv[i], 0);
    }
    for (int i = 0; i < 16; i++)
        for (int j = 0; j < 16; j++) {
            c[i * 16 + j] = (float)(2 * i - j);
            want[i * 16 + j] = 2 * i - j;
            for (int k = 0; k < 32; k++)
                want[i * 16 + j] += (long)av[i * 32 + k] * bv[(k / 2) * 32 + 2 * j + k % 2];
        }
    standin_product_of(1, 16, 16, 16, c, 16, a, 32, b, 32);
    int bad = 0;
    for (int i = 0; i < 256; i++)
        bad += c[i] != (float)want[i];
    CHECK_MSG(bad == 0, "f16: %d of 256 integer products differ", bad);
    /* 2^-24 (the smallest f16 denormal) x 2^14 adds 2^-10 */
    uint16_t a2[2] = {0x0001, 0}, b2[2] = {f16_of(1, 14), 0};
    float acc = 0.5f;
    standin_product_of(1, 1, 1, 1, &acc, 1, a2, 2, b2, 2);
    CHECK_MSG(acc == 0.5f + 0x1p-10f, "f16 denormal input: %a", acc);
    /* a denormal accumulator plus 0: flushed, by either product */
    for (int f16 = 0; f16 < 2; f16++) {
        uint16_t z[2] = {0, 0};
        float den = 0x1p-140f;
        standin_product_of(f16, 1, 1, 1, &den, 1, z, 2, z, 2);
        CHECK_MSG(den == 0.0f, "%s: a denormal C stays %a", f16 ? "f16" : "bf16", den);
    }
}

/* tilezero, load / store strides, release forgetting the configuration */
static void test_standin_moves(void)
{
    static aj_amx_file file;
    uint8_t cfg[64];
    config_full(cfg);
    aj_amx_standin_ldtilecfg(&file, cfg);
    float src[16][20], dst[16][20];
    for (int i = 0; i < 16; i++)
        for (int j = 0; j < 20; j++) {
            src[i][j] = (float)(i * 100 + j);
            dst[i][j] = -1;
        }
    aj_amx_standin_tileloadd(&file, 3, src, sizeof src[0]);
    aj_amx_standin_tilestored(&file, 3, dst, sizeof dst[0]);
    int bad = 0;
    for (int i = 0; i < 16; i++)
        for (int j = 0; j < 20; j++)
            bad += dst[i][j] != (j < 16 ? src[i][j] : -1.0f);
    CHECK_MSG(bad == 0, "load / store of 16 x 64 bytes, stride 80: %d elements off", bad);
    aj_amx_standin_tilezero(&file, 3);
    aj_amx_standin_tilestored(&file, 3, dst, sizeof dst[0]);
    bad = 0;
    for (int i = 0; i < 16; i++)
        for (int j = 0; j < 16; j++)
            bad += dst[i][j] != 0.0f;
    CHECK_MSG(bad == 0, "tilezero: %d elements not zero", bad);
    aj_amx_standin_tilerelease(&file);
    CHECK(file.configured == 0);
}

/* The child runs `what` on a fresh file; it must abort with a message. */
static void expect_fault(const char *label, int what)
{
    fflush(NULL);
    pid_t pid = fork();
    if (pid == 0) {
        static aj_amx_file file;
        uint8_t cfg[64];
        freopen("/dev/null", "w", stderr);
        config_full(cfg);
        if (what == 0) {   /* no ldtilecfg */
            aj_amx_standin_tilezero(&file, 0);
        } else if (what == 1) {   /* palette 2 */
            cfg[0] = 2;
            aj_amx_standin_ldtilecfg(&file, cfg);
        } else if (what == 2) {   /* C.rows != A.rows */
            const int rows[8] = {16, 8, 16, 0, 0, 0, 0, 0}, colsb[8] = {64, 64, 64};
            config(cfg, rows, colsb);
            aj_amx_standin_ldtilecfg(&file, cfg);
            aj_amx_standin_tdpbf16ps(&file, 0, 1, 2);
        } else if (what == 3) {   /* A.colsb != 4 B.rows */
            const int rows[8] = {16, 16, 8, 0, 0, 0, 0, 0}, colsb[8] = {64, 64, 64};
            config(cfg, rows, colsb);
            aj_amx_standin_ldtilecfg(&file, cfg);
            aj_amx_standin_tdpbf16ps(&file, 0, 1, 2);
        } else if (what == 4) {   /* an unconfigured tile */
            const int rows[8] = {16, 16, 16, 0, 0, 0, 0, 0}, colsb[8] = {64, 64, 64};
            config(cfg, rows, colsb);
            aj_amx_standin_ldtilecfg(&file, cfg);
            aj_amx_standin_tdpbf16ps(&file, 0, 1, 5);
        } else {   /* 17 rows */
            cfg[48] = 17;
            aj_amx_standin_ldtilecfg(&file, cfg);
        }
        _exit(0);
    }
    int status = 0;
    CHECK(pid > 0 && waitpid(pid, &status, 0) == pid);
    CHECK_MSG(WIFSIGNALED(status) && WTERMSIG(status) == SIGABRT, "%s: not a fault", label);
}

static void test_standin_faults(void)
{
    expect_fault("a tile before ldtilecfg", 0);
    expect_fault("palette 2", 1);
    expect_fault("C rows != A rows", 2);
    expect_fault("A colsb != 4 B rows", 3);
    expect_fault("an unconfigured tile", 4);
    expect_fault("17 rows", 5);
}

/* --------------------------------------------------------------- kernels */

/* The LLVM IR text of a cpu kernel of `spec` (freed by the caller), or NULL */
static char *cpu_ir(const char *spec)
{
    aj_compile_options opt = AJ_COMPILE_OPTIONS_INIT;
    opt.target = AJ_TARGET_CPU;
    opt.emit = AJ_EMIT_LLVM_IR;
    aj_kernel *k = check_compile(ctx, spec, "spec", &opt);
    if (!k)
        return NULL;
    size_t size = 0;
    const char *code = aj_kernel_code(k, &size);
    char *text = malloc(size + 1);
    if (text) {
        memcpy(text, code, size);
        text[size] = '\0';
    }
    aj_kernel_destroy(k);
    return text;
}

static char *fwd_spec(char *buf, size_t cap, const char *dtype, int d, const char *extra)
{
    snprintf(buf, cap, "attention forward flash { dtype = %s head_dim = %d "
             "mask = causal(top_left) %s }", dtype, d, extra);
    return buf;
}

/* Whether the kernel of the spec calls `symbol` */
static int calls(const char *spec, const char *symbol)
{
    char *ir = cpu_ir(spec);
    int found = ir && strstr(ir, symbol) != NULL;
    free(ir);
    return found;
}

static void test_selection(void)
{
    char spec[256], id_off[128], id_standin[128];
    static const char standin[] = "@aj_amx_standin_tdpbf16ps";
    setenv("AJ_CPU_AMX", "standin", 1);
    aj_host_cpu_id(id_standin, sizeof id_standin);
    /* the stand-in's kernels are an AMX host's: 16 wide on any AVX host
     * (split by LLVM without AVX-512), so the selection below runs there */
    CHECK_MSG(aj_cpu_vector_width() == 16 || !aj_cpu_has_feature("avx"),
              "AJ_CPU_AMX=standin: %d-wide vectors", aj_cpu_vector_width());
    if (aj_cpu_vector_width() == 16) {
        for (int d = 32; d <= 512; d += 32) {
            CHECK_MSG(calls(fwd_spec(spec, sizeof spec, "bf16", d, ""), standin),
                      "bf16 d%d: no tile products", d);
        }
        CHECK(calls("attention forward flash { dtype = bf16 head_dim = 128 head_dim_v = 64 "
                    "mask = causal(bottom_right) layout = paged }", standin));
        CHECK(!calls(fwd_spec(spec, sizeof spec, "bf16", 80, ""), standin));
        CHECK(!calls("attention forward flash { dtype = bf16 head_dim = 128 head_dim_v = 48 }",
                     standin));
        CHECK(!calls(fwd_spec(spec, sizeof spec, "bf16", 128, "schedule = (block_m = 16)"),
                     standin));
        /* f16: tdpfp16ps (amx-fp16) */
        static const char standin16[] = "@aj_amx_standin_tdpfp16ps";
        for (int d = 32; d <= 512; d += 160)
            CHECK_MSG(calls(fwd_spec(spec, sizeof spec, "f16", d, ""), standin16) &&
                          !calls(spec, standin),
                      "f16 d%d: not tdpfp16ps", d);
        CHECK(calls("attention backward flash { dtype = f16 head_dim = 128 }", standin16));
        CHECK(!calls(fwd_spec(spec, sizeof spec, "f16", 80, ""), standin16));
        CHECK(!calls(fwd_spec(spec, sizeof spec, "f32", 128, ""), standin) &&
              !calls(spec, standin16));
        /* the backward: both plans, five products each */
        for (int d = 32; d <= 512; d += 96) {
            snprintf(spec, sizeof spec, "attention backward flash { dtype = bf16 head_dim = %d "
                     "mask = causal(top_left) }", d);
            char *ir = cpu_ir(spec);
            int products = 0;
            /* each product of tiles is four tdpbf16ps calls (a 32 x 32 step) */
            const char *call = "call void @aj_amx_standin_tdpbf16ps";
            for (const char *at = ir; at && (at = strstr(at, call)); at++)
                products++;
            CHECK_MSG(ir && strstr(ir, "_dkdv") && strstr(ir, "_dq"), "backward d%d: no stages",
                      d);
            /* the split plan: S and dP in both stages, dV, dK, dQ; the
             * fused stage: S, dP, dV, dK, dQ */
            CHECK_MSG(ir && strstr(ir, "_fused"), "backward d%d: no fused stage", d);
            CHECK_MSG(products == 4 * (7 + 5), "backward bf16 d%d: %d tdpbf16ps sites, want 48",
                      d, products);
            free(ir);
        }
        CHECK(!calls("attention backward flash { dtype = bf16 head_dim = 80 }", standin));
        CHECK(!calls("attention backward flash { dtype = f32 head_dim = 128 }", standin));
        CHECK(!calls("attention backward flash { dtype = bf16 head_dim = 128 "
                     "schedule = (block_m = 16) }", standin));
    }
    char text[1024];
    aj_cpu_describe(text, sizeof text);
    CHECK_MSG(strstr(text, "AMX bf16    standin: ") && strstr(text, "AMX f16     standin: "),
              "%s", text);
    setenv("AJ_CPU_AMX", "off", 1);
    aj_host_cpu_id(id_off, sizeof id_off);
    CHECK_MSG(strcmp(id_off, id_standin) != 0, "the cache key ignores the mode: %s", id_off);
    CHECK(!calls(fwd_spec(spec, sizeof spec, "bf16", 128, ""), standin));
    size_t n = aj_cpu_describe(text, sizeof text);
    CHECK(n == strlen(text) && n == aj_cpu_describe(NULL, 0));
    CHECK_MSG(strstr(text, "AMX bf16    off: AJ_CPU_AMX=off") != NULL, "%s", text);
    char small[8];
    CHECK(aj_cpu_describe(small, sizeof small) == n && strlen(small) == 7);

    setenv("AJ_CPU_AMX", "tiles", 1);
    aj_op *op = NULL;
    aj_kernel *k = NULL;
    const char *s = fwd_spec(spec, sizeof spec, "bf16", 64, "");
    CHECK_STATUS(ctx, aj_op_parse(ctx, s, strlen(s), "spec", &op), AJ_OK);
    aj_compile_options opt = AJ_COMPILE_OPTIONS_INIT;
    opt.target = AJ_TARGET_CPU;
    CHECK_STATUS(ctx, aj_compile(ctx, op, &opt, &k), AJ_ERR_INVALID_ARG);
    CHECK_ERROR(ctx, "AJ_CPU_AMX = 'tiles': expected auto, off, standin or native");
    aj_kernel_destroy(k);
    aj_op_destroy(op);
    unsetenv("AJ_CPU_AMX");
}

/* The assembly LLVM makes of IR text for this host plus amx-tile and
 * amx-bf16, or NULL */
static char *amx_assembly(const char *ir)
{
    LLVMInitializeNativeTarget();
    LLVMInitializeNativeAsmPrinter();
    LLVMInitializeNativeAsmParser();
    LLVMContextRef llctx = LLVMContextCreate();
    LLVMMemoryBufferRef in =
        LLVMCreateMemoryBufferWithMemoryRangeCopy(ir, strlen(ir), "kernel.ll");
    LLVMModuleRef mod = NULL;
    char *err = NULL, *out = NULL;
    if (LLVMParseIRInContext(llctx, in, &mod, &err)) {
        CHECK_MSG(0, "the kernel's IR does not parse: %s", err);
        LLVMDisposeMessage(err);
        LLVMContextDispose(llctx);
        return NULL;
    }
    char *triple = LLVMGetDefaultTargetTriple(), *cpu = LLVMGetHostCPUName();
    char *host = LLVMGetHostCPUFeatures();
    char features[4096];
    snprintf(features, sizeof features, "%s,+amx-tile,+amx-bf16,+amx-fp16", host);
    LLVMTargetRef t = NULL;
    if (!LLVMGetTargetFromTriple(triple, &t, &err)) {
        LLVMTargetMachineRef tm = LLVMCreateTargetMachine(
            t, triple, cpu, features, LLVMCodeGenLevelDefault, LLVMRelocPIC, LLVMCodeModelDefault);
        LLVMMemoryBufferRef asm_buf = NULL;
        if (LLVMTargetMachineEmitToMemoryBuffer(tm, mod, LLVMAssemblyFile, &err, &asm_buf)) {
            CHECK_MSG(0, "LLVM does not compile the tile intrinsics: %s", err);
        } else {
            size_t size = LLVMGetBufferSize(asm_buf);
            out = malloc(size + 1);
            memcpy(out, LLVMGetBufferStart(asm_buf), size);
            out[size] = '\0';
            LLVMDisposeMemoryBuffer(asm_buf);
        }
        LLVMDisposeTargetMachine(tm);
    }
    LLVMDisposeMessage(err);
    LLVMDisposeMessage(triple);
    LLVMDisposeMessage(cpu);
    LLVMDisposeMessage(host);
    LLVMDisposeModule(mod);
    LLVMContextDispose(llctx);
    return out;
}

/* ---------------------------------------------------------------- hardware */

#ifdef HAVE_TILE_ASM
/* C (16 x 16 f32) += A (16 x 32 bf16) B (16 pair rows x 16), on the tiles */
__attribute__((target("amx-tile,amx-bf16"))) static void hardware_product(float *c,
                                                                          const uint16_t *a,
                                                                          const uint16_t *b)
{
    uint8_t cfg[64];
    config_full(cfg);
    _tile_loadconfig(cfg);
    _tile_loadd(0, c, 64);
    _tile_loadd(1, a, 64);
    _tile_loadd(2, b, 64);
    _tile_dpbf16ps(0, 1, 2);
    _tile_stored(0, c, 64);
    _tile_release();
}
#endif

/* Where this host runs tile instructions (AJ_CPU_AMX=auto finds them
 * native): tdpbf16ps on random bf16 against float64, within the stand-in's
 * bound (test_standin_sums), and small integers exactly; how many results
 * differ from the stand-in's in any bit is printed, not checked -- the
 * hardware's order of sums is its own. */
static void test_hardware(void)
{
    char why[256];
    if (aj_cpu_amx_mode(AJ_DTYPE_BF16, why, sizeof why) != AJ_AMX_NATIVE) {
        printf("tdpbf16ps on this host's tiles: skipped (%s)\n", why);
        return;
    }
#ifdef HAVE_TILE_ASM
    uint64_t rng = 11;
    long differ = 0, total = 0;
    for (int round = 0; round < 200; round++) {
        int integers = round % 4 == 0;
        float c[256], hw[256];
        uint16_t a[512], b[512];
        double want[256], mag[256];
        for (int i = 0; i < 512; i++) {
            double x = uniform(&rng) * 2 - 1, y = uniform(&rng) * 2 - 1;
            a[i] = aj_f32_to_bf16(integers ? (float)floor(x * 16) : (float)x);
            b[i] = aj_f32_to_bf16(integers ? (float)floor(y * 16) : (float)(y * 64));
        }
        for (int i = 0; i < 256; i++) {
            c[i] = hw[i] = integers ? (float)floor(uniform(&rng) * 64) : (float)(uniform(&rng) * 4);
            want[i] = c[i];
            mag[i] = fabs(c[i]);
        }
        reference_product(16, 16, 16, a, 32, b, 32, want, mag, 16);
        hardware_product(hw, a, b);
        standin_product(16, 16, 16, c, 16, a, 32, b, 32);
        int bad = 0;
        for (int i = 0; i < 256; i++) {
            double tol = integers ? 0 : mag[i] * 0x1p-20;
            bad += !(fabs(hw[i] - want[i]) <= tol);
            differ += memcmp(&hw[i], &c[i], sizeof c[i]) != 0;
            total++;
        }
        CHECK_MSG(bad == 0, "round %d (%s): %d of tdpbf16ps's sums off float64", round,
                  integers ? "integers" : "random", bad);
    }
    printf("tdpbf16ps on this host's tiles: within 2^-20 of float64's magnitudes; %ld of %ld "
           "sums differ from the stand-in's in some bit\n", differ, total);
#else
    printf("tdpbf16ps on this host's tiles: skipped (no tile instructions in this compiler)\n");
#endif
}

static void test_native(void)
{
    if (aj_cpu_vector_width() != 16) {
        printf("native AMX lowering: skipped (the host has no AVX-512, which the tile path "
               "builds on)\n");
        return;
    }
    setenv("AJ_CPU_AMX", "native", 1);
    char spec[256];
    static const char *const mnemonics[] = {"ldtilecfg", "tileloadd", "tdpbf16ps", "tilestored",
                                            "tilerelease"};
    /* bf16 forward, bf16 backward, f16 forward (its products tdpfp16ps) */
    const char *specs[3] = {fwd_spec(spec, sizeof spec, "bf16", 128, ""),
                            "attention backward flash { dtype = bf16 head_dim = 64 "
                            "mask = causal(top_left) }",
                            "attention forward flash { dtype = f16 head_dim = 96 }"};
    static const char *const labels[3] = {"bf16 forward", "bf16 backward", "f16 forward"};
    for (int i = 0; i < 3; i++) {
        const char *product = i == 2 ? "tdpfp16ps" : "tdpbf16ps";
        char intrinsic[64];
        snprintf(intrinsic, sizeof intrinsic, "@llvm.x86.%s", product);
        char *ir = cpu_ir(specs[i]);
        CHECK_MSG(ir && strstr(ir, intrinsic) && !strstr(ir, "aj_amx_standin"),
                  "%s: not the native intrinsics", labels[i]);
        char *text = ir ? amx_assembly(ir) : NULL;
        for (size_t m = 0; text && m < sizeof mnemonics / sizeof mnemonics[0]; m++) {
            const char *want = strcmp(mnemonics[m], "tdpbf16ps") == 0 ? product : mnemonics[m];
            CHECK_MSG(strstr(text, want) != NULL, "%s: no %s in the assembly", labels[i], want);
        }
        CHECK(!text || strstr(text, "tilezero"));   /* S starts at 0 */
        free(text);
        free(ir);
        /* object code too (this host's features plus the tile ones) */
        aj_kernel_destroy(check_compile(ctx, specs[i], "spec", NULL));
    }
    char why[256];
    char why16[256];
    CHECK(aj_cpu_amx_mode(AJ_DTYPE_F32, why, sizeof why) == AJ_AMX_OFF);
    CHECK(aj_cpu_amx_mode(AJ_DTYPE_F16, why16, sizeof why16) == AJ_AMX_NATIVE);
    CHECK(aj_cpu_amx_mode(AJ_DTYPE_BF16, why, sizeof why) == AJ_AMX_NATIVE);
    aj_device *dev = NULL;
    aj_status st = aj_device_open(ctx, AJ_DEVICE_CPU, 0, &dev);
    /* the device refuses where either product cannot run */
    if (strstr(why, "for another host") || strstr(why16, "for another host")) {
        CHECK_STATUS(ctx, st, AJ_ERR_UNSUPPORTED);
        CHECK_ERROR(ctx, "AJ_CPU_AMX=native: this host cannot run tile instructions");
    } else {
        CHECK_STATUS(ctx, st, AJ_OK);
    }
    aj_device_close(dev);
    unsetenv("AJ_CPU_AMX");
}

int main(void)
{
    CHECK(aj_ctx_create(NULL, &ctx) == AJ_OK);
    test_standin_sums();
    test_standin_exact();
    test_standin_rounding();
    test_standin_f16();
    test_standin_moves();
    test_standin_faults();
    test_selection();
    test_hardware();
    test_native();
    char why[256];
    for (int i = 0; i < 2; i++) {
        aj_dtype dtype = i ? AJ_DTYPE_F16 : AJ_DTYPE_BF16;
        aj_amx_mode mode = aj_cpu_amx_mode(dtype, why, sizeof why);
        printf("this host: AMX %s %s (%s)\n", aj_dtype_name(dtype), aj_amx_mode_name(mode), why);
    }
    aj_ctx_destroy(ctx);
    return check_report();
}
