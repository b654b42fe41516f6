/*
 * test_audit.c -- `attnjit audit`'s reading of SASS (tools/audit.c) on
 * canned nvdisasm text, without NVIDIA's tools: the function's section,
 * labels and branches, the main loop chosen among several back edges, the
 * instruction classes and tensor shapes, and the model's arithmetic.
 * (test_cli.sh runs the command itself where ptxas and nvdisasm are.)
 */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "check.h"
#include "tools/audit.h"

/* Two functions; the second has a prologue, a short polling loop, a
 * main loop with two back edges (the wider holds the refill; the inner
 * one a predicated EXIT, which a loop body may hold), and after
 * its EXIT an out-of-line block (an mbarrier's retry, with a wgmma as a
 * warp-specialised kernel's last P V would be) that branches back into
 * the loop: a back edge with more HGMMAs that is not a loop body.  In the
 * format nvdisasm -c prints. */
static const char sass[] =
    "\t.headerflags\t@\"EF_CUDA_SM90\"\n"
    "//--------------------- .text.other --------------------------\n"
    "\t.section\t.text.other,\"ax\",@progbits\n"
    ".text.other:\n"
    "        /*0000*/                   HMMA.16816.F32.BF16 R4, R8, R12, R4 ;\n"
    ".L_x_0:\n"
    "        /*0010*/                   BRA `(.L_x_0) ;\n"
    "//--------------------- .text.k --------------------------\n"
    "\t.section\t.text.k,\"ax\",@progbits\n"
    ".text.k:\n"
    "        /*0000*/                   LDC R1, c[0x0][0x28] ;\n"
    "        /*0010*/                   MUFU.RCP R0, R0 ;\n"
    ".L_x_5:\n"
    "        /*0020*/                   SYNCS.PHASECHK.TRANS64.TRYWAIT P0, [UR4], R2 ;\n"
    "        /*0030*/              @!P0 BRA `(.L_x_5) ;\n"
    ".L_x_1:\n"
    "        /*0040*/                   UTMALDG.4D [UR8], [UR30] ;\n"
    "        /*0050*/                   LDGSTS.E.BYPASS.128 [R3], desc[UR6][R4.64] ;\n"
    ".L_x_2:\n"
    "        /*0060*/                   WARPGROUP.ARRIVE ;\n"
    "        /*0070*/                   HGMMA.64x64x16.F32.BF16 R88, gdesc[UR8], RZ, !UPT ;\n"
    "        /*0080*/                   HGMMA.64x64x16.F32.BF16 R88, gdesc[UR8], R88 ;\n"
    "        /*0090*/                   WARPGROUP.DEPBAR.LE gsb0, 0x0 ;\n"
    "        /*00a0*/                   FFMA R2, R3, R4, R5 ;\n"
    "        /*00b0*/                   FMNMX R2, R2, R6, !PT ;\n"
    "        /*00c0*/                   MUFU.EX2 R7, R7 ;\n"
    "        /*00d0*/                   HGMMA.64x128x16.F32.BF16 R0, R24, gdesc[UR12], R0 ;\n"
    "        /*00e0*/                   LDSM.16.M88.4 R8, [R9] ;\n"
    "        /*00f0*/                   STS [R1], R2 ;\n"
    "        /*00f8*/               @P3 EXIT ;\n"
    "        /*0100*/               @P1 BRA `(.L_x_2) ;\n"
    "        /*0110*/                   BAR.SYNC.DEFER_BLOCKING 0x0 ;\n"
    "        /*0120*/               @P2 BRA `(.L_x_1) ;\n"
    "        /*0130*/                   BRA `(.L_x_9) ;\n"
    ".L_x_9:\n"
    "        /*0140*/                   EXIT ;\n"
    ".L_x_10:\n"
    "        /*0150*/                   HGMMA.64x128x16.F32.BF16 R0, R24, gdesc[UR12], R0 ;\n"
    "        /*0160*/                   SYNCS.PHASECHK.TRANS64.TRYWAIT P0, [UR4], R2 ;\n"
    "        /*0170*/              @!P0 BRA `(.L_x_10) ;\n"
    "        /*0180*/                   BRA `(.L_x_1) ;\n";

static void test_main_loop(void)
{
    audit_loop loop;
    audit_counts whole;
    CHECK(audit_main_loop(sass, "missing", &loop, NULL) == -1);
    CHECK(audit_main_loop(sass, "k", &loop, &whole) == 0);
    /* the wider back edge (to .L_x_1) wins over the inner one (to .L_x_2),
     * both with the three HGMMAs; the branch back from after the EXIT
     * (four) is no loop body */
    CHECK_MSG(loop.begin == 0x40 && loop.end == 0x120, "main loop 0x%lx .. 0x%lx", loop.begin,
              loop.end);
    const audit_counts *c = &loop.counts;
    CHECK_MSG(c->total == 16, "%d instructions", c->total);   /* the @P3 EXIT in it */
    CHECK(c->tensor == 3 && c->hgmma == 3 && c->mufu == 1 && c->fp32 == 2);
    CHECK(c->lds == 1 && c->sts == 1 && c->global == 1 && c->tma == 1);
    CHECK_MSG(c->sync == 3, "%d sync", c->sync);   /* ARRIVE, DEPBAR, BAR */
    CHECK(c->nshapes == 2 && strcmp(c->shape[0], "HGMMA.64x64x16.F32.BF16") == 0 &&
          c->shape_count[0] == 2 && strcmp(c->shape[1], "HGMMA.64x128x16.F32.BF16") == 0 &&
          c->shape_count[1] == 1);
    /* the whole function: the prologue's MUFU and the poll too, not the
     * other function's HMMA */
    CHECK_MSG(whole.total == 26 && whole.mufu == 2 && whole.tensor == 4, "%d, %d, %d",
              whole.total, whole.mufu, whole.tensor);
    /* a function without a loop */
    static const char flat[] = ".text.f:\n        /*0000*/                   EXIT ;\n";
    CHECK(audit_main_loop(flat, "f", &loop, &whole) == -2 && whole.total == 1);
}

