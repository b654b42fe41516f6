# prefix LM: the first prefix[b] tokens of row b see each other both ways,
# the rest are causal
attention forward efficient {
  dtype    = f16
  head_dim = 64
  tensors  = (prefix: i32[1])
  mask     = expr(k < prefix[b] || k <= q)
}
