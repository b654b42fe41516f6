#!/usr/bin/env bash
# test_cli.sh -- the attnjit tool's commands, exit codes and messages.
#   test_cli.sh ATTNJIT_BINARY EXAMPLES_DIR
set -u
aj=$1
specs=$2
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
passed=0
failed=0

# expect CODE 'needle on stderr or stdout' -- command...
expect() {
    local want=$1 needle=$2
    shift 2
    "$@" >"$tmp/out" 2>"$tmp/err"
    local got=$?
    if [ "$got" -ne "$want" ]; then
        echo "FAIL: '$*' exited $got, want $want"; sed 's/^/  /' "$tmp/err"
        failed=$((failed + 1)); return
    fi
    if [ -n "$needle" ] && ! grep -qF -- "$needle" "$tmp/out" "$tmp/err"; then
        echo "FAIL: '$*' output lacks '$needle'"; sed 's/^/  /' "$tmp/out" "$tmp/err" | head -20
        failed=$((failed + 1)); return
    fi
    passed=$((passed + 1))
}

causal=$specs/efficient_fwd_bf16_d128_causal.aj
printf 'attention forward efficient {\n  dtype = fp16\n}\n' > "$tmp/bad.aj"
printf 'attention backward flash {\n  dtype = f32\n  head_dim = 64\n}\n' > "$tmp/unsupported.aj"

# usage errors: 1
expect 1 "usage: attnjit" "$aj"
expect 1 "unknown command 'frobnicate'" "$aj" frobnicate
expect 1 "compile needs --target" "$aj" compile "$causal"
expect 1 "compile needs a SPEC" "$aj" compile --target sm_90
expect 1 "unknown target 'sm_75'" "$aj" compile "$causal" --target sm_75
expect 1 "--emit takes ptx, llvm or bc" "$aj" compile "$causal" --target sm_90 --emit sass
expect 1 "unknown option '--fast'" "$aj" compile "$causal" --target sm_90 --fast
expect 1 "-O takes 0, 1, 2 or 3" "$aj" compile "$causal" --target sm_90 -O 9
expect 1 "-o needs a value" "$aj" compile "$causal" --target sm_90 -o
expect 1 "check takes exactly one SPEC" "$aj" check
expect 1 "info takes no arguments" "$aj" info extra
expect 0 "usage: attnjit" "$aj" --help

# bad input: 2
expect 2 "cannot open '$tmp/missing.aj'" "$aj" check "$tmp/missing.aj"
expect 2 "$tmp/bad.aj:2:11: expected a dtype" "$aj" check "$tmp/bad.aj"
expect 2 "AJ_ERR_PARSE" "$aj" compile "$tmp/bad.aj" --target sm_80
expect 2 "AJ_ERR_UNSUPPORTED" "$aj" compile "$tmp/unsupported.aj" --target sm_80
expect 2 "dtype = f32: flash backward" "$aj" compile "$tmp/unsupported.aj" --target sm_80
expect 2 "cannot write" "$aj" compile "$causal" --target sm_90 -o "$tmp/no/such/dir/k.ptx"
expect 2 "<stdin>:1:1" "$aj" check - < /dev/null

# success: 0
expect 0 "hash: " "$aj" check "$causal"
expect 0 "mask = causal(top_left)" "$aj" check "$causal"
expect 0 "attention forward efficient {" "$aj" check - < "$causal"
expect 0 "" "$aj" compile "$causal" --target sm_90 -o "$tmp/k.ptx"
expect 0 ".target sm_90" cat "$tmp/k.ptx"
expect 0 "dynamic shared memory:" "$aj" compile "$causal" --target sm_80 -v -o "$tmp/k80.ptx"
expect 0 "define ptx_kernel" "$aj" compile "$causal" --target sm_90a --emit llvm
expect 0 "" "$aj" compile "$causal" --target sm_90 --emit bc -o "$tmp/k.bc"
if [ "$(head -c 2 "$tmp/k.bc")" = "BC" ]; then passed=$((passed + 1)); else
    echo "FAIL: --emit bc did not write bitcode"; failed=$((failed + 1)); fi
expect 0 "LLVM         19." "$aj" info
expect 0 "ptxas" "$aj" info
expect 0 "cpu device" "$aj" info

# the issue's acceptance check: ptxas accepts the sm_90 causal kernel
ptxas=${AJ_PTXAS:-$(command -v ptxas || true)}
[ -n "$ptxas" ] || { [ -x /usr/local/cuda/bin/ptxas ] && ptxas=/usr/local/cuda/bin/ptxas; }
if [ -n "$ptxas" ]; then
    expect 0 "0 bytes spill stores" "$ptxas" -arch=sm_90 -v -o "$tmp/k.cubin" "$tmp/k.ptx"
elif [ -n "${AJ_REQUIRE_PTXAS:-}" ] && [ "$AJ_REQUIRE_PTXAS" != 0 ]; then
    echo "FAIL ptxas check: ptxas not found and AJ_REQUIRE_PTXAS is set"
    exit 1
else
    echo "SKIP ptxas check: ptxas not found on PATH or in /usr/local/cuda/bin"
fi

