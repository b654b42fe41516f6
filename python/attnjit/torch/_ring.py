"""Ring attention (context parallelism) over torch.distributed: each rank
holds a shard of the sequence; K/V blocks travel to every rank while
attnjit's kernels compute, and partial results merge by log-sum-exp.

    rank r, P ranks, p2p rotation (forward; the backward also sends the
    dK/dV sums along with their block, one more hop brings them home):

    step 0: compute(q_r, kv_r)          send kv_r -> r+1, recv kv_{r-1}
    step 1: compute(q_r, kv_{r-1})      send kv_{r-1} -> r+1, recv kv_{r-2}
    ...                                 (the next block is in flight while
    step P-1: compute(q_r, kv_{r+1})     the current one is computed)

The schedule is the C runtime's (aj_ring_plan, docs/ring.md): which block
each step computes with, and per (query chunk, key chunk) pair whether it
is skipped (nothing visible: no launch), full (the kernel without the
mask) or partial (the masked kernel).  The forward merges every launch
into an f32 O and the LSE with the accumulate mode at the pair's global
offsets and totals (masks, windows, bottom_right, side tensors and
dropout stay exact on every shard), the backward runs with the ring's
global O and LSE.  The chunks of a shard are the C rule's too
(aj_shard_get_chunks).  Python does the exchange only.
"""
import contextlib
import ctypes
import datetime

import torch
import torch.distributed as dist

import attnjit
from attnjit import _capi
from attnjit._capi import lib as _lib

from . import _ops

_RING_PLAN_ARGS_SIZE = ctypes.sizeof(_capi.RingPlanArgs)


def _fail(fn, message):
    return attnjit.InvalidArgError(1, "attnjit.torch.%s: %s" % (fn, message))


def _layout(fn, layout):
    if layout not in _capi.SHARD_LAYOUTS:
        raise _fail(fn, "layout = %r; want 'zigzag' or 'contiguous'" % (layout,))
    return _capi.SHARD_LAYOUTS.index(layout)


def _check(fn, code):
    """Raises the C error of a failing call, named for the Python entry."""
    if code != _capi.OK:
        ctx = attnjit._ctx
        message = _lib.aj_last_error(ctx.ptr).decode(errors="replace")
        raise attnjit.error_for(code, "attnjit.torch.%s: %s" % (fn, message))


def _chunks(fn, layout, rank, world, seq):
    """Rank `rank`'s chunks of a `seq`-long sequence, (global, local, len)
    each: the C rule (aj_shard_get_chunks)."""
    chunks, n = (_capi.ShardChunk * 2)(), ctypes.c_int()
    ctx = attnjit._ctx
    with ctx.lock:
        _check(fn, _lib.aj_shard_get_chunks(ctx.ptr, _layout(fn, layout), rank, world, seq,
                                            chunks, ctypes.byref(n)))
    return [_capi.chunk_tuple(c) for c in chunks[:n.value]]


def shard(x, dim, rank, world_size, layout="zigzag"):
    """Rank `rank`'s shard of the whole tensor x along dim (as aj_shard):
    contiguous: positions [r S/P, (r+1) S/P); zigzag: chunks r and 2P-1-r
    of 2P, which balances causal work."""
    return torch.cat([x.narrow(dim, g, n) for g, _, n in
                      _chunks("shard", layout, rank, world_size, x.shape[dim])], dim)


def unshard(x, dim, rank, world_size, layout="zigzag", out=None):
    """The inverse (as aj_unshard): writes rank `rank`'s shard x into its
    positions of `out` (the whole tensor; zeros of the right shape when
    None) and returns out.  Calling it with every rank's shard (from an
    all_gather) rebuilds the whole tensor."""
    L = x.shape[dim]
    if out is None:
        shape = list(x.shape)
        shape[dim] = L * world_size
        out = x.new_zeros(shape)
    for g, s, n in _chunks("unshard", layout, rank, world_size, L * world_size):
        out.narrow(dim, g, n).copy_(x.narrow(dim, s, n))
    return out


