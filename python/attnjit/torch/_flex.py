"""A FlexAttention-compatible front end: flex_attention and create_block_mask
with torch's signatures, whose score_mod / mask_mod callables are traced
into attnjit expressions (docs/ir.md, "Expressions").

    score_mod(score, b, h, q_idx, kv_idx) -> score'
    mask_mod(b, h, q_idx, kv_idx) -> bool

The callables run once on symbolic values (_Sym) that record what is done
to them: Python arithmetic and comparisons, & | ^ ~ (logical on bools,
bitwise on ints), << >>, ** by a constant, abs, torch.where, torch's
tanh / exp / log / sqrt / sin / cos / tan / sigmoid / exp2 / log2 / erf /
floor / abs / clamp / minimum / maximum / pow / square / rsqrt / bitwise_*,
and indexing of tensors they capture (which become side tensors, read by
name).  Anything else raises attnjit.UnsupportedError naming the operation
and the function.
"""
import math

import torch

import attnjit

from . import _ops

_VARS = {"b": "int", "h": "int", "q": "int", "k": "int", "score": "float"}


def _unsupported(what, fn):
    name = getattr(fn, "__name__", repr(fn))
    return attnjit.UnsupportedError(
        4, "attnjit.torch.flex_attention: %s in %s has no attnjit expression form "
           "(docs/python.md, 'FlexAttention')" % (what, name))


class _Trace:
    """One callable's trace: the side tensors its indexing captured."""

    def __init__(self, fn):
        self.fn = fn
        self.tensors = {}      # name -> tensor
        self.ids = {}          # id(tensor) -> name

    def capture(self, t):
        if id(t) not in self.ids:
            name = "aj_cap%d" % len(self.ids)
            self.ids[id(t)] = name
            self.tensors[name] = t
        return self.ids[id(t)]


def _lit(x, trace):
    """A Python number, bool or 0-d tensor as a _Sym."""
    if isinstance(x, _Sym):
        return x
    if isinstance(x, torch.Tensor):
        if x.dim() != 0:
            raise _unsupported("a captured %d-D tensor used whole (index it)" % x.dim(),
                               trace.fn)
        x = x.item()
    if isinstance(x, bool):
        return _Sym("true" if x else "false", "bool", trace)
    if isinstance(x, int):
        return _Sym("%d" % x if x >= 0 else "(%d)" % x, "int", trace)
    if isinstance(x, float):
        if math.isinf(x):
            return _Sym("inf" if x > 0 else "(-inf)", "float", trace)
        return _Sym(repr(x) if x >= 0 else "(%r)" % x, "float", trace)
    raise _unsupported("a value of type %s" % type(x).__name__, trace.fn)


