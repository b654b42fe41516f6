/*
 * aj_jax_ffi.c -- attnjit as an XLA FFI custom call on the CPU
 * (attnjit.jax, docs/jax.md): one handler, aj_jax_attention, registered
 * by attnjit/jax.py as the target "attnjit_attention" for platform "cpu".
 *
 *   attribute  spec: the op's IR text (attention forward | backward ...)
 *   forward    args q, k, v                      rets o, lse
 *   backward   args do, q, k, v, o, lse          rets dq, dk, dv
 *
 * Buffers are XLA's dense row-major arrays: q [..., Hq, Sq, D] (leading
 * dims, such as the batch and a vmapped axis, fold into one batch), lse
 * [..., Hq, Sq] f32.  Each spec compiles once per process (kept in a
 * list under a lock); every call launches on the cpu device, which takes
 * concurrent calls (XLA runs custom calls from its own threads).
 *
 * The shim is a separate library so that libattnjit exports only
 * attnjit.h; it builds where jaxlib's FFI headers are given
 * (-DAJ_JAX_FFI_INCLUDE, CMakeLists.txt).
 */
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "attnjit/attnjit.h"
#include "xla/ffi/api/c_api.h"

typedef struct compiled {
    struct compiled *next;
    char *spec;
    aj_op *op;
    aj_kernel *kernel;
} compiled;

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static aj_ctx *ctx;
static aj_device *cpu;
static compiled *kernels;

static XLA_FFI_Error *fail(const XLA_FFI_Api *api, XLA_FFI_Error_Code code, const char *fmt,
                           ...) __attribute__((format(printf, 3, 4)));

