# T5-style relative position bias: a learned table per head over the
# clamped distance q - k in -32..32
attention forward efficient {
  dtype     = f16
  head_dim  = 64
  tensors   = (rel: f32[2])
  mask      = causal(top_left)
  score_mod = expr(score + rel[h, clamp(q - k, -32, 32) + 32])
}
