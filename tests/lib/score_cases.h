/*
 * score_cases.h -- score programs for the tests (test_score.c, the backward
 * sample in test_sim_flash_bwd.c): the example specs' fields, side tensor
 * data made up for a declaration, and a generator of random well-typed
 * expressions that shrinks a failing one.
 *
 * Header-only with static functions (a failing batch is a CHECK of
 * check.h).
 */
#ifndef AJ_TESTS_SCORE_CASES_H
#define AJ_TESTS_SCORE_CASES_H

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "attnjit/attnjit.h"
#include "check.h"
#include "spec_dir.h"
#include "splitmix.h"
#include "templates/score.h"

/* ---------------------------------------------------------------- fields */

/* The value of `field = VALUE` in a spec's text (up to the end of its line
 * or a comment), "" when absent. */
static void spec_field(const char *text, const char *field, char *out, size_t cap)
{
    out[0] = '\0';
    size_t n = strlen(field);
    for (const char *line = text; line && *line; line = strchr(line, '\n') ? strchr(line, '\n') + 1 : NULL) {
        const char *p = line;
        while (*p == ' ' || *p == '\t')
            p++;
        if (strncmp(p, field, n) != 0 || (p[n] != ' ' && p[n] != '='))
            continue;
        p = strchr(p, '=');
        if (!p)
            continue;
        p++;
        while (*p == ' ')
            p++;
        size_t len = strcspn(p, "#\n");
        while (len && p[len - 1] == ' ')
            len--;
        snprintf(out, cap, "%.*s", (int)len, p);
        return;
    }
}

/* An examples/specs/scores spec: its op's info, and the text of its tensors
 * ("" when absent), mask and score_mod ("none" when absent) fields. */
typedef struct score_example {
    aj_op_info info;
    char tensors[512], mask[1024], mod[1024];
} score_example;

typedef void (*score_example_fn)(const char *name, const score_example *ex, int index,
                                 void *user);

typedef struct score_walk {
    aj_ctx *ctx;
    score_example_fn fn;
    void *user;
    int parsed;
} score_walk;

static void score_walk_file(const char *name, const char *path, const char *text, size_t len,
                            void *walk)
{
    (void)path;
    score_walk *w = walk;
    static score_example ex;
    aj_op *op = NULL;
    if (!text || aj_op_parse(w->ctx, text, len, name, &op) != AJ_OK)
        return;
    aj_op_get_info(op, &ex.info);
    aj_op_destroy(op);
    spec_field(text, "tensors", ex.tensors, sizeof ex.tensors);
    spec_field(text, "mask", ex.mask, sizeof ex.mask);
    spec_field(text, "score_mod", ex.mod, sizeof ex.mod);
    if (!ex.mask[0])
        snprintf(ex.mask, sizeof ex.mask, "none");
    if (!ex.mod[0])
        snprintf(ex.mod, sizeof ex.mod, "none");
    w->fn(name, &ex, w->parsed++, w->user);
}

/* Calls fn for every spec file of dir that parses (index: 0, 1, ... in
 * the order they come); returns the number of spec files, -1 when dir
 * cannot be opened, and in *parsed how many parsed (the parser's last
 * message on ctx). */
static inline int score_examples_each(aj_ctx *ctx, const char *dir, score_example_fn fn, void *user,
                               int *parsed)
{
    score_walk w = {ctx, fn, user, 0};
    int files = spec_dir_each(dir, score_walk_file, &w);
    *parsed = w.parsed;
    return files;
}

/* ---------------------------------------------------------------- side data */

/* Host data of the side tensors of a case. */
typedef struct side_data {
    aj_side_tensor t[AJ_OP_TENSORS_MAX];
    void *mem[AJ_OP_TENSORS_MAX];
    int n;
} side_data;

/* Data for each declaration of `op` for a problem of batch B, Hq heads and
 * sequence length S: doc (B, S) sorted document ids; prefix (B) lengths in
 * 0..S; rel (Hq, 65) and slopes (Hq) as their examples read them; snk
 * (Hq: learned sinks' logits, in [-1, 1]); any other tensor 7 per dim, i32
 * in -2..9 or float in [-1, 1] (f16 / bf16: rounded to nearest even and
 * stored in its 2 bytes). */
