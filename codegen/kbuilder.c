/*
 * kbuilder.c -- the kernel builder over LLVM-C (see kbuilder.h).
 */
#include "codegen/kbuilder.h"
#include "codegen/codegen.h"

#include <llvm-c/DebugInfo.h>
#include <llvm-c/Target.h>

#include <assert.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

aj_status aj_kb_init(aj_kb *kb, aj_ctx *ctx, LLVMContextRef llctx,
                     aj_target target, const char *module_name)
{
    memset(kb, 0, sizeof *kb);
    kb->ctx = ctx;
    kb->target = target;
    kb->desc = aj_target_desc_of(target);
    kb->llctx = llctx;
    kb->mod = LLVMModuleCreateWithNameInContext(module_name, llctx);
    kb->b = LLVMCreateBuilderInContext(llctx);
    kb->t_void = LLVMVoidTypeInContext(llctx);
    kb->t_i1 = LLVMInt1TypeInContext(llctx);
    kb->t_i8 = LLVMInt8TypeInContext(llctx);
    kb->t_i16 = LLVMInt16TypeInContext(llctx);
    kb->t_i32 = LLVMInt32TypeInContext(llctx);
    kb->t_i64 = LLVMInt64TypeInContext(llctx);
    kb->t_f32 = LLVMFloatTypeInContext(llctx);
    kb->t_gptr = LLVMPointerTypeInContext(llctx, AJ_AS_GLOBAL);
    kb->t_sptr = LLVMPointerTypeInContext(llctx, AJ_AS_SHARED);
    kb->t_ptr = LLVMPointerTypeInContext(llctx, AJ_AS_GENERIC);
    return AJ_OK;
}

void *aj_kb_scratch(aj_kb *kb, size_t bytes)
{
    void *p = calloc(1, bytes);
    if (!p) {
        aj_kb_fail(kb, AJ_ERR_OUT_OF_MEMORY, "out of memory building the kernel");
        return NULL;
    }
    if (!aj_kb_adopt(kb, p)) {
        free(p);
        return NULL;
    }
    return p;
}

bool aj_kb_adopt(aj_kb *kb, void *p)
{
    if (kb->num_scratch == kb->cap_scratch) {
        int cap = kb->cap_scratch ? 2 * kb->cap_scratch : 4;
        void **grown = realloc(kb->scratch, (size_t)cap * sizeof *grown);
        if (!grown) {
            aj_kb_fail(kb, AJ_ERR_OUT_OF_MEMORY, "out of memory building the kernel");
            return false;
        }
        kb->scratch = grown;
        kb->cap_scratch = cap;
    }
    kb->scratch[kb->num_scratch++] = p;
    return true;
}

void aj_kb_dispose(aj_kb *kb)
{
    for (int i = 0; i < kb->num_scratch; i++)
        free(kb->scratch[i]);
    free(kb->scratch);
    kb->scratch = NULL;
    kb->num_scratch = kb->cap_scratch = 0;
    if (kb->b)
        LLVMDisposeBuilder(kb->b);
    if (kb->mod)
        LLVMDisposeModule(kb->mod);
    kb->b = NULL;
    kb->mod = NULL;
}

aj_status aj_kb_fail(aj_kb *kb, aj_status st, const char *fmt, ...)
{
    if (kb->st != AJ_OK)
        return kb->st;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(kb->msg, sizeof kb->msg, fmt, ap);
    va_end(ap);
    kb->st = st;
    return st;
}

/* ---------------------------------------------------------------- params */

void aj_kb_add_param(aj_kb *kb, const char *name, aj_param_type type, int32_t id)
{
    if (kb->fn) {
        aj_kb_fail(kb, AJ_ERR_INTERNAL, "parameter '%s' declared after the kernel began", name);
        return;
    }
    if (kb->num_params == AJ_KB_MAX_PARAMS || strlen(name) >= sizeof kb->params[0].name) {
        aj_kb_fail(kb, AJ_ERR_INTERNAL, "too many or too long kernel parameters at '%s'", name);
        return;
    }
    for (int i = 0; i < kb->num_params; i++) {
        if (strcmp(kb->params[i].name, name) == 0) {   /* a lookup would find the first */
            aj_kb_fail(kb, AJ_ERR_INTERNAL, "kernel parameter '%s' declared twice", name);
            return;
        }
    }
    aj_kb_param_decl *p = &kb->params[kb->num_params++];
    snprintf(p->name, sizeof p->name, "%s", name);
    p->type = type;
    p->id = id;
}

/* A by-value blob (AJ_PARAM_BYVAL128) is a pointer to its bytes: on nvptx
 * a byval kernel parameter, which the driver copies from kernelParams into
 * the parameter space (.param .align 64 .b8 NAME[128], as a CUtensorMap);
 * on the host targets the bytes the launch keeps, whose address the entry
 * wrapper passes (codegen/host.c), readable as global memory. */
static LLVMTypeRef param_llvm_type(aj_kb *kb, aj_param_type type)
{
    switch (type) {
    case AJ_PARAM_BYVAL128:
        return kb->desc->family == AJ_FAMILY_NVPTX ? kb->t_ptr : kb->t_gptr;
    case AJ_PARAM_PTR: return kb->t_gptr;
    case AJ_PARAM_I32: return kb->t_i32;
    case AJ_PARAM_I64: return kb->t_i64;
    case AJ_PARAM_F32: return kb->t_f32;
    default: return kb->t_i32;
    }
}

void aj_kb_begin(aj_kb *kb, int32_t threads)
{
    aj_kb_begin_stage(kb, NULL, threads);
}

/* A kernel's arguments before its parameters: 1 for the sim thread state
 * or the cpu work item, else 0. */
static int hidden_args(const aj_kb *kb)
{
    return kb->desc->hidden != AJ_HIDDEN_NONE ? 1 : 0;
}

