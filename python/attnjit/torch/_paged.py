"""attnjit.torch.paged_attention: the forward over a paged KV cache
(docs/ir.md "paged"): decode with padded queries, chunked prefill with
varlen ones, bound to aj_forward's paged fields."""
import ctypes

import torch

import attnjit
from attnjit import _capi
from attnjit._capi import lib as _lib

from ._ops import (_AJ_DTYPE, _IR_DTYPE, _FWD_SIZE, _SINKS, _bind_side, _device_of, _fail,
                   _kernel, _launch, _put, _sinks_tensor)

# the caches' element types: the queries' three, and the f8 ones (kv_dtype)
_KV_DTYPE = dict(_AJ_DTYPE)
_KV_IR = dict(_IR_DTYPE)
for _name, _code, _ir in (("float8_e4m3fn", _capi.DTYPE_F8E4M3, "f8e4m3"),
                          ("float8_e5m2", _capi.DTYPE_F8E5M2, "f8e5m2")):
    if hasattr(torch, _name):
        _KV_DTYPE[getattr(torch, _name)] = _code
        _KV_IR[getattr(torch, _name)] = _ir


def _int32(name, t, dims):
    if t.dtype != torch.int32 or t.dim() != dims:
        raise _fail("%s must be a %d-D int32 tensor; got %d-D %s" % (name, dims, t.dim(), t.dtype))
    return t.contiguous()


def paged_attention(q, k_cache, v_cache, block_table, seqlens_k, *, cu_seqlens_q=None,
                    k_scale=None, v_scale=None, causal=False, window=None, softcap=None,
                    scale=None, splits=0, max_seqlen_q=0, sinks=None):
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
    split-KV parts."""
    varlen = cu_seqlens_q is not None
    if q.dtype not in _AJ_DTYPE:
        raise _fail("q.dtype = %s; attnjit computes in float16, bfloat16 and float32" % q.dtype)
    if k_cache.dtype not in _KV_DTYPE or v_cache.dtype != k_cache.dtype:
        raise _fail("k_cache (%s) and v_cache (%s) must share a cache dtype" %
                    (k_cache.dtype, v_cache.dtype))
    if q.dim() != (3 if varlen else 4) or k_cache.dim() != 4 or v_cache.dim() != 4:
        raise _fail("q must be %s and the caches (num_pages, page_size, H, D)" %
                    ("(T, H, D) with cu_seqlens_q" if varlen else "(B, H, S, D)"))
    f8 = k_cache.dtype not in _AJ_DTYPE
    if f8 != (k_scale is not None and v_scale is not None):
        raise _fail("k_scale and v_scale go with (and only with) float8 caches")
    fields = ["dtype = %s" % _IR_DTYPE[q.dtype], "head_dim = %d" % q.shape[-1],
              "head_dim_v = %d" % v_cache.shape[-1]]
    if sinks is not None:
        sinks = _sinks_tensor(sinks, q)
        fields = ["tensors = (%s: f32[1])" % _SINKS] + fields + ["sinks = " + _SINKS]
    if causal and window is None:
        fields.append("mask = causal(bottom_right)")
    elif window is not None:
        left, right = window
        fields.append("mask = window(%d, %d, bottom_right)" % (left, 0 if causal else right))
    if softcap is not None:
        fields.append("score_mod = softcap(%r)" % float(softcap))
    if scale is not None:
        fields.append("scale = %r" % float(scale))
    fields += ["layout = paged", "kv_dtype = %s" % _KV_IR[k_cache.dtype]]
    if varlen:
        fields.append("q_layout = varlen")
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
        o = q.new_empty(q.shape[0], q.shape[1], v_cache.shape[-1])
        lse = q.new_empty(q.shape[1], q.shape[0], dtype=torch.float32)
    else:
        o = q.new_empty(*q.shape[:3], v_cache.shape[-1])
        lse = q.new_empty(*q.shape[:3], dtype=torch.float32)
    a = _capi.FwdArgs(struct_size=_FWD_SIZE, stream=stream)
    for field, t in ((a.q, q), (a.o, o), (a.lse, lse)):
        _put(field, t)
    for field, t in ((a.k_cache, k_cache), (a.v_cache, v_cache)):   # (f8: not _put's)
        field.data = t.data_ptr()
        field.dtype = _KV_DTYPE[t.dtype]
        field.rank = 4
        field.shape[:4] = t.shape
        field.strides[:4] = t.stride()
    a.block_table = block_table.data_ptr()
    a.max_pages = block_table.shape[1]
    a.seqlens_k = seqlens_k.data_ptr()
    if varlen:
        a.cu_seqlens_q = cu_seqlens_q.data_ptr()
        a.batch = batch
        a.max_seqlen_q = max_seqlen_q
    if f8:
        k_scale = k_scale.to(device=q.device, dtype=torch.float32).reshape(1).contiguous()
        v_scale = v_scale.to(device=q.device, dtype=torch.float32).reshape(1).contiguous()
        _put(a.k_scale, k_scale)
        _put(a.v_scale, v_scale)
    side_arr = None
    if sinks is not None:
        side_arr, a.num_side = _bind_side([_SINKS.encode()], [sinks])
        a.side = side_arr
    _launch(_lib.aj_forward, kernel, dev, a)
    return o, lse
