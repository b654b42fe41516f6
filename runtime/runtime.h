/*
 * runtime.h -- devices and launches (internal).
 */
#ifndef AJ_RUNTIME_RUNTIME_H
#define AJ_RUNTIME_RUNTIME_H

#include "codegen/codegen.h"
#include "runtime/cpu/cpu_device.h"
#include "runtime/cuda/cuda_device.h"
#include "runtime/sim/emulator.h"

/*
 * Devices: one vtable per kind (device.c: sim, cpu, cuda), filled with
 * designated initializers, and the capabilities callers ask instead of
 * checking the kind.  Nothing outside device.c reads a kind's own state
 * (dev->cuda, dev->cpu); launch, ring, tune and the CLI go through the
 * aj_device_* calls below, which go through dev->ops.
 *
 *   aj_forward --> launch.c --> aj_device_launch_stage --> ops->launch
 *                                                     sim:  aj_sim_run
 *                                                     cpu:  aj_cpu_launch
 *                                                     cuda: aj_cuda_launch
 */

/* One stage of a bound kernel, as every kind launches it. */
typedef struct aj_device_launch {
    const aj_kernel *kernel;
    int stage;
    int32_t grid[3];
    void **argv;                  /* kernelParams: argv[i] points to parameter i's
                                     value, a by-value blob's AJ_BYVAL_BYTES
                                     included (cuLaunchKernel copies them; the
                                     host entries pass their address) */
    const aj_sim_buffer *buffers; /* sim: the memory its accesses may touch */
    int num_buffers;
    void *stream;                 /* cuda */
} aj_device_launch;

/* A TMA tensor map's description (the arguments of the driver's
 * cuTensorMapEncodeTiled): `rank` dims innermost first, contiguous in dim
 * 0, strides in bytes (strides[0] unread), a box of box[] elements and
 * its shared-memory swizzle (span bytes: 0, 32, 64 or 128); out-of-bounds
 * elements read as zero. */
typedef struct aj_tensor_map_args {
    aj_dtype dtype;            /* f16 or bf16 */
    int rank;                  /* 1..5 */
    const void *base;
    uint64_t dims[5];
    uint64_t strides[5];
    uint32_t box[5];
    int span;
} aj_tensor_map_args;

typedef struct aj_device_ops {
    /* what every device of the kind is and can do (aj_device_kind_caps:
     * kind, kind_name -- "sim", "cuda", "cpu", as --device takes it --,
     * target, the flags); the numbers of a device come from caps() */
    aj_device_caps kind_caps;
    /* aj_tune's default problem: a size that keeps the kind busy a few ms */
    int32_t tune_batch, tune_heads, tune_seq;

    /* index is checked against 0 by the kinds that have one device */
    aj_status (*open)(aj_device *dev, int index, void *cu_context);
    void (*close)(aj_device *dev);
    aj_target (*target)(const aj_device *dev);
    const char *(*device_name)(const aj_device *dev);
    /* the device's numbers in *out, which holds kind_caps */
    void (*caps)(const aj_device *dev, aj_device_caps *out);

    aj_status (*alloc)(aj_device *dev, size_t bytes, void **out);
    aj_status (*free)(aj_device *dev, void *ptr);
    /* host memory the device copies to and from asynchronously (cuda:
     * pinned) */
    aj_status (*host_alloc)(aj_device *dev, size_t bytes, void **out);
    void (*host_free)(aj_device *dev, void *ptr);
    aj_status (*copy)(aj_device *dev, void *dst, const void *src, size_t bytes, int to_device);
    aj_status (*copy_async)(aj_device *dev, void *dst, const void *src, size_t bytes,
                            int to_device, void *stream);
    /* height rows of width bytes, device memory to device memory, rows
     * dpitch / spitch bytes apart, on stream */
    aj_status (*copy2d_async)(aj_device *dev, void *dst, size_t dpitch, const void *src,
                              size_t spitch, size_t width, size_t height, void *stream);
    /* count u32 words at dst (device memory) set to value, on stream */
    aj_status (*fill32_async)(aj_device *dev, void *dst, uint32_t value, size_t count,
                              void *stream);

    aj_status (*stream_create)(aj_device *dev, void **stream);
    void (*stream_destroy)(aj_device *dev, void *stream);
    aj_status (*synchronize)(aj_device *dev, void *stream);
    aj_status (*wait)(aj_device *dev, void *stream, double timeout_s, const char *what);
    aj_status (*time)(aj_device *dev, void *stream, aj_status (*run)(void *user), void *user,
                      double *ms);
    aj_status (*scratch)(aj_device *dev, void *stream, size_t bytes, void **out);
    void (*scratch_release)(aj_device *dev, void *stream, void *ptr);
    /* optional (NULL: the device runs its work when it is queued, so
     * events need no state and are always done: sim, cpu) */
    aj_status (*event_create)(aj_device *dev, void **event);
    void (*event_destroy)(aj_device *dev, void *event);
    aj_status (*event_record)(aj_device *dev, void *event, void *stream);
    aj_status (*stream_wait_event)(aj_device *dev, void *stream, void *event);
    aj_status (*event_done)(aj_ctx *ctx, aj_device *dev, void *event, bool *done);

    aj_status (*load_kernel)(aj_ctx *ctx, aj_device *dev, const aj_kernel *k);
    aj_status (*launch)(aj_ctx *ctx, aj_device *dev, const aj_device_launch *l);
    /* optional (NULL: the device reports nothing): what the driver made
     * of a stage, for aj_tune's pruning */
    aj_status (*stage_resources)(aj_ctx *ctx, aj_device *dev, const aj_kernel *k, int stage,
                                 aj_cuda_resources *out);
    /* optional (NULL: no TMA): a tensor map of `a` into the 128 bytes at
     * map (64-byte aligned); has_tensor_map says whether this device can
     * (cuda: compute capability 9.0+ and a driver with the encoder) */
    aj_status (*tensor_map)(aj_ctx *ctx, aj_device *dev, const aj_tensor_map_args *a, void *map);
    bool (*has_tensor_map)(const aj_device *dev);
} aj_device_ops;

