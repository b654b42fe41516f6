/*
 * score.c -- the op's mask and score_mod as programs, lowered for every
 * template (score.h).
 *
 *   prog_init:  built-ins -> programs (aj_expr_builtin_text), expressions
 *               copied from the op; d mod / d score by differentiation;
 *               the mask's conjuncts split into the band and the rest
 *   emit:       a node -> LLVM values (i64, f32, i1; or <W x ...>)
 *   interval:   a node -> its range over a tile, emitted (aj_score_tile_class)
 *               or computed on the host (aj_score_host_class)
 */
#include "templates/score.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

#include "templates/attn_common.h"
#include "templates/cpu_vec.h"

#define NONE AJ_EXPR_NONE
#define OFFSET_CLAMP (1 << 30)

/* ---------------------------------------------------------------- building */

typedef struct builder {
    aj_score_prog *p;
    aj_expr_scope scope;
    bool ok;
} builder;

static const aj_expr_node *node(const aj_score_prog *p, uint16_t id)
{
    return &p->e.nodes[id];
}

/* A literal node, a copy of leaf. */
static uint16_t add_leaf(builder *bd, aj_expr_node leaf)
{
    uint16_t id = NONE;
    char msg[128];
    if (bd->ok && !aj_expr_add(&bd->p->e, &bd->scope, AJ_EXPR_LIT, NULL, 0, &leaf, &id, msg,
                               sizeof msg))
        bd->ok = false;
    return bd->ok ? id : NONE;
}

static uint16_t lit(builder *bd, aj_expr_type type, double v)
{
    aj_expr_node leaf = {.op = AJ_EXPR_LIT, .type = (uint8_t)type};
    if (type == AJ_EXPR_FLOAT)
        leaf.u.f = v;
    else
        leaf.u.i = (int64_t)v;
    return add_leaf(bd, leaf);
}

/* A node over args.  The arena is `shared` (aj_expr): a fold never takes
 * back the slots of literals that other nodes still use (the derivative's
 * zero and one), and an int literal meeting a float is converted by copy. */
static uint16_t mk(builder *bd, aj_expr_op op, const uint16_t *args, int n)
{
    uint16_t id = NONE;
    char msg[128];
    if (bd->ok && !aj_expr_add(&bd->p->e, &bd->scope, op, args, n, NULL, &id, msg, sizeof msg))
        bd->ok = false;
    return bd->ok ? id : NONE;
}

static uint16_t mk2(builder *bd, aj_expr_op op, uint16_t a, uint16_t b)
{
    uint16_t args[2] = {a, b};
    return mk(bd, op, args, 2);
}

/* Whether node id is the literal v; NONE (a node the full arena could
 * not make: the builder has failed and says so) is no literal. */
static bool is_lit(const aj_score_prog *p, uint16_t id, double v)
{
    if (id == NONE)
        return false;
    const aj_expr_node *n = node(p, id);
    if (n->op != AJ_EXPR_LIT)
        return false;
    return n->type == AJ_EXPR_FLOAT ? n->u.f == v : (double)n->u.i == v;
}

/* Sums and products that drop zeros and ones, so a derivative stays small. */
static uint16_t add_f(builder *bd, uint16_t a, uint16_t b)
{
    if (is_lit(bd->p, a, 0))
        return b;
    if (is_lit(bd->p, b, 0))
        return a;
    return mk2(bd, AJ_EXPR_ADD, a, b);
}

static uint16_t mul_f(builder *bd, uint16_t a, uint16_t b)
{
    if (is_lit(bd->p, a, 0) || is_lit(bd->p, b, 1))
        return a;
    if (is_lit(bd->p, b, 0) || is_lit(bd->p, a, 1))
        return b;
    return mk2(bd, AJ_EXPR_MUL, a, b);
}

/* The program of one field of the op: its expression, or the built-in's
 * text parsed against a copy of the op (alibi's slopes declared there as
 * the tensor after the op's own). */
static aj_status add_field(aj_ctx *ctx, const aj_op *op, bool score_mod, aj_score_prog *p,
                           uint16_t *root)
{
    *root = NONE;
    bool is_expr = score_mod ? op->score_mod.kind == AJ_SCORE_MOD_EXPR
                             : op->mask.kind == AJ_MASK_EXPR;
    if (is_expr) {
        uint16_t from = score_mod ? op->score_mod.root : op->mask.root;
        if (!aj_expr_copy(&p->e, &op->expr, from, root))
            return aj_fail(ctx, AJ_ERR_UNSUPPORTED, "%s: the expression does not fit the "
                           "score program's %d nodes", score_mod ? "score_mod" : "mask",
                           AJ_EXPR_NODES_MAX);
        return AJ_OK;
    }
    char text[256], msg[256];
    bool needs_slopes;
    if (!aj_expr_builtin_text(op, score_mod, text, sizeof text, &needs_slopes))
        return aj_fail(ctx, AJ_ERR_INTERNAL, "no program for the built-in %s",
                       score_mod ? "score_mod" : "mask");
    if (!text[0])
        return AJ_OK;
    static _Thread_local aj_op tmp;   /* an op is large for a stack */
    tmp = *op;
    tmp.expr.count = 0;
    if (needs_slopes) {
        aj_tensor_decl *d = &tmp.tensors[tmp.tensor_count++];
        memset(d, 0, sizeof *d);
        snprintf(d->name, sizeof d->name, "slopes");
        d->dtype = AJ_SIDE_F32;
        d->rank = 1;
    }
    uint16_t r;
    if (aj_expr_parse(&tmp, score_mod, text, strlen(text), &r, msg, sizeof msg) != AJ_OK)
        return aj_fail(ctx, AJ_ERR_INTERNAL, "the built-in program '%s': %s", text, msg);
    if (!aj_expr_copy(&p->e, &tmp.expr, r, root))
        return aj_fail(ctx, AJ_ERR_UNSUPPORTED, "the score program does not fit %d nodes",
                       AJ_EXPR_NODES_MAX);
    if (needs_slopes && p->tensor_count == op->tensor_count) {
        aj_tensor_decl *d = &p->tensors[p->tensor_count++];
        *d = tmp.tensors[op->tensor_count];
        snprintf(d->name, sizeof d->name, "alibi_slopes");
    }
    return AJ_OK;
}

/* ---------------------------------------------------------------- derivative */

/* d node / d score into memo (NONE until made), zero where the node does
 * not read the score.  The rules of aj_expr_eval_grad, written as nodes. */
static uint16_t diff(builder *bd, uint16_t id, const uint16_t *reads, uint16_t *memo,
                     uint16_t zero, uint16_t one)
{
    const aj_score_prog *p = bd->p;
    const aj_expr_node *n = node(p, id);
    if (!(reads[id] & AJ_SCORE_READS(AJ_VAR_SCORE)) || n->type != AJ_EXPR_FLOAT)
        return zero;
    if (memo[id] != NONE)
        return memo[id];
    uint16_t a = n->args[0], b = n->args[1], c = n->args[2];
#define D(x) diff(bd, (x), reads, memo, zero, one)
    uint16_t d = zero;
    switch ((aj_expr_op)n->op) {
    case AJ_EXPR_VAR:
        d = n->u.var == AJ_VAR_SCORE ? one : zero;
        break;
    case AJ_EXPR_NEG:
        d = mk(bd, AJ_EXPR_NEG, &(uint16_t){D(a)}, 1);
        break;
    case AJ_EXPR_ADD:
        d = add_f(bd, D(a), D(b));
        break;
    case AJ_EXPR_SUB:
        d = mk2(bd, AJ_EXPR_SUB, D(a), D(b));
        break;
    case AJ_EXPR_MUL:
        d = add_f(bd, mul_f(bd, D(a), b), mul_f(bd, a, D(b)));
        break;
    case AJ_EXPR_DIV:
        d = mk2(bd, AJ_EXPR_DIV, mk2(bd, AJ_EXPR_SUB, D(a), mul_f(bd, id, D(b))), b);
        break;
    case AJ_EXPR_MIN:
    case AJ_EXPR_MAX: {
        /* b is picked where b < a (b > a for max) or a is NaN */
        uint16_t take_b = mk2(bd, AJ_EXPR_OR,
                              mk2(bd, n->op == AJ_EXPR_MIN ? AJ_EXPR_LT : AJ_EXPR_GT, b, a),
                              mk2(bd, AJ_EXPR_NE, a, a));
        uint16_t args[3] = {take_b, D(b), D(a)};
        d = mk(bd, AJ_EXPR_SELECT, args, 3);
        break;
    }
    case AJ_EXPR_CLAMP: {
        /* max(a, b) first, then the min of that and c */
        uint16_t m = mk2(bd, AJ_EXPR_MAX, a, b);
        uint16_t take_b = mk2(bd, AJ_EXPR_OR, mk2(bd, AJ_EXPR_GT, b, a),
                              mk2(bd, AJ_EXPR_NE, a, a));
        uint16_t dm_args[3] = {take_b, D(b), D(a)};
        uint16_t dm = mk(bd, AJ_EXPR_SELECT, dm_args, 3);
        uint16_t take_c = mk2(bd, AJ_EXPR_OR, mk2(bd, AJ_EXPR_LT, c, m),
                              mk2(bd, AJ_EXPR_NE, m, m));
        uint16_t args[3] = {take_c, D(c), dm};
        d = mk(bd, AJ_EXPR_SELECT, args, 3);
        break;
    }
    case AJ_EXPR_ABS: {
        uint16_t da = D(a);
        uint16_t args[3] = {mk2(bd, AJ_EXPR_LT, a, lit(bd, AJ_EXPR_FLOAT, 0)),
                            mk(bd, AJ_EXPR_NEG, &da, 1), da};
        d = mk(bd, AJ_EXPR_SELECT, args, 3);
        break;
    }
    case AJ_EXPR_EXP:
        d = mul_f(bd, id, D(a));
        break;
    case AJ_EXPR_LOG:
        d = mk2(bd, AJ_EXPR_DIV, D(a), a);
        break;
    case AJ_EXPR_TANH:
        d = mul_f(bd, mk2(bd, AJ_EXPR_SUB, one, mk2(bd, AJ_EXPR_MUL, id, id)), D(a));
        break;
    case AJ_EXPR_SQRT:
        d = mk2(bd, AJ_EXPR_DIV, D(a), mk2(bd, AJ_EXPR_MUL, lit(bd, AJ_EXPR_FLOAT, 2), id));
        break;
    case AJ_EXPR_SELECT: {
        uint16_t args[3] = {a, D(b), D(c)};
        d = mk(bd, AJ_EXPR_SELECT, args, 3);
        break;
    }
    default:   /* floor, loads, conversions: no derivative */
        break;
    }
#undef D
    memo[id] = d;
    return d;
}

/* ---------------------------------------------------------------- band */

/* Whether the interval rules (iv_compute below) bound node `root` over a
 * tile by its positions alone: no load (its values are data), no product
 * of two position-dependent operands, no quotient or remainder by one
 * (those are "unknown").  The rest of a mask that fails this takes a
 * block mask (aj_score_prog.block_mask).  Operands have smaller ids: one
 * pass in id order. */
static bool interval_bounds(const aj_score_prog *p, uint16_t root)
{
    static _Thread_local bool ok[AJ_EXPR_NODES_MAX];
    for (int id = 0; id <= root; id++) {
        const aj_expr_node *n = node(p, id);
        ok[id] = true;
        if (!(p->reads[id] & AJ_SCORE_READS_POSITION))
            continue;
        bool by_position = (n->op == AJ_EXPR_MOD || n->op == AJ_EXPR_DIV)
                               ? (p->reads[n->args[1]] & AJ_SCORE_READS_POSITION) != 0
                           : n->op == AJ_EXPR_MUL
                               ? (p->reads[n->args[0]] & AJ_SCORE_READS_POSITION) &&
                                     (p->reads[n->args[1]] & AJ_SCORE_READS_POSITION)
                               : false;
        ok[id] = n->op != AJ_EXPR_LOAD && !by_position;
        for (int i = 0; i < aj_expr_arity(n) && ok[id]; i++)
            ok[id] = ok[n->args[i]];
    }
    return ok[root];
}

/* What each node's tree reads (aj_score_prog.reads): AJ_SCORE_READS(var) per
 * variable, AJ_SCORE_READS_LOAD for a load; operands have smaller ids, so one pass
 * in id order. */
static void mark_reads(const aj_score_prog *p, uint16_t *out)
{
    for (int id = 0; id < p->e.count; id++) {
        const aj_expr_node *n = node(p, id);
        out[id] = n->op == AJ_EXPR_VAR ? AJ_SCORE_READS(n->u.var)
                : n->op == AJ_EXPR_LOAD ? AJ_SCORE_READS_LOAD : 0;
        for (int i = 0; i < aj_expr_arity(n); i++)
            out[id] |= out[n->args[i]];
    }
}

/* An int node as cq q + ck k + rest (rest NONE: 0, reading no position,
 * tensor or head); false where it is not such a sum. */
typedef struct linear {
    int cq, ck;
    uint16_t rest;
} linear;

static bool linearize(builder *bd, uint16_t id, const uint16_t *reads, linear *out)
{
    const aj_score_prog *p = bd->p;
    const aj_expr_node *n = node(p, id);
    *out = (linear){0, 0, NONE};
    if (n->type != AJ_EXPR_INT)
        return false;
    if (!(reads[id] & AJ_SCORE_READS_POSITION)) {
        if (reads[id] & (AJ_SCORE_READS_LOAD | AJ_SCORE_READS(AJ_VAR_H)))
            return false;
        out->rest = id;
        return true;
    }
    linear a, b;
    switch ((aj_expr_op)n->op) {
    case AJ_EXPR_VAR:
        out->cq = n->u.var == AJ_VAR_Q;
        out->ck = n->u.var == AJ_VAR_K;
        return true;
    case AJ_EXPR_NEG:
        if (!linearize(bd, n->args[0], reads, &a))
            return false;
        *out = (linear){-a.cq, -a.ck,
                        a.rest == NONE ? NONE : mk(bd, AJ_EXPR_NEG, &a.rest, 1)};
        return true;
    case AJ_EXPR_ADD:
    case AJ_EXPR_SUB: {
        if (!linearize(bd, n->args[0], reads, &a) ||
            !linearize(bd, n->args[1], reads, &b))
            return false;
        int sign = n->op == AJ_EXPR_ADD ? 1 : -1;
        out->cq = a.cq + sign * b.cq;
        out->ck = a.ck + sign * b.ck;
        if (b.rest == NONE)
            out->rest = a.rest;
        else if (a.rest == NONE)
            out->rest = sign > 0 ? b.rest : mk(bd, AJ_EXPR_NEG, &b.rest, 1);
        else
            out->rest = mk2(bd, (aj_expr_op)n->op, a.rest, b.rest);
        return true;
    }
    default:
        return false;
    }
}

