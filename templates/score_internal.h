/*
 * score_internal.h -- what the score module's files share (internal to
 * templates/score_*.c; score.h is the module's interface):
 *
 *   score_prog.c   programs: built-ins -> programs (aj_expr_builtin_text),
 *                  expressions copied from the op; d mod / d score by
 *                  differentiation; the mask's conjuncts split into the
 *                  band and the rest
 *   score_emit.c   emission: a node -> LLVM values (i64, f32, i1; or
 *                  <W x ...>), the side tensors' loads and parameters
 *   score_ival.c   the interval rules: a node -> its range, over a value
 *                  domain whose two backends are the next two files'
 *   score_tiles.c  tiles: the rules emitted (aj_score_tile_class), and
 *                  the tile walks
 *   score_host.c   host: the same rules on host values
 *                  (aj_score_host_class)
 */
#ifndef AJ_TEMPLATES_SCORE_INTERNAL_H
#define AJ_TEMPLATES_SCORE_INTERNAL_H

#include "templates/score.h"

#define NONE AJ_EXPR_NONE
#define OFFSET_CLAMP (1 << 30)
/* The interval arithmetic's unknown int, [-2^62, 2^62] (sums saturate),
 * and the largest box of a side tensor a load's interval reads
 * (score_ival.c and its backends). */
#define UNKNOWN_INT (INT64_C(1) << 62)
#define SCAN_MAX 4096

static inline const aj_expr_node *node(const aj_score_prog *p, uint16_t id)
{
    return &p->e.nodes[id];
}

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
    const aj_score_bias *bias; /* the bias leaf's value, NULL: none (begin_mod) */
    LLVMValueRef *memo;        /* vmemo, or umemo while a uniform node is emitted */
    LLVMValueRef *vmemo;       /* by node: its value (the program's e.count of them) */
    LLVMValueRef *umemo;       /* scalar values of uniform nodes */
} emitter;

/* The bytes of an emitter's memos for programs of `count` nodes. */
static inline size_t emitter_memo_bytes(int count)
{
    return 2 * (size_t)count * sizeof(LLVMValueRef);
}

/* An emission at (i, j) whose memos are `memos` (emitter_memo_bytes of
 * the program's node count), all empty. */
static inline void emitter_init(emitter *m, void *memos, aj_score *s, int lanes, LLVMValueRef i,
                                LLVMValueRef j, LLVMValueRef score)
{
    int count = s->p->e.count;
    memset(m, 0, sizeof *m);
    memset(memos, 0, emitter_memo_bytes(count));
    m->s = s;
    m->lanes = lanes;
    m->i = i;
    m->j = j;
    m->score = score;
    m->vmemo = memos;
    m->umemo = m->vmemo + count;
    m->memo = m->vmemo;
}

static inline LLVMValueRef to_i64(aj_kb *kb, LLVMValueRef v)
{
    return LLVMTypeOf(v) == kb->t_i64 ? v : LLVMBuildSExt(kb->b, v, kb->t_i64, "");
}

LLVMValueRef aj_score_emit_math(emitter *m, aj_expr_op op, LLVMValueRef a);
/* Side tensor d's element type in memory (aj_score_side_storage), a raw
 * element (scalar or vector) as the programs read it (i32 sign-extended
 * to i64, a 16-bit float widened exactly to f32: aj_score_side_value),
 * and the element at offset `at` (i64, elements; aj_score_side_load). */
LLVMTypeRef aj_score_side_storage(aj_kb *kb, const aj_tensor_decl *d);
LLVMValueRef aj_score_side_value(aj_kb *kb, const aj_tensor_decl *d, LLVMValueRef raw);
LLVMValueRef aj_score_side_load(aj_kb *kb, const aj_tensor_decl *d, LLVMValueRef at);

LLVMValueRef aj_score_emit_node(emitter *m, uint16_t id);
LLVMValueRef aj_score_floor_divmod(emitter *m, LLVMValueRef x, LLVMValueRef y, int want_mod);

/*
 * The interval rules (score_ival.c) over a value domain with two
 * backends: emitted LLVM values (kb set: i64, f32 and i1 bounds) or host
 * scalars (kb NULL: i, f or b by the node's type).  A bool's interval is
 * (may be false, may be true).
 */
