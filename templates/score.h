/*
 * score.h -- the one home of attention semantics (docs/design.md): what a
 * score becomes and which keys a query sees, for every template and target.
 *
 * An op's mask and score_mod are programs in the IR's expression language
 * (ir/expr.h).  The built-in forms are the programs aj_expr_builtin_text
 * spells (causal(bottom_right) is `k <= q + (sk - sq)`, softcap(C) is
 * `C * tanh(score / C)`, ...), and an op's bias is the score_mod's leaf
 * `bias` (mod(score + bias)), so a template meets one kind of mask and one
 * kind of score_mod, never an enum:
 *
 *   compile time   aj_score_prog_init   the programs, d(score_mod)/d(score)
 *                                       by symbolic differentiation, and the
 *                                       mask split into a band and the rest
 *   kernel         (params.def)         the parameters the programs read
 *                  aj_score_begin       per-CTA values (b, h, origins, totals)
 *                  aj_score_mod_value   the modified score of (i, j)
 *                  aj_score_mod_grad    ... and its derivative (backward)
 *                  aj_score_compose     q.k to the score in log2 units:
 *                                       scale, score_mod (with its bias
 *                                       leaf), log2 e
 *                  aj_score_dropped     dropout's keep / (1 - p)
 *                  aj_score_p_ds        the backward's P and dS
 *                  aj_score_visible     whether key j is visible to row i
 *                  aj_score_key_range   keys rows [i0, i1] may see
 *                  aj_score_tile_class  skip / partial / full of a tile
 *                  aj_score_by_tile_class  a tile's element pass, emitted
 *                                       without tests for full tiles
 *   host           aj_score_host_class  the same class on the host (ring)
 *
 * The band: the conjuncts of the mask that bound k by q plus a value that
 * does not depend on the position,
 *
 *     k >= q + lo      k <= q + hi        (lo, hi over b, h, sq, sk, literals)
 *
 * which is every built-in mask; in local indices (q = q_origin + i,
 * k = k_origin + j) they become j >= i + lo_off and j <= i + hi_off with
 * offsets computed once per CTA and clamped to +-2^30, so that per element
 * the test runs in i32 (0 <= i, j < 2^30 is the launch contract).  The
 * rest of the mask is evaluated per element as written, and per tile by
 * interval arithmetic over the tile's positions, which is exact for sums
 * and differences of positions, floor division by a constant and
 * comparisons of them (chunked and prefix masks); a load over a range of
 * positions reads the tensor over that box (up to 4096 elements) and takes
 * the hull of its values, which decides a document mask's tiles; where it
 * cannot tell it says "partial".
 *
 * Positions, totals and b, h are i64 in the programs; local indices i, j
 * are i32 (scalar), or j an <W x i32> (the cpu kernels' vectors: a value
 * that reads k or the score is computed per lane, any other once and
 * splat; i stays a scalar).
 */
#ifndef AJ_TEMPLATES_SCORE_H
#define AJ_TEMPLATES_SCORE_H

#include "codegen/kbuilder.h"
#include "ir/expr.h"
#include "ir/op.h"

/* Tile classes: aj_tile_class (attnjit.h). */

/* Loads of grad tensors a score_mod may have (each a derivative). */
#define AJ_SCORE_GRADS_MAX 32

/* The programs of an op (no pointers into the op; its arena and reads
 * are its own, freed by aj_score_prog_free: a copy by value shares them). */
