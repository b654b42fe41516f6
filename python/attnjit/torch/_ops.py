"""attnjit.torch.attention: the op description (IR text), the two custom ops
and their binding to aj_forward / aj_backward.

    attention(q, k, v, ...)            options -> IR body (docs/ir.md fields)
      -> attnjit::attention_fwd        (o, lse)   aj_forward
      <- attnjit::attention_bwd        (dq, dk, dv, dbias)   aj_backward

The IR body (every field but the header) travels through the ops as a
string; each op names its kind and variant, compiles the op on first use
per (op, device) and keeps the kernel (the C library's kernel cache also
keeps it on disk).  Tensors bind to the C argument structs by field name;
side tensors by their declared names.  An eager call on plain tensors runs
the ops' implementations and registered backward without the custom ops'
dispatch (_eager, _Direct; docs/python.md "Eager calls").
"""
import collections
import ctypes
import os
import threading
from typing import List, Optional, Tuple

import torch

import attnjit
from attnjit import _capi
from attnjit._capi import lib as _lib
from attnjit._options import _ALIBI, _OOB_ZERO, _SINKS, _body, _spec  # noqa: F401 (re-exported)

_AJ_DTYPE = {torch.float16: _capi.DTYPE_F16, torch.bfloat16: _capi.DTYPE_BF16,
             torch.float32: _capi.DTYPE_F32}
_IR_DTYPE = {torch.float16: "f16", torch.bfloat16: "bf16", torch.float32: "f32"}
# The 8-bit floats torch has, inputs only (q_dtype, kv_dtype: FP8 inputs,
# _fp8.py, and paged caches, _paged.py): the C API's code, the IR's name
# and the largest finite value
_F8 = {getattr(torch, name): (code, ir, largest) for name, code, ir, largest in (
    ("float8_e4m3fn", _capi.DTYPE_F8E4M3, "f8e4m3", 448.0),
    ("float8_e5m2", _capi.DTYPE_F8E5M2, "f8e5m2", 57344.0)) if hasattr(torch, name)}
# every element type a tensor may be bound with (_put)
_ANY_DTYPE = {**_AJ_DTYPE, **{t: v[0] for t, v in _F8.items()}}
_FWD_SIZE, _BWD_SIZE = ctypes.sizeof(_capi.FwdArgs), ctypes.sizeof(_capi.BwdArgs)


def _fail(message):
    return attnjit.InvalidArgError(1, "attnjit.torch.attention: " + message)


# ---------------------------------------------------------------- the op description

# A side tensor's dtype as the kernels read it: float16 and bfloat16 as
# they are (read as their exact float32 values), other floats as float32,
# integers as int32 -- and its IR name and C enum.
_SIDE_KIND = {torch.float16: ("f16", _capi.SIDE_F16), torch.bfloat16: ("bf16", _capi.SIDE_BF16),
              torch.float32: ("f32", _capi.SIDE_F32), torch.int32: ("i32", _capi.SIDE_I32)}


def _side_dtype(t):
    if t.dtype in _SIDE_KIND:
        return t.dtype
    return torch.float32 if t.is_floating_point() else torch.int32


def _side_decl(name, t, grad=False):
    if not name.isidentifier():
        raise _fail("tensors: %r is not an identifier" % (name,))
    if not 1 <= t.dim() <= 4:
        raise _fail("tensors[%r] has %d dims; side tensors have 1 to 4" % (name, t.dim()))
    return "%s: %s[%d]%s" % (name, _SIDE_KIND[_side_dtype(t)][0], t.dim(), " grad" if grad else "")


# ---------------------------------------------------------------- kernels per (op, device)

class _Bounded:
    """A mapping that keeps the `limit` most recently used entries (the
    least recently used go first); thread-safe."""

    def __init__(self, limit):
        self._items = collections.OrderedDict()
        self._lock = threading.Lock()
        self.limit = limit

    def get(self, key):
        with self._lock:
            value = self._items.get(key)
            if value is not None:
                self._items.move_to_end(key)
            return value

    def put(self, key, value):
        with self._lock:
            self._items[key] = value
            self._items.move_to_end(key)
            while len(self._items) > self.limit:
                self._items.popitem(last=False)
        return value

    def values(self):
        with self._lock:
            return list(self._items.values())

    def set_limit(self, limit):
        with self._lock:
            self.limit = limit
            while len(self._items) > limit:
                self._items.popitem(last=False)


# The kernels of (op, device) in front of the context's own cache, both
# bounded by attnjit.KERNEL_CACHE_LIMIT or set_kernel_cache_limit
# (docs/python.md "Kernels in memory"): an evicted kernel is released here
# and in C, which frees it (a cpu kernel's JIT and code) once no call holds
# it.
_kernels = _Bounded(attnjit.KERNEL_CACHE_LIMIT)
_kernels_lock = threading.Lock()     # one compile at a time
_verified = _Bounded(attnjit.KERNEL_CACHE_LIMIT)


def kernel_cache_size():
    """The kernels kept now (one per op and device; at most
    kernel_cache_limit())."""
    return len({id(k) for k in _kernels.values()})


def kernel_cache_limit():
    """How many kernels are kept (least recently used go first)."""
    return _kernels.limit


def set_kernel_cache_limit(n):
    """Keeps at most n kernels (n >= 1) from now on, in the front cache and
    the context's own ($AJ_CACHE_KERNELS at import, else 256); the least
    recently used beyond n are released at once."""
    n = int(n)
    if n < 1:
        raise _fail("kernel cache limit %d; want at least 1" % n)
    _kernels.set_limit(n)
    _verified.set_limit(n)
    ctx = attnjit._ctx
    with ctx.lock:
        ctx.check(_lib.aj_cache_set_max_kernels(ctx.ptr, n))


