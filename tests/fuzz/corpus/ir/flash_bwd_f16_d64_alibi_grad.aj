# ALiBi whose slopes are learned: the backward also gives their gradient
# (the dside output "alibi_slopes")
attention backward flash {
  dtype     = f16
  head_dim  = 64
  mask      = window(16, 0, top_left)
  score_mod = alibi(grad)
}
