"""The Python benchmarks (bench/python) keep running: each script once on a
tiny configuration, in a child process as a user runs it, its table
checked for rows.  Their numbers are not looked at here (benchmarks measure,
tests assert): this guards against a script that no longer runs against
the package (bench_attention's overhead mode called a helper with an
argument the helper had stopped taking, and nothing noticed)."""
import os
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench" / "python"

# script, arguments, how many table rows it must print
CASES = [
    ("bench_attention.py", ["--seqs", "64", "--heads", "2/1", "--dims", "32", "--causal",
                            "causal", "--repeats", "1", "--calls", "3"], 2 + 3),
    # and attnjit on its own pool beside it, where torch's threads are OpenMP's
    ("bench_attention.py", ["--seqs", "64", "--heads", "2/1", "--dims", "32", "--causal",
                            "none", "--repeats", "1", "--only", "throughput", "--pool"], 2),
    ("bench_small.py", ["--seqs", "32", "--dims", "16", "--repeats", "1"], 1),
    ("bench_sinks.py", ["--seqs", "64", "--dtypes", "float32", "--repeats", "1"], 2),
    ("bench_mla.py", ["--heads", "16", "--seqs", "128", "--batch", "1", "--repeats", "1"], 1),
    ("bench_fp8.py", ["--seq", "64", "--dim", "64", "--repeats", "1"], 3),
    # and its table of the FP8 tensor-core kernel on sim, through the CLI
    ("bench_fp8.py", ["--seq", "64", "--dim", "64", "--repeats", "1", "--cli", "{cli}",
                      "--sim-seq", "32"], 3 + 4),
]


def cli_binary():
    """The attnjit binary: $AJ_CLI, else the build directory's, where the
    test command runs pytest."""
    return os.environ.get("AJ_CLI") or str(Path.cwd() / "attnjit")


@pytest.mark.parametrize("script,args,rows", CASES,
                         ids=[c[0] + "".join(" " + a for a in ("--cli", "--pool") if a in c[1])
                              for c in CASES])
def test_bench_runs(script, args, rows):
    if "{cli}" in args:
        cli = cli_binary()
        if not os.access(cli, os.X_OK):
            pytest.skip("no attnjit binary at %s (set AJ_CLI)" % cli)
        args = [cli if a == "{cli}" else a for a in args]
    env = dict(os.environ)
    run = subprocess.run([sys.executable, str(BENCH / script)] + args, env=env,
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, "%s failed:\n%s%s" % (script, run.stdout, run.stderr)
    # data rows: markdown rows whose last cell holds a number (headers hold words)
    cells = [line.strip().strip("|").split("|") for line in run.stdout.splitlines()
             if line.startswith("| ") and not line.startswith("| ---")]
    data = [c for c in cells if any(ch.isdigit() for ch in c[-1])]
    assert len(data) >= rows, "%s printed too few rows:\n%s" % (script, run.stdout)
    assert "cpu features" in run.stdout or "cpu:" in run.stdout, \
        "%s printed no host header" % script
