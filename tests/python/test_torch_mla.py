"""attnjit.torch.mla_decode (absorbed multi-head latent attention over one
paged latent cache, kv_shared) against torch in float64: the pages gathered
per sequence, every query head over the one latent head, V the first
head_dim_v columns of the same rows.  DeepSeek-V3's shapes (576 = 512
latent + 64 rope, 16 and 128 query heads, scale 1/sqrt(192) times a YaRN
factor), decode and short query runs (Sq 1..16: speculative decoding,
multi-token prediction) with the bottom-right causal mask and an
expression mask, chunked varlen queries, page sizes 1 / 16 / 64, f16 /
bf16 and e4m3 caches, split-KV; one case computed the un-absorbed way
(keys and values up-projected per head) to show that the absorbed call is
the same attention; the errors (no scale, two latent heads, a V wider
than the row)."""
import math

import pytest

torch = pytest.importorskip("torch")
import attnjit  # noqa: E402
import attnjit.torch as at  # noqa: E402

LATENT, ROPE = 512, 64
D = LATENT + ROPE
SCALE = 1.0 / math.sqrt(128 + 64) * 1.25   # 1/sqrt(qk_nope + qk_rope) x a YaRN factor


def make_latent(lens, page_size, dtype, seed):
    """A latent cache (num_pages, page_size, D) over shuffled pages, and
    its block table."""
    g = torch.Generator().manual_seed(seed)
    pages = [(n + page_size - 1) // page_size for n in lens]
    num_pages = sum(pages) + 1
    order = torch.randperm(num_pages, generator=g)
    cache = (torch.randn(num_pages, page_size, D, generator=g) * 0.5).to(dtype)
    table = torch.zeros(len(lens), max(pages) + 1, dtype=torch.int32)
    at_page = 0
    for b, n in enumerate(pages):
        table[b, :n] = order[at_page:at_page + n]
        at_page += n
    return cache, table


def rows_of(cache, table, b, n):
    """Sequence b's n latent rows (n, D) in position order, float64."""
    ps = cache.shape[1]
    rows = [cache[table[b, p // ps], p % ps].double() for p in range(n)]
    return torch.stack(rows) if rows else torch.zeros(0, D, dtype=torch.float64)


def reference(q_rows, kv, dv, causal, scale=SCALE, keep=None):
    """q_rows (Tq, Hq, D) as the last Tq of len(kv) positions over one
    latent head: (o (Tq, Hq, dv), lse (Hq, Tq)) in float64; keep(k): the
    keys an extra mask lets through."""
    tq, hq, n = q_rows.shape[0], q_rows.shape[1], kv.shape[0]
    if n == 0 or tq == 0:
        return (torch.zeros(tq, hq, dv, dtype=torch.float64),
                torch.full((hq, tq), float("-inf"), dtype=torch.float64))
    s = torch.einsum("thd,nd->htn", q_rows.double(), kv) * scale
    if causal:
        pos = torch.arange(n - tq, n).unsqueeze(1)
        s = s.masked_fill(torch.arange(n).unsqueeze(0) > pos, float("-inf"))
    if keep is not None:
        s = s.masked_fill(~keep(torch.arange(n)), float("-inf"))
    lse = torch.logsumexp(s, -1)
    o = torch.softmax(s, -1) @ kv[:, :dv]
    return o.transpose(0, 1), lse


def check(o, lse, o_ref, lse_ref, tol):
    assert torch.allclose(lse.double(), lse_ref, atol=tol, rtol=tol)
    assert torch.allclose(o.double(), o_ref, atol=tol, rtol=tol)


@pytest.mark.parametrize("hq,sq,page_size,dtype,splits", [
    (128, 1, 64, torch.bfloat16, 0),    # DeepSeek-V3 decode, every head of a rank
    (16, 1, 16, torch.float16, 1),
    (16, 4, 1, torch.bfloat16, 3),      # multi-token prediction, page size 1
    (32, 16, 16, torch.float16, 0),     # speculative run of 16
])
def test_decode(hq, sq, page_size, dtype, splits):
    lens = [70, 0, 129]
    cache, table = make_latent(lens, page_size, dtype, hq + sq)
    q = (torch.randn(len(lens), hq, sq, D, generator=torch.Generator().manual_seed(sq)) *
         0.5).to(dtype)
    seqlens = torch.tensor(lens, dtype=torch.int32)
    o, lse = at.mla_decode(q, cache, table, seqlens, head_dim_v=LATENT, scale=SCALE,
                           causal=True, splits=splits)
    assert o.shape == (len(lens), hq, sq, LATENT) and lse.shape == (len(lens), hq, sq)
    for b, n in enumerate(lens):
        n_q = min(sq, n)   # a sequence shorter than the queries: its first rows see none
        o_ref, lse_ref = reference(q[b].transpose(0, 1)[sq - n_q:],
                                   rows_of(cache, table, b, n), LATENT, True)
        check(o[b].transpose(0, 1)[sq - n_q:], lse[b][:, sq - n_q:], o_ref, lse_ref, 3e-2)


def test_chunked_varlen_queries():
    lens, chunks = [40, 9, 100], [3, 0, 16]
    cache, table = make_latent(lens, 16, torch.bfloat16, 5)
    cu = torch.tensor([0, 3, 3, 19], dtype=torch.int32)
    q = (torch.randn(19, 16, D, generator=torch.Generator().manual_seed(6)) * 0.5).bfloat16()
    o, lse = at.mla_decode(q, cache.unsqueeze(2), table, torch.tensor(lens, dtype=torch.int32),
                           head_dim_v=LATENT, scale=SCALE, cu_seqlens_q=cu, causal=True,
                           splits=2)
    assert o.shape == (19, 16, LATENT) and lse.shape == (16, 19)
    for b, n in enumerate(lens):
        rows = slice(int(cu[b]), int(cu[b + 1]))
        o_ref, lse_ref = reference(q[rows], rows_of(cache, table, b, n), LATENT, True)
        check(o[rows], lse[:, rows], o_ref, lse_ref, 3e-2)


@pytest.mark.skipif(not hasattr(torch, "float8_e4m3fn"), reason="torch has no float8_e4m3fn")
def test_fp8_latent_cache():
    lens = [50, 17]
    cache, table = make_latent(lens, 16, torch.float32, 7)
    c8 = (cache * 8).to(torch.float8_e4m3fn)
    q = (torch.randn(2, 16, 2, D, generator=torch.Generator().manual_seed(8)) * 0.5).half()
    o, lse = at.mla_decode(q, c8, table, torch.tensor(lens, dtype=torch.int32),
                           head_dim_v=LATENT, scale=SCALE, kv_scale=torch.tensor([0.125]),
                           causal=True)
    for b, n in enumerate(lens):
        o_ref, lse_ref = reference(q[b].transpose(0, 1), rows_of(c8.float(), table, b, n) / 8,
                                   LATENT, True)
        check(o[b].transpose(0, 1), lse[b], o_ref, lse_ref, 3e-2)


def test_expression_mask():
    """An IR mask expression beside causal (a speculative run that skips
    every fifth key, say)."""
    lens = [90, 33]
    cache, table = make_latent(lens, 16, torch.bfloat16, 13)
    q = (torch.randn(2, 16, 4, D, generator=torch.Generator().manual_seed(14)) * 0.5).bfloat16()
    o, lse = at.mla_decode(q, cache, table, torch.tensor(lens, dtype=torch.int32),
                           head_dim_v=LATENT, scale=SCALE, causal=True, mask="k % 5 != 2")
    for b, n in enumerate(lens):
        o_ref, lse_ref = reference(q[b].transpose(0, 1), rows_of(cache, table, b, n), LATENT,
                                   True, keep=lambda k: k % 5 != 2)
        check(o[b].transpose(0, 1), lse[b], o_ref, lse_ref, 3e-2)


def test_absorbed_is_up_projected_attention():
    """The absorbed call equals MLA computed the un-absorbed way: per head,
    k = [c_kv W_UK^T, k_pe], v = c_kv W_UV^T, q = [q_nope, q_pe], scores
    scaled by SCALE; o = attention @ ... per head (float64 throughout but
    for the kernel's f16 inputs)."""
    g = torch.Generator().manual_seed(9)
    hq, nope, vdim, n = 8, 128, 128, 45
    c_kv = torch.randn(n, LATENT, generator=g, dtype=torch.float64) * 0.3
    k_pe = torch.randn(n, ROPE, generator=g, dtype=torch.float64) * 0.3
    w_uk = torch.randn(hq, nope, LATENT, generator=g, dtype=torch.float64) / LATENT ** 0.5
    w_uv = torch.randn(hq, vdim, LATENT, generator=g, dtype=torch.float64) / LATENT ** 0.5
    q_nope = torch.randn(hq, nope, generator=g, dtype=torch.float64)
    q_pe = torch.randn(hq, ROPE, generator=g, dtype=torch.float64)
    # un-absorbed: keys and values up-projected per head
    k = torch.cat([torch.einsum("nl,hdl->hnd", c_kv, w_uk), k_pe.expand(hq, n, ROPE)], -1)
    v = torch.einsum("nl,hdl->hnd", c_kv, w_uv)
    s = torch.einsum("hd,hnd->hn", torch.cat([q_nope, q_pe], -1), k) * SCALE
    expect = torch.einsum("hn,hnd->hd", torch.softmax(s, -1), v)
    # absorbed: q_nope W_UK against the latent rows, W_UV after
    q_abs = torch.cat([torch.einsum("hd,hdl->hl", q_nope, w_uk), q_pe], -1)
    cache = torch.cat([c_kv, k_pe], -1).half().view(n, 1, D)   # page size 1
    table = torch.arange(n, dtype=torch.int32).view(1, n)
    o, _ = at.mla_decode(q_abs.half().view(1, hq, 1, D), cache, table,
                         torch.tensor([n], dtype=torch.int32), head_dim_v=LATENT, scale=SCALE)
    got = torch.einsum("hl,hdl->hd", o.view(hq, LATENT).double(), w_uv)
    assert torch.allclose(got, expect, atol=2e-2, rtol=2e-2), (got - expect).abs().max()


def test_errors():
    cache, table = make_latent([8], 16, torch.float16, 10)
    q = torch.randn(1, 4, 1, D).half()
    seqlens = torch.tensor([8], dtype=torch.int32)
    with pytest.raises(attnjit.Error, match=r"needs scale"):
        at.mla_decode(q, cache, table, seqlens, head_dim_v=LATENT, scale=None)
    with pytest.raises(attnjit.Error, match=r"one latent head"):
        at.mla_decode(q, cache.view(cache.shape[0], 16, 2, D // 2), table, seqlens,
                      head_dim_v=LATENT // 2, scale=SCALE)
    with pytest.raises(attnjit.Error, match=r"head_dim_v = 640"):
        at.mla_decode(q, cache, table, seqlens, head_dim_v=640, scale=SCALE)
    with pytest.raises(attnjit.Error, match=r"kv_scale goes with"):
        at.mla_decode(q, cache, table, seqlens, head_dim_v=LATENT, scale=SCALE,
                      kv_scale=torch.tensor([1.0]))
