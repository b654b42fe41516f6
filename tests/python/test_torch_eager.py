"""Eager calls (docs/python.md "Eager calls"): attention() and
attention_varlen() on plain tensors run the custom ops' implementations
without their dispatch, and give the same bits as the custom ops, which
every other context still goes through (a dispatch mode sees
attnjit::attention_fwd and _bwd; torch.compile is test_torch_compile's).
Each case runs both ways with the same inputs and dropout seed: o, lse and
every gradient (q, k, v, bias, sinks, a grad side tensor) bit for bit."""
import pytest

torch = pytest.importorskip("torch")
import attnjit.torch as at  # noqa: E402
from torch.utils._python_dispatch import TorchDispatchMode  # noqa: E402


class Ops(TorchDispatchMode):
    """Records the ops dispatched under it (the path a call took)."""

    def __init__(self):
        super().__init__()
        self.names = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.names.append(str(func.overloadpacket))
        return func(*args, **(kwargs or {}))


def leaf(shape, seed, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(shape, generator=g).to(dtype).requires_grad_()


def padded_case(name):
    """(inputs that need gradients, a call of attention over them)."""
    q, k, v = leaf((2, 4, 37, 32), 1), leaf((2, 2, 37, 32), 2), leaf((2, 2, 37, 32), 3)
    if name == "causal":
        return [q, k, v], lambda: at.attention(q, k, v, causal=True, return_lse=True)
    if name == "bias":
        bias = leaf((1, 4, 37, 37), 4)
        return [q, k, v, bias], lambda: at.attention(q, k, v, bias=bias, return_lse=True)
    if name == "sinks_side_grad":
        sinks, rel = leaf((4,), 5), leaf((64,), 6)
        return [q, k, v, sinks, rel], lambda: at.attention(
            q, k, v, causal=True, sinks=sinks, score_mod="score + rel[q - k]",
            tensors={"rel": rel}, return_lse=True)
    if name == "dropout":
        def call():
            torch.manual_seed(7)
            return at.attention(q, k, v, dropout_p=0.25, return_lse=True)
        return [q, k, v], call
    if name == "bf16":
        q, k, v = (leaf(t.shape, i, torch.bfloat16) for i, t in enumerate((q, k, v)))
        return [q, k, v], lambda: at.attention(q, k, v, causal="bottom_right", return_lse=True)
    raise ValueError(name)


def varlen_case(name):
    cu = torch.tensor([0, 5, 5, 30], dtype=torch.int32)
    q, k, v = leaf((30, 4, 64), 1), leaf((30, 2, 64), 2), leaf((30, 2, 64), 3)
    if name == "varlen":
        return [q, k, v], lambda: at.attention_varlen(q, k, v, cu, cu, 25, 25, causal=True,
                                                      return_lse=True)
    sinks = leaf((4,), 5)
    return [q, k, v, sinks], lambda: at.attention_varlen(q, k, v, cu, cu, 25, 25, sinks=sinks,
                                                         window=(3, 3), return_lse=True)


CASES = ["causal", "bias", "sinks_side_grad", "dropout", "bf16", "varlen", "varlen_sinks"]


def run(case, mode):
    """o, lse and the gradients of the case's inputs, computed under `mode`
    (None: plain eager), and the names of the ops a dispatch mode saw."""
    inputs, call = (varlen_case if case.startswith("varlen") else padded_case)(case)
    ops = Ops() if mode == "dispatch" else None
    if ops:
        with ops:
            o, lse = call()
            grad_fn = o.grad_fn
            o.backward(torch.ones_like(o))
    else:
        o, lse = call()
        grad_fn = o.grad_fn
        o.backward(torch.ones_like(o))
    grads = [t.grad.clone() for t in inputs]
    return o.detach(), lse.detach(), grads, grad_fn, ops.names if ops else []


@pytest.mark.parametrize("case", CASES)
def test_eager_same_bits_as_the_custom_op(case):
    o, lse, grads, grad_fn, _ = run(case, None)
    assert type(grad_fn).__name__ == "_DirectBackward", \
        "an eager call on plain tensors skips the custom op; got %s" % type(grad_fn).__name__
    o2, lse2, grads2, grad_fn2, names = run(case, "dispatch")
    assert type(grad_fn2).__name__ != "_DirectBackward"
    fwd = "attnjit.attention_varlen_fwd" if case.startswith("varlen") else "attnjit.attention_fwd"
    assert fwd in names and fwd.replace("_fwd", "_bwd") in names, names
    assert torch.equal(o, o2) and torch.equal(lse, lse2)
    for i, (a, b) in enumerate(zip(grads, grads2)):
        assert torch.equal(a, b), "gradient %d of %s differs between the two paths" % (i, case)
    assert all(g.abs().sum() > 0 for g in grads), "every input gets a gradient"


def test_eager_needs_plain_tensors():
    """A tensor subclass goes through the custom op (its own dispatch)."""
    class Sub(torch.Tensor):
        pass

    q = torch.randn(1, 2, 8, 16).as_subclass(Sub)
    k = torch.randn(1, 2, 8, 16)
    from attnjit.torch import _ops
    assert not _ops._eager(q, k)
    assert _ops._eager(torch.randn(2), None)
    assert not _ops._eager(torch.randn(2, device="meta"))


def test_eager_no_grad_and_inference_mode():
    q, k, v = (torch.randn(1, 2, 16, 32) for _ in range(3))
    with torch.no_grad():
        a = at.attention(q, k, v, causal=True)
    with torch.inference_mode():
        b = at.attention(q, k, v, causal=True)
    with Ops():
        c = at.attention(q, k, v, causal=True)
    assert a.grad_fn is None and torch.equal(a, b) and torch.equal(a, c)
