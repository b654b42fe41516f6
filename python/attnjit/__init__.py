"""attnjit: attention kernels generated at run time (docs/python.md).

    attnjit.check(spec)              -> the canonical IR text (or attnjit.Error)
    attnjit.compile(spec, target=)   -> Kernel: code, launch contract, schedule
    attnjit.tune(spec, device=)      -> the timed schedules, fastest first
    attnjit.torch.attention(q, k, v) -> PyTorch op with autograd and torch.compile

A thin ctypes layer over libattnjit.so.0: every rule and message is the C
library's; a failing call raises the attnjit.Error subclass of its status.
"""
import ctypes
import os
import threading

from . import _capi
from ._capi import lib as _lib

__version__ = _lib.aj_version_string().decode()
__all__ = ["Error", "Kernel", "check", "compile", "cpu_describe", "tune", "llvm_version",
           "__version__"]


# ---------------------------------------------------------------- errors

class Error(Exception):
    """A failing attnjit call: .status (e.g. "AJ_ERR_VERIFY"), .code and
    .message (the C library's text)."""

    def __init__(self, code, message):
        self.code = code
        self.status = _capi.STATUS_NAMES[code] if 0 <= code < len(_capi.STATUS_NAMES) \
            else "status %d" % code
        self.message = message
        super().__init__("%s: %s" % (self.status, message))


class InvalidArgError(Error, ValueError): pass
class ParseError(Error, ValueError): pass
class VerifyError(Error, ValueError): pass
class UnsupportedError(Error, NotImplementedError): pass
class CodegenError(Error): pass
class NoDeviceError(Error): pass
class IOError(Error, OSError): pass  # noqa: A001 (the status's name)
class OutOfMemoryError(Error, MemoryError): pass
class InternalError(Error): pass
class KernelFaultError(Error): pass
class CommError(Error): pass


_ERRORS = (None, InvalidArgError, ParseError, VerifyError, UnsupportedError, CodegenError,
           NoDeviceError, IOError, OutOfMemoryError, InternalError, KernelFaultError,
           CommError)
__all__ += [cls.__name__ for cls in _ERRORS[1:]]


def error_for(code, message):
    cls = _ERRORS[code] if 0 < code < len(_ERRORS) else Error
    return cls(code, message)


# ---------------------------------------------------------------- the context

def _kernel_cache_limit():
    text = os.environ.get("AJ_CACHE_KERNELS", "")
    try:
        n = int(text) if text else 256
    except ValueError:
        n = 0
    if n < 1:
        raise ValueError("AJ_CACHE_KERNELS=%r: want a whole number of kernels, at least 1" % text)
    return n


# Kernels kept in memory by the process's context and by attnjit.torch's
# front cache (least recently used go first): $AJ_CACHE_KERNELS, else 256.
KERNEL_CACHE_LIMIT = _kernel_cache_limit()


class _Context:
    """The process's aj_ctx.  Calls that can fail hold `lock` so that the
    message read back is their own (attnjit.h: error text is per context)."""

    def __init__(self):
        ptr = ctypes.c_void_p()
        cfg = _capi.CtxConfig(struct_size=ctypes.sizeof(_capi.CtxConfig), log_level=1,
                              cache_max_kernels=KERNEL_CACHE_LIMIT)
        code = _lib.aj_ctx_create(ctypes.byref(cfg), ctypes.byref(ptr))
        if code != _capi.OK:
            raise error_for(code, "aj_ctx_create failed")
        self.ptr = ptr
        self.lock = threading.RLock()

    def check(self, code):
        """Raises for a failing status (call with lock held)."""
        if code != _capi.OK:
            raise error_for(code, _lib.aj_last_error(self.ptr).decode(errors="replace"))

    def __del__(self):
        if getattr(self, "ptr", None) and _lib is not None:
            _lib.aj_ctx_destroy(self.ptr)


_ctx = _Context()


class Op:
    """A parsed, verified op (aj_op); owns its handle."""

    def __init__(self, spec, name="<spec>"):
        text = spec.encode() if isinstance(spec, str) else bytes(spec)
        ptr = ctypes.c_void_p()
        with _ctx.lock:
            _ctx.check(_lib.aj_op_parse(_ctx.ptr, text, len(text), name.encode(),
                                        ctypes.byref(ptr)))
        self.ptr = ptr

    def text(self):
        out = ctypes.c_void_p()
        with _ctx.lock:
            _ctx.check(_lib.aj_op_print(self.ptr, ctypes.byref(out)))
        try:
            return ctypes.string_at(out).decode()
        finally:
            _lib.aj_free(out)

    def hash(self):
        buf = (ctypes.c_char * 17)()
        with _ctx.lock:
            _ctx.check(_lib.aj_op_hash(self.ptr, buf))
        return buf.value.decode()

    def __del__(self):
        if getattr(self, "ptr", None):
            _lib.aj_op_destroy(self.ptr)