typedef struct aj_score_prog {
    aj_expr e;
    /* side tensors the programs read, in load order: the op's declared
     * tensors, then alibi's slopes (named "alibi_slopes") */
    aj_tensor_decl tensors[AJ_OP_TENSORS_MAX + 1];
    int tensor_count;
    /* score_mod, AJ_EXPR_NONE: the identity; an op with a bias (bias =
     * add) reads `score` as `biased`: mod(score + bias) */
    uint16_t mod;
    uint16_t biased;       /* score + bias, AJ_EXPR_NONE: the op has no bias */
    uint16_t dmod;         /* d mod / d score, AJ_EXPR_NONE: 1 */
    uint16_t band_lo;      /* k >= q + band_lo, AJ_EXPR_NONE: unbounded */
    uint16_t band_hi;      /* k <= q + band_hi, AJ_EXPR_NONE: unbounded */
    uint16_t rest;         /* the other conjuncts, AJ_EXPR_NONE: none */
    bool reads_totals;     /* sq or sk appear: the kernel takes the totals */
    bool rest_reads_tensors; /* the rest's tile classes cannot be told from positions */
    /* the rest is one interval arithmetic cannot bound (a load: data; a
     * product, quotient or remainder of two positions), in a padded op:
     * the kernels take a block mask (params.def's block_mask) and read the
     * classes of their tiles from it */
    bool block_mask;
    bool mask_reads_b, mask_reads_h;   /* classes may differ by batch index, head */
    /* the mask or the score_mod reads h (alibi's slopes[h] too): the
     * kernel takes head_offset, the global head of its head 0 */
    bool reads_h;
    /* the op's learned sinks: their tensor's index in tensors, -1: none
     * (an op with sinks reads h: the kernel takes head_offset) */
    int sinks;
    /* what each node's tree reads: AJ_SCORE_READS(var) bits,
     * AJ_SCORE_READS_LOAD; e.count of them (owned, as e's nodes) */
    uint16_t *reads;
    /* the pipeline's constants (aj_score_compose): q.k's scale, dropout's p */
    double scale, dropout;
    /* Gradients of side tensors (a backward's; docs/design.md "Gradients
     * of side tensors"): the op's grad tensors (bit t), and the loads of
     * one whose value reaches the score_mod's, each with d mod / d load
     * (a node: the derivative of the mod with that load a variable) */
    uint32_t tensor_grad;
    int num_grads;
    struct {
        uint16_t load, d;
    } grads[AJ_SCORE_GRADS_MAX];
} aj_score_prog;

#define AJ_SCORE_READS(var) ((uint16_t)(1u << (var)))
#define AJ_SCORE_READS_LOAD ((uint16_t)(1u << AJ_VAR_COUNT))
#define AJ_SCORE_READS_POSITION (AJ_SCORE_READS(AJ_VAR_Q) | AJ_SCORE_READS(AJ_VAR_K))
/* what a node's tree reads that changes with the key: a node reading
 * neither has one value for a whole row (every lane of a cpu vector) */
#define AJ_SCORE_READS_KEY \
    (AJ_SCORE_READS(AJ_VAR_K) | AJ_SCORE_READS(AJ_VAR_SCORE) | AJ_SCORE_READS(AJ_VAR_BIAS))

/* Builds the programs of `op` (verified).  AJ_ERR_UNSUPPORTED when the
 * derivative does not fit the node arena (the message says so); on an
 * error p holds nothing to free. */
aj_status aj_score_prog_init(aj_ctx *ctx, const aj_op *op, aj_score_prog *p);
/* Frees what aj_score_prog_init made (p itself is the caller's). */
void aj_score_prog_free(aj_score_prog *p);
/* The programs of `op` in the builder's scratch (freed with it); *out
 * NULL when out of memory. */
aj_status aj_score_prog_scratch(aj_kb *kb, const aj_op *op, const aj_score_prog **out);
/* Whether the programs of `op` can be built (aj_score_prog_init's status
 * and message), for a template's check, which keeps none of them. */
aj_status aj_score_prog_check(aj_ctx *ctx, const aj_op *op);

/* A hash of the mask's programs (band and rest) and the tensors they may
 * read: equal for two ops whose masks are the same program (a forward and
 * its backward), so a block mask can tell the op it was built for. */
uint64_t aj_score_mask_hash(const aj_score_prog *p);

