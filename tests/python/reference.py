"""The float64 reference of the Python tests (docs/design.md, "Semantics"), in
plain torch: the oracle for attnjit.torch.attention's forward and, through
torch's autograd in float64, its backward."""
import math

import torch

TOLERANCE = {  # (atol, rtol) relative to the reference's largest magnitude
    torch.float32: (2e-5, 2e-5),
    torch.float16: (2e-3, 4e-3),
    torch.bfloat16: (1.6e-2, 3e-2),
}


def visible(b, h, sq, sk, causal=False, window=None, mask=None):
    """The (B, H, Sq, Sk) visibility of each key: the built-in masks by
    docs/design.md's rules, `mask` a callable over broadcast position tensors
    (b, h, q, k, sq, sk) standing for an IR expression."""
    q = torch.arange(sq).view(1, 1, sq, 1)
    k = torch.arange(sk).view(1, 1, 1, sk)
    bb = torch.arange(b).view(b, 1, 1, 1)
    hh = torch.arange(h).view(1, h, 1, 1)
    seen = torch.ones(b, h, sq, sk, dtype=torch.bool)
    shift = (sk - sq) if causal == "bottom_right" else 0
    if window is not None:
        left, right = (x if x is not None and x >= 0 else 2**31 - 1 for x in window)
        if causal:
            right = 0
        seen &= (q + shift - left <= k) & (k <= q + shift + right)
    elif causal:
        seen &= k <= q + shift
    if mask is not None:
        seen &= mask(bb, hh, q, k, sq, sk)
    return seen


def attention(q, k, v, seen=None, scale=None, bias=None, softcap=None, alibi_slopes=None,
              score_mod=None, keep=None, dropout_p=0.0, sinks=None):
    """Float64 attention over q (B, Hq, Sq, D), k and v (B, Hkv, Sk, .):
    (o, lse), both differentiable.  score_mod: callable(score, b, h, q, k);
    keep: the dropout keep mask (B, Hq, Sq, Sk); sinks: (Hq,) logits, one
    more softmax term per row (gpt-oss's, as its eager attention writes
    it: a column of the logits that the values then drop)."""
    q, k, v = q.double(), k.double(), v.double()
    B, Hq, Sq, D = q.shape
    group = Hq // k.shape[1]
    k = k.repeat_interleave(group, dim=1)
    v = v.repeat_interleave(group, dim=1)
    s = (q @ k.transpose(-1, -2)) * (1 / math.sqrt(D) if scale is None else scale)
    if bias is not None:
        s = s + bias.double()
    if softcap is not None:
        s = softcap * torch.tanh(s / softcap)
    qp = torch.arange(Sq).view(1, 1, Sq, 1)
    kp = torch.arange(k.shape[2]).view(1, 1, 1, -1)
    if alibi_slopes is not None:
        s = s - alibi_slopes.double().view(1, Hq, 1, 1) * (qp - kp).abs()
    if score_mod is not None:
        s = score_mod(s, torch.arange(B).view(B, 1, 1, 1), torch.arange(Hq).view(1, Hq, 1, 1),
                      qp, kp)
    if seen is not None:
        s = s.masked_fill(~seen, -math.inf)
    if sinks is not None:
        col = sinks.double().view(1, Hq, 1, 1).expand(B, Hq, Sq, 1)
        lse = torch.logsumexp(torch.cat([s, col], dim=-1), dim=-1)
    else:
        lse = torch.logsumexp(s, dim=-1)
    empty = torch.isinf(lse) & (lse < 0)
    p = torch.exp(s - torch.where(empty, torch.zeros_like(lse), lse).unsqueeze(-1))
    p = p.masked_fill(empty.unsqueeze(-1), 0.0)
    if keep is not None:
        p = p * keep.double() / (1 - dropout_p)
    return p @ v, lse


def inputs(b, hq, hkv, sq, sk, d, dtype, seed):
    """q, k, v and dO of a problem, standard normal in float64 rounded to
    dtype, from seed."""
    g = torch.Generator().manual_seed(seed)
    make = lambda *shape: torch.randn(*shape, generator=g, dtype=torch.float64).to(dtype)
    return make(b, hq, sq, d), make(b, hkv, sk, d), make(b, hkv, sk, d), make(b, hq, sq, d)


def check(name, got, want, dtype, slack=1.0):
    """Asserts close(got, want, dtype, slack), naming the result."""
    ok, why = close(got, want, dtype, slack)
    assert ok, "%s: %s" % (name, why)


def close(got, want, dtype, slack=1.0):
    """max |got - want| <= slack (atol + rtol * max |want|) for dtype's
    tolerance."""
    atol, rtol = TOLERANCE[dtype]
    want = want.double()
    err = (got.double() - want).abs().max().item() if want.numel() else 0.0
    bound = slack * (atol + rtol * (want.abs().max().item() if want.numel() else 0.0))
    return err <= bound, "error %.3g > bound %.3g" % (err, bound)
