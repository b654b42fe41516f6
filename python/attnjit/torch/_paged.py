"""attnjit.torch.paged_attention and mla_decode: the forward over a paged
KV cache (docs/ir.md "paged"): decode with padded queries, chunked prefill
with varlen ones, absorbed MLA over one latent cache (kv_shared), bound to
aj_forward's paged fields."""
import ctypes

import torch

import attnjit
from attnjit import _capi
from attnjit._capi import lib as _lib

from ._ops import (_AJ_DTYPE, _ANY_DTYPE, _F8, _IR_DTYPE, _FWD_SIZE, _SINKS, _bind_side, _body,
                   _device_of, _fail, _kernel, _launch, _put, _side_tensors, _sinks_tensor)

# the caches' element types: the queries' three, and the f8 ones (kv_dtype)
_KV_IR = {**_IR_DTYPE, **{t: v[1] for t, v in _F8.items()}}


def _check_cache(cache, scaled, name, scales):
    """A cache's dtype, and its scales (`scales`, given when `scaled`) with
    and only with float8."""
    if cache.dtype not in _ANY_DTYPE:
        raise _fail("%s.dtype = %s; a cache holds float16, bfloat16, float32 or float8"
                    % (name, cache.dtype))
    if (cache.dtype not in _AJ_DTYPE) != scaled:
        raise _fail("%s with (and only with) a float8 cache" % scales)


def _int32(name, t, dims):
    if t.dtype != torch.int32 or t.dim() != dims:
        raise _fail("%s must be a %d-D int32 tensor; got %d-D %s" % (name, dims, t.dim(), t.dtype))
    return t.contiguous()


def paged_attention(q, k_cache, v_cache, block_table, seqlens_k, *, cu_seqlens_q=None,
                    k_scale=None, v_scale=None, causal=False, window=None, softcap=None,
                    scale=None, splits=0, max_seqlen_q=0, sinks=None, mask=None,
                    score_mod=None, tensors=None):
    """Attention of q over a paged KV cache; returns (o, lse).

    k_cache (num_pages, page_size, Hkv, D), v_cache (.., Dv) of float16,
    bfloat16, float32 or (with k_scale, v_scale: one-element float32
    tensors the stored values are multiplied by) float8_e4m3fn /
    float8_e5m2; block_table (B, max_pages) and seqlens_k (B) int32.
    Queries are the LAST positions of their sequence: padded q (B, Hq, Sq,
    D) gives o (B, Hq, Sq, Dv) and lse (B, Hq, Sq); with cu_seqlens_q (B +
    1, int32) q is packed (T, Hq, D), sequence b's chunk rows cu_seqlens_q[b]
    .. cu_seqlens_q[b + 1] - 1, and o is (T, Hq, Dv), lse (Hq, T).  causal /
    window are bottom-right aligned (window=(left, right)); splits: the
    split-KV parts (0: the launch chooses).  sinks: (Hq,) learned sink
    logits (docs/ir.md "Sinks"), counted once per row by the merge of the
    split-KV parts.  mask / score_mod: IR expressions over b, h, q, k, sq,
    sk (q, k positions in the sequence, sq = sk = its length; and score),
    reading the side tensors of `tensors` by name, as attention()'s."""
    if v_cache.dtype != k_cache.dtype:
        raise _fail("k_cache (%s) and v_cache (%s) must share a cache dtype" %
                    (k_cache.dtype, v_cache.dtype))
    if v_cache.dim() != 4:
        raise _fail("the caches must be (num_pages, page_size, H, D)")
    if (k_scale is None) != (v_scale is None):
        raise _fail("k_scale and v_scale come together (one-element float32 tensors)")
    _check_cache(k_cache, k_scale is not None, "k_cache", "k_scale and v_scale go")
    return _paged(q, k_cache, v_cache, v_cache.shape[-1], block_table, seqlens_k,
                  cu_seqlens_q=cu_seqlens_q, k_scale=k_scale, v_scale=v_scale,
                  causal=causal, window=window, softcap=softcap, scale=scale, splits=splits,
                  max_seqlen_q=max_seqlen_q, sinks=sinks, mask=mask, score_mod=score_mod,
                  tensors=tensors, who="attnjit.torch.paged_attention")