def _target(name):
    out = ctypes.c_int()
    with _ctx.lock:
        _ctx.check(_lib.aj_target_from_name(_ctx.ptr, str(name).encode(), ctypes.byref(out)))
    return out.value


# ---------------------------------------------------------------- compile

_STAGE_PLANS = ("every", "split", "fused", "unused")   # aj_stage_plan


def _schedule_dict(s):
    return {"block_m": s.block_m, "block_n": s.block_n, "warps": s.warps, "stages": s.stages}


class Kernel:
    """A compiled kernel (aj_kernel): .code (PTX or LLVM IR text; bytes for
    bitcode), .emit, .target, .entry, .stages (each stage's launch contract:
    block, grid, dynamic_smem, params, schedule) and .schedule."""

    def __init__(self, ptr, op):
        self.ptr = ptr
        self.op = op
        size = ctypes.c_size_t()
        code = _lib.aj_kernel_code(ptr, ctypes.byref(size))
        self.emit = _capi.EMIT_NAMES[_lib.aj_kernel_emit(ptr)]
        raw = ctypes.string_at(code, size.value)
        self.code = raw if self.emit == "bitcode" else raw.decode()
        self.target = _capi.TARGET_NAMES[_lib.aj_kernel_target(ptr)]
        self.stages = [self._stage(i) for i in range(_lib.aj_kernel_num_stages(ptr))]
        self.entry = self.stages[0]["entry"]
        self.schedule = self.stages[0]["schedule"]

    def _stage(self, i):
        info = _capi.LaunchInfo()
        with _ctx.lock:
            _ctx.check(_lib.aj_kernel_stage_info(self.ptr, i, ctypes.byref(info)))
        return {
            "entry": _lib.aj_kernel_stage_entry(self.ptr, i).decode(),
            "block": tuple(info.block),
            "grid": tuple((_lib.aj_extent_name(g.extent).decode(), g.per_block)
                         for g in info.grid),
            "dynamic_smem": info.dynamic_smem,
            "params": [(info.params[j].name.decode(), _capi.PARAM_TYPE_NAMES[info.params[j].type])
                       for j in range(info.num_params)],
            "schedule": _schedule_dict(info.schedule),
            # which launches run it: "every", or one of a backward's two
            # plans, "split" or "fused" (docs/cpu.md "The backward"); "unused"
            "plan": _STAGE_PLANS[_lib.aj_kernel_stage_plan(self.ptr, i)],
        }

    def __repr__(self):
        return "<attnjit.Kernel %s for %s, %s, schedule %s>" % (self.entry, self.target,
                                                                 self.emit, self.schedule)

    def __del__(self):
        if getattr(self, "ptr", None):
            _lib.aj_kernel_destroy(self.ptr)


def _as_op(spec):
    return spec if isinstance(spec, Op) else Op(spec)


def check(spec):
    """Parses and verifies `spec` (IR text, docs/ir.md); returns its canonical
    text or raises attnjit.ParseError / VerifyError with line:column."""
    return _as_op(spec).text()


def compile(spec, target="cpu", emit="auto", opt_level=2, bypass_cache=False):  # noqa: A001
    """Compiles `spec` for `target` ("sm_80", "sm_90", "sm_90a", "sim", "cpu");
    emit is "auto" (the target's own form), "ptx", "llvm_ir" or "bitcode"."""
    op = _as_op(spec)
    opts = _capi.CompileOptions(struct_size=ctypes.sizeof(_capi.CompileOptions),
                                target=_target(target), emit=_capi.EMIT_NAMES.index(emit),
                                opt_level=opt_level, bypass_cache=bypass_cache)
    ptr = ctypes.c_void_p()
    with _ctx.lock:
        _ctx.check(_lib.aj_compile(_ctx.ptr, op.ptr, ctypes.byref(opts), ctypes.byref(ptr)))
    return Kernel(ptr, op)


# ---------------------------------------------------------------- devices and tuning

_devices = {}


