"""attnjit.torch.ring_attention on a 2-rank gloo ring (CPU): the C ring's
schedule (aj_ring_plan: skipped pairs not launched, fully visible pairs
without the mask) against every (query chunk, key chunk) pair launched
with the masked kernel (the Python ring before it took the plan), causal,
both layouts, forward and forward + backward, interleaved in one run.

    python bench/python/bench_ring.py [--seqs 1024,2048] [--repeats 3]

Prints a markdown table: rank 0's medians of `repeats` runs, each pair of
(plan, all pairs) runs back to back on both ranks; ratio = all pairs time
/ plan time (above 1: the plan is faster).
"""
import argparse
import os
import statistics
import tempfile
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

import attnjit.torch as at
from attnjit.torch import _ops, _ring


def _all_pairs(self, pairs):
    """The baseline: every pair launched, with the masked kernel."""
    for p in pairs:
        (qg, qs, qn), (kg, ks, kn) = p["q"], p["k"]
        yield (slice(qs, qs + qn), slice(ks, ks + kn),
               _ops.Positions(qg, kg, self.sq, self.sk), True)


def _timed(fn):
    dist.barrier()
    t0 = time.perf_counter()
    fn()
    dist.barrier()
    return time.perf_counter() - t0


def _worker(rank, world, init_file, args):
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method="file://" + init_file, rank=rank,
                            world_size=world)
    planned = _ring._Ring.launches
    rows = []
    try:
        for S in (int(s) for s in args.seqs.split(",")):
            for layout in ("zigzag", "contiguous"):
                g = torch.Generator().manual_seed(0)
                q, k, v = (at.shard(torch.randn(1, args.heads, S, args.dim, generator=g), 2,
                                    rank, world, layout) for _ in range(3))
                for pass_ in ("forward", "forward + backward"):
                    def run():
                        leaves = [t.clone().requires_grad_(pass_ != "forward")
                                  for t in (q, k, v)]
                        o = at.ring_attention(*leaves, layout=layout, causal=True)
                        if pass_ != "forward":
                            o.sum().backward()
                    times = {"plan": [], "all": []}
                    for variant in ("plan", "all"):          # warm-up: compile both
                        _ring._Ring.launches = planned if variant == "plan" else _all_pairs
                        run()
                    for _ in range(args.repeats):
                        for variant in ("plan", "all"):
                            _ring._Ring.launches = planned if variant == "plan" else _all_pairs
                            times[variant].append(_timed(run))
                    _ring._Ring.launches = planned
                    plan, every = statistics.median(times["plan"]), statistics.median(times["all"])
                    rows.append((S, layout, pass_, plan, every))
        if rank == 0:
            print("| S | layout | pass | plan ms | all pairs ms | all pairs / plan |")
            print("| --- | --- | --- | --- | --- | --- |")
            for S, layout, pass_, plan, every in rows:
                print("| %d | %s | %s | %.1f | %.1f | %.2f |" % (
                    S, layout, pass_, plan * 1e3, every * 1e3, every / plan))
    finally:
        dist.destroy_process_group()


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seqs", default="1024,2048")
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--dim", type=int, default=64)
    p.add_argument("--repeats", type=int, default=3)
    args = p.parse_args()
    print("torch %s; 2 gloo ranks, 1 thread each; B = 1, H = %d, D = %d, f32, causal\n"
          % (torch.__version__, args.heads, args.dim))
    with tempfile.TemporaryDirectory() as tmp:
        mp.spawn(_worker, args=(2, os.path.join(tmp, "init"), args), nprocs=2, join=True)


if __name__ == "__main__":
    main()