_BLOCK_NAMES = ("skip", "full", "partial")


def _plan(q, variant, body, alibi, side, layout, rotate, rank, world, lk):
    """aj_ring_plan of the forward op `body`: [(src, [pair, ...]) per step]."""
    op = attnjit.Op(_ops._spec("forward", variant, body), "attnjit.torch.ring_attention")
    dev, _ = _ops._device_of(q)
    B, Hq, lq, _ = q.shape
    a = _capi.RingPlanArgs(struct_size=_RING_PLAN_ARGS_SIZE, layout=_layout(
        "ring_attention", layout), rotate=_capi.RING_ROTATES.index(rotate), rank=rank,
        size=world, batch=B, heads_q=Hq, seq_q=lq, seq_k=lk)
    if alibi is not None:
        _ops._put(a.alibi_slopes, alibi)
    side_arr, a.num_side = _ops._bind_side(_ops._side_names(body), side)
    a.side = side_arr
    cap = 4 * world
    pairs, count = (_capi.RingPair * cap)(), _capi.i32()
    ctx = attnjit._ctx
    with ctx.lock:
        _check("ring_attention", _lib.aj_ring_plan(ctx.ptr, dev, op.ptr, ctypes.byref(a),
                                                   pairs, cap, ctypes.byref(count)))
    steps = [(s, []) for s in range(world)]
    for p in pairs[:count.value]:
        if not steps[p.step][1]:
            steps[p.step] = (p.src, steps[p.step][1])
        steps[p.step][1].append({"q": _capi.chunk_tuple(p.q), "k": _capi.chunk_tuple(p.k),
                                 "block": _BLOCK_NAMES[p.block]})
    return steps


@contextlib.contextmanager
def _comm(what, group, timeout):
    """Around posting or waiting for one communication of the ring: a peer
    that died (gloo reports the closed connection) or did not take part
    within `timeout` seconds (None: the process group's own timeout)
    raises CommError naming this rank and the communication.  The group is
    then unusable (as after any failed collective): destroy it and stop."""
    try:
        yield
    except RuntimeError as e:       # torch's DistBackendError is one
        raise attnjit.CommError(
            11, "attnjit.torch.ring_attention: rank %d of %d: %s did not complete%s; a rank "
                "died or stalled (%s); the process group cannot be used again"
                % (dist.get_rank(group), dist.get_world_size(group), what,
                   "" if timeout is None else " within %g s" % timeout,
                   str(e).strip().splitlines()[0][:300])) from e


def _wait(work, what, group, timeout):
    """Waits for one communication (see _comm)."""
    with _comm(what, group, timeout):
        if timeout is None:
            work.wait()
        else:
            work.wait(timeout=datetime.timedelta(seconds=timeout))


def _complete(post, what, group, timeout):
    """Posts one collective (post() returns its async work) and waits for
    it, both under _comm's rule."""
    with _comm(what, group, timeout):
        work = post()
    _wait(work, what, group, timeout)


