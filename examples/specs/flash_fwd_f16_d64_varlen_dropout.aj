# packed sequences of different lengths (cu_seqlens_q / cu_seqlens_k at
# launch), a sliding window, dropout, and an explicit 3-stage pipeline
attention forward flash {
  dtype    = f16
  head_dim = 64
  mask     = window(256, 0, bottom_right)
  dropout  = 0.1
  layout   = varlen
  schedule = (block_m = 64, block_n = 64, warps = 4, stages = 3)
}