/* Whether the op has a mask (anything but `none`) / a score program
 * beyond the identity (a score_mod, or a bias: score + bias). */
static inline bool aj_score_has_mask(const aj_score_prog *p)
{
    return p->band_lo != AJ_EXPR_NONE || p->band_hi != AJ_EXPR_NONE ||
           p->rest != AJ_EXPR_NONE;
}

static inline bool aj_score_has_mod(const aj_score_prog *p)
{
    return p->mod != AJ_EXPR_NONE;
}

/* Whether the program is the bias alone (mod = score + bias): its
 * derivative by the score is 1, with no chain rule to apply. */
static inline bool aj_score_mod_is_bias(const aj_score_prog *p)
{
    return p->biased != AJ_EXPR_NONE && p->mod == p->biased;
}

/* Whether the op has learned sinks (sinks = NAME). */
static inline bool aj_score_has_sinks(const aj_score_prog *p)
{
    return p->sinks >= 0;
}

/*
 * Kernel parameters the programs read (params.def declares them with the
 * kernel's others): "seq_q_total", "seq_k_total" (i64) when they use sq or
 * sk, and per side tensor NAME: "NAME" (ptr), "NAME_size<d>" and
 * "NAME_stride<d>" (i64, elements) for each dim d.  runtime/launch_bind.c binds
 * them by these names.
 *
 * The name of a side tensor's size (what = 's') or stride ('t') param. */
void aj_score_param_name(char *buf, size_t cap, const char *tensor, char what, int dim);

/* What the kernel knows per CTA (or per work item): the programs' inputs
 * that do not change along a tile. */
typedef struct aj_score {
    aj_kb *kb;
    const aj_score_prog *p;
    int lanes;                   /* 0: scalar; W: j and results are <W x ...> */
    LLVMValueRef b, h;           /* i64; h global: head_offset + the kernel's head */
    LLVMValueRef h_local;        /* i64: the kernel's head (the block mask's planes) */
    LLVMValueRef q_origin;       /* i64: q = q_origin + i */
    LLVMValueRef k_origin;       /* i64: k = k_origin + j */
    LLVMValueRef sq, sk;         /* i64 totals (NULL when unused) */
    LLVMValueRef lo_off, hi_off; /* i32 band offsets, NULL: unbounded */
    /* per node (the program's e.count of each, in the builder's scratch):
     * the values of the loads that read no position or score (alibi's
     * slopes[h]), emitted once here (scalar); NULL elsewhere */
    LLVMValueRef *loads;
    /* the block mask (prog.block_mask): its classes (NULL pointer: none
     * given, classes by interval arithmetic), the (b, h) plane's first
     * element, the row stride and its tile (i64) */
    LLVMValueRef mask_classes, mask_plane, mask_stride_m, mask_bm, mask_bn;
    /* aj_score_fix_rows: the intervals of the nodes that read q but not
     * k over the fixed rows (lo, hi by node; NULL: not fixed) */
    LLVMValueRef *row_lo, *row_hi;
    /* aj_score_fix_cols, aj_score_load_cols: the same for the nodes that
     * read k but not q over the fixed keys */
    LLVMValueRef *col_lo, *col_hi;
    /* the emitters of the score module's calls (too large for a stack),
     * one per kind of call, made on first use in the builder's scratch
     * (score_internal.h) */
    void *scratch[8];
} aj_score;

/*
 * Per-CTA set-up: b and h (i32 or i64; h the kernel's own head, to which
 * the parameter head_offset is added where the programs read h: a head
 * shard's kernel sees the global head), the origins (i64), the totals (i64,
 * NULL when the program does not read them: aj_score_prog.reads_totals).
 * lanes = 0 for scalar code (GPU targets, sim), W for the cpu kernels.
 */
