"""attnjit.torch.paged_attention against torch: the pages gathered per
sequence and SDPA in float64 with the queries at the last positions
(bottom-right causal).  Page sizes 1 and 16 (shuffled pages), GQA, decode
(padded queries) and chunked prefill (varlen queries, chunks 0 .. the whole
sequence), an e4m3 cache with its scales, learned sinks, an expression mask
over a side tensor, and a chunk longer than its sequence and misplaced
scales named as errors."""
import pytest

torch = pytest.importorskip("torch")
import attnjit  # noqa: E402
import attnjit.torch as at  # noqa: E402


def make_cache(lens, page_size, hkv, d, dtype, seed):
    """Shuffled pages: the caches, block_table, and each sequence's K, V."""
    g = torch.Generator().manual_seed(seed)
    pages = [(n + page_size - 1) // page_size for n in lens]
    num_pages = sum(pages) + 2
    order = torch.randperm(num_pages, generator=g)
    k_cache = torch.randn(num_pages, page_size, hkv, d, generator=g).to(dtype)
    v_cache = torch.randn(num_pages, page_size, hkv, d, generator=g).to(dtype)
    table = torch.zeros(len(lens), max(pages) + 1, dtype=torch.int32)
    at_page = 0
    for b, n in enumerate(pages):
        table[b, :n] = order[at_page:at_page + n]
        at_page += n
    return k_cache, v_cache, table


def gather(cache, table, b, n):
    """Sequence b's n rows (n, H, D) of a cache, in position order."""
    ps = cache.shape[1]
    rows = [cache[table[b, p // ps], p % ps] for p in range(n)]
    return torch.stack(rows) if rows else cache.new_zeros(0, *cache.shape[2:])


def reference(q_rows, k, v, causal, scale_kv=(1.0, 1.0), keep=None):
    """SDPA in float64 of q_rows (Tq, Hq, D) as the last Tq of len(k)
    positions: (o (Tq, Hq, Dv), lse (Hq, Tq)); keep (n,) bool: the keys
    an extra mask lets through."""
    tq, hq, n = q_rows.shape[0], q_rows.shape[1], k.shape[0]
    if n == 0 or tq == 0:
        return (torch.zeros(tq, hq, v.shape[-1], dtype=torch.float64),
                torch.full((hq, tq), float("-inf"), dtype=torch.float64))
    group = hq // k.shape[1]
    kk = (k.double() * scale_kv[0]).repeat_interleave(group, 1).transpose(0, 1)
    vv = (v.double() * scale_kv[1]).repeat_interleave(group, 1).transpose(0, 1)
    qq = q_rows.double().transpose(0, 1)
    s = qq @ kk.transpose(1, 2) / q_rows.shape[-1] ** 0.5
    if causal:
        pos = torch.arange(n - tq, n).unsqueeze(1)
        s = s.masked_fill(torch.arange(n).unsqueeze(0) > pos, float("-inf"))
    if keep is not None:
        s = s.masked_fill(~keep[:n], float("-inf"))
    lse = torch.logsumexp(s, -1)
    o = torch.softmax(s, -1) @ vv
    return o.transpose(0, 1), lse


def check(o, lse, o_ref, lse_ref, tol):
    assert torch.allclose(lse.double(), lse_ref, atol=tol, rtol=tol, equal_nan=False)
    assert torch.allclose(o.double(), o_ref, atol=tol, rtol=tol)


@pytest.mark.parametrize("page_size", [1, 16])
@pytest.mark.parametrize("hq,hkv", [(4, 4), (8, 2)])
def test_decode(page_size, hq, hkv):
    lens, d, sq = [37, 0, 70], 64, 2
    k_cache, v_cache, table = make_cache(lens, page_size, hkv, d, torch.float16, 1)
    q = torch.randn(len(lens), hq, sq, d, generator=torch.Generator().manual_seed(2)).half()
    seqlens = torch.tensor(lens, dtype=torch.int32)
    o, lse = at.paged_attention(q, k_cache, v_cache, table, seqlens, causal=True)
    assert o.shape == (len(lens), hq, sq, d) and lse.shape == (len(lens), hq, sq)
    for b, n in enumerate(lens):
        o_ref, lse_ref = reference(q[b].transpose(0, 1), gather(k_cache, table, b, n),
                                   gather(v_cache, table, b, n), True)
        check(o[b].transpose(0, 1), lse[b], o_ref, lse_ref, 2e-2)


@pytest.mark.parametrize("page_size", [1, 16])
@pytest.mark.parametrize("hq,hkv", [(4, 4), (8, 2)])
@pytest.mark.parametrize("splits", [1, 3])
def test_chunked_prefill(page_size, hq, hkv, splits):
    lens, d = [37, 5, 130, 64], 64
    chunks = [7, 0, 130, 1]
    k_cache, v_cache, table = make_cache(lens, page_size, hkv, d, torch.bfloat16, 3)
    cu = torch.tensor([0] + list(torch.tensor(chunks).cumsum(0)), dtype=torch.int32)
    q = torch.randn(int(cu[-1]), hq, d, generator=torch.Generator().manual_seed(4)).bfloat16()
    o, lse = at.paged_attention(q, k_cache, v_cache, table, torch.tensor(lens, dtype=torch.int32),
                                cu_seqlens_q=cu, causal=True, splits=splits)
    assert o.shape == q.shape and lse.shape == (hq, q.shape[0])
    for b, n in enumerate(lens):
        rows = slice(int(cu[b]), int(cu[b + 1]))
        o_ref, lse_ref = reference(q[rows], gather(k_cache, table, b, n),
                                   gather(v_cache, table, b, n), True)
        check(o[rows], lse[:, rows], o_ref, lse_ref, 3e-2)


@pytest.mark.skipif(not hasattr(torch, "float8_e4m3fn"), reason="torch has no float8_e4m3fn")
def test_fp8_cache():
    lens, d, hq, hkv = [50, 17], 64, 4, 2
    k_cache, v_cache, table = make_cache(lens, 16, hkv, d, torch.float32, 5)
    k8, v8 = (k_cache * 4).to(torch.float8_e4m3fn), (v_cache * 8).to(torch.float8_e4m3fn)
    scales = (torch.tensor([0.25]), torch.tensor([0.125]))
    chunks = [10, 17]
    cu = torch.tensor([0, 10, 27], dtype=torch.int32)
    q = torch.randn(27, hq, d, generator=torch.Generator().manual_seed(6)).half()
    o, lse = at.paged_attention(q, k8, v8, table, torch.tensor(lens, dtype=torch.int32),
                                cu_seqlens_q=cu, k_scale=scales[0], v_scale=scales[1])
    for b, n in enumerate(lens):
        rows = slice(int(cu[b]), int(cu[b]) + chunks[b])
        o_ref, lse_ref = reference(q[rows], gather(k8.float(), table, b, n),
                                   gather(v8.float(), table, b, n), False, (0.25, 0.125))
        check(o[rows], lse[:, rows], o_ref, lse_ref, 2e-2)


def test_cache_scales_named():
    """Scales come in a pair and only with float8 caches; a lone or
    misplaced one is an error, never ignored."""
    k_cache, v_cache, table = make_cache([5], 16, 2, 64, torch.float16, 8)
    k8, v8 = k_cache.to(torch.float8_e4m3fn), v_cache.to(torch.float8_e4m3fn)
    q, lens, one = torch.randn(1, 2, 1, 64).half(), torch.tensor([5], dtype=torch.int32), \
        torch.tensor([1.0])
    for kc, vc, ks, vs, match in ((k_cache, v_cache, one, None, "come together"),
                                  (k8, v8, None, one, "come together"),
                                  (k_cache, v_cache, one, one, "only with"),
                                  (k8, v8, None, None, "only with")):
        with pytest.raises(attnjit.Error, match=match):
            at.paged_attention(q, kc, vc, table, lens, k_scale=ks, v_scale=vs)


def test_chunk_beyond_sequence():
    k_cache, v_cache, table = make_cache([4, 9], 16, 2, 64, torch.float16, 7)
    q = torch.randn(11, 2, 64).half()
    cu = torch.tensor([0, 5, 11], dtype=torch.int32)
    with pytest.raises(attnjit.Error, match=r"sequence 0 has more queries"):
        at.paged_attention(q, k_cache, v_cache, table, torch.tensor([4, 9], dtype=torch.int32),
                           cu_seqlens_q=cu)


@pytest.mark.parametrize("splits", [1, 4])
@pytest.mark.parametrize("hq,hkv", [(4, 4), (8, 2)])
def test_decode_with_sinks(splits, hq, hkv):
    """Learned sinks over split-KV parts: counted once per row (the merge
    of the parts folds them in), a sequence of no keys giving o = 0 and
    lse = the sink."""
    lens, d, sq = [37, 0, 170], 64, 2
    k_cache, v_cache, table = make_cache(lens, 16, hkv, d, torch.float16, 3)
    q = torch.randn(len(lens), hq, sq, d, generator=torch.Generator().manual_seed(4)).half()
    sinks = torch.linspace(-1.0, 4.0, hq)
    seqlens = torch.tensor(lens, dtype=torch.int32)
    o, lse = at.paged_attention(q, k_cache, v_cache, table, seqlens, causal=True, splits=splits,
                                sinks=sinks)
    for b, n in enumerate(lens):
        o_ref, lse_ref = reference(q[b].transpose(0, 1), gather(k_cache, table, b, n),
                                   gather(v_cache, table, b, n), True)
        with_sink = torch.logaddexp(lse_ref, sinks.double().view(hq, 1))
        o_ref = o_ref * torch.exp(lse_ref - with_sink).transpose(0, 1).unsqueeze(-1)
        check(o[b].transpose(0, 1), lse[b], o_ref, with_sink, 2e-2)


def test_expression_mask_over_a_side_tensor():
    """mask= an IR expression reading a side tensor (here: which key
    positions are kept, per sequence), with the bottom-right causal mask."""
    lens, d, sq = [37, 70], 64, 3
    k_cache, v_cache, table = make_cache(lens, 16, 2, d, torch.float16, 11)
    q = torch.randn(len(lens), 4, sq, d, generator=torch.Generator().manual_seed(12)).half()
    keep = (torch.arange(2 * 80).view(2, 80) % 7 != 3).int()
    keep[1, 60:] = 0
    o, lse = at.paged_attention(q, k_cache, v_cache, table, torch.tensor(lens, dtype=torch.int32),
                                causal=True, mask="keep[b, k] != 0", tensors={"keep": keep})
    for b, n in enumerate(lens):
        o_ref, lse_ref = reference(q[b].transpose(0, 1), gather(k_cache, table, b, n),
                                   gather(v_cache, table, b, n), True, keep=keep[b] != 0)
        check(o[b].transpose(0, 1), lse[b], o_ref, lse_ref, 2e-2)
