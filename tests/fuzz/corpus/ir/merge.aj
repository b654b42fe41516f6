attention merge {
  dtype = f32
  head_dim_v = 64
}
