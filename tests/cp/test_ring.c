/*
 * test_ring.c -- ring attention under mpirun, against the float64
 * reference of the unsharded problem.
 *
 *   mpirun -np P test_ring cases     every case below, forward and backward
 *   mpirun -np 2 test_ring silent    rank 1 stays silent: rank 0 gets
 *                                    AJ_ERR_COMM within the timeout, from
 *                                    an exchange and from the ring
 *   mpirun -np 2 test_ring stopped   rank 1 is frozen (SIGSTOP) likewise
 *   mpirun -np 2 --enable-recovery test_ring killed
 *                                    rank 1 exits: likewise (without
 *                                    --enable-recovery OpenMPI ends the
 *                                    whole job itself when a rank dies)
 *   mpirun -np 2 test_ring mismatch  the ranks pass different layouts,
 *                                    ops or methods: both refuse the call;
 *                                    what method = ulysses and packed
 *                                    documents (varlen) refuse
 *   mpirun -np P test_ring generated every method x mask family x lengths
 *                                    1 .. 7P (any length), and packed
 *                                    documents (varlen), on sim ranks;
 *                                    generated-cpu on cpu ranks
 *                                    ($TEST_RING_ONLY: the cases whose
 *                                    label holds it)
 *   mpirun -np P test_ring generated-cuda, cases-cuda
 *                                    the same on cuda ranks over NCCL:
 *                                    the stand-in libcuda (GPU r for rank
 *                                    r) and libnccl, with emulated
 *                                    launches (AJ_CUDA_EMULATE=1), the
 *                                    shards in device memory; packed
 *                                    documents' p2p traffic checked
 *                                    against the blocks needed
 *
 * Every rank builds the same full inputs (same seed), takes its shard with
 * aj_shard, runs the ring, and compares its shard of O, LSE, dQ, dK, dV
 * with its shard of the reference's (shards of doubles, through the same
 * aj_shard).  The rotation counts (forward P-1, backward 2P-1 for p2p: 3P-2
 * in all; one collective per direction for all-gather) and the launch
 * counts (every block pair classified by brute force over its positions:
 * skipped pairs must not be launched) are asserted too.  Cases that read
 * rel or alibi's slopes check their gradients too (check_side_grad),
 * padded and packed.
 */
#include <dlfcn.h>
#include <math.h>
#include <mpi.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "check.h"
#include "launch_args.h"
#include "ref.h"
#include "splitmix.h"
#include "stand_in_cuda.h"
#include "cp/alltoall_check.h"
#include "cp/leak_check.h"
#include "cp/comm/comm.h"
#include "cp/cp.h"   /* aj_cp_call: the opening agreement's bytes */

#define HEAD_DIM 16

static aj_ctx *ctx;
static aj_device *dev;
static int rank, size;
/* A peer died: OpenMPI's fault handling then allocates from plugins it
 * unloads again, which LeakSanitizer cannot attribute; skip its check. */
static int peer_died;

typedef struct ring_case {
    const char *label;
    aj_dtype dtype;
    aj_mask_kind mask;
    aj_align align;
    int64_t left, right;          /* window only */
    int hq, hkv;
    int lq, lk;                   /* per-rank lengths: Sq = P lq, Sk = P lk */
    aj_shard_layout layout;
    aj_ring_rotate rotate;
    int alibi;
    double dropout;               /* p, with seed 7 and offset 3 */
    int flash;                    /* the flash variant's kernels (tensor cores) */
    /* side tensors (issue 15): a document mask over doc: i32[B, S] (each
     * document doc_len tokens; Sq = Sk), and / or a relative bias over
     * rel: f32[Hq, 9], both whole on every rank */
    int doc_len;
    int rel;
    aj_cp_method method;
    /* total lengths, any (0: P lq and P lk); per-rank lengths then follow
     * aj_shard_length */
    int sq_total, sk_total;
    /* layout = varlen (packed documents): the documents' lengths, queries
     * and keys alike, 0-terminated (NULL: padded) */
    const int *docs;
    int ulysses_size;             /* method = hybrid's U */
    int head_mask;                /* mask = HEAD_MASK: a window that narrows with h */
    const char *mask_expr;        /* an expression mask (over b, q, k) instead of `mask` */
    int sinks;                    /* learned sinks: snk f32[Hq], dsinks checked */
} ring_case;

static const char *const method_names[AJ_METHOD_COUNT] = {"ring", "ulysses", "hybrid"};

#define DOC_MASK "expr(doc[b, q] == doc[b, k] && k <= q)"
#define REL_BIAS "expr(score + rel[h, clamp(q - k, -4, 4) + 4])"
#define HEAD_MASK "expr(k <= q + 1 && k + sq >= q + h + 2)"

static const ring_case cases[] = {
    {.label = "f32 causal top_left, contiguous, p2p", .dtype = AJ_DTYPE_F32, .mask = AJ_MASK_CAUSAL,
     .hq = 2, .hkv = 2, .lq = 8, .lk = 8, .layout = AJ_SHARD_CONTIGUOUS, .rotate = AJ_ROTATE_P2P},
    {.label = "f32 causal top_left, zigzag, p2p, GQA", .dtype = AJ_DTYPE_F32,
     .mask = AJ_MASK_CAUSAL, .hq = 2, .hkv = 1, .lq = 8, .lk = 8, .layout = AJ_SHARD_ZIGZAG,
     .rotate = AJ_ROTATE_P2P},
    {.label = "f16 causal bottom_right (Sk = 2 Sq), zigzag, p2p", .dtype = AJ_DTYPE_F16,
     .mask = AJ_MASK_CAUSAL, .align = AJ_ALIGN_BOTTOM_RIGHT, .hq = 2, .hkv = 1, .lq = 4, .lk = 8,
     .layout = AJ_SHARD_ZIGZAG, .rotate = AJ_ROTATE_P2P},
    {.label = "bf16 no mask, GQA 4:2, contiguous, all-gather", .dtype = AJ_DTYPE_BF16,
     .mask = AJ_MASK_NONE, .hq = 4, .hkv = 2, .lq = 8, .lk = 8, .layout = AJ_SHARD_CONTIGUOUS,
     .rotate = AJ_ROTATE_ALLGATHER},
    {.label = "f32 window(3, 2), zigzag, all-gather", .dtype = AJ_DTYPE_F32, .mask = AJ_MASK_WINDOW,
     .left = 3, .right = 2, .hq = 2, .hkv = 2, .lq = 8, .lk = 8, .layout = AJ_SHARD_ZIGZAG,
     .rotate = AJ_ROTATE_ALLGATHER},
    {.label = "f16 window(5, 0, bottom_right) + alibi (Sq = 2 Sk), contiguous, p2p",
     .dtype = AJ_DTYPE_F16, .mask = AJ_MASK_WINDOW, .align = AJ_ALIGN_BOTTOM_RIGHT, .left = 5,
     .hq = 2, .hkv = 1, .lq = 8, .lk = 4, .layout = AJ_SHARD_CONTIGUOUS, .rotate = AJ_ROTATE_P2P,
     .alibi = 1},
    {.label = "f32 causal top_left + dropout 0.25, zigzag, p2p", .dtype = AJ_DTYPE_F32,
     .mask = AJ_MASK_CAUSAL, .hq = 2, .hkv = 2, .lq = 8, .lk = 8, .layout = AJ_SHARD_ZIGZAG,
     .rotate = AJ_ROTATE_P2P, .dropout = 0.25},
    {.label = "bf16 flash causal bottom_right + dropout 0.1, zigzag, p2p, GQA",
     .dtype = AJ_DTYPE_BF16, .mask = AJ_MASK_CAUSAL, .align = AJ_ALIGN_BOTTOM_RIGHT, .hq = 2,
     .hkv = 1, .lq = 16, .lk = 16, .layout = AJ_SHARD_ZIGZAG, .rotate = AJ_ROTATE_P2P,
     .dropout = 0.1, .flash = 1},
    {.label = "f32 document mask (documents of 5), zigzag, p2p", .dtype = AJ_DTYPE_F32,
     .mask = AJ_MASK_NONE, .hq = 2, .hkv = 1, .lq = 8, .lk = 8, .layout = AJ_SHARD_ZIGZAG,
     .rotate = AJ_ROTATE_P2P, .doc_len = 5},
    {.label = "f16 causal + relative bias table, contiguous, all-gather", .dtype = AJ_DTYPE_F16,
     .mask = AJ_MASK_CAUSAL, .hq = 2, .hkv = 2, .lq = 8, .lk = 8, .layout = AJ_SHARD_CONTIGUOUS,
     .rotate = AJ_ROTATE_ALLGATHER, .rel = 1},
    {.label = "bf16 flash document mask (documents of 3) + relative bias, contiguous, p2p",
     .dtype = AJ_DTYPE_BF16, .mask = AJ_MASK_NONE, .hq = 2, .hkv = 2, .lq = 16, .lk = 16,
     .layout = AJ_SHARD_CONTIGUOUS, .rotate = AJ_ROTATE_P2P, .flash = 1, .doc_len = 3, .rel = 1},
    {.label = "f32 causal + sinks, zigzag, p2p", .dtype = AJ_DTYPE_F32, .mask = AJ_MASK_CAUSAL,
     .hq = 4, .hkv = 2, .lq = 8, .lk = 8, .layout = AJ_SHARD_ZIGZAG, .rotate = AJ_ROTATE_P2P,
     .sinks = 1},
    {.label = "bf16 flash window(3, 0) + sinks, contiguous, all-gather", .dtype = AJ_DTYPE_BF16,
     .mask = AJ_MASK_WINDOW, .left = 3, .hq = 2, .hkv = 1, .lq = 16, .lk = 16,
     .layout = AJ_SHARD_CONTIGUOUS, .rotate = AJ_ROTATE_ALLGATHER, .flash = 1, .sinks = 1},
};

/* Any length (issue 20), with each method: every mask family x lengths 1
 * and P .. 7P, with and without a remainder (P, 2P+1, 3P-1, ...), the
 * layouts alternating; Hkv = P, GQA 2:1.  `small` (sim: slow) takes every
 * third length.  Hybrid runs where P = 4 splits into U = 2 and R = 2 (a
 * true 2-D grid): on cpu every mask family at every other length, on sim
 * one case. */
enum { ULY_MASKS = 5, ULY_LENGTHS = 8, ULY_HEADS = 3,
       ULY_MAX_CASES = AJ_METHOD_COUNT * (ULY_MASKS * ULY_LENGTHS + ULY_HEADS) };

static const struct uly_mask {
    const char *name;
    aj_dtype dtype;
    aj_mask_kind mask;
    aj_align align;
    int left, right, alibi, doc_len, extra_k, flash;
} uly_masks[ULY_MASKS] = {
    {"f32 causal top_left", AJ_DTYPE_F32, AJ_MASK_CAUSAL, AJ_ALIGN_TOP_LEFT, 0, 0, 0, 0, 0, 0},
    {"f16 causal bottom_right (Sk = Sq + 3)", AJ_DTYPE_F16, AJ_MASK_CAUSAL,
     AJ_ALIGN_BOTTOM_RIGHT, 0, 0, 0, 0, 3, 0},
    {"f32 window(3, 1) + alibi", AJ_DTYPE_F32, AJ_MASK_WINDOW, AJ_ALIGN_TOP_LEFT, 3, 1, 1, 0, 0,
     0},
    {"f32 document mask (documents of 3)", AJ_DTYPE_F32, AJ_MASK_NONE, AJ_ALIGN_TOP_LEFT, 0, 0,
     0, 3, 0, 0},
    {"bf16 flash, no mask", AJ_DTYPE_BF16, AJ_MASK_NONE, AJ_ALIGN_TOP_LEFT, 0, 0, 0, 0, 0, 1},
};

/* What reads the global head (issue 20): dropout (its Philox counter
 * holds b Hq + h), a score_mod and a mask that read h (relative bias
 * rel[h, ..], a window narrowing with h), alibi's slopes[h]; the efficient
 * and the flash kernels, GQA 2:1, uneven lengths.  Each method computes
 * its heads as the unsharded op does: method = ulysses and hybrid run a
 * rank's heads as heads r H/U .. of the op (aj_fwd_args.head_offset).
 * Ulysses runs them all; the ring (which has run dropout and alibi all
 * along: the cases above) and hybrid the first and the last, whose masks
 * read h (the ring classes its blocks by it).  On sim too: they are
 * small. */