void aj_score_begin(aj_score *s, aj_kb *kb, const aj_score_prog *p, int lanes, LLVMValueRef b,
                    LLVMValueRef h, LLVMValueRef q_origin, LLVMValueRef k_origin,
                    LLVMValueRef sq, LLVMValueRef sk);

/*
 * Learned sinks (docs/design.md "Sinks"), in a forward's epilogue: the
 * row's softmax denominator gains exp(sink[h]) for global head h (i64).
 * The row's log2 LSE *l2 (-inf: it saw no key) and the factor its O is
 * scaled by (*scale) become the sink-including ones, and *lse the LSE in
 * natural-log units: the merge of the row with a partial of O = 0 and
 * LSE = sink[h] (so a row that saw no key gets O = 0 and LSE = sink[h]).
 * Scalar code, on every target.  Only where a row is finished: a split-KV
 * part or a ring step leaves it to the merge that finishes the row.  The
 * kernel takes the sinks tensor (a side tensor) and head_offset.  An
 * accumulate op passes its kv_offset (i64; NULL otherwise): only the call
 * whose keys start the sequence, kv_offset = 0, folds, so that a chain
 * over disjoint key blocks counts the sink once, and the others leave l2,
 * scale and lse as they are.
 */
void aj_score_fold_sink(aj_kb *kb, const aj_score_prog *p, LLVMValueRef h,
                        LLVMValueRef kv_offset, LLVMValueRef *l2, LLVMValueRef *scale,
                        LLVMValueRef *lse);
/* The sink logit (f32, natural-log units) of global head h (i64). */
LLVMValueRef aj_score_sink(aj_kb *kb, const aj_score_prog *p, LLVMValueRef h);

/* The value of the program's bias leaf at (i, j) (the op's bias term,
 * bias = add): a value the template loaded already, or one its loader
 * gives where the program first reads it. */
typedef struct aj_score_bias {
    LLVMValueRef value;   /* the term, or NULL: load(user, i, j) gives it */
    LLVMValueRef (*load)(void *user, LLVMValueRef i, LLVMValueRef j);
    void *user;
} aj_score_bias;
LLVMValueRef aj_score_bias_at(const aj_score_bias *bias, LLVMValueRef i, LLVMValueRef j);

/* The score_mod of `score` (f32; or <W x float>) at row i, key j (local):
 * the program, whose bias leaf (an op with a bias) reads `bias`. */
LLVMValueRef aj_score_mod_value(aj_score *s, LLVMValueRef score, const aj_score_bias *bias,
                                LLVMValueRef i, LLVMValueRef j);
/* The same and, in *d, d mod / d score. */
LLVMValueRef aj_score_mod_grad(aj_score *s, LLVMValueRef score, const aj_score_bias *bias,
                               LLVMValueRef i, LLVMValueRef j, LLVMValueRef *d);

/*
 * The score pipeline (docs/design.md "The score pipeline"), one
 * composition for every template and target:
 *
 *   s2 = log2 e * mod(scale q.k, i, j)               (-inf where hidden)
 *
 * where an op's bias is the program's own: mod(score + bias).  `qk` (f32
 * or <W x float>) carries what the caller folded into Q already: nothing
 * (AJ_SCORE_RAW), the scale (AJ_SCORE_SCALED) or, for an op whose program
 * is the identity, scale and log2 e (AJ_SCORE_LOG2).  For the identity,
 * scale and log2 e are one multiplication.  `bias` gives the bias leaf's
 * value (NULL: the op has no bias).  With `dmod` (not NULL) the backward's
 * d mod / d score too (NULL there: 1).
 */
typedef enum aj_score_units { AJ_SCORE_RAW, AJ_SCORE_SCALED, AJ_SCORE_LOG2 } aj_score_units;
LLVMValueRef aj_score_compose(aj_score *s, LLVMValueRef qk, aj_score_units has,
                              const aj_score_bias *bias, LLVMValueRef i, LLVMValueRef j,
                              LLVMValueRef *dmod);
