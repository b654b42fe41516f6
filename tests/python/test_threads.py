"""Threads calling attnjit.torch.attention at once (the reliability issue's
first report: two threads on one warm cpu kernel never finished).  Each
thread runs forward and backward calls of its own shapes and checks them
against torch's float64 SDPA; the pool, or torch's OpenMP threads where
attnjit runs on them (docs/cpu.md "Whose threads"), must serve every
caller."""
import concurrent.futures
import math

import pytest

torch = pytest.importorskip("torch")
import attnjit  # noqa: E402
import attnjit.torch as at  # noqa: E402
import reference  # noqa: E402


def one_thread(index, calls):
    g = torch.Generator().manual_seed(index)
    worst = 0.0
    for n in range(calls):
        S = 16 + 37 * ((index + n) % 4)
        q, k, v = (torch.randn(1, 2, S, 64, generator=g, requires_grad=True)
                   for _ in range(3))
        o = at.attention(q, k, v, causal=True)
        o.sum().backward()
        ref = [t.detach().double().requires_grad_() for t in (q, k, v)]
        ro = torch.nn.functional.scaled_dot_product_attention(*ref, is_causal=True)
        ro.sum().backward()
        for got, want in ((o, ro), (q.grad, ref[0].grad), (k.grad, ref[1].grad)):
            ok, why = reference.close(got, want, torch.float32)
            assert ok, f"thread {index} call {n}: {why}"
            worst = max(worst, (got.double() - want).abs().max().item())
    return worst


OPENMP = "parallel backend: OpenMP" in torch.__config__.parallel_info()


@pytest.mark.parametrize("runner", ["openmp", "pool"])
@pytest.mark.parametrize("threads", [2, 8])
def test_threads_share_the_cpu_device(threads, runner):
    if runner == "openmp" and not OPENMP:
        pytest.skip("torch's intra-op threads are not OpenMP's")
    attnjit.set_cpu_threads(runner)
    try:
        run_threads(threads)
    finally:
        attnjit.set_cpu_threads("openmp" if OPENMP else "pool")


def run_threads(threads):
    calls = 20 if threads == 2 else 6
    with concurrent.futures.ThreadPoolExecutor(threads) as pool:
        futures = [pool.submit(one_thread, i, calls) for i in range(threads)]
        done, pending = concurrent.futures.wait(futures, timeout=120)
        assert not pending, f"{len(pending)} of {threads} threads did not finish in 120 s"
        worst = max(f.result() for f in done)
    assert math.isfinite(worst)
