"""Learned attention sinks from Python (attention(..., sinks=), docs/ir.md
"Sinks") against the float64 reference with the sinks as one more softmax
column (gpt-oss's eager attention): o, lse and the gradients of q, k, v and
the sinks, over dtype x variant x mask x GQA x head dim, with sinks that
dominate a head, vanish (-inf) in another and sit among the scores in the
rest; rows that see no key (o 0, lse the sink); varlen; dropout (the same
kernel with and without sinks: only the denominator changes);
torch.compile(fullgraph=True); repeatable sinks gradients; bad sinks; and
ring (p2p, all-gather) and Ulysses over 2 gloo ranks against one rank."""
import math

import pytest

torch = pytest.importorskip("torch")
import attnjit  # noqa: E402
import attnjit.torch as at  # noqa: E402
import reference  # noqa: E402

DTYPES = [torch.float32, torch.float16, torch.bfloat16]
MASKS = {  # name: (attention's options, the reference's visibility options)
    "none": (dict(), dict()),
    "causal": (dict(causal=True), dict(causal=True)),
    "causal_bottom_right": (dict(causal="bottom_right"), dict(causal="bottom_right")),
    "window": (dict(window=(4, 0), causal="bottom_right"),
               dict(window=(4, 0), causal="bottom_right")),
}


def sink_logits(hq, seed):
    g = torch.Generator().manual_seed(seed)
    s = torch.randn(hq, generator=g, dtype=torch.float64)
    s[0], s[1] = 6.0, -math.inf
    return s


CASES = [(dtype, variant, mask, hkv, d)
         for i, (dtype, variant, mask) in enumerate(
             (dt, var, m) for dt in DTYPES for var in ("flash", "efficient") for m in sorted(MASKS))
         for hkv, d in [((4, 2)[i % 2], (32, 64, 128)[i % 3])]]


@pytest.mark.parametrize("dtype,variant,mask,hkv,d", CASES,
                         ids=["%s-%s-%s-hkv%d-d%d" % (str(c[0])[6:], c[1], c[2], c[3], c[4])
                              for c in CASES])
def test_sinks_match_reference(dtype, variant, mask, hkv, d):
    b, hq, sq, sk = 2, 4, 11, 23 if mask != "causal" else 9   # causal top_left: rows see none
    q, k, v, do = reference.inputs(b, hq, hkv, sq, sk, d, dtype, 7)
    sinks = sink_logits(hq, 3)
    opts, ref_opts = MASKS[mask]
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    s_leaf = sinks.float().requires_grad_()
    o, lse = at.attention(*leaves, sinks=s_leaf, variant=variant, return_lse=True, **opts)
    o.backward(do)
    ref_leaves = [t.double().requires_grad_() for t in (q, k, v)]
    s_ref = sinks.clone().requires_grad_()
    seen = reference.visible(b, hq, sq, sk, **ref_opts)
    o_ref, lse_ref = reference.attention(*ref_leaves, seen=seen, sinks=s_ref)
    o_ref.backward(do.double())
    reference.check("o", o, o_ref, dtype)
    reference.check("lse", lse, lse_ref, torch.float16)
    for name, got, want in zip("qkv", leaves, ref_leaves):
        reference.check("d" + name, got.grad, want.grad, dtype)
    # the -inf sink: no gradient (exp(-inf) = 0); the others the reference's
    reference.check("dsinks", s_leaf.grad, torch.nan_to_num(s_ref.grad, nan=0.0), torch.float16)


def test_rows_without_keys_get_the_sink():
    """causal top_left with Sq > Sk... every row sees key 0; use a window
    that leaves early rows empty: o = 0 and lse = the sink."""
    q, k, v, _ = reference.inputs(1, 4, 4, 8, 8, 32, torch.float32, 1)
    sinks = torch.tensor([2.0, -1.0, 0.5, 3.0])
    o, lse = at.attention(q, k, v, mask="k >= 5 && k <= q", sinks=sinks, return_lse=True)
    assert torch.equal(o[:, :, :5], torch.zeros_like(o[:, :, :5]))
    assert torch.allclose(lse[0, :, :5], sinks.view(4, 1).expand(4, 5))