class _Ring:
    """One ring call's fixed facts: the group, ranks, op, and the C ring's
    schedule for them."""

    def __init__(self, group, layout, rotate, variant, body, alibi, side, rng, q, lk, timeout):
        self.group, self.timeout = group, timeout
        self.world = dist.get_world_size(group)
        self.rank = dist.get_rank(group)
        self.rotate = rotate
        self.variant, self.body = variant, body
        # the steps' op: sinks are counted once, as the accumulator's start
        self.step_body = body.replace("\n  sinks = " + _ops._SINKS, "")
        self.alibi, self.side, self.rng = alibi, side, rng
        self.sq, self.sk = q.shape[2] * self.world, lk * self.world
        self.steps = _plan(q, variant, body, alibi, side, layout, rotate, self.rank,
                           self.world, lk)

    def peer(self, r):
        return dist.get_global_rank(self.group, r % self.world) if self.group else r % self.world

    def launches(self, pairs):
        """(query slice, key slice, positions, masked) of each pair the plan
        does not skip: a full pair runs the kernel without the mask."""
        for p in pairs:
            if p["block"] == "skip":
                continue
            (qg, qs, qn), (kg, ks, kn) = p["q"], p["k"]
            yield (slice(qs, qs + qn), slice(ks, ks + kn),
                   _ops.Positions(qg, kg, self.sq, self.sk), p["block"] == "partial")

    def wait(self, work, what):
        _wait(work, what, self.group, self.timeout)

    def exchange(self, tensors, what):
        """Sends `tensors` to the next rank and receives their like from
        the previous one; returns wait(), which returns the received."""
        recv = [torch.empty_like(t) for t in tensors]
        ops = [dist.P2POp(dist.isend, t, self.peer(self.rank + 1), self.group) for t in tensors]
        ops += [dist.P2POp(dist.irecv, t, self.peer(self.rank - 1), self.group) for t in recv]
        what = "%s (to rank %d, from rank %d)" % (what, self.peer(self.rank + 1),
                                                 self.peer(self.rank - 1))
        with _comm(what, self.group, self.timeout):
            reqs = dist.batch_isend_irecv(ops)

        def wait():
            for r in reqs:
                self.wait(r, what)
            return recv
        return wait

    def blocks(self, k, v):
        """(block owner, its pairs, k, v) for every step of the plan; p2p
        posts the next block's exchange before yielding the current one
        (the plan's src at step s is then rank r-s, whose block has made s
        hops)."""
        if self.rotate == "allgather":
            ks = [torch.empty_like(k) for _ in range(self.world)]
            vs = [torch.empty_like(v) for _ in range(self.world)]
            for whole, part, name in ((ks, k, "K"), (vs, v, "V")):
                _complete(lambda: dist.all_gather(whole, part, group=self.group, async_op=True),
                          "the all-gather of " + name, self.group, self.timeout)
            for src, pairs in self.steps:
                yield src, pairs, ks[src], vs[src]
            return
        for step, (src, pairs) in enumerate(self.steps):
            wait = (self.exchange([k, v], "step %d's exchange of K/V" % step)
                    if step < self.world - 1 else None)
            yield src, pairs, k, v
            if wait:
                k, v = wait()

    def forward(self, q, k, v, sinks=None):
        B, Hq, lq, _ = q.shape
        o_acc = torch.zeros((B, Hq, lq, v.shape[-1]), dtype=torch.float32, device=q.device)
        # the chain starts from the sinks' partial (O = 0, LSE = sink): each
        # row counts its sink once, whatever the steps (docs/ir.md "Sinks")
        lse = (torch.full((B, Hq, lq), float("-inf"), dtype=torch.float32, device=q.device)
               if sinks is None else sinks.detach().view(1, Hq, 1).expand(B, Hq, lq).clone())
        body = self.step_body + "\n  accumulate = true"
        for _, pairs, kb, vb in self.blocks(k, v):
            for qi, ki, at, masked in self.launches(pairs):
                _ops.forward_into(q[:, :, qi], kb[:, :, ki], vb[:, :, ki], None, lse[:, :, qi],
                                  None, self.alibi, self.side, self.rng, self.variant, body,
                                  at=at, o_acc=o_acc[:, :, qi], masked=masked)
        return o_acc.to(q.dtype), lse

    def backward(self, do, q, k, v, o, lse):
        """dq, dk, dv of this rank's shards and this rank's part of each grad
        side tensor's gradient (its rows' terms, summed in step order; the
        ranks' parts are summed by _SumOverRanks), None for the others."""
        dq_acc = torch.zeros(q.shape, dtype=torch.float32, device=q.device)
        grads = _ops._side_grad_flags(self.step_body)
        dside_acc = [torch.zeros(t.shape, dtype=torch.float32, device=q.device) if g else None
                     for t, g in zip(self.side, grads)]
        gathered = self.rotate == "allgather"
        # dK/dV sums: per block (allgather), or the travelling block's (p2p)
        dkv = [[torch.zeros(t.shape, dtype=torch.float32, device=q.device) for t in (k, v)]
               for _ in range(self.world if gathered else 1)]
        for step, (src, pairs, kb, vb) in enumerate(self.blocks(k, v)):
            acc = dkv[src if gathered else 0]
            for qi, ki, at, masked in self.launches(pairs):
                dq = torch.empty_like(q[:, :, qi])
                dk, dv = torch.empty_like(kb[:, :, ki]), torch.empty_like(vb[:, :, ki])
                dside = _ops._dside_like(self.side, self.step_body) if any(grads) else None
                _ops.backward_into(do[:, :, qi], q[:, :, qi], kb[:, :, ki], vb[:, :, ki],
                                   o[:, :, qi], lse[:, :, qi], dq, dk, dv, None, None,
                                   self.alibi, self.side, self.rng, self.variant,
                                   self.step_body, at=at, masked=masked, dside=dside)
                for acc_t, part in zip(dside_acc, dside or ()):
                    if acc_t is not None:
                        acc_t += part
                dq_acc[:, :, qi] += dq
                acc[0][:, :, ki] += dk
                acc[1][:, :, ki] += dv
            if not gathered and self.world > 1:
                # the sums travel with their block
                dkv[0] = self.exchange(acc, "the backward's step %d exchange of dK/dV" % step)()
        if gathered:
            for acc in dkv:
                for t in acc:
                    _complete(lambda: dist.all_reduce(t, group=self.group, async_op=True),
                              "the all-reduce of dK/dV", self.group, self.timeout)
            mine = dkv[self.rank]
        else:
            mine = dkv[0]          # after P hops, this rank's own block's sums
        return dq_acc.to(q.dtype), mine[0].to(k.dtype), mine[1].to(v.dtype), dside_acc


