/*
 * kernel.c -- the compiled kernel: code plus its launch contract.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "codegen/codegen.h"

#define XXH_INLINE_ALL
#include <xxhash.h>

/* Copies one stage's launch contract; the kernel owns the names. */
static void stage_from_kb(aj_kernel_stage *ks, const aj_kb_stage *st)
{
    snprintf(ks->entry, sizeof ks->entry, "%s", st->entry);
    for (int i = 0; i < st->num_params; i++) {
        memcpy(ks->param_names[i], st->params[i].name, sizeof ks->param_names[i]);
        ks->params[i].name = ks->param_names[i];
        ks->params[i].type = st->params[i].type;
        ks->param_ids[i] = st->params[i].id;
    }
    ks->launch.block[0] = st->block_threads;
    ks->launch.block[1] = 1;
    ks->launch.block[2] = 1;
    memcpy(ks->launch.grid, st->layout.grid, sizeof ks->launch.grid);
    ks->launch.dynamic_smem = st->dynamic_smem;
    ks->launch.num_params = st->num_params;
    ks->launch.params = ks->params;
    ks->launch.schedule = st->layout.schedule;
    ks->pack_rows = st->layout.pack_rows;
    ks->plan = (int32_t)st->layout.plan;
    ks->stack_bytes = st->stack_bytes;
}

aj_status aj_kernel_new(aj_ctx *ctx, const aj_kb_stage *stages, int num_stages,
                        aj_target target, aj_emit emit, const void *code,
                        size_t code_size, aj_kernel **out)
{
    aj_kernel *k = calloc(1, sizeof *k);
    if (k) {
        k->code = malloc(code_size + 1);
        k->stages = calloc((size_t)num_stages, sizeof *k->stages);
    }
    if (!k || !k->code || !k->stages) {
        aj_kernel_destroy(k);
        return aj_fail(ctx, AJ_ERR_OUT_OF_MEMORY, "out of memory for the compiled kernel");
    }
    atomic_init(&k->refs, 1);
    atomic_init(&k->hooks, NULL);
    memcpy(k->code, code, code_size);
    k->code[code_size] = '\0';
    k->code_size = code_size;
    k->code_hash = XXH3_64bits(code, code_size);
    k->target = target;
    k->emit = emit;
    k->sinks = -1;
    k->num_stages = num_stages;
    for (int s = 0; s < num_stages; s++)
        stage_from_kb(&k->stages[s], &stages[s]);
    *out = k;
    return AJ_OK;
}

aj_kernel *aj_kernel_retain(aj_kernel *kernel)
{
    atomic_fetch_add(&kernel->refs, 1);
    return kernel;
}

aj_status aj_kernel_on_release(aj_ctx *ctx, aj_kernel *kernel,
                               void (*release)(void *owner, const aj_kernel *kernel),
                               void *owner)
{
    aj_kernel_hook *hook = malloc(sizeof *hook);
    if (!hook)
        return aj_fail(ctx, AJ_ERR_OUT_OF_MEMORY, "out of memory");
    *hook = (aj_kernel_hook){release, owner, atomic_load(&kernel->hooks)};
    while (!atomic_compare_exchange_weak(&kernel->hooks, &hook->next, hook))
        ;
    return AJ_OK;
}

void aj_kernel_destroy(aj_kernel *kernel)
{
    if (!kernel || atomic_fetch_sub(&kernel->refs, 1) != 1)
        return;
    for (aj_kernel_hook *h = atomic_load(&kernel->hooks), *next; h; h = next) {
        next = h->next;
        h->release(h->owner, kernel);
        free(h);
    }
    aj_host_jit_dispose(kernel->jit);
    aj_op_destroy(atomic_load(&kernel->source));
    aj_kernel_destroy(atomic_load(&kernel->mask_builder));
    aj_kernel_destroy(atomic_load(&kernel->twin));
    aj_kernel_plan *plan = atomic_load(&kernel->plan);
    if (plan)
        plan->destroy(plan);
    free(kernel->object);
    free(kernel->code);
    free(kernel->stages);
    free(kernel);
}

const void *aj_kernel_code(const aj_kernel *kernel, size_t *size)
{
    if (!kernel) {
        if (size)
            *size = 0;
        return NULL;
    }
    if (size)
        *size = kernel->code_size;
    return kernel->code;
}

aj_emit aj_kernel_emit(const aj_kernel *kernel)
{
    return kernel ? kernel->emit : AJ_EMIT_COUNT;
}

