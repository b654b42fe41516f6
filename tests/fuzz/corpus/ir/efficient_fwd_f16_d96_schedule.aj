# an explicit tile schedule: 32 query rows and 64 keys per step on 4 warps
attention forward efficient {
  dtype    = f16
  head_dim = 96
  schedule = (block_m = 32, block_n = 64, warps = 4)
}
