"""attnjit.torch.attention_varlen (packed sequences, FlashAttention's varlen
layout) against the float64 reference run on each sequence alone: forward
(o, lse) and backward (dq, dk, dv) for every dtype, both variants, every
head dim of 8..512 (D != Dv), the
masks (causal in both alignments and windows apply per sequence), GQA,
softcap and alibi, an expression mask over the sequence index with a side
tensor; empty sequences; torch.compile(fullgraph=True); bad offsets and
bounds raise InvalidArgError."""
import math

import pytest

torch = pytest.importorskip("torch")
import attnjit  # noqa: E402
import attnjit.torch as at  # noqa: E402
import reference  # noqa: E402

DTYPES = [torch.float32, torch.float16, torch.bfloat16]
SEQS_Q = [5, 0, 17, 9, 1]      # a sequence of no rows, one of one row
SEQS_K = [7, 3, 17, 12, 0]     # and one of no keys (its rows: o = 0, lse = -inf)
HQ, HKV, D, DV = 4, 2, 32, 24

OPTIONS = {  # name: (attention_varlen's options, the reference's per sequence)
    "none": (dict(), lambda b: (dict(), dict())),
    "causal": (dict(causal=True), lambda b: (dict(causal=True), dict())),
    "causal_bottom_right": (dict(causal="bottom_right"),
                            lambda b: (dict(causal="bottom_right"), dict())),
    "window": (dict(window=(3, 2)), lambda b: (dict(window=(3, 2)), dict())),
    "softcap_alibi": (dict(softcap=5.0, alibi_slopes=torch.tensor([0.5, 0.25, 0.125, 0.0625])),
                      lambda b: (dict(), dict(softcap=5.0, alibi_slopes=torch.tensor(
                          [0.5, 0.25, 0.125, 0.0625])))),
    # b is the sequence: sequence b sees keys within span[b] of its row
    "expr_per_sequence": (dict(mask="abs(q - k) <= span[b]",
                               tensors={"span": torch.tensor([1, 2, 3, 4, 5], dtype=torch.int32)}),
                          lambda b: (dict(mask=lambda bb, h, q, k, sq, sk, s=b + 1:
                                          (q - k).abs() <= s), dict())),
}


def pack(seqs, h, d, dtype, seed):
    g = torch.Generator().manual_seed(seed)
    parts = [torch.randn(n, h, d, generator=g, dtype=torch.float64).to(dtype) for n in seqs]
    cu = torch.tensor([0] + list(torch.tensor(seqs).cumsum(0)), dtype=torch.int32)
    return torch.cat(parts), cu


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("variant", ["flash", "efficient"])
@pytest.mark.parametrize("name", sorted(OPTIONS))
def test_varlen_matches_each_sequence(dtype, variant, name):
    opts, per_seq = OPTIONS[name]
    check_each_sequence(dtype, variant, name, opts, per_seq, D, DV)