class _Sym:
    """A symbolic value: its IR text and type ("int", "float", "bool")."""

    def __init__(self, text, kind, trace):
        self.text, self.kind, self.trace = text, kind, trace

    def _operands(self, other, swap):
        """(self, other) as _Syms, in the written order."""
        o = _lit(other, self.trace)
        return (o, self) if swap else (self, o)

    def _bin(self, other, op, kind=None, swap=False):
        a, b = self._operands(other, swap)
        if kind is None:
            kind = "float" if "float" in (a.kind, b.kind) else "int"
        return _Sym("(%s %s %s)" % (a.text, op, b.text), kind, self.trace)

    def __add__(self, o): return self._bin(o, "+")
    def __radd__(self, o): return self._bin(o, "+", swap=True)
    def __sub__(self, o): return self._bin(o, "-")
    def __rsub__(self, o): return self._bin(o, "-", swap=True)
    def __mul__(self, o): return self._bin(o, "*")
    def __rmul__(self, o): return self._bin(o, "*", swap=True)

    def __truediv__(self, o):      # true division: a float, as torch's
        return _Sym("(%s * 1.0 / %s)" % (self.text, _lit(o, self.trace).text), "float",
                    self.trace)

    def __rtruediv__(self, o):
        return _Sym("(%s * 1.0 / %s)" % (_lit(o, self.trace).text, self.text), "float",
                    self.trace)

    def __floordiv__(self, o):
        r = self._bin(o, "/")
        return _Sym("floor(%s)" % r.text, "float", self.trace) if r.kind == "float" else r

    def __rfloordiv__(self, o):
        r = self._bin(o, "/", swap=True)
        return _Sym("floor(%s)" % r.text, "float", self.trace) if r.kind == "float" else r

    def __mod__(self, o): return self._bin(o, "%")
    def __rmod__(self, o): return self._bin(o, "%", swap=True)
    def __neg__(self): return _Sym("(-%s)" % self.text, self.kind, self.trace)
    def __pos__(self): return self
    def __abs__(self): return _Sym("abs(%s)" % self.text, self.kind, self.trace)
    def __lt__(self, o): return self._bin(o, "<", "bool")
    def __le__(self, o): return self._bin(o, "<=", "bool")
    def __gt__(self, o): return self._bin(o, ">", "bool")
    def __ge__(self, o): return self._bin(o, ">=", "bool")
    def __eq__(self, o): return self._bin(o, "==", "bool")    # noqa: D105
    def __ne__(self, o): return self._bin(o, "!=", "bool")
    def _bits(self, other, logical, bitwise, swap=False):
        """& | ^ as torch reads them: logical on bools, bitwise on ints."""
        a, b = self._operands(other, swap)
        if a.kind == "bool" and b.kind == "bool":
            return _Sym("(%s %s %s)" % (a.text, logical, b.text), "bool", self.trace)
        if a.kind == "int" and b.kind == "int":
            return _Sym("(%s %s %s)" % (a.text, bitwise, b.text), "int", self.trace)
        raise _unsupported("'%s' of %s and %s" % (bitwise, a.kind, b.kind), self.trace.fn)

    def __and__(self, o): return self._bits(o, "&&", "&")
    def __rand__(self, o): return self._bits(o, "&&", "&", swap=True)
    def __or__(self, o): return self._bits(o, "||", "|")
    def __ror__(self, o): return self._bits(o, "||", "|", swap=True)
    def __xor__(self, o): return self._bits(o, "!=", "^")
    def __rxor__(self, o): return self._bits(o, "!=", "^", swap=True)

    def __invert__(self):
        return _Sym("(%s%s)" % ("!" if self.kind == "bool" else "~", self.text), self.kind,
                    self.trace)

    def _shift(self, other, op, swap=False):
        a, b = self._operands(other, swap)
        if a.kind != "int" or b.kind != "int":
            raise _unsupported("'%s' of %s and %s" % (op, a.kind, b.kind), self.trace.fn)
        return _Sym("(%s %s %s)" % (a.text, op, b.text), "int", self.trace)

    def __lshift__(self, o): return self._shift(o, "<<")
    def __rlshift__(self, o): return self._shift(o, "<<", swap=True)
    def __rshift__(self, o): return self._shift(o, ">>")
    def __rrshift__(self, o): return self._shift(o, ">>", swap=True)

    def __pow__(self, e):
        return _pow(self.trace, self, e)

    def __rpow__(self, base):
        if isinstance(base, torch.Tensor) and base.dim() == 0:
            base = base.item()
        if not isinstance(base, (int, float)) or base <= 0:
            raise _unsupported("a power with a traced exponent of base %r" % (base,),
                               self.trace.fn)
        if base == 2:
            return _Sym("exp2(%s)" % self.text, "float", self.trace)
        return _Sym("exp(%s * %r)" % (self.text, math.log(base)), "float", self.trace)
    __hash__ = None

    def __bool__(self):
        raise _unsupported("Python control flow on a traced value (if / and / or; use "
                           "torch.where, & and |)", self.trace.fn)

    def to(self, *args, **kwargs):      # dtype changes: the expression's own types
        return self

    def float(self):
        return _Sym("(%s * 1.0)" % self.text, "float", self.trace)

    def abs(self):
        return abs(self)

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        flat = []
        for a in list(args) + list(kwargs.values()):
            flat.extend(a if isinstance(a, (tuple, list)) else (a,))
        trace = next(a for a in flat if isinstance(a, _Sym)).trace
        handler = _TORCH.get(func)
        if handler is None:
            raise _unsupported(getattr(func, "__name__", str(func)), trace.fn)
        return handler(trace, *args, **kwargs)


def _pow(trace, x, e):
    """x ** e for a constant e: an int power of an int by products (torch
    keeps it an int), pow(x, N) otherwise, sqrt for 0.5."""
    x = _lit(x, trace)
    if isinstance(e, torch.Tensor) and e.dim() == 0:
        e = e.item()
    if isinstance(e, float) and e.is_integer():
        e = int(e)
    if isinstance(e, float) and e == 0.5:
        return _Sym("sqrt(%s)" % x.text, "float", trace)
    if not isinstance(e, int) or isinstance(e, bool) or abs(e) > 64:
        raise _unsupported("a power with exponent %r (an int from -64 to 64, or 0.5)" % (e,),
                           trace.fn)
    if x.kind == "int" and 0 < e <= 8:
        return _Sym("(%s)" % " * ".join([x.text] * e), "int", trace)
    if x.kind == "int" and e == 0:
        return _Sym("1", "int", trace)
    return _Sym("pow(%s, %d)" % (x.text, e), "float", trace)


