"""Gradients of side tensors from Python (docs/ir.md "Gradients of side
tensors"): a float tensor in tensors={...} that requires grad gets its
gradient through autograd, against the float64 reference whose score_mod
reads the same tensor (torch autograd there): FlexAttention's learnable
relative bias, learned ALiBi slopes, a per-head gate, over dtype x
variant x mask; alibi_slopes that require grad (with and without
softcap); through flex_attention with a captured nn.Parameter;
bitwise repeatable; torch.compile(fullgraph=True); ring (p2p,
all-gather) and Ulysses over 2 gloo ranks against one rank; with
dropout, with a bias, and over attention_varlen's sequences."""
import pytest

torch = pytest.importorskip("torch")
import attnjit  # noqa: E402
import attnjit.torch as at  # noqa: E402
import reference  # noqa: E402

DTYPES = [torch.float32, torch.float16, torch.bfloat16]
MASKS = {  # name: (attention's options, the reference's visibility options)
    "none": (dict(), dict()),
    "causal": (dict(causal="bottom_right"), dict(causal="bottom_right")),
    "window": (dict(window=(5, 0), causal="bottom_right"),
               dict(window=(5, 0), causal="bottom_right")),
}
# name: (the IR expression, the tensor's shape for (hq, s), the reference's score_mod)
MODS = {
    "relative_bias": ("score + rb[abs(q - k)]", lambda hq, s: (2 * s,),
                      lambda t: lambda sc, b, h, q, k: sc + t[(q - k).abs()]),
    "alibi_slopes": ("score - rb[h] * abs(q - k)", lambda hq, s: (hq,),
                     lambda t: lambda sc, b, h, q, k: sc - t[h] * (q - k).abs()),
    "head_gate": ("score * (1.0 + 0.5 * tanh(rb[h])) + rb[h + 4] * tanh(score / 4.0)",
                  lambda hq, s: (hq + 4,),
                  lambda t: lambda sc, b, h, q, k: sc * (1 + 0.5 * torch.tanh(t[h]))
                  + t[h + 4] * torch.tanh(sc / 4)),
}


def check_grads(o, o_ref, leaves, ref_leaves, side, ref_side, name, dtype):
    """o and dq, dk, dv against the reference's, and the side tensor's
    gradient (`name`): a sum of many terms, at f16's tolerance (bf16's for
    bf16, twice over: every term carries bf16's rounding of P and dS and
    the sum cancels, so its error follows the terms, not the sum -- on an
    AVX2 host's bf16 path dslopes missed 1x by 6%)."""
    reference.check("o", o, o_ref, dtype)
    for x, got, want in zip("qkv", leaves, ref_leaves):
        reference.check("d" + x, got.grad, want.grad, dtype)
    bf16 = dtype == torch.bfloat16
    reference.check(name, side.grad, ref_side.grad, torch.bfloat16 if bf16 else torch.float16,
                    slack=2.0 if bf16 else 1.0)


CASES = [(dtype, variant, mask, mod) for dtype in DTYPES for variant in ("flash", "efficient")
         for mask in sorted(MASKS) for mod in sorted(MODS)]


@pytest.mark.parametrize("dtype,variant,mask,mod", CASES,
                         ids=["%s-%s-%s-%s" % (str(c[0])[6:], c[1], c[2], c[3]) for c in CASES])
def test_side_grad_matches_reference(dtype, variant, mask, mod):
    b, hq, hkv, sq, sk, d = 2, 4, 2, 11, 19, 32
    q, k, v, do = reference.inputs(b, hq, hkv, sq, sk, d, dtype, 5)
    text, shape, ref_mod = MODS[mod]
    g = torch.Generator().manual_seed(9)
    base = torch.randn(*shape(hq, sk), generator=g, dtype=torch.float64) * 0.5
    if mod == "alibi_slopes":
        base = base.abs() * 0.2
    opts, ref_opts = MASKS[mask]
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    rb = base.float().requires_grad_()
    o = at.attention(*leaves, score_mod=text, tensors={"rb": rb}, variant=variant, **opts)
    o.backward(do)
    ref_leaves = [t.double().requires_grad_() for t in (q, k, v)]
    rb_ref = base.clone().requires_grad_()
    seen = reference.visible(b, hq, sq, sk, **ref_opts)
    o_ref, _ = reference.attention(*ref_leaves, seen=seen, score_mod=ref_mod(rb_ref))
    o_ref.backward(do.double())
    check_grads(o, o_ref, leaves, ref_leaves, rb, rb_ref, "drb", dtype)


