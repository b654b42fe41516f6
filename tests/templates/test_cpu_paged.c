/*
 * test_cpu_paged.c -- layout = paged on the cpu target against the float64
 * reference (tests/lib/paged_cases.h): a sweep over what docs/ir.md advertises
 * -- page sizes 1, 16, 64 (and 256), pages in order, shuffled and shared
 * between sequences, Sq 1..16, GQA 1:1 .. 8:1, head dims 64, 128, 256 and
 * (192, 128), f16 / bf16 queries with f16, bf16, f8e4m3 and f8e5m2
 * caches, masks, softcap and alibi, sequences of length 0, query heads packed per
 * KV head and not (a group too long for one block) -- then every split
 * count 1..16 of one problem against the reference and against each other,
 * varlen queries (q_layout = varlen: chunked prefill, test_varlen_queries),
 * every head dim 8..512 with D != Dv (paged_dim_case; to 256 on sim),
 * shared K/V caches (MLA's layout; paged_shared_case, D 8..576),
 * and the faults the kernel finds (a page outside the cache, a length
 * beyond the table, a negative length; varlen: decreasing cu_seqlens_q, a
 * chunk longer than its sequence), each named by its sequence.
 * With argument "sim", the GPU kernels on the sim (test_sim below).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "codegen/codegen.h"
#include "paged_cases.h"
#include "templates/layouts.h"

static aj_ctx *ctx;
static aj_device *dev;

static int compile_case(const paged_case *c, aj_kernel **kernel)
{
    char label[160];
    paged_label(c, label, sizeof label);
    aj_status st = paged_compile(ctx, dev, c, kernel);
    CHECK_MSG(st == AJ_OK, "%s: compile: %s (%s)", label, aj_status_str(st), aj_last_error(ctx));
    return st == AJ_OK;
}

/* Runs c with kernel (compile_case's) against the reference. */
static void check_case(const aj_kernel *kernel, const paged_case *c)
{
    char label[160];
    paged_label(c, label, sizeof label);
    paged_result r = paged_run(ctx, dev, kernel, c);
    CHECK_MSG(r.status == AJ_OK, "%s: %s (%s)", label, aj_status_str(r.status),
              aj_last_error(ctx));
    if (r.status != AJ_OK)
        return;
    CHECK_MSG(r.err_o <= 1.0 && r.err_lse <= 1.0, "%s: O %.3g LSE %.3g x tolerance", label,
              r.err_o, r.err_lse);
    CHECK_MSG(r.exact_empty, "%s: a row without keys is not O = 0, LSE = -inf", label);
    printf("%-72s O %.3f LSE %.3f %8.2f ms\n", label, r.err_o, r.err_lse, r.seconds * 1e3);
}

/* c compiled and checked (every AJ_TEST_SAMPLE-th one, check.h) */
static void run(const paged_case *c)
{
    aj_kernel *kernel = NULL;
    if (!check_sampled() || !compile_case(c, &kernel))
        return;
    check_case(kernel, c);
    aj_kernel_destroy(kernel);
}

/* bf16 d64 over the sequences of lens (4), 2 queries each, in pages of
 * page_size tokens laid out as `layout` (PAGED_*). */
static void run_pages(const int32_t *lens, int page_size, int layout)
{
    paged_case c = paged_base(AJ_DTYPE_BF16, AJ_DTYPE_BF16, 64, lens, 4);
    c.page_size = page_size;
    c.pages = layout;
    c.sq = 2;
    run(&c);
}

