# the backward of examples/specs/efficient_fwd_f16_d64.aj (docs/cli.md's
# `attnjit run` backward example)
attention backward efficient {
  dtype    = f16
  head_dim = 64
}
