# A softcap, then ALiBi whose slopes are an ordinary side tensor (passed at
# launch as `slopes`, one per query head; declare it `grad` in the backward
# and the slopes get their gradient): docs/ir.md "score_mod"
attention forward flash {
  dtype     = bf16
  head_dim  = 128
  tensors   = (slopes: f32[1])
  mask      = causal(bottom_right)
  score_mod = softcap(30.0) + alibi(slopes)
}
