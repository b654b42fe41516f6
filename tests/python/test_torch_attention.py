"""attnjit.torch.attention against the float64 reference (reference.py) and
torch's SDPA: forward (o, lse) and backward (dq, dk, dv, dbias) for every
dtype, the masks, GQA, softcap, alibi, bias, dropout, odd lengths, rows that
see no key, expression masks and score mods with side tensors, strides."""
import math

import pytest

torch = pytest.importorskip("torch")
import attnjit  # noqa: E402
import attnjit.torch as at  # noqa: E402
import reference  # noqa: E402

DTYPES = [torch.float32, torch.float16, torch.bfloat16]


def make(shape, dtype, scale=1.0, seed=0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(shape, generator=g, dtype=torch.float64) * scale).to(dtype)


def run_case(dtype, B=2, Hq=4, Hkv=2, Sq=37, Sk=45, D=64, Dv=None, ref=None, layout=None,
             input_scale=1.0, grads=True, **opts):
    """Runs attention with `opts` forward and backward, and the reference
    with `ref` (its keyword arguments; `seen` from reference.visible), and
    compares o, lse, dq, dk, dv (and dbias when opts has a bias)."""
    Dv = Dv or D
    q, k, v = (make((B, h, s, d), dtype, input_scale, i)
               for i, (h, s, d) in enumerate(((Hq, Sq, D), (Hkv, Sk, D), (Hkv, Sk, Dv))))
    if layout is not None:
        q, k, v = layout(q), layout(k), layout(v)
    leaves = [t.requires_grad_() for t in (q, k, v)]
    bias = opts.get("bias")
    if bias is not None:
        bias.requires_grad_()
        leaves.append(bias)
    o, lse = at.attention(q, k, v, return_lse=True, **opts)
    assert o.shape == (B, Hq, Sq, Dv) and o.dtype == dtype
    assert lse.shape == (B, Hq, Sq) and lse.dtype == torch.float32
    do = make(o.shape, dtype, 1.0, 9)
    if grads:
        o.backward(do)
    ref = dict(ref or {})
    ref_leaves = [t.detach().double().requires_grad_() for t in leaves]
    if bias is not None:
        ref["bias"] = ref_leaves[3]
    ro, rlse = reference.attention(*ref_leaves[:3], **ref)
    ok, why = reference.close(o, ro, dtype)
    assert ok, "o: " + why
    finite = torch.isfinite(rlse)
    assert torch.equal(torch.isfinite(lse), finite), "lse: -inf rows differ"
    assert (lse[~finite] == -math.inf).all()
    assert (o.float()[~finite] == 0).all(), "a row that sees no key has o = 0"
    ok, why = reference.close(lse[finite], rlse[finite], torch.float32 if dtype ==
                              torch.float32 else torch.float16)
    assert ok, "lse: " + why
    if not grads:
        return o, lse
    ro.backward(do.double())
    for name, got, want in zip(("dq", "dk", "dv", "dbias"), leaves, ref_leaves):
        assert got.grad is not None, name
        assert torch.isfinite(got.grad).all(), name
        ok, why = reference.close(got.grad, want.grad, dtype)
        assert ok, "%s: %s" % (name, why)
    return o, lse


MASKS = {
    "none": (dict(), dict()),
    "causal": (dict(causal=True), dict(causal=True)),
    "causal_bottom_right": (dict(causal="bottom_right"), dict(causal="bottom_right")),
    "window": (dict(window=(8, 4)), dict(window=(8, 4))),
    "window_causal_br": (dict(window=(6, None), causal="bottom_right"),
                         dict(window=(6, None), causal="bottom_right")),
}


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("mask", sorted(MASKS))
def test_masks(dtype, mask):
    opts, vis = MASKS[mask]
    run_case(dtype, ref=dict(seen=reference.visible(2, 4, 37, 45, **vis)), **opts)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_against_sdpa(dtype):
    """is_causal and GQA as torch's SDPA computes them in float64."""
    q, k, v = make((2, 8, 33, 64), dtype), make((2, 2, 33, 64), dtype, seed=1), \
        make((2, 2, 33, 64), dtype, seed=2)
    o = at.attention(q, k, v, causal=True)
    want = torch.nn.functional.scaled_dot_product_attention(
        q.double(), k.double(), v.double(), is_causal=True, enable_gqa=True)
    ok, why = reference.close(o, want, dtype)
    assert ok, why


