/*
 * parse.c -- the text form of an op (docs/ir.md has the grammar).
 *
 * A hand-written lexer feeds a recursive-descent parser one token at a
 * time.  Every token carries its 1-based line and byte column, and the
 * parser remembers where each field was written, so a rule the verifier
 * finds broken after the whole spec is read is still reported where the
 * user wrote the field.
 *
 *   text --lexer--> tokens --parser--> aj_op --aj_op_check--> verified op
 *
 * `len` is authoritative: the text need not be NUL-terminated and is never
 * read past text[len - 1].
 */
#include "ir/op.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Far above any real spec; keeps line and column counts in an int. */
#define AJ_SPEC_MAX ((size_t)1 << 20)
/* Longest number lexeme accepted; 17 significant digits need far less. */
#define AJ_NUMBER_LEXEME_MAX 64

typedef struct aj_pos {
    int line, col;
} aj_pos;

typedef enum tok_kind {
    TOK_END,       /* end of input */
    TOK_IDENT,     /* [A-Za-z_][A-Za-z0-9_]* */
    TOK_NUMBER,    /* a lexeme the NUMBER grammar accepts */
    TOK_LBRACE, TOK_RBRACE, TOK_LPAREN, TOK_RPAREN, TOK_EQUALS, TOK_COMMA,
    TOK_LBRACKET, TOK_RBRACKET, TOK_COLON,
    TOK_PLUS,      /* outside an expression: softcap(C) + alibi */
    TOK_QUESTION,  /* in an expression only */
    TOK_OP,        /* in an expression only: an operator of aj_expr_ops */
} tok_kind;

typedef struct token {
    tok_kind kind;
    const char *text;
    size_t len;
    aj_pos pos;
} token;

/* Where the lexer stands: enough to come back to a place in the text. */
typedef struct lex_state {
    size_t at;                 /* the lexer's cursor: src[at] ... */
    aj_pos cur;                /* ... and its position */
    token tok;                 /* the current (lookahead) token */
    bool in_expr;              /* '+' and '-' are operators, not signs */
} lex_state;

/* An `expr(E)` seen in the body and parsed after it, once every tensor is
 * declared, wherever the `tensors` field was written. */
typedef struct deferred_expr {
    bool set;
    lex_state start;           /* at E's first token */
} deferred_expr;

typedef struct parser {
    aj_ctx *ctx;               /* NULL: messages go to msg_out as "L:C: ..." */
    char *msg_out;
    size_t msg_cap;
    const char *name;          /* for messages: "name:LINE:COL: ..." */
    const char *src;
    size_t len;
    lex_state lx;
    aj_op *op;
    deferred_expr deferred[2]; /* [0] mask, [1] score_mod */
    token sinks;               /* sinks = NAME, resolved with the expressions */
    token alibi;               /* score_mod = alibi(NAME), likewise */
    int depth;                 /* of the expression being parsed */
    aj_pos header;             /* where 'attention' was written */
    aj_pos open, close;        /* the body's braces */
    aj_pos field_at[AJ_FIELD_COUNT];
    bool seen[AJ_FIELD_COUNT];
} parser;

static aj_status parse_spec(parser *p);
static aj_status parse_header(parser *p);
static aj_status parse_body(parser *p);
static aj_status parse_field(parser *p);
static aj_status parse_value(parser *p, aj_field field);
static aj_status check_required(parser *p);
static aj_status parse_deferred(parser *p);
static aj_status verify(parser *p);
static aj_status next(parser *p);
static aj_status fail_at(parser *p, aj_status st, aj_pos pos,
                         const char *fmt, ...) AJ_PRINTF(4, 5);
static const char *describe(const token *t, char *buf, size_t cap);
static aj_pos pos_of(const char *src, size_t offset);

aj_status aj_op_parse(aj_ctx *ctx, const char *text, size_t len,
                      const char *name, aj_op **out)
{
    parser p;
    const char *nul;
    aj_status st;

    AJ_CHECK_ARG(NULL, ctx, "aj_op_parse: ctx is NULL");
    AJ_CHECK_ARG(ctx, text, "aj_op_parse: text is NULL");
    AJ_CHECK_ARG(ctx, out, "aj_op_parse: out is NULL");
    memset(&p, 0, sizeof p);
    p.ctx = ctx;
    p.name = name ? name : "<input>";
    p.src = text;
    p.len = len;
    p.lx.cur = (aj_pos){ 1, 1 };

    if (len > AJ_SPEC_MAX)
        return aj_fail(ctx, AJ_ERR_PARSE,
                       "%s: input is %zu bytes; a spec may be at most %zu",
                       p.name, len, AJ_SPEC_MAX);
    /* Checked up front so that no later step meets a NUL. */
    if ((nul = memchr(text, '\0', len)) != NULL)
        return fail_at(&p, AJ_ERR_PARSE, pos_of(text, (size_t)(nul - text)),
                       "NUL byte in the input");

    st = parse_spec(&p);
    if (st != AJ_OK) {
        aj_op_destroy(p.op);
        return st;
    }
    aj_expr_compact(&p.op->expr);
    *out = p.op;
    return AJ_OK;
}

/* spec = header "{" { field } "}" END, then the required fields and the
 * verifier. */
static aj_status parse_spec(parser *p)
{
    aj_status st = AJ_OK;

    AJ_TRY(next(p));
    AJ_TRY(parse_header(p));
    AJ_TRY(parse_body(p));
    AJ_TRY(check_required(p));
    if (p->lx.tok.kind != TOK_END) {
        char buf[64];
        return fail_at(p, AJ_ERR_PARSE, p->lx.tok.pos,
                       "unexpected %s after the closing '}' (a spec holds "
                       "one op)", describe(&p->lx.tok, buf, sizeof buf));
    }
    AJ_TRY(parse_deferred(p));
    AJ_TRY(verify(p));
done:
    return st;
}

/* ---------------------------------------------------------------- tokens */

/* How a token reads in "found X": its text, quoted and cut short. */
static const char *describe(const token *t, char *buf, size_t cap)
{
    if (t->kind == TOK_END)
        return "end of input";
    if (t->len > 40)
        snprintf(buf, cap, "'%.40s...'", t->text);
    else
        snprintf(buf, cap, "'%.*s'", (int)t->len, t->text);
    return buf;
}

static bool is_word(const token *t, const char *word)
{
    return t->kind == TOK_IDENT && strlen(word) == t->len &&
           memcmp(t->text, word, t->len) == 0;
}

/* "expected WHAT, found X" at the current token. */
static aj_status expected(parser *p, const char *what)
{
    char buf[64];

    return fail_at(p, AJ_ERR_PARSE, p->lx.tok.pos, "expected %s, found %s", what,
                   describe(&p->lx.tok, buf, sizeof buf));
}

static const char *punct_text(tok_kind kind)
{
    switch (kind) {
    case TOK_LBRACE: return "'{'";
    case TOK_RBRACE: return "'}'";
    case TOK_LPAREN: return "'('";
    case TOK_RPAREN: return "')'";
    case TOK_EQUALS: return "'='";
    case TOK_COMMA:  return "','";
    case TOK_LBRACKET: return "'['";
    case TOK_RBRACKET: return "']'";
    case TOK_COLON:  return "':'";
    case TOK_PLUS:   return "'+'";
    case TOK_QUESTION: return "'?'";
    case TOK_END:
    case TOK_IDENT:
    case TOK_NUMBER:
    case TOK_OP:     break;
    }
    return "?";
}

