"""attnjit.torch.ring_attention over torch.distributed (gloo, 2 and 3
ranks in processes of their own) equals one rank's attention, forward (o,
lse) and backward (dq, dk, dv), for both layouts and rotations, masks,
GQA, an expression mask with a side tensor, and dropout; its kernel
launches are the C ring's (a pair with nothing visible is not launched,
one with everything visible runs without the mask: the counts
tests/cp/test_ring.c asserts for aj_ring_forward, from the same
position-by-position oracle); shard / unshard round-trip."""
import os
import tempfile

import pytest

torch = pytest.importorskip("torch")
import torch.distributed as dist  # noqa: E402
import torch.multiprocessing as mp  # noqa: E402

import attnjit.torch as at  # noqa: E402
from cp_check import assert_shards_match, gloo_group  # noqa: E402
from attnjit.torch import _ops  # noqa: E402
from reference import visible  # noqa: E402

CASES = [  # (layout, rotate, dtype, options)
    ("zigzag", "p2p", torch.float32, dict(causal=True)),
    ("contiguous", "p2p", torch.float32, dict(causal=True)),
    ("contiguous", "p2p", torch.float32, dict(causal="bottom_right", window=(9, None))),
    ("zigzag", "allgather", torch.bfloat16, dict(causal=True, softcap=20.0)),
    ("contiguous", "allgather", torch.float32, dict()),
    ("zigzag", "p2p", torch.float32, dict(mask="doc[b, q] == doc[b, k] && k <= q")),
    ("zigzag", "p2p", torch.float32, dict(causal=True, dropout_p=0.25)),
]


def _record_launches():
    """Wraps the kernel calls: the ring's (those given positions) go to
    log[kind] as (q_offset, kv_offset, masked)."""
    log = {"forward": [], "backward": []}

    def wrap(kind, fn):
        def call(*args, **kw):
            if "at" in kw:
                log[kind].append((kw["at"].q_offset, kw["at"].kv_offset, kw.get("masked", True)))
            return fn(*args, **kw)
        return call
    _ops.forward_into = wrap("forward", _ops.forward_into)
    _ops.backward_into = wrap("backward", _ops.backward_into)
    return log


def _chunk_starts(layout, r, world, S):
    """Rank r's chunks of an S-long sequence as (global start, length): its
    shard of the positions, cut into 1 (contiguous) or 2 (zigzag) runs."""
    pos = at.shard(torch.arange(S), 0, r, world, layout)
    n = 1 if layout == "contiguous" else 2
    return [(int(c[0]), len(c)) for c in pos.chunk(n)]


def _check_launches(log, seen, layout, rotate, rank, world, what):
    """The launches equal the oracle's: every (query chunk, key chunk) pair
    with a visible key, in the C ring's order (step s: block r-s for p2p,
    block s for all-gather), masked unless every key is visible; with a
    side tensor the classes need only be sound (as test_ring.c's)."""
    S, exact = seen.shape[-1], "mask" not in what
    owner = {}
    want = []
    for step in range(world):
        src = (rank - step) % world if rotate == "p2p" else step
        for q0, qn in _chunk_starts(layout, rank, world, S):
            for k0, kn in _chunk_starts(layout, src, world, S):
                owner[k0] = step
                pair = seen[..., q0:q0 + qn, k0:k0 + kn]
                if pair.any():
                    want.append((q0, k0, not bool(pair.all())))
    got = log["forward"]
    assert log["backward"] == got, "%s: the backward launches %s, the forward %s" % (
        what, log["backward"], got)
    assert [owner[k] for _, k, _ in got] == sorted(owner[k] for _, k, _ in got), \
        "%s: launches %s are not in ring order" % (what, got)
    if exact:
        assert got == want, "%s: launches %s, want %s" % (what, got, want)
    else:
        full = {(q, k) for q, k, masked in want if not masked}
        assert {(q, k) for q, k, _ in want} <= {(q, k) for q, k, _ in got}, what
        assert all(masked or (q, k) in full for q, k, masked in got), what