def _verify(variant, body):
    """Parses and verifies both ops at trace or first-call time, so a bad
    option raises attnjit.ParseError / VerifyError where it is written."""
    key = (variant, body)
    if _verified.get(key) is None:
        for kind in ("forward", "backward"):
            spec = _spec(kind, variant, body)
            try:
                attnjit.check(spec)
            except attnjit.Error as e:
                # the message's LINE:COL point into the op these options made
                listing = "".join("%4d | %s\n" % (i + 1, line)
                                  for i, line in enumerate(spec.splitlines()))
                raise type(e)(e.code, "%s\n(the op built from the options:)\n%s"
                              % (e.message, listing)) from None
        _verified.put(key, True)


_cpu_threads_chosen = []


def _cpu_device():
    """The cpu device, whose launches run on torch's own intra-op threads
    where those are OpenMP's (docs/cpu.md "Whose threads"): they are awake
    after torch's operators, and attnjit's pool would compete with them for
    the cores.  AJ_TORCH_CPU_THREADS=pool in the environment keeps the pool."""
    dev = attnjit.device("cpu")
    if not _cpu_threads_chosen:
        _cpu_threads_chosen.append(True)
        wanted = os.environ.get("AJ_TORCH_CPU_THREADS", "openmp")
        if wanted not in ("openmp", "pool"):
            raise _fail("AJ_TORCH_CPU_THREADS=%r: 'openmp' or 'pool'" % wanted)
        if wanted == "openmp" and "parallel backend: OpenMP" in torch.__config__.parallel_info():
            attnjit.set_cpu_threads("openmp")
    return dev


def _device_of(t):
    if t.device.type == "cpu":
        return _cpu_device(), None
    if t.device.type == "cuda":
        index = t.device.index if t.device.index is not None else torch.cuda.current_device()
        return attnjit.device("cuda", index), torch.cuda.current_stream(t.device).cuda_stream
    raise _fail("tensors on %s: attnjit runs on cpu and cuda" % t.device)


def _kernel(kind, variant, body, dev, masked=True):
    """The op's kernel for dev; masked=False: the op without its mask (as
    the C ring runs a block that sees every key), the op's own kernel when
    it has no mask."""
    key = (kind, variant, body, dev.value, masked)
    k = _kernels.get(key)
    if k is None:
        op = attnjit.Op(_spec(kind, variant, body), "attnjit.torch.attention")
        if not masked:
            whole = op.hash()
            with attnjit._ctx.lock:
                attnjit._ctx.check(_lib.aj_op_set_mask_none(op.ptr))
            if op.hash() == whole:
                return _kernels.put(key, _kernel(kind, variant, body, dev))
        with _kernels_lock:
            k = _kernels.get(key)
            if k is None:
                opts = _capi.CompileOptions(struct_size=ctypes.sizeof(_capi.CompileOptions),
                                            emit=3, opt_level=2, device=dev)
                ptr = ctypes.c_void_p()
                ctx = attnjit._ctx
                with ctx.lock:
                    ctx.check(_lib.aj_compile(ctx.ptr, op.ptr, ctypes.byref(opts),
                                              ctypes.byref(ptr)))
                k = _kernels.put(key, attnjit.Kernel(ptr, op))
    return k


# ---------------------------------------------------------------- binding

def _put(field, t):
    """Points aj_tensor `field` (of an args struct) at torch tensor t, which
    the caller keeps alive; fills it in place (cheaper than a new struct)."""
    field.data = t.data_ptr()
    field.dtype = _ANY_DTYPE[t.dtype]
    n = field.rank = t.dim()
    field.shape[:n] = t.shape
    field.strides[:n] = t.stride()


def _bind_side(names, side):
    if not side:
        return None, 0
    arr = (_capi.SideTensor * len(side))()
    for a, name, t in zip(arr, names, side):
        n = t.dim()
        a.name = name
        a.data = t.data_ptr()
        a.dtype = _SIDE_KIND[t.dtype][1]
        a.rank = n
        a.shape = tuple(t.shape) + (1,) * (4 - n)
        a.strides = tuple(t.stride()) + (0,) * (4 - n)
    return arr, len(side)


def _side_tensors(tensors, q, grads=True):
    """The side tensors of `tensors` (a dict name: tensor, or None) as the
    kernels read them -- on q's device, in order, float16 and bfloat16 as
    they are, other floats float32, integers int32 -- and
    their IR declarations; with grads, a float tensor that requires grad
    (autograd on) is declared grad."""
    side, decls = [], []
    for name, t in (tensors or {}).items():
        grad = grads and t.is_floating_point() and t.requires_grad and torch.is_grad_enabled()
        decls.append(_side_decl(name, t, grad))
        side.append(t.to(device=q.device, dtype=_side_dtype(t)))
    return side, decls


def _side_decls(body):
    """The body's side tensor declarations, in order (the order the ops
    receive the tensors in)."""
    if not body.startswith("tensors = ("):
        return []
    return body[len("tensors = ("):body.index(")")].split(",")


def _side_names(body):
    """The declared side tensors' names, in order."""
    return [d.split(":")[0].strip().encode() for d in _side_decls(body)]


def _side_grad_flags(body):
    """Whether each declared side tensor is `grad` (docs/ir.md 'Gradients
    of side tensors'), in order."""
    return [d.strip().endswith(" grad") for d in _side_decls(body)]


def _aligned(t, traced=False):
    """t, or a contiguous copy where it breaks the C rules (unit stride on
    the last dim; 16-byte aligned strides and, unless traced, data)."""
    es = t.element_size()
    if not traced and t.data_ptr() % 16:
        return t.contiguous() if not t.is_contiguous() else t.clone()
    if t.is_contiguous() and t.shape[-1] * es % 16 == 0:
        return t       # every stride a multiple of the last dim's bytes
    if t.stride(-1) == 1 and all(t.stride(i) * es % 16 == 0 for i in range(t.dim() - 1)):
        return t
    return t.contiguous()


