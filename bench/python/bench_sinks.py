"""What learned sinks cost: attnjit.torch.attention with sinks= against the
same op without, forward + backward (the sinks' gradient included),
interleaved in one run (bench_attention.pair: per-call medians of
`repeats` samples of about 0.1 s each, the two sides alternating).

    python bench/python/bench_sinks.py [--seqs 1024,2048] [--dtypes float32,bfloat16]
        [--repeats 5]

Shapes as gpt-oss's attention: B 1, 8 query heads over 2 KV heads, D 64,
causal and a sliding window of 128 (its alternating layers).  Prints a
markdown table; cost = with / without - 1 (goal: at most 5%).
"""
import argparse
import os
import sys

import torch

import attnjit.torch as at

sys.path.insert(0, os.path.dirname(__file__))
from bench_attention import host_header, pair  # noqa: E402


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--seqs", default="1024,2048")
    p.add_argument("--dtypes", default="float32,bfloat16")
    p.add_argument("--repeats", type=int, default=5)
    args = p.parse_args()
    print(host_header())
    torch.set_num_threads(2)
    print("| dtype | S | mask | fwd+bwd ms, no sinks | with sinks | cost |")
    print("| --- | --- | --- | --- | --- | --- |")
    for dtype in (getattr(torch, d) for d in args.dtypes.split(",")):
        for S in (int(s) for s in args.seqs.split(",")):
            for mask, opts in (("causal", dict(causal=True)),
                               ("window 128", dict(causal=True, window=(127, 0)))):
                g = torch.Generator().manual_seed(0)
                q = torch.randn(1, 8, S, 64, generator=g).to(dtype).requires_grad_()
                k = torch.randn(1, 2, S, 64, generator=g).to(dtype).requires_grad_()
                v = torch.randn(1, 2, S, 64, generator=g).to(dtype).requires_grad_()
                do = torch.randn(1, 8, S, 64, generator=g).to(dtype)
                sinks = torch.randn(8, generator=g).requires_grad_()

                def plain():
                    at.attention(q, k, v, **opts).backward(do)

                def with_sinks():
                    at.attention(q, k, v, sinks=sinks, **opts).backward(do)

                a, b = pair(plain, with_sinks, args.repeats)
                print("| %s | %d | %s | %.1f | %.1f | %+.1f%% |"
                      % (str(dtype)[6:], S, mask, a * 1e3, b * 1e3, (b / a - 1) * 100))


if __name__ == "__main__":
    main()
