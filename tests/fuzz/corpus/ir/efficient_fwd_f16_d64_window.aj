# sliding-window attention (Mistral style): each query sees itself and the
# 4096 keys before it, aligned bottom-right
attention forward efficient {
  dtype    = f16
  head_dim = 64
  mask     = window(4096, 0, bottom_right)
}