def _launch(fn, kernel, dev, args):
    ctx = attnjit._ctx
    code = fn(ctx.ptr, dev, kernel.ptr, ctypes.byref(args))
    if code != _capi.OK:
        with ctx.lock:
            ctx.check(code)


def _bind_rest(a, alibi_slopes, rng, side, body):
    """The fields aj_fwd_args and aj_bwd_args share past the main tensors:
    alibi slopes, the dropout stream, side tensors by name.  Returns the
    side tensor array, which must live until the call returns."""
    if alibi_slopes is not None:
        _put(a.alibi_slopes, alibi_slopes)
    if rng is not None:
        a.seed, a.offset = rng.tolist()
    side_arr, a.num_side = _bind_side(_side_names(body), side)
    a.side = side_arr
    a.check_side_bounds = 0 if _OOB_ZERO in body else 1


class Positions:
    """Where a launch's rows and keys sit in the whole sequence (a ring
    shard's): global offsets of row 0 and key 0, and the totals."""
    __slots__ = ("q_offset", "kv_offset", "sq_total", "sk_total")

    def __init__(self, q_offset=0, kv_offset=0, sq_total=0, sk_total=0):
        self.q_offset, self.kv_offset = q_offset, kv_offset
        self.sq_total, self.sk_total = sq_total, sk_total


_WHOLE = Positions()


def _bind_varlen(a, varlen):
    """layout = varlen's fields of an args struct: varlen is (cu_seqlens_q,
    cu_seqlens_k, max_seqlen_q, max_seqlen_k), int32 offsets on the
    tensors' device and the bounds the caller gives (no host sync)."""
    cu_q, cu_k, max_q, max_k = varlen
    a.cu_seqlens_q, a.cu_seqlens_k = cu_q.data_ptr(), cu_k.data_ptr()
    a.batch, a.max_seqlen_q, a.max_seqlen_k = cu_q.shape[0] - 1, max_q, max_k


def forward_into(q, k, v, o, lse, bias, alibi_slopes, side, rng, variant, body,
                 at=_WHOLE, o_acc=None, masked=True, varlen=None, heads=(0, 0)):
    """aj_forward of the op `body` on torch tensors, writing o and lse (or,
    with o_acc, merging into o_acc and lse: an op with accumulate = true);
    masked=False runs the op without its mask; varlen: see _bind_varlen;
    heads: (head_offset, heads_q_total), the call's heads among the whole
    op's (Ulysses: h in masks, alibi, dropout is the global head)."""
    dev, stream = _device_of(q)
    kernel = _kernel("forward", variant, body, dev, masked)
    a = _capi.FwdArgs(struct_size=_FWD_SIZE, stream=stream, q_offset=at.q_offset,
                      kv_offset=at.kv_offset, sq_total=at.sq_total, sk_total=at.sk_total,
                      head_offset=heads[0], heads_q_total=heads[1])
    if varlen is not None:
        _bind_varlen(a, varlen)
    for field, t in ((a.q, q), (a.k, k), (a.v, v), (a.lse, lse)):
        _put(field, t)
    _put(a.o if o_acc is None else a.o_acc, o if o_acc is None else o_acc)
    if bias is not None:
        _put(a.bias, bias)
    _bind_rest(a, alibi_slopes, rng, side, body)
    _launch(_lib.aj_forward, kernel, dev, a)


def backward_into(do, q, k, v, o, lse, dq, dk, dv, bias, dbias, alibi_slopes, side, rng,
                  variant, body, at=_WHOLE, masked=True, varlen=None, heads=(0, 0),
                  dsinks=None, dside=None):
    """aj_backward of the op `body` on torch tensors, writing dq, dk, dv
    (and dbias with a bias, dsinks (Hq,) float32 when given, for an op with
    sinks, and dside[i], float32 of side[i]'s shape, for each grad side
    tensor where dside is given); masked=False runs the op without its mask;
    varlen, heads: as forward_into's."""
    dev, stream = _device_of(q)
    kernel = _kernel("backward", variant, body, dev, masked)
    a = _capi.BwdArgs(struct_size=_BWD_SIZE, stream=stream, q_offset=at.q_offset,
                      kv_offset=at.kv_offset, sq_total=at.sq_total, sk_total=at.sk_total,
                      head_offset=heads[0], heads_q_total=heads[1])
    if varlen is not None:
        _bind_varlen(a, varlen)
    for field, t in ((a.q, q), (a.k, k), (a.v, v), (a.o, o), (a.lse, lse), (a.do_, do),
                     (a.dq, dq), (a.dk, dk), (a.dv, dv)):
        _put(field, t)
    if bias is not None:
        _put(a.bias, bias)
        _put(a.dbias, dbias)
    if dsinks is not None:
        _put(a.dsinks, dsinks)
    _bind_rest(a, alibi_slopes, rng, side, body)
    dside_arr = None   # lives until the launch returns
    if dside is not None:
        wanted = [(name, t) for name, g, t in zip(_side_names(body), _side_grad_flags(body), dside)
                  if g]
        dside_arr, a.num_dside = _bind_side([n for n, _ in wanted], [t for _, t in wanted])
        a.dside = dside_arr
    workspace = None
    if stream is not None:
        # cuda: the workspace comes from torch's allocator, on torch's stream
        nbytes = ctypes.c_size_t()
        ctx = attnjit._ctx
        with ctx.lock:
            ctx.check(_lib.aj_backward_workspace_size(ctx.ptr, kernel.ptr, ctypes.byref(a),
                                                      ctypes.byref(nbytes)))
        if nbytes.value:
            workspace = torch.empty(nbytes.value, dtype=torch.uint8, device=q.device)
            a.workspace, a.workspace_bytes = workspace.data_ptr(), nbytes.value
    _launch(_lib.aj_backward, kernel, dev, a)