/* Consumes a punctuation token of `kind`; `after` says what it follows. */
static aj_status expect(parser *p, tok_kind kind, const char *after)
{
    char buf[64];

    if (p->lx.tok.kind == kind)
        return next(p);
    return fail_at(p, AJ_ERR_PARSE, p->lx.tok.pos, "expected %s after %s, "
                   "found %s", punct_text(kind), after,
                   describe(&p->lx.tok, buf, sizeof buf));
}

/* ---------------------------------------------------------------- header */

/* "a, b or c" from a name table. */
static const char *name_list(const char *const *names, int count, char *buf,
                             size_t cap)
{
    size_t len = 0;

    buf[0] = '\0';
    for (int i = 0; i < count; i++) {
        const char *sep = i == 0 ? "" : i == count - 1 ? " or " : ", ";
        len += (size_t)snprintf(buf + len, cap - len, "%s%s", sep, names[i]);
        if (len >= cap)
            break;
    }
    return buf;
}

/* The current token as one of `names`; else "expected WHAT (FORMS)" with
 * FORMS listing the names when `forms` is NULL. */
static aj_status parse_choice(parser *p, const char *const *names, int count,
                              const char *what, const char *forms, int *out)
{
    char list[160], msg[256];

    for (int i = 0; i < count; i++) {
        if (is_word(&p->lx.tok, names[i])) {
            *out = i;
            return next(p);
        }
    }
    snprintf(msg, sizeof msg, "%s (%s)", what,
             forms ? forms : name_list(names, count, list, sizeof list));
    return expected(p, msg);
}

/* header = "attention" KIND [VARIANT] "{"; merge has no variant, forward
 * and backward need one. */
static aj_status parse_header(parser *p)
{
    char buf[64];
    int kind = 0, variant = AJ_VARIANT_NONE;
    aj_status st = AJ_OK;

    if (p->lx.tok.kind == TOK_END)
        return fail_at(p, AJ_ERR_PARSE, p->lx.tok.pos,
                       "empty spec: expected 'attention KIND VARIANT {'");
    if (!is_word(&p->lx.tok, "attention"))
        return expected(p, "'attention' to start the spec");
    p->header = p->lx.tok.pos;
    AJ_TRY(next(p));
    AJ_TRY(parse_choice(p, aj_kind_names, AJ_KIND_COUNT, "an op kind", NULL,
                        &kind));
    if (kind == AJ_KIND_MERGE && (is_word(&p->lx.tok, "flash") ||
                                  is_word(&p->lx.tok, "efficient")))
        return fail_at(p, AJ_ERR_PARSE, p->lx.tok.pos,
                       "merge ops take no variant, found %s",
                       describe(&p->lx.tok, buf, sizeof buf));
    if (kind != AJ_KIND_MERGE) {
        /* Skip "none": it is the merge's variant and never written. */
        AJ_TRY(parse_choice(p, aj_variant_names + 1, AJ_VARIANT_COUNT - 1,
                            "a variant", NULL, &variant));
        variant += 1;
    }
    p->open = p->lx.tok.pos;
    AJ_TRY(expect(p, TOK_LBRACE, "the header"));
    AJ_TRY(aj_op_create(p->ctx, (aj_kind)kind, (aj_variant)variant, &p->op));
done:
    return st;
}

/* ---------------------------------------------------------------- body */

static aj_status parse_body(parser *p)
{
    char buf[64];
    aj_status st = AJ_OK;

    for (;;) {
        if (p->lx.tok.kind == TOK_RBRACE) {
            p->close = p->lx.tok.pos;
            return next(p);
        }
        if (p->lx.tok.kind == TOK_END)
            return fail_at(p, AJ_ERR_PARSE, p->lx.tok.pos,
                           "expected '}' to close the '{' at %d:%d, found "
                           "end of input", p->open.line, p->open.col);
        if (p->lx.tok.kind != TOK_IDENT)
            return fail_at(p, AJ_ERR_PARSE, p->lx.tok.pos,
                           "expected a field name or '}', found %s",
                           describe(&p->lx.tok, buf, sizeof buf));
        AJ_TRY(parse_field(p));
    }
done:
    return st;
}

/* field = NAME "=" value; each field at most once. */
static aj_status parse_field(parser *p)
{
    const bool merge = p->op->kind == AJ_KIND_MERGE;
    token name = p->lx.tok;
    char buf[64], list[256], msg[256];
    aj_field field = AJ_FIELD_COUNT;
    int n = 0;
    const char *names[AJ_FIELD_COUNT];
    aj_status st = AJ_OK;

    for (int f = AJ_FIELD_HEADER + 1; f < AJ_FIELD_COUNT; f++) {
        if (is_word(&name, aj_field_names[f]))
            field = (aj_field)f;
        if (!merge || aj_field_in_merge((aj_field)f))
            names[n++] = aj_field_names[f];
    }
    if (field == AJ_FIELD_COUNT)
        return fail_at(p, AJ_ERR_PARSE, name.pos,
                       "unknown field %s (expected one of %s)",
                       describe(&name, buf, sizeof buf),
                       name_list(names, n, list, sizeof list));
    if (p->seen[field])
        return fail_at(p, AJ_ERR_PARSE, name.pos,
                       "duplicate field '%s' (first set at %d:%d)",
                       aj_field_names[field], p->field_at[field].line,
                       p->field_at[field].col);
    if (merge && !aj_field_in_merge(field)) {
        aj_merge_misfit_msg(field, msg, sizeof msg);
        return fail_at(p, AJ_ERR_VERIFY, name.pos, "%s", msg);
    }
    p->seen[field] = true;
    p->field_at[field] = name.pos;
    AJ_TRY(next(p));
    snprintf(msg, sizeof msg, "'%s'", aj_field_names[field]);
    AJ_TRY(expect(p, TOK_EQUALS, msg));
    AJ_TRY(parse_value(p, field));
done:
    return st;
}

/* ---------------------------------------------------------------- values */

static aj_status parse_int(parser *p, int64_t max, int64_t *out);
static aj_status parse_number(parser *p, double *out);
static aj_status parse_head_dim(parser *p, aj_field field, int32_t *out);
static aj_status parse_tensors(parser *p);
static aj_status defer_expr(parser *p, deferred_expr *d);
static aj_status parse_mask(parser *p, aj_mask_spec *mask);
static aj_status parse_score_mod(parser *p, aj_score_mod_spec *mod);
static aj_status parse_scale(parser *p, double *scale);
static aj_status parse_schedule(parser *p, aj_schedule *schedule, int32_t *splits,
                               int32_t *warpgroups, int32_t *producer);

static const char *const bool_names[] = { "false", "true" };