static const struct uly_heads {
    const char *name;
    aj_dtype dtype;
    double dropout;
    int rel, head_mask, alibi, flash, extra;   /* Sq = 2P + extra */
    int every_method;                          /* else Ulysses only */
} uly_heads[ULY_HEADS] = {
    {"f32 dropout 0.2 + relative bias rel[h] + window narrowing with h", AJ_DTYPE_F32, 0.2, 1,
     1, 0, 0, 1, 1},
    {"bf16 flash causal + dropout 0.1 + alibi", AJ_DTYPE_BF16, 0.1, 0, 0, 1, 1, -1, 0},
    /* rel's gradient (no dropout): every method's parts summed over the ranks */
    {"f16 learned relative bias rel[h] (drel) + window narrowing with h", AJ_DTYPE_F16, 0, 1,
     1, 0, 0, 2, 1},
};

/* Packed documents (layout = varlen): per method (ring, ulysses, and
 * hybrid at U = 2 where P is even), causal (the ring and hybrid: and
 * window) masks over documents of length 1, documents shorter than P, and
 * a mix (Ulysses runs the single-rank varlen kernel whole, which the
 * kernel tests cover mask by mask; each mask costs its kernels' compile),
 * Ulysses with dropout (the ring's below, with documents' own b; not
 * over documents of length 1, whose exact dQ and dK are 0: a row of one
 * key has dS = P (dP m - dO.O) = 0, and f16's rounding of O = m V leaves
 * only noise to compare);
 * the flash variant (on sim the efficient backward has no varlen);
 * `small` (sim) takes the first mask and set only. */
enum { VARLEN_MASKS = 2, VARLEN_SETS = 4, VARLEN_BY_DOC = 2,
       VARLEN_MAX_CASES = AJ_METHOD_COUNT * VARLEN_MASKS * VARLEN_SETS + VARLEN_BY_DOC };
static const int varlen_sets[VARLEN_SETS][8] = {
    {1, 2, 5, 0}, {1, 1, 1, 0}, {7, 1, 2, 13, 3, 0}, {3, 1, 2, 3, 2, 0}};
static const char *const varlen_set_names[VARLEN_SETS] = {
    "documents 1, 2, 5", "documents of length 1", "documents 7, 1, 2, 13, 3",
    "documents 3, 1, 2, 3, 2"};

static int generated_varlen_cases(ring_case *out, char (*labels)[112], int small)
{
    int n = 0;
    for (int method = 0; method < AJ_METHOD_COUNT; method++)
        for (int m = 0; m < (small || method == AJ_METHOD_ULYSSES ? 1 : VARLEN_MASKS); m++)
            for (int d = 0; d < (small ? 1 : VARLEN_SETS); d++) {
                const int hybrid = method == AJ_METHOD_HYBRID;
                if (hybrid && size % 2 != 0)
                    continue;
                const aj_shard_layout L = (m + d) % 2 ? AJ_SHARD_CONTIGUOUS : AJ_SHARD_ZIGZAG;
                const aj_ring_rotate R = d == 2 && method != AJ_METHOD_ULYSSES
                                             ? AJ_ROTATE_ALLGATHER : AJ_ROTATE_P2P;
                const int drop = method && d != 1;
                /* sinks: the fourth set, and the ring's and hybrid's one
                 * case each where only the first runs (sim, cuda) */
                const int sinks = d == 3 || (small && method != AJ_METHOD_ULYSSES);
                snprintf(labels[n], 112, "varlen %s f16 flash %s%s%s%s, %s%s, %s",
                         method_names[method], m ? "window(2, 1)" : "causal top_left",
                         drop ? " + dropout 0.1" : "", d % 2 == 0 ? " + rel" : "",
                         sinks ? " + sinks" : "",
                         L == AJ_SHARD_ZIGZAG ? "zigzag" : "contiguous",
                         R == AJ_ROTATE_P2P ? "" : ", all-gather", varlen_set_names[d]);
                out[n] = (ring_case){.label = labels[n], .dtype = AJ_DTYPE_F16, .flash = 1,
                                     .mask = m ? AJ_MASK_WINDOW : AJ_MASK_CAUSAL,
                                     .align = AJ_ALIGN_TOP_LEFT, .left = 2, .right = 1,
                                     .hq = 2 * size, .hkv = size, .layout = L,
                                     .rotate = R, .dropout = drop ? 0.1 : 0,
                                     .rel = d % 2 == 0, .sinks = sinks,
                                     .method = (aj_cp_method)method, .docs = varlen_sets[d],
                                     .ulysses_size = 2 * hybrid};
                n++;
            }
    /* the ring's launches as the documents' own batch index (issue 20):
     * dropout's Philox stream per document, and a mask reading b (each
     * document's causal band shifted by its index); sim: the first */
    for (int i = 0; i < (small ? 1 : VARLEN_BY_DOC); i++) {
        const int by_b = i == 1;
        snprintf(labels[n], 112, "varlen ring f16 flash %s, %s, %s",
                 by_b ? "expr(k + b % 2 <= q)" : "causal top_left + dropout 0.25 + rel",
                 by_b ? "contiguous, all-gather" : "zigzag", varlen_set_names[by_b ? 3 : 2]);
        out[n] = (ring_case){.label = labels[n], .dtype = AJ_DTYPE_F16, .flash = 1,
                             .mask = by_b ? AJ_MASK_NONE : AJ_MASK_CAUSAL,
                             .mask_expr = by_b ? "k + b % 2 <= q" : NULL, .dropout = by_b ? 0 : 0.25,
                             .align = AJ_ALIGN_TOP_LEFT, .hq = 2 * size, .hkv = size,
                             .layout = by_b ? AJ_SHARD_CONTIGUOUS : AJ_SHARD_ZIGZAG,
                             .rotate = by_b ? AJ_ROTATE_ALLGATHER : AJ_ROTATE_P2P,
                             .rel = !by_b,
                             .method = AJ_METHOD_RING, .docs = varlen_sets[by_b ? 3 : 2]};
        n++;
    }
    return n;
}

static int generated_cases(ring_case *out, char (*labels)[112], int small)
{
    int n = 0;
    for (int method = 0; method < AJ_METHOD_COUNT; method++)
    for (int m = 0; m < ULY_MASKS; m++)
        for (int len = 0; len < ULY_LENGTHS; len += small ? 3 : 1) {
            const int hybrid = method == AJ_METHOD_HYBRID;
            if (hybrid && (size != 4 || (small ? m + len > 0 : len % 2 == 0)))
                continue;
            const struct uly_mask *u = &uly_masks[m];
            const int sq = len == 0 ? 1 : len * size + len % 3 - 1;
            const aj_shard_layout L = (len + m) % 2 ? AJ_SHARD_ZIGZAG : AJ_SHARD_CONTIGUOUS;
            snprintf(labels[n], 112, "%s %s%s, %s, Sq = %d", method_names[method],
                     u->name, (len + m) % 3 == 1 ? " + sinks" : "",
                     L == AJ_SHARD_ZIGZAG ? "zigzag" : "contiguous", sq);
            out[n] = (ring_case){.label = labels[n], .dtype = u->dtype, .mask = u->mask,
                                   .align = u->align, .left = u->left, .right = u->right,
                                   .hq = 2 * size, .hkv = size, .layout = L,
                                   .alibi = u->alibi, .flash = u->flash, .doc_len = u->doc_len,
                                   .method = (aj_cp_method)method, .sq_total = sq,
                                   .sk_total = sq + u->extra_k, .ulysses_size = 2 * hybrid,
                                   .sinks = (len + m) % 3 == 1};
            n++;
        }
    /* hybrid: U = 2 where P is even (on P = 4 the ring across the groups
     * classes its blocks by the global heads) */
    for (int method = 0; method < AJ_METHOD_COUNT; method++)
        for (int i = 0; i < ULY_HEADS; i++) {
            const int hybrid = method == AJ_METHOD_HYBRID;
            if ((hybrid && size % 2 != 0) ||
                (!uly_heads[i].every_method && method != AJ_METHOD_ULYSSES))
                continue;
            const struct uly_heads *u = &uly_heads[i];
            const int sq = 2 * size + u->extra;
            snprintf(labels[n], 112, "%s %s, zigzag, Sq = %d", method_names[method], u->name,
                     sq);
            out[n] = (ring_case){.label = labels[n], .dtype = u->dtype,
                                 .mask = u->head_mask ? AJ_MASK_NONE : AJ_MASK_CAUSAL,
                                 .align = AJ_ALIGN_TOP_LEFT, .hq = 2 * size, .hkv = size,
                                 .layout = AJ_SHARD_ZIGZAG, .alibi = u->alibi,
                                 .dropout = u->dropout, .flash = u->flash, .rel = u->rel,
                                 .head_mask = u->head_mask, .method = (aj_cp_method)method,
                                 .sq_total = sq, .sk_total = sq, .ulysses_size = 2 * hybrid};
            n++;
        }
    return n;
}

/* ---------------------------------------------------------------- data */

static size_t elem_size(aj_dtype d)
{
    return d == AJ_DTYPE_F32 ? 4 : 2;
}

/* A dense tensor's bytes. */
static size_t tensor_bytes(const aj_tensor *t)
{
    size_t bytes = elem_size(t->dtype);
    for (int d = 0; d < t->rank; d++)
        bytes *= (size_t)t->shape[d];
    return bytes;
}

static void *alloc64(size_t bytes)
{
    void *p = aligned_alloc(64, (bytes + 63) / 64 * 64 + 64);
    memset(p, 0, (bytes + 63) / 64 * 64 + 64);
    return p;
}

/* A full tensor: its values in `dtype` and their double image. */
typedef struct full_tensor {
    void *data;
    double *ref;
    size_t n;
} full_tensor;

static void make_full(full_tensor *x, aj_dtype dtype, size_t n, uint64_t *rng)
{
    x->n = n;
    x->data = alloc64(n * elem_size(dtype));
    x->ref = calloc(n + 1, sizeof(double));
    float *f = malloc((n + 1) * sizeof *f);
    for (size_t i = 0; i < n; i++)
        f[i] = (float)((double)(splitmix_next(rng) >> 11) * 0x1p-52 * 2.0 - 1.0);
    CHECK(aj_convert(f, AJ_DTYPE_F32, x->data, dtype, n) == AJ_OK);
    CHECK(aj_convert(x->data, dtype, f, AJ_DTYPE_F32, n) == AJ_OK);
    for (size_t i = 0; i < n; i++)
        x->ref[i] = f[i];
    free(f);
}

static void free_full(full_tensor *x)
{
    free(x->data);
    free(x->ref);
}

/* How a case's tensors are cut: the padded layout's sequence, or the
 * packed documents' pieces (cu_q, cu_k over batch documents; varlen). */
typedef struct shard_rule {
    aj_shard_layout layout;
    aj_cp_method method;
    const int32_t *cu_q, *cu_k;
    int32_t batch;
} shard_rule;

/* Rank who's length of a sequence of `seq` (of keys: `keys`). */
static int64_t rank_len(const shard_rule *r, int who, int keys, int64_t seq)
{
    if (!r->cu_q)
        return aj_shard_length(r->layout, who, size, seq);
    int32_t n = 0;
    int64_t len = 0;
    CHECK_STATUS(ctx, aj_shard_varlen_chunks(ctx, r->method, r->layout, who, size,
                                             keys ? r->cu_k : r->cu_q, r->batch, NULL, 0, &n,
                                             &len), AJ_OK);
    return len;
}

static int64_t shard_len(const shard_rule *r, int keys, int64_t seq)
{
    return rank_len(r, rank, keys, seq);
}

/* The positions of group g of U ranks (Ulysses: U = P, the whole
 * sequence; the ring: U = 1, one rank's), and the longest group's: the
 * block slot of a ring over the groups. */
static int64_t group_length(const shard_rule *r, int g, int U, int keys, int64_t seq)
{
    int64_t n = 0;
    for (int u = 0; u < U; u++)
        n += rank_len(r, g * U + u, keys, seq);
    return n;
}

static int64_t longest_group(const shard_rule *r, int U, int keys, int64_t seq)
{
    int64_t most = 0;
    for (int g = 0; g < size / U; g++) {
        const int64_t n = group_length(r, g, U, keys, seq);
        most = n > most ? n : most;
    }
    return most;
}

/* This rank's contiguous shard of a full tensor of H heads, seq positions
 * and W wide (W = 0: an LSE): padded [1, H, seq, W], varlen [seq, H, W]
 * (an LSE [1, H, seq] either way). */