def _call(name, kind=None):
    def run(trace, x, *rest, **kw):
        s = _lit(x, trace)
        return _Sym("%s(%s)" % (name, s.text), kind or s.kind, trace)
    return run


def _where(trace, cond, a, b):
    c, x, y = (_lit(v, trace) for v in (cond, a, b))
    kind = "float" if "float" in (x.kind, y.kind) else x.kind
    return _Sym("(%s ? %s : %s)" % (c.text, x.text, y.text), kind, trace)


def _minmax(name):
    def run(trace, a, b, *rest, **kw):
        x, y = _lit(a, trace), _lit(b, trace)
        kind = "float" if "float" in (x.kind, y.kind) else x.kind
        return _Sym("%s(%s, %s)" % (name, x.text, y.text), kind, trace)
    return run


def _clamp(trace, x, min=None, max=None):
    s = _lit(x, trace)
    if min is not None:
        s = _minmax("max")(trace, s, min)
    if max is not None:
        s = _minmax("min")(trace, s, max)
    return s


def _getitem(trace, t, index):
    if isinstance(t, _Sym):
        raise _unsupported("indexing a traced value", trace.fn)
    index = index if isinstance(index, tuple) else (index,)
    if len(index) != t.dim() or not 1 <= t.dim() <= 4:
        raise _unsupported("indexing a %d-D tensor with %d indices (index every dim)"
                           % (t.dim(), len(index)), trace.fn)
    parts = [_lit(i, trace) for i in index]
    if any(p.kind != "int" for p in parts):
        raise _unsupported("a non-integer index", trace.fn)
    name = trace.capture(t)
    load = "%s[%s]" % (name, ", ".join(p.text for p in parts))
    if t.dtype == torch.bool:       # read as i32, 0 or 1
        return _Sym("(%s != 0)" % load, "bool", trace)
    return _Sym(load, "float" if t.is_floating_point() else "int", trace)


def _binary(op, kind=None):
    def run(trace, a, b, *rest, **kw):
        x = _lit(a, trace)
        return x._bin(b, op, kind)
    return run


# float functions of the IR under their torch names (torch.special's too)
_FLOAT_FNS = {"tanh": "tanh", "exp": "exp", "log": "log", "sqrt": "sqrt", "sin": "sin",
              "cos": "cos", "tan": "tan", "sigmoid": "sigmoid", "exp2": "exp2",
              "log2": "log2", "erf": "erf"}

_TORCH = {
    torch.Tensor.__getitem__: _getitem,
    torch.where: _where,
    torch.floor: _call("floor"), torch.Tensor.floor: _call("floor"),
    torch.abs: _call("abs"), torch.Tensor.abs: _call("abs"),
    torch.pow: lambda trace, x, e: _pow(trace, x, e),
    torch.Tensor.pow: lambda trace, x, e: _pow(trace, x, e),
    torch.Tensor.__pow__: lambda trace, x, e: _pow(trace, x, e),
    torch.square: lambda trace, x: _pow(trace, x, 2),
    torch.Tensor.square: lambda trace, x: _pow(trace, x, 2),
    torch.rsqrt: lambda trace, x: _Sym("(1.0 / sqrt(%s))" % _lit(x, trace).text, "float", trace),
    torch.bitwise_and: lambda trace, a, b: _lit(a, trace) & b,
    torch.bitwise_or: lambda trace, a, b: _lit(a, trace) | b,
    torch.bitwise_xor: lambda trace, a, b: _lit(a, trace) ^ b,
    torch.bitwise_not: lambda trace, x: ~_lit(x, trace),
    torch.bitwise_left_shift: lambda trace, a, b: _lit(a, trace) << b,
    torch.bitwise_right_shift: lambda trace, a, b: _lit(a, trace) >> b,
    torch.Tensor.__lshift__: lambda trace, a, b: _lit(a, trace) << b,
    torch.Tensor.__rshift__: lambda trace, a, b: _lit(a, trace) >> b,
    torch.clamp: _clamp, torch.Tensor.clamp: _clamp,
    torch.minimum: _minmax("min"), torch.maximum: _minmax("max"),
    torch.logical_and: _binary("&&", "bool"), torch.logical_or: _binary("||", "bool"),
    torch.logical_xor: _binary("!=", "bool"),
    torch.logical_not: lambda trace, x: ~_lit(x, trace),
    torch.eq: _binary("==", "bool"), torch.ne: _binary("!=", "bool"),
    torch.lt: _binary("<", "bool"), torch.le: _binary("<=", "bool"),
    torch.gt: _binary(">", "bool"), torch.ge: _binary(">=", "bool"),
    torch.Tensor.__and__: lambda trace, a, b: _lit(a, trace) & b,
    torch.Tensor.__or__: lambda trace, a, b: _lit(a, trace) | b,
    torch.Tensor.__xor__: lambda trace, a, b: _lit(a, trace) ^ b,
    torch.Tensor.__rand__: lambda trace, a, b: _lit(b, trace) & a,
    torch.Tensor.__ror__: lambda trace, a, b: _lit(b, trace) | a,
}
for _name, _ir in _FLOAT_FNS.items():
    for _owner in (torch, torch.Tensor, torch.special):
        if hasattr(_owner, _name):
            _TORCH[getattr(_owner, _name)] = _call(_ir, "float")
