/*
 * paged_cases.h -- one paged-KV forward problem (layout = paged) run on a
 * device and checked against the float64 reference (tests, bench/decode).
 *
 * A case says the sizes, dtypes, page size, each sequence's length and
 * how its pages are laid out: in order, shuffled over the cache, or with
 * every sequence sharing sequence 0's leading full pages (prefix
 * sharing).  Queries are padded (sq per sequence) or, with chunks set,
 * varlen (q_layout = varlen, chunked prefill): sequence b's chunks[b]
 * queries packed after the others' (paged_chunks makes such lists).  Every page of the cache (a few spare ones too) holds random
 * values, stored in the cache's dtype (f8: value / scale, rounded), and
 * the reference reads the stored values back, so any difference is the
 * kernel's own.
 */
#ifndef AJ_TESTS_PAGED_CASES_H
#define AJ_TESTS_PAGED_CASES_H

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "attnjit/attnjit.h"
#include "launch_args.h"
#include "ref.h"
#include "sim_harness.h"

enum { PAGED_IN_ORDER, PAGED_SHUFFLED, PAGED_SHARED_PREFIX };

/* A fault the device is given in sequence fault_seq: a block-table entry
 * of num_pages (outside the cache), or a length one past its table row. */
enum { PAGED_NO_FAULT, PAGED_FAULT_PAGE, PAGED_FAULT_LENGTH,
       /* varlen queries: cu_seqlens_q[fault_seq + 1] below cu_seqlens_q[
        * fault_seq]; seqlens_k[fault_seq] one below its chunk (>= 1) */
       PAGED_FAULT_CU_ORDER, PAGED_FAULT_BEYOND,
       /* k_cache one element past its allocation's start, a page fewer
        * (the sim/GPU kernel's chunks: a host check) */
       PAGED_FAULT_ALIGN };

typedef struct paged_case {
    aj_dtype dtype, kv_dtype;
    int d, dv;                  /* dv 0: d */
    aj_mask_kind mask;          /* none, causal, window */
    int64_t left, right;        /* window */
    double softcap;             /* 0: none */
    int alibi;                  /* score_mod = alibi, slope of head h 2^-(h + 1) / 2 */
    const char *score_expr;     /* score_mod = expr(E) (instead of softcap, alibi), NULL: none */
    const char *mask_expr;      /* mask = expr(E) (instead of mask), NULL: none */
    int b, hq, hkv, sq;
    int page_size;
    const int32_t *seqlens;     /* b lengths */
    const int32_t *chunks;      /* varlen queries: b chunk lengths; NULL: sq each */
    int pages;                  /* PAGED_* */
    int splits;                 /* the schedule's; 0: the launch's choice */
    uint64_t seed;
    int fault, fault_seq;       /* PAGED_*: what the device gets wrong (no reference) */
    int efficient;              /* compile the efficient variant (else flash) */
    int repeat;                 /* calls of aj_forward, the best timed (0: one) */
    int sinks;                  /* sinks = snk, logit paged_sink(h) of head h */
    int shared;                 /* kv_shared: V is the K cache's first dv columns */
    /* the call's heads are heads head_offset .. of hq + head_offset (the
     * launch's head_offset, heads_q_total): the sinks of those */
    int head_offset;
    double scale;               /* the op's scale; 0: the default (shared needs one) */
    aj_schedule sched;          /* the op's schedule; all 0: the template's */
} paged_case;

/* The sink logit of head h of a case with sinks: one that dominates, the
 * rest among the scores. */
static inline double paged_sink(int h)
{
    return h == 0 ? 5.0 : 0.75 - 0.5 * h;
}

typedef struct paged_result {
    aj_status status;
    double err_o, err_lse;      /* max error / tolerance (<= 1 passes) */
    int exact_empty;            /* rows without keys are exactly O = 0, LSE = -inf */
    double seconds;             /* the aj_forward call (and synchronize), best of repeat */
} paged_result;

/* A case of b sequences of these lengths: Hq 4, Hkv 2, Sq 1, page size
 * 16, pages shuffled, no mask, the launch's split count. */
static inline paged_case paged_base(aj_dtype dtype, aj_dtype kv_dtype, int d,
                                    const int32_t *seqlens, int b)
{
    paged_case c;
    memset(&c, 0, sizeof c);
    c.dtype = dtype;
    c.kv_dtype = kv_dtype;
    c.d = d;
    c.b = b;
    c.hq = 4;
    c.hkv = 2;
    c.sq = 1;
    c.page_size = 16;
    c.seqlens = seqlens;
    c.pages = PAGED_SHUFFLED;
    c.seed = 7;
    return c;
}

