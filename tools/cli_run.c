/*
 * cli_run.c -- `attnjit run`: compile an op for a device, run it on tensors
 * read from .npy files, write the results as .npy.  Every op kind runs:
 *
 *   forward   --in q= --in k= --in v= [--in alibi_slopes=] [--in bias=]
 *             --out o= [--out lse=]
 *             (accumulate = true: --in o_acc= --in lse= --out o_acc= [--out lse=])
 *   backward  --in q= --in k= --in v= --in o= --in lse= --in do=
 *             [--in alibi_slopes=] [--in bias=] --out dq= --out dk= --out dv=
 *             [--out dbias=]
 *   merge     --in o1= --in lse1= --in o2= --in lse2= --out o= [--out lse=]
 *   paged     --in q= --in k_cache= --in v_cache= --in block_table= --in seqlens_k=
 *             [--in k_scale= --in v_scale=] --out o= [--out lse=]   (a forward
 *             with layout = paged: the caches in place of k and v)
 *
 * A varlen op (layout = varlen) takes --in cu_seqlens_q= --in cu_seqlens_k=
 * besides, a paged one with q_layout = varlen --in cu_seqlens_q=; their
 * queries (q, o, lse, o_acc, do, dq) are packed: [T, Hq, D], lse [Hq, T];
 * a varlen op's keys too ([Tk, Hkv, D]).  Batch is the offsets' count
 * less one.
 *
 * with [--q-offset N] [--kv-offset N] [--sq-total N] [--sk-total N]
 * [--seed N] [--offset N] [--workers N] [--no-cache].  Which tensors a kind
 * takes and gives is one table (RUN_TENSORS); parsing, the checks, loading,
 * allocating and writing all read it.  Which of them a given op uses is
 * the kernel parameter table's answer (aj_op_kernel_params), so run, the
 * launcher and the templates cannot disagree.
 *
 * Inputs are arrays of f32 or f16 (f8 is accepted too), converted to the
 * op's dtype (alibi_slopes, lse, o_acc, the scales stay f32; q takes its
 * q_dtype, k and v or the caches its kv_dtype, and 8-bit floats come as
 * their uint8 codes, with --in q_scale= / k_scale= / v_scale=: docs/ir.md
 * "FP8 inputs"); block_table, seqlens_k and the cu_seqlens are int32
 * arrays; outputs are f32.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ir/diag.h"
#include "tools/cli.h"
#include "tools/npy.h"

/* The op kinds as run tells them apart: an accumulating forward takes and
 * gives other tensors than a plain one, so it is a kind of its own here. */
enum { K_FORWARD, K_ACCUMULATE, K_BACKWARD, K_MERGE, K_COUNT };

/* A tensor's role in one kind: read (IN), written (OUT) or both.  An op of
 * the kind needs each of its inputs that its kernel takes (kernel_tensors). */
enum { IN = 1, OUT = 2 };

/* The feature of an op that brings a tensor, as messages name it. */
enum { WITH_NONE, WITH_ALIBI, WITH_BIAS, WITH_PAGED, WITH_F8, WITH_F8Q, WITH_VARLEN };

/* A tensor's elements: the op's dtype, f32, the op's kv_dtype, int32, its
 * q_dtype (run_elements gives each its dtype). */
enum { EL_OP, EL_F32, EL_KV, EL_I32, EL_Q, EL_COUNT };

/* An output's shape: that of another tensor, or the kind's rows tensor's
 * with (LIKE_ROWS_WIDTH) the last dim of its width tensor's, or
 * (LIKE_ROWS) without its last dim: (B, H, S), packed heads first (H, T). */
enum { LIKE_NONE = -1, LIKE_ROWS = -2, LIKE_ROWS_WIDTH = -3 };

/* Every tensor run knows: its role in each kind, the feature that brings
 * it (for messages), its rank, its elements (EL_*), the shape an output
 * takes, its shape as messages name it, and, for an op whose queries are
 * packed (layout = varlen, or paged with q_layout = varlen), its rank and
 * shape there (0, NULL: the same in both). */