/* Each dimension over its advertised range, the others at a base. */
static void test_sweep(void)
{
    static const int32_t lens[4] = {37, 0, 130, 5};
    static const aj_dtype qs[2] = {AJ_DTYPE_F16, AJ_DTYPE_BF16};
    static const aj_dtype kvs[4] = {AJ_DTYPE_F16, AJ_DTYPE_BF16, AJ_DTYPE_F8E4M3,
                                    AJ_DTYPE_F8E5M2};
    for (int i = 0; i < 2; i++)
        for (int j = 0; j < 4; j++) {
            paged_case c = paged_base(qs[i], kvs[j], 64, lens, 4);
            c.mask = AJ_MASK_CAUSAL;
            c.sq = 3;
            run(&c);
        }
    static const int page_sizes[4] = {1, 16, 64, 256};
    static const int layouts[3] = {PAGED_IN_ORDER, PAGED_SHUFFLED, PAGED_SHARED_PREFIX};
    for (int i = 0; i < 4; i++)
        for (int j = 0; j < 3; j++)
            run_pages(lens, page_sizes[i], layouts[j]);
    /* every page size the layout takes (1..256: a launch argument, one
     * kernel), pages shuffled */
    for (int ps = 1; ps <= 256; ps++)
        run_pages(lens, ps, PAGED_SHUFFLED);
    for (int sq = 1; sq <= 16; sq++) {
        paged_case c = paged_base(AJ_DTYPE_F16, AJ_DTYPE_F16, 128, lens, 4);
        c.sq = sq;
        c.mask = AJ_MASK_CAUSAL;
        run(&c);
    }
    static const int groups[4] = {1, 2, 4, 8};
    for (int i = 0; i < 4; i++) {
        paged_case c = paged_base(AJ_DTYPE_BF16, AJ_DTYPE_F8E4M3, 128, lens, 4);
        c.hkv = groups[i] == 8 ? 1 : 2;
        c.hq = c.hkv * groups[i];
        c.sq = 2;
        run(&c);
    }
    static const int dims[4][2] = {{64, 64}, {128, 128}, {256, 256}, {192, 128}};
    for (int i = 0; i < 4; i++) {
        paged_case c = paged_base(AJ_DTYPE_BF16, AJ_DTYPE_BF16, dims[i][0], lens, 4);
        c.dv = dims[i][1];
        c.mask = AJ_MASK_CAUSAL;
        c.sq = 4;
        run(&c);
    }
    /* a group whose rows do not fit one block (8 x 17 > 128): one item per
     * query head, the path alibi and head-reading expressions take */
    for (int sq = 16; sq <= 17; sq++) {
        paged_case c = paged_base(AJ_DTYPE_BF16, AJ_DTYPE_BF16, 64, lens, 4);
        c.hkv = 1;
        c.hq = 8;
        c.sq = sq;
        c.mask = AJ_MASK_CAUSAL;
        c.splits = 3;
        run(&c);
    }
    /* window and softcap on absolute positions; all sequences empty */
    paged_case c = paged_base(AJ_DTYPE_F16, AJ_DTYPE_F8E5M2, 64, lens, 4);
    c.mask = AJ_MASK_WINDOW;
    c.left = 20;
    c.right = 0;
    c.sq = 6;
    run(&c);
    c.mask = AJ_MASK_NONE;
    c.softcap = 5.0;
    run(&c);
    /* alibi reads the head: each query head its own row block */
    c.softcap = 0;
    c.alibi = 1;
    c.mask = AJ_MASK_CAUSAL;
    c.hq = 8;
    run(&c);
    static const int32_t empty[2] = {0, 0};
    c = paged_base(AJ_DTYPE_BF16, AJ_DTYPE_BF16, 64, empty, 2);
    run(&c);
}

/* Every split count of one long problem: each against the reference, and
 * the same as one part within the tolerance. */
static void test_splits(void)
{
    static const int32_t lens[3] = {1000, 3, 517};
    for (int s = 1; s <= AJ_SPLITS_MAX; s++) {
        paged_case c = paged_base(AJ_DTYPE_BF16, AJ_DTYPE_BF16, 128, lens, 3);
        c.splits = s;
        c.sq = 2;
        c.mask = AJ_MASK_CAUSAL;
        c.hq = 8;
        run(&c);
    }
    /* the launch's own choice (here: 0) */
    paged_case c = paged_base(AJ_DTYPE_F16, AJ_DTYPE_F8E4M3, 64, lens, 1);
    run(&c);
}

