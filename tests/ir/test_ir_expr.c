/*
 * test_ir_expr.c -- expressions in the IR: `tensors`, `mask = expr(E)`,
 * `score_mod = expr(E)`: parse, canonical print, round trips, precedence,
 * typing and folding, limits, the verifier on poked ops, the builder, the
 * hash, and the interpreter (floor division, f32 rounding, loads out of
 * range, d/dscore).
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "ir/op.h"

#define HEAD "attention forward flash {\n  dtype = f32\n  head_dim = 64\n"

static aj_ctx *ctx;

/* HEAD + body + "}" parsed; NULL (with the error on ctx) on failure. */
static aj_op *parse_body(const char *body, aj_status *st)
{
    static char text[1 << 16];
    aj_op *op = NULL;

    snprintf(text, sizeof text, HEAD "%s}\n", body);
    *st = aj_op_parse(ctx, text, strlen(text), "t.aj", &op);
    return op;
}

/* The printed line of `field` in op's canonical text ("" if absent). */
static const char *field_line(const aj_op *op, const char *field)
{
    static char line[4096];
    char *text = NULL, key[64];
    const char *at, *end;

    line[0] = '\0';
    if (aj_op_print(op, &text) != AJ_OK)
        return line;
    snprintf(key, sizeof key, "\n  %s = ", field);
    if ((at = strstr(text, key)) != NULL) {
        at += strlen(key);
        end = strchr(at, '\n');
        snprintf(line, sizeof line, "%.*s", (int)(end - at), at);
    }
    aj_free(text);
    return line;
}

/* print -> parse -> print is a fixed point with one hash. */
static void check_fixed_point(const aj_op *op, const char *what)
{
    char *text1 = NULL, *text2 = NULL;
    char h1[AJ_HASH_HEX_LEN + 1] = "", h2[AJ_HASH_HEX_LEN + 1] = "";
    aj_op *again = NULL;

    CHECK(aj_op_print(op, &text1) == AJ_OK && aj_op_hash(op, h1) == AJ_OK);
    CHECK_STATUS(ctx, aj_op_parse(ctx, text1, strlen(text1), "canonical",
                                  &again), AJ_OK);
    if (again) {
        CHECK(aj_op_print(again, &text2) == AJ_OK &&
              aj_op_hash(again, h2) == AJ_OK);
        CHECK_MSG(text2 && strcmp(text1, text2) == 0 && strcmp(h1, h2) == 0,
                  "%s: not a fixed point:\n%s\n%s", what, text1,
                  text2 ? text2 : "");
    }
    aj_free(text1);
    aj_free(text2);
    aj_op_destroy(again);
}

/* The canonical spelling of a mask (score_mod false) or score_mod E. */
static void expect_print(const char *body, const char *field,
                         const char *want)
{
    aj_status st;
    aj_op *op = parse_body(body, &st);

    CHECK_MSG(st == AJ_OK, "%s: %s", body, aj_last_error(ctx));
    if (!op)
        return;
    CHECK_MSG(strcmp(field_line(op, field), want) == 0,
              "%s: printed %s, want %s", body, field_line(op, field), want);
    check_fixed_point(op, body);
    aj_op_destroy(op);
}

static void expect_error(const char *body, aj_status want, const char *msg)
{
    aj_status st;
    aj_op *op = parse_body(body, &st);

    CHECK_MSG(st == want && !op, "%s: status %s, want %s", body,
              aj_status_str(st), aj_status_str(want));
    CHECK_MSG(strcmp(aj_last_error(ctx), msg) == 0, "%s:\n got  %s\n want %s",
              body, aj_last_error(ctx), msg);
    aj_op_destroy(op);
}

/* ---------------------------------------------------------------- text */

