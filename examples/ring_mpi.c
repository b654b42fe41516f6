/*
 * ring_mpi.c -- context-parallel attention over MPI ranks on the cpu
 * device: every rank holds a zigzag shard of the sequence, K/V blocks
 * rotate around the ring while the kernels compute, and the shards of the
 * result, put back together, equal a single-rank run.
 *
 *   mpirun -np P ring_mpi [SEQ]       (SEQ divisible by 2P; default 512)
 *
 * Every rank draws the same full inputs from one seed (a real program
 * would load its own shard), takes its shard with aj_shard, runs
 * aj_ring_forward and sends its output shard to rank 0, which unshards
 * them and compares with aj_forward over the whole sequence.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <mpi.h>

#include "attnjit/attnjit.h"

enum { B = 1, HQ = 4, HKV = 2, D = 64 };

static const char spec[] = "attention forward flash {\n  dtype = bf16\n  head_dim = 64\n"
                           "  mask = causal(bottom_right)\n}\n";

static int fail(aj_ctx *ctx, const char *what)
{
    fprintf(stderr, "ring_mpi: %s: %s\n", what, aj_last_error(ctx));
    return 1;
}

static aj_tensor bhsd(void *data, aj_dtype dtype, int64_t h, int64_t s, int64_t d)
{
    aj_tensor t = {data, dtype, 4, {B, h, s, d}, {h * s * d, s * d, d, 1}};
    return t;
}

static aj_tensor bhs(float *data, int64_t h, int64_t s)
{
    aj_tensor t = {data, AJ_DTYPE_F32, 3, {B, h, s}, {h * s, s, 1}};
    return t;
}

/* Full inputs, bf16, the same on every rank. */
static uint16_t *random_bf16(size_t n, uint64_t seed)
{
    float *f = malloc(n * sizeof *f);
    uint16_t *out = aligned_alloc(64, (n * 2 + 63) / 64 * 64);
    for (size_t i = 0; f && out && i < n; i++) {
        seed = seed * 6364136223846793005ull + 1442695040888963407ull;
        f[i] = (float)((double)(seed >> 11) * 0x1p-53 * 2 - 1);
    }
    if (f && out)
        aj_convert(f, AJ_DTYPE_F32, out, AJ_DTYPE_BF16, n);
    free(f);
    return out;
}