/* Tries a conjunct as band bounds: lo / hi (NONE: not bounded by it). */
static bool band_bounds(builder *bd, uint16_t id, const uint16_t *reads,
                        uint16_t *lo, uint16_t *hi)
{
    const aj_expr_node *n = node(bd->p, id);
    aj_expr_op op = (aj_expr_op)n->op;
    *lo = *hi = NONE;
    if (op != AJ_EXPR_LT && op != AJ_EXPR_LE && op != AJ_EXPR_GT && op != AJ_EXPR_GE &&
        op != AJ_EXPR_EQ)
        return false;
    linear a, b;
    if (!linearize(bd, n->args[0], reads, &a) ||
        !linearize(bd, n->args[1], reads, &b))
        return false;
    /* a - b = ck k + cq q + r  (op)  0 */
    int ck = a.ck - b.ck, cq = a.cq - b.cq;
    if (!((ck == 1 && cq == -1) || (ck == -1 && cq == 1)))
        return false;
    uint16_t r;
    if (b.rest == NONE)
        r = a.rest == NONE ? lit(bd, AJ_EXPR_INT, 0) : a.rest;
    else if (a.rest == NONE)
        r = mk(bd, AJ_EXPR_NEG, &b.rest, 1);
    else
        r = mk2(bd, AJ_EXPR_SUB, a.rest, b.rest);
    /* ck = 1: k - q + r (op) 0, k (op) q - r; ck = -1: k (flipped op) q + r */
    uint16_t v = ck == 1 ? mk(bd, AJ_EXPR_NEG, &r, 1) : r;
    if (ck == -1)
        op = op == AJ_EXPR_LT ? AJ_EXPR_GT : op == AJ_EXPR_LE ? AJ_EXPR_GE
           : op == AJ_EXPR_GT ? AJ_EXPR_LT : op == AJ_EXPR_GE ? AJ_EXPR_LE : op;
    uint16_t one = lit(bd, AJ_EXPR_INT, 1);
    switch (op) {
    case AJ_EXPR_LT: *hi = mk2(bd, AJ_EXPR_SUB, v, one); break;
    case AJ_EXPR_LE: *hi = v; break;
    case AJ_EXPR_GT: *lo = mk2(bd, AJ_EXPR_ADD, v, one); break;
    case AJ_EXPR_GE: *lo = v; break;
    default:         *lo = *hi = v; break;
    }
    return bd->ok;
}

static void split_conjuncts(const aj_score_prog *p, uint16_t id, uint16_t *out, int *n)
{
    const aj_expr_node *x = node(p, id);
    if (x->op == AJ_EXPR_AND) {
        split_conjuncts(p, x->args[0], out, n);
        split_conjuncts(p, x->args[1], out, n);
    } else {
        out[(*n)++] = id;
    }
}

/* A band bound reads no tensor and no head (so that the band of a CTA's
 * rows holds for every query head it walks). */
static void split_band(builder *bd, uint16_t mask)
{
    aj_score_prog *p = bd->p;
    static _Thread_local uint16_t reads[AJ_EXPR_NODES_MAX];
    mark_reads(p, reads);
    uint16_t conj[AJ_EXPR_NODES_MAX];
    int n = 0;
    split_conjuncts(p, mask, conj, &n);
    for (int c = 0; c < n && bd->ok; c++) {
        uint16_t lo, hi;
        if (band_bounds(bd, conj[c], reads, &lo, &hi)) {
            if (lo != NONE)
                p->band_lo = p->band_lo == NONE ? lo : mk2(bd, AJ_EXPR_MAX, p->band_lo, lo);
            if (hi != NONE)
                p->band_hi = p->band_hi == NONE ? hi : mk2(bd, AJ_EXPR_MIN, p->band_hi, hi);
        } else {
            p->rest = p->rest == NONE ? conj[c] : mk2(bd, AJ_EXPR_AND, p->rest, conj[c]);
        }
    }
}

aj_status aj_score_prog_init(aj_ctx *ctx, const aj_op *op, aj_score_prog *p)
{
    memset(p, 0, sizeof *p);
    p->e.shared = true;
    p->mod = p->dmod = p->band_lo = p->band_hi = p->rest = NONE;
    p->tensor_count = op->tensor_count;
    memcpy(p->tensors, op->tensors, sizeof op->tensors[0] * (size_t)op->tensor_count);
    uint16_t mask;
    aj_status st = add_field(ctx, op, false, p, &mask);
    if (st == AJ_OK)
        st = add_field(ctx, op, true, p, &p->mod);
    if (st != AJ_OK)
        return st;
    builder bd = {p, {p->tensors, AJ_OP_TENSORS_MAX + 1, true}, true};
    bd.scope.count = p->tensor_count;
    if (p->mod != NONE) {
        static _Thread_local uint16_t reads[AJ_EXPR_NODES_MAX], memo[AJ_EXPR_NODES_MAX];
        mark_reads(p, reads);
        for (int i = 0; i < AJ_EXPR_NODES_MAX; i++)
            memo[i] = NONE;
        uint16_t zero = lit(&bd, AJ_EXPR_FLOAT, 0), one = lit(&bd, AJ_EXPR_FLOAT, 1);
        p->dmod = diff(&bd, p->mod, reads, memo, zero, one);
        /* a derivative of 1 (alibi, biases) is "none": the backward then
         * skips the chain rule's multiply and select per element */
        if (p->dmod != NONE && is_lit(p, p->dmod, 1))
            p->dmod = NONE;
    }
    if (mask != NONE)
        split_band(&bd, mask);
    if (!bd.ok)
        return aj_fail(ctx, AJ_ERR_UNSUPPORTED, "the score program and its derivative do not "
                       "fit %d nodes; write a shorter mask or score_mod", AJ_EXPR_NODES_MAX);
    mark_reads(p, p->reads);
    uint16_t roots[5] = {p->mod, p->dmod, p->band_lo, p->band_hi, p->rest};
    for (int r = 0; r < 5; r++)
        p->reads_totals =
            p->reads_totals ||
            (roots[r] != NONE &&
             (p->reads[roots[r]] & (AJ_SCORE_READS(AJ_VAR_SQ) | AJ_SCORE_READS(AJ_VAR_SK))));
    p->rest_reads_tensors = p->rest != NONE && (p->reads[p->rest] & AJ_SCORE_READS_LOAD);
    p->block_mask = p->rest != NONE && !interval_bounds(p, p->rest) &&
                    op->layout == AJ_LAYOUT_PADDED;
    /* which mask classes differ by batch index or head */
    for (int r = 2; r < 5; r++) {
        if (roots[r] == NONE)
            continue;
        p->mask_reads_b = p->mask_reads_b || (p->reads[roots[r]] & AJ_SCORE_READS(AJ_VAR_B));
        p->mask_reads_h = p->mask_reads_h || (p->reads[roots[r]] & AJ_SCORE_READS(AJ_VAR_H));
    }
    for (int r = 0; r < 5; r++)
        p->reads_h = p->reads_h ||
                     (roots[r] != NONE && (p->reads[roots[r]] & AJ_SCORE_READS(AJ_VAR_H)));
    return AJ_OK;
}

static uint64_t mix(uint64_t h, uint64_t v)
{
    h ^= v + 0x9e3779b97f4a7c15u + (h << 6) + (h >> 2);
    return h * 0x100000001b3u;
}

uint64_t aj_score_mask_hash(const aj_score_prog *p)
{
    static _Thread_local uint64_t hs[AJ_EXPR_NODES_MAX];
    for (int id = 0; id < p->e.count; id++) {
        const aj_expr_node *n = node(p, id);
        uint64_t leaf = n->op == AJ_EXPR_LIT ? (uint64_t)n->u.i
                      : n->op == AJ_EXPR_VAR ? (uint64_t)n->u.var
                      : n->op == AJ_EXPR_LOAD ? (uint64_t)n->u.tensor : 0;
        uint64_t h = mix(mix(n->op, n->type), leaf);
        for (int a = 0; a < aj_expr_arity(n); a++)
            h = mix(h, hs[n->args[a]]);
        hs[id] = h;
    }
    uint64_t h = 0xcbf29ce484222325u;
    const uint16_t roots[3] = {p->band_lo, p->band_hi, p->rest};
    for (int r = 0; r < 3; r++)
        h = mix(h, roots[r] == NONE ? 0 : hs[roots[r]]);
    for (int t = 0; t < p->tensor_count; t++) {
        for (const char *c = p->tensors[t].name; *c; c++)
            h = mix(h, (uint8_t)*c);
        h = mix(mix(h, (uint64_t)p->tensors[t].dtype), (uint64_t)p->tensors[t].rank);
    }
    return h;
}

/* ---------------------------------------------------------------- params */

void aj_score_param_name(char *buf, size_t cap, const char *tensor, char what, int dim)
{
    snprintf(buf, cap, "%s_%s%d", tensor, what == 's' ? "size" : "stride", dim);
}

/* ---------------------------------------------------------------- emit */

/*
 * One emission: values of the nodes reached so far at one point (i, j).
 * With lanes, a node that reads neither k nor the score has one value for
 * every lane (alibi's slopes[h], doc[b, q]): it is emitted once as a
 * scalar and splat, so a vector costs one load of it, not one per lane.
 */
typedef struct emitter {
    aj_score *s;
    int lanes;                 /* 0: scalar */
    LLVMValueRef i, j;         /* i32, j maybe <lanes x i32> */
    LLVMValueRef score;        /* f32 or vector, NULL outside score_mod */
    LLVMValueRef *memo;        /* vmemo, or umemo while a uniform node is emitted */
    LLVMValueRef vmemo[AJ_EXPR_NODES_MAX];
    LLVMValueRef umemo[AJ_EXPR_NODES_MAX];   /* scalar values of uniform nodes */
} emitter;

static LLVMTypeRef lane_type(emitter *m, LLVMTypeRef scalar)
{
    return m->lanes ? LLVMVectorType(scalar, (unsigned)m->lanes) : scalar;
}

static LLVMValueRef splat(emitter *m, LLVMValueRef v)
{
    if (!m->lanes)
        return v;
    LLVMBuilderRef b = m->s->kb->b;
    LLVMValueRef vec = LLVMGetPoison(LLVMVectorType(LLVMTypeOf(v), (unsigned)m->lanes));
    vec = LLVMBuildInsertElement(b, vec, v, aj_kb_i32(m->s->kb, 0), "");
    return LLVMBuildShuffleVector(b, vec, vec,
                                  LLVMConstNull(LLVMVectorType(m->s->kb->t_i32,
                                                               (unsigned)m->lanes)), "");
}

/* x / y and x % y flooring toward -inf, x / 0 == x % 0 == 0, as
 * ir/expr_eval.c (a divisor of 0 or -1 never reaches sdiv / srem). */
static LLVMValueRef floor_divmod(emitter *m, LLVMValueRef x, LLVMValueRef y, int want_mod)
{
    aj_kb *kb = m->s->kb;
    LLVMBuilderRef b = kb->b;
    LLVMTypeRef t = LLVMTypeOf(x);
    LLVMValueRef zero = LLVMConstNull(t);
    LLVMValueRef one = splat(m, aj_kb_i64(kb, 1)), minus1 = splat(m, aj_kb_i64(kb, -1));
    LLVMValueRef y0 = LLVMBuildICmp(b, LLVMIntEQ, y, zero, "");
    LLVMValueRef ym1 = LLVMBuildICmp(b, LLVMIntEQ, y, minus1, "");
    LLVMValueRef safe = LLVMBuildSelect(b, LLVMBuildOr(b, y0, ym1, ""), one, y, "");
    LLVMValueRef q = LLVMBuildSDiv(b, x, safe, ""), r = LLVMBuildSRem(b, x, safe, "");
    LLVMValueRef adjust = LLVMBuildAnd(b, LLVMBuildICmp(b, LLVMIntNE, r, zero, ""),
                                       LLVMBuildXor(b, LLVMBuildICmp(b, LLVMIntSLT, r, zero, ""),
                                                    LLVMBuildICmp(b, LLVMIntSLT, safe, zero, ""),
                                                    ""), "");
    if (want_mod) {
        r = LLVMBuildSelect(b, adjust, LLVMBuildAdd(b, r, safe, ""), r, "");
        return LLVMBuildSelect(b, LLVMBuildOr(b, y0, ym1, ""), zero, r, "");
    }
    q = LLVMBuildSelect(b, adjust, LLVMBuildSub(b, q, one, ""), q, "");
    q = LLVMBuildSelect(b, ym1, LLVMBuildNeg(b, x, ""), q, "");
    return LLVMBuildSelect(b, y0, zero, q, "");
}

static LLVMValueRef emit_node(emitter *m, uint16_t id);

/* A side tensor's element at integer indices (scalar); 0 outside it.  The
 * index is clamped to element 0 before the load, so an out-of-range index
 * never touches memory past the tensor (the launch refuses empty ones). */
