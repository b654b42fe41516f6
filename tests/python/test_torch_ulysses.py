"""attnjit.torch.ring_attention(method="ulysses") over torch.distributed
(gloo, 2 and 4 ranks in processes of their own) equals one rank's
attention, forward (o, lse) and backward (dq, dk, dv): both layouts,
causal, a window, GQA, alibi, an expression mask over the head and a side
tensor of documents, and dropout -- bit for bit the single-device keep
mask, since heads and positions stay global; SDPA under
context_parallel(method="ulysses") with its gradient; and the refusal of
heads not divisible by the ranks (hybrid and packed documents:
test_torch_cp_methods)."""
import os
import tempfile

import pytest

torch = pytest.importorskip("torch")
import torch.multiprocessing as mp  # noqa: E402

import attnjit  # noqa: E402
import attnjit.torch as at  # noqa: E402
from cp_check import assert_shards_match, gloo_group  # noqa: E402

S, HQ, HKV, D = 32, 8, 4, 16
DOC = torch.tensor([[0] * 11 + [1] * 21, [0] * 32], dtype=torch.int32)
CASES = [  # (layout, dtype, options)
    ("zigzag", torch.float32, dict(causal=True)),
    ("contiguous", torch.float32, dict(causal="bottom_right", window=(5, None))),
    ("zigzag", torch.bfloat16, dict(alibi_slopes=torch.linspace(0.1, 0.8, HQ), softcap=20.0)),
    ("zigzag", torch.float32, dict(mask="doc[b, q] == doc[b, k] && (h % 2 == 0 || k <= q)",
                                   tensors={"doc": DOC})),
    ("contiguous", torch.float32, dict(causal=True, dropout_p=0.3)),
]


def _worker(rank, world, init_file):
    with gloo_group(rank, world, init_file):
        for layout, dtype, opts in CASES:
            g = torch.Generator().manual_seed(0)
            q, k, v, do = (torch.randn(2, h, S, D, generator=g).to(dtype)
                           for h in (HQ, HKV, HKV, HQ))
            leaves = [t.clone().requires_grad_() for t in (q, k, v)]
            torch.manual_seed(5)
            o, lse = at.attention(*leaves, return_lse=True, **opts)
            o.backward(do)
            parts = [at.shard(t, 2, rank, world, layout).requires_grad_() for t in (q, k, v)]
            torch.manual_seed(5 + rank)      # rank 0's dropout stream is broadcast
            ro, rlse = at.ring_attention(*parts, layout=layout, method="ulysses",
                                         return_lse=True, timeout=60, **opts)
            ro.backward(at.shard(do, 2, rank, world, layout))
            what = "%s %s %s rank %d/%d" % (layout, dtype, sorted(opts), rank, world)
            assert_shards_match(ro, rlse, parts, o, lse, leaves, rank, world, layout, dtype,
                                what)
        # context_parallel(method="ulysses"): SDPA on the shards, gradients included
        x = torch.randn(2, S, 32, generator=torch.Generator().manual_seed(1))
        whole = x.clone().requires_grad_()
        h = whole.view(2, S, 4, 8).transpose(1, 2)
        want = torch.nn.functional.scaled_dot_product_attention(h, h, h, is_causal=True)
        want.square().sum().backward()
        with at.context_parallel(buffers=(x,), buffer_seq_dims=(1,), method="ulysses"):
            part = x.clone().requires_grad_()
            h = part.view(2, -1, 4, 8).transpose(1, 2)
            got = torch.nn.functional.scaled_dot_product_attention(h, h, h, is_causal=True)
            got.square().sum().backward()
        torch.testing.assert_close(got, at.shard(want, 2, rank, world), atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(part.grad, at.shard(whole.grad, 1, rank, world), atol=1e-5,
                                   rtol=1e-5)
        q = torch.zeros(1, 3, S // world, D)
        try:
            at.ring_attention(q, q, q, method="ulysses")
            raise AssertionError("3 heads over %d ranks did not raise" % world)
        except attnjit.InvalidArgError as e:
            assert "not a multiple of %d" % world in e.message, e.message


@pytest.mark.parametrize("world", [2, 4])
def test_ulysses_equals_one_rank(world):
    with tempfile.TemporaryDirectory() as tmp:
        mp.spawn(_worker, args=(world, os.path.join(tmp, "init")), nprocs=world, join=True)
