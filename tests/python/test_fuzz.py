"""Property-based tests (hypothesis) of attnjit.torch.attention: whatever
the shapes, strides, dtypes, masks, expressions and options, a call either
matches the float64 reference (forward o and lse, backward dq, dk, dv) or
raises one of attnjit's typed errors (attnjit.Error) -- never a crash, a
hang, another exception, or NaN where the reference has none.

Draws: dtype f32/f16/bf16; B 1-2, Hkv 1-3, Hq a multiple; Sq, Sk 1-40;
head dims 8..512 (the cpu kernels' multiples of 8; odd ones and ones above
512 must raise UnsupportedError naming the head dim), Dv = D or another;
a scale of 0.25 to 2 times the default;
q/k/v laid out contiguous, as (B, S, H, D) transposed, strided along S, or
with a head dim read at stride 2; no mask, causal (both alignments), a
window, an expression mask (alone or with causal / a window); a softcap,
alibi slopes, a score_mod expression or none; the flash or
efficient variant.  Expressions come from a small grammar, each with its
Python twin for the reference.  Devices: the cpu (the GPU path is proven
on the emulator in the C tests).  The examples are derandomised, so a CI
run is repeatable; AJ_FUZZ_EXAMPLES sets how many (default 120 forward +
backward, 15 with refused head dims, 30 with dropout).
"""
import math
import os

import pytest

torch = pytest.importorskip("torch")
hypothesis = pytest.importorskip("hypothesis")
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

import attnjit  # noqa: E402
import attnjit.torch as at  # noqa: E402
import reference  # noqa: E402
from test_torch_attention import run_case  # noqa: E402

EXAMPLES = int(os.environ.get("AJ_FUZZ_EXAMPLES", "120"))
SETTINGS = dict(deadline=None, derandomize=True, database=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])

# (IR text with {c}, its reference over broadcast position tensors)
MASK_EXPRS = [
    ("k <= q + {c}", lambda c: lambda b, h, q, k, sq, sk: k <= q + c),
    ("(q + k) % {c} != 0", lambda c: lambda b, h, q, k, sq, sk: (q + k) % c != 0),
    ("abs(q - k) <= {c}", lambda c: lambda b, h, q, k, sq, sk: (q - k).abs() <= c),
    ("k >= q - {c} || k == 0", lambda c: lambda b, h, q, k, sq, sk: (k >= q - c) | (k == 0)),
    ("h % 2 == 0 || k < {c}", lambda c: lambda b, h, q, k, sq, sk: (h % 2 == 0) | (k < c)),
    ("k < sk - {c} && b >= 0", lambda c: lambda b, h, q, k, sq, sk: (k < sk - c) & (b >= 0)),
]
SCORE_EXPRS = [
    ("score * {a}", lambda a: lambda s, b, h, q, k: s * a),
    ("score - {a} * abs(q - k)", lambda a: lambda s, b, h, q, k: s - a * (q - k).abs()),
    ("{a} * tanh(score / {a})", lambda a: lambda s, b, h, q, k: a * torch.tanh(s / a)),
    ("score + (h + 1) * {a}", lambda a: lambda s, b, h, q, k: s + (h + 1) * a),
    ("max(score, {a} - 3)", lambda a: lambda s, b, h, q, k: torch.clamp(s, min=a - 3)),
]
LAYOUTS = {
    "contiguous": None,
    "bshd": lambda t: t.transpose(1, 2).contiguous().transpose(1, 2),
    "strided_s": lambda t: t.repeat_interleave(2, dim=2)[:, :, ::2],
    "strided_d": lambda t: t.repeat_interleave(2, dim=3)[..., ::2],
}
HEAD_DIMS = [8, 16, 24, 32, 40, 48, 64, 80, 96, 128, 160, 256, 264, 384, 448, 512]  # cpu: 8..512
ODD_HEAD_DIMS = [1, 5, 12, 100, 260, 520, 1000]                    # refused with a message