def test_varlen_sinks():
    seqs_q, seqs_k = [5, 0, 9], [7, 3, 12]
    hq, hkv, d = 4, 2, 32
    g = torch.Generator().manual_seed(5)
    pack = lambda seqs, h: torch.cat([torch.randn(n, h, d, generator=g) for n in seqs])
    cu = lambda seqs: torch.tensor([0] + list(torch.tensor(seqs).cumsum(0)), dtype=torch.int32)
    q, k, v, do = pack(seqs_q, hq), pack(seqs_k, hkv), pack(seqs_k, hkv), pack(seqs_q, hq)
    sinks = sink_logits(hq, 9).float().requires_grad_()
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    o = at.attention_varlen(*leaves, cu(seqs_q), cu(seqs_k), max(seqs_q), max(seqs_k),
                            causal="bottom_right", sinks=sinks)
    o.backward(do)
    s_ref = sink_logits(hq, 9).requires_grad_()
    loss, at_q, at_k = 0.0, 0, 0
    for sq, sk in zip(seqs_q, seqs_k):
        part = lambda t, at, n: t[at:at + n].double().transpose(0, 1).unsqueeze(0)
        seen = reference.visible(1, hq, sq, sk, causal="bottom_right")
        o_ref, _ = reference.attention(part(q, at_q, sq), part(k, at_k, sk), part(v, at_k, sk),
                                       seen=seen, sinks=s_ref)
        reference.check("o", o[at_q:at_q + sq].transpose(0, 1).unsqueeze(0), o_ref, torch.float32)
        loss = loss + (o_ref * part(do, at_q, sq)).sum()
        at_q, at_k = at_q + sq, at_k + sk
    loss.backward()
    reference.check("dsinks", sinks.grad, torch.nan_to_num(s_ref.grad, nan=0.0), torch.float32)


def test_dropout_with_sinks_changes_only_the_denominator():
    """The same dropout stream with and without sinks: o with sinks is o
    without them scaled by exp(lse - lse_with_sinks), row by row."""
    q, k, v, _ = reference.inputs(1, 4, 4, 16, 16, 32, torch.float32, 2)
    sinks = torch.tensor([1.0, 0.0, -2.0, 0.5])
    torch.manual_seed(0)
    o0, lse0 = at.attention(q, k, v, causal=True, dropout_p=0.3, return_lse=True)
    torch.manual_seed(0)
    o1, lse1 = at.attention(q, k, v, causal=True, dropout_p=0.3, sinks=sinks, return_lse=True)
    assert torch.allclose(lse1, torch.logaddexp(lse0, sinks.view(1, 4, 1)), atol=1e-5)
    assert torch.allclose(o1, o0 * torch.exp(lse0 - lse1).unsqueeze(-1), atol=1e-5)


def test_sinks_gradient_is_repeatable_and_compiles():
    q, k, v, do = reference.inputs(2, 8, 2, 64, 64, 64, torch.bfloat16, 4)
    grads = []
    f = torch.compile(lambda q, k, v, s: at.attention(q, k, v, causal=True, sinks=s),
                      fullgraph=True)
    for fn in (lambda *a: at.attention(*a[:3], causal=True, sinks=a[3]), f, f):
        s = sink_logits(8, 1).float().requires_grad_()
        fn(q, k, v, s).backward(do)
        grads.append(s.grad.clone())
    assert torch.equal(grads[0], grads[1]) and torch.equal(grads[1], grads[2])


@pytest.mark.parametrize("bad", [torch.zeros(3), torch.zeros(4, 1), torch.zeros(4, dtype=torch.int32)])
def test_bad_sinks_raise(bad):
    q, k, v, _ = reference.inputs(1, 4, 4, 8, 8, 32, torch.float32, 0)
    with pytest.raises(attnjit.InvalidArgError, match="sinks"):
        at.attention(q, k, v, sinks=bad)


# ---------------------------------------------------------------- context parallelism

CP_CASES = [  # (method, layout, rotate, options)
    ("ring", "zigzag", "p2p", dict(causal=True)),
    ("ring", "contiguous", "allgather", dict(causal="bottom_right", window=(5, None))),
    ("ring", "zigzag", "p2p", dict(mask="k % 3 != 1")),
    ("ulysses", "zigzag", None, dict(causal=True)),
    ("ulysses", "contiguous", None, dict(window=(4, 4))),
]


def _sinks_cp_worker(rank, world, init_file):
    from cp_check import check_replicated_grad

    def sinks():
        t = sink_logits(4, 2).float().requires_grad_()
        return t, dict(sinks=t)
    check_replicated_grad(rank, world, init_file, CP_CASES, sinks, "dsinks")


@pytest.mark.parametrize("world", [2])
def test_context_parallel_sinks_equal_one_rank(world):
    """ring (p2p, all-gather) and Ulysses with sinks: each rank's shards of
    o, lse, dq, dk, dv and the whole dsinks equal one rank's attention (the
    ring starts its accumulator from the sinks, so they count once)."""
    import os
    import tempfile
    import torch.multiprocessing as mp
    with tempfile.TemporaryDirectory() as tmp:
        mp.spawn(_sinks_cp_worker, args=(world, os.path.join(tmp, "init")), nprocs=world, join=True)
