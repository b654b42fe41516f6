# causal bf16 forward, head dim 128 (PyTorch is_causal=True)
attention forward efficient {
  dtype    = bf16
  head_dim = 128
  mask     = causal(top_left)
}