static int run(aj_ctx *ctx, int rank, int size, int64_t seq)
{
    int rc = 1;
    aj_device *dev = NULL;
    aj_comm *comm = NULL;
    aj_op *op = NULL;
    aj_kernel *single = NULL;
    const int64_t shard = seq / size;
    const size_t nq = (size_t)B * HQ * seq * D, nk = (size_t)B * HKV * seq * D;
    const size_t nq_s = nq / (size_t)size, nk_s = nk / (size_t)size;
    uint16_t *q = random_bf16(nq, 1), *k = random_bf16(nk, 2), *v = random_bf16(nk, 3);
    uint16_t *q_s = aligned_alloc(64, nq_s * 2), *k_s = aligned_alloc(64, nk_s * 2);
    uint16_t *v_s = aligned_alloc(64, nk_s * 2), *o_s = aligned_alloc(64, nq_s * 2);
    float *lse_s = aligned_alloc(64, (size_t)B * HQ * shard * 4 + 64);
    uint16_t *gathered = rank == 0 ? malloc(nq * 2) : NULL, *o_ring = NULL, *o_one = NULL;
    float *lse_one = NULL;
    if (!q || !k || !v || !q_s || !k_s || !v_s || !o_s || !lse_s || (rank == 0 && !gathered)) {
        fprintf(stderr, "ring_mpi: out of memory\n");
        goto out;
    }
    if (aj_device_open(ctx, AJ_DEVICE_CPU, 0, &dev) != AJ_OK ||
        aj_device_set_workers(dev, 1) != AJ_OK) {   /* one thread per rank */
        rc = fail(ctx, "cpu device");
        goto out;
    }
    if (aj_op_parse(ctx, spec, strlen(spec), "ring_mpi", &op) != AJ_OK) {
        rc = fail(ctx, "spec");
        goto out;
    }

    /* 1. this rank's zigzag shards: chunks r and 2P-1-r of the sequence */
    const aj_seq_shape qs = {B * HQ, seq, D, 2}, ks = {B * HKV, seq, D, 2};
    if (aj_shard(ctx, AJ_SHARD_ZIGZAG, rank, size, &qs, q, q_s) != AJ_OK ||
        aj_shard(ctx, AJ_SHARD_ZIGZAG, rank, size, &ks, k, k_s) != AJ_OK ||
        aj_shard(ctx, AJ_SHARD_ZIGZAG, rank, size, &ks, v, v_s) != AJ_OK) {
        rc = fail(ctx, "shard");
        goto out;
    }

    /* 2. the ring: K/V rotate P-1 times over MPI_COMM_WORLD */
    aj_comm_config cc = AJ_COMM_CONFIG_INIT;
    cc.timeout_s = 60;
    if (aj_comm_create(ctx, dev, &cc, &comm) != AJ_OK) {
        rc = fail(ctx, "comm");
        goto out;
    }
    aj_ring_fwd_args a = AJ_RING_FWD_ARGS_INIT;
    a.q = bhsd(q_s, AJ_DTYPE_BF16, HQ, shard, D);
    a.k = bhsd(k_s, AJ_DTYPE_BF16, HKV, shard, D);
    a.v = bhsd(v_s, AJ_DTYPE_BF16, HKV, shard, D);
    a.o = bhsd(o_s, AJ_DTYPE_BF16, HQ, shard, D);
    a.lse = bhs(lse_s, HQ, shard);
    a.layout = AJ_SHARD_ZIGZAG;
    a.rotate = AJ_ROTATE_P2P;
    aj_ring_stats stats;
    int failed = aj_ring_forward(ctx, dev, comm, op, &a, &stats) != AJ_OK, any_failed = 0;
    if (failed)
        fail(ctx, "ring forward");
    /* the gather below has no timeout: enter it only if every rank can */
    MPI_Allreduce(&failed, &any_failed, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
    if (any_failed)
        goto out;
    printf("rank %d: %d rotations, %d launches, %d block pairs skipped, compute %.1f ms, "
           "exposed comm %.2f ms\n", rank, stats.rotations, stats.launches,
           stats.skipped_blocks, stats.compute_s * 1e3, stats.exposed_comm_s * 1e3);
    fflush(stdout);

    /* 3. rank 0 gathers the output shards and puts them back in order */
    MPI_Gather(o_s, (int)nq_s, MPI_UINT16_T, gathered, (int)nq_s, MPI_UINT16_T, 0,
               MPI_COMM_WORLD);
    if (rank != 0) {
        rc = 0;
        goto out;
    }
    o_ring = malloc(nq * 2);
    o_one = aligned_alloc(64, nq * 2);
    lse_one = aligned_alloc(64, (size_t)B * HQ * seq * 4 + 64);
    if (!o_ring || !o_one || !lse_one)
        goto out;
    for (int r = 0; r < size; r++)
        if (aj_unshard(ctx, AJ_SHARD_ZIGZAG, r, size, &qs, gathered + (size_t)r * nq_s,
                       o_ring) != AJ_OK) {
            rc = fail(ctx, "unshard");
            goto out;
        }

    /* 4. the same op on one rank over the whole sequence */
    aj_compile_options opt = AJ_COMPILE_OPTIONS_INIT;
    opt.device = dev;
    if (aj_compile(ctx, op, &opt, &single) != AJ_OK) {
        rc = fail(ctx, "compile");
        goto out;
    }
    aj_fwd_args f = AJ_FWD_ARGS_INIT;
    f.q = bhsd(q, AJ_DTYPE_BF16, HQ, seq, D);
    f.k = bhsd(k, AJ_DTYPE_BF16, HKV, seq, D);
    f.v = bhsd(v, AJ_DTYPE_BF16, HKV, seq, D);
    f.o = bhsd(o_one, AJ_DTYPE_BF16, HQ, seq, D);
    f.lse = bhs(lse_one, HQ, seq);
    if (aj_forward(ctx, dev, single, &f) != AJ_OK) {
        rc = fail(ctx, "single-rank forward");
        goto out;
    }
    float *x = malloc(nq * 4), *y = malloc(nq * 4);
    double worst = 0;
    if (x && y) {
        aj_convert(o_ring, AJ_DTYPE_BF16, x, AJ_DTYPE_F32, nq);
        aj_convert(o_one, AJ_DTYPE_BF16, y, AJ_DTYPE_F32, nq);
        for (size_t i = 0; i < nq; i++)
            worst = fmax(worst, fabs((double)x[i] - y[i]) / (1.6e-2 + 3e-2 * fabs(y[i])));
    }
    free(x);
    free(y);
    printf("ring on %d ranks vs one rank, S = %lld: max error %.3f of the bf16 tolerance: %s\n",
           size, (long long)seq, worst, worst <= 1 ? "match" : "MISMATCH");
    rc = worst <= 1 ? 0 : 1;
out:
    aj_kernel_destroy(single);
    aj_op_destroy(op);
    aj_comm_destroy(comm);
    aj_device_close(dev);
    free(q), free(k), free(v), free(q_s), free(k_s), free(v_s), free(o_s), free(lse_s);
    free(gathered), free(o_ring), free(o_one), free(lse_one);
    return rc;
}

int main(int argc, char **argv)
{
    MPI_Init(&argc, &argv);
    int rank = 0, size = 1;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    int64_t seq = argc > 1 ? atoll(argv[1]) : 512;
    int rc = 1;
    aj_ctx *ctx = NULL;
    if (seq <= 0 || seq % (2 * size) != 0) {
        if (rank == 0)
            fprintf(stderr, "ring_mpi: SEQ = %lld must be a positive multiple of 2P = %d\n",
                    (long long)seq, 2 * size);
    } else if (aj_ctx_create(NULL, &ctx) == AJ_OK) {
        rc = run(ctx, rank, size, seq);
    }
    aj_ctx_destroy(ctx);
    /* every rank learns whether any failed, and exits with that */
    int any = 0;
    MPI_Allreduce(&rc, &any, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
    MPI_Finalize();
    return any;
}