/* "bf16/e4m3 d128 ps16 gqa 4:1 sq 2 causal shuffled splits 4" */
static inline void paged_label(const paged_case *c, char *buf, size_t cap)
{
    static const char *const layouts[] = {"in order", "shuffled", "shared prefix"};
    snprintf(buf, cap, "%s/%s d%d", aj_dtype_name(c->dtype), aj_dtype_name(c->kv_dtype), c->d);
    size_t n = strlen(buf);
    if (c->dv && c->dv != c->d)
        n += (size_t)snprintf(buf + n, cap - n, "/%d", c->dv);
    int tq = 0;
    for (int b = 0; c->chunks && b < c->b; b++)
        tq += c->chunks[b];
    snprintf(buf + n, cap - n, " ps%d gqa %d:1 b%d %s %d %s%s%s%s%s %s splits %d%s%s", c->page_size,
             c->hq / c->hkv, c->b, c->chunks ? "varlen T" : "sq", c->chunks ? tq : c->sq,
             c->mask_expr ? "mask expr" : c->mask == AJ_MASK_CAUSAL ? "causal"
             : c->mask == AJ_MASK_WINDOW ? "window" : "none",
             c->softcap ? " softcap" : "", c->alibi ? " alibi" : "",
             c->score_expr ? " score expr" : "", c->sinks ? " sinks" : "", layouts[c->pages],
             c->splits,
             c->efficient ? " efficient" : "", c->shared ? " kv_shared" : "");
}

/* Varlen query chunks (chunked prefill), mixed per batch: sequence b
 * gets want[(b + rot) % n] queries, at most its length (a want of -1: the
 * whole sequence). */
static inline void paged_chunks(const int32_t *seqlens, int b, const int *want, int n, int rot,
                                int32_t *chunks)
{
    for (int i = 0; i < b; i++) {
        int w = want[(i + rot) % n];
        chunks[i] = w < 0 || w > seqlens[i] ? seqlens[i] : w;
    }
}

static inline uint64_t paged_rand(uint64_t *s)
{
    *s = *s * 6364136223846793005ull + 1442695040888963407ull;
    return *s >> 33;
}

static inline double paged_uniform(uint64_t *s)
{
    return (double)paged_rand(s) / (double)(1ull << 31) * 2.0 - 1.0;
}

/* n values uniform in [-amp, amp] / scale stored as dtype into dev_mem
 * (allocated), read back into ref (times scale). */
static inline aj_status paged_fill(aj_device *dev, aj_dtype dtype, size_t n, double amp,
                                   double scale, uint64_t *seed, void **dev_mem, double *ref)
{
    float *f = malloc((n ? n : 1) * sizeof *f);
    unsigned char *stored = malloc((n ? n : 1) * 4);
    aj_status st = f && stored ? AJ_OK : AJ_ERR_OUT_OF_MEMORY;
    for (size_t i = 0; st == AJ_OK && i < n; i++)
        f[i] = (float)(amp * paged_uniform(seed) / scale);
    if (st == AJ_OK)
        st = aj_convert(f, AJ_DTYPE_F32, stored, dtype, n);
    if (st == AJ_OK)
        st = aj_convert(stored, dtype, f, AJ_DTYPE_F32, n);
    for (size_t i = 0; st == AJ_OK && i < n; i++)
        ref[i] = (double)f[i];
    size_t bytes = n * (size_t)aj_dtype_size(dtype);
    if (st == AJ_OK)
        st = aj_device_alloc(dev, bytes ? bytes : 16, dev_mem);
    if (st == AJ_OK)
        st = aj_device_copy_to(dev, *dev_mem, stored, bytes);
    free(f);
    free(stored);
    return st;
}

/* The op of a case (the caller destroys it). */
static inline aj_status paged_op(aj_ctx *ctx, const paged_case *c, aj_op **out)
{
    aj_op *op = NULL;
    aj_status st = aj_op_create(ctx, AJ_KIND_FORWARD,
                                c->efficient ? AJ_VARIANT_EFFICIENT : AJ_VARIANT_FLASH, &op);
    if (st != AJ_OK)
        return st;
    aj_op_set_dtype(op, c->dtype);
    aj_op_set_head_dims(op, c->d, c->dv);
    aj_op_set_layout(op, AJ_LAYOUT_PAGED);
    aj_op_set_kv_dtype(op, c->kv_dtype);
    aj_op_set_splits(op, c->splits);
    if (c->chunks)
        aj_op_set_q_layout(op, AJ_LAYOUT_VARLEN);
    if (c->scale)
        aj_op_set_scale(op, c->scale);
    if (c->shared)
        aj_op_set_kv_shared(op, true);
    if (c->sched.block_m || c->sched.block_n || c->sched.warps || c->sched.stages)
        aj_op_set_schedule(op, &c->sched);
    if (c->mask == AJ_MASK_CAUSAL)
        aj_op_set_mask_causal(op, AJ_ALIGN_BOTTOM_RIGHT);
    if (c->mask == AJ_MASK_WINDOW)
        aj_op_set_mask_window(op, c->left, c->right, AJ_ALIGN_BOTTOM_RIGHT);
    if (c->softcap)
        aj_op_set_softcap(op, c->softcap);
    if (c->alibi)
        aj_op_set_alibi(op);
    if (c->score_expr)
        st = aj_op_set_score_mod_expr(op, c->score_expr);
    if (st == AJ_OK && c->mask_expr)
        st = aj_op_set_mask_expr(op, c->mask_expr);
    if (st == AJ_OK && c->sinks)
        st = aj_op_declare_tensor(op, "snk", AJ_SIDE_F32, 1);
    if (st == AJ_OK && c->sinks)
        st = aj_op_set_sinks(op, "snk");
    if (st != AJ_OK) {
        aj_op_destroy(op);
        return st;
    }
    *out = op;
    return AJ_OK;
}

