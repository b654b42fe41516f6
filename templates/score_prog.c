/*
 * score_prog.c -- the score programs: built from the op, differentiated, the mask split
 * into band and rest (score_internal.h).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "templates/attn_common.h"
#include "templates/cpu_vec.h"
#include "templates/score_internal.h"

/* ---------------------------------------------------------------- building */

typedef struct builder {
    aj_score_prog *p;
    aj_expr_scope scope;
    bool ok;
    /* diff's variable: NONE, the score; else load node `wrt`, with
     * dep[id] whether node id's tree reads it */
    uint16_t wrt;
    const bool *dep;
} builder;


/* A leaf node (a literal or a variable), a copy of leaf. */
static uint16_t add_leaf(builder *bd, aj_expr_node leaf)
{
    uint16_t id = NONE;
    char msg[128];
    if (bd->ok && !aj_expr_add(&bd->p->e, &bd->scope, (aj_expr_op)leaf.op, NULL, 0, &leaf, &id,
                               msg, sizeof msg))
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
 * the tensor after the op's own); a read of `score` as node score_as
 * (NONE: the score itself). */
static aj_status add_field(aj_ctx *ctx, const aj_op *op, bool score_mod, uint16_t score_as,
                           aj_score_prog *p, uint16_t *root)
{
    *root = NONE;
    bool is_expr = score_mod ? op->score_mod.kind == AJ_SCORE_MOD_EXPR
                             : op->mask.kind == AJ_MASK_EXPR;
    if (is_expr) {
        uint16_t from = score_mod ? op->score_mod.root : op->mask.root;
        if (!aj_expr_copy_with(&p->e, &op->expr, from, AJ_VAR_SCORE, score_as, root))
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
    aj_op *tmp = malloc(sizeof *tmp);   /* an op is large for a stack */
    if (!tmp)
        return aj_fail(ctx, AJ_ERR_OUT_OF_MEMORY, "out of memory");
    *tmp = *op;
    tmp->expr = (aj_expr){0};   /* its own arena: the op's is not touched */
    if (needs_slopes) {
        aj_tensor_decl *d = &tmp->tensors[tmp->tensor_count++];
        memset(d, 0, sizeof *d);
        snprintf(d->name, sizeof d->name, "slopes");
        d->dtype = AJ_SIDE_F32;
        d->rank = 1;
    }
    uint16_t r;
    aj_status st = AJ_OK;
    if (aj_expr_parse(tmp, score_mod, text, strlen(text), &r, msg, sizeof msg) != AJ_OK)
        st = aj_fail(ctx, AJ_ERR_INTERNAL, "the built-in program '%s': %s", text, msg);
    else if (!aj_expr_copy_with(&p->e, &tmp->expr, r, AJ_VAR_SCORE, score_as, root))
        st = aj_fail(ctx, AJ_ERR_UNSUPPORTED, "the score program does not fit %d nodes",
                     AJ_EXPR_NODES_MAX);
    if (st == AJ_OK && needs_slopes && p->tensor_count == op->tensor_count) {
        aj_tensor_decl *d = &p->tensors[p->tensor_count++];
        *d = tmp->tensors[op->tensor_count];
        snprintf(d->name, sizeof d->name, "alibi_slopes");
    }
    aj_expr_free(&tmp->expr);
    free(tmp);
    return st;
}

/* ---------------------------------------------------------------- derivative */

/* The chain rule of a one-argument function node id = f(a) (exp, log,
 * tanh, sqrt, exp2, log2, sin, cos, tan, sigmoid, erf): d id = *slope x
 * d a, or d a / *divisor for log, log2 and sqrt (the nodes keep
 * aj_expr_eval_grad's own roundings); false for any other op. */
static bool chain_factor(builder *bd, const aj_expr_node *n, uint16_t id, uint16_t one,
                         uint16_t *slope, uint16_t *divisor)
{
    uint16_t a = n->args[0];
    *slope = *divisor = NONE;
    switch ((aj_expr_op)n->op) {
    case AJ_EXPR_EXP:
        *slope = id;
        return true;
    case AJ_EXPR_LOG:
        *divisor = a;
        return true;
    case AJ_EXPR_TANH:
        *slope = mk2(bd, AJ_EXPR_SUB, one, mk2(bd, AJ_EXPR_MUL, id, id));
        return true;
    case AJ_EXPR_SQRT:
        *divisor = mk2(bd, AJ_EXPR_MUL, lit(bd, AJ_EXPR_FLOAT, 2), id);
        return true;
    case AJ_EXPR_EXP2:
        *slope = mul_f(bd, id, lit(bd, AJ_EXPR_FLOAT, AJ_LN2));
        return true;
    case AJ_EXPR_LOG2:
        *divisor = mul_f(bd, a, lit(bd, AJ_EXPR_FLOAT, AJ_LN2));
        return true;
    case AJ_EXPR_SIN:
        *slope = mk(bd, AJ_EXPR_COS, &a, 1);
        return true;
    case AJ_EXPR_COS:
        *slope = mk(bd, AJ_EXPR_NEG, &(uint16_t){mk(bd, AJ_EXPR_SIN, &a, 1)}, 1);
        return true;
    case AJ_EXPR_TAN:
        *slope = add_f(bd, one, mk2(bd, AJ_EXPR_MUL, id, id));
        return true;
    case AJ_EXPR_SIGMOID:
        *slope = mul_f(bd, id, mk2(bd, AJ_EXPR_SUB, one, id));
        return true;
    case AJ_EXPR_ERF: {
        uint16_t sq = mk2(bd, AJ_EXPR_MUL, a, a);
        uint16_t g = mk(bd, AJ_EXPR_EXP, &(uint16_t){mk(bd, AJ_EXPR_NEG, &sq, 1)}, 1);
        *slope = mul_f(bd, lit(bd, AJ_EXPR_FLOAT, AJ_2_SQRTPI), g);
        return true;
    }
    default:
        return false;
    }
}

/* d node / d variable into memo (NONE until made), zero where the node
 * does not read it; the variable is the score, or load bd->wrt (a side
 * tensor's gradient).  The rules of aj_expr_eval_grad, written as nodes:
 * one-argument functions by chain_factor, the rest here. */
static uint16_t diff(builder *bd, uint16_t id, const uint16_t *reads, uint16_t *memo,
                     uint16_t zero, uint16_t one)
{
    const aj_score_prog *p = bd->p;
    const aj_expr_node *n = node(p, id);
    bool reads_var = bd->wrt == NONE ? (reads[id] & AJ_SCORE_READS(AJ_VAR_SCORE)) != 0
                                     : bd->dep[id];
    if (!reads_var || n->type != AJ_EXPR_FLOAT)
        return zero;
    if (id == bd->wrt)
        return one;
    if (memo[id] != NONE)
        return memo[id];
    uint16_t a = n->args[0], b = n->args[1], c = n->args[2];
#define D(x) diff(bd, (x), reads, memo, zero, one)
    uint16_t d = zero, slope, divisor;
    if (chain_factor(bd, n, id, one, &slope, &divisor)) {
        uint16_t da = D(a);
        d = divisor != NONE ? mk2(bd, AJ_EXPR_DIV, da, divisor) : mul_f(bd, slope, da);
        memo[id] = d;
        return d;
    }
    switch ((aj_expr_op)n->op) {
    case AJ_EXPR_VAR:
        d = n->u.var == AJ_VAR_SCORE && bd->wrt == NONE ? one : zero;
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
    case AJ_EXPR_POW: {
        /* N x^(N-1); for N < 0 as N x^N x^-1, so the exponent stays within
         * AJ_EXPR_POW_MAX */
        int64_t e = node(p, b)->u.i;
        if (e == 0)
            break;
        uint16_t lower = e > 0 ? mk2(bd, AJ_EXPR_POW, a, lit(bd, AJ_EXPR_INT, (double)(e - 1)))
                               : mul_f(bd, id, mk2(bd, AJ_EXPR_POW, a, lit(bd, AJ_EXPR_INT, -1)));
        d = mul_f(bd, e == 1 ? one : mul_f(bd, lit(bd, AJ_EXPR_FLOAT, (double)e), lower), D(a));
        break;
    }
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

/* Whether the interval rules (score_ival.c) bound node `root` over a
 * tile by its positions alone: every node of its tree that reads a
 * position passes aj_ival_by_positions.  The rest of a mask that fails
 * this takes a block mask (aj_score_prog.block_mask).  Operands have
 * smaller ids: one pass in id order. */
static bool interval_bounds(const aj_score_prog *p, uint16_t root)
{
    bool ok[AJ_EXPR_NODES_MAX];
    for (int id = 0; id <= root; id++) {
        const aj_expr_node *n = node(p, id);
        ok[id] = true;
        if (!(p->reads[id] & AJ_SCORE_READS_POSITION))
            continue;
        ok[id] = aj_ival_by_positions(p, n);
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
    uint16_t reads[AJ_EXPR_NODES_MAX];
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

aj_status aj_score_prog_check(aj_ctx *ctx, const aj_op *op)
{
    aj_score_prog *p = malloc(sizeof *p);   /* large for a stack */
    if (!p)
        return aj_fail(ctx, AJ_ERR_OUT_OF_MEMORY, "out of memory");
    aj_status st = aj_score_prog_init(ctx, op, p);
    if (st == AJ_OK)
        aj_score_prog_free(p);
    free(p);
    return st;
}

aj_status aj_score_prog_scratch(aj_kb *kb, const aj_op *op, const aj_score_prog **out)
{
    aj_score_prog *p = aj_kb_scratch(kb, sizeof *p);
    *out = p;
    if (!p)
        return kb->st;
    aj_status st = aj_score_prog_init(kb->ctx, op, p);
    if (st != AJ_OK)
        return st;
    bool nodes = !p->e.nodes || aj_kb_adopt(kb, p->e.nodes);
    if (nodes && aj_kb_adopt(kb, p->reads))
        return AJ_OK;
    if (!nodes)
        aj_expr_free(&p->e);
    free(p->reads);
    p->e.nodes = NULL, p->reads = NULL;
    return kb->st;
}

void aj_score_prog_free(aj_score_prog *p)
{
    aj_expr_free(&p->e);
    free(p->reads);
    p->reads = NULL;
}

/* The loads of grad tensors in the score_mod whose value reaches it (a
 * float load; not one only an index or a condition reads), each with
 * d mod / d load (p->grads).  False when there are more than
 * AJ_SCORE_GRADS_MAX of them. */
static bool grad_loads(builder *bd, uint16_t zero, uint16_t one)
{
    aj_score_prog *p = bd->p;
    int count = p->e.count;
    bool *used = calloc((size_t)count, sizeof *used), *dep = calloc((size_t)count, sizeof *dep);
    uint16_t *memo = malloc((size_t)AJ_EXPR_NODES_MAX * sizeof *memo);
    bool ok = used && dep && memo;
    /* the mod's tree, walked down in id order (operands have smaller ids) */
    if (ok)
        used[p->mod] = true;
    for (int id = p->mod; ok && id >= 0; id--) {
        if (!used[id])
            continue;
        const aj_expr_node *n = node(p, (uint16_t)id);
        for (int a = 0; a < aj_expr_arity(n); a++)
            used[n->args[a]] = true;
    }
    for (int id = 0; ok && id < count; id++) {
        const aj_expr_node *n = node(p, (uint16_t)id);
        if (!used[id] || n->op != AJ_EXPR_LOAD || n->type != AJ_EXPR_FLOAT ||
            !(p->tensor_grad >> n->u.tensor & 1u))
            continue;
        for (int j = 0; j < count; j++) {
            const aj_expr_node *m = node(p, (uint16_t)j);
            dep[j] = j == id;
            for (int a = 0; a < aj_expr_arity(m) && !dep[j]; a++)
                dep[j] = dep[m->args[a]];
        }
        for (int i = 0; i < AJ_EXPR_NODES_MAX; i++)
            memo[i] = NONE;
        bd->wrt = (uint16_t)id;
        bd->dep = dep;
        uint16_t d = diff(bd, p->mod, NULL, memo, zero, one);
        bd->wrt = NONE;
        if (!bd->ok || is_lit(p, d, 0))
            continue;
        if (p->num_grads == AJ_SCORE_GRADS_MAX) {
            ok = false;
            break;
        }
        p->grads[p->num_grads].load = (uint16_t)id;
        p->grads[p->num_grads++].d = d;
    }
    free(used);
    free(dep);
    free(memo);
    return ok;
}

static aj_status build(aj_ctx *ctx, const aj_op *op, aj_score_prog *p);

aj_status aj_score_prog_init(aj_ctx *ctx, const aj_op *op, aj_score_prog *p)
{
    aj_status st = build(ctx, op, p);
    if (st != AJ_OK)
        aj_score_prog_free(p);
    return st;
}

/* The programs into p, its arena at full size while they are made (node
 * pointers stay put), compacted after. */
static aj_status build(aj_ctx *ctx, const aj_op *op, aj_score_prog *p)
{
    memset(p, 0, sizeof *p);
    p->e.shared = true;
    p->mod = p->dmod = p->band_lo = p->band_hi = p->rest = p->biased = NONE;
    p->scale = aj_op_scale(op);
    p->dropout = op->dropout;
    p->tensor_count = op->tensor_count;
    memcpy(p->tensors, op->tensors, sizeof op->tensors[0] * (size_t)op->tensor_count);
    p->sinks = op->kind == AJ_KIND_MERGE ? -1 : op->sinks - 1;
    p->reads_h = p->sinks >= 0;
    uint16_t mask;
    aj_status st = add_field(ctx, op, false, NONE, p, &mask);
    if (st != AJ_OK)
        return st;
    builder bd = {p, {p->tensors, AJ_OP_TENSORS_MAX + 1, true, true}, true, NONE, NULL};
    if (op->bias == AJ_BIAS_ADD && op->kind != AJ_KIND_MERGE) {
        /* the bias is a leaf of the program: the score_mod reads score + bias */
        uint16_t sb[2] = {add_leaf(&bd, (aj_expr_node){.op = AJ_EXPR_VAR, .u.var = AJ_VAR_SCORE}),
                          add_leaf(&bd, (aj_expr_node){.op = AJ_EXPR_VAR, .u.var = AJ_VAR_BIAS})};
        p->biased = bd.ok ? mk(&bd, AJ_EXPR_ADD, sb, 2) : NONE;
        if (!bd.ok)
            return aj_fail(ctx, AJ_ERR_UNSUPPORTED, "the score program does not fit %d nodes",
                           AJ_EXPR_NODES_MAX);
    }
    st = add_field(ctx, op, true, p->biased, p, &p->mod);
    if (st != AJ_OK)
        return st;
    if (p->mod != NONE && aj_expr_depth(&p->e, p->mod) > AJ_EXPR_DEPTH_MAX)   /* + the bias */
        return aj_fail(ctx, AJ_ERR_UNSUPPORTED, "the score_mod with the bias is deeper than %d; "
                       "write a shallower score_mod", AJ_EXPR_DEPTH_MAX);
    if (p->mod == NONE)
        p->mod = p->biased;
    bd.scope.count = p->tensor_count;
    p->tensor_grad = aj_op_grad_bits(op);
    if (p->mod != NONE) {
        uint16_t reads[AJ_EXPR_NODES_MAX], memo[AJ_EXPR_NODES_MAX];
        mark_reads(p, reads);
        for (int i = 0; i < AJ_EXPR_NODES_MAX; i++)
            memo[i] = NONE;
        uint16_t zero = lit(&bd, AJ_EXPR_FLOAT, 0), one = lit(&bd, AJ_EXPR_FLOAT, 1);
        p->dmod = diff(&bd, p->mod, reads, memo, zero, one);
        /* a derivative of 1 (alibi, biases) is "none": the backward then
         * skips the chain rule's multiply and select per element */
        if (p->dmod != NONE && is_lit(p, p->dmod, 1))
            p->dmod = NONE;
        if (p->tensor_grad && bd.ok && !grad_loads(&bd, zero, one))
            return aj_fail(ctx, AJ_ERR_UNSUPPORTED, "the score_mod reads grad tensors at more "
                           "than %d places; a gradient is computed for at most %d loads",
                           AJ_SCORE_GRADS_MAX, AJ_SCORE_GRADS_MAX);
    }
    if (mask != NONE)
        split_band(&bd, mask);
    if (!bd.ok)
        return aj_fail(ctx, AJ_ERR_UNSUPPORTED, "the score program and its derivative do not "
                       "fit %d nodes of depth at most %d; write a shorter mask or score_mod",
                       AJ_EXPR_NODES_MAX, AJ_EXPR_DEPTH_MAX);
    aj_expr_compact(&p->e);
    p->reads = malloc((p->e.count ? p->e.count : 1) * sizeof *p->reads);
    if (!p->reads)
        return aj_fail(ctx, AJ_ERR_OUT_OF_MEMORY, "out of memory for the score program");
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

uint64_t aj_score_mix(uint64_t h, uint64_t v)
{
    h ^= v + 0x9e3779b97f4a7c15u + (h << 6) + (h >> 2);
    return h * 0x100000001b3u;
}

uint64_t aj_score_node_hash(int op, int type, uint64_t leaf, const uint64_t *args, int n)
{
    uint64_t h = aj_score_mix(aj_score_mix((uint64_t)op, (uint64_t)type), leaf);
    for (int a = 0; a < n; a++)
        h = aj_score_mix(h, args[a]);
    return h;
}

void aj_score_hash_nodes(const aj_score_prog *p, uint64_t *hs)
{
    for (int id = 0; id < p->e.count; id++) {
        const aj_expr_node *n = node(p, id);
        uint64_t leaf = n->op == AJ_EXPR_LIT ? (uint64_t)n->u.i
                      : n->op == AJ_EXPR_VAR ? (uint64_t)n->u.var
                      : n->op == AJ_EXPR_LOAD ? (uint64_t)n->u.tensor : 0;
        uint64_t args[AJ_EXPR_RANK_MAX];
        int ar = aj_expr_arity(n);
        for (int a = 0; a < ar; a++)
            args[a] = hs[n->args[a]];
        hs[id] = aj_score_node_hash(n->op, n->type, leaf, args, ar);
    }
}

uint64_t aj_score_mask_hash(const aj_score_prog *p)
{
    uint64_t *hs = malloc((p->e.count ? p->e.count : 1) * sizeof *hs);
    if (!hs)   /* no two programs share this: a builder is never taken for another's */
        return (uint64_t)(uintptr_t)p;
    aj_score_hash_nodes(p, hs);
    uint64_t h = 0xcbf29ce484222325u;
    const uint16_t roots[3] = {p->band_lo, p->band_hi, p->rest};
    for (int r = 0; r < 3; r++)
        h = aj_score_mix(h, roots[r] == NONE ? 0 : hs[roots[r]]);
    for (int t = 0; t < p->tensor_count; t++) {
        for (const char *c = p->tensors[t].name; *c; c++)
            h = aj_score_mix(h, (uint8_t)*c);
        h = aj_score_mix(aj_score_mix(h, (uint64_t)p->tensors[t].dtype),
                         (uint64_t)p->tensors[t].rank);
    }
    free(hs);
    return h;
}

/* ---------------------------------------------------------------- params */

void aj_score_param_name(char *buf, size_t cap, const char *tensor, char what, int dim)
{
    snprintf(buf, cap, "%s_%s%d", tensor, what == 's' ? "size" : "stride", dim);
}
