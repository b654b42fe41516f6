#!/usr/bin/env bash
# test_exports.sh LIB HEADER -- libattnjit.so exports exactly the functions
# attnjit.h declares (nothing of LLVM, nothing internal), all of them
# defined, and carries the SONAME libattnjit.so.0.
set -euo pipefail
lib=$1 header=$2
fail=0
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
soname=$(objdump -p "$lib" | awk '$1 == "SONAME" {print $2}')
if [ "$soname" != libattnjit.so.0 ]; then
  echo "FAIL: SONAME is '$soname', want libattnjit.so.0"; fail=1
fi
# declarations start at column 0: "aj_status aj_forward(", "const char *aj_x("
grep -oE '^[A-Za-z_][A-Za-z0-9_ ]*[ *]aj_[a-z0-9_]+\(' "$header" |
  grep -oE 'aj_[a-z0-9_]+\($' | tr -d '(' | sort -u > "$tmp/declared"
nm -D --defined-only "$lib" | awk '{print $NF}' | sed 's/@.*//' | sort -u > "$tmp/exported"
extra=$(comm -13 "$tmp/declared" "$tmp/exported")
missing=$(comm -23 "$tmp/declared" "$tmp/exported")
if [ -n "$extra" ]; then
  echo "FAIL: exported but not declared in attnjit.h:"; echo "$extra" | head -20; fail=1
fi
if [ -n "$missing" ]; then
  echo "FAIL: declared in attnjit.h but not exported:"; echo "$missing"; fail=1
fi
n=$(wc -l < "$tmp/declared")
if [ "$n" -lt 50 ]; then
  echo "FAIL: only $n declarations found in $header"; fail=1
fi
undefined_llvm=$(nm -D --defined-only "$lib" | grep -c -E ' (LLVM|_ZN4llvm)' || true)
if [ "$undefined_llvm" -ne 0 ]; then
  echo "FAIL: $undefined_llvm LLVM symbols exported"; fail=1
fi
if [ $fail -eq 0 ]; then
  echo "$n functions exported, as declared; SONAME $soname"
  echo "1 passed, 0 failed"
else
  echo "0 passed, 1 failed"
fi
exit $fail