static void *take_shard(const shard_rule *r, int keys, const void *full, int64_t H,
                        int64_t seq, int64_t W, size_t elem)
{
    const int packed = r->cu_q && W;
    const aj_seq_shape shape = {packed ? 1 : H, seq, packed ? H * W : (W ? W : 1), elem};
    void *s = alloc64((size_t)(H * shard_len(r, keys, seq) * (W ? W : 1)) * elem);
    if (r->cu_q)
        CHECK_STATUS(ctx, aj_shard_varlen(ctx, r->method, r->layout, rank, size,
                                          keys ? r->cu_k : r->cu_q, r->batch, &shape, full, s),
                     AJ_OK);
    else
        CHECK_STATUS(ctx, aj_shard(ctx, r->layout, rank, size, &shape, full, s), AJ_OK);
    return s;
}

/* ---------------------------------------------------------------- device memory */

/*
 * On cuda ranks (generated-cuda: the stand-in libcuda and libnccl, with
 * emulated launches) what the calls read and write lives in device
 * memory: each host buffer a call is handed gets a mirror there
 * (on_device copies it in), and after each call every mirror is copied
 * back (from_devices), so the checks read what the GPU path left.  Sim and
 * cpu ranks take host memory in place.
 */
static int on_gpu;
typedef struct mirror {
    void *host, *dev;
    size_t bytes;
} mirror;
static mirror mirrors[32];
static int num_mirrors;

static void *on_device(void *host, size_t bytes)
{
    if (!on_gpu || !host)
        return host;
    for (int i = 0; i < num_mirrors; i++)
        if (mirrors[i].host == host)
            return mirrors[i].dev;
    CHECK(num_mirrors < (int)(sizeof mirrors / sizeof mirrors[0]));
    mirror *m = &mirrors[num_mirrors++];
    *m = (mirror){host, NULL, bytes};
    CHECK_STATUS(ctx, aj_device_alloc(dev, bytes ? bytes : 1, &m->dev), AJ_OK);
    CHECK_STATUS(ctx, aj_device_copy_to(dev, m->dev, host, bytes), AJ_OK);
    return m->dev;
}

/* On cuda ranks every other case passes the ring a stream of the test's
 * own (aj_ring_fwd_args.stream): the cases the comm runs on the device
 * alone are then asynchronous, the others wait for it first; the results
 * are read after the stream's work (the stand-in's stream-order model
 * checks that the call ordered the stream after its own). */
static void *caller_stream;
static int cases_run;

static void *case_stream(void)
{
    if (!on_gpu || cases_run++ % 2 == 0)
        return NULL;
    if (!caller_stream)
        CHECK_STATUS(ctx, aj_device_stream_create(dev, &caller_stream), AJ_OK);
    return caller_stream;
}

static void from_devices(void)
{
    for (int i = 0; i < num_mirrors; i++)
        CHECK_STATUS(ctx, aj_device_copy_from(dev, mirrors[i].host, mirrors[i].dev,
                                              mirrors[i].bytes), AJ_OK);
}

static void from_devices_after(void *stream)
{
    if (stream)
        CHECK_STATUS(ctx, aj_device_synchronize(dev, stream), AJ_OK);
    from_devices();
}

static void free_mirrors(void)
{
    for (int i = 0; i < num_mirrors; i++)
        CHECK_STATUS(ctx, aj_device_free(dev, mirrors[i].dev), AJ_OK);
    num_mirrors = 0;
}

/* A shard's tensor as the call takes it: padded [1, H, l, W] (LSE, W = 0:
 * [1, H, l]), varlen [l, H, W] (LSE [H, l]); on cuda ranks, over its
 * mirror in device memory. */
static aj_tensor rows_view(const ring_case *c, void *data, aj_dtype dtype, int64_t H, int64_t l,
                           int64_t W)
{
    data = on_device(data, (size_t)(H * l * (W ? W : 1)) * (dtype == AJ_DTYPE_F32 ? 4 : 2));
    if (c->docs)
        return W ? tensor_dims(data, dtype, 3, l, H, W, 0)
                 : tensor_dims(data, dtype, 2, H, l, 0, 0);
    return W ? tensor_dims(data, dtype, 4, 1, H, l, W) : tensor_dims(data, dtype, 3, 1, H, l, 0);
}

static double max_abs(const double *x, size_t n)
{
    double mx = 0;
    for (size_t i = 0; i < n; i++)
        mx = fmax(mx, fabs(x[i]));
    return mx;
}

/* max |got - ref| / (atol + rtol max |full ref|) over a shard, relative to
 * the whole tensor's magnitude (a shard of a few positions can be all
 * small values); NaN fails. */
static double shard_error(const void *got, aj_dtype dtype, const double *ref, size_t n,
                          double atol, double rtol, double full_max)
{
    float *f = malloc((n + 1) * sizeof *f);
    aj_convert(got, dtype, f, AJ_DTYPE_F32, n);
    double err = 0;
    for (size_t i = 0; i < n; i++) {
        double e = fabs((double)f[i] - ref[i]);
        if (!(e <= err))
            err = isnan(e) ? INFINITY : e;
    }
    free(f);
    return err / (atol + rtol * full_max);
}

/* LSE: element by element, -inf where the reference has it. */
static int lse_matches(const float *got, const double *ref, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        if (isinf(ref[i])) {
            if (!(isinf(got[i]) && got[i] < 0))
                return 0;
        } else if (!(fabs(got[i] - ref[i]) <= 1e-4 + 1e-5 * fabs(ref[i]))) {
            return 0;
        }
    }
    return 1;
}

static void tolerance_for(aj_dtype dtype, double *atol, double *rtol)
{
    /* as the single-rank tests: the dtype's storage rounding; the ring
     * adds f32 accumulation of the parts only */
    ref_storage_tolerance(dtype, atol, rtol);
}

/* ---------------------------------------------------------------- blocks */

/* The ranks a ring rank stands for: hybrid's U (the ring runs across
 * its groups), else 1. */
static int ring_members(const ring_case *c)
{
    return c->method == AJ_METHOD_HYBRID ? c->ulysses_size : 1;
}

/* The global positions of ring rank r's chunks, starts[] and lens[]: the
 * sequence dealt out into n chunks (P contiguous, 2P zigzag), the first
 * seq % n one position longer; a hybrid group's runs of U of them. */
static int chunks_of(const ring_case *c, int r, int64_t seq, int64_t starts[2], int64_t lens[2])
{
    const int n = c->layout == AJ_SHARD_ZIGZAG ? 2 * size : size, U = ring_members(c);
    const int first[2] = {r * U, n - r * U - U};
    int64_t at = 0;
    lens[0] = lens[1] = 0;
    for (int chunk = 0; chunk < n; chunk++) {
        const int64_t len = seq / n + (chunk < seq % n);
        for (int w = 0; w < 2; w++)
            if (chunk >= first[w] && chunk < first[w] + U) {
                if (chunk == first[w])
                    starts[w] = at;
                lens[w] += len;
            }
        at += len;
    }
    return c->layout == AJ_SHARD_ZIGZAG ? 2 : 1;
}

/* The blocks rank r launches against rank src's K/V, added to *full,
 * *partial, *skipped: each (Q chunk, K/V chunk) pair, position by
 * position (and head by head). */
static void pair_classes(const ring_case *c, const ref_problem *pr, int r, int src, int *full,
                         int *partial, int *skipped)
{
    int64_t qs[2], ks[2], ql[2], kl[2];
    /* packed documents: each document's pieces, pairs of pieces only
     * within a document, and no pair with an empty piece */
    for (int d = 0; d < (pr->cu_q ? pr->B : 1); d++) {
        const int64_t sq = pr->cu_q ? pr->cu_q[d + 1] - pr->cu_q[d] : pr->Sq;
        const int64_t sk = pr->cu_k ? pr->cu_k[d + 1] - pr->cu_k[d] : pr->Sk;
        const int nq = chunks_of(c, r, sq, qs, ql), nk = chunks_of(c, src, sk, ks, kl);
        for (int a = 0; a < nq; a++)
            for (int b = 0; b < nk; b++) {
                if (pr->cu_q && (ql[a] == 0 || kl[b] == 0))
                    continue;
                /* a mask that reads h: skipped where every head skips,
                 * full where every head sees all */
                int none = 1, all = 1;
                for (int64_t h = 0; h < (c->head_mask ? pr->Hq : 1); h++) {
                    int64_t seen = 0;
                    for (int64_t i = qs[a]; i < qs[a] + ql[a]; i++)
                        for (int64_t j = ks[b]; j < ks[b] + kl[b]; j++)
                            seen += ref_visible(pr, d, h, i, j);
                    none &= seen == 0;
                    all &= seen == ql[a] * kl[b];
                }
                if (none)
                    ++*skipped;
                else if (all)
                    ++*full;
                else
                    ++*partial;
            }
    }
}

/* The blocks this rank launches over every step. */
static void expected_blocks(const ring_case *c, const ref_problem *pr, int *full, int *partial,
                            int *skipped)
{
    *full = *partial = *skipped = 0;
    for (int src = 0; src < size; src++)
        pair_classes(c, pr, rank, src, full, partial, skipped);
}

/* Whether rank r sees any key of rank o's block. */
static int needs_block(const ring_case *c, const ref_problem *pr, int r, int o)
{
    int full = 0, partial = 0, skipped = 0;
    pair_classes(c, pr, r, o, &full, &partial, &skipped);
    return r == o || full + partial > 0;
}

/*
 * Packed documents on the ring's message paths (p2p over messages,
 * all-gather): what this rank sends and how many exchanges it posts,
 * forward [0] and backward [1], from which ranks need which blocks
 * (docs/ring.md).  A block is a slot of the longest key shard, lk_max
 * positions of H_kv heads, K and V: `kv` bytes in the op's dtype, `dkv`
 * as f32 dK/dV.
 *
 *   p2p        block o travels o -> o+1 -> ... as far as the furthest
 *              rank that needs it (reach); the backward's parts go home
 *              directly, one per (rank, block needed) pair
 *   all-gather one all-to-all of the blocks needed (and one of the parts)
 *
 * Hybrid: the ring across the R = P / U groups, ring rank r / U, on
 * H_kv / U heads, after the call's own agreement (the ring makes none).
 */
static void varlen_ring_traffic(const ring_case *c, const ref_problem *pr, int64_t lk_max,
                                uint64_t sent[2], int rotations[2], uint64_t every[2])
{
    const int U = ring_members(c), P = size / U, r = rank / U;
    const uint64_t agree = U == 1 ? sizeof(aj_cp_call) : 0;
    int need[4][4], reach[4] = {0};
    for (int a = 0; a < P; a++)
        for (int o = 0; o < P; o++) {
            need[a][o] = needs_block(c, pr, a, o);
            if (need[a][o] && (a - o + P) % P > reach[o])
                reach[o] = (a - o + P) % P;
        }
    const uint64_t kv = (uint64_t)(c->hkv / U * lk_max * 2 * HEAD_DIM) * elem_size(c->dtype);
    const uint64_t dkv = (uint64_t)(c->hkv / U * lk_max * 2 * HEAD_DIM) * 4;
    int kv_sends = 0, kv_posts = 0, part_sends = 0, part_posts = 0;
    for (int s = 0; s < P; s++) {
        const int mine = (r - s + P) % P, prev = (r - 1 - s + 2 * P) % P, home = mine;
        const int from = (r + s) % P;
        if (c->rotate == AJ_ROTATE_P2P) {
            kv_sends += s < P - 1 && reach[mine] > s;
            kv_posts += s < P - 1 && (reach[mine] > s || reach[prev] > s);
            part_posts += s > 0 && (need[r][home] || need[from][r]);
        } else {
            kv_sends += s > 0 && need[from][r];
        }
        part_sends += s > 0 && need[r][home];
    }
    const int p2p = c->rotate == AJ_ROTATE_P2P, collectives = P > 1;
    rotations[0] = p2p ? kv_posts : collectives;
    rotations[1] = p2p ? kv_posts + part_posts : 2 * collectives;
    sent[0] = kv_sends * kv + (uint64_t)(P - 1) * agree;
    sent[1] = sent[0] + part_sends * dkv;
    /* for comparison: the padded rule, every block to every rank (p2p:
     * P - 1 K/V and P dK/dV exchanges) */
    every[0] = (uint64_t)(P - 1) * (kv + agree);
    every[1] = every[0] + (uint64_t)(p2p ? P : P - 1) * dkv;
}