/* The kernel of a case (cached by the caller if it likes). */
static inline aj_status paged_compile(aj_ctx *ctx, aj_device *dev, const paged_case *c,
                                      aj_kernel **kernel)
{
    aj_op *op = NULL;
    aj_status st = paged_op(ctx, c, &op);
    if (st != AJ_OK)
        return st;
    aj_compile_options opt = AJ_COMPILE_OPTIONS_INIT;
    opt.target = aj_device_target(dev);
    st = aj_compile(ctx, op, &opt, kernel);
    aj_op_destroy(op);
    return st;
}

/* The block table of a case: row b's pages, and the cache's page count. */
static inline int32_t *paged_table(const paged_case *c, uint64_t *seed, int *max_pages,
                                   int *num_pages)
{
    int most = 1, total = 0;
    for (int b = 0; b < c->b; b++) {
        int n = (c->seqlens[b] + c->page_size - 1) / c->page_size;
        most = n > most ? n : most;
        total += n;
    }
    *max_pages = most + 1;              /* a spare slot: never read */
    *num_pages = total + 3;             /* spare pages: never read */
    /* (non-negative operands, which the compiler cannot see) */
    size_t cells = (size_t)(c->b > 0 ? c->b : 0) * (size_t)(*max_pages > 0 ? *max_pages : 0);
    int32_t *table = calloc(cells ? cells : 1, sizeof *table);
    int32_t *order = malloc((size_t)*num_pages * sizeof *order);
    if (!table || !order) {
        free(table);
        free(order);
        return NULL;
    }
    for (int i = 0; i < *num_pages; i++)
        order[i] = i;
    if (c->pages != PAGED_IN_ORDER)
        for (int i = *num_pages - 1; i > 0; i--) {
            int j = (int)(paged_rand(seed) % (uint64_t)(i + 1));
            int32_t t = order[i];
            order[i] = order[j];
            order[j] = t;
        }
    int next = 0;
    for (int b = 0; b < c->b; b++) {
        int n = (c->seqlens[b] + c->page_size - 1) / c->page_size;
        int shared = 0;
        if (c->pages == PAGED_SHARED_PREFIX && b > 0) {
            int full0 = c->seqlens[0] / c->page_size, fullb = c->seqlens[b] / c->page_size;
            shared = full0 < fullb ? full0 : fullb;
        }
        for (int p = 0; p < n; p++)
            table[b * *max_pages + p] = p < shared ? table[p] : order[next++];
    }
    free(order);
    return table;
}

