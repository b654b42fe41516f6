"""attnjit.jax.attention (the XLA FFI handler of bindings/jax) against the
float64 reference of tests/python/reference.py: one generator crosses the
dtypes with the masks (none, causal top_left and bottom_right with Sk !=
Sq, a window, an expression over b, h, q, k), softcap with an explicit
scale, both variants, GQA 4:2 and D != Dv, forward (o, lse) and jax.grad
(dq, dk, dv) under jax.jit; jax.vmap over a leading axis against a loop;
calls from several threads at once (XLA runs custom calls concurrently);
and the refusals.  jax is installed by the README's test command, which
also builds libattnjit_jax and sets AJ_REQUIRE_JAX."""
import os
import threading

import pytest

jax = pytest.importorskip("jax")
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402

import attnjit  # noqa: E402
import reference  # noqa: E402

try:
    import attnjit.jax as aj
    aj._library()
except attnjit.UnsupportedError as e:          # the handler library was not built
    if os.environ.get("AJ_REQUIRE_JAX"):
        raise
    pytest.skip(str(e), allow_module_level=True)

DTYPES = {"float32": (jnp.float32, torch.float32), "bfloat16": (jnp.bfloat16, torch.bfloat16),
          "float16": (jnp.float16, torch.float16)}
MASKS = {  # name: (attnjit.jax options, reference.visible options, Sq, Sk)
    "none": ({}, {}, 37, 45),
    "causal": ({"causal": True}, {"causal": True}, 45, 45),
    "causal_bottom_right": ({"causal": "bottom_right"}, {"causal": "bottom_right"}, 29, 45),
    "window": ({"window": (7, 3)}, {"window": (7, 3)}, 40, 40),
    "expr": ({"mask": "(k + b) % 3 != 0 && (h < 2 || k <= q)"},
             {"mask": lambda b, h, q, k, sq, sk: ((k + b) % 3 != 0) & ((h < 2) | (k <= q))},
             33, 41),
}


def cases():
    """Every dtype with every mask; softcap and an explicit scale, and the
    efficient variant, on every other case."""
    for i, (dname, mname) in enumerate((d, m) for d in DTYPES for m in MASKS):
        yield pytest.param(dname, mname, i % 2 == 1, id="%s-%s%s" % (dname, mname,
                                                                   "-softcap" if i % 2 else ""))


def _inputs(Sq, Sk, dtype, seed=0):
    q, k, v, do = reference.inputs(2, 4, 2, Sq, Sk, 32, torch.float64, seed)
    v, do = v[..., :16], do[..., :16]               # D 32, Dv 16
    return [t.to(dtype) for t in (q, k, v, do)]


def _jnp(t, dtype):
    return jnp.asarray(t.float().numpy()).astype(dtype)


@pytest.mark.parametrize("dname,mname,soft", list(cases()))
def test_against_the_reference(dname, mname, soft):
    jdt, tdt = DTYPES[dname]
    opts, vis, Sq, Sk = MASKS[mname]
    extra = dict(softcap=15.0, scale=0.2, variant="efficient") if soft else {}
    q, k, v, do = _inputs(Sq, Sk, tdt)
    jq, jk, jv, jdo = (_jnp(t, jdt) for t in (q, k, v, do))

    def loss(q, k, v):
        o = aj.attention(q, k, v, **opts, **extra)
        return (o.astype(jnp.float32) * jdo.astype(jnp.float32)).sum()

    o, lse = jax.jit(lambda q, k, v: aj.attention(q, k, v, return_lse=True, **opts,
                                                  **extra))(jq, jk, jv)
    dq, dk, dv = jax.jit(jax.grad(loss, argnums=(0, 1, 2)))(jq, jk, jv)
    leaves = [t.double().requires_grad_() for t in (q, k, v)]
    ro, rlse = reference.attention(*leaves, seen=reference.visible(2, 4, Sq, Sk, **vis),
                                   scale=extra.get("scale"), softcap=extra.get("softcap"))
    ro.backward(do.double())
    as_torch = lambda x: torch.tensor(np.asarray(x.astype(jnp.float32))).to(tdt)  # noqa: E731
    reference.check("o", as_torch(o), ro, tdt)
    seen = torch.isfinite(rlse)
    got_lse = torch.tensor(np.asarray(lse))
    assert torch.equal(torch.isfinite(got_lse), seen)
    reference.check("lse", got_lse[seen], rlse[seen],
                    torch.float32 if tdt == torch.float32 else torch.float16)
    for name, got, want in (("dq", dq, leaves[0]), ("dk", dk, leaves[1]), ("dv", dv, leaves[2])):
        reference.check(name, as_torch(got), want.grad, tdt)


def test_vmap_equals_a_loop():
    q, k, v, _ = _inputs(24, 24, torch.float32)
    stack = lambda t: jnp.stack([_jnp(t, jnp.float32) * (i + 1) for i in range(3)])  # noqa: E731
    jq, jk, jv = stack(q), stack(k), stack(v)
    f = lambda q, k, v: aj.attention(q, k, v, causal=True)  # noqa: E731
    got = jax.jit(jax.vmap(f))(jq, jk, jv)
    want = jnp.stack([f(jq[i], jk[i], jv[i]) for i in range(3)])
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-6, atol=1e-6)
    g = jax.vmap(jax.grad(lambda q, k, v: f(q, k, v).sum()))(jq, jk, jv)
    assert g.shape == jq.shape and bool(jnp.isfinite(g).all())


def test_calls_from_several_threads():
    """XLA (and users' threads) call the handler concurrently: every call
    returns its own problem's result."""
    q, k, v, _ = _inputs(64, 64, torch.float32)
    f = jax.jit(lambda q, k, v: aj.attention(q, k, v, causal=True))
    inputs = [[_jnp(t, jnp.float32) * (1 + 0.1 * i) for t in (q, k, v)] for i in range(4)]
    want = [np.asarray(f(*x)) for x in inputs]
    got, errors = [None] * 4, []

    def run(i):
        try:
            for _ in range(10):
                got[i] = np.asarray(f(*inputs[i]))
        except Exception as e:        # noqa: BLE001 -- reported below
            errors.append(e)
    threads = [threading.Thread(target=run, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not errors and not any(t.is_alive() for t in threads), errors
    for g, w in zip(got, want):
        np.testing.assert_array_equal(g, w)


def test_refusals():
    q = jnp.zeros((1, 2, 8, 16), jnp.float32)
    with pytest.raises(attnjit.InvalidArgError, match="causal = 'x'; want False, True"):
        aj.attention(q, q, q, causal="x")
    with pytest.raises(attnjit.InvalidArgError, match="must have q's dtype float32"):
        aj.attention(q, q.astype(jnp.bfloat16), q)
    with pytest.raises(attnjit.InvalidArgError, match="rank of at least 4"):
        aj.attention(q[0], q[0], q[0])
    with pytest.raises(attnjit.ParseError):
        aj.attention(q, q, q, mask="k <=")
    n = jnp.zeros((1, 2, 8, 16), jnp.int32)
    with pytest.raises(attnjit.InvalidArgError, match="float32, float16 and bfloat16"):
        aj.attention(n, n, n)
    old = os.environ.get("AJ_JAX_LIBRARY")
    os.environ["AJ_JAX_LIBRARY"] = "/nonexistent/libattnjit_jax.so"
    try:
        with pytest.raises(attnjit.UnsupportedError, match="no FFI handler library"):
            aj._library()
    finally:
        if old is None:
            del os.environ["AJ_JAX_LIBRARY"]
        else:
            os.environ["AJ_JAX_LIBRARY"] = old
