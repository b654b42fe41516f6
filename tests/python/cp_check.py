"""What the context-parallel tests (ring and Ulysses over torch.distributed)
assert of one rank: its shards of o, lse and the gradients equal the same
shards of one rank's attention over the whole sequence."""
import contextlib
import datetime

import torch
import torch.distributed as dist

import attnjit.torch as at

TOL = {torch.float32: 2e-5, torch.bfloat16: 2e-2}   # o; gradients get twice it


def assert_shards_match(ro, rlse, parts, o, lse, leaves, rank, world, layout, dtype, what,
                        cu=None, method="ring"):
    """ro, rlse and parts' gradients (this rank's shards, dim 2; packed
    documents with offsets cu: this rank's pieces by `method`, dim 0 and
    lse's dim 1) against the whole o, lse and leaves' gradients."""
    tol = TOL[dtype]

    def shard(t, lse=False):
        if cu is None:
            return at.shard(t, 2, rank, world, layout)
        return at.shard_varlen(t, cu, rank, world, layout, method, dim=1 if lse else 0)

    torch.testing.assert_close(ro, shard(o), atol=tol, rtol=tol,
                               msg=lambda m: what + ": o: " + m)
    torch.testing.assert_close(rlse, shard(lse, True), atol=1e-4, rtol=1e-4,
                               msg=lambda m: what + ": lse: " + m)
    for name, part, whole in zip(("dq", "dk", "dv"), parts, leaves):
        torch.testing.assert_close(part.grad, shard(whole.grad), atol=2 * tol, rtol=2 * tol,
                                   msg=lambda m, n=name: "%s: %s: %s" % (what, n, m))


@contextlib.contextmanager
def gloo_group(rank, world, init_file):
    """A gloo process group for one worker of a test, torn down so that no
    rank closes its connections while a peer's gloo thread still finishes
    the last exchange (which aborts that peer: "terminate called without an
    active exception"): after the body, a gloo barrier, then every rank
    waits at a rendezvous through a file store of its own (no gloo
    connection) until all have left the barrier; only then is the group
    destroyed.  A body that raises skips both (its peers fail or time
    out anyway)."""
    dist.init_process_group("gloo", init_method="file://" + init_file, rank=rank,
                            world_size=world)
    try:
        yield
        dist.barrier()
        done = dist.FileStore(init_file + ".done", world)
        done.set("left the barrier %d" % rank, "1")
        done.wait(["left the barrier %d" % r for r in range(world)],
                  datetime.timedelta(seconds=120))
    finally:
        dist.destroy_process_group()


def check_replicated_grad(rank, world, init_file, cases, replicated, name, tol=1e-5):
    """A context-parallel worker's body: in a gloo group, for each (method,
    layout, rotate, mask options) of cases, one rank's attention and
    ring_attention over the shards, each with a fresh copy of a replicated
    tensor (replicated() gives the leaf and attention's options that carry
    it); asserts the shards (assert_shards_match) and that every rank holds
    the whole gradient of the tensor (`name` in messages), within tol."""
    import reference
    with gloo_group(rank, world, init_file):
        for method, layout, rotate, opts in cases:
            q, k, v, do = reference.inputs(2, 4, 2, 16, 16, 16, torch.float32, 11)
            leaves = [t.clone().requires_grad_() for t in (q, k, v)]
            t, extra = replicated()
            o, lse = at.attention(*leaves, return_lse=True, **extra, **opts)
            o.backward(do)
            parts = [at.shard(x, 2, rank, world, layout).requires_grad_() for x in (q, k, v)]
            rt, rextra = replicated()
            ro, rlse = at.ring_attention(*parts, layout=layout, method=method, return_lse=True,
                                         timeout=60, **(dict(rotate=rotate) if rotate else {}),
                                         **rextra, **opts)
            ro.backward(at.shard(do, 2, rank, world, layout))
            what = "%s %s %s rank %d/%d" % (method, layout, sorted(opts), rank, world)
            assert_shards_match(ro, rlse, parts, o, lse, leaves, rank, world, layout,
                                torch.float32, what)
            torch.testing.assert_close(rt.grad, t.grad, atol=tol, rtol=tol,
                                       msg=lambda m: "%s: %s: %s" % (what, name, m))