/* Runs case c with `kernel` (paged_compile's) on dev and checks it. */
static inline paged_result paged_run(aj_ctx *ctx, aj_device *dev, const aj_kernel *kernel,
                                     const paged_case *c)
{
    paged_result r = {AJ_OK, 0, 0, 1, 0};
    uint64_t seed = c->seed ? c->seed : 1;
    int dv = c->dv ? c->dv : c->d, max_pages = 0, num_pages = 0;
    int32_t *table = paged_table(c, &seed, &max_pages, &num_pages);
    int f8 = c->kv_dtype >= AJ_DTYPE_F8E4M3;
    const double k_scale = f8 ? 1.0 / 64 : 1.0, v_scale = f8 ? 1.0 / 32 : 1.0;
    /* the query rows of a head: B Sq, or T packed (cu_q) */
    int32_t *cu_q = c->chunks ? malloc(((size_t)c->b + 1) * sizeof *cu_q) : NULL;
    int64_t tq = (int64_t)c->b * c->sq;
    if (cu_q) {
        cu_q[0] = 0;
        for (int b = 0; b < c->b; b++)
            cu_q[b + 1] = cu_q[b] + c->chunks[b];
        tq = cu_q[c->b];
    }
    size_t nq = (size_t)tq * c->hq * c->d, no = (size_t)tq * c->hq * dv;
    size_t rows = (size_t)num_pages * c->page_size * c->hkv;
    double *q = malloc(nq * sizeof *q), *kc = malloc(rows * c->d * sizeof *kc);
    double *vc = malloc(rows * dv * sizeof *vc), *o_ref = malloc((no + 1) * sizeof *o_ref);
    double *lse_ref = malloc(((size_t)tq * c->hq + 1) * sizeof *lse_ref);
    float *o = malloc((no + 1) * sizeof *o);
    float *lse = malloc(((size_t)tq * c->hq + 1) * sizeof *lse);
    void *mem[10] = {0};
    /* alibi's slopes and the sinks of all hq + head_offset heads (those
     * before the call's: 1/g and 3 - 2 g), the reference's of the call's */
    const int ho = c->head_offset, nh = c->hq + ho;
    double *slopes = malloc((size_t)nh * sizeof *slopes), *sinks = malloc((size_t)nh * 8);
    float *slopes_f = malloc((size_t)nh * 4), *sinks_f = malloc((size_t)nh * 4);
    for (int g = 0; slopes_f && sinks_f && g < ho; g++) {
        slopes_f[g] = 1.0f / (float)(g + 1);
        sinks_f[g] = (float)(3.0 - 2.0 * g);
    }
    for (int h = 0; slopes && sinks && slopes_f && sinks_f && h < c->hq; h++) {
        slopes_f[h + ho] = (float)(pow(2.0, -(h + 1) / 2.0));
        slopes[h] = slopes_f[h + ho];
        sinks_f[h + ho] = (float)paged_sink(h);
        sinks[h] = sinks_f[h + ho];
    }
    void *sinks_mem = NULL;
    if (!table || !q || !kc || !vc || !o_ref || !lse_ref || !o || !lse || (c->chunks && !cu_q) ||
        !slopes || !sinks || !slopes_f || !sinks_f)
        r.status = AJ_ERR_OUT_OF_MEMORY;
    if (r.status == AJ_OK)
        r.status = paged_fill(dev, c->dtype, nq, 1.0, 1.0, &seed, &mem[0], q);
    if (r.status == AJ_OK)
        r.status = paged_fill(dev, c->kv_dtype, rows * c->d, 1.0, k_scale, &seed, &mem[1], kc);
    if (r.status == AJ_OK && !c->shared)
        r.status = paged_fill(dev, c->kv_dtype, rows * dv, 1.0, v_scale, &seed, &mem[2], vc);
    for (size_t i = 0; r.status == AJ_OK && c->shared && i < rows; i++)
        memcpy(vc + i * dv, kc + i * c->d, (size_t)dv * sizeof *vc);   /* V: K's columns */
    size_t o_bytes = no * (size_t)aj_dtype_size(c->dtype);
    size_t lse_n = (size_t)tq * c->hq;
    float scales[2] = {(float)k_scale, (float)v_scale};
    const size_t sizes[5] = {o_bytes + 16, lse_n * 4 + 16, (size_t)c->b * max_pages * 4 + 16,
                             (size_t)c->b * 4 + 16, 16};
    for (int i = 0; i < 5 && r.status == AJ_OK; i++)
        r.status = aj_device_alloc(dev, sizes[i], &mem[3 + i]);
    int32_t *lens = malloc((size_t)c->b * 4 + 4);
    if (r.status == AJ_OK && !lens)
        r.status = AJ_ERR_OUT_OF_MEMORY;
    if (r.status == AJ_OK) {
        memcpy(lens, c->seqlens, (size_t)c->b * 4);
        if (c->fault == PAGED_FAULT_PAGE)
            table[c->fault_seq * max_pages] = num_pages;
        if (c->fault == PAGED_FAULT_LENGTH)
            lens[c->fault_seq] = max_pages * c->page_size + 1;
        if (c->fault == PAGED_FAULT_BEYOND)
            lens[c->fault_seq] = c->chunks[c->fault_seq] - 1;
        r.status = aj_device_copy_to(dev, mem[5], table, (size_t)c->b * max_pages * 4);
    }
    if (r.status == AJ_OK)
        r.status = aj_device_copy_to(dev, mem[6], lens, (size_t)c->b * 4);
    free(lens);
    if (r.status == AJ_OK)
        r.status = aj_device_copy_to(dev, mem[7], scales, sizeof scales);
    if (r.status == AJ_OK && cu_q) {
        int32_t *cu = malloc(((size_t)c->b + 1) * 4);
        r.status = cu ? aj_device_alloc(dev, ((size_t)c->b + 1) * 4, &mem[9])
                      : AJ_ERR_OUT_OF_MEMORY;
        if (r.status == AJ_OK) {
            memcpy(cu, cu_q, ((size_t)c->b + 1) * 4);
            if (c->fault == PAGED_FAULT_CU_ORDER)
                cu[c->fault_seq + 1] = cu[c->fault_seq] - 1;
            r.status = aj_device_copy_to(dev, mem[9], cu, ((size_t)c->b + 1) * 4);
        }
        free(cu);
    }
    if (r.status == AJ_OK && c->alibi)
        r.status = aj_device_alloc(dev, (size_t)nh * 4, &mem[8]);
    if (r.status == AJ_OK && c->alibi)
        r.status = aj_device_copy_to(dev, mem[8], slopes_f, (size_t)nh * 4);
    if (r.status == AJ_OK && c->sinks)
        r.status = aj_device_alloc(dev, (size_t)nh * 4, &sinks_mem);
    if (r.status == AJ_OK && c->sinks)
        r.status = aj_device_copy_to(dev, sinks_mem, sinks_f, (size_t)nh * 4);
    const aj_side_tensor sinks_side = {"snk", sinks_mem, AJ_SIDE_F32, 1, {nh}, {1}};
    if (r.status == AJ_OK) {
        aj_fwd_args a = AJ_FWD_ARGS_INIT;
        a.head_offset = ho;
        a.heads_q_total = ho ? nh : 0;
        if (c->sinks) {
            a.side = &sinks_side;
            a.num_side = 1;
        }
        const int64_t qs[4] = {c->b, c->hq, c->sq, c->d}, os[4] = {c->b, c->hq, c->sq, dv};
        const int64_t ks[4] = {num_pages, c->page_size, c->hkv, c->d};
        const int64_t vs[4] = {num_pages, c->page_size, c->hkv, dv}, one[1] = {1};
        a.q = tensor_contiguous(mem[0], c->dtype, 4, qs);
        a.k_cache = tensor_contiguous(mem[1], c->kv_dtype, 4, ks);
        if (!c->shared)
            a.v_cache = tensor_contiguous(mem[2], c->kv_dtype, 4, vs);
        if (c->fault == PAGED_FAULT_ALIGN) {
            a.k_cache.data = (char *)mem[1] + aj_dtype_size(c->kv_dtype);
            a.k_cache.shape[0] = a.v_cache.shape[0] = num_pages - 1;
        }
        a.o = tensor_contiguous(mem[3], c->dtype, 4, os);
        a.lse = tensor_contiguous(mem[4], AJ_DTYPE_F32, 3, qs);
        if (cu_q) {   /* q, o [T, Hq, D or Dv], lse [Hq, T] */
            const int64_t pq[3] = {tq, c->hq, c->d}, po[3] = {tq, c->hq, dv};
            const int64_t pl[2] = {c->hq, tq};
            a.q = tensor_contiguous(mem[0], c->dtype, 3, pq);
            a.o = tensor_contiguous(mem[3], c->dtype, 3, po);
            a.lse = tensor_contiguous(mem[4], AJ_DTYPE_F32, 2, pl);
            a.cu_seqlens_q = mem[9];
            a.batch = c->b;
        }
        a.block_table = mem[5];
        a.max_pages = max_pages;
        a.seqlens_k = mem[6];
        const int64_t heads[1] = {nh};
        if (c->alibi)
            a.alibi_slopes = tensor_contiguous(mem[8], AJ_DTYPE_F32, 1, heads);
        if (f8) {
            a.k_scale = tensor_contiguous(mem[7], AJ_DTYPE_F32, 1, one);
            if (!c->shared)
                a.v_scale = tensor_contiguous((float *)mem[7] + 1, AJ_DTYPE_F32, 1, one);
        }
        r.seconds = INFINITY;
        for (int rep = 0; rep < (c->repeat > 1 ? c->repeat : 1) && r.status == AJ_OK; rep++) {
            struct timespec t0, t1;
            clock_gettime(CLOCK_MONOTONIC, &t0);
            r.status = aj_forward(ctx, dev, kernel, &a);
            if (r.status == AJ_OK)
                r.status = aj_device_synchronize(dev, NULL);
            clock_gettime(CLOCK_MONOTONIC, &t1);
            double t = (double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) * 1e-9;
            r.seconds = t < r.seconds ? t : r.seconds;
        }
    }
    void *o_host = malloc(o_bytes + 16);
    if (r.status == AJ_OK && !o_host)
        r.status = AJ_ERR_OUT_OF_MEMORY;
    if (r.status == AJ_OK)
        r.status = aj_device_copy_from(dev, o_host, mem[3], o_bytes);
    if (r.status == AJ_OK)
        r.status = aj_device_copy_from(dev, lse, mem[4], lse_n * 4);
    if (r.status == AJ_OK)
        r.status = aj_convert(o_host, c->dtype, o, AJ_DTYPE_F32, no);
    if (r.status == AJ_OK && c->fault == PAGED_NO_FAULT) {
        ref_problem p;
        memset(&p, 0, sizeof p);
        p.B = c->b, p.Hq = c->hq, p.Hkv = c->hkv, p.D = c->d, p.Dv = dv, p.Sq = c->sq;
        p.cu_q = cu_q;
        p.mask = c->mask;
        p.align = AJ_ALIGN_BOTTOM_RIGHT;
        p.window_left = c->left, p.window_right = c->right;
        p.softcap = c->softcap;
        p.alibi_slopes = c->alibi ? slopes : NULL;
        p.sinks = c->sinks ? sinks : NULL;
        p.scale = c->scale;
        ref_paged pg = {num_pages, c->page_size, max_pages, kc, vc, table, c->seqlens,
                        k_scale, c->shared ? k_scale : v_scale};
        /* expressions: the reference interprets the op's nodes */
        aj_op *op = NULL;
        if (c->score_expr || c->mask_expr) {
            r.status = paged_op(ctx, c, &op);
            if (op)
                ref_use_expressions(&p, op, NULL, 0);
        }
        if (r.status == AJ_OK)
            ref_paged_forward(&p, &pg, q, o_ref, lse_ref);
        aj_op_destroy(op);
        fwd_tolerance tol = fwd_tolerance_for(c->dtype);
        for (size_t i = 0; r.status == AJ_OK && i < lse_n; i++) {
            double want = lse_ref[i], got = lse[i];
            /* o's row of lse entry i: the same index, or packed (h, t) -> (t, h) */
            size_t at = cu_q ? (i % (size_t)tq) * (size_t)c->hq + i / (size_t)tq : i;
            if (want == -INFINITY) {
                int exact = got == -INFINITY;
                for (int e = 0; e < dv; e++)
                    exact &= o[at * dv + e] == 0.0f;
                r.exact_empty &= exact;
                continue;
            }
            double e = fabs(got - want) / (tol.lse_atol + tol.lse_rtol * fabs(want));
            r.err_lse = e > r.err_lse || isnan(e) ? e : r.err_lse;
            for (int x = 0; x < dv; x++) {
                double w = o_ref[at * dv + x];
                double eo = fabs(o[at * dv + x] - w) / (tol.o_atol + tol.o_rtol * fabs(w));
                r.err_o = eo > r.err_o || isnan(eo) ? eo : r.err_o;
            }
        }
    }
    for (int i = 0; i < 10; i++)
        aj_device_free(dev, mem[i]);
    aj_device_free(dev, sinks_mem);
    free(cu_q);
    free(o_host);
    free(table);
    free(q);
    free(kc);
    free(vc);
    free(o_ref);
    free(lse_ref);
    free(o);
    free(lse);
    free(slopes);
    free(sinks);
    free(slopes_f);
    free(sinks_f);
    return r;
}

