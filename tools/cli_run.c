/*
 * cli_run.c -- `attnjit run`: compile an op for a device, run it on tensors
 * read from .npy files, write the results as .npy.
 *
 *   attnjit run SPEC --device sim|cpu|cuda --in q=q.npy --in k=k.npy --in v=v.npy
 *       [--in alibi_slopes=s.npy] [--in bias=b.npy] --out o=o.npy [--out lse=lse.npy]
 *       [--q-offset N] [--kv-offset N] [--sq-total N] [--sk-total N]
 *       [--seed N] [--offset N] [--workers N] [--no-cache]
 *
 * Ops with accumulate = true read a prior result and write the merged one:
 *       --in o_acc=prior_o.npy --in lse=prior_lse.npy --out o_acc=F --out lse=F
 *
 * Inputs are BHSD (B, H, S, D) arrays of f32 or f16 (f8 is accepted too),
 * converted to the op's dtype (o_acc and lse stay f32); outputs are f32.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "tools/cli.h"
#include "tools/npy.h"

enum { T_Q, T_K, T_V, T_ALIBI, T_BIAS, T_O, T_LSE, T_O_ACC, T_COUNT };
static const char *const tensor_names[T_COUNT] = {"q", "k", "v", "alibi_slopes", "bias",
                                                  "o", "lse", "o_acc"};
/* what each tensor may be given as; which of these an op needs is checked
 * once the op is known */
static const int may_be_input[T_COUNT] = {1, 1, 1, 1, 1, 0, 1, 1};
static const int may_be_output[T_COUNT] = {0, 0, 0, 0, 0, 1, 1, 1};

typedef cli_run_opts run_opts;
_Static_assert(sizeof ((run_opts *)0)->in / sizeof(char *) == T_COUNT,
               "cli_run_opts.in must hold every tensor");

static int parse_i64(const char *flag, const char *s, int64_t *out)
{
    char *end;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    if (errno || end == s || *end)
        return cli_usage("%s takes an integer", flag);
    *out = v;
    return CLI_EXIT_OK;
}

static int parse_u64(const char *flag, const char *s, uint64_t *out)
{
    char *end;
    errno = 0;
    unsigned long long v = strtoull(s, &end, 10);
    if (errno || end == s || *end || s[0] == '-')
        return cli_usage("%s takes a non-negative integer", flag);
    *out = v;
    return CLI_EXIT_OK;
}

/* NAME=FILE for --in / --out */
static int parse_binding(const char *flag, const char *arg, int want_input, run_opts *o)
{
    const char *eq = strchr(arg, '=');
    if (!eq || eq == arg || !eq[1])
        return cli_usage("%s takes NAME=FILE", flag);
    for (int t = 0; t < T_COUNT; t++) {
        if (strlen(tensor_names[t]) != (size_t)(eq - arg) ||
            strncmp(tensor_names[t], arg, (size_t)(eq - arg)) != 0)
            continue;
        if (!(want_input ? may_be_input[t] : may_be_output[t])) {
            fprintf(stderr, "attnjit: '%s' is %s of a forward op, not %s\n", tensor_names[t],
                    want_input ? "an output" : "an input", want_input ? "an input" : "an output");
            return CLI_EXIT_USAGE;
        }
        const char **slot = want_input ? &o->in[t] : &o->out[t];
        if (*slot) {
            fprintf(stderr, "attnjit: %s %s given twice\n", flag, tensor_names[t]);
            return CLI_EXIT_USAGE;
        }
        *slot = eq + 1;
        return CLI_EXIT_OK;
    }
    fprintf(stderr, "attnjit: unknown tensor '%.*s' (forward takes q, k, v, alibi_slopes, "
            "bias, and for accumulate o_acc and lse; it gives o, lse, o_acc)\n",
            (int)(eq - arg), arg);
    return CLI_EXIT_USAGE;
}

