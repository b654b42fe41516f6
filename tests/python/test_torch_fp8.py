"""attnjit.torch.attention / attention_varlen on float8 inputs (docs/python.md
"FP8 inputs") against the float64 reference of the dequantised inputs:
e4m3 and e5m2, per-tensor and per-head descales, 16-bit queries over an
f8 K/V, GQA, causal (both alignments), windows, an expression mask, softcap,
sinks, packed sequences; quantize_fp8 (its rotation keeps q.k); and the
calls it refuses, named."""
import math

import pytest

torch = pytest.importorskip("torch")
if not hasattr(torch, "float8_e4m3fn"):
    pytest.skip("torch has no float8 dtypes", allow_module_level=True)
import attnjit  # noqa: E402
import attnjit.torch as at  # noqa: E402
import reference as ref  # noqa: E402

E4M3, E5M2 = torch.float8_e4m3fn, torch.float8_e5m2


def dequant(x8, descale):
    """The float64 values an 8-bit tensor with its descale stands for."""
    shape = [1] * x8.dim()
    shape[1] = -1
    return x8.double() * descale.double().reshape(shape)


def cases():
    """One generator: each mask family with the other options cycling."""
    masks = [dict(), dict(causal=True), dict(causal="bottom_right"), dict(window=(7, 2)),
             dict(mask="k <= q + 3")]
    return [pytest.param(i, m, id="%d-%s" % (i, "-".join("%s=%s" % kv for kv in m.items())
                                              or "none"))
            for i, m in enumerate(masks * 2)]


@pytest.mark.parametrize("i, mask", cases())
def test_padded(i, mask):
    fmt = E4M3 if i % 2 == 0 else E5M2
    per_head, q8 = i % 4 < 2, i % 5 != 3
    hq, hkv, d = (4, 2, 64) if i % 3 else (6, 3, 128)
    g = torch.Generator().manual_seed(i)
    q, k, v = (torch.randn(2, h, s, d, generator=g) * 2 for h, s in ((hq, 37), (hkv, 45),
                                                                     (hkv, 45)))
    k8, kd = at.quantize_fp8(k, fmt, per_head=per_head)
    v8, vd = at.quantize_fp8(v, fmt, per_head=per_head)
    if q8:
        qx, qd = at.quantize_fp8(q, fmt, per_head=per_head)
        want_q = dequant(qx, qd)
    else:
        qx, qd = q.to(torch.bfloat16), None
        want_q = qx.double()
    softcap = 15.0 if i % 4 == 1 else None
    o, lse = at.attention(qx, k8, v8, q_descale=qd, k_descale=kd, v_descale=vd,
                          softcap=softcap, return_lse=True, **mask)
    assert o.dtype == torch.bfloat16 and o.shape == (2, hq, 37, d)
    expr = mask.get("mask")
    seen = ref.visible(2, hq, 37, 45, causal=mask.get("causal", False), window=mask.get("window"),
                       mask=(lambda b, h, qq, kk, sq, sk: kk <= qq + 3) if expr else None)
    o_ref, lse_ref = ref.attention(want_q, dequant(k8, kd), dequant(v8, vd), seen,
                                   softcap=softcap)
    ref.check("o", o, o_ref, torch.bfloat16)
    rows = ~torch.isinf(lse_ref)
    assert torch.allclose(lse[rows].double(), lse_ref[rows], atol=1e-4, rtol=1e-5)


def test_varlen_and_sinks():
    g = torch.Generator().manual_seed(7)
    lens_q, lens_k = [5, 0, 19], [9, 4, 19]
    cu_q = torch.tensor([0, 5, 5, 24], dtype=torch.int32)
    cu_k = torch.tensor([0, 9, 13, 32], dtype=torch.int32)
    q = torch.randn(24, 4, 64, generator=g)
    k = torch.randn(32, 2, 64, generator=g)
    v = torch.randn(32, 2, 64, generator=g)
    q8, qd = at.quantize_fp8(q, E4M3, per_head=True)
    k8, kd = at.quantize_fp8(k, E4M3, per_head=True)
    v8, vd = at.quantize_fp8(v, E4M3)
    sinks = torch.randn(4, generator=g)
    o, lse = at.attention_varlen(q8, k8, v8, cu_q, cu_k, 19, 19, causal="bottom_right",
                                 q_descale=qd, k_descale=kd, v_descale=vd, sinks=sinks,
                                 out_dtype=torch.float16, return_lse=True)
    assert o.dtype == torch.float16 and o.shape == (24, 4, 64)
    for b in range(3):
        q0, q1, k0, k1 = cu_q[b], cu_q[b + 1], cu_k[b], cu_k[b + 1]
        if q1 == q0:
            continue
        qs = dequant(q8[q0:q1], qd).transpose(0, 1).unsqueeze(0)
        ks = dequant(k8[k0:k1], kd).transpose(0, 1).unsqueeze(0)
        vs = dequant(v8[k0:k1], vd).transpose(0, 1).unsqueeze(0)
        seen = ref.visible(1, 4, lens_q[b], lens_k[b], causal="bottom_right")
        o_ref, lse_ref = ref.attention(qs, ks, vs, seen, sinks=sinks)
        ref.check("o[%d]" % b, o[q0:q1].transpose(0, 1), o_ref[0], torch.float16)
        assert torch.allclose(lse[:, q0:q1].double(), lse_ref[0], atol=1e-4, rtol=1e-5)