/* aj_ring_plan's classes are the ring's: as many launches, full and
 * skipped pairs as the call counted -- hybrid's across its groups (as
 * members U, the group's index and count, this rank's heads from its
 * offset) and packed documents' too. */
static void check_plan(const ring_case *c, const aj_op *op, const aj_ring_fwd_args *fa,
                       const aj_ring_stats *s)
{
    const int U = ring_members(c), varlen = c->docs != NULL;
    aj_ring_plan_args a = AJ_RING_PLAN_ARGS_INIT;
    a.layout = c->layout;
    a.rotate = c->rotate;
    a.rank = rank / U;
    a.size = size / U;
    a.members = U;
    a.batch = varlen ? fa->batch : fa->q.shape[0];
    a.heads_q = c->hq / U;
    a.head_offset = rank % U * a.heads_q;
    a.seq_q = varlen ? 0 : fa->q.shape[2];
    a.seq_k = varlen ? 0 : fa->k.shape[2];
    a.cu_seqlens_q = fa->cu_seqlens_q;
    a.cu_seqlens_k = fa->cu_seqlens_k;
    a.alibi_slopes = fa->alibi_slopes;
    a.side = fa->side;
    a.num_side = fa->num_side;
    enum { CAP = 512 };
    aj_ring_pair pairs[CAP];
    int32_t count = 0, n[AJ_RING_BLOCK_COUNT] = {0};
    CHECK_STATUS(ctx, aj_ring_plan(ctx, dev, op, &a, pairs, CAP, &count), AJ_OK);
    for (int i = 0; i < count && i < CAP; i++) {
        n[pairs[i].block]++;
        /* a document's pairs: its own pieces, within its lengths */
        if (varlen) {
            const int32_t d = pairs[i].doc, len = c->docs[d];
            CHECK_MSG(d >= 0 && d < fa->batch && pairs[i].q.len > 0 && pairs[i].k.len > 0 &&
                          pairs[i].q.global + pairs[i].q.len <= len &&
                          pairs[i].k.global + pairs[i].k.len <= len,
                      "rank %d: %s: pair %d of document %d: q %lld+%lld, k %lld+%lld", rank,
                      c->label, i, d, (long long)pairs[i].q.global, (long long)pairs[i].q.len,
                      (long long)pairs[i].k.global, (long long)pairs[i].k.len);
        } else {
            CHECK(pairs[i].doc == 0);
        }
    }
    CHECK_MSG(count <= CAP && n[AJ_RING_BLOCK_FULL] == s->full_blocks &&
                  n[AJ_RING_BLOCK_PARTIAL] == s->partial_blocks &&
                  n[AJ_RING_BLOCK_SKIP] == s->skipped_blocks,
              "rank %d: %s: aj_ring_plan full/partial/skipped %d/%d/%d, the ring's %d/%d/%d",
              rank, c->label, n[AJ_RING_BLOCK_FULL], n[AJ_RING_BLOCK_PARTIAL],
              n[AJ_RING_BLOCK_SKIP], s->full_blocks, s->partial_blocks, s->skipped_blocks);
}

/* The ring's rotations and launches: every block pair classified by
 * brute force over its positions; skipped pairs must not be launched. */
static void check_ring_blocks(const ring_case *c, const ref_problem *pr, const aj_ring_stats *fs)
{
    int full, partial, skipped;
    expected_blocks(c, pr, &full, &partial, &skipped);
    const int p2p = c->rotate == AJ_ROTATE_P2P;
    /* (packed documents over messages, the cuda ranks': run_case checks
     * them against the blocks needed) */
    CHECK_MSG((c->docs && p2p && on_gpu) || fs->rotations == (p2p ? size - 1 : size > 1),
              "rank %d: %s: %d forward rotations", rank, c->label, fs->rotations);
    /* a mask over positions has exact classes; one that reads a side
     * tensor sound ones (a skipped block sees nothing, a full one all) */
    const int exact = !c->doc_len && !c->mask_expr;
    CHECK_MSG(fs->launches == fs->full_blocks + fs->partial_blocks &&
                  fs->launches + fs->skipped_blocks == full + partial + skipped &&
                  (exact ? fs->full_blocks == full && fs->skipped_blocks == skipped
                         : fs->full_blocks <= full && fs->skipped_blocks <= skipped),
              "rank %d: %s: blocks full/partial/skipped %d/%d/%d, want %d/%d/%d", rank,
              c->label, fs->full_blocks, fs->partial_blocks, fs->skipped_blocks, full, partial,
              skipped);
}

/* The bytes a Ulysses or hybrid call sends from this rank (docs/ring.md):
 * the opening agreement, then each all-to-all's parts for the other
 * members of the rank's group of U -- in, this rank's positions of the
 * other members' heads; out, the other members' positions of this rank's
 * heads.  Hybrid adds the p2p ring across the R = P / U groups: K/V blocks
 * of H_kv / U heads in slots of the longest group's length, R - 1 of them
 * forward; backward R - 1 of them and R f32 dK/dV blocks; over packed
 * documents (varlen_sent, else NULL) what varlen_ring_traffic gives. */
static uint64_t cp_bytes(const ring_case *c, const shard_rule *rule, int64_t sq, int64_t sk,
                         int backward, const uint64_t *varlen_sent)
{
    const int64_t e = (int64_t)elem_size(c->dtype), D = HEAD_DIM, B = 1, P = size;
    const int U = c->method == AJ_METHOD_HYBRID ? c->ulysses_size : size, R = size / U;
    const int64_t lq = shard_len(rule, 0, sq), lk = shard_len(rule, 1, sk);
    const int64_t gq = group_length(rule, rank / U, U, 0, sq);
    const int64_t gk = group_length(rule, rank / U, U, 1, sk);
    /* bytes per position and group-sized head group: q-like and k-like */
    const int64_t q_in = backward ? c->hq * (3 * D * e + 4) : c->hq * D * e;
    const int64_t q_out = backward ? c->hq * D * e : c->hq * (D * e + 4);
    const int64_t k_in = c->hkv * 2 * D * e, k_out = backward ? c->hkv * 2 * D * e : 0;
    const int64_t in = B * (U - 1) * (lq * q_in + lk * k_in) / U;
    const int64_t out = B * ((gq - lq) * q_out + (gk - lk) * k_out) / U;
    const int64_t block = B * (c->hkv / U) * longest_group(rule, U, 1, sk) * 2 * D;
    const int64_t ring = varlen_sent ? (int64_t)varlen_sent[backward]
                         : R == 1   ? 0
                                    : (R - 1) * block * e + (backward ? R * block * 4 : 0);
    return (uint64_t)(in + out + ring) + (uint64_t)(P - 1) * sizeof(aj_cp_call);
}

/* An MPI comm over every rank with the timeout (s). */
static aj_comm *open_comm(double timeout_s)
{
    aj_comm *comm = NULL;
    aj_comm_config cc = AJ_COMM_CONFIG_INIT;
    cc.timeout_s = timeout_s;
    if (on_gpu)
        cc.kind = AJ_COMM_NCCL;
    CHECK_STATUS(ctx, aj_comm_create(ctx, dev, &cc, &comm), AJ_OK);
    return comm;
}

/* ---------------------------------------------------------------- a case */

/* Whether the case checks rel's gradient (docs/ir.md "Gradients of side
 * tensors"; dropout's keep mask in dS): wherever it reads rel. */
static bool rel_grad(const ring_case *c)
{
    return c->rel;
}

/* x[0 .. n) rounded to dtype (as a kernel stores it), malloc'd. */
static double *rounded(const double *x, size_t n, aj_dtype dtype)
{
    double *out = malloc((n + 1) * sizeof *out);
    float *f = malloc((n + 1) * sizeof *f);
    uint16_t *h = malloc((n + 1) * sizeof *h);
    for (size_t i = 0; i < n; i++)
        f[i] = (float)x[i];
    if (dtype != AJ_DTYPE_F32) {
        CHECK(aj_convert(f, AJ_DTYPE_F32, h, dtype, n) == AJ_OK);
        CHECK(aj_convert(h, dtype, f, AJ_DTYPE_F32, n) == AJ_OK);
    }
    for (size_t i = 0; i < n; i++)
        out[i] = f[i];
    free(f);
    free(h);
    return out;
}

/* What a side tensor's reference gradient is made from. */
typedef struct ref_inputs {
    const double *q, *k, *v, *o, *lse, *dout;
    size_t o_count;
    aj_dtype dtype;
} ref_inputs;

/* got[0 .. n) against the reference's gradient of side tensor `tensor`
 * (ref_side_grad), made from O as stored (the backward's rowsum(dO O)):
 * within the dtype's tolerance of the largest, plus four times the
 * spread rounding O makes (exact O against stored O).  The kernel's O,
 * from the ring's forward, is an ulp or so from the reference's stored
 * one, elements in any direction, and a gradient's terms weigh each row's
 * Delta (by distances up to S for a slope) with little to cancel it:
 * documents of one key make dS = dP - Delta pure rounding. */
static void check_side_grad(const ring_case *c, const ref_problem *pr, const ref_inputs *in,
                            int tensor, const float *got, int n, const char *name)
{
    double atol, rtol, want[16 * 9], exact[16 * 9], *o_st = rounded(in->o, in->o_count, in->dtype);
    tolerance_for(in->dtype, &atol, &rtol);
    ref_side_grad(pr, in->q, in->k, in->v, o_st, in->lse, in->dout, tensor, want);
    ref_side_grad(pr, in->q, in->k, in->v, in->o, in->lse, in->dout, tensor, exact);
    free(o_st);
    double mx = 0, e = 0;
    for (int i = 0; i < n; i++)
        mx = fmax(mx, fabs(want[i]));
    for (int i = 0; i < n; i++)
        e = fmax(e, fabs(got[i] - want[i]) /
                        (atol + rtol * mx + 4 * fabs(exact[i] - want[i]) + 1e-3));
    CHECK_MSG(e <= 1.0, "rank %d: %s: %s error %.3g of the tolerance", rank, c->label, name, e);
}

/* Whether it checks alibi's slopes' gradient (score_mod = alibi(grad)):
 * wherever it has alibi. */
static bool alibi_grad(const ring_case *c)
{
    return c->alibi;
}

/* What a backward's all-gathers of the sinks', rel's and the slopes'
 * gradients send from this rank (aside from the methods' own traffic). */
static uint64_t grad_gather_bytes(const ring_case *c)
{
    /* cuda ranks over NCCL sum on the device, each gradient gathered as
     * whole rows of 8 f32 (cp/common.c: rank_sum_device) */
    const uint64_t row = on_gpu ? 8 : 1, hq = (uint64_t)c->hq;
    const uint64_t each[3] = {c->sinks ? hq : 0, rel_grad(c) ? hq * 9 : 0,
                              alibi_grad(c) ? hq : 0};
    uint64_t floats = 0;
    for (int i = 0; i < 3; i++)
        floats += (each[i] + row - 1) / row * row;
    return (uint64_t)(size - 1) * floats * 4;
}

static aj_op *parse_op(const ring_case *c, const char *kind)
{
    char mask[96], text[512];
    if (c->mask == AJ_MASK_CAUSAL)
        snprintf(mask, sizeof mask, "causal(%s)",
                 c->align == AJ_ALIGN_BOTTOM_RIGHT ? "bottom_right" : "top_left");
    else if (c->mask == AJ_MASK_WINDOW)
        snprintf(mask, sizeof mask, "window(%lld, %lld%s)", (long long)c->left,
                 (long long)c->right, c->align == AJ_ALIGN_BOTTOM_RIGHT ? ", bottom_right" : "");
    else if (c->mask_expr)
        snprintf(mask, sizeof mask, "expr(%s)", c->mask_expr);
    else
        snprintf(mask, sizeof mask, "%s",
                 c->doc_len ? DOC_MASK : c->head_mask ? HEAD_MASK : "none");
    char tensors[96] = "";
    /* the backward of a padded op without dropout: rel's gradient too */
    const char *rel = strcmp(kind, "backward") == 0 && rel_grad(c) ? "rel: f32[2] grad"
                                                                   : "rel: f32[2]";
    if (c->doc_len || c->rel || c->sinks)
        snprintf(tensors, sizeof tensors, "tensors = (%s%s%s%s%s)%s",
                 c->doc_len ? "doc: i32[2]" : "", c->doc_len && c->rel ? ", " : "",
                 c->rel ? rel : "", (c->doc_len || c->rel) && c->sinks ? ", " : "",
                 c->sinks ? "snk: f32[1]" : "", c->sinks ? " sinks = snk" : "");
    snprintf(text, sizeof text, "attention %s %s { dtype = %s head_dim = %d %s mask = %s "
             "score_mod = %s dropout = %g layout = %s }", kind, c->flash ? "flash" : "efficient",
             aj_dtype_name(c->dtype), HEAD_DIM, tensors, mask,
             c->alibi ? strcmp(kind, "backward") == 0 && alibi_grad(c) ? "alibi(grad)" : "alibi"
                      : c->rel ? REL_BIAS : "none", c->dropout,
             c->docs ? "varlen" : "padded");
    aj_op *op = NULL;
    CHECK_STATUS(ctx, aj_op_parse(ctx, text, strlen(text), c->label, &op), AJ_OK);
    return op;
}

