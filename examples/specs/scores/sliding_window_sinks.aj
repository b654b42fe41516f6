# sliding window of 64 keys with 4 attention-sink tokens (StreamingLLM)
attention forward efficient {
  dtype    = bf16
  head_dim = 64
  mask     = expr(k <= q && (k < 4 || q - k < 64))
}
