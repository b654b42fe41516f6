# f32 forward at the largest head dim, explicit scale
attention forward efficient {
  dtype    = f32
  head_dim = 256
  scale    = 0.0625
}
