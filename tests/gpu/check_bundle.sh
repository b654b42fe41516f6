#!/usr/bin/env bash
# check_bundle.sh BUNDLE_DIR -- the GPU bundle scripts/gpu-bundle.sh made
# can be carried to a GPU machine and started there:
#   - the folder is at most 48 MiB (what a device run carries is 64 MiB);
#   - attnjit-gpu needs no glibc symbol version newer than 2.31 (objdump -T)
#     and no library beyond libc, libm, libpthread, libdl, libgcc_s and the
#     loader (no libLLVM, libstdc++, libmpi, libzstd);
#   - run.sh on a machine without a GPU (CUDA_VISIBLE_DEVICES hides one)
#     says "no GPU", exits 77 and leaves a valid results.json, within 30 s.
set -uo pipefail
dir=${1:?usage: check_bundle.sh BUNDLE_DIR}
fail=0
bad() { echo "check_bundle: FAIL: $*"; fail=1; }

bytes=$(du -sb "$dir" | cut -f1)
limit=$((48 * 1048576))
[ "$bytes" -le "$limit" ] || bad "$dir is $bytes bytes, over 48 MiB"
echo "check_bundle: $dir is $((bytes / 1048576)) MiB ($bytes bytes; limit 48 MiB)"

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
gzip -dc "$dir/attnjit-gpu.gz" > "$tmp/attnjit-gpu" || bad "cannot unpack attnjit-gpu.gz"
newest=$(objdump -T "$tmp/attnjit-gpu" | grep -o 'GLIBC_[0-9][0-9.]*' | sort -uV | tail -n 1)
echo "check_bundle: attnjit-gpu ($(stat -c %s "$tmp/attnjit-gpu") bytes unpacked) needs glibc up to $newest"
if [ "$(printf '%s\n%s\n' "$newest" GLIBC_2.31 | sort -V | tail -n 1)" != GLIBC_2.31 ]; then
  bad "attnjit-gpu needs $newest:"
  objdump -T "$tmp/attnjit-gpu" | grep -E 'GLIBC_2\.(3[2-9]|[4-9][0-9])'
fi
needed=$(objdump -p "$tmp/attnjit-gpu" | awk '/NEEDED/ { print $2 }')
echo "check_bundle: needs $(echo $needed)"
for lib in $needed; do
  case $lib in
    libc.so.6|libm.so.6|libpthread.so.0|libdl.so.2|libgcc_s.so.1|ld-linux-x86-64.so.2) ;;
    *) bad "attnjit-gpu needs $lib, which a GPU image may lack" ;;
  esac
done

t0=$(date +%s)
OUT=$tmp/out CUDA_VISIBLE_DEVICES= timeout 60 "$dir/run.sh" > "$tmp/run.log" 2>&1
rc=$?
took=$(($(date +%s) - t0))
echo "check_bundle: run.sh without a GPU: exit $rc in $took s: $(grep -m1 'no GPU' "$tmp/run.log")"
[ "$rc" -eq 77 ] || { bad "run.sh exited $rc, not 77"; cat "$tmp/run.log"; }
[ "$took" -le 30 ] || bad "run.sh took $took s to see there is no GPU"
grep -q 'no GPU' "$tmp/run.log" || bad "run.sh did not say 'no GPU'"
python3 -c 'import json, sys; r = json.load(open(sys.argv[1])); assert r["steps"][-1]["status"] == "skipped"' \
  "$tmp/out/results.json" || bad "results.json is not valid, or its last step is not 'skipped'"
[ $fail -eq 0 ] && echo "check_bundle: ok"
exit $fail