static XLA_FFI_Error *fail(const XLA_FFI_Api *api, XLA_FFI_Error_Code code, const char *fmt,
                           ...)
{
    char message[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(message, sizeof message, fmt, ap);
    va_end(ap);
    XLA_FFI_Error_Create_Args args = {.struct_size = sizeof args, .message = message,
                                      .errc = code};
    return api->XLA_FFI_Error_Create(&args);
}

/* The kernel of `spec` (compiled on first use), or NULL with *why set. */
static compiled *kernel_of(const char *spec, size_t len, char *why, size_t cap)
{
    pthread_mutex_lock(&lock);
    compiled *k = NULL;
    aj_status st = AJ_OK;
    if (!ctx) {
        st = aj_ctx_create(NULL, &ctx);
        if (st == AJ_OK)
            st = aj_device_open(ctx, AJ_DEVICE_CPU, 0, &cpu);
        if (st != AJ_OK)
            snprintf(why, cap, "the cpu device: %s", ctx ? aj_last_error(ctx) :
                     aj_status_str(st));
    }
    for (k = kernels; st == AJ_OK && k; k = k->next)
        if (strlen(k->spec) == len && memcmp(k->spec, spec, len) == 0)
            break;
    if (st == AJ_OK && !k) {
        k = calloc(1, sizeof *k);
        if (k)
            k->spec = strndup(spec, len);
        if (!k || !k->spec) {
            snprintf(why, cap, "out of memory");
            st = AJ_ERR_OUT_OF_MEMORY;
        }
        if (st == AJ_OK)
            st = aj_op_parse(ctx, k->spec, len, "attnjit.jax", &k->op);
        if (st == AJ_OK) {
            aj_compile_options opts = AJ_COMPILE_OPTIONS_INIT;
            opts.device = cpu;
            st = aj_compile(ctx, k->op, &opts, &k->kernel);
        }
        if (st == AJ_OK) {
            k->next = kernels;
            kernels = k;
        } else {
            if (why[0] == 0)
                snprintf(why, cap, "%s", aj_last_error(ctx));
            if (k) {
                aj_op_destroy(k->op);
                free(k->spec);
                free(k);
            }
            k = NULL;
        }
    }
    pthread_mutex_unlock(&lock);
    return k;
}

/* XLA's buffer as a dense tensor of `rank` dims, its leading dims folded
 * into the first; NULL message when it fits. */
static const char *as_tensor(const XLA_FFI_Buffer *buf, int rank, aj_tensor *t)
{
    static const struct { XLA_FFI_DataType xla; aj_dtype aj; } dtypes[] = {
        {XLA_FFI_DataType_F32, AJ_DTYPE_F32}, {XLA_FFI_DataType_F16, AJ_DTYPE_F16},
        {XLA_FFI_DataType_BF16, AJ_DTYPE_BF16}};
    memset(t, 0, sizeof *t);
    int found = 0;
    for (size_t i = 0; i < sizeof dtypes / sizeof dtypes[0]; i++)
        if (dtypes[i].xla == buf->dtype) {
            t->dtype = dtypes[i].aj;
            found = 1;
        }
    if (!found)
        return "a buffer's dtype is not float32, float16 or bfloat16";
    if (buf->rank < rank)
        return "a buffer has fewer dims than attention needs";
    t->data = buf->data;
    t->rank = rank;
    int64_t lead = 1;
    for (int64_t i = 0; i <= buf->rank - rank; i++)
        lead *= buf->dims[i];
    t->shape[0] = lead;
    for (int i = 1; i < rank; i++)
        t->shape[i] = buf->dims[buf->rank - rank + i];
    int64_t stride = 1;
    for (int i = rank - 1; i >= 0; i--) {
        t->strides[i] = stride;
        stride *= t->shape[i];
    }
    return NULL;
}

XLA_FFI_Error *aj_jax_attention(XLA_FFI_CallFrame *frame);

XLA_FFI_Error *aj_jax_attention(XLA_FFI_CallFrame *frame)
{
    /* XLA first asks which FFI version the handler was built for */
    for (XLA_FFI_Extension_Base *e = frame->extension_start; e; e = e->next)
        if (e->type == XLA_FFI_Extension_Metadata) {
            XLA_FFI_Metadata *m = ((XLA_FFI_Metadata_Extension *)e)->metadata;
            m->api_version.major_version = XLA_FFI_API_MAJOR;
            m->api_version.minor_version = XLA_FFI_API_MINOR;
            m->traits = 0;
            return NULL;
        }
    const XLA_FFI_Api *api = frame->api;
    if (frame->stage != XLA_FFI_ExecutionStage_EXECUTE)
        return NULL;
    const XLA_FFI_ByteSpan *spec = NULL;
    for (int64_t i = 0; i < frame->attrs.size; i++) {
        const XLA_FFI_ByteSpan *name = frame->attrs.names[i];
        if (frame->attrs.types[i] == XLA_FFI_AttrType_STRING && name->len == 4 &&
            memcmp(name->ptr, "spec", 4) == 0)
            spec = frame->attrs.attrs[i];
    }
    if (!spec)
        return fail(api, XLA_FFI_Error_Code_INVALID_ARGUMENT,
                    "attnjit_attention: no string attribute 'spec' (call it through "
                    "attnjit.jax.attention)");
    char why[512] = "";
    compiled *k = kernel_of(spec->ptr, spec->len, why, sizeof why);
    if (!k)
        return fail(api, XLA_FFI_Error_Code_INVALID_ARGUMENT, "attnjit.jax: %s", why);
    aj_op_info info;
    aj_op_get_info(k->op, &info);
    const int fwd = info.kind == AJ_KIND_FORWARD;
    const int64_t nargs = fwd ? 3 : 6, nrets = fwd ? 2 : 3;
    if (frame->args.size != nargs || frame->rets.size != nrets)
        return fail(api, XLA_FFI_Error_Code_INVALID_ARGUMENT, "attnjit.jax: the %s takes %lld "
                    "buffers and returns %lld; got %lld and %lld", fwd ? "forward" : "backward",
                    (long long)nargs, (long long)nrets, (long long)frame->args.size,
                    (long long)frame->rets.size);
    aj_tensor in[6], out[3];
    for (int64_t i = 0; i < nargs + nrets; i++) {
        const int is_in = i < nargs;
        const int64_t j = is_in ? i : i - nargs;
        /* lse (the forward's second result, the backward's last input) is
         * [..., H, S] */
        const int lse = fwd ? (!is_in && j == 1) : (is_in && j == 5);
        const XLA_FFI_Buffer *b = is_in ? frame->args.args[j] : frame->rets.rets[j];
        const char *bad = as_tensor(b, lse ? 3 : 4, is_in ? &in[j] : &out[j]);
        if (bad)
            return fail(api, XLA_FFI_Error_Code_INVALID_ARGUMENT, "attnjit.jax: %s %lld: %s",
                        is_in ? "argument" : "result", (long long)j, bad);
    }
    aj_status st;
    if (fwd) {
        aj_fwd_args a = AJ_FWD_ARGS_INIT;
        a.q = in[0], a.k = in[1], a.v = in[2], a.o = out[0], a.lse = out[1];
        st = aj_forward(ctx, cpu, k->kernel, &a);
    } else {
        aj_bwd_args a = AJ_BWD_ARGS_INIT;
        a.do_ = in[0], a.q = in[1], a.k = in[2], a.v = in[3], a.o = in[4], a.lse = in[5];
        a.dq = out[0], a.dk = out[1], a.dv = out[2];
        st = aj_backward(ctx, cpu, k->kernel, &a);
    }
    if (st != AJ_OK)
        return fail(api, XLA_FFI_Error_Code_INVALID_ARGUMENT, "attnjit.jax: %s",
                    aj_last_error(ctx));
    return NULL;
}
