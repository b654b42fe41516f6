"""torch.compile(fullgraph=True) traces attnjit's custom ops (fake
implementations, autograd) without graph breaks, and the compiled model
computes what eager does, forward and backward."""
import pytest

torch = pytest.importorskip("torch")
import attnjit.torch as at  # noqa: E402
from torch import nn  # noqa: E402


class Block(nn.Module):
    """A pre-norm transformer block with grouped-query attention."""

    def __init__(self, dim=64, heads=4, kv_heads=2, **attn_opts):
        super().__init__()
        self.heads, self.kv_heads, self.hd = heads, kv_heads, dim // heads
        self.norm1, self.norm2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.qkv = nn.Linear(dim, (heads + 2 * kv_heads) * self.hd)
        self.proj = nn.Linear(heads * self.hd, dim)
        self.mlp = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim))
        self.attn_opts = attn_opts

    def forward(self, x, **extra):
        B, S, _ = x.shape
        q, k, v = self.qkv(self.norm1(x)).split(
            [self.heads * self.hd, self.kv_heads * self.hd, self.kv_heads * self.hd], dim=-1)
        # (B, S, H, D) seen as (B, H, S, D): strided views, no copies
        q = q.view(B, S, self.heads, self.hd).transpose(1, 2)
        k = k.view(B, S, self.kv_heads, self.hd).transpose(1, 2)
        v = v.view(B, S, self.kv_heads, self.hd).transpose(1, 2)
        o = at.attention(q, k, v, **self.attn_opts, **extra)
        x = x + self.proj(o.transpose(1, 2).reshape(B, S, -1))
        return x + self.mlp(self.norm2(x))


def eager_and_compiled(block, x, backend, **extra):
    results = []
    for fn in (block, torch.compile(block, fullgraph=True, backend=backend)):
        block.zero_grad()
        xi = x.clone().requires_grad_()
        y = fn(xi, **extra)
        y.square().mean().backward()
        results.append((y.detach(), xi.grad, [p.grad.clone() for p in block.parameters()]))
    return results


def assert_same(eager, compiled):
    (y0, gx0, gp0), (y1, gx1, gp1) = eager, compiled
    assert torch.allclose(y0, y1, atol=1e-5, rtol=1e-5)
    assert torch.allclose(gx0, gx1, atol=1e-5, rtol=1e-5)
    for a, b in zip(gp0, gp1):
        assert torch.allclose(a, b, atol=1e-5, rtol=1e-5)


def test_transformer_block_inductor_equals_eager():
    torch.manual_seed(0)
    torch._dynamo.reset()
    block = Block(causal=True, softcap=20.0)
    x = torch.randn(2, 40, 64)
    assert_same(*eager_and_compiled(block, x, "inductor"))


def test_expression_mask_with_side_tensor_traces():
    torch.manual_seed(1)
    torch._dynamo.reset()
    block = Block(mask="doc[b, q] == doc[b, k] && k <= q")
    x = torch.randn(2, 24, 64)
    doc = torch.tensor([[0] * 10 + [1] * 14, [0] * 3 + [1] * 21], dtype=torch.int32)
    assert_same(*eager_and_compiled(block, x, "aot_eager", tensors={"doc": doc}))


def test_bias_gradient_traces():
    torch.manual_seed(2)
    torch._dynamo.reset()
    block = Block()
    bias = torch.randn(24, 24) * 0.1
    x = torch.randn(2, 24, 64)
    assert_same(*eager_and_compiled(block, x, "aot_eager", bias=bias))
