# packed sequences: each query sees the earlier keys of its own document;
# doc[b, t] is the document id of token t of batch row b
attention forward efficient {
  dtype    = f16
  head_dim = 64
  tensors  = (doc: i32[2])
  mask     = expr(doc[b, q] == doc[b, k] && k <= q)
}
