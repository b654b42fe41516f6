#!/usr/bin/env bash
# run.sh -- the one-shot GPU check.  scripts/gpu-bundle.sh copies it into
# build-gpu/ beside attnjit-gpu.gz (the checks, LLVM linked in), the example
# specs and torch_compare.py; on a machine with an NVIDIA GPU:
#
#   build-gpu/run.sh [--quick]
#
# Every step is a process of its own under its own timeout (a kernel fault
# leaves a CUDA context unusable: it must not take the other checks with
# it), and the whole run stays within 540 s: a step never gets more than
# its timeout below or what is left of 515 s (the timeouts add up to more:
# the last steps give way when the earlier ones run long), and the two
# probes for torch between steps take at most 20 s each.  --quick (fewer
# cases and shapes per step) gives the steps 190 s in all, so that it ends
# within 4 minutes and a 15-minute device loan leaves room to run it again.  After each
# step $OUT/results.json (OUT defaults to build-gpu/results) is rewritten
# whole: the steps so far with status, exit code, seconds, the step's own
# JSON and its log's tail; the logs and markdown tables lie beside it.
# Without a GPU it says so and exits 77 within seconds.
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
out=${OUT:-$here/results}
mkdir -p "$out"
quick=()
[ "${1:-}" = --quick ] && quick=(--quick)
budget=515
[ ${#quick[@]} -gt 0 ] && budget=190
t_start=$(date +%s)
results=$out/results.json
steps=()
failed=0

# a shell string as the body of a JSON string
json_str() {
  tr -d '\000-\010\013\014\016-\037' | sed -e 's/\\/\\\\/g' -e 's/"/\\"/g' -e 's/\t/\\t/g' |
    awk '{ printf "%s\\n", $0 }'
}

# whether file $1 holds one whole JSON value (python3's parser where there
# is one, else: non-empty and ends with a closing brace)
json_ok() {
  [ -s "$1" ] || return 1
  if command -v python3 >/dev/null 2>&1; then
    python3 -c 'import json, sys; json.load(open(sys.argv[1]))' "$1" 2>/dev/null
  else
    [ "$(tr -d ' \n\t' < "$1" | tail -c 1)" = "}" ]
  fi
}

write_results() {
  {
    printf '{"bundle": "attnjit-gpu", "elapsed_s": %d, "steps": [\n' $(($(date +%s) - t_start))
    local i
    for i in "${!steps[@]}"; do
      [ "$i" -gt 0 ] && printf ',\n'
      printf '%s' "${steps[$i]}"
    done
    printf '\n]}\n'
  } > "$results.tmp" && mv "$results.tmp" "$results"
}

# step NAME LIMIT_S RESULT_JSON COMMAND...: runs COMMAND with its output in
# $out/NAME.log; records it.  Returns the command's exit status.
step() {
  local name=$1 limit=$2 result=$3
  shift 3
  local left=$((budget - ($(date +%s) - t_start)))
  [ "$limit" -gt "$left" ] && limit=$left
  local log=$out/$name.log rc status t0 t1 res
  if [ "$limit" -lt 5 ]; then
    echo "== $name: skipped, the run's $budget s are spent"
    rc=124
    : > "$log"
  else
    echo "== $name (at most ${limit} s)"
    t0=$(date +%s.%N)
    timeout -k 5 "$limit" "$@" > "$log" 2>&1
    rc=$?
    t1=$(date +%s.%N)
    tail -n 40 "$log"
  fi
  case $rc in
    0) status=passed ;;
    77) status=skipped ;;
    124|137) status=timeout ;;
    *) if [ "$rc" -gt 128 ]; then status="crashed (signal $((rc - 128)))"; else status=failed; fi ;;
  esac
  res=null
  [ -n "$result" ] && json_ok "$result" && res=$(cat "$result")
  steps+=("{\"step\": \"$name\", \"status\": \"$status\", \"exit\": $rc, \"seconds\": $(awk -v a="${t0:-0}" -v b="${t1:-0}" 'BEGIN { printf "%.1f", b - a }'), \"result\": $res, \"log_tail\": \"$(tail -n 30 "$log" | json_str)\"}")
  write_results
  case $status in passed|skipped) ;; *) failed=1 ;; esac
  return "$rc"
}

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
bin=$tmp/attnjit-gpu
if [ -f "$here/attnjit-gpu.gz" ]; then
  gzip -dc "$here/attnjit-gpu.gz" > "$bin" && chmod +x "$bin"