/*
 * The head dims of the layout, one case each (test_cpu_paged on cpu and on
 * sim): D = 8, 16, .. 8n (case i of n: 8 (i + 1); n = PAGED_DIMS_CPU, to
 * 512, on cpu, PAGED_DIMS_GPU, to 256, on sim), Dv walking the same range
 * with a stride prime to its n values (every Dv once, D != Dv but for a
 * few), queries f16 / bf16 in turn, the cache's dtype rotating through
 * the query's, the query's, e4m3 and e5m2 (f16, bf16, e4m3, e5m2), each
 * with both variants (flash for cases 0..3 mod 8, efficient for 4..7),
 * GQA 2:1 with Sq 2 (packed), a causal mask, ragged lengths over shuffled
 * pages of 16.
 */
enum { PAGED_DIMS_CPU = 64, PAGED_DIMS_GPU = 32 };
static inline paged_case paged_dim_case(int i, int n)
{
    static const int32_t lens[2] = {37, 20};
    aj_dtype q = i % 2 ? AJ_DTYPE_BF16 : AJ_DTYPE_F16;
    aj_dtype kv = i % 4 < 2 ? q : i % 4 == 2 ? AJ_DTYPE_F8E4M3 : AJ_DTYPE_F8E5M2;
    paged_case c = paged_base(q, kv, 8 * (i + 1), lens, 2);
    c.dv = 8 * (1 + (i * 13 + 5) % n);
    c.sq = 2;
    c.mask = AJ_MASK_CAUSAL;
    c.efficient = i / 4 % 2;
    c.seed = 100 + (uint64_t)i;
    return c;
}

