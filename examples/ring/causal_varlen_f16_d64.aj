# packed documents over the ring (docs/ring.md "Packed documents"): causal
# f16 attention, head dim 64, q/k/v (T, H, 64) with cu_seqlens_q/_k
attention forward efficient {
  dtype    = f16
  head_dim = 64
  mask     = causal(top_left)
  layout   = varlen
}
