# gpt-oss's sliding-window layers: a window of 128 keys (bottom-right,
# causal) and a learned sink logit per query head (docs/ir.md "Sinks"),
# passed at launch as the side tensor `sinks`, Hq floats
attention forward flash {
  dtype    = bf16
  head_dim = 64
  tensors  = (sinks: f32[1])
  sinks    = sinks
  mask     = window(127, 0, bottom_right)
}
