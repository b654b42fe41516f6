"""attnjit for PyTorch (docs/python.md).

    attnjit.torch.attention(q, k, v, *, causal=False, window=None, softcap=None,
                            alibi_slopes=None, bias=None, scale=None,
                            dropout_p=0.0, mask=None, score_mod=None,
                            tensors=None, variant=None, return_lse=False)

q, k, v in SDPA's (B, H, S, D) layout, any strides, GQA when H_q is a
multiple of H_kv.  The forward and the backward are torch.library custom
ops (attnjit::attention_fwd, attnjit::attention_bwd) with autograd and fake
implementations, so torch.compile(fullgraph=True) traces a model that uses
them without graph breaks.

    attnjit.torch.paged_attention(q, k_cache, v_cache, block_table, seqlens_k, *,
                                  cu_seqlens_q=None, k_scale=None, v_scale=None,
                                  causal=False, window=None, ...)   -> (o, lse)
    over a paged KV cache (decode; chunked prefill with cu_seqlens_q)
    attnjit.torch.mla_decode(q, kv_cache, block_table, seqlens_k, *,
                             head_dim_v, scale, ...)   -> (o, lse)
    absorbed MLA: every query head over one latent cache, V its first columns

    attnjit.torch.ring_attention(q, k, v, *, group=None, layout="zigzag",
                                 rotate="p2p", method="ring", ...)   this rank's shards
        method "ring", "ulysses" or "hybrid" (ulysses_size=U); packed
        documents with cu_seqlens_q / cu_seqlens_k
    attnjit.torch.shard(x, dim, rank, world_size, layout) / unshard(...)
    attnjit.torch.shard_varlen(x, cu_seqlens, rank, world_size, layout, method)
                                                         / unshard_varlen(...)
    with attnjit.torch.context_parallel(buffers=..., buffer_seq_dims=...):
        ...    # every F.scaled_dot_product_attention runs as ring attention

    attnjit.torch.flex_attention(q, k, v, score_mod=None, block_mask=None, ...)
    attnjit.torch.create_block_mask(mask_mod, B, H, Q_LEN, KV_LEN)
    FlexAttention's signatures; the mods traced into attnjit expressions
"""
from ._ops import (attention, attention_varlen, kernel_cache_limit, kernel_cache_size,
                   set_kernel_cache_limit)
from ._flex import BlockMask, create_block_mask, flex_attention
from ._fp8 import quantize_fp8
from ._paged import mla_decode, paged_attention
from ._ring import (context_parallel, ring_attention, shard, shard_varlen, unshard,
                    unshard_varlen)

__all__ = ["BlockMask", "attention", "attention_varlen", "context_parallel",
           "create_block_mask", "flex_attention", "kernel_cache_limit",
           "kernel_cache_size", "mla_decode", "paged_attention", "quantize_fp8",
           "ring_attention", "set_kernel_cache_limit", "shard", "shard_varlen", "unshard", "unshard_varlen"]
