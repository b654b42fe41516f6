#!/usr/bin/env bash
# test_cli_ring.sh MPIEXEC ATTNJIT ROOT FAKE_CUDA_DIR FAKE_NCCL -- `attnjit
# ring` under mpirun: a 2-rank zigzag ring, forward and backward, on sim and
# on cpu, checked by --check against the same op run on one rank; the ring
# and Ulysses on 3 ranks over lengths that do not split; on cuda over the
# stand-in libcuda (tests/fake_cuda) and libnccl, its launches emulated; and
# its error messages.  ~40 s.
set -uo pipefail
mpiexec=$1 aj=$2 root=$3 fake_cuda=$4 fake_nccl=$5
spec=$root/examples/ring/causal_f16_d64.aj
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
cd "$dir"
fails=0
for t in q:1 k:2 v:3 do:4; do
  perl "$root/scripts/npy_random.pl" "${t%%:*}.npy" "${t##*:}" 1 2 32 64
done
io=(--in q=q.npy --in k=k.npy --in v=v.npy)

# run_ring RANKS ARGS... -- `attnjit ring ARGS` on RANKS ranks: its output in
# out.txt, its exit code in rc
run_ring() {
  local ranks=$1
  shift
  "$mpiexec" -n "$ranks" "$aj" ring "$@" >out.txt 2>&1
  rc=$?
}

# want EXIT_CODE "message substring" -- the last command's result
want() {
  if [ "$rc" -ne "$1" ] || ! grep -qF -- "$2" out.txt; then
    echo "FAIL (line ${BASH_LINENO[0]}): exit $rc (want $1), output lacks '$2':"
    sed 's/^/  | /' out.txt
    fails=$((fails + 1))
  fi
}

run_ring 2 "$spec" --device sim --layout zigzag --rotate p2p "${io[@]}" \
  --out o=o.npy --out lse=lse.npy --grad --in do=do.npy --out dq=dq.npy --out dk=dk.npy \
  --out dv=dv.npy --check --workers 1
want 0 "of the tolerance: match"
want 0 "ring: 2 ranks, zigzag, p2p, forward + backward, on sim over MPI"
for f in o lse dq dk dv; do
  [ -s $f.npy ] || { echo "FAIL: $f.npy not written"; fails=$((fails + 1)); }
done
# P-1 forward and 2P-1 backward rotations on each rank
[ "$(grep -cE '^ +[01] .* 1 +[0-9]+ +[0-9]+ +[0-9-]+%?$' out.txt)" -eq 2 ] ||
  { echo "FAIL: forward rows with 1 rotation:"; cat out.txt; fails=$((fails + 1)); }

run_ring 2 "$spec" --device sim --rotate allgather "${io[@]}" --out o=o2.npy \
  --check --workers 1
want 0 "o 0"
[ -s o2.npy ] || { echo "FAIL: o2.npy not written"; fails=$((fails + 1)); }

# the cpu device: native kernels on each rank, forward and backward, zigzag,
# checked against one rank on the same device
run_ring 2 "$spec" --device cpu --layout zigzag "${io[@]}" --out o=o3.npy \
  --grad --in do=do.npy --out dq=dq3.npy --check --workers 1
want 0 "of the tolerance: match"
want 0 "ring: 2 ranks, zigzag, p2p, forward + backward, on "
[ -s o3.npy ] && [ -s dq3.npy ] || { echo "FAIL: cpu ring outputs not written"; fails=$((fails + 1)); }

# side tensors (whole on every rank): a document mask and a relative bias
# table, forward and backward, against one rank; -v prints each launch's tiles
perl "$root/scripts/npy_docs.pl" doc.npy 1 32 5
perl "$root/scripts/npy_random.pl" rel.npy 5 2 65
run_ring 2 "$root/examples/specs/scores/document_mask.aj" --device sim \
  --layout zigzag "${io[@]}" --in doc=doc.npy --out o=o4.npy --grad --in do=do.npy \
  --out dq=dq4.npy --check --workers 1 -v
want 0 "of the tolerance: match"
want 0 "rank 1 launch 0: tiles of "
run_ring 2 "$root/examples/specs/scores/t5_relative_bias.aj" --device cpu "${io[@]}" \
  --in rel=rel.npy --out o=o5.npy --grad --in do=do.npy --out dk=dk5.npy --check \
  --workers 1
want 0 "of the tolerance: match"
# the table as bf16 (the .npy rounded to it), broadcast to the ranks in its
# 2-byte elements
run_ring 2 "$root/examples/specs/scores/t5_relative_bias_bf16.aj" --device cpu "${io[@]}" \
  --in rel=rel.npy --out o=o6.npy --grad --in do=do.npy --out dk=dk6.npy --check \
  --workers 1
