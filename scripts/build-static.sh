#!/usr/bin/env bash
# Builds attnjit with LLVM linked statically (AJ_LLVM_STATIC=ON) into
# build-static/: an attnjit tool that runs on a machine with no LLVM
# installed.  Prints the stripped size.  (The GPU check is built by
# scripts/gpu-bundle.sh.)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${AJ_STATIC_BUILD_DIR:-$root/build-static}
# --as-needed: nothing the tool does not call is needed (attnjit ring
# needs libmpi)
cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=Release -DAJ_LLVM_STATIC=ON \
      -DAJ_BUILD_TESTS=OFF -DAJ_BUILD_BENCH=OFF -DCMAKE_EXE_LINKER_FLAGS=-Wl,--as-needed >/dev/null
cmake --build "$build" -j"$(nproc 2>/dev/null || echo 2)" \
      --target attnjit_cli
strip -o "$build/attnjit.stripped" "$build/attnjit"
size=$(stat -c %s "$build/attnjit.stripped")
echo "build-static/attnjit: $((size / 1048576)) MiB stripped; needs: $(ldd "$build/attnjit" | awk '{print $1}' | tr '\n' ' ')"
