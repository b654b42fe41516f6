attention backward flash {
 dtype = bf16 head_dim = 128 mask = window(256, 0, bottom_right) dropout = 0.1 deterministic = true schedule = (block_m = 128, block_n = 64, warps = 4, stages = 2) target = sm_90a
}