/* A ring call's bytes over shared segments: the opening agreement's only. */
static uint64_t agreement_bytes(void)
{
    return (uint64_t)(size - 1) * sizeof(aj_cp_call);
}

/* The comm keeps the kernels of its recent ring calls: the case's op with
 * another scale (a forward on the same comm) compiles its own, and
 * computes another O or LSE than the case's (documents of length 1: the
 * same O, V's rows). */
static void check_other_op(const ring_case *c, aj_comm *comm, const aj_op *fop,
                           const aj_ring_fwd_args *fa)
{
    aj_op *other = NULL;
    CHECK_STATUS(ctx, aj_op_clone(fop, &other), AJ_OK);
    CHECK_STATUS(ctx, aj_op_set_scale(other, 0.3), AJ_OK);
    aj_ring_fwd_args f = *fa;
    const size_t o_bytes = tensor_bytes(&fa->o), lse_bytes = tensor_bytes(&fa->lse);
    f.o.data = alloc64(o_bytes);
    f.lse.data = alloc64(lse_bytes);
    aj_ring_stats s = {0};
    CHECK_STATUS(ctx, aj_ring_forward(ctx, dev, comm, other, &f, &s), AJ_OK);
    const int differs = memcmp(f.o.data, fa->o.data, o_bytes) != 0 ||
                        memcmp(f.lse.data, fa->lse.data, lse_bytes) != 0;
    CHECK_MSG(s.compile_s > 0 && (o_bytes == 0 || differs), "rank %d: %s: scale 0.3 took the "
              "case's kept kernels", rank, c->label);
    free(f.o.data);
    free(f.lse.data);
    aj_op_destroy(other);
}

/* The case's forward and backward again with messages instead of shared
 * segments (what the ring does across nodes, comm->messages_only): results
 * bit for bit the same; the shared calls (fwd_sent, bwd_sent) sent nothing
 * but their agreements, the message calls their blocks: padded, in as
 * many rotations as the shared calls; packed documents (traffic, else
 * NULL), the bytes and exchanges varlen_ring_traffic gives. */
typedef struct ring_traffic {
    uint64_t sent[2];
    int rotations[2];
    uint64_t every[2];           /* what moving every block would send */
} ring_traffic;

static void check_message_path(const ring_case *c, aj_comm *comm, aj_op *fop, aj_op *bop,
                               const aj_ring_fwd_args *fa, const aj_ring_bwd_args *ba,
                               const aj_ring_stats *fs, const aj_ring_stats *bs,
                               uint64_t fwd_sent, uint64_t bwd_sent, const ring_traffic *traffic)
{
    aj_ring_fwd_args f = *fa;
    aj_ring_bwd_args b = *ba;
    const aj_tensor *shared[5] = {&fa->o, &fa->lse, &ba->dq, &ba->dk, &ba->dv};
    aj_tensor *msg[5] = {&f.o, &f.lse, &b.dq, &b.dk, &b.dv};
    size_t bytes[5];
    for (int t = 0; t < 5; t++) {
        bytes[t] = tensor_bytes(shared[t]);
        msg[t]->data = alloc64(bytes[t]);
    }
    aj_ring_stats fm = {0}, bm = {0};
    comm->messages_only = true;
    const uint64_t before = aj_comm_bytes_sent(comm);
    CHECK_STATUS(ctx, aj_ring_forward(ctx, dev, comm, fop, &f, &fm), AJ_OK);
    const uint64_t fwd_msg = aj_comm_bytes_sent(comm) - before;
    CHECK_STATUS(ctx, aj_ring_backward(ctx, dev, comm, bop, &b, &bm), AJ_OK);
    const uint64_t bwd_msg = aj_comm_bytes_sent(comm) - before - fwd_msg - grad_gather_bytes(c);
    comm->messages_only = false;
    static const char *const names[5] = {"O", "LSE", "dQ", "dK", "dV"};
    for (int t = 0; t < 5; t++) {
        CHECK_MSG(memcmp(msg[t]->data, shared[t]->data, bytes[t]) == 0, "rank %d: %s: %s over "
                  "messages differs from %s over shared memory", rank, c->label, names[t],
                  names[t]);
        free(msg[t]->data);
    }
    CHECK_MSG(fm.compile_s == 0 && bm.compile_s == 0, "rank %d: %s: the comm's kept kernels "
              "were compiled again (%g + %g s)", rank, c->label, fm.compile_s, bm.compile_s);
    if (traffic)
        CHECK_MSG(fwd_msg == traffic->sent[0] && bwd_msg == traffic->sent[1] &&
                      fm.rotations == traffic->rotations[0] &&
                      bm.rotations == traffic->rotations[1],
                  "rank %d: %s: over messages sent %llu + %llu bytes in %d + %d exchanges; "
                  "the formula %llu + %llu in %d + %d", rank, c->label,
                  (unsigned long long)fwd_msg, (unsigned long long)bwd_msg, fm.rotations,
                  bm.rotations, (unsigned long long)traffic->sent[0],
                  (unsigned long long)traffic->sent[1], traffic->rotations[0],
                  traffic->rotations[1]);
    if (traffic && rank == 0)
        printf("  rank 0 over messages: forward %llu of %llu bytes (%.2f), backward %llu of "
               "%llu (%.2f) that moving every block sends\n", (unsigned long long)fwd_msg,
               (unsigned long long)traffic->every[0], (double)fwd_msg / traffic->every[0],
               (unsigned long long)bwd_msg, (unsigned long long)traffic->every[1],
               (double)bwd_msg / traffic->every[1]);
    if (!traffic)
        CHECK_MSG(fm.rotations == fs->rotations && bm.rotations == bs->rotations, "rank %d: "
                  "%s: rotations %d + %d over messages, %d + %d shared", rank, c->label,
                  fm.rotations, bm.rotations, fs->rotations, bs->rotations);
    CHECK_MSG(fwd_sent == agreement_bytes() && bwd_sent == agreement_bytes() &&
                  (traffic || aj_comm_bytes_sent(comm) - before > 2 * agreement_bytes()),
              "rank %d: %s: shared calls sent %llu + %llu bytes, message calls %llu", rank,
              c->label, (unsigned long long)fwd_sent, (unsigned long long)bwd_sent,
              (unsigned long long)(aj_comm_bytes_sent(comm) - before));
}

/* On cuda ranks (resident: NCCL), the ring call just made moved no
 * attention data between host and device (stand_in_cuda.h): each copy at
 * most the opening agreement's records, or one of the values the ring
 * classes its blocks by (a side tensor, alibi's slopes, the documents'
 * offsets), or a step's per-document offsets where packed documents
 * launch per document (cp/ring.c: stage_doc_cu; at most (docs + 2)^2
 * pairs of 2 (docs + 1) int32, a loose bound). */
static void check_resident_call(const ring_case *c, const char *call, const aj_side_tensor *side,
                                int nside, int ndocs)
{
    if (!on_gpu)
        return;
    const size_t cu_bytes = ndocs ? (size_t)((ndocs + 2) * (ndocs + 2) * 2 * (ndocs + 1)) * 4
                                  : 0;
    size_t limit = (size_t)size * sizeof(aj_cp_call), slopes = (size_t)c->hq * 4;
    limit = limit > slopes ? limit : slopes;
    limit = limit > cu_bytes ? limit : cu_bytes;
    for (int i = 0; i < nside; i++) {
        size_t bytes = 4;
        for (int d = 0; d < side[i].rank; d++)
            bytes *= (size_t)side[i].shape[d];
        limit = limit > bytes ? limit : bytes;
    }
    char what[192];
    snprintf(what, sizeof what, "rank %d: %s: %s", rank, c->label, call);
    stand_in_check_small_copies(what, limit);
}