def test_flex_learnable_bias_and_repeatable():
    """FlexAttention's TestLearnableBiases: a captured parameter indexed by
    the distance; its gradient equals the reference's and is the same bits
    on a second backward."""
    b, hq, s, d = 1, 2, 24, 32
    q, k, v, do = reference.inputs(b, hq, hq, s, s, d, torch.float32, 3)
    bias = torch.nn.Parameter(torch.randn(hq, 2 * s, dtype=torch.float32) * 0.3)

    def mod(score, b_, h, q_idx, kv_idx):
        return score + bias[h, (q_idx - kv_idx).abs()]

    def run():
        bias.grad = None
        leaves = [t.clone().requires_grad_() for t in (q, k, v)]
        o = at.flex_attention(*leaves, score_mod=mod)
        o.backward(do)
        return bias.grad.clone(), leaves

    first, leaves = run()
    again, _ = run()
    assert torch.equal(first, again), "the bias gradient differs between runs"
    ref_bias = bias.detach().double().requires_grad_()
    ref_leaves = [t.double().requires_grad_() for t in (q, k, v)]
    o_ref, _ = reference.attention(*ref_leaves, score_mod=lambda sc, b_, h, qi, ki:
                                   sc + ref_bias[h, (qi - ki).abs()])
    o_ref.backward(do.double())
    reference.check("dbias", first, ref_bias.grad, torch.float16)
    reference.check("dq", leaves[0].grad, ref_leaves[0].grad, torch.float32)


def test_compile_fullgraph():
    """torch.compile(fullgraph=True) traces the op with a grad side tensor;
    its gradients are eager's."""
    q, k, v, do = reference.inputs(1, 2, 2, 16, 16, 32, torch.float32, 11)
    rb = (torch.randn(32) * 0.3).requires_grad_()

    def f(q, k, v, rb):
        return at.attention(q, k, v, causal=True, score_mod="score + rb[abs(q - k)]",
                            tensors={"rb": rb})

    grads = []
    for fn in (f, torch.compile(f, fullgraph=True)):
        rb.grad = None
        leaves = [t.clone().requires_grad_() for t in (q, k, v)]
        fn(*leaves, rb).backward(do)
        grads.append((rb.grad.clone(), leaves[0].grad.clone()))
    assert torch.equal(grads[0][0], grads[1][0])
    assert torch.equal(grads[0][1], grads[1][1])


def test_constant_when_not_requiring_grad():
    """A tensor that does not require grad stays a constant: no gradient,
    the same output."""
    q, k, v, do = reference.inputs(1, 2, 2, 8, 8, 32, torch.float32, 2)
    rb = torch.randn(16)
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    o = at.attention(*leaves, score_mod="score + rb[abs(q - k)]", tensors={"rb": rb})
    o.backward(do)
    assert rb.grad is None and leaves[0].grad is not None


def _learned(mod, hq, sk, generator):
    """What a case learns, "alibi" (alibi_slopes) or a MODS table (in
    tensors as rb): its float64 start, the reference's score_mod of a
    tensor, and attention's options that carry a tensor."""
    if mod == "alibi":
        return (torch.linspace(0.05, 0.6, hq, dtype=torch.float64),
                lambda t: lambda sc, b_, h, qi, ki: sc - t[h] * (qi - ki).abs(),
                lambda t: dict(alibi_slopes=t))
    text, shape, ref_mod = MODS[mod]
    base = torch.randn(*shape(hq, sk), generator=generator, dtype=torch.float64) * 0.5
    return base, ref_mod, lambda t: dict(score_mod=text, tensors={"rb": t})


DROPOUT_CASES = [("relative_bias", torch.float32, "flash"), ("head_gate", torch.float16, "efficient"),
                 ("alibi", torch.bfloat16, "flash"), ("alibi", torch.float32, "efficient")]


@pytest.mark.parametrize("mod,dtype,variant", DROPOUT_CASES,
                         ids=["%s-%s-%s" % (c[0], str(c[1])[6:], c[2]) for c in DROPOUT_CASES])
