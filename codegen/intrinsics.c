/*
 * intrinsics.c -- lowering of the intrinsic table (intrinsics.def) per
 * target.  nvptx: an NVVM intrinsic call or inline PTX.  sim: a call of
 * the emulator's function for it, with the thread state first (then a
 * site number for collectives) and, for rows with several results, an
 * out-pointer last.
 */
#include <stdio.h>
#include <string.h>

#include "codegen/kbuilder.h"

#define MAX_ARGS 12
#define MAX_RESULTS 128

/* KIND_WGMMA_TB: a wgmma row whose B is N-major (imm-trans-b = 1);
 * KIND_WGMMA_F8: one with 8-bit inputs, which take no imm-trans operands */
enum nvptx_kind { KIND_NVVM, KIND_ASM, KIND_WGMMA, KIND_WGMMA_TB, KIND_WGMMA_F8, KIND_SIMONLY };
enum sync_scope { SYNC_LANE, SYNC_WARP, SYNC_WARPGROUP, SYNC_CTA };
enum arg_type { VOID, I1, I16, I32, I64, F32, PTR1, PTR3 };

typedef struct intrinsic_desc {
    const char *id_name;
    enum nvptx_kind kind;
    const char *text;
    const char *constraints;
    enum sync_scope sync;
    int nres;
    enum arg_type res;
    int nargs;
    enum arg_type args[MAX_ARGS];
    const char *sim_symbol;
} intrinsic_desc;

/* ARGS is a parenthesised list; this strips the parentheses */
#define AJ_UNPACK(...) __VA_ARGS__