# audit: ptxas and nvdisasm on the flash forward, mma.sync (sm_80 PTX as an
# H100 runs it) and wgmma (sm_90a); required where the test command
# installed them (AJ_REQUIRE_PTXAS)
nvdisasm=${AJ_NVDISASM:-$(command -v nvdisasm || true)}
[ -n "$nvdisasm" ] || { [ -x /usr/local/cuda/bin/nvdisasm ] && nvdisasm=/usr/local/cuda/bin/nvdisasm; }
flash=$specs/flash_fwd_bf16_d128_causal.aj
# (64-key tiles given, so that its two GEMMs are two wgmma shapes)
printf 'attention forward flash {\n  dtype = bf16\n  head_dim = 128\n  schedule = (warpgroups = 2, block_n = 64)\n}\n' \
    > "$tmp/wgmma.aj"
if [ -n "$ptxas" ] && [ -n "$nvdisasm" ]; then
    expect 0 "HMMA.16816.F32.BF16 128" env AJ_PTXAS="$ptxas" AJ_NVDISASM="$nvdisasm" \
        "$aj" audit "$flash" --target sm_80
    expect 0 "bound: " env AJ_PTXAS="$ptxas" AJ_NVDISASM="$nvdisasm" \
        "$aj" audit "$flash" --target sm_80
    expect 0 "HGMMA.64x64x16.F32.BF16 8, HGMMA.64x128x16.F32.BF16 4" \
        env AJ_PTXAS="$ptxas" AJ_NVDISASM="$nvdisasm" "$aj" audit "$tmp/wgmma.aj" --target sm_90a
elif [ -n "${AJ_REQUIRE_PTXAS:-}" ] && [ "$AJ_REQUIRE_PTXAS" != 0 ]; then
    echo "FAIL audit check: ptxas or nvdisasm not found and AJ_REQUIRE_PTXAS is set"
    exit 1
else
    echo "SKIP audit check: ptxas or nvdisasm not found (AJ_NVDISASM, PATH, /usr/local/cuda/bin)"
fi
expect 1 "audit: --target takes sm_80, sm_90 or sm_90a, not 'cpu'" "$aj" audit "$flash" --target cpu
expect 1 "audit needs SPEC and --target" "$aj" audit "$flash"
expect 2 "needs NVIDIA's ptxas and nvdisasm" env AJ_NVDISASM=/nonexistent "$aj" audit "$flash" \
    --target sm_80

# tune: a tiny problem on sim, progress as plain lines (not a terminal),
# the ranked table, the CSV, the database under AJ_CACHE_DIR
printf 'attention forward efficient {\n  dtype = f32\n  head_dim = 16\n}\n' > "$tmp/tune.aj"
expect 1 "tune needs --device" "$aj" tune "$tmp/tune.aj"
expect 1 "--device takes sim, cpu or cuda, not 'tpu'" "$aj" tune "$tmp/tune.aj" --device tpu
expect 1 "--budget-s takes seconds > 0" "$aj" tune "$tmp/tune.aj" --device sim --budget-s -1
expect 1 "--seq takes 1..16777216" "$aj" tune "$tmp/tune.aj" --device sim --seq 0
expect 2 "merge ops have no schedule" "$aj" tune "$specs/../../tests/fuzz/corpus/ir/merge.aj" --device sim
AJ_CACHE= AJ_CACHE_DIR="$tmp/cache" expect 0 "| 1 |" "$aj" tune "$tmp/tune.aj" --device sim \
    --seq 16 --heads 1 --repeats 1 --budget-s 2 --csv "$tmp/tune.csv"