def _worker(rank, world, init_file):
    log = _record_launches()
    with gloo_group(rank, world, init_file):
        S = 8 * 2 * world
        for layout, rotate, dtype, opts in CASES:
            g = torch.Generator().manual_seed(0)
            q, k, v = (torch.randn(2, h, S, 32, generator=g).to(dtype) for h in (4, 2, 2))
            do = torch.randn(2, 4, S, 32, generator=g).to(dtype)
            opts = dict(opts)
            doc_mask = None
            if "mask" in opts:
                doc = torch.tensor([[0] * (S // 3) + [1] * (S - S // 3), [0] * S],
                                   dtype=torch.int32)
                opts["tensors"] = {"doc": doc}
                doc_mask = lambda b, h, q, k, sq, sk: (doc[b, q] == doc[b, k]) & (k <= q)  # noqa: E731
            leaves = [t.clone().requires_grad_() for t in (q, k, v)]
            torch.manual_seed(5)
            o, lse = at.attention(*leaves, return_lse=True, **opts)
            o.backward(do)
            parts = [at.shard(t, 2, rank, world, layout).requires_grad_() for t in (q, k, v)]
            torch.manual_seed(5 + rank)      # rank 0's stream is broadcast to all
            log["forward"].clear()
            log["backward"].clear()
            ro, rlse = at.ring_attention(*parts, layout=layout, rotate=rotate,
                                         return_lse=True, **opts)
            ro.backward(at.shard(do, 2, rank, world, layout))
            what = "%s %s %s %s rank %d/%d" % (layout, rotate, dtype, opts, rank, world)
            seen = visible(2, 4, S, S, opts.get("causal", False), opts.get("window"), doc_mask)
            _check_launches(log, seen, layout, rotate, rank, world, what)
            assert_shards_match(ro, rlse, parts, o, lse, leaves, rank, world, layout, dtype,
                                what)


@pytest.mark.parametrize("world", [2, 3])
def test_ring_equals_one_rank(world):
    with tempfile.TemporaryDirectory() as tmp:
        mp.spawn(_worker, args=(world, os.path.join(tmp, "init")), nprocs=world, join=True)


@pytest.mark.parametrize("layout", ["zigzag", "contiguous"])
def test_shard_unshard_round_trip(layout):
    x = torch.arange(2 * 3 * 24).view(2, 3, 24)
    out = None
    for r in range(4):
        part = at.shard(x, 2, r, 4, layout)
        assert part.shape == (2, 3, 6)
        out = at.unshard(part, 2, r, 4, layout, out)
    assert torch.equal(out, x)
    if layout == "zigzag":
        assert at.shard(x, 2, 0, 4, layout)[0, 0].tolist() == [0, 1, 2, 21, 22, 23]


def test_shard_errors():
    import attnjit
    with pytest.raises(attnjit.InvalidArgError, match="attnjit.torch.shard: aj_shard_get_chunks: a sequence of 20 positions does not split into 8 equal zigzag chunks over 4 ranks"):
        at.shard(torch.zeros(2, 20), 1, 0, 4)
    with pytest.raises(attnjit.InvalidArgError, match="not initialised"):
        at.ring_attention(*(torch.zeros(1, 1, 8, 16) for _ in range(3)))
    with pytest.raises(attnjit.InvalidArgError,
                       match="method = 'tree'; want 'ring', 'ulysses' or 'hybrid'"):
        at.ring_attention(*(torch.zeros(1, 1, 8, 16) for _ in range(3)), method="tree")
    with pytest.raises(attnjit.InvalidArgError, match="attnjit.torch.shard_varlen: "
                       "aj_shard_varlen_chunks: cu_seqlens\\[0\\] = 0 and sequence 1 of -2 positions"):
        at.shard_varlen(torch.zeros(5, 2, 8), torch.tensor([0, 5, 3], dtype=torch.int32), 0, 2)


class _Block(torch.nn.Module):
    """A model written for one device: SDPA with is_causal and GQA."""

    def __init__(self):
        super().__init__()
        self.qkv = torch.nn.Linear(32, 64)
        self.out = torch.nn.Linear(32, 32)

    def forward(self, x):
        B, S, _ = x.shape
        q, k, v = self.qkv(x).split([32, 16, 16], dim=-1)
        q = q.view(B, S, 4, 8).transpose(1, 2)
        k = k.view(B, S, 2, 8).transpose(1, 2)
        v = v.view(B, S, 2, 8).transpose(1, 2)
        o = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True,
                                                             enable_gqa=True)
        return x + self.out(o.transpose(1, 2).reshape(B, S, 32))


def _cp_worker(rank, world, init_file):
    with gloo_group(rank, world, init_file):
        torch.manual_seed(0)
        model, x = _Block(), torch.randn(2, 8 * 2 * world, 32)
        whole = x.clone()
        model(x).square().sum().backward()              # one device: torch's own SDPA
        want = [p.grad.clone() for p in model.parameters()]
        model.zero_grad()
        pos = torch.arange(x.shape[1])
        with at.context_parallel(buffers=(x, pos), buffer_seq_dims=(1, 0),
                                 no_restore_buffers=(pos,)):
            assert x.shape[1] == 16 and pos.shape[0] == 16
            model(x).square().sum().backward()          # this rank's tokens
        for p in model.parameters():
            dist.all_reduce(p.grad)
        for p, w in zip(model.parameters(), want):
            torch.testing.assert_close(p.grad, w, atol=1e-4, rtol=1e-4)
        assert torch.equal(x, whole), "x is restored"
        import attnjit
        with at.context_parallel(buffers=(x,), buffer_seq_dims=(1,)):
            q = torch.zeros(1, 2, 16, 8)
            try:
                torch.nn.functional.scaled_dot_product_attention(
                    q, q, q, attn_mask=torch.ones(16, 16, dtype=torch.bool))
                raise AssertionError("attn_mask under context_parallel did not raise")
            except attnjit.InvalidArgError as e:
                assert "attn_mask cannot be sharded" in e.message
        assert torch.equal(pos, at.shard(torch.arange(whole.shape[1]), 0, rank, world)), \
            "pos stays sharded"


def test_context_parallel_training_step_equals_one_device():
    with tempfile.TemporaryDirectory() as tmp:
        mp.spawn(_cp_worker, args=(2, os.path.join(tmp, "init")), nprocs=2, join=True)
