/*
 * print.c -- the canonical text form of an op, and its hash.
 *
 * The canonical form is the cache key's source, so it is fully determined
 * by the op's value: every field in a fixed order, defaults written out,
 * numbers in one spelling.  For a forward op:
 *
 *   attention forward efficient {
 *     dtype = bf16
 *     head_dim = 128
 *     ...                       (every field, in aj_field order)
 *     target = any
 *   }
 *
 * Merge ops print only dtype, head_dim_v and target.  Parsing the canonical
 * form gives back an op that prints the same text.
 */
#include "ir/op.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define XXH_INLINE_ALL
#include <xxhash.h>

/* An append-only text buffer that remembers whether it ever ran out. */
typedef struct text_buf {
    char *buf;
    size_t cap, len;
    bool full;
} text_buf;

static void emit(text_buf *t, const char *fmt, ...) AJ_PRINTF(2, 3);

static void print_value(text_buf *t, const aj_op *op, aj_field field);

static aj_status checked_canonical(const aj_op *op, const void *out, const char *fn,
                                   char buf[AJ_CANONICAL_MAX], size_t *len);

aj_status aj_op_print(const aj_op *op, char **out)
{
    char buf[AJ_CANONICAL_MAX], *text;
    size_t len;
    aj_status st = checked_canonical(op, out, "aj_op_print", buf, &len);

    if (st != AJ_OK)
        return st;
    text = malloc(len + 1);
    if (!text)
        return aj_fail(op->ctx, AJ_ERR_OUT_OF_MEMORY,
                       "aj_op_print: out of memory");
    memcpy(text, buf, len + 1);
    *out = text;
    return AJ_OK;
}

aj_status aj_op_hash(const aj_op *op, char out[AJ_HASH_HEX_LEN + 1])
{
    char buf[AJ_CANONICAL_MAX];
    size_t len;
    aj_status st = checked_canonical(op, out, "aj_op_hash", buf, &len);

    if (st != AJ_OK)
        return st;
    snprintf(out, AJ_HASH_HEX_LEN + 1, "%016llx",
             (unsigned long long)XXH3_64bits(buf, len));
    return AJ_OK;
}

/* The arguments of public entry `fn` checked (op, and its result pointer
 * `out`), then op's canonical text into buf. */
static aj_status checked_canonical(const aj_op *op, const void *out, const char *fn,
                                   char buf[AJ_CANONICAL_MAX], size_t *len)
{
    aj_status st;

    AJ_CHECK_ARG(NULL, op, "%s: op is NULL", fn);
    AJ_CHECK_ARG(op->ctx, out, "%s: out is NULL", fn);
    if ((st = aj_op_canonical(op, buf, AJ_CANONICAL_MAX, len)) != AJ_OK)
        return aj_fail(op->ctx, st, "%s: canonical text overflows %d bytes", fn,
                       AJ_CANONICAL_MAX);
    return AJ_OK;
}

aj_status aj_op_canonical(const aj_op *op, char *buf, size_t cap, size_t *len)
{
    text_buf t = { buf, cap, 0, false };

    buf[0] = '\0';
    if (op->kind == AJ_KIND_MERGE)
        emit(&t, "attention %s {\n", aj_kind_names[op->kind]);
    else
        emit(&t, "attention %s %s {\n", aj_kind_names[op->kind],
             aj_variant_names[op->variant]);
    for (int f = AJ_FIELD_HEADER + 1; f < AJ_FIELD_COUNT; f++) {
        if (op->kind == AJ_KIND_MERGE && !aj_field_in_merge((aj_field)f))
            continue;
        /* No tensors: the field is left out, so that an op without
         * expressions prints (and hashes) as it did before they existed. */
        if (f == AJ_FIELD_TENSORS && op->tensor_count == 0)
            continue;
        /* and sinks, when there are none */
        if (f == AJ_FIELD_SINKS && op->sinks == 0)
            continue;
        /* Likewise kv_dtype, which the paged layout always prints and the
         * others only when set (f8 inputs), and q_dtype only when set. */
        if (f == AJ_FIELD_KV_DTYPE && op->layout != AJ_LAYOUT_PAGED && !op->kv_dtype_set)
            continue;
        if (f == AJ_FIELD_Q_DTYPE && !op->q_dtype_set)
            continue;
        /* and q_layout, printed only for varlen queries, so that a paged
         * op with padded ones keeps its text */
        if (f == AJ_FIELD_Q_LAYOUT && op->q_layout == AJ_LAYOUT_PADDED)
            continue;
        /* and kv_shared, printed only when true */
        if (f == AJ_FIELD_KV_SHARED && !op->kv_shared)
            continue;
        emit(&t, "  %s = ", aj_field_names[f]);
        print_value(&t, op, (aj_field)f);
        emit(&t, "\n");
    }
    emit(&t, "}\n");
    *len = t.len;
    return t.full ? AJ_ERR_INTERNAL : AJ_OK;
}

