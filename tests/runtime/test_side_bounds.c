/*
 * test_side_bounds.c -- check_side_bounds (docs/ir.md "Side tensors in
 * bounds"): a launch that asks for it is refused when a load of the op's
 * expressions may leave its tensor over the launch's positions, heads and
 * batch, and runs when every load is in bounds or guarded (clamp, min /
 * max, a select or && on a bound); without the flag every launch runs
 * (the rule: a load outside reads 0).  Forward and backward, on the cpu
 * device (the check is the launch's, the same on every device).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "launch_args.h"
#include "spec_compile.h"

enum { B = 2, H = 2, S = 16, D = 32 };

static aj_ctx *ctx;
static aj_device *dev;

typedef struct bounds_case {
    const char *field;      /* mask = ... or score_mod = ..., the op's expression */
    const char *tensor;     /* its declaration */
    int64_t shape[2];       /* the side tensor given at launch (rank 1 or 2) */
    int rank;
    int in_bounds;          /* the check passes */
    const char *names;      /* the refusal names this (the tensor, the range) */
} bounds_case;

static const bounds_case cases[] = {
    /* a relative-position table indexed past its ends for |q - k| > 4 */
    {"score_mod = expr(score + rel[h, q - k + 4])", "rel: f32[2]", {H, 9}, 2, 0,
     "side tensor 'rel': index 1 of a load may be -11 .. 19"},
    {"score_mod = expr(score + rel[h, clamp(q - k, -4, 4) + 4])", "rel: f32[2]", {H, 9}, 2, 1,
     NULL},
    {"score_mod = expr(score + rel[h, min(max(q - k, -4), 4) + 4])", "rel: f32[2]", {H, 9}, 2, 1,
     NULL},
    {"score_mod = expr(abs(q - k) <= 4 ? score + rel[h, q - k + 4] : score)", "rel: f32[2]",
     {H, 9}, 2, 1, NULL},
    {"score_mod = expr(abs(q - k) <= 5 ? score + rel[h, q - k + 4] : score)", "rel: f32[2]",
     {H, 9}, 2, 0, "index 1 of a load may be -1 .. 9"},
    {"score_mod = expr(q - k <= 4 && q - k >= -4 ? score + rel[h, q - k + 4] : score)",
     "rel: f32[2]", {H, 9}, 2, 1, NULL},
    {"mask = expr(q - k < 4 && q - k > -4 && tab[q - k + 3] > 0)", "tab: i32[1]", {7}, 1, 1,
     NULL},
    /* a causal band bounds q - k on one side only: 0 .. S - 1 */
    {"mask = causal(top_left) score_mod = expr(score + rel[h, q - k])", "rel: f32[2]", {H, S},
     2, 1, NULL},
    {"mask = causal(top_left) score_mod = expr(score + rel[h, q - k])", "rel: f32[2]",
     {H, S - 1}, 2, 0, "index 1 of a load may be 0 .. 15"},
    {"mask = expr(k < 2 || tab[k - 2] > 0)", "tab: i32[1]", {S - 2}, 1, 1, NULL},
    {"mask = expr(k < 2 || tab[k - 2] > 0)", "tab: i32[1]", {S - 3}, 1, 0,
     "index 0 of a load may be 0 .. 13"},
    /* per-batch documents: b and q in bounds; one short of the keys */
    {"mask = expr(doc[b, q] == doc[b, k])", "doc: i32[2]", {B, S}, 2, 1, NULL},
    {"mask = expr(doc[b, q] == doc[b, k])", "doc: i32[2]", {B, S - 1}, 2, 0,
     "side tensor 'doc': index 1"},
    {"mask = expr(doc[b, q] == doc[b, k])", "doc: i32[2]", {B - 1, S}, 2, 0,
     "side tensor 'doc': index 0 of a load may be 0 .. 1"},
    /* a table per head, one head short */
    {"score_mod = expr(score * tab[h])", "tab: f32[1]", {H - 1}, 1, 0,
     "side tensor 'tab': index 0 of a load may be 0 .. 1"},
    /* an index read from another tensor: unknown values, unless clamped */
    {"mask = expr(tab[idx[k]] > 0)", "idx: i32[1], tab: i32[1]", {S}, 1, 0,
     "side tensor 'tab': index 0 of a load may be unbounded"},
};

/* The side tensors of a case: its own of cases[i].shape (zeros), and an
 * idx of S entries where the case declares two. */
