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

echo
echo "== ring attention on 2 CPU ranks (zigzag shards, K/V rotating over MPI),"
echo "   forward and backward, checked against the same op on one rank"
spec=$root/examples/ring/causal_f16_d64.aj
for t in q:1 k:2 v:3 do:4; do
  perl "$root/scripts/npy_random.pl" "$out/${t%%:*}.npy" "${t##*:}" 1 4 1024 64
done
# mpirun refuses root unless told; 2 ranks on 2 cores need no oversubscription,
# but more ranks than cores do
OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1 \
OMPI_MCA_mpi_yield_when_idle=1 mpirun -np 2 "$aj" ring "$spec" --device cpu --layout zigzag \
  --in q="$out/q.npy" --in k="$out/k.npy" --in v="$out/v.npy" --out o="$out/o.npy" \
  --grad --in do="$out/do.npy" --out dq="$out/dq.npy" --check --workers 1