static void test_print(void)
{
    /* the examples, as written */
    expect_print("  tensors = (doc: i32[2])\n"
                 "  mask = expr(doc[b, q] == doc[b, k] && k <= q)\n",
                 "mask", "expr(doc[b, q] == doc[b, k] && k <= q)");
    expect_print("  mask = expr(q / 128 == k / 128 && k <= q)\n", "mask",
                 "expr(q / 128 == k / 128 && k <= q)");
    expect_print("  tensors = (rel: f32[2])\n"
                 "  score_mod = expr(score + rel[h, clamp(q - k, -32, 32) + 32])\n",
                 "score_mod", "expr(score + rel[h, clamp(q - k, -32, 32) + 32])");
    /* the tensors field, in declaration order */
    expect_print("  tensors = (doc: i32[2], rel: f32[4])\n  mask = expr(true)\n",
                 "tensors", "(doc: i32[2], rel: f32[4])");
    /* minimal parentheses: only where precedence needs them */
    expect_print("  mask = expr(((k)) <= ((q) + (1)))\n", "mask", "expr(k <= q + 1)");
    expect_print("  mask = expr((k - q) - (k - q) < 3)\n", "mask",
                 "expr(k - q - (k - q) < 3)");
    expect_print("  mask = expr(k * (q + 1) > (k * q) + 1)\n", "mask",
                 "expr(k * (q + 1) > k * q + 1)");
    expect_print("  mask = expr(!(k < q) || (k == q && q > 0))\n", "mask",
                 "expr(!(k < q) || k == q && q > 0)");
    expect_print("  mask = expr((k < q || k > q) && q > 0)\n", "mask",
                 "expr((k < q || k > q) && q > 0)");
    expect_print("  mask = expr((q > 0 ? k < q : k > q) ? true : q % 2 == 1)\n",
                 "mask", "expr((q > 0 ? k < q : k > q) ? true : q % 2 == 1)");
    expect_print("  mask = expr(q > 0 ? k < q : q < 0 ? k > q : false)\n",
                 "mask", "expr(q > 0 ? k < q : q < 0 ? k > q : false)");
    expect_print("  score_mod = expr(-(score * 2.0) - -score)\n", "score_mod",
                 "expr(-(score * 2.0) - -score)");
    /* int operands of a float operator become floats: literals at once */
    expect_print("  score_mod = expr(score * 2 + q)\n", "score_mod",
                 "expr(score * 2.0 + q)");
    /* an int score_mod is made a float; its text does not change */
    expect_print("  score_mod = expr(q - k)\n", "score_mod", "expr(q - k)");
    /* constants fold, with floor division and modulo */
    expect_print("  mask = expr(k <= q + (1 + 2) * 3 - -7 / 2 + -7 % 2)\n",
                 "mask", "expr(k <= q + 9 - -4 + 1)");
    expect_print("  score_mod = expr(score + min(2, 3.5) * max(-1, abs(-2)) + inf)\n",
                 "score_mod", "expr(score + 4.0 + inf)");
    expect_print("  score_mod = expr(score * clamp(10, 0, 5) + floor(2.5) + floor(-7))\n",
                 "score_mod", "expr(score * 5.0 + 2.0 + -7.0)");
    expect_print("  score_mod = expr(score - -inf)\n", "score_mod",
                 "expr(score - -inf)");
    /* NaN and -0.0 are not folded: the text keeps saying how they arise */
    expect_print("  score_mod = expr(score + (inf - inf) + -0.0)\n", "score_mod",
                 "expr(score + (inf - inf) + -0.0)");
    expect_print("  score_mod = expr(score + log(-1.0) * 0.1)\n", "score_mod",
                 "expr(score + log(-1.0) * 0.1)");
    /* the i64 extremes */
    expect_print("  mask = expr(k <= q + 9223372036854775807)\n", "mask",
                 "expr(k <= q + 9223372036854775807)");
    expect_print("  mask = expr(k <= q + (-9223372036854775807 - 1))\n", "mask",
                 "expr(k <= q + (-9223372036854775807 - 1))");
    expect_print("  mask = expr(k <= q + (9223372036854775807 + 1))\n", "mask",
                 "expr(k <= q + (-9223372036854775807 - 1))");
    /* numbers: one spelling */
    expect_print("  score_mod = expr(score * 1e-5 + 2.50 + .5e1)\n", "score_mod",
                 "expr(score * 1e-05 + 2.5 + 5.0)");
    /* bit operators at C's precedence: shifts between + and <, then & ^ |
     * between == and && */
    expect_print("  mask = expr(((q >> 2) + 1) == (k >> (q + 1)))\n", "mask",
                 "expr((q >> 2) + 1 == k >> q + 1)");
    expect_print("  mask = expr(((q & 7) | (k ^ 1)) == ((q | k) & ~k))\n", "mask",
                 "expr((q & 7 | k ^ 1) == ((q | k) & ~k))");
    expect_print("  mask = expr((q & (k ^ (q | 1))) < 3 == true && (q << k) >= 0)\n", "mask",
                 "expr((q & (k ^ (q | 1))) < 3 == true && q << k >= 0)");
    /* ... and fold, with every shift count defined */
    expect_print("  mask = expr(k <= q + (1 << 3) + (-8 >> 1) + (1 << 64) + (-1 >> 100) + "
                 "(5 << -1) + ~0 + (6 & 3) + (6 | 3) + (6 ^ 3))\n", "mask",
                 "expr(k <= q + 8 + -4 + 0 + -1 + 2 + -1 + 2 + 7 + 5)");
    /* the functions; pow folds as the evaluator multiplies */
    expect_print("  score_mod = expr(sin(score) + cos(score) * tan(score) - sigmoid(score) + "
                 "exp2(score) / log2(score) + erf(score) + pow(score, -2) + pow(2.0, 3))\n",
                 "score_mod", "expr(sin(score) + cos(score) * tan(score) - sigmoid(score) + "
                 "exp2(score) / log2(score) + erf(score) + pow(score, -2) + 8.0)");
    /* the built-in forms keep their text */
    expect_print("  mask = causal(bottom_right)\n  score_mod = alibi\n", "mask",
                 "causal(bottom_right)");
    /* comments and line breaks inside an expression */
    expect_print("  mask = expr(k <= q # the diagonal\n    && k >= q - 4)\n", "mask",
                 "expr(k <= q && k >= q - 4)");
    /* a field order with the expressions before the tensors */
    expect_print("  score_mod = expr(score + w[h])\n  mask = expr(d[q] == d[k])\n"
                 "  tensors = (d: i32[1], w: f32[1])\n", "score_mod",
                 "expr(score + w[h])");
}

static void test_hash(void)
{
    const char *bodies[] = {
        "",
        "  mask = expr(k <= q)\n",
        "  mask = expr(k < q)\n",
        "  mask = expr(k <= q + 1)\n",
        "  tensors = (d: i32[1])\n  mask = expr(k <= q)\n",
        "  tensors = (d: f32[1])\n  mask = expr(k <= q)\n",
        "  score_mod = expr(score * 2.0)\n",
        "  score_mod = expr(score * 3.0)\n",
        "  mask = causal(top_left)\n",
    };
    char hashes[sizeof bodies / sizeof bodies[0]][AJ_HASH_HEX_LEN + 1];
    const size_t n = sizeof bodies / sizeof bodies[0];

    for (size_t i = 0; i < n; i++) {
        aj_status st;
        aj_op *op = parse_body(bodies[i], &st);
        hashes[i][0] = '\0';
        CHECK(op && aj_op_hash(op, hashes[i]) == AJ_OK);
        aj_op_destroy(op);
    }
    for (size_t i = 0; i < n; i++)
        for (size_t j = i + 1; j < n; j++)
            CHECK_MSG(strcmp(hashes[i], hashes[j]) != 0, "'%s' and '%s' hash "
                      "alike", bodies[i], bodies[j]);
    /* spelling does not matter, only the tree */
    {
        aj_status st;
        aj_op *a = parse_body("  mask = expr((k) <= q + (0 + 1))\n", &st);
        aj_op *b = parse_body("  mask = expr(k<=q+1)\n", &st);
        char ha[AJ_HASH_HEX_LEN + 1] = "a", hb[AJ_HASH_HEX_LEN + 1] = "b";
        CHECK(a && b && aj_op_hash(a, ha) == AJ_OK && aj_op_hash(b, hb) == AJ_OK);
        CHECK(strcmp(ha, hb) == 0);
        aj_op_destroy(a);
        aj_op_destroy(b);
    }
}