static void run_case(const ring_case *c)
{
    const aj_dtype dt = c->dtype;
    const size_t es = elem_size(dt);
    const int64_t B = 1, D = HEAD_DIM;
    /* varlen: the packed documents' offsets (queries and keys alike) */
    int32_t cu[16] = {0}, ndocs = 0;
    for (; c->docs && c->docs[ndocs]; ndocs++)
        cu[ndocs + 1] = cu[ndocs] + c->docs[ndocs];
    const int64_t sq = c->docs ? cu[ndocs] : c->sq_total ? c->sq_total : (int64_t)c->lq * size;
    const int64_t sk = c->docs ? cu[ndocs] : c->sk_total ? c->sk_total : (int64_t)c->lk * size;
    uint64_t rng = 0x5eed0000u + (uint64_t)sq * 131 + (uint64_t)sk + (uint64_t)c->mask * 7;
    full_tensor q, k, v, dout;
    make_full(&q, dt, (size_t)(B * c->hq * sq * D), &rng);
    make_full(&k, dt, (size_t)(B * c->hkv * sk * D), &rng);
    make_full(&v, dt, (size_t)(B * c->hkv * sk * D), &rng);
    make_full(&dout, dt, (size_t)(B * c->hq * sq * D), &rng);
    float slopes[8];
    double slopes_ref[8];
    for (int h = 0; h < c->hq; h++)
        slopes_ref[h] = slopes[h] = 0.25f * (float)(h + 1);
    /* the side tensors, whole on every rank: doc[0, t] = t / doc_len, rel
     * in [-1, 1] */
    aj_side_tensor side[3];
    int nside = 0;
    float snk[16];
    double snk_ref[16];
    for (int h = 0; h < c->hq; h++)   /* one that dominates, the rest among the scores */
        snk_ref[h] = snk[h] = h == 0 ? 4.0f : 0.5f - 0.25f * (float)h;
    int32_t *doc = alloc64((size_t)sq * 4);
    float *rel = alloc64((size_t)c->hq * 9 * 4);
    for (int64_t t = 0; t < sq; t++)
        doc[t] = c->doc_len ? (int32_t)(t / c->doc_len) : 0;
    for (int i = 0; i < c->hq * 9; i++)
        rel[i] = (float)((double)(splitmix_next(&rng) >> 11) * 0x1p-52 * 2.0 - 1.0);
    if (c->doc_len)
        side[nside++] = (aj_side_tensor){"doc", on_device(doc, (size_t)sq * 4), AJ_SIDE_I32, 2,
                                         {B, sq}, {sq, 1}};
    if (c->rel)
        side[nside++] = (aj_side_tensor){"rel", on_device(rel, (size_t)c->hq * 9 * 4),
                                         AJ_SIDE_F32, 2, {c->hq, 9}, {9, 1}};
    if (c->sinks)
        side[nside++] = (aj_side_tensor){"snk", on_device(snk, sizeof snk), AJ_SIDE_F32, 1,
                                         {c->hq}, {1}};
    aj_op *fop = parse_op(c, "forward"), *bop = parse_op(c, "backward");

    /* the reference, unsharded */
    ref_problem pr = {.B = c->docs ? ndocs : (int)B, .cu_q = c->docs ? cu : NULL,
                      .cu_k = c->docs ? cu : NULL, .Hq = c->hq, .Hkv = c->hkv, .D = (int)D, .Dv = (int)D,
                      .Sq = (int)sq, .Sk = (int)sk, .mask = c->mask, .align = c->align,
                      .window_left = c->left, .window_right = c->right,
                      .alibi_slopes = c->alibi ? slopes_ref : NULL,
                      .sinks = c->sinks ? snk_ref : NULL,
                      .dropout_p = c->dropout, .seed = 7, .offset = 3};
    if (nside || c->head_mask || c->mask_expr)
        ref_use_expressions(&pr, fop, side, nside);
    const size_t nq = q.n, nk = k.n, rows = (size_t)(B * c->hq * sq);
    double *o_ref = calloc(nq, sizeof(double)), *lse_ref = calloc(rows, sizeof(double));
    double *dq_ref = calloc(nq, sizeof(double)), *dk_ref = calloc(nk, sizeof(double));
    double *dv_ref = calloc(nk, sizeof(double));
    ref_forward(&pr, q.ref, k.ref, v.ref, o_ref, lse_ref);
    ref_backward(&pr, q.ref, k.ref, v.ref, o_ref, lse_ref, dout.ref, dq_ref, dk_ref, dv_ref,
                 NULL);

    /* this rank's shards */
    const aj_shard_layout L = c->layout;
    const shard_rule rule = {L, c->method, c->docs ? cu : NULL, c->docs ? cu : NULL, ndocs};
    const int64_t oq = B * c->hq, ok = B * c->hkv, hq = c->hq, hkv = c->hkv;
    const int64_t lq = shard_len(&rule, 0, sq), lk = shard_len(&rule, 1, sk);
    void *q_s = take_shard(&rule, 0, q.data, hq, sq, D, es);
    void *k_s = take_shard(&rule, 1, k.data, hkv, sk, D, es);
    void *v_s = take_shard(&rule, 1, v.data, hkv, sk, D, es);
    void *do_s = take_shard(&rule, 0, dout.data, hq, sq, D, es);
    double *o_ref_s = take_shard(&rule, 0, o_ref, hq, sq, D, 8);
    double *lse_ref_s = take_shard(&rule, 0, lse_ref, hq, sq, 0, 8);
    double *dq_ref_s = take_shard(&rule, 0, dq_ref, hq, sq, D, 8);
    double *dk_ref_s = take_shard(&rule, 1, dk_ref, hkv, sk, D, 8);
    double *dv_ref_s = take_shard(&rule, 1, dv_ref, hkv, sk, D, 8);
    const size_t nq_s = (size_t)(oq * lq * D), nk_s = (size_t)(ok * lk * D);
    void *o_s = alloc64(nq_s * es), *dq_s = alloc64(nq_s * es);
    void *dk_s = alloc64(nk_s * es), *dv_s = alloc64(nk_s * es);
    float *lse_s = alloc64((size_t)(oq * lq) * 4);

    aj_comm *comm = open_comm(60);

    aj_ring_fwd_args fa = AJ_RING_FWD_ARGS_INIT;
    fa.q = rows_view(c, q_s, dt, hq, lq, D);
    fa.k = rows_view(c, k_s, dt, hkv, lk, D);
    fa.v = rows_view(c, v_s, dt, hkv, lk, D);
    fa.o = rows_view(c, o_s, dt, hq, lq, D);
    fa.lse = rows_view(c, lse_s, AJ_DTYPE_F32, hq, lq, 0);
    if (c->docs) {
        fa.cu_seqlens_q = fa.cu_seqlens_k = on_device(cu, sizeof cu);
        fa.batch = ndocs;
    }
    fa.alibi_slopes = tensor_dims(on_device(slopes, sizeof slopes), AJ_DTYPE_F32, 1, c->hq, 0,
                                  0, 0);
    fa.layout = L;
    fa.rotate = c->rotate;
    fa.method = c->method;
    fa.ulysses_size = c->ulysses_size;
    fa.seed = 7;
    fa.offset = 3;
    fa.side = side;
    fa.num_side = nside;
    fa.stream = case_stream();
    aj_ring_stats fs = {0}, bs = {0};
    const uint64_t sent_before = aj_comm_bytes_sent(comm);
    stand_in_cuda_log_clear();
    CHECK_STATUS(ctx, aj_ring_forward(ctx, dev, comm, fop, &fa, &fs), AJ_OK);
    check_resident_call(c, "aj_ring_forward", side, nside, c->docs ? ndocs : 0);
    from_devices_after(fa.stream);
    const uint64_t fwd_sent = aj_comm_bytes_sent(comm) - sent_before;

    double atol, rtol;
    tolerance_for(dt, &atol, &rtol);
    double e = shard_error(o_s, dt, o_ref_s, nq_s, atol, rtol, max_abs(o_ref, nq));
    CHECK_MSG(e <= 1.0, "rank %d: %s: O error %.3g of the tolerance", rank, c->label, e);
    CHECK_MSG(lse_matches(lse_s, lse_ref_s, (size_t)(oq * lq)), "rank %d: %s: LSE differs",
              rank, c->label);

    const int ulysses = c->method == AJ_METHOD_ULYSSES, hybrid = c->method == AJ_METHOD_HYBRID;
    /* hybrid: an all-to-all each way in groups of U, p2p across R */
    const int U = c->ulysses_size, R = hybrid ? size / U : 0;
    /* packed documents on a ring (hybrid's across the groups): only the
     * blocks (and parts) a rank needs move */
    ring_traffic traffic = {{0}, {0}, {0}};
    if (c->docs && !ulysses)
        varlen_ring_traffic(c, &pr, longest_group(&rule, ring_members(c), 1, sk), traffic.sent,
                            traffic.rotations, traffic.every);
    const uint64_t *varlen_sent = c->docs && hybrid ? traffic.sent : NULL;
    if (ulysses)   /* one all-to-all each way, one launch over the whole sequence */
        CHECK_MSG(fs.rotations == 2 * (size > 1) && fs.launches == 1 &&
                      fs.skipped_blocks == 0, "rank %d: %s: %d forward all-to-alls, %d "
                  "launches", rank, c->label, fs.rotations, fs.launches);
    else if (hybrid)
        CHECK_MSG(fs.rotations == 2 * (U > 1) + (varlen_sent ? traffic.rotations[0] : R - 1),
                  "rank %d: %s: %d forward rotations", rank, c->label, fs.rotations);
    else
        check_ring_blocks(c, &pr, &fs);

    aj_ring_bwd_args ba = ring_bwd_args_after(&fa, rows_view(c, do_s, dt, hq, lq, D),
                                              rows_view(c, dq_s, dt, hq, lq, D),
                                              rows_view(c, dk_s, dt, hkv, lk, D),
                                              rows_view(c, dv_s, dt, hkv, lk, D));
    /* dsinks: every other head's element on zigzag cases (a strided output,
     * the gaps left as they were) */
    float dsinks[16];
    const int ds_stride = c->layout == AJ_SHARD_ZIGZAG ? 2 : 1;
    for (int i = 0; i < 16; i++)
        dsinks[i] = 1234.5f;
    if (c->sinks) {
        ba.dsinks = tensor_dims(on_device(dsinks, sizeof dsinks), AJ_DTYPE_F32, 1, c->hq, 0, 0,
                                0);
        ba.dsinks.strides[0] = ds_stride;
    }
    float *drel = alloc64((size_t)c->hq * 9 * 4), dslopes[16];
    aj_side_tensor dside[2];
    int ndside = 0;
    if (rel_grad(c))
        dside[ndside++] = (aj_side_tensor){"rel", on_device(drel, (size_t)c->hq * 9 * 4),
                                           AJ_SIDE_F32, 2, {c->hq, 9}, {9, 1}};
    if (alibi_grad(c))
        dside[ndside++] = (aj_side_tensor){"alibi_slopes", on_device(dslopes, sizeof dslopes),
                                           AJ_SIDE_F32, 1, {c->hq}, {1}};
    ba.dside = dside, ba.num_dside = ndside;
    stand_in_cuda_log_clear();
    CHECK_STATUS(ctx, aj_ring_backward(ctx, dev, comm, bop, &ba, &bs), AJ_OK);
    check_resident_call(c, "aj_ring_backward", side, nside, c->docs ? ndocs : 0);
    from_devices_after(ba.stream);
    /* (the all-gathers of the sinks', rel's and the slopes' gradients
     * aside: the methods' own traffic) */
    const uint64_t bwd_sent = aj_comm_bytes_sent(comm) - sent_before - fwd_sent -
                              grad_gather_bytes(c);
    /* the whole gradients, on every rank */
    const ref_inputs in = {q.ref, k.ref, v.ref, o_ref, lse_ref, dout.ref, nq, dt};
    if (alibi_grad(c))
        check_side_grad(c, &pr, &in, REF_ALIBI_SLOPES, dslopes, c->hq, "dalibi_slopes");
    if (rel_grad(c))
        check_side_grad(c, &pr, &in, nside - 1 - c->sinks, drel, c->hq * 9, "drel");
    if (c->sinks) {   /* the whole gradient, on every rank */
        double want_ds[16];
        ref_sinks_grad(&pr, o_ref, lse_ref, dout.ref, want_ds);
        e = 0;
        for (int h = 0; h < c->hq; h++)
            e = fmax(e, fabs(dsinks[h * ds_stride] - want_ds[h]) /
                            (atol + rtol * fabs(want_ds[h]) + 1e-3));
        CHECK_MSG(e <= 1.0, "rank %d: %s: dsinks error %.3g of the tolerance", rank, c->label,
                  e);
        for (int h = 0; ds_stride > 1 && h < c->hq; h++)
            CHECK_MSG(dsinks[h * ds_stride + 1] == 1234.5f, "rank %d: %s: dsinks written "
                      "between its strided elements", rank, c->label);
    }
    const char *names[3] = {"dQ", "dK", "dV"};
    const void *got[3] = {dq_s, dk_s, dv_s};
    const double *want[3] = {dq_ref_s, dk_ref_s, dv_ref_s};
    const size_t counts[3] = {nq_s, nk_s, nk_s};
    const double full_max[3] = {max_abs(dq_ref, nq), max_abs(dk_ref, nk), max_abs(dv_ref, nk)};
    for (int t = 0; t < 3; t++) {
        e = shard_error(got[t], dt, want[t], counts[t], atol, rtol, full_max[t]);
        CHECK_MSG(e <= 1.0, "rank %d: %s: %s error %.3g of the tolerance", rank, c->label,
                  names[t], e);
    }
    if (ulysses || hybrid) {
        if (ulysses)
            CHECK_MSG(bs.rotations == 2 * (size > 1) && bs.launches == 1, "rank %d: %s: %d "
                      "backward all-to-alls", rank, c->label, bs.rotations);
        else
            CHECK_MSG(bs.rotations == 2 * (U > 1) + (varlen_sent  ? traffic.rotations[1]
                                                     : R > 1 ? 2 * R - 1
                                                             : 0) &&
                          bs.launches == fs.launches && bs.skipped_blocks == fs.skipped_blocks,
                      "rank %d: %s: %d backward rotations", rank, c->label, bs.rotations);
        const uint64_t formula[2] = {cp_bytes(c, &rule, sq, sk, 0, varlen_sent),
                                     cp_bytes(c, &rule, sq, sk, 1, varlen_sent)};
        CHECK_MSG(fwd_sent == formula[0] && bwd_sent == formula[1], "rank %d: %s: sent %llu + "
                  "%llu bytes, the formula %llu + %llu", rank, c->label,
                  (unsigned long long)fwd_sent, (unsigned long long)bwd_sent,
                  (unsigned long long)formula[0], (unsigned long long)formula[1]);
    } else {
        const int p2p = c->rotate == AJ_ROTATE_P2P;
        if (c->docs && p2p && on_gpu && size > 1)   /* messages: only the needed blocks */
            CHECK_MSG(fwd_sent == traffic.sent[0] && bwd_sent == traffic.sent[1] &&
                          fs.rotations == traffic.rotations[0] &&
                          bs.rotations == traffic.rotations[1],
                      "rank %d: %s: sent %llu + %llu bytes in %d + %d exchanges; the formula "
                      "%llu + %llu in %d + %d", rank, c->label, (unsigned long long)fwd_sent,
                      (unsigned long long)bwd_sent, fs.rotations, bs.rotations,
                      (unsigned long long)traffic.sent[0], (unsigned long long)traffic.sent[1],
                      traffic.rotations[0], traffic.rotations[1]);
        else
            CHECK_MSG(bs.rotations == (p2p ? (size > 1 ? 2 * size - 1 : 0) : 2 * (size > 1)),
                      "rank %d: %s: %d backward rotations", rank, c->label, bs.rotations);
        if (c->docs && !p2p)
            CHECK_MSG(fwd_sent == traffic.sent[0] && bwd_sent == traffic.sent[1],
                      "rank %d: %s: all-gather sent %llu + %llu bytes, the formula %llu + "
                      "%llu", rank, c->label, (unsigned long long)fwd_sent,
                      (unsigned long long)bwd_sent, (unsigned long long)traffic.sent[0],
                      (unsigned long long)traffic.sent[1]);
        if (p2p && size > 1 && !(c->docs && on_gpu))
            CHECK(fs.rotations + bs.rotations == 3 * size - 2);
        if (on_gpu && !c->docs) {   /* messages: every block, each in a slot of the longest shard */
            const uint64_t P = (uint64_t)size;
            const uint64_t block = (uint64_t)(B * c->hkv * longest_group(&rule, 1, 1, sk) * 2 *
                                              D);
            const uint64_t agree = (P - 1) * sizeof(aj_cp_call);
            const uint64_t formula[2] = {(P - 1) * block * es + agree,
                                         (P - 1) * block * es + (p2p ? P : P - 1) * block * 4 +
                                             agree};
            CHECK_MSG(size == 1 || (fwd_sent == formula[0] && bwd_sent == formula[1]),
                      "rank %d: %s: sent %llu + %llu bytes, the formula %llu + %llu", rank,
                      c->label, (unsigned long long)fwd_sent, (unsigned long long)bwd_sent,
                      (unsigned long long)formula[0], (unsigned long long)formula[1]);
        }
        CHECK(bs.launches == fs.launches && bs.skipped_blocks == fs.skipped_blocks);
        /* cpu ranks, uneven shards (kept cheap: Sq = 2P+1, 5P+1; packed
         * documents' pieces): p2p over shared memory against messages */
        const int uneven = c->sq_total == 2 * size + 1 || c->sq_total == 5 * size + 1 ||
                           c->docs;
        if (p2p && size > 1 && uneven && aj_device_target(dev) == AJ_TARGET_CPU) {
            check_other_op(c, comm, fop, &fa);
            check_message_path(c, comm, fop, bop, &fa, &ba, &fs, &bs, fwd_sent, bwd_sent,
                               c->docs ? &traffic : NULL);
        }
    }
    /* aj_ring_plan takes one rank's lengths: padded, even splits only */
    const int parts = L == AJ_SHARD_ZIGZAG ? 2 * size : size;
    if (!ulysses && (c->docs || (sq % parts == 0 && sk % parts == 0))) {
        check_plan(c, fop, &fa, &fs);
        check_plan(c, bop, &fa, &bs);
    }
    if (rank == 0)
        printf("%-66s P=%d fwd %.3f s (comm %.4f, exposed %.4f) bwd %.3f s, %d launches, "
               "%d skipped\n", c->label, size, fs.total_s, fs.comm_s, fs.exposed_comm_s,
               bs.total_s, fs.launches, fs.skipped_blocks);

    if (fa.stream) {   /* the asynchronous calls' work, done without a failure */
        int32_t pending = -1;
        CHECK_STATUS(ctx, aj_comm_synchronize(comm), AJ_OK);
        CHECK_STATUS(ctx, aj_comm_query(comm, &pending), AJ_OK);
        CHECK_MSG(pending == 0, "rank %d: %s: %d calls pending after aj_comm_synchronize",
                  rank, c->label, pending);
    }
    aj_comm_destroy(comm);
    free_mirrors();
    aj_op_destroy(fop);
    aj_op_destroy(bop);
    void *bufs[] = {doc,      rel,      drel,   q_s,  k_s,   v_s,   do_s,   o_ref_s,
                    lse_ref_s, dq_ref_s, dk_ref_s, dv_ref_s, o_s, dq_s, dk_s, dv_s,
                    lse_s,    o_ref,    lse_ref, dq_ref, dk_ref, dv_ref};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++)
        free(bufs[i]);
    free_full(&q);
    free_full(&k);
    free_full(&v);
    free_full(&dout);
}

