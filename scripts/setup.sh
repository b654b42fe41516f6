#!/usr/bin/env bash
# attnjit set-up: installs what is missing (Debian 12, as root), configures,
# builds, then runs the demo or the tests.
#
#   scripts/setup.sh demo    build everything and run the demo
#   scripts/setup.sh test    build everything and run the test suite, the Python
#                            package's tests (in a virtual environment it makes),
#                            then the unit and numeric tests again under ASan + UBSan,
#                            and the thread tests under ThreadSanitizer
#
# Idempotent: packages already present are not reinstalled and the build
# directory is reused.  Without root, it prints the apt-get line to run.
set -euo pipefail

mode=${1:-}
case "$mode" in
  demo|test) ;;
  *) echo "usage: $0 demo|test" >&2; exit 1 ;;
esac

root=$(cd "$(dirname "$0")/.." && pwd)
build=${AJ_BUILD_DIR:-$root/build}
packages=(cmake make gcc g++ llvm-19-dev libzstd-dev zlib1g-dev libxxhash-dev
          libopenmpi-dev openmpi-bin pkg-config python3 python3-venv)

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  if [ "$(id -u)" -ne 0 ]; then
    echo "attnjit needs these Debian packages; as root, run:" >&2
    echo "  apt-get update && apt-get install -y ${missing[*]}" >&2
    exit 1
  fi
  echo "== installing: ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -q
  apt-get install -y -q --no-install-recommends "${missing[@]}"
fi

jobs=$(nproc 2>/dev/null || echo 2)
elapsed() { printf '%dm%02ds' $((SECONDS / 60)) $((SECONDS % 60)); }
if [ "$mode" = test ]; then
  # The tests' virtual environment (the Python tests', below); first,
  # ptxas: the PTX checks (sm_80, sm_90, sm_90a, Blackwell's sm_100 and
  # sm_120) and `attnjit audit` run, never skip, in this command (issue
  # #30).  The CUDA toolkit's ptxas and nvdisasm where they are installed,
  # else NVIDIA's from the Python package index (nvidia-cuda-nvcc-cu12, 12.8
  # or newer for sm_120; nvidia-cuda-nvdisasm) in the environment.
  venv=$build/venv
  [ -x "$venv/bin/python" ] || python3 -m venv "$venv"
  pip=("$venv/bin/python" -m pip install -q --disable-pip-version-check)
  if [ -z "${AJ_PTXAS:-}" ] && ! command -v ptxas >/dev/null &&
     [ ! -x /usr/local/cuda/bin/ptxas ]; then
    echo "== ptxas from the Python package index ($(elapsed))"
    "${pip[@]}" "nvidia-cuda-nvcc-cu12>=12.8"
    AJ_PTXAS=$(ls "$venv"/lib/python3*/site-packages/nvidia/cuda_nvcc/bin/ptxas | head -n 1)
    export AJ_PTXAS
  fi
  # ... and nvdisasm, which `attnjit audit` reads the SASS with
  if [ -z "${AJ_NVDISASM:-}" ] && ! command -v nvdisasm >/dev/null &&
     [ ! -x /usr/local/cuda/bin/nvdisasm ]; then
    echo "== nvdisasm from the Python package index ($(elapsed))"
    "${pip[@]}" nvidia-cuda-nvdisasm
    AJ_NVDISASM=$(find "$venv"/lib/python3*/site-packages/nvidia -name nvdisasm -type f | head -n 1)
    export AJ_NVDISASM
  fi
  # The Python tests' packages download and install while the C code
  # builds and its tests run (the wait is before the Python tests).
  echo "== the Python tests' packages, in the background ($build/pip.log)"
  "${pip[@]}" torch pytest pytest-xdist numpy hypothesis transformers jax \
    > "$build/pip.log" 2>&1 &
  pip_job=$!
  trap 'kill "$pip_job" 2>/dev/null || true' EXIT   # a failed step ends it too
fi
echo "== configuring and building in $build"
cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DAJ_WERROR=ON >/dev/null
cmake --build "$build" -j"$jobs"

if [ "$mode" = demo ]; then
  exec "$root/scripts/demo.sh" "$build"
fi
export AJ_REQUIRE_PTXAS=1
echo "== running the tests ($(elapsed))"
ctest --test-dir "$build" --output-on-failure -j"$jobs"

