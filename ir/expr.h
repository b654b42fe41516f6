/*
 * expr.h -- expressions of the op: `mask = expr(E)`, `score_mod = expr(E)`
 * and the side tensors they read (`tensors = (doc: i32[2])`).
 *
 * An op holds its expressions in one arena of nodes (aj_expr: a heap array
 * the op owns, so an op of a few nodes stays small; copying an op shares
 * the array until a setter replaces it, and aj_op_clone copies it).  Nodes
 * refer to their operands by small integer ids into that array; an operand's id
 * is always smaller than its user's, so the arena is a topologically sorted
 * forest and a walk from a root never loops.  The op keeps one root per
 * expression field (aj_mask_spec.root, aj_score_mod_spec.root).
 *
 *   mask = expr(doc[b, q] == doc[b, k] && k <= q)
 *
 *   id  op    type   args        value
 *    0  VAR   int                var = B
 *    1  VAR   int                var = Q
 *    2  LOAD  int    0 1         tensor = 0 (doc)
 *    3  VAR   int                var = B
 *    4  VAR   int                var = K
 *    5  LOAD  int    3 4         tensor = 0
 *    6  EQ    bool   2 5
 *    7  VAR   int                var = K
 *    8  VAR   int                var = Q
 *    9  LE    bool   7 8
 *   10  AND   bool   6 9                            <- mask root
 *
 * Every node is typed when it is made (aj_expr_add): bool, int (i64) or
 * float (f32).  Where an operator mixes int and float, the int operand is
 * wrapped in an explicit TO_FLOAT node, so a consumer never promotes on its
 * own: each operator's operands have exactly the types its row in
 * AJ_EXPR_OP_LIST says, given the node's own type.  Nodes whose operands
 * are all literals are folded into a literal as they are made, with the
 * evaluator's own arithmetic (a fold never makes a NaN or -0.0: such a node
 * is kept as written, so the printed form still says what it computes).
 *
 * Semantics (docs/ir.md, "Expressions"), the same on every target:
 *   - int is i64 with two's-complement wrap-around; `/` and `%` floor
 *     toward -inf (-7 / 2 == -4, -7 % 2 == 1); x / 0 == 0 and x % 0 == 0.
 *     & | ^ ~ act on the two's-complement bits; x << s is floor(x * 2^s)
 *     wrapped to i64 and x >> s is floor(x / 2^s), for every count s: a
 *     count of 64 or more shifts every bit out (x << 64 == 0, x >> 64 ==
 *     (x < 0 ? -1 : 0)) and a negative count shifts the other way
 *     (x << -s == x >> s).
 *   - pow(x, N) takes an int literal N with |N| <= AJ_EXPR_POW_MAX: x
 *     multiplied N times (1 / x^-N for N < 0; pow(x, 0) == 1).
 *   - float is f32: every float operation is rounded to f32 (the evaluator
 *     computes in double and rounds after each node).  A float literal
 *     keeps the double it was written as (for printing) and means its f32
 *     rounding.
 *   - a load whose index lies outside the tensor reads 0.
 */
#ifndef AJ_IR_EXPR_H
#define AJ_IR_EXPR_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "attnjit/attnjit.h"

/* Limits (docs/ir.md): nodes of both expressions of an op together (and
 * of a score program, derivative included), depth of one expression's
 * tree, nesting of its parentheses, prefix operators and argument lists
 * (the parser recurses on those, not on a chain of infix operators), side
 * tensors per op and the length of a tensor's name. */
#define AJ_EXPR_NODES_MAX 4096
#define AJ_EXPR_DEPTH_MAX 256
#define AJ_EXPR_NEST_MAX 256
#define AJ_EXPR_TENSORS_MAX AJ_OP_TENSORS_MAX
#define AJ_EXPR_NAME_MAX AJ_OP_TENSOR_NAME_MAX
#define AJ_EXPR_RANK_MAX 4
/* pow(x, N): the largest |N| */
#define AJ_EXPR_POW_MAX 64