/* The same (forward) with the positions made by place(user, &i, &j) where
 * the pipeline first needs them, after the scale (a template whose element
 * positions cost instructions makes them only for a score_mod or bias). */
typedef void (*aj_score_place)(void *user, LLVMValueRef *i, LLVMValueRef *j);
LLVMValueRef aj_score_compose_at(aj_score *s, LLVMValueRef qk, aj_score_units has,
                                 const aj_score_bias *bias, aj_score_place place, void *user);
/* s2 where `visible` (i1 or <W x i1>), -inf elsewhere. */
LLVMValueRef aj_score_hide(aj_kb *kb, LLVMValueRef s2, LLVMValueRef visible);
/* Dropout's scaling of x (f32): x / (1 - p) where `keep`, 0 where dropped. */
LLVMValueRef aj_score_dropped(aj_kb *kb, double p, LLVMValueRef keep, LLVMValueRef x);
/* dS = P (dP - Delta), times the score_mod's derivative `chain` (NULL: 1)
 * where `live` and 0 elsewhere (f32 or vectors; dP dropped already). */
LLVMValueRef aj_score_ds(aj_kb *kb, LLVMValueRef p, LLVMValueRef dp, LLVMValueRef delta,
                         LLVMValueRef chain, LLVMValueRef live);

/*
 * The backward's recomputed probability and score gradient of one element
 * (row i, key j; local indices, i32), from q.k (`qk`), dO.v (`dp`), the
 * row's LSE in log2 units and Delta:
 *
 *   t = scale q.k;  s = mod(t);  P = exp(s - LSE) where `visible`
 *   dS = P (dP m - Delta) mod'(t)        m = keep / (1 - p)
 *
 * `bias` (NULL: none) is the bias leaf's value bias[b,h,i,j] (mod reads
 * score + bias), `keep` (NULL: no dropout) the forward's keep decision.
 * *p_out is the dropped P m (dV's factor); dS is the gradient of t without
 * the scale, and so of the bias leaf too (dbias).
 */
void aj_score_p_ds(aj_score *s, LLVMValueRef qk, LLVMValueRef dp, LLVMValueRef i,
                   LLVMValueRef j, LLVMValueRef lse2, LLVMValueRef delta, LLVMValueRef visible,
                   LLVMValueRef bias, LLVMValueRef keep, LLVMValueRef *p_out,
                   LLVMValueRef *ds_out);

/* Gradients of side tensors: the score_mod of `t` (scale q.k, f32; or
 * <W x float> with s->lanes; `bias` the bias leaf's) at row i, key j
 * (local) and, for
 * each of the programs' grads g, val[g] = d mod / d load_g there and at[g]
 * the element the load reads as a row-major index into its tensor's shape
 * (i64; vectors with lanes), -1 where the index falls outside the tensor
 * (the load read 0, which has no gradient).  Without a score_mod: t, and
 * no grads. */
LLVMValueRef aj_score_mod_side_grads(aj_score *s, LLVMValueRef t, const aj_score_bias *bias,
                                     LLVMValueRef i, LLVMValueRef j, LLVMValueRef *val,
                                     LLVMValueRef *at);
/* The elements of side tensor d (i64): the product of its size
 * parameters. */
LLVMValueRef aj_score_tensor_numel(aj_kb *kb, const aj_tensor_decl *d);

/* Whether the mask shows key j to row i (i1 or <W x i1>).  Keys at or past
 * the key length are the caller's to hide. */
LLVMValueRef aj_score_visible(aj_score *s, LLVMValueRef i, LLVMValueRef j);
/* The same, given that the band holds (a tile the band fully covers). */
LLVMValueRef aj_score_visible_rest(aj_score *s, LLVMValueRef i, LLVMValueRef j);
/* Whether the mask has conjuncts beyond its band. */
static inline bool aj_score_has_rest(const aj_score_prog *p)
{
    return p->rest != AJ_EXPR_NONE;
}

