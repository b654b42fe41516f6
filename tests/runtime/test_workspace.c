/*
 * test_workspace.c -- the flash backward's workspace from the launch plan's
 * layout rule (runtime.h, aj_workspace_rule) against the bytes and
 * offsets aj_backward used before the rule moved into the plan: the table
 * below was recorded from launch.c's per-call workspace_layout at a25ba09,
 * over ops (padded, varlen, deterministic, D != Dv, dropout, the efficient
 * variant's none) and shapes (empty, odd, large, GQA).
 */
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "check.h"
#include "runtime/launch_internal.h"

/* The sweep: ops x shapes. */
static const char *const ws_ops[] = {
#define BWD_OP(variant, extra) "attention backward " variant " {\n dtype = f16\n " extra "\n}"
    BWD_OP("flash", "head_dim = 64"),
    BWD_OP("flash", "head_dim = 128 \n mask = causal(top_left)"),
    BWD_OP("flash", "head_dim = 64 \n deterministic = true"),
    BWD_OP("flash", "head_dim = 96 \n head_dim_v = 64 \n dropout = 0.1"),
    BWD_OP("flash", "head_dim = 64 \n layout = varlen"),
    BWD_OP("flash", "head_dim = 128 \n layout = varlen \n deterministic = true"),
    BWD_OP("efficient", "head_dim = 64"),
    BWD_OP("flash", "head_dim = 32 \n head_dim_v = 64 \n layout = varlen \n dropout = 0.2"),
#undef BWD_OP
};
#define WS_OPS ((int)(sizeof ws_ops / sizeof ws_ops[0]))

/* padded: B, Hq, Hkv, Sq, Sk; varlen: batch, Hq, Hkv, Tq, Tk (max lengths
 * Tq / batch + 1 and Tk) */
static const int64_t ws_shapes[][5] = {
    {1, 1, 1, 1, 1},   {1, 2, 1, 17, 33},  {2, 8, 2, 128, 128}, {3, 5, 5, 7, 300},
    {4, 16, 4, 1023, 77}, {1, 32, 8, 4096, 4096}, {7, 3, 1, 3, 0}, {2, 4, 2, 0, 9},
};
#define WS_SHAPES ((int)(sizeof ws_shapes / sizeof ws_shapes[0]))

/* Backward arguments of shape s (ws_shapes) over a dummy buffer: the
 * checks read only the pointers' alignment. */
static _Alignas(64) uint16_t dummy[64];
static const _Alignas(16) int32_t cu_dummy[8];

static aj_tensor dense(aj_dtype dt, int rank, const int64_t *shape)
{
    aj_tensor t = {dummy, dt, rank, {0}, {0}};
    int64_t stride = 1;
    for (int i = rank - 1; i >= 0; i--) {
        t.shape[i] = shape[i];
        t.strides[i] = stride;
        stride *= shape[i] ? shape[i] : 1;
    }
    return t;
}

static aj_bwd_args ws_args(int varlen, int64_t d, int64_t dv, const int64_t *s)
{
    aj_bwd_args a = AJ_BWD_ARGS_INIT;
    const aj_dtype h = AJ_DTYPE_F16;
    if (varlen) {
        const int64_t q[3] = {s[3], s[1], d}, k[3] = {s[4], s[2], d}, v[3] = {s[4], s[2], dv},
                      o[3] = {s[3], s[1], dv}, l[2] = {s[1], s[3]};
        a.q = dense(h, 3, q), a.dq = a.q;
        a.k = dense(h, 3, k), a.dk = a.k;
        a.v = dense(h, 3, v), a.dv = a.v;
        a.o = dense(h, 3, o), a.do_ = a.o;
        a.lse = dense(AJ_DTYPE_F32, 2, l);
        a.cu_seqlens_q = cu_dummy, a.cu_seqlens_k = cu_dummy;
        a.batch = (int32_t)s[0];
        a.max_seqlen_q = (int32_t)(s[3] / s[0] + 1);
        a.max_seqlen_k = (int32_t)s[4];
    } else {
        const int64_t q[4] = {s[0], s[1], s[3], d}, k[4] = {s[0], s[2], s[4], d},
                      v[4] = {s[0], s[2], s[4], dv}, o[4] = {s[0], s[1], s[3], dv},
                      l[3] = {s[0], s[1], s[3]};
        a.q = dense(h, 4, q), a.dq = a.q;
        a.k = dense(h, 4, k), a.dk = a.k;
        a.v = dense(h, 4, v), a.dv = a.v;
        a.o = dense(h, 4, o), a.do_ = a.o;
        a.lse = dense(AJ_DTYPE_F32, 3, l);
    }
    return a;
}