/* No node: the root of a field that holds no expression. */
#define AJ_EXPR_NONE UINT16_MAX

typedef enum aj_expr_type {
    AJ_EXPR_BOOL = 0,
    AJ_EXPR_INT = 1,      /* i64 */
    AJ_EXPR_FLOAT = 2,    /* f32 */
    AJ_EXPR_TYPE_COUNT
} aj_expr_type;

/* How a node's type follows from its operands' (aj_expr_add). */
typedef enum aj_expr_rule {
    AJ_RULE_LEAF,      /* LIT, VAR: the type is given */
    AJ_RULE_LOAD,      /* int indices; the tensor's element type */
    AJ_RULE_CONVERT,   /* int -> float */
    AJ_RULE_ARITH,     /* numbers, promoted to one type; that type */
    AJ_RULE_INT,       /* ints; int */
    AJ_RULE_SAME,      /* one number; its type (neg, abs, floor) */
    AJ_RULE_MATH,      /* one number, promoted to float; float */
    AJ_RULE_ORDER,     /* numbers, promoted; bool */
    AJ_RULE_EQUAL,     /* numbers (promoted) or bools; bool */
    AJ_RULE_LOGIC,     /* bools; bool */
    AJ_RULE_SELECT,    /* bool, then numbers (promoted) or bools */
    AJ_RULE_POW,       /* a number promoted to float, an int literal; float */
} aj_expr_rule;

/* How the printer writes a node (and the parser reads it). */
typedef enum aj_expr_form {
    AJ_FORM_ATOM,      /* literal, variable, load */
    AJ_FORM_HIDDEN,    /* not written: prints its operand */
    AJ_FORM_PREFIX,    /* SPELLING operand */
    AJ_FORM_INFIX,     /* left SPELLING right, left-associative */
    AJ_FORM_CALL,      /* SPELLING(args) */
    AJ_FORM_SELECT,    /* c ? a : b, right-associative */
} aj_expr_form;

/*
 * Every operator: enum name, spelling, form, C precedence (higher binds
 * tighter; only infix, prefix and select use it), operand count (LOAD: the
 * tensor's rank, given per node), typing rule.  The precedences are C's:
 * prefix, multiplicative, additive, shifts, relational, equality, &, ^, |,
 * &&, ||, ?:.
 */