static aj_status parse_value(parser *p, aj_field field)
{
    aj_op *op = p->op;
    int v = 0;
    aj_status st = AJ_OK;

    switch (field) {
    case AJ_FIELD_DTYPE:
        /* the f8 dtypes are the inputs' only (q_dtype, kv_dtype) */
        AJ_TRY(parse_choice(p, aj_dtype_names, AJ_DTYPE_F8E4M3, "a dtype",
                            NULL, &v));
        op->dtype = (aj_dtype)v;
        break;
    case AJ_FIELD_HEAD_DIM:
        AJ_TRY(parse_head_dim(p, field, &op->head_dim));
        break;
    case AJ_FIELD_HEAD_DIM_V:
        AJ_TRY(parse_head_dim(p, field, &op->head_dim_v));
        break;
    case AJ_FIELD_TENSORS:
        AJ_TRY(parse_tensors(p));
        break;
    case AJ_FIELD_MASK:
        AJ_TRY(parse_mask(p, &op->mask));
        break;
    case AJ_FIELD_SCORE_MOD:
        AJ_TRY(parse_score_mod(p, &op->score_mod));
        break;
    case AJ_FIELD_SINKS:
        if (p->lx.tok.kind != TOK_IDENT)
            return expected(p, "a tensor name or none");
        p->sinks = p->lx.tok;
        AJ_TRY(next(p));
        break;
    case AJ_FIELD_SCALE:
        AJ_TRY(parse_scale(p, &op->scale));
        break;
    case AJ_FIELD_DROPOUT:
        AJ_TRY(parse_number(p, &op->dropout));
        break;
    case AJ_FIELD_BIAS:
        AJ_TRY(parse_choice(p, aj_bias_names, AJ_BIAS_COUNT, "a bias", NULL,
                            &v));
        op->bias = (aj_bias)v;
        break;
    case AJ_FIELD_LAYOUT:
        AJ_TRY(parse_choice(p, aj_layout_names, AJ_LAYOUT_COUNT, "a layout",
                            NULL, &v));
        op->layout = (aj_layout)v;
        break;
    case AJ_FIELD_Q_DTYPE:
        AJ_TRY(parse_choice(p, aj_dtype_names, AJ_DTYPE_COUNT, "a query dtype",
                            NULL, &v));
        op->q_dtype = (aj_dtype)v;
        op->q_dtype_set = true;
        break;
    case AJ_FIELD_KV_DTYPE:
        AJ_TRY(parse_choice(p, aj_dtype_names, AJ_DTYPE_COUNT, "a KV dtype",
                            NULL, &v));
        op->kv_dtype = (aj_dtype)v;
        op->kv_dtype_set = true;
        break;
    case AJ_FIELD_Q_LAYOUT:
        /* paged is a KV layout, not a query one */
        AJ_TRY(parse_choice(p, aj_layout_names, AJ_LAYOUT_PAGED, "a query layout",
                            NULL, &v));
        op->q_layout = (aj_layout)v;
        break;
    case AJ_FIELD_KV_SHARED:
        AJ_TRY(parse_choice(p, bool_names, 2, "a boolean", NULL, &v));
        op->kv_shared = v;
        break;
    case AJ_FIELD_ACCUMULATE:
        AJ_TRY(parse_choice(p, bool_names, 2, "a boolean", NULL, &v));
        op->accumulate = v;
        break;
    case AJ_FIELD_DETERMINISTIC:
        AJ_TRY(parse_choice(p, bool_names, 2, "a boolean", NULL, &v));
        op->deterministic = v;
        break;
    case AJ_FIELD_SCHEDULE:
        AJ_TRY(parse_schedule(p, &op->schedule, &op->splits, &op->warpgroups, &op->producer));
        break;
    case AJ_FIELD_TARGET:
        AJ_TRY(parse_choice(p, aj_target_names, AJ_TARGET_COUNT, "a target",
                            NULL, &v));
        op->target = (aj_target)v;
        break;
    case AJ_FIELD_HEADER:
    case AJ_FIELD_COUNT:
        st = fail_at(p, AJ_ERR_INTERNAL, p->lx.tok.pos, "no value for field %d",
                     (int)field);
        break;
    }
done:
    return st;
}

/* Head dims are range-checked as they are read, not left to the verifier:
 * inside the op, head_dim_v 0 means "not written", so a written 0 would
 * otherwise pass unnoticed.  The message is the verifier's, at the field. */
static aj_status parse_head_dim(parser *p, aj_field field, int32_t *out)
{
    char msg[256];
    int64_t v;
    aj_status st = AJ_OK;

    AJ_TRY(parse_int(p, INT32_MAX, &v));
    if (!aj_head_dim_ok(aj_field_names[field], v, msg, sizeof msg))
        return fail_at(p, AJ_ERR_VERIFY, p->field_at[field], "%s", msg);
    *out = (int32_t)v;
done:
    return st;
}

/* tensors = "(" NAME ":" DTYPE "[" RANK "]" ["grad"] { "," ... } ")".  The rules
 * on names and ranks are the verifier's; here only what the op can hold. */
static aj_status parse_tensors(parser *p)
{
    aj_op *op = p->op;
    aj_status st = AJ_OK;

    AJ_TRY(expect(p, TOK_LPAREN, "'tensors ='"));
    for (;;) {
        aj_tensor_decl *t = &op->tensors[op->tensor_count];
        token name = p->lx.tok;
        int64_t rank;
        int dtype = 0;

        if (name.kind != TOK_IDENT)
            return expected(p, "a tensor name");
        if (op->tensor_count == AJ_OP_TENSORS_MAX)
            return fail_at(p, AJ_ERR_VERIFY, name.pos, "more than %d tensors",
                           AJ_OP_TENSORS_MAX);
        if (name.len > AJ_OP_TENSOR_NAME_MAX)
            return fail_at(p, AJ_ERR_VERIFY, name.pos,
                           "tensor name '%.*s' is longer than %d characters",
                           (int)name.len, name.text, AJ_OP_TENSOR_NAME_MAX);
        memcpy(t->name, name.text, name.len);
        t->name[name.len] = '\0';
        AJ_TRY(next(p));
        AJ_TRY(expect(p, TOK_COLON, "the tensor name"));
        AJ_TRY(parse_choice(p, aj_side_dtype_names, AJ_SIDE_DTYPE_COUNT,
                            "a tensor dtype", NULL, &dtype));
        AJ_TRY(expect(p, TOK_LBRACKET, "the tensor dtype"));
        AJ_TRY(parse_int(p, INT32_MAX, &rank));
        AJ_TRY(expect(p, TOK_RBRACKET, "the tensor rank"));
        t->dtype = (aj_side_dtype)dtype;
        t->rank = (int32_t)rank;
        if (p->lx.tok.kind == TOK_IDENT && p->lx.tok.len == 4 &&
            memcmp(p->lx.tok.text, "grad", 4) == 0) {
            op->tensor_grad |= 1u << op->tensor_count;
            AJ_TRY(next(p));
        }
        op->tensor_count++;
        if (p->lx.tok.kind == TOK_RPAREN)
            return next(p);
        if (p->lx.tok.kind != TOK_COMMA)
            return expected(p, "'grad', ',' or ')' in the tensors");
        AJ_TRY(next(p));
    }
done:
    return st;
}

/* "(" E ")" after 'expr': E is skipped (its tokens lexed, its parentheses
 * matched) and parsed by parse_deferred once the body is read. */