static LLVMValueRef load_scalar(emitter *m, const aj_tensor_decl *d, const LLVMValueRef *idx)
{
    aj_kb *kb = m->s->kb;
    LLVMBuilderRef b = kb->b;
    LLVMValueRef inside = LLVMConstInt(kb->t_i1, 1, 0);
    LLVMValueRef at = aj_kb_i64(kb, 0);
    char name[64];
    for (int dim = 0; dim < d->rank; dim++) {
        aj_score_param_name(name, sizeof name, d->name, 's', dim);
        LLVMValueRef size = aj_kb_param(kb, name);
        aj_score_param_name(name, sizeof name, d->name, 't', dim);
        LLVMValueRef stride = aj_kb_param(kb, name);
        inside = LLVMBuildAnd(b, inside, LLVMBuildICmp(b, LLVMIntULT, idx[dim], size, ""), "");
        at = LLVMBuildAdd(b, at, LLVMBuildMul(b, idx[dim], stride, ""), "");
    }
    at = LLVMBuildSelect(b, inside, at, aj_kb_i64(kb, 0), "");
    LLVMTypeRef et = d->dtype == AJ_SIDE_I32 ? kb->t_i32 : kb->t_f32;
    LLVMValueRef v = aj_kb_load(kb, et, aj_kb_gptr_offset(kb, aj_kb_param(kb, d->name),
                                                         LLVMBuildShl(b, at, aj_kb_i64(kb, 2),
                                                                      "")), 4);
    if (d->dtype == AJ_SIDE_I32)
        return LLVMBuildSelect(b, inside, LLVMBuildSExt(b, v, kb->t_i64, ""), aj_kb_i64(kb, 0),
                               "");
    return LLVMBuildSelect(b, inside, v, aj_kb_f32(kb, 0), "");
}

static LLVMValueRef emit_load(emitter *m, const aj_expr_node *n)
{
    aj_kb *kb = m->s->kb;
    LLVMBuilderRef b = kb->b;
    const aj_tensor_decl *d = &m->s->p->tensors[n->u.tensor];
    LLVMValueRef idx[AJ_EXPR_RANK_MAX];
    for (int i = 0; i < d->rank; i++)
        idx[i] = emit_node(m, n->args[i]);
    if (!m->lanes)
        return load_scalar(m, d, idx);
    /* lane by lane: side tensors are small tables, not streams */
    LLVMValueRef out = LLVMGetPoison(lane_type(m, n->type == AJ_EXPR_INT ? kb->t_i64
                                                                         : kb->t_f32));
    for (int l = 0; l < m->lanes; l++) {
        LLVMValueRef li = aj_kb_i32(kb, l), one[AJ_EXPR_RANK_MAX];
        for (int i = 0; i < d->rank; i++)
            one[i] = LLVMBuildExtractElement(b, idx[i], li, "");
        out = LLVMBuildInsertElement(b, out, load_scalar(m, d, one), li, "");
    }
    return out;
}

/* A cpu_vec.h function on this emission's lanes; a scalar (a uniform
 * node, a tile's bounds) goes through it as a one-lane vector. */
static LLVMValueRef host_math(emitter *m, LLVMValueRef (*fn)(aj_kb *, LLVMValueRef, int),
                              LLVMValueRef x)
{
    aj_kb *kb = m->s->kb;
    if (m->lanes)
        return fn(kb, x, m->lanes);
    LLVMValueRef zero = aj_kb_i32(kb, 0);
    LLVMValueRef v = LLVMBuildInsertElement(kb->b, LLVMGetPoison(aj_cv_type(kb, 1)), x, zero, "");
    return LLVMBuildExtractElement(kb->b, fn(kb, v, 1), zero, "");
}

/* exp, log, tanh: the cpu kernels' own (on the cpu target, for vectors
 * and scalars alike: a kernel of scalar code there, the block-mask
 * builder, computes what the vector kernels do), else the GPU targets'
 * intrinsics; sqrt and floor are LLVM's everywhere. */
static LLVMValueRef emit_math(emitter *m, aj_expr_op op, LLVMValueRef a)
{
    aj_kb *kb = m->s->kb;
    LLVMBuilderRef b = kb->b;
    bool host = m->s->lanes > 0 || !kb->desc->simt;
    LLVMValueRef log2e = splat(m, aj_kb_f32(kb, AJ_LOG2E)), ln2 = splat(m, aj_kb_f32(kb, AJ_LN2));
    switch (op) {
    case AJ_EXPR_EXP: {
        LLVMValueRef x = LLVMBuildFMul(b, a, log2e, "");
        return host ? host_math(m, aj_cv_exp2, x) : aj_kb_exp2(kb, x);
    }
    case AJ_EXPR_LOG: {
        LLVMValueRef l2 = host ? aj_kb_call_overloaded(kb, "llvm.log2", &a, 1) : aj_kb_log2(kb, a);
        return LLVMBuildFMul(b, l2, ln2, "");
    }
    case AJ_EXPR_TANH:
        return host ? host_math(m, aj_cv_tanh, a) : aj_attn_tanh(kb, a);
    case AJ_EXPR_SQRT:
        return aj_kb_call_overloaded(kb, "llvm.sqrt", &a, 1);
    default:   /* floor */
        return aj_kb_call_overloaded(kb, "llvm.floor", &a, 1);
    }
}

/* min / max / clamp as the evaluator picks: b where b < a (b > a) or a is
 * NaN (for ints, the plain comparison). */
static LLVMValueRef pick(emitter *m, aj_expr_type t, int is_min, LLVMValueRef a, LLVMValueRef b_)
{
    LLVMBuilderRef b = m->s->kb->b;
    LLVMValueRef take_b;
    if (t == AJ_EXPR_FLOAT)
        take_b = LLVMBuildOr(b, LLVMBuildFCmp(b, is_min ? LLVMRealOLT : LLVMRealOGT, b_, a, ""),
                             LLVMBuildFCmp(b, LLVMRealUNO, a, a, ""), "");
    else
        take_b = LLVMBuildICmp(b, is_min ? LLVMIntSLT : LLVMIntSGT, b_, a, "");
    return LLVMBuildSelect(b, take_b, b_, a, "");
}

static LLVMValueRef emit_compare(emitter *m, aj_expr_op op, aj_expr_type t, LLVMValueRef a,
                                 LLVMValueRef c)
{
    LLVMBuilderRef b = m->s->kb->b;
    if (t == AJ_EXPR_FLOAT) {
        LLVMRealPredicate pr = op == AJ_EXPR_LT ? LLVMRealOLT : op == AJ_EXPR_LE ? LLVMRealOLE
                             : op == AJ_EXPR_GT ? LLVMRealOGT : op == AJ_EXPR_GE ? LLVMRealOGE
                             : op == AJ_EXPR_EQ ? LLVMRealOEQ : LLVMRealUNE;
        return LLVMBuildFCmp(b, pr, a, c, "");
    }
    /* bools compare as 0 < 1, unsigned */
    int u = t == AJ_EXPR_BOOL;
    LLVMIntPredicate pr = op == AJ_EXPR_LT ? (u ? LLVMIntULT : LLVMIntSLT)
                        : op == AJ_EXPR_LE ? (u ? LLVMIntULE : LLVMIntSLE)
                        : op == AJ_EXPR_GT ? (u ? LLVMIntUGT : LLVMIntSGT)
                        : op == AJ_EXPR_GE ? (u ? LLVMIntUGE : LLVMIntSGE)
                        : op == AJ_EXPR_EQ ? LLVMIntEQ : LLVMIntNE;
    return LLVMBuildICmp(b, pr, a, c, "");
}

static LLVMValueRef emit_leaf(emitter *m, const aj_expr_node *n)
{
    aj_kb *kb = m->s->kb;
    LLVMBuilderRef b = kb->b;
    aj_score *s = m->s;
    if (n->op == AJ_EXPR_LIT) {
        if (n->type == AJ_EXPR_FLOAT)
            return splat(m, aj_kb_f32(kb, (float)n->u.f));
        if (n->type == AJ_EXPR_BOOL)
            return splat(m, LLVMConstInt(kb->t_i1, n->u.i != 0, 0));
        return splat(m, aj_kb_i64(kb, n->u.i));
    }
    switch (n->u.var) {
    case AJ_VAR_B: return splat(m, s->b);
    case AJ_VAR_H: return splat(m, s->h);
    case AJ_VAR_SQ: return splat(m, s->sq);
    case AJ_VAR_SK: return splat(m, s->sk);
    case AJ_VAR_Q:
        return splat(m, LLVMBuildAdd(b, s->q_origin, LLVMBuildSExt(b, m->i, kb->t_i64, ""), ""));
    case AJ_VAR_K: {
        LLVMValueRef j = LLVMBuildSExt(b, m->j, lane_type(m, kb->t_i64), "");
        return LLVMBuildAdd(b, splat(m, s->k_origin), j, "");
    }
    default:
        return m->score;
    }
}

static LLVMValueRef emit_node(emitter *m, uint16_t id)
{
    if (!m->memo[id] && m->s->loads[id])
        m->memo[id] = splat(m, m->s->loads[id]);
    if (m->memo[id])
        return m->memo[id];
    if (m->lanes &&
        !(m->s->p->reads[id] & (AJ_SCORE_READS(AJ_VAR_K) | AJ_SCORE_READS(AJ_VAR_SCORE)))) {
        int lanes = m->lanes;
        m->lanes = 0;
        m->memo = m->umemo;
        LLVMValueRef v = emit_node(m, id);
        m->lanes = lanes;
        m->memo = m->vmemo;
        m->memo[id] = splat(m, v);
        return m->memo[id];
    }
    aj_kb *kb = m->s->kb;
    LLVMBuilderRef b = kb->b;
    const aj_expr_node *n = &m->s->p->e.nodes[id];
    aj_expr_op op = (aj_expr_op)n->op;
    aj_expr_type t = (aj_expr_type)n->type;
    LLVMValueRef v = NULL, x[3] = {NULL, NULL, NULL};
    if (op == AJ_EXPR_LIT || op == AJ_EXPR_VAR) {
        v = emit_leaf(m, n);
    } else if (op == AJ_EXPR_LOAD) {
        v = emit_load(m, n);
    } else {
        for (int i = 0; i < aj_expr_arity(n); i++)
            x[i] = emit_node(m, n->args[i]);
        aj_expr_type at = (aj_expr_type)m->s->p->e.nodes[n->args[0]].type;
        int fl = t == AJ_EXPR_FLOAT;
        switch (op) {
        case AJ_EXPR_TO_FLOAT: v = LLVMBuildSIToFP(b, x[0], lane_type(m, kb->t_f32), ""); break;
        case AJ_EXPR_NEG: v = fl ? LLVMBuildFNeg(b, x[0], "") : LLVMBuildNeg(b, x[0], ""); break;
        case AJ_EXPR_NOT: v = LLVMBuildNot(b, x[0], ""); break;
        case AJ_EXPR_ADD:
            v = fl ? LLVMBuildFAdd(b, x[0], x[1], "") : LLVMBuildAdd(b, x[0], x[1], "");
            break;
        case AJ_EXPR_SUB:
            v = fl ? LLVMBuildFSub(b, x[0], x[1], "") : LLVMBuildSub(b, x[0], x[1], "");
            break;
        case AJ_EXPR_MUL:
            v = fl ? LLVMBuildFMul(b, x[0], x[1], "") : LLVMBuildMul(b, x[0], x[1], "");
            break;
        case AJ_EXPR_DIV:
            v = fl ? LLVMBuildFDiv(b, x[0], x[1], "") : floor_divmod(m, x[0], x[1], 0);
            break;
        case AJ_EXPR_MOD: v = floor_divmod(m, x[0], x[1], 1); break;
        case AJ_EXPR_AND: v = LLVMBuildAnd(b, x[0], x[1], ""); break;
        case AJ_EXPR_OR: v = LLVMBuildOr(b, x[0], x[1], ""); break;
        case AJ_EXPR_LT: case AJ_EXPR_LE: case AJ_EXPR_GT: case AJ_EXPR_GE:
        case AJ_EXPR_EQ: case AJ_EXPR_NE:
            v = emit_compare(m, op, at, x[0], x[1]);
            break;
        case AJ_EXPR_SELECT: v = LLVMBuildSelect(b, x[0], x[1], x[2], ""); break;
        case AJ_EXPR_MIN: v = pick(m, t, 1, x[0], x[1]); break;
        case AJ_EXPR_MAX: v = pick(m, t, 0, x[0], x[1]); break;
        case AJ_EXPR_CLAMP: v = pick(m, t, 1, pick(m, t, 0, x[0], x[1]), x[2]); break;
        case AJ_EXPR_ABS:
            v = fl ? aj_kb_call_overloaded(kb, "llvm.fabs", x, 1)
                   : LLVMBuildSelect(
                         b, LLVMBuildICmp(b, LLVMIntSLT, x[0], LLVMConstNull(LLVMTypeOf(x[0])), ""),
                         LLVMBuildNeg(b, x[0], ""), x[0], "");
            break;
        case AJ_EXPR_FLOOR: v = fl ? emit_math(m, op, x[0]) : x[0]; break;
        default: v = emit_math(m, op, x[0]); break;
        }
    }
    m->memo[id] = v;
    return v;
}

static void emitter_init(emitter *m, aj_score *s, int lanes, LLVMValueRef i, LLVMValueRef j,
                         LLVMValueRef score)
{
    memset(m, 0, sizeof *m);
    m->s = s;
    m->lanes = lanes;
    m->i = i;
    m->j = j;
    m->score = score;
    m->memo = m->vmemo;
}

static LLVMValueRef clamp_to_i32(aj_kb *kb, LLVMValueRef v64)
{
    v64 = aj_kb_smin(kb, v64, aj_kb_i64(kb, OFFSET_CLAMP));
    v64 = aj_kb_smax(kb, v64, aj_kb_i64(kb, -OFFSET_CLAMP));
    return LLVMBuildTrunc(kb->b, v64, kb->t_i32, "");
}

static LLVMValueRef to_i64(aj_kb *kb, LLVMValueRef v)
{
    return LLVMTypeOf(v) == kb->t_i64 ? v : LLVMBuildSExt(kb->b, v, kb->t_i64, "");
}