def test_flash_kernel_or_the_efficient_one(monkeypatch):
    """Q and K of one format ask for the flash variant first (on a GPU the
    FP8 tensor-core kernel); a target that refuses it (AJ_ERR_UNSUPPORTED:
    sm_80, a head dim off its steps) gets the efficient one, once asked;
    other errors pass through."""
    from attnjit.torch import _fp8
    asked = []
    real = _fp8._kernel
    refuse = {"status": "AJ_ERR_UNSUPPORTED"}

    def kernel(kind, variant, body, dev, *rest):
        asked.append(variant)
        if variant == "flash" and refuse["status"]:
            code = attnjit._capi.STATUS_NAMES.index(refuse["status"])
            raise attnjit.Error(code, "flash forward with 8-bit inputs refused (test)")
        return real(kind, variant, body, dev, *rest)

    monkeypatch.setattr(_fp8, "_kernel", kernel)
    monkeypatch.setattr(_fp8, "_no_flash", _fp8._Bounded(16))
    g = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(1, 2, 21, 64, generator=g) for _ in range(3))
    (q8, qd), (k8, kd), (v8, vd) = (at.quantize_fp8(t, E4M3) for t in (q, k, v))
    want, _ = ref.attention(dequant(q8, qd), dequant(k8, kd), dequant(v8, vd),
                            ref.visible(1, 2, 21, 21, causal=True))
    for call in range(2):
        o = at.attention(q8, k8, v8, q_descale=qd, k_descale=kd, v_descale=vd, causal=True)
        ref.check("o", o, want, torch.bfloat16)
    assert asked == ["flash", "efficient", "efficient"]   # the refusal is remembered
    asked.clear()
    q16 = q.to(torch.bfloat16)   # 16-bit queries: the efficient variant's alone
    at.attention(q16, k8, v8, k_descale=kd, v_descale=vd)
    assert asked == ["efficient"]
    refuse["status"], asked[:] = None, []   # a target that takes it: flash
    o = at.attention(q8, k8, v8, q_descale=qd, k_descale=kd, v_descale=vd, softcap=9.0)
    assert asked == ["flash"]
    refuse["status"] = "AJ_ERR_INTERNAL"
    with pytest.raises(attnjit.Error, match="AJ_ERR_INTERNAL"):
        at.attention(q8, k8, v8, q_descale=qd, k_descale=kd, v_descale=vd, softcap=7.0)


def test_quantize_rotation():
    """The Hadamard rotation keeps q.k, and on outlier-heavy inputs (FA3's:
    N(0, 1) plus N(0, 10^2) at 0.1% of the elements) the FP8 output's error
    drops with it."""
    g = torch.Generator().manual_seed(0)

    def draw():
        x = torch.randn(1, 2, 512, 128, generator=g, dtype=torch.float64)
        spikes = torch.rand(x.shape, generator=g, dtype=torch.float64) < 1e-3
        return x + 10 * torch.randn(x.shape, generator=g, dtype=torch.float64) * spikes

    q, k, v = draw(), draw(), draw()
    h = attnjit.torch._fp8._hadamard(128, q.device).double()
    assert torch.allclose((q @ h) @ (k @ h).transpose(-1, -2), q @ k.transpose(-1, -2))
    o_ref, _ = ref.attention(q, k, v)
    errs = []
    for rotate in (False, True):
        q8, qd = at.quantize_fp8(q, E4M3, rotate=rotate)
        k8, kd = at.quantize_fp8(k, E4M3, rotate=rotate)
        v8, vd = at.quantize_fp8(v, E4M3)
        o = at.attention(q8, k8, v8, q_descale=qd, k_descale=kd, v_descale=vd,
                         out_dtype=torch.float32)
        errs.append(((o.double() - o_ref).norm() / o_ref.norm()).item())
    assert errs[1] < 0.8 * errs[0], errs


@pytest.mark.parametrize("call, message", [
    (lambda q, k, v, s: at.attention(q, k, v, k_descale=s), "need k_descale and v_descale"),
    (lambda q, k, v, s: at.attention(q, k, v, q_descale=s, k_descale=s, v_descale=s),
     "q_descale goes with (and only with) float8 queries"),
    (lambda q, k, v, s: at.attention(q, k, v, q_descale=s, k_descale=s, v_descale=torch.ones(5)),
     "v_descale must be a float or a float tensor of 1 or 2 (one per KV head) elements"),
    (lambda q, k, v, s: at.attention(q, k, v, q_descale=s, k_descale=s, v_descale=s,
                                     dropout_p=0.1), "dropout_p with FP8 inputs"),
    (lambda q, k, v, s: at.attention(q, k.to(torch.bfloat16), v, q_descale=s, k_descale=s,
                                     v_descale=s), "k and v of one float8 dtype"),
])
def test_refused(call, message):
    q8 = torch.zeros(1, 4, 8, 64).to(E4M3)
    kv8 = torch.zeros(1, 2, 8, 64).to(E4M3)
    s = torch.ones(1)
    q = q8 if "only with" not in message else torch.zeros(1, 4, 8, 64, dtype=torch.bfloat16)
    with pytest.raises(attnjit.InvalidArgError, match=message.replace("(", r"\(")
                       .replace(")", r"\)")):
        call(q, kv8, kv8, s)


def test_16bit_call_refuses_descales():
    q = torch.zeros(1, 2, 8, 64)
    with pytest.raises(attnjit.InvalidArgError, match="apply to FP8 inputs"):
        at.attention(q, q, q, q_descale=1.0)
    assert math.isfinite(at.attention(q, q, q).sum().item())
