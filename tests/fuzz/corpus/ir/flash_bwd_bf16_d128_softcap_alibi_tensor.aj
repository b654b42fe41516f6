# Gemma-style softcap, then ALiBi with its slopes an ordinary side tensor
# that is learned (its gradient is the tensor's)
attention backward flash {
  dtype     = bf16
  head_dim  = 128
  tensors   = (slopes: f32[1] grad)
  mask      = causal(bottom_right)
  score_mod = softcap(30.0) + alibi(slopes)
}
