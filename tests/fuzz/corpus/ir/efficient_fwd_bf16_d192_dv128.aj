# value head dim differs from the query/key head dim (DeepSeek MLA shape)
attention forward efficient {
  dtype      = bf16
  head_dim   = 192
  head_dim_v = 128
  mask       = causal(top_left)
}