def test_against_cpu_flash_kernel():
    """torch's own fused CPU kernel agrees where it applies (f32, causal)."""
    flash = getattr(torch.ops.aten, "_scaled_dot_product_flash_attention_for_cpu", None)
    if flash is None:
        pytest.skip("this torch has no _scaled_dot_product_flash_attention_for_cpu")
    q, k, v = (make((1, 4, 64, 64), torch.float32, seed=i) for i in range(3))
    want, want_lse = flash(q, k, v, 0.0, True)[:2]
    o, lse = at.attention(q, k, v, causal=True, return_lse=True)
    assert torch.allclose(o, want, atol=2e-5, rtol=2e-5)
    assert torch.allclose(lse, want_lse, atol=2e-5, rtol=2e-5)


@pytest.mark.parametrize("Hkv", [1, 4], ids=["mqa", "mha"])
def test_gqa_groups(Hkv):
    run_case(torch.float32, Hq=4, Hkv=Hkv)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_softcap(dtype):
    run_case(dtype, input_scale=3.0, softcap=5.0, ref=dict(softcap=5.0))


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_alibi(dtype):
    slopes = torch.tensor([0.5, 0.25, 0.125, 0.0625])
    run_case(dtype, alibi_slopes=slopes, causal=True,
             ref=dict(alibi_slopes=slopes, seen=reference.visible(2, 4, 37, 45, causal=True)))


def test_softcap_and_alibi_compose():
    slopes = torch.tensor([0.5, 0.25, 0.125, 0.0625])
    run_case(torch.float32, input_scale=3.0, softcap=5.0, alibi_slopes=slopes,
             ref=dict(softcap=5.0, alibi_slopes=slopes))


@pytest.mark.parametrize("softcap,learned,want", [
    (5.0, False, "score_mod = softcap(5.0) + alibi(aj_alibi_slopes)"),
    (5.0, True, "score_mod = softcap(5.0) + alibi(aj_alibi_slopes)"),
    (None, True, "score_mod = alibi(aj_alibi_slopes)"),
    (None, False, "score_mod = alibi\n")])
def test_alibi_ops_use_builtin_names(softcap, learned, want):
    """The op Python builds names the built-ins (docs/ir.md, "Score
    modifications"), as a C caller would write it: no formula."""
    from attnjit._options import _body
    body = _body("f32", 16, 16, False, None, softcap, True, False, None, 0.0, None, None, [],
                 alibi_grad=learned) + "\n"
    assert want in body and "tanh" not in body and "abs(" not in body
    assert ("aj_alibi_slopes: f32[1]" + (" grad" if learned else "") in body) == ("(" in want)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape", [(2, 4, 37, 45), (1, 4, 37, 45), (37, 45)],
                         ids=["full", "batch_broadcast", "2d"])
def test_bias(dtype, shape):
    bias = make(shape, dtype, 0.5, 7)
    run_case(dtype, bias=bias)


def test_scale():
    run_case(torch.float32, scale=0.05, ref=dict(scale=0.05))


@pytest.mark.parametrize("Sq,Sk,D,Dv", [(1, 1, 64, 64), (1, 77, 32, 32), (65, 3, 128, 128),
                                        (19, 23, 64, 32), (130, 129, 16, 16)])
def test_odd_lengths_and_head_dims(Sq, Sk, D, Dv):
    run_case(torch.float32, Sq=Sq, Sk=Sk, D=D, Dv=Dv, causal="bottom_right",
             ref=dict(seen=reference.visible(2, 4, Sq, Sk, causal="bottom_right")))


