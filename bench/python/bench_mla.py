"""attnjit.torch.mla_decode (absorbed MLA over one paged latent cache) on the
CPU against two baselines measured in the same run, interleaved: the
memory bandwidth of a copy of the same bytes (the roofline of a decode
that reads every latent row once, if it is bound by memory), and torch
computing the same attention densely (the sequences' latent rows gathered
and widened to float32 once beforehand, then softmax(q kv^T scale)
kv[:, :512] by two float32 bmm with the heads as rows: torch's bf16 matmul
on CPUs without AMX is far slower).  With 16..128 query heads over one latent row a decode
does 2 Hq (576 + 512) FLOPs per 1152 bytes read, so on a CPU it is bound
by the FMA units, not by memory: GFLOP/s is the figure to read.

    python bench/python/bench_mla.py [--heads 16,128] [--seqs 1024,4096]
        [--batch 4] [--sq 1] [--dtype bfloat16] [--repeats 5]

Prints a markdown table: per-call medians of `repeats` samples (each about
0.1 s of calls, attnjit's and the baselines' samples alternating); GB/s =
latent bytes read (every row of every sequence, 576 x 2 bytes) per
second; "of copy" = attnjit's GB/s over the copy's (read + write bytes);
GFLOP/s = 2 B Hq Sq S (576 + 512) per second.
"""
import argparse
import math
import os
import sys

import torch

import attnjit.torch as at

sys.path.insert(0, os.path.dirname(__file__))
from bench_attention import host_header, sides  # noqa: E402

LATENT, ROPE = 512, 64
D = LATENT + ROPE
SCALE = 1.0 / math.sqrt(192) * 1.25


def row(args, hq, seq):
    dtype = getattr(torch, args.dtype)
    page = 64
    pages = (seq + page - 1) // page
    g = torch.Generator().manual_seed(hq + seq)
    cache = (torch.randn(args.batch * pages, page, D, generator=g) * 0.5).to(dtype)
    table = torch.randperm(args.batch * pages, generator=g).int().view(args.batch, pages)
    seqlens = torch.full((args.batch,), seq, dtype=torch.int32)
    q = (torch.randn(args.batch, hq, args.sq, D, generator=g) * 0.5).to(dtype)
    dense = cache[table.long()].view(args.batch, pages * page, D)[:, :seq].float()   # once
    qf = q.float().reshape(args.batch, hq * args.sq, D)   # every head against one latent
    vf = dense[..., :LATENT].contiguous()
    kt = dense.transpose(1, 2).contiguous()
    src = cache.view(-1).clone()
    dst = torch.empty_like(src)

    def attnjit_call():
        at.mla_decode(q, cache, table, seqlens, head_dim_v=LATENT, scale=SCALE)

    def torch_call():
        s = torch.bmm(qf, kt) * SCALE
        torch.bmm(torch.softmax(s, -1), vf)

    def copy_call():
        dst.copy_(src)

    t_aj, t_torch, t_copy = sides([attnjit_call, torch_call, copy_call], args.repeats)
    read = args.batch * seq * D * cache.element_size()
    gbs = read / t_aj / 1e9
    copy_gbs = 2 * src.numel() * src.element_size() / t_copy / 1e9
    gflops = 2 * args.batch * hq * args.sq * seq * (D + LATENT) / t_aj / 1e9
    print("| %d | %d | %d | %d | %.3f | %.1f | %.1f | %.2f | %.0f | %.3f | %.2f |" % (
        hq, args.sq, seq, args.batch, t_aj * 1e3, gbs, copy_gbs, gbs / copy_gbs, gflops,
        t_torch * 1e3, t_torch / t_aj))


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--heads", default="16,128")
    p.add_argument("--seqs", default="1024,4096")
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--sq", type=int, default=1)
    p.add_argument("--dtype", default="bfloat16")
    p.add_argument("--repeats", type=int, default=5)
    args = p.parse_args()
    print(host_header())
    print("| heads | Sq | S | B | attnjit ms | GB/s | copy GB/s | of copy | GFLOP/s "
          "| torch f32 dense ms | torch / attnjit |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for hq in (int(h) for h in args.heads.split(",")):
        for seq in (int(s) for s in args.seqs.split(",")):
            row(args, hq, seq)


if __name__ == "__main__":
    main()