static const intrinsic_desc table[] = {
#define AJ_INTRINSIC(id, kind, text, cons, sync, nres, res, nargs, args, sim) \
    {#id, KIND_##kind, text, cons, SYNC_##sync, nres, res, nargs, {AJ_UNPACK args}, sim},
#include "codegen/intrinsics.def"
#undef AJ_INTRINSIC
};

static int is_wgmma(const intrinsic_desc *d)
{
    return d->kind == KIND_WGMMA || d->kind == KIND_WGMMA_TB || d->kind == KIND_WGMMA_F8;
}

_Static_assert(sizeof table / sizeof table[0] == AJ_INTR_COUNT,
               "intrinsic table and enum disagree");
_Static_assert(MAX_RESULTS == AJ_KB_MAX_RESULTS, "kbuilder.h and the table disagree");

/* Each row's NARGS counts its ARGS, and its columns fit the descriptor. */
#define AJ_INTRINSIC(id, kind, text, cons, sync, nres, res, nargs, args, sim)               \
    _Static_assert(sizeof((enum arg_type[]){AJ_UNPACK args}) / sizeof(enum arg_type) ==     \
                           ((nargs) > 0 ? (nargs) : 1) &&                                   \
                       (nargs) <= MAX_ARGS && (nres) <= MAX_RESULTS &&                      \
                       ((nres) == 0) == ((res) == VOID),                                    \
                   "intrinsics.def row " #id ": NARGS, ARGS, NRES and RES disagree");
#include "codegen/intrinsics.def"
#undef AJ_INTRINSIC

const char *aj_intrinsic_name(enum aj_intrinsic_id id)
{
    return (unsigned)id < AJ_INTR_COUNT ? table[id].id_name : "?";
}

aj_status aj_intrinsics_check(aj_ctx *ctx)
{
    for (int i = 0; i < AJ_INTR_COUNT; i++) {
        const intrinsic_desc *d = &table[i];
        if (d->kind != KIND_NVVM)
            continue;
        if (LLVMLookupIntrinsicID(d->text, strlen(d->text)) == 0)
            return aj_fail(ctx, AJ_ERR_INTERNAL,
                           "intrinsic %s: LLVM %s has no '%s'", d->id_name,
                           aj_llvm_version(), d->text);
    }
    return AJ_OK;
}

static LLVMTypeRef llvm_type(aj_kb *kb, enum arg_type t)
{
    switch (t) {
    case I1: return kb->t_i1;
    case I16: return kb->t_i16;
    case I32: return kb->t_i32;
    case I64: return kb->t_i64;
    case F32: return kb->t_f32;
    case PTR1: return kb->t_gptr;
    case PTR3: return kb->t_sptr;
    default: return kb->t_void;
    }
}

/* What nvptx returns: nothing, the one result, or a struct of them. */
static LLVMTypeRef nvptx_result_type(aj_kb *kb, const intrinsic_desc *d)
{
    if (d->nres <= 1)
        return llvm_type(kb, d->res);
    LLVMTypeRef elems[MAX_RESULTS];
    for (int i = 0; i < d->nres; i++)
        elems[i] = llvm_type(kb, d->res);
    return LLVMStructTypeInContext(kb->llctx, elems, (unsigned)d->nres, 0);
}

static LLVMTypeRef nvptx_fn_type(aj_kb *kb, const intrinsic_desc *d)
{
    LLVMTypeRef params[MAX_ARGS];
    for (int i = 0; i < d->nargs; i++)
        params[i] = llvm_type(kb, d->args[i]);
    return LLVMFunctionType(nvptx_result_type(kb, d), params, (unsigned)d->nargs, 0);
}

static void undef_results(aj_kb *kb, const intrinsic_desc *d, LLVMValueRef *results)
{
    for (int i = 0; i < d->nres; i++)
        results[i] = LLVMGetUndef(llvm_type(kb, d->res));
}

/* Collectives must not be duplicated into divergent control flow (see SYNC
 * in intrinsics.def).  Marks a call, or with `is_function` a declaration:
 * the optimiser drops the mark from calls of declarations that lack it. */
static void mark_collective(aj_kb *kb, const intrinsic_desc *d, LLVMValueRef value,
                            int is_function)
{
    if (d->sync == SYNC_LANE)
        return;
    unsigned kind = LLVMGetEnumAttributeKindForName("convergent", 10);
    LLVMAttributeRef convergent = LLVMCreateEnumAttribute(kb->llctx, kind, 0);
    if (is_function)
        LLVMAddAttributeAtIndex(value, LLVMAttributeFunctionIndex, convergent);
    else
        LLVMAddCallSiteAttribute(value, LLVMAttributeFunctionIndex, convergent);
}

/*
 * The declaration of d's NVVM intrinsic, or NULL after a sticky failure
 * when this LLVM lacks it or declares it with another type than the
 * table's -- a call of the wrong type would only fail later, in the
 * verifier, with a message that names neither.
 */
static LLVMValueRef nvvm_declaration(aj_kb *kb, const intrinsic_desc *d, LLVMTypeRef fty)
{
    unsigned id = LLVMLookupIntrinsicID(d->text, strlen(d->text));
    if (id == 0) {
        aj_kb_fail(kb, AJ_ERR_INTERNAL, "intrinsic '%s' is unknown to this LLVM", d->text);
        return NULL;
    }
    LLVMTypeRef overloads[MAX_ARGS];
    size_t noverloads = 0;
    if (LLVMIntrinsicIsOverloaded(id)) {
        for (int i = 0; i < d->nargs; i++)
            if (d->args[i] == PTR1 || d->args[i] == PTR3)
                overloads[noverloads++] = llvm_type(kb, d->args[i]);
        if (noverloads == 0) {
            aj_kb_fail(kb, AJ_ERR_INTERNAL, "intrinsic '%s' is overloaded on types the "
                       "table cannot name", d->text);
            return NULL;
        }
    }
    LLVMValueRef fn = LLVMGetIntrinsicDeclaration(kb->mod, id, overloads, noverloads);
    if (LLVMGlobalGetValueType(fn) != fty) {
        char *have = LLVMPrintTypeToString(LLVMGlobalGetValueType(fn));
        char *want = LLVMPrintTypeToString(fty);
        aj_kb_fail(kb, AJ_ERR_INTERNAL, "intrinsic %s: LLVM declares '%s' as %s, the table "
                   "as %s", d->id_name, d->text, have, want);
        LLVMDisposeMessage(have);
        LLVMDisposeMessage(want);
        return NULL;
    }
    return fn;
}

static void lower_nvptx(aj_kb *kb, const intrinsic_desc *d, LLVMValueRef *args,
                        LLVMValueRef *results)
{
    LLVMTypeRef fty = nvptx_fn_type(kb, d);
    LLVMValueRef callee = NULL;
    switch (d->kind) {
    case KIND_NVVM:
        callee = nvvm_declaration(kb, d, fty);
        break;
    case KIND_ASM:
        callee = LLVMGetInlineAsm(fty, d->text, strlen(d->text), d->constraints,
                                  strlen(d->constraints), 0, 0,
                                  LLVMInlineAsmDialectATT, 0);
        break;
    case KIND_WGMMA:
    case KIND_WGMMA_TB:
    case KIND_WGMMA_F8:
    case KIND_SIMONLY:
        aj_kb_fail(kb, AJ_ERR_INTERNAL, "intrinsic %s: %s", d->id_name,
                   is_wgmma(d) ? "call aj_kb_wgmma" : "exists only on sim");
        break;
    }
    if (!callee) {
        undef_results(kb, d, results);
        return;
    }
    LLVMValueRef call = LLVMBuildCall2(kb->b, fty, callee, args, (unsigned)d->nargs, "");
    mark_collective(kb, d, call, 0);
    if (d->nres == 1) {
        results[0] = call;
        return;
    }
    for (int i = 0; i < d->nres; i++)
        results[i] = LLVMBuildExtractValue(kb->b, call, (unsigned)i, "");
}

/* sim: the calling convention of intrinsics.def's SIM_SYMBOL column,
 * the function declared on first use */
static void lower_sim(aj_kb *kb, const intrinsic_desc *d, LLVMValueRef *args,
                      LLVMValueRef *results)
{
    LLVMTypeRef params[MAX_ARGS + 3] = {kb->t_ptr};
    LLVMValueRef call_args[MAX_ARGS + 3] = {kb->sim_thread};
    unsigned n = 1;
    if (d->sync != SYNC_LANE) {
        params[n] = kb->t_i32;
        call_args[n++] = aj_kb_i32(kb, ++kb->sim_sites);
    }
    for (int i = 0; i < d->nargs; i++, n++) {
        if (d->args[i] == I1) {
            params[n] = kb->t_i32;
            call_args[n] = LLVMBuildZExt(kb->b, args[i], kb->t_i32, "");
        } else {
            params[n] = llvm_type(kb, d->args[i]);
            call_args[n] = args[i];
        }
    }
    LLVMTypeRef res = llvm_type(kb, d->res);
    LLVMTypeRef out_type = NULL;
    LLVMValueRef out = NULL;
    if (d->nres > 1) {
        out_type = LLVMArrayType2(res, (uint64_t)d->nres);
        out = aj_kb_var(kb, out_type, NULL, "sim.out");
        params[n] = kb->t_ptr;
        call_args[n++] = out;
    }
    LLVMTypeRef ret = d->nres > 1 ? kb->t_void : d->res == I1 ? kb->t_i32 : res;
    LLVMTypeRef fty = LLVMFunctionType(ret, params, n, 0);
    LLVMValueRef fn = LLVMGetNamedFunction(kb->mod, d->sim_symbol);
    if (!fn) {
        fn = LLVMAddFunction(kb->mod, d->sim_symbol, fty);
        mark_collective(kb, d, fn, 1);
    }
    LLVMValueRef call = LLVMBuildCall2(kb->b, fty, fn, call_args, n, "");
    if (d->nres == 1) {
        results[0] = d->res == I1 ? LLVMBuildICmp(kb->b, LLVMIntNE, call, aj_kb_i32(kb, 0), "")
                                  : call;
        return;
    }
    for (int i = 0; i < d->nres; i++) {
        LLVMValueRef idx[2] = {aj_kb_i32(kb, 0), aj_kb_i32(kb, i)};
        LLVMValueRef at = LLVMBuildInBoundsGEP2(kb->b, out_type, out, idx, 2, "");
        results[i] = LLVMBuildLoad2(kb->b, res, at, "");
    }
}

void aj_kb_intrinsic_results(aj_kb *kb, enum aj_intrinsic_id id, LLVMValueRef *args,
                             LLVMValueRef *results)
{
    const intrinsic_desc *d = &table[id];
    if (is_wgmma(d)) {
        aj_kb_fail(kb, AJ_ERR_INTERNAL, "intrinsic %s: call aj_kb_wgmma", d->id_name);
        undef_results(kb, d, results);
        return;
    }
    if (kb->desc->family == AJ_FAMILY_NVPTX) {
        lower_nvptx(kb, d, args, results);
        return;
    }
    switch (kb->target) {
    case AJ_TARGET_SIM:
        if (kb->sim_thread) {
            lower_sim(kb, d, args, results);
            return;
        }
        aj_kb_fail(kb, AJ_ERR_INTERNAL, "intrinsic %s used outside a kernel", d->id_name);
        break;
    default:
        aj_kb_fail(kb, AJ_ERR_UNSUPPORTED, "intrinsic %s has no lowering for target '%s'",
                   d->id_name, aj_target_name(kb->target));
        break;
    }
    undef_results(kb, d, results);
}

LLVMValueRef aj_kb_intrinsic(aj_kb *kb, enum aj_intrinsic_id id, LLVMValueRef *args)
{
    const intrinsic_desc *d = &table[id];
    if (d->nres > 1) {
        aj_kb_fail(kb, AJ_ERR_INTERNAL, "intrinsic %s has %d results; call "
                   "aj_kb_intrinsic_results", d->id_name, d->nres);
        return LLVMGetUndef(llvm_type(kb, d->res));
    }
    LLVMValueRef result = NULL;
    aj_kb_intrinsic_results(kb, id, args, &result);
    return result;
}

/* ---------------------------------------------------------------- wgmma */

/* The accumulator array's element count (an alloca of [n x float]). */
static unsigned acc_length(LLVMValueRef acc)
{
    LLVMTypeRef t = LLVMGetAllocatedType(acc);
    return LLVMGetTypeKind(t) == LLVMArrayTypeKind ? (unsigned)LLVMGetArrayLength2(t) : 0;
}

/* "{$first, ..., $(first + n - 1)}" at the end of buf */
static void asm_register_list(char *buf, size_t cap, int first, int n)
{
    size_t len = strlen(buf);
    for (int i = 0; i < n && len < cap; i++)
        len += (size_t)snprintf(buf + len, cap - len, "%s$%d", i ? ", " : "{", first + i);
    if (len < cap)
        snprintf(buf + len, cap - len, "}");
}

/*
 * nvptx: the row's mnemonic with its operands, as CUTLASS-style inline PTX:
 *
 *   { .reg .pred p; setp.ne.b32 p, $scale_d, 0;
 *     MNEMONIC {$0 .. $R-1}, A, $b_desc, p, 1, 1[, [0,] TB]; }
 *
 * (imm-scale-a and -b 1; imm-trans-a 0 where A is in shared memory;
 * imm-trans-b TB: 1 for the rows of kind WGMMA_TB; 8-bit rows, kind
 * WGMMA_F8, have neither)
 *
 * outputs $0..$R-1 ("=f"), then the row's arguments (A: one descriptor, or
 * four registers), then the R accumulators tied to the outputs.
 */
static void lower_wgmma_nvptx(aj_kb *kb, const intrinsic_desc *d, LLVMValueRef acc,
                              LLVMValueRef *args)
{
    int r = d->nres, from_registers = d->nargs == 6;
    char text[4096], cons[4096];
    snprintf(text, sizeof text, "{ .reg .pred p; setp.ne.b32 p, $%d, 0; %s ",
             r + d->nargs - 1, d->text);
    asm_register_list(text, sizeof text, 0, r);
    strncat(text, ", ", sizeof text - strlen(text) - 1);
    if (from_registers)
        asm_register_list(text, sizeof text, r, 4);
    else
        snprintf(text + strlen(text), sizeof text - strlen(text), "$%d", r);
    if (d->kind == KIND_WGMMA_F8)
        snprintf(text + strlen(text), sizeof text - strlen(text), ", $%d, p, 1, 1; }",
                 r + d->nargs - 2);
    else
        snprintf(text + strlen(text), sizeof text - strlen(text), ", $%d, p, 1, 1, %s%d; }",
                 r + d->nargs - 2, from_registers ? "" : "0, ", d->kind == KIND_WGMMA_TB);
    cons[0] = '\0';
    for (int i = 0; i < r; i++)
        strncat(cons, "=f,", sizeof cons - strlen(cons) - 1);
    strncat(cons, d->constraints, sizeof cons - strlen(cons) - 1);
    for (int i = 0; i < r; i++)
        snprintf(cons + strlen(cons), sizeof cons - strlen(cons), ",%d", i);

    LLVMTypeRef params[MAX_ARGS + MAX_RESULTS];
    LLVMValueRef call_args[MAX_ARGS + MAX_RESULTS];
    LLVMTypeRef arr = LLVMGetAllocatedType(acc);
    for (int i = 0; i < d->nargs; i++) {
        params[i] = llvm_type(kb, d->args[i]);
        call_args[i] = args[i];
    }
    for (int i = 0; i < r; i++) {
        LLVMValueRef idx[2] = {aj_kb_i32(kb, 0), aj_kb_i32(kb, i)};
        LLVMValueRef at = LLVMBuildInBoundsGEP2(kb->b, arr, acc, idx, 2, "");
        params[d->nargs + i] = kb->t_f32;
        call_args[d->nargs + i] = LLVMBuildLoad2(kb->b, kb->t_f32, at, "");
    }
    LLVMTypeRef fty = LLVMFunctionType(nvptx_result_type(kb, d), params,
                                       (unsigned)(d->nargs + r), 0);
    LLVMValueRef callee = LLVMGetInlineAsm(fty, text, strlen(text), cons, strlen(cons), 1, 0,
                                           LLVMInlineAsmDialectATT, 0);
    LLVMValueRef call = LLVMBuildCall2(kb->b, fty, callee, call_args,
                                       (unsigned)(d->nargs + r), "");
    mark_collective(kb, d, call, 0);
    for (int i = 0; i < r; i++) {
        LLVMValueRef idx[2] = {aj_kb_i32(kb, 0), aj_kb_i32(kb, i)};
        LLVMBuildStore(kb->b, LLVMBuildExtractValue(kb->b, call, (unsigned)i, ""),
                       LLVMBuildInBoundsGEP2(kb->b, arr, acc, idx, 2, ""));
    }
}

/* sim: SIM(thread, site, acc, args...); the emulator reads the
 * accumulators at issue and writes the results at the wait_group that
 * covers them (runtime/sim/wgmma.c). */
static void lower_wgmma_sim(aj_kb *kb, const intrinsic_desc *d, LLVMValueRef acc,
                            LLVMValueRef *args)
{
    LLVMTypeRef params[MAX_ARGS + 3] = {kb->t_ptr, kb->t_i32, kb->t_ptr};
    LLVMValueRef call_args[MAX_ARGS + 3] = {kb->sim_thread, aj_kb_i32(kb, ++kb->sim_sites), acc};
    for (int i = 0; i < d->nargs; i++) {
        params[3 + i] = llvm_type(kb, d->args[i]);
        call_args[3 + i] = args[i];
    }
    LLVMTypeRef fty = LLVMFunctionType(kb->t_void, params, (unsigned)(3 + d->nargs), 0);
    LLVMValueRef fn = LLVMGetNamedFunction(kb->mod, d->sim_symbol);
    if (!fn) {
        fn = LLVMAddFunction(kb->mod, d->sim_symbol, fty);
        mark_collective(kb, d, fn, 1);
    }
    LLVMBuildCall2(kb->b, fty, fn, call_args, (unsigned)(3 + d->nargs), "");
}

void aj_kb_wgmma(aj_kb *kb, enum aj_intrinsic_id id, LLVMValueRef acc, LLVMValueRef *args)
{
    const intrinsic_desc *d = &table[id];
    if (kb->st != AJ_OK)
        return;
    if (!is_wgmma(d) || acc_length(acc) != (unsigned)d->nres) {
        aj_kb_fail(kb, AJ_ERR_INTERNAL, "aj_kb_wgmma: %s wants an accumulator array of %d "
                   "f32, not %s with %u", d->id_name, d->nres,
                   is_wgmma(d) ? "one" : "a non-wgmma row", acc_length(acc));
        return;
    }
    if (!kb->desc->wgmma)
        aj_kb_fail(kb, AJ_ERR_UNSUPPORTED, "intrinsic %s needs sm_90a, not '%s'", d->id_name,
                   aj_target_name(kb->target));
    else if (kb->desc->family == AJ_FAMILY_HOST)
        lower_wgmma_sim(kb, d, acc, args);
    else
        lower_wgmma_nvptx(kb, d, acc, args);
}

/* A pointer to register r of the accumulator variable `acc`. */
static LLVMValueRef wgmma_acc(aj_kb *kb, LLVMValueRef acc, int r)
{
    LLVMValueRef idx[2] = {aj_kb_i32(kb, 0), aj_kb_i32(kb, r)};
    return LLVMBuildInBoundsGEP2(kb->b, LLVMGetAllocatedType(acc), acc, idx, 2, "");
}

void aj_kb_wgmma_put(aj_kb *kb, LLVMValueRef acc, int n8, LLVMValueRef (*vars)[4])
{
    for (int j = 0; j < n8; j++)
        for (int c = 0; c < 4; c++)
            LLVMBuildStore(kb->b, aj_kb_get(kb, vars[j][c]), wgmma_acc(kb, acc, 4 * j + c));
}

void aj_kb_wgmma_take(aj_kb *kb, LLVMValueRef acc, int n8, LLVMValueRef (*vars)[4])
{
    for (int j = 0; j < n8; j++)
        for (int c = 0; c < 4; c++)
            aj_kb_set(kb, vars[j][c],
                      LLVMBuildLoad2(kb->b, kb->t_f32, wgmma_acc(kb, acc, 4 * j + c), ""));
}

enum aj_intrinsic_id aj_kb_wgmma_row(int n, aj_dtype a_type, aj_dtype b_type, int a_in_registers,
                                     int n_major_b)
{
#define ROWS_OF(N, T)                                                                      \
    {{AJ_INTR_WGMMA_M64N##N##K16_##T##_SS, AJ_INTR_WGMMA_M64N##N##K16_##T##_SS_TB},        \
     {AJ_INTR_WGMMA_M64N##N##K16_##T##_RS, AJ_INTR_WGMMA_M64N##N##K16_##T##_RS_TB}}
#define ROWS(N) {ROWS_OF(N, F16), ROWS_OF(N, BF16)},
    static const enum aj_intrinsic_id rows[][2][2][2] = {AJ_WGMMA_NS(ROWS)};
#undef ROWS
#undef ROWS_OF
    /* 8-bit: [e4m3.e4m3, e5m2.e5m2, e4m3.e5m2][A in registers] */
#define ROWS_OF(N, A, B) {AJ_INTR_WGMMA_M64N##N##K32_##A##_##B##_SS, AJ_INTR_WGMMA_M64N##N##K32_##A##_##B##_RS}
#define ROWS(N) {ROWS_OF(N, E4M3, E4M3), ROWS_OF(N, E5M2, E5M2), ROWS_OF(N, E4M3, E5M2)},
    static const enum aj_intrinsic_id rows_f8[][3][2] = {AJ_WGMMA_NS(ROWS)};
#undef ROWS
#undef ROWS_OF
    int i = n / 8 - 1;
    if (n % 8 || i < 0 || i >= (int)(sizeof rows / sizeof rows[0]))
        return AJ_INTR_COUNT;
    if (a_type == b_type && (a_type == AJ_DTYPE_F16 || a_type == AJ_DTYPE_BF16))
        return rows[i][a_type == AJ_DTYPE_BF16][a_in_registers != 0][n_major_b != 0];
    int pair = a_type == AJ_DTYPE_F8E4M3 && b_type == AJ_DTYPE_F8E4M3   ? 0
               : a_type == AJ_DTYPE_F8E5M2 && b_type == AJ_DTYPE_F8E5M2 ? 1
               : a_type == AJ_DTYPE_F8E4M3 && b_type == AJ_DTYPE_F8E5M2 ? 2
                                                                       : -1;
    if (pair < 0 || n_major_b)   /* 8-bit operands are K-major only */
        return AJ_INTR_COUNT;
    return rows_f8[i][pair][a_in_registers != 0];
}

void aj_kb_wgmma_wait(aj_kb *kb, int pending, const LLVMValueRef *accs, int count)
{
    LLVMValueRef n = aj_kb_i32(kb, pending);
    aj_kb_intrinsic(kb, AJ_INTR_WGMMA_WAIT_GROUP, &n);
    if (kb->st != AJ_OK || kb->target == AJ_TARGET_SIM)
        return;
    /* nvptx: each accumulator passes through an empty asm after the wait,
     * so that no use of it is scheduled before the wait */
    char cons[2048];
    for (int a = 0; a < count; a++) {
        unsigned len = acc_length(accs[a]);
        if (len == 0 || len > MAX_RESULTS) {
            aj_kb_fail(kb, AJ_ERR_INTERNAL, "aj_kb_wgmma_wait: accumulator %d is not an array "
                       "of 1..%d f32", a, MAX_RESULTS);
            return;
        }
        LLVMTypeRef arr = LLVMGetAllocatedType(accs[a]);
        LLVMTypeRef elems[MAX_RESULTS], params[MAX_RESULTS];
        LLVMValueRef values[MAX_RESULTS];
        cons[0] = '\0';
        for (unsigned i = 0; i < len; i++) {
            LLVMValueRef idx[2] = {aj_kb_i32(kb, 0), aj_kb_i32(kb, i)};
            values[i] = LLVMBuildLoad2(kb->b, kb->t_f32,
                                       LLVMBuildInBoundsGEP2(kb->b, arr, accs[a], idx, 2, ""), "");
            elems[i] = params[i] = kb->t_f32;
            strncat(cons, "=f,", sizeof cons - strlen(cons) - 1);
        }
        for (unsigned i = 0; i < len; i++)
            snprintf(cons + strlen(cons), sizeof cons - strlen(cons), "%s%u", i ? "," : "", i);
        strncat(cons, ",~{memory}", sizeof cons - strlen(cons) - 1);
        LLVMTypeRef ret = LLVMStructTypeInContext(kb->llctx, elems, len, 0);
        LLVMTypeRef fty = LLVMFunctionType(ret, params, len, 0);
        LLVMValueRef fence = LLVMGetInlineAsm(fty, "", 0, cons, strlen(cons), 1, 0,
                                              LLVMInlineAsmDialectATT, 0);
        LLVMValueRef call = LLVMBuildCall2(kb->b, fty, fence, values, len, "");
        for (unsigned i = 0; i < len; i++) {
            LLVMValueRef idx[2] = {aj_kb_i32(kb, 0), aj_kb_i32(kb, i)};
            LLVMBuildStore(kb->b, LLVMBuildExtractValue(kb->b, call, i, ""),
                           LLVMBuildInBoundsGEP2(kb->b, arr, accs[a], idx, 2, ""));
        }
    }
}

size_t aj_intrinsic_sim_symbols(const char **names, size_t cap)
{
    size_t n = 0;
    for (int i = 0; i < AJ_INTR_COUNT && n < cap; i++)
        names[n++] = table[i].sim_symbol;
    return n;
}