/* The table of a kind; NULL for a value that is not one. */
const aj_device_ops *aj_device_ops_of(aj_device_kind kind);

struct aj_device {
    aj_ctx *ctx;
    const aj_device_ops *ops;
    int index;
    int workers;                 /* sim, cpu (0: the default) */
    _Atomic uint64_t last_instructions;  /* sim: of the last launch, any thread's */
    aj_cuda_device *cuda;        /* cuda's own state: device.c's, and aj_device_cuda */
    aj_cpu_device *cpu;          /* cpu's own state: device.c's */
    /* cuda with emulated launches (AJ_CUDA_EMULATE=1 on a stand-in
     * libcuda): the sim device that runs each launch again over the same
     * memory (device.c: open_twin; launch.c: emulate_forward and its
     * twins); else NULL */
    struct aj_device *twin;
    /* a twin: the cuda device whose launches it runs again (their streams
     * are that device's: each launch's accesses go to the stand-in's
     * stream-order model, sim_launch) */
    struct aj_device *twin_of;
    /* emulated launches captured into a CUDA graph: the twin's runs, each
     * a host node the graph replays (launch.c: emulate_captured), freed
     * with the device */
    struct aj_emulated_run *_Atomic captured;
    /* device memory: the u32 the varlen kernels record a bad cu_seqlens
     * in (templates/attn_common.h), AJ_VARLEN_STATUS_CLEAR while none */
    uint32_t *status;
};

/* Frees dev's captured emulated runs (launch.c; at the device's close). */
void aj_emulated_runs_free(aj_device *dev);

/* The CUDA device under dev, for what needs the driver itself (the NCCL
 * engine's context); NULL for other kinds. */
aj_cuda_device *aj_device_cuda(const aj_device *dev);
/* Whether dev runs a kernel of `kernel_target`: its own target's, and
 * sm_90a's on a device of compute capability 9.0 (whose target is sm_90). */
bool aj_device_runs(const aj_device *dev, aj_target kernel_target);
/* The target to compile op for on dev: sm_90a where the op runs wgmma
 * (aj_op_runs_wgmma) and dev runs sm_90a code (a 9.0 GPU), else `target`.
 * aj_compile for a device, its tuned compile and aj_tune all ask here. */
aj_target aj_device_target_for(const aj_device *dev, const aj_op *op, aj_target target);
/* Whether dev encodes TMA tensor maps (aj_device_ops.tensor_map). */
bool aj_device_has_tensor_map(const aj_device *dev);