@st.composite
def cases(draw, head_dims=HEAD_DIMS):
    """(run_case keyword arguments, a label) for one call."""
    dtype = draw(st.sampled_from([torch.float32, torch.float16, torch.bfloat16]))
    B, Hkv = draw(st.integers(1, 2)), draw(st.integers(1, 3))
    Hq = Hkv * draw(st.integers(1, 3))
    Sq, Sk = draw(st.integers(1, 40)), draw(st.integers(1, 40))
    D = draw(st.sampled_from(head_dims))
    Dv = draw(st.sampled_from([D, D, 8, 24, 64]))
    layout = draw(st.sampled_from(sorted(LAYOUTS)))
    opts, vis, ref = {}, {}, {}
    kind = draw(st.sampled_from(["none", "causal", "causal_br", "window", "expr",
                                 "expr+causal", "expr+window"]))
    if kind in ("causal", "expr+causal"):
        vis["causal"] = opts["causal"] = True
    if kind == "causal_br":
        vis["causal"] = opts["causal"] = "bottom_right"
    if kind in ("window", "expr+window"):
        w = (draw(st.integers(0, 20)), draw(st.sampled_from([0, 3, None])))
        vis["window"] = opts["window"] = w
    if kind.startswith("expr"):
        text, twin = draw(st.sampled_from(MASK_EXPRS))
        c = draw(st.integers(1, 6))
        opts["mask"], vis["mask"] = text.format(c=c), twin(c)
    mod = draw(st.sampled_from(["none", "softcap", "alibi", "softcap+alibi", "expr"]))
    if "softcap" in mod:
        ref["softcap"] = opts["softcap"] = draw(st.sampled_from([2.0, 5.0, 30.0]))
    if "alibi" in mod:
        g = torch.Generator().manual_seed(draw(st.integers(0, 99)))
        ref["alibi_slopes"] = opts["alibi_slopes"] = torch.rand(Hq, generator=g)
    if mod == "expr":
        text, twin = draw(st.sampled_from(SCORE_EXPRS))
        a = draw(st.sampled_from([0.5, 1.5, 2.0]))
        opts["score_mod"], ref["score_mod"] = text.format(a=a), twin(a)
    if draw(st.booleans()):
        # around the default 1/sqrt(D): the tolerances assume scores of unit
        # scale (a half-precision backward reads O rounded to its dtype in
        # delta = rowsum(dO * O), an error that grows with the scores' spread)
        factor = draw(st.sampled_from([0.25, 0.5, 2.0]))
        ref["scale"] = opts["scale"] = factor / math.sqrt(D)
    opts["variant"] = draw(st.sampled_from([None, "flash", "efficient"]))
    ref["seen"] = reference.visible(B, Hq, Sq, Sk, **vis)
    label = "%s B%d H%d/%d S%d/%d D%d/%d %s %s %s %s" % (
        str(dtype)[6:], B, Hq, Hkv, Sq, Sk, D, Dv, layout, kind, mod, opts["variant"])
    return dict(dtype=dtype, B=B, Hq=Hq, Hkv=Hkv, Sq=Sq, Sk=Sk, D=D, Dv=Dv,
                layout=LAYOUTS[layout], ref=ref, **opts), label


OUTCOMES = {"matched": 0, "typed error": 0}
REFUSALS = {}   # error class and message's first line -> count


@settings(max_examples=EXAMPLES, **SETTINGS)
@given(cases())
def test_fuzz_matches_or_raises_typed(case):
    kwargs, label = case
    try:
        run_case(**kwargs)
    except attnjit.Error as e:   # a typed refusal with a message is a valid outcome
        assert str(e), label
        OUTCOMES["typed error"] += 1
        why = "%s: %s" % (type(e).__name__, str(e).splitlines()[0][:120])
        REFUSALS[why] = REFUSALS.get(why, 0) + 1
        return
    except AssertionError as e:
        raise AssertionError("%s: %s" % (label, e)) from None
    OUTCOMES["matched"] += 1


def test_fuzz_outcomes():
    """Most draws run: the property is not met by refusing everything."""
    n = sum(OUTCOMES.values())
    print("\nfuzz: %d examples, %d matched the reference, %d raised a typed error"
          % (n, OUTCOMES["matched"], OUTCOMES["typed error"]))
    for why, count in sorted(REFUSALS.items()):
        print("  %3d x %s" % (count, why))
    if n:
        assert OUTCOMES["matched"] >= n * 9 // 10, OUTCOMES


@settings(max_examples=max(EXAMPLES // 8, 1), **SETTINGS)
@given(cases(head_dims=ODD_HEAD_DIMS))
def test_fuzz_odd_head_dims_refused(case):
    """Head dims the cpu kernels do not take: UnsupportedError naming it."""
    kwargs, label = case
    with pytest.raises(attnjit.UnsupportedError, match="head_dim = %d" % kwargs["D"]):
        run_case(**kwargs)


@settings(max_examples=max(EXAMPLES // 4, 1), **SETTINGS)
@given(cases(), st.sampled_from([0.1, 0.5, 0.9]))
def test_fuzz_dropout_finite(case, p):
    """With dropout the output is random: it is finite wherever the
    reference without dropout is, and rows that see no key stay 0."""
    kwargs, label = case
    kw = {k: v for k, v in kwargs.items()
          if k not in ("ref", "layout", "dtype", "B", "Hq", "Hkv", "Sq", "Sk", "D", "Dv")}
    g = torch.Generator().manual_seed(1)
    q = torch.randn(kwargs["B"], kwargs["Hq"], kwargs["Sq"], kwargs["D"], generator=g)
    k = torch.randn(kwargs["B"], kwargs["Hkv"], kwargs["Sk"], kwargs["D"], generator=g)
    v = torch.randn(kwargs["B"], kwargs["Hkv"], kwargs["Sk"], kwargs["Dv"], generator=g)
    q, k, v = (t.to(kwargs["dtype"]).requires_grad_() for t in (q, k, v))
    try:
        o, lse = at.attention(q, k, v, dropout_p=p, return_lse=True, **kw)
        o.sum().backward()
    except attnjit.Error as e:
        assert str(e), label
        return
    seen = kwargs["ref"]["seen"].any(-1)
    assert torch.isfinite(o).all() and torch.isfinite(q.grad).all(), label
    assert (o.float()[~seen] == 0).all() and (lse[~seen] == -math.inf).all(), label
