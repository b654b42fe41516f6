/*
 * bench_score.c -- what score programs cost, each against its baseline in
 * the same run, interleaved (bench/README.md):
 *
 *   causal as an expression   `mask = expr(k <= q)` vs `causal(top_left)`
 *   document mask             8 equal documents (causal inside each),
 *                             one block mask built once and passed, vs
 *                             the same op unmasked: the tiles across
 *                             documents are skipped
 *   implicit build            the document mask with no block mask passed
 *                             (the launch builds one each call) vs the
 *                             same with the one built once
 *   block mask                aj_block_mask_create at S (the build kernel
 *                             on the device, to its end) vs one forward of
 *                             the document mask at S
 *   tile lists                the document mask at S with the mask of the
 *                             kernel's tile (the kernel walks its row
 *                             block's list of non-skip tiles) vs a mask of
 *                             a tile twice as wide (each tile of the band's
 *                             range classed from the mask, as before lists)
 *   bias as a program         score_mod = expr(score + B[0, h, q, k]) over
 *                             a bf16 side tensor B (the efficient and the
 *                             flash variant), causal, vs the efficient
 *                             variant's built-in bias = add of the same
 *                             values (docs/ir.md "bias")
 *
 * bench_score [--device cpu|sim] [--variant efficient|flash] [--seq S]
 *             [--mask-seq S] [--bias-seq S] [--heads H] [--dim D] [--repeat N]
 * Defaults: cpu, S 4096 for the first two, 8192 for the block mask, 2048
 * for the bias, B1 H4 d64 bf16, 5 repeats (the median is reported).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "attnjit/attnjit.h"
#include "bench_common.h"
#include "timing.h"

static aj_ctx *ctx;
static aj_device *dev;
static const char *variant = "efficient";

static void die(const char *what)
{
    fprintf(stderr, "bench_score: %s: %s\n", what, aj_last_error(ctx));
    exit(1);
}

/* One problem: its op, kernel, device tensors and arguments. */
typedef struct problem {
    aj_op *op;
    aj_kernel *kernel;
    void *mem[7];   /* q, k, v, o, lse, doc, bias */
    int32_t *doc_host;
    aj_side_tensor side;
    aj_fwd_args args;
} problem;

static void *device_tensor(size_t bytes, const void *init)
{
    void *p = NULL;
    if (aj_device_alloc(dev, bytes, &p) != AJ_OK)
        die("alloc");
    if (init && aj_device_copy_to(dev, p, init, bytes) != AJ_OK)
        die("copy");
    return p;
}

/* n bf16 values in [-0.5, 0.5) from seed (malloc'ed; exits when out of
 * memory). */
static uint16_t *bf16_random(size_t n, uint64_t seed)
{
    uint16_t *v = malloc(n * 2);
    if (!v) {
        fprintf(stderr, "bench_score: out of memory\n");
        exit(1);
    }
    for (size_t i = 0; i < n; i++) {
        seed = seed * 6364136223846793005ull + 1442695040888963407ull;
        float f = (float)((double)(seed >> 40) / 16777216.0 - 0.5);
        aj_convert(&f, AJ_DTYPE_F32, &v[i], AJ_DTYPE_BF16, 1);
    }
    return v;
}

static void problem_make_as(problem *p, const char *var, const char *fields, int S, int H,
                            int D)
{
    memset(p, 0, sizeof *p);
    char spec[512];
    snprintf(spec, sizeof spec, "attention forward %s { dtype = bf16 head_dim = %d %s }",
             var, D, fields);
    if (aj_op_parse(ctx, spec, strlen(spec), "bench", &p->op) != AJ_OK)
        die(spec);
    aj_compile_options opt = AJ_COMPILE_OPTIONS_INIT;
    opt.target = aj_device_target(dev);
    if (aj_compile(ctx, p->op, &opt, &p->kernel) != AJ_OK)
        die(spec);
    size_t n = (size_t)H * S * D;
    uint16_t *init = bf16_random(n, 12345);
    aj_tensor *ts[4] = {&p->args.q, &p->args.k, &p->args.v, &p->args.o};
    p->args = (aj_fwd_args)AJ_FWD_ARGS_INIT;
    for (int t = 0; t < 4; t++) {
        p->mem[t] = device_tensor(n * 2, t < 3 ? init : NULL);
        *ts[t] = (aj_tensor){p->mem[t], AJ_DTYPE_BF16, 4, {1, H, S, D},
                             {(int64_t)H * S * D, (int64_t)S * D, D, 1}};
    }
    p->mem[4] = device_tensor((size_t)H * S * 4, NULL);
    p->args.lse = (aj_tensor){p->mem[4], AJ_DTYPE_F32, 3, {1, H, S}, {(int64_t)H * S, S, 1}};
    free(init);
    /* 8 equal documents, for the ops that declare `doc` */
    p->doc_host = malloc((size_t)S * sizeof *p->doc_host);
    for (int t = 0; t < S; t++)
        p->doc_host[t] = t / (S / 8);
    p->mem[5] = device_tensor((size_t)S * 4, p->doc_host);
    p->side = (aj_side_tensor){"doc", p->mem[5], AJ_SIDE_I32, 2, {1, S}, {S, 1}};
    aj_op_info info;
    aj_op_get_info(p->op, &info);
    if (info.num_tensors) {
        p->args.side = &p->side;
        p->args.num_side = 1;
    }
}