static inline void side_make(const aj_op_info *op, int B, int H, int S, uint64_t seed, side_data *d)
{
    memset(d, 0, sizeof *d);
    uint64_t rng = seed;
    for (int i = 0; i < op->num_tensors; i++) {
        const aj_side_decl *decl = &op->tensors[i];
        aj_side_tensor *t = &d->t[d->n];
        t->name = decl->name;
        t->dtype = decl->dtype;
        t->rank = decl->rank;
        for (int k = 0; k < decl->rank; k++)
            t->shape[k] = 7;
        if (strcmp(decl->name, "doc") == 0 && decl->rank == 2)
            t->shape[0] = B, t->shape[1] = S;
        else if (strcmp(decl->name, "prefix") == 0 && decl->rank == 1)
            t->shape[0] = B;
        else if (strcmp(decl->name, "rel") == 0 && decl->rank == 2)
            t->shape[0] = H, t->shape[1] = 65;
        else if ((strcmp(decl->name, "slopes") == 0 || strcmp(decl->name, "snk") == 0) &&
                 decl->rank == 1)
            t->shape[0] = H;
        int64_t n = 1;
        for (int k = decl->rank - 1; k >= 0; k--) {
            t->strides[k] = n;
            n *= t->shape[k];
        }
        d->mem[d->n] = calloc((size_t)n, 4);
        int32_t *iv = d->mem[d->n];
        float *fv = d->mem[d->n];
        for (int64_t e = 0; e < n; e++) {
            uint64_t r = splitmix_next(&rng);
            if (strcmp(decl->name, "doc") == 0)   /* a new document now and then */
                iv[e] = e % S == 0 ? 0 : iv[e - 1] + (r % 9 == 0);
            else if (strcmp(decl->name, "prefix") == 0)
                iv[e] = (int32_t)(r % (uint64_t)(S + 1));
            else if (strcmp(decl->name, "slopes") == 0)
                fv[e] = (float)pow(2.0, -8.0 * (double)(e + 1) / (double)H);
            else if (decl->dtype == AJ_SIDE_I32)
                iv[e] = (int32_t)(r % 12) - 2;
            else
                fv[e] = (float)((double)(r >> 11) / 9007199254740992.0 * 2.0 - 1.0);
        }
        if (decl->dtype == AJ_SIDE_F16 || decl->dtype == AJ_SIDE_BF16) {
            void *narrow = malloc((size_t)n * 2);
            CHECK(narrow && aj_convert(fv, AJ_DTYPE_F32, narrow, decl->dtype == AJ_SIDE_F16
                                       ? AJ_DTYPE_F16 : AJ_DTYPE_BF16, (size_t)n) == AJ_OK);
            free(d->mem[d->n]);
            d->mem[d->n] = narrow;
        }
        t->data = d->mem[d->n];
        d->n++;
    }
}

/* The random cases' side tensors: ti (i32) and tf, whose float dtype the
 * run picks (the suite's runs take each of f32, f16 and bf16). */
static inline const char *rx_tensors(aj_side_dtype tf)
{
    switch (tf) {
    case AJ_SIDE_F16: return "(ti: i32[2], tf: f16[1])";
    case AJ_SIDE_BF16: return "(ti: i32[2], tf: bf16[1])";
    default: return "(ti: i32[2], tf: f32[1])";
    }
}

static inline void side_free(side_data *d)
{
    for (int i = 0; i < d->n; i++)
        free(d->mem[i]);
    d->n = 0;
}

/* ---------------------------------------------------------------- random */

/*
 * Random expressions as trees, so that a failing one can shrink: a node is
 * an operator over up to 3 children or a leaf of text.  Types: 'b' bool,
 * 'i' int, 'f' float.  The generator keeps values tame (no exp of large
 * numbers, no log or sqrt of negatives) so that the reference and the
 * kernels meet no NaN of their own making; a score_mod stays within a few
 * units of the score.
 */
#define RX_MAX 512

typedef struct rx_node {
    char type;
    const char *fmt;          /* printf-like: %0 %1 %2 are the children */
    int kids[3], nkids;
    char leaf[24];
} rx_node;

typedef struct rx_tree {
    rx_node n[RX_MAX];
    int count;
    uint64_t rng;
    bool score;               /* `score` may appear: a score_mod, else a mask */
    int index;                /* the case's number (rx_case_tree) */
} rx_tree;

static int rx_add(rx_tree *t, char type, const char *fmt, int nk, int a, int b, int c)
{
    if (t->count == RX_MAX)
        return -1;
    rx_node *n = &t->n[t->count];
    memset(n, 0, sizeof *n);
    n->type = type;
    n->fmt = fmt;
    n->nkids = nk;
    n->kids[0] = a, n->kids[1] = b, n->kids[2] = c;
    return t->count++;
}

