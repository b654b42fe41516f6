/*
 * cli_ring.c -- `attnjit ring`: ring attention over MPI ranks on .npy
 * tensors.
 *
 *   mpirun -np P attnjit ring SPEC --device sim|cpu|cuda
 *       [--method ring|ulysses|hybrid] [--ulysses-size U]
 *       [--layout contiguous|zigzag] [--rotate p2p|allgather] [--comm mpi|nccl]
 *       --in q=F --in k=F --in v=F [--in alibi_slopes=F] [--in NAME=F (side
 *       tensors)] [--in cu_seqlens_q=F --in cu_seqlens_k=F (layout = varlen)]
 *       --out o=F [--out lse=F]
 *       [--grad --in do=F --out dq=F --out dk=F --out dv=F]
 *       [--seed N] [--offset N] [--timeout S] [--workers N] [--device-index N] [--check]
 *       [-v]
 *
 * Each rank opens device --device-index of its kind; for cuda the default
 * is the rank's index among the ranks of its node (one GPU per rank).
 * The shards live in the device's memory (copied there from the host and
 * back), as the ring and the launches take them.
 * Any length: rank r holds aj_shard_length positions.  A layout = varlen
 * spec takes packed (T, H, D) tensors (lse (H, T)) and the whole batch's
 * int32 cu_seqlens; rank r holds its pieces (aj_shard_varlen: the ring
 * cuts each document, Ulysses the packed axis).
 * Rank 0 reads the full tensors, sends every rank its shard, gathers the
 * results and writes them; every rank's timings are printed by rank 0.
 * --check runs the same op on rank 0 alone (aj_forward / aj_backward on
 * the full tensors) and compares.  Side tensors go whole to every rank;
 * -v prints each forward launch's tiles (skipped, partial, full).
 *
 *   rank 0                     ranks 1 .. P-1
 *   read .npy, shard  ------>  receive shards
 *   ring forward (+ backward), all ranks together
 *   receive shards  <-------   send results
 *   unshard, write .npy, print the timing table
 */
#include <errno.h>
#include <math.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ir/expr.h"
#include "tools/cli.h"
#include "tools/npy.h"

enum { R_Q, R_K, R_V, R_DO, R_ALIBI, R_IN_COUNT };
enum { R_O, R_LSE, R_DQ, R_DK, R_DV, R_OUT_COUNT };
static const char *const in_names[R_IN_COUNT] = {"q", "k", "v", "do", "alibi_slopes"};
static const char *const out_names[R_OUT_COUNT] = {"o", "lse", "dq", "dk", "dv"};

typedef struct ring_opts {
    const char *spec;
    const char *device;
    aj_shard_layout layout;
    aj_ring_rotate rotate;
    aj_cp_method method;
    aj_comm_kind comm;       /* --comm: the transport (default: nccl on cuda, else mpi) */
    int comm_given;
    int ulysses_size;
    const char *in[R_IN_COUNT], *out[R_OUT_COUNT];
    cli_side_opts side;      /* --in NAME=FILE for the op's side tensors */
    int grad, check, workers, verbose;
    int device_index;             /* -1: the node-local rank for cuda, else 0 */
    uint64_t seed, offset;
    double timeout_s;
    /* layout = varlen: --in cu_seqlens_q=F, cu_seqlens_k=F, and once read
     * (every rank) their offsets, the batch and each rank's shard lengths
     * of the queries [0] and keys [1] */
    const char *cu_path[2];
    int32_t *cu[2];
    int32_t batch;
    int64_t *varlen_len[2];
} ring_opts;

static const char *const cu_names[2] = {"cu_seqlens_q", "cu_seqlens_k"};

/* ---------------------------------------------------------------- options */

static int bind(const char *flag, const char *arg, const char *const *names, int n,
                const char **slots, cli_side_opts *side)
{
    const char *eq = strchr(arg, '=');
    if (!eq || eq == arg || !eq[1])
        return cli_usage("%s takes NAME=FILE", flag);
    for (int t = 0; t < n; t++)
        if (strlen(names[t]) == (size_t)(eq - arg) &&
            strncmp(names[t], arg, (size_t)(eq - arg)) == 0) {
            if (slots[t]) {
                fprintf(stderr, "attnjit: %s %s given twice\n", flag, names[t]);
                return CLI_EXIT_USAGE;
            }
            slots[t] = eq + 1;
            return CLI_EXIT_OK;
        }
    /* any other input names a side tensor; the op says which it has */
    if (side)
        return cli_side_add(side, "ring", flag, arg);
    fprintf(stderr, "attnjit: ring: unknown %s tensor '%.*s' (inputs: q, k, v, do, "
            "alibi_slopes and the op's side tensors; outputs: o, lse, dq, dk, dv)\n", flag,
            (int)(eq - arg), arg);
    return CLI_EXIT_USAGE;
}

static int parse_number(const char *flag, const char *s, double lo, double hi, double *out)
{
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || end == s || *end || !(v >= lo && v <= hi)) {
        fprintf(stderr, "attnjit: %s takes a number in %g .. %g, not '%s'\n", flag, lo, hi, s);
        return CLI_EXIT_USAGE;
    }
    *out = v;
    return CLI_EXIT_OK;
}

static const char *const layout_names[AJ_SHARD_LAYOUT_COUNT] = {
    [AJ_SHARD_CONTIGUOUS] = "contiguous", [AJ_SHARD_ZIGZAG] = "zigzag"};
static const char *const method_names[AJ_METHOD_COUNT] = {
    [AJ_METHOD_RING] = "ring", [AJ_METHOD_ULYSSES] = "ulysses", [AJ_METHOD_HYBRID] = "hybrid"};
static const char *const rotate_names[AJ_ROTATE_COUNT] = {
    [AJ_ROTATE_P2P] = "p2p", [AJ_ROTATE_ALLGATHER] = "allgather"};
static const char *const comm_names[] = {[AJ_COMM_MPI] = "mpi", [AJ_COMM_NCCL] = "nccl"};

/* *out: the index of s in names[0 .. n-1]; else the usage, with `fail`
 * (one %s: s). */
static int choose(const char *s, const char *const *names, int n, int *out, const char *fail)
{
    for (int i = 0; i < n; i++)
        if (strcmp(s, names[i]) == 0) {
            *out = i;
            return CLI_EXIT_OK;
        }
    return cli_usage(fail, s);
}

