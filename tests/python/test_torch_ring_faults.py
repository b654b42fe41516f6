"""Faults in the Python ring (gloo, 2 and 3 ranks in processes of their
own): a rank that dies (exits) or stalls (sleeps) before the forward, before
the backward, or inside context_parallel makes every other rank raise
attnjit.CommError naming itself and the exchange within the ring's timeout
(3 s here) -- never a hang.  Each good rank writes what it saw to a file;
the test then kills the bad one."""
import os
import tempfile
import time

import pytest

torch = pytest.importorskip("torch")
import torch.distributed as dist  # noqa: E402
import torch.multiprocessing as mp  # noqa: E402

import attnjit  # noqa: E402
import attnjit.torch as at  # noqa: E402

TIMEOUT = 3.0
CASES = [  # (ranks, the bad rank, what it does, where, rotate): each fault, place, size
    (2, 1, "die", "forward", "p2p"),
    (3, 0, "stall", "forward", "p2p"),
    (3, 2, "die", "backward", "p2p"),
    (2, 1, "stall", "backward", "allgather"),
    (3, 1, "stall", "context_parallel", "p2p"),
]


def _fault(how):
    if how == "die":
        os._exit(7)
    time.sleep(600)


def _run(rank, world, bad, how, where, rotate):
    """One rank's forward and backward (or a context_parallel step), the
    bad rank failing at `where`."""
    torch.manual_seed(0)
    S = 16 * world
    q, k, v = (torch.randn(1, 2, S, 16) for _ in range(3))
    if where == "context_parallel":
        x = torch.randn(1, S, 16, requires_grad=False)
        with at.context_parallel(buffers=(x,), buffer_seq_dims=(1,), timeout=TIMEOUT):
            if rank == bad:
                _fault(how)
            h = x.view(1, -1, 2, 8).transpose(1, 2).requires_grad_()
            o = torch.nn.functional.scaled_dot_product_attention(h, h, h, is_causal=True)
            o.sum().backward()
        return
    parts = [at.shard(t, 2, rank, world).requires_grad_() for t in (q, k, v)]
    if rank == bad and where == "forward":
        _fault(how)
    o = at.ring_attention(*parts, causal=True, rotate=rotate, timeout=TIMEOUT)
    if rank == bad and where == "backward":
        _fault(how)
    o.sum().backward()


def _worker(rank, world, init_file, out_dir, bad, how, where, rotate):
    dist.init_process_group("gloo", init_method="file://" + init_file, rank=rank,
                            world_size=world)
    t0 = time.monotonic()
    try:
        _run(rank, world, bad, how, where, rotate)
        seen = "no error"
    except attnjit.CommError as e:
        seen = "CommError %.1f %s" % (time.monotonic() - t0, e.message)
    except BaseException as e:  # noqa: B902 -- reported, then judged by the test
        seen = "%s %s" % (type(e).__name__, e)
    with open(os.path.join(out_dir, "rank%d" % rank), "w") as f:
        f.write(seen)
    os._exit(0)      # without destroy_process_group: the group is broken


@pytest.mark.parametrize("world,bad,how,where,rotate", CASES,
                         ids=["%d-rank%d-%s-%s-%s" % c for c in CASES])
def test_a_dead_or_stalled_rank_raises_everywhere(world, bad, how, where, rotate):
    ctx = mp.get_context("spawn")
    with tempfile.TemporaryDirectory() as tmp:
        procs = [ctx.Process(target=_worker, args=(r, world, os.path.join(tmp, "init"), tmp,
                                                   bad, how, where, rotate))
                 for r in range(world)]
        for p in procs:
            p.start()
        start = time.monotonic()
        for r, p in enumerate(procs):
            if r != bad:
                p.join(timeout=max(1.0, 120 - (time.monotonic() - start)))
        hung = [r for r, p in enumerate(procs) if r != bad and p.is_alive()]
        for p in procs:
            if p.is_alive():
                p.kill()
            p.join()
        assert not hung, "ranks %s hung" % hung
        for r in range(world):
            if r == bad:
                continue
            with open(os.path.join(tmp, "rank%d" % r)) as f:
                seen = f.read()
            assert seen.startswith("CommError"), "rank %d: %s" % (r, seen)
            secs = float(seen.split()[1])
            assert secs < 3 * TIMEOUT + 30, "rank %d raised after %.1f s" % (r, secs)
            assert "rank %d of %d" % (r, world) in seen, seen
