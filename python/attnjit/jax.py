"""attnjit for JAX on the CPU (docs/jax.md): attention as an XLA FFI custom
call, with a custom VJP, under jax.jit, jax.grad and jax.vmap.

    attnjit.jax.attention(q, k, v, *, causal=False, window=None, softcap=None,
                          scale=None, mask=None, score_mod=None, variant=None,
                          return_lse=False)

q (..., Hq, Sq, D), k (..., Hkv, Sk, D), v (..., Hkv, Sk, Dv) in float32,
float16 or bfloat16 (leading dims: the batch, and any vmapped axes);
returns o (..., Hq, Sq, Dv) and with return_lse lse (..., Hq, Sq), float32
(no gradient flows through lse).  The options mean what they mean in
attnjit.torch.attention (one mapping: attnjit._options); mask and
score_mod are IR expressions over b, h, q, k, sq, sk (and score) without
side tensors.

The handler lives in libattnjit_jax.so (bindings/jax), beside libattnjit:
$AJ_JAX_LIBRARY, else the file next to the loaded libattnjit.  It compiles
each op once per process and launches it on attnjit's cpu device; XLA may
call it from several threads at once.
"""
import ctypes
import functools
import os

import jax
import jax.numpy as jnp

import attnjit
from attnjit import _capi
from attnjit._options import _body, _spec

_TARGET = "attnjit_attention"
_IR_DTYPE = {jnp.dtype(jnp.float32): "f32", jnp.dtype(jnp.float16): "f16",
             jnp.dtype(jnp.bfloat16): "bf16"}
_registered = False


def _fail(message):
    return attnjit.InvalidArgError(1, "attnjit.jax.attention: " + message)


def _library():
    path = os.environ.get("AJ_JAX_LIBRARY") or os.path.join(
        os.path.dirname(os.path.abspath(_capi.__file__)), "libattnjit_jax.so")
    if not os.path.exists(path):
        raise attnjit.UnsupportedError(
            4, "attnjit.jax: no FFI handler library at %s: build it with CMake "
               "(-DAJ_JAX_FFI_INCLUDE=<jax.ffi.include_dir()>, target attnjit_jax) and set "
               "AJ_JAX_LIBRARY to the libattnjit_jax.so it makes (docs/jax.md)" % path)
    return ctypes.CDLL(path)


def _register():
    """Registers the handler with XLA once (after libattnjit is loaded, so
    the handler binds to the same library)."""
    global _registered
    if not _registered:
        lib = _library()
        jax.ffi.register_ffi_target(_TARGET, jax.ffi.pycapsule(lib.aj_jax_attention),
                                    platform="cpu")
        _registered = True


@functools.lru_cache(maxsize=1024)
def _verify(variant, body):
    """Bad options raise here, with the op's line:column, not inside XLA."""
    for kind in ("forward", "backward"):
        attnjit.check(_spec(kind, variant, body))


def _call(spec, args, results):
    return jax.ffi.ffi_call(_TARGET, results, vmap_method="broadcast_all")(*args, spec=spec)


def _forward(q, k, v, variant, body):
    o = jax.ShapeDtypeStruct(q.shape[:-1] + (v.shape[-1],), q.dtype)
    lse = jax.ShapeDtypeStruct(q.shape[:-1], jnp.float32)
    return _call(_spec("forward", variant, body), (q, k, v), (o, lse))


@functools.partial(jax.custom_vjp, nondiff_argnums=(3, 4))
def _attention(q, k, v, variant, body):
    return tuple(_forward(q, k, v, variant, body))


def _attention_fwd(q, k, v, variant, body):
    o, lse = _forward(q, k, v, variant, body)
    return (o, lse), (q, k, v, o, lse)


def _attention_bwd(variant, body, saved, grads):
    q, k, v, o, lse = saved
    do = grads[0].astype(q.dtype)
    results = tuple(jax.ShapeDtypeStruct(t.shape, t.dtype) for t in (q, k, v))
    return tuple(_call(_spec("backward", variant, body), (do, q, k, v, o, lse), results))


_attention.defvjp(_attention_fwd, _attention_bwd)


def attention(q, k, v, *, causal=False, window=None, softcap=None, scale=None, mask=None,
              score_mod=None, variant=None, return_lse=False):
    """Attention over q, k, v (see the module's text); differentiable in
    q, k and v."""
    q, k, v = jnp.asarray(q), jnp.asarray(k), jnp.asarray(v)
    if q.ndim < 4 or k.ndim != q.ndim or v.ndim != q.ndim:
        raise _fail("q, k and v must have one rank of at least 4 (..., H, S, D); got %d, %d "
                    "and %d dims" % (q.ndim, k.ndim, v.ndim))
    if q.dtype not in _IR_DTYPE:
        raise _fail("q.dtype = %s; attnjit computes in float32, float16 and bfloat16"
                    % q.dtype)
    if k.dtype != q.dtype or v.dtype != q.dtype:
        raise _fail("k (%s) and v (%s) must have q's dtype %s" % (k.dtype, v.dtype, q.dtype))
    if q.shape[:-3] != k.shape[:-3] or k.shape[:-1] != v.shape[:-1]:
        raise _fail("q %s, k %s and v %s disagree on their leading dims or k and v on heads "
                    "and length" % (q.shape, k.shape, v.shape))
    variant = variant or "flash"
    if variant not in ("flash", "efficient"):
        raise _fail("variant = %r; want 'flash' or 'efficient'" % (variant,))
    body = _body(_IR_DTYPE[q.dtype], q.shape[-1], v.shape[-1], causal, window, softcap,
                 False, False, scale, 0.0, mask, score_mod, [], who="attnjit.jax.attention")
    _verify(variant, body)
    _register()
    o, lse = _attention(q, k, v, variant, body)
    return (o, lse) if return_lse else o
