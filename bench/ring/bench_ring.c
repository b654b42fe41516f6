/*
 * bench_ring.c -- how much of the ring's communication hides behind its
 * compute.
 *
 *   mpirun -np P bench_ring [--len L[,L...]] [--heads H] [--dim D]
 *                           [--tflops T[,T...]] [--workers N] [--device cpu|sim]
 *                           [--method ring|ulysses|hybrid|both|all]
 *                           [--ulysses-size U] [--direction forward|backward|both]
 *
 * Part 1, measured on this machine's CPU ranks: a ring forward (p2p)
 * and, with --direction backward (or both), a ring backward, per
 * per-rank length L, no mask (contiguous) and causal (zigzag), each run
 * once to warm the kernel cache and then timed.  Per case, the slowest
 * rank's ring time against its compute-only time (the kernels' own time),
 * the time the same K/V exchanges take alone (nothing to compute), the
 * exposed part of the ring's comm (waiting with nothing to compute, which
 * also counts waiting for a slower peer) and the hidden share
 * 1 - exposed / transfer (0 when the ring waited longer than the
 * transfer takes alone).  With --method ulysses (or both) the same cases
 * run as Ulysses (H must divide by P): its time against its compute-only
 * time, its two all-to-alls (nothing overlaps them: all exposed), and the
 * bytes each rank sent (aj_comm_bytes_sent) against the formula
 *
 *   ring p2p forward   (P-1) B Hkv L (D + Dv) e
 *   Ulysses forward    (P-1)/P B L (Hq D + 2 Hkv D) e      (q, k, v in)
 *                    + (P-1)/P B L Hq (Dv e + 4)            (o, lse out)
 *   hybrid forward     Ulysses' with U for P                (in the groups)
 *                    + (R-1) B Hkv L (D + Dv) e             (the ring across)
 *   ring p2p backward  (P-1) B Hkv L (D + Dv) e + P B Hkv L (D + Dv) 4
 *   ring, packed docs  n_kv Hkv L_max (D + Dv) e  [+ n_dkv Hkv L_max (D + Dv) 4]
 *
 * (packed documents, layout = varlen: only the blocks a rank needs move;
 * n_kv, n_dkv count them per rank, L_max is the longest key shard:
 * docs/ring.md, "No transfer where a rank needs none of a peer's keys";
 * the cases here are padded, where every rank needs every block)
 *
 * (L: the per-rank length, e: bytes per element; measured is the formula
 * plus the opening agreement, (P-1) x 152 bytes -- the ring's formula is
 * its message path: ranks on one node share memory and send only the
 * agreement, docs/ring.md.  Hybrid, --method hybrid or all: P = U x R,
 * U = --ulysses-size, default 2: its all-to-alls overlap nothing, its
 * ring's exchanges overlap the ring's compute.)  The methods take turns
 * case by case, 5 rounds; each row is the method's median round.
 *
 * Part 2, a model for GPUs: a ring step hides its K/V exchange when the
 * block's compute takes at least as long as the transfer:
 *
 *   forward   4 H L^2 D / T  >=  2 Hkv L D e / BW
 *             => L >= Hkv e T / (2 H BW)
 *   backward  10 H L^2 D / T >=  2 Hkv L D (e + 4) / BW   (K/V + f32 dK/dV)
 *             => L >= Hkv (e + 4) T / (5 H BW)
 *
 * (T: kernel throughput in FLOP/s, BW: link bandwidth per GPU, e: bytes
 * per element; causal zigzag steps carry half a block's work, so twice
 * the chunk.)  The table takes the link bandwidths the issue states
 * (NVLink 450 GB/s, InfiniBand 50 GB/s per GPU) and the throughputs
 * given with --tflops, since this bench measures none on a GPU.
 *
 * Part 3, the methods compared on GPUs (a model, forward, bf16, D 128,
 * non-causal, nodes of G = 8 GPUs, the largest --tflops): per GPU the
 * attention of the whole sequence S = P L costs C = 4 H S^2 D / (P T);
 *
 *   ring      C/P + (P-1) max(C/P, X),  X = 2 Hkv L D e / BW   (one K/V
 *             block; BW: InfiniBand once the ring spans nodes, else NVLink)
 *   Ulysses   C + A(P),  A(n): its two all-to-alls among n ranks, the
 *             bytes of the formula above, on-node ones over NVLink and
 *             off-node ones over InfiniBand at once (the slower of the two)
 *   hybrid    A(U) + C/R + (R-1) max(C/R, X)   with U = G over NVLink and
 *             the ring over the R = P/G nodes (a block of U L positions and
 *             Hkv/U heads: the same X)
 *
 * Ulysses needs Hkv divisible by P, hybrid by U.
 */