/* op, shape: bytes, stride_ws_b, stride_ws_h, ws_dq_offset (a25ba09) */
static const int64_t recorded[][6] = {
    {0, 0, 272, 1, 1, 4},
    {0, 1, 8848, 34, 17, 36},
    {0, 2, 532480, 1024, 128, 2048},
    {0, 3, 27312, 35, 7, 108},
    {0, 4, 17022720, 16368, 1023, 65472},
    {0, 5, 34078720, 131072, 4096, 131072},
    {0, 6, 16384, 9, 3, 64},
    {0, 7, 0, 0, 0, 0},
    {1, 0, 528, 1, 1, 4},
    {1, 1, 17552, 34, 17, 36},
    {1, 2, 1056768, 1024, 128, 2048},
    {1, 3, 54192, 35, 7, 108},
    {1, 4, 33783552, 16368, 1023, 65472},
    {1, 5, 67633152, 131072, 4096, 131072},
    {1, 6, 32512, 9, 3, 64},
    {1, 7, 0, 0, 0, 0},
    {2, 0, 16, 1, 1, 4},
    {2, 1, 144, 34, 17, 36},
    {2, 2, 8192, 1024, 128, 2048},
    {2, 3, 432, 35, 7, 108},
    {2, 4, 261888, 16368, 1023, 65472},
    {2, 5, 524288, 131072, 4096, 131072},
    {2, 6, 256, 9, 3, 64},
    {2, 7, 0, 0, 0, 0},
    {3, 0, 400, 1, 1, 4},
    {3, 1, 13200, 34, 17, 36},
    {3, 2, 794624, 1024, 128, 2048},
    {3, 3, 40752, 35, 7, 108},
    {3, 4, 25403136, 16368, 1023, 65472},
    {3, 5, 50855936, 131072, 4096, 131072},
    {3, 6, 24448, 9, 3, 64},
    {3, 7, 0, 0, 0, 0},
    {4, 0, 272, 0, 1, 4},
    {4, 1, 8848, 0, 17, 36},
    {4, 2, 266240, 0, 128, 1024},
    {4, 3, 9104, 0, 7, 36},
    {4, 4, 4255680, 0, 1023, 16368},
    {4, 5, 34078720, 0, 4096, 131072},
    {4, 6, 2352, 0, 3, 12},
    {4, 7, 0, 0, 0, 0},
    {5, 0, 16, 0, 1, 4},
    {5, 1, 144, 0, 17, 36},
    {5, 2, 4096, 0, 128, 1024},
    {5, 3, 144, 0, 7, 36},
    {5, 4, 65472, 0, 1023, 16368},
    {5, 5, 524288, 0, 4096, 131072},
    {5, 6, 48, 0, 3, 12},
    {5, 7, 0, 0, 0, 0},
    {6, 0, 0, 0, 0, 0},
    {6, 1, 0, 0, 0, 0},
    {6, 2, 0, 0, 0, 0},
    {6, 3, 0, 0, 0, 0},
    {6, 4, 0, 0, 0, 0},
    {6, 5, 0, 0, 0, 0},
    {6, 6, 0, 0, 0, 0},
    {6, 7, 0, 0, 0, 0},
    {7, 0, 144, 0, 1, 4},
    {7, 1, 4496, 0, 17, 36},
    {7, 2, 135168, 0, 128, 1024},
    {7, 3, 4624, 0, 7, 36},
    {7, 4, 2160576, 0, 1023, 16368},
    {7, 5, 17301504, 0, 4096, 131072},
    {7, 6, 1200, 0, 3, 12},
    {7, 7, 0, 0, 0, 0},
};

int main(void)
{
    aj_ctx *ctx = NULL;
    CHECK_STATUS(ctx, aj_ctx_create(NULL, &ctx), AJ_OK);
    aj_compile_options opt = AJ_COMPILE_OPTIONS_INIT;
    opt.target = AJ_TARGET_SM_80;
    CHECK(sizeof recorded / sizeof recorded[0] == (size_t)(WS_OPS * WS_SHAPES));
    for (int o = 0; o < WS_OPS; o++) {
        aj_op *op = NULL;
        aj_kernel *k = NULL;
        CHECK_STATUS(ctx, aj_op_parse(ctx, ws_ops[o], strlen(ws_ops[o]), "t", &op), AJ_OK);
        CHECK_STATUS(ctx, aj_compile(ctx, op, &opt, &k), AJ_OK);
        if (!k)
            continue;
        /* the plan holds the rule the kernel's parameters and op give */
        aj_workspace_rule derived;
        aj_workspace_rule_of(k, &derived);
        const aj_workspace_rule *planned = aj_kernel_workspace_rule(k);
        CHECK(planned && planned->takes == derived.takes &&
              planned->per_batch == derived.per_batch && planned->align == derived.align);
        for (int r = 0; planned && r < AJ_WS_REGIONS; r++)
            CHECK(planned->region[r].elem_bytes == derived.region[r].elem_bytes &&
                  planned->region[r].per_row == derived.region[r].per_row);
        CHECK(derived.takes == (o != 6));   /* the efficient variant takes none */
        for (int s = 0; s < WS_SHAPES; s++) {
            const int64_t *want = recorded[o * WS_SHAPES + s];
            aj_bwd_args a = ws_args(k->op.layout == AJ_LAYOUT_VARLEN, k->op.head_dim,
                                    k->op.head_dim_v, ws_shapes[s]);
            size_t bytes = 1;
            bwd_workspace w;
            memset(&w, 0xff, sizeof w);
            CHECK_STATUS(ctx, aj_backward_workspace_size(ctx, k, &a, &bytes), AJ_OK);
            CHECK_STATUS(ctx, aj_backward_workspace(ctx, k, &a, &w), AJ_OK);
            CHECK_MSG(want[0] == o && want[1] == s && (int64_t)bytes == want[2] &&
                      (int64_t)w.bytes == want[2] && w.stride_b == want[3] &&
                      w.stride_h == want[4] && w.offset[AJ_WS_DQ] == want[5] &&
                      w.offset[AJ_WS_DELTA] == 0,
                      "op %d shape %d: %zu bytes (%zu), strides %lld %lld, dq at %lld; "
                      "recorded %lld, %lld %lld, %lld", o, s, bytes, w.bytes,
                      (long long)w.stride_b, (long long)w.stride_h,
                      (long long)w.offset[AJ_WS_DQ], (long long)want[2], (long long)want[3],
                      (long long)want[4], (long long)want[5]);
        }
        aj_kernel_destroy(k);
        aj_op_destroy(op);
    }
    aj_ctx_destroy(ctx);
    return check_report();
}
