# ALiBi position bias: s -= slope[h] * |q_pos - kv_pos|; slopes are a launch
# argument (alibi_slopes, f32, one per query head)
attention forward efficient {
  dtype     = f16
  head_dim  = 64
  mask      = causal(bottom_right)
  score_mod = alibi
}
