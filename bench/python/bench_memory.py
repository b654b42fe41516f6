"""Resident memory of a long run of attnjit.torch.attention calls on the
CPU, with the kernel caches bounded and unbounded, in one process.

    python bench/python/bench_memory.py [--calls 50000] [--new-every 500] [--limit 12]

Each run makes `calls` forwards (shapes B 1-2, Hq/Hkv 1-4, S 1-48, head dim
8..64, f32/bf16, causal or not) of which one in `new_every` uses an op not
seen before (a sliding window of a fresh width), so a cache without a
bound keeps a kernel per such call.  The bounded run keeps `limit` kernels
(attnjit.torch.set_kernel_cache_limit); the unbounded one a million.
Prints a markdown table: resident MiB after a tenth of the calls and at
the end, the growth, open file descriptors, kernels kept, seconds.
"""
import argparse
import os
import random
import time

import torch

import attnjit.torch as at


def resident_mib():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def run(calls, new_every, limit, seed):
    rng = random.Random(seed)
    at.set_kernel_cache_limit(limit)
    pools = {(dtype, d): torch.randn(2, 4, 48, d).to(dtype)
             for dtype in (torch.float32, torch.bfloat16) for d in (8, 16, 32, 64)}
    t0 = time.perf_counter()
    for i in range(calls):
        dtype, d = rng.choice(list(pools))
        causal, window = rng.random() < 0.5, None
        if rng.randrange(new_every) == 0:
            causal, window = True, (rng.randint(1, 10**9), 0)
        b, hkv = rng.randint(1, 2), rng.choice((1, 2))
        hq = hkv * rng.choice((1, 2))
        pool = pools[(dtype, d)]
        sq, sk = rng.randint(1, 48), rng.randint(1, 48)
        at.attention(pool[:b, :hq, :sq], pool[:b, :hkv, :sk], pool[:b, 2:2 + hkv, :sk],
                     causal=causal, window=window)
        if i == calls // 10:
            early = resident_mib()
    end = resident_mib()
    return (early, end, len(os.listdir("/proc/self/fd")), at.kernel_cache_size(),
            time.perf_counter() - t0)


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--calls", type=int, default=50000)
    p.add_argument("--new-every", type=int, default=500)
    p.add_argument("--limit", type=int, default=12)
    a = p.parse_args()
    print("| kernels kept at most | calls | RSS at 10% (MiB) | RSS at end (MiB) | growth (MiB) "
          "| open fds | kernels kept | s |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|")
    for seed, limit in enumerate((a.limit, 10**6, a.limit)):
        early, end, fds, kept, secs = run(a.calls, a.new_every, limit, seed)
        print("| %d | %d | %.1f | %.1f | %+.1f | %d | %d | %.1f |"
              % (limit, a.calls, early, end, end - early, fds, kept, secs))


if __name__ == "__main__":
    main()