/* ---------------------------------------------------------------- failures */

typedef enum peer_fault { PEER_SILENT, PEER_STOPPED, PEER_KILLED } peer_fault;

static double seconds_since(const struct timespec *t0)
{
    struct timespec t1;
    clock_gettime(CLOCK_MONOTONIC, &t1);
    return (double)(t1.tv_sec - t0->tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0->tv_nsec);
}

/* A wait begun at t0 that must have ended in AJ_ERR_COMM with `message`,
 * after the 1 s timeout and within 2.5 s. */
static void check_timed_out(const char *fault, const char *what, aj_status got,
                            const struct timespec *t0, const char *message)
{
    const double waited = seconds_since(t0);
    CHECK_MSG(got == AJ_ERR_COMM, "%s: %s, want AJ_ERR_COMM (%s)", what, aj_status_str(got),
              aj_last_error(ctx));
    CHECK_ERROR(ctx, message);
    CHECK_MSG(waited >= 1.0 && waited < 2.5, "%s failed after %.2f s", what, waited);
    printf("%s peer: %s: AJ_ERR_COMM after %.2f s: %s\n", fault, what, waited,
           aj_last_error(ctx));
}

/* Rank 1 stops answering (sleeps, is frozen by SIGSTOP, or exits) right
 * after the comm exists.  Rank 0 must get AJ_ERR_COMM after the 1 s
 * timeout, not hang, on every kind of wait: a neighbour exchange (the
 * comm's own interface, as the ring's K/V rotation uses it), Ulysses'
 * all-to-all, and a collective (aj_ring_forward's opening all-gather, with
 * each method). */
static void run_faulty_peer(peer_fault fault)
{
    static const char *const names[] = {"silent", "stopped", "killed"};
    int pids[2] = {0, 0}, me = (int)getpid();
    MPI_Allgather(&me, 1, MPI_INT, pids, 1, MPI_INT, MPI_COMM_WORLD);
    aj_comm *comm = open_comm(1.0);
    if (rank == 1) {
        if (fault == PEER_STOPPED)
            raise(SIGSTOP);      /* rank 0 sends SIGCONT when done */
        else if (fault == PEER_KILLED)
            _exit(0);   /* no leak check for the dead */
        else
            sleep(6);   /* past rank 0's five 1 s timeouts */
        aj_comm_destroy(comm);
        return;
    }
    struct timespec t0;
    char send[1024] = {0}, recv[1024];
    aj_comm_req req = {.what = "K/V", .to = 1, .from = 1, .bytes = sizeof send};
    clock_gettime(CLOCK_MONOTONIC, &t0);
    CHECK_STATUS(ctx, comm->engine->exchange_start(comm, send, recv, sizeof send, 1, 1, 1, &req),
                 AJ_OK);
    req.active = true;
    check_timed_out(names[fault], "exchange", aj_comm_wait(comm, &req, "test", NULL), &t0,
                    "test: rank 0: K/V exchange (1024 bytes to rank 1, from rank 1) got no "
                    "answer within the comm timeout of 1 s; a peer has stopped or died");
    /* Ulysses' all-to-all */
    clock_gettime(CLOCK_MONOTONIC, &t0);
    check_timed_out(names[fault], "all-to-all", alltoall_check(comm), &t0,
                    "MPI: rank 0: MPI_Ialltoallv got no answer within the comm timeout of 1 s");

    const ring_case c = {.label = "silent", .dtype = AJ_DTYPE_F32, .mask = AJ_MASK_NONE, .hq = 1,
                         .hkv = 1, .lq = 8, .lk = 8, .layout = AJ_SHARD_CONTIGUOUS,
                         .rotate = AJ_ROTATE_P2P};
    aj_op *op = parse_op(&c, "forward");
    /* 2 heads: they divide over the ranks for method = ulysses */
    void *m = alloc64(2 * 8 * HEAD_DIM * 4);
    aj_ring_fwd_args fa = AJ_RING_FWD_ARGS_INIT;
    fa.q = tensor_dims(m, AJ_DTYPE_F32, 4, 1, 2, 8, HEAD_DIM);
    fa.k = fa.v = fa.o = fa.q;
    fa.lse = tensor_dims(m, AJ_DTYPE_F32, 3, 1, 2, 8, 0);
    for (int method = 0; method < AJ_METHOD_COUNT; method++) {
        fa.method = (aj_cp_method)method;
        fa.ulysses_size = method == AJ_METHOD_HYBRID;   /* U = 1, R = 2 */
        clock_gettime(CLOCK_MONOTONIC, &t0);
        check_timed_out(names[fault], method_names[method],
                        aj_ring_forward(ctx, dev, comm, op, &fa, NULL), &t0,
                        "aj_ring_forward: MPI: rank 0: MPI_Iallgather got no answer within "
                        "the comm timeout of 1 s; a peer has stopped or died");
    }
    if (fault == PEER_STOPPED)
        kill(pids[1], SIGCONT);
    peer_died = fault == PEER_KILLED;
    aj_op_destroy(op);
    free(m);
    aj_comm_destroy(comm);
}

/* aj_ring_forward refuses fa: AJ_ERR_INVALID_ARG, a message containing
 * `want`. */
static void forward_refused(aj_comm *comm, const aj_op *op, const aj_ring_fwd_args *fa,
                            const char *want)
{
    CHECK_STATUS(ctx, aj_ring_forward(ctx, dev, comm, op, fa, NULL), AJ_ERR_INVALID_ARG);
    CHECK_ERROR(ctx, want);
}

/* Rank 1 passes another layout than rank 0: both must refuse the call,
 * naming the difference, instead of computing a wrong answer. */
static void run_mismatch(void)
{
    aj_comm *comm = open_comm(30);
    const ring_case c = {.label = "mismatch", .dtype = AJ_DTYPE_F32, .mask = AJ_MASK_CAUSAL,
                         .hq = 1, .hkv = 1, .lq = 8, .lk = 8, .layout = AJ_SHARD_CONTIGUOUS,
                         .rotate = AJ_ROTATE_P2P};
    aj_op *op = parse_op(&c, "forward");
    void *m = alloc64(8 * HEAD_DIM * 4);
    aj_ring_fwd_args fa = AJ_RING_FWD_ARGS_INIT;
    fa.q = tensor_dims(m, AJ_DTYPE_F32, 4, 1, 1, 8, HEAD_DIM);
    fa.k = fa.v = fa.o = fa.q;
    fa.lse = tensor_dims(m, AJ_DTYPE_F32, 3, 1, 1, 8, 0);
    fa.layout = rank == 1 ? AJ_SHARD_ZIGZAG : AJ_SHARD_CONTIGUOUS;
    forward_refused(comm, op, &fa,
                    "aj_ring_forward: the ranks' calls differ: rank 1 has layout = 1, rank 0 "
                    "has 0; every rank must pass the same op");
    /* another op (causal vs none) on rank 1 */
    fa.layout = AJ_SHARD_CONTIGUOUS;
    const ring_case none = {"none", AJ_DTYPE_F32, AJ_MASK_NONE, AJ_ALIGN_TOP_LEFT, 0, 0,
                            1, 1, 8, 8, AJ_SHARD_CONTIGUOUS, AJ_ROTATE_P2P, 0, 0, 0, 0, 0,
                            AJ_METHOD_RING, 0, 0, NULL, 0, 0, NULL, 0};
    aj_op *other = parse_op(&none, "forward");
    CHECK_STATUS(ctx, aj_ring_forward(ctx, dev, comm, rank == 1 ? other : op, &fa, NULL),
                 AJ_ERR_INVALID_ARG);
    CHECK_ERROR(ctx, "aj_ring_forward: the ranks' calls differ: rank 1's op has hash");
    aj_op_destroy(op);
    aj_op_destroy(other);
    free(m);
    aj_comm_destroy(comm);
}

/* What method = ulysses refuses, each saying why, and ranks that call
 * different methods. */