static aj_status defer_expr(parser *p, deferred_expr *d)
{
    aj_pos open = p->lx.tok.pos;
    int depth = 1;
    char buf[64];
    aj_status st = AJ_OK;

    if (p->lx.tok.kind != TOK_LPAREN)
        return expected(p, "'(' after 'expr'");
    p->lx.in_expr = true;
    AJ_TRY(next(p));
    d->set = true;
    d->start = p->lx;
    for (;;) {
        if (p->lx.tok.kind == TOK_END || p->lx.tok.kind == TOK_RBRACE)
            return fail_at(p, AJ_ERR_PARSE, p->lx.tok.pos,
                           "expected ')' to close the 'expr(' at %d:%d, "
                           "found %s", open.line, open.col,
                           describe(&p->lx.tok, buf, sizeof buf));
        if (p->lx.tok.kind == TOK_LPAREN)
            depth++;
        if (p->lx.tok.kind == TOK_RPAREN && --depth == 0) {
            p->lx.in_expr = false;
            return next(p);
        }
        AJ_TRY(next(p));
    }
done:
    return st;
}

/* mask = none | causal(ALIGN) | window(LEFT, RIGHT [, ALIGN]) | expr(E) */
static aj_status parse_mask(parser *p, aj_mask_spec *mask)
{
    static const char *const forms =
        "none, causal(top_left), causal(bottom_right), window(LEFT, RIGHT), "
        "window(LEFT, RIGHT, bottom_right) or expr(E)";
    aj_pos at = p->lx.tok.pos;
    int kind = 0, align = AJ_ALIGN_TOP_LEFT;
    aj_status st = AJ_OK;

    AJ_TRY(parse_choice(p, aj_mask_names, AJ_MASK_COUNT, "a mask", forms,
                        &kind));
    *mask = (aj_mask_spec){ .kind = (aj_mask_kind)kind, .root = AJ_EXPR_NONE };
    if (kind == AJ_MASK_NONE)
        return AJ_OK;
    if (kind == AJ_MASK_EXPR)
        return defer_expr(p, &p->deferred[0]);
    /* Frameworks disagree on where a plain causal mask's diagonal sits when
     * Sq != Sk, so the text form makes the user say which one. */
    if (kind == AJ_MASK_CAUSAL && p->lx.tok.kind != TOK_LPAREN)
        return fail_at(p, AJ_ERR_PARSE, at,
                       "bare 'causal' is ambiguous: write causal(top_left) "
                       "(PyTorch is_causal) or causal(bottom_right) "
                       "(FlashAttention)");
    AJ_TRY(expect(p, TOK_LPAREN, kind == AJ_MASK_CAUSAL ? "'causal'"
                                                        : "'window'"));
    if (kind == AJ_MASK_WINDOW) {
        AJ_TRY(parse_int(p, INT64_MAX, &mask->left));
        AJ_TRY(expect(p, TOK_COMMA, "the window's left size"));
        AJ_TRY(parse_int(p, INT64_MAX, &mask->right));
        if (p->lx.tok.kind == TOK_COMMA) {
            AJ_TRY(next(p));
            AJ_TRY(parse_choice(p, aj_align_names, AJ_ALIGN_COUNT,
                                "an alignment", NULL, &align));
        }
    } else {
        AJ_TRY(parse_choice(p, aj_align_names, AJ_ALIGN_COUNT, "an alignment",
                            NULL, &align));
    }
    mask->align = (aj_align)align;
    AJ_TRY(expect(p, TOK_RPAREN, kind == AJ_MASK_CAUSAL ? "the alignment"
                                                        : "the window"));
done:
    return st;
}

static aj_status parse_alibi_slopes(parser *p, aj_score_mod_spec *mod);

/* score_mod = none | softcap(NUMBER) [+ ALIBI] | ALIBI | expr(E), where
 * ALIBI = alibi [(grad) | (NAME)] */
static aj_status parse_score_mod(parser *p, aj_score_mod_spec *mod)
{
    int kind = 0;
    aj_status st = AJ_OK;

    AJ_TRY(parse_choice(p, aj_score_mod_names, AJ_SCORE_MOD_COUNT,
                        "a score_mod", "none, softcap(C), alibi or expr(E)",
                        &kind));
    *mod = (aj_score_mod_spec){ .kind = (aj_score_mod)kind,
                                .root = AJ_EXPR_NONE };
    if (kind == AJ_SCORE_MOD_EXPR)
        return defer_expr(p, &p->deferred[1]);
    if (kind == AJ_SCORE_MOD_ALIBI)
        return parse_alibi_slopes(p, mod);
    if (kind != AJ_SCORE_MOD_SOFTCAP)
        return AJ_OK;
    AJ_TRY(expect(p, TOK_LPAREN, "'softcap'"));
    AJ_TRY(parse_number(p, &mod->softcap));
    AJ_TRY(expect(p, TOK_RPAREN, "the softcap"));
    if (p->lx.tok.kind != TOK_PLUS)
        return AJ_OK;
    if (mod->softcap == 0)   /* (0 stands for no cap beside alibi) */
        return fail_at(p, AJ_ERR_VERIFY, p->lx.tok.pos, "softcap 0 is out of range (want a "
                       "finite number > 0)");
    AJ_TRY(next(p));   /* softcap(C) + alibi...: ALiBi after the cap */
    if (!is_word(&p->lx.tok, "alibi"))
        return expected(p, "alibi (softcap(C) + alibi: ALiBi after the softcap)");
    AJ_TRY(next(p));
    mod->kind = AJ_SCORE_MOD_ALIBI;
    return parse_alibi_slopes(p, mod);
done:
    return st;
}

/* After `alibi`: nothing (the launch's alibi_slopes), (grad) (theirs
 * with a gradient) or (NAME) (side tensor NAME's, resolved with the
 * expressions). */
static aj_status parse_alibi_slopes(parser *p, aj_score_mod_spec *mod)
{
    aj_status st = AJ_OK;
    if (p->lx.tok.kind != TOK_LPAREN)
        return AJ_OK;
    AJ_TRY(next(p));
    if (p->lx.tok.kind != TOK_IDENT)
        return expected(p, "grad or a tensor name (alibi(grad): the slopes get a gradient; "
                        "alibi(NAME): side tensor NAME holds them)");
    mod->grad = is_word(&p->lx.tok, "grad");
    if (!mod->grad)
        p->alibi = p->lx.tok;
    AJ_TRY(next(p));
    AJ_TRY(expect(p, TOK_RPAREN, mod->grad ? "alibi(grad" : "alibi(NAME"));
done:
    return st;
}

/* scale = default | NUMBER.  Range-checked as it is read, like the head
 * dims: inside the op 0 is AJ_SCALE_DEFAULT, so a written 0 must not reach
 * it. */
static aj_status parse_scale(parser *p, double *scale)
{
    char msg[256];
    double v;
    aj_status st = AJ_OK;

    if (is_word(&p->lx.tok, "default")) {
        *scale = AJ_SCALE_DEFAULT;
        return next(p);
    }
    if (p->lx.tok.kind != TOK_NUMBER)
        return expected(p, "a scale (default or a number)");
    AJ_TRY(parse_number(p, &v));
    if (!aj_scale_ok(v, msg, sizeof msg))
        return fail_at(p, AJ_ERR_VERIFY, p->field_at[AJ_FIELD_SCALE], "%s",
                       msg);
    *scale = v;
done:
    return st;
}