void aj_kb_begin_stage(aj_kb *kb, const char *stage_name, int32_t threads)
{
    if (kb->num_stages == AJ_KB_MAX_STAGES) {
        aj_kb_fail(kb, AJ_ERR_INTERNAL, "a module holds at most %d kernels", AJ_KB_MAX_STAGES);
        return;
    }
    aj_kb_stage *stage = &kb->stages[kb->num_stages];
    if (stage_name)
        snprintf(stage->entry, sizeof stage->entry, "%s_%s", kb->entry_name, stage_name);
    else
        snprintf(stage->entry, sizeof stage->entry, "%s", kb->entry_name);
    LLVMTypeRef types[AJ_KB_MAX_PARAMS + 1];
    const int hidden = hidden_args(kb);
    if (hidden)
        types[0] = kb->t_ptr;
    for (int i = 0; i < kb->num_params; i++)
        types[hidden + i] = param_llvm_type(kb, kb->params[i].type);
    LLVMTypeRef fty = LLVMFunctionType(kb->t_void, types,
                                       (unsigned)(kb->num_params + hidden), 0);
    kb->fn = LLVMAddFunction(kb->mod, stage->entry, fty);
    kb->block_threads = threads;
    if (kb->min_ctas_per_sm < 1)
        kb->min_ctas_per_sm = 1;
    if (kb->desc->hidden == AJ_HIDDEN_SIM_THREAD) {
        kb->sim_thread = LLVMGetParam(kb->fn, 0);
        LLVMSetValueName2(kb->sim_thread, "thread", 6);
    } else if (hidden) {
        kb->work_item = LLVMGetParam(kb->fn, 0);
        LLVMSetValueName2(kb->work_item, "item", 4);
    }
    int grid_constant[AJ_KB_MAX_PARAMS], n_grid_constant = 0;
    for (int i = 0; i < kb->num_params; i++) {
        LLVMValueRef p = LLVMGetParam(kb->fn, (unsigned)(hidden + i));
        LLVMSetValueName2(p, kb->params[i].name, strlen(kb->params[i].name));
        if (kb->params[i].type == AJ_PARAM_PTR) {
            /* Kernel pointers never alias each other's outputs in attnjit's
             * contract (q, k, v are read-only; o, lse write-only). */
            unsigned kind = LLVMGetEnumAttributeKindForName("noalias", 7);
            LLVMAddAttributeAtIndex(kb->fn, (unsigned)(hidden + i) + 1,
                                    LLVMCreateEnumAttribute(kb->llctx, kind, 0));
        } else if (kb->params[i].type == AJ_PARAM_BYVAL128 &&
                   kb->desc->family == AJ_FAMILY_NVPTX) {
            unsigned at = (unsigned)(hidden + i) + 1;
            LLVMTypeRef bytes = LLVMArrayType2(kb->t_i8, AJ_BYVAL_BYTES);
            unsigned byval = LLVMGetEnumAttributeKindForName("byval", 5);
            unsigned align = LLVMGetEnumAttributeKindForName("align", 5);
            LLVMAddAttributeAtIndex(kb->fn, at, LLVMCreateTypeAttribute(kb->llctx, byval, bytes));
            LLVMAddAttributeAtIndex(kb->fn, at,
                                    LLVMCreateEnumAttribute(kb->llctx, align, AJ_BYVAL_ALIGN));
            grid_constant[n_grid_constant++] = (int)at;
        }
    }
    /* grid-constant: the blob's address is the parameter's own (cvta.param),
     * which a TMA instruction takes as its tensor map, not a local copy */
    if (n_grid_constant)
        aj_nvptx_annotate_grid_constant(kb->mod, kb->fn, grid_constant, n_grid_constant);
    kb->entry = LLVMAppendBasicBlockInContext(kb->llctx, kb->fn, "entry");
    LLVMPositionBuilderAtEnd(kb->b, kb->entry);
    if (kb->desc->emulated)
        kb->smem_base = aj_kb_intrinsic(kb, AJ_INTR_SIM_SMEM, NULL);
}

/* The bytes of the allocas at the top of the entry block, where aj_kb_var
 * puts every variable, each rounded up to its alignment. */
static int64_t entry_stack_bytes(aj_kb *kb)
{
    LLVMTargetDataRef td = LLVMGetModuleDataLayout(kb->mod);
    int64_t bytes = 0;
    for (LLVMValueRef i = LLVMGetFirstInstruction(kb->entry); i; i = LLVMGetNextInstruction(i)) {
        if (LLVMGetInstructionOpcode(i) != LLVMAlloca)
            continue;
        int64_t align = LLVMGetAlignment(i) > 0 ? LLVMGetAlignment(i) : 16;
        int64_t size = (int64_t)LLVMABISizeOfType(td, LLVMGetAllocatedType(i));
        bytes += (size + align - 1) / align * align;
    }
    return bytes;
}

void aj_kb_finish(aj_kb *kb, const aj_kernel_layout *layout)
{
    if (kb->depth != 0)
        aj_kb_fail(kb, AJ_ERR_INTERNAL, "kernel finished with %d open scopes", kb->depth);
    if (!kb->fn) {
        aj_kb_fail(kb, AJ_ERR_INTERNAL, "kernel finished before it began");
        return;
    }
    LLVMBuildRetVoid(kb->b);
    aj_kb_stage *stage = &kb->stages[kb->num_stages++];
    stage->fn = kb->fn;
    memcpy(stage->params, kb->params, sizeof stage->params);
    stage->num_params = kb->num_params;
    stage->block_threads = kb->block_threads;
    stage->min_ctas_per_sm = kb->min_ctas_per_sm;
    stage->dynamic_smem = kb->dynamic_smem;
    stage->stack_bytes = entry_stack_bytes(kb);
    stage->layout = *layout;
    /* the next kernel starts from nothing: no parameters, no shared memory */
    kb->fn = NULL;
    kb->entry = NULL;
    kb->num_params = 0;
    kb->dynamic_smem = 0;
    kb->min_ctas_per_sm = 0;
    kb->sim_thread = NULL;
    kb->work_item = NULL;
    if (kb->desc->emulated)
        kb->smem_base = NULL;
}

/* ---------------------------------------------------------------- helpers */

/* The kernel's own arguments: the hidden one, then its parameters. */
static int own_args(const aj_kb *kb)
{
    return hidden_args(kb) + kb->num_params;
}

LLVMValueRef aj_kb_helper_begin(aj_kb *kb, const char *name, LLVMTypeRef ret,
                                LLVMTypeRef *extra, int n, aj_kb_helper_saved *saved)
{
    memset(saved, 0, sizeof *saved);
    if (kb->st != AJ_OK || !kb->fn)
        return NULL;
    const int own = own_args(kb);
    LLVMTypeRef types[AJ_KB_MAX_PARAMS + 1 + 16];
    if (n > 16) {
        aj_kb_fail(kb, AJ_ERR_INTERNAL, "a helper takes at most 16 extra arguments");
        return NULL;
    }
    LLVMGetParamTypes(LLVMGlobalGetValueType(kb->fn), types);
    for (int i = 0; i < n; i++)
        types[own + i] = extra[i];
    LLVMValueRef fn = LLVMAddFunction(kb->mod, name, LLVMFunctionType(ret, types,
                                                                      (unsigned)(own + n), 0));
    LLVMSetLinkage(fn, LLVMInternalLinkage);
    unsigned noinline = LLVMGetEnumAttributeKindForName("noinline", 8);
    LLVMAddAttributeAtIndex(fn, LLVMAttributeFunctionIndex,
                            LLVMCreateEnumAttribute(kb->llctx, noinline, 0));
    saved->fn = kb->fn, saved->sim_thread = kb->sim_thread, saved->work_item = kb->work_item;
    saved->entry = kb->entry, saved->at = LLVMGetInsertBlock(kb->b), saved->depth = kb->depth;
    memcpy(saved->scopes, kb->scopes, sizeof saved->scopes);
    kb->fn = fn;
    if (kb->sim_thread)
        kb->sim_thread = LLVMGetParam(fn, 0);
    if (kb->work_item)
        kb->work_item = LLVMGetParam(fn, 0);
    kb->entry = LLVMAppendBasicBlockInContext(kb->llctx, fn, "entry");
    kb->depth = 0;   /* the kernel's open scopes wait in *saved */
    LLVMPositionBuilderAtEnd(kb->b, kb->entry);
    return fn;
}

