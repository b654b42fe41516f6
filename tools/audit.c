/*
 * audit.c -- nvdisasm's SASS text into instruction counts per loop, and
 * the issue-rate model of `attnjit audit` (audit.h; docs/gpu.md).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tools/audit.h"

/*
 * GH100 (H100 SXM, H200): 132 SMs; NVIDIA's dense f16 / bf16 tensor peak
 * of 989.4 TFLOP/s is 132 SMs x 1830 MHz x 4096 FLOP per clock, wgmma's
 * rate (documented).  FP32 128 lanes, MUFU (exp2, rcp, tanh) 16 lanes per
 * clock per SM (the CUDA programming guide's throughput table for compute
 * capability 9.0), one warp-instruction per clock from each of the 4
 * schedulers (documented).  FP8 (QGMMA) runs at twice the rate, NVIDIA's
 * dense FP8 peak of 1979 TFLOP/s (documented).  mma.sync's rate on Hopper
 * is not documented: 2/3 of wgmma's is assumed (public microbenchmarks
 * measure about that).
 */
const audit_gpu audit_gh100 = {
    .name = "H100 SXM / H200 (GH100: 132 SMs at 1830 MHz)",
    .sms = 132,
    .clock_ghz = 1.83,
    .wgmma_flop = 4096.0,
    .mma_flop = 4096.0 * 2.0 / 3.0,
    .fp32 = 128.0,
    .mufu = 16.0,
    .issue = 4.0,
};

typedef struct insn {
    long addr;
    char op[64];       /* the opcode with its modifiers, predicate dropped */
    char target[32];   /* a branch's label, else "" */
    int predicated;    /* the instruction had a predicate (@P0, @!P1) */
} insn;

typedef struct label {
    char name[32];
    long addr;
} label;

static int starts(const char *s, const char *prefix)
{
    return strncmp(s, prefix, strlen(prefix)) == 0;
}

static void count(audit_counts *c, const char *op)
{
    c->total++;
    if (starts(op, "HMMA") || starts(op, "HGMMA") || starts(op, "QMMA") || starts(op, "QGMMA")) {
        c->tensor++;
        c->hgmma += starts(op, "HGMMA") || starts(op, "QGMMA");
        c->fp8 += starts(op, "QMMA") || starts(op, "QGMMA");
        int i = 0;
        while (i < c->nshapes && strcmp(c->shape[i], op) != 0)
            i++;
        if (i == c->nshapes && i < AUDIT_SHAPES)
            snprintf(c->shape[c->nshapes++], sizeof c->shape[0], "%s", op);
        if (i < AUDIT_SHAPES)
            c->shape_count[i]++;
    } else if (starts(op, "MUFU")) {
        c->mufu++;
    } else if (starts(op, "FFMA") || starts(op, "FMUL") || starts(op, "FADD") ||
               starts(op, "FMNMX")) {
        c->fp32++;
    } else if (starts(op, "LDS")) {
        c->lds++;
    } else if (starts(op, "STS")) {
        c->sts++;
    } else if (starts(op, "LDG") || starts(op, "STG") || starts(op, "RED") ||
               starts(op, "ATOM")) {
        c->global++;
    } else if (starts(op, "UTMA") || starts(op, "UBLKCP")) {
        c->tma++;
    } else if (starts(op, "BAR") || starts(op, "SYNCS") || starts(op, "WARPGROUP") ||
               starts(op, "DEPBAR") || starts(op, "WARPSYNC")) {
        c->sync++;
    }
}

/* One line: an instruction into *in (1), a label into *lb (2), else 0. */
static int parse_line(const char *line, size_t len, insn *in, label *lb)
{
    if (len > 1 && line[0] == '.' && line[len - 1] == ':' && len - 1 < sizeof lb->name &&
        !starts(line, ".text.")) {
        memcpy(lb->name, line, len - 1);
        lb->name[len - 1] = '\0';
        return 2;
    }
    const char *at = memchr(line, '/', len);
    if (!at || at + 1 >= line + len || at[1] != '*')
        return 0;
    char *end = NULL;
    long addr = strtol(at + 2, &end, 16);
    if (!end || end + 1 >= line + len || end[0] != '*' || end[1] != '/')
        return 0;
    const char *p = end + 2, *stop = line + len;
    while (p < stop && (*p == ' ' || *p == '\t'))
        p++;
    int predicated = p < stop && *p == '@';
    if (predicated)   /* the predicate */
        while (p < stop && *p != ' ')
            p++;
    while (p < stop && *p == ' ')
        p++;
    size_t n = 0;
    while (p + n < stop && p[n] != ' ' && p[n] != ';' && n + 1 < sizeof in->op)
        n++;
    if (n == 0)
        return 0;
    in->addr = addr;
    in->predicated = predicated;
    memcpy(in->op, p, n);
    in->op[n] = '\0';
    in->target[0] = '\0';
    const char *t = memchr(p, '`', (size_t)(stop - p));
    if (starts(in->op, "BRA") && t && t + 2 < stop && t[1] == '(') {
        size_t m = 0;
        while (t + 2 + m < stop && t[2 + m] != ')' && m + 1 < sizeof in->target)
            m++;
        memcpy(in->target, t + 2, m);
        in->target[m] = '\0';
    }
    return 1;
}