elif [ -x "$here/attnjit-gpu" ]; then
  cp "$here/attnjit-gpu" "$bin"
fi
if [ ! -x "$bin" ]; then
  echo "run.sh: no attnjit-gpu beside me: run scripts/gpu-bundle.sh first" >&2
  exit 2
fi

if command -v nvidia-smi >/dev/null 2>&1; then
  step nvidia_smi 10 "" nvidia-smi
  cp "$out/nvidia_smi.log" "$out/nvidia-smi.txt"
fi

# the first GPU step also says whether there is a GPU at all
step efficient_fwd 40 "$out/gpu_check_efficient_fwd.json" \
  "$bin" check --family efficient_fwd --out "$out" "${quick[@]}"
if [ $? -eq 77 ]; then
  echo "run.sh: no GPU: $(grep -m1 SKIP "$out/efficient_fwd.log")"
  exit 77
fi
step flash_fwd 40 "$out/gpu_check_flash_fwd.json" \
  "$bin" check --family flash_fwd --out "$out" "${quick[@]}"
# the Hopper (sm_90a) template beside the mma.sync one: passes as skipped
# on other GPUs
step wgmma_fwd 30 "$out/gpu_check_wgmma_fwd.json" \
  "$bin" check --family wgmma_fwd --out "$out" "${quick[@]}"
# FP8 inputs: the efficient kernel, and the FP8 tensor-core one on 8.9 / 9.0
step fp8 30 "$out/gpu_check_fp8.json" "$bin" check --family fp8 --out "$out" "${quick[@]}"
step paged 30 "$out/gpu_check_paged.json" \
  "$bin" check --family paged --out "$out" "${quick[@]}"
step backward 45 "" "$bin" backward cuda
step flash_bwd 55 "" "$bin" flash-bwd cuda
step bench 95 "$out/gpu_check_bench.json" "$bin" check --family bench --out "$out" "${quick[@]}"
step startup 25 "$out/gpu_check_startup.json" \
  "$bin" check --family startup --specs "$here/specs" --out "$out"
step dump 15 "$out/gpu_check_dump.json" \
  "$bin" check --family dump --dump "$out/dump" --out "$out"
# the flash backward's wgmma kernels (schedule warpgroups) on 9.0 GPUs,
# skipped elsewhere; last of the checks, so that --quick's budget goes to
# the timed steps first
step flash_bwd_wgmma 45 "" "$bin" flash-bwd cuda wgmma

# NCCL: the loader's, else the one inside torch's package (nvidia-nccl-cu*)
if [ -z "${AJ_NCCL_LIBRARY:-}" ] && ! ldconfig -p 2>/dev/null | grep -q 'libnccl\.so\.2 '; then
  site=$(timeout 20 python3 -c 'import os, torch; print(os.path.dirname(os.path.dirname(torch.__file__)))' 2>/dev/null)
  for f in "$site"/nvidia/nccl/lib/libnccl.so.2 "$site"/torch/lib/libnccl.so.2; do
    if [ -n "$site" ] && [ -e "$f" ]; then
      export AJ_NCCL_LIBRARY=$f
      break
    fi
  done
fi
echo "NCCL: ${AJ_NCCL_LIBRARY:-libnccl.so.2, from the loader path}"
step ring 30 "$out/ring.json" "$bin" ring --out "$out/ring.json"

if timeout 20 python3 -c 'import torch, numpy; assert torch.cuda.is_available()' 2>/dev/null; then
  step torch_compare 110 "$out/torch_compare.json" python3 "$here/torch_compare.py" "${quick[@]}" \
    --dump "$out/dump" --attnjit "$out/gpu_check_bench.json" --out "$out"
else
  echo "== torch_compare skipped: python3 with torch and a CUDA device not found"
fi
echo "run.sh: $([ $failed -eq 0 ] && echo 'every step passed' || echo 'some steps FAILED') in $(($(date +%s) - t_start)) s (results in $results)"
exit "$failed"
