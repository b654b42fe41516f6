"""What the context-parallel tests (ring and Ulysses over torch.distributed)
assert of one rank: its shards of o, lse and the gradients equal the same
shards of one rank's attention over the whole sequence."""
import torch

import attnjit.torch as at

TOL = {torch.float32: 2e-5, torch.bfloat16: 2e-2}   # o; gradients get twice it


def assert_shards_match(ro, rlse, parts, o, lse, leaves, rank, world, layout, dtype, what):
    """ro, rlse and parts' gradients (this rank's shards, dim 2) against the
    whole o, lse and leaves' gradients."""
    tol = TOL[dtype]

    def shard(t):
        return at.shard(t, 2, rank, world, layout)

    torch.testing.assert_close(ro, shard(o), atol=tol, rtol=tol,
                               msg=lambda m: what + ": o: " + m)
    torch.testing.assert_close(rlse, shard(lse), atol=1e-4, rtol=1e-4,
                               msg=lambda m: what + ": lse: " + m)
    for name, part, whole in zip(("dq", "dk", "dv"), parts, leaves):
        torch.testing.assert_close(part.grad, shard(whole.grad), atol=2 * tol, rtol=2 * tol,
                                   msg=lambda m, n=name: "%s: %s: %s" % (what, n, m))