#define RUN_TENSORS(X)                                                                        \
    /* id    name            forward accumulate backward merge with          rank el          \
     *   like             shape, packed rank and shape                             */         \
    X(Q,     "q",            IN,     IN,        IN,      0,    WITH_NONE,    4,   EL_Q,       \
      LIKE_NONE,       "B, Hq, Sq, D", 3, "T, Hq, D")                                         \
    X(K,     "k",            IN,     IN,        IN,      0,    WITH_NONE,    4,   EL_KV,      \
      LIKE_NONE,       "B, Hkv, Sk, D", 3, "Tk, Hkv, D")                                      \
    X(V,     "v",            IN,     IN,        IN,      0,    WITH_NONE,    4,   EL_KV,      \
      LIKE_NONE,       "B, Hkv, Sk, Dv", 3, "Tk, Hkv, Dv")                                    \
    X(ALIBI, "alibi_slopes", IN,     IN,        IN,      0,    WITH_ALIBI,   1,   EL_F32,     \
      LIKE_NONE,       "Hq", 0, NULL)                                                         \
    X(BIAS,  "bias",         IN,     IN,        IN,      0,    WITH_BIAS,    4,   EL_OP,      \
      LIKE_NONE,       "B or 1, Hq or 1, Sq, Sk", 0, NULL)                                    \
    X(O,     "o",            OUT,    0,         IN,      OUT,  WITH_NONE,    4,   EL_OP,      \
      LIKE_ROWS_WIDTH, "B, Hq, Sq, Dv", 3, "T, Hq, Dv")                                       \
    X(LSE,   "lse",          OUT,    IN | OUT,  IN,      OUT,  WITH_NONE,    3,   EL_F32,     \
      LIKE_ROWS,       "B, Hq, Sq", 2, "Hq, T")                                               \
    X(O_ACC, "o_acc",        0,      IN | OUT,  0,       0,    WITH_NONE,    4,   EL_F32,     \
      LIKE_NONE,       "B, Hq, Sq, Dv", 3, "T, Hq, Dv")                                       \
    X(DO,    "do",           0,      0,         IN,      0,    WITH_NONE,    4,   EL_OP,      \
      LIKE_NONE,       "B, Hq, Sq, Dv", 3, "T, Hq, Dv")                                       \
    X(DQ,    "dq",           0,      0,         OUT,     0,    WITH_NONE,    4,   EL_OP,      \
      T_Q,             "B, Hq, Sq, D", 3, "T, Hq, D")                                         \
    X(DK,    "dk",           0,      0,         OUT,     0,    WITH_NONE,    4,   EL_OP,      \
      T_K,             "B, Hkv, Sk, D", 3, "Tk, Hkv, D")                                      \
    X(DV,    "dv",           0,      0,         OUT,     0,    WITH_NONE,    4,   EL_OP,      \
      T_V,             "B, Hkv, Sk, Dv", 3, "Tk, Hkv, Dv")                                    \
    X(DBIAS, "dbias",        0,      0,         OUT,     0,    WITH_BIAS,    4,   EL_F32,     \
      T_BIAS,          "bias's shape", 0, NULL)                                               \
    X(O1,    "o1",           0,      0,         0,       IN,   WITH_NONE,    4,   EL_OP,      \
      LIKE_NONE,       "B, H, S, Dv", 0, NULL)                                                \
    X(LSE1,  "lse1",         0,      0,         0,       IN,   WITH_NONE,    3,   EL_F32,     \
      LIKE_NONE,       "B, H, S", 0, NULL)                                                    \
    X(O2,    "o2",           0,      0,         0,       IN,   WITH_NONE,    4,   EL_OP,      \
      LIKE_NONE,       "B, H, S, Dv", 0, NULL)                                                \
    X(LSE2,  "lse2",         0,      0,         0,       IN,   WITH_NONE,    3,   EL_F32,     \
      LIKE_NONE,       "B, H, S", 0, NULL)                                                    \
    X(K_CACHE, "k_cache",    IN,     0,         0,       0,    WITH_PAGED,   4,   EL_KV,      \
      LIKE_NONE,       "num_pages, page_size, Hkv, D", 0, NULL)                               \
    X(V_CACHE, "v_cache",    IN,     0,         0,       0,    WITH_PAGED,   4,   EL_KV,      \
      LIKE_NONE,       "num_pages, page_size, Hkv, Dv", 0, NULL)                              \
    X(TABLE, "block_table",  IN,     0,         0,       0,    WITH_PAGED,   2,   EL_I32,     \
      LIKE_NONE,       "B, max_pages", 0, NULL)                                               \
    X(SEQLENS, "seqlens_k",  IN,     0,         0,       0,    WITH_PAGED,   1,   EL_I32,     \
      LIKE_NONE,       "B", 0, NULL)                                                          \
    X(Q_SCALE, "q_scale",    IN,     0,         0,       0,    WITH_F8Q,     1,   EL_F32,     \
      LIKE_NONE,       "1 or Hq", 0, NULL)                                                    \
    X(K_SCALE, "k_scale",    IN,     0,         0,       0,    WITH_F8,      1,   EL_F32,     \
      LIKE_NONE,       "1 or Hkv", 0, NULL)                                                   \
    X(V_SCALE, "v_scale",    IN,     0,         0,       0,    WITH_F8,      1,   EL_F32,     \
      LIKE_NONE,       "1 or Hkv", 0, NULL)                                                   \
    X(CU_Q, "cu_seqlens_q",  IN,     IN,        IN,      0,    WITH_VARLEN,  1,   EL_I32,     \
      LIKE_NONE,       "B + 1", 0, NULL)                                                      \
    X(CU_K, "cu_seqlens_k",  IN,     IN,        IN,      0,    WITH_VARLEN,  1,   EL_I32,     \
      LIKE_NONE,       "B + 1", 0, NULL)

#define TENSOR_ID(id, ...) T_##id,
enum { RUN_TENSORS(TENSOR_ID) T_COUNT };
#undef TENSOR_ID

