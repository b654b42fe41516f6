/*
 * expr_eval.c -- the expression interpreter (see expr.h, "eval").
 *
 * One walk computes every node as a dual number: its value and its
 * derivative with respect to `score`.  The float64 reference uses both (the
 * backward needs d(score_mod)/d(score)); the constant folder and masks use
 * the value.  Ints are exact i64 with wrap-around, floats are rounded to
 * f32 after every node, as the f32 kernels compute them.
 */
#include "ir/expr.h"

#include <math.h>

#include "ir/dtype.h"

typedef struct dual {
    aj_expr_scalar v;
    double d;          /* d(value)/d(score); 0 for ints and bools */
    bool live;         /* the node's tree reads score: else d is 0 */
} dual;

static dual eval_node(const aj_expr *e, uint16_t id, const aj_expr_env *env);

aj_expr_scalar aj_expr_eval(const aj_expr *e, uint16_t root,
                            const aj_expr_env *env)
{
    return eval_node(e, root, env).v;
}

bool aj_expr_eval_bool(const aj_expr *e, uint16_t root,
                       const aj_expr_env *env)
{
    return eval_node(e, root, env).v.b;
}

double aj_expr_eval_f64(const aj_expr *e, uint16_t root,
                        const aj_expr_env *env)
{
    aj_expr_scalar v = eval_node(e, root, env).v;

    return e->nodes[root].type == AJ_EXPR_INT ? (double)v.i : (double)v.f;
}

double aj_expr_eval_grad(const aj_expr *e, uint16_t root,
                         const aj_expr_env *env, double *d_score)
{
    dual r = eval_node(e, root, env);

    *d_score = r.d;
    return e->nodes[root].type == AJ_EXPR_INT ? (double)r.v.i : (double)r.v.f;
}

/* ---------------------------------------------------------------- ints */

/* i64 arithmetic wraps (through uint64_t, so no overflow is undefined). */
static int64_t wrap_add(int64_t a, int64_t b)
{
    return (int64_t)((uint64_t)a + (uint64_t)b);
}

static int64_t wrap_sub(int64_t a, int64_t b)
{
    return (int64_t)((uint64_t)a - (uint64_t)b);
}

static int64_t wrap_mul(int64_t a, int64_t b)
{
    return (int64_t)((uint64_t)a * (uint64_t)b);
}

/* Division flooring toward -inf; x / 0 == 0; INT64_MIN / -1 wraps. */
static int64_t floor_div(int64_t a, int64_t b)
{
    int64_t q;

    if (b == 0)
        return 0;
    if (b == -1)
        return wrap_sub(0, a);
    q = a / b;
    if (a % b != 0 && (a < 0) != (b < 0))
        q--;
    return q;
}

/* The remainder of floor_div: sign of b; x % 0 == 0. */
static int64_t floor_mod(int64_t a, int64_t b)
{
    int64_t r;

    if (b == 0 || b == -1)
        return 0;
    r = a % b;
    if (r != 0 && (r < 0) != (b < 0))
        r += b;
    return r;
}

int64_t aj_expr_shift(int64_t x, int64_t s)
{
    if (s >= 64)
        return 0;
    if (s >= 0)
        return (int64_t)((uint64_t)x << s);
    /* s < 0: floor(x / 2^-s), all sign bits from -s = 63 on (and for
     * INT64_MIN, whose negation is no i64) */
    int64_t r = s <= -63 ? 63 : -s;
    return x < 0 ? ~(~x >> r) : x >> r;
}

/* ---------------------------------------------------------------- loads */

const char *aj_side_dtype_name(aj_side_dtype dtype)
{
    return (unsigned)dtype < AJ_SIDE_DTYPE_COUNT ? aj_side_dtype_names[dtype] : "?";
}

int aj_side_dtype_bytes(aj_side_dtype dtype)
{
    return dtype == AJ_SIDE_F16 || dtype == AJ_SIDE_BF16 ? 2 : 4;
}