# every head dim of the cpu's range (8..512, D != Dv where Dv walks it with
# a stride prime to its 64 values), dtypes and variants in turn, causal
SWEEP = [(8 * (i + 1), 8 * ((7 * i + 3) % 64 + 1), DTYPES[i % 3],
          ("flash", "efficient")[i // 3 % 2]) for i in range(64)]


@pytest.mark.parametrize("d,dv,dtype,variant", SWEEP,
                         ids=["d%d-dv%d-%s-%s" % (d, dv, str(t)[6:], var)
                              for d, dv, t, var in SWEEP])
def test_varlen_head_dims(d, dv, dtype, variant):
    opts, per_seq = OPTIONS["causal_bottom_right"]
    check_each_sequence(dtype, variant, "d%d/%d" % (d, dv), opts, per_seq, d, dv)


def check_each_sequence(dtype, variant, name, opts, per_seq, D, DV):
    """attention_varlen's o, lse, dq, dk, dv against the reference run on
    each sequence alone."""
    q, cu_q = pack(SEQS_Q, HQ, D, dtype, 0)
    k, cu_k = pack(SEQS_K, HKV, D, dtype, 1)
    v, _ = pack(SEQS_K, HKV, DV, dtype, 2)
    do, _ = pack(SEQS_Q, HQ, DV, dtype, 3)
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    o, lse = at.attention_varlen(*leaves, cu_q, cu_k, max(SEQS_Q), max(SEQS_K),
                                 variant=variant, return_lse=True, **opts)
    assert o.shape == (sum(SEQS_Q), HQ, DV) and lse.shape == (HQ, sum(SEQS_Q))
    o.backward(do)
    for b, (sq, sk) in enumerate(zip(SEQS_Q, SEQS_K)):
        rows, keys = slice(cu_q[b], cu_q[b + 1]), slice(cu_k[b], cu_k[b + 1])
        vis, ref = per_seq(b)
        # this sequence alone, (1, H, S, D), in float64 with autograd
        sq_, sk_, sv = (t.detach()[r].transpose(0, 1).unsqueeze(0).double().requires_grad_()
                        for t, r in ((q, rows), (k, keys), (v, keys)))
        ro, rlse = reference.attention(sq_, sk_, sv,
                                       seen=reference.visible(1, HQ, sq, sk, **vis), **ref)
        ro.backward(do[rows].transpose(0, 1).unsqueeze(0).double())
        what = "%s sequence %d (%d rows, %d keys)" % (name, b, sq, sk)
        got_o = o.detach()[rows].transpose(0, 1).unsqueeze(0)
        ok, why = reference.close(got_o, ro, dtype)
        assert ok, "%s: o: %s" % (what, why)
        got_lse, want_lse = lse[:, rows].unsqueeze(0), rlse
        finite = torch.isfinite(want_lse)
        assert torch.equal(torch.isfinite(got_lse), finite), what + ": lse -inf rows"
        assert (got_o.float()[~finite] == 0).all(), what + ": a row without keys has o = 0"
        ok, why = reference.close(got_lse[finite], want_lse[finite], torch.float32
                                  if dtype == torch.float32 else torch.float16)
        assert ok, "%s: lse: %s" % (what, why)
        for gname, leaf, want, r in (("dq", leaves[0], sq_, rows), ("dk", leaves[1], sk_, keys),
                                     ("dv", leaves[2], sv, keys)):
            got = leaf.grad[r].transpose(0, 1).unsqueeze(0)
            ok, why = reference.close(got, want.grad, dtype)
            assert ok, "%s: %s: %s" % (what, gname, why)


def test_varlen_equals_padded_when_lengths_are_equal():
    """Three sequences of 11 rows and 13 keys: attention on (3, H, S, D)."""
    q, cu_q = pack([11] * 3, HQ, D, torch.float32, 4)
    k, cu_k = pack([13] * 3, HKV, D, torch.float32, 5)
    v, _ = pack([13] * 3, HKV, D, torch.float32, 6)
    o = at.attention_varlen(q, k, v, cu_q, cu_k, 11, 13, causal="bottom_right", dropout_p=0.0)
    padded = at.attention(*(t.view(3, -1, t.shape[1], t.shape[2]).transpose(1, 2)
                            for t in (q, k, v)), causal="bottom_right")
    torch.testing.assert_close(o, padded.transpose(1, 2).reshape(o.shape), atol=1e-6, rtol=1e-6)


def test_varlen_compiles_fullgraph():
    q, cu_q = pack(SEQS_Q, HQ, D, torch.float32, 7)
    k, cu_k = pack(SEQS_K, HKV, D, torch.float32, 8)
    v, _ = pack(SEQS_K, HKV, D, torch.float32, 9)

    def f(q, k, v):
        return at.attention_varlen(q, k, v, cu_q, cu_k, 17, 17, causal=True).square().sum()

    q1, q2 = q.clone().requires_grad_(), q.clone().requires_grad_()
    f(q1, k, v).backward()
    torch.compile(f, fullgraph=True)(q2, k, v).backward()
    torch.testing.assert_close(q1.grad, q2.grad)


def test_varlen_bad_offsets_and_bounds():
    q, cu_q = pack([4, 6], HQ, D, torch.float32, 10)
    k, cu_k = pack([5, 6], HKV, D, torch.float32, 11)
    v, _ = pack([5, 6], HKV, D, torch.float32, 12)
    with pytest.raises(attnjit.InvalidArgError, match="int32"):
        at.attention_varlen(q, k, v, cu_q.long(), cu_k, 6, 6)
    with pytest.raises(attnjit.InvalidArgError, match="B \\+ 1"):
        at.attention_varlen(q, k, v, cu_q, cu_k[:2], 6, 6)
    with pytest.raises(attnjit.InvalidArgError, match="3-D"):
        at.attention_varlen(q.unsqueeze(0), k, v, cu_q, cu_k, 6, 6)
    with pytest.raises(attnjit.InvalidArgError, match="max_seqlen_q"):
        at.attention_varlen(q, k, v, cu_q, cu_k, 5.0, 6)
    with pytest.raises(attnjit.InvalidArgError, match="max_seqlen"):    # 6 rows > bound 4
        at.attention_varlen(q, k, v, cu_q, cu_k, 4, 6)
    bad = cu_k.clone()
    bad[1] = 12                                        # past Tk = 11, then decreasing
    with pytest.raises(attnjit.InvalidArgError, match="cu_seqlens_k"):
        at.attention_varlen(q, k, v, cu_q, bad, 6, 20)
    assert not math.isnan(at.attention_varlen(q, k, v, cu_q, cu_k, 6, 6).sum().item())
