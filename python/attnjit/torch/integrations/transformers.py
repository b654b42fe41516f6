"""attnjit as a Hugging Face transformers attention backend
(docs/transformers.md).

    import attnjit.torch.integrations.transformers as ajt
    ajt.register()                       # once, before building models
    model = AutoModelForCausalLM.from_config(cfg, attn_implementation="attnjit")

register() adds "attnjit" to transformers' AttentionInterface (the
attention call) and AttentionMaskInterface (the mask it is handed).  The
mask is transformers' own boolean (B, 1, Q, KV) mask, or None where
transformers knows it to be plain causal (no padding, no packing), as for
SDPA; so padding, packed sequences (from position_ids), KV-cache decode and
chunked prefill mean exactly what they mean for eager and SDPA.  The call
maps the rest onto attnjit.torch.attention's options:

    no mask, a causal module   causal="bottom_right" (queries are the last
                               Q of KV positions: the KV-cache case too)
    sliding_window=W           window=(W - 1, 0) with causal
    softcap=C                  softcap=C
    scaling                    scale
    dropout (training)         dropout_p
    fewer KV heads (GQA)       as they are
    a boolean mask             mask="aj_mask[b, q, k] != 0" over the mask
                               as an int32 side tensor (exact, dense)
    an additive (float) mask   bias (with its gradient: learned masks)
    cu_seq_lens_q/k (packed    attention_varlen over the row's sequences
    rows, flash kwargs)
    s_aux (learned sinks)      sinks (their gradient too): gpt-oss
"""
import torch

import attnjit
from attnjit.torch import _ops

NAME = "attnjit"


def attnjit_attention_forward(module, query, key, value, attention_mask, dropout=0.0,
                              scaling=None, is_causal=None, **kwargs):
    """transformers' attention call: query (B, Hq, Q, D), key and value
    (B, Hkv, KV, D); returns (output (B, Q, Hq, Dv), None)."""
    if kwargs.get("position_bias") is not None:
        raise attnjit.UnsupportedError(
            4, "attnjit transformers backend: a position_bias tensor is not supported")
    opts = dict(scale=scaling, softcap=kwargs.get("softcap"),
                dropout_p=float(dropout or 0.0))
    sinks = kwargs.get("s_aux")
    if sinks is None:
        sinks = kwargs.get("sinks")
    if sinks is not None:
        opts["sinks"] = sinks
    cu_q, cu_k = kwargs.get("cu_seq_lens_q"), kwargs.get("cu_seq_lens_k")
    if cu_q is not None and cu_k is not None and query.shape[0] == 1:
        return _packed(module, query, key, value, cu_q, cu_k, kwargs, opts, is_causal)
    if attention_mask is not None and attention_mask.dtype != torch.bool:
        # an additive mask (a model's own: learned or dynamic biases, -inf
        # where hidden): attnjit's bias, which also gets its gradient
        opts["bias"] = attention_mask[..., :key.shape[2]]
    elif attention_mask is not None:
        m = attention_mask[:, 0] if attention_mask.dim() == 4 else attention_mask
        m = m.expand(query.shape[0], query.shape[2], key.shape[2])
        opts["mask"] = "aj_mask[b, q, k] != 0"
        opts["tensors"] = {"aj_mask": m.to(torch.int32)}
    elif query.shape[2] > 1:      # one query row sees every key
        _causal_options(module, is_causal, kwargs, opts)
    out = _ops.attention(query, key, value, **opts)
    return out.transpose(1, 2).contiguous(), None


def _causal_options(module, is_causal, kwargs, opts):
    """A causal layer's options without a mask: causal="bottom_right" (the
    queries are the last of the keys' positions) and its sliding window
    (transformers' window W keeps keys q - W < k <= q)."""
    causal = is_causal if is_causal is not None else getattr(module, "is_causal", True)
    if causal:
        opts["causal"] = "bottom_right"
        window = kwargs.get("sliding_window")
        if window:
            opts["window"] = (int(window) - 1, 0)


def _packed(module, query, key, value, cu_q, cu_k, kwargs, opts, is_causal):
    """Packed rows with transformers' flash-attention keyword arguments
    (cu_seq_lens_q/k, max_length_q/k: DataCollatorWithFlattening's) as
    attention_varlen over the one row's sequences, each causal from its
    start; no dense mask."""
    _causal_options(module, is_causal, kwargs, opts)
    max_q, max_k = kwargs.get("max_length_q"), kwargs.get("max_length_k")
    cu_q, cu_k = cu_q.to(torch.int32), cu_k.to(torch.int32)
    if max_q is None or max_k is None:   # the bounds from the offsets (a host read)
        max_q, max_k = (int((c[1:] - c[:-1]).max()) if c.numel() > 1 else 0
                        for c in (cu_q, cu_k))
    q, k, v = (t[0].transpose(0, 1) for t in (query, key, value))   # (T, H, D)
    out = _ops.attention_varlen(q, k, v, cu_q, cu_k, int(max_q), int(max_k), **opts)
    return out.unsqueeze(0), None


def attnjit_mask(*args, **kwargs):
    """transformers' mask for this backend: the SDPA mask (boolean, or None
    where plain causal attention is exact)."""
    from transformers.masking_utils import sdpa_mask
    return sdpa_mask(*args, **kwargs)


def register(name=NAME):
    """Registers the backend under `name` in transformers' attention and
    mask interfaces; models built with attn_implementation=name use it."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface
    AttentionInterface.register(name, attnjit_attention_forward)
    AttentionMaskInterface.register(name, attnjit_mask)
    return name