/*
 * Shared K/V caches (kv_shared, absorbed MLA's layout: on sim and the
 * GPUs the flash variant's mma tiles, flash_fwd.c "Paged"), case i of
 * PAGED_SHARED_CASES: D walking 8..576 (576, 512, 384 and 256 among
 * them) and Dv up to D (= D every third); one or two KV heads under
 * groups of 1, 2, 8, 16 and 64 query heads (packed up to 128 rows, one
 * head per CTA past them: 16 x 17); Sq 1, 2, 3, 4, 16, 17 and varlen
 * chunks; page sizes 1, 7, 16, 64; split counts 0..4; no mask, causal, a
 * window, an expression mask (one reading h: not packed); softcap, alibi
 * and expression score_mods (one reading h); learned sinks, folded at
 * each row's head where one part is the whole, the call's heads after a
 * head_offset in some; f16 and bf16 queries over
 * caches of their type or (every third) e4m3 / e5m2; every fourth the
 * efficient variant (the SIMT tiles), for the same cases.
 */
static inline paged_case paged_shared_case(int i)
{
    static const int32_t lens[3] = {130, 0, 45};
    static const int32_t chunks[3] = {5, 0, 17};
    static const int groups[5] = {1, 2, 8, 16, 64}, sqs[6] = {1, 2, 4, 16, 17, 3};
    static const int pages[4] = {1, 7, 16, 64}, fixed[4] = {576, 512, 384, 256};
    static const char *const masks[2] = {"k % 5 != 2 && q - k < 90", "k <= q - h % 3"};
    static const char *const mods[2] = {"score * (1.0 + 0.25 * h)", "score - 0.01 * (q - k)"};
    int d = i < 4 ? fixed[i] : 8 * (1 + (i * 29) % 72);
    aj_dtype q = i % 2 ? AJ_DTYPE_F16 : AJ_DTYPE_BF16;
    aj_dtype kv = i % 3 != 2 ? q : i % 4 < 2 ? AJ_DTYPE_F8E4M3 : AJ_DTYPE_F8E5M2;
    paged_case c = paged_base(q, kv, d, lens, 3);
    c.dv = i == 0 ? 512 : i % 3 == 0 ? d : 8 * (1 + (i * 13 + 5) % (d / 8));
    c.shared = 1;
    c.scale = 1.0 / sqrt(192.0) * 1.25;
    c.hkv = 1 + i % 2;
    c.hq = c.hkv * groups[i % 5];
    c.sq = groups[i % 5] == 64 ? 2 : sqs[i % 6];
    c.chunks = i % 7 == 3 ? chunks : NULL;
    c.page_size = pages[i % 4];
    c.splits = i % 5;
    c.mask = i % 6 == 1 || i % 6 == 3 ? AJ_MASK_CAUSAL : i % 6 == 2 ? AJ_MASK_WINDOW
                                                                    : AJ_MASK_NONE;
    c.left = 40;
    c.mask_expr = i % 6 >= 4 ? masks[i % 6 - 4] : NULL;
    c.softcap = i % 8 == 2 ? 30.0 : 0.0;
    c.alibi = i % 8 == 5;
    c.score_expr = i % 8 >= 6 ? mods[i % 8 - 6] : NULL;
    c.sinks = i % 7 == 1 || i % 7 == 4;
    c.head_offset = c.sinks && i % 2 ? 3 : 0;   /* the sinks of the call's heads */
    c.efficient = i % 4 == 3;
    c.seed = 300 + (uint64_t)i;
    return c;
}
enum { PAGED_SHARED_CASES = 24 };