/* Stream-ordered work for launch.c and ring.c, on any device (see
 * cuda_device.h for cuda; sim and cpu run their work synchronously: their
 * streams are NULL, copies are memmove, waits return at once).  A copy's
 * to_device is 1 (host to device), 0 (device to host) or
 * AJ_COPY_ON_DEVICE (device to device).  Streams
 * themselves: aj_device_stream_create / _destroy (attnjit.h). */
aj_status aj_device_copy_async(aj_device *dev, void *dst, const void *src, size_t bytes,
                               int to_device, void *stream);
/* height rows of width bytes from device memory at src (rows spitch bytes
 * apart) to device memory at dst (dpitch apart), queued on stream: the
 * strided moves of the all-to-alls (cp/ulysses.c). */
aj_status aj_device_copy2d_async(aj_device *dev, void *dst, size_t dpitch, const void *src,
                                 size_t spitch, size_t width, size_t height, void *stream);
/* count u32 words of device memory at dst set to `value` (a float's bits:
 * -inf, a sink's logit), queued on stream. */
aj_status aj_device_fill32_async(aj_device *dev, void *dst, uint32_t value, size_t count,
                                 void *stream);
aj_status aj_device_wait(aj_device *dev, void *stream, double timeout_s, const char *what);
/* Device-side order between streams, for calls that return before their
 * work is done (cp/'s asynchronous calls: docs/ring.md "Asynchronous
 * calls").  An event marks the work queued on a stream so far
 * (aj_device_event_record); aj_device_stream_wait_event makes the work
 * queued on `stream` from now on wait for the event's latest record, on
 * the device; aj_device_event_done tells whether that work is done,
 * without waiting (from any thread: its errors go to `ctx`).  On sim and
 * cpu, which run their work when it is queued, events are NULL and always
 * done. */
aj_status aj_device_event_create(aj_device *dev, void **event);
void aj_device_event_destroy(aj_device *dev, void *event);
aj_status aj_device_event_record(aj_device *dev, void *event, void *stream);
aj_status aj_device_stream_wait_event(aj_device *dev, void *stream, void *event);
aj_status aj_device_event_done(aj_ctx *ctx, aj_device *dev, void *event, bool *done);
/* Whether `stream` is being captured into a CUDA graph (cuda; false on
 * other devices and drivers that cannot tell). */
aj_status aj_device_capturing(aj_ctx *ctx, aj_device *dev, void *stream, bool *capturing);
/* The calling thread's driver calls stay out of other threads' CUDA graph
 * captures (cuda: the relaxed capture mode; nothing elsewhere): for a
 * thread that polls events while the caller may be capturing. */
void aj_device_relax_capture(aj_device *dev);
/* Work queued on `waiter` from now on waits for the work queued on
 * `after` so far, through `event` (any of the device's events: the wait
 * takes its record as it is now, so the event may be recorded again at
 * once). */
aj_status aj_device_stream_after(aj_device *dev, void *waiter, void *after, void *event);

/* Host memory for copies on the device's streams: pinned on cuda (so an
 * async copy is one), plain elsewhere; zeroed when `zero`. */
aj_status aj_device_host_alloc(aj_device *dev, size_t bytes, int zero, void **out);
void aj_device_host_free(aj_device *dev, void *ptr);
/* Runs one stage of a bound kernel (launch.c fills l). */
aj_status aj_device_launch_stage(aj_ctx *ctx, aj_device *dev, const aj_device_launch *l);
/* What the driver made of a kernel's stage; AJ_ERR_UNSUPPORTED on
 * devices that have no driver to ask (ops->stage_resources NULL). */
aj_status aj_device_stage_resources(aj_ctx *ctx, aj_device *dev, const aj_kernel *k, int stage,
                                    aj_cuda_resources *out);
/* Loads a compiled kernel on the device now, as its first launch would
 * (cuda: its module, from a cached cubin or the driver's JIT); AJ_OK for
 * devices that load nothing. */
aj_status aj_device_load_kernel(aj_ctx *ctx, aj_device *dev, const aj_kernel *k);

/* The status word a varlen or paged launch's kernels record a fault in
 * (docs/api.md "Threads"): on devices that run launches synchronously
 * (sim, cpu) the launch's own, cleared, so that launches from several
 * threads never read or clear each other's faults; on cuda the device's,
 * which aj_device_synchronize reads.  Given back by aj_device_launched. */