static void test_errors(void)
{
    /* syntax */
    expect_error("  mask = expr(k <= )\n", AJ_ERR_PARSE,
                 "t.aj:4:20: expected an expression, found ')'");
    expect_error("  mask = expr(k q)\n", AJ_ERR_PARSE,
                 "t.aj:4:17: expected an operator or ')', found 'q'");
    expect_error("  mask = expr(k <= q\n}", AJ_ERR_PARSE,
                 "t.aj:5:1: expected ')' to close the 'expr(' at 4:14, found '}'");
    expect_error("  mask = expr\n", AJ_ERR_PARSE,
                 "t.aj:5:1: expected '(' after 'expr', found '}'");
    expect_error("  mask = expr((k <= q)\n", AJ_ERR_PARSE,
                 "t.aj:5:1: expected ')' to close the 'expr(' at 4:14, found '}'");
    expect_error("  mask = expr(k = q)\n", AJ_ERR_PARSE,
                 "t.aj:4:17: expected an operator or ')', found '='");
    expect_error("  mask = expr(k $ q)\n", AJ_ERR_PARSE,
                 "t.aj:4:17: unexpected character '$'");
    /* bit operators take ints; C's precedence puts == above & */
    expect_error("  mask = expr(k & q)\n", AJ_ERR_VERIFY,
                 "t.aj:4:15: the mask expression must be a bool, got int");
    expect_error("  mask = expr(k & 1 == 1)\n", AJ_ERR_VERIFY,
                 "t.aj:4:17: '&' needs ints, got bool");
    expect_error("  score_mod = expr(score << 1)\n", AJ_ERR_VERIFY,
                 "t.aj:4:26: '<<' needs ints, got float");
    expect_error("  mask = expr(~(k < q))\n", AJ_ERR_VERIFY,
                 "t.aj:4:15: '~' needs ints, got bool");
    /* pow: an int literal exponent within 64 */
    expect_error("  score_mod = expr(pow(score, 1.5))\n", AJ_ERR_VERIFY,
                 "t.aj:4:20: 'pow' takes a number and an int exponent, got float and float");
    expect_error("  score_mod = expr(pow(score, q))\n", AJ_ERR_VERIFY,
                 "t.aj:4:20: the exponent of 'pow' must be an int literal from -64 to 64 "
                 "(write exp(y * log(x)) for others)");
    expect_error("  score_mod = expr(pow(score, 65))\n", AJ_ERR_VERIFY,
                 "t.aj:4:20: the exponent of 'pow' must be an int literal from -64 to 64 "
                 "(write exp(y * log(x)) for others)");
    expect_error("  mask = expr(q > 0 ? k < q)\n", AJ_ERR_PARSE,
                 "t.aj:4:28: expected ':' after the '?' arm, found ')'");
    expect_error("  mask = expr(min(k, q) == 1.5x)\n", AJ_ERR_PARSE,
                 "t.aj:4:28: malformed number '1.5x'");
    expect_error("  mask = expr(k <= q + 9223372036854775808)\n", AJ_ERR_PARSE,
                 "t.aj:4:24: integer '9223372036854775808' is too large "
                 "(at most 9223372036854775807)");
    /* names */
    expect_error("  mask = expr(j <= q)\n", AJ_ERR_PARSE,
                 "t.aj:4:15: unknown name 'j' (variables: b, h, q, k, sq, sk, score)");
    expect_error("  mask = expr(foo(q) > 0)\n", AJ_ERR_PARSE,
                 "t.aj:4:15: unknown function 'foo' (functions: min, max, abs, "
                 "clamp, exp, log, tanh, sqrt, floor, exp2, log2, sin, cos, tan, "
                 "sigmoid, erf, pow)");
    expect_error("  mask = expr(doc[b, q] > 0)\n", AJ_ERR_PARSE,
                 "t.aj:4:15: unknown tensor 'doc' (declare it in 'tensors')");
    expect_error("  tensors = (doc: i32[2])\n  mask = expr(doc > 0)\n", AJ_ERR_PARSE,
                 "t.aj:5:15: tensor 'doc' is read with indices: doc[...]");
    expect_error("  mask = expr(score > 0.0)\n", AJ_ERR_VERIFY,
                 "t.aj:4:15: 'score' is only defined in a score_mod");
    /* arity */
    expect_error("  mask = expr(min(k, q, 1) > 0)\n", AJ_ERR_VERIFY,
                 "t.aj:4:15: 'min' takes 2 arguments, got 3");
    expect_error("  mask = expr(abs(k, q) > 0)\n", AJ_ERR_VERIFY,
                 "t.aj:4:15: 'abs' takes 1 argument, got 2");
    expect_error("  tensors = (doc: i32[2])\n  mask = expr(doc[b] > 0)\n", AJ_ERR_VERIFY,
                 "t.aj:5:15: tensor 'doc' has rank 2, read with 1 index");
    expect_error("  tensors = (doc: i32[2])\n  mask = expr(doc[b, q, k, h, h] > 0)\n",
                 AJ_ERR_VERIFY, "t.aj:5:15: tensor 'doc' has rank 2, read with 5 indices");
    /* types, at the operator */
    expect_error("  mask = expr(k <= q &&\n    q + 1)\n", AJ_ERR_VERIFY,
                 "t.aj:4:22: '&&' needs bools, got int");
    expect_error("  mask = expr(k + (q < 1) > 0)\n", AJ_ERR_VERIFY,
                 "t.aj:4:17: '+' needs numbers, got bool");
    expect_error("  mask = expr(-(k < q))\n", AJ_ERR_VERIFY,
                 "t.aj:4:15: unary '-' needs numbers, got bool");
    expect_error("  mask = expr(!k)\n", AJ_ERR_VERIFY,
                 "t.aj:4:15: '!' needs bools, got int");
    expect_error("  mask = expr(k % 2.0 == 0)\n", AJ_ERR_VERIFY,
                 "t.aj:4:17: '%' needs ints, got float");
    expect_error("  mask = expr((k < q) == 1)\n", AJ_ERR_VERIFY,
                 "t.aj:4:23: '==' needs two numbers or two bools, got bool and int");
    expect_error("  mask = expr(q ? k < q : true)\n", AJ_ERR_VERIFY,
                 "t.aj:4:17: the condition of '?' must be a bool, got int");
    expect_error("  mask = expr(q > 0 ? k : true)\n", AJ_ERR_VERIFY,
                 "t.aj:4:21: '? :' needs two numbers or two bools, got int and bool");
    expect_error("  tensors = (w: f32[1])\n  mask = expr(w[0.5] > 0.0)\n", AJ_ERR_VERIFY,
                 "t.aj:5:15: index 1 of 'w' must be an int, got float");
    expect_error("  mask = expr(exp(true) > 0.0)\n", AJ_ERR_VERIFY,
                 "t.aj:4:15: 'exp' needs numbers, got bool");
    /* the field's type */
    expect_error("  mask = expr(q - k)\n", AJ_ERR_VERIFY,
                 "t.aj:4:15: the mask expression must be a bool, got int");
    expect_error("  score_mod = expr(score > 0.0)\n", AJ_ERR_VERIFY,
                 "t.aj:4:20: the score_mod expression must be a number, got bool");
    expect_error("  score_mod = expr(score * 1e39)\n", AJ_ERR_VERIFY,
                 "t.aj:4:28: number '1e39' is out of f32 range");
    /* tensors */
    expect_error("  tensors = (q: i32[1])\n", AJ_ERR_VERIFY,
                 "t.aj:4:3: tensor name 'q' is reserved (a kernel parameter or launch "
                 "tensor)");
    expect_error("  tensors = (alibi_slopes: f32[1])\n", AJ_ERR_VERIFY,
                 "t.aj:4:3: tensor name 'alibi_slopes' is reserved (alibi's side "
                 "tensor)");
    expect_error("  tensors = (clamp: f32[1])\n", AJ_ERR_VERIFY,
                 "t.aj:4:3: tensor name 'clamp' is reserved (a function)");
    expect_error("  tensors = (sq: f32[1])\n", AJ_ERR_VERIFY,
                 "t.aj:4:3: tensor name 'sq' is reserved (a variable)");
    expect_error("  tensors = (inf: f32[1])\n", AJ_ERR_VERIFY,
                 "t.aj:4:3: tensor name 'inf' is reserved (a keyword)");
    expect_error("  tensors = (rel: f32[2], rel_stride1: f32[1])\n", AJ_ERR_VERIFY,
                 "t.aj:4:3: tensors 'rel' and 'rel_stride1' clash: a side tensor's sizes "
                 "and strides are kernel parameters NAME_size<d> and NAME_stride<d>");
    expect_error("  tensors = (rel_size0: f32[2], rel: f32[1])\n", AJ_ERR_VERIFY,
                 "t.aj:4:3: tensors 'rel_size0' and 'rel' clash: a side tensor's sizes "
                 "and strides are kernel parameters NAME_size<d> and NAME_stride<d>");
    expect_error("  tensors = (d: i32[1], d: f32[2])\n", AJ_ERR_VERIFY,
                 "t.aj:4:3: tensor 'd' is declared twice");
    expect_error("  tensors = (d: i32[5])\n", AJ_ERR_VERIFY,
                 "t.aj:4:3: tensor 'd' has rank 5, out of range (want 1..4)");
    expect_error("  tensors = (d: i32[0])\n  mask = expr(d[q] == 0)\n", AJ_ERR_VERIFY,
                 "t.aj:4:3: tensor 'd' has rank 0, out of range (want 1..4)");
    expect_error("  tensors = (d: i64[1])\n", AJ_ERR_PARSE,
                 "t.aj:4:17: expected a tensor dtype (i32, f32, f16 or bf16), found 'i64'");
    expect_error("  tensors = (d i32[1])\n", AJ_ERR_PARSE,
                 "t.aj:4:16: expected ':' after the tensor name, found 'i32'");
    expect_error("  tensors = (a: i32[1], b1: i32[1], c: i32[1], d: i32[1], "
                 "e: i32[1], f: i32[1], g: i32[1], i: i32[1], j: i32[1])\n",
                 AJ_ERR_VERIFY, "t.aj:4:103: more than 8 tensors");
    expect_error("  tensors = (abcdefghijabcdefghijabcdefghijab: i32[1])\n",
                 AJ_ERR_VERIFY, "t.aj:4:14: tensor name "
                 "'abcdefghijabcdefghijabcdefghijab' is longer than 31 characters");
    /* merge ops take none of it */
    {
        const char *text = "attention merge {\n  dtype = f32\n  head_dim_v = 64\n"
                           "  tensors = (d: i32[1])\n}\n";
        aj_op *op = NULL;
        CHECK_STATUS(ctx, aj_op_parse(ctx, text, strlen(text), "t.aj", &op),
                     AJ_ERR_VERIFY);
        CHECK_ERROR(ctx, "t.aj:4:3: tensors does not apply to merge ops");
    }
}