static int rx_leaf(rx_tree *t, char type, const char *text)
{
    int id = rx_add(t, type, NULL, 0, -1, -1, -1);
    if (id >= 0)
        snprintf(t->n[id].leaf, sizeof t->n[id].leaf, "%s", text);
    return id;
}

static int rx_pick(rx_tree *t, int n)
{
    return (int)(splitmix_next(&t->rng) % (uint64_t)n);
}

static int rx_gen(rx_tree *t, char type, int depth);

/* the smallest expression of a type: what a shrink puts in a node's place */
static int rx_simplest(rx_tree *t, char type)
{
    return rx_leaf(t, type, type == 'b' ? "true" : type == 'i' ? "k" : t->score ? "score" : "0.5");
}

static int rx_int(rx_tree *t, int depth)
{
    static const char *const vars[] = {"q", "k", "b", "h", "sq", "sk"};
    char lit[24];
    if (depth <= 0 || rx_pick(t, 4) == 0) {
        switch (rx_pick(t, 4)) {
        case 0:
            snprintf(lit, sizeof lit, "%d", rx_pick(t, 19) - 6);
            return rx_leaf(t, 'i', lit);
        case 1:   /* a load mostly in range (7 x 7), sometimes past it */
            return rx_leaf(t, 'i', rx_pick(t, 2) ? "ti[h, k % 8]" : "ti[b + 1, q % 9 - 1]");
        default:
            return rx_leaf(t, 'i', vars[rx_pick(t, 6)]);
        }
    }
    static const char *const bin[] = {"(%0 + %1)", "(%0 - %1)", "min(%0, %1)", "max(%0, %1)"};
    switch (rx_pick(t, 9)) {
    case 0: case 1: case 2:
        return rx_add(t, 'i', bin[rx_pick(t, 4)], 2, rx_int(t, depth - 1), rx_int(t, depth - 1), -1);
    case 8: {   /* bit operators; shifts by counts of every class (< 0, >= 64) */
        static const char *const bits[] = {"(%0 & %1)", "(%0 | %1)", "(%0 ^ %1)", "~%0",
                                           "(%0 << %1)", "(%0 >> %1)", "(%0 << 62)",
                                           "(%0 >> 70)", "(%0 << -2)", "(%0 >> (k - q))"};
        return rx_add(t, 'i', bits[rx_pick(t, 10)], 2, rx_int(t, depth - 1),
                      rx_int(t, depth - 1), -1);
    }
    case 3: {   /* floor division and modulo by a small literal of either sign */
        static const char *const dm[] = {"(%0 / 3)", "(%0 % 5)", "(%0 / -4)", "(%0 % -3)", "(%0 * 2)"};
        return rx_add(t, 'i', dm[rx_pick(t, 5)], 1, rx_int(t, depth - 1), -1, -1);
    }
    case 4:
        return rx_add(t, 'i', "abs(%0)", 1, rx_int(t, depth - 1), -1, -1);
    case 5:
        return rx_add(t, 'i', "clamp(%0, %1, %2)", 3, rx_int(t, depth - 1), rx_int(t, 0),
                      rx_int(t, 0));
    case 6:
        return rx_add(t, 'i', "(%0 ? %1 : %2)", 3, rx_gen(t, 'b', depth - 1),
                      rx_int(t, depth - 1), rx_int(t, depth - 1));
    default:   /* a load, in or out of range */
        return rx_add(t, 'i', "ti[%0, %1]", 2, rx_int(t, depth - 1), rx_int(t, depth - 1), -1);
    }
}