float aj_side_float_at(const void *data, aj_side_dtype dtype, int64_t at)
{
    switch (dtype) {
    case AJ_SIDE_F16: return aj_f16_to_f32(((const uint16_t *)data)[at]);
    case AJ_SIDE_BF16: return aj_bf16_to_f32(((const uint16_t *)data)[at]);
    default: return ((const float *)data)[at];
    }
}

static aj_expr_scalar load(const aj_expr_env *env, int tensor,
                           const int64_t *idx, int rank)
{
    const aj_side_tensor *t;
    int64_t at = 0;
    aj_expr_scalar zero = { .i = 0 }, v;

    if (tensor >= env->tensor_count)
        return zero;
    t = &env->tensors[tensor];
    for (int d = 0; d < rank; d++) {
        if (idx[d] < 0 || idx[d] >= t->shape[d])
            return zero;
        at += idx[d] * t->strides[d];
    }
    if (t->dtype == AJ_SIDE_I32)
        v.i = ((const int32_t *)t->data)[at];
    else
        v.f = aj_side_float_at(t->data, t->dtype, at);
    return v;
}

/* The row-major element of tensor `tensor` at idx, -1 outside it. */
static int64_t element(const aj_expr_env *env, int tensor, const int64_t *idx, int rank)
{
    int64_t at = 0;
    if (tensor >= env->tensor_count)
        return -1;
    for (int d = 0; d < rank; d++) {
        if (idx[d] < 0 || idx[d] >= env->tensors[tensor].shape[d])
            return -1;
        at = at * env->tensors[tensor].shape[d] + idx[d];
    }
    return at;
}

/* ---------------------------------------------------------------- walk */

static dual num(float v, double d)
{
    return (dual){ .v.f = v, .d = d };
}

static dual integer(int64_t v)
{
    return (dual){ .v.i = v };
}

static dual boolean(bool v)
{
    return (dual){ .v.b = v };
}

/* The picked operand of min / max: a, unless b is the one (NaN operands
 * are ignored, as IEEE minNum / maxNum do). */
static dual pick(dual a, dual b, bool take_b)
{
    return take_b ? b : a;
}

static dual eval_float(const aj_expr_node *n, const dual *x)
{
    const float a = x[0].v.f, b = x[1].v.f;
    const double da = x[0].d, db = x[1].d;

    switch ((aj_expr_op)n->op) {
    case AJ_EXPR_NEG:  return num(-a, -da);
    case AJ_EXPR_ADD:  return num(a + b, da + db);
    case AJ_EXPR_SUB:  return num(a - b, da - db);
    /* an operand that does not read the score adds no term (an infinite
     * a or q times its 0 is no NaN), as templates/score_prog.c drops it */
    case AJ_EXPR_MUL:
        return num(a * b, (x[0].live ? da * b : 0.0) + (x[1].live ? (double)a * db : 0.0));
    case AJ_EXPR_DIV: {
        float q = a / b;
        return num(q, (da - (x[1].live ? (double)q * db : 0.0)) / b);
    }
    case AJ_EXPR_MIN:  return pick(x[0], x[1], b < a || isnan(a));
    case AJ_EXPR_MAX:  return pick(x[0], x[1], b > a || isnan(a));
    case AJ_EXPR_CLAMP: {
        dual lo = pick(x[0], x[1], b > a || isnan(a));
        return pick(lo, x[2], x[2].v.f < lo.v.f || isnan(lo.v.f));
    }
    case AJ_EXPR_ABS:  return num(fabsf(a), a < 0 ? -da : da);
    case AJ_EXPR_FLOOR: return num(floorf(a), 0.0);
    case AJ_EXPR_EXP: {
        float v = (float)exp(a);
        return num(v, v * da);
    }
    case AJ_EXPR_LOG:  return num((float)log(a), da / a);
    case AJ_EXPR_TANH: {
        float t = (float)tanh(a);
        return num(t, (1.0 - (double)t * t) * da);
    }
    case AJ_EXPR_SQRT: {
        float s = (float)sqrt(a);
        return num(s, da / (2.0 * s));
    }
    case AJ_EXPR_EXP2: {
        float v = (float)exp2(a);
        return num(v, v * AJ_LN2 * da);
    }
    case AJ_EXPR_LOG2: return num((float)log2(a), da / (a * AJ_LN2));
    case AJ_EXPR_SIN:  return num((float)sin(a), cos(a) * da);
    case AJ_EXPR_COS:  return num((float)cos(a), -sin(a) * da);
    case AJ_EXPR_TAN: {
        float t = (float)tan(a);
        return num(t, (1.0 + (double)t * t) * da);
    }
    case AJ_EXPR_SIGMOID: {
        float s = (float)(1.0 / (1.0 + exp(-(double)a)));
        return num(s, (double)s * (1.0 - s) * da);
    }
    case AJ_EXPR_ERF:
        return num((float)erf(a), AJ_2_SQRTPI * exp(-(double)a * a) * da);
    case AJ_EXPR_POW: {
        /* N multiplications: exact in double up to the last rounding for
         * any f32 x and |N| <= AJ_EXPR_POW_MAX but for under- and overflow */
        int64_t e = x[1].v.i;
        double v = pow(a, (double)e);
        return num((float)v, e == 0 ? 0.0 : (double)e * pow(a, (double)(e - 1)) * da);
    }
    default:
        break;
    }
    return num(NAN, 0.0);
}