int cli_parse_run_args(int argc, char **argv, run_opts *o)
{
    memset(o, 0, sizeof *o);
    o->device = AJ_DEVICE_KIND_COUNT;
    for (int i = 0; i < argc; i++) {
        const char *a = argv[i];
        int rc = CLI_EXIT_OK;
        if (strcmp(a, "--no-cache") == 0) {
            o->no_cache = 1;
            continue;
        }
        if (a[0] != '-' || !a[1]) {
            if (o->spec)
                return cli_usage("run takes one SPEC; '%s' is a second", a);
            o->spec = a;
            continue;
        }
        if (i + 1 == argc)
            return cli_usage("%s needs a value", a);
        const char *v = argv[++i];
        if (strcmp(a, "--device") == 0) {
            if (strcmp(v, "sim") == 0)
                o->device = AJ_DEVICE_SIM;
            else if (strcmp(v, "cpu") == 0)
                o->device = AJ_DEVICE_CPU;
            else if (strcmp(v, "cuda") == 0)
                o->device = AJ_DEVICE_CUDA;
            else
                return cli_usage("--device takes sim, cpu or cuda, not '%s'", v);
        } else if (strcmp(a, "--in") == 0) {
            rc = parse_binding(a, v, 1, o);
        } else if (strcmp(a, "--out") == 0) {
            rc = parse_binding(a, v, 0, o);
        } else if (strcmp(a, "--q-offset") == 0) {
            rc = parse_i64(a, v, &o->q_offset);
        } else if (strcmp(a, "--kv-offset") == 0) {
            rc = parse_i64(a, v, &o->kv_offset);
        } else if (strcmp(a, "--sq-total") == 0) {
            rc = parse_i64(a, v, &o->sq_total);
        } else if (strcmp(a, "--sk-total") == 0) {
            rc = parse_i64(a, v, &o->sk_total);
        } else if (strcmp(a, "--seed") == 0) {
            rc = parse_u64(a, v, &o->seed);
        } else if (strcmp(a, "--offset") == 0) {
            rc = parse_u64(a, v, &o->offset);
        } else if (strcmp(a, "--workers") == 0) {
            int64_t w;
            rc = parse_i64(a, v, &w);
            if (rc == CLI_EXIT_OK && (w < 0 || w > 1024))
                return cli_usage("--workers takes 0..1024, not '%s'", v);
            o->workers = (int)w;
        } else {
            return cli_usage("unknown option '%s' for run", a);
        }
        if (rc != CLI_EXIT_OK)
            return rc;
    }
    if (!o->spec)
        return cli_usage("run needs a SPEC file%s", "");
    if (o->device == AJ_DEVICE_KIND_COUNT)
        return cli_usage("run needs --device (sim, cpu or cuda)%s", "");
    for (int t = T_Q; t <= T_V; t++)
        if (!o->in[t]) {
            fprintf(stderr, "attnjit: run needs --in %s=FILE\n", tensor_names[t]);
            return CLI_EXIT_USAGE;
        }
    if (!o->out[T_O] && !o->out[T_LSE] && !o->out[T_O_ACC])
        return cli_usage("run needs at least one --out (o=FILE, lse=FILE or o_acc=FILE)%s", "");
    return CLI_EXIT_OK;
}

/* ---------------------------------------------------------------- tensors */

typedef struct host_buffer {
    aj_tensor t;
    void *mem;
} host_buffer;

/* A contiguous tensor of `rank` dims in `dtype`, zero-filled. */
static int alloc_tensor(host_buffer *h, aj_dtype dtype, int rank, const int64_t *shape)
{
    memset(h, 0, sizeof *h);
    size_t n = 1;
    for (int i = rank - 1; i >= 0; i--) {
        h->t.shape[i] = shape[i];
        h->t.strides[i] = (int64_t)n;
        n *= (size_t)shape[i];
    }
    size_t bytes = n * (dtype == AJ_DTYPE_F32 ? 4 : 2);
    h->mem = aligned_alloc(64, (bytes + 63) / 64 * 64 + 64);
    if (!h->mem) {
        fprintf(stderr, "attnjit: out of memory for a %zu-byte tensor\n", bytes);
        return CLI_EXIT_INTERNAL;
    }
    memset(h->mem, 0, bytes);
    h->t.data = h->mem;
    h->t.dtype = dtype;
    h->t.rank = rank;
    return CLI_EXIT_OK;
}

/* Reads an input .npy of the expected rank and converts it to `dtype`. */
static int load_input(const char *name, const char *path, int rank, aj_dtype dtype,
                      host_buffer *h)
{
    npy_array a;
    char err[512];
    npy_status ns = npy_read_f32(path, &a, err, sizeof err);
    if (ns != NPY_OK) {
        fprintf(stderr, "attnjit: %s: %s\n", name, err);
        return ns == NPY_ERR_OUT_OF_MEMORY ? CLI_EXIT_INTERNAL : CLI_EXIT_INPUT;
    }
    int rc = CLI_EXIT_OK;
    if (a.rank != rank) {
        fprintf(stderr, "attnjit: %s: %s has %d dimensions, want %d (%s)\n", name, path, a.rank,
                rank, rank == 4 ? "B, H, S, D" : "H");
        rc = CLI_EXIT_INPUT;
    }
    if (rc == CLI_EXIT_OK)
        rc = alloc_tensor(h, dtype, rank, a.shape);
    if (rc == CLI_EXIT_OK)
        aj_convert(a.f32, AJ_DTYPE_F32, h->mem, dtype, a.count);
    npy_free(&a);
    return rc;
}