aj_target aj_kernel_target(const aj_kernel *kernel)
{
    return kernel ? kernel->target : AJ_TARGET_ANY;
}

const char *aj_kernel_entry(const aj_kernel *kernel)
{
    return aj_kernel_stage_entry(kernel, 0);
}

aj_status aj_kernel_launch_info(const aj_kernel *kernel, aj_launch_info *out)
{
    return aj_kernel_stage_info(kernel, 0, out);
}

int32_t aj_kernel_num_stages(const aj_kernel *kernel)
{
    return kernel ? kernel->num_stages : 0;
}

aj_status aj_kernel_stage_info(const aj_kernel *kernel, int32_t stage, aj_launch_info *out)
{
    if (!kernel || !out || stage < 0 || stage >= kernel->num_stages)
        return AJ_ERR_INVALID_ARG;
    *out = kernel->stages[stage].launch;
    return AJ_OK;
}

const char *aj_extent_name(aj_extent e)
{
    static const char *const names[AJ_EXTENT_COUNT] = {
        [AJ_EXTENT_ONE] = "1",          [AJ_EXTENT_BATCH] = "batch",
        [AJ_EXTENT_HEADS_Q] = "heads_q", [AJ_EXTENT_HEADS_KV] = "heads_kv",
        [AJ_EXTENT_SEQ_Q] = "seq_q",    [AJ_EXTENT_SEQ_K] = "seq_k",
        [AJ_EXTENT_SPLITS] = "splits",  [AJ_EXTENT_DSIDE_PARTS] = "dside_parts",
        [AJ_EXTENT_DSIDE_ELEMENTS] = "dside_elements",
    };
    return (unsigned)e < AJ_EXTENT_COUNT ? names[e] : "?";
}

const char *aj_kernel_stage_entry(const aj_kernel *kernel, int32_t stage)
{
    if (!kernel || stage < 0 || stage >= kernel->num_stages)
        return NULL;
    return kernel->stages[stage].entry;
}

int32_t aj_kernel_stage_plan(const aj_kernel *kernel, int32_t stage)
{
    if (!kernel || stage < 0 || stage >= kernel->num_stages)
        return -1;
    return kernel->stages[stage].plan;
}

aj_status aj_kernel_compile_stats(const aj_kernel *kernel, aj_compile_stats *out)
{
    if (!kernel || !out)
        return AJ_ERR_INVALID_ARG;
    *out = kernel->stats;
    return AJ_OK;
}

/* ---------------------------------------------------------------- bytes */

/*
 * Layout (native byte order; the cache key pins the attnjit and LLVM
 * versions, and the header below pins the format and the struct sizes):
 *
 *   u32 KERNEL_FORMAT  u32 sizeof(aj_op_info)  u32 sizeof(aj_launch_info)
 *   u32 target  u32 emit  aj_op_info  i32 sinks  u32 tensor_grad  u32 kv_shared
 *   u32 q_dtype  i32 row_align[5]
 *   i32 num_stages  stage*
 *   u64 code_size   code   u64 object_size   object
 *
 * with, per stage,
 *
 *   str entry   i32 block[3]   {i32 extent, i32 per_block}[3]
 *   i32 dynamic_smem   aj_schedule   i32 pack_rows   i32 plan   i64 stack_bytes
 *   i32 num_params
 *   {str name, u32 type, i32 id}*
 *
 * where str is u32 length + bytes, and object is a host kernel's object
 * code (object_size 0 for GPU kernels).  Format 2 added the stages, 3 the
 * object code, 4 pack_rows, 5 the parameters' table rows (ids), 6 sinks,
 * 7 tensor_grad, 8 kv_shared, 9 plan, 10 stack_bytes, 11 q_dtype, 12 row_align,
 * 13 row_align for the paged caches.
 */
#define KERNEL_FORMAT 13u

typedef struct byte_writer {
    uint8_t *buf;
    size_t len, cap;
    int failed;
} byte_writer;

static void put(byte_writer *w, const void *p, size_t n)
{
    if (w->failed || n == 0)
        return;   /* an empty section may come as (NULL, 0) */
    if (w->len + n > w->cap) {
        size_t cap = w->cap ? w->cap * 2 : 4096;
        while (cap < w->len + n)
            cap *= 2;
        uint8_t *nb = realloc(w->buf, cap);
        if (!nb) {
            w->failed = 1;
            return;
        }
        w->buf = nb;
        w->cap = cap;
    }
    memcpy(w->buf + w->len, p, n);
    w->len += n;
}