static dual eval_int(const aj_expr_node *n, const dual *x)
{
    const int64_t a = x[0].v.i, b = x[1].v.i;

    switch ((aj_expr_op)n->op) {
    case AJ_EXPR_NEG:   return integer(wrap_sub(0, a));
    case AJ_EXPR_ADD:   return integer(wrap_add(a, b));
    case AJ_EXPR_SUB:   return integer(wrap_sub(a, b));
    case AJ_EXPR_MUL:   return integer(wrap_mul(a, b));
    case AJ_EXPR_DIV:   return integer(floor_div(a, b));
    case AJ_EXPR_MOD:   return integer(floor_mod(a, b));
    case AJ_EXPR_MIN:   return integer(b < a ? b : a);
    case AJ_EXPR_MAX:   return integer(b > a ? b : a);
    case AJ_EXPR_CLAMP: {
        int64_t lo = b > a ? b : a;
        return integer(x[2].v.i < lo ? x[2].v.i : lo);
    }
    case AJ_EXPR_ABS:   return integer(a < 0 ? wrap_sub(0, a) : a);
    case AJ_EXPR_FLOOR: return integer(a);
    case AJ_EXPR_BIT_NOT: return integer(~a);
    case AJ_EXPR_BIT_AND: return integer(a & b);
    case AJ_EXPR_BIT_OR:  return integer(a | b);
    case AJ_EXPR_BIT_XOR: return integer(a ^ b);
    case AJ_EXPR_SHL:     return integer(aj_expr_shift(a, b));
    case AJ_EXPR_SHR:     return integer(b == INT64_MIN ? 0 : aj_expr_shift(a, -b));
    default:
        break;
    }
    return integer(0);
}

/* Comparisons of operands of one type (the typer made them agree). */
static dual compare(aj_expr_op op, aj_expr_type type, const dual *x)
{
    int c;

    if (type == AJ_EXPR_FLOAT) {
        const float a = x[0].v.f, b = x[1].v.f;
        switch (op) {
        case AJ_EXPR_LT: return boolean(a < b);
        case AJ_EXPR_LE: return boolean(a <= b);
        case AJ_EXPR_GT: return boolean(a > b);
        case AJ_EXPR_GE: return boolean(a >= b);
        case AJ_EXPR_EQ: return boolean(a == b);
        default:         return boolean(a != b);
        }
    }
    if (type == AJ_EXPR_INT)
        c = x[0].v.i < x[1].v.i ? -1 : x[0].v.i > x[1].v.i;
    else
        c = (int)x[0].v.b - (int)x[1].v.b;
    switch (op) {
    case AJ_EXPR_LT: return boolean(c < 0);
    case AJ_EXPR_LE: return boolean(c <= 0);
    case AJ_EXPR_GT: return boolean(c > 0);
    case AJ_EXPR_GE: return boolean(c >= 0);
    case AJ_EXPR_EQ: return boolean(c == 0);
    default:         return boolean(c != 0);
    }
}

