"""torch_compare.py -- attnjit's forward kernels against PyTorch SDPA.

Run by build-gpu/run.sh (tests/gpu/run.sh) after gpu_check, on a machine
with a GPU and torch:

  1. correctness: the cases gpu_check dumped (q, k, v and attnjit's o and
     lse as .npy) against torch's scaled_dot_product_attention (O) and an
     fp32 log-sum-exp (LSE);
  2. speed: torch SDPA's flash, efficient and cuDNN backends, forward and
     backward, bf16, at the shapes of gpu_check's table (B*S = 16k tokens,
     hidden 2048, d 64 and 128, S 1k-16k), TFLOP/s counted as FlashAttention counts them (forward
     4 B S^2 D H, halved for causal; backward 2.5x forward), beside
     attnjit's efficient and flash forward from gpu_check.json (rows keyed
     by kernel, d, S and causal) and the ratio of the faster one.

Writes torch_compare.json and torch_compare.md to --out.  torch and numpy
are imported where they are used, so that speed_table (the speed table
from rows) runs without them (tests/gpu/test_torch_compare.py).
"""
import argparse
import glob
import json
import math
import os
import sys


def check_dumped(dump_dir):
    import numpy as np
    import torch
    import torch.nn.functional as F
    rows = []
    for q_path in sorted(glob.glob(os.path.join(dump_dir, "*.q.npy"))):
        name = os.path.basename(q_path)[: -len(".q.npy")]
        load = lambda t: torch.from_numpy(np.load(os.path.join(dump_dir, f"{name}.{t}.npy")))
        q, k, v, o, lse = (load(t).cuda() for t in ("q", "k", "v", "o", "lse"))
        dtype = torch.float16 if name.startswith("f16") else torch.bfloat16
        causal = "causal" in name
        o_torch = F.scaled_dot_product_attention(
            q.to(dtype), k.to(dtype), v.to(dtype), is_causal=causal).float()
        scores = (q @ k.transpose(-1, -2)) / math.sqrt(q.shape[-1])
        if causal:  # Sq == Sk here, so top-left and bottom-right agree
            s = q.shape[-2]
            mask = torch.ones(s, s, dtype=torch.bool, device=q.device).tril()
            scores = scores.masked_fill(~mask, float("-inf"))
        lse_torch = torch.logsumexp(scores, dim=-1)
        err_o = (o - o_torch).abs().max().item()
        err_lse = (lse - lse_torch).abs().max().item()
        tol_o = 2e-2 if dtype == torch.bfloat16 else 4e-3
        ok = err_o <= tol_o and err_lse <= 1e-3
        rows.append({"case": name, "max_abs_err_o": err_o, "max_abs_err_lse": err_lse,
                     "tol_o": tol_o, "ok": ok})
    return rows