# The Python package (docs/python.md): the virtual environment with torch
# from the Python package index (its CUDA wheels: the index has no
# CPU-only build), the package installed by `pip install .` (which builds
# libattnjit.so.0 with CMake), then its tests.
echo "== the Python package in $venv ($(elapsed))"
wait "$pip_job" || { cat "$build/pip.log"; echo "pip install failed" >&2; exit 1; }
CMAKE_BUILD_PARALLEL_LEVEL=$jobs "${pip[@]}" --config-settings=build-dir="$build/python-build" "$root"
# attnjit.jax's XLA FFI handler (docs/jax.md), built against the installed
# jaxlib's headers; its tests must run (AJ_REQUIRE_JAX), not skip
jax_include=$("$venv/bin/python" -c 'import jax.ffi; print(jax.ffi.include_dir())')
cmake -S "$root" -B "$build" -DAJ_JAX_FFI_INCLUDE="$jax_include" >/dev/null
cmake --build "$build" -j"$jobs" --target attnjit_jax
export AJ_JAX_LIBRARY="$build/libattnjit_jax.so" AJ_REQUIRE_JAX=1
# one pytest worker per core (pytest-xdist), each test file on one worker;
# the workers and the ranks their tests spawn share one fresh disk cache, so
# a kernel is compiled once (docs/api.md "The kernel cache": its lock)
rm -rf "$build/cache-python"
(cd "$build" && AJ_CACHE=disk AJ_CACHE_DIR="$build/cache-python" \
   "$venv/bin/python" -m pytest -q -n "$jobs" --dist loadfile "$root/tests/python")

# The same unit and numeric tests again under AddressSanitizer (with
# LeakSanitizer) and UndefinedBehaviorSanitizer: any report fails the run.
# Tests labelled `long` (the cpu kernels' large matrices, rings of 3 and 4
# oversubscribed ranks) and `cpu_isa` (the cpu tests again with the host's
# features masked, which changes only the JIT-compiled code) are left to the
# pass above: their host code is the same as that of the tests the
# sanitizers do run, and JIT-compiled kernels carry no sanitizer
# instrumentation anyway.  For the same reason the numeric tests' case
# runners run about one case in sixteen here, a hashed pick (AJ_TEST_SAMPLE,
# tests/lib/check.h; the first case always): each runner's host code is
# shared by all its cases, and the pass above ran them all.
asan=${AJ_ASAN_BUILD_DIR:-$root/build-asan}
echo "== building with AJ_SANITIZE=ON in $asan ($(elapsed))"
# (-g1: line tables for the reports' stacks, not the variables; a fifth
# faster to build)
cmake -S "$root" -B "$asan" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DAJ_WERROR=ON -DAJ_SANITIZE=ON \
      -DAJ_BUILD_BENCH=OFF -DCMAKE_C_FLAGS_RELWITHDEBINFO="-O2 -g1 -DNDEBUG" >/dev/null
cmake --build "$asan" -j"$jobs"
echo "== running the unit and numeric tests under the sanitizers ($(elapsed))"
ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
  AJ_TEST_SAMPLE=16 ctest --test-dir "$asan" --output-on-failure -j"$jobs" -L "unit|numeric" \
  -LE "long|cpu_isa"

# The thread tests again under ThreadSanitizer (docs/api.md "Threads"):
# many threads compiling and launching on one context and device, and a
# comm's watchdog thread beside the calls it watches (asynchronous ring
# calls on the stand-in GPUs).  Only their targets are built; any report
# fails the run.  LLVM's own library is not instrumented, so its internal
# locks are not followed (tests/lib/tsan.supp).
tsan=${AJ_TSAN_BUILD_DIR:-$root/build-tsan}
echo "== the thread tests under ThreadSanitizer in $tsan ($(elapsed))"
cmake -S "$root" -B "$tsan" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DAJ_WERROR=ON -DAJ_TSAN=ON \
      -DAJ_BUILD_BENCH=OFF >/dev/null
cmake --build "$tsan" -j"$jobs" --target test_threads test_gpu_path fake_nccl fake_cuda_normal
TSAN_OPTIONS="halt_on_error=1:suppressions=$root/tests/lib/tsan.supp" \
  ctest --test-dir "$tsan" --output-on-failure -L threads
echo "== done in $(elapsed)"
