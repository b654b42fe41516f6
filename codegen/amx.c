/*
 * amx.c -- AMX tile operations (amx.h): the stand-in that runs them on an
 * in-memory tile file, and their lowering into a kernel, native or
 * through the stand-in.
 */
#include "codegen/amx.h"

#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ir/dtype.h"

_Static_assert(sizeof(aj_amx_file) % 64 == 0, "the tile file is a whole number of lines");

/* ------------------------------------------------------------ stand-in */

static void standin_fault(const char *what, int t)
{
    fprintf(stderr, "attnjit: AMX stand-in: %s (tile %d); the instruction would fault (#UD)\n",
            what, t);
    abort();
}

static void check_tile(const aj_amx_file *f, int32_t t, const char *op)
{
    if (!f->configured)
        standin_fault(op, t);
    if (t < 0 || t >= AJ_AMX_TILES || f->rows[t] == 0 || f->colsb[t] == 0)
        standin_fault("a tile that is not configured", t);
}

void aj_amx_standin_ldtilecfg(aj_amx_file *f, const uint8_t *cfg)
{
    if (cfg[0] != 1)
        standin_fault("ldtilecfg of a palette other than 1", -1);
    if (cfg[1] != 0)
        standin_fault("ldtilecfg with start_row set", -1);
    memset(f, 0, sizeof *f);
    for (int t = 0; t < AJ_AMX_TILES; t++) {
        uint16_t colsb;
        memcpy(&colsb, cfg + 16 + 2 * t, sizeof colsb);
        uint8_t rows = cfg[48 + t];
        if (colsb > AJ_AMX_COLSB || rows > AJ_AMX_ROWS || colsb % 4 || (!rows != !colsb))
            standin_fault("ldtilecfg of a shape palette 1 does not have", t);
        f->colsb[t] = colsb;
        f->rows[t] = rows;
    }
    f->configured = 1;
}

void aj_amx_standin_tilerelease(aj_amx_file *f)
{
    memset(f, 0, sizeof *f);
}

void aj_amx_standin_tilezero(aj_amx_file *f, int32_t t)
{
    check_tile(f, t, "tilezero before ldtilecfg");
    memset(f->tile[t], 0, sizeof f->tile[t]);
}

void aj_amx_standin_tileloadd(aj_amx_file *f, int32_t t, const void *base, int64_t stride)
{
    check_tile(f, t, "tileloadd before ldtilecfg");
    /* bytes past colsb and rows past rows read as zero */
    memset(f->tile[t], 0, sizeof f->tile[t]);
    for (int r = 0; r < f->rows[t]; r++)
        memcpy(f->tile[t][r], (const uint8_t *)base + r * stride, f->colsb[t]);
}

void aj_amx_standin_tilestored(aj_amx_file *f, int32_t t, void *base, int64_t stride)
{
    check_tile(f, t, "tilestored before ldtilecfg");
    for (int r = 0; r < f->rows[t]; r++)
        memcpy((uint8_t *)base + r * stride, f->tile[t][r], f->colsb[t]);
}

/* A bf16 as f32, a denormal read as zero (DAZ) */
static float bf16_daz(uint16_t h)
{
    return aj_bf16_to_f32((h & 0x7f80) == 0 ? h & 0x8000 : h);
}

/* x with a denormal flushed to zero of its sign (FTZ) */
static inline float ftz(float x)
{
    return fabsf(x) < FLT_MIN ? copysignf(0.0f, x) : x;
}

/* The 16-bit elements of a tile's rows as f32 (bf16 with DAZ, or f16),
 * row r at out[r * 32] */
static void tile_halves(const aj_amx_file *f, int32_t t, int f16, float *out)
{
    for (int r = 0; r < f->rows[t]; r++)
        for (int e = 0; e < f->colsb[t] / 2; e++) {
            uint16_t h;
            memcpy(&h, f->tile[t][r] + 2 * e, sizeof h);
            /* f16: exact, denormals included */
            out[r * (AJ_AMX_COLSB / 2) + e] = f16 ? aj_f16_to_f32(h) : bf16_daz(h);
        }
}

/* tdpbf16ps (f16 = 0) and tdpfp16ps (f16 = 1) */
static void dot_pairs(aj_amx_file *f, int32_t c, int32_t a, int32_t b, int f16)
{
    const char *op = f16 ? "tdpfp16ps before ldtilecfg" : "tdpbf16ps before ldtilecfg";
    check_tile(f, c, op);
    check_tile(f, a, op);
    check_tile(f, b, op);
    if (c == a || c == b || a == b)
        standin_fault("a tile product with a tile twice", c);
    if (f->rows[c] != f->rows[a] || f->colsb[c] != f->colsb[b] ||
        f->colsb[a] != 4 * f->rows[b])
        standin_fault("a tile product of tiles whose shapes disagree", c);
    enum { W = AJ_AMX_COLSB / 2 };
    float av[AJ_AMX_ROWS * W], bv[AJ_AMX_ROWS * W];
    tile_halves(f, a, f16, av);
    tile_halves(f, b, f16, bv);
    int kpairs = f->colsb[a] / 4, n = f->colsb[c] / 4;
    for (int m = 0; m < f->rows[c]; m++) {
        float acc[AJ_AMX_COLSB / 4];
        memcpy(acc, f->tile[c][m], sizeof acc);
        for (int k = 0; k < kpairs; k++) {
            float a0 = av[m * W + 2 * k], a1 = av[m * W + 2 * k + 1];
            const float *brow = bv + k * W;
            /* per column the two products in order, each sum rounded
             * (bf16 and f16 products are exact in f32) and flushed */
            for (int j = 0; j < n; j++) {
                acc[j] = ftz(acc[j] + a0 * brow[2 * j]);
                acc[j] = ftz(acc[j] + a1 * brow[2 * j + 1]);
            }
        }
        memcpy(f->tile[c][m], acc, sizeof acc);
    }
}