/* "(A + B)" over `leaves` loads d[q]: a tree of depth log2(leaves) + 2. */
static size_t balanced_sum(char *buf, size_t cap, int leaves)
{
    size_t n;

    if (leaves == 1)
        return (size_t)snprintf(buf, cap, "d[q]");
    n = (size_t)snprintf(buf, cap, "(");
    n += balanced_sum(buf + n, cap - n, leaves / 2);
    n += (size_t)snprintf(buf + n, cap - n, " + ");
    n += balanced_sum(buf + n, cap - n, leaves - leaves / 2);
    n += (size_t)snprintf(buf + n, cap - n, ")");
    return n;
}

/* "  mask = expr(((k <= q)))" with `levels` parentheses (expr's own one
 * included). */
static void nested_mask(char *body, size_t cap, int levels)
{
    size_t n = (size_t)snprintf(body, cap, "  mask = expr");

    for (int i = 0; i < levels; i++)
        body[n++] = '(';
    n += (size_t)snprintf(body + n, cap - n, "k <= q");
    for (int i = 0; i < levels; i++)
        body[n++] = ')';
    snprintf(body + n, cap - n, "\n");
}

/* Nesting, depth, node count: stated limits, checked with their messages. */
static void test_limits(void)
{
    static char body[1 << 15];
    size_t n = 0;
    aj_status st;
    aj_op *op;

    /* 256 levels of parentheses inside expr( ) pass, 257 do not */
    nested_mask(body, sizeof body, 1 + AJ_EXPR_NEST_MAX);
    op = parse_body(body, &st);
    CHECK_MSG(st == AJ_OK, "%s", aj_last_error(ctx));
    aj_op_destroy(op);
    nested_mask(body, sizeof body, 1 + AJ_EXPR_NEST_MAX + 1);
    expect_error(body, AJ_ERR_VERIFY,
                 "t.aj:4:271: the expression nests deeper than 256 levels");

    /* a left-deep chain: its tree is deep without any parentheses; k, 254
     * additions and the comparison make depth 256, one more addition puts
     * the comparison (its '>' at column 16 + 4 * 255 + 1) at 257 */
    for (int adds = 254; adds <= 255; adds++) {
        n = (size_t)snprintf(body, sizeof body, "  mask = expr(k");
        for (int i = 0; i < adds; i++)
            n += (size_t)snprintf(body + n, sizeof body - n, " + q");
        snprintf(body + n, sizeof body - n, " > 0)\n");
        op = parse_body(body, &st);
        CHECK_MSG(adds == 254 ? st == AJ_OK
                              : st == AJ_ERR_VERIFY &&
                                    strcmp(aj_last_error(ctx), "t.aj:4:1037: the expression "
                                           "nests deeper than 256 levels") == 0,
                  "%d additions: %s", adds, aj_last_error(ctx));
        aj_op_destroy(op);
    }

    /* nodes: a balanced sum of L loads d[q] (2 nodes each) and its L - 1
     * additions: 3071 for 1024 loads fit, 6143 for 2048 do not */
    for (int leaves = 1024; leaves <= 2048; leaves *= 2) {
        n = (size_t)snprintf(body, sizeof body, "  tensors = (d: i32[1])\n  mask = expr(");
        n += balanced_sum(body + n, sizeof body - n, leaves);
        snprintf(body + n, sizeof body - n, " > 0)\n");
        op = parse_body(body, &st);
        CHECK_MSG(leaves == 1024 ? st == AJ_OK
                                 : st == AJ_ERR_VERIFY &&
                                       strstr(aj_last_error(ctx), "the op's expressions "
                                              "have more than 4096 nodes") != NULL,
                  "%d loads: %s", leaves, aj_last_error(ctx));
        aj_op_destroy(op);
    }
}