def _attention_fwd_impl(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                   bias: Optional[torch.Tensor], alibi_slopes: Optional[torch.Tensor],
                   side: List[torch.Tensor], rng: Optional[torch.Tensor], variant: str,
                   body: str, head_offset: int = 0,
                   heads_q_total: int = 0) -> Tuple[torch.Tensor, torch.Tensor]:
    q, k, v = _aligned(q), _aligned(k), _aligned(v)
    B, Hq, Sq, _ = q.shape
    o = torch.empty((B, Hq, Sq, v.shape[-1]), dtype=q.dtype, device=q.device)
    lse = torch.empty((B, Hq, Sq), dtype=torch.float32, device=q.device)
    forward_into(q, k, v, o, lse, bias, alibi_slopes, side, rng, variant, body,
                 heads=(head_offset, heads_q_total))
    return o, lse


_attention_fwd = torch.library.custom_op("attnjit::attention_fwd",
                                         mutates_args=())(_attention_fwd_impl)


@_attention_fwd.register_fake
def _attention_fwd_fake(q, k, v, bias, alibi_slopes, side, rng, variant, body, head_offset=0,
                        heads_q_total=0):
    _verify(variant, body)
    B, Hq, Sq, _ = q.shape
    return (q.new_empty((B, Hq, Sq, v.shape[-1])),
            q.new_empty((B, Hq, Sq), dtype=torch.float32))


def _attention_bwd_impl(do: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                   o: torch.Tensor, lse: torch.Tensor, bias: Optional[torch.Tensor],
                   alibi_slopes: Optional[torch.Tensor], side: List[torch.Tensor],
                   rng: Optional[torch.Tensor], variant: str, body: str, head_offset: int = 0,
                   heads_q_total: int = 0
                   ) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor,
                              torch.Tensor, List[torch.Tensor]]:
    q, k, v, do = _aligned(q), _aligned(k), _aligned(v), _aligned(do)
    dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
    dbias = (torch.empty(bias.shape, dtype=torch.float32, device=q.device) if bias is not None
             else q.new_empty((0,), dtype=torch.float32))
    dsinks = _dsinks_like(q, body)
    dside = _dside_like(side, body)
    backward_into(do, q, k, v, o, lse, dq, dk, dv, bias, dbias if bias is not None else None,
                  alibi_slopes, side, rng, variant, body, heads=(head_offset, heads_q_total),
                  dsinks=dsinks if dsinks.numel() else None,
                  dside=dside if any(_side_grad_flags(body)) else None)
    return dq, dk, dv, dbias, dsinks, dside


_attention_bwd = torch.library.custom_op("attnjit::attention_bwd",
                                         mutates_args=())(_attention_bwd_impl)


@_attention_bwd.register_fake
def _attention_bwd_fake(do, q, k, v, o, lse, bias, alibi_slopes, side, rng, variant, body,
                        head_offset=0, heads_q_total=0):
    dbias = (q.new_empty(bias.shape, dtype=torch.float32) if bias is not None
             else q.new_empty((0,), dtype=torch.float32))
    return (torch.empty_like(q), torch.empty_like(k), torch.empty_like(v), dbias,
            _dsinks_like(q, body), _dside_like(side, body))


def _sinks_tensor(sinks, q):
    """sinks, checked to be one float logit per query head of q ((B, Hq,
    S, D) or packed (T, Hq, D)), as the float32 side tensor the kernels read
    (on q's device; the conversion keeps autograd's graph)."""
    if not isinstance(sinks, torch.Tensor) or sinks.shape != (q.shape[1],) \
            or not sinks.is_floating_point():
        raise _fail("sinks must be a float tensor of one logit per query head, (%d,); got %s"
                    % (q.shape[1], tuple(sinks.shape) if isinstance(sinks, torch.Tensor)
                       else type(sinks).__name__))
    return sinks.to(device=q.device, dtype=torch.float32).contiguous()


def _dsinks_like(q, body):
    """The sinks' gradient of a backward: (Hq,) float32 for an op with
    sinks (q (B, Hq, S, D) or (T, Hq, D)), else empty."""
    n = q.shape[1] if "\n  sinks = " in body else 0
    return q.new_empty((n,), dtype=torch.float32)


def _dside_like(side, body):
    """The side tensors' gradients of a backward: float32 of its tensor's
    shape for each grad one, empty for the others."""
    return [t.new_empty(t.shape if g else (0,), dtype=torch.float32)
            for t, g in zip(side, _side_grad_flags(body))]


def _side_grads(side, body, dsinks, heads=(0, 0), dside=None):
    """The gradients of the side tensors: the sinks' where the op has them
    (a head shard's, heads = (head_offset, heads_q_total), in its place
    among all the heads' zeros), the grad tensors' (dside), None for the
    others (constants)."""
    if dsinks.numel() and heads[1]:
        whole = dsinks.new_zeros((heads[1],))
        whole[heads[0]:heads[0] + dsinks.numel()] = dsinks
        dsinks = whole
    grads = _side_grad_flags(body)
    return [dsinks if name == _SINKS.encode() and dsinks.numel()
            else dside[i] if dside is not None and grads[i] else None
            for i, (name, _) in enumerate(zip(_side_names(body), side))]


def _setup_context(ctx, inputs, output):
    q, k, v, bias, alibi_slopes, side, rng, variant, body, *heads = inputs
    o, lse = output
    ctx.save_for_backward(q, k, v, o, lse, bias, alibi_slopes, rng, *side)
    ctx.variant, ctx.body, ctx.heads = variant, body, heads
    ctx.mark_non_differentiable(lse)