static void test_model(void)
{
    audit_counts c = {.total = 100, .tensor = 4, .hgmma = 4, .mufu = 8, .fp32 = 40};
    /* 8 warps, a 128 x 64 tile at d 128: 2 * 128 * 64 * 256 FLOP */
    double flops = 2.0 * 128 * 64 * 256;
    audit_model m = audit_apply(&audit_gh100, &c, 8, flops);
    CHECK(fabs(m.tensor - flops / 4096.0) < 1e-9);
    CHECK(fabs(m.issue - 8 * 100 / 4.0) < 1e-9);
    CHECK(fabs(m.mufu - 8 * 32 * 8 / 16.0) < 1e-9 && fabs(m.fp32 - 8 * 32 * 40 / 128.0) < 1e-9);
    CHECK_MSG(strcmp(m.bound, "tensor cores") == 0, "bound %s", m.bound);
    /* at the tensor bound: the documented peak, 989.4 TFLOP/s */
    CHECK_MSG(fabs(m.tflops - 989.4) < 0.5, "%.1f TFLOP/s", m.tflops);
    c.total = 2000;   /* now issue-bound: 4000 clocks for the tile, not 1024 */
    m = audit_apply(&audit_gh100, &c, 8, flops);
    CHECK(strcmp(m.bound, "instruction issue") == 0 && fabs(m.tflops - 989.4 * 1024 / 4000) < 0.5);
    c.hgmma = 0;      /* mma.sync: 2/3 of wgmma's rate, assumed */
    c.total = 10;
    m = audit_apply(&audit_gh100, &c, 8, flops);
    CHECK(fabs(m.tflops - 989.4 * 2 / 3) < 0.5);
    c.hgmma = c.fp8 = 4;   /* QGMMA: FP8's documented 1979 TFLOP/s */
    m = audit_apply(&audit_gh100, &c, 8, flops);
    CHECK_MSG(fabs(m.tflops - 1978.8) < 1.0, "FP8: %.1f TFLOP/s", m.tflops);
    audit_counts q = {0};   /* the 8-bit instructions count as tensor and fp8 */
    static const char qsass[] =
        ".text.q:\n"
        ".L_x_0:\n"
        "        /*0000*/                   QGMMA.64x64x32.F32.E4M3.E4M3 R24, gdesc[UR4], RZ ;\n"
        "        /*0010*/                   QMMA.16832.F32.E4M3.E5M2 R0, R4, R8, R0 ;\n"
        "        /*0020*/                   HGMMA.64x64x16.F32.BF16 R88, gdesc[UR8], R88 ;\n"
        "        /*0030*/               @P0 BRA `(.L_x_0) ;\n"
        "        /*0040*/                   EXIT ;\n";
    audit_loop loop;
    CHECK(audit_main_loop(qsass, "q", &loop, &q) == 0);
    CHECK_MSG(loop.counts.tensor == 3 && loop.counts.hgmma == 2 && loop.counts.fp8 == 2,
              "tensor %d hgmma %d fp8 %d", loop.counts.tensor, loop.counts.hgmma,
              loop.counts.fp8);
    /* mixed with 16-bit ones: the 16-bit rate, conservatively */
    m = audit_apply(&audit_gh100, &loop.counts, 8, flops);
    CHECK(fabs(m.tensor - flops / 4096.0) < 1e-9);
    /* mma.sync issuing more than the tile's FLOPs (a warp pair computing
     * the same scores): the tensor cores run what is issued -- a 64 x 32
     * tile at d 512 (2 * 64 * 32 * 1024 FLOP) on 8 warps of 192
     * HMMA.16816 (4096 FLOP each) is 1.5 times the tile */
    audit_counts dup = {.total = 700, .tensor = 192, .nshapes = 1, .shape_count = {192}};
    snprintf(dup.shape[0], sizeof dup.shape[0], "HMMA.16816.F32.BF16");
    double tile = 2.0 * 64 * 32 * 1024, rate = audit_gh100.mma_flop;
    m = audit_apply(&audit_gh100, &dup, 8, tile);
    CHECK_MSG(fabs(m.tensor - 8 * 192 * 4096.0 / rate) < 1e-6, "tensor %.1f", m.tensor);
    dup.shape_count[0] = dup.tensor = 128;   /* the pair trading halves: the tile's FLOPs */
    m = audit_apply(&audit_gh100, &dup, 8, tile);
    CHECK_MSG(fabs(m.tensor - tile / rate) < 1e-6, "tensor %.1f", m.tensor);
}

int main(void)
{
    test_main_loop();
    test_model();
    return check_report();
}