#include <math.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "attnjit/attnjit.h"
#include "bench_common.h"
#include "launch_args.h"

#define MAX_LIST 8

static int rank, size;
static int ulysses_size = 2;   /* hybrid's U */
static const char *const method_names[AJ_METHOD_COUNT] = {"ring", "ulysses", "hybrid"};

static int parse_list(const char *s, double *out)
{
    int n = 0;
    char *copy = strdup(s), *save = NULL;
    for (char *t = strtok_r(copy, ",", &save); t && n < MAX_LIST; t = strtok_r(NULL, ",", &save))
        out[n++] = atof(t);
    free(copy);
    return n;
}

static aj_op *parse_op(aj_ctx *ctx, const char *kind, int causal, int dim)
{
    char text[256];
    snprintf(text, sizeof text, "attention %s efficient { dtype = f16 head_dim = %d "
             "mask = %s }", kind, dim, causal ? "causal(top_left)" : "none");
    aj_op *op = NULL;
    return aj_op_parse(ctx, text, strlen(text), "bench", &op) == AJ_OK ? op : NULL;
}

/* One timed ring forward (backward: after an untimed forward that gives
 * o and lse); the slowest rank's stats come back on every rank. */
static int run_case(aj_ctx *ctx, aj_device *dev, aj_comm *comm, aj_cp_method method,
                    int backward, int causal, int64_t len, int heads, int dim,
                    aj_ring_stats *worst, double *alone_s, uint64_t *sent)
{
    aj_op *op = parse_op(ctx, "forward", causal, dim);
    aj_op *bop = backward ? parse_op(ctx, "backward", causal, dim) : NULL;
    if (!op || (backward && !bop)) {
        aj_op_destroy(op);
        return 1;
    }
    const size_t n = (size_t)(heads * len * dim);
    enum { Q, K, V, O, DO, DQ, DK, DV, TENSORS };
    uint16_t *t[TENSORS];
    for (int i = 0; i < TENSORS; i++)
        t[i] = aligned_alloc(64, n * 2 + 64);
    uint16_t *q = t[Q], *k = t[K], *v = t[V], *o = t[O];
    float *lse = aligned_alloc(64, (size_t)(heads * len) * 4 + 64);
    float *f = malloc(n * sizeof *f);
    srand(17 + (unsigned)rank);
    for (size_t i = 0; i < n; i++)
        f[i] = (float)rand() / (float)RAND_MAX - 0.5f;
    aj_convert(f, AJ_DTYPE_F32, q, AJ_DTYPE_F16, n);
    aj_convert(f, AJ_DTYPE_F32, k, AJ_DTYPE_F16, n);
    aj_convert(f, AJ_DTYPE_F32, v, AJ_DTYPE_F16, n);
    aj_convert(f, AJ_DTYPE_F32, t[DO], AJ_DTYPE_F16, n);
    aj_ring_fwd_args a = AJ_RING_FWD_ARGS_INIT;
    a.q = tensor_dims(q, AJ_DTYPE_F16, 4, 1, heads, len, dim);
    a.k = a.q;
    a.k.data = k;
    a.v = a.q;
    a.v.data = v;
    a.o = a.q;
    a.o.data = o;
    a.lse = tensor_dims(lse, AJ_DTYPE_F32, 3, 1, heads, len, 0);
    a.layout = causal ? AJ_SHARD_ZIGZAG : AJ_SHARD_CONTIGUOUS;
    a.method = method;
    a.ulysses_size = method == AJ_METHOD_HYBRID ? ulysses_size : 0;
    aj_tensor grad[4];   /* dO, dQ, dK, dV: q's shape */
    for (int i = 0; i < 4; i++) {
        grad[i] = a.q;
        grad[i].data = t[DO + i];
    }
    aj_ring_bwd_args b = ring_bwd_args_after(&a, grad[0], grad[1], grad[2], grad[3]);
    aj_ring_stats s = {0};
    aj_status st = backward ? aj_ring_forward(ctx, dev, comm, op, &a, &s) : AJ_OK;
    for (int pass = 0; pass < 2 && st == AJ_OK; pass++) {   /* pass 0 compiles */
        MPI_Barrier(MPI_COMM_WORLD);
        *sent = aj_comm_bytes_sent(comm);
        st = backward ? aj_ring_backward(ctx, dev, comm, bop, &b, &s)
                      : aj_ring_forward(ctx, dev, comm, op, &a, &s);
        *sent = aj_comm_bytes_sent(comm) - *sent;
    }
    if (st != AJ_OK)
        fprintf(stderr, "bench_ring: rank %d: %s\n", rank, aj_last_error(ctx));
    double mine[4] = {s.total_s, s.compute_s, s.comm_s, s.exposed_comm_s}, max[4];
    MPI_Allreduce(mine, max, 4, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    /* the slowest rank's row: the ring's time is its time */
    int slowest = s.total_s == max[0] ? rank : size;
    int who = size;
    MPI_Allreduce(&slowest, &who, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
    MPI_Bcast(&s, (int)sizeof s, MPI_BYTE, who, MPI_COMM_WORLD);
    *worst = s;
    /* the same P-1 K/V exchanges (and a backward's P f32 dK/dV ones) with
     * nothing to compute: the transfer time the ring has to hide (its own
     * comm_s counts until the next poll, which on a host device is the end
     * of the running launch) */
    const int to = (rank + 1) % size, from = (rank + size - 1) % size;
    char *send = calloc(8, n), *recv = malloc(8 * n);
    MPI_Barrier(MPI_COMM_WORLD);
    double t0 = MPI_Wtime();
    for (int step = 0; step < (backward ? 2 * size - 1 : size - 1); step++) {
        const int bytes = (int)((step < size - 1 ? 4 : 8) * n);
        MPI_Sendrecv(send, bytes, MPI_BYTE, to, 9, recv, bytes, MPI_BYTE, from, 9,
                     MPI_COMM_WORLD, MPI_STATUS_IGNORE);
    }
    double tx = MPI_Wtime() - t0;
    MPI_Allreduce(&tx, alone_s, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    free(send);
    free(recv);
    for (int i = 0; i < TENSORS; i++)
        free(t[i]);
    free(lse);
    free(f);
    aj_op_destroy(op);
    aj_op_destroy(bop);
    return st != AJ_OK;
}

static void print_model(const double *tflops, int nt)
{
    static const struct { const char *name; double bw; } links[] = {
        {"NVLink", 450e9}, {"InfiniBand", 50e9}};
    static const struct { const char *name; double ratio; } heads[] = {
        {"MHA", 1.0}, {"GQA 8:1", 0.125}};
    const double e = 2;   /* bf16 / f16 */
    printf("\nminimum per-rank chunk L (tokens) for full overlap on GPUs, bf16 "
           "(forward / backward; causal zigzag: x2)\n");
    printf("%-11s %-8s", "link", "heads");
    for (int t = 0; t < nt; t++)
        printf("   %5.0f TFLOP/s    ", tflops[t]);
    printf("\n");
    for (size_t l = 0; l < sizeof links / sizeof links[0]; l++)
        for (size_t h = 0; h < sizeof heads / sizeof heads[0]; h++) {
            printf("%-11s %-8s", links[l].name, heads[h].name);
            for (int t = 0; t < nt; t++) {
                double T = tflops[t] * 1e12, bw = links[l].bw, r = heads[h].ratio;
                double fwd = r * e * T / (2 * bw), bwd = r * (e + 4) * T / (5 * bw);
                printf("   %7.0f / %-7.0f", ceil(fwd), ceil(bwd));
            }
            printf("\n");
        }
}

enum { ROUNDS = 5 };   /* per case and method */

/* Part 3 (header comment): seconds of one forward per method on P GPUs in
 * nodes of G; -1 where the method cannot split the heads. */
typedef struct gpu_case {
    double P, L, H, Hkv, T;
} gpu_case;

enum { GPU_NODE = 8 };
static const double nvlink = 450e9, infiniband = 50e9, gpu_d = 128, gpu_e = 2;

/* Ulysses' two all-to-alls among n ranks (of one node when n <= G). */
static double alltoall_s(const gpu_case *c, double n)
{
    const double D = gpu_d, e = gpu_e;
    double bytes = (n - 1) / n * c->L * ((c->H + 2 * c->Hkv) * D * e + c->H * (D * e + 4));
    double off = n > GPU_NODE ? (n - GPU_NODE) / (n - 1) : 0;
    return fmax(bytes * (1 - off) / nvlink, bytes * off / infiniband);
}

/* The ring over r ranks, each step a block of the per-GPU compute c_s
 * over r, exchanging x seconds of K/V. */
static double ring_steps_s(double r, double c_s, double x)
{
    return c_s / r + (r - 1) * fmax(c_s / r, x);
}

static double gpu_method_s(const gpu_case *c, aj_cp_method m)
{
    const double S = c->P * c->L, D = gpu_d, e = gpu_e;
    const double C = 4 * c->H * S * S * D / (c->P * c->T);
    const double bw = c->P > GPU_NODE ? infiniband : nvlink;
    const double X = 2 * c->Hkv * c->L * D * e;
    if (m == AJ_METHOD_RING)
        return ring_steps_s(c->P, C, X / bw);
    if (m == AJ_METHOD_ULYSSES)
        return fmod(c->Hkv, c->P) ? -1 : C + alltoall_s(c, c->P);
    const double U = fmin(GPU_NODE, c->P), R = c->P / U;
    if (fmod(c->Hkv, U))
        return -1;
    return alltoall_s(c, U) + ring_steps_s(R, C, X / (R > 1 ? infiniband : nvlink));
}

static void print_methods_model(double tflops)
{
    static const double gpus[] = {8, 16, 64}, lens[] = {2048, 16384};
    static const struct { const char *name; double h, hkv; } heads[] = {
        {"MHA 32", 32, 32}, {"GQA 32:8", 32, 8}};
    printf("\nforward ms per method on GPUs (model: nodes of %d, NVLink %.0f GB/s inside, "
           "InfiniBand %.0f GB/s across, %.0f TFLOP/s, bf16, D %.0f; -: heads do not "
           "divide)\n", GPU_NODE, nvlink / 1e9, infiniband / 1e9, tflops, gpu_d);
    printf("%-5s %-9s %7s %10s %10s %10s  %s\n", "GPUs", "heads", "L/GPU", "ring", "ulysses",
           "hybrid", "fastest");
    for (size_t g = 0; g < sizeof gpus / sizeof gpus[0]; g++)
        for (size_t h = 0; h < sizeof heads / sizeof heads[0]; h++)
            for (size_t l = 0; l < sizeof lens / sizeof lens[0]; l++) {
                const gpu_case c = {gpus[g], lens[l], heads[h].h, heads[h].hkv, tflops * 1e12};
                double t[AJ_METHOD_COUNT];
                int best = 0;
                printf("%-5.0f %-9s %7.0f", c.P, heads[h].name, c.L);
                for (int m = 0; m < AJ_METHOD_COUNT; m++) {
                    t[m] = gpu_method_s(&c, (aj_cp_method)m);
                    if (t[m] < 0)
                        printf(" %10s", "-");
                    else
                        printf(" %10.3f", 1e3 * t[m]);
                    if (t[m] >= 0 && (t[best] < 0 || t[m] < t[best]))
                        best = m;
                }
                printf("  %s\n", method_names[best]);
            }
}

/* The round whose total time is the median of n. */
static int median_round(const aj_ring_stats *s, int n)
{
    for (int r = 0; r < n; r++) {
        int below = 0, above = 0;
        for (int o = 0; o < n; o++) {
            below += s[o].total_s < s[r].total_s;
            above += s[o].total_s > s[r].total_s;
        }
        if (below <= n / 2 && above <= n / 2)
            return r;
    }
    return 0;
}

/* The formula's bytes a rank sends in one call (header comment); -1:
 * none stated (Ulysses' backward). */
static double formula_bytes(aj_cp_method method, int backward, int64_t len, int heads,
                            int dim)
{
    const double e = 2, L = (double)len, H = heads, D = dim;
    const double U = method == AJ_METHOD_HYBRID ? ulysses_size : size, R = size / U;
    if (method == AJ_METHOD_RING)
        return (size - 1) * H * L * 2 * D * e + (backward ? size * H * L * 2 * D * 4 : 0);
    if (backward)
        return -1;
    const double across = method == AJ_METHOD_HYBRID ? (R - 1) * H * L * 2 * D * e : 0;
    return (U - 1) / U * L * 3 * H * D * e + (U - 1) / U * L * H * (D * e + 4) + across;
}

/* A case's row: the method's median round. */
static void print_row(aj_cp_method m, int backward, int causal, double len, int heads, int dim,
                      const aj_ring_stats *rounds, const double *alone, uint64_t sent)
{
    const int r = median_round(rounds, ROUNDS);
    const aj_ring_stats *x = &rounds[r];
    /* hidden: the share of the transfer time the ring did not wait for;
     * Ulysses' all-to-alls overlap nothing */
    double hidden = m == AJ_METHOD_RING && alone[r] > 0 ? 1.0 - x->exposed_comm_s / alone[r]
                                                        : 0.0;
    printf("%-8s %-9s %-20s %5.0f %9.2f %11.2f %12.3f %11.3f %10.3f %7.0f%% %11llu %11.0f\n",
           method_names[m], backward ? "backward" : "forward",
           causal ? "causal, zigzag" : "no mask, contiguous", len, 1e3 * x->total_s,
           1e3 * x->compute_s, 1e3 * (m == AJ_METHOD_RING ? alone[r] : x->comm_s),
           1e3 * x->exposed_comm_s, x->total_s / x->compute_s,
           100.0 * (hidden > 0 ? hidden : 0), (unsigned long long)sent,
           formula_bytes(m, backward, (int64_t)len, heads, dim));
}

int main(int argc, char **argv)
{
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    double lens[MAX_LIST] = {64, 256}, tflops[MAX_LIST] = {25, 100, 400};
    int nl = 2, nt = 3, heads = 2, dim = 64, workers = 1;
    int runs[AJ_METHOD_COUNT] = {1, 0, 0};   /* which methods run */
    int dir_first = 0, dir_last = 0;
    aj_device_kind kind = AJ_DEVICE_CPU;
    const bench_int_option ints[] = {{"--heads", &heads}, {"--dim", &dim}, {"--workers", &workers},
                                     {"--ulysses-size", &ulysses_size}};
    for (int i = 1; i + 1 < argc; i += 2) {
        if (bench_int_arg(ints, sizeof ints / sizeof ints[0], argv[i], argv[i + 1]))
            continue;
        if (strcmp(argv[i], "--len") == 0)
            nl = parse_list(argv[i + 1], lens);
        else if (strcmp(argv[i], "--tflops") == 0)
            nt = parse_list(argv[i + 1], tflops);
        else if (strcmp(argv[i], "--device") == 0)
            kind = strcmp(argv[i + 1], "sim") == 0 ? AJ_DEVICE_SIM : AJ_DEVICE_CPU;
        else if (strcmp(argv[i], "--direction") == 0) {
            dir_first = strcmp(argv[i + 1], "backward") == 0;
            dir_last = strcmp(argv[i + 1], "forward") != 0;
        } else if (strcmp(argv[i], "--method") == 0) {
            const char *m = argv[i + 1];
            const int all = strcmp(m, "all") == 0, both = strcmp(m, "both") == 0;
            for (int k = 0; k < AJ_METHOD_COUNT; k++)
                runs[k] = all || strcmp(m, method_names[k]) == 0 ||
                          (both && k != AJ_METHOD_HYBRID);
        }
    }
    aj_ctx *ctx = NULL;
    aj_device *dev = NULL;
    aj_comm *comm = NULL;
    aj_comm_config cc = AJ_COMM_CONFIG_INIT;
    int failed = aj_ctx_create(NULL, &ctx) != AJ_OK ||
                 aj_device_open(ctx, kind, 0, &dev) != AJ_OK ||
                 aj_device_set_workers(dev, workers) != AJ_OK ||
                 aj_comm_create(ctx, dev, &cc, &comm) != AJ_OK;
    if (failed)
        fprintf(stderr, "bench_ring: rank %d: %s\n", rank, ctx ? aj_last_error(ctx) : "");
    if (!failed && rank == 0) {
        printf("%d CPU ranks (%s device, f16, H = %d, D = %d; the slowest rank; warm "
               "kernel cache)\n", size, aj_device_name(dev), heads, dim);
        printf("%-8s %-9s %-20s %5s %9s %11s %12s %11s %10s %8s %11s %11s\n", "method", "dir",
               "case", "L", "total ms", "compute ms", "transfer ms", "exposed ms", "tot/comp",
               "hidden", "sent B", "formula B");
    }
    /* per case and direction, the methods take turns (ring, ulysses,
     * hybrid, ring, ...) for ROUNDS rounds; each row is the method's
     * median round by total time */
    for (int d = dir_first; d <= dir_last && !failed; d++)
        for (int c = 0; c < 2 && !failed; c++)
            for (int i = 0; i < nl && !failed; i++) {
                aj_ring_stats s[AJ_METHOD_COUNT][ROUNDS] = {{{0}}};
                double alone[AJ_METHOD_COUNT][ROUNDS] = {{0}};
                uint64_t sent[AJ_METHOD_COUNT] = {0};
                for (int r = 0; r < ROUNDS && !failed; r++)
                    for (int m = 0; m < AJ_METHOD_COUNT && !failed; m++)
                        failed = runs[m] && run_case(ctx, dev, comm, (aj_cp_method)m, d, c,
                                                     (int64_t)lens[i], heads, dim, &s[m][r],
                                                     &alone[m][r], &sent[m]);
                for (int m = 0; m < AJ_METHOD_COUNT && !failed && rank == 0; m++)
                    if (runs[m])
                        print_row((aj_cp_method)m, d, c, lens[i], heads, dim, s[m], alone[m],
                                  sent[m]);
            }
    if (!failed && rank == 0)
    {
        print_model(tflops, nt);
        print_methods_model(tflops[nt - 1]);
    }
    aj_comm_destroy(comm);
    aj_device_close(dev);
    aj_ctx_destroy(ctx);
    MPI_Finalize();
    return failed;
}