def _backward(ctx, do, dlse):
    q, k, v, o, lse, bias, alibi_slopes, rng, *side = ctx.saved_tensors
    eager = _eager(do, q, k, v, o, lse, bias, alibi_slopes, rng, *side)
    bwd = _attention_bwd_impl if eager else torch.ops.attnjit.attention_bwd
    dq, dk, dv, dbias, dsinks, dside = bwd(
        do, q, k, v, o, lse, bias, alibi_slopes, side, rng, ctx.variant, ctx.body, *ctx.heads)
    dbias = dbias.to(bias.dtype) if bias is not None else None
    heads = tuple(ctx.heads) if len(ctx.heads) == 2 else (0, 0)
    # one gradient per input: q, k, v, bias, alibi_slopes, side, rng, variant, body, heads
    return (dq, dk, dv, dbias, None, _side_grads(side, ctx.body, dsinks, heads, dside),
            None, None, None) + (None,) * len(ctx.heads)


_attention_fwd.register_autograd(_backward, setup_context=_setup_context)


# layout = varlen: q (Tq, Hq, D), k (Tk, Hkv, D), v (Tk, Hkv, Dv), o (Tq, Hq, Dv),
# lse (Hq, Tq), with cu_seqlens_q / _k (int32, B + 1) and the length bounds
def _attention_varlen_fwd_impl(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                          cu_seqlens_q: torch.Tensor, cu_seqlens_k: torch.Tensor,
                          max_seqlen_q: int, max_seqlen_k: int,
                          alibi_slopes: Optional[torch.Tensor], side: List[torch.Tensor],
                          rng: Optional[torch.Tensor], variant: str, body: str,
                          head_offset: int = 0,
                          heads_q_total: int = 0) -> Tuple[torch.Tensor, torch.Tensor]:
    q, k, v = _aligned(q), _aligned(k), _aligned(v)
    Tq, Hq, _ = q.shape
    o = torch.empty((Tq, Hq, v.shape[-1]), dtype=q.dtype, device=q.device)
    lse = torch.empty((Hq, Tq), dtype=torch.float32, device=q.device)
    forward_into(q, k, v, o, lse, None, alibi_slopes, side, rng, variant, body,
                 varlen=(cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k),
                 heads=(head_offset, heads_q_total))
    return o, lse


_attention_varlen_fwd = torch.library.custom_op("attnjit::attention_varlen_fwd",
                                                mutates_args=())(_attention_varlen_fwd_impl)


@_attention_varlen_fwd.register_fake
def _attention_varlen_fwd_fake(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
                               max_seqlen_k, alibi_slopes, side, rng, variant, body,
                               head_offset=0, heads_q_total=0):
    _verify(variant, body)
    Tq, Hq, _ = q.shape
    return (q.new_empty((Tq, Hq, v.shape[-1])),
            q.new_empty((Hq, Tq), dtype=torch.float32))


def _attention_varlen_bwd_impl(do: torch.Tensor, q: torch.Tensor, k: torch.Tensor,
                          v: torch.Tensor, o: torch.Tensor, lse: torch.Tensor,
                          cu_seqlens_q: torch.Tensor, cu_seqlens_k: torch.Tensor,
                          max_seqlen_q: int, max_seqlen_k: int,
                          alibi_slopes: Optional[torch.Tensor], side: List[torch.Tensor],
                          rng: Optional[torch.Tensor], variant: str, body: str,
                          head_offset: int = 0, heads_q_total: int = 0
                          ) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor,
                                     List[torch.Tensor]]:
    q, k, v, do = _aligned(q), _aligned(k), _aligned(v), _aligned(do)
    dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
    dsinks = _dsinks_like(q, body)
    dside = _dside_like(side, body)
    backward_into(do, q, k, v, o, lse, dq, dk, dv, None, None, alibi_slopes, side, rng,
                  variant, body, varlen=(cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
                                         max_seqlen_k), heads=(head_offset, heads_q_total),
                  dsinks=dsinks if dsinks.numel() else None,
                  dside=dside if any(_side_grad_flags(body)) else None)
    return dq, dk, dv, dsinks, dside


_attention_varlen_bwd = torch.library.custom_op("attnjit::attention_varlen_bwd",
                                                mutates_args=())(_attention_varlen_bwd_impl)


@_attention_varlen_bwd.register_fake
def _attention_varlen_bwd_fake(do, q, k, v, o, lse, cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
                               max_seqlen_k, alibi_slopes, side, rng, variant, body,
                               head_offset=0, heads_q_total=0):
    return (torch.empty_like(q), torch.empty_like(k), torch.empty_like(v),
            _dsinks_like(q, body), _dside_like(side, body))


def _setup_varlen_context(ctx, inputs, output):
    q, k, v, cu_q, cu_k, max_q, max_k, alibi_slopes, side, rng, variant, body, *heads = inputs
    o, lse = output
    ctx.save_for_backward(q, k, v, o, lse, cu_q, cu_k, alibi_slopes, rng, *side)
    ctx.bounds, ctx.variant, ctx.body, ctx.heads = (max_q, max_k), variant, body, heads
    ctx.mark_non_differentiable(lse)


def _varlen_backward(ctx, do, dlse):
    q, k, v, o, lse, cu_q, cu_k, alibi_slopes, rng, *side = ctx.saved_tensors
    eager = _eager(do, q, k, v, o, lse, cu_q, cu_k, alibi_slopes, rng, *side)
    bwd = _attention_varlen_bwd_impl if eager else torch.ops.attnjit.attention_varlen_bwd
    dq, dk, dv, dsinks, dside = bwd(
        do, q, k, v, o, lse, cu_q, cu_k, *ctx.bounds, alibi_slopes, side, rng, ctx.variant,
        ctx.body, *ctx.heads)
    heads = tuple(ctx.heads) if len(ctx.heads) == 2 else (0, 0)
    # one gradient per input: q, k, v, cu_q, cu_k, max_q, max_k, alibi_slopes, side, rng,
    # variant, body, heads
    return (dq, dk, dv, None, None, None, None, None,
            _side_grads(side, ctx.body, dsinks, heads, dside), None, None,
            None) + (None,) * len(ctx.heads)


_attention_varlen_fwd.register_autograd(_varlen_backward, setup_context=_setup_varlen_context)


# ---------------------------------------------------------------- eager calls