def device(kind="cpu", index=0):
    """The process's aj_device of a kind ("cpu", "sim", "cuda"), opened once."""
    key = (kind, index)
    dev = _devices.get(key)
    if dev is None:
        kinds = {"sim": _capi.DEVICE_SIM, "cuda": _capi.DEVICE_CUDA, "cpu": _capi.DEVICE_CPU}
        if kind not in kinds:
            raise InvalidArgError(1, "device kind %r is not one of %s" % (kind, sorted(kinds)))
        dev = ctypes.c_void_p()
        with _ctx.lock:
            _ctx.check(_lib.aj_device_open(_ctx.ptr, kinds[kind], index, ctypes.byref(dev)))
        dev = _devices.setdefault(key, dev)
    return dev


def set_cpu_threads(kind):
    """Whose threads run the cpu device's launches (aj_device_set_cpu_threads,
    docs/cpu.md "Whose threads"): "pool", attnjit's own (the default), or
    "openmp", the OpenMP runtime the process has loaded (PyTorch's: an
    UnsupportedError where none is)."""
    kinds = {"pool": _capi.CPU_THREADS_POOL, "openmp": _capi.CPU_THREADS_OPENMP}
    if kind not in kinds:
        raise InvalidArgError(1, "cpu threads %r is not one of %s" % (kind, sorted(kinds)))
    dev = device("cpu")
    with _ctx.lock:
        _ctx.check(_lib.aj_device_set_cpu_threads(dev, kinds[kind]))


def tune(spec, device_kind="cpu", *, batch=0, heads_q=0, heads_kv=0, seq_q=0, seq_k=0,
         budget_s=0.0, warmup=0, repeats=0, persist=True, wgmma=False):
    """Tunes spec's schedule on a device (aj_tune); returns the candidates,
    timed ones first, fastest first, as dicts.  With persist, a later
    compile for that device picks the best.  wgmma=True: the Hopper
    kernels among a flash op's candidates where the device runs them (a
    9.0 GPU, sim); each dict's "warpgroups" and "producer" say which
    kernel it is (0: mma.sync)."""
    if not isinstance(wgmma, bool):
        raise InvalidArgError(1, "tune: wgmma = %r; want True or False" % (wgmma,))
    op = _as_op(spec)
    dev = device(device_kind)
    opts = _capi.TuneOptions(struct_size=ctypes.sizeof(_capi.TuneOptions), batch=batch,
                             heads_q=heads_q, heads_kv=heads_kv, seq_q=seq_q, seq_k=seq_k,
                             budget_s=budget_s, warmup=warmup, repeats=repeats,
                             no_persist=not persist, wgmma=int(wgmma))
    results = ctypes.POINTER(_capi.TuneResult)()
    count = _capi.i32()
    with _ctx.lock:
        _ctx.check(_lib.aj_tune(_ctx.ptr, dev, op.ptr, ctypes.byref(opts), ctypes.byref(results),
                                ctypes.byref(count)))
    try:
        return [{"schedule": _schedule_dict(r.schedule), "requested": _schedule_dict(r.requested),
                 "workers": r.workers, "timed": r.timed,
                 "status": _capi.STATUS_NAMES[r.status], "message": r.message.decode(),
                 "median_ms": r.median_ms if r.timed else None,
                 "min_ms": r.min_ms if r.timed else None, "is_default": r.is_default,
                 "warpgroups": r.warpgroups, "producer": r.producer}
                for r in (results[i] for i in range(count.value))]
    finally:
        _lib.aj_free(ctypes.cast(results, ctypes.c_void_p))


def llvm_version():
    return _lib.aj_llvm_version().decode()


def cpu_describe():
    """What the cpu device's kernels are compiled for on this host, as
    `attnjit info` prints it (aj_cpu_describe): the CPU features from
    CPUID and, per choice (vector width, bf16 and f16 products, AMX tiles),
    the path taken and why -- a dict of its lines, {"features": ..., "vectors":
    ..., "bf16": ..., "f16": ..., "AMX bf16": ..., "AMX f16": ...}.  Read at
    each call, so AJ_CPU_ISA and AJ_CPU_AMX set since count."""
    n = _lib.aj_cpu_describe(None, 0)
    buf = ctypes.create_string_buffer(n + 1)
    _lib.aj_cpu_describe(buf, n + 1)
    lines = {}
    for line in buf.value.decode().splitlines():
        # "name  value": the name is the first 11 columns
        lines[line[:11].strip()] = line[11:].strip()
    return lines