static void put_u32(byte_writer *w, uint32_t v) { put(w, &v, 4); }

static void put_str(byte_writer *w, const char *s)
{
    uint32_t n = (uint32_t)strlen(s);
    put_u32(w, n);
    put(w, s, n);
}

aj_status aj_kernel_serialize(aj_ctx *ctx, const aj_kernel *k, uint8_t **out, size_t *size)
{
    byte_writer w = {0};
    put_u32(&w, KERNEL_FORMAT);
    put_u32(&w, sizeof(aj_op_info));
    put_u32(&w, sizeof(aj_launch_info));
    put_u32(&w, (uint32_t)k->target);
    put_u32(&w, (uint32_t)k->emit);
    put(&w, &k->op, sizeof k->op);
    put(&w, &k->sinks, 4);
    put(&w, &k->tensor_grad, 4);
    put_u32(&w, k->kv_shared);
    put_u32(&w, (uint32_t)aj_kernel_q_dtype(k));
    put(&w, k->row_align, sizeof k->row_align);
    put(&w, &k->num_stages, 4);
    for (int s = 0; s < k->num_stages; s++) {
        const aj_kernel_stage *ks = &k->stages[s];
        put_str(&w, ks->entry);
        put(&w, ks->launch.block, sizeof ks->launch.block);
        put(&w, ks->launch.grid, sizeof ks->launch.grid);
        put(&w, &ks->launch.dynamic_smem, 4);
        put(&w, &ks->launch.schedule, sizeof ks->launch.schedule);
        put(&w, &ks->pack_rows, 4);
        put(&w, &ks->plan, 4);
        put(&w, &ks->stack_bytes, 8);
        put(&w, &ks->launch.num_params, 4);
        for (int i = 0; i < ks->launch.num_params; i++) {
            put_str(&w, ks->params[i].name);
            put_u32(&w, (uint32_t)ks->params[i].type);
            put(&w, &ks->param_ids[i], 4);
        }
    }
    uint64_t n = k->code_size;
    put(&w, &n, 8);
    put(&w, k->code, k->code_size);
    uint64_t nobj = k->object_size;
    put(&w, &nobj, 8);
    put(&w, k->object, k->object_size);
    if (w.failed) {
        free(w.buf);
        return aj_fail(ctx, AJ_ERR_OUT_OF_MEMORY, "out of memory serialising a kernel");
    }
    *out = w.buf;
    *size = w.len;
    return AJ_OK;
}

typedef struct byte_reader {
    const uint8_t *p, *end;
    int failed;
} byte_reader;

static void get(byte_reader *r, void *dst, size_t n)
{
    if (r->failed || (size_t)(r->end - r->p) < n) {
        r->failed = 1;
        memset(dst, 0, n);
        return;
    }
    memcpy(dst, r->p, n);
    r->p += n;
}

static uint32_t get_u32(byte_reader *r)
{
    uint32_t v;
    get(r, &v, 4);
    return v;
}

/* a string of at most cap - 1 bytes, NUL-terminated */
static void get_str(byte_reader *r, char *dst, size_t cap)
{
    uint32_t n = get_u32(r);
    if (n >= cap)
        r->failed = 1;
    get(r, dst, r->failed ? 0 : n);
    dst[r->failed ? 0 : n] = '\0';
}

/* One stage's launch contract, in the form aj_kernel_new takes. */
static void get_stage(byte_reader *r, aj_kb_stage *st)
{
    get_str(r, st->entry, sizeof st->entry);
    get(r, &st->block_threads, 4);
    int32_t unused_block[2];
    get(r, unused_block, sizeof unused_block);
    get(r, st->layout.grid, sizeof st->layout.grid);
    get(r, &st->dynamic_smem, 4);
    get(r, &st->layout.schedule, sizeof st->layout.schedule);
    get(r, &st->layout.pack_rows, 4);
    int32_t plan = 0;
    get(r, &plan, 4);
    if ((unsigned)plan > AJ_STAGE_UNUSED)
        r->failed = 1;
    st->layout.plan = (aj_stage_plan)plan;
    get(r, &st->stack_bytes, 8);
    if (st->stack_bytes < 0)
        r->failed = 1;
    get(r, &st->num_params, 4);
    if (st->num_params < 0 || st->num_params > AJ_KB_MAX_PARAMS)
        r->failed = 1;
    for (int i = 0; i < st->num_params && !r->failed; i++) {
        get_str(r, st->params[i].name, sizeof st->params[i].name);
        st->params[i].type = (aj_param_type)get_u32(r);
        get(r, &st->params[i].id, 4);
        if ((unsigned)st->params[i].type >= AJ_PARAM_COUNT)
            r->failed = 1;
    }
}

