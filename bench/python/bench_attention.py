"""attnjit.torch.attention against torch's SDPA on the CPU, forward and
forward + backward, interleaved in one run; and the Python layer's per-call
overhead over the C call it makes (aj_forward through ctypes with the
arguments already bound).

    python bench/python/bench_attention.py [--seqs 1024,2048,4096] [--heads 4/4,8/2]
        [--dims 64,128] [--dtypes float32,bfloat16] [--causal causal,none] [--repeats 3]

Prints a markdown table: times are per-call medians of `repeats` samples,
each sample a run of calls of about 0.1 s, attnjit's and SDPA's samples
alternating; ratio = SDPA time / attnjit time (above 1: attnjit is
faster).
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


def host_header():
    """The run's host for a table's header: torch's version and threads,
    attnjit's, the cpu device, and what its kernels are compiled for here
    (CPUID features and the paths they select: attnjit.cpu_describe), so
    that every CPU figure carries its host's flags."""
    lines = ["torch %s, %d threads; attnjit %s on %s" % (
        torch.__version__, torch.get_num_threads(), attnjit.__version__,
        _capi.lib.aj_device_name(attnjit.device("cpu")).decode())]
    lines += ["  cpu %s: %s" % kv for kv in attnjit.cpu_describe().items()]
    return "\n".join(lines) + "\n"


def sides(fns, repeats, sample_s=0.1):
    """Per-call medians of each of fns, run in turn after one warm-up each.
    Each sample runs a side back to back for about sample_s seconds (at
    least once), so that no side pays for another's thread pool still
    spinning down (torch's OpenMP threads spin after a parallel region; on
    2 cores that lands on the next call)."""
    counts = [max(1, int(sample_s / max(timed(f), 1e-6))) for f in fns]
    samples = [[] for _ in fns]
    for _ in range(repeats):
        for f, n, out in zip(fns, counts, samples):
            out.append(timed(lambda: [f() for _ in range(n)]) / n)
    return [statistics.median(s) for s in samples]


def pair(fn_a, fn_b, repeats, sample_s=0.1):
    """sides() of two."""
    return tuple(sides([fn_a, fn_b], repeats, sample_s))


def on_pool(fn):
    """fn with attnjit's cpu launches on its own thread pool rather than
    torch's OpenMP threads (docs/cpu.md "Whose threads"), as a side of an
    interleaved comparison."""
    def run(*args):
        attnjit.set_cpu_threads("pool")
        try:
            return fn(*args)
        finally:
            attnjit.set_cpu_threads("openmp")
    return run


def throughput(args):
    pool = " attnjit on its pool ms | pool / attnjit |" if args.pool else ""
    print("| dtype | heads q/kv | D | S | mask | pass | attnjit ms | SDPA ms | SDPA / attnjit |"
          + pool)
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |"
          + (" --- | --- |" if args.pool else ""))
    B = args.batch
    for dtype in args.dtypes:
        for hq, hkv in args.heads:
            for D in args.dims:
                for S in args.seqs:
                    for causal in args.causal:
                        throughput_row(args, B, hq, hkv, D, S, dtype, causal)


def throughput_row(args, B, hq, hkv, D, S, dtype, causal):
    g = torch.Generator().manual_seed(0)
    q = torch.randn(B, hq, S, D, generator=g).to(dtype).requires_grad_()
    k, v = (torch.randn(B, hkv, S, D, generator=g).to(dtype).requires_grad_() for _ in range(2))
    do = torch.randn(B, hq, S, D, generator=g).to(dtype)
    gqa = hq != hkv

    def fwd(f):
        with torch.no_grad():
            f(q, k, v)

    def fwd_bwd(f):
        f(q, k, v).backward(do)

    ours = lambda q, k, v: at.attention(q, k, v, causal=causal)  # noqa: E731
    sdpa = lambda q, k, v: F.scaled_dot_product_attention(  # noqa: E731
        q, k, v, is_causal=causal, enable_gqa=gqa)
    pooled = on_pool(ours)
    for name, run in (("fwd", fwd), ("fwd+bwd", fwd_bwd)):
        fns = [lambda: run(ours), lambda: run(sdpa)] + ([lambda: run(pooled)] if args.pool else [])
        a, b, *c = sides(fns, args.repeats)
        extra = " %.1f | %.2f |" % (c[0] * 1e3, c[0] / a) if args.pool else ""
        print("| %s | %d/%d | %d | %d | %s | %s | %.1f | %.1f | %.2f |" % (
            str(dtype).replace("torch.", ""), hq, hkv, D, S, "causal" if causal else "none",
            name, a * 1e3, b * 1e3, b / a) + extra, flush=True)


def overhead(args):
    """attnjit.torch.attention at S = 128 against aj_forward alone."""
    S, D = 128, 64
    q, k, v = (torch.randn(1, 4, S, D) for _ in range(3))
    with torch.no_grad():
        at.attention(q, k, v, causal=True)          # compiles the kernel
    body = _ops._body(_ops._IR_DTYPE[torch.float32], D, D, True, None, None, False, False, None,
                      0.0, None, None, [])
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
    p.add_argument("--heads", default="4/4,8/2", help="query/kv head pairs (8/2: GQA)")
    p.add_argument("--dims", default="64,128")
    p.add_argument("--dtypes", default="float32,bfloat16")
    p.add_argument("--causal", default="causal,none")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--calls", type=int, default=500)
    p.add_argument("--only", choices=("throughput", "overhead"))
    p.add_argument("--pool", action="store_true",
                   help="also attnjit on its own thread pool, where it runs on torch's OpenMP "
                        "threads (docs/cpu.md \"Whose threads\")")
    args = p.parse_args()
    if args.pool and "parallel backend: OpenMP" not in torch.__config__.parallel_info():
        print("--pool: attnjit runs on its pool already (torch's threads are not OpenMP's)")
        args.pool = False
    args.seqs = [int(s) for s in args.seqs.split(",")]
    args.heads = [tuple(int(x) for x in h.split("/")) for h in args.heads.split(",")]
    args.dims = [int(d) for d in args.dims.split(",")]
    args.dtypes = [getattr(torch, d) for d in args.dtypes.split(",")]
    args.causal = [c == "causal" for c in args.causal.split(",")]
    print(host_header())
    if args.only != "overhead":
        throughput(args)
    if args.only != "throughput":
        overhead(args)


if __name__ == "__main__":
    main()