def time_ms(fn, reps):
    import torch
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b))
    times.sort()
    return times[len(times) // 2]


def bench_torch(quick):
    import torch
    import torch.nn.functional as F
    try:
        from torch.nn.attention import SDPBackend, sdpa_kernel
    except ImportError:  # older torch
        SDPBackend = None
    backends = {}
    if SDPBackend is not None:
        backends = {"flash": SDPBackend.FLASH_ATTENTION,
                    "efficient": SDPBackend.EFFICIENT_ATTENTION}
        if hasattr(SDPBackend, "CUDNN_ATTENTION"):
            backends["cudnn"] = SDPBackend.CUDNN_ATTENTION
    seqs = [1024, 4096, 16384] if quick else [1024, 2048, 4096, 8192, 16384]
    rows = []
    for d in (64, 128):
        for s in seqs:
            h, b = 2048 // d, 16384 // s
            for causal in (False, True):
                q, k, v = (torch.randn(b, h, s, d, device="cuda", dtype=torch.bfloat16,
                                       requires_grad=True) for _ in range(3))
                flops = 4.0 * b * s * s * d * h / (2 if causal else 1)
                for name, backend in backends.items():
                    row = {"backend": name, "d": d, "S": s, "causal": causal}
                    try:
                        with sdpa_kernel(backend):
                            fwd = lambda: F.scaled_dot_product_attention(q, k, v, is_causal=causal)
                            ms_f = time_ms(fwd, 5 if quick else 10)
                            out = fwd()
                            grad = torch.randn_like(out)
                            bwd = lambda: torch.autograd.grad(out, (q, k, v), grad, retain_graph=True)
                            ms_b = time_ms(bwd, 5 if quick else 10)
                        row.update(fwd_ms=ms_f, fwd_tflops=flops / ms_f / 1e9,
                                   bwd_ms=ms_b, bwd_tflops=2.5 * flops / ms_b / 1e9)
                    except Exception as e:  # a backend that does not take this shape
                        row["error"] = str(e).splitlines()[0][:120]
                    rows.append(row)
                del q, k, v
                torch.cuda.empty_cache()
    return rows


def speed_table(torch_rows, attnjit_rows):
    """The speed table's markdown lines: per torch row, attnjit's efficient,
    flash and (on 9.0 GPUs) wgmma forward at the same (d, S, causal) --
    gpu_check's rows are keyed by kernel too, so one variant never stands
    in for another."""
    ours = {(r["kernel"], r["d"], r["S"], r["causal"]): r for r in attnjit_rows}

    def tflops(kernel, r):
        mine = ours.get((kernel, r["d"], r["S"], r["causal"]))
        return mine["tflops"] if mine else float("nan")

    md = ["| d | S | causal | attnjit efficient fwd | attnjit flash fwd | attnjit wgmma fwd | "
          "torch backend | fwd | bwd | best attnjit / torch fwd |",
          "|---:|---:|---|---:|---:|---:|---|---:|---:|---:|"]
    for r in torch_rows:
        ours_r = [tflops(k, r) for k in ("efficient_fwd", "flash_fwd", "wgmma_fwd")]
        best = max((x for x in ours_r if not math.isnan(x)), default=float("nan"))
        head = (f"| {r['d']} | {r['S']} | {r['causal']} | " +
                " | ".join(f"{x:.1f}" for x in ours_r) + f" | {r['backend']} | ")
        if "error" in r:
            md.append(head + f"- | - | ({r['error']}) |")
        else:
            md.append(head + f"{r['fwd_tflops']:.1f} | {r['bwd_tflops']:.1f} | "
                      f"{best / r['fwd_tflops']:.2f} |")
    return md


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dump", required=True)
    ap.add_argument("--attnjit", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args()

    checks = check_dumped(args.dump)
    torch_rows = bench_torch(args.quick)
    try:
        with open(args.attnjit) as f:
            attnjit = json.load(f).get("forward_speed", [])
    except (OSError, ValueError):
        attnjit = []
    import torch
    md = [f"# attnjit against PyTorch {torch.__version__} SDPA on {torch.cuda.get_device_name()}",
          "", "## Correctness (attnjit on the GPU against torch)", "",
          "| case | max abs err O | tol | max abs err LSE | ok |", "|---|---:|---:|---:|---|"]
    for r in checks:
        md.append(f"| {r['case']} | {r['max_abs_err_o']:.2e} | {r['tol_o']:.0e} | "
                  f"{r['max_abs_err_lse']:.2e} | {'yes' if r['ok'] else 'NO'} |")
    md += ["", "## Speed, bf16, B*S = 16k tokens, hidden 2048 (TFLOP/s)", ""]
    md += speed_table(torch_rows, attnjit)
    with open(os.path.join(args.out, "torch_compare.md"), "w") as f:
        f.write("\n".join(md) + "\n")
    with open(os.path.join(args.out, "torch_compare.json"), "w") as f:
        json.dump({"correctness": checks, "torch": torch_rows}, f, indent=1)
    print("\n".join(md))
    return 0 if checks and all(r["ok"] for r in checks) else 1


if __name__ == "__main__":
    sys.exit(main())