def mla_decode(q, kv_cache, block_table, seqlens_k, *, head_dim_v, scale, cu_seqlens_q=None,
               kv_scale=None, causal=False, window=None, softcap=None, splits=0,
               max_seqlen_q=0, sinks=None, mask=None, score_mod=None, tensors=None):
    """Absorbed multi-head latent attention (DeepSeek-V2/V3, Kimi, GLM's
    MLA) over one paged latent cache; returns (o, lse).

    q (B, Hq, Sq, D), or packed (T, Hq, D) with cu_seqlens_q: the absorbed
    queries, each head's q_nope W_UK (kv_lora_rank columns) followed by its
    rope part (D = 512 + 64 = 576 for DeepSeek-V3).  kv_cache (num_pages,
    page_size, D) or (num_pages, page_size, 1, D): each row a token's
    latent c_kv followed by its rope key, float16 / bfloat16 or (with
    kv_scale, a one-element float32 tensor) float8.  Every query head
    reads the one latent head (all Hq heads of a sequence are packed
    against it); V is the first head_dim_v columns of the same rows, so o
    is (B, Hq, Sq, head_dim_v) in latent space (apply W_UV after).  scale
    is required: MLA's is 1/sqrt(qk_nope_head_dim + qk_rope_head_dim)
    times its YaRN factor, not 1/sqrt(D).  Queries are the last positions
    of their sequence (decode, speculative / multi-token steps); the
    other arguments are paged_attention's (docs/python.md "MLA decode")."""
    if scale is None:
        raise _fail("mla_decode needs scale: MLA's softmax scale is 1/sqrt(qk_nope_head_dim "
                    "+ qk_rope_head_dim) times its YaRN factor, not 1/sqrt(%d)" % q.shape[-1])
    if kv_cache.dim() == 3:
        kv_cache = kv_cache.unsqueeze(2)
    if kv_cache.dim() != 4 or kv_cache.shape[2] != 1:
        raise _fail("kv_cache must be (num_pages, page_size, D) or (num_pages, page_size, 1, "
                    "D): one latent head; got %s" % (tuple(kv_cache.shape),))
    _check_cache(kv_cache, kv_scale is not None, "kv_cache", "kv_scale goes")
    if not isinstance(head_dim_v, int) or not 0 < head_dim_v <= kv_cache.shape[-1]:
        raise _fail("head_dim_v = %r: V is the first head_dim_v columns of the cache's %d"
                    % (head_dim_v, kv_cache.shape[-1]))
    return _paged(q, kv_cache, None, head_dim_v, block_table, seqlens_k,
                  cu_seqlens_q=cu_seqlens_q, k_scale=kv_scale, v_scale=None, causal=causal,
                  window=window, softcap=softcap, scale=scale, splits=splits,
                  max_seqlen_q=max_seqlen_q, sinks=sinks, mask=mask, score_mod=score_mod,
                  tensors=tensors, who="attnjit.torch.mla_decode")


def _paged(q, k_cache, v_cache, dv, block_table, seqlens_k, *, cu_seqlens_q, k_scale, v_scale,
           causal, window, softcap, scale, splits, max_seqlen_q, sinks, mask, score_mod, tensors,
           who):
    """The paged forward of both entries: v_cache None reads V from the
    first dv columns of k_cache (kv_shared)."""
    varlen = cu_seqlens_q is not None
    shared = v_cache is None
    if q.dtype not in _AJ_DTYPE:
        raise _fail("q.dtype = %s; attnjit computes in float16, bfloat16 and float32" % q.dtype)
    if q.dim() != (3 if varlen else 4) or k_cache.dim() != 4:
        raise _fail("q must be %s and the caches (num_pages, page_size, H, D)" %
                    ("(T, H, D) with cu_seqlens_q" if varlen else "(B, H, S, D)"))
    side, decls = _side_tensors(tensors, q, grads=False)   # (a forward without autograd)
    names = list(tensors or {})
    if sinks is not None:
        side.append(_sinks_tensor(sinks, q))
        names.append(_SINKS)
    # the queries are the last positions: causal and windows bottom-right
    fields = [_body(_IR_DTYPE[q.dtype], q.shape[-1], dv, "bottom_right" if causal else False,
                    window, softcap, False, False, scale, 0.0, mask, score_mod, decls,
                    sinks=sinks is not None, who=who, align="bottom_right")]
    fields += ["layout = paged", "kv_dtype = %s" % _KV_IR[k_cache.dtype]]
    if varlen:
        fields.append("q_layout = varlen")
    if shared:
        fields.append("kv_shared = true")
    if splits:
        fields.append("schedule = (splits = %d)" % splits)
    dev, stream = _device_of(q)
    kernel = _kernel("forward", "flash", "\n  ".join(fields), dev)
    q = q.contiguous()
    block_table = _int32("block_table", block_table, 2)
    seqlens_k = _int32("seqlens_k", seqlens_k, 1)
    batch = block_table.shape[0]
    if varlen:
        cu_seqlens_q = _int32("cu_seqlens_q", cu_seqlens_q, 1)
        o = q.new_empty(q.shape[0], q.shape[1], dv)
        lse = q.new_empty(q.shape[1], q.shape[0], dtype=torch.float32)
    else:
        o = q.new_empty(*q.shape[:3], dv)
        lse = q.new_empty(*q.shape[:3], dtype=torch.float32)
    a = _capi.FwdArgs(struct_size=_FWD_SIZE, stream=stream)
    for field, t in ((a.q, q), (a.o, o), (a.lse, lse), (a.k_cache, k_cache),
                     (a.v_cache, v_cache)):
        if t is not None:   # (kv_shared: no v_cache)
            _put(field, t)
    a.block_table = block_table.data_ptr()
    a.max_pages = block_table.shape[1]
    a.seqlens_k = seqlens_k.data_ptr()
    if varlen:
        a.cu_seqlens_q = cu_seqlens_q.data_ptr()
        a.batch = batch
        a.max_seqlen_q = max_seqlen_q
    if k_scale is not None:
        k_scale = k_scale.to(device=q.device, dtype=torch.float32).reshape(1).contiguous()
        _put(a.k_scale, k_scale)
    if v_scale is not None:
        v_scale = v_scale.to(device=q.device, dtype=torch.float32).reshape(1).contiguous()
        _put(a.v_scale, v_scale)
    side_arr = None
    if side:
        side_arr, a.num_side = _bind_side([n.encode() for n in names], side)
        a.side = side_arr
    _launch(_lib.aj_forward, kernel, dev, a)
    return o, lse