#define AJ_EXPR_OP_LIST(X)                                     \
    X(LIT,      "",      AJ_FORM_ATOM,   14, 0, AJ_RULE_LEAF)    \
    X(VAR,      "",      AJ_FORM_ATOM,   14, 0, AJ_RULE_LEAF)    \
    X(LOAD,     "",      AJ_FORM_ATOM,   14, 0, AJ_RULE_LOAD)    \
    X(TO_FLOAT, "",      AJ_FORM_HIDDEN, 14, 1, AJ_RULE_CONVERT) \
    X(NEG,      "-",     AJ_FORM_PREFIX, 13, 1, AJ_RULE_SAME)    \
    X(NOT,      "!",     AJ_FORM_PREFIX, 13, 1, AJ_RULE_LOGIC)   \
    X(BIT_NOT,  "~",     AJ_FORM_PREFIX, 13, 1, AJ_RULE_INT)     \
    X(MUL,      "*",     AJ_FORM_INFIX,  12, 2, AJ_RULE_ARITH)   \
    X(DIV,      "/",     AJ_FORM_INFIX,  12, 2, AJ_RULE_ARITH)   \
    X(MOD,      "%",     AJ_FORM_INFIX,  12, 2, AJ_RULE_INT)     \
    X(ADD,      "+",     AJ_FORM_INFIX,  11, 2, AJ_RULE_ARITH)   \
    X(SUB,      "-",     AJ_FORM_INFIX,  11, 2, AJ_RULE_ARITH)   \
    X(SHL,      "<<",    AJ_FORM_INFIX,  10, 2, AJ_RULE_INT)     \
    X(SHR,      ">>",    AJ_FORM_INFIX,  10, 2, AJ_RULE_INT)     \
    X(LT,       "<",     AJ_FORM_INFIX,   9, 2, AJ_RULE_ORDER)   \
    X(LE,       "<=",    AJ_FORM_INFIX,   9, 2, AJ_RULE_ORDER)   \
    X(GT,       ">",     AJ_FORM_INFIX,   9, 2, AJ_RULE_ORDER)   \
    X(GE,       ">=",    AJ_FORM_INFIX,   9, 2, AJ_RULE_ORDER)   \
    X(EQ,       "==",    AJ_FORM_INFIX,   8, 2, AJ_RULE_EQUAL)   \
    X(NE,       "!=",    AJ_FORM_INFIX,   8, 2, AJ_RULE_EQUAL)   \
    X(BIT_AND,  "&",     AJ_FORM_INFIX,   7, 2, AJ_RULE_INT)     \
    X(BIT_XOR,  "^",     AJ_FORM_INFIX,   6, 2, AJ_RULE_INT)     \
    X(BIT_OR,   "|",     AJ_FORM_INFIX,   5, 2, AJ_RULE_INT)     \
    X(AND,      "&&",    AJ_FORM_INFIX,   4, 2, AJ_RULE_LOGIC)   \
    X(OR,       "||",    AJ_FORM_INFIX,   3, 2, AJ_RULE_LOGIC)   \
    X(SELECT,   "?",     AJ_FORM_SELECT,  1, 3, AJ_RULE_SELECT)  \
    X(MIN,      "min",   AJ_FORM_CALL,   14, 2, AJ_RULE_ARITH)   \
    X(MAX,      "max",   AJ_FORM_CALL,   14, 2, AJ_RULE_ARITH)   \
    X(ABS,      "abs",   AJ_FORM_CALL,   14, 1, AJ_RULE_SAME)    \
    X(CLAMP,    "clamp", AJ_FORM_CALL,   14, 3, AJ_RULE_ARITH)   \
    X(EXP,      "exp",   AJ_FORM_CALL,   14, 1, AJ_RULE_MATH)    \
    X(LOG,      "log",   AJ_FORM_CALL,   14, 1, AJ_RULE_MATH)    \
    X(TANH,     "tanh",  AJ_FORM_CALL,   14, 1, AJ_RULE_MATH)    \
    X(SQRT,     "sqrt",  AJ_FORM_CALL,   14, 1, AJ_RULE_MATH)    \
    X(FLOOR,    "floor", AJ_FORM_CALL,   14, 1, AJ_RULE_SAME)    \
    X(EXP2,     "exp2",  AJ_FORM_CALL,   14, 1, AJ_RULE_MATH)    \
    X(LOG2,     "log2",  AJ_FORM_CALL,   14, 1, AJ_RULE_MATH)    \
    X(SIN,      "sin",   AJ_FORM_CALL,   14, 1, AJ_RULE_MATH)    \
    X(COS,      "cos",   AJ_FORM_CALL,   14, 1, AJ_RULE_MATH)    \
    X(TAN,      "tan",   AJ_FORM_CALL,   14, 1, AJ_RULE_MATH)    \
    X(SIGMOID,  "sigmoid", AJ_FORM_CALL, 14, 1, AJ_RULE_MATH)    \
    X(ERF,      "erf",   AJ_FORM_CALL,   14, 1, AJ_RULE_MATH)    \
    X(POW,      "pow",   AJ_FORM_CALL,   14, 2, AJ_RULE_POW)

typedef enum aj_expr_op {
#define AJ_EXPR_OP_ENUM(e, spelling, form, prec, arity, rule) AJ_EXPR_##e,
    AJ_EXPR_OP_LIST(AJ_EXPR_OP_ENUM)
#undef AJ_EXPR_OP_ENUM
    AJ_EXPR_OP_COUNT
} aj_expr_op;

