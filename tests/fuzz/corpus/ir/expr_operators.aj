attention backward efficient {
  dtype = f16
  head_dim = 64
  bias = add
  score_mod = expr(q % 2 == 0 ? -score * 2.5e-1 : 30.0 * tanh(score / 30.0) - abs(q - k) / 3)
  mask = expr(!(k > q) || k / 128 == q / 128 && (sk - sq) >= -1 && min(q, k) != max(0, -k))
}
