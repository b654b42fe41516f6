"""Small shapes, issue #37's second item: forward + backward of
attnjit.torch.attention against torch's SDPA and against the floor, a
no-op pair of torch custom ops with attnjit's signatures and autograd
(what any custom-op attention pays to dispatch before it computes), all
interleaved in one run (per-call medians of `repeats` samples of about
0.1 s each, the sides alternating).

    python bench/python/bench_small.py [--seqs 128,256,512,1024]
        [--dims 32,64,128,256] [--dtype float32] [--repeats 5]

B 2, 4 query heads over 2 KV heads (Llama's GQA shape, small), causal.
Prints a markdown table: attnjit, SDPA and floor per call (ms), SDPA /
attnjit (above 1: attnjit faster), and attnjit's time above the floor;
where torch's threads are OpenMP's (attnjit then runs on them, docs/cpu.md
"Whose threads"), also attnjit on its own pool in the same run
(attnjit.set_cpu_threads("pool") around each of its calls) and the pool's
time over the OpenMP threads'.
"""
import argparse
import os
import sys
from typing import List, Optional, Tuple

import torch
import torch.nn.functional as F

import attnjit
import attnjit.torch as at
from attnjit import _capi

sys.path.insert(0, os.path.dirname(__file__))
from bench_attention import host_header, on_pool, sides  # noqa: E402


@torch.library.custom_op("ajbench::floor_fwd", mutates_args=())
def _floor_fwd(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
               bias: Optional[torch.Tensor], alibi_slopes: Optional[torch.Tensor],
               side: List[torch.Tensor], rng: Optional[torch.Tensor], variant: str,
               body: str) -> Tuple[torch.Tensor, torch.Tensor]:
    B, H, S, _ = q.shape
    return q.new_empty((B, H, S, v.shape[-1])), q.new_empty((B, H, S), dtype=torch.float32)


@torch.library.custom_op("ajbench::floor_bwd", mutates_args=())
def _floor_bwd(do: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
               o: torch.Tensor, lse: torch.Tensor
               ) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)


def _setup(ctx, inputs, output):
    ctx.save_for_backward(inputs[0], inputs[1], inputs[2], *output)


def _backward(ctx, do, dlse):
    q, k, v, o, lse = ctx.saved_tensors
    dq, dk, dv = torch.ops.ajbench.floor_bwd(do, q, k, v, o, lse)
    return dq, dk, dv, None, None, [], None, None, None


_floor_fwd.register_autograd(_backward, setup_context=_setup)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--seqs", default="128,256,512,1024")
    p.add_argument("--dims", default="32,64,128,256")
    p.add_argument("--dtype", default="float32")
    p.add_argument("--repeats", type=int, default=5)
    args = p.parse_args()
    print(host_header())
    torch.set_num_threads(2)
    dtype = getattr(torch, args.dtype)
    probe = torch.zeros(1, 1, 8, 8)
    at.attention(probe, probe, probe)   # attnjit.torch chooses the cpu device's threads
    openmp = _capi.lib.aj_device_cpu_threads(attnjit.device("cpu")) == _capi.CPU_THREADS_OPENMP
    print("attnjit runs on %s\n" % ("torch's OpenMP threads" if openmp else "its own pool"))
    pool_cols = " attnjit on its pool ms | pool / OpenMP |" if openmp else ""
    print("| S | D | attnjit ms | SDPA ms | floor ms | SDPA / attnjit | attnjit - floor ms |"
          + pool_cols)
    print("| --- | --- | --- | --- | --- | --- | --- |" + (" --- | --- |" if openmp else ""))
    for S in (int(s) for s in args.seqs.split(",")):
        for D in (int(d) for d in args.dims.split(",")):
            g = torch.Generator().manual_seed(0)
            q = torch.randn(2, 4, S, D, generator=g).to(dtype).requires_grad_()
            k = torch.randn(2, 2, S, D, generator=g).to(dtype).requires_grad_()
            v = torch.randn(2, 2, S, D, generator=g).to(dtype).requires_grad_()
            do = torch.randn(2, 4, S, D, generator=g).to(dtype)

            def attnjit_step():
                at.attention(q, k, v, causal=True).backward(do)

            def sdpa_step():
                F.scaled_dot_product_attention(q, k, v, is_causal=True,
                                               enable_gqa=True).backward(do)

            def floor_step():
                o, _ = torch.ops.ajbench.floor_fwd(q, k, v, None, None, [], None, "flash",
                                                   "dtype = f32")
                o.backward(do)

            steps = [attnjit_step, sdpa_step, floor_step]
            if openmp:
                steps.append(on_pool(attnjit_step))
            a, s, f, *pool = sides(steps, args.repeats)
            extra = " %.3f | %.2f |" % (pool[0] * 1e3, pool[0] / a) if openmp else ""
            print("| %d | %d | %.3f | %.3f | %.3f | %.2f | %.3f |"
                  % (S, D, a * 1e3, s * 1e3, f * 1e3, s / a, (a - f) * 1e3) + extra)


if __name__ == "__main__":
    main()