/* Varlen queries over the cache (q_layout = varlen, chunked prefill):
 * chunks of 0, 1, 7, 16, 33 queries and whole sequences, mixed per batch
 * (each rotation gives each sequence another), page sizes 1, 16, 64 and
 * odd ones, GQA 1:1 .. 8:1 (long chunks take the unpacked path) -- the
 * launch's arguments, six launches per kernel -- over kernels of no mask,
 * causal and window, f16 / bf16 queries with e4m3 and 16-bit caches,
 * splits 1..4 and the launch's own choice (a kernel compiles in about
 * 0.25 s: they are few). */
static void test_varlen_queries(void)
{
    static const int32_t lens[6] = {37, 0, 300, 5, 64, 129};
    static const int want[6] = {0, 1, 7, 16, 33, -1};
    static const int page_sizes[5] = {1, 16, 64, 5, 33};
    static const int groups[3][2] = {{4, 1}, {4, 4}, {8, 1}};
    static const struct {
        aj_dtype q, kv;
        int d;
        aj_mask_kind mask;
        int splits;
    } ops[6] = {
        {AJ_DTYPE_F16, AJ_DTYPE_F8E4M3, 64, AJ_MASK_CAUSAL, 1},
        {AJ_DTYPE_BF16, AJ_DTYPE_F8E4M3, 64, AJ_MASK_WINDOW, 2},
        {AJ_DTYPE_F16, AJ_DTYPE_F16, 64, AJ_MASK_NONE, 3},
        {AJ_DTYPE_BF16, AJ_DTYPE_BF16, 128, AJ_MASK_CAUSAL, 4},
        {AJ_DTYPE_BF16, AJ_DTYPE_F8E4M3, 64, AJ_MASK_NONE, 0},
        {AJ_DTYPE_F16, AJ_DTYPE_F8E4M3, 128, AJ_MASK_WINDOW, 3},
    };
    int32_t chunks[6] = {0};   /* filled per launch; the label reads them before */
    for (int k = 0; k < 6; k++) {
        paged_case c = paged_base(ops[k].q, ops[k].kv, ops[k].d, lens, 6);
        c.chunks = chunks;
        c.mask = ops[k].mask;
        c.left = 24;
        c.right = k % 2 ? 0 : 3;
        c.splits = ops[k].splits;
        aj_kernel *kernel = NULL;
        if (!compile_case(&c, &kernel))
            continue;
        for (int r = 0; r < 6; r++) {
            paged_chunks(lens, 6, want, 6, r, chunks);
            c.page_size = page_sizes[(r + k) % 5];
            c.hq = groups[(r + k) % 3][0];
            c.hkv = groups[(r + k) % 3][1];
            c.seed = 11 + (uint64_t)(6 * k + r);
            check_case(kernel, &c);
        }
        aj_kernel_destroy(kernel);
    }
}

/* What the kernel finds, as the call's AJ_ERR_INVALID_ARG naming the
 * sequence; the device is clean again for the next call. */