LLVMValueRef aj_kb_helper_arg(aj_kb *kb, int index)
{
    return LLVMGetParam(kb->fn, (unsigned)(own_args(kb) + index));
}

void aj_kb_helper_end(aj_kb *kb, LLVMValueRef value, aj_kb_helper_saved *saved)
{
    if (!saved->fn)
        return;
    if (kb->depth != 0)
        aj_kb_fail(kb, AJ_ERR_INTERNAL, "a helper ended with %d open scopes", kb->depth);
    if (value)
        LLVMBuildRet(kb->b, value);
    else
        LLVMBuildRetVoid(kb->b);
    memcpy(kb->scopes, saved->scopes, sizeof saved->scopes);
    kb->depth = saved->depth;
    kb->fn = saved->fn;
    kb->sim_thread = saved->sim_thread;
    kb->work_item = saved->work_item;
    kb->entry = saved->entry;
    LLVMPositionBuilderAtEnd(kb->b, saved->at);
}

LLVMValueRef aj_kb_helper_call(aj_kb *kb, LLVMValueRef fn, LLVMValueRef *extra, int n)
{
    const int own = own_args(kb), hidden = hidden_args(kb);
    LLVMValueRef args[AJ_KB_MAX_PARAMS + 1 + 16];
    for (int i = 0; i < own; i++) {
        /* not a by-value parameter (a TMA descriptor): NVPTX would copy a
         * kernel's byval argument to local memory once its address
         * escapes, for every use; a helper reads none */
        LLVMValueRef a = LLVMGetParam(kb->fn, (unsigned)i);
        args[i] = i >= hidden && kb->params[i - hidden].type == AJ_PARAM_BYVAL128
                      ? LLVMGetPoison(LLVMTypeOf(a)) : a;
    }
    for (int i = 0; i < n; i++)
        args[own + i] = extra[i];
    return LLVMBuildCall2(kb->b, LLVMGlobalGetValueType(fn), fn, args, (unsigned)(own + n), "");
}

LLVMValueRef aj_kb_param(aj_kb *kb, const char *name)
{
    const int hidden = hidden_args(kb);
    for (int i = 0; kb->fn && i < kb->num_params; i++)
        if (strcmp(kb->params[i].name, name) == 0)
            return LLVMGetParam(kb->fn, (unsigned)(hidden + i));
    aj_kb_fail(kb, AJ_ERR_INTERNAL, "no kernel parameter named '%s'", name);
    return LLVMGetUndef(kb->t_i32);
}

LLVMValueRef aj_kb_param_id(aj_kb *kb, int32_t id, const char *name)
{
    const int hidden = hidden_args(kb);
    for (int i = 0; kb->fn && i < kb->num_params; i++)
        if (kb->params[i].id == id)
            return LLVMGetParam(kb->fn, (unsigned)(hidden + i));
    aj_kb_fail(kb, AJ_ERR_INTERNAL, "the kernel has no parameter '%s'", name);
    return LLVMGetUndef(kb->t_i32);
}

/* ---------------------------------------------------------------- values */

LLVMValueRef aj_kb_i32(aj_kb *kb, int64_t v)
{
    return LLVMConstInt(kb->t_i32, (unsigned long long)v, 1);
}

LLVMValueRef aj_kb_i64(aj_kb *kb, int64_t v)
{
    return LLVMConstInt(kb->t_i64, (unsigned long long)v, 1);
}

LLVMValueRef aj_kb_f32(aj_kb *kb, double v)
{
    return LLVMConstReal(kb->t_f32, v);
}

LLVMValueRef aj_kb_var(aj_kb *kb, LLVMTypeRef type, LLVMValueRef init,
                       const char *name)
{
    /* Allocas at the top of the entry block are what SROA promotes. */
    LLVMBasicBlockRef here = LLVMGetInsertBlock(kb->b);
    LLVMValueRef first = LLVMGetFirstInstruction(kb->entry);
    if (first)
        LLVMPositionBuilderBefore(kb->b, first);
    else
        LLVMPositionBuilderAtEnd(kb->b, kb->entry);
    LLVMValueRef var = LLVMBuildAlloca(kb->b, type, name);
    LLVMPositionBuilderAtEnd(kb->b, here);
    if (init)
        LLVMBuildStore(kb->b, init, var);
    return var;
}

LLVMValueRef aj_kb_get(aj_kb *kb, LLVMValueRef var)
{
    return LLVMBuildLoad2(kb->b, LLVMGetAllocatedType(var), var, "");
}

void aj_kb_set(aj_kb *kb, LLVMValueRef var, LLVMValueRef value)
{
    LLVMBuildStore(kb->b, value, var);
}

/* ---------------------------------------------------------------- control */

static struct aj_kb_scope *push_scope(aj_kb *kb)
{
    if (kb->depth == AJ_KB_MAX_NEST) {
        aj_kb_fail(kb, AJ_ERR_INTERNAL, "control flow nested deeper than %d", AJ_KB_MAX_NEST);
        return NULL;
    }
    struct aj_kb_scope *s = &kb->scopes[kb->depth++];
    memset(s, 0, sizeof *s);
    return s;
}

static struct aj_kb_scope *top_scope(aj_kb *kb, int want_loop)
{
    if (kb->depth == 0 || kb->scopes[kb->depth - 1].is_loop != want_loop) {
        aj_kb_fail(kb, AJ_ERR_INTERNAL, "unbalanced %s scope", want_loop ? "loop" : "if");
        return NULL;
    }
    return &kb->scopes[kb->depth - 1];
}

/*
 *   pre ──► head: i = phi(begin, i+step); if i < end ──► body ... ──► latch
 *             ▲                            └──────────► exit       │
 *             └────────────────────────────────────────────────────┘
 */
LLVMValueRef aj_kb_for_begin(aj_kb *kb, LLVMValueRef begin, LLVMValueRef end,
                             LLVMValueRef step, const char *name)
{
    struct aj_kb_scope *s = push_scope(kb);
    if (!s)
        return begin;
    s->is_loop = 1;
    LLVMBasicBlockRef pre = LLVMGetInsertBlock(kb->b);
    s->head = LLVMAppendBasicBlockInContext(kb->llctx, kb->fn, "loop.head");
    s->body = LLVMAppendBasicBlockInContext(kb->llctx, kb->fn, "loop.body");
    s->latch = LLVMAppendBasicBlockInContext(kb->llctx, kb->fn, "loop.latch");
    s->exit = LLVMAppendBasicBlockInContext(kb->llctx, kb->fn, "loop.exit");
    s->end = end;
    s->step = step;
    LLVMBuildBr(kb->b, s->head);
    LLVMPositionBuilderAtEnd(kb->b, s->head);
    s->var = LLVMBuildPhi(kb->b, LLVMTypeOf(begin), name);
    LLVMAddIncoming(s->var, &begin, &pre, 1);
    LLVMValueRef more = LLVMBuildICmp(kb->b, LLVMIntSLT, s->var, end, "");
    LLVMBuildCondBr(kb->b, more, s->body, s->exit);
    LLVMPositionBuilderAtEnd(kb->b, s->body);
    return s->var;
}