static const struct run_tensor {
    const char *name;
    unsigned char role[K_COUNT];
    unsigned char with;
    unsigned char rank;
    unsigned char el;    /* EL_*: its elements */
    signed char like;    /* outputs: LIKE_* or the tensor whose shape it takes */
    const char *shape;   /* as messages name it */
    unsigned char packed_rank;   /* packed queries: its rank (0: rank) */
    const char *packed_shape;    /* and its shape (NULL: shape) */
} tensors[T_COUNT] = {
#define TENSOR_ROW(id, nm, fwd, acc, bwd, mrg, use, rk, f, lk, sh, prk, psh) \
    [T_##id] = {nm, {fwd, acc, bwd, mrg}, use, rk, f, lk, sh, prk, psh},
    RUN_TENSORS(TENSOR_ROW)
#undef TENSOR_ROW
};

static const struct run_kind {
    const char *plural;     /* "backward" as in "an input of backward ops" */
    const char *singular;   /* "a backward op" */
    int rows, width;        /* what LIKE_ROWS and LIKE_ROWS_WIDTH read */
} kinds[K_COUNT] = {
    [K_FORWARD] = {"forward", "a forward op", T_Q, T_V},
    [K_ACCUMULATE] = {"accumulating forward",
                      "an accumulating forward op (accumulate = true)", T_Q, T_V},
    [K_BACKWARD] = {"backward", "a backward op", T_Q, T_V},
    [K_MERGE] = {"merge", "a merge op", T_O1, T_O1},
};

typedef cli_run_opts run_opts;
_Static_assert(sizeof ((run_opts *)0)->in / sizeof(char *) == T_COUNT,
               "cli_run_opts.in must hold every tensor of RUN_TENSORS");

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

/* NAME=FILE for --in / --out; whether the op's kind takes NAME that way is
 * checked once the op is known (check_tensors). */
/* Whether some kind writes tensor t. */
static int may_be_output(int t)
{
    for (int k = 0; k < K_COUNT; k++)
        if (tensors[t].role[k] & OUT)
            return 1;
    return 0;
}

static int parse_binding(const char *flag, const char *arg, int want_input, run_opts *o)
{
    const char *eq = strchr(arg, '=');
    if (!eq || eq == arg || !eq[1])
        return cli_usage("%s takes NAME=FILE", flag);
    for (int t = 0; t < T_COUNT; t++) {
        if (strlen(tensors[t].name) != (size_t)(eq - arg) ||
            strncmp(tensors[t].name, arg, (size_t)(eq - arg)) != 0)
            continue;
        const char **slot = want_input ? &o->in[t] : &o->out[t];
        if (*slot) {
            fprintf(stderr, "attnjit: %s %s given twice\n", flag, tensors[t].name);
            return CLI_EXIT_USAGE;
        }
        *slot = eq + 1;
        return CLI_EXIT_OK;
    }
    /* any other input names a side tensor; the op says which it has */
    if (want_input)
        return cli_side_add(&o->side, "run", flag, arg);
    fprintf(stderr, "attnjit: unknown tensor '%.*s' (run's outputs:", (int)(eq - arg), arg);
    for (int t = 0, n = 0; t < T_COUNT; t++)
        if (may_be_output(t))
            fprintf(stderr, "%s %s", n++ ? "," : "", tensors[t].name);
    fprintf(stderr, ")\n");
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
        const char *v = NULL;
        rc = cli_spec_or_value(argc, argv, &i, "run takes one SPEC; '%s' is a second", &o->spec,
                               &o->verbose, &v);
        if (rc != CLI_EXIT_OK)
            return rc;
        if (!v)
            continue;
        if (strcmp(a, "--device") == 0) {
            if (cli_device_kind(v, &o->device) != CLI_EXIT_OK)
                return CLI_EXIT_USAGE;
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
    return CLI_EXIT_OK;
}

/* ---------------------------------------------------------------- checks */

static int kind_of(const aj_op_info *info)
{
    switch (info->kind) {
    case AJ_KIND_BACKWARD:
        return K_BACKWARD;
    case AJ_KIND_MERGE:
        return K_MERGE;
    default:
        return info->accumulate ? K_ACCUMULATE : K_FORWARD;
    }
}

static const char *const with_feature[] = {
    [WITH_NONE] = "", [WITH_ALIBI] = "alibi", [WITH_BIAS] = "bias",
    [WITH_PAGED] = "paged layout", [WITH_F8] = "f8 kv_dtype", [WITH_F8Q] = "f8 q_dtype",
    [WITH_VARLEN] = "varlen layout"};

/* Whether the op's queries are packed [T, Hq, D] with cu_seqlens_q: layout
 * = varlen, or paged with q_layout = varlen; the tensors then take their
 * packed ranks and shapes. */
static int packed(const aj_op_info *info)
{
    return info->layout == AJ_LAYOUT_VARLEN || info->q_layout == AJ_LAYOUT_VARLEN;
}

static int rank_of(const aj_op_info *info, int t)
{
    return packed(info) && tensors[t].packed_rank ? tensors[t].packed_rank : tensors[t].rank;
}

static const char *shape_of(const aj_op_info *info, int t)
{
    return packed(info) && tensors[t].packed_shape ? tensors[t].packed_shape
                                                   : tensors[t].shape;
}

/* The target whose kernel parameters say what an op on a device of `kind`
 * takes (every GPU architecture's kernel takes the same tensors). */
static aj_target params_target(aj_device_kind kind)
{
    switch (kind) {
    case AJ_DEVICE_SIM:
        return AJ_TARGET_SIM;
    case AJ_DEVICE_CPU:
        return AJ_TARGET_CPU;
    default:
        return AJ_TARGET_SM_80;
    }
}

/* uses[t]: whether some stage of the op's kernel on the device has tensor
 * t as a parameter (aj_op_kernel_params: the parameter table). */
static aj_status kernel_tensors(aj_ctx *ctx, const aj_op *op, aj_device_kind device,
                                unsigned char *uses)
{
    aj_param_desc params[256];
    int32_t count = 0, stages = 1;
    memset(uses, 0, T_COUNT);
    for (int32_t s = 0; s < stages; s++) {
        aj_status st = aj_op_kernel_params(ctx, op, params_target(device), s, params,
                                           (int32_t)(sizeof params / sizeof params[0]), &count,
                                           &stages);
        if (st != AJ_OK)
            return st;
        for (int32_t i = 0; i < count && i < (int32_t)(sizeof params / sizeof params[0]); i++)
            for (int t = 0; t < T_COUNT; t++)
                if ((params[i].role <= AJ_ROLE_INOUT || params[i].role == AJ_ROLE_INDEX) &&
                    strcmp(params[i].name, tensors[t].name) == 0)
                    uses[t] = 1;
    }
    return AJ_OK;
}

static const char *role_noun(int dir)
{
    return dir == IN ? "an input" : "an output";
}

/* "forward and backward": the kinds in which tensor t has role `dir` (an
 * accumulating forward left out where a plain one says the same); the
 * number of kinds named. */
static int list_kinds(char *buf, size_t cap, int t, int dir)
{
    int named[K_COUNT], n = 0;
    for (int k = 0; k < K_COUNT; k++)
        if ((tensors[t].role[k] & dir) &&
            !(k == K_ACCUMULATE && (tensors[t].role[K_FORWARD] & dir)))
            named[n++] = k;
    buf[0] = '\0';
    for (int i = 0; i < n; i++) {
        size_t len = strlen(buf);
        snprintf(buf + len, cap - len, "%s%s", i == 0 ? "" : i == n - 1 ? " and " : ", ",
                 kinds[named[i]].plural);
    }
    return n;
}

/* Tensor t given as `dir` to an op of `kind`, which does not take it so. */
static int refuse_role(int t, int dir, int kind)
{
    int other = dir == IN ? OUT : IN;
    char where[160];
    if (tensors[t].role[kind] & other) {
        fprintf(stderr, "attnjit: '%s' is %s of %s ops, not %s", tensors[t].name,
                role_noun(other), kinds[kind].plural, role_noun(dir));
        if (list_kinds(where, sizeof where, t, dir))
            fprintf(stderr, " (it is %s of %s ops)", role_noun(dir), where);
        fprintf(stderr, "\n");
        return CLI_EXIT_USAGE;
    }
    int named = list_kinds(where, sizeof where, t, dir) ? dir : other;
    list_kinds(where, sizeof where, t, named);
    fprintf(stderr, "attnjit: '%s' is %s of %s ops; this spec is %s\n", tensors[t].name,
            role_noun(named), where, kinds[kind].singular);
    return CLI_EXIT_USAGE;
}

/* The tensors the op uses (uses[t]) given (inputs all, outputs at least
 * one), in the roles its kind gives them, and no others; a message if
 * not. */
static int check_tensors(const aj_op_info *info, int kind, const unsigned char *uses,
                         const run_opts *o)
{
    int outputs = 0;
    const char *known[T_COUNT];
    for (int t = 0; t < T_COUNT; t++)
        known[t] = tensors[t].name;
    int rc = cli_side_check(info, &o->side, "run", known, T_COUNT);
    if (rc != CLI_EXIT_OK)
        return rc;
    for (int t = 0; t < T_COUNT; t++) {
        int role = tensors[t].role[kind];
        for (int dir = IN; dir <= OUT; dir++) {
            const char *file = dir == IN ? o->in[t] : o->out[t];
            if (!file)
                continue;
            if (!(role & dir))
                return refuse_role(t, dir, kind);
            if (!uses[t]) {
                const char *with = with_feature[tensors[t].with];
                fprintf(stderr, "attnjit: --%s %s given, but %s%s\n", dir == IN ? "in" : "out",
                        tensors[t].name, with[0] ? "the op has no " : "the op's kernel does "
                        "not take it", with);
                return CLI_EXIT_USAGE;
            }
            outputs += dir == OUT;
        }
        if ((role & IN) && uses[t] && !o->in[t]) {
            const char *with = with_feature[tensors[t].with];
            fprintf(stderr, "attnjit: %s%s%s needs --in %s=FILE (%s)\n", kinds[kind].singular,
                    with[0] ? " with " : "", with, tensors[t].name, shape_of(info, t));
            return CLI_EXIT_USAGE;
        }
    }
    if (outputs)
        return CLI_EXIT_OK;
    fprintf(stderr, "attnjit: run needs at least one --out: %s gives", kinds[kind].singular);
    const char *sep = " ";
    for (int t = 0; t < T_COUNT; t++)
        if ((tensors[t].role[kind] & OUT) && uses[t]) {
            fprintf(stderr, "%s%s", sep, tensors[t].name);
            sep = ", ";
        }
    fprintf(stderr, "\n");
    return CLI_EXIT_USAGE;
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
    size_t bytes = n * (size_t)aj_dtype_size(dtype);
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

/* The dtype of each kind of elements (EL_*) for an op: int32 as 4-byte f32
 * elements, as the launch binds int32 arrays. */
typedef struct run_elements {
    const aj_op_info *info;
    aj_dtype of[EL_COUNT];
} run_elements;

static run_elements run_elements_of(const aj_op *op, const aj_op_info *info)
{
    run_elements r = {info, {[EL_OP] = info->dtype, [EL_F32] = AJ_DTYPE_F32,
                             [EL_KV] = info->kv_dtype, [EL_I32] = AJ_DTYPE_F32,
                             [EL_Q] = info->dtype}};
    aj_op_get_q_dtype(op, &r.of[EL_Q]);
    return r;
}

static aj_dtype dtype_of(const run_elements *el, int t)
{
    return el->of[tensors[t].el];
}

/* Whether input t is read as integers: int32 tables, 8-bit floats' codes. */
static int read_as_int(const run_elements *el, int t)
{
    return tensors[t].el == EL_I32 || dtype_of(el, t) >= AJ_DTYPE_F8E4M3;
}

/* Integers into h: int32 as they are, f8 codes (0..255) as bytes. */
static int store_ints(const run_elements *el, int t, const npy_array *a, host_buffer *h)
{
    if (tensors[t].el == EL_I32) {
        memcpy(h->mem, a->i32, a->count * sizeof *a->i32);
        return CLI_EXIT_OK;
    }
    for (size_t i = 0; i < a->count; i++) {
        if (a->i32[i] < 0 || a->i32[i] > 255) {
            fprintf(stderr, "attnjit: %s: element %zu is %d; %s elements come as byte codes "
                    "(uint8)\n", tensors[t].name, i, a->i32[i],
                    aj_dtype_name(dtype_of(el, t)));
            return CLI_EXIT_INPUT;
        }
        ((unsigned char *)h->mem)[i] = (unsigned char)a->i32[i];
    }
    return CLI_EXIT_OK;
}

/* Reads input t from `path` (of the rank the table gives) and converts it
 * to its dtype. */
static int load_input(const run_elements *el, int t, const char *path, host_buffer *h)
{
    const aj_op_info *info = el->info;
    npy_array a;
    char err[512];
    const char *name = tensors[t].name;
    int ints = read_as_int(el, t);
    npy_status ns = ints ? npy_read_i32(path, &a, err, sizeof err)
                         : npy_read_f32(path, &a, err, sizeof err);
    if (ns != NPY_OK) {
        fprintf(stderr, "attnjit: %s: %s\n", name, err);
        return ns == NPY_ERR_OUT_OF_MEMORY ? CLI_EXIT_INTERNAL : CLI_EXIT_INPUT;
    }
    int rc = CLI_EXIT_OK;
    if (a.rank != rank_of(info, t)) {
        fprintf(stderr, "attnjit: %s: %s has %d dimensions, want %d (%s)\n", name, path, a.rank,
                rank_of(info, t), shape_of(info, t));
        rc = CLI_EXIT_INPUT;
    }
    aj_dtype dtype = dtype_of(el, t);
    if (rc == CLI_EXIT_OK)
        rc = alloc_tensor(h, dtype, a.rank, a.shape);
    if (rc == CLI_EXIT_OK && ints)
        rc = store_ints(el, t, &a, h);
    else if (rc == CLI_EXIT_OK)
        aj_convert(a.f32, AJ_DTYPE_F32, h->mem, dtype, a.count);
    npy_free(&a);
    return rc;
}

/* Every input given, and every output the op writes that is not also an
 * input (o_acc, an accumulating forward's lse) zero-filled in the shape
 * its `like` names. */
static int host_tensors(const run_elements *el, int kind, const unsigned char *uses,
                        const run_opts *o, host_buffer *buf)
{
    const aj_op_info *info = el->info;
    int rc = CLI_EXIT_OK;
    for (int t = 0; t < T_COUNT && rc == CLI_EXIT_OK; t++)
        if (o->in[t])
            rc = load_input(el, t, o->in[t], &buf[t]);
    const aj_tensor *rows = &buf[kinds[kind].rows].t, *width = &buf[kinds[kind].width].t;
    if (!buf[kinds[kind].width].mem && buf[T_V_CACHE].mem)
        width = &buf[T_V_CACHE].t;   /* paged: V's width is its cache's */
    for (int t = 0; t < T_COUNT && rc == CLI_EXIT_OK; t++) {
        if (!(tensors[t].role[kind] & OUT) || !uses[t] || buf[t].mem)
            continue;
        int like = tensors[t].like;
        const aj_tensor *from = like >= 0 ? &buf[like].t : rows;
        int rank = like >= 0 ? from->rank : rank_of(info, t);
        int64_t shape[4] = {from->shape[0], from->shape[1], from->shape[2], from->shape[3]};
        if (like == LIKE_ROWS_WIDTH)
            shape[rank - 1] = width->shape[width->rank - 1];
        if (like == LIKE_ROWS && packed(info)) {   /* [T, Hq, D] -> [Hq, T] */
            shape[0] = from->shape[1];
            shape[1] = from->shape[0];
        }
        rc = alloc_tensor(&buf[t], dtype_of(el, t), rank, shape);
    }
    return rc;
}

/* What a packed op's args take from its offsets: batch (their count less
 * one) and the longest sequences (0 where there are no such offsets). */
typedef struct packed_sizes {
    int32_t batch, max_seqlen_q, max_seqlen_k;
} packed_sizes;

static int32_t longest(const host_buffer *cu)
{
    const int32_t *c = cu->mem;
    int64_t most = 0;
    for (int64_t i = 0; c && i + 1 < cu->t.shape[0]; i++)
        if ((int64_t)c[i + 1] - c[i] > most)
            most = (int64_t)c[i + 1] - c[i];
    return most > INT32_MAX ? INT32_MAX : (int32_t)most;
}

/* The counts of a packed op's offsets, against each other and the paged
 * tables' rows (the kernel checks their values, each against T and Tk,
 * and reports the first bad one). */
static int packed_sizes_of(const aj_op_info *info, const host_buffer *buf, packed_sizes *ps)
{
    memset(ps, 0, sizeof *ps);
    if (!packed(info) || !buf[T_CU_Q].mem)
        return CLI_EXIT_OK;
    long long n = buf[T_CU_Q].t.shape[0];
    if (n < 2) {
        fprintf(stderr, "attnjit: cu_seqlens_q has %lld entries; it holds batch + 1 offsets "
                "(at least 2)\n", n);
        return CLI_EXIT_INPUT;
    }
    static const int same_rows[] = {T_CU_K, T_TABLE, T_SEQLENS};
    for (size_t i = 0; i < sizeof same_rows / sizeof same_rows[0]; i++) {
        const host_buffer *h = &buf[same_rows[i]];
        long long want = same_rows[i] == T_CU_K ? n : n - 1;
        if (h->mem && h->t.shape[0] != want) {
            fprintf(stderr, "attnjit: %s has %lld %s, but cu_seqlens_q's %lld entries make "
                    "batch %lld (%s)\n", tensors[same_rows[i]].name, (long long)h->t.shape[0],
                    h->t.rank > 1 ? "rows" : "entries", n, n - 1,
                    shape_of(info, same_rows[i]));
            return CLI_EXIT_INPUT;
        }
    }
    ps->batch = (int32_t)(n - 1);
    ps->max_seqlen_q = longest(&buf[T_CU_Q]);
    ps->max_seqlen_k = longest(&buf[T_CU_K]);
    return CLI_EXIT_OK;
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
    size_t n = (size_t)aj_dtype_size(t->dtype);
    for (int i = 0; i < t->rank; i++)
        n *= (size_t)t->shape[i];
    return t->rank ? n : 0;
}

static double now_ms(void)
{
    return aj_now() * 1e3;
}

/* ---------------------------------------------------------------- launch */

/* The argument structs of the three entry points, filled from the device
 * tensors (one a kind does not use stays empty). */
typedef struct launch_args {
    aj_fwd_args fwd;
    aj_bwd_args bwd;
    aj_merge_args merge;
} launch_args;

/* The fields aj_fwd_args and aj_bwd_args share, by name. */
#define FILL_SHARED_ARGS(a, t, o, ps)                                           \
    do {                                                                        \
        (a).q = (t)[T_Q];                                                       \
        (a).k = (t)[T_K];                                                       \
        (a).v = (t)[T_V];                                                       \
        (a).o = (t)[T_O];                                                       \
        (a).lse = (t)[T_LSE];                                                   \
        (a).alibi_slopes = (t)[T_ALIBI];                                        \
        (a).bias = (t)[T_BIAS];                                                 \
        (a).q_offset = (o)->q_offset;                                           \
        (a).kv_offset = (o)->kv_offset;                                         \
        (a).sq_total = (o)->sq_total;                                           \
        (a).sk_total = (o)->sk_total;                                           \
        (a).seed = (o)->seed;                                                   \
        (a).offset = (o)->offset;                                               \
        (a).cu_seqlens_q = (t)[T_CU_Q].data;                                    \
        (a).cu_seqlens_k = (t)[T_CU_K].data;                                    \
        (a).batch = (ps)->batch;                                                \
        (a).max_seqlen_q = (ps)->max_seqlen_q;                                  \
        (a).max_seqlen_k = (ps)->max_seqlen_k;                                  \
    } while (0)

static void fill_args(const aj_tensor *t, const run_opts *o, const packed_sizes *ps,
                      launch_args *a)
{
    a->fwd = (aj_fwd_args)AJ_FWD_ARGS_INIT;
    FILL_SHARED_ARGS(a->fwd, t, o, ps);
    a->fwd.o_acc = t[T_O_ACC];
    a->fwd.k_cache = t[T_K_CACHE];
    a->fwd.v_cache = t[T_V_CACHE];
    a->fwd.block_table = t[T_TABLE].data;
    a->fwd.max_pages = (int32_t)t[T_TABLE].shape[1];
    a->fwd.seqlens_k = t[T_SEQLENS].data;
    a->fwd.q_scale = t[T_Q_SCALE];
    a->fwd.k_scale = t[T_K_SCALE];
    a->fwd.v_scale = t[T_V_SCALE];

    a->bwd = (aj_bwd_args)AJ_BWD_ARGS_INIT;
    FILL_SHARED_ARGS(a->bwd, t, o, ps);
    a->bwd.do_ = t[T_DO];
    a->bwd.dq = t[T_DQ];
    a->bwd.dk = t[T_DK];
    a->bwd.dv = t[T_DV];
    a->bwd.dbias = t[T_DBIAS];

    a->merge = (aj_merge_args)AJ_MERGE_ARGS_INIT;
    a->merge.o1 = t[T_O1];
    a->merge.lse1 = t[T_LSE1];
    a->merge.o2 = t[T_O2];
    a->merge.lse2 = t[T_LSE2];
    a->merge.o = t[T_O];
    a->merge.lse = t[T_LSE];
}

/* One launch of the kernel, for aj_device_time. */
typedef struct launch_call {
    aj_ctx *ctx;
    aj_device *dev;
    const aj_kernel *kernel;
    int kind;
    launch_args *a;
} launch_call;

static aj_status launch_once(void *user)
{
    const launch_call *c = user;
    switch (c->kind) {
    case K_BACKWARD:
        return aj_backward(c->ctx, c->dev, c->kernel, &c->a->bwd);
    case K_MERGE:
        return aj_merge(c->ctx, c->dev, c->kernel, &c->a->merge);
    default:
        return aj_forward(c->ctx, c->dev, c->kernel, &c->a->fwd);
    }
}

/* Runs the kernel on a stream of its own and waits for that stream (not
 * the whole device: a GPU shared with other work is not stalled); the
 * device time in *run_ms (CUDA events on a GPU).  A backward's workspace
 * is allocated before and freed after, outside the time. */
static aj_status launch(aj_ctx *ctx, aj_device *dev, const aj_kernel *kernel, int kind,
                        launch_args *a, double *run_ms)
{
    void *stream = NULL;
    aj_status st = aj_device_stream_create(dev, &stream);
    a->fwd.stream = a->bwd.stream = a->merge.stream = stream;
    if (st == AJ_OK && kind == K_BACKWARD) {
        st = aj_backward_workspace_size(ctx, kernel, &a->bwd, &a->bwd.workspace_bytes);
        if (st == AJ_OK && a->bwd.workspace_bytes)
            st = aj_device_alloc(dev, a->bwd.workspace_bytes, &a->bwd.workspace);
    }
    launch_call call = {ctx, dev, kernel, kind, a};
    if (st == AJ_OK)
        st = aj_device_time(dev, stream, launch_once, &call, run_ms);
    if (st == AJ_OK)
        st = aj_device_synchronize(dev, stream);
    aj_device_free(dev, a->bwd.workspace);
    aj_device_stream_destroy(dev, stream);
    return st;
}

/* ---------------------------------------------------------------- command */

/* What a run measured, for its summary line. */
typedef struct run_report {
    double compile_ms, run_ms;
    aj_tile_counts tiles;   /* forward, padded, with --verbose */
    int have_tiles;
} run_report;

static aj_status open_and_compile(aj_ctx *ctx, const aj_op *op, const run_opts *o,
                                  aj_device **dev, aj_kernel **kernel, run_report *r);
static aj_status run_on_device(aj_ctx *ctx, aj_device *dev, const aj_op *op,
                               const aj_kernel *kernel, int kind, const run_opts *o,
                               host_buffer *buf, const packed_sizes *sizes,
                               const cli_side_buffers *side, aj_side_tensor *side_dev,
                               run_report *r);
static void print_report(const aj_kernel *kernel, aj_device *dev, const run_report *r);

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
    cli_side_buffers side = {0};
    aj_side_tensor side_dev[AJ_OP_TENSORS_MAX] = {{0}};
    run_report report;
    memset(&report, 0, sizeof report);

    rc = cli_load_op(ctx, o.spec, &op);
    if (rc != CLI_EXIT_OK)
        goto done;
    aj_op_info info;
    aj_op_get_info(op, &info);
    int kind = kind_of(&info);
    unsigned char uses[T_COUNT];
    aj_status st = kernel_tensors(ctx, op, o.device, uses);
    if (st != AJ_OK) {
        rc = cli_report(ctx, st);
        goto done;
    }
    rc = check_tensors(&info, kind, uses, &o);
    if (rc != CLI_EXIT_OK)
        goto done;
    st = open_and_compile(ctx, op, &o, &dev, &kernel, &report);
    if (st != AJ_OK) {
        rc = cli_report(ctx, st);
        goto done;
    }
    const run_elements elements = run_elements_of(op, &info);
    rc = host_tensors(&elements, kind, uses, &o, buf);
    packed_sizes sizes;
    if (rc == CLI_EXIT_OK)
        rc = packed_sizes_of(&info, buf, &sizes);
    if (rc == CLI_EXIT_OK)
        rc = cli_side_load(&info, &o.side, &side);
    if (rc != CLI_EXIT_OK)
        goto done;
    st = run_on_device(ctx, dev, op, kernel, kind, &o, buf, &sizes, &side, side_dev, &report);
    if (st != AJ_OK) {
        rc = cli_report(ctx, st);
        goto done;
    }
    for (int t = 0; t < T_COUNT && rc == CLI_EXIT_OK; t++)
        if (o.out[t])
            rc = write_output(tensors[t].name, o.out[t], &buf[t]);
    print_report(kernel, dev, &report);
done:
    cli_side_free(dev, &side, side_dev);
    for (int t = 0; t < T_COUNT; t++)
        free(buf[t].mem);
    aj_kernel_destroy(kernel);
    aj_device_close(dev);
    aj_op_destroy(op);
    return rc;
}

/* Opens the device --device names, with --workers, and compiles the op
 * for it (--no-cache: bypassing the kernel cache), timed. */
static aj_status open_and_compile(aj_ctx *ctx, const aj_op *op, const run_opts *o,
                                  aj_device **dev, aj_kernel **kernel, run_report *r)
{
    aj_status st = aj_device_open(ctx, o->device, 0, dev);
    if (st == AJ_OK)
        st = aj_device_set_workers(*dev, o->workers);
    aj_compile_options copt = AJ_COMPILE_OPTIONS_INIT;
    copt.target = aj_device_target(*dev);
    copt.bypass_cache = o->no_cache;
    double t0 = now_ms();
    if (st == AJ_OK)
        st = aj_compile(ctx, op, &copt, kernel);
    r->compile_ms = now_ms() - t0;
    return st;
}

/* The tensors go to the device, the kernel runs and the results come
 * back into buf (on sim and cpu the device's memory is host memory:
 * plain copies); with --verbose a padded forward also counts its tiles. */
static aj_status run_on_device(aj_ctx *ctx, aj_device *dev, const aj_op *op,
                               const aj_kernel *kernel, int kind, const run_opts *o,
                               host_buffer *buf, const packed_sizes *sizes,
                               const cli_side_buffers *side, aj_side_tensor *side_dev,
                               run_report *r)
{
    aj_status st = AJ_OK;
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
    if (st == AJ_OK)
        st = cli_side_to_device(dev, side, side_dev);
    launch_args args;
    fill_args(on_device, o, sizes, &args);
    args.fwd.side = args.bwd.side = side_dev;
    args.fwd.num_side = args.bwd.num_side = side->n;
    if (st == AJ_OK)
        st = launch(ctx, dev, kernel, kind, &args, &r->run_ms);
    for (int t = 0; t < T_COUNT && st == AJ_OK; t++)
        if ((tensors[t].role[kind] & OUT) && device_mem[t])
            st = aj_device_copy_from(dev, buf[t].mem, device_mem[t], bytes[t]);
    aj_op_info info;
    aj_op_get_info(op, &info);
    if (st == AJ_OK && o->verbose && kind == K_FORWARD && info.layout == AJ_LAYOUT_PADDED) {
        aj_block_mask *mask = NULL;
        st = aj_block_mask_create(ctx, dev, op, kernel, &args.fwd, &mask);
        r->have_tiles = st == AJ_OK && aj_block_mask_counts(mask, &r->tiles) == AJ_OK;
        aj_block_mask_destroy(mask);
    }
    for (int t = 0; t < T_COUNT; t++)
        aj_device_free(dev, device_mem[t]);
    return st;
}

/* The run's summary on stderr: times, the emulator's instruction count,
 * the tile classes if counted. */
static void print_report(const aj_kernel *kernel, aj_device *dev, const run_report *r)
{
    fprintf(stderr, "attnjit: %s on %s: compile %.1f ms, run %.1f ms", aj_kernel_entry(kernel),
            aj_device_name(dev), r->compile_ms, r->run_ms);
    aj_device_caps caps = AJ_DEVICE_CAPS_INIT;
    if (aj_device_get_caps(dev, &caps) == AJ_OK && caps.counts_instructions)
        fprintf(stderr, ", %llu emulated thread-instructions",
                (unsigned long long)aj_device_last_instructions(dev));
    fprintf(stderr, "\n");
    if (r->have_tiles)
        fprintf(stderr, "attnjit: tiles of %d x %d: %lld skipped, %lld partial, %lld full\n",
                r->tiles.block_m, r->tiles.block_n, (long long)r->tiles.tiles[AJ_TILE_SKIP],
                (long long)r->tiles.tiles[AJ_TILE_PARTIAL],
                (long long)r->tiles.tiles[AJ_TILE_FULL]);
}