aj_status aj_device_status_word(aj_device *dev, void **out);
/* After the launch whose status word is `word` (launch status st): on
 * sim and cpu the fault its kernels recorded, now, as AJ_ERR_INVALID_ARG
 * on the launch's ctx naming `fn` (st if the launch failed already), the
 * word freed; on cuda st (aj_device_synchronize reports faults). */
aj_status aj_device_launched(aj_ctx *ctx, aj_device *dev, void *word, aj_status st,
                             const char *fn);

/* Scratch memory for work on `stream`, released with
 * aj_device_scratch_release once that work is queued: cuda's is owned by
 * the device and reused (aj_cuda_scratch), cpu's likewise kept by the
 * device (aj_cpu_scratch: a block of its own for a call that finds it
 * held); sim's is host memory of the call's own. */
aj_status aj_device_scratch(aj_device *dev, void *stream, size_t bytes, void **out);
void aj_device_scratch_release(aj_device *dev, void *stream, void *ptr);

/* One kernel argument, addressed the way kernelParams are. */
typedef union aj_arg_value {
    void *ptr;
    int32_t i32;
    int64_t i64;
    float f32;
} aj_arg_value;

/* The sources of templates/params.def (a bit per aj_param_source) that
 * the launch entry point of `kind` fills (launch_bind.c): every parameter of
 * the table its kernels declare reads one of them, else it is a side
 * tensor's (or alibi's slopes'), bound by name. */
uint64_t aj_launch_sources(aj_kind kind);

/* Every side[i] names a tensor the op declares (errors name `fn`). */
aj_status aj_side_check_names(aj_ctx *ctx, const char *fn, const aj_op_info *op,
                              const aj_side_tensor *side, int32_t num_side);

/* Learned sinks (docs/ir.md "Sinks"), for launches and the CP methods
 * alike (launch_bind.c).  The side tensor `name` (NULL: the op has none),
 * where side[] holds it, has one logit per query head of the op,
 * heads_total of them: a shorter one would read 0 past its end, a wrong
 * answer, not an error.  dsinks, when given (data not NULL), belongs to an
 * op with sinks and is f32 [heads_q], a stride of 1 or more. */
aj_status aj_side_check_sinks(aj_ctx *ctx, const char *fn, const char *name,
                              const aj_side_tensor *side, int32_t num_side, int64_t heads_total);
aj_status aj_check_dsinks(aj_ctx *ctx, const char *fn, bool has_sinks, const aj_tensor *dsinks,
                          int64_t heads_q);

/* The side tensor of side[0 .. n) named `name`, or NULL. */
const aj_side_tensor *aj_side_named(const aj_side_tensor *side, int32_t n, const char *name);
/* The elements of side tensor t (its shape's product; a dim below 1
 * counts 0). */
int64_t aj_side_numel(const aj_side_tensor *t);
/* The inputs a backward may give gradients of, in the score program's
 * order (templates/score.h): the op's declared tensors as found by name
 * in side (zeroed where not given), then, for score_mod = alibi, its
 * slopes as a side tensor named "alibi_slopes" (zeroed where not f32 of
 * rank 1).  Returns their count. */
int aj_grad_inputs(const aj_op_info *op, const aj_side_tensor *side, int32_t num_side,
                   const aj_tensor *slopes, aj_side_tensor out[AJ_OP_TENSORS_MAX + 1]);
/* Checks outputs dside[0 .. num_dside) (as `fn`) against the inputs the
 * op asks gradients of (tensor_grad, bit t: aj_op_grad_bits) and those
 * inputs (aj_grad_inputs): every grad input given; each output names
 * one, once, with data, f32 of its input's rank and shape, strides >= 0
 * that keep elements apart.  aj_backward's and the rings' (which also
 * want them contiguous). */
aj_status aj_check_dside_outputs(aj_ctx *ctx, const char *fn, const aj_op_info *op,
                                 uint32_t tensor_grad, const aj_side_tensor *inputs,
                                 int32_t num_inputs, const aj_side_tensor *dside,
                                 int32_t num_dside);

/* The side tensors a score program reads (templates/score.h: the op's
 * declared tensors in order, then alibi's `slopes`), each found by name in
 * side[0 .. num_side - 1] and checked against its declaration, read back
 * from the device into host memory: out[t] over mem[t] (malloc'ed; the
 * caller frees mem[0 .. p->tensor_count - 1], zeroed first, whatever the
 * status).  Errors name `fn`. */