static int rx_float(rx_tree *t, int depth)
{
    char lit[24];
    if (depth <= 0 || rx_pick(t, 5) == 0) {
        int pick = rx_pick(t, 3);
        if (t->score && pick == 0)
            return rx_leaf(t, 'f', "score");
        if (pick == 1)
            return rx_leaf(t, 'f', rx_pick(t, 2) ? "tf[q - k]" : "tf[(q + k) % 9]");
        snprintf(lit, sizeof lit, "%.2f", (double)(rx_pick(t, 41) - 20) / 10.0);
        return rx_leaf(t, 'f', lit);
    }
    switch (rx_pick(t, 9)) {
    case 0: case 1:
        return rx_add(t, 'f', rx_pick(t, 2) ? "(%0 + %1)" : "(%0 - %1)", 2,
                      rx_float(t, depth - 1), rx_float(t, depth - 1), -1);
    case 2:
        return rx_add(t, 'f', "(%0 * tanh(%1))", 2, rx_float(t, depth - 1),
                      rx_float(t, depth - 1), -1);
    case 3: {
        static const char *const un[] = {
            "tanh(%0)", "abs(%0)", "floor(%0)", "exp(-abs(%0))", "log(abs(%0) + 1.0)",
            "sqrt(abs(%0))", "-%0", "sin(%0)", "cos(%0 * 3.0)", "tan(clamp(%0, -1.3, 1.3))",
            "sigmoid(%0 * 2.0)", "erf(%0)", "exp2(-abs(%0))", "log2(abs(%0) + 0.5)",
            "pow(%0, 2)", "pow(clamp(%0, -2.0, 2.0), 5)", "pow(abs(%0) + 0.5, -2)"};
        return rx_add(t, 'f', un[rx_pick(t, 17)], 1, rx_float(t, depth - 1), -1, -1);
    }
    case 4:
        return rx_add(t, 'f', rx_pick(t, 2) ? "min(%0, %1)" : "max(%0, %1)", 2,
                      rx_float(t, depth - 1), rx_float(t, depth - 1), -1);
    case 5:   /* ints promote; keep them small */
        return rx_add(t, 'f', "(0.05 * %0)", 1, rx_int(t, depth - 1), -1, -1);
    case 6:
        return rx_add(t, 'f', "(%0 ? %1 : %2)", 3, rx_gen(t, 'b', depth - 1),
                      rx_float(t, depth - 1), rx_float(t, depth - 1));
    case 7:
        return rx_add(t, 'f', "clamp(%0, -2.0, 2.0)", 1, rx_float(t, depth - 1), -1, -1);
    default:
        return rx_add(t, 'f', "tf[%0]", 1, rx_int(t, depth - 1), -1, -1);
    }
}

static int rx_bool(rx_tree *t, int depth)
{
    static const char *const cmp[] = {"(%0 < %1)", "(%0 <= %1)", "(%0 > %1)", "(%0 >= %1)",
                                      "(%0 == %1)", "(%0 != %1)"};
    if (depth <= 0 || rx_pick(t, 5) == 0)
        return rx_add(t, 'b', cmp[rx_pick(t, 6)], 2, rx_int(t, 1), rx_int(t, 1), -1);
    switch (rx_pick(t, 6)) {
    case 0: case 1:
        return rx_add(t, 'b', rx_pick(t, 2) ? "(%0 && %1)" : "(%0 || %1)", 2,
                      rx_bool(t, depth - 1), rx_bool(t, depth - 1), -1);
    case 2:
        return rx_add(t, 'b', "!%0", 1, rx_bool(t, depth - 1), -1, -1);
    case 3:
        return rx_add(t, 'b', cmp[rx_pick(t, 6)], 2, rx_float(t, depth - 1),
                      rx_float(t, depth - 1), -1);
    default:
        return rx_add(t, 'b', cmp[rx_pick(t, 6)], 2, rx_int(t, depth - 1),
                      rx_int(t, depth - 1), -1);
    }
}

static int rx_gen(rx_tree *t, char type, int depth)
{
    int id = type == 'b' ? rx_bool(t, depth) : type == 'i' ? rx_int(t, depth) : rx_float(t, depth);
    return id < 0 ? rx_simplest(t, type) : id;
}

static void rx_print(const rx_tree *t, int id, char *out, size_t cap)
{
    const rx_node *n = &t->n[id];
    if (!n->fmt) {
        snprintf(out, cap, "%s", n->leaf);
        return;
    }
    size_t len = 0;
    out[0] = '\0';
    for (const char *f = n->fmt; *f && len + 1 < cap; f++) {
        if (f[0] == '%' && f[1] >= '0' && f[1] <= '2') {
            rx_print(t, n->kids[f[1] - '0'], out + len, cap - len);
            len += strlen(out + len);
            f++;
        } else {
            out[len++] = *f;
            out[len] = '\0';
        }
    }
}

/* A field from a random body: a mask with a causal floor (so that most
 * rows keep keys) or a score_mod that stays near the score. */
static void rx_wrap(const char *body, bool score_mod, char *out, size_t cap)
{
    if (score_mod)
        snprintf(out, cap, "expr(score + 0.5 * tanh(%s))", body);
    else
        snprintf(out, cap, "expr(k <= q && (%s || k + 2 >= q))", body);
}