cp "$tmp/out" "$tmp/tune.out"; cp "$tmp/err" "$tmp/tune.err"
expect 0 "tune: [1/" cat "$tmp/tune.err"
expect 0 "(default)" cat "$tmp/tune.out"
expect 0 "rank,block_m,block_n,warps,stages" cat "$tmp/tune.csv"
expect 0 "schedule " cat "$tmp"/cache/tuning/*.tune
# --wgmma yes on a flash op: the wgmma kernels ranked beside mma.sync's
expect 1 "--wgmma takes yes or no, not 'maybe'" "$aj" tune "$tmp/tune.aj" --device sim \
    --wgmma maybe
printf 'attention forward flash {\n  dtype = f16\n  head_dim = 16\n}\n' > "$tmp/tune_flash.aj"
rm -rf "$tmp/cache/tuning"   # the flash op's record alone below
AJ_CACHE= AJ_CACHE_DIR="$tmp/cache" expect 0 "| wgmma x2 + producer |" "$aj" tune \
    "$tmp/tune_flash.aj" --device sim --seq 16 --heads 1 --repeats 1 --wgmma yes \
    --csv "$tmp/tune_flash.csv"
cp "$tmp/out" "$tmp/tune_flash.out"
expect 0 "| mma.sync |" cat "$tmp/tune_flash.out"
expect 0 "status,message,warpgroups,producer" cat "$tmp/tune_flash.csv"
expect 0 "attnjit-tune 2" cat "$tmp"/cache/tuning/*.tune
expect 0 "kernel warpgroups " cat "$tmp"/cache/tuning/*.tune

# docs/cli.md's run examples, as written: every "$ " command of its ```sh
# blocks that runs `attnjit run` or scripts/npy_random.pl (continuation
# lines joined), in order, from a directory that holds the repository's
# examples/ and scripts/
root=$(cd "$specs/../.." && pwd)
mkdir "$tmp/docs"
ln -s "$root/examples" "$root/scripts" "$tmp/docs/"
awk '/^```sh$/ { sh = 1; next }
     /^```/    { sh = 0 }
     sh && (more || /^\$ /) {
         cmd = more ? cmd " " $0 : substr($0, 3)
         more = sub(/ *\\$/, "", cmd)
         if (!more) print cmd
     }' "$root/docs/cli.md" | grep -E '^(attnjit run|perl scripts/npy_(random|docs).pl) ' > "$tmp/docs.sh"
runs=0
while IFS= read -r cmd; do
    case $cmd in
    attnjit*) runs=$((runs + 1))
              expect 0 " ms, run " bash -c "cd '$tmp/docs' && '$aj'${cmd#attnjit}" ;;
    *)        expect 0 "" bash -c "cd '$tmp/docs' && $cmd" ;;
    esac
done < "$tmp/docs.sh"
if [ "$runs" -ge 4 ]; then passed=$((passed + 1)); else
    echo "FAIL: docs/cli.md gave $runs attnjit run examples, want the backward and merge ones"
    failed=$((failed + 1)); fi
for f in dq dk dv o_all lse_all o_doc; do
    expect 0 "NUMPY" head -c 6 "$tmp/docs/$f.npy"
done
# -v's tile counts of the document mask: 8 documents of one 32 x 32 tile
# each per head, causal inside: 16 partial tiles, the other 112 skipped
expect 0 "tiles of 32 x 32: 112 skipped, 16 partial, 0 full" bash -c \
    "cd '$tmp/docs' && '$aj' run examples/specs/scores/document_mask.aj --device sim -v \
     --in q=dq.npy --in k=dk.npy --in v=dv.npy --in doc=doc.npy --out o=o_doc.npy"
# side tensors' errors name the tensor
expect 1 "the op declares tensors = (doc: i32[2] ...); give --in doc=FILE" bash -c \
    "cd '$tmp/docs' && '$aj' run examples/specs/scores/document_mask.aj --device sim \
     --in q=dq.npy --in k=dk.npy --in v=dv.npy --out o=o_doc.npy"
expect 1 "unknown tensor 'dok': not one of run's" bash -c \
    "cd '$tmp/docs' && '$aj' run examples/specs/scores/document_mask.aj --device sim \
     --in q=dq.npy --in k=dk.npy --in v=dv.npy --in doc=doc.npy --in dok=doc.npy --out o=o.npy"
expect 2 "doc (i32[2]): dq.npy: dtype '<f4' is not int32; expected '<i4'" bash -c \
    "cd '$tmp/docs' && '$aj' run examples/specs/scores/document_mask.aj --device sim \
     --in q=dq.npy --in k=dk.npy --in v=dv.npy --in doc=dq.npy --out o=o.npy"
# a bf16 side tensor from an f32 .npy (rounded to bf16): the T5 table as
# the model keeps it
sed 's/rel: f32\[2\]/rel: bf16[2]/' "$root/examples/specs/scores/t5_relative_bias.aj" \
    > "$tmp/t5_bf16.aj"
expect 0 "" bash -c "cd '$tmp/docs' && perl '$root/scripts/npy_random.pl' rel.npy 12 2 65"
# ... its values made bf16's (each f32's low 16 bits cleared: the npy
# header's length at bytes 8-9, then little-endian floats), so that the
# table declared f32 gives the same bits
expect 0 "" perl -e 'open my $f, "+<", $ARGV[0] or die; binmode $f; local $/;
    my $d = <$f>; my $at = 10 + unpack("v", substr($d, 8, 2));
    for (my $i = $at; $i < length $d; $i += 4) { substr($d, $i, 2) = "\0\0" }
    seek $f, 0, 0; print $f $d' "$tmp/docs/rel.npy"
expect 0 "(rel: bf16[2])" "$aj" check "$tmp/t5_bf16.aj"
for dt in bf16 f32; do
    spec=$tmp/t5_bf16.aj; [ $dt = f32 ] && spec=$root/examples/specs/scores/t5_relative_bias.aj
    expect 0 " ms, run " bash -c "cd '$tmp/docs' && '$aj' run '$spec' --device cpu \
         --in q=dq.npy --in k=dk.npy --in v=dv.npy --in rel=rel.npy --out o=o_rel_$dt.npy"
done
expect 0 "" cmp "$tmp/docs/o_rel_bf16.npy" "$tmp/docs/o_rel_f32.npy"
expect 2 "rel (bf16[2]): doc.npy: dtype '<i4' is an integer array" bash -c \
    "cd '$tmp/docs' && '$aj' run '$tmp/t5_bf16.aj' --device cpu \
     --in q=dq.npy --in k=dk.npy --in v=dv.npy --in rel=doc.npy --out o=o_rel.npy"

echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
