/*
 * bench_program_size.c -- compile time against the size of a score
 * program (issue 33: programs of 4096 nodes, compile time no worse than
 * linear in their size).
 *
 *   build/bench/bench_program_size [--repeat N] [--target cpu|sm_90|...]
 *                                   [--family rope|mixture] [--max-terms T]
 *
 * Two families of T terms each, summed as a balanced tree:
 *   rope      forward: score + 0.01 * sum_i qr[h, q, i] * kr[k, i], the
 *             rope part of an MLA score (about 10 nodes a term)
 *   mixture   backward: score + sum_i w[i] * tanh(score * u[i]), whose
 *             derivative the program carries too (about 16 nodes a term
 *             with it)
 * For each T: the program's nodes (the op's and the score program's, the
 * derivative included), the median compile time (parse, verify, build,
 * optimise, emit; the cache bypassed) and, against the same op with no
 * score_mod measured interleaved in the same run (the baseline), the
 * extra time per program node: flat as T grows means linear.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "attnjit/attnjit.h"
#include "bench_common.h"
#include "templates/score.h"
#include "timing.h"

/* sum_{i in [lo, hi)} TERM(i), balanced, appended to out */
static void sum_terms(const char *family, int lo, int hi, char *out, size_t cap)
{
    size_t len = strlen(out);
    if (hi - lo == 1) {
        if (strcmp(family, "rope") == 0)
            snprintf(out + len, cap - len, "qr[h, q, %d] * kr[k, %d]", lo, lo);
        else
            snprintf(out + len, cap - len, "w[%d] * tanh(score * u[%d])", lo, lo);
        return;
    }
    snprintf(out + len, cap - len, "(");
    sum_terms(family, lo, (lo + hi) / 2, out, cap);
    len = strlen(out);
    snprintf(out + len, cap - len, " + ");
    sum_terms(family, (lo + hi) / 2, hi, out, cap);
    len = strlen(out);
    snprintf(out + len, cap - len, ")");
}

static void spec_of(const char *family, int terms, char *out, size_t cap)
{
    bool rope = strcmp(family, "rope") == 0;
    int n = snprintf(out, cap, "attention %s efficient { dtype = bf16 head_dim = 64 "
                     "mask = causal(top_left) tensors = %s ",
                     rope ? "forward" : "backward",
                     rope ? "(qr: f32[3], kr: f32[2])" : "(w: f32[1], u: f32[1])");
    if (terms == 0) {
        snprintf(out + n, cap - (size_t)n, "}");
        return;
    }
    snprintf(out + n, cap - (size_t)n, "score_mod = expr(score + %s(", rope ? "0.01 * " : "");
    sum_terms(family, 0, terms, out, cap);
    size_t len = strlen(out);
    snprintf(out + len, cap - len, ")) }");
}

/* One compile of spec (bench_common.h): ms, or -1 with a message. */
static double compile_once(aj_ctx *ctx, const char *spec, aj_target target,
                           aj_compile_stats *stages)
{
    return bench_compile_once(ctx, "bench_program_size", "bench", spec, strlen(spec), target,
                              2, stages, NULL);
}

/* The op's expression nodes and its score program's, derivative included. */
static void node_counts(aj_ctx *ctx, const char *spec, int *op_nodes, int *prog_nodes)
{
    aj_op *op = NULL;
    *op_nodes = *prog_nodes = 0;
    if (aj_op_parse(ctx, spec, strlen(spec), "bench", &op) != AJ_OK)
        return;
    *op_nodes = op->expr.count;
    aj_score_prog prog;
    if (aj_score_prog_init(ctx, op, &prog) == AJ_OK) {
        *prog_nodes = prog.e.count;
        aj_score_prog_free(&prog);
    }
    aj_op_destroy(op);
}

int main(int argc, char **argv)
{
    int repeat = 5, max_terms = 384;
    const char *only = NULL;
    aj_target target = AJ_TARGET_CPU;
    aj_ctx *ctx = NULL;
    aj_ctx_create(NULL, &ctx);
    for (int i = 1; i + 1 < argc; i += 2) {
        if (strcmp(argv[i], "--repeat") == 0)
            repeat = atoi(argv[i + 1]);
        else if (strcmp(argv[i], "--family") == 0)
            only = argv[i + 1];
        else if (strcmp(argv[i], "--max-terms") == 0)
            max_terms = atoi(argv[i + 1]);
        else if (strcmp(argv[i], "--target") == 0 &&
                 aj_target_from_name(ctx, argv[i + 1], &target) != AJ_OK)
            return fprintf(stderr, "bench_program_size: %s\n", aj_last_error(ctx)), 2;
    }
    if (repeat < 1 || repeat > 99)
        repeat = 5;
    static char spec[1 << 17], base[4096];
    static const int sizes[] = {8, 16, 32, 64, 128, 256, 384};
    printf("target %s, %d repeats, medians; baseline: the op without a score_mod, interleaved\n\n",
           aj_target_name(target), repeat);
    printf("| family | terms | op nodes | program nodes | baseline ms | compile ms | extra us / "
           "program node | build / opt / emit ms | IR insts |\n"
           "|---|---:|---:|---:|---:|---:|---:|---|---:|\n");
    const char *families[] = {"rope", "mixture"};
    for (int f = 0; f < 2; f++) {
        if (only && strcmp(only, families[f]) != 0)
            continue;
        spec_of(families[f], 0, base, sizeof base);
        for (size_t s = 0; s < sizeof sizes / sizeof sizes[0] && sizes[s] <= max_terms; s++) {
            spec_of(families[f], sizes[s], spec, sizeof spec);
            int op_nodes, prog_nodes;
            node_counts(ctx, spec, &op_nodes, &prog_nodes);
            if (!prog_nodes) {
                printf("| %s | %d | %d | (over the limit: %s) | | | |\n", families[f], sizes[s],
                       op_nodes, aj_last_error(ctx));
                continue;
            }
            double tb[99], tc[99];
            aj_compile_stats cs = {0};
            bool ok = true;
            for (int r = 0; r < repeat && ok; r++) {
                tb[r] = compile_once(ctx, base, target, NULL);
                tc[r] = compile_once(ctx, spec, target, &cs);
                ok = tb[r] >= 0 && tc[r] >= 0;
            }
            if (!ok)
                break;
            double mb = median(tb, repeat), mc = median(tc, repeat);
            printf("| %s | %d | %d | %d | %.1f | %.1f | %.1f | %.0f / %.0f / %.0f | %d |\n",
                   families[f], sizes[s], op_nodes, prog_nodes, mb, mc,
                   1e3 * (mc - mb) / prog_nodes, cs.build_ms / repeat, cs.optimize_ms / repeat,
                   cs.emit_ms / repeat, (int)cs.ir_instructions);
            fflush(stdout);
        }
    }
    aj_ctx_destroy(ctx);
    return 0;
}