static void test_faults(void)
{
    static const int32_t lens[3] = {40, 70, 9}, negative[3] = {40, -5, 9};
    static const struct {
        const int32_t *lens;
        int fault, seq;
        const char *message;
        int varlen;
    } cases[] = {
        {lens, PAGED_FAULT_PAGE, 2, "aj_forward: block_table row 2 holds a page outside 0 .. "
         "num_pages - 1 (k_cache.shape[0]) (found by the kernel of sequence 2, which skipped "
         "it)", 0},
        {lens, PAGED_FAULT_LENGTH, 1, "aj_forward: seqlens_k[1] is negative or beyond its "
         "block_table row (max_pages x page_size keys)", 0},
        {negative, PAGED_NO_FAULT, 0, "aj_forward: seqlens_k[1] is negative or beyond its "
         "block_table row", 0},
        {lens, PAGED_FAULT_CU_ORDER, 1, "aj_forward: cu_seqlens_q[2] is below "
         "cu_seqlens_q[1]; offsets must not decrease (found by the kernel of sequence 1", 1},
        {lens, PAGED_FAULT_BEYOND, 1, "aj_forward: sequence 1 has more queries "
         "(cu_seqlens_q[2] - cu_seqlens_q[1]) than keys (seqlens_k[1]) (found by the kernel "
         "of sequence 1, which skipped it)", 1},
        {negative, PAGED_NO_FAULT, 0, "aj_forward: seqlens_k[1] is negative or beyond its "
         "block_table row", 1},
    };
    /* varlen queries: the offsets, and a chunk longer than its sequence */
    static const int32_t chunks[3] = {4, 70, 9};
    /* one kernel per query layout and split count serves its cases */
    for (int varlen = 0; varlen < 2; varlen++)
        for (int splits = 1; splits <= 3; splits += 2) {
            paged_case c = paged_base(AJ_DTYPE_F16, AJ_DTYPE_F16, 64, lens, 3);
            c.chunks = varlen ? chunks : NULL;
            c.splits = splits;
            aj_kernel *kernel = NULL;
            if (!compile_case(&c, &kernel))
                continue;
            for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
                if (cases[i].varlen != varlen)
                    continue;
                c.seqlens = cases[i].lens;
                c.fault = cases[i].fault;
                c.fault_seq = cases[i].seq;
                paged_result r = paged_run(ctx, dev, kernel, &c);
                CHECK_MSG(r.status == AJ_ERR_INVALID_ARG, "fault case %zu splits %d: %s", i,
                          splits, aj_status_str(r.status));
                CHECK_MSG(strstr(aj_last_error(ctx), cases[i].message),
                          "fault case %zu: \"%s\"", i, aj_last_error(ctx));
                c.fault = PAGED_NO_FAULT;
                c.seqlens = lens;
                r = paged_run(ctx, dev, kernel, &c);
                CHECK_MSG(r.status == AJ_OK && r.err_o <= 1 && r.err_lse <= 1,
                          "after fault case %zu: %s", i, aj_last_error(ctx));
            }
            aj_kernel_destroy(kernel);
        }
}

/* The caches' rows start on the chunks the kernel states it reads them in
 * (row_align): the cpu kernel any element; sim/GPU 16 bytes, 8 for an f8
 * cache whose rows are not whole 16-byte chunks (loaded by the threads);
 * a cache off them is refused by that figure.  Shared caches too (16-bit
 * and f8 on the mma tiles, an f8 one of 72-byte rows on the SIMT tiles). */
static void test_cache_chunks(const int32_t *lens)
{
    static const struct {
        aj_dtype kv;
        int d, chunk, shared;
    } caches[] = {{AJ_DTYPE_F16, 64, 16, 0},       {AJ_DTYPE_F32, 40, 16, 0},
                  {AJ_DTYPE_F8E4M3, 64, 16, 0},    {AJ_DTYPE_F8E5M2, 72, 8, 0},
                  {AJ_DTYPE_F16, 576, 16, 1},      {AJ_DTYPE_F8E4M3, 576, 16, 1},
                  {AJ_DTYPE_F8E5M2, 72, 8, 1}};
    const int cpu = aj_device_target(dev) == AJ_TARGET_CPU;
    for (size_t i = 0; i < sizeof caches / sizeof caches[0]; i++) {
        paged_case c = paged_base(AJ_DTYPE_F16, caches[i].kv, caches[i].d, lens, 1);
        if (caches[i].shared) {
            c.shared = 1;
            c.scale = 0.07;
            c.dv = caches[i].d > 512 ? 512 : caches[i].d;
            c.hkv = 1;
        }
        aj_kernel *kernel = NULL;
        if (!compile_case(&c, &kernel))
            continue;
        const int want = cpu ? aj_dtype_size(caches[i].kv) : caches[i].chunk;
        CHECK_MSG(kernel->row_align[AJ_ROW_K_CACHE] == want &&
                  kernel->row_align[AJ_ROW_V_CACHE] == want, "cache %zu: row_align %d %d, want "
                  "%d", i, kernel->row_align[AJ_ROW_K_CACHE], kernel->row_align[AJ_ROW_V_CACHE],
                  want);
        if (!cpu) {
            c.fault = PAGED_FAULT_ALIGN;
            paged_result r = paged_run(ctx, dev, kernel, &c);
            char msg[96];
            snprintf(msg, sizeof msg, "is not %d-byte aligned (the paged kernel reads cache rows "
                     "in %d-byte chunks)", want, want);
            CHECK_MSG(r.status == AJ_ERR_INVALID_ARG && strstr(aj_last_error(ctx), msg),
                      "cache %zu off its chunks: %s (%s)", i, aj_status_str(r.status),
                      aj_last_error(ctx));
        }
        aj_kernel_destroy(kernel);
    }
}