want 0 "of the tolerance: match"
run_ring 1 "$root/examples/specs/scores/document_mask.aj" --device sim "${io[@]}" \
  --out o=o.npy
want 1 "the op declares tensors = (doc: i32[2] ...); give --in doc=FILE"
run_ring 1 "$root/examples/specs/scores/document_mask.aj" --device sim "${io[@]}" \
  --in doc=doc.npy --in dok=doc.npy --out o=o.npy
want 1 "unknown tensor 'dok': not one of ring's (q, k, v, do, alibi_slopes) nor a side tensor"
run_ring 1 "$root/examples/specs/scores/document_mask.aj" --device sim "${io[@]}" \
  --in doc=rel.npy --out o=o.npy
want 2 "doc (i32[2]): rel.npy: dtype '<f4' is not int32"
# cuda, on the stand-in libcuda with 2 GPUs and the stand-in libnccl: the
# stand-in rejects a copy whose device side is host memory, faults a kernel
# handed host memory, and logs which GPU each rank opened (rank r opens GPU
# r; the ring and the --check run hand the device only device memory);
# AJ_CUDA_EMULATE=1 runs every launch again on the emulator over the same
# buffers, so the NCCL ring's numbers are checked like sim's
LD_LIBRARY_PATH=$fake_cuda FAKE_CUDA_MODE=gpu FAKE_CUDA_GPUS=2 FAKE_CUDA_LOG=$dir/cuda \
  AJ_CUDA_EMULATE=1 AJ_NCCL_LIBRARY=$fake_nccl \
  "$mpiexec" -n 2 "$aj" ring "$spec" --device cuda --layout zigzag "${io[@]}" \
  --out o=o6.npy --grad --in do=do.npy --out dq=dq6.npy --check >out.txt 2>&1
rc=$?
# (--device cuda talks over NCCL by default: the resident ring)
want 0 "ring: 2 ranks, zigzag, p2p, forward + backward, on Fake GPU H200 over NCCL"
want 0 "of the tolerance: match"
cat "$dir"/cuda.* >cuda.txt 2>/dev/null
for gpu in 0 1; do
  grep -q "DevicePrimaryCtxRetain dev=$gpu" cuda.txt ||
    { echo "FAIL: no rank opened GPU $gpu:"; grep DevicePrimary cuda.txt; fails=$((fails + 1)); }
done
if grep -E "FAULT|REJECTED|RACE" cuda.txt; then
  echo "FAIL: host memory handed to the GPU, or a stream-order race (above)"
  fails=$((fails + 1))
fi
# the stand-in's stream-order model catches a resident ring with one wait
# left out (AJ_TEST_RING_SKIP_WAIT: the engine's stream no longer waits for
# the ring's event), both ways: the K/V transfer's (3 ranks: a send reads
# the block still being packed, RAW; a receive overwrites the block an
# earlier step's kernels read, WAR) and the dK/dV transfer's (a send reads
# the accumulator the row kernel writes, RAW; a receive overwrites the one
# it reads, WAR); on the stand-in the numbers still match
for skip in "K/V:3" "dK/dV:2"; do
  IFS=: read -r what ranks <<<"$skip"
  rm -f "$dir"/race.*
  AJ_TEST_RING_SKIP_WAIT=$what LD_LIBRARY_PATH=$fake_cuda FAKE_CUDA_MODE=gpu FAKE_CUDA_GPUS=3 \
    FAKE_CUDA_LOG=$dir/race AJ_CUDA_EMULATE=1 AJ_NCCL_LIBRARY=$fake_nccl \
    "$mpiexec" -n "$ranks" "$aj" ring "$spec" --device cuda --comm nccl --layout zigzag \
    "${io[@]}" --out o=o7.npy --grad --in do=do.npy --out dq=dq7.npy >out.txt 2>&1
  rc=$?
  want 0 "ring: $ranks ranks, zigzag, p2p, forward + backward"
  for kind in RAW WAR; do
    grep -q "RACE $kind" "$dir"/race.* ||
      { echo "FAIL: no RACE $kind with the $what wait left out:"; grep -h RACE "$dir"/race.* | head;
        fails=$((fails + 1)); }
  done
done

run_ring 1 "$spec" --device tpu "${io[@]}" --out o=o.npy
want 1 "--device takes sim, cpu or cuda, not 'tpu'"
run_ring 1 "$spec" --device sim --comm gloo "${io[@]}" --out o=o.npy
want 1 "--comm takes mpi or nccl, not 'gloo'"

# any length: 32 positions over 3 ranks (shards of 11, 11, 10), the ring
run_ring 3 "$spec" --device cpu "${io[@]}" --out o=o7.npy --grad \
  --in do=do.npy --out dk=dk7.npy --check --workers 1