void aj_score_begin(aj_score *s, aj_kb *kb, const aj_score_prog *p, int lanes, LLVMValueRef b,
                    LLVMValueRef h, LLVMValueRef q_origin, LLVMValueRef k_origin,
                    LLVMValueRef sq, LLVMValueRef sk)
{
    memset(s, 0, sizeof *s);
    s->kb = kb;
    s->p = p;
    s->lanes = lanes;
    s->b = to_i64(kb, b);
    s->h_local = s->h = to_i64(kb, h);
    if (p->reads_h)
        s->h = LLVMBuildAdd(kb->b, s->h_local, to_i64(kb, aj_param(kb, AJ_PID(head_offset))),
                            "h_global");
    s->q_origin = q_origin;
    s->k_origin = k_origin;
    s->sq = sq ? sq : aj_kb_i64(kb, 0);
    s->sk = sk ? sk : aj_kb_i64(kb, 0);
    /* the band's bounds read no position: one scalar emission per CTA */
    static _Thread_local emitter m;
    emitter_init(&m, s, 0, aj_kb_i32(kb, 0), aj_kb_i32(kb, 0), NULL);
    LLVMValueRef delta = LLVMBuildSub(kb->b, q_origin, k_origin, "delta");
    if (p->band_hi != NONE)
        s->hi_off = clamp_to_i32(kb, LLVMBuildAdd(kb->b, delta, emit_node(&m, p->band_hi), ""));
    if (p->band_lo != NONE)
        s->lo_off = clamp_to_i32(kb, LLVMBuildAdd(kb->b, delta, emit_node(&m, p->band_lo), ""));
    /* loads that stay the same over the CTA's tiles, read here once: no
     * key loop then keeps their addresses and bounds live */
    for (int id = 0; id < p->e.count; id++)
        if (node(p, id)->op == AJ_EXPR_LOAD &&
            !(p->reads[id] & (AJ_SCORE_READS_POSITION | AJ_SCORE_READS(AJ_VAR_SCORE))))
            s->loads[id] = emit_node(&m, id);
    if (p->block_mask) {
        LLVMBuilderRef bd = kb->b;
        s->mask_classes = aj_param(kb, AJ_PID(block_mask));
        s->mask_plane = LLVMBuildAdd(
            bd, LLVMBuildMul(bd, s->b, aj_param(kb, AJ_PID(block_mask_stride_b)), ""),
            LLVMBuildMul(bd, s->h_local, aj_param(kb, AJ_PID(block_mask_stride_h)), ""),
            "mask_plane");
        s->mask_stride_m = aj_param(kb, AJ_PID(block_mask_stride_m));
        s->mask_bm = aj_param(kb, AJ_PID(block_mask_bm));
        s->mask_bn = aj_param(kb, AJ_PID(block_mask_bn));
    }
}

LLVMValueRef aj_score_mod_value(aj_score *s, LLVMValueRef score, LLVMValueRef i, LLVMValueRef j)
{
    if (s->p->mod == NONE)
        return score;
    static _Thread_local emitter m;
    emitter_init(&m, s, s->lanes, i, j, score);
    return emit_node(&m, s->p->mod);
}

LLVMValueRef aj_score_mod_grad(aj_score *s, LLVMValueRef score, LLVMValueRef i, LLVMValueRef j,
                               LLVMValueRef *d)
{
    aj_kb *kb = s->kb;
    static _Thread_local emitter m;
    emitter_init(&m, s, s->lanes, i, j, score);
    if (s->p->mod == NONE) {
        *d = splat(&m, aj_kb_f32(kb, 1));
        return score;
    }
    LLVMValueRef v = emit_node(&m, s->p->mod);
    *d = s->p->dmod == NONE ? splat(&m, aj_kb_f32(kb, 1)) : emit_node(&m, s->p->dmod);
    return v;
}

LLVMValueRef aj_score_visible_rest(aj_score *s, LLVMValueRef i, LLVMValueRef j)
{
    static _Thread_local emitter m;
    emitter_init(&m, s, s->lanes, i, j, NULL);
    if (s->p->rest == NONE)
        return splat(&m, LLVMConstInt(s->kb->t_i1, 1, 0));
    return emit_node(&m, s->p->rest);
}

LLVMValueRef aj_score_visible(aj_score *s, LLVMValueRef i, LLVMValueRef j)
{
    aj_kb *kb = s->kb;
    LLVMBuilderRef b = kb->b;
    static _Thread_local emitter m;
    emitter_init(&m, s, s->lanes, i, j, NULL);
    LLVMValueRef vis = aj_score_visible_rest(s, i, j);
    if (s->hi_off)
        vis = LLVMBuildAnd(b, vis, LLVMBuildICmp(b, LLVMIntSLE, j,
                                                 splat(&m, LLVMBuildAdd(b, i, s->hi_off, "")),
                                                 ""), "");
    if (s->lo_off)
        vis = LLVMBuildAnd(b, vis, LLVMBuildICmp(b, LLVMIntSGE, j,
                                                 splat(&m, LLVMBuildAdd(b, i, s->lo_off, "")),
                                                 ""), "");
    return vis;
}

LLVMValueRef aj_score_visible_in_tile(aj_score *s, int full, LLVMValueRef seq_q,
                                      LLVMValueRef seq_k, LLVMValueRef i, LLVMValueRef j)
{
    LLVMBuilderRef b = s->kb->b;
    if (full)
        return LLVMConstInt(s->kb->t_i1, 1, 0);
    LLVMValueRef hi = aj_score_row_hi(s, seq_k, i);
    if (seq_q)   /* a row past the query length: no key at or below -1 */
        hi = LLVMBuildSelect(b, LLVMBuildICmp(b, LLVMIntSLT, i, seq_q, ""), hi,
                             aj_kb_i32(s->kb, -1), "");
    LLVMValueRef vis = LLVMBuildICmp(b, LLVMIntSLE, j, hi, "");
    if (s->lo_off)
        vis = LLVMBuildAnd(b, vis, LLVMBuildICmp(b, LLVMIntSGE, j, aj_score_row_lo(s, i), ""),
                           "");
    if (aj_score_has_rest(s->p))
        vis = LLVMBuildAnd(b, vis, aj_score_visible_rest(s, i, j), "");
    return vis;
}

void aj_score_by_tile_class(aj_kb *kb, LLVMValueRef cls, LLVMValueRef inside,
                            aj_score_tile_body body, void *user)
{
    if (!cls) {
        body(user, 0);
        return;
    }
    LLVMBuilderRef b = kb->b;
    aj_kb_if_begin(kb, LLVMBuildAnd(b, LLVMBuildICmp(b, LLVMIntEQ, cls,
                                                     aj_kb_i32(kb, AJ_TILE_FULL), ""),
                                    inside, "full"));
    body(user, 1);
    aj_kb_else(kb);
    body(user, 0);
    aj_kb_if_end(kb);
}

void aj_score_key_range(aj_score *s, LLVMValueRef i0, LLVMValueRef i1, LLVMValueRef seq_k,
                        LLVMValueRef *j_lo, LLVMValueRef *j_hi)
{
    *j_lo = aj_score_row_lo(s, i0);
    *j_hi = aj_score_row_hi(s, seq_k, i1);
}

void aj_score_row_range(aj_score *s, LLVMValueRef j0, LLVMValueRef j1, LLVMValueRef seq_q,
                        LLVMValueRef *i_lo, LLVMValueRef *i_hi)
{
    aj_kb *kb = s->kb;
    LLVMBuilderRef b = kb->b;
    /* j <= i + hi_off  <=>  i >= j - hi_off;  j >= i + lo_off  <=>  i <= j - lo_off */
    LLVMValueRef lo = aj_kb_i32(kb, 0), hi = LLVMBuildSub(b, seq_q, aj_kb_i32(kb, 1), "");
    if (s->hi_off)
        lo = aj_kb_smax(kb, lo, LLVMBuildSub(b, j0, s->hi_off, ""));
    if (s->lo_off)
        hi = aj_kb_smin(kb, hi, LLVMBuildSub(b, j1, s->lo_off, ""));
    *i_lo = lo;
    *i_hi = hi;
}

/* ---------------------------------------------------------------- intervals */

/*
 * Interval arithmetic over a tile: every int or float node gets [lo, hi],
 * every bool node (may be false, may be true).  A node that reads no
 * position is a point (its value, emitted as usual).  Where a rule cannot
 * bound a node it is unknown: ints [-2^62, 2^62] (sums saturate), floats
 * [-inf, inf]; a float bound that is NaN makes every comparison with it
 * "may be either".  The host version below (hv_*) follows the same rules.
 */
#define UNKNOWN_INT (INT64_C(1) << 62)

typedef struct ival {
    LLVMValueRef lo, hi;   /* bool: lo = may be false, hi = may be true */
} ival;

typedef struct iemitter {
    emitter pt;                       /* point values */
    LLVMValueRef q0, q1, k0, k1;      /* i64 global positions of the tile */
    ival memo[AJ_EXPR_NODES_MAX];
    bool done[AJ_EXPR_NODES_MAX];
} iemitter;

/* Whether a node's tree reads a position (it is a range over a tile). */
static bool is_positional(const iemitter *m, uint16_t id)
{
    return m->pt.s->p->reads[id] & AJ_SCORE_READS_POSITION;
}

static ival iv_unknown(aj_kb *kb, aj_expr_type t)
{
    if (t == AJ_EXPR_FLOAT)
        return (ival){aj_kb_f32(kb, -INFINITY), aj_kb_f32(kb, INFINITY)};
    if (t == AJ_EXPR_BOOL)
        return (ival){LLVMConstInt(kb->t_i1, 1, 0), LLVMConstInt(kb->t_i1, 1, 0)};
    return (ival){aj_kb_i64(kb, -UNKNOWN_INT), aj_kb_i64(kb, UNKNOWN_INT)};
}

static LLVMValueRef sel(aj_kb *kb, LLVMValueRef c, LLVMValueRef a, LLVMValueRef b)
{
    return LLVMBuildSelect(kb->b, c, a, b, "");
}

static LLVMValueRef sat(aj_kb *kb, const char *name, LLVMValueRef a, LLVMValueRef b)
{
    LLVMValueRef args[2] = {a, b};
    LLVMValueRef v = aj_kb_call_overloaded(kb, name, args, 2);
    v = aj_kb_smin(kb, v, aj_kb_i64(kb, UNKNOWN_INT));
    return aj_kb_smax(kb, v, aj_kb_i64(kb, -UNKNOWN_INT));
}

/* x * c for a point c, either order of the bounds; unknown on overflow */
static ival iv_scale_int(aj_kb *kb, ival x, LLVMValueRef c)
{
    LLVMBuilderRef b = kb->b;
    LLVMValueRef a1 = LLVMBuildMul(b, x.lo, c, ""), a2 = LLVMBuildMul(b, x.hi, c, "");
    /* bounds and c within 2^31 keep the products exact */
    LLVMValueRef lim = aj_kb_i64(kb, INT64_C(1) << 31), nlim = aj_kb_i64(kb, -(INT64_C(1) << 31));
    LLVMValueRef small = LLVMBuildAnd(b, LLVMBuildICmp(b, LLVMIntSLT, x.hi, lim, ""),
                                      LLVMBuildICmp(b, LLVMIntSGT, x.lo, nlim, ""), "");
    small = LLVMBuildAnd(b, small, LLVMBuildAnd(b, LLVMBuildICmp(b, LLVMIntSLT, c, lim, ""),
                                                LLVMBuildICmp(b, LLVMIntSGT, c, nlim, ""), ""),
                         "");
    ival u = iv_unknown(kb, AJ_EXPR_INT);
    return (ival){sel(kb, small, aj_kb_smin(kb, a1, a2), u.lo),
                  sel(kb, small, aj_kb_smax(kb, a1, a2), u.hi)};
}

static ival iv_node(iemitter *m, uint16_t id);

static LLVMValueRef fminmax(aj_kb *kb, int is_min, LLVMValueRef a, LLVMValueRef b)
{
    LLVMValueRef args[2] = {a, b};
    return aj_kb_call_overloaded(kb, is_min ? "llvm.minnum" : "llvm.maxnum", args, 2);
}

/*
 * A load over a box of indices: the hull of the values inside the tensor,
 * and 0 where the box reaches past it.  Boxes of more than SCAN_MAX
 * elements are not read: unknown.  (A document mask's doc[b, q] over a
 * tile's rows is a box of block_m elements.)
 */
#define SCAN_MAX 4096