void aj_kb_loop_no_unroll(aj_kb *kb)
{
    struct aj_kb_scope *s = top_scope(kb, 1);
    if (s)
        s->no_unroll = 1;
}

/* !llvm.loop !0 on the back edge, !0 = distinct !{!0, !{"llvm.loop.unroll.disable"}}:
 * the loop ID refers to itself, so it is made through a temporary node. */
static void mark_no_unroll(aj_kb *kb, LLVMValueRef back_edge)
{
    static const char disable[] = "llvm.loop.unroll.disable";
    LLVMMetadataRef tmp = LLVMTemporaryMDNode(kb->llctx, NULL, 0);
    LLVMMetadataRef hint = LLVMMDStringInContext2(kb->llctx, disable, sizeof disable - 1);
    LLVMMetadataRef hint_node = LLVMMDNodeInContext2(kb->llctx, &hint, 1);
    LLVMMetadataRef ops[2] = {tmp, hint_node};
    LLVMMetadataRef id = LLVMMDNodeInContext2(kb->llctx, ops, 2);
    LLVMMetadataReplaceAllUsesWith(tmp, id);
    static const char kind[] = "llvm.loop";
    LLVMSetMetadata(back_edge, LLVMGetMDKindIDInContext(kb->llctx, kind, sizeof kind - 1),
                    LLVMMetadataAsValue(kb->llctx, id));
}

void aj_kb_for_end(aj_kb *kb)
{
    struct aj_kb_scope *s = top_scope(kb, 1);
    if (!s)
        return;
    LLVMBuildBr(kb->b, s->latch);
    LLVMPositionBuilderAtEnd(kb->b, s->latch);
    LLVMValueRef next = LLVMBuildNSWAdd(kb->b, s->var, s->step, "");
    LLVMAddIncoming(s->var, &next, &s->latch, 1);
    LLVMValueRef back = LLVMBuildBr(kb->b, s->head);
    if (s->no_unroll)
        mark_no_unroll(kb, back);
    LLVMPositionBuilderAtEnd(kb->b, s->exit);
    kb->depth--;
}

void aj_kb_if_begin(aj_kb *kb, LLVMValueRef cond)
{
    struct aj_kb_scope *s = push_scope(kb);
    if (!s)
        return;
    s->body = LLVMAppendBasicBlockInContext(kb->llctx, kb->fn, "if.then");
    s->else_bb = LLVMAppendBasicBlockInContext(kb->llctx, kb->fn, "if.else");
    s->exit = LLVMAppendBasicBlockInContext(kb->llctx, kb->fn, "if.end");
    LLVMBuildCondBr(kb->b, cond, s->body, s->else_bb);
    LLVMPositionBuilderAtEnd(kb->b, s->body);
}

void aj_kb_else(aj_kb *kb)
{
    struct aj_kb_scope *s = top_scope(kb, 0);
    if (!s)
        return;
    LLVMBuildBr(kb->b, s->exit);
    LLVMPositionBuilderAtEnd(kb->b, s->else_bb);
    s->else_bb = NULL;
}

void aj_kb_if_end(aj_kb *kb)
{
    struct aj_kb_scope *s = top_scope(kb, 0);
    if (!s)
        return;
    LLVMBuildBr(kb->b, s->exit);
    if (s->else_bb) {
        /* no else branch was written: it falls through */
        LLVMPositionBuilderAtEnd(kb->b, s->else_bb);
        LLVMBuildBr(kb->b, s->exit);
    }
    LLVMPositionBuilderAtEnd(kb->b, s->exit);
    kb->depth--;
}

/* ---------------------------------------------------------------- memory */

int32_t aj_kb_smem_reserve(aj_kb *kb, int32_t bytes)
{
    int32_t off = kb->dynamic_smem;
    kb->dynamic_smem += (bytes + 15) & ~15;
    return off;
}

int32_t aj_kb_smem_reserve_aligned(aj_kb *kb, int32_t bytes, int32_t align)
{
    if (align < 16 || align > 1024 || (align & (align - 1))) {
        aj_kb_fail(kb, AJ_ERR_INTERNAL, "aj_kb_smem_reserve_aligned: align = %d is not a power "
                   "of two in 16..1024", align);
        return 0;
    }
    kb->dynamic_smem = (kb->dynamic_smem + align - 1) & ~(align - 1);
    if (align > kb->smem_align) {
        kb->smem_align = align;
        if (kb->smem_base && !kb->desc->emulated)
            LLVMSetAlignment(kb->smem_base, (unsigned)align);
    }
    return aj_kb_smem_reserve(kb, bytes);
}

void aj_kb_row_align(aj_kb *kb, aj_row_tensor t, int32_t bytes)
{
    if ((unsigned)t >= AJ_ROW_TENSORS || !aj_row_align_valid(bytes)) {
        aj_kb_fail(kb, AJ_ERR_INTERNAL, "aj_kb_row_align: tensor %d, %d bytes", (int)t, bytes);
        return;
    }
    if (bytes > kb->row_align[t])
        kb->row_align[t] = bytes;
}

int32_t aj_row_align_default(aj_dtype dtype)
{
    return aj_dtype_size(dtype) == 1 ? 8 : 16;
}

LLVMValueRef aj_kb_smem_ptr(aj_kb *kb, LLVMValueRef byte_offset)
{
    /* sim: the base is the CTA's arena, fetched once in aj_kb_begin */
    if (!kb->smem_base) {
        /* extern __shared__ char smem[] -- sized at launch */
        LLVMTypeRef arr = LLVMArrayType2(kb->t_i8, 0);
        kb->smem_base = LLVMAddGlobalInAddressSpace(kb->mod, arr, "aj_smem", AJ_AS_SHARED);
        LLVMSetLinkage(kb->smem_base, LLVMExternalLinkage);
        LLVMSetAlignment(kb->smem_base, kb->smem_align > 16 ? (unsigned)kb->smem_align : 16);
    }
    return LLVMBuildInBoundsGEP2(kb->b, kb->t_i8, kb->smem_base, &byte_offset, 1, "");
}

LLVMValueRef aj_kb_gptr_offset(aj_kb *kb, LLVMValueRef base,
                               LLVMValueRef byte_offset)
{
    return LLVMBuildInBoundsGEP2(kb->b, kb->t_i8, base, &byte_offset, 1, "");
}