def test_side_grad_with_dropout(mod, dtype, variant):
    """With dropout the side tensors' gradients (and alibi_slopes') use the
    forward's keep mask: read back from a run with V = I and the same torch
    seed, it makes the float64 reference's dropout."""
    b, hq, hkv, sq, sk, d, p = 1, 4, 2, 12, 24, 32, 0.25   # sk: V = I is a head dim
    q, k, v, do = reference.inputs(b, hq, hkv, sq, sk, d, dtype, 8)
    opts = dict(causal="bottom_right", variant=variant, dropout_p=p)
    base, ref_mod, carry = _learned(mod, hq, sk, torch.Generator().manual_seed(3))
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    rb = base.float().requires_grad_()
    torch.manual_seed(21)
    o = at.attention(*leaves, **carry(rb), **opts)
    o.backward(do)
    torch.manual_seed(21)   # the same stream, V = I: o is the dropped P
    eye = torch.eye(sk, dtype=dtype).expand(b, hkv, sk, sk)
    kept = at.attention(q, k, eye, **carry(base.float()), **opts) != 0
    ref_leaves = [t.double().requires_grad_() for t in (q, k, v)]
    rb_ref = base.clone().requires_grad_()
    o_ref, _ = reference.attention(*ref_leaves, seen=reference.visible(b, hq, sq, sk,
                                                                       causal="bottom_right"),
                                   score_mod=ref_mod(rb_ref), keep=kept, dropout_p=p)
    o_ref.backward(do.double())
    check_grads(o, o_ref, leaves, ref_leaves, rb, rb_ref, "drb", dtype)


BIAS_CASES = [("relative_bias", torch.float32), ("alibi", torch.float16),
              ("head_gate", torch.bfloat16)]


@pytest.mark.parametrize("mod,dtype", BIAS_CASES,
                         ids=["%s-%s" % (c[0], str(c[1])[6:]) for c in BIAS_CASES])
def test_side_grad_with_bias(mod, dtype):
    """With an additive bias (which requires grad too) the score_mod reads
    scale q.k + bias: the side tensor's gradient, alibi_slopes' and dbias
    against the float64 reference (the efficient variant)."""
    b, hq, hkv, sq, sk, d = 2, 4, 2, 10, 17, 32
    q, k, v, do = reference.inputs(b, hq, hkv, sq, sk, d, dtype, 12)
    g = torch.Generator().manual_seed(5)
    bias0 = torch.randn(1, hq, sq, sk, generator=g, dtype=torch.float64)
    base, ref_mod, carry = _learned(mod, hq, sk, g)
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    rb = base.float().requires_grad_()
    bias = bias0.to(dtype).requires_grad_()
    o = at.attention(*leaves, **carry(rb), bias=bias, causal=True)
    o.backward(do)
    ref_leaves = [t.double().requires_grad_() for t in (q, k, v)]
    rb_ref = base.clone().requires_grad_()
    bias_ref = bias0.to(dtype).double().requires_grad_()
    o_ref, _ = reference.attention(*ref_leaves, seen=reference.visible(b, hq, sq, sk,
                                                                       causal=True),
                                   bias=bias_ref, score_mod=ref_mod(rb_ref))
    o_ref.backward(do.double())
    check_grads(o, o_ref, leaves, ref_leaves, rb, rb_ref, "drb", dtype)
    reference.check("dbias", bias.grad, bias_ref.grad,
                    torch.bfloat16 if dtype == torch.bfloat16 else torch.float16)


VARLEN_CASES = [("relative_bias", torch.float32, "flash"), ("alibi", torch.float32, "efficient"),
                ("head_gate", torch.bfloat16, "flash")]


@pytest.mark.parametrize("mod,dtype,variant", VARLEN_CASES,
                         ids=["%s-%s-%s" % (c[0], str(c[1])[6:], c[2]) for c in VARLEN_CASES])
def test_varlen_side_grad(mod, dtype, variant):
    """attention_varlen over sequences of 5, 0, 9 and 1 queries (7, 3, 12,
    1 keys): the side tensor's (or alibi_slopes') gradient is the sum of
    every sequence's, against the float64 reference run on each sequence
    alone with the same tensor."""
    seqs_q, seqs_k, hq, hkv, d = [5, 0, 9, 1], [7, 3, 12, 1], 4, 2, 32
    g = torch.Generator().manual_seed(6)
    pack = lambda seqs, h: torch.cat([torch.randn(n, h, d, generator=g) for n in seqs])  # noqa
    cu = lambda seqs: torch.tensor([0] + list(torch.tensor(seqs).cumsum(0)),  # noqa: E731
                                   dtype=torch.int32)
    q, k, v, do = (pack(seqs_q, hq), pack(seqs_k, hkv), pack(seqs_k, hkv), pack(seqs_q, hq))
    q, k, v, do = (t.to(dtype) for t in (q, k, v, do))
    base, ref_mod, carry = _learned(mod, hq, max(seqs_k), g)
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    rb = base.float().requires_grad_()
    o = at.attention_varlen(*leaves, cu(seqs_q), cu(seqs_k), max(seqs_q), max(seqs_k),
                            causal="bottom_right", variant=variant, **carry(rb))
    o.backward(do)
    rb_ref = base.clone().requires_grad_()
    ref_leaves = [t.double().requires_grad_() for t in (q, k, v)]
    part = lambda t, at_, n: t[at_:at_ + n].transpose(0, 1).unsqueeze(0)  # noqa: E731
    loss, at_q, at_k = 0.0, 0, 0
    for sq, sk in zip(seqs_q, seqs_k):
        o_ref, _ = reference.attention(
            part(ref_leaves[0], at_q, sq), part(ref_leaves[1], at_k, sk),
            part(ref_leaves[2], at_k, sk), score_mod=ref_mod(rb_ref),
            seen=reference.visible(1, hq, sq, sk, causal="bottom_right"))
        reference.check("o", part(o, at_q, sq), o_ref, dtype)
        loss = loss + (o_ref * part(do.double(), at_q, sq)).sum()
        at_q, at_k = at_q + sq, at_k + sk
    loss.backward()
    for name, got, want in zip("qkv", leaves, ref_leaves):
        reference.check("d" + name, got.grad, want.grad, dtype)
    reference.check("drb", rb.grad, rb_ref.grad,
                    torch.bfloat16 if dtype == torch.bfloat16 else torch.float16)