/* The host checks name the argument. */
static void test_errors(void)
{
    static const int32_t lens[1] = {10};
    paged_case c = paged_base(AJ_DTYPE_F16, AJ_DTYPE_F16, 64, lens, 1);
    aj_kernel *kernel = NULL;
    CHECK(paged_compile(ctx, dev, &c, &kernel) == AJ_OK);
    aj_fwd_args a = AJ_FWD_ARGS_INIT;
    CHECK_STATUS(ctx, aj_forward(ctx, dev, kernel, &a), AJ_ERR_INVALID_ARG);
    CHECK_ERROR(ctx, "aj_forward: q.rank = 0, want 4");
    a.q_offset = 3;
    CHECK_STATUS(ctx, aj_forward(ctx, dev, kernel, &a), AJ_ERR_INVALID_ARG);
    CHECK_ERROR(ctx, "aj_forward: k, v, cu_seqlens, offsets and totals are not for layout = "
                     "paged kernels");
    /* the sim/GPU kernel reads cache rows in 16-byte chunks */
    if (aj_device_target(dev) != AJ_TARGET_CPU) {
        c.fault = PAGED_FAULT_ALIGN;
        paged_result r = paged_run(ctx, dev, kernel, &c);
        CHECK_MSG(r.status == AJ_ERR_INVALID_ARG, "misaligned k_cache: %s",
                  aj_status_str(r.status));
        CHECK_ERROR(ctx, "aj_forward: k_cache.data = ");
        CHECK_ERROR(ctx, "is not 16-byte aligned (the paged kernel reads cache rows in 16-byte "
                         "chunks)");
        c.fault = PAGED_NO_FAULT;
    }
    aj_kernel_destroy(kernel);
    test_cache_chunks(lens);
    /* varlen queries: a packed q */
    static const int32_t chunk[1] = {3};
    c.chunks = chunk;
    CHECK(paged_compile(ctx, dev, &c, &kernel) == AJ_OK);
    a = (aj_fwd_args)AJ_FWD_ARGS_INIT;
    CHECK_STATUS(ctx, aj_forward(ctx, dev, kernel, &a), AJ_ERR_INVALID_ARG);
    CHECK_ERROR(ctx, "aj_forward: q.rank = 0, want 3");
    aj_kernel_destroy(kernel);
}

/* The sim (the GPU kernels, efficient_fwd.c's paged build, emulated):
 * paged_gpu_cases, tiny shapes, for it is slow. */
static void test_sim(void)
{
    paged_case cases[PAGED_GPU_CASES];
    int n = paged_gpu_cases(cases);
    for (int i = 0; i < n; i++)
        run(&cases[i]);
}

/* Learned sinks (docs/ir.md "Sinks") over split-KV: the sink is counted
 * once, by the merge of the parts, whatever their number (1, 2, 3, 5 and
 * the launch's own choice), in GQA-packed decode (Sq 1 and 2 over 8:2
 * heads), an unpacked one, a window, a score_mod reading h and varlen
 * queries, with a sequence of no keys (its rows get O = 0, LSE = the
 * sink), on either device. */
