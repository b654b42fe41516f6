# plain f16 forward, head dim 64, no mask
attention forward efficient {
  dtype    = f16
  head_dim = 64
}