static ival iv_load(iemitter *m, const aj_expr_node *n, const ival *idx)
{
    aj_kb *kb = m->pt.s->kb;
    LLVMBuilderRef b = kb->b;
    const aj_tensor_decl *d = &m->pt.s->p->tensors[n->u.tensor];
    int fl = d->dtype == AJ_SIDE_F32;
    LLVMValueRef zero64 = aj_kb_i64(kb, 0), one64 = aj_kb_i64(kb, 1);
    LLVMValueRef outside = LLVMConstInt(kb->t_i1, 0, 0), count = one64;
    LLVMValueRef lo[AJ_EXPR_RANK_MAX], ext[AJ_EXPR_RANK_MAX], stride[AJ_EXPR_RANK_MAX];
    char name[64];
    for (int k = 0; k < d->rank; k++) {
        aj_score_param_name(name, sizeof name, d->name, 's', k);
        LLVMValueRef size = aj_kb_param(kb, name);
        aj_score_param_name(name, sizeof name, d->name, 't', k);
        stride[k] = aj_kb_param(kb, name);
        outside = LLVMBuildOr(b, outside, LLVMBuildOr(b,
                              LLVMBuildICmp(b, LLVMIntSLT, idx[k].lo, zero64, ""),
                              LLVMBuildICmp(b, LLVMIntSGE, idx[k].hi, size, ""), ""), "");
        lo[k] = aj_kb_smax(kb, idx[k].lo, zero64);
        LLVMValueRef hi = aj_kb_smin(kb, idx[k].hi, LLVMBuildSub(b, size, one64, ""));
        ext[k] = aj_kb_smax(kb, LLVMBuildAdd(b, LLVMBuildSub(b, hi, lo[k], ""), one64, ""),
                            zero64);
        /* products of extents past SCAN_MAX stop mattering: saturate */
        count = aj_kb_smin(kb, LLVMBuildMul(b, count, aj_kb_smin(kb, ext[k],
                                                                 aj_kb_i64(kb, SCAN_MAX + 1)),
                                            ""), aj_kb_i64(kb, SCAN_MAX + 1));
    }
    LLVMTypeRef vt = fl ? kb->t_f32 : kb->t_i64;
    LLVMValueRef top = fl ? aj_kb_f32(kb, INFINITY) : aj_kb_i64(kb, INT64_MAX);
    LLVMValueRef bottom = fl ? aj_kb_f32(kb, -INFINITY) : aj_kb_i64(kb, INT64_MIN);
    LLVMValueRef vmin = aj_kb_var(kb, vt, top, "scan_min");
    LLVMValueRef vmax = aj_kb_var(kb, vt, bottom, "scan_max");
    LLVMValueRef small = LLVMBuildICmp(b, LLVMIntSLE, count, aj_kb_i64(kb, SCAN_MAX), "");
    /* the box's indices as an odometer (no division per element): the
     * last dim turns fastest */
    LLVMValueRef cur[AJ_EXPR_RANK_MAX];
    for (int k = 0; k < d->rank; k++)
        cur[k] = aj_kb_var(kb, kb->t_i64, lo[k], "scan_at");
    aj_kb_for_begin(kb, zero64, LLVMBuildSelect(b, small, count, zero64, ""), one64, "scan");
    {
        LLVMValueRef at = zero64, carry = LLVMConstInt(kb->t_i1, 1, 0);
        for (int k = d->rank - 1; k >= 0; k--) {
            LLVMValueRef i = aj_kb_get(kb, cur[k]);
            at = LLVMBuildAdd(b, at, LLVMBuildMul(b, i, stride[k], ""), "");
            LLVMValueRef next = LLVMBuildAdd(b, i, LLVMBuildZExt(b, carry, kb->t_i64, ""), "");
            LLVMValueRef wrap = LLVMBuildICmp(b, LLVMIntSGE, LLVMBuildSub(b, next, lo[k], ""),
                                              ext[k], "");
            aj_kb_set(kb, cur[k], sel(kb, wrap, lo[k], next));
            carry = wrap;
        }
        LLVMValueRef v = aj_kb_load(kb, fl ? kb->t_f32 : kb->t_i32,
                                    aj_kb_gptr_offset(kb, aj_kb_param(kb, d->name),
                                                      LLVMBuildShl(b, at, aj_kb_i64(kb, 2), "")),
                                    4);
        if (!fl)
            v = LLVMBuildSExt(b, v, kb->t_i64, "");
        LLVMValueRef mn = aj_kb_get(kb, vmin), mx = aj_kb_get(kb, vmax);
        aj_kb_set(kb, vmin, fl ? fminmax(kb, 1, mn, v) : aj_kb_smin(kb, mn, v));
        aj_kb_set(kb, vmax, fl ? fminmax(kb, 0, mx, v) : aj_kb_smax(kb, mx, v));
    }
    aj_kb_for_end(kb);
    LLVMValueRef z = fl ? aj_kb_f32(kb, 0) : zero64;
    LLVMValueRef mn = aj_kb_get(kb, vmin), mx = aj_kb_get(kb, vmax);
    mn = sel(kb, outside, fl ? fminmax(kb, 1, mn, z) : aj_kb_smin(kb, mn, z), mn);
    mx = sel(kb, outside, fl ? fminmax(kb, 0, mx, z) : aj_kb_smax(kb, mx, z), mx);
    ival u = iv_unknown(kb, fl ? AJ_EXPR_FLOAT : AJ_EXPR_INT);
    return (ival){sel(kb, small, mn, u.lo), sel(kb, small, mx, u.hi)};
}


static ival iv_minmax(aj_kb *kb, aj_expr_type t, int is_min, ival a, ival b)
{
    if (t == AJ_EXPR_FLOAT)
        return (ival){fminmax(kb, is_min, a.lo, b.lo), fminmax(kb, is_min, a.hi, b.hi)};
    return is_min ? (ival){aj_kb_smin(kb, a.lo, b.lo), aj_kb_smin(kb, a.hi, b.hi)}
                  : (ival){aj_kb_smax(kb, a.lo, b.lo), aj_kb_smax(kb, a.hi, b.hi)};
}

static ival iv_compare(aj_kb *kb, aj_expr_op op, aj_expr_type t, ival a, ival c)
{
    LLVMBuilderRef b = kb->b;
    if (t == AJ_EXPR_BOOL) {
        if (op != AJ_EXPR_EQ && op != AJ_EXPR_NE)
            return iv_unknown(kb, AJ_EXPR_BOOL);
        LLVMValueRef same = LLVMBuildOr(b, LLVMBuildAnd(b, a.hi, c.hi, ""),
                                        LLVMBuildAnd(b, a.lo, c.lo, ""), "");
        LLVMValueRef diff = LLVMBuildOr(b, LLVMBuildAnd(b, a.hi, c.lo, ""),
                                        LLVMBuildAnd(b, a.lo, c.hi, ""), "");
        return op == AJ_EXPR_EQ ? (ival){diff, same} : (ival){same, diff};
    }
    int fl = t == AJ_EXPR_FLOAT;
#define LT_(x, y)                                                                                  \
    (fl ? LLVMBuildFCmp(b, LLVMRealULT, x, y, "") : LLVMBuildICmp(b, LLVMIntSLT, x, y, ""))
#define LE_(x, y)                                                                                  \
    (fl ? LLVMBuildFCmp(b, LLVMRealULE, x, y, "") : LLVMBuildICmp(b, LLVMIntSLE, x, y, ""))
    ival r;
    switch (op) {
    case AJ_EXPR_LT: r = (ival){LE_(c.lo, a.hi), LT_(a.lo, c.hi)}; break;
    case AJ_EXPR_LE: r = (ival){LT_(c.lo, a.hi), LE_(a.lo, c.hi)}; break;
    case AJ_EXPR_GT: r = (ival){LE_(a.lo, c.hi), LT_(c.lo, a.hi)}; break;
    case AJ_EXPR_GE: r = (ival){LT_(a.lo, c.hi), LE_(c.lo, a.hi)}; break;
    default: {
        LLVMValueRef overlap = LLVMBuildAnd(b, LE_(a.lo, c.hi), LE_(c.lo, a.hi), "");
        LLVMValueRef eq = fl ? LLVMBuildFCmp(b, LLVMRealOEQ, a.lo, a.hi, "")
                             : LLVMBuildICmp(b, LLVMIntEQ, a.lo, a.hi, "");
        eq = LLVMBuildAnd(b, eq, fl ? LLVMBuildFCmp(b, LLVMRealOEQ, c.lo, c.hi, "")
                                    : LLVMBuildICmp(b, LLVMIntEQ, c.lo, c.hi, ""), "");
        eq = LLVMBuildAnd(b, eq, fl ? LLVMBuildFCmp(b, LLVMRealOEQ, a.lo, c.lo, "")
                                    : LLVMBuildICmp(b, LLVMIntEQ, a.lo, c.lo, ""), "");
        LLVMValueRef not_eq = LLVMBuildNot(b, eq, "");
        r = op == AJ_EXPR_EQ ? (ival){not_eq, overlap} : (ival){overlap, not_eq};
        break;
    }
    }
#undef LT_
#undef LE_
    return r;
}

static ival iv_compute(iemitter *m, uint16_t id)
{
    aj_kb *kb = m->pt.s->kb;
    LLVMBuilderRef b = kb->b;
    const aj_expr_node *n = &m->pt.s->p->e.nodes[id];
    aj_expr_op op = (aj_expr_op)n->op;
    aj_expr_type t = (aj_expr_type)n->type;
    if (!is_positional(m, id)) {
        LLVMValueRef v = emit_node(&m->pt, id);
        if (t == AJ_EXPR_BOOL)
            return (ival){LLVMBuildNot(b, v, ""), v};
        return (ival){v, v};
    }
    if (op == AJ_EXPR_VAR)
        return n->u.var == AJ_VAR_Q ? (ival){m->q0, m->q1} : (ival){m->k0, m->k1};
    ival x[AJ_EXPR_RANK_MAX];
    int ar = aj_expr_arity(n);
    for (int i = 0; i < ar; i++)
        x[i] = iv_node(m, n->args[i]);
    if (op == AJ_EXPR_LOAD)
        return iv_load(m, n, x);
    aj_expr_type at = (aj_expr_type)m->pt.s->p->e.nodes[n->args[0]].type;
    int fl = t == AJ_EXPR_FLOAT;
    switch (op) {
    case AJ_EXPR_TO_FLOAT:
        return (ival){LLVMBuildSIToFP(b, x[0].lo, kb->t_f32, ""),
                      LLVMBuildSIToFP(b, x[0].hi, kb->t_f32, "")};
    case AJ_EXPR_NEG:
        return fl ? (ival){LLVMBuildFNeg(b, x[0].hi, ""), LLVMBuildFNeg(b, x[0].lo, "")}
                  : (ival){LLVMBuildNeg(b, x[0].hi, ""), LLVMBuildNeg(b, x[0].lo, "")};
    case AJ_EXPR_NOT:
        return (ival){x[0].hi, x[0].lo};
    case AJ_EXPR_ADD:
        return fl ? (ival){LLVMBuildFAdd(b, x[0].lo, x[1].lo, ""),
                           LLVMBuildFAdd(b, x[0].hi, x[1].hi, "")}
                  : (ival){sat(kb, "llvm.sadd.sat", x[0].lo, x[1].lo),
                           sat(kb, "llvm.sadd.sat", x[0].hi, x[1].hi)};
    case AJ_EXPR_SUB:
        return fl ? (ival){LLVMBuildFSub(b, x[0].lo, x[1].hi, ""),
                           LLVMBuildFSub(b, x[0].hi, x[1].lo, "")}
                  : (ival){sat(kb, "llvm.ssub.sat", x[0].lo, x[1].hi),
                           sat(kb, "llvm.ssub.sat", x[0].hi, x[1].lo)};
    case AJ_EXPR_MUL:
    case AJ_EXPR_DIV: {
        /* by a point only (the other side may be the point for a product) */
        int point = !is_positional(m, n->args[1])                        ? 1
                    : op == AJ_EXPR_MUL && !is_positional(m, n->args[0]) ? 0
                                                                         : -1;
        if (point < 0)
            return iv_unknown(kb, t);
        ival r = x[1 - point];
        LLVMValueRef c = x[point].lo;
        if (op == AJ_EXPR_MUL) {
            if (!fl)
                return iv_scale_int(kb, r, c);
            LLVMValueRef a1 = LLVMBuildFMul(b, r.lo, c, ""), a2 = LLVMBuildFMul(b, r.hi, c, "");
            LLVMValueRef neg = LLVMBuildFCmp(b, LLVMRealOLT, c, aj_kb_f32(kb, 0), "");
            return (ival){sel(kb, neg, a2, a1), sel(kb, neg, a1, a2)};
        }
        if (fl) {
            LLVMValueRef a1 = LLVMBuildFDiv(b, r.lo, c, ""), a2 = LLVMBuildFDiv(b, r.hi, c, "");
            LLVMValueRef neg = LLVMBuildFCmp(b, LLVMRealOLT, c, aj_kb_f32(kb, 0), "");
            LLVMValueRef zero = LLVMBuildFCmp(b, LLVMRealUEQ, c, aj_kb_f32(kb, 0), "");
            ival u = iv_unknown(kb, t);
            return (ival){sel(kb, zero, u.lo, sel(kb, neg, a2, a1)),
                          sel(kb, zero, u.hi, sel(kb, neg, a1, a2))};
        }
        LLVMValueRef a1 = floor_divmod(&m->pt, r.lo, c, 0), a2 = floor_divmod(&m->pt, r.hi, c, 0);
        return (ival){aj_kb_smin(kb, a1, a2), aj_kb_smax(kb, a1, a2)};
    }
    case AJ_EXPR_MOD: {
        if (is_positional(m, n->args[1]))
            return iv_unknown(kb, t);
        LLVMValueRef c = x[1].lo;
        LLVMValueRef r0 = floor_divmod(&m->pt, x[0].lo, c, 1),
                     r1 = floor_divmod(&m->pt, x[0].hi, c, 1);
        /* one period at most, not wrapping: [r0, r1]; else [0, c - 1] */
        LLVMValueRef narrow = LLVMBuildAnd(
            b, LLVMBuildICmp(b, LLVMIntSLT, sat(kb, "llvm.ssub.sat", x[0].hi, x[0].lo), c, ""),
            LLVMBuildICmp(b, LLVMIntSLE, r0, r1, ""), "");
        LLVMValueRef pos = LLVMBuildICmp(b, LLVMIntSGT, c, aj_kb_i64(kb, 0), "");
        ival u = iv_unknown(kb, t);
        return (ival){
            sel(kb, pos, sel(kb, narrow, r0, aj_kb_i64(kb, 0)), u.lo),
            sel(kb, pos, sel(kb, narrow, r1, LLVMBuildSub(b, c, aj_kb_i64(kb, 1), "")), u.hi)};
    }
    case AJ_EXPR_AND:
        return (ival){LLVMBuildOr(b, x[0].lo, x[1].lo, ""), LLVMBuildAnd(b, x[0].hi, x[1].hi, "")};
    case AJ_EXPR_OR:
        return (ival){LLVMBuildAnd(b, x[0].lo, x[1].lo, ""), LLVMBuildOr(b, x[0].hi, x[1].hi, "")};
    case AJ_EXPR_LT: case AJ_EXPR_LE: case AJ_EXPR_GT: case AJ_EXPR_GE:
    case AJ_EXPR_EQ: case AJ_EXPR_NE:
        return iv_compare(kb, op, at, x[0], x[1]);
    case AJ_EXPR_SELECT: {
        /* the arm the condition must take, else the hull of both */
        ival hull;
        if (t == AJ_EXPR_BOOL)
            hull =
                (ival){LLVMBuildOr(b, x[1].lo, x[2].lo, ""), LLVMBuildOr(b, x[1].hi, x[2].hi, "")};
        else
            hull = (ival){iv_minmax(kb, t, 1, x[1], x[2]).lo, iv_minmax(kb, t, 0, x[1], x[2]).hi};
        LLVMValueRef only_t = LLVMBuildNot(b, x[0].lo, ""), only_f = LLVMBuildNot(b, x[0].hi, "");
        return (ival){sel(kb, only_t, x[1].lo, sel(kb, only_f, x[2].lo, hull.lo)),
                      sel(kb, only_t, x[1].hi, sel(kb, only_f, x[2].hi, hull.hi))};
    }
    case AJ_EXPR_MIN: return iv_minmax(kb, t, 1, x[0], x[1]);
    case AJ_EXPR_MAX: return iv_minmax(kb, t, 0, x[0], x[1]);
    case AJ_EXPR_CLAMP: return iv_minmax(kb, t, 1, iv_minmax(kb, t, 0, x[0], x[1]), x[2]);
    case AJ_EXPR_ABS: {
        if (fl) {
            LLVMValueRef alo = aj_kb_call_overloaded(kb, "llvm.fabs", &x[0].lo, 1);
            LLVMValueRef ahi = aj_kb_call_overloaded(kb, "llvm.fabs", &x[0].hi, 1);
            LLVMValueRef straddle =
                LLVMBuildAnd(b, LLVMBuildFCmp(b, LLVMRealOLT, x[0].lo, aj_kb_f32(kb, 0), ""),
                             LLVMBuildFCmp(b, LLVMRealOGT, x[0].hi, aj_kb_f32(kb, 0), ""), "");
            return (ival){sel(kb, straddle, aj_kb_f32(kb, 0), fminmax(kb, 1, alo, ahi)),
                          fminmax(kb, 0, alo, ahi)};
        }
        LLVMValueRef nonneg = LLVMBuildICmp(b, LLVMIntSGE, x[0].lo, aj_kb_i64(kb, 0), "");
        LLVMValueRef nonpos = LLVMBuildICmp(b, LLVMIntSLE, x[0].hi, aj_kb_i64(kb, 0), "");
        LLVMValueRef nlo = LLVMBuildNeg(b, x[0].lo, ""), nhi = LLVMBuildNeg(b, x[0].hi, "");
        return (ival){sel(kb, nonneg, x[0].lo, sel(kb, nonpos, nhi, aj_kb_i64(kb, 0))),
                      sel(kb, nonneg, x[0].hi, sel(kb, nonpos, nlo, aj_kb_smax(kb, nlo, x[0].hi)))};
    }
    case AJ_EXPR_FLOOR: case AJ_EXPR_EXP: case AJ_EXPR_LOG: case AJ_EXPR_TANH:
    case AJ_EXPR_SQRT:   /* monotone; an int floor is the identity */
        if (!fl)
            return x[0];
        return (ival){emit_math(&m->pt, op, x[0].lo), emit_math(&m->pt, op, x[0].hi)};
    default:
        return iv_unknown(kb, t);
    }
}

