# the ring demo's op: causal f16 attention, head dim 64 (scripts/demo.sh
# runs it on 2 ranks, zigzag, forward and backward)
attention forward efficient {
  dtype    = f16
  head_dim = 64
  mask     = causal(top_left)
}