/*
 * The GPU kernels' cases (test_sim_paged on sim, the GPU check's paged
 * family on a GPU), small because the sim is slow: page sizes 1, 16, 64
 * and odd ones (7, 33), shuffled and shared pages, Sq 1..5, 16 and 20, GQA
 * 1:1 .. 8:1 with the group's heads packed in one CTA (row blocks within a
 * head and across heads, 8 x 16 = 128 rows, and 8 x 17, too many: one
 * head per CTA), alibi and an expression score_mod (reading each row's
 * head) and a window under packing, an expression mask reading h (not
 * packed), head dims 64, 128 and (192, 128), f16 / bf16
 * queries with f16, bf16, f8e4m3 and f8e5m2 caches, both variants,
 * sequences of length 0 (one batch of only those), splits 1..4, and varlen
 * queries (chunked prefill): chunks of 0, 1, 7, 16, 33 queries and whole
 * sequences mixed per batch, packed and not in one launch (4 x 33 > 128),
 * and learned sinks over split-KV (packed decode, varlen chunks).
 * Fills out (PAGED_GPU_CASES of room), returns the count.
 */
enum { PAGED_GPU_CASES = 32 };
static inline int paged_gpu_cases(paged_case *out)
{
    static const int32_t lens[3] = {37, 0, 21}, one[1] = {19}, longer[2] = {70, 45};
    static const int32_t empty[2] = {0, 0};
    static const int page_sizes[5] = {1, 16, 64, 7, 33};
    static const aj_dtype kvs[3] = {AJ_DTYPE_F8E4M3, AJ_DTYPE_F8E5M2, AJ_DTYPE_BF16};
    static const int dims[3][2] = {{128, 128}, {192, 128}, {256, 256}};
    int n = 0;
    for (int i = 0; i < 5; i++) {
        paged_case c = paged_base(AJ_DTYPE_F16, AJ_DTYPE_F16, 64, lens, 3);
        c.hq = c.hkv = 1;
        c.page_size = page_sizes[i];
        c.pages = i == 3 ? PAGED_SHARED_PREFIX : PAGED_SHUFFLED;
        c.sq = i + 1;
        c.mask = AJ_MASK_CAUSAL;
        c.efficient = i % 2;
        out[n++] = c;
    }
    for (int i = 0; i < 3; i++) {
        paged_case c = paged_base(AJ_DTYPE_BF16, kvs[i], 64, lens, 3);
        c.hq = 8;
        c.hkv = i == 2 ? 8 : 1;
        out[n++] = c;
    }
    /* (256, 256) with a 16-bit cache: the widest tile cp.async streams */
    for (int i = 0; i < 3; i++) {
        paged_case c = paged_base(AJ_DTYPE_F16, i == 2 ? AJ_DTYPE_F16 : AJ_DTYPE_F8E4M3,
                                  dims[i][0], one, 1);
        c.dv = dims[i][1];
        c.hq = c.hkv = 1;
        c.sq = 16 + 4 * i;   /* 20: two row blocks of a paged part */
        c.mask = AJ_MASK_CAUSAL;
        out[n++] = c;
    }
    for (int s = 1; s <= 4; s++) {
        paged_case c = paged_base(AJ_DTYPE_BF16, AJ_DTYPE_BF16, 64, longer, 2);
        c.hq = 2;
        c.hkv = 1;
        c.sq = 2;
        c.splits = s;
        c.page_size = 8;
        c.mask = AJ_MASK_CAUSAL;
        out[n++] = c;
    }
    paged_case c = paged_base(AJ_DTYPE_BF16, AJ_DTYPE_BF16, 64, empty, 2);
    c.splits = 2;
    out[n++] = c;
    /* GQA packing: 2:1, 4:1 (row blocks across heads), 8:1 at 128 rows and
     * past them; alibi, a window (an f8 cache, the efficient variant) and
     * an expression score_mod reading h (each row at its own head's scale)
     * under packing; an expression mask reading h (its tile classes differ
     * by head: one head per CTA) */
    static const struct {
        int group, hkv, sq, splits;
        aj_mask_kind mask;
        int alibi;
        const char *score_expr, *mask_expr;
    } packed[8] = {
        {2, 2, 3, 0, AJ_MASK_CAUSAL, 0, NULL, NULL},
        {4, 2, 3, 0, AJ_MASK_CAUSAL, 0, NULL, NULL},
        {8, 1, 16, 0, AJ_MASK_CAUSAL, 0, NULL, NULL},
        {8, 1, 17, 2, AJ_MASK_CAUSAL, 0, NULL, NULL},
        {4, 2, 2, 0, AJ_MASK_CAUSAL, 1, NULL, NULL},
        {4, 2, 5, 3, AJ_MASK_WINDOW, 1, NULL, NULL},
        {4, 2, 3, 0, AJ_MASK_CAUSAL, 0, "score * (1.0 + 0.25 * h)", NULL},
        {4, 2, 3, 2, AJ_MASK_NONE, 0, NULL, "k <= q - h % 3"},
    };
    for (int i = 0; i < 8; i++) {
        int windowed = packed[i].mask == AJ_MASK_WINDOW;
        c = paged_base(i % 2 ? AJ_DTYPE_F16 : AJ_DTYPE_BF16,
                       windowed ? AJ_DTYPE_F8E4M3 : AJ_DTYPE_BF16, 64, windowed ? longer : lens,
                       windowed ? 2 : 3);
        c.hq = packed[i].group * packed[i].hkv;
        c.hkv = packed[i].hkv;
        c.sq = packed[i].sq;
        c.mask = packed[i].mask;
        c.left = 9;
        c.splits = packed[i].splits;
        c.alibi = packed[i].alibi;
        c.score_expr = packed[i].score_expr;
        c.mask_expr = packed[i].mask_expr;
        c.efficient = windowed;
        out[n++] = c;
    }
    /* varlen queries: three launches of chunk mixes (rotations), GQA 4:1
     * (the 33-query chunk too long to pack), 2:1 with alibi, 1:1 window */
    static const int32_t vlens[6] = {37, 0, 40, 5, 64, 29};
    static const int want[6] = {0, 1, 7, 16, 33, -1};
    static int32_t chunks[3][6];
    for (int r = 0; r < 3; r++) {
        paged_chunks(vlens, 6, want, 6, 2 * r, chunks[r]);
        c = paged_base(r == 1 ? AJ_DTYPE_F16 : AJ_DTYPE_BF16,
                       r == 1 ? AJ_DTYPE_F8E5M2 : AJ_DTYPE_BF16, 64, vlens, 6);
        c.chunks = chunks[r];
        c.hq = 4;
        c.hkv = r == 0 ? 1 : r == 1 ? 2 : 4;   /* 4:1, 2:1, 1:1 */
        c.mask = r == 2 ? AJ_MASK_WINDOW : AJ_MASK_CAUSAL;
        c.left = 11;
        c.alibi = r == 1;
        c.page_size = r == 2 ? 7 : 16;
        c.splits = r + 1;
        out[n++] = c;
    }
    /* learned sinks, counted once by the merge of the split-KV parts:
     * packed 4:2 decode and the third launch's varlen chunks */
    for (int i = 0; i < 2; i++) {
        c = paged_base(i ? AJ_DTYPE_F16 : AJ_DTYPE_BF16, i ? AJ_DTYPE_F8E4M3 : AJ_DTYPE_BF16,
                       64, i ? vlens : longer, i ? 6 : 2);
        c.hq = 8;
        c.hkv = i ? 8 : 2;
        c.sq = 3;
        c.chunks = i ? chunks[2] : NULL;
        c.mask = AJ_MASK_CAUSAL;
        c.splits = 2 + i;
        c.sinks = 1;
        out[n++] = c;
    }
    return n;
}

#endif /* AJ_TESTS_PAGED_CASES_H */