typedef struct dval {
    LLVMValueRef v;   /* the IR backend's */
    int64_t i;        /* the host's, by type */
    float f;
    bool b;
} dval;

typedef struct ival {
    dval lo, hi;
} ival;

typedef struct ival_ctx {
    aj_kb *kb;                 /* the IR backend; NULL: the host */
    emitter *pt;               /* the IR backend's point values */
    const aj_score_prog *p;
    /* the reads that make a node a range, not a point: positions, and on
     * the host b or h for any batch or head, loads without tensor data */
    uint16_t positional;
    ival q, k;                 /* the positions' ranges (i64) */
    bool bh;                   /* b and h are the ranges b, h (host: a launch's) */
    ival b, h;
    ival (*point)(struct ival_ctx *c, uint16_t id);   /* a point node's value */
    ival (*load)(struct ival_ctx *c, const aj_expr_node *n, const ival *idx);
    ival *memo;                /* by node (the program's e.count of each) */
    bool *done;
} ival_ctx;

/* The bytes of an ival_ctx's memo and done for `count` nodes. */
static inline size_t ival_memo_bytes(int count)
{
    return (size_t)count * (sizeof(ival) + sizeof(bool));
}

/* Points c's memo and done into `mem` (ival_memo_bytes), all not done. */
static inline void ival_memo_init(ival_ctx *c, void *mem, int count)
{
    c->memo = mem;
    c->done = (bool *)(c->memo + count);
    memset(c->done, 0, (size_t)count * sizeof(bool));
}

ival aj_ival_node(ival_ctx *c, uint16_t id);

/* Whether the rules bound node n (which reads a position) from its
 * operands' intervals alone: not a load (data), not a product, quotient,
 * remainder or shift by a position, not an operator compute() has no
 * rule for.  The one list of what the rules cover, beside them. */
bool aj_ival_by_positions(const aj_score_prog *p, const aj_expr_node *n);

/* Structural hashes of the programs' nodes (score_prog.c): equal for
 * equal trees, which the parser does not share (two `q - k` are two
 * nodes).  aj_score_node_hash is one node's from its operator, type, leaf
 * (a literal's bits, a variable, a load's tensor; else 0) and operands'
 * hashes; aj_score_hash_nodes fills hs[id] for every node; aj_score_mix
 * is their step. */
uint64_t aj_score_mix(uint64_t h, uint64_t v);
uint64_t aj_score_node_hash(int op, int type, uint64_t leaf, const uint64_t *args, int n);
void aj_score_hash_nodes(const aj_score_prog *p, uint64_t *hs);
ival aj_ival_unknown(ival_ctx *c, aj_expr_type t);

/* The calls that keep an emitter in aj_score.scratch: one each, reused by
 * every call of its kind (a call of one kind may run inside another's). */
enum score_scratch_slot {
    SLOT_BAND, SLOT_MOD, SLOT_GRAD, SLOT_REST, SLOT_VISIBLE,
    SLOT_FIX_ROWS, SLOT_FIX_COLS, SLOT_TILE_CLASS, SLOT_COUNT
};
_Static_assert(SLOT_COUNT <= sizeof(((aj_score *)0)->scratch) / sizeof(void *), "score scratch");

/* Slot `slot`'s scratch of `bytes`, made on first use; NULL when out of
 * memory (the builder then failed). */
static inline void *score_scratch(aj_score *s, int slot, size_t bytes)
{
    if (!s->scratch[slot])
        s->scratch[slot] = aj_kb_scratch(s->kb, bytes);
    return s->scratch[slot];
}

/* Slot `slot`'s emitter, at (i, j), with its memos after it in the
 * scratch; NULL when out of memory. */
static inline emitter *score_emitter(aj_score *s, int slot, int lanes, LLVMValueRef i,
                                     LLVMValueRef j, LLVMValueRef score)
{
    emitter *m = score_scratch(s, slot, sizeof *m + emitter_memo_bytes(s->p->e.count));
    if (m)
        emitter_init(m, m + 1, s, lanes, i, j, score);
    return m;
}

#endif /* AJ_TEMPLATES_SCORE_INTERNAL_H */