static ival iv_node(iemitter *m, uint16_t id)
{
    if (!m->done[id]) {
        m->memo[id] = iv_compute(m, id);
        m->done[id] = true;
    }
    return m->memo[id];
}

/* An interval emitter over rows [i0, i1] x keys [j0, j1], holding the
 * fixed rows' intervals (aj_score_fix_rows) where there are some. */
static void iemitter_init(iemitter *m, aj_score *s, LLVMValueRef i0, LLVMValueRef i1,
                          LLVMValueRef j0, LLVMValueRef j1)
{
    aj_kb *kb = s->kb;
    LLVMBuilderRef b = kb->b;
    memset(m, 0, sizeof *m);
    emitter_init(&m->pt, s, 0, aj_kb_i32(kb, 0), aj_kb_i32(kb, 0), NULL);
    m->q0 = LLVMBuildAdd(b, s->q_origin, to_i64(kb, i0), "");
    m->q1 = LLVMBuildAdd(b, s->q_origin, to_i64(kb, i1), "");
    m->k0 = LLVMBuildAdd(b, s->k_origin, to_i64(kb, j0), "");
    m->k1 = LLVMBuildAdd(b, s->k_origin, to_i64(kb, j1), "");
    for (int id = 0; id < s->p->e.count; id++)
        if (s->row_lo[id] || s->col_lo[id]) {
            m->memo[id] = s->row_lo[id] ? (ival){s->row_lo[id], s->row_hi[id]}
                                        : (ival){s->col_lo[id], s->col_hi[id]};
            m->done[id] = true;
        }
}

void aj_score_fix_rows(aj_score *s, LLVMValueRef i0, LLVMValueRef i1)
{
    const aj_score_prog *p = s->p;
    if (p->rest == NONE)
        return;
    static _Thread_local iemitter m;
    iemitter_init(&m, s, i0, i1, aj_kb_i32(s->kb, 0), aj_kb_i32(s->kb, 0));
    for (int id = 0; id < p->e.count; id++)
        if ((p->reads[id] & AJ_SCORE_READS(AJ_VAR_Q)) &&
            !(p->reads[id] & (AJ_SCORE_READS(AJ_VAR_K) | AJ_SCORE_READS(AJ_VAR_SCORE)))) {
            ival v = iv_node(&m, (uint16_t)id);
            s->row_lo[id] = v.lo;
            s->row_hi[id] = v.hi;
        }
}

/* Whether node id is one of the rest's that read k and not q: fixed by
 * the keys (aj_score_fix_cols). */
static bool reads_keys_only(const aj_score_prog *p, int id)
{
    return (p->reads[id] & AJ_SCORE_READS(AJ_VAR_K)) &&
           !(p->reads[id] & (AJ_SCORE_READS(AJ_VAR_Q) | AJ_SCORE_READS(AJ_VAR_SCORE)));
}

int aj_score_col_slots(const aj_score_prog *p)
{
    int n = 0;
    for (int id = 0; p->rest != NONE && id < p->e.count; id++)
        n += reads_keys_only(p, id);
    return n;
}

void aj_score_fix_cols(aj_score *s, LLVMValueRef j0, LLVMValueRef j1)
{
    const aj_score_prog *p = s->p;
    static _Thread_local iemitter m;
    iemitter_init(&m, s, aj_kb_i32(s->kb, 0), aj_kb_i32(s->kb, 0), j0, j1);
    for (int id = 0; p->rest != NONE && id < p->e.count; id++)
        if (reads_keys_only(p, id)) {
            ival v = iv_node(&m, (uint16_t)id);
            s->col_lo[id] = v.lo;
            s->col_hi[id] = v.hi;
        }
}

/* A bound as the i64 it is kept as: ints as they are, floats' bits, bools
 * 0 or 1; and back. */
static LLVMValueRef bound_to_i64(aj_kb *kb, LLVMValueRef v)
{
    LLVMTypeRef t = LLVMTypeOf(v);
    if (t == kb->t_f32)
        v = LLVMBuildBitCast(kb->b, v, kb->t_i32, "");
    return t == kb->t_i64 ? v : LLVMBuildZExt(kb->b, v, kb->t_i64, "");
}

static LLVMValueRef bound_from_i64(aj_kb *kb, aj_expr_type t, LLVMValueRef v)
{
    if (t == AJ_EXPR_BOOL)
        return LLVMBuildTrunc(kb->b, v, kb->t_i1, "");
    if (t == AJ_EXPR_FLOAT)
        return LLVMBuildBitCast(kb->b, LLVMBuildTrunc(kb->b, v, kb->t_i32, ""), kb->t_f32, "");
    return v;
}

/* The i64 slot's pointer: block_mask + 8 (at + k). */
static LLVMValueRef col_slot(aj_score *s, LLVMValueRef at, int k)
{
    LLVMBuilderRef b = s->kb->b;
    LLVMValueRef i = LLVMBuildAdd(b, at, aj_kb_i64(s->kb, k), "");
    return aj_kb_gptr_offset(s->kb, aj_param(s->kb, AJ_PID(block_mask)),
                             LLVMBuildShl(b, i, aj_kb_i64(s->kb, 3), ""));
}

void aj_score_save_cols(aj_score *s, LLVMValueRef at)
{
    for (int id = 0, k = 0; id < s->p->e.count; id++)
        if (s->col_lo[id]) {
            aj_kb_store(s->kb, bound_to_i64(s->kb, s->col_lo[id]), col_slot(s, at, k++), 8);
            aj_kb_store(s->kb, bound_to_i64(s->kb, s->col_hi[id]), col_slot(s, at, k++), 8);
        }
}

void aj_score_load_cols(aj_score *s, LLVMValueRef at)
{
    const aj_score_prog *p = s->p;
    aj_kb *kb = s->kb;
    for (int id = 0, k = 0; p->rest != NONE && id < p->e.count; id++)
        if (reads_keys_only(p, id)) {
            aj_expr_type t = (aj_expr_type)node(p, id)->type;
            s->col_lo[id] =
                bound_from_i64(kb, t, aj_kb_load(kb, kb->t_i64, col_slot(s, at, k++), 8));
            s->col_hi[id] =
                bound_from_i64(kb, t, aj_kb_load(kb, kb->t_i64, col_slot(s, at, k++), 8));
        }
}

/* The rest's class by interval arithmetic: *skip where it cannot hold,
 * *full where it must. */
static void interval_tile_class(aj_score *s, LLVMValueRef i0, LLVMValueRef i1, LLVMValueRef j0,
                                LLVMValueRef j1, LLVMValueRef *skip, LLVMValueRef *full)
{
    LLVMBuilderRef b = s->kb->b;
    static _Thread_local iemitter m;
    iemitter_init(&m, s, i0, i1, j0, j1);
    ival r = iv_node(&m, s->p->rest);
    *skip = LLVMBuildNot(b, r.hi, "");
    *full = LLVMBuildNot(b, r.lo, "");
}

/*
 * The rest's class where the op takes a block mask: rows [i0, i1] x keys
 * [j0, j1] meet the mask's tiles [i0 / bm, i1 / bm] x [j0 / bn, j1 / bn]
 * (its tile need not be the kernel's); the range is skip where each of
 * them is, full where each is, else partial:
 *
 *          j0/bn     j1/bn
 *   i0/bm  [S] [S] [P]        all S: skip    all F: full
 *   i1/bm  [S] [S] [S]        else (a P, or S beside F): partial
 *
 * With no mask given (a NULL pointer: a kernel loaded from bytes, whose
 * launch cannot build one) the interval rules decide.
 */
static void rest_tile_class(aj_score *s, LLVMValueRef i0, LLVMValueRef i1, LLVMValueRef j0,
                            LLVMValueRef j1, LLVMValueRef *skip, LLVMValueRef *full)
{
    if (!s->p->block_mask) {
        interval_tile_class(s, i0, i1, j0, j1, skip, full);
        return;
    }
    aj_kb *kb = s->kb;
    LLVMBuilderRef b = kb->b;
    LLVMValueRef t1 = LLVMConstInt(kb->t_i1, 1, 0);
    LLVMValueRef all_skip = aj_kb_var(kb, kb->t_i1, t1, "mask_skip");
    LLVMValueRef all_full = aj_kb_var(kb, kb->t_i1, t1, "mask_full");
    aj_kb_if_begin(kb, LLVMBuildIsNotNull(b, s->mask_classes, ""));
    {
        aj_kb_set(kb, all_skip, t1);
        aj_kb_set(kb, all_full, t1);
        LLVMValueRef one = aj_kb_i64(kb, 1);
        LLVMValueRef r0 = LLVMBuildSDiv(b, to_i64(kb, i0), s->mask_bm, "");
        LLVMValueRef r1 =
            LLVMBuildAdd(b, LLVMBuildSDiv(b, to_i64(kb, i1), s->mask_bm, ""), one, "");
        LLVMValueRef c0 = LLVMBuildSDiv(b, to_i64(kb, j0), s->mask_bn, "");
        LLVMValueRef c1 =
            LLVMBuildAdd(b, LLVMBuildSDiv(b, to_i64(kb, j1), s->mask_bn, ""), one, "");
        LLVMValueRef r = aj_kb_for_begin(kb, r0, r1, one, "mask_r");
        LLVMValueRef row =
            LLVMBuildAdd(b, s->mask_plane, LLVMBuildMul(b, r, s->mask_stride_m, ""), "");
        LLVMValueRef c = aj_kb_for_begin(kb, c0, c1, one, "mask_c");
        LLVMValueRef at = LLVMBuildShl(b, LLVMBuildAdd(b, row, c, ""), aj_kb_i64(kb, 2), "");
        LLVMValueRef cls = aj_kb_load(kb, kb->t_i32, aj_kb_gptr_offset(kb, s->mask_classes, at), 4);
        LLVMValueRef is_skip = LLVMBuildICmp(b, LLVMIntEQ, cls, aj_kb_i32(kb, AJ_TILE_SKIP), "");
        LLVMValueRef is_full = LLVMBuildICmp(b, LLVMIntEQ, cls, aj_kb_i32(kb, AJ_TILE_FULL), "");
        aj_kb_set(kb, all_skip, LLVMBuildAnd(b, aj_kb_get(kb, all_skip), is_skip, ""));
        aj_kb_set(kb, all_full, LLVMBuildAnd(b, aj_kb_get(kb, all_full), is_full, ""));
        aj_kb_for_end(kb);
        aj_kb_for_end(kb);
    }
    aj_kb_else(kb);
    {
        LLVMValueRef iskip, ifull;
        interval_tile_class(s, i0, i1, j0, j1, &iskip, &ifull);
        aj_kb_set(kb, all_skip, iskip);
        aj_kb_set(kb, all_full, ifull);
    }
    aj_kb_if_end(kb);
    *skip = aj_kb_get(kb, all_skip);
    *full = aj_kb_get(kb, all_full);
}

