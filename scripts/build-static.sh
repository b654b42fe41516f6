#!/usr/bin/env bash
# Builds attnjit with LLVM linked statically (AJ_LLVM_STATIC=ON) into
# build-static/: a binary that runs on a machine with no LLVM installed,
# such as a GPU machine the build is carried to (tests/gpu/run.sh uses it).
# Prints the stripped size.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${AJ_STATIC_BUILD_DIR:-$root/build-static}
# --as-needed: the GPU checks never call MPI (only the ring does), so they
# must not need libmpi on a GPU machine that has no OpenMPI; the attnjit
# tool itself (attnjit ring) does.
cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=Release -DAJ_LLVM_STATIC=ON \
      -DAJ_BUILD_TESTS=OFF -DAJ_BUILD_BENCH=OFF -DCMAKE_EXE_LINKER_FLAGS=-Wl,--as-needed >/dev/null
cmake --build "$build" -j"$(nproc 2>/dev/null || echo 2)" \
      --target attnjit_cli gpu_check gpu_backward_check gpu_flash_bwd_check
strip -o "$build/attnjit.stripped" "$build/attnjit"
strip -o "$build/gpu_check.stripped" "$build/tests/gpu/gpu_check"
size=$(stat -c %s "$build/attnjit.stripped")
echo "build-static/attnjit: $((size / 1048576)) MiB stripped; needs: $(ldd "$build/attnjit" | awk '{print $1}' | tr '\n' ' ')"
echo "build-static/tests/gpu/gpu_check needs: $(ldd "$build/tests/gpu/gpu_check" | awk '{print $1}' | tr '\n' ' ')"