/* Keys the band shows some row of [i0, i1]: [*j_lo, *j_hi] (i32, local),
 * clamped to [0, seq_k - 1]; empty when *j_hi < *j_lo. */
void aj_score_key_range(aj_score *s, LLVMValueRef i0, LLVMValueRef i1, LLVMValueRef seq_k,
                        LLVMValueRef *j_lo, LLVMValueRef *j_hi);
/* Rows the band shows some key of [j0, j1]: [*i_lo, *i_hi], clamped to
 * [0, seq_q - 1]. */
void aj_score_row_range(aj_score *s, LLVMValueRef j0, LLVMValueRef j1, LLVMValueRef seq_q,
                        LLVMValueRef *i_lo, LLVMValueRef *i_hi);
/* Band offsets for row i: j <= i + hi_off, j >= i + lo_off (NULL: none). */
static inline LLVMValueRef aj_score_row_hi(aj_score *s, LLVMValueRef seq_k, LLVMValueRef i)
{
    LLVMValueRef hi = LLVMBuildSub(s->kb->b, seq_k, aj_kb_i32(s->kb, 1), "");
    return s->hi_off ? aj_kb_smin(s->kb, hi, LLVMBuildAdd(s->kb->b, i, s->hi_off, "")) : hi;
}
static inline LLVMValueRef aj_score_row_lo(aj_score *s, LLVMValueRef i)
{
    LLVMValueRef lo = aj_kb_i32(s->kb, 0);
    return s->lo_off ? aj_kb_smax(s->kb, lo, LLVMBuildAdd(s->kb->b, i, s->lo_off, "")) : lo;
}

/* Whether row i sees key j (scalar i32, local) in a tile whose class the
 * emitted code knows: in a `full` one (aj_score_by_tile_class) always;
 * otherwise where j < seq_k, i < seq_q (seq_q NULL: rows unchecked), the
 * band and the rest of the mask hold.  Each row's bound on j is one value,
 * so an element costs one compare beyond the rest. */
LLVMValueRef aj_score_visible_in_tile(aj_score *s, int full, LLVMValueRef seq_q,
                                      LLVMValueRef seq_k, LLVMValueRef i, LLVMValueRef j);

/* Emits a tile's element pass by its class: body(user, 1) where `cls` (i32
 * aj_tile_class, the same in every thread) is AJ_TILE_FULL and `inside`
 * (i1: the tile lies inside the lengths the body tests) holds, so that
 * the body tests no element at all; body(user, 0) elsewhere, and alone
 * where cls is NULL (an op without a mask tests the lengths only). */
typedef void (*aj_score_tile_body)(void *user, int full);
void aj_score_by_tile_class(aj_kb *kb, LLVMValueRef cls, LLVMValueRef inside,
                            aj_score_tile_body body, void *user);

/* The class (i32 aj_tile_class) of rows [i0, i1] x keys [j0, j1] (local,
 * inclusive, inside the lengths): the band's exactly, then the rest's by
 * interval arithmetic, or, where the op takes a block mask and the launch
 * gives one, from the mask's tiles that cover the range (skip where all
 * are, full where all are: the mask's tile need not be the kernel's).  The bounds are scalar i32 and so is the class,
 * whatever s->lanes (a vector kernel classes its tiles in scalar code). */
LLVMValueRef aj_score_tile_class(aj_score *s, LLVMValueRef i0, LLVMValueRef i1,
                                 LLVMValueRef j0, LLVMValueRef j1);

/* For a kernel that classes many tiles of rows [i0, i1] (local, scalar
 * i32): emits here, once, the intervals of the rest's nodes that read q
 * and not k (a document mask's hull of doc[b, q] over the rows), which
 * aj_score_tile_class then takes for every tile of those rows; its later
 * calls must have these rows. */
