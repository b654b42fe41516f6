"""oob= (docs/ir.md "Side tensors in bounds"): by default a mask or
score_mod whose side-tensor load may leave its tensor over the call's
positions raises InvalidArgError naming the tensor and the index's range;
a guarded index (clamp, a select or && on a bound) runs; oob="zero" keeps
the IR's rule (the load reads 0) and matches the reference that reads 0."""
import pytest

torch = pytest.importorskip("torch")
import attnjit  # noqa: E402
import attnjit.torch as at  # noqa: E402
import reference  # noqa: E402

S, H, D = 16, 2, 32


def qkv(seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(1, H, S, D, generator=g) for _ in range(3)]


def test_unguarded_table_raises_naming_it():
    rel = torch.randn(H, 9)
    with pytest.raises(attnjit.InvalidArgError, match=r"'rel': index 1 of a load may be -11 \.\. 19"):
        at.attention(*qkv(), score_mod="score + rel[h, q - k + 4]", tensors={"rel": rel})


@pytest.mark.parametrize("expr", ["score + rel[h, clamp(q - k, -4, 4) + 4]",
                                  "abs(q - k) <= 4 ? score + rel[h, q - k + 4] : score"])
def test_guarded_table_runs(expr):
    rel = torch.randn(H, 9)
    o = at.attention(*qkv(), score_mod=expr, tensors={"rel": rel})
    assert torch.isfinite(o).all()


def test_band_guards_a_mask_load():
    tab = torch.ones(7, dtype=torch.int32)
    at.attention(*qkv(), mask="q - k < 4 && q - k > -4 && tab[q - k + 3] > 0",
                 tensors={"tab": tab})


def test_oob_zero_reads_zero():
    q, k, v = qkv(1)
    rel = torch.randn(H, 9)
    o = at.attention(q, k, v, score_mod="score + rel[h, q - k + 4]", tensors={"rel": rel},
                     oob="zero")
    rel_at = lambda h, d: torch.where((d >= -4) & (d <= 4), rel[h.clamp(0, H - 1),
                                                                 (d + 4).clamp(0, 8)], 0.0)
    o_ref, _ = reference.attention(q, k, v, score_mod=lambda s, b, h, qq, kk:
                                   s + rel_at(h.expand(1, H, S, S), (qq - kk).expand(1, H, S, S)))
    ok, why = reference.close(o, o_ref, torch.float32)
    assert ok, why


def test_bad_oob_value():
    with pytest.raises(attnjit.InvalidArgError, match="oob"):
        at.attention(*qkv(), oob="ignore")