static void test_sinks(void)
{
    static const int32_t lens[4] = {700, 0, 33, 129};
    static const int32_t chunks[4] = {5, 0, 1, 33};
    static const int splits[5] = {1, 2, 3, 5, 0};
    for (int i = 0; i < 10; i++) {
        paged_case c = paged_base(i % 2 ? AJ_DTYPE_BF16 : AJ_DTYPE_F16,
                                  i % 3 == 2 ? AJ_DTYPE_F8E4M3 : i % 2 ? AJ_DTYPE_BF16
                                                                        : AJ_DTYPE_F16,
                                  i % 4 == 3 ? 128 : 64, lens, 4);
        c.sinks = 1;
        c.splits = splits[i % 5];
        c.hq = 8;
        c.hkv = i % 5 == 4 ? 8 : 2;
        c.sq = 1 + i % 2;
        c.mask = i % 3 == 1 ? AJ_MASK_WINDOW : AJ_MASK_CAUSAL;
        c.left = 40;
        c.efficient = i % 2;
        if (i == 7)
            c.score_expr = "score - 0.125 * h";
        if (i >= 8)
            c.chunks = chunks;
        c.seed = 40 + (uint64_t)i;
        run(&c);
    }
}

/* Every head dim of the device's range, D != Dv (paged_dim_case). */
static void test_head_dims(int sim)
{
    int n = sim ? PAGED_DIMS_GPU : PAGED_DIMS_CPU;
    for (int i = 0; i < n; i++) {
        paged_case c = paged_dim_case(i, n);
        run(&c);
    }
}

/*
 * One cache for K and V (kv_shared, absorbed MLA): on cpu DeepSeek-V3's
 * latent rows (D 576, V their first 512 columns) with every query head
 * (16, 128) over the one latent head, Sq 1, 4 and 16 (decode,
 * multi-token prediction, speculative runs) and varlen chunks, page sizes
 * 1 / 16 / 64, f16 / bf16 / e4m3 / e5m2 caches, causal, a window and an
 * expression mask, split-KV; on sim the GPU kernels (the flash forward's
 * mma tiles; at D 72 an f8 cache, of odd 16-byte rows, on the efficient
 * template's SIMT tiles) over MLA's rows too (D 576 / Dv 512, D 256 / Dv
 * 256, D 72 / Dv 40, 8 heads over the one).  The
 * scale is DeepSeek's kind, 1/sqrt(192) times a YaRN factor.  Then the
 * refusals: a v_cache beside a shared cache, the IR's rules.
 */
