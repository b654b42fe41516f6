/*
 * expr.c -- the expression arena: typing, folding, checking, printing,
 * reserved names and the built-in forms' expressions (see expr.h).
 *
 * One typing function, rule_types(), says for an operator and its
 * operands' types what the node's type is and which type each operand must
 * have.  aj_expr_add() uses it to build (inserting TO_FLOAT where an int
 * must become a float); aj_expr_check() uses it to re-check a built tree,
 * so the parser, the builder and the verifier cannot disagree.
 */
#include "ir/op.h"

#include <assert.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---------------------------------------------------------------- tables */

#define AJ_EXPR_OP_ROW(e, spelling, form, prec, arity, rule) \
    [AJ_EXPR_##e] = { spelling, form, prec, arity, rule },
const aj_expr_op_info aj_expr_ops[AJ_EXPR_OP_COUNT] = {
    AJ_EXPR_OP_LIST(AJ_EXPR_OP_ROW)
};
#undef AJ_EXPR_OP_ROW

#define AJ_EXPR_VAR_NAME(e, name) [AJ_VAR_##e] = name,
const char *const aj_expr_var_names[AJ_VAR_COUNT] = {
    AJ_EXPR_VAR_LIST(AJ_EXPR_VAR_NAME)
};
#undef AJ_EXPR_VAR_NAME

const char *const aj_expr_type_names[AJ_EXPR_TYPE_COUNT] = {
    [AJ_EXPR_BOOL] = "bool",
    [AJ_EXPR_INT] = "int",
    [AJ_EXPR_FLOAT] = "float",
};

const char *const aj_side_dtype_names[AJ_SIDE_DTYPE_COUNT] = {
    [AJ_SIDE_I32] = "i32",
    [AJ_SIDE_F32] = "f32",
    [AJ_SIDE_F16] = "f16",
    [AJ_SIDE_BF16] = "bf16",
};

static_assert(AJ_EXPR_NODES_MAX < AJ_EXPR_NONE, "node ids fit below NONE");
static_assert(AJ_EXPR_RANK_MAX >= 3, "args holds a select's operands");

/* ---------------------------------------------------------------- typing */

/* How an operator reads in messages: "'+'", "unary '-'", "'min'". */
static const char *op_label(aj_expr_op op, char *buf, size_t cap)
{
    if (op == AJ_EXPR_NEG)
        return "unary '-'";
    if (op == AJ_EXPR_LOAD)
        return "a load";
    snprintf(buf, cap, "'%s'", aj_expr_ops[op].spelling);
    return buf;
}

static bool is_number(aj_expr_type t)
{
    return t == AJ_EXPR_INT || t == AJ_EXPR_FLOAT;
}

/* The first of types[0 .. n-1] that is not an int, or -1. */
static int first_not_int(const aj_expr_type *types, int n)
{
    for (int i = 0; i < n; i++)
        if (types[i] != AJ_EXPR_INT)
            return i;
    return -1;
}

/* pow's exponent must be an int literal within AJ_EXPR_POW_MAX: the
 * kernels multiply, and the derivative's pow(x, N - 1) stays a literal. */
static bool pow_exponent_ok(const aj_expr *e, uint16_t exponent, char *msg, size_t cap)
{
    const aj_expr_node *n = &e->nodes[exponent];
    if (n->op == AJ_EXPR_LIT && n->type == AJ_EXPR_INT && n->u.i >= -AJ_EXPR_POW_MAX &&
        n->u.i <= AJ_EXPR_POW_MAX)
        return true;
    snprintf(msg, cap, "the exponent of 'pow' must be an int literal from %d to %d "
             "(write exp(y * log(x)) for others)", -AJ_EXPR_POW_MAX, AJ_EXPR_POW_MAX);
    return false;
}

/* The type of a leaf: a LIT's own; a VAR's, score (a float, in a
 * score_mod only), bias (a float, in the score programs only) or a
 * position or size (an int). */
static bool leaf_type(aj_expr_op op, const aj_expr_node *leaf, const aj_expr_scope *scope,
                      aj_expr_type *result, char *msg, size_t cap)
{
    if (op == AJ_EXPR_LIT) {
        *result = (aj_expr_type)leaf->type;
        return true;
    }
    if (leaf->u.var == AJ_VAR_SCORE && !scope->score) {
        snprintf(msg, cap, "'score' is only defined in a score_mod");
        return false;
    }
    if (leaf->u.var == AJ_VAR_BIAS && !scope->bias) {
        snprintf(msg, cap, "'bias' is not a variable: a score_mod reads the op's bias "
                 "(bias = add) in score");
        return false;
    }
    *result = leaf->u.var == AJ_VAR_SCORE || leaf->u.var == AJ_VAR_BIAS ? AJ_EXPR_FLOAT
                                                                        : AJ_EXPR_INT;
    return true;
}

/*
 * The type of a node `op` whose operands have types[0 .. n-1], and in
 * want[i] the type operand i must have (an int where want says float gets
 * a TO_FLOAT).  `leaf` gives a LIT's type and a VAR's variable.  False with
 * a sentence in msg when the operand types do not fit the rule.
 */
static bool rule_types(aj_expr_op op, const aj_expr_type *types, int n,
                       const aj_expr_node *leaf, const aj_expr_scope *scope,
                       aj_expr_type *result, aj_expr_type *want, char *msg,
                       size_t cap)
{
    char label[16];
    const char *name = op_label(op, label, sizeof label);
    bool any_float = false, all_bool = true, all_number = true;
    int first = aj_expr_ops[op].rule == AJ_RULE_SELECT ? 1 : 0, bad;

    for (int i = first; i < n; i++) {
        any_float |= types[i] == AJ_EXPR_FLOAT;
        all_bool &= types[i] == AJ_EXPR_BOOL;
        all_number &= is_number(types[i]);
    }
    const aj_expr_type common = any_float ? AJ_EXPR_FLOAT : AJ_EXPR_INT;
    for (int i = 0; i < n; i++)
        want[i] = types[i];

    switch (aj_expr_ops[op].rule) {
    case AJ_RULE_LEAF:
        return leaf_type(op, leaf, scope, result, msg, cap);
    case AJ_RULE_LOAD:
        if ((bad = first_not_int(types, n)) >= 0) {
            snprintf(msg, cap, "index %d of '%s' must be an int, got %s", bad + 1,
                     scope->tensors[leaf->u.tensor].name, aj_expr_type_names[types[bad]]);
            return false;
        }
        *result = scope->tensors[leaf->u.tensor].dtype == AJ_SIDE_I32
                      ? AJ_EXPR_INT : AJ_EXPR_FLOAT;
        return true;
    case AJ_RULE_CONVERT:
        if (types[0] != AJ_EXPR_INT)
            break;
        *result = AJ_EXPR_FLOAT;
        return true;
    case AJ_RULE_ARITH:
    case AJ_RULE_SAME:
    case AJ_RULE_MATH:
    case AJ_RULE_ORDER:
        if (!all_number) {
            snprintf(msg, cap, "%s needs numbers, got bool", name);
            return false;
        }
        for (int i = 0; i < n; i++)
            want[i] = aj_expr_ops[op].rule == AJ_RULE_MATH ? AJ_EXPR_FLOAT
                                                            : common;
        *result = aj_expr_ops[op].rule == AJ_RULE_ORDER ? AJ_EXPR_BOOL
                                                        : want[0];
        return true;
    case AJ_RULE_INT:
        if ((bad = first_not_int(types, n)) >= 0) {
            snprintf(msg, cap, "%s needs ints, got %s", name, aj_expr_type_names[types[bad]]);
            return false;
        }
        *result = AJ_EXPR_INT;
        return true;
    case AJ_RULE_POW:
        if (!is_number(types[0]) || types[1] != AJ_EXPR_INT) {
            snprintf(msg, cap, "'pow' takes a number and an int exponent, got %s and %s",
                     aj_expr_type_names[types[0]], aj_expr_type_names[types[1]]);
            return false;
        }
        want[0] = AJ_EXPR_FLOAT;
        *result = AJ_EXPR_FLOAT;
        return true;
    case AJ_RULE_LOGIC:
        if (!all_bool) {
            snprintf(msg, cap, "%s needs bools, got %s", name,
                     aj_expr_type_names[types[0] == AJ_EXPR_BOOL ? types[1]
                                                                 : types[0]]);
            return false;
        }
        *result = AJ_EXPR_BOOL;
        return true;
    case AJ_RULE_EQUAL:
    case AJ_RULE_SELECT:
        if (first == 1 && types[0] != AJ_EXPR_BOOL) {
            snprintf(msg, cap, "the condition of '?' must be a bool, got %s",
                     aj_expr_type_names[types[0]]);
            return false;
        }
        if (!all_bool && !all_number) {
            snprintf(msg, cap, "%s needs two numbers or two bools, got %s "
                     "and %s", first ? "'? :'" : name,
                     aj_expr_type_names[types[first]],
                     aj_expr_type_names[types[first + 1]]);
            return false;
        }
        for (int i = first; i < n; i++)
            want[i] = all_bool ? AJ_EXPR_BOOL : common;
        *result = first ? want[1] : AJ_EXPR_BOOL;
        return true;
    }
    snprintf(msg, cap, "%s cannot take %s", name,
             aj_expr_type_names[types[0]]);
    return false;
}

/* ---------------------------------------------------------------- build */

int aj_expr_arity(const aj_expr_node *n)
{
    int arity = 0;

    if (n->op != AJ_EXPR_LOAD)
        return aj_expr_ops[n->op].arity;
    while (arity < AJ_EXPR_RANK_MAX && n->args[arity] != AJ_EXPR_NONE)
        arity++;
    return arity;
}

static bool arena_full(const aj_expr *e, char *msg, size_t cap)
{
    if (e->count < AJ_EXPR_NODES_MAX)
        return false;
    snprintf(msg, cap, "the op's expressions have more than %d nodes",
             AJ_EXPR_NODES_MAX);
    return true;
}

/* Room for `more` nodes: an arena that has less grows to its full
 * AJ_EXPR_NODES_MAX at once (so no later append moves it); the limit
 * itself is arena_full's to report. */
static bool reserve(aj_expr *e, int more, char *msg, size_t cap)
{
    if (e->cap == AJ_EXPR_NODES_MAX || e->count + more <= e->cap)
        return true;
    aj_expr_node *grown = realloc(e->nodes, AJ_EXPR_NODES_MAX * sizeof *grown);
    if (!grown) {
        snprintf(msg, cap, "out of memory for the expression's nodes");
        return false;
    }
    e->nodes = grown;
    e->cap = AJ_EXPR_NODES_MAX;
    return true;
}

void aj_expr_free(aj_expr *e)
{
    free(e->nodes);
    e->nodes = NULL;
    e->count = e->cap = 0;
}

void aj_expr_compact(aj_expr *e)
{
    if (e->cap == e->count)
        return;
    if (e->count == 0) {
        aj_expr_free(e);
        return;
    }
    aj_expr_node *fit = realloc(e->nodes, (size_t)e->count * sizeof *fit);
    if (fit) {
        e->nodes = fit;
        e->cap = e->count;
    }
}

bool aj_expr_clone(aj_expr *dst, const aj_expr *src)
{
    *dst = (aj_expr){ .shared = src->shared };
    if (src->count == 0)
        return true;
    dst->nodes = malloc((size_t)src->count * sizeof *dst->nodes);
    if (!dst->nodes)
        return false;
    memcpy(dst->nodes, src->nodes, (size_t)src->count * sizeof *dst->nodes);
    dst->count = dst->cap = src->count;
    return true;
}

static uint16_t append(aj_expr *e, aj_expr_node node)
{
    e->nodes[e->count] = node;
    return e->count++;
}

/* The literal `id` (an int) as a float literal, in place. */
static void lit_to_float(aj_expr_node *lit)
{
    lit->type = AJ_EXPR_FLOAT;
    lit->u.f = (double)(float)lit->u.i;
}

int aj_expr_depth(const aj_expr *e, uint16_t root)
{
    return e->nodes[root].depth;
}

/* Replaces the node `id`, whose operands are all literals, by its value
 * when that is a plain number (not NaN, not -0.0: those keep the node, so
 * the printed form says how they arise).  The operands are the nodes just
 * below id, so they are dropped with it. */
static uint16_t fold(aj_expr *e, uint16_t id, int n)
{
    aj_expr_node *node = &e->nodes[id];
    const aj_expr_env env = { 0 };
    aj_expr_node lit = { .op = AJ_EXPR_LIT, .type = node->type, .depth = 1 };
    aj_expr_scalar v;
    uint16_t lowest = id;

    for (int i = 0; i < n; i++) {
        if (e->nodes[node->args[i]].op != AJ_EXPR_LIT)
            return id;
        lowest = node->args[i] < lowest ? node->args[i] : lowest;
    }
    v = aj_expr_eval(e, id, &env);
    switch (node->type) {
    case AJ_EXPR_BOOL:  lit.u.i = v.b; break;
    case AJ_EXPR_INT:   lit.u.i = v.i; break;
    case AJ_EXPR_FLOAT:
        if (isnan(v.f) || (v.f == 0 && signbit(v.f)))
            return id;
        lit.u.f = v.f;
        break;
    }
    for (int i = 0; i < AJ_EXPR_RANK_MAX; i++)
        lit.args[i] = AJ_EXPR_NONE;
    if (id - lowest == n && !e->shared) {
        e->count = lowest;
        return append(e, lit);
    }
    e->nodes[id] = lit;
    return id;
}

bool aj_expr_add(aj_expr *e, const aj_expr_scope *scope, aj_expr_op op,
                 const uint16_t *args, int n, const aj_expr_node *leaf,
                 uint16_t *out, char *msg, size_t cap)
{
    aj_expr_type types[AJ_EXPR_RANK_MAX] = { 0 }, want[AJ_EXPR_RANK_MAX];
    aj_expr_type result;
    aj_expr_node node = { .op = (uint8_t)op };
    uint16_t ids[AJ_EXPR_RANK_MAX];
    int arity = op == AJ_EXPR_LOAD ? scope->tensors[leaf->u.tensor].rank
                                   : aj_expr_ops[op].arity;
    int depth = 0;

    if (n != arity) {
        char label[16];
        snprintf(msg, cap, "%s takes %d argument%s, got %d",
                 op == AJ_EXPR_LOAD ? scope->tensors[leaf->u.tensor].name
                                    : op_label(op, label, sizeof label),
                 arity, arity == 1 ? "" : "s", n);
        return false;
    }
    /* every node this add may append (a conversion per operand, the node)
     * has its slot before any pointer into the arena is taken */
    if (!reserve(e, n + 1, msg, cap))
        return false;
    for (int i = 0; i < n; i++) {
        ids[i] = args[i];
        types[i] = (aj_expr_type)e->nodes[args[i]].type;
    }
    if (!rule_types(op, types, n, leaf, scope, &result, want, msg, cap))
        return false;
    if (op == AJ_EXPR_POW && !pow_exponent_ok(e, ids[1], msg, cap))
        return false;
    for (int i = 0; i < n; i++) {
        if (want[i] == types[i])
            continue;
        if (e->nodes[ids[i]].op == AJ_EXPR_LIT && !e->shared) {
            lit_to_float(&e->nodes[ids[i]]);
            continue;
        }
        if (e->nodes[ids[i]].op == AJ_EXPR_LIT) {
            if (arena_full(e, msg, cap))
                return false;
            aj_expr_node copy = e->nodes[ids[i]];
            lit_to_float(&copy);
            ids[i] = append(e, copy);
            continue;
        }
        if (arena_full(e, msg, cap))
            return false;
        ids[i] = append(e, (aj_expr_node){
            .op = AJ_EXPR_TO_FLOAT, .type = AJ_EXPR_FLOAT,
            .args = { ids[i], AJ_EXPR_NONE, AJ_EXPR_NONE, AJ_EXPR_NONE },
            .depth = e->nodes[ids[i]].depth });
    }
    for (int i = 0; i < n; i++) {
        int d = e->nodes[ids[i]].depth;
        depth = d > depth ? d : depth;
    }
    if (depth + 1 > AJ_EXPR_DEPTH_MAX) {
        snprintf(msg, cap, "the expression nests deeper than %d levels",
                 AJ_EXPR_DEPTH_MAX);
        return false;
    }
    if (arena_full(e, msg, cap))
        return false;
    if (leaf)
        node.u = leaf->u;
    node.type = (uint8_t)result;
    node.depth = (uint16_t)(depth + (aj_expr_ops[op].form == AJ_FORM_HIDDEN ? 0 : 1));
    for (int i = 0; i < AJ_EXPR_RANK_MAX; i++)
        node.args[i] = i < n ? ids[i] : AJ_EXPR_NONE;
    *out = append(e, node);
    if (aj_expr_ops[op].rule != AJ_RULE_LEAF && op != AJ_EXPR_LOAD)
        *out = fold(e, *out, n);
    return true;
}

/* Copies node id's tree, every read of variable `var` as node `with` of
 * dst (AJ_EXPR_NONE: none), the depths counted again over the copies. */
static uint16_t copy_node(aj_expr *dst, const aj_expr *src, uint16_t id, int var,
                          uint16_t with)
{
    aj_expr_node node = src->nodes[id];
    int arity = aj_expr_arity(&node), depth = 0;

    if (with != AJ_EXPR_NONE && node.op == AJ_EXPR_VAR && node.u.var == var)
        return with;
    for (int i = 0; i < arity; i++) {
        node.args[i] = copy_node(dst, src, node.args[i], var, with);
        depth = dst->nodes[node.args[i]].depth > depth ? dst->nodes[node.args[i]].depth : depth;
    }
    node.depth = (uint16_t)(depth + (aj_expr_ops[node.op].form == AJ_FORM_HIDDEN ? 0 : 1));
    return append(dst, node);
}

static int tree_size(const aj_expr *e, uint16_t id)
{
    const aj_expr_node *n = &e->nodes[id];
    int arity = aj_expr_arity(n);
    int size = 1;

    for (int i = 0; i < arity; i++)
        size += tree_size(e, n->args[i]);
    return size;
}

bool aj_expr_copy(aj_expr *dst, const aj_expr *src, uint16_t root,
                  uint16_t *out)
{
    return aj_expr_copy_with(dst, src, root, AJ_VAR_SCORE, AJ_EXPR_NONE, out);
}

bool aj_expr_copy_with(aj_expr *dst, const aj_expr *src, uint16_t root, aj_expr_var var,
                       uint16_t with, uint16_t *out)
{
    char msg[64];
    int size = tree_size(src, root);
    if (dst->count + size > AJ_EXPR_NODES_MAX || !reserve(dst, size, msg, sizeof msg))
        return false;
    *out = copy_node(dst, src, root, (int)var, with);
    return true;
}

/* ---------------------------------------------------------------- check */

/* Checks node id, whose operands (below it) have passed with depths in
 * depth[]; returns its tree's depth, 0 on an error (in msg). */
static int check_node(const aj_expr *e, const aj_expr_scope *scope, const uint16_t *depth,
                      uint16_t id, char *msg, size_t cap)
{
    const aj_expr_node *n = &e->nodes[id];
    aj_expr_type types[AJ_EXPR_RANK_MAX] = { 0 }, want[AJ_EXPR_RANK_MAX];
    aj_expr_type result;
    int arity, d = 0;

    if (n->op >= AJ_EXPR_OP_COUNT || n->type >= AJ_EXPR_TYPE_COUNT) {
        snprintf(msg, cap, "node %d has op %d and type %d, out of range", (int)id, n->op,
                 n->type);
        return 0;
    }
    if ((n->op == AJ_EXPR_VAR && (n->u.var < 0 || n->u.var >= AJ_VAR_COUNT)) ||
        (n->op == AJ_EXPR_LOAD && (n->u.tensor < 0 || n->u.tensor >= scope->count)) ||
        (n->op == AJ_EXPR_LIT && n->type == AJ_EXPR_BOOL && n->u.i != 0 && n->u.i != 1)) {
        snprintf(msg, cap, "node %d has a bad variable, tensor or literal", (int)id);
        return 0;
    }
    arity = aj_expr_arity(n);
    if (n->op == AJ_EXPR_LOAD && arity != scope->tensors[n->u.tensor].rank) {
        snprintf(msg, cap, "node %d loads '%s' with %d indices, want %d", (int)id,
                 scope->tensors[n->u.tensor].name, arity, (int)scope->tensors[n->u.tensor].rank);
        return 0;
    }
    for (int i = 0; i < arity; i++) {
        d = depth[n->args[i]] > d ? depth[n->args[i]] : d;
        types[i] = (aj_expr_type)e->nodes[n->args[i]].type;
    }
    if (!rule_types((aj_expr_op)n->op, types, arity, n, scope, &result, want, msg, cap))
        return 0;
    if (n->op == AJ_EXPR_POW && !pow_exponent_ok(e, n->args[1], msg, cap))
        return 0;
    for (int i = 0; i < arity; i++) {
        if (want[i] != types[i]) {
            snprintf(msg, cap, "node %d: operand %d is %s, want %s", (int)id, i + 1,
                     aj_expr_type_names[types[i]], aj_expr_type_names[want[i]]);
            return 0;
        }
    }
    if (result != n->type) {
        snprintf(msg, cap, "node %d is typed %s, want %s", (int)id,
                 aj_expr_type_names[n->type], aj_expr_type_names[result]);
        return 0;
    }
    d += aj_expr_ops[n->op].form == AJ_FORM_HIDDEN ? 0 : 1;
    return d > AJ_EXPR_DEPTH_MAX ? AJ_EXPR_DEPTH_MAX + 1 : d;   /* no count wraps */
}

/*
 * Without recursion (an arena poked into by hand may be deep, or share
 * nodes): one pass from the root down marks the tree's nodes and checks
 * that every operand id lies below its user's; one pass up checks each
 * marked node over its checked operands.
 */
bool aj_expr_check(const aj_expr *e, uint16_t root, const aj_expr_scope *scope,
                   aj_expr_type want, const char *what, char *msg, size_t cap)
{
    char why[160];
    int d = 0;

    if (e->count > AJ_EXPR_NODES_MAX || e->count > e->cap || root >= e->count) {
        snprintf(msg, cap, "%s expression: %d nodes (room for %d, at most %d), root %d",
                 what, (int)e->count, (int)e->cap, AJ_EXPR_NODES_MAX, (int)root);
        return false;
    }
    uint16_t *depth = calloc(e->count, sizeof *depth);
    if (!depth) {
        snprintf(msg, cap, "%s expression: out of memory", what);
        return false;
    }
    depth[root] = 1;   /* marked */
    for (int id = root; id >= 0 && d == 0; id--) {
        if (!depth[id])
            continue;
        const aj_expr_node *n = &e->nodes[id];
        int arity = n->op < AJ_EXPR_OP_COUNT ? aj_expr_arity(n) : 0;
        for (int i = 0; i < arity; i++) {
            if (n->args[i] >= id) {
                snprintf(why, sizeof why, "node %d is out of order (want below %d)",
                         (int)n->args[i], id);
                d = -1;
                break;
            }
            depth[n->args[i]] = 1;
        }
    }
    for (int id = 0; id <= root && d == 0; id++) {
        if (!depth[id])
            continue;
        depth[id] = (uint16_t)check_node(e, scope, depth, (uint16_t)id, why, sizeof why);
        if (!depth[id])
            d = -1;
    }
    if (d == 0)
        d = depth[root];
    free(depth);
    if (d < 0) {
        snprintf(msg, cap, "%s expression: %s", what, why);
        return false;
    }
    if (d > AJ_EXPR_DEPTH_MAX) {
        snprintf(msg, cap, "%s expression nests deeper than %d levels", what,
                 AJ_EXPR_DEPTH_MAX);
        return false;
    }
    if (e->nodes[root].type != want) {
        snprintf(msg, cap, "%s expression must be %s, got %s", what,
                 want == AJ_EXPR_BOOL ? "a bool" : "a number",
                 aj_expr_type_names[e->nodes[root].type]);
        return false;
    }
    return true;
}

/* ---------------------------------------------------------------- print */

typedef struct printer {
    const aj_expr *e;
    const aj_tensor_decl *tensors;
    void (*emit)(void *sink, const char *text);
    void *sink;
} printer;

/* The node a hidden node stands for. */
static uint16_t shown(const aj_expr *e, uint16_t id)
{
    while (aj_expr_ops[e->nodes[id].op].form == AJ_FORM_HIDDEN)
        id = e->nodes[id].args[0];
    return id;
}

static int prec_of(const aj_expr *e, uint16_t id)
{
    return aj_expr_ops[e->nodes[shown(e, id)].op].prec;
}

static void print_node(const printer *p, uint16_t id);
static void print_args(const printer *p, const aj_expr_node *n, int arity, const char *open,
                       const char *close);

static void print_operand(const printer *p, uint16_t id, bool parens)
{
    if (parens)
        p->emit(p->sink, "(");
    print_node(p, id);
    if (parens)
        p->emit(p->sink, ")");
}

static void print_literal(const printer *p, const aj_expr_node *n)
{
    char num[AJ_NUMBER_MAX];

    if (n->type == AJ_EXPR_BOOL) {
        p->emit(p->sink, n->u.i ? "true" : "false");
        return;
    }
    if (n->type == AJ_EXPR_FLOAT) {
        aj_format_number(n->u.f, num);
    } else if (n->u.i == INT64_MIN) {
        /* Its magnitude is no i64 literal; this folds back to it. */
        snprintf(num, sizeof num, "(%lld - 1)", (long long)(INT64_MIN + 1));
    } else {
        snprintf(num, sizeof num, "%lld", (long long)n->u.i);
    }
    p->emit(p->sink, num);
}

static void print_node(const printer *p, uint16_t id)
{
    const aj_expr_node *n = &p->e->nodes[shown(p->e, id)];
    const aj_expr_op_info *info = &aj_expr_ops[n->op];
    int arity = aj_expr_arity(n);

    switch (info->form) {
    case AJ_FORM_ATOM:
        if (n->op == AJ_EXPR_LIT) {
            print_literal(p, n);
            return;
        }
        if (n->op == AJ_EXPR_VAR) {
            p->emit(p->sink, aj_expr_var_names[n->u.var]);
            return;
        }
        p->emit(p->sink, p->tensors[n->u.tensor].name);
        print_args(p, n, arity, "[", "]");
        return;
    case AJ_FORM_PREFIX:
        p->emit(p->sink, info->spelling);
        print_operand(p, n->args[0], prec_of(p->e, n->args[0]) < info->prec);
        return;
    case AJ_FORM_INFIX:
        print_operand(p, n->args[0], prec_of(p->e, n->args[0]) < info->prec);
        p->emit(p->sink, " ");
        p->emit(p->sink, info->spelling);
        p->emit(p->sink, " ");
        print_operand(p, n->args[1], prec_of(p->e, n->args[1]) <= info->prec);
        return;
    case AJ_FORM_SELECT:
        print_operand(p, n->args[0], prec_of(p->e, n->args[0]) <= info->prec);
        p->emit(p->sink, " ? ");
        print_node(p, n->args[1]);
        p->emit(p->sink, " : ");
        print_node(p, n->args[2]);
        return;
    case AJ_FORM_CALL:
        p->emit(p->sink, info->spelling);
        print_args(p, n, arity, "(", ")");
        return;
    case AJ_FORM_HIDDEN:
        break;
    }
}

/* The operands of n, between open and close, separated by commas. */
static void print_args(const printer *p, const aj_expr_node *n, int arity, const char *open,
                       const char *close)
{
    p->emit(p->sink, open);
    for (int i = 0; i < arity; i++) {
        if (i)
            p->emit(p->sink, ", ");
        print_node(p, n->args[i]);
    }
    p->emit(p->sink, close);
}

void aj_expr_print(const aj_expr *e, uint16_t root,
                   const aj_tensor_decl *tensors,
                   void (*emit)(void *sink, const char *text), void *sink)
{
    const printer p = { e, tensors, emit, sink };

    print_node(&p, root);
}

/* ---------------------------------------------------------------- names */

/* Every name a kernel parameter or a launch value has (params.def, read
 * here as data: the one list of them). */
static const char *const kernel_names[] = {
#define AJ_PSOURCE(nm, kind) #nm,
#define AJ_PARAM(nm, type, how, source, dim) #nm,
#include "templates/params.def"
};

/* Whether `param` is one of the forms NAME_size<d> / NAME_stride<d> that a
 * side tensor `name` (len bytes) adds to a kernel's parameters. */
static bool is_side_form(const char *param, const char *name, size_t len)
{
    if (strncmp(param, name, len) != 0 || param[len] != '_')
        return false;
    const char *rest = param + len + 1;
    size_t word = strncmp(rest, "size", 4) == 0 ? 4 : strncmp(rest, "stride", 6) == 0 ? 6 : 0;
    if (!word || !rest[word])
        return false;
    for (const char *c = rest + word; *c; c++)
        if (*c < '0' || *c > '9')
            return false;
    return true;
}

bool aj_expr_side_forms_clash(const char *a, size_t alen, const char *b, size_t blen)
{
    char other[AJ_OP_TENSOR_NAME_MAX + 1];
    if (blen > AJ_OP_TENSOR_NAME_MAX)
        return false;
    memcpy(other, b, blen);
    other[blen] = '\0';
    return is_side_form(other, a, alen);
}

const char *aj_expr_name_reserved(const char *name, size_t len)
{
    static const char *const words[] = {"true", "false", "inf", "expr", "none",
                                        "alibi_slopes"};
    for (size_t i = 0; i < AJ_COUNT_OF(words); i++)
        if (strlen(words[i]) == len && memcmp(words[i], name, len) == 0)
            return i + 1 < AJ_COUNT_OF(words) ? "a keyword" : "alibi's side tensor";
    for (size_t i = 0; i < AJ_COUNT_OF(kernel_names); i++) {
        if (strlen(kernel_names[i]) == len && memcmp(kernel_names[i], name, len) == 0)
            return "a kernel parameter or launch tensor";
        if (is_side_form(kernel_names[i], name, len))
            return "the prefix of a kernel parameter its sizes and strides would shadow";
    }
    for (int v = 0; v < AJ_VAR_COUNT; v++)
        if (strlen(aj_expr_var_names[v]) == len && memcmp(aj_expr_var_names[v], name, len) == 0)
            return "a variable";
    for (int op = 0; op < AJ_EXPR_OP_COUNT; op++)
        if (aj_expr_ops[op].form == AJ_FORM_CALL && strlen(aj_expr_ops[op].spelling) == len &&
            memcmp(aj_expr_ops[op].spelling, name, len) == 0)
            return "a function";
    return NULL;
}

/* ---------------------------------------------------------------- built-ins */

bool aj_expr_builtin_text(const aj_op *op, bool score_mod, char *buf,
                          size_t cap, bool *needs_slopes)
{
    char c[AJ_NUMBER_MAX];
    const char *diag;
    int n = -1;

    *needs_slopes = false;
    if (score_mod) {
        switch (op->score_mod.kind) {
        case AJ_SCORE_MOD_NONE:
            n = snprintf(buf, cap, "%s", "");
            break;
        case AJ_SCORE_MOD_SOFTCAP:
            aj_format_number(op->score_mod.softcap, c);
            n = snprintf(buf, cap, "%s * tanh(score / %s)", c, c);
            break;
        case AJ_SCORE_MOD_ALIBI: {
            /* softcap(C) + alibi: the cap first; alibi(NAME): NAME's slopes */
            char capped[2 * AJ_NUMBER_MAX + 24] = "score";
            aj_format_number(op->score_mod.softcap, c);
            if (op->score_mod.softcap > 0)
                snprintf(capped, sizeof capped, "%s * tanh(score / %s)", c, c);
            *needs_slopes = op->score_mod.slopes == 0;
            n = snprintf(buf, cap, "%s - %s[h] * abs(q - k)", capped, op->score_mod.slopes
                         ? op->tensors[op->score_mod.slopes - 1].name : "slopes");
            break;
        }
        case AJ_SCORE_MOD_EXPR:
        case AJ_SCORE_MOD_COUNT:
            return false;
        }
        return n >= 0 && (size_t)n < cap;
    }
    diag = op->mask.align == AJ_ALIGN_BOTTOM_RIGHT ? "q + (sk - sq)" : "q";
    switch (op->mask.kind) {
    case AJ_MASK_NONE:
        n = snprintf(buf, cap, "%s", "");
        break;
    case AJ_MASK_CAUSAL:
        n = snprintf(buf, cap, "k <= %s", diag);
        break;
    case AJ_MASK_WINDOW:
        n = snprintf(buf, cap, "%s - %lld <= k && k <= %s + %lld", diag,
                     (long long)op->mask.left, diag,
                     (long long)op->mask.right);
        break;
    case AJ_MASK_EXPR:
    case AJ_MASK_COUNT:
        return false;
    }
    return n >= 0 && (size_t)n < cap;
}
