"""attnjit.torch.flex_attention and create_block_mask (FlexAttention's
signatures): the score_mod and mask_mod functions of FlexAttention's
documentation and attention-gym, traced into attnjit expressions, against
the float64 reference that evaluates the same functions on broadcast
index tensors (forward and the gradients of q, k, v); torch's own eager
flex_attention agrees on a few; captured tensors become side tensors;
torch's BlockMask objects are taken by their mask_mod; an operation with no
expression form raises UnsupportedError naming it."""
import math

import pytest

torch = pytest.importorskip("torch")
import attnjit  # noqa: E402
import attnjit.torch as at  # noqa: E402
import reference  # noqa: E402

B, H, S, D = 2, 4, 48, 32
DOC = torch.tensor([[0] * 10 + [1] * 20 + [2] * 18, [0] * 30 + [1] * 18])
PREFIX = torch.tensor([7, 19])
SLOPES = torch.exp2(-torch.arange(1, H + 1) * 8.0 / H)
REL = torch.randn(H, 2 * S - 1, generator=torch.Generator().manual_seed(3))
KEEP = torch.rand(S, S, generator=torch.Generator().manual_seed(4)) > 0.3
QR = torch.randn(H, S, 64, generator=torch.Generator().manual_seed(5)) / 8
KR = torch.randn(S, 64, generator=torch.Generator().manual_seed(6)) / 8

MASKS = {
    "causal": lambda b, h, q, k: q >= k,
    "sliding_window": lambda b, h, q, k: (q >= k) & (q - k <= 8),
    "prefix_lm": lambda b, h, q, k: (k <= PREFIX[b]) | (q >= k),
    "document": lambda b, h, q, k: (DOC[b, q] == DOC[b, k]) & (q >= k),
    "dilated_window": lambda b, h, q, k: (abs(q - k) <= 12) & ((q - k) % 3 == 0),
    "natten_1d": lambda b, h, q, k: abs(torch.clamp(q, 4, S - 5) - k) <= 4,
    "captured_bool": lambda b, h, q, k: KEEP[q, k] | (q == k),
    "block_diagonal_shift": lambda b, h, q, k: ((q >> 3) == (k >> 3)) & (q >= k),
    "bit_pattern": lambda b, h, q, k: (((q ^ k) & 3) == 0) | (q == k),
    "bitwise_torch": lambda b, h, q, k: torch.bitwise_and(q, torch.bitwise_not(k)) == 0,
}
MODS = {
    "alibi": lambda s, b, h, q, k: s + SLOPES[h] * (k - q),
    "softcap": lambda s, b, h, q, k: 20.0 * torch.tanh(s / 20.0),
    "relative_bias": lambda s, b, h, q, k: s + REL[h, q - k + S - 1],
    "head_scale": lambda s, b, h, q, k: s * (1.0 + h / 8),
    "where_causal": lambda s, b, h, q, k: torch.where(q >= k, s, -float("inf")),
    # issue 33's: no sin, cos, tan before
    "trig": lambda s, b, h, q, k: torch.cos(s) * torch.sin(s) + torch.tan(b),
    "sigmoid_erf": lambda s, b, h, q, k: s * torch.sigmoid(s) + torch.erf(s / 4),
    "powers": lambda s, b, h, q, k: s - 0.01 * (q - k) ** 2 + torch.pow(s, 3) / 50,
    "exp2_log2": lambda s, b, h, q, k: torch.log2(torch.exp2(s / 2) + 1.0) + (q & 1),
    # issue 33's: a 64-wide rope dot product as in MLA's score (about 640
    # nodes, a left-deep sum 66 levels deep; 256 nodes and 32 levels before)
    "rope_dot64": lambda s, b, h, q, k: s + sum(QR[h, q, i] * KR[k, i] for i in range(64)),
}


def inputs(seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(B, H, S, D, generator=g, dtype=torch.float64).float() for _ in range(4)]


def broadcast(fn):
    """fn over (B, H, S, S) index tensors, as the reference reads it."""
    return lambda bb, hh, q, k, *rest: fn(bb, hh, q, k)


def check(name, score_mod, mask_mod):
    q, k, v, do = inputs()
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    bm = at.create_block_mask(mask_mod, B, H, S, S) if mask_mod else None
    o = at.flex_attention(*leaves, score_mod=score_mod, block_mask=bm)
    o.backward(do)
    ref = [t.double().requires_grad_() for t in (q, k, v)]
    seen = reference.visible(B, H, S, S, mask=broadcast(mask_mod)) if mask_mod else None
    o_ref, _ = reference.attention(*ref, seen=seen,
                                   score_mod=(lambda s, bb, hh, qq, kk:
                                              score_mod(s, bb, hh, qq, kk)) if score_mod else None)
    o_ref.backward(do.double())
    for what, got, want in [("o", o, o_ref)] + [("d" + n, a.grad, r.grad)
                                                 for n, a, r in zip("qkv", leaves, ref)]:
        ok, why = reference.close(got, want, torch.float32)
        assert ok, "%s: %s: %s" % (name, what, why)


@pytest.mark.parametrize("name", sorted(MASKS))
def test_mask_mods(name):
    check(name, None, MASKS[name])


@pytest.mark.parametrize("name", sorted(MODS))
def test_score_mods(name):
    check(name, MODS[name], MASKS["causal"] if name != "where_causal" else None)


def test_mod_and_mask_capture_apart():
    check("relative bias over documents", MODS["relative_bias"], MASKS["document"])


@pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile")
def test_torch_eager_flex_agrees():
    flex = pytest.importorskip("torch.nn.attention.flex_attention")
    q, k, v, _ = inputs(1)
    for score_mod, mask_mod in ((MODS["alibi"], MASKS["causal"]),
                                (MODS["softcap"], MASKS["document"])):
        bm = flex.create_block_mask(mask_mod, B, H, S, S, device="cpu")
        want = flex.flex_attention(q, k, v, score_mod=score_mod, block_mask=bm)
        got = at.flex_attention(q, k, v, score_mod=score_mod, block_mask=bm)  # torch's mask
        torch.testing.assert_close(got, want, atol=2e-5, rtol=2e-5)


def test_gqa_needs_enable_gqa():
    q, k, v, _ = inputs()
    k2, v2 = k[:, :2], v[:, :2]
    with pytest.raises(attnjit.InvalidArgError, match="enable_gqa"):
        at.flex_attention(q, k2, v2)
    o = at.flex_attention(q, k2, v2, enable_gqa=True, block_mask=at.create_block_mask(
        MASKS["causal"], B, H, S, S))
    assert o.shape == q.shape


@pytest.mark.parametrize("fn,what", [
    (lambda s, b, h, q, k: s if q > k else s * 2, "Python control flow"),
    (lambda s, b, h, q, k: s + torch.atan(s), "atan"),
    (lambda s, b, h, q, k: s ** 1.5, "exponent 1.5"),
    (lambda s, b, h, q, k: s + (s << 1), "'<<' of float and int"),
    (lambda s, b, h, q, k: s + REL, "used whole"),
])
def test_unsupported_operations_are_named(fn, what):
    q, k, v, _ = inputs()
    with pytest.raises(attnjit.UnsupportedError, match=what):
        at.flex_attention(q, k, v, score_mod=fn)