static void run_ulysses_refusals(void)
{
    aj_comm *comm = open_comm(30);
    ring_case c = {.label = "refusal", .dtype = AJ_DTYPE_F32, .mask = AJ_MASK_CAUSAL, .hq = 2,
                   .hkv = 1, .lq = 8, .lk = 8, .layout = AJ_SHARD_CONTIGUOUS,
                   .rotate = AJ_ROTATE_P2P, .method = AJ_METHOD_ULYSSES};
    aj_op *op = parse_op(&c, "forward"), *bop = parse_op(&c, "backward");
    void *m = alloc64(2 * 8 * HEAD_DIM * 4);
    aj_ring_fwd_args fa = AJ_RING_FWD_ARGS_INIT;
    fa.q = tensor_dims(m, AJ_DTYPE_F32, 4, 1, 2, 8, HEAD_DIM);
    fa.k = fa.v = tensor_dims(m, AJ_DTYPE_F32, 4, 1, 1, 8, HEAD_DIM);
    fa.o = fa.q;
    fa.lse = tensor_dims(m, AJ_DTYPE_F32, 3, 1, 2, 8, 0);
    fa.method = AJ_METHOD_ULYSSES;
    forward_refused(comm, op, &fa,
                    "aj_ring_forward: method = ulysses over 2 ranks needs the key/value heads "
                    "(1) to divide by 2: each rank computes H_kv / P of them");
    aj_ring_bwd_args ba = AJ_RING_BWD_ARGS_INIT;
    ba.q = ba.o = ba.do_ = ba.dq = fa.q;
    ba.k = ba.v = ba.dk = ba.dv = fa.k;
    ba.lse = fa.lse;
    ba.method = AJ_METHOD_ULYSSES;
    CHECK_STATUS(ctx, aj_ring_backward(ctx, dev, comm, bop, &ba, NULL), AJ_ERR_INVALID_ARG);
    CHECK_ERROR(ctx, "aj_ring_backward: method = ulysses over 2 ranks needs the key/value "
                "heads (1) to divide by 2");
    fa.k = fa.v = fa.q;
    fa.ulysses_size = 3;
    forward_refused(comm, op, &fa,
                    "aj_ring_forward: ulysses_size = 3 over 2 ranks; method = ulysses spans "
                    "every rank (0 or 2)");
    /* method = hybrid: U must divide P and H_kv */
    fa.method = AJ_METHOD_HYBRID;
    const int32_t bad_u[2] = {0, 3};
    for (int i = 0; i < 2; i++) {
        fa.ulysses_size = bad_u[i];
        CHECK_STATUS(ctx, aj_ring_forward(ctx, dev, comm, op, &fa, NULL), AJ_ERR_INVALID_ARG);
        char want[160];
        snprintf(want, sizeof want, "aj_ring_forward: ulysses_size = %d over 2 ranks; method "
                 "= hybrid takes the size U of its Ulysses groups, from 1 to P, dividing P",
                 bad_u[i]);
        CHECK_ERROR(ctx, want);
    }
    fa.ulysses_size = 2;
    fa.k = fa.v = ba.k;
    forward_refused(comm, op, &fa,
                    "aj_ring_forward: method = hybrid over 2 ranks needs the key/value heads "
                    "(1) to divide by 2: each rank computes H_kv / U of them");
    ba.method = AJ_METHOD_HYBRID;
    ba.ulysses_size = 2;
    CHECK_STATUS(ctx, aj_ring_backward(ctx, dev, comm, bop, &ba, NULL), AJ_ERR_INVALID_ARG);
    CHECK_ERROR(ctx, "aj_ring_backward: method = hybrid over 2 ranks needs the key/value "
                "heads (1) to divide by 2");
    fa.k = fa.v = fa.q;
    /* ranks that pass different group sizes: both refuse */
    fa.ulysses_size = rank + 1;
    forward_refused(comm, op, &fa,
                    "aj_ring_forward: the ranks' calls differ: rank 1 has ulysses_size = 2, "
                    "rank 0 has 1");
    fa.ulysses_size = 0;
    fa.method = (aj_cp_method)7;
    forward_refused(comm, op, &fa,
                    "aj_ring_forward: method = 7 is not a context-parallel method");
    fa.method = AJ_METHOD_RING;
    fa.ulysses_size = 2;
    forward_refused(comm, op, &fa,
                    "aj_ring_forward: ulysses_size = 2 with method = ring; only methods "
                    "ulysses and hybrid take it");
    /* rank 1 asks for Ulysses, rank 0 for the ring: both refuse */
    fa.ulysses_size = 0;
    fa.method = rank == 1 ? AJ_METHOD_ULYSSES : AJ_METHOD_RING;
    forward_refused(comm, op, &fa,
                    "aj_ring_forward: the ranks' calls differ: rank 1 has method = 1, rank 0 "
                    "has 0");
    /* shards that are not the layout's: 3 and 5 positions of 8 */
    fa.method = AJ_METHOD_ULYSSES;
    const int64_t l = rank == 0 ? 3 : 5;
    fa.q = tensor_dims(m, AJ_DTYPE_F32, 4, 1, 2, l, HEAD_DIM);
    fa.k = fa.v = fa.o = fa.q;
    fa.lse = tensor_dims(m, AJ_DTYPE_F32, 3, 1, 2, l, 0);
    forward_refused(comm, op, &fa,
                    "aj_ring_forward: rank 0 holds 3 query and 3 key positions; the "
                    "contiguous layout of 8 and 8 over 2 ranks gives it 4 and 4 (aj_shard_length)");
    aj_op_destroy(op);
    aj_op_destroy(bop);
    free(m);
    aj_comm_destroy(comm);
}

/* What packed documents (layout = varlen) refuse, each saying why. */
static void run_varlen_refusals(void)
{
    aj_comm *comm = open_comm(30);
    static const int docs[] = {1, 2, 5, 0};
    static const int32_t cu[] = {0, 1, 3, 8};
    ring_case c = {.label = "varlen refusal", .dtype = AJ_DTYPE_F16, .mask = AJ_MASK_CAUSAL,
                   .hq = 2, .hkv = 2, .flash = 1, .docs = docs};
    aj_op *op = parse_op(&c, "forward");
    void *m = alloc64(8 * 2 * HEAD_DIM * 2);
    const int64_t l = rank == 0 ? 5 : 3;   /* the ring's pieces of documents 1, 2, 5 */
    aj_ring_fwd_args fa = AJ_RING_FWD_ARGS_INIT;
    fa.q = fa.k = fa.v = fa.o = rows_view(&c, m, AJ_DTYPE_F16, 2, l, HEAD_DIM);
    fa.lse = rows_view(&c, m, AJ_DTYPE_F32, 2, l, 0);
    forward_refused(comm, op, &fa,
                    "aj_ring_forward: layout = varlen needs cu_seqlens_q, cu_seqlens_k and "
                    "batch >= 1 (the whole packed batch's; got NULL, NULL, batch = 0)");
    fa.cu_seqlens_q = fa.cu_seqlens_k = cu;
    fa.batch = 3;
    /* every rank holding 4 positions: not the ring's pieces, which
     * method = hybrid takes too (U = 1, R = 2) */
    fa.q = fa.k = fa.v = fa.o = rows_view(&c, m, AJ_DTYPE_F16, 2, 4, HEAD_DIM);
    fa.lse = rows_view(&c, m, AJ_DTYPE_F32, 2, 4, 0);
    fa.method = AJ_METHOD_HYBRID;
    fa.ulysses_size = 1;
    forward_refused(comm, op, &fa,
                    "aj_ring_forward: rank 0 holds 4 query and 4 key positions; its pieces of "
                    "the packed documents are 5 and 5 (aj_shard_varlen_chunks, method = hybrid)");
    fa.method = AJ_METHOD_RING;
    fa.ulysses_size = 0;
    forward_refused(comm, op, &fa,
                    "aj_ring_forward: rank 0 holds 4 query and 4 key positions; its pieces of "
                    "the packed documents are 5 and 5 (aj_shard_varlen_chunks, method = ring)");
    fa.q = tensor_dims(m, AJ_DTYPE_F16, 4, 1, 2, 4, HEAD_DIM);
    forward_refused(comm, op, &fa,
                    "aj_ring_forward: q, k and v have ranks 4, 3, 3; want 3 (layout = varlen: "
                    "packed [T, H, D])");
    aj_ring_plan_args pa = AJ_RING_PLAN_ARGS_INIT;
    pa.size = 2;
    pa.batch = pa.heads_q = 1;
    int32_t count = 0;
    CHECK_STATUS(ctx, aj_ring_plan(ctx, dev, op, &pa, NULL, 0, &count), AJ_ERR_INVALID_ARG);
    CHECK_ERROR(ctx, "aj_ring_plan: layout = varlen needs cu_seqlens_q, cu_seqlens_k and batch "
                ">= 1 (the whole packed batch's; got NULL, NULL, batch = 1)");
    pa.members = -1;
    CHECK_STATUS(ctx, aj_ring_plan(ctx, dev, op, &pa, NULL, 0, &count), AJ_ERR_INVALID_ARG);
    CHECK_ERROR(ctx, "aj_ring_plan: members = -1, head_offset = 0; want 0 or more");
    const aj_seq_shape full = {1, 7, 2 * HEAD_DIM, 2};
    CHECK_STATUS(ctx, aj_shard_varlen(ctx, AJ_METHOD_RING, AJ_SHARD_ZIGZAG, rank, size, cu, 3,
                                      &full, m, m), AJ_ERR_INVALID_ARG);
    CHECK_ERROR(ctx, "aj_shard_varlen: full->seq = 7; the packed batch has cu_seqlens[3] = 8 "
                "positions");
    aj_op_destroy(op);
    free(m);
    aj_comm_destroy(comm);
}

/* The MPI engine's all-to-all (uneven counts, gaps, empty parts). */
static void run_alltoall(void)
{
    aj_comm *comm = open_comm(30);
    CHECK_STATUS(ctx, alltoall_check(comm), AJ_OK);
    aj_comm_destroy(comm);
}

int main(int argc, char **argv)
{
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    const char *mode = argc > 1 ? argv[1] : "cases";
    const int on_cpu = strcmp(mode, "generated-cpu") == 0;
    on_gpu = strcmp(mode, "generated-cuda") == 0 || strcmp(mode, "cases-cuda") == 0;
    CHECK(aj_ctx_create(NULL, &ctx) == AJ_OK);
    /* cuda ranks: GPU r of the stand-in's, their launches emulated */
    CHECK_STATUS(ctx, aj_device_open(ctx, on_gpu ? AJ_DEVICE_CUDA : on_cpu ? AJ_DEVICE_CPU
                                                                            : AJ_DEVICE_SIM,
                                     on_gpu ? rank : 0, &dev), AJ_OK);
    if (!dev) {   /* reported above */
        MPI_Finalize();
        return check_report();
    }
    /* ranks share the cores: one emulator thread each */
    aj_device_set_workers(dev, 1);
    if (strcmp(mode, "cases") == 0 || strcmp(mode, "cases-cuda") == 0) {
        for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
            run_case(&cases[i]);
    } else if (strcmp(mode, "generated") == 0 || on_cpu || on_gpu) {
        ring_case generated[ULY_MAX_CASES];
        char labels[ULY_MAX_CASES][112];
        const int n = generated_cases(generated, labels, !on_cpu);
        const char *only = getenv("TEST_RING_ONLY");   /* a label's part, to rerun a few */
        /* AJ_TEST_SAMPLE (check.h): every N-th case, the same on every rank */
        for (int i = 0; i < n; i++)
            if ((!only || strstr(generated[i].label, only)) && check_sampled())
                run_case(&generated[i]);
        ring_case packed[VARLEN_MAX_CASES];
        char packed_labels[VARLEN_MAX_CASES][112];
        const int np = generated_varlen_cases(packed, packed_labels, !on_cpu);
        for (int i = 0; i < np; i++)
            if ((!only || strstr(packed[i].label, only)) && check_sampled())
                run_case(&packed[i]);
        run_alltoall();
    } else if (size != 2) {
        CHECK_MSG(0, "%s needs 2 ranks, not %d", mode, size);
    } else if (strcmp(mode, "mismatch") == 0) {
        run_mismatch();
        run_ulysses_refusals();
        run_varlen_refusals();
    } else {
        run_faulty_peer(strcmp(mode, "stopped") == 0  ? PEER_STOPPED
                        : strcmp(mode, "killed") == 0 ? PEER_KILLED
                                                      : PEER_SILENT);
    }
    if (on_gpu) {   /* the stand-in's stream-order model saw every access in order */
        int (*races)(void) = NULL;
        *(void **)&races = stand_in_cuda_symbol("fake_cuda_races");
        CHECK_MSG(races && races() == 0, "rank %d: %d stream-order races (the stand-in's log)",
                  rank, races ? races() : -1);
    }
    if (caller_stream)
        aj_device_stream_destroy(dev, caller_stream);
    aj_device_close(dev);
    aj_ctx_destroy(ctx);
    if (!peer_died)
        CHECK_MSG(!leak_check_before_finalize(), "rank %d leaks (LeakSanitizer's report above)",
                  rank);
    int rc = check_report();
    /* MPI_Finalize with a dead peer can wait for it forever, even under
     * --enable-recovery: the survivor ends on its own */
    if (peer_died) {
        fflush(NULL);
        _exit(rc);
    }
    MPI_Finalize();
    return rc;
}
