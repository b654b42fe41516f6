attention forward efficient {
  tensors = (slopes: f32[1], lens: i32[1], t4: f32[4])
  dtype = f32
  head_dim = 32
  score_mod = expr(exp(log(sqrt(abs(score) + 1.0))) - slopes[h] * floor(1.5) + t4[b, h, q, k] - inf * 0.0 + (9223372036854775807 + 1))
  mask = expr(k < lens[b] && q < lens[b] || false && true)
}