def _sinks_grad(sinks, do, o, lse):
    """This rank's rows' part of the sinks' gradient: -sum over (b, i) of
    exp(sink[h] - lse) dO . O (rows of lse -inf add 0), in a fixed order."""
    delta = (do.float() * o.float()).sum(-1)
    p = torch.exp(sinks.detach().float().view(1, -1, 1) - lse)
    p = torch.where(torch.isinf(lse) & (lse < 0), torch.zeros_like(p), p)
    return -(p * delta).sum((0, 2))


class _RingFunction(torch.autograd.Function):
    """The ring's forward and backward; `side` are the ring's side tensors
    (ring.side), inputs here so that the grad ones get their gradients."""

    @staticmethod
    def forward(ctx, ring, q, k, v, sinks, *side):
        o, lse = ring.forward(q, k, v, sinks)
        ctx.ring = ring
        ctx.save_for_backward(q, k, v, o, lse, sinks)
        ctx.mark_non_differentiable(lse)
        return o, lse

    @staticmethod
    def backward(ctx, do, dlse):
        q, k, v, o, lse, sinks = ctx.saved_tensors
        do = do.contiguous()
        dq, dk, dv, dside = ctx.ring.backward(do, q, k, v, o, lse)
        dsinks = _sinks_grad(sinks, do, o, lse) if sinks is not None else None
        return (None, dq, dk, dv, dsinks) + tuple(dside)