/* schedule = default | "(" KEY "=" INT { "," KEY "=" INT } ")" */
static aj_status parse_schedule(parser *p, aj_schedule *schedule, int32_t *splits,
                               int32_t *warpgroups, int32_t *producer)
{
    static const char *const keys[] = { "block_m", "block_n", "warps", "stages",
                                        "splits", "warpgroups", "producer" };
    int32_t *slots[] = { &schedule->block_m, &schedule->block_n, &schedule->warps,
                         &schedule->stages, splits, warpgroups, producer };
    bool seen[7] = { false };
    char quoted[16];
    aj_status st = AJ_OK;

    *schedule = (aj_schedule){ 0 };
    *splits = 0;
    *warpgroups = 0;
    *producer = 0;
    if (is_word(&p->lx.tok, "default"))
        return next(p);
    if (p->lx.tok.kind != TOK_LPAREN)
        return expected(p, "a schedule (default or (block_m = N, block_n = N, "
                           "warps = N, stages = N))");
    AJ_TRY(next(p));
    for (;;) {
        aj_pos at = p->lx.tok.pos;
        int64_t v;
        int key = 0;

        AJ_TRY(parse_choice(p, keys, (int)(sizeof keys / sizeof keys[0]),
                            "a schedule key", NULL, &key));
        if (seen[key])
            return fail_at(p, AJ_ERR_PARSE, at, "duplicate schedule key '%s'",
                           keys[key]);
        seen[key] = true;
        snprintf(quoted, sizeof quoted, "'%s'", keys[key]);
        AJ_TRY(expect(p, TOK_EQUALS, quoted));
        AJ_TRY(parse_int(p, INT32_MAX, &v));
        *slots[key] = (int32_t)v;
        if (p->lx.tok.kind == TOK_RPAREN)
            return next(p);
        if (p->lx.tok.kind != TOK_COMMA)
            return expected(p, "',' or ')' in the schedule");
        AJ_TRY(next(p));
    }
done:
    return st;
}

/* ---------------------------------------------------------------- expressions */

/*
 * E by precedence climbing over aj_expr_ops (C's precedence):
 *
 *   ternary = binary(2) [ "?" ternary ":" ternary ]
 *   binary(P) = unary { INFIX-of-precedence->=P binary(prec+1) }
 *   unary   = ("-" | "!" | "~") unary | primary
 *   primary = NUMBER | true | false | inf | VARIABLE | "(" ternary ")"
 *           | FUNCTION "(" ternary { "," ternary } ")"
 *           | TENSOR "[" ternary { "," ternary } "]"
 *
 * Nodes are typed and folded as they are made (aj_expr_add); a type
 * error is reported at the operator, function or tensor it concerns.
 */
typedef struct expr_parser {
    parser *p;
    aj_expr_scope scope;
} expr_parser;

static aj_status parse_ternary(expr_parser *ep, uint16_t *out);
static bool all_digits(const token *t);

/* aj_expr_add, with its complaint placed at `at`. */
static aj_status add_node(expr_parser *ep, aj_pos at, aj_expr_op op,
                          const uint16_t *args, int n,
                          const aj_expr_node *leaf, uint16_t *out)
{
    char msg[256];

    if (aj_expr_add(&ep->p->op->expr, &ep->scope, op, args, n, leaf, out,
                    msg, sizeof msg))
        return AJ_OK;
    return fail_at(ep->p, AJ_ERR_VERIFY, at, "%s", msg);
}

/* Counts one level of nesting (a parenthesis, a prefix operator, an
 * argument list) and refuses the one past the limit. */
static aj_status enter(expr_parser *ep)
{
    if (++ep->p->depth <= AJ_EXPR_NEST_MAX)
        return AJ_OK;
    return fail_at(ep->p, AJ_ERR_VERIFY, ep->p->lx.tok.pos,
                   "the expression nests deeper than %d levels",
                   AJ_EXPR_NEST_MAX);
}

/* The operator of `form` the current token spells, or AJ_EXPR_OP_COUNT. */
static aj_expr_op token_op(const parser *p, aj_expr_form form)
{
    if (p->lx.tok.kind != TOK_OP)
        return AJ_EXPR_OP_COUNT;
    for (int op = 0; op < AJ_EXPR_OP_COUNT; op++) {
        const char *spelling = aj_expr_ops[op].spelling;
        if (aj_expr_ops[op].form == form &&
            strlen(spelling) == p->lx.tok.len &&
            memcmp(spelling, p->lx.tok.text, p->lx.tok.len) == 0)
            return (aj_expr_op)op;
    }
    return AJ_EXPR_OP_COUNT;
}

/* ARG { "," ARG } CLOSE into args (at most `max`); the count in *n. */
static aj_status parse_args(expr_parser *ep, tok_kind close, const char *what,
                            uint16_t *args, int max, int *n)
{
    uint16_t ignored;
    aj_status st = AJ_OK;

    *n = 0;
    AJ_TRY(enter(ep));
    AJ_TRY(next(ep->p));
    for (;;) {
        AJ_TRY(parse_ternary(ep, *n < max ? &args[*n] : &ignored));
        (*n)++;
        if (ep->p->lx.tok.kind == close)
            break;
        if (ep->p->lx.tok.kind != TOK_COMMA) {
            char msg[128];
            snprintf(msg, sizeof msg, "',' or %s in %s", punct_text(close),
                     what);
            return expected(ep->p, msg);
        }
        AJ_TRY(next(ep->p));
    }
    ep->p->depth--;
    AJ_TRY(next(ep->p));
done:
    return st;
}

/* A name: keyword, variable, call or load. */
static aj_status parse_name(expr_parser *ep, uint16_t *out)
{
    parser *p = ep->p;
    const token name = p->lx.tok;
    aj_expr_node leaf = { .op = AJ_EXPR_LIT, .type = AJ_EXPR_BOOL };
    uint16_t args[AJ_EXPR_RANK_MAX];
    char shown[64], what[96];
    int n = 0;
    aj_status st = AJ_OK;

    AJ_TRY(next(p));
    if (is_word(&name, "true") || is_word(&name, "false")) {
        leaf.u.i = is_word(&name, "true");
        return add_node(ep, name.pos, AJ_EXPR_LIT, NULL, 0, &leaf, out);
    }
    if (is_word(&name, "inf")) {
        leaf.type = AJ_EXPR_FLOAT;
        leaf.u.f = INFINITY;
        return add_node(ep, name.pos, AJ_EXPR_LIT, NULL, 0, &leaf, out);
    }
    for (int v = 0; v < AJ_VAR_COUNT; v++) {
        /* the bias leaf is the score programs' own: no text reads it */
        if (v != AJ_VAR_BIAS && is_word(&name, aj_expr_var_names[v])) {
            leaf = (aj_expr_node){ .op = AJ_EXPR_VAR, .u.var = v };
            return add_node(ep, name.pos, AJ_EXPR_VAR, NULL, 0, &leaf, out);
        }
    }
    describe(&name, shown, sizeof shown);
    if (p->lx.tok.kind == TOK_LPAREN) {
        for (int op = 0; op < AJ_EXPR_OP_COUNT; op++) {
            if (aj_expr_ops[op].form == AJ_FORM_CALL &&
                is_word(&name, aj_expr_ops[op].spelling)) {
                snprintf(what, sizeof what, "the arguments of %s", shown);
                AJ_TRY(parse_args(ep, TOK_RPAREN, what, args,
                                  AJ_EXPR_RANK_MAX, &n));
                return add_node(ep, name.pos, (aj_expr_op)op, args, n, NULL,
                                out);
            }
        }
        char known[256];
        size_t len = 0;
        known[0] = '\0';
        for (int op = 0; op < AJ_EXPR_OP_COUNT && len < sizeof known; op++)
            if (aj_expr_ops[op].form == AJ_FORM_CALL)
                len += (size_t)snprintf(known + len, sizeof known - len, "%s%s",
                                        len ? ", " : "", aj_expr_ops[op].spelling);
        return fail_at(p, AJ_ERR_PARSE, name.pos, "unknown function %s "
                       "(functions: %s)", shown, known);
    }
    for (int t = 0; t < ep->scope.count; t++) {
        if (!is_word(&name, ep->scope.tensors[t].name))
            continue;
        if (p->lx.tok.kind != TOK_LBRACKET)
            return fail_at(p, AJ_ERR_PARSE, name.pos, "tensor %s is read "
                           "with indices: %s[...]", shown, ep->scope.tensors[t].name);
        snprintf(what, sizeof what, "the indices of %s", shown);
        AJ_TRY(parse_args(ep, TOK_RBRACKET, what, args, AJ_EXPR_RANK_MAX,
                          &n));
        if (n != ep->scope.tensors[t].rank)
            return fail_at(p, AJ_ERR_VERIFY, name.pos, "tensor %s has rank "
                           "%d, read with %d ind%s", shown,
                           (int)ep->scope.tensors[t].rank, n,
                           n == 1 ? "ex" : "ices");
        leaf = (aj_expr_node){ .op = AJ_EXPR_LOAD, .u.tensor = t };
        return add_node(ep, name.pos, AJ_EXPR_LOAD, args, n, &leaf, out);
    }
    if (p->lx.tok.kind == TOK_LBRACKET)
        return fail_at(p, AJ_ERR_PARSE, name.pos, "unknown tensor %s (declare "
                       "it in 'tensors')", shown);
    return fail_at(p, AJ_ERR_PARSE, name.pos, "unknown name %s (variables: "
                   "b, h, q, k, sq, sk, score)", shown);
done:
    return st;
}