/* sim: the emulator checks [ptr, ptr + size) before the access happens */
static void sim_check_access(aj_kb *kb, LLVMTypeRef type, LLVMValueRef ptr, int is_store)
{
    if (!kb->desc->emulated)
        return;
    LLVMTargetDataRef dl = LLVMGetModuleDataLayout(kb->mod);
    unsigned long long size = LLVMStoreSizeOfType(dl, type);
    int shared = LLVMGetPointerAddressSpace(LLVMTypeOf(ptr)) == AJ_AS_SHARED;
    LLVMValueRef args[3] = {LLVMBuildPtrToInt(kb->b, ptr, kb->t_i64, ""),
                            aj_kb_i32(kb, (int64_t)size),
                            aj_kb_i32(kb, is_store | shared << 1)};
    aj_kb_intrinsic(kb, AJ_INTR_SIM_CHECK, args);
}

LLVMValueRef aj_kb_load(aj_kb *kb, LLVMTypeRef type, LLVMValueRef ptr,
                        unsigned align)
{
    sim_check_access(kb, type, ptr, 0);
    LLVMValueRef v = LLVMBuildLoad2(kb->b, type, ptr, "");
    LLVMSetAlignment(v, align);
    return v;
}

void aj_kb_store(aj_kb *kb, LLVMValueRef value, LLVMValueRef ptr,
                 unsigned align)
{
    sim_check_access(kb, LLVMTypeOf(value), ptr, 1);
    LLVMValueRef st = LLVMBuildStore(kb->b, value, ptr);
    LLVMSetAlignment(st, align);
}

void aj_kb_atomic_umin_i32(aj_kb *kb, LLVMValueRef ptr, LLVMValueRef value)
{
    sim_check_access(kb, kb->t_i32, ptr, 1);
    LLVMBuildAtomicRMW(kb->b, LLVMAtomicRMWBinOpUMin, ptr, value, LLVMAtomicOrderingMonotonic,
                       0);
}

/* ---------------------------------------------------------------- GPU ops */

LLVMValueRef aj_kb_thread_id(aj_kb *kb)
{
    return aj_kb_intrinsic(kb, AJ_INTR_TID_X, NULL);
}

LLVMValueRef aj_kb_block_id(aj_kb *kb, int dim)
{
    static const enum aj_intrinsic_id ids[3] = {
        AJ_INTR_CTAID_X, AJ_INTR_CTAID_Y, AJ_INTR_CTAID_Z};
    return aj_kb_intrinsic(kb, ids[dim], NULL);
}

LLVMValueRef aj_kb_item_id(aj_kb *kb, int dim)
{
    if (!kb->work_item)
        return aj_kb_block_id(kb, dim);
    LLVMValueRef at = aj_kb_i32(kb, dim);
    LLVMValueRef ptr = LLVMBuildGEP2(kb->b, kb->t_i32, kb->work_item, &at, 1, "");
    return LLVMBuildLoad2(kb->b, kb->t_i32, ptr, "");
}

void aj_kb_barrier(aj_kb *kb)
{
    aj_kb_intrinsic(kb, AJ_INTR_BARRIER, NULL);
}

static LLVMValueRef group_reduce(aj_kb *kb, LLVMValueRef v, int width, int is_max)
{
    for (int lane_mask = width / 2; lane_mask >= 1; lane_mask /= 2) {
        LLVMValueRef args[4] = {aj_kb_i32(kb, -1), v, aj_kb_i32(kb, lane_mask),
                                aj_kb_i32(kb, 0x1f)};
        LLVMValueRef other = aj_kb_intrinsic(kb, AJ_INTR_SHFL_BFLY_F32, args);
        v = is_max ? aj_kb_fmax(kb, v, other) : LLVMBuildFAdd(kb->b, v, other, "");
    }
    return v;
}

LLVMValueRef aj_kb_group_max(aj_kb *kb, LLVMValueRef v, int width)
{
    return group_reduce(kb, v, width, 1);
}

LLVMValueRef aj_kb_group_sum(aj_kb *kb, LLVMValueRef v, int width)
{
    return group_reduce(kb, v, width, 0);
}

LLVMValueRef aj_kb_exp2(aj_kb *kb, LLVMValueRef x)
{
    return aj_kb_intrinsic(kb, AJ_INTR_EX2_APPROX, &x);
}

LLVMValueRef aj_kb_log2(aj_kb *kb, LLVMValueRef x)
{
    return aj_kb_intrinsic(kb, AJ_INTR_LG2_APPROX, &x);
}

/* ---------------------------------------------------------------- warp ops */

static LLVMValueRef vote(aj_kb *kb, enum aj_intrinsic_id id, LLVMValueRef pred)
{
    LLVMValueRef args[2] = {aj_kb_i32(kb, -1), pred};
    return aj_kb_intrinsic(kb, id, args);
}

LLVMValueRef aj_kb_ballot(aj_kb *kb, LLVMValueRef pred)
{
    return vote(kb, AJ_INTR_VOTE_BALLOT, pred);
}

LLVMValueRef aj_kb_vote_all(aj_kb *kb, LLVMValueRef pred)
{
    return vote(kb, AJ_INTR_VOTE_ALL, pred);
}

LLVMValueRef aj_kb_vote_any(aj_kb *kb, LLVMValueRef pred)
{
    return vote(kb, AJ_INTR_VOTE_ANY, pred);
}

void aj_kb_mma_m16n8k16(aj_kb *kb, aj_dtype dtype, const LLVMValueRef a[4],
                        const LLVMValueRef b[2], const LLVMValueRef c[4],
                        LLVMValueRef d[4])
{
    if (dtype != AJ_DTYPE_F16 && dtype != AJ_DTYPE_BF16) {
        aj_kb_fail(kb, AJ_ERR_INTERNAL, "mma.m16n8k16 takes f16 or bf16 inputs, not %s",
                   aj_dtype_name(dtype));
        for (int i = 0; i < 4; i++)
            d[i] = LLVMGetUndef(kb->t_f32);
        return;
    }
    LLVMValueRef args[10] = {a[0], a[1], a[2], a[3], b[0], b[1], c[0], c[1], c[2], c[3]};
    aj_kb_intrinsic_results(kb, dtype == AJ_DTYPE_F16 ? AJ_INTR_MMA_M16N8K16_F16
                                                      : AJ_INTR_MMA_M16N8K16_BF16,
                            args, d);
}