def test_rows_that_see_no_key():
    """bottom_right with Sq > Sk: the first Sq - Sk rows see nothing."""
    o, lse = run_case(torch.float32, Sq=40, Sk=9, causal="bottom_right",
                      ref=dict(seen=reference.visible(2, 4, 40, 9, causal="bottom_right")))
    assert (lse[:, :, :31] == -math.inf).all() and torch.isfinite(lse[:, :, 31:]).all()


def test_any_strides():
    """BSHD tensors seen as BHSD (FlashAttention's layout) and a sliced head
    dim: the op copies only what breaks the C rules."""
    bshd = lambda t: t.transpose(1, 2).contiguous().transpose(1, 2)  # noqa: E731
    run_case(torch.float32, layout=bshd, causal=True,
             ref=dict(seen=reference.visible(2, 4, 37, 45, causal=True)))
    wide = lambda t: torch.cat([t, t], dim=-1)[..., 3:3 + t.shape[-1]]  # noqa: E731
    run_case(torch.float32, layout=wide)


# ---------------------------------------------------------------- expressions

def test_document_mask_with_side_tensor():
    B, S = 2, 48
    doc = torch.tensor([[0] * 10 + [1] * 20 + [2] * 18, [0] * 30 + [1] * 18], dtype=torch.int32)

    def same_doc(b, h, q, k, sq, sk):
        return (doc[b.squeeze(-1).squeeze(-1)].unsqueeze(-1).gather(2, q.expand(B, 1, S, 1))
                == doc[b.squeeze(-1).squeeze(-1)].unsqueeze(-2)) & (k <= q)
    seen = reference.visible(B, 4, S, S, mask=same_doc)
    for dtype in DTYPES:
        run_case(dtype, B=B, Sq=S, Sk=S, mask="doc[b, q] == doc[b, k] && k <= q",
                 tensors={"doc": doc}, ref=dict(seen=seen))


def test_expression_mask_composes_with_causal():
    seen = reference.visible(2, 4, 37, 45, causal="bottom_right",
                             mask=lambda b, h, q, k, sq, sk: (q + k) % 3 != 0)
    run_case(torch.float32, mask="(q + k) % 3 != 0", causal="bottom_right",
             ref=dict(seen=seen))


def test_score_mod_expression_with_float_table():
    """A T5-style relative bias: score + rel[h, clamp(q - k, -8, 8) + 8]."""
    rel = make((4, 17), torch.float32, 0.5, 3)

    def mod(s, b, h, q, k):
        return s + rel[h, (q - k).clamp(-8, 8) + 8]
    run_case(torch.float32, score_mod="score + rel[h, clamp(q - k, -8, 8) + 8]",
             tensors={"rel": rel}, ref=dict(score_mod=mod))


# ---------------------------------------------------------------- dropout

def test_dropout_statistics_and_gradient():
    """With V = I, o holds the dropped probabilities: a fraction p of them
    are 0, the rest are P / (1 - p); the same torch seed gives the same
    mask, and the backward uses the forward's mask."""
    p, B, H, S = 0.3, 2, 2, 64
    q, k = make((B, H, S, S), torch.float32), make((B, H, S, S), torch.float32, seed=1)
    eye = torch.eye(S).expand(B, H, S, S)
    torch.manual_seed(123)
    dropped = at.attention(q, k, eye, dropout_p=p)
    probs, _ = reference.attention(q, k, eye)
    kept = dropped != 0
    frac = 1 - kept.double().mean().item()
    n = kept.numel()
    assert abs(frac - p) < 5 * math.sqrt(p * (1 - p) / n), frac
    assert torch.allclose(dropped[kept].double(), probs[kept] / (1 - p), rtol=1e-5, atol=1e-7)
    torch.manual_seed(123)
    again = at.attention(q, k, eye, dropout_p=p)
    assert torch.equal(dropped, again)
    torch.manual_seed(123)
    run_case(torch.float32, B=B, Hq=H, Hkv=H, Sq=S, Sk=S, D=S, dropout_p=p,
             ref=dict(keep=kept, dropout_p=p))


# ---------------------------------------------------------------- errors