static void problem_make(problem *p, const char *fields, int S, int H, int D)
{
    problem_make_as(p, variant, fields, S, H, D);
}

/* A bias of [1, H, S, S] bf16 values: the launch's bias (bias = add) or
 * side tensor B (an op that declares it). */
static void problem_bias(problem *p, int S, int H)
{
    size_t n = (size_t)H * S * S;
    uint16_t *init = bf16_random(n, 777);
    p->mem[6] = device_tensor(n * 2, init);
    free(init);
    const int64_t shape[4] = {1, H, S, S}, strides[4] = {(int64_t)n, (int64_t)S * S, S, 1};
    aj_op_info info;
    aj_op_get_info(p->op, &info);
    if (info.num_tensors) {
        p->side = (aj_side_tensor){"B", p->mem[6], AJ_SIDE_BF16, 4, {0}, {0}};
        memcpy(p->side.shape, shape, sizeof shape);
        memcpy(p->side.strides, strides, sizeof strides);
        return;
    }
    p->args.bias = (aj_tensor){p->mem[6], AJ_DTYPE_BF16, 4, {0}, {0}};
    memcpy(p->args.bias.shape, shape, sizeof shape);
    memcpy(p->args.bias.strides, strides, sizeof strides);
}

static void problem_free(problem *p)
{
    for (int i = 0; i < 7; i++)
        aj_device_free(dev, p->mem[i]);
    free(p->doc_host);
    aj_kernel_destroy(p->kernel);
    aj_op_destroy(p->op);
}

static double run_once(problem *p)
{
    double t0 = now_s();
    if (aj_forward(ctx, dev, p->kernel, &p->args) != AJ_OK ||
        aj_device_synchronize(dev, NULL) != AJ_OK)
        die("forward");
    return now_s() - t0;
}

/* Medians of a and b timed in turn (a, b, a, b, ...) after one warm-up each. */
static void interleave(problem *a, problem *b, int repeat, double *ta, double *tb)
{
    double xa[64], xb[64];
    run_once(a);
    run_once(b);
    for (int r = 0; r < repeat; r++) {
        xa[r] = run_once(a);
        xb[r] = run_once(b);
    }
    *ta = median(xa, repeat);
    *tb = median(xb, repeat);
}

/* The bias rows: the program over a bf16 side tensor on each variant vs
 * the efficient variant's built-in bias = add. */
static void bench_bias(int S, int H, int D, int repeat)
{
    problem builtin;
    problem_make_as(&builtin, "efficient", "mask = causal(top_left) bias = add", S, H, D);
    problem_bias(&builtin, S, H);
    static const char *const vars[2] = {"efficient", "flash"};
    for (int v = 0; v < 2; v++) {
        problem prog;
        problem_make_as(&prog, vars[v], "tensors = (B: bf16[4]) mask = causal(top_left) "
                        "score_mod = expr(score + B[0, h, q, k])", S, H, D);
        problem_bias(&prog, S, H);
        double tb, tp;
        interleave(&builtin, &prog, repeat, &tb, &tp);
        printf("| bias as a program over a bf16 side tensor (%s) vs bias = add (efficient), "
               "causal | %d | %.2f | %.2f | %.3f |\n", vars[v], S, tb * 1e3, tp * 1e3, tp / tb);
        problem_free(&prog);
    }
    problem_free(&builtin);
}

