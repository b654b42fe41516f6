"""Every context-parallel method from Python over torch.distributed (gloo,
2, 3 and 4 ranks in processes of their own), against one rank's attention:
ring_attention(method="hybrid", ulysses_size=U) for every U dividing P
(Ulysses inside groups of U ranks, the ring across them), and packed
documents (cu_seqlens_q / cu_seqlens_k) with the ring (p2p and
all-gather), Ulysses and hybrid, both layouts -- forward (o, lse) and
backward (dq, dk, dv, and the sinks' gradient where the op has sinks),
each rank's shard against the same shard of the single-rank result; the
dropout cases draw the single-device keep mask (heads, positions and
documents stay global; another mask would miss by far more than the
tolerance).  One generator gives the cases: at each P every option set
and every method runs, paired in turn (the pairing shifts with P)."""
import itertools
import os
import tempfile

import pytest

torch = pytest.importorskip("torch")
import torch.multiprocessing as mp  # noqa: E402

import attnjit  # noqa: E402
import attnjit.torch as at  # noqa: E402
from cp_check import assert_shards_match, gloo_group  # noqa: E402

D = 16
OPTIONS = [  # (dtype, options): each meets every method
    (torch.float32, dict(causal=True)),
    (torch.float32, dict(causal="bottom_right", window=(5, None))),
    (torch.bfloat16, dict(alibi_slopes=True, softcap=20.0)),
    (torch.float32, dict(mask="(h % 2 == 0 || k <= q) && k + b % 2 <= q + 3")),
    (torch.float32, dict(causal=True, dropout_p=0.3)),
    (torch.float32, dict(causal=True, sinks=True)),
]


def heads(world):
    """(Hq, Hkv): GQA 2:1, the KV heads P (every U dividing P divides them)."""
    return 2 * world, world
DOCS = [(7, 1, 2, 13, 3), (1, 2, 5), (3, 1, 2, 3, 2), (1, 1, 1)]


def _methods(world):
    """(method, ulysses_size, rotate): the ring both ways, Ulysses, and
    hybrid with every U dividing P."""
    out = [("ring", None, "p2p"), ("ring", None, "allgather"), ("ulysses", None, "p2p")]
    return out + [("hybrid", u, ("p2p", "allgather")[u % 2]) for u in range(1, world + 1)
                  if world % u == 0]


def cases(world, packed):
    """One run's cases: the option sets and the methods paired in turn,
    each list cycled to the other's length, the methods' start shifted by
    P; layouts alternating, documents cycling.  Padded runs take hybrid
    only (the ring's and Ulysses' padded cases are test_torch_ring's and
    test_torch_ulysses')."""
    methods = [m for m in _methods(world) if packed or m[0] == "hybrid"]
    shift = world % len(methods)
    methods = methods[shift:] + methods[:shift]
    n = max(len(methods), len(OPTIONS))
    for i, (m, o) in enumerate(zip(itertools.islice(itertools.cycle(methods), n),
                                   itertools.islice(itertools.cycle(OPTIONS), n))):
        yield m, o, ("zigzag", "contiguous")[i % 2], DOCS[i % len(DOCS)]


def _inputs(shape_q, shape_kv, dtype, seed):
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(*s, generator=g).to(dtype) for s in (shape_q, shape_kv, shape_kv))
    return q, k, v, torch.randn(*shape_q, generator=g).to(dtype)


def _run_case(rank, world, method, U, rotate, dtype, opts, layout, docs):
    opts = dict(opts)
    sinks = opts.pop("sinks", False)
    HQ, HKV = heads(world)
    if opts.get("alibi_slopes"):
        opts["alibi_slopes"] = torch.linspace(0.1, 0.8, HQ)
    if docs is None:
        S = 8 * world
        q, k, v, do = _inputs((2, HQ, S, D), (2, HKV, S, D), dtype, 3)
        cut = lambda t: at.shard(t, 2, rank, world, layout)  # noqa: E731
        cu = None
    else:
        cu = torch.tensor([0] + list(itertools.accumulate(docs)), dtype=torch.int32)
        T = int(cu[-1])
        q, k, v, do = _inputs((T, HQ, D), (T, HKV, D), dtype, 4)
        cut = lambda t: at.shard_varlen(t, cu, rank, world, layout, method)  # noqa: E731
    whole_sinks = torch.linspace(-1.0, 1.0, HQ).requires_grad_() if sinks else None
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    torch.manual_seed(5)
    if cu is None:
        o, lse = at.attention(*leaves, return_lse=True, sinks=whole_sinks, **opts)
    else:
        longest = max(docs)
        o, lse = at.attention_varlen(*leaves, cu, cu, longest, longest, return_lse=True,
                                     sinks=whole_sinks, **opts)
    o.backward(do)
    parts = [cut(t).requires_grad_() for t in (q, k, v)]
    rsinks = torch.linspace(-1.0, 1.0, HQ).requires_grad_() if sinks else None
    torch.manual_seed(5 + rank)      # rank 0's dropout stream is broadcast
    varlen = dict(cu_seqlens_q=cu, cu_seqlens_k=cu) if cu is not None else {}
    ro, rlse = at.ring_attention(*parts, layout=layout, rotate=rotate, method=method,
                                 ulysses_size=U, return_lse=True, timeout=60, sinks=rsinks,
                                 **varlen, **opts)
    ro.backward(cut(do))
    what = "%s U=%s %s %s %s docs %s %s rank %d/%d" % (method, U, rotate, layout, dtype, docs,
                                                      sorted(opts), rank, world)
    assert_shards_match(ro, rlse, parts, o, lse, leaves, rank, world, layout, dtype, what,
                        cu=cu, method=method)
    if sinks:
        torch.testing.assert_close(rsinks.grad, whole_sinks.grad, atol=1e-4, rtol=1e-4,
                                   msg=lambda m: "%s: dsinks: %s" % (what, m))


