# A learnable relative bias (FlexAttention's TestLearnableBiases): one
# weight per distance |q - k|, trained with the model.  `grad` makes this
# op's backward (`attention backward flash`, the same fields) compute its
# gradient too (aj_bwd_args.dside), bitwise repeatable.
attention forward flash {
  dtype     = bf16
  head_dim  = 64
  tensors   = (rb: f32[1] grad)
  mask      = causal(bottom_right)
  score_mod = expr(score + rb[abs(q - k)])
}
