# causal bf16 forward on tensor cores (mma.sync, ldmatrix, a cp.async K/V
# pipeline); key tiles above the diagonal are never loaded
attention forward flash {
  dtype    = bf16
  head_dim = 128
  mask     = causal(bottom_right)
}
