# chunked local attention: causal inside chunks of 128 tokens
attention forward efficient {
  dtype    = bf16
  head_dim = 64
  mask     = expr(q / 128 == k / 128 && k <= q)
}