def _refusals(rank, world):
    q = torch.zeros(1, 12, 2, D)
    for U, match in ((world + 1, "ulysses_size = %d over %d ranks" % (world + 1, world)),
                     (None, "ulysses_size = None over")):
        try:
            at.ring_attention(q, q, q, method="hybrid", ulysses_size=U)
            raise AssertionError("ulysses_size = %s did not raise" % U)
        except attnjit.InvalidArgError as e:
            assert match in e.message, e.message
    try:
        at.ring_attention(q, q, q, method="ring", ulysses_size=2)
        raise AssertionError("ulysses_size with the ring did not raise")
    except attnjit.InvalidArgError as e:
        assert "only method = 'hybrid' takes it" in e.message, e.message
    cu = torch.tensor([0, 5, 9], dtype=torch.int32)
    p = torch.zeros(9, 12, D)    # the whole batch: no rank's pieces
    try:
        at.ring_attention(p, p, p, cu_seqlens_q=cu, cu_seqlens_k=cu)
        raise AssertionError("wrong piece lengths did not raise")
    except attnjit.InvalidArgError as e:
        assert "rank %d holds 9 query and 9 key positions; its pieces" % rank in e.message, \
            e.message
    try:
        at.ring_attention(p, p, p, cu_seqlens_q=cu)
        raise AssertionError("one offsets tensor did not raise")
    except attnjit.InvalidArgError as e:
        assert "need both cu_seqlens_q and cu_seqlens_k" in e.message, e.message


def _worker(rank, world, init_file, packed):
    with gloo_group(rank, world, init_file):
        for (method, U, rotate), (dtype, opts), layout, docs in cases(world, packed):
            _run_case(rank, world, method, U, rotate, dtype, opts, layout,
                      docs if packed else None)
        if packed:
            _refusals(rank, world)
        else:
            # context_parallel(method="hybrid"): SDPA on the shards, gradients included
            x = torch.randn(2, 8 * world, 96, generator=torch.Generator().manual_seed(1))
            whole = x.clone().requires_grad_()
            h = whole.view(2, -1, 12, 8).transpose(1, 2)
            want = torch.nn.functional.scaled_dot_product_attention(h, h, h, is_causal=True)
            want.square().sum().backward()
            with at.context_parallel(buffers=(x,), buffer_seq_dims=(1,), method="hybrid",
                                     ulysses_size=world // 2 if world % 2 == 0 else world):
                part = x.clone().requires_grad_()
                h = part.view(2, -1, 12, 8).transpose(1, 2)
                got = torch.nn.functional.scaled_dot_product_attention(h, h, h, is_causal=True)
                got.square().sum().backward()
            torch.testing.assert_close(got, at.shard(want, 2, rank, world), atol=1e-5,
                                       rtol=1e-5)
            # (the squares' gradients reach ~10: f32 sums in another order)
            torch.testing.assert_close(part.grad, at.shard(whole.grad, 1, rank, world),
                                       atol=2e-4, rtol=1e-4)


@pytest.mark.parametrize("packed", [False, True], ids=["hybrid", "packed"])
@pytest.mark.parametrize("world", [2, 3, 4])
def test_cp_method_equals_one_rank(world, packed):
    with tempfile.TemporaryDirectory() as tmp:
        mp.spawn(_worker, args=(world, os.path.join(tmp, "init"), packed), nprocs=world,
                 join=True)


@pytest.mark.parametrize("method", ["ring", "ulysses", "hybrid"])
@pytest.mark.parametrize("layout", ["zigzag", "contiguous"])
def test_shard_varlen_round_trip(method, layout):
    cu = torch.tensor([0, 7, 8, 10, 23, 26], dtype=torch.int32)
    x = torch.arange(26 * 3).view(26, 3)
    out, seen = None, []
    for r in range(4):
        part = at.shard_varlen(x, cu, r, 4, layout, method)
        seen += part[:, 0].div(3, rounding_mode="floor").tolist()
        out = at.unshard_varlen(part, cu, r, 4, layout, method, out=out)
    assert torch.equal(out, x) and sorted(seen) == list(range(26))
    if method != "ulysses" and layout == "zigzag":
        # document 0 (7 positions) in 8 chunks of 1 (the last empty): rank 1
        # holds chunks 1 and 6, then document 1's one position (rank 0's)
        # is not among its pieces
        assert at.shard_varlen(x, cu, 1, 4, layout, method)[:3, 0].tolist() == [3, 18, 27]