void aj_score_fix_rows(aj_score *s, LLVMValueRef i0, LLVMValueRef i1);

/* The same for keys [j0, j1]: the intervals of the rest's nodes that read
 * k and not q (doc[b, k]'s hull over a key block), which the block-mask
 * builder computes once per key block (aj_score_fix_cols), keeps in
 * memory as aj_score_col_slots(p) pairs of i64 (aj_score_save_cols, at
 * the i64 element `at` of the block mask) and reads back for each tile
 * of that key block (aj_score_load_cols, before aj_score_tile_class). */
int aj_score_col_slots(const aj_score_prog *p);
void aj_score_fix_cols(aj_score *s, LLVMValueRef j0, LLVMValueRef j1);
void aj_score_save_cols(aj_score *s, LLVMValueRef at);
void aj_score_load_cols(aj_score *s, LLVMValueRef at);

/*
 * A block mask's memory (runtime/block_mask.c builds it, docs/ir.md
 * draws it): per (b, h) plane, in i32 elements, with rows = ceil(Sq /
 * block_m) and cols = ceil(Sk / block_n) of the mask's tile,
 *
 *   classes    rows x cols         aj_tile_class of tile (m, n)
 *   row lists  rows x (cols + 1)   per row block m: count, then the
 *                                  non-skip tiles n << 2 | class, n rising
 *   col lists  cols x (rows + 1)   per key block n: count, then m << 2 |
 *                                  class, m rising (the backward's dK/dV)
 *   (pad to 8 bytes), col hulls    cols x slots pairs of i64 (the builder's)
 *   (pad to an even number of rows of cols)
 *
 * AJ_SCORE_MASK_LISTS is the row lists' offset from the plane, in i32s.
 */
/* The offset from a plane, in i32s, of a list (its count): by_keys, row
 * block `block`'s list over the key blocks; else key block `block`'s over
 * the row blocks.  aj_score_mask_list_at emits the same in IR. */
static inline int64_t aj_score_mask_list_offset(int64_t rows, int64_t cols, int by_keys,
                                                int64_t block)
{
    return rows * cols + (by_keys ? block * (cols + 1) : rows * (cols + 1) + block * (rows + 1));
}

/* aj_score_mask_list_offset's offset (i64 values) added to `plane`. */
LLVMValueRef aj_score_mask_list_at(aj_kb *kb, LLVMValueRef plane, LLVMValueRef rows,
                                   LLVMValueRef cols, int by_keys, LLVMValueRef block);

static inline int64_t aj_score_mask_plane_size(int64_t rows, int64_t cols, int slots)
{
    int64_t lists = 3 * rows * cols + rows + cols;
    int64_t size = (lists + 1) / 2 * 2 + cols * slots * 4;
    /* whole rows of cols, an even number: the plane is a [rows', cols]
     * tensor whose extent the devices check, and its hulls stay 8-byte
     * aligned */
    int64_t rows_all = (size + cols - 1) / cols;
    return (rows_all + 1) / 2 * 2 * cols;
}

/*
 * The tiles a kernel visits along one row block (keys: the forward, dQ)
 * or one key block (rows: dK/dV), for every template the same way.  Where
 * the op takes a block mask and the launch's mask has the walk's tiles
 * (its block_m x block_n, the fixed range one of its blocks), the walk
 * reads the block's list: positions 0 .. count - 1, each a non-skip tile
 * and its class, no class computed; else positions are the tiles of
 * [first, end) and each tile's class is aj_score_tile_class's.  A listed
 * tile outside [first, end) (a split of the keys) reads as skip.
 *
 *   aj_score_walk w;
 *   aj_score_walk_keys(&s, &w, i0, i1, bn, n_first, n_end, seq_q, seq_k);
 *   pos = for (w.begin .. w.end) {
 *       n = aj_score_walk_tile(&s, &w, pos, &cls);   ... tile n, class cls
 *   }
 */