_TORCH[torch.special.expit] = _call("sigmoid", "float")


def _trace(fn, names, want):
    """fn run on the symbolic variables `names`: (expression text, the
    captured tensors {name: tensor})."""
    trace = _Trace(fn)
    args = [_Sym(n, _VARS[n], trace) for n in names]
    out = _lit(fn(*args), trace)
    if want == "bool" and out.kind != "bool":
        raise _unsupported("a mask_mod whose result is not a bool", fn)
    if want == "float" and out.kind == "bool":
        raise _unsupported("a score_mod whose result is a bool", fn)
    return out.text, trace.tensors


class BlockMask:
    """create_block_mask's result: the mask_mod it describes (attnjit
    classes its tiles itself, by interval arithmetic or a block mask built
    at launch) and the sizes it was made for."""

    def __init__(self, mask_mod, B, H, Q_LEN, KV_LEN, BLOCK_SIZE):
        self.mask_mod = mask_mod
        self.shape = (B, H, Q_LEN, KV_LEN)
        self.BLOCK_SIZE = BLOCK_SIZE

    def __repr__(self):
        return "attnjit.torch.BlockMask(shape=%s, mask_mod=%s)" % (
            self.shape, getattr(self.mask_mod, "__name__", self.mask_mod))


def create_block_mask(mask_mod, B, H, Q_LEN, KV_LEN, device="cpu", BLOCK_SIZE=128,
                      _compile=False):
    """torch.nn.attention.flex_attention.create_block_mask's signature: a
    BlockMask for flex_attention.  The mask_mod is traced when it is used
    (an expression it cannot be written as raises there)."""
    _trace(mask_mod, ("b", "h", "q", "k"), "bool")     # fail early, where it is made
    return BlockMask(mask_mod, B, H, Q_LEN, KV_LEN, BLOCK_SIZE)


def flex_attention(query, key, value, score_mod=None, block_mask=None, scale=None,
                   enable_gqa=False, return_lse=False, kernel_options=None):
    """torch's flex_attention signature over attnjit.torch.attention: query
    (B, Hq, L, E), key (B, Hkv, S, E), value (B, Hkv, S, Ev); score_mod and
    block_mask's mask_mod traced into expressions (captured tensors become
    side tensors); returns out (and lse, natural log, with return_lse).
    kernel_options is accepted and ignored (attnjit picks its schedule)."""
    if query.shape[1] != key.shape[1] and not enable_gqa:
        raise attnjit.InvalidArgError(
            1, "attnjit.torch.flex_attention: %d query heads over %d key/value heads need "
               "enable_gqa=True" % (query.shape[1], key.shape[1]))
    tensors, mask, mod = {}, None, None
    mask_mod = getattr(block_mask, "mask_mod", None)
    if mask_mod is not None:
        mask, captured = _trace(mask_mod, ("b", "h", "q", "k"), "bool")
        tensors.update(captured)
    if score_mod is not None:
        mod, captured = _trace(score_mod, ("score", "b", "h", "q", "k"), "float")
        # a second trace numbers its captures afresh: rename them apart
        for name, t in captured.items():
            new = name.replace("aj_cap", "aj_scap")
            mod = mod.replace(name + "[", new + "[")
            tensors[new] = t
    return _ops.attention(query, key, value, mask=mask, score_mod=mod, scale=scale,
                          tensors=tensors or None, return_lse=return_lse)
