/*
 * audit.h -- what `attnjit audit` reads from a kernel's SASS (nvdisasm's
 * text) and the issue-rate model it applies (docs/gpu.md, "attnjit
 * audit").  Pure text in, counts out: tests/cli/test_audit.c checks them
 * on canned SASS without NVIDIA's tools.
 */
#ifndef AJ_TOOLS_AUDIT_H
#define AJ_TOOLS_AUDIT_H

#define AUDIT_SHAPES 8

/* Instructions of one warp over a range of code, by class. */
typedef struct audit_counts {
    int total;
    int tensor;                 /* HMMA and HGMMA, QMMA and QGMMA (8-bit) */
    int hgmma;                  /* of them, HGMMA and QGMMA (wgmma) */
    int fp8;                    /* of them, QMMA and QGMMA */
    int mufu;                   /* MUFU.* (exp2, rcp, tanh, ...) */
    int fp32;                   /* FFMA, FMUL, FADD, FMNMX */
    int lds, sts;               /* LDS / LDSM, STS */
    int global;                 /* LDG, STG, LDGSTS (cp.async), RED, ATOM */
    int tma;                    /* UTMALDG, UTMASTG, UBLKCP */
    int sync;                   /* BAR, SYNCS (mbarrier), WARPGROUP, DEPBAR, WARPSYNC */
    int nshapes;                /* the tensor opcodes, each with its count */
    char shape[AUDIT_SHAPES][48];
    int shape_count[AUDIT_SHAPES];
} audit_counts;

/* A loop of a function: the code from a label to the branch back to it. */
typedef struct audit_loop {
    long begin, end;            /* byte addresses, end the branch's */
    audit_counts counts;
} audit_loop;

/*
 * The main loop of `function` in nvdisasm's output `sass`: of the loops
 * (a branch to a label at or before it), the one with the most tensor
 * instructions, then the most FP32 ones, then the longest (ptxas gives a
 * loop several back edges; the widest holds every path of an iteration:
 * an upper bound of a full tile's instructions).  0 on success;
 * -1 if the function is not there, -2 if it has no loop.  *whole gets the
 * function's counts (may be NULL).
 */
int audit_main_loop(const char *sass, const char *function, audit_loop *out,
                    audit_counts *whole);

/* The machine the model stands for, and where each rate comes from. */
typedef struct audit_gpu {
    const char *name;
    int sms;
    double clock_ghz;
    double wgmma_flop;          /* dense f16/bf16 FLOP per clock per SM, wgmma */
    double mma_flop;            /* the same, mma.sync */
    double fp32, mufu, issue;   /* per clock per SM: lanes, lanes, warp-instructions */
} audit_gpu;

/* H100 SXM and H200 (GH100: the same SMs, clocks and compute rates). */
extern const audit_gpu audit_gh100;

/* The model of one tile: clocks per SM for each resource, the largest the
 * bound, and the TFLOP/s it allows. */
typedef struct audit_model {
    double tensor, issue, mufu, fp32;   /* clocks */
    const char *bound;
    double tflops;
} audit_model;

/* `flops` per tile, computed by `warps` warps each running `c`. */
audit_model audit_apply(const audit_gpu *gpu, const audit_counts *c, int warps, double flops);

#endif /* AJ_TOOLS_AUDIT_H */