class _SumOverRanks(torch.autograd.Function):
    """Identity forward; the backward sums the ranks' gradients of a
    replicated tensor (the sinks, a grad side tensor) by an all-gather and
    a sum in rank order, so every rank holds the same bits whatever the
    collective's own order."""

    @staticmethod
    def forward(ctx, x, group, timeout):
        ctx.args = (group, timeout)
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        group, timeout = ctx.args
        grad = grad.contiguous()
        parts = [torch.empty_like(grad) for _ in range(dist.get_world_size(group))]
        _complete(lambda: dist.all_gather(parts, grad, group=group, async_op=True),
                  "the all-gather of a replicated tensor's gradient", group, timeout)
        total = parts[0].clone()
        for part in parts[1:]:
            total += part
        return total, None, None


class _AllToAll(torch.autograd.Function):
    """all_to_all_single of x (P, ...) over `group` with equal splits, under
    the ring's fault rule (_comm); its own adjoint, so the backward
    exchanges the gradient the same way."""

    @staticmethod
    def forward(ctx, x, group, timeout, what):
        ctx.args = (group, timeout, what)
        x = x.contiguous()
        out = torch.empty_like(x)
        _complete(lambda: dist.all_to_all_single(out, x, group=group, async_op=True), what,
                  group, timeout)
        return out

    @staticmethod
    def backward(ctx, grad):
        group, timeout, what = ctx.args
        return _AllToAll.apply(grad, group, timeout, what + " (backward)"), None, None, None