def _eager(*tensors):
    """Whether a call may run an op's implementation without the custom op:
    eager mode (no torch.compile, TorchScript trace, functorch transform,
    torch function or dispatch mode, each of which must see the op) and
    plain tensors (no subclass: FakeTensor, FunctionalTensor, DTensor ...)
    on the cpu or a GPU.  torch.library's Python dispatch of a custom op
    costs about 0.1 ms a call on the team's hosts, more than the whole
    attention at small shapes (docs/python.md "Eager calls")."""
    if (torch.compiler.is_compiling() or torch._C._get_tracing_state() is not None
            or torch._C._are_functorch_transforms_active()
            or torch._C._len_torch_dispatch_stack() > 0
            or torch._C._is_torch_function_mode_enabled()):
        return False
    return all(t is None or (type(t) is torch.Tensor and t.device.type in ("cpu", "cuda"))
               for t in tensors)


# each forward op: the custom op, its implementation, its autograd setup
# and backward (as registered with the custom op) and the index of its
# side-tensor list
_DIRECT = {
    "padded": (_attention_fwd, _attention_fwd_impl, _setup_context, _backward, 5),
    "varlen": (_attention_varlen_fwd, _attention_varlen_fwd_impl, _setup_varlen_context,
               _varlen_backward, 8),
}


class _Direct(torch.autograd.Function):
    """A forward op and its registered backward for an eager call (_eager),
    without the custom op's dispatch: the same implementation, context and
    gradients.  The side tensors travel flattened after the op's other
    inputs (autograd sees a tensor only as an argument of its own)."""

    @staticmethod
    def forward(ctx, layout, n_side, *flat):
        _, impl, setup, _, at = _DIRECT[layout]
        inputs = _unflatten(flat, n_side, at)
        out = impl(*inputs)
        setup(ctx, inputs, out)
        ctx.layout, ctx.n_side = layout, n_side
        return out

    @staticmethod
    def backward(ctx, do, dlse):
        _, _, _, backward, at = _DIRECT[ctx.layout]
        grads = backward(ctx, do, dlse)
        return (None, None) + _flatten(grads, at)


def _flatten(items, at):
    """items with the list at index `at` moved, spread, to the end."""
    return tuple(items[:at]) + tuple(items[at + 1:]) + tuple(items[at])


def _unflatten(flat, n_side, at):
    """_flatten's inverse: the last n_side items as a list at index `at`."""
    rest = list(flat[:len(flat) - n_side])
    return rest[:at] + [list(flat[len(flat) - n_side:])] + rest[at:]


def _forward_op(layout, *inputs):
    """The forward op `layout` ("padded": attention_fwd, "varlen":
    attention_varlen_fwd) on inputs, as an eager call where it may be."""
    op, at = _DIRECT[layout][0], _DIRECT[layout][4]
    side = inputs[at]
    tensors = [t for t in inputs if t is None or isinstance(t, torch.Tensor)]
    if _eager(*tensors, *side):
        return _Direct.apply(layout, len(side), *_flatten(inputs, at))
    return op(*inputs)


# ---------------------------------------------------------------- the entry point

def attention(q, k, v, *, causal=False, window=None, softcap=None, alibi_slopes=None,
              bias=None, scale=None, dropout_p=0.0, mask=None, score_mod=None, tensors=None,
              sinks=None, variant=None, return_lse=False, oob="check", q_descale=None,
              k_descale=None, v_descale=None, out_dtype=None, warpgroups=None):
    """Attention over q (B, Hq, Sq, D), k (B, Hkv, Sk, D), v (B, Hkv, Sk, Dv):
    returns o (B, Hq, Sq, Dv), and with return_lse also lse (B, Hq, Sq),
    float32, natural log, -inf for a row that sees no key (whose o is 0).

    causal: False, True (= "top_left", PyTorch's is_causal) or "bottom_right"
    (FlashAttention's).  window=(left, right): keys q+shift-left ..
    q+shift+right (None or -1: unbounded); with causal, right is 0.
    softcap=C: s = C tanh(s / C).  alibi_slopes: (Hq,) float32.  bias:
    added to the scaled score, broadcastable to (B, Hq, Sq, Sk) with its
    last two dims full (efficient variant, chosen when bias is given; the
    flash variant takes one as score_mod="score + B[b, h, q, k]" with
    tensors={"B": bias}, docs/ir.md "bias").
    mask / score_mod: an IR expression E (docs/ir.md) over b, h, q, k, sq,
    sk (and score), reading the side tensors in `tensors` by name (int
    tensors as i32, float16 and bfloat16 as they are, other floats as
    f32).  dropout_p: Philox dropout seeded
    from torch's RNG.  sinks: (Hq,) learned sink logits (gpt-oss): each
    row's softmax denominator gains exp(sinks[h]), o gets nothing from it,
    lse includes it; sinks receives its gradient (summed over the batch
    and rows in a fixed order).  oob: "check" (a load of mask / score_mod
    that may leave its side tensor, by interval arithmetic over the call's
    positions, raises InvalidArgError naming it) or "zero" (it reads 0,
    the IR's rule).  lse carries no gradient.  warpgroups=1 or 2: on a
    Hopper GPU (compute capability 9.0) the flash variant's wgmma kernels,
    forward and backward, on that many warpgroups (docs/gpu.md; float16 /
    bfloat16; other GPUs refuse it, the cpu runs its own kernels).

    FP8 inputs (a forward; docs/python.md "FP8 inputs"): k and v of
    float8_e4m3fn or float8_e5m2 with k_descale and v_descale (floats, or
    float32 tensors of 1 or Hkv elements: what the stored values are
    multiplied by), q of the same 8-bit kind with q_descale (1 or Hq) or
    16-bit; o is out_dtype (default bfloat16, or q's 16-bit dtype).
    attnjit.torch.quantize_fp8 makes such inputs."""
    if _is_fp8(q, k, v, k_descale, v_descale):
        from . import _fp8   # (it builds on this module)
        _fp8_refuses(alibi_slopes=alibi_slopes, bias=bias, dropout_p=dropout_p,
                     warpgroups=warpgroups)
        return _fp8.forward(q, k, v, q_descale=q_descale, k_descale=k_descale,
                            v_descale=v_descale, out_dtype=out_dtype, causal=causal,
                            window=window, softcap=softcap, scale=scale, mask=mask,
                            score_mod=score_mod, tensors=tensors, sinks=sinks,
                            return_lse=return_lse)
    if q_descale is not None or out_dtype is not None:
        raise _fail("q_descale and out_dtype apply to FP8 inputs (float8 k and v)")
    q, k, v, bias, alibi_slopes, side, rng, variant, body = _prepare(
        q, k, v, causal, window, softcap, alibi_slopes, bias, scale, dropout_p, mask, score_mod,
        tensors, variant, sinks=sinks, oob=oob, warpgroups=warpgroups)
    body += _short_tiles(q, k)
    o, lse = _forward_op("padded", q, k, v, bias, alibi_slopes, side, rng, variant, body)
    return (o, lse) if return_lse else o


