attention forward flash {
  dtype = bf16
  head_dim = 128
  tensors = (doc: i32[2], rel: f32[2])
  mask = expr(doc[b, q] == doc[b, k] && k <= q)
  score_mod = expr(score + rel[h, clamp(q - k, -32, 32) + 32])
}
