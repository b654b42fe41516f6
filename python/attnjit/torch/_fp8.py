"""FP8 attention (docs/ir.md "FP8 inputs", docs/python.md "FP8 inputs"):
attention() and attention_varlen() over float8_e4m3fn / float8_e5m2 q, k
and v with their descales, a forward (nothing is differentiated), bound to
aj_forward's q_scale / k_scale / v_scale; and quantize_fp8, the amax
quantiser with the optional Hadamard rotation of Q and K."""
import math

import torch

import attnjit
from attnjit import _capi
from attnjit._capi import lib as _lib

from ._ops import (_AJ_DTYPE, _F8, _IR_DTYPE, _FWD_SIZE, _SINKS, _Bounded, _aligned, _bind_side,
                   _body, _device_of, _fail, _kernel, _launch, _put, _side_tensors, _sinks_tensor)


def _descale(name, s, t, heads, whose):
    """Descale `s` of f8 tensor t: a float, or a float tensor of 1 or
    `heads` elements, as float32 (1,) or (heads,) on t's device."""
    if isinstance(s, (int, float)) and not isinstance(s, bool):
        s = torch.tensor([float(s)])
    if not isinstance(s, torch.Tensor) or not s.is_floating_point() or s.numel() not in (1, heads):
        raise _fail("%s must be a float or a float tensor of 1 or %d (one per %s head) "
                    "elements; got %s" % (name, heads, whose,
                                          tuple(s.shape) if isinstance(s, torch.Tensor) else s))
    return s.detach().to(device=t.device, dtype=torch.float32).reshape(-1).contiguous()


def forward(q, k, v, *, q_descale, k_descale, v_descale, out_dtype, causal, window, softcap,
            scale, mask, score_mod, tensors, sinks, return_lse, varlen=None):
    """The FP8 forward of attention() (varlen: (cu_seqlens_q, cu_seqlens_k,
    max_seqlen_q, max_seqlen_k) of attention_varlen())."""
    if k.dtype not in _F8 or v.dtype != k.dtype:
        raise _fail("FP8 attention takes k and v of one float8 dtype (float8_e4m3fn or "
                    "float8_e5m2); got %s and %s" % (k.dtype, v.dtype))
    q8 = q.dtype in _F8
    if not q8 and q.dtype not in _AJ_DTYPE:
        raise _fail("q.dtype = %s; want float8 or float16, bfloat16, float32" % q.dtype)
    if k_descale is None or v_descale is None:
        raise _fail("float8 k and v need k_descale and v_descale (what their stored values "
                    "are multiplied by)")
    if (q_descale is not None) != q8:
        raise _fail("q_descale goes with (and only with) float8 queries")
    if out_dtype is None:
        out_dtype = torch.bfloat16 if q8 else q.dtype
    if out_dtype not in _IR_DTYPE:
        raise _fail("out_dtype = %s; want float16, bfloat16 or float32" % out_dtype)
    packed = varlen is not None
    if q.dim() != (3 if packed else 4) or k.dim() != q.dim() or v.dim() != q.dim():
        raise _fail("q, k, v must be %s" % ("(T, H, D)" if packed else "(B, H, S, D)"))
    hq, hkv = q.shape[1], k.shape[1]   # (T, H, D) and (B, H, S, D): heads at dim 1
    side, decls = _side_tensors(tensors, q, grads=False)   # (a forward without autograd)
    names = list(tensors or {})
    if sinks is not None:
        side.append(_sinks_tensor(sinks, q).detach())
        names.append(_SINKS)
    fields = [_body(_IR_DTYPE[out_dtype], q.shape[-1], v.shape[-1], causal, window, softcap,
                    False, False, scale, 0.0, mask, score_mod, decls, sinks=sinks is not None)]
    if packed:
        fields.append("layout = varlen")
    if q8:
        fields.append("q_dtype = " + _F8[q.dtype][1])
    fields.append("kv_dtype = " + _F8[k.dtype][1])
    dev, stream = _device_of(q)
    kernel = _fp8_kernel("\n  ".join(fields), dev, q8 and q.dtype == k.dtype)
    # the kernels' rules: rows contiguous and aligned (a view that breaks
    # them is copied)
    q, k, v = (_aligned(t) for t in (q, k, v))
    scales = [_descale("k_descale", k_descale, k, hkv, "KV"),
              _descale("v_descale", v_descale, v, hkv, "KV")]
    if q8:
        scales.append(_descale("q_descale", q_descale, q, hq, "query"))
    o = torch.empty(*q.shape[:-1], v.shape[-1], dtype=out_dtype, device=q.device)
    if packed:
        lse = torch.empty(hq, q.shape[0], dtype=torch.float32, device=q.device)
    else:
        lse = torch.empty(*q.shape[:3], dtype=torch.float32, device=q.device)
    a = _capi.FwdArgs(struct_size=_FWD_SIZE, stream=stream)
    for field, t in ((a.q, q), (a.k, k), (a.v, v), (a.o, o), (a.lse, lse),
                     (a.k_scale, scales[0]), (a.v_scale, scales[1])):
        _put(field, t)
    if q8:
        _put(a.q_scale, scales[2])
    if packed:
        cu_q, cu_k, max_q, max_k = varlen
        a.cu_seqlens_q, a.cu_seqlens_k = cu_q.data_ptr(), cu_k.data_ptr()
        a.batch = cu_q.shape[0] - 1
        a.max_seqlen_q, a.max_seqlen_k = max_q, max_k
    side_arr = None
    if side:
        side_arr, a.num_side = _bind_side([n.encode() for n in names], side)
        a.side = side_arr
    _launch(_lib.aj_forward, kernel, dev, a)
    return (o, lse) if return_lse else o


