#!/usr/bin/env bash
# test_install.sh BUILD_DIR SOURCE_DIR -- installs attnjit into a temporary
# prefix, builds tests/install/consumer.c against it with find_package
# (shared and static) and with pkg-config, and runs each; runs the
# installed CLI.
set -euo pipefail
build=$1 src=$2
prefix=$(mktemp -d)
trap 'rm -rf "$prefix"' EXIT
passed=0 failed=0
step() {  # step NAME COMMAND...: runs a step, counting it
  local name=$1; shift
  if "$@"; then passed=$((passed + 1)); echo "ok: $name"
  else failed=$((failed + 1)); echo "FAIL: $name"; fi
}
step "cmake --install" cmake --install "$build" --prefix "$prefix" >/dev/null
for f in include/attnjit/attnjit.h lib/libattnjit.a lib/libattnjit.so.0 bin/attnjit \
         lib/cmake/attnjit/attnjitConfig.cmake lib/cmake/attnjit/attnjitConfigVersion.cmake \
         lib/pkgconfig/attnjit.pc; do
  step "installed $f" test -e "$prefix/$f"
done
step "installed CLI runs" "$prefix/bin/attnjit" info

consumer=$prefix/consumer
step "find_package(attnjit): configure" cmake -S "$src/tests/install" -B "$consumer" \
  -DCMAKE_PREFIX_PATH="$prefix" -DCMAKE_BUILD_TYPE=Release
step "find_package(attnjit): build" cmake --build "$consumer"
step "find_package: attnjit::attnjit runs" "$consumer/consumer_shared"
step "find_package: attnjit::attnjit_static runs" "$consumer/consumer_static"
step "the shared consumer loads the installed libattnjit.so.0" \
  bash -c "ldd '$consumer/consumer_shared' | grep -q '$prefix/lib/libattnjit.so.0'"

export PKG_CONFIG_PATH=$prefix/lib/pkgconfig
step "pkg-config --modversion" test "$(pkg-config --modversion attnjit)" = "$(
  sed -n 's/^project(attnjit VERSION \([0-9.]*\).*/\1/p' "$src/CMakeLists.txt")"
# shellcheck disable=SC2046
step "pkg-config: build" cc -std=c11 -o "$prefix/consumer_pc" "$src/tests/install/consumer.c" \
  $(pkg-config --cflags --libs attnjit) -lm -Wl,-rpath,"$prefix/lib"
step "pkg-config: runs" "$prefix/consumer_pc"
echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
