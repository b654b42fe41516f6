/*
 * intrinsics.c -- lowering of the intrinsic table (intrinsics.def) per
 * target.  nvptx: an NVVM intrinsic call or inline PTX.  sim: a call of
 * the emulator's function for it, with the thread state first.
 */
#include <string.h>

#include "codegen/kbuilder.h"

enum nvptx_kind { KIND_NVVM, KIND_ASM, KIND_SIMONLY };
enum arg_type { VOID, I16, I32, I64, F32, PTR3 };

typedef struct intrinsic_desc {
    const char *id_name;
    enum nvptx_kind kind;
    const char *text;
    const char *constraints;
    enum arg_type ret;
    int nargs;
    enum arg_type args[4];
    const char *sim_symbol;
} intrinsic_desc;

static const intrinsic_desc table[] = {
#define AJ_INTRINSIC(id, kind, text, cons, ret, nargs, a0, a1, a2, a3, sim) \
    {#id, KIND_##kind, text, cons, ret, nargs, {a0, a1, a2, a3}, sim},
#include "codegen/intrinsics.def"
#undef AJ_INTRINSIC
};

_Static_assert(sizeof table / sizeof table[0] == AJ_INTR_COUNT,
               "intrinsic table and enum disagree");

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
    case I16: return kb->t_i16;
    case I32: return kb->t_i32;
    case I64: return kb->t_i64;
    case F32: return kb->t_f32;
    case PTR3: return kb->t_sptr;
    default: return kb->t_void;
    }
}

static LLVMTypeRef desc_fn_type(aj_kb *kb, const intrinsic_desc *d)
{
    LLVMTypeRef params[4];
    for (int i = 0; i < d->nargs; i++)
        params[i] = llvm_type(kb, d->args[i]);
    return LLVMFunctionType(llvm_type(kb, d->ret), params, (unsigned)d->nargs, 0);
}

static LLVMValueRef undef_result(aj_kb *kb, const intrinsic_desc *d)
{
    return LLVMGetUndef(llvm_type(kb, d->ret == VOID ? I32 : d->ret));
}

static LLVMValueRef lower_nvptx(aj_kb *kb, const intrinsic_desc *d,
                                LLVMValueRef *args)
{
    LLVMTypeRef fty = desc_fn_type(kb, d);
    if (d->kind == KIND_SIMONLY) {
        aj_kb_fail(kb, AJ_ERR_INTERNAL, "intrinsic %s exists only on sim", d->id_name);
        return undef_result(kb, d);
    }
    LLVMValueRef callee;
    if (d->kind == KIND_NVVM) {
        unsigned id = LLVMLookupIntrinsicID(d->text, strlen(d->text));
        if (id == 0 || LLVMIntrinsicIsOverloaded(id)) {
            aj_kb_fail(kb, AJ_ERR_INTERNAL, "intrinsic '%s' is unknown to this LLVM", d->text);
            return undef_result(kb, d);
        }
        callee = LLVMGetIntrinsicDeclaration(kb->mod, id, NULL, 0);
    } else {
        callee = LLVMGetInlineAsm(fty, d->text, strlen(d->text), d->constraints,
                                  strlen(d->constraints), 0, 0,
                                  LLVMInlineAsmDialectATT, 0);
    }
    return LLVMBuildCall2(kb->b, fty, callee, args, (unsigned)d->nargs, "");
}

/* sim: `ret SIM_SYMBOL(ptr thread, args...)`, declared on first use */
static LLVMValueRef lower_sim(aj_kb *kb, const intrinsic_desc *d, LLVMValueRef *args)
{
    LLVMTypeRef params[5] = {kb->t_ptr};
    LLVMValueRef call_args[5] = {kb->sim_thread};
    for (int i = 0; i < d->nargs; i++) {
        params[i + 1] = llvm_type(kb, d->args[i]);
        call_args[i + 1] = args[i];
    }
    LLVMTypeRef fty = LLVMFunctionType(llvm_type(kb, d->ret), params,
                                       (unsigned)d->nargs + 1, 0);
    LLVMValueRef fn = LLVMGetNamedFunction(kb->mod, d->sim_symbol);
    if (!fn)
        fn = LLVMAddFunction(kb->mod, d->sim_symbol, fty);
    return LLVMBuildCall2(kb->b, fty, fn, call_args, (unsigned)d->nargs + 1, "");
}

LLVMValueRef aj_kb_intrinsic(aj_kb *kb, enum aj_intrinsic_id id,
                             LLVMValueRef *args)
{
    const intrinsic_desc *d = &table[id];
    switch (kb->target) {
    case AJ_TARGET_SM_80:
    case AJ_TARGET_SM_90:
    case AJ_TARGET_SM_90A:
        return lower_nvptx(kb, d, args);
    case AJ_TARGET_SIM:
        if (!kb->sim_thread) {
            aj_kb_fail(kb, AJ_ERR_INTERNAL, "intrinsic %s used outside a kernel", d->id_name);
            return undef_result(kb, d);
        }
        return lower_sim(kb, d, args);
    default:
        aj_kb_fail(kb, AJ_ERR_UNSUPPORTED, "intrinsic %s has no lowering for target '%s'",
                   d->id_name, aj_target_name(kb->target));
        return undef_result(kb, d);
    }
}

size_t aj_intrinsic_sim_symbols(const char **names, size_t cap)
{
    size_t n = 0;
    for (int i = 0; i < AJ_INTR_COUNT && n < cap; i++)
        names[n++] = table[i].sim_symbol;
    return n;
}