def _is_fp8(q, k, v, k_descale, v_descale):
    """Whether a call has FP8 inputs (float8 tensors, or descales)."""
    return (k_descale is not None or v_descale is not None
            or any(getattr(t, "dtype", None) in _F8 for t in (q, k, v)))


def _fp8_refuses(alibi_slopes=None, bias=None, dropout_p=0.0, warpgroups=None):
    """What the FP8 forward does not take (write alibi as a score_mod
    expression; a forward of 8-bit inputs is inference's, without dropout;
    on Hopper it picks its wgmma kernel itself)."""
    if warpgroups is not None:
        raise _fail("warpgroups with FP8 inputs: the FP8 forward picks its Hopper (wgmma) "
                    "kernel itself (docs/python.md 'FP8 inputs')")
    for name, given in (("alibi_slopes", alibi_slopes is not None),
                        ("bias", bias is not None), ("dropout_p", bool(dropout_p))):
        if given:
            raise _fail("%s with FP8 inputs: not supported (alibi: write it as a score_mod "
                        "expression over a side tensor; docs/python.md 'FP8 inputs')" % name)


def _offsets_problem(name, t, q):
    """What keeps cu_seqlens tensor t (called `name`) from a varlen launch
    with q: not a 1-D int32 tensor on q's device; None when nothing."""
    if not isinstance(t, torch.Tensor) or t.dim() != 1 or t.dtype != torch.int32:
        return ("%s must be a 1-D int32 tensor (B + 1 offsets); got %s"
                % (name, getattr(t, "dtype", type(t).__name__)))
    if t.device != q.device:
        return "%s is on %s, q on %s" % (name, t.device, q.device)
    return None


def attention_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, *,
                     causal=False, window=None, softcap=None, alibi_slopes=None, scale=None,
                     dropout_p=0.0, mask=None, score_mod=None, tensors=None, sinks=None,
                     variant=None, return_lse=False, oob="check", q_descale=None,
                     k_descale=None, v_descale=None, out_dtype=None, warpgroups=None):
    """attention() over packed sequences (FlashAttention's varlen layout):
    q (Tq, Hq, D), k (Tk, Hkv, D), v (Tk, Hkv, Dv); sequence b is rows
    cu_seqlens_q[b] .. cu_seqlens_q[b+1]-1 of q and cu_seqlens_k[b] ..
    cu_seqlens_k[b+1]-1 of k and v (int32 (B + 1,) tensors on q's device,
    from 0, non-decreasing; a sequence may be empty); max_seqlen_q /
    max_seqlen_k (ints) bound every sequence's length, so no call reads the
    offsets back to the host.  Returns o (Tq, Hq, Dv), and with return_lse
    lse (Hq, Tq).  Positions restart at each sequence: causal, window,
    mask and score_mod (b is the sequence) apply per sequence, as do
    bottom_right shifts (each sequence's own lengths).  The other options
    are attention()'s (FP8 inputs too); no bias.  Offsets that break the
    rules (or a sequence longer than its bound) raise InvalidArgError."""
    for name, t in (("cu_seqlens_q", cu_seqlens_q), ("cu_seqlens_k", cu_seqlens_k)):
        why = _offsets_problem(name, t, q)
        if why:
            raise _fail(why)
    if cu_seqlens_q.shape != cu_seqlens_k.shape or cu_seqlens_q.shape[0] < 1:
        raise _fail("cu_seqlens_q (%d) and cu_seqlens_k (%d) must both hold B + 1 >= 1 offsets"
                    % (cu_seqlens_q.shape[0], cu_seqlens_k.shape[0]))
    bounds = []
    for name, n in (("max_seqlen_q", max_seqlen_q), ("max_seqlen_k", max_seqlen_k)):
        if isinstance(n, bool) or not isinstance(n, int) or not 0 <= n < 2**31:
            raise _fail("%s = %r; want an int in 0 .. 2^31 - 1" % (name, n))
        bounds.append(n)
    if _is_fp8(q, k, v, k_descale, v_descale):
        from . import _fp8
        _fp8_refuses(alibi_slopes=alibi_slopes, dropout_p=dropout_p, warpgroups=warpgroups)
        return _fp8.forward(q, k, v, q_descale=q_descale, k_descale=k_descale,
                            v_descale=v_descale, out_dtype=out_dtype, causal=causal,
                            window=window, softcap=softcap, scale=scale, mask=mask,
                            score_mod=score_mod, tensors=tensors, sinks=sinks,
                            return_lse=return_lse,
                            varlen=(cu_seqlens_q.contiguous(), cu_seqlens_k.contiguous(),
                                    bounds[0], bounds[1]))
    if q_descale is not None or out_dtype is not None:
        raise _fail("q_descale and out_dtype apply to FP8 inputs (float8 k and v)")
    q, k, v, _, alibi_slopes, side, rng, variant, body = _prepare(
        q, k, v, causal, window, softcap, alibi_slopes, None, scale, dropout_p, mask, score_mod,
        tensors, variant, layout="varlen", sinks=sinks, oob=oob, warpgroups=warpgroups)
    o, lse = _forward_op("varlen", q, k, v, cu_seqlens_q.contiguous(),
                         cu_seqlens_k.contiguous(), bounds[0], bounds[1], alibi_slopes, side,
                         rng, variant, body)
    return (o, lse) if return_lse else o