int main(int argc, char **argv)
{
    const char *device = "cpu";
    int S = 4096, SM = 8192, SB = 2048, H = 4, D = 64, repeat = 5;
    const bench_int_option ints[] = {{"--seq", &S},   {"--mask-seq", &SM}, {"--bias-seq", &SB},
                                     {"--heads", &H}, {"--dim", &D},       {"--repeat", &repeat}};
    for (int i = 1; i + 1 < argc; i += 2) {
        if (bench_int_arg(ints, sizeof ints / sizeof ints[0], argv[i], argv[i + 1]))
            continue;
        if (strcmp(argv[i], "--device") == 0)
            device = argv[i + 1];
        else if (strcmp(argv[i], "--variant") == 0)
            variant = argv[i + 1];
    }
    if (repeat < 1 || repeat > 64 || S < 8 || SM < 8 || SB < 8) {
        fprintf(stderr, "bench_score: --repeat 1..64, --seq, --mask-seq and --bias-seq >= 8\n");
        return 2;
    }
    if (aj_ctx_create(NULL, &ctx) != AJ_OK)
        return 1;
    if (aj_device_open(ctx, strcmp(device, "sim") == 0 ? AJ_DEVICE_SIM : AJ_DEVICE_CPU, 0,
                       &dev) != AJ_OK)
        die("device");
    printf("bench_score on %s: %s forward, B1 H%d d%d bf16, median of %d, interleaved\n\n",
           aj_device_name(dev), variant, H, D, repeat);
    printf("| case | S | baseline ms | case ms | case / baseline |\n|---|---|---|---|---|\n");

    problem builtin, expr;
    problem_make(&builtin, "mask = causal(top_left)", S, H, D);
    problem_make(&expr, "mask = expr(k <= q)", S, H, D);
    double tb, te;
    interleave(&builtin, &expr, repeat, &tb, &te);
    printf("| causal as expr(k <= q) vs causal(top_left) | %d | %.2f | %.2f | %.3f |\n", S,
           tb * 1e3, te * 1e3, te / tb);
    problem_free(&builtin);
    problem_free(&expr);

    problem plain, doc;
    problem_make(&plain, "", S, H, D);
    problem_make(&doc, "tensors = (doc: i32[2]) mask = expr(doc[b, q] == doc[b, k] && k <= q)",
                 S, H, D);
    aj_block_mask *once = NULL;
    if (aj_block_mask_create(ctx, dev, doc.op, doc.kernel, &doc.args, &once) != AJ_OK)
        die("block mask");
    problem implicit = doc;   /* the same tensors, no mask passed */
    doc.args.block_mask = once;
    double tp, td;
    interleave(&plain, &doc, repeat, &tp, &td);
    printf("| document mask, 8 equal documents (block mask built once), vs unmasked | %d | "
           "%.2f | %.2f | %.3f |\n", S, tp * 1e3, td * 1e3, td / tp);
    double tpass, timp;
    interleave(&doc, &implicit, repeat, &tpass, &timp);
    printf("| document mask: implicit build each call vs the mask built once | %d | %.2f | "
           "%.2f | %.3f |\n", S, tpass * 1e3, timp * 1e3, timp / tpass);
    aj_block_mask_destroy(once);
    problem_free(&plain);
    problem_free(&doc);

    problem big;
    problem_make(&big, "tensors = (doc: i32[2]) mask = expr(doc[b, q] == doc[b, k] && k <= q)",
                 SM, H, D);
    double xf[64], xm[64];
    aj_tile_counts counts;
    run_once(&big);
    for (int r = -1; r < repeat; r++) {   /* -1: the warm-up (the builder's compile) */
        if (r >= 0)
            xf[r] = run_once(&big);
        double t0 = now_s();
        aj_block_mask *m = NULL;
        if (aj_block_mask_create(ctx, dev, big.op, big.kernel, &big.args, &m) != AJ_OK ||
            aj_device_synchronize(dev, NULL) != AJ_OK)
            die("block mask");
        if (r >= 0)
            xm[r] = now_s() - t0;
        aj_block_mask_counts(m, &counts);
        aj_block_mask_destroy(m);
    }
    double tf = median(xf, repeat), tm = median(xm, repeat);
    printf("| block mask (%lld skip, %lld partial, %lld full tiles of %d x %d) vs one forward "
           "| %d | %.2f | %.2f | %.3f |\n",
           (long long)counts.tiles[AJ_TILE_SKIP], (long long)counts.tiles[AJ_TILE_PARTIAL],
           (long long)counts.tiles[AJ_TILE_FULL], counts.block_m, counts.block_n, SM, tf * 1e3,
           tm * 1e3, tm / tf);

    /* the list walk against per-tile classes at SM: the forward given the
     * mask of its own tile (it walks each row block's list) and given one
     * of a tile twice as wide (it classes each tile of the band's range
     * from the mask tile covering it, as before the lists) */
    aj_block_mask *own = NULL, *wide = NULL;
    if (aj_block_mask_create(ctx, dev, big.op, big.kernel, &big.args, &own) != AJ_OK)
        die("block mask");
    char fields[256];
    snprintf(fields, sizeof fields, "tensors = (doc: i32[2]) mask = expr(doc[b, q] == doc[b, "
             "k] && k <= q) schedule = (block_m = %d, block_n = %d)", counts.block_m,
             2 * counts.block_n);
    problem widep;
    problem_make(&widep, fields, 8, 1, D);   /* its kernel's tile only */
    if (aj_block_mask_create(ctx, dev, widep.op, widep.kernel, &big.args, &wide) != AJ_OK)
        die("block mask");
    problem per_tile = big;
    per_tile.args.block_mask = wide;
    big.args.block_mask = own;
    double tt, tl;
    interleave(&per_tile, &big, repeat, &tt, &tl);
    printf("| document mask: tile lists vs per-tile classes (a mask of %d x %d tiles) | %d | "
           "%.2f | %.2f | %.3f |\n", counts.block_m, 2 * counts.block_n, SM, tt * 1e3,
           tl * 1e3, tl / tt);
    aj_block_mask_destroy(own);
    aj_block_mask_destroy(wide);
    problem_free(&widep);
    problem_free(&big);
    bench_bias(SB, H, D, repeat);
    aj_device_close(dev);
    aj_ctx_destroy(ctx);
    return 0;
}