void aj_kb_mma_m16n8k32(aj_kb *kb, aj_dtype a_type, aj_dtype b_type, const LLVMValueRef a[4],
                        const LLVMValueRef b[2], const LLVMValueRef c[4], LLVMValueRef d[4])
{
    const enum aj_intrinsic_id id =
        a_type == AJ_DTYPE_F8E4M3 && b_type == AJ_DTYPE_F8E4M3   ? AJ_INTR_MMA_M16N8K32_E4M3
        : a_type == AJ_DTYPE_F8E5M2 && b_type == AJ_DTYPE_F8E5M2 ? AJ_INTR_MMA_M16N8K32_E5M2
        : a_type == AJ_DTYPE_F8E4M3 && b_type == AJ_DTYPE_F8E5M2 ? AJ_INTR_MMA_M16N8K32_E4M3_E5M2
                                                                  : AJ_INTR_COUNT;
    if (id == AJ_INTR_COUNT || kb->desc->f8_mma == AJ_F8_MMA_NONE) {
        if (id == AJ_INTR_COUNT)
            aj_kb_fail(kb, AJ_ERR_UNSUPPORTED, "mma.m16n8k32 here takes f8e4m3 x f8e4m3, "
                       "f8e5m2 x f8e5m2 or f8e4m3 x f8e5m2 inputs, not %s x %s",
                       aj_dtype_name(a_type), aj_dtype_name(b_type));
        else
            aj_kb_fail(kb, AJ_ERR_UNSUPPORTED, "mma.m16n8k32 with 8-bit floats needs compute "
                       "capability 8.9 or newer; %s has no FP8 tensor cores",
                       aj_target_name(kb->target));
        for (int i = 0; i < 4; i++)
            d[i] = LLVMGetUndef(kb->t_f32);
        return;
    }
    /* PTX ISA 8.4 extended mma to .e4m3 / .e5m2 */
    if (kb->desc->family == AJ_FAMILY_NVPTX && kb->ptx_isa_min < 84)
        kb->ptx_isa_min = 84;
    LLVMValueRef args[10] = {a[0], a[1], a[2], a[3], b[0], b[1], c[0], c[1], c[2], c[3]};
    aj_kb_intrinsic_results(kb, id, args, d);
}

void aj_kb_ldmatrix(aj_kb *kb, int count, int trans, LLVMValueRef smem_ptr,
                    LLVMValueRef out[4])
{
    static const enum aj_intrinsic_id ids[2][3] = {
        {AJ_INTR_LDMATRIX_X1, AJ_INTR_LDMATRIX_X2, AJ_INTR_LDMATRIX_X4},
        {AJ_INTR_LDMATRIX_X1_T, AJ_INTR_LDMATRIX_X2_T, AJ_INTR_LDMATRIX_X4_T},
    };
    int which = count == 1 ? 0 : count == 2 ? 1 : count == 4 ? 2 : -1;
    if (which < 0) {
        aj_kb_fail(kb, AJ_ERR_INTERNAL, "ldmatrix loads 1, 2 or 4 matrices, not %d", count);
        for (int i = 0; i < 4; i++)
            out[i] = LLVMGetUndef(kb->t_i32);
        return;
    }
    aj_kb_intrinsic_results(kb, ids[trans != 0][which], &smem_ptr, out);
}

void aj_kb_cp_async_16(aj_kb *kb, LLVMValueRef smem_ptr, LLVMValueRef gptr,
                       LLVMValueRef src_bytes)
{
    LLVMValueRef args[3] = {smem_ptr, gptr, src_bytes};
    aj_kb_intrinsic(kb, src_bytes ? AJ_INTR_CP_ASYNC_16_ZFILL : AJ_INTR_CP_ASYNC_16, args);
}

void aj_kb_cp_async_commit(aj_kb *kb)
{
    aj_kb_intrinsic(kb, AJ_INTR_CP_ASYNC_COMMIT, NULL);
}

void aj_kb_cp_async_wait(aj_kb *kb, int pending_groups)
{
    if (pending_groups < 0) {
        aj_kb_fail(kb, AJ_ERR_INTERNAL, "cp.async.wait_group %d: the count of groups left "
                   "pending cannot be negative", pending_groups);
        return;
    }
    LLVMValueRef n = aj_kb_i32(kb, pending_groups);
    aj_kb_intrinsic(kb, AJ_INTR_CP_ASYNC_WAIT_GROUP, &n);
}

/*
 * The descriptor's fields (PTX ISA, "Asynchronous Warpgroup Level Matrix
 * Shared Memory Layout: Matrix Descriptor"), addresses and offsets in
 * units of 16 bytes:
 *
 *   bits 0-13 start address   16-29 leading byte offset   32-45 stride byte
 *   offset   49-51 base offset (0)   62-63 swizzle: 0 none, 1 128B, 2 64B, 3 32B
 *
 * The start address is the shared-window address: on sim, the offset in
 * the CTA's shared memory (runtime/sim/wgmma.c reads it so).
 */
LLVMValueRef aj_kb_wgmma_desc(aj_kb *kb, LLVMValueRef smem_ptr, int lbo, int sbo, int swizzle)
{
    LLVMValueRef addr = LLVMBuildPtrToInt(kb->b, smem_ptr, kb->t_i64, "");
    if (kb->target == AJ_TARGET_SIM)
        addr = LLVMBuildSub(kb->b, addr, LLVMBuildPtrToInt(kb->b, kb->smem_base, kb->t_i64, ""),
                            "");
    LLVMValueRef start = LLVMBuildAnd(kb->b, LLVMBuildLShr(kb->b, addr, aj_kb_i64(kb, 4), ""),
                                      aj_kb_i64(kb, 0x3fff), "");
    uint64_t fields = (uint64_t)((lbo >> 4) & 0x3fff) << 16 |
                      (uint64_t)((sbo >> 4) & 0x3fff) << 32 | (uint64_t)(swizzle & 3) << 62;
    return LLVMBuildOr(kb->b, start, LLVMConstInt(kb->t_i64, fields, 0), "");
}

LLVMValueRef aj_kb_wgmma_desc_plus(aj_kb *kb, LLVMValueRef desc, int64_t bytes)
{
    return bytes ? LLVMBuildAdd(kb->b, desc, aj_kb_i64(kb, bytes >> 4), "") : desc;
}

LLVMValueRef aj_kb_opaque(aj_kb *kb, LLVMValueRef v)
{
    if (kb->desc->family != AJ_FAMILY_NVPTX)
        return v;
    LLVMTypeRef t = LLVMTypeOf(v);
    assert(LLVMGetTypeKind(t) == LLVMIntegerTypeKind &&
           (LLVMGetIntTypeWidth(t) == 32 || LLVMGetIntTypeWidth(t) == 64));
    int wide = LLVMGetIntTypeWidth(t) == 64;
    const char *text = wide ? "mov.b64 $0, $1;" : "mov.b32 $0, $1;";
    const char *cons = wide ? "=l,l" : "=r,r";
    LLVMTypeRef fty = LLVMFunctionType(t, &t, 1, 0);
    LLVMValueRef asm_fn = LLVMGetInlineAsm(fty, text, strlen(text), cons, strlen(cons), 1, 0,
                                           LLVMInlineAsmDialectATT, 0);
    return LLVMBuildCall2(kb->b, fty, asm_fn, &v, 1, "");
}

