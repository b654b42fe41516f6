"""FP8 inputs (docs/python.md "FP8 inputs"): their accuracy and their cpu
speed.

    python bench/python/bench_fp8.py [--seq 1024] [--dim 128] [--repeats 5]
                                     [--cli build/attnjit --sim-seq 256]

Accuracy: the relative RMS error of o against the float64 reference of the
unquantised inputs (B 1, H 4, S --seq, D --dim, not causal), for Gaussian
inputs N(0, 1) and outlier-heavy ones (FA3's: plus N(0, 10^2) at 0.1% of
the elements), e4m3 and e5m2 with per-tensor descales, with and without
quantize_fp8's Hadamard rotation of Q and K; bf16 inputs as the baseline
(every number from the same draws).  Speed: the forward of the f8 inputs
against the same op in bf16, interleaved (bench_attention.pair), causal,
8 query heads over 2 KV heads.  With --cli (the attnjit binary), a third
table: what the flash variant's FP8 tensor-core kernel adds by rounding P
to e4m3 (docs/ir.md "FP8 inputs"), run on the emulator (`attnjit run
--device sim`, B 1, H 2, S --sim-seq) beside the efficient kernel (f32 P)
on the same codes.  Prints markdown tables.
"""
import argparse
import os
import subprocess
import sys
import tempfile

import numpy as np

import torch

import attnjit.torch as at

sys.path.insert(0, os.path.dirname(__file__))
from bench_attention import host_header, pair  # noqa: E402

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "tests", "python"))
import reference as ref  # noqa: E402


def draw(g, shape, outliers):
    x = torch.randn(shape, generator=g, dtype=torch.float64)
    if outliers:
        spikes = torch.rand(shape, generator=g, dtype=torch.float64) < 1e-3
        x = x + 10 * torch.randn(shape, generator=g, dtype=torch.float64) * spikes
    return x


def rel_rms(o, want):
    return ((o.double() - want).pow(2).mean().sqrt() / want.pow(2).mean().sqrt()).item()


def accuracy(seq, dim):
    print("| inputs | bf16 | e4m3 | e4m3 + rotation | e5m2 | e5m2 + rotation |")
    print("| --- | --- | --- | --- | --- | --- |")
    for name, outliers in (("Gaussian", False), ("outlier-heavy", True)):
        g = torch.Generator().manual_seed(0)
        q, k, v = (draw(g, (1, 4, seq, dim), outliers) for _ in range(3))
        want, _ = ref.attention(q, k, v)
        row = [rel_rms(at.attention(q.bfloat16(), k.bfloat16(), v.bfloat16()), want)]
        for fmt in (torch.float8_e4m3fn, torch.float8_e5m2):
            for rotate in (False, True):
                q8, qd = at.quantize_fp8(q, fmt, rotate=rotate)
                k8, kd = at.quantize_fp8(k, fmt, rotate=rotate)
                v8, vd = at.quantize_fp8(v, fmt)
                o = at.attention(q8, k8, v8, q_descale=qd, k_descale=kd, v_descale=vd,
                                 out_dtype=torch.float32)
                row.append(rel_rms(o, want))
        print("| %s | %s |" % (name, " | ".join("%.2e" % e for e in row)))


def speed(seq, dim, repeats):
    print()
    print("| S | D | bf16 fwd ms | e4m3 fwd ms | e4m3 / bf16 |")
    print("| --- | --- | --- | --- | --- |")
    g = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(1, h, seq, dim, generator=g) for h in (8, 2, 2))
    q16, k16, v16 = q.bfloat16(), k.bfloat16(), v.bfloat16()
    q8, qd = at.quantize_fp8(q)
    k8, kd = at.quantize_fp8(k)
    v8, vd = at.quantize_fp8(v)

    def bf16():
        at.attention(q16, k16, v16, causal=True)

    def fp8():
        at.attention(q8, k8, v8, q_descale=qd, k_descale=kd, v_descale=vd, causal=True)

    a, b = pair(bf16, fp8, repeats)
    print("| %d | %d | %.2f | %.2f | %.2f |" % (seq, dim, a * 1e3, b * 1e3, b / a))


def p_rounding(cli, seq, dim):
    """The relative RMS error of o (f16) against the float64 reference of
    the unquantised inputs, the efficient kernel's and the flash FP8
    kernel's, on sim."""
    print()
    print("| inputs | format | efficient (f32 P) | flash tensor cores (e4m3 P) | ratio |")
    print("| --- | --- | --- | --- | --- |")
    with tempfile.TemporaryDirectory() as tmp:
        def path(name):
            return os.path.join(tmp, name)

        for name, outliers in (("Gaussian", False), ("outlier-heavy", True)):
            g = torch.Generator().manual_seed(0)
            q, k, v = (draw(g, (1, 2, seq, dim), outliers) for _ in range(3))
            want, _ = ref.attention(q, k, v)
            for fmt, fname in ((torch.float8_e4m3fn, "f8e4m3"), (torch.float8_e5m2, "f8e5m2")):
                ins = []
                for t, x in (("q", q), ("k", k), ("v", v)):
                    x8, d = at.quantize_fp8(x, fmt)
                    np.save(path(t + ".npy"), x8.view(torch.uint8).numpy())
                    np.save(path(t + "_scale.npy"), d.float().reshape(1).numpy())
                    ins += ["--in", "%s=%s" % (t, path(t + ".npy")),
                            "--in", "%s_scale=%s" % (t, path(t + "_scale.npy"))]
                row = []
                for variant in ("efficient", "flash"):
                    with open(path("op.aj"), "w") as f:
                        f.write("attention forward %s {\n  dtype = f16\n  head_dim = %d\n"
                                "  q_dtype = %s\n  kv_dtype = %s\n}\n" % (variant, dim, fname,
                                                                          fname))
                    run = subprocess.run([cli, "run", path("op.aj"), "--device", "sim"] + ins +
                                         ["--out", "o=" + path("o.npy")], capture_output=True,
                                         text=True)
                    if run.returncode:
                        raise SystemExit("attnjit run failed:\n" + run.stderr)
                    row.append(rel_rms(torch.from_numpy(np.load(path("o.npy"))), want))
                print("| %s | %s | %.2e | %.2e | %.2f |" % (name, fname[2:], row[0], row[1],
                                                            row[1] / row[0]))


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--seq", type=int, default=1024)
    p.add_argument("--dim", type=int, default=128)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--cli", help="the attnjit binary: the FP8 tensor-core kernel on sim")
    p.add_argument("--sim-seq", type=int, default=256)
    args = p.parse_args()
    print(host_header())
    torch.set_num_threads(2)
    accuracy(args.seq, args.dim)
    speed(args.seq, args.dim, args.repeats)
    if args.cli:
        p_rounding(args.cli, args.sim_seq, args.dim)


if __name__ == "__main__":
    main()