LLVMValueRef aj_score_tile_class(aj_score *s, LLVMValueRef i0, LLVMValueRef i1,
                                 LLVMValueRef j0, LLVMValueRef j1)
{
    aj_kb *kb = s->kb;
    LLVMBuilderRef b = kb->b;
    LLVMValueRef t1 = LLVMConstInt(kb->t_i1, 1, 0), f1 = LLVMConstInt(kb->t_i1, 0, 0);
    /* the band: skip when every key lies beyond it, full when inside */
    LLVMValueRef skip = f1, full = t1;
    if (s->hi_off) {
        skip = LLVMBuildOr(b, skip, LLVMBuildICmp(b, LLVMIntSGT, j0,
                                                  LLVMBuildAdd(b, i1, s->hi_off, ""), ""), "");
        full = LLVMBuildAnd(b, full, LLVMBuildICmp(b, LLVMIntSLE, j1,
                                                   LLVMBuildAdd(b, i0, s->hi_off, ""), ""), "");
    }
    if (s->lo_off) {
        skip = LLVMBuildOr(b, skip, LLVMBuildICmp(b, LLVMIntSLT, j1,
                                                  LLVMBuildAdd(b, i0, s->lo_off, ""), ""), "");
        full = LLVMBuildAnd(b, full, LLVMBuildICmp(b, LLVMIntSGE, j0,
                                                   LLVMBuildAdd(b, i1, s->lo_off, ""), ""), "");
    }
    LLVMValueRef skip_cls = aj_kb_i32(kb, AJ_TILE_SKIP), full_cls = aj_kb_i32(kb, AJ_TILE_FULL);
    LLVMValueRef partial_cls = aj_kb_i32(kb, AJ_TILE_PARTIAL);
    if (s->p->rest == NONE)
        return sel(kb, skip, skip_cls, sel(kb, full, full_cls, partial_cls));
    /* the rest only where the band leaves the tile: its loads' hulls are
     * the costly part of a class */
    LLVMValueRef cls = aj_kb_var(kb, kb->t_i32, skip_cls, "tile_class");
    aj_kb_if_begin(kb, LLVMBuildNot(b, skip, ""));
    {
        LLVMValueRef rest_skip, rest_full;
        rest_tile_class(s, i0, i1, j0, j1, &rest_skip, &rest_full);
        full = LLVMBuildAnd(b, full, rest_full, "");
        aj_kb_set(kb, cls, sel(kb, rest_skip, skip_cls, sel(kb, full, full_cls, partial_cls)));
    }
    aj_kb_if_end(kb);
    return aj_kb_get(kb, cls);
}

/* ---------------------------------------------------------------- walks */

LLVMValueRef aj_score_mask_list_at(aj_kb *kb, LLVMValueRef plane, LLVMValueRef rows,
                                   LLVMValueRef cols, int by_keys, LLVMValueRef block)
{
    LLVMBuilderRef b = kb->b;
    LLVMValueRef one = aj_kb_i64(kb, 1);
    LLVMValueRef at = LLVMBuildAdd(b, plane, LLVMBuildMul(b, rows, cols, ""), "");
    if (by_keys)
        return LLVMBuildAdd(b, at, LLVMBuildMul(b, block, LLVMBuildAdd(b, cols, one, ""), ""),
                            "row_list");
    at = LLVMBuildAdd(b, at, LLVMBuildMul(b, rows, LLVMBuildAdd(b, cols, one, ""), ""), "");
    return LLVMBuildAdd(b, at, LLVMBuildMul(b, block, LLVMBuildAdd(b, rows, one, ""), ""),
                        "col_list");
}

/*
 * A walk's set-up (score.h).  The list applies where the mask is given,
 * its tile along the walk is the walk's, and the fixed range [lo, hi] is
 * one of its blocks across:
 *
 *   keys:  bn == mask_bn, lo % mask_bm == 0, hi + 1 == min(lo + mask_bm, Sq)
 *          list of row block lo / mask_bm: plane + rows cols + m (cols + 1)
 *   rows:  bm == mask_bm, lo % mask_bn == 0, hi + 1 == min(lo + mask_bn, Sk)
 *          list of key block lo / mask_bn: plane + rows cols
 *                                          + rows (cols + 1) + n (rows + 1)
 */
static void walk_begin(aj_score *s, aj_score_walk *w, int along_keys, LLVMValueRef lo,
                       LLVMValueRef hi, int size, LLVMValueRef first, LLVMValueRef end,
                       LLVMValueRef seq_q, LLVMValueRef seq_k)
{
    aj_kb *kb = s->kb;
    LLVMBuilderRef b = kb->b;
    *w = (aj_score_walk){.begin = first, .end = end, .along_keys = along_keys, .size = size,
                         .lo = lo, .hi = hi, .first = first, .last = end,
                         .seq = along_keys ? seq_k : seq_q};
    if (!s->p->block_mask)
        return;
    LLVMValueRef q = to_i64(kb, seq_q), k = to_i64(kb, seq_k), one = aj_kb_i64(kb, 1);
    LLVMValueRef rows = LLVMBuildSDiv(
        b, LLVMBuildAdd(b, q, LLVMBuildSub(b, s->mask_bm, one, ""), ""), s->mask_bm, "mask_rows");
    LLVMValueRef cols = s->mask_stride_m;
    LLVMValueRef along = along_keys ? s->mask_bn : s->mask_bm;
    LLVMValueRef across = along_keys ? s->mask_bm : s->mask_bn;
    LLVMValueRef lo64 = to_i64(kb, lo), hi64 = to_i64(kb, hi);
    LLVMValueRef block_end = aj_kb_smin(kb, LLVMBuildAdd(b, lo64, across, ""), along_keys ? q : k);
    LLVMValueRef ok = LLVMBuildIsNotNull(b, s->mask_classes, "");
    ok = LLVMBuildAnd(b, ok, LLVMBuildICmp(b, LLVMIntEQ, along, aj_kb_i64(kb, size), ""), "");
    ok = LLVMBuildAnd(b, ok, LLVMBuildICmp(b, LLVMIntEQ, LLVMBuildSRem(b, lo64, across, ""),
                                           aj_kb_i64(kb, 0), ""), "");
    ok = LLVMBuildAnd(b, ok, LLVMBuildICmp(b, LLVMIntEQ, LLVMBuildAdd(b, hi64, one, ""),
                                           block_end, ""), "listed");
    LLVMValueRef block = LLVMBuildSDiv(b, lo64, across, "");
    LLVMValueRef at = aj_score_mask_list_at(kb, s->mask_plane, rows, cols, along_keys, block);
    LLVMValueRef count = aj_kb_var(kb, kb->t_i32, aj_kb_i32(kb, 0), "list_count");
    aj_kb_if_begin(kb, ok);
    aj_kb_set(kb, count, aj_kb_load(kb, kb->t_i32, aj_kb_gptr_offset(kb, s->mask_classes,
                                    LLVMBuildShl(b, at, aj_kb_i64(kb, 2), "")), 4));
    aj_kb_if_end(kb);
    w->listed = ok;
    w->entries = LLVMBuildAdd(b, at, one, "entries");
    w->begin = LLVMBuildSelect(b, ok, aj_kb_i32(kb, 0), first, "walk_begin");
    w->end = LLVMBuildSelect(b, ok, aj_kb_get(kb, count), end, "walk_end");
}

void aj_score_walk_keys(aj_score *s, aj_score_walk *w, LLVMValueRef i0, LLVMValueRef i1,
                        int bn, LLVMValueRef n_first, LLVMValueRef n_end, LLVMValueRef seq_q,
                        LLVMValueRef seq_k)
{
    walk_begin(s, w, 1, i0, i1, bn, n_first, n_end, seq_q, seq_k);
}

void aj_score_walk_rows(aj_score *s, aj_score_walk *w, LLVMValueRef j0, LLVMValueRef j1,
                        int bm, LLVMValueRef m_first, LLVMValueRef m_end, LLVMValueRef seq_q,
                        LLVMValueRef seq_k)
{
    walk_begin(s, w, 0, j0, j1, bm, m_first, m_end, seq_q, seq_k);
}

/* The class of tile t of the walk by aj_score_tile_class. */
static LLVMValueRef walk_class(aj_score *s, const aj_score_walk *w, LLVMValueRef t)
{
    aj_kb *kb = s->kb;
    LLVMBuilderRef b = kb->b;
    LLVMValueRef t0 = LLVMBuildMul(b, t, aj_kb_i32(kb, w->size), "");
    LLVMValueRef t1 =
        LLVMBuildSub(b, aj_kb_smin(kb, LLVMBuildAdd(b, t0, aj_kb_i32(kb, w->size), ""), w->seq),
                     aj_kb_i32(kb, 1), "");
    return w->along_keys ? aj_score_tile_class(s, w->lo, w->hi, t0, t1)
                         : aj_score_tile_class(s, t0, t1, w->lo, w->hi);
}

LLVMValueRef aj_score_walk_tile(aj_score *s, const aj_score_walk *w, LLVMValueRef pos,
                                LLVMValueRef *cls)
{
    aj_kb *kb = s->kb;
    LLVMBuilderRef b = kb->b;
    if (!w->listed) {
        if (cls)
            *cls = walk_class(s, w, pos);
        return pos;
    }
    LLVMValueRef tile = aj_kb_var(kb, kb->t_i32, pos, "walk_tile");
    LLVMValueRef c = aj_kb_var(kb, kb->t_i32, aj_kb_i32(kb, AJ_TILE_SKIP), "walk_class");
    aj_kb_if_begin(kb, w->listed);
    {
        LLVMValueRef at = LLVMBuildAdd(b, w->entries, to_i64(kb, pos), "");
        LLVMValueRef e = aj_kb_load(kb, kb->t_i32, aj_kb_gptr_offset(kb, s->mask_classes,
                                    LLVMBuildShl(b, at, aj_kb_i64(kb, 2), "")), 4);
        LLVMValueRef t = LLVMBuildAShr(b, e, aj_kb_i32(kb, 2), "");
        LLVMValueRef in = LLVMBuildAnd(b, LLVMBuildICmp(b, LLVMIntSGE, t, w->first, ""),
                                       LLVMBuildICmp(b, LLVMIntSLT, t, w->last, ""), "");
        aj_kb_set(kb, tile, t);
        aj_kb_set(kb, c, sel(kb, in, LLVMBuildAnd(b, e, aj_kb_i32(kb, 3), ""),
                             aj_kb_i32(kb, AJ_TILE_SKIP)));
    }
    aj_kb_else(kb);
    aj_kb_set(kb, c, walk_class(s, w, pos));
    aj_kb_if_end(kb);
    if (cls)
        *cls = aj_kb_get(kb, c);
    return aj_kb_get(kb, tile);
}

/* ---------------------------------------------------------------- host */

/* The same interval rules over host values, for the ring's decisions. */
typedef struct hval {
    int64_t lo, hi;        /* int */
    float flo, fhi;        /* float */
    bool may_f, may_t;     /* bool */
} hval;

typedef struct hctx {
    const aj_score_prog *p;
    aj_expr_env env;       /* b, h, sq, sk; q and k unused */
    const aj_side_tensor *tensors;   /* NULL: loads are unknown */
    bool any_batch, any_head;   /* b, h unknown */
    int64_t q0, q1, k0, k1;
    aj_score_cache *cache;   /* NULL: none */
    hval memo[AJ_EXPR_NODES_MAX];
    bool done[AJ_EXPR_NODES_MAX];
} hctx;

static int64_t sat64(__int128 v)
{
    return v > UNKNOWN_INT ? UNKNOWN_INT : v < -UNKNOWN_INT ? -UNKNOWN_INT : (int64_t)v;
}

static hval hv_unknown(void)
{
    return (hval){-UNKNOWN_INT, UNKNOWN_INT, -INFINITY, INFINITY, true, true};
}

static hval hv_point(const aj_expr_node *n, aj_expr_scalar v)
{
    hval r = {0};
    if (n->type == AJ_EXPR_BOOL)
        r.may_t = v.b, r.may_f = !v.b;
    else if (n->type == AJ_EXPR_FLOAT)
        r.flo = r.fhi = v.f;
    else
        r.lo = r.hi = v.i;
    return r;
}

static int64_t hfdiv(int64_t a, int64_t c, int want_mod)
{
    if (c == 0 || (c == -1 && want_mod))
        return 0;
    if (c == -1)
        return (int64_t)(0 - (uint64_t)a);
    int64_t q = a / c, r = a % c;
    if (r != 0 && (r < 0) != (c < 0))
        q--, r += c;
    return want_mod ? r : q;
}

static bool ult(bool fl, const hval *a, int a_hi, const hval *b, int b_hi, bool or_equal)
{
    if (fl) {
        float x = a_hi ? a->fhi : a->flo, y = b_hi ? b->fhi : b->flo;
        return isnan(x) || isnan(y) || (or_equal ? x <= y : x < y);
    }
    int64_t x = a_hi ? a->hi : a->lo, y = b_hi ? b->hi : b->lo;
    return or_equal ? x <= y : x < y;
}

static hval hv_node(hctx *h, uint16_t id);

static hval hv_load(const aj_side_tensor *t, const hval *idx);

/* A load's hull from the cache, or read and kept there: the tiles of a
 * row (column) of a block mask scan the same query (key) box. */
static hval hv_load_cached(aj_score_cache *cache, int tensor, const aj_side_tensor *t,
                           const hval *idx)
{
    if (!cache)
        return hv_load(t, idx);
    uint64_t key = (uint64_t)tensor * 0x9e3779b97f4a7c15ull;
    for (int k = 0; k < t->rank; k++)
        key = (key ^ (uint64_t)idx[k].lo) * 0xbf58476d1ce4e5b9ull ^ (uint64_t)idx[k].hi;
    aj_score_cache_entry *e = &cache->entries[(key >> 32) % AJ_SCORE_CACHE_SIZE];
    bool hit = e->used && e->tensor == tensor;
    for (int k = 0; hit && k < t->rank; k++)
        hit = e->lo[k] == idx[k].lo && e->hi[k] == idx[k].hi;
    if (!hit) {
        hval v = hv_load(t, idx);
        *e = (aj_score_cache_entry){.used = true, .tensor = tensor, .ilo = v.lo, .ihi = v.hi,
                                    .flo = v.flo, .fhi = v.fhi};
        for (int k = 0; k < t->rank; k++)
            e->lo[k] = idx[k].lo, e->hi[k] = idx[k].hi;
    }
    return (hval){e->ilo, e->ihi, e->flo, e->fhi, false, false};
}

