#!/usr/bin/env bash
# tests/gpu/run.sh -- every GPU check, in one go, on a machine with an
# NVIDIA GPU (docs/gpu.md).  It needs no LLVM there: it runs the static
# build that scripts/build-static.sh made (carry build-static/), or build/.
#
#   tests/gpu/run.sh [--quick]
#
# Writes gpu_check.{json,md,log}, gpu_backward.log, gpu_flash_bwd.log, torch_compare.{json,md}
# and nvidia-smi.txt
# to $OUT (or ./gpu-results).  Finishes in well under 8 minutes on an H200.
set -uo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
out=${OUT:-$root/gpu-results}
mkdir -p "$out"
quick=()
[ "${1:-}" = --quick ] && quick=(--quick)

bin=$root/build-static/tests/gpu/gpu_check
[ -x "$bin" ] || bin=$root/build/tests/gpu/gpu_check
if [ ! -x "$bin" ]; then
  echo "run.sh: no gpu_check binary: run scripts/build-static.sh first" >&2
  exit 2
fi
nvidia-smi > "$out/nvidia-smi.txt" 2>&1 || echo "nvidia-smi not available" > "$out/nvidia-smi.txt"

dump=$(mktemp -d)
trap 'rm -rf "$dump"' EXIT
echo "== gpu_check ($bin)"
timeout 420 "$bin" "${quick[@]}" --out "$out" --dump "$dump" --specs "$root/examples/specs" \
  2>&1 | tee "$out/gpu_check.log"
status=${PIPESTATUS[0]}

echo "== backward kernels on the GPU against the float64 reference"
bwd=$(dirname "$bin")/gpu_backward_check
timeout 240 "$bwd" cuda 2>&1 | tail -40 | tee "$out/gpu_backward.log"
bstatus=${PIPESTATUS[0]}
[ "$bstatus" -eq 0 ] || status=1

echo "== flash backward kernels on the GPU against the float64 reference"
timeout 240 "$(dirname "$bin")/gpu_flash_bwd_check" cuda 2>&1 | tail -40 |
  tee "$out/gpu_flash_bwd.log"
[ "${PIPESTATUS[0]}" -eq 0 ] || status=1

if python3 -c 'import torch, numpy; assert torch.cuda.is_available()' 2>/dev/null; then
  echo "== torch_compare"
  timeout 240 python3 "$root/tests/gpu/torch_compare.py" "${quick[@]}" --dump "$dump" \
    --attnjit "$out/gpu_check.json" --out "$out" || status=1
else
  echo "== torch_compare skipped: python3 with torch and a CUDA device not found"
fi
echo "run.sh: exit $status (results in $out)"
exit "$status"