int audit_main_loop(const char *sass, const char *function, audit_loop *out,
                    audit_counts *whole)
{
    char head[300];
    snprintf(head, sizeof head, ".text.%s:", function);
    const char *p = sass;
    while (p && !(starts(p, head) && (p[strlen(head)] == '\n' || p[strlen(head)] == '\0'))) {
        p = strchr(p, '\n');
        p = p ? p + 1 : NULL;
    }
    if (!p)
        return -1;
    int cap = 1024, n = 0, nl = 0, cap_l = 256;
    insn *code = malloc((size_t)cap * sizeof *code);
    label *labels = malloc((size_t)cap_l * sizeof *labels);
    char pending[8][sizeof(label){0}.name];   /* labels waiting for their instruction */
    int npending = 0;
    if (!code || !labels) {
        free(code);
        free(labels);
        return -1;
    }
    for (p = strchr(p, '\n'); p && p[1]; p = strchr(p + 1, '\n')) {
        const char *line = p + 1, *eol = strchr(line, '\n');
        size_t len = eol ? (size_t)(eol - line) : strlen(line);
        if (starts(line, "//---") || starts(line, ".text.") || starts(line, "\t.section"))
            break;   /* the next function */
        insn in;
        label lb;
        int kind = parse_line(line, len, &in, &lb);
        if (kind == 2 && npending < 8)
            memcpy(pending[npending++], lb.name, sizeof pending[0]);
        if (kind != 1)
            continue;
        for (int i = 0; i < npending; i++) {
            if (nl == cap_l) {
                label *grown = realloc(labels, (size_t)(cap_l *= 2) * sizeof *labels);
                if (!grown)
                    break;
                labels = grown;
            }
            if (nl < cap_l) {
                memcpy(labels[nl].name, pending[i], sizeof labels[nl].name);
                labels[nl++].addr = in.addr;
            }
        }
        npending = 0;
        if (n == cap) {
            insn *grown = realloc(code, (size_t)(cap *= 2) * sizeof *code);
            if (!grown)
                break;
            code = grown;
        }
        code[n++] = in;
    }
    if (whole) {
        memset(whole, 0, sizeof *whole);
        for (int i = 0; i < n; i++)
            count(whole, code[i].op);
    }
    int found = 0;
    for (int i = 0; i < n; i++) {
        if (!code[i].target[0])
            continue;
        long begin = -1;
        for (int l = 0; l < nl && begin < 0; l++)
            if (strcmp(labels[l].name, code[i].target) == 0)
                begin = labels[l].addr;
        if (begin < 0 || begin > code[i].addr)
            continue;   /* a branch forward */
        audit_loop loop = {begin, code[i].addr, {0}};
        int exits = 0;
        for (int j = 0; j < n; j++)
            if (code[j].addr >= begin && code[j].addr <= code[i].addr) {
                count(&loop.counts, code[j].op);
                exits += starts(code[j].op, "EXIT") && !code[j].predicated;
            }
        /* a branch back from an out-of-line block (an mbarrier's retry,
         * placed after the kernel's end) spans an unconditional EXIT: not
         * a loop body (a loop may hold a predicated one) */
        if (exits)
            continue;
        const audit_counts *a = &loop.counts, *b = &out->counts;
        int better = !found || a->tensor > b->tensor ||
                     (a->tensor == b->tensor && (a->fp32 > b->fp32 ||
                      (a->fp32 == b->fp32 && loop.end - loop.begin > out->end - out->begin)));
        if (better)
            *out = loop;
        found = 1;
    }
    free(code);
    free(labels);
    return found ? 0 : -2;
}

/* The FLOPs of one warp's mma.sync instruction of SASS opcode `op`
 * (HMMA.16816..., QMMA.16832...: m 16, n 8, k the rest), 0 for others. */
static double mma_sync_flops(const char *op)
{
    if (!starts(op, "HMMA.168") && !starts(op, "QMMA.168"))
        return 0.0;
    return 2.0 * 16 * 8 * atoi(op + 8);
}

audit_model audit_apply(const audit_gpu *gpu, const audit_counts *c, int warps, double flops)
{
    audit_model m = {0};
    /* a loop whose tensor instructions are all 8-bit runs at FP8's rate */
    double rate = (c->hgmma ? gpu->wgmma_flop : gpu->mma_flop) *
                  (c->tensor && c->fp8 == c->tensor ? 2.0 : 1.0);
    /* the tensor cores run what the warps issue: at least the tile's
     * FLOPs, more where work is duplicated (mma.sync shapes counted) */
    double issued = 0.0;
    for (int i = 0; i < c->nshapes; i++)
        issued += (double)warps * c->shape_count[i] * mma_sync_flops(c->shape[i]);
    m.tensor = c->tensor ? (issued > flops ? issued : flops) / rate : 0.0;
    m.issue = (double)warps * c->total / gpu->issue;
    m.mufu = (double)warps * 32.0 * c->mufu / gpu->mufu;
    m.fp32 = (double)warps * 32.0 * c->fp32 / gpu->fp32;
    m.bound = "tensor cores";
    double most = m.tensor;
    if (m.issue > most) {
        most = m.issue;
        m.bound = "instruction issue";
    }
    if (m.mufu > most) {
        most = m.mufu;
        m.bound = "MUFU (exp2)";
    }
    if (m.fp32 > most) {
        most = m.fp32;
        m.bound = "FP32";
    }
    m.tflops = most > 0 ? flops / most * gpu->sms * gpu->clock_ghz * 1e-3 : 0.0;
    return m;
}