/* An integer (i64) or float (f32) literal. */
static aj_status parse_literal(expr_parser *ep, uint16_t *out)
{
    const token t = ep->p->lx.tok;
    aj_expr_node leaf = { .op = AJ_EXPR_LIT, .type = AJ_EXPR_INT };
    char shown[64];
    aj_status st = AJ_OK;

    if (all_digits(&t)) {
        AJ_TRY(parse_int(ep->p, INT64_MAX, &leaf.u.i));
    } else {
        leaf.type = AJ_EXPR_FLOAT;
        AJ_TRY(parse_number(ep->p, &leaf.u.f));
        if (isinf((float)leaf.u.f))
            return fail_at(ep->p, AJ_ERR_VERIFY, t.pos, "number %s is out "
                           "of f32 range", describe(&t, shown, sizeof shown));
    }
    return add_node(ep, t.pos, AJ_EXPR_LIT, NULL, 0, &leaf, out);
done:
    return st;
}

static aj_status parse_primary(expr_parser *ep, uint16_t *out)
{
    parser *p = ep->p;
    aj_status st = AJ_OK;

    switch (p->lx.tok.kind) {
    case TOK_NUMBER:
        return parse_literal(ep, out);
    case TOK_IDENT:
        return parse_name(ep, out);
    case TOK_LPAREN: {
        aj_pos open = p->lx.tok.pos;
        char buf[64];

        AJ_TRY(enter(ep));
        AJ_TRY(next(p));
        AJ_TRY(parse_ternary(ep, out));
        if (p->lx.tok.kind != TOK_RPAREN)
            return fail_at(p, AJ_ERR_PARSE, p->lx.tok.pos, "expected ')' to "
                           "close the '(' at %d:%d, found %s", open.line,
                           open.col, describe(&p->lx.tok, buf, sizeof buf));
        p->depth--;
        return next(p);
    }
    default:
        return expected(p, "an expression");
    }
done:
    return st;
}

static aj_status parse_unary(expr_parser *ep, uint16_t *out)
{
    aj_expr_op op = token_op(ep->p, AJ_FORM_PREFIX);
    aj_pos at = ep->p->lx.tok.pos;
    uint16_t arg;
    aj_status st = AJ_OK;

    if (op == AJ_EXPR_OP_COUNT)
        return parse_primary(ep, out);
    AJ_TRY(enter(ep));
    AJ_TRY(next(ep->p));
    AJ_TRY(parse_unary(ep, &arg));
    ep->p->depth--;
    AJ_TRY(add_node(ep, at, op, &arg, 1, NULL, out));
done:
    return st;
}

static aj_status parse_binary(expr_parser *ep, int min_prec, uint16_t *out)
{
    aj_status st = AJ_OK;

    AJ_TRY(parse_unary(ep, out));
    for (;;) {
        aj_expr_op op = token_op(ep->p, AJ_FORM_INFIX);
        aj_pos at = ep->p->lx.tok.pos;
        uint16_t args[2] = { *out, 0 };

        if (op == AJ_EXPR_OP_COUNT || aj_expr_ops[op].prec < min_prec)
            break;
        AJ_TRY(next(ep->p));
        AJ_TRY(parse_binary(ep, aj_expr_ops[op].prec + 1, &args[1]));
        AJ_TRY(add_node(ep, at, op, args, 2, NULL, out));
    }
done:
    return st;
}

static aj_status parse_ternary(expr_parser *ep, uint16_t *out)
{
    parser *p = ep->p;
    uint16_t args[3];
    aj_pos at;
    aj_status st = AJ_OK;

    AJ_TRY(parse_binary(ep, aj_expr_ops[AJ_EXPR_SELECT].prec + 1, &args[0]));
    if (p->lx.tok.kind != TOK_QUESTION) {
        *out = args[0];
        return AJ_OK;
    }
    at = p->lx.tok.pos;
    AJ_TRY(enter(ep));
    AJ_TRY(next(p));
    AJ_TRY(parse_ternary(ep, &args[1]));
    AJ_TRY(expect(p, TOK_COLON, "the '?' arm"));
    AJ_TRY(parse_ternary(ep, &args[2]));
    p->depth--;
    AJ_TRY(add_node(ep, at, AJ_EXPR_SELECT, args, 3, NULL, out));
done:
    return st;
}

/* The whole E of the mask (a bool) or the score_mod (a number, made a
 * float), ending at `end`. */
static aj_status parse_expr_root(parser *p, bool score_mod, tok_kind end,
                                 uint16_t *root)
{
    expr_parser ep = { p, aj_op_expr_scope(p->op, score_mod) };
    const aj_pos at = p->lx.tok.pos;
    aj_expr_type type;
    char buf[64];
    aj_status st = AJ_OK;

    p->depth = 0;
    AJ_TRY(parse_ternary(&ep, root));
    if (p->lx.tok.kind != end)
        return fail_at(p, AJ_ERR_PARSE, p->lx.tok.pos, "expected an operator "
                       "or %s, found %s", end == TOK_END ? "the end of the "
                       "expression" : punct_text(end),
                       describe(&p->lx.tok, buf, sizeof buf));
    type = (aj_expr_type)p->op->expr.nodes[*root].type;
    if (!score_mod && type != AJ_EXPR_BOOL)
        return fail_at(p, AJ_ERR_VERIFY, at, "the mask expression must be a "
                       "bool, got %s", aj_expr_type_names[type]);
    if (score_mod && type == AJ_EXPR_BOOL)
        return fail_at(p, AJ_ERR_VERIFY, at, "the score_mod expression must "
                       "be a number, got bool");
    if (score_mod && type == AJ_EXPR_INT)
        AJ_TRY(add_node(&ep, at, AJ_EXPR_TO_FLOAT, root, 1, NULL, root));
done:
    return st;
}