static void test_shared(int sim)
{
    static const int32_t lens[3] = {130, 0, 61};
    static const int32_t chunks[3] = {16, 0, 3};
    static const aj_dtype kvs[4] = {AJ_DTYPE_BF16, AJ_DTYPE_F16, AJ_DTYPE_F8E4M3,
                                    AJ_DTYPE_F8E5M2};
    static const int dims[3][2] = {{576, 512}, {256, 256}, {72, 40}};
    static const int sqs[3] = {1, 4, 16}, pages[3] = {64, 1, 16}, hqs[2] = {16, 128};
    const double scale = 1.0 / sqrt(192.0) * 1.25;
    for (int i = 0; i < 6; i++) {
        aj_dtype q = i % 2 ? AJ_DTYPE_F16 : AJ_DTYPE_BF16;
        aj_dtype kv = kvs[i % 4] == AJ_DTYPE_F16 || kvs[i % 4] == AJ_DTYPE_BF16 ? q : kvs[i % 4];
        paged_case c = paged_base(q, kv, sim ? dims[i % 3][0] : 576, lens, 3);
        c.dv = sim ? dims[i % 3][1] : 512;
        c.shared = 1;
        c.scale = scale;
        c.hkv = 1;
        c.hq = sim ? 8 : hqs[i % 2];
        c.sq = sqs[i % 3];
        c.page_size = pages[i % 3];
        c.mask = i == 4 ? AJ_MASK_WINDOW : AJ_MASK_CAUSAL;
        c.left = 40;
        c.mask_expr = i == 5 ? "k % 5 != 2 && q - k < 90" : NULL;
        c.chunks = i == 3 ? chunks : NULL;
        c.splits = i % 4;
        run(&c);
    }
    /* the refusals: a v_cache or v_scale beside a shared cache */
    paged_case c = paged_base(AJ_DTYPE_F16, AJ_DTYPE_F16, 128, lens, 3);
    c.dv = 64;
    c.shared = 1;
    c.scale = scale;
    aj_kernel *kernel = NULL;
    CHECK(paged_compile(ctx, dev, &c, &kernel) == AJ_OK);
    aj_fwd_args a = AJ_FWD_ARGS_INIT;
    a.v_cache.data = &a;
    CHECK_STATUS(ctx, aj_forward(ctx, dev, kernel, &a), AJ_ERR_INVALID_ARG);
    CHECK_ERROR(ctx, "aj_forward: v_cache and v_scale stay empty with kv_shared = true (V is "
                     "the first head_dim_v columns of k_cache, scaled by k_scale)");
    aj_kernel_destroy(kernel);
    /* the IR's rules (the text form; a builder's failed set sticks) */
    static const char *const bad[][2] = {
        {"head_dim = 576\n head_dim_v = 512\n layout = paged\n kv_shared = true",
         "kv_shared = true needs an explicit scale (set it before kv_shared): 1/sqrt(head_dim) "
         "= 1/sqrt(576) is not the softmax scale of absorbed MLA"},
        {"head_dim = 512\n head_dim_v = 576\n scale = 0.09\n layout = paged\n kv_shared = true",
         "kv_shared = true: head_dim_v = 576 exceeds head_dim = 512"},
        {"head_dim = 576\n head_dim_v = 512\n scale = 0.09\n kv_shared = true",
         "kv_shared = true applies only to layout = paged"}};
    char spec[256];
    aj_op *op = NULL;
    for (int i = 0; i < 3; i++) {
        snprintf(spec, sizeof spec, "attention forward flash {\n dtype = f16\n %s\n}\n", bad[i][0]);
        CHECK_STATUS(ctx, aj_op_parse(ctx, spec, strlen(spec), "shared", &op), AJ_ERR_VERIFY);
        CHECK_ERROR(ctx, bad[i][1]);
    }
    /* 576 is a shared cache's width only */
    snprintf(spec, sizeof spec, "attention forward flash {\n dtype = f16\n head_dim = 576\n "
             "head_dim_v = 512\n scale = 0.09\n layout = paged\n kv_shared = true\n}\n");
    CHECK(aj_op_parse(ctx, spec, strlen(spec), "shared", &op) == AJ_OK);
    bool shared = false;
    CHECK(aj_op_get_kv_shared(op, &shared) == AJ_OK && shared);
    char *text = NULL;
    CHECK(aj_op_print(op, &text) == AJ_OK && strstr(text, "  kv_shared = true\n"));
    aj_free(text);
    aj_compile_options opt = AJ_COMPILE_OPTIONS_INIT;
    opt.target = aj_device_target(dev);
    CHECK_STATUS(ctx, aj_compile(ctx, op, &opt, &kernel), AJ_OK);
    aj_kernel_destroy(kernel);
    aj_op_destroy(op);
    snprintf(spec, sizeof spec, "attention forward flash {\n dtype = f16\n head_dim = 576\n "
             "head_dim_v = 512\n scale = 0.09\n layout = paged\n}\n");
    op = NULL;
    CHECK(aj_op_parse(ctx, spec, strlen(spec), "wide", &op) == AJ_OK);
    CHECK_STATUS(ctx, aj_compile(ctx, op, &opt, &kernel), AJ_ERR_UNSUPPORTED);
    CHECK_ERROR(ctx, sim ? "head_dim = 576: paged forward supports multiples of 8 up to 512"
                         : "head_dim = 576: cpu forward supports multiples of 8 up to 512");
    aj_op_destroy(op);
}

/* Shared caches over their range (paged_shared_case), and on sim which
 * tiles run them, each with its queries' type and with an e4m3 cache: the
 * flash variant's stage of parts is the mma tiles' (flash_fwd.c "Paged";
 * an f8 cache's rows widened, so at head dims of whole 16-byte chunks),
 * the efficient variant's the SIMT tiles'. */