LLVMValueRef aj_kb_swizzle(aj_kb *kb, LLVMValueRef offset, int span)
{
    LLVMValueRef bits = LLVMBuildAnd(kb->b, LLVMBuildLShr(kb->b, offset, aj_kb_i32(kb, 7), ""),
                                     aj_kb_i32(kb, span / 16 - 1), "");
    return LLVMBuildXor(kb->b, offset, LLVMBuildShl(kb->b, bits, aj_kb_i32(kb, 4), ""), "");
}

int aj_kb_swizzle_mode(int span)
{
    return span == 128 ? AJ_WGMMA_SWIZZLE_128B : span == 64 ? AJ_WGMMA_SWIZZLE_64B
         : span == 32 ? AJ_WGMMA_SWIZZLE_32B : AJ_WGMMA_SWIZZLE_NONE;
}

void aj_kb_mbarrier_wait(aj_kb *kb, LLVMValueRef bar, LLVMValueRef parity)
{
    if (kb->st != AJ_OK)
        return;
    LLVMBasicBlockRef poll = LLVMAppendBasicBlockInContext(kb->llctx, kb->fn, "mbar.poll");
    LLVMBasicBlockRef done = LLVMAppendBasicBlockInContext(kb->llctx, kb->fn, "mbar.done");
    LLVMBuildBr(kb->b, poll);
    LLVMPositionBuilderAtEnd(kb->b, poll);
    LLVMValueRef args[2] = {bar, parity};
    LLVMValueRef complete = aj_kb_intrinsic(kb, AJ_INTR_MBARRIER_TRY_WAIT_PARITY, args);
    LLVMBuildCondBr(kb->b, LLVMBuildICmp(kb->b, LLVMIntNE, complete, aj_kb_i32(kb, 0), ""),
                    done, poll);
    LLVMPositionBuilderAtEnd(kb->b, done);
}

void aj_kb_cp_async_wait_all(aj_kb *kb)
{
    aj_kb_intrinsic(kb, AJ_INTR_CP_ASYNC_WAIT_ALL, NULL);
}

/* ---------------------------------------------------------------- dtypes */

LLVMTypeRef aj_kb_storage_type(aj_kb *kb, aj_dtype dtype)
{
    return dtype == AJ_DTYPE_F32 ? kb->t_f32 : dtype >= AJ_DTYPE_F8E4M3 ? kb->t_i8 : kb->t_i16;
}

/* Scalar type `scalar` shaped like t (itself, or a vector of t's lanes). */
static LLVMTypeRef type_like(LLVMTypeRef t, LLVMTypeRef scalar)
{
    return LLVMGetTypeKind(t) == LLVMVectorTypeKind ? LLVMVectorType(scalar, LLVMGetVectorSize(t))
                                                    : scalar;
}

/* Scalar constant c shaped like t (itself, or splat over t's lanes). */
static LLVMValueRef const_like(LLVMTypeRef t, LLVMValueRef c)
{
    if (LLVMGetTypeKind(t) != LLVMVectorTypeKind)
        return c;
    unsigned n = LLVMGetVectorSize(t);
    LLVMValueRef lanes[64];
    assert(n <= 64);
    for (unsigned i = 0; i < n; i++)
        lanes[i] = c;
    return LLVMConstVector(lanes, n);
}

/* c as an i16 constant shaped like t (i16, or a vector of i16) */
static LLVMValueRef i16_like(LLVMTypeRef t, unsigned c)
{
    return const_like(t, LLVMConstInt(LLVMInt16TypeInContext(LLVMGetTypeContext(t)), c, 0));
}

/* An f16 (its bits in i16, or a half; scalar or vector) as f32: the SIMT
 * targets' conversion for a scalar, an fpext otherwise. */
static LLVMValueRef f16_to_f32(aj_kb *kb, LLVMValueRef h)
{
    LLVMTypeRef t = LLVMTypeOf(h);
    LLVMTypeRef half = type_like(t, LLVMHalfTypeInContext(kb->llctx));
    if (kb->desc->simt && LLVMGetTypeKind(t) != LLVMVectorTypeKind) {
        if (t == half)   /* the conversion takes the bits */
            h = LLVMBuildBitCast(kb->b, h, kb->t_i16, "");
        return aj_kb_intrinsic(kb, AJ_INTR_CVT_F32_F16, &h);
    }
    if (t != half)
        h = LLVMBuildBitCast(kb->b, h, half, "");
    return LLVMBuildFPExt(kb->b, h, type_like(t, kb->t_f32), "");
}

LLVMValueRef aj_kb_to_f32(aj_kb *kb, LLVMValueRef v, aj_dtype dtype)
{
    LLVMTypeRef t = LLVMTypeOf(v);
    switch (dtype) {
    case AJ_DTYPE_F16:
        return f16_to_f32(kb, v);
    case AJ_DTYPE_BF16: {
        /* bf16 is the top half of an f32: widening is exact bit moving */
        LLVMValueRef w = LLVMBuildZExt(kb->b, v, type_like(t, kb->t_i32), "");
        w = LLVMBuildShl(kb->b, w, const_like(t, aj_kb_i32(kb, 16)), "");
        return LLVMBuildBitCast(kb->b, w, type_like(t, kb->t_f32), "");
    }
    case AJ_DTYPE_F8E4M3:
    case AJ_DTYPE_F8E5M2: {
        LLVMValueRef f = f16_to_f32(kb, aj_kb_f8_to_f16_bits(kb, v, dtype));
        return dtype == AJ_DTYPE_F8E5M2
                   ? f
                   : LLVMBuildFMul(kb->b, f, const_like(t, aj_kb_f32(kb, AJ_F8E4M3_F16_FACTOR)),
                                   "");
    }
    default:
        return v;
    }
}

LLVMValueRef aj_kb_f8_to_f16_bits(aj_kb *kb, LLVMValueRef v, aj_dtype dtype)
{
    LLVMBuilderRef b = kb->b;
    LLVMTypeRef t = LLVMTypeOf(v);
    LLVMTypeRef wide = LLVMGetTypeKind(t) == LLVMVectorTypeKind
                           ? LLVMVectorType(kb->t_i16, LLVMGetVectorSize(t))
                           : kb->t_i16;
    LLVMValueRef w = LLVMBuildZExt(b, v, wide, "");
    if (dtype == AJ_DTYPE_F8E5M2)
        return LLVMBuildShl(b, w, i16_like(wide, 8), "");
    LLVMValueRef sign = LLVMBuildAnd(b, w, i16_like(wide, 0x80), "");
    LLVMValueRef mag = LLVMBuildAnd(b, w, i16_like(wide, 0x7f), "");
    return LLVMBuildOr(b, LLVMBuildShl(b, sign, i16_like(wide, 8), ""),
                       LLVMBuildShl(b, mag, i16_like(wide, 7), ""), "");
}