/* ---------------------------------------------------------------- builder */

static void test_builder(void)
{
    aj_op *op = NULL, *parsed;
    aj_status st;
    char *a = NULL, *b = NULL;

    CHECK(aj_op_create(ctx, AJ_KIND_FORWARD, AJ_VARIANT_FLASH, &op) == AJ_OK);
    CHECK(aj_op_declare_tensor(op, "doc", AJ_SIDE_I32, 2) == AJ_OK);
    CHECK(aj_op_declare_tensor(op, "rel", AJ_SIDE_F32, 2) == AJ_OK);
    CHECK_STATUS(ctx, aj_op_set_mask_expr(op, "doc[b, q] == doc[b, k] && k <= q"), AJ_OK);
    CHECK_STATUS(ctx, aj_op_set_score_mod_expr(op, "score + rel[h, clamp(q - k, -32, 32) + 32]"),
                 AJ_OK);
    /* replacing an expression leaves no nodes behind */
    for (int i = 0; i < 200; i++)
        CHECK(aj_op_set_mask_expr(op, "doc[b, q] == doc[b, k] && k <= q") == AJ_OK);
    CHECK(aj_op_set_mask_causal(op, AJ_ALIGN_TOP_LEFT) == AJ_OK);
    CHECK(aj_op_set_mask_expr(op, "doc[b, q] == doc[b, k] && k <= q") == AJ_OK);
    CHECK(op->expr.count < 30);
    CHECK_STATUS(ctx, aj_op_verify(op), AJ_OK);
    CHECK(strcmp(field_line(op, "score_mod"),
                 "expr(score + rel[h, clamp(q - k, -32, 32) + 32])") == 0);
    parsed = parse_body("  tensors = (doc: i32[2], rel: f32[2])\n"
                        "  mask = expr(doc[b, q] == doc[b, k] && k <= q)\n"
                        "  score_mod = expr(score + rel[h, clamp(q - k, -32, 32) + 32])\n",
                        &st);
    CHECK(parsed && aj_op_print(op, &a) == AJ_OK && aj_op_print(parsed, &b) == AJ_OK);
    CHECK(a && b && strcmp(a, b) == 0);
    aj_free(a);
    aj_free(b);
    aj_op_destroy(parsed);
    check_fixed_point(op, "built");

    /* errors name the column within the text; the op is unchanged */
    CHECK_STATUS(ctx, aj_op_set_mask_expr(op, "k <= q &&\n  d[q] > 0"), AJ_ERR_PARSE);
    CHECK_ERROR(ctx, "aj_op_set_mask_expr: 2:3: unknown tensor 'd' (declare it in 'tensors')");
    CHECK(strcmp(field_line(op, "mask"), "expr(doc[b, q] == doc[b, k] && k <= q)") == 0);
    /* the first error stays: sticky */
    CHECK_STATUS(ctx, aj_op_set_score_mod_expr(op, "score + true"), AJ_ERR_VERIFY);
    CHECK_ERROR(ctx, "aj_op_set_score_mod_expr: 1:7: '+' needs numbers, got bool");
    CHECK_STATUS(ctx, aj_op_verify(op), AJ_ERR_PARSE);
    CHECK_ERROR(ctx, "aj_op_set_mask_expr: 2:3: unknown tensor 'd'");
    aj_op_destroy(op);

    /* setters on a fresh op */
    const struct {
        aj_kind kind;
        bool score_mod;
        const char *text;
        aj_status st;
        const char *msg;
    } sets[] = {
        { AJ_KIND_FORWARD, false, NULL, AJ_ERR_INVALID_ARG,
          "aj_op_set_mask_expr: text is NULL" },
        { AJ_KIND_FORWARD, false, "score > 0.0", AJ_ERR_VERIFY,
          "aj_op_set_mask_expr: 1:1: 'score' is only defined in a score_mod" },
        { AJ_KIND_FORWARD, true, "q < k", AJ_ERR_VERIFY, "aj_op_set_score_mod_expr: 1:1: "
          "the score_mod expression must be a number, got bool" },
        { AJ_KIND_FORWARD, false, "k <= q)", AJ_ERR_PARSE, "aj_op_set_mask_expr: 1:7: "
          "expected an operator or the end of the expression, found ')'" },
        { AJ_KIND_MERGE, false, "k <= q", AJ_ERR_VERIFY, "aj_op_set_mask_expr: mask does "
          "not apply to merge ops (merge takes only dtype, head_dim_v and target)" },
        { AJ_KIND_MERGE, true, "score", AJ_ERR_VERIFY, "aj_op_set_score_mod_expr: "
          "score_mod does not apply to merge ops (merge takes only dtype, head_dim_v and "
          "target)" },
    };
    for (size_t i = 0; i < sizeof sets / sizeof sets[0]; i++) {
        CHECK(aj_op_create(ctx, sets[i].kind, sets[i].kind == AJ_KIND_MERGE
                               ? AJ_VARIANT_NONE : AJ_VARIANT_FLASH, &op) == AJ_OK);
        CHECK_STATUS(ctx, sets[i].score_mod ? aj_op_set_score_mod_expr(op, sets[i].text)
                                            : aj_op_set_mask_expr(op, sets[i].text),
                     sets[i].st);
        CHECK_MSG(strcmp(aj_last_error(ctx), sets[i].msg) == 0, "set %zu: %s", i,
                  aj_last_error(ctx));
        aj_op_destroy(op);
    }

    /* declarations */
    const struct {
        const char *name;
        aj_side_dtype dtype;
        int32_t rank;
        aj_status st;
        const char *msg;
    } decls[] = {
        { NULL, AJ_SIDE_I32, 1, AJ_ERR_INVALID_ARG, "aj_op_declare_tensor: name is NULL" },
        { "k", AJ_SIDE_I32, 1, AJ_ERR_INVALID_ARG, "aj_op_declare_tensor: tensor name 'k' is "
          "reserved (a kernel parameter or launch tensor)" },
        { "2d", AJ_SIDE_I32, 1, AJ_ERR_INVALID_ARG, "aj_op_declare_tensor: tensor name '2d' is "
          "not an identifier of 1..31 characters" },
        { "", AJ_SIDE_I32, 1, AJ_ERR_INVALID_ARG, "aj_op_declare_tensor: tensor name '' is "
          "not an identifier of 1..31 characters" },
        { "d", (aj_side_dtype)7, 1, AJ_ERR_INVALID_ARG, "aj_op_declare_tensor: tensor 'd' "
          "has dtype 7, out of range (want i32, f32, f16 or bf16)" },
        { "d", AJ_SIDE_F32, 0, AJ_ERR_INVALID_ARG, "aj_op_declare_tensor: tensor 'd' has "
          "rank 0, out of range (want 1..4)" },
        { "abcdefghijabcdefghijabcdefghijab", AJ_SIDE_F32, 1, AJ_ERR_INVALID_ARG,
          "aj_op_declare_tensor: tensor name 'abcdefghijabcdefghijabcdefghijab...' is longer "
          "than 31 characters" },
    };
    for (size_t i = 0; i < sizeof decls / sizeof decls[0]; i++) {
        CHECK(aj_op_create(ctx, AJ_KIND_FORWARD, AJ_VARIANT_FLASH, &op) == AJ_OK);
        CHECK_STATUS(ctx, aj_op_declare_tensor(op, decls[i].name, decls[i].dtype,
                                               decls[i].rank), decls[i].st);
        CHECK_MSG(strcmp(aj_last_error(ctx), decls[i].msg) == 0, "decl %zu: %s", i,
                  aj_last_error(ctx));
        CHECK(op->tensor_count == 0);
        aj_op_destroy(op);
    }
    CHECK(aj_op_create(ctx, AJ_KIND_FORWARD, AJ_VARIANT_FLASH, &op) == AJ_OK);
    for (int i = 0; i < AJ_OP_TENSORS_MAX; i++) {
        char name[8];
        snprintf(name, sizeof name, "t%d", i);
        CHECK(aj_op_declare_tensor(op, name, AJ_SIDE_F32, 1) == AJ_OK);
    }
    CHECK_STATUS(ctx, aj_op_declare_tensor(op, "t8", AJ_SIDE_F32, 1), AJ_ERR_VERIFY);
    CHECK_ERROR(ctx, "aj_op_declare_tensor: more than 8 tensors");
    aj_op_destroy(op);
    CHECK(aj_op_create(ctx, AJ_KIND_FORWARD, AJ_VARIANT_FLASH, &op) == AJ_OK);
    CHECK(aj_op_declare_tensor(op, "d", AJ_SIDE_F32, 1) == AJ_OK);
    CHECK_STATUS(ctx, aj_op_declare_tensor(op, "d", AJ_SIDE_I32, 1), AJ_ERR_INVALID_ARG);
    CHECK_ERROR(ctx, "aj_op_declare_tensor: tensor 'd' is declared twice");
    aj_op_destroy(op);

    CHECK(aj_op_create(ctx, AJ_KIND_MERGE, AJ_VARIANT_NONE, &op) == AJ_OK);
    CHECK_STATUS(ctx, aj_op_declare_tensor(op, "d", AJ_SIDE_I32, 1), AJ_ERR_VERIFY);
    CHECK_ERROR(ctx, "aj_op_declare_tensor: tensors does not apply to merge ops");
    aj_op_destroy(op);
    CHECK_STATUS(ctx, aj_op_set_mask_expr(NULL, "k <= q"), AJ_ERR_INVALID_ARG);
}