/* A field's tensor name `name` (sinks = NAME, alibi(NAME)) as 1 + its
 * index into *slot; else the error, `what` printing the name. */
static aj_status resolve_tensor(parser *p, const token *name, const char *what, int32_t *slot)
{
    for (int i = 0; i < p->op->tensor_count; i++)
        if (strlen(p->op->tensors[i].name) == name->len &&
            memcmp(p->op->tensors[i].name, name->text, name->len) == 0) {
            *slot = i + 1;
            return AJ_OK;
        }
    char field[AJ_OP_TENSOR_NAME_MAX + 32];
    snprintf(field, sizeof field, what, (int)name->len, name->text);
    return fail_at(p, AJ_ERR_VERIFY, name->pos, "%s: no side tensor of that name (declare it: "
                   "tensors = (%.*s: f32[1]))", field, (int)name->len, name->text);
}

/* The expressions deferred by defer_expr, mask first; the tensors are
 * checked first, since the expressions are typed against them. */
static aj_status parse_deferred(parser *p)
{
    char msg[AJ_ERROR_TEXT_MAX / 2];
    aj_status st = AJ_OK;

    if (aj_op_check_field(p->op, AJ_FIELD_TENSORS, msg, sizeof msg) != AJ_OK)
        return fail_at(p, AJ_ERR_VERIFY, p->field_at[AJ_FIELD_TENSORS], "%s",
                       msg);
    if (p->sinks.len && !(p->sinks.len == 4 && memcmp(p->sinks.text, "none", 4) == 0))
        AJ_TRY(resolve_tensor(p, &p->sinks, "sinks = %.*s", &p->op->sinks));
    if (p->alibi.len)
        AJ_TRY(resolve_tensor(p, &p->alibi, "alibi(%.*s)", &p->op->score_mod.slopes));
    for (int i = 0; i < 2; i++) {
        if (!p->deferred[i].set)
            continue;
        p->lx = p->deferred[i].start;
        AJ_TRY(parse_expr_root(p, i == 1, TOK_RPAREN,
                               i ? &p->op->score_mod.root : &p->op->mask.root));
    }
done:
    return st;
}

aj_status aj_expr_parse(aj_op *op, bool score_mod, const char *text,
                        size_t len, uint16_t *root, char *msg, size_t cap)
{
    parser p;
    aj_status st = AJ_OK;

    memset(&p, 0, sizeof p);
    p.msg_out = msg;
    p.msg_cap = cap;
    p.src = text;
    p.len = len;
    p.op = op;
    p.lx.cur = (aj_pos){ 1, 1 };
    p.lx.in_expr = true;
    AJ_TRY(next(&p));
    AJ_TRY(parse_expr_root(&p, score_mod, TOK_END, root));
done:
    return st;
}

/* ---------------------------------------------------------------- numbers */

static bool is_digit(char c)
{
    return c >= '0' && c <= '9';
}

static bool all_digits(const token *t)
{
    for (size_t i = 0; i < t->len; i++)
        if (!is_digit(t->text[i]))
            return false;
    return true;
}

/* An unsigned decimal integer no larger than max. */
static aj_status parse_int(parser *p, int64_t max, int64_t *out)
{
    const token *t = &p->lx.tok;
    int64_t v = 0;

    if (t->kind != TOK_NUMBER || !all_digits(t))
        return expected(p, "an integer (decimal digits, no sign)");
    for (size_t i = 0; i < t->len; i++) {
        int d = t->text[i] - '0';

        if (v > (max - d) / 10) {
            char buf[64];
            return fail_at(p, AJ_ERR_PARSE, t->pos,
                           "integer %s is too large (at most %lld)",
                           describe(t, buf, sizeof buf), (long long)max);
        }
        v = v * 10 + d;
    }
    *out = v;
    return next(p);
}

/*
 * The lexer has checked the lexeme against the NUMBER grammar.  It is
 * rewritten without its decimal point, as [-]DIGITSeEXP, before strtod
 * sees it: strtod reads the point in the C locale's spelling (',' in some),
 * but digits, sign and exponent the same in every locale.  The written
 * exponent saturates; anything that far out is inf or 0 either way.
 */
static aj_status parse_number(parser *p, double *out)
{
    const token *t = &p->lx.tok;
    char buf[AJ_NUMBER_LEXEME_MAX + 16], shown[64];
    size_t i = 0, n = 0;
    long exp10 = 0;
    char *end;
    double v;

    if (t->kind != TOK_NUMBER)
        return expected(p, "a number");
    if (t->len > AJ_NUMBER_LEXEME_MAX)
        return fail_at(p, AJ_ERR_PARSE, t->pos,
                       "number %s is too long (at most %d characters)",
                       describe(t, shown, sizeof shown), AJ_NUMBER_LEXEME_MAX);
    if (t->text[i] == '+' || t->text[i] == '-')
        buf[n++] = t->text[i++];
    for (; i < t->len && is_digit(t->text[i]); i++)
        buf[n++] = t->text[i];
    if (i < t->len && t->text[i] == '.') {
        for (i++; i < t->len && is_digit(t->text[i]); i++) {
            buf[n++] = t->text[i];
            exp10--;
        }
    }
    if (i < t->len) {
        /* All that is left is the exponent: [eE][+-]?DIGITS. */
        bool neg = t->text[i + 1] == '-';
        long written = 0;

        i += t->text[i + 1] == '+' || neg ? 2 : 1;
        for (; i < t->len; i++)
            if (written < 100000)
                written = written * 10 + (t->text[i] - '0');
        exp10 += neg ? -written : written;
    }
    n += (size_t)snprintf(buf + n, sizeof buf - n, "e%ld", exp10);

    v = strtod(buf, &end);
    /* Cannot fail for a lexeme the grammar accepted; checked so that a C
     * library that reads numbers differently is an error, not a wrong
     * value. */
    if (end != buf + n)
        return fail_at(p, AJ_ERR_PARSE, t->pos,
                       "cannot convert number %s", describe(t, shown,
                                                            sizeof shown));
    if (isinf(v))
        return fail_at(p, AJ_ERR_PARSE, t->pos, "number %s is out of range",
                       describe(t, shown, sizeof shown));
    *out = v;
    return next(p);
}

/* ---------------------------------------------------------------- checks */

/* forward and backward need dtype and head_dim; merge dtype and
 * head_dim_v.  Reported at the closing brace, where they were due. */
static aj_status check_required(parser *p)
{
    const bool merge = p->op->kind == AJ_KIND_MERGE;
    const aj_field need[2] = {
        AJ_FIELD_DTYPE, merge ? AJ_FIELD_HEAD_DIM_V : AJ_FIELD_HEAD_DIM
    };

    for (int i = 0; i < 2; i++) {
        if (!p->seen[need[i]])
            return fail_at(p, AJ_ERR_PARSE, p->close,
                           "missing required field '%s' (%s ops need %s and "
                           "%s)", aj_field_names[need[i]],
                           aj_kind_names[p->op->kind],
                           aj_field_names[need[0]], aj_field_names[need[1]]);
    }
    return AJ_OK;
}