LLVMValueRef aj_kb_from_f32(aj_kb *kb, LLVMValueRef v, aj_dtype dtype)
{
    switch (dtype) {
    case AJ_DTYPE_F16:
        return aj_kb_intrinsic(kb, AJ_INTR_CVT_F16_F32, &v);
    case AJ_DTYPE_BF16:
        return aj_kb_intrinsic(kb, AJ_INTR_CVT_BF16_F32, &v);
    default:
        return v;
    }
}

LLVMValueRef aj_kb_e4m3x2(aj_kb *kb, LLVMValueRef lo, LLVMValueRef hi)
{
    if (kb->desc->f8_mma == AJ_F8_MMA_NONE) {
        aj_kb_fail(kb, AJ_ERR_UNSUPPORTED, "cvt to e4m3 needs compute capability 8.9 or newer; "
                   "%s has no FP8 conversions", aj_target_name(kb->target));
        return LLVMGetUndef(kb->t_i16);
    }
    LLVMValueRef args[2] = {hi, lo};
    return aj_kb_intrinsic(kb, AJ_INTR_CVT_E4M3X2_F32, args);
}

/* ---------------------------------------------------------------- arith */

LLVMValueRef aj_kb_fmax(aj_kb *kb, LLVMValueRef a, LLVMValueRef b)
{
    /* maxnum: a NaN operand yields the other one, like PTX max.f32 */
    LLVMTypeRef t = kb->t_f32;
    unsigned id = LLVMLookupIntrinsicID("llvm.maxnum", 11);
    LLVMValueRef fn = LLVMGetIntrinsicDeclaration(kb->mod, id, &t, 1);
    LLVMValueRef args[2] = {a, b};
    return LLVMBuildCall2(kb->b, LLVMIntrinsicGetType(kb->llctx, id, &t, 1), fn, args, 2, "");
}

LLVMValueRef aj_kb_fma(aj_kb *kb, LLVMValueRef a, LLVMValueRef b,
                       LLVMValueRef c)
{
    LLVMTypeRef t = kb->t_f32;
    unsigned id = LLVMLookupIntrinsicID("llvm.fma", 8);
    LLVMValueRef fn = LLVMGetIntrinsicDeclaration(kb->mod, id, &t, 1);
    LLVMValueRef args[3] = {a, b, c};
    return LLVMBuildCall2(kb->b, LLVMIntrinsicGetType(kb->llctx, id, &t, 1), fn, args, 3, "");
}

LLVMValueRef aj_kb_smin(aj_kb *kb, LLVMValueRef a, LLVMValueRef b)
{
    LLVMValueRef lt = LLVMBuildICmp(kb->b, LLVMIntSLT, a, b, "");
    return LLVMBuildSelect(kb->b, lt, a, b, "");
}

LLVMValueRef aj_kb_smax(aj_kb *kb, LLVMValueRef a, LLVMValueRef b)
{
    LLVMValueRef gt = LLVMBuildICmp(kb->b, LLVMIntSGT, a, b, "");
    return LLVMBuildSelect(kb->b, gt, a, b, "");
}

/* ---------------------------------------------------------------- philox */

/*
 * One round on the counter (x0, x1, x2, x3) with round key (k0, k1):
 *
 *     x0' = hi(M1 * x2) ^ x1 ^ k0      x1' = lo(M1 * x2)
 *     x2' = hi(M0 * x0) ^ x3 ^ k1      x3' = lo(M0 * x0)
 *
 * and the key takes a Weyl step (k0 += W0, k1 += W1) between rounds.
 */
#define PHILOX_M0 0xD2511F53u
#define PHILOX_M1 0xCD9E8D57u
#define PHILOX_W0 0x9E3779B9u
#define PHILOX_W1 0xBB67AE85u

/* hi and lo halves of the unsigned 32x32 -> 64 product m * x */
static void mul_hi_lo(aj_kb *kb, uint32_t m, LLVMValueRef x, LLVMValueRef *hi,
                      LLVMValueRef *lo)
{
    LLVMBuilderRef b = kb->b;
    LLVMValueRef wide = LLVMBuildMul(b, LLVMBuildZExt(b, x, kb->t_i64, ""),
                                     aj_kb_i64(kb, (int64_t)m), "");
    *lo = LLVMBuildTrunc(b, wide, kb->t_i32, "");
    *hi = LLVMBuildTrunc(b, LLVMBuildLShr(b, wide, aj_kb_i64(kb, 32), ""), kb->t_i32, "");
}

void aj_kb_philox4x32_10(aj_kb *kb, const LLVMValueRef ctr[4],
                         const LLVMValueRef key[2], LLVMValueRef out[4])
{
    LLVMBuilderRef b = kb->b;
    LLVMValueRef x[4] = {ctr[0], ctr[1], ctr[2], ctr[3]};
    LLVMValueRef k0 = key[0], k1 = key[1];
    for (int round = 0; round < 10; round++) {
        if (round > 0) {
            k0 = LLVMBuildAdd(b, k0, aj_kb_i32(kb, (int32_t)PHILOX_W0), "");
            k1 = LLVMBuildAdd(b, k1, aj_kb_i32(kb, (int32_t)PHILOX_W1), "");
        }
        LLVMValueRef hi0, lo0, hi1, lo1;
        mul_hi_lo(kb, PHILOX_M0, x[0], &hi0, &lo0);
        mul_hi_lo(kb, PHILOX_M1, x[2], &hi1, &lo1);
        x[0] = LLVMBuildXor(b, LLVMBuildXor(b, hi1, x[1], ""), k0, "");
        x[1] = lo1;
        x[2] = LLVMBuildXor(b, LLVMBuildXor(b, hi0, x[3], ""), k1, "");
        x[3] = lo0;
    }
    for (int i = 0; i < 4; i++)
        out[i] = x[i];
}

LLVMValueRef aj_kb_call_intrinsic(aj_kb *kb, const char *name, LLVMValueRef *args, int n)
{
    unsigned id = LLVMLookupIntrinsicID(name, strlen(name));
    if (id == 0)
        return NULL;
    LLVMValueRef fn = LLVMGetIntrinsicDeclaration(kb->mod, id, NULL, 0);
    return LLVMBuildCall2(kb->b, LLVMIntrinsicGetType(kb->llctx, id, NULL, 0), fn, args,
                          (unsigned)n, "");
}

LLVMValueRef aj_kb_call_overloaded(aj_kb *kb, const char *name, LLVMValueRef *args, int n)
{
    LLVMTypeRef t = LLVMTypeOf(args[0]);
    unsigned id = LLVMLookupIntrinsicID(name, strlen(name));
    LLVMValueRef fn = LLVMGetIntrinsicDeclaration(kb->mod, id, &t, 1);
    return LLVMBuildCall2(kb->b, LLVMIntrinsicGetType(kb->llctx, id, &t, 1), fn, args,
                          (unsigned)n, "");
}
