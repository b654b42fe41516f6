# The T5-style relative position bias with its table kept in the model's
# dtype: a bf16 side tensor reads as its exact f32 values (no widened copy),
# on the flash variant's tiles
attention forward flash {
  dtype     = bf16
  head_dim  = 64
  tensors   = (rel: bf16[2])
  mask      = causal(top_left)
  score_mod = expr(score + rel[h, clamp(q - k, -32, 32) + 32])
}