static void emit(text_buf *t, const char *fmt, ...)
{
    va_list ap;
    int n;

    if (t->full)
        return;
    va_start(ap, fmt);
    n = vsnprintf(t->buf + t->len, t->cap - t->len, fmt, ap);
    va_end(ap);
    if (n < 0 || (size_t)n >= t->cap - t->len) {
        t->full = true;
        return;
    }
    t->len += (size_t)n;
}

static void emit_number(text_buf *t, double value)
{
    char num[AJ_NUMBER_MAX];

    aj_format_number(value, num);
    emit(t, "%s", num);
}

static void emit_text(void *sink, const char *text)
{
    emit(sink, "%s", text);
}

/* expr(E) for the tree at root. */
static void print_expr(text_buf *t, const aj_op *op, uint16_t root)
{
    emit(t, "expr(");
    aj_expr_print(&op->expr, root, op->tensors, emit_text, t);
    emit(t, ")");
}

/* (NAME: DTYPE[RANK] [grad], ...) */
static void print_tensors(text_buf *t, const aj_op *op)
{
    for (int i = 0; i < op->tensor_count; i++)
        emit(t, "%s%s: %s[%d]%s", i ? ", " : "(", op->tensors[i].name,
             aj_side_dtype_names[op->tensors[i].dtype],
             (int)op->tensors[i].rank, op->tensor_grad >> i & 1u ? " grad" : "");
    emit(t, ")");
}

static void print_mask(text_buf *t, const aj_op *op)
{
    const aj_mask_spec *mask = &op->mask;

    switch (mask->kind) {
    case AJ_MASK_CAUSAL:
        emit(t, "causal(%s)", aj_align_names[mask->align]);
        return;
    case AJ_MASK_WINDOW:
        /* top_left is the default alignment and is left out. */
        emit(t, "window(%lld, %lld", (long long)mask->left,
             (long long)mask->right);
        if (mask->align != AJ_ALIGN_TOP_LEFT)
            emit(t, ", %s", aj_align_names[mask->align]);
        emit(t, ")");
        return;
    case AJ_MASK_EXPR:
        print_expr(t, op, mask->root);
        return;
    case AJ_MASK_NONE:
    case AJ_MASK_COUNT:
        break;
    }
    emit(t, "none");
}

/* "default", or the non-zero keys in a fixed order. */
static void print_schedule(text_buf *t, const aj_schedule *s, int32_t splits,
                           int32_t warpgroups, int32_t producer)
{
    const struct { const char *key; int32_t value; } keys[] = {
        { "block_m", s->block_m }, { "block_n", s->block_n },
        { "warps", s->warps }, { "stages", s->stages }, { "splits", splits },
        { "warpgroups", warpgroups }, { "producer", producer },
    };
    int written = 0;

    for (size_t i = 0; i < sizeof keys / sizeof keys[0]; i++) {
        if (keys[i].value == 0)
            continue;
        emit(t, "%s%s = %d", written++ ? ", " : "(", keys[i].key,
             (int)keys[i].value);
    }
    if (written)
        emit(t, ")");
    else
        emit(t, "default");
}

/* none, softcap(C), [softcap(C) + ]alibi[(grad) | (NAME)] */
static void print_score_mod(text_buf *t, const aj_op *op)
{
    const aj_score_mod_spec *mod = &op->score_mod;
    if (mod->softcap > 0) {
        emit(t, "softcap(");
        emit_number(t, mod->softcap);
        emit(t, ")%s", mod->kind == AJ_SCORE_MOD_ALIBI ? " + " : "");
    }
    if (mod->kind == AJ_SCORE_MOD_SOFTCAP)
        return;
    emit(t, "%s", aj_score_mod_names[mod->kind]);
    if (mod->kind == AJ_SCORE_MOD_ALIBI && mod->grad)
        emit(t, "(grad)");
    if (mod->kind == AJ_SCORE_MOD_ALIBI && mod->slopes)
        emit(t, "(%s)", op->tensors[mod->slopes - 1].name);
}

