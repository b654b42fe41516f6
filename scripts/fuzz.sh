#!/usr/bin/env bash
# Builds the libFuzzer targets with clang, AddressSanitizer and UBSan in
# build-fuzz/, and runs each for SECONDS (default 600) from its committed
# seed corpus (tests/fuzz/corpus/NAME), printing the executions.  A crash
# leaves its input in build-fuzz/crashes/ and fails the script.
#
#   scripts/fuzz.sh [SECONDS] [ir|npy|cli ...]
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
seconds=${1:-600}
shift || true
targets=("$@")
[ ${#targets[@]} -gt 0 ] || targets=(ir npy cli)
build=${AJ_FUZZ_BUILD_DIR:-$root/build-fuzz}

command -v clang >/dev/null || { echo "fuzz.sh needs clang and libclang-rt-14-dev (apt-get install clang libclang-rt-14-dev)" >&2; exit 1; }
CC=clang cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DAJ_SANITIZE=ON \
    -DAJ_BUILD_FUZZERS=ON -DAJ_BUILD_TESTS=OFF -DAJ_BUILD_BENCH=OFF >/dev/null
cmake --build "$build" -j"$(nproc 2>/dev/null || echo 2)" --target $(printf 'fuzz_%s ' "${targets[@]}")

mkdir -p "$build/crashes"
status=0
for t in "${targets[@]}"; do
  work="$build/corpus/$t"
  mkdir -p "$work"
  log="$build/fuzz_$t.log"
  echo "== fuzz_$t for ${seconds}s"
  if ! ASAN_OPTIONS=detect_leaks=1 "$build/tests/fuzz/fuzz_$t" -max_total_time="$seconds" -print_final_stats=1 \
       -close_fd_mask=3 -artifact_prefix="$build/crashes/${t}-" -timeout=10 -rss_limit_mb=4096 \
       "$work" "$root/tests/fuzz/corpus/$t" >"$log" 2>&1; then
    echo "fuzz_$t FAILED: see $log and $build/crashes/"; status=1
  fi
  grep -E "stat::number_of_executed_units|stat::peak_rss_mb" "$log" | sed 's/^/  /'
  echo "  corpus: $(ls "$work" | wc -l) inputs"
done
exit $status