# The cpu templates' default tiles (forward 128 x 64, backward 64 x 64) run
# a short sequence's one block whole past its end, and leave 2 threads few
# items: where both lengths are at most 128 (f32, eager) the op asks for
# 32 x 32 tiles, 13-28% faster forward and up to 15% backward at B 2, H 4/2
# (bench/README.md "Small shapes"; under torch.compile the shapes may be
# symbolic, and the default tiles stay)
_SHORT_SEQ = 128
_SHORT_TILES = "\n  schedule = (block_m = 32, block_n = 32)"


def _warpgroups(n, variant, q):
    """The schedule line of attention()'s warpgroups=n: the flash
    variant's wgmma kernels (Hopper), forward and backward; "" for None."""
    if n is None:
        return ""
    if isinstance(n, bool) or n not in (1, 2):
        raise _fail("warpgroups = %r; want 1 or 2 (the flash variant's wgmma kernels on "
                    "Hopper, docs/gpu.md) or None" % (n,))
    if variant != "flash" or q.dtype == torch.float32:
        raise _fail("warpgroups = %d selects the flash variant's wgmma kernels, which take "
                    "float16 and bfloat16 without bias; this call runs the %s variant in %s"
                    % (n, variant, q.dtype))
    return "\n  schedule = (warpgroups = %d)" % n


def _short_tiles(q, k):
    """The schedule line attention() adds to a short f32 cpu call's op."""
    if (q.device.type == "cpu" and q.dtype == torch.float32 and q.shape[-2] <= _SHORT_SEQ
            and k.shape[-2] <= _SHORT_SEQ and not torch.compiler.is_compiling()):
        return _SHORT_TILES
    return ""


def _aligned_bias(bias):
    """bias as (B or 1, H or 1, Sq, Sk) with a unit-stride last dim."""
    while bias.dim() < 4:
        bias = bias.unsqueeze(0)
    return bias if bias.stride(-1) == 1 else bias.contiguous()


def _prepare(q, k, v, causal, window, softcap, alibi_slopes, bias, scale, dropout_p, mask,
             score_mod, tensors, variant, layout="padded", sinks=None, oob="check",
             warpgroups=None):
    """The checks and conversions attention(), attention_varlen() and
    ring_attention() share: the tensors as the ops take them and the op's
    IR body (layout "padded": (B, H, S, D); "varlen": (T, H, D)).  A float
    side tensor that requires grad is declared grad (its gradient flows
    back)."""
    rank, dims = (3, "(T, H, D)") if layout == "varlen" else (4, "(B, H, S, D)")
    if q.dim() != rank or k.dim() != rank or v.dim() != rank:
        raise _fail("q, k and v must be %d-D %s; got %d, %d and %d dims"
                    % (rank, dims, q.dim(), k.dim(), v.dim()))
    if q.dtype not in _AJ_DTYPE:
        raise _fail("q.dtype = %s; attnjit computes in float16, bfloat16 and float32" % q.dtype)
    if k.dtype != q.dtype or v.dtype != q.dtype:
        raise _fail("k (%s) and v (%s) must have q's dtype %s" % (k.dtype, v.dtype, q.dtype))
    if not 0.0 <= dropout_p < 1.0:
        raise _fail("dropout_p = %r; want 0 <= p < 1" % (dropout_p,))
    variant = variant or ("efficient" if bias is not None else "flash")
    if variant not in ("flash", "efficient"):
        raise _fail("variant = %r; want 'flash' or 'efficient'" % (variant,))
    side, decls = _side_tensors(tensors, q)
    alibi = alibi_slopes is not None
    alibi_grad = alibi and alibi_slopes.requires_grad and torch.is_grad_enabled()
    if alibi:
        alibi_slopes = alibi_slopes.to(device=q.device, dtype=torch.float32).contiguous()
    if bias is not None:
        if bias.dim() > 4:
            raise _fail("bias has %d dims; want at most 4" % bias.dim())
        bias = _aligned_bias(bias.to(q.dtype))
    if sinks is not None:
        sinks = _sinks_tensor(sinks, q)
    body = _body(_IR_DTYPE[q.dtype], q.shape[-1], v.shape[-1], causal, window, softcap, alibi,
                 bias is not None, scale, dropout_p, mask, score_mod, decls,
                 sinks=sinks is not None, alibi_grad=alibi_grad)
    if layout != "padded":
        body += "\n  layout = " + layout
    if _ALIBI in body:          # slopes as a side tensor (with softcap, or learned)
        side.append(alibi_slopes)
        alibi_slopes = None
    if sinks is not None:
        side.append(sinks)
    if oob not in ("check", "zero"):
        raise _fail("oob = %r; want 'check' (a load that may leave its side tensor is an "
                    "error) or 'zero' (it reads 0)" % (oob,))
    if oob == "zero":
        body += _OOB_ZERO
    body += _warpgroups(warpgroups, variant, q)
    rng = None
    if dropout_p:
        rng = torch.randint(0, 2**62, (2,), dtype=torch.int64)
    if not torch.compiler.is_compiling():
        _verify(variant, body)     # (traced: the fake implementation verifies)
    q, k, v = _aligned(q, True), _aligned(k, True), _aligned(v, True)
    return q, k, v, bias, alibi_slopes, side, rng, variant, body