static int parse_ring_args(int argc, char **argv, ring_opts *o)
{
    memset(o, 0, sizeof *o);
    o->device_index = -1;
    for (int i = 0; i < argc; i++) {
        const char *a = argv[i];
        int rc = CLI_EXIT_OK;
        if (strcmp(a, "--grad") == 0 || strcmp(a, "--check") == 0) {
            *(a[2] == 'g' ? &o->grad : &o->check) = 1;
            continue;
        }
        const char *v = NULL;
        rc = cli_spec_or_value(argc, argv, &i, "ring takes one SPEC; '%s' is a second", &o->spec,
                               &o->verbose, &v);
        if (rc != CLI_EXIT_OK)
            return rc;
        if (!v)
            continue;
        double num = 0;
        int pick = 0;   /* --layout, --method, --rotate, --comm: the index of the name */
        if (strcmp(a, "--device") == 0) {
            o->device = v;
        } else if (strcmp(a, "--layout") == 0) {
            rc = choose(v, layout_names, AJ_SHARD_LAYOUT_COUNT, &pick,
                        "--layout takes contiguous or zigzag, not '%s'");
            o->layout = (aj_shard_layout)pick;
        } else if (strcmp(a, "--method") == 0) {
            rc = choose(v, method_names, AJ_METHOD_COUNT, &pick,
                        "--method takes ring, ulysses or hybrid, not '%s'");
            o->method = (aj_cp_method)pick;
        } else if (strcmp(a, "--ulysses-size") == 0) {
            rc = parse_number(a, v, 0, 1 << 20, &num);
            o->ulysses_size = (int)num;
        } else if (strcmp(a, "--rotate") == 0) {
            rc = choose(v, rotate_names, AJ_ROTATE_COUNT, &pick,
                        "--rotate takes p2p or allgather, not '%s'");
            o->rotate = (aj_ring_rotate)pick;
        } else if (strcmp(a, "--comm") == 0) {
            rc = choose(v, comm_names, AJ_COMM_KIND_COUNT, &pick, "--comm takes mpi or nccl, not '%s'");
            o->comm = (aj_comm_kind)pick;
            o->comm_given = 1;
        } else if (strcmp(a, "--in") == 0 && strncmp(v, "cu_seqlens_", 11) == 0) {
            rc = bind(a, v, cu_names, 2, o->cu_path, NULL);
        } else if (strcmp(a, "--in") == 0) {
            rc = bind(a, v, in_names, R_IN_COUNT, o->in, &o->side);
        } else if (strcmp(a, "--out") == 0) {
            rc = bind(a, v, out_names, R_OUT_COUNT, o->out, NULL);
        } else if (strcmp(a, "--seed") == 0 || strcmp(a, "--offset") == 0) {
            char *end;
            errno = 0;
            unsigned long long u = strtoull(v, &end, 10);
            if (errno || end == v || *end || v[0] == '-')
                return cli_usage("%s takes a non-negative integer", a);
            *(a[2] == 's' ? &o->seed : &o->offset) = u;
        } else if (strcmp(a, "--timeout") == 0) {
            rc = parse_number(a, v, 0.001, 1e6, &o->timeout_s);
        } else if (strcmp(a, "--workers") == 0) {
            rc = parse_number(a, v, 0, 1024, &num);
            o->workers = (int)num;
        } else if (strcmp(a, "--device-index") == 0) {
            rc = parse_number(a, v, 0, 1024, &num);
            o->device_index = (int)num;
        } else {
            return cli_usage("unknown option '%s' for ring", a);
        }
        if (rc != CLI_EXIT_OK)
            return rc;
    }
    if (!o->spec)
        return cli_usage("ring needs a SPEC file%s", "");
    if (!o->device)
        return cli_usage("ring needs --device (sim, cpu or cuda)%s", "");
    /* GPUs talk over NCCL unless told otherwise: the resident ring (over
     * MPI every block stages through host memory) */
    if (!o->comm_given)
        o->comm = strcmp(o->device, "cuda") == 0 ? AJ_COMM_NCCL : AJ_COMM_MPI;
    for (int t = R_Q; t <= R_V; t++)
        if (!o->in[t]) {
            fprintf(stderr, "attnjit: ring needs --in %s=FILE\n", in_names[t]);
            return CLI_EXIT_USAGE;
        }
    if (o->grad != (o->in[R_DO] != NULL))
        return cli_usage("%s", o->grad ? "--grad needs --in do=FILE"
                                       : "--in do=FILE is the backward's input: add --grad");
    for (int t = R_DQ; t <= R_DV; t++)
        if (!o->grad && o->out[t]) {
            fprintf(stderr, "attnjit: --out %s needs --grad\n", out_names[t]);
            return CLI_EXIT_USAGE;
        }
    return CLI_EXIT_OK;
}

/* ---------------------------------------------------------------- data */

/* A tensor of the run: full (rank 0 only) and this rank's shard, both
 * f32 as the files hold them; dims BHSD, or (H) for alibi_slopes. */
typedef struct ring_tensor {
    int rank;
    int keys;                 /* positions of k (else of q): varlen's cu_seqlens_k */
    int64_t shape[4];
    float *full, *shard;
    void *typed;              /* the shard in the op's dtype (lse: f32), host */
    aj_tensor t;              /* the shard's shape; data in the device's memory */
} ring_tensor;

static size_t count_of(int rank, const int64_t *shape)
{
    size_t n = 1;
    for (int i = 0; i < rank; i++)
        n *= (size_t)shape[i];
    return n;
}

static void *alloc64(size_t bytes)
{
    void *p = aligned_alloc(64, (bytes + 63) / 64 * 64 + 64);
    if (p)
        memset(p, 0, (bytes + 63) / 64 * 64 + 64);
    return p;
}

/* [outer, seq, inner] of a BHSD (or BHS) tensor, varlen's THD (or HT). */
static aj_seq_shape seq_shape_of(const ring_opts *o, const ring_tensor *x)
{
    if (o->batch && x->rank == 3)
        return (aj_seq_shape){1, x->shape[0], x->shape[1] * x->shape[2], sizeof(float)};
    if (o->batch)
        return (aj_seq_shape){x->shape[0], x->shape[1], 1, sizeof(float)};
    aj_seq_shape s = {x->shape[0] * x->shape[1], x->shape[2], 1, sizeof(float)};
    if (x->rank == 4)
        s.inner = x->shape[3];
    return s;
}

/* Rank `r`'s shard of a BHSD (or BHS) tensor: its shape. */
static void shard_shape(const ring_opts *o, const ring_tensor *x, int r, int size,
                        int64_t shape[4])
{
    memcpy(shape, x->shape, 4 * sizeof shape[0]);
    if (o->batch && x->rank >= 2)   /* THD: dim 0; HT: dim 1 */
        shape[x->rank == 3 ? 0 : 1] = o->varlen_len[x->keys][r];
    else if (x->rank >= 3)
        shape[2] = aj_shard_length(o->layout, r, size, x->shape[2]);
}

/* Sizes this rank's shard (and typed copy) from the full shape. */
static int alloc_shard(const ring_opts *o, ring_tensor *x, aj_dtype dtype, int me, int size)
{
    int64_t shape[4];
    shard_shape(o, x, me, size, shape);
    const size_t n = count_of(x->rank, shape);
    x->shard = alloc64(n * sizeof(float));
    x->typed = alloc64(n * (dtype == AJ_DTYPE_F32 ? 4 : 2));
    if (!x->shard || !x->typed) {
        fprintf(stderr, "attnjit: out of memory for a shard of %zu elements\n", n);
        return CLI_EXIT_INTERNAL;
    }
    x->t = (aj_tensor){.data = x->typed, .dtype = dtype, .rank = x->rank};
    int64_t stride = 1;
    for (int i = x->rank - 1; i >= 0; i--) {
        x->t.shape[i] = shape[i];
        x->t.strides[i] = stride;
        stride *= shape[i];
    }
    return CLI_EXIT_OK;
}

