attention forward flash {
  dtype = f32
  head_dim = 64
  tensors = (d: i32[1])
  mask = expr(d[q] + (k < q) ? score : ((((q)))))
}
