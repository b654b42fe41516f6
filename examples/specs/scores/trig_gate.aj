# FlexAttention test's trigonometric score_mod with a sigmoid gate and a
# squared distance penalty: sin, cos, tan, sigmoid and pow
attention forward efficient {
  dtype     = f16
  head_dim  = 64
  mask      = causal(top_left)
  score_mod = expr(cos(score) * sin(score) + tan(b) + score * sigmoid(score) - 0.001 * pow(q - k, 2))
}