typedef struct aj_expr_op_info {
    const char *spelling;
    aj_expr_form form;
    int prec;
    int arity;
    aj_expr_rule rule;
} aj_expr_op_info;

/* Indexed by aj_expr_op. */
extern const aj_expr_op_info aj_expr_ops[AJ_EXPR_OP_COUNT];

/* The variables, in the order of aj_expr_env's fields.  `bias` is the
 * op's bias term at the element (bias = add), a leaf of the score
 * programs only (docs/design.md "The score pipeline"): no text reads it. */
#define AJ_EXPR_VAR_LIST(X) \
    X(B, "b")               \
    X(H, "h")               \
    X(Q, "q")               \
    X(K, "k")               \
    X(SQ, "sq")             \
    X(SK, "sk")             \
    X(SCORE, "score")       \
    X(BIAS, "bias")

typedef enum aj_expr_var {
#define AJ_EXPR_VAR_ENUM(e, name) AJ_VAR_##e,
    AJ_EXPR_VAR_LIST(AJ_EXPR_VAR_ENUM)
#undef AJ_EXPR_VAR_ENUM
    AJ_VAR_COUNT
} aj_expr_var;

extern const char *const aj_expr_var_names[AJ_VAR_COUNT];
extern const char *const aj_expr_type_names[AJ_EXPR_TYPE_COUNT];
extern const char *const aj_side_dtype_names[AJ_SIDE_DTYPE_COUNT];

/*
 * One node.  `op` and `type` are aj_expr_op and aj_expr_type.  `args`
 * holds the operand ids (aj_expr_ops[op].arity of them; a LOAD has its
 * tensor's rank of them, one index each); unused slots are AJ_EXPR_NONE.  The payload
 * by op:
 *   LIT   type INT: i; FLOAT: f (the double as written or folded; its f32
 *         rounding is the value); BOOL: i is 0 or 1
 *   VAR   var (aj_expr_var)
 *   LOAD  tensor (index into the op's tensor declarations)
 */
typedef struct aj_expr_node {
    uint8_t op;
    uint8_t type;
    uint16_t args[AJ_EXPR_RANK_MAX];
    /* the depth of its tree as aj_expr_add made it (a leaf is 1, a
     * TO_FLOAT its operand's), so depth checks cost O(1) per node */
    uint16_t depth;
    union {
        int64_t i;
        double f;
        int32_t var;
        int32_t tensor;
    } u;
} aj_expr_node;

/* The arena: nodes[0 .. count-1] of a heap array of cap nodes (NULL
 * until the first node: a zeroed aj_expr is an empty arena).  While an
 * arena is built it holds AJ_EXPR_NODES_MAX slots, so node pointers stay
 * valid through aj_expr_add; aj_expr_compact gives back the rest when it
 * is done (the next add grows it back first).  `shared` marks an arena
 * whose nodes may be operands of several nodes (a score program,
 * templates/score_prog.c): a fold then never drops the nodes below it and
 * an int literal meeting a float is converted into a new node, not in
 * place.  The owner frees it with aj_expr_free. */
typedef struct aj_expr {
    aj_expr_node *nodes;
    uint16_t count, cap;
    bool shared;
} aj_expr;

/* Frees the nodes; e becomes an empty arena (shared kept). */
void aj_expr_free(aj_expr *e);
/* Shrinks the array to its count. */
void aj_expr_compact(aj_expr *e);
/* dst = a copy of src's nodes (compacted); false when out of memory
 * (dst then empty).  dst is not freed first. */
bool aj_expr_clone(aj_expr *dst, const aj_expr *src);

/* How many operands the node has (a LOAD: its indices). */
int aj_expr_arity(const aj_expr_node *n);

/* A side tensor's declaration, `NAME: DTYPE[RANK]`: the public
 * aj_side_decl (attnjit.h), which aj_op_info hands out. */
