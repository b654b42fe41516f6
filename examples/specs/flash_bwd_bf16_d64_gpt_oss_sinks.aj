# the backward of gpt-oss's sliding-window layers: dQ, dK, dV from the
# forward's O and its sink-including LSE, and the sinks' gradient
# (aj_bwd_args.dsinks) from the last stage, summed in a fixed order
attention backward flash {
  dtype    = bf16
  head_dim = 64
  tensors  = (sinks: f32[1])
  sinks    = sinks
  mask     = window(127, 0, bottom_right)
  deterministic = true
}