def test_errors_carry_status_and_message():
    q = make((1, 2, 8, 64), torch.float32)
    with pytest.raises(attnjit.ParseError) as e:
        at.attention(q, q, q, mask="doc[b, q] ==")
    assert e.value.status == "AJ_ERR_PARSE" and e.value.code == 2
    assert "unknown tensor 'doc'" in e.value.message
    assert "mask = expr(doc[b, q] ==)" in e.value.message   # the op, listed
    with pytest.raises(attnjit.VerifyError) as e:
        at.attention(q, q, q, bias=torch.zeros(8, 8), variant="flash")
    assert "bias" in e.value.message
    with pytest.raises(attnjit.InvalidArgError, match="float64"):
        at.attention(q.double(), q.double(), q.double())
    with pytest.raises(attnjit.InvalidArgError, match="causal"):
        at.attention(q, q, q, causal="middle")
    with pytest.raises(attnjit.InvalidArgError, match="multiple of the key.value heads"):
        at.attention(q, make((1, 3, 8, 64), torch.float32), make((1, 3, 8, 64), torch.float32))
    assert isinstance(attnjit.InvalidArgError(1, "x"), ValueError)


@pytest.mark.parametrize("warpgroups", [1, 2])
def test_warpgroups_select_the_wgmma_kernels_and_cpu_runs_its_own(warpgroups):
    """warpgroups=N puts schedule warpgroups on the forward and backward
    ops (the wgmma kernels on a Hopper GPU); the cpu runs its own kernels:
    o, lse and the gradients against the reference, o and lse bit for bit
    the plain call's."""
    seen = reference.visible(2, 4, 40, 40, causal="bottom_right")
    outs = []
    for wg in (None, warpgroups):
        o, lse = run_case(torch.bfloat16, Sq=40, Sk=40, causal="bottom_right", warpgroups=wg,
                          ref=dict(seen=seen))
        outs.append((o.detach(), lse))
    assert torch.equal(outs[0][0], outs[1][0]) and torch.equal(outs[0][1], outs[1][1])


def test_warpgroups_errors():
    q = make((1, 2, 8, 64), torch.bfloat16)
    with pytest.raises(attnjit.InvalidArgError, match=r"warpgroups = 3; want 1 or 2"):
        at.attention(q, q, q, warpgroups=3)
    with pytest.raises(attnjit.InvalidArgError, match="float16 and bfloat16 without bias"):
        at.attention(q.float(), q.float(), q.float(), warpgroups=1)
    with pytest.raises(attnjit.InvalidArgError, match="runs the efficient variant"):
        at.attention(q, q, q, bias=torch.zeros(8, 8, dtype=torch.bfloat16), warpgroups=2)
    packed, cu = q[0].transpose(0, 1).contiguous(), torch.tensor([0, 8], dtype=torch.int32)
    with pytest.raises(attnjit.InvalidArgError, match=r"warpgroups = True; want 1 or 2"):
        at.attention_varlen(packed, packed, packed, cu, cu, 8, 8, warpgroups=True)
    f8 = q.to(torch.float8_e4m3fn)
    with pytest.raises(attnjit.InvalidArgError, match="FP8 forward picks its Hopper"):
        at.attention(f8, f8, f8, q_descale=1.0, k_descale=1.0, v_descale=1.0, warpgroups=2)


def test_warpgroups_varlen_on_the_cpu():
    """attention_varlen with warpgroups: the cpu's own kernels, the plain
    call's outputs bit for bit."""
    q, k, v = (make((20, 2, 64), torch.bfloat16, 1.0, i) for i in range(3))
    cu = torch.tensor([0, 7, 20], dtype=torch.int32)
    o = [at.attention_varlen(q, k, v, cu, cu, 13, 13, causal=True, warpgroups=wg)
         for wg in (None, 2)]
    assert torch.equal(o[0], o[1])


def test_kernels_are_compiled_once_per_op_and_device():
    q = make((1, 2, 8, 64), torch.float32)
    at.attention(q, q, q, causal=True)
    n = at.kernel_cache_size()
    for _ in range(3):
        at.attention(q, q, q, causal=True)
    assert at.kernel_cache_size() == n