/* The verifier re-checks an arena poked into by hand. */
static void test_verifier(void)
{
    aj_op *op = NULL;
    aj_field field = AJ_FIELD_HEADER;
    char msg[256];

    CHECK(aj_op_create(ctx, AJ_KIND_FORWARD, AJ_VARIANT_FLASH, &op) == AJ_OK);
    CHECK(aj_op_declare_tensor(op, "d", AJ_SIDE_I32, 1) == AJ_OK);
    CHECK(aj_op_set_mask_expr(op, "d[q] <= k") == AJ_OK);
    CHECK(aj_op_check(op, &field, msg, sizeof msg) == AJ_OK);
    /* nodes: 0 q, 1 d[q], 2 k, 3 <= */
    op->expr.nodes[3].type = AJ_EXPR_INT;
    CHECK(aj_op_check(op, &field, msg, sizeof msg) == AJ_ERR_VERIFY && field == AJ_FIELD_MASK);
    CHECK_MSG(strcmp(msg, "the mask expression: node 3 is typed int, want bool") == 0, "%s", msg);
    op->expr.nodes[3].type = AJ_EXPR_BOOL;
    op->expr.nodes[3].args[0] = 3;
    CHECK(aj_op_check(op, &field, msg, sizeof msg) == AJ_ERR_VERIFY);
    CHECK_MSG(strcmp(msg, "the mask expression: node 3 is out of order (want below 3)")
              == 0, "%s", msg);
    op->expr.nodes[3].args[0] = 1;
    op->expr.nodes[1].u.tensor = 1;
    CHECK(aj_op_check(op, &field, msg, sizeof msg) == AJ_ERR_VERIFY);
    CHECK_MSG(strcmp(msg, "the mask expression: node 1 has a bad variable, tensor or literal")
              == 0, "%s", msg);
    op->expr.nodes[1].u.tensor = 0;
    op->tensors[0].rank = 2;
    CHECK(aj_op_check(op, &field, msg, sizeof msg) == AJ_ERR_VERIFY);
    CHECK_MSG(strcmp(msg, "the mask expression: node 1 loads 'd' with 1 indices, want 2")
              == 0, "%s", msg);
    op->tensors[0].rank = 1;
    op->expr.nodes[2].u.var = AJ_VAR_SCORE;
    op->expr.nodes[2].type = AJ_EXPR_FLOAT;
    CHECK(aj_op_check(op, &field, msg, sizeof msg) == AJ_ERR_VERIFY);
    CHECK_MSG(strcmp(msg, "the mask expression: 'score' is only defined in a score_mod")
              == 0, "%s", msg);
    op->expr.nodes[2].u.var = AJ_VAR_K;
    op->expr.nodes[2].type = AJ_EXPR_INT;
    op->mask.root = 2;
    CHECK(aj_op_check(op, &field, msg, sizeof msg) == AJ_ERR_VERIFY);
    CHECK_MSG(strcmp(msg, "the mask expression must be a bool, got int") == 0, "%s", msg);
    op->mask.root = 3;
    CHECK(aj_op_check(op, &field, msg, sizeof msg) == AJ_OK);
    aj_op_destroy(op);
}