static dual eval_node(const aj_expr *e, uint16_t id, const aj_expr_env *env)
{
    const aj_expr_node *n = &e->nodes[id];
    const int arity = aj_expr_arity(n);
    dual x[AJ_EXPR_RANK_MAX] = { { .d = 0.0 } };
    int64_t idx[AJ_EXPR_RANK_MAX];

    switch ((aj_expr_op)n->op) {
    case AJ_EXPR_LIT:
        if (n->type == AJ_EXPR_FLOAT)
            return num((float)n->u.f, 0.0);
        return n->type == AJ_EXPR_BOOL ? boolean(n->u.i != 0)
                                       : integer(n->u.i);
    case AJ_EXPR_VAR: {
        const int64_t vars[] = { env->b, env->h, env->q, env->k, env->sq,
                                 env->sk };
        if (n->u.var == AJ_VAR_SCORE)
            return (dual){ .v.f = (float)env->score, .d = env->grad_tensor ? 0.0 : 1.0,
                           .live = !env->grad_tensor };
        if (n->u.var == AJ_VAR_BIAS)
            return num((float)env->bias, 0.0);
        return integer(vars[n->u.var]);
    }
    case AJ_EXPR_SELECT:
        /* Only the picked arm is evaluated: no side effects either way. */
        return eval_node(e, n->args[eval_node(e, n->args[0], env).v.b ? 1 : 2],
                         env);
    default:
        break;
    }
    for (int i = 0; i < arity; i++)
        x[i] = eval_node(e, n->args[i], env);
    switch (aj_expr_ops[n->op].rule) {
    case AJ_RULE_LOAD: {
        for (int i = 0; i < arity; i++)
            idx[i] = x[i].v.i;
        dual r = { .v = load(env, n->u.tensor, idx, arity) };
        int64_t elem = n->u.tensor + 1 == env->grad_tensor ? element(env, n->u.tensor, idx, arity)
                                                            : -1;
        if (elem >= 0 && env->loaded && *env->nloaded < env->loaded_cap)
            env->loaded[(*env->nloaded)++] = elem;
        if (elem >= 0 && elem == env->grad_elem) {
            r.d = 1.0;
            r.live = true;
        }
        return r;
    }
    case AJ_RULE_CONVERT:
        return num((float)x[0].v.i, 0.0);
    case AJ_RULE_LOGIC:
        if (n->op == AJ_EXPR_NOT)
            return boolean(!x[0].v.b);
        return boolean(n->op == AJ_EXPR_AND ? x[0].v.b && x[1].v.b
                                            : x[0].v.b || x[1].v.b);
    case AJ_RULE_ORDER:
    case AJ_RULE_EQUAL:
        return compare((aj_expr_op)n->op,
                       (aj_expr_type)e->nodes[n->args[0]].type, x);
    default:
        break;
    }
    if (n->type != AJ_EXPR_FLOAT)
        return eval_int(n, x);
    /* The derivative of a tree that does not read the score is 0, even
     * where the chain rule's local factor is infinite (sqrt(w[9]) at 0):
     * the kernels' derivative (templates/score_prog.c) is 0 there by
     * construction. */
    dual r = eval_float(n, x);
    r.live = false;
    for (int i = 0; i < arity; i++)
        r.live = r.live || x[i].live;
    if (!r.live)
        r.d = 0.0;
    return r;
}