class _Ulysses:
    """Ulysses context parallelism (DeepSpeed-Ulysses; the C runtime's
    method, docs/ring.md): an all-to-all turns each rank's sequence shard
    of every head into the whole sequence of H/P heads, attention runs on
    it (the heads' global index in masks, alibi and dropout through
    head_offset), and another all-to-all brings o and lse back."""

    def __init__(self, group, layout, timeout, local_len):
        self.group, self.timeout = group, timeout
        self.world, self.rank = dist.get_world_size(group), dist.get_rank(group)
        seq = local_len * self.world
        # global positions of the ranks' shards, rank after rank, and back
        self.order = torch.cat([torch.arange(g, g + n) for r in range(self.world)
                                for g, _, n in _chunks("ring_attention", layout, r, self.world,
                                                       seq)])
        self.inverse = torch.argsort(self.order)

    def check_heads(self, q, k):
        for name, h in (("q", q.shape[1]), ("k and v", k.shape[1])):
            if h % self.world:
                raise _fail("ring_attention", "method = 'ulysses' splits heads over the %d "
                            "ranks: %s has %d heads, not a multiple of %d"
                            % (self.world, name, h, self.world))

    def to_heads(self, x, what):
        """(B, H, s, D), this rank's shard of every head -> (B, H/P, S, D),
        the whole sequence of this rank's heads, in position order."""
        B, H, s, D = x.shape
        P = self.world
        send = x.reshape(B, P, H // P, s, D).transpose(0, 1)
        got = _AllToAll.apply(send, self.group, self.timeout, "the all-to-all of " + what)
        whole = got.permute(1, 2, 0, 3, 4).reshape(B, H // P, P * s, D)
        return whole[:, :, self.inverse.to(x.device)]

    def to_shards(self, x, what):
        """The inverse of to_heads: (B, H/P, S, D) -> (B, H, s, D)."""
        B, h, S, D = x.shape
        P = self.world
        x = x[:, :, self.order.to(x.device)]
        send = x.reshape(B, h, P, S // P, D).permute(2, 0, 1, 3, 4)
        got = _AllToAll.apply(send, self.group, self.timeout, "the all-to-all of " + what)
        return got.transpose(0, 1).reshape(B, P * h, S // P, D)

    def attention(self, q, k, v, alibi, side, rng, variant, body):
        self.check_heads(q, k)
        if k.shape[2] != q.shape[2]:
            raise _fail("ring_attention", "method = 'ulysses' needs q and k shards of one "
                        "length; got %d and %d" % (q.shape[2], k.shape[2]))
        Hq = q.shape[1]
        qh, kh, vh = (self.to_heads(t, n) for t, n in ((q, "q"), (k, "k"), (v, "v")))
        o, lse = torch.ops.attnjit.attention_fwd(qh, kh, vh, None, alibi, side, rng, variant,
                                                 body, self.rank * Hq // self.world, Hq)
        return (self.to_shards(o, "o"),
                self.to_shards(lse.unsqueeze(-1), "lse").squeeze(-1))


def ring_attention(q, k, v, *, group=None, layout="zigzag", rotate="p2p", causal=False,
                   window=None, softcap=None, alibi_slopes=None, scale=None, dropout_p=0.0,
                   mask=None, score_mod=None, tensors=None, sinks=None, variant=None,
                   return_lse=False, method="ring", timeout=None, oob="check"):
    """attention() over a sequence sharded across the ranks of `group`:
    q, k, v are this rank's shards (shard(x, 2, rank, P, layout)); returns
    this rank's shard of o (and lse).  rotate: "p2p" (K/V to the next rank,
    P-1 exchanges overlapped with compute) or "allgather" (one all-gather;
    the backward all-reduces dK/dV).  Side tensors in `tensors` hold the
    whole sequence (positions are global).  No bias.  method: "ring", or
    "ulysses" (two all-to-alls of q, k, v and of o, lse around one
    attention over the whole sequence of H/P heads: heads and KV heads
    divisible by P, q and k shards of one length; rotate unused); "hybrid"
    is the C API's and the CLI's, over MPI or NCCL.  timeout: seconds each
    exchange may wait, forward and backward (None: the process group's
    own); a rank that dies or stalls makes every other rank raise
    attnjit.CommError, within it.  sinks: (Hq,) learned sink logits, the
    same on every rank, counted once per row; their gradient is the sum
    over the ranks (an all-gather and a sum in rank order), the same on
    every rank, as a grad side tensor's (one in `tensors` that requires
    grad).  oob: as attention()'s, each launch checked at its own
    positions."""
    if method not in ("ring", "ulysses"):
        raise attnjit.UnsupportedError(
            4, "attnjit.torch.ring_attention: method = %r: over torch.distributed attnjit "
               "runs 'ring' and 'ulysses'; hybrid 2-D is aj_ring_forward's (attnjit ring "
               "--method hybrid, over MPI or NCCL)" % (method,))
    if not dist.is_available() or not dist.is_initialized():
        raise _fail("ring_attention", "torch.distributed is not initialised "
                    "(init_process_group first)")
    if rotate not in ("p2p", "allgather"):
        raise _fail("ring_attention", "rotate = %r; want 'p2p' or 'allgather'" % (rotate,))
    q, k, v, _, alibi_slopes, side, rng, variant, body = _ops._prepare(
        q, k, v, causal, window, softcap, alibi_slopes, None, scale, dropout_p, mask,
        score_mod, tensors, variant, sinks=sinks, oob=oob)
    q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
    sinks_t = None
    if sinks is not None:      # the last side tensor (_prepare); its gradient summed
        sinks_t = side[-1] = _SumOverRanks.apply(side[-1], group, timeout)
    # grad side tensors: each rank's rows give a part; the parts summed
    for i, grad in enumerate(_ops._side_grad_flags(body)):
        if grad:
            side[i] = _SumOverRanks.apply(side[i], group, timeout)
    if timeout is not None and not timeout > 0:
        raise _fail("ring_attention", "timeout = %r; want seconds > 0, or None" % (timeout,))
    if rng is not None:       # one dropout stream for the whole sequence
        src = dist.get_global_rank(group, 0) if group else 0
        what = "the broadcast of the dropout stream"
        _complete(lambda: dist.broadcast(rng, src=src, group=group, async_op=True), what,
                  group, timeout)
    if method == "ulysses":
        o, lse = _Ulysses(group, layout, timeout, q.shape[2]).attention(
            q, k, v, alibi_slopes, side, rng, variant, body)
        return (o, lse) if return_lse else o
    ring = _Ring(group, layout, rotate, variant, body, alibi_slopes, side, rng, q, k.shape[2],
                 timeout)
    o, lse = _RingFunction.apply(ring, q, k, v, sinks_t, *side)
    return (o, lse) if return_lse else o


class _ContextParallelMode(torch.overrides.TorchFunctionMode):
    """Runs every scaled_dot_product_attention call as ring attention on
    the shards (is_causal, scale, dropout_p and enable_gqa as SDPA takes
    them)."""

    def __init__(self, group, layout, timeout, method):
        super().__init__()
        self.group, self.layout, self.timeout, self.method = group, layout, timeout, method

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is not torch.nn.functional.scaled_dot_product_attention:
            return func(*args, **kwargs)
        names = ("query", "key", "value", "attn_mask", "dropout_p", "is_causal", "scale",
                 "enable_gqa")
        call = dict(zip(names, args), **kwargs)
        if call.get("attn_mask") is not None:
            raise _fail("context_parallel", "scaled_dot_product_attention's attn_mask cannot "
                        "be sharded; call attnjit.torch.ring_attention with mask= (an IR "
                        "expression over global positions) or bias-free options instead")
        q, k, v = call["query"], call["key"], call["value"]
        if q.shape[1] != k.shape[1] and not call.get("enable_gqa", False):
            raise _fail("context_parallel", "q has %d heads and k %d: pass enable_gqa=True, "
                        "as scaled_dot_product_attention needs" % (q.shape[1], k.shape[1]))
        return ring_attention(q, k, v, group=self.group, layout=self.layout,
                              timeout=self.timeout, method=self.method,
                              causal=bool(call.get("is_causal", False)),
                              scale=call.get("scale"), dropout_p=call.get("dropout_p", 0.0))


class context_parallel:  # noqa: N801 (used as a function, like torch's)
    """with attnjit.torch.context_parallel(buffers=(x, pos), buffer_seq_dims=(1, 0)):
    shards each buffer in place along its sequence dim on entry (this
    rank's part, by `layout`); inside, every
    torch.nn.functional.scaled_dot_product_attention call runs as
    ring_attention over `group`; on exit, restores the buffers not in
    no_restore_buffers.  A model written for one device runs unchanged.
    timeout, method: ring_attention's (seconds each exchange may wait;
    "ring" or "ulysses")."""

    def __init__(self, group=None, buffers=(), buffer_seq_dims=(), no_restore_buffers=(),
                 layout="zigzag", timeout=None, method="ring"):
        if len(buffers) != len(buffer_seq_dims):
            raise _fail("context_parallel", "%d buffers but %d buffer_seq_dims"
                        % (len(buffers), len(buffer_seq_dims)))
        self.group, self.layout, self.timeout, self.method = group, layout, timeout, method
        self.buffers, self.dims = list(buffers), list(buffer_seq_dims)
        self.keep = [not any(b is n for n in no_restore_buffers) for b in self.buffers]
        self.saved = []
        self.mode = None

    def __enter__(self):
        if not dist.is_available() or not dist.is_initialized():
            raise _fail("context_parallel", "torch.distributed is not initialised")
        world, rank = dist.get_world_size(self.group), dist.get_rank(self.group)
        with torch.no_grad():
            for buf, dim, keep in zip(self.buffers, self.dims, self.keep):
                part = shard(buf, dim, rank, world, self.layout)
                self.saved.append(buf.clone() if keep else None)
                buf.resize_(part.shape).copy_(part)
        self.mode = _ContextParallelMode(self.group, self.layout, self.timeout, self.method)
        self.mode.__enter__()
        return self

    def __exit__(self, *exc):
        self.mode.__exit__(*exc)
        with torch.no_grad():
            for buf, whole in zip(self.buffers, self.saved):
                if whole is not None:
                    buf.resize_(whole.shape).copy_(whole)
        self.saved = []
        return False