/* ---------------------------------------------------------------- eval */

/* The value of score_mod E at (b, h, q, k) = (0, 1, 5, 2), score 0.5, with
 * w = [10, 20, 30] and d = [[1, 2], [3, 4]]. */
static double eval_at(const char *e, double *grad)
{
    static const float w[] = { 10, 20, 30 };
    static const int32_t d[] = { 1, 2, 3, 4 };
    const aj_side_tensor tensors[] = {
        { "w", w, AJ_SIDE_F32, 1, { 3 }, { 1 } },
        { "d", d, AJ_SIDE_I32, 2, { 2, 2 }, { 2, 1 } },
    };
    const aj_expr_env env = { .b = 0, .h = 1, .q = 5, .k = 2, .sq = 8, .sk = 9,
                              .score = 0.5, .tensors = tensors, .tensor_count = 2 };
    aj_op *op = NULL;
    double v = NAN;

    CHECK(aj_op_create(ctx, AJ_KIND_FORWARD, AJ_VARIANT_FLASH, &op) == AJ_OK);
    CHECK(aj_op_declare_tensor(op, "w", AJ_SIDE_F32, 1) == AJ_OK &&
          aj_op_declare_tensor(op, "d", AJ_SIDE_I32, 2) == AJ_OK);
    CHECK_STATUS(ctx, aj_op_set_score_mod_expr(op, e), AJ_OK);
    if (op->score_mod.kind == AJ_SCORE_MOD_EXPR)
        v = aj_expr_eval_grad(&op->expr, op->score_mod.root, &env, grad);
    aj_op_destroy(op);
    return v;
}

