"""attnjit.torch.attention against torch's SDPA on the CPU, forward and
forward + backward, interleaved in one run; and the Python layer's per-call
overhead over the C call it makes (aj_forward through ctypes with the
arguments already bound).

    python bench/python/bench_attention.py [--seqs 1024,2048,4096] [--repeats 3]

Prints a markdown table: times are medians of `repeats` runs, each pair of
(attnjit, SDPA) runs back to back; ratio = SDPA time / attnjit time (above
1: attnjit is faster).
"""
import argparse
import ctypes
import statistics
import time

import torch
import torch.nn.functional as F

import attnjit
import attnjit.torch as at
from attnjit import _capi
from attnjit.torch import _ops


def timed(fn):
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def pair(fn_a, fn_b, repeats):
    """Medians of fn_a and fn_b, run alternately after one warm-up each."""
    fn_a(), fn_b()
    a, b = [], []
    for _ in range(repeats):
        a.append(timed(fn_a))
        b.append(timed(fn_b))
    return statistics.median(a), statistics.median(b)


def throughput(args):
    print("| dtype | D | S | pass | attnjit ms | SDPA ms | SDPA / attnjit |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    B, H = args.batch, args.heads
    for dtype in (torch.bfloat16, torch.float32):
        for D in (64, 128):
            for S in args.seqs:
                g = torch.Generator().manual_seed(0)
                q, k, v = (torch.randn(B, H, S, D, generator=g).to(dtype).requires_grad_()
                           for _ in range(3))
                do = torch.randn(B, H, S, D, generator=g).to(dtype)

                def fwd(f):
                    with torch.no_grad():
                        f(q, k, v)

                def fwd_bwd(f):
                    f(q, k, v).backward(do)

                ours = lambda q, k, v: at.attention(q, k, v, causal=True)  # noqa: E731
                sdpa = lambda q, k, v: F.scaled_dot_product_attention(  # noqa: E731
                    q, k, v, is_causal=True)
                for name, run in (("fwd", fwd), ("fwd+bwd", fwd_bwd)):
                    a, b = pair(lambda: run(ours), lambda: run(sdpa), args.repeats)
                    print("| %s | %d | %d | %s | %.1f | %.1f | %.2f |" % (
                        str(dtype).replace("torch.", ""), D, S, name, a * 1e3, b * 1e3, b / a),
                        flush=True)


def overhead(args):
    """attnjit.torch.attention at S = 128 against aj_forward alone."""
    S, D = 128, 64
    q, k, v = (torch.randn(1, 4, S, D) for _ in range(3))
    with torch.no_grad():
        at.attention(q, k, v, causal=True)          # compiles the kernel
    body = _ops._body(torch.float32, D, D, True, None, None, False, False, None, 0.0, None,
                      None, [])
    dev, _ = _ops._device_of(q)
    kernel = _ops._kernel("forward", "flash", body, dev)
    o, lse = torch.empty(1, 4, S, D), torch.empty(1, 4, S)
    a = _capi.FwdArgs(struct_size=ctypes.sizeof(_capi.FwdArgs))
    for field, t in ((a.q, q), (a.k, k), (a.v, v), (a.o, o), (a.lse, lse)):
        _ops._put(field, t)
    ctx, fn, ref = attnjit._ctx.ptr, _capi.lib.aj_forward, ctypes.byref(a)

    def c_call():
        for _ in range(args.calls):
            fn(ctx, dev, kernel.ptr, ref)

    def py_call():
        with torch.no_grad():
            for _ in range(args.calls):
                at.attention(q, k, v, causal=True)

    rounds = [pair(py_call, c_call, 1) for _ in range(args.repeats)]
    py = statistics.median(r[0] for r in rounds) / args.calls
    c = statistics.median(r[1] for r in rounds) / args.calls
    print()
    print("| S = %d, D = %d, f32, causal, no grad | us per call |" % (S, D))
    print("| --- | --- |")
    print("| aj_forward (ctypes, arguments bound) | %.1f |" % (c * 1e6))
    print("| attnjit.torch.attention | %.1f |" % (py * 1e6))
    print("| overhead of the Python layer | %.1f |" % ((py - c) * 1e6))


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seqs", default="1024,2048,4096")
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--calls", type=int, default=500)
    p.add_argument("--only", choices=("throughput", "overhead"))
    args = p.parse_args()
    args.seqs = [int(s) for s in args.seqs.split(",")]
    print("torch %s, %d threads; attnjit %s on %s\n" % (
        torch.__version__, torch.get_num_threads(), attnjit.__version__,
        _capi.lib.aj_device_name(attnjit.device("cpu")).decode()))
    if args.only != "overhead":
        throughput(args)
    if args.only != "throughput":
        overhead(args)


if __name__ == "__main__":
    main()