static void test_shared_sweep(int sim)
{
    for (int i = 0; i < PAGED_SHARED_CASES; i++) {
        paged_case c = paged_shared_case(i);
        run(&c);
        if (!sim)
            continue;
        for (int f8 = 0; f8 < 2; f8++) {
            c.kv_dtype = f8 ? AJ_DTYPE_F8E4M3 : c.dtype;
            aj_op *op = NULL;
            aj_kernel *kernel = NULL;
            aj_compile_options opt = AJ_COMPILE_OPTIONS_INIT;
            opt.target = AJ_TARGET_SIM;
            opt.emit = AJ_EMIT_LLVM_IR;
            CHECK(paged_op(ctx, &c, &op) == AJ_OK && aj_compile(ctx, op, &opt, &kernel) == AJ_OK);
            const char *code = kernel ? aj_kernel_code(kernel, NULL) : NULL;
            int mma = code && strstr(code, "aj_sim_mma_m16n8k16") != NULL;
            char label[160];
            paged_label(&c, label, sizeof label);
            CHECK_MSG(mma == (!c.efficient && (!f8 || c.d % 16 == 0)), "%s: %s tiles", label,
                      mma ? "mma" : "SIMT");
            aj_kernel_destroy(kernel);
            aj_op_destroy(op);
        }
    }
    if (!sim)
        return;
    /* a schedule the op gives is the mma tiles' (docs/ir.md "The flash
     * forward"): 32 rows on 4 warps, one stage, taken and right; a SIMT
     * one (16 rows on 2 warps over 64 keys) refused by the flash
     * forward's budget, by message */
    paged_case c = paged_shared_case(0);
    c.sched = (aj_schedule){.block_m = 32, .block_n = 32, .warps = 4, .stages = 1};
    run(&c);
    c.sched = (aj_schedule){.block_m = 16, .block_n = 64, .warps = 2, .stages = 1};
    aj_kernel *kernel = NULL;
    CHECK_STATUS(ctx, paged_compile(ctx, dev, &c, &kernel), AJ_ERR_UNSUPPORTED);
    CHECK_ERROR(ctx, "keeps 164 f32 values per thread at head_dim_v 512 (budget 148)");
    aj_kernel_destroy(kernel);
}

/* The working CTAs of a packed group the launch counts for its split
 * choice (layouts.h): its row blocks, at most one a head; the cpu's one
 * item (block_m 0). */
static void test_workers(void)
{
    static const int64_t cases[][4] = {
        /* group, Sq, block_m, workers */
        {8, 16, 16, 8}, {128, 1, 64, 2}, {2, 1, 64, 1}, {4, 17, 16, 4}, {8, 3, 16, 2},
        {16, 1, 16, 1}, {8, 16, 0, 1}};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        CHECK_MSG(aj_attn_paged_workers(cases[i][0], cases[i][1], cases[i][2]) == cases[i][3],
                  "group %lld x Sq %lld over block_m %lld: %lld workers, want %lld",
                  (long long)cases[i][0], (long long)cases[i][1], (long long)cases[i][2],
                  (long long)aj_attn_paged_workers(cases[i][0], cases[i][1], cases[i][2]),
                  (long long)cases[i][3]);
}

/* argv[1] "sim": the sim's cases and faults (test_sim_paged); else the
 * cpu's. */
int main(int argc, char **argv)
{
    int sim = argc > 1 && strcmp(argv[1], "sim") == 0;
    if (aj_ctx_create(NULL, &ctx) != AJ_OK ||
        aj_device_open(ctx, sim ? AJ_DEVICE_SIM : AJ_DEVICE_CPU, 0, &dev) != AJ_OK) {
        printf("FAIL: no %s device\n", sim ? "sim" : "cpu");
        return 1;
    }
    if (sim) {
        test_sim();
    } else {
        test_sweep();
        test_splits();
        test_varlen_queries();
    }
    test_head_dims(sim);
    test_shared(sim);
    test_shared_sweep(sim);
    test_workers();
    test_sinks();
    test_faults();
    test_errors();
    aj_device_close(dev);
    aj_ctx_destroy(ctx);
    return check_report();
}
