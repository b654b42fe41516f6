# logit soft-capping (Gemma 2) written as an expression
attention forward efficient {
  dtype     = bf16
  head_dim  = 64
  mask      = causal(top_left)
  score_mod = expr(30.0 * tanh(score / 30.0))
}
