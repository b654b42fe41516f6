#!/usr/bin/env bash
# Builds the one-shot GPU check into build-gpu/ (docs/gpu.md):
#
#   attnjit-gpu.gz   the checks as one binary (tests/gpu/bundle_main.c), LLVM
#                    and the C++ runtime linked in, stripped and gzipped
#   run.sh           tests/gpu/run.sh: every check in its own process, in
#                    at most 540 s, results in results/results.json
#   torch_compare.py against torch SDPA where torch is importable
#   specs/           the example specs (the start-up check compiles them)
#
# then checks it (tests/gpu/check_bundle.sh): at most 48 MiB, no glibc
# symbol newer than 2.31, no library a GPU image may lack, and a run
# without a GPU that says so.  On the GPU machine: build-gpu/run.sh.
#
# AJ_GPU_BUILD_DIR (build-gpu-obj), AJ_GPU_BUNDLE_DIR (build-gpu) and
# AJ_GPU_BUILD_TYPE (Release) override the defaults.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
obj=${AJ_GPU_BUILD_DIR:-$root/build-gpu-obj}
dest=${AJ_GPU_BUNDLE_DIR:-$root/build-gpu}
launcher=()
command -v ccache >/dev/null && launcher=(-DCMAKE_C_COMPILER_LAUNCHER=ccache
                                          -DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
# --as-needed: only what the checks call is needed on the GPU machine
cmake -S "$root" -B "$obj" -DCMAKE_BUILD_TYPE="${AJ_GPU_BUILD_TYPE:-Release}" \
      -DAJ_LLVM_STATIC=ON -DAJ_BUILD_TESTS=OFF -DAJ_BUILD_BENCH=OFF \
      -DCMAKE_EXE_LINKER_FLAGS=-Wl,--as-needed "${launcher[@]}" >/dev/null
cmake --build "$obj" -j"$(nproc 2>/dev/null || echo 2)" --target attnjit_gpu
rm -rf "$dest"
mkdir -p "$dest/specs"
strip -o "$dest/attnjit-gpu" "$obj/tests/gpu/attnjit-gpu"
gzip -9 -n "$dest/attnjit-gpu"
cp "$root/tests/gpu/run.sh" "$root/tests/gpu/torch_compare.py" "$dest/"
cp "$root"/examples/specs/*.aj "$dest/specs/"
"$root/tests/gpu/check_bundle.sh" "$dest"