typedef aj_side_decl aj_tensor_decl;

/* The tensors an expression may read. */
typedef struct aj_expr_scope {
    const aj_tensor_decl *tensors;
    int count;
    bool score;        /* `score` is in scope (score_mod only) */
    bool bias;         /* `bias` is in scope (the score programs' own nodes) */
} aj_expr_scope;

/* ---------------------------------------------------------------- build */

/*
 * Appends a node `op` over operands args[0 .. n-1] (ids into e), typing it
 * by its rule: inserts TO_FLOAT where an int meets a float, folds it when
 * every operand is a literal.  For LIT give the type and payload in `leaf`
 * (args unused); for VAR leaf->u.var; for LOAD leaf->u.tensor (n must be
 * the tensor's rank).  Returns true with the new node's id in *out; false
 * with a sentence in msg on a type error, a bad operand count, or when the
 * arena or the depth limit is full.
 */
bool aj_expr_add(aj_expr *e, const aj_expr_scope *scope, aj_expr_op op,
                 const uint16_t *args, int n, const aj_expr_node *leaf,
                 uint16_t *out, char *msg, size_t cap);

/* Copies the tree at `root` of src to the end of dst; its new root in
 * *out.  False if dst has no room (or no memory). */
bool aj_expr_copy(aj_expr *dst, const aj_expr *src, uint16_t root,
                  uint16_t *out);
/* The same with every read of variable `var` as node `with` of dst (a
 * node made before the copy: operands keep smaller ids). */
bool aj_expr_copy_with(aj_expr *dst, const aj_expr *src, uint16_t root, aj_expr_var var,
                       uint16_t with, uint16_t *out);

/* Checks the tree at `root` the way the verifier must for an op poked into
 * by hand: ids in range and below their user's, ops, operand counts,
 * types as aj_expr_add would give them, tensors and `score` in scope, the
 * depth limit, and the result type `want` (bool for a mask, float for a
 * score_mod).  `what` names the field in messages. */
bool aj_expr_check(const aj_expr *e, uint16_t root, const aj_expr_scope *scope,
                   aj_expr_type want, const char *what, char *msg, size_t cap);

/* Depth of the tree at `root` (a leaf is 1), as recorded when it was
 * made (aj_expr_check recounts a tree it cannot trust). */
int aj_expr_depth(const aj_expr *e, uint16_t root);

/* Writes the canonical spelling of the tree at `root` (minimal parentheses
 * by precedence, numbers by aj_format_number) with `emit`.  Parsing it
 * gives back the same tree. */
void aj_expr_print(const aj_expr *e, uint16_t root,
                   const aj_tensor_decl *tensors,
                   void (*emit)(void *sink, const char *text), void *sink);

/* Why a side tensor may not be named `name` (len bytes), or NULL if it
 * may: a keyword (true false inf expr none), alibi's slopes
 * (alibi_slopes), a variable, a function, or a name from the kernel
 * parameter table (templates/params.def: every launch value and kernel
 * parameter, workspace and batch included) -- or a name whose sizes and
 * strides (NAME_size<d>, NAME_stride<d>, the kernel parameters a side
 * tensor adds) would be one of those. */
const char *aj_expr_name_reserved(const char *name, size_t len);
/* Whether side tensor b's name (blen bytes) is one of the size / stride
 * parameters side tensor a's adds (a_size0, a_stride1, ...). */
bool aj_expr_side_forms_clash(const char *a, size_t alen, const char *b, size_t blen);

/* ---------------------------------------------------------------- eval */

/* Side tensors are read as the public aj_side_tensor (attnjit.h) says:
 * element (i0, ..., iR-1) at data[sum i_d strides[d]], int32_t, float,
 * or a 16-bit float read as its f32 value, by dtype, 0 for an index
 * outside 0 .. shape[d]-1. */

