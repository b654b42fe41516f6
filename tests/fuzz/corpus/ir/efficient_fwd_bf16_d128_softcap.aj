# logit soft-capping (Gemma 2): s = 50 * tanh(s / 50)
attention forward efficient {
  dtype     = bf16
  head_dim  = 128
  mask      = causal(top_left)
  score_mod = softcap(50.0)
}