static void print_value(text_buf *t, const aj_op *op, aj_field field)
{
    switch (field) {
    case AJ_FIELD_DTYPE:
        emit(t, "%s", aj_dtype_names[op->dtype]);
        return;
    case AJ_FIELD_HEAD_DIM:
        emit(t, "%d", (int)op->head_dim);
        return;
    case AJ_FIELD_HEAD_DIM_V:
        emit(t, "%d", (int)aj_op_dv(op));
        return;
    case AJ_FIELD_TENSORS:
        print_tensors(t, op);
        return;
    case AJ_FIELD_MASK:
        print_mask(t, op);
        return;
    case AJ_FIELD_SCORE_MOD:
        if (op->score_mod.kind == AJ_SCORE_MOD_EXPR) {
            print_expr(t, op, op->score_mod.root);
            return;
        }
        print_score_mod(t, op);
        return;
    case AJ_FIELD_SINKS:
        emit(t, "%s", op->sinks ? op->tensors[op->sinks - 1].name : "none");
        return;
    case AJ_FIELD_SCALE:
        if (op->scale == AJ_SCALE_DEFAULT)
            emit(t, "default");
        else
            emit_number(t, op->scale);
        return;
    case AJ_FIELD_DROPOUT:
        emit_number(t, op->dropout);
        return;
    case AJ_FIELD_BIAS:
        emit(t, "%s", aj_bias_names[op->bias]);
        return;
    case AJ_FIELD_LAYOUT:
        emit(t, "%s", aj_layout_names[op->layout]);
        return;
    case AJ_FIELD_Q_DTYPE:
        emit(t, "%s", aj_dtype_names[aj_op_q_dtype(op)]);
        return;
    case AJ_FIELD_KV_DTYPE:
        emit(t, "%s", aj_dtype_names[aj_op_kv_dtype(op)]);
        return;
    case AJ_FIELD_Q_LAYOUT:
        emit(t, "%s", aj_layout_names[op->q_layout]);
        return;
    case AJ_FIELD_KV_SHARED:
        emit(t, "%s", op->kv_shared ? "true" : "false");
        return;
    case AJ_FIELD_ACCUMULATE:
        emit(t, "%s", op->accumulate ? "true" : "false");
        return;
    case AJ_FIELD_DETERMINISTIC:
        emit(t, "%s", op->deterministic ? "true" : "false");
        return;
    case AJ_FIELD_SCHEDULE:
        print_schedule(t, &op->schedule, op->splits, op->warpgroups, op->producer);
        return;
    case AJ_FIELD_TARGET:
        emit(t, "%s", aj_target_names[op->target]);
        return;
    case AJ_FIELD_HEADER:
    case AJ_FIELD_COUNT:
        break;
    }
}

/* ---------------------------------------------------------------- numbers */

/*
 * The shortest decimal that reads back as `value`, found by asking printf
 * for 1, 2, ... 17 significant digits ("%.*e"; 17 always round-trips a
 * double).  The digits and the exponent are then laid out by hand, so the
 * result does not depend on the locale's decimal point and its shape is
 * ours: fixed notation for exponents -4..15 ("30.0", "0.0001"), otherwise
 * "%g"-style scientific ("1e-05", "1.5e+20").  Only the round-trip test
 * goes through strtod, which reads printf's output in the same locale.
 */
void aj_format_number(double value, char out[AJ_NUMBER_MAX])
{
    char sci[AJ_NUMBER_MAX], digits[20];
    const char *mark, *sign = value < 0 ? "-" : "";
    int ndigits = 0, exp10, prec;

    if (isnan(value) || isinf(value)) {
        snprintf(out, AJ_NUMBER_MAX, "%s",
                 isnan(value) ? "nan" : value < 0 ? "-inf" : "inf");
        return;
    }
    if (value == 0) {              /* -0.0 too: one spelling for zero */
        snprintf(out, AJ_NUMBER_MAX, "0.0");
        return;
    }
    for (prec = 1;; prec++) {
        snprintf(sci, sizeof sci, "%.*e", prec - 1, value);
        if (prec == 17 || strtod(sci, NULL) == value)
            break;
    }

    /* sci is "[-]D[<point>DDD]e<sign>XX": keep the digits and exponent. */
    mark = strchr(sci, 'e');
    for (const char *c = sci; c < mark; c++)
        if (*c >= '0' && *c <= '9')
            digits[ndigits++] = *c;
    digits[ndigits] = '\0';
    exp10 = atoi(mark + 1);

    if (exp10 >= 16 || exp10 < -4) {
        snprintf(out, AJ_NUMBER_MAX, "%s%c%s%.*se%c%02d", sign, digits[0],
                 ndigits > 1 ? "." : "", ndigits - 1, digits + 1,
                 exp10 < 0 ? '-' : '+', abs(exp10));
    } else if (exp10 < 0) {
        /* 0.000DDD: -exp10-1 zeros after the point. */
        snprintf(out, AJ_NUMBER_MAX, "%s0.%.*s%s", sign, -exp10 - 1, "0000",
                 digits);
    } else if (ndigits > exp10 + 1) {
        /* DDD.DDD */
        snprintf(out, AJ_NUMBER_MAX, "%s%.*s.%s", sign, exp10 + 1, digits,
                 digits + exp10 + 1);
    } else {
        /* DDD000.0: pad the integer part with zeros. */
        snprintf(out, AJ_NUMBER_MAX, "%s%s%.*s.0", sign, digits,
                 exp10 + 1 - ndigits, "000000000000000");
    }
}