/* Runs the verifier and blames the field it names where it was written
 * (the header for kind and variant). */
static aj_status verify(parser *p)
{
    char msg[AJ_ERROR_TEXT_MAX / 2];
    aj_field field = AJ_FIELD_HEADER;
    aj_pos at;

    if (aj_op_check(p->op, &field, msg, sizeof msg) == AJ_OK)
        return AJ_OK;
    at = field != AJ_FIELD_HEADER && p->seen[field] ? p->field_at[field]
                                                     : p->header;
    return fail_at(p, AJ_ERR_VERIFY, at, "%s", msg);
}

/* ---------------------------------------------------------------- errors */

static aj_status fail_at(parser *p, aj_status st, aj_pos pos,
                         const char *fmt, ...)
{
    char msg[AJ_ERROR_TEXT_MAX];
    va_list ap;

    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    if (!p->ctx) {
        snprintf(p->msg_out, p->msg_cap, "%d:%d: %s", pos.line, pos.col, msg);
        return st;
    }
    return aj_fail(p->ctx, st, "%s:%d:%d: %s", p->name, pos.line, pos.col,
                   msg);
}

/* Line and column of src[offset], counting from the start. */
static aj_pos pos_of(const char *src, size_t offset)
{
    aj_pos pos = { 1, 1 };

    for (size_t i = 0; i < offset; i++) {
        if (src[i] == '\n')
            pos = (aj_pos){ pos.line + 1, 1 };
        else
            pos.col++;
    }
    return pos;
}

/* ---------------------------------------------------------------- lexer */

static bool is_ident_start(char c)
{
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_';
}

static bool is_ident_char(char c)
{
    return is_ident_start(c) || is_digit(c);
}

/* In an expression '+' and '-' are operators; elsewhere they sign a
 * number. */
static bool is_number_start(const parser *p, const char *s, size_t left)
{
    /* a '+' before anything but a digit or '.' is softcap(C) + alibi's */
    const char c = s[0];
    return is_digit(c) || c == '.' ||
           (!p->lx.in_expr && (c == '-' || (c == '+' && left > 1 &&
                                            (is_digit(s[1]) || s[1] == '.'))));
}

/* Moves the cursor over n bytes of one line. */
static void advance(parser *p, size_t n)
{
    p->lx.at += n;
    p->lx.cur.col += (int)n;
}

/* Whitespace and '#' comments, up to the next token. */
static void skip_blank(parser *p)
{
    while (p->lx.at < p->len) {
        char c = p->src[p->lx.at];

        if (c == '\n') {
            p->lx.at++;
            p->lx.cur = (aj_pos){ p->lx.cur.line + 1, 1 };
        } else if (c == ' ' || c == '\t' || c == '\r' || c == '\f' ||
                   c == '\v') {
            advance(p, 1);
        } else if (c == '#') {
            while (p->lx.at < p->len && p->src[p->lx.at] != '\n')
                advance(p, 1);
        } else {
            return;
        }
    }
}

/* NUMBER = [+-]? (DIGITS ("." DIGITS)? | "." DIGITS) ([eE] [+-]? DIGITS)? */
static bool number_grammar_ok(const char *s, size_t len)
{
    size_t i = 0, int_digits = 0, frac_digits = 0, exp_digits = 0;

    if (i < len && (s[i] == '+' || s[i] == '-'))
        i++;
    for (; i < len && is_digit(s[i]); i++)
        int_digits++;
    if (i < len && s[i] == '.') {
        for (i++; i < len && is_digit(s[i]); i++)
            frac_digits++;
        if (frac_digits == 0)
            return false;
    }
    if (int_digits == 0 && frac_digits == 0)
        return false;
    if (i < len && (s[i] == 'e' || s[i] == 'E')) {
        i++;
        if (i < len && (s[i] == '+' || s[i] == '-'))
            i++;
        for (; i < len && is_digit(s[i]); i++)
            exp_digits++;
        if (exp_digits == 0)
            return false;
    }
    return i == len;
}

/* A number's lexeme runs over everything that could belong to it (letters
 * too, so "1.5x" is one bad number, not a number and a word); a sign
 * continues it only right after an exponent's 'e'. */
static size_t number_extent(const parser *p)
{
    const char *s = p->src + p->lx.at;
    size_t n = 1, left = p->len - p->lx.at;

    while (n < left) {
        char c = s[n];

        if (is_ident_char(c) || c == '.' ||
            ((c == '+' || c == '-') && (s[n - 1] == 'e' || s[n - 1] == 'E')))
            n++;
        else
            break;
    }
    return n;
}

static tok_kind punct_kind(char c)
{
    switch (c) {
    case '{': return TOK_LBRACE;
    case '}': return TOK_RBRACE;
    case '(': return TOK_LPAREN;
    case ')': return TOK_RPAREN;
    case '=': return TOK_EQUALS;
    case ',': return TOK_COMMA;
    case '[': return TOK_LBRACKET;
    case ']': return TOK_RBRACKET;
    case ':': return TOK_COLON;
    case '+': return TOK_PLUS;
    default:  return TOK_END;
    }
}

/* Length of the operator of aj_expr_ops that s starts with (the longest
 * one: "<=" before "<"), or 0. */
static size_t operator_len(const char *s, size_t left)
{
    size_t best = 0;

    for (int op = 0; op < AJ_EXPR_OP_COUNT; op++) {
        const aj_expr_op_info *info = &aj_expr_ops[op];
        size_t n = strlen(info->spelling);

        if ((info->form == AJ_FORM_INFIX || info->form == AJ_FORM_PREFIX) &&
            n > best && n <= left && memcmp(s, info->spelling, n) == 0)
            best = n;
    }
    return best;
}

/* Reads the next token into p->lx.tok. */
static aj_status next(parser *p)
{
    token *t = &p->lx.tok;
    const char *s;
    char c;

    skip_blank(p);
    s = p->src + p->lx.at;
    *t = (token){ TOK_END, s, 0, p->lx.cur };
    if (p->lx.at == p->len)
        return AJ_OK;
    c = s[0];
    if (is_ident_start(c)) {
        t->kind = TOK_IDENT;
        while (t->len < p->len - p->lx.at && is_ident_char(s[t->len]))
            t->len++;
    } else if (p->lx.in_expr && (t->len = operator_len(s, p->len - p->lx.at))) {
        t->kind = TOK_OP;
    } else if (p->lx.in_expr && c == '?') {
        t->kind = TOK_QUESTION;
        t->len = 1;
    } else if (is_number_start(p, s, p->len - p->lx.at)) {
        t->kind = TOK_NUMBER;
        t->len = number_extent(p);
        if (!number_grammar_ok(s, t->len)) {
            char buf[64];
            return fail_at(p, AJ_ERR_PARSE, t->pos, "malformed number %s",
                           describe(t, buf, sizeof buf));
        }
    } else if (punct_kind(c) != TOK_END) {
        t->kind = punct_kind(c);
        t->len = 1;
    } else if (c > ' ' && c < 0x7f) {
        return fail_at(p, AJ_ERR_PARSE, t->pos, "unexpected character '%c'",
                       c);
    } else {
        return fail_at(p, AJ_ERR_PARSE, t->pos, "unexpected byte 0x%02x",
                       (unsigned)(unsigned char)c);
    }
    advance(p, t->len);
    return AJ_OK;
}