/* A side dtype's name ("i32", ..., "?" out of range), and the bytes of
 * one element (4 or 2). */
const char *aj_side_dtype_name(aj_side_dtype dtype);
int aj_side_dtype_bytes(aj_side_dtype dtype);
/* Element `at` of float side tensor data (f32, f16, bf16) as its f32. */
float aj_side_float_at(const void *data, aj_side_dtype dtype, int64_t at);

/* The point an expression is evaluated at: the variables, and the side
 * tensors in declaration order (tensors[i] for declaration i). */
typedef struct aj_expr_env {
    int64_t b, h, q, k, sq, sk;
    double score;                  /* rounded to f32 when read */
    double bias;                   /* the op's bias term (f32 when read) */
    const aj_side_tensor *tensors;
    int tensor_count;
    /* aj_expr_eval_grad's variable: 0, the score; t + 1, element
     * grad_elem (row-major in its shape) of tensor t, a float tensor
     * (a side tensor's gradient).  With grad_tensor set and `loaded` not
     * NULL, every load of that tensor that falls inside it appends its
     * element to loaded[0 .. *nloaded) (up to loaded_cap of them). */
    int grad_tensor;
    int64_t grad_elem;
    int64_t *loaded;
    int loaded_cap, *nloaded;
} aj_expr_env;

/* A value of an expression: b, i or f by the node's type. */
typedef union aj_expr_scalar {
    bool b;
    int64_t i;
    float f;
} aj_expr_scalar;

/* The value of the tree at `root` at env. */
aj_expr_scalar aj_expr_eval(const aj_expr *e, uint16_t root,
                            const aj_expr_env *env);

/* A mask's value at env. */
bool aj_expr_eval_bool(const aj_expr *e, uint16_t root,
                       const aj_expr_env *env);

/* A numeric expression's value at env, as a double (an int result is
 * converted; a float result is the exact f32 value). */
double aj_expr_eval_f64(const aj_expr *e, uint16_t root,
                        const aj_expr_env *env);

/* A score_mod's value at env and, in *d_score, its derivative with
 * respect to `score` (or env's grad_tensor's element; forward mode: every node carries a dual number; int
 * and bool nodes and loads have derivative 0, a select, min, max or clamp
 * the derivative of the operand it picks, floor 0; a subtree that does
 * not read `score` has derivative 0 and adds no term to a product, even
 * where the chain rule's factor is infinite, as in sqrt(x) at x = 0: the
 * kernels' symbolic derivative, templates/score_prog.c, drops it).  The
 * derivative is computed in double from the f32 values. */
double aj_expr_eval_grad(const aj_expr *e, uint16_t root,
                         const aj_expr_env *env, double *d_score);

/* x << s as the IR defines it for every count s (floor(x * 2^s) wrapped
 * to i64; x >> s is x << -s, and 0 for s == INT64_MIN). */
int64_t aj_expr_shift(int64_t x, int64_t s);

/* ---------------------------------------------------------------- built-ins */

/*
 * The expression a built-in mask or score_mod of `op` equals, as text for
 * aj_op_set_mask_expr / aj_op_set_score_mod_expr ("" for none; false for an
 * expression field, which is its own text, or a too small buffer):
 *
 *   causal(top_left)           k <= q
 *   causal(bottom_right)       k <= q + (sk - sq)
 *   window(L, R)               q - L <= k && k <= q + R
 *   window(L, R, bottom_right) q + (sk - sq) - L <= k && k <= q + (sk - sq) + R
 *   softcap(C)                 C * tanh(score / C)
 *   alibi                      score - slopes[h] * abs(q - k)
 *
 * alibi reads its slopes from a side tensor `slopes: f32[1]` (its
 * alibi_slopes), which *needs_slopes says the caller must declare.
 */
bool aj_expr_builtin_text(const aj_op *op, bool score_mod, char *buf,
                          size_t cap, bool *needs_slopes);

#endif /* AJ_IR_EXPR_H */
