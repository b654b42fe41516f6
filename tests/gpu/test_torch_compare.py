"""test_torch_compare.py -- torch_compare.py's speed table keeps attnjit's
efficient, flash and wgmma rows apart: all at the same (d, S, causal), each
in its own column, and the ratio from the fastest.  (Keyed by (d, S, causal) alone,
the flash row overwrote the efficient one.)  Needs neither torch nor a GPU.
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch_compare  # noqa: E402

attnjit = [
    {"kernel": "efficient_fwd", "d": 64, "S": 1024, "causal": False, "tflops": 100.0},
    {"kernel": "flash_fwd", "d": 64, "S": 1024, "causal": False, "tflops": 200.0},
    {"kernel": "efficient_fwd", "d": 64, "S": 1024, "causal": True, "tflops": 50.0},
    {"kernel": "wgmma_fwd", "d": 64, "S": 1024, "causal": True, "tflops": 90.0},
]
torch_rows = [
    {"backend": "flash", "d": 64, "S": 1024, "causal": False, "fwd_tflops": 400.0,
     "bwd_tflops": 300.0},
    {"backend": "cudnn", "d": 64, "S": 1024, "causal": True, "fwd_tflops": 100.0,
     "bwd_tflops": 80.0},
    {"backend": "efficient", "d": 128, "S": 2048, "causal": True, "error": "not this shape"},
]
lines = torch_compare.speed_table(torch_rows, attnjit)
want = [
    "| 64 | 1024 | False | 100.0 | 200.0 | nan | flash | 400.0 | 300.0 | 0.50 |",
    "| 64 | 1024 | True | 50.0 | nan | 90.0 | cudnn | 100.0 | 80.0 | 0.90 |",
    "| 128 | 2048 | True | nan | nan | nan | efficient | - | - | (not this shape) |",
]
failed = 0
for w in want:
    if w not in lines:
        print(f"FAIL: the table lacks\n  {w}\nit is:\n" + "\n".join(lines))
        failed = 1
print("ok" if not failed else "FAILED")
sys.exit(failed)