typedef struct aj_score_walk {
    LLVMValueRef begin, end;    /* i32 positions */
    /* internals: */
    int along_keys, size;       /* the walked tiles' extent */
    LLVMValueRef lo, hi;        /* the fixed range, inclusive (i32) */
    LLVMValueRef first, last;   /* [first, end) of tiles (i32) */
    LLVMValueRef seq;           /* the walked dim's length (i32) */
    LLVMValueRef listed;        /* i1, NULL: no block mask */
    LLVMValueRef entries;       /* i64: the list's first entry in the mask */
} aj_score_walk;

void aj_score_walk_keys(aj_score *s, aj_score_walk *w, LLVMValueRef i0, LLVMValueRef i1,
                        int bn, LLVMValueRef n_first, LLVMValueRef n_end, LLVMValueRef seq_q,
                        LLVMValueRef seq_k);
void aj_score_walk_rows(aj_score *s, aj_score_walk *w, LLVMValueRef j0, LLVMValueRef j1,
                        int bm, LLVMValueRef m_first, LLVMValueRef m_end, LLVMValueRef seq_q,
                        LLVMValueRef seq_k);
/* Makes w a walk over every tile of its [first, end), listed or not, each
 * classed (a kernel that visits skip tiles too: dbias). */
static inline void aj_score_walk_every(aj_score_walk *w)
{
    w->listed = NULL;
    w->begin = w->first;
    w->end = w->last;
}
/* The tile (i32 block index) at position pos; its class (i32) into *cls
 * when cls is not NULL (an op with a mask). */
LLVMValueRef aj_score_walk_tile(aj_score *s, const aj_score_walk *w, LLVMValueRef pos,
                                LLVMValueRef *cls);

/* Hulls of loads over index boxes already read (aj_score_host_class): a
 * caller classifying many tiles of one launch keeps one, zeroed first,
 * for as long as the tensors' data does not change. */
#define AJ_SCORE_CACHE_SIZE 2048
typedef struct aj_score_cache_entry {
    bool used;
    int tensor;
    int64_t lo[AJ_EXPR_RANK_MAX], hi[AJ_EXPR_RANK_MAX];
    int64_t ilo, ihi;
    float flo, fhi;
} aj_score_cache_entry;
typedef struct aj_score_cache {
    aj_score_cache_entry entries[AJ_SCORE_CACHE_SIZE];
} aj_score_cache;

/* Host: the class of q in [q0, q1] x k in [k0, k1] (global positions) at
 * batch b, head h (b < 0, h < 0: any) with totals sq, sk, reading the side
 * tensors in host memory (in the program's tensor order; NULL: loads are
 * unknown) through `cache` (may be NULL).  The same arithmetic as
 * aj_score_tile_class. */
/* A launch's ranges: batch index b, global head h, positions q and k (all
 * inclusive; an empty range has lo > hi), and the totals. */
typedef struct aj_score_ranges {
    int64_t b0, b1, h0, h1, q0, q1, k0, k1, sq, sk;
} aj_score_ranges;
/* Whether every load of the programs stays inside its tensor (shapes[t],
 * the tensors in the programs' order) for every element of a launch of
 * these ranges, by the interval rules with the load values unknown and
 * the guards on the way to each load applied (a select's condition, the
 * left side of && and ||, comparisons of an int node with a point);
 * false with msg naming the tensor, the index and its range. */
bool aj_score_loads_in_bounds(const aj_score_prog *p, const int64_t (*shapes)[4],
                              const aj_score_ranges *r, char *msg, size_t cap);

aj_tile_class aj_score_host_class(const aj_score_prog *p, const aj_side_tensor *tensors,
                                  aj_score_cache *cache, int64_t b, int64_t h, int64_t q0,
                                  int64_t q1, int64_t k0, int64_t k1, int64_t sq, int64_t sk);

#endif /* AJ_TEMPLATES_SCORE_H */
