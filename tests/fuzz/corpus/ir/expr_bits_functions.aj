attention backward efficient {
  dtype = f16
  head_dim = 64
  mask = expr((q >> 6) == (k >> 6) && ((q ^ k) & 3) != 1 || ~k << -1 > (q | 5))
  score_mod = expr(sin(score) * cos(score) + tan(score / 8.0) + sigmoid(score) * erf(score) + exp2(-abs(score)) + log2(abs(score) + 1.0) + pow(score, -2) + pow(score, 3))
}