/* The field of the tree at root (rx_wrap). */
static void rx_expression(rx_tree *t, int root, bool score_mod, char *out, size_t cap)
{
    char body[4096];
    rx_print(t, root, body, sizeof body);
    rx_wrap(body, score_mod, out, cap);
}

/*
 * Shrinks a failing expression: replaces one node at a time by the
 * simplest leaf of its type (a subtree by one of its children of the same
 * type first) and keeps the change while `still_fails` says the
 * expression fails.  Returns the root of the smallest failing tree.
 */
static inline int rx_shrink(rx_tree *t, int root, bool (*still_fails)(rx_tree *, int, void *),
                            void *user)
{
    for (bool changed = true; changed;) {
        changed = false;
        for (int id = 0; id < t->count && !changed; id++) {
            rx_node *n = &t->n[id];
            if (!n->fmt)
                continue;
            rx_node saved = *n;
            for (int c = 0; c <= n->nkids && !changed; c++) {
                /* c < nkids: the node becomes its child c; c == nkids: a leaf */
                if (c < saved.nkids) {
                    if (t->n[saved.kids[c]].type != saved.type)
                        continue;
                    *n = t->n[saved.kids[c]];
                } else {
                    int leaf = rx_simplest(t, saved.type);
                    if (leaf < 0)
                        break;
                    *n = t->n[leaf];
                }
                if (still_fails(t, root, user))
                    changed = true;
                else
                    *n = saved;
            }
        }
    }
    return root;
}

typedef bool (*rx_fails_fn)(rx_tree *t, int root, void *user);

/* Random case i of a sweep from `seed` in *t: a mask for even i and a
 * score_mod for odd i (t->score), a tree of depth 4 drawn from seed + i;
 * returns its root. */
static int rx_case_tree(rx_tree *t, uint64_t seed, int i)
{
    memset(t, 0, sizeof *t);
    t->rng = seed + (uint64_t)i;
    t->index = i;
    t->score = i % 2 == 1;
    return rx_gen(t, t->score ? 'f' : 'b', 4);
}

/* ---------------------------------------------------------------- batches */

/*
 * One compile serves many random cases: a batch's field dispatches on the
 * plane, so the case in slot p is the expression of plane (b, h) = (p / 4,
 * p % 4) of a problem of RX_BATCH_B batches and RX_BATCH_H query heads
 * (the tests run GQA 2:1 over it), and a plane past the batch's count
 * takes the default body (true / 0.0):
 *
 *   b < 1 ? (h < 2 ? (h < 1 ? E0 : E1) : (h < 3 ? E2 : E3))
 *         : (h < 2 ? (h < 1 ? E4 : E5) : (h < 3 ? E6 : E7))
 *
 * wrapped once (rx_wrap).  Within a plane b and h are constants, so the
 * tile classes and block masks see each case's own structure.  The
 * batch fills until 8 cases or until the next would break the limits on
 * nodes and depth (ir/expr.h; the score program's with its derivative),
 * checked by building the program (rx_batch_fits).
 */
#define RX_BATCH_B 2
#define RX_BATCH_H 4
#define RX_BATCH_PLANES (RX_BATCH_B * RX_BATCH_H)

typedef struct rx_batch {
    rx_tree t[RX_BATCH_PLANES];   /* slot p's case; t[p].index its number */
    int root[RX_BATCH_PLANES];
    int count;                    /* slots in use */
    bool score;                   /* score_mods, else masks */
} rx_batch;

/* The dispatch over planes lo .. hi-1 (a power-of-two range), appended. */
static void rx_dispatch(const rx_batch *b, int lo, int hi, char *out, size_t cap)
{
    size_t len = strlen(out);
    if (lo >= b->count || hi - lo == 1) {
        if (lo >= b->count)
            snprintf(out + len, cap - len, "%s", b->score ? "0.0" : "true");
        else
            rx_print(&b->t[lo], b->root[lo], out + len, cap - len);
        return;
    }
    int mid = (lo + hi) / 2;
    if (mid % RX_BATCH_H == 0)
        snprintf(out + len, cap - len, "(b < %d ? ", mid / RX_BATCH_H);
    else
        snprintf(out + len, cap - len, "(h < %d ? ", mid % RX_BATCH_H);
    rx_dispatch(b, lo, mid, out, cap);
    len = strlen(out);
    snprintf(out + len, cap - len, " : ");
    rx_dispatch(b, mid, hi, out, cap);
    len = strlen(out);
    snprintf(out + len, cap - len, ")");
}

