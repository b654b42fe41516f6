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

Ulysses and hybrid (the C runtime's methods, docs/ring.md) trade sequence
shards for head shards by an all-to-all (_Swap): Ulysses over every rank,
then one attention over the whole sequence; hybrid inside groups of U
consecutive ranks, then the ring above across the groups (aj_ring_plan
with members = U: each group one ring rank).  Packed documents (cu_seqlens
given) follow the same plans: the ring's and hybrid's shards cut every
document (aj_shard_varlen_chunks), Ulysses' the packed axis.
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


def _method(fn, method):
    if method not in _capi.CP_METHODS:
        raise _fail(fn, "method = %r; want 'ring', 'ulysses' or 'hybrid'" % (method,))
    return _capi.CP_METHODS.index(method)


def _varlen_chunks(fn, method, layout, rank, world, cu):
    """Rank `rank`'s pieces of the packed documents with offsets cu (a
    list), (global, local, len) each: the C rule (aj_shard_varlen_chunks)."""
    batch = len(cu) - 1
    offsets = (_capi.i32 * len(cu))(*cu)
    cap = 2 * batch + 2
    chunks, n, length = (_capi.ShardChunk * cap)(), _capi.i32(), _capi.i64()
    ctx = attnjit._ctx
    with ctx.lock:
        _check(fn, _lib.aj_shard_varlen_chunks(ctx.ptr, _method(fn, method), _layout(fn, layout),
                                               rank, world, offsets, batch, chunks, cap,
                                               ctypes.byref(n), ctypes.byref(length)))
    return [_capi.chunk_tuple(c) for c in chunks[:n.value]]


def _positions(chunks):
    """The global positions of a shard's chunks, in its local order."""
    if not chunks:
        return torch.zeros(0, dtype=torch.int64)
    return torch.cat([torch.arange(g, g + n) for g, _, n in chunks])


def _offsets(fn, name, cu, like):
    """cu_seqlens as a list (read to the host: the plans need it) after the
    checks attention_varlen makes, and at least one document."""
    why = _ops._offsets_problem(name, cu, like)
    if why:
        raise _fail(fn, why)
    if cu.shape[0] < 2:
        raise _fail(fn, "%s holds %d offsets; want B + 1 >= 2" % (name, cu.shape[0]))
    return cu.tolist()


def _as_list(cu_seqlens):
    return cu_seqlens.tolist() if isinstance(cu_seqlens, torch.Tensor) else list(cu_seqlens)


def shard_varlen(x, cu_seqlens, rank, world_size, layout="zigzag", method="ring", dim=0):
    """Rank `rank`'s shard of packed documents x (offsets cu_seqlens, int32
    (B + 1,), along dim), as ring_attention takes it with cu_seqlens:
    method "ring" and "hybrid" cut every document by the layout (zigzag:
    each document's head and tail chunks, the causal work balanced per
    document), "ulysses" the packed axis (aj_shard_varlen_chunks)."""
    pos = _positions(_varlen_chunks("shard_varlen", method, layout, rank, world_size,
                                    _as_list(cu_seqlens)))
    return x.index_select(dim, pos.to(x.device))


def unshard_varlen(x, cu_seqlens, rank, world_size, layout="zigzag", method="ring", dim=0,
                   out=None):
    """The inverse of shard_varlen: writes rank `rank`'s shard x into its
    positions of `out` (zeros of the whole packed length when None) and
    returns out."""
    cu = _as_list(cu_seqlens)
    pos = _positions(_varlen_chunks("unshard_varlen", method, layout, rank, world_size, cu))
    if out is None:
        shape = list(x.shape)
        shape[dim] = cu[-1]
        out = x.new_zeros(shape)
    return out.index_copy_(dim, pos.to(out.device), x)


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


def _plan(q, variant, body, alibi, side, layout, rotate, rank, world, lq, lk, members=1,
          heads=(0, 0), docs=None):
    """aj_ring_plan of the forward op `body` for ring rank `rank` of
    `world` (hybrid: group `rank` of `world` groups of `members` ranks,
    this rank's heads heads[0] .. of heads[1]; lq, lk: this rank's shard
    lengths); docs: packed documents' (cu_q, cu_k) tensors.
    [(src, [pair, ...]) per step]."""
    op = attnjit.Op(_ops._spec("forward", variant, body), "attnjit.torch.ring_attention")
    dev, _ = _ops._device_of(q)
    a = _capi.RingPlanArgs(struct_size=_RING_PLAN_ARGS_SIZE, layout=_layout(
        "ring_attention", layout), rotate=_capi.RING_ROTATES.index(rotate), rank=rank,
        size=world, batch=docs[0].shape[0] - 1 if docs else q.shape[0], heads_q=q.shape[1],
        seq_q=lq, seq_k=lk, members=members, head_offset=heads[0])
    if docs:
        a.cu_seqlens_q, a.cu_seqlens_k = docs[0].data_ptr(), docs[1].data_ptr()
    if alibi is not None:
        _ops._put(a.alibi_slopes, alibi)
    side_arr, a.num_side = _ops._bind_side(_ops._side_names(body), side)
    a.side = side_arr
    count = _capi.i32()
    ctx = attnjit._ctx
    with ctx.lock:
        _check("ring_attention", _lib.aj_ring_plan(ctx.ptr, dev, op.ptr, ctypes.byref(a),
                                                   None, 0, ctypes.byref(count)))
        pairs = (_capi.RingPair * max(count.value, 1))()
        _check("ring_attention", _lib.aj_ring_plan(ctx.ptr, dev, op.ptr, ctypes.byref(a),
                                                   pairs, count.value, ctypes.byref(count)))
    steps = [((rank - s) % world if rotate == "p2p" else s, []) for s in range(world)]
    for p in pairs[:count.value]:
        steps[p.step][1].append({"q": _capi.chunk_tuple(p.q), "k": _capi.chunk_tuple(p.k),
                                 "block": _BLOCK_NAMES[p.block], "doc": p.doc})
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


def _as4(t):
    """A packed (T, H, D) tensor (or an LSE (H, T)) as the padded view the
    ring slices by position: (1, H, T, D) (or (1, H, T))."""
    return t.unsqueeze(0) if t.dim() == 2 else t.permute(1, 0, 2).unsqueeze(0)


def _packed(t):
    """The inverse of _as4 on a slice: (1, H, n, D) -> (n, H, D), (1, H, n)
    -> (H, n); views."""
    return t[0] if t.dim() == 3 else t[0].transpose(0, 1)


class _Ring:
    """One ring call's fixed facts: the group, ranks, op, and the C ring's
    schedule for them.  Padded: q, k, v (B, H, l, D), the shards even.
    Packed documents (docs: the offsets as lists and on q's device): q, k,
    v (l, H, D) pieces, the blocks travelling in slots of the longest
    ring rank's keys; each pair launches the varlen kernel as document
    `doc` of doc + 1 (the first doc empty), so that b, dropout's stream and
    the positions are the document's.  members, heads: hybrid's ring
    across its groups (aj_ring_plan's)."""

    def __init__(self, group, layout, rotate, variant, body, alibi, side, rng, q, lk, timeout,
                 members=1, heads=(0, 0), docs=None, lengths=None):
        self.group, self.timeout = group, timeout
        self.world = dist.get_world_size(group)
        self.rank = dist.get_rank(group)
        self.rotate = rotate
        self.variant, self.body = variant, body
        # the steps' op: sinks are counted once, as the accumulator's start
        self.step_body = body.replace("\n  sinks = " + _ops._SINKS, "")
        self.alibi, self.side, self.rng = alibi, side, rng
        self.heads, self.docs = heads, docs
        self.seq = 0 if docs else 2
        lq = q.shape[self.seq]
        self.sq, self.sk = lq * self.world, lk * self.world
        # packed documents: this rank's key length, and its slot's (the longest)
        self.lk, self.slot = lk, max(lengths) if docs else lk
        self.steps = _plan(q, variant, body, alibi, side, layout, rotate, self.rank,
                           self.world, lq // members, lk // members, members, heads,
                           docs[2:] if docs else None)

    def peer(self, r):
        return dist.get_global_rank(self.group, r % self.world) if self.group else r % self.world

    def launches(self, pairs):
        """(query slice, key slice, positions, masked, doc) of each pair the
        plan does not skip: a full pair runs the kernel without the mask."""
        for p in pairs:
            if p["block"] == "skip":
                continue
            (qg, qs, qn), (kg, ks, kn) = p["q"], p["k"]
            if self.docs:
                d = p["doc"]
                cu_q, cu_k = self.docs[0], self.docs[1]
                at = _ops.Positions(qg, kg, cu_q[d + 1] - cu_q[d], cu_k[d + 1] - cu_k[d])
            else:
                at = _ops.Positions(qg, kg, self.sq, self.sk)
            yield slice(qs, qs + qn), slice(ks, ks + kn), at, p["block"] == "partial", p["doc"]

    def doc_varlen(self, q, k, doc, device):
        """The varlen fields of a pair's launch: document `doc` of doc + 1."""
        cu = [0] * (doc + 1)
        return (torch.tensor(cu + [q.shape[0]], dtype=torch.int32, device=device),
                torch.tensor(cu + [k.shape[0]], dtype=torch.int32, device=device),
                q.shape[0], k.shape[0])

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

    def slotted(self, t):
        """A K/V shard in its travelling slot (packed documents: zeros past
        its length, so every rank's block has one shape)."""
        if self.slot == self.lk:
            return t
        out = t.new_zeros((self.slot,) + tuple(t.shape[1:]))
        out[:self.lk] = t
        return out

    def blocks(self, k, v):
        """(block owner, its pairs, k, v) for every step of the plan, as
        padded views; p2p posts the next block's exchange before yielding
        the current one (the plan's src at step s is then rank r-s, whose
        block has made s hops)."""
        view = _as4 if self.docs else (lambda t: t)
        k, v = self.slotted(k), self.slotted(v)
        if self.rotate == "allgather":
            ks = [torch.empty_like(k) for _ in range(self.world)]
            vs = [torch.empty_like(v) for _ in range(self.world)]
            for whole, part, name in ((ks, k, "K"), (vs, v, "V")):
                _complete(lambda: dist.all_gather(whole, part, group=self.group, async_op=True),
                          "the all-gather of " + name, self.group, self.timeout)
            for src, pairs in self.steps:
                yield src, pairs, view(ks[src]), view(vs[src])
            return
        for step, (src, pairs) in enumerate(self.steps):
            wait = (self.exchange([k, v], "step %d's exchange of K/V" % step)
                    if step < self.world - 1 else None)
            yield src, pairs, view(k), view(v)
            if wait:
                k, v = wait()

    def forward(self, q, k, v, sinks=None):
        docs = self.docs
        Hq, lq = q.shape[1], q.shape[self.seq]
        B = 1 if docs else q.shape[0]
        o_acc = torch.zeros((lq, Hq, v.shape[-1]) if docs else (B, Hq, lq, v.shape[-1]),
                            dtype=torch.float32, device=q.device)
        # the chain starts from the sinks' partial (O = 0, LSE = sink): each
        # row counts its sink once, whatever the steps (docs/ir.md "Sinks")
        lse = (torch.full((B, Hq, lq), float("-inf"), dtype=torch.float32, device=q.device)
               if sinks is None else sinks.detach().view(1, Hq, 1).expand(B, Hq, lq).clone())
        q4, o4 = (_as4(q), _as4(o_acc)) if docs else (q, o_acc)
        body = self.step_body + "\n  accumulate = true"
        for _, pairs, kb, vb in self.blocks(k, v):
            for qi, ki, at, masked, doc in self.launches(pairs):
                qp, kp, vp = q4[:, :, qi], kb[:, :, ki], vb[:, :, ki]
                op, lp = o4[:, :, qi], lse[:, :, qi]
                varlen = None
                if docs:
                    qp, kp, vp, op, lp = (_packed(t) for t in (qp, kp, vp, op, lp))
                    varlen = self.doc_varlen(qp, kp, doc, q.device)
                _ops.forward_into(qp, kp, vp, None, lp, None, self.alibi, self.side, self.rng,
                                  self.variant, body, at=at, o_acc=op, masked=masked,
                                  varlen=varlen, heads=self.heads)
        return o_acc.to(q.dtype), (lse[0] if docs else lse)

    def backward(self, do, q, k, v, o, lse):
        """dq, dk, dv of this rank's shards and this rank's part of each grad
        side tensor's gradient (its rows' terms, summed in step order; the
        ranks' parts are summed by _SumOverRanks), None for the others."""
        docs = self.docs
        dq_acc = torch.zeros(q.shape, dtype=torch.float32, device=q.device)
        grads = _ops._side_grad_flags(self.step_body)
        dside_acc = [torch.zeros(t.shape, dtype=torch.float32, device=q.device) if g else None
                     for t, g in zip(self.side, grads)]
        gathered = self.rotate == "allgather"
        # dK/dV sums: per block (allgather), or the travelling block's (p2p)
        slot = self.slotted(k).shape
        dkv = [[torch.zeros(s, dtype=torch.float32, device=q.device)
                for s in (slot, self.slotted(v).shape)]
               for _ in range(self.world if gathered else 1)]
        view = _as4 if docs else (lambda t: t)
        q4, do4, o4, lse4, dq4 = (view(t) for t in (q, do, o, lse, dq_acc))
        for step, (src, pairs, kb, vb) in enumerate(self.blocks(k, v)):
            acc = [view(t) for t in dkv[src if gathered else 0]]
            for qi, ki, at, masked, doc in self.launches(pairs):
                parts = [q4[:, :, qi], kb[:, :, ki], vb[:, :, ki], do4[:, :, qi],
                         o4[:, :, qi], lse4[:, :, qi]]
                varlen = None
                if docs:
                    parts = [_packed(t) for t in parts]
                    varlen = self.doc_varlen(parts[0], parts[1], doc, q.device)
                qp, kp, vp, dop, op, lp = parts
                dq, dk, dv = torch.empty_like(qp), torch.empty_like(kp), torch.empty_like(vp)
                dside = _ops._dside_like(self.side, self.step_body) if any(grads) else None
                _ops.backward_into(dop, qp, kp, vp, op, lp, dq, dk, dv, None, None,
                                   self.alibi, self.side, self.rng, self.variant,
                                   self.step_body, at=at, masked=masked, varlen=varlen,
                                   heads=self.heads, dside=dside)
                for acc_t, part in zip(dside_acc, dside or ()):
                    if acc_t is not None:
                        acc_t += part
                if docs:
                    dq, dk, dv = (_as4(t) for t in (dq, dk, dv))
                dq4[:, :, qi] += dq
                acc[0][:, :, ki] += dk
                acc[1][:, :, ki] += dv
            if not gathered and self.world > 1:
                # the sums travel with their block
                dkv[0] = self.exchange(dkv[0], "the backward's step %d exchange of dK/dV"
                                       % step)()
        if gathered:
            for acc in dkv:
                for t in acc:
                    _complete(lambda: dist.all_reduce(t, group=self.group, async_op=True),
                              "the all-reduce of dK/dV", self.group, self.timeout)
            mine = dkv[self.rank]
        else:
            mine = dkv[0]          # after P hops, this rank's own block's sums
        if docs:
            mine = [t[:self.lk] for t in mine]
        return dq_acc.to(q.dtype), mine[0].to(k.dtype), mine[1].to(v.dtype), dside_acc


def _sinks_grad(sinks, do, o, lse):
    """This rank's rows' part of the sinks' gradient: -sum over (b, i) of
    exp(sink[h] - lse) dO . O (rows of lse -inf add 0), in a fixed order
    (padded lse (B, Hq, l); packed documents' (Hq, l))."""
    delta = (do.float() * o.float()).sum(-1)
    if lse.dim() == 2:
        delta, shape, rows = delta.t(), (-1, 1), (1,)
    else:
        shape, rows = (1, -1, 1), (0, 2)
    p = torch.exp(sinks.detach().float().view(shape) - lse)
    p = torch.where(torch.isinf(lse) & (lse < 0), torch.zeros_like(p), p)
    return -(p * delta).sum(rows)


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
    """all_to_all_single of the flat x over `group`, `send[i]` elements to
    member i and `recv[i]` from it, under the ring's fault rule (_comm);
    its own adjoint (the splits swapped), so the backward exchanges the
    gradient the same way."""

    @staticmethod
    def forward(ctx, x, send, recv, group, timeout, what):
        ctx.args = (send, recv, group, timeout, what)
        x = x.contiguous()
        out = x.new_empty(sum(recv))
        _complete(lambda: dist.all_to_all_single(out, x, list(recv), list(send), group=group,
                                                 async_op=True), what, group, timeout)
        return out

    @staticmethod
    def backward(ctx, grad):
        send, recv, group, timeout, what = ctx.args
        return (_AllToAll.apply(grad, recv, send, group, timeout, what + " (backward)"),
                None, None, None, None, None)


class _Swap:
    """Ulysses' all-to-all (DeepSpeed-Ulysses; the C runtime's, docs/ring.md),
    over every rank or (hybrid) a group of U consecutive ones: member m
    holds every head at positions[m] (global, in its local order); to_heads
    gives it its H/U heads (heads m H/U ..) at every member's positions,
    sorted -- the whole sequence, or the group's positions in the order
    aj_shard_group_chunks gives them (runs in order; packed documents,
    document by document) -- and to_shards is the inverse.  Tensors are
    padded views (B, H, s, D) (an LSE with a last dim of 1)."""

    def __init__(self, group, timeout, me, positions):
        self.group, self.timeout, self.me = group, timeout, me
        self.lens = [len(p) for p in positions]
        self.order = torch.argsort(torch.cat(positions))    # sorted = members' [order]
        self.back = torch.argsort(self.order)               # members' = sorted [back]

    def to_heads(self, x, what):
        B, H, s, D = x.shape
        U, h = len(self.lens), H // len(self.lens)
        if U == 1:
            return x
        send = x.reshape(B, U, h, s, D).transpose(0, 1).reshape(-1)
        recv = [B * h * n * D for n in self.lens]
        got = _AllToAll.apply(send, [B * h * s * D] * U, recv, self.group, self.timeout,
                              "the all-to-all of " + what)
        whole = torch.cat([p.view(B, h, n, D) for p, n in zip(got.split(recv), self.lens)], 2)
        return whole[:, :, self.order.to(x.device)]

    def to_shards(self, y, what):
        B, h, _, D = y.shape
        U, s = len(self.lens), self.lens[self.me]
        if U == 1:
            return y
        pieces = y[:, :, self.back.to(y.device)].split(self.lens, 2)
        send = torch.cat([p.reshape(-1) for p in pieces])
        got = _AllToAll.apply(send, [B * h * n * D for n in self.lens], [B * h * s * D] * U,
                              self.group, self.timeout, "the all-to-all of " + what)
        return got.view(U, B, h, s, D).transpose(0, 1).reshape(B, U * h, s, D)


_SUBGROUPS = {}


def _hybrid_groups(group, U):
    """hybrid's process groups: this rank's group of U consecutive ranks,
    and its ring across the groups (the ranks at its place in theirs), in
    rank order; made once per group and U (only their members take part,
    as the C runtime's split), kept for later calls."""
    world, rank = dist.get_world_size(group), dist.get_rank(group)
    key = (group or dist.group.WORLD, U)
    if key not in _SUBGROUPS:
        glob = [dist.get_global_rank(group, r) if group else r for r in range(world)]
        g, m = divmod(rank, U)
        _SUBGROUPS[key] = tuple(
            dist.new_group(ranks, use_local_synchronization=True, sort_ranks=False)
            for ranks in (glob[g * U:(g + 1) * U], glob[m::U]))
    return _SUBGROUPS[key]


def _check_heads(q, k, n, what):
    for name, h in (("q", q.shape[1]), ("k and v", k.shape[1])):
        if h % n:
            raise _fail("ring_attention", "%s splits heads over %d ranks: %s has %d heads, "
                        "not a multiple of %d" % (what, n, name, h, n))


def ring_attention(q, k, v, *, group=None, layout="zigzag", rotate="p2p", causal=False,
                   window=None, softcap=None, alibi_slopes=None, scale=None, dropout_p=0.0,
                   mask=None, score_mod=None, tensors=None, sinks=None, variant=None,
                   return_lse=False, method="ring", ulysses_size=None, cu_seqlens_q=None,
                   cu_seqlens_k=None, timeout=None, oob="check"):
    """attention() over a sequence sharded across the ranks of `group`:
    q, k, v are this rank's shards (shard(x, 2, rank, P, layout)); returns
    this rank's shard of o (and lse).  rotate: "p2p" (K/V to the next rank,
    P-1 exchanges overlapped with compute) or "allgather" (one all-gather;
    the backward all-reduces dK/dV).  Side tensors in `tensors` hold the
    whole sequence (positions are global).  No bias.

    method (docs/ring.md): "ring"; "ulysses" (two all-to-alls of q, k, v
    and of o, lse around one attention over the whole sequence of H/P
    heads: heads and KV heads divisible by P; rotate unused); "hybrid"
    (Ulysses inside groups of ulysses_size = U consecutive ranks, U
    dividing P and the KV heads, and the ring across the P/U groups, each
    group one ring rank: rotate is that ring's).  Padded shards must be
    even (every rank's as long).

    Packed documents: cu_seqlens_q, cu_seqlens_k (int32 (B + 1,) offsets of
    the WHOLE packed batch, on q's device, the same on every rank; read to
    the host for the plan) make q, k, v this rank's packed pieces (l, H, D)
    (shard_varlen(x, cu, rank, P, layout, method)): the ring and hybrid cut
    every document (zigzag: its head and tail chunks, each document's
    causal work balanced), Ulysses the packed axis; o is (l, Hq, Dv), lse
    (Hq, l); positions, masks, b and the dropout stream are each
    document's, as attention_varlen's.

    timeout: seconds each exchange may wait, forward and backward (None:
    the process group's own); a rank that dies or stalls makes every other
    rank raise attnjit.CommError, within it.  sinks: (Hq,) learned sink
    logits, the same on every rank, counted once per row; their gradient
    is the sum over the ranks (an all-gather and a sum in rank order), the
    same on every rank, as a grad side tensor's (one in `tensors` that
    requires grad).  oob: as attention()'s, each launch checked at its own
    positions."""
    fn = "ring_attention"
    _method(fn, method)
    if not dist.is_available() or not dist.is_initialized():
        raise _fail(fn, "torch.distributed is not initialised (init_process_group first)")
    if rotate not in ("p2p", "allgather"):
        raise _fail(fn, "rotate = %r; want 'p2p' or 'allgather'" % (rotate,))
    if timeout is not None and not timeout > 0:
        raise _fail(fn, "timeout = %r; want seconds > 0, or None" % (timeout,))
    world, rank = dist.get_world_size(group), dist.get_rank(group)
    U = {"ring": 1, "ulysses": world, "hybrid": ulysses_size}[method]
    if method == "hybrid" and (isinstance(U, bool) or not isinstance(U, int) or U < 1
                               or world % U):
        raise _fail(fn, "ulysses_size = %r over %d ranks; method = 'hybrid' takes the size U "
                    "of its Ulysses groups, from 1 to P, dividing P" % (U, world))
    if ulysses_size is not None and method != "hybrid":
        raise _fail(fn, "ulysses_size = %r: only method = 'hybrid' takes it" % (ulysses_size,))
    varlen = cu_seqlens_q is not None or cu_seqlens_k is not None
    if varlen and (cu_seqlens_q is None or cu_seqlens_k is None):
        raise _fail(fn, "packed documents need both cu_seqlens_q and cu_seqlens_k")
    if tensors and torch.is_grad_enabled():
        # a 16-bit grad side tensor goes in as float32 (the same values): its
        # ranks' parts are then summed in f32 and rounded once, by autograd,
        # as a single device's gradient is
        tensors = {name: t.float() if t.requires_grad and t.dtype in (torch.float16,
                                                                      torch.bfloat16) else t
                   for name, t in tensors.items()}
    q, k, v, _, alibi_slopes, side, rng, variant, body = _ops._prepare(
        q, k, v, causal, window, softcap, alibi_slopes, None, scale, dropout_p, mask,
        score_mod, tensors, variant, layout="varlen" if varlen else "padded", sinks=sinks,
        oob=oob)
    q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
    if U > 1:
        _check_heads(q, k, U, "method = %r" % method)
    # where each rank's positions are: [(q chunks, k chunks)] by rank
    if varlen:
        cu_q = _offsets(fn, "cu_seqlens_q", cu_seqlens_q, q)
        cu_k = _offsets(fn, "cu_seqlens_k", cu_seqlens_k, q)
        if len(cu_q) != len(cu_k):
            raise _fail(fn, "cu_seqlens_q (%d) and cu_seqlens_k (%d) must both hold B + 1 "
                        "offsets" % (len(cu_q), len(cu_k)))
        where = [tuple(_varlen_chunks(fn, method, layout, r, world, cu) for cu in (cu_q, cu_k))
                 for r in range(world)]
        docs = (cu_q, cu_k, cu_seqlens_q.contiguous(), cu_seqlens_k.contiguous())
    else:
        where = [tuple(_chunks(fn, layout, r, world, t.shape[2] * world) for t in (q, k))
                 for r in range(world)]
        docs = None
    seq = 0 if varlen else 2
    mine = [sum(n for _, _, n in c) for c in where[rank]]
    if varlen and (q.shape[0], k.shape[0]) != tuple(mine):
        raise _fail(fn, "rank %d holds %d query and %d key positions; its pieces of the "
                    "packed documents are %d and %d (shard_varlen, method = %s)"
                    % (rank, q.shape[0], k.shape[0], mine[0], mine[1], method))
    sinks_t = None
    if sinks is not None:      # the last side tensor (_prepare); its gradient summed
        sinks_t = side[-1] = _SumOverRanks.apply(side[-1], group, timeout)
    # grad side tensors: each rank's rows give a part; the parts summed
    for i, grad in enumerate(_ops._side_grad_flags(body)):
        if grad:
            side[i] = _SumOverRanks.apply(side[i], group, timeout)
    if rng is not None:       # one dropout stream for the whole sequence
        src = dist.get_global_rank(group, 0) if group else 0
        what = "the broadcast of the dropout stream"
        _complete(lambda: dist.broadcast(rng, src=src, group=group, async_op=True), what,
                  group, timeout)
    if method == "ring":
        ring = _Ring(group, layout, rotate, variant, body, alibi_slopes, side, rng, q,
                     k.shape[seq], timeout, docs=docs, lengths=[n for _, n in _lengths(where)])
        o, lse = _RingFunction.apply(ring, q, k, v, sinks_t, *side)
        return (o, lse) if return_lse else o
    # Ulysses, and hybrid's groups: the all-to-all of q, k, v to head shards
    g, m = divmod(rank, U)
    members = range(g * U, g * U + U)
    a2a = group if method == "ulysses" else _hybrid_groups(group, U)[0]
    swaps = [_Swap(a2a, timeout, m, [_positions(where[r][t]) for r in members])
             for t in (0, 1)]
    view = _as4 if varlen else (lambda t: t)
    qh = swaps[0].to_heads(view(q), "q")
    kh, vh = (swaps[1].to_heads(view(t), n) for t, n in ((k, "k"), (v, "v")))
    Hq = q.shape[1]
    heads = (m * Hq // U, Hq)
    if method == "ulysses":
        if varlen:
            bounds = [max(b - a for a, b in zip(cu, cu[1:])) for cu in (cu_q, cu_k)]
            o, lse = torch.ops.attnjit.attention_varlen_fwd(
                _packed(qh), _packed(kh), _packed(vh), docs[2], docs[3], bounds[0], bounds[1],
                alibi_slopes, side, rng, variant, body, *heads)
        else:
            o, lse = torch.ops.attnjit.attention_fwd(qh, kh, vh, None, alibi_slopes, side, rng,
                                                     variant, body, *heads)
    else:
        # hybrid: the ring across the groups, each group one ring rank
        if varlen:
            qh, kh, vh = (_packed(t).contiguous() for t in (qh, kh, vh))
        h = Hq // U
        part = sinks_t[m * h:(m + 1) * h] if sinks_t is not None else None
        keys = [n for _, n in _lengths(where)]
        ring = _Ring(_hybrid_groups(group, U)[1], layout, rotate, variant, body,
                     alibi_slopes, side, rng, qh, kh.shape[seq], timeout, members=U,
                     heads=heads, docs=docs,
                     lengths=[sum(keys[c * U:c * U + U]) for c in range(world // U)])
        o, lse = _RingFunction.apply(ring, qh, kh, vh, part, *side)
    o = swaps[0].to_shards(view(o), "o")
    lse = swaps[0].to_shards(view(lse).unsqueeze(-1), "lse").squeeze(-1)
    if varlen:
        o, lse = _packed(o).contiguous(), lse[0]
    return (o, lse) if return_lse else o


def _lengths(where):
    """Each rank's (query, key) positions from its chunks."""
    return [tuple(sum(n for _, _, n in c) for c in w) for w in where]


class _ContextParallelMode(torch.overrides.TorchFunctionMode):
    """Runs every scaled_dot_product_attention call as ring attention on
    the shards (is_causal, scale, dropout_p and enable_gqa as SDPA takes
    them)."""

    def __init__(self, group, layout, timeout, method, ulysses_size):
        super().__init__()
        self.group, self.layout, self.timeout, self.method = group, layout, timeout, method
        self.ulysses_size = ulysses_size

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
                              ulysses_size=self.ulysses_size,
                              causal=bool(call.get("is_causal", False)),
                              scale=call.get("scale"), dropout_p=call.get("dropout_p", 0.0))


class context_parallel:  # noqa: N801 (used as a function, like torch's)
    """with attnjit.torch.context_parallel(buffers=(x, pos), buffer_seq_dims=(1, 0)):
    shards each buffer in place along its sequence dim on entry (this
    rank's part, by `layout`); inside, every
    torch.nn.functional.scaled_dot_product_attention call runs as
    ring_attention over `group`; on exit, restores the buffers not in
    no_restore_buffers.  A model written for one device runs unchanged.
    timeout, method, ulysses_size: ring_attention's (seconds each exchange
    may wait; "ring", "ulysses" or "hybrid" with its group size)."""

    def __init__(self, group=None, buffers=(), buffer_seq_dims=(), no_restore_buffers=(),
                 layout="zigzag", timeout=None, method="ring", ulysses_size=None):
        if len(buffers) != len(buffer_seq_dims):
            raise _fail("context_parallel", "%d buffers but %d buffer_seq_dims"
                        % (len(buffers), len(buffer_seq_dims)))
        self.group, self.layout, self.timeout, self.method = group, layout, timeout, method
        self.ulysses_size = ulysses_size
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
        self.mode = _ContextParallelMode(self.group, self.layout, self.timeout, self.method,
                                         self.ulysses_size)
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
