# causal bf16 forward with FlashAttention's alignment: when Sq < Sk the last
# query row sees every key (decoding with a KV cache)
attention forward efficient {
  dtype    = bf16
  head_dim = 128
  mask     = causal(bottom_right)
}
