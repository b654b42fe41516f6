# ALiBi written as an expression over a slopes tensor (the built-in
# `score_mod = alibi` is the same program)
attention forward efficient {
  dtype     = f16
  head_dim  = 64
  tensors   = (slopes: f32[1])
  mask      = causal(bottom_right)
  score_mod = expr(score - slopes[h] * abs(q - k))
}