static void expect_value(const char *e, double want, double want_grad)
{
    double grad = NAN, v = eval_at(e, &grad);

    CHECK_MSG(v == want && grad == want_grad, "%s = %.17g (d %.17g), want %.17g (d %.17g)",
              e, v, grad, want, want_grad);
}

static void test_eval(void)
{
    /* floor division and modulo of negatives; by 0 gives 0 (q = 5, k = 2) */
    expect_value("(k - q) / 2", -2, 0);         /* -3 / 2 */
    expect_value("(k - q) % 2", 1, 0);          /* -3 % 2 */
    expect_value("(q - k) / -2", -2, 0);        /*  3 / -2 */
    expect_value("(q - k) % -2", -1, 0);        /*  3 % -2 */
    expect_value("(k - q) / -3", 1, 0);
    expect_value("(k - q) % -3", 0, 0);
    expect_value("q / (k - 2)", 0, 0);
    expect_value("q % (k - 2)", 0, 0);
    /* variables */
    expect_value("b * 1000 + h * 100 + q * 10 + k", 152, 0);
    expect_value("sk * 10 + sq", 98, 0);
    /* loads; out of range reads 0 */
    expect_value("w[h] + d[1, 0]", 23, 0);
    expect_value("w[q] + w[-1] + d[2, 0] + d[0, -1] + d[0, 2]", 0, 0);
    /* f32: rounded after every operation */
    expect_value("score + 16777216 * (q - 4)", 16777216.0, 1.0);
    expect_value("score * 0.1", (double)(0.5f * 0.1f), 0.1f);
    expect_value("tanh(score)", (double)(float)tanh(0.5), 1 - (double)(float)tanh(0.5) *
                                                           (float)tanh(0.5));
    /* derivatives with respect to score */
    expect_value("score * score * 4.0", 1.0, 4.0);
    expect_value("exp(score * 2.0)", (double)(float)exp(1.0), 2 * (double)(float)exp(1.0));
    expect_value("q > k ? 3.0 * score : score", 1.5, 3.0);
    expect_value("max(score, 0.25) + min(score, 0.25)", 0.75, 1.0);
    expect_value("clamp(score, 0.0, 0.25)", 0.25, 0.0);
    expect_value("abs(-score) + floor(score)", 0.5, 1.0);
    expect_value("1.0 / score", 2.0, -4.0);
    expect_value("sqrt(score * 8.0)", 2.0, 2.0);
    expect_value("log(score * 2.0)", 0.0, 2.0);
    expect_value("score - w[h] * abs(q - k)", 0.5 - 60, 1.0);
    /* a subtree without the score adds nothing, even at a singular point
     * (w[q] reads 0): no 0 / 0, no 0 * inf */
    expect_value("score + sqrt(w[q])", 0.5, 1.0);
    expect_value("score + log(w[q] * 0.0)", -INFINITY, 1.0);
    expect_value("score * log(w[q] * 0.0) + score", -INFINITY, -INFINITY);
    expect_value("score * 2.0 + score / (w[q] * 0.0)", INFINITY, INFINITY);
    /* min / max ignore a NaN operand (IEEE minNum / maxNum) */
    expect_value("min(sqrt(-score), 1.5)", 1.5, 0.0);
    /* the functions and their derivatives, in double from the f32 value */
    expect_value("sin(score)", (double)(float)sin(0.5), cos(0.5));
    expect_value("cos(score * 2.0)", (double)(float)cos(1.0), -2 * sin(1.0));
    expect_value("tan(score)", (double)(float)tan(0.5),
                 1 + (double)(float)tan(0.5) * (float)tan(0.5));
    expect_value("sigmoid(score)", (double)(float)(1 / (1 + exp(-0.5))),
                 (double)(float)(1 / (1 + exp(-0.5))) * (1 - (double)(float)(1 / (1 + exp(-0.5)))));
    expect_value("exp2(score)", (double)(float)sqrt(2.0), (double)(float)sqrt(2.0) * log(2.0));
    expect_value("log2(score)", -1.0, 1 / (0.5 * log(2.0)));
    expect_value("erf(score)", (double)(float)erf(0.5), 2 / sqrt(acos(-1.0)) * exp(-0.25));
    expect_value("pow(score, 3)", 0.125, 0.75);
    expect_value("pow(score, -2)", 4.0, -16.0);
    expect_value("pow(score, 0)", 1.0, 0.0);
    expect_value("pow(w[q] * 0.0, 0)", 1.0, 0.0);
    /* shifts by every count: floor(x 2^s), the other way for s < 0 */
    expect_value("q << 2", 20, 0);
    expect_value("q << 61", (double)(int64_t)(UINT64_C(5) << 61), 0);   /* wraps to 2^61 */
    expect_value("q << 64", 0, 0);
    expect_value("(k - q) >> 1", -2, 0);        /* floor(-3 / 2) */
    expect_value("(k - q) >> 64", -1, 0);
    expect_value("(k - q) >> (-9223372036854775807 - 1)", 0, 0);
    expect_value("(k - q) << (-9223372036854775807 - 1)", -1, 0);
    expect_value("q >> -2", 20, 0);
    expect_value("(q ^ k) | (q & ~k)", 7, 0);
    /* && || ! ? with ints underneath */
    expect_value("(q > k && !(k == 2) || q == 5) ? 1 : 0", 1, 0);
}

int main(void)
{
    if (aj_ctx_create(NULL, &ctx) != AJ_OK)
        return 1;
    test_print();
    test_hash();
    test_errors();
    test_limits();
    test_builder();
    test_verifier();
    test_eval();
    aj_ctx_destroy(ctx);
    return check_report();
}
