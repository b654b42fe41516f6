# merges two partial results of examples/specs/efficient_fwd_f16_d64.aj
# (docs/cli.md's `attnjit run` merge example)
attention merge {
  dtype      = f16
  head_dim_v = 64
}