static void run_case(int i, aj_kind kind)
{
    const bounds_case *c = &cases[i];
    char spec[512], label[32];
    snprintf(label, sizeof label, "case %d %s", i, kind == AJ_KIND_FORWARD ? "fwd" : "bwd");
    snprintf(spec, sizeof spec,
             "attention %s flash { dtype = f32 head_dim = %d tensors = (%s) %s }",
             kind == AJ_KIND_FORWARD ? "forward" : "backward", D, c->tensor, c->field);
    aj_compile_options opt = AJ_COMPILE_OPTIONS_INIT;
    opt.target = AJ_TARGET_CPU;
    aj_kernel *k = NULL;
    CHECK_MSG(spec_compile(ctx, spec, label, &opt, &k) == AJ_OK, "%s: %s", label,
              aj_last_error(ctx));
    if (!k)
        return;
    const size_t n = (size_t)B * H * S * D;
    float *buf[9];
    for (int t = 0; t < 9; t++)
        buf[t] = calloc(n + 16, sizeof(float));
    int32_t *idx = calloc(S, sizeof(int32_t));
    int32_t *side_data = calloc((size_t)(c->shape[0] * (c->rank > 1 ? c->shape[1] : 1)) + 1, 4);
    /* the case's tensor is the declaration's last; an idx before it */
    const char *decl = strrchr(c->tensor, ',') ? strrchr(c->tensor, ',') + 2 : c->tensor;
    char name[8];
    snprintf(name, sizeof name, "%.*s", (int)(strchr(decl, ':') - decl), decl);
    aj_side_tensor side[2];
    int ns = 0;
    if (decl != c->tensor)
        side[ns++] = (aj_side_tensor){"idx", idx, AJ_SIDE_I32, 1, {S}, {1}};
    side[ns++] = (aj_side_tensor){name, side_data, strstr(decl, "f32") ? AJ_SIDE_F32 : AJ_SIDE_I32,
                                  c->rank, {c->shape[0], c->shape[1]},
                                  {c->rank > 1 ? c->shape[1] : 1, 1}};
    const aj_tensor qkv = tensor_dims(NULL, AJ_DTYPE_F32, 4, B, H, S, D);
    aj_tensor t[9];
    for (int x = 0; x < 9; x++) {
        t[x] = qkv;
        t[x].data = buf[x];
    }
    aj_tensor lse = tensor_dims(buf[4], AJ_DTYPE_F32, 3, B, H, S, 0);
    for (int check = 0; check < 2; check++) {
        aj_status st;
        if (kind == AJ_KIND_FORWARD) {
            aj_fwd_args a = AJ_FWD_ARGS_INIT;
            a.q = t[0], a.k = t[1], a.v = t[2], a.o = t[3], a.lse = lse;
            a.side = side, a.num_side = ns, a.check_side_bounds = check;
            st = aj_forward(ctx, dev, k, &a);
        } else {
            aj_bwd_args a = AJ_BWD_ARGS_INIT;
            a.q = t[0], a.k = t[1], a.v = t[2], a.o = t[3], a.lse = lse, a.do_ = t[5];
            a.dq = t[6], a.dk = t[7], a.dv = t[8];
            a.side = side, a.num_side = ns, a.check_side_bounds = check;
            st = aj_backward(ctx, dev, k, &a);
        }
        if (!check || c->in_bounds) {
            CHECK_MSG(st == AJ_OK, "%s (check %d): %s", label, check, aj_last_error(ctx));
        } else {
            CHECK_MSG(st == AJ_ERR_INVALID_ARG, "%s: an out-of-bounds load was not refused",
                      label);
            CHECK_MSG(strstr(aj_last_error(ctx), c->names) != NULL, "%s: message '%s' lacks "
                      "'%s'", label, aj_last_error(ctx), c->names);
        }
    }
    for (int x = 0; x < 9; x++)
        free(buf[x]);
    free(idx);
    free(side_data);
    aj_kernel_destroy(k);
}

int main(void)
{
    CHECK(aj_ctx_create(NULL, &ctx) == AJ_OK);
    CHECK(aj_device_open(ctx, AJ_DEVICE_CPU, 0, &dev) == AJ_OK);
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        run_case((int)i, AJ_KIND_FORWARD);
        if (i % 4 == 0)
            run_case((int)i, AJ_KIND_BACKWARD);
    }
    aj_device_close(dev);
    aj_ctx_destroy(ctx);
    return check_report();
}