static size_t elem_of(aj_dtype dtype)
{
    return dtype == AJ_DTYPE_F32 ? 4 : 2;
}

/* `bytes` of host memory (NULL: none, the memory is an output) into new
 * device memory, *out. */
static aj_status upload(aj_device *dev, const void *host, size_t bytes, void **out)
{
    aj_status st = aj_device_alloc(dev, bytes, out);
    if (st == AJ_OK && host)
        st = aj_device_copy_to(dev, *out, host, bytes);
    return st;
}

/* The shard's device memory: a copy of typed (inputs), or room for a
 * result (outputs). */
static aj_status shard_to_device(aj_device *dev, ring_tensor *x, int input)
{
    const size_t bytes = count_of(x->rank, x->t.shape) * elem_of(x->t.dtype);
    x->t.data = NULL;
    return upload(dev, input ? x->typed : NULL, bytes, &x->t.data);
}

/* A result shard back into typed, for gathering. */
static aj_status shard_from_device(aj_device *dev, ring_tensor *x)
{
    const size_t bytes = count_of(x->rank, x->t.shape) * elem_of(x->t.dtype);
    return aj_device_copy_from(dev, x->typed, x->t.data, bytes);
}

static void free_tensor(aj_device *dev, ring_tensor *x)
{
    if (x->t.data != x->typed)
        aj_device_free(dev, x->t.data);
    free(x->full);
    free(x->shard);
    free(x->typed);
}

/* The rank's index among the ranks of its node (collective): with one
 * GPU per rank, the GPU it opens. */
static int node_local_rank(void)
{
    MPI_Comm node;
    int local = 0;
    if (MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node) !=
        MPI_SUCCESS)
        return 0;
    MPI_Comm_rank(node, &local);
    MPI_Comm_free(&node);
    return local;
}

/* Rank 0: reads a .npy input of the expected rank. */
static int read_input(const char *name, const char *path, int rank, ring_tensor *x)
{
    npy_array a;
    char err[512];
    npy_status ns = npy_read_f32(path, &a, err, sizeof err);
    if (ns != NPY_OK) {
        fprintf(stderr, "attnjit: %s: %s\n", name, err);
        return ns == NPY_ERR_OUT_OF_MEMORY ? CLI_EXIT_INTERNAL : CLI_EXIT_INPUT;
    }
    if (a.rank != rank) {
        fprintf(stderr, "attnjit: %s: %s has %d dimensions, want %d (%s)\n", name, path,
                a.rank, rank, rank == 4 ? "B, H, S, D" : rank == 3 ? "T, H, D" : "H");
        npy_free(&a);
        return CLI_EXIT_INPUT;
    }
    x->rank = rank;
    memcpy(x->shape, a.shape, (size_t)rank * sizeof a.shape[0]);
    x->full = a.f32;   /* taken over: freed with free() as npy_free would */
    return CLI_EXIT_OK;
}