CP_CASES = [  # method, layout, rotate, mask options
    ("ring", "zigzag", "p2p", dict(causal=True)),
    ("ring", "contiguous", "allgather", dict()),
    ("ring", "zigzag", "p2p", dict(mask="k % 3 != 1")),
    ("ulysses", "zigzag", None, dict(causal=True)),
]


def _side_grad_cp_worker(rank, world, init_file):
    from cp_check import check_replicated_grad
    base = torch.randn(32, generator=torch.Generator().manual_seed(4)) * 0.5

    def rb():
        t = base.clone().requires_grad_()
        return t, dict(tensors={"rb": t},
                       score_mod="score + rb[abs(q - k)] * 0.5 + rb[h] * tanh(score)")
    check_replicated_grad(rank, world, init_file, CP_CASES, rb, "drb")


def _side_grad_bf16_cp_worker(rank, world, init_file):
    from cp_check import check_replicated_grad
    base = (torch.randn(32, generator=torch.Generator().manual_seed(4)) * 0.5).bfloat16()

    def rb():
        t = base.clone().requires_grad_()
        return t, dict(tensors={"rb": t}, score_mod="score + rb[abs(q - k)] * 0.5")
    # the ranks' parts summed in f32 and rounded once: one bf16 rounding
    # apart from one rank's at most
    check_replicated_grad(rank, world, init_file, CP_CASES[::3], rb, "drb", tol=2 ** -7)


def _alibi_grad_cp_worker(rank, world, init_file):
    from cp_check import check_replicated_grad

    def slopes():
        t = torch.tensor([0.1, 0.2, 0.35, 0.5], requires_grad=True)
        return t, dict(alibi_slopes=t, softcap=10.0)
    check_replicated_grad(rank, world, init_file, CP_CASES[::3], slopes, "dslopes")


def _spawn(worker, world):
    import os
    import tempfile
    import torch.multiprocessing as mp
    with tempfile.TemporaryDirectory() as tmp:
        mp.spawn(worker, args=(world, os.path.join(tmp, "init")), nprocs=world, join=True)


@pytest.mark.parametrize("world", [2])
def test_context_parallel_alibi_grad_equal_one_rank(world):
    """Learned alibi slopes (with softcap) through the zigzag ring and
    Ulysses: the slopes' gradient summed over the ranks equals one rank's."""
    _spawn(_alibi_grad_cp_worker, world)


@pytest.mark.parametrize("world", [2])
def test_context_parallel_side_grad_equal_one_rank(world):
    """ring (p2p, all-gather) and Ulysses with a grad side tensor: each
    rank's shards and the whole gradient of the tensor, summed over the
    ranks in rank order, equal one rank's attention."""
    _spawn(_side_grad_cp_worker, world)


@pytest.mark.parametrize("world", [2])
def test_context_parallel_bf16_side_grad(world):
    """A bfloat16 grad side tensor through the zigzag ring and Ulysses:
    its gradient in bfloat16, one rounding of the ranks' f32 sum."""
    _spawn(_side_grad_bf16_cp_worker, world)


ALIBI_CASES = [(dtype, variant, mask, softcap) for dtype in DTYPES
               for variant in ("flash", "efficient") for mask in sorted(MASKS)
               for softcap in (None, 8.0)]


@pytest.mark.parametrize("dtype,variant,mask,softcap", ALIBI_CASES,
                         ids=["%s-%s-%s-%s" % (str(c[0])[6:], c[1], c[2],
                                               "softcap" if c[3] else "plain")
                              for c in ALIBI_CASES])