aj_status aj_kernel_deserialize(aj_ctx *ctx, const uint8_t *data, size_t size,
                                aj_kernel **out)
{
    byte_reader r = {data, data + size, 0};
    aj_kb_stage stages[AJ_KB_MAX_STAGES];
    memset(stages, 0, sizeof stages);
    aj_op_info op;
    if (get_u32(&r) != KERNEL_FORMAT || get_u32(&r) != sizeof(aj_op_info) ||
        get_u32(&r) != sizeof(aj_launch_info))
        r.failed = 1;
    aj_target target = (aj_target)get_u32(&r);
    aj_emit emit = (aj_emit)get_u32(&r);
    get(&r, &op, sizeof op);
    int32_t sinks = -1;
    get(&r, &sinks, 4);
    if (sinks < -1 || sinks >= op.num_tensors)
        r.failed = 1;
    uint32_t tensor_grad = 0;
    get(&r, &tensor_grad, 4);
    /* the op's tensors, and alibi's slopes after them (aj_op_grad_bits) */
    if (tensor_grad >> op.num_tensors > (aj_op_info_alibi_slopes(&op) ? 1u : 0u))
        r.failed = 1;
    uint32_t kv_shared = get_u32(&r);
    if (kv_shared > 1 || (kv_shared && op.layout != AJ_LAYOUT_PAGED))
        r.failed = 1;
    /* the queries' element type: the op's dtype or an f8 one */
    uint32_t q_dtype = get_u32(&r);
    if (q_dtype >= AJ_DTYPE_COUNT || (q_dtype != (uint32_t)op.dtype && q_dtype < AJ_DTYPE_F8E4M3))
        r.failed = 1;
    int32_t row_align[AJ_ROW_TENSORS];
    get(&r, row_align, sizeof row_align);
    for (int t = 0; t < AJ_ROW_TENSORS; t++)
        if (!aj_row_align_valid(row_align[t]))
            r.failed = 1;
    int32_t num_stages = 0;
    get(&r, &num_stages, 4);
    if (num_stages < 1 || num_stages > AJ_KB_MAX_STAGES)
        r.failed = 1;
    for (int s = 0; s < num_stages && !r.failed; s++)
        get_stage(&r, &stages[s]);
    uint64_t code_size = 0, object_size = 0;
    get(&r, &code_size, 8);
    const uint8_t *code = r.p;
    if (!r.failed && code_size <= (uint64_t)(r.end - r.p))
        r.p += code_size;
    else
        r.failed = 1;
    get(&r, &object_size, 8);
    int host = aj_target_desc_of(target)->family == AJ_FAMILY_HOST;
    if (r.failed || object_size != (uint64_t)(r.end - r.p) || (unsigned)target >= AJ_TARGET_COUNT ||
        (unsigned)emit >= AJ_EMIT_COUNT || host != (object_size != 0))
        return aj_fail(ctx, AJ_ERR_IO, "not a kernel of this attnjit build");
    aj_kernel *k = NULL;
    aj_status st = aj_kernel_new(ctx, stages, num_stages, target, emit, code, (size_t)code_size,
                                 &k);
    if (st != AJ_OK)
        return st;
    k->op = op;
    k->sinks = sinks;
    k->tensor_grad = tensor_grad;
    k->kv_shared = kv_shared;
    k->q_dtype = (aj_dtype)q_dtype;
    memcpy(k->row_align, row_align, sizeof row_align);
    if (host) {
        k->object = malloc((size_t)object_size);
        if (!k->object) {
            aj_kernel_destroy(k);
            return aj_fail(ctx, AJ_ERR_OUT_OF_MEMORY, "out of memory for a kernel's object code");
        }
        memcpy(k->object, r.p, (size_t)object_size);
        k->object_size = (size_t)object_size;
        st = aj_host_jit(ctx, k);
        if (st != AJ_OK) {
            aj_kernel_destroy(k);
            return st;
        }
    }
    *out = k;
    return AJ_OK;
}