/* The batch's field: expr(...) of the dispatch, wrapped as one case's. */
static void rx_batch_field(const rx_batch *b, char *out, size_t cap)
{
    static char body[32768];
    body[0] = '\0';
    rx_dispatch(b, 0, RX_BATCH_PLANES, body, sizeof body);
    rx_wrap(body, b->score, out, cap);
}

/* Whether the batch's field, with `tensors` declared (and a score_mod's
 * causal mask), parses and its score program (templates/score.h, the
 * derivative included) fits the node arena. */
static bool rx_batch_fits(aj_ctx *ctx, const char *tensors, const rx_batch *b)
{
    static char field[33000], spec[68000];
    aj_score_prog prog;
    rx_batch_field(b, field, sizeof field);
    snprintf(spec, sizeof spec, "attention backward efficient { dtype = f16 head_dim = 16 "
             "tensors = %s mask = %s score_mod = %s }", tensors,
             b->score ? "causal(top_left)" : field, b->score ? field : "none");
    aj_op *op = NULL;
    if (aj_op_parse(ctx, spec, strlen(spec), "batch", &op) != AJ_OK)
        return false;
    bool fits = aj_score_prog_init(ctx, op, &prog) == AJ_OK;
    if (fits)
        aj_score_prog_free(&prog);
    aj_op_destroy(op);
    return fits;
}

/* How a test runs batches and single cases (rx_batch_cases). */
typedef struct rx_batch_runner {
    aj_ctx *ctx;                  /* for the parse probes */
    const char *tensors;          /* the cases' `tensors` field */
    bool (*batch_fails)(rx_batch *b, void *user);
    rx_fails_fn fails;            /* one case alone (and each shrink step) */
    void (*failed)(rx_tree *t, int root, void *user);   /* its smallest failing tree */
    void *user;
    const char *what;             /* "forward", "backward": for the messages */
} rx_batch_runner;

/* Runs the batch; when it fails, each of its cases alone, and a failing
 * one shrinks (rx_shrink).  Returns how many failures it reported. */
static int rx_batch_flush(rx_batch *b, const rx_batch_runner *r, int *launches)
{
    if (b->count == 0 || (++*launches, !r->batch_fails(b, r->user)))
        return 0;
    int n = 0;
    for (int p = 0; p < b->count; p++)
        if (r->fails(&b->t[p], b->root[p], r->user)) {
            n++;
            r->failed(&b->t[p], rx_shrink(&b->t[p], b->root[p], r->fails, r->user), r->user);
        }
    if (n == 0) {   /* the batch alone fails: its whole field */
        static char field[33000];
        rx_batch_field(b, field, sizeof field);
        CHECK_MSG(0, "random %s batch from case %d fails, each of its %d cases alone "
                  "passes:\n  tensors = %s\n  %s = %s", r->what, b->t[0].index, b->count,
                  r->tensors, b->score ? "score_mod" : "mask", field);
        n = 1;
    }
    return n;
}

/*
 * `count` random cases (rx_case_tree from seed) run in batches: the masks
 * together, the score_mods together, up to RX_BATCH_PLANES per launch.
 * A failing batch falls back to its cases one by one, each failing one
 * shrunk (rx_shrink) and reported with its smallest failing tree.
 * Returns how many failed; *launches says how many batches ran.
 */
static inline int rx_batch_cases(rx_batch *b, int count, uint64_t seed, const rx_batch_runner *r,
                          int *launches)
{
    int failed = 0;
    *launches = 0;
    for (int kind = 0; kind < 2; kind++) {
        b->count = 0;
        b->score = kind == 1;
        for (int i = kind; i < count; i += 2) {
            int p = b->count++;
            b->root[p] = rx_case_tree(&b->t[p], seed, i);
            if (p > 0 && !rx_batch_fits(r->ctx, r->tensors, b)) {
                b->count--;   /* over the limits: case i opens the next batch */
                failed += rx_batch_flush(b, r, launches);
                b->t[0] = b->t[p];
                b->root[0] = b->root[p];
                b->count = 1;
            }
            if (b->count == RX_BATCH_PLANES) {
                failed += rx_batch_flush(b, r, launches);
                b->count = 0;
            }
        }
        failed += rx_batch_flush(b, r, launches);
    }
    return failed;
}

#endif /* AJ_TESTS_SCORE_CASES_H */