def test_alibi_slopes_grad(dtype, variant, mask, softcap):
    """alibi_slopes that require grad get d loss / d slopes (the slopes
    become a grad side tensor of the same expression), with and without
    softcap, against the float64 reference; slopes that do not stay the
    built-in alibi and get none."""
    b, hq, hkv, sq, sk, d = 2, 4, 2, 11, 19, 32
    q, k, v, do = reference.inputs(b, hq, hkv, sq, sk, d, dtype, 6)
    base = torch.linspace(0.05, 0.6, hq, dtype=torch.float64)
    opts, ref_opts = MASKS[mask]
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    slopes = base.float().requires_grad_()
    o = at.attention(*leaves, alibi_slopes=slopes, softcap=softcap, variant=variant, **opts)
    o.backward(do)
    ref_leaves = [t.double().requires_grad_() for t in (q, k, v)]
    ref_slopes = base.clone().requires_grad_()

    def ref_mod(sc, b_, h, qi, ki):
        if softcap is not None:
            sc = softcap * torch.tanh(sc / softcap)
        return sc - ref_slopes[h] * (qi - ki).abs()

    seen = reference.visible(b, hq, sq, sk, **ref_opts)
    o_ref, _ = reference.attention(*ref_leaves, seen=seen, score_mod=ref_mod)
    o_ref.backward(do.double())
    check_grads(o, o_ref, leaves, ref_leaves, slopes, ref_slopes, "dslopes", dtype)
    # constant slopes: the built-in alibi, the same output, no gradient
    fixed = base.float()
    o_fixed = at.attention(*[t.detach() for t in leaves], alibi_slopes=fixed,
                           softcap=softcap, variant=variant, **opts)
    reference.check("o (constant slopes)", o_fixed, o_ref, dtype)
    assert fixed.grad is None


BIAS_PROGRAM_CASES = [(dtype, side, shape) for dtype in DTYPES
                      for side in (torch.float16, torch.bfloat16, torch.float32)
                      for shape in ("full", "heads", "none")]


@pytest.mark.parametrize("dtype,side,shape", BIAS_PROGRAM_CASES,
                         ids=["%s-%s-%s" % (str(c[0])[6:], str(c[1])[6:], c[2])
                              for c in BIAS_PROGRAM_CASES])
def test_bias_is_a_program_over_a_side_tensor(dtype, side, shape):
    """bias=... is the program score + B[b, h, q, k] over a side tensor B
    (docs/ir.md "bias"): a float16 / bfloat16 B goes to the kernels as it
    is (its values read exactly), and on the efficient variant o, dq, dk,
    dv are bitwise the bias's, and so is B's gradient where B has the
    op's dtype (else it is the same f32 sums rounded to B's); the flash
    variant, which has no bias input, takes it as the program, at the
    reference's tolerance."""
    b, hq, hkv, sq, sk, d = 2, 4, 2, 10, 17, 32
    q, k, v, do = reference.inputs(b, hq, hkv, sq, sk, d, dtype, 21)
    bb, bh = {"full": (b, hq), "heads": (1, hq), "none": (1, 1)}[shape]
    g = torch.Generator().manual_seed(8)
    values = torch.randn(bb, bh, sq, sk, generator=g).to(side).to(dtype)  # held by both dtypes
    index = "%s, %s, q, k" % ("b" if bb > 1 else "0", "h" if bh > 1 else "0")
    runs = []
    for variant, program in (("efficient", False), ("efficient", True), ("flash", True)):
        leaves = [t.clone().requires_grad_() for t in (q, k, v)]
        bias = values.to(side if program else dtype, copy=True).requires_grad_()
        extra = (dict(score_mod="score + B[%s]" % index, tensors={"B": bias}) if program
                 else dict(bias=bias))
        o = at.attention(*leaves, **extra, causal="bottom_right", variant=variant)
        o.backward(do)
        assert bias.grad.dtype == bias.dtype
        runs.append([o] + [t.grad for t in leaves] + [bias.grad.float()])
    for name, want, got in zip(("o", "dq", "dk", "dv"), runs[0], runs[1]):
        assert torch.equal(got, want), name
    narrow = torch.bfloat16 if torch.bfloat16 in (dtype, side) else torch.float16
    if side == dtype:
        assert torch.equal(runs[1][4], runs[0][4]), "dB"
    else:
        reference.check("dB", runs[1][4], runs[0][4], narrow)
    for name, want, got in zip(("o", "dq", "dk", "dv"), runs[0], runs[2]):
        reference.check(name, got, want, dtype, slack=2.0)
    reference.check("dB", runs[2][4], runs[0][4], narrow, slack=2.0)