struct aj_score_prog;
aj_status aj_side_to_host(aj_ctx *ctx, aj_device *dev, const char *fn,
                          const struct aj_score_prog *p, const aj_side_tensor *side,
                          int32_t num_side, const aj_tensor *slopes, aj_side_tensor *out,
                          void **mem);

/* What a block mask is built for (block_mask.c): a padded launch's sizes,
 * position offsets and resolved totals, and the tile it classes. */
typedef struct aj_block_mask_shape {
    int64_t batch, heads, seq_q, seq_k;
    int64_t q_offset, kv_offset, sq_total, sk_total;
    int32_t block_m, block_n;
    int64_t head_offset;   /* the global head of head 0 (aj_fwd_args) */
} aj_block_mask_shape;

/* A block mask of programs `p` for `shape` as the kernels' tensor over
 * `data`: i32 [planes_b, planes_h, rows', cols] (a plane per batch index,
 * head, only where the mask reads b, h), whose first rows are the
 * classes of the rows of tiles, the rest the plane's lists and hulls
 * (score.h, aj_score_mask_plane_size). */
aj_tensor aj_block_mask_tensor(const struct aj_score_prog *p, const aj_block_mask_shape *shape,
                               void *data);

/* The score programs of the kernel's op, from its launch plan
 * (compile.c), or NULL for a kernel loaded from bytes (no op). */
const struct aj_score_prog *aj_kernel_programs(const aj_kernel *kernel);

/*
 * The layout rule of a kernel's workspace (the flash backward's), which
 * its launch plan records at compile time from the kernel's parameters
 * and op, so that a launch only multiplies it by the call's rows
 * (launch.c, workspace_layout).  A row is a query row (b, h, i) of the
 * call; its regions follow each other, each starting on `align` bytes:
 *
 *   DELTA  f32, one per row: Delta_i at b stride_ws_b + h stride_ws_h + i
 *   DQ     f32, head_dim per row (deterministic = false), else none;
 *          starts at ws_dq_offset elements
 *
 * per_batch: batch b's rows lie b Hq rows-per-head apart (padded); else
 * (varlen) sequence b's rows start at its cu_seqlens_q offset.
 */
enum { AJ_WS_DELTA, AJ_WS_DQ, AJ_WS_REGIONS };

typedef struct aj_ws_region {
    int32_t elem_bytes;    /* its element type's size (f32: 4) */
    int64_t per_row;       /* its elements per row (0: the region is empty) */
} aj_ws_region;

typedef struct aj_workspace_rule {
    bool takes;            /* the kernel has a workspace parameter */
    bool per_batch;
    int32_t align;         /* bytes each region starts on */
    aj_ws_region region[AJ_WS_REGIONS];
} aj_workspace_rule;

/*
 * The by-value arguments of a kernel (its AJ_PARAM_BYVAL128 parameters,
 * whose table rows say ENCODE): each one's stage and parameter index,
 * the launch value it is encoded from and its encoder.  The launch plan
 * records them at compile time; a launch runs each encoder once the
 * stage's other values are bound (launch_bind.c, aj_bind_stage): the
 * bytes embed the tensor's address, shape and strides (a Hopper TMA
 * descriptor), so they are made at every launch, never kept.
 */
typedef aj_status (*aj_byval_encode)(aj_ctx *ctx, aj_device *dev, const aj_kernel *kernel,
                                     const aj_tensor *t, void *out);

#define AJ_BYVAL_MAX 8   /* a kernel's, all stages together */

typedef struct aj_byval_arg {
    int32_t stage, index;   /* the parameter */
    int32_t source;         /* the launch value encoded (an aj_param_source) */
    aj_byval_encode encode; /* writes AJ_BYVAL_BYTES at out */
    int32_t tma;            /* a TMA map: encoded only where the launch's tma is 1 */
} aj_byval_arg;

typedef struct aj_byval_args {
    int32_t n;
    aj_byval_arg arg[AJ_BYVAL_MAX];
} aj_byval_args;

/* A kernel's by-value arguments, from its parameters' table rows
 * (launch_bind.c); AJ_ERR_INTERNAL naming the kernel past AJ_BYVAL_MAX. */
aj_status aj_byval_args_of(aj_ctx *ctx, const aj_kernel *kernel, aj_byval_args *out);
/* Those its launch plan recorded (compile.c), or NULL where it has no
 * plan (a kernel loaded from bytes or built outside aj_compile). */