/* iv_load's rule on host data. */
static hval hv_load(const aj_side_tensor *t, const hval *idx)
{
    bool fl = t->dtype == AJ_SIDE_F32, outside = false;
    int64_t lo[AJ_EXPR_RANK_MAX], ext[AJ_EXPR_RANK_MAX], count = 1;
    for (int k = 0; k < t->rank; k++) {
        outside = outside || idx[k].lo < 0 || idx[k].hi >= t->shape[k];
        lo[k] = idx[k].lo < 0 ? 0 : idx[k].lo;
        int64_t hi = idx[k].hi < t->shape[k] - 1 ? idx[k].hi : t->shape[k] - 1;
        ext[k] = hi - lo[k] + 1 > 0 ? hi - lo[k] + 1 : 0;
        count *= ext[k] < SCAN_MAX + 1 ? ext[k] : SCAN_MAX + 1;
        count = count < SCAN_MAX + 1 ? count : SCAN_MAX + 1;
    }
    if (count > SCAN_MAX)
        return hv_unknown();
    hval r = {INT64_MAX, INT64_MIN, INFINITY, -INFINITY, false, false};
    for (int64_t e = 0; e < count; e++) {
        int64_t at = 0, rest = e;
        for (int k = t->rank - 1; k >= 0; k--) {
            at += (lo[k] + rest % ext[k]) * t->strides[k];
            rest /= ext[k];
        }
        if (fl) {
            float v = ((const float *)t->data)[at];
            r.flo = fminf(r.flo, v), r.fhi = fmaxf(r.fhi, v);
        } else {
            int64_t v = ((const int32_t *)t->data)[at];
            r.lo = v < r.lo ? v : r.lo, r.hi = v > r.hi ? v : r.hi;
        }
    }
    if (outside) {
        r.flo = fminf(r.flo, 0), r.fhi = fmaxf(r.fhi, 0);
        r.lo = r.lo < 0 ? r.lo : 0, r.hi = r.hi > 0 ? r.hi : 0;
    }
    return r;
}

/* Leaves are points (h unknown for any head; loads unknown: the host has
 * no tensor data), so a tree that reads no position comes out a point. */
static hval hv_compute(hctx *h, uint16_t id)
{
    const aj_expr_node *n = &h->p->e.nodes[id];
    aj_expr_op op = (aj_expr_op)n->op;
    aj_expr_type t = (aj_expr_type)n->type;
    bool fl = t == AJ_EXPR_FLOAT;
    if (op == AJ_EXPR_LOAD && !h->tensors)
        return hv_unknown();
    if (op == AJ_EXPR_LIT || (op == AJ_EXPR_VAR && n->u.var != AJ_VAR_Q &&
                              n->u.var != AJ_VAR_K)) {
        if (op == AJ_EXPR_VAR && ((n->u.var == AJ_VAR_H && h->any_head) ||
                                  (n->u.var == AJ_VAR_B && h->any_batch)))
            return hv_unknown();
        return hv_point(n, aj_expr_eval(&h->p->e, id, &h->env));
    }
    if (op == AJ_EXPR_VAR)
        return n->u.var == AJ_VAR_Q ? (hval){.lo = h->q0, .hi = h->q1}
                                    : (hval){.lo = h->k0, .hi = h->k1};
    hval x[AJ_EXPR_RANK_MAX];
    int ar = aj_expr_arity(n);
    for (int i = 0; i < ar; i++)
        x[i] = hv_node(h, n->args[i]);
    if (op == AJ_EXPR_LOAD)
        return hv_load_cached(h->cache, n->u.tensor, &h->tensors[n->u.tensor], x);
    aj_expr_type at = (aj_expr_type)h->p->e.nodes[n->args[0]].type;
    bool point1 = ar > 1 && (at == AJ_EXPR_FLOAT ? x[1].flo == x[1].fhi : x[1].lo == x[1].hi);
    bool point0 = at == AJ_EXPR_FLOAT ? x[0].flo == x[0].fhi : x[0].lo == x[0].hi;
    hval r = {0};
    switch (op) {
    case AJ_EXPR_TO_FLOAT:
        return (hval){.flo = (float)x[0].lo, .fhi = (float)x[0].hi};
    case AJ_EXPR_NEG:
        return fl ? (hval){.flo = -x[0].fhi, .fhi = -x[0].flo}
                  : (hval){.lo = sat64(-(__int128)x[0].hi), .hi = sat64(-(__int128)x[0].lo)};
    case AJ_EXPR_NOT:
        return (hval){.may_f = x[0].may_t, .may_t = x[0].may_f};
    case AJ_EXPR_ADD:
        return fl ? (hval){.flo = x[0].flo + x[1].flo, .fhi = x[0].fhi + x[1].fhi}
                  : (hval){.lo = sat64((__int128)x[0].lo + x[1].lo),
                           .hi = sat64((__int128)x[0].hi + x[1].hi)};
    case AJ_EXPR_SUB:
        return fl ? (hval){.flo = x[0].flo - x[1].fhi, .fhi = x[0].fhi - x[1].flo}
                  : (hval){.lo = sat64((__int128)x[0].lo - x[1].hi),
                           .hi = sat64((__int128)x[0].hi - x[1].lo)};
    case AJ_EXPR_MUL:
    case AJ_EXPR_DIV: {
        int point = point1 ? 1 : op == AJ_EXPR_MUL && point0 ? 0 : -1;
        if (point < 0)
            return hv_unknown();
        hval v = x[1 - point];
        if (fl) {
            float c = x[point].flo;
            if (op == AJ_EXPR_DIV && !(c != 0))
                return hv_unknown();
            float a1 = op == AJ_EXPR_MUL ? v.flo * c : v.flo / c;
            float a2 = op == AJ_EXPR_MUL ? v.fhi * c : v.fhi / c;
            return c < 0 ? (hval){.flo = a2, .fhi = a1} : (hval){.flo = a1, .fhi = a2};
        }
        int64_t c = x[point].lo;
        if (op == AJ_EXPR_MUL) {
            const int64_t lim = INT64_C(1) << 31;
            if (!(v.hi < lim && v.lo > -lim && c < lim && c > -lim))
                return hv_unknown();
            int64_t a1 = v.lo * c, a2 = v.hi * c;
            return (hval){.lo = a1 < a2 ? a1 : a2, .hi = a1 < a2 ? a2 : a1};
        }
        int64_t a1 = hfdiv(v.lo, c, 0), a2 = hfdiv(v.hi, c, 0);
        return (hval){.lo = a1 < a2 ? a1 : a2, .hi = a1 < a2 ? a2 : a1};
    }
    case AJ_EXPR_MOD: {
        int64_t c = x[1].lo;
        if (!point1 || c <= 0)
            return hv_unknown();
        int64_t r0 = hfdiv(x[0].lo, c, 1), r1 = hfdiv(x[0].hi, c, 1);
        if (sat64((__int128)x[0].hi - x[0].lo) < c && r0 <= r1)
            return (hval){.lo = r0, .hi = r1};
        return (hval){.lo = 0, .hi = c - 1};
    }
    case AJ_EXPR_AND:
        return (hval){.may_f = x[0].may_f || x[1].may_f, .may_t = x[0].may_t && x[1].may_t};
    case AJ_EXPR_OR:
        return (hval){.may_f = x[0].may_f && x[1].may_f, .may_t = x[0].may_t || x[1].may_t};
    case AJ_EXPR_LT: case AJ_EXPR_LE: case AJ_EXPR_GT: case AJ_EXPR_GE:
    case AJ_EXPR_EQ: case AJ_EXPR_NE: {
        const hval *a = &x[0], *c = &x[1];
        if (at == AJ_EXPR_BOOL) {
            if (op != AJ_EXPR_EQ && op != AJ_EXPR_NE)
                return hv_unknown();
            bool same = (a->may_t && c->may_t) || (a->may_f && c->may_f);
            bool diff = (a->may_t && c->may_f) || (a->may_f && c->may_t);
            return op == AJ_EXPR_EQ ? (hval){.may_f = diff, .may_t = same}
                                    : (hval){.may_f = same, .may_t = diff};
        }
        bool f = at == AJ_EXPR_FLOAT;
        switch (op) {
        case AJ_EXPR_LT:
            r.may_f = ult(f, c, 0, a, 1, true), r.may_t = ult(f, a, 0, c, 1, false);
            break;
        case AJ_EXPR_LE:
            r.may_f = ult(f, c, 0, a, 1, false), r.may_t = ult(f, a, 0, c, 1, true);
            break;
        case AJ_EXPR_GT:
            r.may_f = ult(f, a, 0, c, 1, true), r.may_t = ult(f, c, 0, a, 1, false);
            break;
        case AJ_EXPR_GE:
            r.may_f = ult(f, a, 0, c, 1, false), r.may_t = ult(f, c, 0, a, 1, true);
            break;
        default: {
            bool overlap = ult(f, a, 0, c, 1, true) && ult(f, c, 0, a, 1, true);
            bool eq = f ? a->flo == a->fhi && c->flo == c->fhi && a->flo == c->flo
                        : a->lo == a->hi && c->lo == c->hi && a->lo == c->lo;
            r = op == AJ_EXPR_EQ ? (hval){.may_f = !eq, .may_t = overlap}
                                 : (hval){.may_f = overlap, .may_t = !eq};
        }
        }
        return r;
    }
    case AJ_EXPR_SELECT: {
        hval a = x[1], c = x[2];
        if (!x[0].may_f)
            return a;
        if (!x[0].may_t)
            return c;
        if (t == AJ_EXPR_BOOL)
            return (hval){.may_f = a.may_f || c.may_f, .may_t = a.may_t || c.may_t};
        return fl ? (hval){.flo = fminf(a.flo, c.flo), .fhi = fmaxf(a.fhi, c.fhi)}
                  : (hval){.lo = a.lo < c.lo ? a.lo : c.lo, .hi = a.hi > c.hi ? a.hi : c.hi};
    }
    case AJ_EXPR_MIN:
    case AJ_EXPR_MAX:
    case AJ_EXPR_CLAMP: {
        hval v = x[0];
        for (int k = 1; k < ar; k++) {
            bool is_min = op == AJ_EXPR_MIN || (op == AJ_EXPR_CLAMP && k == 2);
            if (fl)
                v = is_min ? (hval){.flo = fminf(v.flo, x[k].flo), .fhi = fminf(v.fhi, x[k].fhi)}
                           : (hval){.flo = fmaxf(v.flo, x[k].flo), .fhi = fmaxf(v.fhi, x[k].fhi)};
            else
                v = is_min ? (hval){.lo = v.lo < x[k].lo ? v.lo : x[k].lo,
                                    .hi = v.hi < x[k].hi ? v.hi : x[k].hi}
                           : (hval){.lo = v.lo > x[k].lo ? v.lo : x[k].lo,
                                    .hi = v.hi > x[k].hi ? v.hi : x[k].hi};
        }
        return v;
    }
    case AJ_EXPR_ABS:
        if (fl) {
            float alo = fabsf(x[0].flo), ahi = fabsf(x[0].fhi);
            bool straddle = x[0].flo < 0 && x[0].fhi > 0;
            return (hval){.flo = straddle ? 0 : fminf(alo, ahi), .fhi = fmaxf(alo, ahi)};
        }
        if (x[0].lo >= 0)
            return x[0];
        if (x[0].hi <= 0)
            return (hval){.lo = -x[0].hi, .hi = -x[0].lo};
        return (hval){.lo = 0, .hi = -x[0].lo > x[0].hi ? -x[0].lo : x[0].hi};
    case AJ_EXPR_FLOOR:
        return fl ? (hval){.flo = floorf(x[0].flo), .fhi = floorf(x[0].fhi)} : x[0];
    case AJ_EXPR_EXP:
        return (hval){.flo = expf(x[0].flo), .fhi = expf(x[0].fhi)};
    case AJ_EXPR_LOG:
        return (hval){.flo = logf(x[0].flo), .fhi = logf(x[0].fhi)};
    case AJ_EXPR_TANH:
        return (hval){.flo = tanhf(x[0].flo), .fhi = tanhf(x[0].fhi)};
    case AJ_EXPR_SQRT:
        return (hval){.flo = sqrtf(x[0].flo), .fhi = sqrtf(x[0].fhi)};
    default:
        return hv_unknown();
    }
}

static hval hv_node(hctx *h, uint16_t id)
{
    if (!h->done[id]) {
        h->memo[id] = hv_compute(h, id);
        h->done[id] = true;
    }
    return h->memo[id];
}

aj_tile_class aj_score_host_class(const aj_score_prog *p, const aj_side_tensor *tensors,
                                  aj_score_cache *cache, int64_t b, int64_t h, int64_t q0,
                                  int64_t q1, int64_t k0, int64_t k1, int64_t sq, int64_t sk)
{
    static _Thread_local hctx c;
    memset(c.done, 0, (size_t)p->e.count * sizeof c.done[0]);
    c.p = p;
    c.cache = cache;
    c.env = (aj_expr_env){.b = b < 0 ? 0 : b, .h = h < 0 ? 0 : h, .sq = sq, .sk = sk};
    c.any_batch = b < 0;
    c.tensors = tensors;
    c.any_head = h < 0;
    c.q0 = q0, c.q1 = q1, c.k0 = k0, c.k1 = k1;
    bool skip = false, full = true;
    /* the band, exactly as the kernels: k in [q + lo, q + hi] */
    uint16_t bounds[2] = {p->band_lo, p->band_hi};
    for (int side = 0; side < 2; side++) {
        if (bounds[side] == NONE)
            continue;
        /* a bound that reads h for any head is its hull over heads */
        hval v = hv_node(&c, bounds[side]);
        if (side == 0) {    /* k >= q + lo */
            skip = skip || (__int128)k1 < (__int128)q0 + v.lo;
            full = full && (__int128)k0 >= (__int128)q1 + v.hi;
        } else {            /* k <= q + hi */
            skip = skip || (__int128)k0 > (__int128)q1 + v.hi;
            full = full && (__int128)k1 <= (__int128)q0 + v.lo;
        }
    }
    if (p->rest != NONE) {
        hval r = hv_node(&c, p->rest);
        skip = skip || !r.may_t;
        full = full && !r.may_f;
    }
    return skip ? AJ_TILE_SKIP : full ? AJ_TILE_FULL : AJ_TILE_PARTIAL;
}