# the (body, device) pairs whose flash FP8 kernel the target refused, as
# many as the kernel cache keeps (each stands for a kernel it holds)
_no_flash = _Bounded(attnjit.KERNEL_CACHE_LIMIT)


def _fp8_kernel(body, dev, same_format):
    """The flash variant's kernel where Q and K share a format and the
    target has one (on a GPU the FP8 tensor-core kernel: Ada's mma.sync,
    Hopper's wgmma; on the cpu one template serves both), else -- a head
    dim or a target it refuses -- the efficient one."""
    if same_format and not _no_flash.get((body, dev.value)):
        try:
            return _kernel("forward", "flash", body, dev)
        except attnjit.Error as e:
            if e.status != "AJ_ERR_UNSUPPORTED":
                raise
            _no_flash.put((body, dev.value), True)
    return _kernel("forward", "efficient", body, dev)


def _hadamard(n, device):
    """The n x n orthonormal Walsh-Hadamard matrix (n a power of two)."""
    h = torch.ones(1, 1, device=device)
    while h.shape[0] < n:
        h = torch.cat([torch.cat([h, h], 1), torch.cat([h, -h], 1)], 0)
    return h / math.sqrt(n)


def quantize_fp8(x, dtype=None, *, per_head=False, rotate=False):
    """x (B, H, S, D) or packed (T, H, D) as float8 `dtype` (default
    float8_e4m3fn) and its descale: x / descale rounded, descale = amax /
    the format's largest value, one per tensor ((1,) float32) or, with
    per_head, one per head ((H,)).  rotate=True multiplies the last dim by
    the orthonormal Hadamard matrix first (D a power of two): apply it to q
    and k alike -- q.k is unchanged, since H is orthonormal -- and an
    outlier channel is spread over all of D before rounding (FA3's
    incoherent processing; docs/python.md "FP8 inputs" has the errors)."""
    dtype = dtype or getattr(torch, "float8_e4m3fn", None)
    if dtype not in _F8:
        raise _fail("quantize_fp8: dtype = %s; want float8_e4m3fn or float8_e5m2" % dtype)
    if x.dim() not in (3, 4):
        raise _fail("quantize_fp8: x must be (B, H, S, D) or (T, H, D)")
    x = x.float()
    if rotate:
        d = x.shape[-1]
        if d & (d - 1):
            raise _fail("quantize_fp8: rotate needs a power-of-two head dim, not %d" % d)
        x = x @ _hadamard(d, x.device)
    if per_head:
        dims = [i for i in range(x.dim()) if i != 1]
        amax = x.abs().amax(dim=dims)
    else:
        amax = x.abs().amax().reshape(1)
    descale = torch.where(amax > 0, amax / _F8[dtype][2], torch.ones_like(amax))
    shape = [1] * x.dim()
    shape[1] = -1
    scaled = x / (descale.reshape(shape) if per_head else descale)
    return scaled.to(dtype), descale.to(torch.float32)