static int write_output(const char *name, const char *path, const host_buffer *h)
{
    size_t n = 1;
    for (int i = 0; i < h->t.rank; i++)
        n *= (size_t)h->t.shape[i];
    float *f = malloc((n ? n : 1) * sizeof *f);
    if (!f) {
        fprintf(stderr, "attnjit: out of memory writing %s\n", name);
        return CLI_EXIT_INTERNAL;
    }
    aj_convert(h->mem, h->t.dtype, f, AJ_DTYPE_F32, n);
    char err[512];
    npy_status ns = npy_write_f32(path, f, h->t.rank, h->t.shape, err, sizeof err);
    free(f);
    if (ns != NPY_OK) {
        fprintf(stderr, "attnjit: %s: %s\n", name, err);
        return CLI_EXIT_INPUT;
    }
    return CLI_EXIT_OK;
}

static size_t tensor_bytes(const aj_tensor *t)
{
    size_t n = t->dtype == AJ_DTYPE_F32 ? 4 : 2;
    for (int i = 0; i < t->rank; i++)
        n *= (size_t)t->shape[i];
    return t->rank ? n : 0;
}

static double now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

/* The tensors this op needs given, and no others; a message if not. */
static int check_op_tensors(const aj_op_info *info, const run_opts *o)
{
    struct rule {
        int needed, given;
        const char *need, *refuse;
    } rules[] = {
        {info->score_mod == AJ_SCORE_MOD_ALIBI, o->in[T_ALIBI] != NULL,
         "the op uses alibi: give --in alibi_slopes=FILE (f32, H)",
         "--in alibi_slopes given, but the op has no alibi"},
        {info->bias == AJ_BIAS_ADD, o->in[T_BIAS] != NULL,
         "the op adds a bias: give --in bias=FILE (B or 1, H or 1, Sq, Sk)",
         "--in bias given, but the op has no bias"},
        {info->accumulate, o->in[T_O_ACC] != NULL,
         "the op accumulates: give the prior result as --in o_acc=FILE --in lse=FILE",
         "--in o_acc given, but the op does not accumulate (accumulate = false)"},
        {info->accumulate, o->in[T_LSE] != NULL,
         "the op accumulates: give the prior result as --in o_acc=FILE --in lse=FILE",
         "--in lse is a prior result: only ops with accumulate = true read one"},
        {!info->accumulate, o->out[T_O] != NULL, "",
         "an accumulate op writes its output to o_acc: use --out o_acc=FILE, not --out o"},
        {info->accumulate, o->out[T_O_ACC] != NULL, "",
         "--out o_acc: only ops with accumulate = true write one"},
    };
    for (size_t i = 0; i < sizeof rules / sizeof rules[0]; i++) {
        const struct rule *r = &rules[i];
        if (r->given == r->needed || (!r->given && !r->need[0]))
            continue;
        fprintf(stderr, "attnjit: %s\n", r->given ? r->refuse : r->need);
        return CLI_EXIT_USAGE;
    }
    return CLI_EXIT_OK;
}

/* ---------------------------------------------------------------- command */