want 0 "of the tolerance: match"
want 0 "ring: 3 ranks, contiguous, p2p, forward + backward, on "

# packed documents (layout = varlen): lengths 5, 1, 13, 2, 3 (T = 24), the
# ring (each document cut head-tail over the ranks), Ulysses (the packed
# axis) and hybrid with U = 1 (the ring's cut, the ring across the two
# groups), forward and backward against one rank
perl "$root/scripts/npy_docs.pl" cu.npy --offsets 5 1 13 2 3
for t in q:31 k:32 v:33 do:34; do
  perl "$root/scripts/npy_random.pl" "p${t%%:*}.npy" "${t##*:}" 24 2 64
done
packed=("$root/examples/ring/causal_varlen_f16_d64.aj" --device cpu --in q=pq.npy --in k=pk.npy
        --in v=pv.npy --in cu_seqlens_q=cu.npy --in cu_seqlens_k=cu.npy --grad --in do=pdo.npy
        --out o=po.npy --out lse=plse.npy --out dk=pdk.npy --check --workers 1)
for method in ring ulysses "hybrid --ulysses-size 1"; do
  run_ring 2 "${packed[@]}" --method $method --layout zigzag
  want 0 "of the tolerance: match"
  want 0 "ring: 2 ranks, "
done
run_ring 1 "$root/examples/ring/causal_varlen_f16_d64.aj" --device cpu \
  --in q=pq.npy --in k=pk.npy --in v=pv.npy --out o=o.npy
want 1 "a layout = varlen op needs --in cu_seqlens_q=FILE and --in cu_seqlens_k=FILE"

# A forward + backward on $3 ranks, --check against one rank, over random
# q, k, v, do (files $1q.npy ..., $2 positions, "name:seed:heads" ... in $4)
# with the rest of the arguments.
cp_check() {
  local prefix=$1 len=$2 ranks=$3 tensors=$4
  shift 4
  for t in $tensors; do
    IFS=: read -r name seed heads <<<"$t"
    perl "$root/scripts/npy_random.pl" "$prefix$name.npy" "$seed" 1 "$heads" "$len" 64
  done
  run_ring "$ranks" "$spec" --device cpu "$@" --in q="${prefix}q.npy" \
    --in k="${prefix}k.npy" --in v="${prefix}v.npy" --out o="${prefix}o.npy" --grad \
    --in do="${prefix}do.npy" --out dq="${prefix}dq.npy" --out dk="${prefix}dk.npy" \
    --out dv="${prefix}dv.npy" --check --workers 1
}

# Ulysses: any length (31 over 3 ranks, zigzag: shards of 11, 10, 10), the
# heads (6, GQA 6:3) split over the ranks, forward and backward against one rank
cp_check u 31 3 "q:21:6 k:22:3 v:23:3 do:24:6" --method ulysses --layout zigzag
want 0 "of the tolerance: match"
want 0 "ring: 3 ranks, ulysses, zigzag, all-to-all, forward + backward, on "
run_ring 3 "$spec" --device cpu --method ulysses "${io[@]}" --out o=o.npy
want 2 "method = ulysses over 3 ranks needs the key/value heads (2) to divide by 3"
# hybrid: 4 ranks as 2 Ulysses groups of 2 and a ring of 2 across them, 30
# positions (zigzag chunks of 4 and 3), GQA 4:2, against one rank
cp_check h 30 4 "q:31:4 k:32:2 v:33:2 do:34:4" --method hybrid --ulysses-size 2 \
  --layout zigzag
want 0 "of the tolerance: match"
want 0 "ring: 4 ranks, hybrid (2 groups of 2), zigzag, all-to-all + p2p, forward + backward, on "
run_ring 2 "$spec" --device cpu --method hybrid "${io[@]}" --out o=o.npy
want 2 "ulysses_size = 0 over 2 ranks; method = hybrid takes the size U of its Ulysses groups"
run_ring 1 "$spec" --device cpu --method tree "${io[@]}"
want 1 "--method takes ring, ulysses or hybrid, not 'tree'"

run_ring 2 "$spec" --device sim --layout zigzag "${io[@]}" --out o=o.npy \
  --grad --out dq=dq.npy
want 1 "--grad needs --in do=FILE"

run_ring 1 "$spec" --device sim --layout diagonal "${io[@]}"
want 1 "--layout takes contiguous or zigzag, not 'diagonal'"

run_ring 1 "$spec" --device sim "${io[@]}" --seed -3
want 1 "--seed takes a non-negative integer"

run_ring 1 "$spec" --device sim --in q=missing.npy --in k=k.npy \
  --in v=v.npy
want 2 "q: missing.npy"

if [ $fails -ne 0 ]; then
  echo "$fails failed"
  exit 1
fi
echo "all passed"