void aj_amx_standin_tdpbf16ps(aj_amx_file *f, int32_t c, int32_t a, int32_t b)
{
    dot_pairs(f, c, a, b, 0);
}

void aj_amx_standin_tdpfp16ps(aj_amx_file *f, int32_t c, int32_t a, int32_t b)
{
    dot_pairs(f, c, a, b, 1);
}

/* ------------------------------------------------------------ emitters */

const char *aj_amx_mode_name(aj_amx_mode mode)
{
    static const char *const names[] = {"off", "standin", "native"};
    return mode >= AJ_AMX_OFF && mode <= AJ_AMX_NATIVE ? names[mode] : "?";
}

/* The configuration block: palette 1, every tile 16 rows of 64 bytes. */
static LLVMValueRef config_block(aj_kb *kb)
{
    uint8_t cfg[64] = {1};
    for (int t = 0; t < AJ_AMX_TILES; t++) {
        cfg[16 + 2 * t] = AJ_AMX_COLSB;
        cfg[48 + t] = AJ_AMX_ROWS;
    }
    LLVMValueRef g = LLVMGetNamedGlobal(kb->mod, "aj_amx_config");
    if (g)
        return g;
    LLVMValueRef init = LLVMConstStringInContext(kb->llctx, (const char *)cfg, sizeof cfg, 1);
    g = LLVMAddGlobal(kb->mod, LLVMTypeOf(init), "aj_amx_config");
    LLVMSetInitializer(g, init);
    LLVMSetGlobalConstant(g, 1);
    LLVMSetLinkage(g, LLVMPrivateLinkage);
    LLVMSetAlignment(g, 64);
    return g;
}

void aj_amx_init(aj_amx *t, aj_kb *kb, aj_amx_mode mode, aj_dtype dtype)
{
    memset(t, 0, sizeof *t);
    t->kb = kb;
    t->mode = mode;
    t->dtype = dtype;
    t->cfg = config_block(kb);
    if (mode == AJ_AMX_STANDIN) {
        t->file = aj_kb_var(kb, LLVMArrayType(kb->t_i8, sizeof(aj_amx_file)), NULL, "amx_file");
        LLVMSetAlignment(t->file, 64);
    }
}

/* A call of `name` (void result): the stand-in's function or the native
 * intrinsic, declared on first use. */
static void emit_call(aj_amx *t, const char *name, LLVMValueRef *args, unsigned n)
{
    aj_kb *kb = t->kb;
    if (kb->st != AJ_OK)
        return;
    LLVMTypeRef types[5];
    for (unsigned i = 0; i < n; i++)
        types[i] = LLVMTypeOf(args[i]);
    LLVMTypeRef fty = LLVMFunctionType(kb->t_void, types, n, 0);
    LLVMValueRef fn = LLVMGetNamedFunction(kb->mod, name);
    if (!fn)
        fn = LLVMAddFunction(kb->mod, name, fty);
    LLVMBuildCall2(kb->b, fty, fn, args, n, "");
}

static LLVMValueRef tile_id(aj_amx *t, int tile)
{
    if (t->mode == AJ_AMX_NATIVE)
        return LLVMConstInt(t->kb->t_i8, (unsigned long long)tile, 0);
    return aj_kb_i32(t->kb, tile);
}

/* op on tiles ids[0..nt) then the extra args: "llvm.x86.<native>" with
 * the ids as immediates, or aj_amx_standin_<standin>(file, ids..., extra) */
static void emit_op(aj_amx *t, const char *native, const char *standin, const int *ids, int nt,
                    LLVMValueRef *extra, int ne)
{
    LLVMValueRef args[5];
    unsigned n = 0;
    char name[64];
    if (t->mode == AJ_AMX_STANDIN)
        args[n++] = t->file;
    for (int i = 0; i < nt; i++)
        args[n++] = tile_id(t, ids[i]);
    for (int i = 0; i < ne; i++)
        args[n++] = extra[i];
    if (t->mode == AJ_AMX_NATIVE)
        snprintf(name, sizeof name, "llvm.x86.%s", native);
    else
        snprintf(name, sizeof name, "aj_amx_standin_%s", standin);
    emit_call(t, name, args, n);
}

void aj_amx_config(aj_amx *t)
{
    emit_op(t, "ldtilecfg", "ldtilecfg", NULL, 0, &t->cfg, 1);
}

void aj_amx_release(aj_amx *t)
{
    emit_op(t, "tilerelease", "tilerelease", NULL, 0, NULL, 0);
}

void aj_amx_zero(aj_amx *t, int tile)
{
    emit_op(t, "tilezero", "tilezero", &tile, 1, NULL, 0);
}

void aj_amx_load(aj_amx *t, int tile, LLVMValueRef base, LLVMValueRef stride)
{
    LLVMValueRef extra[2] = {base, stride};
    emit_op(t, "tileloadd64", "tileloadd", &tile, 1, extra, 2);
}

void aj_amx_store(aj_amx *t, int tile, LLVMValueRef base, LLVMValueRef stride)
{
    LLVMValueRef extra[2] = {base, stride};
    emit_op(t, "tilestored64", "tilestored", &tile, 1, extra, 2);
}

void aj_amx_dot(aj_amx *t, int c, int a, int b)
{
    const int ids[3] = {c, a, b};
    const char *op = t->dtype == AJ_DTYPE_F16 ? "tdpfp16ps" : "tdpbf16ps";
    emit_op(t, op, op, ids, 3, NULL, 0);
}