/* The worst exit code over the ranks: every rank leaves together. */
static int agree(int rc)
{
    int worst = rc;
    MPI_Allreduce(&rc, &worst, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
    return worst;
}

/* The elements of rank r's shard, and the most any rank's has. */
static size_t shard_count(const ring_opts *o, const ring_tensor *x, int r, int size)
{
    int64_t shape[4];
    shard_shape(o, x, r, size, shape);
    return count_of(x->rank, shape);
}

static size_t largest_shard(const ring_opts *o, const ring_tensor *x, int size)
{
    size_t most = 0;
    for (int r = 0; r < size; r++) {
        size_t n = shard_count(o, x, r, size);
        most = n > most ? n : most;
    }
    return most;
}

/* Rank 0 sends each rank its shard of x->full; the others receive. */
static int scatter(aj_ctx *ctx, const ring_opts *o, ring_tensor *x, int me, int size)
{
    const aj_seq_shape s = seq_shape_of(o, x);
    const size_t n = count_of(x->rank, x->t.shape);
    if (x->rank == 1) {   /* alibi slopes: every rank the whole thing */
        if (me == 0)
            memcpy(x->shard, x->full, n * sizeof(float));
        MPI_Bcast(x->shard, (int)n, MPI_FLOAT, 0, MPI_COMM_WORLD);
    } else if (me == 0) {
        float *tmp = alloc64(largest_shard(o, x, size) * sizeof(float));
        aj_status st = tmp ? AJ_OK : AJ_ERR_OUT_OF_MEMORY;
        for (int r = size - 1; r >= 0 && st == AJ_OK; r--) {
            st = o->batch ? aj_shard_varlen(ctx, o->method, o->layout, r, size,
                                            o->cu[x->keys], o->batch, &s, x->full,
                                            r ? tmp : x->shard)
                          : aj_shard(ctx, o->layout, r, size, &s, x->full, r ? tmp : x->shard);
            if (st == AJ_OK && r)
                MPI_Send(tmp, (int)shard_count(o, x, r, size), MPI_FLOAT, r, 0,
                         MPI_COMM_WORLD);
        }
        free(tmp);
        if (st != AJ_OK)
            return cli_report(ctx, st);
    } else {
        MPI_Recv(x->shard, (int)n, MPI_FLOAT, 0, 0, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
    }
    aj_convert(x->shard, AJ_DTYPE_F32, x->typed, x->t.dtype, n);
    return CLI_EXIT_OK;
}

/* The reverse: every rank's result into rank 0's x->full. */
static int gather(aj_ctx *ctx, const ring_opts *o, ring_tensor *x, int me, int size)
{
    const aj_seq_shape s = seq_shape_of(o, x);
    const size_t n = count_of(x->rank, x->t.shape);
    aj_convert(x->typed, x->t.dtype, x->shard, AJ_DTYPE_F32, n);
    if (me != 0) {
        MPI_Send(x->shard, (int)n, MPI_FLOAT, 0, 1, MPI_COMM_WORLD);
        return CLI_EXIT_OK;
    }
    x->full = alloc64(count_of(x->rank, x->shape) * sizeof(float));
    float *tmp = alloc64(largest_shard(o, x, size) * sizeof(float));
    if (!x->full || !tmp) {
        free(tmp);
        fprintf(stderr, "attnjit: out of memory gathering a result\n");
        return CLI_EXIT_INTERNAL;
    }
    aj_status st = AJ_OK;
    for (int r = 0; r < size && st == AJ_OK; r++) {
        if (r)
            MPI_Recv(tmp, (int)shard_count(o, x, r, size), MPI_FLOAT, r, 1, MPI_COMM_WORLD,
                     MPI_STATUS_IGNORE);
        st = o->batch ? aj_unshard_varlen(ctx, o->method, o->layout, r, size, o->cu[x->keys],
                                          o->batch, &s, r ? tmp : x->shard, x->full)
                      : aj_unshard(ctx, o->layout, r, size, &s, r ? tmp : x->shard, x->full);
    }
    free(tmp);
    return st == AJ_OK ? CLI_EXIT_OK : cli_report(ctx, st);
}

/* ---------------------------------------------------------------- check */

/* The backward op of a forward op: its canonical text with the header
 * `attention backward efficient` and the default schedule (the forward's
 * tiles need not suit the backward), so every field -- expressions and
 * side tensors included -- carries over. */
static aj_status backward_of(aj_ctx *ctx, const aj_op *fop, aj_op **out)
{
    char *text = NULL;
    aj_status st = aj_op_print(fop, &text);
    if (st != AJ_OK)
        return st;
    const char *body = strchr(text, '{');
    size_t len = strlen(text) + 64;
    char *bwd = malloc(len);
    if (!bwd || !body) {
        free(bwd);
        aj_free(text);
        return AJ_ERR_OUT_OF_MEMORY;
    }
    int n = snprintf(bwd, len, "attention backward efficient ");
    for (const char *line = body; *line;) {
        const char *end = strchr(line, '\n');
        size_t l = end ? (size_t)(end - line + 1) : strlen(line);
        if (strncmp(line, "  schedule = ", 13) != 0) {
            memcpy(bwd + n, line, l);
            n += (int)l;
        }
        line += l;
    }
    bwd[n] = '\0';
    st = aj_op_parse(ctx, bwd, (size_t)n, "backward of the spec", out);
    free(bwd);
    aj_free(text);
    return st;
}

/* A contiguous full-size tensor of `dtype` over new memory, from f32. */
static aj_tensor full_typed(const ring_tensor *x, const float *src, aj_dtype dtype)
{
    const size_t n = count_of(x->rank, x->shape);
    aj_tensor t = {.data = alloc64(n * (dtype == AJ_DTYPE_F32 ? 4 : 2)), .dtype = dtype,
                   .rank = x->rank};
    int64_t stride = 1;
    for (int i = x->rank - 1; i >= 0; i--) {
        t.shape[i] = x->shape[i];
        t.strides[i] = stride;
        stride *= x->shape[i];
    }
    if (src && t.data)
        aj_convert(src, AJ_DTYPE_F32, t.data, dtype, n);
    return t;
}

/* max |ring - single| / (atol + rtol |single|); -inf LSE must match. */
static double mismatch(const aj_tensor *single, const float *ring, size_t n, double atol,
                       double rtol)
{
    float *s = malloc((n ? n : 1) * sizeof *s);
    aj_convert(single->data, single->dtype, s, AJ_DTYPE_F32, n);
    double worst = 0;
    for (size_t i = 0; i < n; i++) {
        double e;
        if (isinf(s[i]) || isinf(ring[i]))
            e = s[i] == ring[i] ? 0 : INFINITY;
        else
            e = fabs((double)ring[i] - s[i]) / (atol + rtol * fabs(s[i]));
        if (!(e <= worst))
            worst = isnan(e) ? INFINITY : e;
    }
    free(s);
    return worst;
}

/* layout = varlen: the documents of launch l (aj_fwd_args or aj_bwd_args):
 * the offsets cu_dev in device memory, the longest document's lengths. */
#define SET_DOCS(l, o, cu_dev, longest)        \
    do {                                       \
        if ((o)->batch) {                      \
            (l).cu_seqlens_q = (cu_dev)[0];    \
            (l).cu_seqlens_k = (cu_dev)[1];    \
            (l).batch = (o)->batch;            \
            (l).max_seqlen_q = (longest)[0];   \
            (l).max_seqlen_k = (longest)[1];   \
        }                                      \
    } while (0)

static void longest_docs(const ring_opts *o, int32_t longest[2]);
static aj_status launch_single(aj_ctx *ctx, aj_device *dev, const aj_kernel *fk,
                               const aj_kernel *bk, const aj_tensor *t, const aj_tensor *r,
                               const ring_opts *o, void *const cu_dev[2],
                               const aj_side_tensor *side, int num_side);
static int compare_single(aj_dtype dtype, const aj_tensor *r, const ring_tensor *out, int grad);

/* Rank 0: the op on the full tensors, on one device, against the ring's
 * gathered results. */
static int check_single_rank(aj_ctx *ctx, aj_device *dev, const aj_op *fop,
                             const aj_op *bop, const aj_op_info *info, ring_tensor *in,
                             ring_tensor *out, const ring_opts *o, void *const cu_dev[2],
                             const aj_side_tensor *side, int num_side)
{
    const int grad = o->grad;
    aj_compile_options opt = AJ_COMPILE_OPTIONS_INIT;
    opt.target = aj_device_target(dev);
    aj_kernel *fk = NULL, *bk = NULL;
    aj_tensor t[R_IN_COUNT] = {{0}}, r[R_OUT_COUNT] = {{0}};
    aj_status st = aj_compile(ctx, fop, &opt, &fk);
    if (st == AJ_OK && grad)
        st = aj_compile(ctx, bop, &opt, &bk);
    /* host copies (h) and the device's (t, r), as the launches take them */
    void *th[R_IN_COUNT] = {NULL}, *rh[R_OUT_COUNT] = {NULL};
    for (int i = 0; i < R_IN_COUNT; i++)
        if (in[i].full)
            t[i] = full_typed(&in[i], in[i].full, i == R_ALIBI ? AJ_DTYPE_F32 : info->dtype);
    r[R_O] = full_typed(&out[R_O], NULL, info->dtype);
    r[R_LSE] = full_typed(&out[R_LSE], NULL, AJ_DTYPE_F32);
    if (grad)
        for (int i = R_DQ; i <= R_DV; i++)
            r[i] = full_typed(&out[i], NULL, info->dtype);
    for (int i = 0; i < R_IN_COUNT && st == AJ_OK; i++)
        if ((th[i] = t[i].data))
            st = upload(dev, th[i], count_of(in[i].rank, in[i].shape) * elem_of(t[i].dtype),
                        &t[i].data);
    for (int i = 0; i < R_OUT_COUNT && st == AJ_OK; i++)
        if ((rh[i] = r[i].data))
            st = upload(dev, NULL, count_of(out[i].rank, out[i].shape) * elem_of(r[i].dtype),
                        &r[i].data);
    if (st == AJ_OK)
        st = launch_single(ctx, dev, fk, bk, t, r, o, cu_dev, side, num_side);
    for (int i = 0; i < R_OUT_COUNT && st == AJ_OK; i++)
        if (rh[i])
            st = aj_device_copy_from(dev, rh[i], r[i].data,
                                     count_of(out[i].rank, out[i].shape) * elem_of(r[i].dtype));
    for (int i = 0; i < R_OUT_COUNT; i++)   /* the host copies, compared below */
        if (rh[i]) {
            if (r[i].data != rh[i])
                aj_device_free(dev, r[i].data);
            r[i].data = rh[i];
        }
    const int rc = st == AJ_OK ? compare_single(info->dtype, r, out, grad) : cli_report(ctx, st);
    for (int i = 0; i < R_IN_COUNT; i++) {
        if (th[i] && t[i].data != th[i])
            aj_device_free(dev, t[i].data);
        free(th[i]);
    }
    for (int i = 0; i < R_OUT_COUNT; i++)
        free(r[i].data);
    aj_kernel_destroy(fk);
    aj_kernel_destroy(bk);
    return rc;
}

/* layout = varlen: the longest document's lengths, queries and keys. */
static void longest_docs(const ring_opts *o, int32_t longest[2])
{
    longest[0] = longest[1] = 0;
    for (int i = 0; i < 2 && o->batch; i++)
        for (int32_t b = 0; b < o->batch; b++)
            if (o->cu[i][b + 1] - o->cu[i][b] > longest[i])
                longest[i] = o->cu[i][b + 1] - o->cu[i][b];
}

/* The single-rank forward (and with --grad the backward) on the device's
 * tensors: inputs t, outputs r. */
static aj_status launch_single(aj_ctx *ctx, aj_device *dev, const aj_kernel *fk,
                               const aj_kernel *bk, const aj_tensor *t, const aj_tensor *r,
                               const ring_opts *o, void *const cu_dev[2],
                               const aj_side_tensor *side, int num_side)
{
    int32_t longest[2];
    longest_docs(o, longest);
    aj_fwd_args a = {.struct_size = sizeof a, .q = t[R_Q], .k = t[R_K], .v = t[R_V],
                     .o = r[R_O], .lse = r[R_LSE], .alibi_slopes = t[R_ALIBI], .seed = o->seed,
                     .offset = o->offset, .side = side, .num_side = num_side};
    SET_DOCS(a, o, cu_dev, longest);
    aj_status st = aj_forward(ctx, dev, fk, &a);
    if (st != AJ_OK || !o->grad)
        return st;
    aj_bwd_args b = {.struct_size = sizeof b, .q = t[R_Q], .k = t[R_K], .v = t[R_V],
                     .o = r[R_O], .lse = r[R_LSE], .do_ = t[R_DO], .dq = r[R_DQ], .dk = r[R_DK],
                     .dv = r[R_DV], .alibi_slopes = t[R_ALIBI], .seed = o->seed,
                     .offset = o->offset, .side = side, .num_side = num_side};
    SET_DOCS(b, o, cu_dev, longest);
    return aj_backward(ctx, dev, bk, &b);
}

/* Prints how far the ring's results (out) are from the single rank's
 * (r), in units of the tolerance; CLI_EXIT_INPUT if beyond it. */
static int compare_single(aj_dtype dtype, const aj_tensor *r, const ring_tensor *out, int grad)
{
    /* both sides round to the dtype; the ring adds f32 partial merges */
    const double atol = dtype == AJ_DTYPE_F32 ? 1e-5 : dtype == AJ_DTYPE_F16 ? 2e-3 : 1.6e-2;
    const double rtol = dtype == AJ_DTYPE_F32 ? 1e-4 : dtype == AJ_DTYPE_F16 ? 4e-3 : 3e-2;
    int rc = CLI_EXIT_OK;
    printf("single-rank check (|ring - single| <= %g + %g |single|):", atol, rtol);
    for (int i = 0; i < (grad ? R_OUT_COUNT : R_DQ); i++) {
        double e = mismatch(&r[i], out[i].full, count_of(out[i].rank, out[i].shape), atol, rtol);
        printf(" %s %.3g", out_names[i], e);
        if (!(e <= 1.0))
            rc = CLI_EXIT_INPUT;
    }
    printf(" of the tolerance: %s\n", rc == CLI_EXIT_OK ? "match" : "MISMATCH");
    return rc;
}

/* ---------------------------------------------------------------- report */

/* Rank 0 prints every rank's timings: compile, compute, comm, exposed
 * comm and the share of comm hidden behind compute (overlap = 1 - exposed
 * / comm).  A first call's comm includes waiting for peers still
 * compiling. */
static void print_stats(const char *dir, const aj_ring_stats *s, int me, int size)
{
    double mine[8] = {s->compute_s, s->comm_s, s->exposed_comm_s, s->total_s,
                      (double)s->rotations, (double)s->launches, (double)s->skipped_blocks,
                      s->compile_s};
    double *all = me == 0 ? malloc(sizeof mine * (size_t)size) : NULL;
    MPI_Gather(mine, 8, MPI_DOUBLE, all, 8, MPI_DOUBLE, 0, MPI_COMM_WORLD);
    if (me != 0)
        return;
    printf("%-8s %4s %10s %10s %10s %10s %10s %9s %8s %7s %7s\n", dir, "rank", "compile ms",
           "compute ms", "comm ms", "exposed ms", "total ms", "rotations", "launches",
           "skipped", "overlap");
    for (int r = 0; r < size; r++) {
        const double *x = all + 8 * r;
        char overlap[16] = "-";
        if (x[1] > 0)
            snprintf(overlap, sizeof overlap, "%.0f%%", 100.0 * (1.0 - x[2] / x[1]));
        printf("%-8s %4d %10.1f %10.1f %10.1f %10.1f %10.1f %9.0f %8.0f %7.0f %7s\n", "", r,
               1e3 * x[7], 1e3 * x[0], 1e3 * x[1], 1e3 * x[2], 1e3 * x[3], x[4], x[5], x[6],
               overlap);
    }
    free(all);
}

/* Rank 0 prints each rank's launches' tiles (aj_ring_fwd_args.launch_tiles),
 * as `attnjit run -v` prints its launch's. */
static void print_tiles(const aj_tile_counts *tiles, int cap, int launches, int me, int size)
{
    enum { PER = 5 };   /* skipped, partial, full, block_m, block_n */
    int64_t *mine = calloc((size_t)cap * PER + 1, sizeof *mine);
    int64_t *all = me == 0 ? calloc((size_t)(cap * PER + 1) * (size_t)size, sizeof *all) : NULL;
    if (!mine || (me == 0 && !all)) {
        free(mine);
        free(all);
        return;
    }
    mine[0] = launches < cap ? launches : cap;
    for (int i = 0; tiles && i < mine[0]; i++) {
        const int64_t row[PER] = {tiles[i].tiles[AJ_TILE_SKIP], tiles[i].tiles[AJ_TILE_PARTIAL],
                                  tiles[i].tiles[AJ_TILE_FULL], tiles[i].block_m,
                                  tiles[i].block_n};
        memcpy(mine + 1 + PER * i, row, sizeof row);
    }
    MPI_Gather(mine, cap * PER + 1, MPI_INT64_T, all, cap * PER + 1, MPI_INT64_T, 0,
               MPI_COMM_WORLD);
    for (int r = 0; me == 0 && r < size; r++) {
        const int64_t *x = all + (size_t)(cap * PER + 1) * (size_t)r;
        for (int i = 0; i < x[0]; i++) {
            const int64_t *t = x + 1 + PER * i;
            printf("rank %d launch %d: tiles of %lld x %lld: %lld skipped, %lld partial, "
                   "%lld full\n", r, i, (long long)t[3], (long long)t[4], (long long)t[0],
                   (long long)t[1], (long long)t[2]);
        }
    }
    free(mine);
    free(all);
}

/* Rank 0's side tensors to every rank: whole, not sharded (the kernels
 * read them at global positions). */
static int broadcast_side(const aj_op_info *info, cli_side_buffers *side, int me)
{
    for (int d = 0; d < info->num_tensors; d++) {
        int64_t shape[4] = {0};
        if (me == 0)
            memcpy(shape, side->t[d].shape, sizeof shape);
        MPI_Bcast(shape, 4, MPI_INT64_T, 0, MPI_COMM_WORLD);
        if (me != 0) {
            size_t n = (size_t)aj_side_dtype_bytes(info->tensors[d].dtype);
            for (int k = 0; k < info->tensors[d].rank; k++)
                n *= (size_t)shape[k];
            void *data = malloc(n ? n : 4);
            if (!data) {
                fprintf(stderr, "attnjit: out of memory for side tensor %s\n",
                        info->tensors[d].name);
                return CLI_EXIT_INTERNAL;
            }
            cli_side_set(side, &info->tensors[d], shape, data);
        }
        MPI_Bcast(side->mem[d], (int)cli_side_bytes(&side->t[d]), MPI_BYTE, 0, MPI_COMM_WORLD);
    }
    return CLI_EXIT_OK;
}

/* layout = varlen: rank 0 reads cu_seqlens_q and _k (int32, batch + 1
 * each), every rank gets them and the ranks' shard lengths (collective). */
static int read_docs(aj_ctx *ctx, ring_opts *o, int me, int size)
{
    int64_t n[2] = {0, 0};
    int rc = CLI_EXIT_OK;
    npy_array a[2];
    memset(a, 0, sizeof a);
    for (int i = 0; i < 2 && me == 0 && rc == CLI_EXIT_OK; i++) {
        char err[512];
        if (npy_read_i32(o->cu_path[i], &a[i], err, sizeof err) != NPY_OK) {
            fprintf(stderr, "attnjit: %s: %s\n", cu_names[i], err);
            rc = CLI_EXIT_INPUT;
        } else if (a[i].rank != 1 || a[i].shape[0] < 2) {
            fprintf(stderr, "attnjit: %s: %s has shape of rank %d; want (batch + 1) offsets, "
                    "at least 2\n", cu_names[i], o->cu_path[i], a[i].rank);
            rc = CLI_EXIT_INPUT;
        } else {
            n[i] = a[i].shape[0];
        }
    }
    if (rc == CLI_EXIT_OK && me == 0 && n[0] != n[1]) {
        fprintf(stderr, "attnjit: cu_seqlens_q has %lld offsets and cu_seqlens_k %lld; want "
                "one per document and one more, alike\n", (long long)n[0], (long long)n[1]);
        rc = CLI_EXIT_INPUT;
    }
    rc = agree(rc);
    MPI_Bcast(n, 2, MPI_INT64_T, 0, MPI_COMM_WORLD);
    for (int i = 0; i < 2 && rc == CLI_EXIT_OK; i++) {
        o->cu[i] = me == 0 ? a[i].i32 : malloc((size_t)n[i] * sizeof(int32_t));
        a[i].i32 = NULL;
        o->varlen_len[i] = calloc((size_t)size, sizeof(int64_t));
        if (!o->cu[i] || !o->varlen_len[i]) {
            rc = CLI_EXIT_INTERNAL;
            break;
        }
        MPI_Bcast(o->cu[i], (int)n[i], MPI_INT32_T, 0, MPI_COMM_WORLD);
        o->batch = (int32_t)(n[i] - 1);
        for (int r = 0; r < size && rc == CLI_EXIT_OK; r++) {
            int32_t count = 0;
            aj_status st = aj_shard_varlen_chunks(ctx, o->method, o->layout, r, size, o->cu[i],
                                                  o->batch, NULL, 0, &count,
                                                  &o->varlen_len[i][r]);
            if (st != AJ_OK)
                rc = cli_report(ctx, st);
        }
    }
    for (int i = 0; i < 2; i++)
        npy_free(&a[i]);
    return agree(rc);
}

/* ---------------------------------------------------------------- command */

/* One `attnjit ring` call on this rank: its options, the ops, the device
 * and communicator, the tensors and what the ring reported. */
typedef struct ring_run {
    ring_opts o;
    int me, size;
    aj_op *fop, *bop;            /* the forward op, and its backward (--grad) */
    aj_op_info info;
    aj_device_kind kind;
    aj_device *dev;
    aj_comm *comm;
    ring_tensor in[R_IN_COUNT], out[R_OUT_COUNT];
    int varlen;
    cli_side_buffers side;
    aj_side_tensor side_dev[AJ_OP_TENSORS_MAX];
    aj_tile_counts *tiles;       /* -v: each forward launch's tiles */
    int tiles_cap;
    void *cu_dev[2];             /* layout = varlen: the offsets, device memory */
    aj_ring_stats fs, bs;
} ring_run;

/* The outputs this call computes: o and lse, and the gradients with --grad. */
static int outputs(const ring_run *r)
{
    return r->o.grad ? R_OUT_COUNT : R_DQ;
}

/* The op and its backward, the device kind, the option checks; rank 0
 * reads the inputs and side tensors, which every rank then gets. */
static int load_inputs(aj_ctx *ctx, ring_run *r)
{
    const ring_opts *o = &r->o;
    int rc = cli_load_op(ctx, o->spec, &r->fop);
    if (rc == CLI_EXIT_OK)
        aj_op_get_info(r->fop, &r->info);
    if (rc == CLI_EXIT_OK && o->grad) {
        aj_status st = backward_of(ctx, r->fop, &r->bop);
        if (st != AJ_OK)
            rc = cli_report(ctx, st);
    }
    if (rc == CLI_EXIT_OK)
        rc = cli_device_kind(o->device, &r->kind);
    if (rc == CLI_EXIT_OK &&
        (r->info.score_mod == AJ_SCORE_MOD_ALIBI && r->info.alibi_tensor < 0) !=
            (o->in[R_ALIBI] != NULL))
        rc = cli_usage("%s", o->in[R_ALIBI] ? "--in alibi_slopes given, but the op has no alibi"
                                            : "the op uses alibi: give --in alibi_slopes=FILE");
    if (rc == CLI_EXIT_OK)
        rc = cli_side_check(&r->info, &o->side, "ring", in_names, R_IN_COUNT);
    r->varlen = r->info.layout == AJ_LAYOUT_VARLEN;
    if (rc == CLI_EXIT_OK && r->varlen != (o->cu_path[0] && o->cu_path[1]))
        rc = cli_usage("%s", r->varlen ? "a layout = varlen op needs --in cu_seqlens_q=FILE "
                                         "and --in cu_seqlens_k=FILE"
                                       : "--in cu_seqlens_q/_k given, but the op is not "
                                         "layout = varlen");
    if ((rc = agree(rc)) != CLI_EXIT_OK)
        return rc;
    if (r->varlen && (rc = read_docs(ctx, &r->o, r->me, r->size)) != CLI_EXIT_OK)
        return rc;
    if (r->me == 0)
        for (int t = 0; t < R_IN_COUNT && rc == CLI_EXIT_OK; t++)
            if (o->in[t])
                rc = read_input(in_names[t], o->in[t], t == R_ALIBI ? 1 : r->varlen ? 3 : 4,
                                &r->in[t]);
    if (rc == CLI_EXIT_OK && r->me == 0)
        rc = cli_side_load(&r->info, &o->side, &r->side);
    if ((rc = agree(rc)) != CLI_EXIT_OK)
        return rc;
    return agree(broadcast_side(&r->info, &r->side, r->me));
}

/* Every rank learns the inputs' shapes from rank 0, sizes the outputs,
 * and gets its shards. */
static int shard_inputs(aj_ctx *ctx, ring_run *r)
{
    ring_tensor *in = r->in, *out = r->out;
    int64_t shapes[R_IN_COUNT][5];
    for (int t = 0; t < R_IN_COUNT; t++) {
        shapes[t][0] = in[t].rank;
        memcpy(&shapes[t][1], in[t].shape, sizeof in[t].shape);
    }
    MPI_Bcast(shapes, (int)(sizeof shapes / sizeof(int64_t)), MPI_INT64_T, 0, MPI_COMM_WORLD);
    for (int t = 0; t < R_IN_COUNT; t++) {
        in[t].rank = (int)shapes[t][0];
        memcpy(in[t].shape, &shapes[t][1], sizeof in[t].shape);
    }
    const int64_t *q = in[R_Q].shape, *k = in[R_K].shape, *v = in[R_V].shape;
    if (r->varlen) {   /* THD, LSE (H, T) */
        out[R_O] = (ring_tensor){.rank = 3, .shape = {q[0], q[1], v[2]}};
        out[R_LSE] = (ring_tensor){.rank = 2, .shape = {q[1], q[0]}};
    } else {
        out[R_O] = (ring_tensor){.rank = 4, .shape = {q[0], q[1], q[2], v[3]}};
        out[R_LSE] = (ring_tensor){.rank = 3, .shape = {q[0], q[1], q[2]}};
    }
    out[R_DQ] = (ring_tensor){.rank = in[R_Q].rank, .shape = {q[0], q[1], q[2], q[3]}};
    out[R_DK] = (ring_tensor){.rank = in[R_K].rank, .shape = {k[0], k[1], k[2], k[3]},
                              .keys = 1};
    out[R_DV] = (ring_tensor){.rank = in[R_V].rank, .shape = {v[0], v[1], v[2], v[3]},
                              .keys = 1};
    in[R_K].keys = in[R_V].keys = 1;
    const ring_opts *o = &r->o;
    if (r->varlen && (q[0] != o->cu[0][o->batch] || k[0] != o->cu[1][o->batch])) {
        if (r->me == 0)
            fprintf(stderr, "attnjit: q has %lld positions and k %lld; cu_seqlens_q and "
                    "cu_seqlens_k end at %d and %d\n", (long long)q[0], (long long)k[0],
                    (int)o->cu[0][o->batch], (int)o->cu[1][o->batch]);
        return CLI_EXIT_INPUT;
    }
    int rc = CLI_EXIT_OK;
    for (int t = 0; t < R_IN_COUNT && rc == CLI_EXIT_OK; t++)
        if (in[t].rank)
            rc = alloc_shard(o, &in[t], t == R_ALIBI ? AJ_DTYPE_F32 : r->info.dtype, r->me,
                             r->size);
    for (int t = 0; t < outputs(r) && rc == CLI_EXIT_OK; t++)
        rc = alloc_shard(o, &out[t], t == R_LSE ? AJ_DTYPE_F32 : r->info.dtype, r->me, r->size);
    for (int t = 0; t < R_IN_COUNT && rc == CLI_EXIT_OK; t++)
        if (in[t].rank)
            rc = scatter(ctx, o, &in[t], r->me, r->size);
    return agree(rc);
}

/* The device (the node-local one for indexed kinds), the shards and side
 * tensors on it, the communicator, and -v's tile counts. */
static aj_status open_device(aj_ctx *ctx, ring_run *r)
{
    const ring_opts *o = &r->o;
    aj_device_caps kind_caps = AJ_DEVICE_CAPS_INIT;
    aj_device_kind_caps(r->kind, &kind_caps);
    const int index = o->device_index >= 0 ? o->device_index
                      : kind_caps.indexed ? node_local_rank() : 0;
    aj_status st = aj_device_open(ctx, r->kind, index, &r->dev);
    if (st == AJ_OK)
        st = aj_device_set_workers(r->dev, o->workers);
    for (int t = 0; t < R_IN_COUNT && st == AJ_OK; t++)
        if (r->in[t].rank)
            st = shard_to_device(r->dev, &r->in[t], 1);
    for (int t = 0; t < outputs(r) && st == AJ_OK; t++)
        st = shard_to_device(r->dev, &r->out[t], 0);
    aj_comm_config cc = AJ_COMM_CONFIG_INIT;
    cc.timeout_s = o->timeout_s;
    cc.kind = o->comm;
    if (st == AJ_OK)
        st = aj_comm_create(ctx, r->dev, &cc, &r->comm);
    if (st == AJ_OK)
        st = cli_side_to_device(r->dev, &r->side, r->side_dev);
    for (int i = 0; i < 2 && st == AJ_OK && r->varlen; i++)
        st = upload(r->dev, o->cu[i], ((size_t)o->batch + 1) * sizeof(int32_t), &r->cu_dev[i]);
    /* a rank launches at most its 2 query chunks against 2 key chunks of
     * every rank */
    r->tiles_cap = 4 * r->size;
    if (st == AJ_OK && o->verbose &&
        !(r->tiles = calloc((size_t)r->tiles_cap, sizeof *r->tiles)))
        st = AJ_ERR_OUT_OF_MEMORY;
    return st;
}

/* The ring forward, then (--grad) the backward, on every rank. */
static aj_status run_ring(aj_ctx *ctx, ring_run *r)
{
    const ring_opts *o = &r->o;
    aj_ring_fwd_args a = AJ_RING_FWD_ARGS_INIT;
    a.side = r->side_dev;
    a.num_side = r->side.n;
    a.launch_tiles = r->tiles;
    a.launch_tiles_cap = r->tiles ? r->tiles_cap : 0;
    a.q = r->in[R_Q].t;
    a.k = r->in[R_K].t;
    a.v = r->in[R_V].t;
    a.o = r->out[R_O].t;
    a.lse = r->out[R_LSE].t;
    a.alibi_slopes = r->in[R_ALIBI].t;
    a.layout = o->layout;
    a.rotate = o->rotate;
    a.method = o->method;
    a.ulysses_size = o->ulysses_size;
    a.seed = o->seed;
    a.offset = o->offset;
    a.cu_seqlens_q = r->cu_dev[0];
    a.cu_seqlens_k = r->cu_dev[1];
    a.batch = o->batch;
    aj_status st = aj_ring_forward(ctx, r->dev, r->comm, r->fop, &a, &r->fs);
    if (st != AJ_OK || !o->grad)
        return st;
    aj_ring_bwd_args b = AJ_RING_BWD_ARGS_INIT;
    b.side = r->side_dev;
    b.num_side = r->side.n;
    b.q = a.q;
    b.k = a.k;
    b.v = a.v;
    b.o = a.o;
    b.lse = a.lse;
    b.do_ = r->in[R_DO].t;
    b.dq = r->out[R_DQ].t;
    b.dk = r->out[R_DK].t;
    b.dv = r->out[R_DV].t;
    b.alibi_slopes = a.alibi_slopes;
    b.layout = a.layout;
    b.rotate = a.rotate;
    b.method = a.method;
    b.ulysses_size = a.ulysses_size;
    b.seed = a.seed;
    b.offset = a.offset;
    b.cu_seqlens_q = a.cu_seqlens_q;
    b.cu_seqlens_k = a.cu_seqlens_k;
    b.batch = a.batch;
    return aj_ring_backward(ctx, r->dev, r->comm, r->bop, &b, &r->bs);
}

/* Rank 0's header line: ranks, method, layout, transport, passes, device. */
static void print_header(const ring_run *r)
{
    const ring_opts *o = &r->o;
    char method[48] = "";
    if (o->method == AJ_METHOD_ULYSSES)
        snprintf(method, sizeof method, "ulysses, ");
    else if (o->method == AJ_METHOD_HYBRID)
        snprintf(method, sizeof method, "hybrid (%d groups of %d), ", r->size /
                 (o->ulysses_size ? o->ulysses_size : 1), o->ulysses_size);
    printf("ring: %d ranks, %s%s, %s, %s, on %s over %s\n", r->size, method,
           o->layout == AJ_SHARD_ZIGZAG ? "zigzag" : "contiguous",
           o->method == AJ_METHOD_ULYSSES  ? "all-to-all"
           : o->method == AJ_METHOD_HYBRID ? (o->rotate == AJ_ROTATE_P2P
                                                  ? "all-to-all + p2p"
                                                  : "all-to-all + all-gather")
           : o->rotate == AJ_ROTATE_P2P    ? "p2p"
                                           : "all-gather",
           o->grad ? "forward + backward" : "forward", aj_device_name(r->dev),
           o->comm == AJ_COMM_NCCL ? "NCCL" : "MPI");
}

/* The results gathered to rank 0, the timing tables, the outputs written
 * and (--check) compared with rank 0 alone. */
static int report(aj_ctx *ctx, ring_run *r)
{
    const ring_opts *o = &r->o;
    int rc = CLI_EXIT_OK;
    for (int t = 0; t < outputs(r) && rc == CLI_EXIT_OK; t++)
        rc = gather(ctx, o, &r->out[t], r->me, r->size);
    if (r->me == 0)
        print_header(r);
    print_stats("forward", &r->fs, r->me, r->size);
    if (o->verbose)
        print_tiles(r->tiles, r->tiles_cap, r->fs.launches, r->me, r->size);
    if (o->grad)
        print_stats("backward", &r->bs, r->me, r->size);
    if (r->me == 0) {
        for (int t = 0; t < R_OUT_COUNT && rc == CLI_EXIT_OK; t++) {
            if (!o->out[t])
                continue;
            char err[512];
            if (npy_write_f32(o->out[t], r->out[t].full, r->out[t].rank, r->out[t].shape, err,
                              sizeof err) != NPY_OK) {
                fprintf(stderr, "attnjit: %s: %s\n", out_names[t], err);
                rc = CLI_EXIT_INPUT;
            }
        }
        if (rc == CLI_EXIT_OK && o->check)
            rc = check_single_rank(ctx, r->dev, r->fop, r->bop, &r->info, r->in, r->out, o,
                                   r->cu_dev, r->side_dev, r->side.n);
    }
    return agree(rc);
}

static void free_run(ring_run *r)
{
    aj_comm_destroy(r->comm);
    cli_side_free(r->dev, &r->side, r->side_dev);
    free(r->tiles);
    for (int i = 0; i < 2; i++) {
        if (r->cu_dev[i])
            aj_device_free(r->dev, r->cu_dev[i]);
        free(r->o.cu[i]);
        free(r->o.varlen_len[i]);
    }
    for (int t = 0; t < R_IN_COUNT; t++)
        free_tensor(r->dev, &r->in[t]);
    for (int t = 0; t < R_OUT_COUNT; t++)
        free_tensor(r->dev, &r->out[t]);
    aj_device_close(r->dev);
    aj_op_destroy(r->fop);
    aj_op_destroy(r->bop);
}

int cli_ring(aj_ctx *ctx, int argc, char **argv)
{
    ring_run *r = calloc(1, sizeof *r);   /* large for a stack */
    if (!r) {
        fprintf(stderr, "attnjit: out of memory\n");
        return CLI_EXIT_INTERNAL;
    }
    int rc = parse_ring_args(argc, argv, &r->o);
    if (rc != CLI_EXIT_OK) {
        free(r);
        return rc;
    }
    int initialized = 0;
    MPI_Initialized(&initialized);
    if (!initialized)
        MPI_Init(NULL, NULL);
    MPI_Comm_rank(MPI_COMM_WORLD, &r->me);
    MPI_Comm_size(MPI_COMM_WORLD, &r->size);

    rc = load_inputs(ctx, r);
    if (rc == CLI_EXIT_OK)
        rc = shard_inputs(ctx, r);
    if (rc == CLI_EXIT_OK) {
        aj_status st = open_device(ctx, r);
        if (st == AJ_OK)
            st = run_ring(ctx, r);
        if (st != AJ_OK) {
            fprintf(stderr, "attnjit: rank %d of %d: ", r->me, r->size);
            rc = cli_report(ctx, st);
        }
        for (int t = 0; t < outputs(r) && rc == CLI_EXIT_OK; t++)
            if ((st = shard_from_device(r->dev, &r->out[t])) != AJ_OK)
                rc = cli_report(ctx, st);
        rc = agree(rc);
    }
    if (rc == CLI_EXIT_OK)
        rc = report(ctx, r);
    free_run(r);
    free(r);
    if (!initialized)
        MPI_Finalize();
    return rc;
}