const aj_byval_args *aj_kernel_byval_args(const aj_kernel *kernel);

/* The rule of `kernel`, from its parameters and op (launch.c). */
void aj_workspace_rule_of(const aj_kernel *kernel, aj_workspace_rule *out);
/* The rule its launch plan recorded (compile.c), or NULL where it has
 * no plan (a kernel loaded from bytes). */
const aj_workspace_rule *aj_kernel_workspace_rule(const aj_kernel *kernel);

/* The block-mask builder (templates/block_mask.c) of kernel's tile for op
 * (whose aj_score_mask_hash is mask_hash), compiled for the kernel's
 * target through the cache, or the one kept on the kernel (compile.c). */
aj_status aj_compile_block_mask(aj_ctx *ctx, const aj_kernel *kernel, const aj_op *op,
                                uint64_t mask_hash, aj_kernel **out);
/* The row kernels (templates/rows.c) of `dtype` rows `width` wide for
 * `target`, through the kernel cache: what the context-parallel methods
 * run on a GPU to keep their sums in device memory (compile.c). */
aj_status aj_compile_rows(aj_ctx *ctx, aj_target target, aj_dtype dtype, int32_t width,
                          aj_kernel **out);
/* Queues stage `stage` (aj_rows_stage) of the row kernels on dev's
 * stream between the typed rows `o` and the f32 accumulator `acc`, both
 * [B, H, S, W] (any strides, W the kernel's), and `lse` [B, H, S] (read by
 * AJ_ROWS_ROUND_MASKED only; NULL for the others).  Emulated launches run
 * it again on the twin (launch.c). */
aj_status aj_rows_launch(aj_ctx *ctx, aj_device *dev, const aj_kernel *rows, int stage,
                         const aj_tensor *o, const aj_tensor *acc, const aj_tensor *lse,
                         void *stream);

/* A backward launch of kernel (an op with sinks) that runs its sinks'
 * gradient stage alone (templates/sinks_grad.c): args->dsinks gets
 * -sum exp(sink - lse) dO . O over args' rows, and no other output is
 * written (args' others must still be a valid call's).  What a rank of a
 * resident context-parallel backward adds to the sinks' gradient
 * (cp/common.c). */
aj_status aj_backward_sinks(aj_ctx *ctx, aj_device *dev, const aj_kernel *kernel,
                            const aj_bwd_args *args);

/* The sim twin of a GPU kernel: its op (the source kept on it) compiled
 * for the emulator, with the same schedule, for emulated launches
 * (launch.c); kept on the kernel, the caller gets a reference.
 * AJ_ERR_UNSUPPORTED for a kernel loaded from bytes (no op kept). */
aj_status aj_compile_twin(aj_ctx *ctx, const aj_kernel *kernel, aj_kernel **out);

/* Queues `builder` on dev's `stream`: the classes of `shape`'s tiles into
 * `classes` (aj_block_mask_tensor's layout), reading the side tensors
 * (and alibi's slopes) in place (launch.c).  Errors name fn. */
aj_status aj_block_mask_launch(aj_ctx *ctx, aj_device *dev, const char *fn,
                               const aj_kernel *builder, const aj_block_mask_shape *shape,
                               const aj_tensor *classes, const aj_side_tensor *side,
                               int32_t num_side, const aj_tensor *slopes, void *stream);

/* Checks mask `m` against a launch on dev of programs `p` (NULL: not
 * known, a kernel loaded from bytes) with `launch`'s sizes (its tile is
 * the mask's business: the kernels read any), naming the first thing that
 * differs; gives the classes as the kernels' tensor and the mask's tile. */
aj_status aj_block_mask_view(aj_ctx *ctx, const char *fn, const aj_block_mask *m,
                             const aj_device *dev, const struct aj_score_prog *p,
                             const aj_block_mask_shape *launch, aj_tensor *classes,
                             int64_t *block_m, int64_t *block_n);

/* A tensor argument's rank and dtype (launch_shapes.c): AJ_ERR_INVALID_ARG with
 * "FN: NAME.rank = R, want W" (or .dtype) when they differ. */
aj_status aj_check_rank_dtype(aj_ctx *ctx, const char *fn, const char *name,
                              const aj_tensor *t, int rank, aj_dtype dtype);

#endif /* AJ_RUNTIME_RUNTIME_H */
