"""attnjit.torch's cpu launches on torch's own OpenMP threads (docs/cpu.md
"Whose threads"): chosen where torch's intra-op threads are OpenMP's, kept
off by AJ_TORCH_CPU_THREADS=pool, refused where no OpenMP runtime is
loaded, and the same bits as attnjit's pool at every head dim (the widest
items need the most stack: where an OpenMP thread's is too small, the
launch runs on the pool, test_cpu_omp)."""
import os
import subprocess
import sys

import pytest

torch = pytest.importorskip("torch")
import attnjit  # noqa: E402
import attnjit.torch as at  # noqa: E402
from attnjit import _capi  # noqa: E402

OPENMP = "parallel backend: OpenMP" in torch.__config__.parallel_info()
needs_openmp = pytest.mark.skipif(not OPENMP, reason="torch's intra-op threads are not OpenMP's")


def cpu_threads():
    return _capi.lib.aj_device_cpu_threads(attnjit.device("cpu"))


def test_attention_runs_on_torchs_threads():
    x = torch.randn(1, 1, 8, 8)
    at.attention(x, x, x)
    want = _capi.CPU_THREADS_OPENMP if OPENMP else _capi.CPU_THREADS_POOL
    assert cpu_threads() == want


def step(dtype, D, causal):
    """Forward and backward of a GQA problem: O and the three gradients."""
    g = torch.Generator().manual_seed(D)
    q = torch.randn(2, 4, 45, D, generator=g).to(dtype).requires_grad_()
    k, v = (torch.randn(2, 2, 45, D, generator=g).to(dtype).requires_grad_() for _ in range(2))
    o = at.attention(q, k, v, causal=causal)
    o.backward(torch.randn(o.shape, generator=g).to(dtype))
    return [o.detach(), q.grad, k.grad, v.grad]


@needs_openmp
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("D", [8, 32, 64, 128, 256, 512])
def test_same_bits_as_the_pool(dtype, D):
    try:
        outs = {}
        for kind in ("openmp", "pool"):
            attnjit.set_cpu_threads(kind)
            outs[kind] = step(dtype, D, causal=D % 64 == 0)
    finally:
        attnjit.set_cpu_threads("openmp")
    for name, a, b in zip(("o", "dq", "dk", "dv"), outs["openmp"], outs["pool"]):
        assert torch.equal(a, b), f"{name} differs between torch's threads and the pool"


def test_set_cpu_threads_refuses_other_names():
    with pytest.raises(attnjit.InvalidArgError, match="cpu threads 'tbb' is not one of"):
        attnjit.set_cpu_threads("tbb")


def run_python(code, **env):
    return subprocess.run([sys.executable, "-c", code], env=dict(os.environ, **env),
                          capture_output=True, text=True, timeout=300)


CHOICE = """
import torch, attnjit, attnjit.torch as at
from attnjit import _capi
x = torch.randn(1, 1, 8, 8)
at.attention(x, x, x)
print(_capi.lib.aj_device_cpu_threads(attnjit.device("cpu")))
"""


@needs_openmp
def test_environment_keeps_the_pool():
    r = run_python(CHOICE, AJ_TORCH_CPU_THREADS="pool")
    assert r.returncode == 0, r.stderr
    assert r.stdout.split()[-1] == str(_capi.CPU_THREADS_POOL)
    r = run_python(CHOICE, AJ_TORCH_CPU_THREADS="omp")
    assert r.returncode != 0
    assert "AJ_TORCH_CPU_THREADS='omp': 'openmp' or 'pool'" in r.stderr


def test_openmp_needs_a_runtime_in_the_process():
    """Without torch (or another OpenMP user) loaded, there are no OpenMP
    threads to run on: a clear refusal, and the pool stays."""
    code = """
import attnjit
try:
    attnjit.set_cpu_threads("openmp")
except attnjit.UnsupportedError as e:
    print("refused:", e)
"""
    r = run_python(code)
    assert r.returncode == 0, r.stderr
    assert "refused:" in r.stdout and "needs an OpenMP runtime loaded in the process" in r.stdout
