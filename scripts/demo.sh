#!/usr/bin/env bash
# The attnjit demo: describe an attention op in text, get a kernel for an
# H100-class GPU in milliseconds, and (where ptxas exists) see NVIDIA's
# assembler accept it.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${1:-$root/build}
aj="$build/attnjit"
spec="$root/examples/specs/efficient_fwd_bf16_d128_causal.aj"
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT

echo "== attnjit info"
"$aj" info
echo
echo "== the op ($spec)"
cat "$spec"
echo
echo "== attnjit check: canonical form and cache hash"
"$aj" check "$spec"
echo
echo "== attnjit compile --target sm_90 (launch contract on stderr)"
start=$(date +%s%N)
"$aj" compile "$spec" --target sm_90 -o "$out/kernel.ptx" -v
end=$(date +%s%N)
echo "wrote $(wc -l < "$out/kernel.ptx") lines of PTX in $(( (end - start) / 1000000 )) ms (whole process)"
grep -m3 -E '^\.(version|target|visible)' "$out/kernel.ptx" || true

ptxas=$(command -v ptxas || true)
[ -n "$ptxas" ] || { [ -x /usr/local/cuda/bin/ptxas ] && ptxas=/usr/local/cuda/bin/ptxas; }
echo
if [ -n "$ptxas" ]; then
  echo "== ptxas -arch=sm_90 -v"
  "$ptxas" -arch=sm_90 -v -o "$out/kernel.cubin" "$out/kernel.ptx" 2>&1 | sed 's/^/  /'
else
  echo "== ptxas not found: skipping assembly (install the CUDA toolkit to see it)"
fi

echo
echo "== no GPU here? the same kernel IR, lowered for the host, on the SIMT emulator"
echo "   (examples/forward_sim.c: builder API -> compile for sim -> aj_forward -> check)"
"$build/forward_sim"
