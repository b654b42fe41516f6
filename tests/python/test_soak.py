"""A long run through attnjit.torch.attention: memory and file descriptors
stay flat, and the kernel caches stay within their bound (docs/python.md
"Kernels in memory").

100 000 forward calls on the cpu with shapes drawn from a wide set (batch,
query and KV heads with GQA, lengths 1..48 on each side), the front cache
held to 12 kernels: most calls use one of 10 hot ops (two dtypes, head
dims 8..64, causal or not); one in 500 a sliding window of a width drawn
from 1..10^6, an op not seen before (about 200 of them, each compiled,
kept a while, evicted and freed: unbounded caches would keep them all,
tens of MiB).  Every 1000th call is checked against SDPA.  Between call
10 000 and call 100 000 the resident memory grows by less than 16 MiB and
the open file descriptors do not change.
"""
import os
import random

import torch
import torch.nn.functional as F

import attnjit.torch as at

CALLS = int(os.environ.get("AJ_SOAK_CALLS", "100000"))
WARM = CALLS // 10


def resident_mib():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def open_fds():
    return len(os.listdir("/proc/self/fd"))


def test_long_run_memory_flat():
    rng = random.Random(20261203)
    hot = [(dtype, d, causal) for dtype in (torch.float32, torch.bfloat16)
           for d in (8, 16, 32, 64) for causal in (False, True)][:10]
    limit = at.kernel_cache_limit()
    at.set_kernel_cache_limit(12)
    torch.manual_seed(0)
    # inputs drawn once per (dtype, d) at the largest shape; calls take views
    pools = {(dtype, d): torch.randn(2, 4, 48, d).to(dtype)
             for dtype in (torch.float32, torch.bfloat16) for d in (8, 16, 32, 64)}
    checked = new_ops = 0
    try:
        for i in range(CALLS):
            dtype, d, causal = rng.choice(hot)
            window = None
            if rng.random() < 1 / 500:
                window, causal, new_ops = (rng.randint(1, 10**6), 0), True, new_ops + 1
            b, hkv = rng.randint(1, 2), rng.choice((1, 2))
            hq = hkv * rng.choice((1, 2))
            sq, sk = rng.randint(1, 48), rng.randint(1, 48)
            pool = pools[(dtype, d)]
            q, k, v = pool[:b, :hq, :sq], pool[:b, :hkv, :sk], pool[:b, 2:2 + hkv, :sk]
            o = at.attention(q, k, v, causal=causal, window=window)
            if i % 1000 == 0 or window:
                want = F.scaled_dot_product_attention(
                    q.double(), k.double().repeat_interleave(hq // hkv, 1),
                    v.double().repeat_interleave(hq // hkv, 1),
                    attn_mask=(torch.ones(sq, sk, dtype=torch.bool).tril()
                               if causal else None))   # a window wider than 48: causal
                tol = 2e-2 if dtype == torch.bfloat16 else 1e-4
                torch.testing.assert_close(o.double(), want, atol=tol, rtol=tol)
                checked += 1
            if i == WARM:
                rss0, fds0 = resident_mib(), open_fds()
        rss1, fds1 = resident_mib(), open_fds()
        print("\n%d calls (%d of new ops), %d checked: resident %.1f MiB at call %d, "
              "%.1f MiB at the end (+%.1f); open fds %d -> %d; kernels kept %d of %d"
              % (CALLS, new_ops, checked, rss0, WARM, rss1, rss1 - rss0, fds0, fds1,
                 at.kernel_cache_size(), at.kernel_cache_limit()))
        assert rss1 - rss0 < 16, "resident memory grew %.1f MiB" % (rss1 - rss0)
        assert fds1 == fds0
        assert at.kernel_cache_size() <= 12
    finally:
        at.set_kernel_cache_limit(limit)