int cli_run(aj_ctx *ctx, int argc, char **argv)
{
    run_opts o;
    int rc = cli_parse_run_args(argc, argv, &o);
    if (rc != CLI_EXIT_OK)
        return rc;
    aj_op *op = NULL;
    aj_device *dev = NULL;
    aj_kernel *kernel = NULL;
    host_buffer buf[T_COUNT];
    memset(buf, 0, sizeof buf);

    rc = cli_load_op(ctx, o.spec, &op);
    if (rc != CLI_EXIT_OK)
        goto done;
    aj_op_info info;
    aj_op_get_info(op, &info);
    aj_status st = aj_device_open(ctx, o.device, 0, &dev);
    if (st == AJ_OK)
        st = aj_device_set_workers(dev, o.workers);
    aj_compile_options copt = AJ_COMPILE_OPTIONS_INIT;
    copt.target = aj_device_target(dev);
    copt.bypass_cache = o.no_cache;
    double t0 = now_ms();
    if (st == AJ_OK)
        st = aj_compile(ctx, op, &copt, &kernel);
    double compiled = now_ms();
    if (st != AJ_OK) {
        rc = cli_report(ctx, st);
        goto done;
    }

    static const aj_dtype f32 = AJ_DTYPE_F32;
    rc = check_op_tensors(&info, &o);
    for (int t = T_Q; t <= T_V && rc == CLI_EXIT_OK; t++)
        rc = load_input(tensor_names[t], o.in[t], 4, info.dtype, &buf[t]);
    if (rc == CLI_EXIT_OK && o.in[T_ALIBI])
        rc = load_input("alibi_slopes", o.in[T_ALIBI], 1, f32, &buf[T_ALIBI]);
    if (rc == CLI_EXIT_OK && o.in[T_BIAS])
        rc = load_input("bias", o.in[T_BIAS], 4, info.dtype, &buf[T_BIAS]);
    if (rc != CLI_EXIT_OK)
        goto done;
    const aj_tensor *q = &buf[T_Q].t, *v = &buf[T_V].t;
    int64_t o_shape[4] = {q->shape[0], q->shape[1], q->shape[2], v->shape[3]};
    if (info.accumulate) {   /* the prior result, overwritten in place */
        rc = load_input("o_acc", o.in[T_O_ACC], 4, f32, &buf[T_O_ACC]);
        if (rc == CLI_EXIT_OK)
            rc = load_input("lse", o.in[T_LSE], 3, f32, &buf[T_LSE]);
    } else {
        rc = alloc_tensor(&buf[T_O], info.dtype, 4, o_shape);
        if (rc == CLI_EXIT_OK)
            rc = alloc_tensor(&buf[T_LSE], f32, 3, o_shape);
    }
    if (rc != CLI_EXIT_OK)
        goto done;

    /* the tensors go to the device and the results come back (on sim and
     * cpu the device's memory is host memory: plain copies) */
    aj_tensor on_device[T_COUNT];
    void *device_mem[T_COUNT] = {0};
    size_t bytes[T_COUNT];
    for (int t = 0; t < T_COUNT && st == AJ_OK; t++) {
        on_device[t] = buf[t].t;
        bytes[t] = tensor_bytes(&buf[t].t);
        if (!buf[t].mem)
            continue;
        st = aj_device_alloc(dev, bytes[t], &device_mem[t]);
        if (st == AJ_OK)
            st = aj_device_copy_to(dev, device_mem[t], buf[t].mem, bytes[t]);
        on_device[t].data = device_mem[t];
    }
    aj_fwd_args a = AJ_FWD_ARGS_INIT;
    a.q = on_device[T_Q];
    a.k = on_device[T_K];
    a.v = on_device[T_V];
    a.o = on_device[T_O];
    a.lse = on_device[T_LSE];
    a.alibi_slopes = on_device[T_ALIBI];
    a.bias = on_device[T_BIAS];
    a.o_acc = on_device[T_O_ACC];
    a.seed = o.seed;
    a.offset = o.offset;
    a.q_offset = o.q_offset;
    a.kv_offset = o.kv_offset;
    a.sq_total = o.sq_total;
    a.sk_total = o.sk_total;
    double run_ms = 0;
    if (st == AJ_OK) {
        double t1 = now_ms();
        st = aj_forward(ctx, dev, kernel, &a);
        if (st == AJ_OK)
            st = aj_device_synchronize(dev, NULL);
        run_ms = now_ms() - t1;
    }
    for (int t = T_O; t <= T_O_ACC && st == AJ_OK; t++)
        if (device_mem[t])
            st = aj_device_copy_from(dev, buf[t].mem, device_mem[t], bytes[t]);
    for (int t = 0; t < T_COUNT; t++)
        aj_device_free(dev, device_mem[t]);
    if (st != AJ_OK) {
        rc = cli_report(ctx, st);
        goto done;
    }
    for (int t = T_O; t <= T_O_ACC && rc == CLI_EXIT_OK; t++)
        if (o.out[t])
            rc = write_output(tensor_names[t], o.out[t], &buf[t]);
    fprintf(stderr, "attnjit: %s on %s: compile %.1f ms, run %.1f ms", aj_kernel_entry(kernel),
            aj_device_name(dev), compiled - t0, run_ms);
    if (o.device == AJ_DEVICE_SIM)
        fprintf(stderr, ", %llu emulated thread-instructions",
                (unsigned long long)aj_device_last_instructions(dev));
    fprintf(stderr, "\n");
done:
    for (int t = 0; t < T_COUNT; t++)
        free(buf[t].mem);
    aj_kernel_destroy(kernel);
    aj_device_close(dev);
    aj_op_destroy(op);
    return rc;
}
