"""attnjit.torch.flex_attention against torch's own flex_attention under
torch.compile (issue #37): for each of FlexAttention's documented mods,
the first call (tracing the Python mods and compiling: attnjit's JIT
against Inductor) and the steady-state forward, interleaved
(bench_attention.pair: per-call medians of `repeats` samples of about
0.1 s each, the sides alternating).

    python bench/python/bench_flex.py [--seq 1024] [--dim 64] [--heads 8]
        [--dtype float32] [--repeats 5]

B 1, forward only (compiled flex has no CPU backward), 2 threads, the
kernel cache in memory (AJ_CACHE=memory: every first call compiles).
Prints a markdown table; flex / attnjit above 1: attnjit faster.
"""
import argparse
import os
import sys
import time

os.environ.setdefault("AJ_CACHE", "memory")

import torch  # noqa: E402
from torch.nn.attention import flex_attention as tf  # noqa: E402

import attnjit.torch as at  # noqa: E402

sys.path.insert(0, os.path.dirname(__file__))
from bench_attention import host_header, pair  # noqa: E402


def mods(S, H):
    """(name, score_mod, mask_mod) of FlexAttention's documentation and
    attention-gym, the tensors they capture made here."""
    slopes = torch.exp2(-8.0 * torch.arange(1, H + 1) / H)
    doc = (torch.arange(S) * 5 // S).to(torch.int32)        # five documents

    def causal(b, h, q, k):
        return q >= k

    def window(b, h, q, k):
        return (q >= k) & (q - k <= 256)

    def prefix(b, h, q, k):
        return (k <= 128) | (q >= k)

    def document(b, h, q, k):
        return (doc[q] == doc[k]) & (q >= k)

    def alibi(score, b, h, q, k):
        return score - slopes[h] * (q - k).abs()

    def softcap(score, b, h, q, k):
        return 30.0 * torch.tanh(score / 30.0)

    return [("causal", None, causal), ("sliding window 256", None, window),
            ("prefix LM 128", None, prefix), ("document (5) causal", None, document),
            ("alibi", alibi, None), ("softcap 30, causal", softcap, causal)]


def first_call(fn):
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--seq", type=int, default=1024)
    p.add_argument("--dim", type=int, default=64)
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--dtype", default="float32")
    p.add_argument("--repeats", type=int, default=5)
    args = p.parse_args()
    print(host_header())
    torch.set_num_threads(2)
    S, D, H, dtype = args.seq, args.dim, args.heads, getattr(torch, args.dtype)
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, H, S, D, generator=g).to(dtype) for _ in range(3))
    compiled = torch.compile(tf.flex_attention)
    print("| mod | attnjit first call s | compiled flex first call s | attnjit fwd ms "
          "| flex fwd ms | flex / attnjit |")
    print("| --- | --- | --- | --- | --- | --- |")
    with torch.no_grad():
        for name, score_mod, mask_mod in mods(S, H):
            ours_mask = at.create_block_mask(mask_mod, 1, H, S, S) if mask_mod else None
            theirs_mask = (tf.create_block_mask(mask_mod, 1, H, S, S, device="cpu")
                           if mask_mod else None)

            def ours():
                return at.flex_attention(q, k, v, score_mod=score_mod, block_mask=ours_mask)

            def theirs():
                return compiled(q, k, v, score_mod=score_mod, block_mask=theirs_mask)

            first = (first_call(ours), first_call(theirs))
            a, b = pair(ours, theirs, args.repeats)
            print("| %s | %.2f | %.2f | %.1f | %.1f | %.2f |"
                  % (name, first[0], first[1], a * 1e3, b * 1e3, b / a))


if __name__ == "__main__":
    main()
